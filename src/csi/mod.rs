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

/// The deadline a request's caller set (its `grpc-timeout` header: a number and a unit
/// of `H`, `M`, `S`, `m`, `u` or `n`, gRPC's PROTOCOL-HTTP2), if any: kubelet's calls
/// carry theirs (two minutes for NodeStageVolume, kubernetes pkg/volume/csi
/// `csiTimeout`), the sidecars their `--timeout`.
pub fn deadline<T>(req: &tonic::Request<T>) -> Option<std::time::Duration> {
    let v = req.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    use std::time::Duration;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// A request's `secrets`, for the domain.
pub fn secrets(map: &std::collections::HashMap<String, String>) -> crate::volume::Secrets {
    crate::volume::Secrets(map.clone())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_callers_deadline_is_read_from_its_grpc_timeout() {
        let with = |v: &str| {
            let mut r = tonic::Request::new(());
            r.metadata_mut().insert("grpc-timeout", v.parse().unwrap());
            super::deadline(&r)
        };
        assert_eq!(
            with("119999873u"),
            Some(std::time::Duration::from_micros(119_999_873))
        );
        assert_eq!(with("60S"), Some(std::time::Duration::from_secs(60)));
        assert_eq!(with("2M"), Some(std::time::Duration::from_secs(120)));
        assert_eq!(with("x"), None);
        assert_eq!(super::deadline(&tonic::Request::new(())), None);
    }
}
