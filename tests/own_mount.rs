//! A view unmounts only its own mount, and only when it is the one ending the session
//! (xfstests generic/610 then generic/611 found the opposite): a view whose mount was
//! unmounted by someone else, and whose process ends later, must leave alone whatever
//! is mounted at its old mount point by then, or a pod's writes land on the host disk
//! under the successor's mount point.

mod common;

use std::time::Duration;

use common::*;
use rustix::process::{Pid, Signal, kill_process};

#[test]
fn a_view_that_ends_after_its_unmount_leaves_its_successor_mounted() {
    let f = Fixture::new();
    std::fs::write(f.src.join("data"), "shared").unwrap();
    let mut first = f.mount("gid=4242");
    assert_eq!(owner(&f.mnt).1, 4242);
    // The first view's process is held until its successor is mounted, as a daemon
    // busy releasing a large file's extents is (the kernel's umount does not wait).
    let pid = Pid::from_raw(first.pid() as i32).unwrap();
    kill_process(pid, Signal::STOP).unwrap();
    // umount(2) itself: umount(8) would first statfs the mount, which waits for the
    // held daemon.
    rustix::mount::unmount(&f.mnt, rustix::mount::UnmountFlags::empty()).unwrap();
    let second = Mounted::start(&f.src, &f.mnt, &["-o", "gid=5353"]).expect("the successor mounts");
    assert_eq!(owner(&f.mnt).1, 5353);
    kill_process(pid, Signal::CONT).unwrap();
    // The first view sees its connection end and exits on its own.
    let code = first.wait_exit(Duration::from_secs(20));
    assert_eq!(code, Some(0), "{}", first.log_text());
    // Its successor still serves: nothing unmounted it.
    assert!(
        is_mounted(&f.mnt),
        "the successor was unmounted: {}",
        first.log_text()
    );
    assert_eq!(
        owner(&f.mnt).1,
        5353,
        "the successor serves the mount point"
    );
    drop(second);
}

#[test]
fn a_view_told_to_stop_after_a_lazy_unmount_leaves_its_successor_mounted() {
    let f = Fixture::new();
    let mut first = f.mount("gid=4242");
    // Kept alive by an open file, the first view outlives a lazy unmount of its mount
    // point; a successor is mounted there; then the first is told to stop.
    let held = std::fs::File::open(&f.mnt).unwrap();
    rustix::mount::unmount(&f.mnt, rustix::mount::UnmountFlags::DETACH).unwrap();
    let second = Mounted::start(&f.src, &f.mnt, &["-o", "gid=5353"]).expect("the successor mounts");
    kill_process(Pid::from_raw(first.pid() as i32).unwrap(), Signal::TERM).unwrap();
    // It logs that it stops; whatever it unmounts, it does so then.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !first.log_text().contains("SIGTERM") {
        assert!(std::time::Instant::now() < deadline, "{}", first.log_text());
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        is_mounted(&f.mnt),
        "the successor was unmounted: {}",
        first.log_text()
    );
    assert_eq!(owner(&f.mnt).1, 5353);
    // Its last user gone, the first view's session ends.
    drop(held);
    assert_eq!(
        first.wait_exit(Duration::from_secs(20)),
        Some(0),
        "{}",
        first.log_text()
    );
    assert!(
        is_mounted(&f.mnt),
        "the successor was unmounted: {}",
        first.log_text()
    );
    drop(second);
}
