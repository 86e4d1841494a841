//! The keeper: the process that runs the views, apart from the gRPC server. In a
//! DaemonSet it is a container of its own, so that the server's container can crash,
//! be OOM-killed or restarted without touching a view (their PID namespaces differ:
//! a container's death kills only its own processes). A keeper that starts takes over
//! every view another keeper at its own socket started (the old pod of a rolling
//! update, an older binary; never a view mounted by hand or another driver's), live,
//! through each view's control socket (`transport/handover.rs`): after an update, the
//! new binary serves every view and nothing was unmounted. A keeper told
//! to stop while a newer keeper has its socket's name asks that one to take over what
//! it still runs.
//!
//! The driver talks to it over a unix socket in a root-only directory (`wire` frames;
//! only uid 0 is answered): start a view, ask whether a view it started still runs.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::{Transport, ViewOptions};
use crate::sys::cgroup::Cgroup;
use crate::sys::fdpass;
use crate::sys::signal::TerminationSignals;
use crate::transport::handover::{self, INSTANCE_ENV};
use crate::wire::{NamedSocket, read_frame, write_frame};

mod client;
mod watch;

pub use client::{KeeperClient, ask, probe};
use watch::Watch;

/// Where the keeper listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/mountgroup/keeper.sock";

/// How long a takeover of one view may take before the keeper gives up on it (the old
/// keeper's view then goes on serving).
const ADOPT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a keeper that stops waits for its views to be taken over.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(60);
/// At most this many recoveries of one view in [`RECOVERY_WINDOW`]: a view that dies
/// again at once every time (a bug its state triggers) is let go rather than looped.
const MAX_RECOVERIES: usize = 3;
const RECOVERY_WINDOW: Duration = Duration::from_secs(60);

/// The environment a keeper gives the views it runs: its socket, and whether the view
/// recovers one whose process died.
pub const SOCKET_ENV: &str = handover::KEEPER_SOCKET_ENV;
pub const RECOVER_ENV: &str = "MOUNTGROUP_RECOVER";

/// What the keeper is asked.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// Hold the connection and journal of the view on `mountpoint` (two descriptors
    /// follow the frame), started as `instance`.
    Hold {
        mountpoint: PathBuf,
        instance: String,
    },
    /// Give the connection and journal held for `mountpoint` (to the process that
    /// recovers it; two descriptors follow the answer).
    Recover { mountpoint: PathBuf },
    /// Run `mountgroup ARGS...`; `ARGS` must start with `mount`.
    Start { args: Vec<OsString> },
    /// Whether the view the keeper started as `pid` still runs.
    Status { pid: u32 },
    /// Take over every view another keeper started.
    Adopt,
    /// Answered once the keeper has taken over the views that were there when it
    /// started (its readiness).
    Ready,
}

/// What the keeper answers.
#[derive(Debug, Serialize, Deserialize)]
pub enum Response {
    Started {
        pid: u32,
    },
    Running,
    /// The view exited, with its exit code (none when a signal ended it).
    Exited {
        code: Option<i32>,
    },
    /// No view of this keeper had that pid.
    Unknown,
    /// Views taken over, and the ones that could not be, with why.
    Adopted {
        taken: usize,
        failed: Vec<String>,
    },
    Ready,
    NotReady,
    Held,
    Recover,
    Refused(String),
}

/// What the keeper holds of one view: its connection (so that the view's death does
/// not end it) and its journal.
struct Hold {
    instance: String,
    dev: OwnedFd,
    journal: OwnedFd,
    /// The process started to recover it, if one was.
    recovery: Option<u32>,
}

/// A view the keeper started.
struct ChildView {
    instance: String,
    args: Vec<OsString>,
    /// `None` while running; then the exit code (`None` inside: a signal ended it).
    exit: Option<Option<i32>>,
    /// The cgroup it runs in, with `--views-cgroup`.
    cgroup: Option<Cgroup>,
}

impl ChildView {
    /// The mountpoint of a `mount SOURCE MOUNTPOINT ...` view.
    fn mountpoint(&self) -> Option<&Path> {
        self.args.get(2).map(Path::new)
    }

    /// Whether a successor can take this view over: not a view served over io_uring
    /// (`-o transport=ring`). A ring's entries belong to the process that registered
    /// them: Linux (6.14 to 6.18) has no command to give them back, `fuse_uring_cancel`
    /// (fs/fuse/dev_uring.c) releases only idle ones when that process goes, and
    /// `fuse_resend` (fs/fuse/dev.c) does not walk ring queues (docs/ARCHITECTURE.md,
    /// *What FUSE over io_uring would need*). Such a view binds no control socket; it
    /// runs on its own until its target is unmounted.
    fn can_be_handed_over(&self) -> bool {
        let options = self
            .args
            .windows(2)
            .find(|w| w[0] == "-o")
            .map(|w| w[1].to_string_lossy());
        !options
            .is_some_and(|o| ViewOptions::parse(&o).is_ok_and(|v| v.transport == Transport::Ring))
    }
}

/// Where and how the keeper runs.
#[derive(Clone, Debug)]
pub struct KeeperConfig {
    pub socket: PathBuf,
    /// The views' control directory, where it finds views to take over.
    pub control_dir: PathBuf,
    /// The binary that serves views (this one).
    pub binary: PathBuf,
    /// A cgroup v2 directory outside the keeper's container in which each view gets a
    /// cgroup of its own (`--views-cgroup`); `None`: views share the keeper's.
    pub views_cgroup: Option<PathBuf>,
    /// Each view's memory bound (`memory.max` of its cgroup).
    pub view_memory_max: Option<u64>,
    /// A view that answers no request for this long is replaced like a dead one;
    /// `None`: never.
    pub hang_timeout: Option<Duration>,
}

impl KeeperConfig {
    /// A keeper at `socket` that finds views in `control_dir` and runs them with
    /// `binary`: views in its own cgroup, unbounded, replaced after
    /// [`DEFAULT_HANG_TIMEOUT`] without an answer.
    pub fn new(socket: PathBuf, control_dir: PathBuf, binary: PathBuf) -> KeeperConfig {
        KeeperConfig {
            socket,
            control_dir,
            binary,
            views_cgroup: None,
            view_memory_max: None,
            hang_timeout: Some(DEFAULT_HANG_TIMEOUT),
        }
    }
}

/// How long a view may leave a request of the keeper's unanswered before it counts as
/// hung. Far above any answer a working view gives (a lookup of a reserved name, which
/// touches no disk, queued behind whatever the pods asked), and far below the minutes a
/// stopped view blocks `umount` and every `sync()` on the node.
pub const DEFAULT_HANG_TIMEOUT: Duration = Duration::from_secs(30);

/// An empty view cgroup is removed only once it is this old: until its view has joined
/// it, a cgroup another keeper just made is empty too.
const SWEEP_AFTER: Duration = Duration::from_secs(60);

/// The name a liveness check of a view looks up: reserved (`fs/ops/namespace.rs`), so
/// the view answers `ENOENT` without touching its backing file system, and never cached
/// (Linux fs/fuse/dir.c `fuse_lookup`: an `ENOENT` error answer leaves a negative
/// dentry with its time set to 0 by `fuse_invalidate_entry_cache`, so
/// `fuse_dentry_revalidate` asks again), so each check is a request.
const ALIVE_NAME: &str = ".mountgroup.alive";

struct Keeper {
    cfg: KeeperConfig,
    /// This keeper's name; each view it starts gets `<instance>-<n>` in
    /// [`INSTANCE_ENV`].
    instance: String,
    next: AtomicU64,
    /// Views started, by pid.
    children: Mutex<HashMap<u32, ChildView>>,
    /// What it holds, by mountpoint.
    holds: Mutex<HashMap<PathBuf, Hold>>,
    /// When each mountpoint's view was last recovered.
    recoveries: Mutex<HashMap<PathBuf, Vec<Instant>>>,
    ready: AtomicBool,
    /// One adoption at a time.
    adopting: Mutex<()>,
    /// The parent of the views' cgroups, with `--views-cgroup`.
    cgroups: Option<Cgroup>,
    /// Liveness checks under way, by mountpoint: which process is judged, and since when
    /// it has answered nothing while waiting on nothing but itself ([`judge`]).
    checks: Mutex<HashMap<PathBuf, Watch>>,
    /// Views whose check went unanswered past the hang timeout while they waited on
    /// their share: left serving, and said once, until they answer again.
    waiting: Mutex<std::collections::HashSet<PathBuf>>,
    /// The FUSE protocol minor this kernel's INIT offers (asked once, at start), which
    /// each view it starts is told ([`handover::FUSE_MINOR_ENV`]): whether a view's
    /// workers may read the connection the keeper holds depends on whether the kernel
    /// can resend what a dead view read (`FUSE_NOTIFY_RESEND`).
    fuse_minor: Option<u32>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Keeper {
    fn owns(&self, instance: &str) -> bool {
        instance
            .strip_prefix(self.instance.as_str())
            .is_some_and(|rest| rest.starts_with('-'))
    }

    /// Whether a view in the control directory is one to take over: started by another
    /// keeper at this keeper's socket (a predecessor: the old pod of a rolling update,
    /// an older binary). A view mounted by hand (no keeper instance) stays with its
    /// process, and so does a view of another driver's keeper that shares the control
    /// directory. A view of a version that did not say its keeper's socket, but was
    /// started by a keeper, is taken over as before.
    fn adopts(&self, d: &handover::Description) -> bool {
        if d.instance.is_empty() || self.owns(&d.instance) {
            return false;
        }
        match &d.keeper {
            Some(socket) if *socket != self.cfg.socket => {
                tracing::debug!(view = d.pid, keeper = %socket.display(), "a view of another keeper; left to it");
                false
            }
            _ => true,
        }
    }

    /// Starts `binary ARGS...` as a view of this keeper, in its own process group, and
    /// reaps it when it ends.
    fn spawn(&'static self, args: &[OsString]) -> io::Result<(u32, String)> {
        self.spawn_view(args, false)
    }

    fn spawn_view(&'static self, args: &[OsString], recover: bool) -> io::Result<(u32, String)> {
        if args.first().map(OsString::as_os_str) != Some("mount".as_ref()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a keeper runs views only (`mount ...`)",
            ));
        }
        let id = format!(
            "{}-{}",
            self.instance,
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        // A view points its standard error at its --log-file itself.
        let mut cmd = Command::new(&self.cfg.binary);
        let cgroup = self.view_cgroup(&id, &mut cmd)?;
        cmd.args(args)
            .env(INSTANCE_ENV, &id)
            .env(SOCKET_ENV, &self.cfg.socket)
            .env_remove(RECOVER_ENV)
            .env_remove(handover::FUSE_MINOR_ENV);
        if let Some(minor) = self.fuse_minor {
            cmd.env(handover::FUSE_MINOR_ENV, minor.to_string());
        }
        if recover {
            cmd.env(RECOVER_ENV, "1");
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) => {
                if let Some(cg) = &cgroup {
                    let _ = cg.remove();
                }
                return Err(e);
            }
        };
        let pid = child.id();
        lock(&self.children).insert(
            pid,
            ChildView {
                instance: id.clone(),
                args: args.to_vec(),
                exit: None,
                cgroup,
            },
        );
        std::thread::Builder::new()
            .name(format!("keeper-reaper-{pid}"))
            .spawn(move || self.reap(pid, child))?;
        Ok((pid, id))
    }

    /// The cgroup of a new view `id` (under the keeper's, where it has one), which
    /// `cmd` joins between fork and exec, its memory bounded as configured.
    fn view_cgroup(&self, id: &str, cmd: &mut Command) -> io::Result<Option<Cgroup>> {
        let Some(parent) = &self.cgroups else {
            return Ok(None);
        };
        let cg = parent.child(&format!("view-{id}")).map_err(|e| {
            io::Error::other(format!(
                "cannot make the view's cgroup under {}: {e}",
                parent.path().display()
            ))
        })?;
        if let Some(max) = self.cfg.view_memory_max
            && let Err(e) = cg.set_memory_max(max)
        {
            tracing::warn!(cgroup = %cg.path().display(), error = %e, "cannot bound the view's memory");
        }
        cg.spawn_into(cmd)
            .map_err(|e| io::Error::other(format!("cgroup {}: {e}", cg.path().display())))?;
        Ok(Some(cg))
    }

    /// Waits for the view `pid` to end, on a thread of its own, and says so
    /// ([`Keeper::ended`]), its cgroup removed.
    fn reap(&'static self, pid: u32, mut child: std::process::Child) {
        let status = child.wait().ok();
        let code = status.and_then(|s| s.code());
        let (instance, args) = {
            let mut children = lock(&self.children);
            let Some(c) = children.get_mut(&pid) else {
                return;
            };
            c.exit = Some(code);
            if let Some(cg) = &c.cgroup {
                let _ = cg.remove();
            }
            (c.instance.clone(), c.args.clone())
        };
        self.ended(pid, &instance, &args, code);
    }

    /// A view ended, with exit `code` (`None`: killed by a signal). A clean end
    /// (unmounted, or handed to a successor) lets go of what was held for it. A crash of
    /// a view whose connection is held starts a process that recovers it from its
    /// journal; a recovery that fails lets go too, and the connection ends (the driver
    /// then serves the target again, as after any dead mount). A process killed while
    /// it recovers is a crash like any other: until it has handed the keeper its own
    /// connection and journal it served nothing, so what is held is still what it was
    /// recovering from.
    fn ended(&'static self, pid: u32, instance: &str, args: &[OsString], code: Option<i32>) {
        let clean = code == Some(0);
        let mut holds = lock(&self.holds);
        let own = holds
            .iter()
            .find(|(_, h)| h.instance == instance)
            .map(|(m, _)| m.clone());
        let recovered_by_it = holds
            .iter()
            .find(|(_, h)| h.recovery == Some(pid))
            .map(|(m, _)| m.clone());
        if clean {
            if let Some(m) = own {
                holds.remove(&m);
            }
            return;
        }
        let own = match (recovered_by_it, code) {
            (Some(m), Some(_)) => {
                tracing::error!(mountpoint = %m.display(), pid, "recovering the view failed; its mount ends (the driver serves the target again)");
                holds.remove(&m);
                return;
            }
            (Some(m), None) => {
                tracing::warn!(mountpoint = %m.display(), pid, "the process recovering the view was killed");
                Some(m)
            }
            (None, _) => own,
        };
        let Some(m) = own else {
            tracing::warn!(pid, "a view ended badly; nothing was held for it");
            return;
        };
        {
            let mut recoveries = lock(&self.recoveries);
            let recent = recoveries.entry(m.clone()).or_default();
            recent.retain(|at| at.elapsed() < RECOVERY_WINDOW);
            if recent.len() >= MAX_RECOVERIES {
                tracing::error!(mountpoint = %m.display(), recoveries = recent.len(), "the view keeps dying; not recovering it again: its mount ends (the driver serves the target again)");
                holds.remove(&m);
                return;
            }
            recent.push(Instant::now());
        }
        match self.spawn_view(args, true) {
            Ok((rpid, _)) => {
                tracing::warn!(mountpoint = %m.display(), dead = pid, recovery = rpid, "a view died; recovering it on its connection");
                if let Some(h) = holds.get_mut(&m) {
                    h.recovery = Some(rpid);
                }
            }
            Err(e) => {
                tracing::error!(mountpoint = %m.display(), error = %e, "cannot start a process to recover a dead view");
                holds.remove(&m);
            }
        }
    }

    /// Takes over every view in the control directory that another keeper started,
    /// one after the other: a successor process with the same arguments, which the
    /// serving view hands itself to.
    fn adopt(&'static self) -> (usize, Vec<String>) {
        let _one = lock(&self.adopting);
        let mut taken = 0;
        let mut failed = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.cfg.control_dir) else {
            return (0, failed);
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("sock") {
                continue;
            }
            // A socket no view answers on belongs to a view that died.
            let Ok(d) = handover::describe(&path) else {
                continue;
            };
            if !self.adopts(&d) {
                continue;
            }
            match self.take_over(&path, &d) {
                Ok(()) => taken += 1,
                Err(e) => {
                    tracing::error!(socket = %path.display(), error = %e, "cannot take a view over; it stays with its process");
                    failed.push(format!("{}: {e}", path.display()));
                }
            }
        }
        (taken, failed)
    }

    fn take_over(&'static self, socket: &Path, d: &handover::Description) -> io::Result<()> {
        let (pid, id) = self.spawn(&d.args)?;
        let deadline = Instant::now() + ADOPT_TIMEOUT;
        loop {
            if handover::describe(socket).is_ok_and(|now| now.instance == id) {
                tracing::info!(
                    socket = %socket.display(),
                    from = %d.binary.display(),
                    pid,
                    "view taken over"
                );
                return Ok(());
            }
            if let Some(code) = lock(&self.children).get(&pid).and_then(|c| c.exit) {
                return Err(io::Error::other(format!(
                    "the successor exited with {code:?} (its view log says why)"
                )));
            }
            if Instant::now() > deadline {
                return Err(io::Error::other("no takeover within 30 s"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn answer(&'static self, stream: &UnixStream) -> io::Result<()> {
        match fdpass::peer(stream.as_fd()) {
            Ok(p) if p.uid == 0 => {}
            Ok(p) => {
                tracing::warn!(
                    uid = p.uid,
                    "keeper request from a non-root process refused"
                );
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
        let response = match read_frame(stream)? {
            Request::Start { args } => match self.spawn(&args) {
                Ok((pid, _)) => Response::Started { pid },
                Err(e) => Response::Refused(e.to_string()),
            },
            Request::Status { pid } => match lock(&self.children).get(&pid).map(|c| c.exit) {
                None => Response::Unknown,
                Some(None) => Response::Running,
                Some(Some(code)) => Response::Exited { code },
            },
            Request::Hold {
                mountpoint,
                instance,
            } => {
                let (_, mut fds) = fdpass::recv_fds(stream.as_fd())?;
                if fds.len() != 2 {
                    Response::Refused("a hold carries a connection and a journal".into())
                } else {
                    let journal = fds.pop().expect("two");
                    let dev = fds.pop().expect("two");
                    tracing::debug!(mountpoint = %mountpoint.display(), %instance, "holding a view's connection");
                    lock(&self.holds).insert(
                        mountpoint,
                        Hold {
                            instance,
                            dev,
                            journal,
                            recovery: None,
                        },
                    );
                    Response::Held
                }
            }
            Request::Recover { mountpoint } => {
                let fds = lock(&self.holds).get(&mountpoint).map(|h| {
                    (
                        crate::sys::fuse::dup(h.dev.as_fd()),
                        crate::sys::fuse::dup(h.journal.as_fd()),
                    )
                });
                match fds {
                    Some((Ok(dev), Ok(journal))) => {
                        write_frame(stream, &Response::Recover)?;
                        return fdpass::send_fds(
                            stream.as_fd(),
                            b'F',
                            &[dev.as_fd(), journal.as_fd()],
                        )
                        .map_err(io::Error::from);
                    }
                    Some(_) => Response::Refused("cannot duplicate the held descriptors".into()),
                    None => Response::Refused(format!("nothing held for {}", mountpoint.display())),
                }
            }
            Request::Adopt => {
                let (taken, failed) = self.adopt();
                Response::Adopted { taken, failed }
            }
            Request::Ready => {
                if self.ready.load(Ordering::Acquire) {
                    Response::Ready
                } else {
                    Response::NotReady
                }
            }
        };
        write_frame(stream, &response)
    }

    fn running(&self) -> usize {
        lock(&self.children)
            .values()
            .filter(|c| c.exit.is_none())
            .count()
    }

    /// The running views a successor can take over (and so a keeper that stops waits
    /// for).
    fn running_handed_over(&self) -> usize {
        lock(&self.children)
            .values()
            .filter(|c| c.exit.is_none() && c.can_be_handed_over())
            .count()
    }

    /// The mountpoints of running views no successor can take over.
    fn not_handed_over(&self) -> Vec<PathBuf> {
        lock(&self.children)
            .values()
            .filter(|c| c.exit.is_none() && !c.can_be_handed_over())
            .filter_map(|c| c.mountpoint().map(Path::to_path_buf))
            .collect()
    }
}

impl KeeperClient {
    /// The keeper that started this process, if one did.
    pub fn from_env() -> Option<KeeperClient> {
        let socket = std::env::var_os(SOCKET_ENV)?;
        Some(KeeperClient {
            socket: socket.into(),
            recover: std::env::var_os(RECOVER_ENV).is_some(),
        })
    }
}

/// Runs the keeper until SIGINT or SIGTERM: takes the socket's name, takes over the
/// views other keepers started, then answers. On a signal, a keeper whose name a newer
/// keeper has taken asks it to take over its views and waits (up to a minute) until
/// those it can take are gone (a ring view, which no successor can take, is left
/// running without a wait); a keeper with no successor leaves its views running (they
/// are processes of their own; in a container they end with it).
///
/// # Errors
/// The error of binding the socket.
pub fn run(cfg: KeeperConfig) -> io::Result<()> {
    if cfg.views_cgroup.is_none() {
        tracing::warn!(
            "no --views-cgroup: the views run in this keeper's cgroup and PID namespace, and a kill of its container (or an OOM kill of its group) ends every view on the node (docs/DEPLOY.md, *Views outlive the keeper*)"
        );
    }
    // Before any thread: its children inherit the cgroup namespace it may join.
    let cgroups = views_cgroup(&cfg)?;
    let signals = TerminationSignals::block()?;
    let (keeper, socket) = start_with(cfg, cgroups)?;
    let sig = signals.wait()?;
    tracing::info!(signal = crate::sys::signal::name(sig), "keeper stopping");
    if socket.owns_name() {
        socket.remove();
        tracing::info!(
            views = keeper.running(),
            "no newer keeper: the views keep running on their own"
        );
        return Ok(());
    }
    match ask(&keeper.cfg.socket, &Request::Adopt) {
        Ok(Response::Adopted { taken, failed }) => {
            tracing::info!(taken, failed = failed.len(), "the newer keeper took over");
        }
        Ok(other) => tracing::warn!(answer = ?other, "the newer keeper did not take over"),
        Err(e) => tracing::warn!(error = %e, "cannot reach the newer keeper"),
    }
    for m in keeper.not_handed_over() {
        tracing::info!(mountpoint = %m.display(), "a view over io_uring cannot be handed over; it keeps running on its own until its target is unmounted");
    }
    // Only what a successor can take is waited for: a ring view would hold the old
    // pod for its whole grace period and then be left all the same.
    let deadline = Instant::now() + LEAVE_TIMEOUT;
    while keeper.running_handed_over() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    tracing::info!(
        left = keeper.running_handed_over(),
        on_their_own = keeper.not_handed_over().len(),
        "keeper stopped"
    );
    Ok(())
}

/// A keeper inside this process (`serve` without `--keeper-socket`): the same keeper,
/// so that the views of a driver that runs them itself are recovered when they die,
/// replaced when they hang, and taken over by the next driver, as under a keeper
/// container. Returns once it has taken over the views another process ran, and runs
/// until the process exits (its views then run on, and the next driver's keeper takes
/// them over).
///
/// # Errors
/// The error of binding the socket or of `--views-cgroup`.
pub fn start_embedded(cfg: KeeperConfig) -> io::Result<()> {
    let cgroups = views_cgroup(&cfg)?;
    start_with(cfg, cgroups).map(|_| ())
}

/// Binds the socket, answers on it, watches the views, and takes over those another
/// keeper ran; then ready.
fn start_with(
    cfg: KeeperConfig,
    cgroups: Option<Cgroup>,
) -> io::Result<(&'static Keeper, Arc<NamedSocket>)> {
    if let Some(dir) = cfg.socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let fuse_minor = match cfg.socket.parent().map(crate::transport::probe::probe) {
        Some(Ok(k)) => Some(k.minor),
        Some(Err(e)) => {
            tracing::warn!(error = %e, "cannot ask which FUSE protocol this kernel speaks: a view that dies fails the requests it was answering rather than having them resent");
            None
        }
        None => None,
    };
    // Lives as long as the process: its threads hold it.
    let keeper: &'static Keeper = Box::leak(Box::new(Keeper {
        fuse_minor,
        instance: random_instance(),
        cfg,
        next: AtomicU64::new(0),
        children: Mutex::new(HashMap::new()),
        holds: Mutex::new(HashMap::new()),
        recoveries: Mutex::new(HashMap::new()),
        ready: AtomicBool::new(false),
        adopting: Mutex::new(()),
        cgroups,
        checks: Mutex::new(HashMap::new()),
        waiting: Mutex::new(std::collections::HashSet::new()),
    }));
    let socket = Arc::new(NamedSocket::bind(&keeper.cfg.socket)?);
    tracing::info!(socket = %keeper.cfg.socket.display(), instance = %keeper.instance, "keeper listening");
    {
        let socket = Arc::clone(&socket);
        std::thread::Builder::new()
            .name("keeper-accept".into())
            .spawn(move || {
                for stream in socket.listener.incoming().flatten() {
                    let _ = std::thread::Builder::new()
                        .name("keeper-request".into())
                        .spawn(move || {
                            if let Err(e) = keeper.answer(&stream) {
                                tracing::debug!(error = %e, "keeper request not answered");
                            }
                        });
                }
            })?;
    }
    std::thread::Builder::new()
        .name("keeper-watch".into())
        .spawn(|| keeper.watch())?;
    let (taken, failed) = keeper.adopt();
    keeper.ready.store(true, Ordering::Release);
    tracing::info!(taken, failed = failed.len(), "keeper ready");
    Ok((keeper, socket))
}

/// The parent of the views' cgroups (`--views-cgroup`), made ready: this process joins
/// the node's cgroup namespace (a container's own hides every cgroup outside it), the
/// directory is made if needed and must be cgroup v2, the memory controller is given to
/// its children when views are bounded, and cgroups of views that are gone are removed.
/// Without `--views-cgroup`, says what the views' fate then is.
fn views_cgroup(cfg: &KeeperConfig) -> io::Result<Option<Cgroup>> {
    let Some(path) = &cfg.views_cgroup else {
        if cfg.view_memory_max.is_some() {
            tracing::warn!("--view-memory-max needs --views-cgroup; views are not bounded");
        }
        return Ok(None);
    };
    let err = |what: String| io::Error::other(format!("--views-cgroup {}: {what}", path.display()));
    use crate::sys::cgroup::{NamespaceJoin, join_init_cgroup_namespace};
    match join_init_cgroup_namespace() {
        Ok(NamespaceJoin::Joined) => tracing::info!("joined the node's cgroup namespace"),
        Ok(NamespaceJoin::Same) => {}
        Ok(NamespaceJoin::Hidden(e)) => {
            tracing::warn!(error = %e, "pid 1's cgroup namespace cannot be read: staying in this one (on a hierarchy mounted with nsdelegate, views then cannot leave this container's cgroup; set the pod's hostPID)")
        }
        Err(e) => {
            return Err(err(format!(
                "cannot join the node's cgroup namespace (is the pod's hostPID set?): {e}"
            )));
        }
    }
    // The host's first process is its init, never a keeper: a keeper with pid 1 is in a
    // PID namespace of its own, whose end kills every process in it, cgroup or not.
    if std::process::id() == 1 {
        return Err(err(
            "this keeper is the first process of a PID namespace of its own, which kills every view it starts when it ends: run it in the host's (the pod's hostPID)".into(),
        ));
    }
    if let Some(parent) = path.parent() {
        Cgroup::open(parent).map_err(|e| {
            err(format!(
                "its parent is not a cgroup v2 directory ({e}): mount the node's cgroup2 hierarchy there"
            ))
        })?;
    }
    std::fs::create_dir_all(path).map_err(|e| err(e.to_string()))?;
    let cg = Cgroup::open(path).map_err(|e| err(format!("not a cgroup v2 directory: {e}")))?;
    if cfg.view_memory_max.is_some() {
        if let Err(e) = cg.delegate("memory") {
            tracing::warn!(cgroup = %path.display(), error = %e, controllers = ?cg.controllers(), "the memory controller is not available here: --view-memory-max does not bound the views (docs/DEPLOY.md)");
        }
    }
    for child in cg.children() {
        if child.age().is_some_and(|a| a >= SWEEP_AFTER) && !child.populated() {
            let _ = child.remove();
        }
    }
    tracing::info!(cgroup = %path.display(), "each view runs in a cgroup of its own here");
    Ok(Some(cg))
}

fn random_instance() -> String {
    format!("{:016x}", crate::sys::process::random_u128() as u64)
}

#[cfg(test)]
mod tests {
    use super::watch::*;
    use super::*;
    use crate::sys::process::Waiting;

    /// What a test's view is asked when it must not be: within its timeout.
    fn never() -> Waiting {
        panic!("asked what a view waits on within the timeout")
    }

    /// A check of process `pid`, quiet since `t0`.
    fn watching(pid: u32, t0: Instant) -> Watch {
        Watch {
            pid,
            quiet: Quiet::Since(t0),
        }
    }

    /// Judges process `pid` in rounds `(ms after t0, what it is found waiting on if
    /// asked, the judgement)`: `None`, it must not be asked.
    fn play(
        w: &mut Watch,
        pid: u32,
        t0: Instant,
        timeout: Duration,
        rounds: &[(u64, Option<Waiting>, Judgement)],
    ) {
        for (ms, found, want) in rounds {
            let now = t0 + Duration::from_millis(*ms);
            let judged = judge(w, pid, now, timeout, || found.unwrap_or_else(never));
            assert_eq!(&judged, want, "at {ms} ms");
        }
    }

    #[test]
    fn a_view_is_hung_only_after_a_whole_timeout_without_waiting_on_its_share() {
        use Judgement::{Hung, Patience, WaitsOnShare};
        let timeout = Duration::from_secs(1);
        let t0 = Instant::now();
        let (share, elsewhere) = (Some(Waiting::OnFileSystem), Some(Waiting::Elsewhere));
        let mut w = watching(1, t0);
        play(
            &mut w,
            1,
            t0,
            timeout,
            &[
                (900, None, Patience),
                // Waiting on its share: left serving, and asked again every round.
                (1100, share, WaitsOnShare),
                (1350, share, WaitsOnShare),
                (1600, share, WaitsOnShare),
                (5000, share, WaitsOnShare),
                // The share answers; the view works off its callers' queue and has not yet
                // answered the check. The first round that finds it no longer waiting
                // starts its timeout: not hung a round later, nor just short of the timeout.
                (5250, elsewhere, Patience),
                (5500, None, Patience),
                (6200, None, Patience),
                // A whole timeout later, still quiet and waiting on nothing: hung, once.
                (6300, elsewhere, Hung("it waits on no file system")),
                (60_000, None, Patience),
            ],
        );

        // Waiting on its share again after a pause: left serving again.
        let mut w = watching(1, t0);
        play(
            &mut w,
            1,
            t0,
            timeout,
            &[
                (1100, share, WaitsOnShare),
                (1350, elsewhere, Patience),
                (2400, share, WaitsOnShare),
            ],
        );

        let mut w = watching(1, t0);
        let stopped = Some(Waiting::Stopped);
        play(
            &mut w,
            1,
            t0,
            timeout,
            &[(1100, stopped, Hung("it is stopped"))],
        );
    }

    #[test]
    fn a_recovered_view_is_judged_from_its_own_start_not_by_its_dead_predecessors_silence() {
        use Judgement::{Hung, Patience};
        // The check began while process 1 served; it died (or was killed) and the check's
        // lookup now waits for process 2, which recovers the view. Process 2 serves from
        // the round that first sees it, 4 s later: it has a whole timeout from there.
        let timeout = Duration::from_secs(2);
        let t0 = Instant::now();
        let mut w = watching(1, t0);
        let since_4000 = watching(2, t0 + Duration::from_millis(4000));
        for ms in [4000, 4500, 6000] {
            play(&mut w, 2, t0, timeout, &[(ms, None, Patience)]);
            assert_eq!(w, since_4000, "at {ms} ms");
        }
        // A whole timeout of its own without an answer: hung.
        let hung = Hung("it waits on no file system");
        play(
            &mut w,
            2,
            t0,
            timeout,
            &[(6100, Some(Waiting::Elsewhere), hung)],
        );
        // Its successor in turn starts afresh, even though 2 was taken for hung.
        play(
            &mut w,
            3,
            t0,
            timeout,
            &[(6400, None, Patience), (8300, None, Patience)],
        );
    }
}
