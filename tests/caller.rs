//! A view that acts as each caller on its share (`ownership=share`), on a share where
//! the daemon's root is nobody special: the daemon runs without the capabilities that
//! let root override owners and permissions (`CAP_CHOWN`, `CAP_FOWNER`,
//! `CAP_DAC_OVERRIDE`, `CAP_FSETID`), as a root-squashed NFS export treats root. What
//! a pod makes is then its own on the share, and the share decides what it may do;
//! the VM tier shows the same on knfsd (tests/shares.rs).

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;

use common::*;

/// The pod's group, and the volume's own group on disk, shown as the pod's.
const G: u32 = 4242;
const DISK: u32 = 5000;

/// A view of `f.src` as the native twin shows a volume, acting as its callers, served
/// by a daemon whose root overrides no owner or permission.
fn squashed_view(f: &Fixture, options: &str) -> Mounted {
    chown(&f.src, 0, DISK);
    fs::set_permissions(&f.src, fs::Permissions::from_mode(0o2775)).unwrap();
    Mounted::start_with(
        &[
            "setpriv",
            "--bounding-set=-chown,-fowner,-dac_override,-fsetid",
        ],
        &f.src,
        &f.mnt,
        &[
            "-o",
            &format!("mode=native,gid={G},disk_gid={DISK}{options}"),
        ],
    )
    .unwrap()
}

#[test]
fn a_pods_files_are_its_own_on_a_share_that_squashes_the_daemons_root() {
    let f = Fixture::new();
    let m = squashed_view(&f, ",ownership=share");
    let mnt = m.mountpoint.display().to_string();
    // The pod's user: uid 1000, its own group, and the pod's fsGroup.
    let pod = |script: &str| run_as(1000, 1000, &[G], &format!("cd {mnt} && {script}"));
    let ran = pod(
        "umask 002 && touch f && mkdir d && echo key > k && chmod 600 k && chmod 700 d && touch shared && chmod 660 shared && touch secret && chmod 640 secret",
    );
    assert!(ran.ok, "{}", ran.stderr);
    // Programs that make files read-only as they write them (git's objects are made
    // 0444 and written through that descriptor).
    let git = pod(
        "export HOME=$PWD && git init -q repo && cd repo && git config user.email pod@example.com && git config user.name pod && echo x > x && git add x && git commit -qm first && git log --oneline | grep -q first",
    );
    assert!(git.ok, "{}", git.stderr);
    // Its own, on the share and through the view (the volume's group shown as the
    // pod's), with the modes it asked for (chmod(1) keeps a directory's setgid bit,
    // which it inherited).
    for (name, mode) in [("f", 0o664), ("k", 0o600), ("d", 0o2700), ("secret", 0o640)] {
        assert_eq!(
            owner(&f.src.join(name)),
            (1000, DISK, mode),
            "{name} on the share"
        );
        assert_eq!(
            owner(&f.mnt.join(name)),
            (1000, G, mode),
            "{name} in the view"
        );
    }
    // A member of the group writes where the group may, the share checking it as the
    // member of the volume's group it is there.
    let member = run_as(1001, 1001, &[G], &format!("echo more >> {mnt}/shared"));
    assert!(member.ok, "{}", member.stderr);
    assert_eq!(fs::read_to_string(f.src.join("shared")).unwrap(), "more\n");
    // An outsider reads nothing of a 0640 file, nor a 0600 key.
    for name in ["secret", "k"] {
        let outsider = run_as(1002, 1002, &[], &format!("cat {mnt}/{name}"));
        assert!(
            !outsider.ok && outsider.stderr.contains("Permission denied"),
            "{name}: {}",
            outsider.stderr
        );
    }
    // The pod's root is what the share makes of root: it may not give the pod's file
    // away, as root_squash refuses it.
    let root = run_as(0, 0, &[G], &format!("chown 1001 {mnt}/f"));
    assert!(
        !root.ok && root.stderr.contains("Operation not permitted"),
        "{}",
        root.stderr
    );
    assert_eq!(owner(&f.src.join("f")).0, 1000);
    // The owner may hand the group over, and take it back.
    let chgrp = pod("chgrp 1000 f && chgrp 4242 f");
    assert!(chgrp.ok, "{}", chgrp.stderr);
    assert_eq!(owner(&f.src.join("f")), (1000, DISK, 0o664));
}

/// Without `ownership=share` the same view makes a pod's files the daemon's (its chown
/// to the pod is refused) and the pod's chmod of them fails: what `ownership=share`
/// is for.
#[test]
fn without_acting_as_its_callers_a_squashed_daemon_keeps_what_a_pod_makes() {
    let f = Fixture::new();
    let m = squashed_view(&f, "");
    let mnt = m.mountpoint.display().to_string();
    let ran = run_as(1000, 1000, &[G], &format!("cd {mnt} && : > f"));
    assert!(ran.ok, "{}", ran.stderr);
    assert_eq!(owner(&f.src.join("f")).0, 0);
    let ran = run_as(1000, 1000, &[G], &format!("chmod 600 {mnt}/f"));
    assert!(
        !ran.ok && ran.stderr.contains("Operation not permitted"),
        "{}",
        ran.stderr
    );
}

#[test]
fn ownership_share_is_refused_where_the_view_shows_records() {
    let f = Fixture::new();
    for (options, mode) in [
        ("gid=4242,ownership=share", "fsgroup"),
        ("mode=cifs,ownership=share", "cifs"),
    ] {
        let err = Mounted::start(&f.src, &f.mnt, &["-o", options])
            .err()
            .unwrap();
        assert!(
            err.contains(&format!("ownership=share shows the share's own owners: it needs mode=native (the volume's group on disk as `disk_gid=`, shown as `gid=`) or no `gid=`, not mode={mode}")),
            "{options}: {err}"
        );
    }
}
