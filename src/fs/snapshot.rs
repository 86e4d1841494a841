//! A view's tables as plain data: what a process needs to serve a FUSE connection that
//! another process initialized and served until now (node ids the kernel holds, open
//! files, directory streams). Descriptors travel beside it (`SCM_RIGHTS`) and are named
//! here by their index in that list.

//!
//! Plain data only, depending on nothing else of the filesystem: the inode table
//! (`inode.rs`) makes and reads it, the journal (`journal.rs`) stores it.

use serde::{Deserialize, Serialize};

/// An inode's identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeySnapshot {
    Handle {
        dev: u64,
        words: Vec<u32>,
    },
    Number {
        dev: u64,
        ino: u64,
        /// Seconds and nanoseconds of the birth time (`InodeKey::Number`); absent
        /// in a snapshot written before it was part of the identity.
        #[serde(default)]
        born: Option<(i64, u32)>,
    },
}

/// One inode the kernel holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InodeSnapshot {
    /// The kernel's node id.
    pub id: u64,
    /// The `S_IFMT` bits of its kind.
    pub mode: u32,
    /// How many lookups the kernel has not forgotten.
    pub lookups: u64,
    pub key: KeySnapshot,
    /// Its pinned descriptor (file systems without handles).
    pub fd: Option<usize>,
}

/// The inode table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableSnapshot {
    /// The root's identity: a view is only ever handed to a view of the same directory.
    pub root: KeySnapshot,
    pub inodes: Vec<InodeSnapshot>,
    pub next_spare: u64,
}

/// A shared data descriptor's passthrough registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Passthrough {
    /// Not registered yet: the next open reply registers it.
    Untried,
    /// The kernel refused it: served through the daemon.
    Refused,
    /// Registered with this backing id, which stays open across the handover.
    Id(u32),
}

/// The shared I/O descriptor of an inode with open handles.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSnapshot {
    /// The inode whose current shared descriptor it is (`None` for an older, read-only
    /// one that handles opened before a writer still hold).
    pub ino: Option<u64>,
    pub fd: usize,
    pub writable: bool,
    pub passthrough: Passthrough,
}

/// One open handle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HandleSnapshot {
    /// A file opened on node id `ino`: its shared descriptor (an index into
    /// [`ViewSnapshot::files`]).
    File {
        fh: u64,
        ino: u64,
        file: usize,
        sync: bool,
    },
    /// A directory stream: its descriptor (the successor seeks to whatever offset the
    /// kernel asks for next, so entries read ahead and not yet handed over are read
    /// again).
    Dir { fh: u64, ino: u64, fd: usize },
}

/// Everything a view's successor needs besides the descriptors.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewSnapshot {
    pub table: TableSnapshot,
    pub files: Vec<FileSnapshot>,
    pub handles: Vec<HandleSnapshot>,
    pub next_fh: u64,
}
