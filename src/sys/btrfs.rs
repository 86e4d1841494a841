//! Where a btrfs subvolume's quota group lives in sysfs, so a view can report the
//! volume's limit and usage as its `statfs` (btrfs's own statfs ignores qgroups).

use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::PathBuf;

use rustix::fs::{AtFlags, StatxFlags};

use super::{Errno, SysResult};

const BTRFS_SUPER_MAGIC: i64 = 0x9123_683E;
/// `STATX_SUBVOL` (Linux 6.10): the subvolume id in `stx_subvol`.
const STATX_SUBVOL: u32 = 0x8000;
/// `BTRFS_IOC_FS_INFO`: `_IOR(0x94, 31, struct btrfs_ioctl_fs_info_args)`, 1024 bytes.
const BTRFS_IOC_FS_INFO: libc::c_ulong = (2 << 30) | (1024 << 16) | (0x94 << 8) | 31;

/// The sysfs directory of the level-0 quota group of the subvolume that holds the
/// directory `dir` (an `O_PATH` descriptor), or `None` when `dir` is not on btrfs or
/// the kernel cannot tell (before Linux 6.10).
///
/// # Errors
/// The error of reopening the directory or of the ioctl.
pub fn qgroup_dir(dir: BorrowedFd<'_>) -> SysResult<Option<PathBuf>> {
    if rustix::fs::fstatfs(dir)?.f_type != BTRFS_SUPER_MAGIC {
        return Ok(None);
    }
    let sx = rustix::fs::statx(
        dir,
        c"",
        AtFlags::EMPTY_PATH,
        StatxFlags::from_bits_retain(STATX_SUBVOL),
    )?;
    if sx.stx_mask & STATX_SUBVOL == 0 {
        return Ok(None);
    }
    let open = super::file::reopen(
        dir,
        super::file::Kind::Directory,
        super::file::Access::Directory,
    )?;
    let mut args = [0u8; 1024];
    // SAFETY: BTRFS_IOC_FS_INFO writes a `struct btrfs_ioctl_fs_info_args` (1024 bytes)
    // into the buffer it is given; `args` is that size and lives across the call, and
    // `open` is an open descriptor on a btrfs directory.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::ioctl(open.as_raw_fd(), BTRFS_IOC_FS_INFO, args.as_mut_ptr()) };
    if rc < 0 {
        return Err(Errno(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        ));
    }
    // struct btrfs_ioctl_fs_info_args { __u64 max_id; __u64 num_devices; __u8 fsid[16]; ... }
    let fsid = &args[16..32];
    let uuid = format!(
        "{}-{}-{}-{}-{}",
        hex(&fsid[0..4]),
        hex(&fsid[4..6]),
        hex(&fsid[6..8]),
        hex(&fsid[8..10]),
        hex(&fsid[10..16])
    );
    let path = PathBuf::from(format!("/sys/fs/btrfs/{uuid}/qgroups/0_{}", sx.stx_subvol));
    Ok(path.is_dir().then_some(path))
}

/// Whether `path` is on btrfs.
pub fn is_btrfs(path: &std::path::Path) -> bool {
    rustix::fs::statfs(path).is_ok_and(|s| s.f_type == BTRFS_SUPER_MAGIC)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A quota group's limit and usage in bytes; `limit` is `None` when unlimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QgroupUsage {
    pub limit: Option<u64>,
    pub used: u64,
}

/// Reads `max_referenced` and `referenced` of a quota group directory.
///
/// # Errors
/// The error of reading sysfs; `EIO` for content that is not a number.
pub fn qgroup_usage(dir: &std::path::Path) -> SysResult<QgroupUsage> {
    let read = |name: &str| -> SysResult<String> {
        std::fs::read_to_string(dir.join(name))
            .map(|s| s.trim().to_string())
            .map_err(|e| Errno::from_io(&e))
    };
    let used = read("referenced")?.parse::<u64>().map_err(|_| Errno::EIO)?;
    let max = read("max_referenced")?;
    // Unlimited reads as "none" on some kernels and 0 on others.
    let limit = match max.as_str() {
        "none" | "0" => None,
        n => Some(n.parse::<u64>().map_err(|_| Errno::EIO)?),
    };
    Ok(QgroupUsage { limit, used })
}
