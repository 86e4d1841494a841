//! Mounts: bind mounts and tmpfs, FUSE mounts, the idmapped clones of native views,
//! unmounting (lazily, or only a mount of a given device), and questions of the mount
//! table (what is mounted at a path, whether it is idmapped, which mounts of a file
//! system honour set-id bits).

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, StatxAttributes, StatxFlags};

use super::SysResult;

/// Whether `path` is the root of a mount (`STATX_ATTR_MOUNT_ROOT`).
///
/// A FUSE mount whose daemon died answers `ENOTCONN`; that is reported as an error so
/// that the caller can name it.
///
/// # Errors
/// The error of `statx(2)`.
pub fn is_mount_point(path: &Path) -> SysResult<bool> {
    let sx = rustix::fs::statx(
        rustix::fs::CWD,
        path,
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS,
    )?;
    let mask = sx.stx_attributes_mask;
    let attrs = sx.stx_attributes;
    if mask.contains(StatxAttributes::MOUNT_ROOT) {
        return Ok(attrs.contains(StatxAttributes::MOUNT_ROOT));
    }
    // Kernels before 5.8: compare the device with the parent's.
    let parent = path.parent().unwrap_or(Path::new("/"));
    let p = rustix::fs::statx(
        rustix::fs::CWD,
        parent,
        AtFlags::empty(),
        StatxFlags::BASIC_STATS,
    )?;
    Ok((p.stx_dev_major, p.stx_dev_minor) != (sx.stx_dev_major, sx.stx_dev_minor))
}

/// Lazily unmounts `path` (`umount2(MNT_DETACH)`): the mount disappears from the
/// namespace at once and is released when the last user lets go.
///
/// # Errors
/// The error of `umount2(2)`.
pub fn unmount_lazy(path: &Path) -> SysResult<()> {
    Ok(rustix::mount::unmount(
        path,
        rustix::mount::UnmountFlags::DETACH,
    )?)
}

/// The device (`major`, `minor`) of the mount at exactly `path` (the topmost one
/// there), from `/proc/self/mountinfo`, or `None` when nothing is mounted there.
///
/// # Errors
/// The error of reading mountinfo.
pub fn mount_device(path: &Path) -> SysResult<Option<(u32, u32)>> {
    let info =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| super::Errno::from_io(&e))?;
    Ok(mount_device_in(&info, path))
}

fn mount_device_in(mountinfo: &str, path: &Path) -> Option<(u32, u32)> {
    device_of_line(topmost_at(mountinfo, path)?)
}

/// The device (`major`, `minor`) a mountinfo line names (its third field).
fn device_of_line(line: &str) -> Option<(u32, u32)> {
    let (a, b) = line.split(' ').nth(2)?.split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Lazily unmounts the mount at `path` only if it is the root of a mount of device
/// `device` (a superblock this process serves), and returns whether it did.
///
/// A path names whatever is mounted there now: a view whose own mount was unmounted
/// by someone else must not take down the view mounted there since. So the path is
/// opened (`O_PATH`, never followed, nothing asked of a FUSE daemon: the device comes
/// from the superblock and `AT_STATX_DONT_SYNC` sends no request), checked, and the
/// mount the descriptor is on is unmounted through its `/proc/self/fd` link, which the
/// kernel resolves to that very mount. Without `/proc` the path itself is unmounted
/// after the check.
///
/// # Errors
/// The error of `open`, `statx` or `umount2`; nothing mounted there is `Ok(false)`.
pub fn unmount_if_device(path: &Path, device: (u32, u32)) -> SysResult<bool> {
    use rustix::fs::{Mode, OFlags};
    let fd = match rustix::fs::open(
        path,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => return Ok(false),
        Err(e) => return Err(super::failed("open")(e)),
    };
    let sx = rustix::fs::statx(
        &fd,
        "",
        AtFlags::EMPTY_PATH | AtFlags::STATX_DONT_SYNC,
        StatxFlags::BASIC_STATS,
    )
    .map_err(super::failed("statx"))?;
    let root = !sx.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT)
        || sx.stx_attributes.contains(StatxAttributes::MOUNT_ROOT);
    if (sx.stx_dev_major, sx.stx_dev_minor) != device || !root {
        return Ok(false);
    }
    // umount2 follows the magic link to the descriptor's own mount and checks that
    // it is that mount's root (fs/namespace.c `path_umount`, `can_umount`).
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    if Path::new("/proc/self/fd").is_dir() {
        rustix::mount::unmount(link.as_str(), rustix::mount::UnmountFlags::DETACH)
            .map_err(super::failed("umount2"))?;
    } else {
        unmount_lazy(path)?;
    }
    Ok(true)
}

/// How a FUSE mount is made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuseMount {
    /// The kernel checks permissions against the attributes the daemon reports.
    pub default_permissions: bool,
    /// Users other than the daemon's may enter the mount.
    pub allow_other: bool,
    /// `context=`: the SELinux label of every file (the LSM takes it from the data).
    pub selinux_context: Option<String>,
    /// The VFS flags asked for, by their mount(8) names ([`VFS_FLAGS`]).
    pub flags: Vec<&'static str>,
}

/// One VFS mount flag: its mount(8) name, its `mount(2)` flag, and its
/// `mount_setattr(2)` attribute with the attributes it clears (the access-time mode is
/// one field), where a mount can be given it after it is made.
pub struct VfsFlag {
    pub name: &'static str,
    pub flag: rustix::mount::MountFlags,
    pub attr: Option<(u64, u64)>,
}

/// Every VFS flag a view's mount can have (include/uapi/linux/mount.h): `sync`,
/// `dirsync` and `lazytime` are superblock flags, which no bind mount can have.
pub const VFS_FLAGS: &[VfsFlag] = &[
    VfsFlag {
        name: "ro",
        flag: rustix::mount::MountFlags::RDONLY,
        attr: Some((MOUNT_ATTR_RDONLY, 0)),
    },
    VfsFlag {
        name: "noexec",
        flag: rustix::mount::MountFlags::NOEXEC,
        attr: Some((MOUNT_ATTR_NOEXEC, 0)),
    },
    VfsFlag {
        name: "noatime",
        flag: rustix::mount::MountFlags::NOATIME,
        attr: Some((MOUNT_ATTR_NOATIME, MOUNT_ATTR_ATIME_MASK)),
    },
    VfsFlag {
        name: "strictatime",
        flag: rustix::mount::MountFlags::STRICTATIME,
        attr: Some((MOUNT_ATTR_STRICTATIME, MOUNT_ATTR_ATIME_MASK)),
    },
    VfsFlag {
        name: "nodiratime",
        flag: rustix::mount::MountFlags::NODIRATIME,
        attr: Some((MOUNT_ATTR_NODIRATIME, 0)),
    },
    VfsFlag {
        name: "lazytime",
        flag: rustix::mount::MountFlags::LAZYTIME,
        attr: None,
    },
    VfsFlag {
        name: "sync",
        flag: rustix::mount::MountFlags::SYNCHRONOUS,
        attr: None,
    },
    VfsFlag {
        name: "dirsync",
        flag: rustix::mount::MountFlags::DIRSYNC,
        attr: None,
    },
];

/// The VFS flag named `name`.
///
/// # Errors
/// `EINVAL` for a name that is none.
fn vfs_flag(name: &str) -> SysResult<&'static VfsFlag> {
    VFS_FLAGS
        .iter()
        .find(|f| f.name == name)
        .ok_or(super::Errno::EINVAL)
}

/// Whether SELinux is enabled on this machine (selinuxfs is mounted, as libselinux's
/// `is_selinux_enabled` finds it).
pub fn selinux_enabled() -> bool {
    Path::new("/sys/fs/selinux/enforce").exists()
}

/// Whether the loaded SELinux policy knows `label` (its user, role, type and level):
/// the kernel checks a context written to selinuxfs' `context` file as it checks a
/// `context=` mount option, and refuses an unknown one with `EINVAL` (a mount would
/// fail with a bare "Invalid argument"). `None` when it cannot be asked.
pub fn selinux_context_known(label: &str) -> Option<bool> {
    let file = rustix::fs::open(
        "/sys/fs/selinux/context",
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .ok()?;
    match rustix::io::write(&file, label.as_bytes()) {
        Ok(_) => Some(true),
        Err(rustix::io::Errno::INVAL) => Some(false),
        Err(_) => None,
    }
}

/// Opens `/dev/fuse` and mounts it on `mountpoint` as type `fuse.<subtype>` with
/// `nosuid,nodev` always, returning the connection. Needs `CAP_SYS_ADMIN`.
///
/// # Errors
/// The error of opening `/dev/fuse` or of `mount(2)`.
pub fn mount_fuse(
    source: &str,
    mountpoint: &Path,
    subtype: &str,
    how: FuseMount,
) -> SysResult<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    use rustix::mount::MountFlags;
    let dev = rustix::fs::open("/dev/fuse", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())?;
    let root = rustix::fs::stat(mountpoint)?;
    let mut data = format!(
        "fd={},rootmode={:o},user_id={},group_id={}",
        dev.as_raw_fd(),
        root.st_mode & libc::S_IFMT,
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    );
    if how.default_permissions {
        data.push_str(",default_permissions");
    }
    if how.allow_other {
        data.push_str(",allow_other");
    }
    if let Some(label) = &how.selinux_context {
        data.push_str(&format!(",context=\"{label}\""));
    }
    let mut flags = MountFlags::NOSUID | MountFlags::NODEV;
    for name in &how.flags {
        flags |= vfs_flag(name)?.flag;
    }
    let data = std::ffi::CString::new(data).map_err(|_| super::Errno::EINVAL)?;
    let fstype = format!("fuse.{subtype}");
    rustix::mount::mount(source, mountpoint, fstype.as_str(), flags, data.as_c_str())?;
    Ok(dev)
}

/// Bind-mounts `source` on `target`, `nosuid,nodev` from the moment it is attached.
///
/// The flags must be on the mount before it is attached: a bind made under a shared
/// mount (kubelet's directory, which the node plugin mounts with Bidirectional
/// propagation) is copied at once to every peer (the host's own mount table), and a
/// later remount changes only this namespace's copy. So the bind is cloned detached
/// (`open_tree(OPEN_TREE_CLONE)`), given its flags (`mount_setattr`), then attached
/// (`move_mount`); the copies propagation makes carry the flags. Kernels without
/// `mount_setattr` (before 5.12) get a bind and a remount, as before: flags in this
/// namespace only.
///
/// # Errors
/// The error of the mount calls.
pub fn bind(source: &Path, target: &Path) -> SysResult<()> {
    use rustix::mount::{MoveMountFlags, OpenTreeFlags};
    let tree = rustix::mount::open_tree(
        rustix::fs::CWD,
        source,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    );
    let tree = match tree {
        Ok(t) => t,
        Err(rustix::io::Errno::NOSYS) => return bind_then_remount(source, target),
        Err(e) => return Err(super::failed("open_tree")(e)),
    };
    match set_nosuid_nodev(&tree) {
        Ok(()) => {}
        Err(e) if e == super::Errno::ENOSYS => return bind_then_remount(source, target),
        Err(e) => return Err(e),
    }
    rustix::mount::move_mount(
        &tree,
        c"",
        rustix::fs::CWD,
        target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(super::failed("move_mount"))?;
    // Keep mounts made under the bind (none expected) to this namespace.
    let _ = rustix::mount::mount_change(target, rustix::mount::MountPropagationFlags::PRIVATE);
    Ok(())
}

/// `MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV` (include/uapi/linux/mount.h).
const MOUNT_ATTR_NOSUID_NODEV: u64 = 0x2 | 0x4;

/// `struct mount_attr` (include/uapi/linux/mount.h, `MOUNT_ATTR_SIZE_VER0`).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Sets `nosuid,nodev` on a detached mount.
///
/// # Errors
/// The error of `mount_setattr(2)` (`ENOSYS` before Linux 5.12).
fn set_nosuid_nodev(tree: &OwnedFd) -> SysResult<()> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_NOSUID_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    mount_setattr(tree, false, &attr)
}

/// Safe wrapper for `mount_setattr(2)` on the mount `tree` (and, with `recursive`, the
/// mounts below it).
///
/// # Errors
/// The error of `mount_setattr(2)` (`ENOSYS` before Linux 5.12).
fn mount_setattr(tree: &OwnedFd, recursive: bool, attr: &MountAttr) -> SysResult<()> {
    let mut at = libc::AT_EMPTY_PATH;
    if recursive {
        at |= libc::AT_RECURSIVE;
    }
    // SAFETY: `tree` is an open mount descriptor, the path is an empty C string, and
    // `attr` is a `struct mount_attr` of the size passed; the kernel only reads it.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            at,
            std::ptr::from_ref(attr),
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc < 0 {
        return Err(super::failed("mount_setattr")(
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// The bind of kernels before 5.12: flags in this mount namespace only.
fn bind_then_remount(source: &Path, target: &Path) -> SysResult<()> {
    use rustix::mount::{MountFlags, MountPropagationFlags};
    rustix::mount::mount_bind(source, target)?;
    // A bind takes its flags from the source mount; a remount sets ours.
    let flags = MountFlags::BIND | MountFlags::NOSUID | MountFlags::NODEV;
    if let Err(e) = rustix::mount::mount_remount(target, flags, c"") {
        let _ = unmount_lazy(target);
        return Err(e.into());
    }
    let _ = rustix::mount::mount_change(target, MountPropagationFlags::PRIVATE);
    Ok(())
}

/// Mounts a tmpfs on `target` with `options` (`mode=`, `size=`, ...), always
/// `nosuid,nodev,noexec`.
///
/// # Errors
/// The error of `mount(2)`.
pub fn mount_tmpfs(target: &Path, options: &str) -> SysResult<()> {
    use rustix::mount::MountFlags;
    let data = std::ffi::CString::new(options).map_err(|_| super::Errno::EINVAL)?;
    Ok(rustix::mount::mount(
        "tmpfs",
        target,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        data.as_c_str(),
    )?)
}

/// `MOUNT_ATTR_IDMAP` (`include/uapi/linux/mount.h`).
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// A detached clone of the mount at `source` whose IDs are mapped through the user
/// namespace `userns` (an open `/proc/PID/ns/user`), as a container runtime makes one
/// of a volume for a container in a user namespace: runc's `mountFd`
/// (libcontainer/mount_linux.go) and crun's `maybe_get_idmapped_mount`
/// (src/libcrun/linux.c) call `open_tree(OPEN_TREE_CLONE)` and then
/// `mount_setattr(MOUNT_ATTR_IDMAP)`. With `recursive`, the mounts below `source` are
/// cloned and mapped too (`AT_RECURSIVE`, runc's `rbind` with `ridmap`). Attach it
/// with [`attach_detached`]; dropping it unattached releases it.
///
/// # Errors
/// The error of `open_tree(2)`, or of `mount_setattr(2)`: `EINVAL` where the file
/// system under `source` cannot be idmapped (a FUSE mount whose server did not
/// declare `FUSE_ALLOW_IDMAP`, a kernel before 5.12), `EPERM` for the initial user
/// namespace or without `CAP_SYS_ADMIN`.
pub fn idmapped_clone(
    source: &Path,
    userns: std::os::fd::BorrowedFd<'_>,
    recursive: bool,
) -> SysResult<OwnedFd> {
    use rustix::mount::OpenTreeFlags;
    let mut flags = OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC;
    if recursive {
        flags |= OpenTreeFlags::AT_RECURSIVE;
    }
    let tree = rustix::mount::open_tree(rustix::fs::CWD, source, flags)
        .map_err(super::failed("open_tree"))?;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    mount_setattr(&tree, recursive, &attr)?;
    Ok(tree)
}

/// `MOUNT_ATTR_RDONLY`, `MOUNT_ATTR_NOEXEC`, the access-time attributes
/// (`include/uapi/linux/mount.h`).
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const MOUNT_ATTR_ATIME_MASK: u64 = 0x70;
const MOUNT_ATTR_NOATIME: u64 = 0x10;
const MOUNT_ATTR_STRICTATIME: u64 = 0x20;
const MOUNT_ATTR_NODIRATIME: u64 = 0x80;

/// A native view's mount, detached: a clone of the mount at `source` (not of the
/// mounts below it, which views do not cross either), idmapped through `userns`, and
/// always `nosuid,nodev`, with the VFS `flags` asked for ([`VFS_FLAGS`] a mount can be
/// given), all set in one
/// `mount_setattr(2)` before it is attached anywhere. Attach it with
/// [`attach_detached`].
///
/// # Errors
/// The error of `open_tree(2)` or `mount_setattr(2)` (`EINVAL`: the file system cannot
/// be idmapped, or a flag is not one a mount can be given).
pub fn native_view(
    source: &Path,
    userns: std::os::fd::BorrowedFd<'_>,
    flags: &[&str],
) -> SysResult<OwnedFd> {
    use rustix::mount::OpenTreeFlags;
    let tree = rustix::mount::open_tree(
        rustix::fs::CWD,
        source,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )
    .map_err(super::failed("open_tree"))?;
    let mut set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID_NODEV;
    let mut clr = 0;
    for name in flags {
        let (on, off) = vfs_flag(name)?.attr.ok_or(super::Errno::EINVAL)?;
        set |= on;
        clr |= off;
    }
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clr,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    mount_setattr(&tree, false, &attr)?;
    Ok(tree)
}

/// Whether the file system under `path` can be idmapped: a detached clone of its mount
/// is idmapped with `userns` and released, nothing attached.
///
/// # Errors
/// `EINVAL` where it cannot be, or the error of `open_tree(2)`.
pub fn can_idmap(path: &Path, userns: std::os::fd::BorrowedFd<'_>) -> SysResult<()> {
    idmapped_clone(path, userns, false).map(drop)
}

/// Whether entries can be made through an idmapped mount of the file system under
/// `path` (idmapped with `userns`): a directory is made and removed through a detached
/// idmapped clone, nothing attached. The CephFS client answers such a creation `EIO`
/// where the MDS does not take the owner of a creation from the client
/// (`CEPHFS_FEATURE_HAS_OWNER_UIDGID`, fs/ceph/mds_client.c), though the mount itself
/// can be idmapped.
///
/// # Errors
/// What [`idmapped_clone`] said, or the error of the creation.
pub fn idmapped_creates(path: &Path, userns: std::os::fd::BorrowedFd<'_>) -> SysResult<()> {
    use rustix::fs::{AtFlags, Mode, mkdirat, unlinkat};
    // A name of this probe's own: other nodes probe the same share.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let probe = format!(".mountgroup-idmap-probe-{}-{nanos}", std::process::id());
    let tree = idmapped_clone(path, userns, false)?;
    mkdirat(&tree, probe.as_str(), Mode::RWXU).map_err(super::failed("mkdirat"))?;
    unlinkat(&tree, probe.as_str(), AtFlags::REMOVEDIR).map_err(super::failed("unlinkat"))
}

/// A mount of a file system that honours set-id bits, file capabilities or device
/// nodes: its mount point, as the mount table that lists it names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Honouring {
    /// The mount point, and in brackets the mount table's reader (`self`, `pid 1`).
    pub mountpoint: String,
    /// What it lacks: `nosuid`, `nodev` or both.
    pub lacks: &'static str,
}

/// Every mount, in this process's mount namespace and in PID 1's (the host's, for a
/// container run with `hostPID`), of the file system `path` is on that is not both
/// `nosuid` and `nodev`: the places where a set-id file, a file capability or a device
/// node made on that file system would work. The file system is the superblock of the
/// mount `path` is on (`statx(STATX_MNT_ID)`, Linux 5.8+), found in mountinfo as its
/// device, which every mount of it shares: a bind mount, a second mount of the same
/// block device, another subvolume of the same btrfs. What the two flags stop is the
/// kernel's: on a `nosuid` mount exec takes no set-id bit (fs/exec.c `bprm_fill_uid`
/// asks `mnt_may_suid`) and no file capability (security/commoncap.c
/// `get_file_caps`), and on a `nodev` one no device node opens (fs/namei.c
/// `may_open_dev`).
///
/// # Errors
/// The error of `statx(2)` or of reading this process's mountinfo, or `ENOENT` when
/// mountinfo does not list the mount (a kernel before 5.8 gives no mount id:
/// `EOPNOTSUPP`). PID 1's mountinfo is read where it can be, and skipped (as the same
/// namespace) where it cannot.
pub fn mounts_honouring_set_id(path: &Path) -> SysResult<Vec<Honouring>> {
    use super::process::mount_namespace;
    let id = mount_id(path)?;
    let own =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| super::Errno::from_io(&e))?;
    let device = device_of_mount_in(&own, id).ok_or(super::Errno(libc::ENOENT))?;
    let mut found = honouring_in(&own, device, "self");
    if mount_namespace("self") != mount_namespace("1") {
        if let Ok(host) = std::fs::read_to_string("/proc/1/mountinfo") {
            found.extend(honouring_in(&host, device, "pid 1"));
        }
    }
    Ok(found)
}

/// The super options (mountinfo's last field: the file system's own, `sec=sys` and
/// `vers=4.2` for NFS) of the mount that holds `path`.
///
/// # Errors
/// The error of `statx` or of reading mountinfo; `ENOENT` where the mount is not
/// listed.
pub fn super_options(path: &Path) -> SysResult<String> {
    let id = mount_id(path)?;
    let info =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| super::Errno::from_io(&e))?;
    super_options_in(&info, id).ok_or(super::Errno(libc::ENOENT))
}

fn super_options_in(mountinfo: &str, id: u64) -> Option<String> {
    let mut rest = line_of_mount(mountinfo, id)?
        .split(' ')
        .skip_while(|f| *f != "-")
        .skip(3);
    rest.next().map(str::to_string)
}

/// The id of the mount that holds `path` (`statx`'s `STATX_MNT_ID`, Linux 5.8).
///
/// # Errors
/// The error of `statx(2)`; `EOPNOTSUPP` where the kernel gives no mount id.
fn mount_id(path: &Path) -> SysResult<u64> {
    let sx = rustix::fs::statx(rustix::fs::CWD, path, AtFlags::empty(), StatxFlags::MNT_ID)
        .map_err(super::failed("statx"))?;
    if sx.stx_mask & StatxFlags::MNT_ID.bits() == 0 {
        return Err(super::Errno(libc::EOPNOTSUPP));
    }
    Ok(sx.stx_mnt_id)
}

/// The line of the mount with id `id` in `mountinfo`.
fn line_of_mount(mountinfo: &str, id: u64) -> Option<&str> {
    mountinfo
        .lines()
        .find(|l| l.split(' ').next().and_then(|f| f.parse::<u64>().ok()) == Some(id))
}

/// The device (`major`, `minor`) of the mount with id `id` in `mountinfo`.
fn device_of_mount_in(mountinfo: &str, id: u64) -> Option<(u32, u32)> {
    device_of_line(line_of_mount(mountinfo, id)?)
}

/// The mounts of `device` in `mountinfo` whose per-mount options lack `nosuid` or
/// `nodev`.
fn honouring_in(mountinfo: &str, device: (u32, u32), reader: &str) -> Vec<Honouring> {
    let want = format!("{}:{}", device.0, device.1);
    mountinfo
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            if f.get(2) != Some(&want.as_str()) {
                return None;
            }
            let opts = f.get(5)?;
            let has = |o: &str| opts.split(',').any(|x| x == o);
            let lacks = match (has("nosuid"), has("nodev")) {
                (true, true) => return None,
                (false, true) => "nosuid",
                (true, false) => "nodev",
                (false, false) => "nosuid,nodev",
            };
            let point = String::from_utf8_lossy(&unescape(f.get(4)?)).into_owned();
            Some(Honouring {
                mountpoint: format!("{point} ({reader})"),
                lacks,
            })
        })
        .collect()
}

/// Attaches a detached mount (from [`idmapped_clone`]) at `target`, as a runtime moves
/// a volume into a container's root (`move_mount(MOVE_MOUNT_F_EMPTY_PATH)`).
///
/// # Errors
/// The error of `move_mount(2)`.
pub fn attach_detached(tree: std::os::fd::BorrowedFd<'_>, target: &Path) -> SysResult<()> {
    rustix::mount::move_mount(
        tree,
        c"",
        rustix::fs::CWD,
        target,
        rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(super::failed("move_mount"))
}

/// The file system type mounted at exactly `path` (the topmost mount there), from
/// `/proc/self/mountinfo`, or `None` when nothing is mounted there.
///
/// # Errors
/// The error of reading mountinfo.
pub fn mount_type(path: &Path) -> SysResult<Option<String>> {
    let info =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| super::Errno::from_io(&e))?;
    Ok(mount_type_in(&info, path))
}

fn mount_type_in(mountinfo: &str, path: &Path) -> Option<String> {
    let mut rest = topmost_at(mountinfo, path)?
        .split(' ')
        .skip_while(|f| *f != "-");
    rest.next();
    rest.next().map(str::to_string)
}

/// Whether the topmost mount at exactly `path` is idmapped (mountinfo's per-mount
/// option `idmapped`, Linux 5.12+).
///
/// # Errors
/// The error of reading mountinfo.
pub fn is_idmapped(path: &Path) -> SysResult<bool> {
    let info =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| super::Errno::from_io(&e))?;
    Ok(topmost_at(&info, path)
        .and_then(|l| l.split(' ').nth(5))
        .is_some_and(|opts| opts.split(',').any(|o| o == "idmapped")))
}

/// The mountinfo line of the topmost mount at exactly `path`: later lines are mounted
/// on top of earlier ones. A line is `id parent major:minor root mountpoint options
/// [optional...] - fstype source super`.
fn topmost_at<'a>(mountinfo: &'a str, path: &Path) -> Option<&'a str> {
    let want = path.as_os_str().as_encoded_bytes();
    mountinfo
        .lines()
        .rfind(|line| line.split(' ').nth(4).is_some_and(|m| unescape(m) == want))
}

/// Undoes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// How a mount point is doing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// A live mount of the given type.
    Mounted(String),
    /// A FUSE mount whose daemon is gone ("transport endpoint is not connected").
    Dead,
    /// Nothing is mounted there (or the path does not exist).
    NotMounted,
}

/// Tells whether `path` holds a live mount, a dead FUSE mount, or nothing.
pub fn health(path: &Path) -> Health {
    let stat = std::fs::symlink_metadata(path)
        .err()
        .map(|e| e.raw_os_error().unwrap_or(libc::EIO));
    health_of(stat, || mount_type(path).ok().flatten())
}

/// [`health`] from what `stat` of the mount point said (`Some(errno)` where it
/// failed) and the mount table's type of what is mounted there. Only `ENOTCONN` says
/// a FUSE mount's daemon is gone; another error is what the mount answers (a view
/// whose network share's server is away answers `EIO` or `EHOSTDOWN`), and the mount
/// is still there: never to be served again on top of itself.
fn health_of(stat: Option<i32>, mounted: impl FnOnce() -> Option<String>) -> Health {
    if stat == Some(libc::ENOTCONN) {
        return Health::Dead;
    }
    match mounted() {
        Some(t) => Health::Mounted(t),
        None => Health::NotMounted,
    }
}

/// A parameter of a new mount, as `fsconfig(2)` takes it: a key with a string value,
/// or a flag.
#[derive(Clone, Copy)]
pub enum FsParam<'a> {
    Str(&'a str, &'a str),
    Flag(&'a str),
}

impl std::fmt::Debug for FsParam<'_> {
    /// The key only: values may be passwords and keys.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FsParam::Str(k, _) => write!(f, "{k}=<value>"),
            FsParam::Flag(k) => f.write_str(k),
        }
    }
}

/// Why a new mount failed: the step, the key it was given (never a value), the error,
/// and what the file system said of it (its `fs_context` log, `e `/`w `/`i ` lines).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsMountError {
    pub call: &'static str,
    pub key: Option<String>,
    pub errno: super::Errno,
    pub said: Vec<String>,
}

impl std::fmt::Display for FsMountError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.call)?;
        if let Some(k) = &self.key {
            write!(f, " of {k}")?;
        }
        write!(f, ": {}", self.errno)?;
        if !self.said.is_empty() {
            write!(f, " ({})", self.said.join("; "))?;
        }
        Ok(())
    }
}

/// Makes a new superblock of `fstype` with `params` and a detached mount of it, always
/// `nosuid,nodev` (and read-only with `readonly`), attached nowhere: the new mount API
/// (`fsopen`, `fsconfig`, `FSCONFIG_CMD_CREATE`, `fsmount`), which takes each value
/// apart, so that a password or key reaches the kernel as it is (no comma escaping, no
/// command line, nothing in the mount table's options where the file system hides it).
/// Attach it with [`attach_detached`]; dropping it unattached releases it, so a mount
/// given up on half way leaves nothing mounted.
///
/// # Errors
/// The failing step, with the file system's own messages.
pub fn new_mount(
    fstype: &str,
    params: &[FsParam<'_>],
    readonly: bool,
) -> Result<OwnedFd, FsMountError> {
    use rustix::mount::{FsMountFlags, FsOpenFlags, MountAttrFlags};
    let fs =
        rustix::mount::fsopen(fstype, FsOpenFlags::FSOPEN_CLOEXEC).map_err(|e| FsMountError {
            call: "fsopen",
            key: Some(fstype.to_string()),
            errno: e.into(),
            said: Vec::new(),
        })?;
    let failed = |call, key: Option<&str>, e: rustix::io::Errno| FsMountError {
        call,
        key: key.map(str::to_string),
        errno: e.into(),
        said: fs_log(&fs),
    };
    for p in params {
        let done = match *p {
            FsParam::Str(k, v) => rustix::mount::fsconfig_set_string(&fs, k, v).map_err(|e| (k, e)),
            FsParam::Flag(k) => rustix::mount::fsconfig_set_flag(&fs, k).map_err(|e| (k, e)),
        };
        done.map_err(|(k, e)| failed("fsconfig", Some(k), e))?;
    }
    rustix::mount::fsconfig_create(&fs).map_err(|e| failed("the mount", None, e))?;
    let mut attrs = MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV;
    if readonly {
        attrs |= MountAttrFlags::MOUNT_ATTR_RDONLY;
    }
    rustix::mount::fsmount(&fs, FsMountFlags::FSMOUNT_CLOEXEC, attrs)
        .map_err(|e| failed("fsmount", None, e))
}

/// What the file system wrote to the log of the configuration `fs`, one message per
/// read until there is none (`ENODATA`).
fn fs_log(fs: &OwnedFd) -> Vec<String> {
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    while out.len() < 16 {
        match rustix::io::read(fs, &mut buf) {
            Ok(n) if n > 0 => out.push(String::from_utf8_lossy(&buf[..n]).trim().to_string()),
            _ => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new mount takes its values apart and says what the file system refused; a
    /// detached one attaches `nosuid,nodev`, and one dropped unattached leaves nothing.
    #[test]
    fn a_new_mount_is_made_detached_and_names_what_was_refused() {
        let dir = tempfile::tempdir().unwrap();
        let bad = new_mount("tmpfs", &[FsParam::Str("size", "lots")], false).unwrap_err();
        assert_eq!((bad.call, bad.key.as_deref()), ("fsconfig", Some("size")));
        assert_eq!(bad.errno, super::super::Errno::EINVAL);
        assert!(bad.said.iter().any(|m| m.contains("size")), "{bad}");
        assert!(!format!("{:?}", FsParam::Str("password", "s3cret")).contains("s3cret"));
        let unknown = new_mount("nosuchfs", &[], false).unwrap_err();
        assert_eq!(unknown.call, "fsopen");
        drop(new_mount("tmpfs", &[FsParam::Str("size", "1m")], false).unwrap());
        assert!(!is_mount_point(dir.path()).unwrap());
        let m = new_mount(
            "tmpfs",
            &[FsParam::Str("size", "1m"), FsParam::Str("mode", "0700")],
            true,
        )
        .unwrap();
        attach_detached(std::os::fd::AsFd::as_fd(&m), dir.path()).unwrap();
        let line = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .rfind(|l| l.split(' ').nth(4) == dir.path().to_str())
            .unwrap()
            .to_string();
        unmount_lazy(dir.path()).unwrap();
        let opts = line.split(' ').nth(5).unwrap();
        for o in ["ro", "nosuid", "nodev"] {
            assert!(opts.split(',').any(|x| x == o), "{line}");
        }
    }

    #[test]
    fn a_mount_that_answers_errors_is_still_mounted() {
        let fuse = || Some("fuse.mountgroup".to_string());
        assert_eq!(health_of(Some(libc::ENOTCONN), fuse), Health::Dead);
        for errno in [libc::EIO, libc::EHOSTDOWN, libc::EACCES] {
            assert_eq!(
                health_of(Some(errno), fuse),
                Health::Mounted("fuse.mountgroup".into())
            );
        }
        assert_eq!(health_of(Some(libc::ENOENT), || None), Health::NotMounted);
        assert_eq!(health_of(None, || None), Health::NotMounted);
        assert_eq!(
            health_of(None, fuse),
            Health::Mounted("fuse.mountgroup".into())
        );
    }

    #[test]
    fn mountinfo_lines_are_read_with_escapes_and_stacking() {
        let info = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 22 0:50 / /tmp/a\\040b rw,nosuid - fuse.mountgroup /src rw,user_id=0
41 40 0:51 / /tmp/a\\040b rw - fuse.other /x rw
42 22 0:52 / /mnt rw master:3 - tmpfs tmpfs rw
";
        // The device of the topmost mount at a path, as a view finds its own.
        assert_eq!(mount_device_in(info, Path::new("/tmp/a b")), Some((0, 51)));
        assert_eq!(mount_device_in(info, Path::new("/")), Some((8, 1)));
        assert_eq!(mount_device_in(info, Path::new("/tmp")), None);
        assert_eq!(
            mount_type_in(info, Path::new("/tmp/a b")),
            Some("fuse.other".into())
        );
        assert_eq!(mount_type_in(info, Path::new("/mnt")), Some("tmpfs".into()));
        assert_eq!(mount_type_in(info, Path::new("/tmp")), None);
    }

    #[test]
    fn a_mounts_super_options_are_its_last_field() {
        let info = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
50 22 0:60 / /share rw,nosuid,nodev,relatime shared:9 - nfs4 127.0.0.1:/srv rw,vers=4.2,sec=sys,clientaddr=127.0.0.1
51 22 0:61 / /krb rw master:3 - nfs 10.0.0.1:/x rw,vers=3,sec=krb5p
";
        assert_eq!(
            super_options_in(info, 50).as_deref(),
            Some("rw,vers=4.2,sec=sys,clientaddr=127.0.0.1")
        );
        assert_eq!(
            super_options_in(info, 51).as_deref(),
            Some("rw,vers=3,sec=krb5p")
        );
        assert_eq!(super_options_in(info, 22).as_deref(), Some("rw"));
        assert_eq!(super_options_in(info, 99), None);
    }

    #[test]
    fn every_mount_of_a_file_system_is_checked_for_nosuid_nodev() {
        let info = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 7:0 / /srv/share rw,nosuid,nodev - ext4 /dev/loop0 rw
31 22 7:0 /volumes /mnt/second rw,nodev - ext4 /dev/loop0 rw
32 22 8:1 /srv/dir /srv/dir rw,nosuid,nodev - ext4 /dev/vda rw
33 22 7:1 / /srv/other\\040x rw - ext4 /dev/loop1 rw
";
        assert_eq!(device_of_mount_in(info, 30), Some((7, 0)));
        assert_eq!(device_of_mount_in(info, 32), Some((8, 1)));
        assert_eq!(device_of_mount_in(info, 99), None);
        assert_eq!(
            honouring_in(info, (7, 0), "self"),
            [Honouring {
                mountpoint: "/mnt/second (self)".into(),
                lacks: "nosuid"
            }]
        );
        // A directory bound onto itself nosuid,nodev: the file system's own mount is not.
        assert_eq!(
            honouring_in(info, (8, 1), "pid 1"),
            [Honouring {
                mountpoint: "/ (pid 1)".into(),
                lacks: "nosuid,nodev"
            }]
        );
        assert_eq!(
            honouring_in(info, (7, 1), "self")[0].mountpoint,
            "/srv/other x (self)"
        );
    }
}
