//! A live view handed to a new process: `mountgroup mount` run again on a mountpoint a
//! view serves takes it over without unmounting, while a workload runs in it. Zero
//! failed calls, zero mismatched bytes, the same inode numbers, and the old process
//! gone.

mod common;
#[path = "common/workload.rs"]
mod workload;

use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{Fixture, Mounted};
use workload::*;

fn is_alive(pid: u32) -> bool {
    // A zombie is gone for our purpose: it serves nothing.
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

fn wait_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while is_alive(pid) {
        assert!(Instant::now() < deadline, "process {pid} still runs");
        thread::sleep(Duration::from_millis(5));
    }
}

fn view_args<'a>(ctl: &'a str, options: &'a str) -> Vec<&'a str> {
    vec!["-o", options, "--control-dir", ctl]
}

#[test]
fn a_view_taken_over_under_io_loses_nothing() {
    let fx = Fixture::new();
    let ctl = fx.dir.path().join("ctl");
    let ctl = ctl.to_str().unwrap();
    let opts = "gid=2000";
    let first = Mounted::start(&fx.src, &fx.mnt, &view_args(ctl, opts)).unwrap();

    let running = Running::start(&fx.mnt, 200);
    let held = Arc::clone(&running.held);
    let held_ino = held.metadata().unwrap().ino();

    // Five takeovers, each by a new process, while the workload runs.
    let mut serving = vec![first];
    for _ in 0..5 {
        running.settle(3);
        let old = serving.last().unwrap().pid();
        let next = Mounted::take_over(&fx.src, &fx.mnt, &view_args(ctl, opts)).unwrap();
        wait_gone(old);
        serving.push(next);
    }
    running.settle(3);
    let done = running.finish();
    let h = outcome(&done, "held file");

    // The held descriptor still works, names the same inode, and the bytes on disk are
    // every append in order.
    assert_eq!(held.metadata().unwrap().ino(), held_ino);
    let mut on_disk = Vec::new();
    fs::File::open(fx.src.join("held.log"))
        .unwrap()
        .read_to_end(&mut on_disk)
        .unwrap();
    let want: Vec<u8> = (0..h.rounds)
        .flat_map(|i| pattern(1_000_000 + i, 512))
        .collect();
    assert!(on_disk == want, "held.log on disk differs from the appends");
    // Only the newest process serves; each one before it exited.
    let newest = serving.last().unwrap().pid();
    for m in &serving[..serving.len() - 1] {
        assert!(!is_alive(m.pid()), "an old view process still runs");
    }
    assert!(is_alive(newest));
    let log = serving.last().unwrap().log_text();
    assert!(log.contains("took the view over"), "{log}");
    // The group view is still the group view.
    assert_eq!(fs::metadata(fx.mnt.join("held.log")).unwrap().gid(), 2000);
}

#[test]
fn a_takeover_with_other_options_is_refused_and_the_view_serves_on() {
    let fx = Fixture::new();
    let ctl = fx.dir.path().join("ctl");
    let ctl = ctl.to_str().unwrap();
    let first = Mounted::start(&fx.src, &fx.mnt, &view_args(ctl, "gid=2000")).unwrap();
    fs::write(fx.mnt.join("a"), "a").unwrap();
    let err = match Mounted::take_over(&fx.src, &fx.mnt, &view_args(ctl, "gid=3000")) {
        Ok(_) => panic!("a takeover with another gid succeeded"),
        Err(e) => e,
    };
    assert!(
        err.contains("gid=2000") && err.contains("gid=3000"),
        "{err}"
    );
    // Refused before the old view stopped anything: it still serves, with its group.
    assert!(is_alive(first.pid()));
    assert_eq!(fs::read_to_string(fx.mnt.join("a")).unwrap(), "a");
    assert_eq!(fs::metadata(fx.mnt.join("a")).unwrap().gid(), 2000);
}

#[test]
fn a_busy_mountpoint_without_a_control_socket_is_named_busy() {
    let fx = Fixture::new();
    let ctl = fx.dir.path().join("ctl");
    let other = fx.dir.path().join("other-ctl");
    let _first = Mounted::start(
        &fx.src,
        &fx.mnt,
        &view_args(ctl.to_str().unwrap(), "gid=2000"),
    )
    .unwrap();
    let err = match Mounted::take_over(
        &fx.src,
        &fx.mnt,
        &view_args(other.to_str().unwrap(), "gid=2000"),
    ) {
        Ok(_) => panic!("a second view mounted over the first"),
        Err(e) => e,
    };
    assert!(err.contains("busy"), "{err}");
}

/// A keeper takes over only the views its predecessors started (a keeper at the same
/// socket: the old pod of a rolling update). A view mounted by hand and a view of
/// another driver's keeper that share its control directory stay with their
/// processes, and nothing is logged as an error about them.
#[test]
fn a_keeper_adopts_only_views_its_predecessors_started() {
    let fx = Fixture::new();
    let ctl = fx.dir.path().join("ctl");
    let ctl = ctl.to_str().unwrap();
    let socket = fx.dir.path().join("keeper.sock");
    let started_by = |keeper: &std::path::Path, instance: &str| {
        vec![
            "env".to_string(),
            format!("MOUNTGROUP_KEEPER_SOCKET={}", keeper.display()),
            format!("MOUNTGROUP_VIEW_INSTANCE={instance}"),
        ]
    };
    let mnt = |name: &str| fx.subdir(name);
    let by_hand = Mounted::start(&fx.src, &mnt("hand"), &view_args(ctl, "gid=2000")).unwrap();
    let other = started_by(&fx.dir.path().join("other-driver.sock"), "other-1");
    let other: Vec<&str> = other.iter().map(String::as_str).collect();
    let of_another =
        Mounted::start_with(&other, &fx.src, &mnt("other"), &view_args(ctl, "gid=2001")).unwrap();
    let pred = started_by(&socket, "old-1");
    let pred: Vec<&str> = pred.iter().map(String::as_str).collect();
    let predecessors =
        Mounted::start_with(&pred, &fx.src, &mnt("pred"), &view_args(ctl, "gid=2002")).unwrap();
    let log = fx.dir.path().join("keeper.log");
    let mut keeper = std::process::Command::new(common::BIN)
        .args(["keeper", "--socket"])
        .arg(&socket)
        .args(["--control-dir", ctl])
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let ready = (0..3000).any(|_| {
        let ok = std::process::Command::new(common::BIN)
            .args(["keeper", "--probe", "--socket"])
            .arg(&socket)
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
            .success();
        if !ok {
            assert!(keeper.try_wait().unwrap().is_none(), "the keeper exited");
            thread::sleep(Duration::from_millis(20));
        }
        ok
    });
    let _keeper = Stop(keeper);
    assert!(ready, "the keeper never became ready");
    wait_gone(predecessors.pid());
    assert!(
        is_alive(by_hand.pid()),
        "a view mounted by hand was taken over"
    );
    assert!(
        is_alive(of_another.pid()),
        "another keeper's view was taken over"
    );
    let text = fs::read_to_string(&log).unwrap();
    assert!(!text.contains("cannot take a view over"), "{text}");
    assert_eq!(
        fs::metadata(fx.dir.path().join("pred")).unwrap().gid(),
        2002
    );
    // The view the keeper took over goes when its target is unmounted.
    let _ = rustix::mount::unmount(
        fx.dir.path().join("pred"),
        rustix::mount::UnmountFlags::DETACH,
    );
}

/// A process on the node that is not root reaches no view's control socket: the
/// control directory is root's, mode 0700 (docs/ARCHITECTURE.md, *Threat model*).
#[test]
fn a_user_other_than_root_reaches_no_control_socket() {
    let fx = Fixture::new();
    let ctl = fx.dir.path().join("ctl");
    let _view = Mounted::start(
        &fx.src,
        &fx.mnt,
        &view_args(ctl.to_str().unwrap(), "gid=2000"),
    )
    .unwrap();
    // The view binds its control socket once it serves: under a staged name
    // (`*.new<pid>`), renamed onto `*.sock`. Only the final name is waited for; the
    // staged one may be gone by the time it is connected to.
    let deadline = Instant::now() + Duration::from_secs(20);
    let sockets = loop {
        let found: Vec<_> = fs::read_dir(&ctl)
            .map(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "sock"))
                    .collect()
            })
            .unwrap_or_default();
        if !found.is_empty() || Instant::now() > deadline {
            break found;
        }
        thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(sockets.len(), 1, "{sockets:?}");
    // Debian's python3: one in root's home (pyenv's) would refuse another user with
    // "Permission denied" of its own, and prove nothing.
    let probe = format!(
        "/usr/bin/python3 -c \"import socket; socket.socket(socket.AF_UNIX).connect('{}')\"",
        sockets[0].display()
    );
    let r = common::run_as(1000, 1000, &[], &probe);
    assert!(
        !r.ok && r.stderr.contains("PermissionError: [Errno 13]"),
        "{r:?}"
    );
    // Root does reach it (the probe would prove nothing otherwise).
    let r = common::run_as(0, 0, &[], &probe);
    assert!(r.ok, "{r:?}");
}
