//! The inode table: one `O_PATH|O_NOFOLLOW` descriptor per inode the kernel knows,
//! counted by lookups and released on FORGET, so memory and open descriptors stay
//! bounded however many files a pod walks.

use std::any::Any;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};

use crate::sys::file::{Kind, Stat};

use super::error::{FsError, FsResult};

/// The kernel's id of the root inode.
pub const ROOT_ID: u64 = 1;

/// Ids handed out when the backing inode number cannot serve (it is 1, or a second
/// file system under one mount, e.g. btrfs subvolumes, reuses a number).
const SPARE_BASE: u64 = 1 << 63;

/// A backing inode's identity.
pub type InodeKey = (u64, u64);

/// An open descriptor for reads and writes, shared by every handle of one inode, and
/// the kernel passthrough registration made for it (type-erased: the FUSE adapter owns
/// it, so this core never sees a fuser type). Dropped, with its registration, when the
/// last handle is released.
pub struct DataFile {
    pub fd: OwnedFd,
    pub writable: bool,
    pub passthrough: OnceLock<Option<Box<dyn Any + Send + Sync>>>,
}

impl DataFile {
    pub fn new(fd: OwnedFd, writable: bool) -> DataFile {
        DataFile {
            fd,
            writable,
            passthrough: OnceLock::new(),
        }
    }

    /// Whether a passthrough registration exists for this descriptor.
    pub fn has_passthrough(&self) -> bool {
        self.passthrough.get().is_some_and(Option::is_some)
    }
}

/// One inode the kernel holds a reference to.
pub struct Inode {
    /// The kernel's id for it (`nodeid`), also shown as `st_ino`.
    pub id: u64,
    pub fd: OwnedFd,
    pub kind: Kind,
    pub key: InodeKey,
    lookups: AtomicU64,
    /// The shared I/O descriptor while any handle is open.
    pub data: Mutex<Weak<DataFile>>,
}

struct Maps {
    by_id: HashMap<u64, Arc<Inode>>,
    by_key: HashMap<InodeKey, u64>,
    next_spare: u64,
}

/// All inodes of one view.
pub struct InodeTable {
    maps: RwLock<Maps>,
    root: Arc<Inode>,
}

impl InodeTable {
    /// A table holding only the root, which is never forgotten.
    pub fn new(root_fd: OwnedFd, root: &Stat) -> InodeTable {
        let key = (root.dev, root.ino);
        let root = Arc::new(Inode {
            id: ROOT_ID,
            fd: root_fd,
            kind: root.kind,
            key,
            lookups: AtomicU64::new(1),
            data: Mutex::new(Weak::new()),
        });
        let mut maps = Maps {
            by_id: HashMap::new(),
            by_key: HashMap::new(),
            next_spare: SPARE_BASE,
        };
        maps.by_id.insert(ROOT_ID, Arc::clone(&root));
        maps.by_key.insert(key, ROOT_ID);
        InodeTable {
            maps: RwLock::new(maps),
            root,
        }
    }

    pub fn root(&self) -> &Arc<Inode> {
        &self.root
    }

    /// The inode with kernel id `id`.
    ///
    /// # Errors
    /// [`FsError::UnknownInode`] when the kernel names an id it was never given or has
    /// forgotten.
    pub fn get(&self, id: u64) -> FsResult<Arc<Inode>> {
        if id == ROOT_ID {
            return Ok(Arc::clone(&self.root));
        }
        let maps = self.maps.read().unwrap_or_else(|e| e.into_inner());
        maps.by_id
            .get(&id)
            .cloned()
            .ok_or(FsError::UnknownInode(id))
    }

    /// Counts one kernel lookup of the inode `fd` refers to, registering it if new
    /// (the descriptor is dropped if the inode is already known).
    pub fn lookup(&self, fd: OwnedFd, st: &Stat) -> Arc<Inode> {
        let key = (st.dev, st.ino);
        {
            // Under the read lock no FORGET can remove an entry, so an inode found
            // here has at least one lookup and may safely gain another.
            let maps = self.maps.read().unwrap_or_else(|e| e.into_inner());
            if let Some(inode) = maps.by_key.get(&key).and_then(|id| maps.by_id.get(id)) {
                inode.lookups.fetch_add(1, Ordering::Relaxed);
                return Arc::clone(inode);
            }
        }
        let mut maps = self.maps.write().unwrap_or_else(|e| e.into_inner());
        if let Some(inode) = maps.by_key.get(&key).and_then(|id| maps.by_id.get(id)) {
            inode.lookups.fetch_add(1, Ordering::Relaxed);
            return Arc::clone(inode);
        }
        let id = if st.ino > ROOT_ID && st.ino < SPARE_BASE && !maps.by_id.contains_key(&st.ino) {
            st.ino
        } else {
            maps.next_spare += 1;
            maps.next_spare
        };
        let inode = Arc::new(Inode {
            id,
            fd,
            kind: st.kind,
            key,
            lookups: AtomicU64::new(1),
            data: Mutex::new(Weak::new()),
        });
        maps.by_id.insert(id, Arc::clone(&inode));
        maps.by_key.insert(key, id);
        inode
    }

    /// Drops `n` kernel lookups of `id`; the inode goes when none are left.
    pub fn forget(&self, id: u64, n: u64) {
        if id == ROOT_ID {
            return;
        }
        let mut maps = self.maps.write().unwrap_or_else(|e| e.into_inner());
        let Some(inode) = maps.by_id.get(&id) else {
            return;
        };
        // Writers are excluded, so load-then-store cannot lose a concurrent change.
        let left = inode.lookups.load(Ordering::Relaxed).saturating_sub(n);
        inode.lookups.store(left, Ordering::Relaxed);
        if left == 0 {
            let key = inode.key;
            maps.by_id.remove(&id);
            maps.by_key.remove(&key);
            // After a walk of millions of files the maps would keep their peak size.
            if maps.by_id.capacity() > 1024 && maps.by_id.len() * 4 < maps.by_id.capacity() {
                maps.by_id.shrink_to_fit();
                maps.by_key.shrink_to_fit();
            }
        }
    }

    /// How many inodes the table holds (the root included).
    pub fn len(&self) -> usize {
        self.maps
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_id
            .len()
    }

    /// Whether only the root is held.
    pub fn is_empty(&self) -> bool {
        self.len() <= 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::file;

    fn open(path: &std::path::Path) -> (OwnedFd, Stat) {
        let fd = file::open_root(path).unwrap();
        let st = file::stat(std::os::fd::AsFd::as_fd(&fd)).unwrap();
        (fd, st)
    }

    #[test]
    fn lookups_are_counted_and_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        let (rfd, rst) = open(dir.path());
        let table = InodeTable::new(rfd, &rst);
        let (fd, st) = open(&dir.path().join("a"));
        let a = table.lookup(fd, &st);
        assert_eq!(a.id, st.ino, "the backing inode number is the id");
        let (fd2, st2) = open(&dir.path().join("a"));
        let again = table.lookup(fd2, &st2);
        assert!(Arc::ptr_eq(&a, &again), "one inode per backing inode");
        assert_eq!(table.len(), 2);
        table.forget(a.id, 1);
        assert!(table.get(a.id).is_ok(), "one lookup left");
        table.forget(a.id, 1);
        assert_eq!(table.get(a.id).err(), Some(FsError::UnknownInode(a.id)));
        assert!(table.is_empty());
        table.forget(ROOT_ID, 100);
        assert!(table.get(ROOT_ID).is_ok(), "the root is never forgotten");
    }

    #[test]
    fn colliding_numbers_get_spare_ids() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        let (rfd, rst) = open(dir.path());
        let table = InodeTable::new(rfd, &rst);
        let (fd, mut st) = open(&dir.path().join("a"));
        st.ino = 1;
        let a = table.lookup(fd, &st);
        assert!(a.id > SPARE_BASE);
        let (fd, mut st) = open(&dir.path().join("a"));
        st.dev += 1; // same number, another file system
        let (fd0, st0) = open(&dir.path().join("a"));
        let first = table.lookup(fd0, &st0);
        st.ino = st0.ino;
        let second = table.lookup(fd, &st);
        assert_ne!(first.id, second.id);
    }
}
