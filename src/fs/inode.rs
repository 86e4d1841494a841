//! The inode table: every inode the kernel holds a reference to, counted by lookups
//! and released on FORGET.
//!
//! An inode is named by a file handle (`name_to_handle_at`) and reached through an
//! `O_PATH` descriptor opened from it on demand (`open_by_handle_at`, which no rename
//! can steer). Open descriptors are kept in a bounded cache, so memory and open
//! descriptors stay bounded however many files a pod walks: the kernel may cache a
//! million inodes, the view holds a million small handles and a few thousand
//! descriptors. On a backing file system without handles (most FUSE backends) each
//! inode keeps its descriptor for as long as the kernel holds it.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};

use crate::sys::file::{self, Access, Kind, Stat, Time};
use crate::sys::handle::{self, FileHandle};
use crate::sys::{Errno, SysResult};

pub use super::datafile::{
    DataFile, InodeOpens, LiveFiles, MovedAside, OpenHold, Registered, left_aside,
};
use super::error::{FsError, FsResult};
use super::journal::{Entry, Journaling};
use super::lock;
use super::snapshot::{InodeSnapshot, KeySnapshot, TableSnapshot};

/// The kernel's id of the root inode.
pub const ROOT_ID: u64 = 1;

/// Ids handed out when the backing inode number cannot serve (it is 1, it is taken
/// by an older inode with the same number, or a second file system under one mount,
/// e.g. btrfs subvolumes, reuses a number).
const SPARE_BASE: u64 = 1 << 63;

/// A backing inode's identity. An inode number alone is not one: a file system reuses
/// the number of a deleted file for the next file it makes, so where the file system
/// has handles, the handle (which carries a generation) names the inode, as in
/// virtiofsd's inode store. Where there are none, the number and the birth time do,
/// where the file system tells it, as the kernel's SMB client tells a reused server
/// inode number from the file that had it (fs/smb/client/inode.c `cifs_find_inode`
/// compares the creation time).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum InodeKey {
    /// A file handle on the device `dev`.
    Handle { dev: u64, handle: FileHandle },
    /// Device, inode number and birth time, for file systems without handles. On an
    /// SMB share the server hands a new file the number of one just removed (Samba
    /// on ext4 does, at once): as one inode, two files shared one node id, and the
    /// kernel refused an open of one for the other's open mode (`EIO`,
    /// fs/fuse/iomode.c), or opened the other's descriptor.
    Number {
        dev: u64,
        ino: u64,
        born: Option<Time>,
    },
}

impl InodeKey {
    /// The identity of the inode `st` describes, by `handle` where it has one.
    pub fn of(st: &Stat, handle: Option<FileHandle>) -> InodeKey {
        match handle {
            Some(handle) => InodeKey::Handle {
                dev: st.dev,
                handle,
            },
            None => InodeKey::Number {
                dev: st.dev,
                ino: st.ino,
                born: st.btime,
            },
        }
    }

    /// The device the inode is on.
    pub fn dev(&self) -> u64 {
        match self {
            InodeKey::Handle { dev, .. } | InodeKey::Number { dev, .. } => *dev,
        }
    }

    /// Its identity as plain data (a snapshot's, a journal's).
    pub fn snapshot(&self) -> KeySnapshot {
        match self {
            InodeKey::Handle { dev, handle } => KeySnapshot::Handle {
                dev: *dev,
                words: handle.words().to_vec(),
            },
            InodeKey::Number { dev, ino, born } => KeySnapshot::Number {
                dev: *dev,
                ino: *ino,
                born: born.map(|t| (t.sec, t.nsec)),
            },
        }
    }

    /// The identity a snapshot or journal names.
    ///
    /// # Errors
    /// [`FsError::Handover`] for words that are no file handle.
    pub fn from_snapshot(s: &KeySnapshot) -> FsResult<InodeKey> {
        Ok(match s {
            KeySnapshot::Handle { dev, words } => InodeKey::Handle {
                dev: *dev,
                handle: FileHandle::from_words(words)
                    .ok_or(FsError::Handover("a malformed file handle"))?,
            },
            KeySnapshot::Number { dev, ino, born } => InodeKey::Number {
                dev: *dev,
                ino: *ino,
                born: born.map(|(sec, nsec)| Time { sec, nsec }),
            },
        })
    }
}

/// How an inode is reached.
enum Source {
    /// Its own descriptor for as long as the kernel holds the inode (the root, and
    /// file systems without handles): the one of the latest lookup, since a network
    /// file system reopens a descriptor by its name, which a rename or an unlink after
    /// a hard link takes away (git's objects: link, then unlink the temporary name).
    Pinned(Mutex<Arc<OwnedFd>>),
    /// Its handle (in the key), and a descriptor opened from it while the cache keeps
    /// it.
    Handle(Mutex<Option<Arc<OwnedFd>>>),
}

/// Whether an error says the process (or the system) ran out of descriptors.
fn out_of_descriptors(e: Errno) -> bool {
    matches!(e, Errno::EMFILE | Errno::ENFILE)
}

/// What the inodes of one view share: the root descriptor handles are opened
/// against, and the bound on cached descriptors.
struct Shared {
    /// The root opened for reading: `open_by_handle_at` refuses an `O_PATH` one.
    mount_fd: Option<OwnedFd>,
    max_cached: usize,
    cached: AtomicUsize,
    /// Inodes in the order their descriptors were cached (oldest first).
    queue: Mutex<VecDeque<Weak<Inode>>>,
}

impl Shared {
    /// Runs a call that opens a descriptor; when the process is out of descriptors,
    /// closes half of the cache and tries once more.
    fn with_fds<T>(&self, call: impl Fn() -> SysResult<T>) -> SysResult<T> {
        match call() {
            Err(e) if out_of_descriptors(e) => {
                self.relieve();
                call()
            }
            r => r,
        }
    }

    /// Drops the descriptor queue's places of forgotten inodes. Each keeps its inode's
    /// allocation (a `Weak`), and after a forget storm tens of thousands of them were
    /// scattered over the heap, pinning pages that `malloc_trim` could not return.
    fn sweep(&self) {
        let mut queue = lock(&self.queue);
        queue.retain(|w| w.strong_count() > 0);
        queue.shrink_to_fit();
    }

    /// Closes the older half of the cached descriptors. Called when a call ran out of
    /// descriptors: files that a pod holds open then squeeze the cache instead of
    /// failing every lookup of the view for everyone.
    fn relieve(&self) {
        let mut queue = lock(&self.queue);
        let target = self.cached.load(Ordering::Relaxed) / 2;
        while self.cached.load(Ordering::Relaxed) > target {
            let Some(old) = queue.pop_front() else { break };
            if let Some(old) = old.upgrade() {
                old.uncache();
            }
        }
    }
}

/// One inode the kernel holds a reference to.
pub struct Inode {
    /// The kernel's id for it (`nodeid`), also shown as `st_ino`.
    pub id: u64,
    pub kind: Kind,
    pub key: InodeKey,
    source: Source,
    shared: Arc<Shared>,
    lookups: AtomicU64,
    /// Whether its node id is in the journal, or needs no line there (no journal when
    /// it was made: the journal's first write holds the table). A lookup that finds it
    /// still `false` writes the line itself before its answer, so that the kernel never
    /// holds a node id the journal lacks ([`InodeTable::lookup_handled`]).
    journaled: AtomicBool,
    /// The shared I/O descriptor while any handle is open.
    pub data: Mutex<Weak<DataFile>>,
    /// Its shared descriptors that live, `data` and any older one.
    pub opens: Arc<InodeOpens>,
    /// The passthrough registration its shared descriptors hold, while one does: the
    /// one a descriptor made later must name too (`ViewFs::registration`).
    pub registration: Mutex<Weak<Registered>>,
    /// What the last read of its ownership record found (where the view may read a
    /// record's name in the list of names first: [`crate::fs::ops::ViewFs`],
    /// `records_listed`).
    pub record_seen: RecordMemo,
    /// When the view last read its attributes from the file system afresh (not from
    /// its cache): how fresh a cached read of them is at least.
    pub synced: SyncedAt,
}

/// What a read of an inode's ownership record found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordSeen {
    /// Never read.
    Unread,
    Absent,
    Present,
}

/// A [`RecordSeen`] that threads update in place.
#[derive(Debug, Default)]
pub struct RecordMemo(std::sync::atomic::AtomicU8);

impl RecordMemo {
    pub fn get(&self) -> RecordSeen {
        match self.0.load(Ordering::Relaxed) {
            0 => RecordSeen::Unread,
            1 => RecordSeen::Absent,
            _ => RecordSeen::Present,
        }
    }

    pub fn set(&self, seen: RecordSeen) {
        self.0.store(seen as u8, Ordering::Relaxed);
    }
}

/// When something was last done, for threads to set and read in place: nanoseconds
/// past the process's first use of it, plus one (0: never).
#[derive(Debug, Default)]
pub struct SyncedAt(AtomicU64);

impl SyncedAt {
    fn epoch() -> std::time::Instant {
        static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        *EPOCH.get_or_init(std::time::Instant::now)
    }

    /// Now.
    pub fn mark(&self) {
        let nanos = Self::epoch()
            .elapsed()
            .as_nanos()
            .min(u128::from(u64::MAX - 1)) as u64;
        self.0.store(nanos + 1, Ordering::Relaxed);
    }

    /// How long ago it was last marked; `None` if never.
    pub fn age(&self) -> Option<std::time::Duration> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            at => Some(
                Self::epoch()
                    .elapsed()
                    .saturating_sub(std::time::Duration::from_nanos(at - 1)),
            ),
        }
    }
}

thread_local! {
    /// The inodes this thread made inside a [`JournalBatch`] whose journal lines are
    /// still to be written; `None` outside a batch, where each line goes out at once.
    static DEFERRED: std::cell::RefCell<Option<Vec<Arc<Inode>>>> =
        const { std::cell::RefCell::new(None) };
}

/// While it lives, the journal lines of the inodes this thread makes wait, and they go
/// out in one write when it is dropped: a listing's lookups make hundreds of node ids
/// before one answer gives them to the kernel, which a `write(2)` each made cost 5 % of
/// a kept view's CPU in a walk. It must be dropped before the answer that gives their
/// ids; a `forget` on this thread writes them first, so no `Forgot` line precedes
/// them; another lookup that finds one of them writes its line at once.
pub struct JournalBatch<'a> {
    table: &'a InodeTable,
    /// Whether this one started the thread's batch (an inner one leaves it to it).
    outer: bool,
}

impl Drop for JournalBatch<'_> {
    fn drop(&mut self) {
        self.table.write_deferred();
        if self.outer {
            DEFERRED.with(|d| *d.borrow_mut() = None);
        }
    }
}

/// The journal line of an inode's node id.
fn inode_entry(inode: &Inode) -> Entry {
    Entry::Inode {
        id: inode.id,
        mode: inode.kind.mode_bits(),
        key: inode.key.snapshot(),
    }
}

impl Inode {
    /// An `O_PATH` descriptor of the inode: the pinned one, a cached one, the open
    /// file's own, or one opened now from the handle (evicting the oldest cached
    /// descriptor if the cache is full).
    ///
    /// # Errors
    /// `ESTALE` when the inode no longer exists, or the error of opening it.
    pub fn fd(self: &Arc<Self>) -> FsResult<Arc<OwnedFd>> {
        let cached = match &self.source {
            Source::Pinned(fd) => return Ok(Arc::clone(&lock(fd))),
            Source::Handle(cached) => cached,
        };
        if let Some(fd) = lock(cached).as_ref() {
            return Ok(Arc::clone(fd));
        }
        // An open file is reached through its open descriptor: a handle does not open
        // a file that was deleted while open, and an open file is never stale.
        if let Some(data) = lock(&self.data).upgrade() {
            return Ok(Arc::clone(&data.fd));
        }
        let InodeKey::Handle { handle, .. } = &self.key else {
            return Err(FsError::Os(Errno::EBADF));
        };
        let mount_fd = self
            .shared
            .mount_fd
            .as_ref()
            .ok_or(FsError::Os(Errno::EBADF))?;
        let fd = Arc::new(
            self.shared
                .with_fds(|| handle::open(mount_fd.as_fd(), handle))?,
        );
        self.cache(Arc::clone(&fd));
        Ok(fd)
    }

    /// The kernel's lookups of this inode that are not forgotten yet.
    pub fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::Relaxed)
    }

    /// Keeps `fd` as this inode's descriptor, within the cache's bound; a pinned inode
    /// (no handles) keeps the latest lookup's.
    fn cache(self: &Arc<Self>, fd: Arc<OwnedFd>) {
        let cached = match &self.source {
            Source::Handle(cached) => cached,
            Source::Pinned(pinned) => {
                if self.id != ROOT_ID {
                    *lock(pinned) = fd;
                }
                return;
            }
        };
        {
            let mut slot = lock(cached);
            if slot.is_some() {
                return;
            }
            *slot = Some(fd);
        }
        self.shared.cached.fetch_add(1, Ordering::Relaxed);
        let mut queue = lock(&self.shared.queue);
        queue.push_back(Arc::downgrade(self));
        while self.shared.cached.load(Ordering::Relaxed) > self.shared.max_cached {
            let Some(old) = queue.pop_front() else { break };
            if let Some(old) = old.upgrade() {
                old.uncache();
            }
        }
        // Entries of forgotten inodes pile up when nothing is evicted: sweep them.
        if queue.len() > 2 * self.shared.max_cached.max(1024) {
            queue.retain(|w| w.strong_count() > 0);
        }
    }

    fn uncache(&self) {
        if let Source::Handle(cached) = &self.source {
            if lock(cached).take().is_some() {
                self.shared.cached.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for Inode {
    fn drop(&mut self) {
        self.uncache();
    }
}

struct Maps {
    by_id: HashMap<u64, Arc<Inode>>,
    by_key: HashMap<InodeKey, u64>,
    next_spare: u64,
}

/// All inodes of one view.
pub struct InodeTable {
    maps: RwLock<Maps>,
    root: Arc<Inode>,
    shared: Arc<Shared>,
    /// Where node ids given and forgotten are journaled (a keeper holds the view).
    journal: OnceLock<Arc<Journaling>>,
}

impl InodeTable {
    /// A table holding only the root, which is never forgotten. At most
    /// `max_cached` descriptors are kept open for inodes reached by handle.
    pub fn new(root_fd: OwnedFd, root: &Stat, max_cached: usize) -> InodeTable {
        let mount_fd = file::reopen(root_fd.as_fd(), Kind::Directory, Access::Directory).ok();
        let handle = handle::of(root_fd.as_fd())
            .ok()
            .filter(|_| mount_fd.is_some());
        let key = InodeKey::of(root, handle);
        let root_fd = Arc::new(root_fd);
        let shared = Arc::new(Shared {
            mount_fd,
            max_cached: max_cached.max(1),
            cached: AtomicUsize::new(0),
            queue: Mutex::new(VecDeque::new()),
        });
        let root = Arc::new(Inode {
            id: ROOT_ID,
            kind: root.kind,
            key: key.clone(),
            source: Source::Pinned(Mutex::new(root_fd)),
            shared: Arc::clone(&shared),
            lookups: AtomicU64::new(1),
            journaled: AtomicBool::new(true),
            data: Mutex::new(Weak::new()),
            opens: Arc::default(),
            registration: Mutex::new(Weak::new()),
            record_seen: RecordMemo::default(),
            synced: SyncedAt::default(),
        });
        let mut maps = Maps {
            by_id: HashMap::new(),
            by_key: HashMap::new(),
            next_spare: SPARE_BASE,
        };
        maps.by_id.insert(ROOT_ID, Arc::clone(&root));
        maps.by_key.insert(key, ROOT_ID);
        InodeTable {
            maps: RwLock::new(maps),
            root,
            shared,
            journal: OnceLock::new(),
        }
    }

    /// Journals node ids given and forgotten from now on.
    pub fn set_journal(&self, journal: Arc<Journaling>) {
        let _ = self.journal.set(journal);
    }

    /// Runs `f` with the table as plain data while no node id can be given or
    /// forgotten (a journal compaction). No descriptors: a view whose inodes need them
    /// (no handles) is never journaled.
    pub fn with_locked<R>(&self, f: impl FnOnce(TableSnapshot) -> R) -> R {
        let maps = self.maps.write().unwrap_or_else(|e| e.into_inner());
        f(self.table_of(&maps, None))
    }

    /// Whether a process that starts after this one dies can reach every inode again
    /// (all are named by handles): only then is a journal worth keeping.
    pub fn recoverable(&self) -> bool {
        self.shared.mount_fd.is_some()
    }

    pub fn root(&self) -> &Arc<Inode> {
        &self.root
    }

    /// The inode with kernel id `id`.
    ///
    /// # Errors
    /// [`FsError::UnknownInode`] when the kernel names an id it was never given or has
    /// forgotten.
    pub fn get(&self, id: u64) -> FsResult<Arc<Inode>> {
        if id == ROOT_ID {
            return Ok(Arc::clone(&self.root));
        }
        let maps = self.maps.read().unwrap_or_else(|e| e.into_inner());
        maps.by_id
            .get(&id)
            .cloned()
            .ok_or(FsError::UnknownInode(id))
    }

    /// Runs `call`, which opens a descriptor; when the process has run out of them, the
    /// older half of the cached descriptors is closed and `call` tried once more, so
    /// that files a pod holds open squeeze the cache instead of failing lookups.
    ///
    /// # Errors
    /// The error of the last call.
    pub fn with_fds<T>(&self, call: impl Fn() -> SysResult<T>) -> SysResult<T> {
        self.shared.with_fds(call)
    }

    /// Counts one kernel lookup of the inode `fd` refers to, registering it if new.
    /// The descriptor becomes the inode's (cached) descriptor.
    ///
    /// The inode is identified by its handle, so a new file that got the number of a
    /// deleted one is a new inode (with a spare id while the kernel still holds the
    /// old one), never the old entry with the old file's handle and kind.
    pub fn lookup(&self, fd: OwnedFd, st: &Stat) -> Arc<Inode> {
        let handle = self.handle_of(fd.as_fd());
        self.lookup_handled(fd, st, handle)
    }

    /// The handle [`InodeTable::lookup`] names the inode of `fd` by: `None` where the
    /// file system has none, or without a mount descriptor to open handles against.
    /// A system call: taken outside the table's lock.
    pub fn handle_of(&self, fd: BorrowedFd<'_>) -> Option<FileHandle> {
        match self.shared.mount_fd {
            Some(_) => handle::of(fd).ok(),
            None => None,
        }
    }

    /// The handle of what the single name `name` in `dir` is now, as
    /// [`InodeTable::handle_of`] would name it once opened (a hint: nothing is opened).
    pub fn handle_of_child(
        &self,
        dir: BorrowedFd<'_>,
        name: &std::ffi::OsStr,
    ) -> Option<FileHandle> {
        match self.shared.mount_fd {
            Some(_) => handle::of_child(dir, name).ok(),
            None => None,
        }
    }

    /// Whether the table has the inode `st` and `handle` describe, as
    /// [`InodeTable::lookup_handled`] would find it: one the kernel holds (or a
    /// handle or the view's own use keeps).
    pub fn has(&self, st: &Stat, handle: Option<&FileHandle>) -> bool {
        self.by_key(&self.key_of(st, handle.cloned()))
            .is_some_and(|i| i.kind == st.kind)
    }

    /// The key the table files the inode `st` and `handle` describe under: by handle
    /// where it can open handles (a mount descriptor), else by number.
    fn key_of(&self, st: &Stat, handle: Option<FileHandle>) -> InodeKey {
        InodeKey::of(st, handle.filter(|_| self.shared.mount_fd.is_some()))
    }

    /// [`InodeTable::lookup`] with the handle of `fd` taken already (`None`: it has
    /// none), as the walk-ahead takes it off the walker's path (`fs/ahead.rs`).
    pub fn lookup_handled(&self, fd: OwnedFd, st: &Stat, handle: Option<FileHandle>) -> Arc<Inode> {
        // Without a mount descriptor to open handles against, inodes keep their
        // descriptors.
        let handle = handle.filter(|_| self.shared.mount_fd.is_some());
        let key = self.key_of(st, handle.clone());
        // Under the read lock no FORGET can remove an entry, so an inode found here has
        // at least one lookup and may safely gain another.
        let found = Self::looked_up_again(
            &self.maps.read().unwrap_or_else(|e| e.into_inner()),
            &key,
            st.kind,
        );
        if let Some(inode) = found {
            return self.found(inode, fd);
        }
        let mut maps = self.maps.write().unwrap_or_else(|e| e.into_inner());
        // Another lookup may have made it meanwhile.
        if let Some(inode) = Self::looked_up_again(&maps, &key, st.kind) {
            drop(maps);
            return self.found(inode, fd);
        }
        let (source, to_cache) = match handle {
            Some(_) => (Source::Handle(Mutex::new(None)), Some(fd)),
            // No handles here: the inode keeps its descriptor.
            None => (Source::Pinned(Mutex::new(Arc::new(fd))), None),
        };
        let inode = self.insert(&mut maps, key, st, source);
        drop(maps);
        // The line is written outside the table's lock, which every lookup of a walk
        // needs (a kept view's walk waited on it). Its order against a `Forgot` of this
        // id holds without the lock: this lookup's count keeps the id alive until it
        // has answered, so the id cannot be forgotten before the line; a lookup that
        // finds the inode sooner writes the line itself ([`InodeTable::journal_owed`]),
        // and a repeated line replays to the same table. In a batch, it waits for the
        // batch's write ([`JournalBatch`]).
        if !inode.journaled.load(Ordering::Acquire) && !self.defer(&inode) {
            self.journal_owed(&inode);
        }
        if let Some(fd) = to_cache {
            // The lookup's descriptor is open already: it is the first cached one.
            inode.cache(Arc::new(fd));
        }
        inode
    }

    /// The inode filed under `key` with the kind `kind`, with one more lookup. A
    /// number (no handle) found with another kind is a number the file system gave
    /// again, to a new entry (a server that reuses its disk's inode numbers, as Samba
    /// on ext4 does, behind the CIFS client): a new inode, not the old.
    fn looked_up_again(maps: &Maps, key: &InodeKey, kind: Kind) -> Option<Arc<Inode>> {
        let inode = maps
            .by_key
            .get(key)
            .and_then(|id| maps.by_id.get(id))
            .filter(|i| i.kind == kind)?;
        inode.lookups.fetch_add(1, Ordering::Relaxed);
        Some(Arc::clone(inode))
    }

    /// A lookup that found `inode` in the table: its journal line if still owed, and
    /// the lookup's descriptor `fd` cached (the latest for an inode that keeps its own).
    fn found(&self, inode: Arc<Inode>, fd: OwnedFd) -> Arc<Inode> {
        self.journal_owed(&inode);
        inode.cache(Arc::new(fd));
        inode
    }

    /// A new inode for `st`, filed under `key`, reached through `source`, with one
    /// lookup: its number as its id where that is free, else a spare one.
    fn insert(&self, maps: &mut Maps, key: InodeKey, st: &Stat, source: Source) -> Arc<Inode> {
        let id = if st.ino > ROOT_ID && st.ino < SPARE_BASE && !maps.by_id.contains_key(&st.ino) {
            st.ino
        } else {
            maps.next_spare += 1;
            maps.next_spare
        };
        let inode = Arc::new(Inode {
            id,
            kind: st.kind,
            key: key.clone(),
            source,
            shared: Arc::clone(&self.shared),
            lookups: AtomicU64::new(1),
            // Read under the lock: a journal started later writes this inode with the
            // table (`journal_to` holds the lock).
            journaled: AtomicBool::new(self.journal.get().is_none()),
            data: Mutex::new(Weak::new()),
            opens: Arc::default(),
            registration: Mutex::new(Weak::new()),
            record_seen: RecordMemo::default(),
            synced: SyncedAt::default(),
        });
        maps.by_id.insert(id, Arc::clone(&inode));
        maps.by_key.insert(key, id);
        inode
    }

    /// Writes an inode's journal line if it is still owed: by the lookup that made it,
    /// or by one that found it first, before that lookup's answer gives the kernel its
    /// node id. Two lines for one inode replay to the same table.
    fn journal_owed(&self, inode: &Inode) {
        if inode.journaled.load(Ordering::Acquire) {
            return;
        }
        if let Some(j) = self.journal.get() {
            j.append(&inode_entry(inode));
        }
        inode.journaled.store(true, Ordering::Release);
    }

    /// Starts a [`JournalBatch`] on this thread (or joins the one it is in).
    pub fn batch_journal(&self) -> JournalBatch<'_> {
        let outer = DEFERRED.with(|d| {
            let mut d = d.borrow_mut();
            d.is_none() && d.replace(Vec::new()).is_none()
        });
        JournalBatch { table: self, outer }
    }

    /// Leaves an inode this thread made to its batch's write; `false` outside a batch.
    fn defer(&self, inode: &Arc<Inode>) -> bool {
        DEFERRED.with(|d| match d.borrow_mut().as_mut() {
            Some(pending) => {
                pending.push(Arc::clone(inode));
                true
            }
            None => false,
        })
    }

    /// Writes the lines this thread's batch holds, in one write.
    fn write_deferred(&self) {
        let pending = DEFERRED.with(|d| d.borrow_mut().as_mut().map(std::mem::take));
        let Some(pending) = pending.filter(|p| !p.is_empty()) else {
            return;
        };
        if let Some(j) = self.journal.get() {
            let lines: Vec<Entry> = pending
                .iter()
                .filter(|i| !i.journaled.load(Ordering::Acquire))
                .map(|i| inode_entry(i))
                .collect();
            j.append_all(&lines);
        }
        for i in &pending {
            i.journaled.store(true, Ordering::Release);
        }
    }

    /// Drops `n` kernel lookups of `id`; the inode goes when none are left.
    pub fn forget(&self, id: u64, n: u64) {
        if id == ROOT_ID {
            return;
        }
        // An id this thread made in a batch is journaled before it can be forgotten.
        self.write_deferred();
        let mut maps = self.maps.write().unwrap_or_else(|e| e.into_inner());
        let Some(inode) = maps.by_id.get(&id) else {
            return;
        };
        // Writers are excluded, so load-then-store cannot lose a concurrent change.
        let left = inode.lookups.load(Ordering::Relaxed).saturating_sub(n);
        inode.lookups.store(left, Ordering::Relaxed);
        if left == 0 {
            let key = inode.key.clone();
            if let Some(j) = self.journal.get() {
                j.append(&Entry::Forgot { id });
            }
            maps.by_id.remove(&id);
            if maps.by_key.get(&key) == Some(&id) {
                maps.by_key.remove(&key);
            }
            // After a walk of millions of files the maps would keep their peak size.
            if maps.by_id.capacity() > 1024 && maps.by_id.len() * 4 < maps.by_id.capacity() {
                maps.by_id.shrink_to_fit();
                maps.by_key.shrink_to_fit();
                self.shared.sweep();
                crate::sys::process::trim_heap();
            }
        }
    }

    /// The inode `key` names, if the table holds it.
    pub fn by_key(&self, key: &InodeKey) -> Option<Arc<Inode>> {
        let maps = self.maps.read().unwrap_or_else(|e| e.into_inner());
        maps.by_key
            .get(key)
            .and_then(|id| maps.by_id.get(id))
            .map(Arc::clone)
    }

    /// Closes the cached descriptor of the inode named by `handle` on `dev`, if the
    /// table reaches it by handle: a later use opens it again from the handle. An
    /// inode without a handle keeps its descriptor; an open file keeps its own.
    pub fn let_go(&self, dev: u64, handle: FileHandle) {
        let key = InodeKey::Handle { dev, handle };
        let maps = self.maps.read().unwrap_or_else(|e| e.into_inner());
        if let Some(inode) = maps.by_key.get(&key).and_then(|id| maps.by_id.get(id)) {
            inode.uncache();
        }
    }

    /// How many inodes the table holds (the root included).
    pub fn len(&self) -> usize {
        self.maps
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_id
            .len()
    }

    /// Whether only the root is held.
    pub fn is_empty(&self) -> bool {
        self.len() <= 1
    }

    /// The table as plain data, with the descriptors it refers to by index (those of
    /// inodes without handles): what a process that takes the view over needs to answer
    /// for every node id the kernel holds. Call it while no request is being served.
    pub fn snapshot(&self, fds: &mut Vec<Arc<OwnedFd>>) -> TableSnapshot {
        let maps = self.maps.read().unwrap_or_else(|e| e.into_inner());
        self.table_of(&maps, Some(fds))
    }

    /// The table as plain data, the root left out; with `fds`, the pinned descriptors
    /// of inodes without handles are collected there and named by index.
    fn table_of(&self, maps: &Maps, mut fds: Option<&mut Vec<Arc<OwnedFd>>>) -> TableSnapshot {
        let inodes = maps
            .by_id
            .values()
            // The root is never forgotten and each view opens its own.
            .filter(|inode| inode.id != ROOT_ID)
            .map(|inode| {
                let fd = match (&inode.source, fds.as_deref_mut()) {
                    (Source::Pinned(fd), Some(fds)) => {
                        fds.push(Arc::clone(&lock(fd)));
                        Some(fds.len() - 1)
                    }
                    _ => None,
                };
                InodeSnapshot {
                    id: inode.id,
                    mode: inode.kind.mode_bits(),
                    lookups: inode.lookups.load(Ordering::Relaxed),
                    key: inode.key.snapshot(),
                    fd,
                }
            })
            .collect();
        TableSnapshot {
            root: self.root.key.snapshot(),
            inodes,
            next_spare: maps.next_spare,
        }
    }

    /// Fills a new table (holding only the root) from `snap`: the same node ids, lookup
    /// counts and identities. `fds` are the descriptors the snapshot refers to; each one
    /// used is taken.
    ///
    /// # Errors
    /// [`FsError::Handover`] when the snapshot is of another root or refers to a
    /// descriptor or kind it does not carry.
    pub fn restore(&self, snap: &TableSnapshot, fds: &mut [Option<OwnedFd>]) -> FsResult<()> {
        if self.root.key.snapshot() != snap.root {
            return Err(FsError::Handover(
                "the view serves another backing directory",
            ));
        }
        let mut maps = self.maps.write().unwrap_or_else(|e| e.into_inner());
        for s in &snap.inodes {
            if s.id == ROOT_ID {
                self.root.lookups.store(s.lookups.max(1), Ordering::Relaxed);
                continue;
            }
            let kind =
                Kind::from_mode(s.mode).ok_or(FsError::Handover("an inode of no known kind"))?;
            let key = InodeKey::from_snapshot(&s.key)?;
            let source = match (&key, s.fd) {
                (InodeKey::Handle { .. }, None) if self.shared.mount_fd.is_some() => {
                    Source::Handle(Mutex::new(None))
                }
                (InodeKey::Number { .. }, Some(i)) => Source::Pinned(Mutex::new(Arc::new(
                    fds.get_mut(i)
                        .and_then(Option::take)
                        .ok_or(FsError::Handover("an inode without its descriptor"))?,
                ))),
                _ => {
                    return Err(FsError::Handover(
                        "an inode named in a way this view cannot reach",
                    ));
                }
            };
            let inode = Arc::new(Inode {
                id: s.id,
                kind,
                key: key.clone(),
                source,
                shared: Arc::clone(&self.shared),
                lookups: AtomicU64::new(s.lookups),
                // Restored before any journal: the journal's first write holds it.
                journaled: AtomicBool::new(true),
                data: Mutex::new(Weak::new()),
                opens: Arc::default(),
                registration: Mutex::new(Weak::new()),
                record_seen: RecordMemo::default(),
                synced: SyncedAt::default(),
            });
            maps.by_id.insert(s.id, inode);
            maps.by_key.insert(key, s.id);
        }
        maps.next_spare = maps.next_spare.max(snap.next_spare);
        Ok(())
    }

    /// The inodes with open handles and their current shared descriptors.
    pub fn open_files(&self) -> Vec<(u64, Arc<DataFile>)> {
        let maps = self.maps.read().unwrap_or_else(|e| e.into_inner());
        maps.by_id
            .values()
            .filter_map(|inode| lock(&inode.data).upgrade().map(|d| (inode.id, d)))
            .collect()
    }

    /// How many descriptors the cache holds open now.
    pub fn cached_fds(&self) -> usize {
        self.shared.cached.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(path: &std::path::Path) -> (OwnedFd, Stat) {
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::open(
            path,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let st = file::stat(fd.as_fd()).unwrap();
        (fd, st)
    }

    /// The node ids a journal holds, replayed.
    fn journaled_ids(j: &Journaling) -> Vec<u64> {
        let fd = j.read().fd().try_clone_to_owned().unwrap();
        let replayed = super::super::journal::Replayed::read(&fd).unwrap();
        replayed.inodes.keys().copied().collect()
    }

    /// A table of a temp dir holding empty files `names`, journaling.
    fn journaled_table(names: &[&str]) -> (tempfile::TempDir, InodeTable, Arc<Journaling>) {
        let dir = tempfile::tempdir().unwrap();
        for name in names {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        let (rfd, rst) = open(dir.path());
        let table = InodeTable::new(rfd, &rst, 16);
        let journal = Arc::new(Journaling::new(
            super::super::journal::Journal::create().unwrap(),
        ));
        table.set_journal(Arc::clone(&journal));
        (dir, table, journal)
    }

    /// A node id goes to the journal outside the table's lock; until its maker has
    /// written the line, a lookup that finds the inode writes it, so no answer gives
    /// the kernel an id the journal lacks.
    #[test]
    fn an_inode_found_before_its_maker_journaled_it_is_journaled_by_the_finder() {
        let (dir, table, journal) = journaled_table(&["a", "b"]);
        let lookup = |name: &str| {
            let (fd, st) = open(&dir.path().join(name));
            table.lookup(fd, &st)
        };
        // Made with the journal on: the maker writes the line before it returns.
        let a = lookup("a");
        assert_eq!(journaled_ids(&journal), [a.id]);
        assert_eq!(lookup("a").id, a.id);
        // `b` as its maker leaves it between the table and its write: its line owed.
        let b = lookup("b");
        b.journaled.store(false, Ordering::Release);
        let before = journal.read().size();
        let found = lookup("b");
        assert!(Arc::ptr_eq(&found, &b));
        assert!(
            journal.read().size() > before,
            "the finder wrote the owed line"
        );
        let after = journal.read().size();
        lookup("b");
        assert_eq!(journal.read().size(), after, "written once, not per lookup");
        let mut ids = journaled_ids(&journal);
        ids.sort_unstable();
        let mut want = vec![a.id, b.id];
        want.sort_unstable();
        assert_eq!(ids, want, "the repeated line replays to the same table");
    }

    /// A listing's new node ids go to the journal together when its batch ends, before
    /// its reply; a forget in the batch writes them first, and another thread that
    /// finds one writes its line at once.
    #[test]
    fn a_batch_journals_its_node_ids_together_and_never_after_their_forget() {
        let (dir, table, journal) = journaled_table(&["a", "b", "c", "d"]);
        let lookup = |name: &str| {
            let (fd, st) = open(&dir.path().join(name));
            table.lookup(fd, &st)
        };
        let empty = journal.read().size();
        let (a, b) = {
            let _batch = table.batch_journal();
            let a = lookup("a");
            let b = lookup("b");
            assert_eq!(journal.read().size(), empty, "the lines wait for the batch");
            // Another thread finding `a` now answers with its id: it writes the line.
            std::thread::scope(|s| {
                s.spawn(|| {
                    let (fd, st) = open(&dir.path().join("a"));
                    table.lookup(fd, &st);
                });
            });
            assert!(journal.read().size() > empty, "the finder wrote a's line");
            (a, b)
        };
        let mut ids = journaled_ids(&journal);
        ids.sort_unstable();
        let mut want = vec![a.id, b.id];
        want.sort_unstable();
        assert_eq!(ids, want, "both, once the batch ended");
        // A lookup that fails after making its inode forgets it inside the batch: the
        // line goes first, so the replay does not bring the id back.
        let c = {
            let _batch = table.batch_journal();
            let c = lookup("c");
            table.forget(c.id, 1);
            let d = lookup("d");
            assert_ne!(c.id, d.id);
            c
        };
        let ids = journaled_ids(&journal);
        assert!(
            !ids.contains(&c.id),
            "{} forgotten, yet replayed: {ids:?}",
            c.id
        );
        assert_eq!(ids.len(), 3, "a, b and d: {ids:?}");
        // Outside a batch, a line goes out at once.
        table.forget(a.id, 2);
        let (fd, st) = open(&dir.path().join("a"));
        let again = table.lookup(fd, &st);
        assert!(journaled_ids(&journal).contains(&again.id));
    }

    /// Without handles an inode is its number and its birth time: a file made with the
    /// number of one just removed (an SMB server's) is another inode, with another
    /// node id while the kernel holds the first.
    #[test]
    fn a_reused_inode_number_with_another_birth_time_is_another_inode() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), "").unwrap();
        let (rfd, rst) = open(dir.path());
        let table = InodeTable::new(rfd, &rst, 16);
        let (fd, st) = open(&dir.path().join("a"));
        assert!(
            st.btime.is_some(),
            "the test's file system tells birth times"
        );
        let first = table.lookup_handled(fd, &st, None);
        let (fd, same) = open(&dir.path().join("a"));
        assert!(Arc::ptr_eq(&first, &table.lookup_handled(fd, &same, None)));
        let mut later = same;
        later.btime = Some(Time {
            sec: later.btime.unwrap().sec + 1,
            nsec: 0,
        });
        let (fd, _) = open(&dir.path().join("a"));
        let second = table.lookup_handled(fd, &later, None);
        assert!(!Arc::ptr_eq(&first, &second));
        assert_ne!(first.id, second.id, "the first one's node id is taken");
        // The identity survives a snapshot, and one written before it had a birth
        // time still reads.
        assert_eq!(
            InodeKey::from_snapshot(&second.key.snapshot()).unwrap(),
            second.key
        );
        let old: KeySnapshot = serde_json::from_str(r#"{"Number":{"dev":1,"ino":2}}"#).unwrap();
        assert_eq!(
            InodeKey::from_snapshot(&old).unwrap(),
            InodeKey::Number {
                dev: 1,
                ino: 2,
                born: None
            }
        );
    }

    #[test]
    fn lookups_are_counted_and_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        let (rfd, rst) = open(dir.path());
        let table = InodeTable::new(rfd, &rst, 16);
        let (fd, st) = open(&dir.path().join("a"));
        let a = table.lookup(fd, &st);
        assert_eq!(a.id, st.ino, "the backing inode number is the id");
        let (fd2, st2) = open(&dir.path().join("a"));
        let again = table.lookup(fd2, &st2);
        assert!(Arc::ptr_eq(&a, &again), "one inode per backing inode");
        assert_eq!(table.len(), 2);
        table.forget(a.id, 1);
        assert!(table.get(a.id).is_ok(), "one lookup left");
        table.forget(a.id, 1);
        assert_eq!(table.get(a.id).err(), Some(FsError::UnknownInode(a.id)));
        assert!(table.is_empty());
        table.forget(ROOT_ID, 100);
        assert!(table.get(ROOT_ID).is_ok(), "the root is never forgotten");
    }

    #[test]
    fn a_forget_storm_leaves_no_places_of_forgotten_inodes_in_the_descriptor_queue() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..3000 {
            std::fs::write(dir.path().join(format!("f{i}")), "").unwrap();
        }
        let (rfd, rst) = open(dir.path());
        let table = InodeTable::new(rfd, &rst, 10_000);
        let ids: Vec<u64> = (0..3000)
            .map(|i| {
                let (fd, st) = open(&dir.path().join(format!("f{i}")));
                table.lookup(fd, &st).id
            })
            .collect();
        assert_eq!(lock(&table.shared.queue).len(), 3000);
        for id in ids {
            table.forget(id, 1);
        }
        assert!(table.is_empty());
        // Each place kept its inode's allocation alive (a `Weak`): after the table
        // shrank they are gone, so the heap can be given back.
        let queue = lock(&table.shared.queue);
        assert!(queue.len() < 1024, "{} places left", queue.len());
        assert_eq!(table.shared.cached.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn descriptors_stay_bounded_and_reopen_by_handle() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..50 {
            std::fs::write(dir.path().join(format!("f{i}")), format!("{i}")).unwrap();
        }
        let (rfd, rst) = open(dir.path());
        let table = InodeTable::new(rfd, &rst, 8);
        let mut inodes = Vec::new();
        for i in 0..50 {
            let (fd, st) = open(&dir.path().join(format!("f{i}")));
            inodes.push(table.lookup(fd, &st));
        }
        assert_eq!(table.len(), 51);
        assert!(
            table.cached_fds() <= 8,
            "{} descriptors cached",
            table.cached_fds()
        );
        // Evicted inodes reopen from their handle, as themselves, after a rename too.
        std::fs::rename(dir.path().join("f0"), dir.path().join("moved")).unwrap();
        let fd = inodes[0].fd().unwrap();
        assert_eq!(file::stat(fd.as_fd()).unwrap().ino, inodes[0].id);
        assert!(table.cached_fds() <= 8);
        // A deleted, unreferenced inode is stale, not something else.
        drop(fd);
        std::fs::remove_file(dir.path().join("f1")).unwrap();
        inodes[1].uncache();
        assert!(inodes[1].fd().is_err());
    }

    /// Without handles (the CIFS client has none), a number the server gave again to
    /// an entry of another kind is a new inode: git's `refs/heads` on a Samba share
    /// was the lock file deleted before it, and answered `ENOTDIR`.
    #[test]
    fn a_reused_number_without_handles_is_a_new_inode_of_its_kind() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("old"), "old").unwrap();
        std::fs::create_dir(dir.path().join("new")).unwrap();
        let (rfd, rst) = open(dir.path());
        let table = InodeTable::new(rfd, &rst, 16);
        let (fd, st) = open(&dir.path().join("old"));
        let old = table.lookup_handled(fd, &st, None);
        let (fd, mut st_new) = open(&dir.path().join("new"));
        st_new.ino = st.ino;
        let new = table.lookup_handled(fd, &st_new, None);
        assert!(!Arc::ptr_eq(&old, &new), "a different inode");
        assert_eq!(new.kind, Kind::Directory);
        assert_ne!(new.id, old.id, "the old id is still the kernel's");
        // The number now names the new one; the old one goes with its last lookup.
        let (fd, _) = open(&dir.path().join("new"));
        assert!(Arc::ptr_eq(&table.lookup_handled(fd, &st_new, None), &new));
        table.forget(old.id, 1);
        let (fd, _) = open(&dir.path().join("new"));
        assert!(Arc::ptr_eq(&table.lookup_handled(fd, &st_new, None), &new));
    }

    /// Without handles, an inode reopens by the name of its descriptor on a network
    /// file system: a lookup by another name (a hard link) gives the inode that
    /// name's descriptor, so an unlink of the first name (git's temporary object) does
    /// not leave it with a dead one.
    #[test]
    fn a_pinned_inode_keeps_the_descriptor_of_its_latest_lookup() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tmp"), "obj").unwrap();
        let (rfd, rst) = open(dir.path());
        let table = InodeTable::new(rfd, &rst, 16);
        let (fd, st) = open(&dir.path().join("tmp"));
        let inode = table.lookup_handled(fd, &st, None);
        std::fs::hard_link(dir.path().join("tmp"), dir.path().join("final")).unwrap();
        let (fd, st2) = open(&dir.path().join("final"));
        assert_eq!(st2.ino, st.ino);
        assert!(Arc::ptr_eq(&table.lookup_handled(fd, &st2, None), &inode));
        std::fs::remove_file(dir.path().join("tmp")).unwrap();
        let fd = inode.fd().unwrap();
        let named = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        assert_eq!(named, dir.path().join("final"));
        // The root keeps its own.
        assert_eq!(
            std::fs::read_link(format!(
                "/proc/self/fd/{}",
                table.root().fd().unwrap().as_raw_fd()
            ))
            .unwrap(),
            dir.path()
        );
    }

    #[test]
    fn a_reused_inode_number_is_a_new_inode() {
        // The file system reuses a deleted file's number for a new file; this table must
        // not attach the new file to the old entry (its handle, its kind).
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("old"), "old").unwrap();
        std::fs::create_dir(dir.path().join("new")).unwrap();
        let (rfd, rst) = open(dir.path());
        let table = InodeTable::new(rfd, &rst, 16);
        let (fd, st) = open(&dir.path().join("old"));
        let old = table.lookup(fd, &st);
        // The new directory, as if it had the old file's number.
        let (fd, mut st_new) = open(&dir.path().join("new"));
        let real_new_ino = st_new.ino;
        st_new.ino = st.ino;
        let new = table.lookup(fd, &st_new);
        assert!(!Arc::ptr_eq(&old, &new), "a different inode");
        assert_eq!(new.kind, Kind::Directory);
        assert_ne!(new.id, old.id, "the old id is still the kernel's");
        new.uncache();
        let fd = new.fd().unwrap();
        assert_eq!(file::stat(fd.as_fd()).unwrap().ino, real_new_ino);
        assert_eq!(table.len(), 3);
    }

    #[test]
    fn an_open_file_is_never_stale() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), "x").unwrap();
        let (rfd, rst) = open(dir.path());
        let table = InodeTable::new(rfd, &rst, 16);
        let (fd, st) = open(&dir.path().join("f"));
        let f = table.lookup(fd, &st);
        let data = Arc::new(DataFile::new(
            std::fs::File::open(dir.path().join("f")).unwrap().into(),
            false,
            &Default::default(),
            &LiveFiles::default(),
            &f.opens,
        ));
        *lock(&f.data) = Arc::downgrade(&data);
        std::fs::remove_file(dir.path().join("f")).unwrap();
        f.uncache();
        let fd = f
            .fd()
            .expect("the open descriptor serves a deleted, open file");
        assert_eq!(file::stat(fd.as_fd()).unwrap().nlink, 0);
        drop((fd, data));
        assert!(f.fd().is_err(), "deleted and closed: stale");
    }

    #[test]
    fn colliding_numbers_get_spare_ids() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        let (rfd, rst) = open(dir.path());
        let table = InodeTable::new(rfd, &rst, 16);
        let (fd, mut st) = open(&dir.path().join("a"));
        st.ino = 1;
        let a = table.lookup(fd, &st);
        assert!(a.id > SPARE_BASE);
        let (fd, mut st) = open(&dir.path().join("a"));
        st.dev += 1; // same number, another file system
        let (fd0, st0) = open(&dir.path().join("a"));
        let first = table.lookup(fd0, &st0);
        st.ino = st0.ino;
        let second = table.lookup(fd, &st);
        assert_ne!(first.id, second.id);
    }
}
