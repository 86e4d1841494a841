//! Node operations: staging a volume (a bind mount of its share directory at the
//! staging path) and publishing views of it, each with the group of its own request:
//! a native view (an idmapped bind mount, no process) or a FUSE view (a process of
//! its own per target, run by the keeper), as `serve::decide` chooses, and only ever
//! of the volume's directory on the share. What each mechanism does to serve, check
//! and stop a target is its own (`serve::Mechanism`); this file orchestrates.
//!
//! Every change is written to the state file before the call returns, so that a
//! restarted driver serves every published target again at once (see [`Node::start`])
//! and can unpublish and unstage whatever is left.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use std::collections::BTreeMap;

use crate::config::ViewOptions;
use crate::share::key::ShareKey;
use crate::share::remote::{self, Attributes, Credentials, Role, Settings, Traits};
use crate::share::{Share, VolumeHandle, VolumeId, VolumeRecord, VolumeSpec};
use crate::sys::mount::{self, Health};

use super::guard::OpGuards;
use super::secrets::{self, Payload};
use super::serve::{self, Check, Mechanism, PodLookup, PodRef, Publish};
use super::state::{NodeState, Published, Staged, StagedShare, ViewKind};
use super::view::{VIEW_FSTYPE, Views};
use super::{
    Capability, Inline, Lifecycle, SECRET_DEFAULT_MODE, SecretUse, Secrets, VolumeError, authorize,
    share_wait,
};

mod publish;
mod recover;
mod stage;
mod stats;

/// A NodePublishVolume, validated.
#[derive(Clone, Debug)]
pub struct PublishRequest {
    pub volume_id: VolumeHandle,
    /// The staging path of a persistent volume (unused for inline volumes).
    pub staging_path: PathBuf,
    pub target_path: PathBuf,
    pub capability: Capability,
    pub readonly: bool,
    pub lifecycle: Lifecycle,
    /// The request's secrets (the content of a secret view); Debug shows no value.
    pub secrets: Payload,
    /// The pod, where kubelet names it (`podInfoOnMount`).
    pub pod: Option<PodRef>,
}

/// The parameter that marks a volume on the share as inline (created by a publish,
/// deleted by the unpublish), so a persistent volume is never handed to a pod inline.
pub const INLINE_MARKER: &str = "csi.storage.k8s.io/ephemeral";

/// Whether a volume on the share is an inline one.
pub fn is_inline(rec: &VolumeRecord) -> bool {
    rec.parameters.get(INLINE_MARKER).map(String::as_str) == Some("true")
}

/// A secret view's tmpfs: private, small (Secrets are at most 1 MiB; two versions
/// coexist during a rotation), never executable.
const SECRETS_TMPFS_OPTIONS: &str = "mode=0700,size=4m,nr_inodes=4096";

/// Usage in one unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub total: u64,
    pub available: u64,
    pub used: u64,
}

/// What NodeGetVolumeStats reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeStats {
    pub bytes: Usage,
    pub inodes: Usage,
    /// Why the volume is abnormal, if it is.
    pub abnormal: Option<String>,
}

impl VolumeStats {
    /// An abnormal volume whose usage could not be measured: zeros, which kubelet
    /// takes (it refuses an answer without usage before it reads the condition).
    fn abnormal(why: String) -> VolumeStats {
        VolumeStats {
            bytes: Usage::default(),
            inodes: Usage::default(),
            abnormal: Some(why),
        }
    }
}

/// How long NodeGetVolumeStats waits for the share before it answers that the share
/// does not answer: well within kubelet's deadline for the call (two minutes,
/// kubernetes pkg/volume/csi/csi_metrics.go `csiTimeout`), and longer than any answer
/// of a share that serves.
pub const STATS_WAIT: Duration = Duration::from_secs(5);

/// One published view as the metrics see it.
#[derive(Clone, Debug)]
pub struct ViewInfo {
    pub volume_id: String,
    pub target: PathBuf,
    pub state: ViewState,
    /// The view's last operation snapshot, if it wrote one (never for a native view).
    pub stats: Option<crate::transport::stats::Snapshot>,
    /// How it is served (`native`, `fuse`, `fuse-native`).
    pub mechanism: &'static str,
    /// Why a native volume is not served natively there.
    pub fallback: Option<String>,
}

/// What is at a published target, as the metrics see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewState {
    Serving,
    /// Mounted, and its mount did not answer a stat within [`CHECK_WAIT`]: its share
    /// stalls or its server is away (the view reads its root's expired attributes from
    /// the share, fs/fuse/dir.c `fuse_getattr`). It serves once the share answers.
    Waiting,
    /// Its process ended with nothing to recover it, or nothing is mounted there.
    Dead,
}

/// How long the metrics wait for a view's mount to answer a stat before they count it
/// [`ViewState::Waiting`]: a scrape answers within its deadline whatever the shares do.
pub const CHECK_WAIT: Duration = Duration::from_secs(1);

/// Work on a path that may wait on the share, one run at a time per path.
#[derive(Default)]
struct Pending(Arc<Mutex<std::collections::HashSet<PathBuf>>>);

impl Pending {
    fn lock(&self) -> MutexGuard<'_, std::collections::HashSet<PathBuf>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `work` for `path` in a thread of its own and waits no longer than `wait`
    /// for it: `None` where it has not answered by then. The run goes on in its thread
    /// until the share answers; meanwhile another for the same path does not start one
    /// more: it is `None` at once, or, where it `joins`, it waits for that run to end
    /// and then runs anew, all within its own `wait` (a share that answers again is
    /// seen by the first call after, not only once the run that waited ends). Where no
    /// thread can be started, `work` runs here, unbounded, and the log says so.
    fn within<T: Send + 'static>(
        &self,
        path: &Path,
        wait: Duration,
        joins: bool,
        what: &str,
        work: impl Fn() -> T + Send + Sync + 'static,
    ) -> Option<T> {
        let deadline = std::time::Instant::now() + wait;
        while !self.lock().insert(path.to_path_buf()) {
            if !joins || std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let (sent, answer) = std::sync::mpsc::sync_channel(1);
        let (all, path2) = (Arc::clone(&self.0), path.to_path_buf());
        let work = Arc::new(work);
        let in_thread = Arc::clone(&work);
        let spawned = std::thread::Builder::new()
            .name("share-wait".into())
            .spawn(move || {
                let done = in_thread();
                all.lock().unwrap_or_else(|e| e.into_inner()).remove(&path2);
                let _ = sent.send(done);
            });
        if let Err(e) = spawned {
            self.lock().remove(path);
            tracing::warn!(error = %e, "cannot start a thread to {what}: doing it here, unbounded");
            return Some(work());
        }
        answer
            .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
            .ok()
    }
}

/// A published target as recovery left it: its view's process, and the mechanism it
/// is served with now where recovery served it.
struct Restored {
    target: PathBuf,
    pid: Option<u32>,
    mechanism: Option<(Mechanism, Option<String>)>,
}

/// Where a node keeps things: its state directory, its runtime directory (secret
/// views' tmpfs, the views' control sockets), and the keeper's socket; and how it
/// mounts named shares.
pub struct NodeDirs<'a> {
    pub state: &'a Path,
    pub runtime: &'a Path,
    pub keeper: PathBuf,
    pub remotes: Settings,
}

/// What a volume shows on this node: a directory of the share root (its record), or
/// the named share its stage mounted at its staging path.
#[derive(Clone, Debug)]
enum Backing {
    Root(VolumeRecord),
    Named {
        staging: PathBuf,
        share: StagedShare,
    },
}

impl Backing {
    fn group(&self) -> Option<u32> {
        match self {
            Backing::Root(r) => r.group,
            Backing::Named { share, .. } => share.group,
        }
    }

    fn owners(&self) -> bool {
        match self {
            Backing::Root(r) => r.owners,
            Backing::Named { share, .. } => share.owners,
        }
    }

    fn not_native(&self) -> Option<&str> {
        match self {
            Backing::Root(r) => r.not_native.as_deref(),
            Backing::Named { share, .. } => share.not_native.as_deref(),
        }
    }
}

/// A NodeStageVolume, validated.
pub struct StageRequest<'a> {
    pub volume_id: &'a VolumeHandle,
    pub staging_path: &'a Path,
    pub capability: &'a Capability,
    pub secrets: &'a Secrets,
    /// The named share the PV's attributes name, if they name one.
    pub share: Option<Attributes>,
    /// The request's deadline, where it has one.
    pub deadline: Option<Duration>,
}

/// The node service's domain.
pub struct Node {
    node_id: String,
    share: Arc<dyn Share>,
    guards: Arc<OpGuards>,
    key: Arc<ShareKey>,
    views: Views,
    /// Whether a pod is in a user namespace (the API server, where there is one).
    pods: Arc<dyn PodLookup>,
    /// Whether this kernel's FUSE lets a runtime idmap a view (`None`: not known).
    fuse_idmap: Option<bool>,
    /// Where secret views keep their tmpfs (memory, outside the state directory).
    runtime_dir: PathBuf,
    state_path: PathBuf,
    state: Mutex<NodeState>,
    /// The paths whose usage a [`Node::stats_within`] measures now, in a thread that
    /// may wait on the share: one at a time for each.
    measuring: Pending,
    /// The targets a [`Node::views_overview`] checks now, in a thread that may wait on
    /// the share: one at a time for each.
    checking: Pending,
    /// How named shares are mounted.
    remotes: Settings,
}

impl Node {
    /// Loads the node state from `state_dir` and brings back what it names: staged
    /// volumes are bound again if their bind is gone, and every published target whose
    /// view is not serving (a dead FUSE mount, or nothing) gets a new view, all in
    /// parallel. Views that kept serving through the restart are left alone.
    ///
    /// # Errors
    /// `Internal` if the state directory or file cannot be used.
    pub fn start(
        node_id: String,
        share: Arc<dyn Share>,
        guards: Arc<OpGuards>,
        key: Arc<ShareKey>,
        dirs: NodeDirs<'_>,
        pods: Arc<dyn PodLookup>,
        fuse_idmap: Option<bool>,
    ) -> Result<Arc<Node>, VolumeError> {
        let NodeDirs {
            state: state_dir,
            runtime: runtime_dir,
            keeper,
            remotes,
        } = dirs;
        std::fs::create_dir_all(state_dir).map_err(|e| {
            VolumeError::Internal(format!("state directory {}: {e}", state_dir.display()))
        })?;
        let state_path = state_dir.join("node-state.json");
        let state = NodeState::load(&state_path)?;
        let node = Arc::new(Node {
            node_id,
            share,
            guards,
            key,
            runtime_dir: runtime_dir.to_path_buf(),
            views: Views::new(state_dir.join("views"), runtime_dir.join("views"), keeper)?,
            pods,
            fuse_idmap,
            state_path,
            state: Mutex::new(state),
            measuring: Pending::default(),
            checking: Pending::default(),
            remotes,
        });
        node.recover();
        Ok(node)
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    fn state(&self) -> MutexGuard<'_, NodeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, change: impl FnOnce(&mut NodeState)) -> Result<(), VolumeError> {
        let mut st = self.state();
        change(&mut st);
        st.save(&self.state_path)
    }

    /// Every published view: serving or dead, with its last operation snapshot.
    pub fn views_overview(&self) -> Vec<ViewInfo> {
        let published: Vec<(PathBuf, Published)> = self
            .state()
            .published
            .iter()
            .map(|(t, p)| (t.clone(), p.clone()))
            .collect();
        published
            .into_iter()
            .map(|(target, p)| ViewInfo {
                volume_id: p.volume_id.to_string(),
                state: match self.check_within(p.mechanism, &target) {
                    Some(Check::Serving) => ViewState::Serving,
                    None => ViewState::Waiting,
                    Some(_) => ViewState::Dead,
                },
                stats: p
                    .mechanism
                    .has_process()
                    .then(|| std::fs::read(self.views.metrics_path(&target)).ok())
                    .flatten()
                    .and_then(|b| serde_json::from_slice(&b).ok()),
                mechanism: p.mechanism.name(),
                fallback: p.fallback.clone(),
                target,
            })
            .collect()
    }

    /// [`Mechanism::check`] of `target`, waiting no longer than [`CHECK_WAIT`]: `None`
    /// where it did not answer by then ([`Pending::within`]).
    fn check_within(&self, mechanism: Mechanism, target: &Path) -> Option<Check> {
        let target2 = target.to_path_buf();
        self.checking
            .within(target, CHECK_WAIT, false, "check a view", move || {
                mechanism.check(&target2)
            })
    }

    /// Where the volume is in use on this node, if anywhere.
    pub fn in_use(&self, id: &str) -> Option<String> {
        let id = VolumeHandle::new(id);
        let st = self.state();
        let targets = st.targets_of(&id);
        if let Some(t) = targets.first() {
            return Some(format!("published at {}", t.display()));
        }
        st.staged
            .get(&id)
            .map(|s| format!("staged at {}", s.staging_path.display()))
    }

    /// Whether the node can serve: FUSE is usable, and the share root, where it is the
    /// share, is reachable. A share root that is not (yet) the share is not waited
    /// for: a cluster whose classes name their shares mounts none, and a call on a
    /// volume of a share root that is not there is told `UNAVAILABLE`, retried.
    ///
    /// # Errors
    /// A message saying what is missing.
    pub fn ready(&self) -> Result<(), String> {
        use std::os::unix::fs::FileTypeExt;
        match std::fs::metadata("/dev/fuse") {
            Ok(m) if m.file_type().is_char_device() => {}
            _ => return Err("/dev/fuse is missing: FUSE is not usable on this node".into()),
        }
        match self.share.check() {
            Ok(()) | Err(crate::share::ShareError::NotThere(_)) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Whether the named share `share` is what is mounted at `staging`.
fn share_mounted(share: &StagedShare, staging: &Path) -> bool {
    matches!(mount::mount_type(staging), Ok(Some(t)) if share.kind.mount_types().contains(&t.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A measurement that finds another of the same path waiting on the share waits
    /// for it to end and measures anew, within its own bound: once the share answers,
    /// the next call is answered (it was told "does not answer" at once while the
    /// run that waited had not ended yet); a check does not wait.
    #[test]
    fn a_run_that_finds_another_waiting_runs_anew_once_it_ends() {
        let pending = Arc::new(Pending::default());
        let path = Path::new("/volume");
        let (release, held) = std::sync::mpsc::channel::<()>();
        let held = Arc::new(Mutex::new(held));
        let waiting = Arc::clone(&held);
        let first = pending.within(path, Duration::from_millis(50), true, "test", move || {
            let _ = waiting.lock().unwrap().recv();
            "old"
        });
        assert_eq!(first, None, "the share does not answer");
        assert_eq!(
            pending.within(path, Duration::ZERO, false, "test", || "check"),
            None,
            "a check does not wait"
        );
        let p2 = Arc::clone(&pending);
        let second = std::thread::spawn(move || {
            p2.within(
                Path::new("/volume"),
                Duration::from_secs(30),
                true,
                "test",
                || "new",
            )
        });
        std::thread::sleep(Duration::from_millis(100));
        release.send(()).unwrap();
        assert_eq!(second.join().unwrap(), Some("new"));
        // And a call past its bound while the run still waits is told so.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let held = Arc::new(Mutex::new(held));
        let waiting = Arc::clone(&held);
        let _ = pending.within(path, Duration::ZERO, true, "test", move || {
            let _ = waiting.lock().unwrap().recv();
            "old"
        });
        assert_eq!(
            pending.within(path, Duration::from_millis(100), true, "test", || "new"),
            None
        );
        release.send(()).unwrap();
    }
}
