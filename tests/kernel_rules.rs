//! What xfstests found a view doing differently from the kernel's own file systems,
//! each checked on a real view against the rule Linux (ext4) follows, or against the
//! difference docs/SEMANTICS.md documents.

mod common;

use std::fs;
use std::os::fd::AsRawFd;

use common::*;

/// `lseek(fd, offset, whence)`: the new offset, or the errno.
fn lseek(f: &fs::File, offset: i64, whence: i32) -> Result<i64, i32> {
    // SAFETY: a plain system call on an open descriptor.
    let r = unsafe { libc::lseek(f.as_raw_fd(), offset, whence) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    } else {
        Ok(r)
    }
}

/// generic/448: `SEEK_DATA` and `SEEK_HOLE` before the start of a file are `ENXIO`
/// on Linux, not `EINVAL`; the view answers as the backing file system does.
#[test]
fn seek_data_and_hole_before_the_start_are_enxio() {
    let f = Fixture::new();
    fs::write(f.src.join("file"), vec![7u8; 8192]).unwrap();
    let native = fs::File::open(f.src.join("file")).unwrap();
    let _m = f.mount("gid=4242");
    let viewed = fs::File::open(f.mnt.join("file")).unwrap();
    for whence in [libc::SEEK_DATA, libc::SEEK_HOLE] {
        for offset in [-1, -4096, i64::MIN] {
            assert_eq!(lseek(&native, offset, whence), Err(libc::ENXIO));
            assert_eq!(
                lseek(&viewed, offset, whence),
                lseek(&native, offset, whence),
                "whence {whence}, offset {offset}"
            );
        }
        assert_eq!(lseek(&viewed, 0, whence), lseek(&native, 0, whence));
        assert_eq!(lseek(&viewed, 8192, whence), Err(libc::ENXIO));
    }
}

/// The mode the view shows for `path`, set-id bits included.
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path).unwrap().mode() & 0o7777
}

/// generic/683, 684, 685: a write or fallocate by a user outside a setgid file's group
/// drops setgid even without group execute (6666 becomes 0666); a member of the group
/// keeps it (setuid goes for both). Through a group view and a plain one.
#[test]
fn a_writer_outside_the_group_drops_setgid() {
    const OUTSIDER: u32 = 2002;
    const MEMBER: u32 = 2001;
    for options in ["gid=4242", ""] {
        let f = Fixture::new();
        let _m = f.mount(options);
        let group = if options.is_empty() { 3131 } else { 4242 };
        for (name, how) in [
            ("w", "printf x >> \"$1\""),
            ("fa", "fallocate -l 65536 \"$1\""),
        ] {
            for (uid, groups, want) in [(OUTSIDER, vec![], 0o0666), (MEMBER, vec![group], 0o2666)] {
                let file = f.mnt.join(format!("{name}-{uid}"));
                fs::write(&file, "").unwrap();
                chown(&file, 1000, group);
                chmod(&file, 0o6666);
                assert_eq!(mode(&file), 0o6666, "{options:?}");
                let ran = run_as(
                    uid,
                    uid,
                    &groups,
                    &format!("set -- {}; {how}", file.display()),
                );
                assert!(ran.ok, "{options:?} {name} as {uid}: {ran:?}");
                assert_eq!(
                    mode(&file),
                    want,
                    "view {options:?}: {name} by {uid} (groups {groups:?}) leaves {:o}",
                    mode(&file)
                );
            }
        }
    }
}

/// generic/120 (and every fstab line with `noatime`): what mount(8), fstab and FUSE
/// users write is accepted, the VFS flags are applied to the mount, and only what
/// contradicts a view (`suid`, `dev`) is refused, naming it.
#[test]
fn mount_and_fstab_options_are_accepted_and_applied() {
    let f = Fixture::new();
    for (options, want, refused) in [
        (
            "defaults,noatime,nodiratime,nofail,_netdev,x-systemd.automount,allow_other,default_permissions,fsname=teamshare,subtype=mountgroup,gid=4242",
            &["noatime", "nodiratime"][..],
            &["relatime"][..],
        ),
        (
            "relatime,lazytime",
            &["relatime", "lazytime"][..],
            &["noatime"][..],
        ),
        (
            "strictatime,sync,dirsync",
            &["sync", "dirsync"][..],
            &["relatime", "noatime"][..],
        ),
    ] {
        let m = Mounted::start(&f.src, &f.mnt, &["-o", options])
            .unwrap_or_else(|e| panic!("-o {options}: {e}"));
        let (flags, source) = mount_entry(&f.mnt);
        for w in want {
            assert!(
                flags.iter().any(|x| x == w),
                "-o {options}: {flags:?} lacks {w}"
            );
        }
        for r in refused {
            assert!(
                !flags.iter().any(|x| x == r),
                "-o {options}: {flags:?} has {r}"
            );
        }
        if options.contains("fsname=") {
            assert_eq!(source, "teamshare");
            assert_eq!(
                fs::metadata(&f.mnt)
                    .map(|m| {
                        use std::os::unix::fs::MetadataExt;
                        m.gid()
                    })
                    .unwrap(),
                4242
            );
        }
        m.stop();
    }
    for (bad, named) in [
        ("suid", "`suid`"),
        ("dev", "`dev`"),
        ("gid=1,noatime=yes", "noatime"),
    ] {
        let e = Mounted::start(&f.src, &f.mnt, &["-o", bad])
            .err()
            .expect("refused");
        assert!(e.contains(named), "-o {bad}: {e}");
        assert!(!is_mounted(&f.mnt));
    }
}

/// Writes `file` through a shared mapping (`how` = "mmap") or with write(2) ("write")
/// once its pages are clean and its attributes cached, and reports whether the view
/// showed the new mtime at once and how long it took to show the backing file's.
fn time_after_write(
    view_file: &std::path::Path,
    backing: &std::path::Path,
    how: &str,
) -> (bool, f64) {
    let script = r#"
import mmap, os, sys, time
view, backing, how = sys.argv[1], sys.argv[2], sys.argv[3]
fd = os.open(view, os.O_RDWR)
m = mmap.mmap(fd, 8192)
m[0:1] = b"x"; m.flush(); os.fsync(fd)
time.sleep(1.2)
before = os.stat(view).st_mtime_ns
if how == "mmap":
    m[100:105] = b"hello"
else:
    os.pwrite(fd, b"hello", 200)
at_once = os.stat(view).st_mtime_ns != before
start = time.time()
while os.stat(view).st_mtime_ns != os.stat(backing).st_mtime_ns and time.time() - start < 10:
    time.sleep(0.01)
print(at_once, time.time() - start)
m.close(); os.close(fd)
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(view_file)
        .arg(backing)
        .arg(how)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text.split_whitespace();
    (
        parts.next() == Some("True"),
        parts.next().unwrap().parse().unwrap(),
    )
}

/// generic/080, 215: with passthrough, a write through a shared mapping reaches the
/// backing file without the daemon or the FUSE inode seeing it, so the view shows the
/// new mtime and ctime once its cached attributes expire (`attr_timeout`, 1 s), not at
/// once; write(2) shows at once (the kernel drops the cached attributes after a
/// passthrough write). Without passthrough an mmap write reaches the backing file, and
/// its times, when the kernel writes the page back (msync, close, writeback)
/// (docs/SEMANTICS.md, *Deliberate differences*).
#[test]
fn mmap_writes_show_in_the_times_within_the_attribute_timeout() {
    let f = Fixture::new();
    fs::write(f.src.join("f"), vec![0u8; 8192]).unwrap();
    for options in ["gid=4242,passthrough=on", "gid=4242,passthrough=off"] {
        let m = f.mount(options);
        let (_, caught_up) = time_after_write(&f.mnt.join("f"), &f.src.join("f"), "mmap");
        assert!(
            caught_up < 1.0 + 4.0,
            "{options}: the view showed the backing mtime only after {caught_up} s"
        );
        let (at_once, _) = time_after_write(&f.mnt.join("f"), &f.src.join("f"), "write");
        assert!(at_once, "{options}: write(2) shows at once");
        m.stop();
    }
}

/// The access time of `path` on the backing file system, in seconds.
fn atime(path: &std::path::Path) -> i64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path).unwrap().atime()
}

/// generic/120, 003: `noatime` (and `nodiratime` for directories) on a view leaves the
/// access times alone for what the view itself reads (listings, and file reads without
/// passthrough): it reads through descriptors opened `O_NOATIME`. Otherwise, and for
/// passthrough reads, the backing mount's rule applies (here `relatime`, which updates
/// an access time older than a day).
#[test]
fn noatime_views_leave_access_times_alone() {
    let f = Fixture::new();
    fs::create_dir(f.src.join("d")).unwrap();
    fs::write(f.src.join("d/file"), "data").unwrap();
    let age = |p: &str| {
        let ok = std::process::Command::new("touch")
            .args(["-a", "-d", "3 days ago"])
            .arg(f.src.join(p))
            .status()
            .unwrap()
            .success();
        assert!(ok);
        atime(&f.src.join(p))
    };
    for (options, file_kept, dir_kept) in [
        ("gid=4242", false, false),
        // A passthrough read is the kernel's, on a backing file it opens with the
        // reader's flags: the backing mount's rule applies (docs/SEMANTICS.md).
        ("gid=4242,noatime,passthrough=on", false, true),
        ("gid=4242,nodiratime", false, true),
        ("gid=4242,noatime,passthrough=off", true, true),
    ] {
        let (old_file, old_dir) = (age("d/file"), age("d"));
        let m = f.mount(options);
        assert_eq!(fs::read_to_string(f.mnt.join("d/file")).unwrap(), "data");
        assert_eq!(fs::read_dir(f.mnt.join("d")).unwrap().count(), 1);
        m.stop();
        assert_eq!(
            atime(&f.src.join("d/file")) == old_file,
            file_kept,
            "{options}: file"
        );
        assert_eq!(
            atime(&f.src.join("d")) == old_dir,
            dir_kept,
            "{options}: directory"
        );
    }
}
