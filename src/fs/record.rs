//! The ownership record: what chown/chmod through an emulating view did to an entry.
//!
//! Stored in the extended attribute [`RECORD_XATTR`] of the backing inode, in the
//! `trusted.` namespace that only a root daemon can read or write, so the backing
//! file's own uid, gid and mode never change. On a share whose file system has no
//! `trusted.` namespace but a `user.` one (NFS 4.2, SMB with extended attributes), in
//! [`USER_RECORD_XATTR`] instead (`ownership=emulate-user`): only regular files and
//! directories take `user.` attributes, so other entries keep none. Both names are
//! hidden from, and untouchable through, every view, whichever one it keeps, so that no
//! pod forges the records of another view of the share.
//!
//! Format (version 1, 14 bytes): `[1][flags][uid u32 LE][gid u32 LE][perm u32 LE]`.
//! Fields whose flag is clear are derived by the view's rules, so an entry that was
//! only chowned keeps the derived mode, and a group recorded as "the mount group"
//! follows each view's own group: two pods with different fsGroups both see their
//! group on a file the other one created.

/// The xattr that holds the record.
pub const RECORD_XATTR: &std::ffi::CStr = c"trusted.mountgroup.owner";

/// The xattr that holds the record where the share has no `trusted.` namespace.
pub const USER_RECORD_XATTR: &std::ffi::CStr = c"user.mountgroup.owner";

/// The names written, and removed again, to learn whether a file system keeps
/// `trusted.` or `user.` records ([`crate::sys::xattr::probe`]).
pub const TRUSTED_PROBE_XATTR: &std::ffi::CStr = c"trusted.mountgroup.probe";
pub const USER_PROBE_XATTR: &std::ffi::CStr = c"user.mountgroup.probe";

/// The probe name of the namespace of `record` (a record xattr).
pub fn probe_xattr(record: &std::ffi::CStr) -> &'static std::ffi::CStr {
    if record.to_bytes().starts_with(b"user.") {
        USER_PROBE_XATTR
    } else {
        TRUSTED_PROBE_XATTR
    }
}

/// Every xattr name with one of these prefixes belongs to the daemon and is hidden
/// from views.
pub const RESERVED_PREFIXES: [&[u8]; 2] = [b"trusted.mountgroup.", b"user.mountgroup."];

/// The xattr a view keeps its records in, for its `ownership=` option; `None` where it
/// keeps none.
pub fn record_xattr(ownership: crate::config::Ownership) -> Option<&'static std::ffi::CStr> {
    use crate::config::Ownership;
    match ownership {
        Ownership::Emulate => Some(RECORD_XATTR),
        Ownership::EmulateUser => Some(USER_RECORD_XATTR),
        Ownership::Off | Ownership::Share => None,
    }
}

/// Whether an entry of `kind` can carry the record `xattr`: the kernel allows `user.`
/// attributes on regular files and directories only (`xattr_permission`, fs/xattr.c).
pub fn holds(xattr: &std::ffi::CStr, kind: crate::sys::file::Kind) -> bool {
    use crate::sys::file::Kind;
    !xattr.to_bytes().starts_with(b"user.") || matches!(kind, Kind::Regular | Kind::Directory)
}

const VERSION: u8 = 1;
const HAS_UID: u8 = 1;
const HAS_GID: u8 = 2;
const GID_IS_MOUNT_GROUP: u8 = 4;
const HAS_PERM: u8 = 8;
const READONLY: u8 = 16;
const KNOWN: u8 = HAS_UID | HAS_GID | GID_IS_MOUNT_GROUP | HAS_PERM | READONLY;
const LEN: usize = 14;

/// The group an entry belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupRef {
    /// Whatever group the viewing mount presents (the pod's fsGroup).
    MountGroup,
    /// A fixed group id, set by an explicit chgrp to another group.
    Gid(u32),
}

/// One entry's recorded ownership. `None` fields are derived by the view.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Record {
    pub uid: Option<u32>,
    pub gid: Option<GroupRef>,
    /// Permission, set-id and sticky bits.
    pub perm: Option<u32>,
    /// The CIFS read-only attribute (`mode=cifs`: a chmod that removed every write bit).
    pub readonly: bool,
}

impl Record {
    /// What an entry whose record cannot be read is shown with: mode 0 (CIFS: read-only),
    /// owner and group derived. Failing closed matters because a record may narrow
    /// access (a chmod 600 of a file the mount group could otherwise read); root can
    /// still chmod the entry, which writes a record this version reads.
    pub fn unreadable() -> Record {
        Record {
            uid: None,
            gid: None,
            perm: Some(0),
            readonly: true,
        }
    }

    /// Whether the record says nothing (and can be removed rather than stored).
    pub fn is_empty(&self) -> bool {
        *self == Record::default()
    }

    /// The stored form.
    pub fn encode(&self) -> [u8; LEN] {
        let mut flags = 0u8;
        let mut uid = 0u32;
        let mut gid = 0u32;
        let mut perm = 0u32;
        if let Some(u) = self.uid {
            flags |= HAS_UID;
            uid = u;
        }
        match self.gid {
            Some(GroupRef::MountGroup) => flags |= GID_IS_MOUNT_GROUP,
            Some(GroupRef::Gid(g)) => {
                flags |= HAS_GID;
                gid = g;
            }
            None => {}
        }
        if let Some(p) = self.perm {
            flags |= HAS_PERM;
            perm = p & 0o7777;
        }
        if self.readonly {
            flags |= READONLY;
        }
        let mut out = [0u8; LEN];
        out[0] = VERSION;
        out[1] = flags;
        out[2..6].copy_from_slice(&uid.to_le_bytes());
        out[6..10].copy_from_slice(&gid.to_le_bytes());
        out[10..14].copy_from_slice(&perm.to_le_bytes());
        out
    }

    /// Parses a stored record. Anything this version does not understand is refused
    /// (the caller then shows the entry as [`Record::unreadable`]).
    ///
    /// # Errors
    /// A description of what is wrong with the bytes.
    pub fn decode(bytes: &[u8]) -> Result<Record, &'static str> {
        if bytes.len() != LEN {
            return Err("wrong length");
        }
        if bytes[0] != VERSION {
            return Err("unknown version");
        }
        let flags = bytes[1];
        if flags & !KNOWN != 0 || (flags & HAS_GID != 0 && flags & GID_IS_MOUNT_GROUP != 0) {
            return Err("unknown flags");
        }
        let word =
            |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let gid = if flags & GID_IS_MOUNT_GROUP != 0 {
            Some(GroupRef::MountGroup)
        } else if flags & HAS_GID != 0 {
            Some(GroupRef::Gid(word(6)))
        } else {
            None
        };
        let perm = word(10);
        if perm & !0o7777 != 0 {
            return Err("mode out of range");
        }
        Ok(Record {
            uid: (flags & HAS_UID != 0).then(|| word(2)),
            gid,
            perm: (flags & HAS_PERM != 0).then_some(perm),
            readonly: flags & READONLY != 0,
        })
    }
}

/// Whether an xattr name belongs to the daemon (and so is hidden from views).
pub fn is_reserved(name: &[u8]) -> bool {
    RESERVED_PREFIXES.iter().any(|p| name.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let cases = [
            Record::default(),
            Record {
                uid: Some(1000),
                ..Default::default()
            },
            Record {
                gid: Some(GroupRef::MountGroup),
                perm: Some(0o2775),
                ..Default::default()
            },
            Record {
                uid: Some(0),
                gid: Some(GroupRef::Gid(u32::MAX - 1)),
                perm: Some(0o7777),
                readonly: true,
            },
        ];
        for r in cases {
            assert_eq!(Record::decode(&r.encode()), Ok(r));
        }
    }

    #[test]
    fn refuses_what_it_does_not_understand() {
        let good = Record {
            uid: Some(1),
            ..Default::default()
        }
        .encode();
        assert!(Record::decode(&good[..13]).is_err());
        let mut v2 = good;
        v2[0] = 2;
        assert_eq!(Record::decode(&v2), Err("unknown version"));
        let mut flags = good;
        flags[1] = 0x80;
        assert_eq!(Record::decode(&flags), Err("unknown flags"));
        let mut both = good;
        both[1] = HAS_GID | GID_IS_MOUNT_GROUP;
        assert_eq!(Record::decode(&both), Err("unknown flags"));
        let mut perm = Record {
            perm: Some(0o644),
            ..Default::default()
        }
        .encode();
        perm[11] = 0xff;
        assert_eq!(Record::decode(&perm), Err("mode out of range"));
    }

    #[test]
    fn reserved_names() {
        assert!(is_reserved(RECORD_XATTR.to_bytes()));
        assert!(is_reserved(b"trusted.mountgroup.anything"));
        assert!(!is_reserved(b"trusted.mountgroupx"));
        assert!(is_reserved(USER_RECORD_XATTR.to_bytes()));
        assert!(is_reserved(b"user.mountgroup.anything"));
        assert!(!is_reserved(b"user.mountgroupx"));
        assert!(!is_reserved(b"user.owner"));
    }
}
