//! What kubelet and the pinned sidecars send to the driver, built the way their source
//! builds it, and how kubelet reads the answers. No kubelet runs here, so each function
//! names the upstream function it follows; where kubelet versions differ, both the
//! oldest release docs/DEPLOY.md supports (1.29) and the current one are modelled.
//!
//! Sources (read with the search tool): kubernetes `pkg/volume/csi/csi_mounter.go`
//! (`SetUpAt`, `podAttributes`, `podServiceAccountTokenAttrs`), `csi_attacher.go`
//! (`MountDevice`, `makeDeviceMountPath`), `csi_client.go` (`NodePublishVolume`,
//! `NodeStageVolume`, `NodeExpandVolume`, `NodeGetVolumeStats`, `asCSIAccessModeV1`),
//! `expander.go` (`nodeExpandWithClient`, `inUseError`, `isInfeasibleError`);
//! external-provisioner v5.3.0 `pkg/controller/controller.go` (`Provision`,
//! `provisionerIDKey`).
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mountgroup::csi::pb;
use mountgroup::csi::pb::volume_capability::access_mode::Mode;
use mountgroup::csi::pb::volume_capability::{AccessMode, AccessType, MountVolume};
use sha2::{Digest, Sha256};

/// The CSIDriver name (deploy/csidriver.yaml).
pub const DRIVER: &str = "mountgroup.csi.io";

/// The kubelet releases whose behaviour the contract pins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Kubernetes 1.29, the oldest docs/DEPLOY.md supports: NodeExpandSecret just GA,
    /// no infeasible class for NodeExpandVolume failures.
    V1_29,
    /// The current release: RecoverVolumeExpansionFailure GA, so NodeExpandVolume's
    /// INVALID_ARGUMENT, OUT_OF_RANGE and NOT_FOUND are infeasible (final).
    Current,
}

pub const RELEASES: [Release; 2] = [Release::V1_29, Release::Current];

fn hex_sha256(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A uid of its own for each object of `kind` named `name`, shaped as the API server's
/// (a UUID), as it gives every object one: two objects never share a pod directory or
/// a volume name.
fn object_uid(kind: &str, name: &str) -> String {
    let h = hex_sha256(&format!("{kind}/{name}"));
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// A node's kubelet root directory (`--root-dir`, /var/lib/kubelet on a real node).
pub struct KubeletDirs {
    pub root: PathBuf,
}

impl KubeletDirs {
    /// `csi_attacher.go` `makeDeviceMountPath` (1.24+):
    /// `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(volumeHandle)>/globalmount`.
    /// kubelet makes the parent (and writes vol_data.json there), not `globalmount`.
    pub fn staging(&self, volume_handle: &str) -> PathBuf {
        let dir = self
            .root
            .join("plugins/kubernetes.io/csi")
            .join(DRIVER)
            .join(hex_sha256(volume_handle));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("globalmount")
    }

    /// `csi_mounter.go` `GetPath`/`getTargetPath`:
    /// `<root>/pods/<podUID>/volumes/kubernetes.io~csi/<specVolID>/mount`; `SetUpAt`
    /// makes the parent with 0750 before NodePublishVolume, never `mount` itself.
    pub fn target(&self, pod: &Pod, spec_volume: &str) -> PathBuf {
        let dir = self
            .root
            .join("pods")
            .join(&pod.uid)
            .join("volumes/kubernetes.io~csi")
            .join(spec_volume);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("mount")
    }
}

/// The parts of a pod kubelet puts into a request.
#[derive(Clone, Debug)]
pub struct Pod {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub service_account: String,
    /// `securityContext.fsGroup`.
    pub fs_group: Option<i64>,
}

impl Pod {
    pub fn new(name: &str, fs_group: Option<i64>) -> Pod {
        Pod {
            name: name.into(),
            namespace: "team".into(),
            uid: object_uid("pod", name),
            service_account: "default".into(),
            fs_group,
        }
    }
}

/// A PersistentVolume's `spec.csi` and the parts of `spec` kubelet reads.
#[derive(Clone, Debug)]
pub struct Pv {
    pub volume_handle: String,
    /// `spec.csi.volumeAttributes`.
    pub attributes: HashMap<String, String>,
    /// `spec.csi.fsType`: empty unless the StorageClass sets `csi.storage.k8s.io/fstype`
    /// (external-provisioner's `--default-fstype` is empty by default).
    pub fs_type: String,
    /// `spec.accessModes`, e.g. "ReadWriteOnce".
    pub access_modes: Vec<&'static str>,
    /// `spec.mountOptions` (the StorageClass's `mountOptions`).
    pub mount_options: Vec<String>,
}

/// A StorageClass as its users write it: `parameters` and `mountOptions`.
#[derive(Clone, Debug, Default)]
pub struct StorageClass {
    pub parameters: std::collections::BTreeMap<String, String>,
    pub mount_options: Vec<String>,
}

impl StorageClass {
    pub fn new(parameters: &[(&str, &str)], mount_options: &[&str]) -> StorageClass {
        StorageClass {
            parameters: parameters
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            mount_options: mount_options.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// A PersistentVolumeClaim as the provisioner reads it.
#[derive(Clone, Debug)]
pub struct Pvc {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub access_mode: &'static str,
    pub bytes: i64,
}

impl Pvc {
    pub fn new(name: &str) -> Pvc {
        Pvc {
            name: name.into(),
            namespace: "team".into(),
            uid: object_uid("pvc", name),
            access_mode: "ReadWriteMany",
            bytes: 1 << 30,
        }
    }

    /// external-provisioner's `makeVolumeName` with `--volume-name-prefix=pvc` (its
    /// default): the PV's name, and the CreateVolume name.
    pub fn pv_name(&self) -> String {
        format!("pvc-{}", self.uid)
    }
}

/// The parameters external-provisioner takes out of a class's before CreateVolume
/// (v5.3.0 pkg/controller/controller.go `removePrefixedParameters`: the secret
/// references of each kind, `fstype`), keeping the Secrets they name for the calls.
const PROVISIONER_KEYS: [&str; 11] = [
    "csi.storage.k8s.io/fstype",
    "csi.storage.k8s.io/provisioner-secret-name",
    "csi.storage.k8s.io/provisioner-secret-namespace",
    "csi.storage.k8s.io/controller-publish-secret-name",
    "csi.storage.k8s.io/controller-publish-secret-namespace",
    "csi.storage.k8s.io/node-stage-secret-name",
    "csi.storage.k8s.io/node-stage-secret-namespace",
    "csi.storage.k8s.io/node-publish-secret-name",
    "csi.storage.k8s.io/node-publish-secret-namespace",
    "csi.storage.k8s.io/controller-expand-secret-name",
    "csi.storage.k8s.io/controller-expand-secret-namespace",
];

/// external-provisioner v5.3.0 `Provision` (`prepareProvision`) of `pvc` from `class`:
/// the class's parameters without the keys it takes out ([`PROVISIONER_KEYS`];
/// `csi.storage.k8s.io/node-expand-secret-*` go too), with `--extra-create-metadata`'s
/// PVC and PV names (deploy/controller.yaml runs it so), the provisioner Secret's data
/// as `secrets`, the class's `mountOptions` as the capability's `mount_flags`
/// (`getVolumeCapability`), the PVC's size as `required_bytes`, the PV's name as the
/// volume's.
pub fn provision(
    class: &StorageClass,
    pvc: &Pvc,
    secrets: &HashMap<String, String>,
) -> pb::CreateVolumeRequest {
    let mut parameters: HashMap<String, String> = class
        .parameters
        .iter()
        .filter(|(k, _)| {
            !PROVISIONER_KEYS.contains(&k.as_str())
                && !k.starts_with("csi.storage.k8s.io/node-expand-secret-")
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    parameters.insert("csi.storage.k8s.io/pvc/name".into(), pvc.name.clone());
    parameters.insert(
        "csi.storage.k8s.io/pvc/namespace".into(),
        pvc.namespace.clone(),
    );
    parameters.insert("csi.storage.k8s.io/pv/name".into(), pvc.pv_name());
    pb::CreateVolumeRequest {
        name: pvc.pv_name(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: pvc.bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability(
            "",
            &class.mount_options,
            None,
            access_mode(pvc.access_mode),
        )],
        parameters,
        secrets: secrets.clone(),
        ..Default::default()
    }
}

/// The PV external-provisioner makes of a CreateVolume answer for `class`: as
/// [`provisioned_pv`], with the class's `mountOptions` (`Provision`: `MountOptions:
/// class.MountOptions`).
pub fn class_pv(volume: &pb::Volume, class: &StorageClass, pvc: &Pvc) -> Pv {
    let mut pv = provisioned_pv(volume, pvc.access_mode);
    pv.mount_options = class.mount_options.clone();
    pv
}

/// A static PV as its author writes it: `volumeHandle`, `volumeAttributes`,
/// `mountOptions`.
pub fn static_pv(handle: &str, attributes: &[(&str, &str)], mount_options: &[String]) -> Pv {
    Pv {
        volume_handle: handle.into(),
        attributes: attributes
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        fs_type: String::new(),
        access_modes: vec!["ReadWriteMany"],
        mount_options: mount_options.to_vec(),
    }
}

/// external-provisioner v5.3.0 `Provision`: the PV's attributes are
/// `storage.kubernetes.io/csiProvisionerIdentity` (`provisionerIDKey`, the value
/// `<ms timestamp>-<rand>-<driver>` from cmd/csi-provisioner) plus the CreateVolume
/// response's `volume_context`.
pub fn provisioned_pv(volume: &pb::Volume, access_mode: &'static str) -> Pv {
    let mut attributes = HashMap::from([(
        "storage.kubernetes.io/csiProvisionerIdentity".to_string(),
        format!("1763900000000-8081-{DRIVER}"),
    )]);
    attributes.extend(volume.volume_context.clone());
    Pv {
        volume_handle: volume.volume_id.clone(),
        attributes,
        fs_type: String::new(),
        access_modes: vec![access_mode],
        mount_options: Vec::new(),
    }
}

/// `csi_client.go` `asCSIAccessModeV1` with the driver's node capability
/// SINGLE_NODE_MULTI_WRITER (mountgroup advertises it, so ReadWriteOnce becomes
/// SINGLE_NODE_MULTI_WRITER and ReadWriteOncePod SINGLE_NODE_SINGLE_WRITER).
pub fn access_mode(pv_mode: &str) -> Mode {
    match pv_mode {
        "ReadWriteOnce" => Mode::SingleNodeMultiWriter,
        "ReadWriteOncePod" => Mode::SingleNodeSingleWriter,
        "ReadOnlyMany" => Mode::MultiNodeReaderOnly,
        "ReadWriteMany" => Mode::MultiNodeMultiWriter,
        _ => Mode::Unknown,
    }
}

fn capability(
    fs_type: &str,
    flags: &[String],
    group: Option<i64>,
    mode: Mode,
) -> pb::VolumeCapability {
    pb::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.into(),
            mount_flags: flags.to_vec(),
            // csi_client.go: `VolumeMountGroup = strconv.FormatInt(*fsGroup, 10)` when
            // the driver has VOLUME_MOUNT_GROUP and the pod has an fsGroup.
            volume_mount_group: group.map(|g| g.to_string()).unwrap_or_default(),
        })),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

/// `csi_attacher.go` `MountDevice` → `csi_client.go` `NodeStageVolume`: the PV's
/// attributes unfiltered (no pod information: staging is per node, not per pod), the
/// node-stage secret, the PV's mount options, and the fsGroup of the pod that made the
/// first mount (`deviceMounterArgs.FsGroup`).
pub fn stage(
    dirs: &KubeletDirs,
    pv: &Pv,
    pod: &Pod,
    secrets: &HashMap<String, String>,
) -> pb::NodeStageVolumeRequest {
    pb::NodeStageVolumeRequest {
        volume_id: pv.volume_handle.clone(),
        // attachRequired: false, so there is no VolumeAttachment and no publish context.
        publish_context: HashMap::new(),
        staging_target_path: dirs.staging(&pv.volume_handle).to_string_lossy().into(),
        volume_capability: Some(capability(
            &pv.fs_type,
            &pv.mount_options,
            pod.fs_group,
            access_mode(pv.access_modes[0]),
        )),
        secrets: secrets.clone(),
        volume_context: pv.attributes.clone(),
    }
}

/// `csi_mounter.go` `podAttributes` with `podInfoOnMount: true` (deploy/csidriver.yaml).
pub fn pod_attributes(pod: &Pod, ephemeral: bool) -> HashMap<String, String> {
    HashMap::from([
        ("csi.storage.k8s.io/pod.name".to_string(), pod.name.clone()),
        (
            "csi.storage.k8s.io/pod.namespace".to_string(),
            pod.namespace.clone(),
        ),
        ("csi.storage.k8s.io/pod.uid".to_string(), pod.uid.clone()),
        (
            "csi.storage.k8s.io/serviceAccount.name".to_string(),
            pod.service_account.clone(),
        ),
        (
            "csi.storage.k8s.io/ephemeral".to_string(),
            ephemeral.to_string(),
        ),
    ])
}

/// `csi_mounter.go` `podServiceAccountTokenAttrs`, for a CSIDriver with
/// `tokenRequests`: one JSON object, audience → TokenRequestStatus. The token is a
/// secret; it must never be echoed or logged.
pub fn token_attributes(audience: &str, token: &str) -> HashMap<String, String> {
    HashMap::from([(
        "csi.storage.k8s.io/serviceAccount.tokens".to_string(),
        format!(
            r#"{{"{audience}":{{"token":"{token}","expirationTimestamp":"2026-11-23T17:00:00Z"}}}}"#
        ),
    )])
}

/// `csi_mounter.go` `SetUpAt` for a PVC → `csi_client.go` `NodePublishVolume`: the PV's
/// attributes merged with the pod's (`mergeMap`), the staging path (STAGE_UNSTAGE),
/// the PV's mount options, `readOnly` from the pod's volume or the PV.
pub fn publish_pvc(
    dirs: &KubeletDirs,
    pv: &Pv,
    pod: &Pod,
    spec_volume: &str,
    extra: &HashMap<String, String>,
) -> pb::NodePublishVolumeRequest {
    let mut context = pv.attributes.clone();
    context.extend(pod_attributes(pod, false));
    context.extend(extra.clone());
    pb::NodePublishVolumeRequest {
        volume_id: pv.volume_handle.clone(),
        publish_context: HashMap::new(),
        staging_target_path: dirs.staging(&pv.volume_handle).to_string_lossy().into(),
        target_path: dirs.target(pod, spec_volume).to_string_lossy().into(),
        volume_capability: Some(capability(
            &pv.fs_type,
            &pv.mount_options,
            pod.fs_group,
            access_mode(pv.access_modes[0]),
        )),
        readonly: false,
        secrets: HashMap::new(),
        volume_context: context,
    }
}

/// `csi_mounter.go` `makeVolumeHandle`: `csi-<sha256(podUID + volume name)>`.
pub fn inline_handle(pod: &Pod, spec_volume: &str) -> String {
    format!("csi-{}", hex_sha256(&format!("{}{spec_volume}", pod.uid)))
}

/// `csi_mounter.go` `SetUpAt` for an inline volume: the pod's `volumeAttributes`
/// merged with the pod's information (`ephemeral: "true"`), no staging path, the
/// `nodePublishSecretRef`'s data as secrets, access mode ReadWriteOnce, no mount
/// options.
pub fn publish_inline(
    dirs: &KubeletDirs,
    pod: &Pod,
    spec_volume: &str,
    attributes: &[(&str, &str)],
    secrets: &HashMap<String, String>,
) -> pb::NodePublishVolumeRequest {
    let mut context: HashMap<String, String> = attributes
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    context.extend(pod_attributes(pod, true));
    pb::NodePublishVolumeRequest {
        volume_id: inline_handle(pod, spec_volume),
        publish_context: HashMap::new(),
        staging_target_path: String::new(),
        target_path: dirs.target(pod, spec_volume).to_string_lossy().into(),
        volume_capability: Some(capability(
            "",
            &[],
            pod.fs_group,
            access_mode("ReadWriteOnce"),
        )),
        readonly: false,
        secrets: secrets.clone(),
        volume_context: context,
    }
}

/// `csi_client.go` `NodeGetVolumeStats` (kubelet's metrics_csi.go asks with the
/// publish path as `volume_path`).
pub fn stats(volume_handle: &str, target: &Path) -> pb::NodeGetVolumeStatsRequest {
    pb::NodeGetVolumeStatsRequest {
        volume_id: volume_handle.into(),
        volume_path: target.to_string_lossy().into(),
        staging_target_path: String::new(),
    }
}

/// What kubelet records from a NodeGetVolumeStats answer.
#[derive(Debug, Default)]
pub struct Metrics {
    pub capacity: i64,
    pub available: i64,
    pub used: i64,
    pub inodes: i64,
    pub inodes_free: i64,
    pub abnormal: Option<bool>,
    pub message: Option<String>,
}

/// `csi_client.go` `NodeGetVolumeStats`: an answer without usage is an error ("usage
/// is nil", before the volume condition is read: a nil slice in Go is what an empty
/// repeated field decodes to), then the condition (VOLUME_CONDITION advertised), then
/// each usage by unit.
pub fn read_stats(resp: &pb::NodeGetVolumeStatsResponse) -> Result<Metrics, String> {
    if resp.usage.is_empty() {
        return Err("failed to get usage from response. usage is nil".into());
    }
    let mut m = Metrics {
        abnormal: resp.volume_condition.as_ref().map(|c| c.abnormal),
        message: resp.volume_condition.as_ref().map(|c| c.message.clone()),
        ..Default::default()
    };
    for u in &resp.usage {
        match pb::volume_usage::Unit::try_from(u.unit) {
            Ok(pb::volume_usage::Unit::Bytes) => {
                m.capacity = u.total;
                m.available = u.available;
                m.used = u.used;
            }
            Ok(pb::volume_usage::Unit::Inodes) => {
                m.inodes = u.total;
                m.inodes_free = u.available;
            }
            _ => return Err(format!("unknown unit in VolumeUsage: {}", u.unit)),
        }
    }
    Ok(m)
}

/// `operation_generator.go` `nodeExpandVolume` → `csi_client.go` `NodeExpandVolume`:
/// the new size as `required_bytes`, the publish path (or, during MountDevice, the
/// staging path) as `volume_path`, the staging path, the PV's capability, and from
/// 1.27 (GA 1.29) the PV's `nodeExpandSecretRef` data.
pub fn expand(
    dirs: &KubeletDirs,
    pv: &Pv,
    volume_path: &Path,
    new_size: i64,
    secrets: &HashMap<String, String>,
) -> pb::NodeExpandVolumeRequest {
    pb::NodeExpandVolumeRequest {
        volume_id: pv.volume_handle.clone(),
        volume_path: volume_path.to_string_lossy().into(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: new_size,
            limit_bytes: 0,
        }),
        staging_target_path: dirs.staging(&pv.volume_handle).to_string_lossy().into(),
        volume_capability: Some(capability(
            &pv.fs_type,
            &pv.mount_options,
            None,
            access_mode(pv.access_modes[0]),
        )),
        secrets: secrets.clone(),
    }
}

/// What kubelet does after a failed NodeExpandVolume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpandFailure {
    /// Tried again at the next reconcile.
    Retried,
    /// `inUseError` (FAILED_PRECONDITION): the volume is marked with an in-use
    /// expansion error and node expansion is not retried until it is unmounted.
    StopsUntilRemount,
    /// `isInfeasibleError` (current release): the PVC is marked NodeResizeInfeasible.
    Infeasible,
}

/// `expander.go` `nodeExpandWithClient`'s classification of a failure.
pub fn expand_failure(release: Release, code: tonic::Code) -> ExpandFailure {
    use tonic::Code;
    match (release, code) {
        (_, Code::FailedPrecondition) => ExpandFailure::StopsUntilRemount,
        (Release::Current, Code::InvalidArgument | Code::OutOfRange | Code::NotFound) => {
            ExpandFailure::Infeasible
        }
        _ => ExpandFailure::Retried,
    }
}

/// `csi_client.go` `isFinalError`: whether kubelet takes a NodeStage or NodePublish
/// failure as final (the operation finished; the mount directory is cleaned up) or as
/// uncertain (it may still be in progress, and kubelet keeps the volume in an uncertain
/// state while it retries).
pub fn mount_failure_is_final(code: tonic::Code) -> bool {
    use tonic::Code;
    !matches!(
        code,
        Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Unavailable
            | Code::ResourceExhausted
            | Code::Aborted
    )
}
