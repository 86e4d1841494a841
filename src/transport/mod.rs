//! How a view process runs a FUSE connection: the only code that sees fuser. It
//! checks a mount request, mounts (or takes a live connection over, or recovers one),
//! serves the requests with `fuse.rs`, the thin adapter onto the filesystem in
//! `crate::fs`, hands the connection to a successor (`handover.rs`), keeps the
//! filesystem's journal with a keeper, and counts what it serves (`stats.rs`).
//!
//! It depends on `crate::fs`, never the other way: the filesystem does not know how
//! requests reach it.

pub mod fuse;
pub mod handover;
pub mod negotiate;
pub mod probe;
pub mod ratelimit;
pub mod ring;
mod run;
pub mod stats;

pub use run::run_foreground;

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::config::{Passthrough, Transport, ViewOptions};
use crate::sys::Errno;
use crate::sys::signal::TerminationSignals;
use crate::sys::{file, xattr};

use crate::fs::view::Policy;
use crate::fs::{journal, ops, record};

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
        "source {}: the file system keeps no extended attributes {name} ({errno}), which ownership={ownership} needs to record chown and chmod; use ownership=emulate-user where it keeps user.* ones (NFS 4.2, SMB with extended attributes), or ownership=off for CIFS-like \"success, no effect\"",
        .path.display()
    )]
    NoXattr {
        path: PathBuf,
        name: String,
        ownership: &'static str,
        errno: Errno,
    },
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
    #[error("cannot take over the view on {}: {source}", .mountpoint.display())]
    Takeover {
        mountpoint: PathBuf,
        source: handover::HandoverError,
    },
    #[error(
        "option `context=` labels files for SELinux, which is not enabled on this machine (kubelet sends it only on SELinux nodes)"
    )]
    NoSelinux,
    #[error(
        "option `context={0}`: this node's SELinux policy has no such context (a type, role, user or level it does not define); the container runtime's policy (container-selinux) defines the label kubelet sends"
    )]
    UnknownSelinuxContext(String),
    #[error("transport=ring: {0}")]
    Ring(String),
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
    if let Some(name) = record::record_xattr(options.ownership)
        .filter(|_| Policy::from_options(options).keeps_records())
    {
        if !crate::sys::process::is_root() {
            return Err(MountError::EmulateNeedsRoot);
        }
        match keeps_records(root.as_fd(), name, options.readonly) {
            Ok(()) => {}
            Err(errno @ (Errno::EOPNOTSUPP | Errno::ENOSYS)) => {
                return Err(MountError::NoXattr {
                    path: source.into(),
                    name: name.to_string_lossy().into_owned(),
                    ownership: options.ownership_name(),
                    errno,
                });
            }
            Err(errno) => return Err(err(errno)),
        }
    }
    Ok(root)
}

/// Whether the directory `root` keeps records named `name` (a record xattr): a view
/// that writes them probes by writing one of their namespace; a read-only view, or
/// one whose daemon may not write there (a squashed daemon's), reads them.
///
/// # Errors
/// `EOPNOTSUPP` (or `ENOSYS`) where the file system keeps no such attributes, else the
/// error of the probe.
pub fn keeps_records(
    root: std::os::fd::BorrowedFd<'_>,
    name: &std::ffi::CStr,
    readonly: bool,
) -> Result<(), Errno> {
    let read = || xattr::get(root, name).map(|_| ());
    if readonly {
        return read();
    }
    match xattr::probe(root, record::probe_xattr(name)) {
        Err(Errno::EACCES | Errno::EPERM) => read(),
        other => other,
    }
}

/// The options a view answers a takeover with: its own, and `checks=share` where the
/// share checks permissions (`ViewFs::share_checks`). A view mounted with
/// `default_permissions` and one without differ in what the kernel checks, which a
/// successor cannot change: a takeover between them (a daemon of another version) is
/// refused, and the view keeps serving.
fn identity_options(options: &ViewOptions, share_checks: bool) -> String {
    let mut s = options.to_option_string();
    if share_checks {
        s.push_str(",checks=share");
    }
    s
}

/// The fuser configuration of a view.
pub fn session_config(
    source: &Path,
    options: &ViewOptions,
    kernel_checks: bool,
) -> ::fuser::Config {
    use ::fuser::MountOption as M;
    let mut cfg = ::fuser::Config::default();
    cfg.mount_options = vec![
        M::FSName(options.fsname_for(source)),
        M::Subtype("mountgroup".into()),
        M::NoDev,
        M::NoSuid,
    ];
    if kernel_checks {
        cfg.mount_options.push(M::DefaultPermissions);
    }
    // Through fusermount3 (unprivileged use), which knows the VFS flags by name.
    let flags = options.vfs_flags();
    if !flags.contains(&"ro") {
        cfg.mount_options.push(M::RW);
    }
    cfg.mount_options
        .extend(flags.into_iter().map(|name| match name {
            "ro" => M::RO,
            "noexec" => M::NoExec,
            "noatime" => M::NoAtime,
            "sync" => M::Sync,
            "dirsync" => M::DirSync,
            other => M::CUSTOM(other.into()),
        }));
    // Pods run as users other than the daemon's.
    cfg.acl = ::fuser::SessionACL::All;
    cfg.n_threads = Some(if options.transport == Transport::Ring {
        // Over a ring, `/dev/fuse` carries only FORGET and INTERRUPT (ring.rs).
        1
    } else {
        options.threads
    });
    cfg.clone_fd = true;
    cfg.read_buffer_size = Some(fuse::READ_BUFFER);
    if options.transport != Transport::Ring {
        cfg.max_threads = Some(options.max_threads());
    }
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
    // Over the SMB client the files the view creates are served by the view while
    // their creators hold them (`FuseView::serve_creates`): the kernel's own
    // passthrough open of a new file costs the server a CREATE per create there, and
    // failed creates with O_EXCL. Not over NFS, where that open costs an ACCESS that,
    // spared at the create, the first read of the file's record asks instead, while
    // the new file's data would go through the view (docs/BENCHMARKS.md, *At a
    // distance*). Everything else uses passthrough as anywhere: three interleaved
    // rounds on an Azure-like share put its reads and writes at 0.93-1.13 of the raw
    // mount, against 0.04-0.83 through the view (docs/BENCHMARKS.md).
    let smb = crate::sys::file::is_smb(root.as_fd());
    let fs = ops::ViewFs::new(root, options).map_err(|e| MountError::Source {
        path: source.into(),
        errno: Errno(e.errno()),
    })?;
    // Where the share checks permissions, the kernel checks none, and keeps no name in
    // a directory that not every caller may search (`ViewFs::share_checks`).
    if fs.share_checks() {
        tracing::info!(
            "the view acts as its callers on NFS, whose server checks their permissions: mounted without default_permissions; the kernel keeps no name in a directory that not every caller may search, so that each such name is looked up as its caller, and the client and server check it as on the raw mount"
        );
    }
    let kernel_checks = fs.kernel_checks();
    Ok(fuse::FuseView::new(
        fs,
        options.passthrough,
        kernel_checks,
        options.attr_timeout,
        options.entry_timeout,
    )
    .serve_creates(smb))
}

/// Unmounts a view on drop (and on request), lazily: the mount leaves the namespace at
/// once and the session ends when the last user lets go.
enum Unmounter {
    /// A mount this process made with `mount(2)`, or adopted with its connection.
    Own(OwnMount),
    /// A mount fuser made through fusermount (unprivileged use).
    Fuser(::fuser::SessionUnmounter),
}

/// A mount this process serves, known by its connection and its device, never by its
/// path alone: the path names whatever is mounted there now.
#[derive(Clone)]
struct OwnMount {
    path: PathBuf,
    /// The connection: while it is connected, the superblock lives and keeps its
    /// device number, which no other mount can then have.
    dev: Arc<OwnedFd>,
    /// The device of the mount, read from the mount table when it was made or adopted.
    device: Option<(u32, u32)>,
}

impl OwnMount {
    /// `dev` serves the mount at `path` now (it was just mounted, or adopted).
    fn new(path: &Path, dev: &Arc<OwnedFd>) -> OwnMount {
        let device = crate::sys::mount::mount_device(path).ok().flatten();
        if device.is_none() {
            tracing::warn!(mountpoint = %path.display(), "the view's mount is not in the mount table; it will not be unmounted by this process");
        }
        OwnMount {
            path: path.to_path_buf(),
            dev: Arc::clone(dev),
            device,
        }
    }

    /// Unmounts the mount if it is still this process's and still at its path. A
    /// connection that has ended (the mount was unmounted and released by someone
    /// else) leaves nothing to unmount: its device may belong to a new mount by now,
    /// and the path to a successor (xfstests generic/610, 611).
    fn unmount(&self) {
        if !crate::sys::fuse::connected(self.dev.as_fd()) {
            tracing::debug!(mountpoint = %self.path.display(), "the connection has ended: nothing of this view is mounted");
            return;
        }
        let Some(device) = self.device else {
            return;
        };
        match crate::sys::mount::unmount_if_device(&self.path, device) {
            Ok(true) => {}
            Ok(false) => tracing::info!(
                mountpoint = %self.path.display(),
                "the view's mount is no longer at its mount point (unmounted, or covered); leaving what is there"
            ),
            Err(e) => {
                tracing::warn!(mountpoint = %self.path.display(), error = %e, "unmount failed")
            }
        }
    }
}

impl Unmounter {
    fn unmount(&mut self) {
        match self {
            Unmounter::Own(m) => m.unmount(),
            Unmounter::Fuser(u) => {
                if let Err(e) = u.unmount() {
                    tracing::warn!(error = %e, "unmount failed");
                }
            }
        }
    }
}

/// Lazily unmounts a mount this process made when dropped (a failed handshake, a
/// session that ended with an error): a view never outlives its daemon. Only its own
/// mount, and only while its connection lives ([`OwnMount::unmount`]).
struct OwnMountGuard(Option<OwnMount>);

impl OwnMountGuard {
    fn new(own: &OwnMount) -> OwnMountGuard {
        OwnMountGuard(Some(own.clone()))
    }

    /// The mount is no longer this guard's to unmount (served on, or another's).
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for OwnMountGuard {
    fn drop(&mut self) {
        if let Some(own) = &self.0 {
            own.unmount();
        }
    }
}

fn absolute(path: &Path, what: fn(PathBuf, Errno) -> MountError) -> Result<PathBuf, MountError> {
    std::fs::canonicalize(path).map_err(|e| what(path.into(), Errno::from_io(&e)))
}

/// The absolute path of `path` without touching its last component (a mountpoint
/// whose server is gone would not answer).
fn absolute_untouched(path: &Path) -> Result<PathBuf, MountError> {
    let err = |errno| MountError::Mountpoint {
        path: path.into(),
        errno,
    };
    let name = path.file_name().ok_or(err(Errno::EINVAL))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let parent = std::fs::canonicalize(parent).map_err(|e| err(Errno::from_io(&e)))?;
    Ok(parent.join(name))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
