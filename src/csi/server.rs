//! `mountgroup serve`: Identity, Controller and Node on one unix socket.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use super::controller::ControllerService;
use super::identity::IdentityService;
use super::metrics::{Metrics, MetricsLayer, serve_http};
use super::node::NodeService;
use super::pb;
use crate::share::key::ShareKey;
use crate::share::{CapacityMode, LocalShare, Share, ShareInit};
use crate::transport::probe::KernelFuse;
use crate::volume::VolumeError;
use crate::volume::controller::Controller;
use crate::volume::guard::OpGuards;
use crate::volume::node::Node;

/// Everything `serve` needs, each with a default good for a local run.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// `unix:///path/csi.sock` (or a plain absolute path).
    pub endpoint: String,
    pub node_id: String,
    pub driver_name: String,
    /// Where the node state and view logs live.
    pub state_dir: PathBuf,
    /// The share: a directory on this node.
    pub share_root: PathBuf,
    /// Whether a share root without the share's marker may be laid out as a new share.
    pub share_init: ShareInit,
    /// The binary that serves views (`mountgroup mount`); this one by default.
    pub view_binary: PathBuf,
    /// The keeper that runs the views (`mountgroup keeper`); without one, a keeper in
    /// this process runs them (`volume::keeper::start_embedded`).
    pub keeper_socket: Option<PathBuf>,
    /// The share key file (created with a random key if absent); `None`: no key.
    pub share_key_file: Option<PathBuf>,
    /// Where secret views keep their tmpfs (memory; never the state directory).
    pub runtime_dir: PathBuf,
    /// Where to serve Prometheus metrics, if anywhere.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// The Kubernetes API, asked whether a pod runs in a user namespace.
    pub kube: KubeApi,
}

/// Which Kubernetes API server the node plugin asks about pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubeApi {
    /// The cluster's, where this runs in one (`KUBERNETES_SERVICE_HOST`); none
    /// elsewhere.
    InCluster,
    /// None: no pod runs in a user namespace of its own here.
    None,
    /// The one at `host:port`, trusted through `ca_file`, asked with `token_file`.
    At {
        host: String,
        port: u16,
        token_file: PathBuf,
        ca_file: PathBuf,
    },
}

/// A lookup that always fails, for an API server that cannot be used (its reason).
struct Unusable(String);

impl crate::volume::serve::PodLookup for Unusable {
    fn pod(&self, _: Option<&crate::volume::serve::PodRef>) -> crate::volume::serve::Pod {
        crate::volume::serve::Pod::Unknown(self.0.clone())
    }
}

/// The pod lookup `kube` names. One that cannot be set up answers every lookup with
/// its reason, so native volumes are served by FUSE views, which every pod can use.
fn pod_lookup(kube: &KubeApi) -> Arc<dyn crate::volume::serve::PodLookup> {
    use crate::kube::ApiServer;
    let handle = tokio::runtime::Handle::current();
    let made = match kube {
        KubeApi::None => None,
        KubeApi::InCluster => ApiServer::in_cluster(handle),
        KubeApi::At {
            host,
            port,
            token_file,
            ca_file,
        } => Some(ApiServer::new(host, *port, token_file, ca_file, handle)),
    };
    match made {
        None => {
            tracing::info!(
                "no Kubernetes API server: no pod runs in a user namespace here, so native volumes are native views"
            );
            Arc::new(crate::volume::serve::NoApiServer)
        }
        Some(Ok(api)) => {
            tracing::info!(
                "the Kubernetes API server tells which pods run in user namespaces (their native volumes are FUSE views)"
            );
            Arc::new(api)
        }
        Some(Err(why)) => {
            tracing::warn!(%why, "the Kubernetes API server cannot be used: native volumes are served by FUSE views");
            Arc::new(Unusable(why))
        }
    }
}

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

/// Asks the kernel what its FUSE offers views (a throwaway mount under
/// `runtime_dir`) and says whether pods in user namespaces can use them. Where the
/// kernel lacks support, a publish for such a pod is refused where the API server says
/// what the pod is (docs/DEPLOY.md); without one, its runtime's idmapped mount fails.
async fn kernel_fuse(runtime_dir: &Path) -> Option<KernelFuse> {
    let dir = runtime_dir.to_path_buf();
    match tokio::task::spawn_blocking(move || crate::transport::probe::probe(&dir)).await {
        Ok(Ok(k)) if k.idmap => {
            tracing::info!(
                fuse_minor = k.minor,
                "this kernel's FUSE lets container runtimes idmap views: pods in user namespaces (hostUsers: false) can use them"
            );
            Some(k)
        }
        Ok(Ok(k)) => {
            tracing::warn!(
                fuse_minor = k.minor,
                "this kernel's FUSE cannot idmap a view (FUSE_ALLOW_IDMAP needs Linux 6.12 or later): a pod in a user namespace (hostUsers: false) with a mountgroup volume will fail to start, its runtime's idmapped mount refused with EINVAL"
            );
            Some(k)
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot ask the kernel what its FUSE offers; whether views can be idmapped is unknown");
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot ask the kernel what its FUSE offers");
            None
        }
    }
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
    let setup = |what: &str, e: &dyn std::fmt::Display| ServeError::Setup(format!("{what}: {e}"));
    let share = Arc::new(
        LocalShare::open(&cfg.share_root, cfg.share_init).map_err(|e| setup("--share-root", &e))?,
    );
    match share.native_capable() {
        Ok(()) => tracing::info!(
            share = %cfg.share_root.display(),
            "the share can be idmapped and every mount of its file system is nosuid,nodev: native volumes are served as native views"
        ),
        Err(why) => tracing::warn!(
            share = %cfg.share_root.display(),
            %why,
            "new volumes are FUSE volumes, not native views, until the share qualifies"
        ),
    }
    let key = Arc::new(match &cfg.share_key_file {
        Some(path) => ShareKey::load_or_create(path)
            .map_err(|e| ServeError::Setup(format!("--share-key-file: {e}")))?,
        None => {
            tracing::warn!(
                "no share key: every caller may create, delete, stage and expand volumes"
            );
            ShareKey::none()
        }
    });
    // One driver per state directory: a second one (a DaemonSet surge pod) waits here
    // until the first has drained and exited.
    std::fs::create_dir_all(&cfg.state_dir).map_err(|e| setup("--state-dir", &e))?;
    let lock_path = cfg.state_dir.join("lock");
    let _state_lock = tokio::task::spawn_blocking(move || {
        crate::sys::file::lock_exclusive(&lock_path, || {
            tracing::info!(lock = %lock_path.display(), "another driver holds the state directory; waiting for it to exit");
        })
    })
    .await
    .map_err(|e| setup("--state-dir lock", &e))?
    .map_err(|e| setup("--state-dir lock", &e))?;
    // What can still refuse is checked before anything with an effect starts: a keeper
    // started here takes the node's views over, and recovery restarts dead ones; a
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
    // Without a keeper container, a keeper in this process runs the views: it takes
    // over the views a previous driver left running, recovers a view that dies and
    // replaces one that hangs.
    let keeper_socket = match cfg.keeper_socket.clone() {
        Some(socket) => socket,
        None => {
            let socket = cfg.runtime_dir.join("keeper.sock");
            let keeper = crate::volume::keeper::KeeperConfig::new(
                socket.clone(),
                cfg.runtime_dir.join("views"),
                cfg.view_binary.clone(),
            );
            tokio::task::spawn_blocking(move || crate::volume::keeper::start_embedded(keeper))
                .await
                .map_err(|e| setup("--runtime-dir keeper", &e))?
                .map_err(|e| setup("--runtime-dir keeper", &e))?;
            socket
        }
    };
    let kernel = kernel_fuse(&cfg.runtime_dir).await;
    let pods = pod_lookup(&cfg.kube);
    let guards = Arc::new(OpGuards::default());
    let node = {
        let (share, guards, key, cfg) = (
            Arc::clone(&share),
            Arc::clone(&guards),
            Arc::clone(&key),
            cfg.clone(),
        );
        tokio::task::spawn_blocking(move || {
            Node::start(
                cfg.node_id,
                share,
                guards,
                key,
                crate::volume::node::NodeDirs {
                    state: &cfg.state_dir,
                    runtime: &cfg.runtime_dir,
                    keeper: keeper_socket,
                },
                pods,
                kernel.map(|k| k.idmap),
            )
        })
        .await
        .map_err(|e| setup("node recovery", &e))?
        .map_err(|e: VolumeError| setup("--state-dir", &e))?
    };
    let enforced = *share.capacity() == CapacityMode::Enforced;
    let controller = Arc::new(Controller::new(share, guards, key, Some(Arc::clone(&node))));
    let metrics = Metrics::new(Arc::clone(&node), enforced, kernel);
    if let Some(listener) = metrics_listener {
        serve_http(listener, Arc::clone(&metrics));
    }
    let shutdown = shutdown_signal().map_err(|e| setup("SIGTERM and SIGINT handlers", &e))?;
    replace_stale_socket(&socket).map_err(|e| ServeError::Endpoint(cfg.endpoint.clone(), e))?;
    let listener = UnixListener::bind(&socket)
        .map_err(|e| ServeError::Endpoint(cfg.endpoint.clone(), e.to_string()))?;
    let bound = socket_identity(&socket);
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
