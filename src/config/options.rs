//! Every view option, declared once ([`OPTIONS`]): the keys that set it, how its
//! value is parsed and printed, whether it is a VFS flag, and what a native view
//! makes of it.

use super::*;

/// How a native view (an idmapped bind mount, no process) treats an option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NativeUse {
    /// Tuning of a FUSE view's process: means nothing natively.
    Tuning,
    /// The native view's mount has it too (its group, `ro`, `noexec`, access times).
    Applied,
    /// Only a FUSE view gives it: any value but its default asks for one.
    FuseOnly,
    /// A presentation a bind mount cannot give (`context=`): a FUSE view with the
    /// native presentation serves it.
    NotByBindMount,
}

/// A view option, declared once: the keys that set it, how it is parsed and printed
/// (the canonical string, and a VFS flag's mount(8) name), and what a native view
/// makes of it. [`OPTIONS`] lists them in the order of the canonical string.
pub struct ViewOption {
    /// The keys that set it (`ro` and `rw` set one option).
    pub keys: &'static [&'static str],
    /// Applies `key` (one of `keys`) with its value, if any.
    pub(super) set: fn(&mut Parsing, &str, Option<&str>) -> Result<(), OptionError>,
    /// Its items in the canonical string (none where it is its default and the
    /// string has always left it out).
    pub(super) print: fn(&ViewOptions, &mut Vec<String>),
    /// A VFS mount flag: its printed items (but `rw`) are mount(8) flag names.
    pub vfs: bool,
    pub native: NativeUse,
}

/// `key`'s value, which it needs (`gid=` names no value, as `gid` does not).
pub(super) fn need<'v>(key: &str, v: Option<&'v str>) -> Result<&'v str, OptionError> {
    v.filter(|v| !v.is_empty())
        .ok_or_else(|| OptionError::MissingValue(key.to_string()))
}

/// `key` takes no value.
pub(super) fn flag(key: &str, v: Option<&str>) -> Result<(), OptionError> {
    match v {
        None => Ok(()),
        Some(_) => Err(OptionError::UnexpectedValue(key.to_string())),
    }
}

/// `key`'s value parsed by `parse` (whose error says why it is bad).
pub(super) fn value<T>(
    key: &str,
    v: Option<&str>,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<T, OptionError> {
    let v = need(key, v)?;
    parse(v).map_err(|reason| OptionError::Invalid {
        key: key.to_string(),
        value: v.to_string(),
        reason,
    })
}

/// The name of `t` among `choices` (each value has one).
pub(super) fn name_of<T: PartialEq>(t: &T, choices: &[(&'static str, T)]) -> &'static str {
    choices
        .iter()
        .find(|(_, c)| c == t)
        .map(|(n, _)| *n)
        .expect("every value has a name")
}

pub(super) const MODES: &[(&str, ViewMode)] = &[
    ("fsgroup", ViewMode::FsGroup),
    ("cifs", ViewMode::Cifs),
    ("native", ViewMode::Native),
];

pub(super) const OWNERSHIPS: &[(&str, Ownership)] = &[
    ("emulate", Ownership::Emulate),
    ("emulate-user", Ownership::EmulateUser),
    ("off", Ownership::Off),
    ("share", Ownership::Share),
];

pub(super) const PASSTHROUGHS: &[(&str, Passthrough)] = &[
    ("auto", Passthrough::Auto),
    ("on", Passthrough::On),
    ("off", Passthrough::Off),
];

pub(super) const DIRECT_IOS: &[(&str, DirectIo)] =
    &[("view", DirectIo::View), ("kernel", DirectIo::Kernel)];

pub(super) const TRANSPORTS: &[(&str, Transport)] =
    &[("dev", Transport::Dev), ("ring", Transport::Ring)];

/// A thread count from 1 to `most`.
pub(super) fn parse_thread_count(v: &str, most: usize) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n) if (1..=most).contains(&n) => Ok(n),
        _ => Err(format!("is not a thread count from 1 to {most}")),
    }
}

pub(super) fn parse_fsname(v: &str) -> Result<String, String> {
    if v.contains(['\\', ' ', '\t', '\n']) || v.len() > 255 {
        return Err(
            "is not a plain name (no spaces, backslashes or control characters, at most 255 bytes)"
                .into(),
        );
    }
    Ok(v.to_string())
}

/// A boolean VFS flag set by `on` and cleared by `off` (or only set, where `off` is
/// `""`), printed as `on` when set.
macro_rules! vfs_bool {
    ($on:literal, $off:literal, $field:ident, $native:expr) => {
        ViewOption {
            keys: if $off.is_empty() {
                &[$on]
            } else {
                &[$on, $off]
            },
            set: |p, k, v| {
                flag(k, v)?;
                p.o.vfs.$field = k == $on;
                Ok(())
            },
            print: |o, out| {
                if o.vfs.$field {
                    out.push($on.into());
                }
            },
            vfs: true,
            native: $native,
        }
    };
}

/// Every view option, in the order of the canonical string (which must stay as it is:
/// a takeover compares the strings recorded by older versions).
pub const OPTIONS: &[ViewOption] = &[
    ViewOption {
        keys: &["gid"],
        set: |p, k, v| {
            p.o.group = Some(value(k, v, MountGroup::parse)?);
            Ok(())
        },
        print: |o, out| out.extend(o.group.map(|g| format!("gid={g}"))),
        vfs: false,
        native: NativeUse::Applied,
    },
    ViewOption {
        keys: &["mode"],
        set: |p, k, v| {
            p.explicit_mode = Some(value(k, v, |v| one_of(v, MODES))?);
            Ok(())
        },
        print: |o, out| out.push(format!("mode={}", name_of(&o.mode, MODES))),
        vfs: false,
        native: NativeUse::FuseOnly,
    },
    ViewOption {
        keys: &["disk_gid"],
        set: |p, k, v| {
            p.o.disk_group = Some(value(k, v, parse_id)?);
            Ok(())
        },
        print: |o, out| {
            if o.mode == ViewMode::Native {
                out.extend(o.disk_group.map(|d| format!("disk_gid={d}")));
            }
        },
        vfs: false,
        native: NativeUse::FuseOnly,
    },
    ViewOption {
        keys: &["uid"],
        set: |p, k, v| {
            p.o.cifs.uid = value(k, v, parse_id)?;
            p.cifs_only.get_or_insert_with(|| k.to_string());
            Ok(())
        },
        print: |o, out| {
            if o.mode == ViewMode::Cifs {
                out.push(format!("uid={}", o.cifs.uid));
            }
        },
        vfs: false,
        native: NativeUse::FuseOnly,
    },
    ViewOption {
        keys: &["file_mode"],
        set: |p, k, v| {
            p.o.cifs.file_mode = value(k, v, parse_perm)?;
            p.cifs_only.get_or_insert_with(|| k.to_string());
            Ok(())
        },
        print: |o, out| {
            if o.mode == ViewMode::Cifs {
                out.push(format!("file_mode={:04o}", o.cifs.file_mode));
            }
        },
        vfs: false,
        native: NativeUse::FuseOnly,
    },
    ViewOption {
        keys: &["dir_mode"],
        set: |p, k, v| {
            p.o.cifs.dir_mode = value(k, v, parse_perm)?;
            p.cifs_only.get_or_insert_with(|| k.to_string());
            Ok(())
        },
        print: |o, out| {
            if o.mode == ViewMode::Cifs {
                out.push(format!("dir_mode={:04o}", o.cifs.dir_mode));
            }
        },
        vfs: false,
        native: NativeUse::FuseOnly,
    },
    ViewOption {
        keys: &["noperm"],
        set: |p, k, v| {
            flag(k, v)?;
            p.o.cifs.noperm = true;
            p.cifs_only.get_or_insert_with(|| k.to_string());
            Ok(())
        },
        print: |o, out| {
            if o.mode == ViewMode::Cifs && o.cifs.noperm {
                out.push("noperm".into());
            }
        },
        vfs: false,
        native: NativeUse::FuseOnly,
    },
    ViewOption {
        keys: &["ownership"],
        set: |p, k, v| {
            p.o.ownership = value(k, v, |v| one_of(v, OWNERSHIPS))?;
            Ok(())
        },
        print: |o, out| out.push(format!("ownership={}", name_of(&o.ownership, OWNERSHIPS))),
        vfs: false,
        native: NativeUse::FuseOnly,
    },
    ViewOption {
        keys: &["ro", "rw"],
        set: |p, k, v| {
            flag(k, v)?;
            p.o.readonly = k == "ro";
            Ok(())
        },
        print: |o, out| out.push(if o.readonly { "ro" } else { "rw" }.into()),
        vfs: true,
        native: NativeUse::Applied,
    },
    ViewOption {
        keys: &["noexec", "exec"],
        set: |p, k, v| {
            flag(k, v)?;
            p.o.noexec = k == "noexec";
            Ok(())
        },
        print: |o, out| {
            if o.noexec {
                out.push("noexec".into());
            }
        },
        vfs: true,
        native: NativeUse::Applied,
    },
    ViewOption {
        keys: &["passthrough"],
        set: |p, k, v| {
            p.o.passthrough = value(k, v, |v| one_of(v, PASSTHROUGHS))?;
            Ok(())
        },
        print: |o, out| {
            out.push(format!(
                "passthrough={}",
                name_of(&o.passthrough, PASSTHROUGHS)
            ));
        },
        vfs: false,
        native: NativeUse::Tuning,
    },
    ViewOption {
        keys: &["threads"],
        set: |p, k, v| {
            p.o.threads = value(k, v, |v| parse_thread_count(v, 64))?;
            Ok(())
        },
        print: |o, out| out.push(format!("threads={}", o.threads)),
        vfs: false,
        native: NativeUse::Tuning,
    },
    ViewOption {
        keys: &["max_threads"],
        set: |p, k, v| {
            p.o.max_threads = Some(value(k, v, |v| parse_thread_count(v, 256))?);
            Ok(())
        },
        print: |o, out| out.extend(o.max_threads.map(|n| format!("max_threads={n}"))),
        vfs: false,
        native: NativeUse::Tuning,
    },
    ViewOption {
        keys: &["attr_timeout"],
        set: |p, k, v| {
            p.o.attr_timeout = value(k, v, parse_seconds)?;
            Ok(())
        },
        print: |o, out| out.push(format!("attr_timeout={}", o.attr_timeout.as_secs_f64())),
        vfs: false,
        native: NativeUse::Tuning,
    },
    ViewOption {
        keys: &["entry_timeout"],
        set: |p, k, v| {
            p.o.entry_timeout = value(k, v, parse_seconds)?;
            Ok(())
        },
        print: |o, out| out.push(format!("entry_timeout={}", o.entry_timeout.as_secs_f64())),
        vfs: false,
        native: NativeUse::Tuning,
    },
    ViewOption {
        keys: &["context"],
        set: |p, k, v| {
            p.o.selinux_context = Some(value(k, v, parse_selinux_context)?);
            Ok(())
        },
        print: |o, out| {
            out.extend(
                o.selinux_context
                    .as_ref()
                    .map(|c| format!("context=\"{c}\"")),
            );
        },
        vfs: false,
        native: NativeUse::NotByBindMount,
    },
    // Only what differs from the defaults from here on, so that the canonical string
    // of older options stays what it was.
    ViewOption {
        keys: &["direct_io"],
        set: |p, k, v| {
            p.o.direct_io = value(k, v, |v| one_of(v, DIRECT_IOS))?;
            Ok(())
        },
        print: |o, out| {
            if o.direct_io != DirectIo::default() {
                out.push(format!("direct_io={}", name_of(&o.direct_io, DIRECT_IOS)));
            }
        },
        vfs: false,
        native: NativeUse::Tuning,
    },
    ViewOption {
        keys: &["transport"],
        set: |p, k, v| {
            p.o.transport = value(k, v, |v| one_of(v, TRANSPORTS))?;
            Ok(())
        },
        print: |o, out| {
            if o.transport != Transport::default() {
                out.push(format!("transport={}", name_of(&o.transport, TRANSPORTS)));
            }
        },
        vfs: false,
        native: NativeUse::Tuning,
    },
    ViewOption {
        keys: &[
            "noatime",
            "relatime",
            "strictatime",
            "atime",
            "norelatime",
            "nostrictatime",
        ],
        set: |p, k, v| {
            flag(k, v)?;
            p.o.vfs.atime = match k {
                "noatime" => Atime::Never,
                "strictatime" => Atime::Always,
                // `relatime`, `atime`, `norelatime`, `nostrictatime`: the default.
                _ => Atime::Relative,
            };
            Ok(())
        },
        print: |o, out| match o.vfs.atime {
            Atime::Relative => {}
            Atime::Never => out.push("noatime".into()),
            Atime::Always => out.push("strictatime".into()),
        },
        vfs: true,
        native: NativeUse::Applied,
    },
    vfs_bool!("nodiratime", "diratime", nodiratime, NativeUse::Applied),
    vfs_bool!("lazytime", "nolazytime", lazytime, NativeUse::FuseOnly),
    vfs_bool!("sync", "", sync, NativeUse::FuseOnly),
    vfs_bool!("dirsync", "", dirsync, NativeUse::FuseOnly),
    ViewOption {
        keys: &["fsname"],
        set: |p, k, v| {
            p.o.fsname = Some(value(k, v, parse_fsname)?);
            Ok(())
        },
        print: |o, out| out.extend(o.fsname.as_ref().map(|n| format!("fsname={n}"))),
        vfs: false,
        native: NativeUse::Tuning,
    },
    // Every view is `nodev,nosuid`: saying so is fine, asking otherwise is refused.
    ViewOption {
        keys: &["nodev", "nosuid", "dev", "suid"],
        set: |_, k, v| match k {
            "dev" | "suid" => Err(OptionError::Forbidden(k.to_string())),
            _ => flag(k, v),
        },
        print: |_, _| {},
        vfs: false,
        native: NativeUse::Applied,
    },
];
