//! The handover of a view's tables: journaled as they change (for a keeper that
//! recovers a view that died), taken as a snapshot (for a process that takes a live
//! view over), and restored from either.

use std::collections::HashMap;
use std::os::fd::BorrowedFd;

use super::super::journal::{Entry, Journal, Journaling, Replayed};
use super::super::snapshot::{
    FileSnapshot, HandleSnapshot, Passthrough, TableSnapshot, ViewSnapshot,
};
use super::*;

impl ViewFs {
    /// Writes the view's tables to a new journal and, once `keep` has handed it to the
    /// keeper, journals every change from then on there. The first call starts the
    /// journal; later ones compact it (it grows with every node id given and
    /// forgotten). Node ids and handles are frozen meanwhile (milliseconds for
    /// thousands of entries); `keep` failing leaves the old journal in use.
    ///
    /// # Errors
    /// The error of making the journal, or of `keep`.
    pub fn journal_to(
        &self,
        negotiated: crate::fs::journal::Negotiated,
        keep: impl FnOnce(&Journal) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let next = Journal::create()?;
        let journaling = self.journal.get().cloned();
        self.inodes.with_locked(|table| {
            let mut guard = journaling.as_ref().map(|j| j.write());
            let handles: Vec<Entry> = self
                .handles
                .iter()
                .flat_map(|e| {
                    let mut v = vec![handle_entry(*e.key(), e.value())];
                    if let Handle::File(f) = e.value() {
                        match f.data.passthrough_snapshot() {
                            Passthrough::Id(id) => v.push(Entry::Backing {
                                ino: f.ino,
                                writable: Some(f.data.writable),
                                id,
                            }),
                            Passthrough::Refused => v.push(Entry::Served {
                                ino: f.ino,
                                writable: f.data.writable,
                            }),
                            Passthrough::Untried => {}
                        }
                    }
                    v
                })
                .collect();
            next.write_tables(negotiated, &table, &handles);
            keep(&next)?;
            match (journaling.as_ref(), guard.as_mut()) {
                (Some(j), Some(g)) => j.install(g, next),
                _ => {
                    let j = Arc::new(Journaling::new(next));
                    self.inodes.set_journal(Arc::clone(&j));
                    let _ = self.journal.set(j);
                }
            }
            Ok(())
        })
    }

    /// Whether the journal has grown past `floor` bytes and four times its compacted
    /// size.
    pub fn journal_wants_compaction(&self, floor: u64) -> bool {
        self.journal
            .get()
            .is_some_and(|j| j.wants_compaction(floor))
    }

    /// Whether a process started after this one dies could reach every inode again
    /// (the backing file system has file handles).
    pub fn recoverable(&self) -> bool {
        self.inodes.recoverable()
    }

    /// Journals that an inode's shared descriptor is served by the daemon for as long
    /// as it lives ([`Entry::Served`]).
    pub fn journal_served(&self, ino: u64, writable: bool) {
        if let Some(j) = self.journal.get() {
            j.append(&Entry::Served { ino, writable });
        }
    }

    /// Journals a passthrough registration of an inode's shared descriptor (the
    /// read-write one, or the read-only one).
    pub fn journal_backing(&self, ino: u64, writable: bool, id: u32) {
        if let Some(j) = self.journal.get() {
            j.append(&Entry::Backing {
                ino,
                writable: Some(writable),
                id,
            });
        }
    }
}

/// The journal line of a new handle.
pub(super) fn handle_entry(fh: u64, h: &Handle) -> Entry {
    match h {
        Handle::File(f) => Entry::File {
            fh,
            ino: f.ino,
            writable: f.data.writable,
            sync: f.sync,
        },
        Handle::Dir(d) => Entry::Dir { fh, ino: d.ino },
    }
}

impl ViewFs {
    /// The view's tables as plain data, with the descriptors they refer to by index:
    /// what a process that takes this view over needs. Call it while no request is
    /// being served (the FUSE workers are stopped).
    ///
    /// # Errors
    /// The error of duplicating a directory stream's descriptor (`EMFILE`).
    pub fn snapshot(&self) -> FsResult<(ViewSnapshot, Vec<Arc<OwnedFd>>)> {
        for entry in &self.handles {
            if let Handle::Dir(d) = entry.value() {
                self.forget_looked_ahead(d);
            }
        }
        let mut fds = Vec::new();
        let table = self.inodes.snapshot(&mut fds);
        let slots: HashMap<*const DataFile, u64> = self
            .inodes
            .open_files()
            .iter()
            .map(|(ino, d)| (Arc::as_ptr(d), *ino))
            .collect();
        let mut gathered = Gathered::new(fds);
        for entry in &self.handles {
            let fh = *entry.key();
            match entry.value() {
                Handle::File(f) => {
                    let ptr = Arc::as_ptr(&f.data);
                    let file = gathered.file(ptr, || {
                        Some(Shared {
                            ino: slots.get(&ptr).copied(),
                            fd: Arc::clone(&f.data.fd),
                            writable: f.data.writable,
                            passthrough: f.data.passthrough_snapshot(),
                        })
                    });
                    let file = file.expect("a live view's files are open");
                    gathered.file_handle(fh, f.ino, file, f.sync);
                }
                Handle::Dir(d) => {
                    let stream = lock(&d.stream);
                    let fd = Arc::new(crate::sys::fuse::dup(stream.fd.as_fd())?);
                    gathered.dir(fh, d.ino, fd);
                }
            }
        }
        Ok(gathered.finish(table, self.next_fh.load(Ordering::Relaxed)))
    }

    /// Takes over the tables of the process that served this view before: a new view
    /// (of the same backing directory, holding only its root) answers from now on for
    /// every node id and handle the kernel holds. `dev` is the connection, on which the
    /// predecessor's passthrough registrations stay open.
    ///
    /// # Errors
    /// [`FsError::Handover`] when the snapshot does not fit (another root, a missing
    /// descriptor, an unknown inode).
    pub fn restore(
        &self,
        snap: &ViewSnapshot,
        fds: Vec<OwnedFd>,
        dev: &Arc<OwnedFd>,
    ) -> FsResult<()> {
        let mut fds: Vec<Option<OwnedFd>> = fds.into_iter().map(Some).collect();
        self.inodes.restore(&snap.table, &mut fds)?;
        self.restore_handles(snap, &mut fds, dev)
    }

    /// The handles of `snap` (its table restored already), with their descriptors.
    fn restore_handles(
        &self,
        snap: &ViewSnapshot,
        fds: &mut [Option<OwnedFd>],
        dev: &Arc<OwnedFd>,
    ) -> FsResult<()> {
        let mut take = |i: usize| {
            fds.get_mut(i)
                .and_then(Option::take)
                .ok_or(FsError::Handover("a handle without its descriptor"))
        };
        let mut files = Vec::with_capacity(snap.files.len());
        let mut adopted = HashMap::new();
        for f in &snap.files {
            let inode = f.ino.map(|ino| self.inodes.get(ino)).transpose()?;
            let opens = inode
                .as_ref()
                .map_or_else(Arc::default, |i| Arc::clone(&i.opens));
            let data = Arc::new(DataFile::new(
                take(f.fd)?,
                f.writable,
                &self.journal,
                &self.live_files,
                &opens,
            ));
            data.adopt(f.passthrough, dev, &mut adopted);
            if let Some(inode) = inode {
                *lock(&inode.data) = Arc::downgrade(&data);
                if let Some(Some(r)) = data.passthrough.get() {
                    *lock(&inode.registration) = Arc::downgrade(r);
                }
            }
            files.push(data);
        }
        for h in &snap.handles {
            match *h {
                HandleSnapshot::File {
                    fh,
                    ino,
                    file,
                    sync,
                } => {
                    let data = files
                        .get(file)
                        .ok_or(FsError::Handover("a handle of an unknown file"))?;
                    self.handles.insert(
                        fh,
                        Handle::File(OpenFile {
                            ino,
                            data: Arc::clone(data),
                            sync,
                            _twin: None,
                        }),
                    );
                }
                HandleSnapshot::Dir { fh, ino, fd } => {
                    // No position matches: the next listing seeks where it asks.
                    let handle = self.dir_handle(ino, take(fd)?, u64::MAX);
                    self.handles.insert(fh, handle);
                }
            }
        }
        self.next_fh.fetch_max(snap.next_fh, Ordering::Relaxed);
        Ok(())
    }

    /// Reopens an inode's descriptor for a recovered handle. A view that acts as its
    /// callers opened it as one of them, and the daemon may not open it at all where
    /// the share squashes root (a pod's 0600 file on NFS). The journal keeps no
    /// opener's ids, so it is then reopened as the file's owner, in the file's group,
    /// and else as a member of that group who is not its owner: one of the two has
    /// the access any opener had, unless the file grants others more than both.
    fn reopen_for_recovery(
        &self,
        path_fd: BorrowedFd<'_>,
        kind: Kind,
        access: Access,
    ) -> Result<OwnedFd, Errno> {
        let denied = match file::reopen(path_fd, kind, access) {
            Err(e @ (Errno::EACCES | Errno::EPERM)) if self.cfg.acts_as_callers => e,
            done => return done,
        };
        let st = file::stat(path_fd)?;
        // Not the daemon's own ids, which would keep its capabilities; any uid but
        // the owner's is a member of the group to the share.
        let some = crate::sys::creds::SOME_CALLER_UID;
        let member = if st.uid == some { some + 1 } else { some };
        for uid in [st.uid, member] {
            if uid == 0 {
                continue;
            }
            let Ok(_acting) = crate::sys::creds::act_as(uid, st.gid, &[st.gid]) else {
                continue;
            };
            if let Ok(fd) = file::reopen(path_fd, kind, access) {
                return Ok(fd);
            }
        }
        Err(denied)
    }

    /// Rebuilds the tables of a view whose process died, from its journal: the same
    /// node ids, and the open handles with their shared descriptors reopened from the
    /// inodes' handles (with the passthrough registrations they had, which the
    /// connection kept). Returns how many handles could not be reopened (their file
    /// was deleted while open, or is open to none of the ids
    /// [`ViewFs::reopen_for_recovery`] tries): those answer `EBADF` from now on.
    ///
    /// # Errors
    /// [`FsError::Handover`] when the journal is of another root or has none.
    pub fn recover(&self, journal: &Replayed, dev: &Arc<OwnedFd>) -> FsResult<usize> {
        let table = journal
            .table()
            .ok_or(FsError::Handover("a journal without its root"))?;
        self.inodes.restore(&table, &mut [])?;
        let mut gathered = Gathered::new(Vec::new());
        let mut lost = 0;
        let reopen = |ino: u64, access: Access| -> Option<OwnedFd> {
            let inode = self.inodes.get(ino).ok()?;
            let path_fd = inode.fd().ok()?;
            let fd = self
                .inodes
                .with_fds(|| self.reopen_for_recovery(path_fd.as_fd(), inode.kind, access))
                .ok()?;
            self.no_atime(&fd, inode.kind);
            Some(fd)
        };
        for (&fh, &(ino, writable, sync)) in &journal.files {
            let access = if writable {
                Access::ReadWrite
            } else {
                Access::ReadOnly
            };
            let file = gathered.file((ino, writable), || {
                Some(Shared {
                    ino: Some(ino),
                    fd: reopen(ino, access)?,
                    writable,
                    passthrough: journal.passthrough_of(ino, writable),
                })
            });
            match file {
                Some(file) => gathered.file_handle(fh, ino, file, sync),
                None => lost += 1,
            }
        }
        for (&fh, &ino) in &journal.dirs {
            match reopen(ino, Access::Directory) {
                Some(fd) => gathered.dir(fh, ino, fd),
                None => lost += 1,
            }
        }
        let (snap, fds) = gathered.finish(table, journal.next_fh());
        let mut fds: Vec<Option<OwnedFd>> = fds.into_iter().map(Some).collect();
        self.restore_handles(&snap, &mut fds, dev)?;
        Ok(lost)
    }
}

/// A shared file as [`Gathered::file`] takes it: its descriptor itself.
struct Shared<F> {
    ino: Option<u64>,
    fd: F,
    writable: bool,
    passthrough: Passthrough,
}

/// A snapshot's shared files and handles as they are gathered, with the descriptors
/// they name by index: a live view's (`snapshot`, `F` shared with it) or a dead one's
/// opened again (`recover`). `K` tells one shared file from another.
struct Gathered<F, K> {
    fds: Vec<F>,
    files: Vec<FileSnapshot>,
    handles: Vec<HandleSnapshot>,
    shared: HashMap<K, usize>,
}

impl<F, K: Eq + std::hash::Hash> Gathered<F, K> {
    /// Gathering after `fds`, which the inode table's snapshot names already.
    fn new(fds: Vec<F>) -> Self {
        Gathered {
            fds,
            files: Vec::new(),
            handles: Vec::new(),
            shared: HashMap::new(),
        }
    }

    /// The index of the shared file `key` names, gathered by `open` the first time
    /// (`None`: it could not be opened, and is tried again by the next handle of it).
    fn file(&mut self, key: K, open: impl FnOnce() -> Option<Shared<F>>) -> Option<usize> {
        if let Some(i) = self.shared.get(&key) {
            return Some(*i);
        }
        let f = open()?;
        self.fds.push(f.fd);
        self.files.push(FileSnapshot {
            ino: f.ino,
            fd: self.fds.len() - 1,
            writable: f.writable,
            passthrough: f.passthrough,
        });
        self.shared.insert(key, self.files.len() - 1);
        Some(self.files.len() - 1)
    }

    fn file_handle(&mut self, fh: u64, ino: u64, file: usize, sync: bool) {
        self.handles.push(HandleSnapshot::File {
            fh,
            ino,
            file,
            sync,
        });
    }

    fn dir(&mut self, fh: u64, ino: u64, fd: F) {
        self.fds.push(fd);
        self.handles.push(HandleSnapshot::Dir {
            fh,
            ino,
            fd: self.fds.len() - 1,
        });
    }

    fn finish(self, table: TableSnapshot, next_fh: u64) -> (ViewSnapshot, Vec<F>) {
        let snap = ViewSnapshot {
            table,
            files: self.files,
            handles: self.handles,
            next_fh,
        };
        (snap, self.fds)
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::*;

    /// A listing holds its directory's stream while it looks entries up (the inode
    /// table's read lock); a journal compaction holds the table's write lock while it
    /// lists the open handles. It must not wait for a stream: that deadlocked a kept
    /// view under `bench/run`'s walk (a compaction during a READDIRPLUS look-ahead).
    #[test]
    fn a_compaction_never_waits_for_a_listing_that_waits_for_it() {
        let dir = populated(4);
        let v = std::sync::Arc::new(view(dir.path(), "gid=5"));
        v.journal_to(Default::default(), |_| Ok(())).unwrap();
        let fh = v.opendir(ROOT).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let listing = {
            let v = std::sync::Arc::clone(&v);
            std::thread::spawn(move || {
                let d = v.open_dir(fh).unwrap();
                // The listing: its stream held, then a lookup.
                let _stream = lock(&d.stream);
                let compaction = {
                    let v = std::sync::Arc::clone(&v);
                    std::thread::spawn(move || {
                        v.journal_to(Default::default(), |_| Ok(())).unwrap()
                    })
                };
                // Let the compaction take the table's lock first.
                std::thread::sleep(std::time::Duration::from_millis(300));
                v.lookup(ROOT, OsStr::new("f1")).unwrap();
                drop(_stream);
                compaction.join().unwrap();
                tx.send(()).unwrap();
            })
        };
        assert!(
            rx.recv_timeout(std::time::Duration::from_secs(30)).is_ok(),
            "a compaction and a listing wait for each other"
        );
        listing.join().unwrap();
    }

    #[test]
    fn a_compacted_journal_replays_to_the_live_tables() {
        use std::collections::BTreeSet;
        let dir = populated(20);
        let v = view(dir.path(), "gid=5");
        let held = HeldJournal::default();
        held.take(&v);
        let name = |i: usize| format!("f{i}");
        let ids: Vec<u64> = (0..20)
            .map(|i| v.lookup(ROOT, OsStr::new(&name(i))).unwrap().ino)
            .collect();
        for id in &ids[..10] {
            v.forget(*id, 1);
        }
        let fhs: Vec<u64> = ids[10..15]
            .iter()
            .map(|id| v.open(*id, libc::O_RDONLY, ME.into()).unwrap().fh)
            .collect();
        v.release(fhs[0]);
        let d = v.opendir(ROOT).unwrap();
        // The size of the journal the keeper holds now.
        let held_len = || {
            let fd = lock(&held.0).as_ref().unwrap().try_clone().unwrap();
            std::fs::File::from(fd).metadata().unwrap().len()
        };
        let before = held_len();
        // Compacted: the new journal is what the keeper holds, and says only what is.
        held.take(&v);
        let after = held_len();
        assert!(
            after < before,
            "{after} bytes after compaction, {before} before"
        );
        // Changes after the compaction go to the new journal.
        v.forget(ids[19], 1);
        let late = v.open(ids[18], libc::O_RDONLY, ME.into()).unwrap().fh;
        v.release(fhs[1]);
        let r = held.replay();
        let want: BTreeSet<u64> = ids[10..19].iter().copied().collect();
        assert_eq!(r.inodes.keys().copied().collect::<BTreeSet<_>>(), want);
        let mut open: Vec<u64> = fhs[2..].to_vec();
        open.push(late);
        assert_eq!(r.files.keys().copied().collect::<Vec<_>>(), open);
        assert_eq!(r.dirs.keys().copied().collect::<Vec<_>>(), [d]);
        assert!(r.next_fh() > late);
    }

    /// A view killed between journaling an open's handle and registering its
    /// descriptor for passthrough (the kernel then resends the open to the recovered
    /// view) must not be recovered with the id of a descriptor of the same file that
    /// was closed before: the kernel no longer has that id, and every open of the
    /// file would fail with EIO for as long as the handle lives.
    #[test]
    fn a_recovered_view_never_gets_a_closed_backing_id() {
        use crate::fs::snapshot::Passthrough;
        let dir = populated(2);
        let v = view(dir.path(), "gid=5");
        let held = HeldJournal::default();
        held.take(&v);
        let ino = v.lookup(ROOT, OsStr::new("f0")).unwrap().ino;
        // Not a FUSE device: the ids are only journaled here, and closing one fails.
        let dev = Arc::new(OwnedFd::from(std::fs::File::open("/dev/null").unwrap()));
        // An open answered with id 7, and released: its descriptor and id go.
        let first = v.open(ino, libc::O_RDWR, ME.into()).unwrap();
        let registered = crate::sys::fuse::Backing::adopt(&dev, 7);
        assert_eq!(
            v.registration(ino, &first.data, || Some(registered)),
            Some(7)
        );
        v.release(first.fh);
        drop(first);
        // The next open's handle is journaled; the process dies before its
        // registration.
        let second = v.open(ino, libc::O_RDWR, ME.into()).unwrap();
        let r = held.replay();
        assert_eq!(
            r.files.get(&second.fh).map(|f| f.0),
            Some(ino),
            "the handle is journaled"
        );
        assert_eq!(r.passthrough_of(ino, true), Passthrough::Untried);
    }

    /// Two shared descriptors of one inode that name one registration (a reader's and
    /// a later writer's) still name one after a takeover and after a recovery: two
    /// registrations of one id would each close it, the second closing whatever the
    /// kernel gave that id since.
    #[test]
    fn descriptors_sharing_a_registration_share_it_after_a_takeover_and_a_recovery() {
        let ReaderThenWriter {
            _dir: dir,
            v,
            held,
            dev,
            reader: _reader,
            writer: _writer,
            ..
        } = reader_then_writer();
        let registrations = |v: &ViewFs| -> Vec<*const crate::fs::inode::Registered> {
            v.handles
                .iter()
                .filter_map(|h| match h.value() {
                    Handle::File(f) => f.data.passthrough.get().cloned().flatten(),
                    Handle::Dir(_) => None,
                })
                .map(|r| Arc::as_ptr(&r))
                .collect()
        };
        let one = |v: &ViewFs, what: &str| {
            let r = registrations(v);
            assert_eq!(r.len(), 2, "{what}");
            assert_eq!(r[0], r[1], "{what}: two registrations of id 7");
        };
        one(&v, "before");
        let (snap, fds) = v.snapshot().unwrap();
        let fds = fds.iter().map(|fd| rustix::io::dup(fd).unwrap()).collect();
        let taken = view(dir.path(), "gid=5");
        taken.restore(&snap, fds, &dev).unwrap();
        one(&taken, "taken over");
        let recovered = view(dir.path(), "gid=5");
        assert_eq!(recovered.recover(&held.replay(), &dev).unwrap(), 0);
        one(&recovered, "recovered");
    }

    /// A descriptor kept off passthrough (a file the view created on an SMB share)
    /// stays so in a recovered view, through the journal and its compaction: a
    /// recovered view that registered it would have the kernel fail the next open with
    /// EIO while a served open of the file holds the inode in cached mode.
    #[test]
    fn a_descriptor_served_by_the_daemon_is_recovered_served() {
        use crate::fs::snapshot::Passthrough;
        let dir = populated(2);
        let v = view(dir.path(), "gid=5");
        let held = HeldJournal::default();
        held.take(&v);
        let ino = v.lookup(ROOT, OsStr::new("f0")).unwrap().ino;
        let other = v.lookup(ROOT, OsStr::new("f1")).unwrap().ino;
        let served = v.open(ino, libc::O_RDWR, ME.into()).unwrap();
        assert!(served.data.keep_off_passthrough());
        assert!(served.data.keep_off_passthrough(), "and stays so");
        v.journal_served(ino, served.data.writable);
        let plain = v.open(other, libc::O_RDWR, ME.into()).unwrap();
        for compacted in [false, true] {
            if compacted {
                // The tables are written again, with what each descriptor is.
                held.take(&v);
            }
            let r = held.replay();
            assert_eq!(
                r.passthrough_of(ino, true),
                Passthrough::Refused,
                "{compacted}"
            );
            assert_eq!(
                r.passthrough_of(other, true),
                Passthrough::Untried,
                "{compacted}"
            );
        }
        v.release(served.fh);
        v.release(plain.fh);
    }
}
