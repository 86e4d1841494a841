//! The group view's operations on the backing tree, free of FUSE types so that they
//! can be tested against a temp dir and driven by the thin adapter in `fuse.rs`.
//!
//! Permission checks are the kernel's (`default_permissions`, on the presented
//! attributes); the daemon acts as root. What the daemon adds is what the kernel cannot
//! know: the view's read-only state, the CIFS read-only attribute, the hidden record,
//! and the refusal of anything that could reach outside the backing tree.

use std::collections::VecDeque;
use std::ffi::{CString, OsStr};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use dashmap::DashMap;

use crate::config::ViewOptions;
use crate::sys::Errno;
use crate::sys::file::{self, Access, FsStat, Kind, SetTime, Stat, Time};

use super::error::{FsError, FsResult};
use super::inode::{DataFile, Inode, InodeTable};
use super::record::{self, RECORD_XATTR, Record};
use super::view::{self, Caller, Owner, OwnerChange, Policy};

/// Attributes as the view presents them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    pub size: u64,
    pub blocks: u64,
    pub blksize: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub perm: u32,
    pub rdev: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    pub btime: Time,
}

/// A setattr request, after the kernel's own checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
}

/// An xattr answer: the size the caller must allocate, or the bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum XattrReply {
    Size(u32),
    Data(Vec<u8>),
}

/// One entry of a directory listing handed to the adapter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirItem {
    pub name: Vec<u8>,
    pub ino: u64,
    pub kind: Kind,
    /// Full attributes (readdirplus), counted as a kernel lookup; `None` for `.`/`..`
    /// and for plain readdir.
    pub attr: Option<Attr>,
}

struct OpenFile {
    data: Arc<DataFile>,
    /// O_SYNC/O_DSYNC: writes that go through the daemon are synced before the reply.
    sync: bool,
}

struct DirStream {
    fd: OwnedFd,
    /// The position the kernel will ask for next (the cookie of the front entry).
    pos: u64,
    pending: VecDeque<file::DirEntry>,
    buf: Box<[MaybeUninit<u8>]>,
}

enum Handle {
    File(OpenFile),
    Dir(Arc<Mutex<DirStream>>),
}

/// One group view over one backing directory.
pub struct ViewFs {
    policy: Policy,
    readonly: bool,
    inodes: InodeTable,
    root_mnt: Option<u64>,
    handles: DashMap<u64, Handle>,
    next_fh: AtomicU64,
    warned_bad_record: AtomicBool,
    /// The btrfs quota group of the volume, when the root is a btrfs subvolume:
    /// statfs then reports the volume's limit and usage, not the whole file system.
    qgroup: Option<std::path::PathBuf>,
}

const DIR_BUF: usize = 32 * 1024;

fn cstring(name: &OsStr) -> FsResult<CString> {
    CString::new(name.as_bytes()).map_err(|_| FsError::Os(Errno::EINVAL))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ViewFs {
    /// A view of the directory `root` (opened by [`file::open_root`]) with `options`.
    ///
    /// # Errors
    /// The error of `statx` on the root; `ENOTDIR` when it is not a directory.
    pub fn new(root: OwnedFd, options: &ViewOptions) -> FsResult<ViewFs> {
        let st = file::stat(root.as_fd())?;
        if st.kind != Kind::Directory {
            return Err(FsError::Os(Errno::ENOTDIR));
        }
        let qgroup = match crate::sys::btrfs::qgroup_dir(root.as_fd()) {
            Ok(q) => q,
            Err(e) => {
                tracing::warn!(error = %e, "cannot tell the btrfs quota group; statfs shows the whole file system");
                None
            }
        };
        if let Some(q) = &qgroup {
            tracing::info!(qgroup = %q.display(), "statfs follows the volume's btrfs quota group");
        }
        Ok(ViewFs {
            qgroup,
            policy: Policy::from_options(options),
            readonly: options.readonly,
            root_mnt: st.mnt_id,
            // Half the open-file limit for cached inode descriptors; the rest is for
            // open files and directories.
            inodes: InodeTable::new(
                root,
                &st,
                (crate::sys::process::nofile_limit() / 2).clamp(64, 65_536) as usize,
            ),
            handles: DashMap::new(),
            next_fh: AtomicU64::new(1),
            warned_bad_record: AtomicBool::new(false),
        })
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// How many inodes the kernel holds references to (the root included).
    pub fn inode_count(&self) -> usize {
        self.inodes.len()
    }

    /// How many file and directory handles are open.
    pub fn handle_count(&self) -> usize {
        self.handles.len()
    }

    fn writable(&self) -> FsResult<()> {
        if self.readonly {
            Err(FsError::ReadOnly)
        } else {
            Ok(())
        }
    }

    fn dir(&self, ino: u64) -> FsResult<Arc<Inode>> {
        let inode = self.inodes.get(ino)?;
        if inode.kind != Kind::Directory {
            return Err(FsError::Os(Errno::ENOTDIR));
        }
        Ok(inode)
    }

    fn read_record(&self, fd: std::os::fd::BorrowedFd<'_>) -> FsResult<Option<Record>> {
        match file::get_xattr(fd, RECORD_XATTR) {
            Ok(None) => Ok(None),
            Ok(Some(bytes)) => match Record::decode(&bytes) {
                Ok(r) => Ok(Some(r)),
                Err(why) => {
                    if !self.warned_bad_record.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            why,
                            "ignoring an ownership record this version cannot read"
                        );
                    }
                    Ok(None)
                }
            },
            // Some inode kinds on some file systems take no xattrs at all.
            Err(Errno::EOPNOTSUPP) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn write_record(&self, fd: std::os::fd::BorrowedFd<'_>, rec: &Record) -> FsResult<()> {
        if rec.is_empty() {
            match file::remove_xattr(fd, RECORD_XATTR) {
                Ok(()) | Err(Errno::ENODATA) => Ok(()),
                Err(e) => Err(e.into()),
            }
        } else {
            Ok(file::set_xattr(fd, RECORD_XATTR, &rec.encode(), 0)?)
        }
    }

    fn record_for(&self, inode: &Arc<Inode>) -> FsResult<Option<Record>> {
        if self.policy.reads_record(inode.kind) {
            self.read_record(inode.fd()?.as_fd())
        } else {
            Ok(None)
        }
    }

    fn attr(&self, inode: &Arc<Inode>, st: &Stat) -> FsResult<Attr> {
        let rec = self.record_for(inode)?;
        Ok(self.attr_with(inode, st, rec.as_ref()))
    }

    /// [`ViewFs::attr`] with the record already read.
    fn attr_with(&self, inode: &Inode, st: &Stat, rec: Option<&Record>) -> Attr {
        let disk = Owner {
            uid: st.uid,
            gid: st.gid,
            perm: st.perm,
        };
        let shown = view::present(&self.policy, st.kind, disk, rec);
        Attr {
            ino: inode.id,
            kind: st.kind,
            size: st.size,
            blocks: st.blocks,
            blksize: st.blksize,
            nlink: st.nlink,
            uid: shown.uid,
            gid: shown.gid,
            perm: shown.perm,
            rdev: st.rdev,
            atime: st.atime,
            mtime: st.mtime,
            ctime: st.ctime,
            btime: st.btime.unwrap_or(st.ctime),
        }
    }

    fn shown(&self, inode: &Arc<Inode>) -> FsResult<Owner> {
        let st = file::stat(inode.fd()?.as_fd())?;
        let a = self.attr(inode, &st)?;
        Ok(Owner {
            uid: a.uid,
            gid: a.gid,
            perm: a.perm,
        })
    }

    /// Looks a name up in a directory; counts one kernel lookup of the result.
    ///
    /// A mount point inside the backing tree is not crossed: it is reported as absent.
    ///
    /// # Errors
    /// `ENOENT` when absent, `ENOTDIR` when `parent` is not a directory.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> FsResult<Attr> {
        let p = self.dir(parent)?;
        let fd = match file::open_child(p.fd()?.as_fd(), name, self.root_mnt) {
            Ok(fd) => fd,
            Err(Errno::EXDEV) => return Err(FsError::Os(Errno::ENOENT)),
            Err(e) => return Err(e.into()),
        };
        self.register(fd)
    }

    fn register(&self, fd: OwnedFd) -> FsResult<Attr> {
        let st = file::stat(fd.as_fd())?;
        let inode = self.inodes.lookup(fd, &st);
        match self.attr(&inode, &st) {
            Ok(a) => Ok(a),
            Err(e) => {
                self.inodes.forget(inode.id, 1);
                Err(e)
            }
        }
    }

    /// Drops `n` kernel lookups of `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        self.inodes.forget(ino, n);
    }

    /// The presented attributes of `ino`.
    ///
    /// # Errors
    /// `ESTALE` for an unknown inode, or the error of `statx`.
    pub fn getattr(&self, ino: u64) -> FsResult<Attr> {
        let inode = self.inodes.get(ino)?;
        let st = file::stat(inode.fd()?.as_fd())?;
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
            if inode.kind != Kind::Regular {
                return Err(FsError::Os(if inode.kind == Kind::Directory {
                    Errno::EISDIR
                } else {
                    Errno::EINVAL
                }));
            }
            if view::write_refused(&self.policy, inode.kind, self.record_for(&inode)?.as_ref()) {
                return Err(FsError::ReadOnlyFile);
            }
            let via_handle = fh.and_then(|fh| match self.handles.get(&fh).as_deref() {
                Some(Handle::File(f)) if f.data.writable => Some(Arc::clone(&f.data)),
                _ => None,
            });
            match via_handle {
                Some(data) => file::truncate(data.fd.as_fd(), size)?,
                None => {
                    let fd = file::reopen(inode.fd()?.as_fd(), Access::ReadWrite)?;
                    file::truncate(fd.as_fd(), size)?;
                }
            }
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
        if !change.is_empty() {
            if self.policy.changes_disk() {
                if change.uid.is_some() || change.gid.is_some() {
                    file::chown(inode.fd()?.as_fd(), change.uid, change.gid)?;
                }
                if let Some(perm) = change.perm {
                    if inode.kind != Kind::Symlink {
                        file::chmod(inode.fd()?.as_fd(), perm)?;
                    }
                }
            } else {
                let current = self.record_for(&inode)?;
                if let Some(new) = view::changed_record(&self.policy, inode.kind, current, change) {
                    self.write_record(inode.fd()?.as_fd(), &new)?;
                }
            }
        }
        self.getattr(ino)
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

    /// Gives a new entry its ownership: in a plain view, the disk's (created by root,
    /// handed to the caller as far as the backend allows); in a recording view, its
    /// record. On failure the entry is removed again, so a create never half succeeds.
    fn adopt(
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

    fn give_to_caller(
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

    fn finish_new(
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

    fn add_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.insert(fh, h);
        fh
    }

    /// The shared I/O descriptor of an inode, opened now if no handle holds one.
    fn shared_data(&self, inode: &Arc<Inode>, wants_write: bool) -> FsResult<Arc<DataFile>> {
        let mut slot = lock(&inode.data);
        if let Some(d) = slot.upgrade() {
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
        let (fd, writable) = match file::reopen(inode.fd()?.as_fd(), access) {
            Ok(fd) => (fd, access == Access::ReadWrite),
            // A running executable (ETXTBSY), an immutable file, a read-only backend:
            // readers still get in.
            Err(Errno::EACCES | Errno::EPERM | Errno::EROFS | Errno::ETXTBSY) if !wants_write => {
                (file::reopen(inode.fd()?.as_fd(), Access::ReadOnly)?, false)
            }
            Err(e) => return Err(e.into()),
        };
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
    pub fn open(&self, ino: u64, flags: i32, caller: Caller) -> FsResult<(u64, Arc<DataFile>)> {
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
        Ok((fh, data))
    }

    /// The kernel leaves dropping set-id bits on write to the view
    /// (`FUSE_HANDLE_KILLPRIV_V2`, which spares a `security.capability` lookup per
    /// write), and passthrough writes never reach the daemon. So a writer without
    /// `CAP_FSETID` (any caller but root) clears setuid, and setgid where group execute
    /// is set, when it opens the file for writing: what the kernel does on its first
    /// write. The backing file system itself still removes `security.capability` on
    /// every write, passthrough included.
    fn drop_set_id_for_writer(&self, inode: &Arc<Inode>, rec: Option<Record>) -> FsResult<()> {
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

    fn data(&self, fh: u64) -> FsResult<(Arc<DataFile>, bool)> {
        match self.handles.get(&fh).as_deref() {
            Some(Handle::File(f)) => Ok((Arc::clone(&f.data), f.sync)),
            _ => Err(FsError::UnknownHandle(fh)),
        }
    }

    /// Reads through the daemon (when passthrough is not in use).
    ///
    /// # Errors
    /// `EBADF` for an unknown handle, or the error of `pread`.
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let (data, _) = self.data(fh)?;
        Ok(file::read_at(data.fd.as_fd(), offset, size as usize)?)
    }

    /// Writes through the daemon (when passthrough is not in use).
    ///
    /// # Errors
    /// `EROFS`, `EBADF` for a read-only handle, or the error of `pwrite`.
    pub fn write(&self, fh: u64, offset: u64, bytes: &[u8]) -> FsResult<usize> {
        self.writable()?;
        let (data, sync) = self.data(fh)?;
        if !data.writable {
            return Err(FsError::Os(Errno::EBADF));
        }
        let n = file::write_at(data.fd.as_fd(), offset, bytes)?;
        if sync {
            file::sync(data.fd.as_fd(), true)?;
        }
        Ok(n)
    }

    /// Flushes a file's data (and metadata unless `data_only`) to the backing store.
    ///
    /// # Errors
    /// `EBADF` for an unknown handle, or the error of `fsync`.
    pub fn fsync(&self, fh: u64, data_only: bool) -> FsResult<()> {
        let fd = match self.handles.get(&fh).as_deref() {
            Some(Handle::File(f)) => Arc::clone(&f.data),
            Some(Handle::Dir(d)) => {
                let d = Arc::clone(d);
                let stream = lock(&d);
                return Ok(file::sync(stream.fd.as_fd(), data_only)?);
            }
            None => return Err(FsError::UnknownHandle(fh)),
        };
        Ok(file::sync(fd.fd.as_fd(), data_only)?)
    }

    /// `fallocate` on an open file.
    ///
    /// # Errors
    /// `EROFS`, `EBADF`, or the error of the call.
    pub fn fallocate(&self, fh: u64, offset: u64, len: u64, mode: i32) -> FsResult<()> {
        self.writable()?;
        let (data, _) = self.data(fh)?;
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
        let (data, _) = self.data(fh)?;
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
        let (src, _) = self.data(fh_in)?;
        let (dst, _) = self.data(fh_out)?;
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

    /// Opens a directory for listing.
    ///
    /// # Errors
    /// `ENOTDIR`, or the error of the open.
    pub fn opendir(&self, ino: u64) -> FsResult<u64> {
        let inode = self.dir(ino)?;
        let fd = file::reopen(inode.fd()?.as_fd(), Access::Directory)?;
        let stream = DirStream {
            fd,
            pos: 0,
            pending: VecDeque::new(),
            buf: vec![MaybeUninit::uninit(); DIR_BUF].into_boxed_slice(),
        };
        Ok(self.add_handle(Handle::Dir(Arc::new(Mutex::new(stream)))))
    }

    /// Lists a directory from `offset`, handing entries to `add` until it reports the
    /// reply full (returns `true`). With `plus`, each entry but `.`/`..` is looked up
    /// (and counted) like [`ViewFs::lookup`]; an entry that is not handed over is
    /// forgotten again.
    ///
    /// # Errors
    /// `EBADF` for an unknown handle, or the error of `getdents64`.
    pub fn readdir(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        plus: bool,
        mut add: impl FnMut(&DirItem, u64) -> bool,
    ) -> FsResult<()> {
        let stream = match self.handles.get(&fh).as_deref() {
            Some(Handle::Dir(d)) => Arc::clone(d),
            _ => return Err(FsError::UnknownHandle(fh)),
        };
        let mut s = lock(&stream);
        if offset != s.pos {
            file::seek_dir(s.fd.as_fd(), offset)?;
            s.pending.clear();
            s.pos = offset;
        }
        loop {
            if s.pending.is_empty() {
                let DirStream { fd, buf, .. } = &mut *s;
                let batch = file::read_dir_batch(fd.as_fd(), buf)?;
                if batch.is_empty() {
                    return Ok(());
                }
                s.pending.extend(batch);
            }
            let Some(e) = s.pending.front().cloned() else {
                return Ok(());
            };
            let dot = e.name == b"." || e.name == b"..";
            let item = if plus && !dot {
                match self.lookup(ino, OsStr::from_bytes(&e.name)) {
                    Ok(attr) => DirItem {
                        name: e.name.clone(),
                        ino: attr.ino,
                        kind: attr.kind,
                        attr: Some(attr),
                    },
                    // Gone since the listing, or a mount point: not part of the view.
                    Err(FsError::Os(Errno::ENOENT)) => {
                        s.pending.pop_front();
                        s.pos = e.next;
                        continue;
                    }
                    Err(err) => return Err(err),
                }
            } else {
                let kind = match e.kind {
                    Some(k) => k,
                    None => self.kind_of(ino, &e.name)?,
                };
                DirItem {
                    name: e.name.clone(),
                    ino: if e.name == b"." { ino } else { e.ino },
                    kind,
                    attr: None,
                }
            };
            if add(&item, e.next) {
                if let Some(a) = item.attr {
                    self.forget(a.ino, 1);
                }
                return Ok(());
            }
            s.pending.pop_front();
            s.pos = e.next;
        }
    }

    /// The kind of a directory entry whose type the backing file system did not say.
    fn kind_of(&self, dir: u64, name: &[u8]) -> FsResult<Kind> {
        if name == b"." || name == b".." {
            return Ok(Kind::Directory);
        }
        let p = self.dir(dir)?;
        let fd = file::open_child(p.fd()?.as_fd(), OsStr::from_bytes(name), self.root_mnt)?;
        Ok(file::stat(fd.as_fd())?.kind)
    }

    /// File system statistics of the backing tree; on a btrfs subvolume with a quota
    /// limit, the volume's capacity and usage (read on every call, so an expansion of
    /// the live volume shows at once).
    ///
    /// # Errors
    /// The error of `statvfs`.
    pub fn statfs(&self) -> FsResult<FsStat> {
        let mut st = file::statvfs(self.inodes.root().fd()?.as_fd())?;
        if let Some(dir) = &self.qgroup {
            match crate::sys::btrfs::qgroup_usage(dir) {
                Ok(crate::sys::btrfs::QgroupUsage {
                    limit: Some(limit),
                    used,
                }) => {
                    let unit = u64::from(st.frsize.max(1));
                    st.blocks = limit / unit;
                    st.bfree = limit.saturating_sub(used) / unit;
                    st.bavail = st.bfree;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "quota group unreadable; whole file system reported")
                }
            }
        }
        Ok(st)
    }

    /// Reads an xattr; the daemon's own are invisible.
    ///
    /// # Errors
    /// `ENODATA` when absent or hidden, `ERANGE` when `size` is too small.
    pub fn getxattr(&self, ino: u64, name: &OsStr, size: u32) -> FsResult<XattrReply> {
        if record::is_reserved(name.as_bytes()) {
            return Err(FsError::NoAttribute);
        }
        let inode = self.inodes.get(ino)?;
        let value =
            file::get_xattr(inode.fd()?.as_fd(), &cstring(name)?)?.ok_or(FsError::NoAttribute)?;
        sized(value, size)
    }

    /// Lists xattr names, without the daemon's own.
    ///
    /// # Errors
    /// `ERANGE` when `size` is too small, or the error of `listxattr`.
    pub fn listxattr(&self, ino: u64, size: u32) -> FsResult<XattrReply> {
        let inode = self.inodes.get(ino)?;
        let all = file::list_xattr(inode.fd()?.as_fd())?;
        let mut shown = Vec::with_capacity(all.len());
        for name in all.split_inclusive(|b| *b == 0) {
            if !record::is_reserved(name) {
                shown.extend_from_slice(name);
            }
        }
        sized(shown, size)
    }

    /// Sets an xattr. Only the `user.` namespace is writable through a view: the
    /// daemon is root, and `trusted.`/`security.` attributes written for a pod would
    /// carry privileges onto the share (file capabilities, the daemon's own records).
    ///
    /// # Errors
    /// `EROFS`, `EPERM` outside `user.`, or the error of `setxattr`.
    pub fn setxattr(&self, ino: u64, name: &OsStr, value: &[u8], flags: i32) -> FsResult<()> {
        self.writable()?;
        refuse_unless_user(name)?;
        let inode = self.inodes.get(ino)?;
        let flags = u32::try_from(flags).map_err(|_| FsError::Os(Errno::EINVAL))?;
        Ok(file::set_xattr(
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
        Ok(file::remove_xattr(inode.fd()?.as_fd(), &cstring(name)?)?)
    }

    /// `access(2)` when the kernel does not check permissions itself (CIFS `noperm`):
    /// everything is allowed but writing to a read-only view.
    ///
    /// # Errors
    /// `EROFS` for `W_OK` on a read-only view.
    pub fn access(&self, ino: u64, mask: i32) -> FsResult<()> {
        self.inodes.get(ino)?;
        if mask & libc::W_OK != 0 {
            self.writable()?;
        }
        Ok(())
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
    use super::*;
    use crate::config::ViewOptions;

    fn view(dir: &std::path::Path, options: &str) -> ViewFs {
        let root = file::open_root(dir).unwrap();
        ViewFs::new(root, &ViewOptions::parse(options).unwrap()).unwrap()
    }

    const ROOT: u64 = 1;
    const ME: Caller = Caller {
        uid: 1000,
        gid: 1000,
    };

    #[test]
    fn names_that_leave_the_directory_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let v = view(dir.path(), "gid=5");
        for name in ["..", ".", "a/b", ""] {
            assert_eq!(
                v.lookup(ROOT, OsStr::new(name)),
                Err(FsError::Os(Errno::EINVAL)),
                "{name:?}"
            );
        }
    }

    #[test]
    fn a_symlink_is_looked_up_as_itself() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("l")).unwrap();
        let v = view(dir.path(), "gid=5");
        let a = v.lookup(ROOT, OsStr::new("l")).unwrap();
        assert_eq!(a.kind, Kind::Symlink);
        assert_eq!(v.readlink(a.ino).unwrap(), b"/etc");
        assert_eq!(v.opendir(a.ino), Err(FsError::Os(Errno::ENOTDIR)));
        assert_eq!(
            v.lookup(a.ino, OsStr::new("passwd")),
            Err(FsError::Os(Errno::ENOTDIR))
        );
    }

    #[test]
    fn readdirplus_counts_only_what_it_hands_over() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..10 {
            std::fs::write(dir.path().join(format!("f{i}")), "x").unwrap();
        }
        let v = view(dir.path(), "gid=5");
        let fh = v.opendir(ROOT).unwrap();
        let mut seen = Vec::new();
        let mut next_offset = 0;
        v.readdir(ROOT, fh, 0, true, |item, next| {
            if item.attr.is_some()
                && seen
                    .iter()
                    .filter(|n: &&Vec<u8>| n.starts_with(b"f"))
                    .count()
                    == 3
            {
                return true; // full
            }
            seen.push(item.name.clone());
            next_offset = next;
            false
        })
        .unwrap();
        let files = seen.iter().filter(|n| n.starts_with(b"f")).count();
        assert_eq!(files, 3);
        assert_eq!(
            v.inode_count(),
            1 + 3,
            "the refused entry was forgotten again"
        );
        // Resuming from the last offset lists the rest exactly once.
        let mut rest = Vec::new();
        v.readdir(ROOT, fh, next_offset, true, |item, _| {
            rest.push(item.name.clone());
            false
        })
        .unwrap();
        assert_eq!(rest.iter().filter(|n| n.starts_with(b"f")).count(), 7);
        assert!(rest.iter().all(|n| !seen.contains(n)));
        v.release(fh);
        assert_eq!(v.handle_count(), 0);
    }

    #[test]
    fn create_honours_o_excl_and_records_the_creator() {
        let dir = tempfile::tempdir().unwrap();
        let v = view(dir.path(), "gid=5");
        let (attr, fh, data) = v
            .create(
                ROOT,
                OsStr::new("n"),
                0o100640,
                libc::O_EXCL | libc::O_RDWR,
                ME,
            )
            .unwrap();
        assert_eq!((attr.uid, attr.gid, attr.perm), (1000, 5, 0o640));
        assert!(data.writable);
        assert_eq!(v.write(fh, 0, b"abc").unwrap(), 3);
        assert_eq!(v.read(fh, 1, 10).unwrap(), b"bc");
        assert_eq!(
            v.create(ROOT, OsStr::new("n"), 0o100600, libc::O_EXCL, ME)
                .err(),
            Some(FsError::Os(Errno::EEXIST))
        );
        // Without O_EXCL an existing file is opened, its record untouched.
        let (again, fh2, shared) = v
            .create(
                ROOT,
                OsStr::new("n"),
                0o100600,
                libc::O_RDWR,
                Caller { uid: 7, gid: 7 },
            )
            .unwrap();
        assert_eq!((again.uid, again.perm), (1000, 0o640));
        assert!(Arc::ptr_eq(&data, &shared), "one descriptor per inode");
        v.release(fh);
        v.release(fh2);
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
        assert_eq!(v.listxattr(f, 0).unwrap(), XattrReply::Size(7));
        assert_eq!(
            v.listxattr(f, 100).unwrap(),
            XattrReply::Data(b"user.a\0".to_vec())
        );
        assert_eq!(v.listxattr(f, 3), Err(FsError::TooLarge));
    }

    #[test]
    fn a_read_only_view_refuses_every_mutation() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), "x").unwrap();
        let v = view(dir.path(), "gid=5,ro");
        let f = v.lookup(ROOT, OsStr::new("f")).unwrap().ino;
        let n = OsStr::new("n");
        assert_eq!(
            v.create(ROOT, n, 0o644, 0, ME).err(),
            Some(FsError::ReadOnly)
        );
        assert_eq!(v.mkdir(ROOT, n, 0o755, ME), Err(FsError::ReadOnly));
        assert_eq!(
            v.symlink(ROOT, n, OsStr::new("f"), ME),
            Err(FsError::ReadOnly)
        );
        assert_eq!(v.link(f, ROOT, n), Err(FsError::ReadOnly));
        assert_eq!(
            v.unlink(ROOT, OsStr::new("f"), false),
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
        assert_eq!(v.open(f, libc::O_WRONLY, ME).err(), Some(FsError::ReadOnly));
        let (fh, data) = v.open(f, libc::O_RDONLY, ME).unwrap();
        assert!(!data.writable);
        assert_eq!(v.write(fh, 0, b"y"), Err(FsError::ReadOnly));
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"x");
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
            v.open(p.ino, libc::O_RDONLY, ME).err(),
            Some(FsError::WrongKind)
        );
    }
}
