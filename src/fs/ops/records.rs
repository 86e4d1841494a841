//! Ownership records: read (listed first where reads mostly find none), written,
//! and turned with the disk's attributes into what a pod sees.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::sys::file::{self, Kind, Stat};
use crate::sys::{Errno, xattr};

use super::super::error::{FsError, FsResult};
use super::super::inode::{Inode, RecordSeen};
use super::super::record::{self, Record};
use super::super::view::{self, Owner};
use super::ViewFs;
use super::{Attr, RECORDS_ABSENT_SPAN};

/// How the records read on this thread were looked for, for tests: `(listed first,
/// read first)`.
#[cfg(test)]
pub(super) mod record_reads {
    use std::cell::Cell;

    thread_local! {
        static COUNT: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
    }

    pub(super) fn note(listed: bool) {
        COUNT.with(|c| {
            let (l, r) = c.get();
            c.set(if listed { (l + 1, r) } else { (l, r + 1) });
        });
    }

    /// The counts so far, set back to zero.
    pub fn take() -> (usize, usize) {
        COUNT.with(|c| c.replace((0, 0)))
    }
}

impl ViewFs {
    /// The record of the entry `fd` of `kind`, where it can hold one.
    pub(super) fn read_record(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        kind: Kind,
    ) -> FsResult<Option<Record>> {
        if !record::holds(self.cfg.record_xattr, kind) {
            return Ok(None);
        }
        match xattr::get(fd, self.cfg.record_xattr) {
            Ok(None) => Ok(None),
            Ok(Some(bytes)) => match Record::decode(&bytes) {
                Ok(r) => Ok(Some(r)),
                Err(why) => {
                    if !self.warned.bad_record.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            why,
                            "an ownership record this version cannot read: the entry is shown with mode 0 until root sets its mode again"
                        );
                    }
                    // Fail closed: the record may have narrowed access (a chmod 600),
                    // and the derived attributes would widen it again.
                    Ok(Some(Record::unreadable()))
                }
            },
            // Some inode kinds on some file systems take no xattrs at all.
            Err(Errno::EOPNOTSUPP) => Ok(None),
            // A `user.` record needs read permission (fs/xattr.c), which a daemon that
            // the server squashes lacks on an entry made around the driver: the daemon
            // could never have written a record there either.
            Err(Errno::EACCES) if self.cfg.record_xattr == record::USER_RECORD_XATTR => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes (or, empty, removes) the record of the entry `fd` of `kind`.
    ///
    /// # Errors
    /// `EPERM` where the entry cannot hold a record (no `user.` attributes on a
    /// symlink; a daemon the server squashes, on an entry made around the driver),
    /// else what `setxattr` said.
    pub(super) fn write_record(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        kind: Kind,
        rec: &Record,
    ) -> FsResult<()> {
        if !record::holds(self.cfg.record_xattr, kind) {
            return Err(FsError::NotPermitted);
        }
        let done = if rec.is_empty() {
            match xattr::remove(fd, self.cfg.record_xattr) {
                Ok(()) | Err(Errno::ENODATA) => Ok(()),
                Err(e) => Err(e),
            }
        } else {
            xattr::set(fd, self.cfg.record_xattr, &rec.encode(), 0)
        };
        match done {
            Err(Errno::EACCES) => Err(FsError::NotPermitted),
            other => Ok(other?),
        }
    }

    pub(super) fn record_for(&self, inode: &Arc<Inode>) -> FsResult<Option<Record>> {
        if !self.cfg.policy.reads_record(inode.kind) {
            return Ok(None);
        }
        let fd = inode.fd()?;
        if !self.share.records_listed {
            return self.read_record(fd.as_fd(), inode.kind);
        }
        let seen = inode.record_seen.get();
        let list_first = match seen {
            RecordSeen::Absent => true,
            RecordSeen::Unread => self.share.records_absent.load(Ordering::Relaxed) > 0,
            RecordSeen::Present => false,
        };
        #[cfg(test)]
        record_reads::note(list_first);
        let rec = if list_first
            && record::holds(self.cfg.record_xattr, inode.kind)
            && xattr::has(fd.as_fd(), self.cfg.record_xattr) == Ok(false)
        {
            None
        } else {
            self.read_record(fd.as_fd(), inode.kind)?
        };
        if seen == RecordSeen::Unread {
            let step = if rec.is_none() { 1 } else { -1 };
            let _ =
                self.share
                    .records_absent
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                        Some((n + step).clamp(-RECORDS_ABSENT_SPAN, RECORDS_ABSENT_SPAN))
                    });
        }
        inode.record_seen.set(if rec.is_none() {
            RecordSeen::Absent
        } else {
            RecordSeen::Present
        });
        Ok(rec)
    }

    pub(super) fn attr(&self, inode: &Arc<Inode>, st: &Stat) -> FsResult<Attr> {
        let rec = self.record_for(inode)?;
        Ok(self.attr_with(inode, st, rec.as_ref()))
    }

    /// [`ViewFs::attr`] with the record already read.
    pub(super) fn attr_with(&self, inode: &Inode, st: &Stat, rec: Option<&Record>) -> Attr {
        let disk = Owner {
            uid: st.uid,
            gid: st.gid,
            perm: st.perm,
        };
        let shown = view::present(&self.cfg.policy, st.kind, disk, rec);
        Attr {
            ino: inode.id,
            kind: st.kind,
            size: st.size,
            blocks: st.blocks,
            blksize: st.blksize,
            nlink: st.nlink,
            uid: shown.uid,
            gid: shown.gid,
            perm: shown.perm,
            rdev: st.rdev,
            atime: st.atime,
            mtime: st.mtime,
            ctime: st.ctime,
            btime: st.btime.unwrap_or(st.ctime),
        }
    }

    pub(super) fn shown(&self, inode: &Arc<Inode>) -> FsResult<Owner> {
        let st = file::stat(inode.fd()?.as_fd())?;
        let a = self.attr(inode, &st)?;
        Ok(Owner {
            uid: a.uid,
            gid: a.gid,
            perm: a.perm,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::*;
    use super::*;
    use crate::fs::record::RECORD_XATTR;

    #[test]
    fn an_unreadable_record_fails_closed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), "x").unwrap();
        let v = view(dir.path(), "gid=5");
        let f = v.lookup(ROOT, OsStr::new("f")).unwrap().ino;
        assert_eq!(v.getattr(f).unwrap().perm, 0o664, "derived");
        let fd = std::fs::File::open(dir.path().join("f")).unwrap();
        xattr::set(fd.as_fd(), RECORD_XATTR, b"\x09garbage", 0).unwrap();
        assert_eq!(
            v.getattr(f).unwrap().perm,
            0,
            "a record from the future narrows"
        );
        // Root sets the mode again: a record this version reads.
        let a = v
            .setattr(
                f,
                None,
                SetAttr {
                    mode: Some(0o640),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(a.perm, 0o640);
    }

    /// On NFS a first read of an entry's `user.` record costs two server requests (the
    /// client asks the server whether the reader may read, then reads) where a list of
    /// the entry's names costs one and stays in the client's cache: a walk of a tree
    /// made around the driver asked twice what it needed. The view lists first while
    /// most first reads find no record, and reads first while most find one; either
    /// way each entry shows what its record says.
    #[test]
    fn first_reads_of_records_list_first_while_most_find_none() {
        let dir = tempfile::tempdir().unwrap();
        let around = dir.path().join("around");
        std::fs::create_dir(&around).unwrap();
        for i in 0..8 {
            std::fs::write(around.join(format!("f{i}")), "").unwrap();
        }
        let made = view(dir.path(), "gid=5,ownership=emulate-user");
        let m = made.mkdir(ROOT, OsStr::new("made"), 0o755, ME).unwrap();
        for i in 0..12 {
            let c = made
                .create(
                    m.ino,
                    OsStr::new(&format!("f{i}")),
                    0o100644,
                    libc::O_RDWR,
                    ME,
                    Existing::Kernel,
                )
                .unwrap();
            made.release(c.fh);
            let chmod = SetAttr {
                mode: Some(0o600),
                ..Default::default()
            };
            made.setattr(c.attr.ino, None, chmod).unwrap();
        }
        // A new view (on NFS), which has read no record yet.
        let mut v = view(dir.path(), "gid=5,ownership=emulate-user");
        v.share.records_listed = true;
        let dir_of = |name: &str| v.lookup(ROOT, OsStr::new(name)).unwrap().ino;
        let (around_ino, made_ino) = (dir_of("around"), dir_of("made"));
        record_reads::take();
        for i in 0..8 {
            let a = v.lookup(around_ino, OsStr::new(&format!("f{i}"))).unwrap();
            assert_ne!((a.uid, a.perm), (1000, 0o600), "no record");
        }
        assert_eq!(record_reads::take(), (7, 1), "(listed first, read first)");
        // Entries with records: listed first until they outweigh those without, and
        // shown as recorded either way.
        for i in 0..12 {
            let a = v.lookup(made_ino, OsStr::new(&format!("f{i}"))).unwrap();
            assert_eq!((a.uid, a.perm), (1000, 0o600), "f{i}");
        }
        assert_eq!(record_reads::take(), (8, 4));
        // An entry whose last read found none is listed first whatever the others.
        v.lookup(around_ino, OsStr::new("f0")).unwrap();
        v.lookup(made_ino, OsStr::new("f0")).unwrap();
        assert_eq!(record_reads::take(), (1, 1));
    }

    /// `ownership=emulate-user` (a share without `trusted.*`, as NFS 4.2): the creator's
    /// uid and a chmod are recorded in `user.mountgroup.owner`, never on the disk; a
    /// symlink, which takes no `user.*` attribute, shows the derived owner and refuses
    /// chown; no view, of either kind, lets a pod read or write either record name.
    #[test]
    fn records_in_user_xattrs_where_the_share_has_no_trusted_ones() {
        use crate::fs::record::{RECORD_XATTR, USER_RECORD_XATTR};
        let dir = tempfile::tempdir().unwrap();
        let v = view(dir.path(), "gid=5,ownership=emulate-user");
        let made = v
            .create(
                ROOT,
                OsStr::new("f"),
                0o100640,
                libc::O_RDWR,
                ME,
                Existing::Kernel,
            )
            .unwrap();
        v.release(made.fh);
        assert_eq!(
            (made.attr.uid, made.attr.gid, made.attr.perm),
            (1000, 5, 0o640)
        );
        let on_disk = |name: &str| {
            let root = file::open_root(dir.path()).unwrap();
            let fd = file::open_child(root.as_fd(), OsStr::new(name), None).unwrap();
            (
                xattr::get(fd.as_fd(), USER_RECORD_XATTR).unwrap().is_some(),
                xattr::get(fd.as_fd(), RECORD_XATTR).unwrap().is_some(),
                file::stat(fd.as_fd()).unwrap().perm,
            )
        };
        assert_eq!(on_disk("f"), (true, false, 0o640));
        let f = made.attr.ino;
        let chmod = SetAttr {
            mode: Some(0o600),
            ..Default::default()
        };
        assert_eq!(v.setattr(f, None, chmod).unwrap().perm, 0o600);
        assert_eq!(on_disk("f"), (true, false, 0o640), "the disk never changes");
        let d = v.mkdir(ROOT, OsStr::new("d"), 0o750, ME).unwrap();
        assert_eq!((d.uid, d.perm & 0o777), (1000, 0o750));
        assert!(on_disk("d").0);
        let l = v
            .symlink(ROOT, OsStr::new("l"), OsStr::new("f"), ME)
            .unwrap();
        let root_uid = file::stat(file::open_root(dir.path()).unwrap().as_fd())
            .unwrap()
            .uid;
        assert_eq!(l.uid, root_uid, "a symlink shows the disk's owner");
        let chown = SetAttr {
            uid: Some(1000),
            ..Default::default()
        };
        assert_eq!(v.setattr(l.ino, None, chown), Err(FsError::NotPermitted));
        // Neither record name is a pod's, in this view or a trusted-records one.
        let other = view(dir.path(), "gid=5");
        for v in [&v, &other] {
            let f = v.lookup(ROOT, OsStr::new("f")).unwrap().ino;
            for name in [
                "user.mountgroup.owner",
                "user.mountgroup.x",
                "trusted.mountgroup.owner",
            ] {
                let name = OsStr::new(name);
                assert_eq!(v.setxattr(f, name, b"\x01", 0), Err(FsError::NotPermitted));
                assert_eq!(v.getxattr(f, name, 0), Err(FsError::NoAttribute));
                assert_eq!(v.removexattr(f, name), Err(FsError::NoAttribute));
            }
            assert_eq!(v.listxattr(f, 0, ME.into()).unwrap(), XattrReply::Size(0));
        }
        assert_eq!(
            other
                .getattr(other.lookup(ROOT, OsStr::new("f")).unwrap().ino)
                .unwrap()
                .uid,
            root_uid,
            "a trusted-records view reads no user.* record"
        );
    }
}
