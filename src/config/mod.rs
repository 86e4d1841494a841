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

mod options;

use options::*;
pub use options::{NativeUse, OPTIONS, ViewOption};

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
    /// As `Emulate`, with the record in the `user.` namespace, for a share whose file
    /// system has no `trusted.` one (NFS 4.2, SMB with extended attributes): regular
    /// files and directories keep records, other entries none.
    EmulateUser,
    /// Nowhere: chown/chmod succeed with no effect, as on CIFS.
    Off,
    /// On the share itself, which keeps owners and checks permissions (NFS): the view
    /// acts as each caller there (its uid, and its groups with the pod's group swapped
    /// for the volume's own), so that what a pod makes is its own on the share and the
    /// share decides what it may do. The view shows the share's owners: `mode=native`,
    /// or no `gid=`.
    Share,
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
/// docs/notes/benchmarks.md, *Direct I/O: the view or the kernel*).
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
/// io_uring*; measured in docs/notes/benchmarks.md, *The io_uring transport*).
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
    /// `max_threads=`: the most worker threads, beyond `threads` started while every
    /// worker is busy (a request waiting on the share holds up no other), each ending
    /// after 10 s without a request; `None`: [`DEFAULT_MAX_THREADS`] (left out of the
    /// canonical string, which running views' state holds). At or below `threads`:
    /// `threads` alone.
    pub max_threads: Option<usize>,
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
            max_threads: None,
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

/// The most worker threads a view runs where `max_threads=` is not given. With 32
/// callers over a 10 ms round trip in the VM tier, 64 gave 3 to 5 times what the view's
/// two workers gave (docs/BENCHMARKS.md, *Many callers at once*); an extra worker costs
/// a thread and its read buffer while it lives.
pub const DEFAULT_MAX_THREADS: usize = 64;

impl ViewOptions {
    /// The most worker threads the view runs ([`ViewOptions::max_threads`]).
    pub fn max_threads(&self) -> usize {
        self.max_threads.unwrap_or(DEFAULT_MAX_THREADS)
    }
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
    #[error(
        "ownership=share shows the share's own owners: it needs mode=native (the volume's group on disk as `disk_gid=`, shown as `gid=`) or no `gid=`, not mode={0}"
    )]
    ShareOwnersShowTheDisk(&'static str),
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

/// The items of mount flags as kubelet sends them (a StorageClass's `mountOptions`,
/// each of which may itself hold several comma-separated items), empty ones left out.
pub fn option_items<'a>(flags: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    flags
        .into_iter()
        .flat_map(split_options)
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .collect()
}

/// Whether the item `key` or `key=value` is a view's: one of [`OPTIONS`], or one views
/// take and ignore (fstab's `nofail`, `x-` options, ...).
pub fn is_view_item(item: &str) -> bool {
    let key = item.split_once('=').map_or(item, |(k, _)| k);
    IGNORED.contains(&item)
        || item.starts_with("x-")
        || IGNORED_WITH_VALUE.contains(&key)
        || OPTIONS.iter().any(|o| o.keys.contains(&key))
}

/// The state of a parse: the options so far, and what decides the mode at the end.
struct Parsing {
    o: ViewOptions,
    explicit_mode: Option<ViewMode>,
    /// The first CIFS-only option given.
    cifs_only: Option<String>,
}

impl ViewOptions {
    /// The `ownership=` value, as options print it.
    pub fn ownership_name(&self) -> &'static str {
        name_of(&self.ownership, OWNERSHIPS)
    }
    /// Parses one comma-separated option string (`gid=2000,ro`). Empty items are
    /// ignored, so `""` gives the defaults.
    ///
    /// # Errors
    /// The first bad option, named.
    pub fn parse(options: &str) -> Result<ViewOptions, OptionError> {
        Self::parse_all([options])
    }

    /// Parses several option strings as if joined by commas, in order (so a later one
    /// overrides an earlier one), each by its entry in [`OPTIONS`].
    ///
    /// # Errors
    /// The first bad option, named.
    pub fn parse_all<'a, I>(strings: I) -> Result<ViewOptions, OptionError>
    where
        I: IntoIterator<Item = &'a str>,
    {
        let mut p = Parsing {
            o: ViewOptions::default(),
            explicit_mode: None,
            cifs_only: None,
        };
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
            let option = OPTIONS
                .iter()
                .find(|o| o.keys.contains(&key))
                .ok_or_else(|| OptionError::Unknown(key.to_string()))?;
            (option.set)(&mut p, key, value)?;
        }
        let Parsing {
            mut o,
            explicit_mode,
            cifs_only,
        } = p;
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
        if o.ownership == Ownership::Share {
            match (o.mode, o.group) {
                (ViewMode::Native, _) | (ViewMode::FsGroup, None) => {}
                (mode, _) => {
                    return Err(OptionError::ShareOwnersShowTheDisk(name_of(&mode, MODES)));
                }
            }
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
        for option in OPTIONS {
            (option.print)(self, &mut v);
        }
        v.join(",")
    }

    /// The VFS flags of the view's mount, by their mount(8) names (`ro`, `noatime`,
    /// `sync`, ...), from the options that are flags.
    pub fn vfs_flags(&self) -> Vec<&'static str> {
        self.flags_where(|_| true)
    }

    /// The VFS flags a native view's mount has: those of the options it applies.
    pub fn native_vfs_flags(&self) -> Vec<&'static str> {
        self.flags_where(|o| o.native == NativeUse::Applied)
    }

    fn flags_where(&self, keep: impl Fn(&ViewOption) -> bool) -> Vec<&'static str> {
        let mut out = Vec::new();
        for option in OPTIONS.iter().filter(|o| o.vfs && keep(o)) {
            let mut items = Vec::new();
            (option.print)(self, &mut items);
            out.extend(items.iter().filter_map(|item| {
                option
                    .keys
                    .iter()
                    .copied()
                    .find(|k| *k == item && *k != "rw")
            }));
        }
        out
    }

    /// The first option (its canonical item, `mode=cifs`, `sync`) that a native view
    /// cannot honour, with how it treats it: one that is not its default and that
    /// only a FUSE view gives, or that a bind mount cannot give.
    /// FUSE semantics come first: they decide the mechanism whatever else is asked.
    pub fn native_obstacle(&self) -> Option<(String, NativeUse)> {
        let default = ViewOptions::default();
        [NativeUse::FuseOnly, NativeUse::NotByBindMount]
            .iter()
            .flat_map(|how| OPTIONS.iter().filter(move |o| o.native == *how))
            .find_map(|option| {
                let (mut mine, mut theirs) = (Vec::new(), Vec::new());
                (option.print)(self, &mut mine);
                (option.print)(&default, &mut theirs);
                (mine != theirs).then(|| {
                    let item = mine.into_iter().find(|i| !theirs.contains(i));
                    (
                        item.unwrap_or_else(|| option.keys[0].to_string()),
                        option.native,
                    )
                })
            })
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
        assert_eq!(o.max_threads, None);
        assert_eq!(o.max_threads(), DEFAULT_MAX_THREADS);
        let o = ViewOptions::parse("direct_io=view,max_threads=64").unwrap();
        assert_eq!(o.direct_io, DirectIo::View);
        assert_eq!(o.max_threads, Some(64));
        assert!(o.to_option_string().contains("max_threads=64"));
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
                "max_threads=257",
                "option `max_threads`: `257` is not a thread count from 1 to 256",
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

    #[test]
    fn each_key_is_declared_once() {
        let mut keys: Vec<&str> = OPTIONS
            .iter()
            .flat_map(|o| o.keys.iter().copied())
            .collect();
        let n = keys.len();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), n, "a key in two declarations");
    }

    #[test]
    fn native_views_and_mounts_follow_the_declaration() {
        let o = |s: &str| ViewOptions::parse(s).unwrap();
        let obstacle = |s: &str| o(s).native_obstacle();
        assert_eq!(
            obstacle("gid=1,ro,noexec,noatime,nodiratime,threads=3"),
            None
        );
        assert_eq!(
            obstacle("gid=1,file_mode=0644"),
            Some(("mode=cifs".into(), NativeUse::FuseOnly))
        );
        assert_eq!(
            obstacle("ownership=off"),
            Some(("ownership=off".into(), NativeUse::FuseOnly))
        );
        assert_eq!(
            obstacle("lazytime"),
            Some(("lazytime".into(), NativeUse::FuseOnly))
        );
        // FUSE semantics come first, whatever the order they were given in.
        assert_eq!(
            obstacle("context=\"a:b:c:s0\",dirsync"),
            Some(("dirsync".into(), NativeUse::FuseOnly))
        );
        assert_eq!(
            obstacle("context=\"a:b:c:s0\""),
            Some(("context=\"a:b:c:s0\"".into(), NativeUse::NotByBindMount))
        );
        let all = o("ro,noexec,strictatime,nodiratime,lazytime,sync,dirsync");
        assert_eq!(
            all.vfs_flags(),
            [
                "ro",
                "noexec",
                "strictatime",
                "nodiratime",
                "lazytime",
                "sync",
                "dirsync"
            ]
        );
        assert_eq!(
            all.native_vfs_flags(),
            ["ro", "noexec", "strictatime", "nodiratime"]
        );
        assert!(o("rw,relatime").vfs_flags().is_empty());
        // Every flag a view's mount gets is one the system layer can set.
        for name in all.vfs_flags().into_iter().chain(o("noatime").vfs_flags()) {
            assert!(
                crate::sys::mount::VFS_FLAGS.iter().any(|f| f.name == name),
                "{name}"
            );
        }
    }
}
