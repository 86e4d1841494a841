//! The system-call layer: the only module that talks to the kernel directly.
//!
//! Everything above this module works with safe, documented wrappers that return
//! [`Errno`], never a `std::io::Error` that might have lost its OS error code. All
//! `unsafe` code of the crate lives here (see `signal.rs`).

pub mod btrfs;
pub mod cephfs;
pub mod cgroup;
pub mod creds;
pub mod dir;
pub mod direct;
pub mod fdpass;
pub mod file;
pub mod fuse;
pub mod handle;
pub mod mount;
pub mod process;
pub mod procfd;
pub mod signal;
pub mod uring;
pub mod xattr;

use std::cell::Cell;
use std::fmt;

/// The running kernel's release (`uname -r`), or "unknown".
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "unknown".to_string(), |r| r.trim().to_string())
}

thread_local! {
    /// The system call that failed last on this thread (see [`failed`]).
    static FAILED_CALL: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// The conversion for a failed call to `call`: notes the call's name for this thread
/// (the FUSE choke point names it in its log line) and keeps the error number.
pub fn failed<E: Into<Errno>>(call: &'static str) -> impl FnOnce(E) -> Errno {
    move |e| {
        FAILED_CALL.with(|c| c.set(Some(call)));
        e.into()
    }
}

/// Takes the name of the system call that failed last on this thread, if any; the
/// choke point takes it before an operation (to clear it) and after a failure.
pub fn take_failed_call() -> Option<&'static str> {
    FAILED_CALL.with(Cell::take)
}

/// A raw OS error number, as returned by a failed system call.
///
/// Kept as the number itself so that a failure can be handed to the kernel (FUSE
/// replies) or to a user (messages) without ever turning into a generic `EIO`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    pub const EACCES: Errno = Errno(libc::EACCES);
    pub const EBADF: Errno = Errno(libc::EBADF);
    pub const EBUSY: Errno = Errno(libc::EBUSY);
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const EISDIR: Errno = Errno(libc::EISDIR);
    pub const ELOOP: Errno = Errno(libc::ELOOP);
    pub const EMFILE: Errno = Errno(libc::EMFILE);
    pub const ENFILE: Errno = Errno(libc::ENFILE);
    pub const ENODATA: Errno = Errno(libc::ENODATA);
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const ENOMEM: Errno = Errno(libc::ENOMEM);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    pub const ENOTCONN: Errno = Errno(libc::ENOTCONN);
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    pub const ENXIO: Errno = Errno(libc::ENXIO);
    pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    pub const EPERM: Errno = Errno(libc::EPERM);
    pub const ERANGE: Errno = Errno(libc::ERANGE);
    pub const EROFS: Errno = Errno(libc::EROFS);
    pub const ETXTBSY: Errno = Errno(libc::ETXTBSY);
    pub const EXDEV: Errno = Errno(libc::EXDEV);

    /// The raw error number.
    pub fn raw(self) -> i32 {
        self.0
    }

    /// The error of an `std::io::Error`, or `EIO` when it carries none.
    ///
    /// Only for errors from std APIs that wrap a single system call.
    pub fn from_io(err: &std::io::Error) -> Errno {
        Errno(err.raw_os_error().unwrap_or(libc::EIO))
    }
}

impl From<std::io::Error> for Errno {
    fn from(e: std::io::Error) -> Self {
        Errno::from_io(&e)
    }
}

impl From<Errno> for std::io::Error {
    fn from(e: Errno) -> Self {
        std::io::Error::from_raw_os_error(e.raw())
    }
}

impl From<rustix::io::Errno> for Errno {
    fn from(e: rustix::io::Errno) -> Self {
        Errno(e.raw_os_error())
    }
}

impl Errno {
    /// The errno's symbolic name (`EHOSTDOWN`), as `errno(3)` lists it; `E<number>`
    /// for one the C library does not name.
    pub fn name(self) -> String {
        match nix::errno::Errno::from_raw(self.0) {
            nix::errno::Errno::UnknownErrno => format!("E{}", self.0),
            e => format!("{e:?}"),
        }
    }
}

impl fmt::Display for Errno {
    /// Its text and its name: `Host is down (EHOSTDOWN)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match nix::errno::Errno::from_raw(self.0) {
            nix::errno::Errno::UnknownErrno => write!(f, "unknown error (E{})", self.0),
            e => write!(f, "{} ({e:?})", e.desc()),
        }
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Errno({}: {})", self.0, self)
    }
}

impl std::error::Error for Errno {}

/// Result of a system call wrapper.
pub type SysResult<T> = Result<T, Errno>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_errno_says_its_text_and_its_name() {
        assert_eq!(Errno(libc::EHOSTDOWN).name(), "EHOSTDOWN");
        assert_eq!(
            Errno(libc::ENOENT).to_string(),
            "No such file or directory (ENOENT)"
        );
        assert_eq!(
            Errno(libc::EHOSTDOWN).to_string(),
            "Host is down (EHOSTDOWN)"
        );
        assert_eq!(Errno(4242).name(), "E4242");
        assert_eq!(Errno(4242).to_string(), "unknown error (E4242)");
    }
}
