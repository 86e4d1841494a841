//! The users' shares, served for real on the machine's loopback and mounted with the
//! kernel's own clients as the driver's share: Samba configured as Azure Files serves
//! (no unix extensions, no extended attributes, no DOS attributes), mounted with the
//! CIFS client as docs/DEPLOY.md shows; and knfsd exporting NFS 4.2 with root_squash.
//! They need the cifs, nfs and nfsd modules, which the development machine's kernel
//! lacks: the VM tier runs them (`scripts/vm-test 6.12 --systemd shares --ignored`),
//! and scripts/vm-test installs Samba and nfs-kernel-server.

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

/// A free TCP port of 127.0.0.1: each test's Samba has its own (not 445, which a
/// Samba the machine runs may hold), since tests run in parallel.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until something listens on `port` of 127.0.0.1.
fn wait_listening(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{what} never listened on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A Samba server of the test's own (its configuration, state and password database
/// under `dir`), serving `served` as the share `vol` to the user root (password
/// `pw`).
struct Samba {
    child: Child,
    port: u16,
}

/// How Azure Files behaves, as Samba can be told to: no unix extensions (no owners,
/// modes or symlinks of the client's), no extended attributes, no DOS attributes.
const AZURE_FILES: &str = "  unix extensions = no
  ea support = no
  store dos attributes = no
  map archive = no
";

impl Samba {
    /// [`Samba::start_with`] configured as Azure Files.
    fn start(dir: &Path, served: &Path) -> Samba {
        Samba::start_with(dir, served, AZURE_FILES)
    }

    /// A Samba server with Samba's defaults but what `global` adds.
    fn start_with(dir: &Path, served: &Path, global: &str) -> Samba {
        let port = free_port();
        for sub in ["private", "state", "lock", "cache", "pid"] {
            fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let d = dir.display();
        let conf = dir.join("smb.conf");
        fs::write(
            &conf,
            format!(
                "[global]
  server role = standalone server
  smb ports = {port}
  interfaces = lo
  bind interfaces only = yes
  disable netbios = yes
  pid directory = {d}/pid
  lock directory = {d}/lock
  state directory = {d}/state
  cache directory = {d}/cache
  private dir = {d}/private
  passdb backend = tdbsam:{d}/private/passdb.tdb
  log file = {d}/smbd.log
  load printers = no
  printcap name = /dev/null
  disable spoolss = yes
{global}[vol]
  path = {}
  read only = no
  force user = root
",
                served.display()
            ),
        )
        .unwrap();
        let mut passwd = Command::new("smbpasswd")
            .arg("-c")
            .arg(&conf)
            .args(["-a", "-s", "root"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("Samba is installed (scripts/vm-test installs it)");
        use std::io::Write;
        passwd.stdin.take().unwrap().write_all(b"pw\npw\n").unwrap();
        assert!(passwd.wait().unwrap().success(), "smbpasswd");
        let child = Command::new("smbd")
            .args(["--foreground", "--no-process-group"])
            .arg(format!("--configfile={}", conf.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_listening(port, "smbd");
        Samba { child, port }
    }
}

impl Drop for Samba {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The CIFS mount options of docs/DEPLOY.md's fstab line for the share (as Azure
/// Files' own documentation mounts it: `mfsymlinks` keeps symlinks as files, which a
/// share without unix extensions can hold).
const DEPLOY_CIFS: &str = "uid=0,gid=0,file_mode=0700,dir_mode=0700,mfsymlinks";

/// Mounts the share of `samba` on `at` with the kernel's CIFS client, SMB 3.1.1, with
/// the mount options `options`; unmounted on drop.
fn mount_cifs(samba: &Samba, at: &Path, options: &str) -> Unmount {
    let port = samba.port;
    sh("modprobe cifs");
    sh(&format!(
        "mount -t cifs //127.0.0.1/vol {} -o ip=127.0.0.1,port={port},username=root,password=pw,vers=3.1.1,{options}",
        at.display()
    ));
    Unmount(at.to_path_buf())
}

/// What a share that keeps no records gives a pod through the driver's default
/// publish, on the mount at `root/share`: a view, never a failed publish, with CIFS
/// semantics and why in the metric and the log.
async fn default_publish_on_a_share_without_records(root: &Path, staging: &Path) {
    let d = Driver::start_with_metrics_and(root, &[]);
    let mut c = d.clients().await;
    let target = root.join("target");
    c.create_stage_publish("vol", staging, &target, &G.to_string())
        .await;
    let _unmount = Unmount(target.clone());
    assert_eq!(
        mechanism(&d.metrics_addr(), &target),
        ("fuse-cifs".into(), "share-keeps-no-records".into())
    );
    assert_cifs_view_without_records(&target, G);
    // Symlinks, as the share holds them (SMB with mfsymlinks, NFS).
    let ran = run_as(
        1000,
        1000,
        &[G],
        &format!("cd {} && ln -s f l && cat l", target.display()),
    );
    assert!(ran.ok && ran.stdout == "x\n", "{ran:?}");
    assert_eq!(fs::read_link(target.join("l")).unwrap(), Path::new("f"));
    // What pods run on such a share, as a member of the group: SQLite in WAL mode
    // (its -shm file mapped shared).
    let ran = run_as(
        1000,
        1000,
        &[G],
        &format!(
            "cd {} && sqlite3 db 'pragma journal_mode=wal; create table t(x); insert into t values (1), (2); select count(*) from t;'",
            target.display()
        ),
    );
    assert!(
        ran.ok && ran.stdout == "wal\n2\n",
        "{ran:?}\n{}",
        sh("dmesg | tail -40")
    );
    // A file made read-only as git copies its templates (`description` is 0444 in
    // some installs): open with O_CREAT|O_EXCL and mode 0444, write, close.
    let ran = run_as(
        1000,
        1000,
        &[G],
        &format!(
            "cd {} && /usr/bin/python3 -c \"import os; fd = os.open('ro', os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444); os.write(fd, b'r'); os.close(fd)\" && cat ro",
            target.display()
        ),
    );
    let views = root.join("state/views");
    let logs = || {
        fs::read_dir(&views)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
            .map(|e| fs::read_to_string(e.path()).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let raw = |dir: &Path, name: &str, flags: &str| {
        run_as(
            0,
            0,
            &[],
            &format!(
                "cd {} && /usr/bin/python3 -c \"import os; fd = os.open('{name}', {flags}, 0o444); os.write(fd, b'r'); os.close(fd); print(oct(os.stat('{name}').st_mode))\"",
                dir.display()
            ),
        )
    };
    let data = root.join("share/volumes/vol");
    assert!(
        ran.ok && ran.stdout == "r",
        "{ran:?}\nthe share itself: {:?}\n{}",
        raw(&data, "raw-ro", "os.O_WRONLY | os.O_CREAT | os.O_EXCL"),
        logs()
    );
    // Kernel passthrough where it works (NFS), the view's own reads and writes on SMB,
    // where passthrough failed the two steps above.
    let fstype = sh(&format!("stat -f -c %T {}", data.display()));
    let smb = fstype.contains("smb") || fstype.contains("cifs");
    assert!(
        logs().contains(&format!("passthrough={}", !smb)),
        "{}",
        logs()
    );
    c.node
        .node_unpublish_volume(unpublish_req("vol", &target))
        .await
        .unwrap();
    c.node
        .node_unstage_volume(unstage_req("vol", staging))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the cifs module and Samba: the VM tier runs it (scripts/vm-test 6.12 --systemd shares --ignored)"]
async fn an_azure_files_like_share_serves_the_default_publish() {
    let f = Fixture::new();
    let root = f.dir.path();
    let served = f.subdir("served");
    let samba = Samba::start(&root.join("samba"), &served);
    let share = f.subdir("share");
    let _share = mount_cifs(&samba, &share, DEPLOY_CIFS);
    let refused = Command::new("setfattr")
        .args(["-n", "user.x", "-v", "1"])
        .arg(&share)
        .output()
        .unwrap();
    assert!(
        !refused.status.success(),
        "the share keeps no extended attributes"
    );
    default_publish_on_a_share_without_records(root, &f.subdir("staging")).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the cifs module and Samba: the VM tier runs it (scripts/vm-test 6.12 --systemd shares --ignored)"]
async fn a_share_with_sambas_defaults_serves_the_default_publish() {
    let f = Fixture::new();
    let root = f.dir.path();
    let served = f.subdir("served");
    // Samba's defaults: extended attributes (user.* only, through SMB), DOS attributes
    // stored in them; SMB3 has no unix extensions without Samba's POSIX extensions.
    let samba = Samba::start_with(&root.join("samba"), &served, "");
    let share = f.subdir("share");
    let _share = mount_cifs(&samba, &share, DEPLOY_CIFS);
    default_publish_on_a_share_without_records(root, &f.subdir("staging")).await;
}

/// knfsd exporting `export` to 127.0.0.1 (NFS 4 only) with `options`, started as far
/// as this machine does not run it already; what the test started is stopped on drop.
struct Knfsd {
    export: PathBuf,
    mountd: Option<Child>,
    started_nfsd: bool,
    var_lib_nfs: Option<Unmount>,
}

impl Knfsd {
    fn start(export: &Path, options: &str) -> Knfsd {
        sh("modprobe nfsd");
        if !Path::new("/proc/fs/nfsd/threads").exists() {
            sh("mount -t nfsd nfsd /proc/fs/nfsd");
        }
        // exportfs and mountd keep the export table in /var/lib/nfs: a tmpfs of the
        // test's own there, so that nothing of it reaches the machine's root (the VM's
        // is this machine's).
        sh("mount -t tmpfs tmpfs /var/lib/nfs");
        let var_lib_nfs = Some(Unmount(PathBuf::from("/var/lib/nfs")));
        for table in ["etab", "rmtab"] {
            fs::write(Path::new("/var/lib/nfs").join(table), "").unwrap();
        }
        fs::create_dir("/var/lib/nfs/v4recovery").unwrap();
        let mountd = if Command::new("pgrep")
            .args(["-x", "rpc.mountd"])
            .status()
            .unwrap()
            .success()
        {
            None
        } else {
            Some(
                Command::new("rpc.mountd")
                    .args(["--foreground", "--no-nfs-version", "3"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("nfs-kernel-server is installed (scripts/vm-test installs it)"),
            )
        };
        let threads = fs::read_to_string("/proc/fs/nfsd/threads").unwrap_or_default();
        let started_nfsd = threads.trim() == "0" || threads.trim().is_empty();
        if started_nfsd {
            sh("rpc.nfsd --no-nfs-version 3 --no-udp 4");
        }
        sh(&format!(
            "exportfs -i -o {options} 127.0.0.1:{}",
            export.display()
        ));
        wait_listening(2049, "nfsd");
        Knfsd {
            export: export.to_path_buf(),
            mountd,
            started_nfsd,
            var_lib_nfs,
        }
    }
}

impl Drop for Knfsd {
    fn drop(&mut self) {
        let _ = Command::new("exportfs")
            .arg("-u")
            .arg(format!("127.0.0.1:{}", self.export.display()))
            .status();
        if self.started_nfsd {
            let _ = Command::new("rpc.nfsd").arg("0").status();
        }
        if let Some(m) = &mut self.mountd {
            let _ = m.kill();
            let _ = m.wait();
        }
        self.var_lib_nfs.take();
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the nfs and nfsd modules and knfsd: the VM tier runs it (scripts/vm-test 6.12 --systemd shares --ignored)"]
async fn a_root_squashed_nfs_export_serves_the_default_publish() {
    let f = Fixture::new();
    let root = f.dir.path();
    let export = f.subdir("export");
    // Root is squashed to nobody: the export is nobody's, so that the driver (root,
    // squashed) can lay the share out in it.
    chown(&export, 65534, 65534);
    let _knfsd = Knfsd::start(&export, "rw,root_squash,no_subtree_check,fsid=4242");
    let share = f.subdir("share");
    sh(&format!(
        "mount -t nfs4 -o vers=4.2 127.0.0.1:{} {}",
        export.display(),
        share.display()
    ));
    let _share = Unmount(share.clone());
    // Root is squashed: what the driver makes is nobody's on the server.
    fs::write(share.join("probe"), "").unwrap();
    assert_eq!(owner(&export.join("probe")).0, 65534);
    fs::remove_file(share.join("probe")).unwrap();
    default_publish_on_a_share_without_records(root, &f.subdir("staging")).await;
}

/// Waits until `check` holds, for at most `limit` (a view's attribute and entry
/// timeouts: what another node's change takes to show).
fn eventually(limit: Duration, what: &str, check: impl Fn() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < limit, "{what}, after {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("{what}: after {:?}", start.elapsed());
}

/// The volumes a driver's controller lists.
async fn listed(c: &mut Clients) -> Vec<String> {
    c.controller
        .list_volumes(mountgroup::csi::pb::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
        .iter()
        .map(|e| e.volume.as_ref().unwrap().volume_id.clone())
        .collect()
}

/// Two nodes, one share: two node plugins, each with its own CIFS mount of the Samba
/// share (its own connection: `nosharesock`) and its own state, publish one volume
/// (ReadWriteMany) to pods with two fsGroups. What one pod makes, renames or deletes
/// shows through the other within the views' timeouts; chown and chmod mean the same
/// on both (no effect: nothing is recorded); the controller of one and the node plugin
/// of the other agree on the volume and on its deletion.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the cifs module and Samba: the VM tier runs it (scripts/vm-test 6.12 --systemd shares --ignored)"]
async fn two_nodes_publish_one_volume_of_an_azure_files_like_share() {
    use mountgroup::csi::pb::volume_capability::access_mode::Mode;
    let f = Fixture::new();
    let root = f.dir.path();
    let served = f.subdir("served");
    let samba = Samba::start(&root.join("samba"), &served);
    let node = |name: &str| {
        let dir = f.subdir(name);
        fs::create_dir(dir.join("share")).unwrap();
        let mounted = mount_cifs(
            &samba,
            &dir.join("share"),
            &format!("{DEPLOY_CIFS},nosharesock"),
        );
        (dir, mounted)
    };
    let ((a, _a_share), (b, _b_share)) = (node("node-a"), node("node-b"));
    let (da, db) = (
        Driver::start_with_metrics_and(&a, &[]),
        Driver::start_with_metrics_and(&b, &[]),
    );
    let (mut ca, mut cb) = (da.clients().await, db.clients().await);
    ca.controller
        .create_volume(create_req("vol", 1 << 30))
        .await
        .unwrap();
    assert!(listed(&mut cb).await.contains(&"vol".to_string()));
    let (ta, tb) = (a.join("target"), b.join("target"));
    let (sa, sb) = (a.join("staging"), b.join("staging"));
    for (c, staging, target, group) in [(&mut ca, &sa, &ta, "4242"), (&mut cb, &sb, &tb, "5151")] {
        fs::create_dir_all(staging).unwrap();
        c.node
            .node_stage_volume(stage_req("vol", staging))
            .await
            .unwrap();
        let mut publish = publish_req("vol", staging, target, group);
        publish.volume_capability = Some(mount_cap(&[], group, Mode::MultiNodeMultiWriter));
        c.node.node_publish_volume(publish).await.unwrap();
    }
    let (_ua, _ub) = (Unmount(ta.clone()), Unmount(tb.clone()));
    // The views' attribute and entry timeouts (1 s) over the CIFS client's (actimeo,
    // 1 s), and a lease break between the two clients: a few seconds, bounded well
    // above that so that a slow emulated machine does not fail it.
    let limit = Duration::from_secs(15);
    // A's pod writes; B's pod reads it, with its own group.
    let ran = run_as(1000, 1000, &[4242], &format!("echo a > {}/f", ta.display()));
    assert!(ran.ok, "{ran:?}");
    eventually(limit, "B sees A's file", || {
        let ran = run_as(2000, 2000, &[5151], &format!("cat {}/f", tb.display()));
        ran.ok && ran.stdout == "a\n"
    });
    assert_eq!(owner(&ta.join("f")), (0, 4242, 0o664));
    assert_eq!(owner(&tb.join("f")), (0, 5151, 0o664));
    // B's pod appends, renames and makes a directory; A sees each.
    let ran = run_as(
        2000,
        2000,
        &[5151],
        &format!("cd {} && echo b >> f && mv f g && mkdir d", tb.display()),
    );
    assert!(ran.ok, "{ran:?}");
    eventually(limit, "A sees B's directory", || ta.join("d").is_dir());
    eventually(limit, "A sees B's rename", || {
        !ta.join("f").exists() && ta.join("g").exists()
    });
    let seen = || fs::read_to_string(ta.join("g")).unwrap_or_else(|e| e.to_string());
    eventually(
        limit,
        &format!("A sees B's append (A reads {:?})", seen()),
        || seen() == "a\nb\n",
    );
    // A chmod and chown on A change nothing, on either node.
    let ran = run_as(
        0,
        0,
        &[],
        &format!("chmod 600 {0}/g && chown 7 {0}/g", ta.display()),
    );
    assert!(ran.ok, "{ran:?}");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(owner(&ta.join("g")), (0, 4242, 0o664));
    assert_eq!(owner(&tb.join("g")), (0, 5151, 0o664));
    // B's pod deletes; A sees it gone.
    let ran = run_as(2000, 2000, &[5151], &format!("rm {}/g", tb.display()));
    assert!(ran.ok, "{ran:?}");
    eventually(limit, "A sees B's delete", || !ta.join("g").exists());
    // Unpublished on both, deleted by B's controller: gone for A's too.
    for (c, staging, target) in [(&mut ca, &sa, &ta), (&mut cb, &sb, &tb)] {
        c.node
            .node_unpublish_volume(unpublish_req("vol", target))
            .await
            .unwrap();
        c.node
            .node_unstage_volume(unstage_req("vol", staging))
            .await
            .unwrap();
    }
    cb.controller
        .delete_volume(mountgroup::csi::pb::DeleteVolumeRequest {
            volume_id: "vol".into(),
            secrets: Default::default(),
        })
        .await
        .unwrap();
    assert!(!listed(&mut ca).await.contains(&"vol".to_string()));
}
