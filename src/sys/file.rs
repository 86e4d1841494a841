//! Safe wrappers for the file system calls the group view makes.
//!
//! The view never resolves a path twice: every inode is an `O_PATH|O_NOFOLLOW`
//! descriptor, and everything else is done relative to one (`*at()` with
//! `AT_EMPTY_PATH`, `openat2` with `RESOLVE_BENEATH|RESOLVE_NO_XDEV|RESOLVE_NO_SYMLINKS`).
//! Where the kernel offers no descriptor-based call for an `O_PATH` descriptor
//! (xattrs, chmod, reopening for I/O), the wrapper goes through the descriptor's own
//! `/proc/self/fd/N` magic link, which names exactly that inode and nothing else.

use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{
    AtFlags, FileType, Mode, OFlags, RenameFlags, ResolveFlags, SeekFrom, StatxFlags, Timespec,
    Timestamps,
};
use rustix::fs::{Gid, Uid};

use super::procfd::{ProcPath, proc_fd_dir};
use super::{Errno, SysResult, failed};

/// The type of a file system object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Regular,
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl Kind {
    /// The kind named by the `S_IFMT` bits of a mode, if any.
    pub fn from_mode(mode: u32) -> Option<Kind> {
        match mode & libc::S_IFMT {
            libc::S_IFREG => Some(Kind::Regular),
            libc::S_IFDIR => Some(Kind::Directory),
            libc::S_IFLNK => Some(Kind::Symlink),
            libc::S_IFIFO => Some(Kind::Fifo),
            libc::S_IFSOCK => Some(Kind::Socket),
            libc::S_IFCHR => Some(Kind::CharDevice),
            libc::S_IFBLK => Some(Kind::BlockDevice),
            _ => None,
        }
    }

    /// The `S_IFMT` bits of the kind (the inverse of [`Kind::from_mode`]).
    pub fn mode_bits(self) -> u32 {
        match self {
            Kind::Regular => libc::S_IFREG,
            Kind::Directory => libc::S_IFDIR,
            Kind::Symlink => libc::S_IFLNK,
            Kind::Fifo => libc::S_IFIFO,
            Kind::Socket => libc::S_IFSOCK,
            Kind::CharDevice => libc::S_IFCHR,
            Kind::BlockDevice => libc::S_IFBLK,
        }
    }

    pub(super) fn from_file_type(t: FileType) -> Option<Kind> {
        match t {
            FileType::RegularFile => Some(Kind::Regular),
            FileType::Directory => Some(Kind::Directory),
            FileType::Symlink => Some(Kind::Symlink),
            FileType::Fifo => Some(Kind::Fifo),
            FileType::Socket => Some(Kind::Socket),
            FileType::CharacterDevice => Some(Kind::CharDevice),
            FileType::BlockDevice => Some(Kind::BlockDevice),
            FileType::Unknown => None,
        }
    }
}

/// A point in time as the kernel stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Time {
    pub sec: i64,
    pub nsec: u32,
}

/// What `statx(2)` says of an inode, in the units the view needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    pub dev: u64,
    pub ino: u64,
    /// The mount the inode was reached through (`STATX_MNT_ID`), when the kernel tells.
    pub mnt_id: Option<u64>,
    pub kind: Kind,
    /// Permission bits and the set-id and sticky bits (`mode & 0o7777`).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub blocks: u64,
    pub blksize: u32,
    pub rdev: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    pub btime: Option<Time>,
}

/// Set-id and sticky bits plus the permission bits.
pub const PERM_MASK: u32 = 0o7777;

/// Opens the directory the view mirrors. The administrator's path is resolved once,
/// here, following symlinks as mount(8) would; nothing is ever resolved by path again.
///
/// # Errors
/// The error of `open(2)`; `ENOTDIR` when the path is not a directory.
pub fn open_root(path: &Path) -> SysResult<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(failed("open"))
}

/// The path that names the very inode `fd` refers to (its `/proc/self/fd/N` magic
/// link), for the calls that take a path: resolving it reaches that inode and no
/// other, whatever was renamed since. Valid while `fd` is open.
pub fn fd_path(fd: BorrowedFd<'_>) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

static OPENAT2_MISSING: AtomicBool = AtomicBool::new(false);

/// Opens one entry of a directory as an `O_PATH|O_NOFOLLOW` descriptor.
///
/// The name must be a single component. `openat2` with `RESOLVE_BENEATH`,
/// `RESOLVE_NO_XDEV` and `RESOLVE_NO_SYMLINKS` makes sure that the result is a child
/// of `dir` on the same mount: a symlink is returned as itself, never followed, and a
/// mount point inside the tree fails with `EXDEV`. Where the kernel has no `openat2`
/// (before 5.6), `openat` plus a mount-id comparison gives the same guarantees.
///
/// # Errors
/// `EINVAL` for an empty name, `.`, `..` or a name with `/`; `EXDEV` for a mount point;
/// otherwise the error of the open.
pub fn open_child(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    dir_mnt_id: Option<u64>,
) -> SysResult<OwnedFd> {
    single_name(name)?;
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    if !OPENAT2_MISSING.load(Ordering::Relaxed) {
        let resolve = ResolveFlags::BENEATH
            | ResolveFlags::NO_XDEV
            | ResolveFlags::NO_SYMLINKS
            | ResolveFlags::NO_MAGICLINKS;
        match rustix::fs::openat2(dir, name, flags, Mode::empty(), resolve) {
            Ok(fd) => return Ok(fd),
            Err(rustix::io::Errno::NOSYS) => OPENAT2_MISSING.store(true, Ordering::Relaxed),
            Err(rustix::io::Errno::AGAIN) => {
                // openat2 asks to retry when a rename raced the resolution.
                return rustix::fs::openat2(dir, name, flags, Mode::empty(), resolve)
                    .map_err(failed("openat2"));
            }
            Err(e) => return Err(failed("openat2")(e)),
        }
    }
    let fd = rustix::fs::openat(dir, name, flags, Mode::empty()).map_err(failed("openat"))?;
    if let Some(parent_mnt) = dir_mnt_id {
        let st = stat(fd.as_fd())?;
        if st.mnt_id.is_some_and(|m| m != parent_mnt) {
            return Err(Errno::EXDEV);
        }
    }
    Ok(fd)
}

/// `statx(2)` of the inode a descriptor refers to, never following a symlink.
///
/// # Errors
/// The error of `statx`; `EIO` for a file type the kernel does not name.
pub fn stat(fd: BorrowedFd<'_>) -> SysResult<Stat> {
    statx_at(fd, c"", AtFlags::EMPTY_PATH)
}

/// `statx(2)` of `fd` from what its file system has cached (`AT_STATX_DONT_SYNC`):
/// a network file system sends no request for it, and its answer may be old but for
/// what never changes while the descriptor pins the inode, its device and number.
///
/// # Errors
/// As [`stat`].
pub fn stat_cached(fd: BorrowedFd<'_>) -> SysResult<Stat> {
    statx_at(fd, c"", AtFlags::EMPTY_PATH | AtFlags::STATX_DONT_SYNC)
}

/// The type and permission bits of what `fd` refers to (`statx(2)` asking for no
/// more): a network file system asks its server only when its own cache of them
/// is stale (the NFS client: its attribute timeout, or a change it was told of,
/// as its permission checks revalidate; fs/nfs/inode.c `nfs_getattr`), where a
/// full [`stat`] also asks after each change of the times or size it knows is
/// coming (a directory's after every create or removal in it).
///
/// # Errors
/// As [`stat`].
pub fn kind_and_perm(fd: BorrowedFd<'_>) -> SysResult<(Kind, u32)> {
    let want = StatxFlags::TYPE | StatxFlags::MODE;
    statx_wanting(fd, c"", AtFlags::EMPTY_PATH, want).map(|st| (st.kind, st.perm))
}

/// Whether the calling thread, with its file-system ids, groups and capabilities
/// (`faccessat2(R_OK, AT_EACCESS)` of its `/proc/self/fd` link), may read what `fd`
/// (an `O_PATH` descriptor) leads to, as its open for reading would check: on a
/// network file system, the server's answer (the NFS client's access cache).
pub fn may_read(fd: BorrowedFd<'_>) -> bool {
    may(fd, libc::R_OK).is_ok()
}

/// [`may_read`] for the access `mode` asks (`R_OK`, `W_OK`, `X_OK`, or `F_OK`): what
/// `access(2)` of the file answers the calling thread, as the file's own checks
/// answer it (but for a read-only mount, which the caller checks).
///
/// # Errors
/// `EACCES` where it may not, or the error of `faccessat2`.
pub fn may(fd: BorrowedFd<'_>, mode: i32) -> SysResult<()> {
    // Through the magic link, as [`reopen`] opens it: rustix takes no `AT_EMPTY_PATH`
    // for `faccessat2`.
    let path = ProcPath::new(fd);
    let access = rustix::fs::Access::from_bits_truncate(mode as u32);
    let eaccess = AtFlags::EACCESS;
    match proc_fd_dir() {
        Some(dir) => rustix::fs::accessat(dir, path.name(), access, eaccess),
        None => rustix::fs::accessat(rustix::fs::CWD, path.as_cstr(), access, eaccess),
    }
    .map_err(Errno::from)
}

/// `statx(2)` of what the single name `name` in `dir` is now, never following a
/// symlink or triggering an automount. A name with a mount on it gives the mounted
/// root (another device). The answer says what the name led to at one moment only:
/// it is a check against a descriptor already held (`fs/ahead.rs`), never a way to
/// reach an inode.
///
/// # Errors
/// `EINVAL` for an empty name, `.`, `..` or a name with `/`; otherwise as [`stat`].
pub fn stat_child(dir: BorrowedFd<'_>, name: &OsStr) -> SysResult<Stat> {
    single_name(name)?;
    statx_at(dir, name, AtFlags::NO_AUTOMOUNT)
}

/// `EINVAL` unless `name` is one entry of a directory: not empty, `.`, `..`, nor with
/// a `/`.
fn single_name(name: &OsStr) -> SysResult<()> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

fn statx_at<P: rustix::path::Arg>(dir: BorrowedFd<'_>, path: P, flags: AtFlags) -> SysResult<Stat> {
    let want = StatxFlags::BASIC_STATS | StatxFlags::BTIME | StatxFlags::MNT_ID;
    statx_wanting(dir, path, flags, want)
}

/// [`statx_at`] asking for `want` only: what else the [`Stat`] holds may be stale.
fn statx_wanting<P: rustix::path::Arg>(
    dir: BorrowedFd<'_>,
    path: P,
    flags: AtFlags,
    want: StatxFlags,
) -> SysResult<Stat> {
    let sx = rustix::fs::statx(dir, path, flags | AtFlags::SYMLINK_NOFOLLOW, want)
        .map_err(failed("statx"))?;
    let mask = StatxFlags::from_bits_retain(sx.stx_mask);
    let kind = Kind::from_mode(u32::from(sx.stx_mode)).ok_or(Errno::EIO)?;
    let t = |ts: rustix::fs::StatxTimestamp| Time {
        sec: ts.tv_sec,
        nsec: ts.tv_nsec,
    };
    Ok(Stat {
        dev: (u64::from(sx.stx_dev_major) << 32) | u64::from(sx.stx_dev_minor),
        ino: sx.stx_ino,
        mnt_id: mask.contains(StatxFlags::MNT_ID).then_some(sx.stx_mnt_id),
        kind,
        perm: u32::from(sx.stx_mode) & PERM_MASK,
        uid: sx.stx_uid,
        gid: sx.stx_gid,
        nlink: sx.stx_nlink,
        size: sx.stx_size,
        blocks: sx.stx_blocks,
        blksize: sx.stx_blksize,
        rdev: (u64::from(sx.stx_rdev_major) << 32) | u64::from(sx.stx_rdev_minor),
        atime: t(sx.stx_atime),
        mtime: t(sx.stx_mtime),
        ctime: t(sx.stx_ctime),
        btime: mask.contains(StatxFlags::BTIME).then(|| t(sx.stx_btime)),
    })
}

/// `statx(2)` of `name` in `dir` for its side effect only: the file system reads
/// the inode into its caches (`fs/ahead.rs`). Never follows a symlink or triggers an
/// automount; the result, and any error, are dropped.
pub fn warm_child(dir: BorrowedFd<'_>, name: &OsStr) {
    let _ = rustix::fs::statx(
        dir,
        name,
        AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT,
        StatxFlags::BASIC_STATS,
    );
}

/// Asks whether the calling thread, with its file-system ids, may search `dir`
/// (`faccessat2(dir, ".", X_OK, AT_EACCESS)`), for the side effect only: a network
/// file system keeps the server's answer (the NFS client's access cache, filled by an
/// `ACCESS` request), so that lookups in `dir` made next on several threads at once
/// find it there, where each would otherwise ask the server for it (`fs/ops/dirs.rs`).
/// The result, and any error, are dropped: each lookup meets its own.
pub fn warm_search(dir: BorrowedFd<'_>) {
    let _ = rustix::fs::accessat(dir, c".", rustix::fs::Access::EXEC_OK, AtFlags::EACCESS);
}

/// How a regular file or directory is reopened for I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    ReadOnly,
    ReadWrite,
    /// A directory stream (`O_RDONLY|O_DIRECTORY`).
    Directory,
    /// Another `O_PATH` descriptor to the same inode.
    Path,
}

/// Reopens the inode behind an `O_PATH` descriptor for I/O.
///
/// Only regular files and directories are reopened for I/O: through the magic link
/// the kernel would happily open a FIFO (and block) or a device node. `kind` is the
/// kind the inode was found to have when it was looked up (an inode keeps its kind);
/// any other kind is refused here, where the rule is stated. The magic link
/// `/proc/self/fd/N` names the very inode the descriptor holds, whatever was renamed
/// since, so no path is resolved again.
///
/// # Errors
/// `EINVAL` for another kind, otherwise the error of `open(2)`.
pub fn reopen(fd: BorrowedFd<'_>, kind: Kind, access: Access) -> SysResult<OwnedFd> {
    reopen_with(fd, kind, access, OFlags::empty())
}

/// Reopens an open regular file for direct I/O (`O_DIRECT`, through the same magic
/// link as [`reopen`]), read-write or read-only; see `sys/direct.rs` for the I/O.
///
/// # Errors
/// The error of `open(2)`: `EINVAL` where the file system has no direct I/O.
pub fn reopen_direct(fd: BorrowedFd<'_>, writable: bool) -> SysResult<OwnedFd> {
    let access = if writable {
        Access::ReadWrite
    } else {
        Access::ReadOnly
    };
    reopen_with(fd, Kind::Regular, access, OFlags::DIRECT)
}

/// Reopens an open regular file (through the same magic link as [`reopen`]) with the
/// status flags of another open of it, `flags` as `open(2)` takes them: the access
/// mode and `O_APPEND`, `O_NONBLOCK`, `O_SYNC`, `O_DSYNC`, `O_DIRECT`, `O_NOATIME`,
/// `O_ASYNC`. The kernel's file then has the same `f_flags` as that open's.
///
/// # Errors
/// `EINVAL` for any other flag (`O_CREAT`, `O_TRUNC`, `O_NOFOLLOW`, which the magic
/// link refuses, ...), otherwise the error of `open(2)`.
pub fn reopen_like(fd: BorrowedFd<'_>, flags: i32) -> SysResult<OwnedFd> {
    if !can_reopen_like(flags) {
        return Err(Errno::EINVAL);
    }
    let flags = OFlags::from_bits_retain(flags as u32) | OFlags::CLOEXEC;
    open_magic(fd, flags)
}

/// Whether [`reopen_like`] can give an open's `flags` (an exec's `__FMODE_EXEC`,
/// `O_TRUNC`, `O_NOFOLLOW` and the like it cannot).
pub fn can_reopen_like(flags: i32) -> bool {
    const LIKE: i32 = libc::O_ACCMODE
        | libc::O_APPEND
        | libc::O_NONBLOCK
        | libc::O_SYNC
        | libc::O_DSYNC
        | libc::O_DIRECT
        | libc::O_NOATIME
        | libc::O_ASYNC
        | libc::O_CLOEXEC;
    // The kernel's own bit, which a 64-bit libc gives as 0 (it adds it to every open).
    let like = LIKE | OFlags::LARGEFILE.bits() as i32;
    flags & !like == 0 && flags & libc::O_ACCMODE != libc::O_ACCMODE
}

/// Opens the inode behind `fd` through its magic link with `flags`.
fn open_magic(fd: BorrowedFd<'_>, flags: OFlags) -> SysResult<OwnedFd> {
    let path = ProcPath::new(fd);
    let new = match proc_fd_dir() {
        Some(dir) => rustix::fs::openat(dir, path.name(), flags, Mode::empty()),
        None => rustix::fs::open(path.as_cstr(), flags, Mode::empty()),
    };
    new.map_err(failed("open"))
}

fn reopen_with(
    fd: BorrowedFd<'_>,
    kind: Kind,
    access: Access,
    extra: OFlags,
) -> SysResult<OwnedFd> {
    let allowed = match access {
        Access::Path => true,
        Access::Directory => kind == Kind::Directory,
        Access::ReadOnly | Access::ReadWrite => kind == Kind::Regular,
    };
    if !allowed {
        return Err(Errno::EINVAL);
    }
    // No `O_NOCTTY`: nothing reopened here is a terminal, and the SMB client gives
    // a later open of the file with the same flags (the kernel's passthrough open of
    // a caller's plain `O_RDONLY` or `O_RDWR`) this open's handle only where its flags
    // are the same, and it keeps `O_NOCTTY` among them (fs/smb/client/file.c
    // `cifs_open`); otherwise that open costs the server a `CREATE` of its own.
    let flags = OFlags::CLOEXEC
        | extra
        | match access {
            Access::ReadOnly => OFlags::RDONLY,
            Access::ReadWrite => OFlags::RDWR,
            Access::Directory => OFlags::RDONLY | OFlags::DIRECTORY,
            Access::Path => OFlags::PATH,
        };
    open_magic(fd, flags)
}

/// Makes reads through `fd` leave the inode's access time alone (`O_NOATIME`, set with
/// `fcntl(F_SETFL)`; allowed to the file's owner and to `CAP_FOWNER`).
///
/// # Errors
/// The error of `fcntl(2)`, `EPERM` for a caller that may not.
pub fn set_noatime(fd: BorrowedFd<'_>) -> SysResult<()> {
    let flags = rustix::fs::fcntl_getfl(fd).map_err(failed("fcntl(F_GETFL)"))?;
    rustix::fs::fcntl_setfl(fd, flags | OFlags::NOATIME).map_err(failed("fcntl(F_SETFL)"))
}

/// Creates a regular file (`O_CREAT|O_EXCL|O_NOFOLLOW`) and returns it open read-write.
///
/// # Errors
/// The error of `openat(2)`, `EEXIST` when the name exists.
pub fn create_file(dir: BorrowedFd<'_>, name: &OsStr, perm: u32) -> SysResult<OwnedFd> {
    create_with(dir, name, perm, OFlags::EXCL)
}

/// [`create_file`] without `O_EXCL`, for a name nobody else can make (a random name
/// the views reserve): an exclusive create costs NFS a `SETATTR` after its `OPEN`
/// (fs/nfs/nfs4proc.c, `nfs4_exclusive_attrset`), a server round trip per create.
/// What it opens must be a new file: an empty regular file with one link, or
/// `EEXIST`.
///
/// # Errors
/// The error of `openat(2)` or `statx(2)`; `EEXIST` for anything but a new file.
pub fn create_fresh(dir: BorrowedFd<'_>, name: &OsStr, perm: u32) -> SysResult<OwnedFd> {
    let fd = create_with(dir, name, perm, OFlags::empty())?;
    // Only what the check needs: what the create's reply brought, no round trip.
    let sx = rustix::fs::statx(
        &fd,
        c"",
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::TYPE | StatxFlags::NLINK | StatxFlags::SIZE,
    )
    .map_err(failed("statx"))?;
    let regular = Kind::from_mode(u32::from(sx.stx_mode)) == Some(Kind::Regular);
    if !regular || sx.stx_nlink != 1 || sx.stx_size != 0 {
        return Err(Errno::EEXIST);
    }
    Ok(fd)
}

fn create_with(dir: BorrowedFd<'_>, name: &OsStr, perm: u32, extra: OFlags) -> SysResult<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::CREATE | extra | OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::from_raw_mode(perm & PERM_MASK),
    )
    .map_err(failed("openat"))
}

/// Creates an unnamed regular file in `dir` (`O_TMPFILE`) and returns it open
/// read-write. Nothing can reach it by name until [`link_unnamed`] gives it one, and if
/// that never happens it disappears with its last descriptor.
///
/// # Errors
/// The error of `openat(2)`: `EOPNOTSUPP` (or `EISDIR`, `EINVAL`) where the file system
/// cannot make unnamed files.
pub fn create_unnamed(dir: BorrowedFd<'_>, perm: u32) -> SysResult<OwnedFd> {
    rustix::fs::openat(
        dir,
        c".",
        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::from_raw_mode(perm & PERM_MASK),
    )
    .map_err(failed("openat(O_TMPFILE)"))
}

/// Gives the unnamed file `fd` made by [`create_unnamed`] the name `name` in `dir`,
/// never replacing anything: `linkat(2)` of the descriptor's `/proc/self/fd` entry with
/// `AT_SYMLINK_FOLLOW`, which (unlike `AT_EMPTY_PATH`, used only without `/proc`) needs
/// no `CAP_DAC_READ_SEARCH`. The link the kernel follows is this process's own
/// descriptor.
///
/// # Errors
/// `EEXIST` when the name exists, otherwise the error of the call.
pub fn link_unnamed(fd: BorrowedFd<'_>, dir: BorrowedFd<'_>, name: &OsStr) -> SysResult<()> {
    let path = ProcPath::new(fd);
    match proc_fd_dir() {
        Some(proc) => rustix::fs::linkat(proc, path.name(), dir, name, AtFlags::SYMLINK_FOLLOW),
        // Without /proc: the descriptor itself, which takes CAP_DAC_READ_SEARCH.
        None => rustix::fs::linkat(fd, c"", dir, name, AtFlags::EMPTY_PATH),
    }
    .map_err(failed("linkat"))
}

/// `mkdirat(2)`.
///
/// # Errors
/// The error of the call.
pub fn mkdir(dir: BorrowedFd<'_>, name: &OsStr, perm: u32) -> SysResult<()> {
    rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(perm & PERM_MASK)).map_err(failed("mkdirat"))
}

/// `mknodat(2)` for a FIFO, socket or empty regular file. Device nodes are refused
/// here, below every policy: a root daemon must never create one on a share.
///
/// # Errors
/// `EPERM` for a device node, otherwise the error of the call.
pub fn mknod(dir: BorrowedFd<'_>, name: &OsStr, kind: Kind, perm: u32) -> SysResult<()> {
    let ft = match kind {
        Kind::Fifo => FileType::Fifo,
        Kind::Socket => FileType::Socket,
        Kind::Regular => FileType::RegularFile,
        Kind::CharDevice | Kind::BlockDevice => return Err(Errno::EPERM),
        Kind::Directory | Kind::Symlink => return Err(Errno::EINVAL),
    };
    rustix::fs::mknodat(dir, name, ft, Mode::from_raw_mode(perm & PERM_MASK), 0)
        .map_err(failed("mknodat"))
}

/// `symlinkat(2)`: the target is stored as given and never resolved.
///
/// # Errors
/// The error of the call.
pub fn symlink(target: &OsStr, dir: BorrowedFd<'_>, name: &OsStr) -> SysResult<()> {
    rustix::fs::symlinkat(target, dir, name).map_err(failed("symlinkat"))
}

/// `linkat(2)` of the inode itself (`AT_EMPTY_PATH`), so no name is resolved.
///
/// # Errors
/// The error of the call.
pub fn link(fd: BorrowedFd<'_>, dir: BorrowedFd<'_>, name: &OsStr) -> SysResult<()> {
    rustix::fs::linkat(fd, c"", dir, name, AtFlags::EMPTY_PATH).map_err(failed("linkat"))
}

/// What `unlinkat(2)` removes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Remove {
    /// Anything but a directory (`unlink`).
    NonDirectory,
    /// An empty directory (`rmdir`, `AT_REMOVEDIR`).
    Directory,
}

/// `unlinkat(2)`.
///
/// # Errors
/// The error of the call.
pub fn unlink(dir: BorrowedFd<'_>, name: &OsStr, what: Remove) -> SysResult<()> {
    let flags = match what {
        Remove::NonDirectory => AtFlags::empty(),
        Remove::Directory => AtFlags::REMOVEDIR,
    };
    rustix::fs::unlinkat(dir, name, flags).map_err(failed("unlinkat"))
}

/// `renameat2(2)` with the `RENAME_NOREPLACE`/`RENAME_EXCHANGE` bits of `flags`.
///
/// # Errors
/// `EINVAL` for any other flag (`RENAME_WHITEOUT` is an overlayfs internal), otherwise
/// the error of the call.
pub fn rename(
    old_dir: BorrowedFd<'_>,
    old_name: &OsStr,
    new_dir: BorrowedFd<'_>,
    new_name: &OsStr,
    flags: u32,
) -> SysResult<()> {
    let allowed = RenameFlags::NOREPLACE | RenameFlags::EXCHANGE;
    let flags = RenameFlags::from_bits(flags).ok_or(Errno::EINVAL)?;
    if !allowed.contains(flags) {
        return Err(Errno::EINVAL);
    }
    rustix::fs::renameat_with(old_dir, old_name, new_dir, new_name, flags)
        .map_err(failed("renameat_with"))
}

/// `readlinkat(2)` of the symlink a descriptor refers to.
///
/// # Errors
/// The error of the call.
pub fn readlink(fd: BorrowedFd<'_>) -> SysResult<Vec<u8>> {
    Ok(rustix::fs::readlinkat(fd, c"", Vec::new())
        .map_err(failed("readlinkat"))?
        .into_bytes())
}

/// `fchownat(2)` with `AT_EMPTY_PATH|AT_SYMLINK_NOFOLLOW`; `None` leaves an id as is.
///
/// # Errors
/// The error of the call.
pub fn chown(fd: BorrowedFd<'_>, uid: Option<u32>, gid: Option<u32>) -> SysResult<()> {
    rustix::fs::chownat(
        fd,
        c"",
        uid.map(Uid::from_raw),
        gid.map(Gid::from_raw),
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(failed("chownat"))
}

/// `chmod(2)` of the inode a descriptor refers to (not for symlinks).
///
/// # Errors
/// The error of the call.
pub fn chmod(fd: BorrowedFd<'_>, perm: u32) -> SysResult<()> {
    let path = ProcPath::new(fd);
    rustix::fs::chmod(path.as_cstr(), Mode::from_raw_mode(perm & PERM_MASK))
        .map_err(failed("chmod"))
}

/// A time to set: a value, the current time, or leave it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    Omit,
    Now,
    At(Time),
}

impl SetTime {
    fn timespec(self) -> Timespec {
        match self {
            SetTime::Omit => Timespec {
                tv_sec: 0,
                tv_nsec: rustix::fs::UTIME_OMIT,
            },
            SetTime::Now => Timespec {
                tv_sec: 0,
                tv_nsec: rustix::fs::UTIME_NOW,
            },
            SetTime::At(t) => Timespec {
                tv_sec: t.sec,
                tv_nsec: i64::from(t.nsec),
            },
        }
    }
}

/// `utimensat(2)` with `AT_EMPTY_PATH|AT_SYMLINK_NOFOLLOW`.
///
/// # Errors
/// The error of the call.
pub fn set_times(fd: BorrowedFd<'_>, atime: SetTime, mtime: SetTime) -> SysResult<()> {
    let ts = Timestamps {
        last_access: atime.timespec(),
        last_modification: mtime.timespec(),
    };
    rustix::fs::utimensat(
        fd,
        c"",
        &ts,
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(failed("utimensat"))
}

/// `ftruncate(2)` on a descriptor open for writing.
///
/// # Errors
/// The error of the call.
pub fn truncate(fd: BorrowedFd<'_>, size: u64) -> SysResult<()> {
    rustix::fs::ftruncate(fd, size).map_err(failed("ftruncate"))
}

/// `pread(2)` until `len` bytes or end of file.
///
/// # Errors
/// The error of the call.
pub fn read_at(fd: BorrowedFd<'_>, offset: u64, len: usize) -> SysResult<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut done = 0usize;
    while done < len {
        let n = rustix::io::pread(fd, &mut buf[done..], offset + done as u64)
            .map_err(failed("pread"))?;
        if n == 0 {
            break;
        }
        done += n;
    }
    buf.truncate(done);
    Ok(buf)
}

/// `pwrite(2)` of the whole buffer.
///
/// # Errors
/// The error of the call.
pub fn write_at(fd: BorrowedFd<'_>, offset: u64, data: &[u8]) -> SysResult<usize> {
    let mut done = 0usize;
    while done < data.len() {
        let n = rustix::io::pwrite(fd, &data[done..], offset + done as u64)
            .map_err(failed("pwrite"))?;
        if n == 0 {
            return Err(Errno::EIO);
        }
        done += n;
    }
    Ok(done)
}

/// How much of a file `sync` flushes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flush {
    /// Data and what is needed to read it back (`fdatasync(2)`).
    Data,
    /// Data and all metadata (`fsync(2)`).
    All,
}

/// `fsync(2)` or `fdatasync(2)`.
///
/// # Errors
/// The error of the call.
pub fn sync(fd: BorrowedFd<'_>, how: Flush) -> SysResult<()> {
    if how == Flush::Data {
        Ok(rustix::fs::fdatasync(fd).map_err(failed("fdatasync"))?)
    } else {
        Ok(rustix::fs::fsync(fd).map_err(failed("fsync"))?)
    }
}

/// `fallocate(2)` with the caller's mode bits.
///
/// # Errors
/// The error of the call.
pub fn allocate(fd: BorrowedFd<'_>, mode: i32, offset: u64, len: u64) -> SysResult<()> {
    let flags = rustix::fs::FallocateFlags::from_bits_retain(mode as u32);
    rustix::fs::fallocate(fd, flags, offset, len).map_err(failed("fallocate"))
}

/// `lseek(2)` for `SEEK_DATA`/`SEEK_HOLE` (and the plain whences).
///
/// # Errors
/// `EINVAL` for an unknown whence or a negative `SEEK_SET`; `ENXIO` for a negative
/// `SEEK_DATA` or `SEEK_HOLE`, as Linux answers (there is no data or hole before the
/// start: `iomap_seek_data`, `generic_file_llseek_size`); otherwise the error of the
/// call.
pub fn seek(fd: BorrowedFd<'_>, offset: i64, whence: i32) -> SysResult<u64> {
    let at = |offset: i64| u64::try_from(offset).map_err(|_| Errno::ENXIO);
    let pos = match whence {
        libc::SEEK_SET => SeekFrom::Start(u64::try_from(offset).map_err(|_| Errno::EINVAL)?),
        libc::SEEK_CUR => SeekFrom::Current(offset),
        libc::SEEK_END => SeekFrom::End(offset),
        libc::SEEK_DATA => SeekFrom::Data(at(offset)?),
        libc::SEEK_HOLE => SeekFrom::Hole(at(offset)?),
        _ => return Err(Errno::EINVAL),
    };
    rustix::fs::seek(fd, pos).map_err(failed("seek"))
}

/// `copy_file_range(2)` between two descriptors at explicit offsets.
///
/// # Errors
/// The error of the call.
pub fn copy_range(
    from: BorrowedFd<'_>,
    from_off: u64,
    to: BorrowedFd<'_>,
    to_off: u64,
    len: usize,
) -> SysResult<usize> {
    let mut off_in = from_off;
    let mut off_out = to_off;
    rustix::fs::copy_file_range(from, Some(&mut off_in), to, Some(&mut off_out), len)
        .map_err(failed("copy_file_range"))
}

/// What `statvfs(2)` says of the file system behind a descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsStat {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub frsize: u32,
    pub namelen: u32,
}

/// `fstatvfs(2)`; works on `O_PATH` descriptors.
///
/// # Errors
/// The error of the call.
pub fn statvfs(fd: BorrowedFd<'_>) -> SysResult<FsStat> {
    let s = rustix::fs::fstatvfs(fd).map_err(failed("fstatvfs"))?;
    Ok(FsStat {
        blocks: s.f_blocks,
        bfree: s.f_bfree,
        bavail: s.f_bavail,
        files: s.f_files,
        ffree: s.f_ffree,
        bsize: u32::try_from(s.f_bsize).unwrap_or(u32::MAX),
        frsize: u32::try_from(s.f_frsize).unwrap_or(u32::MAX),
        namelen: u32::try_from(s.f_namemax).unwrap_or(255),
    })
}

/// Sets the process file-mode creation mask, returning the old one.
///
/// The daemon runs with umask 0: the kernel already applied the caller's umask to
/// every mode it sends, and a second mask would silently change what callers asked for.
pub fn set_umask(mask: u32) -> u32 {
    rustix::process::umask(Mode::from_raw_mode(mask)).bits()
}

/// A new file in memory (`memfd_create(2)`, close-on-exec) opened for appending
/// (`O_APPEND`: each write lands whole at its end, whoever else writes), named `name`
/// in `/proc/PID/fd` listings.
///
/// # Errors
/// The error of `memfd_create` or `fcntl`.
pub fn memfd_append(name: &std::ffi::CStr) -> SysResult<std::fs::File> {
    let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)
        .map_err(failed("memfd_create"))?;
    let file = std::fs::File::from(fd);
    rustix::fs::fcntl_setfl(&file, OFlags::APPEND).map_err(failed("fcntl"))?;
    Ok(file)
}

/// `CIFS_SUPER_MAGIC` and `SMB2_SUPER_MAGIC` (include/uapi/linux/magic.h): the
/// kernel's SMB client.
const SMB_MAGICS: [i64; 2] = [0xFF53_4D42, 0xFE53_4D42];

/// Whether `fd` is on a file system of the kernel's SMB client (CIFS, SMB2/3).
pub fn is_smb(fd: BorrowedFd<'_>) -> bool {
    rustix::fs::fstatfs(fd).is_ok_and(|s| SMB_MAGICS.contains(&{ s.f_type }))
}

/// `NFS_SUPER_MAGIC` (include/uapi/linux/magic.h): the kernel's NFS client.
const NFS_MAGIC: i64 = 0x6969;

/// Whether `fd` is on a file system of the kernel's NFS client.
pub fn is_nfs(fd: BorrowedFd<'_>) -> bool {
    rustix::fs::fstatfs(fd).is_ok_and(|s| { s.f_type } == NFS_MAGIC)
}

/// `CEPH_SUPER_MAGIC` (include/uapi/linux/magic.h): the kernel's CephFS client.
const CEPH_MAGIC: i64 = 0x00C3_6400;

/// Whether `fd` is on a file system of the kernel's CephFS client.
pub fn is_cephfs(fd: BorrowedFd<'_>) -> bool {
    rustix::fs::fstatfs(fd).is_ok_and(|s| { s.f_type } == CEPH_MAGIC)
}

/// `statvfs(2)` of the file system at a path (a mount point of a view).
///
/// # Errors
/// The error of the call (`ENOTCONN` for a dead FUSE mount).
pub fn statvfs_path(path: &Path) -> SysResult<FsStat> {
    let fd = rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
        .map_err(failed("open"))?;
    statvfs(fd.as_fd())
}

/// Takes an exclusive `flock(2)` on `path` (created if absent), waiting for it if
/// another process holds it; `on_wait` is called once before waiting. The lock lasts
/// as long as the returned descriptor.
///
/// # Errors
/// The error of opening the file or of `flock`.
pub fn lock_exclusive(path: &Path, on_wait: impl FnOnce()) -> SysResult<OwnedFd> {
    use rustix::fs::FlockOperation;
    let fd = rustix::fs::open(
        path,
        OFlags::CREATE | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(failed("open"))?;
    match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => return Ok(fd),
        Err(rustix::io::Errno::WOULDBLOCK) => on_wait(),
        Err(e) => return Err(failed("flock")(e)),
    }
    rustix::fs::flock(&fd, FlockOperation::LockExclusive).map_err(failed("flock"))?;
    Ok(fd)
}

/// `access(2)` for reading and writing with the real ids.
///
/// # Errors
/// The error of the call (`EACCES` when not allowed).
pub fn check_read_write(path: &Path) -> SysResult<()> {
    rustix::fs::access(
        path,
        rustix::fs::Access::READ_OK | rustix::fs::Access::WRITE_OK,
    )
    .map_err(failed("access"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::OpenOptionsExt;

    #[test]
    fn a_file_reopened_like_another_open_has_its_flags_and_the_rest_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        for (read, write, append, more) in [
            (true, false, false, 0),
            (true, true, false, 0),
            (true, true, true, libc::O_NONBLOCK),
            (false, true, true, libc::O_DSYNC),
        ] {
            let caller = std::fs::OpenOptions::new()
                .read(read)
                .write(write)
                .append(append)
                .custom_flags(more)
                .open(&path)
                .unwrap();
            // What FUSE hands the view: the caller's file's flags.
            let flags = rustix::fs::fcntl_getfl(caller.as_fd()).unwrap();
            let twin = reopen_like(caller.as_fd(), flags.bits() as i32).unwrap();
            assert_eq!(rustix::fs::fcntl_getfl(twin.as_fd()).unwrap(), flags);
        }
        let file = std::fs::File::open(&path).unwrap();
        for refused in [
            libc::O_TRUNC,
            libc::O_NOFOLLOW,
            libc::O_CREAT,
            libc::O_ACCMODE,
            // An exec's open (include/linux/fs.h `__FMODE_EXEC`), as FUSE passes it on.
            0o40,
        ] {
            assert!(!can_reopen_like(refused), "{refused:#o}");
            assert_eq!(
                reopen_like(file.as_fd(), refused).err(),
                Some(Errno::EINVAL),
                "{refused:#o}"
            );
        }
    }
}
