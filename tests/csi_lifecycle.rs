//! The CSI driver played by kubelet over a real unix socket: the whole lifecycle with
//! two pods of different fsGroups on one volume, and every call repeated.

mod common;
#[path = "common/driver.rs"]
mod driver;

use std::fs;

use common::*;
use driver::*;
use tonic::Code;

#[tokio::test(flavor = "multi_thread")]
async fn two_pods_with_two_fs_groups_share_one_volume() {
    let f = Fixture::new();
    let d = Driver::start(f.dir.path());
    let mut c = d.clients().await;
    let kubelet = f.subdir("kubelet");
    let staging = kubelet.join("plugins/mountgroup/globalmount");
    fs::create_dir_all(&staging).unwrap();
    let target_a = kubelet.join("pods/a/volumes/mountgroup/mount");
    let target_b = kubelet.join("pods/b/volumes/mountgroup/mount");
    fs::create_dir_all(target_a.parent().unwrap()).unwrap();
    fs::create_dir_all(target_b.parent().unwrap()).unwrap();

    // CreateVolume, and again (idempotent by name).
    let vol = c
        .controller
        .create_volume(create_req("pvc-lifecycle", 10 << 20))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(vol.volume_id, "pvc-lifecycle");
    assert_eq!(vol.capacity_bytes, 10 << 20);
    let again = c
        .controller
        .create_volume(create_req("pvc-lifecycle", 10 << 20))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again, vol);
    let conflict = c
        .controller
        .create_volume(create_req("pvc-lifecycle", 20 << 20))
        .await
        .unwrap_err();
    assert_eq!(conflict.code(), Code::AlreadyExists);
    // Some data on the share, owned by someone else, as on a real share.
    let data = d.share.join("volumes/pvc-lifecycle");
    fs::write(data.join("existing.txt"), "from the share\n").unwrap();
    chown(&data.join("existing.txt"), 1234, 1234);

    // Stage, twice.
    c.node
        .node_stage_volume(stage_req("pvc-lifecycle", &staging))
        .await
        .unwrap();
    c.node
        .node_stage_volume(stage_req("pvc-lifecycle", &staging))
        .await
        .unwrap();
    // Publish for pod A (fsGroup 3001) and pod B (fsGroup 3002), each twice.
    for _ in 0..2 {
        c.node
            .node_publish_volume(publish_req("pvc-lifecycle", &staging, &target_a, "3001"))
            .await
            .unwrap();
        c.node
            .node_publish_volume(publish_req("pvc-lifecycle", &staging, &target_b, "3002"))
            .await
            .unwrap();
    }
    // The same target with another group is another publish: ALREADY_EXISTS.
    let e = c
        .node
        .node_publish_volume(publish_req("pvc-lifecycle", &staging, &target_a, "9999"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");

    // Each pod sees its own group, at the same time.
    assert_eq!(owner(&target_a.join("existing.txt")), (1234, 3001, 0o664));
    assert_eq!(owner(&target_b.join("existing.txt")), (1234, 3002, 0o664));
    assert_eq!(owner(&target_a).1, 3001);
    // Members write through their own view; outsiders and the other pod's group cannot.
    let ran = run_as(
        5001,
        5001,
        &[3001],
        &format!("echo a >> {}/existing.txt", target_a.display()),
    );
    assert!(ran.ok, "{ran:?}");
    let ran = run_as(
        5002,
        5002,
        &[3002],
        &format!("echo b >> {}/existing.txt", target_b.display()),
    );
    assert!(ran.ok, "{ran:?}");
    let ran = run_as(
        5002,
        5002,
        &[3002],
        &format!("echo x >> {}/existing.txt", target_a.display()),
    );
    assert!(!ran.ok, "group 3002 through pod A's view: {ran:?}");
    let ran = run_as(
        6000,
        6000,
        &[],
        &format!("echo x >> {}/existing.txt", target_b.display()),
    );
    assert!(!ran.ok, "outsider: {ran:?}");
    let ran = run_as(
        5001,
        5001,
        &[3001],
        &format!(
            "umask 002; mkdir {0}/from-a && echo hi > {0}/from-a/f",
            target_a.display()
        ),
    );
    assert!(ran.ok, "{ran:?}");
    assert_eq!(
        owner(&target_b.join("from-a/f")),
        (5001, 3002, 0o664),
        "pod B sees pod A's file in its own group"
    );
    assert_eq!(
        fs::read_to_string(data.join("existing.txt")).unwrap(),
        "from the share\na\nb\n"
    );
    assert_eq!(
        owner(&data.join("existing.txt")),
        (1234, 1234, 0o644),
        "the share is untouched"
    );

    // Stats through a view.
    let stats = c
        .node
        .node_get_volume_stats(stats_req("pvc-lifecycle", &target_a))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.usage.len(), 2);
    assert!(stats.usage[0].total > 0);
    assert!(!stats.volume_condition.unwrap().abnormal);

    // The volume cannot be deleted while in use, nor unstaged while published.
    let e = c
        .controller
        .delete_volume(mountgroup::csi::pb::DeleteVolumeRequest {
            volume_id: "pvc-lifecycle".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let e = c
        .node
        .node_unstage_volume(unstage_req("pvc-lifecycle", &staging))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");

    // Unpublish both (twice), unstage (twice), delete (twice).
    for _ in 0..2 {
        c.node
            .node_unpublish_volume(unpublish_req("pvc-lifecycle", &target_a))
            .await
            .unwrap();
        c.node
            .node_unpublish_volume(unpublish_req("pvc-lifecycle", &target_b))
            .await
            .unwrap();
    }
    assert!(
        !target_a.exists() && !target_b.exists(),
        "publish made the targets, unpublish removes them"
    );
    for _ in 0..2 {
        c.node
            .node_unstage_volume(unstage_req("pvc-lifecycle", &staging))
            .await
            .unwrap();
    }
    for _ in 0..2 {
        c.controller
            .delete_volume(mountgroup::csi::pb::DeleteVolumeRequest {
                volume_id: "pvc-lifecycle".into(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    assert_eq!(
        d.mounts_below(),
        Vec::<std::path::PathBuf>::new(),
        "nothing left mounted"
    );
    assert_eq!(
        fs::read_dir(d.share.join("volumes")).unwrap().count(),
        0,
        "no volume data left"
    );
    assert_eq!(
        fs::read_dir(d.share.join("meta")).unwrap().count(),
        0,
        "no metadata left"
    );
    let state: serde_json::Value =
        serde_json::from_slice(&fs::read(d.state.join("node-state.json")).unwrap()).unwrap();
    assert_eq!(state["published"], serde_json::json!({}));
    assert_eq!(state["staged"], serde_json::json!({}));
}

#[tokio::test(flavor = "multi_thread")]
async fn read_only_publishes_give_read_only_views() {
    use mountgroup::csi::pb::volume_capability::access_mode::Mode;
    let f = Fixture::new();
    let d = Driver::start(f.dir.path());
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    c.controller
        .create_volume(create_req("ro-vol", 1 << 20))
        .await
        .unwrap();
    c.node
        .node_stage_volume(stage_req("ro-vol", &staging))
        .await
        .unwrap();
    let by_flag = f.dir.path().join("t-flag");
    let by_mode = f.dir.path().join("t-mode");
    let mut req = publish_req("ro-vol", &staging, &by_flag, "4000");
    req.readonly = true;
    c.node.node_publish_volume(req).await.unwrap();
    let mut req = publish_req("ro-vol", &staging, &by_mode, "4000");
    req.volume_capability = Some(mount_cap(&[], "4000", Mode::MultiNodeReaderOnly));
    c.node.node_publish_volume(req).await.unwrap();
    for t in [&by_flag, &by_mode] {
        assert_eq!(
            errno(fs::write(t.join("x"), "y")),
            libc::EROFS,
            "{}",
            t.display()
        );
    }
    // CIFS mount flags reach the view, with the pod's group.
    let cifs = f.dir.path().join("t-cifs");
    let mut req = publish_req("ro-vol", &staging, &cifs, "4000");
    req.volume_capability = Some(mount_cap(
        &["uid=1001", "file_mode=0640", "dir_mode=0750"],
        "4000",
        Mode::SingleNodeWriter,
    ));
    c.node.node_publish_volume(req).await.unwrap();
    assert_eq!(owner(&cifs), (1001, 4000, 0o750));
    // gid= in mount_flags that disagrees with the pod's group is refused, naming both.
    let clash = f.dir.path().join("t-clash");
    let mut req = publish_req("ro-vol", &staging, &clash, "4000");
    req.volume_capability = Some(mount_cap(&["gid=5"], "4000", Mode::SingleNodeWriter));
    let e = c.node.node_publish_volume(req).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("volume_mount_group") && e.message().contains("gid=5"),
        "{}",
        e.message()
    );
    assert!(!clash.exists(), "a refused publish leaves no target behind");
    for t in [&by_flag, &by_mode, &cifs] {
        c.node
            .node_unpublish_volume(unpublish_req("ro-vol", t))
            .await
            .unwrap();
    }
    c.node
        .node_unstage_volume(unstage_req("ro-vol", &staging))
        .await
        .unwrap();
    assert!(d.mounts_below().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn secrets_in_requests_never_reach_logs_or_state() {
    const MARKER: &str = "s3cr3t-marker-0b9f";
    let f = Fixture::new();
    let d = Driver::start(f.dir.path());
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    let target = f.dir.path().join("target");
    let mut req = create_req("secret-vol", 1 << 20);
    req.secrets.insert("shareKey".into(), MARKER.into());
    c.controller.create_volume(req).await.unwrap();
    let mut req = stage_req("secret-vol", &staging);
    req.secrets.insert("shareKey".into(), MARKER.into());
    c.node.node_stage_volume(req).await.unwrap();
    let mut req = publish_req("secret-vol", &staging, &target, "1");
    req.secrets.insert("shareKey".into(), MARKER.into());
    c.node.node_publish_volume(req).await.unwrap();
    // A failing call too: errors are logged.
    let mut req = publish_req("secret-vol", &staging, &target, "2");
    req.secrets.insert("shareKey".into(), MARKER.into());
    c.node.node_publish_volume(req).await.unwrap_err();
    c.node
        .node_unpublish_volume(unpublish_req("secret-vol", &target))
        .await
        .unwrap();
    assert!(
        d.log_text().contains("NodePublishVolume"),
        "the calls were logged"
    );
    assert!(!d.log_text().contains(MARKER), "a secret in the driver log");
    let out = std::process::Command::new("grep")
        .args(["-r", MARKER])
        .arg(&d.state)
        .arg(&d.share)
        .output()
        .unwrap();
    assert!(
        out.stdout.is_empty(),
        "a secret on disk: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A share that answers with an error (a `soft` mount whose server is away answers
/// `EHOSTDOWN`; here a FUSE share whose daemon died answers `ENOTCONN`) makes the
/// volume abnormal, with the share's errno by name, where NodeGetVolumeStats failed
/// `INTERNAL`.
#[tokio::test(flavor = "multi_thread")]
async fn a_share_that_fails_makes_the_volume_abnormal_with_its_errno() {
    let f = Fixture::new();
    let root = f.dir.path();
    let share = f.subdir("share");
    let share_view = Mounted::start(&f.subdir("disk"), &share, &["-o", "gid=0"]).unwrap();
    let d = Driver::start_with(root, share.clone(), &["--share-key-file", "none"]);
    let mut c = d.clients().await;
    let (staging, target) = (f.subdir("staging"), root.join("target"));
    let _guards = [Unmount(target.clone()), Unmount(staging.clone())];
    c.create_stage_publish("a", &staging, &target, "2000").await;
    let (abnormal, message) = volume_condition(&mut c, "a", &target).await;
    assert!(!abnormal, "{message}");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(share_view.pid() as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    // Once the connection has ended: a request in flight while the kernel aborts it
    // answers ECONNABORTED instead (fs/fuse/dev.c `fuse_abort_conn`), which a call
    // racing the kill once got.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::fs::metadata(&share)
        .map_err(|e| e.raw_os_error())
        .err()
        != Some(Some(libc::ENOTCONN))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the share's connection never ended"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (abnormal, message) = volume_condition(&mut c, "a", &target).await;
    assert!(
        abnormal && message.contains("the share fails") && message.contains("(ENOTCONN)"),
        "{message}"
    );
    c.node
        .node_unpublish_volume(unpublish_req("a", &target))
        .await
        .unwrap();
    drop(share_view);
}
