//! How a publish is served: the one decision ([`decide`]) between a native view, its
//! FUSE twin, a FUSE view with the request's options, or a refusal, from the volume,
//! the request, the node's share, the pod and the kernel; and each [`Mechanism`]
//! starting, checking and stopping what it serves. volume/node.rs orchestrates and
//! decides nothing of this (docs/SEMANTICS.md, *Native views*).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::{CifsOptions, NativeUse, Ownership, ViewMode, ViewOptions};
use crate::fs::view::Policy;
use crate::sys::Errno;
use crate::sys::mount::{self, Health};

use super::VolumeError;
use super::native;
use super::view::{VIEW_FSTYPE, Views};

/// How a published target is served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    /// A FUSE view with the options the request asked for.
    #[default]
    Fuse,
    /// A native view: the source idmapped so that `disk_group` shows as `shown`.
    Native { disk_group: u32, shown: u32 },
    /// A FUSE view with the native presentation (`mode=native`) of a native volume,
    /// where a native mount cannot serve.
    Twin { disk_group: u32 },
    /// A FUSE view with CIFS semantics and no records ([`unrecorded_options`]), where
    /// the request's semantics need records the share cannot keep.
    Unrecorded,
    /// A FUSE view with the request's semantics and its records in `user.` extended
    /// attributes ([`user_record_options`]), where the share keeps those but no
    /// `trusted.` ones.
    UserRecords,
    /// A FUSE view with the native presentation of a volume whose share keeps its
    /// callers' owners (NFS), acting as each caller there (`ownership=share`,
    /// [`as_callers_options`]): what a pod makes is its own on the server, which
    /// checks what it may do.
    AsCallers { disk_group: u32 },
}

impl Mechanism {
    /// Whether a FUSE view's process serves it (a native view has none).
    pub fn has_process(self) -> bool {
        !matches!(self, Mechanism::Native { .. })
    }

    /// Whether it shows a native volume as a native view does (the native view and its
    /// twin): the volume's root must then be the volume's group's.
    pub fn native_presentation(self) -> bool {
        matches!(
            self,
            Mechanism::Native { .. } | Mechanism::Twin { .. } | Mechanism::AsCallers { .. }
        )
    }

    /// Its name in metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Fuse => "fuse",
            Mechanism::Native { .. } => "native",
            Mechanism::Twin { .. } => "fuse-native",
            Mechanism::Unrecorded => "fuse-cifs",
            Mechanism::UserRecords => "fuse-user-xattr",
            Mechanism::AsCallers { .. } => "fuse-as-callers",
        }
    }

    /// Serves `source` at `target` with the request's `options`: a native view is
    /// mounted (no process), a FUSE view started by `views` (its pid). The twin is a
    /// FUSE view with the native presentation of the volume.
    ///
    /// # Errors
    /// What the mount or the view said.
    pub fn start(
        self,
        views: &Views,
        source: &Path,
        target: &Path,
        options: &ViewOptions,
    ) -> Result<Option<u32>, VolumeError> {
        match self {
            Mechanism::Native { disk_group, shown } => {
                native::mount(source, target, disk_group, shown, options).map(|()| None)
            }
            Mechanism::Twin { .. }
            | Mechanism::Fuse
            | Mechanism::Unrecorded
            | Mechanism::UserRecords
            | Mechanism::AsCallers { .. } => views
                .start(source, target, &self.fuse_options(options))
                .map(Some),
        }
    }

    /// The options a FUSE view serves the request's `options` with this way (a native
    /// view's are the request's own).
    pub fn fuse_options(self, options: &ViewOptions) -> ViewOptions {
        match self {
            Mechanism::Twin { disk_group } => native::twin_options(options, disk_group),
            Mechanism::Unrecorded => unrecorded_options(options),
            Mechanism::UserRecords => user_record_options(options),
            Mechanism::AsCallers { disk_group } => as_callers_options(options, disk_group),
            Mechanism::Fuse | Mechanism::Native { .. } => options.clone(),
        }
    }

    /// What is at `target` of a view served this way.
    pub fn check(self, target: &Path) -> Check {
        match self {
            Mechanism::Native { .. } if native::mounted(target) => Check::Serving,
            Mechanism::Native { .. } => Check::Gone,
            Mechanism::Fuse
            | Mechanism::Twin { .. }
            | Mechanism::Unrecorded
            | Mechanism::UserRecords
            | Mechanism::AsCallers { .. } => match mount::health(target) {
                Health::Mounted(t) if t == VIEW_FSTYPE => Check::Serving,
                Health::Mounted(other) => Check::Foreign(other),
                Health::Dead => Check::Dead,
                Health::NotMounted => Check::Gone,
            },
        }
    }

    /// Stops serving `target`: unmounts a native view (lazily, as views are), stops a
    /// FUSE view and its process `pid`.
    ///
    /// # Errors
    /// `Internal` where the view cannot be unmounted.
    pub fn stop(self, views: &Views, target: &Path, pid: Option<u32>) -> Result<(), VolumeError> {
        match self {
            Mechanism::Native { .. } if native::mounted(target) => mount::unmount_lazy(target)
                .map_err(|e| {
                    VolumeError::Internal(format!(
                        "cannot unmount the native view at {}: {e}",
                        target.display()
                    ))
                }),
            Mechanism::Native { .. } => Ok(()),
            Mechanism::Fuse
            | Mechanism::Twin { .. }
            | Mechanism::Unrecorded
            | Mechanism::UserRecords
            | Mechanism::AsCallers { .. } => views.stop(target, pid),
        }
    }
}

/// What is at a published target, for the mechanism that serves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// The view serves.
    Serving,
    /// A FUSE view whose process is gone (its mount answers `ENOTCONN`).
    Dead,
    /// Nothing of the view is there.
    Gone,
    /// Another file system (its type) is mounted there.
    Foreign(String),
}

/// What is known of the pod a publish is for, from the API server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pod {
    /// It shares the node's user namespace (`hostUsers` true or unset), or there is no
    /// API server (a local driver: no such pods).
    HostUsers,
    /// `hostUsers: false`: its runtime idmaps every volume, which it cannot do to an
    /// idmapped mount.
    UserNamespace,
    /// A container of it (any kind: app, init, ephemeral) is privileged or adds
    /// `CAP_DAC_READ_SEARCH`, `CAP_SYS_ADMIN` or `ALL`, which reach past a bind mount
    /// to the whole file system (which container, and what).
    Privileged(String),
    /// The lookup failed (no pod information, RBAC, the API server down): why.
    Unknown(String),
}

/// The pod a publish is for, as kubelet names it when the CSIDriver has
/// `podInfoOnMount` (`csi.storage.k8s.io/pod.namespace`, `pod.name`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

/// Where the driver learns whether a pod is in a user namespace.
pub trait PodLookup: Send + Sync {
    /// What is known of `pod` (`None`: the publish named no pod).
    fn pod(&self, pod: Option<&PodRef>) -> Pod;
}

/// No API server (a driver run by hand, `scripts/run`, the tests): no pod runs in a
/// user namespace of its own here.
pub struct NoApiServer;

impl PodLookup for NoApiServer {
    fn pod(&self, _: Option<&PodRef>) -> Pod {
        Pod::HostUsers
    }
}

/// Why a publish is a FUSE view rather than a native one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// The volume has no group of its own: made before native views, with the
    /// StorageClass parameter `view: fuse`, or on a share that could not serve them.
    NotNative,
    /// The volume asked to be native, but the share could not serve native views when
    /// it was made (why, as recorded then).
    ShareAtCreate(String),
    /// A secret view (its content lives on a tmpfs of the node plugin's).
    Secrets,
    /// CIFS options (`uid=`, `file_mode=`, `dir_mode=`, `noperm`, `mode=cifs`).
    CifsOptions,
    /// An option only a FUSE view has (named).
    ViewOption(String),
    /// SELinux `context=`, which a bind mount cannot give.
    SelinuxContext,
    /// The share, on this node: cannot be idmapped, or is not `nosuid,nodev` (why).
    Share(String),
    /// A pod in a user namespace.
    UserNamespacePod,
    /// A pod with a container that could reach past a native view (why).
    PrivilegedPod(String),
    /// The pod could not be looked up (why).
    PodUnknown(String),
    /// The request's semantics keep records (chown and chmod of an fsGroup view, a
    /// CIFS view's read-only files), and the share cannot keep them (why).
    NoRecords(String),
    /// The request's semantics keep records, and the share keeps `user.` extended
    /// attributes but no `trusted.` ones (why not).
    UserRecords(String),
    /// A hand mount of a source whose server keeps its callers' owners (NFS): the view
    /// acts as its callers, as the driver serves the volumes it makes there (how).
    OwnersOnShare(String),
}

impl Fallback {
    /// A stable name for metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Fallback::NotNative => "volume-not-native",
            Fallback::ShareAtCreate(_) => "share-at-create",
            Fallback::Secrets => "secret-view",
            Fallback::CifsOptions => "cifs-options",
            Fallback::ViewOption(_) => "view-option",
            Fallback::SelinuxContext => "selinux-context",
            Fallback::Share(_) => "share",
            Fallback::UserNamespacePod => "user-namespace-pod",
            Fallback::PrivilegedPod(_) => "privileged-pod",
            Fallback::PodUnknown(_) => "pod-unknown",
            Fallback::NoRecords(_) => "share-keeps-no-records",
            Fallback::UserRecords(_) => "share-keeps-user-records",
            Fallback::OwnersOnShare(_) => "share-keeps-owners",
        }
    }

    /// Whether the FUSE view presents the volume natively (the twin): where only the
    /// mechanism is what cannot serve, not the presentation the request asked for.
    pub fn twin(&self) -> bool {
        matches!(
            self,
            Fallback::SelinuxContext
                | Fallback::Share(_)
                | Fallback::UserNamespacePod
                | Fallback::PrivilegedPod(_)
                | Fallback::PodUnknown(_)
        )
    }
}

impl std::fmt::Display for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fallback::NotNative => f.write_str(
                "the volume has no group of its own (made before native views, or with view: fuse)",
            ),
            Fallback::ShareAtCreate(why) => write!(
                f,
                "the share could not serve native views when the volume was made, so it is a FUSE volume for good (what its views made belongs to its creators' groups, which a native view would not show as the pod's; a volume made once the share qualifies is native): {why}"
            ),
            Fallback::Secrets => f.write_str("a secret view"),
            Fallback::CifsOptions => f.write_str("CIFS options"),
            Fallback::ViewOption(o) => write!(f, "the option {o}, which only a FUSE view has"),
            Fallback::SelinuxContext => {
                f.write_str("SELinux context=, which a bind mount cannot give")
            }
            Fallback::Share(why) => f.write_str(why),
            Fallback::UserNamespacePod => f.write_str(
                "a pod in a user namespace, whose runtime cannot idmap an idmapped mount again",
            ),
            Fallback::PrivilegedPod(why) => write!(
                f,
                "a pod that could reach past a native view to the whole file system ({why}: open_by_handle_at or mounts)"
            ),
            Fallback::PodUnknown(why) => write!(f, "the pod could not be looked up ({why})"),
            Fallback::NoRecords(why) => write!(
                f,
                "{why}: the view has CIFS semantics without records (owner root, the pod's group, files 0664 and directories 0775 unless the request gave CIFS options; chown and chmod succeed with no effect, as on a kernel CIFS mount without unix extensions). Give the share a file system with extended attributes for fsGroup semantics"
            ),
            Fallback::OwnersOnShare(how) => f.write_str(how),
            Fallback::UserRecords(why) => write!(
                f,
                "{why}: the view keeps its records (chown, chmod, the creator's uid) in user.mountgroup.owner, which every view hides and refuses, but which a process that reaches the share other than through a view (another client of the server) can change; symlinks and FIFOs take no user.* attributes, so they show the derived owner and refuse chown"
            ),
        }
    }
}

/// The option of `options` a native view cannot honour, as the declaration of the
/// options says ([`crate::config::OPTIONS`]): FUSE semantics, or a presentation a bind
/// mount cannot give. Tuning that means nothing natively is not one.
fn fuse_only_option(o: &ViewOptions) -> Option<Fallback> {
    let (item, how) = o.native_obstacle()?;
    Some(match how {
        NativeUse::NotByBindMount => Fallback::SelinuxContext,
        _ if o.mode == ViewMode::Cifs => Fallback::CifsOptions,
        _ => Fallback::ViewOption(item),
    })
}

/// Whether a new publish can be native, in the order the reasons are checked (the pod
/// is asked only when nothing else stands in the way: `pod` is called at most once).
///
/// # Errors
/// The [`Fallback`] that stands in the way.
pub(super) fn native_or_why(
    volume_group: Option<u32>,
    secrets: bool,
    options: &ViewOptions,
    node: &mut dyn Ask,
) -> Result<Mechanism, Fallback> {
    if secrets {
        return Err(Fallback::Secrets);
    }
    let Some(disk_group) = volume_group else {
        return Err(Fallback::NotNative);
    };
    if let Some(f) = fuse_only_option(options) {
        return Err(f);
    }
    native_share(node).map_err(Fallback::Share)?;
    match node.pod() {
        Pod::HostUsers => {}
        Pod::UserNamespace => return Err(Fallback::UserNamespacePod),
        Pod::Privileged(why) => return Err(Fallback::PrivilegedPod(why)),
        Pod::Unknown(why) => return Err(Fallback::PodUnknown(why)),
    }
    Ok(Mechanism::Native {
        disk_group,
        shown: options.group.map_or(disk_group, |g| g.get()),
    })
}

/// Whether a native view of the share may be mounted on this node: the share can
/// serve one, and its views keep `trusted.` records, so that none keeps `user.` ones,
/// which a pod on a native view could write for the others to trust.
fn native_share(node: &mut dyn Ask) -> Result<(), String> {
    node.native_share()?;
    match node.share_records() {
        Records::Trusted => Ok(()),
        Records::User(why) | Records::None(why) => Err(format!(
            "{why}: views of the share keep no records a pod on a native view could not write"
        )),
    }
}

/// What a publish is, for [`decide`].
#[derive(Clone, Copy, Debug)]
pub struct Publish<'a> {
    /// The volume's own group on disk (a native volume's), from its record.
    pub volume_group: Option<u32>,
    /// Why the share could not serve native views when the volume was made, if so.
    pub not_native: Option<&'a str>,
    /// Whether the volume's views act as their callers on a share that keeps their
    /// owners (its record's `owners`).
    pub owners: bool,
    /// A secret view (its content is on a tmpfs of the node plugin's, not the share).
    pub secrets: bool,
    /// The view options of the request (its `mount_flags`, group and read-only).
    pub options: &'a ViewOptions,
    /// How the target is served already (a repeated publish of a view that is gone, a
    /// recovery): `None` for a new publish.
    pub recorded: Option<Mechanism>,
    /// Whether this kernel's FUSE lets a pod's runtime idmap a view
    /// (`FUSE_ALLOW_IDMAP`, Linux 6.12); `None` where not known.
    pub fuse_idmap: Option<bool>,
}

/// How a publish is served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    pub mechanism: Mechanism,
    /// Why a native volume is not served natively, where that is worth a warning (a
    /// volume that is not native, or a secret view, is no surprise): `None` for a
    /// repeat that keeps its mechanism keeps what was recorded.
    pub fallback: Option<Fallback>,
}

/// Why a publish is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A pod in a user namespace on a kernel whose FUSE cannot be idmapped: its
    /// runtime's idmapped mount of a FUSE view fails with `EINVAL` (fs/namespace.c
    /// `can_idmap_mount` refuses a file system without `FS_ALLOW_IDMAP`, which FUSE
    /// gained with `FUSE_ALLOW_IDMAP` in Linux 6.12), and a native view is an idmapped
    /// mount, which `can_idmap_mount` refuses to idmap again.
    UserNamespaceWithoutIdmap,
    /// A pod in a user namespace on a volume whose views act as their callers: its
    /// runtime idmaps the view, and FUSE sends an idmapped mount's requests other than
    /// creations without their callers' ids (`FUSE_INVALID_UIDGID`,
    /// include/uapi/linux/fuse.h), so the view could not act as them.
    UserNamespaceActing,
    /// A volume whose views act as their callers, on a node whose share cannot be
    /// acted on so (why).
    OwnersNotHere(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::UserNamespaceWithoutIdmap => write!(
                f,
                "runs in a user namespace (hostUsers: false), whose runtime idmaps every volume, and this node's kernel ({}) cannot idmap a mountgroup view (FUSE_ALLOW_IDMAP needs Linux 6.12 or later): run the pod on a node with a newer kernel, or with hostUsers: true",
                crate::sys::kernel_release()
            ),
            Refusal::UserNamespaceActing => f.write_str(
                "runs in a user namespace (hostUsers: false), whose runtime idmaps every volume, and this volume's views act as their callers on its NFS share, which an idmapped view cannot (FUSE does not tell it who calls): run the pod with hostUsers: true",
            ),
            Refusal::OwnersNotHere(why) => write!(
                f,
                "uses a volume whose views act as their callers on its share, which this node's mount of the share cannot serve: {why}"
            ),
        }
    }
}

/// What [`decide`] may ask of the node: each question at most once, and only where
/// its answer matters. A new question is one method here and one branch there.
pub trait Ask {
    /// Whether a native view of the share may be mounted on this node, or why not.
    fn native_share(&mut self) -> Result<(), String>;
    /// Which records the share keeps.
    fn share_records(&mut self) -> Records;
    /// Whether this node's share keeps its callers' owners, or why not.
    fn share_owners(&mut self) -> Result<(), String>;
    /// What the pod is.
    fn pod(&mut self) -> Pod;
}

/// [`Ask`] that asks the pod once, however often it is asked.
struct PodOnce<'a> {
    node: &'a mut dyn Ask,
    pod: Option<Pod>,
}

impl Ask for PodOnce<'_> {
    fn native_share(&mut self) -> Result<(), String> {
        self.node.native_share()
    }
    fn share_records(&mut self) -> Records {
        self.node.share_records()
    }
    fn share_owners(&mut self) -> Result<(), String> {
        self.node.share_owners()
    }
    fn pod(&mut self) -> Pod {
        self.pod.get_or_insert_with(|| self.node.pod()).clone()
    }
}

/// [`Ask`] by four functions.
pub struct Asking<S, R, O, P> {
    pub share: S,
    pub records: R,
    pub owners: O,
    pub pod: P,
}

impl<S, R, O, P> Ask for Asking<S, R, O, P>
where
    S: FnMut() -> Result<(), String>,
    R: FnMut() -> Records,
    O: FnMut() -> Result<(), String>,
    P: FnMut() -> Pod,
{
    fn native_share(&mut self) -> Result<(), String> {
        (self.share)()
    }
    fn share_records(&mut self) -> Records {
        (self.records)()
    }
    fn share_owners(&mut self) -> Result<(), String> {
        (self.owners)()
    }
    fn pod(&mut self) -> Pod {
        (self.pod)()
    }
}

/// The records a share keeps, as views write them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Records {
    /// In `trusted.` extended attributes, which only the root daemon reaches.
    Trusted,
    /// In `user.` ones only (why not `trusted.`): NFS 4.2, SMB with extended
    /// attributes.
    User(String),
    /// None (why).
    None(String),
}

impl Records {
    /// The records a share keeps, from its answers: `keeps_trusted` for `trusted.`
    /// attributes, and, only where it keeps none, `keeps_user` for `user.` ones (each
    /// an error saying why not).
    pub fn probed(
        keeps_trusted: Result<(), String>,
        keeps_user: impl FnOnce() -> Result<(), String>,
    ) -> Records {
        match keeps_trusted {
            Ok(()) => Records::Trusted,
            Err(trusted) => match keeps_user() {
                Ok(()) => Records::User(trusted),
                Err(user) => Records::None(format!("{trusted}; {user}")),
            },
        }
    }
}

/// The options of a view that keeps its records in `user.` extended attributes.
pub fn user_record_options(options: &ViewOptions) -> ViewOptions {
    ViewOptions {
        ownership: Ownership::EmulateUser,
        ..options.clone()
    }
}

/// The options of a view that acts as its callers on a share that keeps their owners:
/// the twin's presentation of the volume's group, `ownership=share`.
pub fn as_callers_options(options: &ViewOptions, disk_group: u32) -> ViewOptions {
    ViewOptions {
        ownership: Ownership::Share,
        ..native::twin_options(options, disk_group)
    }
}

/// The options of a view of a share that keeps no records: the request's CIFS
/// options, or for a request with fsGroup semantics the CIFS semantics closest to what
/// kubelet's chown would show (owner root, the request's group, files 0664 and
/// directories 0775); either way without records, so that chown and chmod succeed
/// with no effect, as on a kernel CIFS mount without unix extensions.
pub fn unrecorded_options(options: &ViewOptions) -> ViewOptions {
    let cifs = match options.mode {
        ViewMode::Cifs => options.cifs,
        ViewMode::FsGroup | ViewMode::Native => CifsOptions {
            uid: 0,
            file_mode: 0o664,
            dir_mode: 0o775,
            noperm: false,
        },
    };
    ViewOptions {
        mode: ViewMode::Cifs,
        cifs,
        ownership: Ownership::Off,
        disk_group: None,
        ..options.clone()
    }
}

/// Where a FUSE view with `options` would keep records the share cannot keep
/// (`records`, asked only then): the mechanism that serves it instead, and why.
fn records_fallback(
    options: &ViewOptions,
    records: impl FnOnce() -> Records,
) -> Option<(Mechanism, Fallback)> {
    if !Policy::from_options(options).keeps_records() {
        return None;
    }
    match records() {
        Records::Trusted => None,
        Records::User(_) if options.ownership == Ownership::EmulateUser => None,
        Records::User(why) => Some((Mechanism::UserRecords, Fallback::UserRecords(why))),
        Records::None(why) => Some((Mechanism::Unrecorded, Fallback::NoRecords(why))),
    }
}

/// What `mountgroup mount` serves of `source` for `options` that name no
/// `ownership=`: what the driver serves of a share with the same attributes
/// ([`decide`]'s records step): the options themselves where the source keeps
/// `trusted.` records, `user.` ones where it keeps only those, CIFS semantics without
/// records where it keeps none; with the [`Fallback`] taken. A source that cannot be
/// probed is left to the mount, which names what is wrong with it.
pub fn hand_mount_options(source: &Path, options: &ViewOptions) -> (ViewOptions, Option<Fallback>) {
    use crate::fs::record::{RECORD_XATTR, USER_RECORD_XATTR};
    let Ok(root) = crate::sys::file::open_root(source) else {
        return (options.clone(), None);
    };
    let keeps = |name: &std::ffi::CStr| {
        crate::transport::keeps_records(std::os::fd::AsFd::as_fd(&root), name, options.readonly)
            .map_err(|e| match e {
                Errno::EOPNOTSUPP | Errno::ENOSYS => format!(
                    "the source's file system keeps no extended attributes {} ({e})",
                    name.to_string_lossy()
                ),
                e => format!("extended attribute {}: {e}", name.to_string_lossy()),
            })
    };
    if let Some(acting) = hand_as_callers(source, std::os::fd::AsFd::as_fd(&root), options) {
        return acting;
    }
    let records = || Records::probed(keeps(RECORD_XATTR), || keeps(USER_RECORD_XATTR));
    match records_fallback(options, records) {
        Some((mechanism, f)) => (mechanism.fuse_options(options), Some(f)),
        None => (options.clone(), None),
    }
}

/// A hand mount with `gid=` and the group view's or the native presentation, of a
/// source whose server keeps its callers' owners ([`crate::share::keeps_owners`]): as
/// the driver serves the volumes it makes there, a view that acts as its callers, the
/// source's own group (or `disk_gid=`) as the volume's, shown as `gid=`. Not for a
/// source in group 0, which no pod's files should be made in.
fn hand_as_callers(
    source: &Path,
    root: std::os::fd::BorrowedFd<'_>,
    options: &ViewOptions,
) -> Option<(ViewOptions, Option<Fallback>)> {
    let shown = options.group?.get();
    let presentation = match options.mode {
        ViewMode::Native => true,
        ViewMode::FsGroup => acting_serves(options),
        ViewMode::Cifs => false,
    };
    if !presentation || crate::share::keeps_owners(source).is_err() {
        return None;
    }
    let disk_group = match options.disk_group {
        Some(g) => g,
        None => crate::sys::file::stat(root).ok()?.gid,
    };
    if disk_group == 0 {
        return None;
    }
    let how = format!(
        "{} is on NFS, whose server keeps owners and checks each caller's permissions: the view acts as each caller there (ownership=share), the source's group {disk_group} shown as {shown}, as the driver serves the volumes it makes on NFS",
        source.display()
    );
    Some((
        as_callers_options(options, disk_group),
        Some(Fallback::OwnersOnShare(how)),
    ))
}

/// Whether a view acting as its callers serves what `options` ask: not CIFS options or
/// another option only a FUSE view's own semantics have (`context=` it can give).
fn acting_serves(options: &ViewOptions) -> bool {
    matches!(
        fuse_only_option(options),
        None | Some(Fallback::SelinuxContext)
    )
}

/// How a new publish of a volume whose views act as their callers is served: so,
/// unless the request's options are a FUSE view's own semantics (CIFS options, an
/// option only a FUSE view has), which [`decide`] serves as for any volume; refused
/// for a pod in a user namespace and where this node's share cannot be acted on.
fn as_callers(publish: &Publish<'_>, node: &mut dyn Ask) -> Result<Option<Served>, Refusal> {
    let (true, Some(disk_group), false) = (publish.owners, publish.volume_group, publish.secrets)
    else {
        return Ok(None);
    };
    if !acting_serves(publish.options) {
        return Ok(None);
    }
    node.share_owners().map_err(Refusal::OwnersNotHere)?;
    if node.pod() == Pod::UserNamespace {
        return Err(Refusal::UserNamespaceActing);
    }
    Ok(Some(Served {
        mechanism: Mechanism::AsCallers { disk_group },
        fallback: None,
    }))
}

/// How a publish is served, or why it is refused; the one place that decides it.
///
/// - A repeat (`recorded`) is served as it was, except that a native view is native
///   only while the share still qualifies (a mount made since counts), else its twin.
/// - A new publish for a pod in a user namespace is refused where this kernel cannot
///   idmap a FUSE view ([`Refusal`]).
/// - A new publish of a volume whose views act as their callers is such a view
///   ([`Mechanism::AsCallers`]) unless its options are a FUSE view's own semantics.
/// - A new publish is native unless something stands in the way ([`Fallback`], in the
///   order checked); then the twin where only the mechanism cannot serve (the volume's
///   presentation is still what the request asked for), else a FUSE view with the
///   request's options, or, where those keep records the share cannot keep, with CIFS
///   semantics and none ([`Mechanism::Unrecorded`]).
///
/// # Errors
/// The [`Refusal`].
pub fn decide(publish: &Publish<'_>, node: &mut impl Ask) -> Result<Served, Refusal> {
    if let Some(recorded) = publish.recorded {
        let Mechanism::Native { disk_group, .. } = recorded else {
            return Ok(Served {
                mechanism: recorded,
                fallback: None,
            });
        };
        return Ok(match native_share(node) {
            Ok(()) => Served {
                mechanism: recorded,
                fallback: None,
            },
            Err(why) => Served {
                mechanism: Mechanism::Twin { disk_group },
                fallback: Some(Fallback::Share(why)),
            },
        });
    }
    let mut node = PodOnce { node, pod: None };
    if publish.fuse_idmap == Some(false) && node.pod() == Pod::UserNamespace {
        return Err(Refusal::UserNamespaceWithoutIdmap);
    }
    if let Some(served) = as_callers(publish, &mut node)? {
        return Ok(served);
    }
    let native = native_or_why(
        publish.volume_group,
        publish.secrets,
        publish.options,
        &mut node,
    );
    let fallback = match native {
        Ok(mechanism) => {
            return Ok(Served {
                mechanism,
                fallback: None,
            });
        }
        Err(Fallback::NotNative) => match publish.not_native {
            Some(why) => Fallback::ShareAtCreate(why.to_string()),
            None => Fallback::NotNative,
        },
        Err(f) => f,
    };
    let mechanism = match (publish.volume_group, fallback.twin()) {
        (Some(disk_group), true) => Mechanism::Twin { disk_group },
        _ => Mechanism::Fuse,
    };
    if mechanism == Mechanism::Fuse
        && !publish.secrets
        && let Some((mechanism, fallback)) =
            records_fallback(publish.options, || node.share_records())
    {
        return Ok(Served {
            mechanism,
            fallback: Some(fallback),
        });
    }
    let expected = matches!(fallback, Fallback::NotNative | Fallback::Secrets);
    Ok(Served {
        mechanism,
        fallback: (!expected).then_some(fallback),
    })
}

/// Why `options` cannot be a native view's, as `mountgroup mount --native` refuses
/// them: what the driver would serve with a FUSE view instead (FUSE semantics,
/// `context=`), and `disk_gid=`, which is the twin's (a native view takes its group
/// from the source). Tuning of a FUSE view is not a reason: it means nothing natively.
pub fn native_refusal(options: &ViewOptions) -> Option<String> {
    if options.disk_group.is_some() {
        return Some(Fallback::ViewOption("disk_gid=".into()).to_string());
    }
    let mut node = Asking {
        share: || Ok(()),
        records: || Records::Trusted,
        owners: || Ok(()),
        pod: || Pod::HostUsers,
    };
    native_or_why(Some(0), false, options, &mut node)
        .err()
        .map(|f| f.to_string())
}

/// Why `mountgroup mount --native` did not mount: a refusal (bad input, the command's
/// exit status 2) or a failed mount.
#[derive(Debug)]
pub enum ByHand {
    Refused(String),
    Failed(VolumeError),
}

impl std::fmt::Display for ByHand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ByHand::Refused(why) => f.write_str(why),
            ByHand::Failed(e) => write!(f, "{e}"),
        }
    }
}

/// Mounts a native view of `source` on `mountpoint` by hand, after what the driver
/// asks before it serves one: options a native view can serve (`native_refusal`), a
/// source with a group of its own (a native view of group 0 would give the `gid=`
/// group what group 0 may do), a share that can be idmapped and holds nothing inert
/// natively, a mount point that can take it.
///
/// # Errors
/// `Refused` naming what is wrong and how to mend it; `Failed` naming the step.
pub fn mount_native_by_hand(
    source: &Path,
    mountpoint: &Path,
    options: &ViewOptions,
) -> Result<(), ByHand> {
    use std::os::unix::fs::MetadataExt;
    let disk_group = match std::fs::metadata(source) {
        Ok(m) if m.is_dir() => m.gid(),
        Ok(_) => {
            return Err(ByHand::Refused(format!(
                "source {} is not a directory",
                source.display()
            )));
        }
        Err(e) => return Err(ByHand::Refused(format!("source {}: {e}", source.display()))),
    };
    if let Some(why) = native_refusal(options) {
        return Err(ByHand::Refused(format!(
            "--native cannot serve {why}: drop it, or mount a FUSE view (without --native)"
        )));
    }
    if disk_group == 0 {
        return Err(ByHand::Refused(format!(
            "source {}'s group is root's (0): a native view would give the gid= group what group 0 may do; give it a group of its own (chgrp GROUP, chmod g+s)",
            source.display()
        )));
    }
    // What the driver asks of a share before it makes native volumes on it.
    for check in [crate::share::idmappable, crate::share::native_inert] {
        check(source).map_err(|why| ByHand::Refused(format!("--native: {why}")))?;
    }
    crate::transport::check_mountpoint(mountpoint).map_err(|e| ByHand::Refused(e.to_string()))?;
    let shown = options.group.map_or(disk_group, |g| g.get());
    native::mount(source, mountpoint, disk_group, shown, options).map_err(ByHand::Failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(s: &str) -> ViewOptions {
        ViewOptions::parse(s).unwrap()
    }

    const G: u32 = 2_000_000_000;

    /// A node whose share keeps records.
    fn asking(share: impl FnMut() -> Result<(), String>, pod: impl FnMut() -> Pod) -> impl Ask {
        Asking {
            share,
            records: || Records::Trusted,
            owners: || -> Result<(), String> { panic!("owners asked of a volume without them") },
            pod,
        }
    }

    /// A publish of a native volume (`G`), new, on a kernel that can idmap views.
    fn new<'a>(options: &'a ViewOptions) -> Publish<'a> {
        Publish {
            volume_group: Some(G),
            not_native: None,
            owners: false,
            secrets: false,
            options,
            recorded: None,
            fuse_idmap: Some(true),
        }
    }

    /// The decision as (mechanism name, fallback code or "", twin's disk group), or the
    /// refusal's name.
    fn outcome(r: Result<Served, Refusal>) -> String {
        match r {
            Ok(s) => format!(
                "{} {}",
                s.mechanism.name(),
                s.fallback.as_ref().map_or("-", Fallback::code)
            ),
            Err(Refusal::UserNamespaceWithoutIdmap) => "refused".into(),
            Err(Refusal::UserNamespaceActing) => "refused-acting".into(),
            Err(Refusal::OwnersNotHere(_)) => "refused-owners".into(),
        }
    }

    #[test]
    fn one_decision_for_every_publish() {
        let ok = || Ok(());
        let bad = || Err::<(), _>("a suid mount of the share".to_string());
        let host = || Pod::HostUsers;
        let userns = || Pod::UserNamespace;
        let never_share = || -> Result<(), String> { panic!("the share asked without need") };
        let never_pod = || -> Pod { panic!("the pod asked without need") };
        let plain = opts("gid=4242");
        let fuse_volume = Publish {
            volume_group: None,
            ..new(&plain)
        };
        let cases: Vec<(&str, String, &str)> = vec![
            (
                "native",
                outcome(decide(&new(&plain), &mut asking(ok, host))),
                "native -",
            ),
            (
                "tuning is no reason",
                outcome(decide(
                    &new(&opts("gid=1,threads=2,attr_timeout=5")),
                    &mut asking(ok, host),
                )),
                "native -",
            ),
            (
                "no group",
                outcome(decide(&fuse_volume, &mut asking(never_share, never_pod))),
                "fuse -",
            ),
            (
                "share at create",
                outcome(decide(
                    &Publish {
                        not_native: Some("a suid mount"),
                        ..fuse_volume
                    },
                    &mut asking(never_share, never_pod),
                )),
                "fuse share-at-create",
            ),
            (
                "secrets",
                outcome(decide(
                    &Publish {
                        secrets: true,
                        ..new(&plain)
                    },
                    &mut asking(never_share, never_pod),
                )),
                "fuse -",
            ),
            (
                "cifs",
                outcome(decide(
                    &new(&opts("gid=1,file_mode=0644")),
                    &mut asking(never_share, never_pod),
                )),
                "fuse cifs-options",
            ),
            (
                "ownership=off",
                outcome(decide(
                    &new(&opts("gid=1,ownership=off")),
                    &mut asking(never_share, never_pod),
                )),
                "fuse view-option",
            ),
            (
                "sync",
                outcome(decide(
                    &new(&opts("gid=1,sync")),
                    &mut asking(never_share, never_pod),
                )),
                "fuse view-option",
            ),
            (
                "context",
                outcome(decide(
                    &new(&opts(
                        "gid=1,context=\"system_u:object_r:container_file_t:s0\"",
                    )),
                    &mut asking(never_share, never_pod),
                )),
                "fuse-native selinux-context",
            ),
            (
                "share",
                outcome(decide(&new(&plain), &mut asking(bad, never_pod))),
                "fuse-native share",
            ),
            (
                "user namespace",
                outcome(decide(&new(&plain), &mut asking(ok, userns))),
                "fuse-native user-namespace-pod",
            ),
            (
                "privileged",
                outcome(decide(
                    &new(&plain),
                    &mut asking(ok, || {
                        Pod::Privileged("its container x adds DAC_READ_SEARCH".into())
                    }),
                )),
                "fuse-native privileged-pod",
            ),
            (
                "pod unknown",
                outcome(decide(
                    &new(&plain),
                    &mut asking(ok, || Pod::Unknown("RBAC".into())),
                )),
                "fuse-native pod-unknown",
            ),
            // A kernel without FUSE_ALLOW_IDMAP: a pod in a user namespace can use no
            // view, native or FUSE, whatever the volume.
            (
                "user namespace, no idmap",
                outcome(decide(
                    &Publish {
                        fuse_idmap: Some(false),
                        ..new(&plain)
                    },
                    &mut asking(never_share, userns),
                )),
                "refused",
            ),
            (
                "user namespace, no idmap, FUSE volume",
                outcome(decide(
                    &Publish {
                        fuse_idmap: Some(false),
                        ..fuse_volume
                    },
                    &mut asking(never_share, userns),
                )),
                "refused",
            ),
            (
                "no idmap, host users",
                outcome(decide(
                    &Publish {
                        fuse_idmap: Some(false),
                        ..new(&plain)
                    },
                    &mut asking(ok, host),
                )),
                "native -",
            ),
            (
                "idmap unknown",
                outcome(decide(
                    &Publish {
                        fuse_idmap: None,
                        ..new(&plain)
                    },
                    &mut asking(ok, userns),
                )),
                "fuse-native user-namespace-pod",
            ),
        ];
        let got: Vec<(&str, &str)> = cases.iter().map(|(w, o, _)| (*w, o.as_str())).collect();
        let want: Vec<(&str, &str)> = cases.iter().map(|(w, _, e)| (*w, *e)).collect();
        assert_eq!(got, want);
        // The twin keeps the volume's group; the native view shows the request's.
        assert_eq!(
            decide(&new(&plain), &mut asking(bad, never_pod))
                .unwrap()
                .mechanism,
            Mechanism::Twin { disk_group: G }
        );
        assert_eq!(
            decide(&new(&opts("")), &mut asking(ok, host))
                .unwrap()
                .mechanism,
            Mechanism::Native {
                disk_group: G,
                shown: G
            }
        );
    }

    #[test]
    fn a_view_served_again_is_native_only_while_the_share_qualifies() {
        let native = Mechanism::Native {
            disk_group: G,
            shown: 4242,
        };
        let twin = Mechanism::Twin { disk_group: G };
        let never_share = || -> Result<(), String> { panic!("the share asked without need") };
        let never_pod = || -> Pod { panic!("a repeat asks no pod") };
        let o = opts("gid=4242");
        let again = |recorded| Publish {
            recorded: Some(recorded),
            fuse_idmap: Some(false),
            ..new(&o)
        };
        assert_eq!(
            decide(&again(native), &mut asking(|| Ok(()), never_pod)),
            Ok(Served {
                mechanism: native,
                fallback: None
            })
        );
        assert_eq!(
            decide(
                &again(native),
                &mut asking(|| Err("a suid mount".into()), never_pod)
            ),
            Ok(Served {
                mechanism: twin,
                fallback: Some(Fallback::Share("a suid mount".into()))
            })
        );
        for kept in [twin, Mechanism::Fuse] {
            assert_eq!(
                decide(&again(kept), &mut asking(never_share, never_pod)),
                Ok(Served {
                    mechanism: kept,
                    fallback: None
                })
            );
        }
    }

    #[test]
    fn a_volume_whose_share_keeps_its_owners_is_served_acting_as_its_callers() {
        let o = |s: &str| opts(s);
        let owners_volume = |options| Publish {
            owners: true,
            ..new(options)
        };
        let run =
            |p: &Publish<'_>, owners: &dyn Fn() -> Result<(), String>, pod: &dyn Fn() -> Pod| {
                outcome(decide(
                    p,
                    &mut Asking {
                        share: || Err::<(), _>("NFS cannot be idmapped".to_string()),
                        records: || Records::User("no trusted.* attributes".to_string()),
                        owners: || owners(),
                        pod: || pod(),
                    },
                ))
            };
        let ok = || Ok(());
        let krb = || Err("mounted sec=krb5p".to_string());
        let never = || -> Result<(), String> { panic!("owners asked of a volume without them") };
        let host = || Pod::HostUsers;
        let userns = || Pod::UserNamespace;
        let (fsgroup, cifs) = (o("gid=4242"), o("gid=4242,file_mode=0640"));
        let cases: Vec<(&str, String, &str)> = vec![
            (
                "fsgroup",
                run(&owners_volume(&fsgroup), &ok, &host),
                "fuse-as-callers -",
            ),
            (
                "CIFS options are a FUSE view's own semantics",
                run(&owners_volume(&cifs), &never, &host),
                "fuse-user-xattr share-keeps-user-records",
            ),
            (
                "a node that mounts the share sec=krb5p",
                run(&owners_volume(&fsgroup), &krb, &host),
                "refused-owners",
            ),
            (
                "a pod in a user namespace",
                run(&owners_volume(&fsgroup), &ok, &userns),
                "refused-acting",
            ),
            (
                "a volume made before (no owners) keeps its mechanism",
                run(&new(&fsgroup), &never, &host),
                "fuse-native share",
            ),
        ];
        for (what, got, want) in cases {
            assert_eq!(got, want, "{what}");
        }
        // A repeat is served as it was.
        let acting = Mechanism::AsCallers { disk_group: G };
        let again = Publish {
            recorded: Some(acting),
            ..owners_volume(&fsgroup)
        };
        assert_eq!(run(&again, &never, &userns), "fuse-as-callers -");
        // What the view is started with: the twin's presentation, acting as callers.
        let served = acting.fuse_options(&fsgroup);
        assert_eq!(
            (served.mode, served.disk_group, served.ownership),
            (ViewMode::Native, Some(G), Ownership::Share)
        );
        assert!(acting.native_presentation() && acting.has_process());
        assert_eq!(
            ViewOptions::parse(&served.to_option_string()).unwrap(),
            served
        );
    }

    #[test]
    fn a_share_that_keeps_no_records_gets_cifs_semantics_without_any() {
        let none = || Records::None("no extended attributes".to_string());
        let user = || Records::User("no trusted.* extended attributes".to_string());
        let never = || -> Records { panic!("the records asked without need") };
        let no_share = || Err::<(), _>("cannot be idmapped".to_string());
        let host = || Pod::HostUsers;
        let o = |s: &str| opts(s);
        let fuse_volume = |options| Publish {
            volume_group: None,
            ..new(options)
        };
        let run = |p: &Publish<'_>, records: &dyn Fn() -> Records| {
            outcome(decide(
                p,
                &mut Asking {
                    share: no_share,
                    records: || records(),
                    owners: || Ok(()),
                    pod: host,
                },
            ))
        };
        let (fsgroup, cifs, off, plain, asked_user) = (
            o("gid=4242"),
            o("gid=4242,file_mode=0640"),
            o("gid=4242,ownership=off"),
            o(""),
            o("gid=4242,ownership=emulate-user"),
        );
        let secrets = Publish {
            secrets: true,
            ..fuse_volume(&fsgroup)
        };
        let cases: Vec<(&str, String, &str)> = vec![
            (
                "fsgroup",
                run(&fuse_volume(&fsgroup), &none),
                "fuse-cifs share-keeps-no-records",
            ),
            (
                "cifs",
                run(&fuse_volume(&cifs), &none),
                "fuse-cifs share-keeps-no-records",
            ),
            (
                "fsgroup, records kept",
                run(&fuse_volume(&fsgroup), &|| Records::Trusted),
                "fuse -",
            ),
            (
                "fsgroup, user.* records",
                run(&fuse_volume(&fsgroup), &user),
                "fuse-user-xattr share-keeps-user-records",
            ),
            (
                "cifs, user.* records",
                run(&fuse_volume(&cifs), &user),
                "fuse-user-xattr share-keeps-user-records",
            ),
            (
                "asked for user.* records",
                run(&fuse_volume(&asked_user), &user),
                "fuse -",
            ),
            (
                "asked for user.* records, none kept",
                run(&fuse_volume(&asked_user), &none),
                "fuse-cifs share-keeps-no-records",
            ),
            // What keeps no records never asks.
            ("ownership=off", run(&fuse_volume(&off), &never), "fuse -"),
            ("plain", run(&fuse_volume(&plain), &never), "fuse -"),
            ("secrets", run(&secrets, &never), "fuse -"),
            ("twin", run(&new(&fsgroup), &never), "fuse-native share"),
        ];
        let got: Vec<(&str, &str)> = cases.iter().map(|(w, o, _)| (*w, o.as_str())).collect();
        let want: Vec<(&str, &str)> = cases.iter().map(|(w, _, e)| (*w, *e)).collect();
        assert_eq!(got, want);
        // Served again as it was, without asking.
        let again = Publish {
            recorded: Some(Mechanism::Unrecorded),
            ..fuse_volume(&fsgroup)
        };
        assert_eq!(run(&again, &never), "fuse-cifs -");
        let again = Publish {
            recorded: Some(Mechanism::UserRecords),
            ..fuse_volume(&fsgroup)
        };
        assert_eq!(run(&again, &never), "fuse-user-xattr -");
        // A share whose views keep user.* records serves no native view, new or
        // again: a pod on one could write the records the others trust.
        for recorded in [
            None,
            Some(Mechanism::Native {
                disk_group: G,
                shown: 4242,
            }),
        ] {
            let p = Publish {
                recorded,
                ..new(&fsgroup)
            };
            let served = decide(
                &p,
                &mut Asking {
                    share: || Ok(()),
                    records: user,
                    owners: || Ok(()),
                    pod: host,
                },
            );
            assert_eq!(outcome(served), "fuse-native share", "{recorded:?}");
        }
        let opened = user_record_options(&fsgroup);
        assert_eq!(opened.ownership, Ownership::EmulateUser);
        assert_eq!(
            opened.to_option_string(),
            opts("gid=4242,ownership=emulate-user").to_option_string()
        );
    }

    #[test]
    fn records_are_trusted_else_user_else_none_with_every_reason() {
        let no = |why: &str| Err::<(), String>(why.into());
        assert_eq!(
            Records::probed(Ok(()), || panic!("user.* asked")),
            Records::Trusted
        );
        assert_eq!(
            Records::probed(no("t"), || Ok(())),
            Records::User("t".into())
        );
        assert_eq!(
            Records::probed(no("t"), || no("u")),
            Records::None("t; u".into())
        );
    }

    #[test]
    fn a_view_without_records_shows_cifs_semantics() {
        let u = unrecorded_options(&opts("gid=4242,ro,attr_timeout=3"));
        assert_eq!(
            u.to_option_string(),
            opts("gid=4242,mode=cifs,uid=0,file_mode=0664,dir_mode=0775,ownership=off,ro,attr_timeout=3")
                .to_option_string()
        );
        assert!(!Policy::from_options(&u).keeps_records());
        // A CIFS request keeps its own modes.
        let u = unrecorded_options(&opts("gid=4242,uid=1000,file_mode=0600,dir_mode=0700"));
        assert_eq!(
            u.to_option_string(),
            opts("gid=4242,uid=1000,file_mode=0600,dir_mode=0700,ownership=off").to_option_string()
        );
    }

    #[test]
    fn a_native_mount_by_hand_refuses_what_the_driver_would_not_serve_natively() {
        for bad in [
            "gid=1,uid=1000",
            "gid=1,file_mode=0644",
            "gid=1,noperm",
            "gid=1,ownership=off",
            "gid=1,sync",
            "gid=1,context=\"system_u:object_r:container_file_t:s0\"",
            "mode=native,gid=1,disk_gid=7",
        ] {
            assert!(native_refusal(&opts(bad)).is_some(), "{bad}");
        }
        for good in ["gid=1", "gid=1,ro,noexec,noatime", "", "gid=1,threads=2"] {
            assert_eq!(native_refusal(&opts(good)), None, "{good}");
        }
    }
}
