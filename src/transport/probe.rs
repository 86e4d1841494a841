//! What this kernel's FUSE offers views, asked once when the node plugin starts: a
//! throwaway mount whose INIT request is read and never answered.

use std::path::Path;
use std::time::Duration;

use crate::sys::fuse::InitOffer;
use crate::sys::mount::FuseMount;

/// What the kernel offers a FUSE server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelFuse {
    /// The FUSE protocol's minor version (7.41 is Linux 6.12).
    pub minor: u32,
    /// Whether a view can be idmapped (`FUSE_ALLOW_IDMAP`, Linux 6.12+): what a
    /// container runtime needs for a pod in a user namespace (`hostUsers: false`).
    pub idmap: bool,
    /// Whether reads and writes can go through kernel passthrough
    /// (`FUSE_PASSTHROUGH`, Linux 6.9+).
    pub passthrough: bool,
    /// Whether the kernel offers FUSE over io_uring (`FUSE_OVER_IO_URING`, Linux
    /// 6.14+ with the fuse module's `enable_uring=Y`).
    pub ring: bool,
}

/// Mounts a FUSE file system on a directory made for it under `dir`, reads the INIT
/// request the kernel sends, and unmounts it: the connection ends unanswered (its
/// descriptor is closed, which aborts it) and the directory is removed.
///
/// # Errors
/// What failed, named (no `/dev/fuse`, not root, a mount refused).
pub fn probe(dir: &Path) -> Result<KernelFuse, String> {
    let place = dir.join(format!(
        "fuse-probe.{:016x}",
        crate::sys::process::random_u128() as u64
    ));
    std::fs::create_dir_all(&place).map_err(|e| format!("{}: {e}", place.display()))?;
    let how = FuseMount {
        default_permissions: true,
        allow_other: false,
        selinux_context: None,
        flags: vec!["ro", "noexec"],
    };
    let result = crate::sys::mount::mount_fuse("mountgroup-probe", &place, "mountgroup", how)
        .map_err(|e| format!("mount of a FUSE file system on {}: {e}", place.display()))
        .and_then(|dev| {
            let offer =
                crate::sys::fuse::read_init(std::os::fd::AsFd::as_fd(&dev), Duration::from_secs(5))
                    .map_err(|e| format!("INIT from the kernel: {e}"));
            drop(dev);
            let _ = crate::sys::mount::unmount_lazy(&place);
            offer
        });
    let _ = std::fs::remove_dir(&place);
    let offer = result?;
    Ok(KernelFuse {
        minor: offer.minor,
        idmap: offer.flags & InitOffer::ALLOW_IDMAP != 0,
        passthrough: offer.flags & InitOffer::PASSTHROUGH != 0,
        ring: offer.flags & InitOffer::OVER_IO_URING != 0,
    })
}
