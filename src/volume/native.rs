//! Native views: a volume's directory bind-mounted with an idmapping that shows the
//! volume's own group as the pod's fsGroup, served by the kernel alone (no process,
//! native speed). Where one cannot serve, a FUSE view does, and the reason is named
//! (docs/SEMANTICS.md, *Native views*).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::{Atime, Ownership, ViewMode, ViewOptions};
use crate::sys::mount::NativeAttrs;

use super::VolumeError;

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
}

impl Mechanism {
    /// Whether a FUSE view's process serves it (a native view has none).
    pub fn has_process(self) -> bool {
        !matches!(self, Mechanism::Native { .. })
    }

    /// Its name in metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Fuse => "fuse",
            Mechanism::Native { .. } => "native",
            Mechanism::Twin { .. } => "fuse-native",
        }
    }
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
    ViewOption(&'static str),
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
        }
    }
}

/// The option of `options` that asks for FUSE semantics (a name for the log), if any.
/// Tuning that means nothing natively (threads, timeouts, passthrough, direct I/O,
/// transport, fsname) is not one: a native view has no daemon to tune.
fn fuse_only_option(o: &ViewOptions) -> Option<Fallback> {
    match o.mode {
        ViewMode::Cifs => return Some(Fallback::CifsOptions),
        ViewMode::Native => return Some(Fallback::ViewOption("mode=native")),
        ViewMode::FsGroup => {}
    }
    if o.ownership == Ownership::Off {
        return Some(Fallback::ViewOption("ownership=off"));
    }
    for (on, name) in [
        (o.vfs.sync, "sync"),
        (o.vfs.dirsync, "dirsync"),
        (o.vfs.lazytime, "lazytime"),
    ] {
        if on {
            return Some(Fallback::ViewOption(name));
        }
    }
    None
}

/// Whether a publish can be native, in the order the reasons are checked (the pod is
/// asked only when nothing else stands in the way: `pod` is called at most once).
///
/// # Errors
/// The [`Fallback`] that stands in the way.
pub fn decide(
    volume_group: Option<u32>,
    secrets: bool,
    options: &ViewOptions,
    share: impl FnOnce() -> Result<(), String>,
    pod: impl FnOnce() -> Pod,
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
    if options.selinux_context.is_some() {
        return Err(Fallback::SelinuxContext);
    }
    share().map_err(Fallback::Share)?;
    match pod() {
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

/// How a target recorded as served by `recorded` is served again (a repeated publish of
/// a view that is gone, a recovery): as it was, except that a native view is native
/// only while the share still qualifies (`share`, asked for a native view only: a mount
/// made since counts), and else its twin, for the reason returned.
pub fn again(
    recorded: Mechanism,
    share: impl FnOnce() -> Result<(), String>,
) -> (Mechanism, Option<Fallback>) {
    let Mechanism::Native { disk_group, .. } = recorded else {
        return (recorded, None);
    };
    match share() {
        Ok(()) => (recorded, None),
        Err(why) => (Mechanism::Twin { disk_group }, Some(Fallback::Share(why))),
    }
}

/// Why `options` cannot be a native view's, as `mountgroup mount --native` refuses
/// them: what the driver would serve with a FUSE view instead (FUSE semantics,
/// `context=`), and `disk_gid=`, which is the twin's (a native view takes its group
/// from the source). Tuning of a FUSE view is not a reason: it means nothing natively.
pub fn refusal(options: &ViewOptions) -> Option<String> {
    if options.disk_group.is_some() {
        return Some(Fallback::ViewOption("disk_gid=").to_string());
    }
    decide(Some(0), false, options, || Ok(()), || Pod::HostUsers)
        .err()
        .map(|f| f.to_string())
}

/// The options of the twin of a native volume: its presentation (`mode=native`) with
/// the request's group and flags.
pub fn twin_options(options: &ViewOptions, disk_group: u32) -> ViewOptions {
    ViewOptions {
        mode: ViewMode::Native,
        disk_group: Some(disk_group),
        ..options.clone()
    }
}

/// Mounts a native view of `source` on `target`: an idmapped clone showing
/// `disk_group` as `shown`, `nosuid,nodev`, with the request's `ro`, `noexec` and
/// access-time options. No process serves it.
///
/// # Errors
/// `Internal` naming the step that failed.
pub fn mount(
    source: &Path,
    target: &Path,
    disk_group: u32,
    shown: u32,
    options: &ViewOptions,
) -> Result<(), VolumeError> {
    use std::os::fd::AsFd;
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        VolumeError::Internal(format!(
            "native view of {} on {}: {what}: {e}",
            source.display(),
            target.display()
        ))
    };
    let ns = crate::sys::process::user_namespace(
        crate::sys::process::IDENTITY_MAP,
        &crate::sys::process::swap_map(disk_group, shown),
    )
    .map_err(|e| failed("user namespace", &e))?;
    let attrs = NativeAttrs {
        readonly: options.readonly,
        noexec: options.noexec,
        noatime: match options.vfs.atime {
            Atime::Relative => None,
            Atime::Never => Some(true),
            Atime::Always => Some(false),
        },
        nodiratime: options.vfs.nodiratime,
    };
    let tree = crate::sys::mount::native_view(source, ns.as_fd(), attrs)
        .map_err(|e| failed("idmapped clone", &e))?;
    crate::sys::mount::attach_detached(tree.as_fd(), target).map_err(|e| failed("move_mount", &e))
}

/// Whether a native view is mounted at `target` (an idmapped mount is there).
pub fn mounted(target: &Path) -> bool {
    crate::sys::mount::is_idmapped(target).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(s: &str) -> ViewOptions {
        ViewOptions::parse(s).unwrap()
    }

    #[test]
    fn a_publish_is_native_unless_something_stands_in_the_way() {
        let ok = || Ok(());
        let host = || Pod::HostUsers;
        let never = || -> Pod { panic!("the pod asked for without need") };
        let g = Some(2_000_000_000);
        assert_eq!(
            decide(g, false, &opts("gid=4242,ro"), ok, host),
            Ok(Mechanism::Native {
                disk_group: 2_000_000_000,
                shown: 4242
            })
        );
        // No fsGroup: the volume's group as itself.
        assert_eq!(
            decide(g, false, &opts(""), ok, host),
            Ok(Mechanism::Native {
                disk_group: 2_000_000_000,
                shown: 2_000_000_000
            })
        );
        // Tuning of a FUSE view means nothing natively.
        assert!(
            decide(
                g,
                false,
                &opts("gid=1,threads=2,attr_timeout=5,noatime"),
                ok,
                host
            )
            .is_ok()
        );
        let cases: Vec<(&str, Result<Mechanism, Fallback>)> = vec![
            ("no group", decide(None, false, &opts("gid=1"), ok, never)),
            ("secrets", decide(g, true, &opts("gid=1"), ok, never)),
            (
                "cifs",
                decide(g, false, &opts("gid=1,file_mode=0644"), ok, never),
            ),
            (
                "ownership",
                decide(g, false, &opts("gid=1,ownership=off"), ok, never),
            ),
            ("sync", decide(g, false, &opts("gid=1,sync"), ok, never)),
            (
                "context",
                decide(
                    g,
                    false,
                    &opts("gid=1,context=\"system_u:object_r:container_file_t:s0\""),
                    ok,
                    never,
                ),
            ),
            (
                "share",
                decide(g, false, &opts("gid=1"), || Err("not nosuid".into()), never),
            ),
            (
                "userns",
                decide(g, false, &opts("gid=1"), ok, || Pod::UserNamespace),
            ),
            (
                "privileged",
                decide(g, false, &opts("gid=1"), ok, || {
                    Pod::Privileged("its container x adds DAC_READ_SEARCH".into())
                }),
            ),
            (
                "unknown",
                decide(g, false, &opts("gid=1"), ok, || Pod::Unknown("RBAC".into())),
            ),
        ];
        let codes: Vec<(&str, &str, bool)> = cases
            .iter()
            .map(|(what, r)| {
                let f = r.as_ref().expect_err(what);
                (*what, f.code(), f.twin())
            })
            .collect();
        assert_eq!(
            codes,
            [
                ("no group", "volume-not-native", false),
                ("secrets", "secret-view", false),
                ("cifs", "cifs-options", false),
                ("ownership", "view-option", false),
                ("sync", "view-option", false),
                ("context", "selinux-context", true),
                ("share", "share", true),
                ("userns", "user-namespace-pod", true),
                ("privileged", "privileged-pod", true),
                ("unknown", "pod-unknown", true),
            ]
        );
    }

    #[test]
    fn a_view_served_again_is_native_only_while_the_share_qualifies() {
        let native = Mechanism::Native {
            disk_group: 2_000_000_000,
            shown: 4242,
        };
        let twin = Mechanism::Twin {
            disk_group: 2_000_000_000,
        };
        let never = || -> Result<(), String> { panic!("the share asked for without need") };
        assert_eq!(again(native, || Ok(())), (native, None));
        assert_eq!(
            again(native, || Err("a suid mount".into())),
            (twin, Some(Fallback::Share("a suid mount".into())))
        );
        assert_eq!(again(twin, never), (twin, None));
        assert_eq!(again(Mechanism::Fuse, never), (Mechanism::Fuse, None));
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
            assert!(refusal(&opts(bad)).is_some(), "{bad}");
        }
        for good in ["gid=1", "gid=1,ro,noexec,noatime", "", "gid=1,threads=2"] {
            assert_eq!(refusal(&opts(good)), None, "{good}");
        }
    }

    #[test]
    fn the_twin_keeps_the_requests_flags() {
        let t = twin_options(&opts("gid=4242,ro,noexec,attr_timeout=3"), 2_000_000_000);
        assert_eq!(
            t.to_option_string(),
            opts("mode=native,disk_gid=2000000000,gid=4242,ro,noexec,attr_timeout=3")
                .to_option_string()
        );
    }
}
