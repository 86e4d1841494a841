//! Shared helpers for tests that mount real views: the `mountgroup` binary run as a
//! child process, a guard that always unmounts (even when the test panics), and
//! commands run as other users through setpriv(1).
#![allow(dead_code)]

use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

pub const BIN: &str = env!("CARGO_BIN_EXE_mountgroup");

/// `bin` run under `prefix` (a command and its arguments that execs what follows,
/// such as the test container's `unshare ...`), or `bin` itself for an empty prefix.
pub fn command_under<S: AsRef<std::ffi::OsStr>>(
    prefix: &[S],
    bin: impl AsRef<std::ffi::OsStr>,
) -> Command {
    match prefix.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(bin);
            c
        }
        None => Command::new(bin),
    }
}

/// Lazily unmounts a path on drop: a test leaves no mount behind, even when it fails.
pub struct Unmount(pub PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
    }
}

/// A temp dir with `src/` (the backing tree) and `mnt/`, traversable by every user.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub src: PathBuf,
    pub mnt: PathBuf,
}

impl Fixture {
    pub fn new() -> Fixture {
        let dir = tempfile::Builder::new()
            .prefix("mountgroup-test-")
            .tempdir()
            .unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let src = dir.path().join("src");
        let mnt = dir.path().join("mnt");
        fs::create_dir(&src).unwrap();
        fs::create_dir(&mnt).unwrap();
        Fixture { dir, src, mnt }
    }

    /// Another empty directory inside the fixture.
    pub fn subdir(&self, name: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        fs::create_dir_all(&p).unwrap();
        p
    }

    /// Mounts a view of `src` on `mnt` with `-o options`; panics with the daemon's
    /// message if the mount fails.
    pub fn mount(&self, options: &str) -> Mounted {
        Mounted::start(&self.src, &self.mnt, &["-o", options])
            .unwrap_or_else(|e| panic!("mount failed: {e}"))
    }
}

impl Drop for Fixture {
    /// A failing test's logs (its views', its driver's, its servers') outlive its
    /// temporary directory: copied whole to the VM tier's log directory
    /// (`failed/TEST/`), or, on the host, their last lines printed with the failure.
    fn drop(&mut self) {
        if std::thread::panicking() {
            keep_logs(self.dir.path());
        }
    }
}

/// Log files below `root` worth keeping: `*.log` (views, driver, servers) and a
/// daemon's `mnt.logPID-N` ([`Mounted`]), on `root`'s own file system only (a mount
/// left by the failure may no longer answer).
fn logs_below(root: &Path) -> Vec<PathBuf> {
    let Ok(top) = fs::symlink_metadata(root) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.dev() != top.dev() {
                continue;
            }
            let path = e.path();
            if m.is_dir() {
                dirs.push(path);
            } else if m.is_file()
                && path
                    .extension()
                    .and_then(|x| x.to_str())
                    .is_some_and(|x| x.starts_with("log"))
            {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

fn keep_logs(root: &Path) {
    for log in logs_below(root) {
        keep_log(&log, log.strip_prefix(root).unwrap_or(&log));
    }
}

/// Keeps one log of a failing test as `rel`: copied to the VM tier's log directory
/// (`failed/TEST/REL`), or its last lines printed on the host.
fn keep_log(log: &Path, rel: &Path) {
    const MOST: u64 = 16 << 20;
    const TAIL: usize = 40;
    match std::env::var_os("MOUNTGROUP_VM_OUT") {
        Some(out) => {
            let test = std::thread::current()
                .name()
                .unwrap_or("test")
                .replace("::", "-");
            let dest = PathBuf::from(out).join("failed").join(test).join(rel);
            let small = fs::metadata(log).is_ok_and(|m| m.len() <= MOST);
            if small
                && fs::create_dir_all(dest.parent().unwrap()).is_ok()
                && fs::copy(log, &dest).is_ok()
            {
                eprintln!("kept {} as {}", rel.display(), dest.display());
            }
        }
        None => {
            let text = fs::read(log).unwrap_or_default();
            let text = String::from_utf8_lossy(&text);
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(TAIL)..];
            eprintln!(
                "--- the last {} lines of {}:\n{}",
                tail.len(),
                rel.display(),
                tail.join("\n")
            );
        }
    }
}

/// A running `mountgroup mount`. Dropping it stops the daemon and makes sure the
/// mount is gone.
pub struct Mounted {
    child: Option<Child>,
    pub mountpoint: PathBuf,
    log: PathBuf,
    /// Whether dropping it unmounts: not for a takeover that failed, whose mount is
    /// another daemon's.
    owns_mount: bool,
}

impl Mounted {
    /// Starts the daemon and waits until the mount shows in the mount table. Returns
    /// the daemon's stderr if it exits first.
    pub fn start(source: &Path, mountpoint: &Path, args: &[&str]) -> Result<Mounted, String> {
        Self::start_with(&[], source, mountpoint, args)
    }

    /// [`Mounted::start`] with the daemon run under `wrapper` (a command and its
    /// arguments, e.g. `prlimit --nofile=256:256`), which must exec the rest.
    pub fn start_with(
        wrapper: &[&str],
        source: &Path,
        mountpoint: &Path,
        args: &[&str],
    ) -> Result<Mounted, String> {
        static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = mountpoint.with_extension(format!("log{}-{n}", std::process::id()));
        let err = fs::File::create(&log).unwrap();
        let mut cmd = command_under(wrapper, BIN);
        let child = cmd
            .arg("mount")
            .arg(source)
            .arg(mountpoint)
            .args(args)
            .env("RUST_LOG", "mountgroup=debug,info")
            // Beside the mountpoint, not in /run: a test leaves nothing behind.
            .env("MOUNTGROUP_CONTROL_DIR", mountpoint.with_extension("ctl"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap();
        let mut m = Mounted {
            child: Some(child),
            mountpoint: fs::canonicalize(mountpoint).unwrap(),
            log,
            owns_mount: true,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if is_mounted(&m.mountpoint) {
                return Ok(m);
            }
            if let Some(status) = m.child.as_mut().unwrap().try_wait().unwrap() {
                m.child = None;
                return Err(format!("exited with {status}: {}", m.log_text()));
            }
            if Instant::now() > deadline {
                return Err(format!("not mounted after 20 s: {}", m.log_text()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts a daemon on a mountpoint a view serves already, and waits until it has
    /// taken that view over (its log says so). Returns its stderr if it exits first.
    pub fn take_over(source: &Path, mountpoint: &Path, args: &[&str]) -> Result<Mounted, String> {
        let mut m = Self::start(source, mountpoint, args)?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if m.log_text().contains("took the view over") {
                return Ok(m);
            }
            if let Some(status) = m.child.as_mut().unwrap().try_wait().unwrap() {
                m.child = None;
                m.owns_mount = false;
                return Err(format!("exited with {status}: {}", m.log_text()));
            }
            if Instant::now() > deadline {
                m.owns_mount = false;
                return Err(format!("no takeover after 20 s: {}", m.log_text()));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// What the daemon logged so far.
    pub fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// Waits up to `limit` for the daemon to exit by itself and returns its exit code
    /// (`None` if it did not); the mount, if any is left, is no longer this guard's to
    /// unmount.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        let child = self.child.as_mut()?;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                self.owns_mount = false;
                return status.code();
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops the daemon with SIGTERM and returns its exit code.
    pub fn stop(mut self) -> Option<i32> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Option<i32> {
        let mut code = None;
        if let Some(mut child) = self.child.take() {
            let _ = kill_process(Pid::from_raw(child.id() as i32).unwrap(), Signal::TERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match child.try_wait() {
                    Ok(Some(status)) => {
                        code = status.code();
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
        if self.owns_mount && is_mounted(&self.mountpoint) {
            let _ = rustix::mount::unmount(&self.mountpoint, rustix::mount::UnmountFlags::DETACH);
        }
        code
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.shutdown();
        if std::thread::panicking() {
            // The test fails: what the daemon said goes with it (see `Fixture`'s drop).
            let name = self.log.file_name().map(PathBuf::from).unwrap_or_default();
            keep_log(&self.log, &name);
        }
        let _ = fs::remove_file(&self.log);
    }
}

/// Whether `path` is a mount point in this mount namespace.
pub fn is_mounted(path: &Path) -> bool {
    let want = path.to_string_lossy().replace(' ', "\\040");
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

/// The result of a command run as another user.
#[derive(Debug)]
pub struct Ran {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl From<std::process::Output> for Ran {
    fn from(out: std::process::Output) -> Ran {
        Ran {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// setpriv(1)'s arguments for `uid`/`gid` with exactly the supplementary `groups`, up
/// to the `--` before the program.
pub fn setpriv_args(uid: u32, gid: u32, groups: &[u32]) -> Vec<String> {
    let mut args = vec![format!("--reuid={uid}"), format!("--regid={gid}")];
    if groups.is_empty() {
        args.push("--clear-groups".into());
    } else {
        let g: Vec<String> = groups.iter().map(u32::to_string).collect();
        args.push(format!("--groups={}", g.join(",")));
    }
    args.push("--".into());
    args
}

/// Runs `script` with `sh -c` as `uid`/`gid` with exactly the supplementary `groups`.
pub fn run_as(uid: u32, gid: u32, groups: &[u32], script: &str) -> Ran {
    Command::new("setpriv")
        .args(setpriv_args(uid, gid, groups))
        .args(["sh", "-c", script])
        .output()
        .expect("setpriv runs")
        .into()
}

/// (uid, gid, mode) of a path, not following symlinks.
pub fn owner(path: &Path) -> (u32, u32, u32) {
    let m = fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (m.uid(), m.gid(), m.mode() & 0o7777)
}

/// Every path below `root` with its (uid, gid, mode), sorted.
pub fn snapshot(root: &Path) -> Vec<(PathBuf, (u32, u32, u32))> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        out.push((p.strip_prefix(root).unwrap().to_path_buf(), owner(&p)));
        if fs::symlink_metadata(&p).unwrap().is_dir() {
            for e in fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
    }
    out.sort();
    out
}

/// chown without following symlinks.
pub fn chown(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).unwrap();
}

/// chmod.
pub fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// The raw OS error of a failed std call.
pub fn errno<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.expect_err("expected an error")
        .raw_os_error()
        .expect("an OS error")
}

/// What a CIFS view without records (a share that keeps none) shows at `target` for
/// the pod's group `group`: a member makes files and directories, each with the modes
/// a kernel CIFS mount would show (owner root, `group`, files `0664` with no execute
/// bit, directories `0775`); root's chmod and chown succeed with no effect; someone
/// outside the group reads, as the modes say, and cannot write.
pub fn assert_cifs_view_without_records(target: &Path, group: u32) {
    let ran = run_as(
        1000,
        1000,
        &[group],
        &format!(
            "cd {} && echo x > f && mkdir d && echo y > d/g && cat d/g",
            target.display()
        ),
    );
    assert!(ran.ok && ran.stdout == "y\n", "{ran:?}");
    assert_eq!(owner(&target.join("f")), (0, group, 0o664));
    assert_eq!(owner(&target.join("d")), (0, group, 0o775));
    assert_eq!(owner(&target.join("d/g")), (0, group, 0o664));
    let ran = run_as(
        0,
        0,
        &[],
        &format!("chmod 600 {0}/f && chown 7:7 {0}/f", target.display()),
    );
    assert!(ran.ok, "{ran:?}");
    assert_eq!(owner(&target.join("f")), (0, group, 0o664));
    let ran = run_as(
        2001,
        2001,
        &[],
        &format!("cat {0}/f && echo z >> {0}/f", target.display()),
    );
    assert!(!ran.ok && ran.stdout == "x\n", "{ran:?}");
}

/// Debian's PostgreSQL programs (`initdb`, `pg_ctl`), whichever version is installed.
pub fn postgres_bin(program: &str) -> std::path::PathBuf {
    let mut found: Vec<_> = fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is installed (scripts/test installs postgresql)")
        .flatten()
        .map(|e| e.path().join("bin").join(program))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    found.pop().expect("a PostgreSQL version with its programs")
}

/// The postgres user's uid and gid (the owner of its home), as Debian's package makes it.
pub fn postgres_user() -> (u32, u32) {
    fs::metadata("/var/lib/postgresql")
        .map(|m| (m.uid(), m.gid()))
        .unwrap_or((101, 104))
}

/// Starts PostgreSQL on `data` as the postgres user (with `groups`), asks it one query
/// and stops it; `Err` with what it said when it does not start.
pub fn postgres_runs(data: &Path, sockets: &Path, groups: &[u32]) -> Result<(), String> {
    let pg = postgres_user();
    let log = sockets.join("pg.log");
    let start = run_as(
        pg.0,
        pg.1,
        groups,
        &format!(
            "{} -D {} -l {} -w -t 30 -o \"-k {} -c listen_addresses='' -p 5499\" start",
            postgres_bin("pg_ctl").display(),
            data.display(),
            log.display(),
            sockets.display()
        ),
    );
    if !start.ok {
        return Err(format!(
            "{start:?} {}",
            fs::read_to_string(&log).unwrap_or_default()
        ));
    }
    let q = run_as(
        pg.0,
        pg.1,
        groups,
        &format!(
            "psql -h {} -p 5499 -d postgres -tAc 'select 6*7'",
            sockets.display()
        ),
    );
    let stop = run_as(
        pg.0,
        pg.1,
        groups,
        &format!(
            "{} -D {} -m fast -w stop",
            postgres_bin("pg_ctl").display(),
            data.display()
        ),
    );
    assert!(stop.ok, "{stop:?}");
    if q.ok && q.stdout.trim() == "42" {
        Ok(())
    } else {
        Err(format!("{q:?}"))
    }
}

/// Runs a command and panics with its output unless it succeeds.
pub fn sh(script: &str) -> String {
    let out = Command::new("sh").args(["-c", script]).output().unwrap();
    assert!(
        out.status.success(),
        "`{script}` failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Mounts the fixture's view with `options`, writing its counters to the returned file
/// (read with [`op_counts`] and [`count`]).
pub fn mount_counted(f: &Fixture, options: &str) -> (Mounted, PathBuf) {
    let metrics = f.dir.path().join("metrics.json");
    let m = Mounted::start(
        &f.src,
        &f.mnt,
        &["-o", options, "--metrics-file", metrics.to_str().unwrap()],
    )
    .unwrap();
    (m, metrics)
}

/// The view's whole `--metrics-file`, once a snapshot written after `since` is there
/// (one is written every second).
pub fn metrics_snapshot(metrics: &Path, since: std::time::SystemTime) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let fresh = fs::metadata(metrics).is_ok_and(|m| m.modified().unwrap() > since);
        let snapshot = fresh
            .then(|| fs::read_to_string(metrics).ok())
            .flatten()
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok());
        if let Some(v) = snapshot {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "no metrics snapshot");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The view's operation counters from its `--metrics-file` ([`metrics_snapshot`]).
pub fn op_counts(metrics: &Path, since: std::time::SystemTime) -> serde_json::Value {
    metrics_snapshot(metrics, since)["ops"].clone()
}

/// How many `op` requests the view has answered, as [`op_counts`] reads them.
pub fn count(metrics: &Path, op: &str) -> u64 {
    let since = std::time::SystemTime::now();
    op_counts(metrics, since)[op]["count"].as_u64().unwrap_or(0)
}

/// The mount at `path` as mountinfo shows it: (its options, its source).
pub fn mount_entry(path: &Path) -> (Vec<String>, String) {
    let p = path.to_str().unwrap();
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some(p))
        .unwrap_or_else(|| panic!("{p} is not mounted"));
    // Per-mount flags (noatime, ...) and the superblock's (lazytime, sync, ...).
    let (head, tail) = line.split_once(" - ").unwrap();
    let tail: Vec<&str> = tail.split(' ').collect();
    let options = head
        .split(' ')
        .nth(5)
        .unwrap()
        .split(',')
        .chain(tail[2].split(','));
    (options.map(String::from).collect(), tail[1].to_string())
}

/// What this machine's kernel FUSE offers a server (its INIT flags), asked once.
pub fn kernel_fuse() -> mountgroup::transport::probe::KernelFuse {
    static ASKED: std::sync::OnceLock<mountgroup::transport::probe::KernelFuse> =
        std::sync::OnceLock::new();
    *ASKED.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        mountgroup::transport::probe::probe(dir.path()).unwrap()
    })
}

/// Whether the running kernel is `major.minor` or later (`/proc/sys/kernel/osrelease`).
pub fn kernel_at_least(major: u32, minor: u32) -> bool {
    release_at_least(&mountgroup::sys::kernel_release(), major, minor)
}

/// Whether a kernel release (`6.1.0-48-amd64`, `6.12.95+deb12-amd64`) is `major.minor`
/// or later; a release that does not parse is taken for a recent one. The tests'
/// oracle only: the driver reads what FUSE INIT says, never the release.
pub fn release_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(str::parse::<u32>);
    match (parts.next(), parts.next()) {
        (Some(Ok(a)), Some(Ok(b))) => (a, b) >= (major, minor),
        _ => true,
    }
}
