//! Errors of the filesystem core and their one mapping to errno.

use crate::sys::Errno;

/// Why a filesystem operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FsError {
    /// A system call on the backing tree failed.
    #[error("{0}")]
    Os(#[from] Errno),
    /// The kernel named an inode the view does not know (or has forgotten).
    #[error("unknown inode {0}")]
    UnknownInode(u64),
    /// The kernel named a file handle the view did not hand out.
    #[error("unknown file handle {0}")]
    UnknownHandle(u64),
    /// A mutation on a read-only view.
    #[error("read-only view")]
    ReadOnly,
    /// Refused by the view's own rules (device nodes, privileged xattrs, the record).
    #[error("not permitted by the view")]
    NotPermitted,
    /// A CIFS read-only file opened for writing.
    #[error("read-only file")]
    ReadOnlyFile,
    /// The hidden ownership record, or an xattr that does not exist.
    #[error("no such attribute")]
    NoAttribute,
    /// An operation on the wrong kind of inode (open of a FIFO, readlink of a file).
    #[error("wrong file type")]
    WrongKind,
    /// A buffer the kernel offered is too small for the answer.
    #[error("result too large")]
    TooLarge,
    /// A create found its name taken, and leaves the open to the kernel
    /// ([`super::ops::Existing::Kernel`]): `ESTALE` makes it look the name up again.
    #[error("the name appeared before the create; the kernel looks it up again")]
    NameAppeared,
    /// A lookup of a name that the names the view holds of the directory do not have
    /// (`fs/names.rs`): `ENOENT`, which the kernel may keep for the time given.
    #[error("not among the names held of the directory")]
    Absent(std::time::Duration),
    /// A view's tables handed over by another process do not fit this view.
    #[error("handover refused: {0}")]
    Handover(&'static str),
}

impl FsError {
    /// The errno the kernel hands to the caller. One exhaustive match: a new variant
    /// cannot be forgotten.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::Os(e) => e.raw(),
            FsError::UnknownInode(_) => libc::ESTALE,
            FsError::UnknownHandle(_) => libc::EBADF,
            FsError::ReadOnly => libc::EROFS,
            FsError::NotPermitted => libc::EPERM,
            FsError::ReadOnlyFile => libc::EACCES,
            FsError::NoAttribute => libc::ENODATA,
            FsError::WrongKind => libc::EINVAL,
            FsError::TooLarge => libc::ERANGE,
            FsError::NameAppeared => libc::ESTALE,
            FsError::Absent(_) => libc::ENOENT,
            // Never a reply to the kernel: a takeover that fails leaves the old process
            // serving.
            FsError::Handover(_) => libc::EPROTO,
        }
    }
}

/// Result of a filesystem operation.
pub type FsResult<T> = Result<T, FsError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_errors_keep_their_number() {
        assert_eq!(FsError::Os(Errno(libc::ENOSPC)).errno(), libc::ENOSPC);
        assert_eq!(FsError::Os(Errno(libc::EDQUOT)).errno(), libc::EDQUOT);
        assert_eq!(FsError::ReadOnly.errno(), libc::EROFS);
        assert_eq!(FsError::NoAttribute.errno(), libc::ENODATA);
    }
}
