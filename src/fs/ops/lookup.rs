//! Lookups: a name in a directory to an inode of the table, beneath the root and
//! through no symlink; held names of SMB directories; forgetting.

use std::ffi::OsStr;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use crate::sys::file::{self, Access, Kind};
use crate::sys::handle::FileHandle;
use crate::sys::{Errno, dir};

use super::super::error::{FsError, FsResult};
use super::super::inode::Inode;
use super::{Attr, DIR_BUF};
use super::{ViewFs, namespace};

impl ViewFs {
    /// Looks a name up in a directory; counts one kernel lookup of the result.
    ///
    /// A mount point inside the backing tree is not crossed: it is reported as absent.
    ///
    /// On an SMB share a name the directory's held names lack is answered absent
    /// without asking the share (`fs/names.rs`).
    ///
    /// # Errors
    /// `ENOENT` when absent ([`FsError::Absent`] when held names say so), `ENOTDIR`
    /// when `parent` is not a directory.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> FsResult<Attr> {
        self.lookup_cached(parent, name, false)
            .map(|(attr, _)| attr)
    }

    /// The kernel's lookup: [`ViewFs::lookup`], where the share checks permissions
    /// ([`ViewFs::share_checks`]) and the kernel holds the name already, with the
    /// attributes its client has cached, which a lookup for an open does not need (its
    /// `OPEN` brings them) and a stat asks for afresh; and, for those, how long the
    /// kernel may keep them: what is left of the attribute timeout since the view last
    /// read them afresh (they are at least as new), else nothing. `None`: read
    /// afresh, kept for the attribute timeout.
    ///
    /// # Errors
    /// As [`ViewFs::lookup`].
    pub fn lookup_for_kernel(
        &self,
        parent: u64,
        name: &OsStr,
    ) -> FsResult<(Attr, Option<std::time::Duration>)> {
        self.lookup_cached(parent, name, self.cfg.share_checks)
    }

    fn lookup_cached(
        &self,
        parent: u64,
        name: &OsStr,
        cached: bool,
    ) -> FsResult<(Attr, Option<std::time::Duration>)> {
        let held = if self.names.on() {
            let p = self.dir(parent)?;
            if let Some(left) = self.names.absent(parent, &p, name.as_bytes()) {
                return Err(FsError::Absent(left));
            }
            Some(p)
        } else {
            None
        };
        let found = self.find(parent, name, cached);
        if let (Err(FsError::Os(Errno::ENOENT)), Some(p)) = (&found, held) {
            if self.names.missed(parent, &p) {
                self.hold_names(parent, &p);
            }
        }
        let was_held = matches!(found, Ok((_, true, _)));
        self.listing.looked_up(parent, name.as_bytes(), was_held);
        if let Ok((a, _, _)) = &found {
            if a.kind == Kind::Directory {
                self.listing.reached(parent, a.ino);
            }
        }
        found.map(|(attr, _, keep)| (attr, keep))
    }

    /// Lists directory `p` (number `ino`) for its held names (`fs/names.rs`): every
    /// name, or none past [`super::super::names::MAX_NAMES`].
    fn hold_names(&self, ino: u64, p: &Arc<Inode>) {
        use super::super::names::{Listed, MAX_NAMES};
        let Some(began) = self.names.listing(ino, p) else {
            return;
        };
        let list = || -> FsResult<Listed> {
            let path_fd = p.fd()?;
            let fd = self
                .inodes
                .with_fds(|| file::reopen(path_fd.as_fd(), Kind::Directory, Access::Directory))?;
            self.no_atime(&fd, Kind::Directory);
            let mut buf = vec![MaybeUninit::uninit(); DIR_BUF];
            let mut names = Vec::new();
            loop {
                let batch = dir::read_batch(fd.as_fd(), &mut buf)?;
                if batch.is_empty() {
                    return Ok(Listed::Names(names));
                }
                names.extend(batch.into_iter().map(|e| e.name));
                if names.len() > MAX_NAMES + 2 {
                    return Ok(Listed::TooMany);
                }
            }
        };
        let listed = list().unwrap_or_else(|e| {
            tracing::debug!(ino, error = %e, "listing a directory for its names failed");
            Listed::Failed
        });
        self.names.listed(ino, p, began, listed);
    }

    /// [`ViewFs::lookup`] made by the view itself (a listing's attributes).
    pub(super) fn lookup_entry(&self, parent: u64, name: &OsStr) -> FsResult<Attr> {
        self.find(parent, name, false).map(|(attr, _, _)| attr)
    }

    /// A lookup: the attributes, whether the kernel held the inode already (a
    /// revalidation, most often), and, where `cached` asks for the attributes the
    /// file system has cached, how long they may be kept ([`ViewFs::lookup_for_kernel`]).
    fn find(
        &self,
        parent: u64,
        name: &OsStr,
        cached: bool,
    ) -> FsResult<(Attr, bool, Option<std::time::Duration>)> {
        if namespace::is_reserved_name(name.as_bytes()) {
            return Err(FsError::Os(Errno::ENOENT));
        }
        let p = self.dir(parent)?;
        let pfd = p.fd()?;
        if let Some((opened, st)) = self.ahead.claim(parent, pfd.as_fd(), name.as_bytes()) {
            return self
                .register_stat(opened.fd, &st, opened.handle, true)
                .map(|(attr, held, _)| (attr, held, None));
        }
        let fd = match self
            .inodes
            .with_fds(|| file::open_child(pfd.as_fd(), name, self.share.root_mnt))
        {
            Ok(fd) => fd,
            Err(Errno::EXDEV) => return Err(FsError::Os(Errno::ENOENT)),
            Err(e) => return Err(e.into()),
        };
        let handle = self.inodes.handle_of(fd.as_fd());
        // A name new to the kernel (its first lookup, or its first since the kernel
        // let the inode go) is read afresh: the client's own lookup of it has most
        // often just brought its attributes, which costs no request, and the kernel
        // may then keep them, where a stat would ask again at once. A revalidation
        // (an open's lookup of a name the kernel holds, most often) asks nothing.
        let held_st = if cached {
            Some(file::stat_cached(fd.as_fd())?).filter(|st| self.inodes.has(st, handle.as_ref()))
        } else {
            None
        };
        let Some(st) = held_st else {
            let st = file::stat(fd.as_fd())?;
            return self
                .register_stat(fd, &st, handle, true)
                .map(|(attr, held, _)| (attr, held, None));
        };
        let (attr, held, age) = self.register_stat(fd, &st, handle, false)?;
        // As new as the view's last fresh read of them, or a warming's open of the
        // directory, whichever came later.
        let warmed = self.ahead.warmed_age(attr.ino, st.dev, st.ino);
        let age = match (age, warmed) {
            (Some(a), Some(w)) => Some(a.min(w)),
            (a, w) => a.or(w),
        };
        let left = age.map_or(std::time::Duration::ZERO, |age| {
            self.cfg.attr_timeout.saturating_sub(age)
        });
        Ok((attr, held, Some(left)))
    }

    pub(super) fn register(&self, fd: OwnedFd) -> FsResult<Attr> {
        let st = file::stat(fd.as_fd())?;
        let handle = self.inodes.handle_of(fd.as_fd());
        self.register_stat(fd, &st, handle, true)
            .map(|(attr, _, _)| attr)
    }

    /// [`ViewFs::register`] with the inode's attributes and handle read already,
    /// afresh (`synced`) or from the file system's cache; and whether the kernel held
    /// the inode already, and how long ago the view last read them afresh.
    fn register_stat(
        &self,
        fd: OwnedFd,
        st: &file::Stat,
        handle: Option<FileHandle>,
        synced: bool,
    ) -> FsResult<(Attr, bool, Option<std::time::Duration>)> {
        let inode = self.inodes.lookup_handled(fd, st, handle);
        if synced {
            inode.synced.mark();
        }
        let held = inode.lookups() > 1;
        match self.attr(&inode, st) {
            Ok(a) => Ok((a, held, inode.synced.age())),
            Err(e) => {
                self.inodes.forget(inode.id, 1);
                Err(e)
            }
        }
    }

    /// Drops `n` kernel lookups of `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        self.inodes.forget(ino, n);
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::*;

    #[test]
    fn names_that_leave_the_directory_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let v = view(dir.path(), "gid=5");
        for name in ["..", ".", "a/b", ""] {
            assert_eq!(
                v.lookup(ROOT, OsStr::new(name)),
                Err(FsError::Os(Errno::EINVAL)),
                "{name:?}"
            );
        }
    }

    #[test]
    fn a_symlink_is_looked_up_as_itself() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("l")).unwrap();
        let v = view(dir.path(), "gid=5");
        let a = v.lookup(ROOT, OsStr::new("l")).unwrap();
        assert_eq!(a.kind, Kind::Symlink);
        assert_eq!(v.readlink(a.ino).unwrap(), b"/etc");
        assert_eq!(v.opendir(a.ino), Err(FsError::Os(Errno::ENOTDIR)));
        assert_eq!(
            v.lookup(a.ino, OsStr::new("passwd")),
            Err(FsError::Os(Errno::ENOTDIR))
        );
    }

    #[test]
    fn lookups_of_names_a_held_directory_lacks_are_answered_without_the_disk() {
        use crate::fs::names::{FIRST_LISTING_MISSES, HeldNames};
        let dir = tempfile::tempdir().unwrap();
        let mut v = view(dir.path(), "gid=5");
        // As on an SMB share (`ViewFs::new`), which this is not.
        v.names = HeldNames::new(std::time::Duration::from_secs(60));
        let name = OsStr::new;
        let d = v.mkdir(ROOT, name("d"), 0o755, ME).unwrap().ino;
        let absent = |dir, n| matches!(v.lookup(dir, name(n)), Err(FsError::Absent(_)));
        assert!(absent(d, "x"), "a directory the view made holds no names");
        assert_eq!(FsError::Absent(Default::default()).errno(), libc::ENOENT);
        // Whatever the view makes there, however, is held.
        let excl = libc::O_EXCL | libc::O_RDWR;
        v.create(d, name("x"), 0o100644, excl, ME, Existing::Kernel)
            .unwrap();
        v.mkdir(d, name("sub"), 0o755, ME).unwrap();
        v.symlink(d, name("l"), name("x"), ME).unwrap();
        v.mknod(d, name("p"), libc::S_IFIFO | 0o644, ME).unwrap();
        let f = v
            .create(ROOT, name("f"), 0o100644, excl, ME, Existing::Kernel)
            .unwrap()
            .attr
            .ino;
        v.link(f, d, name("hard")).unwrap();
        v.rename(ROOT, name("f"), d, name("moved"), 0).unwrap();
        for n in ["x", "sub", "l", "p", "hard", "moved", "X", "Moved"] {
            assert!(!absent(d, n), "{n}");
        }
        assert!(v.lookup(d, name("x")).is_ok());
        // A name made around the view stays unseen until the timeout, or until a
        // listing the view hands out shows it.
        std::fs::write(dir.path().join("d/around"), "").unwrap();
        assert!(absent(d, "around"));
        let fh = v.opendir(d).unwrap();
        let mut listed = Vec::new();
        v.readdir(d, fh, 0, Listing::Names, Room::UNBOUNDED, |item, _| {
            listed.push(item.name.clone());
            false
        })
        .unwrap();
        v.release(fh);
        assert!(listed.iter().any(|n| n == b"around"), "{listed:?}");
        assert!(!absent(d, "around"), "a listing showed it");
        // A directory the view did not make is listed after a few lookups the disk
        // answered.
        std::fs::create_dir(dir.path().join("e")).unwrap();
        std::fs::write(dir.path().join("e/a"), "").unwrap();
        let e = v.lookup(ROOT, name("e")).unwrap().ino;
        for i in 0..FIRST_LISTING_MISSES {
            assert_eq!(
                v.lookup(e, name(&format!("m{i}"))).err(),
                Some(FsError::Os(Errno::ENOENT))
            );
        }
        assert!(absent(e, "m"));
        assert!(v.lookup(e, name("a")).is_ok());
        assert!(!absent(ROOT, "m"), "the root was not listed");
    }
}
