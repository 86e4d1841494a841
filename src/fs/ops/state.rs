//! The view's state that is not its tables: the settings it took once from its
//! options and its root ([`Settings`]), what it knows and learns of the share beneath
//! it ([`Backing`]), and which warnings it has given ([`Warned`]).

use std::sync::atomic::{AtomicBool, AtomicI32};

use crate::config::ViewOptions;
use crate::sys::file::Stat;

use super::super::view::Policy;

/// What a view was told, fixed for its life.
pub(super) struct Settings {
    pub(super) policy: Policy,
    /// The xattr that holds records (`ownership=emulate`: `trusted.`,
    /// `ownership=emulate-user`: `user.`).
    pub(super) record_xattr: &'static std::ffi::CStr,
    pub(super) readonly: bool,
    /// Whether the kernel checks permissions (`default_permissions`); not under CIFS
    /// `noperm`, where everything is allowed, nor where the share checks them.
    pub(super) checks_access: bool,
    /// The daemon's effective uid and gid (what a new entry gets before it is given
    /// to its caller), read once rather than on every create.
    pub(super) daemon_ids: (u32, u32),
    /// `ownership=share`: each request's calls on the share are made as its caller
    /// ([`ViewFs::act_for`]).
    pub(super) acts_as_callers: bool,
    /// The share checks every permission, the kernel's none ([`ViewFs::share_checks`]).
    pub(super) share_checks: bool,
    /// How long the kernel keeps attributes the view answers (`attr_timeout=`).
    pub(super) attr_timeout: std::time::Duration,
    /// `noatime` (files and directories) and `nodiratime` (directories): the daemon's
    /// own reads and listings leave the backing inodes' access times alone (`O_NOATIME`
    /// on the descriptors it reads through). Passthrough reads do not: the kernel reads
    /// through a backing file it opens with the reader's flags (fs/fuse/passthrough.c
    /// `fuse_passthrough_open`, `backing_file_open`). The backing mount's own atime
    /// rule applies otherwise, so a view cannot be stricter than it.
    pub(super) noatime: (bool, bool),
    /// Threads a walk's listing spreads its lookups over (`dirs.rs`), and the fewest
    /// lookups worth another one: on a local disk the cores, up to 4; on a network
    /// share (NFS, SMB, CephFS) [`dirs::NETWORK_LOOKUP_THREADS`].
    pub(super) lookup_threads: usize,
    pub(super) lookups_per_thread: usize,
    /// A network share: a walk's listing looks entries up past the reply's room, for
    /// the chunks to come (`dirs.rs`).
    pub(super) looks_past_room: bool,
    /// Who serves the I/O of files opened with `O_DIRECT` (`direct_io=`).
    pub(super) direct_io: crate::config::DirectIo,
}

/// What the view knows of the file system beneath it: what its root is on, told at
/// start, and what the file system answered since (a call it lacks, a kind of open
/// that made a twin).
pub(super) struct Backing {
    pub(super) root_mnt: Option<u64>,
    /// The btrfs quota group of the volume, when the root is a btrfs subvolume:
    /// statfs then reports the volume's limit and usage, not the whole file system.
    pub(super) qgroup: Option<std::path::PathBuf>,
    /// The root is on CephFS: statfs reports its directory quota, where it has one.
    pub(super) cephfs: bool,
    /// The root is on the kernel's NFS client: the share checks the permissions of a
    /// view that acts as its callers, and lookups are a network share's.
    pub(super) nfs: bool,
    /// The root is on NFS, whose client removes a name that a descriptor holds by
    /// renaming it (`.nfsXXXX`) and removing it when the descriptor closes
    /// (fs/nfs/dir.c `nfs_unlink`, `nfs_sillyrename`): three server requests for one.
    /// The view lets go of its own descriptor of what it removes or replaces first.
    pub(super) silly_renames: bool,
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
    pub(super) records_listed: bool,
    /// The root is on the kernel's SMB client, where removing a name that an open
    /// handle holds only marks the file "delete pending" on the server: the name stays
    /// until the last handle closes, and a create of it fails meanwhile (`ENOENT`).
    /// The view holds a file open until it has answered the kernel's asynchronous
    /// RELEASE, after the caller's `close` returned, so such a name is renamed out of
    /// the way first (`namespace.rs`, `unlink`).
    pub(super) delete_pends: bool,
    /// Set once the backing file system answered `RENAME_NOREPLACE` with `EINVAL`.
    pub(super) noreplace_missing: AtomicBool,
    /// The backing file system cannot make unnamed files (`O_TMPFILE`): new files are
    /// staged under a reserved name instead.
    pub(super) tmpfile_missing: AtomicBool,
    /// Whether an open answered with kernel passthrough makes a twin of the file
    /// ([`ViewFs::twin_opens`]).
    pub(super) twins: AtomicBool,
    /// First reads of entries' records: those that found none, less those that found
    /// one, within `±RECORDS_ABSENT_SPAN` (`records_listed` only).
    pub(super) records_absent: AtomicI32,
}

/// The warnings said once per view.
#[derive(Default)]
pub(super) struct Warned {
    /// A record that could not be read was said.
    pub(super) bad_record: AtomicBool,
    /// A caller this process cannot see has been said to act without its groups.
    pub(super) unseen_caller: AtomicBool,
}

impl Settings {
    /// The settings of a view with `options` over `share`.
    pub(super) fn new(options: &ViewOptions, share: &Backing) -> Settings {
        let network = share.network();
        let acts_as_callers = options.ownership == crate::config::Ownership::Share;
        let share_checks = acts_as_callers && share.nfs;
        let never = options.vfs.atime == crate::config::Atime::Never;
        Settings {
            policy: Policy::from_options(options),
            record_xattr: super::super::record::record_xattr(options.ownership)
                .unwrap_or(super::super::record::RECORD_XATTR),
            readonly: options.readonly,
            checks_access: options.kernel_permission_checks() && !share_checks,
            daemon_ids: crate::sys::process::effective_ids(),
            acts_as_callers,
            share_checks,
            attr_timeout: options.attr_timeout,
            noatime: (never, never || options.vfs.nodiratime),
            lookup_threads: if network {
                super::dirs::NETWORK_LOOKUP_THREADS
            } else {
                std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
            },
            lookups_per_thread: if network {
                super::dirs::NETWORK_LOOKUPS_PER_THREAD
            } else {
                super::dirs::LOOKUPS_PER_THREAD
            },
            looks_past_room: network,
            direct_io: options.direct_io,
        }
    }
}

impl Backing {
    /// What the file system of `root` (whose `statx` is `st`) is.
    pub(super) fn probe(root: std::os::fd::BorrowedFd<'_>, st: &Stat) -> Backing {
        use crate::sys::file;
        let qgroup = match crate::sys::btrfs::qgroup_dir(root) {
            Ok(q) => q,
            Err(e) => {
                tracing::warn!(error = %e, "cannot tell the btrfs quota group; statfs shows the whole file system");
                None
            }
        };
        if let Some(q) = &qgroup {
            tracing::info!(qgroup = %q.display(), "statfs follows the volume's btrfs quota group");
        }
        let nfs = file::is_nfs(root);
        Backing {
            root_mnt: st.mnt_id,
            qgroup,
            cephfs: file::is_cephfs(root),
            nfs,
            silly_renames: nfs,
            records_listed: nfs,
            delete_pends: file::is_smb(root),
            noreplace_missing: AtomicBool::new(false),
            tmpfile_missing: AtomicBool::new(false),
            twins: AtomicBool::new(false),
            records_absent: AtomicI32::new(0),
        }
    }

    /// A network share (NFS, SMB, CephFS): lookups are spread wider and looked past a
    /// reply's room.
    fn network(&self) -> bool {
        self.nfs || self.delete_pends || self.cephfs
    }
}
