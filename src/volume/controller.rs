//! Controller operations: volumes on the share root, and on the shares classes name
//! (mounted for the length of the call, with the call's Secret).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::share::key::ShareKey;
use crate::share::made::{self, Want};
use crate::share::remote::{
    self, Attached, Class, ClientOptions, Credentials, Location, MadeVolume, OnDelete, Role,
    Settings, SubPath,
};
use crate::share::{Created, Share, VolumeId, VolumeRecord, VolumeSpec};

use super::guard::OpGuards;
use super::node::Node;
use super::{DEFAULT_CAPACITY, SecretUse, Secrets, VolumeError, authorize, share_wait};

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
    /// How named shares are mounted for a call.
    remotes: Settings,
}

/// A volume CreateVolume made or found: its id, capacity and the context its PV
/// carries to every node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewVolume {
    pub id: String,
    pub capacity_bytes: u64,
    pub context: HashMap<String, String>,
}

impl From<&VolumeRecord> for NewVolume {
    fn from(r: &VolumeRecord) -> NewVolume {
        NewVolume {
            id: r.id.to_string(),
            capacity_bytes: r.capacity_bytes,
            context: HashMap::new(),
        }
    }
}

/// What a CreateVolume asks.
pub struct CreateRequest<'a> {
    pub name: &'a str,
    pub required: i64,
    pub limit: i64,
    pub parameters: BTreeMap<String, String>,
    pub secrets: &'a Secrets,
    /// The `mount_flags` of the first volume capability (the class's `mountOptions`).
    pub mount_flags: &'a [String],
    /// The request's deadline, where it has one.
    pub deadline: Option<Duration>,
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
        remotes: Settings,
    ) -> Controller {
        Controller {
            share,
            guards,
            key,
            node,
            remotes,
        }
    }

    /// Creates a volume, idempotently by name: a repeat with a compatible capacity
    /// range and the same parameters returns the existing volume; an incompatible one
    /// is ALREADY_EXISTS. A class that names a share (`source`, `server` and `share`,
    /// `clusterID` or `monitors`) gets its volume's directory made on that share,
    /// mounted for the call with the provisioner Secret ([`Controller::create_named`]).
    ///
    /// # Errors
    /// `InvalidArgument` naming a bad capacity or parameter or a missing share key,
    /// `PermissionDenied` for a wrong key, `AlreadyExists`, `Aborted` while another call
    /// on the same name runs; for a named share, what mounting it answered.
    pub fn create_volume(&self, req: CreateRequest<'_>) -> Result<NewVolume, VolumeError> {
        let capacity = pick_capacity(req.required, req.limit)?;
        check_view(&req.parameters)?;
        if let Some(class) = remote::class(&req.parameters, &[VIEW_PARAMETER])
            .map_err(VolumeError::InvalidArgument)?
        {
            return self.create_named(&class, &req, capacity);
        }
        let (name, required, limit, parameters) =
            (req.name, req.required, req.limit, req.parameters);
        let id = VolumeId::parse(name)
            .map_err(|why| VolumeError::InvalidArgument(format!("name {name:?} {why}")))?;
        if let Some(key) = parameters
            .keys()
            .find(|k| !k.starts_with(CO_PREFIX) && *k != VIEW_PARAMETER)
        {
            return Err(VolumeError::InvalidArgument(format!(
                "parameters: unknown key {key:?}"
            )));
        }
        authorize(&self.key, req.secrets.share_key(), SecretUse::Provisioner)?;
        let _guard = self.guards.acquire(id.as_str(), "CreateVolume")?;
        if let Some(existing) = self.share.get(&id)? {
            let fits = existing.capacity_bytes >= required.max(0) as u64
                && (limit <= 0 || existing.capacity_bytes <= limit as u64);
            if fits && existing.parameters == parameters {
                return Ok((&existing).into());
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
                Ok((&r).into())
            }
            Created::Existing(r) => Ok((&r).into()),
        }
    }

    /// Makes a volume's directory on the share `class` names: mounts the share's
    /// directory for volumes with the provisioner Secret (unmounted again before the
    /// call returns), makes `subDir` (the volume's name by default) below it, and
    /// answers an id and a context from which every later call finds it. The share key
    /// plays no part: the share's server checks the credentials.
    fn create_named(
        &self,
        class: &Class,
        req: &CreateRequest<'_>,
        capacity: u64,
    ) -> Result<NewVolume, VolumeError> {
        let kind = class.remote.kind();
        let (mut client, _view) = remote::split_flags(kind, req.mount_flags).map_err(|why| {
            VolumeError::InvalidArgument(format!("volume_capabilities[0].mount.mount_flags: {why}"))
        })?;
        client.extend(class.client.iter().cloned());
        let creds = Credentials::of(kind, &req.secrets.0, &client, Role::Provisioner)
            .map_err(VolumeError::InvalidArgument)?;
        let dir = class
            .sub_dir(req.name, &req.parameters)
            .map_err(VolumeError::InvalidArgument)?;
        let _guard = self.guards.acquire(req.name, "CreateVolume")?;
        let base = Location {
            remote: class.remote.clone(),
            dir: class.base.clone(),
        };
        let (attached, below) = self.mount_class(class, &base, (&client, &creds), req.deadline)?;
        let native = req.parameters.get(VIEW_PARAMETER).map(String::as_str) != Some("fuse");
        let made = made::make(
            &attached.path,
            kind,
            &below,
            &dir,
            &Want {
                native,
                group: remote::group_of(&class.remote, &class.base.join(&dir)),
                mount_permissions: class.mount_permissions,
                pool: class.pool.as_deref(),
                capacity_bytes: capacity,
            },
        )?;
        drop(attached);
        let volume = MadeVolume {
            remote: class.remote.clone(),
            base: class.base.clone(),
            dir,
            on_delete: class.on_delete,
            traits: made.traits,
        };
        let at = volume.location().describe();
        match &made.capacity {
            Ok(()) => {
                tracing::info!(volume_id = %volume.id(), share = %at, capacity_bytes = capacity, "volume created; capacity enforced by a CephFS quota")
            }
            Err(why) => {
                tracing::info!(volume_id = %volume.id(), share = %at, capacity_bytes = capacity, %why, "volume created; capacity is advisory")
            }
        }
        let not_native = match (native, &made.not_native) {
            (true, why) => why.as_deref(),
            (false, _) => None,
        };
        Ok(NewVolume {
            id: volume.id(),
            capacity_bytes: capacity,
            context: volume.context(not_native),
        })
    }

    /// Mounts the class's directory `base` for a CreateVolume; and where below it the
    /// volume is made. A CephFS subvolume group is the driver's to make, as ceph-csi
    /// makes it before a class's first volume (internal/cephfs/core/volume.go,
    /// subVolumeClient's `CreateVolume`): where it is not there yet, the file system's
    /// root is mounted and the group made below it.
    fn mount_class(
        &self,
        class: &Class,
        base: &Location,
        (client, creds): (&ClientOptions, &Credentials),
        deadline: Option<Duration>,
    ) -> Result<(Attached, SubPath), VolumeError> {
        let started = std::time::Instant::now();
        match self.mount(base, client, creds, deadline) {
            Err(VolumeError::NotFound(why)) if class.makes_base => {
                let root = Location {
                    remote: class.remote.clone(),
                    dir: SubPath::default(),
                };
                tracing::info!(share = %base.describe(), %why, "the class's subvolume group is not there: made, as ceph-csi makes it");
                // Within what is left of the call's deadline, not a second one.
                let left = deadline.map(|d| d.saturating_sub(started.elapsed()));
                let attached = self.mount(&root, client, creds, left)?;
                Ok((attached, class.base.clone()))
            }
            other => Ok((other?, SubPath::default())),
        }
    }

    /// Mounts `loc` for this call in the driver's work directory.
    fn mount(
        &self,
        loc: &Location,
        client: &ClientOptions,
        creds: &Credentials,
        deadline: Option<Duration>,
    ) -> Result<Attached, VolumeError> {
        let within = share_wait(deadline, self.remotes.timeout);
        let fd = remote::mount(loc, client, creds, &self.remotes, within, ())?;
        Ok(Attached::new(&fd, &self.remotes.work_dir)?)
    }

    /// Deletes a volume. An unknown volume is already deleted: OK. A volume the
    /// driver made on a named share is removed, archived or kept as its `onDelete`
    /// says, on the share mounted for the call with the provisioner Secret; any other
    /// id (a static PV's handle) names nothing the driver made, and nothing is deleted.
    ///
    /// # Errors
    /// `FailedPrecondition` while the volume is staged or published on this node; a
    /// missing or wrong share key; what mounting a named share answered.
    pub fn delete_volume(
        &self,
        id: &str,
        secrets: &Secrets,
        deadline: Option<Duration>,
    ) -> Result<(), VolumeError> {
        if let Some(made) = MadeVolume::from_id(id) {
            let made = made.map_err(VolumeError::InvalidArgument)?;
            return self.delete_named(id, &made, secrets, deadline);
        }
        let Ok(id) = VolumeId::parse(id) else {
            tracing::info!(volume_id = %id, "DeleteVolume of a volume the driver did not make (a static PV's handle): nothing is deleted");
            return Ok(());
        };
        authorize(&self.key, secrets.share_key(), SecretUse::Provisioner)?;
        let _guard = self.guards.acquire(id.as_str(), "DeleteVolume")?;
        if let Some(where_) = self.in_use(id.as_str()) {
            return Err(where_);
        }
        self.share.delete(&id)?;
        tracing::info!(volume_id = %id, "volume deleted");
        Ok(())
    }

    /// `FailedPrecondition` where the volume is staged or published by this process.
    fn in_use(&self, id: &str) -> Option<VolumeError> {
        let where_ = self.node.as_ref()?.in_use(id)?;
        Some(VolumeError::FailedPrecondition(format!(
            "volume {id} is still in use: {where_}"
        )))
    }

    fn delete_named(
        &self,
        id: &str,
        made: &MadeVolume,
        secrets: &Secrets,
        deadline: Option<Duration>,
    ) -> Result<(), VolumeError> {
        let _guard = self.guards.acquire(id, "DeleteVolume")?;
        if let Some(e) = self.in_use(id) {
            return Err(e);
        }
        let at = made.location().describe();
        if made.on_delete == OnDelete::Retain {
            tracing::info!(volume_id = %id, share = %at, "volume deleted; its directory is kept (onDelete: retain)");
            return Ok(());
        }
        let kind = made.remote.kind();
        let client = secret_mount_options(kind, secrets)?;
        let creds = Credentials::of(kind, &secrets.0, &client, Role::Provisioner)
            .map_err(VolumeError::InvalidArgument)?;
        let base = Location {
            remote: made.remote.clone(),
            dir: made.base.clone(),
        };
        let attached = self.mount(&base, &client, &creds, deadline)?;
        made::remove(&attached.path, &made.dir, made.on_delete, made.traits)?;
        tracing::info!(volume_id = %id, share = %at, on_delete = made.on_delete.name(), "volume deleted");
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
    /// node then applies it (NodeExpandVolume). Repeating it is OK. A volume on a
    /// named share is grown here and needs nothing of the node: its CephFS quota is
    /// set on the share mounted for the call with the controller-expand Secret; on SMB
    /// and NFS capacity is advisory, and the new size is the PV's.
    ///
    /// # Errors
    /// `InvalidArgument` for an empty or inverted range or a missing key,
    /// `PermissionDenied` for a wrong key, `NotFound`, `OutOfRange` for a shrink.
    pub fn expand_volume(
        &self,
        id: &str,
        required: i64,
        limit: i64,
        secrets: &Secrets,
        deadline: Option<Duration>,
    ) -> Result<Expanded, VolumeError> {
        if required <= 0 && limit <= 0 {
            return Err(VolumeError::InvalidArgument(
                "capacity_range: required_bytes or limit_bytes must be set".into(),
            ));
        }
        // The range is checked as for CreateVolume; the new size is required_bytes,
        // or limit_bytes when only that is set.
        pick_capacity(required, limit)?;
        let new = (if required > 0 { required } else { limit }) as u64;
        if let Some(made) = MadeVolume::from_id(id) {
            let made = made.map_err(VolumeError::InvalidArgument)?;
            return self.expand_named(id, &made, new, secrets, deadline);
        }
        let id = VolumeId::parse(id).map_err(|why| {
            VolumeError::NotFound(format!("volume {id:?} does not exist: its id {why}"))
        })?;
        authorize(&self.key, secrets.share_key(), SecretUse::ControllerExpand)?;
        let _guard = self.guards.acquire(id.as_str(), "ControllerExpandVolume")?;
        let rec = self.get(&id)?;
        if new < rec.capacity_bytes {
            return Err(VolumeError::OutOfRange(format!(
                "capacity_range: volume {id} has {} bytes; shrinking it to {new} is not supported",
                rec.capacity_bytes
            )));
        }
        if new > rec.capacity_bytes {
            self.share.set_capacity(&id, new)?;
            tracing::info!(volume_id = %id, from = rec.capacity_bytes, to = new, "capacity recorded");
        }
        Ok(Expanded {
            bytes: new,
            node_expansion_required: true,
        })
    }

    fn expand_named(
        &self,
        id: &str,
        made: &MadeVolume,
        bytes: u64,
        secrets: &Secrets,
        deadline: Option<Duration>,
    ) -> Result<Expanded, VolumeError> {
        let done = Expanded {
            bytes,
            node_expansion_required: false,
        };
        let kind = made.remote.kind();
        if kind != remote::Kind::Cephfs {
            tracing::info!(volume_id = %id, capacity_bytes = bytes, "capacity is advisory on a {} share: the new size is the PV's", kind.name());
            return Ok(done);
        }
        let client = secret_mount_options(kind, secrets)?;
        let creds = Credentials::of(kind, &secrets.0, &client, Role::ControllerExpand)
            .map_err(VolumeError::InvalidArgument)?;
        let _guard = self.guards.acquire(id, "ControllerExpandVolume")?;
        let base = Location {
            remote: made.remote.clone(),
            dir: made.base.clone(),
        };
        let attached = self.mount(&base, &client, &creds, deadline)?;
        made::limit(&attached.path, &made.dir, bytes)?;
        tracing::info!(volume_id = %id, capacity_bytes = bytes, "CephFS quota set");
        Ok(done)
    }

    /// Bytes the share can still give.
    ///
    /// # Errors
    /// `Internal` if the share cannot be read.
    pub fn available_capacity(&self) -> Result<u64, VolumeError> {
        Ok(self.share.available_bytes()?)
    }
}

/// What ControllerExpandVolume did: the volume's new size, and whether each node must
/// apply it (NodeExpandVolume).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expanded {
    pub bytes: u64,
    pub node_expansion_required: bool,
}

/// The kernel client's options of a Secret's `mountOptions` entry (comma-separated),
/// which DeleteVolume and ControllerExpandVolume mount a share with: they carry no
/// capability, so csi-driver-smb and csi-driver-nfs take the options their share
/// needs from there (pkg/smb/controllerserver.go `getMountOptions`, pkg/nfs
/// `getVolumeCapabilityFromSecret`). A view's options in it mean nothing here.
///
/// # Errors
/// `InvalidArgument` for an option that is neither a view's nor the client's.
fn secret_mount_options(
    kind: remote::Kind,
    secrets: &Secrets,
) -> Result<ClientOptions, VolumeError> {
    let Some((_, options)) = secrets
        .0
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("mountOptions"))
    else {
        return Ok(Vec::new());
    };
    remote::split_flags(kind, std::slice::from_ref(options))
        .map(|(client, _view)| client)
        .map_err(|why| VolumeError::InvalidArgument(format!("secrets: mountOptions: {why}")))
}

/// Checks the `view` parameter.
///
/// # Errors
/// `InvalidArgument` for a value but `native` or `fuse`.
fn check_view(parameters: &BTreeMap<String, String>) -> Result<(), VolumeError> {
    match parameters.get(VIEW_PARAMETER).map(String::as_str) {
        None | Some("native" | "fuse") => Ok(()),
        Some(v) => Err(VolumeError::InvalidArgument(format!(
            "parameters: {VIEW_PARAMETER}: {v:?} is not \"native\" or \"fuse\""
        ))),
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
