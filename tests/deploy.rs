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
    let help = std::process::Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout).to_string();
    for file in ["deploy/node.yaml", "deploy/controller.yaml"] {
        let yaml = fs::read_to_string(format!("{}/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let mut in_mountgroup = false;
        for line in yaml.lines() {
            let t = line.trim();
            if let Some(name) = t.strip_prefix("- name: ") {
                in_mountgroup = name == "mountgroup";
            }
            if in_mountgroup {
                if let Some(flag) = t.strip_prefix("- --") {
                    let flag = flag.split('=').next().unwrap();
                    assert!(
                        help.contains(&format!("--{flag}")),
                        "{file}: --{flag} is not a flag of `mountgroup serve`"
                    );
                }
            }
        }
    }
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
        assert_eq!(ours, [tag.as_str()], "{file}");
        assert!(yaml.contains("imagePullPolicy: IfNotPresent"), "{file}");
    }
}
