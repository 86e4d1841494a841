//! `mountgroup serve`: Identity, Controller and Node on one unix socket, over the
//! driver that `crate::driver` assembles (this file binds, serves and drains).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use super::controller::ControllerService;
use super::identity::IdentityService;
use super::metrics::{Metrics, MetricsLayer, serve_http};
use super::node::NodeService;
use super::pb;
use crate::driver::Driver;
pub use crate::driver::{KubeApi, ServeConfig};

/// Why the server could not start or ended badly.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("--endpoint {0:?}: {1}")]
    Endpoint(String, String),
    #[error("--driver-name {0:?}: {1}")]
    DriverName(String, String),
    #[error("--node-id: {0}")]
    NodeId(String),
    #[error("{0}")]
    Setup(String),
    #[error(transparent)]
    Start(#[from] crate::driver::StartError),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// The socket path of a `unix://` endpoint.
///
/// # Errors
/// A message when it is not an absolute unix socket path.
pub fn endpoint_path(endpoint: &str) -> Result<PathBuf, String> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    if !path.starts_with('/') {
        return Err("must be unix:///absolute/path (or an absolute path)".into());
    }
    Ok(PathBuf::from(path))
}

/// Checks a CSI driver name: at most 63 characters, domain-name style, beginning and
/// ending with an alphanumeric character, with `-`, `.` and alphanumerics between.
///
/// # Errors
/// What is wrong with it.
pub fn validate_driver_name(name: &str) -> Result<(), String> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() > 63 {
        return Err("must be 1 to 63 characters".into());
    }
    if !b[0].is_ascii_alphanumeric() || !b[b.len() - 1].is_ascii_alphanumeric() {
        return Err("must begin and end with a letter or digit".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '.'))
    {
        return Err(format!(
            "contains {c:?}; only letters, digits, '-' and '.' are allowed"
        ));
    }
    Ok(())
}

/// Nothing but a socket (or nothing) is at `path`: a file there is never replaced.
fn not_a_foreign_file(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => Ok(()),
        Ok(_) => Err("exists and is not a socket".into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// Removes a socket file left by a previous run; anything else at the path is an error.
fn replace_stale_socket(path: &Path) -> Result<(), String> {
    not_a_foreign_file(path)?;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.to_string()),
        _ => Ok(()),
    }
}

/// Binds a socket at `path` and returns it with the identity of the file it made.
///
/// The socket is bound under a name of this process's own beside `path`, its
/// identity read there, and only then renamed onto `path`: from the moment another
/// process can see the path, this one knows which file is its own (binding at `path`
/// and reading it after left a window in which a successor's socket could be taken
/// for it, and deleted at shutdown). The rename also replaces a stale socket without
/// a moment in which the path is missing.
fn bind_in_place(path: &Path) -> Result<(UnixListener, Option<(u64, u64)>), String> {
    let name = path
        .file_name()
        .ok_or_else(|| "names no file".to_string())?
        .to_string_lossy();
    let staged = path.with_file_name(format!(".{name}.{}.binding", std::process::id()));
    replace_stale_socket(&staged)?;
    let listener = UnixListener::bind(&staged).map_err(|e| e.to_string())?;
    let bound = socket_identity(&staged);
    let placed = not_a_foreign_file(path).and_then(|()| {
        std::fs::rename(&staged, path).map_err(|e| format!("renaming {}: {e}", staged.display()))
    });
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&staged);
        return Err(e);
    }
    Ok((listener, bound))
}

/// The device and inode of the socket file at `path`, if there is one.
fn socket_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// SIGTERM and SIGINT, caught from this call on (`tokio::signal::unix::signal` installs
/// the handler when it is called, not when its stream is first polled: a signal
/// between the socket's bind and the server's start would otherwise kill the process,
/// leaving its socket behind); the future ends at the first.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: draining in-flight calls"),
            _ = int.recv() => tracing::info!("SIGINT: draining in-flight calls"),
        }
    })
}

/// Serves until SIGTERM or SIGINT, then lets in-flight calls finish and returns.
/// Published views are processes of their own and keep serving.
///
/// # Errors
/// [`ServeError`] naming the flag or step that failed.
pub async fn serve(cfg: ServeConfig) -> Result<(), ServeError> {
    validate_driver_name(&cfg.driver_name)
        .map_err(|e| ServeError::DriverName(cfg.driver_name.clone(), e))?;
    if cfg.node_id.is_empty() || cfg.node_id.len() > 128 {
        return Err(ServeError::NodeId("must be 1 to 128 bytes".into()));
    }
    let socket =
        endpoint_path(&cfg.endpoint).map_err(|e| ServeError::Endpoint(cfg.endpoint.clone(), e))?;
    let opened = crate::driver::Opened::open(&cfg).await?;
    // What can still refuse is checked before anything with an effect starts: a keeper
    // started below takes the node's views over, and recovery restarts dead ones; a
    // driver that then failed on its endpoint or metrics address would leave them with
    // a process about to exit. The endpoint is bound only below (the driver this one
    // replaces may serve on it until it has drained).
    if let Some(parent) = socket.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| ServeError::Endpoint(cfg.endpoint.clone(), e.to_string()))?;
    }
    not_a_foreign_file(&socket).map_err(|e| ServeError::Endpoint(cfg.endpoint.clone(), e))?;
    let metrics_listener = match cfg.metrics_addr {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| ServeError::Setup(format!("--metrics-addr {addr}: {e}")))?,
        ),
        None => None,
    };
    let Driver {
        node,
        controller,
        kernel,
        capacity_enforced,
        state_lock: _state_lock,
    } = opened.start(&cfg).await?;
    let setup = |what: &str, e: &dyn std::fmt::Display| ServeError::Setup(format!("{what}: {e}"));
    let metrics = Metrics::new(Arc::clone(&node), capacity_enforced, kernel);
    if let Some(listener) = metrics_listener {
        serve_http(listener, Arc::clone(&metrics));
    }
    let shutdown = shutdown_signal().map_err(|e| setup("SIGTERM and SIGINT handlers", &e))?;
    let (listener, bound) =
        bind_in_place(&socket).map_err(|e| ServeError::Endpoint(cfg.endpoint.clone(), e))?;
    tracing::info!(
        endpoint = %socket.display(),
        driver = %cfg.driver_name,
        node_id = %node.node_id(),
        share = %cfg.share_root.display(),
        state = %cfg.state_dir.display(),
        "serving CSI"
    );
    let result = tonic::transport::Server::builder()
        .layer(MetricsLayer(metrics))
        .add_service(pb::identity_server::IdentityServer::new(IdentityService {
            name: cfg.driver_name.clone(),
            node: Arc::clone(&node),
        }))
        .add_service(pb::controller_server::ControllerServer::new(
            ControllerService { controller },
        ))
        .add_service(pb::node_server::NodeServer::new(NodeService { node }))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await;
    // Only the socket this process bound: another driver may have replaced it since
    // (the same mistake as node-driver-registrar's removeRegSocket, which deletes the
    // path whoever made it, would leave kubelet without the driver).
    if bound.is_some() && socket_identity(&socket) == bound {
        let _ = std::fs::remove_file(&socket);
    } else {
        tracing::info!(endpoint = %socket.display(), "the socket is another process's now; leaving it");
    }
    tracing::info!("stopped");
    Ok(result?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names() {
        assert!(validate_driver_name("mountgroup.csi.io").is_ok());
        assert!(validate_driver_name("a").is_ok());
        assert!(validate_driver_name("").is_err());
        assert!(validate_driver_name(".x").is_err());
        assert!(validate_driver_name("x_y").is_err());
        assert!(validate_driver_name(&"a".repeat(64)).is_err());
    }

    #[test]
    fn endpoints() {
        assert_eq!(
            endpoint_path("unix:///run/csi.sock").unwrap(),
            PathBuf::from("/run/csi.sock")
        );
        assert_eq!(
            endpoint_path("unix:/run/csi.sock").unwrap(),
            PathBuf::from("/run/csi.sock")
        );
        assert_eq!(
            endpoint_path("/run/csi.sock").unwrap(),
            PathBuf::from("/run/csi.sock")
        );
        assert!(endpoint_path("tcp://0.0.0.0:10000").is_err());
        assert!(endpoint_path("unix://relative").is_err());
    }
}
