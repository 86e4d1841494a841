//! What a volume holds and whether its views serve (NodeGetVolumeStats), and its
//! growth (NodeExpandVolume).

use super::*;

impl Node {
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

    pub(super) fn is_at(&self, id: &VolumeHandle, path: &Path) -> bool {
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
        if !secret_view
            && named.is_none()
            && let Some(why) = self.share_fails(id)?
        {
            return Ok(VolumeStats::abnormal(why));
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
        let (mut bytes, inodes) = usage.map_or_else(Default::default, usage_of);
        if !secret_view && let Some((limit, used)) = self.quota(id, named.as_ref()) {
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

    /// Why the share root answers volume `id` with an error (a `soft` mount whose
    /// server is away: EHOSTDOWN, EIO), which makes the volume abnormal, not the call.
    ///
    /// # Errors
    /// `NotFound` where the volume does not exist; what else the share answers.
    fn share_fails(&self, id: &VolumeHandle) -> Result<Option<String>, VolumeError> {
        let missing = || VolumeError::NotFound(format!("volume {id} does not exist"));
        match self.share.get(&id.root().ok_or_else(missing)?) {
            Ok(Some(_)) => Ok(None),
            Ok(None) => Err(missing()),
            Err(crate::share::ShareError::Io { what, errno }) => {
                Ok(Some(format!("the share fails: {what}: {errno}")))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The quota of volume `id` and the bytes it holds, where the share enforces its
    /// capacity: then its bytes are the quota's, whatever serves it (a FUSE view's
    /// statfs answers with the quota, but a native view's is the share's file
    /// system's, a bind mount's superblock, so kubelet would report the whole share as
    /// the volume).
    fn quota(
        &self,
        id: &VolumeHandle,
        named: Option<&(PathBuf, StagedShare)>,
    ) -> Option<(u64, u64)> {
        match (named, id.root()) {
            (Some((staging, share)), _) if share.kind == remote::Kind::Cephfs => {
                crate::share::cephfs::limit_bytes(staging)
                    .zip(crate::share::cephfs::used_bytes(staging))
            }
            (Some(_), _) => None,
            (None, Some(root)) => self.share.volume_bytes(&root),
            (None, None) => None,
        }
    }
}

/// Bytes and inodes as a file system's `statvfs` counts them.
fn usage_of(s: crate::sys::file::FsStat) -> (Usage, Usage) {
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
