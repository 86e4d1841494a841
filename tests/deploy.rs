//! deploy/ agrees with the driver: what the CSIDriver object declares is what the
//! driver advertises, and the manifests pass the flags the binary has.

mod common;
#[path = "common/driver.rs"]
mod driver;

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
    // A liveness probe on the keeper would restart it, and end every view.
    let keeper = yaml.split("- name: keeper").nth(1).unwrap();
    let keeper = keeper.split("\n        - name: ").next().unwrap();
    assert!(!keeper.contains("livenessProbe"), "{keeper}");
    assert!(yaml.contains("maxSurge: 1") && yaml.contains("maxUnavailable: 0"));
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
