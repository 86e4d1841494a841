//! The cost of views on the users' shares against the raw mount: bench/run in the VM
//! tier, its work directory on the kernel client's mount of a share served in the VM
//! (tests/common/shares.rs), so that its `native` column is the raw network mount and
//! the views serve the same directory, with the options the driver's default publish
//! gives on that share (tests/shares.rs checks which). A job, not a test of
//! behaviour, run by hand:
//!
//!   cargo build --release && VM_TEST_LIMIT=3600 scripts/vm-test 6.12 --systemd shares_bench "--ignored JOB"
//!
//! JOB a part of a job's name that no other job's has (`azure_files`, `nfs_export`,
//! `the_shares_with_network_latency`, `the_shares_at_a_distance`, or one share's
//! latency job: `smb_with_network_latency`, `nfs_with_network_latency`,
//! `smb_at_a_distance`, `nfs_at_a_distance`): one at a time, each takes about 25
//! minutes under TCG (a share's latency job about half).
//!
//! Each share's results go to the tier's log directory, `bench-azure-files/` and
//! `bench-nfs/` (and, with a network's latency on the loopback, `bench-*-latency/` and
//! `bench-*-distant/`);
//! docs/BENCHMARKS.md (*On the users' shares*) has them. The servers
//! keep the files in the VM's memory (a tmpfs), so the data jobs' files are 64 MiB,
//! and a read is the server's page cache over the VM's loopback: TCG makes every
//! CPU-bound step (a FUSE round trip, the daemon's work, the server's) several times
//! dearer than on hardware, and there is no network latency to hide them.

#[path = "common/bench.rs"]
mod bench;
mod common;
#[path = "common/driver.rs"]
mod driver;
#[path = "common/kubelet.rs"]
mod kubelet;
#[path = "common/named.rs"]
mod named;
#[path = "common/shares.rs"]
mod shares;

use std::path::Path;
use std::time::{Duration, Instant};

use bench::*;
use common::*;
use shares::*;

/// bench/run on `share` with the views' options `view_options`, and `more` arguments.
fn bench_on(share: &Path, name: &str, view_options: &str, more: &[&str]) {
    let mut args = vec![
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
    ];
    args.extend_from_slice(more);
    bench_run(&share.join("bench"), name, &args);
}

/// The default publish's view options on the Azure-like share: a CIFS view without
/// records (`unrecorded_options` in src/volume/serve.rs).
const AZURE_VIEW: &str = "uid=0,file_mode=0664,dir_mode=0775,ownership=off";

/// The view options of a volume the driver makes on NFS: the native presentation,
/// acting as each caller on the share (`as_callers_options` in src/volume/serve.rs).
/// The bench's directory keeps the group a squashed root gives it (nobody's).
const NFS_VIEW: &str = "mode=native,disk_gid=65534,ownership=share";

/// A root-squashed knfsd export (its directory `nobody`'s) mounted as docs/DEPLOY.md
/// mounts NFS 4.2: the server and the mount, and the mount point.
fn nfs_share(f: &Fixture) -> (Knfsd, Unmount, std::path::PathBuf) {
    let export = f.subdir("export");
    chown(&export, 65534, 65534);
    let knfsd = Knfsd::start(&export, "rw,root_squash,no_subtree_check,fsid=4244");
    let share = f.subdir("share");
    let mount = mount_nfs(&export, &share, "");
    (knfsd, mount, share)
}

/// A network's latency on the VM's loopback while it lives (netem): every request to
/// the share's server waits `one_way` each way, as between machines, not only the
/// server's own work.
struct Latency;

impl Latency {
    fn on(one_way: &str) -> Latency {
        let added = std::process::Command::new("tc")
            .args([
                "qdisc", "add", "dev", "lo", "root", "netem", "delay", one_way,
            ])
            .status()
            .unwrap();
        assert!(added.success(), "tc qdisc add ... netem: {added}");
        Latency
    }
}

impl Drop for Latency {
    fn drop(&mut self) {
        let _ = std::process::Command::new("tc")
            .args(["qdisc", "del", "dev", "lo", "root"])
            .status();
    }
}

/// Samba as Azure Files, mounted as docs/DEPLOY.md does: the share keeps no records,
/// so the default publish is a CIFS-semantics view without records
/// (`unrecorded_options` in src/volume/serve.rs).
#[test]
#[ignore = "a benchmark job for the VM tier (see the top of this file)"]
fn bench_views_on_an_azure_files_like_share() {
    let f = Fixture::new();
    let s = SambaShare::start(&f, AZURE_FILES);
    bench_on(&s.share, "azure-files", AZURE_VIEW, &[]);
}

/// knfsd with root_squash, NFS 4.2 mounted as docs/DEPLOY.md does: views acting as
/// their callers, as the driver serves the volumes it makes there ([`NFS_VIEW`]).
#[test]
#[ignore = "a benchmark job for the VM tier (see the top of this file)"]
fn bench_views_on_a_root_squashed_nfs_export() {
    let f = Fixture::new();
    let (_knfsd, _mount, share) = nfs_share(&f);
    bench_on(&share, "nfs", NFS_VIEW, &[]);
}

/// The metadata jobs and the request count on both shares with a 1 ms round trip on
/// the VM's loopback (0.5 ms each way, netem), as between nodes of one zone: there a
/// request to the server costs what it would on a network, and the FUSE round trips
/// that TCG makes dear weigh less against it.
#[test]
#[ignore = "a benchmark job for the VM tier (see the top of this file)"]
fn bench_views_on_the_shares_with_network_latency() {
    latency_on_smb("500us", "-latency", &[]);
    latency_on_nfs("500us", "-latency", &[]);
}

/// [`bench_views_on_the_shares_with_network_latency`] on the Azure-like share alone.
#[test]
#[ignore = "a benchmark job for the VM tier (see the top of this file)"]
fn bench_views_on_smb_with_network_latency() {
    latency_on_smb("500us", "-latency", &[]);
}

/// [`bench_views_on_the_shares_with_network_latency`] on NFS alone.
#[test]
#[ignore = "a benchmark job for the VM tier (see the top of this file)"]
fn bench_views_on_nfs_with_network_latency() {
    latency_on_nfs("500us", "-latency", &[]);
}

/// The same with a 10 ms round trip (5 ms each way), a share farther away or busier:
/// there a FUSE round trip under TCG, about a millisecond, weighs a tenth of a
/// request, so the ratios come near what the request counts say (fewer files and
/// rounds, so that it ends within the tier's hour).
#[test]
#[ignore = "a benchmark job for the VM tier (see the top of this file)"]
fn bench_views_on_the_shares_at_a_distance() {
    latency_on_smb("5ms", "-distant", &FEWER);
    latency_on_nfs("5ms", "-distant", &FEWER);
}

/// [`bench_views_on_the_shares_at_a_distance`] on the Azure-like share alone.
#[test]
#[ignore = "a benchmark job for the VM tier (see the top of this file)"]
fn bench_views_on_smb_at_a_distance() {
    latency_on_smb("5ms", "-distant", &FEWER);
}

/// [`bench_views_on_the_shares_at_a_distance`] on NFS alone.
#[test]
#[ignore = "a benchmark job for the VM tier (see the top of this file)"]
fn bench_views_on_nfs_at_a_distance() {
    latency_on_nfs("5ms", "-distant", &FEWER);
}

/// The counts of the jobs at a distance.
const FEWER: [&str; 8] = [
    "--rounds",
    "2",
    "--nrfiles",
    "100",
    "--dir-files",
    "500",
    "--walk-files",
    "500",
];

/// The metadata jobs and the request count with a latency on the VM's loopback.
const LATENCY_JOBS: [&str; 2] = ["--jobs", "create,stat,delete,readdir,walk,walk-8k,requests"];

/// The latency jobs on the Azure-like share with `one_way` on the VM's loopback, the
/// results under `bench-azure-files{suffix}/`; `more` overrides the counts.
fn latency_on_smb(one_way: &str, suffix: &str, more: &[&str]) {
    let f = Fixture::new();
    let s = SambaShare::start(&f, AZURE_FILES);
    let _latency = Latency::on(one_way);
    let args = [&LATENCY_JOBS[..], more].concat();
    bench_on(&s.share, &format!("azure-files{suffix}"), AZURE_VIEW, &args);
}

/// The latency jobs on NFS, as [`latency_on_smb`], under `bench-nfs{suffix}/`.
fn latency_on_nfs(one_way: &str, suffix: &str, more: &[&str]) {
    let f = Fixture::new();
    let (_knfsd, _mount, share) = nfs_share(&f);
    let _latency = Latency::on(one_way);
    let args = [&LATENCY_JOBS[..], more].concat();
    bench_on(&share, &format!("nfs{suffix}"), NFS_VIEW, &args);
}

/// Many callers at once (issue 58): 32 threads, each in a directory of its own (as
/// pods of one volume each have their own files), over a 10 ms round trip on the
/// VM's loopback, against the raw mount and the driver's default view, one after the
/// other, two rounds. Each thread creates files for a few seconds; then, after the
/// kernel's caches are dropped, each stats its files once, and after another drop
/// opens, reads and closes each once. For each phase: the rate (calls a second, all
/// threads together) and its ratio to the raw mount's; how busy the VM's CPUs were;
/// the view's own CPU time per call; the view's threads at work (running, or waiting
/// in the share's client: its requests in flight), on average and at most; and the
/// LOOKUPs the view answered per call (a caller whose entry expired while it waited
/// looks its path up again).
/// The table goes to `bench-callers.md` in the tier's log directory.
#[test]
#[ignore = "a benchmark job for the VM tier (see the top of this file)"]
fn bench_many_callers_on_the_shares() {
    let mut table = String::from(
        "| share | target | round | phase | calls/s | ratio | CPUs busy | view CPU ms/call | in flight (mean, most) | view lookups/call |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    {
        let f = Fixture::new();
        let s = SambaShare::start(&f, AZURE_FILES);
        let _latency = Latency::on("5ms");
        callers_on(&f, &s.share, "azure-files", AZURE_VIEW, &mut table);
    }
    {
        let f = Fixture::new();
        let (_knfsd, _mount, share) = nfs_share(&f);
        let _latency = Latency::on("5ms");
        callers_on(&f, &share, "nfs", NFS_VIEW, &mut table);
    }
    eprintln!("{table}");
    if let Some(out) = std::env::var_os("MOUNTGROUP_VM_OUT") {
        std::fs::write(Path::new(&out).join("bench-callers.md"), &table).unwrap();
    }
}

const CALLERS: usize = 32;

/// The many-callers rounds on `share` (see [`bench_many_callers_on_the_shares`]),
/// each target's phases rows of `table`.
fn callers_on(f: &Fixture, share: &Path, name: &str, view_options: &str, table: &mut String) {
    let release = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/mountgroup");
    assert!(release.exists(), "cargo build --release first");
    // Mounted runs the tests' binary: exec the release one in its place.
    let script = format!("shift; exec {} \"$@\"", release.display());
    let wrapper = ["sh", "-c", script.as_str(), "sh"];
    for round in 0..2 {
        let mut raw: Vec<f64> = Vec::new();
        for (i, target) in ["raw", "view"].into_iter().enumerate() {
            let mnt = f.subdir(&format!("mnt-{round}-{i}"));
            let metrics = f.dir.path().join(format!("metrics-{round}.json"));
            let metrics_arg = metrics.display().to_string();
            let view = (target == "view").then(|| {
                let args = ["-o", view_options, "--metrics-file", &metrics_arg];
                Mounted::start_with(&wrapper, share, &mnt, &args).unwrap()
            });
            let top = if view.is_some() {
                mnt.clone()
            } else {
                share.to_path_buf()
            };
            let work = top.join(format!("callers-{round}-{i}"));
            std::fs::create_dir(&work).unwrap();
            let served = view.as_ref().map(|m| ViewProcess {
                pid: m.pid(),
                metrics: metrics.clone(),
            });
            let phases = callers_round(&work, served.as_ref());
            for (p, (phase, m)) in ["create", "stat", "open-read-close"]
                .iter()
                .zip(&phases)
                .enumerate()
            {
                let ratio = match raw.get(p) {
                    Some(r) => format!("{:.2}", m.rate / r),
                    None => {
                        raw.push(m.rate);
                        "1".into()
                    }
                };
                let (view_cpu, in_flight, lookups) = match &m.view {
                    Some(v) => (
                        format!("{:.2}", v.cpu_ms_per_call),
                        format!("{:.1}, {}", v.in_flight_mean, v.in_flight_most),
                        format!("{:.2}", v.lookups_per_call),
                    ),
                    None => ("".into(), "".into(), "".into()),
                };
                table.push_str(&format!(
                    "| {name} | {target} | {round} | {phase} | {:.0} | {ratio} | {:.2} | {view_cpu} | {in_flight} | {lookups} |\n",
                    m.rate, m.cpus_busy
                ));
            }
            drop(view);
        }
    }
}

/// One phase of a round: its rate, how busy the machine's CPUs were, and what the view
/// (if any) did.
struct Phase {
    rate: f64,
    cpus_busy: f64,
    view: Option<ViewWork>,
}

struct ViewWork {
    cpu_ms_per_call: f64,
    in_flight_mean: f64,
    in_flight_most: usize,
    lookups_per_call: f64,
}

/// The view process serving a round, and the file its counters go to each second.
struct ViewProcess {
    pid: u32,
    metrics: std::path::PathBuf,
}

impl ViewProcess {
    /// The LOOKUP requests the view has answered, once its counters have caught up
    /// with the calls made so far (they are written each second).
    fn lookups(&self) -> u64 {
        std::thread::sleep(std::time::Duration::from_millis(1200));
        let text = std::fs::read_to_string(&self.metrics).unwrap();
        let snapshot: serde_json::Value = serde_json::from_str(&text).unwrap();
        snapshot["ops"]["lookup"]["count"].as_u64().unwrap_or(0)
    }
}

/// The CPUs' busy and total time so far, in ticks (/proc/stat: idle and iowait are
/// not busy).
fn cpu_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .skip(1)
        .map(|t| t.parse().unwrap())
        .collect();
    let total: u64 = ticks.iter().sum();
    (total - ticks[3] - ticks[4], total)
}

/// The CPU time of process `pid` so far, in ticks (user and system).
fn process_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// The threads of `pid` at work: running, or in an uninterruptible wait (the share's
/// client); a worker waiting for a request sleeps interruptibly.
fn threads_at_work(pid: u32) -> usize {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("stat")).is_ok_and(|s| {
                let state = s[s.rfind(')').unwrap() + 2..].chars().next();
                matches!(state, Some('R' | 'D'))
            })
        })
        .count()
}

/// The unit of a process's CPU times in /proc (`USER_HZ`, 100 on Linux whatever the
/// kernel's tick).
const USER_HZ: f64 = 100.0;

/// Runs `calls`, which says how many calls it made, measuring it as [`Phase`] says.
fn measured(served: Option<&ViewProcess>, calls: impl FnOnce() -> usize) -> Phase {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    let done = AtomicBool::new(false);
    let view = served.map(|v| v.pid);
    let lookups0 = served.map(ViewProcess::lookups);
    let (cpu0, view0) = (cpu_ticks(), view.map(process_ticks));
    let start = Instant::now();
    let samples = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut samples = Vec::new();
            while !done.load(Ordering::Relaxed) {
                if let Some(pid) = view {
                    samples.push(threads_at_work(pid));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            samples
        });
        let n = calls();
        done.store(true, Ordering::Relaxed);
        (n, sampler.join().unwrap())
    });
    let (n, samples) = samples;
    let secs = start.elapsed().as_secs_f64();
    let (cpu1, view1) = (cpu_ticks(), view.map(process_ticks));
    let cpus_busy = (cpu1.0 - cpu0.0) as f64 / (cpu1.1 - cpu0.1).max(1) as f64;
    let tick_ms = 1000.0 / USER_HZ;
    let lookups = served.zip(lookups0).map(|(v, l0)| v.lookups() - l0);
    Phase {
        rate: n as f64 / secs,
        cpus_busy,
        view: view1.zip(view0).map(|(t1, t0)| ViewWork {
            cpu_ms_per_call: (t1 - t0) as f64 * tick_ms / n.max(1) as f64,
            in_flight_mean: samples.iter().sum::<usize>() as f64 / samples.len().max(1) as f64,
            in_flight_most: samples.iter().copied().max().unwrap_or(0),
            lookups_per_call: lookups.unwrap_or(0) as f64 / n.max(1) as f64,
        }),
    }
}

/// One round of [`CALLERS`] threads in `work`, served by the view process `view` if
/// any: the creates, stats and open-read-closes, measured.
fn callers_round(work: &Path, view: Option<&ViewProcess>) -> [Phase; 3] {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};
    let dirs: Vec<_> = (0..CALLERS).map(|c| work.join(format!("c{c}"))).collect();
    for d in &dirs {
        std::fs::create_dir(d).unwrap();
    }
    let drop_caches = || std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    // Creates for 5 s, at most 200 a caller.
    let made: Vec<AtomicUsize> = dirs.iter().map(|_| AtomicUsize::new(0)).collect();
    let creates = measured(view, || {
        let start = Instant::now();
        std::thread::scope(|s| {
            for (d, n) in dirs.iter().zip(&made) {
                s.spawn(move || {
                    let mut i = 0;
                    while i < 200 && start.elapsed() < Duration::from_secs(5) {
                        std::fs::File::create(d.join(format!("f{i}"))).unwrap();
                        i += 1;
                    }
                    n.store(i, Ordering::Relaxed);
                });
            }
        });
        made.iter().map(|n| n.load(Ordering::Relaxed)).sum()
    });
    let made: Vec<usize> = made.iter().map(|n| n.load(Ordering::Relaxed)).collect();
    let total: usize = made.iter().sum();
    let each = |op: &(dyn Fn(&Path) + Sync)| {
        drop_caches();
        measured(view, || {
            std::thread::scope(|s| {
                for (d, n) in dirs.iter().zip(&made) {
                    s.spawn(move || {
                        for i in 0..*n {
                            op(&d.join(format!("f{i}")));
                        }
                    });
                }
            });
            total
        })
    };
    let stats = each(&|p| {
        std::fs::metadata(p).unwrap();
    });
    let reads = each(&|p| {
        std::fs::read(p).unwrap();
    });
    [creates, stats, reads]
}

/// What a volume on a share the driver mounts costs a pod's start, against the raw
/// mount of the same share: CreateVolume (the controller mounts the share, makes the
/// directory, unmounts it), NodeStageVolume (the share's mount), NodePublishVolume
/// (the view), each timed over `ROUNDS` volumes, beside a `mount` and `umount` of the
/// same share by hand. On Samba as Azure Files and on a root-squashed NFS 4.1 export;
/// the medians go to the log directory's `stage-publish.md`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark job for the VM tier (see the top of this file)"]
async fn bench_stage_and_publish_on_the_shares() {
    use kubelet::{KubeletDirs, Pod, Pvc, StorageClass};
    use named::*;
    const ROUNDS: usize = 9;
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1000.0
    };
    let f = Fixture::new();
    let served = f.subdir("served");
    let samba = Samba::start(&f.dir.path().join("samba"), &served);
    let export = f.subdir("export");
    chown(&export, 65534, 65534);
    let _knfsd = Knfsd::start(&export, "rw,root_squash,no_subtree_check,fsid=4254");
    let port = format!("port={}", samba.port);
    let smb_source = format!("//{}/vol", samba.host());
    let smb = StorageClass::new(
        &[("source", &smb_source)],
        &["ip=127.0.0.1", &port, "vers=3.1.1", "mfsymlinks"],
    );
    let export_path = export.to_string_lossy().to_string();
    let nfs = StorageClass::new(
        &[("server", "127.0.0.1"), ("share", &export_path)],
        &["nfsvers=4.1"],
    );
    let smb_secret: std::collections::HashMap<String, String> =
        [("username", "root"), ("password", "pw")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    let raw = f.subdir("raw");
    let mut table = String::from(
        "| share | CreateVolume | NodeStageVolume | NodePublishVolume | raw mount | raw umount |\n|---|---|---|---|---|---|\n",
    );
    for (name, class, secret) in [
        ("SMB (Samba as Azure Files)", &smb, &smb_secret),
        ("NFS 4.1 (knfsd, root_squash)", &nfs, &Default::default()),
    ] {
        let root = f.subdir(&format!("node-{}", &name[..3]));
        let d = driver::Driver::start_with_metrics_and(&root, &[]);
        let mut c = d.clients().await;
        let dirs = KubeletDirs {
            root: root.join("kubelet"),
        };
        let pod = Pod::new("app", Some(4242));
        let (mut create, mut stage, mut publish, mut mount, mut umount) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for i in 0..ROUNDS {
            let t = Instant::now();
            let pv = provision(&mut c, class, &Pvc::new(&format!("v{i}")), secret)
                .await
                .unwrap();
            create.push(t.elapsed());
            let t = Instant::now();
            c.node
                .node_stage_volume(kubelet::stage(&dirs, &pv, &pod, secret))
                .await
                .unwrap();
            stage.push(t.elapsed());
            let t = Instant::now();
            let p = Published::publish(&mut c, &dirs, pv, &pod).await.unwrap();
            publish.push(t.elapsed());
            p.unpublish_unstage(&mut c).await;
            let t = Instant::now();
            let m = if class.parameters.contains_key("source") {
                mount_cifs(
                    &samba,
                    &raw,
                    "uid=0,gid=0,file_mode=0700,dir_mode=0700,mfsymlinks",
                )
            } else {
                mount_nfs_vers(&export, &raw, "4.1", "")
            };
            mount.push(t.elapsed());
            let t = Instant::now();
            drop(m);
            umount.push(t.elapsed());
        }
        table.push_str(&format!(
            "| {name} | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms |\n",
            median(create),
            median(stage),
            median(publish),
            median(mount),
            median(umount)
        ));
    }
    eprintln!("{table}");
    let out = std::path::PathBuf::from(
        std::env::var_os("MOUNTGROUP_VM_OUT").expect("run in the VM tier"),
    );
    std::fs::write(out.join("stage-publish.md"), table).unwrap();
}
