//! The composition root: what `mountgroup serve` is made of, assembled in the order
//! that keeps a refusal free of effects. [`Opened::open`] opens the share, the share
//! key and the state directory's lock; [`Opened::start`] then starts what acts on the
//! node (the embedded keeper, which takes views over; the kernel's FUSE probe; the pod
//! lookup; the node's recovery) and makes the controller. csi/server.rs binds the
//! endpoint and the metrics address between the two, and serves gRPC over the result.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::share::key::ShareKey;
use crate::share::{CapacityMode, LocalShare, Share, ShareInit};
use crate::transport::probe::KernelFuse;
use crate::volume::VolumeError;
use crate::volume::controller::Controller;
use crate::volume::guard::OpGuards;
use crate::volume::node::Node;
use crate::volume::serve::{NoApiServer, Pod, PodLookup, PodRef};

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
    /// Where secret views keep their tmpfs (memory; never the state directory), and
    /// the controller mounts named shares for a call (`shares/`).
    pub runtime_dir: PathBuf,
    /// The longest a call waits for a named share's server to answer its mount.
    pub share_timeout: std::time::Duration,
    /// ceph-csi's configuration file, for a `clusterID`'s monitors.
    pub ceph_csi_config: PathBuf,
    /// The network namespace named shares are mounted in; `None`: the driver's.
    pub mount_net_ns: Option<PathBuf>,
    /// Where to serve Prometheus metrics, if anywhere.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// The Kubernetes API, asked whether a pod runs in a user namespace.
    pub kube: KubeApi,
}

impl ServeConfig {
    /// How named shares are mounted.
    pub fn remotes(&self) -> crate::share::remote::Settings {
        crate::share::remote::Settings {
            work_dir: self.runtime_dir.join("shares"),
            ceph_config: self.ceph_csi_config.clone(),
            timeout: self.share_timeout,
            net_ns: self.mount_net_ns.clone(),
        }
    }
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

/// Why the driver could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Setup(String),
}

/// A lookup that always fails, for an API server that cannot be used (its reason).
struct Unusable(String);

impl PodLookup for Unusable {
    fn pod(&self, _: Option<&PodRef>) -> Pod {
        Pod::Unknown(self.0.clone())
    }
}

/// The pod lookup `kube` names. One that cannot be set up answers every lookup with
/// its reason, so native volumes are served by FUSE views, which every pod can use.
fn pod_lookup(kube: &KubeApi) -> Arc<dyn PodLookup> {
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
            Arc::new(NoApiServer)
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

/// The share, its key and the state directory, held: nothing on the node acted on yet.
pub struct Opened {
    share: Arc<LocalShare>,
    key: Arc<ShareKey>,
    state_lock: OwnedFd,
}

/// The driver, assembled: what the gRPC services serve.
pub struct Driver {
    pub node: Arc<Node>,
    pub controller: Arc<Controller>,
    /// What the kernel's FUSE offers, where it could be asked.
    pub kernel: Option<KernelFuse>,
    /// Whether the share enforces capacity (quota groups).
    pub capacity_enforced: bool,
    /// The state directory's lock, held while the driver runs.
    pub state_lock: OwnedFd,
}

impl Opened {
    /// Opens the share (and says whether new volumes are native), the share key, and
    /// the state directory, waiting for a driver that holds it to exit.
    ///
    /// # Errors
    /// [`StartError`] naming the flag whose thing cannot be used.
    pub async fn open(cfg: &ServeConfig) -> Result<Opened, StartError> {
        let setup =
            |what: &str, e: &dyn std::fmt::Display| StartError::Setup(format!("{what}: {e}"));
        let share = Arc::new(
            LocalShare::open(&cfg.share_root, cfg.share_init)
                .map_err(|e| setup("--share-root", &e))?,
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
                .map_err(|e| StartError::Setup(format!("--share-key-file: {e}")))?,
            None => {
                tracing::warn!(
                    "no share key: every caller may create, delete, stage and expand volumes"
                );
                ShareKey::none()
            }
        });
        // One driver per state directory: a second one (a DaemonSet surge pod) waits
        // here until the first has drained and exited.
        std::fs::create_dir_all(&cfg.state_dir).map_err(|e| setup("--state-dir", &e))?;
        let lock_path = cfg.state_dir.join("lock");
        let state_lock = tokio::task::spawn_blocking(move || {
            crate::sys::file::lock_exclusive(&lock_path, || {
                tracing::info!(lock = %lock_path.display(), "another driver holds the state directory; waiting for it to exit");
            })
        })
        .await
        .map_err(|e| setup("--state-dir lock", &e))?
        .map_err(|e| setup("--state-dir lock", &e))?;
        Ok(Opened {
            share,
            key,
            state_lock,
        })
    }

    /// Starts what acts on the node: the embedded keeper (without a keeper container),
    /// the kernel's FUSE probe, the pod lookup and the node's recovery of what it
    /// served; then the controller.
    ///
    /// # Errors
    /// [`StartError`] naming the step that failed.
    pub async fn start(self, cfg: &ServeConfig) -> Result<Driver, StartError> {
        let Opened {
            share,
            key,
            state_lock,
        } = self;
        let setup =
            |what: &str, e: &dyn std::fmt::Display| StartError::Setup(format!("{what}: {e}"));
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
            let remotes = cfg.remotes();
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
                        remotes,
                    },
                    pods,
                    kernel.map(|k| k.idmap),
                )
            })
            .await
            .map_err(|e| setup("node recovery", &e))?
            .map_err(|e: VolumeError| setup("--state-dir", &e))?
        };
        let capacity_enforced = *share.capacity() == CapacityMode::Enforced;
        let controller = Arc::new(Controller::new(
            share,
            guards,
            key,
            Some(Arc::clone(&node)),
            cfg.remotes(),
        ));
        Ok(Driver {
            node,
            controller,
            kernel,
            capacity_enforced,
            state_lock,
        })
    }
}
