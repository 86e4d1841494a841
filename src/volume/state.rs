//! The node's persisted state: what is staged and published, so that a restarted
//! driver serves every view again and can clean up whatever is left.
//!
//! One JSON file in the state directory, rewritten atomically on every change. It
//! holds paths, volume ids and view options, never a secret.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::share::remote::Kind;
use crate::share::{VolumeHandle, write_atomically};

use super::VolumeError;
use super::serve::Mechanism;

const VERSION: u32 = 1;

/// A volume staged on this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Staged {
    pub staging_path: PathBuf,
    /// The named share mounted at the staging path, for a volume of one (none for the
    /// share root's, whose directory is bound there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<StagedShare>,
}

/// A named share a stage mounted: what it is, never its credentials.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedShare {
    pub kind: Kind,
    /// The share's directory as its users write it (`//server/share/dir`).
    pub share: String,
    /// The volume's own group on the share (a volume the driver made native, or
    /// whose views act as their callers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub owners: bool,
    /// Why a volume the driver made is not native, as CreateVolume found it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_native: Option<String>,
}

/// What a published view shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ViewKind {
    /// A staged persistent volume.
    #[default]
    Persistent,
    /// An inline volume on the share, deleted on unpublish.
    InlineShare,
    /// An inline read-only view of secrets held on a private tmpfs (the `source`).
    InlineSecrets,
}

/// A view published at a target path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    pub volume_id: VolumeHandle,
    #[serde(default)]
    pub kind: ViewKind,
    /// What the view shows: the staging path, the volume directory of an inline
    /// volume, or the tmpfs of a secret view.
    pub source: PathBuf,
    /// The view's options in canonical form (`ViewOptions::to_option_string`).
    pub options: String,
    /// The view process, when this driver started it.
    pub pid: Option<u32>,
    /// Whether publish created the target directory (and unpublish removes it).
    pub created_target: bool,
    /// How the target is served (a FUSE view for what earlier versions published).
    #[serde(default)]
    pub mechanism: Mechanism,
    /// Why it is not a native view, when the volume is native (a metric's label).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
}

/// Everything the node remembers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeState {
    pub version: u32,
    pub staged: BTreeMap<VolumeHandle, Staged>,
    pub published: BTreeMap<PathBuf, Published>,
}

impl NodeState {
    /// Reads the state file; a missing file is an empty state.
    ///
    /// # Errors
    /// [`VolumeError::Internal`] when the file exists but cannot be read or parsed.
    pub fn load(path: &Path) -> Result<NodeState, VolumeError> {
        let body = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(NodeState {
                    version: VERSION,
                    ..NodeState::default()
                });
            }
            Err(e) => {
                return Err(VolumeError::Internal(format!(
                    "state file {}: {e}",
                    path.display()
                )));
            }
        };
        let state: NodeState = serde_json::from_slice(&body)
            .map_err(|e| VolumeError::Internal(format!("state file {}: {e}", path.display())))?;
        if state.version != VERSION {
            return Err(VolumeError::Internal(format!(
                "state file {} has version {}, this driver reads {VERSION}",
                path.display(),
                state.version
            )));
        }
        Ok(state)
    }

    /// Writes the state file atomically.
    ///
    /// # Errors
    /// [`VolumeError::Internal`] naming the file.
    pub fn save(&self, path: &Path) -> Result<(), VolumeError> {
        let body =
            serde_json::to_vec_pretty(self).map_err(|e| VolumeError::Internal(e.to_string()))?;
        write_atomically(path, &body)
            .map_err(|e| VolumeError::Internal(format!("state file {}: {e}", path.display())))
    }

    /// The targets at which a volume is published.
    pub fn targets_of(&self, id: &VolumeHandle) -> Vec<PathBuf> {
        self.published
            .iter()
            .filter(|(_, p)| &p.volume_id == id)
            .map(|(t, _)| t.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        assert_eq!(NodeState::load(&path).unwrap().version, VERSION);
        let mut s = NodeState {
            version: VERSION,
            ..Default::default()
        };
        let id = VolumeHandle::new("v1");
        s.staged.insert(
            id.clone(),
            Staged {
                staging_path: "/s".into(),
                share: None,
            },
        );
        s.staged.insert(
            VolumeHandle::new("smb-server.default.svc.cluster.local/share##"),
            Staged {
                staging_path: "/s2".into(),
                share: Some(StagedShare {
                    kind: Kind::Smb,
                    share: "//smb-server.default.svc.cluster.local/share".into(),
                    group: None,
                    owners: false,
                    not_native: None,
                }),
            },
        );
        s.published.insert(
            "/t".into(),
            Published {
                volume_id: id.clone(),
                kind: ViewKind::InlineSecrets,
                source: "/s".into(),
                options: "gid=1".into(),
                pid: Some(7),
                created_target: true,
                mechanism: Mechanism::Native {
                    disk_group: 2_000_000_000,
                    shown: 4242,
                },
                fallback: None,
            },
        );
        s.save(&path).unwrap();
        assert_eq!(NodeState::load(&path).unwrap(), s);
        assert_eq!(s.targets_of(&id), vec![PathBuf::from("/t")]);
        std::fs::write(&path, "{").unwrap();
        assert!(
            matches!(NodeState::load(&path), Err(VolumeError::Internal(m)) if m.contains("state.json"))
        );
    }
}
