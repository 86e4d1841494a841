//! Native views: a volume's directory bind-mounted with an idmapping that shows the
//! volume's own group as the pod's fsGroup, served by the kernel alone (no process,
//! native speed); and their FUSE twin's options. Whether a publish is one is
//! `serve::decide`'s (docs/SEMANTICS.md, *Native views*).

use std::path::Path;

use crate::config::{ViewMode, ViewOptions};

use super::VolumeError;
use super::serve::{Asking, Fallback, Pod, Records, native_or_why};

/// Why `options` cannot be a native view's, as `mountgroup mount --native` refuses
/// them: what the driver would serve with a FUSE view instead (FUSE semantics,
/// `context=`), and `disk_gid=`, which is the twin's (a native view takes its group
/// from the source). Tuning of a FUSE view is not a reason: it means nothing natively.
pub fn refusal(options: &ViewOptions) -> Option<String> {
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
    let tree = crate::sys::mount::native_view(source, ns.as_fd(), &options.native_vfs_flags())
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
