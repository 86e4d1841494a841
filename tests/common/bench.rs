//! bench/run in the VM tier, its work directory on a share the test serves, so that
//! its `native` column is the raw mount and the views serve the same directory; for
//! the benchmark jobs tests/ceph_bench.rs and tests/shares_bench.rs.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One run at a time: a run beside another would time both.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs bench/run with `work` as its work directory and `args` besides, without
/// building (the VM's tree is read-only), its results (results.md, results.json) in
/// the tier's log directory under `bench-NAME/`; prints its table.
pub fn bench_run(work: &Path, name: &str, args: &[&str]) {
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
    .join(format!("bench-{name}"));
    let ran = Command::new(repo.join("bench/run"))
        .arg("--no-build")
        .arg("--work")
        .arg(work)
        .arg("--out")
        .arg(&out)
        .arg("--skip-mount-cost")
        .args(args)
        .status()
        .unwrap();
    assert!(ran.success(), "bench/run: {ran}");
    eprintln!(
        "{}",
        fs::read_to_string(out.join("results.md")).unwrap_or_default()
    );
}
