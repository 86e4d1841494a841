//! Descriptors passed between processes over a unix socket (`SCM_RIGHTS`), and the
//! credentials of the process at the other end.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, recvmsg, sendmsg, sockopt,
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

/// The user id of the process at the other end of a connected unix socket, as the
/// kernel recorded it when it connected (`SO_PEERCRED`).
///
/// # Errors
/// The error of `getsockopt`.
pub fn peer_uid(sock: BorrowedFd<'_>) -> SysResult<u32> {
    let cred = sockopt::socket_peercred(sock).map_err(failed("getsockopt(SO_PEERCRED)"))?;
    Ok(cred.uid.as_raw())
}
