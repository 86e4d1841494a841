//! deploy/ agrees with the driver: what the CSIDriver object declares is what the
//! driver advertises, and the manifests pass the flags the binary has.

mod common;
#[path = "common/driver.rs"]
mod driver;
#[path = "common/kubelet.rs"]
mod kubelet;

use std::fs;

use common::*;
use driver::*;
use mountgroup::csi::pb;

/// The value of `key:` in a YAML document we write ourselves (one level, no anchors).
fn field<'a>(yaml: &'a str, key: &str) -> Option<&'a str> {
    yaml.lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.split('#').next().unwrap_or("").trim())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_csidriver_object_matches_the_driver() {
    let yaml = fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/csidriver.yaml"
    ))
    .unwrap();
    let f = Fixture::new();
    let d = Driver::start(f.dir.path());
    let mut c = d.clients().await;

    let info = c
        .identity
        .get_plugin_info(pb::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        field(&yaml, "name"),
        Some(info.name.as_str()),
        "metadata.name is the driver name"
    );

    let node_caps = c.node_capabilities().await;
    let ctl_caps = c.controller_capabilities().await;
    use pb::controller_service_capability::rpc::Type as C;
    use pb::node_service_capability::rpc::Type as N;

    // attachRequired follows PUBLISH_UNPUBLISH_VOLUME.
    let attach = ctl_caps.contains(&(C::PublishUnpublishVolume as i32));
    assert_eq!(
        field(&yaml, "attachRequired"),
        Some(if attach { "true" } else { "false" })
    );
    // Ephemeral volumes need pod info (the ephemeral flag) on mount.
    assert!(yaml.contains("- Ephemeral") && yaml.contains("- Persistent"));
    assert_eq!(field(&yaml, "podInfoOnMount"), Some("true"));
    // kubelet sends `context=` only to drivers that declare they mount with it; the
    // views do (tests/kubelet_contract.rs, selinux_labels_arrive_as_kubelet_quotes_them).
    assert_eq!(field(&yaml, "seLinuxMount"), Some("true"));
    // Secret views rotate only if kubelet republishes.
    assert_eq!(field(&yaml, "requiresRepublish"), Some("true"));
    // With VOLUME_MOUNT_GROUP kubelet ignores fsGroupPolicy; it must then be None so
    // that a kubelet without the feature never walks the volume.
    assert!(node_caps.contains(&(N::VolumeMountGroup as i32)));
    assert_eq!(field(&yaml, "fsGroupPolicy"), Some("None"));
    // Persistent volumes are staged: the StorageClass's node-stage secret is used.
    assert!(node_caps.contains(&(N::StageUnstageVolume as i32)));
    let sc = fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/storageclass.yaml"
    ))
    .unwrap();
    assert!(sc.contains("node-stage-secret-name") && sc.contains("node-expand-secret-name"));
    // Expansion: advertised, and allowed by the StorageClass.
    assert!(
        node_caps.contains(&(N::ExpandVolume as i32))
            && ctl_caps.contains(&(C::ExpandVolume as i32))
    );
    assert_eq!(field(&sc, "allowVolumeExpansion"), Some("true"));
}

#[test]
fn manifests_use_only_flags_the_binary_has() {
    let help = |sub: &str| {
        let out = std::process::Command::new(BIN)
            .args([sub, "--help"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    // Container name → the subcommand it runs.
    let containers = [("mountgroup", "serve"), ("keeper", "keeper")];
    let mut checked = 0;
    for file in ["deploy/node.yaml", "deploy/controller.yaml"] {
        let yaml = fs::read_to_string(format!("{}/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let mut sub: Option<(&str, String)> = None;
        for line in yaml.lines() {
            let t = line.trim();
            if let Some(name) = t.strip_prefix("- name: ") {
                sub = containers
                    .iter()
                    .find(|(c, _)| *c == name)
                    .map(|(_, s)| (*s, help(s)));
            }
            if let Some((sub, help)) = &sub {
                // Flags in `args:` lists and in an exec probe's command.
                for part in t.split([' ', '[', ',', ']']) {
                    if let Some(flag) = part.strip_prefix("--") {
                        let flag = flag.split('=').next().unwrap();
                        assert!(
                            help.contains(&format!("--{flag}")),
                            "{file}: --{flag} is not a flag of `mountgroup {sub}`"
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(
        checked > 10,
        "only {checked} flags found: is the parsing right?"
    );
}

#[test]
fn views_run_in_a_keeper_container_that_is_ready_only_after_taking_them_over() {
    let yaml =
        fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/node.yaml")).unwrap();
    assert!(yaml.contains("--keeper-socket=/run/mountgroup/keeper.sock"));
    assert!(yaml.contains("- name: keeper"));
    assert!(
        yaml.contains("keeper, --probe"),
        "the keeper's readiness probe"
    );
    assert!(yaml.contains("maxSurge: 1") && yaml.contains("maxUnavailable: 0"));
}

#[test]
fn views_live_outside_every_container_of_the_pod() {
    let yaml = manifest("deploy/node.yaml");
    // A container's own PID namespace dies with its first process, and everything in
    // it: the views need the host's.
    assert!(
        yaml.contains("\n      hostPID: true\n"),
        "hostPID on the pod"
    );
    let keeper = containers(&yaml)
        .into_iter()
        .find(|(n, _)| n == "keeper")
        .unwrap()
        .1;
    // The views' cgroups are below the node's cgroup2 hierarchy, mounted where the
    // flag points, not below the container's own /sys/fs/cgroup.
    let flag = keeper
        .lines()
        .find_map(|l| l.trim().strip_prefix("- --views-cgroup="))
        .expect("--views-cgroup");
    let mount = keeper
        .lines()
        .find_map(|l| {
            let l = l.trim();
            l.contains("{name: cgroup,")
                .then(|| {
                    l.split("mountPath: ")
                        .nth(1)?
                        .trim_end_matches('}')
                        .split(',')
                        .next()
                })
                .flatten()
        })
        .expect("the cgroup volume mounted in the keeper");
    assert!(
        flag.starts_with(&format!("{mount}/")),
        "{flag} not under {mount}"
    );
    assert!(yaml.contains("hostPath: {path: /sys/fs/cgroup, type: Directory}"));
    assert!(keeper.contains("--view-memory-max="));
    // Its death ends no view now: a liveness probe may restart a keeper that hangs.
    assert!(keeper.contains("livenessProbe"), "{keeper}");
}

/// The image the manifests pull is the one `scripts/build-image` tags by default, so a
/// locally built image is used as it is (docs/DEPLOY.md).
#[test]
fn manifests_pull_the_image_the_build_makes() {
    let root = env!("CARGO_MANIFEST_DIR");
    let script = fs::read_to_string(format!("{root}/scripts/build-image")).unwrap();
    let image = script
        .lines()
        .find_map(|l| l.strip_prefix("IMAGE="))
        .expect("scripts/build-image names its IMAGE");
    let tag = format!("{image}:{}", env!("CARGO_PKG_VERSION"));
    assert!(script.contains("tag=${1:-$IMAGE:$version}"));
    for file in ["deploy/node.yaml", "deploy/controller.yaml"] {
        let yaml = fs::read_to_string(format!("{root}/{file}")).unwrap();
        let ours: Vec<&str> = yaml
            .lines()
            .filter_map(|l| l.trim().strip_prefix("image: "))
            .filter(|i| i.starts_with(image))
            .collect();
        assert!(!ours.is_empty(), "{file}");
        assert!(ours.iter().all(|i| *i == tag), "{file}: {ours:?}");
        assert!(yaml.contains("imagePullPolicy: IfNotPresent"), "{file}");
    }
    // An exec probe runs the binary where the image has it.
    let containerfile = fs::read_to_string(format!("{root}/Containerfile")).unwrap();
    let node = fs::read_to_string(format!("{root}/deploy/node.yaml")).unwrap();
    let entry = containerfile
        .lines()
        .find_map(|l| l.strip_prefix("ENTRYPOINT [\""))
        .and_then(|l| l.split('"').next())
        .expect("the Containerfile's ENTRYPOINT");
    assert!(node.contains(&format!("command: [{entry}, keeper, --probe")));
}

fn manifest(file: &str) -> String {
    fs::read_to_string(format!("{}/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// The containers of a pod template we write: name → its block of lines.
fn containers(yaml: &str) -> Vec<(String, String)> {
    yaml.split("\n        - name: ")
        .skip(1)
        .map(|block| {
            let name = block.lines().next().unwrap().trim().to_string();
            (name, block.to_string())
        })
        .collect()
}

/// A number under `key:` in the block after `section:` (a probe), or `default`.
fn probe_field(block: &str, section: &str, key: &str, default: u64) -> Option<u64> {
    let at = block.find(&format!("{section}:"))?;
    Some(
        block[at..]
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("            "))
            .find_map(|l| l.trim().strip_prefix(&format!("{key}:")))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or(default),
    )
}

/// The value of `--flag=` in a container's arguments, if given.
fn flag<'a>(block: &'a str, flag: &str) -> Option<&'a str> {
    block
        .split([' ', '[', ',', ']', '\n'])
        .find_map(|p| p.strip_prefix(&format!("--{flag}=")))
}

/// Seconds in a Go duration we write (`3s`, `1500ms`).
fn seconds(d: &str) -> f64 {
    if let Some(ms) = d.strip_suffix("ms") {
        ms.parse::<f64>().unwrap() / 1000.0
    } else {
        d.strip_suffix('s').unwrap().parse().unwrap()
    }
}

/// kubelet gives an HTTP probe `timeoutSeconds` (default 1); the sidecar behind it
/// answers only after its own call to the driver, bounded by its own flag. A probe that
/// gives up first restarts a healthy container whenever the share is slow.
/// livenessprobe v2.17.0 cmd/livenessprobe/main.go: `--probe-timeout`, default 3 s;
/// node-driver-registrar v2.15.0 main.go: `--timeout` (its GetInfo check), default 1 s.
#[test]
fn kubelet_probes_wait_longer_than_the_sidecars_behind_them() {
    let mut checked = 0;
    for file in ["deploy/node.yaml", "deploy/controller.yaml"] {
        let yaml = manifest(file);
        let cs = containers(&yaml);
        let sidecar_budget = |port: &str| -> f64 {
            let (_, block) = cs
                .iter()
                .find(|(_, b)| b.contains(&format!("--http-endpoint=:{port}")))
                .unwrap_or_else(|| panic!("{file}: nothing serves :{port}"));
            if block.contains("sig-storage/livenessprobe:") {
                seconds(flag(block, "probe-timeout").unwrap_or("3s"))
            } else {
                seconds(flag(block, "timeout").unwrap_or("1s"))
            }
        };
        for (name, block) in &cs {
            for probe in ["livenessProbe", "startupProbe"] {
                let Some(timeout) = probe_field(block, probe, "timeoutSeconds", 1) else {
                    continue;
                };
                // The port the probe reaches, by name or number.
                let port = if block[block.find(probe).unwrap()..].contains("port: healthz") {
                    "9808".to_string()
                } else if block[block.find(probe).unwrap()..].contains("port: registrar") {
                    "9809".to_string()
                } else {
                    continue; // exec probes run our own binary
                };
                let budget = sidecar_budget(&port);
                assert!(
                    timeout as f64 > budget,
                    "{file}: {name}'s {probe} gives up after {timeout} s, before the sidecar on :{port} ({budget} s)"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 4, "only {checked} probes checked");
}

/// The ResourceQuota admission plugin as GKE configures it (`limitedResources`: pods
/// of the critical priority classes; kubernetes plugin/pkg/admission/resourcequota,
/// "insufficient quota to match these scopes"): a pod of such a class is created only
/// in a namespace with a quota whose PriorityClass scope covers it. GKE defines one in
/// kube-system only. Every critical pod of ours must have one in its namespace, and
/// `kubectl apply -k deploy/` must create it.
#[test]
fn critical_pods_have_the_quota_their_class_needs() {
    let kustomization = manifest("deploy/kustomization.yaml");
    let applied: Vec<String> = kustomization
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .map(|f| manifest(&format!("deploy/{f}")))
        .collect();
    let quotas: Vec<&String> = applied
        .iter()
        .filter(|m| m.contains("kind: ResourceQuota"))
        .collect();
    let mut checked = 0;
    for m in &applied {
        let Some(class) = field(m, "priorityClassName") else {
            continue;
        };
        if !class.starts_with("system-") {
            continue;
        }
        let ns = field(m, "namespace").unwrap();
        let covered = quotas.iter().any(|q| {
            field(q, "namespace") == Some(ns)
                && q.contains("scopeName: PriorityClass")
                && q.contains("operator: In")
                && q.lines()
                    .find_map(|l| l.trim().strip_prefix("values:"))
                    .is_some_and(|v| v.contains(class))
        });
        assert!(covered, "a {class} pod in {ns} has no quota for its class");
        checked += 1;
    }
    assert_eq!(checked, 2, "the node plugin and the controller");
}

/// A share mounted late at boot must not put the driver in a restart loop: the driver
/// is not ready until the share is there (its Probe fails, so the livenessprobe sidecar
/// answers 500), and kubelet's liveness probe would restart it again and again, each
/// time after a longer back-off. A startup probe holds liveness back until the first
/// success, for at least ten minutes.
#[test]
fn a_share_mounted_late_does_not_restart_the_driver() {
    for file in ["deploy/node.yaml", "deploy/controller.yaml"] {
        let yaml = manifest(file);
        let cs = containers(&yaml);
        let (_, driver) = cs
            .iter()
            .find(|(n, _)| n == "mountgroup")
            .expect("the mountgroup container");
        let period = probe_field(driver, "startupProbe", "periodSeconds", 10)
            .unwrap_or_else(|| panic!("{file}: the driver has no startup probe"));
        let failures = probe_field(driver, "startupProbe", "failureThreshold", 3).unwrap();
        assert!(
            period * failures >= 600,
            "{file}: the startup probe gives the share {} s",
            period * failures
        );
        assert!(
            driver[driver.find("startupProbe").unwrap()..].contains("port: healthz"),
            "{file}: the startup probe asks the driver's Probe"
        );
    }
}

/// The entries of the map under `key:` in a YAML document we write (`name: value`
/// lines indented below it; a commented-out entry is not one), and the items of the
/// list under it (`- item` lines).
fn block(yaml: &str, key: &str) -> (Vec<(String, String)>, Vec<String>) {
    let mut lines = yaml.lines().skip_while(|l| l.trim() != format!("{key}:"));
    let Some(head) = lines.next() else {
        return (Vec::new(), Vec::new());
    };
    let indent = head.len() - head.trim_start().len();
    let (mut map, mut list) = (Vec::new(), Vec::new());
    for l in lines.take_while(|l| l.len() - l.trim_start().len() > indent || l.trim().is_empty()) {
        let t = l.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if let Some(item) = t.strip_prefix("- ") {
            list.push(item.split(" #").next().unwrap().trim().to_string());
        } else if let Some((k, v)) = t.split_once(": ") {
            map.push((
                k.to_string(),
                v.split(" #").next().unwrap().trim().to_string(),
            ));
        }
    }
    (map, list)
}

/// The example StorageClasses and static PVs of deploy/examples (csi-driver-smb's,
/// csi-driver-nfs's and ceph-csi's own, the driver's name changed) are taken by the
/// driver as external-provisioner and kubelet hand them over: CreateVolume and
/// NodeStageVolume go to the servers they name (none answers here: UNAVAILABLE, which
/// the sidecars and kubelet retry, naming it), never refused for a parameter, a
/// mount option or a volume handle (as each of the four was before the driver mounted
/// shares: `unknown key "source"`, `unknown key "server"`, `volume_id ... contains
/// '/'`, `mount_flags: unknown option nfsvers`).
#[tokio::test(flavor = "multi_thread")]
async fn the_example_classes_and_pvs_name_shares_the_driver_goes_to() {
    use kubelet::{KubeletDirs, Pod, Pvc, StorageClass};
    let f = Fixture::new();
    let dirs = KubeletDirs {
        root: f.subdir("kubelet"),
    };
    let secrets = std::collections::HashMap::from([
        ("username".to_string(), "user".to_string()),
        ("password".to_string(), "pass-3f9a61".to_string()),
        ("userID".to_string(), "csi".to_string()),
        ("userKey".to_string(), "a2V5LTdiMWM=".to_string()),
        ("adminID".to_string(), "admin".to_string()),
        ("adminKey".to_string(), "a2V5LTdiMWM=".to_string()),
    ]);
    // The clusterID's monitors, from ceph-csi's configuration.
    let ceph_config = f.dir.path().join("ceph-csi-config.json");
    fs::write(
        &ceph_config,
        r#"[{"clusterID": "rook-ceph", "monitors": ["ceph-mon.rook-ceph.svc.cluster.local:6789"]}]"#,
    )
    .unwrap();
    let d = Driver::start_with(
        f.dir.path(),
        f.dir.path().join("share"),
        &[
            "--share-key-file",
            "none",
            "--ceph-csi-config",
            ceph_config.to_str().unwrap(),
        ],
    );
    let mut c = d.clients().await;
    for (kind, server) in [
        ("smb", "smb-server.default.svc.cluster.local"),
        ("nfs", "nfs-server.default.svc.cluster.local"),
        ("cephfs", "ceph-mon.rook-ceph.svc.cluster.local"),
    ] {
        let yaml = manifest(&format!("deploy/examples/{kind}/storageclass.yaml"));
        let (parameters, _) = block(&yaml, "parameters");
        let (_, mount_options) = block(&yaml, "mountOptions");
        let class = StorageClass {
            parameters: parameters.into_iter().collect(),
            mount_options,
        };
        let e = c
            .controller
            .create_volume(kubelet::provision(&class, &Pvc::new("data"), &secrets))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable, "{kind}: {e:?}");
        assert!(e.message().contains(server), "{kind}: {e:?}");
        let yaml = manifest(&format!("deploy/examples/{kind}/pv-static.yaml"));
        let pv_yaml = yaml.split("\n---\n").next().unwrap();
        let (attributes, _) = block(pv_yaml, "volumeAttributes");
        let (_, mount_options) = block(pv_yaml, "mountOptions");
        let handle = field(pv_yaml, "volumeHandle").unwrap();
        let pv = kubelet::static_pv(
            handle,
            &attributes
                .iter()
                .map(|(k, v)| (k.as_str(), v.trim_matches('"')))
                .collect::<Vec<_>>(),
            &mount_options,
        );
        let e = c
            .node
            .node_stage_volume(kubelet::stage(
                &dirs,
                &pv,
                &Pod::new("p", Some(2000)),
                &secrets,
            ))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable, "{kind}: {e:?}");
        assert!(e.message().contains(server), "{kind}: {e:?}");
        assert!(
            !e.message().contains("pass-3f9a61") && !e.message().contains("a2V5LTdiMWM="),
            "{e:?}"
        );
    }
    assert!(d.mounts_below().is_empty(), "{:?}", d.mounts_below());
}

/// Every metric the chart's alert rules and its Grafana dashboard name is one the
/// driver serves (src/csi/metrics.rs names each), as Prometheus shows it (a
/// histogram's `_bucket`, `_count`, `_sum`, a counter's `_total`); and the dashboard in
/// docs/ is the chart's.
#[test]
fn the_charts_rules_and_dashboard_name_metrics_the_driver_serves() {
    let names = |text: &str| -> std::collections::BTreeSet<String> {
        let mut out = std::collections::BTreeSet::new();
        for (i, _) in text.match_indices("mountgroup_") {
            let name: String = text[i..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            out.insert(name);
        }
        out
    };
    let served = names(&manifest("src/csi/metrics.rs"));
    let dashboard = manifest("charts/mountgroup/dashboards/mountgroup.json");
    assert_eq!(dashboard, manifest("docs/grafana-dashboard.json"));
    let rules = manifest("charts/mountgroup/templates/prometheusrule.yaml");
    let named: Vec<String> = names(&rules).into_iter().chain(names(&dashboard)).collect();
    assert!(named.len() >= 6, "{named:?}");
    for n in named {
        let base = ["_bucket", "_count", "_sum", "_total"]
            .iter()
            .find_map(|s| n.strip_suffix(s).filter(|b| served.contains(*b)))
            .unwrap_or(&n);
        assert!(
            served.contains(base),
            "{n} is not a metric the driver serves"
        );
    }
}
