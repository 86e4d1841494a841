//! A view process's life: where it serves and what it may do ([`Plan`]), its
//! connection (mounted, taken over from a predecessor, or recovered from a keeper),
//! serving it with its journal and control socket, and unmounting it.

use super::*;

/// Where the control socket's listener leaves a successor's accepted request.
type Pending = Arc<Mutex<Option<handover::Accepted>>>;
/// What stops the session's workers for a handover, once the session runs.
type Stopper = Arc<Mutex<Option<::fuser::SessionStopper>>>;

/// Mounts a view of `source` on `mountpoint` and serves it in the foreground until
/// SIGINT or SIGTERM (then unmounts, lazily if the view is busy), until something else
/// unmounts it, or until it hands the view to a new process.
///
/// As root the mount is made directly (type `fuse.mountgroup`); otherwise through
/// fusermount3, where `allow_other` needs `user_allow_other` in /etc/fuse.conf.
/// Sets the process umask to 0: the kernel applied the caller's umask already.
///
/// As root with a `control_dir`, the view listens there for a successor
/// ([`handover`]); and when `mountpoint` is served already by a view of the same
/// source with the same options, this process takes that view over live instead of
/// mounting: nothing is unmounted, open files stay open, inode numbers stay.
///
/// With a `holder` (the keeper that started it), the view hands it a duplicate of its
/// connection and keeps a journal of its tables there ([`journal`]), so that if this
/// process dies the holder can start one that recovers the view on the same
/// connection; a process started to recover does that instead of mounting.
///
/// # Errors
/// The [`MountError`] naming why the view could not be mounted, taken over or served.
pub fn run_foreground(
    source: &Path,
    mountpoint: &Path,
    options: &ViewOptions,
    metrics_file: Option<&Path>,
    control_dir: Option<&Path>,
    holder: Option<Arc<dyn handover::Holder + Send + Sync>>,
) -> Result<(), MountError> {
    // A view process: its memory should follow the kernel's cache down (see there).
    crate::sys::process::use_one_heap();
    let (root, plan) = Plan::new(source, mountpoint, options, control_dir, holder)?;
    let mut view = build(&plan.source, root, options)?;
    let identity = handover::Identity {
        source: plan.source.clone(),
        mountpoint: plan.mountpoint.clone(),
        options: identity_options(options, view.fs().share_checks()),
    };
    if plan.on_ring {
        view.want_ring();
    }
    let stats = view.stats();
    let fs = view.fs();
    // Block termination signals before fuser spawns its workers, so that only the
    // waiting thread below ever sees them.
    let signals = TerminationSignals::block().map_err(|e| MountError::Session(e.into()))?;
    file::set_umask(0);
    let mut cfg = session_config(&plan.source, options, view.kernel_checks());
    // Which descriptors the workers read ([`Protocol`]).
    let mut protocol = Protocol::new(plan.holder.is_some());
    cfg.clone_fd = !protocol.workers_read_dev();
    let (source, mountpoint) = (&plan.source, &plan.mountpoint);
    // The connection: taken over from the view serving the mountpoint, or a new mount.
    let connected = match &plan.holder {
        Some(holder) if plan.recovering => {
            recover(view, holder, mountpoint, &mut protocol, &mut cfg)?
        }
        _ if plan.busy => {
            let dir = plan
                .control_dir
                .unwrap_or(Path::new(handover::DEFAULT_CONTROL_DIR));
            take_over(view, dir, &identity, &mut protocol, &mut cfg)?
                .ok_or_else(|| MountError::MountpointBusy(mountpoint.clone()))?
        }
        _ if plan.as_root => mount_as_root(view, source, mountpoint, options, &cfg)?,
        _ => mount_through_fusermount(view, source, mountpoint, &cfg)?,
    };
    let serving = Serving {
        options,
        identity,
        stats,
        fs,
        signals,
        cfg,
        minor: protocol.minor,
        metrics_file,
    };
    serve_connected(connected, plan, serving)
}

/// What a connected view serves with, besides its [`Plan`].
struct Serving<'a> {
    options: &'a ViewOptions,
    identity: handover::Identity,
    stats: Arc<stats::ViewStats>,
    fs: Arc<crate::fs::ops::ViewFs>,
    signals: TerminationSignals,
    cfg: ::fuser::Config,
    minor: Option<u32>,
    metrics_file: Option<&'a Path>,
}

/// Serves a view on its connection until it is unmounted or handed over: said, made
/// this process's, its snapshots written, then unmounted on a signal.
fn serve_connected(connected: Connected, plan: Plan<'_>, s: Serving<'_>) -> Result<(), MountError> {
    let Connected {
        session,
        unmounter,
        dev,
        template,
        confirmation,
    } = connected;
    // A view that ends with an error leaves no mount behind.
    let mut guard = match &unmounter {
        Unmounter::Own(own) => Some(OwnMountGuard::new(own)),
        Unmounter::Fuser(_) => None,
    };
    let sources = ring_sources(plan.rings, &session, &s.stats)?;
    let (source, mountpoint) = (&plan.source, &plan.mountpoint);
    announce(
        confirmation,
        plan.recovering,
        &mut guard,
        (source, mountpoint),
        s.options,
    )?;
    let pending = Arc::new(Mutex::new(None));
    let stopper: Stopper = Arc::new(Mutex::new(None));
    let held = Held {
        holder: plan.holder.as_ref(),
        dev: dev.as_ref(),
        template: template.as_ref(),
        recovering: plan.recovering,
        minor: s.minor,
    };
    let locks = (&pending, &stopper);
    let control = take_the_view(plan.control_dir, mountpoint, &s.identity, locks, held)?;
    if let Some(path) = s.metrics_file {
        write_snapshots(path, s.stats, s.fs)?;
    }
    unmount_on_signal(s.signals, unmounter)?;
    let handover = match (&control, template, &dev) {
        (Some(_), Some(template), Some(dev)) => Some(Handover {
            stopper: &stopper,
            pending: &pending,
            template,
            dev,
        }),
        _ => None,
    };
    serve(session, handover, sources, &s.cfg)?;
    if let Some(c) = &control {
        c.remove();
    }
    drop(guard);
    if let Some(path) = s.metrics_file {
        let _ = std::fs::remove_file(path);
    }
    tracing::info!(mountpoint = %mountpoint.display(), "unmounted");
    Ok(())
}

/// What a view process starts from: what it may do (root mounts itself,
/// holds its connection and can hand it over; a view on a ring can be neither handed
/// over nor recovered, ring.rs), its rings, and where it serves.
struct Plan<'a> {
    as_root: bool,
    on_ring: bool,
    control_dir: Option<&'a Path>,
    holder: Option<Arc<dyn handover::Holder + Send + Sync>>,
    rings: Option<ring::Rings>,
    recovering: bool,
    source: PathBuf,
    mountpoint: PathBuf,
    /// A view serves the mountpoint already.
    busy: bool,
}

impl<'a> Plan<'a> {
    fn new(
        source: &Path,
        mountpoint: &Path,
        options: &ViewOptions,
        control_dir: Option<&'a Path>,
        holder: Option<Arc<dyn handover::Holder + Send + Sync>>,
    ) -> Result<(OwnedFd, Plan<'a>), MountError> {
        let root = open_source(source, options)?;
        let as_root = crate::sys::process::is_root();
        let on_ring = options.transport == Transport::Ring;
        let control_dir = control_dir.filter(|_| as_root && !on_ring);
        let holder = holder.filter(|_| as_root && !on_ring);
        // Made before the mount: a connection that asked for a ring holds every
        // request back until the ring is there (fs/fuse/dev.c `fuse_block_alloc`).
        let rings = if on_ring {
            Some(ring::Rings::prepare(options.threads, fuse::RING_PAYLOAD)?)
        } else {
            None
        };
        let recovering = holder.as_ref().is_some_and(|h| h.recovering());
        let (source, mountpoint, busy) =
            locate(source, mountpoint, recovering, control_dir.is_some())?;
        if options.passthrough == Passthrough::On && !as_root {
            return Err(mount_err(
                &source,
                &mountpoint,
                io::Error::new(io::ErrorKind::PermissionDenied, "passthrough=on needs root"),
            ));
        }
        // Before the view sizes its descriptor cache from it.
        let nofile = crate::sys::process::raise_nofile_limit();
        tracing::debug!(nofile, "open-file limit");
        let plan = Plan {
            as_root,
            on_ring,
            control_dir,
            holder,
            rings,
            recovering,
            source,
            mountpoint,
            busy,
        };
        Ok((root, plan))
    }
}

/// The ring's request sources, registered on the session's connection (none without a
/// ring).
fn ring_sources(
    rings: Option<ring::Rings>,
    session: &::fuser::Session<fuse::FuseView>,
    stats: &Arc<stats::ViewStats>,
) -> Result<Vec<Box<dyn ::fuser::RequestSource>>, MountError> {
    let Some(rings) = rings else {
        return Ok(Vec::new());
    };
    rings.register(session.as_fd())?;
    tracing::info!(
        "serving over io_uring: this view is neither handed over nor recovered after a crash"
    );
    Ok(rings.sources(stats, fuse::READ_BUFFER))
}

/// Says how the view came to serve (mounted, recovered, taken over), once the
/// predecessor of a takeover has been told this process serves. Where that fails the
/// predecessor serves again (it gave up waiting): it is left the view, its control
/// socket and the keeper's hold (`guard` disarmed).
fn announce(
    confirmation: Option<handover::Confirmation>,
    recovering: bool,
    guard: &mut Option<OwnMountGuard>,
    (source, mountpoint): (&Path, &Path),
    options: &ViewOptions,
) -> Result<(), MountError> {
    let how = match (confirmation, recovering) {
        (Some(confirmation), _) => {
            if let Err(e) = confirmation.serving() {
                if let Some(g) = guard.take() {
                    g.disarm();
                }
                return Err(takeover_err(mountpoint, handover::HandoverError::Io(e)));
            }
            "took the view over"
        }
        (None, true) => "recovered the view on its connection",
        (None, false) => "mounted",
    };
    tracing::info!(
        source = %source.display(),
        mountpoint = %mountpoint.display(),
        options = %options.to_option_string(),
        "{how}"
    );
    Ok(())
}

/// What a view process holds of its connection once it serves: the keeper that holds
/// it too, its device, the adapter that serves again if a handover fails, and whether
/// it recovered the connection (and on which protocol minor).
struct Held<'a> {
    holder: Option<&'a Arc<dyn handover::Holder + Send + Sync>>,
    dev: Option<&'a Arc<OwnedFd>>,
    template: Option<&'a fuse::FuseView>,
    recovering: bool,
    minor: Option<u32>,
}

/// Makes the view this process's, now that the predecessor is gone: its control
/// socket in `control_dir` takes the name over (atomically), the keeper holds this
/// process's connection and journal, and a recovered connection's requests are sent
/// again. The control socket, where there is one.
fn take_the_view(
    control_dir: Option<&Path>,
    mountpoint: &Path,
    identity: &handover::Identity,
    (pending, stopper): (&Pending, &Stopper),
    held: Held<'_>,
) -> Result<Option<Arc<handover::ControlSocket>>, MountError> {
    let control = match control_dir {
        Some(dir) if held.dev.is_some() => {
            listen_for_successor(dir, mountpoint, identity, pending, stopper)?
        }
        _ => None,
    };
    if let (Some(holder), Some(dev), Some(template)) = (held.holder, held.dev, held.template) {
        keep_journal(holder, mountpoint, dev, template);
    }
    if held.recovering
        && let Some(dev) = held.dev
    {
        resend_after_recovery(dev, held.minor);
    }
    Ok(control)
}

/// `source` and `mountpoint` made absolute, and whether a view serves the mountpoint
/// already (one this process may take over: else that is an error).
fn locate(
    source: &Path,
    mountpoint: &Path,
    recovering: bool,
    may_take_over: bool,
) -> Result<(PathBuf, PathBuf, bool), MountError> {
    // A view being recovered has no server: anything that touches the mountpoint
    // would wait for the very process that is to answer it.
    let busy = !recovering
        && match check_mountpoint(mountpoint) {
            Ok(()) => false,
            Err(MountError::MountpointBusy(_)) if may_take_over => true,
            Err(e) => return Err(e),
        };
    let source = absolute(source, |path, errno| MountError::Source { path, errno })?;
    let mountpoint = if recovering {
        absolute_untouched(mountpoint)?
    } else {
        absolute(mountpoint, |path, errno| MountError::Mountpoint {
            path,
            errno,
        })?
    };
    Ok((source, mountpoint, busy))
}

/// Unmounts the view when SIGINT or SIGTERM comes (the signals `signals` blocked).
fn unmount_on_signal(
    signals: TerminationSignals,
    mut unmounter: Unmounter,
) -> Result<(), MountError> {
    std::thread::Builder::new()
        .name("mountgroup-signals".into())
        .spawn(move || {
            if let Ok(sig) = signals.wait() {
                tracing::info!(signal = crate::sys::signal::name(sig), "unmounting");
                unmounter.unmount();
            }
        })
        .map(drop)
        .map_err(MountError::Session)
}

/// The FUSE protocol the connection speaks, as far as this process knows it, and
/// whether a holder keeps the connection: together they say which descriptors the
/// workers read ([`session_fd`]).
struct Protocol {
    /// The minor version INIT negotiated: the adopted connection's, else the keeper's
    /// probe of this kernel's; unknown, the requests of a process that dies fail
    /// rather than wait for a resend that may never come.
    minor: Option<u32>,
    kept: bool,
}

impl Protocol {
    /// The protocol this kernel speaks, as the keeper said it (`kept`: it holds the
    /// connection); said where it did not.
    fn new(kept: bool) -> Protocol {
        let protocol = Protocol {
            minor: handover::fuse_minor_from_env(),
            kept,
        };
        if kept && protocol.minor.is_none() {
            tracing::warn!(
                "the keeper did not say which FUSE protocol this kernel speaks: if this view dies, the requests it was answering fail (ECONNABORTED) rather than being resent"
            );
        }
        protocol
    }

    /// Whether the workers read the connection's own descriptor, so that the kernel
    /// can resend what a dead process was answering, rather than clones of it.
    fn workers_read_dev(&self) -> bool {
        self.kept && self.minor.is_some_and(crate::sys::fuse::resends)
    }

    /// Takes the minor version an adopted connection negotiated, where it tells one.
    fn adopt(&mut self, negotiated: &journal::Negotiated, cfg: &mut ::fuser::Config) {
        if negotiated.minor != 0 {
            self.minor = Some(negotiated.minor);
            cfg.clone_fd = !self.workers_read_dev();
        }
    }
}

/// The connection a view serves and what came with it.
struct Connected {
    session: ::fuser::Session<fuse::FuseView>,
    unmounter: Unmounter,
    /// The connection's device, where this process holds it (not through fusermount3).
    dev: Option<Arc<OwnedFd>>,
    /// An adapter over the same core, which serves again if a handover fails.
    template: Option<fuse::FuseView>,
    /// The predecessor's wait for this process to serve (a takeover).
    confirmation: Option<handover::Confirmation>,
}

/// The connection of a dead view, kept by `holder`, with the view's tables replayed
/// from its journal.
fn recover(
    view: fuse::FuseView,
    holder: &Arc<dyn handover::Holder + Send + Sync>,
    mountpoint: &Path,
    protocol: &mut Protocol,
    cfg: &mut ::fuser::Config,
) -> Result<Connected, MountError> {
    let failed = |e| takeover_err(mountpoint, e);
    let (dev, journal) = holder
        .recover(mountpoint)
        .map_err(|e| failed(handover::HandoverError::Io(e)))?;
    let replayed =
        journal::Replayed::read(&journal).map_err(|e| failed(handover::HandoverError::Io(e)))?;
    protocol.adopt(&replayed.negotiated, cfg);
    let dev = Arc::new(dev);
    let lost = view
        .fs()
        .recover(&replayed, &dev)
        .map_err(|e| failed(handover::HandoverError::Failed(e.to_string())))?;
    if lost > 0 {
        tracing::warn!(
            lost,
            "open handles could not be reopened (their files deleted while open, or since made unreadable to their owners and groups); they answer EBADF"
        );
    }
    let (session, template) = serve_adopted(view, &dev, replayed.negotiated, cfg)?;
    Ok(Connected {
        session,
        unmounter: Unmounter::Own(OwnMount::new(mountpoint, &dev)),
        dev: Some(dev),
        template: Some(template),
        confirmation: None,
    })
}

/// The connection of the view serving the mountpoint, handed over through its
/// control socket in `dir`; `None` where no view there answers as `identity`.
fn take_over(
    view: fuse::FuseView,
    dir: &Path,
    identity: &handover::Identity,
    protocol: &mut Protocol,
    cfg: &mut ::fuser::Config,
) -> Result<Option<Connected>, MountError> {
    let mountpoint = &identity.mountpoint;
    let failed = |e| takeover_err(mountpoint, e);
    let Some((incoming, confirmation)) = handover::take_over(dir, identity).map_err(failed)? else {
        return Ok(None);
    };
    protocol.adopt(&incoming.negotiated, cfg);
    let dev = Arc::new(incoming.dev);
    if let Err(e) = view.fs().restore(&incoming.snapshot, incoming.fds, &dev) {
        confirmation.failed(&e.to_string());
        return Err(failed(handover::HandoverError::Failed(e.to_string())));
    }
    let (session, template) = serve_adopted(view, &dev, incoming.negotiated, cfg)?;
    Ok(Some(Connected {
        session,
        unmounter: Unmounter::Own(OwnMount::new(mountpoint, &dev)),
        dev: Some(dev),
        template: Some(template),
        confirmation: Some(confirmation),
    }))
}

fn takeover_err(mountpoint: &Path, source: handover::HandoverError) -> MountError {
    MountError::Takeover {
        mountpoint: mountpoint.into(),
        source,
    }
}

fn mount_err(source: &Path, mountpoint: &Path, e: io::Error) -> MountError {
    MountError::Mount {
        src_path: source.into(),
        mountpoint: mountpoint.into(),
        source: e,
    }
}

/// A new mount, made by this process with `mount(2)` (root).
fn mount_as_root(
    mut view: fuse::FuseView,
    source: &Path,
    mountpoint: &Path,
    options: &ViewOptions,
    cfg: &::fuser::Config,
) -> Result<Connected, MountError> {
    let how = crate::sys::mount::FuseMount {
        default_permissions: view.kernel_checks(),
        allow_other: true,
        selinux_context: options.selinux_context.clone(),
        flags: options.vfs_flags(),
    };
    if let Some(label) = &how.selinux_context {
        if !crate::sys::mount::selinux_enabled() {
            return Err(MountError::NoSelinux);
        }
        if crate::sys::mount::selinux_context_known(label) == Some(false) {
            return Err(MountError::UnknownSelinuxContext(label.clone()));
        }
    }
    let fsname = options.fsname_for(source);
    let dev = crate::sys::mount::mount_fuse(&fsname, mountpoint, "mountgroup", how)
        .map_err(|e| mount_err(source, mountpoint, e.into()))?;
    let dev = Arc::new(dev);
    let own = OwnMount::new(mountpoint, &dev);
    let guard = OwnMountGuard::new(&own);
    view.attach(Arc::clone(&dev));
    let template = view.resume();
    let fd = session_fd(&dev, cfg).map_err(|e| MountError::Session(e.into()))?;
    let session = ::fuser::Session::from_fd(view, fd, cfg.acl, cfg.clone())
        .map_err(|e| mount_err(source, mountpoint, e))?;
    // Initialised: the caller's guard takes over.
    guard.disarm();
    Ok(Connected {
        session,
        unmounter: Unmounter::Own(own),
        dev: Some(dev),
        template: Some(template),
        confirmation: None,
    })
}

/// A new mount, made by fuser through fusermount3 (unprivileged use).
fn mount_through_fusermount(
    view: fuse::FuseView,
    source: &Path,
    mountpoint: &Path,
    cfg: &::fuser::Config,
) -> Result<Connected, MountError> {
    // fuser opens /dev/fuse itself before fusermount3 mounts it: name the device
    // rather than answer a bare "Permission denied".
    crate::sys::file::check_read_write(Path::new("/dev/fuse"))
        .map_err(|errno| MountError::DevFuse { errno })?;
    let mut session = ::fuser::Session::new(view, mountpoint, cfg)
        .map_err(|e| mount_err(source, mountpoint, e))?;
    let unmounter = Unmounter::Fuser(session.unmount_callable());
    Ok(Connected {
        session,
        unmounter,
        dev: None,
        template: None,
        confirmation: None,
    })
}

/// The view's control socket in `dir`, answering a successor's handover
/// ([`handover::listen`]): the successor's request stops the session's workers
/// through `stopper`. `None`, and a warning, where it cannot be made.
fn listen_for_successor(
    dir: &Path,
    mountpoint: &Path,
    identity: &handover::Identity,
    pending: &Pending,
    stopper: &Stopper,
) -> Result<Option<Arc<handover::ControlSocket>>, MountError> {
    match handover::ControlSocket::bind(dir, mountpoint) {
        Ok(c) => {
            let c = Arc::new(c);
            let stop = Arc::clone(stopper);
            handover::listen(
                Arc::clone(&c),
                identity.clone(),
                Arc::clone(pending),
                move || {
                    if let Some(s) = lock(&stop).as_ref() {
                        s.stop();
                    }
                },
            )
            .map_err(MountError::Session)?;
            Ok(Some(c))
        }
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "no control socket: this view cannot be handed to a new process");
            Ok(None)
        }
    }
}

/// Writes the view's operation snapshot to `path` every second, from a thread of its
/// own, and says once per episode when a request has waited [`STUCK_REQUEST`].
fn write_snapshots(
    path: &Path,
    stats: Arc<stats::ViewStats>,
    fs: Arc<crate::fs::ops::ViewFs>,
) -> Result<(), MountError> {
    // The driver reads this snapshot for its metrics endpoint (transport/stats.rs); one
    // small file write a second.
    let path = path.to_path_buf();
    std::thread::Builder::new()
        .name("mountgroup-stats".into())
        .spawn(move || {
            let mut stuck_told = false;
            loop {
                stats.set_walked_ahead(fs.walked_ahead());
                stats.set_opened_ahead(fs.opened_ahead());
                // Told once per episode: the keeper's liveness check passes while
                // another worker answers, so this line and the metric are what show
                // a request stuck alone (a backing file system that stopped answering).
                let oldest = stats.oldest_request();
                if oldest >= STUCK_REQUEST && !stuck_told {
                    tracing::warn!(waited = ?oldest, "a request has waited this long and is still in progress: the backing file system, or the view, is stuck on it");
                }
                stuck_told = oldest >= STUCK_REQUEST;
                if let Err(e) = stats.write_snapshot(&path) {
                    tracing::debug!(error = %e, "cannot write the metrics snapshot");
                }
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        })
        .map_err(MountError::Session)?;
    Ok(())
}

/// Has the kernel resend the requests a dead process had read and not answered, to the
/// process that recovered its view, where the kernel speaks protocol 7.`minor` with
/// `FUSE_NOTIFY_RESEND`; says where it cannot.
fn resend_after_recovery(dev: &OwnedFd, minor: Option<u32>) {
    if !minor.is_some_and(crate::sys::fuse::resends) {
        tracing::warn!(
            fuse_minor = minor,
            "the requests the dead view was answering failed (ECONNABORTED): the kernel cannot resend them (FUSE_NOTIFY_RESEND, protocol 7.40, Linux 6.9)"
        );
    } else if let Err(e) = crate::sys::fuse::notify_resend(dev.as_fd()) {
        tracing::warn!(error = %e, "the kernel cannot resend the dead view's requests; they fail");
    }
}

/// The descriptor a session's workers read the connection `dev` through: with
/// `cfg.clone_fd`, a clone of it, and each other worker reads a clone of its own.
///
/// Where a holder keeps `dev` (the keeper), a request a worker read and had not
/// answered when its process died waits on the descriptor it was read from. From Linux
/// 6.9 the successor has the kernel resend it (`FUSE_NOTIFY_RESEND`), so every worker
/// reads `dev` itself (no `clone_fd`: duplicates, the one queue the holder's duplicate
/// keeps). Before 6.9 nothing can resend it, and a request left on the holder's queue
/// would hang its caller until the pod is gone: there every worker reads a clone that
/// the process alone holds, so that its death fails what it was answering
/// (`ECONNABORTED`) while the connection lives on through the holder's `dev`.
fn session_fd(dev: &OwnedFd, cfg: &::fuser::Config) -> Result<OwnedFd, Errno> {
    if cfg.clone_fd {
        crate::sys::fuse::clone_dev(dev.as_fd())
    } else {
        crate::sys::fuse::dup(dev.as_fd())
    }
}

/// A session on a connection another process initialised (taken over, or recovered),
/// and the adapter that serves again if a handover from this process fails.
fn serve_adopted(
    mut view: fuse::FuseView,
    dev: &Arc<OwnedFd>,
    negotiated: journal::Negotiated,
    cfg: &::fuser::Config,
) -> Result<(::fuser::Session<fuse::FuseView>, fuse::FuseView), MountError> {
    view.set_negotiated(negotiated);
    view.attach(Arc::clone(dev));
    let template = view.resume();
    let fd = session_fd(dev, cfg).map_err(|e| MountError::Session(e.into()))?;
    let session = ::fuser::Session::from_fd_initialized(view, fd, cfg.acl, cfg.clone());
    Ok((session, template))
}

/// Starts the view's journal with its state now and hands it, with a duplicate of the
/// connection, to the holder. A view that cannot be journaled still serves; only its
/// recovery after a crash is lost, and the log says so.
fn keep_journal(
    holder: &Arc<dyn handover::Holder + Send + Sync>,
    mountpoint: &Path,
    dev: &Arc<OwnedFd>,
    view: &fuse::FuseView,
) {
    let fs = view.fs();
    if !fs.recoverable() {
        tracing::info!(
            "the backing file system has no file handles: a crash of this view cannot be recovered on its mount"
        );
        return;
    }
    let negotiated = view.negotiated();
    let keep = {
        let (holder, mountpoint, dev) = (
            Arc::clone(holder),
            mountpoint.to_path_buf(),
            Arc::clone(dev),
        );
        move |j: &journal::Journal| holder.hold(&mountpoint, dev.as_fd(), j.fd())
    };
    if let Err(e) = fs.journal_to(negotiated, &keep) {
        tracing::warn!(error = %e, "the keeper does not hold this view: a crash of it would cost a remount");
        return;
    }
    // The journal grows with every node id given and forgotten: write it anew now and
    // then, so that it stays a few times the size of what the kernel holds.
    let spawned = std::thread::Builder::new()
        .name("mountgroup-journal".into())
        .spawn(move || {
            loop {
                std::thread::sleep(COMPACT_EVERY);
                if fs.journal_wants_compaction(COMPACT_FLOOR) {
                    match fs.journal_to(negotiated, &keep) {
                        Ok(()) => tracing::debug!("journal compacted"),
                        Err(e) => tracing::warn!(error = %e, "cannot compact the journal; it keeps growing"),
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no journal compaction thread");
    }
}

/// A request in progress this long is logged as stuck (and shown in the metrics).
const STUCK_REQUEST: std::time::Duration = std::time::Duration::from_secs(30);

/// How often the journal's size is looked at, and below what size it is left alone.
const COMPACT_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

const COMPACT_FLOOR: u64 = 8 << 20;

/// Runs the session until the connection ends. When the control socket accepted a
/// successor, the stopped view is handed over and this process exits at once, without
/// unmounting and without closing the passthrough registrations the successor adopted;
/// when the handover fails, the same view serves again on the same connection.
/// What a view that can be handed over serves with.
struct Handover<'a> {
    /// Where the control thread finds the running session's stopper.
    stopper: &'a Mutex<Option<::fuser::SessionStopper>>,
    /// The request the control thread accepted.
    pending: &'a Mutex<Option<handover::Accepted>>,
    /// An adapter over the session's core, counters and connection.
    template: fuse::FuseView,
    dev: &'a Arc<OwnedFd>,
}

fn serve(
    mut session: ::fuser::Session<fuse::FuseView>,
    handover: Option<Handover<'_>>,
    sources: Vec<Box<dyn ::fuser::RequestSource>>,
    cfg: &::fuser::Config,
) -> Result<(), MountError> {
    let Some(Handover {
        stopper,
        pending,
        template,
        dev,
    }) = handover
    else {
        // fuser starts no extra worker that could not tell it waited for a request
        // (`Config::max_threads`): one reading the connection's own descriptor, which
        // blocks, in a session that is never stopped.
        if !cfg.clone_fd && cfg.max_threads > cfg.n_threads {
            tracing::warn!(
                threads = ?cfg.n_threads,
                "this view runs its threads= workers alone, not up to max_threads=: they read the connection's own descriptor (the keeper holds it and this kernel resends requests) and the view cannot be handed over (no control directory), so an extra worker could never end; a call waiting on the share holds a worker. Give the view a control directory (--control-dir) to have extra workers"
            );
        }
        return session
            .run_with_sources(sources)
            .map_err(MountError::Session);
    };
    debug_assert!(sources.is_empty(), "a view on a ring is never handed over");
    loop {
        *lock(stopper) = Some(session.stopper().map_err(MountError::Session)?);
        session.run().map_err(MountError::Session)?;
        let Some(accepted) = lock(pending).take() else {
            return Ok(());
        };
        match handover::hand_over(accepted, &template, dev.as_fd()) {
            Ok(()) => {
                tracing::info!("the view is served by a new process now; exiting");
                std::process::exit(0);
            }
            Err(e) => {
                tracing::warn!(error = %e, "handover failed; serving the view again");
                let fd = session_fd(dev, cfg).map_err(|e| MountError::Session(e.into()))?;
                session = ::fuser::Session::from_fd_initialized(
                    template.resume(),
                    fd,
                    cfg.acl,
                    cfg.clone(),
                );
            }
        }
    }
}
