//! Attributes: getattr, setattr (chown and chmod as records), readlink, statfs
//! (quotas where the share keeps them), access.

use std::os::fd::AsFd;
use std::sync::Arc;

use crate::sys::Errno;
use crate::sys::file::{self, Access, FsStat, Kind, SetTime};

use super::super::error::{FsError, FsResult};
use super::super::inode::Inode;
use super::super::view::{self, OwnerChange, Policy};
use super::ViewFs;
use super::{Attr, Handle, SetAttr};

impl ViewFs {
    /// The presented attributes of `ino`.
    ///
    /// # Errors
    /// `ESTALE` for an unknown inode, or the error of `statx`.
    pub fn getattr(&self, ino: u64) -> FsResult<Attr> {
        let inode = self.inodes.get(ino)?;
        let st = file::stat(inode.fd()?.as_fd())?;
        inode.synced.mark();
        self.attr(&inode, &st)
    }

    /// Applies a setattr. Ownership and mode go to the disk in a plain view, to the
    /// ownership record in an emulating view, and nowhere in CIFS-like views (but the
    /// read-only attribute); sizes and times always go to the disk.
    ///
    /// # Errors
    /// `EROFS` on a read-only view, `EACCES` truncating a CIFS read-only file, or the
    /// error of the system call.
    pub fn setattr(&self, ino: u64, fh: Option<u64>, set: SetAttr) -> FsResult<Attr> {
        self.writable()?;
        let inode = self.inodes.get(ino)?;
        if let Some(size) = set.size {
            self.truncate(&inode, fh, size)?;
        }
        if set.atime.is_some() || set.mtime.is_some() {
            file::set_times(
                inode.fd()?.as_fd(),
                set.atime.unwrap_or(SetTime::Omit),
                set.mtime.unwrap_or(SetTime::Omit),
            )?;
        }
        let change = OwnerChange {
            uid: set.uid,
            gid: set.gid,
            perm: set.mode.map(|m| m & file::PERM_MASK),
        };
        if let Some(perm) = change.perm {
            if self.cfg.policy.refuses_set_id(inode.kind, perm) {
                return Err(FsError::NotPermitted);
            }
        }
        if !change.is_empty() {
            if let Policy::Plain { gids, .. } = self.cfg.policy {
                if change.uid.is_some() || change.gid.is_some() {
                    let gid = change.gid.map(|g| gids.disk(g));
                    file::chown(inode.fd()?.as_fd(), change.uid, gid)?;
                }
                if let Some(perm) = change.perm {
                    if inode.kind != Kind::Symlink {
                        file::chmod(inode.fd()?.as_fd(), perm)?;
                    }
                }
            } else {
                let current = self.record_for(&inode)?;
                let mut change = change;
                if (change.uid.is_some() || change.gid.is_some()) && change.perm.is_none() {
                    // A chown or chgrp of a non-directory clears set-id bits, for root
                    // too; the kernel leaves that to the server under
                    // FUSE_HANDLE_KILLPRIV_V2 (the disk does it in a plain view).
                    // The record is read already: only the disk's mode is missing.
                    let st = file::stat(inode.fd()?.as_fd())?;
                    let shown = self.attr_with(&inode, &st, current.as_ref());
                    let kept = view::perm_after_chown(inode.kind, shown.perm);
                    if kept != shown.perm {
                        change.perm = Some(kept);
                    }
                }
                if let Some(new) =
                    view::changed_record(&self.cfg.policy, inode.kind, current, change)
                {
                    self.write_record(inode.fd()?.as_fd(), inode.kind, &new)?;
                }
            }
        }
        self.getattr(ino)
    }

    /// A setattr's truncate of a regular file to `size`: through the handle `fh`
    /// where it writes, else through a descriptor opened for it; refused where the
    /// view shows the file read-only.
    fn truncate(&self, inode: &Arc<Inode>, fh: Option<u64>, size: u64) -> FsResult<()> {
        if inode.kind != Kind::Regular {
            return Err(FsError::Os(if inode.kind == Kind::Directory {
                Errno::EISDIR
            } else {
                Errno::EINVAL
            }));
        }
        if view::write_refused(
            &self.cfg.policy,
            inode.kind,
            self.record_for(inode)?.as_ref(),
        ) {
            return Err(FsError::ReadOnlyFile);
        }
        let via_handle = fh.and_then(|fh| match self.handles.get(&fh).as_deref() {
            Some(Handle::File(f)) if f.data.writable => Some(Arc::clone(&f.data)),
            _ => None,
        });
        match via_handle {
            Some(data) => file::truncate(data.fd.as_fd(), size)?,
            None => {
                let fd = file::reopen(inode.fd()?.as_fd(), inode.kind, Access::ReadWrite)?;
                file::truncate(fd.as_fd(), size)?;
            }
        }
        Ok(())
    }

    /// The target of a symlink.
    ///
    /// # Errors
    /// `EINVAL` for anything but a symlink.
    pub fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        let inode = self.inodes.get(ino)?;
        if inode.kind != Kind::Symlink {
            return Err(FsError::Os(Errno::EINVAL));
        }
        Ok(file::readlink(inode.fd()?.as_fd())?)
    }

    /// File system statistics of the backing tree; on a btrfs subvolume with a quota
    /// limit, or a CephFS directory with a quota, the volume's capacity and usage (read
    /// on every call, so an expansion of the live volume shows at once).
    ///
    /// # Errors
    /// The error of `statvfs`.
    pub fn statfs(&self) -> FsResult<FsStat> {
        let root = self.inodes.root().fd()?;
        let mut st = file::statvfs(root.as_fd())?;
        // The volume's quota, as its limit and the bytes it holds.
        let quota = if let Some(dir) = &self.share.qgroup {
            crate::sys::btrfs::qgroup_usage(dir)
                .map(|q| q.limit.map(|limit| (limit, q.used)))
                .map_err(|e| e.to_string())
        } else if self.share.cephfs {
            crate::sys::cephfs::ceph_quota(root.as_fd()).map_err(|e| e.to_string())
        } else {
            Ok(None)
        };
        match quota {
            Ok(Some((limit, used))) => {
                let unit = u64::from(st.frsize.max(1));
                st.blocks = limit / unit;
                st.bfree = limit.saturating_sub(used) / unit;
                st.bavail = st.bfree;
            }
            Ok(None) => {}
            Err(error) => {
                tracing::debug!(%error, "the volume's quota is unreadable; whole file system reported")
            }
        }
        Ok(st)
    }

    /// `access(2)` (and `chdir(2)`'s check) when the kernel does not check permissions
    /// itself. Under CIFS `noperm` everything is allowed; where the share checks
    /// ([`ViewFs::share_checks`]), the share's answer for the caller, whose
    /// credentials the worker acts with.
    ///
    /// # Errors
    /// `EROFS` for `W_OK` on a read-only view; where the share checks, what it
    /// answers (`EACCES`).
    pub fn access(&self, ino: u64, mask: i32) -> FsResult<()> {
        let inode = self.inodes.get(ino)?;
        if mask & libc::W_OK != 0 {
            self.writable()?;
        }
        if self.cfg.share_checks {
            file::may(inode.fd()?.as_fd(), mask)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::*;

    #[test]
    fn a_chown_clears_recorded_set_id_bits() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), "x").unwrap();
        let v = view(dir.path(), "gid=5");
        let f = v.lookup(ROOT, OsStr::new("f")).unwrap().ino;
        let set = |s: SetAttr| v.setattr(f, None, s).unwrap();
        set(SetAttr {
            mode: Some(0o6555),
            ..Default::default()
        });
        let a = set(SetAttr {
            uid: Some(65534),
            gid: Some(65533),
            ..Default::default()
        });
        assert_eq!((a.uid, a.gid, a.perm), (65534, 65533, 0o555));
        // Setgid without group execute is not a set-id bit to clear.
        set(SetAttr {
            mode: Some(0o2745),
            ..Default::default()
        });
        let a = set(SetAttr {
            gid: Some(5),
            ..Default::default()
        });
        assert_eq!(a.perm, 0o2745);
    }
}
