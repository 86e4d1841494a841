//! `mountgroup mount` on bad input: a non-zero exit, a message naming the cause, and
//! nothing left mounted. And a clean exit 0 on SIGTERM.

mod common;

use std::process::Command;

use common::*;

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN)
        .arg("mount")
        .args(args)
        // No test here hands a view over: a directory that cannot be made means no
        // control socket (a warning), and nothing made in /run.
        .env("MOUNTGROUP_CONTROL_DIR", "/proc/self/mountgroup-no-control")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_input_is_named_and_mounts_nothing() {
    let f = Fixture::new();
    let src = f.src.to_str().unwrap();
    let mnt = f.mnt.to_str().unwrap();
    let file = f.dir.path().join("plain-file");
    std::fs::write(&file, "x").unwrap();
    let file = file.to_str().unwrap();
    let missing = f.dir.path().join("missing");
    let missing = missing.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![src, mnt, "-o", "gid=abc"],
            "option `gid`: `abc` is not a decimal id",
        ),
        (
            vec![src, mnt, "-o", "colour=red"],
            "unknown option `colour`",
        ),
        (
            vec![src, mnt, "-o", "gid="],
            "option `gid` needs a value (`gid=...`)",
        ),
        (
            vec![src, mnt, "-o", "mode=fsgroup,noperm"],
            "option `noperm` only applies to mode=cifs",
        ),
        (
            vec![src, mnt, "-o", "suid"],
            "option `suid` is never allowed",
        ),
        (
            vec![src, mnt, "--gid", "x1"],
            "option `gid`: `x1` is not a decimal id",
        ),
        (vec![missing, mnt], "source"),
        (vec![file, mnt], "Not a directory"),
        (vec![src, missing], "mountpoint"),
        (vec![src, file], "is not a directory"),
    ];
    for (args, message) in cases {
        let (code, stderr) = run(&args);
        assert_ne!(code, 0, "{args:?}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
        assert!(!is_mounted(&f.mnt), "{args:?} left a mount");
    }
    let (code, stderr) = run(&[missing, mnt]);
    assert!(
        stderr.contains(missing) && stderr.contains("No such file or directory"),
        "{code}: {stderr}"
    );
}

/// `mount --native` refuses what the driver would not serve natively: options only a
/// FUSE view has, a source in root's group, and a source whose file system is mounted
/// somewhere without `nosuid,nodev` (here the root file system the fixture lives on).
#[test]
fn a_native_mount_refuses_what_the_driver_would_not_serve_natively() {
    let f = Fixture::new();
    let src = f.src.to_str().unwrap();
    let mnt = f.mnt.to_str().unwrap();
    let native = |opts: &str| run(&[src, mnt, "--native", "-o", opts]);
    // What a wrongly accepted native mount left is unmounted, whatever fails.
    let _mounted = Unmount(f.mnt.clone());
    common::chown(&f.src, 0, 0);
    let (code, stderr) = native("gid=4242");
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("group is root's (0)"), "{stderr}");
    common::chown(&f.src, 0, 2_000_000_000);
    for (opts, message) in [
        ("gid=4242,uid=1000", "CIFS options"),
        ("gid=4242,file_mode=0640", "CIFS options"),
        ("gid=4242,noperm", "CIFS options"),
        ("gid=4242,ownership=off", "ownership=off"),
        ("gid=4242,sync", "the option sync"),
        (
            "gid=4242,context=\"system_u:object_r:container_file_t:s0\"",
            "SELinux context=",
        ),
        ("gid=4242,mode=native,disk_gid=7", "disk_gid="),
        ("gid=4242", "mounted where set-id bits or device nodes work"),
    ] {
        let (code, stderr) = native(opts);
        assert_eq!(code, 2, "{opts}: {stderr}");
        assert!(stderr.contains(message), "{opts}: {stderr}");
        assert!(!is_mounted(&f.mnt), "{opts} left a mount");
    }
}

#[test]
fn a_busy_mountpoint_is_refused() {
    let f = Fixture::new();
    let _m = f.mount("gid=1");
    let (code, stderr) = run(&[
        f.src.to_str().unwrap(),
        f.mnt.to_str().unwrap(),
        "-o",
        "gid=2",
    ]);
    assert_ne!(code, 0);
    assert!(stderr.contains("is busy"), "{stderr}");
    // The first view is unharmed.
    assert_eq!(owner(&f.mnt).1, 1);
}

#[test]
fn emulate_on_a_backend_without_xattrs_is_refused() {
    // A FUSE backend with xattrs disabled stands in for one with no xattr support.
    // Options that name no ownership= are decided as the driver decides
    // (tests/backend.rs); named, it is served as given or refused.
    let f = Fixture::new();
    let real = f.subdir("real");
    let status = Command::new("bindfs")
        .arg("--xattr-none")
        .arg(&real)
        .arg(&f.src)
        .status()
        .expect("bindfs");
    assert!(status.success());
    struct Umount(std::path::PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _u = Umount(f.src.clone());
    let (code, stderr) = run(&[
        f.src.to_str().unwrap(),
        f.mnt.to_str().unwrap(),
        "-o",
        "gid=5,ownership=emulate",
    ]);
    assert_ne!(code, 0);
    assert!(
        stderr.contains("no extended attributes") && stderr.contains("ownership=off"),
        "{stderr}"
    );
    assert!(!is_mounted(&f.mnt));
    // ownership=off is the way out.
    let m = f.mount("gid=5,ownership=off");
    assert_eq!(owner(&f.mnt).1, 5);
    drop(m);
}

#[test]
fn sigterm_and_sigint_unmount_and_exit_zero() {
    for sig in [rustix::process::Signal::TERM, rustix::process::Signal::INT] {
        let f = Fixture::new();
        let m = f.mount("gid=5");
        let pid = rustix::process::Pid::from_raw(m.pid() as i32).unwrap();
        rustix::process::kill_process(pid, sig).unwrap();
        let mnt = m.mountpoint.clone();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while is_mounted(&mnt) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!is_mounted(&mnt), "{sig:?} unmounted");
        assert_eq!(m.stop(), Some(0), "{sig:?}: exit 0");
    }
}

/// Without root, a /dev/fuse the user cannot open is named as the cause.
#[test]
fn a_non_root_mount_names_dev_fuse() {
    let f = Fixture::new();
    common::chown(&f.src, 2001, 2001);
    common::chown(&f.mnt, 2001, 2001);
    let may_open = run_as(2001, 2001, &[], "test -r /dev/fuse && test -w /dev/fuse").ok;
    // A copy every user can run (the checkout may not be readable to uid 2001).
    let bin = f.dir.path().join("mountgroup");
    std::fs::copy(BIN, &bin).unwrap();
    let ran = run_as(
        2001,
        2001,
        &[],
        &format!(
            "timeout 5 {} mount {} {} -o ownership=off,gid=5; echo exit=$?",
            bin.display(),
            f.src.display(),
            f.mnt.display()
        ),
    );
    let names_it = ran
        .stderr
        .contains("/dev/fuse is not readable and writable");
    if may_open {
        assert!(!names_it, "{ran:?}");
    } else {
        assert!(names_it && ran.stdout.contains("exit=1"), "{ran:?}");
    }
    assert!(!is_mounted(&f.mnt));
}
