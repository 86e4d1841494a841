//! The shares volumes live on, one file per kind: the share root (`local.rs`, our
//! stand-in for an Azure Files account: `volumes/<id>/` and `meta/<id>.json` under a
//! marker, behind the [`Share`] trait), and the shares a class or a PV names, which the
//! driver mounts (`remote.rs` lists them; `smb.rs`, `nfs.rs` and `cephfs.rs` each say
//! what their kind is through `named::NamedShare`; `made.rs` makes a dynamic volume's
//! directory on one). This file holds what every kind uses: volume ids and records,
//! and the probes of what a share keeps (owners, extended attributes, set-id bits) and
//! whether it can be idmapped. The share never chowns anything; mountgroup's views
//! supply the group semantics.
//!
//! Capacity is enforced where the share's file system can: on btrfs each volume is a
//! subvolume with a quota-group limit (`btrfs.rs`), on CephFS a directory quota.
//! Elsewhere it is advisory: recorded and reported, not enforced, which the driver
//! says once when it starts.

pub mod btrfs;
pub mod cephfs;
pub mod key;
pub mod local;
pub mod made;
pub mod named;
pub mod nfs;
pub mod remote;
pub mod smb;

pub use local::{LocalShare, MARKER, ShareInit};

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::sys::Errno;

/// The longest volume id (and name) accepted: the CSI string limit.
pub const MAX_ID_LEN: usize = 128;

/// A volume's id. It is also a directory name in the share, so it is restricted to
/// `[A-Za-z0-9._-]`, starts with a letter or digit, and is at most 128 bytes: it can
/// never name a path outside the share (no `/`, no `..`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct VolumeId(String);

impl VolumeId {
    /// Validates a volume id (or a volume name, which becomes the id).
    ///
    /// # Errors
    /// A message saying what is wrong with it.
    pub fn parse(s: &str) -> Result<VolumeId, String> {
        if s.is_empty() {
            return Err("is empty".into());
        }
        if s.len() > MAX_ID_LEN {
            return Err(format!("is longer than {MAX_ID_LEN} bytes"));
        }
        if !s.as_bytes()[0].is_ascii_alphanumeric() {
            return Err("must start with a letter or digit".into());
        }
        if let Some(c) = s
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(format!(
                "contains {c:?}; only letters, digits, '.', '_' and '-' are allowed"
            ));
        }
        Ok(VolumeId(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for VolumeId {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        VolumeId::parse(&s)
    }
}

impl From<VolumeId> for String {
    fn from(v: VolumeId) -> String {
        v.0
    }
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A volume as CSI calls name it: a share root's [`VolumeId`], the id of a volume the
/// driver made on a named share, or a static PV's `volumeHandle`, whatever its author
/// wrote (printable, checked where requests are read). It names no path: the node
/// keeps it in its state and hashes it for names on disk.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct VolumeHandle(String);

impl VolumeHandle {
    pub fn new(s: impl Into<String>) -> VolumeHandle {
        VolumeHandle(s.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The share root's volume it names, if it is one's id.
    pub fn root(&self) -> Option<VolumeId> {
        VolumeId::parse(&self.0).ok()
    }
}

impl From<VolumeId> for VolumeHandle {
    fn from(id: VolumeId) -> VolumeHandle {
        VolumeHandle(id.0)
    }
}

impl From<&VolumeId> for VolumeHandle {
    fn from(id: &VolumeId) -> VolumeHandle {
        VolumeHandle(id.0.clone())
    }
}

impl fmt::Display for VolumeHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the share records of a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub id: VolumeId,
    pub name: String,
    pub capacity_bytes: u64,
    pub parameters: BTreeMap<String, String>,
    pub created_unix: u64,
    /// The volume's own group on disk, for a native volume or one whose views act as
    /// their callers (`owners`): its root is setgid in it, so every entry made through
    /// any of its views is born in it, and each publish shows it as the pod's fsGroup
    /// (docs/SEMANTICS.md, *Native views*). `None` for a volume made before native
    /// views, on a share that can neither be idmapped nor keep its callers' owners, or
    /// with the StorageClass parameter `view: fuse`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<u32>,
    /// Whether the share keeps the volume's owners itself and its views act as their
    /// callers on it ([`Share::keeps_owners`]; docs/SEMANTICS.md, `ownership=share`):
    /// made so on an NFS share, which cannot be idmapped. Its root belongs to
    /// whoever the server makes of the driver (nobody, where it squashes root).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub owners: bool,
    /// Why a volume asked to be native (no `view: fuse`) has no group: what stood in
    /// the way at CreateVolume. Each publish of it names this reason. It stays a FUSE
    /// volume when the share qualifies later: what its views made is owned by its
    /// creators' groups, which a native view would not show as the pod's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_native: Option<String>,
}

/// The first of the groups native volumes get on disk: far above the IDs of users,
/// of systemd's dynamic users and of the user namespaces kubelet gives pods, below
/// 2^31 for tools that read a gid as a signed number.
pub const NATIVE_GROUP_BASE: u32 = 2_000_000_000;

/// The mode of a native volume's root: setgid, so that what is made in it is born in
/// the volume's group, and writable by that group.
pub const NATIVE_ROOT_MODE: u32 = 0o2775;

/// What a CreateVolume asks of the share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeSpec {
    pub id: VolumeId,
    pub name: String,
    pub capacity_bytes: u64,
    pub parameters: BTreeMap<String, String>,
    /// Whether the volume should be native where the share can be idmapped.
    pub native: bool,
}

/// The result of a create: made now, or found as it was asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Created {
    New(VolumeRecord),
    Existing(VolumeRecord),
}

/// Why the share could not do something.
#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    #[error("{what}: {errno}")]
    Io { what: String, errno: Errno },
    #[error("volume {0} exists with another capacity or other parameters")]
    Conflict(VolumeId),
    #[error("the metadata of volume {id} cannot be read: {why}")]
    Corrupt { id: VolumeId, why: String },
    #[error("{0}")]
    Backend(String),
    /// The share root is not (or no longer) the share: nothing is done there.
    #[error("{0}")]
    NotThere(String),
    /// A named share's server refused the credentials or the node.
    #[error("{0}")]
    Refused(String),
    /// A named share's server cannot be reached, or does not serve it now.
    #[error("{0}")]
    Unreachable(String),
    /// A named share's server has no such share or directory.
    #[error("{0}")]
    NoSuchShare(String),
    /// A named share's client refused the options, or the share is malformed.
    #[error("{0}")]
    Rejected(String),
    /// A named share's server did not answer within the call's deadline.
    #[error("{0}")]
    TimedOut(String),
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ShareError {
    let what = what.into();
    move |e| ShareError::Io {
        what,
        errno: Errno::from_io(&e),
    }
}

/// A share of volumes.
pub trait Share: Send + Sync {
    /// Creates a volume, or finds it if one with the same id exists and is compatible.
    fn create(&self, spec: &VolumeSpec) -> Result<Created, ShareError>;
    /// The record of a volume, if it exists.
    fn get(&self, id: &VolumeId) -> Result<Option<VolumeRecord>, ShareError>;
    /// Deletes a volume and its data; deleting an absent volume succeeds.
    fn delete(&self, id: &VolumeId) -> Result<(), ShareError>;
    /// Every volume, ordered by id.
    fn list(&self) -> Result<Vec<VolumeRecord>, ShareError>;
    /// Where the volume's data lives on this node.
    fn data_path(&self, id: &VolumeId) -> PathBuf;
    /// Bytes the share can still give.
    fn available_bytes(&self) -> Result<u64, ShareError>;
    /// Whether the share is reachable.
    fn check(&self) -> Result<(), ShareError>;
    /// Records a new capacity for a volume (ControllerExpandVolume).
    fn set_capacity(&self, id: &VolumeId, bytes: u64) -> Result<VolumeRecord, ShareError>;
    /// Makes the recorded capacity the enforced one (NodeExpandVolume); a no-op when
    /// capacity is advisory.
    fn apply_capacity(&self, rec: &VolumeRecord) -> Result<(), ShareError>;
    /// Whether applying the recorded capacity would change nothing: it is enforced
    /// already, or capacity is advisory here.
    fn capacity_applied(&self, rec: &VolumeRecord) -> bool;
    /// How capacity is held.
    fn capacity(&self) -> &CapacityMode;
    /// The enforced limit of a volume's directory and the bytes it holds, where
    /// capacity is enforced and both can be read: what its pods' `df` would show if
    /// their mount's `statfs` asked the volume, which a native view's does not (it is
    /// the share's file system's).
    fn volume_bytes(&self, id: &VolumeId) -> Option<(u64, u64)>;
    /// Whether a native view of its volumes may be mounted on this node, or why not.
    fn native_capable(&self) -> Result<(), String>;
    /// Whether the share keeps each file's owner itself and checks each call's
    /// permissions as its caller's, so that a view acting as its callers gives them
    /// their own files on the server (the kernel's NFS client with `sec=sys`), or why
    /// not.
    fn keeps_owners(&self) -> Result<(), String>;
    /// Whether the share's file system keeps extended attributes named like `name`
    /// (a probe name of a view's records' namespace, written and removed), or why
    /// not: SMB without EA support, NFS (no `trusted.*` namespace), FAT.
    fn keeps_xattr(&self, name: &std::ffi::CStr) -> Result<(), String>;
    /// Gives a native volume's root back what every pod of it relies on (owner root, or
    /// for an `owners` volume whoever the server makes of the driver; the volume's
    /// group; `2775`) where a pod changed it; returns whether it did.
    fn keep_native_root(&self, rec: &VolumeRecord) -> Result<bool, ShareError>;
}

/// How a share holds volumes to their capacity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CapacityMode {
    /// The kernel refuses writes past the capacity (btrfs quota groups, CephFS
    /// directory quotas).
    Enforced,
    /// Recorded and reported, not enforced; the reason says why.
    Advisory(String),
}

/// Gives the new volume directory `data` the group `group`, setgid, as a member of
/// that group (a squashed driver owns what it made, but may only give it a group it
/// is in), and checks that the server keeps the owner a caller makes files with:
/// an export that squashes every caller (`all_squash`) does not, and gets the
/// directory back as it was.
///
/// # Errors
/// Why the volume's views cannot act as their callers.
pub fn owners_root(data: &Path, group: u32) -> Result<(), String> {
    use crate::sys::file;
    let failed = |what: &str, e: Errno| format!("{what} {}: {e}", data.display());
    let root = file::open_root(data).map_err(|e| failed("volume directory", e))?;
    let fd = std::os::fd::AsFd::as_fd(&root);
    let was = file::stat(fd).map_err(|e| failed("volume directory", e))?;
    {
        let _member = crate::sys::creds::act_as(0, group, &[group])
            .map_err(|e| failed("acting in the volume's group for", e))?;
        file::chown(fd, None, Some(group)).map_err(|e| {
            format!(
                "the server refused the driver, a member of the volume's group {group}, that group for {} ({e}): an export that squashes every caller (all_squash) keeps none of a caller's ids, so a pod could not own what it makes",
                data.display()
            )
        })?;
        file::chmod(fd, NATIVE_ROOT_MODE).map_err(|e| failed("chmod of", e))?;
    }
    let probed = probe_owner(fd, group);
    if probed.is_err() {
        let _member = crate::sys::creds::act_as(0, group, &[group, was.gid]);
        if let Err(e) =
            file::chown(fd, None, Some(was.gid)).and_then(|()| file::chmod(fd, was.perm))
        {
            tracing::warn!(dir = %data.display(), error = %e, "cannot give the volume directory its group and mode back");
        }
    }
    probed
}

/// The uid a new owners volume's probe makes a file as: one a pod might run as.
const PROBE_UID: u32 = crate::sys::creds::SOME_CALLER_UID;

/// Whether the server keeps the owner a caller makes a file with: a file made in the
/// directory `dir` (of the group `group`) as [`PROBE_UID`], a member of `group`, is
/// that uid's, and is removed.
///
/// # Errors
/// Why not: the owner the server gave it, or what failed.
pub(crate) fn probe_owner(dir: std::os::fd::BorrowedFd<'_>, group: u32) -> Result<(), String> {
    use crate::sys::file;
    let name = std::ffi::OsStr::new(".mountgroup-owner-probe");
    let made = {
        let _caller = crate::sys::creds::act_as(PROBE_UID, group, &[group])
            .map_err(|e| format!("acting as uid {PROBE_UID}: {e}"))?;
        let _ = file::unlink(dir, name, file::Remove::NonDirectory);
        file::create_file(dir, name, 0o600).and_then(|f| file::stat(std::os::fd::AsFd::as_fd(&f)))
    };
    let _ = file::unlink(dir, name, file::Remove::NonDirectory);
    match made {
        Ok(st) if st.uid == PROBE_UID => Ok(()),
        Ok(st) => Err(format!(
            "the server does not keep its callers' owners: a file made as uid {PROBE_UID} became uid {}'s (an export with all_squash, or anonuid for every caller), so a pod could not own what it makes",
            st.uid
        )),
        Err(e) => Err(format!(
            "a file made as uid {PROBE_UID} in the group {group} failed ({e}): the server refuses its callers' own ids"
        )),
    }
}

/// Removes `name` in the directory `parent` (owned by `parent_owner`, uid and gid)
/// and, for a directory, everything in it. With a `group` (a volume whose views act
/// as their callers), each directory is emptied as its owner (with the volume's group
/// and its own), who may give themselves the access a directory of theirs denies
/// them: on a share that keeps owners, a squashed driver owns nothing a pod made.
/// Without one, as the driver. Names are taken one at a time, never followed (a
/// symlink is removed, a mount point refused with `EXDEV`).
///
/// # Errors
/// The first error of acting, `chmod`, listing or removing.
pub(crate) fn remove_tree(
    parent: std::os::fd::BorrowedFd<'_>,
    parent_owner: (u32, u32),
    name: &std::ffi::OsStr,
    group: Option<u32>,
) -> Result<(), Errno> {
    use crate::sys::creds::act_as;
    use crate::sys::file::{self, Access, Kind, Remove};
    use std::os::fd::AsFd;
    use std::os::unix::ffi::OsStrExt;
    let acting = |(uid, gid): (u32, u32)| group.map(|g| act_as(uid, g, &[g, gid])).transpose();
    // The parent's owner reaches the entry: the daemon may not search the directory.
    let (entry, st) = {
        let _owner = acting(parent_owner)?;
        let entry = file::open_child(parent, name, None)?;
        let st = file::stat(entry.as_fd())?;
        (entry, st)
    };
    let how = if st.kind == Kind::Directory {
        let names = {
            let _owner = acting((st.uid, st.gid))?;
            if st.perm & 0o700 != 0o700 {
                file::chmod(entry.as_fd(), st.perm | 0o700)?;
            }
            let stream = file::reopen(entry.as_fd(), Kind::Directory, Access::Directory)?;
            let mut buf = vec![std::mem::MaybeUninit::uninit(); 64 * 1024];
            let mut names = Vec::new();
            loop {
                let batch = crate::sys::dir::read_batch(stream.as_fd(), &mut buf)?;
                if batch.is_empty() {
                    break;
                }
                names.extend(
                    batch
                        .into_iter()
                        .map(|e| e.name)
                        .filter(|n| n.as_slice() != b"." && n.as_slice() != b".."),
                );
            }
            names
        };
        for child in names {
            remove_tree(
                entry.as_fd(),
                (st.uid, st.gid),
                std::ffi::OsStr::from_bytes(&child),
                group,
            )?;
        }
        Remove::Directory
    } else {
        Remove::NonDirectory
    };
    let _owner = acting(parent_owner)?;
    file::unlink(parent, name, how)
}

/// Gives a volume's root `fd` (as `st` found it) back what every pod of it relies on:
/// `owner` (where one is given), the volume's `group`, `2775`, where a pod changed
/// them; with `owners`, as a member of the group, which a squashed driver needs to
/// give it back. What it was, where it changed.
///
/// # Errors
/// The error of acting, `chown` or `chmod`.
pub(crate) fn restore_root(
    fd: std::os::fd::BorrowedFd<'_>,
    st: &crate::sys::file::Stat,
    owner: Option<u32>,
    group: u32,
    owners: bool,
) -> Result<Option<String>, Errno> {
    use crate::sys::file;
    if owner.is_none_or(|o| o == st.uid) && (st.gid, st.perm) == (group, NATIVE_ROOT_MODE) {
        return Ok(None);
    }
    let _acting = owners
        .then(|| crate::sys::creds::act_as(0, group, &[group]))
        .transpose()?;
    // chown first: it clears the setgid bit that chmod then sets.
    file::chown(fd, owner, Some(group))?;
    file::chmod(fd, NATIVE_ROOT_MODE)?;
    Ok(Some(format!("{}:{} {:04o}", st.uid, st.gid, st.perm)))
}

/// Whether the file system of the directory `dir` keeps extended attributes named
/// like `name` (a probe name of a view's records' namespace, written and removed), or
/// why not: SMB without EA support, NFS (no `trusted.*` namespace), FAT.
///
/// # Errors
/// Why not.
pub fn keeps_xattr(dir: &Path, name: &std::ffi::CStr) -> Result<(), String> {
    let fd = crate::sys::file::open_root(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    match crate::sys::xattr::probe(std::os::fd::AsFd::as_fd(&fd), name) {
        Ok(()) => Ok(()),
        Err(e @ (Errno(libc::EOPNOTSUPP) | Errno(libc::ENOSYS))) => Err(format!(
            "the share's file system keeps no extended attributes {} ({e})",
            name.to_string_lossy()
        )),
        Err(e) => Err(format!(
            "{}: extended attribute {}: {e}",
            dir.display(),
            name.to_string_lossy()
        )),
    }
}

/// Whether the file system of `dir` keeps each file's owner itself and checks each
/// call's permissions as its caller's, so that a view acting as its callers gives them
/// their own files there: the kernel's NFS client with `sec=sys`. Why not otherwise.
///
/// # Errors
/// Why not: another file system, another security flavour, or what failed.
pub fn keeps_owners(dir: &Path) -> Result<(), String> {
    let fd = crate::sys::file::open_root(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !crate::sys::file::is_nfs(std::os::fd::AsFd::as_fd(&fd)) {
        return Err(format!(
            "{} is not an NFS mount, whose server keeps its callers' owners",
            dir.display()
        ));
    }
    let options = crate::sys::mount::super_options(dir)
        .map_err(|e| format!("the mount options of {}: {e}", dir.display()))?;
    match nfs_security(&options) {
        "sys" => Ok(()),
        sec => Err(format!(
            "{} is mounted sec={sec}: its server knows every call as the node's Kerberos principal, not as the caller's uid, so a view cannot act as its callers there (mount it sec=sys for that)",
            dir.display()
        )),
    }
}

/// The security flavour of NFS super options (`sec=`; `sys` where none is named).
fn nfs_security(options: &str) -> &str {
    options
        .split(',')
        .find_map(|o| o.strip_prefix("sec="))
        .unwrap_or("sys")
}

/// Whether native views of `dir` would work: a clone of its mount can be idmapped,
/// and a directory can be made and removed through it (not so on CephFS where the
/// MDS does not take a creation's owner from the client). Asked once per share by
/// the driver, and by `mountgroup mount --native` of its source.
///
/// # Errors
/// Why not, naming what would work.
pub fn idmappable(dir: &Path) -> Result<(), String> {
    let ns = identity_namespace()?;
    let ns = std::os::fd::AsFd::as_fd(&ns);
    can_idmap_with(dir, ns)?;
    match crate::sys::mount::idmapped_creates(dir, ns) {
        // Mounted read-only (`mountgroup mount --native` of such a source): no view of
        // it makes anything.
        Ok(()) | Err(Errno(libc::EROFS)) => Ok(()),
        Err(e) => Err(format!(
            "the file system of {} can be idmapped, but nothing can be made through an idmapped mount of it ({e}): a pod's every create would fail so. CephFS answers EIO where its MDS does not take a creation's owner from the client (CEPHFS_FEATURE_HAS_OWNER_UIDGID, which Ceph 16.2's MDS lacks; Ceph 19 and later have it, and Reef and Quincy point releases with its backport)",
            dir.display()
        )),
    }
}

/// A user namespace whose maps are the identity, to idmap a probe's clone with.
fn identity_namespace() -> Result<std::os::fd::OwnedFd, String> {
    let identity = crate::sys::process::IDENTITY_MAP;
    crate::sys::process::user_namespace(identity, identity)
        .map_err(|e| format!("a user namespace cannot be made: {e}"))
}

fn can_idmap_with(dir: &Path, ns: std::os::fd::BorrowedFd<'_>) -> Result<(), String> {
    crate::sys::mount::can_idmap(dir, ns).map_err(|e| {
        format!(
            "the file system of {} cannot be idmapped ({e}): native views need one that can (ext4, xfs or btrfs on Linux 5.12+, tmpfs on 6.3+, CephFS on 6.7+; not CIFS, not NFS)",
            dir.display()
        )
    })
}

/// Whether a native view of the volume at `dir` may be mounted on this node, made and
/// checked without making anything there (a volume's directory, which pods may use):
/// its mount can be idmapped, and every mount of its file system here is
/// `nosuid,nodev` ([`native_inert`]). Whether creations work through an idmapped
/// mount of it is the share's, which CreateVolume asked of it ([`idmappable`]).
///
/// # Errors
/// Why not.
pub fn native_capable_at(dir: &Path) -> Result<(), String> {
    let ns = identity_namespace()?;
    can_idmap_with(dir, std::os::fd::AsFd::as_fd(&ns))?;
    native_inert(dir)
}

/// Whether what a pod makes on a native view of `dir` is inert on every mount of
/// `dir`'s file system that this node can see: a set-id bit, a file capability or a
/// device node made through the view works through any mount of the same file system
/// that is not `nosuid,nodev` (a second mount of its device, a bind of the share, the
/// root file system a plain share directory lives on), so every one must be
/// (docs/ARCHITECTURE.md, *Threat model*). Mounts on other hosts of a network file
/// system are the operator's to keep so (docs/DEPLOY.md, *The share*).
///
/// # Errors
/// Why not, with the mounts at fault and the fix.
pub fn native_inert(dir: &Path) -> Result<(), String> {
    match crate::sys::mount::mounts_honouring_set_id(dir) {
        Ok(found) if found.is_empty() => Ok(()),
        Ok(found) => {
            let list: Vec<String> = found
                .iter()
                .map(|h| format!("{} lacks {}", h.mountpoint, h.lacks))
                .collect();
            Err(format!(
                "the file system of {} is mounted where set-id bits or device nodes work ({}): what a pod made on a native view would work there; give the share a file system of its own and mount every mount of it nosuid,nodev (docs/DEPLOY.md, The share)",
                dir.display(),
                list.join("; ")
            ))
        }
        Err(e) => Err(format!(
            "the mounts of {}'s file system cannot be listed: {e}",
            dir.display()
        )),
    }
}

/// Writes a file so that readers see the old or the new content, never a mix, even
/// across a crash: temp file, fsync, rename, fsync of the directory.
///
/// # Errors
/// The first failing step's error.
pub fn write_atomically(path: &Path, body: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        f.write_all(body)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn ids_never_name_a_path_outside() {
        for bad in [
            "",
            "..",
            ".",
            "a/b",
            "../x",
            "-x",
            ".hidden",
            "a b",
            "é",
            &"x".repeat(129),
        ] {
            assert!(VolumeId::parse(bad).is_err(), "{bad:?}");
        }
        for good in [
            "pvc-0b3c6d2e-1f",
            "csi-abc123",
            "a",
            "A.b_c-d",
            &"x".repeat(128),
        ] {
            assert!(VolumeId::parse(good).is_ok(), "{good:?}");
        }
        assert!(
            serde_json::from_str::<VolumeId>("\"../etc\"").is_err(),
            "validated when read back too"
        );
    }

    #[test]
    fn only_an_nfs_share_mounted_sec_sys_keeps_its_callers_owners() {
        assert_eq!(
            nfs_security("rw,vers=4.2,sec=sys,clientaddr=127.0.0.1"),
            "sys"
        );
        assert_eq!(nfs_security("rw,vers=3,sec=krb5p"), "krb5p");
        assert_eq!(nfs_security("rw,vers=4.1"), "sys");
        let dir = tempfile::tempdir().unwrap();
        let share = LocalShare::open(dir.path(), ShareInit::Always).unwrap();
        let why = share.keeps_owners().unwrap_err();
        assert!(why.contains("is not an NFS mount"), "{why}");
    }

    /// A volume whose pods made a tree private to them (a directory `0500`, an entry
    /// `0000` in it) is removed by each directory's owner, acting as such: root's
    /// capabilities play no part (the owner's uid drops them), as on a share that
    /// squashes root. A symlink is removed, never followed.
    #[test]
    fn a_tree_its_owners_made_private_is_removed_by_them() {
        use std::os::unix::fs::{chown, lchown, symlink};
        let dir = tempfile::tempdir().unwrap();
        let g = NATIVE_GROUP_BASE;
        let vol = dir.path().join("vol");
        fs::create_dir(&vol).unwrap();
        chown(&vol, Some(65534), Some(g)).unwrap();
        fs::set_permissions(&vol, fs::Permissions::from_mode(NATIVE_ROOT_MODE)).unwrap();
        let d = vol.join("d");
        fs::create_dir_all(d.join("e")).unwrap();
        fs::write(d.join("f"), "x").unwrap();
        symlink("/etc", d.join("l")).unwrap();
        for p in [d.join("e"), d.join("f")] {
            chown(&p, Some(1000), Some(g)).unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(0o000)).unwrap();
        }
        lchown(d.join("l"), Some(1000), Some(g)).unwrap();
        chown(&d, Some(1000), Some(g)).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o500)).unwrap();
        let parent = crate::sys::file::open_root(dir.path()).unwrap();
        remove_tree(
            std::os::fd::AsFd::as_fd(&parent),
            (0, 0),
            std::ffi::OsStr::new("vol"),
            Some(g),
        )
        .unwrap();
        assert!(!vol.exists());
        assert!(Path::new("/etc/passwd").exists());
    }

    /// The probe a new volume on a share that keeps owners makes: on a file system
    /// that keeps the owner a caller makes a file with, the directory keeps nothing of
    /// it.
    #[test]
    fn a_file_system_that_keeps_its_callers_owners_passes_the_probe() {
        let dir = tempfile::tempdir().unwrap();
        let vol = dir.path().join("vol");
        fs::create_dir(&vol).unwrap();
        std::os::unix::fs::chown(&vol, None, Some(NATIVE_GROUP_BASE)).unwrap();
        fs::set_permissions(&vol, fs::Permissions::from_mode(NATIVE_ROOT_MODE)).unwrap();
        let root = crate::sys::file::open_root(&vol).unwrap();
        probe_owner(std::os::fd::AsFd::as_fd(&root), NATIVE_GROUP_BASE).unwrap();
        assert_eq!(fs::read_dir(&vol).unwrap().count(), 0);
        // A caller the directory keeps out: the probe says so.
        fs::set_permissions(&vol, fs::Permissions::from_mode(0o755)).unwrap();
        let why = probe_owner(std::os::fd::AsFd::as_fd(&root), NATIVE_GROUP_BASE).unwrap_err();
        assert!(why.contains("refuses its callers' own ids"), "{why}");
    }
}
