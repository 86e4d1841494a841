//! The driver played with exactly what kubelet and the pinned sidecars send
//! (tests/common/kubelet.rs builds each request as its upstream function does), and
//! judged by how kubelet reads the answer: a provisioned PVC staged and published
//! with the provisioner's identity and the pod's information, republished without a
//! stage, static PVs, inline and secret volumes, statistics of every kind of view, and
//! expansion codes that kubelet retries rather than gives up on.

mod common;
#[path = "common/driver.rs"]
mod driver;
#[path = "common/keeper.rs"]
mod keeper;
#[path = "common/kubelet.rs"]
mod kubelet;

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::process::Command;

use common::*;
use driver::*;
use keeper::kill_view_for_good;
use kubelet::*;
use mountgroup::csi::pb;
use tonic::Code;

const MIB: i64 = 1 << 20;

fn key_secret(d: &Driver) -> HashMap<String, String> {
    HashMap::from([("shareKey".to_string(), d.key())])
}

/// external-provisioner v5.3.0 `Provision` with `--extra-create-metadata`
/// (deploy/controller.yaml): the PVC's name as the volume name (`pvc-<uid>`), the
/// StorageClass parameters less the `csi.storage.k8s.io/*-secret-*` ones, plus
/// `csi.storage.k8s.io/pvc/name`, `pvc/namespace` and `pv/name`, and the
/// provisioner secret.
async fn provision(
    c: &mut Clients,
    name: &str,
    bytes: i64,
    secrets: &HashMap<String, String>,
) -> pb::Volume {
    c.controller
        .create_volume(pb::CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: bytes,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![pb::VolumeCapability {
                access_type: Some(pb::volume_capability::AccessType::Mount(
                    pb::volume_capability::MountVolume::default(),
                )),
                access_mode: Some(pb::volume_capability::AccessMode {
                    mode: access_mode("ReadWriteMany") as i32,
                }),
            }],
            parameters: HashMap::from([
                (
                    "csi.storage.k8s.io/pvc/name".to_string(),
                    "data".to_string(),
                ),
                (
                    "csi.storage.k8s.io/pvc/namespace".to_string(),
                    "team".to_string(),
                ),
                ("csi.storage.k8s.io/pv/name".to_string(), name.to_string()),
            ]),
            secrets: secrets.clone(),
            ..Default::default()
        })
        .await
        .expect("CreateVolume as csi-provisioner sends it")
        .into_inner()
        .volume
        .unwrap()
}

/// A driver over a real socket, its clients, and a kubelet root directory.
struct Setup {
    // Dropped in this order: the driver (which unmounts what it left) before the
    // fixture's directory is removed.
    c: Clients,
    d: Driver,
    dirs: KubeletDirs,
    f: Fixture,
}

impl Setup {
    /// With `key`, the driver has a share key, as deployed (the StorageClass hands it
    /// to every call as a secret); without, none is needed.
    async fn new(key: bool) -> Setup {
        let f = Fixture::new();
        let d = if key {
            Driver::start_with(f.dir.path(), f.dir.path().join("share"), &[])
        } else {
            Driver::start(f.dir.path())
        };
        let c = d.clients().await;
        let dirs = KubeletDirs {
            root: f.subdir("kubelet"),
        };
        Setup { c, d, dirs, f }
    }
}

/// kubelet's `TearDownAt` for each publish: NodeUnpublishVolume of its target.
async fn unpublish_all(c: &mut Clients, reqs: &[&pb::NodePublishVolumeRequest]) {
    for req in reqs {
        c.node
            .node_unpublish_volume(unpublish_req(&req.volume_id, Path::new(&req.target_path)))
            .await
            .unwrap();
    }
}

/// kubelet's `UnmountDevice` (csi_attacher.go): NodeUnstageVolume of the staging path.
async fn unstage(c: &mut Clients, dirs: &KubeletDirs, id: &str) {
    c.node
        .node_unstage_volume(unstage_req(id, &dirs.staging(id)))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_provisioned_pvc_is_staged_published_and_republished_as_kubelet_sends_it() {
    let mut s = Setup::new(true).await;
    let (d, c, dirs) = (&s.d, &mut s.c, &s.dirs);
    let secrets = key_secret(d);
    let name = "pvc-3f1d9a52-0c6e-4b8e-a1f0-7d2c9e4b5a61";
    let vol = provision(c, name, 64 * MIB, &secrets).await;
    let pv = provisioned_pv(&vol, "ReadWriteMany");
    assert!(
        pv.attributes
            .contains_key("storage.kubernetes.io/csiProvisionerIdentity")
    );

    let a = Pod::new("writer", Some(3001));
    // A pod whose CSIDriver asks for service account tokens (tokenRequests).
    let b = Pod::new("reader-with-token", Some(3002));
    let token = "eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXRva2Vu.sig";
    c.node
        .node_stage_volume(stage(dirs, &pv, &a, &secrets))
        .await
        .expect("NodeStageVolume with the PV's attributes");
    let pub_a = publish_pvc(dirs, &pv, &a, "data", &HashMap::new());
    c.node
        .node_publish_volume(pub_a.clone())
        .await
        .expect("NodePublishVolume with the provisioner identity and the pod's information");
    let pub_b = publish_pvc(
        dirs,
        &pv,
        &b,
        "data",
        &token_attributes("mountgroup", token),
    );
    c.node
        .node_publish_volume(pub_b.clone())
        .await
        .expect("NodePublishVolume with serviceAccount.tokens");
    let target_a = Path::new(&pub_a.target_path);
    let target_b = Path::new(&pub_b.target_path);
    fs::write(target_a.join("from-a"), "a").unwrap();
    assert_eq!(owner(&target_a.join("from-a")).1, 3001);
    assert_eq!(
        owner(&target_b.join("from-a")).1,
        3002,
        "each pod sees its own group"
    );

    // kubelet republishes (requiresRepublish, a kubelet restart) with the same
    // arguments and no NodeStageVolume before it.
    for _ in 0..2 {
        c.node
            .node_publish_volume(pub_a.clone())
            .await
            .expect("a republish");
        c.node
            .node_publish_volume(pub_b.clone())
            .await
            .expect("a republish");
    }
    // The token never reaches the log, not even in an error.
    let mut bad = pub_b.clone();
    bad.volume_capability = Some(mount_cap(
        &[],
        "not-a-group",
        pb::volume_capability::access_mode::Mode::SingleNodeMultiWriter,
    ));
    let e = c.node.node_publish_volume(bad).await.unwrap_err();
    assert!(!e.message().contains(token));
    assert!(!d.log_text().contains(token), "the token was logged");

    unpublish_all(c, &[&pub_a, &pub_b]).await;
    unstage(c, dirs, name).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_static_pv_carries_whatever_its_author_wrote_and_only_our_own_keys_are_checked() {
    let mut s = Setup::new(false).await;
    let (c, dirs) = (&mut s.c, &s.dirs);
    let vol = provision(c, "static-data", 8 * MIB, &HashMap::new()).await;
    // A hand-written PV, as another tool or an older driver left it.
    let mut pv = provisioned_pv(&vol, "ReadWriteOnce");
    pv.attributes = HashMap::from([
        ("storageAccount".to_string(), "legacy".to_string()),
        ("example.com/owner".to_string(), "team-a".to_string()),
    ]);
    let pod = Pod::new("legacy", Some(2000));
    c.node
        .node_stage_volume(stage(dirs, &pv, &pod, &HashMap::new()))
        .await
        .expect("stage with foreign attributes");
    let req = publish_pvc(dirs, &pv, &pod, "legacy", &HashMap::new());
    c.node
        .node_publish_volume(req.clone())
        .await
        .expect("publish with foreign attributes");
    c.node
        .node_unpublish_volume(unpublish_req("static-data", Path::new(&req.target_path)))
        .await
        .unwrap();
    // Our own inline-only keys on a persistent volume are a mistake worth naming.
    let mut wrong = pv.clone();
    wrong.attributes.insert("source".into(), "secrets".into());
    expect(
        c.node
            .node_publish_volume(publish_pvc(dirs, &wrong, &pod, "legacy", &HashMap::new()))
            .await,
        Code::InvalidArgument,
        "volume_context.source applies to inline (ephemeral) volumes only",
    );
    unstage(c, dirs, "static-data").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn inline_volumes_as_kubelet_sends_them_and_typos_are_named() {
    let mut s = Setup::new(false).await;
    let (c, dirs) = (&mut s.c, &s.dirs);
    let pod = Pod::new("inline", Some(4000));
    let mut scratch = publish_inline(dirs, &pod, "scratch", &[("size", "16Mi")], &HashMap::new());
    scratch
        .volume_context
        .extend(token_attributes("", "tok-inline-secret"));
    c.node
        .node_publish_volume(scratch.clone())
        .await
        .expect("an inline scratch volume with the pod's information and tokens");
    c.node
        .node_publish_volume(scratch.clone())
        .await
        .expect("a republish");
    let secret_secrets = HashMap::from([("password".to_string(), "hunter2".to_string())]);
    let secret = publish_inline(
        dirs,
        &pod,
        "creds",
        &[("source", "secrets")],
        &secret_secrets,
    );
    c.node
        .node_publish_volume(secret.clone())
        .await
        .expect("a secret view from nodePublishSecretRef");
    assert_eq!(
        fs::read_to_string(Path::new(&secret.target_path).join("password")).unwrap(),
        "hunter2"
    );
    // A typo in the pod's own volumeAttributes is refused, naming the key.
    let typo = publish_inline(dirs, &pod, "typo", &[("sise", "16Mi")], &HashMap::new());
    expect(
        c.node.node_publish_volume(typo).await,
        Code::InvalidArgument,
        "sise",
    );
    unpublish_all(c, &[&scratch, &secret]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stats_of_every_kind_of_view_carry_usage_as_kubelet_requires() {
    let mut s = Setup::new(false).await;
    let (c, dirs) = (&mut s.c, &s.dirs);
    let vol = provision(c, "pvc-stats", 8 * MIB, &HashMap::new()).await;
    let pv = provisioned_pv(&vol, "ReadWriteOnce");
    let pod = Pod::new("stats", Some(5000));
    c.node
        .node_stage_volume(stage(dirs, &pv, &pod, &HashMap::new()))
        .await
        .unwrap();
    let persistent = publish_pvc(dirs, &pv, &pod, "data", &HashMap::new());
    let scratch = publish_inline(dirs, &pod, "scratch", &[], &HashMap::new());
    let secret = publish_inline(
        dirs,
        &pod,
        "creds",
        &[("source", "secrets")],
        &HashMap::from([("token".to_string(), "abc".to_string())]),
    );
    for req in [&persistent, &scratch, &secret] {
        c.node.node_publish_volume(req.clone()).await.unwrap();
    }
    let read = |resp: pb::NodeGetVolumeStatsResponse, what: &str| {
        read_stats(&resp).unwrap_or_else(|e| panic!("kubelet rejects the stats of {what}: {e}"))
    };
    for (req, what) in [
        (&persistent, "a PVC"),
        (&scratch, "an inline volume"),
        (&secret, "a secret view"),
    ] {
        let resp = c
            .node
            .node_get_volume_stats(kubelet::stats(&req.volume_id, Path::new(&req.target_path)))
            .await
            .unwrap_or_else(|e| panic!("stats of {what}: {e:?}"))
            .into_inner();
        let m = read(resp, what);
        assert!(m.capacity > 0 && m.inodes > 0, "{what}: {m:?}");
        assert_eq!(m.abnormal, Some(false), "{what}: {m:?}");
    }
    // A dead view: the abnormal condition reaches kubelet, with usage beside it.
    for (req, what) in [
        (&persistent, "a dead PVC view"),
        (&secret, "a dead secret view"),
    ] {
        let target = Path::new(&req.target_path);
        kill_view_for_good(target);
        let resp = c
            .node
            .node_get_volume_stats(kubelet::stats(&req.volume_id, target))
            .await
            .unwrap_or_else(|e| panic!("stats of {what}: {e:?}"))
            .into_inner();
        let m = read(resp, what);
        assert_eq!(m.abnormal, Some(true), "{what}: {m:?}");
        assert!(m.message.unwrap().contains("not connected"), "{what}");
    }
    unpublish_all(c, &[&persistent, &scratch, &secret]).await;
    unstage(c, dirs, "pvc-stats").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn expansion_answers_are_ones_kubelet_retries_unless_they_are_final() {
    let mut s = Setup::new(true).await;
    let (d, c, dirs) = (&s.d, &mut s.c, &s.dirs);
    let secrets = key_secret(d);
    let vol = provision(c, "pvc-grow", 8 * MIB, &secrets).await;
    let pv = provisioned_pv(&vol, "ReadWriteOnce");
    let pod = Pod::new("grow", None);
    c.node
        .node_stage_volume(stage(dirs, &pv, &pod, &secrets))
        .await
        .unwrap();
    let req = publish_pvc(dirs, &pv, &pod, "data", &HashMap::new());
    c.node.node_publish_volume(req.clone()).await.unwrap();
    let target = Path::new(&req.target_path);
    let staging = dirs.staging("pvc-grow");

    // The share records less than kubelet asks for (the controller has not grown it
    // yet, or a network share's read is stale): kubelet must try again later, on every
    // release, rather than mark the volume and stop.
    let e = c
        .node
        .node_expand_volume(expand(dirs, &pv, target, 16 * MIB, &secrets))
        .await
        .unwrap_err();
    assert!(e.message().contains("ControllerExpandVolume"), "{e:?}");
    for release in RELEASES {
        assert_eq!(
            expand_failure(release, e.code()),
            ExpandFailure::Retried,
            "kubelet {release:?} gives up on {:?}",
            e.code()
        );
    }
    // Once the controller has grown it, the same call succeeds, with the node-expand
    // secret (1.27+) and, where nothing changes on this share, without it (1.26).
    c.controller
        .controller_expand_volume(pb::ControllerExpandVolumeRequest {
            volume_id: "pvc-grow".into(),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: 16 * MIB,
                limit_bytes: 0,
            }),
            secrets: secrets.clone(),
            volume_capability: None,
        })
        .await
        .unwrap();
    for (path, s) in [(target, &secrets), (staging.as_path(), &HashMap::new())] {
        let r = c
            .node
            .node_expand_volume(expand(dirs, &pv, path, 16 * MIB, s))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.capacity_bytes, 16 * MIB);
    }
    // A path the volume is not at is final: kubelet's current release marks it
    // infeasible rather than retrying for ever.
    let e = c
        .node
        .node_expand_volume(expand(
            dirs,
            &pv,
            Path::new("/var/lib/kubelet/pods/x/mount"),
            16 * MIB,
            &secrets,
        ))
        .await
        .unwrap_err();
    assert_eq!(
        expand_failure(Release::Current, e.code()),
        ExpandFailure::Infeasible
    );
    c.node
        .node_unpublish_volume(unpublish_req("pvc-grow", target))
        .await
        .unwrap();
    unstage(c, dirs, "pvc-grow").await;
}

/// Lazily unmounts on drop, innermost first.
struct Unmount(Vec<std::path::PathBuf>);

impl Drop for Unmount {
    fn drop(&mut self) {
        for p in self.0.iter().rev() {
            let _ = rustix::mount::unmount(p, rustix::mount::UnmountFlags::DETACH);
        }
    }
}

fn mount_options(path: &Path) -> Option<String> {
    let p = path.to_str().unwrap();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some(p))
        .map(|l| l.split(' ').nth(5).unwrap().to_string())
}

/// The node plugin sees kubelet's directory through a Bidirectional mount: a peer of
/// the host's. The staging bind it makes there reaches the host (and every pod's
/// bind of it) by propagation, and must be `nosuid,nodev` there too, not only in the
/// plugin's own mount namespace (docs/CSI.md promises it).
#[tokio::test(flavor = "multi_thread")]
async fn a_staging_bind_is_nosuid_nodev_on_the_hosts_side_too() {
    let mut s = Setup::new(false).await;
    let (f, c) = (&s.f, &mut s.c);
    let host = f.subdir("host-kubelet");
    let plugin = f.subdir("plugin-kubelet");
    let sh = |args: &[&str]| {
        assert!(
            Command::new("mount").args(args).status().unwrap().success(),
            "mount {args:?}"
        );
    };
    let mut guard = Unmount(vec![host.clone()]);
    sh(&["-t", "tmpfs", "kubelet", host.to_str().unwrap()]);
    sh(&["--make-shared", host.to_str().unwrap()]);
    guard.0.push(plugin.clone());
    sh(&["--bind", host.to_str().unwrap(), plugin.to_str().unwrap()]);
    let dirs = KubeletDirs {
        root: plugin.clone(),
    };
    let vol = provision(c, "pvc-flags", 8 * MIB, &HashMap::new()).await;
    let pv = provisioned_pv(&vol, "ReadWriteOnce");
    let req = stage(&dirs, &pv, &Pod::new("flags", None), &HashMap::new());
    let staging = Path::new(&req.staging_target_path).to_path_buf();
    let on_host = host.join(staging.strip_prefix(&plugin).unwrap());
    c.node.node_stage_volume(req).await.unwrap();
    guard.0.push(on_host.clone());
    guard.0.push(staging.clone());
    for (side, path) in [("the plugin's", &staging), ("the host's", &on_host)] {
        let opts = mount_options(path).unwrap_or_else(|| panic!("no bind on {side} side"));
        let opts: Vec<&str> = opts.split(',').collect();
        assert!(
            opts.contains(&"nosuid") && opts.contains(&"nodev"),
            "{side} copy of the staging bind is {opts:?}"
        );
    }
    unstage(c, &dirs, "pvc-flags").await;
    assert!(
        mount_options(&on_host).is_none(),
        "the unstage reaches the host too"
    );
}

/// SELinux enforcing until dropped, then as it was: a denial is then an `EACCES` to
/// the process, which permissive mode would let through.
struct Enforcing(bool);

impl Enforcing {
    fn new() -> Enforcing {
        let was = fs::read_to_string("/sys/fs/selinux/enforce")
            .unwrap()
            .trim()
            == "1";
        fs::write("/sys/fs/selinux/enforce", "1").unwrap();
        Enforcing(was)
    }
}

impl Drop for Enforcing {
    fn drop(&mut self) {
        if !self.0 {
            let _ = fs::write("/sys/fs/selinux/enforce", "0");
        }
    }
}

/// A process in the pod's domain (`domain`, `container_t` where kubelet's runtime
/// labels pods, with the pod's categories, as the runtime starts it) reads, writes and
/// creates files in the labelled view, enforcing; the same domain with another pod's
/// categories is refused (MCS). The VM tier boots enforcing (docs/KERNELS.md).
fn selinux_lets_the_pods_domain_in(target: &Path, label: &str, domain: &str) {
    let level = label.splitn(4, ':').nth(3).unwrap();
    fs::write(target.join("made-by-driver"), "x").unwrap();
    let run = |level: &str, script: &str| {
        Command::new("runcon")
            .arg(format!("system_u:system_r:{domain}:{level}"))
            .args(["sh", "-c", script])
            .current_dir(target)
            .output()
            .unwrap()
    };
    let enforcing = Enforcing::new();
    let pod = run(
        level,
        "cat /proc/self/attr/current; cat made-by-driver; echo y >>made-by-driver; echo z >made-by-pod; ls",
    );
    let other = run("s0:c1,c2", "cat made-by-driver");
    drop(enforcing);
    let said = String::from_utf8_lossy(&pod.stdout);
    assert!(
        pod.status.success(),
        "{said} {}",
        String::from_utf8_lossy(&pod.stderr)
    );
    assert!(
        said.starts_with(&format!("system_u:system_r:{domain}:{level}")),
        "{said}"
    );
    assert_eq!(
        fs::read_to_string(target.join("made-by-driver")).unwrap(),
        "xy\n"
    );
    let out = Command::new("getfattr")
        .args(["--only-values", "-n", "security.selinux"])
        .arg(target.join("made-by-pod"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end_matches('\0'),
        label
    );
    let refused = String::from_utf8_lossy(&other.stderr);
    assert!(
        !other.status.success() && refused.contains("Permission denied"),
        "another pod's categories read the view: {refused}"
    );
}

/// kubelet's label for a pod's volume (the container runtime's, container-selinux's
/// `container_file_t`, with the pod's categories), and the domain the runtime runs the
/// pod in.
const KUBELETS_LABEL: (&str, &str) = (
    "system_u:object_r:container_file_t:s0:c12,c345",
    "container_t",
);
/// The same pair in the reference policy's sVirt (Debian's `selinux-policy-default`
/// has no container-selinux): a confined, MCS-separated domain and its files.
const SVIRT_LABEL: (&str, &str) = ("system_u:object_r:svirt_image_t:s0:c12,c345", "svirt_t");

/// kubelet on an SELinux node, with `seLinuxMount: true` in the CSIDriver, adds the
/// pod's label to the mount options of stage and publish
/// (pkg/volume/util `AddSELinuxMountOption`: `context=%q`, one flag with the commas of
/// its categories inside quotes). The view mounts with it, so every file shows the
/// pod's label, and the pod's domain uses them (the VM tier boots SELinux,
/// docs/KERNELS.md); a label the node's policy lacks is refused by name; on a node
/// without SELinux (kubelet never sends it there) the publish fails naming the option.
#[tokio::test(flavor = "multi_thread")]
async fn selinux_labels_arrive_as_kubelet_quotes_them() {
    let mut s = Setup::new(false).await;
    let (c, dirs) = (&mut s.c, &s.dirs);
    let selinux = Path::new("/sys/fs/selinux/enforce").exists();
    let mut labels = vec![KUBELETS_LABEL];
    if selinux && mountgroup::sys::mount::selinux_context_known(KUBELETS_LABEL.0) == Some(false) {
        labels.push(SVIRT_LABEL);
    }
    for (i, (label, domain)) in labels.into_iter().enumerate() {
        let id = format!("pvc-label{i}");
        let vol = provision(c, &id, 8 * MIB, &HashMap::new()).await;
        let mut pv = provisioned_pv(&vol, "ReadWriteOncePod");
        pv.mount_options = vec![format!("context={label:?}")];
        let pod = Pod::new("labelled", Some(6000));
        c.node
            .node_stage_volume(stage(dirs, &pv, &pod, &HashMap::new()))
            .await
            .expect("stage with a context= flag");
        let req = publish_pvc(dirs, &pv, &pod, "data", &HashMap::new());
        let target = Path::new(&req.target_path).to_path_buf();
        let published = c.node.node_publish_volume(req).await;
        let known = mountgroup::sys::mount::selinux_context_known(label) != Some(false);
        if selinux && known {
            published.expect("a labelled view on an SELinux node");
            let xattr = Command::new("getfattr")
                .args(["--only-values", "-n", "security.selinux"])
                .arg(&target)
                .output()
                .unwrap();
            assert!(String::from_utf8_lossy(&xattr.stdout).starts_with(label));
            selinux_lets_the_pods_domain_in(&target, label, domain);
            c.node
                .node_unpublish_volume(unpublish_req(&id, &target))
                .await
                .unwrap();
        } else {
            let e = published.unwrap_err();
            let why = if selinux {
                "has no such context"
            } else {
                "SELinux"
            };
            assert!(
                e.message().contains("context=") && e.message().contains(why),
                "{e:?}"
            );
            assert!(!target.exists(), "a failed publish leaves no target behind");
        }
        unstage(c, dirs, &id).await;
    }
}
