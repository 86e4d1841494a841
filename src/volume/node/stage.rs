//! Staging: a bind of the share root's directory, or a named share mounted with the
//! node-stage Secret, recorded before the call returns; unstaging.

use super::*;

impl Node {
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
    pub(super) fn staged_here(
        &self,
        id: &VolumeHandle,
        staging_path: &Path,
    ) -> Result<bool, VolumeError> {
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
    pub(super) fn record_stage(
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
    pub(super) fn stage_named(&self, req: &StageRequest<'_>) -> Result<(), VolumeError> {
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
}

/// Says, where the NFS server answers the driver's root as another user
/// (`root_squash`), what that means for the group views of a volume of data already
/// on the export (a static PV's): their daemon reaches only what that user may, so a
/// pod's call on what it may not answers the server's `EACCES`, where kubelet's chown
/// would have let the pod's group reach it. Asked of the share's root with
/// `access(2)`, which the NFS client asks the server: nothing is made or changed.
pub(super) fn say_if_squashed(staging: &Path, share: &str) {
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
pub(super) fn set_mode(staging: &Path, mode: u32) {
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
