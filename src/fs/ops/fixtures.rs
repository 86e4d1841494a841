//! What the operations' tests share: a view over a temporary directory, with the
//! options a test names, and the helpers that read what it answers.

use super::*;
pub(super) use crate::config::ViewOptions;

pub(super) fn view(dir: &std::path::Path, options: &str) -> ViewFs {
    let root = file::open_root(dir).unwrap();
    ViewFs::new(root, &ViewOptions::parse(options).unwrap()).unwrap()
}

/// [`view`] with a network share's lookups: spread over its threads, looked up
/// past a reply's room.
pub(super) fn network_view(dir: &std::path::Path, options: &str) -> ViewFs {
    let mut v = view(dir, options);
    v.cfg.looks_past_room = true;
    v.cfg.lookup_threads = dirs::NETWORK_LOOKUP_THREADS;
    v.cfg.lookups_per_thread = dirs::NETWORK_LOOKUPS_PER_THREAD;
    v
}

/// A directory holding `n` small files named `f0` to `f{n-1}`.
pub(super) fn populated(n: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..n {
        std::fs::write(dir.path().join(format!("f{i}")), "x").unwrap();
    }
    dir
}

pub(super) const ROOT: u64 = 1;

pub(super) const ME: Creator = Creator {
    uid: 1000,
    gid: 1000,
    pid: 0,
};

/// The keeper's side of a view's journal: a descriptor of the one it was last
/// handed.
#[derive(Default)]
pub(super) struct HeldJournal(pub(super) Mutex<Option<OwnedFd>>);

impl HeldJournal {
    /// Starts `v`'s journal (or compacts it into a new one) and holds the new one.
    pub(super) fn take(&self, v: &ViewFs) {
        v.journal_to(Default::default(), |j| {
            *lock(&self.0) = Some(rustix::io::dup(j.fd())?);
            Ok(())
        })
        .unwrap();
    }

    /// What a recovering view would replay from it.
    pub(super) fn replay(&self) -> super::super::journal::Replayed {
        super::super::journal::Replayed::read(lock(&self.0).as_ref().unwrap()).unwrap()
    }
}

/// Where the kernel's passthrough open takes an open handle with the same access
/// (the SMB client: twins), a reader's shared descriptor is read-only, which the
/// server opens once for the reader's open; a writer that comes while it is open
/// gets a read-write one beside it, which names the same registration (the kernel
/// binds one backing file to an inode while any of its opens is: another id fails
/// the writer's open). Journaled for both, and closed with the last of them.
/// A view with twins (as on SMB) and its journal, where a reader opened `f0` and
/// registered it as id 7 (on a stand-in device: the ids are only journaled, and
/// closing one fails), then a writer opened it and got the same registration.
pub(super) struct ReaderThenWriter {
    pub(super) _dir: tempfile::TempDir,
    pub(super) v: ViewFs,
    pub(super) held: HeldJournal,
    pub(super) ino: u64,
    pub(super) dev: Arc<OwnedFd>,
    pub(super) reader: Opened,
    pub(super) writer: Opened,
}

pub(super) fn reader_then_writer() -> ReaderThenWriter {
    let dir = populated(2);
    let v = view(dir.path(), "gid=5");
    v.twin_opens();
    let held = HeldJournal::default();
    held.take(&v);
    let ino = v.lookup(ROOT, OsStr::new("f0")).unwrap().ino;
    let dev = Arc::new(OwnedFd::from(std::fs::File::open("/dev/null").unwrap()));
    let reader = v.open(ino, libc::O_RDONLY, ME.into()).unwrap();
    assert!(!reader.data.writable, "a reader's descriptor is read-only");
    let made = crate::sys::fuse::Backing::adopt(&dev, 7);
    assert_eq!(v.registration(ino, &reader.data, || Some(made)), Some(7));
    let writer = v
        .open(ino, libc::O_WRONLY, ME.into())
        .expect("a writer opens while a reader holds the file");
    assert!(writer.data.writable);
    let shared = v.registration(ino, &writer.data, || panic!("registered anew"));
    assert_eq!(shared, Some(7));
    ReaderThenWriter {
        _dir: dir,
        v,
        held,
        ino,
        dev,
        reader,
        writer,
    }
}

/// Every entry of `fh` from `offset` that one `readdir` call hands over.
pub(super) fn chunk(v: &ViewFs, fh: u64, offset: u64) -> (Vec<Vec<u8>>, u64) {
    let (mut names, mut last) = (Vec::new(), offset);
    v.readdir(
        ROOT,
        fh,
        offset,
        Listing::Names,
        Room::UNBOUNDED,
        |item, next| {
            names.push(item.name.clone());
            last = next;
            false
        },
    )
    .unwrap();
    (names, last)
}

/// Asserts that `items` hold the `n` files of [`populated`], each with its
/// attributes (group 5) and each counted once by the view.
pub(super) fn every_file_with_attributes(v: &ViewFs, items: &[DirItem], n: usize) {
    let files: Vec<_> = items.iter().filter(|i| i.name.starts_with(b"f")).collect();
    assert_eq!(files.len(), n);
    assert!(files.iter().all(|i| i.attr.is_some_and(|a| a.gid == 5)));
    assert_eq!(v.inode_count(), 1 + n);
}

/// Every entry of `fh` from `offset` to the end, one `readdir` call after another.
pub(super) fn rest(v: &ViewFs, fh: u64, offset: u64, listing: Listing) -> Vec<DirItem> {
    let (mut items, mut at) = (Vec::new(), offset);
    loop {
        let before = items.len();
        v.readdir(ROOT, fh, at, listing, Room::UNBOUNDED, |item, next| {
            items.push(item.clone());
            at = next;
            false
        })
        .unwrap();
        if items.len() == before {
            return items;
        }
    }
}

/// The lookup threads `v` started, once `n` have or 10 s passed (each counts
/// itself as it starts, after its pool is made).
pub(super) fn helpers_started(v: &ViewFs, n: usize) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while v.helpers.started() < n && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    v.helpers.started()
}

/// Makes this test thread give up `CAP_DAC_READ_SEARCH`, which an acting thread
/// keeps and a local file system honours, where the NFS client does not (the
/// server answers for the caller: fs/nfs/dir.c `nfs_permission`): as the share
/// would ignore it. Threads it starts from now on inherit that.
pub(super) fn without_read_search_override() {
    use rustix::thread::{CapabilitySet, capabilities, set_capabilities};
    let mut caps = capabilities(None).unwrap();
    caps.permitted.remove(CapabilitySet::DAC_READ_SEARCH);
    caps.effective.remove(CapabilitySet::DAC_READ_SEARCH);
    set_capabilities(None, caps).unwrap();
}

/// The entries named `f...` of one listing of directory `ino`, as the view decides.
pub(super) fn listed_files(v: &ViewFs, ino: u64) -> Vec<DirItem> {
    let fh = v.opendir(ino).unwrap();
    let mut items = Vec::new();
    v.readdir(ino, fh, 0, Listing::AsNeeded, Room::UNBOUNDED, |item, _| {
        if item.name.starts_with(b"f") {
            items.push(item.clone());
        }
        false
    })
    .unwrap();
    v.release(fh);
    items
}

/// Asserts that `dir` holds one entry, under a reserved name: a removed file the
/// view holds open, moved aside rather than removed.
pub(super) fn only_moved_aside(dir: &std::path::Path) {
    let aside: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        aside.len() == 1 && namespace::is_reserved_name(aside[0].as_bytes()),
        "moved aside, not removed: {aside:?}"
    );
}
