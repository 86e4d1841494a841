//! FUSE over io_uring (Linux 6.14+, `Documentation/filesystems/fuse-io-uring.rst`): one
//! ring entry, registered on one of the connection's per-CPU queues, through which the
//! kernel hands requests and takes their replies.
//!
//! The protocol, as `fs/fuse/dev_uring.c` (6.18) implements it:
//! - An entry is two buffers, named by an `iovec[2]` in an `IORING_OP_URING_CMD`
//!   submission (which needs `IORING_SETUP_SQE128`: `struct fuse_uring_cmd_req` sits in
//!   the command area): a 288-byte `struct fuse_uring_req_header` and a payload buffer of
//!   at least the connection's `max_payload_sz` (`max(8 KiB, max_write, max_pages *
//!   PAGE_SIZE)`; `fuse_uring_create_ring_ent` refuses a smaller one).
//! - `FUSE_IO_URING_CMD_REGISTER` puts the entry on its queue; its completion comes when
//!   the kernel has copied a request into the buffers: `fuse_in_header` into `in_out`,
//!   the operation's first argument (`fuse_read_in`, ...) into `op_in`, every other
//!   argument into the payload, and `payload_sz` and the `commit_id` (the request's
//!   `unique`) into `ring_ent_in_out` (`fuse_uring_args_to_ring`).
//! - The reply goes the same way back: `fuse_out_header` into `in_out`, the rest into the
//!   payload, its size into `ring_ent_in_out.payload_sz`, and
//!   `FUSE_IO_URING_CMD_COMMIT_AND_FETCH` with the commit id ends the request and puts the
//!   entry back on its queue, to complete again with the next request.
//! - At the connection's end the kernel completes the entry with `-ENOTCONN`
//!   (`fuse_uring_entry_teardown`).
//!
//! A request is copied out of the buffers whole, as `/dev/fuse` would give it, before
//! it is served, because the reply is committed as soon as it is made and the commit
//! lets the kernel write the next request into the same buffers.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Mutex;

use io_uring::{IoUring, cqueue, opcode, squeue, types};

use super::direct::Aligned;
use super::{Errno, SysResult, failed};

/// `FUSE_IO_URING_CMD_REGISTER` and `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`
/// (`enum fuse_uring_cmd`, include/uapi/linux/fuse.h).
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `struct fuse_uring_req_header`: `in_out[128]`, `op_in[128]`, then
/// `struct fuse_uring_ent_in_out` { flags: u64, commit_id: u64, payload_sz: u32, .. }.
const IN_OUT: usize = 0;
const OP_IN: usize = 128;
const OP_IN_MAX: usize = 128;
const ENT_IN_OUT: usize = 256;
const HEADER_LEN: usize = 288;
/// `sizeof(struct fuse_in_header)` and `sizeof(struct fuse_out_header)`.
const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;

/// The user data of this entry's submissions (one entry per ring).
const ENTRY: u64 = 1;

/// What a wait on the entry gave.
pub enum Fetched {
    /// A request, copied whole into the caller's buffer: this many bytes.
    Request(usize),
    /// The connection has ended (the kernel tore the entry down).
    Ended,
}

/// One io_uring with one FUSE ring entry. Made before the connection exists (a failure
/// to make a ring is then a clear mount error, not a connection whose requests wait for
/// a ring that never comes), registered once the connection is initialised.
pub struct FuseRing {
    state: Mutex<State>,
}

struct State {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    /// The kernel writes into these whenever the entry is on its queue, so they are
    /// only read between a completion and the next commit, and never freed while the
    /// entry may still be written (see `Drop`).
    header: Aligned,
    payload: Aligned,
    payload_len: usize,
    /// The `iovec[2]` a registration names; the kernel reads it when the submission is
    /// issued, which may be after `submit` returns (a punted submission).
    iov: Box<[libc::iovec; 2]>,
    dev: Option<OwnedFd>,
    qid: u16,
    /// The commit id of the request the entry holds, between its completion and its reply.
    holding: Option<u64>,
    /// Whether the held request is a listing, whose reply is submitted at once (see
    /// [`FuseRing::commit`]).
    listing: bool,
    /// Whether the kernel can still write into the buffers.
    registered: bool,
}

// SAFETY: `Aligned` owns its allocation outright; the raw pointers in `iov` point into
// the buffers of this same value. Every access goes through the mutex.
#[allow(unsafe_code)]
unsafe impl Send for State {}

impl FuseRing {
    /// An io_uring with 128-byte submissions, and the entry's buffers: the payload
    /// `payload_len` bytes (the connection's `max_payload_sz` or more).
    ///
    /// # Errors
    /// The error of `io_uring_setup` (`EPERM` where `kernel.io_uring_disabled` forbids
    /// it, `ENOSYS` without io_uring).
    pub fn new(payload_len: usize) -> SysResult<FuseRing> {
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_coop_taskrun()
            .build(4)
            .or_else(|_| IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(4))
            .map_err(failed("io_uring_setup"))?;
        let header = Aligned::new(HEADER_LEN);
        let payload = Aligned::new(payload_len);
        let iov = Box::new([
            libc::iovec {
                iov_base: header.as_ptr().cast(),
                iov_len: HEADER_LEN,
            },
            libc::iovec {
                iov_base: payload.as_ptr().cast(),
                iov_len: payload_len,
            },
        ]);
        Ok(FuseRing {
            state: Mutex::new(State {
                ring,
                header,
                payload,
                payload_len,
                iov,
                dev: None,
                qid: 0,
                holding: None,
                listing: false,
                registered: false,
            }),
        })
    }

    /// Registers the entry on queue `qid` (a CPU number) of the connection `dev`.
    ///
    /// # Errors
    /// The error of the submission; the registration's own result comes with its
    /// completion, in [`FuseRing::wait`].
    pub fn register(&self, dev: BorrowedFd<'_>, qid: u16) -> SysResult<()> {
        let mut s = lock(&self.state);
        let dev = super::fuse::dup(dev)?;
        let iov = s.iov.as_ptr() as u64;
        let entry = command(dev.as_raw_fd(), CMD_REGISTER, 0, qid, Some(iov));
        s.dev = Some(dev);
        s.qid = qid;
        s.registered = true;
        s.submit(&entry)
    }

    /// Waits for the entry's next request and copies it into `into` as `/dev/fuse`
    /// gives it: `fuse_in_header`, the operation's argument, the payload.
    ///
    /// # Errors
    /// A completion with an error other than the connection's end (`EINVAL`: a buffer
    /// too small; `EOPNOTSUPP`: the connection has no ring), or a request that does not
    /// fit what the kernel says of it (`EPROTO`).
    pub fn wait(&self, into: &mut [u8]) -> SysResult<Fetched> {
        let mut s = lock(&self.state);
        // Every submission is the entry's (`ENTRY`), so any completion is its.
        let res = loop {
            if let Some(cqe) = s.ring.completion().next() {
                break cqe.result();
            }
            match s.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(failed("io_uring_enter")(e)),
            }
        };
        if res == -libc::ENOTCONN || res == -libc::ECANCELED {
            // The kernel no longer holds the entry: the buffers are ours again.
            s.registered = false;
            return Ok(Fetched::Ended);
        }
        if res < 0 {
            s.registered = false;
            return Err(failed("FUSE_IO_URING_CMD")(Errno(-res)));
        }
        s.fetch(into).map(Fetched::Request)
    }

    /// Commits the reply to the request the entry holds (`fuse_out_header` first, as
    /// written to `/dev/fuse`) and puts the entry back on its queue.
    ///
    /// # Errors
    /// `EPROTO` when no request is held or the reply is larger than the payload buffer;
    /// the error of the submission.
    pub fn commit(&self, reply: &[IoSlice<'_>]) -> SysResult<()> {
        let mut s = lock(&self.state);
        let Some(commit_id) = s.holding.take() else {
            return Err(Errno(libc::EPROTO));
        };
        let total: usize = reply.iter().map(|b| b.len()).sum();
        if total < OUT_HEADER || total - OUT_HEADER > s.payload_len {
            return Err(Errno(libc::EPROTO));
        }
        let (header, payload) = (s.header.as_ptr(), s.payload.as_ptr());
        // The reply's bytes in order: the first `OUT_HEADER` into `in_out`, the rest
        // into the payload, a run of bytes at a time (a READ reply is up to 1 MiB).
        let mut at = 0usize;
        for part in reply {
            let mut bytes: &[u8] = part;
            if at < OUT_HEADER {
                let n = bytes.len().min(OUT_HEADER - at);
                // SAFETY: the entry holds a request, so the kernel does not touch the
                // buffers until the commit below; `at + n <= OUT_HEADER` is in `in_out`.
                #[allow(unsafe_code)]
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), header.add(IN_OUT + at), n);
                }
                (at, bytes) = (at + n, &bytes[n..]);
            }
            // SAFETY: as above; `at - OUT_HEADER + len <= total - OUT_HEADER`, which is
            // at most `payload_len` (checked above).
            #[allow(unsafe_code)]
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr(),
                    payload.add(at - OUT_HEADER),
                    bytes.len(),
                );
            }
            at += bytes.len();
        }
        let payload_sz = u32::try_from(total - OUT_HEADER).map_err(|_| Errno(libc::EPROTO))?;
        // SAFETY: as above; `payload_sz` is at offset 16 of `ring_ent_in_out`.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::copy_nonoverlapping(
                payload_sz.to_ne_bytes().as_ptr(),
                header.add(ENT_IN_OUT + 16),
                4,
            );
        }
        let dev = s.dev.as_ref().map(|d| d.as_raw_fd()).ok_or(Errno::EBADF)?;
        let entry = command(dev, CMD_COMMIT_AND_FETCH, commit_id, s.qid, None);
        if s.listing {
            // A listing reads ahead after it answers: its caller gets the reply now.
            s.submit(&entry)
        } else {
            // Submitted by the worker's next wait, in the same system call.
            s.push(&entry)
        }
    }
}

impl State {
    fn push(&mut self, entry: &squeue::Entry128) -> SysResult<()> {
        // SAFETY: what the entry points to (`iov` and the buffers it names) lives as
        // long as this value, and longer while the kernel may use it (see `Drop`).
        #[allow(unsafe_code)]
        let pushed = unsafe { self.ring.submission().push(entry) };
        pushed.map_err(|_| Errno(libc::EBUSY))
    }

    fn submit(&mut self, entry: &squeue::Entry128) -> SysResult<()> {
        self.push(entry)?;
        loop {
            match self.ring.submit() {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(failed("io_uring_enter")(e)),
            }
        }
    }

    /// Copies the request the kernel put in the buffers into `into`, contiguous.
    fn fetch(&mut self, into: &mut [u8]) -> SysResult<usize> {
        let (header, payload) = (self.header.as_ptr(), self.payload.as_ptr());
        let mut h = [0u8; HEADER_LEN];
        // SAFETY: the entry holds a request: the kernel wrote the buffers before the
        // completion and writes them again only after our commit.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::copy_nonoverlapping(header, h.as_mut_ptr(), HEADER_LEN);
        }
        let u32_at = |at: usize| u32::from_ne_bytes(h[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_ne_bytes(h[at..at + 8].try_into().expect("8 bytes"));
        let len = u32_at(IN_OUT) as usize;
        let commit_id = u64_at(ENT_IN_OUT + 8);
        let payload_sz = u32_at(ENT_IN_OUT + 16) as usize;
        // The first argument's size is what the header's total leaves (`fuse_send_one`
        // sums every argument into `len`).
        let op_in = len
            .checked_sub(IN_HEADER + payload_sz)
            .filter(|n| *n <= OP_IN_MAX)
            .ok_or(Errno(libc::EPROTO))?;
        if payload_sz > self.payload_len || len > into.len() {
            return Err(Errno(libc::EPROTO));
        }
        into[..IN_HEADER].copy_from_slice(&h[IN_OUT..IN_OUT + IN_HEADER]);
        into[IN_HEADER..IN_HEADER + op_in].copy_from_slice(&h[OP_IN..OP_IN + op_in]);
        // SAFETY: as above; `payload_sz` is within the payload buffer (checked).
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::copy_nonoverlapping(
                payload,
                into[IN_HEADER + op_in..].as_mut_ptr(),
                payload_sz,
            );
        }
        // `fuse_in_header.opcode`: FUSE_READDIR (28), FUSE_READDIRPLUS (44).
        self.listing = matches!(u32_at(IN_OUT + 4), 28 | 44);
        self.holding = Some(commit_id);
        Ok(len)
    }
}

impl Drop for FuseRing {
    fn drop(&mut self) {
        let s = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if s.registered {
            // The kernel may still copy a request into the buffers: closing the ring
            // cancels the entry only asynchronously. Leave them to the process's end.
            let header = std::mem::replace(&mut s.header, Aligned::new(1));
            let payload = std::mem::replace(&mut s.payload, Aligned::new(1));
            std::mem::forget(header);
            std::mem::forget(payload);
        }
    }
}

/// An `IORING_OP_URING_CMD` submission with `struct fuse_uring_cmd_req` { flags: u64,
/// commit_id: u64, qid: u16 } in its command area, and `len = 2` for the `iovec[2]`
/// (`fuse_uring_get_iovec_from_sqe` checks it on registration).
fn command(dev: i32, cmd_op: u32, commit_id: u64, qid: u16, iov: Option<u64>) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let entry = opcode::UringCmd80::new(types::Fd(dev), cmd_op)
        .cmd(cmd)
        .addr(iov)
        .build()
        .user_data(ENTRY);
    // io-uring 0.7's `UringCmd80` has no `len`; `struct io_uring_sqe` keeps it at byte
    // 24, and `Entry128` is `repr(C)`: the 64-byte SQE, then the extra 64 bytes.
    // SAFETY: `Entry128` is 128 bytes of plain integers (`repr(C)`), so any bytes are a
    // valid value, and the round trip changes only the `len` field.
    #[allow(unsafe_code)]
    unsafe {
        let mut bytes: [u8; 128] = std::mem::transmute(entry);
        bytes[24..28].copy_from_slice(&2u32.to_ne_bytes());
        std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether the kernel lets FUSE connections use io_uring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FuseUring {
    /// The `fuse` module has no `enable_uring` parameter: the kernel predates FUSE over
    /// io_uring (Linux 6.14) or was built without `CONFIG_FUSE_IO_URING`.
    Absent,
    /// `enable_uring=N` (the default).
    Disabled,
    /// `enable_uring=Y`.
    Enabled,
}

/// The `fuse` module's `enable_uring` parameter (read by the kernel when a connection
/// is initialised).
pub fn fuse_uring() -> FuseUring {
    match std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring") {
        Ok(v) if v.trim() == "Y" => FuseUring::Enabled,
        Ok(_) => FuseUring::Disabled,
        Err(_) => FuseUring::Absent,
    }
}

/// The queues a FUSE ring has: one per possible CPU (`num_possible_cpus()` in
/// `fuse_uring_create`), read from `/sys/devices/system/cpu/possible` ("0-1", "0,2-5").
///
/// # Errors
/// `EINVAL` when the file cannot be read or parsed.
pub fn possible_cpus() -> SysResult<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .map_err(|e| Errno::from_io(&e))?;
    parse_cpu_list(text.trim()).ok_or(Errno::EINVAL)
}

/// Keeps the calling thread on `cpu`: a queue's worker runs where the callers whose
/// requests the queue takes run (`fuse_uring_task_to_queue` picks the caller's CPU).
///
/// # Errors
/// The error of `sched_setaffinity` (`EINVAL` for a CPU the process may not use).
pub fn pin_to_cpu(cpu: usize) -> SysResult<()> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set).map_err(failed("sched_setaffinity"))
}

fn parse_cpu_list(list: &str) -> Option<usize> {
    let mut count = 0;
    for part in list.split(',') {
        count += match part.split_once('-') {
            Some((a, b)) => {
                b.parse::<usize>()
                    .ok()?
                    .checked_sub(a.parse::<usize>().ok()?)?
                    + 1
            }
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
    }
    Some(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_count_every_cpu() {
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-1"), Some(2));
        assert_eq!(parse_cpu_list("0,2-5"), Some(5));
        assert_eq!(parse_cpu_list("0-"), None);
        assert_eq!(parse_cpu_list("5-2"), None);
    }

    #[test]
    fn a_command_carries_its_op_commit_id_queue_and_iovec_count() {
        let e = command(7, CMD_COMMIT_AND_FETCH, 0x1122, 3, Some(0xdead_beef));
        // SAFETY: as in `command`.
        #[allow(unsafe_code)]
        let b: [u8; 128] = unsafe { std::mem::transmute(e) };
        assert_eq!(b[0], 46, "IORING_OP_URING_CMD");
        assert_eq!(i32::from_ne_bytes(b[4..8].try_into().unwrap()), 7);
        assert_eq!(
            u64::from_ne_bytes(b[16..24].try_into().unwrap()),
            0xdead_beef
        );
        assert_eq!(u32::from_ne_bytes(b[24..28].try_into().unwrap()), 2);
        assert_eq!(u64::from_ne_bytes(b[32..40].try_into().unwrap()), ENTRY);
        // cmd_op is the first 4 bytes of the union at 8 (`off`/`cmd_op`).
        assert_eq!(
            u32::from_ne_bytes(b[8..12].try_into().unwrap()),
            CMD_COMMIT_AND_FETCH
        );
        assert_eq!(u64::from_ne_bytes(b[56..64].try_into().unwrap()), 0x1122);
        assert_eq!(u16::from_ne_bytes(b[64..66].try_into().unwrap()), 3);
    }
}
