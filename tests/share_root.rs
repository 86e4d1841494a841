//! The share root must prove it is the share before anything is made there. In a
//! cluster the share is mounted at the hostPath on every node; until it is (or after
//! it is unmounted) that path is an empty directory of the node's own disk, which the
//! hostPath's `DirectoryOrCreate` makes. With `--share-init=mount-point` (as
//! deploy/ runs it) the driver creates nothing there (its calls answer UNAVAILABLE,
//! retried), picks the share up once it is mounted, and lays it out with a marker it
//! checks on every use.

mod common;
#[path = "common/driver.rs"]
mod driver;
#[path = "common/kubelet.rs"]
mod kubelet;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::*;
use driver::*;
use mountgroup::csi::pb;
use tonic::Code;

/// A tmpfs mounted on `at` (the share mounted later, as an NFS or SMB mount would be);
/// lazily unmounted on drop.
struct Mounted(std::path::PathBuf);

impl Mounted {
    fn tmpfs(at: &Path) -> Mounted {
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64m", "share"])
            .arg(at)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount tmpfs on {at:?}");
        Mounted(at.to_path_buf())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
    }
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn nothing_lands_on_the_nodes_disk_until_the_share_is_mounted() {
    let f = Fixture::new();
    let share = f.subdir("share");
    let d = Driver::start_with(
        f.dir.path(),
        share.clone(),
        &["--share-key-file", "none", "--share-init", "mount-point"],
    );
    let mut c = d.clients().await;

    // Not mounted: ready (a cluster whose classes name their shares mounts no share
    // root), and the provisioner's CreateVolume of the share root is retried later.
    c.identity
        .probe(pb::ProbeRequest {})
        .await
        .expect("ready without a share root");
    expect(
        c.controller
            .create_volume(create_req("pvc-early", 1 << 20))
            .await,
        Code::Unavailable,
        "is not the share",
    );
    assert!(
        entries(&share).is_empty(),
        "made on the node's disk: {:?}",
        entries(&share)
    );

    // The share is mounted later: picked up by the next call, laid out, marked.
    let mounted = Mounted::tmpfs(&share);
    c.identity
        .probe(pb::ProbeRequest {})
        .await
        .expect("ready once mounted");
    c.controller
        .create_volume(create_req("pvc-late", 1 << 20))
        .await
        .expect("created on the mounted share");
    assert!(share.join(".mountgroup-share").is_file());
    assert!(share.join("volumes/pvc-late").is_dir());

    // Unmounted again (an NFS mount lost, a node rebooted without it): the local
    // directory underneath is not the share, whatever the driver knew before.
    drop(mounted);
    expect(
        c.controller
            .create_volume(create_req("pvc-after", 1 << 20))
            .await,
        Code::Unavailable,
        "is not the share",
    );
    let e = c
        .node
        .node_stage_volume(stage_req("pvc-late", &f.subdir("staging")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(
        !kubelet::mount_failure_is_final(e.code()),
        "kubelet must keep trying until the share is back"
    );
    assert!(
        entries(&share).is_empty(),
        "made on the node's disk: {:?}",
        entries(&share)
    );

    // A share directory on the node's own disk, marked by hand, is the share.
    fs::write(share.join(".mountgroup-share"), "").unwrap();
    c.controller
        .create_volume(create_req("pvc-local", 1 << 20))
        .await
        .expect("a marked directory is the share");
}
