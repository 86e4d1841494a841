//! Requests to domain types. Every required field is checked before anything is
//! done, and every error names the field: `volume_id missing in request`,
//! `volume_capability.mount.volume_mount_group "abc" is not a group id`.

use std::path::{Component, Path, PathBuf};

use tonic::Status;

use crate::config::{MountGroup, ViewOptions};
use crate::share::VolumeId;
use crate::share::remote::Kind;
use crate::volume::{AccessMode, Capability, Inline, Lifecycle, SecretSpec};

use super::pb;
use super::pb::volume_capability::access_mode::Mode;

/// The longest path accepted (PATH_MAX).
const MAX_PATH: usize = 4096;

fn invalid(msg: String) -> Status {
    Status::invalid_argument(msg)
}

/// A required, well-formed volume id.
///
/// # Errors
/// InvalidArgument naming `field`.
pub fn volume_id(value: &str, field: &str) -> Result<VolumeId, Status> {
    if value.is_empty() {
        return Err(invalid(format!("{field} missing in request")));
    }
    VolumeId::parse(value).map_err(|why| invalid(format!("{field} {value:?} {why}")))
}

/// The longest volume id taken from a request: CSI's general string limit is 128
/// bytes, but a static PV's `volumeHandle` is whatever its author wrote, and the
/// peers' own ids pass the limit (csi-driver-nfs's `server#share#subdir#uuid#`).
const MAX_HANDLE: usize = 1024;

/// A required volume id as a request carries it: a share root's volume id, a volume
/// the driver made on a named share, or a static PV's handle, any string of printable
/// characters. It names no path: the node keeps it in its state and hashes it for
/// file names.
///
/// # Errors
/// InvalidArgument naming `field`.
pub fn handle(value: &str, field: &str) -> Result<String, Status> {
    if value.is_empty() {
        return Err(invalid(format!("{field} missing in request")));
    }
    if value.len() > MAX_HANDLE {
        return Err(invalid(format!(
            "{field} is longer than {MAX_HANDLE} bytes"
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid(format!("{field} holds a control character")));
    }
    Ok(value.to_string())
}

/// A CreateVolume name: it names the volume's directory on a named share unless its
/// class's `subDir` does, and is the id of a share root's volume, so it must be a
/// directory's name.
///
/// # Errors
/// InvalidArgument naming it.
pub fn name(value: &str) -> Result<(), Status> {
    if value.len() > crate::share::MAX_ID_LEN {
        return Err(invalid(format!(
            "name is longer than {} bytes",
            crate::share::MAX_ID_LEN
        )));
    }
    if value == "." || value == ".." || value.contains('/') || value.chars().any(char::is_control) {
        return Err(invalid(format!(
            "name {value:?} cannot be a directory's name"
        )));
    }
    Ok(())
}

/// A path the request names only to find a volume there (`volume_path` of
/// NodeGetVolumeStats and NodeExpandVolume): missing is `INVALID_ARGUMENT`, but any
/// other value the volume cannot be at, relative or odd, is `NOT_FOUND`, as the spec
/// asks ("volume_path does not exist"). The path is only compared with the node's
/// records, never opened, before it is found there.
///
/// # Errors
/// `InvalidArgument` when empty, `NotFound` when it cannot be a published path.
pub fn lookup_path(value: &str, field: &str) -> Result<PathBuf, Status> {
    match abs_path(value, field) {
        Ok(p) => Ok(p),
        Err(_) if !value.is_empty() => Err(Status::not_found(format!(
            "nothing is published or staged at {field} {value:?}"
        ))),
        Err(e) => Err(e),
    }
}

/// A required absolute path without `..` components, normalised.
///
/// # Errors
/// InvalidArgument naming `field`.
pub fn abs_path(value: &str, field: &str) -> Result<PathBuf, Status> {
    if value.is_empty() {
        return Err(invalid(format!("{field} missing in request")));
    }
    if value.len() > MAX_PATH || value.contains('\0') {
        return Err(invalid(format!("{field} is not a usable path")));
    }
    let path = Path::new(value);
    if !path.is_absolute() {
        return Err(invalid(format!(
            "{field} {value:?} is not an absolute path"
        )));
    }
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                return Err(invalid(format!("{field} {value:?} must not contain `..`")));
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Ok(out)
}

/// Why a capability cannot be served (as opposed to being malformed).
#[derive(Debug)]
pub enum CapabilityError {
    Invalid(Status),
    Unsupported(String),
}

impl CapabilityError {
    /// As a status, for RPCs where an unsupported capability is a bad argument.
    pub fn into_status(self) -> Status {
        match self {
            CapabilityError::Invalid(s) => s,
            CapabilityError::Unsupported(m) => invalid(m),
        }
    }
}

/// A required volume capability: mount access with parsed options.
///
/// # Errors
/// InvalidArgument naming the field, or Unsupported for block access and foreign
/// file system types.
pub fn capability(
    cap: Option<&pb::VolumeCapability>,
    field: &str,
    share: Option<Kind>,
) -> Result<Capability, CapabilityError> {
    let bad = |m: String| CapabilityError::Invalid(invalid(m));
    let cap = cap.ok_or_else(|| bad(format!("{field} missing in request")))?;
    let mode = cap
        .access_mode
        .as_ref()
        .ok_or_else(|| bad(format!("{field}.access_mode missing in request")))?;
    let access = match Mode::try_from(mode.mode) {
        Ok(Mode::SingleNodeWriter) => AccessMode::SingleNodeWriter,
        Ok(Mode::SingleNodeReaderOnly) => AccessMode::SingleNodeReaderOnly,
        Ok(Mode::MultiNodeReaderOnly) => AccessMode::MultiNodeReaderOnly,
        Ok(Mode::MultiNodeSingleWriter) => AccessMode::MultiNodeSingleWriter,
        Ok(Mode::MultiNodeMultiWriter) => AccessMode::MultiNodeMultiWriter,
        Ok(Mode::SingleNodeSingleWriter) => AccessMode::SingleNodeSingleWriter,
        Ok(Mode::SingleNodeMultiWriter) => AccessMode::SingleNodeMultiWriter,
        Ok(Mode::Unknown) | Err(_) => {
            return Err(bad(format!(
                "{field}.access_mode.mode {} is not an access mode",
                mode.mode
            )));
        }
    };
    let mount = match &cap.access_type {
        None => {
            return Err(bad(format!(
                "{field}.access_type missing in request (mount or block)"
            )));
        }
        Some(pb::volume_capability::AccessType::Block(_)) => {
            return Err(CapabilityError::Unsupported(format!(
                "{field}: block access is not supported; mountgroup volumes are file systems"
            )));
        }
        Some(pb::volume_capability::AccessType::Mount(m)) => m,
    };
    // A named share's own type (`cifs`, `nfs`, ...) says what the share is, as a
    // peer's PV may; the pod sees a view of it.
    let share_type = share.is_some_and(|k| {
        k.mount_types().contains(&mount.fs_type.as_str())
            || (k == Kind::Smb && mount.fs_type == "smb")
    });
    if !(mount.fs_type.is_empty() || mount.fs_type == "fuse.mountgroup" || share_type) {
        return Err(CapabilityError::Unsupported(format!(
            "{field}.mount.fs_type {:?} is not supported (leave it empty)",
            mount.fs_type
        )));
    }
    let (client, view) = match share {
        None => (Vec::new(), mount.mount_flags.clone()),
        Some(kind) => crate::share::remote::split_flags(kind, &mount.mount_flags)
            .map_err(|e| bad(format!("{field}.mount.mount_flags: {e}")))?,
    };
    let options = ViewOptions::parse_all(view.iter().map(String::as_str))
        .map_err(|e| bad(format!("{field}.mount.mount_flags: {e}")))?;
    let mount_group = if mount.volume_mount_group.is_empty() {
        None
    } else {
        Some(MountGroup::parse(&mount.volume_mount_group).map_err(|_| {
            bad(format!(
                "{field}.mount.volume_mount_group {:?} is not a group id",
                mount.volume_mount_group
            ))
        })?)
    };
    Ok(Capability {
        access,
        options,
        client,
        mount_group,
    })
}

/// The `volume_context` key kubelet sets (with podInfoOnMount) on inline volumes.
pub const EPHEMERAL_KEY: &str = "csi.storage.k8s.io/ephemeral";

/// Parses a size: bytes, or a number with a Kubernetes unit (`Ki`, `Mi`, `Gi`, `Ti`,
/// or decimal `k`, `M`, `G`, `T`).
///
/// # Errors
/// A message saying why it is not a size.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let units: &[(&str, u64)] = &[
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    let (digits, mult) = units
        .iter()
        .find_map(|(u, m)| s.strip_suffix(u).map(|d| (d, *m)))
        .unwrap_or((s, 1));
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err("is not a size (bytes, or a number with Ki, Mi, Gi, Ti, k, M, G or T)".into());
    }
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|n| *n > 0)
        .ok_or_else(|| "is zero or too large".into())
}

/// Key prefixes of `volume_context` that belong to Kubernetes, never to a pod author:
/// kubelet's pod information and tokens (`csi.storage.k8s.io/`, kubernetes
/// pkg/volume/csi/csi_mounter.go `podAttributes`, `podServiceAccountTokenAttrs`) and
/// external-provisioner's identity (`storage.kubernetes.io/csiProvisionerIdentity`,
/// v5.3.0 pkg/controller/controller.go `provisionerIDKey`, in every provisioned PV).
const KUBERNETES_PREFIXES: [&str; 2] = ["csi.storage.k8s.io/", "storage.kubernetes.io/"];

/// The attributes of ours: an inline volume's `volumeAttributes`.
const OURS: [&str; 4] = ["size", "source", "items", "defaultMode"];

/// The pod a publish is for, where kubelet names it (`podInfoOnMount`:
/// `csi.storage.k8s.io/pod.namespace` and `pod.name`, csi_mounter.go `podAttributes`).
pub fn pod(
    ctx: &std::collections::HashMap<String, String>,
) -> Option<crate::volume::serve::PodRef> {
    let get = |k: &str| ctx.get(k).filter(|v| !v.is_empty()).cloned();
    Some(crate::volume::serve::PodRef {
        namespace: get("csi.storage.k8s.io/pod.namespace")?,
        name: get("csi.storage.k8s.io/pod.name")?,
    })
}

/// The volume's lifecycle from `volume_context`: kubelet's
/// `csi.storage.k8s.io/ephemeral` and an inline volume's `volumeAttributes`.
///
/// What is accepted follows who wrote the keys. kubelet hands a PV's
/// `volumeAttributes` to NodeStage and NodePublish unfiltered and adds the pod's
/// information (`csi_mounter.go` `SetUpAt`, `mergeMap`), so a persistent volume's
/// context holds whatever the provisioner or a static PV's author put there: any key
/// is accepted and ignored, except ours (`size`, `source`, `items`, `defaultMode`),
/// which only mean something inline and are refused rather than silently dropped. An
/// inline volume's attributes are the pod author's own: any key that is neither ours
/// nor Kubernetes' is a typo and is refused, naming it. Values are never echoed (the
/// tokens kubelet puts there are secrets).
///
/// # Errors
/// InvalidArgument naming the attribute.
pub fn lifecycle(ctx: &std::collections::HashMap<String, String>) -> Result<Lifecycle, Status> {
    const KNOWN: &str = "size, source, items, defaultMode";
    let ephemeral = match ctx.get(EPHEMERAL_KEY).map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => {
            return Err(invalid(format!(
                "volume_context.{EPHEMERAL_KEY} is not true or false"
            )));
        }
    };
    let foreign =
        |k: &&str| !KUBERNETES_PREFIXES.iter().any(|p| k.starts_with(p)) && !OURS.contains(k);
    if ephemeral {
        let mut unknown: Vec<&str> = ctx.keys().map(String::as_str).filter(foreign).collect();
        if !unknown.is_empty() {
            unknown.sort_unstable();
            return Err(invalid(format!(
                "volume_context: unknown attributes {unknown:?} of an inline volume (known: {KNOWN})"
            )));
        }
    } else {
        let mut ignored: Vec<&str> = ctx.keys().map(String::as_str).filter(foreign).collect();
        if !ignored.is_empty() {
            ignored.sort_unstable();
            tracing::debug!(keys = ?ignored, "volume_context keys of a persistent volume ignored");
        }
    }
    let get = |k: &str| ctx.get(k).map(String::as_str);
    if !ephemeral {
        // A persistent volume's `source` is an SMB share's (`//server/share`, as
        // csi-driver-smb's PVs name it), never an inline volume's.
        let smb_source =
            get("source").is_some_and(|s| s.starts_with("//") || s.starts_with("\\\\"));
        if let Some(k) = OURS
            .into_iter()
            .find(|k| ctx.contains_key(*k) && !(*k == "source" && smb_source))
        {
            return Err(invalid(format!(
                "volume_context.{k} applies to inline (ephemeral) volumes only"
            )));
        }
        return Ok(Lifecycle::Persistent);
    }
    match get("source").unwrap_or("share") {
        "share" => share_inline(ctx).map(|size| Lifecycle::Ephemeral(Inline::Share { size })),
        "secrets" => secrets_inline(ctx).map(|spec| Lifecycle::Ephemeral(Inline::Secrets(spec))),
        other => Err(invalid(format!(
            "volume_context.source {other:?} is not share or secrets"
        ))),
    }
}

/// An inline volume on the share root (`source: share`): its `size`, if any.
fn share_inline(ctx: &std::collections::HashMap<String, String>) -> Result<Option<u64>, Status> {
    if let Some(k) = ["items", "defaultMode"]
        .into_iter()
        .find(|k| ctx.contains_key(*k))
    {
        return Err(invalid(format!(
            "volume_context.{k} applies to source: secrets only"
        )));
    }
    ctx.get("size")
        .map(|v| parse_size(v).map_err(|why| invalid(format!("volume_context.size {v:?} {why}"))))
        .transpose()
}

/// A secret view (`source: secrets`): the `items` it shows and their `defaultMode`.
fn secrets_inline(ctx: &std::collections::HashMap<String, String>) -> Result<SecretSpec, Status> {
    let get = |k: &str| ctx.get(k).map(String::as_str);
    if ctx.contains_key("size") {
        return Err(invalid(
            "volume_context.size does not apply to source: secrets".into(),
        ));
    }
    let items = get("items")
        .map(|v| {
            v.split(',')
                .filter(|i| !i.trim().is_empty())
                .map(|item| {
                    let (key, path) = item
                        .trim()
                        .split_once('=')
                        .unwrap_or((item.trim(), item.trim()));
                    crate::volume::secrets::check_path(path)
                        .map(|p| (key.to_string(), p))
                        .map_err(|why| {
                            invalid(format!("volume_context.items: path of {key:?} {why}"))
                        })
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    let default_mode = get("defaultMode")
        .map(|v| {
            let digits = v.strip_prefix("0o").unwrap_or(v);
            u32::from_str_radix(digits, 8)
                .ok()
                .filter(|m| *m <= 0o777)
                .ok_or_else(|| {
                    invalid(format!(
                        "volume_context.defaultMode {v:?} is not an octal mode up to 0777"
                    ))
                })
        })
        .transpose()?;
    Ok(SecretSpec {
        items,
        default_mode,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::volume_capability::{AccessMode as PbMode, AccessType, MountVolume};

    fn cap(flags: &[&str], group: &str, mode: Mode) -> pb::VolumeCapability {
        pb::VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: String::new(),
                mount_flags: flags.iter().map(|s| s.to_string()).collect(),
                volume_mount_group: group.into(),
            })),
            access_mode: Some(PbMode { mode: mode as i32 }),
        }
    }

    fn message(r: Result<Capability, CapabilityError>) -> String {
        r.err().unwrap().into_status().message().to_string()
    }

    #[test]
    fn capabilities_are_checked_field_by_field() {
        let ok = capability(
            Some(&cap(&["ro"], "2000", Mode::MultiNodeMultiWriter)),
            "volume_capability",
            None,
        )
        .unwrap();
        assert_eq!(ok.mount_group, MountGroup::new(2000));
        assert!(ok.options.readonly);
        assert_eq!(
            message(capability(None, "volume_capability", None)),
            "volume_capability missing in request"
        );
        assert_eq!(
            message(capability(
                Some(&cap(&[], "abc", Mode::SingleNodeWriter)),
                "volume_capability",
                None
            )),
            "volume_capability.mount.volume_mount_group \"abc\" is not a group id"
        );
        assert_eq!(
            message(capability(
                Some(&cap(&["colour=red"], "", Mode::SingleNodeWriter)),
                "volume_capability",
                None
            )),
            "volume_capability.mount.mount_flags: unknown option `colour`"
        );
        assert!(
            message(capability(
                Some(&cap(&[], "", Mode::Unknown)),
                "volume_capability",
                None
            ))
            .contains("access_mode.mode 0")
        );
        let mut block = cap(&[], "", Mode::SingleNodeWriter);
        block.access_type = Some(AccessType::Block(Default::default()));
        assert!(matches!(
            capability(Some(&block), "c", None),
            Err(CapabilityError::Unsupported(_))
        ));
        let mut none = cap(&[], "", Mode::SingleNodeWriter);
        none.access_mode = None;
        assert_eq!(
            message(capability(Some(&none), "c", None)),
            "c.access_mode missing in request"
        );
    }

    #[test]
    fn volume_contexts() {
        use std::collections::HashMap;
        let ctx = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>()
        };
        let eph = (EPHEMERAL_KEY, "true");
        let pod = ("csi.storage.k8s.io/pod.name", "p");
        assert_eq!(lifecycle(&ctx(&[pod])).unwrap(), Lifecycle::Persistent);
        // A provisioned PV's attributes and a static PV's own keys are accepted.
        let provisioned = (
            "storage.kubernetes.io/csiProvisionerIdentity",
            "1763900000000-8081-mountgroup.csi.io",
        );
        assert_eq!(
            lifecycle(&ctx(&[
                provisioned,
                pod,
                (EPHEMERAL_KEY, "false"),
                ("storageAccount", "legacy"),
                ("example.com/tier", "gold"),
            ]))
            .unwrap(),
            Lifecycle::Persistent
        );
        assert_eq!(
            lifecycle(&ctx(&[
                eph,
                pod,
                ("csi.storage.k8s.io/serviceAccount.tokens", "{}")
            ]))
            .unwrap(),
            Lifecycle::Ephemeral(Inline::Share { size: None })
        );
        assert_eq!(
            lifecycle(&ctx(&[eph, pod])).unwrap(),
            Lifecycle::Ephemeral(Inline::Share { size: None })
        );
        assert_eq!(
            lifecycle(&ctx(&[eph, ("size", "5Mi")])).unwrap(),
            Lifecycle::Ephemeral(Inline::Share {
                size: Some(5 << 20)
            })
        );
        let s = lifecycle(&ctx(&[
            eph,
            ("source", "secrets"),
            ("items", "a,b=dir/b.txt"),
            ("defaultMode", "0400"),
        ]))
        .unwrap();
        assert_eq!(
            s,
            Lifecycle::Ephemeral(Inline::Secrets(SecretSpec {
                items: Some(vec![
                    ("a".into(), "a".into()),
                    ("b".into(), "dir/b.txt".into())
                ]),
                default_mode: Some(0o400),
            }))
        );
        let msg =
            |pairs: &[(&str, &str)]| lifecycle(&ctx(pairs)).unwrap_err().message().to_string();
        assert!(
            msg(&[eph, ("colour", "red"), ("hostPath", "/etc")])
                .contains("[\"colour\", \"hostPath\"]")
        );
        assert!(
            !msg(&[eph, ("token", "s3cret")]).contains("s3cret"),
            "values are never echoed"
        );
        assert!(msg(&[("size", "1Gi")]).contains("volume_context.size applies to inline"));
        assert!(msg(&[eph, ("size", "lots")]).contains("volume_context.size"));
        assert!(
            msg(&[eph, ("source", "secrets"), ("items", "a=../../etc/passwd")]).contains("items")
        );
        assert!(msg(&[eph, ("items", "a")]).contains("source: secrets only"));
        assert!(msg(&[eph, ("source", "hostpath")]).contains("volume_context.source"));
        assert!(
            msg(&[eph, ("source", "secrets"), ("defaultMode", "4755")]).contains("defaultMode")
        );
        assert_eq!(parse_size("1000").unwrap(), 1000);
        assert_eq!(parse_size("2G").unwrap(), 2_000_000_000);
        assert!(
            parse_size("0").is_err()
                && parse_size("-1Mi").is_err()
                && parse_size("99999999999Ti").is_err()
        );
    }

    #[test]
    fn paths_and_ids() {
        assert_eq!(
            abs_path("/a/./b/", "target_path").unwrap(),
            PathBuf::from("/a/b")
        );
        assert_eq!(
            abs_path("", "target_path").unwrap_err().message(),
            "target_path missing in request"
        );
        assert_eq!(
            abs_path("a/b", "target_path").unwrap_err().message(),
            "target_path \"a/b\" is not an absolute path"
        );
        assert!(
            abs_path("/a/../etc", "target_path")
                .unwrap_err()
                .message()
                .contains("`..`")
        );
        assert_eq!(
            volume_id("", "volume_id").unwrap_err().message(),
            "volume_id missing in request"
        );
        assert!(
            volume_id("../x", "volume_id")
                .unwrap_err()
                .message()
                .starts_with("volume_id \"../x\"")
        );
    }
}
