//! Walking ahead: while a walk goes on, the backing file system's caches are warmed
//! for the directories it will list next.
//!
//! A cold walk through a view alternates: the daemon looks up every entry of a
//! directory while the walker waits for the listing, then the walker works through
//! it (the kernel makes a dentry and an inode of each entry, `find` prints) while the
//! daemon waits for the next directory. A third of both cores was idle in a cold
//! `find` of 100,000 files, and a lookup that meets a cold inode costs twice a warm
//! one. A walk (`find`, `du`, `ls -R`, `rsync`) goes depth first, through a
//! directory's subdirectories in the order they were listed; so when the view lists a
//! directory with attributes (a walk is on, `listing.rs`), it remembers the
//! subdirectories it listed, and when the walker starts listing one of them, one
//! thread lists the next [`AHEAD`] and `statx`es their entries, for the side effect
//! only: the backing file system reads their inodes into its caches, and the
//! lookups of the listing to come find them there.
//!
//! The entries are also opened ahead (`O_PATH`, beneath the view's root, as a lookup
//! opens them) with their file handles, up to [`MAX_OPENED`] descriptors: the open
//! and the handle are half of a warm lookup's time, and here they run on the idle
//! core. A lookup takes such a descriptor only while the name still leads to the
//! inode it pins ([`WalkAhead::claim`]); otherwise it opens the name itself, as
//! before. So the view's answers are still made when asked, from the inode the name
//! leads to then: warming changes no result, only its time. Warming opens only
//! beneath the view's root, never follows a symlink or triggers an automount, lists
//! only directories; it is bounded by [`MAX_ENTRIES`] per directory and by the plans
//! kept, and it stops, closing what it opened, when no walk starts another directory
//! for `IDLE`.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::sys::creds::ThreadIds;
use crate::sys::dir;
use crate::sys::file::{self, Access, Kind, Stat};
use crate::sys::handle::{self, FileHandle};

use super::lock;

/// Directories warmed ahead of the one the walker starts listing.
pub const AHEAD: usize = 2;

/// Entries of one directory warmed at most.
pub const MAX_ENTRIES: usize = 16_384;

/// Subdirectories remembered of one listed directory at most.
pub const MAX_PLANNED: usize = 4096;

/// Entries held open ahead of the walker, over every warmed directory, at most (and
/// no more than the view gives it of its open-file limit).
pub const MAX_OPENED: usize = 4096;

/// Listed directories whose subdirectories are remembered; the oldest go first.
const MAX_PLANS: usize = 16;

/// Entries warmed between two looks at whether the walker reached the directory.
const OVERTAKEN_EVERY: usize = 64;

/// How long the warming thread waits for work before it ends.
const IDLE: Duration = Duration::from_secs(2);

/// Warmed directories whose own descriptor is kept for the walker's open of it, at
/// most: those warmed ahead of the walker, and one more.
const MAX_HELD_DIRS: usize = AHEAD + 1;

/// The subdirectories of one listed directory, in listing order.
struct Plan {
    /// The listed directory (an `O_PATH` descriptor), to open its subdirectories
    /// beneath.
    parent: Arc<OwnedFd>,
    /// Each subdirectory's node id and name.
    subdirs: Vec<(u64, Vec<u8>)>,
    /// The first subdirectory not queued yet.
    next: usize,
    /// One past the place of the subdirectory the walker started last (0: none).
    walker: Arc<AtomicUsize>,
    /// The caller whose listing made the plan, where the view acts as its callers:
    /// its subdirectories are warmed as that caller.
    ids: Option<Arc<ThreadIds>>,
}

/// One directory to warm: its place among its plan's, whose walker it must stay
/// ahead of.
struct Job {
    parent: Arc<OwnedFd>,
    /// The directory's node id and name.
    dir: u64,
    name: Vec<u8>,
    place: usize,
    walker: Arc<AtomicUsize>,
    /// Who it is warmed as ([`Plan::ids`]; `None`: the view).
    ids: Option<Arc<ThreadIds>>,
}

impl Job {
    /// Whether the walker reached this directory: warming it is no use any more (the
    /// listing looks its entries up itself), and whatever is queued behind it is
    /// closer to the walker's next.
    fn overtaken(&self) -> bool {
        self.walker.load(Ordering::Relaxed) > self.place
    }
}

#[derive(Default)]
struct State {
    /// Plans by a sequence number, oldest first.
    plans: VecDeque<(u64, Plan)>,
    next_seq: u64,
    /// Where each planned subdirectory (its node id) is: its plan and place.
    index: HashMap<u64, (u64, usize)>,
    /// Directories to warm: the parent and the name.
    queue: VecDeque<Job>,
    /// Whether the warming thread runs.
    running: bool,
    stop: bool,
}

/// A warmed directory's own descriptor, kept for the walker's open of it
/// ([`WalkAhead::claim_dir`]).
struct HeldDir {
    /// The directory's node id, plan and place.
    dir: u64,
    plan: Arc<AtomicUsize>,
    place: usize,
    fd: OwnedFd,
    /// The inode it pins.
    dev: u64,
    ino: u64,
    /// When it was opened (from just before its open).
    opened: Instant,
}

/// An entry of a warmed directory, opened ahead of the walker's lookup of it.
pub struct Opened {
    /// `O_PATH`, opened beneath the directory as a lookup opens a name.
    pub fd: OwnedFd,
    /// The inode it pins.
    dev: u64,
    ino: u64,
    /// Its file handle (`None`: the file system has none).
    pub handle: Option<FileHandle>,
}

/// The entries opened ahead, by directory.
struct Stash {
    /// Each warmed directory's node id, plan and place, and its entries by name;
    /// the oldest first.
    dirs: VecDeque<StashedDir>,
    /// Descriptors held at most.
    max: usize,
}

struct StashedDir {
    dir: u64,
    plan: Arc<AtomicUsize>,
    place: usize,
    entries: HashMap<Vec<u8>, Opened>,
}

impl Stash {
    fn new(max: usize) -> Stash {
        Stash {
            dirs: VecDeque::new(),
            max,
        }
    }

    /// Descriptors held, over every directory (a few directories at a time).
    fn held(&self) -> usize {
        self.dirs.iter().map(|d| d.entries.len()).sum()
    }

    /// Closes everything held.
    fn clear(&mut self) {
        self.dirs.clear();
    }

    /// Room for one more descriptor for `dir`: the oldest other directories go first.
    /// `false` when `dir`'s own fill the stash.
    fn make_room(&mut self, dir: u64) -> bool {
        while self.held() >= self.max {
            let Some(i) = self.dirs.iter().position(|d| d.dir != dir) else {
                return false;
            };
            self.dirs.remove(i);
        }
        true
    }
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    /// Directories listed and warmed so far.
    warmed: AtomicU64,
    /// Entries opened ahead, until a lookup claims them.
    opened: Mutex<Stash>,
    /// Lookups answered with a descriptor opened ahead.
    claimed: AtomicU64,
    /// The warmed directories' own descriptors, the oldest first.
    held_dirs: Mutex<VecDeque<HeldDir>>,
    /// Walkers' opens of a directory answered with the warming's descriptor.
    dirs_claimed: AtomicU64,
    /// Whether the log has said that a walk's caller could not be acted as.
    warned_acting: AtomicBool,
    /// How long a warmed directory's descriptor may serve the walker's open of it.
    fresh: Duration,
    /// The view root's mount: a name with another mount on it is not opened.
    root_mnt: Option<u64>,
}

/// The log line of [`WalkAhead::cannot_act`], once per view (`warned`).
fn cannot_act(warned: &AtomicBool, e: crate::sys::Errno) {
    if !warned.swap(true, Ordering::Relaxed) {
        tracing::warn!(error = %e, "the walk-ahead cannot act as a walk's caller, so that walk goes on unwarmed (slower on a network share); the daemon needs CAP_SETUID and CAP_SETGID (the node plugin runs privileged, deploy/node.yaml)");
    }
}

/// The walk-ahead of one view.
pub struct WalkAhead {
    shared: Arc<Shared>,
}

impl WalkAhead {
    /// The walk-ahead of a view whose root is on the mount `root_mnt`, holding at
    /// most `max_opened` entries open ahead of a walk (0: warming only), and a warmed
    /// directory's own descriptor for the walker's open of it for `fresh` (the view's
    /// entry timeout: zero keeps none).
    pub fn new(root_mnt: Option<u64>, max_opened: usize, fresh: Duration) -> WalkAhead {
        WalkAhead {
            shared: Arc::new(Shared {
                state: Mutex::default(),
                wake: Condvar::new(),
                warmed: AtomicU64::new(0),
                opened: Mutex::new(Stash::new(max_opened)),
                claimed: AtomicU64::new(0),
                held_dirs: Mutex::default(),
                dirs_claimed: AtomicU64::new(0),
                warned_acting: AtomicBool::new(false),
                fresh,
                root_mnt,
            }),
        }
    }

    /// A directory (`parent`) was listed whole: its subdirectories, in listing order,
    /// each with its node id. When the listing carried attributes (`walking`), the
    /// first [`AHEAD`] are warmed now: the walker lists the first next. `ids`: the
    /// listing's caller, where the view acts as its callers, as whom they are warmed,
    /// so that the share's answers the warming gets (the NFS client's cached `ACCESS`
    /// for that caller, renewed by one request a directory, as the raw mount's walk
    /// does) are those the walker's lookups need, not another set for the view's own
    /// ids; `None`: as the view.
    pub fn planned(
        &self,
        parent: Arc<OwnedFd>,
        subdirs: Vec<(u64, Vec<u8>)>,
        walking: bool,
        ids: Option<ThreadIds>,
    ) {
        if subdirs.is_empty() {
            return;
        }
        let mut s = lock(&self.shared.state);
        if s.plans.len() == MAX_PLANS {
            if let Some((old, _)) = s.plans.pop_front() {
                s.index.retain(|_, (seq, _)| *seq != old);
            }
        }
        let seq = s.next_seq;
        s.next_seq += 1;
        let mut kept = Vec::with_capacity(subdirs.len().min(MAX_PLANNED));
        for (i, (id, name)) in subdirs.into_iter().take(MAX_PLANNED).enumerate() {
            s.index.insert(id, (seq, i));
            kept.push((id, name));
        }
        s.plans.push_back((
            seq,
            Plan {
                parent,
                subdirs: kept,
                next: 0,
                walker: Arc::default(),
                ids: ids.map(Arc::new),
            },
        ));
        if walking {
            self.warm_through(&mut s, seq, AHEAD - 1);
        }
    }

    /// Directories warmed so far (the view's metrics).
    pub fn warmed(&self) -> u64 {
        self.shared.warmed.load(Ordering::Relaxed)
    }

    /// Lookups answered with a descriptor opened ahead so far (the view's metrics).
    pub fn claimed(&self) -> u64 {
        self.shared.claimed.load(Ordering::Relaxed)
    }

    /// The walker starts listing `dir`: the [`AHEAD`] planned after it are warmed, and
    /// what was opened ahead in the directories of its plan it went past is closed.
    pub fn starts(&self, dir: u64) {
        let mut s = lock(&self.shared.state);
        if let Some(&(seq, i)) = s.index.get(&dir) {
            if let Some((_, plan)) = s.plans.iter().find(|(q, _)| *q == seq) {
                plan.walker.fetch_max(i + 1, Ordering::Relaxed);
                let walker = Arc::clone(&plan.walker);
                lock(&self.shared.opened)
                    .dirs
                    .retain(|d| !Arc::ptr_eq(&d.plan, &walker) || d.place >= i);
                lock(&self.shared.held_dirs)
                    .retain(|d| !Arc::ptr_eq(&d.plan, &walker) || d.place >= i);
            }
            self.warm_through(&mut s, seq, i + AHEAD);
        }
    }

    /// The descriptor opened ahead for `name` in the directory `dir` (a node id, whose
    /// backing descriptor is `parent`), with the inode's attributes as of now, if the
    /// name still leads to the inode it pins; `None` otherwise, and the lookup opens
    /// the name itself.
    ///
    /// Why the check is sound: a held descriptor pins its inode, so while it is held
    /// no other inode of its file system has its device and number; a `statx` of the
    /// name now that meets that device and number, on the view root's mount, met that
    /// very inode, as an open of the name now would have (and the attributes are
    /// read there). A name renamed over, unlinked, or with a mount put on it since
    /// the entry was opened fails the check: the `statx` walk crosses a mount on its
    /// last name into the mounted root, another mount id (fs/namei.c step_into →
    /// handle_mounts), where `open_child` refuses to cross it. The descriptor is never used to reach
    /// anything the name does not lead to.
    pub fn claim(&self, dir: u64, parent: BorrowedFd<'_>, name: &[u8]) -> Option<(Opened, Stat)> {
        let opened = {
            let mut stash = lock(&self.shared.opened);
            let at = stash.dirs.iter().position(|d| d.dir == dir)?;
            let d = &mut stash.dirs[at];
            let opened = d.entries.remove(name)?;
            if d.entries.is_empty() {
                stash.dirs.remove(at);
            }
            opened
        };
        let st = file::stat_child(parent, OsStr::from_bytes(name)).ok()?;
        let same_mount = match (self.shared.root_mnt, st.mnt_id) {
            (Some(root), Some(here)) => root == here,
            _ => true,
        };
        if (st.dev, st.ino) != (opened.dev, opened.ino) || !same_mount {
            return None;
        }
        self.shared.claimed.fetch_add(1, Ordering::Relaxed);
        Some((opened, st))
    }

    /// The descriptor the warming opened the directory `dir` (a node id, whose
    /// backing descriptor is `at`) with, rewound, for the walker's open of it: `None`
    /// unless it was warmed less than `fresh` ago and is that very directory, and then
    /// the walker's open opens it itself.
    ///
    /// What it spares: each open of a directory on a network share is a request, the
    /// NFS client's check that it has not changed (close-to-open: fs/nfs/dir.c
    /// `nfs_lookup_verify_inode`, a `GETATTR`), the SMB client's `CREATE`; without it a
    /// walk through a view opened each directory twice where the raw mount's walk
    /// opens it once. The listing read through it then is as of the warming's open,
    /// less than `fresh` (the entry timeout, how old a name the view shows may be)
    /// before the walker's.
    ///
    /// Why the check is sound: the held descriptor pins its inode, so no other inode
    /// of its file system has its device and number while it is held; those, never
    /// changed for an inode, are read from the file system's cache without a request.
    /// The warming's thread read them when it opened the directory. Whether the
    /// walker may read the directory is `may_read`'s to say (the kernel
    /// checked the view's attributes; where the view acts as its callers, the share
    /// answers for the caller: `ViewFs::opendir`).
    pub fn claim_dir(
        &self,
        dir: u64,
        at: BorrowedFd<'_>,
        may_read: impl FnOnce() -> bool,
    ) -> Option<OwnedFd> {
        let held = {
            let mut held = lock(&self.shared.held_dirs);
            let i = held.iter().position(|d| d.dir == dir)?;
            held.remove(i)?
        };
        if held.opened.elapsed() >= self.shared.fresh {
            return None;
        }
        let st = file::stat_cached(at).ok()?;
        if (st.dev, st.ino) != (held.dev, held.ino) || !may_read() {
            return None;
        }
        dir::seek(held.fd.as_fd(), 0).ok()?;
        self.shared.dirs_claimed.fetch_add(1, Ordering::Relaxed);
        Some(held.fd)
    }

    /// How long ago the warming opened the directory `dir` (a node id) that pins the
    /// inode `dev`/`ino`, if it holds it for the walker's open: the file system's
    /// attributes of it are at least that new (each open of a directory on NFS asks the
    /// server for them: close-to-open, fs/nfs/dir.c `nfs_lookup_verify_inode`).
    pub fn warmed_age(&self, dir: u64, dev: u64, ino: u64) -> Option<std::time::Duration> {
        lock(&self.shared.held_dirs)
            .iter()
            .find(|d| d.dir == dir && (d.dev, d.ino) == (dev, ino))
            .map(|d| d.opened.elapsed())
    }

    /// Says once that a walk's caller could not be acted as (`e`), so that the
    /// directories its listings plan are not warmed: the walk goes on unwarmed.
    pub fn cannot_act(&self, e: crate::sys::Errno) {
        cannot_act(&self.shared.warned_acting, e);
    }

    /// Walkers' opens of a directory answered with the warming's descriptor so far.
    #[cfg(test)]
    pub fn dirs_claimed(&self) -> u64 {
        self.shared.dirs_claimed.load(Ordering::Relaxed)
    }

    /// Whether the warming thread runs.
    #[cfg(test)]
    pub fn running(&self) -> bool {
        lock(&self.shared.state).running
    }

    /// The node ids of the warmed directories whose descriptor is kept.
    #[cfg(test)]
    pub fn held_dirs(&self) -> Vec<u64> {
        lock(&self.shared.held_dirs).iter().map(|d| d.dir).collect()
    }

    /// Queues the subdirectories of plan `seq` not warmed yet, up to place `last`.
    fn warm_through(&self, s: &mut State, seq: u64, last: usize) {
        let Some((_, plan)) = s.plans.iter_mut().find(|(q, _)| *q == seq) else {
            return;
        };
        let end = (last + 1).min(plan.subdirs.len());
        let mut work = Vec::new();
        plan.next = plan.next.max(plan.walker.load(Ordering::Relaxed));
        while plan.next < end {
            let (dir, name) = &plan.subdirs[plan.next];
            work.push(Job {
                parent: Arc::clone(&plan.parent),
                dir: *dir,
                name: name.clone(),
                place: plan.next,
                walker: Arc::clone(&plan.walker),
                ids: plan.ids.clone(),
            });
            plan.next += 1;
        }
        if work.is_empty() {
            return;
        }
        s.queue.extend(work);
        if s.running {
            self.shared.wake.notify_one();
            return;
        }
        let shared = Arc::clone(&self.shared);
        let started = std::thread::Builder::new()
            .name("walk-ahead".into())
            .spawn(move || {
                // Started by a request: where the view acts as its callers, it was
                // acting as that request's, and it serves every walk from now on.
                if let Err(e) = crate::sys::creds::as_the_process() {
                    tracing::warn!(error = %e, "the walk-ahead thread cannot act as the view; this walk goes on unwarmed");
                    // Taken once the starter let go of it: the next walk starts anew.
                    let mut s = lock(&shared.state);
                    s.running = false;
                    s.queue.clear();
                    return;
                }
                shared.run()
            });
        // No thread to be had (a pids limit): the walk goes on unwarmed.
        if started.is_ok() {
            s.running = true;
        } else {
            s.queue.clear();
        }
    }
}

impl Drop for WalkAhead {
    fn drop(&mut self) {
        let mut s = lock(&self.shared.state);
        s.stop = true;
        s.queue.clear();
        self.shared.wake.notify_all();
        drop(s);
        lock(&self.shared.opened).clear();
        lock(&self.shared.held_dirs).clear();
    }
}

impl Shared {
    fn run(&self) {
        loop {
            let job = {
                let mut s = lock(&self.state);
                loop {
                    if s.stop {
                        s.running = false;
                        self.close_all();
                        return;
                    }
                    if let Some(job) = s.queue.pop_front() {
                        if job.overtaken() {
                            continue;
                        }
                        break job;
                    }
                    let (next, timeout) = self
                        .wake
                        .wait_timeout(s, IDLE)
                        .unwrap_or_else(|e| e.into_inner());
                    s = next;
                    if timeout.timed_out() && s.queue.is_empty() {
                        s.running = false;
                        // No walk for a while: what it did not claim is closed.
                        self.close_all();
                        return;
                    }
                }
            };
            // As the caller whose listing planned it, wholly; between jobs the thread
            // is the view. A caller it cannot act as is not warmed for.
            let acting = match job.ids.as_ref().map(|ids| ids.act()).transpose() {
                Ok(acting) => acting,
                Err(e) => {
                    cannot_act(&self.warned_acting, e);
                    continue;
                }
            };
            if self.warm(&job).is_some() {
                self.warmed.fetch_add(1, Ordering::Relaxed);
            }
            drop(acting);
        }
    }

    /// Closes everything opened ahead.
    fn close_all(&self) {
        lock(&self.opened).clear();
        lock(&self.held_dirs).clear();
    }

    /// Lists the job's directory and opens its entries (or, with [`MAX_OPENED`] held,
    /// `statx`es them), until the walker reaches it: how many, or `None` when it was
    /// not listed (gone, not a directory, a symlink, a mount point).
    fn warm(&self, job: &Job) -> Option<usize> {
        let name = OsStr::from_bytes(&job.name);
        let at = file::open_child(job.parent.as_fd(), name, self.root_mnt).ok()?;
        let opened_at = Instant::now();
        let d = file::reopen(at.as_fd(), Kind::Directory, Access::Directory).ok()?;
        // Never changed for the inode: read from the cache, no request.
        let pins = file::stat_cached(d.as_fd()).ok().map(|st| (st.dev, st.ino));
        // Not the walker's read: the directory's access time is left alone whatever
        // the view's atime rule (the daemon owns every file, as O_NOATIME asks).
        let _ = file::set_noatime(d.as_fd());
        let mut buf = vec![std::mem::MaybeUninit::uninit(); 32 * 1024];
        let mut warmed = 0;
        // Opened entries go to the stash a few at a time, so that a walker that comes
        // close finds the first ones there.
        let mut opened = Vec::with_capacity(OVERTAKEN_EVERY);
        let mut room = lock(&self.opened).max > 0;
        'batches: while warmed < MAX_ENTRIES && !lock(&self.state).stop {
            let batch = match dir::read_batch(d.as_fd(), &mut buf) {
                Ok(b) if !b.is_empty() => b,
                _ => break,
            };
            for e in batch {
                if e.name != b"." && e.name != b".." {
                    if warmed % OVERTAKEN_EVERY == 0 {
                        room = room && self.stash(job, &mut opened);
                        if job.overtaken() {
                            break 'batches;
                        }
                    }
                    let name = OsStr::from_bytes(&e.name);
                    if room {
                        if let Some(o) = self.open(at.as_fd(), name) {
                            opened.push((e.name, o));
                        }
                    } else {
                        file::warm_child(d.as_fd(), name);
                    }
                    warmed += 1;
                }
            }
        }
        // The walker may be in this directory already, behind what was opened.
        self.stash(job, &mut opened);
        if let Some((dev, ino)) = pins {
            self.hold(job, d, dev, ino, opened_at);
        }
        Some(warmed)
    }

    /// Keeps a warmed directory's own descriptor for the walker's open of it, unless
    /// the walker has opened it already (it started listing it) or none is kept.
    fn hold(&self, job: &Job, fd: OwnedFd, dev: u64, ino: u64, opened: Instant) {
        if job.overtaken() || self.fresh.is_zero() {
            return;
        }
        let mut held = lock(&self.held_dirs);
        held.retain(|d| d.dir != job.dir);
        if held.len() == MAX_HELD_DIRS {
            held.pop_front();
        }
        held.push_back(HeldDir {
            dir: job.dir,
            plan: Arc::clone(&job.walker),
            place: job.place,
            fd,
            dev,
            ino,
            opened,
        });
    }

    /// Opens `name` in `dir` as a lookup does and takes its handle; `None` for what a
    /// lookup would not reach (a mount point) or any error, which the lookup meets
    /// itself.
    fn open(&self, dir: BorrowedFd<'_>, name: &OsStr) -> Option<Opened> {
        let fd = file::open_child(dir, name, self.root_mnt).ok()?;
        let st = file::stat(fd.as_fd()).ok()?;
        let handle = handle::of(fd.as_fd()).ok();
        Some(Opened {
            fd,
            dev: st.dev,
            ino: st.ino,
            handle,
        })
    }

    /// Moves what `job` opened into the stash, room made; `false` once the job's
    /// directory fills it (what did not fit is closed).
    fn stash(&self, job: &Job, opened: &mut Vec<(Vec<u8>, Opened)>) -> bool {
        if job.walker.load(Ordering::Relaxed) > job.place + 1 {
            // The walker started a later directory: it is done with this one.
            opened.clear();
            return false;
        }
        if opened.is_empty() {
            return true;
        }
        let mut stash = lock(&self.opened);
        for (name, o) in opened.drain(..) {
            // Never the job's own directory goes to make room.
            if !stash.make_room(job.dir) {
                return false;
            }
            let at = match stash.dirs.iter().position(|d| d.dir == job.dir) {
                Some(at) => at,
                None => {
                    stash.dirs.push_back(StashedDir {
                        dir: job.dir,
                        plan: Arc::clone(&job.walker),
                        place: job.place,
                        entries: HashMap::new(),
                    });
                    stash.dirs.len() - 1
                }
            };
            stash.dirs[at].entries.insert(name, o);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_fd(path: &std::path::Path) -> Arc<OwnedFd> {
        Arc::new(file::open_root(path).unwrap())
    }

    #[test]
    fn the_next_subdirectories_are_queued_as_the_walker_reaches_each() {
        let tmp = tempfile::tempdir().unwrap();
        let w = WalkAhead::new(None, MAX_OPENED, FRESH);
        let parent = dir_fd(tmp.path());
        let subdirs = (0..6u64)
            .map(|i| (100 + i, format!("d{i}").into_bytes()))
            .collect();
        // Stop the thread from taking the work, to see what is queued.
        lock(&w.shared.state).running = true;
        w.planned(
            Arc::clone(&parent),
            vec![(7, b"names".to_vec())],
            false,
            None,
        );
        assert!(
            lock(&w.shared.state).queue.is_empty(),
            "a listing of names warms nothing"
        );
        w.planned(parent, subdirs, true, None);
        let queued = |w: &WalkAhead| -> Vec<Vec<u8>> {
            lock(&w.shared.state)
                .queue
                .drain(..)
                .map(|j| j.name)
                .collect()
        };
        assert_eq!(queued(&w), [b"d0".to_vec(), b"d1".to_vec()]);
        w.starts(100);
        assert_eq!(queued(&w), [b"d2".to_vec()]);
        w.starts(100);
        assert!(queued(&w).is_empty(), "each is warmed once");
        // The walker went past d3 (a directory of the plan whose listing the view
        // did not see): d3 is not warmed, d4 and d5 are.
        w.starts(103);
        assert_eq!(queued(&w), [b"d4".to_vec(), b"d5".to_vec()]);
        w.starts(105);
        w.starts(999);
        assert!(
            queued(&w).is_empty(),
            "past the end, and an unplanned directory"
        );
    }

    #[test]
    fn plans_are_bounded() {
        let tmp = tempfile::tempdir().unwrap();
        let w = WalkAhead::new(None, MAX_OPENED, FRESH);
        lock(&w.shared.state).running = true;
        for p in 0..(MAX_PLANS as u64 * 2) {
            let subdirs = (0..10u64).map(|i| (p * 100 + i, b"x".to_vec())).collect();
            w.planned(dir_fd(tmp.path()), subdirs, true, None);
        }
        let s = lock(&w.shared.state);
        assert_eq!(s.plans.len(), MAX_PLANS);
        assert_eq!(s.index.len(), MAX_PLANS * 10);
    }

    #[test]
    fn warming_lists_only_a_subdirectory_beneath_and_its_thread_ends_when_idle() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("d")).unwrap();
        for i in 0..50 {
            std::fs::write(tmp.path().join("d").join(format!("f{i}")), "").unwrap();
        }
        std::os::unix::fs::symlink("/", tmp.path().join("up")).unwrap();
        let w = WalkAhead::new(None, MAX_OPENED, FRESH);
        let parent = dir_fd(tmp.path());
        // A directory, a symlink out, a missing name, the parent: only the first is
        // listed.
        let job = |name: &[u8]| Job {
            parent: Arc::clone(&parent),
            dir: 1,
            name: name.to_vec(),
            place: 0,
            walker: Arc::default(),
            ids: None,
        };
        assert_eq!(w.shared.warm(&job(b"d")), Some(50));
        assert_eq!(w.shared.warm(&job(b"up")), None);
        assert_eq!(w.shared.warm(&job(b"gone")), None);
        assert_eq!(w.shared.warm(&job(b"..")), None);
        // Overtaken by the walker: nothing is warmed.
        let overtaken = job(b"d");
        overtaken.walker.store(1, Ordering::Relaxed);
        assert_eq!(w.shared.warm(&overtaken), Some(0));
        // And through the thread, which ends once idle.
        w.planned(
            parent,
            vec![(1, b"d".to_vec()), (2, b"up".to_vec())],
            true,
            None,
        );
        let deadline = std::time::Instant::now() + IDLE * 3;
        while lock(&w.shared.state).running {
            assert!(
                std::time::Instant::now() < deadline,
                "the thread never ended"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(lock(&w.shared.state).queue.is_empty());
        assert_eq!(w.warmed(), 1, "the directory, not the symlink");
    }

    /// The node id a job's directory is stashed under in these tests.
    const DIR: u64 = 42;

    /// How long a warmed directory's descriptor serves in these tests.
    const FRESH: Duration = Duration::from_secs(60);

    /// The names a directory stream gives from where it is.
    fn names(fd: BorrowedFd<'_>) -> Vec<Vec<u8>> {
        let mut buf = vec![std::mem::MaybeUninit::uninit(); 32 * 1024];
        let mut names = Vec::new();
        while let Ok(batch) = dir::read_batch(fd, &mut buf) {
            if batch.is_empty() {
                break;
            }
            names.extend(batch.into_iter().map(|e| e.name));
        }
        names.sort();
        names
    }

    #[test]
    fn a_warmed_directory_serves_the_walkers_open_of_it_once_while_fresh() {
        let tmp = tempfile::tempdir().unwrap();
        for d in ["d", "e"] {
            std::fs::create_dir(tmp.path().join(d)).unwrap();
        }
        for i in 0..5 {
            std::fs::write(tmp.path().join("d").join(format!("f{i}")), "").unwrap();
        }
        let parent = dir_fd(tmp.path());
        let at = |name: &str| file::open_child(parent.as_fd(), OsStr::new(name), None).unwrap();
        let (d, e) = (at("d"), at("e"));
        let w = WalkAhead::new(None, MAX_OPENED, FRESH);
        assert_eq!(w.shared.warm(&job_for(&parent, b"d")), Some(5));
        // Another directory under the node id (the id now names another inode): not
        // taken, and the descriptor is closed.
        assert!(w.claim_dir(DIR, e.as_fd(), || true).is_none());
        assert!(w.claim_dir(DIR, d.as_fd(), || true).is_none(), "closed");
        w.shared.warm(&job_for(&parent, b"d"));
        assert!(
            w.claim_dir(DIR + 1, d.as_fd(), || true).is_none(),
            "another node id"
        );
        // The directory, rewound: its whole listing, once.
        let fd = w.claim_dir(DIR, d.as_fd(), || true).expect("d was warmed");
        let mut want: Vec<Vec<u8>> = [".", "..", "f0", "f1", "f2", "f3", "f4"]
            .iter()
            .map(|n| n.as_bytes().to_vec())
            .collect();
        want.sort();
        assert_eq!(names(fd.as_fd()), want);
        assert!(
            w.claim_dir(DIR, d.as_fd(), || true).is_none(),
            "claimed once"
        );
        // Older than `fresh`: the walker opens the directory itself.
        let brief = WalkAhead::new(None, MAX_OPENED, Duration::from_millis(50));
        brief.shared.warm(&job_for(&parent, b"d"));
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            brief.claim_dir(DIR, d.as_fd(), || true).is_none(),
            "too old"
        );
        // An entry timeout of zero keeps none.
        let none = WalkAhead::new(None, MAX_OPENED, Duration::ZERO);
        none.shared.warm(&job_for(&parent, b"d"));
        assert!(lock(&none.shared.held_dirs).is_empty());
        // A directory the walker started meanwhile (it opened it): none kept.
        let started = job_for(&parent, b"d");
        started.walker.store(1, Ordering::Relaxed);
        let late = WalkAhead::new(None, MAX_OPENED, FRESH);
        late.shared.warm(&started);
        assert!(lock(&late.shared.held_dirs).is_empty());
        // Bounded: the oldest go first.
        for i in 0..(MAX_HELD_DIRS as u64 + 2) {
            let mut job = job_for(&parent, b"e");
            job.dir = 100 + i;
            w.shared.warm(&job);
        }
        let held: Vec<u64> = lock(&w.shared.held_dirs).iter().map(|d| d.dir).collect();
        assert_eq!(held, (102..102 + MAX_HELD_DIRS as u64).collect::<Vec<_>>());
        // And closed when the warming ends.
        drop(w);
    }

    fn job_for(parent: &Arc<OwnedFd>, name: &[u8]) -> Job {
        Job {
            parent: Arc::clone(parent),
            dir: DIR,
            name: name.to_vec(),
            place: 0,
            walker: Arc::default(),
            ids: None,
        }
    }

    #[test]
    fn an_entry_opened_ahead_is_claimed_only_while_its_name_leads_to_it() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("d");
        std::fs::create_dir(&d).unwrap();
        for name in ["f0", "f1", "gone", "renamed", "over", "again"] {
            std::fs::write(d.join(name), name).unwrap();
        }
        std::fs::create_dir(d.join("sub")).unwrap();
        std::os::unix::fs::symlink("/", d.join("up")).unwrap();
        let w = WalkAhead::new(None, MAX_OPENED, FRESH);
        let parent = dir_fd(tmp.path());
        assert_eq!(w.shared.warm(&job_for(&parent, b"d")), Some(8));
        assert_eq!(lock(&w.shared.opened).held(), 8, "every entry opened ahead");
        let dfd = file::open_child(parent.as_fd(), OsStr::new("d"), None).unwrap();
        let claim = |name: &str| w.claim(DIR, dfd.as_fd(), name.as_bytes());
        // A name that still leads to its inode: the descriptor and today's attributes.
        let (o, st) = claim("f0").expect("f0 was opened ahead and is still there");
        let disk = std::fs::symlink_metadata(d.join("f0")).unwrap();
        assert_eq!((st.ino, st.size), (disk.ino(), 2));
        assert_eq!(file::stat(o.fd.as_fd()).unwrap().ino, disk.ino());
        assert!(claim("f0").is_none(), "claimed once");
        // The symlink itself, not what it points to; a directory.
        assert_eq!(claim("up").unwrap().1.kind, Kind::Symlink);
        assert_eq!(claim("sub").unwrap().1.kind, Kind::Directory);
        // Another directory's lookup of the same name does not take it.
        assert!(w.claim(DIR + 1, dfd.as_fd(), b"f1").is_none());
        // Changed since it was opened: the lookup must open the name itself.
        std::fs::remove_file(d.join("gone")).unwrap();
        assert!(claim("gone").is_none(), "unlinked");
        std::fs::rename(d.join("renamed"), d.join("elsewhere")).unwrap();
        assert!(claim("renamed").is_none(), "renamed away");
        std::fs::rename(d.join("f1"), d.join("over")).unwrap();
        assert!(claim("over").is_none(), "another file renamed over it");
        std::fs::remove_file(d.join("again")).unwrap();
        std::fs::write(d.join("again"), "new").unwrap();
        assert!(
            claim("again").is_none(),
            "a new file under the old name (the old inode is pinned, so its number is not reused)"
        );
        assert_eq!(w.claimed(), 3, "f0, up and sub");
        assert_eq!(
            lock(&w.shared.opened).held(),
            1,
            "f1, whose name no lookup asked for, until the walker passes or stops"
        );
    }

    #[test]
    fn entries_opened_ahead_are_bounded_and_closed_when_the_walker_passes() {
        let tmp = tempfile::tempdir().unwrap();
        let big = tmp.path().join("big");
        std::fs::create_dir(&big).unwrap();
        // More than a batch between two looks at the stash, past the bound.
        let (max, n) = (OVERTAKEN_EVERY + 16, 3 * OVERTAKEN_EVERY);
        for i in 0..n {
            std::fs::write(big.join(format!("f{i}")), "").unwrap();
        }
        let w = WalkAhead::new(None, max, FRESH);
        let parent = dir_fd(tmp.path());
        // Past the bound, the rest is warmed without being opened.
        assert_eq!(w.shared.warm(&job_for(&parent, b"big")), Some(n));
        assert_eq!(lock(&w.shared.opened).held(), max);
        // A directory the walker went past by the time it is warmed keeps nothing.
        let passed = job_for(&parent, b"big");
        passed.walker.store(2, Ordering::Relaxed);
        let mut late = vec![(
            b"f0".to_vec(),
            w.shared.open(parent.as_fd(), OsStr::new("big")).unwrap(),
        )];
        assert!(!w.shared.stash(&passed, &mut late));
        assert!(late.is_empty());
        assert_eq!(lock(&w.shared.opened).held(), max);
        // With no descriptors to spare, nothing is opened ahead at all.
        let none = WalkAhead::new(None, 0, FRESH);
        assert_eq!(none.shared.warm(&job_for(&parent, b"big")), Some(n));
        assert_eq!(lock(&none.shared.opened).held(), 0);
        // Another directory takes room from the oldest one, which goes whole: the
        // walker has left it behind.
        for d in ["a", "b", "c"] {
            std::fs::create_dir(tmp.path().join(d)).unwrap();
            for i in 0..5 {
                std::fs::write(tmp.path().join(d).join(format!("f{i}")), "").unwrap();
            }
        }
        let mut other = job_for(&parent, b"a");
        other.dir = DIR + 1;
        assert_eq!(w.shared.warm(&other), Some(5));
        {
            let stash = lock(&w.shared.opened);
            assert_eq!(stash.held(), 5);
            assert_eq!(stash.dirs.len(), 1);
            assert_eq!(stash.dirs[0].dir, DIR + 1);
        }
        // Through a plan: the walker starting `b` closes what was opened in `a`, which
        // it went past, and keeps `b`'s.
        let w = WalkAhead::new(None, MAX_OPENED, FRESH);
        let subdirs = vec![(1, b"a".to_vec()), (2, b"b".to_vec()), (3, b"c".to_vec())];
        w.planned(Arc::clone(&parent), subdirs, true, None);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while w.warmed() < 2 {
            assert!(std::time::Instant::now() < deadline, "a and b never warmed");
            std::thread::sleep(Duration::from_millis(10));
        }
        let stashed = |w: &WalkAhead| -> Vec<u64> {
            let mut v: Vec<u64> = lock(&w.shared.opened).dirs.iter().map(|d| d.dir).collect();
            v.sort();
            v
        };
        assert_eq!(stashed(&w), [1, 2]);
        w.starts(2);
        assert!(!stashed(&w).contains(&1), "a, which the walker went past");
        assert!(stashed(&w).contains(&2));
        // And everything is closed once no walk goes on.
        while lock(&w.shared.state).running {
            assert!(
                std::time::Instant::now() < deadline + IDLE * 2,
                "the thread never ended"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(lock(&w.shared.opened).held(), 0);
        assert!(lock(&w.shared.opened).dirs.is_empty());
        assert!(lock(&w.shared.held_dirs).is_empty());
    }
}
