//! What a share's outage does to its callers, through a view and on the share's own
//! mount: appenders whose every acknowledged line must survive, and callers that look
//! names up and keep what each call answered. Used by tests/shares.rs and
//! tests/ceph.rs, which the VM tier runs.
#![allow(dead_code)]

use std::fs;
use std::path::Path;
use std::time::Duration;

/// A process appending numbered lines to a file, each `fsync`'d and closed before it
/// is counted as acknowledged, until stopped. A process of its own, not a thread of
/// the test's: while the share is away its open descriptor waits in `fsync` with the
/// file's lock held, and a descriptor of the test process would be inherited by every
/// process the test (or another test of the program) starts meanwhile, whose `exec`
/// flushes it (fs/fuse/file.c `fuse_flush`) and so waits for that lock: the restart of
/// the very server the append waits for would never come.
pub struct Appender {
    child: std::process::Child,
}

/// What an [`Appender`] did: the lines acknowledged, the errors of the appends that
/// failed, and its longest append.
pub struct Appended {
    pub acknowledged: u32,
    pub errors: Vec<String>,
    pub longest: Duration,
}

/// The appender: one line of output per append, `ok N SECONDS` (N acknowledged so
/// far) or `err ERRNO SECONDS`; SIGTERM ends it after the append under way.
const APPEND: &str = r#"
import os, signal, sys, time
stop = False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
n = 0
while not stop:
    t = time.monotonic()
    try:
        fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, b"line %d\n" % n)
            os.fsync(fd)
        finally:
            os.close(fd)
        n += 1
        print("ok", n, time.monotonic() - t, flush=True)
    except OSError as e:
        print("err", e.errno, time.monotonic() - t, flush=True)
    time.sleep(0.05)
"#;

impl Appender {
    pub fn start(log: std::path::PathBuf) -> Appender {
        let child = std::process::Command::new("python3")
            .args(["-c", APPEND])
            .arg(log)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs");
        Appender { child }
    }

    /// Stops it (once the append under way is done): what it did.
    pub fn stop(self) -> Appended {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let out = self.child.wait_with_output().unwrap();
        let mut done = Appended {
            acknowledged: 0,
            errors: Vec::new(),
            longest: Duration::ZERO,
        };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let words: Vec<&str> = line.split(' ').collect();
            let [what, n, secs] = words[..] else {
                panic!("the appender said {line:?}");
            };
            done.longest = done
                .longest
                .max(Duration::from_secs_f64(secs.parse().unwrap()));
            match what {
                "ok" => done.acknowledged = n.parse().unwrap(),
                _ => done.errors.push(format!("errno {n}")),
            }
        }
        done
    }
}

/// Asserts that the file at `on_server` holds every one of the first `acknowledged`
/// lines an [`Appender`] wrote, in order. A failed append may have reached the server
/// before it failed (a `soft` mount's timeout), and is then there twice.
pub fn appended_lines_kept(on_server: &Path, acknowledged: u32) {
    let text = fs::read_to_string(on_server).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.dedup();
    let expected: Vec<String> = (0..acknowledged).map(|i| format!("line {i}")).collect();
    assert_eq!(
        lines.get(..expected.len()),
        Some(&expected.iter().map(String::as_str).collect::<Vec<_>>()[..]),
        "every acknowledged append on the server"
    );
    assert!(lines.len() <= expected.len() + 1, "{lines:?}");
}

/// Threads looking up names of their own in a directory, a new name each time (no
/// cache answers), until stopped: what each call answered, and how long it took.
pub struct Lookups {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    answered: std::sync::Arc<std::sync::Mutex<Vec<bool>>>,
    threads: Vec<std::thread::JoinHandle<Vec<Call>>>,
}

/// One call's errno (`None`: it succeeded) and how long it took.
pub type Call = (Option<i32>, Duration);

/// What [`Lookups`] saw: the errnos its calls failed with, and its longest call.
pub struct Answers {
    pub errnos: std::collections::BTreeSet<i32>,
    pub calls: usize,
    pub longest: Duration,
}

impl Answers {
    pub fn said(&self) -> String {
        format!(
            "{} calls, the longest {:?}, errnos {:?}",
            self.calls, self.longest, self.errnos
        )
    }
}

impl Lookups {
    pub fn start(dir: &Path, callers: usize) -> Lookups {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let answered = std::sync::Arc::new(std::sync::Mutex::new(vec![false; callers]));
        let threads = (0..callers)
            .map(|i| {
                let (dir, stop, answered) = (dir.to_path_buf(), stop.clone(), answered.clone());
                std::thread::spawn(move || {
                    let mut calls = Vec::new();
                    for n in 0.. {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let start = std::time::Instant::now();
                        let got = fs::symlink_metadata(dir.join(format!("absent-{i}-{n}")));
                        calls.push((got.err().and_then(|e| e.raw_os_error()), start.elapsed()));
                        answered.lock().unwrap()[i] = true;
                    }
                    calls
                })
            })
            .collect();
        Lookups {
            stop,
            answered,
            threads,
        }
    }

    /// How many of its callers have had an answer.
    pub fn answered(&self) -> usize {
        self.answered.lock().unwrap().iter().filter(|a| **a).count()
    }

    pub fn stop(self) -> Answers {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let calls: Vec<_> = self
            .threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        Answers {
            errnos: calls.iter().filter_map(|(e, _)| *e).collect(),
            calls: calls.len(),
            longest: calls.iter().map(|(_, t)| *t).max().unwrap_or_default(),
        }
    }
}

/// The number of lines in the file at `path` (0 where it cannot be read).
pub fn lines_in(path: &Path) -> usize {
    fs::read_to_string(path).map_or(0, |t| t.lines().count())
}
