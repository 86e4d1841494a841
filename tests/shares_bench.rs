//! The cost of views on the users' shares against the raw mount: bench/run in the VM
//! tier, its work directory on the kernel client's mount of a share served in the VM
//! (tests/common/shares.rs), so that its `native` column is the raw network mount and
//! the views serve the same directory, with the options the driver's default publish
//! gives on that share (tests/shares.rs checks which). A job, not a test of
//! behaviour, run by hand:
//!
//!   cargo build --release && VM_TEST_LIMIT=3600 scripts/vm-test 6.12 --systemd shares_bench --ignored
//!
//! Each share's results go to the tier's log directory, `bench-azure-files/` and
//! `bench-nfs/`; docs/BENCHMARKS.md (*On the users' shares*) has them. The servers
//! keep the files in the VM's memory (a tmpfs), so the data jobs' files are 64 MiB,
//! and a read is the server's page cache over the VM's loopback: TCG makes every
//! CPU-bound step (a FUSE round trip, the daemon's work, the server's) several times
//! dearer than on hardware, and there is no network latency to hide them.

#[path = "common/bench.rs"]
mod bench;
mod common;
#[path = "common/shares.rs"]
mod shares;

use std::path::Path;

use bench::*;
use common::*;
use shares::*;

/// bench/run on `share` with the views' options `view_options`.
fn bench_on(share: &Path, name: &str, view_options: &str) {
    bench_run(
        &share.join("bench"),
        name,
        &[
            "--view-options",
            view_options,
            "--file-mib",
            "64",
            "--rounds",
            "3",
            "--runtime",
            "5",
            "--nrfiles",
            "300",
            "--dir-files",
            "2000",
            "--walk-files",
            "2000",
        ],
    );
}

/// Samba as Azure Files, mounted as docs/DEPLOY.md does: the share keeps no records,
/// so the default publish is a CIFS-semantics view without records
/// (`unrecorded_options` in src/volume/serve.rs).
#[test]
#[ignore = "a benchmark job for the VM tier (see the top of this file)"]
fn bench_views_on_an_azure_files_like_share() {
    let f = Fixture::new();
    let s = SambaShare::start(&f, AZURE_FILES);
    bench_on(
        &s.share,
        "azure-files",
        "uid=0,file_mode=0664,dir_mode=0775,ownership=off",
    );
}

/// knfsd with root_squash, NFS 4.2 mounted as docs/DEPLOY.md does: records in
/// `user.*` attributes (`ownership=emulate-user`).
#[test]
#[ignore = "a benchmark job for the VM tier (see the top of this file)"]
fn bench_views_on_a_root_squashed_nfs_export() {
    let f = Fixture::new();
    let export = f.subdir("export");
    chown(&export, 65534, 65534);
    let _knfsd = Knfsd::start(&export, "rw,root_squash,no_subtree_check,fsid=4244");
    let share = f.subdir("share");
    let _share = mount_nfs(&export, &share, "");
    bench_on(&share, "nfs", "ownership=emulate-user");
}
