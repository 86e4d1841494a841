//! Conversions between fuser's types and the core's: times, modes, device numbers,
//! open flags, errors, who a request's caller or creator is, and whether it was resent.

use super::*;

/// The attributes of a negative entry (node id 0), which the kernel does not read.
pub(super) fn absent() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

/// A device number as FUSE carries it (the kernel's `new_encode_dev`): 12 bits of
/// major, 20 of minor, so that `/dev/null` (1,3) stays 1,3.
pub(super) fn encode_dev(rdev: u64) -> u32 {
    let major = (rdev >> 32) as u32;
    let minor = rdev as u32;
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

/// What an open reply asks of the kernel. A file the view serves in direct I/O gets
/// `FOPEN_DIRECT_IO` (every read and write comes to the view, none through the page
/// cache) and `FOPEN_PARALLEL_DIRECT_WRITES` (writers inside the file hold the inode
/// lock shared: fs/fuse/file.c `fuse_dio_wr_exclusive_lock`). Where passthrough is on
/// it still carries the inode's backing id: the kernel refuses an open without
/// `FOPEN_PASSTHROUGH` of an inode another open bound to a backing file
/// (fs/fuse/iomode.c `fuse_file_io_open`), and `FOPEN_DIRECT_IO` overrides it for
/// reads and writes while `mmap` still maps the backing file (fs/fuse/file.c
/// `fuse_file_read_iter`, `fuse_file_write_iter`, `fuse_file_mmap`).
pub(super) fn open_flags(direct: bool) -> FopenFlags {
    if direct {
        FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
    } else {
        FopenFlags::empty()
    }
}

pub(super) fn flush(datasync: bool) -> Flush {
    if datasync { Flush::Data } else { Flush::All }
}

pub(super) fn errno(e: &FsError) -> Errno {
    Errno::from_i32(e.errno())
}

pub(super) fn system_time(t: Time) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::new(t.sec.unsigned_abs(), 0) + Duration::new(0, t.nsec)
    }
}

pub(super) fn set_time(t: TimeOrNow) -> SetTime {
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

pub(super) fn file_type(k: Kind) -> FileType {
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

/// [`redo_as_done`] for a request: whether the kernel sent it again is bit 63 of its
/// `unique` (`FUSE_UNIQUE_RESEND`).
pub(super) fn done_before<T>(
    req: &Request,
    r: Result<T, FsError>,
    already: i32,
    then: impl FnOnce() -> Result<T, FsError>,
) -> Result<T, FsError> {
    redo_as_done(resent(req.unique().0), r, already, then)
}

/// Whether the kernel sent a request again (bit 63 of `unique`: `FUSE_UNIQUE_RESEND`).
pub(super) fn resent(unique: u64) -> bool {
    unique & (1 << 63) != 0
}

/// The caller of a request that creates nothing: its thread only. With
/// `FUSE_ALLOW_IDMAP` the header's uid and gid are `FUSE_INVALID_UIDGID` here, on every
/// mount of the connection (fs/fuse/dev.c `fuse_fill_creds`), so they are not passed on
/// at all, negotiated or not.
pub(super) fn caller(req: &Request) -> Caller {
    Caller { pid: req.pid() }
}

/// The maker of a new entry: a creation request's uid and gid, mapped by the kernel
/// through the mount's idmapping. The kernel always sends them with MKNOD, MKDIR,
/// SYMLINK and CREATE; a request without them (`FUSE_INVALID_UIDGID`) is refused with
/// `EOVERFLOW`, what the kernel answers for a caller whose IDs the mount cannot map,
/// rather than record an owner of 4294967295.
pub(super) fn creator(req: &Request) -> Result<Creator, FsError> {
    let (uid, gid) = (req.uid(), req.gid());
    if uid == FUSE_INVALID_UIDGID || gid == FUSE_INVALID_UIDGID {
        return Err(FsError::Os(crate::sys::Errno(libc::EOVERFLOW)));
    }
    Ok(Creator {
        uid,
        gid,
        pid: req.pid(),
    })
}

/// `FUSE_INVALID_UIDGID` (include/uapi/linux/fuse.h).
pub(super) const FUSE_INVALID_UIDGID: u32 = u32::MAX;

pub(super) fn xattr_reply(reply: ReplyXattr, x: XattrReply) {
    match x {
        XattrReply::Size(n) => reply.size(n),
        XattrReply::Data(d) => reply.data(&d),
    }
}
