//! `transport=ring`: a view served over FUSE over io_uring. Every request but FORGET
//! and INTERRUPT comes in a ring entry; the view is what it is over `/dev/fuse`; and
//! the trade is kept honest: a ring view is not handed over, and when its process
//! dies, its callers (one of them with a request the dead process held) get an error
//! rather than wait for good.
//!
//! The kernel allows rings only with the fuse module's `enable_uring=Y`; each test sets
//! what it needs and puts the machine's value back.

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
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use common::*;
use container::*;
use driver::*;
use keeper::*;
use mountgroup::csi::pb::volume_capability::access_mode::Mode;
use rustix::process::Signal;
use workload::{Running, outcome};

const G: u32 = 4242;
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// The fuse module's `enable_uring`, set for one test (one at a time) and put back.
struct EnableUring {
    _setting: Setting,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl EnableUring {
    fn set(on: bool) -> EnableUring {
        static SERIAL: Mutex<()> = Mutex::new(());
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        EnableUring {
            _setting: Setting::set(ENABLE_URING, if on { "Y" } else { "N" }),
            _serial: serial,
        }
    }
}

/// A kernel setting (a /sys or /proc/sys file) written for a while and put back.
struct Setting {
    path: &'static str,
    before: String,
}

impl Setting {
    fn set(path: &'static str, value: &str) -> Setting {
        let before = fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("{path}: {e} (FUSE over io_uring needs Linux 6.14+)"))
            .trim()
            .to_string();
        fs::write(path, value).unwrap();
        Setting { path, before }
    }
}

impl Drop for Setting {
    fn drop(&mut self) {
        let _ = fs::write(self.path, &self.before);
    }
}

/// The errors a request of a ring view whose process died ends with: `ENOTCONN` once
/// the connection is gone (fs/fuse/dev.c `fuse_get_req`), `ECONNABORTED` for one the
/// abort ends (fs/fuse/dev_uring.c `fuse_uring_stop_fuse_req_end`), `ECANCELED` for one
/// on its way into an entry when the process died (`fuse_uring_send_in_task` with
/// `IO_URING_F_TASK_DEAD`).
fn ends_with_the_connection(errno: Option<i32>) -> bool {
    matches!(
        errno,
        Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED)
    )
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

#[test]
fn a_ring_view_serves_its_requests_over_io_uring_with_the_same_results() {
    let _uring = EnableUring::set(true);
    let f = Fixture::new();
    fs::write(f.src.join("old"), b"on the disk before").unwrap();
    // Without passthrough, reads and writes come to the view as well, with their
    // payloads (up to max_write, 1 MiB, in one ring entry).
    let (m, metrics) = mount_counted(&f, &format!("gid={G},transport=ring,passthrough=off"));
    let mnt = &m.mountpoint;
    // The mount answers once INIT is; the rings are registered, and the line written,
    // just after.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !m.log_text().contains("serving over io_uring") {
        assert!(std::time::Instant::now() < deadline, "{}", m.log_text());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    assert_eq!(fs::read(mnt.join("old")).unwrap(), b"on the disk before");
    assert_eq!(fs::metadata(mnt.join("old")).unwrap().gid(), G);
    // Sizes around the entry's payload buffer: one byte, a page, exactly 1 MiB, and a
    // file the kernel writes and reads in several requests.
    for (name, len) in [
        ("one", 1),
        ("page", 4096),
        ("mib", 1 << 20),
        ("big", (3 << 20) + 17),
    ] {
        let data = pattern(len, len as u8);
        fs::write(mnt.join(name), &data).unwrap();
        assert_eq!(
            fs::read(f.src.join(name)).unwrap(),
            data,
            "{name} on the disk"
        );
        assert_eq!(
            fs::read(mnt.join(name)).unwrap(),
            data,
            "{name} through the view"
        );
        assert_eq!(fs::metadata(mnt.join(name)).unwrap().gid(), G);
    }
    // A listing larger than one READDIRPLUS reply, names in the payload.
    let dir = mnt.join("many");
    fs::create_dir(&dir).unwrap();
    for i in 0..1500 {
        fs::File::create(dir.join(format!("entry-with-a-longish-name-{i:05}"))).unwrap();
    }
    let mut names: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 1500);
    assert_eq!(names[1499], "entry-with-a-longish-name-01499");
    // Names in both directions, links, attributes, errors.
    fs::rename(mnt.join("one"), dir.join("moved")).unwrap();
    std::os::unix::fs::symlink("moved", dir.join("link")).unwrap();
    assert_eq!(fs::read_link(dir.join("link")).unwrap(), Path::new("moved"));
    assert_eq!(fs::read(dir.join("link")).unwrap(), pattern(1, 1));
    fs::remove_file(mnt.join("page")).unwrap();
    assert_eq!(errno(fs::metadata(mnt.join("page"))), libc::ENOENT);
    assert_eq!(errno(fs::create_dir(&dir)), libc::EEXIST);
    sh(&format!(
        "setfattr -n user.colour -v blue '{}'",
        mnt.join("mib").display()
    ));
    assert!(
        sh(&format!(
            "getfattr -n user.colour '{}'",
            mnt.join("mib").display()
        ))
        .contains("blue")
    );
    let mut file = fs::OpenOptions::new()
        .append(true)
        .open(mnt.join("big"))
        .unwrap();
    file.write_all(b"tail").unwrap();
    file.sync_all().unwrap();
    drop(file);
    let mut back = Vec::new();
    fs::File::open(mnt.join("big"))
        .unwrap()
        .read_to_end(&mut back)
        .unwrap();
    assert_eq!(&back[back.len() - 4..], b"tail");

    // Every request the view counted came over a ring: only FORGETs (and INTERRUPTs,
    // which it does not count) still come through /dev/fuse.
    let snap = metrics_snapshot(&metrics, std::time::SystemTime::now());
    let ring = snap["ring_requests"].as_u64().unwrap();
    let counted: u64 = snap["ops"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(op, _)| *op != "forget")
        .map(|(_, v)| v["count"].as_u64().unwrap())
        .sum();
    assert!(counted > 3000, "{snap}");
    assert!(
        ring >= counted,
        "{ring} ring requests for {counted} counted: {snap}"
    );
    assert_eq!(m.stop(), Some(0));
}

#[test]
fn a_dead_ring_view_fails_its_callers_instead_of_keeping_them_waiting() {
    let _uring = EnableUring::set(true);
    let f = Fixture::new();
    fs::write(f.src.join("a"), b"x").unwrap();
    let m = f.mount(&format!("gid={G},transport=ring"));
    let mnt = m.mountpoint.clone();
    assert_eq!(fs::read(mnt.join("a")).unwrap(), b"x");

    // Not handed over: a second daemon on the mountpoint is refused, and the first
    // serves on.
    let err = match Mounted::take_over(&f.src, &mnt, &["-o", &format!("gid={G},transport=ring")]) {
        Ok(_) => panic!("a ring view was taken over"),
        Err(e) => e,
    };
    assert!(err.contains("busy"), "{err}");
    assert_eq!(fs::read(mnt.join("a")).unwrap(), b"x");

    // A request in a ring entry of a stopped daemon, which then dies: its caller gets
    // an error (the connection ends with the daemon), not a wait for good.
    let pid = rustix::process::Pid::from_raw(m.pid() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
    // kill(2) returns once one thread is told; the others stop when that one runs,
    // which on a busy machine can be after a request was answered.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !every_thread_stopped(m.pid()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon did not stop"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let path = mnt.join("never-looked-up");
    std::thread::spawn(move || {
        let _ = tx.send(fs::metadata(&path).map(|_| ()));
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(rx.try_recv().is_err(), "the stopped daemon answered");
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    let held = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the caller of a dead ring view's request still waits");
    let e = held.expect_err("a dead view answered");
    assert!(ends_with_the_connection(e.raw_os_error()), "{e}");
    // And one asked after: the same errors (while the dying process's ring is torn
    // down, its idle entries can still take it and cancel it).
    let after = fs::metadata(mnt.join("a")).expect_err("a dead view answered");
    assert!(ends_with_the_connection(after.raw_os_error()), "{after}");
    drop(m);
    assert!(!is_mounted(&mnt));
}

/// Whether every thread of `pid` is in a group stop (state `T` in its task's stat).
fn every_thread_stopped(pid: u32) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        fs::read_to_string(t.path().join("stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('T'))
        })
    })
}

#[test]
fn a_ring_view_needs_the_kernel_to_allow_rings_and_says_so() {
    let _uring = EnableUring::set(false);
    let f = Fixture::new();
    let err = match Mounted::start(&f.src, &f.mnt, &["-o", "transport=ring"]) {
        Ok(_) => panic!("mounted a ring view with enable_uring=N"),
        Err(e) => e,
    };
    assert!(
        err.contains("transport=ring") && err.contains("enable_uring"),
        "{err}"
    );
    assert!(!is_mounted(&f.mnt));
}

#[test]
fn a_ring_view_where_io_uring_is_forbidden_is_refused_before_anything_is_mounted() {
    let _uring = EnableUring::set(true);
    // `kernel.io_uring_disabled=2`: io_uring_setup fails with EPERM for everyone
    // (io_uring/io_uring.c `io_uring_allowed`).
    let _forbidden = Setting::set("/proc/sys/kernel/io_uring_disabled", "2");
    let f = Fixture::new();
    let err = match Mounted::start(&f.src, &f.mnt, &["-o", "transport=ring"]) {
        Ok(_) => panic!("mounted a ring view where io_uring is forbidden"),
        Err(e) => e,
    };
    assert!(
        err.contains("cannot set up an io_uring") && err.contains("io_uring_disabled"),
        "{err}"
    );
    assert!(!is_mounted(&f.mnt));
}

/// A rolling update of a node that serves a ring view beside a kept one, as deployed
/// (the keeper's container a cgroup of its own in the host's PID namespace, each view in
/// a cgroup under `--views-cgroup`). The new keeper takes the kept view over; the ring
/// view cannot be handed over, so the old keeper leaves it to run on its own and stops
/// at once rather than wait out its grace for a view no one can take; the ring view's
/// process serves throughout (no call fails), a new driver leaves it alone, and its
/// unpublish ends it.
#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_update_leaves_a_ring_view_to_its_process_and_does_not_wait_for_it() {
    let _uring = EnableUring::set(true);
    let f = Fixture::new();
    let root = f.dir.path();
    let cg = TestCgroup::new();
    let bin = Path::new(BIN);
    let keepers = Keepers::deployed(&cg, root, &cg.child("views"));
    let socket = keepers.socket();
    let start_keeper = |n: &str| keepers.start(n);
    let keeper_log = |n: &str| keepers.log(n);
    let mut keeper1 = start_keeper("1");
    let mut d = Driver::start_kept(root, CONTAINER, bin, socket, &[]);
    let mut c = d.clients().await;
    let (kept, ring) = (root.join("target-kept"), root.join("target-ring"));
    let (staging_kept, staging_ring) = (f.subdir("staging-kept"), f.subdir("staging-ring"));
    let _guards = [&kept, &ring, &staging_kept, &staging_ring].map(|p| Unmount(p.clone()));
    c.create_stage_publish("kept", &staging_kept, &kept, "2000")
        .await;
    let mut publish_ring = publish_req("ring", &staging_ring, &ring, "3000");
    publish_ring.volume_capability = Some(mount_cap(
        &["transport=ring"],
        "3000",
        Mode::SingleNodeMultiWriter,
    ));
    c.create_stage_publish_with("ring", &staging_ring, publish_ring.clone())
        .await;
    assert_eq!(fs::metadata(&ring).unwrap().gid(), 3000);
    let ring_pid = view_pid(&ring);

    let running_kept = Running::start(&kept, 0);
    let running_ring = Running::start(&ring, 50);
    let held_ring = std::sync::Arc::clone(&running_ring.held);
    std::thread::sleep(Duration::from_millis(400));

    // The update (maxSurge 1): the new pod's keeper is ready once it took over what it
    // can; then the old pod is stopped with the grace a runtime gives it.
    let mut keeper2 = start_keeper("2");
    keeper1.stop(Duration::from_secs(30));
    let said = keeper_log("1");
    assert!(
        said.contains("keeper stopped"),
        "the old keeper did not stop by itself within 30 s (it waited for the ring view):\n{said}"
    );
    assert!(
        said.contains("cannot be handed over") && said.contains(ring.to_str().unwrap()),
        "the old keeper does not say which view it leaves running:\n{said}"
    );
    assert!(
        keeper_log("2").contains("view taken over"),
        "{}",
        keeper_log("2")
    );
    // The ring view is served by the process that always served it.
    assert_eq!(view_pid(&ring), ring_pid, "the ring view's process changed");
    d.signal_first_process(Signal::TERM);
    let metrics = ["--metrics-addr", "127.0.0.1:0", "--log-format", "json"];
    let mut d2 = Driver::start_kept(root, CONTAINER, bin, socket, &metrics);
    c = d2.clients().await;
    c.node
        .node_publish_volume(publish_ring)
        .await
        .expect("a repeated publish of the live ring view");
    assert_eq!(
        view_pid(&ring),
        ring_pid,
        "the new driver served the ring view again"
    );
    std::thread::sleep(Duration::from_millis(400));
    // Its requests came over the ring, and the metrics say so per view (each view
    // writes its snapshot every second).
    let ring_requests = |text: &str, vol: &str| {
        sample(
            text,
            &format!("mountgroup_view_ring_requests_total{{volume_id=\"{vol}\""),
        )
    };
    let addr = d2.metrics_addr();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = scrape(&addr);
        if ring_requests(&text, "ring").unwrap_or(0.0) > 100.0 {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no ring requests counted:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(ring_requests(&text, "kept"), Some(0.0), "{text}");

    // No call on either view failed across the update, and every append through the
    // descriptor held throughout reached the disk.
    running_kept.finish();
    let done = running_ring.finish();
    let h = outcome(&done, "held file");
    assert_eq!(held_ring.metadata().unwrap().len(), h.rounds * 512);
    drop(held_ring);

    // The new driver manages the ring view it never started: unpublishing ends it.
    for (vol, t) in [("kept", &kept), ("ring", &ring)] {
        c.node
            .node_unpublish_volume(unpublish_req(vol, t))
            .await
            .unwrap();
        assert!(!is_mounted(t));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{ring_pid}")).exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the ring view's process outlived its unpublish"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    keeper2.stop(Duration::from_secs(10));
    d2.signal_first_process(Signal::TERM);
}
