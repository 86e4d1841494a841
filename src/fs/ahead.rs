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
//! Nothing is kept but the caches: the view's answers are made when asked, as before,
//! so warming changes no result, only its time. Warming opens only directories
//! (beneath the view's root, as lookups do) and never follows a symlink or triggers
//! an automount; it is bounded by [`MAX_ENTRIES`] per directory and by the plans
//! kept, and it stops when no walk starts another directory for [`IDLE`].

use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::sys::dir;
use crate::sys::file::{self, Access, Kind};

/// Directories warmed ahead of the one the walker starts listing.
pub const AHEAD: usize = 2;

/// Entries of one directory warmed at most.
pub const MAX_ENTRIES: usize = 16_384;

/// Subdirectories remembered of one listed directory at most.
pub const MAX_PLANNED: usize = 4096;

/// Listed directories whose subdirectories are remembered; the oldest go first.
const MAX_PLANS: usize = 16;

/// Entries warmed between two looks at whether the walker reached the directory.
const OVERTAKEN_EVERY: usize = 64;

/// How long the warming thread waits for work before it ends.
const IDLE: Duration = Duration::from_secs(2);

/// The subdirectories of one listed directory, in listing order.
struct Plan {
    /// The listed directory (an `O_PATH` descriptor), to open its subdirectories
    /// beneath.
    parent: Arc<OwnedFd>,
    names: Vec<Vec<u8>>,
    /// The first subdirectory not queued yet.
    next: usize,
    /// One past the place of the subdirectory the walker started last (0: none).
    walker: Arc<AtomicUsize>,
}

/// One directory to warm: its place among its plan's, whose walker it must stay
/// ahead of.
struct Job {
    parent: Arc<OwnedFd>,
    name: Vec<u8>,
    place: usize,
    walker: Arc<AtomicUsize>,
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

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    /// Directories listed and warmed so far.
    warmed: AtomicU64,
    /// The view root's mount: a name with another mount on it is not opened.
    root_mnt: Option<u64>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The walk-ahead of one view.
pub struct WalkAhead {
    shared: Arc<Shared>,
}

impl WalkAhead {
    pub fn new(root_mnt: Option<u64>) -> WalkAhead {
        WalkAhead {
            shared: Arc::new(Shared {
                state: Mutex::default(),
                wake: Condvar::new(),
                warmed: AtomicU64::new(0),
                root_mnt,
            }),
        }
    }

    /// A directory (`parent`) was listed whole: its subdirectories, in listing order,
    /// each with its node id. When the listing carried attributes (`walking`), the
    /// first [`AHEAD`] are warmed now: the walker lists the first next.
    pub fn planned(&self, parent: Arc<OwnedFd>, subdirs: Vec<(u64, Vec<u8>)>, walking: bool) {
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
        let mut names = Vec::with_capacity(subdirs.len().min(MAX_PLANNED));
        for (i, (id, name)) in subdirs.into_iter().take(MAX_PLANNED).enumerate() {
            s.index.insert(id, (seq, i));
            names.push(name);
        }
        s.plans.push_back((
            seq,
            Plan {
                parent,
                names,
                next: 0,
                walker: Arc::default(),
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

    /// The walker starts listing `dir`: the [`AHEAD`] planned after it are warmed.
    pub fn starts(&self, dir: u64) {
        let mut s = lock(&self.shared.state);
        if let Some(&(seq, i)) = s.index.get(&dir) {
            if let Some((_, plan)) = s.plans.iter().find(|(q, _)| *q == seq) {
                plan.walker.fetch_max(i + 1, Ordering::Relaxed);
            }
            self.warm_through(&mut s, seq, i + AHEAD);
        }
    }

    /// Queues the subdirectories of plan `seq` not warmed yet, up to place `last`.
    fn warm_through(&self, s: &mut State, seq: u64, last: usize) {
        let Some((_, plan)) = s.plans.iter_mut().find(|(q, _)| *q == seq) else {
            return;
        };
        let end = (last + 1).min(plan.names.len());
        let mut work = Vec::new();
        plan.next = plan.next.max(plan.walker.load(Ordering::Relaxed));
        while plan.next < end {
            work.push(Job {
                parent: Arc::clone(&plan.parent),
                name: plan.names[plan.next].clone(),
                place: plan.next,
                walker: Arc::clone(&plan.walker),
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
            .spawn(move || shared.run());
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
                        return;
                    }
                }
            };
            if self.warm(&job).is_some() {
                self.warmed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Lists the job's directory and `statx`es its entries, until the walker reaches
    /// it: how many, or `None` when it was not listed (gone, not a directory, a
    /// symlink, a mount point).
    fn warm(&self, job: &Job) -> Option<usize> {
        let name = OsStr::from_bytes(&job.name);
        let at = file::open_child(job.parent.as_fd(), name, self.root_mnt).ok()?;
        let d = file::reopen(at.as_fd(), Kind::Directory, Access::Directory).ok()?;
        // Not the walker's read: the directory's access time is left alone whatever
        // the view's atime rule (the daemon owns every file, as O_NOATIME asks).
        let _ = file::set_noatime(d.as_fd());
        let mut buf = vec![std::mem::MaybeUninit::uninit(); 32 * 1024];
        let mut warmed = 0;
        'batches: while warmed < MAX_ENTRIES && !lock(&self.state).stop {
            let batch = match dir::read_batch(d.as_fd(), &mut buf) {
                Ok(b) if !b.is_empty() => b,
                _ => break,
            };
            for e in batch {
                if e.name != b"." && e.name != b".." {
                    if warmed % OVERTAKEN_EVERY == 0 && job.overtaken() {
                        break 'batches;
                    }
                    file::warm_child(d.as_fd(), OsStr::from_bytes(&e.name));
                    warmed += 1;
                }
            }
        }
        Some(warmed)
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
        let w = WalkAhead::new(None);
        let parent = dir_fd(tmp.path());
        let subdirs = (0..6u64)
            .map(|i| (100 + i, format!("d{i}").into_bytes()))
            .collect();
        // Stop the thread from taking the work, to see what is queued.
        lock(&w.shared.state).running = true;
        w.planned(Arc::clone(&parent), vec![(7, b"names".to_vec())], false);
        assert!(
            lock(&w.shared.state).queue.is_empty(),
            "a listing of names warms nothing"
        );
        w.planned(parent, subdirs, true);
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
        let w = WalkAhead::new(None);
        lock(&w.shared.state).running = true;
        for p in 0..(MAX_PLANS as u64 * 2) {
            let subdirs = (0..10u64).map(|i| (p * 100 + i, b"x".to_vec())).collect();
            w.planned(dir_fd(tmp.path()), subdirs, true);
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
        let w = WalkAhead::new(None);
        let parent = dir_fd(tmp.path());
        // A directory, a symlink out, a missing name, the parent: only the first is
        // listed.
        let job = |name: &[u8]| Job {
            parent: Arc::clone(&parent),
            name: name.to_vec(),
            place: 0,
            walker: Arc::default(),
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
        w.planned(parent, vec![(1, b"d".to_vec()), (2, b"up".to_vec())], true);
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
}
