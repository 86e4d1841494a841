//! floorfs: the floor under every FUSE file system on this kernel and machine, for
//! `bench/run --floor` (docs/notes/benchmarks.md, *The floor*).
//!
//! It serves a directory's tree from memory: a directory is read from the backing
//! directory once, the first time the kernel asks about it (names, kinds, modes,
//! sizes), and from then on every request is answered from a map, without a system
//! call. Creates, unlinks and renames change only the map; written data is dropped and
//! reads return zeros. An `O_DIRECT` open is served in direct I/O with parallel
//! writes (a view's `direct_io=view`), so direct jobs measure the round trip alone. It runs on the same transport as a view (the vendored fuser, the
//! same worker count, `clone_fd`, `default_permissions`, the view's one-second entry
//! and attribute timeouts), so a job measured through it costs the kernel's requests
//! and the `/dev/fuse` round trips alone. A ratio to native it does not reach is one
//! that no FUSE daemon reaches here, whatever it does.
//!
//! A measuring instrument, not a file system: never mount it over data anyone needs.
//!
//! `floorfs BACKING MOUNTPOINT [--threads N] [--listing plus|plus-names|names]`: how
//! listings are answered. `plus`: READDIRPLUS with every entry's attributes (no LOOKUP
//! for what is listed, a kernel inode for every entry); `plus-names`: READDIRPLUS with
//! names only, the format a view answers a listing nobody stats in; `names`: READDIR,
//! the most compact listing.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, MountOption, OpenFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    Request, SessionACL,
};

/// The view's default entry and attribute timeouts (`attr_timeout=1,entry_timeout=1`).
const TTL: Duration = Duration::from_secs(1);
/// The view's largest write, and the block size its directories show, so that glibc
/// lists them 1 MiB at a time (src/transport/fuse.rs `DIR_BLKSIZE`).
const MAX_WRITE: u32 = 1 << 20;
const ROOT: u64 = 1;

struct Node {
    attr: FileAttr,
    /// A directory's entries by name; `None` until it is first read from `backing`.
    children: Option<BTreeMap<OsString, u64>>,
    /// Where a node that came from the backing directory is there.
    backing: Option<PathBuf>,
}

struct Floor {
    nodes: RwLock<HashMap<u64, Node>>,
    next: AtomicU64,
    listing: Listing,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Listing {
    Plus,
    PlusNames,
    Names,
}

fn kind_of(t: std::fs::FileType) -> FileType {
    FileType::from_std(t).unwrap_or(FileType::RegularFile)
}

fn attr_of(ino: u64, m: &std::fs::Metadata) -> FileAttr {
    let at = |s: i64, ns: i64| SystemTime::UNIX_EPOCH + Duration::new(s.max(0) as u64, ns as u32);
    FileAttr {
        ino: INodeNo(ino),
        size: m.size(),
        blocks: m.blocks(),
        atime: at(m.atime(), m.atime_nsec()),
        mtime: at(m.mtime(), m.mtime_nsec()),
        ctime: at(m.ctime(), m.ctime_nsec()),
        crtime: at(m.ctime(), m.ctime_nsec()),
        kind: kind_of(m.file_type()),
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: if m.is_dir() { MAX_WRITE } else { 4096 },
        flags: 0,
    }
}

fn new_attr(ino: u64, kind: FileType, mode: u32, req: &Request) -> FileAttr {
    let now = SystemTime::now();
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind,
        perm: (mode & 0o7777) as u16,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid: req.uid(),
        gid: req.gid(),
        rdev: 0,
        blksize: if kind == FileType::Directory {
            MAX_WRITE
        } else {
            4096
        },
        flags: 0,
    }
}

impl Floor {
    fn new(backing: &Path, listing: Listing) -> io::Result<Floor> {
        let m = std::fs::metadata(backing)?;
        let root = Node {
            attr: attr_of(ROOT, &m),
            children: None,
            backing: Some(backing.to_path_buf()),
        };
        Ok(Floor {
            nodes: RwLock::new(HashMap::from([(ROOT, root)])),
            next: AtomicU64::new(ROOT + 1),
            listing,
        })
    }

    fn read(&self) -> RwLockReadGuard<'_, HashMap<u64, Node>> {
        self.nodes.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashMap<u64, Node>> {
        self.nodes.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The map for reading, with the directory `dir` loaded ([`Floor::load`]).
    fn loaded(&self, dir: u64) -> Result<RwLockReadGuard<'_, HashMap<u64, Node>>, Errno> {
        self.load(dir)?;
        Ok(self.read())
    }

    /// The map for changing, with the directory `dir` loaded ([`Floor::load`]).
    fn loaded_mut(&self, dir: u64) -> Result<RwLockWriteGuard<'_, HashMap<u64, Node>>, Errno> {
        self.load(dir)?;
        Ok(self.write())
    }

    /// Reads the directory `dir` from the backing directory if it has not been yet:
    /// once per directory, under the write lock; every later request only reads the
    /// map, so the workers do not take turns on it.
    fn load(&self, dir: u64) -> Result<(), Errno> {
        let is_loaded = |nodes: &HashMap<u64, Node>| {
            let node = nodes.get(&dir).ok_or(Errno::ENOENT)?;
            if node.attr.kind != FileType::Directory {
                return Err(Errno::ENOTDIR);
            }
            Ok(node.children.is_some())
        };
        if is_loaded(&self.read())? {
            return Ok(());
        }
        let mut nodes = self.write();
        if is_loaded(&nodes)? {
            return Ok(());
        }
        let mut children = BTreeMap::new();
        let mut made = Vec::new();
        if let Some(path) = nodes[&dir].backing.clone() {
            for e in std::fs::read_dir(&path)
                .map_err(|e| Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO)))?
                .flatten()
            {
                let Ok(m) = e.metadata() else { continue };
                let ino = self.next.fetch_add(1, Ordering::Relaxed);
                children.insert(e.file_name(), ino);
                made.push((
                    ino,
                    Node {
                        attr: attr_of(ino, &m),
                        children: None,
                        backing: Some(e.path()),
                    },
                ));
            }
        }
        nodes.extend(made);
        if let Some(n) = nodes.get_mut(&dir) {
            n.children = Some(children);
        }
        Ok(())
    }

    fn child(&self, parent: u64, name: &OsStr) -> Result<FileAttr, Errno> {
        let nodes = self.loaded(parent)?;
        let ino = nodes[&parent]
            .children
            .as_ref()
            .and_then(|c| c.get(name))
            .ok_or(Errno::ENOENT)?;
        Ok(nodes[ino].attr)
    }

    fn make(
        &self,
        parent: u64,
        name: &OsStr,
        kind: FileType,
        mode: u32,
        req: &Request,
    ) -> Result<FileAttr, Errno> {
        let mut nodes = self.loaded_mut(parent)?;
        if nodes[&parent]
            .children
            .as_ref()
            .is_some_and(|c| c.contains_key(name))
        {
            return Err(Errno::EEXIST);
        }
        let ino = self.next.fetch_add(1, Ordering::Relaxed);
        let attr = new_attr(ino, kind, mode, req);
        let children = (kind == FileType::Directory).then(BTreeMap::new);
        nodes.insert(
            ino,
            Node {
                attr,
                children,
                backing: None,
            },
        );
        let p = nodes.get_mut(&parent).ok_or(Errno::ENOENT)?;
        p.children
            .get_or_insert_default()
            .insert(name.to_os_string(), ino);
        p.attr.mtime = attr.mtime;
        p.attr.ctime = attr.ctime;
        Ok(attr)
    }

    fn remove(&self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let ino = self.child(parent, name)?.ino.0;
        if dir {
            self.load(ino)?;
        }
        let mut nodes = self.write();
        if dir && nodes[&ino].children.as_ref().is_some_and(|c| !c.is_empty()) {
            return Err(Errno::ENOTEMPTY);
        }
        if let Some(p) = nodes.get_mut(&parent) {
            p.children.get_or_insert_default().remove(name);
            p.attr.mtime = SystemTime::now();
            p.attr.ctime = p.attr.mtime;
        }
        Ok(())
    }
}

fn entry(reply: ReplyEntry, made: Result<FileAttr, Errno>) {
    match made {
        Ok(a) => reply.entry(&TTL, &a, Generation(0)),
        Err(e) => reply.error(e),
    }
}

fn done(reply: ReplyEmpty, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

/// An `O_DIRECT` open is served in direct I/O with parallel writes, as a view serves
/// it with `direct_io=view`: every read and write a round trip, writers not serialised
/// on the inode. Others go through the page cache.
fn open_flags(flags: i32) -> FopenFlags {
    if flags & libc::O_DIRECT != 0 {
        FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
    } else {
        FopenFlags::empty()
    }
}

impl Filesystem for Floor {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // What a view asks for, but passthrough (there is no backing file to pass to).
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_readahead(MAX_WRITE);
        let mut wanted = InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        if self.listing != Listing::Names {
            wanted |= InitFlags::FUSE_DO_READDIRPLUS;
        }
        let caps = config.capabilities();
        let _ = config.add_capabilities(wanted & caps);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.child(parent.0, name) {
            // As a view answers a missing name: node id 0 with the entry timeout, a
            // negative dentry the kernel keeps (src/transport/fuse.rs `LookupReply`).
            Err(Errno::ENOENT) => {
                let mut absent = new_attr(0, FileType::RegularFile, 0, req);
                absent.nlink = 0;
                reply.entry_with_ttls(&Duration::ZERO, &TTL, &absent, Generation(0));
            }
            found => entry(reply, found),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let nodes = self.read();
        match nodes.get(&ino.0) {
            Some(n) => reply.attr(&TTL, &n.attr),
            None => reply.error(Errno::ENOENT),
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
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut nodes = self.write();
        let Some(n) = nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        if let Some(m) = mode {
            n.attr.perm = (m & 0o7777) as u16;
        }
        n.attr.uid = uid.unwrap_or(n.attr.uid);
        n.attr.gid = gid.unwrap_or(n.attr.gid);
        n.attr.size = size.unwrap_or(n.attr.size);
        n.attr.ctime = SystemTime::now();
        reply.attr(&TTL, &n.attr);
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        entry(
            reply,
            self.make(parent.0, name, FileType::RegularFile, mode & !umask, req),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        entry(
            reply,
            self.make(parent.0, name, FileType::Directory, mode & !umask, req),
        );
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self.make(parent.0, name, FileType::RegularFile, mode & !umask, req) {
            Ok(a) => reply.created(&TTL, &a, Generation(0), FileHandle(0), open_flags(flags)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        done(reply, self.remove(parent.0, name, false));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        done(reply, self.remove(parent.0, name, true));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let moved = (|| {
            self.load(newparent.0)?;
            let mut nodes = self.loaded_mut(parent.0)?;
            let ino = nodes
                .get_mut(&parent.0)
                .and_then(|p| p.children.as_mut())
                .and_then(|c| c.remove(name))
                .ok_or(Errno::ENOENT)?;
            nodes
                .get_mut(&newparent.0)
                .ok_or(Errno::ENOENT)?
                .children
                .get_or_insert_default()
                .insert(newname.to_os_string(), ino);
            Ok(())
        })();
        done(reply, moved);
    }

    fn open(&self, _req: &Request, _ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), open_flags(flags.0));
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let len = self.read().get(&ino.0).map_or(0, |n| n.attr.size);
        let n = len.saturating_sub(offset).min(u64::from(size)) as usize;
        reply.data(&vec![0; n]);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut nodes = self.write();
        if let Some(n) = nodes.get_mut(&ino.0) {
            n.attr.size = n.attr.size.max(offset + data.len() as u64);
        }
        reply.written(data.len() as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let nodes = match self.loaded(ino.0) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let children = nodes[&ino.0].children.as_ref().into_iter().flatten();
        for (i, (name, child)) in children.enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*child), i as u64 + 1, nodes[child].attr.kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let nodes = match self.loaded(ino.0) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let children = nodes[&ino.0].children.as_ref().into_iter().flatten();
        for (i, (name, child)) in children.enumerate().skip(offset as usize) {
            let (ino, next, attr) = (INodeNo(*child), i as u64 + 1, &nodes[child].attr);
            let full = match self.listing {
                Listing::PlusNames => reply.add_name_only(ino, next, attr.kind, name),
                _ => reply.add(ino, next, name, &TTL, attr, Generation(0)),
            };
            if full {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 30, 1 << 29, 1 << 29, 1 << 24, 1 << 23, 4096, 255, 4096);
    }
}

fn main() -> io::Result<()> {
    let mut args = std::env::args_os().skip(1);
    let usage = || {
        io::Error::other(
            "usage: floorfs BACKING MOUNTPOINT [--threads N] [--listing plus|plus-names|names]",
        )
    };
    let backing = PathBuf::from(args.next().ok_or_else(usage)?);
    let mountpoint = PathBuf::from(args.next().ok_or_else(usage)?);
    let mut threads = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8));
    let mut listing = Listing::Plus;
    while let Some(a) = args.next() {
        let v = args.next().ok_or_else(usage)?;
        match (a.to_str(), v.to_str()) {
            (Some("--threads"), Some(n)) => {
                threads = n
                    .parse()
                    .map_err(|_| io::Error::other(format!("--threads {n}: not a number")))?
            }
            (Some("--listing"), Some("plus")) => listing = Listing::Plus,
            (Some("--listing"), Some("plus-names")) => listing = Listing::PlusNames,
            (Some("--listing"), Some("names")) => listing = Listing::Names,
            _ => return Err(usage()),
        }
    }
    let mut cfg = Config::default();
    cfg.mount_options = vec![
        MountOption::FSName("floorfs".into()),
        MountOption::Subtype("floorfs".into()),
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::DefaultPermissions,
        MountOption::RW,
    ];
    cfg.acl = SessionACL::All;
    cfg.n_threads = Some(threads);
    cfg.clone_fd = true;
    let session = fuser::Session::new(Floor::new(&backing, listing)?, &mountpoint, &cfg)?;
    session.run()
}
