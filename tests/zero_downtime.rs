//! Views that outlive the driver: the node plugin as a Kubernetes node runs it
//! (deploy/node.yaml), with the gRPC server and the keeper (which runs the views) in
//! two "containers": the driver in a PID namespace made with `unshare --pid --fork`,
//! where the death of a namespace's first process makes the kernel kill everything
//! else in it, as a container runtime does; the keeper in the node's PID namespace
//! (`hostPID`) and a cgroup of its own, each view in a cgroup of its own under
//! `--views-cgroup`. While a workload checks every call and every byte in a published view, the
//! driver's process is SIGKILLed, its container is killed, the view's own process is
//! SIGKILLed, and the plugin is updated
//! the way a DaemonSet with `maxSurge: 1` does it (the new pod starts, then the old one
//! is stopped) to another binary. Zero failed calls, zero mismatches, and afterwards
//! only the new binary serves the view.

mod common;
#[path = "common/container.rs"]
mod container;
#[path = "common/driver.rs"]
mod driver;
#[path = "common/keeper.rs"]
mod keeper;
#[path = "common/workload.rs"]
mod workload;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use container::*;
use driver::*;
use keeper::*;
use rustix::process::{Pid, Signal, kill_process};
use workload::*;

/// Kills the driver's container (SIGKILL to its first process), starts it again, and
/// repeats the publish of `target`, which it must know as its own.
async fn kill_and_restart(d: &mut Driver, staging: &Path, target: &Path) {
    d.signal_first_process(Signal::KILL);
    d.restart();
    d.clients()
        .await
        .node
        .node_publish_volume(publish_req("vol", staging, target, "2000"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn views_survive_driver_kills_container_kills_and_a_rolling_update() {
    let f = Fixture::new();
    let root = f.dir.path();
    // Shared by the old and the new pod (a hostPath).
    let (v1, v2) = (binary_version(root, "v1"), binary_version(root, "v2"));
    let cg = TestCgroup::new();
    let views_cg = cg.child("views");
    let keepers = Keepers::deployed(&cg, root, &views_cg);
    let keeper_socket = keepers.socket().to_path_buf();

    // The old pod: keeper and driver, each in a container of its own.
    let mut keeper1 = keepers.start_binary("1", &v1);
    let mut d = Driver::start_kept(root, CONTAINER, &v1, &keeper_socket, &[]);
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    let target = root.join("target");
    c.create_stage_publish("vol", &staging, &target, "2000")
        .await;
    assert_eq!(fs::metadata(&target).unwrap().gid(), 2000);
    // As deployed: the view in a cgroup of its own under --views-cgroup.
    let cgroup = fs::read_to_string(format!("/proc/{}/cgroup", view_pid(&target))).unwrap();
    assert!(cgroup.contains("/views/view-"), "{cgroup}");

    let running = Running::start(&target, 100);
    let held = Arc::clone(&running.held);
    // Each loop through the system as it is now, a few rounds, between events.
    let settle = || running.settle(3);
    // Each event's window: from its start until the system is back as it was.
    let mut events: Vec<(&str, Instant, Instant)> = Vec::new();
    let mut at = Instant::now();
    settle();
    events.push(("none (baseline)", at, Instant::now()));

    // 1. The driver's process is SIGKILLed, and started again. It knows the view it
    // published: a repeated publish is idempotent.
    at = Instant::now();
    kill_and_restart(&mut d, &staging, &target).await;
    events.push(("1. driver process SIGKILLed, restarted", at, Instant::now()));
    settle();

    // 2. The driver's container is killed (every process in it at once: its first
    // process dies and the kernel kills the rest), and started again. (With one process
    // in the container, the same act as 1 seen from outside; a runtime kills the
    // container's cgroup.)
    at = Instant::now();
    kill_and_restart(&mut d, &staging, &target).await;
    events.push(("2. driver container killed, restarted", at, Instant::now()));
    settle();
    let before_update = view_processes(&target);
    assert_eq!(before_update.len(), 1, "{before_update:?}");
    assert_eq!(before_update[0].1, v1);

    // 4. The view's process is SIGKILLed (a bug, an OOM kill): the keeper holds its
    // connection and journal, and a new process recovers it on the same mount.
    at = Instant::now();
    kill_view(&target);
    // Recovered once a request is answered again. A file still open from before the
    // crash opens again (the kernel binds one passthrough backing file to an inode
    // while it is open: the recovered view must answer with the same one).
    fs::metadata(target.join("held.log")).unwrap();
    fs::File::open(target.join("held.log"))
        .expect("reopening a file held open across the view's crash");
    events.push(("4. view process SIGKILLed, recovered", at, Instant::now()));
    settle();
    assert_logged(
        || fs::read_to_string(root.join("keeper1.log")).unwrap(),
        "recovering it",
    );

    // 3. A rolling update to v2 with maxSurge 1: the new pod starts while the old one
    // runs; once its keeper is ready (it took every view over), the old pod is stopped.
    at = Instant::now();
    let mut keeper2 = keepers.start_binary("2", &v2);
    settle();
    keeper1.stop(Duration::from_secs(30));
    d.signal_first_process(Signal::TERM);
    let mut d2 = Driver::start_kept(root, CONTAINER, &v2, &keeper_socket, &[]);
    c = d2.clients().await;
    c.node
        .node_publish_volume(publish_req("vol", &staging, &target, "2000"))
        .await
        .unwrap();
    events.push(("3+5. rolling update to another binary", at, Instant::now()));
    settle();

    // 4. killed the view once.
    let done = running.finish_through_kills(1);
    // The longest call any loop saw during each event (bench/zero-downtime collects
    // these over several runs for docs/OPERATIONS.md; no bound is asserted here).
    let mut report = serde_json::Map::new();
    for (event, from, to) in &events {
        let stall = longest_stall(&done, *from, *to);
        eprintln!("stall during {event}: {stall:?}");
        report.insert(event.to_string(), (stall.as_secs_f64() * 1000.0).into());
    }
    append_report("ZERO_DOWNTIME_REPORT", report);

    // 5. Only the new binary serves the view; nothing was unmounted (the descriptor held
    // throughout still works and names the same file).
    let after = view_processes(&target);
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(after[0].1, v2, "the view is served by {:?}", after[0].1);
    assert_appended(&held, &done);
    let keeper2_log = fs::read_to_string(root.join("keeper2.log")).unwrap();
    assert!(keeper2_log.contains("view taken over"), "{keeper2_log}");

    // The new driver manages the view it never started: unpublishing ends it.
    drop(held);
    c.node
        .node_unpublish_volume(unpublish_req("vol", &target))
        .await
        .unwrap();
    assert!(!is_mounted(&target));
    keeper2.stop(Duration::from_secs(10));
    d2.signal_first_process(Signal::TERM);
}

#[test]
fn a_view_served_through_the_daemon_recovers_its_open_handles() {
    use mountgroup::volume::keeper::{Request, Response, ask};
    let f = Fixture::new();
    let root = f.dir.path();
    let control = root.join("run/views");
    let bin = Path::new(BIN);
    let cg = TestCgroup::new();
    let views_cg = cg.child("views");
    let keepers = Keepers::deployed(&cg, root, &views_cg);
    let socket = keepers.socket().to_path_buf();
    let mut keeper = keepers.start("1");
    // The probe in another container (PID namespace) does not count this keeper as its
    // own: the new pod of an update is not ready because the old pod's keeper is.
    let elsewhere = Command::new(CONTAINER[0])
        .args(&CONTAINER[1..])
        .arg(bin)
        .args(["keeper", "--probe", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(!elsewhere.status.success());
    let said = String::from_utf8_lossy(&elsewhere.stderr);
    assert!(said.contains("another container's"), "{said}");
    let _unmount = Unmount(f.mnt.clone());
    // Reads and writes of open files go through the daemon: recovered handles must
    // really work, not just be known.
    let args = [
        "mount".into(),
        f.src.clone().into_os_string(),
        f.mnt.clone().into_os_string(),
        "-o".into(),
        "gid=2000,passthrough=off".into(),
        "--control-dir".into(),
        control.clone().into_os_string(),
        "--log-file".into(),
        root.join("view.log").into_os_string(),
    ];
    match ask(
        &socket,
        &Request::Start {
            args: args.to_vec(),
        },
    )
    .unwrap()
    {
        Response::Started { .. } => {}
        other => panic!("{other:?}"),
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while !is_mounted(&f.mnt) {
        assert!(Instant::now() < deadline, "not mounted");
        thread::sleep(Duration::from_millis(5));
    }
    let running = Running::start(&f.mnt, 0);
    running.settle(3);
    kill_view(&f.mnt);
    running.settle(3);
    // A process killed while it recovers the view, before it has taken the
    // connection over, is a crash like another: the keeper recovers the view again
    // from what it holds (this takes the second and third recoveries). Killed after
    // it took the connection over, it is a kept view that dies, as the first kill.
    kill_view_and_its_recovery_before_it_holds(&f.mnt, &views_cg);
    let keeper_log = || keepers.log("1");
    assert!(
        keeper_log().contains("the process recovering the view was killed"),
        "{}",
        keeper_log()
    );
    // Every loop goes on well past the last recovery.
    running.settle(10);
    let held = Arc::clone(&running.held);
    let done = running.finish_through_kills(3);
    // Every append reached the disk, in order, through recovered handles (before
    // Linux 6.9, but for those a kill failed).
    assert_appended_in_order(
        &fs::read(f.src.join("held.log")).unwrap(),
        outcome(&done, "held file"),
    );
    let log = fs::read_to_string(root.join("view.log")).unwrap();
    assert!(
        log.contains("passthrough=false"),
        "the daemon served the I/O"
    );
    drop(held);

    // A view that keeps dying is not recovered forever: after three recoveries within
    // a minute, the keeper lets its connection go and the mount ends.
    let now = view_processes(&f.mnt);
    kill_process(Pid::from_raw(now[0].0 as i32).unwrap(), Signal::KILL).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let gone = view_processes(&f.mnt).is_empty();
        let dead =
            fs::metadata(&f.mnt).err().and_then(|e| e.raw_os_error()) == Some(libc::ENOTCONN);
        if gone && dead {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the view was recovered a fourth time"
        );
        thread::sleep(Duration::from_millis(10));
    }
    let keeper_log = keepers.log("1");
    assert!(keeper_log.contains("keeps dying"), "{keeper_log}");
    drop(_unmount);
    keeper.stop(Duration::from_secs(10));
}
