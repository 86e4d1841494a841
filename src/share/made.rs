//! The directories of dynamic volumes on a named share, as CreateVolume,
//! DeleteVolume and ControllerExpandVolume make, remove and limit them on the share
//! the controller mounted for the call. Every path below the share is walked one
//! component at a time (`openat2` beneath, no symlinks, no other mount), so a symlink
//! someone planted on the share (another view of it, another client) leads nowhere.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use super::remote::{Kind, OnDelete, SubPath, Traits};
use super::{NATIVE_ROOT_MODE, ShareError, cephfs, idmappable, keeps_owners, owners_root};
use crate::sys::Errno;
use crate::sys::file;

/// What CreateVolume made of a volume's directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Made {
    pub traits: Traits,
    /// Why a volume asked to be native is not.
    pub not_native: Option<String>,
    /// Whether capacity is enforced on it (a CephFS quota), or why not.
    pub capacity: Result<(), String>,
}

/// What a new volume asks of its directory.
pub struct Want<'a> {
    /// Native where the share can be (no `view: fuse`).
    pub native: bool,
    /// The group a native or acting volume gets.
    pub group: u32,
    /// csi-driver-nfs's `mountPermissions`, for a directory that is not native.
    pub mount_permissions: Option<u32>,
    /// ceph-csi's `pool`: the new directory's data pool.
    pub pool: Option<&'a str>,
    pub capacity_bytes: u64,
}

fn failed(what: &str, path: &str) -> impl FnOnce(Errno) -> ShareError {
    let what = format!("{what} {path:?} on the share");
    move |errno| match errno.0 {
        libc::ELOOP => ShareError::Backend(format!(
            "{what}: a symlink stands in the way, which the driver does not follow"
        )),
        libc::EXDEV => ShareError::Backend(format!(
            "{what}: another mount stands in the way, which the driver does not cross"
        )),
        _ => ShareError::Io { what, errno },
    }
}

/// Opens `path` below the directory `root`, making each missing directory of it
/// (`0755`) where `make`; `ENOENT` otherwise.
fn walk(root: BorrowedFd<'_>, path: &SubPath, make: bool) -> Result<OwnedFd, ShareError> {
    let mut at = file::reopen(root, file::Kind::Directory, file::Access::Path)
        .map_err(failed("the share's root", ""))?;
    let mut walked = String::new();
    for c in path.components() {
        if !walked.is_empty() {
            walked.push('/');
        }
        walked.push_str(c);
        let name = OsStr::new(c);
        let next = match file::open_child(at.as_fd(), name, None) {
            Err(Errno::ENOENT) if make => {
                match file::mkdir(at.as_fd(), name, 0o755) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(failed("making", &walked)(e)),
                }
                file::open_child(at.as_fd(), name, None)
            }
            other => other,
        }
        .map_err(failed("opening", &walked))?;
        let st = file::stat(next.as_fd()).map_err(failed("opening", &walked))?;
        if st.kind != file::Kind::Directory {
            return Err(failed("opening", &walked)(Errno::ENOTDIR));
        }
        at = next;
    }
    Ok(at)
}

/// The directory of `path`'s parent and its last component.
fn split(path: &SubPath) -> (SubPath, &str) {
    match path.as_str().rsplit_once('/') {
        Some((parent, last)) => (SubPath::parse(parent).unwrap_or_default(), last),
        None => (SubPath::default(), path.as_str()),
    }
}

/// Makes the volume directory `dir` below `base` of the share mounted at `root` (`base`
/// is the path from `root` to the class's directory: empty where `root` is a mount of
/// that directory itself, as the controller mounts it), making `base` where it is
/// missing; or
/// takes the one a repeated CreateVolume made: the directory is new, or empty, or
/// already in the volume's group with its mode; a directory that holds data already
/// is served as it is (a FUSE volume showing its files as kubelet's chown would), and
/// changed in nothing. A new one is native where the share can be idmapped (CephFS on
/// Linux 6.7+ whose MDS takes a creation's owner), its views act as their callers
/// where the share keeps owners (NFS, `sec=sys`), and is a FUSE volume elsewhere; its
/// capacity is a CephFS quota where it can be.
///
/// # Errors
/// Why the directory cannot be made.
pub fn make(
    root: &Path,
    kind: Kind,
    base: &SubPath,
    dir: &SubPath,
    want: &Want<'_>,
) -> Result<Made, ShareError> {
    let top = file::open_root(root).map_err(failed("the share's root", ""))?;
    let full = base.join(dir);
    let (parent, last) = split(&full);
    let parent_fd = walk(top.as_fd(), &parent, true)?;
    let name = OsStr::new(last);
    let created = match file::mkdir(parent_fd.as_fd(), name, 0o755) {
        Ok(()) => true,
        Err(Errno::EEXIST) => false,
        Err(e) => return Err(failed("making", full.as_str())(e)),
    };
    let fd = file::open_child(parent_fd.as_fd(), name, None)
        .map_err(failed("opening", full.as_str()))?;
    let st = file::stat(fd.as_fd()).map_err(failed("opening", full.as_str()))?;
    if st.kind != file::Kind::Directory {
        return Err(failed("opening", full.as_str())(Errno::ENOTDIR));
    }
    let path = file::fd_path(fd.as_fd());
    let ours = (st.gid, st.perm) == (want.group, NATIVE_ROOT_MODE);
    let fresh =
        created || ours || is_empty(fd.as_fd()).map_err(failed("listing", full.as_str()))?;
    if !fresh {
        tracing::info!(dir = %full.as_str(), "the volume's directory holds data already: served as it is, a FUSE volume");
        return Ok(Made {
            traits: Traits::Plain,
            not_native: Some(
                "its directory held data when the volume was made: its views show that data as kubelet's chown would, and change none of it".into(),
            ),
            capacity: capacity(kind, &path, want.capacity_bytes),
        });
    }
    if created && let Some(pool) = want.pool {
        set_pool(&path, pool)?;
    }
    let (traits, not_native) = if want.native {
        native_traits(kind, fd.as_fd(), &path, full.as_str(), want.group)?
    } else {
        (Traits::Plain, None)
    };
    if traits == Traits::Plain
        && let Some(mode) = want.mount_permissions
    {
        file::chmod(fd.as_fd(), mode).map_err(failed("giving its mode to", full.as_str()))?;
    }
    Ok(Made {
        traits,
        not_native,
        capacity: capacity(kind, &path, want.capacity_bytes),
    })
}

/// What a new volume's directory `fd` (at `path`, `full` on its share) can be where
/// it is wanted native, given its `group`: native on CephFS where the share can be
/// idmapped, a volume that keeps its owners elsewhere where the share keeps them, or
/// a FUSE volume, and why not.
fn native_traits(
    kind: Kind,
    fd: std::os::fd::BorrowedFd<'_>,
    path: &Path,
    full: &str,
    group: u32,
) -> Result<(Traits, Option<String>), ShareError> {
    if kind == Kind::Cephfs {
        return match idmappable(path) {
            Ok(()) => {
                file::chown(fd, Some(0), Some(group))
                    .and_then(|()| file::chmod(fd, NATIVE_ROOT_MODE))
                    .map_err(failed("giving its group to", full))?;
                Ok((Traits::Native(group), None))
            }
            Err(why) => {
                tracing::warn!(dir = %full, %why, "the volume is a FUSE volume, not a native one, for good");
                Ok((Traits::Plain, Some(why)))
            }
        };
    }
    match keeps_owners(path).and_then(|()| owners_root(path, group)) {
        Ok(()) => Ok((Traits::Owners(group), None)),
        Err(why) => {
            let why = format!(
                "the share cannot be idmapped (a {} share), and {why}",
                kind.name()
            );
            tracing::info!(dir = %full, %why, "the volume is a FUSE volume");
            Ok((Traits::Plain, Some(why)))
        }
    }
}

/// Renames `name` to `to` in `dir`, never onto an entry there: `RENAME_NOREPLACE`,
/// or, on a file system without it (NFS, SMB: `EINVAL`), a rename after finding `to`
/// absent (`EEXIST` where it is there).
fn archive_as(dir: BorrowedFd<'_>, name: &OsStr, to: &str) -> Result<(), Errno> {
    let to = OsStr::new(to);
    match file::rename(dir, name, dir, to, libc::RENAME_NOREPLACE) {
        Err(Errno::EINVAL) => match file::open_child(dir, to, None) {
            Ok(_) => Err(Errno::EEXIST),
            Err(Errno::ENOENT) => file::rename(dir, name, dir, to, 0),
            Err(e) => Err(e),
        },
        other => other,
    }
}

/// Sets ceph-csi's `pool` as the data pool of a new directory (`ceph.dir.layout.pool`).
fn set_pool(path: &Path, pool: &str) -> Result<(), ShareError> {
    let fd = file::open_root(path).map_err(|errno| ShareError::Io {
        what: format!("{}", path.display()),
        errno,
    })?;
    crate::sys::xattr::set(fd.as_fd(), c"ceph.dir.layout.pool", pool.as_bytes(), 0).map_err(|errno| {
        ShareError::Rejected(format!(
            "parameters: pool {pool:?}: the file system refused it as the new volume's data pool ({errno}); name a data pool of the file system"
        ))
    })
}

/// The capacity of a volume at `path` enforced where the share can (a CephFS quota),
/// or why not.
fn capacity(kind: Kind, path: &Path, bytes: u64) -> Result<(), String> {
    if kind == Kind::Cephfs {
        return cephfs::limit(path, bytes).map_err(|e| e.to_string());
    }
    Err(format!(
        "a {} share has no quota mountgroup can set: capacity is advisory",
        kind.name()
    ))
}

/// Whether the directory `fd` is empty.
fn is_empty(fd: BorrowedFd<'_>) -> Result<bool, Errno> {
    let stream = file::reopen(fd, file::Kind::Directory, file::Access::Directory)?;
    let mut buf = vec![std::mem::MaybeUninit::uninit(); 4096];
    let batch = crate::sys::dir::read_batch(stream.as_fd(), &mut buf)?;
    Ok(batch
        .iter()
        .all(|e| e.name.as_slice() == b"." || e.name.as_slice() == b".."))
}

/// Sets the CephFS quota of the volume directory `dir` of the class's directory
/// mounted at `root` (ControllerExpandVolume).
///
/// # Errors
/// Why it cannot be set.
pub fn limit(root: &Path, dir: &SubPath, bytes: u64) -> Result<(), ShareError> {
    let top = file::open_root(root).map_err(failed("the share's root", ""))?;
    let fd = walk(top.as_fd(), dir, false)?;
    cephfs::limit(&file::fd_path(fd.as_fd()), bytes)
}

/// What DeleteVolume does to the volume directory `dir` of the class's directory
/// mounted at `root`, as `on_delete` says: removes it and everything in it (as its
/// owners, for a volume whose views act as their callers), then the directories of
/// `dir` it leaves empty; or renames it `archived-<name>` beside it. A directory that
/// is gone already is deleted.
///
/// # Errors
/// Why it cannot be removed.
pub fn remove(
    root: &Path,
    dir: &SubPath,
    on_delete: OnDelete,
    traits: Traits,
) -> Result<(), ShareError> {
    if on_delete == OnDelete::Retain {
        return Ok(());
    }
    let base_fd = file::open_root(root).map_err(failed("the share's root", ""))?;
    let (parent, last) = split(dir);
    let parent_fd = match walk(base_fd.as_fd(), &parent, false) {
        Ok(fd) => fd,
        Err(ShareError::Io {
            errno: Errno::ENOENT,
            ..
        }) => return Ok(()),
        Err(e) => return Err(e),
    };
    let name = OsStr::new(last);
    let full = dir;
    if on_delete == OnDelete::Archive {
        let archived = format!("archived-{last}");
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let renamed = match archive_as(parent_fd.as_fd(), name, &archived) {
            Err(Errno::EEXIST) => {
                archive_as(parent_fd.as_fd(), name, &format!("{archived}-{stamp}"))
            }
            other => other,
        };
        return match renamed {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(failed("archiving", full.as_str())(e)),
        };
    }
    let owner = file::stat(parent_fd.as_fd()).map_err(failed("opening", parent.as_str()))?;
    match super::remove_tree(
        parent_fd.as_fd(),
        (owner.uid, owner.gid),
        name,
        match traits {
            Traits::Owners(g) => Some(g),
            Traits::Plain | Traits::Native(_) => None,
        },
    ) {
        Ok(()) | Err(Errno::ENOENT) => {}
        Err(e) => return Err(failed("removing", full.as_str())(e)),
    }
    // The directories `dir` made above the volume's, where they are empty now.
    let mut above: Vec<&str> = parent.components().collect();
    while let Some(last) = above.pop() {
        let up = SubPath::parse(&above.join("/")).unwrap_or_default();
        let Ok(up_fd) = walk(base_fd.as_fd(), &up, false) else {
            break;
        };
        if file::unlink(up_fd.as_fd(), OsStr::new(last), file::Remove::Directory).is_err() {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn want(native: bool) -> Want<'static> {
        Want {
            native,
            group: 2_100_000_007,
            mount_permissions: Some(0o770),
            pool: None,
            capacity_bytes: 1 << 20,
        }
    }

    fn sub(s: &str) -> SubPath {
        SubPath::parse(s).unwrap()
    }

    /// On a local directory (neither CephFS nor NFS): a new directory is a plain
    /// FUSE volume with `mountPermissions`, a repeat takes it again, a directory
    /// that holds data is changed in nothing, and delete removes the volume and the
    /// directories its `subDir` made, never following a symlink out.
    #[test]
    fn volume_directories_are_made_taken_and_removed_beneath_the_share() {
        let share = tempfile::tempdir().unwrap();
        let root = share.path();
        let made = make(
            root,
            Kind::Nfs,
            &SubPath::default(),
            &sub("team/data"),
            &want(true),
        )
        .unwrap();
        assert_eq!(made.traits, Traits::Plain);
        assert!(made.not_native.unwrap().contains("not an NFS mount"));
        assert!(made.capacity.is_err());
        let mode = |p: &Path| {
            std::os::unix::fs::PermissionsExt::mode(&fs::metadata(p).unwrap().permissions())
                & 0o7777
        };
        assert_eq!(mode(&root.join("team/data")), 0o770);
        assert_eq!(
            make(
                root,
                Kind::Nfs,
                &SubPath::default(),
                &sub("team/data"),
                &want(true)
            )
            .unwrap()
            .traits,
            Traits::Plain
        );
        // Existing data: nothing is changed.
        fs::create_dir_all(root.join("old/data")).unwrap();
        fs::write(root.join("old/data/f"), "x").unwrap();
        fs::set_permissions(
            root.join("old/data"),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        let kept = make(
            root,
            Kind::Smb,
            &SubPath::default(),
            &sub("old/data"),
            &want(false),
        )
        .unwrap();
        assert!(kept.not_native.unwrap().contains("held data"));
        assert_eq!(mode(&root.join("old/data")), 0o700);
        // A symlink on the way is not followed.
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("evil")).unwrap();
        assert!(
            make(
                root,
                Kind::Smb,
                &SubPath::default(),
                &sub("evil/x"),
                &want(false)
            )
            .is_err()
        );
        assert!(!outside.path().join("x").exists());
        fs::write(outside.path().join("keep"), "k").unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("team/data/link")).unwrap();
        remove(root, &sub("team/data"), OnDelete::Delete, Traits::Plain).unwrap();
        assert!(!root.join("team").exists(), "the emptied parent goes too");
        assert!(outside.path().join("keep").exists());
        remove(root, &sub("team/data"), OnDelete::Delete, Traits::Plain).unwrap();
        assert!(remove(root, &sub("evil/x"), OnDelete::Delete, Traits::Plain).is_err());
        // Archive, twice, and retain.
        for _ in 0..2 {
            make(root, Kind::Smb, &sub("base"), &sub("v"), &want(false)).unwrap();
            remove(
                &root.join("base"),
                &sub("v"),
                OnDelete::Archive,
                Traits::Plain,
            )
            .unwrap();
        }
        let archived: Vec<_> = fs::read_dir(root.join("base"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(archived.len(), 2, "{archived:?}");
        make(root, Kind::Smb, &sub("base"), &sub("v"), &want(false)).unwrap();
        remove(
            &root.join("base"),
            &sub("v"),
            OnDelete::Retain,
            Traits::Plain,
        )
        .unwrap();
        assert!(root.join("base/v").is_dir());
    }
}
