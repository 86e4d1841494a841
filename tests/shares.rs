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
#[path = "common/nodes.rs"]
mod nodes;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use driver::*;
use nodes::*;

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
    conf: PathBuf,
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
        let child = Samba::smbd(&conf);
        wait_listening(port, "smbd");
        Samba { child, port, conf }
    }

    fn smbd(conf: &Path) -> Child {
        Command::new("smbd")
            .args(["--foreground", "--no-process-group"])
            .arg(format!("--configfile={}", conf.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    /// Kills the server, every process of it (each connection has its own), as a
    /// crash or a node's restart would.
    fn crash(&mut self) {
        let _ = Command::new("pkill")
            .args(["-KILL", "-f"])
            .arg(format!("configfile={}", self.conf.display()))
            .status();
        let _ = self.child.wait();
    }

    /// Starts the server again on its port, with its configuration and state.
    fn restart(&mut self) {
        self.child = Samba::smbd(&self.conf);
        wait_listening(self.port, "smbd");
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

/// The NFS client's options as docs/DEPLOY.md's fstab line has them: NFS 4.2, whose
/// `user.*` extended attributes keep the views' records, and an attribute cache of
/// a second, which bounds how soon one node's chmod shows on another.
const DEPLOY_NFS: &str = "vers=4.2,actimeo=1";

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

/// What a share keeps of a view's records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kept {
    /// Nothing: no extended attributes (Azure Files).
    Nothing,
    /// `user.*` extended attributes, no `trusted.*` (NFS 4.2, Samba's defaults).
    UserXattrs,
}

/// What a share gives a pod through the driver's default publish, on the mount at
/// `root/share`: a view, never a failed publish, with the semantics the share can
/// hold and why in the metric and the log. Where it keeps `user.*` attributes, a pod
/// sees its own uid on what it makes, and its chmod holds: git and PostgreSQL run as
/// the pod's user. Where it keeps none, CIFS semantics without records.
async fn default_publish_on_a_share(root: &Path, staging: &Path, kept: Kept) {
    let (d, mut c, target, _unmount) = default_publish(root, staging, G).await;
    match kept {
        Kept::Nothing => {
            assert_eq!(
                mechanism(&d.metrics_addr(), &target),
                ("fuse-cifs".into(), "share-keeps-no-records".into())
            );
            assert_cifs_view_without_records(&target, G);
        }
        Kept::UserXattrs => {
            assert_eq!(
                mechanism(&d.metrics_addr(), &target),
                ("fuse-user-xattr".into(), "share-keeps-user-records".into())
            );
            assert_user_records_view(root, &target);
        }
    }
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
    if kept == Kept::UserXattrs {
        // The records are on the share, in user.mountgroup.owner; the owner on disk
        // is the daemon's (nobody, where the server squashes root).
        let on_disk = sh(&format!("getfattr -d -m - {}/f", data.display()));
        assert!(on_disk.contains("user.mountgroup.owner"), "{on_disk}");
    }
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
    default_publish_on_a_share(root, &f.subdir("staging"), Kept::Nothing).await;
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
    default_publish_on_a_share(root, &f.subdir("staging"), Kept::UserXattrs).await;
}

/// What a view that keeps its records in `user.*` attributes gives pods at `target`:
/// their own uid on what they make, chmod and chown that hold (and that the kernel
/// enforces), git and PostgreSQL as the pod's user.
fn assert_user_records_view(root: &Path, target: &Path) {
    let ran = run_as(
        1000,
        1000,
        &[G],
        &format!(
            "cd {} && echo x > f && mkdir d && echo y > d/g && chmod 600 f && chmod 750 d && cat d/g",
            target.display()
        ),
    );
    assert!(ran.ok && ran.stdout == "y\n", "{ran:?}");
    assert_eq!(owner(&target.join("f")), (1000, G, 0o600));
    let (uid, gid, perm) = owner(&target.join("d"));
    assert_eq!((uid, gid, perm & 0o777), (1000, G, 0o750));
    // The chmod holds: another member of the group is kept out of `f`.
    let ran = run_as(2001, 2001, &[G], &format!("cat {}/f", target.display()));
    assert!(
        !ran.ok && ran.stderr.contains("Permission denied"),
        "{ran:?}"
    );
    // Root's chown holds too; another user's is refused.
    let ran = run_as(
        2001,
        2001,
        &[G],
        &format!("chmod 666 {}/d/g", target.display()),
    );
    assert!(!ran.ok && ran.stderr.contains("not permitted"), "{ran:?}");
    sh(&format!("chown 2001 {}/d/g", target.display()));
    assert_eq!(owner(&target.join("d/g")).0, 2001);
    // git as the pod's user: its templates, its 0444 objects, its chmods.
    let ran = run_as(
        1000,
        1000,
        &[G],
        &format!(
            "cd {} && export HOME=$PWD GIT_CONFIG_NOSYSTEM=1 && git init -q repo && cd repo && echo z > z && git add z && git -c user.email=p@o.d -c user.name=pod commit -qm one && git log --format=%s",
            target.display()
        ),
    );
    assert!(ran.ok && ran.stdout == "one\n", "{ran:?}");
    // PostgreSQL as its own user, a member of the pod's group: initdb makes its data
    // directory 0700, and the server starts only if it is its owner's and 0700.
    let (pg_uid, pg_gid) = postgres_user();
    let made = run_as(
        pg_uid,
        pg_gid,
        &[G],
        &format!(
            "{} -D {}/pg -A trust -U postgres >/dev/null",
            postgres_bin("initdb").display(),
            target.display()
        ),
    );
    assert!(made.ok, "{made:?}");
    // 0700, with the setgid bit of a directory made in the volume, which PostgreSQL
    // does not mind.
    let (uid, gid, perm) = owner(&target.join("pg"));
    assert_eq!((uid, gid, perm & 0o777), (pg_uid, G, 0o700));
    let sockets = root.join("pg-sockets");
    fs::create_dir(&sockets).unwrap();
    fs::set_permissions(
        &sockets,
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .unwrap();
    postgres_runs(&target.join("pg"), &sockets, &[G]).expect("PostgreSQL on the share");
}

/// The share's server crashes and comes back: the view does not die with it, its calls
/// fail or wait while the server is away (as the share's own mount answers them),
/// and it serves again, the same mount and the same process, once the server is back.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the cifs module and Samba: the VM tier runs it (scripts/vm-test 6.12 --systemd shares --ignored)"]
async fn a_view_outlives_its_share_servers_crash() {
    let f = Fixture::new();
    let root = f.dir.path();
    let served = f.subdir("served");
    let mut samba = Samba::start(&root.join("samba"), &served);
    let share = f.subdir("share");
    let _share = mount_cifs(&samba, &share, DEPLOY_CIFS);
    let (_d, mut c, target, _unmount) = default_publish(root, &f.subdir("staging"), G).await;
    let member = |script: &str| {
        run_as(
            1000,
            1000,
            &[G],
            &format!("cd {} && {script}", target.display()),
        )
    };
    let ran = member("echo before > f && exec 3<f && cat f");
    assert!(ran.ok && ran.stdout == "before\n", "{ran:?}");
    // The view's mount, by its id: the same one must serve after the crash.
    let mount_id = || {
        fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .find(|l| l.split(' ').nth(4) == target.to_str())
            .and_then(|l| l.split(' ').next().map(str::to_string))
    };
    let before = mount_id();
    assert!(before.is_some());
    samba.crash();
    // While the server is away: whatever the CIFS client answers, in bounded time
    // (a soft mount's error, or the call waits for the reconnection); the view lives.
    let away = member("timeout -s KILL 120 cat f; echo $?");
    eprintln!("while the server was away: {away:?}");
    use mountgroup::sys::mount::{Health, health};
    assert_eq!(
        health(&target),
        Health::Mounted("fuse.mountgroup".into()),
        "{away:?}"
    );
    samba.restart();
    // Back: the same view serves what was there and takes new writes, once the CIFS
    // client has reconnected (its echo interval bounds that).
    eventually(Duration::from_secs(180), "the view serves again", || {
        let ran = member("cat f && echo after >> f && cat f");
        ran.ok && ran.stdout.ends_with("before\nafter\n")
    });
    assert_eq!(mount_id(), before);
    assert_eq!(
        fs::read_to_string(served.join("volumes/vol/f"))
            .unwrap()
            .lines()
            .next(),
        Some("before")
    );
    c.node
        .node_unpublish_volume(unpublish_req("vol", &target))
        .await
        .unwrap();
}

/// knfsd exporting `export` to 127.0.0.1 (NFS 4 only) with `options`, started as far
/// as this machine does not run it already; what the test started is stopped on drop.
struct Knfsd {
    export: PathBuf,
    mountd: Option<Child>,
    started_nfsd: bool,
    var_lib_nfs: Option<Unmount>,
    /// One knfsd at a time: the machine has one export table and one /var/lib/nfs.
    _one: std::sync::MutexGuard<'static, ()>,
}

static KNFSD: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Knfsd {
    fn start(export: &Path, options: &str) -> Knfsd {
        let one = KNFSD.lock().unwrap_or_else(|e| e.into_inner());
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
        // A mountd of the test's own, for this test's table: a mountd
        // that ran before (the machine's, or the last test's) keeps answering with
        // the exports it read then, and the kernel then finds this test's export
        // missing ("No such file or directory"). One the machine runs is stopped.
        let _ = Command::new("pkill").args(["-x", "rpc.mountd"]).status();
        let gone = Instant::now() + Duration::from_secs(30);
        while Command::new("pgrep")
            .args(["-x", "rpc.mountd"])
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success()
        {
            assert!(Instant::now() < gone, "rpc.mountd does not stop");
            std::thread::sleep(Duration::from_millis(100));
        }
        let mountd = Some(
            Command::new("rpc.mountd")
                .args(["--foreground", "--no-nfs-version", "3"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("nfs-kernel-server is installed (scripts/vm-test installs it)"),
        );
        let threads = fs::read_to_string("/proc/fs/nfsd/threads").unwrap_or_default();
        let started_nfsd = threads.trim() == "0" || threads.trim().is_empty();
        // Started (again, where the machine runs it already) with the shortest grace
        // period knfsd takes: in its grace period (90 s by default, from its start)
        // it answers every create "try later", and a driver laying its share out
        // waits that long.
        sh(
            "rpc.nfsd 0 && echo 10 > /proc/fs/nfsd/nfsv4gracetime && echo 10 > /proc/fs/nfsd/nfsv4leasetime && rpc.nfsd --no-nfs-version 3 --no-udp 4",
        );
        sh(&format!(
            "exportfs -i -o {options} 127.0.0.1:{}",
            export.display()
        ));
        sh("exportfs -f");
        wait_listening(2049, "nfsd");
        Knfsd {
            export: export.to_path_buf(),
            mountd,
            started_nfsd,
            var_lib_nfs,
            _one: one,
        }
    }
}

/// The kernel's file leases, which knfsd's delegations are, off until dropped.
struct Leases(String);

impl Leases {
    fn off() -> Leases {
        let was = fs::read_to_string("/proc/sys/fs/leases-enable").unwrap();
        fs::write("/proc/sys/fs/leases-enable", "0").unwrap();
        Leases(was)
    }
}

impl Drop for Leases {
    fn drop(&mut self) {
        let _ = fs::write("/proc/sys/fs/leases-enable", self.0.trim());
    }
}

/// Mounts `export` of this machine's knfsd on `at` as DEPLOY.md does, with `more`
/// options. Tried again for a while: a mountd just started answers the kernel's first
/// questions about the exports late, and the server then answers a mount `ENOENT`.
fn mount_nfs(export: &Path, at: &Path, more: &str) -> Unmount {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let out = Command::new("mount")
            .args(["-t", "nfs4", "-o", &format!("{DEPLOY_NFS}{more}")])
            .arg(format!("127.0.0.1:{}", export.display()))
            .arg(at)
            .output()
            .unwrap();
        if out.status.success() {
            return Unmount(at.to_path_buf());
        }
        if Instant::now() > deadline {
            let seen = Command::new("sh")
                .args(["-c", "exportfs -v; cat /var/lib/nfs/etab; pgrep -a rpc.mountd; cat /proc/fs/nfsd/threads; cat /proc/net/rpc/nfsd.export/content /proc/net/rpc/nfsd.fh/content"])
                .output()
                .unwrap();
            panic!(
                "mounting {}: {}\nthe server: {}{}",
                export.display(),
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&seen.stdout),
                String::from_utf8_lossy(&seen.stderr)
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

impl Drop for Knfsd {
    fn drop(&mut self) {
        let _ = Command::new("exportfs")
            .arg("-u")
            .arg(format!("127.0.0.1:{}", self.export.display()))
            .status();
        let _ = Command::new("exportfs").arg("-f").status();
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
    let _share = mount_nfs(&export, &share, "");
    // Root is squashed: what the driver makes is nobody's on the server.
    fs::write(share.join("probe"), "").unwrap();
    assert_eq!(owner(&export.join("probe")).0, 65534);
    fs::remove_file(share.join("probe")).unwrap();
    default_publish_on_a_share(root, &f.subdir("staging"), Kept::UserXattrs).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the cifs module and Samba: the VM tier runs it (scripts/vm-test 6.12 --systemd shares --ignored)"]
async fn two_nodes_publish_one_volume_of_an_azure_files_like_share() {
    let f = Fixture::new();
    let served = f.subdir("served");
    let samba = Samba::start(&f.dir.path().join("samba"), &served);
    let mount = |at: &Path| mount_cifs(&samba, at, &format!("{DEPLOY_CIFS},nosharesock"));
    two_nodes_publish_one_volume(&f, &mount, "fuse-cifs", Owners::NoEffect).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the nfs and nfsd modules and knfsd: the VM tier runs it (scripts/vm-test 6.12 --systemd shares --ignored)"]
async fn two_nodes_publish_one_volume_of_a_root_squashed_nfs_export() {
    let f = Fixture::new();
    let export = f.subdir("export");
    chown(&export, 65534, 65534);
    let _knfsd = Knfsd::start(&export, "rw,root_squash,no_subtree_check,fsid=4243");
    // The two nodes are one kernel here, and so one NFS client to the server: it keeps
    // the delegation its first node got for a file when the other renames it (a
    // server recalls a delegation from another client only), and a client with a
    // delegation trusts its names of the file (fs/nfs/dir.c,
    // nfs_lookup_revalidate_delegated). Two machines are two clients; without
    // delegations (leases off, for this test) this one behaves as they would.
    let _leases = Leases::off();
    // Each node its own client (nosharecache) with DEPLOY.md's attribute cache bound.
    let mount = |at: &Path| mount_nfs(&export, at, ",nosharecache");
    two_nodes_publish_one_volume(&f, &mount, "fuse-user-xattr", Owners::Held).await;
}
