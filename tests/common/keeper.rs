//! Views under a keeper, as the tests see them: the keeper's socket and arguments on a
//! node, its readiness, the processes that serve a view, and killing one.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

/// Waits until `bin keeper --probe` says the keeper at `socket` is ready.
pub fn wait_ready(bin: &Path, socket: &Path) {
    wait_ready_in(&[], bin, socket)
}

/// [`wait_ready`] with the probe run under `prefix` (in the keeper's container, as a
/// runtime runs an exec probe).
pub fn wait_ready_in(prefix: &[String], bin: &Path, socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut cmd = crate::common::command_under(prefix, bin);
        let ok = cmd
            .args(["keeper", "--probe", "--socket"])
            .arg(socket)
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success();
        if ok {
            return;
        }
        assert!(Instant::now() < deadline, "keeper at {socket:?} not ready");
        thread::sleep(Duration::from_millis(20));
    }
}

/// The processes that serve the view on `target`, and their binaries.
pub fn view_processes(target: &Path) -> Vec<(u32, PathBuf)> {
    let target = target.as_os_str().as_encoded_bytes();
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let cmd = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
            (args.get(1) == Some(&&b"mount"[..]) && args.contains(&target))
                .then(|| Some((pid, fs::read_link(format!("/proc/{pid}/exe")).ok()?)))?
        })
        .collect()
}

/// SIGKILLs the process serving the view on `target` and waits until another one does.
pub fn kill_view(target: &Path) {
    let now = view_processes(target);
    assert_eq!(now.len(), 1, "{now:?}");
    let dead = now[0].0;
    kill_process(Pid::from_raw(dead as i32).unwrap(), Signal::KILL).unwrap();
    wait_replaced(target, dead, Duration::from_secs(20));
}

/// Waits until one process serves the view on `target` and it is not `old`; returns it.
pub fn wait_replaced(target: &Path, old: u32, limit: Duration) -> u32 {
    poll_replaced(target, old, limit, Duration::from_millis(5))
}

/// [`wait_replaced`], looking every `pause`.
fn poll_replaced(target: &Path, old: u32, limit: Duration, pause: Duration) -> u32 {
    let deadline = Instant::now() + limit;
    loop {
        let now = view_processes(target);
        if now.len() == 1 && now[0].0 != old {
            return now[0].0;
        }
        assert!(Instant::now() < deadline, "no new view process: {now:?}");
        thread::sleep(pause);
    }
}

/// Waits until the log `read` gives says `line` (the keeper writes "recovering it"
/// just after it started the process that [`wait_replaced`] sees), and fails with the
/// log after 10 s.
pub fn assert_logged(read: impl Fn() -> String, line: &str) {
    assert_logged_within(read, line, Duration::from_secs(10))
}

/// [`assert_logged`], failing after `limit`.
pub fn assert_logged_within(read: impl Fn() -> String, line: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let log = read();
        if log.contains(line) {
            return;
        }
        assert!(Instant::now() < deadline, "no {line:?} in:\n{log}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// The one process that serves the view on `target`.
pub fn view_pid(target: &Path) -> u32 {
    let now = view_processes(target);
    assert_eq!(now.len(), 1, "{now:?}");
    now[0].0
}

/// The node's `/run/mountgroup` under `root`: the keeper's socket, and the arguments
/// of a keeper that uses it and the views' control directory beside it.
pub fn node_run(root: &Path) -> (PathBuf, Vec<String>) {
    let run = root.join("run");
    fs::create_dir_all(&run).unwrap();
    let socket = run.join("keeper.sock");
    let args = vec![
        "keeper".into(),
        "--socket".into(),
        socket.to_str().unwrap().into(),
        "--control-dir".into(),
        run.join("views").to_str().unwrap().into(),
    ];
    (socket, args)
}

/// Kills the view on `target` until its keeper lets it go (it recovers a view three
/// times a minute at most) and the mount answers `ENOTCONN`: a view whose death is not
/// recovered.
pub fn kill_view_for_good(target: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if fs::metadata(target).err().and_then(|e| e.raw_os_error()) == Some(libc::ENOTCONN) {
            return;
        }
        for (pid, _) in view_processes(target) {
            let _ = kill_process(Pid::from_raw(pid as i32).unwrap(), Signal::KILL);
        }
        assert!(Instant::now() < deadline, "{target:?} still serves");
        thread::sleep(Duration::from_millis(20));
    }
}

/// A copy of the test binary under `root/name`: a "version" of its own, told apart by
/// its path (what a rolling update installs).
pub fn binary_version(root: &Path, name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = root.join(name);
    fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("mountgroup");
    fs::copy(crate::common::BIN, &bin).unwrap();
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// SIGKILLs the process serving the view on `target`, then the process the keeper
/// starts to recover it, before it has taken anything over: the views' cgroup `views`
/// (the keeper's `--views-cgroup`) is frozen first, so that the recovering process
/// stops as it joins its own cgroup below it, before mountgroup runs at all, and is
/// killed there. Thaws `views` and returns once a third process serves the view.
pub fn kill_view_and_its_recovery_before_it_holds(target: &Path, views: &Path) {
    let old = view_pid(target);
    let frozen = |on: bool| {
        fs::write(views.join("cgroup.freeze"), if on { "1" } else { "0" }).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let want = format!("frozen {}", u8::from(on));
        while !fs::read_to_string(views.join("cgroup.events"))
            .unwrap()
            .lines()
            .any(|l| l == want)
        {
            assert!(
                Instant::now() < deadline,
                "{} never {want}",
                views.display()
            );
            thread::sleep(Duration::from_millis(5));
        }
    };
    // The processes in the views' cgroups, below `views`.
    let in_views = || -> Vec<u32> {
        fs::read_dir(views)
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir())
            .flat_map(|e| {
                fs::read_to_string(e.path().join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|p| p.parse().ok())
                    .collect::<Vec<u32>>()
            })
            .collect()
    };
    let before = in_views();
    frozen(true);
    kill_process(Pid::from_raw(old as i32).unwrap(), Signal::KILL).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let recovering = loop {
        if let Some(p) = in_views().into_iter().find(|p| !before.contains(p)) {
            break p;
        }
        assert!(Instant::now() < deadline, "the keeper started no recovery");
        thread::sleep(Duration::from_millis(5));
    };
    // Still in the keeper's code, between fork and exec: it has run nothing of ours.
    let exe = fs::read_link(format!("/proc/{recovering}/exe")).ok();
    kill_process(Pid::from_raw(recovering as i32).unwrap(), Signal::KILL).unwrap();
    frozen(false);
    wait_replaced(target, old, Duration::from_secs(20));
    assert!(
        !view_processes(target).iter().any(|(p, _)| *p == recovering),
        "the killed recovery serves ({exe:?})"
    );
}
