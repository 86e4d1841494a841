//! CephFS as the driver's share: a one-node Ceph of the test's own (Debian's 16.2: a
//! monitor, a manager, an OSD on memstore, an MDS) on the machine's loopback, mounted
//! with the kernel's CephFS client as every node of a Rook cluster mounts it. It needs
//! the ceph module and Ceph's daemons, which the development machine lacks: the VM
//! tier runs it (`scripts/vm-test 6.12 --systemd ceph --ignored`), and scripts/vm-test
//! installs Ceph.

mod common;
#[path = "common/driver.rs"]
mod driver;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use driver::*;

const G: u32 = 4242;

/// A Ceph cluster of one node, its configuration, keys, data and logs under `dir`.
struct Ceph {
    conf: PathBuf,
    port: u16,
    daemons: Vec<Child>,
}

impl Ceph {
    fn start(dir: &Path) -> Ceph {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let d = dir.display();
        for sub in ["run", "log", "mon-a", "osd-0", "mds-a", "mgr-x"] {
            fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let fsid = fs::read_to_string("/proc/sys/kernel/random/uuid").unwrap();
        let fsid = fsid.trim();
        let conf = dir.join("ceph.conf");
        fs::write(
            &conf,
            format!(
                "[global]
fsid = {fsid}
mon host = v1:127.0.0.1:{port}
ms bind msgr2 = false
keyring = {d}/keyring
run dir = {d}/run
admin socket = {d}/run/$name.asok
log file = {d}/log/$name.log
pid file = {d}/run/$name.pid
mon data = {d}/mon-$id
osd data = {d}/osd-$id
mds data = {d}/mds-$id
mgr data = {d}/mgr-$id
osd objectstore = memstore
memstore device bytes = 2147483648
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
"
            ),
        )
        .unwrap();
        // Every key, with its capabilities, in one keyring that the monitor's mkfs
        // takes in whole.
        let keyring = dir.join("keyring");
        for (i, (name, caps)) in [
            ("mon.", &[("mon", "allow *")][..]),
            (
                "client.admin",
                &[
                    ("mon", "allow *"),
                    ("osd", "allow *"),
                    ("mds", "allow *"),
                    ("mgr", "allow *"),
                ][..],
            ),
            (
                "mgr.x",
                &[
                    ("mon", "allow profile mgr"),
                    ("osd", "allow *"),
                    ("mds", "allow *"),
                ][..],
            ),
            (
                "osd.0",
                &[
                    ("mon", "allow profile osd"),
                    ("osd", "allow *"),
                    ("mgr", "allow profile osd"),
                ][..],
            ),
            (
                "mds.a",
                &[
                    ("mon", "allow profile mds"),
                    ("osd", "allow rwx"),
                    ("mds", "allow"),
                    ("mgr", "allow profile mds"),
                ][..],
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let mut cmd = Command::new("ceph-authtool");
            if i == 0 {
                cmd.arg("--create-keyring");
            }
            cmd.arg(&keyring).args(["--gen-key", "-n", name]);
            for (what, cap) in caps {
                cmd.args(["--cap", what, cap]);
            }
            let out = cmd
                .output()
                .expect("Ceph is installed (scripts/vm-test installs it)");
            assert!(out.status.success(), "ceph-authtool {name}: {out:?}");
        }
        sh(&format!(
            "monmaptool --create --addv a [v1:127.0.0.1:{port}] --fsid {fsid} {d}/monmap >/dev/null && ceph-mon -c {d}/ceph.conf --mkfs -i a --monmap {d}/monmap --keyring {d}/keyring"
        ));
        let mut ceph = Ceph {
            conf,
            port,
            daemons: Vec::new(),
        };
        ceph.daemon("ceph-mon", "a");
        ceph.cli("mon stat");
        ceph.daemon("ceph-mgr", "x");
        let uuid = fs::read_to_string("/proc/sys/kernel/random/uuid").unwrap();
        let uuid = uuid.trim();
        ceph.cli(&format!("osd new {uuid} 0"));
        sh(&format!(
            "ceph-osd -c {d}/ceph.conf -i 0 --mkfs --osd-uuid {uuid} >/dev/null 2>&1"
        ));
        ceph.daemon("ceph-osd", "0");
        ceph.cli("osd pool create cephfs_metadata 8");
        ceph.cli("osd pool create cephfs_data 8");
        ceph.cli("fs new cephfs cephfs_metadata cephfs_data");
        ceph.daemon("ceph-mds", "a");
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let stat = ceph.cli("mds stat");
            if stat.contains("up:active") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the MDS never became active: {stat}"
            );
            std::thread::sleep(Duration::from_secs(2));
        }
        ceph
    }

    /// Starts a daemon in the foreground (its log under the cluster's directory).
    fn daemon(&mut self, program: &str, id: &str) {
        let child = Command::new(program)
            .args(["-f", "-c"])
            .arg(&self.conf)
            .args(["-i", id])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("Ceph is installed (scripts/vm-test installs it)");
        self.daemons.push(child);
    }

    /// Runs the `ceph` command line as client.admin; its output.
    fn cli(&self, args: &str) -> String {
        sh(&format!(
            "timeout 300 ceph -c {} --connect-timeout 120 {args}",
            self.conf.display()
        ))
    }

    /// client.admin's secret, as the kernel client's `secret=` takes it.
    fn admin_key(&self) -> String {
        self.cli("auth get-key client.admin").trim().to_string()
    }

    /// Mounts the file system's root on `at` with the kernel's CephFS client,
    /// `nosuid,nodev` as DEPLOY.md has every mount of a share.
    fn mount(&self, at: &Path) -> Unmount {
        sh("modprobe ceph");
        sh(&format!(
            "mount -i -t ceph 127.0.0.1:{}:/ {} -o nosuid,nodev,name=admin,secret={}",
            self.port,
            at.display(),
            self.admin_key()
        ));
        Unmount(at.to_path_buf())
    }
}

impl Drop for Ceph {
    fn drop(&mut self) {
        for d in self.daemons.iter_mut().rev() {
            let _ = d.kill();
            let _ = d.wait();
        }
    }
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
    let ceph = Ceph::start(&root.join("ceph"));
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
    c.node
        .node_unpublish_volume(unpublish_req("vol", &target))
        .await
        .unwrap();

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
    const MIB: u64 = 1 << 20;
    let staging = f.subdir("staging-small");
    let small = root.join("small");
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
    let _small = Unmount(small.clone());
    assert_eq!(quota("small"), (8 * MIB).to_string());
    let df_total = |p: &Path| {
        let s = rustix::fs::statvfs(p).unwrap();
        s.f_blocks * s.f_frsize
    };
    assert_eq!(df_total(&small), 8 * MIB, "df in the view shows the quota");
    // A write past it fails with EDQUOT (the client learns the directory's size from
    // the MDS as it goes, so a little more than the quota may pass first).
    let ran = run_as(
        1000,
        1000,
        &[G],
        &format!(
            "dd if=/dev/zero of={}/big bs=1M count=64 conv=fsync status=none",
            small.display()
        ),
    );
    assert!(
        !ran.ok && ran.stderr.contains("Disk quota exceeded"),
        "{ran:?}"
    );
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
