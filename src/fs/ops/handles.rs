//! Open files: the handle table and I/O through the daemon.

use super::*;

impl ViewFs {
    pub(super) fn add_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.insert(fh, h);
        fh
    }

    /// The shared I/O descriptor of an inode, opened now if no handle holds one.
    pub(super) fn shared_data(
        &self,
        inode: &Arc<Inode>,
        wants_write: bool,
    ) -> FsResult<Arc<DataFile>> {
        if let Some(d) = lock(&inode.data).upgrade() {
            if d.writable || !wants_write {
                return Ok(d);
            }
            // The kernel ties one passthrough file to an inode while it is open: a
            // read-only one cannot serve a writer.
            if d.has_passthrough() {
                return Err(FsError::Busy);
            }
        }
        let access = if self.readonly {
            Access::ReadOnly
        } else {
            Access::ReadWrite
        };
        // Not under the slot's lock: reaching the inode may take it too.
        let path_fd = inode.fd()?;
        let reopen = |access| {
            self.inodes
                .with_fds(|| file::reopen(path_fd.as_fd(), inode.kind, access))
        };
        let (fd, writable) = match reopen(access) {
            Ok(fd) => (fd, access == Access::ReadWrite),
            // A running executable (ETXTBSY), an immutable file, a read-only backend:
            // readers still get in.
            Err(Errno::EACCES | Errno::EPERM | Errno::EROFS | Errno::ETXTBSY) if !wants_write => {
                (reopen(Access::ReadOnly)?, false)
            }
            Err(e) => return Err(e.into()),
        };
        let mut slot = lock(&inode.data);
        // Another open may have got there first; one descriptor per inode.
        if let Some(d) = slot.upgrade() {
            if d.writable || !wants_write {
                return Ok(d);
            }
        }
        let data = Arc::new(DataFile::new(fd, writable));
        *slot = Arc::downgrade(&data);
        Ok(data)
    }

    /// Opens a regular file. All handles of an inode share one backing descriptor,
    /// opened read-write where possible, so one passthrough registration serves them.
    ///
    /// # Errors
    /// `EROFS` writing on a read-only view, `EACCES` writing a CIFS read-only file,
    /// `EINVAL` for anything but a regular file.
    pub fn open(&self, ino: u64, flags: i32, caller: Caller) -> FsResult<Opened> {
        let inode = self.inodes.get(ino)?;
        if inode.kind != Kind::Regular {
            // FIFOs and device nodes are opened by the kernel, never by the daemon.
            return Err(FsError::WrongKind);
        }
        let wants_write = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        if wants_write {
            self.writable()?;
            // One read of the record serves both checks; root needs it only for CIFS.
            let needs_record = caller.uid != 0 || matches!(self.policy, Policy::Cifs { .. });
            let rec = if needs_record {
                self.record_for(&inode)?
            } else {
                None
            };
            if view::write_refused(&self.policy, inode.kind, rec.as_ref()) {
                return Err(FsError::ReadOnlyFile);
            }
            if caller.uid != 0 {
                self.drop_set_id_for_writer(&inode, rec)?;
            }
        }
        let data = self.shared_data(&inode, wants_write)?;
        let fh = self.add_handle(Handle::File(OpenFile {
            data: Arc::clone(&data),
            sync: flags & (libc::O_SYNC | libc::O_DSYNC) != 0,
        }));
        Ok(Opened { fh, data })
    }

    /// The kernel leaves dropping set-id bits on write to the view
    /// (`FUSE_HANDLE_KILLPRIV_V2`, which spares a `security.capability` lookup per
    /// write), and passthrough writes never reach the daemon. So a writer without
    /// `CAP_FSETID` (any caller but root) clears setuid, and setgid where group execute
    /// is set, when it opens the file for writing: what the kernel does on its first
    /// write. The backing file system itself still removes `security.capability` on
    /// every write, passthrough included.
    pub(super) fn drop_set_id_for_writer(
        &self,
        inode: &Arc<Inode>,
        rec: Option<Record>,
    ) -> FsResult<()> {
        let st = file::stat(inode.fd()?.as_fd())?;
        let shown = self.attr_with(inode, &st, rec.as_ref());
        let kill = (shown.perm & 0o4000)
            | if shown.perm & 0o010 != 0 {
                shown.perm & 0o2000
            } else {
                0
            };
        if kill == 0 {
            return Ok(());
        }
        let perm = shown.perm & !kill;
        if self.policy.changes_disk() {
            file::chmod(inode.fd()?.as_fd(), perm)?;
        } else {
            let change = OwnerChange {
                perm: Some(perm),
                ..OwnerChange::default()
            };
            if let Some(new) = view::changed_record(&self.policy, inode.kind, rec, change) {
                self.write_record(inode.fd()?.as_fd(), &new)?;
            }
        }
        Ok(())
    }

    pub(super) fn data(&self, fh: u64) -> FsResult<OpenFile> {
        match self.handles.get(&fh).as_deref() {
            Some(Handle::File(f)) => Ok(f.clone()),
            _ => Err(FsError::UnknownHandle(fh)),
        }
    }

    /// Reads through the daemon (when passthrough is not in use).
    ///
    /// # Errors
    /// `EBADF` for an unknown handle, or the error of `pread`.
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let data = self.data(fh)?.data;
        Ok(file::read_at(data.fd.as_fd(), offset, size as usize)?)
    }

    /// Writes through the daemon (when passthrough is not in use).
    ///
    /// # Errors
    /// `EROFS`, `EBADF` for a read-only handle, or the error of `pwrite`.
    pub fn write(&self, fh: u64, offset: u64, bytes: &[u8]) -> FsResult<usize> {
        self.writable()?;
        let OpenFile { data, sync } = self.data(fh)?;
        if !data.writable {
            return Err(FsError::Os(Errno::EBADF));
        }
        let n = file::write_at(data.fd.as_fd(), offset, bytes)?;
        if sync {
            file::sync(data.fd.as_fd(), Flush::Data)?;
        }
        Ok(n)
    }

    /// Flushes a file's data (and metadata unless `data_only`) to the backing store.
    ///
    /// # Errors
    /// `EBADF` for an unknown handle, or the error of `fsync`.
    pub fn fsync(&self, fh: u64, how: Flush) -> FsResult<()> {
        let fd = match self.handles.get(&fh).as_deref() {
            Some(Handle::File(f)) => Arc::clone(&f.data),
            Some(Handle::Dir(d)) => {
                let d = Arc::clone(d);
                let stream = lock(&d);
                return Ok(file::sync(stream.fd.as_fd(), how)?);
            }
            None => return Err(FsError::UnknownHandle(fh)),
        };
        Ok(file::sync(fd.fd.as_fd(), how)?)
    }

    /// `fallocate` on an open file.
    ///
    /// # Errors
    /// `EROFS`, `EBADF`, or the error of the call.
    pub fn fallocate(&self, fh: u64, offset: u64, len: u64, mode: i32) -> FsResult<()> {
        self.writable()?;
        let data = self.data(fh)?.data;
        if !data.writable {
            return Err(FsError::Os(Errno::EBADF));
        }
        Ok(file::allocate(data.fd.as_fd(), mode, offset, len)?)
    }

    /// `lseek` for `SEEK_DATA`/`SEEK_HOLE` on an open file.
    ///
    /// # Errors
    /// `EBADF`, `ENXIO` past the data, or the error of the call.
    pub fn lseek(&self, fh: u64, offset: i64, whence: i32) -> FsResult<u64> {
        let data = self.data(fh)?.data;
        Ok(file::seek(data.fd.as_fd(), offset, whence)?)
    }

    /// `copy_file_range` between two open files of the view.
    ///
    /// # Errors
    /// `EROFS`, `EBADF`, or the error of the call.
    pub fn copy_file_range(
        &self,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> FsResult<usize> {
        self.writable()?;
        let src = self.data(fh_in)?.data;
        let dst = self.data(fh_out)?.data;
        if !dst.writable {
            return Err(FsError::Os(Errno::EBADF));
        }
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        Ok(file::copy_range(
            src.fd.as_fd(),
            off_in,
            dst.fd.as_fd(),
            off_out,
            len,
        )?)
    }

    /// Closes a file or directory handle.
    pub fn release(&self, fh: u64) {
        self.handles.remove(&fh);
    }
}
