//! A "container" as a runtime makes one, for tests of what a container's life and death
//! do to views and registrations: a PID namespace made with `unshare --pid --fork`,
//! where the death of the namespace's first process makes the kernel kill everything
//! else in it. Or, for tests of what a runtime's kill of a container's cgroup does: a
//! cgroup v2 of its own ([`TestCgroup`]), with or without a PID namespace (a pod with
//! `hostPID` has none of its own).
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

/// A container: a PID namespace whose first process is the command after this.
pub const CONTAINER: &[&str] = &["unshare", "--pid", "--fork", "--kill-child", "--"];

/// A container running one command.
pub struct Container {
    wrapper: Option<Child>,
    /// Its cgroup, if it has one of its own.
    cgroup: Option<PathBuf>,
    /// Whether it has a PID namespace of its own.
    pid_ns: bool,
}

/// Where this machine's cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or
/// `/sys/fs/cgroup/unified` beside v1 controllers).
pub fn cgroup2_root() -> PathBuf {
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    mounts
        .lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            (post.split_whitespace().next() == Some("cgroup2"))
                .then(|| PathBuf::from(pre.split_whitespace().nth(4).unwrap()))
        })
        .expect("these tests need a cgroup v2 hierarchy mounted (a cgroup2 line in mountinfo)")
}

/// A cgroup v2 of this test's own, removed on drop with everything below it (every
/// process in it killed first): a test leaves no cgroup behind.
pub struct TestCgroup {
    pub path: PathBuf,
}

impl TestCgroup {
    pub fn new() -> TestCgroup {
        let path = cgroup2_root().join(format!(
            "mountgroup-test-{}-{:016x}",
            std::process::id(),
            rand_u64()
        ));
        fs::create_dir(&path).unwrap();
        // The memory controller for its children where this machine's cgroup v2 has
        // it, as systemd delegates it to kubelet's slices and kubelet to a pod's cgroup.
        let controllers = fs::read_to_string(path.join("cgroup.controllers")).unwrap();
        if controllers.split_whitespace().any(|c| c == "memory") {
            fs::write(path.join("cgroup.subtree_control"), "+memory").unwrap();
        }
        TestCgroup { path }
    }

    /// Whether cgroup v2 has the memory controller here (on this machine it is on a v1
    /// hierarchy; on the VM tier's kernels on v2, as on the nodes users run).
    pub fn has_memory(&self) -> bool {
        fs::read_to_string(self.path.join("cgroup.subtree_control"))
            .unwrap()
            .split_whitespace()
            .any(|c| c == "memory")
    }

    /// The path of its child cgroup `name` (made by whoever uses it).
    pub fn child(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).unwrap();
    u64::from_le_bytes(b)
}

/// Kills every process in the cgroup at `path` and below, as a runtime does
/// (`cgroup.kill`), and waits until it is empty.
pub fn kill_cgroup(path: &Path) {
    fs::write(path.join("cgroup.kill"), "1").unwrap();
    assert!(emptied(path), "{path:?} still populated");
}

/// Whether the cgroup at `path` has no process left within 10 s.
pub fn emptied(path: &Path) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while fs::read_to_string(path.join("cgroup.events"))
        .map(|s| s.contains("populated 1"))
        .unwrap_or(false)
    {
        if Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
    true
}

fn remove_tree(path: &Path) {
    if let Ok(entries) = fs::read_dir(path) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = fs::remove_dir(path);
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        if self.path.exists() {
            let _ = fs::write(self.path.join("cgroup.kill"), "1");
            emptied(&self.path);
            remove_tree(&self.path);
        }
    }
}

/// The command prefix that runs what follows in the cgroup at `cgroup` (made if
/// absent) and, with `pid_ns`, in a PID namespace of its own; always with a cgroup
/// namespace of its own, as runtimes give containers.
pub fn in_cgroup(cgroup: &Path, pid_ns: bool) -> Vec<String> {
    fs::create_dir_all(cgroup).unwrap();
    let mut v: Vec<String> = vec![
        "sh".into(),
        "-c".into(),
        // The shell joins the cgroup, then becomes the rest.
        r#"echo 0 > "$0/cgroup.procs" && exec "$@""#.into(),
        cgroup.to_str().unwrap().into(),
        "unshare".into(),
        "--cgroup".into(),
    ];
    if pid_ns {
        v.extend(["--pid".into(), "--fork".into(), "--kill-child".into()]);
    }
    v.push("--".into());
    v
}

impl Container {
    /// Runs `bin args` in a new container, its stderr appended to `log`.
    pub fn start(bin: &Path, args: &[&str], log: &Path) -> Container {
        Container::start_with_env(bin, args, &[("RUST_LOG", "mountgroup=debug,info")], log)
    }

    /// [`Container::start`] with these environment variables.
    pub fn start_with_env(
        bin: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Container {
        Container::spawn(CONTAINER, None, bin, args, env, log)
    }

    /// A container whose cgroup is `cgroup` (killed whole with `cgroup.kill`), in a PID
    /// namespace of its own if `pid_ns`, else in this one's (a `hostPID` pod).
    pub fn start_in_cgroup(
        cgroup: &Path,
        pid_ns: bool,
        bin: &Path,
        args: &[&str],
        log: &Path,
    ) -> Container {
        let prefix = in_cgroup(cgroup, pid_ns);
        let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
        let env = [("RUST_LOG", "mountgroup=debug,info")];
        let mut c = Container::spawn(&prefix, Some(cgroup), bin, args, &env, log);
        c.pid_ns = pid_ns;
        c
    }

    fn spawn(
        prefix: &[&str],
        cgroup: Option<&Path>,
        bin: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Container {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = Command::new(prefix[0])
            .args(&prefix[1..])
            .arg(bin)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Container {
            wrapper: Some(child),
            cgroup: cgroup.map(Path::to_path_buf),
            pid_ns: true,
        }
    }

    /// The container's main process: the command itself without a PID namespace.
    pub fn main_pid(&self) -> u32 {
        if self.pid_ns {
            self.init_pid()
        } else {
            self.wrapper.as_ref().unwrap().id()
        }
    }

    /// The namespace's first process (the wrapper's child).
    pub fn init_pid(&self) -> u32 {
        let w = self.wrapper.as_ref().unwrap().id();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let children =
                fs::read_to_string(format!("/proc/{w}/task/{w}/children")).unwrap_or_default();
            if let Some(pid) = children.split_whitespace().next() {
                return pid.parse().unwrap();
            }
            assert!(Instant::now() < deadline, "the container has no process");
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// As a runtime kills a container: every process in its cgroup at once, or, for a
    /// container that is a PID namespace only, its first process is SIGKILLed and the
    /// kernel kills the rest.
    pub fn kill(&mut self) {
        if self.wrapper.is_none() {
            return;
        }
        if let Some(cg) = &self.cgroup {
            kill_cgroup(cg);
            if let Some(mut w) = self.wrapper.take() {
                let _ = w.wait();
            }
            return;
        }
        let init = self.init_pid();
        let _ = kill_process(Pid::from_raw(init as i32).unwrap(), Signal::KILL);
        if let Some(mut w) = self.wrapper.take() {
            let _ = w.wait();
        }
    }

    /// As a runtime stops a container: SIGTERM to its first process, SIGKILL after
    /// the grace period.
    pub fn stop(&mut self, grace: Duration) {
        if self.wrapper.is_none() {
            return;
        }
        let main = self.main_pid();
        let _ = kill_process(Pid::from_raw(main as i32).unwrap(), Signal::TERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(Some(_)) = self.wrapper.as_mut().map(|w| w.try_wait().unwrap()) {
                self.wrapper = None;
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        self.kill();
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Keepers run as a node runs them: each in a container and a cgroup of its own
/// (`keeperN` under `cg`), on the node's run directory under `root`, with `extra`
/// arguments (`--views-cgroup` and its bounds); keeper N logs to `keeperN.log`.
pub struct Keepers<'a> {
    cg: &'a TestCgroup,
    root: PathBuf,
    socket: PathBuf,
    args: Vec<String>,
}

impl<'a> Keepers<'a> {
    pub fn new(cg: &'a TestCgroup, root: &Path, extra: &[String]) -> Keepers<'a> {
        let (socket, mut args) = crate::keeper::node_run(root);
        args.extend_from_slice(extra);
        Keepers {
            cg,
            root: root.to_path_buf(),
            socket,
            args,
        }
    }

    /// Keepers as deploy/node.yaml runs them: each view in a cgroup of its own under
    /// `views` (`--views-cgroup`).
    pub fn deployed(cg: &'a TestCgroup, root: &Path, views: &Path) -> Keepers<'a> {
        Keepers::new(
            cg,
            root,
            &["--views-cgroup".into(), views.to_str().unwrap().into()],
        )
    }

    /// The keepers' socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Keeper `n`'s cgroup.
    pub fn cgroup(&self, n: &str) -> PathBuf {
        self.cg.child(&format!("keeper{n}"))
    }

    /// Starts keeper `n` and waits until its readiness probe, run in its container,
    /// passes.
    pub fn start(&self, n: &str) -> Container {
        self.start_binary(n, Path::new(crate::common::BIN))
    }

    /// [`Keepers::start`] with another binary (an update's new version).
    pub fn start_binary(&self, n: &str, bin: &Path) -> Container {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let log = self.root.join(format!("keeper{n}.log"));
        let k = Container::start_in_cgroup(&self.cgroup(n), false, bin, &args, &log);
        crate::keeper::wait_ready_in(&in_cgroup(&self.cgroup(n), false), bin, &self.socket);
        k
    }

    /// Keeper `n`'s log.
    pub fn log(&self, n: &str) -> String {
        fs::read_to_string(self.root.join(format!("keeper{n}.log"))).unwrap()
    }
}
