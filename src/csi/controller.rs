//! The Controller service.

use std::collections::BTreeMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};
use tracing::info_span;

use super::pb::controller_service_capability::rpc::Type as RpcType;
use super::validate::{self, CapabilityError};
use super::{blocking, deadline, pb, secrets};
use crate::share::VolumeRecord;
use crate::share::remote::{self, Kind, MadeVolume};
use crate::volume::controller::{Controller, CreateRequest, NewVolume, VIEW_PARAMETER};

pub struct ControllerService {
    pub controller: Arc<Controller>,
}

fn volume(r: &VolumeRecord) -> pb::Volume {
    new_volume(&r.into())
}

fn new_volume(v: &NewVolume) -> pb::Volume {
    pb::Volume {
        capacity_bytes: i64::try_from(v.capacity_bytes).unwrap_or(i64::MAX),
        volume_id: v.id.clone(),
        volume_context: v.context.clone(),
        ..Default::default()
    }
}

/// Checks every capability, its mount flags as a volume on `share` (a named share's
/// kind, `None` for the share root) takes them.
fn capabilities(caps: &[pb::VolumeCapability], share: Option<Kind>) -> Result<(), CapabilityError> {
    if caps.is_empty() {
        return Err(CapabilityError::Invalid(Status::invalid_argument(
            "volume_capabilities missing in request",
        )));
    }
    for (i, c) in caps.iter().enumerate() {
        validate::capability(Some(c), &format!("volume_capabilities[{i}]"), share)?;
    }
    Ok(())
}

/// The kind of named share a class's parameters name, if they name one (a class
/// whose parameters are wrong is told so by CreateVolume itself).
fn class_kind(parameters: &BTreeMap<String, String>) -> Option<Kind> {
    remote::class(parameters, &[VIEW_PARAMETER])
        .ok()
        .flatten()
        .map(|c| c.remote.kind())
}

#[tonic::async_trait]
impl pb::controller_server::Controller for ControllerService {
    /// Idempotent by name: a repeat with a compatible capacity range and the same
    /// parameters returns the same volume; an incompatible one is ALREADY_EXISTS.
    async fn create_volume(
        &self,
        req: Request<pb::CreateVolumeRequest>,
    ) -> Result<Response<pb::CreateVolumeResponse>, Status> {
        let deadline = deadline(&req);
        let r = req.into_inner();
        if r.name.is_empty() {
            return Err(Status::invalid_argument("name missing in request"));
        }
        validate::name(&r.name)?;
        let parameters: BTreeMap<String, String> = r.parameters.into_iter().collect();
        capabilities(&r.volume_capabilities, class_kind(&parameters))
            .map_err(CapabilityError::into_status)?;
        if r.volume_content_source.is_some() {
            return Err(Status::invalid_argument(
                "volume_content_source: creating volumes from snapshots or other volumes is not supported",
            ));
        }
        let (required, limit) = r
            .capacity_range
            .map_or((0, 0), |c| (c.required_bytes, c.limit_bytes));
        let secrets = secrets(&r.secrets);
        let flags: Vec<String> = match r
            .volume_capabilities
            .first()
            .and_then(|c| c.access_type.as_ref())
        {
            Some(pb::volume_capability::AccessType::Mount(m)) => m.mount_flags.clone(),
            _ => Vec::new(),
        };
        let c = Arc::clone(&self.controller);
        let span = info_span!("CreateVolume", name = %r.name);
        let name = r.name;
        let made = blocking(span, move || {
            c.create_volume(CreateRequest {
                name: &name,
                required,
                limit,
                parameters,
                secrets: &secrets,
                mount_flags: &flags,
                deadline,
            })
        })
        .await?;
        Ok(Response::new(pb::CreateVolumeResponse {
            volume: Some(new_volume(&made)),
        }))
    }

    /// Deleting an unknown volume is OK (it is already gone).
    async fn delete_volume(
        &self,
        req: Request<pb::DeleteVolumeRequest>,
    ) -> Result<Response<pb::DeleteVolumeResponse>, Status> {
        let deadline = deadline(&req);
        let id = validate::handle(&req.get_ref().volume_id, "volume_id")?;
        let secrets = secrets(&req.get_ref().secrets);
        let c = Arc::clone(&self.controller);
        let span = info_span!("DeleteVolume", volume_id = %id);
        blocking(span, move || c.delete_volume(&id, &secrets, deadline)).await?;
        Ok(Response::new(pb::DeleteVolumeResponse {}))
    }

    /// Confirms every mount capability; block access or another fs_type is answered
    /// with no confirmation and a message, as the spec asks.
    async fn validate_volume_capabilities(
        &self,
        req: Request<pb::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<pb::ValidateVolumeCapabilitiesResponse>, Status> {
        let r = req.into_inner();
        let id = validate::handle(&r.volume_id, "volume_id")?;
        // A volume on a named share: its id (one the driver made), its context (a
        // static PV's) or its class names the share; the share root's are known here.
        let named = match MadeVolume::from_id(&id) {
            Some(made) => Some(made.map_err(Status::invalid_argument)?.remote.kind()),
            None => remote::attributes(&r.volume_context)
                .map_err(Status::invalid_argument)?
                .map(|a| a.location.remote.kind())
                .or_else(|| class_kind(&r.parameters.clone().into_iter().collect())),
        };
        let checked = capabilities(&r.volume_capabilities, named);
        if let Err(CapabilityError::Invalid(s)) = checked {
            return Err(s);
        }
        if named.is_none() {
            let id = validate::volume_id(&id, "volume_id")
                .map_err(|_| Status::not_found(format!("volume {id:?} does not exist")))?;
            let c = Arc::clone(&self.controller);
            let span = info_span!("ValidateVolumeCapabilities", volume_id = %id);
            blocking(span, move || c.get(&id)).await?;
        }
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
        let deadline = deadline(&req);
        let r = req.get_ref();
        let id = validate::handle(&r.volume_id, "volume_id")?;
        let range = r
            .capacity_range
            .ok_or_else(|| Status::invalid_argument("capacity_range missing in request"))?;
        let secrets = secrets(&r.secrets);
        let c = Arc::clone(&self.controller);
        let span =
            info_span!("ControllerExpandVolume", volume_id = %id, required = range.required_bytes);
        let done = blocking(span, move || {
            c.expand_volume(
                &id,
                range.required_bytes,
                range.limit_bytes,
                &secrets,
                deadline,
            )
        })
        .await?;
        Ok(Response::new(pb::ControllerExpandVolumeResponse {
            capacity_bytes: i64::try_from(done.bytes).unwrap_or(i64::MAX),
            node_expansion_required: done.node_expansion_required,
        }))
    }
}
