//! The FUSE device beyond what fuser does: passthrough registrations whose ids outlive
//! the process that made them, so that a view handed to a new process keeps them.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use super::{SysResult, failed};

/// Whether the FUSE connection of `dev` is still connected. Once its superblock is
/// destroyed (the mount unmounted and released) or it is aborted, the device polls as
/// an error (`fuse_dev_poll`: `EPOLLERR` when not connected); polling takes nothing.
pub fn connected(dev: BorrowedFd<'_>) -> bool {
    use rustix::event::{PollFd, PollFlags, poll};
    let mut fds = [PollFd::new(&dev, PollFlags::IN)];
    match poll(
        &mut fds,
        Some(&rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        }),
    ) {
        Ok(_) => !fds[0].revents().intersects(PollFlags::ERR | PollFlags::HUP),
        Err(_) => true,
    }
}

/// `struct fuse_backing_map` of `<linux/fuse.h>`.
#[repr(C)]
struct BackingMap {
    fd: i32,
    flags: u32,
    padding: u64,
}

/// `_IOW(229, 1, struct fuse_backing_map)`: FUSE_DEV_IOC_BACKING_OPEN.
const BACKING_OPEN: libc::c_ulong = 0x4000_0000 | (16 << 16) | (229 << 8) | 1;
/// `_IOW(229, 2, uint32_t)`: FUSE_DEV_IOC_BACKING_CLOSE.
const BACKING_CLOSE: libc::c_ulong = 0x4000_0000 | (4 << 16) | (229 << 8) | 2;

/// A kernel passthrough registration (a backing id) of an open file on one FUSE
/// connection. The id belongs to the connection, not to the process: a process that
/// takes the connection over adopts the ids its predecessor registered
/// ([`Backing::adopt`]). Closed when dropped; a process that hands its connection over
/// exits without dropping, so that the ids stay open for its successor.
pub struct Backing {
    dev: Arc<OwnedFd>,
    id: u32,
}

impl Backing {
    /// Registers `file` for passthrough on the connection of `dev` (Linux 6.9+, root).
    ///
    /// # Errors
    /// The error of `ioctl(FUSE_DEV_IOC_BACKING_OPEN)`, e.g. `EPERM` without
    /// `CAP_SYS_ADMIN`, `EOPNOTSUPP` where passthrough was not negotiated or the file's
    /// file system is stacked too deep.
    pub fn open(dev: &Arc<OwnedFd>, file: BorrowedFd<'_>) -> SysResult<Backing> {
        let map = BackingMap {
            fd: file.as_raw_fd(),
            flags: 0,
            padding: 0,
        };
        // SAFETY: `map` is a valid `struct fuse_backing_map` that lives across the
        // call; the kernel only reads it and returns the new id or -1.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::ioctl(dev.as_raw_fd(), BACKING_OPEN, &map) };
        if rc < 0 {
            return Err(failed("ioctl(FUSE_DEV_IOC_BACKING_OPEN)")(
                std::io::Error::last_os_error(),
            ));
        }
        Ok(Backing {
            dev: Arc::clone(dev),
            id: rc as u32,
        })
    }

    /// Takes over `id`, registered on this connection by the process that served it
    /// before and handed it over open.
    pub fn adopt(dev: &Arc<OwnedFd>, id: u32) -> Backing {
        Backing {
            dev: Arc::clone(dev),
            id,
        }
    }

    /// The id a FUSE open reply names.
    pub fn id(&self) -> u32 {
        self.id
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        // SAFETY: the argument points at a u32 that lives across the call; the kernel
        // only reads it. A failure (the connection is gone) leaves nothing to release.
        #[allow(unsafe_code)]
        unsafe {
            libc::ioctl(self.dev.as_raw_fd(), BACKING_CLOSE, &self.id);
        }
    }
}

/// `FUSE_NOTIFY_RESEND` (Linux 6.9+): the kernel puts every request that a server
/// read and did not answer back in the queue, to be read again (its `unique` gets bit
/// 63). For a process that took over the connection of one that died.
///
/// # Errors
/// The error of writing the notification (`ENOSYS`-like errors on older kernels).
pub fn notify_resend(dev: BorrowedFd<'_>) -> SysResult<()> {
    // `struct fuse_out_header` { len, error = FUSE_NOTIFY_RESEND (7), unique = 0 }.
    let mut header = [0u8; 16];
    header[0..4].copy_from_slice(&16u32.to_ne_bytes());
    header[4..8].copy_from_slice(&7i32.to_ne_bytes());
    rustix::io::write(dev, &header).map_err(failed("write(FUSE_NOTIFY_RESEND)"))?;
    Ok(())
}

/// `_IOR(229, 0, uint32_t)`: FUSE_DEV_IOC_CLONE.
const DEV_CLONE: libc::c_ulong = 0x8000_0000 | (4 << 16) | (229 << 8);

/// A new descriptor on the FUSE connection of `dev` with a processing queue of its own
/// (`FUSE_DEV_IOC_CLONE`): requests read through it wait for their answers on it, and
/// when its last holder closes it the kernel fails those (`ECONNABORTED`) while the
/// connection lives on through `dev`.
///
/// # Errors
/// The error of opening `/dev/fuse` or of the ioctl.
pub fn clone_dev(dev: BorrowedFd<'_>) -> SysResult<OwnedFd> {
    let new = rustix::fs::open(
        "/dev/fuse",
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(failed("open(/dev/fuse)"))?;
    let source = dev.as_raw_fd() as u32;
    // SAFETY: the argument points at a u32 (the source descriptor) that lives across
    // the call; the kernel only reads it, and binds `new` to the source's connection.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::ioctl(new.as_raw_fd(), DEV_CLONE, &source) };
    if rc < 0 {
        return Err(failed("ioctl(FUSE_DEV_IOC_CLONE)")(
            std::io::Error::last_os_error(),
        ));
    }
    Ok(new)
}

/// Whether a kernel that speaks FUSE protocol 7.`minor` (its INIT says) can be told to
/// resend the requests a dead server read and did not answer (`FUSE_NOTIFY_RESEND`,
/// protocol 7.40, Linux 6.9). Before it, those requests wait on the descriptor they
/// were read from until it is closed.
pub fn resends(minor: u32) -> bool {
    minor >= 40
}

/// Duplicates a descriptor (`fcntl(F_DUPFD_CLOEXEC)`).
///
/// # Errors
/// The error of the call (`EMFILE`).
pub fn dup(fd: BorrowedFd<'_>) -> SysResult<OwnedFd> {
    fd.try_clone_to_owned()
        .map_err(failed("fcntl(F_DUPFD_CLOEXEC)"))
}

/// What the kernel offers a FUSE server in the INIT request it queues when the file
/// system is mounted: its protocol version and its flags (`flags`, and `flags2` as
/// the high 32 bits when `FUSE_INIT_EXT` is set), before any server answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitOffer {
    pub major: u32,
    pub minor: u32,
    pub flags: u64,
}

/// `FUSE_INIT` (include/uapi/linux/fuse.h).
const FUSE_INIT: u32 = 26;
/// `FUSE_INIT_EXT`: `flags2` is valid.
const FUSE_INIT_EXT: u32 = 1 << 30;

impl InitOffer {
    /// `FUSE_PASSTHROUGH` (Linux 6.9+, protocol 7.40).
    pub const PASSTHROUGH: u64 = 1 << 37;
    /// `FUSE_ALLOW_IDMAP` (Linux 6.12+, protocol 7.41).
    pub const ALLOW_IDMAP: u64 = 1 << 40;
    /// `FUSE_OVER_IO_URING` (Linux 6.14+, protocol 7.42; offered only with the fuse
    /// module's `enable_uring=Y`).
    pub const OVER_IO_URING: u64 = 1 << 41;

    /// Decodes an INIT request as read from `/dev/fuse`: `struct fuse_in_header`
    /// (40 bytes) and `struct fuse_init_in` (major, minor, max_readahead, flags, then
    /// flags2 since protocol 7.36).
    ///
    /// # Errors
    /// `EPROTO` for anything but an INIT request long enough for its fields.
    pub fn decode(request: &[u8]) -> SysResult<InitOffer> {
        let word = |at: usize| -> SysResult<u32> {
            request
                .get(at..at + 4)
                .map(|b| u32::from_ne_bytes(b.try_into().unwrap_or_default()))
                .ok_or(super::Errno(libc::EPROTO))
        };
        if word(4)? != FUSE_INIT {
            return Err(super::Errno(libc::EPROTO));
        }
        let (major, minor, flags) = (word(40)?, word(44)?, word(52)?);
        let high = if flags & FUSE_INIT_EXT != 0 {
            word(56)?
        } else {
            0
        };
        Ok(InitOffer {
            major,
            minor,
            flags: u64::from(flags) | (u64::from(high) << 32),
        })
    }
}

/// Reads the INIT request of a connection that was just mounted (waiting at most
/// `limit` for it), without answering it.
///
/// # Errors
/// `ETIMEDOUT` when none came, the error of reading, or `EPROTO` for another request.
pub fn read_init(dev: BorrowedFd<'_>, limit: std::time::Duration) -> SysResult<InitOffer> {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let mut fds = [PollFd::new(&dev, PollFlags::IN)];
    let timeout = Timespec {
        tv_sec: limit.as_secs() as i64,
        tv_nsec: i64::from(limit.subsec_nanos()),
    };
    if poll(&mut fds, Some(&timeout)).map_err(failed("poll(/dev/fuse)"))? == 0 {
        return Err(super::Errno(libc::ETIMEDOUT));
    }
    // The device refuses a buffer smaller than FUSE_MIN_READ_BUFFER (8 KiB).
    let mut buf = vec![0u8; 8192 + 4096];
    let n = rustix::io::read(dev, &mut buf).map_err(failed("read(/dev/fuse)"))?;
    InitOffer::decode(&buf[..n])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn init(minor: u32, flags: u32, flags2: u32) -> Vec<u8> {
        let mut r = vec![0u8; 104];
        r[0..4].copy_from_slice(&104u32.to_ne_bytes());
        r[4..8].copy_from_slice(&FUSE_INIT.to_ne_bytes());
        r[40..44].copy_from_slice(&7u32.to_ne_bytes());
        r[44..48].copy_from_slice(&minor.to_ne_bytes());
        r[52..56].copy_from_slice(&flags.to_ne_bytes());
        r[56..60].copy_from_slice(&flags2.to_ne_bytes());
        r
    }

    #[test]
    fn init_offers_are_decoded_with_their_second_flag_word() {
        // Linux 6.12+: FUSE_INIT_EXT and ALLOW_IDMAP (bit 8 of flags2).
        let o = InitOffer::decode(&init(41, FUSE_INIT_EXT, 1 << 8)).unwrap();
        assert_eq!((o.major, o.minor), (7, 41));
        assert_ne!(o.flags & InitOffer::ALLOW_IDMAP, 0);
        // Linux 6.1 (7.38): flags2 exists but has no ALLOW_IDMAP bit.
        let o = InitOffer::decode(&init(38, FUSE_INIT_EXT, 1 << 1)).unwrap();
        assert_eq!(o.flags & InitOffer::ALLOW_IDMAP, 0);
        // Without FUSE_INIT_EXT the second word is not the kernel's to read.
        let o = InitOffer::decode(&init(35, 0, 1 << 8)).unwrap();
        assert_eq!(o.flags & InitOffer::ALLOW_IDMAP, 0);
        let mut other = init(41, 0, 0);
        other[4..8].copy_from_slice(&1u32.to_ne_bytes());
        assert!(InitOffer::decode(&other).is_err());
        assert!(InitOffer::decode(&init(41, 0, 0)[..50]).is_err());
    }
}
