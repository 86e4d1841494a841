//! Directory streams and listings.
//!
//! A listing is read from the backing directory in batches (one `getdents64` each)
//! and handed to the kernel in chunks. The two are pipelined: a chunk ends where the
//! entries already read end (if it holds any), and once it is answered the daemon reads
//! the next batches ahead while the caller consumes it, on the other core. A listing
//! that asks for its next chunk while that read is under way takes the stream after
//! the batch in hand, with what has been read so far.
//!
//! What is read and not yet handed over is bounded per stream ([`AHEAD_PER_STREAM`])
//! and per view ([`AHEAD_PER_VIEW`]): a pod that opens many directories and lists a
//! chunk of each cannot make the daemon hold more than that. Beyond the bounds, a
//! listing reads a batch when it needs one, as it did without read-ahead.

use std::collections::VecDeque;

use super::*;

/// The most a stream reads ahead of what it handed over, in bytes of entries.
pub(super) const AHEAD_PER_STREAM: usize = 512 * 1024;
/// The most all of a view's streams hold read ahead together.
pub(super) const AHEAD_PER_VIEW: usize = 4 * 1024 * 1024;

/// Entries read from a backing directory and not yet handed to the kernel, counted
/// (with what their names hold) against their view's total.
pub(super) struct Pending {
    entries: VecDeque<dir::DirEntry>,
    bytes: usize,
    total: Arc<AtomicUsize>,
}

fn cost(e: &dir::DirEntry) -> usize {
    std::mem::size_of::<dir::DirEntry>() + e.name.capacity()
}

impl Pending {
    fn new(total: &Arc<AtomicUsize>) -> Pending {
        Pending {
            entries: VecDeque::new(),
            bytes: 0,
            total: Arc::clone(total),
        }
    }

    fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn front(&self) -> Option<&dir::DirEntry> {
        self.entries.front()
    }

    fn add(&mut self, n: usize) {
        self.bytes += n;
        self.total.fetch_add(n, Ordering::Relaxed);
    }

    fn sub(&mut self, n: usize) {
        self.bytes -= n;
        self.total.fetch_sub(n, Ordering::Relaxed);
    }

    fn extend(&mut self, batch: Vec<dir::DirEntry>) {
        self.add(batch.iter().map(cost).sum());
        self.entries.extend(batch);
    }

    fn pop_front(&mut self) -> Option<dir::DirEntry> {
        let e = self.entries.pop_front()?;
        self.sub(cost(&e));
        Some(e)
    }

    fn push_front(&mut self, e: dir::DirEntry) {
        self.add(cost(&e));
        self.entries.push_front(e);
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.sub(self.bytes);
    }

    /// Whether another batch may be read ahead.
    fn has_room(&self) -> bool {
        self.bytes < AHEAD_PER_STREAM && self.total.load(Ordering::Relaxed) < AHEAD_PER_VIEW
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.total.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// Batches one read ahead takes at most before it looks whether a listing waits.
const AHEAD_BATCHES: usize = 16;

/// Entries a walk's listing looks up at a time, ahead of handing them over.
const LOOK_AHEAD: usize = 256;
/// Fewer lookups than this per thread are not worth another thread, on a local disk.
pub(super) const LOOKUPS_PER_THREAD: usize = 32;
/// Threads a listing's lookups are spread over on a network share, and the fewest
/// lookups worth another one there: a lookup waits on the server's round trips (on
/// NFS a record's read is two requests of its own for an inode the client has not
/// seen), not on a core.
pub(super) const NETWORK_LOOKUP_THREADS: usize = 16;
pub(super) const NETWORK_LOOKUPS_PER_THREAD: usize = 4;
/// Entries a walk's listing on a network share looks up at a time, past what the
/// reply has room for: before Linux 6.16 the kernel asks for a page of entries at a
/// time whatever the caller's buffer (25 or so with attributes; fs/fuse/readdir.c
/// `fuse_readdir_uncached`, dabb90391028 sized it by the buffer), too few to keep the threads busy, and a
/// listing that waits a round of lookups per page took longer than the entries'
/// timeouts, so that the walker looked most of them up again one by one. What the
/// reply cannot take waits in the stream for the next chunk.
pub(super) const NETWORK_LOOK_AHEAD: usize = NETWORK_LOOKUP_THREADS * NETWORK_LOOKUPS_PER_THREAD;

/// `.` or `..`, which a listing hands over without a lookup.
fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// Entries of a listing looked up ahead of their turn: `(cookie, lookup)`, with no
/// lookup for a probe. What a listing does not hand over is forgotten when it ends.
struct LookedUp<'a> {
    view: &'a ViewFs,
    items: VecDeque<(u64, Option<FsResult<Attr>>)>,
}

/// The threads listings' lookups are spread over: pools of threads started at the
/// view's first listing that spreads them and kept while listings come (let go after
/// [`POOL_IDLE`] without one, so that an idle view has the threads it had before), one
/// pool for each listing at a time (up to [`MAX_POOLS`]), not threads started for each
/// chunk of a listing. A thread started after the NFS client cached its answer to
/// `ACCESS` for a caller does not trust it (fs/nfs/dir.c
/// `nfs_access_get_cached_locked`: an entry older than the asking task's start, its
/// "login time", is asked again), so threads started for each chunk each asked the
/// server whether the caller may search the directory: 33 to 42 `ACCESS` requests for
/// an `ls -ln` of 300 files where the raw mount's asked 3 (docs/BENCHMARKS.md).
pub(super) struct Helpers {
    /// Pools kept and not lent to a listing now, and whether a thread lets them go.
    idle: Arc<Mutex<Idle>>,
    /// Pools kept, lent or not.
    kept: Arc<AtomicUsize>,
    /// How long a kept pool waits for a listing before it is let go.
    pool_idle: std::time::Duration,
    /// Threads started, and ended, for tests.
    started: Arc<AtomicUsize>,
    ended: Arc<AtomicUsize>,
    /// Whether the log has said that no threads could be started.
    warned: AtomicBool,
    /// Whether the log has said that a thread could not act as a listing's caller.
    warned_acting: AtomicBool,
    /// The file-system ids each part of a listing was looked up with, for tests.
    #[cfg(test)]
    looked_up_as: Mutex<Vec<(u32, u32)>>,
}

/// Pools a view keeps: as many listings spread their lookups at once on kept
/// threads; one more gets a pool of its own for the chunk, as every chunk did before.
pub(super) const MAX_POOLS: usize = 4;

/// How long a kept pool waits for the next listing before its threads end. A pool
/// made anew costs its threads' start and one `ACCESS` (`file::warm_search`).
pub(super) const POOL_IDLE: std::time::Duration = std::time::Duration::from_secs(10);

/// Kept pools not lent now, each with when it came back, and whether the thread that
/// lets them go runs.
#[derive(Default)]
struct Idle {
    pools: Vec<(std::time::Instant, rayon::ThreadPool)>,
    reaping: bool,
}

impl Default for Helpers {
    fn default() -> Helpers {
        Helpers::new(POOL_IDLE)
    }
}

/// A pool lent to one listing's chunk: kept pools go back when it ends. One chunk at
/// a time is also what keeps callers apart: a pool thread waiting in a join may run
/// another of the pool's jobs, and with one chunk lent the only jobs are that chunk's
/// parts, each acting as the chunk's caller, none calling into the pool while it acts.
pub(super) struct Lent<'a> {
    helpers: &'a Helpers,
    pool: Option<rayon::ThreadPool>,
    kept: bool,
}

impl std::ops::Deref for Lent<'_> {
    type Target = rayon::ThreadPool;

    fn deref(&self) -> &rayon::ThreadPool {
        self.pool.as_ref().expect("a lent pool until it is dropped")
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take().filter(|_| self.kept) {
            self.helpers.keep(pool);
        }
    }
}

impl Helpers {
    /// Helpers whose kept pools end after `pool_idle` without a listing.
    pub(super) fn new(pool_idle: std::time::Duration) -> Helpers {
        Helpers {
            idle: Arc::default(),
            kept: Arc::default(),
            pool_idle,
            started: Arc::default(),
            ended: Arc::default(),
            warned: AtomicBool::new(false),
            warned_acting: AtomicBool::new(false),
            #[cfg(test)]
            looked_up_as: Mutex::default(),
        }
    }

    /// Keeps a pool a listing gave back, until the next listing or [`POOL_IDLE`]; the
    /// thread that lets idle pools go is started with the first (it touches no file,
    /// and ends once none is kept idle). Without it (no thread to be had) the pool is
    /// let go now.
    fn keep(&self, pool: rayon::ThreadPool) {
        let mut idle = lock(&self.idle);
        idle.pools.push((std::time::Instant::now(), pool));
        if idle.reaping {
            return;
        }
        let (shared, kept, after) = (
            Arc::clone(&self.idle),
            Arc::clone(&self.kept),
            self.pool_idle,
        );
        let started = std::thread::Builder::new()
            .name("mountgroup-pools".into())
            .spawn(move || Self::let_idle_go(&shared, &kept, after));
        match started {
            Ok(_) => idle.reaping = true,
            Err(e) => {
                let gone = idle.pools.len();
                idle.pools.clear();
                self.kept.fetch_sub(gone, Ordering::Relaxed);
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "no thread to let idle lookup threads go: each listing starts its lookup threads anew, which on NFS costs an ACCESS request each time; raise the pids limit of the cgroup the view runs in");
                }
            }
        }
    }

    /// Lets each idle pool go once it has waited `after`, until none is left.
    fn let_idle_go(idle: &Mutex<Idle>, kept: &AtomicUsize, after: std::time::Duration) {
        loop {
            let gone: Vec<rayon::ThreadPool> = {
                let mut idle = lock(idle);
                if idle.pools.is_empty() {
                    idle.reaping = false;
                    return;
                }
                let (old, young) = std::mem::take(&mut idle.pools)
                    .into_iter()
                    .partition(|(since, _)| since.elapsed() >= after);
                idle.pools = young;
                old.into_iter().map(|(_, pool)| pool).collect()
            };
            kept.fetch_sub(gone.len(), Ordering::Relaxed);
            // Its threads end once their pool is dropped.
            drop(gone);
            let next = lock(idle)
                .pools
                .iter()
                .map(|(since, _)| after.saturating_sub(since.elapsed()))
                .min()
                .unwrap_or_default();
            std::thread::sleep(next.max(std::time::Duration::from_millis(10)));
        }
    }

    /// A pool of `threads` threads for one chunk of a listing: an idle one, or one
    /// started now; `None` where the system refuses threads (a pids limit): the
    /// listing then looks its entries up itself.
    pub(super) fn lend(&self, threads: usize) -> Option<Lent<'_>> {
        #[cfg(test)]
        if no_helpers::refused() {
            return None;
        }
        if let Some((_, pool)) = lock(&self.idle).pools.pop() {
            return Some(Lent {
                helpers: self,
                pool: Some(pool),
                kept: true,
            });
        }
        let kept = self
            .kept
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < MAX_POOLS).then_some(n + 1)
            })
            .is_ok();
        let (started, ended) = (Arc::clone(&self.started), Arc::clone(&self.ended));
        let built = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|_| "mountgroup-lookup".into())
            .exit_handler(move |_| {
                ended.fetch_add(1, Ordering::Relaxed);
            })
            .start_handler(move |_| {
                started.fetch_add(1, Ordering::Relaxed);
                // Started by a request: where the view acts as its callers, a thread
                // inherits that caller's credentials. Each part a thread looks up is
                // looked up as its own listing's caller, wholly; between them the
                // thread is the view.
                if let Err(e) = crate::sys::creds::as_the_process() {
                    tracing::warn!(error = %e, "a lookup thread cannot act as the view between listings; each listing's lookups on it still act as that listing's caller");
                }
            })
            .build();
        match built {
            Ok(pool) => Some(Lent {
                helpers: self,
                pool: Some(pool),
                kept,
            }),
            Err(e) => {
                if kept {
                    self.kept.fetch_sub(1, Ordering::Relaxed);
                }
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "no threads for listings' lookups: listings look their entries up one at a time, slower on a network share; raise the pids limit of the cgroup the view runs in");
                }
                None
            }
        }
    }

    /// Says once that a lookup thread could not act as a listing's caller, whose
    /// lookups on it then fail with `e` rather than be made as someone else.
    fn cannot_act(&self, e: FsError) {
        if !self.warned_acting.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %e, "a lookup thread cannot act as a listing's caller, so that listing's lookups fail; the daemon needs CAP_SETUID and CAP_SETGID (the node plugin runs privileged, deploy/node.yaml)");
        }
    }

    /// How many threads were started, for tests.
    #[cfg(test)]
    pub(super) fn started(&self) -> usize {
        self.started.load(Ordering::Relaxed)
    }

    /// How many threads ended, for tests.
    #[cfg(test)]
    pub(super) fn ended(&self) -> usize {
        self.ended.load(Ordering::Relaxed)
    }

    /// How many pools are kept, lent or not, for tests.
    #[cfg(test)]
    pub(super) fn kept(&self) -> usize {
        self.kept.load(Ordering::Relaxed)
    }

    /// The file-system ids of each part looked up so far, emptied.
    #[cfg(test)]
    pub(super) fn looked_up_as(&self) -> Vec<(u32, u32)> {
        std::mem::take(&mut *lock(&self.looked_up_as))
    }
}

impl LookedUp<'_> {
    /// Forgets every lookup not handed over.
    fn clear(&mut self) {
        for (_, looked) in self.items.drain(..) {
            if let Some(Ok(a)) = looked {
                self.view.forget(a.ino, 1);
            }
        }
    }
}

impl Drop for LookedUp<'_> {
    fn drop(&mut self) {
        self.clear();
    }
}

impl ViewFs {
    /// Whether the kernel may keep the listing of `ino` it is opening now and list
    /// it from its cache ([`super::super::listing`]).
    pub fn may_keep_listing(&self, ino: u64) -> bool {
        self.listing.may_keep_listing(ino)
    }

    /// Directories warmed ahead of a walk so far (`fs/ahead.rs`).
    pub fn walked_ahead(&self) -> u64 {
        self.ahead.warmed()
    }

    /// Lookups answered with an entry opened ahead of a walk so far (`fs/ahead.rs`).
    pub fn opened_ahead(&self) -> u64 {
        self.ahead.claimed()
    }

    /// Opens a directory for listing.
    ///
    /// # Errors
    /// `ENOTDIR`, or the error of the open.
    pub fn opendir(&self, ino: u64) -> FsResult<u64> {
        let inode = self.dir(ino)?;
        let at = inode.fd()?;
        // A walk's next directory, warmed ahead (`fs/ahead.rs`): the warming's
        // descriptor spares the share a second open of it, where the caller may read
        // it (the kernel checked the view's attributes; a view that acts as its
        // callers asks the share too, as its own open would).
        let claimed = self.ahead.claim_dir(ino, at.as_fd(), || {
            !self.cfg.acts_as_callers || file::may_read(at.as_fd())
        });
        let fd = match claimed {
            Some(fd) => fd,
            None => file::reopen(at.as_fd(), inode.kind, Access::Directory)?,
        };
        self.no_atime(&fd, inode.kind);
        Ok(self.add_handle(self.dir_handle(inode.id, fd, 0)))
    }

    /// The handle of a directory `ino` open as `fd`, whose listing is at `pos`.
    pub(super) fn dir_handle(&self, ino: u64, fd: OwnedFd, pos: u64) -> Handle {
        Handle::Dir(Arc::new(DirHandle {
            ino,
            asked: AtomicUsize::new(0),
            stream: Mutex::new(DirStream {
                fd,
                pos,
                pending: Pending::new(&self.pending_dir_bytes),
                at_end: false,
                buf: vec![MaybeUninit::uninit(); DIR_BUF].into_boxed_slice(),
                subdirs: Vec::new(),
                looked: VecDeque::new(),
                past_first: false,
            }),
        }))
    }

    pub(super) fn open_dir(&self, fh: u64) -> FsResult<Arc<DirHandle>> {
        match self.handles.get(&fh).as_deref() {
            Some(Handle::Dir(d)) => Ok(Arc::clone(d)),
            _ => Err(FsError::UnknownHandle(fh)),
        }
    }

    /// Lists a directory from `offset`, handing entries to `add` until it reports the
    /// reply full (returns `true`), or until the entries already read are handed over
    /// (if there were any: the next batches are then read ahead, see the module
    /// documentation). With [`Listing::WithAttributes`], each entry but
    /// `.`/`..` is looked up (and counted) like [`ViewFs::lookup`]; an entry that is not
    /// handed over is forgotten again. With [`Listing::AsNeeded`], so are the entries
    /// of a chunk listed while the view sees a walk ([`super::super::listing`]), but for
    /// its probes; otherwise names only. Only entries that fit in `room` are looked up:
    /// the chunk ends where they end; on a network share more are, and those the chunk
    /// does not hand over wait for the next.
    ///
    /// # Errors
    /// `EBADF` for an unknown handle, or the error of `getdents64`.
    pub fn readdir(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        listing: Listing,
        room: Room,
        add: impl FnMut(&DirItem, u64) -> bool,
    ) -> FsResult<()> {
        let dir = self.open_dir(fh)?;
        dir.asked.fetch_add(1, Ordering::Relaxed);
        let mut s = lock(&dir.stream);
        dir.asked.fetch_sub(1, Ordering::Relaxed);
        // Decided once per chunk: a walk that starts midway shows in the next one.
        let attributes = match listing {
            Listing::Names => false,
            Listing::WithAttributes => true,
            Listing::AsNeeded => self.listing.walking_in(ino),
        };
        if attributes && offset == 0 {
            self.ahead.starts(ino);
        }
        // Entries looked up ahead of their turn, by an earlier chunk or this one; what
        // is not handed over is forgotten, unless a network share's next chunk may
        // hand it (below).
        let mut looked_up = LookedUp {
            view: self,
            items: std::mem::take(&mut s.looked),
        };
        if !attributes {
            looked_up.clear();
        }
        if offset != s.pos {
            looked_up.clear();
            dir::seek(s.fd.as_fd(), offset)?;
            s.pending.clear();
            s.pos = offset;
            s.at_end = false;
            s.past_first = offset != 0;
        }
        let chunk = self.list_chunk(ino, &mut s, &mut looked_up, attributes, listing, room, add);
        if chunk.is_ok() && attributes && self.cfg.looks_past_room {
            s.looked = std::mem::take(&mut looked_up.items);
        }
        chunk
    }

    /// The loop of [`ViewFs::readdir`]: one chunk of the listing from `s.pos`, with the
    /// lookups made ahead in `looked_up`.
    #[allow(clippy::too_many_arguments)]
    fn list_chunk(
        &self,
        ino: u64,
        s: &mut DirStream,
        looked_up: &mut LookedUp<'_>,
        attributes: bool,
        listing: Listing,
        room: Room,
        mut add: impl FnMut(&DirItem, u64) -> bool,
    ) -> FsResult<()> {
        let mut handed = false;
        // What the reply can still take, by `room`'s count.
        let mut left = room.bytes;
        loop {
            if s.pending.is_empty() {
                // Once something is handed, the rest is read ahead meanwhile.
                if handed || !self.refill(ino, s, attributes)? {
                    return Ok(());
                }
            }
            let Some(e) = s.pending.front() else {
                return Ok(());
            };
            let next = e.next;
            // The daemon's own (an entry under construction): not part of the view.
            if namespace::is_reserved_name(&e.name) {
                s.skip(next);
                continue;
            }
            let dot = is_dot(&e.name);
            let looked = if attributes && !dot {
                if looked_up.items.front().map(|l| l.0) != Some(next) {
                    looked_up.clear();
                    self.look_ahead(ino, listing, &s.pending, left, room, &mut looked_up.items);
                    if looked_up.items.is_empty() && handed {
                        // The entry does not fit: the chunk ends before it.
                        return Ok(());
                    }
                }
                looked_up.items.pop_front().and_then(|l| l.1)
            } else {
                if listing == Listing::AsNeeded && !dot {
                    self.note_listed(ino, s.past_first, &e.name);
                }
                None
            };
            let Some((shown_ino, kind, attr)) = self.shown_entry(ino, e, looked)? else {
                // Gone since the listing, or a mount point: not part of the view.
                s.skip(next);
                continue;
            };
            // The name moves into the item and back, never copied.
            let e = s.pending.pop_front().expect("the entry just looked at");
            let item = DirItem {
                name: e.name,
                ino: shown_ino,
                kind,
                attr,
            };
            if add(&item, next) {
                // No room: the entry, and its lookup, wait for the next chunk.
                if attributes && !dot {
                    looked_up.items.push_front((next, item.attr.map(Ok)));
                }
                s.pending.push_front(dir::DirEntry {
                    name: item.name,
                    ..e
                });
                return Ok(());
            }
            handed = true;
            s.past_first |= !dot;
            left = left.saturating_sub(room.cost(&item.name));
            s.pos = next;
            if item.kind == Kind::Directory && !dot {
                self.handed_dir(ino, s, &item);
            }
        }
    }

    /// Notes a name listing's first entry, and its probes ([`crate::fs::listing::ListingHints::listed`]).
    fn note_listed(&self, ino: u64, past_first: bool, name: &[u8]) {
        if !past_first || self.listing.next_is_probe(false) {
            self.listing.listed(ino, name);
        }
    }

    /// Reads the stream's next batch of entries into `s.pending`; false at its end,
    /// where the directories it listed are planned for the walk-ahead.
    fn refill(&self, ino: u64, s: &mut DirStream, attributes: bool) -> FsResult<bool> {
        let DirStream { fd, buf, .. } = &mut *s;
        let batch = dir::read_batch(fd.as_fd(), buf)?;
        s.at_end = batch.is_empty();
        if !s.at_end {
            self.saw(ino, &batch);
            s.pending.extend(batch);
            return Ok(true);
        }
        if !s.subdirs.is_empty() {
            let subdirs = std::mem::take(&mut s.subdirs);
            if let Ok(fd) = self.dir(ino).and_then(|d| d.fd()) {
                match self
                    .cfg
                    .acts_as_callers
                    .then(crate::sys::creds::thread_ids)
                    .transpose()
                {
                    Ok(ids) => self.ahead.planned(fd, subdirs, attributes, ids),
                    Err(e) => self.ahead.cannot_act(e),
                }
            }
        }
        Ok(false)
    }

    /// What an entry of directory `ino` is shown as: its node id, kind and attributes
    /// (`looked`: its lookup made ahead, if any). `None`: gone since the listing, or a
    /// mount point. Decided while the entry is still queued, so that an error leaves
    /// it there for the next call.
    fn shown_entry(
        &self,
        ino: u64,
        e: &dir::DirEntry,
        looked: Option<FsResult<Attr>>,
    ) -> FsResult<Option<(u64, Kind, Option<Attr>)>> {
        match looked {
            Some(Ok(attr)) => Ok(Some((attr.ino, attr.kind, Some(attr)))),
            Some(Err(FsError::Os(Errno::ENOENT))) => Ok(None),
            Some(Err(err)) => Err(err),
            None => {
                let kind = match e.kind {
                    Some(k) => k,
                    None => self.kind_of(ino, &e.name)?,
                };
                Ok(Some((if e.name == b"." { ino } else { e.ino }, kind, None)))
            }
        }
    }

    /// A directory handed in a listing of `ino`: the node id of an entry handed
    /// without attributes is not known (its backing inode number is, which is the node
    /// id unless it was taken); one handed with them is reached without a lookup. Both
    /// are planned for the walk-ahead.
    fn handed_dir(&self, ino: u64, s: &mut DirStream, item: &DirItem) {
        if let Some(a) = item.attr {
            self.listing.reached(ino, a.ino);
        }
        if s.subdirs.len() < crate::fs::ahead::MAX_PLANNED {
            s.subdirs.push((item.ino, item.name.clone()));
        }
    }

    /// Decides for the entries at the front of `pending` (up to [`LOOK_AHEAD`] of
    /// them, from the first, and no more than fit in `left` bytes of a reply counted
    /// by `room`; on a network share [`NETWORK_LOOK_AHEAD`] whatever the room) which
    /// are looked up and which are probes, and looks the former up, spread over the
    /// cores (the network share's threads): a walk's listings are the daemon's work
    /// alone while the walker waits for them. An entry `.`, `..` or reserved is left
    /// out, as the listing skips or lists it without a lookup.
    fn look_ahead(
        &self,
        dir: u64,
        listing: Listing,
        pending: &Pending,
        left: usize,
        room: Room,
        out: &mut VecDeque<(u64, Option<FsResult<Attr>>)>,
    ) {
        let (slots, names) = self.chosen_ahead(dir, listing, pending, left, room);
        #[cfg(test)]
        looked_up::add(names.len());
        let look = |part: &[&dir::DirEntry]| -> Vec<FsResult<Attr>> {
            #[cfg(test)]
            lock(&self.helpers.looked_up_as).push(crate::sys::creds::fs_ids());
            // The new node ids' journal lines in one write, before the reply gives
            // them to the kernel (it is sent after this returns).
            let _batch = self.inodes.batch_journal();
            part.iter()
                .map(|e| self.lookup_entry(dir, OsStr::from_bytes(&e.name)))
                .collect()
        };
        let threads = self
            .cfg
            .lookup_threads
            .min(names.len() / self.cfg.lookups_per_thread)
            .max(1);
        let pool = (threads > 1)
            .then(|| self.helpers.lend(self.cfg.lookup_threads))
            .flatten();
        let results = match pool {
            None => look(&names),
            Some(pool) => self.look_up_spread(dir, &names, threads, &pool, look),
        };
        let mut results = results.into_iter();
        for (cookie, probe) in slots {
            out.push_back((cookie, if probe { None } else { results.next() }));
        }
    }

    /// The entries [`ViewFs::look_ahead`] takes: each one's cookie and whether it is a
    /// probe (not looked up), and the entries to look up.
    fn chosen_ahead<'p>(
        &self,
        dir: u64,
        listing: Listing,
        pending: &'p Pending,
        mut left: usize,
        room: Room,
    ) -> (Vec<(u64, bool)>, Vec<&'p dir::DirEntry>) {
        let mut slots = Vec::new();
        let mut names = Vec::new();
        let most = if self.cfg.looks_past_room {
            NETWORK_LOOK_AHEAD
        } else {
            LOOK_AHEAD
        };
        for e in pending.entries.iter() {
            if slots.len() == most {
                break;
            }
            if namespace::is_reserved_name(&e.name) {
                continue;
            }
            // `.` and `..` take their room too, handed without attributes.
            match left.checked_sub(room.cost(&e.name)) {
                Some(after) => left = after,
                None if self.cfg.looks_past_room && !slots.is_empty() => {}
                None => break,
            }
            if is_dot(&e.name) {
                continue;
            }
            if listing == Listing::AsNeeded && self.listing.next_is_probe(true) {
                // Listed without attributes, to see whether it is looked up (`listing.rs`).
                self.listing.listed(dir, &e.name);
                slots.push((e.next, true));
            } else {
                names.push(e);
                slots.push((e.next, false));
            }
        }
        (slots, names)
    }

    /// `names` of directory `dir` looked up by `look` on `threads` threads of `pool`,
    /// each acting as the caller this thread acts as now where the view acts as its
    /// callers; in order.
    fn look_up_spread(
        &self,
        dir: u64,
        names: &[&dir::DirEntry],
        threads: usize,
        pool: &rayon::ThreadPool,
        look: impl Fn(&[&dir::DirEntry]) -> Vec<FsResult<Attr>> + Sync,
    ) -> Vec<FsResult<Attr>> {
        use rayon::prelude::*;
        let per = names.len().div_ceil(threads);
        // Where the view acts as its callers, each part is looked up as the
        // caller this thread acts as now.
        let ids = self.cfg.acts_as_callers.then(crate::sys::creds::thread_ids);
        let act = || -> FsResult<Option<crate::sys::creds::Acting>> {
            match &ids {
                Some(Ok(ids)) => Ok(Some(ids.act()?)),
                Some(Err(e)) => Err((*e).into()),
                None => Ok(None),
            }
        };
        let pfd = self.dir(dir).and_then(|d| d.fd());
        let parts: Vec<Vec<FsResult<Attr>>> = pool.install(|| {
            // Each thread's first lookup checks that the caller may search the
            // directory: where the client's answer has lapsed, or is older
            // than the threads of a pool just started, all would ask the
            // server at once. Asked first on one of them, it is one request,
            // and none where the answer is good.
            if let (Ok(_acting), Ok(fd)) = (act(), &pfd) {
                file::warm_search(fd.as_fd());
            }
            names
                .par_chunks(per)
                .with_max_len(1)
                .map(|part| match act() {
                    Ok(_acting) => look(part),
                    Err(e) => {
                        self.helpers.cannot_act(e);
                        part.iter().map(|_| Err(e)).collect()
                    }
                })
                .collect()
        });
        parts.into_iter().flatten().collect()
    }

    /// Forgets the lookups a listing of `d` made ahead and did not hand over: it ends,
    /// or the view's tables are handed to a successor that knows nothing of them.
    pub(super) fn forget_looked_ahead(&self, d: &DirHandle) {
        let looked = std::mem::take(&mut lock(&d.stream).looked);
        drop(LookedUp {
            view: self,
            items: looked,
        });
    }

    /// Reads the next batches of a listing ahead, after a chunk of it was answered:
    /// until the stream's or the view's bound, the end of the directory, or a listing
    /// that asks for the stream. A failure is left for the listing to meet.
    pub fn read_ahead(&self, fh: u64) {
        let Ok(dir) = self.open_dir(fh) else {
            return;
        };
        for _ in 0..AHEAD_BATCHES {
            if dir.asked.load(Ordering::Relaxed) > 0 {
                return;
            }
            let mut s = lock(&dir.stream);
            if s.at_end || !s.pending.has_room() {
                return;
            }
            let DirStream { fd, buf, .. } = &mut *s;
            match dir::read_batch(fd.as_fd(), buf) {
                Ok(batch) if !batch.is_empty() => {
                    self.saw(dir.ino, &batch);
                    s.pending.extend(batch);
                }
                Ok(_) => {
                    s.at_end = true;
                    return;
                }
                Err(_) => return,
            }
        }
    }

    /// A batch of directory `ino`'s listing, read for the kernel: its names are held
    /// where the directory's are (`fs/names.rs`).
    fn saw(&self, ino: u64, batch: &[dir::DirEntry]) {
        if self.names.on() {
            if let Ok(p) = self.dir(ino) {
                self.names
                    .seen(ino, &p, batch.iter().map(|e| e.name.as_slice()));
            }
        }
    }

    /// The kind of a directory entry whose type the backing file system did not say.
    pub(super) fn kind_of(&self, dir: u64, name: &[u8]) -> FsResult<Kind> {
        if is_dot(name) {
            return Ok(Kind::Directory);
        }
        let p = self.dir(dir)?;
        let fd = file::open_child(
            p.fd()?.as_fd(),
            OsStr::from_bytes(name),
            self.share.root_mnt,
        )?;
        Ok(file::stat(fd.as_fd())?.kind)
    }
}

/// A test's stand-in for a system that refuses threads (a pids limit), for the
/// listings made on this thread.
impl DirStream {
    /// Passes over the entry at the front, which the view does not show.
    fn skip(&mut self, next: u64) {
        self.pending.pop_front();
        self.pos = next;
    }
}

#[cfg(test)]
pub(super) mod no_helpers {
    use std::cell::Cell;

    thread_local! {
        static REFUSED: Cell<bool> = const { Cell::new(false) };
    }

    pub fn set(refused: bool) {
        REFUSED.with(|r| r.set(refused));
    }

    pub(super) fn refused() -> bool {
        REFUSED.with(Cell::get)
    }
}

/// How many entries the listings made on this thread looked up, for tests.
#[cfg(test)]
pub(super) mod looked_up {
    use std::cell::Cell;

    thread_local! {
        static COUNT: Cell<usize> = const { Cell::new(0) };
    }

    pub(super) fn add(n: usize) {
        COUNT.with(|c| c.set(c.get() + n));
    }

    /// The count so far, set back to zero.
    pub fn take() -> usize {
        COUNT.with(|c| c.replace(0))
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::*;
    use super::*;

    #[test]
    fn readdirplus_counts_only_what_it_hands_over() {
        let dir = populated(10);
        let v = view(dir.path(), "gid=5");
        let fh = v.opendir(ROOT).unwrap();
        let mut seen = Vec::new();
        let mut next_offset = 0;
        v.readdir(
            ROOT,
            fh,
            0,
            Listing::WithAttributes,
            Room::UNBOUNDED,
            |item, next| {
                if item.attr.is_some()
                    && seen
                        .iter()
                        .filter(|n: &&Vec<u8>| n.starts_with(b"f"))
                        .count()
                        == 3
                {
                    return true; // full
                }
                seen.push(item.name.clone());
                next_offset = next;
                false
            },
        )
        .unwrap();
        let files = seen.iter().filter(|n| n.starts_with(b"f")).count();
        assert_eq!(files, 3);
        assert_eq!(
            v.inode_count(),
            1 + 3,
            "the refused entry was forgotten again"
        );
        // Resuming from the last offset lists the rest exactly once.
        let mut rest = Vec::new();
        v.readdir(
            ROOT,
            fh,
            next_offset,
            Listing::WithAttributes,
            Room::UNBOUNDED,
            |item, _| {
                rest.push(item.name.clone());
                false
            },
        )
        .unwrap();
        assert_eq!(rest.iter().filter(|n| n.starts_with(b"f")).count(), 7);
        assert!(rest.iter().all(|n| !seen.contains(n)));
        v.release(fh);
        assert_eq!(v.handle_count(), 0);
    }

    #[test]
    fn a_listing_chunk_ends_where_the_entries_read_end_and_the_rest_is_read_ahead() {
        let dir = populated(5000);
        let v = view(dir.path(), "gid=5");
        let fh = v.opendir(ROOT).unwrap();
        // One batch, not the whole directory: the caller gets to work on it at once.
        let (first, at) = chunk(&v, fh, 0);
        assert!(first.len() > 100 && first.len() < 2500, "{}", first.len());
        // The next batches are read ahead of the next chunk, which hands them all over.
        v.read_ahead(fh);
        assert!(v.pending_dir_bytes.load(Ordering::Relaxed) > 0);
        let (second, at) = chunk(&v, fh, at);
        assert!(
            second.len() > first.len(),
            "{} after {}",
            second.len(),
            first.len()
        );
        assert_eq!(v.pending_dir_bytes.load(Ordering::Relaxed), 0);
        // Read ahead or not, the listing is whole and names every entry once.
        let mut all: Vec<Vec<u8>> = first.into_iter().chain(second).collect();
        all.extend(rest(&v, fh, at, Listing::Names).into_iter().map(|i| i.name));
        let mut files: Vec<_> = all.iter().filter(|n| n.starts_with(b"f")).collect();
        files.sort();
        files.dedup();
        assert_eq!(files.len(), 5000);
        assert_eq!(all.len(), 5002, "each entry once, `.` and `..` included");
        // A listing that starts over (rewinddir) drops what was read ahead.
        let (again, _) = chunk(&v, fh, 0);
        v.read_ahead(fh);
        assert_eq!(chunk(&v, fh, 0).0, again);
        v.release(fh);
        assert_eq!(v.pending_dir_bytes.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_walk_listing_looked_up_ahead_counts_only_what_it_hands_over() {
        let dir = populated(1000);
        let v = view(dir.path(), "gid=5");
        let fh = v.opendir(ROOT).unwrap();
        let list = |offset: u64, stop_after: usize| {
            let (mut items, mut last) = (Vec::new(), offset);
            v.readdir(
                ROOT,
                fh,
                offset,
                Listing::WithAttributes,
                Room::UNBOUNDED,
                |item, next| {
                    if items.len() == stop_after {
                        return true; // full
                    }
                    items.push(item.clone());
                    last = next;
                    false
                },
            )
            .unwrap();
            (items, last)
        };
        // The lookups run ahead of the reply, over several threads; the ones the
        // reply had no room for are forgotten again.
        let (first, at) = list(0, 300);
        assert_eq!(first.len(), 300);
        let files = |items: &[DirItem]| items.iter().filter(|i| i.name.starts_with(b"f")).count();
        assert_eq!(v.inode_count(), 1 + files(&first));
        let mut all = first;
        all.extend(rest(&v, fh, at, Listing::WithAttributes));
        assert_eq!(files(&all), 1000);
        assert_eq!(v.inode_count(), 1 + 1000);
        // Each file with its own attributes, under its own name.
        for item in all.iter().filter(|i| i.name.starts_with(b"f")) {
            let attr = item.attr.expect("a walk's entry carries attributes");
            assert_eq!(attr.gid, 5);
            assert_eq!(attr, v.lookup(ROOT, OsStr::from_bytes(&item.name)).unwrap());
        }
        v.release(fh);
    }

    /// A walk's listing makes hundreds of node ids before its reply; their journal
    /// lines go out together, before `readdir` returns (the reply is sent after it), so
    /// a view that dies then is recovered knowing each (`fs/inode.rs` `JournalBatch`).
    #[test]
    fn a_walk_listings_node_ids_are_journaled_before_it_returns() {
        let dir = populated(600);
        let v = view(dir.path(), "gid=5");
        let held = HeldJournal::default();
        held.take(&v);
        let fh = v.opendir(ROOT).unwrap();
        let listed = rest(&v, fh, 0, Listing::WithAttributes);
        let ids: Vec<u64> = listed
            .iter()
            .filter(|i| i.name.starts_with(b"f"))
            .map(|i| i.attr.expect("a walk's entry carries attributes").ino)
            .collect();
        assert_eq!(ids.len(), 600);
        let journaled = held.replay().inodes;
        let missing: Vec<_> = ids
            .iter()
            .filter(|id| !journaled.contains_key(id))
            .collect();
        assert!(
            missing.is_empty(),
            "{} listed ids not journaled",
            missing.len()
        );
        v.release(fh);
    }

    #[test]
    fn a_walk_listing_looks_up_only_what_fits_in_a_small_reply() {
        let dir = populated(1000);
        let v = view(dir.path(), "gid=5");
        let fh = v.opendir(ROOT).unwrap();
        // Go's os.ReadDir reads 8 KiB at a time: about 50 READDIRPLUS entries a reply.
        let room = Room {
            bytes: 8192,
            header: 152,
        };
        dirs::looked_up::take();
        let (mut all, mut at, mut replies) = (Vec::new(), 0, 0);
        loop {
            let (mut items, mut left) = (Vec::new(), room.bytes);
            v.readdir(ROOT, fh, at, Listing::WithAttributes, room, |item, next| {
                // Full as the reply is full: the entry does not fit in what is left.
                let Some(after) = left.checked_sub(room.cost(&item.name)) else {
                    return true;
                };
                left = after;
                items.push(item.clone());
                at = next;
                false
            })
            .unwrap();
            if items.is_empty() {
                break;
            }
            replies += 1;
            let looked = dirs::looked_up::take();
            let handed = items.iter().filter(|i| i.attr.is_some()).count();
            assert_eq!(
                looked, handed,
                "reply {replies}: looked up {looked}, handed {handed}"
            );
            all.extend(items);
        }
        assert!(replies >= 1000 / 60, "{replies} replies of at most 8 KiB");
        every_file_with_attributes(&v, &all, 1000);
        v.release(fh);
    }

    #[test]
    fn a_walk_listing_does_its_lookups_itself_when_no_thread_can_be_started() {
        let dir = populated(1000);
        let v = view(dir.path(), "gid=5");
        let fh = v.opendir(ROOT).unwrap();
        // A pids limit refuses every thread; the listing must neither fail nor panic.
        dirs::no_helpers::set(true);
        let items = rest(&v, fh, 0, Listing::WithAttributes);
        dirs::no_helpers::set(false);
        every_file_with_attributes(&v, &items, 1000);
        v.release(fh);
    }

    /// A network share's listing spreads its lookups over threads that outlive it:
    /// started once, at the view's first listing that spreads them, not for each
    /// chunk (where a thread newer than the NFS client's cached `ACCESS` answer asks
    /// the server again: `dirs::Helpers`).
    #[test]
    fn a_listings_lookup_threads_are_started_once_for_the_view() {
        let dir = populated(300);
        let v = network_view(dir.path(), "gid=5");
        for _ in 0..2 {
            let fh = v.opendir(ROOT).unwrap();
            let items = rest(&v, fh, 0, Listing::WithAttributes);
            every_file_with_attributes(&v, &items, 300);
            v.release(fh);
        }
        assert_eq!(
            helpers_started(&v, dirs::NETWORK_LOOKUP_THREADS),
            dirs::NETWORK_LOOKUP_THREADS
        );
    }

    /// Listings at once each get a pool of their own, kept for the next listings; past
    /// [`dirs::MAX_POOLS`] at once, a pool for the chunk alone.
    #[test]
    fn listings_at_once_each_get_lookup_threads_of_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let v = view(dir.path(), "gid=5");
        let lent: Vec<_> = (0..dirs::MAX_POOLS + 1)
            .map(|_| v.helpers.lend(2).unwrap())
            .collect();
        let all = 2 * (dirs::MAX_POOLS + 1);
        assert_eq!(helpers_started(&v, all), all);
        drop(lent);
        // The kept ones are lent again: no thread is started.
        let again: Vec<_> = (0..dirs::MAX_POOLS)
            .map(|_| v.helpers.lend(2).unwrap())
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_eq!(v.helpers.started(), all);
        drop(again);
    }

    /// An idle view has the threads it had before its listings: kept pools end after
    /// [`dirs::POOL_IDLE`] without a listing (here 200 ms), and a listing after that
    /// gets a pool anew.
    #[test]
    fn kept_lookup_threads_end_when_no_listing_comes() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = view(dir.path(), "gid=5");
        v.helpers = dirs::Helpers::new(std::time::Duration::from_millis(200));
        let lent: Vec<_> = (0..2).map(|_| v.helpers.lend(2).unwrap()).collect();
        assert_eq!(helpers_started(&v, 4), 4);
        assert_eq!(v.helpers.kept(), 2);
        drop(lent);
        // Lent again before they waited long: kept, no thread started.
        let again = v.helpers.lend(2).unwrap();
        drop(again);
        assert_eq!(v.helpers.started(), 4);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while v.helpers.ended() < 4 {
            assert!(
                std::time::Instant::now() < deadline,
                "idle pools kept: {} of 4 threads ended",
                v.helpers.ended()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(v.helpers.kept(), 0);
        // The next listing starts a pool anew, kept in turn.
        let anew = v.helpers.lend(2).unwrap();
        assert_eq!(helpers_started(&v, 6), 6);
        drop(anew);
        assert_eq!(v.helpers.kept(), 1);
    }

    /// Where the view acts as its callers, the lookups a listing spreads over its
    /// threads are made as the caller the listing is made for, though the threads
    /// were started for another.
    #[test]
    fn a_listings_lookup_threads_act_as_its_caller() {
        let dir = populated(300);
        let v = network_view(dir.path(), "ownership=share");
        let list = |v: &ViewFs| {
            let fh = v.opendir(ROOT).unwrap();
            let items = rest(v, fh, 0, Listing::WithAttributes);
            v.release(fh);
            assert_eq!(items.iter().filter(|i| i.attr.is_some()).count(), 300);
            v.helpers.looked_up_as()
        };
        // The threads start for the view's own listing, as root.
        let parts = list(&v);
        assert!(
            parts.len() > 1 && parts.iter().all(|&ids| ids == (0, 0)),
            "{parts:?}"
        );
        assert_eq!(
            helpers_started(&v, dirs::NETWORK_LOOKUP_THREADS),
            dirs::NETWORK_LOOKUP_THREADS
        );
        let acting = crate::sys::creds::act_as(1000, 1000, &[]).unwrap();
        let parts = list(&v);
        drop(acting);
        assert!(
            parts.len() > 1 && parts.iter().all(|&ids| ids == (1000, 1000)),
            "{parts:?}"
        );
        // And as root again once the caller is gone.
        let parts = list(&v);
        assert!(parts.iter().all(|&ids| ids == (0, 0)), "{parts:?}");
    }

    /// Where the view acts as its callers, a walk is warmed ahead as its caller: the
    /// share's answers the warming gets (the NFS client's cached `ACCESS`) are those
    /// the walker needs, and a directory closed to the walker is not listed ahead.
    #[test]
    fn a_walk_is_warmed_ahead_as_its_caller() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mode = |p: &std::path::Path, m| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
        };
        mode(dir.path(), 0o755);
        for (name, m) in [("closed", 0o700), ("open", 0o755)] {
            let d = dir.path().join(name);
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("f"), "").unwrap();
            mode(&d, m);
        }
        let v = network_view(dir.path(), "ownership=share");
        without_read_search_override();
        let acting = crate::sys::creds::act_as(1000, 1000, &[]).unwrap();
        let fh = v.opendir(ROOT).unwrap();
        let items = rest(&v, fh, 0, Listing::WithAttributes);
        v.release(fh);
        drop(acting);
        assert_eq!(items.iter().filter(|i| i.attr.is_some()).count(), 2);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while v.walked_ahead() < 1 || v.ahead.running() {
            assert!(
                std::time::Instant::now() < deadline,
                "the warming never ended"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(v.walked_ahead(), 1, "only the directory open to the caller");
    }

    /// A walk's open of a directory warmed ahead takes the warming's descriptor, but
    /// only where the caller may read the directory: the warming lists as the view,
    /// and a view that acts as its callers leaves that check to the share.
    #[test]
    fn a_walk_opens_a_directory_warmed_ahead_only_where_its_caller_may_read_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        for (name, mode) in [("closed", 0o700), ("open", 0o755), ("last", 0o755)] {
            let d = dir.path().join(name);
            std::fs::create_dir(&d).unwrap();
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
            std::fs::write(d.join("f"), "").unwrap();
        }
        let v = network_view(dir.path(), "ownership=share");
        let fh = v.opendir(ROOT).unwrap();
        let items = rest(&v, fh, 0, Listing::WithAttributes);
        v.release(fh);
        let ino = |name: &str| {
            items
                .iter()
                .find(|i| i.name == name.as_bytes())
                .unwrap()
                .ino
        };
        let (closed, open) = (ino("closed"), ino("open"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while v.ahead.held_dirs().len() < crate::fs::ahead::AHEAD {
            assert!(std::time::Instant::now() < deadline, "nothing warmed ahead");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let mut held = v.ahead.held_dirs();
        held.sort();
        let mut want = vec![closed, open];
        want.sort();
        assert_eq!(held, want, "the first two in listing order");
        without_read_search_override();
        let acting = crate::sys::creds::act_as(1000, 1000, &[]).unwrap();
        let refused = v.opendir(closed).err().map(|e| e.errno());
        drop(acting);
        assert_eq!(
            refused,
            Some(libc::EACCES),
            "a directory closed to its caller"
        );
        assert_eq!(v.ahead.held_dirs(), [open]);
        assert_eq!(v.ahead.dirs_claimed(), 0);
        let fh = v.opendir(open).unwrap();
        assert!(v.ahead.held_dirs().is_empty());
        assert_eq!(v.ahead.dirs_claimed(), 1, "taken by the walker's open");
        let listed = rest(&v, fh, 0, Listing::Names);
        v.release(fh);
        assert!(listed.iter().any(|i| i.name == b"f"), "{listed:?}");
    }

    #[test]
    fn what_listings_read_ahead_is_bounded_per_stream_and_per_view() {
        let dir = populated(20_000);
        let v = view(dir.path(), "gid=5");
        let batch = 64 * 1024; // a batch of short names, more than enough
        let one = v.opendir(ROOT).unwrap();
        chunk(&v, one, 0);
        for _ in 0..10 {
            v.read_ahead(one);
        }
        let held = v.pending_dir_bytes.load(Ordering::Relaxed);
        assert!(held >= dirs::AHEAD_PER_STREAM, "{held}");
        assert!(held < dirs::AHEAD_PER_STREAM + batch, "{held}");
        // Streams left unfinished cannot make the daemon hold more than the view's bound.
        let mut streams = vec![one];
        for _ in 0..(dirs::AHEAD_PER_VIEW / dirs::AHEAD_PER_STREAM) * 2 {
            let fh = v.opendir(ROOT).unwrap();
            chunk(&v, fh, 0);
            v.read_ahead(fh);
            streams.push(fh);
        }
        let held = v.pending_dir_bytes.load(Ordering::Relaxed);
        assert!(held >= dirs::AHEAD_PER_VIEW, "{held}");
        assert!(held < dirs::AHEAD_PER_VIEW + batch, "{held}");
        for fh in streams {
            v.release(fh);
        }
        assert_eq!(v.pending_dir_bytes.load(Ordering::Relaxed), 0);
    }

    /// Issue 33's listing cliff: a name listing made right after a walk elsewhere in the
    /// view carried attributes (a lookup per entry). It stays a name listing; the
    /// walked directory, and a directory the walk reaches from it, carry attributes.
    #[test]
    fn a_name_listing_beside_a_walk_stays_a_name_listing() {
        let dir = tempfile::tempdir().unwrap();
        for d in ["walked", "walked/sub", "elsewhere"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        for i in 0..64 {
            for d in ["walked", "walked/sub", "elsewhere"] {
                std::fs::write(dir.path().join(d).join(format!("f{i}")), "x").unwrap();
            }
        }
        let v = view(dir.path(), "gid=5");
        let list = |ino: u64| listed_files(&v, ino);
        let walked = v.lookup(ROOT, OsStr::new("walked")).unwrap().ino;
        let elsewhere = v.lookup(ROOT, OsStr::new("elsewhere")).unwrap().ino;
        // A walker stats all it lists in `walked`, and goes down into `sub`.
        for i in list(walked) {
            v.lookup(walked, OsStr::from_bytes(&i.name)).unwrap();
        }
        let sub = v.lookup(walked, OsStr::new("sub")).unwrap().ino;
        let with = |items: &[DirItem]| items.iter().filter(|i| i.attr.is_some()).count();
        assert!(
            with(&list(walked)) >= 63,
            "the walked directory carries attributes"
        );
        assert!(
            with(&list(sub)) >= 63,
            "where the walk goes next, from its first entry"
        );
        assert_eq!(
            with(&list(elsewhere)),
            0,
            "a name listing elsewhere stays one"
        );
    }

    #[test]
    fn a_listing_carries_attributes_only_while_listed_names_are_looked_up() {
        let dir = populated(64);
        let v = view(dir.path(), "gid=5");
        let list = |v: &ViewFs| listed_files(v, ROOT);
        // Nobody has stated a listed name yet: names only, nothing registered.
        let first = list(&v);
        assert_eq!(first.len(), 64);
        assert!(
            first
                .iter()
                .all(|i| i.attr.is_none() && i.kind == Kind::Regular)
        );
        assert_eq!(v.inode_count(), 1);
        // A lookup of a name not listed (a path walk, a create) is no evidence.
        let _ = v.lookup(ROOT, OsStr::new("absent"));
        assert!(list(&v).iter().all(|i| i.attr.is_none()));
        // A walker: it stats what it listed. The next listing carries attributes, but
        // for one entry in 256 (probes that keep the evidence coming).
        for i in &first {
            v.lookup(ROOT, OsStr::from_bytes(&i.name)).unwrap();
        }
        let looked_up = v.inode_count();
        let second = list(&v);
        let with = second.iter().filter(|i| i.attr.is_some()).count();
        assert!((63..=64).contains(&with), "{with} of 64 carried attributes");
        for i in second.iter().filter(|i| i.attr.is_some()) {
            let a = i.attr.unwrap();
            assert_eq!((a.ino, a.gid), (i.ino, 5));
        }
        // Each entry handed with attributes is one more kernel lookup of its inode.
        assert_eq!(v.inode_count(), looked_up);
    }

    /// A walk that starts at a directory of two (`find` over a tree whose top holds one
    /// directory) showed no evidence before it listed the big one below: one entry in
    /// 16 is a probe, counted over the view, and the top had none. Every name listing's
    /// first entry is a probe too.
    #[test]
    fn the_first_entry_of_a_name_listing_is_a_probe() {
        let dir = populated(2);
        std::fs::create_dir(dir.path().join("fdir")).unwrap();
        let v = view(dir.path(), "gid=5");
        let first = listed_files(&v, ROOT);
        assert_eq!(first.len(), 3);
        assert!(first.iter().all(|i| i.attr.is_none()));
        assert!(!v.listing.walking_in(ROOT));
        // A walker states what it listed, from the first.
        let a = v.lookup(ROOT, OsStr::from_bytes(&first[0].name)).unwrap();
        assert!(v.listing.walking_in(ROOT), "the first entry was a probe");
        v.forget(a.ino, 1);
        // A listing that starts midway (after the first file) has no first entry to
        // probe.
        let other = populated(3);
        let w = view(other.path(), "gid=5");
        let fh = w.opendir(ROOT).unwrap();
        let mut after_first = 0;
        w.readdir(
            ROOT,
            fh,
            0,
            Listing::Names,
            Room::UNBOUNDED,
            |item, next| {
                after_first = next;
                item.name.starts_with(b"f")
            },
        )
        .unwrap();
        let mut midway = Vec::new();
        w.readdir(
            ROOT,
            fh,
            after_first,
            Listing::AsNeeded,
            Room::UNBOUNDED,
            |item, _| {
                midway.push(item.clone());
                false
            },
        )
        .unwrap();
        w.release(fh);
        midway.retain(|i| i.name.starts_with(b"f"));
        assert_eq!(midway.len(), 2, "{midway:?}");
        let _ = w.lookup(ROOT, OsStr::from_bytes(&midway[0].name)).unwrap();
        assert!(!w.listing.walking_in(ROOT));
    }

    /// On NFS a lookup of an entry the client has not seen waits two round trips, and
    /// the kernel (before 6.16) asks for a page of a walk's listing at a time (25 or so): a
    /// listing that looked up only what each page had room for took longer than the
    /// entries' timeouts, and the walker looked most of them up again, one at a time.
    /// A network share's listing looks up further ahead, over its threads, and the
    /// next chunks hand what was looked up; what is never handed is forgotten.
    #[test]
    fn a_network_shares_walk_listing_looks_up_past_the_page_for_the_next() {
        let dir = populated(200);
        let v = network_view(dir.path(), "gid=5");
        // A page's room: 10 entries of these names (a header as the kernel's).
        let room = Room {
            bytes: 10 * 160,
            header: 152,
        };
        let fh = v.opendir(ROOT).unwrap();
        let mut handed: Vec<DirItem> = Vec::new();
        let mut at = 0;
        // As the kernel's reply: full when the next entry does not fit.
        let chunk = |v: &ViewFs, at: &mut u64, handed: &mut Vec<DirItem>| {
            let before = handed.len();
            let mut left = room.bytes;
            v.readdir(
                ROOT,
                fh,
                *at,
                Listing::WithAttributes,
                room,
                |item, next| {
                    let Some(after) = left.checked_sub(room.cost(&item.name)) else {
                        return true;
                    };
                    left = after;
                    handed.push(item.clone());
                    *at = next;
                    false
                },
            )
            .unwrap();
            handed.len() - before
        };
        dirs::looked_up::take();
        assert!(chunk(&v, &mut at, &mut handed) <= 10);
        assert_eq!(dirs::looked_up::take(), dirs::NETWORK_LOOK_AHEAD);
        let files = |items: &[DirItem]| items.iter().filter(|i| i.name.starts_with(b"f")).count();
        // The page's lookups, and those waiting for the next pages.
        assert_eq!(v.inode_count(), 1 + dirs::NETWORK_LOOK_AHEAD);
        while chunk(&v, &mut at, &mut handed) > 0 {}
        assert_eq!(files(&handed), 200);
        assert_eq!(
            dirs::looked_up::take(),
            200 - dirs::NETWORK_LOOK_AHEAD,
            "no entry looked up twice"
        );
        assert_eq!(v.inode_count(), 1 + 200);
        for item in handed.iter().filter(|i| i.name.starts_with(b"f")) {
            let a = item.attr.expect("a walk's entry carries attributes");
            assert_eq!(a, v.lookup(ROOT, OsStr::from_bytes(&item.name)).unwrap());
            v.forget(a.ino, 2);
        }
        assert_eq!(v.inode_count(), 1);
        // A listing that stops after a page, or starts over, forgets what it looked up
        // ahead and did not hand.
        let (mut handed, mut at) = (Vec::new(), 0);
        chunk(&v, &mut at, &mut handed);
        let kept = files(&handed);
        assert_eq!(v.inode_count(), 1 + dirs::NETWORK_LOOK_AHEAD);
        dirs::looked_up::take();
        let mut again = Vec::new();
        chunk(&v, &mut 0, &mut again);
        // The same entries again: the first page's lookups ahead were forgotten and made
        // anew, not kept twice.
        assert_eq!(again, handed);
        assert_eq!(dirs::looked_up::take(), dirs::NETWORK_LOOK_AHEAD);
        assert_eq!(v.inode_count(), 1 + dirs::NETWORK_LOOK_AHEAD);
        v.release(fh);
        assert_eq!(v.inode_count(), 1 + kept);
        for a in handed.iter().filter_map(|i| i.attr) {
            v.forget(a.ino, 2);
        }
        assert_eq!(v.inode_count(), 1);
    }
}
