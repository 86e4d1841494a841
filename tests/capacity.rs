//! Capacity that holds: on a real btrfs share (a loop-mounted image) a volume's
//! quota is enforced by the kernel on writes through a view, including passthrough
//! writes, `df` in the view shows the volume, and expansion (ControllerExpandVolume +
//! NodeExpandVolume, both with the share key) applies to the live mount. Elsewhere
//! capacity is advisory and the statistics stay truthful.

mod common;
#[path = "common/driver.rs"]
mod driver;

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use driver::*;
use mountgroup::csi::pb;
use tonic::Code;

const MIB: u64 = 1 << 20;

/// A btrfs file system in a sparse image file, loop-mounted; unmounted on drop.
struct BtrfsImage {
    mnt: PathBuf,
}

impl BtrfsImage {
    fn new(dir: &Path) -> BtrfsImage {
        BtrfsImage::mounted(dir, "loop")
    }

    /// Mounted with `options` (`loop` among them).
    fn mounted(dir: &Path, options: &str) -> BtrfsImage {
        let img = dir.join("share.img");
        let mnt = dir.join("share");
        fs::create_dir_all(&mnt).unwrap();
        fs::File::create(&img).unwrap().set_len(512 * MIB).unwrap();
        let ok = |c: &mut Command| {
            let out = c
                .output()
                .expect("btrfs-progs and mount are installed (.ci/run installs them)");
            assert!(
                out.status.success(),
                "{c:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        ok(Command::new("mkfs.btrfs").arg("-q").arg(&img));
        ok(Command::new("mount")
            .arg("-o")
            .arg(options)
            .arg(&img)
            .arg(&mnt));
        BtrfsImage { mnt }
    }
}

impl Drop for BtrfsImage {
    fn drop(&mut self) {
        // The views and staging binds on it first, then the image itself (listed first).
        for m in mounts_below(&self.mnt).into_iter().rev() {
            let _ = rustix::mount::unmount(&m, rustix::mount::UnmountFlags::DETACH);
        }
    }
}

fn secrets(key: &str) -> HashMap<String, String> {
    HashMap::from([("shareKey".to_string(), key.to_string())])
}

fn df_total(path: &Path) -> u64 {
    let s = rustix::fs::statvfs(path).unwrap();
    s.f_blocks * s.f_frsize
}

/// Appends 1 MiB at a time (synced) until `limit` MiB or an error; the MiB written
/// and the error.
fn fill(path: &Path, limit: u64) -> (u64, Option<std::io::Error>) {
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    let chunk = vec![0xabu8; MIB as usize];
    for written in 0..limit {
        if let Err(e) = f.write_all(&chunk).and_then(|()| f.sync_data()) {
            return (written, Some(e));
        }
    }
    (limit, None)
}

#[tokio::test(flavor = "multi_thread")]
async fn quota_holds_through_passthrough_and_grows_online() {
    let f = Fixture::new();
    let image = BtrfsImage::new(f.dir.path());
    let d = Driver::start_with(f.dir.path(), image.mnt.clone(), &[]);
    assert!(
        d.log_text()
            .contains("capacity enforced by btrfs quota groups"),
        "{}",
        d.log_text()
    );
    let key = d.key();
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    let target = f.dir.path().join("target");

    let mut req = create_req("pvc-quota", (10 * MIB) as i64);
    req.secrets = secrets(&key);
    c.controller.create_volume(req).await.unwrap();
    let mut req = stage_req("pvc-quota", &staging);
    req.secrets = secrets(&key);
    c.node.node_stage_volume(req).await.unwrap();
    c.node
        .node_publish_volume(publish_req("pvc-quota", &staging, &target, "3000"))
        .await
        .unwrap();
    let view_logs: String = fs::read_dir(d.state.join("views"))
        .unwrap()
        .map(|e| fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    assert!(
        view_logs.contains("passthrough=true"),
        "writes go through kernel passthrough: {view_logs}"
    );

    assert_eq!(
        df_total(&target),
        10 * MIB,
        "df in the view shows the volume's capacity"
    );
    // The 11th MiB is refused: the kernel enforces the quota on passthrough writes.
    let (written, err) = fill(&target.join("big"), 11);
    let err = err.expect("a write past the capacity fails");
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "{err}");
    assert!(
        (9..=10).contains(&written),
        "{written} MiB written before EDQUOT"
    );

    // Expand to 20 MiB: the controller records it, the node applies it to the live mount.
    let resp = c
        .controller
        .controller_expand_volume(pb::ControllerExpandVolumeRequest {
            volume_id: "pvc-quota".into(),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: (20 * MIB) as i64,
                limit_bytes: 0,
            }),
            secrets: secrets(&key),
            volume_capability: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (resp.capacity_bytes, resp.node_expansion_required),
        ((20 * MIB) as i64, true)
    );
    let node_expand = |s: HashMap<String, String>| pb::NodeExpandVolumeRequest {
        volume_id: "pvc-quota".into(),
        volume_path: target.to_string_lossy().into(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: (20 * MIB) as i64,
            limit_bytes: 0,
        }),
        secrets: s,
        ..Default::default()
    };
    // The node is about to change the live limit: the node-expand secret is required.
    expect(
        c.node.node_expand_volume(node_expand(HashMap::new())).await,
        Code::InvalidArgument,
        "node-expand-secret-name",
    );
    let resp = c
        .node
        .node_expand_volume(node_expand(secrets(&key)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.capacity_bytes, (20 * MIB) as i64);
    // Now nothing is left to do: a repeat without the secret changes nothing and is OK.
    let resp = c
        .node
        .node_expand_volume(node_expand(HashMap::new()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.capacity_bytes, (20 * MIB) as i64);
    assert_eq!(
        df_total(&target),
        20 * MIB,
        "the live view shows the new capacity"
    );
    let (more, err) = fill(&target.join("more"), 5);
    assert!(
        err.is_none() && more == 5,
        "writes succeed after expansion: {err:?}"
    );
    // btrfs updates quota-group usage when a transaction commits.
    sh(&format!("sync -f {}", image.mnt.display()));
    // Stats report the quota, not the whole file system.
    let bytes = stats_bytes(&mut c, "pvc-quota", &target).await;
    assert_eq!(bytes.total, (20 * MIB) as i64);
    assert!(bytes.used >= (14 * MIB) as i64, "{bytes:?}");
    // GetCapacity: the image minus what volumes were promised and have not used.
    let cap = c
        .controller
        .get_capacity(pb::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    let free = rustix::fs::statvfs(&image.mnt).unwrap();
    assert!(cap.available_capacity as u64 <= free.f_bavail * free.f_frsize);

    c.node
        .node_unpublish_volume(unpublish_req("pvc-quota", &target))
        .await
        .unwrap();
    c.node
        .node_unstage_volume(unstage_req("pvc-quota", &staging))
        .await
        .unwrap();
    c.controller
        .delete_volume(pb::DeleteVolumeRequest {
            volume_id: "pvc-quota".into(),
            secrets: secrets(&key),
        })
        .await
        .unwrap();
    assert!(
        !image.mnt.join("volumes/pvc-quota").exists(),
        "the subvolume is gone"
    );
}

/// A native view of a volume on btrfs (a share mounted nosuid,nodev): the quota
/// holds for the pod's writes, and NodeGetVolumeStats reports the volume's capacity
/// and usage. The pod's own `df` shows the share's file system: a bind mount's statfs
/// is its superblock's (docs/CAPACITY.md).
#[tokio::test(flavor = "multi_thread")]
async fn native_views_hold_and_report_the_quota() {
    let f = Fixture::new();
    let image = BtrfsImage::mounted(f.dir.path(), "loop,nosuid,nodev");
    let d = Driver::start_with(f.dir.path(), image.mnt.clone(), &[]);
    let key = d.key();
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    let target = f.dir.path().join("target");
    let mut req = create_req("pvc-native", (10 * MIB) as i64);
    req.secrets = secrets(&key);
    c.controller.create_volume(req).await.unwrap();
    let mut req = stage_req("pvc-native", &staging);
    req.secrets = secrets(&key);
    c.node.node_stage_volume(req).await.unwrap();
    c.node
        .node_publish_volume(publish_req("pvc-native", &staging, &target, "3000"))
        .await
        .unwrap();
    // Native: the target is the btrfs itself, bind-mounted, not a FUSE view.
    use mountgroup::sys::mount::{Health, health};
    assert_eq!(
        health(&target),
        Health::Mounted("btrfs".into()),
        "{}",
        d.log_text()
    );
    let (written, err) = fill(&target.join("big"), 11);
    let err = err.expect("a write past the capacity fails");
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "{err}");
    assert!((9..=10).contains(&written), "{written} MiB written");
    assert_eq!(
        df_total(&target),
        df_total(&image.mnt),
        "the share's statfs"
    );
    sh(&format!("sync -f {}", image.mnt.display()));
    let bytes = stats_bytes(&mut c, "pvc-native", &target).await;
    assert_eq!(bytes.total, (10 * MIB) as i64, "{bytes:?}");
    assert!(bytes.used >= (9 * MIB) as i64, "{bytes:?}");
    assert!(bytes.available <= MIB as i64, "{bytes:?}");
    c.node
        .node_unpublish_volume(unpublish_req("pvc-native", &target))
        .await
        .unwrap();
    c.node
        .node_unstage_volume(unstage_req("pvc-native", &staging))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn keys_and_expansion_errors() {
    let f = Fixture::new();
    let d = Driver::start_with(f.dir.path(), f.dir.path().join("share"), &[]);
    let key = d.key();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(
            &fs::metadata(d.state.join("share.key"))
                .unwrap()
                .permissions()
        ) & 0o777,
        0o600
    );
    let mut c = d.clients().await;
    let wrong = secrets("not-the-key");

    // The provisioner, stage, and expand secrets are all required.
    expect(
        c.controller
            .create_volume(create_req("v", MIB as i64))
            .await,
        Code::InvalidArgument,
        "provisioner-secret-name",
    );
    let mut req = create_req("v", MIB as i64);
    req.secrets = wrong.clone();
    expect(
        c.controller.create_volume(req).await,
        Code::PermissionDenied,
        "does not match",
    );
    let mut req = create_req("v", MIB as i64);
    req.secrets = secrets(&key);
    c.controller.create_volume(req).await.unwrap();
    let staging = f.subdir("staging");
    expect(
        c.node.node_stage_volume(stage_req("v", &staging)).await,
        Code::InvalidArgument,
        "node-stage-secret-name",
    );
    let mut req = stage_req("v", &staging);
    req.secrets = secrets(&key);
    c.node.node_stage_volume(req).await.unwrap();
    expect(
        c.controller
            .delete_volume(pb::DeleteVolumeRequest {
                volume_id: "v".into(),
                secrets: wrong.clone(),
            })
            .await,
        Code::PermissionDenied,
        "shareKey",
    );

    let expand =
        |required: u64, s: HashMap<String, String>, id: &str| pb::ControllerExpandVolumeRequest {
            volume_id: id.into(),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: required as i64,
                limit_bytes: 0,
            }),
            secrets: s,
            volume_capability: None,
        };
    expect(
        c.controller
            .controller_expand_volume(expand(2 * MIB, HashMap::new(), "v"))
            .await,
        Code::InvalidArgument,
        "controller-expand-secret-name",
    );
    expect(
        c.controller
            .controller_expand_volume(expand(2 * MIB, wrong.clone(), "v"))
            .await,
        Code::PermissionDenied,
        "shareKey",
    );
    expect(
        c.controller
            .controller_expand_volume(expand(MIB / 2, secrets(&key), "v"))
            .await,
        Code::OutOfRange,
        "shrinking",
    );
    expect(
        c.controller
            .controller_expand_volume(expand(2 * MIB, secrets(&key), "nope"))
            .await,
        Code::NotFound,
        "nope",
    );
    let mut no_range = expand(2 * MIB, secrets(&key), "v");
    no_range.capacity_range = None;
    expect(
        c.controller.controller_expand_volume(no_range).await,
        Code::InvalidArgument,
        "capacity_range missing",
    );
    for _ in 0..2 {
        let r = c
            .controller
            .controller_expand_volume(expand(2 * MIB, secrets(&key), "v"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r.capacity_bytes,
            (2 * MIB) as i64,
            "a repeat answers the same"
        );
    }

    let node_expand =
        |required: u64, s: HashMap<String, String>, path: &Path| pb::NodeExpandVolumeRequest {
            volume_id: "v".into(),
            volume_path: path.to_string_lossy().into(),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: required as i64,
                limit_bytes: 0,
            }),
            secrets: s,
            ..Default::default()
        };
    // Capacity is advisory on this share: applying it changes nothing, so the call
    // succeeds without the secret (docs/CAPACITY.md); a wrong key is still refused.
    let r = c
        .node
        .node_expand_volume(node_expand(2 * MIB, HashMap::new(), &staging))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, (2 * MIB) as i64);
    expect(
        c.node
            .node_expand_volume(node_expand(2 * MIB, wrong, &staging))
            .await,
        Code::PermissionDenied,
        "shareKey",
    );
    expect(
        c.node
            .node_expand_volume(node_expand(9 * MIB, secrets(&key), &staging))
            .await,
        Code::Unavailable,
        "ControllerExpandVolume must grow it first",
    );
    expect(
        c.node
            .node_expand_volume(node_expand(2 * MIB, secrets(&key), Path::new("")))
            .await,
        Code::InvalidArgument,
        "volume_path missing",
    );
    // A path the volume is not at is NOT_FOUND, whatever it looks like.
    for elsewhere in ["/elsewhere", "some/path", "../x", "/a/../b"] {
        expect(
            c.node
                .node_expand_volume(node_expand(2 * MIB, secrets(&key), Path::new(elsewhere)))
                .await,
            Code::NotFound,
            elsewhere,
        );
        expect(
            c.node
                .node_get_volume_stats(pb::NodeGetVolumeStatsRequest {
                    volume_id: "v".into(),
                    volume_path: elsewhere.into(),
                    staging_target_path: String::new(),
                })
                .await,
            Code::NotFound,
            elsewhere,
        );
    }
    for _ in 0..2 {
        let r = c
            .node
            .node_expand_volume(node_expand(2 * MIB, secrets(&key), &staging))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.capacity_bytes, (2 * MIB) as i64);
    }
    c.node
        .node_unstage_volume(unstage_req("v", &staging))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn without_quota_support_capacity_is_advisory_and_stats_truthful() {
    let f = Fixture::new();
    let share = f.dir.path().join("share");
    let d = Driver::start_with(f.dir.path(), share.clone(), &["--share-key-file", "none"]);
    assert_eq!(
        d.log_text().matches("capacity is advisory").count(),
        1,
        "said once: {}",
        d.log_text()
    );
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    let target = f.dir.path().join("target");
    c.controller
        .create_volume(create_req("adv", MIB as i64))
        .await
        .unwrap();
    c.node
        .node_stage_volume(stage_req("adv", &staging))
        .await
        .unwrap();
    c.node
        .node_publish_volume(publish_req("adv", &staging, &target, "1"))
        .await
        .unwrap();
    // Not enforced: 2 MiB fit into a 1 MiB volume.
    let (written, err) = fill(&target.join("f"), 2);
    assert!(err.is_none() && written == 2);
    // The statistics are the file system's own, not an invented capacity.
    let bytes = stats_bytes(&mut c, "adv", &target).await;
    assert_eq!(bytes.total as u64, df_total(&share));
    let cap = c
        .controller
        .get_capacity(pb::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(cap.available_capacity > 0 && (cap.available_capacity as u64) <= df_total(&share));
    c.node
        .node_unpublish_volume(unpublish_req("adv", &target))
        .await
        .unwrap();
    c.node
        .node_unstage_volume(unstage_req("adv", &staging))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_key_never_appears_in_logs_even_at_trace_level() {
    let f = Fixture::new();
    let d = Driver::start_with(
        f.dir.path(),
        f.dir.path().join("share"),
        &["--log", "trace"],
    );
    let key = d.key();
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    let target = f.dir.path().join("target");
    let mut req = create_req("logged", MIB as i64);
    req.secrets = secrets(&key);
    c.controller.create_volume(req).await.unwrap();
    let mut req = stage_req("logged", &staging);
    req.secrets = secrets(&key);
    c.node.node_stage_volume(req).await.unwrap();
    let mut req = publish_req("logged", &staging, &target, "9");
    req.secrets = secrets(&key);
    c.node.node_publish_volume(req).await.unwrap();
    c.controller
        .controller_expand_volume(pb::ControllerExpandVolumeRequest {
            volume_id: "logged".into(),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: (2 * MIB) as i64,
                limit_bytes: 0,
            }),
            secrets: secrets(&key),
            volume_capability: None,
        })
        .await
        .unwrap();
    let mut bad = create_req("logged2", MIB as i64);
    bad.secrets = secrets(&format!("{key}x"));
    c.controller.create_volume(bad).await.unwrap_err();
    c.node
        .node_unpublish_volume(unpublish_req("logged", &target))
        .await
        .unwrap();
    c.node
        .node_unstage_volume(unstage_req("logged", &staging))
        .await
        .unwrap();
    c.controller
        .delete_volume(pb::DeleteVolumeRequest {
            volume_id: "logged".into(),
            secrets: secrets(&key),
        })
        .await
        .unwrap();
    let log = d.log_text();
    assert!(log.contains("TRACE"), "trace logging was on");
    assert!(!log.contains(&key), "the share key is in the log");
    for entry in fs::read_dir(d.state.join("views")).unwrap() {
        assert!(
            !fs::read_to_string(entry.unwrap().path())
                .unwrap()
                .contains(&key)
        );
    }
}
