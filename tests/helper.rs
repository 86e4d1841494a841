//! The mount(8) helper: `mount -t fuse.mountgroup` and an fstab line mount views,
//! `umount` ends them. Installs scripts/mount.fuse.mountgroup as
//! /sbin/mount.fuse.mountgroup (the tests run as root).

mod common;

use std::fs;
use std::process::Command;

use common::*;

fn install_helper() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/mount.fuse.mountgroup");
        let dst = "/sbin/mount.fuse.mountgroup";
        // Copy beside, then rename: a mount(8) running elsewhere never sees half a file.
        let tmp = format!("{dst}.{}", std::process::id());
        fs::copy(src, &tmp).unwrap();
        fs::rename(&tmp, dst).unwrap();
    });
}

fn wait_unmounted(path: &std::path::Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while is_mounted(path) {
        assert!(
            std::time::Instant::now() < deadline,
            "{} still mounted",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Unmounts on drop, whatever happens in the test.
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
        }
    }
}

#[test]
fn mount_t_fuse_mountgroup_and_fstab_lines_work() {
    install_helper();
    let f = Fixture::new();
    fs::write(f.src.join("a"), "x").unwrap();
    let _guard = Unmount(f.mnt.clone());
    let out = Command::new("mount")
        .env("MOUNTGROUP_BIN", BIN)
        .args(["-t", "fuse.mountgroup"])
        .arg(&f.src)
        .arg(&f.mnt)
        .args(["-o", "gid=2000,nodev"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mount -t: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(owner(&f.mnt.join("a")).1, 2000);
    let out = Command::new("umount").arg(&f.mnt).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_unmounted(&f.mnt);

    // The same through an fstab line, with the options fstab lines carry.
    let fstab = f.dir.path().join("fstab");
    fs::write(
        &fstab,
        format!(
            "{} {} fuse.mountgroup defaults,nofail,_netdev,gid=2001 0 0\n",
            f.src.display(),
            f.mnt.display()
        ),
    )
    .unwrap();
    let out = Command::new("mount")
        .env("MOUNTGROUP_BIN", BIN)
        .arg("--fstab")
        .arg(&fstab)
        .arg(&f.mnt)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mount from fstab: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(owner(&f.mnt.join("a")).1, 2001);
    Command::new("umount").arg(&f.mnt).status().unwrap();
    wait_unmounted(&f.mnt);
}

#[test]
fn a_bad_option_fails_the_mount_with_the_views_message() {
    install_helper();
    let f = Fixture::new();
    let _guard = Unmount(f.mnt.clone());
    let out = Command::new("mount")
        .env("MOUNTGROUP_BIN", BIN)
        .args(["-t", "fuse.mountgroup"])
        .arg(&f.src)
        .arg(&f.mnt)
        .args(["-o", "gid=banana"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("option `gid`"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!is_mounted(&f.mnt));
}
