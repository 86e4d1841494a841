//! Open files: the handle table and I/O through the daemon.

use super::super::journal::Entry;
use super::*;

/// The flag an `execve(2)`'s open of a file carries into FUSE's `OPEN`
/// (`__FMODE_EXEC`, include/linux/fs.h; fs/exec.c `do_open_execat`).
pub(super) const OPEN_EXEC: i32 = 0x20;

impl ViewFs {
    pub(super) fn add_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let Some(journaling) = self.journal.get() else {
            self.handles.insert(fh, h);
            return fh;
        };
        // The record and the change under one read lock: a compaction sees both.
        let j = journaling.read();
        j.append(&super::handover::handle_entry(fh, &h));
        self.handles.insert(fh, h);
        fh
    }

    /// The passthrough registration of `data`, a shared descriptor of inode `ino`, got
    /// on its first open reply: the one another shared descriptor of the inode holds,
    /// if one does (a reader's read-only descriptor, where a writer opened a
    /// read-write one since: the kernel binds one backing file to an inode while any
    /// of its opens is, fs/fuse/iomode.c `fuse_inode_uncached_io_start`, and fails
    /// another with `EBUSY`); otherwise what `register` makes (`None`: refused, and
    /// the descriptor is served by the daemon). A view recovered after a crash must
    /// answer later opens of the inode with the same id, so it is journaled either way.
    pub fn registration(
        &self,
        ino: u64,
        data: &DataFile,
        register: impl FnOnce() -> Option<crate::sys::fuse::Backing>,
    ) -> Option<u32> {
        data.registered(|| {
            let inode = self.inodes.get(ino).ok();
            let mut held = inode.as_ref().map(|i| lock(&i.registration));
            let r = match held.as_ref().and_then(|h| h.upgrade()) {
                Some(r) => r,
                None => {
                    let Some(backing) = register() else {
                        self.journal_served(ino, data.writable);
                        return None;
                    };
                    let r = data.registration_of(backing);
                    if let Some(h) = held.as_mut() {
                        **h = Arc::downgrade(&r);
                    }
                    r
                }
            };
            self.journal_backing(ino, data.writable, r.id());
            Some(r)
        })
    }

    /// The shared I/O descriptor of an inode, opened now if no handle holds one.
    pub(super) fn shared_data(
        &self,
        inode: &Arc<Inode>,
        wants_write: bool,
    ) -> FsResult<Arc<DataFile>> {
        if let Some(d) = lock(&inode.data).upgrade()
            && (d.writable || !wants_write)
        {
            return Ok(d);
        }
        // Read-write where it may be, so that one descriptor serves every open; but a
        // reader's on a share whose client takes the kernel's passthrough open from
        // an open handle with the same access (the SMB client: [`ViewFs::twin`]),
        // where a read-write one costs the server a `CREATE` more than the raw
        // mount's open. A writer that comes while it is open opens a read-write one
        // beside it, which shares its registration ([`ViewFs::registration`]).
        let access =
            if self.cfg.readonly || (!wants_write && self.share.twins.load(Ordering::Relaxed)) {
                Access::ReadOnly
            } else {
                Access::ReadWrite
            };
        // Where a removed open file stays "delete pending", a removal waits until the
        // descriptor is in the slot, where it sees it (`ViewFs::removal`).
        let _no_removal = self.share.delete_pends.then(|| read(&self.removal));
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
        Self::same_file(inode, &fd)?;
        self.no_atime(&fd, inode.kind);
        let mut slot = lock(&inode.data);
        // Another open may have got there first; one descriptor per inode.
        if let Some(d) = slot.upgrade() {
            if d.writable || !wants_write {
                return Ok(d);
            }
        }
        let data = Arc::new(DataFile::new(
            fd,
            writable,
            &self.journal,
            &self.live_files,
            &inode.opens,
        ));
        *slot = Arc::downgrade(&data);
        Ok(data)
    }

    /// Checks that a descriptor reopened for `inode` is that file: where the inode is
    /// reached by a name (no handles: the SMB client), the name may lead to another
    /// file by now, made under it after this one was removed or moved away, and the
    /// open would have read and written that one, and the kernel's passthrough open
    /// of it, by the name, been refused once that one went in turn (`EIO`). `ENOENT`
    /// then, as for a file gone.
    fn same_file(inode: &Inode, fd: &OwnedFd) -> FsResult<()> {
        let InodeKey::Number { dev, ino, born } = inode.key else {
            return Ok(());
        };
        let st = file::stat(fd.as_fd())?;
        // A birth time compared where both tell one.
        let same_birth = match (born, st.btime) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        if (st.dev, st.ino) == (dev, ino) && same_birth {
            Ok(())
        } else {
            Err(FsError::Os(Errno::ENOENT))
        }
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
        if self.cfg.share_checks && flags & OPEN_EXEC != 0 {
            // The kernel checked only that some execute bit is set (fs/fuse/dir.c
            // `fuse_permission`); whether this caller may execute it is the share's.
            file::may(inode.fd()?.as_fd(), libc::X_OK)?;
        }
        let rec = if wants_write {
            self.writable()?;
            // One read of the record serves both checks.
            let rec = self.record_for(&inode)?;
            if view::write_refused(&self.cfg.policy, inode.kind, rec.as_ref()) {
                return Err(FsError::ReadOnlyFile);
            }
            Some(rec)
        } else {
            None
        };
        let data = self.shared_data(&inode, wants_write)?;
        if let Some(rec) = rec {
            // After the open, which on a network share brought the attributes this
            // reads (an NFS `OPEN`'s reply), so that it asks the server nothing more
            // than the raw mount's open; no write is made before the open's reply.
            self.drop_set_id_for_writer(&inode, rec, caller)?;
        }
        let direct = self.serves_direct(flags, &data)?;
        let twin = self.twin(&data, flags)?;
        let fh = self.add_handle(Handle::File(OpenFile {
            ino,
            data: Arc::clone(&data),
            sync: flags & (libc::O_SYNC | libc::O_DSYNC) != 0,
            _twin: twin,
        }));
        Ok(Opened { fh, data, direct })
    }

    /// Makes every later open of a regular file that the kernel's passthrough may
    /// serve open a twin of the file ([`ViewFs::twin`]); the transport asks for it
    /// where the source is on the kernel's SMB client and passthrough is on.
    pub fn twin_opens(&self) {
        self.share.twins.store(true, Ordering::Relaxed);
    }

    /// The twin of an open with `flags` of the file `data` holds: the file opened
    /// again through `data`'s descriptor with the caller's flags, where they can be
    /// given (readable, without `O_TRUNC` or `O_NOFOLLOW`: [`file::reopen_like`]).
    ///
    /// The kernel's passthrough open opens the backing file again, with the caller's
    /// flags (fs/fuse/passthrough.c `fuse_passthrough_open`, `backing_file_open`),
    /// and the SMB client sends the server a `CREATE` by the file's name for it, after
    /// the view answered: a removal that renamed the file aside meanwhile, here or on
    /// another node, fails it (`ENOENT`, or `EINVAL` where the client's lease of the
    /// file is held under its new name: MS-SMB2 3.3.5.9.8), and the kernel fails the
    /// caller's open with `EIO` (fs/fuse/iomode.c `fuse_file_io_open`). But the client
    /// first takes an open handle of the inode with the same flags where it has one
    /// (fs/smb/client/file.c `cifs_open`: the first readable one, or writable one for
    /// a writer, with equal `f_flags`), and sends nothing. The twin is made last, so
    /// it comes first, while no removal is made (`ViewFs::removal`), so it finds the
    /// file under its name or moved aside; it lives as long as the handle. A caller
    /// whose flags cannot be given, or whose open meets another's twin with other
    /// flags first, costs the server a `CREATE` as without a twin.
    ///
    /// # Errors
    /// What the server answered the twin's `CREATE` (`ENOENT`, `EBUSY`, `EACCES`:
    /// the file removed on another node while this view holds it, say). The kernel's
    /// passthrough open would send the same `CREATE` and fail the caller with `EIO`;
    /// the open fails with the server's answer instead, as the raw mount's does. Only
    /// the daemon's own shortages (descriptors, memory) leave the open to the kernel.
    fn twin(&self, data: &DataFile, flags: i32) -> FsResult<Option<Arc<OwnedFd>>> {
        if !self.share.twins.load(Ordering::Relaxed)
            || flags & libc::O_ACCMODE == libc::O_WRONLY
            || !file::can_reopen_like(flags)
            || matches!(data.passthrough.get(), Some(None))
        {
            return Ok(None);
        }
        let _no_removal = read(&self.removal);
        match self
            .inodes
            .with_fds(|| file::reopen_like(data.fd.as_fd(), flags))
        {
            Ok(fd) => Ok(Some(Arc::new(fd))),
            Err(e @ (Errno::EMFILE | Errno::ENFILE | Errno::ENOMEM)) => {
                tracing::debug!(error = %e, flags, "no twin for an open; the kernel's passthrough open asks the server");
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Whether an open with `flags` is served by the view in direct I/O
    /// (`direct_io=view` and `O_DIRECT`). Such an open makes the file's direct
    /// descriptor at once, so that it fails where `open(O_DIRECT)` would fail without
    /// the view (`EINVAL`: no direct I/O on the backing file system).
    ///
    /// # Errors
    /// The error of reopening the file with `O_DIRECT`.
    pub(super) fn serves_direct(&self, flags: i32, data: &DataFile) -> FsResult<bool> {
        if flags & libc::O_DIRECT == 0 || self.cfg.direct_io != crate::config::DirectIo::View {
            return Ok(false);
        }
        data.direct()?;
        Ok(true)
    }

    /// The kernel leaves dropping set-id bits on write to the view
    /// (`FUSE_HANDLE_KILLPRIV_V2`), and passthrough writes never reach the daemon. So a
    /// writer drops what the kernel drops on its first write
    /// ([`view::set_id_bits_a_write_drops`]) when it opens the file for writing.
    /// Whether it has `CAP_FSETID`, and its groups, come
    /// from `/proc`, and only for a file that has set-id bits: FUSE sends neither (nor,
    /// once the view allows idmapped mounts, its uid). The backing file system itself
    /// still removes `security.capability` on every write, passthrough included.
    pub(super) fn drop_set_id_for_writer(
        &self,
        inode: &Arc<Inode>,
        rec: Option<Record>,
        caller: Caller,
    ) -> FsResult<()> {
        let st = file::stat(inode.fd()?.as_fd())?;
        let shown = self.attr_with(inode, &st, rec.as_ref());
        let owner = Owner {
            uid: shown.uid,
            gid: shown.gid,
            perm: shown.perm,
        };
        let kill = view::set_id_bits_a_write_drops(owner, || Self::credentials(caller));
        if kill == 0 {
            return Ok(());
        }
        let perm = shown.perm & !kill;
        if self.cfg.policy.changes_disk() {
            file::chmod(inode.fd()?.as_fd(), perm)?;
        } else {
            let change = OwnerChange {
                perm: Some(perm),
                ..OwnerChange::default()
            };
            if let Some(new) = view::changed_record(&self.cfg.policy, inode.kind, rec, change) {
                self.write_record(inode.fd()?.as_fd(), inode.kind, &new)?;
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

    /// Reads through the daemon (when passthrough is not in use, or the file is served
    /// in direct I/O). `direct`: the caller's file has `O_DIRECT` (the request's open
    /// flags, which follow `fcntl(F_SETFL)`), so the read is direct too.
    ///
    /// # Errors
    /// `EBADF` for an unknown handle, or the error of `pread`.
    pub fn read(&self, fh: u64, offset: u64, size: u32, direct: bool) -> FsResult<Vec<u8>> {
        let data = self.data(fh)?.data;
        if direct {
            return Ok(crate::sys::direct::read_at(
                data.direct()?,
                offset,
                size as usize,
            )?);
        }
        Ok(file::read_at(data.fd.as_fd(), offset, size as usize)?)
    }

    /// Writes through the daemon (when passthrough is not in use, or the file is
    /// served in direct I/O). `direct` as for [`ViewFs::read`]; the kernel's write-back
    /// of cached pages is never direct (its last page may be short of a block).
    ///
    /// # Errors
    /// `EROFS`, `EBADF` for a read-only handle, or the error of `pwrite`.
    pub fn write(&self, fh: u64, offset: u64, bytes: &[u8], direct: bool) -> FsResult<usize> {
        self.writable()?;
        let OpenFile { data, sync, .. } = self.data(fh)?;
        if !data.writable {
            return Err(FsError::Os(Errno::EBADF));
        }
        let n = if direct {
            crate::sys::direct::write_at(data.direct()?, offset, bytes)?
        } else {
            file::write_at(data.fd.as_fd(), offset, bytes)?
        };
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
                let stream = lock(&d.stream);
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
        let removed = match self.journal.get() {
            None => self.handles.remove(&fh),
            Some(journaling) => {
                let j = journaling.read();
                let removed = self.handles.remove(&fh);
                if removed.is_some() {
                    j.append(&Entry::Released { fh });
                }
                removed
            }
        };
        if let Some((_, Handle::Dir(d))) = removed {
            self.forget_looked_ahead(&d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::*;
    use super::*;

    #[test]
    fn a_writer_after_a_reader_shares_its_registration() {
        use crate::fs::snapshot::Passthrough;
        let ReaderThenWriter {
            _dir,
            v,
            held,
            ino,
            dev,
            reader,
            writer,
        } = reader_then_writer();
        let r = held.replay();
        assert_eq!(r.passthrough_of(ino, false), Passthrough::Id(7));
        assert_eq!(r.passthrough_of(ino, true), Passthrough::Id(7));
        // Readers from now on take the writer's descriptor.
        let later = v.open(ino, libc::O_RDONLY, ME.into()).unwrap();
        assert!(Arc::ptr_eq(&later.data, &writer.data));
        v.release(reader.fh);
        drop(reader);
        assert_eq!(held.replay().passthrough_of(ino, true), Passthrough::Id(7));
        v.release(later.fh);
        v.release(writer.fh);
        drop((later, writer));
        assert_eq!(
            held.replay().passthrough_of(ino, true),
            Passthrough::Untried
        );
        // The next open registers anew.
        let next = v.open(ino, libc::O_RDONLY, ME.into()).unwrap();
        let again = crate::sys::fuse::Backing::adopt(&dev, 8);
        assert_eq!(v.registration(ino, &next.data, || Some(again)), Some(8));
        v.release(next.fh);
    }

    #[test]
    fn fifos_are_never_opened_by_the_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let v = view(dir.path(), "gid=5");
        let p = v
            .mknod(ROOT, OsStr::new("p"), libc::S_IFIFO | 0o644, ME)
            .unwrap();
        assert_eq!(p.kind, Kind::Fifo);
        assert_eq!(
            v.open(p.ino, libc::O_RDONLY, ME.into()).err(),
            Some(FsError::WrongKind)
        );
    }
}
