//! The CSI protocol adapter: the only module that sees tonic or the generated types.
//! Handlers validate, call the `volume` domain on a blocking thread, and map errors
//! once (`status.rs`). Each request gets one span with chosen fields; requests are
//! never logged whole (prost's Debug would print the `secrets` maps).

pub mod authority;
pub mod controller;
pub mod identity;
pub mod metrics;
pub mod node;
pub mod server;
pub mod status;
pub mod validate;

/// Types generated from proto/csi.proto (package `csi.v1`).
#[allow(clippy::all, clippy::pedantic, missing_docs, unreachable_pub)]
pub mod pb {
    tonic::include_proto!("csi.v1");
}

use tonic::Status;
use tracing::Span;

use crate::volume::VolumeError;

/// Runs a blocking domain operation inside `span` and maps its outcome; a panic in
/// the operation becomes INTERNAL and does not take the server down.
async fn blocking<T, F>(span: Span, op: F) -> Result<T, Status>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, VolumeError> + Send + 'static,
{
    let inner = span.clone();
    let joined = tokio::task::spawn_blocking(move || inner.in_scope(op)).await;
    let _enter = span.enter();
    match joined {
        Ok(Ok(v)) => {
            tracing::debug!("ok");
            Ok(v)
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "failed");
            Err(status::to_status(e))
        }
        Err(join) => {
            tracing::error!(error = %join, "operation panicked");
            Err(Status::internal(format!(
                "the operation failed unexpectedly: {join}"
            )))
        }
    }
}
