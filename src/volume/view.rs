//! Published views run as processes of their own (`mountgroup mount`, in their own
//! process group), so that a view that panics or is killed takes no other view and
//! not the gRPC server with it, and so that the driver can be restarted (even with
//! SIGKILL) while every view goes on serving.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::config::ViewOptions;
use crate::sys::mount::{self, Health};

use super::VolumeError;

/// The file system type of a view.
pub const VIEW_FSTYPE: &str = "fuse.mountgroup";

const START_TIMEOUT: Duration = Duration::from_secs(15);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// How views are run: which binary serves them, and whether a keeper runs them.
#[derive(Clone, Debug)]
pub struct ViewRunner {
    /// The `mountgroup` binary that serves a view.
    pub binary: PathBuf,
    /// The keeper's socket (`volume/keeper.rs`); `None`: views are the driver's own
    /// children, which a restart of its container ends.
    pub keeper: Option<PathBuf>,
}

/// Starts and stops view processes.
#[derive(Clone, Debug)]
pub struct Views {
    /// The `mountgroup` binary that serves a view.
    exe: PathBuf,
    /// Where each view's log goes (`<hash of target>.log`).
    log_dir: PathBuf,
    /// Where views listen for a successor (`mountgroup mount --control-dir`).
    control_dir: PathBuf,
    /// The keeper that runs views (`volume/keeper.rs`); without one, views are this
    /// process's children.
    keeper: Option<PathBuf>,
}

/// A view being started: a child of this process, or one the keeper runs.
enum Starting {
    Child(std::process::Child),
    Keeper { socket: PathBuf, pid: u32 },
}

impl Starting {
    /// Whether it has exited already.
    fn exited(&mut self) -> bool {
        match self {
            Starting::Child(c) => c.try_wait().ok().flatten().is_some(),
            Starting::Keeper { socket, pid } => matches!(
                super::keeper::ask(socket, &super::keeper::Request::Status { pid: *pid }),
                Ok(super::keeper::Response::Exited { .. } | super::keeper::Response::Unknown)
            ),
        }
    }

    /// Ends a start that takes too long (a child; the keeper's views end when their
    /// target is unmounted).
    fn abandon(self) {
        if let Starting::Child(mut c) = self {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Views {
    /// # Errors
    /// [`VolumeError::Internal`] if the log directory cannot be made.
    pub fn new(
        exe: PathBuf,
        log_dir: PathBuf,
        control_dir: PathBuf,
        keeper: Option<PathBuf>,
    ) -> Result<Views, VolumeError> {
        fs::create_dir_all(&log_dir).map_err(|e| {
            VolumeError::Internal(format!("log directory {}: {e}", log_dir.display()))
        })?;
        Ok(Views {
            exe,
            log_dir,
            control_dir,
            keeper,
        })
    }

    /// The log file of the view at `target`.
    pub fn log_path(&self, target: &Path) -> PathBuf {
        self.log_dir.join(format!("{}.log", Self::key(target)))
    }

    /// The metrics snapshot the view at `target` writes (fs/stats.rs).
    pub fn metrics_path(&self, target: &Path) -> PathBuf {
        self.log_dir
            .join(format!("{}.metrics.json", Self::key(target)))
    }

    fn key(target: &Path) -> String {
        super::names::target_key(target)
    }

    /// Mounts a view of `source` at `target` and returns the serving process's pid
    /// once the mount is in place.
    ///
    /// # Errors
    /// [`VolumeError::Internal`] with the view's own message if it does not mount.
    pub fn start(
        &self,
        source: &Path,
        target: &Path,
        options: &ViewOptions,
    ) -> Result<u32, VolumeError> {
        let log = self.log_path(target);
        // The view rotates its log itself (--log-file); a full one is rotated here
        // first, so that this start's messages are in `log` for the error below.
        let _ = crate::logfile::rotate_if_full(&log, crate::logfile::DEFAULT_MAX_BYTES);
        let log_file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| VolumeError::Internal(format!("view log {}: {e}", log.display())))?;
        let start_of_this_run = log_file.metadata().map(|m| m.len()).unwrap_or(0);
        let args: Vec<std::ffi::OsString> = vec![
            "mount".into(),
            source.into(),
            target.into(),
            "-o".into(),
            options.to_option_string().into(),
            "--metrics-file".into(),
            self.metrics_path(target).into(),
            "--log-file".into(),
            log.clone().into(),
            "--control-dir".into(),
            self.control_dir.clone().into(),
        ];
        let failed = |e: String| {
            VolumeError::Internal(format!("starting the view for {}: {e}", target.display()))
        };
        let mut starting = match &self.keeper {
            Some(socket) => {
                let request = super::keeper::Request::Start { args };
                match super::keeper::ask(socket, &request) {
                    Ok(super::keeper::Response::Started { pid }) => Starting::Keeper {
                        socket: socket.clone(),
                        pid,
                    },
                    Ok(other) => return Err(failed(format!("the keeper answered {other:?}"))),
                    Err(e) => {
                        return Err(failed(format!(
                            "the keeper at {} does not answer: {e}",
                            socket.display()
                        )));
                    }
                }
            }
            None => Starting::Child(
                Command::new(&self.exe)
                    .args(&args)
                    .env(
                        "RUST_LOG",
                        std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
                    )
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(log_file)
                    // Its own process group: signals meant for the driver do not reach it.
                    .process_group(0)
                    .spawn()
                    .map_err(|e| failed(e.to_string()))?,
            ),
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if mount::mount_type(target).ok().flatten().as_deref() == Some(VIEW_FSTYPE) {
                break;
            }
            let exited = starting.exited();
            if exited || Instant::now() > deadline {
                if !exited {
                    starting.abandon();
                }
                let said = fs::read_to_string(&log)
                    .map(|s| {
                        s.get(start_of_this_run as usize..)
                            .unwrap_or_default()
                            .trim()
                            .to_string()
                    })
                    .unwrap_or_default();
                let last = said.lines().last().unwrap_or("no message").to_string();
                return Err(VolumeError::Internal(format!(
                    "the view for {} did not mount: {last}",
                    target.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let pid = match starting {
            Starting::Child(mut child) => {
                let pid = child.id();
                // Reap the process whenever it ends, so it never lingers as a zombie.
                std::thread::Builder::new()
                    .name(format!("view-reaper-{pid}"))
                    .spawn(move || {
                        let _ = child.wait();
                    })
                    .map_err(|e| VolumeError::Internal(format!("reaper thread: {e}")))?;
                pid
            }
            // The keeper's number for it, in the keeper's PID namespace: recorded, never
            // signalled from here (see `stop`).
            Starting::Keeper { pid, .. } => pid,
        };
        tracing::info!(target = %target.display(), pid, "view serving");
        Ok(pid)
    }

    /// Stops the view at `target`: SIGTERM to its process (if `pid` is still that
    /// view), then a lazy unmount if the mount is still there or dead.
    ///
    /// # Errors
    /// [`VolumeError::Internal`] if the target stays mounted.
    pub fn stop(&self, target: &Path, pid: Option<u32>) -> Result<(), VolumeError> {
        // A keeper's view has a pid of another PID namespace: the unmount below ends it.
        let pid = pid.filter(|_| self.keeper.is_none());
        if let Some(pid) = pid.filter(|p| is_view_process(*p, target)) {
            if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
            }
            let deadline = Instant::now() + STOP_TIMEOUT;
            while mount::health(target) == Health::Mounted(VIEW_FSTYPE.into())
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        match mount::health(target) {
            Health::NotMounted => {}
            Health::Dead | Health::Mounted(_) => {
                if let Err(e) = mount::unmount_lazy(target) {
                    return Err(VolumeError::Internal(format!(
                        "unmounting {}: {e}",
                        target.display()
                    )));
                }
            }
        }
        tracing::info!(target = %target.display(), "view stopped");
        Ok(())
    }
}

/// Whether `pid` is a `mountgroup mount` serving `target` (and not a recycled pid).
fn is_view_process(pid: u32, target: &Path) -> bool {
    let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    args.get(1) == Some(&&b"mount"[..]) && args.contains(&target.as_os_str().as_encoded_bytes())
}
