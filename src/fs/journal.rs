//! A view's tables as an append-only journal, kept in memory the keeper holds (a
//! memfd): what a process needs to take over a view whose process died without a
//! chance to hand it over (SIGKILL, an OOM kill, a bug). Each change a view makes to
//! what the kernel holds is a line: an inode given a node id or forgotten, a handle
//! opened or released, a passthrough registration. Replayed in order, the lines give
//! the tables the dead process had, up to its last answered request.
//!
//! A line is JSON; a line cut short by the death of the writer is ignored. Appends are
//! single `write(2)` calls on an `O_APPEND` descriptor, so lines from concurrent
//! workers never interleave.

use std::collections::BTreeMap;
use std::io::{self, Read, Seek, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use serde::{Deserialize, Serialize};

use super::snapshot::{InodeSnapshot, KeySnapshot, Passthrough, TableSnapshot};

/// What a connection's INIT negotiated, which a process that adopts the connection
/// (a successor, or a process recovering a dead view) cannot ask the kernel again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Negotiated {
    /// Kernel FUSE passthrough (`FUSE_PASSTHROUGH`).
    pub passthrough: bool,
    /// Idmapped mounts of the view allowed (`FUSE_ALLOW_IDMAP`). Absent from what
    /// earlier versions wrote, which never asked for it.
    #[serde(default)]
    pub idmap: bool,
    /// The FUSE protocol minor the kernel spoke at INIT (7.40 is Linux 6.9); 0 where
    /// not known (what earlier versions wrote).
    #[serde(default)]
    pub minor: u32,
}

/// One change to what the kernel holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Entry {
    /// What INIT negotiated (the first line).
    Negotiated {
        passthrough: bool,
        #[serde(default)]
        idmap: bool,
        #[serde(default)]
        minor: u32,
    },
    /// A node id given to an inode.
    Inode {
        id: u64,
        mode: u32,
        key: KeySnapshot,
    },
    /// A node id the kernel forgot.
    Forgot { id: u64 },
    /// A file handle opened.
    File {
        fh: u64,
        ino: u64,
        writable: bool,
        sync: bool,
    },
    /// A directory handle opened.
    Dir { fh: u64, ino: u64 },
    /// A handle released.
    Released { fh: u64 },
    /// A passthrough backing id registered for an inode's shared descriptor: the
    /// read-write one or the read-only one (an inode can have both). Absent
    /// `writable`: written by an earlier version, for either.
    Backing {
        ino: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        writable: Option<bool>,
        id: u32,
    },
    /// An inode's shared descriptor served by the daemon for as long as it lives (the
    /// kernel refused its registration, or it is of a file the view created on an SMB
    /// share): a recovered view must serve later opens of it too, since the
    /// kernel fails a passthrough open of an inode another open holds in cached mode
    /// (fs/fuse/iomode.c `fuse_file_io_open`).
    Served { ino: u64, writable: bool },
    /// A backing id about to be closed, its descriptor gone (written before the
    /// close, so that a replay never hands out an id the kernel no longer has).
    Unbacked { id: u32 },
    /// The root's identity (with the first line).
    Root { key: KeySnapshot },
}

/// Where a view's journal is, once it has one: shared with the open files, which
/// journal the closing of their backing ids.
pub type JournalSlot = Arc<std::sync::OnceLock<Arc<Journaling>>>;

/// The journal a view appends to.
pub struct Journal {
    file: std::fs::File,
}

impl Journal {
    /// A new, empty journal in memory (a memfd).
    ///
    /// # Errors
    /// The error of `memfd_create`.
    pub fn create() -> io::Result<Journal> {
        // Appending: each write lands whole at the end, whoever else writes.
        let file = crate::sys::file::memfd_append(c"mountgroup-journal")?;
        Ok(Journal { file })
    }

    /// Appends one record. A journal that cannot be written (out of memory) only
    /// costs the view its crash recovery; it is logged, not answered to the kernel.
    pub fn append(&self, r: &Entry) {
        self.append_all(std::slice::from_ref(r));
    }

    /// Appends records in one write, in order (a listing's new node ids).
    pub fn append_all(&self, records: &[Entry]) {
        let mut lines = Vec::with_capacity(128 * records.len());
        for r in records {
            encode(r, &mut lines);
        }
        if !lines.is_empty() {
            self.write_lines(&lines);
        }
    }

    fn write_lines(&self, lines: &[u8]) {
        if let Err(e) = (&self.file).write_all(lines) {
            tracing::warn!(error = %e, "cannot write the view's journal: a crash of this view would cost a remount");
        }
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// How many bytes it holds.
    pub fn size(&self) -> u64 {
        self.file.metadata().map_or(0, |m| m.len())
    }

    /// Writes a view's tables as records: the start of a journal. A few large writes,
    /// not one per record: a compaction writes the whole table under the inode table's
    /// lock, which every lookup waits for meanwhile (100,000 inodes: 100,000 calls).
    pub fn write_tables(&self, negotiated: Negotiated, table: &TableSnapshot, handles: &[Entry]) {
        const CHUNK: usize = 1 << 20;
        let mut buf = Vec::with_capacity(CHUNK + 4096);
        let add = |e: &Entry, buf: &mut Vec<u8>| {
            encode(e, buf);
            if buf.len() >= CHUNK {
                self.write_lines(buf);
                buf.clear();
            }
        };
        let Negotiated {
            passthrough,
            idmap,
            minor,
        } = negotiated;
        add(
            &Entry::Negotiated {
                passthrough,
                idmap,
                minor,
            },
            &mut buf,
        );
        add(
            &Entry::Root {
                key: table.root.clone(),
            },
            &mut buf,
        );
        for i in &table.inodes {
            add(
                &Entry::Inode {
                    id: i.id,
                    mode: i.mode,
                    key: i.key.clone(),
                },
                &mut buf,
            );
        }
        for h in handles {
            add(h, &mut buf);
        }
        if !buf.is_empty() {
            self.write_lines(&buf);
        }
    }
}

/// Appends `r` to `out` as one journal line; `false` if it cannot be encoded.
fn encode(r: &Entry, out: &mut Vec<u8>) -> bool {
    let start = out.len();
    if serde_json::to_writer(&mut *out, r).is_err() {
        // Nothing half-written stays to run into the next line of a batch.
        out.truncate(start);
        return false;
    }
    out.push(b'\n');
    true
}

/// The journal a view appends to now. A compaction writes the view's tables to a fresh
/// journal and switches to it under the write lock; appends take the read lock, so no
/// change falls between the two. Lock order: the inode table's lock, then this one.
pub struct Journaling {
    current: RwLock<Arc<Journal>>,
    /// The size right after the last compaction (or the start).
    base: std::sync::atomic::AtomicU64,
}

impl Journaling {
    pub fn new(first: Journal) -> Journaling {
        Journaling {
            base: std::sync::atomic::AtomicU64::new(first.size()),
            current: RwLock::new(Arc::new(first)),
        }
    }

    /// The journal, for appends (held across a change to the handle table, so that a
    /// compaction sees the change or its record, never only one).
    pub fn read(&self) -> RwLockReadGuard<'_, Arc<Journal>> {
        self.current.read().unwrap_or_else(|e| e.into_inner())
    }

    /// For a compaction: no append until the guard goes.
    pub fn write(&self) -> RwLockWriteGuard<'_, Arc<Journal>> {
        self.current.write().unwrap_or_else(|e| e.into_inner())
    }

    pub fn append(&self, e: &Entry) {
        self.read().append(e);
    }

    /// [`Journal::append_all`] on the journal in use.
    pub fn append_all(&self, records: &[Entry]) {
        self.read().append_all(records);
    }

    /// Whether the journal has grown enough to be worth writing anew: past `floor`
    /// bytes and four times its size after the last compaction.
    pub fn wants_compaction(&self, floor: u64) -> bool {
        let size = self.read().size();
        size > floor && size > 4 * self.base.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Installs a compacted journal (under the guard from [`Journaling::write`]).
    pub fn install(&self, guard: &mut RwLockWriteGuard<'_, Arc<Journal>>, next: Journal) {
        self.base
            .store(next.size(), std::sync::atomic::Ordering::Relaxed);
        **guard = Arc::new(next);
    }
}

/// What a journal says: the state a dead view left, as plain data.
#[derive(Debug, Default)]
pub struct Replayed {
    pub negotiated: Negotiated,
    pub root: Option<KeySnapshot>,
    /// Node id → (mode, key), for the ids the kernel still holds.
    pub inodes: BTreeMap<u64, (u32, KeySnapshot)>,
    /// Open file handles: fh → (ino, writable, sync).
    pub files: BTreeMap<u64, (u64, bool, bool)>,
    /// Open directory handles: fh → ino.
    pub dirs: BTreeMap<u64, u64>,
    /// The backing ids registered and not closed, and the descriptors served by the
    /// daemon ([`Passthrough::Refused`]), per inode and descriptor (read-write or not;
    /// `None`: a line of an earlier version, for either).
    pub backing: BTreeMap<(u64, Option<bool>), Passthrough>,
}

impl Replayed {
    /// Reads the journal behind `fd` from its start.
    ///
    /// # Errors
    /// The error of reading it.
    pub fn read(fd: &OwnedFd) -> io::Result<Replayed> {
        let mut file = std::fs::File::from(fd.try_clone()?);
        file.rewind()?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let mut r = Replayed::default();
        for line in bytes.split(|b| *b == b'\n') {
            // The last line may be cut short by the writer's death.
            let Ok(rec) = serde_json::from_slice::<Entry>(line) else {
                continue;
            };
            r.apply(rec);
        }
        Ok(r)
    }

    fn apply(&mut self, rec: Entry) {
        match rec {
            Entry::Negotiated {
                passthrough,
                idmap,
                minor,
            } => {
                self.negotiated = Negotiated {
                    passthrough,
                    idmap,
                    minor,
                }
            }
            Entry::Root { key } => self.root = Some(key),
            Entry::Inode { id, mode, key } => {
                self.inodes.insert(id, (mode, key));
            }
            Entry::Forgot { id } => {
                self.inodes.remove(&id);
            }
            Entry::File {
                fh,
                ino,
                writable,
                sync,
            } => {
                self.files.insert(fh, (ino, writable, sync));
            }
            Entry::Dir { fh, ino } => {
                self.dirs.insert(fh, ino);
            }
            Entry::Released { fh } => {
                self.files.remove(&fh);
                self.dirs.remove(&fh);
            }
            Entry::Backing { ino, writable, id } => {
                self.backing.insert((ino, writable), Passthrough::Id(id));
            }
            Entry::Served { ino, writable } => {
                self.backing
                    .insert((ino, Some(writable)), Passthrough::Refused);
            }
            Entry::Unbacked { id } => self.backing.retain(|_, v| *v != Passthrough::Id(id)),
        }
    }

    /// The inode table it describes. Lookup counts were not journaled (a lookup is
    /// the most frequent request): every inode gets a count no FORGET can exhaust, so
    /// a recovered view keeps what the kernel might still name, at the price of
    /// keeping it until the view ends.
    pub fn table(&self) -> Option<TableSnapshot> {
        Some(TableSnapshot {
            root: self.root.clone()?,
            inodes: self
                .inodes
                .iter()
                .map(|(id, (mode, key))| InodeSnapshot {
                    id: *id,
                    mode: *mode,
                    lookups: u64::MAX / 2,
                    key: key.clone(),
                    fd: None,
                })
                .collect(),
            next_spare: self
                .inodes
                .keys()
                .copied()
                .filter(|id| *id >= 1 << 63)
                .max()
                .unwrap_or(1 << 63),
        })
    }

    /// The next file handle number: above every one handed out.
    pub fn next_fh(&self) -> u64 {
        self.files
            .keys()
            .chain(self.dirs.keys())
            .max()
            .map_or(1, |m| m + 1)
    }

    /// The passthrough state of an inode's shared descriptor, read-write or not: the
    /// id registered for it and still open, or served by the daemon, else none yet
    /// (the next open registers one).
    pub fn passthrough_of(&self, ino: u64, writable: bool) -> Passthrough {
        self.backing
            .get(&(ino, Some(writable)))
            .or_else(|| self.backing.get(&(ino, None)))
            .copied()
            .unwrap_or(Passthrough::Untried)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn key(n: u32) -> KeySnapshot {
        KeySnapshot::Handle {
            dev: 1,
            words: vec![4, 1, n],
        }
    }

    /// A table of `n` inodes, ids from 100.
    fn table(n: u32) -> TableSnapshot {
        TableSnapshot {
            root: key(0),
            inodes: (0..n)
                .map(|i| InodeSnapshot {
                    id: 100 + u64::from(i),
                    mode: libc::S_IFREG,
                    lookups: 1,
                    key: key(i),
                    fd: None,
                })
                .collect(),
            next_spare: 1 << 63,
        }
    }

    /// A compaction's table goes out in chunks of many lines; one larger than a chunk
    /// replays whole, each line intact at the chunks' seams.
    #[test]
    fn tables_written_in_chunks_replay_whole() {
        let j = Journal::create().unwrap();
        let handles = [Entry::Dir { fh: 7, ino: 100 }];
        j.write_tables(
            Negotiated {
                passthrough: true,
                idmap: true,
                minor: 41,
            },
            &table(40_000),
            &handles,
        );
        assert!(
            j.size() > 2 << 20,
            "more than two chunks: {} bytes",
            j.size()
        );
        j.append(&Entry::Forgot { id: 100 });
        let r = Replayed::read(&rustix::io::dup(j.fd()).unwrap()).unwrap();
        assert!(r.negotiated.passthrough);
        assert_eq!(r.negotiated.minor, 41);
        assert_eq!(r.root, Some(key(0)));
        assert_eq!(r.inodes.len(), 39_999);
        assert_eq!(r.inodes.keys().next(), Some(&101));
        assert_eq!(r.inodes.keys().last(), Some(&(100 + 39_999)));
        assert_eq!(r.dirs.get(&7), Some(&100));
    }

    #[test]
    fn replay_gives_the_last_state_and_skips_a_torn_line() {
        let j = Journal::create().unwrap();
        j.append(&Entry::Negotiated {
            passthrough: true,
            idmap: false,
            minor: 38,
        });
        j.append(&Entry::Root { key: key(0) });
        j.append(&Entry::Inode {
            id: 10,
            mode: libc::S_IFREG,
            key: key(10),
        });
        j.append(&Entry::Inode {
            id: 11,
            mode: libc::S_IFDIR,
            key: key(11),
        });
        j.append(&Entry::Forgot { id: 11 });
        j.append(&Entry::File {
            fh: 5,
            ino: 10,
            writable: true,
            sync: false,
        });
        j.append(&Entry::Backing {
            ino: 10,
            writable: Some(true),
            id: 3,
        });
        j.append(&Entry::Dir { fh: 6, ino: 1 });
        j.append(&Entry::Released { fh: 6 });
        // A writer killed in the middle of a line.
        (&j.file).write_all(b"{\"Inode\":{\"id\":12,").unwrap();
        let fd = rustix::io::dup(j.fd()).unwrap();
        assert!(fd.as_raw_fd() >= 0);
        let r = Replayed::read(&fd).unwrap();
        assert!(r.negotiated.passthrough);
        assert_eq!(r.inodes.keys().copied().collect::<Vec<_>>(), [10]);
        assert_eq!(r.files.get(&5), Some(&(10, true, false)));
        assert!(r.dirs.is_empty());
        assert_eq!(r.passthrough_of(10, true), Passthrough::Id(3));
        assert_eq!(r.next_fh(), 6);
        let table = r.table().unwrap();
        assert_eq!(table.inodes.len(), 1);
        assert!(table.inodes[0].lookups > 1 << 60);
    }

    /// An inode's read-only and read-write descriptors each keep their own id, and a
    /// closed id is never handed out again: a recovered view that answered an open
    /// with either would have the kernel fail it (EIO, fs/fuse/iomode.c
    /// `fuse_file_io_open`).
    #[test]
    fn backing_ids_are_per_descriptor_and_end_when_closed() {
        let j = Journal::create().unwrap();
        let backing = |ino, writable, id| Entry::Backing {
            ino,
            writable: Some(writable),
            id,
        };
        j.append(&backing(10, false, 3));
        j.append(&backing(10, true, 4));
        j.append(&backing(11, true, 5));
        j.append(&Entry::Unbacked { id: 5 });
        // A line of an earlier version: no `writable`.
        (&j.file)
            .write_all(b"{\"Backing\":{\"ino\":12,\"id\":6}}\n")
            .unwrap();
        let r = Replayed::read(&rustix::io::dup(j.fd()).unwrap()).unwrap();
        assert_eq!(r.passthrough_of(10, false), Passthrough::Id(3));
        assert_eq!(r.passthrough_of(10, true), Passthrough::Id(4));
        assert_eq!(r.passthrough_of(11, true), Passthrough::Untried);
        assert_eq!(r.passthrough_of(12, true), Passthrough::Id(6));
        assert_eq!(r.passthrough_of(12, false), Passthrough::Id(6));
    }

    /// A descriptor served by the daemon is replayed as such, per descriptor, until a
    /// later registration for the inode's next descriptor replaces it.
    #[test]
    fn a_served_descriptor_is_replayed_served() {
        let j = Journal::create().unwrap();
        j.append(&Entry::Served {
            ino: 13,
            writable: true,
        });
        let r = Replayed::read(&rustix::io::dup(j.fd()).unwrap()).unwrap();
        assert_eq!(r.passthrough_of(13, true), Passthrough::Refused);
        assert_eq!(r.passthrough_of(13, false), Passthrough::Untried);
        j.append(&Entry::Backing {
            ino: 13,
            writable: Some(true),
            id: 7,
        });
        let r = Replayed::read(&rustix::io::dup(j.fd()).unwrap()).unwrap();
        assert_eq!(r.passthrough_of(13, true), Passthrough::Id(7));
        j.append(&Entry::Unbacked { id: 7 });
        let r = Replayed::read(&rustix::io::dup(j.fd()).unwrap()).unwrap();
        assert_eq!(r.passthrough_of(13, true), Passthrough::Untried);
    }
}
