//! The group view as a filesystem: what a view presents (`view.rs`, `record.rs`), its
//! operations (`ops/`), its tables of what the kernel holds (`inode.rs`, the handles in
//! `ops/handles.rs`), and those tables as plain data (`snapshot.rs`) and as a journal
//! (`journal.rs`) for a successor or a recovery; how listings decide on attributes
//! (`listing.rs`), what a walk lists next is warmed (`ahead.rs`), and which names a
//! directory on an SMB share holds (`names.rs`). Free of FUSE types:
//! `crate::transport` runs a connection and calls these operations.

pub mod ahead;
pub mod error;
pub mod inode;
pub mod journal;
pub mod listing;
pub mod names;
pub mod ops;
pub mod record;
pub mod snapshot;
pub mod view;
