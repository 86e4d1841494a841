//! Facts about the running process.

/// Whether the process runs with effective uid 0.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The effective uid and gid of the process.
pub fn effective_ids() -> (u32, u32) {
    (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    )
}
