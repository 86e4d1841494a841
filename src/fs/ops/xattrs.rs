//! Extended attributes through a view: the daemon's own hidden, privileged
//! namespaces refused.

use super::*;
use crate::sys::process;

impl ViewFs {
    /// Reads an xattr; the daemon's own are invisible.
    ///
    /// # Errors
    /// `ENODATA` when absent or hidden, `ERANGE` when `size` is too small.
    pub fn getxattr(&self, ino: u64, name: &OsStr, size: u32) -> FsResult<XattrReply> {
        if record::is_reserved(name.as_bytes()) || self.hides(name.as_bytes()) {
            return Err(FsError::NoAttribute);
        }
        let inode = self.inodes.get(ino)?;
        let value =
            xattr::get(inode.fd()?.as_fd(), &cstring(name)?)?.ok_or(FsError::NoAttribute)?;
        sized(value, size)
    }

    /// Lists xattr names, without the daemon's own, and without any `trusted.` name for
    /// a caller without `CAP_SYS_ADMIN` in the initial user namespace: the kernel shows
    /// those only to `capable(CAP_SYS_ADMIN)` (fs/xattr.c). The caller's capabilities
    /// are read from `/proc`, and only when there is such a name.
    ///
    /// # Errors
    /// `ERANGE` when `size` is too small, or the error of `listxattr`.
    pub fn listxattr(&self, ino: u64, size: u32, caller: Caller) -> FsResult<XattrReply> {
        let inode = self.inodes.get(ino)?;
        let all = xattr::list(inode.fd()?.as_fd())?;
        let mut shown = Vec::with_capacity(all.len());
        let mut admin = None;
        let mut is_admin = || {
            *admin.get_or_insert_with(|| {
                Self::credentials(caller).is_some_and(|c| c.capable(process::CAP_SYS_ADMIN))
            })
        };
        for name in all.split_inclusive(|b| *b == 0) {
            let hidden = record::is_reserved(name)
                || self.hides(name.strip_suffix(b"\0").unwrap_or(name))
                || (name.starts_with(b"trusted.") && !is_admin());
            if !hidden {
                shown.extend_from_slice(name);
            }
        }
        sized(shown, size)
    }

    /// Whether the view shows no attribute `name` whatever the share holds: a view
    /// that presents ownership of its own (fsGroup and CIFS semantics) shows no file
    /// capabilities, as it shows no set-id bit but its records' (docs/SEMANTICS.md),
    /// and so answers the kernel's `security.capability` lookup, which it makes
    /// before a write after each refresh of the file's attributes (fs/inode.c
    /// `file_remove_privs`, whatever `FUSE_HANDLE_KILLPRIV_V2` says), without a
    /// request to the share. A view that shows the disk (plain, the native twin)
    /// shows its capabilities, as a native view does.
    fn hides(&self, name: &[u8]) -> bool {
        name == b"security.capability" && !self.cfg.policy.changes_disk()
    }

    /// Sets an xattr. Only the `user.` namespace is writable through a view, and not
    /// the daemon's names in it: the daemon is root, and `trusted.`/`security.`
    /// attributes written for a pod would carry privileges onto the share (file
    /// capabilities, the daemon's own records).
    ///
    /// # Errors
    /// `EROFS`, `EPERM` outside `user.` or for the daemon's own names, or the error of
    /// `setxattr`.
    pub fn setxattr(&self, ino: u64, name: &OsStr, value: &[u8], flags: i32) -> FsResult<()> {
        self.writable()?;
        if record::is_reserved(name.as_bytes()) {
            return Err(FsError::NotPermitted);
        }
        refuse_unless_user(name)?;
        let inode = self.inodes.get(ino)?;
        let flags = u32::try_from(flags).map_err(|_| FsError::Os(Errno::EINVAL))?;
        Ok(xattr::set(
            inode.fd()?.as_fd(),
            &cstring(name)?,
            value,
            flags,
        )?)
    }

    /// Removes an xattr (`user.` namespace only; the daemon's own do not exist here).
    ///
    /// # Errors
    /// `EROFS`, `ENODATA`, `EPERM` outside `user.`.
    pub fn removexattr(&self, ino: u64, name: &OsStr) -> FsResult<()> {
        self.writable()?;
        if record::is_reserved(name.as_bytes()) {
            return Err(FsError::NoAttribute);
        }
        refuse_unless_user(name)?;
        let inode = self.inodes.get(ino)?;
        Ok(xattr::remove(inode.fd()?.as_fd(), &cstring(name)?)?)
    }
}

/// Only `user.` xattrs are written through a view. POSIX ACLs (`system.posix_acl_*`)
/// are not offered at all (`EOPNOTSUPP`, what `setfacl` expects of a file system
/// without ACLs); `trusted.` and `security.` are refused (`EPERM`).
fn refuse_unless_user(name: &OsStr) -> FsResult<()> {
    let name = name.as_bytes();
    if name.starts_with(b"user.") {
        Ok(())
    } else if name.starts_with(b"system.") {
        Err(FsError::Os(Errno::EOPNOTSUPP))
    } else {
        Err(FsError::NotPermitted)
    }
}

fn sized(value: Vec<u8>, size: u32) -> FsResult<XattrReply> {
    let len = u32::try_from(value.len()).map_err(|_| FsError::TooLarge)?;
    if size == 0 {
        Ok(XattrReply::Size(len))
    } else if len > size {
        Err(FsError::TooLarge)
    } else {
        Ok(XattrReply::Data(value))
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::*;
    use super::*;

    #[test]
    fn trusted_names_are_listed_for_root_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), "x").unwrap();
        let fd = std::fs::File::open(dir.path().join("f")).unwrap();
        xattr::set(fd.as_fd(), c"trusted.other", b"1", 0).unwrap();
        xattr::set(fd.as_fd(), c"user.a", b"1", 0).unwrap();
        let v = view(dir.path(), "gid=5");
        let f = v.lookup(ROOT, OsStr::new("f")).unwrap().ino;
        // This test process (root, in the initial user namespace): CAP_SYS_ADMIN.
        let root = Caller {
            pid: std::process::id(),
        };
        let names = |c| match v.listxattr(f, 1000, c).unwrap() {
            XattrReply::Data(d) => d,
            XattrReply::Size(_) => unreachable!(),
        };
        assert_eq!(names(ME.into()), b"user.a\0");
        let mut all: Vec<_> = names(root).split(|b| *b == 0).map(<[u8]>::to_vec).collect();
        all.sort();
        assert_eq!(
            all,
            [b"".to_vec(), b"trusted.other".to_vec(), b"user.a".to_vec()]
        );
    }
}
