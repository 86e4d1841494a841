//! Native views: on a share that can be idmapped and is mounted `nosuid,nodev`, a
//! volume gets a group of its own at CreateVolume, and each publish is an idmapped
//! bind mount that shows that group as the pod's fsGroup, served by no process. Driven
//! through the CSI socket as kubelet drives it; the fallbacks say why.

#[path = "common/apiserver.rs"]
mod apiserver;
mod common;
#[path = "common/driver.rs"]
mod driver;
#[path = "common/keeper.rs"]
mod keeper;
#[path = "common/userns.rs"]
mod userns;

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use common::*;
use driver::*;
use keeper::*;
use mountgroup::csi::pb;

const MEMBER: u32 = 1000;

/// A share mounted as native views need it: a tmpfs (idmappable from Linux 6.3),
/// `nosuid,nodev`. Unmounted on drop.
fn native_share(root: &Path) -> Unmount {
    let share = root.join("share");
    fs::create_dir_all(&share).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "nosuid,nodev,mode=0755", "tmpfs"])
        .arg(&share)
        .status()
        .unwrap()
        .success();
    assert!(ok, "tmpfs on {}", share.display());
    Unmount(share)
}

fn publish(
    id: &str,
    staging: &Path,
    target: &Path,
    flags: &[&str],
    group: &str,
) -> pb::NodePublishVolumeRequest {
    publish_flags(id, staging, target, flags, group, false)
}

/// Mounts the share again with `options` (`remount,suid,dev`: a share whose own mount
/// honours set-id bits, where a native view may not serve).
fn remount(share: &Unmount, options: &str) {
    let ok = Command::new("mount")
        .args(["-o", options])
        .arg(&share.0)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mount -o {options} {}", share.0.display());
}

/// A native share, a driver without metrics on it, and the native volume `vol` staged:
/// the share's guard, the driver, its clients and the staging path.
async fn native_volume(f: &Fixture) -> (Unmount, Driver, Clients, std::path::PathBuf) {
    let share = native_share(f.dir.path());
    let d = Driver::start(f.dir.path());
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    c.create_and_stage("vol", &staging).await;
    (share, d, c, staging)
}

/// The volume's record on the share (its metadata file).
fn record(d: &Driver, id: &str) -> serde_json::Value {
    serde_json::from_slice(&fs::read(d.share.join(format!("meta/{id}.json"))).unwrap()).unwrap()
}

/// A driver with metrics that asks the stand-in API server `api` about pods.
fn driver_asking(root: &Path, api: &apiserver::ApiServer) -> Driver {
    let args = api.args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Driver::start_with_metrics_and(root, &args)
}

fn is_idmapped(path: &Path) -> bool {
    mountgroup::sys::mount::is_idmapped(path).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_native_volume_is_an_idmapped_bind_mount_per_pod() {
    let f = Fixture::new();
    let root = f.dir.path();
    let _share = native_share(root);
    let mut d = Driver::start_with_metrics(root);
    let addr = d.metrics_addr();
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    c.create_and_stage("vol", &staging).await;

    // The volume's own group, its root setgid in it.
    let group = record(&d, "vol")["group"]
        .as_u64()
        .expect("a native volume has a group") as u32;
    assert!(group >= 2_000_000_000, "{group}");
    let data = d.share.join("volumes/vol");
    assert_eq!(owner(&data), (0, group, 0o2775));

    // Two pods, two fsGroups, one volume.
    let (a, b) = (root.join("pod-a"), root.join("pod-b"));
    c.node
        .node_publish_volume(publish("vol", &staging, &a, &[], "4242"))
        .await
        .unwrap();
    c.node
        .node_publish_volume(publish("vol", &staging, &b, &["ro"], "5555"))
        .await
        .unwrap();
    for t in [&a, &b] {
        assert!(is_idmapped(t), "{} is not an idmapped mount", t.display());
        assert!(
            view_processes(t).is_empty(),
            "a process serves {}",
            t.display()
        );
        assert_eq!(mechanism(&addr, t), ("native".into(), String::new()));
    }
    // What kubelet gives a new volume's first pod: a setgid root in the pod's group.
    assert_eq!(owner(&a), (0, 4242, 0o2775));
    assert_eq!(owner(&b), (0, 5555, 0o2775));
    // A member of the group makes files as it likes; they are born in the volume's
    // group, which each pod sees as its own.
    let r = run_as(
        MEMBER,
        MEMBER,
        &[4242],
        &format!("umask 002 && mkdir {0}/d && echo hi > {0}/d/f", a.display()),
    );
    assert!(r.ok, "{r:?}");
    assert_eq!(owner(&data.join("d/f")), (MEMBER, group, 0o664));
    assert_eq!(owner(&a.join("d/f")), (MEMBER, 4242, 0o664));
    assert_eq!(owner(&b.join("d/f")), (MEMBER, 5555, 0o664));
    assert_eq!(
        owner(&a.join("d")),
        (MEMBER, 4242, 0o2775),
        "setgid inherited"
    );
    // ro is a mount attribute; another user of pod B's group reads what A wrote.
    let r = run_as(
        2000,
        2000,
        &[5555],
        &format!("cat {0}/d/f && ! touch {0}/x", b.display()),
    );
    assert!(r.ok && r.stdout.trim() == "hi", "{r:?}");
    // chmod is the kernel's, on disk.
    let r = run_as(
        MEMBER,
        MEMBER,
        &[4242],
        &format!("chmod 640 {}/d/f", a.display()),
    );
    assert!(r.ok, "{r:?}");
    assert_eq!(owner(&data.join("d/f")).2, 0o640);

    // Stats and expansion as for any volume.
    let stats = c
        .node
        .node_get_volume_stats(stats_req("vol", &a))
        .await
        .unwrap()
        .into_inner();
    assert!(!stats.usage.is_empty(), "{stats:?}");
    c.controller
        .controller_expand_volume(pb::ControllerExpandVolumeRequest {
            volume_id: "vol".into(),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: 2 << 30,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    c.node
        .node_expand_volume(pb::NodeExpandVolumeRequest {
            volume_id: "vol".into(),
            volume_path: a.to_string_lossy().into(),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: 2 << 30,
                limit_bytes: 0,
            }),
            staging_target_path: staging.to_string_lossy().into(),
            ..Default::default()
        })
        .await
        .unwrap();

    // A restart of the driver (SIGKILL) touches nothing: kubelet's repeated publish is
    // OK, and the mounts are the same.
    d.kill9();
    d.restart();
    let mut c = d.clients().await;
    c.node
        .node_publish_volume(publish("vol", &staging, &a, &[], "4242"))
        .await
        .unwrap();
    assert!(is_idmapped(&a) && is_idmapped(&b));
    assert_eq!(owner(&a.join("d/f")), (MEMBER, 4242, 0o640));

    // Unpublish: the mounts and the directories kubelet did not make go.
    for t in [&a, &b] {
        c.node
            .node_unpublish_volume(unpublish_req("vol", t))
            .await
            .unwrap();
        assert!(!t.exists(), "{} left", t.display());
    }
    c.node
        .node_unstage_volume(unstage_req("vol", &staging))
        .await
        .unwrap();
}

/// A node's reboot: every mount is gone, the state file is not. The restarted driver
/// binds the staging path again and mounts the native views again, before kubelet's
/// first call; nothing else was running for them.
#[tokio::test(flavor = "multi_thread")]
async fn a_reboot_brings_native_views_back() {
    let f = Fixture::new();
    let root = f.dir.path();
    let _share = native_share(root);
    let mut d = Driver::start(root);
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    c.create_and_stage("vol", &staging).await;
    let t = root.join("pod");
    c.node
        .node_publish_volume(publish("vol", &staging, &t, &["noexec"], "4242"))
        .await
        .unwrap();
    fs::write(t.join("kept"), "x").unwrap();
    d.kill9();
    for m in [&t, &staging] {
        mountgroup::sys::mount::unmount_lazy(m).unwrap();
    }
    assert!(!is_idmapped(&t) && !t.join("kept").exists());
    d.restart();
    assert!(is_idmapped(&t), "the native view is back");
    assert_eq!(owner(&t.join("kept")).1, 4242);
    let (flags, _) = mount_entry(&t);
    assert!(flags.iter().any(|f| f == "noexec"), "{flags:?}");
}

/// Where a native view cannot serve, a FUSE view does, and the metric says why: the
/// native presentation (`fuse-native`) where only the mechanism cannot serve, the
/// options' own where the request asked for FUSE semantics; a volume of a share that
/// is not `nosuid,nodev` is not native at all.
#[tokio::test(flavor = "multi_thread")]
async fn fallbacks_say_why() {
    let f = Fixture::new();
    let root = f.dir.path();
    let share = native_share(root);
    let d = Driver::start_with_metrics(root);
    let addr = d.metrics_addr();
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    c.create_and_stage("vol", &staging).await;
    let t = |name: &str| root.join(name);
    let cases: [(&str, &[&str], (&str, &str)); 3] = [
        (
            "cifs",
            &["uid=1000", "file_mode=0644"],
            ("fuse", "cifs-options"),
        ),
        ("off", &["ownership=off"], ("fuse", "view-option")),
        ("tuned", &["attr_timeout=5", "noatime"], ("native", "")),
    ];
    for (name, flags, _) in &cases {
        c.node
            .node_publish_volume(publish("vol", &staging, &t(name), flags, "4242"))
            .await
            .unwrap();
    }
    for (name, _, (mech, why)) in &cases {
        assert_eq!(
            mechanism(&addr, &t(name)),
            (mech.to_string(), why.to_string()),
            "{name}"
        );
    }
    // The share remounted without nosuid,nodev: a new publish of the native volume is
    // its FUSE twin, which shows the same.
    remount(&share, "remount,suid,dev");
    c.node
        .node_publish_volume(publish("vol", &staging, &t("twin"), &[], "4242"))
        .await
        .unwrap();
    remount(&share, "remount,nosuid,nodev");
    assert_eq!(
        mechanism(&addr, &t("twin")),
        ("fuse-native".into(), "share".into())
    );
    assert!(!is_idmapped(&t("twin")) && view_processes(&t("twin")).len() == 1);

    // A volume of a share that is not nosuid,nodev is a FUSE volume, as before.
    let g = Fixture::new();
    let d2 = Driver::start_with_metrics(g.dir.path());
    let addr2 = d2.metrics_addr();
    let mut c2 = d2.clients().await;
    let staging2 = g.subdir("staging");
    c2.create_and_stage("old", &staging2).await;
    assert!(record(&d2, "old").get("group").is_none());
    let t2 = g.dir.path().join("t");
    c2.node
        .node_publish_volume(publish("old", &staging2, &t2, &[], "4242"))
        .await
        .unwrap();
    assert_eq!(
        mechanism(&addr2, &t2),
        ("fuse".into(), "share-at-create".into())
    );
    assert_eq!(owner(&t2).1, 4242);
}

/// Mounts `dir` again at `at` as a bind with `options` (`suid,dev`: a mount of the same
/// file system that honours set-id bits). Unmounted on drop.
fn bind(dir: &Path, at: &Path, options: &str) -> Unmount {
    fs::create_dir_all(at).unwrap();
    let ok = Command::new("mount")
        .arg("--bind")
        .arg(dir)
        .arg(at)
        .status()
        .unwrap()
        .success();
    assert!(ok, "bind {} on {}", dir.display(), at.display());
    let guard = Unmount(at.to_path_buf());
    let ok = Command::new("mount")
        .args(["-o", &format!("remount,bind,{options}")])
        .arg(at)
        .status()
        .unwrap()
        .success();
    assert!(ok, "remount {options} {}", at.display());
    guard
}

/// What a pod makes on a native view must be inert on every mount of the share's file
/// system, not only on the share's own: a bind of the share elsewhere that honours
/// set-id bits (the same superblock) turns new publishes into the twin, a native view
/// that is gone comes back as the twin, and a volume made then is a FUSE volume that
/// says why at every publish. A share that is a directory bound onto itself
/// `nosuid,nodev` does not qualify: the root file system under it honours set-id bits.
#[tokio::test(flavor = "multi_thread")]
async fn every_mount_of_the_shares_file_system_must_be_nosuid_nodev() {
    let f = Fixture::new();
    let root = f.dir.path();
    let share = native_share(root);
    let d = Driver::start_with_metrics(root);
    let addr = d.metrics_addr();
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    c.create_and_stage("vol", &staging).await;
    let first = root.join("first");
    c.node
        .node_publish_volume(publish("vol", &staging, &first, &[], "4242"))
        .await
        .unwrap();
    assert!(is_idmapped(&first));
    let elsewhere = bind(&share.0, &root.join("elsewhere"), "suid,dev");
    let second = root.join("second");
    c.node
        .node_publish_volume(publish("vol", &staging, &second, &[], "4242"))
        .await
        .unwrap();
    assert_eq!(
        mechanism(&addr, &second),
        ("fuse-native".into(), "share".into())
    );
    // The native view is gone (a pod's mount namespace kept nothing); kubelet publishes
    // it again: it is checked again.
    mountgroup::sys::mount::unmount_lazy(&first).unwrap();
    c.node
        .node_publish_volume(publish("vol", &staging, &first, &[], "4242"))
        .await
        .unwrap();
    assert!(!is_idmapped(&first));
    assert_eq!(
        mechanism(&addr, &first),
        ("fuse-native".into(), "share".into())
    );
    // A volume made now is a FUSE volume, and says why.
    let staging2 = f.subdir("staging2");
    c.create_and_stage("late", &staging2).await;
    let rec = record(&d, "late");
    assert!(rec.get("group").is_none(), "{rec}");
    let why = rec["not_native"].as_str().unwrap();
    assert!(
        why.contains("elsewhere") && why.contains("lacks nosuid,nodev"),
        "{why}"
    );
    let late = root.join("late");
    c.node
        .node_publish_volume(publish("late", &staging2, &late, &[], "4242"))
        .await
        .unwrap();
    assert_eq!(
        mechanism(&addr, &late),
        ("fuse".into(), "share-at-create".into())
    );
    drop(elsewhere);

    // A directory bound onto itself nosuid,nodev, on a file system (the node's disk,
    // here a tmpfs) whose own mount honours set-id bits.
    let g = Fixture::new();
    let disk = g.subdir("disk");
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "mode=0755", "tmpfs"])
        .arg(&disk)
        .status()
        .unwrap()
        .success();
    assert!(ok, "tmpfs on {}", disk.display());
    let _disk = Unmount(disk.clone());
    let dir = disk.join("share");
    let _self_bound = bind(&dir, &dir, "nosuid,nodev");
    let d2 = Driver::start_with(g.dir.path(), dir.clone(), &["--share-key-file", "none"]);
    let mut c2 = d2.clients().await;
    c2.create_and_stage("vol", &g.subdir("staging")).await;
    let rec: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.join("meta/vol.json")).unwrap()).unwrap();
    assert!(rec.get("group").is_none(), "{rec}");
    let why = rec["not_native"].as_str().unwrap();
    assert!(
        why.contains(&format!("{} (self) lacks nosuid,nodev", disk.display())),
        "{why}"
    );
}

/// A node's reboot without its share: the restarted driver must serve nothing from
/// the empty directories the share's mounts leave (the node's own disk), say why, and
/// serve again once the share is back and kubelet stages and publishes again.
#[tokio::test(flavor = "multi_thread")]
async fn a_reboot_without_the_share_serves_nothing_until_it_is_back() {
    let f = Fixture::new();
    let root = f.dir.path();
    let share = native_share(root);
    // Holds the share's content while its mount is gone.
    let held = bind(&share.0, &root.join("held"), "nosuid,nodev");
    let mut d = Driver::start(root);
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    c.create_and_stage("vol", &staging).await;
    let native = root.join("native");
    let fuse = root.join("fuse");
    c.node
        .node_publish_volume(publish("vol", &staging, &native, &[], "4242"))
        .await
        .unwrap();
    c.node
        .node_publish_volume(publish("vol", &staging, &fuse, &["ownership=off"], "4242"))
        .await
        .unwrap();
    fs::write(native.join("kept"), "x").unwrap();
    // The reboot: every process and every mount is gone, the share's mount too.
    d.kill9();
    for (pid, _) in view_processes(&fuse) {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    for m in [&native, &fuse, &staging, &share.0] {
        mountgroup::sys::mount::unmount_lazy(m).unwrap();
    }
    d.restart();
    for t in [&native, &fuse] {
        assert!(
            !is_mounted(t) && !is_idmapped(t),
            "{} is served from the node's disk",
            t.display()
        );
    }
    assert!(d.log_text().contains("not served until the share is back"));
    // kubelet publishes again before the share is back: refused, nothing served.
    let mut c = d.clients().await;
    let err = c
        .node
        .node_publish_volume(publish("vol", &staging, &native, &[], "4242"))
        .await
        .unwrap_err();
    assert!(err.message().contains("cannot be served"), "{err:?}");
    assert!(!is_idmapped(&native));
    // The share is back: kubelet stages and publishes again.
    let _back = bind(&held.0, &share.0, "nosuid,nodev");
    c.node
        .node_stage_volume(stage_req("vol", &staging))
        .await
        .unwrap();
    for (t, flags) in [(&native, &[][..]), (&fuse, &["ownership=off"][..])] {
        c.node
            .node_publish_volume(publish("vol", &staging, t, flags, "4242"))
            .await
            .unwrap();
        assert_eq!(owner(&t.join("kept")).1, 4242, "{}", t.display());
    }
    for t in [&native, &fuse] {
        c.node
            .node_unpublish_volume(unpublish_req("vol", t))
            .await
            .unwrap();
    }
}

/// A pod's root may chown and chmod the volume's root through a native view; the next
/// stage and publish give it back what every pod of the volume relies on (root, the
/// volume's group, 2775), as kubelet's OnRootMismatch would.
#[tokio::test(flavor = "multi_thread")]
async fn stage_and_publish_restore_a_native_volumes_root() {
    let f = Fixture::new();
    let root = f.dir.path();
    let (_share, d, mut c, staging) = native_volume(&f).await;
    let group = record(&d, "vol")["group"].as_u64().unwrap() as u32;
    let on_disk = d.share.join("volumes/vol");
    let t = root.join("pod");
    c.node
        .node_publish_volume(publish("vol", &staging, &t, &[], "4242"))
        .await
        .unwrap();
    let r = run_as(
        0,
        0,
        &[],
        &format!("chgrp 0 {0} && chmod 00700 {0}", t.display()),
    );
    assert!(r.ok, "{r:?}");
    assert_eq!(owner(&on_disk), (0, 0, 0o700));
    c.node
        .node_stage_volume(stage_req("vol", &staging))
        .await
        .unwrap();
    assert_eq!(owner(&on_disk), (0, group, 0o2775));
    let r = run_as(
        0,
        0,
        &[],
        &format!("chown 1000:0 {0} && chmod 00755 {0}", t.display()),
    );
    assert!(r.ok, "{r:?}");
    c.node
        .node_publish_volume(publish("vol", &staging, &root.join("pod2"), &[], "4243"))
        .await
        .unwrap();
    assert_eq!(owner(&on_disk), (0, group, 0o2775));
    assert!(
        d.log_text()
            .contains("a pod changed the native volume's root; restored")
    );
}

/// What a native view must refuse, so that no pod gets more than a FUSE view gives it
/// (docs/ARCHITECTURE.md, *Threat model*): set-id bits and file capabilities do nothing
/// through it (`nosuid`), device nodes open nothing (`nodev`), and its FUSE twin puts
/// no set-id bit on a file at all.
#[tokio::test(flavor = "multi_thread")]
async fn a_native_view_gives_a_pod_nothing_a_view_does_not() {
    let f = Fixture::new();
    let root = f.dir.path();
    let (share, d, mut c, staging) = native_volume(&f).await;
    let t = root.join("native");
    c.node
        .node_publish_volume(publish("vol", &staging, &t, &[], "4242"))
        .await
        .unwrap();
    assert!(is_idmapped(&t));
    // A setuid-root program made by a pod's root: running it does not make root.
    fs::copy("/usr/bin/id", t.join("id")).unwrap();
    chmod(&t.join("id"), 0o4755);
    let r = run_as(MEMBER, MEMBER, &[], &format!("{}/id -u", t.display()));
    assert!(r.ok && r.stdout.trim() == MEMBER.to_string(), "{r:?}");
    // A device node made by a pod's root (CAP_MKNOD): it opens nothing.
    let r = run_as(
        0,
        0,
        &[],
        &format!(
            "mknod {0}/null c 1 3 && ! cat {0}/null 2>/dev/null",
            t.display()
        ),
    );
    assert!(r.ok, "{r:?}");
    // The twin (the share without nosuid,nodev): no set-id bit on a file.
    remount(&share, "remount,suid,dev");
    let twin = root.join("twin");
    c.node
        .node_publish_volume(publish("vol", &staging, &twin, &[], "4242"))
        .await
        .unwrap();
    let r = run_as(
        MEMBER,
        MEMBER,
        &[4242],
        &format!("echo x > {0}/mine && chmod 4755 {0}/mine", twin.display()),
    );
    assert!(!r.ok && r.stderr.contains("not permitted"), "{r:?}");
    assert_eq!(
        fs::metadata(d.share.join("volumes/vol/mine"))
            .unwrap()
            .mode()
            & 0o7000,
        0
    );
    // What the twin shows is what the native view shows.
    assert_eq!(snapshot(&twin), snapshot(&t));
    // The twin of a publish without fsGroup (kubelet sends no volume_mount_group),
    // and of one whose group is the volume's own: root's chmod and O_CREAT put no
    // set-id bit on disk either.
    let disk_group = record(&d, "vol")["group"].as_u64().unwrap().to_string();
    for (name, group) in [("bare", ""), ("own", disk_group.as_str())] {
        let tw = root.join(format!("twin-{name}"));
        c.node
            .node_publish_volume(publish("vol", &staging, &tw, &[], group))
            .await
            .unwrap();
        let r = run_as(
            0,
            0,
            &[],
            &format!(
                "cp /usr/bin/id {0}/{name}-id && chmod 4755 {0}/{name}-id",
                tw.display()
            ),
        );
        assert!(!r.ok && r.stderr.contains("not permitted"), "{name}: {r:?}");
        let r = run_as(
            0,
            0,
            &[],
            &format!(
                "umask 0; python3 -c \"import os; os.close(os.open('{}/{name}-made', os.O_CREAT | os.O_WRONLY, 0o6755))\"",
                tw.display()
            ),
        );
        assert!(r.ok, "{name}: {r:?}");
        for file in ["id", "made"] {
            let on_disk = d.share.join(format!("volumes/vol/{name}-{file}"));
            assert_eq!(owner(&on_disk).2 & 0o6000, 0, "{name}-{file} on disk");
        }
    }
    remount(&share, "remount,nosuid,nodev");
}

/// A pod with `hostUsers: false` must never fail to start because of a native view: its
/// runtime idmaps every volume, and the kernel refuses to idmap an idmapped mount. The
/// driver asks the API server (a stand-in that answers as kube-apiserver does) about the
/// pod kubelet names, and gives such a pod the native twin, which its runtime can
/// idmap; a pod it cannot learn about (RBAC, not found, no pod named, the API server
/// down) gets the twin too.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_in_a_user_namespace_gets_a_view_its_runtime_can_idmap() {
    use apiserver::Known;
    let f = Fixture::new();
    let root = f.dir.path();
    let _share = native_share(root);
    let api_dir = f.subdir("api");
    let api = apiserver::ApiServer::start(
        &api_dir,
        HashMap::from([
            ("team/host-pod".to_string(), Known::Pod(None)),
            ("team/userns-pod".to_string(), Known::Pod(Some(false))),
            ("team/denied".to_string(), Known::Forbidden),
        ]),
    )
    .await;
    let d = driver_asking(root, &api);
    let addr = d.metrics_addr();
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    c.create_and_stage("vol", &staging).await;
    let for_pod = |name: Option<&str>, target: &Path| {
        let mut r = publish("vol", &staging, target, &[], "4242");
        if let Some(name) = name {
            for_pod(&mut r, name);
        }
        r
    };
    let cases = [
        (Some("host-pod"), ("native", "")),
        (Some("userns-pod"), ("fuse-native", "user-namespace-pod")),
        (Some("denied"), ("fuse-native", "pod-unknown")),
        (Some("gone"), ("fuse-native", "pod-unknown")),
        (None, ("fuse-native", "pod-unknown")),
    ];
    for (pod, _) in &cases {
        let t = root.join(format!("t-{}", pod.unwrap_or("none")));
        c.node.node_publish_volume(for_pod(*pod, &t)).await.unwrap();
    }
    for (pod, (mech, why)) in &cases {
        let t = root.join(format!("t-{}", pod.unwrap_or("none")));
        assert_eq!(
            mechanism(&addr, &t),
            (mech.to_string(), why.to_string()),
            "{pod:?}"
        );
    }
    // What the runtime of each pod does: the twin can be idmapped, the native view not.
    let ns = userns::PodUserns::new(5);
    let ctr = f.subdir("container-root");
    let twin = userns::idmapped_volume(&ns, &root.join("t-userns-pod"), &ctr, "data")
        .expect("a user-namespaced pod's runtime idmaps its view");
    let refused = userns::idmapped_volume(&ns, &root.join("t-host-pod"), &ctr, "native");
    assert!(refused.is_err(), "the kernel idmapped an idmapped mount");
    // The same presentation either way.
    assert_eq!(
        snapshot(&root.join("t-userns-pod")),
        snapshot(&root.join("t-host-pod"))
    );
    drop(twin);

    // The API server down: every native volume's publish is the twin.
    let g = Fixture::new();
    let _share2 = native_share(g.dir.path());
    let down = Driver::start_with_metrics_and(
        g.dir.path(),
        &[
            "--kube-api",
            "127.0.0.1:1",
            "--kube-token-file",
            api.token_file.to_str().unwrap(),
            "--kube-ca-file",
            api.ca_file.to_str().unwrap(),
        ],
    );
    let addr2 = down.metrics_addr();
    let mut c2 = down.clients().await;
    let staging2 = g.subdir("staging");
    c2.create_and_stage("vol", &staging2).await;
    let t = g.dir.path().join("t");
    let mut r = publish("vol", &staging2, &t, &[], "4242");
    r.volume_context = HashMap::from([
        (
            "csi.storage.k8s.io/pod.name".to_string(),
            "host-pod".to_string(),
        ),
        (
            "csi.storage.k8s.io/pod.namespace".to_string(),
            "team".to_string(),
        ),
    ]);
    c2.node.node_publish_volume(r).await.unwrap();
    assert_eq!(
        mechanism(&addr2, &t),
        ("fuse-native".into(), "pod-unknown".into())
    );
}

/// What a process with `CAP_DAC_READ_SEARCH` reaches through the view at `view`:
/// `open_by_handle_at(2)` on the view's own mount with the handle of `fs_root` (the
/// file system's root, which a pod needs no guess for), then `rel` below it. The
/// file's content, or why not.
fn open_by_handle(fs_root: &Path, view: &Path, rel: &str) -> Result<String, String> {
    let probe = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
class Handle(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint), ("type", ctypes.c_int), ("f", ctypes.c_ubyte * 128)]
root, view, rel = sys.argv[1:4]
h = Handle(); h.bytes = 128; mnt = ctypes.c_int()
if libc.name_to_handle_at(-100, root.encode(), ctypes.byref(h), ctypes.byref(mnt), 0) != 0:
    sys.exit("name_to_handle_at: " + os.strerror(ctypes.get_errno()))
vfd = os.open(view, os.O_RDONLY | os.O_DIRECTORY)
fd = libc.open_by_handle_at(vfd, ctypes.byref(h), os.O_RDONLY | os.O_DIRECTORY)
if fd < 0:
    sys.exit("open_by_handle_at: " + os.strerror(ctypes.get_errno()))
print(open(os.open(rel, os.O_RDONLY, dir_fd=fd)).read(), end="")
"#;
    // Root with the capability the container added, and nothing of root's uid: the
    // probe keeps only CAP_DAC_READ_SEARCH.
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all,+dac_read_search",
            "--ambient-caps=+dac_read_search",
            "python3",
            "-c",
            probe,
        ])
        .arg(fs_root)
        .arg(view)
        .arg(rel)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A pod one of whose containers (an init container here) adds `CAP_DAC_READ_SEARCH`
/// must not get a native view: with it, `open_by_handle_at` on the view's mount opens
/// any inode of the share (another volume's files), where a FUSE view answers
/// `ESTALE`. The API server (the stand-in) says what the pod's containers add; such a
/// pod gets the twin, and the metric says why.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_that_can_open_by_handle_gets_no_native_view() {
    use apiserver::Known;
    let f = Fixture::new();
    let root = f.dir.path();
    let share = native_share(root);
    let api = apiserver::ApiServer::start(
        &f.subdir("api"),
        HashMap::from([
            ("team/plain".to_string(), Known::Pod(None)),
            (
                "team/agent".to_string(),
                Known::InitAdds("CAP_DAC_READ_SEARCH"),
            ),
            ("team/admin".to_string(), Known::InitAdds("SYS_ADMIN")),
        ]),
    )
    .await;
    let d = driver_asking(root, &api);
    let addr = d.metrics_addr();
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    c.create_and_stage("vol", &staging).await;
    c.create_and_stage("other", &f.subdir("staging-other"))
        .await;
    fs::write(
        d.share.join("volumes/other/secret"),
        "another volume's data",
    )
    .unwrap();
    for pod in ["plain", "agent", "admin"] {
        let mut r = publish("vol", &staging, &root.join(pod), &[], "4242");
        for_pod(&mut r, pod);
        c.node.node_publish_volume(r).await.unwrap();
    }
    assert_eq!(
        mechanism(&addr, &root.join("plain")),
        ("native".into(), String::new())
    );
    for pod in ["agent", "admin"] {
        assert_eq!(
            mechanism(&addr, &root.join(pod)),
            ("fuse-native".into(), "privileged-pod".into()),
            "{pod}"
        );
    }
    // What the capability does on a native view, and what it does on the twin.
    assert_eq!(
        open_by_handle(&share.0, &root.join("plain"), "volumes/other/secret").as_deref(),
        Ok("another volume's data"),
        "the probe reaches past a native view (else this test proves nothing)"
    );
    let r = open_by_handle(&share.0, &root.join("agent"), "volumes/other/secret");
    assert!(r.is_err(), "{r:?}");
}

/// KEP-695's database: a PostgreSQL data directory restored onto a volume (mode 0700,
/// owned by postgres, no ownership record) starts on a native view and on its FUSE
/// twin, which show its modes, and not on a group view, which shows it 2770 ("data
/// directory has invalid permissions"), the failure native views answer.
#[tokio::test(flavor = "multi_thread")]
async fn a_restored_postgres_data_directory_starts_on_a_native_view() {
    use std::os::unix::fs::MetadataExt;
    let f = Fixture::new();
    let root = f.dir.path();
    let (share, d, mut c, staging) = native_volume(&f).await;
    // The restore: initdb elsewhere, then the tree copied onto the volume as it was.
    let pg_home = fs::metadata("/var/lib/postgresql").unwrap();
    let (pg_uid, pg_gid) = (pg_home.uid(), pg_home.gid());
    let made = f.subdir("initdb");
    chown(&made, pg_uid, pg_gid);
    let r = run_as(
        pg_uid,
        pg_gid,
        &[],
        &format!(
            "{} -D {}/data -A trust -U postgres >/dev/null",
            postgres_bin("initdb").display(),
            made.display()
        ),
    );
    assert!(r.ok, "{r:?}");
    let volume = d.share.join("volumes/vol");
    assert!(
        Command::new("cp")
            .args(["-a"])
            .arg(made.join("data"))
            .arg(&volume)
            .status()
            .unwrap()
            .success()
    );
    let sockets = f.subdir("sockets");
    fs::set_permissions(
        &sockets,
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .unwrap();

    let native = root.join("native");
    c.node
        .node_publish_volume(publish("vol", &staging, &native, &[], "4242"))
        .await
        .unwrap();
    assert!(is_idmapped(&native));
    // 0700, with the setgid bit its making in the volume gave it (GNU cp keeps a
    // directory's setgid), which PostgreSQL does not mind.
    assert_eq!(owner(&native.join("data")).2 & 0o777, 0o700);
    postgres_runs(&native.join("data"), &sockets, &[4242]).expect("PostgreSQL on a native view");

    // The twin, where the share's mount honours set-id bits.
    remount(&share, "remount,suid,dev");
    let twin = root.join("twin");
    c.node
        .node_publish_volume(publish("vol", &staging, &twin, &[], "4242"))
        .await
        .unwrap();
    assert!(!is_idmapped(&twin));
    assert_eq!(owner(&twin.join("data")).2 & 0o777, 0o700);
    postgres_runs(&twin.join("data"), &sockets, &[4242]).expect("PostgreSQL on the twin");

    // A group view of the same tree: kubelet's 2770, which PostgreSQL refuses.
    let group = root.join("group");
    c.node
        .node_publish_volume(publish(
            "vol",
            &staging,
            &group,
            &["ownership=emulate", "ownership=off"],
            "4242",
        ))
        .await
        .unwrap();
    assert_eq!(owner(&group.join("data")).2, 0o2770);
    let refused = postgres_runs(&group.join("data"), &sockets, &[4242])
        .expect_err("PostgreSQL on a group view");
    assert!(refused.contains("invalid permissions"), "{refused}");
}

/// `mountgroup mount --native` asks its source what the driver asks a share: that a
/// directory can be made through an idmapped clone of it. A source on a read-only
/// file system can take none and needs none (no view of it makes anything): it is
/// served.
#[test]
fn a_native_mount_of_a_read_only_source_is_served() {
    let f = Fixture::new();
    let share = native_share(f.dir.path());
    let source = share.0.join("vol");
    fs::create_dir(&source).unwrap();
    chown(&source, 0, 2_000_000_000);
    chmod(&source, 0o2775);
    remount(&share, "remount,ro,nosuid,nodev");
    let mnt = f.subdir("read-only-view");
    let out = Command::new(BIN)
        .args(["mount", "--native"])
        .arg(&source)
        .arg(&mnt)
        .args(["-o", "gid=4242"])
        .output()
        .unwrap();
    let _view = Unmount(mnt.clone());
    assert!(out.status.success(), "{out:?}");
    assert!(is_idmapped(&mnt));
    assert_eq!(owner(&mnt).1, 4242);
}
