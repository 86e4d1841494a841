//! Capacity enforced by btrfs: each volume is a subvolume whose level-0 quota group
//! is limited to the volume's capacity. Management goes through btrfs-progs (the
//! standard tool); usage is read from sysfs. The kernel enforces the limit on every
//! write, including kernel passthrough writes the daemon never sees, for root too.

use std::path::Path;
use std::process::Command;

use super::ShareError;

pub use crate::sys::btrfs::is_btrfs;

/// Whether `path` is the root directory of a btrfs subvolume.
pub fn is_subvolume(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    // The root directory of every subvolume is inode 256 (BTRFS_FIRST_FREE_OBJECTID).
    is_btrfs(path) && std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir() && m.ino() == 256)
}

fn run(args: &[&str], path: &Path) -> Result<(), ShareError> {
    let out = Command::new("btrfs")
        .args(args)
        .arg(path)
        .output()
        .map_err(|e| ShareError::Io {
            what: format!(
                "running btrfs {} (is btrfs-progs installed?)",
                args.join(" ")
            ),
            errno: crate::sys::Errno::from_io(&e),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(ShareError::Backend(format!(
            "btrfs {} {}: {}",
            args.join(" "),
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Turns quotas on for the file system of `root` (a no-op when they are on).
///
/// # Errors
/// The tool's message when quotas cannot be enabled.
pub fn enable_quota(root: &Path) -> Result<(), ShareError> {
    run(&["quota", "enable"], root)
}

/// Makes a subvolume at `path`.
///
/// # Errors
/// The tool's message.
pub fn create_subvolume(path: &Path) -> Result<(), ShareError> {
    run(&["subvolume", "create"], path)
}

/// Deletes the subvolume at `path` with everything in it.
///
/// # Errors
/// The tool's message.
pub fn delete_subvolume(path: &Path) -> Result<(), ShareError> {
    run(&["subvolume", "delete"], path)
}

/// Limits the subvolume at `path` to `bytes` (referenced bytes).
///
/// # Errors
/// The tool's message.
pub fn limit(path: &Path, bytes: u64) -> Result<(), ShareError> {
    run(&["qgroup", "limit", &bytes.to_string()], path)
}

/// The quota group numbers of the subvolume at `path` (`None` when unreadable).
fn usage(path: &Path) -> Option<crate::sys::btrfs::QgroupUsage> {
    let fd = crate::sys::file::open_root(path).ok()?;
    let dir = crate::sys::btrfs::qgroup_dir(std::os::fd::AsFd::as_fd(&fd)).ok()??;
    crate::sys::btrfs::qgroup_usage(&dir).ok()
}

/// The limit of the subvolume at `path` in bytes (`None` when unlimited or unreadable).
pub fn limit_bytes(path: &Path) -> Option<u64> {
    usage(path)?.limit
}

/// Bytes used by the subvolume at `path`, from its quota group.
pub fn used_bytes(path: &Path) -> Option<u64> {
    usage(path).map(|u| u.used)
}
