//! `transport=ring`: a view served over FUSE over io_uring (`crate::sys::uring`) rather
//! than by reading `/dev/fuse`.
//!
//! Each CPU has a queue on the connection (`fuse_uring_task_to_queue`: a request goes
//! to the queue of the CPU its caller runs on), and each queue gets `per_queue` workers,
//! each with one ring and one entry, kept on that CPU. The session's `/dev/fuse` worker
//! still serves what the kernel never sends over a ring: FORGET and INTERRUPT.
//!
//! The trade, chosen per view: the kernel (6.14 to 6.18 at least) can neither hand a
//! ring to another process nor resend the requests a dead process's entries held
//! (docs/ARCHITECTURE.md, *What FUSE over io_uring would need*). So a ring view keeps no
//! control socket (it is not handed over) and gives the keeper no connection (which
//! would keep the callers of a dead view's held requests waiting for good): if its
//! process dies, its callers get an error (`ENOTCONN`, `ECONNABORTED`, `ECANCELED`),
//! as with a FUSE mount without recovery (`tests/ring.rs`).

use std::io::{self, IoSlice};
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use crate::sys::uring::{self, Fetched, FuseRing};

use super::MountError;
use super::stats::ViewStats;

/// The rings of one view, made before its mount.
pub struct Rings {
    /// Each entry's queue (CPU) and ring.
    rings: Vec<(u16, Arc<FuseRing>)>,
}

impl Rings {
    /// Checks that the kernel offers FUSE over io_uring and spreads `workers` (at least
    /// one) over the connection's queues, one ring each, rounding up per queue, with
    /// payload buffers of `payload` bytes.
    ///
    /// # Errors
    /// [`MountError::Ring`] naming what is missing.
    pub fn prepare(workers: usize, payload: usize) -> Result<Rings, MountError> {
        match uring::fuse_uring() {
            uring::FuseUring::Enabled => {}
            uring::FuseUring::Disabled => {
                return Err(MountError::Ring(
                    "the fuse module does not allow io_uring: set /sys/module/fuse/parameters/enable_uring to Y, or use transport=dev".into(),
                ));
            }
            uring::FuseUring::Absent => {
                return Err(MountError::Ring(format!(
                    "this kernel ({}) has no FUSE over io_uring (Linux 6.14 or later, built with CONFIG_FUSE_IO_URING; its fuse module has no enable_uring parameter): use transport=dev",
                    crate::sys::kernel_release()
                )));
            }
        }
        let queues = uring::possible_cpus().map_err(|e| {
            MountError::Ring(format!("cannot read /sys/devices/system/cpu/possible: {e}"))
        })?;
        let per_queue = workers.div_ceil(queues);
        let mut rings = Vec::with_capacity(queues * per_queue);
        for qid in 0..queues {
            let qid = u16::try_from(qid).map_err(|_| {
                MountError::Ring(format!("{queues} CPUs is more queues than FUSE has"))
            })?;
            for _ in 0..per_queue {
                let ring = FuseRing::new(payload).map_err(|e| {
                    MountError::Ring(format!(
                        "cannot set up an io_uring: {e} (is io_uring disabled by the sysctl kernel.io_uring_disabled?)"
                    ))
                })?;
                rings.push((qid, Arc::new(ring)));
            }
        }
        Ok(Rings { rings })
    }

    /// Registers every entry on the connection `dev`, initialised already. The kernel
    /// holds new requests back until every queue has an entry, then hands them over the
    /// rings.
    ///
    /// # Errors
    /// [`MountError::Ring`] when a registration cannot be submitted.
    pub fn register(&self, dev: BorrowedFd<'_>) -> Result<(), MountError> {
        for (qid, ring) in &self.rings {
            ring.register(dev, *qid).map_err(|e| {
                MountError::Ring(format!("cannot register a ring entry on queue {qid}: {e}"))
            })?;
        }
        Ok(())
    }

    /// The session's request sources, one worker each.
    pub fn sources(
        self,
        stats: &Arc<ViewStats>,
        buffer: usize,
    ) -> Vec<Box<dyn ::fuser::RequestSource>> {
        self.rings
            .into_iter()
            .map(|(qid, ring)| {
                Box::new(Source {
                    target: Arc::new(Reply(ring)),
                    qid,
                    pinned: false,
                    buf: vec![0; buffer],
                    stats: Arc::clone(stats),
                }) as Box<dyn ::fuser::RequestSource>
            })
            .collect()
    }
}

/// One worker's entry: waits for a request, copies it out, hands it to the session.
struct Source {
    /// Where its replies go; holds the entry's ring.
    target: Arc<Reply>,
    qid: u16,
    pinned: bool,
    buf: Vec<u8>,
    stats: Arc<ViewStats>,
}

impl ::fuser::RequestSource for Source {
    fn next(&mut self) -> io::Result<Option<(&[u8], Arc<dyn ::fuser::ReplyTarget>)>> {
        if !self.pinned {
            self.pinned = true;
            if let Err(e) = uring::pin_to_cpu(usize::from(self.qid)) {
                tracing::debug!(qid = self.qid, error = %e, "ring worker not pinned to its CPU");
            }
        }
        match self.target.0.wait(&mut self.buf) {
            Ok(Fetched::Request(n)) => {
                self.stats.count_ring_request();
                let target: Arc<dyn ::fuser::ReplyTarget> = self.target.clone();
                Ok(Some((&self.buf[..n], target)))
            }
            Ok(Fetched::Ended) => Ok(None),
            Err(e) => {
                tracing::warn!(qid = self.qid, error = %e, "the ring entry failed; its worker ends");
                Err(e.into())
            }
        }
    }
}

/// Where a ring request's reply goes: committed to the entry it came in.
struct Reply(Arc<FuseRing>);

impl ::fuser::ReplyTarget for Reply {
    fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        self.0.commit(data).map_err(Into::into)
    }
}
