//! Mount-table questions and lazy unmount.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, StatxAttributes, StatxFlags};

use super::SysResult;

/// Whether `path` is the root of a mount (`STATX_ATTR_MOUNT_ROOT`).
///
/// A FUSE mount whose daemon died answers `ENOTCONN`; that is reported as an error so
/// that the caller can name it.
///
/// # Errors
/// The error of `statx(2)`.
pub fn is_mount_point(path: &Path) -> SysResult<bool> {
    let sx = rustix::fs::statx(
        rustix::fs::CWD,
        path,
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS,
    )?;
    let mask = sx.stx_attributes_mask;
    let attrs = sx.stx_attributes;
    if mask.contains(StatxAttributes::MOUNT_ROOT) {
        return Ok(attrs.contains(StatxAttributes::MOUNT_ROOT));
    }
    // Kernels before 5.8: compare the device with the parent's.
    let parent = path.parent().unwrap_or(Path::new("/"));
    let p = rustix::fs::statx(
        rustix::fs::CWD,
        parent,
        AtFlags::empty(),
        StatxFlags::BASIC_STATS,
    )?;
    Ok((p.stx_dev_major, p.stx_dev_minor) != (sx.stx_dev_major, sx.stx_dev_minor))
}

/// Lazily unmounts `path` (`umount2(MNT_DETACH)`): the mount disappears from the
/// namespace at once and is released when the last user lets go.
///
/// # Errors
/// The error of `umount2(2)`.
pub fn unmount_lazy(path: &Path) -> SysResult<()> {
    Ok(rustix::mount::unmount(
        path,
        rustix::mount::UnmountFlags::DETACH,
    )?)
}

/// How a FUSE mount is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FuseMount {
    /// The kernel checks permissions against the attributes the daemon reports.
    pub default_permissions: bool,
    /// Users other than the daemon's may enter the mount.
    pub allow_other: bool,
    pub readonly: bool,
    pub noexec: bool,
}

/// Opens `/dev/fuse` and mounts it on `mountpoint` as type `fuse.<subtype>` with
/// `nosuid,nodev` always, returning the connection. Needs `CAP_SYS_ADMIN`.
///
/// # Errors
/// The error of opening `/dev/fuse` or of `mount(2)`.
pub fn mount_fuse(
    source: &str,
    mountpoint: &Path,
    subtype: &str,
    how: FuseMount,
) -> SysResult<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    use rustix::mount::MountFlags;
    let dev = rustix::fs::open("/dev/fuse", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())?;
    let root = rustix::fs::stat(mountpoint)?;
    let mut data = format!(
        "fd={},rootmode={:o},user_id={},group_id={}",
        dev.as_raw_fd(),
        root.st_mode & libc::S_IFMT,
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    );
    if how.default_permissions {
        data.push_str(",default_permissions");
    }
    if how.allow_other {
        data.push_str(",allow_other");
    }
    let mut flags = MountFlags::NOSUID | MountFlags::NODEV;
    if how.readonly {
        flags |= MountFlags::RDONLY;
    }
    if how.noexec {
        flags |= MountFlags::NOEXEC;
    }
    let data = std::ffi::CString::new(data).map_err(|_| super::Errno::EINVAL)?;
    let fstype = format!("fuse.{subtype}");
    rustix::mount::mount(source, mountpoint, fstype.as_str(), flags, data.as_c_str())?;
    Ok(dev)
}
