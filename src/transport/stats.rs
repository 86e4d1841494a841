//! Operation counts and latencies of one view, kept in atomics (a few nanoseconds per
//! operation) and written as a JSON snapshot that the driver's metrics endpoint reads:
//! views are processes of their own, so this file is how their numbers reach it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Upper bounds of the latency buckets, in seconds.
pub const BUCKETS: [f64; 11] = [
    10e-6, 50e-6, 100e-6, 500e-6, 1e-3, 5e-3, 10e-3, 50e-3, 100e-3, 500e-3, 1.0,
];

macro_rules! ops {
    ($($variant:ident => $name:literal),* $(,)?) => {
        /// The FUSE operations a view counts.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Op { $($variant),* }
        impl Op {
            pub const ALL: &'static [Op] = &[$(Op::$variant),*];
            pub fn name(self) -> &'static str {
                match self { $(Op::$variant => $name),* }
            }
        }
    };
}

ops! {
    Lookup => "lookup", Getattr => "getattr", Setattr => "setattr", Readlink => "readlink",
    Mknod => "mknod", Mkdir => "mkdir", Unlink => "unlink", Rmdir => "rmdir",
    Symlink => "symlink", Rename => "rename", Link => "link", Open => "open",
    Create => "create", Read => "read", Write => "write", Release => "release",
    Fsync => "fsync", Opendir => "opendir", Readdir => "readdir", Statfs => "statfs",
    Getxattr => "getxattr", Setxattr => "setxattr", Listxattr => "listxattr",
    Removexattr => "removexattr", Access => "access", Fallocate => "fallocate",
    Lseek => "lseek", CopyFileRange => "copy_file_range", Forget => "forget",
    Flush => "flush", Ioctl => "ioctl", Poll => "poll", Lock => "lock", Bmap => "bmap",
    Releasedir => "releasedir", Fsyncdir => "fsyncdir",
}

struct OpStats {
    count: AtomicU64,
    errors: AtomicU64,
    sum_ns: AtomicU64,
    /// Cumulative: bucket `i` counts operations that took at most `BUCKETS[i]`.
    buckets: [AtomicU64; BUCKETS.len()],
    /// Failures by errno: slot `e` counts errno `e`; slot 0 those past the table.
    /// Atomics, not a map under a lock: failed lookups are a hot path.
    errnos: [AtomicU64; ERRNO_SLOTS],
}

/// Linux errnos end below this (`EHWPOISON` is 133).
const ERRNO_SLOTS: usize = 134;

impl Default for OpStats {
    fn default() -> Self {
        OpStats {
            count: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            errnos: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// Threads whose requests in progress are tracked at once (a view serves on a few: one
/// worker per CPU, one per ring queue, and with `max_threads=` up to 256); a thread
/// past these is served, not tracked.
const BUSY_SLOTS: usize = 256;

/// A thread's place among [`BUSY_SLOTS`], given on its first request and given back
/// when the thread ends (workers started beyond `threads=` come and go).
struct BusySlot(std::cell::Cell<Option<usize>>);

impl BusySlot {
    fn get(&self) -> Option<usize> {
        if self.0.get().is_none() {
            let freed = BUSY_SLOTS_FREED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop();
            self.0.set(Some(freed.unwrap_or_else(|| {
                BUSY_SLOTS_GIVEN.fetch_add(1, Ordering::Relaxed)
            })));
        }
        self.0.get()
    }
}

impl Drop for BusySlot {
    fn drop(&mut self) {
        if let Some(i) = self.0.get().filter(|i| *i < BUSY_SLOTS) {
            BUSY_SLOTS_FREED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(i);
        }
    }
}

thread_local! {
    static BUSY_SLOT: BusySlot = const { BusySlot(std::cell::Cell::new(None)) };
}

/// Places given to threads so far, over the process, and those given back.
static BUSY_SLOTS_GIVEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static BUSY_SLOTS_FREED: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

/// The counters of one view.
pub struct ViewStats {
    ops: Vec<OpStats>,
    passthrough: AtomicBool,
    idmap: AtomicBool,
    ring_requests: AtomicU64,
    walked_ahead: AtomicU64,
    opened_ahead: AtomicU64,
    /// When each thread's request in progress started (nanoseconds after `epoch`, plus
    /// one; 0: none): what a request stuck alone is seen by, which the keeper's liveness
    /// check is not (another worker answers it).
    busy: Box<[AtomicU64]>,
    epoch: Instant,
}

/// A request in progress on this thread, until dropped.
pub struct Busy<'a> {
    slot: Option<&'a AtomicU64>,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            slot.store(0, Ordering::Relaxed);
        }
    }
}

impl Default for ViewStats {
    fn default() -> Self {
        ViewStats {
            ops: Op::ALL.iter().map(|_| OpStats::default()).collect(),
            passthrough: AtomicBool::new(false),
            idmap: AtomicBool::new(false),
            ring_requests: AtomicU64::new(0),
            walked_ahead: AtomicU64::new(0),
            opened_ahead: AtomicU64::new(0),
            busy: (0..BUSY_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
        }
    }
}

/// One operation's numbers in a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OpSnapshot {
    pub count: u64,
    pub errors: u64,
    pub sum_seconds: f64,
    /// Cumulative counts per bucket of [`BUCKETS`].
    pub buckets: Vec<u64>,
    /// Failures by errno name (`ENOENT`, ...).
    #[serde(default)]
    pub errnos: BTreeMap<String, u64>,
}

/// What a view's metrics file holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub passthrough: bool,
    /// Whether a container runtime can idmap the view (`FUSE_ALLOW_IDMAP` negotiated).
    #[serde(default)]
    pub idmap: bool,
    /// Requests the kernel handed over io_uring (`transport=ring`) rather than
    /// `/dev/fuse`.
    #[serde(default)]
    pub ring_requests: u64,
    /// Directories the view warmed ahead of a walk (`fs/ahead.rs`).
    #[serde(default)]
    pub walked_ahead: u64,
    /// Lookups the view answered with an entry opened ahead of a walk (`fs/ahead.rs`).
    #[serde(default)]
    pub opened_ahead: u64,
    /// How long the oldest request in progress has waited, in seconds (0: none).
    #[serde(default)]
    pub oldest_request_seconds: f64,
    /// The requests in progress: what the view has in flight to its share while its
    /// callers wait on it.
    #[serde(default)]
    pub requests_in_progress: u64,
    pub ops: BTreeMap<String, OpSnapshot>,
    /// What the view's process costs (absent from files of older views).
    #[serde(default)]
    pub process: ProcessUsage,
}

/// What a view's process costs: the per-volume price of a view, in the metrics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessUsage {
    /// Resident memory.
    pub resident_bytes: u64,
    /// CPU time used, user and system, since the process started.
    pub cpu_seconds: f64,
}

impl ViewStats {
    /// Counts one operation that started at `start` and failed with `errno`, if it did.
    pub fn record(&self, op: Op, start: Instant, errno: Option<i32>) {
        let s = &self.ops[op as usize];
        let elapsed = start.elapsed();
        s.count.fetch_add(1, Ordering::Relaxed);
        if let Some(errno) = errno {
            s.errors.fetch_add(1, Ordering::Relaxed);
            let slot = usize::try_from(errno)
                .ok()
                .filter(|e| *e < ERRNO_SLOTS)
                .unwrap_or(0);
            s.errnos[slot].fetch_add(1, Ordering::Relaxed);
        }
        s.sum_ns.fetch_add(
            u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        let secs = elapsed.as_secs_f64();
        for (i, bound) in BUCKETS.iter().enumerate() {
            if secs <= *bound {
                s.buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Marks a request in progress on this thread until the guard is dropped.
    pub fn busy(&self) -> Busy<'_> {
        let slot = BUSY_SLOT.with(BusySlot::get);
        let slot = slot.and_then(|i| self.busy.get(i));
        if let Some(slot) = slot {
            let since = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
            slot.store(since + 1, Ordering::Relaxed);
        }
        Busy { slot }
    }

    /// How long the oldest request in progress has waited.
    pub fn oldest_request(&self) -> Duration {
        let now = self.epoch.elapsed().as_nanos();
        self.busy
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .filter(|&t| t != 0)
            .map(|t| {
                Duration::from_nanos(
                    u64::try_from(now.saturating_sub(u128::from(t - 1))).unwrap_or(u64::MAX),
                )
            })
            .max()
            .unwrap_or_default()
    }

    /// How many requests are in progress now, one per worker busy with one.
    pub fn requests_in_progress(&self) -> u64 {
        self.busy
            .iter()
            .filter(|s| s.load(Ordering::Relaxed) != 0)
            .count() as u64
    }

    /// Counts one request that came over io_uring.
    pub fn count_ring_request(&self) {
        self.ring_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Sets the count of directories warmed ahead of a walk, which the view keeps.
    pub fn set_walked_ahead(&self, n: u64) {
        self.walked_ahead.store(n, Ordering::Relaxed);
    }

    /// Sets the count of lookups answered with an entry opened ahead of a walk, which
    /// the view keeps.
    pub fn set_opened_ahead(&self, n: u64) {
        self.opened_ahead.store(n, Ordering::Relaxed);
    }

    pub fn set_passthrough(&self, on: bool) {
        self.passthrough.store(on, Ordering::Relaxed);
    }

    /// Whether the view's mounts can be idmapped (`FUSE_ALLOW_IDMAP` negotiated).
    pub fn set_idmap(&self, on: bool) {
        self.idmap.store(on, Ordering::Relaxed);
    }

    /// The numbers now.
    pub fn snapshot(&self) -> Snapshot {
        let ops = Op::ALL
            .iter()
            .zip(&self.ops)
            .filter(|(_, s)| s.count.load(Ordering::Relaxed) > 0)
            .map(|(op, s)| {
                (
                    op.name().to_string(),
                    OpSnapshot {
                        count: s.count.load(Ordering::Relaxed),
                        errors: s.errors.load(Ordering::Relaxed),
                        sum_seconds: Duration::from_nanos(s.sum_ns.load(Ordering::Relaxed))
                            .as_secs_f64(),
                        buckets: s
                            .buckets
                            .iter()
                            .map(|b| b.load(Ordering::Relaxed))
                            .collect(),
                        errnos: s
                            .errnos
                            .iter()
                            .enumerate()
                            .map(|(e, n)| (e, n.load(Ordering::Relaxed)))
                            .filter(|(_, n)| *n > 0)
                            .map(|(e, n)| {
                                let name = if e == 0 {
                                    "other".to_string()
                                } else {
                                    crate::sys::Errno(e as i32).name()
                                };
                                (name, n)
                            })
                            .collect(),
                    },
                )
            })
            .collect();
        let (resident_bytes, cpu_seconds) = crate::sys::process::own_usage();
        Snapshot {
            passthrough: self.passthrough.load(Ordering::Relaxed),
            idmap: self.idmap.load(Ordering::Relaxed),
            ring_requests: self.ring_requests.load(Ordering::Relaxed),
            walked_ahead: self.walked_ahead.load(Ordering::Relaxed),
            opened_ahead: self.opened_ahead.load(Ordering::Relaxed),
            oldest_request_seconds: self.oldest_request().as_secs_f64(),
            requests_in_progress: self.requests_in_progress(),
            ops,
            process: ProcessUsage {
                resident_bytes,
                cpu_seconds,
            },
        }
    }

    /// Writes the snapshot to `path` atomically (temp file and rename).
    ///
    /// # Errors
    /// The error of writing or renaming.
    pub fn write_snapshot(&self, path: &Path) -> std::io::Result<()> {
        let body = serde_json::to_vec(&self.snapshot())?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, body)?;
        std::fs::rename(&tmp, path)
    }
}

impl Snapshot {
    /// Adds another view's numbers to these (for a node-wide total).
    pub fn add(&mut self, other: &Snapshot) {
        self.ring_requests += other.ring_requests;
        self.walked_ahead += other.walked_ahead;
        self.opened_ahead += other.opened_ahead;
        self.oldest_request_seconds = self
            .oldest_request_seconds
            .max(other.oldest_request_seconds);
        self.requests_in_progress += other.requests_in_progress;
        for (name, o) in &other.ops {
            let e = self.ops.entry(name.clone()).or_insert_with(|| OpSnapshot {
                buckets: vec![0; BUCKETS.len()],
                ..OpSnapshot::default()
            });
            e.count += o.count;
            e.errors += o.errors;
            e.sum_seconds += o.sum_seconds;
            for (a, b) in e.buckets.iter_mut().zip(&o.buckets) {
                *a += b;
            }
            for (errno, n) in &o.errnos {
                *e.errnos.entry(errno.clone()).or_default() += n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_buckets_and_sums() {
        let s = ViewStats::default();
        let t = Instant::now();
        s.record(Op::Lookup, t, None);
        s.record(Op::Lookup, t, Some(libc::ENOENT));
        s.record(Op::Write, t, None);
        s.set_passthrough(true);
        let snap = s.snapshot();
        assert!(snap.passthrough);
        assert_eq!(snap.ops["lookup"].count, 2);
        assert_eq!(snap.ops["lookup"].errors, 1);
        assert_eq!(snap.ops["lookup"].errnos["ENOENT"], 1);
        assert!(snap.ops["write"].errnos.is_empty());
        assert_eq!(
            *snap.ops["lookup"].buckets.last().unwrap(),
            2,
            "cumulative up to 1 s"
        );
        assert!(
            !snap.ops.contains_key("read"),
            "unused operations are left out"
        );
        let mut total = Snapshot::default();
        total.add(&snap);
        total.add(&snap);
        assert_eq!(total.ops["write"].count, 2);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.json");
        s.write_snapshot(&path).unwrap();
        let back: Snapshot = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        // A snapshot of its own, taken a moment later: the process's usage has moved on.
        assert_eq!((back.passthrough, &back.ops), (snap.passthrough, &snap.ops));
        assert!(back.process.resident_bytes > 0 && back.process.cpu_seconds > 0.0);
        // Every errno by its name, a share's too (a soft mount's server away).
        s.record(Op::Lookup, t, Some(libc::EHOSTDOWN));
        assert_eq!(s.snapshot().ops["lookup"].errnos["EHOSTDOWN"], 1);
    }

    #[test]
    fn threads_that_came_and_went_leave_their_slots_to_others() {
        let s = std::sync::Arc::new(ViewStats::default());
        // More threads over time than there are slots, one at a time: each is tracked.
        for _ in 0..BUSY_SLOTS + 10 {
            let s = std::sync::Arc::clone(&s);
            std::thread::spawn(move || {
                let _busy = s.busy();
                std::thread::sleep(Duration::from_millis(2));
                assert!(s.oldest_request() > Duration::ZERO, "an untracked thread");
            })
            .join()
            .unwrap();
        }
    }

    #[test]
    fn the_oldest_request_in_progress_is_timed_on_any_thread() {
        let s = std::sync::Arc::new(ViewStats::default());
        assert_eq!(s.oldest_request(), Duration::ZERO);
        let (held, release) = std::sync::mpsc::channel::<()>();
        let (started, wait_started) = std::sync::mpsc::channel();
        let stuck = {
            let s = std::sync::Arc::clone(&s);
            std::thread::spawn(move || {
                let _busy = s.busy();
                started.send(()).unwrap();
                let _ = release.recv();
            })
        };
        wait_started.recv().unwrap();
        // Requests that come and go on this thread leave the stuck one the oldest.
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(50));
            let _busy = s.busy();
        }
        let oldest = s.oldest_request();
        assert!(oldest >= Duration::from_millis(150), "{oldest:?}");
        assert!(s.snapshot().oldest_request_seconds >= 0.15);
        assert_eq!(s.snapshot().requests_in_progress, 1, "the stuck one");
        {
            let _busy = s.busy();
            assert_eq!(s.requests_in_progress(), 2);
        }
        drop(held);
        stuck.join().unwrap();
        assert_eq!(s.oldest_request(), Duration::ZERO, "none in progress");
        assert_eq!(s.requests_in_progress(), 0);
    }
}
