//! The cost of views on CephFS against the raw mount: bench/run, in the VM tier, with
//! its work directory on the kernel client's mount of a one-node Ceph
//! (tests/common/ceph.rs), so that its `native` column is the raw CephFS mount and the
//! views serve the same directory. A job, not a test of behaviour, run by hand:
//!
//!   cargo build --release && VM_TEST_LIMIT=3600 scripts/vm-test 6.12 --systemd ceph_bench --ignored
//!
//! (up to half an hour under TCG: `VM_TEST_LIMIT` lifts the tier's 15 minutes a
//! program.)
//! Each release's results (results.md, results.json) go to the tier's log directory,
//! `bench-cephfs-16.2/` and `bench-cephfs-20.2/`. docs/CAPACITY.md and docs/DEPLOY.md
//! cite them. TCG makes every CPU-bound step (a FUSE round trip, the daemon's work)
//! several times dearer than on hardware, and the cluster's network is the VM's
//! loopback: the ratios are the run's, not a node's.

#[path = "common/ceph.rs"]
mod ceph;
mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use ceph::*;
use common::*;

/// One release at a time: a run beside another would time both.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn bench_on(release: Release, name: &str) {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert!(
        repo.join("target/release/mountgroup").exists(),
        "bench/run times the release binary: cargo build --release first"
    );
    let out = PathBuf::from(
        std::env::var_os("MOUNTGROUP_VM_OUT")
            .expect("run in the VM tier, which names its log directory (MOUNTGROUP_VM_OUT)"),
    )
    .join(format!("bench-cephfs-{name}"));
    let f = Fixture::new();
    let ceph = Ceph::start(&f.dir.path().join("ceph"), release);
    let share = f.subdir("share");
    let _share = ceph.mount(&share);
    let ran = Command::new(repo.join("bench/run"))
        .arg("--no-build")
        .arg("--work")
        .arg(share.join("bench"))
        .arg("--out")
        .arg(&out)
        .args([
            "--skip-mount-cost",
            // The metadata jobs: the data jobs' 512 MiB files, one per target, would
            // fill the OSD's memstore (2 GiB) and take the better part of an hour
            // under TCG.
            "--jobs",
            "create,stat,delete,readdir",
            "--rounds",
            "3",
            "--nrfiles",
            "300",
            "--dir-files",
            "2000",
        ])
        .status()
        .unwrap();
    assert!(ran.success(), "bench/run: {ran}");
    eprintln!(
        "{}",
        fs::read_to_string(out.join("results.md")).unwrap_or_default()
    );
}

#[test]
#[ignore = "a benchmark job for the VM tier (see the top of this file)"]
fn bench_views_on_cephfs_16_2() {
    bench_on(Release::Installed, "16.2");
}

#[test]
#[ignore = "a benchmark job for the VM tier (see the top of this file)"]
fn bench_views_on_cephfs_20_2() {
    bench_on(Release::newer(), "20.2");
}
