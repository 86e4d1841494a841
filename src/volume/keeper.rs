//! The keeper: the process that runs the views, apart from the gRPC server. In a
//! DaemonSet it is a container of its own, so that the server's container can crash,
//! be OOM-killed or restarted without touching a view (their PID namespaces differ:
//! a container's death kills only its own processes). A keeper that starts takes over
//! every view another keeper started (the old pod of a rolling update, an older
//! binary), live, through each view's control socket (`fs/handover.rs`): after an
//! update, the new binary serves every view and nothing was unmounted. A keeper told
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

use crate::fs::handover::{self, INSTANCE_ENV};
use crate::sys::fdpass;
use crate::sys::signal::TerminationSignals;
use crate::wire::{NamedSocket, read_frame, write_frame};

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
pub const SOCKET_ENV: &str = "MOUNTGROUP_KEEPER_SOCKET";
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
}

/// Where and how the keeper runs.
#[derive(Clone, Debug)]
pub struct KeeperConfig {
    pub socket: PathBuf,
    /// The views' control directory, where it finds views to take over.
    pub control_dir: PathBuf,
    /// The binary that serves views (this one).
    pub binary: PathBuf,
}

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
        cmd.args(args)
            .env(INSTANCE_ENV, &id)
            .env(SOCKET_ENV, &self.cfg.socket)
            .env_remove(RECOVER_ENV);
        if recover {
            cmd.env(RECOVER_ENV, "1");
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        let pid = child.id();
        lock(&self.children).insert(
            pid,
            ChildView {
                instance: id.clone(),
                args: args.to_vec(),
                exit: None,
            },
        );
        std::thread::Builder::new()
            .name(format!("keeper-reaper-{pid}"))
            .spawn(move || {
                let status = child.wait().ok();
                let code = status.and_then(|s| s.code());
                let (instance, args) = {
                    let mut children = lock(&self.children);
                    let Some(c) = children.get_mut(&pid) else {
                        return;
                    };
                    c.exit = Some(code);
                    (c.instance.clone(), c.args.clone())
                };
                self.ended(pid, &instance, &args, code == Some(0));
            })?;
        Ok((pid, id))
    }

    /// A view ended. A clean end (unmounted, or handed to a successor) lets go of what
    /// was held for it. A crash of a view whose connection is held starts a process
    /// that recovers it from its journal; a recovery that fails lets go too, and the
    /// connection ends (the driver then serves the target again, as after any dead
    /// mount).
    fn ended(&'static self, pid: u32, instance: &str, args: &[OsString], clean: bool) {
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
        if let Some(m) = recovered_by_it {
            tracing::error!(mountpoint = %m.display(), pid, "recovering the view failed; its mount ends (the driver serves the target again)");
            holds.remove(&m);
            return;
        }
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
            if self.owns(&d.instance) {
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
}

/// A view's line to the keeper that started it (`MOUNTGROUP_KEEPER_SOCKET`).
pub struct KeeperClient {
    pub socket: PathBuf,
    pub recover: bool,
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

impl handover::Holder for KeeperClient {
    fn recovering(&self) -> bool {
        self.recover
    }

    fn hold(
        &self,
        mountpoint: &Path,
        dev: BorrowedFd<'_>,
        journal: BorrowedFd<'_>,
    ) -> io::Result<()> {
        let stream = UnixStream::connect(&self.socket)?;
        let request = Request::Hold {
            mountpoint: mountpoint.to_path_buf(),
            instance: std::env::var(INSTANCE_ENV).unwrap_or_default(),
        };
        write_frame(&stream, &request)?;
        fdpass::send_fds(stream.as_fd(), b'F', &[dev, journal])?;
        match read_frame(&stream)? {
            Response::Held => Ok(()),
            other => Err(io::Error::other(format!("the keeper answered {other:?}"))),
        }
    }

    fn recover(&self, mountpoint: &Path) -> io::Result<(OwnedFd, OwnedFd)> {
        let stream = UnixStream::connect(&self.socket)?;
        write_frame(
            &stream,
            &Request::Recover {
                mountpoint: mountpoint.to_path_buf(),
            },
        )?;
        match read_frame(&stream)? {
            Response::Recover => {}
            Response::Refused(why) => return Err(io::Error::new(io::ErrorKind::NotFound, why)),
            other => return Err(io::Error::other(format!("the keeper answered {other:?}"))),
        }
        let (_, mut fds) = fdpass::recv_fds(stream.as_fd())?;
        match (fds.len(), fds.pop(), fds.pop()) {
            (2, Some(journal), Some(dev)) => Ok((dev, journal)),
            _ => Err(io::Error::other("the keeper sent no connection")),
        }
    }
}

/// Sends one request to the keeper at `socket` and returns its answer.
///
/// # Errors
/// The error of connecting or of the exchange.
pub fn ask(socket: &Path, request: &Request) -> io::Result<Response> {
    let stream = UnixStream::connect(socket)?;
    write_frame(&stream, request)?;
    read_frame(&stream)
}

/// Whether the keeper listening at `socket` runs in this PID namespace (its container,
/// not another pod's) and is ready: a readiness probe, so that a rolling update deletes
/// the old pod only after the new keeper took its views over.
///
/// # Errors
/// Why it is not ready.
pub fn probe(socket: &Path) -> Result<(), String> {
    let stream = UnixStream::connect(socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    // The kernel gives the peer's pid as this namespace sees it: 0 when it is outside.
    let peer = fdpass::peer(stream.as_fd()).map_err(|e| e.to_string())?;
    if peer.pid == 0 {
        return Err("the keeper at the socket is another container's".into());
    }
    write_frame(&stream, &Request::Ready).map_err(|e| e.to_string())?;
    match read_frame(&stream).map_err(|e| e.to_string())? {
        Response::Ready => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

/// Runs the keeper until SIGINT or SIGTERM: takes the socket's name, takes over the
/// views other keepers started, then answers. On a signal, a keeper whose name a newer
/// keeper has taken asks it to take over its views and waits (up to a minute) until
/// they are gone; a keeper with no successor leaves its views running (they are
/// processes of their own; in a container they end with it).
///
/// # Errors
/// The error of binding the socket.
pub fn run(cfg: KeeperConfig) -> io::Result<()> {
    let signals = TerminationSignals::block()?;
    // Lives as long as the process: its threads hold it.
    let keeper: &'static Keeper = Box::leak(Box::new(Keeper {
        instance: random_instance(),
        cfg,
        next: AtomicU64::new(0),
        children: Mutex::new(HashMap::new()),
        holds: Mutex::new(HashMap::new()),
        recoveries: Mutex::new(HashMap::new()),
        ready: AtomicBool::new(false),
        adopting: Mutex::new(()),
    }));
    if let Some(dir) = keeper.cfg.socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
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
    let (taken, failed) = keeper.adopt();
    keeper.ready.store(true, Ordering::Release);
    tracing::info!(taken, failed = failed.len(), "keeper ready");

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
    let deadline = Instant::now() + LEAVE_TIMEOUT;
    while keeper.running() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    tracing::info!(left = keeper.running(), "keeper stopped");
    Ok(())
}

fn random_instance() -> String {
    format!("{:016x}", crate::sys::process::random_u128() as u64)
}
