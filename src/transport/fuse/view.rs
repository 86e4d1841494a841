//! The adapter's own state and its one choke point: negotiation handed over or
//! learned at INIT, `answer` (timed, counted, logged, the error answered), the
//! attributes and entry times a reply carries, and passthrough registrations.

use super::*;

impl FuseView {
    pub fn new(
        fs: ViewFs,
        passthrough: Passthrough,
        kernel_checks: bool,
        attr_ttl: Duration,
        entry_ttl: Duration,
    ) -> FuseView {
        FuseView {
            fs: Arc::new(fs),
            dev: None,
            passthrough_mode: passthrough,
            passthrough: Arc::new(AtomicBool::new(false)),
            idmap: Arc::new(AtomicBool::new(false)),
            minor: Arc::new(AtomicU32::new(0)),
            kernel_checks,
            warned_backing: AtomicBool::new(false),
            attr_ttl,
            entry_ttl,
            stats: Arc::new(ViewStats::default()),
            warnings: RateLimit::new(WARN_BURST, WARN_WINDOW),
            ring: false,
            creates_served: false,
        }
    }

    /// Whether the kernel checks permissions (the mount's `default_permissions`).
    pub fn kernel_checks(&self) -> bool {
        self.kernel_checks
    }

    /// Serves the files the view creates through the daemon while their creators hold
    /// them (`FuseView::creates_served`'s reason).
    pub fn serve_creates(mut self, serve: bool) -> FuseView {
        self.creates_served = serve;
        self
    }

    /// Asks for FUSE over io_uring at INIT (`transport=ring`); the connection then holds
    /// new requests back until every CPU's queue has a ring entry (fs/fuse/dev.c
    /// `fuse_block_alloc`, fs/fuse/dev_uring.c `is_ring_ready`).
    pub fn want_ring(&mut self) {
        self.ring = true;
    }

    /// Gives the view its connection's descriptor (a duplicate of the one the session
    /// reads): without one, files are served through the daemon.
    pub fn attach(&mut self, dev: Arc<OwnedFd>) {
        self.dev = Some(dev);
    }

    /// The filesystem core, shared with whoever hands the view over.
    pub fn fs(&self) -> Arc<ViewFs> {
        Arc::clone(&self.fs)
    }

    /// Whether the connection reads and writes files through kernel passthrough.
    pub fn passthrough(&self) -> bool {
        self.passthrough.load(Ordering::Relaxed)
    }

    /// What the connection's INIT negotiated.
    pub fn negotiated(&self) -> Negotiated {
        Negotiated {
            passthrough: self.passthrough(),
            idmap: self.idmap.load(Ordering::Relaxed),
            minor: self.minor.load(Ordering::Relaxed),
        }
    }

    /// A view of a connection that another process initialized: what its INIT
    /// negotiated is handed over, not negotiated again.
    pub fn set_negotiated(&self, negotiated: Negotiated) {
        self.passthrough
            .store(negotiated.passthrough, Ordering::Relaxed);
        self.idmap.store(negotiated.idmap, Ordering::Relaxed);
        self.minor.store(negotiated.minor, Ordering::Relaxed);
        self.stats.set_passthrough(negotiated.passthrough);
        self.stats.set_idmap(negotiated.idmap);
    }

    /// Another adapter over the same core, counters and connection: the one that
    /// serves again when a handover fails after the workers stopped.
    pub fn resume(&self) -> FuseView {
        FuseView {
            fs: Arc::clone(&self.fs),
            dev: self.dev.clone(),
            passthrough_mode: self.passthrough_mode,
            passthrough: Arc::clone(&self.passthrough),
            idmap: Arc::clone(&self.idmap),
            minor: Arc::clone(&self.minor),
            kernel_checks: self.kernel_checks,
            warned_backing: AtomicBool::new(self.warned_backing.load(Ordering::Relaxed)),
            attr_ttl: self.attr_ttl,
            entry_ttl: self.entry_ttl,
            stats: Arc::clone(&self.stats),
            warnings: RateLimit::new(WARN_BURST, WARN_WINDOW),
            ring: self.ring,
            creates_served: self.creates_served,
        }
    }

    /// The view's operation counters (shared with whoever writes them out).
    pub fn stats(&self) -> Arc<ViewStats> {
        Arc::clone(&self.stats)
    }

    /// The choke point. Runs `run` for operation `op` on inode `ino`, times and counts
    /// it, logs a failure at its level, and answers: `ok` with the value, or the error.
    pub(super) fn answer<R: Fail, T>(
        &self,
        op: Op,
        ino: u64,
        mut reply: R,
        run: impl FnOnce(&mut R) -> Result<T, FsError>,
        ok: impl FnOnce(R, T),
    ) {
        let start = Instant::now();
        let _busy = self.stats.busy();
        crate::sys::take_failed_call();
        let r = run(&mut reply);
        self.stats
            .record(op, start, r.as_ref().err().map(FsError::errno));
        match r {
            Ok(v) => ok(reply, v),
            Err(e) => {
                self.log_failure(op, ino, &e);
                reply.fail(errno(&e));
            }
        }
    }

    /// An operation the view does not serve: counted, answered with `errno`, logged
    /// at trace only (a pod can send as many as it likes; the metrics count them).
    pub(super) fn refuse<R: Fail>(&self, op: Op, ino: u64, reply: R, errno: i32) {
        self.stats.record(op, Instant::now(), Some(errno));
        tracing::trace!(op = op.name(), ino, errno = %crate::sys::Errno(errno).name(), "not served");
        reply.fail(Errno::from_i32(errno));
    }

    pub(super) fn log_failure(&self, op: Op, ino: u64, e: &FsError) {
        let errno = e.errno();
        // The system call that failed, where one did. The view's own refusals have none,
        // even when a call failed harmlessly earlier in the operation (an absent xattr).
        let failed_call = crate::sys::take_failed_call();
        let syscall = match e {
            FsError::Os(_) => failed_call.unwrap_or("-"),
            _ => "-",
        };
        if expected(errno) || matches!(e, FsError::NameAppeared) {
            tracing::debug!(op = op.name(), ino, syscall, errno = %crate::sys::Errno(errno).name(), error = %e, "operation failed");
            return;
        }
        self.warn_limited(|| {
            tracing::warn!(op = op.name(), ino, syscall, errno = %crate::sys::Errno(errno).name(), error = %e, "operation failed");
        });
    }

    /// Logs a failure a pod can cause with `log`, within [`WARN_BURST`] per
    /// [`WARN_WINDOW`], saying how many were held back.
    pub(super) fn warn_limited(&self, log: impl FnOnce()) {
        match self.warnings.check(Instant::now()) {
            Verdict::Log { held_before } => {
                if held_before > 0 {
                    tracing::warn!(
                        held_before,
                        "unexpected failures were not logged (rate limit); the metrics count them"
                    );
                }
                log();
            }
            Verdict::Hold => {}
        }
    }

    pub(super) fn fattr(&self, a: &Attr) -> FileAttr {
        FileAttr {
            ino: INodeNo(a.ino),
            size: a.size,
            blocks: a.blocks,
            atime: system_time(a.atime),
            mtime: system_time(a.mtime),
            ctime: system_time(a.ctime),
            crtime: system_time(a.btime),
            kind: file_type(a.kind),
            perm: (a.perm & 0o7777) as u16,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: encode_dev(a.rdev),
            blksize: if a.kind == Kind::Directory {
                DIR_BLKSIZE
            } else {
                a.blksize
            },
            flags: 0,
        }
    }

    /// An operation answered with an entry in the directory `dir`.
    pub(super) fn entry<R: Fail + Into<ReplyEntry>>(
        &self,
        op: Op,
        ino: u64,
        dir: u64,
        reply: R,
        run: impl FnOnce(&mut R) -> Result<Attr, FsError>,
    ) {
        self.answer(op, ino, reply, run, |reply, a| {
            reply.into().entry_with_ttls(
                &self.attr_ttl,
                &self.entry_ttl_in(dir),
                &self.fattr(&a),
                Generation(0),
            );
        });
    }

    /// How long the kernel may keep a name in the directory `dir`: the entry timeout,
    /// but where the share checks permissions and not every caller may search `dir`
    /// (`ViewFs::searchable_by_all`), not at all: the kernel would let any caller
    /// walk through a name it keeps, unchecked (no `default_permissions`).
    pub(super) fn entry_ttl_in(&self, dir: u64) -> Duration {
        if self.fs.share_checks() && !self.fs.searchable_by_all(dir) {
            Duration::ZERO
        } else {
            self.entry_ttl
        }
    }

    /// [`FuseView::answer`] for an operation whose success carries nothing.
    pub(super) fn empty(
        &self,
        op: Op,
        ino: u64,
        reply: ReplyEmpty,
        run: impl FnOnce() -> Result<(), FsError>,
    ) {
        self.answer(op, ino, reply, |_| run(), |reply, ()| reply.ok());
    }

    /// The backing id of inode `ino`'s shared descriptor, registered (and journaled) on
    /// its first open.
    pub(super) fn backing(&self, ino: u64, data: &DataFile) -> Option<u32> {
        if !self.passthrough() {
            return None;
        }
        let dev = self.dev.as_ref()?;
        self.fs
            .registration(ino, data, || match Backing::open(dev, data.fd.as_fd()) {
                Ok(b) => Some(b),
                Err(e) => {
                    if !self.warned_backing.swap(true, Ordering::Relaxed) {
                        tracing::warn!(error = %e, "kernel passthrough refused a backing file; serving it through the daemon");
                    }
                    None
                }
            })
    }
}
