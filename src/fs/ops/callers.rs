//! Whom the view acts as: the daemon, or each caller on a share that checks them
//! (`ownership=share`), and who checks permissions, the kernel or the share.

use std::os::fd::AsFd;
use std::sync::atomic::Ordering;

use crate::sys::Errno;
use crate::sys::file::{self, Kind};

use super::super::error::{FsError, FsResult};
use super::super::view::{Caller, Policy};
use super::ViewFs;

impl ViewFs {
    /// Whether the view acts as each caller on its share (`ownership=share`).
    pub fn acts_as_callers(&self) -> bool {
        self.cfg.acts_as_callers
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
        self.cfg.share_checks
    }

    /// Whether the kernel checks permissions (the mount's `default_permissions`): not
    /// under CIFS `noperm`, nor where the share checks them ([`ViewFs::share_checks`]).
    pub fn kernel_checks(&self) -> bool {
        self.cfg.checks_access
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
        if !self.cfg.acts_as_callers {
            return Ok(None);
        }
        if uid == u32::MAX || gid == u32::MAX {
            return Err(FsError::Os(Errno(libc::EOVERFLOW)));
        }
        let groups = match pid {
            // A request the kernel sends without credentials (RELEASE) has none at all.
            0 if (uid, gid) == (0, 0) => Vec::new(),
            0 => {
                if !self.warned.unseen_caller.swap(true, Ordering::Relaxed) {
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
        if (uid, fsgid) == self.cfg.daemon_ids && groups.is_empty() {
            return Ok(None);
        }
        Ok(Some(crate::sys::creds::act_as(uid, fsgid, &groups)?))
    }

    /// The file-system gid and groups a caller with `gid` and `groups` acts with on
    /// the share ([`ViewFs::act_for`]).
    fn caller_ids(&self, gid: u32, mut groups: Vec<u32>) -> (u32, Vec<u32>) {
        let Policy::Plain { gids, .. } = self.cfg.policy else {
            return (gid, groups);
        };
        let in_pod_group = self
            .cfg
            .policy
            .group()
            .is_some_and(|g| gid == g || groups.contains(&g));
        for g in &mut groups {
            *g = gids.disk(*g);
        }
        let own = gids.disk(gid);
        let fsgid = match (in_pod_group, self.cfg.policy.group()) {
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
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::*;

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
        v.cfg.share_checks = true;
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
            keep > std::time::Duration::ZERO && keep <= v.cfg.attr_timeout,
            "{keep:?}"
        );
        // A name new to the kernel is read afresh, and kept for the attribute
        // timeout: a stat right after its lookup asks nothing more.
        std::fs::write(dir.path().join("g"), b"y").unwrap();
        v.cfg.attr_timeout = std::time::Duration::from_millis(50);
        let (_, keep) = v.lookup_for_kernel(ROOT, OsStr::new("g")).unwrap();
        assert_eq!(keep, None, "read afresh");
        // Held, and last read afresh longer ago than the attribute timeout: answered
        // from the cache, and not kept at all.
        std::thread::sleep(2 * v.cfg.attr_timeout);
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
}
