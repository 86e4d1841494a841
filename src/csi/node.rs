//! The Node service.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use tonic::{Request, Response, Status};
use tracing::info_span;

use super::pb::node_service_capability::rpc::Type as RpcType;
use super::validate::{self, CapabilityError};
use super::{blocking, deadline, pb, secrets};
use crate::share::VolumeHandle;
use crate::share::key::SECRET_NAME;
use crate::share::remote;
use crate::volume::Lifecycle;
use crate::volume::node::{Node, PublishRequest, StageRequest, Usage};
use crate::volume::secrets::Payload;

/// The topology key NodeGetInfo reports (informational: volumes carry no
/// accessibility constraints, every node that mounts the share can serve them).
pub const TOPOLOGY_KEY: &str = "topology.mountgroup.csi.io/node";

pub struct NodeService {
    pub node: Arc<Node>,
}

fn usage(u: Usage, unit: pb::volume_usage::Unit) -> pb::VolumeUsage {
    let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    pb::VolumeUsage {
        available: i(u.available),
        total: i(u.total),
        used: i(u.used),
        unit: unit as i32,
    }
}

#[tonic::async_trait]
impl pb::node_server::Node for NodeService {
    /// Repeating a stage with the same path is OK; another path is ALREADY_EXISTS.
    async fn node_stage_volume(
        &self,
        req: Request<pb::NodeStageVolumeRequest>,
    ) -> Result<Response<pb::NodeStageVolumeResponse>, Status> {
        let deadline = deadline(&req);
        let r = req.get_ref();
        let id = VolumeHandle::new(validate::handle(&r.volume_id, "volume_id")?);
        let staging = validate::abs_path(&r.staging_target_path, "staging_target_path")?;
        let share = remote::attributes(&r.volume_context).map_err(Status::invalid_argument)?;
        let kind = share.as_ref().map(|a| a.location.remote.kind());
        let cap = validate::capability(r.volume_capability.as_ref(), "volume_capability", kind)
            .map_err(CapabilityError::into_status)?;
        let secrets = secrets(&r.secrets);
        let node = Arc::clone(&self.node);
        let span = info_span!("NodeStageVolume", volume_id = %id, staging = %staging.display());
        blocking(span, move || {
            node.stage(StageRequest {
                volume_id: &id,
                staging_path: &staging,
                capability: &cap,
                secrets: &secrets,
                share,
                deadline,
            })
        })
        .await?;
        Ok(Response::new(pb::NodeStageVolumeResponse {}))
    }

    /// Unstaging a volume that is not staged is OK.
    async fn node_unstage_volume(
        &self,
        req: Request<pb::NodeUnstageVolumeRequest>,
    ) -> Result<Response<pb::NodeUnstageVolumeResponse>, Status> {
        let r = req.get_ref();
        let id = VolumeHandle::new(validate::handle(&r.volume_id, "volume_id")?);
        let staging = validate::abs_path(&r.staging_target_path, "staging_target_path")?;
        let node = Arc::clone(&self.node);
        let span = info_span!("NodeUnstageVolume", volume_id = %id, staging = %staging.display());
        blocking(span, move || node.unstage(&id, &staging)).await?;
        Ok(Response::new(pb::NodeUnstageVolumeResponse {}))
    }

    /// Publishing an already published target with the same arguments is OK; with
    /// different arguments ALREADY_EXISTS. Each target gets its own view, so two pods
    /// with different fsGroups each see their own group.
    async fn node_publish_volume(
        &self,
        req: Request<pb::NodePublishVolumeRequest>,
    ) -> Result<Response<pb::NodePublishVolumeResponse>, Status> {
        let r = req.get_ref();
        let volume_id = VolumeHandle::new(validate::handle(&r.volume_id, "volume_id")?);
        let target_path = validate::abs_path(&r.target_path, "target_path")?;
        let lifecycle = validate::lifecycle(&r.volume_context)?;
        let kind = match lifecycle {
            Lifecycle::Persistent => remote::attributes(&r.volume_context)
                .map_err(Status::invalid_argument)?
                .map(|a| a.location.remote.kind()),
            Lifecycle::Ephemeral(_) => None,
        };
        // Inline volumes are never staged: kubelet sends no staging path for them.
        let staging_path = match lifecycle {
            Lifecycle::Persistent => {
                validate::abs_path(&r.staging_target_path, "staging_target_path")?
            }
            Lifecycle::Ephemeral(_) => PathBuf::new(),
        };
        let capability =
            validate::capability(r.volume_capability.as_ref(), "volume_capability", kind)
                .map_err(CapabilityError::into_status)?;
        let secrets = Payload(
            r.secrets
                .iter()
                .map(|(k, v)| (PathBuf::from(k), v.as_bytes().to_vec()))
                .collect(),
        );
        let publish = PublishRequest {
            volume_id,
            staging_path,
            target_path,
            capability,
            readonly: r.readonly,
            lifecycle,
            secrets,
            pod: validate::pod(&r.volume_context),
        };
        let node = Arc::clone(&self.node);
        let span = info_span!(
            "NodePublishVolume",
            volume_id = %publish.volume_id,
            target = %publish.target_path.display(),
            group = ?publish.capability.mount_group.map(|g| g.get()),
        );
        blocking(span, move || node.publish(&publish)).await?;
        Ok(Response::new(pb::NodePublishVolumeResponse {}))
    }

    /// Unpublishing a target that is not published is OK.
    async fn node_unpublish_volume(
        &self,
        req: Request<pb::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<pb::NodeUnpublishVolumeResponse>, Status> {
        let r = req.get_ref();
        let id = VolumeHandle::new(validate::handle(&r.volume_id, "volume_id")?);
        let target = validate::abs_path(&r.target_path, "target_path")?;
        let node = Arc::clone(&self.node);
        let span = info_span!("NodeUnpublishVolume", volume_id = %id, target = %target.display());
        blocking(span, move || node.unpublish(&id, &target)).await?;
        Ok(Response::new(pb::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<pb::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<pb::NodeGetVolumeStatsResponse>, Status> {
        let r = req.get_ref();
        let id = VolumeHandle::new(validate::handle(&r.volume_id, "volume_id")?);
        let path = validate::lookup_path(&r.volume_path, "volume_path")?;
        let node = Arc::clone(&self.node);
        let span = info_span!("NodeGetVolumeStats", volume_id = %id, path = %path.display());
        let stats = blocking(span, move || {
            node.stats_within(&id, &path, crate::volume::node::STATS_WAIT)
        })
        .await?;
        // Both units always: kubelet's csi_client.go `NodeGetVolumeStats` refuses an
        // answer without usage before it reads the volume condition.
        Ok(Response::new(pb::NodeGetVolumeStatsResponse {
            usage: vec![
                usage(stats.bytes, pb::volume_usage::Unit::Bytes),
                usage(stats.inodes, pb::volume_usage::Unit::Inodes),
            ],
            volume_condition: Some(pb::VolumeCondition {
                abnormal: stats.abnormal.is_some(),
                message: stats.abnormal.unwrap_or_else(|| "serving".into()),
            }),
        }))
    }

    /// Applies the recorded capacity to the live volume. A repeat is OK.
    async fn node_expand_volume(
        &self,
        req: Request<pb::NodeExpandVolumeRequest>,
    ) -> Result<Response<pb::NodeExpandVolumeResponse>, Status> {
        let r = req.get_ref();
        let id = VolumeHandle::new(validate::handle(&r.volume_id, "volume_id")?);
        let path = validate::lookup_path(&r.volume_path, "volume_path")?;
        let requested = r
            .capacity_range
            .map(|c| {
                if c.required_bytes > 0 {
                    c.required_bytes
                } else {
                    c.limit_bytes
                }
            })
            .filter(|b| *b > 0)
            .map(|b| b as u64);
        let secret = r.secrets.get(SECRET_NAME).cloned();
        let node = Arc::clone(&self.node);
        let span = info_span!("NodeExpandVolume", volume_id = %id, path = %path.display());
        let bytes = blocking(span, move || {
            node.expand(&id, &path, requested, secret.as_deref())
        })
        .await?;
        Ok(Response::new(pb::NodeExpandVolumeResponse {
            capacity_bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
        }))
    }

    async fn node_get_capabilities(
        &self,
        _req: Request<pb::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<pb::NodeGetCapabilitiesResponse>, Status> {
        let rpc = |t: RpcType| pb::NodeServiceCapability {
            r#type: Some(pb::node_service_capability::Type::Rpc(
                pb::node_service_capability::Rpc { r#type: t as i32 },
            )),
        };
        Ok(Response::new(pb::NodeGetCapabilitiesResponse {
            capabilities: vec![
                rpc(RpcType::StageUnstageVolume),
                rpc(RpcType::GetVolumeStats),
                rpc(RpcType::VolumeCondition),
                rpc(RpcType::SingleNodeMultiWriter),
                rpc(RpcType::VolumeMountGroup),
                rpc(RpcType::ExpandVolume),
            ],
        }))
    }

    async fn node_get_info(
        &self,
        _req: Request<pb::NodeGetInfoRequest>,
    ) -> Result<Response<pb::NodeGetInfoResponse>, Status> {
        let id = self.node.node_id().to_string();
        Ok(Response::new(pb::NodeGetInfoResponse {
            node_id: id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: Some(pb::Topology {
                segments: HashMap::from([(TOPOLOGY_KEY.to_string(), id)]),
            }),
        }))
    }
}
