//! Typed configuration of a group view, parsed once from mount(8)-style option strings.
//!
//! The same strings arrive from `mountgroup mount -o`, from an fstab line, and (later)
//! from CSI `mount_flags`, so there is exactly one parser. The rules, documented in
//! docs/SEMANTICS.md:
//! - options are comma separated, `key` or `key=value`; unknown keys are errors;
//! - a key given twice takes the last value, as mount(8) does (`ro` and `rw` likewise);
//! - `uid=`, `file_mode=`, `dir_mode=` and `noperm` belong to `mode=cifs`: given without
//!   a `mode=`, they select it; given with an explicit `mode=fsgroup`, they are an error;
//! - a group that comes from elsewhere (the CSI `volume_mount_group`) must agree with a
//!   `gid=` option, see [`ViewOptions::with_mount_group`].

use std::fmt;
use std::time::Duration;

/// A group id that the view presents as the owning group of the volume (the pod's
/// fsGroup). Not an on-disk id: the backing files keep their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MountGroup(u32);

impl MountGroup {
    /// Parses a decimal group id. `4294967295` (`-1`, "no change" to chown) is refused.
    ///
    /// # Errors
    /// A message saying why `s` is not a group id.
    pub fn parse(s: &str) -> Result<MountGroup, String> {
        parse_id(s).map(MountGroup)
    }

    /// Wraps a group id known to be valid.
    pub fn new(gid: u32) -> Option<MountGroup> {
        (gid != u32::MAX).then_some(MountGroup(gid))
    }

    /// The numeric id.
    pub fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for MountGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

fn parse_id(s: &str) -> Result<u32, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err("is not a decimal id".into());
    }
    match s.parse::<u32>() {
        Ok(u32::MAX) | Err(_) => Err("is out of range (0 to 4294967294)".into()),
        Ok(v) => Ok(v),
    }
}

fn parse_perm(s: &str) -> Result<u32, String> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return Err("is not an octal mode".into());
    }
    match u32::from_str_radix(digits, 8) {
        Ok(v) if v <= 0o7777 => Ok(v),
        _ => Err("is larger than 07777".into()),
    }
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=3600.0).contains(&v) => Ok(Duration::from_secs_f64(v)),
        _ => Err("is not a number of seconds from 0 to 3600".into()),
    }
}

/// What the view presents as ownership and permissions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewMode {
    /// As if kubelet had chowned the volume to the group, then plain POSIX.
    FsGroup,
    /// The Linux CIFS client on a share without Unix extensions.
    Cifs,
    /// What a native view (an idmapped bind mount) shows: the disk's owners and modes,
    /// the volume's own group (`disk_gid=`) shown as the pod's (`gid=`), chown and
    /// chmod on disk. A FUSE view serves it where a native mount cannot (a pod in a
    /// user namespace), so that the mechanism never changes what a pod sees.
    Native,
}

/// Where chown/chmod effects live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// In an ownership record (an xattr in the daemon's namespace) per entry.
    Emulate,
    /// Nowhere: chown/chmod succeed with no effect, as on CIFS.
    Off,
}

/// Whether reads and writes go through kernel FUSE passthrough.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Passthrough {
    /// Where the kernel offers it; otherwise through the daemon.
    Auto,
    /// Required: the mount fails where the kernel does not offer it.
    On,
    /// Never: every read and write goes through the daemon.
    Off,
}

/// Who reads and writes the files opened with `O_DIRECT` (measured in
/// docs/BENCHMARKS.md, *Direct I/O: the view or the kernel*).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DirectIo {
    /// The view, on a descriptor of its own opened with `O_DIRECT`: the kernel sends
    /// every read and write (`FOPEN_DIRECT_IO`), and writers of one file write at once
    /// (`FOPEN_PARALLEL_DIRECT_WRITES`) where passthrough takes the file's lock for
    /// each. Faster with several writers of one file, slower with one.
    View,
    /// As any other file: kernel passthrough where it is on.
    #[default]
    Kernel,
}

/// How the kernel hands a view its requests (docs/ARCHITECTURE.md, *FUSE over
/// io_uring*; measured in docs/BENCHMARKS.md, *The io_uring transport*).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// Reading and writing `/dev/fuse`. A view on it can be handed to a new process
    /// live and recovered after a crash.
    #[default]
    Dev,
    /// FUSE over io_uring (Linux 6.14+, the `fuse` module's `enable_uring=Y`): one ring
    /// entry per worker on each CPU's queue. The trade: the kernel (to 6.18 at least)
    /// can neither hand a ring to another process nor resend the requests a dead one
    /// held, so such a view is neither handed over nor recovered; if its process dies,
    /// its callers get `ENOTCONN`, `ECONNABORTED` or `ECANCELED`
    /// (`tests/ring.rs`).
    Ring,
}

/// The options of `mode=cifs`, with the defaults of the Linux CIFS client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CifsOptions {
    pub uid: u32,
    pub file_mode: u32,
    pub dir_mode: u32,
    pub noperm: bool,
}

impl Default for CifsOptions {
    fn default() -> Self {
        CifsOptions {
            uid: 0,
            file_mode: 0o755,
            dir_mode: 0o755,
            noperm: false,
        }
    }
}

/// The complete, validated configuration of one view.
#[derive(Clone, Debug, PartialEq)]
pub struct ViewOptions {
    /// `gid=`: the group presented as owner. `None` in fsgroup mode means a plain,
    /// POSIX-faithful passthrough.
    pub group: Option<MountGroup>,
    pub mode: ViewMode,
    /// `disk_gid=` (`mode=native`): the volume's own group on disk, shown as `gid=`.
    pub disk_group: Option<u32>,
    pub ownership: Ownership,
    pub readonly: bool,
    pub cifs: CifsOptions,
    pub passthrough: Passthrough,
    /// `direct_io=`: who serves the reads and writes of files opened with `O_DIRECT`.
    pub direct_io: DirectIo,
    /// `transport=`: `/dev/fuse` or FUSE over io_uring.
    pub transport: Transport,
    pub noexec: bool,
    /// Worker threads serving the FUSE session.
    pub threads: usize,
    /// How long the kernel may cache attributes (`attr_timeout=`).
    pub attr_timeout: Duration,
    /// How long the kernel may cache names (`entry_timeout=`).
    pub entry_timeout: Duration,
    /// `context=`: the SELinux label every file of the view shows, as kubelet asks
    /// for it on SELinux nodes when the CSIDriver has `seLinuxMount: true`.
    pub selinux_context: Option<String>,
    /// The VFS flags of mount(8) and fstab lines (`noatime`, `lazytime`, `sync`, ...),
    /// applied to the view's mount as the kernel applies them to any mount.
    pub vfs: VfsFlags,
    /// `fsname=`: the source the mount table shows (default: the backing directory).
    pub fsname: Option<String>,
}

/// How the kernel updates access times on a mount (`atime` options of mount(8)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Atime {
    /// The kernel's default, `relatime`.
    #[default]
    Relative,
    /// `noatime`.
    Never,
    /// `strictatime`.
    Always,
}

/// The VFS mount flags a view accepts from mount(8) and fstab.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VfsFlags {
    pub atime: Atime,
    /// `nodiratime`.
    pub nodiratime: bool,
    /// `lazytime`.
    pub lazytime: bool,
    /// `sync`: every write is synchronous.
    pub sync: bool,
    /// `dirsync`: directory changes are synchronous.
    pub dirsync: bool,
}

impl Default for ViewOptions {
    fn default() -> Self {
        ViewOptions {
            group: None,
            mode: ViewMode::FsGroup,
            disk_group: None,
            ownership: Ownership::Emulate,
            readonly: false,
            cifs: CifsOptions::default(),
            passthrough: Passthrough::Auto,
            direct_io: DirectIo::default(),
            transport: Transport::default(),
            noexec: false,
            threads: default_threads(),
            attr_timeout: Duration::from_secs(1),
            entry_timeout: Duration::from_secs(1),
            selinux_context: None,
            vfs: VfsFlags::default(),
            fsname: None,
        }
    }
}

/// The value named `v` among `choices`, or why it is none of them ("is not `a`, `b`
/// or `c`").
fn one_of<T: Copy>(v: &str, choices: &[(&str, T)]) -> Result<T, String> {
    if let Some((_, t)) = choices.iter().find(|(name, _)| *name == v) {
        return Ok(*t);
    }
    let names: Vec<String> = choices.iter().map(|(n, _)| format!("`{n}`")).collect();
    let (last, rest) = names.split_last().expect("at least one choice");
    Err(if rest.is_empty() {
        format!("is not {last}")
    } else {
        format!("is not {} or {last}", rest.join(", "))
    })
}

fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(2, 8)
}

/// A bad option string. Every variant names the option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    #[error("unknown option `{0}`")]
    Unknown(String),
    #[error("option `{0}` needs a value (`{0}=...`)")]
    MissingValue(String),
    #[error("option `{0}` takes no value")]
    UnexpectedValue(String),
    #[error("option `{key}`: `{value}` {reason}")]
    Invalid {
        key: String,
        value: String,
        reason: String,
    },
    #[error("option `{0}` only applies to mode=cifs, but mode={1} was given")]
    CifsOnly(String, &'static str),
    #[error("mode=native needs `disk_gid=`: the volume's group on disk, which it shows as `gid=`")]
    NativeNeedsGroups,
    #[error("option `disk_gid` only applies to mode=native")]
    DiskGidOnlyNative,
    #[error("option `{0}` is never allowed: mountgroup views are always nodev,nosuid")]
    Forbidden(String),
    #[error("option `gid={option}` disagrees with the requested mount group {requested}")]
    GroupConflict { option: u32, requested: u32 },
}

/// Splits an option string at commas outside double quotes: an SELinux label has
/// commas in its category set, and kubelet quotes it (kubernetes pkg/volume/util
/// `AddSELinuxMountOption`: `context=%q`), as mount(8) users do.
fn split_options(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in s.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// An SELinux context (`user:role:type[:level]`), quoted or not, without its quotes.
fn parse_selinux_context(v: &str) -> Result<String, String> {
    let inner = match v.strip_prefix('"') {
        Some(rest) => rest
            .strip_suffix('"')
            .ok_or_else(|| "has an unclosed quote".to_string())?,
        None => v,
    };
    let ok_chars = inner
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "_.:,-".contains(c));
    if !ok_chars || inner.split(':').count() < 3 || inner.split(':').any(str::is_empty) {
        return Err("is not an SELinux context (user:role:type:level)".into());
    }
    Ok(inner.to_string())
}

/// Options of /etc/fstab, mount(8) and FUSE mount helpers that mean nothing to a view
/// (or that a view always has) and are accepted so that fstab lines and mount helpers
/// work unchanged: `allow_other` and `default_permissions` are how every view is
/// mounted (CIFS `noperm` alone turns the latter off), `async` is the default.
const IGNORED: &[&str] = &[
    "defaults",
    "auto",
    "noauto",
    "nofail",
    "_netdev",
    "user",
    "nouser",
    "users",
    "owner",
    "group",
    "allow_other",
    "default_permissions",
    "async",
];

/// Options with a value that mean nothing to a view: a FUSE helper's `subtype=` (a
/// view's type is always `fuse.mountgroup`) and fstab's `comment=`.
const IGNORED_WITH_VALUE: &[&str] = &["subtype", "comment"];

impl ViewOptions {
    /// Parses one comma-separated option string (`gid=2000,ro`). Empty items are
    /// ignored, so `""` gives the defaults.
    ///
    /// # Errors
    /// The first bad option, named.
    pub fn parse(options: &str) -> Result<ViewOptions, OptionError> {
        Self::parse_all([options])
    }

    /// Parses several option strings as if joined by commas, in order (so a later one
    /// overrides an earlier one).
    ///
    /// # Errors
    /// The first bad option, named.
    pub fn parse_all<'a, I>(strings: I) -> Result<ViewOptions, OptionError>
    where
        I: IntoIterator<Item = &'a str>,
    {
        let mut o = ViewOptions::default();
        let mut explicit_mode = None;
        let mut cifs_only: Option<String> = None;
        for item in strings.into_iter().flat_map(split_options) {
            let item = item.trim();
            if item.is_empty() || IGNORED.contains(&item) || item.starts_with("x-") {
                continue;
            }
            if IGNORED_WITH_VALUE
                .iter()
                .any(|k| item.strip_prefix(k).is_some_and(|r| r.starts_with('=')))
            {
                continue;
            }
            let (key, value) = match item.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (item, None),
            };
            // `gid=` names no value, as `gid` does not.
            let need = |v: Option<&'a str>| {
                v.filter(|v| !v.is_empty())
                    .ok_or_else(|| OptionError::MissingValue(key.to_string()))
            };
            let bad = |v: &str, reason: String| OptionError::Invalid {
                key: key.to_string(),
                value: v.to_string(),
                reason,
            };
            let flag = |v: Option<&str>| match v {
                None => Ok(()),
                Some(_) => Err(OptionError::UnexpectedValue(key.to_string())),
            };
            match key {
                "gid" => {
                    let v = need(value)?;
                    o.group = Some(MountGroup::parse(v).map_err(|r| bad(v, r))?);
                }
                "mode" => {
                    let v = need(value)?;
                    let m = one_of(
                        v,
                        &[
                            ("fsgroup", ViewMode::FsGroup),
                            ("cifs", ViewMode::Cifs),
                            ("native", ViewMode::Native),
                        ],
                    )
                    .map_err(|r| bad(v, r))?;
                    explicit_mode = Some(m);
                }
                "disk_gid" => {
                    let v = need(value)?;
                    o.disk_group = Some(parse_id(v).map_err(|r| bad(v, r))?);
                }
                "ownership" => {
                    let v = need(value)?;
                    o.ownership = one_of(
                        v,
                        &[("emulate", Ownership::Emulate), ("off", Ownership::Off)],
                    )
                    .map_err(|r| bad(v, r))?;
                }
                "passthrough" => {
                    let v = need(value)?;
                    o.passthrough = one_of(
                        v,
                        &[
                            ("auto", Passthrough::Auto),
                            ("on", Passthrough::On),
                            ("off", Passthrough::Off),
                        ],
                    )
                    .map_err(|r| bad(v, r))?;
                }
                "direct_io" => {
                    let v = need(value)?;
                    o.direct_io =
                        one_of(v, &[("view", DirectIo::View), ("kernel", DirectIo::Kernel)])
                            .map_err(|r| bad(v, r))?;
                }
                "transport" => {
                    let v = need(value)?;
                    o.transport = one_of(v, &[("dev", Transport::Dev), ("ring", Transport::Ring)])
                        .map_err(|r| bad(v, r))?;
                }
                "uid" => {
                    let v = need(value)?;
                    o.cifs.uid = parse_id(v).map_err(|r| bad(v, r))?;
                    cifs_only.get_or_insert_with(|| key.to_string());
                }
                "file_mode" | "dir_mode" => {
                    let v = need(value)?;
                    let perm = parse_perm(v).map_err(|r| bad(v, r))?;
                    if key == "file_mode" {
                        o.cifs.file_mode = perm;
                    } else {
                        o.cifs.dir_mode = perm;
                    }
                    cifs_only.get_or_insert_with(|| key.to_string());
                }
                "noperm" => {
                    flag(value)?;
                    o.cifs.noperm = true;
                    cifs_only.get_or_insert_with(|| key.to_string());
                }
                "ro" => {
                    flag(value)?;
                    o.readonly = true;
                }
                "rw" => {
                    flag(value)?;
                    o.readonly = false;
                }
                "noexec" => {
                    flag(value)?;
                    o.noexec = true;
                }
                "exec" => {
                    flag(value)?;
                    o.noexec = false;
                }
                "nodev" | "nosuid" => flag(value)?,
                "dev" | "suid" => return Err(OptionError::Forbidden(key.to_string())),
                "noatime" | "relatime" | "strictatime" | "atime" | "norelatime"
                | "nostrictatime" => {
                    flag(value)?;
                    o.vfs.atime = match key {
                        "noatime" => Atime::Never,
                        "strictatime" => Atime::Always,
                        // `atime`, `norelatime`, `nostrictatime`: back to the default.
                        _ => Atime::Relative,
                    };
                }
                "nodiratime" | "diratime" => {
                    flag(value)?;
                    o.vfs.nodiratime = key == "nodiratime";
                }
                "lazytime" | "nolazytime" => {
                    flag(value)?;
                    o.vfs.lazytime = key == "lazytime";
                }
                "sync" => {
                    flag(value)?;
                    o.vfs.sync = true;
                }
                "dirsync" => {
                    flag(value)?;
                    o.vfs.dirsync = true;
                }
                "fsname" => {
                    let v = need(value)?;
                    if v.contains(['\\', ' ', '\t', '\n']) || v.len() > 255 {
                        return Err(bad(v, "is not a plain name (no spaces, backslashes or control characters, at most 255 bytes)".into()));
                    }
                    o.fsname = Some(v.to_string());
                }
                "context" => {
                    let v = need(value)?;
                    o.selinux_context = Some(parse_selinux_context(v).map_err(|r| bad(v, r))?);
                }
                "threads" => {
                    let v = need(value)?;
                    o.threads = match v.parse::<usize>() {
                        Ok(n) if (1..=64).contains(&n) => n,
                        _ => return Err(bad(v, "is not a thread count from 1 to 64".into())),
                    };
                }
                "attr_timeout" => {
                    let v = need(value)?;
                    o.attr_timeout = parse_seconds(v).map_err(|r| bad(v, r))?;
                }
                "entry_timeout" => {
                    let v = need(value)?;
                    o.entry_timeout = parse_seconds(v).map_err(|r| bad(v, r))?;
                }
                _ => return Err(OptionError::Unknown(key.to_string())),
            }
        }
        o.mode = match (explicit_mode, cifs_only) {
            (Some(ViewMode::FsGroup), Some(opt)) => {
                return Err(OptionError::CifsOnly(opt, "fsgroup"));
            }
            (Some(ViewMode::Native), Some(opt)) => {
                return Err(OptionError::CifsOnly(opt, "native"));
            }
            (Some(m), _) => m,
            (None, Some(_)) => ViewMode::Cifs,
            (None, None) => ViewMode::FsGroup,
        };
        match (o.mode, o.disk_group) {
            (ViewMode::Native, None) => return Err(OptionError::NativeNeedsGroups),
            (ViewMode::FsGroup | ViewMode::Cifs, Some(_)) => {
                return Err(OptionError::DiskGidOnlyNative);
            }
            _ => {}
        }
        Ok(o)
    }

    /// The source the mount table shows: `fsname=`, else the backing directory.
    pub fn fsname_for(&self, source: &std::path::Path) -> String {
        self.fsname
            .clone()
            .unwrap_or_else(|| source.display().to_string())
    }

    /// Applies a mount group that comes from outside the option string (the CSI
    /// `volume_mount_group`, i.e. the pod's fsGroup). A `gid=` option that names the
    /// same group is fine; one that names another group is an error rather than a
    /// silent choice, because either choice would surprise someone: the pod expects
    /// its fsGroup, the StorageClass author expects their `gid=`.
    ///
    /// # Errors
    /// [`OptionError::GroupConflict`] when `gid=` names another group.
    pub fn with_mount_group(mut self, group: MountGroup) -> Result<ViewOptions, OptionError> {
        match self.group {
            Some(g) if g != group => Err(OptionError::GroupConflict {
                option: g.get(),
                requested: group.get(),
            }),
            _ => {
                self.group = Some(group);
                Ok(self)
            }
        }
    }

    /// Whether the kernel checks permissions against the presented attributes
    /// (`default_permissions`). Only CIFS `noperm` turns this off.
    pub fn kernel_permission_checks(&self) -> bool {
        !(self.mode == ViewMode::Cifs && self.cifs.noperm)
    }

    /// The options in canonical form: parsing the result gives the same options.
    pub fn to_option_string(&self) -> String {
        let mut v: Vec<String> = Vec::new();
        if let Some(g) = self.group {
            v.push(format!("gid={g}"));
        }
        match self.mode {
            ViewMode::FsGroup => v.push("mode=fsgroup".into()),
            ViewMode::Native => {
                v.push("mode=native".into());
                if let Some(d) = self.disk_group {
                    v.push(format!("disk_gid={d}"));
                }
            }
            ViewMode::Cifs => {
                v.push("mode=cifs".into());
                v.push(format!("uid={}", self.cifs.uid));
                v.push(format!("file_mode={:04o}", self.cifs.file_mode));
                v.push(format!("dir_mode={:04o}", self.cifs.dir_mode));
                if self.cifs.noperm {
                    v.push("noperm".into());
                }
            }
        }
        v.push(match self.ownership {
            Ownership::Emulate => "ownership=emulate".into(),
            Ownership::Off => "ownership=off".into(),
        });
        v.push(if self.readonly {
            "ro".into()
        } else {
            "rw".into()
        });
        if self.noexec {
            v.push("noexec".into());
        }
        v.push(match self.passthrough {
            Passthrough::Auto => "passthrough=auto".into(),
            Passthrough::On => "passthrough=on".into(),
            Passthrough::Off => "passthrough=off".into(),
        });
        v.push(format!("threads={}", self.threads));
        v.push(format!("attr_timeout={}", self.attr_timeout.as_secs_f64()));
        v.push(format!(
            "entry_timeout={}",
            self.entry_timeout.as_secs_f64()
        ));
        if let Some(c) = &self.selinux_context {
            v.push(format!("context=\"{c}\""));
        }
        // Only what differs from the defaults, so that the canonical string of older
        // options stays what it was (a takeover compares them).
        if self.direct_io == DirectIo::View {
            v.push("direct_io=view".into());
        }
        if self.transport == Transport::Ring {
            v.push("transport=ring".into());
        }
        match self.vfs.atime {
            Atime::Relative => {}
            Atime::Never => v.push("noatime".into()),
            Atime::Always => v.push("strictatime".into()),
        }
        for (on, name) in [
            (self.vfs.nodiratime, "nodiratime"),
            (self.vfs.lazytime, "lazytime"),
            (self.vfs.sync, "sync"),
            (self.vfs.dirsync, "dirsync"),
        ] {
            if on {
                v.push(name.into());
            }
        }
        if let Some(n) = &self.fsname {
            v.push(format!("fsname={n}"));
        }
        v.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_mount_and_fstab_write_is_accepted() {
        // An fstab line as people write them for FUSE file systems.
        let o = ViewOptions::parse(
            "defaults,noatime,nodiratime,nofail,_netdev,x-systemd.automount,allow_other,default_permissions,fsname=share,subtype=mountgroup,comment=x,gid=2000",
        )
        .unwrap();
        assert_eq!(o.vfs.atime, Atime::Never);
        assert!(o.vfs.nodiratime);
        assert_eq!(o.fsname.as_deref(), Some("share"));
        assert_eq!(o.group, MountGroup::new(2000));
        assert_eq!(ViewOptions::parse(&o.to_option_string()).unwrap(), o);
        let o = ViewOptions::parse("noatime,relatime,lazytime,sync,dirsync,async").unwrap();
        assert_eq!(o.vfs.atime, Atime::Relative, "the last atime option wins");
        assert!(o.vfs.lazytime && o.vfs.sync && o.vfs.dirsync);
        assert_eq!(
            ViewOptions::parse("strictatime").unwrap().vfs.atime,
            Atime::Always
        );
        // Defaults add nothing to the canonical string: older views' strings stay.
        assert_eq!(
            ViewOptions::parse("relatime,diratime,nolazytime,async")
                .unwrap()
                .to_option_string(),
            ViewOptions::default().to_option_string()
        );
        for (bad, why) in [
            ("suid", "never allowed"),
            ("dev", "never allowed"),
            ("noatime=1", "noatime"),
            ("fsname=a b", "fsname"),
        ] {
            let e = ViewOptions::parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn selinux_contexts_keep_their_commas() {
        // As kubelet sends it: one mount flag, quoted with %q.
        let label = "system_u:object_r:container_file_t:s0:c12,c345";
        let o = ViewOptions::parse_all([format!("context=\"{label}\"").as_str(), "ro"]).unwrap();
        assert_eq!(o.selinux_context.as_deref(), Some(label));
        assert!(o.readonly);
        let again = ViewOptions::parse(&o.to_option_string()).unwrap();
        assert_eq!(again, o, "the canonical string keeps the label whole");
        let o = ViewOptions::parse("gid=5,context=system_u:object_r:container_file_t:s0").unwrap();
        assert_eq!(
            o.selinux_context.as_deref(),
            Some("system_u:object_r:container_file_t:s0")
        );
        for bad in [
            "context=\"system_u:object_r:x:s0",
            "context=container_file_t",
            "context=\"a:b:c;rm -rf\"",
        ] {
            let e = ViewOptions::parse(bad).unwrap_err().to_string();
            assert!(e.contains("context"), "{bad}: {e}");
        }
    }

    #[test]
    fn empty_gives_defaults() {
        let o = ViewOptions::parse("").unwrap();
        assert_eq!(o, ViewOptions::default());
        assert_eq!(o.group, None);
        assert_eq!(o.mode, ViewMode::FsGroup);
        assert_eq!(o.ownership, Ownership::Emulate);
    }

    #[test]
    fn parses_every_option() {
        let o = ViewOptions::parse(
            "gid=4242,ownership=off,ro,noexec,passthrough=off,threads=3,attr_timeout=0.5,entry_timeout=2",
        )
        .unwrap();
        assert_eq!(o.group, MountGroup::new(4242));
        assert_eq!(o.ownership, Ownership::Off);
        assert!(o.readonly && o.noexec);
        assert_eq!(o.passthrough, Passthrough::Off);
        assert_eq!(o.threads, 3);
        assert_eq!(o.attr_timeout, Duration::from_millis(500));
        assert_eq!(o.entry_timeout, Duration::from_secs(2));
        assert_eq!(o.direct_io, DirectIo::Kernel);
        let o = ViewOptions::parse("direct_io=view").unwrap();
        assert_eq!(o.direct_io, DirectIo::View);
    }

    #[test]
    fn cifs_options_select_cifs_mode() {
        let o = ViewOptions::parse("uid=1001,gid=1001,file_mode=0640,dir_mode=0750").unwrap();
        assert_eq!(o.mode, ViewMode::Cifs);
        assert_eq!(
            o.cifs,
            CifsOptions {
                uid: 1001,
                file_mode: 0o640,
                dir_mode: 0o750,
                noperm: false
            }
        );
        let o = ViewOptions::parse("mode=cifs,noperm").unwrap();
        assert!(o.cifs.noperm);
        assert!(!o.kernel_permission_checks());
        assert_eq!(o.cifs.file_mode, 0o755, "CIFS default file_mode");
    }

    #[test]
    fn cifs_options_conflict_with_explicit_fsgroup() {
        assert_eq!(
            ViewOptions::parse("mode=fsgroup,file_mode=0644"),
            Err(OptionError::CifsOnly("file_mode".into(), "fsgroup"))
        );
    }

    #[test]
    fn last_value_wins() {
        let o = ViewOptions::parse("gid=1,gid=2,ro,rw").unwrap();
        assert_eq!(o.group, MountGroup::new(2));
        assert!(!o.readonly);
        let o = ViewOptions::parse_all(["rw,gid=5", "ro"]).unwrap();
        assert!(o.readonly);
        assert_eq!(o.group, MountGroup::new(5));
    }

    #[test]
    fn bad_options_name_the_option() {
        let cases: &[(&str, &str)] = &[
            ("gid=abc", "option `gid`: `abc` is not a decimal id"),
            ("gid=", "option `gid` needs a value (`gid=...`)"),
            (
                "file_mode=",
                "option `file_mode` needs a value (`file_mode=...`)",
            ),
            ("gid=-1", "option `gid`: `-1` is not a decimal id"),
            (
                "gid=4294967295",
                "option `gid`: `4294967295` is out of range (0 to 4294967294)",
            ),
            ("gid", "option `gid` needs a value (`gid=...`)"),
            ("ro=1", "option `ro` takes no value"),
            ("colour=blue", "unknown option `colour`"),
            (
                "mode=nfs",
                "option `mode`: `nfs` is not `fsgroup`, `cifs` or `native`",
            ),
            (
                "mode=native,gid=4242",
                "mode=native needs `disk_gid=`: the volume's group on disk, which it shows as `gid=`",
            ),
            (
                "gid=4242,disk_gid=70000",
                "option `disk_gid` only applies to mode=native",
            ),
            (
                "mode=native,disk_gid=7,file_mode=0644",
                "option `file_mode` only applies to mode=cifs, but mode=native was given",
            ),
            (
                "file_mode=0999",
                "option `file_mode`: `0999` is not an octal mode",
            ),
            (
                "dir_mode=17777",
                "option `dir_mode`: `17777` is larger than 07777",
            ),
            (
                "threads=0",
                "option `threads`: `0` is not a thread count from 1 to 64",
            ),
            (
                "direct_io=daemon",
                "option `direct_io`: `daemon` is not `view` or `kernel`",
            ),
            (
                "transport=uring",
                "option `transport`: `uring` is not `dev` or `ring`",
            ),
            (
                "attr_timeout=-1",
                "option `attr_timeout`: `-1` is not a number of seconds from 0 to 3600",
            ),
            (
                "suid",
                "option `suid` is never allowed: mountgroup views are always nodev,nosuid",
            ),
        ];
        for (input, message) in cases {
            let err = ViewOptions::parse(input).expect_err(input);
            assert_eq!(err.to_string(), *message, "for {input}");
        }
    }

    #[test]
    fn fstab_noise_is_ignored() {
        let o =
            ViewOptions::parse("defaults,_netdev,nofail,x-systemd.automount,nodev,nosuid,gid=7")
                .unwrap();
        assert_eq!(o.group, MountGroup::new(7));
    }

    #[test]
    fn mount_group_must_agree_with_gid_option() {
        let o = ViewOptions::parse("gid=2000").unwrap();
        assert_eq!(
            o.clone().with_mount_group(MountGroup::new(3000).unwrap()),
            Err(OptionError::GroupConflict {
                option: 2000,
                requested: 3000
            })
        );
        let same = o.with_mount_group(MountGroup::new(2000).unwrap()).unwrap();
        assert_eq!(same.group, MountGroup::new(2000));
        let none = ViewOptions::parse("")
            .unwrap()
            .with_mount_group(MountGroup::new(9).unwrap())
            .unwrap();
        assert_eq!(none.group, MountGroup::new(9));
    }

    #[test]
    fn canonical_string_round_trips() {
        for s in [
            "",
            "gid=5,ro",
            "uid=3,gid=4,file_mode=0600,noperm",
            "ownership=off,passthrough=on,threads=2",
            "direct_io=kernel",
            "direct_io=view",
            "transport=dev",
            "transport=ring,direct_io=view",
            "mode=native,gid=4242,disk_gid=2000000000,ro",
        ] {
            let o = ViewOptions::parse(s).unwrap();
            assert_eq!(
                ViewOptions::parse(&o.to_option_string()).unwrap(),
                o,
                "for {s:?}"
            );
        }
    }
}
