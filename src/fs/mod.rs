//! The group view: a FUSE passthrough filesystem that presents a backing directory as
//! owned by a mount group without changing anything on disk.
//!
//! `view.rs` holds the presentation rules, `ops.rs` the operations, `fuse.rs` the thin
//! fuser adapter; this module checks a mount request and runs the session.

pub mod error;
pub mod fuse;
pub mod inode;
pub mod ops;
pub mod ratelimit;
pub mod record;
pub mod stats;
pub mod view;

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::config::{Passthrough, ViewOptions};
use crate::sys::Errno;
use crate::sys::signal::TerminationSignals;
use crate::sys::{file, xattr};

use self::view::Policy;

/// Why a view could not be mounted. Every variant names what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("source {}: {errno}", .path.display())]
    Source { path: PathBuf, errno: Errno },
    #[error("mountpoint {}: {errno}", .path.display())]
    Mountpoint { path: PathBuf, errno: Errno },
    #[error("mountpoint {} is not a directory", .0.display())]
    MountpointNotDir(PathBuf),
    #[error("mountpoint {} is busy: something is already mounted there", .0.display())]
    MountpointBusy(PathBuf),
    #[error(
        "mountpoint {p} is a dead FUSE mount (transport endpoint is not connected); clean it up with `umount -l {p}`",
        p = .0.display()
    )]
    MountpointDead(PathBuf),
    #[error(
        "source {}: the file system has no extended attributes ({errno}), which ownership=emulate needs to record chown and chmod; use ownership=off for CIFS-like \"success, no effect\"",
        .path.display()
    )]
    NoXattr { path: PathBuf, errno: Errno },
    #[error(
        "ownership=emulate keeps its records in trusted.* extended attributes and so needs root; use ownership=off"
    )]
    EmulateNeedsRoot,
    #[error("cannot mount {} on {}: {source}", .src_path.display(), .mountpoint.display())]
    Mount {
        src_path: PathBuf,
        mountpoint: PathBuf,
        source: io::Error,
    },
    #[error(
        "cannot mount without root: /dev/fuse is not readable and writable by this user ({errno}); run as root, or make /dev/fuse mode 0666 as most distributions do"
    )]
    DevFuse { errno: Errno },
    #[error("the FUSE session ended with an error: {0}")]
    Session(io::Error),
}

/// Checks that `path` can take a new mount: an existing directory with nothing
/// mounted on it (a dead FUSE mount is named as such).
///
/// # Errors
/// The [`MountError`] naming the problem.
pub fn check_mountpoint(path: &Path) -> Result<(), MountError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(MountError::MountpointDead(path.into()));
        }
        Err(e) => {
            return Err(MountError::Mountpoint {
                path: path.into(),
                errno: Errno::from_io(&e),
            });
        }
    };
    if !meta.is_dir() {
        return Err(MountError::MountpointNotDir(path.into()));
    }
    match crate::sys::mount::is_mount_point(path) {
        Ok(true) => Err(MountError::MountpointBusy(path.into())),
        Ok(false) => Ok(()),
        Err(Errno::ENOTCONN) => Err(MountError::MountpointDead(path.into())),
        Err(errno) => Err(MountError::Mountpoint {
            path: path.into(),
            errno,
        }),
    }
}

/// Opens the source and checks that it can carry the view `options` ask for.
///
/// # Errors
/// The [`MountError`] naming the problem.
pub fn open_source(source: &Path, options: &ViewOptions) -> Result<OwnedFd, MountError> {
    let err = |errno| MountError::Source {
        path: source.into(),
        errno,
    };
    let root = file::open_root(source).map_err(err)?;
    let policy = Policy::from_options(options);
    if policy.keeps_records() {
        if !crate::sys::process::is_root() {
            return Err(MountError::EmulateNeedsRoot);
        }
        match xattr::get(root.as_fd(), record::RECORD_XATTR) {
            Ok(_) => {}
            Err(errno @ (Errno::EOPNOTSUPP | Errno::ENOSYS)) => {
                return Err(MountError::NoXattr {
                    path: source.into(),
                    errno,
                });
            }
            Err(errno) => return Err(err(errno)),
        }
    }
    Ok(root)
}

/// The fuser configuration of a view.
pub fn session_config(source: &Path, options: &ViewOptions) -> ::fuser::Config {
    use ::fuser::MountOption as M;
    let mut cfg = ::fuser::Config::default();
    cfg.mount_options = vec![
        M::FSName(source.display().to_string()),
        M::Subtype("mountgroup".into()),
        M::NoDev,
        M::NoSuid,
    ];
    if options.kernel_permission_checks() {
        cfg.mount_options.push(M::DefaultPermissions);
    }
    cfg.mount_options
        .push(if options.readonly { M::RO } else { M::RW });
    if options.noexec {
        cfg.mount_options.push(M::NoExec);
    }
    // Pods run as users other than the daemon's.
    cfg.acl = ::fuser::SessionACL::All;
    cfg.n_threads = Some(options.threads);
    cfg.clone_fd = true;
    cfg
}

/// Builds the FUSE filesystem for a checked source.
///
/// # Errors
/// The [`MountError`] naming the problem.
pub fn build(
    source: &Path,
    root: OwnedFd,
    options: &ViewOptions,
) -> Result<fuse::FuseView, MountError> {
    let fs = ops::ViewFs::new(root, options).map_err(|e| MountError::Source {
        path: source.into(),
        errno: Errno(e.errno()),
    })?;
    Ok(fuse::FuseView::new(
        fs,
        options.passthrough,
        options.attr_timeout,
        options.entry_timeout,
    ))
}

/// Unmounts a view on drop (and on request), lazily: the mount leaves the namespace at
/// once and the session ends when the last user lets go.
enum Unmounter {
    /// A mount this process made with `mount(2)`.
    Own(PathBuf),
    /// A mount fuser made through fusermount (unprivileged use).
    Fuser(::fuser::SessionUnmounter),
}

impl Unmounter {
    fn unmount(&mut self) {
        match self {
            Unmounter::Own(path) => match crate::sys::mount::unmount_lazy(path) {
                Ok(()) | Err(Errno::EINVAL | Errno::ENOENT) => {}
                Err(e) => {
                    tracing::warn!(mountpoint = %path.display(), error = %e, "unmount failed")
                }
            },
            Unmounter::Fuser(u) => {
                if let Err(e) = u.unmount() {
                    tracing::warn!(error = %e, "unmount failed");
                }
            }
        }
    }
}

/// Lazily unmounts a mount this process made when dropped (a failed handshake, a
/// session that ended with an error): a view never outlives its daemon.
struct OwnMountGuard(PathBuf);

impl Drop for OwnMountGuard {
    fn drop(&mut self) {
        Unmounter::Own(self.0.clone()).unmount();
    }
}

fn absolute(path: &Path, what: fn(PathBuf, Errno) -> MountError) -> Result<PathBuf, MountError> {
    std::fs::canonicalize(path).map_err(|e| what(path.into(), Errno::from_io(&e)))
}

/// Mounts a view of `source` on `mountpoint` and serves it in the foreground until
/// SIGINT or SIGTERM (then unmounts, lazily if the view is busy) or until something
/// else unmounts it.
///
/// As root the mount is made directly (type `fuse.mountgroup`); otherwise through
/// fusermount3, where `allow_other` needs `user_allow_other` in /etc/fuse.conf.
/// Sets the process umask to 0: the kernel applied the caller's umask already.
///
/// # Errors
/// The [`MountError`] naming why the view could not be mounted or served.
pub fn run_foreground(
    source: &Path,
    mountpoint: &Path,
    options: &ViewOptions,
    metrics_file: Option<&Path>,
) -> Result<(), MountError> {
    let root = open_source(source, options)?;
    check_mountpoint(mountpoint)?;
    let source = absolute(source, |path, errno| MountError::Source { path, errno })?;
    let mountpoint = absolute(mountpoint, |path, errno| MountError::Mountpoint {
        path,
        errno,
    })?;
    let mount_err = |e: io::Error| MountError::Mount {
        src_path: source.clone(),
        mountpoint: mountpoint.clone(),
        source: e,
    };
    let as_root = crate::sys::process::is_root();
    if options.passthrough == Passthrough::On && !as_root {
        return Err(mount_err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "passthrough=on needs root",
        )));
    }
    // Before the view sizes its descriptor cache from it.
    let nofile = crate::sys::process::raise_nofile_limit();
    tracing::debug!(nofile, "open-file limit");
    let view = build(&source, root, options)?;
    let stats = view.stats();
    // Block termination signals before fuser spawns its workers, so that only the
    // waiting thread below ever sees them.
    let signals = TerminationSignals::block()
        .map_err(|e| MountError::Session(io::Error::from_raw_os_error(e.raw())))?;
    file::set_umask(0);
    let cfg = session_config(&source, options);
    let fsname = source.display().to_string();
    let (session, mut unmounter, _guard) = if as_root {
        let how = crate::sys::mount::FuseMount {
            default_permissions: options.kernel_permission_checks(),
            allow_other: true,
            readonly: options.readonly,
            noexec: options.noexec,
        };
        let dev = crate::sys::mount::mount_fuse(&fsname, &mountpoint, "mountgroup", how)
            .map_err(|e| mount_err(io::Error::from_raw_os_error(e.raw())))?;
        let guard = OwnMountGuard(mountpoint.clone());
        let session =
            ::fuser::Session::from_fd(view, dev, cfg.acl, cfg.clone()).map_err(mount_err)?;
        (session, Unmounter::Own(mountpoint.clone()), Some(guard))
    } else {
        // fuser opens /dev/fuse itself before fusermount3 mounts it: name the device
        // rather than answer a bare "Permission denied".
        crate::sys::file::check_read_write(Path::new("/dev/fuse"))
            .map_err(|errno| MountError::DevFuse { errno })?;
        let mut session = ::fuser::Session::new(view, &mountpoint, &cfg).map_err(mount_err)?;
        let u = Unmounter::Fuser(session.unmount_callable());
        (session, u, None)
    };
    tracing::info!(
        source = %source.display(),
        mountpoint = %mountpoint.display(),
        options = %options.to_option_string(),
        "mounted"
    );
    if let Some(path) = metrics_file {
        // The driver reads this snapshot for its metrics endpoint (fs/stats.rs); one
        // small file write a second.
        let (path, stats) = (path.to_path_buf(), std::sync::Arc::clone(&stats));
        std::thread::Builder::new()
            .name("mountgroup-stats".into())
            .spawn(move || {
                loop {
                    if let Err(e) = stats.write_snapshot(&path) {
                        tracing::debug!(error = %e, "cannot write the metrics snapshot");
                    }
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
            })
            .map_err(MountError::Session)?;
    }
    std::thread::Builder::new()
        .name("mountgroup-signals".into())
        .spawn(move || {
            if let Ok(sig) = signals.wait() {
                tracing::info!(signal = crate::sys::signal::name(sig), "unmounting");
                unmounter.unmount();
            }
        })
        .map_err(MountError::Session)?;
    session.run().map_err(MountError::Session)?;
    if let Some(path) = metrics_file {
        let _ = std::fs::remove_file(path);
    }
    tracing::info!(mountpoint = %mountpoint.display(), "unmounted");
    Ok(())
}
