//! Published views run as processes of their own (`mountgroup mount`), started by a
//! keeper (`volume/keeper.rs`: a container of its own, or one inside `serve`), so that
//! a view that panics or is killed takes no other view and not the gRPC server with
//! it, is recovered on its mount, and so that the driver can be restarted (even with
//! SIGKILL) while every view goes on serving.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::config::ViewOptions;
use crate::sys::mount::{self, Health};

use super::VolumeError;

/// The file system type of a view.
pub const VIEW_FSTYPE: &str = "fuse.mountgroup";

const START_TIMEOUT: Duration = Duration::from_secs(15);

/// Starts and stops view processes.
#[derive(Clone, Debug)]
pub struct Views {
    /// Where each view's log goes (`<hash of target>.log`).
    log_dir: PathBuf,
    /// Where views listen for a successor (`mountgroup mount --control-dir`).
    control_dir: PathBuf,
    /// The socket of the keeper that runs the views.
    keeper: PathBuf,
}

impl Views {
    /// # Errors
    /// [`VolumeError::Internal`] if the log directory cannot be made.
    pub fn new(
        log_dir: PathBuf,
        control_dir: PathBuf,
        keeper: PathBuf,
    ) -> Result<Views, VolumeError> {
        fs::create_dir_all(&log_dir).map_err(|e| {
            VolumeError::Internal(format!("log directory {}: {e}", log_dir.display()))
        })?;
        Ok(Views {
            log_dir,
            control_dir,
            keeper,
        })
    }

    /// The log file of the view at `target`.
    pub fn log_path(&self, target: &Path) -> PathBuf {
        self.log_dir.join(format!("{}.log", Self::key(target)))
    }

    /// The metrics snapshot the view at `target` writes (transport/stats.rs).
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
        let start_of_this_run = fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
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
        let socket = &self.keeper;
        let pid = match super::keeper::ask(socket, &super::keeper::Request::Start { args }) {
            Ok(super::keeper::Response::Started { pid }) => pid,
            Ok(other) => return Err(failed(format!("the keeper answered {other:?}"))),
            Err(e) => {
                return Err(failed(format!(
                    "the keeper at {} does not answer: {e}",
                    socket.display()
                )));
            }
        };
        let exited = || {
            matches!(
                super::keeper::ask(socket, &super::keeper::Request::Status { pid }),
                Ok(super::keeper::Response::Exited { .. } | super::keeper::Response::Unknown)
            )
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if mount::mount_type(target).ok().flatten().as_deref() == Some(VIEW_FSTYPE) {
                break;
            }
            // A view that does not mount in time is left to end when its target is
            // unmounted (the keeper's views are not signalled from here).
            if exited() || Instant::now() > deadline {
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
        // The keeper's number for it, in the keeper's PID namespace: recorded, never
        // signalled from here (see `stop`).
        tracing::info!(target = %target.display(), pid, "view serving");
        Ok(pid)
    }

    /// Stops the view at `target`: a lazy unmount, which ends the view's connection
    /// and so its process (a keeper's view has a pid of another PID namespace, never
    /// signalled from here). `pid` is the recorded one, for the log.
    ///
    /// # Errors
    /// [`VolumeError::Internal`] if the target stays mounted.
    pub fn stop(&self, target: &Path, pid: Option<u32>) -> Result<(), VolumeError> {
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
        tracing::info!(target = %target.display(), pid, "view stopped");
        Ok(())
    }
}
