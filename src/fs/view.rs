//! Presentation policy: from what is on disk (and the ownership record) to what the pod
//! sees, and from a chown/chmod/create to the record that remembers it. Pure functions,
//! no I/O; docs/SEMANTICS.md is their prose form.

use crate::config::{Ownership, ViewMode, ViewOptions};
use crate::sys::file::Kind;

use super::record::{GroupRef, Record};

const S_ISGID: u32 = 0o2000;
const WRITE_BITS: u32 = 0o222;

/// How one view presents ownership.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// No group: the view shows and changes the disk, POSIX-faithfully.
    Plain,
    /// What kubelet's recursive chown to `group` would show, then POSIX.
    FsGroup {
        group: u32,
        readonly: bool,
        emulate: bool,
    },
    /// The Linux CIFS client without Unix extensions.
    Cifs {
        uid: u32,
        gid: u32,
        file_mode: u32,
        dir_mode: u32,
        emulate: bool,
    },
}

impl Policy {
    /// The policy a set of options selects.
    pub fn from_options(o: &ViewOptions) -> Policy {
        let emulate = o.ownership == Ownership::Emulate;
        match (o.mode, o.group) {
            (ViewMode::Cifs, group) => Policy::Cifs {
                uid: o.cifs.uid,
                gid: group.map_or(0, |g| g.get()),
                file_mode: o.cifs.file_mode,
                dir_mode: o.cifs.dir_mode,
                emulate,
            },
            (ViewMode::FsGroup, Some(g)) => Policy::FsGroup {
                group: g.get(),
                readonly: o.readonly,
                emulate,
            },
            (ViewMode::FsGroup, None) => Policy::Plain,
        }
    }

    /// Whether presenting an entry of this kind needs its ownership record.
    pub fn reads_record(&self, kind: Kind) -> bool {
        match *self {
            Policy::Plain => false,
            Policy::FsGroup { emulate, .. } => emulate,
            Policy::Cifs { emulate, .. } => emulate && kind == Kind::Regular,
        }
    }

    /// Whether the view reads and writes ownership records at all.
    pub fn keeps_records(&self) -> bool {
        matches!(
            self,
            Policy::FsGroup { emulate: true, .. } | Policy::Cifs { emulate: true, .. }
        )
    }

    /// Whether chown/chmod go to the disk itself.
    pub fn changes_disk(&self) -> bool {
        matches!(self, Policy::Plain)
    }

    /// The mode a new backing object is created with. Group views create files as the
    /// daemon (root), so set-id bits are never put on disk: a setuid-root file in a
    /// share would be a way out of the pod on any host that mounts the share.
    pub fn disk_create_perm(&self, requested: u32) -> u32 {
        match self {
            Policy::Plain => requested & 0o7777,
            Policy::FsGroup { .. } | Policy::Cifs { .. } => requested & 0o1777 & !0o6000,
        }
    }

    /// The group the view presents, if any.
    pub fn group(&self) -> Option<u32> {
        match *self {
            Policy::Plain => None,
            Policy::FsGroup { group, .. } => Some(group),
            Policy::Cifs { gid, .. } => Some(gid),
        }
    }
}

/// An owner and a mode: what stat shows of an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
    /// Permission, set-id and sticky bits.
    pub perm: u32,
}

/// What stat shows through the view, given the disk and the entry's record.
pub fn present(policy: &Policy, kind: Kind, disk: Owner, record: Option<&Record>) -> Owner {
    match *policy {
        Policy::Plain => disk,
        Policy::FsGroup {
            group, readonly, ..
        } => {
            let derived = match kind {
                Kind::Directory => disk.perm | if readonly { 0o550 } else { 0o770 } | S_ISGID,
                Kind::Symlink => 0o777,
                _ => disk.perm | if readonly { 0o440 } else { 0o660 },
            };
            let rec = record.copied().unwrap_or_default();
            Owner {
                uid: rec.uid.unwrap_or(disk.uid),
                gid: match rec.gid {
                    None | Some(GroupRef::MountGroup) => group,
                    Some(GroupRef::Gid(g)) => g,
                },
                perm: if kind == Kind::Symlink {
                    0o777
                } else {
                    rec.perm.unwrap_or(derived)
                },
            }
        }
        Policy::Cifs {
            uid,
            gid,
            file_mode,
            dir_mode,
            ..
        } => {
            let perm = match kind {
                Kind::Directory => dir_mode,
                Kind::Symlink => 0o777,
                Kind::Regular if record.is_some_and(|r| r.readonly) => file_mode & !WRITE_BITS,
                _ => file_mode,
            };
            Owner { uid, gid, perm }
        }
    }
}

/// The caller of an operation, as the kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// The calling thread, in the daemon's pid namespace (0 when it is not visible
    /// there): where its supplementary groups are read, which FUSE does not send.
    pub pid: u32,
}

/// The access an open asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Want {
    pub read: bool,
    pub write: bool,
}

impl Want {
    /// What `open(2)` flags ask for: `O_TRUNC` writes, whatever the access mode.
    pub fn of_open_flags(flags: i32) -> Want {
        let mode = flags & libc::O_ACCMODE;
        Want {
            read: mode == libc::O_RDONLY || mode == libc::O_RDWR,
            write: mode == libc::O_WRONLY || mode == libc::O_RDWR || flags & libc::O_TRUNC != 0,
        }
    }
}

/// Whether `caller` may open an entry shown as `shown` for `want`: the kernel's
/// `generic_permission` on the presented attributes, without ACLs (views offer none).
/// The owner class decides for the owner, the group class for a member of the group
/// (`in_group` asks about supplementary groups, only when needed), "other" for the
/// rest; uid 0 may do anything, as with `CAP_DAC_OVERRIDE`.
pub fn may_open(
    shown: Owner,
    caller: Caller,
    want: Want,
    in_group: impl FnOnce(u32) -> bool,
) -> bool {
    if caller.uid == 0 {
        return true;
    }
    let bits = if shown.uid == caller.uid {
        shown.perm >> 6
    } else if shown.gid == caller.gid || in_group(shown.gid) {
        shown.perm >> 3
    } else {
        shown.perm
    } & 0o7;
    (!want.read || bits & 0o4 != 0) && (!want.write || bits & 0o2 != 0)
}

/// The set-id bits a write by `caller` drops from a file shown as `shown`, by Linux's
/// rule (fs/attr.c `setattr_should_drop_suidgid`): setuid always; setgid where group
/// execute is set, or where the writer is not in the file's group (`in_group` asks
/// about supplementary groups, only when needed); none for uid 0 (`CAP_FSETID`).
pub fn set_id_bits_a_write_drops(
    shown: Owner,
    caller: Caller,
    in_group: impl FnOnce(u32) -> bool,
) -> u32 {
    if caller.uid == 0 {
        return 0;
    }
    let mut kill = shown.perm & 0o4000;
    if shown.perm & S_ISGID != 0
        && (shown.perm & 0o010 != 0 || !(shown.gid == caller.gid || in_group(shown.gid)))
    {
        kill |= S_ISGID;
    }
    kill
}

/// The mode a chown or chgrp leaves: on anything but a directory it clears setuid, and
/// setgid where group execute is set (setgid without it marks mandatory locking), for
/// root too, as Linux does (`ATTR_KILL_SUID`/`ATTR_KILL_SGID`).
pub fn perm_after_chown(kind: Kind, perm: u32) -> u32 {
    if kind == Kind::Directory {
        return perm;
    }
    let mut kept = perm & !0o4000;
    if perm & 0o010 != 0 {
        kept &= !S_ISGID;
    }
    kept
}

/// The record a new entry gets in a view that records ownership, or `None`.
///
/// fsgroup: owned by the caller; the group is inherited from a setgid parent (every
/// directory without a record presents setgid, as after kubelet's chown), otherwise
/// the caller's; the mode is what the caller asked for after its umask, a directory
/// inheriting setgid. cifs: only a new file created without write bits is recorded,
/// read-only, as the CIFS client does.
pub fn new_entry_record(
    policy: &Policy,
    caller: Caller,
    parent: Owner,
    kind: Kind,
    requested: u32,
) -> Option<Record> {
    match *policy {
        Policy::Plain
        | Policy::FsGroup { emulate: false, .. }
        | Policy::Cifs { emulate: false, .. } => None,
        Policy::FsGroup { group, .. } => {
            let inherit = parent.perm & S_ISGID != 0;
            let gid = if inherit { parent.gid } else { caller.gid };
            let mut perm = requested & 0o7777;
            if kind == Kind::Directory && inherit {
                perm |= S_ISGID;
            }
            if kind != Kind::Directory
                && perm & S_ISGID != 0
                && caller.uid != 0
                && caller.gid != gid
            {
                perm &= !S_ISGID;
            }
            Some(Record {
                uid: Some(caller.uid),
                gid: Some(group_ref(group, gid)),
                perm: (kind != Kind::Symlink).then_some(perm),
                readonly: false,
            })
        }
        Policy::Cifs { .. } => {
            (kind == Kind::Regular && requested & WRITE_BITS == 0).then_some(Record {
                readonly: true,
                ..Record::default()
            })
        }
    }
}

fn group_ref(mount_group: u32, gid: u32) -> GroupRef {
    if gid == mount_group {
        GroupRef::MountGroup
    } else {
        GroupRef::Gid(gid)
    }
}

/// A chown/chgrp/chmod as the kernel sends it (after its own permission checks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnerChange {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub perm: Option<u32>,
}

impl OwnerChange {
    pub fn is_empty(&self) -> bool {
        *self == OwnerChange::default()
    }
}

/// The record after a chown/chmod in a view that does not change the disk, or `None`
/// when nothing is to be stored (CIFS "success, no effect", or no change).
pub fn changed_record(
    policy: &Policy,
    kind: Kind,
    current: Option<Record>,
    change: OwnerChange,
) -> Option<Record> {
    match *policy {
        Policy::Plain
        | Policy::FsGroup { emulate: false, .. }
        | Policy::Cifs { emulate: false, .. } => None,
        Policy::FsGroup { group, .. } => {
            let mut r = current.unwrap_or_default();
            if let Some(u) = change.uid {
                r.uid = Some(u);
            }
            if let Some(g) = change.gid {
                r.gid = Some(group_ref(group, g));
            }
            if let Some(p) = change.perm {
                if kind != Kind::Symlink {
                    r.perm = Some(p & 0o7777);
                }
            }
            (Some(r) != current).then_some(r)
        }
        Policy::Cifs { .. } => {
            let p = change.perm?;
            if kind != Kind::Regular {
                return None;
            }
            let mut r = current.unwrap_or_default();
            r.readonly = p & WRITE_BITS == 0;
            (Some(r) != current && !(current.is_none() && r.is_empty())).then_some(r)
        }
    }
}

/// Whether a CIFS read-only file refuses to be opened for writing or truncated (as an
/// SMB server refuses it, for root too).
pub fn write_refused(policy: &Policy, kind: Kind, record: Option<&Record>) -> bool {
    matches!(policy, Policy::Cifs { .. })
        && kind == Kind::Regular
        && record.is_some_and(|r| r.readonly)
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u32 = 4242;
    fn fsgroup(readonly: bool) -> Policy {
        Policy::FsGroup {
            group: G,
            readonly,
            emulate: true,
        }
    }
    fn cifs() -> Policy {
        Policy::Cifs {
            uid: 0,
            gid: G,
            file_mode: 0o755,
            dir_mode: 0o755,
            emulate: true,
        }
    }
    fn own(uid: u32, gid: u32, perm: u32) -> Owner {
        Owner { uid, gid, perm }
    }

    #[test]
    fn presentation_table() {
        use Kind::*;
        let disk = own(1234, 1234, 0o644);
        let ddisk = own(1234, 1234, 0o755);
        let rec_chmod = Record {
            perm: Some(0o600),
            ..Default::default()
        };
        let rec_chgrp = Record {
            gid: Some(GroupRef::Gid(7)),
            ..Default::default()
        };
        let rec_mg = Record {
            uid: Some(1000),
            gid: Some(GroupRef::MountGroup),
            perm: Some(0o640),
            readonly: false,
        };
        let rec_ro = Record {
            readonly: true,
            ..Default::default()
        };
        #[rustfmt::skip]
        type Row = (&'static str, Policy, Kind, Owner, Option<Record>, Owner);
        let table: &[Row] = &[
            (
                "plain shows the disk",
                Policy::Plain,
                Regular,
                disk,
                Some(rec_chmod),
                disk,
            ),
            (
                "fsgroup file |0660",
                fsgroup(false),
                Regular,
                disk,
                None,
                own(1234, G, 0o664),
            ),
            (
                "fsgroup keeps exec bits",
                fsgroup(false),
                Regular,
                own(1, 1, 0o700),
                None,
                own(1, G, 0o760),
            ),
            (
                "fsgroup dir |0770|setgid",
                fsgroup(false),
                Directory,
                ddisk,
                None,
                own(1234, G, 0o2775),
            ),
            (
                "fsgroup ro file |0440",
                fsgroup(true),
                Regular,
                own(1, 1, 0o600),
                None,
                own(1, G, 0o640),
            ),
            (
                "fsgroup ro dir |0550|setgid",
                fsgroup(true),
                Directory,
                own(1, 1, 0o700),
                None,
                own(1, G, 0o2750),
            ),
            (
                "fsgroup symlink",
                fsgroup(false),
                Symlink,
                own(5, 5, 0o777),
                None,
                own(5, G, 0o777),
            ),
            (
                "fsgroup fifo like a file",
                fsgroup(false),
                Fifo,
                own(5, 5, 0o600),
                None,
                own(5, G, 0o660),
            ),
            (
                "record mode wins",
                fsgroup(false),
                Regular,
                disk,
                Some(rec_chmod),
                own(1234, G, 0o600),
            ),
            (
                "record fixed group",
                fsgroup(false),
                Regular,
                disk,
                Some(rec_chgrp),
                own(1234, 7, 0o664),
            ),
            (
                "record mount group follows view",
                fsgroup(false),
                Regular,
                disk,
                Some(rec_mg),
                own(1000, G, 0o640),
            ),
            (
                "other view, same record",
                Policy::FsGroup {
                    group: 99,
                    readonly: false,
                    emulate: true,
                },
                Regular,
                disk,
                Some(rec_mg),
                own(1000, 99, 0o640),
            ),
            ("cifs file", cifs(), Regular, disk, None, own(0, G, 0o755)),
            (
                "cifs dir",
                cifs(),
                Directory,
                own(3, 3, 0o700),
                None,
                own(0, G, 0o755),
            ),
            (
                "cifs read-only file",
                cifs(),
                Regular,
                disk,
                Some(rec_ro),
                own(0, G, 0o555),
            ),
            (
                "cifs ignores ownership in record",
                cifs(),
                Regular,
                disk,
                Some(rec_mg),
                own(0, G, 0o755),
            ),
            (
                "cifs read-only dir unaffected",
                cifs(),
                Directory,
                disk,
                Some(rec_ro),
                own(0, G, 0o755),
            ),
        ];
        for (name, policy, kind, disk, rec, want) in table {
            assert_eq!(present(policy, *kind, *disk, rec.as_ref()), *want, "{name}");
        }
    }

    #[test]
    fn new_entries_in_fsgroup() {
        let p = fsgroup(false);
        let parent = own(0, G, 0o2775);
        let caller = Caller {
            pid: 0,
            uid: 1000,
            gid: 1000,
        };
        let f = new_entry_record(&p, caller, parent, Kind::Regular, 0o644).unwrap();
        assert_eq!(
            f,
            Record {
                uid: Some(1000),
                gid: Some(GroupRef::MountGroup),
                perm: Some(0o644),
                readonly: false
            }
        );
        let d = new_entry_record(&p, caller, parent, Kind::Directory, 0o755).unwrap();
        assert_eq!(d.perm, Some(0o2755), "setgid inherited by subdirectories");
        // Not a member of the inherited group: setgid on a new file is dropped, as POSIX does.
        let f = new_entry_record(&p, caller, parent, Kind::Regular, 0o2755).unwrap();
        assert_eq!(f.perm, Some(0o755));
        // A parent without setgid: the caller's own group, recorded as fixed.
        let plain_parent = own(0, G, 0o755);
        let f = new_entry_record(&p, caller, plain_parent, Kind::Regular, 0o600).unwrap();
        assert_eq!(f.gid, Some(GroupRef::Gid(1000)));
        let s = new_entry_record(&p, caller, parent, Kind::Symlink, 0o777).unwrap();
        assert_eq!(s.perm, None);
        assert_eq!(
            new_entry_record(
                &Policy::FsGroup {
                    group: G,
                    readonly: false,
                    emulate: false
                },
                caller,
                parent,
                Kind::Regular,
                0o644
            ),
            None
        );
        assert_eq!(
            new_entry_record(&Policy::Plain, caller, parent, Kind::Regular, 0o644),
            None
        );
    }

    #[test]
    fn new_entries_in_cifs() {
        let caller = Caller {
            pid: 0,
            uid: 1000,
            gid: 1000,
        };
        let parent = own(0, G, 0o755);
        assert_eq!(
            new_entry_record(&cifs(), caller, parent, Kind::Regular, 0o644),
            None
        );
        assert_eq!(
            new_entry_record(&cifs(), caller, parent, Kind::Regular, 0o444),
            Some(Record {
                readonly: true,
                ..Default::default()
            })
        );
        assert_eq!(
            new_entry_record(&cifs(), caller, parent, Kind::Directory, 0o555),
            None
        );
    }

    #[test]
    fn changes_in_fsgroup() {
        let p = fsgroup(false);
        let chmod = OwnerChange {
            perm: Some(0o100600),
            ..Default::default()
        };
        assert_eq!(
            changed_record(&p, Kind::Regular, None, chmod),
            Some(Record {
                perm: Some(0o600),
                ..Default::default()
            })
        );
        let chgrp_mount = OwnerChange {
            gid: Some(G),
            ..Default::default()
        };
        assert_eq!(
            changed_record(&p, Kind::Regular, None, chgrp_mount),
            Some(Record {
                gid: Some(GroupRef::MountGroup),
                ..Default::default()
            })
        );
        let chown = OwnerChange {
            uid: Some(5),
            gid: Some(6),
            ..Default::default()
        };
        let r = changed_record(
            &p,
            Kind::Regular,
            Some(Record {
                perm: Some(0o640),
                ..Default::default()
            }),
            chown,
        )
        .unwrap();
        assert_eq!(
            r,
            Record {
                uid: Some(5),
                gid: Some(GroupRef::Gid(6)),
                perm: Some(0o640),
                readonly: false
            }
        );
        // Repeating a change stores nothing new.
        assert_eq!(changed_record(&p, Kind::Regular, Some(r), chown), None);
        // ownership=off: success, no effect.
        assert_eq!(
            changed_record(
                &Policy::FsGroup {
                    group: G,
                    readonly: false,
                    emulate: false
                },
                Kind::Regular,
                None,
                chmod
            ),
            None
        );
    }

    #[test]
    fn changes_in_cifs() {
        let p = cifs();
        let a_w = OwnerChange {
            perm: Some(0o555),
            ..Default::default()
        };
        let u_w = OwnerChange {
            perm: Some(0o755),
            ..Default::default()
        };
        let ro = changed_record(&p, Kind::Regular, None, a_w).unwrap();
        assert!(ro.readonly);
        assert_eq!(
            changed_record(&p, Kind::Regular, Some(ro), a_w),
            None,
            "already read-only"
        );
        assert_eq!(
            changed_record(&p, Kind::Regular, Some(ro), u_w),
            Some(Record::default())
        );
        assert_eq!(
            changed_record(&p, Kind::Regular, None, u_w),
            None,
            "no record needed"
        );
        assert_eq!(
            changed_record(&p, Kind::Directory, None, a_w),
            None,
            "directories ignore it"
        );
        let chown = OwnerChange {
            uid: Some(5),
            ..Default::default()
        };
        assert_eq!(
            changed_record(&p, Kind::Regular, None, chown),
            None,
            "chown: success, no effect"
        );
        assert!(write_refused(&p, Kind::Regular, Some(&ro)));
        assert!(!write_refused(&fsgroup(false), Kind::Regular, Some(&ro)));
    }

    #[test]
    fn a_write_drops_setgid_where_linux_does() {
        let file = |perm| Owner {
            uid: 1000,
            gid: 4242,
            perm,
        };
        let caller = |uid, gid| Caller { uid, gid, pid: 0 };
        let member = |g: u32| g == 4242;
        let stranger = |_: u32| false;
        // (shown, caller, in a supplementary group?, dropped)
        let cases = [
            (0o6666, caller(2000, 2000), false, 0o6000), // generic/683-685: 6666 -> 0666
            (0o6666, caller(2000, 2000), true, 0o4000),  // a member keeps setgid
            (0o6666, caller(2000, 4242), false, 0o4000), // primary group is the file's
            (0o6676, caller(2000, 4242), false, 0o6000), // group execute: always
            (0o2666, caller(2000, 2000), false, 0o2000),
            (0o0666, caller(2000, 2000), false, 0),
            (0o6777, caller(0, 0), false, 0), // CAP_FSETID
        ];
        for (perm, c, supplementary, want) in cases {
            let got = set_id_bits_a_write_drops(file(perm), c, |g| {
                if supplementary {
                    member(g)
                } else {
                    stranger(g)
                }
            });
            assert_eq!(got, want, "{perm:o} written by {c:?}");
        }
    }

    #[test]
    fn disk_modes_never_carry_set_id_bits_in_group_views() {
        assert_eq!(fsgroup(false).disk_create_perm(0o4755), 0o755);
        assert_eq!(cifs().disk_create_perm(0o2775), 0o775);
        assert_eq!(fsgroup(false).disk_create_perm(0o1777), 0o1777);
        assert_eq!(Policy::Plain.disk_create_perm(0o4755), 0o4755);
    }

    #[test]
    fn may_open_follows_the_presented_classes() {
        let caller = Caller {
            uid: 1000,
            gid: 1000,
            pid: 0,
        };
        let rw = Want {
            read: true,
            write: true,
        };
        let ro = Want {
            read: true,
            write: false,
        };
        let never = |_| panic!("supplementary groups asked for without need");
        let no = |_| false;
        let yes = |g| g == G;
        // Another user's 0600 file: nobody but its owner and root.
        assert!(!may_open(own(3000, G, 0o600), caller, ro, yes));
        assert!(may_open(own(1000, G, 0o600), caller, rw, never));
        assert!(may_open(
            own(3000, G, 0o600),
            Caller { uid: 0, ..caller },
            rw,
            never
        ));
        // The owner class decides for the owner, even where the group would grant.
        assert!(!may_open(own(1000, 1000, 0o460), caller, rw, never));
        // Supplementary groups count; without them the check fails closed.
        assert!(may_open(own(3000, G, 0o660), caller, rw, yes));
        assert!(!may_open(own(3000, G, 0o660), caller, rw, no));
        assert!(may_open(own(3000, 1000, 0o640), caller, ro, never));
        assert!(!may_open(own(3000, 1000, 0o640), caller, rw, never));
        assert!(may_open(own(3000, 7, 0o604), caller, ro, no));
        assert_eq!(Want::of_open_flags(libc::O_RDONLY | libc::O_TRUNC), rw);
        assert_eq!(
            Want::of_open_flags(libc::O_WRONLY),
            Want {
                read: false,
                write: true
            }
        );
    }

    #[test]
    fn chown_clears_set_id_bits_of_non_directories() {
        assert_eq!(perm_after_chown(Kind::Regular, 0o6555), 0o0555);
        assert_eq!(
            perm_after_chown(Kind::Regular, 0o6545),
            0o2545,
            "setgid without group x stays"
        );
        assert_eq!(perm_after_chown(Kind::Regular, 0o1755), 0o1755);
        assert_eq!(perm_after_chown(Kind::Directory, 0o6775), 0o6775);
    }
}
