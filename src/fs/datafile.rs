//! Open files' shared descriptors: one per inode and access, handed to every open
//! of it (`DataFile`), its passthrough registration, the count of live ones, and
//! what holds a removed file's name aside until the last open lets go.

use std::collections::HashMap;
use std::os::fd::BorrowedFd;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::sys::file;
use crate::sys::fuse::Backing;
use crate::sys::{Errno, SysResult};

use super::journal::{Entry, JournalSlot};
use super::lock;
use super::snapshot::Passthrough;

/// An open descriptor for reads and writes, shared by every handle of one inode, and
/// the kernel passthrough registration made for it (by the FUSE adapter, on the first
/// open reply; `None` where the kernel refused it). Dropped, with its registration, when
/// the last handle is released.
pub struct DataFile {
    pub fd: Arc<OwnedFd>,
    pub writable: bool,
    pub passthrough: OnceLock<Option<Arc<Registered>>>,
    /// The same file opened with `O_DIRECT`, on the first direct read or write (or
    /// the first open with `O_DIRECT`): what the view serves direct I/O through.
    direct: OnceLock<OwnedFd>,
    /// The view's journal, where the closing of the backing id is written (once the
    /// view has one).
    journal: JournalSlot,
    /// Counts this descriptor among its view's live ones for as long as it lives.
    _live: Counted,
    /// Counts it among its inode's, until its descriptor and registration are closed
    /// (the fields above drop first).
    _held: OpenHold,
}

/// How many shared descriptors ([`DataFile`]) of a view live. One counts from its
/// making, before any handle holds it, until it is let go: the time in which the
/// kernel may open its file for passthrough.
#[derive(Clone, Default)]
pub struct LiveFiles(Arc<AtomicUsize>);

impl LiveFiles {
    /// Whether no shared descriptor of the view lives.
    pub fn none(&self) -> bool {
        self.0.load(Ordering::SeqCst) == 0
    }

    fn count(&self) -> Counted {
        self.0.fetch_add(1, Ordering::SeqCst);
        Counted(Arc::clone(&self.0))
    }
}

/// One live descriptor of [`LiveFiles`], uncounted when dropped.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A kernel passthrough registration of an inode's shared descriptor, with the view's
/// journal: shared by every shared descriptor of the inode while one holds it (a
/// reader's read-only one, and the read-write one a writer opened since), since the
/// kernel binds one backing file to an inode while any of its opens is
/// ([`Inode::registration`]). Closed when the last descriptor holding it is let go.
pub struct Registered {
    backing: Backing,
    journal: JournalSlot,
}

impl Registered {
    fn new(backing: Backing, journal: &JournalSlot) -> Arc<Registered> {
        Arc::new(Registered {
            backing,
            journal: Arc::clone(journal),
        })
    }

    /// The id a FUSE open reply names.
    pub fn id(&self) -> u32 {
        self.backing.id()
    }
}

impl Drop for Registered {
    /// Journals the backing id's closing before [`Backing`]'s drop closes it: a view
    /// recovered from the journal must not answer an open with an id the kernel no
    /// longer has: fs/fuse/passthrough.c `fuse_passthrough_open` finds no backing file
    /// for it, and fs/fuse/iomode.c `fuse_file_io_open` fails the open with `EIO`.
    fn drop(&mut self) {
        if let Some(j) = self.journal.get() {
            j.append(&Entry::Unbacked {
                id: self.backing.id(),
            });
        }
    }
}

/// A removed file's reserved name in its directory, removed in turn when the view
/// lets the file go.
pub struct MovedAside {
    pub dir: Arc<OwnedFd>,
    pub name: std::ffi::OsString,
}

/// The shared descriptors of one inode that live ([`DataFile`]: a reader's read-only
/// one and a writer's read-write one may live at once, and only the newer is the
/// inode's `data`), and where its file waits for the last of them after it was
/// removed while one lived ([`OpenHold::remove_when_let_go`]).
#[derive(Default)]
pub struct InodeOpens(Mutex<Opens>);

#[derive(Default)]
struct Opens {
    live: usize,
    moved_aside: Option<MovedAside>,
}

impl InodeOpens {
    /// Counts one more.
    fn hold(self: &Arc<Self>) -> OpenHold {
        lock(&self.0).live += 1;
        OpenHold(Arc::clone(self))
    }

    /// Counts one more while one lives: what keeps the file open on the share, where
    /// removing it would leave it "delete pending" and seen under its name. `None`
    /// when every descriptor, with its registration, is closed.
    pub fn held(self: &Arc<Self>) -> Option<OpenHold> {
        let mut o = lock(&self.0);
        (o.live > 0).then(|| {
            o.live += 1;
            OpenHold(Arc::clone(self))
        })
    }
}

/// One count of [`InodeOpens`]. The last one dropped removes the reserved name the
/// file was moved aside to, if it was.
pub struct OpenHold(Arc<InodeOpens>);

impl OpenHold {
    /// Removes `aside` (the reserved name this file was moved to when it was removed
    /// while the view held it open) once the last shared descriptor of the file is
    /// let go. Until then the server keeps the file under that name, which no view
    /// shows, and an open of it that the kernel makes for passthrough after the
    /// view's own (fs/fuse/passthrough.c `fuse_passthrough_open` opens the backing
    /// file again, by its name on a network share) still finds it. Removed at once,
    /// the file would be "delete pending" on an SMB server, which refuses every open
    /// of it, and the kernel would fail the caller's open with `EIO` (fs/fuse/
    /// iomode.c `fuse_file_io_open`), where without the view the open succeeds or
    /// finds no file; and the client would show it under its name to every lookup
    /// until the last open of it is closed (fs/smb/client/smb2inode.c
    /// `smb2_query_path_info` asks through an open handle of the path where it has
    /// one), where the raw mount's removal finds it closed and shows no file.
    pub fn remove_when_let_go(&self, aside: MovedAside) {
        lock(&(self.0).0).moved_aside = Some(aside);
    }
}

impl Drop for OpenHold {
    fn drop(&mut self) {
        let moved = {
            let mut o = lock(&(self.0).0);
            o.live -= 1;
            if o.live == 0 {
                o.moved_aside.take()
            } else {
                None
            }
        };
        if let Some(m) = moved
            && let Err(e) = file::unlink(m.dir.as_fd(), &m.name, file::Remove::NonDirectory)
        {
            left_aside(e, &m.name);
        }
    }
}

/// Says that a file stays on the share under the reserved name `name`, which no view
/// shows: a step that moved it aside (a removal or replacement of an open file where
/// the server keeps an open file's name) could not be undone or finished.
pub fn left_aside(e: Errno, name: &std::ffi::OsStr) {
    tracing::warn!(
        error = %e,
        name = ?name,
        "a file the view moved aside stays on the share under this reserved name, which no view shows; rename or remove it on the share"
    );
}

impl DataFile {
    /// A shared descriptor of the view whose journal is `journal`, counted in its
    /// `live` ones and in its inode's `opens`.
    pub fn new(
        fd: OwnedFd,
        writable: bool,
        journal: &JournalSlot,
        live: &LiveFiles,
        opens: &Arc<InodeOpens>,
    ) -> DataFile {
        DataFile {
            fd: Arc::new(fd),
            writable,
            passthrough: OnceLock::new(),
            direct: OnceLock::new(),
            journal: Arc::clone(journal),
            _live: live.count(),
            _held: opens.hold(),
        }
    }

    /// The descriptor direct I/O goes through: the shared one reopened with
    /// `O_DIRECT` (with its access), made on first use and kept with it. Reopened from
    /// the shared descriptor, so it is the same inode, whatever was renamed or
    /// unlinked since, and a view that took the handles over makes its own.
    ///
    /// # Errors
    /// The error of reopening: `EINVAL` where the backing file system has no direct
    /// I/O, as `open(O_DIRECT)` without the view would have failed.
    pub fn direct(&self) -> SysResult<BorrowedFd<'_>> {
        if let Some(fd) = self.direct.get() {
            return Ok(fd.as_fd());
        }
        let fd = file::reopen_direct(self.fd.as_fd(), self.writable)?;
        // Two first uses at once: one descriptor is kept, the other closed.
        Ok(self.direct.get_or_init(|| fd).as_fd())
    }

    /// Keeps kernel passthrough off this descriptor for as long as it lives, unless a
    /// registration was made for it already: whether every handle of it is now served
    /// by the daemon. All handles of one inode are then of one kind, never a
    /// passthrough open beside a cached one, which the kernel refuses
    /// (fs/fuse/iomode.c `fuse_file_io_open`).
    pub fn keep_off_passthrough(&self) -> bool {
        let _ = self.passthrough.set(None);
        !self.has_passthrough()
    }

    /// Whether a passthrough registration exists for this descriptor.
    pub fn has_passthrough(&self) -> bool {
        self.passthrough.get().is_some_and(Option::is_some)
    }

    /// The registration of this descriptor: got from `get` on the first call (`None`
    /// where there is none, and from then on); the id it names.
    pub fn registered(&self, get: impl FnOnce() -> Option<Arc<Registered>>) -> Option<u32> {
        self.passthrough.get_or_init(get).as_ref().map(|r| r.id())
    }

    /// A registration made for this descriptor, journaled (its closing) in its view's
    /// journal.
    pub fn registration_of(&self, backing: Backing) -> Arc<Registered> {
        Registered::new(backing, &self.journal)
    }

    /// The registration as plain data (its id stays open: see [`Backing`]).
    pub fn passthrough_snapshot(&self) -> Passthrough {
        match self.passthrough.get() {
            None => Passthrough::Untried,
            Some(None) => Passthrough::Refused,
            Some(Some(r)) => Passthrough::Id(r.id()),
        }
    }

    /// Takes the registration of a shared descriptor handed over by the process that
    /// served the view before, on the connection of `dev`: one per id, in `adopted`,
    /// for the descriptors that share one.
    pub fn adopt(
        &self,
        passthrough: Passthrough,
        dev: &Arc<OwnedFd>,
        adopted: &mut HashMap<u32, Arc<Registered>>,
    ) {
        match passthrough {
            Passthrough::Untried => {}
            Passthrough::Refused => {
                let _ = self.passthrough.set(None);
            }
            Passthrough::Id(id) => {
                let r = adopted
                    .entry(id)
                    .or_insert_with(|| Registered::new(Backing::adopt(dev, id), &self.journal));
                let _ = self.passthrough.set(Some(Arc::clone(r)));
            }
        }
    }
}
