//! A workload that checks every byte and every call while views are restarted, taken
//! over or moved between processes: writes that fsync and read back, appends through
//! one descriptor held throughout, listings of a known directory. Each loop records
//! its failures and its longest round (the longest stall a caller saw).
#![allow(dead_code)]

use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// What one workload loop saw.
#[derive(Debug, Default)]
pub struct Outcome {
    pub rounds: u64,
    pub failures: Vec<String>,
    pub longest: Duration,
    /// When each round started and how long it took.
    pub timeline: Vec<(Instant, Duration)>,
}

impl Outcome {
    /// The longest round that overlapped `from..to`: the stall an event in that window
    /// cost this loop.
    pub fn stall_during(&self, from: Instant, to: Instant) -> Duration {
        self.timeline
            .iter()
            .filter(|(start, took)| *start < to && *start + *took > from)
            .map(|(_, took)| *took)
            .max()
            .unwrap_or_default()
    }
}

/// Runs `round` until `stop`, recording failures and the longest round, and counting
/// the rounds done in `done`.
pub fn workload(
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    mut round: impl FnMut(u64) -> Result<(), String> + Send + 'static,
) -> thread::JoinHandle<Outcome> {
    thread::spawn(move || {
        let mut out = Outcome::default();
        while !stop.load(Ordering::Relaxed) {
            let start = Instant::now();
            if let Err(e) = round(out.rounds) {
                out.failures.push(e);
            }
            let took = start.elapsed();
            out.longest = out.longest.max(took);
            out.timeline.push((start, took));
            out.rounds += 1;
            done.fetch_add(1, Ordering::Relaxed);
        }
        out
    })
}

pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes a file, fsyncs it, reads it back through a new descriptor and compares.
pub fn write_round(dir: &Path, i: u64) -> Result<(), String> {
    let path = dir.join(format!("w{}", i % 50));
    let data = pattern(i, 64 * 1024);
    let mut f = fs::File::create(&path).map_err(|e| format!("create {i}: {e}"))?;
    f.write_all(&data).map_err(|e| format!("write {i}: {e}"))?;
    f.sync_all().map_err(|e| format!("fsync {i}: {e}"))?;
    drop(f);
    let back = fs::read(&path).map_err(|e| format!("read back {i}: {e}"))?;
    if back != data {
        return Err(format!("round {i}: read back differs"));
    }
    Ok(())
}

/// Appends through a descriptor held for the whole test, and re-reads all of it
/// through the same descriptor.
pub fn append_round(f: &fs::File, i: u64) -> Result<(), String> {
    let rec = pattern(1_000_000 + i, 512);
    // From the length before: an append whose call failed may or may not have landed
    // ([`Running::finish_through_kills`]); [`assert_appended`] counts them all.
    let before = f.metadata().map_err(|e| format!("fstat {i}: {e}"))?.len();
    (&*f)
        .write_all(&rec)
        .map_err(|e| format!("append {i}: {e}"))?;
    f.sync_data().map_err(|e| format!("fdatasync {i}: {e}"))?;
    let len = f.metadata().map_err(|e| format!("fstat {i}: {e}"))?.len();
    if len != before + 512 {
        return Err(format!("append {i} made {before} bytes {len}"));
    }
    let mut last = vec![0u8; 512];
    f.read_exact_at(&mut last, before)
        .map_err(|e| format!("pread {i}: {e}"))?;
    if last != rec {
        return Err(format!("append {i} reads back differently"));
    }
    Ok(())
}

/// Lists a directory of known entries and stats a few of them.
pub fn list_round(dir: &Path, inos: &[(PathBuf, u64)], i: u64) -> Result<(), String> {
    let n = fs::read_dir(dir)
        .map_err(|e| format!("opendir {i}: {e}"))?
        .map(|e| e.map(|_| ()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("readdir {i}: {e}"))?
        .len();
    if n != inos.len() {
        return Err(format!("listing {i} has {n} entries, not {}", inos.len()));
    }
    let (path, ino) = &inos[(i as usize) % inos.len()];
    let m = fs::metadata(path).map_err(|e| format!("stat {i}: {e}"))?;
    if m.ino() != *ino {
        return Err(format!("{} changed inode number", path.display()));
    }
    Ok(())
}

/// The loops of a workload running in a directory of a view: a writer, an appender
/// through one descriptor held throughout (`held.log`), and, if asked, a lister of a
/// directory of known entries.
pub struct Running {
    stop: Arc<AtomicBool>,
    loops: Vec<(&'static str, thread::JoinHandle<Outcome>)>,
    /// The rounds each loop has done so far.
    done: Vec<Arc<AtomicU64>>,
    pub held: Arc<fs::File>,
}

impl Running {
    /// Starts the loops in `root` (with a lister of `listed` entries if not 0).
    pub fn start(root: &Path, listed: usize) -> Running {
        use std::os::unix::fs::OpenOptionsExt;
        let stop = Arc::new(AtomicBool::new(false));
        let writes = root.join("writes");
        fs::create_dir(&writes).unwrap();
        let held = Arc::new(
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .read(true)
                .mode(0o644)
                .open(root.join("held.log"))
                .unwrap(),
        );
        let done = std::cell::RefCell::new(Vec::new());
        let count = || {
            let c = Arc::new(AtomicU64::new(0));
            done.borrow_mut().push(Arc::clone(&c));
            c
        };
        let mut loops = vec![
            (
                "writer",
                workload(Arc::clone(&stop), count(), move |i| write_round(&writes, i)),
            ),
            ("held file", {
                let held = Arc::clone(&held);
                workload(Arc::clone(&stop), count(), move |i| append_round(&held, i))
            }),
        ];
        if listed > 0 {
            let dir = root.join("listed");
            fs::create_dir(&dir).unwrap();
            let inos: Vec<(PathBuf, u64)> = (0..listed)
                .map(|i| {
                    let p = dir.join(format!("e{i}"));
                    fs::write(&p, i.to_string()).unwrap();
                    let ino = fs::metadata(&p).unwrap().ino();
                    (p, ino)
                })
                .collect();
            loops.push((
                "lister",
                workload(Arc::clone(&stop), count(), move |i| {
                    list_round(&dir, &inos, i)
                }),
            ));
        }
        Running {
            stop,
            loops,
            done: done.into_inner(),
            held,
        }
    }

    /// Waits until every loop has done `rounds` more rounds: the system, as it is now,
    /// served each of them that often. Panics naming the loop that did not within a
    /// minute (a hang the loops' own checks would not see until they are stopped).
    pub fn settle(&self, rounds: u64) {
        let from: Vec<u64> = self
            .done
            .iter()
            .map(|d| d.load(Ordering::Relaxed))
            .collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        for ((name, _), (done, from)) in self.loops.iter().zip(self.done.iter().zip(from)) {
            while done.load(Ordering::Relaxed) < from + rounds {
                assert!(
                    Instant::now() < deadline,
                    "the {name} loop did {} of {rounds} rounds in a minute",
                    done.load(Ordering::Relaxed) - from
                );
                thread::sleep(Duration::from_millis(5));
            }
        }
    }

    /// Stops the loops, says what each saw, and asserts that none failed and each ran.
    pub fn finish(self) -> Vec<(&'static str, Outcome)> {
        self.finish_allowing(0)
    }

    /// [`Running::finish`] for a view whose process was killed `kills` times and
    /// recovered. From Linux 6.9 the kernel resends what a dead process was answering,
    /// so no call fails. Before it nothing can resend those requests, and the view's
    /// workers read clones of the connection that die with the process: each call one
    /// was answering fails with `ECONNABORTED`, and only those. A loop has one call in
    /// flight, so it may see one such failure per kill.
    pub fn finish_through_kills(self, kills: usize) -> Vec<(&'static str, Outcome)> {
        self.finish_allowing(if crate::common::kernel_at_least(6, 9) {
            0
        } else {
            kills
        })
    }

    fn finish_allowing(self, aborted: usize) -> Vec<(&'static str, Outcome)> {
        // Each loop runs enough rounds to count (a loop that cannot is named).
        let least = self.done.iter().map(|d| d.load(Ordering::Relaxed)).min();
        self.settle(11u64.saturating_sub(least.unwrap_or(0)));
        self.stop.store(true, Ordering::Relaxed);
        let done: Vec<(&'static str, Outcome)> = self
            .loops
            .into_iter()
            .map(|(name, h)| (name, h.join().unwrap()))
            .collect();
        for (name, o) in &done {
            eprintln!(
                "{name}: {} rounds, longest {:?}, failures {:?}",
                o.rounds, o.longest, o.failures
            );
            let (aborts, others): (Vec<&String>, Vec<&String>) = o
                .failures
                .iter()
                .partition(|f| f.contains(&format!("(os error {})", libc::ECONNABORTED)));
            assert!(
                others.is_empty() && aborts.len() <= aborted,
                "{name} failed: {:?}",
                o.failures
            );
            assert!(o.rounds > 10, "{name} hardly ran: {} rounds", o.rounds);
        }
        done
    }
}

/// Every append of the "held file" loop in `done` that succeeded is in `held`, and of
/// those that failed (a kill, [`Running::finish_through_kills`]) no more than all.
pub fn assert_appended(held: &fs::File, done: &[(&'static str, Outcome)]) {
    let o = outcome(done, "held file");
    let len = held.metadata().unwrap().len();
    let failed = o.failures.len() as u64;
    assert!(
        (o.rounds - failed) * 512 <= len && len <= o.rounds * 512,
        "{len} bytes after {} appends, {failed} of them failed",
        o.rounds
    );
}

/// `bytes`, the held file's, are the "held file" loop's appends in `o`, in order: each
/// that succeeded, and each that failed (a kill before Linux 6.9,
/// [`Running::finish_through_kills`]) there or not.
pub fn assert_appended_in_order(bytes: &[u8], o: &Outcome) {
    // A failure reads "<step> <round>: <error>".
    let failed: Vec<u64> = o
        .failures
        .iter()
        .filter_map(|f| f.split(':').next()?.split_whitespace().nth(1)?.parse().ok())
        .collect();
    let mut at = 0;
    for i in 0..o.rounds {
        let rec = pattern(1_000_000 + i, 512);
        if bytes.get(at..at + 512) == Some(&rec[..]) {
            at += 512;
        } else {
            assert!(
                failed.contains(&i),
                "append {i} is not at byte {at}, and it succeeded"
            );
        }
    }
    assert_eq!(at, bytes.len(), "bytes after the last append");
}

/// The outcome of the loop called `name`.
pub fn outcome<'a>(done: &'a [(&'static str, Outcome)], name: &str) -> &'a Outcome {
    &done.iter().find(|(n, _)| *n == name).unwrap().1
}

/// The longest stall any of `done`'s loops saw during `from..to`.
pub fn longest_stall(done: &[(&'static str, Outcome)], from: Instant, to: Instant) -> Duration {
    done.iter()
        .map(|(_, o)| o.stall_during(from, to))
        .max()
        .unwrap_or_default()
}

/// Appends `report` as one JSON line to the file the environment variable `var` names,
/// if it names one (bench/zero-downtime collects these over several runs).
pub fn append_report(var: &str, report: serde_json::Map<String, serde_json::Value>) {
    if let Some(path) = std::env::var_os(var) {
        let mut f = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        writeln!(f, "{}", serde_json::Value::Object(report)).unwrap();
    }
}
