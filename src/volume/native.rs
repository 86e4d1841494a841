//! Native views: a volume's directory bind-mounted with an idmapping that shows the
//! volume's own group as the pod's fsGroup, served by the kernel alone (no process,
//! native speed); and their FUSE twin's options. This file only mounts: whether a
//! publish is one is `serve::decide`'s, whether a mount by hand may be is
//! `serve::native_refusal`'s (docs/SEMANTICS.md, *Native views*).

use std::path::Path;

use crate::config::{ViewMode, ViewOptions};

use super::VolumeError;

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
    fn the_twin_keeps_the_requests_flags() {
        let t = twin_options(&opts("gid=4242,ro,noexec,attr_timeout=3"), 2_000_000_000);
        assert_eq!(
            t.to_option_string(),
            opts("mode=native,disk_gid=2000000000,gid=4242,ro,noexec,attr_timeout=3")
                .to_option_string()
        );
    }
}
