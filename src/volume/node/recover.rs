//! Recovery: a restarted driver serves every published target again from the state
//! file, and mounts again what a reboot took.

use super::*;

impl Node {
    pub(super) fn recover(&self) {
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
    pub(super) fn restore(&self, target: &Path, p: &Published) -> Restored {
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
    pub(super) fn serve_again(
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
}
