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
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use dashmap::DashMap;

use crate::config::ViewOptions;
use crate::sys::Errno;
use crate::sys::file::{self, Access, Flush, FsStat, Kind, Remove, SetTime, Stat, Time};
use crate::sys::handle::FileHandle;

use crate::sys::{dir, xattr};

use super::error::{FsError, FsResult};
use super::inode::{DataFile, Inode, InodeKey, InodeTable, LiveFiles, RecordSeen};
use super::record::{self, RECORD_XATTR, Record};
use super::view::{self, Caller, Creator, Owner, OwnerChange, Policy};

mod dirs;
mod handles;
pub mod namespace;

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

/// One group view over one backing directory.
pub struct ViewFs {
    policy: Policy,
    /// The xattr that holds records (`ownership=emulate`: `trusted.`,
    /// `ownership=emulate-user`: `user.`).
    record_xattr: &'static std::ffi::CStr,
    readonly: bool,
    inodes: InodeTable,
    root_mnt: Option<u64>,
    handles: DashMap<u64, Handle>,
    next_fh: AtomicU64,
    warned_bad_record: AtomicBool,
    /// Whether the kernel checks permissions (`default_permissions`); not under CIFS
    /// `noperm`, where everything is allowed, nor where the share checks them.
    checks_access: bool,
    /// Set once the backing file system answered `RENAME_NOREPLACE` with `EINVAL`.
    noreplace_missing: AtomicBool,
    /// The backing file system cannot make unnamed files (`O_TMPFILE`): new files are
    /// staged under a reserved name instead.
    tmpfile_missing: AtomicBool,
    /// The daemon's effective uid and gid (what a new entry gets before it is given
    /// to its caller), read once rather than on every create.
    daemon_ids: (u32, u32),
    /// `ownership=share`: each request's calls on the share are made as its caller
    /// ([`ViewFs::act_for`]).
    acts_as_callers: bool,
    /// The share checks every permission, the kernel's none ([`ViewFs::share_checks`]).
    share_checks: bool,
    /// How long the kernel keeps attributes the view answers (`attr_timeout=`).
    attr_timeout: std::time::Duration,
    /// Whether a caller this process cannot see has been said to act without its
    /// groups.
    warned_unseen_caller: AtomicBool,
    /// The btrfs quota group of the volume, when the root is a btrfs subvolume:
    /// statfs then reports the volume's limit and usage, not the whole file system.
    qgroup: Option<std::path::PathBuf>,
    /// The root is on CephFS: statfs reports its directory quota, where it has one.
    cephfs: bool,
    /// The root is on NFS, whose client removes a name that a descriptor holds by
    /// renaming it (`.nfsXXXX`) and removing it when the descriptor closes
    /// (fs/nfs/dir.c `nfs_unlink`, `nfs_sillyrename`): three server requests for one.
    /// The view lets go of its own descriptor of what it removes or replaces first.
    silly_renames: bool,
    /// The root is on NFS, where an entry's record is looked for in the list of its
    /// attribute names first when its last read found none: the client keeps the list,
    /// and no answer that a name is absent, so a read found nothing on every lookup of
    /// an entry made around the driver (a server request each), where a list kept
    /// costs none until the file changes. Entries with a record are read at once (the
    /// client keeps the value).
    ///
    /// An entry never read is listed first too while most first reads found no record
    /// ([`ViewFs::records_absent`]): a read of a `user.` name costs the client a
    /// permission check it asks the server for (fs/xattr.c `xattr_permission`) besides
    /// the read, two requests where a list is one; a tree of entries with records is
    /// read at once, where listing first would add one.
    records_listed: bool,
    /// First reads of entries' records: those that found none, less those that found
    /// one, within `±RECORDS_ABSENT_SPAN` (`records_listed` only).
    records_absent: std::sync::atomic::AtomicI32,
    /// The root is on the kernel's SMB client, where removing a name that an open
    /// handle holds only marks the file "delete pending" on the server: the name stays
    /// until the last handle closes, and a create of it fails meanwhile (`ENOENT`).
    /// The view holds a file open until it has answered the kernel's asynchronous
    /// RELEASE, after the caller's `close` returned, so such a name is renamed out of
    /// the way first (`namespace.rs`, `unlink`).
    delete_pends: bool,
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
    /// Whether an open answered with kernel passthrough makes a twin of the file
    /// ([`ViewFs::twin_opens`]).
    twins: AtomicBool,
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
    /// `noatime` (files and directories) and `nodiratime` (directories): the daemon's
    /// own reads and listings leave the backing inodes' access times alone (`O_NOATIME`
    /// on the descriptors it reads through). Passthrough reads do not: the kernel reads
    /// through a backing file it opens with the reader's flags (fs/fuse/passthrough.c
    /// `fuse_passthrough_open`, `backing_file_open`). The backing mount's own atime
    /// rule applies otherwise, so a view cannot be stricter than it.
    noatime: (bool, bool),
    /// Threads a walk's listing spreads its lookups over (`dirs.rs`), and the fewest
    /// lookups worth another one: on a local disk the cores, up to 4; on a network
    /// share (NFS, SMB, CephFS) [`dirs::NETWORK_LOOKUP_THREADS`].
    lookup_threads: usize,
    lookups_per_thread: usize,
    /// The threads those lookups run on (`dirs.rs`).
    helpers: dirs::Helpers,
    /// A network share: a walk's listing looks entries up past the reply's room, for
    /// the chunks to come (`dirs.rs`).
    looks_past_room: bool,
    /// Who serves the I/O of files opened with `O_DIRECT` (`direct_io=`).
    direct_io: crate::config::DirectIo,
}

const DIR_BUF: usize = 32 * 1024;

/// How far [`ViewFs::records_absent`] counts either way: after a tree of entries made
/// around the driver, this many first reads that find records turn the view back to
/// reading first.
const RECORDS_ABSENT_SPAN: i32 = 16;

/// How the records read on this thread were looked for, for tests: `(listed first,
/// read first)`.
#[cfg(test)]
pub(super) mod record_reads {
    use std::cell::Cell;

    thread_local! {
        static COUNT: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
    }

    pub(super) fn note(listed: bool) {
        COUNT.with(|c| {
            let (l, r) = c.get();
            c.set(if listed { (l + 1, r) } else { (l, r + 1) });
        });
    }

    /// The counts so far, set back to zero.
    pub fn take() -> (usize, usize) {
        COUNT.with(|c| c.replace((0, 0)))
    }
}

fn cstring(name: &OsStr) -> FsResult<CString> {
    CString::new(name.as_bytes()).map_err(|_| FsError::Os(Errno::EINVAL))
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
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
        let cephfs = file::is_cephfs(root.as_fd());
        let nfs = file::is_nfs(root.as_fd());
        let delete_pends = file::is_smb(root.as_fd());
        let network = nfs || delete_pends || cephfs;
        let acts_as_callers = options.ownership == crate::config::Ownership::Share;
        let share_checks = acts_as_callers && nfs;
        if delete_pends && !options.entry_timeout.is_zero() {
            tracing::info!(
                entry_timeout = options.entry_timeout.as_secs_f64(),
                "the source is on the kernel's SMB client: a lookup of a name absent from the view's last listing of its directory (or from a directory the view made) is answered without the server, as the kernel's negative entries are, until entry_timeout after that listing began; a name made around the view may stay unseen that long (entry_timeout=0 asks the server every time)"
            );
        }
        Ok(ViewFs {
            qgroup,
            cephfs,
            silly_renames: nfs,
            records_listed: nfs,
            records_absent: Default::default(),
            delete_pends,
            removal: RwLock::new(()),
            twins: AtomicBool::new(false),
            policy: Policy::from_options(options),
            record_xattr: record::record_xattr(options.ownership).unwrap_or(RECORD_XATTR),
            readonly: options.readonly,
            root_mnt: st.mnt_id,
            // Half the open-file limit for cached inode descriptors, an eighth for
            // entries opened ahead of a walk; the rest is for open files and
            // directories.
            inodes: InodeTable::new(
                root,
                &st,
                (crate::sys::process::nofile_limit() / 2).clamp(64, 65_536) as usize,
            ),
            handles: DashMap::new(),
            next_fh: AtomicU64::new(1),
            warned_bad_record: AtomicBool::new(false),
            checks_access: options.kernel_permission_checks() && !share_checks,
            noreplace_missing: AtomicBool::new(false),
            tmpfile_missing: AtomicBool::new(false),
            daemon_ids: crate::sys::process::effective_ids(),
            acts_as_callers,
            share_checks,
            attr_timeout: options.attr_timeout,
            warned_unseen_caller: AtomicBool::new(false),
            journal: Default::default(),
            live_files: LiveFiles::default(),
            listing: super::listing::ListingHints::default(),
            names: super::names::HeldNames::new(if delete_pends {
                options.entry_timeout
            } else {
                std::time::Duration::ZERO
            }),
            ahead: super::ahead::WalkAhead::new(
                st.mnt_id,
                (crate::sys::process::nofile_limit() / 8).min(super::ahead::MAX_OPENED as u64)
                    as usize,
                options.entry_timeout,
            ),
            pending_dir_bytes: Arc::default(),
            lookup_threads: if network {
                dirs::NETWORK_LOOKUP_THREADS
            } else {
                std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
            },
            helpers: dirs::Helpers::default(),
            lookups_per_thread: if network {
                dirs::NETWORK_LOOKUPS_PER_THREAD
            } else {
                dirs::LOOKUPS_PER_THREAD
            },
            looks_past_room: network,
            direct_io: options.direct_io,
            noatime: (
                options.vfs.atime == crate::config::Atime::Never,
                options.vfs.atime == crate::config::Atime::Never || options.vfs.nodiratime,
            ),
        })
    }

    /// Whether the view acts as each caller on its share (`ownership=share`).
    pub fn acts_as_callers(&self) -> bool {
        self.acts_as_callers
    }

    /// Whether the share, not the kernel, checks every permission of this view's
    /// callers: a view that acts as its callers on the kernel's NFS client, which asks
    /// the server for each caller whatever the caller's capabilities
    /// (fs/nfs/dir.c `nfs_permission`: the `ACCESS` cache, no `capable()`), as the
    /// server checks each request. The view is then mounted without
    /// `default_permissions`, and the kernel keeps no name in a directory that not
    /// every caller may search ([`ViewFs::searchable_by_all`]): each name there is
    /// looked up by the view as its caller, so the client checks that the caller may
    /// search the directory, as the raw mount's path walk does, where the kernel's
    /// cached names would skip the check. What that spares: the
    /// kernel refreshes the attributes it checks whenever they expired
    /// (fs/fuse/dir.c `fuse_permission`), and FUSE's lookup says nothing of what it is
    /// for, so an open through the view asked the server for the file's attributes
    /// that the raw mount's `OPEN` brings (fs/nfs/dir.c `nfs_lookup_verify_inode`); a
    /// lookup now answers with the client's cached attributes, kept no longer than the
    /// view's last fresh read of them would be ([`ViewFs::lookup_for_kernel`]), and a
    /// stat asks the client afresh after that (docs/ARCHITECTURE.md, *Permissions on
    /// NFS*).
    pub fn share_checks(&self) -> bool {
        self.share_checks
    }

    /// Whether the kernel checks permissions (the mount's `default_permissions`): not
    /// under CIFS `noperm`, nor where the share checks them ([`ViewFs::share_checks`]).
    pub fn kernel_checks(&self) -> bool {
        self.checks_access
    }

    /// Whether every caller may search the directory `dir` by its mode (execute for
    /// owner, group and others), as the share's client has it: its mode only, which
    /// the client asks its server for when its own permission check would (its
    /// attribute timeout for the directory, or a change it was told of:
    /// [`file::kind_and_perm`]), so that a mode another node changed reaches the view
    /// when it reaches the raw mount's path walks, and the view's own creates and
    /// removals in the directory cost no request for it. The names in such a
    /// directory the kernel may keep, since any caller's lookup of them would pass
    /// the search check. `false` for what cannot be read.
    pub fn searchable_by_all(&self, dir: u64) -> bool {
        let Ok(inode) = self.inodes.get(dir) else {
            return false;
        };
        let Ok(fd) = inode.fd() else {
            return false;
        };
        file::kind_and_perm(fd.as_fd())
            .is_ok_and(|(kind, perm)| kind == Kind::Directory && perm & 0o111 == 0o111)
    }

    /// Makes the calling worker thread act as the caller of a request on the share
    /// until the returned guard is dropped, where the view acts as its callers: the
    /// request's uid (its file-system uid); its groups from `/proc` (FUSE sends none),
    /// with the pod's group swapped for the volume's own on disk, as the view shows
    /// one as the other; and as file-system gid the volume's own group where the
    /// caller is in the pod's, else its own (swapped the same). The gid is what a
    /// server that looks a uid's groups up itself keeps of the caller's (knfsd's
    /// `manage-gids`, Debian's default): so a member of the pod's group reaches the
    /// volume's files on any server. A caller whose groups cannot be read (gone, or
    /// in a pid namespace the view cannot see) acts with none: fail closed.
    ///
    /// # Errors
    /// `EOVERFLOW` for a request without ids (an idmapped mount's, which a view that
    /// acts as its callers does not allow), or the error of setting the thread's
    /// credentials.
    pub fn act_for(
        &self,
        uid: u32,
        gid: u32,
        pid: u32,
    ) -> FsResult<Option<crate::sys::creds::Acting>> {
        if !self.acts_as_callers {
            return Ok(None);
        }
        if uid == u32::MAX || gid == u32::MAX {
            return Err(FsError::Os(Errno(libc::EOVERFLOW)));
        }
        let groups = match pid {
            // A request the kernel sends without credentials (RELEASE) has none at all.
            0 if (uid, gid) == (0, 0) => Vec::new(),
            0 => {
                if !self.warned_unseen_caller.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        uid,
                        gid,
                        "a caller in a pid namespace this view cannot see acts on the share without its supplementary groups, so its groups' permissions fail there: run the view in the host's pid namespace (the node plugin has hostPID: true, deploy/node.yaml)"
                    );
                }
                Vec::new()
            }
            // A thread gone meanwhile: its request no longer matters.
            pid => crate::sys::creds::groups_of(pid).unwrap_or_default(),
        };
        let (fsgid, groups) = self.caller_ids(gid, groups);
        if (uid, fsgid) == self.daemon_ids && groups.is_empty() {
            return Ok(None);
        }
        Ok(Some(crate::sys::creds::act_as(uid, fsgid, &groups)?))
    }

    /// The file-system gid and groups a caller with `gid` and `groups` acts with on
    /// the share ([`ViewFs::act_for`]).
    fn caller_ids(&self, gid: u32, mut groups: Vec<u32>) -> (u32, Vec<u32>) {
        let Policy::Plain { gids, .. } = self.policy else {
            return (gid, groups);
        };
        let in_pod_group = self
            .policy
            .group()
            .is_some_and(|g| gid == g || groups.contains(&g));
        for g in &mut groups {
            *g = gids.disk(*g);
        }
        let own = gids.disk(gid);
        let fsgid = match (in_pod_group, self.policy.group()) {
            (true, Some(shown)) => gids.disk(shown),
            _ => own,
        };
        // Its own group stays one of its groups where the volume's takes its place.
        if own != fsgid && !groups.contains(&own) {
            groups.push(own);
        }
        (fsgid, groups)
    }

    /// What `/proc` says of `caller`'s credentials, which FUSE does not send (`None`
    /// for a caller in another pid namespace, pid 0, or one that cannot be read: every
    /// decision about it fails closed).
    pub(super) fn credentials(caller: Caller) -> Option<crate::sys::process::TaskCredentials> {
        crate::sys::process::task_credentials(caller.pid).ok()
    }

    /// Applies the view's `noatime`/`nodiratime` to a descriptor it reads through.
    pub(super) fn no_atime(&self, fd: &OwnedFd, kind: Kind) {
        let wanted = if kind == Kind::Directory {
            self.noatime.1
        } else {
            self.noatime.0
        };
        if wanted {
            if let Err(e) = file::set_noatime(fd.as_fd()) {
                tracing::debug!(error = %e, "O_NOATIME refused; reads update the access time");
            }
        }
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

    pub(super) fn writable(&self) -> FsResult<()> {
        if self.readonly {
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

    /// The record of the entry `fd` of `kind`, where it can hold one.
    pub(super) fn read_record(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        kind: Kind,
    ) -> FsResult<Option<Record>> {
        if !record::holds(self.record_xattr, kind) {
            return Ok(None);
        }
        match xattr::get(fd, self.record_xattr) {
            Ok(None) => Ok(None),
            Ok(Some(bytes)) => match Record::decode(&bytes) {
                Ok(r) => Ok(Some(r)),
                Err(why) => {
                    if !self.warned_bad_record.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            why,
                            "an ownership record this version cannot read: the entry is shown with mode 0 until root sets its mode again"
                        );
                    }
                    // Fail closed: the record may have narrowed access (a chmod 600),
                    // and the derived attributes would widen it again.
                    Ok(Some(Record::unreadable()))
                }
            },
            // Some inode kinds on some file systems take no xattrs at all.
            Err(Errno::EOPNOTSUPP) => Ok(None),
            // A `user.` record needs read permission (fs/xattr.c), which a daemon that
            // the server squashes lacks on an entry made around the driver: the daemon
            // could never have written a record there either.
            Err(Errno::EACCES) if self.record_xattr == record::USER_RECORD_XATTR => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes (or, empty, removes) the record of the entry `fd` of `kind`.
    ///
    /// # Errors
    /// `EPERM` where the entry cannot hold a record (no `user.` attributes on a
    /// symlink; a daemon the server squashes, on an entry made around the driver),
    /// else what `setxattr` said.
    pub(super) fn write_record(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        kind: Kind,
        rec: &Record,
    ) -> FsResult<()> {
        if !record::holds(self.record_xattr, kind) {
            return Err(FsError::NotPermitted);
        }
        let done = if rec.is_empty() {
            match xattr::remove(fd, self.record_xattr) {
                Ok(()) | Err(Errno::ENODATA) => Ok(()),
                Err(e) => Err(e),
            }
        } else {
            xattr::set(fd, self.record_xattr, &rec.encode(), 0)
        };
        match done {
            Err(Errno::EACCES) => Err(FsError::NotPermitted),
            other => Ok(other?),
        }
    }

    pub(super) fn record_for(&self, inode: &Arc<Inode>) -> FsResult<Option<Record>> {
        if !self.policy.reads_record(inode.kind) {
            return Ok(None);
        }
        let fd = inode.fd()?;
        if !self.records_listed {
            return self.read_record(fd.as_fd(), inode.kind);
        }
        let seen = inode.record_seen.get();
        let list_first = match seen {
            RecordSeen::Absent => true,
            RecordSeen::Unread => self.records_absent.load(Ordering::Relaxed) > 0,
            RecordSeen::Present => false,
        };
        #[cfg(test)]
        record_reads::note(list_first);
        let rec = if list_first
            && record::holds(self.record_xattr, inode.kind)
            && xattr::has(fd.as_fd(), self.record_xattr) == Ok(false)
        {
            None
        } else {
            self.read_record(fd.as_fd(), inode.kind)?
        };
        if seen == RecordSeen::Unread {
            let step = if rec.is_none() { 1 } else { -1 };
            let _ = self
                .records_absent
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    Some((n + step).clamp(-RECORDS_ABSENT_SPAN, RECORDS_ABSENT_SPAN))
                });
        }
        inode.record_seen.set(if rec.is_none() {
            RecordSeen::Absent
        } else {
            RecordSeen::Present
        });
        Ok(rec)
    }

    pub(super) fn attr(&self, inode: &Arc<Inode>, st: &Stat) -> FsResult<Attr> {
        let rec = self.record_for(inode)?;
        Ok(self.attr_with(inode, st, rec.as_ref()))
    }

    /// [`ViewFs::attr`] with the record already read.
    pub(super) fn attr_with(&self, inode: &Inode, st: &Stat, rec: Option<&Record>) -> Attr {
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

    pub(super) fn shown(&self, inode: &Arc<Inode>) -> FsResult<Owner> {
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
    /// On an SMB share a name the directory's held names lack is answered absent
    /// without asking the share (`fs/names.rs`).
    ///
    /// # Errors
    /// `ENOENT` when absent ([`FsError::Absent`] when held names say so), `ENOTDIR`
    /// when `parent` is not a directory.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> FsResult<Attr> {
        self.lookup_cached(parent, name, false)
            .map(|(attr, _)| attr)
    }

    /// The kernel's lookup: [`ViewFs::lookup`], where the share checks permissions
    /// ([`ViewFs::share_checks`]) and the kernel holds the name already, with the
    /// attributes its client has cached, which a lookup for an open does not need (its
    /// `OPEN` brings them) and a stat asks for afresh; and, for those, how long the
    /// kernel may keep them: what is left of the attribute timeout since the view last
    /// read them afresh (they are at least as new), else nothing. `None`: read
    /// afresh, kept for the attribute timeout.
    ///
    /// # Errors
    /// As [`ViewFs::lookup`].
    pub fn lookup_for_kernel(
        &self,
        parent: u64,
        name: &OsStr,
    ) -> FsResult<(Attr, Option<std::time::Duration>)> {
        self.lookup_cached(parent, name, self.share_checks)
    }

    fn lookup_cached(
        &self,
        parent: u64,
        name: &OsStr,
        cached: bool,
    ) -> FsResult<(Attr, Option<std::time::Duration>)> {
        let held = if self.names.on() {
            let p = self.dir(parent)?;
            if let Some(left) = self.names.absent(parent, &p, name.as_bytes()) {
                return Err(FsError::Absent(left));
            }
            Some(p)
        } else {
            None
        };
        let found = self.find(parent, name, cached);
        if let (Err(FsError::Os(Errno::ENOENT)), Some(p)) = (&found, held) {
            if self.names.missed(parent, &p) {
                self.hold_names(parent, &p);
            }
        }
        let was_held = matches!(found, Ok((_, true, _)));
        self.listing.looked_up(parent, name.as_bytes(), was_held);
        if let Ok((a, _, _)) = &found {
            if a.kind == Kind::Directory {
                self.listing.reached(parent, a.ino);
            }
        }
        found.map(|(attr, _, keep)| (attr, keep))
    }

    /// Lists directory `p` (number `ino`) for its held names (`fs/names.rs`): every
    /// name, or none past [`super::names::MAX_NAMES`].
    fn hold_names(&self, ino: u64, p: &Arc<Inode>) {
        use super::names::{Listed, MAX_NAMES};
        let Some(began) = self.names.listing(ino, p) else {
            return;
        };
        let list = || -> FsResult<Listed> {
            let path_fd = p.fd()?;
            let fd = self
                .inodes
                .with_fds(|| file::reopen(path_fd.as_fd(), Kind::Directory, Access::Directory))?;
            self.no_atime(&fd, Kind::Directory);
            let mut buf = vec![MaybeUninit::uninit(); DIR_BUF];
            let mut names = Vec::new();
            loop {
                let batch = dir::read_batch(fd.as_fd(), &mut buf)?;
                if batch.is_empty() {
                    return Ok(Listed::Names(names));
                }
                names.extend(batch.into_iter().map(|e| e.name));
                if names.len() > MAX_NAMES + 2 {
                    return Ok(Listed::TooMany);
                }
            }
        };
        let listed = list().unwrap_or_else(|e| {
            tracing::debug!(ino, error = %e, "listing a directory for its names failed");
            Listed::Failed
        });
        self.names.listed(ino, p, began, listed);
    }

    /// [`ViewFs::lookup`] made by the view itself (a listing's attributes).
    pub(super) fn lookup_entry(&self, parent: u64, name: &OsStr) -> FsResult<Attr> {
        self.find(parent, name, false).map(|(attr, _, _)| attr)
    }

    /// A lookup: the attributes, whether the kernel held the inode already (a
    /// revalidation, most often), and, where `cached` asks for the attributes the
    /// file system has cached, how long they may be kept ([`ViewFs::lookup_for_kernel`]).
    fn find(
        &self,
        parent: u64,
        name: &OsStr,
        cached: bool,
    ) -> FsResult<(Attr, bool, Option<std::time::Duration>)> {
        if namespace::is_reserved_name(name.as_bytes()) {
            return Err(FsError::Os(Errno::ENOENT));
        }
        let p = self.dir(parent)?;
        let pfd = p.fd()?;
        if let Some((opened, st)) = self.ahead.claim(parent, pfd.as_fd(), name.as_bytes()) {
            return self
                .register_stat(opened.fd, &st, opened.handle, true)
                .map(|(attr, held, _)| (attr, held, None));
        }
        let fd = match self
            .inodes
            .with_fds(|| file::open_child(pfd.as_fd(), name, self.root_mnt))
        {
            Ok(fd) => fd,
            Err(Errno::EXDEV) => return Err(FsError::Os(Errno::ENOENT)),
            Err(e) => return Err(e.into()),
        };
        let handle = self.inodes.handle_of(fd.as_fd());
        // A name new to the kernel (its first lookup, or its first since the kernel
        // let the inode go) is read afresh: the client's own lookup of it has most
        // often just brought its attributes, which costs no request, and the kernel
        // may then keep them, where a stat would ask again at once. A revalidation
        // (an open's lookup of a name the kernel holds, most often) asks nothing.
        let held_st = if cached {
            Some(file::stat_cached(fd.as_fd())?).filter(|st| self.inodes.has(st, handle.as_ref()))
        } else {
            None
        };
        let Some(st) = held_st else {
            let st = file::stat(fd.as_fd())?;
            return self
                .register_stat(fd, &st, handle, true)
                .map(|(attr, held, _)| (attr, held, None));
        };
        let (attr, held, age) = self.register_stat(fd, &st, handle, false)?;
        // As new as the view's last fresh read of them, or a warming's open of the
        // directory, whichever came later.
        let warmed = self.ahead.warmed_age(attr.ino, st.dev, st.ino);
        let age = match (age, warmed) {
            (Some(a), Some(w)) => Some(a.min(w)),
            (a, w) => a.or(w),
        };
        let left = age.map_or(std::time::Duration::ZERO, |age| {
            self.attr_timeout.saturating_sub(age)
        });
        Ok((attr, held, Some(left)))
    }

    pub(super) fn register(&self, fd: OwnedFd) -> FsResult<Attr> {
        let st = file::stat(fd.as_fd())?;
        let handle = self.inodes.handle_of(fd.as_fd());
        self.register_stat(fd, &st, handle, true)
            .map(|(attr, _, _)| attr)
    }

    /// [`ViewFs::register`] with the inode's attributes and handle read already,
    /// afresh (`synced`) or from the file system's cache; and whether the kernel held
    /// the inode already, and how long ago the view last read them afresh.
    fn register_stat(
        &self,
        fd: OwnedFd,
        st: &file::Stat,
        handle: Option<FileHandle>,
        synced: bool,
    ) -> FsResult<(Attr, bool, Option<std::time::Duration>)> {
        let inode = self.inodes.lookup_handled(fd, st, handle);
        if synced {
            inode.synced.mark();
        }
        let held = inode.lookups() > 1;
        match self.attr(&inode, st) {
            Ok(a) => Ok((a, held, inode.synced.age())),
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
        inode.synced.mark();
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
                    let fd = file::reopen(inode.fd()?.as_fd(), inode.kind, Access::ReadWrite)?;
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
        if let Some(perm) = change.perm {
            if self.policy.refuses_set_id(inode.kind, perm) {
                return Err(FsError::NotPermitted);
            }
        }
        if !change.is_empty() {
            if let Policy::Plain { gids, .. } = self.policy {
                if change.uid.is_some() || change.gid.is_some() {
                    let gid = change.gid.map(|g| gids.disk(g));
                    file::chown(inode.fd()?.as_fd(), change.uid, gid)?;
                }
                if let Some(perm) = change.perm {
                    if inode.kind != Kind::Symlink {
                        file::chmod(inode.fd()?.as_fd(), perm)?;
                    }
                }
            } else {
                let current = self.record_for(&inode)?;
                let mut change = change;
                if (change.uid.is_some() || change.gid.is_some()) && change.perm.is_none() {
                    // A chown or chgrp of a non-directory clears set-id bits, for root
                    // too; the kernel leaves that to the server under
                    // FUSE_HANDLE_KILLPRIV_V2 (the disk does it in a plain view).
                    // The record is read already: only the disk's mode is missing.
                    let st = file::stat(inode.fd()?.as_fd())?;
                    let shown = self.attr_with(&inode, &st, current.as_ref());
                    let kept = view::perm_after_chown(inode.kind, shown.perm);
                    if kept != shown.perm {
                        change.perm = Some(kept);
                    }
                }
                if let Some(new) = view::changed_record(&self.policy, inode.kind, current, change) {
                    self.write_record(inode.fd()?.as_fd(), inode.kind, &new)?;
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

    /// File system statistics of the backing tree; on a btrfs subvolume with a quota
    /// limit, or a CephFS directory with a quota, the volume's capacity and usage (read
    /// on every call, so an expansion of the live volume shows at once).
    ///
    /// # Errors
    /// The error of `statvfs`.
    pub fn statfs(&self) -> FsResult<FsStat> {
        let root = self.inodes.root().fd()?;
        let mut st = file::statvfs(root.as_fd())?;
        // The volume's quota, as its limit and the bytes it holds.
        let quota = if let Some(dir) = &self.qgroup {
            crate::sys::btrfs::qgroup_usage(dir)
                .map(|q| q.limit.map(|limit| (limit, q.used)))
                .map_err(|e| e.to_string())
        } else if self.cephfs {
            crate::sys::cephfs::ceph_quota(root.as_fd()).map_err(|e| e.to_string())
        } else {
            Ok(None)
        };
        match quota {
            Ok(Some((limit, used))) => {
                let unit = u64::from(st.frsize.max(1));
                st.blocks = limit / unit;
                st.bfree = limit.saturating_sub(used) / unit;
                st.bavail = st.bfree;
            }
            Ok(None) => {}
            Err(error) => {
                tracing::debug!(%error, "the volume's quota is unreadable; whole file system reported")
            }
        }
        Ok(st)
    }

    /// `access(2)` (and `chdir(2)`'s check) when the kernel does not check permissions
    /// itself. Under CIFS `noperm` everything is allowed; where the share checks
    /// ([`ViewFs::share_checks`]), the share's answer for the caller, whose
    /// credentials the worker acts with.
    ///
    /// # Errors
    /// `EROFS` for `W_OK` on a read-only view; where the share checks, what it
    /// answers (`EACCES`).
    pub fn access(&self, ino: u64, mask: i32) -> FsResult<()> {
        let inode = self.inodes.get(ino)?;
        if mask & libc::W_OK != 0 {
            self.writable()?;
        }
        if self.share_checks {
            file::may(inode.fd()?.as_fd(), mask)?;
        }
        Ok(())
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

    /// [`view`] with a network share's lookups: spread over its threads, looked up
    /// past a reply's room.
    fn network_view(dir: &std::path::Path, options: &str) -> ViewFs {
        let mut v = view(dir, options);
        v.looks_past_room = true;
        v.lookup_threads = dirs::NETWORK_LOOKUP_THREADS;
        v.lookups_per_thread = dirs::NETWORK_LOOKUPS_PER_THREAD;
        v
    }

    /// What a view that acts as its callers acts with: the pod's group swapped for the
    /// volume's, which is also the file-system gid of a caller in the pod's group,
    /// whose own group stays among its groups; others as they are.
    #[test]
    fn a_caller_acts_with_the_volumes_group_in_place_of_the_pods() {
        let dir = tempfile::tempdir().unwrap();
        let v = view(
            dir.path(),
            "mode=native,gid=4242,disk_gid=5000,ownership=share",
        );
        assert!(v.acts_as_callers());
        assert_eq!(v.caller_ids(1000, vec![4242]), (5000, vec![5000, 1000]));
        assert_eq!(v.caller_ids(4242, vec![]), (5000, vec![]));
        assert_eq!(v.caller_ids(1000, vec![1000, 7]), (1000, vec![1000, 7]));
        let plain = view(dir.path(), "ownership=share");
        assert_eq!(plain.caller_ids(1000, vec![4242]), (1000, vec![4242]));
        // Not acting: nothing is set.
        let other = view(dir.path(), "gid=4242");
        assert!(other.act_for(1000, 1000, 0).unwrap().is_none());
        // A request without ids (an idmapped mount's) is refused.
        assert_eq!(
            v.act_for(u32::MAX, u32::MAX, 0).err().map(|e| e.errno()),
            Some(libc::EOVERFLOW)
        );
    }

    /// A directory holding `n` small files named `f0` to `f{n-1}`.
    fn populated(n: usize) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..n {
            std::fs::write(dir.path().join(format!("f{i}")), "x").unwrap();
        }
        dir
    }

    const ROOT: u64 = 1;
    const ME: Creator = Creator {
        uid: 1000,
        gid: 1000,
        pid: 0,
    };

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

    /// The keeper's side of a view's journal: a descriptor of the one it was last
    /// handed.
    #[derive(Default)]
    struct HeldJournal(Mutex<Option<OwnedFd>>);

    impl HeldJournal {
        /// Starts `v`'s journal (or compacts it into a new one) and holds the new one.
        fn take(&self, v: &ViewFs) {
            v.journal_to(Default::default(), |j| {
                *lock(&self.0) = Some(rustix::io::dup(j.fd())?);
                Ok(())
            })
            .unwrap();
        }

        /// What a recovering view would replay from it.
        fn replay(&self) -> super::super::journal::Replayed {
            super::super::journal::Replayed::read(lock(&self.0).as_ref().unwrap()).unwrap()
        }
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
        use super::super::snapshot::Passthrough;
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

    /// Where the kernel's passthrough open takes an open handle with the same access
    /// (the SMB client: twins), a reader's shared descriptor is read-only, which the
    /// server opens once for the reader's open; a writer that comes while it is open
    /// gets a read-write one beside it, which names the same registration (the kernel
    /// binds one backing file to an inode while any of its opens is: another id fails
    /// the writer's open). Journaled for both, and closed with the last of them.
    /// A view with twins (as on SMB) and its journal, where a reader opened `f0` and
    /// registered it as id 7 (on a stand-in device: the ids are only journaled, and
    /// closing one fails), then a writer opened it and got the same registration.
    struct ReaderThenWriter {
        _dir: tempfile::TempDir,
        v: ViewFs,
        held: HeldJournal,
        ino: u64,
        dev: Arc<OwnedFd>,
        reader: Opened,
        writer: Opened,
    }

    fn reader_then_writer() -> ReaderThenWriter {
        let dir = populated(2);
        let v = view(dir.path(), "gid=5");
        v.twin_opens();
        let held = HeldJournal::default();
        held.take(&v);
        let ino = v.lookup(ROOT, OsStr::new("f0")).unwrap().ino;
        let dev = Arc::new(OwnedFd::from(std::fs::File::open("/dev/null").unwrap()));
        let reader = v.open(ino, libc::O_RDONLY, ME.into()).unwrap();
        assert!(!reader.data.writable, "a reader's descriptor is read-only");
        let made = crate::sys::fuse::Backing::adopt(&dev, 7);
        assert_eq!(v.registration(ino, &reader.data, || Some(made)), Some(7));
        let writer = v
            .open(ino, libc::O_WRONLY, ME.into())
            .expect("a writer opens while a reader holds the file");
        assert!(writer.data.writable);
        let shared = v.registration(ino, &writer.data, || panic!("registered anew"));
        assert_eq!(shared, Some(7));
        ReaderThenWriter {
            _dir: dir,
            v,
            held,
            ino,
            dev,
            reader,
            writer,
        }
    }

    #[test]
    fn a_writer_after_a_reader_shares_its_registration() {
        use super::super::snapshot::Passthrough;
        let ReaderThenWriter {
            _dir,
            v,
            held,
            ino,
            dev,
            reader,
            writer,
        } = reader_then_writer();
        let r = held.replay();
        assert_eq!(r.passthrough_of(ino, false), Passthrough::Id(7));
        assert_eq!(r.passthrough_of(ino, true), Passthrough::Id(7));
        // Readers from now on take the writer's descriptor.
        let later = v.open(ino, libc::O_RDONLY, ME.into()).unwrap();
        assert!(Arc::ptr_eq(&later.data, &writer.data));
        v.release(reader.fh);
        drop(reader);
        assert_eq!(held.replay().passthrough_of(ino, true), Passthrough::Id(7));
        v.release(later.fh);
        v.release(writer.fh);
        drop((later, writer));
        assert_eq!(
            held.replay().passthrough_of(ino, true),
            Passthrough::Untried
        );
        // The next open registers anew.
        let next = v.open(ino, libc::O_RDONLY, ME.into()).unwrap();
        let again = crate::sys::fuse::Backing::adopt(&dev, 8);
        assert_eq!(v.registration(ino, &next.data, || Some(again)), Some(8));
        v.release(next.fh);
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
        let registrations = |v: &ViewFs| -> Vec<*const super::super::inode::Registered> {
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
        use super::super::snapshot::Passthrough;
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
        let dir = populated(10);
        let v = view(dir.path(), "gid=5");
        let fh = v.opendir(ROOT).unwrap();
        let mut seen = Vec::new();
        let mut next_offset = 0;
        v.readdir(
            ROOT,
            fh,
            0,
            Listing::WithAttributes,
            Room::UNBOUNDED,
            |item, next| {
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
            },
        )
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
        v.readdir(
            ROOT,
            fh,
            next_offset,
            Listing::WithAttributes,
            Room::UNBOUNDED,
            |item, _| {
                rest.push(item.name.clone());
                false
            },
        )
        .unwrap();
        assert_eq!(rest.iter().filter(|n| n.starts_with(b"f")).count(), 7);
        assert!(rest.iter().all(|n| !seen.contains(n)));
        v.release(fh);
        assert_eq!(v.handle_count(), 0);
    }

    /// Every entry of `fh` from `offset` that one `readdir` call hands over.
    fn chunk(v: &ViewFs, fh: u64, offset: u64) -> (Vec<Vec<u8>>, u64) {
        let (mut names, mut last) = (Vec::new(), offset);
        v.readdir(
            ROOT,
            fh,
            offset,
            Listing::Names,
            Room::UNBOUNDED,
            |item, next| {
                names.push(item.name.clone());
                last = next;
                false
            },
        )
        .unwrap();
        (names, last)
    }

    /// Asserts that `items` hold the `n` files of [`populated`], each with its
    /// attributes (group 5) and each counted once by the view.
    fn every_file_with_attributes(v: &ViewFs, items: &[DirItem], n: usize) {
        let files: Vec<_> = items.iter().filter(|i| i.name.starts_with(b"f")).collect();
        assert_eq!(files.len(), n);
        assert!(files.iter().all(|i| i.attr.is_some_and(|a| a.gid == 5)));
        assert_eq!(v.inode_count(), 1 + n);
    }

    /// Every entry of `fh` from `offset` to the end, one `readdir` call after another.
    fn rest(v: &ViewFs, fh: u64, offset: u64, listing: Listing) -> Vec<DirItem> {
        let (mut items, mut at) = (Vec::new(), offset);
        loop {
            let before = items.len();
            v.readdir(ROOT, fh, at, listing, Room::UNBOUNDED, |item, next| {
                items.push(item.clone());
                at = next;
                false
            })
            .unwrap();
            if items.len() == before {
                return items;
            }
        }
    }

    #[test]
    fn a_listing_chunk_ends_where_the_entries_read_end_and_the_rest_is_read_ahead() {
        let dir = populated(5000);
        let v = view(dir.path(), "gid=5");
        let fh = v.opendir(ROOT).unwrap();
        // One batch, not the whole directory: the caller gets to work on it at once.
        let (first, at) = chunk(&v, fh, 0);
        assert!(first.len() > 100 && first.len() < 2500, "{}", first.len());
        // The next batches are read ahead of the next chunk, which hands them all over.
        v.read_ahead(fh);
        assert!(v.pending_dir_bytes.load(Ordering::Relaxed) > 0);
        let (second, at) = chunk(&v, fh, at);
        assert!(
            second.len() > first.len(),
            "{} after {}",
            second.len(),
            first.len()
        );
        assert_eq!(v.pending_dir_bytes.load(Ordering::Relaxed), 0);
        // Read ahead or not, the listing is whole and names every entry once.
        let mut all: Vec<Vec<u8>> = first.into_iter().chain(second).collect();
        all.extend(rest(&v, fh, at, Listing::Names).into_iter().map(|i| i.name));
        let mut files: Vec<_> = all.iter().filter(|n| n.starts_with(b"f")).collect();
        files.sort();
        files.dedup();
        assert_eq!(files.len(), 5000);
        assert_eq!(all.len(), 5002, "each entry once, `.` and `..` included");
        // A listing that starts over (rewinddir) drops what was read ahead.
        let (again, _) = chunk(&v, fh, 0);
        v.read_ahead(fh);
        assert_eq!(chunk(&v, fh, 0).0, again);
        v.release(fh);
        assert_eq!(v.pending_dir_bytes.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_walk_listing_looked_up_ahead_counts_only_what_it_hands_over() {
        let dir = populated(1000);
        let v = view(dir.path(), "gid=5");
        let fh = v.opendir(ROOT).unwrap();
        let list = |offset: u64, stop_after: usize| {
            let (mut items, mut last) = (Vec::new(), offset);
            v.readdir(
                ROOT,
                fh,
                offset,
                Listing::WithAttributes,
                Room::UNBOUNDED,
                |item, next| {
                    if items.len() == stop_after {
                        return true; // full
                    }
                    items.push(item.clone());
                    last = next;
                    false
                },
            )
            .unwrap();
            (items, last)
        };
        // The lookups run ahead of the reply, over several threads; the ones the
        // reply had no room for are forgotten again.
        let (first, at) = list(0, 300);
        assert_eq!(first.len(), 300);
        let files = |items: &[DirItem]| items.iter().filter(|i| i.name.starts_with(b"f")).count();
        assert_eq!(v.inode_count(), 1 + files(&first));
        let mut all = first;
        all.extend(rest(&v, fh, at, Listing::WithAttributes));
        assert_eq!(files(&all), 1000);
        assert_eq!(v.inode_count(), 1 + 1000);
        // Each file with its own attributes, under its own name.
        for item in all.iter().filter(|i| i.name.starts_with(b"f")) {
            let attr = item.attr.expect("a walk's entry carries attributes");
            assert_eq!(attr.gid, 5);
            assert_eq!(attr, v.lookup(ROOT, OsStr::from_bytes(&item.name)).unwrap());
        }
        v.release(fh);
    }

    /// A walk's listing makes hundreds of node ids before its reply; their journal
    /// lines go out together, before `readdir` returns (the reply is sent after it), so
    /// a view that dies then is recovered knowing each (`fs/inode.rs` `JournalBatch`).
    #[test]
    fn a_walk_listings_node_ids_are_journaled_before_it_returns() {
        let dir = populated(600);
        let v = view(dir.path(), "gid=5");
        let held = HeldJournal::default();
        held.take(&v);
        let fh = v.opendir(ROOT).unwrap();
        let listed = rest(&v, fh, 0, Listing::WithAttributes);
        let ids: Vec<u64> = listed
            .iter()
            .filter(|i| i.name.starts_with(b"f"))
            .map(|i| i.attr.expect("a walk's entry carries attributes").ino)
            .collect();
        assert_eq!(ids.len(), 600);
        let journaled = held.replay().inodes;
        let missing: Vec<_> = ids
            .iter()
            .filter(|id| !journaled.contains_key(id))
            .collect();
        assert!(
            missing.is_empty(),
            "{} listed ids not journaled",
            missing.len()
        );
        v.release(fh);
    }

    #[test]
    fn a_walk_listing_looks_up_only_what_fits_in_a_small_reply() {
        let dir = populated(1000);
        let v = view(dir.path(), "gid=5");
        let fh = v.opendir(ROOT).unwrap();
        // Go's os.ReadDir reads 8 KiB at a time: about 50 READDIRPLUS entries a reply.
        let room = Room {
            bytes: 8192,
            header: 152,
        };
        dirs::looked_up::take();
        let (mut all, mut at, mut replies) = (Vec::new(), 0, 0);
        loop {
            let (mut items, mut left) = (Vec::new(), room.bytes);
            v.readdir(ROOT, fh, at, Listing::WithAttributes, room, |item, next| {
                // Full as the reply is full: the entry does not fit in what is left.
                let Some(after) = left.checked_sub(room.cost(&item.name)) else {
                    return true;
                };
                left = after;
                items.push(item.clone());
                at = next;
                false
            })
            .unwrap();
            if items.is_empty() {
                break;
            }
            replies += 1;
            let looked = dirs::looked_up::take();
            let handed = items.iter().filter(|i| i.attr.is_some()).count();
            assert_eq!(
                looked, handed,
                "reply {replies}: looked up {looked}, handed {handed}"
            );
            all.extend(items);
        }
        assert!(replies >= 1000 / 60, "{replies} replies of at most 8 KiB");
        every_file_with_attributes(&v, &all, 1000);
        v.release(fh);
    }

    #[test]
    fn a_walk_listing_does_its_lookups_itself_when_no_thread_can_be_started() {
        let dir = populated(1000);
        let v = view(dir.path(), "gid=5");
        let fh = v.opendir(ROOT).unwrap();
        // A pids limit refuses every thread; the listing must neither fail nor panic.
        dirs::no_helpers::set(true);
        let items = rest(&v, fh, 0, Listing::WithAttributes);
        dirs::no_helpers::set(false);
        every_file_with_attributes(&v, &items, 1000);
        v.release(fh);
    }

    /// A network share's listing spreads its lookups over threads that outlive it:
    /// started once, at the view's first listing that spreads them, not for each
    /// chunk (where a thread newer than the NFS client's cached `ACCESS` answer asks
    /// the server again: `dirs::Helpers`).
    #[test]
    fn a_listings_lookup_threads_are_started_once_for_the_view() {
        let dir = populated(300);
        let v = network_view(dir.path(), "gid=5");
        for _ in 0..2 {
            let fh = v.opendir(ROOT).unwrap();
            let items = rest(&v, fh, 0, Listing::WithAttributes);
            every_file_with_attributes(&v, &items, 300);
            v.release(fh);
        }
        assert_eq!(
            helpers_started(&v, dirs::NETWORK_LOOKUP_THREADS),
            dirs::NETWORK_LOOKUP_THREADS
        );
    }

    /// Listings at once each get a pool of their own, kept for the next listings; past
    /// [`dirs::MAX_POOLS`] at once, a pool for the chunk alone.
    #[test]
    fn listings_at_once_each_get_lookup_threads_of_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let v = view(dir.path(), "gid=5");
        let lent: Vec<_> = (0..dirs::MAX_POOLS + 1)
            .map(|_| v.helpers.lend(2).unwrap())
            .collect();
        let all = 2 * (dirs::MAX_POOLS + 1);
        assert_eq!(helpers_started(&v, all), all);
        drop(lent);
        // The kept ones are lent again: no thread is started.
        let again: Vec<_> = (0..dirs::MAX_POOLS)
            .map(|_| v.helpers.lend(2).unwrap())
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_eq!(v.helpers.started(), all);
        drop(again);
    }

    /// An idle view has the threads it had before its listings: kept pools end after
    /// [`dirs::POOL_IDLE`] without a listing (here 200 ms), and a listing after that
    /// gets a pool anew.
    #[test]
    fn kept_lookup_threads_end_when_no_listing_comes() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = view(dir.path(), "gid=5");
        v.helpers = dirs::Helpers::new(std::time::Duration::from_millis(200));
        let lent: Vec<_> = (0..2).map(|_| v.helpers.lend(2).unwrap()).collect();
        assert_eq!(helpers_started(&v, 4), 4);
        assert_eq!(v.helpers.kept(), 2);
        drop(lent);
        // Lent again before they waited long: kept, no thread started.
        let again = v.helpers.lend(2).unwrap();
        drop(again);
        assert_eq!(v.helpers.started(), 4);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while v.helpers.ended() < 4 {
            assert!(
                std::time::Instant::now() < deadline,
                "idle pools kept: {} of 4 threads ended",
                v.helpers.ended()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(v.helpers.kept(), 0);
        // The next listing starts a pool anew, kept in turn.
        let anew = v.helpers.lend(2).unwrap();
        assert_eq!(helpers_started(&v, 6), 6);
        drop(anew);
        assert_eq!(v.helpers.kept(), 1);
    }

    /// The lookup threads `v` started, once `n` have or 10 s passed (each counts
    /// itself as it starts, after its pool is made).
    fn helpers_started(v: &ViewFs, n: usize) -> usize {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while v.helpers.started() < n && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        v.helpers.started()
    }

    /// Where the view acts as its callers, the lookups a listing spreads over its
    /// threads are made as the caller the listing is made for, though the threads
    /// were started for another.
    #[test]
    fn a_listings_lookup_threads_act_as_its_caller() {
        let dir = populated(300);
        let v = network_view(dir.path(), "ownership=share");
        let list = |v: &ViewFs| {
            let fh = v.opendir(ROOT).unwrap();
            let items = rest(v, fh, 0, Listing::WithAttributes);
            v.release(fh);
            assert_eq!(items.iter().filter(|i| i.attr.is_some()).count(), 300);
            v.helpers.looked_up_as()
        };
        // The threads start for the view's own listing, as root.
        let parts = list(&v);
        assert!(
            parts.len() > 1 && parts.iter().all(|&ids| ids == (0, 0)),
            "{parts:?}"
        );
        assert_eq!(
            helpers_started(&v, dirs::NETWORK_LOOKUP_THREADS),
            dirs::NETWORK_LOOKUP_THREADS
        );
        let acting = crate::sys::creds::act_as(1000, 1000, &[]).unwrap();
        let parts = list(&v);
        drop(acting);
        assert!(
            parts.len() > 1 && parts.iter().all(|&ids| ids == (1000, 1000)),
            "{parts:?}"
        );
        // And as root again once the caller is gone.
        let parts = list(&v);
        assert!(parts.iter().all(|&ids| ids == (0, 0)), "{parts:?}");
    }

    /// Makes this test thread give up `CAP_DAC_READ_SEARCH`, which an acting thread
    /// keeps and a local file system honours, where the NFS client does not (the
    /// server answers for the caller: fs/nfs/dir.c `nfs_permission`): as the share
    /// would ignore it. Threads it starts from now on inherit that.
    fn without_read_search_override() {
        use rustix::thread::{CapabilitySet, capabilities, set_capabilities};
        let mut caps = capabilities(None).unwrap();
        caps.permitted.remove(CapabilitySet::DAC_READ_SEARCH);
        caps.effective.remove(CapabilitySet::DAC_READ_SEARCH);
        set_capabilities(None, caps).unwrap();
    }

    /// Where the view acts as its callers, a walk is warmed ahead as its caller: the
    /// share's answers the warming gets (the NFS client's cached `ACCESS`) are those
    /// the walker needs, and a directory closed to the walker is not listed ahead.
    #[test]
    fn a_walk_is_warmed_ahead_as_its_caller() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mode = |p: &std::path::Path, m| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
        };
        mode(dir.path(), 0o755);
        for (name, m) in [("closed", 0o700), ("open", 0o755)] {
            let d = dir.path().join(name);
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("f"), "").unwrap();
            mode(&d, m);
        }
        let v = network_view(dir.path(), "ownership=share");
        without_read_search_override();
        let acting = crate::sys::creds::act_as(1000, 1000, &[]).unwrap();
        let fh = v.opendir(ROOT).unwrap();
        let items = rest(&v, fh, 0, Listing::WithAttributes);
        v.release(fh);
        drop(acting);
        assert_eq!(items.iter().filter(|i| i.attr.is_some()).count(), 2);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while v.walked_ahead() < 1 || v.ahead.running() {
            assert!(
                std::time::Instant::now() < deadline,
                "the warming never ended"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(v.walked_ahead(), 1, "only the directory open to the caller");
    }

    /// Where the share checks permissions (`share_checks`), `access(2)` and an exec's
    /// open get the share's answer for the caller, and a lookup answers with the
    /// cached attributes, kept no longer than the attribute timeout after the view last
    /// read them afresh; names are kept only in a directory every caller may search.
    #[test]
    fn where_the_share_checks_it_answers_access_exec_and_lookups_for_the_caller() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        std::fs::set_permissions(dir.path().join("f"), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        for (name, mode) in [("open", 0o755), ("search", 0o711), ("closed", 0o750)] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
            std::fs::set_permissions(dir.path().join(name), std::fs::Permissions::from_mode(mode))
                .unwrap();
        }
        let mut v = view(
            dir.path(),
            "mode=native,gid=4242,disk_gid=5000,ownership=share",
        );
        let f = v.lookup(ROOT, OsStr::new("f")).unwrap().ino;
        // Not on NFS: the kernel checks, and `access` allows all but writing a
        // read-only view; an exec's open is the kernel's to refuse.
        assert!(!v.share_checks());
        v.access(f, libc::X_OK).unwrap();
        let exec = handles::OPEN_EXEC | libc::O_RDONLY;
        let opened = v.open(f, exec, Caller { pid: 0 }).unwrap();
        v.release(opened.fh);
        assert_eq!(v.lookup_for_kernel(ROOT, OsStr::new("f")).unwrap().1, None);
        v.share_checks = true;
        // No execute bit for anyone: even root is refused (faccessat2).
        assert_eq!(v.access(f, libc::X_OK).unwrap_err().errno(), libc::EACCES);
        v.access(f, libc::R_OK | libc::W_OK).unwrap();
        assert_eq!(
            v.open(f, exec, Caller { pid: 0 }).err().map(|e| e.errno()),
            Some(libc::EACCES)
        );
        let opened = v.open(f, libc::O_RDONLY, Caller { pid: 0 }).unwrap();
        v.release(opened.fh);
        // Read afresh just now (the getattr): kept for about the attribute timeout.
        v.getattr(f).unwrap();
        let (a, keep) = v.lookup_for_kernel(ROOT, OsStr::new("f")).unwrap();
        assert_eq!(a.ino, f);
        let keep = keep.expect("cached attributes say how long they may be kept");
        assert!(
            keep > std::time::Duration::ZERO && keep <= v.attr_timeout,
            "{keep:?}"
        );
        // A name new to the kernel is read afresh, and kept for the attribute
        // timeout: a stat right after its lookup asks nothing more.
        std::fs::write(dir.path().join("g"), b"y").unwrap();
        v.attr_timeout = std::time::Duration::from_millis(50);
        let (_, keep) = v.lookup_for_kernel(ROOT, OsStr::new("g")).unwrap();
        assert_eq!(keep, None, "read afresh");
        // Held, and last read afresh longer ago than the attribute timeout: answered
        // from the cache, and not kept at all.
        std::thread::sleep(2 * v.attr_timeout);
        let (_, keep) = v.lookup_for_kernel(ROOT, OsStr::new("g")).unwrap();
        assert_eq!(keep, Some(std::time::Duration::ZERO));
        // Names are kept where every caller may search, not elsewhere.
        let searchable = |name: &str| {
            let d = v.lookup(ROOT, OsStr::new(name)).unwrap().ino;
            v.searchable_by_all(d)
        };
        assert!(searchable("open") && searchable("search") && !searchable("closed"));
        assert!(!v.searchable_by_all(f), "a file is no directory");
        assert!(!v.searchable_by_all(ROOT), "0700");
    }

    /// A walk's open of a directory warmed ahead takes the warming's descriptor, but
    /// only where the caller may read the directory: the warming lists as the view,
    /// and a view that acts as its callers leaves that check to the share.
    #[test]
    fn a_walk_opens_a_directory_warmed_ahead_only_where_its_caller_may_read_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        for (name, mode) in [("closed", 0o700), ("open", 0o755), ("last", 0o755)] {
            let d = dir.path().join(name);
            std::fs::create_dir(&d).unwrap();
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
            std::fs::write(d.join("f"), "").unwrap();
        }
        let v = network_view(dir.path(), "ownership=share");
        let fh = v.opendir(ROOT).unwrap();
        let items = rest(&v, fh, 0, Listing::WithAttributes);
        v.release(fh);
        let ino = |name: &str| {
            items
                .iter()
                .find(|i| i.name == name.as_bytes())
                .unwrap()
                .ino
        };
        let (closed, open) = (ino("closed"), ino("open"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while v.ahead.held_dirs().len() < super::super::ahead::AHEAD {
            assert!(std::time::Instant::now() < deadline, "nothing warmed ahead");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let mut held = v.ahead.held_dirs();
        held.sort();
        let mut want = vec![closed, open];
        want.sort();
        assert_eq!(held, want, "the first two in listing order");
        without_read_search_override();
        let acting = crate::sys::creds::act_as(1000, 1000, &[]).unwrap();
        let refused = v.opendir(closed).err().map(|e| e.errno());
        drop(acting);
        assert_eq!(
            refused,
            Some(libc::EACCES),
            "a directory closed to its caller"
        );
        assert_eq!(v.ahead.held_dirs(), [open]);
        assert_eq!(v.ahead.dirs_claimed(), 0);
        let fh = v.opendir(open).unwrap();
        assert!(v.ahead.held_dirs().is_empty());
        assert_eq!(v.ahead.dirs_claimed(), 1, "taken by the walker's open");
        let listed = rest(&v, fh, 0, Listing::Names);
        v.release(fh);
        assert!(listed.iter().any(|i| i.name == b"f"), "{listed:?}");
    }

    #[test]
    fn what_listings_read_ahead_is_bounded_per_stream_and_per_view() {
        let dir = populated(20_000);
        let v = view(dir.path(), "gid=5");
        let batch = 64 * 1024; // a batch of short names, more than enough
        let one = v.opendir(ROOT).unwrap();
        chunk(&v, one, 0);
        for _ in 0..10 {
            v.read_ahead(one);
        }
        let held = v.pending_dir_bytes.load(Ordering::Relaxed);
        assert!(held >= dirs::AHEAD_PER_STREAM, "{held}");
        assert!(held < dirs::AHEAD_PER_STREAM + batch, "{held}");
        // Streams left unfinished cannot make the daemon hold more than the view's bound.
        let mut streams = vec![one];
        for _ in 0..(dirs::AHEAD_PER_VIEW / dirs::AHEAD_PER_STREAM) * 2 {
            let fh = v.opendir(ROOT).unwrap();
            chunk(&v, fh, 0);
            v.read_ahead(fh);
            streams.push(fh);
        }
        let held = v.pending_dir_bytes.load(Ordering::Relaxed);
        assert!(held >= dirs::AHEAD_PER_VIEW, "{held}");
        assert!(held < dirs::AHEAD_PER_VIEW + batch, "{held}");
        for fh in streams {
            v.release(fh);
        }
        assert_eq!(v.pending_dir_bytes.load(Ordering::Relaxed), 0);
    }

    /// The entries named `f...` of one listing of directory `ino`, as the view decides.
    fn listed_files(v: &ViewFs, ino: u64) -> Vec<DirItem> {
        let fh = v.opendir(ino).unwrap();
        let mut items = Vec::new();
        v.readdir(ino, fh, 0, Listing::AsNeeded, Room::UNBOUNDED, |item, _| {
            if item.name.starts_with(b"f") {
                items.push(item.clone());
            }
            false
        })
        .unwrap();
        v.release(fh);
        items
    }

    /// Issue 33's listing cliff: a name listing made right after a walk elsewhere in the
    /// view carried attributes (a lookup per entry). It stays a name listing; the
    /// walked directory, and a directory the walk reaches from it, carry attributes.
    #[test]
    fn a_name_listing_beside_a_walk_stays_a_name_listing() {
        let dir = tempfile::tempdir().unwrap();
        for d in ["walked", "walked/sub", "elsewhere"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        for i in 0..64 {
            for d in ["walked", "walked/sub", "elsewhere"] {
                std::fs::write(dir.path().join(d).join(format!("f{i}")), "x").unwrap();
            }
        }
        let v = view(dir.path(), "gid=5");
        let list = |ino: u64| listed_files(&v, ino);
        let walked = v.lookup(ROOT, OsStr::new("walked")).unwrap().ino;
        let elsewhere = v.lookup(ROOT, OsStr::new("elsewhere")).unwrap().ino;
        // A walker stats all it lists in `walked`, and goes down into `sub`.
        for i in list(walked) {
            v.lookup(walked, OsStr::from_bytes(&i.name)).unwrap();
        }
        let sub = v.lookup(walked, OsStr::new("sub")).unwrap().ino;
        let with = |items: &[DirItem]| items.iter().filter(|i| i.attr.is_some()).count();
        assert!(
            with(&list(walked)) >= 63,
            "the walked directory carries attributes"
        );
        assert!(
            with(&list(sub)) >= 63,
            "where the walk goes next, from its first entry"
        );
        assert_eq!(
            with(&list(elsewhere)),
            0,
            "a name listing elsewhere stays one"
        );
    }

    #[test]
    fn a_listing_carries_attributes_only_while_listed_names_are_looked_up() {
        let dir = populated(64);
        let v = view(dir.path(), "gid=5");
        let list = |v: &ViewFs| listed_files(v, ROOT);
        // Nobody has stated a listed name yet: names only, nothing registered.
        let first = list(&v);
        assert_eq!(first.len(), 64);
        assert!(
            first
                .iter()
                .all(|i| i.attr.is_none() && i.kind == Kind::Regular)
        );
        assert_eq!(v.inode_count(), 1);
        // A lookup of a name not listed (a path walk, a create) is no evidence.
        let _ = v.lookup(ROOT, OsStr::new("absent"));
        assert!(list(&v).iter().all(|i| i.attr.is_none()));
        // A walker: it stats what it listed. The next listing carries attributes, but
        // for one entry in 256 (probes that keep the evidence coming).
        for i in &first {
            v.lookup(ROOT, OsStr::from_bytes(&i.name)).unwrap();
        }
        let looked_up = v.inode_count();
        let second = list(&v);
        let with = second.iter().filter(|i| i.attr.is_some()).count();
        assert!((63..=64).contains(&with), "{with} of 64 carried attributes");
        for i in second.iter().filter(|i| i.attr.is_some()) {
            let a = i.attr.unwrap();
            assert_eq!((a.ino, a.gid), (i.ino, 5));
        }
        // Each entry handed with attributes is one more kernel lookup of its inode.
        assert_eq!(v.inode_count(), looked_up);
    }

    /// A walk that starts at a directory of two (`find` over a tree whose top holds one
    /// directory) showed no evidence before it listed the big one below: one entry in
    /// 16 is a probe, counted over the view, and the top had none. Every name listing's
    /// first entry is a probe too.
    #[test]
    fn the_first_entry_of_a_name_listing_is_a_probe() {
        let dir = populated(2);
        std::fs::create_dir(dir.path().join("fdir")).unwrap();
        let v = view(dir.path(), "gid=5");
        let first = listed_files(&v, ROOT);
        assert_eq!(first.len(), 3);
        assert!(first.iter().all(|i| i.attr.is_none()));
        assert!(!v.listing.walking_in(ROOT));
        // A walker states what it listed, from the first.
        let a = v.lookup(ROOT, OsStr::from_bytes(&first[0].name)).unwrap();
        assert!(v.listing.walking_in(ROOT), "the first entry was a probe");
        v.forget(a.ino, 1);
        // A listing that starts midway (after the first file) has no first entry to
        // probe.
        let other = populated(3);
        let w = view(other.path(), "gid=5");
        let fh = w.opendir(ROOT).unwrap();
        let mut after_first = 0;
        w.readdir(
            ROOT,
            fh,
            0,
            Listing::Names,
            Room::UNBOUNDED,
            |item, next| {
                after_first = next;
                item.name.starts_with(b"f")
            },
        )
        .unwrap();
        let mut midway = Vec::new();
        w.readdir(
            ROOT,
            fh,
            after_first,
            Listing::AsNeeded,
            Room::UNBOUNDED,
            |item, _| {
                midway.push(item.clone());
                false
            },
        )
        .unwrap();
        w.release(fh);
        midway.retain(|i| i.name.starts_with(b"f"));
        assert_eq!(midway.len(), 2, "{midway:?}");
        let _ = w.lookup(ROOT, OsStr::from_bytes(&midway[0].name)).unwrap();
        assert!(!w.listing.walking_in(ROOT));
    }

    /// On NFS a lookup of an entry the client has not seen waits two round trips, and
    /// the kernel (before 6.16) asks for a page of a walk's listing at a time (25 or so): a
    /// listing that looked up only what each page had room for took longer than the
    /// entries' timeouts, and the walker looked most of them up again, one at a time.
    /// A network share's listing looks up further ahead, over its threads, and the
    /// next chunks hand what was looked up; what is never handed is forgotten.
    #[test]
    fn a_network_shares_walk_listing_looks_up_past_the_page_for_the_next() {
        let dir = populated(200);
        let v = network_view(dir.path(), "gid=5");
        // A page's room: 10 entries of these names (a header as the kernel's).
        let room = Room {
            bytes: 10 * 160,
            header: 152,
        };
        let fh = v.opendir(ROOT).unwrap();
        let mut handed: Vec<DirItem> = Vec::new();
        let mut at = 0;
        // As the kernel's reply: full when the next entry does not fit.
        let chunk = |v: &ViewFs, at: &mut u64, handed: &mut Vec<DirItem>| {
            let before = handed.len();
            let mut left = room.bytes;
            v.readdir(
                ROOT,
                fh,
                *at,
                Listing::WithAttributes,
                room,
                |item, next| {
                    let Some(after) = left.checked_sub(room.cost(&item.name)) else {
                        return true;
                    };
                    left = after;
                    handed.push(item.clone());
                    *at = next;
                    false
                },
            )
            .unwrap();
            handed.len() - before
        };
        dirs::looked_up::take();
        assert!(chunk(&v, &mut at, &mut handed) <= 10);
        assert_eq!(dirs::looked_up::take(), dirs::NETWORK_LOOK_AHEAD);
        let files = |items: &[DirItem]| items.iter().filter(|i| i.name.starts_with(b"f")).count();
        // The page's lookups, and those waiting for the next pages.
        assert_eq!(v.inode_count(), 1 + dirs::NETWORK_LOOK_AHEAD);
        while chunk(&v, &mut at, &mut handed) > 0 {}
        assert_eq!(files(&handed), 200);
        assert_eq!(
            dirs::looked_up::take(),
            200 - dirs::NETWORK_LOOK_AHEAD,
            "no entry looked up twice"
        );
        assert_eq!(v.inode_count(), 1 + 200);
        for item in handed.iter().filter(|i| i.name.starts_with(b"f")) {
            let a = item.attr.expect("a walk's entry carries attributes");
            assert_eq!(a, v.lookup(ROOT, OsStr::from_bytes(&item.name)).unwrap());
            v.forget(a.ino, 2);
        }
        assert_eq!(v.inode_count(), 1);
        // A listing that stops after a page, or starts over, forgets what it looked up
        // ahead and did not hand.
        let (mut handed, mut at) = (Vec::new(), 0);
        chunk(&v, &mut at, &mut handed);
        let kept = files(&handed);
        assert_eq!(v.inode_count(), 1 + dirs::NETWORK_LOOK_AHEAD);
        dirs::looked_up::take();
        let mut again = Vec::new();
        chunk(&v, &mut 0, &mut again);
        // The same entries again: the first page's lookups ahead were forgotten and made
        // anew, not kept twice.
        assert_eq!(again, handed);
        assert_eq!(dirs::looked_up::take(), dirs::NETWORK_LOOK_AHEAD);
        assert_eq!(v.inode_count(), 1 + dirs::NETWORK_LOOK_AHEAD);
        v.release(fh);
        assert_eq!(v.inode_count(), 1 + kept);
        for a in handed.iter().filter_map(|i| i.attr) {
            v.forget(a.ino, 2);
        }
        assert_eq!(v.inode_count(), 1);
    }

    #[test]
    fn lookups_of_names_a_held_directory_lacks_are_answered_without_the_disk() {
        use super::super::names::{FIRST_LISTING_MISSES, HeldNames};
        let dir = tempfile::tempdir().unwrap();
        let mut v = view(dir.path(), "gid=5");
        // As on an SMB share (`ViewFs::new`), which this is not.
        v.names = HeldNames::new(std::time::Duration::from_secs(60));
        let name = OsStr::new;
        let d = v.mkdir(ROOT, name("d"), 0o755, ME).unwrap().ino;
        let absent = |dir, n| matches!(v.lookup(dir, name(n)), Err(FsError::Absent(_)));
        assert!(absent(d, "x"), "a directory the view made holds no names");
        assert_eq!(FsError::Absent(Default::default()).errno(), libc::ENOENT);
        // Whatever the view makes there, however, is held.
        let excl = libc::O_EXCL | libc::O_RDWR;
        v.create(d, name("x"), 0o100644, excl, ME, Existing::Kernel)
            .unwrap();
        v.mkdir(d, name("sub"), 0o755, ME).unwrap();
        v.symlink(d, name("l"), name("x"), ME).unwrap();
        v.mknod(d, name("p"), libc::S_IFIFO | 0o644, ME).unwrap();
        let f = v
            .create(ROOT, name("f"), 0o100644, excl, ME, Existing::Kernel)
            .unwrap()
            .attr
            .ino;
        v.link(f, d, name("hard")).unwrap();
        v.rename(ROOT, name("f"), d, name("moved"), 0).unwrap();
        for n in ["x", "sub", "l", "p", "hard", "moved", "X", "Moved"] {
            assert!(!absent(d, n), "{n}");
        }
        assert!(v.lookup(d, name("x")).is_ok());
        // A name made around the view stays unseen until the timeout, or until a
        // listing the view hands out shows it.
        std::fs::write(dir.path().join("d/around"), "").unwrap();
        assert!(absent(d, "around"));
        let fh = v.opendir(d).unwrap();
        let mut listed = Vec::new();
        v.readdir(d, fh, 0, Listing::Names, Room::UNBOUNDED, |item, _| {
            listed.push(item.name.clone());
            false
        })
        .unwrap();
        v.release(fh);
        assert!(listed.iter().any(|n| n == b"around"), "{listed:?}");
        assert!(!absent(d, "around"), "a listing showed it");
        // A directory the view did not make is listed after a few lookups the disk
        // answered.
        std::fs::create_dir(dir.path().join("e")).unwrap();
        std::fs::write(dir.path().join("e/a"), "").unwrap();
        let e = v.lookup(ROOT, name("e")).unwrap().ino;
        for i in 0..FIRST_LISTING_MISSES {
            assert_eq!(
                v.lookup(e, name(&format!("m{i}"))).err(),
                Some(FsError::Os(Errno::ENOENT))
            );
        }
        assert!(absent(e, "m"));
        assert!(v.lookup(e, name("a")).is_ok());
        assert!(!absent(ROOT, "m"), "the root was not listed");
    }

    #[test]
    fn a_file_removed_while_open_waits_under_a_reserved_name_until_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = view(dir.path(), "gid=5");
        // As on an SMB share (`ViewFs::new`), which this is not.
        v.delete_pends = true;
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

    /// Asserts that `dir` holds one entry, under a reserved name: a removed file the
    /// view holds open, moved aside rather than removed.
    fn only_moved_aside(dir: &std::path::Path) {
        let aside: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(
            aside.len() == 1 && namespace::is_reserved_name(aside[0].as_bytes()),
            "moved aside, not removed: {aside:?}"
        );
    }

    #[test]
    fn a_file_is_held_against_a_removal_by_a_reader_after_a_writer_beside_it_went() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = view(dir.path(), "gid=5");
        v.delete_pends = true;
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
        v.delete_pends = true;
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
        v.tmpfile_missing.store(no_tmpfile, Ordering::Relaxed);
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
            v.tmpfile_missing.store(no_tmpfile, Ordering::Relaxed);
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
    fn a_chown_clears_recorded_set_id_bits() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), "x").unwrap();
        let v = view(dir.path(), "gid=5");
        let f = v.lookup(ROOT, OsStr::new("f")).unwrap().ino;
        let set = |s: SetAttr| v.setattr(f, None, s).unwrap();
        set(SetAttr {
            mode: Some(0o6555),
            ..Default::default()
        });
        let a = set(SetAttr {
            uid: Some(65534),
            gid: Some(65533),
            ..Default::default()
        });
        assert_eq!((a.uid, a.gid, a.perm), (65534, 65533, 0o555));
        // Setgid without group execute is not a set-id bit to clear.
        set(SetAttr {
            mode: Some(0o2745),
            ..Default::default()
        });
        let a = set(SetAttr {
            gid: Some(5),
            ..Default::default()
        });
        assert_eq!(a.perm, 0o2745);
    }

    #[test]
    fn an_unreadable_record_fails_closed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), "x").unwrap();
        let v = view(dir.path(), "gid=5");
        let f = v.lookup(ROOT, OsStr::new("f")).unwrap().ino;
        assert_eq!(v.getattr(f).unwrap().perm, 0o664, "derived");
        let fd = std::fs::File::open(dir.path().join("f")).unwrap();
        xattr::set(fd.as_fd(), RECORD_XATTR, b"\x09garbage", 0).unwrap();
        assert_eq!(
            v.getattr(f).unwrap().perm,
            0,
            "a record from the future narrows"
        );
        // Root sets the mode again: a record this version reads.
        let a = v
            .setattr(
                f,
                None,
                SetAttr {
                    mode: Some(0o640),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(a.perm, 0o640);
    }

    #[test]
    fn trusted_names_are_listed_for_root_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), "x").unwrap();
        let fd = std::fs::File::open(dir.path().join("f")).unwrap();
        xattr::set(fd.as_fd(), c"trusted.other", b"1", 0).unwrap();
        xattr::set(fd.as_fd(), c"user.a", b"1", 0).unwrap();
        let v = view(dir.path(), "gid=5");
        let f = v.lookup(ROOT, OsStr::new("f")).unwrap().ino;
        // This test process (root, in the initial user namespace): CAP_SYS_ADMIN.
        let root = Caller {
            pid: std::process::id(),
        };
        let names = |c| match v.listxattr(f, 1000, c).unwrap() {
            XattrReply::Data(d) => d,
            XattrReply::Size(_) => unreachable!(),
        };
        assert_eq!(names(ME.into()), b"user.a\0");
        let mut all: Vec<_> = names(root).split(|b| *b == 0).map(<[u8]>::to_vec).collect();
        all.sort();
        assert_eq!(
            all,
            [b"".to_vec(), b"trusted.other".to_vec(), b"user.a".to_vec()]
        );
    }

    /// On NFS a first read of an entry's `user.` record costs two server requests (the
    /// client asks the server whether the reader may read, then reads) where a list of
    /// the entry's names costs one and stays in the client's cache: a walk of a tree
    /// made around the driver asked twice what it needed. The view lists first while
    /// most first reads find no record, and reads first while most find one; either
    /// way each entry shows what its record says.
    #[test]
    fn first_reads_of_records_list_first_while_most_find_none() {
        let dir = tempfile::tempdir().unwrap();
        let around = dir.path().join("around");
        std::fs::create_dir(&around).unwrap();
        for i in 0..8 {
            std::fs::write(around.join(format!("f{i}")), "").unwrap();
        }
        let made = view(dir.path(), "gid=5,ownership=emulate-user");
        let m = made.mkdir(ROOT, OsStr::new("made"), 0o755, ME).unwrap();
        for i in 0..12 {
            let c = made
                .create(
                    m.ino,
                    OsStr::new(&format!("f{i}")),
                    0o100644,
                    libc::O_RDWR,
                    ME,
                    Existing::Kernel,
                )
                .unwrap();
            made.release(c.fh);
            let chmod = SetAttr {
                mode: Some(0o600),
                ..Default::default()
            };
            made.setattr(c.attr.ino, None, chmod).unwrap();
        }
        // A new view (on NFS), which has read no record yet.
        let mut v = view(dir.path(), "gid=5,ownership=emulate-user");
        v.records_listed = true;
        let dir_of = |name: &str| v.lookup(ROOT, OsStr::new(name)).unwrap().ino;
        let (around_ino, made_ino) = (dir_of("around"), dir_of("made"));
        record_reads::take();
        for i in 0..8 {
            let a = v.lookup(around_ino, OsStr::new(&format!("f{i}"))).unwrap();
            assert_ne!((a.uid, a.perm), (1000, 0o600), "no record");
        }
        assert_eq!(record_reads::take(), (7, 1), "(listed first, read first)");
        // Entries with records: listed first until they outweigh those without, and
        // shown as recorded either way.
        for i in 0..12 {
            let a = v.lookup(made_ino, OsStr::new(&format!("f{i}"))).unwrap();
            assert_eq!((a.uid, a.perm), (1000, 0o600), "f{i}");
        }
        assert_eq!(record_reads::take(), (8, 4));
        // An entry whose last read found none is listed first whatever the others.
        v.lookup(around_ino, OsStr::new("f0")).unwrap();
        v.lookup(made_ino, OsStr::new("f0")).unwrap();
        assert_eq!(record_reads::take(), (1, 1));
    }

    /// `ownership=emulate-user` (a share without `trusted.*`, as NFS 4.2): the creator's
    /// uid and a chmod are recorded in `user.mountgroup.owner`, never on the disk; a
    /// symlink, which takes no `user.*` attribute, shows the derived owner and refuses
    /// chown; no view, of either kind, lets a pod read or write either record name.
    #[test]
    fn records_in_user_xattrs_where_the_share_has_no_trusted_ones() {
        use crate::fs::record::{RECORD_XATTR, USER_RECORD_XATTR};
        let dir = tempfile::tempdir().unwrap();
        let v = view(dir.path(), "gid=5,ownership=emulate-user");
        let made = v
            .create(
                ROOT,
                OsStr::new("f"),
                0o100640,
                libc::O_RDWR,
                ME,
                Existing::Kernel,
            )
            .unwrap();
        v.release(made.fh);
        assert_eq!(
            (made.attr.uid, made.attr.gid, made.attr.perm),
            (1000, 5, 0o640)
        );
        let on_disk = |name: &str| {
            let root = file::open_root(dir.path()).unwrap();
            let fd = file::open_child(root.as_fd(), OsStr::new(name), None).unwrap();
            (
                xattr::get(fd.as_fd(), USER_RECORD_XATTR).unwrap().is_some(),
                xattr::get(fd.as_fd(), RECORD_XATTR).unwrap().is_some(),
                file::stat(fd.as_fd()).unwrap().perm,
            )
        };
        assert_eq!(on_disk("f"), (true, false, 0o640));
        let f = made.attr.ino;
        let chmod = SetAttr {
            mode: Some(0o600),
            ..Default::default()
        };
        assert_eq!(v.setattr(f, None, chmod).unwrap().perm, 0o600);
        assert_eq!(on_disk("f"), (true, false, 0o640), "the disk never changes");
        let d = v.mkdir(ROOT, OsStr::new("d"), 0o750, ME).unwrap();
        assert_eq!((d.uid, d.perm & 0o777), (1000, 0o750));
        assert!(on_disk("d").0);
        let l = v
            .symlink(ROOT, OsStr::new("l"), OsStr::new("f"), ME)
            .unwrap();
        let root_uid = file::stat(file::open_root(dir.path()).unwrap().as_fd())
            .unwrap()
            .uid;
        assert_eq!(l.uid, root_uid, "a symlink shows the disk's owner");
        let chown = SetAttr {
            uid: Some(1000),
            ..Default::default()
        };
        assert_eq!(v.setattr(l.ino, None, chown), Err(FsError::NotPermitted));
        // Neither record name is a pod's, in this view or a trusted-records one.
        let other = view(dir.path(), "gid=5");
        for v in [&v, &other] {
            let f = v.lookup(ROOT, OsStr::new("f")).unwrap().ino;
            for name in [
                "user.mountgroup.owner",
                "user.mountgroup.x",
                "trusted.mountgroup.owner",
            ] {
                let name = OsStr::new(name);
                assert_eq!(v.setxattr(f, name, b"\x01", 0), Err(FsError::NotPermitted));
                assert_eq!(v.getxattr(f, name, 0), Err(FsError::NoAttribute));
                assert_eq!(v.removexattr(f, name), Err(FsError::NoAttribute));
            }
            assert_eq!(v.listxattr(f, 0, ME.into()).unwrap(), XattrReply::Size(0));
        }
        assert_eq!(
            other
                .getattr(other.lookup(ROOT, OsStr::new("f")).unwrap().ino)
                .unwrap()
                .uid,
            root_uid,
            "a trusted-records view reads no user.* record"
        );
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

    #[test]
    fn fifos_are_never_opened_by_the_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let v = view(dir.path(), "gid=5");
        let p = v
            .mknod(ROOT, OsStr::new("p"), libc::S_IFIFO | 0o644, ME)
            .unwrap();
        assert_eq!(p.kind, Kind::Fifo);
        assert_eq!(
            v.open(p.ino, libc::O_RDONLY, ME.into()).err(),
            Some(FsError::WrongKind)
        );
    }
}
