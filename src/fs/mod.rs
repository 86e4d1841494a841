//! The group view as a filesystem: what a view presents (`view.rs`, `record.rs`), its
//! operations (`ops/`), its tables of what the kernel holds (`inode.rs`, the handles in
//! `ops/handles.rs`), and those tables as plain data (`snapshot.rs`) and as a journal
//! (`journal.rs`) for a successor or a recovery; how listings decide on attributes
//! (`listing.rs`), what a walk lists next is warmed (`ahead.rs`), and which names a
//! directory on an SMB share holds (`names.rs`). Free of FUSE types:
//! `crate::transport` runs a connection and calls these operations.

pub mod ahead;
pub mod datafile;
pub mod error;
pub mod inode;
pub mod journal;
pub mod listing;
pub mod names;
pub mod ops;
pub mod record;
pub mod snapshot;
pub mod view;

/// A mutex's guard, also when a thread panicked while it held it: every table a view
/// keeps under a lock is whole after each statement, so a panic leaves nothing half
/// done that the next request could trip on.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
