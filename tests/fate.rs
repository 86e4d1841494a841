//! Each view's fate is its own. The node plugin as deployed: the keeper's container is
//! a cgroup of its own in the host's PID namespace (the pod has `hostPID`), the driver's
//! a PID namespace and a cgroup; each view runs in a cgroup of its own under
//! `--views-cgroup`. While a workload checks every call and every byte in two published
//! views:
//!
//! - the keeper's container is killed outright (`cgroup.kill`: every process in it at
//!   once, as a runtime kills a container and as the kernel kills an OOM group) and a
//!   new one is started: it adopts both views;
//! - one view's cgroup is killed, as the OOM killer kills a cgroup with its own
//!   `memory.max`: that view is recovered, the other is not touched;
//! - a view is stopped with SIGSTOP: the keeper notices that it answers nothing and
//!   replaces it.
//!
//! Zero failed calls, zero mismatches.

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
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use container::*;
use driver::*;
use keeper::*;
use mountgroup::csi::pb::volume_capability::access_mode::Mode;
use rustix::process::{Pid, Signal, kill_process};
use workload::*;

/// The cgroup directory `pid` is in (from the root of this machine's cgroup2 mount).
fn cgroup_dir(pid: u32) -> PathBuf {
    let s = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let rel = s.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
    cgroup2_root().join(rel.trim_start_matches('/'))
}

/// The parent process of `pid`.
fn parent(pid: u32) -> u32 {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

const MEMORY_MAX: u64 = 512 << 20;

/// Keepers whose views each run in a cgroup of their own under `views`, bounded to
/// [`MEMORY_MAX`], with `extra` arguments.
fn bounded_keepers<'a>(
    cg: &'a TestCgroup,
    root: &Path,
    views: &Path,
    extra: &[&str],
) -> Keepers<'a> {
    let mut args = vec![
        "--views-cgroup".to_string(),
        views.to_str().unwrap().into(),
        "--view-memory-max".into(),
        MEMORY_MAX.to_string(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    Keepers::new(cg, root, &args)
}

#[tokio::test(flavor = "multi_thread")]
async fn views_outlive_the_keepers_container_a_neighbours_oom_kill_and_a_hang() {
    let f = Fixture::new();
    let root = f.dir.path();
    let cg = TestCgroup::new();
    let bin = Path::new(BIN);
    let views_cg = cg.child("views");
    let keepers = bounded_keepers(&cg, root, &views_cg, &["--hang-timeout", "2"]);
    let socket = keepers.socket();
    let mut keeper1 = keepers.start("1");
    // A probe from outside the keeper's container (its cgroup) does not count it, even
    // in one PID namespace: the old pod's keeper does not make a new pod ready.
    let elsewhere = Command::new(bin)
        .args(["keeper", "--probe", "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    assert!(!elsewhere.status.success());
    let said = String::from_utf8_lossy(&elsewhere.stderr);
    assert!(said.contains("another container's"), "{said}");

    let mut d = Driver::start_kept(root, CONTAINER, bin, socket, &[]);
    let mut c = d.clients().await;
    let mut targets = Vec::new();
    let mut guards = Vec::new();
    for (vol, gid) in [("a", "2000"), ("b", "3000")] {
        let staging = f.subdir(&format!("staging-{vol}"));
        let target = root.join(format!("target-{vol}"));
        guards.push(Unmount(target.clone()));
        guards.push(Unmount(staging.clone()));
        c.create_stage_publish(vol, &staging, &target, gid).await;
        assert_eq!(
            fs::metadata(&target).unwrap().gid(),
            gid.parse::<u32>().unwrap()
        );
        targets.push(target);
    }
    let (ta, tb) = (targets[0].clone(), targets[1].clone());
    // Each view in a cgroup of its own, below --views-cgroup, bounded where the node
    // lets its memory be bounded.
    for t in [&ta, &tb] {
        let dir = cgroup_dir(view_pid(t));
        assert_eq!(dir.parent(), Some(views_cg.as_path()), "{dir:?}");
    }
    let keeper1_log = || keepers.log("1");
    let controllers = fs::read_to_string(views_cg.join("cgroup.controllers")).unwrap();
    if controllers.split_whitespace().any(|c| c == "memory") {
        let max = fs::read_to_string(cgroup_dir(view_pid(&ta)).join("memory.max")).unwrap();
        assert_eq!(max.trim(), MEMORY_MAX.to_string());
    } else {
        // This machine's memory controller is on a v1 hierarchy: the keeper says so.
        assert!(
            keeper1_log().contains("the memory controller is not available here"),
            "{}",
            keeper1_log()
        );
    }

    let running_a = Running::start(&ta, 100);
    let running_b = Running::start(&tb, 0);
    let held_a = std::sync::Arc::clone(&running_a.held);
    // Each loop through the system as it is now, a few rounds, between events.
    let settle = || {
        running_a.settle(3);
        running_b.settle(3);
    };
    let mut events: Vec<(&str, Instant, Instant)> = Vec::new();
    let mut at = Instant::now();
    settle();
    events.push(("none (baseline)", at, Instant::now()));

    // 1. The keeper's container is killed outright: every view goes on serving, and a
    // new keeper adopts them all.
    at = Instant::now();
    let before = (view_pid(&ta), view_pid(&tb));
    keeper1.kill();
    assert_eq!(
        (view_pid(&ta), view_pid(&tb)),
        before,
        "a view died with the keeper"
    );
    let mut keeper2 = keepers.start("2");
    let k2 = keeper2.main_pid();
    events.push((
        "keeper container killed, new keeper adopts",
        at,
        Instant::now(),
    ));
    for t in [&ta, &tb] {
        let pid = view_pid(t);
        assert_eq!(parent(pid), k2, "{t:?} is not the new keeper's");
        assert_eq!(cgroup_dir(pid).parent(), Some(views_cg.as_path()));
    }
    let keeper2_log = || keepers.log("2");
    assert!(
        keeper2_log().contains("view taken over"),
        "{}",
        keeper2_log()
    );
    settle();

    // 2. One view's cgroup is killed, as the OOM killer kills a cgroup that reached its
    // memory.max: that view is recovered; the other view's process is not touched.
    at = Instant::now();
    let (pa, pb) = (view_pid(&ta), view_pid(&tb));
    let killed = cgroup_dir(pa);
    kill_cgroup(&killed);
    wait_replaced(&ta, pa, Duration::from_secs(20));
    fs::metadata(ta.join("held.log")).unwrap();
    events.push((
        "one view OOM-killed (its cgroup), recovered",
        at,
        Instant::now(),
    ));
    assert_eq!(view_pid(&tb), pb, "the neighbour was touched");
    // The dead view's cgroup goes with it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while killed.exists() {
        assert!(Instant::now() < deadline, "{killed:?} left behind");
        thread::sleep(Duration::from_millis(20));
    }
    assert_logged(keeper2_log, "recovering it");
    settle();

    // 3. A view is stopped (SIGSTOP): it answers nothing, and after --hang-timeout the
    // keeper kills it and recovers it like a dead one.
    at = Instant::now();
    let pb = view_pid(&tb);
    kill_process(Pid::from_raw(pb as i32).unwrap(), Signal::STOP).unwrap();
    wait_replaced(&tb, pb, Duration::from_secs(30));
    fs::metadata(tb.join("held.log")).unwrap();
    events.push(("one view stopped (SIGSTOP), replaced", at, Instant::now()));
    assert!(
        keeper2_log().contains("answers nothing"),
        "{}",
        keeper2_log()
    );
    settle();

    // a was killed (2.) and b (3.): on kernels before 6.9 each may have failed a call.
    let done_b = with_logs_on_failure(root, || running_b.finish_through_kills(1));
    let done_a = with_logs_on_failure(root, || running_a.finish_through_kills(1));
    let mut report = serde_json::Map::new();
    for (event, from, to) in &events {
        let (sa, sb) = (
            longest_stall(&done_a, *from, *to),
            longest_stall(&done_b, *from, *to),
        );
        eprintln!("stall during {event}: view a {sa:?}, view b {sb:?}");
        report.insert(
            event.to_string(),
            serde_json::json!([sa.as_secs_f64() * 1000.0, sb.as_secs_f64() * 1000.0]),
        );
    }
    append_report("FATE_REPORT", report);
    // Every append through the descriptor held throughout reached the disk.
    assert_appended(&held_a, &done_a);
    drop(held_a);

    c = d.clients().await;
    for (vol, t) in [("a", &ta), ("b", &tb)] {
        c.node
            .node_unpublish_volume(unpublish_req(vol, t))
            .await
            .unwrap();
        assert!(!is_mounted(t));
    }
    keeper2.stop(Duration::from_secs(10));
    d.signal_first_process(Signal::TERM);
    drop(guards);
}

/// `check`, and where it fails, the logs of the driver, the keepers and the views under
/// `root` (the fixture goes with the failure, and a rare failure in the VM tier is
/// read from its output alone).
fn with_logs_on_failure<T>(root: &Path, check: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(check)) {
        Ok(v) => v,
        Err(e) => {
            for dir in [root.to_path_buf(), root.join("state/views")] {
                for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let p = entry.path();
                    if p.extension().is_some_and(|x| x == "log") {
                        let text = fs::read_to_string(&p).unwrap_or_default();
                        eprintln!("===== {}\n{text}", p.display());
                    }
                }
            }
            std::panic::resume_unwind(e)
        }
    }
}

/// One `key value` line of a cgroup's `memory.events` (counted for it and below it).
fn memory_event(cgroup: &Path, key: &str) -> u64 {
    fs::read_to_string(cgroup.join("memory.events"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {cgroup:?}/memory.events"))
}

/// Lowers `cgroup`'s `memory.max` below what it holds: the kernel reclaims what it can,
/// then its OOM killer kills in that cgroup (mm/memcontrol.c `memory_max_write`), as
/// when a process grows past its bound.
fn squeeze(cgroup: &Path) {
    fs::write(cgroup.join("memory.max"), "1M").unwrap();
}

/// The kernel's own OOM killer, where cgroup v2 has the memory controller (the VM
/// tier's kernels, and every node with systemd; on this machine it is on cgroup v1,
/// and the keeper says its views are not bounded). A view whose memory goes past its
/// `memory.max` is killed alone and recovered while its neighbour serves; an OOM of
/// the keeper's container, whose cgroup kubelet gives `memory.oom.group=1` (cgroup v2,
/// since Kubernetes 1.28: pkg/kubelet/kuberuntime/kuberuntime_container_linux.go
/// `generateLinuxContainerResources`), kills the keeper whole and takes no view. Zero failed calls
/// in either view (from Linux 6.9: before it, a call the killed view was answering
/// fails, `finish_through_kills`).
#[tokio::test(flavor = "multi_thread")]
async fn the_oom_killer_takes_one_view_or_the_keepers_container_and_never_a_neighbour() {
    let f = Fixture::new();
    let root = f.dir.path();
    let cg = TestCgroup::new();
    let bin = Path::new(BIN);
    let views_cg = cg.child("views");
    let keepers = bounded_keepers(&cg, root, &views_cg, &[]);
    let socket = keepers.socket();
    let start_keeper = |n: &str| keepers.start(n);
    let keeper_log = |n: &str| keepers.log(n);
    let keeper_cg = |n: &str| keepers.cgroup(n);
    let mut keeper1 = start_keeper("1");
    if !cg.has_memory() {
        assert!(
            keeper_log("1").contains("the memory controller is not available here"),
            "{}",
            keeper_log("1")
        );
        keeper1.stop(Duration::from_secs(10));
        return;
    }
    let mut d = Driver::start_kept(root, CONTAINER, bin, socket, &[]);
    let mut c = d.clients().await;
    let (ta, tb) = (root.join("target-a"), root.join("target-b"));
    let mut guards = Vec::new();
    for (vol, gid, t) in [("a", "2000", &ta), ("b", "3000", &tb)] {
        let staging = f.subdir(&format!("staging-{vol}"));
        guards.push(Unmount(t.clone()));
        guards.push(Unmount(staging.clone()));
        c.create_stage_publish(vol, &staging, t, gid).await;
    }
    let (a_cg, b_cg) = (cgroup_dir(view_pid(&ta)), cgroup_dir(view_pid(&tb)));
    for dir in [&a_cg, &b_cg] {
        let max = fs::read_to_string(dir.join("memory.max")).unwrap();
        assert_eq!(max.trim(), MEMORY_MAX.to_string(), "{dir:?}");
    }
    let running_a = Running::start(&ta, 100);
    let running_b = Running::start(&tb, 100);
    let settle = || {
        running_a.settle(3);
        running_b.settle(3);
    };
    settle();

    // 1. View a past its bound: the OOM killer kills it, in its cgroup only.
    let (pa, pb) = (view_pid(&ta), view_pid(&tb));
    let kills = memory_event(&views_cg, "oom_kill");
    squeeze(&a_cg);
    assert_eq!(
        memory_event(&views_cg, "oom_kill"),
        kills + 1,
        "one OOM kill"
    );
    wait_replaced(&ta, pa, Duration::from_secs(20));
    assert_eq!(view_pid(&tb), pb, "the neighbour was touched");
    assert_logged(|| keeper_log("1"), "recovering it");
    let new_a = cgroup_dir(view_pid(&ta));
    assert_ne!(new_a, a_cg, "the recovered view has a cgroup of its own");
    assert_eq!(
        fs::read_to_string(new_a.join("memory.max")).unwrap().trim(),
        MEMORY_MAX.to_string()
    );
    settle();

    // 2. The keeper's container past its own bound, as one OOM group: the kernel kills
    // every process in it, and no view.
    let (pa, pb) = (view_pid(&ta), view_pid(&tb));
    let k1 = keeper_cg("1");
    fs::write(k1.join("memory.oom.group"), "1").unwrap();
    squeeze(&k1);
    // Linux 5.17 counts group kills (`oom_group_kill`); before, each process the group
    // kill took is an `oom_kill`, and the cgroup empties alike.
    let events = fs::read_to_string(k1.join("memory.events")).unwrap();
    let counter = if events.contains("oom_group_kill") {
        "oom_group_kill"
    } else {
        "oom_kill"
    };
    assert!(memory_event(&k1, counter) >= 1, "a group kill: {events}");
    assert!(
        emptied(&k1),
        "the keeper's container outlived its OOM group kill"
    );
    keeper1.kill();
    assert_eq!((view_pid(&ta), view_pid(&tb)), (pa, pb), "a view died");
    let mut keeper2 = start_keeper("2");
    for t in [&ta, &tb] {
        assert_eq!(parent(view_pid(t)), keeper2.main_pid(), "{t:?}");
    }
    assert!(
        keeper_log("2").contains("view taken over"),
        "{}",
        keeper_log("2")
    );
    settle();

    // Every call answered (from 6.9; before it, one per loop of the killed view may
    // fail, `finish_through_kills`), every append through the descriptors held
    // throughout on the disk.
    let (held_a, held_b) = (
        std::sync::Arc::clone(&running_a.held),
        std::sync::Arc::clone(&running_b.held),
    );
    let done_a = with_logs_on_failure(root, || running_a.finish_through_kills(1));
    let done_b = with_logs_on_failure(root, || running_b.finish());
    for (done, held) in [(&done_a, &held_a), (&done_b, &held_b)] {
        assert_appended(held, done);
    }
    drop((held_a, held_b));
    c = d.clients().await;
    for (vol, t) in [("a", &ta), ("b", &tb)] {
        c.node
            .node_unpublish_volume(unpublish_req(vol, t))
            .await
            .unwrap();
        assert!(!is_mounted(t));
    }
    keeper2.stop(Duration::from_secs(10));
    d.signal_first_process(Signal::TERM);
    drop(guards);
}

/// What a keeper started under `prefix` with `--views-cgroup cgroup` says when it
/// refuses to start (it must refuse).
fn keeper_refusal(prefix: &[&str], cgroup: &Path) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = command_under(prefix, BIN)
        .args(["keeper", "--socket"])
        .arg(dir.path().join("k.sock"))
        .arg("--control-dir")
        .arg(dir.path().join("views"))
        .arg("--views-cgroup")
        .arg(cgroup)
        .output()
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_views_cgroup_that_is_not_cgroup2_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let said = keeper_refusal(&[], &dir.path().join("cg"));
    assert!(
        said.contains("--views-cgroup") && said.contains("cgroup v2"),
        "{said}"
    );
}

#[test]
fn a_keeper_in_a_pid_namespace_of_its_own_refuses_views_cgroup() {
    // A pod without hostPID: the views would leave the container's cgroup but still
    // die with its PID namespace.
    let cg = TestCgroup::new();
    let said = keeper_refusal(CONTAINER, &cg.child("views"));
    assert!(
        said.contains("--views-cgroup") && said.contains("hostPID"),
        "{said}"
    );
}

/// `serve` alone (its own keeper, as `scripts/run` starts it) with volume `v`
/// published for group 2000 with the mount options `options`: the runtime, the
/// driver, the target, and guards that unmount the target and its staging.
fn served_alone(
    f: &Fixture,
    options: &[&str],
) -> (tokio::runtime::Runtime, Driver, PathBuf, (Unmount, Unmount)) {
    let root = f.dir.path();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let d = Driver::start(root);
    let staging = f.subdir("staging");
    let target = root.join("target");
    let guards = (Unmount(target.clone()), Unmount(staging.clone()));
    let mut publish = publish_req("v", &staging, &target, "2000");
    publish.volume_capability = Some(mount_cap(options, "2000", Mode::SingleNodeMultiWriter));
    rt.block_on(async {
        let mut c = d.clients().await;
        c.create_stage_publish_with("v", &staging, publish).await;
    });
    (rt, d, target, guards)
}

/// The driver's log says it recovered the view; unpublishing `v` then unmounts it.
fn recovered_then_unpublished(rt: &tokio::runtime::Runtime, d: &Driver, target: &Path) {
    assert_logged(|| d.log_text(), "recovering it");
    rt.block_on(async {
        let mut c = d.clients().await;
        c.node
            .node_unpublish_volume(unpublish_req("v", target))
            .await
            .unwrap();
    });
    assert!(!is_mounted(target));
}

#[test]
fn serve_alone_recovers_a_view_that_dies() {
    // `serve` without a keeper container (scripts/run): its own keeper recovers the
    // view on its mount, as a keeper container does.
    let f = Fixture::new();
    let (rt, d, target, _guards) = served_alone(&f, &[]);
    let running = Running::start(&target, 20);
    running.settle(3);
    kill_view(&target);
    fs::metadata(target.join("held.log")).unwrap();
    running.settle(3);
    running.finish_through_kills(1);
    recovered_then_unpublished(&rt, &d, &target);
}

/// The node ids a walk's listings give the kernel are journaled before each listing's
/// reply (their lines go out together, `fs/inode.rs` `JournalBatch`): a view killed
/// right after a walk is recovered knowing every id the kernel holds. Descriptors
/// opened `O_PATH` through the listed names (cached for ten minutes: no request names
/// them again) are asked for their attributes after the recovery, which the kernel
/// does by the listed id alone (`attr_timeout=0`: fs/fuse/dir.c fuse_getattr →
/// fuse_update_get_attr sends GETATTR for expired attributes), with no retry by name
/// as an open's `ESTALE` would get (fs/namei.c do_filp_open walks again with
/// LOOKUP_REVAL, which sends a LOOKUP). The entries are made on the backing, so that
/// the listings and not creates give their ids.
#[test]
fn a_view_killed_after_a_walk_knows_every_node_id_it_listed() {
    use std::os::fd::AsFd;
    let f = Fixture::new();
    let (rt, d, target, _guards) = served_alone(&f, &["entry_timeout=600", "attr_timeout=0"]);
    let backing = f.dir.path().join("share").join("volumes").join("v");
    let dirs = ["a", "b", "c", "d"];
    for dir in dirs {
        fs::create_dir(backing.join(dir)).unwrap();
        for i in 0..200 {
            fs::write(backing.join(dir).join(format!("f{i:03}")), dir).unwrap();
        }
    }
    // A walk, as find makes it: each directory listed whole, every entry stated.
    let mut held = Vec::new();
    for dir in dirs {
        for e in fs::read_dir(target.join(dir)).unwrap() {
            let path = e.unwrap().path();
            assert_eq!(fs::symlink_metadata(&path).unwrap().gid(), 2000);
            let fd = rustix::fs::open(
                &path,
                rustix::fs::OFlags::PATH | rustix::fs::OFlags::NOFOLLOW,
                rustix::fs::Mode::empty(),
            )
            .unwrap();
            held.push((path, fd));
        }
    }
    assert_eq!(held.len(), 4 * 200);
    kill_view(&target);
    for (path, fd) in &held {
        if let Err(e) = rustix::fs::fstat(fd.as_fd()) {
            panic!(
                "{} after the view was recovered: {e} (its listed node id was not journaled)",
                path.display()
            );
        }
    }
    drop(held);
    recovered_then_unpublished(&rt, &d, &target);
}

/// Sends `SIGCONT` to a stopped share's daemon when dropped, so that a failing test
/// leaves nothing waiting on it.
struct Thaw(u32);

impl Drop for Thaw {
    fn drop(&mut self) {
        let _ = kill_process(Pid::from_raw(self.0 as i32).unwrap(), Signal::CONT);
    }
}

/// A view whose share stops answering (its calls wait on it, as on an NFS `hard` mount
/// whose server is away) is not killed by the keeper: it waits as the share's own
/// callers wait, the keeper says so, and once the share answers the same process serves
/// every waiting call. NodeGetVolumeStats answers meanwhile, in time, that the share
/// does not answer, and normal once it does. The share is a FUSE mount whose daemon
/// the test stops, so that the view's workers wait in the kernel's FUSE client as they
/// would in NFS's.
#[tokio::test(flavor = "multi_thread")]
async fn a_view_waiting_on_its_share_is_left_serving() {
    let f = Fixture::new();
    let root = f.dir.path();
    let cg = TestCgroup::new();
    let keepers = Keepers::new(&cg, root, &["--hang-timeout".into(), "1".into()]);
    let share = f.subdir("share");
    let share_view = Mounted::start(&f.subdir("disk"), &share, &["-o", "gid=0"]).unwrap();
    let mut keeper = keepers.start("1");
    let bin = Path::new(BIN);
    let socket = keepers.socket().to_str().unwrap();
    let args = ["--share-key-file", "none", "--keeper-socket", socket];
    let mut d = Driver::start_in(root, share.clone(), CONTAINER, bin, &args);
    let mut c = d.clients().await;
    let (staging, target) = (f.subdir("staging"), root.join("target"));
    let guards = [Unmount(target.clone()), Unmount(staging.clone())];
    c.create_stage_publish("a", &staging, &target, "2000").await;
    let pid = view_pid(&target);

    kill_process(
        Pid::from_raw(share_view.pid() as i32).unwrap(),
        Signal::STOP,
    )
    .unwrap();
    let thaw = Thaw(share_view.pid());
    // Callers looking up names of their own, each holding a worker in the share; the
    // keeper's check waits on the share as well, in the kernel's permission check of
    // the view's root, whose attributes the view reads from the share once they have
    // expired (fs/fuse/dir.c `fuse_permission`), whatever workers are free.
    let callers: Vec<_> = (0..16)
        .map(|i| {
            let path = target.join(format!("name{i}"));
            thread::spawn(move || fs::symlink_metadata(path).err().map(|e| e.kind()))
        })
        .collect();
    assert_logged_within(
        || keepers.log("1"),
        "waits on its share: leaving it serving",
        Duration::from_secs(30),
    );
    // Kubelet is told, in time, twice (the second while the first one's measurement
    // still waits on the share).
    for _ in 0..2 {
        let (abnormal, message) = volume_condition(&mut c, "a", &target).await;
        assert!(
            abnormal && message.contains("the share does not answer"),
            "{message}"
        );
    }
    // Many rounds of the check (every quarter of a second) later, still the same.
    thread::sleep(Duration::from_secs(2));
    assert_eq!(view_pid(&target), pid, "{}", keepers.log("1"));
    assert!(
        !keepers.log("1").contains("killing it"),
        "{}",
        keepers.log("1")
    );

    drop(thaw);
    for caller in callers {
        assert_eq!(caller.join().unwrap(), Some(std::io::ErrorKind::NotFound));
    }
    assert_logged_within(
        || keepers.log("1"),
        "the view answers again",
        Duration::from_secs(30),
    );
    assert_eq!(view_pid(&target), pid);
    let (abnormal, message) = volume_condition(&mut c, "a", &target).await;
    assert!(!abnormal, "{message}");
    c.node
        .node_unpublish_volume(unpublish_req("a", &target))
        .await
        .unwrap();
    keeper.stop(Duration::from_secs(10));
    d.signal_first_process(Signal::TERM);
    drop(guards);
}
