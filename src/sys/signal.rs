//! Termination signals turned into an ordinary blocking wait.
//!
//! SIGINT and SIGTERM are blocked in every thread (the mask is inherited by threads
//! spawned afterwards) and collected by one thread with `sigwait(3)`, which can then
//! unmount cleanly instead of the process dying mid-request.

use super::{Errno, SysResult};

/// SIGINT and SIGTERM, blocked in the calling thread and every thread it spawns later.
pub struct TerminationSignals {
    set: libc::sigset_t,
}

impl TerminationSignals {
    /// Blocks SIGINT and SIGTERM in the calling thread. Call it before spawning threads.
    ///
    /// # Errors
    /// The error of `pthread_sigmask(3)`.
    pub fn block() -> SysResult<TerminationSignals> {
        let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigemptyset initialises the set it is given; sigaddset takes an
        // initialised set and valid signal numbers; pthread_sigmask reads the set and
        // accepts a null old-set pointer.
        #[allow(unsafe_code)]
        let rc = unsafe {
            libc::sigemptyset(set.as_mut_ptr());
            libc::sigaddset(set.as_mut_ptr(), libc::SIGINT);
            libc::sigaddset(set.as_mut_ptr(), libc::SIGTERM);
            libc::pthread_sigmask(libc::SIG_BLOCK, set.as_ptr(), std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(Errno(rc));
        }
        // SAFETY: initialised by sigemptyset above.
        #[allow(unsafe_code)]
        let set = unsafe { set.assume_init() };
        Ok(TerminationSignals { set })
    }

    /// Waits until SIGINT or SIGTERM arrives and returns its number.
    ///
    /// # Errors
    /// The error of `sigwait(3)`.
    pub fn wait(&self) -> SysResult<i32> {
        let mut sig: libc::c_int = 0;
        // SAFETY: `self.set` is an initialised signal set and `sig` a valid out pointer.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::sigwait(&self.set, &mut sig) };
        if rc != 0 {
            return Err(Errno(rc));
        }
        Ok(sig)
    }
}

/// The name of a termination signal, for log lines.
pub fn name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        _ => "signal",
    }
}
