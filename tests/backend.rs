//! A backing directory that refuses chown and chmod outright (like an SMB share or a
//! root-squashed NFS export), made with bindfs. Needs bindfs (installed by .ci/run).

mod common;
#[path = "common/driver.rs"]
mod driver;

use std::fs;

use common::*;
use driver::*;

const G: u32 = 4242;

/// A bindfs mount of `real` that refuses every chown, chgrp and chmod.
struct Refusing {
    _mount: BindfsGuard,
    path: std::path::PathBuf,
}

struct BindfsGuard(std::path::PathBuf);

impl Drop for BindfsGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Mounts `real` on `at` with bindfs and `options`; unmounted when the guard drops.
fn bindfs(options: &[&str], real: &std::path::Path, at: &std::path::Path) -> BindfsGuard {
    let status = std::process::Command::new("bindfs")
        .args(options)
        .arg(real)
        .arg(at)
        .status()
        .expect("bindfs is installed (scripts/test and .ci/run install it)");
    assert!(status.success(), "bindfs mount");
    BindfsGuard(at.to_path_buf())
}

/// A bindfs mount of `real` on `at` as an SMB share without extended attributes or
/// unix extensions (Azure Files) or an NFS export before 4.2 looks to a view: no
/// extended attributes, chown and chmod succeed with no effect.
fn azure_files_like(real: &std::path::Path, at: &std::path::Path) -> BindfsGuard {
    bindfs(
        &[
            "--xattr-none",
            "--chown-ignore",
            "--chgrp-ignore",
            "--chmod-ignore",
        ],
        real,
        at,
    )
}

fn refusing_backend(f: &Fixture) -> Refusing {
    let real = f.subdir("real");
    fs::write(real.join("a.txt"), "a\n").unwrap();
    chown(&real.join("a.txt"), 1234, 1234);
    chmod(&real.join("a.txt"), 0o644);
    let guard = bindfs(
        &["--chown-deny", "--chgrp-deny", "--chmod-deny"],
        &real,
        &f.src,
    );
    // The backend really refuses: the precondition of everything below.
    assert!(
        std::os::unix::fs::chown(f.src.join("a.txt"), Some(1), None).is_err(),
        "bindfs refuses chown"
    );
    assert!(
        fs::set_permissions(
            f.src.join("a.txt"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600)
        )
        .is_err(),
        "bindfs refuses chmod"
    );
    Refusing {
        _mount: guard,
        path: real,
    }
}

#[test]
fn emulated_ownership_works_where_the_backend_refuses_chown() {
    let f = Fixture::new();
    let backend = refusing_backend(&f);
    let _m = f.mount(&format!("gid={G}"));
    assert_eq!(owner(&f.mnt.join("a.txt")), (1234, G, 0o664));
    // What PostgreSQL does to its data directory on start: chown and chmod 0700.
    let ran = run_as(
        0,
        0,
        &[],
        &format!(
            "mkdir {0}/pgdata && chown 999:{G} {0}/pgdata && chmod 700 {0}/pgdata",
            f.mnt.display()
        ),
    );
    assert!(ran.ok, "{ran:?}");
    // GNU chmod keeps a directory's setgid bit (inherited here), as on any file system.
    assert_eq!(owner(&f.mnt.join("pgdata")), (999, G, 0o2700));
    let ran = run_as(
        999,
        999,
        &[G],
        &format!(
            "umask 077; echo data > {0}/pgdata/PG_VERSION && chmod 600 {0}/pgdata/PG_VERSION && cat {0}/pgdata/PG_VERSION",
            f.mnt.display()
        ),
    );
    assert!(ran.ok && ran.stdout == "data\n", "{ran:?}");
    assert_eq!(owner(&f.mnt.join("pgdata/PG_VERSION")), (999, G, 0o600));
    let ran = run_as(2001, 2001, &[G], &format!("ls {}/pgdata", f.mnt.display()));
    assert!(!ran.ok, "0700 keeps others out: {ran:?}");
    assert_eq!(owner(&backend.path.join("a.txt")), (1234, 1234, 0o644));
}

#[test]
fn ownership_off_succeeds_with_no_effect_on_a_refusing_backend() {
    let f = Fixture::new();
    let _backend = refusing_backend(&f);
    let _m = f.mount(&format!("gid={G},ownership=off"));
    let ran = run_as(
        0,
        0,
        &[],
        &format!(
            "chown 5 {0}/a.txt && chmod 600 {0}/a.txt && mkdir {0}/d && echo x > {0}/d/f",
            f.mnt.display()
        ),
    );
    assert!(ran.ok, "{ran:?}");
    assert_eq!(owner(&f.mnt.join("a.txt")), (1234, G, 0o664));
    let ran = run_as(
        2001,
        2001,
        &[G],
        &format!("echo member >> {}/d/f", f.mnt.display()),
    );
    assert!(ran.ok, "{ran:?}");
}

#[test]
fn a_plain_view_keeps_the_daemon_as_owner_where_chown_is_refused() {
    let f = Fixture::new();
    let backend = refusing_backend(&f);
    let _m = f.mount("");
    let ran = run_as(1000, 1000, &[], &format!("ls {}", f.mnt.display()));
    assert!(ran.ok, "{ran:?}");
    fs::write(f.mnt.join("root-made"), "x").unwrap();
    assert_eq!(owner(&backend.path.join("root-made")).0, 0);
}

/// A share whose file system keeps no extended attributes (an SMB share without EA
/// support, as Azure Files; NFS, which has no `trusted.*`), and where chown and chmod
/// succeed with no effect (SMB without unix extensions), made with bindfs: the
/// default publish (fsGroup semantics, which keep their chown and chmod in records)
/// serves CIFS semantics without records instead of failing, and says so in the log
/// and the metric.
#[tokio::test(flavor = "multi_thread")]
async fn the_default_publish_on_a_share_that_keeps_no_records_serves_cifs_semantics() {
    let f = Fixture::new();
    let root = f.dir.path();
    let real = f.subdir("real");
    let share = f.subdir("share");
    let _share = azure_files_like(&real, &share);
    let refused = std::process::Command::new("setfattr")
        .args(["-n", "trusted.x", "-v", "1"])
        .arg(&share)
        .output()
        .unwrap();
    assert!(!refused.status.success(), "the share keeps no xattrs");

    let d = Driver::start_with_metrics_and(root, &[]);
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    let target = root.join("target");
    c.create_stage_publish("vol", &staging, &target, &G.to_string())
        .await;
    let _unmount = Unmount(target.clone());
    assert_eq!(
        mechanism(&d.metrics_addr(), &target),
        ("fuse-cifs".into(), "share-keeps-no-records".into())
    );
    assert!(
        d.log_text().contains("share-keeps-no-records"),
        "{}",
        d.log_text()
    );
    assert_cifs_view_without_records(&target, G);

    c.unpublish_unstage("vol", &target, &staging).await;
}

/// `mountgroup mount` by hand on the same kind of share decides as the driver does:
/// options that name no `ownership=` (fsGroup semantics, CIFS options) get the CIFS
/// view without records the driver would serve, and the log says so and why; options
/// that name it get exactly it, or the error naming what to use instead.
#[test]
fn a_hand_mount_of_a_share_that_keeps_no_records_decides_as_the_driver_does() {
    let f = Fixture::new();
    let real = f.subdir("real");
    let _share = azure_files_like(&real, &f.src);
    {
        let m = f.mount(&format!("gid={G}"));
        let log = m.log_text();
        assert!(
            log.contains("share-keeps-no-records") && log.contains("trusted.mountgroup.owner"),
            "{log}"
        );
        assert_cifs_view_without_records(&f.mnt, G);
    }
    {
        let _m = f.mount(&format!("uid=1000,gid={G},file_mode=0640,dir_mode=0750"));
        fs::write(f.mnt.join("c"), "c").unwrap();
        assert_eq!(owner(&f.mnt.join("c")), (1000, G, 0o640));
    }
    let named = Mounted::start(
        &f.src,
        &f.mnt,
        &["-o", &format!("gid={G},ownership=emulate")],
    )
    .err()
    .expect("ownership=emulate named where the share keeps no trusted.* attributes");
    assert!(named.contains("ownership=emulate-user"), "{named}");
}

/// A plain view on a backend without unnamed files (`O_TMPFILE`; bindfs here, NFS and
/// CephFS for real) makes a new entry under a reserved name and chowns it to its
/// creator before it gets its name: the attributes the view answers the create with
/// are those after the chown, so the creator sees itself as the owner at once, not
/// the daemon until the kernel's cache of them expires.
#[test]
fn a_plain_views_new_file_shows_its_creator_at_once_on_a_backend_without_tmpfile() {
    let f = Fixture::new();
    let real = f.subdir("real");
    chmod(&real, 0o777);
    let _guard = bindfs(&[], &real, &f.src);
    let m = f.mount("");
    let ran = run_as(
        1000,
        1000,
        &[],
        &format!(": > {0}/new && stat -c '%u %g' {0}/new", f.mnt.display()),
    );
    assert!(ran.ok, "{ran:?}");
    assert_eq!(ran.stdout, "1000 1000\n", "as the view answered the create");
    assert_eq!(owner(&real.join("new")).0, 1000, "on the disk");
    // The backend has no unnamed files: what ran above is the staged create.
    assert!(
        m.log_text().contains("cannot make unnamed files"),
        "{}",
        m.log_text()
    );
}
