//! Namespace operations: creating, linking, removing and renaming entries.
//!
//! A new entry that the daemon must act on after creating it (write its ownership
//! record, or chown it to the caller) is made under a reserved, unguessable name in
//! its own parent directory, given its ownership through the descriptor the daemon
//! holds, and only then renamed to its name with `RENAME_NOREPLACE`. No other view can
//! name the reserved entry (every view hides and refuses the reserved prefix), so the
//! record and the chown land on the inode this create made, never on one that another
//! view swapped under the name (`renameat2(RENAME_EXCHANGE)`). Made in the parent
//! itself, the entry inherits what the file system gives a new entry there: a setgid
//! parent's group, default ACLs, project quota ids.

use std::os::unix::ffi::OsStringExt;

use crate::fs::inode::{MovedAside, OpenHold, left_aside};

use super::*;

/// The prefix of names a view reserves for the daemon: hidden from lookups and
/// listings, refused as the name of anything a pod makes, renames or removes.
pub const RESERVED_NAME_PREFIX: &[u8] = b".mountgroup.";

/// Whether `name` is one of the daemon's reserved names.
pub fn is_reserved_name(name: &[u8]) -> bool {
    name.starts_with(RESERVED_NAME_PREFIX)
}

/// Refuses a reserved name as the target of a mutation.
fn refuse_reserved(name: &OsStr) -> FsResult<()> {
    if is_reserved_name(name.as_bytes()) {
        Err(FsError::NotPermitted)
    } else {
        Ok(())
    }
}

/// A fresh reserved name for an entry under construction.
fn staging_name() -> std::ffi::OsString {
    reserved_name("new")
}

/// A fresh reserved name for `what`: the prefix, `what`, and 128 random bits.
fn reserved_name(what: &str) -> std::ffi::OsString {
    let n = crate::sys::process::random_u128();
    let mut name = RESERVED_NAME_PREFIX.to_vec();
    name.extend_from_slice(format!("{what}.{n:032x}").as_bytes());
    std::ffi::OsString::from_vec(name)
}

/// What a create does with a name that exists by the time the daemon makes the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existing {
    /// Answer `ESTALE`: the kernel looks the name up again and opens what it finds with
    /// its own permission checks, on the mount the caller used, with the caller's real
    /// groups: exact in every ID space, which the daemon's own check cannot be once
    /// the kernel sends no uid or gid outside creation requests. (fs/namei.c
    /// `do_filp_open` retries a path walk that ended in `ESTALE` with `LOOKUP_REVAL`;
    /// fs/fuse/dir.c `fuse_dentry_revalidate` then drops the negative dentry, and
    /// `fuse_atomic_open` looks the name up before it would create.) A name that
    /// appears again between that lookup and a second CREATE gives the caller
    /// `ESTALE`.
    Kernel,
    /// Open it here if the presented attributes let the creator: for a CREATE the
    /// kernel resent after the view's process died, whose first server may have made
    /// the very file (`O_EXCL` is then dropped; `ESTALE` would make the kernel answer
    /// `EEXIST`).
    Open,
}

/// How a new entry gets its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    /// Made under its name: the daemon does nothing to it afterwards.
    Direct,
    /// Made under a reserved name, adopted, then renamed into place.
    Staged,
}

impl ViewFs {
    /// Whether the daemon acts on an entry after making it, and so must make it where
    /// no other view can swap it: when it records ownership, or chowns it to a caller
    /// other than itself.
    fn placement(&self, creator: Creator) -> Placement {
        match self.cfg.policy {
            // The share made it as the creator, who owns it there already.
            Policy::Plain { .. } if self.cfg.acts_as_callers => Placement::Direct,
            Policy::Plain { gids, .. } => {
                let (euid, egid) = self.cfg.daemon_ids;
                if creator.uid == euid && gids.disk(creator.gid) == egid {
                    Placement::Direct
                } else {
                    Placement::Staged
                }
            }
            _ if self.cfg.policy.keeps_records() => Placement::Staged,
            _ => Placement::Direct,
        }
    }

    /// Makes an entry of `kind` named `name` in `parent` with `make`, adopts it for
    /// `creator`, and returns a descriptor of the very inode that `make` created.
    ///
    /// `make` is called with the directory and the name to create; `open` opens what
    /// it made (the descriptor of a created file need not be reopened by name).
    fn make_entry<T>(
        &self,
        parent: &Arc<Inode>,
        name: &OsStr,
        new: NewEntry,
        creator: Creator,
        make: impl FnOnce(std::os::fd::BorrowedFd<'_>, &OsStr) -> crate::sys::SysResult<T>,
        open: impl FnOnce(std::os::fd::BorrowedFd<'_>, &OsStr, T) -> FsResult<(OwnedFd, T)>,
    ) -> FsResult<(OwnedFd, T, Option<Record>)> {
        let pfd = parent.fd()?;
        let dir = pfd.as_fd();
        match self.placement(creator) {
            Placement::Direct => {
                let made = make(dir, name)?;
                #[cfg(test)]
                race_hook::run(dir, name);
                let (fd, extra) = open(dir, name, made)?;
                Ok((fd, extra, None))
            }
            Placement::Staged => {
                let parent_shown = self.inherited(parent)?;
                let temp = staging_name();
                let made = make(dir, &temp)?;
                // What another view can do now: only the final name is within reach.
                #[cfg(test)]
                race_hook::run(dir, name);
                let result = open(dir, &temp, made).and_then(|(fd, extra)| {
                    let record = self.adopt(parent, parent_shown, &fd, new, creator)?;
                    self.put_in_place(dir, &temp, name)?;
                    Ok((fd, extra, record))
                });
                if result.is_err() {
                    // Only the daemon can name the reserved entry: this removes what
                    // this call made, nothing else.
                    let what = if new.kind == Kind::Directory {
                        Remove::Directory
                    } else {
                        Remove::NonDirectory
                    };
                    let _ = file::unlink(dir, &temp, what);
                }
                result
            }
        }
    }

    /// Makes a regular file the way [`Placement::Staged`] asks, where the backing file
    /// system can make unnamed files: with `O_TMPFILE` in its parent, adopted through
    /// its descriptor, then linked under its name (`linkat`, which never replaces).
    /// Until the link it has no name at all, so no view and no reader of the backing
    /// directory ever sees it without its record, and a failure leaves nothing behind.
    /// It costs one change of the directory where the reserved name costs two (the
    /// entry made, then renamed). `None` where the file system has no `O_TMPFILE`
    /// (remembered: the reserved name is used from then on).
    fn create_unnamed(
        &self,
        parent: &Arc<Inode>,
        name: &OsStr,
        new: NewEntry,
        creator: Creator,
        disk_perm: u32,
    ) -> FsResult<Option<(OwnedFd, OwnedFd, Option<Record>)>> {
        if self.share.tmpfile_missing.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let pfd = parent.fd()?;
        let dir = pfd.as_fd();
        let parent_shown = self.inherited(parent)?;
        let data_fd = match file::create_unnamed(dir, disk_perm) {
            Ok(fd) => fd,
            Err(Errno::EOPNOTSUPP | Errno::EISDIR | Errno::EINVAL) => {
                tracing::info!(
                    "the backing file system cannot make unnamed files (O_TMPFILE); new files are staged under a reserved name"
                );
                self.share.tmpfile_missing.store(true, Ordering::Relaxed);
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        let path_fd = file::reopen(data_fd.as_fd(), Kind::Regular, Access::Path)?;
        let record = self.adopt(parent, parent_shown, &path_fd, new, creator)?;
        // What another view can do now: only the final name is within reach.
        #[cfg(test)]
        race_hook::run(dir, name);
        file::link_unnamed(data_fd.as_fd(), dir, name)?;
        Ok(Some((path_fd, data_fd, record)))
    }

    /// Renames the staged entry `temp` to `name`, never replacing what holds the name:
    /// `renameat2(RENAME_NOREPLACE)`. Where the backend lacks that flag (FUSE backends
    /// such as bindfs answer `EINVAL`), the name is checked to be free and a plain
    /// rename follows. That leaves an instant in which something put at the name would
    /// be replaced; it gives an attacker nothing: only a writer of this directory can
    /// put something there, and a writer of a directory without the sticky bit may
    /// remove its entries anyway, while in a sticky directory nobody can move another
    /// user's entry there. (A hard link of the held descriptor would be exact, but
    /// path-based FUSE backends lose track of a file linked and unlinked while open.)
    fn put_in_place(
        &self,
        dir: std::os::fd::BorrowedFd<'_>,
        temp: &OsStr,
        name: &OsStr,
    ) -> FsResult<()> {
        if !self.share.noreplace_missing.load(Ordering::Relaxed) {
            match file::rename(dir, temp, dir, name, libc::RENAME_NOREPLACE) {
                Err(Errno::EINVAL) => {
                    tracing::info!(
                        "the backing file system has no RENAME_NOREPLACE; new entries are renamed into place after a check"
                    );
                    self.share.noreplace_missing.store(true, Ordering::Relaxed);
                }
                r => return Ok(r?),
            }
        }
        match file::open_child(dir, name, None) {
            Ok(_) => Err(FsError::Os(Errno::EEXIST)),
            Err(Errno::ENOENT) => Ok(file::rename(dir, temp, dir, name, 0)?),
            Err(e) => Err(e.into()),
        }
    }

    /// What a new entry inherits from its parent: the parent's presented owner, read
    /// before the entry is made. Made first, the entry would change the parent, and a
    /// network file system (NFS) would then ask its server for the parent's attributes
    /// again, a round trip per create; read here, they come from the cache the
    /// kernel's permission check of the create has just filled.
    fn inherited(&self, parent: &Arc<Inode>) -> FsResult<Owner> {
        match self.cfg.policy {
            // Only fsgroup inherits from the parent; spare the stat otherwise.
            Policy::FsGroup { emulate: true, .. } => self.shown(parent),
            _ => Ok(Owner {
                uid: 0,
                gid: 0,
                perm: 0,
            }),
        }
    }

    /// Gives a new entry its ownership through the descriptor that reaches it: in a
    /// plain view, the disk's (created by root, handed to the caller as far as the
    /// backend allows); in a recording view, its record, which it returns (a new
    /// entry has no other, so it need not be read back). `parent_shown` is what
    /// [`ViewFs::inherited`] read before the entry was made.
    fn adopt(
        &self,
        parent: &Arc<Inode>,
        parent_shown: Owner,
        fd: &OwnedFd,
        new: NewEntry,
        creator: Creator,
    ) -> FsResult<Option<Record>> {
        match self.cfg.policy {
            Policy::Plain { .. } => self
                .give_to_creator(parent, fd, new, creator)
                .map(|()| None),
            _ => {
                match view::new_entry_record(
                    &self.cfg.policy,
                    creator,
                    parent_shown,
                    new.kind,
                    new.perm,
                ) {
                    // A symlink or FIFO takes no `user.` record: it shows the derived
                    // owner (SEMANTICS.md, `ownership=emulate-user`).
                    Some(rec) if record::holds(self.cfg.record_xattr, new.kind) => {
                        self.write_record(fd.as_fd(), new.kind, &rec)?;
                        Ok(Some(rec))
                    }
                    Some(_) => Ok(None),
                    None => Ok(None),
                }
            }
        }
    }

    fn give_to_creator(
        &self,
        parent: &Arc<Inode>,
        fd: &OwnedFd,
        new: NewEntry,
        creator: Creator,
    ) -> FsResult<()> {
        let pst = file::stat(parent.fd()?.as_fd())?;
        // Made in its parent, the entry has the group a setgid parent gives already.
        let gids = match self.cfg.policy {
            Policy::Plain { gids, .. } => gids,
            _ => view::GidSwap::default(),
        };
        let gid = (pst.perm & 0o2000 == 0).then_some(gids.disk(creator.gid));
        let (euid, egid) = self.cfg.daemon_ids;
        if creator.uid == euid && gid.is_none_or(|g| g == egid) {
            return Ok(());
        }
        match file::chown(fd.as_fd(), Some(creator.uid), gid) {
            Ok(()) => {}
            // A backend that cannot chown (CIFS, squashed NFS, an unprivileged daemon)
            // keeps the daemon as owner, as a CIFS mount would.
            Err(Errno::EPERM | Errno::EOPNOTSUPP | Errno::EINVAL) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        // chown clears set-id bits; put back what the creator asked for.
        let perm = self.cfg.policy.disk_create_perm(new.kind, new.perm);
        if perm & 0o6000 != 0 && new.kind != Kind::Symlink {
            file::chmod(fd.as_fd(), perm)?;
        }
        Ok(())
    }

    /// Creates and opens a regular file. A name that exists by then (the kernel sent
    /// CREATE because it believed the name absent) is `EEXIST` with `O_EXCL`, and
    /// otherwise handled as `existing` says.
    ///
    /// # Errors
    /// `EROFS`, `EEXIST`, `ESTALE` (the name appeared: the kernel opens it itself),
    /// `EACCES`, or the error of the system call.
    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        creator: Creator,
        existing: Existing,
    ) -> FsResult<Created> {
        self.writable()?;
        refuse_reserved(name)?;
        let p = self.dir(parent)?;
        let _making = self.names.making(parent, &p, name.as_bytes());
        let perm = mode & file::PERM_MASK;
        let disk_perm = self.cfg.policy.disk_create_perm(Kind::Regular, perm);
        let new = NewEntry {
            kind: Kind::Regular,
            perm,
        };
        let placement = self.placement(creator);
        let unnamed = match placement {
            Placement::Staged => self
                .create_unnamed(&p, name, new, creator, disk_perm)
                .transpose(),
            Placement::Direct => None,
        };
        // Made under its name by its creator, without `O_EXCL` unless the caller asked
        // for it, as the raw mount's open makes it: an exclusive create costs NFS a
        // SETATTR after its OPEN (`nfs4_exclusive_attrset`). What such an open finds
        // must be a new file all the same, or it is the name appearing (`EEXIST`).
        let fresh =
            placement == Placement::Direct && self.cfg.acts_as_callers && flags & libc::O_EXCL == 0;
        // Where the file's ownership goes into a record, its attributes are read while
        // the create's reply has them: the record and the rename into place that
        // follow change its ctime only, and an NFS client would ask its server for all
        // of them again after those, a GETATTR per create (counted in tests/shares.rs,
        // `a_view_spares_the_nfs_server_what_it_can`). A plain view chowns the file to
        // its creator afterwards, so it reads them after that.
        let mut early = None;
        let made = unnamed.unwrap_or_else(|| {
            self.make_entry(
                &p,
                name,
                new,
                creator,
                // A reserved name is the daemon's alone: no view lets anyone make
                // one, and it is random, so no writer of the share can guess it.
                |dir, n| {
                    if fresh || is_reserved_name(n.as_bytes()) {
                        file::create_fresh(dir, n, disk_perm)
                    } else {
                        file::create_file(dir, n, disk_perm)
                    }
                },
                |_, _, data_fd| {
                    let path_fd = file::reopen(data_fd.as_fd(), Kind::Regular, Access::Path)?;
                    if !matches!(self.cfg.policy, Policy::Plain { .. }) {
                        early = Some(file::stat(path_fd.as_fd())?);
                    }
                    Ok((path_fd, data_fd))
                },
            )
        });
        let (path_fd, data_fd, record) = match made {
            Ok(m) => m,
            Err(FsError::Os(Errno::EEXIST)) if flags & libc::O_EXCL == 0 => {
                return match existing {
                    Existing::Kernel => Err(FsError::NameAppeared),
                    Existing::Open => self.open_existing(parent, name, flags, creator),
                };
            }
            Err(e) => return Err(e),
        };
        let st = match early {
            Some(st) => st,
            None => file::stat(path_fd.as_fd())?,
        };
        self.open_new_file(path_fd, data_fd, &st, record, flags)
    }

    /// A file just made, in the table and open: its inode (`path_fd`, whose `statx`
    /// is `st`), its shared descriptor (`data_fd`), its attributes and a handle.
    fn open_new_file(
        &self,
        path_fd: OwnedFd,
        data_fd: OwnedFd,
        st: &Stat,
        record: Option<Record>,
        flags: i32,
    ) -> FsResult<Created> {
        let inode = self.inodes.lookup(path_fd, st);
        self.no_atime(&data_fd, Kind::Regular);
        let data = Arc::new(DataFile::new(
            data_fd,
            true,
            &self.journal,
            &self.live_files,
            &inode.opens,
        ));
        *lock(&inode.data) = Arc::downgrade(&data);
        let attr = self.attr_of_new(&inode, st, record);
        let direct = match self.serves_direct(flags, &data) {
            Ok(d) => d,
            Err(e) => {
                // The file stays, as open(O_CREAT|O_DIRECT) leaves it where the file
                // system has no direct I/O; the kernel was given no node id.
                self.forget(inode.id, 1);
                return Err(e);
            }
        };
        let fh = self.add_handle(Handle::File(OpenFile {
            ino: inode.id,
            data: Arc::clone(&data),
            sync: flags & (libc::O_SYNC | libc::O_DSYNC) != 0,
            _twin: None,
        }));
        Ok(Created {
            attr,
            fh,
            data,
            direct,
        })
    }

    /// A `CREATE` as the kernel sends it: [`ViewFs::create`], the name checked by the
    /// kernel when it is found taken ([`Existing::Kernel`]), and by the daemon where the
    /// request was `resent` (its first server, which died, may have made the very
    /// file: then it is opened). `serve_creates`: the file is served by the daemon, not
    /// by kernel passthrough, while this open lasts (`passthrough`: the connection
    /// has it), as is a file made as its caller with a mode that denies its owner what
    /// this open asks.
    ///
    /// # Errors
    /// Those of [`ViewFs::create`].
    pub fn create_for_kernel(
        &self,
        parent: u64,
        name: &OsStr,
        (mode, flags): (u32, i32),
        creator: Creator,
        resent: bool,
        (serve_creates, passthrough): (bool, bool),
    ) -> FsResult<Created> {
        let existing = if resent {
            Existing::Open
        } else {
            Existing::Kernel
        };
        let r = self.create(parent, name, mode, flags, creator, existing);
        let created = redo_as_done(resent, r, libc::EEXIST, || {
            let flags = flags & !libc::O_EXCL;
            self.create(parent, name, mode, flags, creator, Existing::Open)
        })?;
        // Over SMB the file is served by the daemon, and so is every open of it while
        // one made under this one lasts; not where another open bound the inode to a
        // backing file already (a resent create that found the file), since the kernel
        // would refuse this one.
        //
        // So is a file made as its caller on a share that checks the caller's
        // permissions on each open (NFS), with a mode that denies its owner what this
        // open asks (git writes its objects through a descriptor of a file it creates
        // 0444): the kernel's passthrough open of it, which is not a create, would be
        // refused (knfsd lets an owner past the mode only for the OPEN that created the
        // file: fs/nfsd/nfs4proc.c `do_open_lookup`) and the caller's create answered
        // EIO (fs/fuse/iomode.c `fuse_file_io_open`). The daemon's descriptor, opened
        // by the create itself, serves it.
        let served = serve_creates || (self.cfg.acts_as_callers && denies_its_creator(mode, flags));
        if served && passthrough && created.data.keep_off_passthrough() {
            self.journal_served(created.attr.ino, created.data.writable);
        }
        Ok(created)
    }

    /// The `O_CREAT` open of a name that exists, by the daemon ([`Existing::Open`]):
    /// the kernel checks no permission on a file it thinks it just created, so the
    /// daemon checks, on the attributes the view presents, that the creator may open
    /// the file as asked. Its uid and gid are the creation request's (mapped through
    /// the mount's idmapping by the kernel); its supplementary groups, which FUSE does
    /// not send, are read from `/proc` and compared in its own user namespace's IDs
    /// (`TaskCredentials::in_group`). Where they cannot be read (a caller in another
    /// pid namespace), only the owner, the primary group and "other" grant access: the
    /// check fails closed.
    fn open_existing(
        &self,
        parent: u64,
        name: &OsStr,
        flags: i32,
        creator: Creator,
    ) -> FsResult<Created> {
        let attr = self.lookup(parent, name)?;
        let checked = if attr.kind == Kind::Directory {
            Err(FsError::Os(Errno::EISDIR))
        } else if self.cfg.checks_access && !self.may_open(&attr, flags, creator) {
            Err(FsError::Os(Errno::EACCES))
        } else {
            self.open(attr.ino, flags, creator.into())
        };
        match checked {
            Ok(Opened { fh, data, direct }) => Ok(Created {
                attr,
                fh,
                data,
                direct,
            }),
            Err(e) => {
                self.forget(attr.ino, 1);
                Err(e)
            }
        }
    }

    fn may_open(&self, attr: &Attr, flags: i32, creator: Creator) -> bool {
        let want = view::Want::of_open_flags(flags);
        let shown = Owner {
            uid: attr.uid,
            gid: attr.gid,
            perm: attr.perm,
        };
        view::may_open(shown, creator, want, |gid| {
            crate::sys::process::task_credentials(creator.pid).is_ok_and(|c| c.in_group(gid))
        })
    }

    /// Creates a directory.
    ///
    /// # Errors
    /// `EROFS`, `EEXIST`, or the error of the system call.
    pub fn mkdir(&self, parent: u64, name: &OsStr, mode: u32, creator: Creator) -> FsResult<Attr> {
        let perm = mode & file::PERM_MASK;
        let disk_perm = self.cfg.policy.disk_create_perm(Kind::Directory, perm);
        let since = std::time::Instant::now();
        let attr = self.make_node(
            parent,
            name,
            NewEntry {
                kind: Kind::Directory,
                perm,
            },
            creator,
            |dir, n| file::mkdir(dir, n, disk_perm),
        )?;
        // It had no names when it was made.
        if let Ok(made) = self.inodes.get(attr.ino) {
            self.names.made_dir(attr.ino, &made, since);
        }
        Ok(attr)
    }

    /// Creates a FIFO, socket or empty regular file. Device nodes are refused.
    ///
    /// # Errors
    /// `EPERM` for a device node, `EROFS`, or the error of the system call.
    pub fn mknod(&self, parent: u64, name: &OsStr, mode: u32, creator: Creator) -> FsResult<Attr> {
        let kind = Kind::from_mode(mode).unwrap_or(Kind::Regular);
        if matches!(kind, Kind::CharDevice | Kind::BlockDevice) {
            return Err(FsError::NotPermitted);
        }
        let perm = mode & file::PERM_MASK;
        let disk_perm = self.cfg.policy.disk_create_perm(kind, perm);
        self.make_node(parent, name, NewEntry { kind, perm }, creator, |dir, n| {
            file::mknod(dir, n, kind, disk_perm)
        })
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
        creator: Creator,
    ) -> FsResult<Attr> {
        let new = NewEntry {
            kind: Kind::Symlink,
            perm: 0o777,
        };
        self.make_node(parent, name, new, creator, |dir, n| {
            file::symlink(target, dir, n)
        })
    }

    /// A directory, FIFO, socket, symlink or empty file: made by name, reached by
    /// opening that name in a directory no other view can change it in (staged) or
    /// right after making it (direct, where nothing is done to it).
    fn make_node(
        &self,
        parent: u64,
        name: &OsStr,
        new: NewEntry,
        creator: Creator,
        make: impl FnOnce(std::os::fd::BorrowedFd<'_>, &OsStr) -> crate::sys::SysResult<()>,
    ) -> FsResult<Attr> {
        self.writable()?;
        refuse_reserved(name)?;
        let p = self.dir(parent)?;
        let _making = self.names.making(parent, &p, name.as_bytes());
        let root_mnt = self.share.root_mnt;
        let (fd, (), record) = self.make_entry(&p, name, new, creator, make, |dir, n, ()| {
            let fd = file::open_child(dir, n, root_mnt)?;
            if file::stat(fd.as_fd())?.kind != new.kind {
                // Replaced between creation and open (direct placement only: a staged
                // name cannot be reached by anyone else): leave the stranger alone.
                return Err(FsError::Os(Errno::EEXIST));
            }
            Ok((fd, ()))
        })?;
        let st = file::stat(fd.as_fd())?;
        let inode = self.inodes.lookup(fd, &st);
        Ok(self.attr_of_new(&inode, &st, record))
    }

    /// The attributes of an entry this call made, whose record (if any) it wrote.
    fn attr_of_new(&self, inode: &Arc<Inode>, st: &Stat, written: Option<Record>) -> Attr {
        let record = written.filter(|_| self.cfg.policy.reads_record(st.kind));
        self.attr_with(inode, st, record.as_ref())
    }

    /// Makes a hard link of `ino` named `name` in `new_parent`.
    ///
    /// # Errors
    /// `EROFS`, `EEXIST`, or the error of the system call.
    pub fn link(&self, ino: u64, new_parent: u64, name: &OsStr) -> FsResult<Attr> {
        self.writable()?;
        refuse_reserved(name)?;
        let inode = self.inodes.get(ino)?;
        let p = self.dir(new_parent)?;
        let _making = self.names.making(new_parent, &p, name.as_bytes());
        let fd = inode.fd()?;
        file::link(fd.as_fd(), p.fd()?.as_fd(), name)?;
        // The linked inode itself, not whatever the new name holds by now: reached by
        // the new name where that is still it (an inode without a handle keeps the
        // descriptor of its latest lookup, and a network file system reopens it by
        // that name, which outlives the old one: git links its temporary object to
        // its name, then unlinks the temporary one), else through the old name.
        let was = file::stat(fd.as_fd())?;
        if let Ok(fresh) = file::open_child(p.fd()?.as_fd(), name, self.share.root_mnt) {
            let now = file::stat(fresh.as_fd())?;
            if (now.dev, now.ino, now.kind) == (was.dev, was.ino, was.kind) {
                return self.register(fresh);
            }
        }
        self.register(file::reopen(fd.as_fd(), inode.kind, Access::Path)?)
    }

    /// Removes a name (an empty directory with [`Remove::Directory`]).
    ///
    /// # Errors
    /// `EROFS`, `ENOENT`, `ENOTEMPTY`, or the error of the system call.
    pub fn unlink(&self, parent: u64, name: &OsStr, what: Remove) -> FsResult<()> {
        self.writable()?;
        if is_reserved_name(name.as_bytes()) {
            return Err(FsError::Os(Errno::ENOENT));
        }
        let p = self.dir(parent)?;
        let pfd = p.fd()?;
        if what == Remove::NonDirectory {
            self.let_go_of(&p, pfd.as_fd(), name);
            if self.share.delete_pends {
                // No open of a file begins its system call while this removal decides
                // and is made (`ViewFs::removal`): one already made is seen held, one
                // after finds no file.
                let _no_opens = write(&self.removal);
                if let Some(held) = self.held_child(pfd.as_fd(), name) {
                    return self.unlink_held(&pfd, name, &held);
                }
                return Ok(file::unlink(pfd.as_fd(), name, what)?);
            }
        }
        Ok(file::unlink(pfd.as_fd(), name, what)?)
    }

    /// A count of the shared descriptors of what `name` in `dir` is now, if the view
    /// holds it open (a hint: the name is read, not opened). Only an inode of the table
    /// can be open: the kernel opens what it looked up. Counted from the making of a
    /// shared descriptor, not from its handle, which an open adds after it lets a
    /// removal go on (`ViewFs::removal`), until it and its registration are closed,
    /// after the twins of its handles: a removal that finds the file let go finds no
    /// open of it left on the share, where one that ran while a `RELEASE` was closing
    /// them left the file "delete pending" and shown under its name
    /// ([`OpenHold::remove_when_let_go`]). Every one of the file's descriptors counts,
    /// not only the one the inode hands to new opens: a writer's read-write one made
    /// beside a reader's may go first.
    fn held_child(&self, dir: std::os::fd::BorrowedFd<'_>, name: &OsStr) -> Option<OpenHold> {
        // Nothing open, nothing held: spare the share the stat of the name.
        if self.live_files.none() {
            return None;
        }
        let st = file::stat_child(dir, name).ok()?;
        let key = InodeKey::of(&st, self.inodes.handle_of_child(dir, name));
        self.inodes.by_key(&key)?.opens.held()
    }

    /// Removes `name`, whose file the view holds open (`held`), where removing an open
    /// file leaves its name until the last handle closes (`delete_pends`): renamed to a
    /// reserved name (hidden from every view, and random), so that the name is free at
    /// once, as the caller, who has closed the file or holds it open, expects of an
    /// unlink; the reserved name is removed when the view lets the file go
    /// ([`OpenHold::remove_when_let_go`] says why not now).
    fn unlink_held(&self, dir: &Arc<OwnedFd>, name: &OsStr, held: &OpenHold) -> FsResult<()> {
        let hidden = reserved_name("gone");
        file::rename(dir.as_fd(), name, dir.as_fd(), &hidden, 0)?;
        held.remove_when_let_go(MovedAside {
            dir: Arc::clone(dir),
            name: hidden,
        });
        Ok(())
    }

    /// Before `name` in `dir` is removed or replaced: closes the view's cached
    /// descriptor of what it names, where the backing client would otherwise keep the
    /// name alive for it (NFS, `silly_renames`). What the kernel still holds of the
    /// inode is reached again through its handle (`ESTALE` once it is gone, as a
    /// removed file is); an open file keeps its own descriptor, and the client keeps
    /// its name as it would without the view.
    fn let_go_of(&self, parent: &Inode, dir: std::os::fd::BorrowedFd<'_>, name: &OsStr) {
        if !self.share.silly_renames {
            return;
        }
        // A view crosses no mount, so what the name holds is on its parent's device.
        if let Some(handle) = self.inodes.handle_of_child(dir, name) {
            self.inodes.let_go(parent.key.dev(), handle);
        }
    }

    /// Renames, with `RENAME_NOREPLACE`/`RENAME_EXCHANGE`.
    ///
    /// # Errors
    /// `EROFS`, `EINVAL` for other flags, `ENOENT`/`EPERM` for reserved names, or the
    /// error of the system call.
    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: u32,
    ) -> FsResult<()> {
        self.writable()?;
        if is_reserved_name(name.as_bytes()) {
            return Err(FsError::Os(Errno::ENOENT));
        }
        refuse_reserved(new_name)?;
        let p = self.dir(parent)?;
        let np = self.dir(new_parent)?;
        let _making = self.names.making(new_parent, &np, new_name.as_bytes());
        let npfd = np.fd()?;
        if flags & libc::RENAME_EXCHANGE == 0 {
            // What the new name held until now is removed by the rename.
            self.let_go_of(&np, npfd.as_fd(), new_name);
        }
        let pfd = p.fd()?;
        if self.share.delete_pends && flags == 0 {
            // As in `unlink`: no open of a file begins meanwhile.
            let _no_opens = write(&self.removal);
            if let Some(held) = self.held_child(npfd.as_fd(), new_name) {
                return self.rename_onto_held(pfd.as_fd(), name, &npfd, new_name, &held);
            }
            return Ok(file::rename(
                pfd.as_fd(),
                name,
                npfd.as_fd(),
                new_name,
                flags,
            )?);
        }
        Ok(file::rename(
            pfd.as_fd(),
            name,
            npfd.as_fd(),
            new_name,
            flags,
        )?)
    }

    /// Renames `name` onto `new_name`, whose file the view holds open, where the
    /// server refuses to replace an open file (`delete_pends`: the SMB client then
    /// removes the target itself, which leaves it "delete pending", and the rename
    /// fails with `ENOENT`): the held file is moved to a reserved name first, the
    /// rename made, and the held file removed. Between the two renames `new_name` is
    /// absent: not atomic, where without it the rename fails.
    fn rename_onto_held(
        &self,
        dir: std::os::fd::BorrowedFd<'_>,
        name: &OsStr,
        new_dir: &Arc<OwnedFd>,
        new_name: &OsStr,
        held: &OpenHold,
    ) -> FsResult<()> {
        let hidden = reserved_name("gone");
        let nd = new_dir.as_fd();
        file::rename(nd, new_name, nd, &hidden, 0)?;
        if let Err(e) = file::rename(dir, name, nd, new_name, 0) {
            if let Err(back) = file::rename(nd, &hidden, nd, new_name, 0) {
                left_aside(back, &hidden);
            }
            return Err(e.into());
        }
        // The rename is made; the old file goes when the view lets it go.
        held.remove_when_let_go(MovedAside {
            dir: Arc::clone(new_dir),
            name: hidden,
        });
        Ok(())
    }
}

/// What a create is asked to make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct NewEntry {
    pub kind: Kind,
    /// Permission, set-id and sticky bits the caller asked for (after its umask).
    pub perm: u32,
}

/// A test's stand-in for another view acting between a create's system calls (the
/// window a race loop aims at), so that the race is tested deterministically.
/// Whether a file created with `mode` denies its owner the access an open with
/// `flags` asks.
fn denies_its_creator(mode: u32, flags: i32) -> bool {
    let access = flags & libc::O_ACCMODE;
    let writes = access != libc::O_RDONLY;
    let reads = access != libc::O_WRONLY;
    (writes && mode & 0o200 == 0) || (reads && mode & 0o400 == 0)
}

#[cfg(test)]
pub(super) mod race_hook {
    use std::cell::RefCell;
    use std::ffi::OsStr;
    use std::os::fd::BorrowedFd;

    type Hook = Box<dyn FnMut(BorrowedFd<'_>, &OsStr)>;

    thread_local! {
        static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
    }

    /// Runs `hook` (with the parent directory and the final name) in the next create
    /// on this thread, right after the entry was made.
    pub fn set(hook: impl FnMut(BorrowedFd<'_>, &OsStr) + 'static) {
        HOOK.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
    }

    pub(super) fn run(dir: BorrowedFd<'_>, name: &OsStr) {
        if let Some(mut hook) = HOOK.with(|h| h.borrow_mut().take()) {
            hook(dir, name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::*;
    use super::*;

    #[test]
    fn a_file_removed_while_open_waits_under_a_reserved_name_until_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = view(dir.path(), "gid=5");
        // As on an SMB share (`ViewFs::new`), which this is not.
        v.share.delete_pends = true;
        let name = OsStr::new;
        let aside = || {
            std::fs::read_dir(dir.path())
                .unwrap()
                .flatten()
                .map(|e| e.file_name())
                .filter(|n| namespace::is_reserved_name(n.as_bytes()))
                .count()
        };
        for replace in [false, true] {
            std::fs::write(dir.path().join("pid"), "1234").unwrap();
            let ino = v.lookup(ROOT, name("pid")).unwrap().ino;
            let fh = v.open(ino, libc::O_RDONLY, ME.into()).unwrap().fh;
            if replace {
                std::fs::write(dir.path().join("new"), "5678").unwrap();
                v.rename(ROOT, name("new"), ROOT, name("pid"), 0).unwrap();
                assert_eq!(std::fs::read(dir.path().join("pid")).unwrap(), b"5678");
            } else {
                v.unlink(ROOT, name("pid"), Remove::NonDirectory).unwrap();
                assert!(!dir.path().join("pid").exists(), "the name is free at once");
            }
            // The kernel's passthrough open, made after the view's, must still find
            // the file: on an SMB server a removed open file refuses every open.
            assert_eq!(aside(), 1, "replace: {replace}");
            assert_eq!(v.read(fh, 0, 4, false).unwrap(), b"1234");
            v.release(fh);
            assert_eq!(aside(), 0, "gone with the last handle (replace: {replace})");
            v.forget(ino, 1);
        }
        // A file the view does not hold open is removed at once.
        std::fs::write(dir.path().join("closed"), "").unwrap();
        v.lookup(ROOT, name("closed")).unwrap();
        let keep = v.opendir(ROOT).unwrap();
        v.unlink(ROOT, name("closed"), Remove::NonDirectory)
            .unwrap();
        assert_eq!(aside(), 0);
        v.release(keep);
    }

    #[test]
    fn a_file_is_held_against_a_removal_by_a_reader_after_a_writer_beside_it_went() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = view(dir.path(), "gid=5");
        v.share.delete_pends = true;
        // Readers get read-only descriptors, and a writer one of its own beside them.
        v.twin_opens();
        std::fs::write(dir.path().join("pid"), "1234").unwrap();
        let ino = v.lookup(ROOT, OsStr::new("pid")).unwrap().ino;
        let reader = v.open(ino, libc::O_RDONLY, ME.into()).unwrap();
        let writer = v.open(ino, libc::O_RDWR, ME.into()).unwrap();
        assert!(!reader.data.writable && writer.data.writable);
        drop(writer.data);
        v.release(writer.fh);
        v.unlink(ROOT, OsStr::new("pid"), Remove::NonDirectory)
            .unwrap();
        only_moved_aside(dir.path());
        drop(reader.data);
        v.release(reader.fh);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_file_opened_but_not_yet_handed_out_is_held_against_a_removal() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = view(dir.path(), "gid=5");
        v.share.delete_pends = true;
        std::fs::write(dir.path().join("pid"), "1234").unwrap();
        let ino = v.lookup(ROOT, OsStr::new("pid")).unwrap().ino;
        // An open between making the shared descriptor and adding its handle, with
        // no other handle in the view: the kernel's passthrough open is still to come.
        let inode = v.inodes.get(ino).unwrap();
        let data = v.shared_data(&inode, false).unwrap();
        assert!(v.handles.is_empty());
        v.unlink(ROOT, OsStr::new("pid"), Remove::NonDirectory)
            .unwrap();
        only_moved_aside(dir.path());
        drop(data);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn create_honours_o_excl_and_records_the_creator() {
        let dir = tempfile::tempdir().unwrap();
        let v = view(dir.path(), "gid=5");
        let Created { attr, fh, data, .. } = v
            .create(
                ROOT,
                OsStr::new("n"),
                0o100640,
                libc::O_EXCL | libc::O_RDWR,
                ME,
                Existing::Open,
            )
            .unwrap();
        assert_eq!((attr.uid, attr.gid, attr.perm), (1000, 5, 0o640));
        assert!(data.writable);
        assert_eq!(v.write(fh, 0, b"abc", false).unwrap(), 3);
        assert_eq!(v.read(fh, 1, 10, false).unwrap(), b"bc");
        assert_eq!(
            v.create(
                ROOT,
                OsStr::new("n"),
                0o100600,
                libc::O_EXCL,
                ME,
                Existing::Open
            )
            .err(),
            Some(FsError::Os(Errno::EEXIST))
        );
        // `n` opened again without O_EXCL, by `who`.
        let reopen =
            |flags, who, existing| v.create(ROOT, OsStr::new("n"), 0o100600, flags, who, existing);
        // The name is left to the kernel, which looks it up again and opens it with its
        // own checks.
        assert_eq!(
            reopen(libc::O_RDWR, ME, Existing::Kernel).err(),
            Some(FsError::NameAppeared)
        );
        assert_eq!(FsError::NameAppeared.errno(), libc::ESTALE);
        // A resent create opens an existing file itself, its record untouched, but only
        // for a creator the presented attributes let in (0640 1000:5).
        let stranger = Creator {
            uid: 7,
            gid: 7,
            pid: 0,
        };
        for flags in [libc::O_RDWR, libc::O_RDONLY, libc::O_WRONLY | libc::O_TRUNC] {
            assert_eq!(
                reopen(flags, stranger, Existing::Open).err(),
                Some(FsError::Os(Errno::EACCES)),
                "flags {flags:#o}"
            );
        }
        let member = Creator { gid: 5, ..stranger };
        assert_eq!(
            reopen(libc::O_RDWR, member, Existing::Open).err(),
            Some(FsError::Os(Errno::EACCES)),
            "the group may read, not write"
        );
        let read = reopen(libc::O_RDONLY, member, Existing::Open).unwrap();
        let again = reopen(libc::O_RDWR, ME, Existing::Open).unwrap();
        assert_eq!((again.attr.uid, again.attr.perm), (1000, 0o640));
        assert!(Arc::ptr_eq(&data, &again.data), "one descriptor per inode");
        assert_eq!(v.inode_count(), 2, "refused opens were forgotten again");
        v.release(fh);
        v.release(read.fh);
        v.release(again.fh);
    }

    #[test]
    fn entries_are_made_under_reserved_names_that_no_view_can_reach() {
        let dir = tempfile::tempdir().unwrap();
        let v = view(dir.path(), "gid=5");
        v.mkdir(ROOT, OsStr::new("d"), 0o750, ME).unwrap();
        v.symlink(ROOT, OsStr::new("l"), OsStr::new("d"), ME)
            .unwrap();
        v.mknod(ROOT, OsStr::new("p"), libc::S_IFIFO | 0o640, ME)
            .unwrap();
        let c = v
            .create(
                ROOT,
                OsStr::new("f"),
                0o100640,
                libc::O_RDWR,
                ME,
                Existing::Kernel,
            )
            .unwrap();
        v.release(c.fh);
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["d", "f", "l", "p"], "nothing staged is left behind");
        // A reserved name (a leftover of a crashed daemon, say) is not part of a view.
        std::fs::write(dir.path().join(".mountgroup.new.0"), "x").unwrap();
        let n = OsStr::new(".mountgroup.new.0");
        assert_eq!(v.lookup(ROOT, n), Err(FsError::Os(Errno::ENOENT)));
        assert_eq!(
            v.unlink(ROOT, n, Remove::NonDirectory),
            Err(FsError::Os(Errno::ENOENT))
        );
        assert_eq!(
            v.rename(ROOT, n, ROOT, OsStr::new("x"), 0),
            Err(FsError::Os(Errno::ENOENT))
        );
        let x = OsStr::new(".mountgroup.x");
        assert_eq!(v.mkdir(ROOT, x, 0o755, ME), Err(FsError::NotPermitted));
        assert_eq!(
            v.create(ROOT, x, 0o100644, 0, ME, Existing::Kernel).err(),
            Some(FsError::NotPermitted)
        );
        assert_eq!(
            v.rename(ROOT, OsStr::new("f"), ROOT, x, 0),
            Err(FsError::NotPermitted)
        );
        let f = v.lookup(ROOT, OsStr::new("f")).unwrap().ino;
        assert_eq!(v.link(f, ROOT, x), Err(FsError::NotPermitted));
        let fh = v.opendir(ROOT).unwrap();
        let mut listed = Vec::new();
        v.readdir(ROOT, fh, 0, Listing::Names, Room::UNBOUNDED, |item, _| {
            listed.push(item.name.clone());
            false
        })
        .unwrap();
        v.release(fh);
        assert!(!listed.iter().any(|n| n.starts_with(b".mountgroup.")));
        // An existing name is refused without a trace.
        assert_eq!(
            v.mkdir(ROOT, OsStr::new("d"), 0o750, ME),
            Err(FsError::Os(Errno::EEXIST))
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 5);
    }

    /// A plain view hands a new entry to its caller, but a setgid parent's group stays,
    /// even when that group is the daemon's own.
    #[test]
    fn a_plain_view_keeps_a_setgid_parents_group() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let (_, egid) = crate::sys::process::effective_ids();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o2777)).unwrap();
        let v = view(dir.path(), "");
        let c = v
            .create(
                ROOT,
                OsStr::new("f"),
                0o100644,
                libc::O_RDWR,
                ME,
                Existing::Kernel,
            )
            .unwrap();
        v.release(c.fh);
        v.mkdir(ROOT, OsStr::new("d"), 0o755, ME).unwrap();
        for name in ["f", "d"] {
            let m = std::fs::metadata(dir.path().join(name)).unwrap();
            assert_eq!((m.uid(), m.gid()), (ME.uid, egid), "{name}");
        }
        let d = std::fs::metadata(dir.path().join("d")).unwrap();
        assert_ne!(d.mode() & 0o2000, 0, "a new directory inherits setgid");
        // Without setgid on the parent, the caller's group.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        v.mkdir(ROOT, OsStr::new("e"), 0o755, ME).unwrap();
        let e = std::fs::metadata(dir.path().join("e")).unwrap();
        assert_eq!((e.uid(), e.gid()), (ME.uid, ME.gid));
    }

    /// Another view moves a victim's entry onto the name a create is making, in the
    /// window after the entry was made: the creator's record must not land on it.
    #[test]
    fn a_name_swapped_during_a_create_never_takes_the_record() {
        name_swap_during_create(false);
    }

    /// The same where the backing file system cannot make unnamed files, so that new
    /// files are staged under a reserved name as directories are.
    #[test]
    fn a_name_swapped_during_a_staged_create_never_takes_the_record() {
        name_swap_during_create(true);
    }

    fn name_swap_during_create(no_tmpfile: bool) {
        let dir = tempfile::tempdir().unwrap();
        let v = view(dir.path(), "gid=5");
        v.share.tmpfile_missing.store(no_tmpfile, Ordering::Relaxed);
        let victim = Creator {
            uid: 3000,
            gid: 5,
            pid: 0,
        };
        for (i, kind) in ["dir", "fifo", "symlink", "file"].into_iter().enumerate() {
            let vname = format!("victim-{i}");
            let vattr = v.mkdir(ROOT, OsStr::new(&vname), 0o700, victim).unwrap();
            let target = format!("new-{i}");
            let (from, to) = (vname.clone(), target.clone());
            namespace::race_hook::set(move |dir, _| {
                rustix::fs::renameat(dir, from.as_str(), dir, to.as_str()).unwrap();
            });
            let n = OsStr::new(&target);
            let r = match kind {
                "dir" => v.mkdir(ROOT, n, 0o755, ME).map(|_| ()),
                "fifo" => v.mknod(ROOT, n, libc::S_IFIFO | 0o644, ME).map(|_| ()),
                "symlink" => v.symlink(ROOT, n, OsStr::new("x"), ME).map(|_| ()),
                _ => v
                    .create(ROOT, n, 0o100644, libc::O_RDWR, ME, Existing::Kernel)
                    .map(|c| v.release(c.fh)),
            };
            // Whatever the create answers, the victim keeps its owner and mode.
            let _ = r;
            let moved = v.lookup(ROOT, n).unwrap();
            assert_eq!(moved.ino, vattr.ino, "{kind}: the victim holds the name");
            assert_eq!(
                (moved.uid, moved.perm),
                (3000, vattr.perm),
                "{kind}: the victim's record changed"
            );
        }
    }

    /// A new file gets its name only once its record is on it: a reader of the backing
    /// directory (another view, the backend itself) finds no entry for it before, under
    /// any name, and a create that fails there leaves nothing behind. Where the backing
    /// file system cannot make unnamed files, the file waits under a reserved name.
    #[test]
    fn a_new_file_has_no_name_on_disk_until_it_has_its_record() {
        for no_tmpfile in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let v = view(dir.path(), "gid=5");
            v.share.tmpfile_missing.store(no_tmpfile, Ordering::Relaxed);
            let seen: Arc<Mutex<Vec<Vec<u8>>>> = Arc::new(Mutex::new(Vec::new()));
            let s = Arc::clone(&seen);
            let backing = dir.path().to_path_buf();
            namespace::race_hook::set(move |_, _| {
                let names = std::fs::read_dir(&backing)
                    .unwrap()
                    .map(|e| e.unwrap().file_name().as_bytes().to_vec())
                    .collect::<Vec<_>>();
                *lock(&s) = names;
            });
            let c = v
                .create(
                    ROOT,
                    OsStr::new("f"),
                    0o100600,
                    libc::O_RDWR,
                    ME,
                    Existing::Kernel,
                )
                .unwrap();
            v.release(c.fh);
            let seen = lock(&seen).clone();
            if no_tmpfile {
                assert_eq!(seen.len(), 1, "{seen:?}");
                assert!(namespace::is_reserved_name(&seen[0]), "{seen:?}");
            } else {
                assert!(seen.is_empty(), "named before its record: {seen:?}");
            }
            let names = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect::<Vec<_>>();
            assert_eq!(names, ["f"]);
            let a = v.lookup(ROOT, OsStr::new("f")).unwrap();
            assert_eq!((a.uid, a.perm), (ME.uid, 0o600), "its record");
            // A create that fails at that point (the name taken meanwhile) leaves
            // nothing behind: no reserved entry, no second name.
            namespace::race_hook::set(|dir, _| {
                rustix::fs::mkdirat(dir, "g", rustix::fs::Mode::from_raw_mode(0o755)).unwrap();
            });
            let r = v.create(
                ROOT,
                OsStr::new("g"),
                0o100600,
                libc::O_RDWR | libc::O_EXCL,
                ME,
                Existing::Kernel,
            );
            assert!(matches!(r, Err(FsError::Os(Errno::EEXIST))), "{no_tmpfile}");
            let mut names = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect::<Vec<_>>();
            names.sort();
            assert_eq!(names, ["f", "g"], "{no_tmpfile}");
            assert!(std::fs::metadata(dir.path().join("g")).unwrap().is_dir());
        }
    }

    #[test]
    fn device_nodes_and_privileged_xattrs_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), "x").unwrap();
        let v = view(dir.path(), "gid=5");
        assert_eq!(
            v.mknod(ROOT, OsStr::new("null"), libc::S_IFCHR | 0o666, ME),
            Err(FsError::NotPermitted)
        );
        assert_eq!(
            v.mknod(ROOT, OsStr::new("sda"), libc::S_IFBLK | 0o666, ME),
            Err(FsError::NotPermitted)
        );
        let f = v.lookup(ROOT, OsStr::new("f")).unwrap().ino;
        assert_eq!(
            v.setxattr(f, OsStr::new("trusted.x"), b"1", 0),
            Err(FsError::NotPermitted)
        );
        assert_eq!(
            v.setxattr(f, OsStr::new("security.capability"), b"1", 0),
            Err(FsError::NotPermitted)
        );
        assert_eq!(
            v.setxattr(f, OsStr::new("trusted.mountgroup.owner"), b"1", 0),
            Err(FsError::NotPermitted)
        );
        assert_eq!(
            v.setxattr(f, OsStr::new("system.posix_acl_access"), b"1", 0),
            Err(FsError::Os(Errno::EOPNOTSUPP))
        );
        v.setattr(
            f,
            None,
            SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            v.getxattr(f, OsStr::new("trusted.mountgroup.owner"), 0),
            Err(FsError::NoAttribute)
        );
        assert_eq!(
            v.removexattr(f, OsStr::new("trusted.mountgroup.owner")),
            Err(FsError::NoAttribute)
        );
        v.setxattr(f, OsStr::new("user.a"), b"1", 0).unwrap();
        assert_eq!(v.listxattr(f, 0, ME.into()).unwrap(), XattrReply::Size(7));
        assert_eq!(
            v.listxattr(f, 100, ME.into()).unwrap(),
            XattrReply::Data(b"user.a\0".to_vec())
        );
        assert_eq!(v.listxattr(f, 3, ME.into()), Err(FsError::TooLarge));
    }

    #[test]
    fn a_read_only_view_refuses_every_mutation() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), "x").unwrap();
        let v = view(dir.path(), "gid=5,ro");
        let f = v.lookup(ROOT, OsStr::new("f")).unwrap().ino;
        let n = OsStr::new("n");
        assert_eq!(
            v.create(ROOT, n, 0o644, 0, ME, Existing::Kernel).err(),
            Some(FsError::ReadOnly)
        );
        assert_eq!(v.mkdir(ROOT, n, 0o755, ME), Err(FsError::ReadOnly));
        assert_eq!(
            v.symlink(ROOT, n, OsStr::new("f"), ME),
            Err(FsError::ReadOnly)
        );
        assert_eq!(v.link(f, ROOT, n), Err(FsError::ReadOnly));
        assert_eq!(
            v.unlink(ROOT, OsStr::new("f"), Remove::NonDirectory),
            Err(FsError::ReadOnly)
        );
        assert_eq!(
            v.rename(ROOT, OsStr::new("f"), ROOT, n, 0),
            Err(FsError::ReadOnly)
        );
        assert_eq!(
            v.setattr(
                f,
                None,
                SetAttr {
                    size: Some(0),
                    ..Default::default()
                }
            ),
            Err(FsError::ReadOnly)
        );
        assert_eq!(
            v.open(f, libc::O_WRONLY, ME.into()).err(),
            Some(FsError::ReadOnly)
        );
        let Opened { fh, data, .. } = v.open(f, libc::O_RDONLY, ME.into()).unwrap();
        assert!(!data.writable);
        assert_eq!(v.write(fh, 0, b"y", false), Err(FsError::ReadOnly));
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"x");
    }
}
