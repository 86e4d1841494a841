//! The share root: a directory on this node (the embedded default, a hostPath, or a
//! share mounted at `--share-root` by hand), laid out as `volumes/<id>/` and
//! `meta/<id>.json` under a marker that proves it is the share.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::sys::Errno;

use super::{
    CapacityMode, Created, NATIVE_GROUP_BASE, NATIVE_ROOT_MODE, Share, ShareError, VolumeId,
    VolumeRecord, VolumeSpec, btrfs, cephfs, idmappable, io, keeps_owners, keeps_xattr,
    native_inert, owners_root, remove_tree, restore_root, write_atomically,
};

/// What enforces a share's capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Quota {
    /// A btrfs quota group per volume subvolume.
    Btrfs,
    /// A CephFS quota on each volume's directory.
    CephFs,
}

/// The file that proves a directory is the share. The driver writes it once, when it
/// lays the share out, and looks for it before every use: a share that is not (yet)
/// mounted leaves its mount point an empty directory of the node's own disk (the
/// hostPath's `DirectoryOrCreate` makes one), where volumes must never be created.
pub const MARKER: &str = ".mountgroup-share";

/// When a share root without the marker may be laid out as a new share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShareInit {
    /// Always: the share is a directory of this node's own (one machine, local use).
    Always,
    /// Only when the root is a mount point: the share is mounted there (an NFS or SMB
    /// export, a disk); until then the driver is not ready and creates nothing.
    Mounted,
}

/// A share that is a directory on this node (a hostPath, or an NFS/SMB export
/// mounted on every node).
pub struct LocalShare {
    root: PathBuf,
    init: ShareInit,
    /// Serialises create and delete so that two calls for one name cannot interleave.
    lock: Mutex<()>,
    /// Decided the first time the root proves to be the share.
    capacity: std::sync::OnceLock<CapacityMode>,
    /// What enforces capacity, decided with it (none where it is advisory).
    quota: std::sync::OnceLock<Quota>,
    /// Whether the share's file system can be idmapped (why not, if not), asked once.
    idmap: std::sync::OnceLock<Result<(), String>>,
}

/// What `capacity()` answers before the share is there.
static NOT_THERE: std::sync::LazyLock<CapacityMode> =
    std::sync::LazyLock::new(|| CapacityMode::Advisory("the share is not there yet".into()));

impl LocalShare {
    /// Opens the share at `root`, laying it out if `init` allows. A root that is not
    /// the share yet is not an error: every use answers [`ShareError::NotThere`] until
    /// it is (a share mounted later is picked up by the next call).
    ///
    /// # Errors
    /// The error of laying out a share that is there.
    pub fn open(root: &Path, init: ShareInit) -> Result<LocalShare, ShareError> {
        if init == ShareInit::Always {
            fs::create_dir_all(root).map_err(io(format!("share {}", root.display())))?;
        }
        let root = fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
        let share = LocalShare {
            root,
            init,
            lock: Mutex::new(()),
            capacity: std::sync::OnceLock::new(),
            quota: std::sync::OnceLock::new(),
            idmap: std::sync::OnceLock::new(),
        };
        match share.prove() {
            Ok(()) => {}
            Err(ShareError::NotThere(why)) => {
                tracing::warn!(share = %share.root.display(), %why, "waiting for the share")
            }
            Err(e) => return Err(e),
        }
        Ok(share)
    }

    /// Succeeds when the root is the share: it carries [`MARKER`], or it may be laid out
    /// now (`init`) and is; the first success decides how capacity is held.
    fn prove(&self) -> Result<(), ShareError> {
        let marker = self.root.join(MARKER);
        match fs::symlink_metadata(&marker) {
            // Written by hand (`touch`): an operator's word that this is the share.
            Ok(m) if m.is_file() && m.len() == 0 => self.lay_out(&marker)?,
            Ok(m) if m.is_file() => {}
            Ok(_) => {
                return Err(ShareError::NotThere(format!(
                    "share root {}: {MARKER} is not a file",
                    self.root.display()
                )));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mounted = crate::sys::mount::is_mount_point(&self.root).unwrap_or(false);
                if self.init == ShareInit::Mounted && !mounted {
                    return Err(ShareError::NotThere(format!(
                        "share root {} is not the share: it is not a mount point and has no {MARKER} marker; mount the share there (an existing share directory on this node's own disk can be marked with `touch {}`)",
                        self.root.display(),
                        marker.display()
                    )));
                }
                self.lay_out(&marker)?;
            }
            Err(e) => return Err(io(format!("share marker {}", marker.display()))(e)),
        }
        self.capacity.get_or_init(|| self.decide_capacity());
        Ok(())
    }

    /// Lays the share out at the root: its directories, then the marker that names it.
    fn lay_out(&self, marker: &Path) -> Result<(), ShareError> {
        // Laid out now: its directories, then the marker that names it.
        for dir in ["volumes", "meta"] {
            let d = self.root.join(dir);
            fs::create_dir_all(&d).map_err(io(format!("share {}", d.display())))?;
        }
        let body = format!(
            "{{\"laid_out_unix\":{}}}\n",
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        );
        write_atomically(marker, body.as_bytes())
            .map_err(io(format!("share marker {}", marker.display())))?;
        tracing::info!(share = %self.root.display(), "share laid out");
        Ok(())
    }

    fn decide_capacity(&self) -> CapacityMode {
        let root = &self.root;
        let capacity = if btrfs::is_btrfs(root) {
            match btrfs::enable_quota(root) {
                Ok(()) => self.enforced_by(Quota::Btrfs),
                Err(e) => CapacityMode::Advisory(format!("btrfs quotas cannot be enabled: {e}")),
            }
        } else if cephfs::is_cephfs(root) {
            match cephfs::can_limit(&root.join("volumes")) {
                Ok(()) => self.enforced_by(Quota::CephFs),
                Err(e) => CapacityMode::Advisory(format!("CephFS quotas cannot be set: {e}")),
            }
        } else {
            CapacityMode::Advisory(
                "the share's file system has no quota support mountgroup can use (it needs btrfs or CephFS)"
                    .into(),
            )
        };
        match &capacity {
            CapacityMode::Enforced => {
                let by = match self.quota.get() {
                    Some(Quota::CephFs) => "CephFS directory quotas",
                    _ => "btrfs quota groups",
                };
                tracing::info!(share = %root.display(), "capacity enforced by {by}")
            }
            CapacityMode::Advisory(why) => {
                tracing::warn!(share = %root.display(), %why, "capacity is advisory")
            }
        }
        capacity
    }

    fn enforced(&self) -> bool {
        self.capacity.get() == Some(&CapacityMode::Enforced)
    }

    /// Capacity enforced by `quota`, which is recorded with it.
    fn enforced_by(&self, quota: Quota) -> CapacityMode {
        let _ = self.quota.set(quota);
        CapacityMode::Enforced
    }

    /// What enforces capacity, where it is.
    fn quota(&self) -> Option<Quota> {
        self.quota.get().copied().filter(|_| self.enforced())
    }

    /// Makes a volume's directory at `data` (a btrfs subvolume where capacity is
    /// btrfs's) and limits it to `bytes`; one left by an earlier attempt is taken.
    fn make_volume_dir(&self, data: &Path, bytes: u64) -> Result<(), ShareError> {
        if self.quota() == Some(Quota::Btrfs) {
            if !btrfs::is_subvolume(data) {
                btrfs::create_subvolume(data)?;
            }
        } else {
            match fs::create_dir(data) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io(format!("volume directory {}", data.display()))(e)),
            }
        }
        self.limit_volume(data, bytes)
    }

    /// Limits the volume's directory at `data` to `bytes` where capacity is enforced.
    fn limit_volume(&self, data: &Path, bytes: u64) -> Result<(), ShareError> {
        match self.quota() {
            Some(Quota::Btrfs) if btrfs::is_subvolume(data) => btrfs::limit(data, bytes),
            Some(Quota::CephFs) => cephfs::limit(data, bytes),
            _ => Ok(()),
        }
    }

    /// The enforced limit of the volume's directory at `data`: `Some(None)` where it
    /// should have one and has none (or it is unreadable), `None` where capacity is
    /// not enforced on it.
    fn volume_limit(&self, data: &Path) -> Option<Option<u64>> {
        match self.quota() {
            Some(Quota::Btrfs) if btrfs::is_subvolume(data) => Some(btrfs::limit_bytes(data)),
            Some(Quota::CephFs) => Some(cephfs::limit_bytes(data)),
            _ => None,
        }
    }

    /// Bytes the volume's directory at `data` holds, where capacity is enforced.
    fn volume_used(&self, data: &Path) -> Option<u64> {
        match self.quota()? {
            Quota::Btrfs => btrfs::used_bytes(data),
            Quota::CephFs => cephfs::used_bytes(data),
        }
    }

    /// Whether the share's file system can be idmapped: a clone of its mount is
    /// idmapped and released once (Linux 5.12+ on ext4, xfs and btrfs, tmpfs from 6.3;
    /// not CIFS, not NFS).
    pub fn idmappable(&self) -> Result<(), String> {
        self.idmap.get_or_init(|| idmappable(&self.root)).clone()
    }

    /// Whether a native view of a volume of this share may be mounted here, or why not:
    /// the share's file system can be idmapped, and every mount of it on this node is
    /// `nosuid` and `nodev` (see [`native_inert`]). Asked at every publish and every
    /// recovery of a native view: a mount made since counts.
    pub fn native_capable(&self) -> Result<(), String> {
        self.idmappable()?;
        native_inert(&self.root)
    }

    /// The lowest native group no volume has.
    fn free_group(&self) -> Result<u32, ShareError> {
        let taken: std::collections::BTreeSet<u32> =
            self.list()?.iter().filter_map(|r| r.group).collect();
        (NATIVE_GROUP_BASE..u32::MAX)
            .find(|g| !taken.contains(g))
            .ok_or_else(|| ShareError::Io {
                what: "native volume groups".into(),
                errno: Errno(libc::ENOSPC),
            })
    }

    fn meta_path(&self, id: &VolumeId) -> PathBuf {
        self.root.join("meta").join(format!("{id}.json"))
    }

    fn write_meta(&self, rec: &VolumeRecord) -> Result<(), ShareError> {
        let what = format!("metadata of volume {}", rec.id);
        let body = serde_json::to_vec_pretty(rec).map_err(|e| ShareError::Corrupt {
            id: rec.id.clone(),
            why: e.to_string(),
        })?;
        write_atomically(&self.meta_path(&rec.id), &body).map_err(io(what))
    }
}

impl Share for LocalShare {
    fn create(&self, spec: &VolumeSpec) -> Result<Created, ShareError> {
        self.prove()?;
        let _serial = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(existing) = self.get(&spec.id)? {
            let compatible = existing.name == spec.name
                && existing.capacity_bytes == spec.capacity_bytes
                && existing.parameters == spec.parameters;
            return if compatible {
                Ok(Created::Existing(existing))
            } else {
                Err(ShareError::Conflict(spec.id.clone()))
            };
        }
        let data = self.data_path(&spec.id);
        // A directory may be left by a create that died before its metadata was written.
        self.make_volume_dir(&data, spec.capacity_bytes)?;
        // A native volume: its root in a group of its own, setgid, so that whatever is
        // made in it is born in that group (subdirectories inherit setgid). Where the
        // share cannot serve native views, the volume is a FUSE one for good, and says
        // why at every publish.
        // On a share that cannot be idmapped but keeps its callers' owners (NFS), the
        // volume gets a group all the same, and its views act as their callers.
        let mut owners = false;
        let native = match spec.native.then(|| self.native_capable()) {
            Some(Ok(())) => Ok(Some(self.free_group()?)),
            Some(Err(why)) => {
                let acting = match self.keeps_owners() {
                    Ok(()) => {
                        let g = self.free_group()?;
                        owners_root(&data, g).map(|()| g)
                    }
                    Err(owners_why) => Err(owners_why),
                };
                match acting {
                    Ok(g) => {
                        owners = true;
                        tracing::info!(volume_id = %spec.id, group = g, %why, "the share cannot be idmapped but keeps its callers' owners: the volume's views act as their callers on it");
                        Ok(Some(g))
                    }
                    Err(owners_why) => {
                        let why = format!("{why}; {owners_why}");
                        tracing::warn!(volume_id = %spec.id, %why, "the volume is a FUSE volume, not a native one, for good");
                        Err(why)
                    }
                }
            }
            None => Ok(None),
        };
        if let Ok(Some(g)) = native
            && !owners
        {
            let what = || format!("volume directory {}", data.display());
            std::os::unix::fs::chown(&data, None, Some(g)).map_err(io(what()))?;
            fs::set_permissions(&data, fs::Permissions::from_mode(NATIVE_ROOT_MODE))
                .map_err(io(what()))?;
        }
        let rec = VolumeRecord {
            id: spec.id.clone(),
            name: spec.name.clone(),
            capacity_bytes: spec.capacity_bytes,
            parameters: spec.parameters.clone(),
            created_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            group: native.clone().ok().flatten(),
            not_native: native.err(),
            owners,
        };
        self.write_meta(&rec)?;
        Ok(Created::New(rec))
    }

    fn get(&self, id: &VolumeId) -> Result<Option<VolumeRecord>, ShareError> {
        self.prove()?;
        let body = match fs::read(self.meta_path(id)) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(format!("metadata of volume {id}"))(e)),
        };
        let rec: VolumeRecord = serde_json::from_slice(&body).map_err(|e| ShareError::Corrupt {
            id: id.clone(),
            why: e.to_string(),
        })?;
        if &rec.id != id {
            return Err(ShareError::Corrupt {
                id: id.clone(),
                why: format!("it names volume {}", rec.id),
            });
        }
        Ok(Some(rec))
    }

    fn delete(&self, id: &VolumeId) -> Result<(), ShareError> {
        self.prove()?;
        let _serial = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let data = self.data_path(id);
        // Data first: if we die half way, the metadata still names the volume and a
        // repeated DeleteVolume finishes the job. remove_dir_all never follows symlinks.
        if btrfs::is_subvolume(&data) {
            btrfs::delete_subvolume(&data)?;
        } else {
            match fs::remove_dir_all(&data) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                // What the pods of a volume whose views act as their callers made is
                // theirs on the server, and a driver whose root it squashes may only
                // remove what their directories let it: their owners remove it.
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    let what = || format!("volume directory {}", data.display());
                    let Some(group) = self.get(id)?.filter(|r| r.owners).and_then(|r| r.group)
                    else {
                        return Err(io(what())(e));
                    };
                    let failed = |errno| ShareError::Io {
                        what: what(),
                        errno,
                    };
                    let volumes =
                        crate::sys::file::open_root(&self.root.join("volumes")).map_err(failed)?;
                    let volumes = std::os::fd::AsFd::as_fd(&volumes);
                    let owner = crate::sys::file::stat(volumes).map_err(failed)?;
                    remove_tree(
                        volumes,
                        (owner.uid, owner.gid),
                        std::ffi::OsStr::new(id.as_str()),
                        Some(group),
                    )
                    .map_err(failed)?;
                }
                Err(e) => return Err(io(format!("volume directory {}", data.display()))(e)),
            }
        }
        match fs::remove_file(self.meta_path(id)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(format!("metadata of volume {id}"))(e)),
        }
        fs::File::open(self.root.join("meta"))
            .and_then(|d| d.sync_all())
            .map_err(io("share metadata directory"))
    }

    fn list(&self) -> Result<Vec<VolumeRecord>, ShareError> {
        self.prove()?;
        let dir = self.root.join("meta");
        let mut out = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io(format!("share {}", dir.display())))? {
            let entry = entry.map_err(io(format!("share {}", dir.display())))?;
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            let Ok(id) = VolumeId::parse(id) else {
                continue;
            };
            if let Some(rec) = self.get(&id)? {
                out.push(rec);
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    fn data_path(&self, id: &VolumeId) -> PathBuf {
        self.root.join("volumes").join(id.as_str())
    }

    fn available_bytes(&self) -> Result<u64, ShareError> {
        self.prove()?;
        let fd = crate::sys::file::open_root(&self.root).map_err(|errno| ShareError::Io {
            what: format!("share {}", self.root.display()),
            errno,
        })?;
        let s = crate::sys::file::statvfs(std::os::fd::AsFd::as_fd(&fd)).map_err(|errno| {
            ShareError::Io {
                what: format!("share {}", self.root.display()),
                errno,
            }
        })?;
        let free = s.bavail.saturating_mul(u64::from(s.frsize));
        if !self.enforced() {
            // Advisory capacity reserves nothing: the file system's free space is the truth.
            return Ok(free);
        }
        // Enforced: space promised to volumes but not yet used is not the share's to give.
        let mut promised = 0u64;
        for rec in self.list()? {
            let used = self.volume_used(&self.data_path(&rec.id)).unwrap_or(0);
            promised = promised.saturating_add(rec.capacity_bytes.saturating_sub(used));
        }
        Ok(free.saturating_sub(promised))
    }

    fn check(&self) -> Result<(), ShareError> {
        self.prove()?;
        fs::read_dir(self.root.join("volumes"))
            .map(|_| ())
            .map_err(io(format!("share {}", self.root.display())))
    }

    fn set_capacity(&self, id: &VolumeId, bytes: u64) -> Result<VolumeRecord, ShareError> {
        self.prove()?;
        let _serial = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut rec = self
            .get(id)?
            .ok_or_else(|| ShareError::Backend(format!("volume {id} does not exist")))?;
        if rec.capacity_bytes != bytes {
            rec.capacity_bytes = bytes;
            self.write_meta(&rec)?;
        }
        Ok(rec)
    }

    fn apply_capacity(&self, rec: &VolumeRecord) -> Result<(), ShareError> {
        self.prove()?;
        self.limit_volume(&self.data_path(&rec.id), rec.capacity_bytes)
    }

    fn capacity_applied(&self, rec: &VolumeRecord) -> bool {
        match self.volume_limit(&self.data_path(&rec.id)) {
            None => true,
            Some(limit) => limit == Some(rec.capacity_bytes),
        }
    }

    fn capacity(&self) -> &CapacityMode {
        self.capacity.get().unwrap_or(&NOT_THERE)
    }

    fn volume_bytes(&self, id: &VolumeId) -> Option<(u64, u64)> {
        let data = self.data_path(id);
        let limit = self.volume_limit(&data)??;
        Some((limit, self.volume_used(&data)?))
    }

    fn native_capable(&self) -> Result<(), String> {
        LocalShare::native_capable(self)
    }

    fn keeps_owners(&self) -> Result<(), String> {
        keeps_owners(&self.root)
    }

    fn keeps_xattr(&self, name: &std::ffi::CStr) -> Result<(), String> {
        keeps_xattr(&self.root.join("volumes"), name)
    }

    fn keep_native_root(&self, rec: &VolumeRecord) -> Result<bool, ShareError> {
        use crate::sys::file;
        let Some(group) = rec.group else {
            return Ok(false);
        };
        self.prove()?;
        let data = self.data_path(&rec.id);
        let failed = |errno| ShareError::Io {
            what: format!("root of volume {} ({})", rec.id, data.display()),
            errno,
        };
        // The volume's directory as one descriptor, opened without following a link
        // and changed through that descriptor: no path is resolved twice.
        let volumes = file::open_root(&self.root.join("volumes")).map_err(failed)?;
        let root = file::open_child(
            std::os::fd::AsFd::as_fd(&volumes),
            std::ffi::OsStr::new(rec.id.as_str()),
            None,
        )
        .map_err(failed)?;
        let fd = std::os::fd::AsFd::as_fd(&root);
        let st = file::stat(fd).map_err(failed)?;
        if st.kind != file::Kind::Directory {
            return Err(failed(Errno(libc::ENOTDIR)));
        }
        // An `owners` volume's root is whoever the server makes of the driver, as the
        // share's `volumes` directory the driver made is.
        let owner = if rec.owners {
            file::stat(std::os::fd::AsFd::as_fd(&volumes))
                .map_err(failed)?
                .uid
        } else {
            0
        };
        let Some(was) = restore_root(fd, &st, Some(owner), group, rec.owners).map_err(failed)?
        else {
            return Ok(false);
        };
        tracing::warn!(
            volume_id = %rec.id,
            %was,
            now = %format!("{owner}:{group} {NATIVE_ROOT_MODE:04o}"),
            "a pod changed the native volume's root; restored"
        );
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn spec(name: &str, cap: u64) -> VolumeSpec {
        VolumeSpec {
            id: VolumeId::parse(name).unwrap(),
            name: name.into(),
            capacity_bytes: cap,
            parameters: BTreeMap::new(),
            native: true,
        }
    }

    #[test]
    fn create_is_idempotent_by_name_and_refuses_conflicts() {
        let dir = tempfile::tempdir().unwrap();
        let share = LocalShare::open(dir.path(), ShareInit::Always).unwrap();
        let Created::New(rec) = share.create(&spec("v1", 100)).unwrap() else {
            panic!("new")
        };
        assert!(share.data_path(&rec.id).is_dir());
        assert_eq!(
            share.create(&spec("v1", 100)).unwrap(),
            Created::Existing(rec.clone())
        );
        assert!(matches!(
            share.create(&spec("v1", 200)),
            Err(ShareError::Conflict(_))
        ));
        assert_eq!(share.get(&rec.id).unwrap(), Some(rec.clone()));
        assert_eq!(share.list().unwrap(), vec![rec.clone()]);
        share.delete(&rec.id).unwrap();
        share.delete(&rec.id).unwrap();
        assert_eq!(share.get(&rec.id).unwrap(), None);
        assert!(!share.data_path(&rec.id).exists());
        assert_eq!(
            fs::read_dir(dir.path().join("meta")).unwrap().count(),
            0,
            "no temp files left"
        );
    }

    #[test]
    fn delete_does_not_follow_symlinks_out_of_the_volume() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("keep"), "x").unwrap();
        let share = LocalShare::open(dir.path(), ShareInit::Always).unwrap();
        share.create(&spec("v", 1)).unwrap();
        let id = VolumeId::parse("v").unwrap();
        std::os::unix::fs::symlink(outside.path(), share.data_path(&id).join("link")).unwrap();
        share.delete(&id).unwrap();
        assert!(outside.path().join("keep").exists());
    }
}
