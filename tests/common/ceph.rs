//! A Ceph cluster of one node for the tests that run on CephFS (tests/ceph.rs,
//! tests/ceph_bench.rs): a monitor, a manager, an OSD on memstore and an MDS on the
//! machine's loopback, of one of two releases. Included with `#[path]`, beside
//! `common`.
#![allow(dead_code)]

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::common::*;

/// Where scripts/vm-test makes a Debian forky root with its Ceph (20.2), unless
/// `MOUNTGROUP_NEWER_CEPH_ROOT` names another.
pub const NEWER_ROOT: &str = "/var/lib/mountgroup-vm/ceph-forky";

/// Which Ceph's daemons and command line a cluster runs.
#[derive(Clone, Debug)]
pub enum Release {
    /// This machine's own (Debian 12: 16.2, Pacific).
    Installed,
    /// The one installed in a root of its own: each program runs chrooted there, in
    /// a mount namespace of its own in which the cluster's directory is at
    /// [`Release::INSIDE`] (the root is read-only in the VM).
    Rooted(PathBuf),
}

impl Release {
    const INSIDE: &str = "/mnt";

    pub fn newer() -> Release {
        let root = PathBuf::from(
            std::env::var_os("MOUNTGROUP_NEWER_CEPH_ROOT").unwrap_or_else(|| NEWER_ROOT.into()),
        );
        assert!(
            root.join("usr/bin/ceph-mds").exists(),
            "no Ceph root at {} (scripts/vm-test makes it when asked to run tests/ceph.rs)",
            root.display()
        );
        Release::Rooted(root)
    }

    /// `program` of this release, with the cluster in `dir`.
    fn command(&self, dir: &Path, program: &str) -> Command {
        match self {
            Release::Installed => Command::new(program),
            Release::Rooted(root) => {
                let mut cmd = Command::new("unshare");
                cmd.args(["--mount", "--propagation", "private", "sh", "-ec"])
                    .arg(
                        "r=$1 d=$2; shift 2; \
                         mount --bind \"$d\" \"$r/mnt\"; \
                         mount -t proc proc \"$r/proc\"; \
                         mount --rbind /dev \"$r/dev\"; \
                         mount -t tmpfs tmpfs \"$r/tmp\"; \
                         exec chroot \"$r\" \"$@\"",
                    )
                    .arg("sh")
                    .arg(root)
                    .arg(dir)
                    .arg(program);
                cmd
            }
        }
    }

    /// Where programs of this release find the cluster's directory `dir`.
    fn seen(&self, dir: &Path) -> PathBuf {
        match self {
            Release::Installed => dir.to_path_buf(),
            Release::Rooted(_) => PathBuf::from(Self::INSIDE),
        }
    }
}

/// A Ceph cluster of one node, its configuration, keys, data and logs under `dir`.
pub struct Ceph {
    pub release: Release,
    pub dir: PathBuf,
    pub port: u16,
    /// Each daemon's program and process, in the order they started.
    daemons: Vec<(&'static str, Child)>,
}

impl Ceph {
    pub fn start(dir: &Path, release: Release) -> Ceph {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        for sub in ["run", "log", "mon-a", "osd-0", "mds-a", "mgr-x"] {
            fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let mut ceph = Ceph {
            release,
            dir: dir.to_path_buf(),
            port,
            daemons: Vec::new(),
        };
        let d = ceph.release.seen(dir);
        let d = d.display();
        let fsid = fs::read_to_string("/proc/sys/kernel/random/uuid").unwrap();
        let fsid = fsid.trim();
        fs::write(
            dir.join("ceph.conf"),
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
        let keyring = format!("{d}/keyring");
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
            let mut args = Vec::new();
            if i == 0 {
                args.push("--create-keyring".to_string());
            }
            args.extend([
                keyring.clone(),
                "--gen-key".into(),
                "-n".into(),
                name.into(),
            ]);
            for (what, cap) in caps {
                args.extend(["--cap".into(), what.to_string(), cap.to_string()]);
            }
            if name == "client.admin" && matches!(ceph.release, Release::Rooted(_)) {
                // Ceph 20 makes AES-256 keys unless told; the kernel's client (Linux
                // 6.12) takes AES-128 only ("libceph: secret too big 32").
                args.extend(["--key-type".into(), "aes".into()]);
            }
            ceph.run("ceph-authtool", &args);
        }
        // Ceph 20's monitors take only the ciphers the monitor map allows, AES-256
        // unless told; the kernel's client has an AES-128 key (below).
        let ciphers: &[String] = match ceph.release {
            Release::Rooted(_) => &["--auth-allowed-ciphers".into(), "aes,aes256k".into()],
            Release::Installed => &[],
        };
        ceph.run(
            "monmaptool",
            &[
                ciphers,
                &[
                    "--create".into(),
                    "--addv".into(),
                    "a".into(),
                    format!("[v1:127.0.0.1:{port}]"),
                    "--fsid".into(),
                    fsid.into(),
                    format!("{d}/monmap"),
                ],
            ]
            .concat(),
        );
        ceph.run(
            "ceph-mon",
            &[
                "-c".into(),
                format!("{d}/ceph.conf"),
                "--mkfs".into(),
                "-i".into(),
                "a".into(),
                "--monmap".into(),
                format!("{d}/monmap"),
                "--keyring".into(),
                keyring,
            ],
        );
        ceph.daemon("ceph-mon", "a");
        ceph.cli("mon stat");
        ceph.daemon("ceph-mgr", "x");
        let uuid = fs::read_to_string("/proc/sys/kernel/random/uuid").unwrap();
        let uuid = uuid.trim();
        ceph.cli(&format!("osd new {uuid} 0"));
        ceph.run(
            "ceph-osd",
            &[
                "-c".into(),
                format!("{d}/ceph.conf"),
                "-i".into(),
                "0".into(),
                "--mkfs".into(),
                "--osd-uuid".into(),
                uuid.into(),
            ],
        );
        ceph.daemon("ceph-osd", "0");
        ceph.cli("osd pool create cephfs_metadata 8");
        ceph.cli("osd pool create cephfs_data 8");
        ceph.cli("fs new cephfs cephfs_metadata cephfs_data");
        ceph.daemon("ceph-mds", "a");
        ceph.wait_mds_active(0);
        let version = ceph.cli("version");
        // On the test program's stderr as it happens, not captured with the test's.
        let _ = writeln!(std::io::stderr().lock(), "Ceph up: {}", version.trim());
        ceph
    }

    /// The file system map's epoch, which every change of an MDS's state moves on.
    fn fs_epoch(&self) -> u64 {
        let dump: serde_json::Value =
            serde_json::from_str(&self.cli("fs dump --format json")).unwrap();
        dump["epoch"].as_u64().unwrap()
    }

    /// Waits until the file system's MDS is active in a map of an epoch past `after`.
    fn wait_mds_active(&self, after: u64) {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let stat = self.cli("mds stat");
            if stat.contains("up:active") && self.fs_epoch() > after {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the MDS never became active: {stat}"
            );
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// Kills the MDS (as a crash or an upgrade's restart would) and starts it again:
    /// returns once the monitors have it active again, after it replayed its journal
    /// and its clients reconnected.
    pub fn restart_mds(&mut self) {
        let before = self.fs_epoch();
        let i = self
            .daemons
            .iter()
            .position(|(program, _)| *program == "ceph-mds")
            .expect("an MDS runs");
        let (_, mut mds) = self.daemons.remove(i);
        let _ = mds.kill();
        let _ = mds.wait();
        self.daemon("ceph-mds", "a");
        self.wait_mds_active(before);
    }

    /// Runs `program` of the cluster's release to its end; its output.
    pub fn run(&self, program: &str, args: &[String]) -> String {
        let out = self
            .release
            .command(&self.dir, program)
            .args(args)
            .output()
            .expect("Ceph is installed (scripts/vm-test installs it)");
        assert!(out.status.success(), "{program} {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Starts a daemon in the foreground (its log under the cluster's directory).
    fn daemon(&mut self, program: &'static str, id: &str) {
        let conf = self.release.seen(&self.dir).join("ceph.conf");
        let child = self
            .release
            .command(&self.dir, program)
            .args(["-f", "-c"])
            .arg(conf)
            .args(["-i", id])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("Ceph is installed (scripts/vm-test installs it)");
        self.daemons.push((program, child));
    }

    /// Runs the `ceph` command line as client.admin; its output.
    pub fn cli(&self, args: &str) -> String {
        let conf = self.release.seen(&self.dir).join("ceph.conf");
        let mut all = vec![
            "300".to_string(),
            "ceph".into(),
            "-c".into(),
            conf.to_string_lossy().into_owned(),
            "--connect-timeout".into(),
            "120".into(),
        ];
        all.extend(args.split_whitespace().map(str::to_string));
        self.run("timeout", &all)
    }

    /// client.admin's secret, as the kernel client's `secret=` takes it.
    pub fn admin_key(&self) -> String {
        self.cli("auth get-key client.admin").trim().to_string()
    }

    /// Mounts the file system's root on `at` with the kernel's CephFS client,
    /// `nosuid,nodev` as DEPLOY.md has every mount of a share, and `more` options.
    pub fn mount_with(&self, at: &Path, more: &str) -> Unmount {
        sh("modprobe ceph");
        let out = Command::new("mount")
            .args(["-i", "-t", "ceph"])
            .arg(format!("127.0.0.1:{}:/", self.port))
            .arg(at)
            .arg("-o")
            .arg(format!(
                "nosuid,nodev,name=admin,secret={}{more}",
                self.admin_key()
            ))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mount of CephFS on {}: {out:?}\n{}",
            at.display(),
            sh("dmesg | grep -i ceph | tail -20")
        );
        Unmount(at.to_path_buf())
    }

    pub fn mount(&self, at: &Path) -> Unmount {
        self.mount_with(at, "")
    }
}

impl Drop for Ceph {
    fn drop(&mut self) {
        // Each is the daemon itself: `unshare`, `sh` and `chroot` exec it.
        for (_, d) in self.daemons.iter_mut().rev() {
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}
