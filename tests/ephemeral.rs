//! Inline volumes (KEP-596): fresh per-pod volumes on the share, and read-only views
//! of secrets that rotate atomically, driven over the CSI socket as kubelet does.

mod common;
#[path = "common/driver.rs"]
mod driver;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::*;
use driver::*;
use mountgroup::csi::pb;
use tonic::Code;

const EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";

/// A NodePublishVolume for an inline volume, as kubelet sends it (no staging path).
fn inline_req(
    handle: &str,
    target: &Path,
    group: &str,
    attrs: &[(&str, &str)],
) -> pb::NodePublishVolumeRequest {
    let mut ctx: HashMap<String, String> = attrs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    ctx.insert(EPHEMERAL.into(), "true".into());
    ctx.insert("csi.storage.k8s.io/pod.name".into(), "pod".into());
    pb::NodePublishVolumeRequest {
        volume_id: handle.into(),
        target_path: target.to_string_lossy().into(),
        volume_capability: Some(rw_cap(group)),
        volume_context: ctx,
        ..Default::default()
    }
}

fn secret_req(
    handle: &str,
    target: &Path,
    group: &str,
    secrets: &[(&str, &str)],
) -> pb::NodePublishVolumeRequest {
    let mut r = inline_req(handle, target, group, &[("source", "secrets")]);
    r.secrets = secrets
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    r
}

#[tokio::test(flavor = "multi_thread")]
async fn inline_volumes_live_and_die_with_their_pods() {
    let f = Fixture::new();
    let d = Driver::start(f.dir.path());
    let mut c = d.clients().await;
    let (ta, tb) = (
        f.dir.path().join("pod-a/vol"),
        f.dir.path().join("pod-b/vol"),
    );
    fs::create_dir_all(ta.parent().unwrap()).unwrap();
    fs::create_dir_all(tb.parent().unwrap()).unwrap();
    // Two pods, two handles, two fsGroups, at once; each publish twice.
    for _ in 0..2 {
        c.node
            .node_publish_volume(inline_req("csi-aaaa", &ta, "7001", &[("size", "5Mi")]))
            .await
            .unwrap();
        c.node
            .node_publish_volume(inline_req("csi-bbbb", &tb, "7002", &[]))
            .await
            .unwrap();
    }
    assert_eq!(owner(&ta).1, 7001);
    assert_eq!(owner(&tb).1, 7002);
    let ran = run_as(
        8001,
        8001,
        &[7001],
        &format!("echo mine > {}/file", ta.display()),
    );
    assert!(ran.ok, "{ran:?}");
    assert!(!tb.join("file").exists(), "each pod has its own volume");
    let rec: serde_json::Value =
        serde_json::from_slice(&fs::read(d.share.join("meta/csi-aaaa.json")).unwrap()).unwrap();
    assert_eq!(
        rec["capacity_bytes"],
        5 << 20,
        "the size attribute is the capacity"
    );
    // Inline volumes are not the controller's: ListVolumes does not show them.
    let list = c
        .controller
        .list_volumes(pb::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(list.entries.is_empty(), "{list:?}");
    // Unpublish (twice) deletes them.
    for _ in 0..2 {
        c.node
            .node_unpublish_volume(unpublish_req("csi-aaaa", &ta))
            .await
            .unwrap();
        c.node
            .node_unpublish_volume(unpublish_req("csi-bbbb", &tb))
            .await
            .unwrap();
    }
    assert!(d.mounts_below().is_empty(), "{:?}", d.mounts_below());
    assert_eq!(
        fs::read_dir(d.share.join("volumes")).unwrap().count(),
        0,
        "nothing left on the share"
    );
    assert_eq!(fs::read_dir(d.share.join("meta")).unwrap().count(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn attributes_are_checked_and_reach_nothing_else() {
    let f = Fixture::new();
    let d = Driver::start(f.dir.path());
    let mut c = d.clients().await;
    let t = f.dir.path().join("t");
    expect(
        c.node
            .node_publish_volume(inline_req("csi-x", &t, "1", &[("hostPath", "/etc")]))
            .await,
        Code::InvalidArgument,
        "hostPath",
    );
    expect(
        c.node
            .node_publish_volume(inline_req("csi-x", &t, "1", &[("size", "big")]))
            .await,
        Code::InvalidArgument,
        "volume_context.size",
    );
    expect(
        c.node
            .node_publish_volume(inline_req("../x", &t, "1", &[]))
            .await,
        Code::InvalidArgument,
        "volume_id",
    );
    let mut r = secret_req("csi-x", &t, "1", &[("a", "1")]);
    r.volume_context
        .insert("items".into(), "a=../../outside".into());
    expect(
        c.node.node_publish_volume(r).await,
        Code::InvalidArgument,
        "items",
    );
    let mut r = secret_req("csi-x", &t, "1", &[("a", "1")]);
    r.volume_context.insert("items".into(), "missing".into());
    expect(
        c.node.node_publish_volume(r).await,
        Code::InvalidArgument,
        "no key \"missing\"",
    );
    expect(
        c.node
            .node_publish_volume(secret_req("csi-x", &t, "1", &[]))
            .await,
        Code::InvalidArgument,
        "nodePublishSecretRef",
    );
    // A persistent volume's handle cannot be taken over inline.
    c.controller
        .create_volume(create_req("pvc-owned", 1 << 20))
        .await
        .unwrap();
    fs::write(d.share.join("volumes/pvc-owned/private"), "x").unwrap();
    expect(
        c.node
            .node_publish_volume(inline_req("pvc-owned", &t, "1", &[]))
            .await,
        Code::AlreadyExists,
        "persistent volume",
    );
    assert!(d.share.join("volumes/pvc-owned/private").exists());
    // Inline attributes on a persistent publish are refused.
    let staging = f.subdir("staging");
    c.node
        .node_stage_volume(stage_req("pvc-owned", &staging))
        .await
        .unwrap();
    let mut r = publish_req("pvc-owned", &staging, &t, "1");
    r.volume_context.insert("source".into(), "secrets".into());
    expect(
        c.node.node_publish_volume(r).await,
        Code::InvalidArgument,
        "inline (ephemeral) volumes only",
    );
    c.node
        .node_unstage_volume(unstage_req("pvc-owned", &staging))
        .await
        .unwrap();
    assert!(!t.exists(), "no refused publish left a target");
    assert!(d.mounts_below().is_empty());
}

fn read_version(root: &Path) -> Option<Vec<String>> {
    // Resolve ..data once, then read every file of that version, as a watcher does.
    let data = fs::read_link(root.join("..data")).ok()?;
    let dir = root.join(data);
    let mut out = Vec::new();
    for k in ["username", "password", "config/app.conf"] {
        out.push(fs::read_to_string(dir.join(k)).ok()?);
    }
    Some(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn secret_views_are_read_only_and_rotate_atomically() {
    const SECRET_A: &str = "version-a-5f1c";
    let f = Fixture::new();
    let d = Driver::start(f.dir.path());
    let mut c = d.clients().await;
    let target = f.dir.path().join("secret-vol");
    let payload = |v: &str| {
        vec![
            ("username", format!("user-{v}")),
            ("password", format!("pass-{v}")),
            ("app.conf", format!("conf-{v}")),
        ]
    };
    let request = |v: &str| {
        let p = payload(v);
        let mut r = inline_req(
            "csi-secret",
            &target,
            "4000",
            &[
                ("source", "secrets"),
                ("items", "username,password,app.conf=config/app.conf"),
            ],
        );
        r.secrets = p.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        r
    };
    c.node.node_publish_volume(request(SECRET_A)).await.unwrap();

    // What the pod sees: its fsGroup, read-only modes, content.
    assert_eq!(owner(&target.join("username")).1, 4000);
    let m = fs::metadata(target.join("username")).unwrap();
    assert_eq!(
        (
            std::os::unix::fs::MetadataExt::gid(&m),
            std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777
        ),
        (4000, 0o440)
    );
    assert_eq!(
        fs::read_to_string(target.join("config/app.conf")).unwrap(),
        format!("conf-{SECRET_A}")
    );
    let ran = run_as(
        9001,
        9001,
        &[4000],
        &format!("cat {}/password", target.display()),
    );
    assert!(
        ran.ok && ran.stdout == format!("pass-{SECRET_A}"),
        "{ran:?}"
    );
    let ran = run_as(
        9002,
        9002,
        &[],
        &format!("cat {}/password", target.display()),
    );
    assert!(!ran.ok, "outside the group: {ran:?}");
    // Read-only whatever the pod asks, root included.
    let t = &target;
    assert_eq!(errno(fs::write(t.join("password"), "x")), libc::EROFS);
    assert_eq!(errno(fs::write(t.join("new"), "x")), libc::EROFS);
    assert_eq!(errno(fs::remove_file(t.join("username"))), libc::EROFS);
    assert_eq!(
        errno(fs::set_permissions(
            t.join("password"),
            std::os::unix::fs::PermissionsExt::from_mode(0o777)
        )),
        libc::EROFS
    );
    assert_eq!(errno(fs::create_dir(t.join("d"))), libc::EROFS);
    let pid = fs::read_to_string(d.state.join("node-state.json")).unwrap();

    // Rotation under a reader that reads every file in a tight loop.
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(AtomicU64::new(0));
    let reader = {
        let (stop, seen, target) = (Arc::clone(&stop), Arc::clone(&seen), target.clone());
        std::thread::spawn(move || {
            let mut versions = std::collections::BTreeSet::new();
            while !stop.load(Ordering::Relaxed) {
                if let Some(files) = read_version(&target) {
                    let tags: std::collections::BTreeSet<&str> =
                        files.iter().map(|s| s.split_once('-').unwrap().1).collect();
                    assert_eq!(tags.len(), 1, "a mix of versions: {files:?}");
                    versions.insert(tags.into_iter().next().unwrap().to_string());
                    seen.fetch_add(1, Ordering::Relaxed);
                }
            }
            versions
        })
    };
    for round in 0..20 {
        let v = if round % 2 == 0 {
            "version-b"
        } else {
            SECRET_A
        };
        c.node.node_publish_volume(request(v)).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let versions = reader.join().unwrap();
    assert!(
        versions.len() == 2 && seen.load(Ordering::Relaxed) > 20,
        "both versions read: {versions:?}"
    );
    // A republish with unchanged content changes nothing and never unmounts.
    let before = fs::read_link(target.join("..data")).unwrap();
    c.node.node_publish_volume(request(SECRET_A)).await.unwrap();
    assert_eq!(fs::read_link(target.join("..data")).unwrap(), before);
    assert_eq!(
        fs::read_to_string(d.state.join("node-state.json")).unwrap(),
        pid,
        "same view process, no remount"
    );

    // The content lives in memory only: not on the share, not in the state, not logged.
    let out = std::process::Command::new("grep")
        .args(["-r", SECRET_A])
        .arg(&d.state)
        .arg(&d.share)
        .output()
        .unwrap();
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!d.log_text().contains(SECRET_A));
    let tmpfs: Vec<PathBuf> = d
        .mounts_below()
        .into_iter()
        .filter(|m| m.starts_with(d.root.join("run")))
        .collect();
    assert_eq!(tmpfs.len(), 1, "one private tmpfs: {tmpfs:?}");
    c.node
        .node_unpublish_volume(unpublish_req("csi-secret", &target))
        .await
        .unwrap();
    assert!(
        d.mounts_below().is_empty(),
        "tmpfs gone with the view: {:?}",
        d.mounts_below()
    );
    assert!(!tmpfs[0].exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn after_a_reboot_a_secret_view_waits_for_kubelets_publish() {
    let f = Fixture::new();
    let mut d = Driver::start(f.dir.path());
    let mut c = d.clients().await;
    let target = f.dir.path().join("creds");
    c.node
        .node_publish_volume(secret_req("csi-boot", &target, "5", &[("token", "t-1")]))
        .await
        .unwrap();
    assert_eq!(fs::read_to_string(target.join("token")).unwrap(), "t-1");
    // A reboot, as far as this node is concerned: driver, view and tmpfs all gone,
    // the state file left.
    d.kill9();
    for m in d.mounts_below().into_iter().rev() {
        rustix::mount::unmount(&m, rustix::mount::UnmountFlags::DETACH).unwrap();
    }
    d.restart();
    assert!(
        d.log_text().contains("secret view waits for kubelet"),
        "{}",
        d.log_text()
    );
    assert!(!is_mounted(&target), "no view of an empty directory");
    // kubelet publishes again after the reboot: content and view come back.
    let mut c = d.clients().await;
    c.node
        .node_publish_volume(secret_req("csi-boot", &target, "5", &[("token", "t-2")]))
        .await
        .unwrap();
    assert_eq!(fs::read_to_string(target.join("token")).unwrap(), "t-2");
    c.node
        .node_unpublish_volume(unpublish_req("csi-boot", &target))
        .await
        .unwrap();
    assert!(d.mounts_below().is_empty(), "{:?}", d.mounts_below());
}
