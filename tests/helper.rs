//! The mount(8) helper: `mount -t fuse.mountgroup` and an fstab line mount views,
//! `umount` ends them. Installs scripts/mount.fuse.mountgroup as
//! /sbin/mount.fuse.mountgroup while they run (as root), and puts back what was there.

mod common;

use std::fs;
use std::process::Command;

use common::*;

const HELPER: &str = "/sbin/mount.fuse.mountgroup";

/// The helper under test installed as /sbin/mount.fuse.mountgroup (where mount(8)
/// looks) while any test holds one of these; the last one to go puts back what was
/// there before (nothing, or an installed helper), so a test run leaves no file behind.
struct Helper;

static HELPERS: std::sync::Mutex<(usize, Option<Option<Vec<u8>>>)> =
    std::sync::Mutex::new((0, None));

fn install_helper() -> Helper {
    let mut h = HELPERS.lock().unwrap_or_else(|e| e.into_inner());
    if h.0 == 0 {
        h.1 = Some(fs::read(HELPER).ok());
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/mount.fuse.mountgroup");
        put(&fs::read(src).unwrap());
    }
    h.0 += 1;
    Helper
}

/// Copy beside, then rename: a mount(8) running elsewhere never sees half a file.
fn put(content: &[u8]) {
    use std::os::unix::fs::PermissionsExt;
    let tmp = format!("{HELPER}.{}", std::process::id());
    fs::write(&tmp, content).unwrap();
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).unwrap();
    fs::rename(&tmp, HELPER).unwrap();
}

impl Drop for Helper {
    fn drop(&mut self) {
        let mut h = HELPERS.lock().unwrap_or_else(|e| e.into_inner());
        h.0 -= 1;
        if h.0 == 0 {
            match h.1.take().flatten() {
                Some(before) => put(&before),
                None => {
                    let _ = fs::remove_file(HELPER);
                }
            }
        }
    }
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

/// mount(8), with the helper told (through its environment) to start this build and
/// to keep its logs and control sockets in the fixture.
fn mount_command(f: &Fixture) -> Command {
    let mut c = Command::new("mount");
    c.env("MOUNTGROUP_BIN", BIN)
        .env("MOUNTGROUP_LOG_DIR", f.dir.path())
        .env("MOUNTGROUP_CONTROL_DIR", f.dir.path().join("ctl"));
    c
}

#[test]
fn mount_t_fuse_mountgroup_and_fstab_lines_work() {
    let _helper = install_helper();
    let f = Fixture::new();
    fs::write(f.src.join("a"), "x").unwrap();
    let _guard = Unmount(f.mnt.clone());
    let out = mount_command(&f)
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
    let out = mount_command(&f)
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
    let _helper = install_helper();
    let f = Fixture::new();
    let _guard = Unmount(f.mnt.clone());
    let out = mount_command(&f)
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

/// xfstests' `FSTYP=fuse` (its README.fuse): a placeholder device on the command line
/// and the backing directory as `-osource=`; xfstests then finds the mount by that
/// device name (common/rc `_check_if_dev_already_mounted`: `findmnt -S DEV`).
#[test]
fn a_source_option_names_the_backing_and_the_device_is_the_fsname() {
    let _helper = install_helper();
    let f = Fixture::new();
    fs::write(f.src.join("a"), "x").unwrap();
    let _guard = Unmount(f.mnt.clone());
    let out = mount_command(&f)
        .args(["-t", "fuse.mountgroup", "placeholder-dev"])
        .arg(&f.mnt)
        .arg("-o")
        .arg(format!(
            "source={},allow_other,default_permissions,gid=2002",
            f.src.display()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mount -osource=: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fs::read_to_string(f.mnt.join("a")).unwrap(), "x");
    assert_eq!(owner(&f.mnt.join("a")).1, 2002);
    let found = Command::new("findmnt")
        .args(["-rn", "-S", "placeholder-dev", "-o", "TARGET"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&found.stdout).trim(),
        f.mnt.to_str().unwrap()
    );
    Command::new("umount").arg(&f.mnt).status().unwrap();
    wait_unmounted(&f.mnt);
}
