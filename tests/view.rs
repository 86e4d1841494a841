//! The group view on real FUSE mounts: what stat shows and what users may do, per
//! docs/SEMANTICS.md. Runs as root; every mount is undone by its guard.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;

use common::*;

const G: u32 = 4242;
const MEMBER: u32 = 2001;
const OUTSIDER: u32 = 2002;

/// A small tree owned 1234:1234, files 0644, directories 0755.
fn populate(f: &Fixture) {
    fs::create_dir_all(f.src.join("dir/sub")).unwrap();
    for p in ["a.txt", "dir/b.txt", "dir/sub/c.txt"] {
        fs::write(f.src.join(p), format!("content of {p}\n")).unwrap();
        chmod(&f.src.join(p), 0o644);
    }
    std::os::unix::fs::symlink("a.txt", f.src.join("link")).unwrap();
    for p in [
        "",
        "dir",
        "dir/sub",
        "a.txt",
        "dir/b.txt",
        "dir/sub/c.txt",
        "link",
    ] {
        chown(&f.src.join(p), 1234, 1234);
    }
    for p in ["", "dir", "dir/sub"] {
        chmod(&f.src.join(p), 0o755);
    }
}

#[test]
fn every_entry_shows_the_group_and_members_can_write() {
    let f = Fixture::new();
    populate(&f);
    let before = snapshot(&f.src);
    let _m = f.mount(&format!("gid={G}"));

    for (rel, _) in snapshot(&f.mnt) {
        let (_, gid, mode) = owner(&f.mnt.join(&rel));
        assert_eq!(gid, G, "{} shows the mount group", rel.display());
        let meta = fs::symlink_metadata(f.mnt.join(&rel)).unwrap();
        if meta.is_dir() {
            assert_eq!(mode, 0o2775, "{}: 0755 | 0770 | setgid", rel.display());
        } else if meta.is_file() {
            assert_eq!(mode, 0o664, "{}: 0644 | 0660", rel.display());
        }
    }
    assert_eq!(
        owner(&f.mnt.join("dir/b.txt")).0,
        1234,
        "the owner is the disk's"
    );

    // A member of the group who is not the owner writes, reads, creates.
    let ran = run_as(
        MEMBER,
        MEMBER,
        &[G],
        &format!(
            "echo member >> {0}/dir/b.txt && cat {0}/dir/b.txt && echo new > {0}/dir/sub/new.txt",
            f.mnt.display()
        ),
    );
    assert!(ran.ok, "member: {ran:?}");
    assert!(ran.stdout.contains("member"));
    // Someone outside the group can read (0664) but not write.
    let ran = run_as(
        OUTSIDER,
        OUTSIDER,
        &[],
        &format!("cat {0}/a.txt && echo x >> {0}/a.txt", f.mnt.display()),
    );
    assert!(!ran.ok, "outsider wrote: {ran:?}");
    assert!(ran.stderr.contains("Permission denied"), "{ran:?}");
    let ran = run_as(
        OUTSIDER,
        OUTSIDER,
        &[],
        &format!("touch {}/dir/outsider", f.mnt.display()),
    );
    assert!(
        !ran.ok && ran.stderr.contains("Permission denied"),
        "{ran:?}"
    );

    // A full walk with reads and writes changed no backing owner or mode.
    sh(&format!(
        "ls -lR {0} >/dev/null && cat {0}/a.txt {0}/dir/sub/c.txt >/dev/null && echo more >> {0}/a.txt",
        f.mnt.display()
    ));
    let after: Vec<_> = snapshot(&f.src)
        .into_iter()
        .filter(|(p, _)| !p.ends_with("new.txt"))
        .collect();
    assert_eq!(after, before, "backing ownership and modes are untouched");
    assert_eq!(
        fs::read_to_string(f.src.join("dir/b.txt")).unwrap(),
        "content of dir/b.txt\nmember\n"
    );
}

#[test]
fn new_entries_belong_to_the_creator_and_the_group() {
    let f = Fixture::new();
    populate(&f);
    let _m = f.mount(&format!("gid={G}"));
    let ran = run_as(
        1000,
        1000,
        &[G],
        &format!(
            "umask 022; echo hi > {0}/new.txt && mkdir {0}/newdir && ln -s new.txt {0}/newlink",
            f.mnt.display()
        ),
    );
    assert!(ran.ok, "{ran:?}");
    assert_eq!(
        owner(&f.mnt.join("new.txt")),
        (1000, G, 0o644),
        "caller's uid, the group, mode after umask"
    );
    assert_eq!(
        owner(&f.mnt.join("newdir")),
        (1000, G, 0o2755),
        "setgid inherited"
    );
    assert_eq!(owner(&f.mnt.join("newlink")).0, 1000);
    // On disk it is the daemon's, and nothing set-id ever lands there.
    assert_eq!(owner(&f.src.join("new.txt")), (0, 0, 0o644));
    assert_eq!(owner(&f.src.join("newdir")).0, 0);
    assert_eq!(owner(&f.src.join("newdir")).2 & 0o6000, 0);

    // The owner can chmod; the effect is seen, the disk keeps its mode.
    let ran = run_as(
        1000,
        1000,
        &[G],
        &format!(
            "chmod 600 {0}/new.txt && chgrp {G} {0}/new.txt",
            f.mnt.display()
        ),
    );
    assert!(ran.ok, "{ran:?}");
    assert_eq!(owner(&f.mnt.join("new.txt")), (1000, G, 0o600));
    assert_eq!(owner(&f.src.join("new.txt")), (0, 0, 0o644));
    // ...and the kernel's rules apply to what is presented: 0600 locks the group out.
    let ran = run_as(
        MEMBER,
        MEMBER,
        &[G],
        &format!("cat {}/new.txt", f.mnt.display()),
    );
    assert!(!ran.ok, "{ran:?}");
    // The owner cannot give the file away or chgrp to a group it is not in.
    let ran = run_as(
        1000,
        1000,
        &[G],
        &format!("chown 1500 {}/new.txt", f.mnt.display()),
    );
    assert!(
        !ran.ok && ran.stderr.contains("Operation not permitted"),
        "{ran:?}"
    );
    let ran = run_as(
        1000,
        1000,
        &[G],
        &format!("chgrp 77 {}/new.txt", f.mnt.display()),
    );
    assert!(!ran.ok, "{ran:?}");
    // Root can, and the effect shows; a file it never touched on disk.
    chown(&f.mnt.join("a.txt"), 1500, 1600);
    chmod(&f.mnt.join("a.txt"), 0o640);
    assert_eq!(owner(&f.mnt.join("a.txt")), (1500, 1600, 0o640));
    assert_eq!(owner(&f.src.join("a.txt")), (1234, 1234, 0o644));
    // chgrp back to the mount group.
    chown(&f.mnt.join("a.txt"), 1500, G);
    assert_eq!(owner(&f.mnt.join("a.txt")).1, G);
}

#[test]
fn records_survive_a_remount_and_follow_each_views_group() {
    let f = Fixture::new();
    populate(&f);
    {
        let _m = f.mount(&format!("gid={G}"));
        let ran = run_as(
            1000,
            1000,
            &[G],
            &format!("umask 007; echo x > {}/mine", f.mnt.display()),
        );
        assert!(ran.ok, "{ran:?}");
        chmod(&f.mnt.join("a.txt"), 0o600);
    }
    let _m = f.mount("gid=777");
    assert_eq!(
        owner(&f.mnt.join("mine")),
        (1000, 777, 0o660),
        "the mount group of this view"
    );
    assert_eq!(
        owner(&f.mnt.join("a.txt")),
        (1234, 777, 0o600),
        "chmod persisted"
    );
}

#[test]
fn two_views_of_one_directory_show_two_groups_at_once() {
    let f = Fixture::new();
    populate(&f);
    let other = f.subdir("mnt2");
    let _a = f.mount("gid=3001");
    let _b = Mounted::start(&f.src, &other, &["-o", "gid=3002"]).unwrap();
    assert_eq!(owner(&f.mnt.join("a.txt")).1, 3001);
    assert_eq!(owner(&other.join("a.txt")).1, 3002);
    let ran = run_as(
        5001,
        5001,
        &[3001],
        &format!("umask 002; echo from-a > {}/shared.txt", f.mnt.display()),
    );
    assert!(ran.ok, "{ran:?}");
    let ran = run_as(
        5002,
        5002,
        &[3002],
        &format!("echo from-b >> {}/shared.txt", other.display()),
    );
    assert!(
        ran.ok,
        "a member of the other view's group writes the same file: {ran:?}"
    );
    assert_eq!(owner(&other.join("shared.txt")).1, 3002);
    let ran = run_as(
        5002,
        5002,
        &[3002],
        &format!("echo x >> {}/shared.txt", f.mnt.display()),
    );
    assert!(!ran.ok, "but not through the first view: {ran:?}");
    assert_eq!(
        fs::read_to_string(f.src.join("shared.txt")).unwrap(),
        "from-a\nfrom-b\n"
    );
}

#[test]
fn ownership_off_gives_success_with_no_effect() {
    let f = Fixture::new();
    populate(&f);
    let _m = f.mount(&format!("gid={G},ownership=off"));
    chmod(&f.mnt.join("a.txt"), 0o600);
    chown(&f.mnt.join("a.txt"), 1, 2);
    assert_eq!(owner(&f.mnt.join("a.txt")), (1234, G, 0o664), "no effect");
    // Non-owners still get the kernel's refusal first.
    let ran = run_as(
        MEMBER,
        MEMBER,
        &[G],
        &format!("chmod 600 {}/a.txt", f.mnt.display()),
    );
    assert!(
        !ran.ok && ran.stderr.contains("Operation not permitted"),
        "{ran:?}"
    );
    // New files show the disk's owner (the daemon) with the group's bits.
    let ran = run_as(
        1000,
        1000,
        &[G],
        &format!("umask 022; echo x > {}/n", f.mnt.display()),
    );
    assert!(ran.ok, "{ran:?}");
    assert_eq!(owner(&f.mnt.join("n")), (0, G, 0o664));
    assert!(
        fs::read_dir(&f.src)
            .unwrap()
            .all(|e| xattr_names(&e.unwrap().path()).is_empty()),
        "no records written"
    );
}

#[test]
fn cifs_mode_shows_fixed_owner_and_modes() {
    let f = Fixture::new();
    populate(&f);
    let _m = f.mount(&format!(
        "mode=cifs,gid={G},uid=1000,file_mode=0664,dir_mode=0775"
    ));
    assert_eq!(owner(&f.mnt.join("a.txt")), (1000, G, 0o664));
    assert_eq!(owner(&f.mnt.join("dir")), (1000, G, 0o775));
    // The owner's chmod passes the kernel check and has no effect...
    let ran = run_as(
        1000,
        1000,
        &[G],
        &format!(
            "chmod 600 {0}/a.txt && chown 1000:{G} {0}/a.txt",
            f.mnt.display()
        ),
    );
    assert!(ran.ok, "{ran:?}");
    assert_eq!(owner(&f.mnt.join("a.txt")), (1000, G, 0o664));
    // ...a non-owner's fails, as on a CIFS mount.
    let ran = run_as(
        MEMBER,
        MEMBER,
        &[G],
        &format!("chmod 600 {}/a.txt", f.mnt.display()),
    );
    assert!(
        !ran.ok && ran.stderr.contains("Operation not permitted"),
        "{ran:?}"
    );
    // Removing every write bit sets the read-only attribute; even root cannot write.
    chmod(&f.mnt.join("a.txt"), 0o444);
    assert_eq!(
        owner(&f.mnt.join("a.txt")).2,
        0o444,
        "file_mode without w bits"
    );
    assert_eq!(
        errno(
            fs::OpenOptions::new()
                .append(true)
                .open(f.mnt.join("a.txt"))
        ),
        libc::EACCES
    );
    // New files show the fixed owner, whoever made them.
    let ran = run_as(
        MEMBER,
        MEMBER,
        &[G],
        &format!("echo x > {}/made", f.mnt.display()),
    );
    assert!(ran.ok, "{ran:?}");
    assert_eq!(owner(&f.mnt.join("made")), (1000, G, 0o664));
    assert_eq!(
        owner(&f.src.join("a.txt")),
        (1234, 1234, 0o644),
        "disk untouched"
    );
    // Adding a write bit clears it again.
    chmod(&f.mnt.join("a.txt"), 0o644);
    assert_eq!(owner(&f.mnt.join("a.txt")).2, 0o664);
    fs::OpenOptions::new()
        .append(true)
        .open(f.mnt.join("a.txt"))
        .unwrap();
}

#[test]
fn cifs_read_only_attribute_persists() {
    let f = Fixture::new();
    populate(&f);
    {
        let _m = f.mount(&format!("mode=cifs,gid={G}"));
        chmod(&f.mnt.join("a.txt"), 0o555);
        // A file created without write bits is read-only from birth, as CIFS does.
        let ran = run_as(
            0,
            0,
            &[],
            &format!("umask 0222; echo x > {}/ro-born", f.mnt.display()),
        );
        assert!(ran.ok, "{ran:?}");
    }
    let _m = f.mount(&format!("mode=cifs,gid={G}"));
    assert_eq!(
        owner(&f.mnt.join("a.txt")),
        (0, G, 0o555),
        "CIFS defaults: uid 0, 0755 minus w"
    );
    assert_eq!(owner(&f.mnt.join("ro-born")).2, 0o555);
    assert_eq!(owner(&f.mnt.join("dir")).2, 0o755);
}

#[test]
fn cifs_noperm_skips_permission_checks() {
    let f = Fixture::new();
    populate(&f);
    let _m = f.mount(&format!("mode=cifs,gid={G},file_mode=0644,noperm"));
    // 0644 owned by uid 0, and yet anyone may write and chmod.
    let ran = run_as(
        OUTSIDER,
        OUTSIDER,
        &[],
        &format!(
            "echo x >> {0}/a.txt && chmod 600 {0}/a.txt",
            f.mnt.display()
        ),
    );
    assert!(ran.ok, "{ran:?}");
    assert_eq!(
        owner(&f.mnt.join("a.txt")),
        (0, G, 0o644),
        "chmod had no effect"
    );
    let opts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = opts
        .lines()
        .find(|l| l.contains(&*f.mnt.to_string_lossy()))
        .unwrap()
        .to_string();
    assert!(!line.contains("default_permissions"), "{line}");
}

#[test]
fn read_only_views_refuse_every_change() {
    let f = Fixture::new();
    populate(&f);
    chmod(&f.src.join("a.txt"), 0o600);
    let _m = f.mount(&format!("gid={G},ro"));
    assert_eq!(owner(&f.mnt.join("a.txt")), (1234, G, 0o640), "0600 | 0440");
    assert_eq!(
        owner(&f.mnt.join("dir")),
        (1234, G, 0o2755),
        "0755 | 0550 | setgid"
    );
    let ran = run_as(
        MEMBER,
        MEMBER,
        &[G],
        &format!("cat {}/a.txt", f.mnt.display()),
    );
    assert!(ran.ok, "members read: {ran:?}");
    let m = &f.mnt;
    assert_eq!(errno(fs::write(m.join("a.txt"), "x")), libc::EROFS);
    assert_eq!(errno(fs::write(m.join("new"), "x")), libc::EROFS);
    assert_eq!(errno(fs::create_dir(m.join("d2"))), libc::EROFS);
    assert_eq!(errno(fs::remove_file(m.join("a.txt"))), libc::EROFS);
    assert_eq!(errno(fs::rename(m.join("a.txt"), m.join("b"))), libc::EROFS);
    assert_eq!(
        errno(fs::set_permissions(
            m.join("a.txt"),
            std::os::unix::fs::PermissionsExt::from_mode(0o777)
        )),
        libc::EROFS
    );
    assert_eq!(
        errno(std::os::unix::fs::lchown(m.join("a.txt"), Some(1), None)),
        libc::EROFS
    );
    assert_eq!(
        fs::read_to_string(f.src.join("a.txt")).unwrap(),
        "content of a.txt\n"
    );
}

fn xattr_names(p: &std::path::Path) -> Vec<String> {
    let out = std::process::Command::new("getfattr")
        .args(["-h", "--absolute-names", "-m", "-", "-d"])
        .arg(p)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split('=').next().unwrap().to_string())
        // The LSM's own label, which SELinux gives every file made on a labelled file
        // system (an SELinux node, the VM tier's): not the view's.
        .filter(|n| n != "security.selinux")
        .collect()
}

#[test]
fn the_ownership_record_is_hidden_and_untouchable() {
    let f = Fixture::new();
    populate(&f);
    let _m = f.mount(&format!("gid={G}"));
    chmod(&f.mnt.join("a.txt"), 0o600);
    sh(&format!(
        "setfattr -n user.colour -v blue {}/a.txt",
        f.mnt.display()
    ));
    assert_eq!(
        xattr_names(&f.src.join("a.txt")),
        vec!["trusted.mountgroup.owner", "user.colour"],
        "on disk both"
    );
    assert_eq!(
        xattr_names(&f.mnt.join("a.txt")),
        vec!["user.colour"],
        "through the view only the user's"
    );
    let view_file = f.mnt.join("a.txt");
    let v = view_file.display();
    for (what, cmd) in [
        ("get", format!("getfattr -n trusted.mountgroup.owner {v}")),
        (
            "set",
            format!("setfattr -n trusted.mountgroup.owner -v 0sAQ3oAwAAAAAAAP8BAAA= {v}"),
        ),
        (
            "remove",
            format!("setfattr -x trusted.mountgroup.owner {v}"),
        ),
        (
            "set another trusted",
            format!("setfattr -n trusted.other -v 1 {v}"),
        ),
        (
            "set security",
            format!("setfattr -n security.capability -v 0sAQAAAgAgAAAAAAAAAAAAAAAAAAA= {v}"),
        ),
    ] {
        let ran = run_as(0, 0, &[], &cmd);
        assert!(!ran.ok, "{what} through the view must fail: {ran:?}");
    }
    assert_eq!(owner(&f.mnt.join("a.txt")).2, 0o600, "record intact");
    assert_eq!(
        xattr_names(&f.src.join("a.txt")),
        vec!["trusted.mountgroup.owner", "user.colour"]
    );
    sh(&format!("setfattr -x user.colour {v}"));
    assert_eq!(
        xattr_names(&f.src.join("a.txt")),
        vec!["trusted.mountgroup.owner"]
    );
}

#[test]
fn data_round_trips_with_and_without_passthrough() {
    for opt in ["passthrough=auto", "passthrough=off"] {
        let f = Fixture::new();
        let m = f.mount(&format!("gid={G},{opt}"));
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        fs::write(f.mnt.join("blob"), &data).unwrap();
        assert_eq!(fs::read(f.mnt.join("blob")).unwrap(), data, "{opt}");
        assert_eq!(
            fs::read(f.src.join("blob")).unwrap(),
            data,
            "{opt}: on disk"
        );
        // Truncate, append, sparse write.
        let file = fs::OpenOptions::new()
            .write(true)
            .open(f.mnt.join("blob"))
            .unwrap();
        file.set_len(10).unwrap();
        std::os::unix::fs::FileExt::write_at(&file, b"end", 100).unwrap();
        drop(file);
        let got = fs::read(f.src.join("blob")).unwrap();
        assert_eq!(got.len(), 103, "{opt}");
        assert_eq!(&got[..10], &data[..10]);
        assert_eq!(&got[100..], b"end");
        fs::write(f.mnt.join("seq"), b"").unwrap();
        for i in 0..5 {
            use std::io::Write;
            let mut a = fs::OpenOptions::new()
                .append(true)
                .open(f.mnt.join("seq"))
                .unwrap();
            write!(a, "{i}").unwrap();
        }
        assert_eq!(
            fs::read_to_string(f.src.join("seq")).unwrap(),
            "01234",
            "{opt}: O_APPEND"
        );
        let log = m.log_text();
        // `auto`: passthrough where this kernel offers it (Linux 6.9+).
        let expect = if opt == "passthrough=off" || !kernel_fuse().passthrough {
            "passthrough=false"
        } else {
            "passthrough=true"
        };
        assert!(log.contains(expect), "{opt}: {log}");
    }
}

#[test]
fn forgotten_inodes_release_their_descriptors() {
    let f = Fixture::new();
    for i in 0..3000 {
        fs::write(f.src.join(format!("f{i}")), "x").unwrap();
    }
    let m = f.mount(&format!("gid={G},attr_timeout=0,entry_timeout=0"));
    let fds = || {
        fs::read_dir(format!("/proc/{}/fd", m.pid()))
            .unwrap()
            .count()
    };
    let baseline = fds();
    for i in 0..3000 {
        fs::metadata(f.mnt.join(format!("f{i}"))).unwrap();
    }
    let walked = fds();
    assert!(
        walked >= baseline + 2900,
        "one O_PATH descriptor per looked-up inode: {baseline} -> {walked}"
    );
    // Dropping the kernel's dentries and inodes sends FORGETs (fs/fuse/inode.c
    // `fuse_evict_inode`). One drop may free a dentry only after the inode shrinker's
    // pass, leaving its inode cached until the next drop (seen on 6.1 under TCG):
    // drop again until they are gone.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while fds() > baseline + 50 && std::time::Instant::now() < deadline {
        fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        fds() <= baseline + 50,
        "descriptors released after forget: {} (baseline {baseline})",
        fds()
    );
}

#[test]
fn hard_links_share_one_inode_and_one_record() {
    let f = Fixture::new();
    populate(&f);
    let _m = f.mount(&format!("gid={G}"));
    fs::hard_link(f.mnt.join("a.txt"), f.mnt.join("a2")).unwrap();
    chmod(&f.mnt.join("a2"), 0o640);
    let a = fs::metadata(f.mnt.join("a.txt")).unwrap();
    let b = fs::metadata(f.mnt.join("a2")).unwrap();
    assert_eq!(a.ino(), b.ino());
    assert_eq!(a.nlink(), 2);
    assert_eq!(owner(&f.mnt.join("a.txt")).2, 0o640);
}

#[test]
fn device_nodes_are_refused_fifos_are_not() {
    let f = Fixture::new();
    let _m = f.mount(&format!("gid={G}"));
    let ran = run_as(0, 0, &[], &format!("mknod {}/null c 1 3", f.mnt.display()));
    assert!(!ran.ok, "{ran:?}");
    assert!(!f.src.join("null").exists());
    sh(&format!("mkfifo {}/pipe", f.mnt.display()));
    let m = fs::symlink_metadata(f.mnt.join("pipe")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&m.file_type()));
    assert_eq!(m.gid(), G);
}

#[test]
fn kernel_rules_apply_to_the_presented_attributes() {
    let f = Fixture::new();
    let _m = f.mount(&format!("gid={G},attr_timeout=0"));
    let file = f.mnt.join("suid");
    fs::write(&file, "x").unwrap();
    chmod(&file, 0o6775);
    assert_eq!(owner(&file).2, 0o6775, "recorded, shown (never on disk)");
    assert_eq!(owner(&f.src.join("suid")).2 & 0o6000, 0);
    // A write by someone else clears the set-id bits, as on any file system.
    let ran = run_as(
        MEMBER,
        MEMBER,
        &[G],
        &format!("echo y >> {}", file.display()),
    );
    assert!(ran.ok, "{ran:?}");
    assert_eq!(owner(&file).2, 0o775);
    // No POSIX ACLs: setfacl is told the file system has none.
    let ran = run_as(0, 0, &[], &format!("setfacl -m u:5:r {}", file.display()));
    assert!(
        !ran.ok && ran.stderr.contains("Operation not supported"),
        "{ran:?}"
    );
    // Locks are the kernel's, within the view.
    sh(&format!("flock {} true", file.display()));
    // statfs is the backing file system's.
    let view = rustix::fs::statvfs(&f.mnt).unwrap();
    let disk = rustix::fs::statvfs(&f.src).unwrap();
    assert_eq!(
        (view.f_blocks, view.f_bsize, view.f_files),
        (disk.f_blocks, disk.f_bsize, disk.f_files)
    );
}

#[test]
fn listings_show_files_created_behind_the_views_back() {
    // The kernel may cache listings (FOPEN_CACHE_DIR); a change on the share, or
    // through another view, must still show once the attribute timeout has passed.
    let f = Fixture::new();
    fs::write(f.src.join("first"), "x").unwrap();
    let _m = f.mount(&format!("gid={G}"));
    let names = || -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(&f.mnt)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(), vec!["first"]);
    fs::write(f.src.join("second"), "x").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while names() != vec!["first", "second"] {
        assert!(
            std::time::Instant::now() < deadline,
            "the listing never showed the new file: {:?}",
            names()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn a_walk_stats_what_it_lists_without_a_lookup_per_entry_and_a_listing_looks_nothing_up() {
    let f = Fixture::new();
    for d in ["a", "b", "c", "d", "names"] {
        fs::create_dir(f.src.join(d)).unwrap();
        for i in 0..800 {
            fs::write(f.src.join(d).join(format!("f{i:03}")), "").unwrap();
        }
    }
    // Long timeouts: what the walk's second directory saves must not expire while a
    // slow machine (TCG) walks it.
    let (_m, metrics) = mount_counted(&f, &format!("gid={G},attr_timeout=60,entry_timeout=60"));
    let walk = |d: &str| {
        // Like find: the whole directory is read first, then every entry stated (a stat
        // between reads would make the kernel itself ask for attributes next).
        let entries: Vec<_> = fs::read_dir(f.mnt.join(d))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(entries.len(), 800);
        for e in entries {
            assert_eq!(fs::symlink_metadata(e).unwrap().gid(), G);
        }
    };
    // Names only: a listing that stats nothing costs no lookup. Directories show a
    // 1 MiB block size, glibc sizes its buffer by it, and the kernel asks for that
    // much: the 800 names come in one request where a 32 KiB buffer took five.
    assert_eq!(
        fs::metadata(f.mnt.join("names")).unwrap().blksize(),
        1 << 20
    );
    let before = op_counts(&metrics, std::time::SystemTime::now());
    assert_eq!(fs::read_dir(f.mnt.join("names")).unwrap().count(), 800);
    let after = op_counts(&metrics, std::time::SystemTime::now());
    let delta =
        |op: &str| after[op]["count"].as_u64().unwrap() - before[op]["count"].as_u64().unwrap_or(0);
    assert!(delta("lookup") < 5);
    let readdirs = delta("readdir");
    if kernel_at_least(6, 16) {
        assert!(readdirs <= 2, "{readdirs} requests to list 800 names");
    } else {
        // Before Linux 6.16 (dabb90391028, "fuse: increase readdir buffer size") the
        // kernel asks for a page a request, whatever the caller's buffer: about 25
        // READDIRPLUS entries each.
        assert!(
            readdirs <= 800 / 20,
            "{readdirs} requests to list 800 names"
        );
    }
    // The first directory of a walk is a lookup per entry (nothing told the view yet);
    // from the second on, the listing carries what the walk stats. The two walks run
    // back to back: the counters are written once a second, and waiting for them
    // between the walks could outlast the walk window, which the listing of "b" would
    // then rightly treat as no walk.
    let walks = |first: &str, second: &str| {
        let before = count(&metrics, "lookup");
        walk(first);
        walk(second);
        count(&metrics, "lookup") - before
    };
    // "a": its directory and each entry. "b": its directory and its probes, one entry
    // in 256, each a LOOKUP round trip when stated (one in 16 would be 50). The rest
    // of the margin is for directories revalidated during a slow walk.
    let for_a = 801;
    let limit = for_a + 800 / 32;
    let mut made = walks("a", "b");
    if made > limit {
        // Once more on two other directories: a VM under TCG can stall for longer
        // than the walk window (a second) between the walk's probes and its next
        // listing, which then rightly is no walk's (CI saw 1607 lookups on 5.15).
        eprintln!("{made} lookups for the walks of a and b; again on c and d");
        made = walks("c", "d");
    }
    assert!(
        made <= limit,
        "{made} lookups for two walks of 800 listed entries, the first {for_a}"
    );
}

/// A walk made again once the entries' timeouts have passed (`du` every minute, a
/// build's second scan, `ls -l` run twice) is no slower than the first. The kernel
/// keeps listings (FOPEN_CACHE_DIR) but not the attributes that came with them, so a
/// listing it serves itself left every entry stated after it to a LOOKUP round trip:
/// 2400 of them for these three directories, and a second walk of 100,000 files took
/// three times as long as the first.
#[test]
fn a_walk_made_again_after_the_timeouts_is_not_a_lookup_per_entry() {
    let f = Fixture::new();
    let dirs = ["a", "b", "c"];
    for d in dirs {
        fs::create_dir(f.src.join(d)).unwrap();
        for i in 0..800 {
            fs::write(f.src.join(d).join(format!("f{i:03}")), "").unwrap();
        }
    }
    // Timeouts of 3 s, not 1: the stats of a walk must follow its listing within the
    // attributes' timeout, and a VM under TCG, its two CPUs shared with other tests,
    // stalled past 1 s (804 lookups, on 6.12 with SELinux and on 6.1).
    let (_m, metrics) = mount_counted(&f, &format!("gid={G},attr_timeout=3,entry_timeout=3"));
    let walk = |d: &str| {
        let entries: Vec<_> = fs::read_dir(f.mnt.join(d))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(entries.len(), 800);
        for e in entries {
            assert_eq!(fs::symlink_metadata(e).unwrap().gid(), G);
        }
    };
    for d in dirs {
        walk(d);
    }
    // Past the entry and attribute timeouts (3 s) and the walk window (1 s).
    let past_timeouts = || std::thread::sleep(std::time::Duration::from_millis(3500));
    past_timeouts();
    let before = count(&metrics, "lookup");
    for d in dirs {
        walk(d);
    }
    let again = count(&metrics, "lookup") - before;
    // "a": the kernel lists it from its cache and asks again for each entry (801),
    // which tells the view a walk is on; "b" and "c" are then listed with their
    // attributes, but for their probes.
    assert!(
        again <= 801 + 2 * 800 / 32,
        "{again} lookups to walk 2400 entries again, the first directory 801"
    );
    // One directory walked again and again (`ls -l` in a loop): the view remembers
    // that it is walked and lists it with attributes.
    let walk_again = || {
        past_timeouts();
        let before = count(&metrics, "lookup");
        walk("a");
        count(&metrics, "lookup") - before
    };
    let mut third = walk_again();
    if third > 800 / 32 {
        // Once more: a VM under TCG can stall for longer than the attributes' second
        // between the listing and the stats that use it (CI saw 804 lookups on 6.12
        // with SELinux). A directory walked again and again is listed with attributes
        // every time.
        eprintln!("{third} lookups to walk a again; once more");
        third = walk_again();
    }
    assert!(
        third <= 800 / 32,
        "{third} lookups to walk a directory walked before"
    );
}

/// A walk finds the directories it lists next warmed (fs/ahead.rs): the view listed
/// them ahead, on its own thread, while the walker worked through the one before, and
/// opened their entries, which the walker's lookups then took.
#[test]
fn a_walk_lists_the_next_directories_ahead() {
    let f = Fixture::new();
    let dirs: Vec<String> = (0..6).map(|i| format!("d{i}")).collect();
    for d in &dirs {
        fs::create_dir(f.src.join(d)).unwrap();
        for i in 0..300 {
            fs::write(f.src.join(d).join(format!("f{i:03}")), "").unwrap();
        }
    }
    let (_m, metrics) = mount_counted(&f, &format!("gid={G}"));
    // Depth first, as find goes: the root, then each directory listed whole and
    // every entry stated.
    let mut listed: Vec<String> = fs::read_dir(&f.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    listed.sort();
    assert_eq!(listed, dirs);
    for d in fs::read_dir(&f.mnt).unwrap() {
        let entries: Vec<_> = fs::read_dir(d.unwrap().path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(entries.len(), 300);
        for e in entries {
            assert_eq!(fs::symlink_metadata(e).unwrap().gid(), G);
        }
    }
    // The first directory tells the view a walk is on; from the second on, the next
    // two are warmed as each starts.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let warmed = metrics_snapshot(&metrics, std::time::SystemTime::now())["walked_ahead"]
            .as_u64()
            .unwrap_or(0);
        if warmed >= 3 {
            assert!(warmed <= 6, "{warmed} directories warmed of 6");
            let snapshot = metrics_snapshot(&metrics, std::time::SystemTime::now());
            let opened = snapshot["opened_ahead"].as_u64().unwrap_or(0);
            assert!(
                opened > 0 && opened <= 6 * 300,
                "{opened} lookups answered with entries opened ahead, of 1800"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{warmed} directories warmed ahead of a walk of 6"
        );
    }
}

/// Runs `c`, which must succeed.
fn run_ok(c: &mut std::process::Command) {
    let out = c
        .output()
        .expect("e2fsprogs, util-linux and mount are installed");
    assert!(
        out.status.success(),
        "{c:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A backing of its own, which can be frozen: an ext4 image mounted in the fixture,
/// unmounted (after the view) whatever happens to the test.
fn ext4_backing(f: &Fixture) -> Unmount {
    use std::process::Command;
    let img = f.dir.path().join("backing.img");
    fs::File::create(&img).unwrap().set_len(64 << 20).unwrap();
    run_ok(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&img));
    let backing = f.subdir("backing");
    run_ok(
        Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(&backing),
    );
    Unmount(backing)
}

/// A file system frozen for a snapshot (`fsfreeze`): every change waits, reads go on.
/// Thawed when dropped (before the view stops: a frozen backing would hold it).
struct Frozen<'a>(&'a std::path::Path);

impl<'a> Frozen<'a> {
    fn freeze(path: &'a std::path::Path) -> Frozen<'a> {
        run_ok(std::process::Command::new("fsfreeze").arg("-f").arg(path));
        Frozen(path)
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        let _ = std::process::Command::new("fsfreeze")
            .arg("-u")
            .arg(self.0)
            .output();
    }
}

/// A request stuck alone while the view answers everything else shows in the view's
/// metrics, with how long it has waited. A backing file system frozen for a snapshot
/// (`fsfreeze`) holds every change and lets every read through: a create in a
/// subdirectory waits, and the keeper's liveness check, a lookup in the root that the
/// view answers, passes meanwhile.
#[test]
fn a_request_stuck_alone_is_timed_in_the_metrics() {
    let f = Fixture::new();
    let backing = ext4_backing(&f);
    fs::create_dir(backing.0.join("sub")).unwrap();
    let metrics = f.dir.path().join("view.json");
    let _view = Mounted::start(
        &backing.0,
        &f.mnt,
        &[
            "-o",
            &format!("gid={G}"),
            "--metrics-file",
            metrics.to_str().unwrap(),
        ],
    )
    .unwrap();
    let oldest = || {
        metrics_snapshot(&metrics, std::time::SystemTime::now())["oldest_request_seconds"]
            .as_f64()
            .unwrap_or(0.0)
    };
    assert_eq!(oldest(), 0.0);
    let thaw = Frozen::freeze(&backing.0);
    let path = f.mnt.join("sub/new");
    let stuck = std::thread::spawn(move || fs::write(path, "x"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while oldest() < 2.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the waiting create never showed"
        );
    }
    let alive = fs::symlink_metadata(f.mnt.join(".mountgroup.alive")).unwrap_err();
    assert_eq!(
        alive.raw_os_error(),
        Some(libc::ENOENT),
        "the liveness check passes"
    );
    assert!(!stuck.is_finished());
    drop(thaw);
    stuck.join().unwrap().unwrap();
    assert_eq!(fs::read(f.mnt.join("sub/new")).unwrap(), b"x");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while oldest() != 0.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the answered request still shows"
        );
    }
}

/// The view's worker threads named `prefix…` (`fuser-x`: those started beyond
/// `threads=`).
fn workers_named(pid: u32, prefix: &str) -> usize {
    fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter(|t| fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix)))
        .count()
}

/// Requests that wait on the backing file system hold up no other (`max_threads=`, 64
/// unless given): a snapshot's freeze (`fsfreeze`) holds every create, each in a
/// directory of its own (the kernel lets one create into a directory at a time), more
/// of them than `threads=`, and a stat of another file is answered meanwhile by a
/// worker started for it. The workers started so end once they have waited a while
/// for a request.
#[test]
fn requests_waiting_on_the_backing_hold_up_no_other() {
    use std::time::{Duration, Instant};
    let f = Fixture::new();
    let backing = ext4_backing(&f);
    const STUCK: usize = 4;
    for i in 0..STUCK {
        fs::create_dir(backing.0.join(format!("sub{i}"))).unwrap();
    }
    fs::write(backing.0.join("other"), "x").unwrap();
    let view = Mounted::start(&backing.0, &f.mnt, &["-o", &format!("gid={G},threads=2")]).unwrap();
    let thaw = Frozen::freeze(&backing.0);
    let creates: Vec<_> = (0..STUCK)
        .map(|i| {
            let path = f.mnt.join(format!("sub{i}/new"));
            std::thread::spawn(move || fs::write(path, "x"))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while workers_named(view.pid(), "fuser-x") < STUCK - 2 {
        assert!(
            Instant::now() < deadline,
            "no worker was started for the waiting creates"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let other = f.mnt.join("other");
    let stat = std::thread::spawn(move || fs::metadata(other).map(|m| m.len()));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !stat.is_finished() {
        assert!(
            Instant::now() < deadline,
            "the stat waited behind the creates"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(stat.join().unwrap().unwrap(), 1);
    assert!(
        creates.iter().all(|c| !c.is_finished()),
        "the freeze held no create"
    );
    drop(thaw);
    for c in creates {
        c.join().unwrap().unwrap();
    }
    for i in 0..STUCK {
        assert_eq!(fs::read(f.mnt.join(format!("sub{i}/new"))).unwrap(), b"x");
    }
    // Idle again, the view goes back to its threads= workers.
    let deadline = Instant::now() + Duration::from_secs(60);
    while workers_named(view.pid(), "fuser-x") > 0 {
        assert!(Instant::now() < deadline, "the started workers never ended");
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(view);
}

/// A name that is not there is remembered as absent for the entry timeout, as a name
/// that is there is remembered: stats of a missing file after the first ask the daemon
/// nothing. A file made through this view shows at once; one made behind its back
/// (another view, the backend) once the timeout has passed.
#[test]
fn a_missing_name_is_remembered_for_the_entry_timeout() {
    let f = Fixture::new();
    let (_m, metrics) = mount_counted(&f, &format!("gid={G},entry_timeout=3"));
    let before = count(&metrics, "lookup");
    for _ in 0..5 {
        let e = fs::symlink_metadata(f.mnt.join("absent")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    }
    assert_eq!(
        count(&metrics, "lookup") - before,
        1,
        "one lookup for five stats of a missing name"
    );
    fs::write(f.mnt.join("absent"), "x").unwrap();
    assert_eq!(fs::read(f.mnt.join("absent")).unwrap(), b"x");
    assert!(fs::symlink_metadata(f.mnt.join("later")).is_err());
    fs::write(f.src.join("later"), "x").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while fs::symlink_metadata(f.mnt.join("later")).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "a file made behind the view never showed"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// `attr_timeout` bounds how long the kernel keeps attributes from every reply that
/// carries them: a walk's listing and a create, not only a lookup, also when names
/// are kept longer (`entry_timeout`). Both replies gave the attributes the entry's
/// time: with `entry_timeout=600,attr_timeout=0`, a size changed on the backing
/// stayed hidden for ten minutes (docs/SEMANTICS.md: a change made on the backing
/// shows within `attr_timeout`).
#[test]
fn attributes_from_listings_and_creates_expire_with_attr_timeout() {
    use std::io::Write;
    let f = Fixture::new();
    let dirs = ["a", "b", "c"];
    for d in dirs {
        fs::create_dir(f.src.join(d)).unwrap();
        for i in 0..100 {
            fs::write(f.src.join(d).join(format!("f{i:02}")), "x").unwrap();
        }
    }
    let (_m, metrics) = mount_counted(&f, &format!("gid={G},entry_timeout=600,attr_timeout=0"));
    // A walk: after the first directory the view lists with attributes.
    for d in dirs {
        for e in fs::read_dir(f.mnt.join(d)).unwrap() {
            assert_eq!(fs::symlink_metadata(e.unwrap().path()).unwrap().len(), 1);
        }
    }
    let lookups =
        metrics_snapshot(&metrics, std::time::SystemTime::now())["ops"]["lookup"]["count"]
            .as_u64()
            .unwrap_or(0);
    assert!(
        lookups < 200,
        "{lookups} lookups: the last directories were listed with attributes"
    );
    let created = f.mnt.join("c").join("new");
    fs::File::create(&created).unwrap();
    assert_eq!(fs::symlink_metadata(&created).unwrap().len(), 0);
    // Grown on the backing, behind the view's back.
    for name in ["f00", "f99", "new"] {
        let mut file = fs::OpenOptions::new()
            .append(true)
            .open(f.src.join("c").join(name))
            .unwrap();
        file.write_all(b"grown").unwrap();
    }
    for name in ["f00", "f99", "new"] {
        let shown = fs::symlink_metadata(f.mnt.join("c").join(name))
            .unwrap()
            .len();
        let on_disk = fs::symlink_metadata(f.src.join("c").join(name))
            .unwrap()
            .len();
        assert_eq!(
            shown, on_disk,
            "{name}: the size before the change is still shown"
        );
    }
}

/// A group view and a CIFS view show no file capabilities, as they show no set-id bit
/// but their records': the kernel's `security.capability` lookup before a write
/// (after each refresh of a file's attributes) is answered without the share. A view
/// that shows the disk shows them, as a native view does.
#[test]
fn only_a_view_that_shows_the_disk_shows_file_capabilities() {
    use rustix::fs::{XattrFlags, getxattr, listxattr, setxattr};
    let f = Fixture::new();
    // cap_net_raw+ep, as setcap writes it (VFS_CAP_REVISION_2, effective).
    let mut caps = Vec::new();
    for word in [0x0200_0001u32, 1 << 13, 0, 0, 0] {
        caps.extend_from_slice(&word.to_le_bytes());
    }
    let give_caps = || {
        setxattr(
            f.src.join("tool"),
            "security.capability",
            &caps,
            XattrFlags::empty(),
        )
        .unwrap()
    };
    fs::write(f.src.join("tool"), "x").unwrap();
    give_caps();
    let shown = |mnt: &std::path::Path| {
        let mut value = vec![0u8; 64];
        let got = getxattr(mnt.join("tool"), "security.capability", &mut value)
            .map(|n| value[..n].to_vec());
        let mut names = vec![0u8; 4096];
        let n = listxattr(mnt.join("tool"), &mut names).unwrap();
        let listed = names[..n]
            .split(|b| *b == 0)
            .any(|name| name == b"security.capability");
        (got, listed)
    };
    for options in [
        "gid=4242",
        "gid=4242,mode=cifs,uid=1000,file_mode=0640,dir_mode=0750",
    ] {
        let _m = f.mount(options);
        assert_eq!(
            shown(&f.mnt),
            (Err(rustix::io::Errno::NODATA), false),
            "{options}"
        );
        // A write after the attributes were refreshed still works, and the backing
        // file system drops the capability itself, as on any write.
        std::thread::sleep(std::time::Duration::from_millis(1100));
        fs::metadata(f.mnt.join("tool")).unwrap();
        fs::OpenOptions::new()
            .append(true)
            .open(f.mnt.join("tool"))
            .and_then(|mut w| std::io::Write::write_all(&mut w, b"y"))
            .unwrap();
        let mut value = vec![0u8; 64];
        assert_eq!(
            getxattr(f.src.join("tool"), "security.capability", &mut value),
            Err(rustix::io::Errno::NODATA),
            "{options}: the share's file lost its capability on the write"
        );
        give_caps();
    }
    let _m = f.mount("");
    assert_eq!(shown(&f.mnt), (Ok(caps.clone()), true), "a plain view");
}

/// A directory's RELEASEDIR and FSYNCDIR are counted as theirs, not as a file's
/// RELEASE and FSYNC: the per-operation metrics tell directories from files.
#[test]
fn directory_releases_and_syncs_are_counted_apart_from_files() {
    let f = Fixture::new();
    fs::create_dir(f.src.join("d")).unwrap();
    let (_m, metrics) = mount_counted(&f, "gid=4242");
    let since = std::time::SystemTime::now();
    let dir = fs::File::open(f.mnt.join("d")).unwrap();
    dir.sync_all().unwrap();
    drop(dir);
    // RELEASEDIR is asynchronous: wait for its count, which the old code never made.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let ops = loop {
        let ops = op_counts(&metrics, since);
        if ops["releasedir"]["count"].as_u64().unwrap_or(0) >= 1 {
            break ops;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no releasedir counted: {ops:#}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(ops["fsyncdir"]["count"].as_u64(), Some(1), "{ops:#}");
    assert_eq!(ops["release"]["count"].as_u64().unwrap_or(0), 0, "{ops:#}");
    assert_eq!(ops["fsync"]["count"].as_u64().unwrap_or(0), 0, "{ops:#}");
}
