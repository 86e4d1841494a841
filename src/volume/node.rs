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

    fn recover(&self) {
        let snapshot = self.state().clone();
        for (id, s) in &snapshot.staged {
            if let Some(share) = &s.share {
                if !share_mounted(share, &s.staging_path) {
                    // Its credentials were the stage's, and are kept nowhere: kubelet's
                    // reconciler stages the volume of a pod that needs it again.
                    tracing::warn!(volume_id = %id, staging = %s.staging_path.display(), share = %share.share, "the share is not mounted at the staging path: kubelet's next NodeStageVolume mounts it again");
                }
                continue;
            }
            let Some(root) = id.root() else { continue };
            if !matches!(mount::health(&s.staging_path), Health::Mounted(_)) {
                if let Health::Dead = mount::health(&s.staging_path) {
                    let _ = mount::unmount_lazy(&s.staging_path);
                }
                match mount::bind(&self.share.data_path(&root), &s.staging_path) {
                    Ok(()) => {
                        tracing::info!(volume_id = %id, staging = %s.staging_path.display(), "staging restored")
                    }
                    Err(e) => {
                        tracing::error!(volume_id = %id, staging = %s.staging_path.display(), error = %e, "cannot restore staging")
                    }
                }
            }
        }
        let restarted: Vec<Restored> = std::thread::scope(|scope| {
            let handles: Vec<_> = snapshot
                .published
                .iter()
                .map(|(target, p)| scope.spawn(move || self.restore(target, p)))
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        if let Err(e) = self.update(|st| {
            for r in restarted {
                if let Some(p) = st.published.get_mut(&r.target) {
                    p.pid = r.pid;
                    if let Some((mechanism, fallback)) = r.mechanism {
                        p.mechanism = mechanism;
                        p.fallback = fallback;
                    }
                }
            }
        }) {
            tracing::error!(error = %e, "cannot save the node state after recovery");
        }
    }

    /// Serves a published target again at start, unless it still is: only from the
    /// volume on the share (a target whose source is not that waits, unserved, for
    /// kubelet to stage and publish it again once the share is back), and natively
    /// only while the share qualifies.
    fn restore(&self, target: &Path, p: &Published) -> Restored {
        let kept = |pid| Restored {
            target: target.to_path_buf(),
            pid,
            mechanism: None,
        };
        match p.mechanism.check(target) {
            Check::Serving => return kept(p.pid),
            Check::Foreign(fstype) => {
                tracing::error!(target = %target.display(), %fstype, "another file system is mounted on a published target; leaving it");
                return kept(p.pid);
            }
            Check::Dead => {
                let _ = mount::unmount_lazy(target);
            }
            Check::Gone => {}
        }
        let record = self.backing_of(p.kind, &p.volume_id);
        if let Err(why) = self.source_on_share(p.kind, &p.volume_id, record.as_ref(), &p.source) {
            // kubelet's reconciler mounts what a pod needs and is not mounted (after a
            // reboot, every volume), retrying a failed NodeStage or NodePublish with
            // exponential backoff from 0.5 s to at most 2 min 2 s between tries
            // (kubernetes pkg/util/goroutinemap/exponentialbackoff,
            // `maxDurationBeforeRetry`): the first try after the share is back serves.
            tracing::error!(volume_id = %p.volume_id, target = %target.display(), %why, "not served until the share is back: kubelet's next NodeStageVolume and NodePublishVolume serve it");
            return kept(None);
        }
        let options = match ViewOptions::parse(&p.options) {
            Ok(o) => o,
            Err(e) => {
                tracing::error!(target = %target.display(), error = %e, "recorded view options no longer parse");
                return kept(None);
            }
        };
        let recorded = Some((p.mechanism, p.fallback.clone()));
        let Ok((mechanism, fallback)) = self.decide(
            &p.volume_id,
            target,
            p.kind,
            record.as_ref(),
            &options,
            recorded,
            None,
        ) else {
            return kept(None);
        };
        let pid = self.serve_again(target, p, mechanism, &options);
        Restored {
            target: target.to_path_buf(),
            pid,
            mechanism: Some((mechanism, fallback)),
        }
    }

    /// Serves a published target again at start, as `mechanism`; the pid of its
    /// view's process, if it has one.
    fn serve_again(
        &self,
        target: &Path,
        p: &Published,
        mechanism: Mechanism,
        options: &ViewOptions,
    ) -> Option<u32> {
        if p.kind == ViewKind::InlineSecrets
            && mount::health(&p.source) != Health::Mounted("tmpfs".into())
        {
            // The secrets were in memory and are gone (a reboot): only kubelet has
            // them. Its next publish of this target writes them and starts the view.
            tracing::warn!(volume_id = %p.volume_id, target = %target.display(), "secret view waits for kubelet to publish it again");
            return None;
        }
        match mechanism.start(&self.views, &p.source, target, options) {
            Ok(pid) => {
                tracing::info!(volume_id = %p.volume_id, target = %target.display(), mechanism = mechanism.name(), "view restored");
                pid
            }
            Err(e) => {
                tracing::error!(volume_id = %p.volume_id, target = %target.display(), mechanism = mechanism.name(), error = %e, "cannot restore view");
                None
            }
        }
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

    /// Makes the volume available at its staging path: the named share its PV's
    /// attributes name, mounted there with the node-stage Secret ([`Node::stage_named`]),
    /// or a bind mount of its directory on the share root. Repeating it with the same
    /// path is OK; another path while staged is ALREADY_EXISTS.
    ///
    /// # Errors
    /// A missing or wrong share key (the node-stage secret, as a CIFS mount needs the
    /// account key), `NotFound` for an unknown volume, `AlreadyExists`, `Aborted`,
    /// `Internal`; for a named share, what mounting it answered.
    pub fn stage(&self, req: StageRequest<'_>) -> Result<(), VolumeError> {
        if req.share.is_some() {
            return self.stage_named(&req);
        }
        let StageRequest {
            volume_id,
            staging_path,
            secrets,
            ..
        } = req;
        let id = volume_id.root().ok_or_else(|| {
            VolumeError::InvalidArgument(format!(
                "volume_id {volume_id:?} names no volume of the share root, and volume_context names no share (source; server and share; clusterID or monitors)"
            ))
        })?;
        authorize(&self.key, secrets.share_key(), SecretUse::NodeStage)?;
        let _guard = self.guards.acquire(id.as_str(), "NodeStageVolume")?;
        let Some(rec) = self.share.get(&id)? else {
            return Err(VolumeError::NotFound(format!("volume {id} does not exist")));
        };
        self.keep_native_root(Some(&Backing::Root(rec)));
        if self.staged_here(volume_id, staging_path)? {
            return Ok(());
        }
        mount::bind(&self.share.data_path(&id), staging_path).map_err(|e| {
            VolumeError::Internal(format!(
                "binding volume {id} at {}: {e}",
                staging_path.display()
            ))
        })?;
        self.record_stage(volume_id, staging_path, None)?;
        tracing::info!(volume_id = %id, staging = %staging_path.display(), "volume staged");
        Ok(())
    }

    /// Whether `id` is staged at `staging_path` already (a repeat: OK); otherwise
    /// readies the path for a new mount.
    ///
    /// # Errors
    /// `AlreadyExists` for another staging path or a mount of another there,
    /// `Internal`.
    fn staged_here(&self, id: &VolumeHandle, staging_path: &Path) -> Result<bool, VolumeError> {
        let existing = self.state().staged.get(id).cloned();
        if let Some(s) = &existing {
            if s.staging_path != staging_path {
                return Err(VolumeError::AlreadyExists(format!(
                    "volume {id} is already staged at {}",
                    s.staging_path.display()
                )));
            }
        }
        match mount::health(staging_path) {
            Health::Mounted(_) if existing.is_some() => return Ok(true),
            Health::Mounted(t) => {
                return Err(VolumeError::AlreadyExists(format!(
                    "staging_target_path {} already holds a {t} mount",
                    staging_path.display()
                )));
            }
            Health::Dead => {
                let _ = mount::unmount_lazy(staging_path);
            }
            Health::NotMounted => {}
        }
        std::fs::create_dir_all(staging_path).map_err(|e| {
            VolumeError::Internal(format!(
                "staging_target_path {}: {e}",
                staging_path.display()
            ))
        })?;
        Ok(false)
    }

    /// Records a stage; undoes its mount where the state cannot be written.
    fn record_stage(
        &self,
        id: &VolumeHandle,
        staging_path: &Path,
        share: Option<StagedShare>,
    ) -> Result<(), VolumeError> {
        let staged = Staged {
            staging_path: staging_path.to_path_buf(),
            share,
        };
        if let Err(e) = self.update(|st| {
            st.staged.insert(id.clone(), staged);
        }) {
            let _ = mount::unmount_lazy(staging_path);
            return Err(e);
        }
        Ok(())
    }

    /// Mounts the named share a PV's attributes name (its volume's directory on it) at
    /// the staging path, with the node-stage Secret's credentials and the client's
    /// options of the PV's `mountOptions`, within the call's deadline. The mount is
    /// made detached and attached only once made, so a server that does not answer
    /// leaves nothing at the staging path, and a later stage of the same path is
    /// refused (`ABORTED`, retried) until the kernel has given up on it. A volume the
    /// driver made native or acting gets its root back where a pod changed it; nothing
    /// of a static volume is changed.
    fn stage_named(&self, req: &StageRequest<'_>) -> Result<(), VolumeError> {
        let Some(attrs) = &req.share else {
            return Err(VolumeError::Internal("no share to stage".into()));
        };
        let id = req.volume_id;
        let staging = req.staging_path;
        let kind = attrs.location.remote.kind();
        let at = attrs.location.describe();
        let creds = Credentials::of(
            kind,
            &req.secrets.0,
            &req.capability.client,
            Role::NodeStage,
        )
        .map_err(VolumeError::InvalidArgument)?;
        let _guard = self.guards.acquire(id.as_str(), "NodeStageVolume")?;
        let staged = StagedShare {
            kind,
            share: at.clone(),
            group: attrs.traits.group(),
            owners: matches!(attrs.traits, Traits::Owners(_)),
            not_native: attrs.not_native.clone(),
        };
        if self.staged_here(id, staging)? {
            return Ok(());
        }
        // One mount of a staging path at a time, held until the kernel answers.
        let mounting = self
            .guards
            .acquire(&format!("mount at {}", staging.display()), "NodeStageVolume")
            .map_err(|_| {
                VolumeError::Aborted(format!(
                    "a mount of {at} at {} is still waiting on its server (an earlier NodeStageVolume gave up on it)",
                    staging.display()
                ))
            })?;
        let within = share_wait(req.deadline, self.remotes.timeout);
        let fd = remote::mount(
            &attrs.location,
            &req.capability.client,
            &creds,
            &self.remotes,
            within,
            mounting,
        )?;
        mount::attach_detached(std::os::fd::AsFd::as_fd(&fd), staging).map_err(|e| {
            VolumeError::Internal(format!("attaching {at} at {}: {e}", staging.display()))
        })?;
        drop(fd);
        // The share's root, mounted, reached through the mount: nothing is resolved
        // on the share by path.
        if let Some(mode) = attrs
            .mount_permissions
            .filter(|_| attrs.traits == Traits::Plain)
        {
            set_mode(staging, mode);
        }
        let backing = Backing::Named {
            staging: staging.to_path_buf(),
            share: staged.clone(),
        };
        self.keep_native_root(Some(&backing));
        if kind == remote::Kind::Nfs && attrs.traits == Traits::Plain {
            say_if_squashed(staging, &at);
        }
        self.record_stage(id, staging, Some(staged))?;
        tracing::info!(volume_id = %id, staging = %staging.display(), share = %at, "volume staged: the share is mounted");
        Ok(())
    }

    /// Undoes [`Node::stage`]. A volume that is not staged is OK (idempotent).
    ///
    /// # Errors
    /// `FailedPrecondition` while a view of the volume is still published.
    pub fn unstage(&self, id: &VolumeHandle, staging_path: &Path) -> Result<(), VolumeError> {
        let _guard = self.guards.acquire(id.as_str(), "NodeUnstageVolume")?;
        if let Some(t) = self.state().targets_of(id).first() {
            return Err(VolumeError::FailedPrecondition(format!(
                "volume {id} is still published at {}; unpublish it first",
                t.display()
            )));
        }
        if !matches!(mount::health(staging_path), Health::NotMounted) {
            mount::unmount_lazy(staging_path).map_err(|e| {
                VolumeError::Internal(format!("unmounting {}: {e}", staging_path.display()))
            })?;
        }
        self.update(|st| {
            st.staged.remove(id);
        })?;
        tracing::info!(volume_id = %id, staging = %staging_path.display(), "volume unstaged");
        Ok(())
    }

    /// The view options of a publish: the capability's `mount_flags`, the group of
    /// this request, `ro` for a read-only publish or access mode, and for secret views
    /// always `ro` and no kernel caching (a rotation shows at once). On an SMB share a
    /// class names, a `gid=` of its mount options is shown whatever the pod's fsGroup,
    /// as csi-driver-smb mounts it (pkg/smb/nodeserver.go: `volumeMountGroup` only
    /// where the flags have no `gid=`), so that its classes keep their meaning; the
    /// share root's volumes refuse the conflict (docs/SEMANTICS.md, *Precedence*).
    fn view_options(req: &PublishRequest, smb: bool) -> Result<ViewOptions, VolumeError> {
        let mut options = req.capability.options.clone();
        match (req.capability.mount_group, options.group) {
            (Some(g), Some(class)) if smb && g != class => {
                tracing::info!(volume_id = %req.volume_id, class_gid = class.get(), fs_group = g.get(), "the class's gid= is shown, as csi-driver-smb shows it, not the pod's fsGroup");
            }
            (Some(g), _) => {
                options = options.with_mount_group(g).map_err(|e| {
                    VolumeError::InvalidArgument(format!(
                        "volume_capability.mount.volume_mount_group: {e}"
                    ))
                })?;
            }
            (None, _) => {}
        }
        if req.readonly || req.capability.access.read_only() {
            options.readonly = true;
        }
        if let Lifecycle::Ephemeral(Inline::Secrets(_)) = req.lifecycle {
            // Read-only to the pod whatever it asks (KEP-596, CVE-2017-1002102).
            options.readonly = true;
            options.attr_timeout = std::time::Duration::ZERO;
            options.entry_timeout = std::time::Duration::ZERO;
        }
        Ok(options)
    }

    /// Where the tmpfs of the secret view at `target` lives (named by
    /// [`super::names::target_key`]).
    fn secrets_dir(&self, target: &Path) -> PathBuf {
        self.runtime_dir
            .join("secrets")
            .join(super::names::target_key(target))
    }

    /// Mounts a group view at the target, with the group of this request
    /// (`volume_mount_group`) and the options of its `mount_flags`; read-only if the
    /// request or the access mode says so.
    ///
    /// - a persistent volume must be staged at `staging_path`; the view shows it;
    /// - an inline volume (`csi.storage.k8s.io/ephemeral`) is created on the share on
    ///   first publish (a handle that names a persistent volume is refused) and its
    ///   view shows it directly;
    /// - a secret view writes the request's secrets to a private tmpfs and shows it
    ///   read-only.
    ///
    /// A repeat with the same arguments is OK (and heals a view whose process died); a
    /// repeat of a secret view rotates its content atomically if it changed, without
    /// unmounting. Different arguments for a published target are ALREADY_EXISTS.
    ///
    /// # Errors
    /// `InvalidArgument` for a group that conflicts with a `gid=` flag or secrets that
    /// do not fit the items, `NotFound` for an unknown persistent volume,
    /// `FailedPrecondition` when it is not staged there, `AlreadyExists`, `Aborted`,
    /// `Internal` with the view's message.
    pub fn publish(&self, req: &PublishRequest) -> Result<(), VolumeError> {
        let id = &req.volume_id;
        let target = &req.target_path;
        let smb = req.lifecycle == Lifecycle::Persistent
            && self
                .staged_share(&req.volume_id)
                .is_some_and(|(_, share)| share.kind == remote::Kind::Smb);
        let options = Self::view_options(req, smb)?;
        let canonical = options.to_option_string();
        let (kind, source) = match &req.lifecycle {
            Lifecycle::Persistent => (ViewKind::Persistent, req.staging_path.clone()),
            Lifecycle::Ephemeral(Inline::Share { .. }) => {
                (ViewKind::InlineShare, self.share.data_path(&inline_id(id)?))
            }
            Lifecycle::Ephemeral(Inline::Secrets(_)) => {
                // A secret view published by an earlier version keeps the tmpfs its
                // state names (whatever name that version gave it).
                let recorded = self
                    .state()
                    .published
                    .get(target)
                    .filter(|p| p.kind == ViewKind::InlineSecrets)
                    .map(|p| p.source.clone());
                (
                    ViewKind::InlineSecrets,
                    recorded.unwrap_or_else(|| self.secrets_dir(target)),
                )
            }
        };
        let _guard = self.guards.acquire(id.as_str(), "NodePublishVolume")?;
        let existing = self.state().published.get(target).cloned();
        if let Some(p) = &existing {
            if p.volume_id != *id || p.options != canonical || p.kind != kind || p.source != source
            {
                return Err(VolumeError::AlreadyExists(format!(
                    "target_path {} is already published (volume {}) with other arguments",
                    target.display(),
                    p.volume_id
                )));
            }
        }
        // Make the source exist (the only side effects before the view starts).
        let made_source = self.make_source(req, &source, existing.is_some())?;
        let undo_source = |this: &Self| {
            if made_source {
                this.remove_source(kind, id, &source);
            }
        };
        // What the volume is, read once for the rest of the publish.
        let record = self.backing_of(kind, id);
        if let Err(why) = self.source_on_share(kind, id, record.as_ref(), &source) {
            undo_source(self);
            return Err(VolumeError::FailedPrecondition(format!(
                "volume {id} cannot be served: {why}; NodeStageVolume binds it again once the share is back"
            )));
        }
        if let Some(p) = &existing {
            if p.mechanism.check(target) == Check::Serving {
                return Ok(());
            }
        }
        // A repeat keeps the mechanism it had; a new publish is native where it can be.
        let recorded = existing.as_ref().map(|p| (p.mechanism, p.fallback.clone()));
        let (mechanism, fallback) = match self.decide(
            id,
            target,
            kind,
            record.as_ref(),
            &options,
            recorded,
            req.pod.as_ref(),
        ) {
            Ok(d) => d,
            Err(refusal) => {
                undo_source(self);
                let who = req
                    .pod
                    .as_ref()
                    .map_or_else(String::new, |p| format!(" {}/{}", p.namespace, p.name));
                return Err(VolumeError::FailedPrecondition(format!(
                    "pod{who} {refusal}"
                )));
            }
        };
        let created_target = match self.prepare_target(target, existing.as_ref()) {
            Ok(made) => made,
            Err(e) => {
                undo_source(self);
                return Err(e);
            }
        };
        if mechanism.native_presentation() {
            self.keep_native_root(record.as_ref());
        }
        let pid = match mechanism.start(&self.views, &source, target, &options) {
            Ok(pid) => pid,
            Err(e) => {
                if created_target && existing.is_none() {
                    let _ = std::fs::remove_dir(target);
                }
                if existing.is_none() {
                    undo_source(self);
                }
                return Err(e);
            }
        };
        let published = Published {
            volume_id: id.clone(),
            kind,
            source,
            options: canonical,
            pid,
            created_target,
            mechanism,
            fallback: fallback.clone(),
        };
        if let Err(e) = self.update(|st| {
            st.published.insert(target.clone(), published);
        }) {
            let _ = mechanism.stop(&self.views, target, pid);
            return Err(e);
        }
        match &fallback {
            None => {
                tracing::info!(volume_id = %id, target = %target.display(), kind = ?kind, mechanism = mechanism.name(), "volume published")
            }
            Some(reason) => {
                tracing::info!(volume_id = %id, target = %target.display(), kind = ?kind, mechanism = mechanism.name(), fallback = %reason, "volume published as a FUSE view")
            }
        }
        Ok(())
    }

    /// Makes `target` ready for a view: a repeat's view that died is stopped; a new
    /// target must hold no mount and be a directory, made where missing. Whether the
    /// publish made the directory (its unpublish removes it).
    ///
    /// # Errors
    /// `AlreadyExists` for a mount there, `InvalidArgument` for a file, `Internal`.
    fn prepare_target(
        &self,
        target: &Path,
        existing: Option<&Published>,
    ) -> Result<bool, VolumeError> {
        if let Some(p) = existing {
            // The view died (or, native, is gone): serve it again, as it was.
            if p.mechanism.has_process() {
                self.views.stop(target, p.pid)?;
            }
            return Ok(p.created_target);
        }
        match mount::health(target) {
            Health::NotMounted => {}
            Health::Dead => self.views.stop(target, None)?,
            Health::Mounted(t) => {
                return Err(VolumeError::AlreadyExists(format!(
                    "target_path {} already holds a {t} mount",
                    target.display()
                )));
            }
        }
        match std::fs::symlink_metadata(target) {
            Ok(m) if m.is_dir() => Ok(false),
            Ok(_) => Err(VolumeError::InvalidArgument(format!(
                "target_path {} exists and is not a directory",
                target.display()
            ))),
            Err(_) => {
                std::fs::create_dir_all(target).map_err(|e| {
                    VolumeError::Internal(format!("target_path {}: {e}", target.display()))
                })?;
                Ok(true)
            }
        }
    }

    /// How a target is served ([`serve::decide`] with this node's share, pods and
    /// kernel): a new publish as it can be, a `recorded` one (its mechanism and
    /// fallback) as it was while it can be. A fallback that is news is logged, and its
    /// code is the view's metric label.
    #[allow(clippy::too_many_arguments)]
    fn decide(
        &self,
        id: &VolumeHandle,
        target: &Path,
        kind: ViewKind,
        record: Option<&Backing>,
        options: &ViewOptions,
        recorded: Option<(Mechanism, Option<String>)>,
        pod: Option<&PodRef>,
    ) -> Result<(Mechanism, Option<String>), serve::Refusal> {
        let (recorded, recorded_fallback) = recorded.unzip();
        let served = serve::decide(
            &Publish {
                volume_group: record.and_then(Backing::group),
                not_native: record.and_then(Backing::not_native),
                owners: record.is_some_and(Backing::owners),
                secrets: kind == ViewKind::InlineSecrets,
                options,
                recorded,
                fuse_idmap: self.fuse_idmap,
            },
            &mut serve::Asking {
                share: || match record {
                    Some(Backing::Named { staging, .. }) => {
                        crate::share::native_capable_at(staging)
                    }
                    _ => self.share.native_capable(),
                },
                records: || self.share_records(record),
                owners: || match record {
                    Some(Backing::Named { staging, .. }) => crate::share::keeps_owners(staging),
                    _ => self.share.keeps_owners(),
                },
                pod: || self.pods.pod(pod),
            },
        )?;
        Ok(match served.fallback {
            None => (served.mechanism, recorded_fallback.flatten()),
            Some(f) => {
                let what = match (&f, recorded) {
                    (serve::Fallback::NoRecords(_), _) => {
                        "the share keeps no records: a CIFS view without any"
                    }
                    (serve::Fallback::UserRecords(_), _) => {
                        "the share keeps records in user.* extended attributes only"
                    }
                    (_, Some(_)) => "a native view is served again as its FUSE twin",
                    (_, None) => "not a native view",
                };
                tracing::warn!(volume_id = %id, target = %target.display(), fallback = f.code(), why = %f, "{what}");
                (served.mechanism, Some(f.code().to_string()))
            }
        })
    }

    /// Which records the volume's share keeps: `trusted.` extended attributes, else
    /// `user.` ones, else none (a named share's asked at its root, the staging path).
    fn share_records(&self, backing: Option<&Backing>) -> serve::Records {
        use crate::fs::record::{TRUSTED_PROBE_XATTR, USER_PROBE_XATTR};
        let keeps = |name| match backing {
            Some(Backing::Named { staging, .. }) => crate::share::keeps_xattr(staging, name),
            _ => self.share.keeps_xattr(name),
        };
        serve::Records::probed(keeps(TRUSTED_PROBE_XATTR), || keeps(USER_PROBE_XATTR))
    }

    /// Makes the source of a publish exist: checks a persistent volume is on the share
    /// and staged at `source`, creates an inline volume, writes a secret view's
    /// secrets to its tmpfs (rotating them on a `repeat`). Whether it made the source
    /// now (an undone publish removes it).
    ///
    /// # Errors
    /// `NotFound`, `FailedPrecondition` (not staged there, the share is not there),
    /// `InvalidArgument` for secrets that do not fit the items, `Internal`.
    fn make_source(
        &self,
        req: &PublishRequest,
        source: &Path,
        repeat: bool,
    ) -> Result<bool, VolumeError> {
        let id = &req.volume_id;
        let target = &req.target_path;
        Ok(match &req.lifecycle {
            Lifecycle::Persistent => {
                let staged = self.state().staged.get(id).cloned();
                if staged.as_ref().is_some_and(|s| s.share.is_none()) || staged.is_none() {
                    // A volume of the share root: it must be on the share.
                    let root = id.root().ok_or_else(|| {
                        VolumeError::FailedPrecondition(format!(
                            "volume {id} is not staged at {}",
                            source.display()
                        ))
                    })?;
                    match self.share.get(&root)? {
                        Some(_) => {}
                        // Staged here, so it was on the share: the share is not there.
                        None if staged.is_some() => {
                            return Err(VolumeError::FailedPrecondition(format!(
                                "volume {id} cannot be served: it is staged here but not on the share {} (is the share mounted?)",
                                self.share.data_path(&root).display()
                            )));
                        }
                        None => {
                            return Err(VolumeError::NotFound(format!(
                                "volume {id} does not exist"
                            )));
                        }
                    }
                }
                match staged {
                    Some(s) if s.staging_path == source => {}
                    _ => {
                        return Err(VolumeError::FailedPrecondition(format!(
                            "volume {id} is not staged at {}",
                            source.display()
                        )));
                    }
                }
                false
            }
            Lifecycle::Ephemeral(Inline::Share { size }) => {
                self.ensure_inline_volume(&inline_id(id)?, *size)?
            }
            Lifecycle::Ephemeral(Inline::Secrets(spec)) => {
                let payload = secrets::payload(&req.secrets, spec)?;
                let mode = spec
                    .default_mode
                    .unwrap_or(if req.capability.mount_group.is_some() {
                        SECRET_DEFAULT_MODE
                    } else {
                        0o444
                    });
                let fresh = self.ensure_secrets_tmpfs(source)?;
                if secrets::write(source, &payload, mode)? && repeat {
                    tracing::info!(volume_id = %id, target = %target.display(), "secrets rotated");
                }
                fresh
            }
        })
    }

    /// Whether `source` is what a view of volume `id` (its `record` on the share, if the
    /// share has one) may show: the volume's directory
    /// on the share (for a persistent volume, its staging bind of that directory). A
    /// staging path whose bind could not be restored (a reboot without the share) is
    /// an empty directory of the node's disk, and a view of it would give pods the
    /// node's disk.
    ///
    /// # Errors
    /// What is wrong, and that the share must be back.
    fn source_on_share(
        &self,
        kind: ViewKind,
        id: &VolumeHandle,
        record: Option<&Backing>,
        source: &Path,
    ) -> Result<(), String> {
        use std::os::unix::fs::MetadataExt;
        let data = match (kind, record) {
            (ViewKind::InlineSecrets, _) => return Ok(()),
            (_, None) => {
                return Err(format!(
                    "volume {id} is not on the share (is the share mounted?)"
                ));
            }
            (_, Some(Backing::Named { staging, share })) => {
                return if source == staging && share_mounted(share, staging) {
                    Ok(())
                } else {
                    Err(format!(
                        "{} is not mounted at {} (a reboot, or it was unmounted)",
                        share.share,
                        staging.display()
                    ))
                };
            }
            (_, Some(Backing::Root(rec))) => self.share.data_path(&rec.id),
        };
        let identity = |p: &Path| std::fs::metadata(p).map(|m| (m.dev(), m.ino())).ok();
        match (identity(source), identity(&data)) {
            (Some(a), Some(b)) if a == b => Ok(()),
            _ => Err(format!(
                "{} is not volume {id}'s directory on the share {} (its bind is gone: the share was not there when it was made again)",
                source.display(),
                data.display()
            )),
        }
    }

    /// What a view of `kind` of volume `id` shows, where it is known: the named share
    /// its stage mounted, or its record on the share root (a secret view's content is
    /// on neither).
    fn backing_of(&self, kind: ViewKind, id: &VolumeHandle) -> Option<Backing> {
        if kind == ViewKind::InlineSecrets {
            return None;
        }
        if kind == ViewKind::Persistent
            && let Some((staging, share)) = self.staged_share(id)
        {
            return Some(Backing::Named { staging, share });
        }
        self.share
            .get(&id.root()?)
            .ok()
            .flatten()
            .map(Backing::Root)
    }

    /// The named share a stage of `id` mounted, and where: from the node's state
    /// alone, never asking a share (which may not answer).
    fn staged_share(&self, id: &VolumeHandle) -> Option<(PathBuf, StagedShare)> {
        let s = self.state().staged.get(id).cloned()?;
        Some((s.staging_path, s.share?))
    }

    /// Gives a native (or acting) volume's root back its owner, group and mode where a
    /// pod changed them (as kubelet's `OnRootMismatch` would for a volume it owns).
    fn keep_native_root(&self, record: Option<&Backing>) {
        let Some(group) = record.and_then(Backing::group) else {
            return;
        };
        match record {
            Some(Backing::Root(rec)) => {
                if let Err(e) = self.share.keep_native_root(rec) {
                    tracing::error!(volume_id = %rec.id, error = %e, "cannot restore the native volume's root");
                }
            }
            Some(Backing::Named { staging, share }) => {
                // An acting volume's root is whoever the server made of the driver
                // when it was made: only its group and mode are given back.
                let owner = (!share.owners).then_some(0);
                let restored = crate::sys::file::open_root(staging).and_then(|fd| {
                    let fd = std::os::fd::AsFd::as_fd(&fd);
                    let st = crate::sys::file::stat(fd)?;
                    crate::share::restore_root(fd, &st, owner, group, share.owners)
                });
                match restored {
                    Ok(Some(was)) => {
                        tracing::warn!(share = %share.share, %was, "a pod changed the volume's root; restored")
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::error!(share = %share.share, error = %e, "cannot restore the volume's root")
                    }
                }
            }
            None => {}
        }
    }

    /// Creates the inline volume `id` on the share unless it exists; returns whether it
    /// was created now. A persistent volume with that id is never handed to a pod.
    fn ensure_inline_volume(&self, id: &VolumeId, size: Option<u64>) -> Result<bool, VolumeError> {
        match self.share.get(id)? {
            Some(rec) if is_inline(&rec) => Ok(false),
            Some(_) => Err(VolumeError::AlreadyExists(format!(
                "volume handle {id} names a persistent volume; an inline volume cannot use it"
            ))),
            None => {
                let spec = VolumeSpec {
                    id: id.clone(),
                    name: id.to_string(),
                    capacity_bytes: size.unwrap_or(super::DEFAULT_CAPACITY),
                    parameters: BTreeMap::from([(INLINE_MARKER.to_string(), "true".to_string())]),
                    native: true,
                };
                self.share.create(&spec)?;
                tracing::info!(volume_id = %id, capacity_bytes = spec.capacity_bytes, "inline volume created");
                Ok(true)
            }
        }
    }

    /// Mounts a private tmpfs for a secret view unless one is there; returns whether it
    /// was mounted now.
    fn ensure_secrets_tmpfs(&self, dir: &Path) -> Result<bool, VolumeError> {
        if mount::health(dir) == Health::Mounted("tmpfs".into()) {
            return Ok(false);
        }
        let internal = |e: &dyn std::fmt::Display| {
            VolumeError::Internal(format!("secrets tmpfs {}: {e}", dir.display()))
        };
        std::fs::create_dir_all(dir).map_err(|e| internal(&e))?;
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(|e| internal(&e))?;
        mount::mount_tmpfs(dir, SECRETS_TMPFS_OPTIONS).map_err(|e| internal(&e))?;
        Ok(true)
    }

    /// Removes what a publish made for an inline view: the inline volume, or the
    /// secrets tmpfs (and with it the secrets).
    fn remove_source(&self, kind: ViewKind, id: &VolumeHandle, source: &Path) {
        match kind {
            ViewKind::Persistent => {}
            ViewKind::InlineShare => {
                let Some(root) = id.root() else { return };
                if let Err(e) = self.share.delete(&root) {
                    tracing::error!(volume_id = %id, error = %e, "cannot delete the inline volume");
                }
            }
            ViewKind::InlineSecrets => {
                if mount::health(source) != Health::NotMounted {
                    let _ = mount::unmount_lazy(source);
                }
                let _ = std::fs::remove_dir(source);
            }
        }
    }

    /// Stops the view at the target and removes the directory publish made; an inline
    /// volume is deleted with it, a secret view's tmpfs unmounted. A target that is not
    /// published is OK (a dead or orphaned view there is cleaned up).
    ///
    /// # Errors
    /// `FailedPrecondition` when the target belongs to another volume, `Aborted`,
    /// `Internal` if it cannot be unmounted.
    pub fn unpublish(&self, id: &VolumeHandle, target: &Path) -> Result<(), VolumeError> {
        let _guard = self.guards.acquire(id.as_str(), "NodeUnpublishVolume")?;
        let existing = self.state().published.get(target).cloned();
        match existing {
            Some(p) if p.volume_id != *id => Err(VolumeError::FailedPrecondition(format!(
                "target_path {} is published for volume {}, not {id}",
                target.display(),
                p.volume_id
            ))),
            Some(p) => {
                p.mechanism.stop(&self.views, target, p.pid)?;
                if p.created_target {
                    let _ = std::fs::remove_dir(target);
                }
                self.remove_source(p.kind, id, &p.source);
                self.update(|st| {
                    st.published.remove(target);
                })?;
                tracing::info!(volume_id = %id, target = %target.display(), "volume unpublished");
                Ok(())
            }
            None => {
                // Left by a state that was lost: clean up a view (live or dead) of ours.
                match mount::health(target) {
                    Health::Dead => self.views.stop(target, None)?,
                    Health::Mounted(t) if t == VIEW_FSTYPE => self.views.stop(target, None)?,
                    _ => {}
                }
                let _ = std::fs::remove_dir(target);
                Ok(())
            }
        }
    }

    /// Applies the capacity the share records to the live volume (the quota limit of
    /// its subvolume) while its views stay mounted, after checking the share really
    /// holds at least `requested` bytes for it. Repeating it is OK.
    ///
    /// The share key (the node-expand secret) is required whenever the call changes
    /// something; a call that changes nothing (the volume already holds its recorded
    /// capacity on this node, or capacity is advisory) succeeds without it, and tells
    /// nothing NodeGetVolumeStats does not (docs/CAPACITY.md). A key that is given must
    /// be the right one.
    ///
    /// # Errors
    /// A missing or wrong share key when something is to change (a wrong one always),
    /// `NotFound` for an unknown volume or a path it is not published or staged at,
    /// `Unavailable` (retried by kubelet) when the share records less than `requested`.
    pub fn expand(
        &self,
        id: &VolumeHandle,
        path: &Path,
        requested: Option<u64>,
        secret: Option<&str>,
    ) -> Result<u64, VolumeError> {
        if let Some((_, share)) = self.staged_share(id) {
            // ControllerExpandVolume did what there was to do (a CephFS quota), and
            // asked nothing of the nodes.
            if !self.is_at(id, path) {
                return Err(VolumeError::NotFound(format!(
                    "volume {id} is not published or staged at {}",
                    path.display()
                )));
            }
            tracing::debug!(volume_id = %id, share = %share.share, "nothing to expand on the node");
            return Ok(requested.unwrap_or(0));
        }
        if secret.is_some() {
            authorize(&self.key, secret, SecretUse::NodeExpand)?;
        }
        let _guard = self.guards.acquire(id.as_str(), "NodeExpandVolume")?;
        let missing = || VolumeError::NotFound(format!("volume {id} does not exist"));
        let rec = self
            .share
            .get(&id.root().ok_or_else(missing)?)?
            .ok_or_else(missing)?;
        if !self.is_at(id, path) {
            return Err(VolumeError::NotFound(format!(
                "volume {id} is not published or staged at {}",
                path.display()
            )));
        }
        if let Some(want) = requested.filter(|w| *w > rec.capacity_bytes) {
            // UNAVAILABLE, a code kubelet retries: FAILED_PRECONDITION would mark the
            // volume with an in-use expansion error and stop node expansion on this
            // node until it is unmounted (kubernetes pkg/volume/csi/expander.go
            // `inUseError`), and INVALID_ARGUMENT / OUT_OF_RANGE / NOT_FOUND are final
            // (`isInfeasibleError`). The share may simply not show the controller's
            // growth yet (a stale read on a network share).
            return Err(VolumeError::Unavailable(format!(
                "the share records {} bytes for volume {id}, less than the {want} asked for; ControllerExpandVolume must grow it first",
                rec.capacity_bytes
            )));
        }
        if self.share.capacity_applied(&rec) {
            return Ok(rec.capacity_bytes);
        }
        if secret.is_none() {
            // Something is to change: the key is required (a given one was checked).
            authorize(&self.key, None, SecretUse::NodeExpand)?;
        }
        self.share.apply_capacity(&rec)?;
        tracing::info!(volume_id = %id, capacity_bytes = rec.capacity_bytes, "capacity applied");
        Ok(rec.capacity_bytes)
    }

    fn is_at(&self, id: &VolumeHandle, path: &Path) -> bool {
        let st = self.state();
        st.published.get(path).is_some_and(|p| p.volume_id == *id)
            || st.staged.get(id).is_some_and(|s| s.staging_path == path)
    }

    /// [`Node::stats`], waiting no longer than `wait` for the share: a share whose
    /// server is away or stalls (an NFS `hard` mount waits for it without end) makes the
    /// volume abnormal, "the share does not answer", and kubelet gets its answer in
    /// time. The measurement goes on in its thread until the share answers; while it
    /// does, another call for the same path does not start one more: it waits for it
    /// to end, within its own `wait`, and measures anew, so that the first call once
    /// the share answers again is normal.
    ///
    /// # Errors
    /// Those of [`Node::stats`].
    pub fn stats_within(
        self: &Arc<Self>,
        id: &VolumeHandle,
        path: &Path,
        wait: Duration,
    ) -> Result<VolumeStats, VolumeError> {
        let unanswered = || {
            let share = match self.staged_share(id) {
                Some((_, share)) => share.share,
                _ => id.root().map_or_else(
                    || "the share".to_string(),
                    |r| self.share.data_path(&r).display().to_string(),
                ),
            };
            tracing::warn!(volume_id = %id, path = %path.display(), %share, "the share does not answer: the volume is abnormal until it does");
            Ok(VolumeStats::abnormal(format!(
                "the share does not answer at {share} (not within {} s: its server is away, or stalls); pods' calls wait on it",
                wait.as_secs_f64()
            )))
        };
        let node = Arc::clone(self);
        let (id2, path2) = (id.clone(), path.to_path_buf());
        self.measuring
            .within(path, wait, true, "measure a volume", move || {
                node.stats(&id2, &path2)
            })
            .unwrap_or_else(unanswered)
    }

    /// Usage of a published (or staged) volume as its pods see it, always in bytes
    /// and inodes: kubelet refuses an answer without usage before it reads the volume
    /// condition (kubernetes pkg/volume/csi/csi_client.go `NodeGetVolumeStats`: "usage
    /// is nil"), so a dead view reports the usage of what it shows (its volume's
    /// directory on the share, or its secrets tmpfs) beside its abnormal condition, and
    /// zeros if even that cannot be measured. A secret
    /// view reports its tmpfs: it has no volume on the share, and kubelet asks for
    /// every CSI mount every stats period.
    ///
    /// # Errors
    /// `NotFound` when the volume does not exist or is not published or staged at `path`.
    pub fn stats(&self, id: &VolumeHandle, path: &Path) -> Result<VolumeStats, VolumeError> {
        let published = self
            .state()
            .published
            .get(path)
            .filter(|p| p.volume_id == *id)
            .cloned();
        let secret_view = published
            .as_ref()
            .is_some_and(|p| p.kind == ViewKind::InlineSecrets);
        if !self.is_at(id, path) {
            return Err(VolumeError::NotFound(format!(
                "volume {id} is not published or staged at {}",
                path.display()
            )));
        }
        let named = self.staged_share(id);
        let missing = || VolumeError::NotFound(format!("volume {id} does not exist"));
        if !secret_view && named.is_none() {
            match self.share.get(&id.root().ok_or_else(missing)?) {
                Ok(Some(_)) => {}
                Ok(None) => {
                    return Err(VolumeError::NotFound(format!("volume {id} does not exist")));
                }
                // A share that answers with an error (a `soft` mount whose server is
                // away: EHOSTDOWN, EIO) makes the volume abnormal, not the call.
                Err(crate::share::ShareError::Io { what, errno }) => {
                    return Ok(VolumeStats::abnormal(format!(
                        "the share fails: {what}: {errno}"
                    )));
                }
                Err(e) => return Err(e.into()),
            }
        }
        let abnormal = match mount::health(path) {
            Health::Dead => Some(format!(
                "the view at {} is not connected (its process ended); publishing again restores it",
                path.display()
            )),
            Health::NotMounted => Some(format!("nothing is mounted at {}", path.display())),
            Health::Mounted(_) => None,
        };
        // What to measure: the view itself while it serves; otherwise what it shows.
        let measured = match (&abnormal, &published) {
            (None, _) => path.to_path_buf(),
            (Some(_), Some(p)) if secret_view => p.source.clone(),
            (Some(_), _) => match (&named, id.root()) {
                (Some((staging, _)), _) => staging.clone(),
                (None, Some(root)) => self.share.data_path(&root),
                (None, None) => return Err(missing()),
            },
        };
        let usage = match crate::sys::file::statvfs_path(&measured) {
            Ok(s) => Some(s),
            // The view passes its share's answer on; a secret view's tmpfs has no
            // share behind it.
            Err(e) if abnormal.is_none() => {
                let failed = format!("statfs of {}: {e}", path.display());
                return Ok(VolumeStats::abnormal(if secret_view {
                    failed
                } else {
                    format!("the share fails: {failed}")
                }));
            }
            Err(e) => {
                tracing::warn!(path = %measured.display(), error = %e, "statfs failed");
                None
            }
        };
        let measured_fs = usage.is_some();
        let (mut bytes, inodes) = match usage {
            Some(s) => {
                let frsize = u64::from(s.frsize);
                (
                    Usage {
                        total: s.blocks * frsize,
                        available: s.bavail * frsize,
                        used: s.blocks.saturating_sub(s.bfree) * frsize,
                    },
                    Usage {
                        total: s.files,
                        available: s.ffree,
                        used: s.files.saturating_sub(s.ffree),
                    },
                )
            }
            None => (Usage::default(), Usage::default()),
        };
        // Where the share enforces the volume's capacity, its bytes are the quota's,
        // whatever serves it: a FUSE view's statfs answers with the quota, but a native
        // view's is the share's file system's (a bind mount's superblock), so kubelet
        // would report the whole share as the volume.
        let quota = match (&named, id.root()) {
            (Some((staging, share)), _) if share.kind == remote::Kind::Cephfs => {
                crate::share::cephfs::limit_bytes(staging)
                    .zip(crate::share::cephfs::used_bytes(staging))
            }
            (Some(_), _) => None,
            (None, Some(root)) => self.share.volume_bytes(&root),
            (None, None) => None,
        };
        if !secret_view && let Some((limit, used)) = quota {
            bytes = Usage {
                total: limit,
                // No more than the file system has left, where it could be measured.
                available: if measured_fs {
                    limit.saturating_sub(used).min(bytes.available)
                } else {
                    limit.saturating_sub(used)
                },
                used,
            };
        }
        Ok(VolumeStats {
            bytes,
            inodes,
            abnormal,
        })
    }
}

/// The share-root volume an inline volume's handle names (kubelet's `csi-<sha256>`).
///
/// # Errors
/// `InvalidArgument` for a handle that cannot name one.
fn inline_id(id: &VolumeHandle) -> Result<VolumeId, VolumeError> {
    id.root().ok_or_else(|| {
        VolumeError::InvalidArgument(format!(
            "volume_id {id:?} cannot name an inline volume on the share root"
        ))
    })
}

/// Whether the named share `share` is what is mounted at `staging`.
fn share_mounted(share: &StagedShare, staging: &Path) -> bool {
    matches!(mount::mount_type(staging), Ok(Some(t)) if share.kind.mount_types().contains(&t.as_str()))
}

/// Says, where the NFS server answers the driver's root as another user
/// (`root_squash`), what that means for the group views of a volume of data already
/// on the export (a static PV's): their daemon reaches only what that user may, so a
/// pod's call on what it may not answers the server's `EACCES`, where kubelet's chown
/// would have let the pod's group reach it. Asked of the share's root with
/// `access(2)`, which the NFS client asks the server: nothing is made or changed.
fn say_if_squashed(staging: &Path, share: &str) {
    let squashed = crate::sys::file::open_root(staging).is_ok_and(|fd| {
        crate::sys::file::may(std::os::fd::AsFd::as_fd(&fd), libc::W_OK)
            == Err(crate::sys::Errno::EACCES)
    });
    if squashed {
        tracing::warn!(%share, "the NFS server answers this node's root as another user (root_squash, or a read-only export): the views of this volume reach only what that user may, and a pod's call on a file or directory it may not answers EACCES, where kubelet's chown would have let the pod's group reach it; export it no_root_squash to this node for that, or give the data's files to a group that user is in");
    }
}

/// Gives the root of the share mounted at `staging` the mode `mode` a PV's
/// `mountPermissions` asks for (csi-driver-nfs chmods its mount's root so), where it
/// has another; says so where it cannot.
fn set_mode(staging: &Path, mode: u32) {
    let set = crate::sys::file::open_root(staging).and_then(|fd| {
        let fd = std::os::fd::AsFd::as_fd(&fd);
        let st = crate::sys::file::stat(fd)?;
        if st.perm != mode {
            crate::sys::file::chmod(fd, mode)?;
        }
        Ok(())
    });
    if let Err(e) = set {
        tracing::warn!(staging = %staging.display(), mode = %format!("{mode:04o}"), error = %e, "cannot give the share's root the mode mountPermissions asks for");
    }
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
