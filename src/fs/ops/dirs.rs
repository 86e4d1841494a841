//! Directory streams and listings.

use super::*;

impl ViewFs {
    /// Opens a directory for listing.
    ///
    /// # Errors
    /// `ENOTDIR`, or the error of the open.
    pub fn opendir(&self, ino: u64) -> FsResult<u64> {
        let inode = self.dir(ino)?;
        let fd = file::reopen(inode.fd()?.as_fd(), inode.kind, Access::Directory)?;
        let stream = DirStream {
            ino: inode.id,
            fd,
            pos: 0,
            pending: VecDeque::new(),
            buf: vec![MaybeUninit::uninit(); DIR_BUF].into_boxed_slice(),
        };
        Ok(self.add_handle(Handle::Dir(Arc::new(Mutex::new(stream)))))
    }

    /// Lists a directory from `offset`, handing entries to `add` until it reports the
    /// reply full (returns `true`). With [`Listing::WithAttributes`], each entry but
    /// `.`/`..` is looked up (and counted) like [`ViewFs::lookup`]; an entry that is not
    /// handed over is forgotten again. With [`Listing::AsNeeded`], so are the entries
    /// of a chunk listed while the view sees a walk ([`super::super::listing`]), but for
    /// its probes; otherwise names only.
    ///
    /// # Errors
    /// `EBADF` for an unknown handle, or the error of `getdents64`.
    pub fn readdir(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        listing: Listing,
        mut add: impl FnMut(&DirItem, u64) -> bool,
    ) -> FsResult<()> {
        let stream = match self.handles.get(&fh).as_deref() {
            Some(Handle::Dir(d)) => Arc::clone(d),
            _ => return Err(FsError::UnknownHandle(fh)),
        };
        let mut s = lock(&stream);
        // Decided once per chunk: a walk that starts midway shows in the next one.
        let attributes = match listing {
            Listing::Names => false,
            Listing::WithAttributes => true,
            Listing::AsNeeded => self.listing.walking(),
        };
        if offset != s.pos {
            dir::seek(s.fd.as_fd(), offset)?;
            s.pending.clear();
            s.pos = offset;
        }
        loop {
            if s.pending.is_empty() {
                let DirStream { fd, buf, .. } = &mut *s;
                let batch = dir::read_batch(fd.as_fd(), buf)?;
                if batch.is_empty() {
                    return Ok(());
                }
                s.pending.extend(batch);
            }
            let Some(e) = s.pending.front() else {
                return Ok(());
            };
            let (next, reserved) = (e.next, namespace::is_reserved_name(&e.name));
            if reserved {
                // The daemon's own (an entry under construction): not part of the view.
                s.pending.pop_front();
                s.pos = next;
                continue;
            }
            let dot = e.name == b"." || e.name == b"..";
            let probe = listing == Listing::AsNeeded && !dot && self.listing.next_is_probe();
            if probe {
                self.listing.listed(ino, &e.name);
            }
            // What can fail is decided while the entry is still queued, so that an error
            // leaves it there for the next call.
            let (shown_ino, kind, attr) = if attributes && !dot && !probe {
                match self.lookup_entry(ino, OsStr::from_bytes(&e.name)) {
                    Ok(attr) => (attr.ino, attr.kind, Some(attr)),
                    // Gone since the listing, or a mount point: not part of the view.
                    Err(FsError::Os(Errno::ENOENT)) => {
                        s.pending.pop_front();
                        s.pos = next;
                        continue;
                    }
                    Err(err) => return Err(err),
                }
            } else {
                let kind = match e.kind {
                    Some(k) => k,
                    None => self.kind_of(ino, &e.name)?,
                };
                (if e.name == b"." { ino } else { e.ino }, kind, None)
            };
            // The name moves into the item and back, never copied.
            let e = s.pending.pop_front().expect("the entry just looked at");
            let item = DirItem {
                name: e.name,
                ino: shown_ino,
                kind,
                attr,
            };
            if add(&item, next) {
                if let Some(a) = item.attr {
                    self.forget(a.ino, 1);
                }
                s.pending.push_front(dir::DirEntry {
                    name: item.name,
                    ..e
                });
                return Ok(());
            }
            s.pos = next;
        }
    }

    /// The kind of a directory entry whose type the backing file system did not say.
    pub(super) fn kind_of(&self, dir: u64, name: &[u8]) -> FsResult<Kind> {
        if name == b"." || name == b".." {
            return Ok(Kind::Directory);
        }
        let p = self.dir(dir)?;
        let fd = file::open_child(p.fd()?.as_fd(), OsStr::from_bytes(name), self.root_mnt)?;
        Ok(file::stat(fd.as_fd())?.kind)
    }
}
