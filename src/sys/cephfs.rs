//! CephFS's virtual extended attributes: a directory's quota and the bytes the MDS
//! accounts beneath it.

use std::os::fd::BorrowedFd;

use super::{Errno, SysResult};

/// A CephFS directory's quota (`ceph.quota.max_bytes`, 0: none).
pub const CEPH_QUOTA_MAX_BYTES: &std::ffi::CStr = c"ceph.quota.max_bytes";
/// A CephFS directory's recursive size, as the MDS accounts it.
pub const CEPH_DIR_RBYTES: &std::ffi::CStr = c"ceph.dir.rbytes";

/// A number a CephFS virtual extended attribute of `fd` holds (decimal text, at times
/// with a trailing NUL); 0 where it is empty.
///
/// # Errors
/// The error of `getxattr`, or `EINVAL` for a value that is not a number.
pub fn ceph_number(fd: BorrowedFd<'_>, name: &std::ffi::CStr) -> SysResult<u64> {
    let value = super::xattr::get(fd, name)?.unwrap_or_default();
    let text = String::from_utf8_lossy(&value);
    let text = text.trim_end_matches('\0').trim();
    if text.is_empty() {
        return Ok(0);
    }
    text.parse().map_err(|_| Errno(libc::EINVAL))
}

/// The quota of the CephFS directory `fd` and the bytes it holds: `None` where it has
/// no quota. The kernel client's statfs reports the quota of its mount's root, not of
/// a directory below it, so a view of a volume asks its own.
///
/// # Errors
/// The error of `getxattr`.
pub fn ceph_quota(fd: BorrowedFd<'_>) -> SysResult<Option<(u64, u64)>> {
    let limit = ceph_number(fd, CEPH_QUOTA_MAX_BYTES)?;
    if limit == 0 {
        return Ok(None);
    }
    Ok(Some((limit, ceph_number(fd, CEPH_DIR_RBYTES)?)))
}
