//! The kernel contract: what mountgroup says a kernel gives it, checked on the kernel
//! it runs on. Each test takes the branch the running kernel calls for and asserts
//! it, so the same program passes on every kernel users run: `scripts/vm-test` boots
//! Debian's 6.1 and 6.12 and Ubuntu's 5.15 and runs it there (docs/KERNELS.md), and `.ci/run` runs it on
//! this machine's kernel as well.
//!
//! - the node's probe (`mountgroup_node_fuse_idmap`) says what a container runtime
//!   finds when it idmaps a view;
//! - an option the kernel cannot give (`passthrough=on`, `transport=ring`) is refused
//!   by name, with the kernel's release, and leaves nothing mounted;
//! - a pod in a user namespace is published only where its runtime can idmap the
//!   view, and refused with the reason elsewhere;
//! - a native volume is native wherever its share can be idmapped, and a FUSE view
//!   with the same presentation where it cannot.

#[path = "common/apiserver.rs"]
mod apiserver;
mod common;
#[path = "common/driver.rs"]
mod driver;
#[path = "common/keeper.rs"]
mod keeper;
#[path = "common/userns.rs"]
mod userns;

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use driver::*;

const G: u32 = 4242;
const MEMBER: u32 = 1000;

/// What the daemon says when it refuses to serve with `options` (it must refuse), and
/// that it left nothing mounted. A refusal can come before the mount or from the
/// kernel's INIT, after it: either way the mountpoint is empty afterwards.
fn refusal(f: &Fixture, options: &str) -> String {
    let said = match Mounted::start(&f.src, &f.mnt, &["-o", options]) {
        Err(e) => e,
        Ok(mut m) => {
            let code = m.wait_exit(Duration::from_secs(20));
            assert!(
                code.is_some_and(|c| c != 0),
                "{options}: served ({code:?}): {}",
                m.log_text()
            );
            m.log_text()
        }
    };
    assert!(!is_mounted(&f.mnt), "{options}: a mount was left behind");
    said
}

#[test]
fn the_probe_says_what_a_runtime_finds_when_it_idmaps_a_view() {
    let kernel = kernel_fuse();
    // The releases the flags came with upstream (and in Debian's builds of them).
    assert_eq!(kernel.idmap, kernel_at_least(6, 12), "{kernel:?}");
    assert_eq!(kernel.passthrough, kernel_at_least(6, 9), "{kernel:?}");
    let f = Fixture::new();
    let _m = f.mount(&format!("gid={G}"));
    let pod = userns::PodUserns::new(5);
    let ctr = f.subdir("container-root");
    match userns::idmapped_volume(&pod, &f.mnt, &ctr, "data") {
        Ok(v) => {
            assert!(kernel.idmap, "idmapped a view the probe said could not be");
            // The pod's root, with the fsGroup's ID of the pod's range, sees the group.
            fs::write(f.src.join("a"), "x").unwrap();
            let (_, gid, _) = userns::seen(&pod, 0, &[], &v.path.join("a")).unwrap();
            assert_eq!(gid, G, "the group as the pod sees it");
        }
        Err(e) => {
            assert!(!kernel.idmap, "the probe said views can be idmapped: {e}");
            assert!(
                e.contains("EINVAL") || e.contains("Invalid argument"),
                "{e}"
            );
        }
    }
}

#[test]
fn passthrough_on_mounts_where_the_kernel_offers_it_and_is_refused_by_name_where_not() {
    let f = Fixture::new();
    if kernel_fuse().passthrough {
        let m = f.mount(&format!("gid={G},passthrough=on"));
        fs::write(f.mnt.join("x"), "y").unwrap();
        assert_eq!(fs::read(f.src.join("x")).unwrap(), b"y");
        assert!(
            m.log_text().contains("passthrough=true"),
            "{}",
            m.log_text()
        );
    } else {
        // Named by the feature and the release it came in, which this kernel's INIT
        // did not offer (a distribution kernel may have it earlier or not at all).
        let said = refusal(&f, &format!("gid={G},passthrough=on"));
        assert!(
            said.contains("passthrough=on")
                && said.contains("FUSE_PASSTHROUGH")
                && said.contains("Linux 6.9"),
            "{said}"
        );
    }
    // `auto` serves on every kernel, through the kernel where it can.
    let g = Fixture::new();
    let m = g.mount(&format!("gid={G},passthrough=auto"));
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(g.mnt.join("blob"), &data).unwrap();
    assert_eq!(fs::read(g.mnt.join("blob")).unwrap(), data);
    let said = format!("passthrough={}", kernel_fuse().passthrough);
    assert!(m.log_text().contains(&said), "{said}: {}", m.log_text());
}

#[test]
fn transport_ring_is_refused_by_name_where_the_kernel_has_no_ring() {
    let f = Fixture::new();
    let param = fs::read_to_string("/sys/module/fuse/parameters/enable_uring");
    match param.as_deref().map(str::trim) {
        // Before Linux 6.14 (or without CONFIG_FUSE_IO_URING): no switch to turn on.
        Err(_) => {
            let said = refusal(&f, "transport=ring");
            let release = mountgroup::sys::kernel_release();
            assert!(
                said.contains("no FUSE over io_uring")
                    && said.contains("Linux 6.14")
                    && said.contains(&release)
                    && !said.contains("set /sys/module/fuse/parameters/enable_uring"),
                "{said}"
            );
        }
        // The switch is there and off: turning it on is the way (tests/ring.rs has
        // the rest).
        Ok("N") => {
            let said = refusal(&f, "transport=ring");
            assert!(said.contains("enable_uring to Y"), "{said}");
        }
        Ok(_) => {
            let m = f.mount(&format!("gid={G},transport=ring"));
            fs::write(f.mnt.join("x"), "y").unwrap();
            assert!(m.log_text().contains("ring=true"), "{}", m.log_text());
        }
    }
}

/// On a kernel whose FUSE cannot be idmapped, a pod with `hostUsers: false` cannot
/// use a view: its runtime's idmapped mount would fail with EINVAL and leave the pod
/// in ContainerCreating with an error that names no cause. The driver asks the API
/// server (a stand-in answering as kube-apiserver does) and refuses the publish with
/// the reason; a pod in the node's namespace is published as ever.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_in_a_user_namespace_is_published_only_where_its_runtime_can_idmap_the_view() {
    use apiserver::Known;
    let kernel = kernel_fuse();
    let f = Fixture::new();
    let root = f.dir.path();
    let api = apiserver::ApiServer::start(
        &f.subdir("api"),
        HashMap::from([
            ("team/host-pod".to_string(), Known::Pod(None)),
            ("team/userns-pod".to_string(), Known::Pod(Some(false))),
        ]),
    )
    .await;
    let api_args = api.args();
    let api_args: Vec<&str> = api_args.iter().map(String::as_str).collect();
    let d = Driver::start_with_metrics_and(root, &api_args);
    let addr = d.metrics_addr();
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    c.create_and_stage("vol", &staging).await;
    let (host_t, userns_t) = (root.join("t-host"), root.join("t-userns"));
    let _guards = [&host_t, &userns_t].map(|t| Unmount(t.clone()));

    let mut r = publish_flags("vol", &staging, &host_t, &[], &G.to_string(), false);
    for_pod(&mut r, "host-pod");
    c.node.node_publish_volume(r).await.unwrap();
    assert_eq!(fs::metadata(&host_t).unwrap().gid(), G);

    let mut r = publish_flags("vol", &staging, &userns_t, &[], &G.to_string(), false);
    for_pod(&mut r, "userns-pod");
    let published = c.node.node_publish_volume(r).await;
    let node = sample(&scrape(&addr), "mountgroup_node_fuse_idmap");
    assert_eq!(node, Some(f64::from(u8::from(kernel.idmap))));
    if kernel.idmap {
        published.unwrap();
        let pod = userns::PodUserns::new(5);
        let ctr = f.subdir("container-root");
        userns::idmapped_volume(&pod, &userns_t, &ctr, "data")
            .expect("the pod's runtime idmaps its view");
    } else {
        let release = mountgroup::sys::kernel_release();
        let said = published.expect_err("published a view no runtime can idmap");
        assert_eq!(said.code(), tonic::Code::FailedPrecondition, "{said:?}");
        let message = said.message();
        assert!(
            message.contains("team/userns-pod runs in a user namespace")
                && message.contains("hostUsers: true")
                && message.contains("Linux 6.12")
                && message.contains(&release),
            "{message}"
        );
        assert!(!is_mounted(&userns_t), "a refused publish left a mount");
        // The other pod's view is served as ever.
        fs::write(host_t.join("still"), "here").unwrap();
        assert_eq!(fs::metadata(host_t.join("still")).unwrap().gid(), G);
    }
}

/// A share as native views need it: `nosuid,nodev`, of file system `fstype` (an ext4
/// image of its own, or a tmpfs), mounted at `root/share`; unmounted on drop with
/// everything below it.
struct NativeShare {
    path: std::path::PathBuf,
}

impl NativeShare {
    fn new(root: &Path, fstype: &str) -> NativeShare {
        let path = root.join("share");
        fs::create_dir_all(&path).unwrap();
        let run = |c: &mut Command| {
            let out = c.output().expect("e2fsprogs and mount are installed");
            assert!(
                out.status.success(),
                "{c:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        if fstype == "ext4" {
            let img = root.join("share.img");
            fs::File::create(&img).unwrap().set_len(128 << 20).unwrap();
            run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&img));
            run(Command::new("mount")
                .args(["-o", "loop,nosuid,nodev"])
                .arg(&img)
                .arg(&path));
        } else {
            run(Command::new("mount")
                .args(["-t", "tmpfs", "-o", "nosuid,nodev,mode=0755", "tmpfs"])
                .arg(&path));
        }
        NativeShare { path }
    }
}

impl Drop for NativeShare {
    fn drop(&mut self) {
        for m in mounts_below(&self.path).into_iter().rev() {
            let _ = rustix::mount::unmount(&m, rustix::mount::UnmountFlags::DETACH);
        }
        let _ = rustix::mount::unmount(&self.path, rustix::mount::UnmountFlags::DETACH);
    }
}

/// Idmapped mounts came to ext4 in Linux 5.12 and to tmpfs in 6.3: a volume is native
/// where its share can be idmapped, a FUSE view otherwise, and a member of the pod's
/// group writes either way.
#[tokio::test(flavor = "multi_thread")]
async fn a_volume_is_native_wherever_its_share_can_be_idmapped() {
    for (fstype, native) in [("ext4", true), ("tmpfs", kernel_at_least(6, 3))] {
        let f = Fixture::new();
        let root = f.dir.path();
        let share = NativeShare::new(root, fstype);
        let d = Driver::start_with_metrics(root);
        let addr = d.metrics_addr();
        let mut c = d.clients().await;
        let staging = f.subdir("staging");
        c.create_and_stage("vol", &staging).await;
        let record: serde_json::Value =
            serde_json::from_slice(&fs::read(share.path.join("meta/vol.json")).unwrap()).unwrap();
        assert_eq!(record["group"].is_u64(), native, "{fstype}: {record}");
        let target = root.join("target");
        c.node
            .node_publish_volume(publish_flags(
                "vol",
                &staging,
                &target,
                &[],
                &G.to_string(),
                false,
            ))
            .await
            .unwrap();
        let (mech, _) = mechanism(&addr, &target);
        assert_eq!(mech, if native { "native" } else { "fuse" }, "{fstype}");
        assert_eq!(
            mountgroup::sys::mount::is_idmapped(&target).unwrap(),
            native,
            "{fstype}"
        );
        assert_eq!(owner(&target).1, G, "{fstype}");
        let wrote = run_as(
            MEMBER,
            MEMBER,
            &[G],
            &format!(
                "echo hi > '{}/f' && cat '{}/f'",
                target.display(),
                target.display()
            ),
        );
        assert!(wrote.ok && wrote.stdout == "hi\n", "{fstype}: {wrote:?}");
        c.node
            .node_unpublish_volume(unpublish_req("vol", &target))
            .await
            .unwrap();
        assert!(!is_mounted(&target), "{fstype}");
        c.node
            .node_unstage_volume(unstage_req("vol", &staging))
            .await
            .unwrap();
        drop(d);
    }
}
