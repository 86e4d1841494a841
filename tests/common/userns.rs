//! What a container runtime does for a pod in a user namespace (Kubernetes'
//! `hostUsers: false`), done here for real:
//!
//! - kubelet gives the pod 65536 IDs at a host base that is a multiple of 65536, never
//!   the first block (pkg/kubelet/userns/userns_manager.go: `userNsLength = 1 << 16`,
//!   the kubelet mapping starting at 65536 or above); uid and gid maps are the same;
//! - the runtime makes a user namespace with that mapping: runc spawns a process with
//!   `CLONE_NEWUSER` and the mapping and opens its `/proc/PID/ns/user`
//!   (libcontainer/internal/userns/usernsfd_linux.go, `spawnProc` and `Handles.Get`);
//!   crun opens the container process's own (src/libcrun/linux.c,
//!   `maybe_get_idmapped_mount`);
//! - for each volume it clones the mount kubelet's CSI driver published
//!   (`open_tree(OPEN_TREE_CLONE)`), attaches the mapping (`mount_setattr` with
//!   `MOUNT_ATTR_IDMAP`), and moves the clone into the container's root
//!   (`move_mount`): runc libcontainer/mount_linux.go `mountFd` and `mountViaFds`,
//!   crun `maybe_get_idmapped_mount` and `fs_move_mount_to`;
//! - the container's processes enter the namespace as the pod's uid, with the pod's
//!   fsGroup among their supplementary groups (kubelet puts `fsGroup` there).
//!
//! The clone is made with the product's own `sys::mount` wrappers, which native views
//! use too.
#![allow(dead_code)]

use std::fs;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

use crate::common::Ran;

/// kubelet's size of a pod's user namespace.
pub const POD_IDS: u32 = 1 << 16;

/// A pod's user namespace, kept alive by a process in it (as runc keeps its spawned
/// one until the mounts are made; here for the whole test, so that the pod's
/// processes can enter it).
pub struct PodUserns {
    holder: Child,
    /// The host ID the pod's 0 is.
    pub base: u32,
}

impl PodUserns {
    /// The namespace of a pod given the `block`th range of 65536 IDs (`block` ≥ 1).
    pub fn new(block: u32) -> PodUserns {
        assert!(
            block >= 1,
            "kubelet never maps a pod onto the host's first IDs"
        );
        let base = block * POD_IDS;
        let holder = Command::new("unshare")
            .args(["--user", "--", "sleep", "3600"])
            .stdin(Stdio::null())
            .spawn()
            .expect("unshare runs");
        let pid = holder.id();
        let ours = fs::read_link("/proc/self/ns/user").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while fs::read_link(format!("/proc/{pid}/ns/user")).ok().as_ref() == Some(&ours) {
            assert!(Instant::now() < deadline, "unshare made no user namespace");
            std::thread::sleep(Duration::from_millis(5));
        }
        // The parent namespace's root writes the maps, as the runtime does.
        let map = format!("0 {base} {POD_IDS}\n");
        fs::write(format!("/proc/{pid}/uid_map"), &map).unwrap();
        fs::write(format!("/proc/{pid}/gid_map"), &map).unwrap();
        PodUserns { holder, base }
    }

    /// `/proc/PID/ns/user` of the namespace.
    pub fn ns_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/user", self.holder.id()))
    }

    /// A command that runs `program` in the pod: in its user namespace as `uid`/`gid`
    /// (the pod's own IDs) with exactly the supplementary `groups`.
    pub fn command(&self, uid: u32, gid: u32, groups: &[u32], program: &[&str]) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--user={}", self.ns_path().display()))
            .args(["--", "setpriv"])
            .args(crate::common::setpriv_args(uid, gid, groups))
            .args(program);
        cmd
    }

    /// Runs `script` with `sh -c` in the pod as `uid` (and its own group) with `groups`,
    /// and returns what it printed; panics with its error if it fails.
    pub fn ok(&self, uid: u32, groups: &[u32], script: &str) -> String {
        let r = self.run(uid, uid, groups, script);
        assert!(r.ok, "in the pod as {uid} {groups:?}: {script}: {r:?}");
        r.stdout
    }

    /// Runs `script` with `sh -c` in the pod as `uid`/`gid` with `groups`.
    pub fn run(&self, uid: u32, gid: u32, groups: &[u32], script: &str) -> Ran {
        self.command(uid, gid, groups, &["sh", "-c", script])
            .stdin(Stdio::null())
            .output()
            .expect("nsenter runs")
            .into()
    }
}

impl Drop for PodUserns {
    fn drop(&mut self) {
        let _ = kill_process(
            Pid::from_raw(self.holder.id() as i32).unwrap(),
            Signal::KILL,
        );
        let _ = self.holder.wait();
    }
}

/// A volume in a "container root": an idmapped clone of a published target, unmounted
/// (lazily) on drop.
pub struct ContainerVolume {
    pub path: PathBuf,
}

impl Drop for ContainerVolume {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.path, rustix::mount::UnmountFlags::DETACH);
    }
}

/// Clones the mount at `target`, idmaps the clone with `pod`'s namespace and moves it
/// to `root/name`, as runc and crun do for a volume of a container in a user
/// namespace. `Err` with the errno of the step that failed (`mount_setattr` answers
/// `EINVAL` for a file system that cannot be idmapped).
pub fn idmapped_volume(
    pod: &PodUserns,
    target: &Path,
    root: &Path,
    name: &str,
) -> Result<ContainerVolume, String> {
    let path = root.join(name);
    fs::create_dir_all(&path).unwrap();
    let ns = fs::File::open(pod.ns_path()).unwrap();
    let tree = mountgroup::sys::mount::idmapped_clone(target, ns.as_fd(), false)
        .map_err(|e| format!("idmapped clone of {}: {e}", target.display()))?;
    mountgroup::sys::mount::attach_detached(tree.as_fd(), &path)
        .map_err(|e| format!("move_mount to {}: {e}", path.display()))?;
    Ok(ContainerVolume { path })
}

/// The `(uid, gid, mode)` a pod's process sees for `path` (`stat` in the pod as its
/// `uid`, with `groups`), or the error it got.
pub fn seen(
    pod: &PodUserns,
    uid: u32,
    groups: &[u32],
    path: &Path,
) -> Result<(u32, u32, u32), String> {
    let r = pod.run(
        uid,
        uid,
        groups,
        &format!("stat -c '%u %g %a' '{}'", path.display()),
    );
    if !r.ok {
        return Err(r.stderr);
    }
    let v: Vec<u32> = r
        .stdout
        .split_whitespace()
        .enumerate()
        .map(|(i, w)| {
            if i == 2 {
                u32::from_str_radix(w, 8).unwrap()
            } else {
                w.parse().unwrap()
            }
        })
        .collect();
    Ok((v[0], v[1], v[2]))
}
