//! The users' shares, served for real on the machine's loopback and mounted with the
//! kernel's own clients as the driver's share: Samba configured as Azure Files serves
//! (no unix extensions, no extended attributes, no DOS attributes), mounted with the
//! CIFS client as docs/DEPLOY.md shows; and knfsd exporting NFS 4.2 with root_squash.
//! They need the cifs, nfs and nfsd modules, which the development machine's kernel
//! lacks: the VM tier runs them (`scripts/vm-test 6.12 --systemd shares --ignored`),
//! and scripts/vm-test installs Samba and nfs-kernel-server.

mod common;
#[path = "common/driver.rs"]
mod driver;
#[path = "common/nodes.rs"]
mod nodes;
#[path = "common/shares.rs"]
mod shares;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use driver::*;
use nodes::*;
use shares::*;

const G: u32 = 4242;

/// What a share keeps of a view's records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kept {
    /// Nothing: no extended attributes (Azure Files).
    Nothing,
    /// `user.*` extended attributes, no `trusted.*` (NFS 4.2, Samba's defaults).
    UserXattrs,
}

/// What a share gives a pod through the driver's default publish, on the mount at
/// `root/share`: a view, never a failed publish, with the semantics the share can
/// hold and why in the metric and the log. Where it keeps `user.*` attributes, a pod
/// sees its own uid on what it makes, and its chmod holds: git and PostgreSQL run as
/// the pod's user. Where it keeps none, CIFS semantics without records.
async fn default_publish_on_a_share(root: &Path, staging: &Path, kept: Kept) {
    let (d, mut c, target, _unmount) = default_publish(root, staging, G).await;
    match kept {
        Kept::Nothing => {
            assert_eq!(
                mechanism(&d.metrics_addr(), &target),
                ("fuse-cifs".into(), "share-keeps-no-records".into())
            );
            assert_cifs_view_without_records(&target, G);
        }
        Kept::UserXattrs => {
            assert_eq!(
                mechanism(&d.metrics_addr(), &target),
                ("fuse-user-xattr".into(), "share-keeps-user-records".into())
            );
            assert_user_records_view(root, &target);
        }
    }
    // Symlinks, as the share holds them (SMB with mfsymlinks, NFS).
    let ran = run_as(
        1000,
        1000,
        &[G],
        &format!("cd {} && ln -s f l && cat l", target.display()),
    );
    assert!(ran.ok && ran.stdout == "x\n", "{ran:?}");
    assert_eq!(fs::read_link(target.join("l")).unwrap(), Path::new("f"));
    // What pods run on such a share, as a member of the group: SQLite in WAL mode
    // (its -shm file mapped shared).
    let ran = run_as(
        1000,
        1000,
        &[G],
        &format!(
            "cd {} && sqlite3 db 'pragma journal_mode=wal; create table t(x); insert into t values (1), (2); select count(*) from t;'",
            target.display()
        ),
    );
    assert!(
        ran.ok && ran.stdout == "wal\n2\n",
        "{ran:?}\n{}",
        sh("dmesg | tail -40")
    );
    // A file made read-only as git copies its templates (`description` is 0444 in
    // some installs): open with O_CREAT|O_EXCL and mode 0444, write, close.
    let ran = run_as(
        1000,
        1000,
        &[G],
        &format!(
            "cd {} && /usr/bin/python3 -c \"import os; fd = os.open('ro', os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444); os.write(fd, b'r'); os.close(fd)\" && cat ro",
            target.display()
        ),
    );
    let views = root.join("state/views");
    let logs = || {
        fs::read_dir(&views)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
            .map(|e| fs::read_to_string(e.path()).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let raw = |dir: &Path, name: &str, flags: &str| {
        run_as(
            0,
            0,
            &[],
            &format!(
                "cd {} && /usr/bin/python3 -c \"import os; fd = os.open('{name}', {flags}, 0o444); os.write(fd, b'r'); os.close(fd); print(oct(os.stat('{name}').st_mode))\"",
                dir.display()
            ),
        )
    };
    let data = root.join("share/volumes/vol");
    assert!(
        ran.ok && ran.stdout == "r",
        "{ran:?}\nthe share itself: {:?}\n{}",
        raw(&data, "raw-ro", "os.O_WRONLY | os.O_CREAT | os.O_EXCL"),
        logs()
    );
    // Kernel passthrough where it works (NFS), the view's own reads and writes on SMB,
    // where passthrough failed the two steps above.
    let fstype = sh(&format!("stat -f -c %T {}", data.display()));
    if kept == Kept::UserXattrs {
        // The records are on the share, in user.mountgroup.owner; the owner on disk
        // is the daemon's (nobody, where the server squashes root).
        let on_disk = sh(&format!("getfattr -d -m - {}/f", data.display()));
        assert!(on_disk.contains("user.mountgroup.owner"), "{on_disk}");
    }
    let smb = fstype.contains("smb") || fstype.contains("cifs");
    assert!(
        logs().contains(&format!("passthrough={}", !smb)),
        "{}",
        logs()
    );
    c.node
        .node_unpublish_volume(unpublish_req("vol", &target))
        .await
        .unwrap();
    c.node
        .node_unstage_volume(unstage_req("vol", staging))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the cifs module and Samba: the VM tier runs it (scripts/vm-test 6.12 --systemd shares --ignored)"]
async fn an_azure_files_like_share_serves_the_default_publish() {
    let f = Fixture::new();
    let root = f.dir.path();
    let s = SambaShare::start(&f, AZURE_FILES);
    let refused = Command::new("setfattr")
        .args(["-n", "user.x", "-v", "1"])
        .arg(&s.share)
        .output()
        .unwrap();
    assert!(
        !refused.status.success(),
        "the share keeps no extended attributes"
    );
    default_publish_on_a_share(root, &f.subdir("staging"), Kept::Nothing).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the cifs module and Samba: the VM tier runs it (scripts/vm-test 6.12 --systemd shares --ignored)"]
async fn a_share_with_sambas_defaults_serves_the_default_publish() {
    let f = Fixture::new();
    let root = f.dir.path();
    // Samba's defaults: extended attributes (user.* only, through SMB), DOS attributes
    // stored in them; SMB3 has no unix extensions without Samba's POSIX extensions.
    let _s = SambaShare::start(&f, "");
    default_publish_on_a_share(root, &f.subdir("staging"), Kept::UserXattrs).await;
}

/// A PersistentVolume's CIFS mount options (as Azure Files users give azurefile-csi's
/// StorageClasses `uid=`, `file_mode=` and `dir_mode=`) on the Azure-like share: the
/// request's CIFS semantics keep records by default, which this share cannot hold, so
/// the view serves the request's owner and modes without records, says why, and
/// chmod and chown succeed with no effect, as on the kernel's CIFS client.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the cifs module and Samba: the VM tier runs it (scripts/vm-test 6.12 --systemd shares --ignored)"]
async fn cifs_mount_options_on_an_azure_files_like_share() {
    let f = Fixture::new();
    let root = f.dir.path();
    let _s = SambaShare::start(&f, AZURE_FILES);
    let d = Driver::start_with_metrics_and(root, &[]);
    let mut c = d.clients().await;
    let staging = f.subdir("staging");
    let target = root.join("target");
    c.controller
        .create_volume(create_req("vol", 1 << 30))
        .await
        .unwrap();
    c.node
        .node_stage_volume(stage_req("vol", &staging))
        .await
        .unwrap();
    let flags = ["uid=1000", "file_mode=0640", "dir_mode=0750"];
    c.node
        .node_publish_volume(publish_flags(
            "vol",
            &staging,
            &target,
            &flags,
            &G.to_string(),
            false,
        ))
        .await
        .unwrap();
    let _unmount = Unmount(target.clone());
    assert_eq!(
        mechanism(&d.metrics_addr(), &target),
        ("fuse-cifs".into(), "share-keeps-no-records".into())
    );
    let as_user = |uid: u32, groups: &[u32], script: &str| {
        run_as(
            uid,
            uid,
            groups,
            &format!("cd {} && {script}", target.display()),
        )
    };
    let ran = as_user(
        1000,
        &[G],
        "echo x > f && mkdir d && echo y > d/g && cat d/g",
    );
    assert!(ran.ok && ran.stdout == "y\n", "{ran:?}");
    assert_eq!(owner(&target.join("f")), (1000, G, 0o640));
    assert_eq!(owner(&target.join("d")), (1000, G, 0o750));
    assert_eq!(owner(&target.join("d/g")), (1000, G, 0o640));
    // Another member of the group reads, as 0640 says, and cannot write.
    let ran = as_user(1001, &[G], "cat f && echo z >> f");
    assert!(!ran.ok && ran.stdout == "x\n", "{ran:?}");
    // Someone outside it cannot read.
    assert!(!as_user(2001, &[], "cat f").ok);
    // chmod and chown: success, no effect.
    let ran = as_user(0, &[], "chmod 666 f && chown 7:7 f");
    assert!(ran.ok, "{ran:?}");
    assert_eq!(owner(&target.join("f")), (1000, G, 0o640));
    c.node
        .node_unpublish_volume(unpublish_req("vol", &target))
        .await
        .unwrap();
    c.node
        .node_unstage_volume(unstage_req("vol", &staging))
        .await
        .unwrap();
}

/// What a view that keeps its records in `user.*` attributes gives pods at `target`:
/// their own uid on what they make, chmod and chown that hold (and that the kernel
/// enforces), git and PostgreSQL as the pod's user.
fn assert_user_records_view(root: &Path, target: &Path) {
    let ran = run_as(
        1000,
        1000,
        &[G],
        &format!(
            "cd {} && echo x > f && mkdir d && echo y > d/g && chmod 600 f && chmod 750 d && cat d/g",
            target.display()
        ),
    );
    assert!(ran.ok && ran.stdout == "y\n", "{ran:?}");
    assert_eq!(owner(&target.join("f")), (1000, G, 0o600));
    let (uid, gid, perm) = owner(&target.join("d"));
    assert_eq!((uid, gid, perm & 0o777), (1000, G, 0o750));
    // The chmod holds: another member of the group is kept out of `f`.
    let ran = run_as(2001, 2001, &[G], &format!("cat {}/f", target.display()));
    assert!(
        !ran.ok && ran.stderr.contains("Permission denied"),
        "{ran:?}"
    );
    // Root's chown holds too; another user's is refused.
    let ran = run_as(
        2001,
        2001,
        &[G],
        &format!("chmod 666 {}/d/g", target.display()),
    );
    assert!(!ran.ok && ran.stderr.contains("not permitted"), "{ran:?}");
    sh(&format!("chown 2001 {}/d/g", target.display()));
    assert_eq!(owner(&target.join("d/g")).0, 2001);
    // git as the pod's user: its templates, its 0444 objects, its chmods.
    let ran = run_as(
        1000,
        1000,
        &[G],
        &format!(
            "cd {} && export HOME=$PWD GIT_CONFIG_NOSYSTEM=1 && git init -q repo && cd repo && echo z > z && git add z && git -c user.email=p@o.d -c user.name=pod commit -qm one && git log --format=%s",
            target.display()
        ),
    );
    assert!(ran.ok && ran.stdout == "one\n", "{ran:?}");
    // PostgreSQL as its own user, a member of the pod's group: initdb makes its data
    // directory 0700, and the server starts only if it is its owner's and 0700.
    let (pg_uid, pg_gid) = postgres_user();
    let made = run_as(
        pg_uid,
        pg_gid,
        &[G],
        &format!(
            "{} -D {}/pg -A trust -U postgres >/dev/null",
            postgres_bin("initdb").display(),
            target.display()
        ),
    );
    assert!(made.ok, "{made:?}");
    // 0700, with the setgid bit of a directory made in the volume, which PostgreSQL
    // does not mind.
    let (uid, gid, perm) = owner(&target.join("pg"));
    assert_eq!((uid, gid, perm & 0o777), (pg_uid, G, 0o700));
    let sockets = root.join("pg-sockets");
    fs::create_dir(&sockets).unwrap();
    fs::set_permissions(
        &sockets,
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .unwrap();
    postgres_runs(&target.join("pg"), &sockets, &[G]).expect("PostgreSQL on the share");
}

/// The share's server crashes and comes back: the view does not die with it, its calls
/// fail or wait while the server is away (as the share's own mount answers them),
/// and it serves again, the same mount and the same process, once the server is back.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the cifs module and Samba: the VM tier runs it (scripts/vm-test 6.12 --systemd shares --ignored)"]
async fn a_view_outlives_its_share_servers_crash() {
    let f = Fixture::new();
    let root = f.dir.path();
    let mut s = SambaShare::start(&f, AZURE_FILES);
    let (_d, mut c, target, _unmount) = default_publish(root, &f.subdir("staging"), G).await;
    let member = |script: &str| {
        run_as(
            1000,
            1000,
            &[G],
            &format!("cd {} && {script}", target.display()),
        )
    };
    let ran = member("echo before > f && exec 3<f && cat f");
    assert!(ran.ok && ran.stdout == "before\n", "{ran:?}");
    // The view's mount, by its id: the same one must serve after the crash.
    let mount_id = || {
        fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .find(|l| l.split(' ').nth(4) == target.to_str())
            .and_then(|l| l.split(' ').next().map(str::to_string))
    };
    let before = mount_id();
    assert!(before.is_some());
    s.samba.crash();
    // While the server is away: whatever the CIFS client answers, in bounded time
    // (a soft mount's error, or the call waits for the reconnection); the view lives.
    let away = member("timeout -s KILL 120 cat f; echo $?");
    eprintln!("while the server was away: {away:?}");
    use mountgroup::sys::mount::{Health, health};
    assert_eq!(
        health(&target),
        Health::Mounted("fuse.mountgroup".into()),
        "{away:?}"
    );
    s.samba.restart();
    // Back: the same view serves what was there and takes new writes, once the CIFS
    // client has reconnected (its echo interval bounds that).
    eventually(Duration::from_secs(180), "the view serves again", || {
        let ran = member("cat f && echo after >> f && cat f");
        ran.ok && ran.stdout.ends_with("before\nafter\n")
    });
    assert_eq!(mount_id(), before);
    assert_eq!(
        fs::read_to_string(s.served.join("volumes/vol/f"))
            .unwrap()
            .lines()
            .next(),
        Some("before")
    );
    c.node
        .node_unpublish_volume(unpublish_req("vol", &target))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the nfs and nfsd modules and knfsd: the VM tier runs it (scripts/vm-test 6.12 --systemd shares --ignored)"]
async fn a_root_squashed_nfs_export_serves_the_default_publish() {
    let f = Fixture::new();
    let root = f.dir.path();
    let export = f.subdir("export");
    // Root is squashed to nobody: the export is nobody's, so that the driver (root,
    // squashed) can lay the share out in it.
    chown(&export, 65534, 65534);
    let _knfsd = Knfsd::start(&export, "rw,root_squash,no_subtree_check,fsid=4242");
    let share = f.subdir("share");
    let _share = mount_nfs(&export, &share, "");
    // Root is squashed: what the driver makes is nobody's on the server.
    fs::write(share.join("probe"), "").unwrap();
    assert_eq!(owner(&export.join("probe")).0, 65534);
    fs::remove_file(share.join("probe")).unwrap();
    default_publish_on_a_share(root, &f.subdir("staging"), Kept::UserXattrs).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the cifs module and Samba: the VM tier runs it (scripts/vm-test 6.12 --systemd shares --ignored)"]
async fn two_nodes_publish_one_volume_of_an_azure_files_like_share() {
    let f = Fixture::new();
    let served = f.subdir("served");
    let samba = Samba::start(&f.dir.path().join("samba"), &served);
    let mount = |at: &Path| mount_cifs(&samba, at, &format!("{DEPLOY_CIFS},nosharesock"));
    two_nodes_publish_one_volume(&f, &mount, "fuse-cifs", Owners::NoEffect).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the nfs and nfsd modules and knfsd: the VM tier runs it (scripts/vm-test 6.12 --systemd shares --ignored)"]
async fn two_nodes_publish_one_volume_of_a_root_squashed_nfs_export() {
    let f = Fixture::new();
    let export = f.subdir("export");
    chown(&export, 65534, 65534);
    let _knfsd = Knfsd::start(&export, "rw,root_squash,no_subtree_check,fsid=4243");
    // The two nodes are one kernel here, and so one NFS client to the server: it keeps
    // the delegation its first node got for a file when the other renames it (a
    // server recalls a delegation from another client only), and a client with a
    // delegation trusts its names of the file (fs/nfs/dir.c,
    // nfs_lookup_revalidate_delegated). Two machines are two clients; without
    // delegations (leases off, for this test) this one behaves as they would.
    let _leases = Leases::off();
    // Each node its own client (nosharecache) with DEPLOY.md's attribute cache bound.
    let mount = |at: &Path| mount_nfs(&export, at, ",nosharecache");
    two_nodes_publish_one_volume(&f, &mount, "fuse-user-xattr", Owners::Held).await;
}
