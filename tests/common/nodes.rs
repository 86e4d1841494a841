//! Two nodes, one share: what tests/shares.rs and tests/ceph.rs run on each share
//! type. Included by them with `#[path]`, beside `common` and `driver`.
#![allow(dead_code)]

use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use super::common::*;
use super::driver::*;

/// What a chown or chmod on one node does to what both show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owners {
    /// Nothing: "success, no effect", as the kernel's CIFS client without records;
    /// a new file shows the daemon's uid.
    NoEffect,
    /// It holds, on both nodes: kept on disk (a native view) or in records on the
    /// share; a new file shows its creator's uid.
    Held,
    /// The share keeps the owners and checks permissions (NFS, its views acting as
    /// their callers): a new file shows its creator's uid, its owner's chmod holds on
    /// both nodes, and root's chown is the server's to refuse (it squashes root).
    OnShare,
}

/// Waits until `check` holds, for at most `limit` (a view's attribute and entry
/// timeouts: what another node's change takes to show).
pub fn eventually(limit: Duration, what: &str, check: impl Fn() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < limit, "{what}, after {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    progress(&format!("{what}: after {:?}", start.elapsed()));
}

/// The volumes a driver's controller lists.
pub async fn listed(c: &mut Clients) -> Vec<String> {
    c.controller
        .list_volumes(mountgroup::csi::pb::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
        .iter()
        .map(|e| e.volume.as_ref().unwrap().volume_id.clone())
        .collect()
}

/// Says how far a test got, on the test program's stderr as it happens (not captured
/// with the test's output): what a test that hangs in the VM shows of itself.
pub fn progress(what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{what}");
}

/// Two nodes, one share: two node plugins, each with its own mount of the share
/// (`mount_node`, its own connection) and its own state, publish one volume
/// (ReadWriteMany) to pods with two fsGroups, each node's view made by
/// `mechanism_made` (the metric's label). What one pod makes, renames or deletes
/// shows through the other within the views' timeouts; chown and chmod mean the same
/// on both (held where the share keeps owners: on disk, or in records; else no effect);
/// the controller of one and the node plugin of the other agree on the volume and on
/// its deletion.
pub async fn two_nodes_publish_one_volume(
    f: &Fixture,
    mount_node: &dyn Fn(&Path) -> Unmount,
    mechanism_made: &str,
    owners: Owners,
) {
    use mountgroup::csi::pb::volume_capability::access_mode::Mode;
    let node = |name: &str| {
        let dir = f.subdir(name);
        fs::create_dir(dir.join("share")).unwrap();
        let mounted = mount_node(&dir.join("share"));
        (dir, mounted)
    };
    let ((a, _a_share), (b, _b_share)) = (node("node-a"), node("node-b"));
    progress("mounted on both nodes");
    let (da, db) = (
        Driver::start_with_metrics_and(&a, &[]),
        Driver::start_with_metrics_and(&b, &[]),
    );
    let (mut ca, mut cb) = (da.clients().await, db.clients().await);
    ca.controller
        .create_volume(create_req("vol", 1 << 30))
        .await
        .unwrap();
    assert!(listed(&mut cb).await.contains(&"vol".to_string()));
    progress("created on A, listed on B");
    let (ta, tb) = (a.join("target"), b.join("target"));
    let (sa, sb) = (a.join("staging"), b.join("staging"));
    for (c, staging, target, group) in [(&mut ca, &sa, &ta, "4242"), (&mut cb, &sb, &tb, "5151")] {
        fs::create_dir_all(staging).unwrap();
        c.node
            .node_stage_volume(stage_req("vol", staging))
            .await
            .unwrap();
        let mut publish = publish_req("vol", staging, target, group);
        publish.volume_capability = Some(mount_cap(&[], group, Mode::MultiNodeMultiWriter));
        c.node.node_publish_volume(publish).await.unwrap();
    }
    let (_ua, _ub) = (Unmount(ta.clone()), Unmount(tb.clone()));
    for (d, target) in [(&da, &ta), (&db, &tb)] {
        assert_eq!(mechanism(&d.metrics_addr(), target).0, mechanism_made);
    }
    progress("published on both");
    // The views' attribute and entry timeouts (1 s) over the client's (actimeo, 1 s),
    // and a lease break between the two clients: a few seconds, bounded well above
    // that so that a slow emulated machine does not fail it.
    let limit = Duration::from_secs(15);
    // A's pod writes; B's pod reads it, with its own group.
    let ran = run_as(
        1000,
        1000,
        &[4242],
        &format!("umask 002 && echo a > {}/f", ta.display()),
    );
    assert!(ran.ok, "{ran:?}");
    eventually(limit, "B sees A's file", || {
        let ran = run_as(2000, 2000, &[5151], &format!("cat {}/f", tb.display()));
        ran.ok && ran.stdout == "a\n"
    });
    let creator = match owners {
        Owners::NoEffect => 0,
        Owners::Held | Owners::OnShare => 1000,
    };
    assert_eq!(owner(&ta.join("f")), (creator, 4242, 0o664));
    assert_eq!(owner(&tb.join("f")), (creator, 5151, 0o664));
    // B's pod appends, renames and makes a directory; A sees each.
    let ran = run_as(
        2000,
        2000,
        &[5151],
        &format!("cd {} && echo b >> f && mv f g && mkdir d", tb.display()),
    );
    assert!(ran.ok, "{ran:?}");
    eventually(limit, "A sees B's directory", || ta.join("d").is_dir());
    let a_share = a.join("share/volumes/vol");
    let names = |dir: &Path| {
        (
            fs::symlink_metadata(dir.join("f"))
                .map(|m| m.ino())
                .map_err(|e| e.kind()),
            fs::symlink_metadata(dir.join("g"))
                .map(|m| m.ino())
                .map_err(|e| e.kind()),
        )
    };
    let rename_seen = || {
        let seen = !ta.join("f").exists() && ta.join("g").exists();
        if !seen {
            progress(&format!(
                "A's view (f, g): {:?}; A's share: {:?}; B's view: {:?}",
                names(&ta),
                names(&a_share),
                names(&tb)
            ));
            std::thread::sleep(Duration::from_millis(950));
        }
        seen
    };
    eventually(limit, "A sees B's rename", rename_seen);
    let seen = || fs::read_to_string(ta.join("g")).unwrap_or_else(|e| e.to_string());
    eventually(
        limit,
        &format!("A sees B's append (A reads {:?})", seen()),
        || seen() == "a\nb\n",
    );
    // A chmod and chown on A: recorded, and seen on B; or no effect on either node;
    // or the owner's chmod holds and root's chown is refused, as the server decides.
    if owners == Owners::OnShare {
        let ran = run_as(
            1000,
            1000,
            &[4242],
            &format!("chmod 600 {}/g", ta.display()),
        );
        assert!(ran.ok, "{ran:?}");
        let ran = run_as(0, 0, &[], &format!("chown 7 {}/g", ta.display()));
        assert!(!ran.ok && ran.stderr.contains("not permitted"), "{ran:?}");
        assert_eq!(owner(&ta.join("g")), (1000, 4242, 0o600));
        eventually(limit, "B sees A's chmod", || {
            owner(&tb.join("g")) == (1000, 5151, 0o600)
        });
        let ran = run_as(2000, 2000, &[5151], &format!("cat {}/g", tb.display()));
        assert!(!ran.ok, "{ran:?}");
    } else {
        let ran = run_as(
            0,
            0,
            &[],
            &format!("chmod 600 {0}/g && chown 7 {0}/g", ta.display()),
        );
        assert!(ran.ok, "{ran:?}");
    }
    match owners {
        Owners::OnShare => {}
        Owners::NoEffect => {
            std::thread::sleep(Duration::from_secs(2));
            assert_eq!(owner(&ta.join("g")), (0, 4242, 0o664));
            assert_eq!(owner(&tb.join("g")), (0, 5151, 0o664));
        }
        Owners::Held => {
            assert_eq!(owner(&ta.join("g")), (7, 4242, 0o600));
            eventually(limit, "B sees A's chmod and chown", || {
                owner(&tb.join("g")) == (7, 5151, 0o600)
            });
            // And the kernel on B enforces it: B's pod reads g no more.
            let ran = run_as(2000, 2000, &[5151], &format!("cat {}/g", tb.display()));
            assert!(!ran.ok, "{ran:?}");
        }
    }
    // B's pod deletes; A sees it gone.
    let ran = run_as(2000, 2000, &[5151], &format!("rm {}/g", tb.display()));
    assert!(ran.ok, "{ran:?}");
    eventually(limit, "A sees B's delete", || !ta.join("g").exists());
    progress("deleted on B, gone on A");
    // Unpublished on both, deleted by B's controller: gone for A's too.
    for (c, staging, target) in [(&mut ca, &sa, &ta), (&mut cb, &sb, &tb)] {
        c.unpublish_unstage("vol", target, staging).await;
    }
    cb.controller
        .delete_volume(mountgroup::csi::pb::DeleteVolumeRequest {
            volume_id: "vol".into(),
            secrets: Default::default(),
        })
        .await
        .unwrap();
    assert!(!listed(&mut ca).await.contains(&"vol".to_string()));
}
