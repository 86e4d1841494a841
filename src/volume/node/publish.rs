//! Publishing: each target's view of the staged volume (or of an inline volume the
//! node makes), as `serve::decide` chooses, its source prepared and recorded;
//! unpublishing.

use super::*;

impl Node {
    /// The view options of a publish: the capability's `mount_flags`, the group of
    /// this request, `ro` for a read-only publish or access mode, and for secret views
    /// always `ro` and no kernel caching (a rotation shows at once). On an SMB share a
    /// class names, a `gid=` of its mount options is shown whatever the pod's fsGroup,
    /// as csi-driver-smb mounts it (pkg/smb/nodeserver.go: `volumeMountGroup` only
    /// where the flags have no `gid=`), so that its classes keep their meaning; the
    /// share root's volumes refuse the conflict (docs/SEMANTICS.md, *Precedence*).
    pub(super) fn view_options(
        req: &PublishRequest,
        smb: bool,
    ) -> Result<ViewOptions, VolumeError> {
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
    /// [`super::super::names::target_key`]).
    pub(super) fn secrets_dir(&self, target: &Path) -> PathBuf {
        self.runtime_dir
            .join("secrets")
            .join(super::super::names::target_key(target))
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
        let options = self.publish_options(req)?;
        let canonical = options.to_option_string();
        let (kind, source) = self.publish_source(req)?;
        let _guard = self.guards.acquire(id.as_str(), "NodePublishVolume")?;
        let existing = self.state().published.get(target).cloned();
        if let Some(p) = &existing {
            p.same_publish(target, id, &canonical, kind, &source)?;
        }
        // Make the source exist (the only side effects before the view starts).
        let made_source = self.make_source(req, &source, existing.is_some())?;
        // A failure before the view starts takes back the source it made.
        let undone = |this: &Self, e: VolumeError| {
            if made_source {
                this.remove_source(kind, id, &source);
            }
            e
        };
        // What the volume is, read once for the rest of the publish.
        let record = self.backing_of(kind, id);
        self.source_on_share(kind, id, record.as_ref(), &source)
            .map_err(|why| {
                undone(self, VolumeError::FailedPrecondition(format!(
                    "volume {id} cannot be served: {why}; NodeStageVolume binds it again once the share is back"
                )))
            })?;
        if let Some(p) = &existing
            && p.mechanism.check(target) == Check::Serving
        {
            return Ok(());
        }
        // A repeat keeps the mechanism it had; a new publish is native where it can be.
        let recorded = existing.as_ref().map(|p| (p.mechanism, p.fallback.clone()));
        let (mechanism, fallback) = self
            .decide(
                id,
                target,
                kind,
                record.as_ref(),
                &options,
                recorded,
                req.pod.as_ref(),
            )
            .map_err(|refusal| undone(self, refused(req.pod.as_ref(), &refusal)))?;
        let created_target = self
            .prepare_target(target, existing.as_ref())
            .map_err(|e| undone(self, e))?;
        if mechanism.native_presentation() {
            self.keep_native_root(record.as_ref());
        }
        let pid = match mechanism.start(&self.views, &source, target, &options) {
            Ok(pid) => pid,
            Err(e) => {
                if created_target && existing.is_none() {
                    let _ = std::fs::remove_dir(target);
                }
                return Err(if existing.is_none() {
                    undone(self, e)
                } else {
                    e
                });
            }
        };
        self.record_published(
            target,
            Published {
                volume_id: id.clone(),
                kind,
                source,
                options: canonical,
                pid,
                created_target,
                mechanism,
                fallback,
            },
        )
    }

    /// The options a publish's view is served with ([`Node::view_options`]), for a
    /// volume on an SMB share the class named as csi-driver-smb takes them.
    fn publish_options(&self, req: &PublishRequest) -> Result<ViewOptions, VolumeError> {
        let smb = req.lifecycle == Lifecycle::Persistent
            && self
                .staged_share(&req.volume_id)
                .is_some_and(|(_, share)| share.kind == remote::Kind::Smb);
        Self::view_options(req, smb)
    }

    /// What a publish serves: its kind of view and the directory it shows (the
    /// staging path, an inline volume's directory on the share, a secret view's
    /// tmpfs).
    fn publish_source(&self, req: &PublishRequest) -> Result<(ViewKind, PathBuf), VolumeError> {
        Ok(match &req.lifecycle {
            Lifecycle::Persistent => (ViewKind::Persistent, req.staging_path.clone()),
            Lifecycle::Ephemeral(Inline::Share { .. }) => (
                ViewKind::InlineShare,
                self.share.data_path(&inline_id(&req.volume_id)?),
            ),
            Lifecycle::Ephemeral(Inline::Secrets(_)) => {
                // A secret view published by an earlier version keeps the tmpfs its
                // state names (whatever name that version gave it).
                let recorded = self
                    .state()
                    .published
                    .get(&req.target_path)
                    .filter(|p| p.kind == ViewKind::InlineSecrets)
                    .map(|p| p.source.clone());
                (
                    ViewKind::InlineSecrets,
                    recorded.unwrap_or_else(|| self.secrets_dir(&req.target_path)),
                )
            }
        })
    }

    /// Records a target that serves in the state file, said in the log; where the
    /// record cannot be written, its view is stopped and the publish fails.
    fn record_published(&self, target: &Path, published: Published) -> Result<(), VolumeError> {
        let (id, kind, mechanism, pid) = (
            published.volume_id.clone(),
            published.kind,
            published.mechanism,
            published.pid,
        );
        let fallback = published.fallback.clone();
        if let Err(e) = self.update(|st| {
            st.published.insert(target.to_path_buf(), published);
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
    pub(super) fn prepare_target(
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
    pub(super) fn decide(
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
    pub(super) fn share_records(&self, backing: Option<&Backing>) -> serve::Records {
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
    pub(super) fn make_source(
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
    pub(super) fn source_on_share(
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
    pub(super) fn backing_of(&self, kind: ViewKind, id: &VolumeHandle) -> Option<Backing> {
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
    pub(super) fn staged_share(&self, id: &VolumeHandle) -> Option<(PathBuf, StagedShare)> {
        let s = self.state().staged.get(id).cloned()?;
        Some((s.staging_path, s.share?))
    }

    /// Gives a native (or acting) volume's root back its owner, group and mode where a
    /// pod changed them (as kubelet's `OnRootMismatch` would for a volume it owns).
    pub(super) fn keep_native_root(&self, record: Option<&Backing>) {
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
    pub(super) fn ensure_inline_volume(
        &self,
        id: &VolumeId,
        size: Option<u64>,
    ) -> Result<bool, VolumeError> {
        match self.share.get(id)? {
            Some(rec) if is_inline(&rec) => Ok(false),
            Some(_) => Err(VolumeError::AlreadyExists(format!(
                "volume handle {id} names a persistent volume; an inline volume cannot use it"
            ))),
            None => {
                let spec = VolumeSpec {
                    id: id.clone(),
                    name: id.to_string(),
                    capacity_bytes: size.unwrap_or(super::super::DEFAULT_CAPACITY),
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
    pub(super) fn ensure_secrets_tmpfs(&self, dir: &Path) -> Result<bool, VolumeError> {
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
    pub(super) fn remove_source(&self, kind: ViewKind, id: &VolumeHandle, source: &Path) {
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
}

/// The share-root volume an inline volume's handle names (kubelet's `csi-<sha256>`).
///
/// # Errors
/// `InvalidArgument` for a handle that cannot name one.
/// A publish `serve::decide` refused, for the pod that asked.
fn refused(pod: Option<&PodRef>, refusal: &serve::Refusal) -> VolumeError {
    let who = pod.map(|p| format!(" {}/{}", p.namespace, p.name));
    let who = who.unwrap_or_default();
    VolumeError::FailedPrecondition(format!("pod{who} {refusal}"))
}

impl Published {
    /// A repeat of this publish of `target`: the same volume, options, kind and source,
    /// or `AlreadyExists`.
    fn same_publish(
        &self,
        target: &Path,
        id: &VolumeHandle,
        options: &str,
        kind: ViewKind,
        source: &Path,
    ) -> Result<(), VolumeError> {
        if self.volume_id == *id
            && self.options == options
            && self.kind == kind
            && self.source == source
        {
            return Ok(());
        }
        Err(VolumeError::AlreadyExists(format!(
            "target_path {} is already published (volume {}) with other arguments",
            target.display(),
            self.volume_id
        )))
    }
}

pub(super) fn inline_id(id: &VolumeHandle) -> Result<VolumeId, VolumeError> {
    id.root().ok_or_else(|| {
        VolumeError::InvalidArgument(format!(
            "volume_id {id:?} cannot name an inline volume on the share root"
        ))
    })
}
