//! The Controller service.

use std::collections::BTreeMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};
use tracing::info_span;

use super::pb::controller_service_capability::rpc::Type as RpcType;
use super::validate::{self, CapabilityError};
use super::{blocking, pb};
use crate::share::VolumeRecord;
use crate::share::key::SECRET_NAME;
use crate::volume::controller::Controller;

pub struct ControllerService {
    pub controller: Arc<Controller>,
}

fn volume(r: &VolumeRecord) -> pb::Volume {
    pb::Volume {
        capacity_bytes: i64::try_from(r.capacity_bytes).unwrap_or(i64::MAX),
        volume_id: r.id.to_string(),
        ..Default::default()
    }
}

fn capabilities(caps: &[pb::VolumeCapability]) -> Result<(), CapabilityError> {
    if caps.is_empty() {
        return Err(CapabilityError::Invalid(Status::invalid_argument(
            "volume_capabilities missing in request",
        )));
    }
    for (i, c) in caps.iter().enumerate() {
        validate::capability(Some(c), &format!("volume_capabilities[{i}]"))?;
    }
    Ok(())
}

#[tonic::async_trait]
impl pb::controller_server::Controller for ControllerService {
    /// Idempotent by name: a repeat with a compatible capacity range and the same
    /// parameters returns the same volume; an incompatible one is ALREADY_EXISTS.
    async fn create_volume(
        &self,
        req: Request<pb::CreateVolumeRequest>,
    ) -> Result<Response<pb::CreateVolumeResponse>, Status> {
        let r = req.into_inner();
        if r.name.is_empty() {
            return Err(Status::invalid_argument("name missing in request"));
        }
        let id = validate::volume_id(&r.name, "name")?;
        capabilities(&r.volume_capabilities).map_err(CapabilityError::into_status)?;
        if r.volume_content_source.is_some() {
            return Err(Status::invalid_argument(
                "volume_content_source: creating volumes from snapshots or other volumes is not supported",
            ));
        }
        let (required, limit) = r
            .capacity_range
            .map_or((0, 0), |c| (c.required_bytes, c.limit_bytes));
        let parameters: BTreeMap<String, String> = r.parameters.into_iter().collect();
        let secret = r.secrets.get(SECRET_NAME).cloned();
        let c = Arc::clone(&self.controller);
        let span = info_span!("CreateVolume", volume_id = %id);
        let rec = blocking(span, move || {
            c.create_volume(id, &r.name, required, limit, parameters, secret.as_deref())
        })
        .await?;
        Ok(Response::new(pb::CreateVolumeResponse {
            volume: Some(volume(&rec)),
        }))
    }

    /// Deleting an unknown volume is OK (it is already gone).
    async fn delete_volume(
        &self,
        req: Request<pb::DeleteVolumeRequest>,
    ) -> Result<Response<pb::DeleteVolumeResponse>, Status> {
        let id = validate::volume_id(&req.get_ref().volume_id, "volume_id")?;
        let secret = req.get_ref().secrets.get(SECRET_NAME).cloned();
        let c = Arc::clone(&self.controller);
        let span = info_span!("DeleteVolume", volume_id = %id);
        blocking(span, move || c.delete_volume(&id, secret.as_deref())).await?;
        Ok(Response::new(pb::DeleteVolumeResponse {}))
    }

    /// Confirms every mount capability; block access or another fs_type is answered
    /// with no confirmation and a message, as the spec asks.
    async fn validate_volume_capabilities(
        &self,
        req: Request<pb::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<pb::ValidateVolumeCapabilitiesResponse>, Status> {
        let r = req.into_inner();
        let id = validate::volume_id(&r.volume_id, "volume_id")?;
        let checked = capabilities(&r.volume_capabilities);
        if let Err(CapabilityError::Invalid(s)) = checked {
            return Err(s);
        }
        let c = Arc::clone(&self.controller);
        let span = info_span!("ValidateVolumeCapabilities", volume_id = %id);
        blocking(span, move || c.get(&id)).await?;
        let response = match checked {
            Ok(()) => pb::ValidateVolumeCapabilitiesResponse {
                confirmed: Some(pb::validate_volume_capabilities_response::Confirmed {
                    volume_context: r.volume_context,
                    volume_capabilities: r.volume_capabilities,
                    parameters: r.parameters,
                    mutable_parameters: r.mutable_parameters,
                }),
                message: String::new(),
            },
            Err(CapabilityError::Unsupported(m)) => pb::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: m,
            },
            Err(CapabilityError::Invalid(s)) => return Err(s),
        };
        Ok(Response::new(response))
    }

    async fn list_volumes(
        &self,
        req: Request<pb::ListVolumesRequest>,
    ) -> Result<Response<pb::ListVolumesResponse>, Status> {
        let r = req.into_inner();
        let c = Arc::clone(&self.controller);
        let page = blocking(info_span!("ListVolumes"), move || {
            c.list(r.max_entries, &r.starting_token)
        })
        .await?;
        Ok(Response::new(pb::ListVolumesResponse {
            entries: page
                .volumes
                .iter()
                .map(|v| pb::list_volumes_response::Entry {
                    volume: Some(volume(v)),
                    status: None,
                })
                .collect(),
            next_token: page.next_token,
        }))
    }

    async fn get_capacity(
        &self,
        _req: Request<pb::GetCapacityRequest>,
    ) -> Result<Response<pb::GetCapacityResponse>, Status> {
        let c = Arc::clone(&self.controller);
        let available = blocking(info_span!("GetCapacity"), move || c.available_capacity()).await?;
        Ok(Response::new(pb::GetCapacityResponse {
            available_capacity: i64::try_from(available).unwrap_or(i64::MAX),
            maximum_volume_size: None,
            minimum_volume_size: None,
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _req: Request<pb::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<pb::ControllerGetCapabilitiesResponse>, Status> {
        let rpc = |t: RpcType| pb::ControllerServiceCapability {
            r#type: Some(pb::controller_service_capability::Type::Rpc(
                pb::controller_service_capability::Rpc { r#type: t as i32 },
            )),
        };
        Ok(Response::new(pb::ControllerGetCapabilitiesResponse {
            capabilities: vec![
                rpc(RpcType::CreateDeleteVolume),
                rpc(RpcType::ListVolumes),
                rpc(RpcType::GetCapacity),
                rpc(RpcType::SingleNodeMultiWriter),
                rpc(RpcType::ExpandVolume),
            ],
        }))
    }

    /// Grows the recorded capacity (never shrinks: OUT_OF_RANGE); the node applies it.
    /// A repeat is OK.
    async fn controller_expand_volume(
        &self,
        req: Request<pb::ControllerExpandVolumeRequest>,
    ) -> Result<Response<pb::ControllerExpandVolumeResponse>, Status> {
        let r = req.get_ref();
        let id = validate::volume_id(&r.volume_id, "volume_id")?;
        let range = r
            .capacity_range
            .ok_or_else(|| Status::invalid_argument("capacity_range missing in request"))?;
        let secret = r.secrets.get(SECRET_NAME).cloned();
        let c = Arc::clone(&self.controller);
        let span =
            info_span!("ControllerExpandVolume", volume_id = %id, required = range.required_bytes);
        let bytes = blocking(span, move || {
            c.expand_volume(
                &id,
                range.required_bytes,
                range.limit_bytes,
                secret.as_deref(),
            )
        })
        .await?;
        Ok(Response::new(pb::ControllerExpandVolumeResponse {
            capacity_bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
            node_expansion_required: true,
        }))
    }
}
