//! Extended attributes of an inode reached through a descriptor, never a path.
//!
//! The calls go through the descriptor's own `/proc/self/fd/N` magic link, which names
//! exactly that inode (see [`super::procfd`]). A read resolves only `N`, beneath an open
//! `/proc/self/fd`, with `getxattrat(2)` (Linux 6.13; the full path elsewhere): with
//! `AT_EMPTY_PATH` that call refuses an `O_PATH` descriptor (`EBADF`), and the inode
//! table's descriptors are all `O_PATH`.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::XattrFlags;

use super::procfd::{ProcPath, proc_fd_dir};
use super::{Errno, SysResult, failed};

static GETXATTRAT_MISSING: AtomicBool = AtomicBool::new(false);

/// `getxattrat(dir, name, 0, attr)`: the value of `attr` of what `name` beneath `dir`
/// resolves to (following a final magic link). `Err(ENOSYS)` before Linux 6.13.
fn getxattrat(dir: BorrowedFd<'_>, path: &CStr, attr: &CStr, buf: &mut [u8]) -> SysResult<usize> {
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
    // SAFETY: getxattrat reads the NUL-terminated `path` and `attr` and writes at most
    // `args.size` bytes to `args.value`, which points into `buf`; all of them outlive
    // the call. `args` is passed with its exact size.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::syscall(
            SYS_GETXATTRAT,
            dir.as_raw_fd(),
            path.as_ptr(),
            0 as libc::c_uint,
            attr.as_ptr(),
            &mut args as *mut XattrArgs,
            std::mem::size_of::<XattrArgs>(),
        )
    };
    if rc < 0 {
        return Err(failed("getxattrat")(std::io::Error::last_os_error()));
    }
    Ok(rc as usize)
}

/// The first, one-call read of [`get`] into `buf`.
fn get_small(path: &ProcPath, name: &CStr, buf: &mut [u8]) -> SysResult<usize> {
    if let Some(dir) = proc_fd_dir().filter(|_| !GETXATTRAT_MISSING.load(Ordering::Relaxed)) {
        match getxattrat(dir, path.name(), name, buf) {
            Err(Errno::ENOSYS) => GETXATTRAT_MISSING.store(true, Ordering::Relaxed),
            r => return r,
        }
    }
    rustix::fs::getxattr(path.as_cstr(), name, buf).map_err(failed("getxattr"))
}

/// Values up to this size are read in one call; larger ones take a size query first.
/// Ownership records are far smaller.
const FIRST_TRY: usize = 256;

/// Reads an extended attribute of the inode (any kind, symlinks included).
/// Returns `Ok(None)` when the attribute does not exist.
///
/// One system call when the value is absent or small (every ownership record), so a
/// lookup pays one call for its record.
///
/// # Errors
/// The error of `getxattr(2)` other than `ENODATA`.
pub fn get(fd: BorrowedFd<'_>, name: &CStr) -> SysResult<Option<Vec<u8>>> {
    let path = ProcPath::new(fd);
    let mut small = [0u8; FIRST_TRY];
    match get_small(&path, name, &mut small) {
        Ok(n) => return Ok(Some(small[..n].to_vec())),
        Err(Errno::ENODATA) => return Ok(None),
        Err(Errno::ERANGE) => {}
        Err(e) => return Err(e),
    }
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

/// Lists of names up to this size are read in one call, with a buffer: the NFS client
/// keeps a list only when it was asked for with one (fs/nfs/nfs4proc.c
/// `nfs4_listxattr_nfs4_user`).
const LIST_FIRST_TRY: usize = 1024;

/// Whether the inode has an extended attribute named `name`, from the list of its
/// names rather than a read of the value. On NFS a list costs the server less than a
/// read that finds nothing: the client keeps the list, where it keeps no answer that a
/// name is absent (fs/nfs/nfs42xattr.c), and the kernel checks no permission before a
/// list (`vfs_listxattr`), where a read of a `user.` name needs read permission,
/// which the client asks the server for (fs/xattr.c `xattr_permission`).
///
/// # Errors
/// The error of `listxattr(2)`.
pub fn has(fd: BorrowedFd<'_>, name: &CStr) -> SysResult<bool> {
    let path = ProcPath::new(fd);
    let mut small = [0u8; LIST_FIRST_TRY];
    let named = |all: &[u8]| all.split(|b| *b == 0).any(|n| n == name.to_bytes());
    match rustix::fs::listxattr(path.as_cstr(), &mut small[..]) {
        Ok(n) => Ok(named(&small[..n])),
        Err(rustix::io::Errno::RANGE) => Ok(named(&list(fd)?)),
        Err(e) => Err(failed("listxattr")(e)),
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

/// Whether extended attributes named `name` can be written on the inode of `fd`: sets
/// `name` (empty) and removes it again. A read proves nothing: the CIFS client answers
/// `ENODATA` for a name on a server without extended attributes, and refuses the write.
///
/// # Errors
/// What `setxattr` said (`EOPNOTSUPP` where the file system keeps no such names).
pub fn probe(fd: BorrowedFd<'_>, name: &CStr) -> SysResult<()> {
    set(fd, name, b"", 0)?;
    // Two probes at once: the other one may have removed it.
    match remove(fd, name) {
        Ok(()) | Err(Errno::ENODATA) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::file;
    use std::os::fd::{AsFd, OwnedFd};

    /// An empty file in a new temporary directory, reached by an `O_PATH` descriptor.
    fn a_file() -> (tempfile::TempDir, OwnedFd) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"").unwrap();
        let root = file::open_root(dir.path()).unwrap();
        let f = file::open_child(root.as_fd(), std::ffi::OsStr::new("f"), None).unwrap();
        (dir, f)
    }

    #[test]
    fn values_of_every_size_read_back_whole_through_an_o_path_descriptor() {
        let (_dir, f) = a_file();
        assert_eq!(get(f.as_fd(), c"user.absent").unwrap(), None);
        for len in [0, 1, FIRST_TRY - 1, FIRST_TRY, FIRST_TRY + 1, 4000] {
            let value: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            set(f.as_fd(), c"user.v", &value, 0).unwrap();
            assert_eq!(
                get(f.as_fd(), c"user.v").unwrap(),
                Some(value),
                "{len} bytes"
            );
        }
    }

    #[test]
    fn a_name_is_found_in_lists_longer_than_the_first_try() {
        let (_dir, f) = a_file();
        assert!(!has(f.as_fd(), c"user.wanted").unwrap());
        set(f.as_fd(), c"user.wanted", b"1", 0).unwrap();
        assert!(has(f.as_fd(), c"user.wanted").unwrap());
        assert!(
            !has(f.as_fd(), c"user.want").unwrap(),
            "a prefix is not the name"
        );
        // Names before it past the first read's buffer: the list is read whole.
        for i in 0..LIST_FIRST_TRY / 64 + 1 {
            let name = std::ffi::CString::new(format!("user.{i:0>58}")).unwrap();
            set(f.as_fd(), &name, b"", 0).unwrap();
        }
        assert!(list(f.as_fd()).unwrap().len() > LIST_FIRST_TRY);
        assert!(has(f.as_fd(), c"user.wanted").unwrap());
        assert!(!has(f.as_fd(), c"user.absent").unwrap());
    }
}
