//! Watching the views the keeper runs: each one's requests and answers judged in
//! turn (a view that stopped answering while requests wait is replaced; one that
//! serves slowly is not).

use super::*;

impl Keeper {
    /// Every few seconds: checks that each view it holds answers (see [`Self::check`]),
    /// and removes the cgroups of views that are gone (a view taken over from another
    /// keeper ends as that keeper's child, or as nobody's).
    pub(super) fn watch(&'static self) {
        let every = self.cfg.hang_timeout.map_or(Duration::from_secs(10), |t| {
            (t / 4).clamp(Duration::from_millis(100), Duration::from_secs(10))
        });
        loop {
            std::thread::sleep(every);
            if let Some(timeout) = self.cfg.hang_timeout {
                self.check(timeout);
            }
            if let Some(parent) = &self.cgroups {
                let ours: Vec<Cgroup> = lock(&self.children)
                    .values()
                    .filter(|c| c.exit.is_none())
                    .filter_map(|c| c.cgroup.clone())
                    .collect();
                // Not one made in the last minute: another keeper (a rolling update's
                // other pod) may have made it and be about to start its view in it.
                for cg in parent.children() {
                    let young = cg.age().is_none_or(|a| a < SWEEP_AFTER);
                    if !ours.contains(&cg) && !young && !cg.populated() {
                        let _ = cg.remove();
                    }
                }
            }
        }
    }

    /// Looks a reserved name up in every view whose connection it holds, each in a
    /// thread of its own. The lookup waits on the share too where the view's root's
    /// attributes have expired: the kernel's permission check asks the view for them
    /// first (fs/fuse/dir.c `fuse_permission`, `fuse_perm_getattr`), and the view
    /// reads them from the share, whatever workers it has free. A view whose lookup
    /// is still unanswered after `timeout` is asked what its threads wait on
    /// ([`crate::sys::process::waiting`], [`judge`]). One that
    /// waits on a file system (its share stalls, or its server is away: an NFS `hard`
    /// mount waits for minutes, and so do its callers on the raw mount) is left
    /// serving, said once, and asked again each round: a kill would be recovered only
    /// once the share answers, and the successor would wait on it the same. One that
    /// waits on nothing of the kind (deadlocked, stopped with SIGSTOP) is SIGKILLed:
    /// its death is then recovered like any other, the kernel resends what it had
    /// read, and the lookup left waiting is answered by its successor. A view that
    /// cannot be recovered (nothing held for it) is only reported: killing it would
    /// end its mount.
    pub(super) fn check(&'static self, timeout: Duration) {
        let serving: Vec<(PathBuf, u32)> = {
            let holds = lock(&self.holds);
            let children = lock(&self.children);
            children
                .iter()
                .filter(|(_, c)| c.exit.is_none())
                .filter_map(|(pid, c)| {
                    let m = c.mountpoint()?;
                    let h = holds.get(m)?;
                    (h.instance == c.instance).then(|| (m.to_path_buf(), *pid))
                })
                .collect()
        };
        let mut checks = lock(&self.checks);
        for (mountpoint, pid) in serving {
            match checks.get_mut(&mountpoint) {
                Some(watch) => {
                    let waited = match watch.quiet {
                        Quiet::Since(t) if watch.pid == pid => t.elapsed(),
                        _ => Duration::ZERO,
                    };
                    let waiting = || crate::sys::process::waiting(pid);
                    match judge(watch, pid, Instant::now(), timeout, waiting) {
                        Judgement::Patience => {}
                        Judgement::WaitsOnShare => {
                            if lock(&self.waiting).insert(mountpoint.clone()) {
                                tracing::warn!(mountpoint = %mountpoint.display(), pid, ?waited, "the view answers nothing while it waits on its share: leaving it serving (the share's own mount waits the same)");
                            }
                        }
                        Judgement::Hung(what) => {
                            lock(&self.waiting).remove(&mountpoint);
                            tracing::error!(mountpoint = %mountpoint.display(), pid, ?waited, "the view answers nothing and {what}: killing it to recover it");
                            let _ = crate::sys::process::kill(pid);
                        }
                    }
                }
                None => {
                    let quiet = Quiet::Since(Instant::now());
                    checks.insert(mountpoint.clone(), Watch { pid, quiet });
                    let spawned = std::thread::Builder::new()
                        .name("keeper-check".into())
                        .spawn(move || {
                            // ENOENT is the answer; any answer will do.
                            let _ = std::fs::symlink_metadata(mountpoint.join(ALIVE_NAME));
                            lock(&self.checks).remove(&mountpoint);
                            if lock(&self.waiting).remove(&mountpoint) {
                                tracing::info!(mountpoint = %mountpoint.display(), "the view answers again: its share answered");
                            }
                        });
                    if let Err(e) = spawned {
                        tracing::warn!(error = %e, "cannot start a liveness check");
                    }
                }
            }
        }
    }
}

/// What a keeper makes of a view whose liveness check is still unanswered.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Judgement {
    /// Not quiet for the hang timeout yet: asked nothing.
    Patience,
    /// Its threads wait on a file system: left serving.
    WaitsOnShare,
    /// Quiet for the hang timeout while waiting on nothing but itself: killed.
    Hung(&'static str),
}

/// A liveness check under way: the process it judges, and where that process stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Watch {
    pub(super) pid: u32,
    pub(super) quiet: Quiet,
}

/// Where a view whose liveness check is unanswered stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Quiet {
    /// Quiet since then, not seen waiting on its share since: the check's start, or the
    /// first round that found it no longer waiting there.
    Since(Instant),
    /// Found waiting on its share at the last round.
    OnShare,
}

/// Judges the view process `pid`, whose liveness check is unanswered, asking `waiting`
/// what its threads wait on once it has been quiet for `timeout`, and at every round
/// while it waits on its share. Time spent waiting on its share does not count: from
/// the first round that finds it no longer waiting there, it has a whole `timeout` to
/// answer the check (it may be working off what its callers queued meanwhile) before
/// it is taken for hung. A hung view is not judged again for an hour: its successor
/// answers first. A check that outlived the process it was judging (killed, or dead,
/// and recovered by `pid`: the check's request waits for the successor) judges the
/// successor from this round on, never by its predecessor's silence.
pub(super) fn judge(
    watch: &mut Watch,
    pid: u32,
    now: Instant,
    timeout: Duration,
    waiting: impl FnOnce() -> crate::sys::process::Waiting,
) -> Judgement {
    use crate::sys::process::Waiting;
    if watch.pid != pid {
        *watch = Watch {
            pid,
            quiet: Quiet::Since(now),
        };
        return Judgement::Patience;
    }
    let quiet = &mut watch.quiet;
    if let Quiet::Since(t) = *quiet {
        if now.saturating_duration_since(t) <= timeout {
            return Judgement::Patience;
        }
    }
    match (waiting(), *quiet) {
        (Waiting::OnFileSystem, _) => {
            *quiet = Quiet::OnShare;
            Judgement::WaitsOnShare
        }
        (_, Quiet::OnShare) => {
            *quiet = Quiet::Since(now);
            Judgement::Patience
        }
        (other, Quiet::Since(_)) => {
            *quiet = Quiet::Since(now + Duration::from_secs(3600));
            Judgement::Hung(match other {
                Waiting::Stopped => "it is stopped",
                _ => "it waits on no file system",
            })
        }
    }
}
