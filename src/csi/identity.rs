//! The Identity service.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::pb;
use super::pb::plugin_capability::service::Type as ServiceType;
use crate::volume::node::Node;

pub struct IdentityService {
    pub name: String,
    pub node: Arc<Node>,
}

#[tonic::async_trait]
impl pb::identity_server::Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _req: Request<pb::GetPluginInfoRequest>,
    ) -> Result<Response<pb::GetPluginInfoResponse>, Status> {
        Ok(Response::new(pb::GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _req: Request<pb::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<pb::GetPluginCapabilitiesResponse>, Status> {
        let service = |t: ServiceType| pb::PluginCapability {
            r#type: Some(pb::plugin_capability::Type::Service(
                pb::plugin_capability::Service { r#type: t as i32 },
            )),
        };
        // Volumes grow while published: the node applies a new quota to the live volume.
        let online = pb::PluginCapability {
            r#type: Some(pb::plugin_capability::Type::VolumeExpansion(
                pb::plugin_capability::VolumeExpansion {
                    r#type: pb::plugin_capability::volume_expansion::Type::Online as i32,
                },
            )),
        };
        Ok(Response::new(pb::GetPluginCapabilitiesResponse {
            capabilities: vec![service(ServiceType::ControllerService), online],
        }))
    }

    /// Ready when FUSE is usable and the share is reachable; otherwise
    /// FAILED_PRECONDITION with the reason (the CSI "unhealthy" answer).
    async fn probe(
        &self,
        _req: Request<pb::ProbeRequest>,
    ) -> Result<Response<pb::ProbeResponse>, Status> {
        let node = Arc::clone(&self.node);
        let ready = tokio::task::spawn_blocking(move || node.ready())
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
        match ready {
            Ok(()) => {
                tracing::trace!("probe: ready");
                Ok(Response::new(pb::ProbeResponse { ready: Some(true) }))
            }
            Err(why) => {
                tracing::warn!(%why, "probe: not ready");
                Err(Status::failed_precondition(why))
            }
        }
    }
}
