//! Capacity enforced by CephFS: each volume's directory carries a quota
//! (`ceph.quota.max_bytes`, a virtual extended attribute the MDS keeps), which every
//! client of the file system enforces on every node, for root too: a write past it
//! fails with `EDQUOT`. Setting one needs the `p` flag in the client's MDS caps
//! (`allow rwp`); reading the quota and the directory's recursive size
//! (`ceph.dir.rbytes`) does not. Quotas are enforced by the clients, cooperatively and
//! with some lag (the CephFS documentation, *Quotas*): a burst can pass the limit by a
//! little before the MDS tells the clients.

use std::ffi::CStr;
use std::os::fd::AsFd;
use std::path::Path;

use super::ShareError;
use crate::sys::{Errno, file, xattr};

use crate::sys::file::{CEPH_DIR_RBYTES as RBYTES, CEPH_QUOTA_MAX_BYTES as MAX_BYTES};

/// Whether `path` is on CephFS.
pub fn is_cephfs(path: &Path) -> bool {
    file::open_root(path).is_ok_and(|fd| file::is_cephfs(fd.as_fd()))
}

fn number(path: &Path, name: &CStr) -> Result<u64, ShareError> {
    let failed = |errno| ShareError::Io {
        what: format!("{} of {}", name.to_string_lossy(), path.display()),
        errno,
    };
    let fd = file::open_root(path).map_err(failed)?;
    file::ceph_number(fd.as_fd(), name).map_err(failed)
}

/// Limits the directory at `path` to `bytes`.
///
/// # Errors
/// `EACCES` where the client's caps lack the `p` flag, named as such.
pub fn limit(path: &Path, bytes: u64) -> Result<(), ShareError> {
    let fd = file::open_root(path).map_err(|errno| ShareError::Io {
        what: format!("volume directory {}", path.display()),
        errno,
    })?;
    xattr::set(fd.as_fd(), MAX_BYTES, bytes.to_string().as_bytes(), 0).map_err(|errno| {
        if errno == Errno(libc::EACCES) || errno == Errno(libc::EPERM) {
            ShareError::Backend(format!(
                "setting the CephFS quota of {} was refused ({errno}): the node's CephFS client needs the p flag in its MDS caps (allow rwp; docs/CAPACITY.md)",
                path.display()
            ))
        } else {
            ShareError::Io {
                what: format!("CephFS quota of {}", path.display()),
                errno,
            }
        }
    })
}

/// Whether quotas can be set on the share: its `volumes` directory's own quota is
/// written back as it is (0, none, as a rule), which needs the same caps as a volume's.
///
/// # Errors
/// Why not.
pub fn can_limit(volumes: &Path) -> Result<(), ShareError> {
    limit(volumes, number(volumes, MAX_BYTES)?)
}

/// The quota of the directory at `path` in bytes (`None`: none, or unreadable).
pub fn limit_bytes(path: &Path) -> Option<u64> {
    number(path, MAX_BYTES).ok().filter(|b| *b > 0)
}

/// Bytes the directory at `path` holds, recursively.
pub fn used_bytes(path: &Path) -> Option<u64> {
    number(path, RBYTES).ok()
}
