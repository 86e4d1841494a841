//! Descriptors passed between processes over a unix socket (`SCM_RIGHTS`), and the
//! credentials of the process at the other end.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use std::os::fd::AsRawFd;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, recvmsg, sendmsg,
};

use super::{Errno, SysResult, failed};

/// At most this many descriptors travel in one message (the kernel's `SCM_MAX_FD` is
/// 253).
pub const FDS_PER_MESSAGE: usize = 200;

/// Sends `byte` with `fds` attached (at most [`FDS_PER_MESSAGE`]).
///
/// # Errors
/// The error of `sendmsg`.
pub fn send_fds(sock: BorrowedFd<'_>, byte: u8, fds: &[BorrowedFd<'_>]) -> SysResult<()> {
    debug_assert!(fds.len() <= FDS_PER_MESSAGE);
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(Errno::EINVAL);
    }
    let payload = [byte];
    let sent = sendmsg(
        sock,
        &[IoSlice::new(&payload)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .map_err(failed("sendmsg"))?;
    if sent != 1 {
        return Err(Errno(libc::EPIPE));
    }
    Ok(())
}

/// Receives one byte and the descriptors attached to it (at most
/// [`FDS_PER_MESSAGE`]); the descriptors are close-on-exec.
///
/// # Errors
/// The error of `recvmsg`; `EPIPE` when the peer closed the socket; `EMSGSIZE` when
/// descriptors were dropped for lack of room (the receiver's open-file limit).
pub fn recv_fds(sock: BorrowedFd<'_>) -> SysResult<(u8, Vec<OwnedFd>)> {
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_MESSAGE))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8];
    let got = recvmsg(
        sock,
        &mut [IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(failed("recvmsg"))?;
    if got.bytes == 0 {
        return Err(Errno(libc::EPIPE));
    }
    if got.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
        return Err(Errno(libc::EMSGSIZE));
    }
    let mut fds = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = msg {
            fds.extend(rights);
        }
    }
    Ok((byte[0], fds))
}

/// The process at the other end of a connected unix socket, as the kernel recorded it
/// when it connected (`SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its pid as this process's PID namespace numbers it: 0 when it lives in a
    /// namespace this one cannot see (another container's).
    pub pid: i32,
    pub uid: u32,
}

/// The peer of a connected unix socket (`SO_PEERCRED`). Not rustix's
/// `socket_peercred`: its pid type cannot be 0, which is what the kernel says for a
/// peer in another PID namespace, exactly the case the keeper must tell apart.
///
/// # Errors
/// The error of `getsockopt`.
pub fn peer(sock: BorrowedFd<'_>) -> SysResult<Peer> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a `struct ucred` and `len` its size; the kernel writes at most
    // `len` bytes into it and the new length into `len`.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(failed("getsockopt(SO_PEERCRED)")(
            std::io::Error::last_os_error(),
        ));
    }
    Ok(Peer {
        pid: cred.pid,
        uid: cred.uid,
    })
}
