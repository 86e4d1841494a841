//! The thin fuser adapter: decode a request, call [`ViewFs`], encode the reply.
//! No policy lives here; the one thing only this layer can do is register a backing
//! descriptor for kernel passthrough, because that needs the reply object.

use std::ffi::OsStr;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BackingId, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem,
    FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::config::Passthrough;
use crate::sys::file::{Kind, SetTime, Time};

use super::error::FsError;
use super::inode::DataFile;
use super::ops::{Attr, SetAttr, ViewFs, XattrReply};
use super::stats::{Op, ViewStats};
use super::view::Caller;

/// Largest write the kernel sends in one request.
const MAX_WRITE: u32 = 1 << 20;

/// A [`ViewFs`] served over FUSE.
pub struct FuseView {
    fs: ViewFs,
    passthrough_mode: Passthrough,
    passthrough: bool,
    warned_backing: AtomicBool,
    attr_ttl: Duration,
    entry_ttl: Duration,
    stats: Arc<ViewStats>,
}

impl FuseView {
    pub fn new(
        fs: ViewFs,
        passthrough: Passthrough,
        attr_ttl: Duration,
        entry_ttl: Duration,
    ) -> FuseView {
        FuseView {
            fs,
            passthrough_mode: passthrough,
            passthrough: false,
            warned_backing: AtomicBool::new(false),
            attr_ttl,
            entry_ttl,
            stats: Arc::new(ViewStats::default()),
        }
    }

    /// The view's operation counters (shared with whoever writes them out).
    pub fn stats(&self) -> Arc<ViewStats> {
        Arc::clone(&self.stats)
    }

    fn timed<T>(&self, op: Op, f: impl FnOnce() -> Result<T, FsError>) -> Result<T, FsError> {
        let start = Instant::now();
        let r = f();
        self.stats.record(op, start, r.is_err());
        r
    }

    fn fattr(&self, a: &Attr) -> FileAttr {
        FileAttr {
            ino: INodeNo(a.ino),
            size: a.size,
            blocks: a.blocks,
            atime: system_time(a.atime),
            mtime: system_time(a.mtime),
            ctime: system_time(a.ctime),
            crtime: system_time(a.btime),
            kind: file_type(a.kind),
            perm: (a.perm & 0o7777) as u16,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev as u32,
            blksize: a.blksize,
            flags: 0,
        }
    }

    fn entry(&self, reply: ReplyEntry, r: Result<Attr, FsError>) {
        match r {
            Ok(a) => reply.entry_with_ttls(
                &self.attr_ttl,
                &self.entry_ttl,
                &self.fattr(&a),
                Generation(0),
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// The passthrough registration of a shared descriptor, made on its first open.
    fn backing<'a>(
        &self,
        data: &'a DataFile,
        register: impl FnOnce() -> io::Result<BackingId>,
    ) -> Option<&'a BackingId> {
        if !self.passthrough {
            return None;
        }
        let slot = data.passthrough.get_or_init(|| match register() {
            Ok(id) => Some(Box::new(id) as Box<dyn std::any::Any + Send + Sync>),
            Err(e) => {
                if !self.warned_backing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "kernel passthrough refused a backing file; serving it through the daemon");
                }
                None
            }
        });
        slot.as_ref().and_then(|b| b.downcast_ref::<BackingId>())
    }
}

fn errno(e: &FsError) -> Errno {
    Errno::from_i32(e.errno())
}

fn system_time(t: Time) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::new(t.sec.unsigned_abs(), 0) + Duration::new(0, t.nsec)
    }
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(st) => match st.duration_since(UNIX_EPOCH) {
            Ok(d) => SetTime::At(Time {
                sec: d.as_secs() as i64,
                nsec: d.subsec_nanos(),
            }),
            Err(before) => {
                let d = before.duration();
                let (sec, nsec) = if d.subsec_nanos() == 0 {
                    (-(d.as_secs() as i64), 0)
                } else {
                    (-(d.as_secs() as i64) - 1, 1_000_000_000 - d.subsec_nanos())
                };
                SetTime::At(Time { sec, nsec })
            }
        },
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::Regular => FileType::RegularFile,
        Kind::Directory => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDevice => FileType::CharDevice,
        Kind::BlockDevice => FileType::BlockDevice,
    }
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

impl Filesystem for FuseView {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_readahead(MAX_WRITE);
        let caps = config.capabilities();
        // READDIRPLUS_AUTO: the kernel asks for attributes with the names only when the
        // program stats the entries (ls -l), not for a plain listing.
        // HANDLE_KILLPRIV_V2: no security.capability lookup per write (see ops::open).
        let wanted = InitFlags::FUSE_HANDLE_KILLPRIV_V2
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_AUTO_INVAL_DATA
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_MAX_PAGES;
        let _ = config.add_capabilities(wanted & caps);
        let offered = caps.contains(InitFlags::FUSE_PASSTHROUGH) && crate::sys::process::is_root();
        match (self.passthrough_mode, offered) {
            (Passthrough::Off, _) | (Passthrough::Auto, false) => {}
            (Passthrough::On, false) => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "passthrough=on, but the kernel offers no FUSE passthrough (Linux 6.9+ and root are needed)",
                ));
            }
            (Passthrough::Auto | Passthrough::On, true) => {
                if config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                    && config.set_max_stack_depth(1).is_ok()
                {
                    self.passthrough = true;
                }
            }
        }
        self.stats.set_passthrough(self.passthrough);
        tracing::info!(passthrough = self.passthrough, "FUSE session initialised");
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.entry(
            reply,
            self.timed(Op::Lookup, || self.fs.lookup(parent.0, name)),
        );
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.timed(Op::Getattr, || self.fs.getattr(ino.0)) {
            Ok(a) => reply.attr(&self.attr_ttl, &self.fattr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
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
        match self.timed(Op::Setattr, || self.fs.setattr(ino.0, fh.map(|f| f.0), set)) {
            Ok(a) => reply.attr(&self.attr_ttl, &self.fattr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.timed(Op::Readlink, || self.fs.readlink(ino.0)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(&e)),
        }
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
        self.entry(
            reply,
            self.timed(Op::Mknod, || {
                self.fs.mknod(parent.0, name, mode, caller(req))
            }),
        );
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
        self.entry(
            reply,
            self.timed(Op::Mkdir, || {
                self.fs.mkdir(parent.0, name, mode, caller(req))
            }),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.timed(Op::Unlink, || self.fs.unlink(parent.0, name, false)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.timed(Op::Rmdir, || self.fs.unlink(parent.0, name, true)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.entry(
            reply,
            self.fs
                .symlink(parent.0, link_name, target.as_os_str(), caller(req)),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        match self
            .fs
            .rename(parent.0, name, newparent.0, newname, flags.bits())
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.entry(
            reply,
            self.timed(Op::Link, || self.fs.link(ino.0, newparent.0, newname)),
        );
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.timed(Op::Open, || self.fs.open(ino.0, flags.0, caller(req))) {
            Ok((fh, data)) => match self.backing(&data, || reply.open_backing(data.fd.as_fd())) {
                Some(id) => reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), id),
                None => reply.opened(FileHandle(fh), FopenFlags::empty()),
            },
            Err(e) => reply.error(errno(&e)),
        }
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
        match self.timed(Op::Create, || {
            self.fs.create(parent.0, name, mode, flags, caller(req))
        }) {
            Ok((attr, fh, data)) => {
                let fa = self.fattr(&attr);
                match self.backing(&data, || reply.open_backing(data.fd.as_fd())) {
                    Some(id) => reply.created_passthrough(
                        &self.entry_ttl,
                        &fa,
                        Generation(0),
                        FileHandle(fh),
                        FopenFlags::empty(),
                        id,
                    ),
                    None => reply.created(
                        &self.entry_ttl,
                        &fa,
                        Generation(0),
                        FileHandle(fh),
                        FopenFlags::empty(),
                    ),
                }
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.timed(Op::Read, || self.fs.read(fh.0, offset, size)) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.timed(Op::Write, || self.fs.write(fh.0, offset, data)) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing is buffered here and locks are the kernel's: ENOSYS tells the kernel
        // to stop sending FLUSH on every close, a round trip saved per close.
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.fs.release(fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.timed(Op::Fsync, || self.fs.fsync(fh.0, datasync)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.timed(Op::Opendir, || self.fs.opendir(ino.0)) {
            // The kernel may keep listings: it drops them when this view changes the
            // directory, and (FUSE_AUTO_INVAL_DATA) when a refresh of its attributes
            // shows another writer changed it.
            Ok(fh) => reply.opened(
                FileHandle(fh),
                FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.timed(Op::Readdir, || {
            self.fs.readdir(ino.0, fh.0, offset, false, |item, next| {
                reply.add(
                    INodeNo(item.ino),
                    next,
                    file_type(item.kind),
                    OsStr::from_bytes(&item.name),
                )
            })
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let r = self.timed(Op::Readdir, || {
            self.fs.readdir(ino.0, fh.0, offset, true, |item, next| {
                let fa = match &item.attr {
                    Some(a) => self.fattr(a),
                    // `.` and `..`: the kernel takes only the name, number and type.
                    None => FileAttr {
                        ino: INodeNo(item.ino),
                        size: 0,
                        blocks: 0,
                        atime: UNIX_EPOCH,
                        mtime: UNIX_EPOCH,
                        ctime: UNIX_EPOCH,
                        crtime: UNIX_EPOCH,
                        kind: file_type(item.kind),
                        perm: 0,
                        nlink: 0,
                        uid: 0,
                        gid: 0,
                        rdev: 0,
                        blksize: 0,
                        flags: 0,
                    },
                };
                reply.add(
                    INodeNo(item.ino),
                    next,
                    OsStr::from_bytes(&item.name),
                    &self.entry_ttl,
                    &fa,
                    Generation(0),
                )
            })
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.fs.release(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.timed(Op::Fsync, || self.fs.fsync(fh.0, datasync)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.timed(Op::Statfs, || self.fs.statfs()) {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(errno(&e)),
        }
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
        match self.timed(Op::Setxattr, || self.fs.setxattr(ino.0, name, value, flags)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.timed(Op::Getxattr, || self.fs.getxattr(ino.0, name, size)) {
            Ok(XattrReply::Size(n)) => reply.size(n),
            Ok(XattrReply::Data(d)) => reply.data(&d),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.timed(Op::Listxattr, || self.fs.listxattr(ino.0, size)) {
            Ok(XattrReply::Size(n)) => reply.size(n),
            Ok(XattrReply::Data(d)) => reply.data(&d),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.timed(Op::Removexattr, || self.fs.removexattr(ino.0, name)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        match self.timed(Op::Access, || self.fs.access(ino.0, mask.bits())) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self.timed(Op::Fallocate, || {
            self.fs.fallocate(fh.0, offset, length, mode)
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        match self.timed(Op::Lseek, || self.fs.lseek(fh.0, offset, whence)) {
            Ok(pos) => reply.offset(pos as i64),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        match self
            .fs
            .copy_file_range(fh_in.0, offset_in, fh_out.0, offset_out, len)
        {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }
}
