//! The thin fuser adapter: decode a request, call [`ViewFs`], encode the reply.
//! No policy lives here: what INIT asks is `negotiate`'s; the one thing only this
//! layer can do is register a backing descriptor for kernel passthrough, because that
//! needs the reply object.
//!
//! Every operation goes through one choke point, `FuseView::answer`: it is timed
//! and counted per operation and errno, a failure is logged at its errno's level
//! (rate limited where a pod could flood the log), and the error is answered there.
//! No handler answers an error by itself. Operations the view does not serve answer
//! quietly with what the kernel expects (`ENOTTY` for an ioctl, `ENOSYS` otherwise).

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, IoctlFlags, KernelConfig, LockOwner, OpenFlags, PollEvents, PollFlags,
    PollNotifier, RenameFlags, ReplyAttr, ReplyBmap, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen,
    ReplyPoll, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::config::Passthrough;
use crate::sys::file::{Flush, Kind, Remove, SetTime, Time};
use crate::sys::fuse::Backing;

use super::ops::{Attr, Created, Listing, Opened, Room, SetAttr, ViewFs, XattrReply};
use super::ratelimit::{RateLimit, Verdict};
use super::stats::{Op, ViewStats};
use crate::fs::error::FsError;
use crate::fs::inode::DataFile;
use crate::fs::journal::Negotiated;
use crate::fs::ops::redo_as_done;
use crate::fs::view::{Caller, Creator};

mod convert;
mod view;

use convert::*;

/// Largest write the kernel sends in one request.
const MAX_WRITE: u32 = 1 << 20;

/// What each worker reads `/dev/fuse` with: the largest write plus a page for its
/// header, as the kernel requires, and no more. The kernel packs as many pending
/// FORGETs into one read as fit, so after the kernel drops a million cached inodes
/// fuser's default 16 MiB buffer was touched whole in every worker, and the daemon's
/// RSS stayed up to 32 MiB above idle after the walk it had served was forgotten.
pub const READ_BUFFER: usize = MAX_WRITE as usize + 4096;

/// The payload buffer of a ring entry: the connection's `max_payload_sz`
/// (fs/fuse/dev_uring.c `fuse_uring_create`: the largest of 8 KiB, `max_write` and
/// `max_pages` pages), which is `max_write` here (fuser's `max_pages` follows it: 256
/// pages of 4 KiB).
pub const RING_PAYLOAD: usize = MAX_WRITE as usize;

/// A LOOKUP's reply. A name that is not there is answered with node id 0 and the
/// entry timeout (still counted and logged as ENOENT), which the kernel keeps as a
/// negative dentry for as long as it keeps a name that is there: a path search, an
/// import or a build probing for files it expects to miss asks once per timeout
/// instead of once per probe. This view's own creates replace the negative entry at
/// once. A name answered absent from the names the view holds of its directory
/// (`FsError::Absent`, on SMB) is kept no longer than they answer.
struct LookupReply {
    reply: ReplyEntry,
    entry_ttl: Duration,
}

impl Fail for LookupReply {
    fn fail(self, errno: Errno) {
        if errno == Errno::ENOENT {
            let absent = absent();
            let ttl = self.entry_ttl;
            self.reply
                .entry_with_ttls(&Duration::ZERO, &ttl, &absent, Generation(0));
        } else {
            self.reply.error(errno);
        }
    }
}

impl From<LookupReply> for ReplyEntry {
    fn from(r: LookupReply) -> ReplyEntry {
        r.reply
    }
}

/// The block size a directory shows. glibc sizes `readdir`'s buffer by it (32 KiB to
/// 1 MiB), and the kernel asks the view for as much as that buffer holds: a listing
/// of 20,000 names is 5 requests instead of 100. (Entries of a READDIRPLUS reply are
/// about 160 bytes, names only or not.)
const DIR_BLKSIZE: u32 = MAX_WRITE;

/// A [`ViewFs`] served over FUSE.
pub struct FuseView {
    fs: Arc<ViewFs>,
    /// The connection (`/dev/fuse`), on which passthrough registrations are made.
    dev: Option<Arc<OwnedFd>>,
    passthrough_mode: Passthrough,
    /// Negotiated at INIT, or handed over with the connection.
    passthrough: Arc<AtomicBool>,
    /// `FUSE_ALLOW_IDMAP` negotiated at INIT, or handed over with the connection.
    idmap: Arc<AtomicBool>,
    /// The FUSE protocol minor of the connection's INIT (0: not known).
    minor: Arc<AtomicU32>,
    /// Whether the mount has `default_permissions`, without which the kernel refuses
    /// `FUSE_ALLOW_IDMAP` (it fails the connection).
    kernel_checks: bool,
    warned_backing: AtomicBool,
    attr_ttl: Duration,
    entry_ttl: Duration,
    stats: Arc<ViewStats>,
    /// Warnings a pod can cause (failures other than the expected ones).
    warnings: RateLimit,
    /// Whether INIT asks for FUSE over io_uring (`transport=ring`).
    ring: bool,
    /// Whether a file the view creates is served by the daemon, not by kernel
    /// passthrough, while any open of it made before its creator let go lasts (the
    /// source is on the kernel's SMB client). The kernel opens the backing file again
    /// for every passthrough open (fs/fuse/passthrough.c `fuse_passthrough_open`,
    /// `backing_file_open`), and over SMB that open of a new file is one more `CREATE`
    /// to the server per create, on top of the view's own. It also failed creates with
    /// `O_EXCL`: the kernel's open carries the caller's flags as they are before the
    /// open completes, and the SMB client asks the server to create the file the view
    /// has just created (fs/smb/client/file.c `cifs_convert_flags`, `FILE_CREATE`),
    /// which answers that it exists. See
    /// [`crate::fs::inode::DataFile::keep_off_passthrough`] for why later opens follow.
    creates_served: bool,
}

/// How many unexpected failures a view logs per [`WARN_WINDOW`] before it only counts
/// them (the metrics still have every one).
const WARN_BURST: u32 = 20;
const WARN_WINDOW: Duration = Duration::from_secs(60);

/// A fuser reply that can carry an error: the one place errors are answered.
trait Fail {
    fn fail(self, errno: Errno);
}

macro_rules! fail_replies {
    ($($reply:ty),* $(,)?) => {
        $(impl Fail for $reply {
            fn fail(self, errno: Errno) {
                self.error(errno);
            }
        })*
    };
}

fail_replies!(
    ReplyAttr,
    ReplyBmap,
    ReplyCreate,
    ReplyData,
    ReplyDirectory,
    ReplyDirectoryPlus,
    ReplyEmpty,
    ReplyEntry,
    ReplyIoctl,
    ReplyLock,
    ReplyLseek,
    ReplyOpen,
    ReplyPoll,
    ReplyStatfs,
    ReplyWrite,
    ReplyXattr,
);

/// Whether a failure is an answer a caller asked for (a missing name, a refused
/// permission, a full disk) rather than a sign that something is wrong with the view
/// or its backend. The former are logged at debug, the latter at warn.
fn expected(errno: i32) -> bool {
    matches!(
        errno,
        libc::ENOENT
            | libc::EEXIST
            | libc::ENOTEMPTY
            | libc::ENODATA
            | libc::EACCES
            | libc::EPERM
            | libc::EROFS
            | libc::ENOTDIR
            | libc::EISDIR
            | libc::EINVAL
            | libc::ERANGE
            | libc::ENOTTY
            | libc::ENOSYS
            | libc::EOPNOTSUPP
            | libc::EXDEV
            | libc::ENAMETOOLONG
            | libc::ELOOP
            | libc::EBUSY
            | libc::ETXTBSY
            | libc::ENOSPC
            | libc::EDQUOT
            | libc::EFBIG
            | libc::EMLINK
            | libc::ENXIO
            | libc::EOVERFLOW
    )
}

impl FuseView {}

impl Filesystem for FuseView {
    fn enter(&self, req: &Request) -> Result<Option<Box<dyn std::any::Any>>, Errno> {
        match self.fs.act_for(req.uid(), req.gid(), req.pid()) {
            Ok(acting) => Ok(acting.map(|a| Box::new(a) as Box<dyn std::any::Any>)),
            Err(e) => {
                self.warn_limited(|| {
                    tracing::warn!(error = %e, uid = req.uid(), gid = req.gid(), pid = req.pid(), "cannot act as the caller; the request fails");
                });
                Err(Errno::from_i32(e.errno()))
            }
        }
    }

    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_readahead(MAX_WRITE);
        self.minor.store(config.kernel_abi().1, Ordering::Relaxed);
        let n = super::negotiate::negotiate(
            config.capabilities(),
            super::negotiate::Asked {
                passthrough: self.passthrough_mode,
                kernel_checks: self.kernel_checks,
                ring: self.ring,
                // Registrations are made on the connection's descriptor, which only a
                // view that mounted itself (as root) holds.
                can_register: crate::sys::process::is_root() && self.dev.is_some(),
                acts_as_callers: self.fs.acts_as_callers(),
            },
        )
        .map_err(|why| io::Error::new(io::ErrorKind::Unsupported, why))?;
        let _ = config.add_capabilities(n.add);
        // A passthrough file's backing file is one level of stacking.
        let passthrough = n.passthrough && config.set_max_stack_depth(1).is_ok();
        self.passthrough.store(passthrough, Ordering::Relaxed);
        if let Some(why) = n.no_idmap {
            tracing::info!("{why}");
        }
        let idmap = n.idmap;
        self.idmap.store(idmap, Ordering::Relaxed);
        self.stats.set_idmap(idmap);
        self.stats.set_passthrough(self.passthrough());
        tracing::info!(
            fuse_minor = self.minor.load(Ordering::Relaxed),
            passthrough = self.passthrough(),
            idmap,
            ring = self.ring,
            "FUSE session initialised"
        );
        if self.creates_served && self.passthrough() {
            self.fs.twin_opens();
            tracing::info!(
                "the source is on the kernel's SMB client: files the view creates are read and written through the view until the opens made while their creator held them are closed (the kernel's passthrough open would cost the server a CREATE per create, and fails creates with O_EXCL), everything else through kernel passthrough, whose open of a file takes the view's own open of it made with the caller's flags (a twin) instead of asking the server by name, where the flags can be given"
            );
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let reply = LookupReply {
            reply,
            entry_ttl: self.entry_ttl_in(parent.0),
        };
        self.answer(
            Op::Lookup,
            parent.0,
            reply,
            |reply| {
                let found = self.fs.lookup_for_kernel(parent.0, name);
                if let Err(FsError::Absent(left)) = found {
                    reply.entry_ttl = reply.entry_ttl.min(left);
                }
                found
            },
            |reply, (a, keep)| {
                // Attributes the share's client had cached are kept no longer than
                // the ones the view last read afresh would be: a stat then asks for
                // them afresh (`ViewFs::lookup_for_kernel`).
                let attr_ttl = keep.map_or(self.attr_ttl, |keep| keep.min(self.attr_ttl));
                reply.reply.entry_with_ttls(
                    &attr_ttl,
                    &reply.entry_ttl,
                    &self.fattr(&a),
                    Generation(0),
                );
            },
        );
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let start = Instant::now();
        self.fs.forget(ino.0, nlookup);
        self.stats.record(Op::Forget, start, None);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.answer(
            Op::Getattr,
            ino.0,
            reply,
            |_| self.fs.getattr(ino.0),
            |reply, a| {
                reply.attr(&self.attr_ttl, &self.fattr(&a));
            },
        );
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
        };
        self.answer(
            Op::Setattr,
            ino.0,
            reply,
            |_| self.fs.setattr(ino.0, fh.map(|f| f.0), set),
            |reply, a| reply.attr(&self.attr_ttl, &self.fattr(&a)),
        );
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.answer(
            Op::Readlink,
            ino.0,
            reply,
            |_| self.fs.readlink(ino.0),
            |reply, t| {
                reply.data(&t);
            },
        );
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        self.entry(Op::Mknod, parent.0, parent.0, reply, |_| {
            let r = self.fs.mknod(parent.0, name, mode, creator(req)?);
            done_before(req, r, libc::EEXIST, || self.fs.lookup(parent.0, name))
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        self.entry(Op::Mkdir, parent.0, parent.0, reply, |_| {
            let r = self.fs.mkdir(parent.0, name, mode, creator(req)?);
            done_before(req, r, libc::EEXIST, || self.fs.lookup(parent.0, name))
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.empty(Op::Unlink, parent.0, reply, || {
            let r = self.fs.unlink(parent.0, name, Remove::NonDirectory);
            done_before(req, r, libc::ENOENT, || Ok(()))
        });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.empty(Op::Rmdir, parent.0, reply, || {
            let r = self.fs.unlink(parent.0, name, Remove::Directory);
            done_before(req, r, libc::ENOENT, || Ok(()))
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.entry(Op::Symlink, parent.0, parent.0, reply, |_| {
            let r = self
                .fs
                .symlink(parent.0, link_name, target.as_os_str(), creator(req)?);
            done_before(req, r, libc::EEXIST, || self.fs.lookup(parent.0, link_name))
        });
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.empty(Op::Rename, parent.0, reply, || {
            let r = self
                .fs
                .rename(parent.0, name, newparent.0, newname, flags.bits());
            // Done before if the old name is gone and the new one is there.
            done_before(req, r, libc::ENOENT, || {
                let a = self.fs.lookup(newparent.0, newname)?;
                self.fs.forget(a.ino, 1);
                Ok(())
            })
        });
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.entry(Op::Link, ino.0, newparent.0, reply, |_| {
            let r = self.fs.link(ino.0, newparent.0, newname);
            done_before(req, r, libc::EEXIST, || {
                self.fs.lookup(newparent.0, newname)
            })
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.answer(
            Op::Open,
            ino.0,
            reply,
            |_| self.fs.open(ino.0, flags.0, caller(req)),
            |reply, Opened { fh, data, direct }| {
                let flags = open_flags(direct);
                match self.backing(ino.0, &data) {
                    Some(id) => reply.opened_passthrough_raw(FileHandle(fh), flags, id),
                    None => reply.opened(FileHandle(fh), flags),
                }
            },
        );
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.answer(
            Op::Create,
            parent.0,
            reply,
            |_| {
                self.fs.create_for_kernel(
                    parent.0,
                    name,
                    (mode, flags),
                    creator(req)?,
                    resent(req.unique().0),
                    (self.creates_served, self.passthrough()),
                )
            },
            |reply,
             Created {
                 attr,
                 fh,
                 data,
                 direct,
             }| {
                let fa = self.fattr(&attr);
                let flags = open_flags(direct);
                // Both times, as a lookup's: the kernel keeps the attributes for the
                // entry's attr_valid and the name for its entry_valid (fs/fuse/dir.c
                // fuse_create_open: fuse_iget with entry_attr_timeout, then
                // fuse_change_entry_timeout).
                let backing = self.backing(attr.ino, &data);
                match backing {
                    Some(id) => reply.created_passthrough_raw(
                        &self.attr_ttl,
                        &self.entry_ttl_in(parent.0),
                        &fa,
                        Generation(0),
                        FileHandle(fh),
                        flags,
                        id,
                    ),
                    None => reply.created_with_ttls(
                        &self.attr_ttl,
                        &self.entry_ttl_in(parent.0),
                        &fa,
                        Generation(0),
                        FileHandle(fh),
                        flags,
                    ),
                }
            },
        );
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // The caller's file flags as they are now (fs/fuse/file.c `fuse_read_args_fill`
        // copies `file->f_flags`), so an fcntl(F_SETFL) of O_DIRECT is followed.
        let direct = flags.0 & libc::O_DIRECT != 0;
        self.answer(
            Op::Read,
            ino.0,
            reply,
            |_| self.fs.read(fh.0, offset, size, direct),
            |reply, d| reply.data(&d),
        );
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // A caller's write carries its file flags (fs/fuse/file.c `fuse_send_write`,
        // `fuse_write_flags`). A write-back of cached pages is marked FUSE_WRITE_CACHE
        // (`fuse_writepage_args_setup`) and is never direct, whatever its flags: its last
        // page may end short of a block.
        let direct =
            flags.0 & libc::O_DIRECT != 0 && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        self.answer(
            Op::Write,
            ino.0,
            reply,
            |_| self.fs.write(fh.0, offset, data, direct),
            |reply, n| reply.written(n as u32),
        );
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing is buffered here and locks are the kernel's: ENOSYS tells the kernel
        // to stop sending FLUSH on every close, a round trip saved per close.
        self.refuse(Op::Flush, ino.0, reply, libc::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.empty(Op::Release, ino.0, reply, || {
            self.fs.release(fh.0);
            Ok(())
        });
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.empty(Op::Fsync, ino.0, reply, || {
            self.fs.fsync(fh.0, flush(datasync))
        });
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // The kernel may keep listings: it drops them when this view changes the
        // directory, and (FUSE_AUTO_INVAL_DATA) when a refresh of its attributes shows
        // another writer changed it. Not while the directory is walked: a kept listing
        // has no attributes, so every entry past its timeouts would be a LOOKUP round
        // trip (fs/listing.rs).
        self.answer(
            Op::Opendir,
            ino.0,
            reply,
            |_| {
                let fh = self.fs.opendir(ino.0)?;
                Ok((fh, self.fs.may_keep_listing(ino.0)))
            },
            |reply, (fh, keep)| {
                let flags = if keep {
                    FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::empty()
                };
                reply.opened(FileHandle(fh), flags);
            },
        );
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        self.answer(
            Op::Readdir,
            ino.0,
            reply,
            |reply| {
                self.fs.readdir(
                    ino.0,
                    fh.0,
                    offset,
                    Listing::Names,
                    Room::UNBOUNDED,
                    |item, next| {
                        reply.add(
                            INodeNo(item.ino),
                            next,
                            file_type(item.kind),
                            OsStr::from_bytes(&item.name),
                        )
                    },
                )
            },
            |reply, ()| reply.ok(),
        );
        // After the answer: the caller consumes the chunk while the next is read.
        self.fs.read_ahead(fh.0);
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.answer(
            Op::Readdir,
            ino.0,
            reply,
            |reply| {
                let entry_ttl = self.entry_ttl_in(ino.0);
                // Entries are looked up only as far as the reply has room for them.
                let room = Room {
                    bytes: reply.room(),
                    header: ReplyDirectoryPlus::ENTRY_HEADER,
                };
                self.fs.readdir(
                    ino.0,
                    fh.0,
                    offset,
                    Listing::AsNeeded,
                    room,
                    |item, next| {
                        let name = OsStr::from_bytes(&item.name);
                        // Each entry's attributes expire with attr_timeout, its name
                        // with entry_timeout (fs/fuse/readdir.c fuse_direntplus_link:
                        // fuse_change_attributes with entry_attr_timeout, then
                        // fuse_change_entry_timeout).
                        match &item.attr {
                            Some(a) => reply.add_with_ttls(
                                INodeNo(item.ino),
                                next,
                                name,
                                &self.attr_ttl,
                                &entry_ttl,
                                &self.fattr(a),
                                Generation(0),
                            ),
                            // `.`, `..` and names the view lists without attributes:
                            // node id 0, no dentry, a lookup when stated.
                            None => reply.add_name_only(
                                INodeNo(item.ino),
                                next,
                                file_type(item.kind),
                                name,
                            ),
                        }
                    },
                )
            },
            |reply, ()| reply.ok(),
        );
        // After the answer: the caller consumes the chunk while the next is read.
        self.fs.read_ahead(fh.0);
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.empty(Op::Releasedir, ino.0, reply, || {
            self.fs.release(fh.0);
            Ok(())
        });
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.empty(Op::Fsyncdir, ino.0, reply, || {
            self.fs.fsync(fh.0, flush(datasync))
        });
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        self.answer(
            Op::Statfs,
            ino.0,
            reply,
            |_| self.fs.statfs(),
            |reply, s| {
                reply.statfs(
                    s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
                );
            },
        );
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.empty(Op::Setxattr, ino.0, reply, || {
            self.fs.setxattr(ino.0, name, value, flags)
        });
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.answer(
            Op::Getxattr,
            ino.0,
            reply,
            |_| self.fs.getxattr(ino.0, name, size),
            xattr_reply,
        );
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.answer(
            Op::Listxattr,
            ino.0,
            reply,
            |_| self.fs.listxattr(ino.0, size, caller(req)),
            xattr_reply,
        );
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.empty(Op::Removexattr, ino.0, reply, || {
            self.fs.removexattr(ino.0, name)
        });
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.empty(Op::Access, ino.0, reply, || {
            self.fs.access(ino.0, mask.bits())
        });
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.empty(Op::Fallocate, ino.0, reply, || {
            self.fs.fallocate(fh.0, offset, length, mode)
        });
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.answer(
            Op::Lseek,
            ino.0,
            reply,
            |_| self.fs.lseek(fh.0, offset, whence),
            |reply, pos| reply.offset(pos as i64),
        );
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.answer(
            Op::CopyFileRange,
            ino_in.0,
            reply,
            |_| {
                self.fs
                    .copy_file_range(fh_in.0, offset_in, fh_out.0, offset_out, len)
            },
            |reply, n| reply.written(n as u32),
        );
    }

    // What the view does not serve, answered quietly: fuser's defaults log a warning
    // per call, which let any pod fill the node's disk with `ioctl(TCGETS)`.

    fn ioctl(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        // What the kernel answers for an ioctl a file does not know.
        self.refuse(Op::Ioctl, ino.0, reply, libc::ENOTTY);
    }

    fn poll(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _ph: PollNotifier,
        _events: PollEvents,
        _flags: PollFlags,
        reply: ReplyPoll,
    ) {
        // ENOSYS: the kernel stops asking and treats files as always ready.
        self.refuse(Op::Poll, ino.0, reply, libc::ENOSYS);
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        // Locks are the kernel's (FUSE_POSIX_LOCKS is not negotiated).
        self.refuse(Op::Lock, ino.0, reply, libc::ENOSYS);
    }

    fn setlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        _sleep: bool,
        reply: ReplyEmpty,
    ) {
        self.refuse(Op::Lock, ino.0, reply, libc::ENOSYS);
    }

    fn bmap(&self, _req: &Request, ino: INodeNo, _blocksize: u32, _idx: u64, reply: ReplyBmap) {
        self.refuse(Op::Bmap, ino.0, reply, libc::ENOSYS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_numbers_keep_major_and_minor() {
        // /dev/null is 1,3; a large minor (e.g. a 4096-minor loop device) keeps its bits.
        let enc = |major: u64, minor: u64| encode_dev((major << 32) | minor);
        assert_eq!(enc(1, 3), 0x103);
        assert_eq!(enc(7, 0x1234), 0x0120_0734);
        assert_eq!(enc(259, 0), 259 << 8);
    }

    use crate::sys::Errno;

    #[test]
    fn only_a_resent_request_turns_already_done_into_success() {
        let exists = || Err::<u32, _>(FsError::Os(Errno::EEXIST));
        let looked_up = || Ok(7);
        // First sending: the error stands.
        assert_eq!(
            redo_as_done(resent(42), exists(), libc::EEXIST, looked_up),
            Err(FsError::Os(Errno::EEXIST))
        );
        // Resent: the entry that is there is the answer.
        assert_eq!(
            redo_as_done(resent(42 | 1 << 63), exists(), libc::EEXIST, looked_up),
            Ok(7)
        );
        // Resent, but another error: it stands.
        let denied = Err::<u32, _>(FsError::Os(Errno::EACCES));
        assert_eq!(
            redo_as_done(resent(1 << 63), denied, libc::EEXIST, looked_up),
            Err(FsError::Os(Errno::EACCES))
        );
        // Resent and successful: nothing to redo.
        assert_eq!(
            redo_as_done(resent(1 << 63), Ok(3), libc::EEXIST, looked_up),
            Ok(3)
        );
    }
}
