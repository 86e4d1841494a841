//! Controller operations: volumes on the share.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::share::key::ShareKey;
use crate::share::{Created, Share, VolumeId, VolumeRecord, VolumeSpec};

use super::guard::OpGuards;
use super::node::Node;
use super::{DEFAULT_CAPACITY, SecretUse, VolumeError, authorize};

/// StorageClass parameters under this prefix are the CO's own (the provisioner's
/// `--extra-create-metadata`); they are recorded and otherwise ignored.
const CO_PREFIX: &str = "csi.storage.k8s.io/";

/// The StorageClass parameter that chooses how the volume's views are made: `native`
/// (the default: idmapped bind mounts where the share allows them) or `fuse` (FUSE
/// views with kubelet's full mode semantics, always).
pub const VIEW_PARAMETER: &str = "view";

/// The controller service's domain.
pub struct Controller {
    share: Arc<dyn Share>,
    guards: Arc<OpGuards>,
    key: Arc<ShareKey>,
    /// The node service of this process, to refuse deleting a volume still in use.
    node: Option<Arc<Node>>,
}

/// A page of volumes.
pub struct VolumePage {
    pub volumes: Vec<VolumeRecord>,
    /// The token for the next page; empty after the last.
    pub next_token: String,
}

impl Controller {
    pub fn new(
        share: Arc<dyn Share>,
        guards: Arc<OpGuards>,
        key: Arc<ShareKey>,
        node: Option<Arc<Node>>,
    ) -> Controller {
        Controller {
            share,
            guards,
            key,
            node,
        }
    }

    /// Creates a volume, idempotently by name: a repeat with a compatible capacity
    /// range and the same parameters returns the existing volume; an incompatible one
    /// is ALREADY_EXISTS.
    ///
    /// # Errors
    /// `InvalidArgument` naming a bad capacity or parameter or a missing share key,
    /// `PermissionDenied` for a wrong key, `AlreadyExists`, `Aborted` while another call
    /// on the same name runs.
    pub fn create_volume(
        &self,
        id: VolumeId,
        name: &str,
        required: i64,
        limit: i64,
        parameters: BTreeMap<String, String>,
        secret: Option<&str>,
    ) -> Result<VolumeRecord, VolumeError> {
        let capacity = pick_capacity(required, limit)?;
        if let Some(key) = parameters
            .keys()
            .find(|k| !k.starts_with(CO_PREFIX) && *k != VIEW_PARAMETER)
        {
            return Err(VolumeError::InvalidArgument(format!(
                "parameters: unknown key {key:?}"
            )));
        }
        if let Some(v) = parameters.get(VIEW_PARAMETER) {
            if v != "native" && v != "fuse" {
                return Err(VolumeError::InvalidArgument(format!(
                    "parameters: {VIEW_PARAMETER}: {v:?} is not \"native\" or \"fuse\""
                )));
            }
        }
        authorize(&self.key, secret, SecretUse::Provisioner)?;
        let _guard = self.guards.acquire(id.as_str(), "CreateVolume")?;
        if let Some(existing) = self.share.get(&id)? {
            let fits = existing.capacity_bytes >= required.max(0) as u64
                && (limit <= 0 || existing.capacity_bytes <= limit as u64);
            if fits && existing.parameters == parameters {
                return Ok(existing);
            }
            return Err(VolumeError::AlreadyExists(format!(
                "volume {id} exists with capacity {} bytes and other parameters or an incompatible capacity_range",
                existing.capacity_bytes
            )));
        }
        let native = parameters.get(VIEW_PARAMETER).map(String::as_str) != Some("fuse");
        let spec = VolumeSpec {
            id,
            name: name.to_string(),
            capacity_bytes: capacity,
            parameters,
            native,
        };
        match self.share.create(&spec)? {
            Created::New(r) => {
                tracing::info!(volume_id = %r.id, capacity_bytes = r.capacity_bytes, "volume created");
                Ok(r)
            }
            Created::Existing(r) => Ok(r),
        }
    }

    /// Deletes a volume. An unknown volume is already deleted: OK.
    ///
    /// # Errors
    /// `FailedPrecondition` while the volume is staged or published on this node; a
    /// missing or wrong share key.
    pub fn delete_volume(&self, id: &VolumeId, secret: Option<&str>) -> Result<(), VolumeError> {
        authorize(&self.key, secret, SecretUse::Provisioner)?;
        let _guard = self.guards.acquire(id.as_str(), "DeleteVolume")?;
        if let Some(node) = &self.node {
            if let Some(where_) = node.in_use(id) {
                return Err(VolumeError::FailedPrecondition(format!(
                    "volume {id} is still in use: {where_}"
                )));
            }
        }
        self.share.delete(id)?;
        tracing::info!(volume_id = %id, "volume deleted");
        Ok(())
    }

    /// The record of an existing volume.
    ///
    /// # Errors
    /// `NotFound` naming the volume.
    pub fn get(&self, id: &VolumeId) -> Result<VolumeRecord, VolumeError> {
        self.share
            .get(id)?
            .ok_or_else(|| VolumeError::NotFound(format!("volume {id} does not exist")))
    }

    /// One page of volumes, ordered by id. The token names the last volume of the
    /// previous page, so that deleting it between pages loses nothing.
    ///
    /// # Errors
    /// `InvalidArgument` for a negative `max_entries`, `Aborted` for a token this
    /// driver did not hand out.
    pub fn list(&self, max_entries: i32, starting_token: &str) -> Result<VolumePage, VolumeError> {
        if max_entries < 0 {
            return Err(VolumeError::InvalidArgument(
                "max_entries must not be negative".into(),
            ));
        }
        // Inline volumes belong to their pods, not to the controller.
        let mut all = self.share.list()?;
        all.retain(|r| !super::node::is_inline(r));
        let start = if starting_token.is_empty() {
            0
        } else {
            let after = starting_token
                .strip_prefix("after:")
                .and_then(|id| VolumeId::parse(id).ok())
                .ok_or_else(|| {
                    VolumeError::Aborted(format!(
                        "starting_token {starting_token:?} is not a token of this driver"
                    ))
                })?;
            all.partition_point(|r| r.id <= after)
        };
        let take = if max_entries == 0 {
            usize::MAX
        } else {
            max_entries as usize
        };
        let volumes: Vec<VolumeRecord> = all[start..].iter().take(take).cloned().collect();
        let next_token = match volumes.last() {
            Some(last) if start + volumes.len() < all.len() => format!("after:{}", last.id),
            _ => String::new(),
        };
        Ok(VolumePage {
            volumes,
            next_token,
        })
    }

    /// Grows the capacity the share records for a volume (never shrinks it); the
    /// node then applies it (NodeExpandVolume). Repeating it is OK.
    ///
    /// # Errors
    /// `InvalidArgument` for an empty or inverted range or a missing key,
    /// `PermissionDenied` for a wrong key, `NotFound`, `OutOfRange` for a shrink.
    pub fn expand_volume(
        &self,
        id: &VolumeId,
        required: i64,
        limit: i64,
        secret: Option<&str>,
    ) -> Result<u64, VolumeError> {
        if required <= 0 && limit <= 0 {
            return Err(VolumeError::InvalidArgument(
                "capacity_range: required_bytes or limit_bytes must be set".into(),
            ));
        }
        // The range is checked as for CreateVolume; the new size is required_bytes,
        // or limit_bytes when only that is set.
        pick_capacity(required, limit)?;
        let new = (if required > 0 { required } else { limit }) as u64;
        authorize(&self.key, secret, SecretUse::ControllerExpand)?;
        let _guard = self.guards.acquire(id.as_str(), "ControllerExpandVolume")?;
        let rec = self.get(id)?;
        if new < rec.capacity_bytes {
            return Err(VolumeError::OutOfRange(format!(
                "capacity_range: volume {id} has {} bytes; shrinking it to {new} is not supported",
                rec.capacity_bytes
            )));
        }
        if new > rec.capacity_bytes {
            self.share.set_capacity(id, new)?;
            tracing::info!(volume_id = %id, from = rec.capacity_bytes, to = new, "capacity recorded");
        }
        Ok(new)
    }

    /// Bytes the share can still give.
    ///
    /// # Errors
    /// `Internal` if the share cannot be read.
    pub fn available_capacity(&self) -> Result<u64, VolumeError> {
        Ok(self.share.available_bytes()?)
    }
}

/// The capacity for a CSI `capacity_range` (0 means unset).
///
/// # Errors
/// `InvalidArgument` for negative values or a limit below the requirement.
pub fn pick_capacity(required: i64, limit: i64) -> Result<u64, VolumeError> {
    if required < 0 || limit < 0 {
        return Err(VolumeError::InvalidArgument(
            "capacity_range: bytes must not be negative".into(),
        ));
    }
    if limit > 0 && required > limit {
        return Err(VolumeError::InvalidArgument(format!(
            "capacity_range: required_bytes {required} exceeds limit_bytes {limit}"
        )));
    }
    Ok(if required > 0 {
        required as u64
    } else if limit > 0 {
        DEFAULT_CAPACITY.min(limit as u64)
    } else {
        DEFAULT_CAPACITY
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_ranges() {
        assert_eq!(pick_capacity(0, 0).unwrap(), DEFAULT_CAPACITY);
        assert_eq!(pick_capacity(10, 0).unwrap(), 10);
        assert_eq!(pick_capacity(0, 5).unwrap(), 5);
        assert_eq!(pick_capacity(5, 5).unwrap(), 5);
        assert!(pick_capacity(6, 5).is_err());
        assert!(pick_capacity(-1, 0).is_err());
    }
}
