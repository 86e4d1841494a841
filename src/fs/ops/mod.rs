//! The group view's operations on the backing tree, free of FUSE types so that they
//! can be tested against a temp dir and driven by the thin adapter in `fuse.rs`.
//!
//! Permission checks are the kernel's (`default_permissions`, on the presented
//! attributes); the daemon acts as root. What the daemon adds is what the kernel cannot
//! know: the view's read-only state, the CIFS read-only attribute, the hidden record,
//! and the refusal of anything that could reach outside the backing tree.

use std::ffi::{CString, OsStr};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use dashmap::DashMap;

use crate::config::ViewOptions;
use crate::sys::Errno;
use crate::sys::file::{self, Access, Flush, Kind, Remove, SetTime, Stat, Time};

use crate::sys::{dir, xattr};

use super::error::{FsError, FsResult};
use super::inode::{DataFile, Inode, InodeKey, InodeTable, LiveFiles};
use super::lock;
use super::record::{self, Record};
use super::view::{self, Caller, Creator, Owner, OwnerChange, Policy};

mod attrs;
mod callers;
mod dirs;
mod handles;
mod handover;
mod lookup;
pub mod namespace;
mod records;
mod state;

pub use namespace::Existing;
mod xattrs;

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

/// What a listing hands over with each name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listing {
    /// Names, numbers and kinds (READDIR).
    Names,
    /// Full attributes too, each entry counted as a lookup (READDIRPLUS).
    WithAttributes,
    /// READDIRPLUS where the view decides, per chunk, whether entries carry
    /// attributes ([`super::listing`]); those that do not are probes or plain names.
    AsNeeded,
}

/// What a listing's reply can still take: `bytes`, each entry taking `header` bytes
/// and its name, 8-byte aligned (the FUSE encoding). A listing that carries attributes
/// looks up only the entries that fit: a walker reading with a small buffer (Go's
/// `os.ReadDir` reads 8 KiB at a time, about 50 entries) would otherwise pay lookups
/// for entries that go back unhanded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Room {
    pub bytes: usize,
    pub header: usize,
}

impl Room {
    /// No bound: the adapter's `add` alone says when the reply is full.
    pub const UNBOUNDED: Room = Room {
        bytes: usize::MAX,
        header: 0,
    };

    /// The bytes the entry `name` takes.
    pub fn cost(&self, name: &[u8]) -> usize {
        (self.header + name.len()).next_multiple_of(8)
    }
}

/// One entry of a directory listing handed to the adapter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirItem {
    pub name: Vec<u8>,
    pub ino: u64,
    pub kind: Kind,
    /// Full attributes (readdirplus), counted as a kernel lookup; `None` for `.`/`..`,
    /// for plain readdir, and for entries a listing hands out as names only.
    pub attr: Option<Attr>,
}

/// An open file handle and the descriptor behind it (for a passthrough registration).
pub struct Opened {
    pub fh: u64,
    pub data: Arc<DataFile>,
    /// The view serves this handle's reads and writes itself, in direct I/O
    /// (`direct_io=view` and an `O_DIRECT` open).
    pub direct: bool,
}

/// A created (or, without `O_EXCL`, opened) file: its attributes and its open handle.
pub struct Created {
    pub attr: Attr,
    pub fh: u64,
    pub data: Arc<DataFile>,
    /// As [`Opened::direct`].
    pub direct: bool,
}

#[derive(Clone)]
struct OpenFile {
    /// The node id the handle was opened on.
    ino: u64,
    /// Where the kernel's passthrough open of the file would otherwise reach the
    /// server by name: the file opened again with the caller's flags, for the kernel
    /// to take over ([`ViewFs::twin_opens`]); kept while the handle lives, and closed
    /// before the handle lets `data` go, which counts the file open until then
    /// (`namespace.rs`, `held_child`).
    _twin: Option<Arc<OwnedFd>>,
    data: Arc<DataFile>,
    /// O_SYNC/O_DSYNC: writes that go through the daemon are synced before the reply.
    sync: bool,
}

struct DirStream {
    fd: OwnedFd,
    /// The position the kernel will ask for next (the cookie of the front entry).
    pos: u64,
    pending: dirs::Pending,
    /// The backing stream gave nothing the last time it was read: nothing to read ahead.
    at_end: bool,
    buf: Box<[MaybeUninit<u8>]>,
    /// The subdirectories handed so far (node id and name), for the walk-ahead once
    /// the listing ends (`fs/ahead.rs`).
    subdirs: Vec<(u64, Vec<u8>)>,
    /// Entries of a walk's listing on a network share looked up past what the last
    /// chunk had room for (`dirs.rs` [`dirs::NETWORK_LOOK_AHEAD`]), for the next chunk:
    /// `(cookie, lookup)`, no lookup for a probe. Each lookup is counted; what the
    /// listing does not hand over is forgotten when it moves elsewhere or ends.
    looked: std::collections::VecDeque<(u64, Option<FsResult<Attr>>)>,
    /// Whether the listing is past its first entry but `.` and `..` (handed, or the
    /// listing started midway): the first is a probe in a listing of names
    /// (`listing.rs`).
    past_first: bool,
}

/// An open directory.
struct DirHandle {
    /// The node id of the directory: outside the stream's lock, so that a journal
    /// compaction (which holds the inode table's lock) never waits for a listing
    /// (which holds the stream while it looks entries up in the table).
    ino: u64,
    /// Listings that asked for the stream and do not hold it yet: reading ahead gives
    /// way to them (`dirs.rs`).
    asked: AtomicUsize,
    stream: Mutex<DirStream>,
}

enum Handle {
    File(OpenFile),
    Dir(Arc<DirHandle>),
}

/// One group view over one backing directory: its settings, what it knows of the
/// share, its tables (inodes, handles, descriptors, the journal) and the subsystems that
/// serve listings.
pub struct ViewFs {
    cfg: state::Settings,
    share: state::Backing,
    warned: state::Warned,
    inodes: InodeTable,
    handles: DashMap<u64, Handle>,
    next_fh: AtomicU64,
    /// Where `delete_pends`: held for reading while an open makes a file's shared
    /// descriptor, and for writing while a removal (or a rename onto a name) decides
    /// whether the view holds the file open and is made. A file removed an instant
    /// after the view opened it, but before the kernel's own passthrough open of it
    /// (fs/fuse/passthrough.c `fuse_passthrough_open`, which opens it again, by name on
    /// the SMB client), is "delete pending" on the server, which refuses that open, and
    /// the kernel fails the caller's open with `EIO` (fs/fuse/iomode.c
    /// `fuse_file_io_open`). With the lock the removal sees the file held and moves it
    /// aside instead ([`OpenHold::remove_when_let_go`]).
    removal: RwLock<()>,
    /// Where changes to the handles are journaled, when a keeper holds the view
    /// (`fs/journal.rs`).
    journal: super::journal::JournalSlot,
    /// How many of the view's shared descriptors live: see `namespace.rs`, `held_child`.
    live_files: LiveFiles,
    /// What decides whether a listing carries attributes.
    listing: super::listing::ListingHints,
    /// The names of directories on an SMB share that answer lookups of absent names
    /// (`fs/names.rs`).
    names: super::names::HeldNames<Inode>,
    /// What warms the caches for the directories a walk lists next.
    ahead: super::ahead::WalkAhead,
    /// Bytes of directory entries read and not yet handed to the kernel, over all open
    /// directories (`dirs::Pending`).
    pending_dir_bytes: Arc<AtomicUsize>,
    /// The threads those lookups run on (`dirs.rs`).
    helpers: dirs::Helpers,
}

const DIR_BUF: usize = 32 * 1024;

/// How far [`ViewFs::records_absent`] counts either way: after a tree of entries made
/// around the driver, this many first reads that find records turn the view back to
/// reading first.
const RECORDS_ABSENT_SPAN: i32 = 16;

fn cstring(name: &OsStr) -> FsResult<CString> {
    CString::new(name.as_bytes()).map_err(|_| FsError::Os(Errno::EINVAL))
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
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
        let share = state::Backing::probe(root.as_fd(), &st);
        let cfg = state::Settings::new(options, &share);
        if share.delete_pends && !options.entry_timeout.is_zero() {
            tracing::info!(
                entry_timeout = options.entry_timeout.as_secs_f64(),
                "the source is on the kernel's SMB client: a lookup of a name absent from the view's last listing of its directory (or from a directory the view made) is answered without the server, as the kernel's negative entries are, until entry_timeout after that listing began; a name made around the view may stay unseen that long (entry_timeout=0 asks the server every time)"
            );
        }
        let nofile = crate::sys::process::nofile_limit();
        Ok(ViewFs {
            removal: RwLock::new(()),
            // Half the open-file limit for cached inode descriptors, an eighth for
            // entries opened ahead of a walk; the rest is for open files and
            // directories.
            inodes: InodeTable::new(root, &st, (nofile / 2).clamp(64, 65_536) as usize),
            handles: DashMap::new(),
            next_fh: AtomicU64::new(1),
            journal: Default::default(),
            live_files: LiveFiles::default(),
            listing: super::listing::ListingHints::default(),
            names: super::names::HeldNames::new(if share.delete_pends {
                options.entry_timeout
            } else {
                std::time::Duration::ZERO
            }),
            ahead: super::ahead::WalkAhead::new(
                st.mnt_id,
                (nofile / 8).min(super::ahead::MAX_OPENED as u64) as usize,
                options.entry_timeout,
            ),
            pending_dir_bytes: Arc::default(),
            helpers: dirs::Helpers::default(),
            cfg,
            share,
            warned: state::Warned::default(),
        })
    }

    /// Applies the view's `noatime`/`nodiratime` to a descriptor it reads through.
    pub(super) fn no_atime(&self, fd: &OwnedFd, kind: Kind) {
        let wanted = if kind == Kind::Directory {
            self.cfg.noatime.1
        } else {
            self.cfg.noatime.0
        };
        if wanted {
            if let Err(e) = file::set_noatime(fd.as_fd()) {
                tracing::debug!(error = %e, "O_NOATIME refused; reads update the access time");
            }
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.cfg.policy
    }

    /// How many inodes the kernel holds references to (the root included).
    pub fn inode_count(&self) -> usize {
        self.inodes.len()
    }

    /// How many file and directory handles are open.
    pub fn handle_count(&self) -> usize {
        self.handles.len()
    }

    pub(super) fn writable(&self) -> FsResult<()> {
        if self.cfg.readonly {
            Err(FsError::ReadOnly)
        } else {
            Ok(())
        }
    }

    pub(super) fn dir(&self, ino: u64) -> FsResult<Arc<Inode>> {
        let inode = self.inodes.get(ino)?;
        if inode.kind != Kind::Directory {
            return Err(FsError::Os(Errno::ENOTDIR));
        }
        Ok(inode)
    }
}

/// A request the kernel sent again (`FUSE_NOTIFY_RESEND`, `resent`) because the
/// process that read it first died before answering. That process may have carried it
/// out: then the result that only says so (`already`: the name exists, or is gone) is
/// answered as the success it was, with `then`. Another process changing the same
/// name in the same instant would get a success instead of that error: the price of
/// not failing every operation a crash interrupted (docs/OPERATIONS.md).
pub fn redo_as_done<T>(
    resent: bool,
    r: FsResult<T>,
    already: i32,
    then: impl FnOnce() -> FsResult<T>,
) -> FsResult<T> {
    match r {
        Err(e) if resent && e.errno() == already => {
            tracing::info!(
                errno = %Errno(already).name(),
                "a resent request was carried out before its first server died"
            );
            then()
        }
        r => r,
    }
}

#[cfg(test)]
mod fixtures;
