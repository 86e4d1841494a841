//! Volume lifecycle: the controller's volumes on the share, and the node's staged
//! volumes and published views, persisted so that a restarted driver carries on.
//!
//! Nothing here sees tonic: requests arrive as the domain types below, failures leave
//! as [`VolumeError`], whose every message names what was wrong.

pub mod controller;
pub mod guard;
pub mod keeper;
pub mod names;
pub mod native;
pub mod node;
pub mod secrets;
pub mod serve;
pub mod state;
pub mod view;

/// The capacity a volume gets when the request names none.
pub const DEFAULT_CAPACITY: u64 = 1 << 30;

use crate::config::ViewOptions;
use crate::share::ShareError;

/// How a volume may be used (the CSI access modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessMode {
    SingleNodeWriter,
    SingleNodeReaderOnly,
    MultiNodeReaderOnly,
    MultiNodeSingleWriter,
    MultiNodeMultiWriter,
    SingleNodeSingleWriter,
    SingleNodeMultiWriter,
}

impl AccessMode {
    /// Whether the mode allows no writer at all.
    pub fn read_only(self) -> bool {
        matches!(
            self,
            AccessMode::SingleNodeReaderOnly | AccessMode::MultiNodeReaderOnly
        )
    }
}

/// A validated volume capability: mount access (block access is refused at the
/// protocol edge) with its view options already parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct Capability {
    pub access: AccessMode,
    /// `mount_flags`, parsed; the CSI `volume_mount_group` is not merged in yet.
    pub options: ViewOptions,
    /// The options of `mount_flags` that are a named share's kernel client's (its
    /// mount's, at NodeStageVolume); none for the share root's volumes.
    pub client: crate::share::remote::ClientOptions,
    /// `volume_mount_group`: the pod's fsGroup.
    pub mount_group: Option<crate::config::MountGroup>,
}

/// Whether a publish is of a persistent volume (staged first) or an inline one that
/// lives and dies with the pod (KEP-596).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    Persistent,
    Ephemeral(Inline),
}

/// An inline volume, from the pod's `volumeAttributes`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inline {
    /// A fresh volume on the share (`source: share`), of `size` bytes if asked for.
    Share { size: Option<u64> },
    /// A read-only view of the request's secrets (`source: secrets`).
    Secrets(SecretSpec),
}

/// Which secrets become which files, and their mode (a Secret volume's `items` and
/// `defaultMode`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretSpec {
    /// `None`: every secret entry, named by its key.
    pub items: Option<Vec<(String, std::path::PathBuf)>>,
    /// `None`: 0440 with a mount group (readable by the pod's fsGroup), 0444 without.
    pub default_mode: Option<u32>,
}

/// The default mode of secret files: readable by owner and group (the pod's fsGroup).
pub const SECRET_DEFAULT_MODE: u32 = 0o440;

/// Why a volume operation failed. The message always names the field, volume or path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Aborted(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    OutOfRange(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    DeadlineExceeded(String),
    #[error("{0}")]
    Internal(String),
}

/// A request's `secrets`: the share key, or a named share's credentials. `Debug`
/// shows the keys only, never a value.
#[derive(Clone, Default)]
pub struct Secrets(pub std::collections::HashMap<String, String>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut keys: Vec<&String> = self.0.keys().collect();
        keys.sort();
        write!(f, "Secrets({keys:?})")
    }
}

impl Secrets {
    /// The share key, where the request carries one.
    pub fn share_key(&self) -> Option<&str> {
        self.0
            .get(crate::share::key::SECRET_NAME)
            .map(String::as_str)
    }
}

/// How long a call may wait on a named share's server: the request's own deadline
/// (its `grpc-timeout`, less a tenth, so that the answer is the driver's and names the
/// server), and never more than `longest`.
pub fn share_wait(
    deadline: Option<std::time::Duration>,
    longest: std::time::Duration,
) -> std::time::Duration {
    match deadline {
        Some(d) => longest.min(d.mul_f64(0.9)),
        None => longest,
    }
}

/// What a CSI caller must configure to send the share key, for each kind of call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretUse {
    Provisioner,
    ControllerExpand,
    NodeStage,
    NodeExpand,
}

impl SecretUse {
    fn storage_class_parameter(self) -> &'static str {
        match self {
            SecretUse::Provisioner => "csi.storage.k8s.io/provisioner-secret-name",
            SecretUse::ControllerExpand => "csi.storage.k8s.io/controller-expand-secret-name",
            SecretUse::NodeStage => "csi.storage.k8s.io/node-stage-secret-name",
            SecretUse::NodeExpand => "csi.storage.k8s.io/node-expand-secret-name",
        }
    }
}

/// Checks the share key a request carries; the error names the secret entry and the
/// StorageClass parameter that supplies it, never a key.
///
/// # Errors
/// `InvalidArgument` when missing, `PermissionDenied` when wrong.
pub fn authorize(
    key: &crate::share::key::ShareKey,
    presented: Option<&str>,
    used_for: SecretUse,
) -> Result<(), VolumeError> {
    use crate::share::key::KeyError;
    key.verify(presented).map_err(|e| match e {
        KeyError::Missing => VolumeError::InvalidArgument(format!(
            "{e} (set {} and its namespace in the StorageClass)",
            used_for.storage_class_parameter()
        )),
        KeyError::Wrong => VolumeError::PermissionDenied(e.to_string()),
    })
}

impl From<ShareError> for VolumeError {
    fn from(e: ShareError) -> Self {
        match e {
            ShareError::Conflict(_) => VolumeError::AlreadyExists(e.to_string()),
            // UNAVAILABLE: the sidecars and kubelet retry it, and the share may be
            // mounted by then.
            ShareError::NotThere(_) | ShareError::Unreachable(_) => {
                VolumeError::Unavailable(e.to_string())
            }
            ShareError::Refused(_) => VolumeError::PermissionDenied(e.to_string()),
            ShareError::NoSuchShare(_) => VolumeError::NotFound(e.to_string()),
            ShareError::Rejected(_) => VolumeError::InvalidArgument(e.to_string()),
            ShareError::TimedOut(_) => VolumeError::DeadlineExceeded(e.to_string()),
            ShareError::Io { .. } | ShareError::Corrupt { .. } | ShareError::Backend(_) => {
                VolumeError::Internal(e.to_string())
            }
        }
    }
}
