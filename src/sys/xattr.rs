//! Extended attributes of an inode reached through a descriptor, never a path.
//!
//! `getxattrat(2)` (Linux 6.13) works on the descriptor itself; elsewhere the call goes
//! through the descriptor's own `/proc/self/fd/N` magic link, which names exactly that
//! inode (see [`super::file`]).

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::XattrFlags;

use super::file::ProcPath;
use super::{Errno, SysResult, failed};

static GETXATTRAT_MISSING: AtomicBool = AtomicBool::new(false);

/// `getxattrat(2)` (Linux 6.13) on the descriptor itself (`AT_EMPTY_PATH`): no
/// `/proc` path to resolve. `Err(ENOSYS)` on older kernels.
fn getxattrat(fd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> SysResult<usize> {
    /// `struct xattr_args` of the uapi.
    #[repr(C)]
    struct XattrArgs {
        value: u64,
        size: u32,
        flags: u32,
    }
    // Syscall numbers from 424 on are the same on every architecture.
    const SYS_GETXATTRAT: libc::c_long = 464;
    let mut args = XattrArgs {
        value: buf.as_mut_ptr() as u64,
        size: u32::try_from(buf.len()).unwrap_or(u32::MAX),
        flags: 0,
    };
    // SAFETY: getxattrat reads the NUL-terminated `name` and the empty path, and
    // writes at most `args.size` bytes to `args.value`, which points into `buf`; all
    // of them outlive the call. `args` is passed with its exact size.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::syscall(
            SYS_GETXATTRAT,
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            name.as_ptr(),
            &mut args as *mut XattrArgs,
            std::mem::size_of::<XattrArgs>(),
        )
    };
    if rc < 0 {
        return Err(failed("getxattrat")(std::io::Error::last_os_error()));
    }
    Ok(rc as usize)
}

/// Reads an extended attribute of the inode (any kind, symlinks included).
/// Returns `Ok(None)` when the attribute does not exist.
///
/// # Errors
/// The error of `getxattr(2)` other than `ENODATA`.
pub fn get(fd: BorrowedFd<'_>, name: &CStr) -> SysResult<Option<Vec<u8>>> {
    if !GETXATTRAT_MISSING.load(Ordering::Relaxed) {
        // Records are small: one call with a buffer that fits them answers most lookups.
        let mut buf = vec![0u8; 64];
        match getxattrat(fd, name, &mut buf) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(Some(buf));
            }
            Err(Errno::ENODATA) => return Ok(None),
            Err(Errno::ENOSYS) => GETXATTRAT_MISSING.store(true, Ordering::Relaxed),
            // Larger values, and anything unexpected: the path-based call below.
            Err(_) => {}
        }
    }
    let path = ProcPath::new(fd);
    loop {
        let size = match rustix::fs::getxattr_query(path.as_cstr(), name) {
            Ok(n) => n,
            Err(rustix::io::Errno::NODATA) => return Ok(None),
            Err(e) => return Err(failed("getxattr")(e)),
        };
        let mut buf = vec![0u8; size];
        match rustix::fs::getxattr(path.as_cstr(), name, &mut buf[..]) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(Some(buf));
            }
            Err(rustix::io::Errno::NODATA) => return Ok(None),
            // The value grew between the two calls: ask again.
            Err(rustix::io::Errno::RANGE) => continue,
            Err(e) => return Err(failed("getxattr")(e)),
        }
    }
}

/// Lists the extended attribute names of the inode, NUL-separated as the kernel gives.
///
/// # Errors
/// The error of `listxattr(2)`.
pub fn list(fd: BorrowedFd<'_>) -> SysResult<Vec<u8>> {
    let path = ProcPath::new(fd);
    loop {
        let size =
            rustix::fs::listxattr_query(path.as_cstr()).map_err(failed("listxattr_query"))?;
        let mut buf = vec![0u8; size];
        match rustix::fs::listxattr(path.as_cstr(), &mut buf[..]) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(rustix::io::Errno::RANGE) => continue,
            Err(e) => return Err(failed("listxattr")(e)),
        }
    }
}

/// Sets an extended attribute; `flags` are `XATTR_CREATE`/`XATTR_REPLACE`.
///
/// # Errors
/// The error of `setxattr(2)`.
pub fn set(fd: BorrowedFd<'_>, name: &CStr, value: &[u8], flags: u32) -> SysResult<()> {
    let path = ProcPath::new(fd);
    let flags = XattrFlags::from_bits(flags).ok_or(Errno::EINVAL)?;
    rustix::fs::setxattr(path.as_cstr(), name, value, flags).map_err(failed("setxattr"))
}

/// Removes an extended attribute.
///
/// # Errors
/// The error of `removexattr(2)` (`ENODATA` when absent).
pub fn remove(fd: BorrowedFd<'_>, name: &CStr) -> SysResult<()> {
    let path = ProcPath::new(fd);
    rustix::fs::removexattr(path.as_cstr(), name).map_err(failed("removexattr"))
}
