//! Pods in user namespaces (`hostUsers: false`): the volume is published through the
//! CSI socket as kubelet publishes it, then idmapped into a "container root" as runc
//! and crun do (tests/common/userns.rs), and the pod's processes, in the pod's user
//! namespace as the pod's uid with the fsGroup among their groups, use it. Every kind
//! of view can be idmapped (except `noperm`, which the kernel refuses), the view means
//! in the pod's IDs what it means without a namespace, and the idmapped clone keeps
//! working across a view's crash, a driver restart and a rolling update.

mod common;
#[path = "common/container.rs"]
mod container;
#[path = "common/driver.rs"]
mod driver;
#[path = "common/keeper.rs"]
mod keeper;
#[path = "common/userns.rs"]
mod userns;

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use container::*;
use driver::*;
use keeper::*;
use mountgroup::csi::pb;
use rustix::process::Signal;
use userns::*;

/// The pod's fsGroup, as the pod sees it (kubelet passes it so in
/// `volume_mount_group`).
const FS_GROUP: u32 = 4242;
/// The pod's user, and two more users of the pod: a member of the fsGroup and one
/// outside it.
const POD_UID: u32 = 1000;
const MEMBER: u32 = 1001;
const OUTSIDER: u32 = 1002;

/// A secret-like inline volume (`source: secrets`), as kubelet publishes a CSI inline
/// volume with a `nodePublishSecretRef`.
fn secret_publish(target: &Path, group: &str, token: &str) -> pb::NodePublishVolumeRequest {
    let ctx = HashMap::from([
        ("source".to_string(), "secrets".to_string()),
        (
            "csi.storage.k8s.io/ephemeral".to_string(),
            "true".to_string(),
        ),
        ("csi.storage.k8s.io/pod.name".to_string(), "pod".to_string()),
    ]);
    pb::NodePublishVolumeRequest {
        volume_id: "csi-secret".into(),
        target_path: target.to_string_lossy().into(),
        volume_capability: Some(rw_cap(group)),
        volume_context: ctx,
        secrets: HashMap::from([("token".to_string(), token.to_string())]),
        ..Default::default()
    }
}

/// A directory every user can enter: the container's root, where the runtime puts its
/// volumes.
fn container_root(f: &Fixture) -> PathBuf {
    let root = f.subdir("container-root");
    fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
    root
}

/// Waits until the driver's metrics have `name` (a sample with its labels).
fn wait_for_sample(addr: &str, name: &str) -> (f64, String) {
    wait_for_at_least(addr, name, f64::MIN)
}

/// The sample `name` once it is at least `least`, or as it stands after 15 s: a view
/// writes its counters for the driver once a second, so a count of calls made an
/// instant ago may still be short by them.
fn wait_for_at_least(addr: &str, name: &str, least: f64) -> (f64, String) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let text = scrape(addr);
        match sample(&text, name) {
            Some(v) if v >= least || Instant::now() >= deadline => return (v, text),
            None => assert!(Instant::now() < deadline, "no {name} in:\n{text}"),
            Some(_) => {}
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_can_idmap_every_kind_of_view() {
    let f = Fixture::new();
    let root = f.dir.path();
    let d = Driver::start_with_metrics(root);
    let addr = d.metrics_addr();
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    c.create_and_stage("vol", &staging).await;
    let group = FS_GROUP.to_string();
    let kinds: Vec<(&str, pb::NodePublishVolumeRequest)> = vec![
        (
            "fsgroup",
            publish_flags("vol", &staging, &root.join("t-fsgroup"), &[], &group, false),
        ),
        (
            "cifs",
            publish_flags(
                "vol",
                &staging,
                &root.join("t-cifs"),
                &["uid=1000", "file_mode=0640", "dir_mode=0750"],
                &group,
                false,
            ),
        ),
        (
            "plain",
            publish_flags("vol", &staging, &root.join("t-plain"), &[], "", false),
        ),
        (
            "ro",
            publish_flags("vol", &staging, &root.join("t-ro"), &[], &group, true),
        ),
        (
            "secret",
            secret_publish(&root.join("t-secret"), &group, "t-1"),
        ),
        (
            "noperm",
            publish_flags(
                "vol",
                &staging,
                &root.join("t-noperm"),
                &["noperm", "file_mode=0777", "dir_mode=0777"],
                &group,
                false,
            ),
        ),
    ];
    for (_, req) in &kinds {
        c.node.node_publish_volume(req.clone()).await.unwrap();
    }
    let target = |kind: &str| root.join(format!("t-{kind}"));
    // The plain view shows the disk: a directory the pod's user owns on disk.
    let pdir = target("fsgroup").join("pdir");
    fs::create_dir(&pdir).unwrap();
    let backing_pdir = d.share.join("volumes/vol/pdir");
    chown(&backing_pdir, POD_UID, POD_UID);

    // A plain `mountgroup mount`, not kept by any keeper.
    let m = f.mount(&format!("gid={FS_GROUP}"));

    let pod = PodUserns::new(2);
    let ctr = container_root(&f);
    let mut volumes = Vec::new();
    for (kind, _) in &kinds {
        let r = idmapped_volume(&pod, &target(kind), &ctr, kind);
        if *kind == "noperm" {
            // Without the kernel's permission checks the kernel refuses FUSE idmaps.
            let e = r.err().expect("a noperm view cannot be idmapped");
            assert!(
                e.contains("EINVAL") || e.contains("Invalid argument"),
                "{e}"
            );
            continue;
        }
        volumes.push(r.unwrap_or_else(|e| panic!("{kind}: {e}")));
    }
    volumes.push(idmapped_volume(&pod, &m.mountpoint, &ctr, "unkept").unwrap());
    let member = [FS_GROUP];

    // Each script runs in the container's root, as the pod's user with the fsGroup.
    let run = |groups: &[u32], script: &str| {
        pod.ok(
            POD_UID,
            groups,
            &format!("cd {} && {script}", ctr.display()),
        )
    };
    let stat = |groups: &[u32], path: &str| seen(&pod, POD_UID, groups, &ctr.join(path)).unwrap();

    // fsgroup: the pod's user makes a file; owned by it and the pod's group, in the
    // pod's IDs, which are the view's own (the host sees the same numbers).
    run(&member, "echo hi > fsgroup/a.txt");
    assert_eq!(stat(&member, "fsgroup/a.txt"), (POD_UID, FS_GROUP, 0o644));
    assert_eq!(
        owner(&target("fsgroup").join("a.txt")),
        (POD_UID, FS_GROUP, 0o644)
    );
    let (_, gid, mode) = stat(&member, "fsgroup");
    assert_eq!(
        (gid, mode & 0o2070),
        (FS_GROUP, 0o2070),
        "the volume's root: setgid, group rwx"
    );

    // cifs: every entry has uid=, the group and file_mode=.
    run(&member, "touch cifs/c.txt");
    assert_eq!(stat(&member, "cifs/c.txt"), (1000, FS_GROUP, 0o640));

    // plain: the disk's owners, and a new file handed to its maker on disk.
    run(&[], "echo p > plain/pdir/p.txt");
    assert_eq!(
        owner(&backing_pdir.join("p.txt")),
        (POD_UID, POD_UID, 0o644)
    );
    assert_eq!(stat(&[], "plain/pdir/p.txt"), (POD_UID, POD_UID, 0o644));

    // ro: read, never write.
    assert_eq!(
        run(&member, "cat ro/a.txt && ! touch ro/w 2>/dev/null").trim(),
        "hi"
    );

    // secret: the token, readable by the group.
    assert_eq!(run(&member, "cat secret/token"), "t-1");
    assert_eq!(stat(&member, "secret/..data/token").1, FS_GROUP);

    // Not kept by a keeper: the same.
    assert_eq!(
        run(
            &member,
            "echo u > unkept/u.txt && stat -c '%u %g' unkept/u.txt"
        )
        .trim(),
        "1000 4242"
    );

    // The node says the kernel allows it; each view says whether it can be idmapped.
    let (node, _) = wait_for_sample(&addr, "mountgroup_node_fuse_idmap");
    assert_eq!(node, 1.0);
    for (kind, _) in &kinds {
        let key = format!(
            "mountgroup_view_idmap{{volume_id=\"{}\",target=\"{}\"}}",
            if *kind == "secret" {
                "csi-secret"
            } else {
                "vol"
            },
            target(kind).display()
        );
        let (idmap, text) = wait_for_sample(&addr, &key);
        assert_eq!(
            idmap,
            if *kind == "noperm" { 0.0 } else { 1.0 },
            "{kind}: {text}"
        );
    }
    drop(volumes);
}

/// The fsgroup view in the pod's IDs: creates, setgid inheritance, chown and chmod
/// emulated, set-id bits dropped on write as Linux drops them, an `O_CREAT` of another
/// user's file refused by the kernel, and the hostile tenant's moves refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_in_a_user_namespace_keeps_the_views_rules() {
    let f = Fixture::new();
    let root = f.dir.path();
    let d = Driver::start_with_metrics(root);
    let addr = d.metrics_addr();
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    let target = root.join("target");
    // A long entry timeout keeps a name the pod found missing missing in the kernel's
    // cache, so that an O_CREAT of it goes to the view as CREATE.
    c.create_stage_publish_with(
        "vol",
        &staging,
        publish_flags(
            "vol",
            &staging,
            &target,
            &["entry_timeout=60"],
            &FS_GROUP.to_string(),
            false,
        ),
    )
    .await;
    let backing = d.share.join("volumes/vol");
    let pod = PodUserns::new(3);
    let ctr = container_root(&f);
    let _v = idmapped_volume(&pod, &target, &ctr, "data").unwrap();
    let v = ctr.join("data");
    let member = [FS_GROUP];
    let as_pod = |uid: u32, groups: &[u32], script: &str| {
        pod.ok(uid, groups, &format!("cd {} && {script}", v.display()))
    };
    let stat = |uid: u32, name: &str| seen(&pod, uid, &member, &v.join(name)).unwrap();

    // Creates: owner the pod's uid, group inherited, directories setgid; the disk keeps
    // its own owner and modes, without set-id bits.
    as_pod(
        POD_UID,
        &member,
        "umask 002 && echo hi > f && mkdir d && echo sub > d/g",
    );
    assert_eq!(stat(POD_UID, "f"), (POD_UID, FS_GROUP, 0o664));
    assert_eq!(stat(POD_UID, "d"), (POD_UID, FS_GROUP, 0o2775));
    assert_eq!(stat(POD_UID, "d/g"), (POD_UID, FS_GROUP, 0o664));
    let disk = owner(&backing.join("d"));
    assert_eq!(
        (disk.0, disk.2 & 0o7000),
        (0, 0),
        "on disk: the daemon's, no set-id bits"
    );
    let disk_f = owner(&backing.join("f"));

    // chmod by the owner and chown by the pod's root: emulated, the disk unchanged.
    as_pod(POD_UID, &member, "chmod 600 f");
    assert_eq!(stat(POD_UID, "f").2, 0o600);
    as_pod(0, &[], "chown 1001 f");
    assert_eq!(stat(POD_UID, "f"), (MEMBER, FS_GROUP, 0o600));
    assert_eq!(
        owner(&backing.join("f")),
        disk_f,
        "the disk keeps its owner and mode"
    );
    // chgrp by the owner: to a group it is in, not to another.
    as_pod(POD_UID, &member, "echo x > own && chgrp 1000 own");
    assert_eq!(stat(POD_UID, "own").1, POD_UID);
    let r = pod.run(
        POD_UID,
        POD_UID,
        &member,
        &format!("chgrp 5555 {}/own", v.display()),
    );
    assert!(!r.ok && r.stderr.contains("not permitted"), "{r:?}");
    // Another user's 0600 file stays closed to the pod's user.
    let r = pod.run(POD_UID, POD_UID, &member, &format!("cat {}/f", v.display()));
    assert!(!r.ok && r.stderr.contains("Permission denied"), "{r:?}");

    // Set-id bits on write, by Linux's rule in the pod's IDs: a member keeps setgid
    // alone (its groups count as the pod sees them), someone outside the group drops
    // it, group execute drops it for all, and the pod's root, whose CAP_FSETID is its
    // namespace's only, drops setuid.
    as_pod(
        POD_UID,
        &member,
        "for n in m o x r; do echo > s-$n; chmod 6666 s-$n; done; chmod 6676 s-x",
    );
    as_pod(MEMBER, &member, "echo w >> s-m && echo w >> s-x");
    as_pod(OUTSIDER, &[], "echo w >> s-o");
    as_pod(0, &[], "echo w >> s-r");
    assert_eq!(stat(POD_UID, "s-m").2, 0o2666, "a member of the group");
    assert_eq!(stat(POD_UID, "s-o").2, 0o0666, "outside the group");
    assert_eq!(stat(POD_UID, "s-x").2, 0o0676, "group execute");
    assert_eq!(stat(POD_UID, "s-r").2, 0o2666, "the pod's root");

    // An O_CREAT open of a name the pod's kernel cache says is missing, which another
    // user's 0600 file took meanwhile (renamed into place behind the kernel's back):
    // the view leaves the open to the kernel, which refuses it; a file of the group
    // opens.
    as_pod(
        MEMBER,
        &member,
        "echo secret > hid && chmod 600 hid && echo team > grp && chmod 660 grp",
    );
    let probe = "import os, sys\nfor n in sys.argv[1:]:\n    try: os.stat(n)\n    except FileNotFoundError: pass\n";
    as_pod(
        POD_UID,
        &member,
        &format!("/usr/bin/python3 -c '{probe}' secret shared"),
    );
    fs::rename(backing.join("hid"), backing.join("secret")).unwrap();
    fs::rename(backing.join("grp"), backing.join("shared")).unwrap();
    let open = |name: &str| {
        pod.run(
            POD_UID,
            POD_UID,
            &member,
            &format!(
                "/usr/bin/python3 -c 'import os; fd = os.open(\"{}\", os.O_CREAT | os.O_RDWR); print(os.read(fd, 10).decode().strip())'",
                v.join(name).display()
            ),
        )
    };
    let r = open("secret");
    assert!(!r.ok && r.stderr.contains("Permission denied"), "{r:?}");
    let r = open("shared");
    assert!(r.ok && r.stdout.trim() == "team", "{r:?}");
    assert_eq!(
        fs::read_to_string(backing.join("secret")).unwrap(),
        "secret\n"
    );
    let (stale, text) = wait_for_at_least(
        &addr,
        "mountgroup_view_operation_errnos_total{op=\"create\",errno=\"ESTALE\"}",
        2.0,
    );
    assert!(
        stale >= 2.0,
        "both opens went to the view as CREATE: {text}"
    );

    // The hostile tenant's moves, as the pod's root.
    let r = pod.run(
        0,
        0,
        &[],
        &format!("cd {} && mknod null c 1 3", v.display()),
    );
    assert!(!r.ok, "a device node: {r:?}");
    let r = pod.run(
        0,
        0,
        &[],
        &format!("cd {} && setfattr -n trusted.x -v 1 f", v.display()),
    );
    assert!(!r.ok, "a trusted.* attribute: {r:?}");
    let r = pod.run(
        0,
        0,
        &[],
        &format!("cd {} && touch .mountgroup.x", v.display()),
    );
    assert!(!r.ok, "a reserved name: {r:?}");
    as_pod(0, &[], "echo '#!/bin/sh' > suid && chmod 4755 suid");
    assert_eq!(stat(POD_UID, "suid").2, 0o4755, "shown to the pod");
    assert_eq!(
        owner(&backing.join("suid")).2 & 0o7000,
        0,
        "never on the share"
    );
    assert!(!backing.join("null").exists() && !backing.join(".mountgroup.x").exists());
}

/// Publishes every kind of view of the volume `vol` under `root` (staged at `staging`),
/// as kubelet does for a pod that uses each, and repeats it (kubelet's publish after a
/// driver restart).
async fn publish_kinds(c: &mut Clients, root: &Path, staging: &Path) {
    let group = FS_GROUP.to_string();
    let t = |kind: &str| root.join(format!("t-{kind}"));
    let reqs = [
        publish_flags("vol", staging, &t("fsgroup"), &[], &group, false),
        publish_flags(
            "vol",
            staging,
            &t("cifs"),
            &["uid=1000", "file_mode=0644", "dir_mode=0755"],
            &group,
            false,
        ),
        publish_flags("vol", staging, &t("plain"), &[], "", false),
        publish_flags("vol", staging, &t("ro"), &[], &group, true),
        secret_publish(&t("secret"), &group, "t-1"),
    ];
    for r in reqs {
        c.node.node_publish_volume(r).await.unwrap();
    }
}

/// The pod's workloads on its idmapped clones of kept views of every kind (writers on
/// the fsgroup, CIFS and plain views, readers on the read-only and secret views) go on
/// without a failed call or a wrong byte while each view's process is killed (and
/// recovered on its connection), the driver's container is killed and restarted, and
/// the keeper is updated to another binary: each clone is a mount of its view's
/// connection, which all of that keeps.
#[tokio::test(flavor = "multi_thread")]
async fn idmapped_clones_outlive_view_crashes_driver_restarts_and_updates() {
    let f = Fixture::new();
    let root = f.dir.path();
    let (v1, v2) = (binary_version(root, "v1"), binary_version(root, "v2"));
    // The keeper as deployed: hostPID, a cgroup of its own, each view in its own.
    let cg = TestCgroup::new();
    let views_cg = cg.child("views");
    let keepers = Keepers::deployed(&cg, root, &views_cg);
    let keeper_socket = keepers.socket().to_path_buf();
    let mut keeper1 = keepers.start_binary("1", &v1);
    let mut d = Driver::start_kept(root, CONTAINER, &v1, &keeper_socket, &[]);
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    c.create_and_stage("vol", &staging).await;
    publish_kinds(&mut c, root, &staging).await;
    let t = |kind: &str| root.join(format!("t-{kind}"));
    // What the readers read, and the plain view's directory of the pod's user.
    fs::write(t("fsgroup").join("ro.txt"), "read-only content").unwrap();
    let backing = d.share.join("volumes/vol");
    fs::create_dir(backing.join("work-plain")).unwrap();
    chown(&backing.join("work-plain"), POD_UID, POD_UID);

    let pod = PodUserns::new(4);
    let ctr = container_root(&f);
    let kinds = ["fsgroup", "cifs", "plain", "ro", "secret"];
    let _volumes: Vec<ContainerVolume> = kinds
        .iter()
        .map(|k| idmapped_volume(&pod, &t(k), &ctr, k).unwrap())
        .collect();
    let script = root.join("pod_workload.py");
    fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/pod_workload.py"),
        &script,
    )
    .unwrap();
    let stop = root.join("stop");
    let workloads: Vec<(&str, std::process::Child)> = kinds
        .iter()
        .map(|&kind| {
            let (how, path, groups): (&str, PathBuf, &[u32]) = match kind {
                "ro" => ("read", ctr.join("ro/ro.txt"), &[FS_GROUP]),
                "secret" => ("read", ctr.join("secret/token"), &[FS_GROUP]),
                "plain" => ("write", ctr.join("plain/work-plain"), &[]),
                _ => (
                    "write",
                    ctr.join(kind).join(format!("work-{kind}")),
                    &[FS_GROUP],
                ),
            };
            let child = pod
                .command(
                    POD_UID,
                    POD_UID,
                    groups,
                    &[
                        "/usr/bin/python3",
                        script.to_str().unwrap(),
                        how,
                        path.to_str().unwrap(),
                        stop.to_str().unwrap(),
                    ],
                )
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (kind, child)
        })
        .collect();
    let settle = || std::thread::sleep(Duration::from_millis(600));
    settle();

    // Each view's process is SIGKILLed: the keeper recovers it on its connection.
    for kind in kinds {
        kill_view(&t(kind));
        fs::metadata(t(kind)).unwrap();
    }
    settle();
    // The driver's container is killed and started again; kubelet repeats the publishes.
    d.signal_first_process(Signal::KILL);
    d.restart();
    publish_kinds(&mut d.clients().await, root, &staging).await;
    settle();
    // A rolling update to v2 (maxSurge 1): the new keeper takes every view over.
    let mut keeper2 = keepers.start_binary("2", &v2);
    settle();
    keeper1.stop(Duration::from_secs(30));
    d.signal_first_process(Signal::TERM);
    let d2 = Driver::start_kept(root, CONTAINER, &v2, &keeper_socket, &[]);
    publish_kinds(&mut d2.clients().await, root, &staging).await;
    settle();
    for kind in kinds {
        let serving = view_processes(&t(kind));
        assert!(
            serving.iter().all(|(_, bin)| *bin == v2),
            "{kind}: {serving:?}"
        );
    }

    fs::write(&stop, "").unwrap();
    for (kind, w) in workloads {
        let out = w.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{kind}: {said} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_str(said.trim()).unwrap();
        eprintln!("{kind}: {report}");
        assert_eq!(report["failed"], 0, "{kind}: {report}");
        assert!(report["rounds"].as_u64().unwrap() > 10, "{kind}: {report}");
        assert_eq!(report["id"][0], POD_UID);
        // Its files as the pod sees them: its own in the fsgroup view, uid= in the CIFS
        // one (1000 too), the disk's in the plain one (created by the pod's user).
        let want_group = if kind == "plain" { POD_UID } else { FS_GROUP };
        if !matches!(kind, "ro" | "secret") {
            assert_eq!(
                (report["file"][0].as_u64(), report["file"][1].as_u64()),
                (Some(POD_UID.into()), Some(want_group.into())),
                "{kind}: {report}"
            );
        }
    }
    assert_logged(
        || fs::read_to_string(root.join("keeper1.log")).unwrap(),
        "recovering it",
    );
    drop(_volumes);
    keeper2.stop(Duration::from_secs(30));
    drop(d2);
}
