//! CephFS as the driver's share: one-node Ceph clusters of the tests' own
//! (tests/common/ceph.rs) on the machine's loopback, mounted with the kernel's CephFS
//! client as every node of a Rook cluster mounts it. Two releases: Debian 12's 16.2,
//! whose MDS does not take a creation's owner from the client (no native views:
//! creations through an idmapped mount fail), and Debian forky's 20.2, whose MDS does
//! (`CEPHFS_FEATURE_HAS_OWNER_UIDGID`: Ceph 19 and later, backported to Reef and Quincy). It needs the ceph module,
//! which the development machine lacks: the VM tier runs it (`scripts/vm-test 6.12
//! --systemd ceph --ignored`); scripts/vm-test installs Ceph 16.2 and makes the forky
//! root.

#[path = "common/ceph.rs"]
mod ceph;
mod common;
#[path = "common/driver.rs"]
mod driver;
#[path = "common/kubelet.rs"]
mod kubelet;
#[path = "common/named.rs"]
mod named;
#[path = "common/nodes.rs"]
mod nodes;
#[path = "common/outage.rs"]
mod outage;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::time::Duration;

use ceph::*;
use common::*;
use driver::*;
use kubelet::{Pod, Pvc, StorageClass};
use named::*;
use nodes::*;
use outage::*;

const G: u32 = 4242;
const MIB: u64 = 1 << 20;

/// A pod's 64 MiB write into `dir`, a volume of 8 MiB, fails with `EDQUOT` (the
/// client learns the directory's size from the MDS as it goes, so a little more than
/// the quota may pass first).
fn assert_quota_refuses_64_mib(dir: &Path) {
    let ran = run_as(
        1000,
        1000,
        &[G],
        &format!(
            "dd if=/dev/zero of={}/big bs=1M count=64 conv=fsync status=none",
            dir.display()
        ),
    );
    assert!(
        !ran.ok && ran.stderr.contains("Disk quota exceeded"),
        "{ran:?}"
    );
}

/// The volume `small` (8 MiB) created, staged and published for the fsGroup `G` at
/// the fixture's `small`, unmounted on drop.
async fn publish_small(c: &mut Clients, f: &Fixture) -> (std::path::PathBuf, Unmount) {
    let staging = f.subdir("staging-small");
    let small = f.dir.path().join("small");
    c.controller
        .create_volume(create_req("small", (8 * MIB) as i64))
        .await
        .unwrap();
    c.node
        .node_stage_volume(stage_req("small", &staging))
        .await
        .unwrap();
    c.node
        .node_publish_volume(publish_req("small", &staging, &small, &G.to_string()))
        .await
        .unwrap();
    (small.clone(), Unmount(small))
}

/// The default publish on CephFS: the share can be idmapped, but a Pacific MDS does
/// not take a creation's owner from the client, so that every create through an
/// idmapped mount of it answers `EIO`. The driver proves creations before it makes
/// native volumes: it makes FUSE volumes, says why, and the pod's first write works.
/// Then capacity: a CephFS quota per volume, enforced, expanded, shown by `df`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the ceph module and Ceph: the VM tier runs it (scripts/vm-test 6.12 --systemd ceph --ignored)"]
async fn the_default_publish_on_cephfs_takes_a_pods_writes() {
    let f = Fixture::new();
    let root = f.dir.path();
    let mut ceph = Ceph::start(&root.join("ceph"), Release::Installed);
    let share = f.subdir("share");
    let _share = ceph.mount(&share);
    let (d, mut c, target, _unmount) = default_publish(root, &f.subdir("staging"), G).await;
    let (mechanism, fallback) = mechanism(&d.metrics_addr(), &target);
    let ran = run_as(
        1000,
        1000,
        &[G],
        &format!(
            "cd {} && echo x > f && mkdir d && ln -s f l && cat l",
            target.display()
        ),
    );
    assert!(
        ran.ok && ran.stdout == "x\n",
        "{mechanism} {fallback}: {ran:?}\n{}",
        sh("dmesg | tail -20")
    );
    // Made while the share could not serve native views: a FUSE volume for good.
    assert_eq!(
        (mechanism.as_str(), fallback.as_str()),
        ("fuse", "share-at-create")
    );
    assert!(
        d.log_text()
            .contains("nothing can be made through an idmapped mount"),
        "{}",
        d.log_text()
    );
    an_mds_restart_loses_nothing(&mut ceph, &d, &mut c, &target, &share.join("volumes/vol")).await;
    c.node
        .node_unpublish_volume(unpublish_req("vol", &target))
        .await
        .unwrap();
    // `mountgroup mount --native` asks the same of its source, and refuses by name
    // what would answer a pod's every create `EIO`.
    let source = share.join("direct");
    fs::create_dir(&source).unwrap();
    chown(&source, 0, 2_000_000_000);
    let mnt = f.subdir("direct-mnt");
    let out = std::process::Command::new(BIN)
        .args(["mount", "--native"])
        .arg(&source)
        .arg(&mnt)
        .args(["-o", "gid=4242"])
        .output()
        .unwrap();
    let _never = Unmount(mnt.clone());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(2)
            && stderr.contains("nothing can be made through an idmapped mount"),
        "{out:?}"
    );
    assert!(!is_mounted(&mnt));

    // Capacity: a CephFS quota on each volume's directory, which the client enforces.
    assert!(
        d.log_text()
            .contains("capacity enforced by CephFS directory quotas"),
        "{}",
        d.log_text()
    );
    let quota = |vol: &str| {
        sh(&format!(
            "getfattr --only-values -n ceph.quota.max_bytes {}/volumes/{vol}",
            share.display()
        ))
        .trim_end_matches('\0')
        .trim()
        .to_string()
    };
    assert_eq!(quota("vol"), (1u64 << 30).to_string());
    let (small, _small) = publish_small(&mut c, &f).await;
    assert_eq!(quota("small"), (8 * MIB).to_string());
    let df_total = |p: &Path| {
        let s = rustix::fs::statvfs(p).unwrap();
        s.f_blocks * s.f_frsize
    };
    assert_eq!(df_total(&small), 8 * MIB, "df in the view shows the quota");
    // A write past it fails.
    assert_quota_refuses_64_mib(&small);
    // Expanded: the quota follows, and the view shows it.
    let range = Some(mountgroup::csi::pb::CapacityRange {
        required_bytes: (128 * MIB) as i64,
        limit_bytes: 0,
    });
    let resp = c
        .controller
        .controller_expand_volume(mountgroup::csi::pb::ControllerExpandVolumeRequest {
            volume_id: "small".into(),
            capacity_range: range,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.capacity_bytes, (128 * MIB) as i64);
    c.node
        .node_expand_volume(mountgroup::csi::pb::NodeExpandVolumeRequest {
            volume_id: "small".into(),
            volume_path: small.to_string_lossy().into(),
            capacity_range: range,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(quota("small"), (128 * MIB).to_string());
    assert_eq!(df_total(&small), 128 * MIB);
    let ran = run_as(
        1000,
        1000,
        &[G],
        &format!(
            "rm -f {0}/big && dd if=/dev/zero of={0}/big bs=1M count=64 conv=fsync status=none",
            small.display()
        ),
    );
    assert!(ran.ok, "{ran:?}");
    c.node
        .node_unpublish_volume(unpublish_req("small", &small))
        .await
        .unwrap();
}

/// The MDS restarts (a crash, an upgrade) under appends through the view of the
/// volume `vol` at `target` and on the share's own mount at `raw`: both go on once it
/// is back, every acknowledged append is on the share, no append through the view
/// fails but as one on the share's mount does, the keeper kills nothing and the
/// volume is normal.
async fn an_mds_restart_loses_nothing(
    ceph: &mut Ceph,
    d: &Driver,
    c: &mut Clients,
    target: &Path,
    raw: &Path,
) {
    let through_view = Appender::start(target.join("appended"));
    let on_share = Appender::start(raw.join("appended-raw"));
    let (view_log, raw_log) = (raw.join("appended"), raw.join("appended-raw"));
    eventually(
        Duration::from_secs(120),
        "appends before the restart",
        || lines_in(&view_log) >= 3 && lines_in(&raw_log) >= 3,
    );
    ceph.restart_mds();
    let (view_then, raw_then) = (lines_in(&view_log), lines_in(&raw_log));
    eventually(
        Duration::from_secs(300),
        "appends after the restart",
        || lines_in(&view_log) >= view_then + 3 && lines_in(&raw_log) >= raw_then + 3,
    );
    let (view, direct) = (through_view.stop(), on_share.stop());
    eprintln!(
        "an MDS restart: the longest append through the view {:?} ({} failed), on the share's mount {:?} ({} failed)",
        view.longest,
        view.errors.len(),
        direct.longest,
        direct.errors.len()
    );
    let failed = |a: &Appended| a.errors.iter().cloned().collect::<BTreeSet<_>>();
    assert!(
        failed(&view).is_subset(&failed(&direct)),
        "{:?} against {:?}",
        view.errors,
        direct.errors
    );
    appended_lines_kept(&view_log, view.acknowledged);
    appended_lines_kept(&raw_log, direct.acknowledged);
    assert!(!d.log_text().contains("killing it"), "{}", d.log_text());
    let (abnormal, message) = volume_condition(c, "vol", target).await;
    assert!(!abnormal, "{message}");
}

/// ceph-csi's Secret for the cluster (`adminID`/`adminKey` for the provisioner,
/// `userID`/`userKey` for nodes: ceph-csi's examples/cephfs/secret.yaml), the admin's
/// key for both here.
fn ceph_secret(ceph: &Ceph) -> std::collections::HashMap<String, String> {
    let key = ceph.admin_key();
    [
        ("adminID", "admin"),
        ("adminKey", key.as_str()),
        ("userID", "admin"),
        ("userKey", key.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The default publish on a Ceph whose MDS takes a creation's owner from the client
/// (20.2), of volumes of a class that names the file system as ceph-csi's do (its
/// monitors here, for the cluster has no ceph-csi configuration), on the share the
/// driver mounts itself with ceph-csi's Secret: the creation through an idmapped mount
/// works, so volumes are native views, and a pod's creations through one work, with
/// the owner it made them as. Capacity is a CephFS quota the controller sets, enforced
/// through the native view, and grown by ControllerExpandVolume alone. A static PV of
/// data already on the file system (ceph-csi's `rootPath`) shows a pod its fsGroup on
/// all of it and changes nothing there.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the ceph module and Ceph 20: the VM tier runs it (scripts/vm-test 6.12 --systemd ceph --ignored)"]
async fn a_newer_mds_gets_native_views_whose_creations_work() {
    let f = Fixture::new();
    let root = f.dir.path();
    let ceph = Ceph::start(&root.join("ceph"), Release::newer());
    // The raw mount of the same file system, as the reference and to lay data down.
    let raw = f.subdir("raw");
    let _raw = ceph.mount(&raw);
    let secret = ceph_secret(&ceph);
    let monitors = format!("127.0.0.1:{}", ceph.port);
    let class = StorageClass::new(
        &[
            ("monitors", &monitors),
            ("fsName", "cephfs"),
            ("subvolumeGroup", "csi"),
            (
                "csi.storage.k8s.io/provisioner-secret-name",
                "csi-cephfs-secret",
            ),
            ("csi.storage.k8s.io/provisioner-secret-namespace", "default"),
            (
                "csi.storage.k8s.io/node-stage-secret-name",
                "csi-cephfs-secret",
            ),
            ("csi.storage.k8s.io/node-stage-secret-namespace", "default"),
        ],
        &[],
    );
    let (d, mut c, dirs, p, data) = named_publish(
        &f.subdir("node"),
        &class,
        &secret,
        &raw.join("volumes/csi"),
        G,
    )
    .await;
    let target = p.target.clone();
    let (made, fallback) = mechanism(&d.metrics_addr(), &target);
    assert_eq!(made, "native", "{fallback}\n{}", d.log_text());
    let ran = run_as(
        1000,
        1000,
        &[G],
        &format!(
            "cd {} && echo x > f && mkdir d && ln -s f l && cat l && mktemp -p d",
            target.display()
        ),
    );
    assert!(
        ran.ok && ran.stdout.starts_with("x\n"),
        "{ran:?}\n{}",
        sh("dmesg | tail -20")
    );
    assert_eq!(owner(&target.join("f")).0, 1000);
    assert_eq!(owner(&target.join("f")).1, G);
    assert_eq!(owner(&target.join("d")).1, G);
    assert_eq!(
        owner(&data.join("f")).0,
        1000,
        "the pod's on the file system"
    );
    p.unpublish_unstage(&mut c).await;
    delete(&mut c, &p.pv, &secret).await;
    assert!(!data.exists());

    // A quota through a native view: the kernel client enforces the volume
    // directory's, below the view's mount.
    let mut small = Pvc::new("small");
    small.bytes = (8 * MIB) as i64;
    let pv = provision(&mut c, &class, &small, &secret).await.unwrap();
    let pod = Pod::new("app", Some(i64::from(G)));
    let s = Published::stage_and_publish(&mut c, &dirs, pv.clone(), &pod, &secret)
        .await
        .unwrap();
    assert_eq!(mechanism(&d.metrics_addr(), &s.target).0, "native");
    assert_quota_refuses_64_mib(&s.target);
    // Stats are the volume's: the native view's own statfs is the share mount's.
    // The MDS propagates a directory's recursive size (`ceph.dir.rbytes`) to it a
    // little after the writes.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let bytes = loop {
        let bytes = stats_bytes(&mut c, &pv.volume_handle, &s.target).await;
        if bytes.used as u64 >= 7 * MIB || std::time::Instant::now() > deadline {
            break bytes;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    assert_eq!(bytes.total as u64, 8 * MIB, "{bytes:?}");
    assert!(bytes.used as u64 >= 7 * MIB, "{bytes:?}");
    // Grown by the controller alone: the node has nothing to do.
    let grown = c
        .controller
        .controller_expand_volume(mountgroup::csi::pb::ControllerExpandVolumeRequest {
            volume_id: pv.volume_handle.clone(),
            capacity_range: Some(mountgroup::csi::pb::CapacityRange {
                required_bytes: (128 * MIB) as i64,
                limit_bytes: 0,
            }),
            secrets: secret.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!grown.node_expansion_required);
    eventually(Duration::from_secs(60), "the view's quota grew", || {
        sh(&format!(
            "getfattr -n ceph.quota.max_bytes --only-values {}",
            s.staging.display()
        )) == (128 * MIB).to_string()
    });
    s.unpublish_unstage(&mut c).await;
    delete(&mut c, &pv, &secret).await;

    // Static: ceph-csi's static PV of a directory of data already there.
    existing_data(&raw.join("legacy/data"));
    let before = tree(&raw.join("legacy/data"));
    let static_pv = kubelet::static_pv(
        "legacy-data",
        &[
            ("monitors", &monitors),
            ("fsName", "cephfs"),
            ("staticVolume", "true"),
            ("rootPath", "/legacy/data"),
        ],
        &[],
    );
    let s = Published::stage_and_publish(&mut c, &dirs, static_pv, &pod, &secret)
        .await
        .unwrap();
    let walk = run_as(
        1000,
        1000,
        &[G],
        &format!(
            "cd {} && find . -printf '%g %p\\n' && cat private.key private/inner.txt",
            s.target.display()
        ),
    );
    assert!(
        walk.ok && walk.stdout.contains("secret\ninner\n"),
        "{walk:?}"
    );
    for line in walk
        .stdout
        .lines()
        .filter(|l| l.contains(" ./") || l.ends_with(" ."))
    {
        assert!(line.starts_with(&format!("{G} ")), "{}", walk.stdout);
    }
    assert_ne!(
        mechanism(&d.metrics_addr(), &s.target).0,
        "native",
        "existing data is never native"
    );
    assert_eq!(
        tree(&raw.join("legacy/data")),
        before,
        "the driver changed nothing"
    );
    s.unpublish_unstage(&mut c).await;
    assert_eq!(mounts_below(&dirs.root), Vec::<std::path::PathBuf>::new());
}

/// Two nodes on one CephFS, each with its own kernel client (`noshare`: a client of
/// its own, as on two machines), two node plugins, one RWX volume, two fsGroups.
async fn two_nodes_on(release: Release, mechanism_made: &str) {
    let f = Fixture::new();
    let ceph = Ceph::start(&f.dir.path().join("ceph"), release);
    let mount = |at: &Path| ceph.mount_with(at, ",noshare");
    two_nodes_publish_one_volume(&f, &mount, mechanism_made, Owners::Held).await;
}

/// On 16.2: FUSE views, owners recorded in `trusted.*` attributes on the share.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the ceph module and Ceph: the VM tier runs it (scripts/vm-test 6.12 --systemd ceph --ignored)"]
async fn two_nodes_publish_one_volume_of_cephfs_through_fuse_views() {
    two_nodes_on(Release::Installed, "fuse").await;
}

/// On 20.2: native views, owners on disk.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the ceph module and Ceph 20: the VM tier runs it (scripts/vm-test 6.12 --systemd ceph --ignored)"]
async fn two_nodes_publish_one_volume_of_cephfs_through_native_views() {
    two_nodes_on(Release::newer(), "native").await;
}

/// scripts/pjdfstest's run of `view` on `dir` (`--share`): its summary line and the
/// tests that failed. No failure is taken as known (`--known-as cephfs`, which the
/// known-failures file does not name): the caller compares. The run's output goes to
/// the tier's log directory.
fn pjdfstest_on(dir: &Path, view: &str, work: &Path) -> (String, BTreeSet<String>) {
    fs::create_dir(dir).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let ran = std::process::Command::new(repo.join("scripts/pjdfstest"))
        .args(["--view", view, "--known-as", "cephfs", "--no-build"])
        .arg("--share")
        .arg(dir)
        .arg("--work")
        .arg(work)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&ran.stdout).into_owned();
    eprintln!("{stdout}{}", String::from_utf8_lossy(&ran.stderr));
    if let Some(out) = std::env::var_os("MOUNTGROUP_VM_OUT") {
        let _ = fs::copy(
            work.join(format!("{view}.out")),
            Path::new(&out).join(format!("pjdfstest-cephfs-{view}.out")),
        );
    }
    let summary = stdout
        .lines()
        .find(|l| l.starts_with(&format!("scripts/pjdfstest: {view}: ")))
        .unwrap_or_else(|| panic!("pjdfstest gave no summary for the {view} run"))
        .to_string();
    let failed = stdout
        .lines()
        .skip_while(|l| !l.contains("NEW failures"))
        .skip(1)
        .filter_map(|l| l.strip_prefix("  "))
        .map(str::to_string)
        .collect();
    (summary, failed)
}

/// pjdfstest on a native view of CephFS 20.2, as CI runs it on ext4
/// (docs/PJDFSTEST.md), against pjdfstest on the raw mount in the same cluster: a
/// native view is the kernel client's own file system, idmapped, so it fails no test
/// the raw mount passes. (CephFS's own failures, the raw mount's, are its own:
/// docs/PJDFSTEST.md lists them.) scripts/vm-test installs pjdfstest and builds the
/// release binary before the VM, whose root is read-only.
#[test]
#[ignore = "needs the ceph module and Ceph 20: the VM tier runs it (scripts/vm-test 6.12 --systemd ceph --ignored)"]
fn native_views_on_cephfs_pass_pjdfstest_as_the_raw_mount_does() {
    let f = Fixture::new();
    let ceph = Ceph::start(&f.dir.path().join("ceph"), Release::newer());
    let share = f.subdir("share");
    let _share = ceph.mount(&share);
    // A unix socket's path has at most 107 bytes, and pjdfstest binds its sockets
    // by their whole path: the view's mount point is no longer than the raw
    // directory's path, so that neither run loses its socket tests to the length.
    let work = f.subdir("w");
    let (raw, raw_failed) = pjdfstest_on(&share.join("raw"), "raw", &work);
    let (native, native_failed) = pjdfstest_on(&share.join("native"), "native", &work);
    assert!(native.contains(" 398 tests"), "{native}");
    let only_native: Vec<_> = native_failed.difference(&raw_failed).collect();
    assert!(
        only_native.is_empty(),
        "failed on the native view, passed on the raw mount: {only_native:?}\n{raw}\n{native}"
    );
}
