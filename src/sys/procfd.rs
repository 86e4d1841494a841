//! A descriptor's own `/proc/self/fd/N` magic link, which names exactly that inode
//! and nothing else: how `file.rs` and `xattr.rs` reach an `O_PATH` descriptor where
//! the kernel has no call that takes one.

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use rustix::fs::{Mode, OFlags};

/// `/proc/self/fd/N` for a descriptor, without allocating.
pub(super) struct ProcPath {
    buf: [u8; 40],
}

impl ProcPath {
    pub(super) fn new(fd: BorrowedFd<'_>) -> ProcPath {
        use std::io::Write;
        let mut buf = [0u8; 40];
        let mut cursor = &mut buf[..];
        // "/proc/self/fd/" + at most 10 digits + NUL always fits in 40 bytes.
        let _ = write!(cursor, "/proc/self/fd/{}\0", fd.as_raw_fd());
        ProcPath { buf }
    }

    pub(super) fn as_cstr(&self) -> &CStr {
        CStr::from_bytes_until_nul(&self.buf).expect("ProcPath always holds a NUL")
    }

    /// The last component alone (`N`), to resolve beneath [`proc_fd_dir`]: one
    /// component instead of five (`proc`, `self`, the pid, `fd`, `N`), which is most of
    /// what a record read cost a lookup.
    pub(super) fn name(&self) -> &CStr {
        let all = self.as_cstr().to_bytes_with_nul();
        CStr::from_bytes_with_nul(&all["/proc/self/fd/".len()..]).expect("ends with the NUL")
    }
}

/// This process's `/proc/self/fd`, opened once (`O_PATH`); `None` without `/proc`.
pub(super) fn proc_fd_dir() -> Option<BorrowedFd<'static>> {
    static DIR: std::sync::OnceLock<Option<OwnedFd>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        rustix::fs::open(
            "/proc/self/fd",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()
    })
    .as_ref()
    .map(|fd| fd.as_fd())
}
