//! Namespace operations: creating, linking, removing and renaming entries.

use super::*;

impl ViewFs {
    /// Gives a new entry its ownership: in a plain view, the disk's (created by root,
    /// handed to the caller as far as the backend allows); in a recording view, its
    /// record. On failure the entry is removed again, so a create never half succeeds.
    pub(super) fn adopt(
        &self,
        parent: &Arc<Inode>,
        name: &OsStr,
        fd: &OwnedFd,
        kind: Kind,
        perm: u32,
        caller: Caller,
    ) -> FsResult<()> {
        let result = match self.policy {
            Policy::Plain => self.give_to_caller(parent, fd, kind, perm, caller),
            _ => {
                // Only fsgroup inherits from the parent; spare the stat otherwise.
                let parent_shown = match self.policy {
                    Policy::FsGroup { emulate: true, .. } => self.shown(parent)?,
                    _ => Owner {
                        uid: 0,
                        gid: 0,
                        perm: 0,
                    },
                };
                match view::new_entry_record(&self.policy, caller, parent_shown, kind, perm) {
                    Some(rec) => self.write_record(fd.as_fd(), &rec),
                    None => Ok(()),
                }
            }
        };
        if let Err(e) = result {
            let _ = file::unlink(parent.fd()?.as_fd(), name, kind == Kind::Directory);
            return Err(e);
        }
        Ok(())
    }

    pub(super) fn give_to_caller(
        &self,
        parent: &Arc<Inode>,
        fd: &OwnedFd,
        kind: Kind,
        perm: u32,
        caller: Caller,
    ) -> FsResult<()> {
        let pst = file::stat(parent.fd()?.as_fd())?;
        // A setgid parent gave the entry its group already (the file system did that).
        let gid = (pst.perm & 0o2000 == 0).then_some(caller.gid);
        let (euid, egid) = crate::sys::process::effective_ids();
        if caller.uid == euid && gid.is_none_or(|g| g == egid) {
            return Ok(());
        }
        match file::chown(fd.as_fd(), Some(caller.uid), gid) {
            Ok(()) => {}
            // A backend that cannot chown (CIFS, squashed NFS, an unprivileged daemon)
            // keeps the daemon as owner, as a CIFS mount would.
            Err(Errno::EPERM | Errno::EOPNOTSUPP | Errno::EINVAL) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        // chown clears set-id bits; put back what the caller asked for.
        if perm & 0o6000 != 0 && kind != Kind::Symlink {
            file::chmod(fd.as_fd(), perm)?;
        }
        Ok(())
    }

    /// Creates and opens a regular file. An existing name is opened instead unless
    /// `O_EXCL` was asked for.
    ///
    /// # Errors
    /// `EROFS`, `EEXIST`, or the error of the system call.
    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        caller: Caller,
    ) -> FsResult<(Attr, u64, Arc<DataFile>)> {
        self.writable()?;
        let p = self.dir(parent)?;
        let perm = mode & file::PERM_MASK;
        let fd = match file::create_file(p.fd()?.as_fd(), name, self.policy.disk_create_perm(perm))
        {
            Ok(fd) => fd,
            Err(Errno::EEXIST) if flags & libc::O_EXCL == 0 => {
                let attr = self.lookup(parent, name)?;
                return match self.open(attr.ino, flags, caller) {
                    Ok((fh, data)) => Ok((attr, fh, data)),
                    Err(e) => {
                        self.forget(attr.ino, 1);
                        Err(e)
                    }
                };
            }
            Err(e) => return Err(e.into()),
        };
        let path_fd = file::reopen(fd.as_fd(), Access::Path)?;
        self.adopt(&p, name, &path_fd, Kind::Regular, perm, caller)?;
        let st = file::stat(path_fd.as_fd())?;
        let inode = self.inodes.lookup(path_fd, &st);
        let data = Arc::new(DataFile::new(fd, true));
        *lock(&inode.data) = Arc::downgrade(&data);
        let attr = self.attr(&inode, &st)?;
        let fh = self.add_handle(Handle::File(OpenFile {
            data: Arc::clone(&data),
            sync: flags & (libc::O_SYNC | libc::O_DSYNC) != 0,
        }));
        Ok((attr, fh, data))
    }

    /// Creates a directory.
    ///
    /// # Errors
    /// `EROFS`, `EEXIST`, or the error of the system call.
    pub fn mkdir(&self, parent: u64, name: &OsStr, mode: u32, caller: Caller) -> FsResult<Attr> {
        self.writable()?;
        let p = self.dir(parent)?;
        let perm = mode & file::PERM_MASK;
        file::mkdir(p.fd()?.as_fd(), name, self.policy.disk_create_perm(perm))?;
        self.finish_new(&p, name, Kind::Directory, perm, caller)
    }

    /// Creates a FIFO, socket or empty regular file. Device nodes are refused.
    ///
    /// # Errors
    /// `EPERM` for a device node, `EROFS`, or the error of the system call.
    pub fn mknod(&self, parent: u64, name: &OsStr, mode: u32, caller: Caller) -> FsResult<Attr> {
        self.writable()?;
        let kind = Kind::from_mode(mode).unwrap_or(Kind::Regular);
        if matches!(kind, Kind::CharDevice | Kind::BlockDevice) {
            return Err(FsError::NotPermitted);
        }
        let p = self.dir(parent)?;
        let perm = mode & file::PERM_MASK;
        file::mknod(
            p.fd()?.as_fd(),
            name,
            kind,
            self.policy.disk_create_perm(perm),
        )?;
        self.finish_new(&p, name, kind, perm, caller)
    }

    /// Creates a symlink. Its target is stored, never followed by the daemon.
    ///
    /// # Errors
    /// `EROFS`, `EEXIST`, or the error of the system call.
    pub fn symlink(
        &self,
        parent: u64,
        name: &OsStr,
        target: &OsStr,
        caller: Caller,
    ) -> FsResult<Attr> {
        self.writable()?;
        let p = self.dir(parent)?;
        file::symlink(target, p.fd()?.as_fd(), name)?;
        self.finish_new(&p, name, Kind::Symlink, 0o777, caller)
    }

    pub(super) fn finish_new(
        &self,
        p: &Arc<Inode>,
        name: &OsStr,
        kind: Kind,
        perm: u32,
        caller: Caller,
    ) -> FsResult<Attr> {
        let fd = file::open_child(p.fd()?.as_fd(), name, self.root_mnt)?;
        let st = file::stat(fd.as_fd())?;
        if st.kind != kind {
            // Replaced between creation and open: leave the stranger alone.
            return Err(FsError::Os(Errno::EEXIST));
        }
        self.adopt(p, name, &fd, kind, perm, caller)?;
        self.register(fd)
    }

    /// Makes a hard link of `ino` named `name` in `new_parent`.
    ///
    /// # Errors
    /// `EROFS`, `EEXIST`, or the error of the system call.
    pub fn link(&self, ino: u64, new_parent: u64, name: &OsStr) -> FsResult<Attr> {
        self.writable()?;
        let inode = self.inodes.get(ino)?;
        let p = self.dir(new_parent)?;
        file::link(inode.fd()?.as_fd(), p.fd()?.as_fd(), name)?;
        self.lookup(new_parent, name)
    }

    /// Removes a name (`dir` for rmdir).
    ///
    /// # Errors
    /// `EROFS`, `ENOENT`, `ENOTEMPTY`, or the error of the system call.
    pub fn unlink(&self, parent: u64, name: &OsStr, dir: bool) -> FsResult<()> {
        self.writable()?;
        let p = self.dir(parent)?;
        Ok(file::unlink(p.fd()?.as_fd(), name, dir)?)
    }

    /// Renames, with `RENAME_NOREPLACE`/`RENAME_EXCHANGE`.
    ///
    /// # Errors
    /// `EROFS`, `EINVAL` for other flags, or the error of the system call.
    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: u32,
    ) -> FsResult<()> {
        self.writable()?;
        let p = self.dir(parent)?;
        let np = self.dir(new_parent)?;
        Ok(file::rename(
            p.fd()?.as_fd(),
            name,
            np.fd()?.as_fd(),
            new_name,
            flags,
        )?)
    }
}
