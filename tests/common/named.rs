//! Volumes on the shares a StorageClass or a PV names, which the driver mounts itself,
//! as users of csi-driver-smb and csi-driver-nfs write their classes and PVs, and as
//! external-provisioner and kubelet call the driver for them (kubelet.rs). Included
//! with `#[path]` beside `common`, `driver` and `kubelet`.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mountgroup::csi::pb;

use super::common::Unmount;
use super::driver::{Clients, unpublish_req, unstage_req};
use super::kubelet::{self, KubeletDirs, Pod, Pv, Pvc, StorageClass};

/// A volume of a named share as a pod has it: its PV, where kubelet staged and
/// published it, and an unmount of the target on drop (a failed test's).
pub struct Published {
    pub pv: Pv,
    pub pod: Pod,
    pub staging: PathBuf,
    pub target: PathBuf,
    _unmount: Unmount,
}

impl Published {
    /// NodeStageVolume with the node-stage Secret `secrets`, then NodePublishVolume,
    /// as kubelet makes them for the first pod `pod` of the PV `pv`.
    pub async fn stage_and_publish(
        c: &mut Clients,
        dirs: &KubeletDirs,
        pv: Pv,
        pod: &Pod,
        secrets: &HashMap<String, String>,
    ) -> Result<Published, tonic::Status> {
        c.node
            .node_stage_volume(kubelet::stage(dirs, &pv, pod, secrets))
            .await?;
        Published::publish(c, dirs, pv, pod).await
    }

    /// NodePublishVolume of a PV staged already, for the pod `pod`.
    pub async fn publish(
        c: &mut Clients,
        dirs: &KubeletDirs,
        pv: Pv,
        pod: &Pod,
    ) -> Result<Published, tonic::Status> {
        let req = kubelet::publish_pvc(dirs, &pv, pod, "data", &HashMap::new());
        let target = PathBuf::from(&req.target_path);
        let staging = PathBuf::from(&req.staging_target_path);
        c.node.node_publish_volume(req).await?;
        Ok(Published {
            pv,
            pod: pod.clone(),
            staging,
            target: target.clone(),
            _unmount: Unmount(target),
        })
    }

    /// NodeUnpublishVolume, then NodeUnstageVolume, as kubelet makes them when the pod
    /// goes.
    pub async fn unpublish_unstage(&self, c: &mut Clients) {
        self.unpublish(c).await;
        c.node
            .node_unstage_volume(unstage_req(&self.pv.volume_handle, &self.staging))
            .await
            .unwrap();
    }

    pub async fn unpublish(&self, c: &mut Clients) {
        c.node
            .node_unpublish_volume(unpublish_req(&self.pv.volume_handle, &self.target))
            .await
            .unwrap();
    }
}

/// CreateVolume as external-provisioner makes it for `pvc` of `class` with the
/// provisioner Secret `secrets`: the PV it makes of the answer.
pub async fn provision(
    c: &mut Clients,
    class: &StorageClass,
    pvc: &Pvc,
    secrets: &HashMap<String, String>,
) -> Result<Pv, tonic::Status> {
    let volume = c
        .controller
        .create_volume(kubelet::provision(class, pvc, secrets))
        .await?
        .into_inner()
        .volume
        .unwrap();
    Ok(kubelet::class_pv(&volume, class, pvc))
}

/// DeleteVolume as external-provisioner makes it for a PV of a class whose
/// provisioner Secret is `secrets` (v5.3.0 `Delete`: the Secret the PV's class names).
pub async fn delete(c: &mut Clients, pv: &Pv, secrets: &HashMap<String, String>) {
    c.controller
        .delete_volume(pb::DeleteVolumeRequest {
            volume_id: pv.volume_handle.clone(),
            secrets: secrets.clone(),
        })
        .await
        .unwrap();
}

/// Every entry under `dir`, its owner, group, mode and modification time: what the
/// driver must leave as it was on a static volume's share.
pub fn tree(dir: &Path) -> Vec<(PathBuf, u32, u32, u32, i64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let m = std::fs::symlink_metadata(&d).unwrap();
        out.push((
            d.strip_prefix(dir).unwrap().to_path_buf(),
            m.uid(),
            m.gid(),
            m.mode(),
            m.mtime(),
        ));
        if m.is_dir() {
            for e in std::fs::read_dir(&d).unwrap() {
                todo.push(e.unwrap().path());
            }
        }
    }
    out.sort();
    out
}

/// Data already on a share, as a pod's predecessors left it: files and directories of
/// several owners and modes, made on the server's own directory `dir`.
pub fn existing_data(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let made: [(&str, Option<&str>, u32, u32); 5] = [
        ("notes.txt", Some("notes\n"), 1234, 0o644),
        ("private.key", Some("secret\n"), 5000, 0o600),
        ("private", None, 7000, 0o700),
        ("private/inner.txt", Some("inner\n"), 7000, 0o640),
        ("shared", None, 0, 0o755),
    ];
    std::fs::create_dir_all(dir).unwrap();
    for (name, body, uid, mode) in made {
        let p = dir.join(name);
        match body {
            Some(b) => std::fs::write(&p, b).unwrap(),
            None => std::fs::create_dir(&p).unwrap(),
        }
        std::os::unix::fs::chown(&p, Some(uid), Some(uid)).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

/// Whether `needle` appears in any process's command line, the driver's log and its
/// views' logs under `root`, or the mount table: where a password must never be.
pub fn leaked(root: &Path, needle: &str) -> Vec<String> {
    let mut places = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            if String::from_utf8_lossy(&cmd).contains(needle) {
                places.push(format!("{}/cmdline", e.path().display()));
            }
        }
    }
    for f in ["/proc/self/mountinfo", "/proc/mounts"] {
        if std::fs::read_to_string(f).unwrap().contains(needle) {
            places.push(f.into());
        }
    }
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if m.is_dir() && !super::common::is_mounted(&p) {
                todo.push(p);
            } else if m.is_file()
                && p.extension().is_some_and(|x| x == "log" || x == "json")
                && std::fs::read_to_string(&p).is_ok_and(|t| t.contains(needle))
            {
                places.push(p.display().to_string());
            }
        }
    }
    places
}

/// A driver of its own under `root` (metrics on, no share key, JSON logs) and a volume
/// of `class` provisioned with the Secret `secret`, staged with it and published for a
/// pod of the fsGroup `group`: the driver, its clients, the kubelet directories, the
/// publish, and the volume's directory as the server has it (`served`, the directory
/// the server serves as the class's share, and the PV's name below it).
pub async fn named_publish(
    root: &Path,
    class: &StorageClass,
    secret: &HashMap<String, String>,
    served: &Path,
    group: u32,
) -> (
    super::driver::Driver,
    Clients,
    KubeletDirs,
    Published,
    PathBuf,
) {
    std::fs::create_dir_all(root).unwrap();
    let d = super::driver::Driver::start_with_metrics_and(root, &[]);
    let mut c = d.clients().await;
    let dirs = KubeletDirs {
        root: root.join("kubelet"),
    };
    let pvc = Pvc::new("vol");
    let pv = provision(&mut c, class, &pvc, secret).await.unwrap();
    let pod = Pod::new("app", Some(i64::from(group)));
    let p = Published::stage_and_publish(&mut c, &dirs, pv, &pod, secret)
        .await
        .unwrap();
    (d, c, dirs, p, served.join(pvc.pv_name()))
}
