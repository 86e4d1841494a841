//! Share servers of a test's own on the machine's loopback, as the users' shares are
//! served: Samba (configured as Azure Files, or with its defaults) and knfsd (NFS 4).
//! Used by tests/shares.rs and tests/shares_bench.rs, which the VM tier runs.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::common::*;

/// A free TCP port of 127.0.0.1: each test's Samba has its own (not 445, which a
/// Samba the machine runs may hold), since tests run in parallel.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until something listens on `port` of 127.0.0.1.
pub fn wait_listening(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{what} never listened on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A Samba server of the test's own (its configuration, state and password database
/// under `dir`), serving `served` as the share `vol` to the user root (password
/// `pw`).
pub struct Samba {
    pub child: Child,
    pub port: u16,
    pub conf: PathBuf,
}

/// How Azure Files behaves, as Samba can be told to: no unix extensions (no owners,
/// modes or symlinks of the client's), no extended attributes, no DOS attributes.
pub const AZURE_FILES: &str = "  unix extensions = no
  ea support = no
  store dos attributes = no
  map archive = no
";

impl Samba {
    /// The server's name in its share's UNC path: one of its own (the client is given
    /// the address apart, `ip=`, and Samba reads only the share's name), so that the
    /// client's statistics of its tree ([`smb_requests`]) are not another test's.
    pub fn host(&self) -> String {
        format!("samba-{}", self.port)
    }

    /// [`Samba::start_with`] configured as Azure Files.
    pub fn start(dir: &Path, served: &Path) -> Samba {
        Samba::start_with(dir, served, AZURE_FILES)
    }

    /// A Samba server with Samba's defaults but what `global` adds.
    pub fn start_with(dir: &Path, served: &Path, global: &str) -> Samba {
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

    /// Gives the user root the password `password` (a rotated Secret's).
    pub fn set_password(&self, password: &str) {
        let mut passwd = Command::new("smbpasswd")
            .arg("-c")
            .arg(&self.conf)
            .args(["-s", "root"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        use std::io::Write;
        passwd
            .stdin
            .take()
            .unwrap()
            .write_all(format!("{password}\n{password}\n").as_bytes())
            .unwrap();
        assert!(passwd.wait().unwrap().success(), "smbpasswd");
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
    pub fn crash(&mut self) {
        let _ = Command::new("pkill")
            .args(["-KILL", "-f"])
            .arg(format!("configfile={}", self.conf.display()))
            .status();
        let _ = self.child.wait();
    }

    /// Starts the server again on its port, with its configuration and state.
    pub fn restart(&mut self) {
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
pub const DEPLOY_CIFS: &str = "uid=0,gid=0,file_mode=0700,dir_mode=0700,mfsymlinks";

/// The NFS client's options as docs/DEPLOY.md's fstab line has them: NFS 4.2, whose
/// `user.*` extended attributes keep the views' records, and an attribute cache of
/// a second, which bounds how soon one node's chmod shows on another.
pub const DEPLOY_NFS: &str = "vers=4.2,actimeo=1";

/// A Samba server of a fixture's own, serving the fixture's `served` directory
/// ([`Samba::start_with`] with `global`), and its share mounted at the fixture's
/// `share` as docs/DEPLOY.md mounts it; unmounted, then stopped, on drop.
pub struct SambaShare {
    _mount: Unmount,
    pub samba: Samba,
    pub share: PathBuf,
    pub served: PathBuf,
}

impl SambaShare {
    pub fn start(f: &Fixture, global: &str) -> SambaShare {
        let served = f.subdir("served");
        let samba = Samba::start_with(&f.dir.path().join("samba"), &served, global);
        let share = f.subdir("share");
        SambaShare {
            _mount: mount_cifs(&samba, &share, DEPLOY_CIFS),
            samba,
            share,
            served,
        }
    }
}

/// Mounts the share of `samba` on `at` with the kernel's CIFS client, SMB 3.1.1, with
/// the mount options `options`; unmounted on drop.
pub fn mount_cifs(samba: &Samba, at: &Path, options: &str) -> Unmount {
    let port = samba.port;
    sh("modprobe cifs");
    sh(&format!(
        "mount -t cifs //{}/vol {} -o ip=127.0.0.1,port={port},username=root,password=pw,vers=3.1.1,{options}",
        samba.host(),
        at.display()
    ));
    Unmount(at.to_path_buf())
}

/// knfsd exporting `export` to 127.0.0.1 (NFS 3 and 4, over TCP) with `options`,
/// started as far as this machine does not run it already; what the test started is
/// stopped on drop.
pub struct Knfsd {
    export: PathBuf,
    mountd: Option<Child>,
    rpcbind: Option<Child>,
    statd: Option<Child>,
    started_nfsd: bool,
    var_lib_nfs: Option<Unmount>,
    /// One knfsd at a time: the machine has one export table and one /var/lib/nfs.
    _one: std::sync::MutexGuard<'static, ()>,
}

pub static KNFSD: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Knfsd {
    pub fn start(export: &Path, options: &str) -> Knfsd {
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
        // NFS 3 finds mountd through rpcbind, and knfsd registers its NFS 3 service
        // there or does not start it: one of the test's own where none listens.
        let rpcbind = if std::net::TcpStream::connect(("127.0.0.1", 111)).is_ok() {
            None
        } else {
            let child = Command::new("rpcbind")
                .arg("-f")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("rpcbind is installed (nfs-kernel-server depends on it)");
            wait_listening(111, "rpcbind");
            Some(child)
        };
        // NFS 3's locks: the client's lockd asks statd to watch the server (and
        // mount.nfs refuses a mount with locks without one). Its state in the test's
        // /var/lib/nfs.
        for sm in ["sm", "sm.bak"] {
            fs::create_dir(Path::new("/var/lib/nfs").join(sm)).unwrap();
        }
        let statd = Some(
            Command::new("rpc.statd")
                .args(["--foreground", "--no-notify"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("rpc.statd is installed (nfs-common)"),
        );
        let mountd = Some(
            Command::new("rpc.mountd")
                .arg("--foreground")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("nfs-kernel-server is installed (scripts/vm-test installs it)"),
        );
        let threads = fs::read_to_string("/proc/fs/nfsd/threads").unwrap_or_default();
        let started_nfsd = threads.trim() == "0" || threads.trim().is_empty();
        // NFS 3's lock manager has a grace period of its own (50 s by default), in
        // which it answers every new lock "try later": SQLite's first lock waits it out.
        let _ = fs::write("/proc/sys/fs/nfs/nlm_grace_period", "10");
        // Started (again, where the machine runs it already) with the shortest grace
        // period knfsd takes: in its grace period (90 s by default, from its start)
        // it answers every create "try later", and a driver laying its share out
        // waits that long.
        sh(&format!(
            "rpc.nfsd 0 && echo 10 > /proc/fs/nfsd/nfsv4gracetime && echo 10 > /proc/fs/nfsd/nfsv4leasetime && {NFSD_START}"
        ));
        sh(&format!(
            "exportfs -i -o {options} 127.0.0.1:{}",
            export.display()
        ));
        sh("exportfs -f");
        wait_listening(2049, "nfsd");
        Knfsd {
            export: export.to_path_buf(),
            mountd,
            rpcbind,
            statd,
            started_nfsd,
            var_lib_nfs,
            _one: one,
        }
    }
}

impl Knfsd {
    /// Exports `dir` too, to 127.0.0.1, with `options`; unexported on drop.
    pub fn export(&self, dir: &Path, options: &str) -> Unexport {
        sh(&format!(
            "exportfs -i -o {options} 127.0.0.1:{} && exportfs -f",
            dir.display()
        ));
        Unexport(dir.to_path_buf())
    }
}

/// A second export of a [`Knfsd`], taken back on drop.
pub struct Unexport(PathBuf);

impl Drop for Unexport {
    fn drop(&mut self) {
        let _ = Command::new("exportfs")
            .arg("-u")
            .arg(format!("127.0.0.1:{}", self.0.display()))
            .status();
    }
}

/// The TCP connections established from this machine to 127.0.0.1:`port`
/// (`/proc/net/tcp`, state 01): how many the kernel's clients hold to a server.
pub fn connections_to(port: u16) -> usize {
    let want = format!("0100007F:{port:04X}");
    fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[2] == want && f[3] == "01"
        })
        .count()
}

/// How the tests start knfsd's threads: NFS 3 and 4 over TCP.
const NFSD_START: &str = "rpc.nfsd --no-udp 4";

impl Knfsd {
    /// Stops the server's threads (its exports and state directory kept) until the
    /// returned guard is dropped, which starts them again: a test that fails during
    /// the outage does not leave callers of a `hard` mount waiting for ever.
    pub fn outage(&self) -> Outage {
        sh("rpc.nfsd 0");
        Outage
    }
}

/// knfsd away ([`Knfsd::outage`]) until dropped.
pub struct Outage;

impl Drop for Outage {
    fn drop(&mut self) {
        let _ = Command::new("sh").args(["-c", NFSD_START]).status();
    }
}

/// The kernel's file leases, which knfsd's delegations are, off until dropped.
pub struct Leases(String);

impl Leases {
    pub fn off() -> Leases {
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
pub fn mount_nfs(export: &Path, at: &Path, more: &str) -> Unmount {
    mount_nfs_with(export, at, &format!("{DEPLOY_NFS}{more}"))
}

/// Mounts `export` as [`mount_nfs`] does, at NFS version `vers` (DEPLOY.md's other
/// options), with `more` options.
pub fn mount_nfs_vers(export: &Path, at: &Path, vers: &str, more: &str) -> Unmount {
    let cache = DEPLOY_NFS
        .strip_prefix("vers=4.2")
        .expect("DEPLOY_NFS names its version first");
    mount_nfs_with(export, at, &format!("vers={vers}{cache}{more}"))
}

/// Mounts `export` of this machine's knfsd on `at` with exactly `options` (another
/// version than DEPLOY.md's, say), tried again as [`mount_nfs`] is.
pub fn mount_nfs_with(export: &Path, at: &Path, options: &str) -> Unmount {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let out = Command::new("mount")
            .args(["-t", "nfs", "-o", options])
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
        for child in [&mut self.mountd, &mut self.statd, &mut self.rpcbind]
            .into_iter()
            .flatten()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.var_lib_nfs.take();
    }
}

/// The NFS client's count of each request it sent to the server for the mount at `at`
/// (`/proc/self/mountstats`, its per-op statistics: fs/nfs/super.c `nfs_show_stats`,
/// net/sunrpc/stats.c `rpc_clnt_show_stats`): what a view costs the server, counted
/// rather than timed.
pub fn nfs_requests(at: &Path) -> std::collections::HashMap<String, u64> {
    let stats = std::fs::read_to_string("/proc/self/mountstats").unwrap();
    let mounted_on = format!(" mounted on {} ", at.display());
    let mut counts = std::collections::HashMap::new();
    let mut ours = false;
    let mut per_op = false;
    for line in stats.lines() {
        if line.starts_with("device ") {
            ours = line.contains(&mounted_on);
            per_op = false;
        } else if ours && line.contains("per-op statistics") {
            per_op = true;
        } else if ours && per_op {
            if let Some((op, rest)) = line.trim().split_once(':') {
                if let Some(Ok(n)) = rest.split_whitespace().next().map(str::parse::<u64>) {
                    counts.insert(op.to_string(), n);
                }
            }
        }
    }
    assert!(!counts.is_empty(), "no NFS statistics for {}", at.display());
    counts
}

/// Waits until the server gives the client of the NFS 4 mount at `at` delegations,
/// which the request counts of the tests assume (without them a view opens each file
/// twice). knfsd gives none while any lock manager of its network is in its grace
/// period (fs/nfsd/nfs4state.c `nfs4_open_delegation`, `locks_in_grace`), NFS 3's
/// lockd included, which [`Knfsd::start`] starts with 10 s of it. A file opened
/// again under a delegation sends no `OPEN`.
pub fn await_delegations(at: &Path) {
    let probe = at.join(".delegation-probe");
    fs::write(&probe, "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let sent = nfs_requests_of(at, || drop(fs::File::open(&probe).unwrap()));
        if !sent.keys().any(|op| op.starts_with("OPEN")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no delegation from the server: {sent:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    fs::remove_file(&probe).unwrap();
}

/// What `during` sent the server of the NFS mount at `at`: each request's count.
pub fn nfs_requests_of(at: &Path, during: impl FnOnce()) -> std::collections::HashMap<String, u64> {
    let before = nfs_requests(at);
    during();
    let after = nfs_requests(at);
    after
        .into_iter()
        .map(|(op, n)| {
            let was = before.get(&op).copied().unwrap_or(0);
            (op, n - was)
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// The kernel SMB client's count of each command it sent the server of the mount at
/// `at` (`/proc/fs/cifs/Stats`, per tree connection: fs/smb/client/smb2ops.c
/// `smb2_print_stats`; a compound of several commands is one round trip), over every
/// connection to its tree.
pub fn smb_requests(at: &Path) -> std::collections::HashMap<String, u64> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let source = mounts
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f.len() > 2 && Path::new(f[1]) == at && matches!(f[2], "cifs" | "smb3"))
        .map(|f| f[0].replace('/', "\\"))
        .unwrap_or_else(|| panic!("no SMB mount at {}", at.display()));
    let stats = std::fs::read_to_string("/proc/fs/cifs/Stats").unwrap();
    let mut counts = std::collections::HashMap::new();
    let mut ours = false;
    for line in stats.lines() {
        if let Some((n, tree)) = line.split_once(')') {
            if n.trim().parse::<u32>().is_ok() {
                ours = tree.trim() == source;
                continue;
            }
        }
        if !ours {
            continue;
        }
        let words: Vec<_> = line
            .split(|c: char| c == ':' || c.is_whitespace())
            .filter(|w| !w.is_empty())
            .collect();
        for w in words.windows(3) {
            if w[2] == "total" && w[0].chars().all(|c| c.is_ascii_alphabetic()) {
                if let Ok(n) = w[1].parse::<u64>() {
                    *counts.entry(w[0].to_string()).or_default() += n;
                }
            }
        }
    }
    assert!(
        !counts.is_empty(),
        "no SMB statistics for {source}:\n{stats}"
    );
    counts
}

/// What `during` sent the server of the SMB mount at `at`: each command's count. A
/// tree connection the client drops meanwhile takes its counts with it (the sum over
/// the tree's connections can fall): a command whose sum fell counts 0.
pub fn smb_requests_of(at: &Path, during: impl FnOnce()) -> std::collections::HashMap<String, u64> {
    let before = smb_requests(at);
    during();
    smb_requests(at)
        .into_iter()
        .map(|(op, n)| {
            let was = before.get(&op).copied().unwrap_or(0);
            (op, n.saturating_sub(was))
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}
