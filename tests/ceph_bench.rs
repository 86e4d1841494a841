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

#[path = "common/bench.rs"]
mod bench;
#[path = "common/ceph.rs"]
mod ceph;
mod common;

use bench::*;
use ceph::*;
use common::*;

fn bench_on(release: Release, name: &str) {
    let f = Fixture::new();
    let ceph = Ceph::start(&f.dir.path().join("ceph"), release);
    let share = f.subdir("share");
    let _share = ceph.mount(&share);
    bench_run(
        &share.join("bench"),
        &format!("cephfs-{name}"),
        &[
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
        ],
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
