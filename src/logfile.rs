//! A log file that never outgrows its bound: at `max` bytes it is renamed to
//! `PATH.1` (replacing the previous one) and a new `PATH` is started, so a view's log
//! takes at most twice `max` on the node's disk, whatever a pod makes the view say.
//!
//! The file is also the process's standard error (the driver opens it for the view's
//! early messages), so a rotation points descriptor 2 at the new file too.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// What a view's log may grow to before it is rotated, by default.
pub const DEFAULT_MAX_BYTES: u64 = 8 << 20;

struct Current {
    file: File,
    len: u64,
}

/// A size-bounded, rotating log file.
pub struct BoundedLog {
    path: PathBuf,
    max: u64,
    current: Mutex<Current>,
    /// Whether standard error follows the file across rotations.
    stderr: bool,
}

/// `PATH.1`, where the previous log goes.
pub fn rotated_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".1");
    PathBuf::from(p)
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// Rotates `path` now if it holds `max` bytes or more (before a process starts
/// writing to it, so that what that process says is in `path`).
///
/// # Errors
/// The error of renaming.
pub fn rotate_if_full(path: &Path, max: u64) -> io::Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.len() >= max => std::fs::rename(path, rotated_path(path)),
        _ => Ok(()),
    }
}

impl BoundedLog {
    /// Opens (appending to) the log at `path`, bounded to `max` bytes; with
    /// `follow_stderr`, standard error is pointed at it now and after each rotation.
    ///
    /// # Errors
    /// The error of opening the file or redirecting standard error.
    pub fn open(path: &Path, max: u64, follow_stderr: bool) -> io::Result<BoundedLog> {
        let file = open_append(path)?;
        let len = file.metadata()?.len();
        if follow_stderr {
            crate::sys::process::redirect_stderr(&file)?;
        }
        Ok(BoundedLog {
            path: path.to_path_buf(),
            max: max.max(1024),
            current: Mutex::new(Current { file, len }),
            stderr: follow_stderr,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn rotate(&self, cur: &mut Current) -> io::Result<()> {
        std::fs::rename(&self.path, rotated_path(&self.path))?;
        let file = open_append(&self.path)?;
        if self.stderr {
            crate::sys::process::redirect_stderr(&file)?;
        }
        *cur = Current { file, len: 0 };
        Ok(())
    }
}

impl Write for &BoundedLog {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut cur = self.lock();
        if cur.len > 0 && cur.len + buf.len() as u64 > self.max {
            // A log that cannot rotate (the directory went away) keeps its bound by
            // dropping lines rather than filling the disk.
            if self.rotate(&mut cur).is_err() {
                return Ok(buf.len());
            }
        }
        cur.file.write_all(buf)?;
        cur.len += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.lock().file.flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for BoundedLog {
    type Writer = &'a BoundedLog;

    fn make_writer(&'a self) -> Self::Writer {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_at_its_bound_and_keeps_one_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.log");
        let log = BoundedLog::open(&path, 4096, false).unwrap();
        let line = [b'x'; 99];
        for _ in 0..1000 {
            (&log).write_all(&line).unwrap();
            (&log).write_all(b"\n").unwrap();
        }
        let now = std::fs::metadata(&path).unwrap().len();
        let old = std::fs::metadata(rotated_path(&path)).unwrap().len();
        assert!(now <= 4096 && old <= 4096, "{now} and {old} bytes");
        assert!(old > 3000, "the rotated file was full: {old}");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 2, "one current, one old");
    }

    #[test]
    fn a_full_log_is_rotated_before_a_new_process_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.log");
        std::fs::write(&path, vec![b'x'; 5000]).unwrap();
        rotate_if_full(&path, 4096).unwrap();
        assert!(!path.exists());
        assert_eq!(std::fs::metadata(rotated_path(&path)).unwrap().len(), 5000);
        std::fs::write(&path, b"small").unwrap();
        rotate_if_full(&path, 4096).unwrap();
        assert!(path.exists());
    }
}
