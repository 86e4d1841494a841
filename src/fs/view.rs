//! Presentation policy: from what is on disk (and the ownership record) to what the pod
//! sees, and from a chown/chmod/create to the record that remembers it. Pure functions,
//! no I/O; docs/SEMANTICS.md is their prose form.

use crate::config::{Ownership, ViewMode, ViewOptions};
use crate::sys::file::Kind;

use super::record::{GroupRef, Record};

use crate::sys::process::{CAP_FSETID, TaskCredentials};

const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;
const WRITE_BITS: u32 = 0o222;

/// The groups a native presentation swaps: the volume's own group on disk, shown as
/// the pod's, and the pod's shown as the volume's (an idmapping is one to one). Every
/// other ID is itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GidSwap(Option<(u32, u32)>);

impl GidSwap {
    /// `disk` (the volume's group) shown as `shown` (the pod's fsGroup).
    pub fn new(disk: u32, shown: u32) -> GidSwap {
        GidSwap((disk != shown).then_some((disk, shown)))
    }

    /// The gid a view shows for an on-disk `gid`.
    pub fn shown(self, gid: u32) -> u32 {
        match self.0 {
            Some((d, s)) if gid == d => s,
            Some((d, s)) if gid == s => d,
            _ => gid,
        }
    }

    /// The on-disk gid of a gid a caller names (a chgrp, a creator's group): the swap is
    /// its own inverse.
    pub fn disk(self, gid: u32) -> u32 {
        self.shown(gid)
    }
}

/// How one view presents ownership.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// The view shows and changes the disk, POSIX-faithfully: without a group (`plain`),
    /// or with the volume's own group shown as the pod's (`mode=native`: what a native
    /// view, an idmapped bind mount, shows). `twin`: the native twin (`mode=native`),
    /// which never puts a set-id bit on disk, whether or not a group is swapped.
    Plain { gids: GidSwap, twin: bool },
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
        let emulate = o.ownership != Ownership::Off;
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
            (ViewMode::FsGroup, None) => Policy::Plain {
                gids: GidSwap::default(),
                twin: false,
            },
            (ViewMode::Native, group) => Policy::Plain {
                gids: match (o.disk_group, group) {
                    (Some(d), Some(g)) => GidSwap::new(d, g.get()),
                    _ => GidSwap::default(),
                },
                twin: true,
            },
        }
    }

    /// Whether presenting an entry of this kind needs its ownership record.
    pub fn reads_record(&self, kind: Kind) -> bool {
        match *self {
            Policy::Plain { .. } => false,
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
        matches!(self, Policy::Plain { .. })
    }

    /// The mode a new backing object is created with. Group views create files as the
    /// daemon (root), so set-id bits are never put on disk: a setuid-root file in a
    /// share would be a way out of the pod on any host that mounts the share.
    ///
    /// The native twin (`mode=native`) makes files without set-id bits too, and
    /// refuses to chmod them on ([`Policy::refuses_set_id`]): it serves where a native
    /// mount may not, which includes a share whose own mount honours set-id bits.
    /// Directories keep setgid: it is what gives a new entry the volume's group. This
    /// holds with or without a pod group (`gid=` absent, or the volume's own group):
    /// what the twin puts on disk never depends on the request.
    pub fn disk_create_perm(&self, kind: Kind, requested: u32) -> u32 {
        match self {
            Policy::Plain { twin: true, .. } if kind != Kind::Directory => requested & 0o1777,
            Policy::Plain { twin: true, .. } => requested & 0o3777,
            Policy::Plain { .. } => requested & 0o7777,
            // The daemon keeps reading and writing what it makes: what the pod sees is
            // the view's (records, or CIFS's fixed modes), and on a network share the
            // daemon is not root to the server (root_squash) or the server keeps a
            // read-only attribute (SMB), while the kernel opens the backing file again
            // with the daemon's credentials for passthrough (fs/fuse/passthrough.c
            // `fuse_passthrough_open`: `backing_file_open` with the backing's `cred`
            // from registration): a file created 0444 could not be opened for the
            // write its creator asked for, and the open answered EIO.
            Policy::FsGroup { .. } | Policy::Cifs { .. } => {
                let own = if kind == Kind::Directory {
                    0o700
                } else {
                    0o600
                };
                (requested | own) & 0o1777 & !0o6000
            }
        }
    }

    /// Whether a chmod to `perm` of an entry of `kind` is refused (`EPERM`): a set-id bit
    /// on anything but a directory's setgid, in the native twin.
    pub fn refuses_set_id(&self, kind: Kind, perm: u32) -> bool {
        let set_id = if kind == Kind::Directory {
            perm & 0o4000
        } else {
            perm & 0o6000
        };
        matches!(self, Policy::Plain { twin: true, .. }) && set_id != 0
    }

    /// The group the view presents, if any.
    pub fn group(&self) -> Option<u32> {
        match *self {
            Policy::Plain { gids, .. } => gids.0.map(|(_, shown)| shown),
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
        Policy::Plain { gids, .. } => Owner {
            gid: gids.shown(disk.gid),
            ..disk
        },
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

/// The maker of a new entry, as the kernel reports it with a creation request (MKNOD,
/// MKDIR, SYMLINK, CREATE; fs/fuse/dir.c `fuse_simple_idmap_request`): its file-system
/// uid and gid, which on an idmapped mount the kernel has already mapped through the
/// mount's idmapping into the view's own IDs (fs/fuse/dev.c `fuse_fill_creds`). They
/// are the owner and group a new entry gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Creator {
    pub uid: u32,
    pub gid: u32,
    /// The calling thread, in the daemon's pid namespace (0 when it is not visible
    /// there).
    pub pid: u32,
}

/// The caller of any other operation: only its thread. A view that declares
/// `FUSE_ALLOW_IDMAP` (so that a container runtime can idmap it) is sent no uid or gid
/// with these requests (`FUSE_INVALID_UIDGID`), on every mount of its connection,
/// idmapped or not; the pid is still sent. So whatever the daemon decides about such a
/// caller it learns from the thread itself ([`crate::sys::process::task_credentials`]),
/// or it leaves the decision to the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The calling thread, in the daemon's pid namespace (0 when it is not visible
    /// there: nothing is known of it, and every decision about it fails closed).
    pub pid: u32,
}

impl From<Creator> for Caller {
    fn from(c: Creator) -> Caller {
        Caller { pid: c.pid }
    }
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

/// Whether `creator` may open an entry shown as `shown` for `want`: the kernel's
/// `generic_permission` on the presented attributes, without ACLs (views offer none).
/// The owner class decides for the owner, the group class for a member of the group
/// (`in_group` asks about supplementary groups, only when needed), "other" for the
/// rest; uid 0 may do anything, as with `CAP_DAC_OVERRIDE`.
pub fn may_open(
    shown: Owner,
    creator: Creator,
    want: Want,
    in_group: impl FnOnce(u32) -> bool,
) -> bool {
    if creator.uid == 0 {
        return true;
    }
    let bits = if shown.uid == creator.uid {
        shown.perm >> 6
    } else if shown.gid == creator.gid || in_group(shown.gid) {
        shown.perm >> 3
    } else {
        shown.perm
    } & 0o7;
    (!want.read || bits & 0o4 != 0) && (!want.write || bits & 0o2 != 0)
}

/// The set-id bits a write by a caller with credentials `caller` (read only when the
/// file has such bits; `None`: nothing is known of the caller) drops from a file shown
/// as `shown`, by Linux's rule (fs/attr.c `setattr_should_drop_suidgid`): none for a
/// caller with `CAP_FSETID` in the initial user namespace (`capable()`); else setuid
/// always, and setgid where group execute is set, or where the caller is neither in
/// the file's group nor privileged over the file in its own user namespace
/// (`in_group_or_capable`). An unknown caller counts as neither: it drops both.
///
/// The caller's groups are compared in its own user namespace's IDs, which are the
/// mount's for every mount a container runtime makes (it idmaps a container's volumes
/// with the container's own namespace) and for the node's own mounts
/// (docs/SEMANTICS.md, *Pods in user namespaces*).
pub fn set_id_bits_a_write_drops(
    shown: Owner,
    caller: impl FnOnce() -> Option<TaskCredentials>,
) -> u32 {
    let (suid, sgid) = (shown.perm & S_ISUID, shown.perm & S_ISGID);
    if suid | sgid == 0 {
        return 0;
    }
    let Some(c) = caller() else {
        return suid | sgid;
    };
    if c.capable(CAP_FSETID) {
        return 0;
    }
    let privileged_over = |o: Owner| {
        c.has_cap(CAP_FSETID) && c.uid_map.maps_inside(o.uid) && c.gid_map.maps_inside(o.gid)
    };
    if sgid != 0 && (shown.perm & 0o010 != 0 || !(c.in_group(shown.gid) || privileged_over(shown)))
    {
        suid | sgid
    } else {
        suid
    }
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
    caller: Creator,
    parent: Owner,
    kind: Kind,
    requested: u32,
) -> Option<Record> {
    match *policy {
        Policy::Plain { .. }
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
        Policy::Plain { .. }
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

    /// The id an idmapping (`/proc/PID/gid_map` lines, `inside outside count`) maps
    /// `id` to, each way: an idmapped mount shows the disk's `outside` id as `inside`,
    /// and writes a caller's `inside` id as `outside` (`from_kgid`/`make_kgid` in the
    /// mount's user namespace). Every id must be in exactly one extent.
    fn through(map: &str, id: u32, to_disk: bool) -> u32 {
        let hits: Vec<u64> = map
            .lines()
            .filter_map(|l| {
                let v: Vec<u64> = l.split(' ').map(|n| n.parse().unwrap()).collect();
                let (from, to) = if to_disk { (v[0], v[1]) } else { (v[1], v[0]) };
                let id = u64::from(id);
                (from..from + v[2]).contains(&id).then(|| to + id - from)
            })
            .collect();
        assert_eq!(hits.len(), 1, "{id} in {map:?}");
        u32::try_from(hits[0]).unwrap()
    }

    proptest::proptest! {
        /// The FUSE twin's group swap is the idmapping a native view installs: both
        /// show a volume the same way, whatever the groups.
        #[test]
        fn the_twins_swap_is_the_native_views_idmapping(
            disk in proptest::prop_oneof![0u32..8, 4_000_000_000u32..u32::MAX, 0..u32::MAX],
            shown in proptest::prop_oneof![0u32..8, 4_000_000_000u32..u32::MAX, 0..u32::MAX],
            other in 0..u32::MAX,
        ) {
            let map = crate::sys::process::swap_map(disk, shown);
            let swap = GidSwap::new(disk, shown);
            for gid in [disk, shown, other, 0, u32::MAX - 1, disk.saturating_add(1).min(u32::MAX - 1), shown.saturating_sub(1)] {
                proptest::prop_assert_eq!(swap.shown(gid), through(&map, gid, false), "shown {}", gid);
                proptest::prop_assert_eq!(swap.disk(gid), through(&map, gid, true), "disk {}", gid);
            }
        }
    }
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
                Policy::Plain {
                    gids: GidSwap::default(),
                    twin: false,
                },
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
        let caller = Creator {
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
            new_entry_record(
                &Policy::Plain {
                    gids: GidSwap::default(),
                    twin: false,
                },
                caller,
                parent,
                Kind::Regular,
                0o644
            ),
            None
        );
    }

    #[test]
    fn new_entries_in_cifs() {
        let caller = Creator {
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
    fn the_native_presentation_swaps_the_volume_group_for_the_pods() {
        let twin = Policy::Plain {
            gids: GidSwap::new(2_000_000_000, G),
            twin: true,
        };
        let disk = |gid, perm| own(1000, gid, perm);
        // The volume's group shows as the pod's; owners and modes are the disk's.
        assert_eq!(
            present(&twin, Kind::Regular, disk(2_000_000_000, 0o640), None),
            own(1000, G, 0o640)
        );
        assert_eq!(
            present(&twin, Kind::Directory, disk(2_000_000_000, 0o2750), None),
            own(1000, G, 0o2750)
        );
        // One to one: the pod's own gid on disk shows as the volume's; others as they are.
        assert_eq!(
            present(&twin, Kind::Regular, disk(G, 0o600), None).gid,
            2_000_000_000
        );
        assert_eq!(
            present(&twin, Kind::Regular, disk(999, 0o700), None),
            own(1000, 999, 0o700)
        );
        let swap = GidSwap::new(2_000_000_000, G);
        assert_eq!((swap.disk(G), swap.disk(5)), (2_000_000_000, 5));
        assert_eq!(GidSwap::new(7, 7).shown(7), 7);
        assert_eq!(twin.group(), Some(G));
    }

    #[test]
    fn a_write_drops_set_id_bits_where_linux_does() {
        use crate::sys::process::{IdMap, TaskCredentials};
        let file = |uid, perm| Owner {
            uid,
            gid: 4242,
            perm,
        };
        let all_caps = u64::MAX >> 23;
        // A task of the node (the initial user namespace), and one of a pod whose user
        // namespace maps 0-65535 onto 131072-196607, as kubelet gives a pod.
        let host = |caps, fsgid, groups: &[u32]| TaskCredentials {
            effective_caps: caps,
            in_initial_user_ns: true,
            fsgid,
            groups: groups.to_vec(),
            uid_map: IdMap::identity(),
            gid_map: IdMap::identity(),
        };
        let pod_map = IdMap::parse("0 131072 65536\n").unwrap();
        let pod = |caps, fsgid, groups: &[u32]| TaskCredentials {
            effective_caps: caps,
            in_initial_user_ns: false,
            fsgid,
            groups: groups.to_vec(),
            uid_map: pod_map.clone(),
            gid_map: pod_map.clone(),
        };
        // (what, shown, caller, dropped)
        let cases = [
            (
                "generic/683-685: 6666 -> 0666",
                file(1000, 0o6666),
                host(0, 2000, &[]),
                0o6000,
            ),
            (
                "a member keeps setgid",
                file(1000, 0o6666),
                host(0, 2000, &[4242]),
                0o4000,
            ),
            (
                "its fsgid is the file's",
                file(1000, 0o6666),
                host(0, 4242, &[]),
                0o4000,
            ),
            (
                "group execute: always",
                file(1000, 0o6676),
                host(0, 4242, &[]),
                0o6000,
            ),
            (
                "setgid alone",
                file(1000, 0o2666),
                host(0, 2000, &[]),
                0o2000,
            ),
            ("no set-id bits", file(1000, 0o0666), host(0, 2000, &[]), 0),
            ("CAP_FSETID", file(1000, 0o6777), host(all_caps, 0, &[]), 0),
            // In a pod: its groups count as the pod sees them (host 135314 is its 4242).
            (
                "pod member",
                file(1000, 0o6666),
                pod(0, 132072, &[135314]),
                0o4000,
            ),
            (
                "host gid 4242 is not the pod's",
                file(1000, 0o6666),
                pod(0, 132072, &[4242]),
                0o6000,
            ),
            // A pod's root has every capability, but in its own namespace only: not
            // CAP_FSETID for capable(), yet privileged over a file whose owner and group
            // its namespace maps (capable_wrt_inode_uidgid), so setgid alone stays.
            (
                "pod root",
                file(1000, 0o6666),
                pod(all_caps, 131072, &[]),
                0o4000,
            ),
            (
                "pod root, group execute",
                file(1000, 0o6676),
                pod(all_caps, 131072, &[]),
                0o6000,
            ),
            (
                "pod root, owner unmapped",
                file(70000, 0o6666),
                pod(all_caps, 131072, &[]),
                0o6000,
            ),
        ];
        for (what, shown, caller, want) in cases {
            let got = set_id_bits_a_write_drops(shown, || Some(caller.clone()));
            assert_eq!(got, want, "{what}: {:o}", shown.perm);
        }
        // Nothing known of the caller (another pid namespace): both drop; and nothing is
        // read for a file without set-id bits.
        assert_eq!(
            set_id_bits_a_write_drops(file(1000, 0o6666), || None),
            0o6000
        );
        assert_eq!(
            set_id_bits_a_write_drops(file(1000, 0o0777), || panic!("read without need")),
            0
        );
    }

    #[test]
    fn disk_modes_never_carry_set_id_bits_in_group_views() {
        assert_eq!(
            fsgroup(false).disk_create_perm(Kind::Regular, 0o4755),
            0o755
        );
        assert_eq!(cifs().disk_create_perm(Kind::Regular, 0o2775), 0o775);
        // What the daemon makes stays its own to read and write, whatever the caller
        // asked (a read-only file on a root-squashed or SMB share).
        assert_eq!(cifs().disk_create_perm(Kind::Regular, 0o444), 0o644);
        assert_eq!(fsgroup(false).disk_create_perm(Kind::Regular, 0o040), 0o640);
        assert_eq!(
            fsgroup(false).disk_create_perm(Kind::Directory, 0o555),
            0o755
        );
        assert_eq!(
            fsgroup(false).disk_create_perm(Kind::Regular, 0o1777),
            0o1777
        );
        assert_eq!(
            Policy::Plain {
                gids: GidSwap::default(),
                twin: false,
            }
            .disk_create_perm(Kind::Regular, 0o4755),
            0o4755
        );
        let twin = Policy::Plain {
            gids: GidSwap::new(2_000_000_000, G),
            twin: true,
        };
        assert_eq!(twin.disk_create_perm(Kind::Regular, 0o6755), 0o755);
        assert_eq!(twin.disk_create_perm(Kind::Directory, 0o2775), 0o2775);
        assert!(twin.refuses_set_id(Kind::Regular, 0o2755));
        assert!(!twin.refuses_set_id(Kind::Directory, 0o2775));
        assert!(twin.refuses_set_id(Kind::Directory, 0o4775));
        // The twin of a publish without fsGroup (no `gid=`, or the volume's own
        // group): nothing is swapped, and still no set-id bit reaches the disk.
        for gid in ["", ",gid=2000000000"] {
            let o = ViewOptions::parse(&format!("mode=native,disk_gid=2000000000{gid}")).unwrap();
            let unswapped = Policy::from_options(&o);
            assert_eq!(unswapped.group(), None, "{gid}");
            assert_eq!(unswapped.disk_create_perm(Kind::Regular, 0o6755), 0o755);
            assert_eq!(unswapped.disk_create_perm(Kind::Directory, 0o6775), 0o2775);
            assert!(unswapped.refuses_set_id(Kind::Regular, 0o4755), "{gid}");
            assert!(unswapped.refuses_set_id(Kind::Regular, 0o2755), "{gid}");
            assert!(!unswapped.refuses_set_id(Kind::Directory, 0o2775), "{gid}");
        }
        assert!(
            !Policy::Plain {
                gids: GidSwap::default(),
                twin: false,
            }
            .refuses_set_id(Kind::Regular, 0o4755)
        );
    }

    #[test]
    fn may_open_follows_the_presented_classes() {
        let caller = Creator {
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
            Creator { uid: 0, ..caller },
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
