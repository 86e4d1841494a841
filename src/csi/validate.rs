//! Requests to domain types. Every required field is checked before anything is
//! done, and every error names the field: `volume_id missing in request`,
//! `volume_capability.mount.volume_mount_group "abc" is not a group id`.

use std::path::{Component, Path, PathBuf};

use tonic::Status;

use crate::config::{MountGroup, ViewOptions};
use crate::share::VolumeId;
use crate::volume::{AccessMode, Capability};

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
    if !(mount.fs_type.is_empty() || mount.fs_type == "fuse.mountgroup") {
        return Err(CapabilityError::Unsupported(format!(
            "{field}.mount.fs_type {:?} is not supported (leave it empty)",
            mount.fs_type
        )));
    }
    let options = ViewOptions::parse_all(mount.mount_flags.iter().map(String::as_str))
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
        mount_group,
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
        )
        .unwrap();
        assert_eq!(ok.mount_group, MountGroup::new(2000));
        assert!(ok.options.readonly);
        assert_eq!(
            message(capability(None, "volume_capability")),
            "volume_capability missing in request"
        );
        assert_eq!(
            message(capability(
                Some(&cap(&[], "abc", Mode::SingleNodeWriter)),
                "volume_capability"
            )),
            "volume_capability.mount.volume_mount_group \"abc\" is not a group id"
        );
        assert_eq!(
            message(capability(
                Some(&cap(&["colour=red"], "", Mode::SingleNodeWriter)),
                "volume_capability"
            )),
            "volume_capability.mount.mount_flags: unknown option `colour`"
        );
        assert!(
            message(capability(
                Some(&cap(&[], "", Mode::Unknown)),
                "volume_capability"
            ))
            .contains("access_mode.mode 0")
        );
        let mut block = cap(&[], "", Mode::SingleNodeWriter);
        block.access_type = Some(AccessType::Block(Default::default()));
        assert!(matches!(
            capability(Some(&block), "c"),
            Err(CapabilityError::Unsupported(_))
        ));
        let mut none = cap(&[], "", Mode::SingleNodeWriter);
        none.access_mode = None;
        assert_eq!(
            message(capability(Some(&none), "c")),
            "c.access_mode missing in request"
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
