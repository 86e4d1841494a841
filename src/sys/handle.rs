//! File handles: an inode named without a path and without holding it open
//! (`name_to_handle_at(2)`, `open_by_handle_at(2)`).

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use super::{SysResult, failed};

/// A file handle (`struct file_handle`): names an inode of one file system without a
/// path and without holding it open. Kept in memory only: a handle is never taken
/// from a caller, so it can only name an inode the view reached beneath its root.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct FileHandle {
    /// `struct file_handle`: `u32 handle_bytes`, `i32 handle_type`, then the bytes;
    /// stored as u32 words for the struct's alignment.
    words: Box<[u32]>,
}

impl std::fmt::Debug for FileHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FileHandle({} bytes)", self.words.len() * 4)
    }
}

impl FileHandle {
    /// The handle as the kernel laid it out (header words, then the bytes).
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// A handle from [`FileHandle::words`], as a view hands its table to the process
    /// that takes it over (a root process: the control socket checks). `None` unless the
    /// words are a complete handle of at most `MAX_HANDLE_SZ` bytes.
    pub fn from_words(words: &[u32]) -> Option<FileHandle> {
        let bytes = *words.first()? as usize;
        (words.len() >= 2 && bytes <= MAX_HANDLE_SZ && words.len() == 2 + bytes.div_ceil(4)).then(
            || FileHandle {
                words: words.into(),
            },
        )
    }
}

/// The largest handle the kernel makes (`MAX_HANDLE_SZ`).
const MAX_HANDLE_SZ: usize = 128;

/// `name_to_handle_at(2)` of the inode a descriptor refers to (`AT_EMPTY_PATH`).
///
/// # Errors
/// `EOPNOTSUPP` where the file system has no handles (most FUSE backends, some
/// network file systems), otherwise the error of the call.
pub fn of(fd: BorrowedFd<'_>) -> SysResult<FileHandle> {
    name_to_handle(fd, c"", libc::AT_EMPTY_PATH)
}

/// `name_to_handle_at(2)` of what the single name `name` in `dir` is now, without
/// following a symlink and without opening it: a hint only (which inode to let go
/// of), never a way to reach one.
///
/// # Errors
/// `EINVAL` for a name that is not one entry; otherwise as [`of`].
pub fn of_child(dir: BorrowedFd<'_>, name: &std::ffi::OsStr) -> SysResult<FileHandle> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(super::Errno::EINVAL);
    }
    let name = std::ffi::CString::new(bytes).map_err(|_| super::Errno::EINVAL)?;
    name_to_handle(dir, &name, 0)
}

fn name_to_handle(
    dir: BorrowedFd<'_>,
    path: &std::ffi::CStr,
    flags: libc::c_int,
) -> SysResult<FileHandle> {
    let mut words = vec![0u32; 2 + MAX_HANDLE_SZ / 4].into_boxed_slice();
    words[0] = MAX_HANDLE_SZ as u32;
    let mut mount_id: libc::c_int = 0;
    // SAFETY: `words` is a u32-aligned `struct file_handle` whose `handle_bytes` says
    // how many bytes follow the 8-byte header, and the buffer has exactly that many;
    // the path is a NUL-terminated C string and `mount_id` a valid out pointer.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::name_to_handle_at(
            dir.as_raw_fd(),
            path.as_ptr(),
            words.as_mut_ptr().cast::<libc::file_handle>(),
            &mut mount_id,
            flags,
        )
    };
    if rc < 0 {
        return Err(failed("name_to_handle_at")(std::io::Error::last_os_error()));
    }
    let used = 2 + (words[0] as usize).div_ceil(4);
    Ok(FileHandle {
        words: words[..used].into(),
    })
}

/// `open_by_handle_at(2)` with `O_PATH`: the inode itself, whatever has been renamed
/// since; `ESTALE` when it no longer exists. `mount_fd` is any descriptor on the same
/// file system (the view's root). Needs `CAP_DAC_READ_SEARCH`.
///
/// # Errors
/// The error of the call.
pub fn open(mount_fd: BorrowedFd<'_>, handle: &FileHandle) -> SysResult<OwnedFd> {
    let mut words = handle.words.clone();
    // SAFETY: `words` holds a complete `struct file_handle` made by name_to_handle_at
    // (header and `handle_bytes` bytes); the kernel reads it and returns a new
    // descriptor or -1.
    #[allow(unsafe_code)]
    let fd = unsafe {
        libc::open_by_handle_at(
            mount_fd.as_raw_fd(),
            words.as_mut_ptr().cast::<libc::file_handle>(),
            libc::O_PATH | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        )
    };
    if fd < 0 {
        return Err(failed("open_by_handle_at")(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned by the kernel and is owned by no one else.
    #[allow(unsafe_code)]
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}
