//! Shares a StorageClass or a PV names (SMB, NFS, CephFS), which the driver mounts
//! itself, as csi-driver-smb, csi-driver-nfs and ceph-csi do: the class's parameters or
//! the PV's attributes name the share, with the peers' keys; the Secrets the
//! provisioner and kubelet hand over carry the credentials; a volume id names the
//! share and the volume's directory on it, so that no state is needed to find it
//! again. What each kind is lives in its own file (`smb.rs`, `nfs.rs`, `cephfs.rs`),
//! which says it through `named::NamedShare`; this one lists the kinds (`kinds!`) and
//! is what they share: a class's and a PV's parameters, mount options, ids, and the
//! mount.
//!
//! A mount is made with the new mount API, detached, and attached only once made
//! (`sys::mount::new_mount`): a password or key goes to the kernel as a value of its
//! own, never on a command line or in a file, and a mount given up on (a server that
//! does not answer within the call's deadline) leaves nothing mounted when it ends.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::ShareError;
use super::cephfs::Ceph;
pub use super::named::{
    ClientOptions, Credentials, KindInfo, MountPlan, NamedShare, Role, Settings, SubPath,
    check_host,
};
use super::named::{Keys, octal_mode};
use super::nfs::Nfs;
use super::smb::Smb;
use crate::sys::Errno;
use crate::sys::mount::FsMountError;

/// The kinds of share the driver mounts, each a file of its own that says what it is
/// ([`NamedShare`]): a new kind is one file and one line of the invocation below it.
/// Every question of a kind or a share is asked of its file, through these.
macro_rules! kinds {
    ($($kind:ident => $share:ty),* $(,)?) => {
        /// A kind of share the driver mounts.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        #[serde(rename_all = "lowercase")]
        pub enum Kind {
            $($kind),*
        }

        /// A share a class or a PV names: its server (or cluster) and export, no
        /// directory under it.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum Remote {
            $($kind($share)),*
        }

        impl Kind {
            /// Every kind, in the order a class's keys are asked for them.
            pub const ALL: &'static [Kind] = &[$(Kind::$kind),*];

            /// What the kind's file says it is.
            pub fn info(self) -> &'static KindInfo {
                match self {
                    $(Kind::$kind => &<$share as NamedShare>::INFO),*
                }
            }

            fn client_option(self, key: &str) -> Result<bool, String> {
                match self {
                    $(Kind::$kind => <$share as NamedShare>::client_option(key)),*
                }
            }

            fn credentials(
                self,
                secrets: &HashMap<String, String>,
                client: &ClientOptions,
                role: Role,
            ) -> Result<Credentials, String> {
                match self {
                    $(Kind::$kind => <$share as NamedShare>::credentials(secrets, client, role)),*
                }
            }

            fn class_share(self, keys: &Keys<'_>) -> Result<(Remote, SubPath, bool), String> {
                match self {
                    $(Kind::$kind => {
                        let (share, base, makes_base) = <$share as NamedShare>::class_share(keys)?;
                        Ok((Remote::$kind(share), base, makes_base))
                    }),*
                }
            }

            fn named_in_context(self, keys: &Keys<'_>) -> bool {
                match self {
                    $(Kind::$kind => <$share as NamedShare>::named_in_context(keys)),*
                }
            }

            fn attributes_share(self, keys: &Keys<'_>) -> Result<(Remote, SubPath), String> {
                match self {
                    $(Kind::$kind => {
                        let (share, dir) = <$share as NamedShare>::attributes_share(keys)?;
                        Ok((Remote::$kind(share), dir))
                    }),*
                }
            }

            fn share_of_id_field(self, s: &str) -> Result<Remote, String> {
                match self {
                    $(Kind::$kind => <$share as NamedShare>::from_id_field(s).map(Remote::$kind)),*
                }
            }
        }

        impl Remote {
            pub fn kind(&self) -> Kind {
                match self {
                    $(Remote::$kind(_) => Kind::$kind),*
                }
            }

            /// The share's directory `dir` as its users write it (`//server/share/dir`,
            /// `server:/export/dir`, `CephFS monitors:/dir (fs)`); never a credential.
            pub fn describe(&self, dir: &SubPath) -> String {
                match self {
                    $(Remote::$kind(s) => s.describe(dir)),*
                }
            }

            fn id_field(&self) -> String {
                match self {
                    $(Remote::$kind(s) => s.id_field()),*
                }
            }

            fn context(&self, base: &SubPath, dir: &SubPath) -> Vec<(&'static str, String)> {
                match self {
                    $(Remote::$kind(s) => s.context(base, dir)),*
                }
            }

            fn plans(
                &self,
                dir: &SubPath,
                client: &ClientOptions,
                creds: &Credentials,
                settings: &Settings,
            ) -> Result<(Vec<MountPlan>, String), ShareError> {
                match self {
                    $(Remote::$kind(s) => s.plans(dir, client, creds, settings)),*
                }
            }
        }
    };
}

kinds! {
    Smb => Smb,
    Nfs => Nfs,
    Cephfs => Ceph,
}

impl Kind {
    /// Its name in volume ids and logs.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    fn from_name(s: &str) -> Option<Kind> {
        Kind::ALL.iter().copied().find(|k| k.name() == s)
    }

    /// The file system types the mount table shows for a mount of it.
    pub fn mount_types(self) -> &'static [&'static str] {
        self.info().mount_types
    }
}

/// A share's directory: where a volume lives, or what a static PV shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    pub remote: Remote,
    pub dir: SubPath,
}

impl Location {
    pub fn describe(&self) -> String {
        self.remote.describe(&self.dir)
    }
}

impl Credentials {
    /// The credentials of a mount of `kind` from a request's `secrets`.
    ///
    /// # Errors
    /// The entry that is missing, and the class parameter that supplies it.
    pub fn of(
        kind: Kind,
        secrets: &HashMap<String, String>,
        client: &ClientOptions,
        role: Role,
    ) -> Result<Credentials, String> {
        kind.credentials(secrets, client, role)
    }
}

/// Splits mount flags (a class's or PV's `mountOptions`) between the share's mount
/// and the views: a view's options go to every view of the volume (CIFS `uid=`,
/// `gid=`, `file_mode=`, `dir_mode=`, `noperm` among them, which views give as the
/// CIFS client does), the kernel client's to the share's mount.
///
/// # Errors
/// An option that is neither, or one the class or the Secret gives instead, named.
pub fn split_flags(kind: Kind, flags: &[String]) -> Result<(ClientOptions, Vec<String>), String> {
    let mut client = Vec::new();
    let mut view = Vec::new();
    for item in crate::config::option_items(flags.iter().map(String::as_str)) {
        if crate::config::is_view_item(item) {
            view.push(item.to_string());
            continue;
        }
        let (key, value) = match item.split_once('=') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (item, None),
        };
        match kind.client_option(key) {
            Ok(true) => client.push((key.to_string(), value)),
            Ok(false) => {
                return Err(format!(
                    "unknown option `{key}`: neither a view's nor the {} client's",
                    kind.name()
                ));
            }
            Err(why) => return Err(format!("`{key}`: {why}")),
        }
    }
    Ok((client, view))
}

/// What `onDelete` asks of DeleteVolume (csi-driver-nfs and csi-driver-smb's values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnDelete {
    /// The volume's directory and everything in it are removed.
    #[default]
    Delete,
    /// Nothing is touched.
    Retain,
    /// The directory is renamed `archived-<name>` beside it.
    Archive,
}

impl OnDelete {
    fn parse(s: &str) -> Result<OnDelete, String> {
        match s.to_ascii_lowercase().as_str() {
            "" | "delete" => Ok(OnDelete::Delete),
            "retain" => Ok(OnDelete::Retain),
            "archive" => Ok(OnDelete::Archive),
            _ => Err(format!("onDelete {s:?} is not delete, retain or archive")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            OnDelete::Delete => "delete",
            OnDelete::Retain => "retain",
            OnDelete::Archive => "archive",
        }
    }
}

/// What a dynamic volume's directory is on its share: as it came, or made for native
/// views (the volume's group, setgid) or for views acting as their callers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Traits {
    #[default]
    Plain,
    Native(u32),
    Owners(u32),
}

impl Traits {
    pub fn group(self) -> Option<u32> {
        match self {
            Traits::Plain => None,
            Traits::Native(g) | Traits::Owners(g) => Some(g),
        }
    }
}

/// The prefix of a StorageClass's parameters that are the CO's own
/// (external-provisioner's `--extra-create-metadata`, its secret references).
const CO_PREFIX: &str = "csi.storage.k8s.io/";

/// external-provisioner's `--extra-create-metadata` parameters (v5.3.0
/// pkg/controller/controller.go `pvcNameKey`, `pvcNamespaceKey`, `pvNameKey`), and the
/// `subDir` templates they fill (as csi-driver-nfs's `replaceWithMap` fills them).
const TEMPLATES: [(&str, &str); 3] = [
    ("${pvc.metadata.name}", "csi.storage.k8s.io/pvc/name"),
    (
        "${pvc.metadata.namespace}",
        "csi.storage.k8s.io/pvc/namespace",
    ),
    ("${pv.metadata.name}", "csi.storage.k8s.io/pv/name"),
];

/// A StorageClass's share: where its volumes are made, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Class {
    pub remote: Remote,
    /// The directory under the share that volumes are made in (SMB's `source`'s own
    /// path, CephFS's `rootPath` or `volumes/<subvolumeGroup>`).
    pub base: SubPath,
    /// `subDir` as the class gives it (templates unfilled); `None`: the volume's name.
    pub sub_dir: Option<String>,
    /// `base` is the driver's to make where it is missing (a CephFS `subvolumeGroup`,
    /// which ceph-csi makes on its first volume); the other kinds' is the share's own.
    pub makes_base: bool,
    pub on_delete: OnDelete,
    /// csi-driver-nfs's `mountPermissions`: the mode a new directory of a volume that
    /// is not native gets.
    pub mount_permissions: Option<u32>,
    /// ceph-csi's `volumeNamePrefix` (before the volume's name).
    pub name_prefix: String,
    /// ceph-csi's `pool`: the data pool of a new volume's directory.
    pub pool: Option<String>,
    /// ceph-csi's `kernelMountOptions`.
    pub client: ClientOptions,
}

/// The share a class's `parameters` name, or `None` for a class of the share root
/// (none of `source`, `server`, `share`, `clusterID`, `monitors`, `fsName`). `extra`
/// are the keys the caller takes itself (`view`).
///
/// # Errors
/// An unknown or malformed parameter, named.
pub fn class(params: &BTreeMap<String, String>, extra: &[&str]) -> Result<Option<Class>, String> {
    let keys = Keys::new(params.iter());
    let named: Vec<Kind> = Kind::ALL
        .iter()
        .copied()
        .filter(|k| keys.has_any(k.info().naming_keys))
        .collect();
    let kind = match named.as_slice() {
        [] => return Ok(None),
        [k] => *k,
        _ => {
            let names: Vec<&str> = named.iter().map(|k| k.name()).collect();
            let names = names.join(", ");
            return Err(format!(
                "parameters name shares of several kinds ({names}): give one"
            ));
        }
    };
    let allowed = kind.info().class_keys;
    if let Some((_, key, _)) = keys.0.iter().find(|(l, k, _)| {
        !l.starts_with(CO_PREFIX)
            && !allowed.contains(&l.as_str())
            && !extra.iter().any(|e| e.eq_ignore_ascii_case(k))
    }) {
        return Err(format!(
            "parameters: unknown key {key:?} for a {} share (known: {})",
            kind.name(),
            allowed.join(", ")
        ));
    }
    let bad = |key: &str, why: String| format!("parameters: {key}: {why}");
    let (remote, base, makes_base) = kind.class_share(&keys)?;
    let client = kernel_mount_options(kind, keys.get("kernelmountoptions"))
        .map_err(|w| bad("kernelMountOptions", w))?;
    let mount_permissions =
        octal_mode(keys.get("mountpermissions"), true).map_err(|w| bad("mountPermissions", w))?;
    let sub_dir = keys
        .get("subdir")
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    if let Some(s) = &sub_dir {
        check_template(s).map_err(|w| bad("subDir", w))?;
    }
    Ok(Some(Class {
        remote,
        base,
        sub_dir,
        makes_base,
        on_delete: OnDelete::parse(keys.get("ondelete").unwrap_or_default())
            .map_err(|w| format!("parameters: {w}"))?,
        mount_permissions,
        name_prefix: keys.get("volumenameprefix").unwrap_or_default().to_string(),
        pool: keys
            .get("pool")
            .filter(|p| !p.is_empty())
            .map(str::to_string),
        client,
    }))
}

/// A class's `kernelMountOptions` (ceph-csi's): options of the share's kernel client
/// only, none of a view's.
fn kernel_mount_options(kind: Kind, given: Option<&str>) -> Result<ClientOptions, String> {
    let Some(o) = given else {
        return Ok(Vec::new());
    };
    let (client, view) = split_flags(kind, &[o.to_string()])?;
    if let Some(v) = view.first() {
        return Err(format!(
            "`{v}` is a view's option; give it in the class's mountOptions"
        ));
    }
    Ok(client)
}

/// Checks that `template` uses only the templates external-provisioner fills.
fn check_template(template: &str) -> Result<(), String> {
    let mut rest = template;
    while let Some(i) = rest.find("${") {
        let after = &rest[i..];
        let end = after.find('}').ok_or("has an unclosed ${")?;
        let t = &after[..=end];
        if !TEMPLATES.iter().any(|(name, _)| *name == t) {
            return Err(format!(
                "{t} is not a template (known: {})",
                TEMPLATES.map(|(n, _)| n).join(", ")
            ));
        }
        rest = &after[end + 1..];
    }
    Ok(())
}

impl Class {
    /// The directory below `base` of the volume `name`: `subDir` with its templates
    /// filled from `params` (external-provisioner's `--extra-create-metadata`), else
    /// `volumeNamePrefix` and the name.
    ///
    /// # Errors
    /// A template the provisioner did not fill, or a result that would leave the
    /// share, named.
    pub fn sub_dir(
        &self,
        name: &str,
        params: &BTreeMap<String, String>,
    ) -> Result<SubPath, String> {
        let Some(template) = &self.sub_dir else {
            return SubPath::parse(&format!("{}{name}", self.name_prefix))
                .map_err(|w| format!("name {name:?} {w}"));
        };
        let mut filled = template.clone();
        for (t, key) in TEMPLATES {
            if !filled.contains(t) {
                continue;
            }
            let value = params.get(key).ok_or_else(|| {
                format!(
                    "parameters: subDir uses {t}, but the request has no {key}: run csi-provisioner with --extra-create-metadata"
                )
            })?;
            if value.contains('/') || value == ".." || value == "." || value.is_empty() {
                return Err(format!(
                    "parameters: {key} {value:?} cannot be a directory name"
                ));
            }
            filled = filled.replace(t, value);
        }
        SubPath::parse(filled.trim_matches('/'))
            .map_err(|w| format!("parameters: subDir {template:?} gives {filled:?}, which {w}"))
    }
}

/// The volume context keys of a volume the driver made: its group on the share, and
/// whether its views act as their callers, or why it is not native.
pub const GROUP_KEY: &str = "mountgroup.csi.io/group";
pub const OWNERS_KEY: &str = "mountgroup.csi.io/owners";
pub const NOT_NATIVE_KEY: &str = "mountgroup.csi.io/notNative";

/// What a PV's attributes (its `volumeAttributes`, as kubelet hands them to
/// NodeStageVolume and NodePublishVolume) say of a volume on a named share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    pub location: Location,
    pub traits: Traits,
    /// Why a volume the driver made is not native, as CreateVolume found it.
    pub not_native: Option<String>,
    /// csi-driver-nfs's `mountPermissions`: the staged share's root is given it.
    pub mount_permissions: Option<u32>,
}

/// The named share of a PV's attributes, or `None` for a volume of the share root.
/// Keys that are not a share's are left to the caller (kubelet's, the provisioner's,
/// whatever a static PV's author wrote).
///
/// # Errors
/// A malformed attribute, named.
pub fn attributes(ctx: &HashMap<String, String>) -> Result<Option<Attributes>, String> {
    let keys = Keys::new(ctx.iter());
    let named: Vec<Kind> = Kind::ALL
        .iter()
        .copied()
        .filter(|k| k.named_in_context(&keys))
        .collect();
    let bad = |key: &str, why: String| format!("volume_context.{key}: {why}");
    let sub = keys
        .get("subdir")
        .map(|s| {
            if s.contains("${") {
                return Err(bad(
                    "subDir",
                    format!("{s:?} holds a template no provisioner filled"),
                ));
            }
            SubPath::parse(s.trim_matches('/')).map_err(|w| bad("subDir", w))
        })
        .transpose()?
        .unwrap_or_default();
    let location = match named.as_slice() {
        [] => return Ok(None),
        [kind] => {
            let (remote, dir) = kind.attributes_share(&keys)?;
            Location {
                remote,
                dir: dir.join(&sub),
            }
        }
        _ => return Err("volume_context names shares of several kinds".into()),
    };
    let group = keys
        .get(&GROUP_KEY.to_ascii_lowercase())
        .map(|g| {
            g.parse::<u32>()
                .ok()
                .filter(|g| *g >= super::NATIVE_GROUP_BASE)
                .ok_or_else(|| bad(GROUP_KEY, format!("{g:?} is not a volume's group")))
        })
        .transpose()?;
    let owners = keys.get(&OWNERS_KEY.to_ascii_lowercase()) == Some("true");
    let traits = match (group, owners) {
        (None, false) => Traits::Plain,
        (None, true) => return Err(format!("volume_context: {OWNERS_KEY} without {GROUP_KEY}")),
        (Some(g), false) => Traits::Native(g),
        (Some(g), true) => Traits::Owners(g),
    };
    let mount_permissions =
        octal_mode(keys.get("mountpermissions"), false).map_err(|w| bad("mountPermissions", w))?;
    Ok(Some(Attributes {
        location,
        traits,
        not_native: keys
            .get(&NOT_NATIVE_KEY.to_ascii_lowercase())
            .map(str::to_string),
        mount_permissions,
    }))
}

/// A volume the driver made on a named share, as its id names it:
/// `<kind>#<share>#<base>#<dir>#<onDelete>#<traits>`, each field with `%` and `#`
/// percent-escaped; `<traits>` is empty, `n<group>` (native) or `o<group>` (views act
/// as their callers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MadeVolume {
    pub remote: Remote,
    pub base: SubPath,
    pub dir: SubPath,
    pub on_delete: OnDelete,
    pub traits: Traits,
}

fn escape(s: &str) -> String {
    s.replace('%', "%25").replace('#', "%23")
}

fn unescape(s: &str) -> String {
    s.replace("%23", "#").replace("%25", "%")
}

impl MadeVolume {
    /// Its volume id.
    pub fn id(&self) -> String {
        let traits = match self.traits {
            Traits::Plain => String::new(),
            Traits::Native(g) => format!("n{g}"),
            Traits::Owners(g) => format!("o{g}"),
        };
        [
            self.remote.kind().name().to_string(),
            escape(&self.remote.id_field()),
            escape(self.base.as_str()),
            escape(self.dir.as_str()),
            self.on_delete.name().to_string(),
            traits,
        ]
        .join("#")
    }

    /// The volume an id names, if it is one of ours (`None`: another's, or a static
    /// PV's handle, which names nothing the driver made).
    ///
    /// # Errors
    /// An id of ours that does not parse.
    pub fn from_id(id: &str) -> Option<Result<MadeVolume, String>> {
        let fields: Vec<&str> = id.split('#').collect();
        let [kind, share, base, dir, on_delete, traits] = fields.as_slice() else {
            return None;
        };
        let kind = Kind::from_name(kind)?;
        Some(
            (|| {
                let dir = SubPath::parse(&unescape(dir))?;
                if dir.is_empty() {
                    return Err("names no volume directory".to_string());
                }
                let traits = match traits.split_at_checked(1) {
                    None => Traits::Plain,
                    Some(("n", g)) => Traits::Native(g.parse().map_err(|_| "bad group")?),
                    Some(("o", g)) => Traits::Owners(g.parse().map_err(|_| "bad group")?),
                    Some(_) => return Err(format!("traits {traits:?}")),
                };
                Ok(MadeVolume {
                    remote: kind.share_of_id_field(&unescape(share))?,
                    base: SubPath::parse(&unescape(base))?,
                    dir,
                    on_delete: OnDelete::parse(on_delete)?,
                    traits,
                })
            })()
            .map_err(|why| format!("volume id {id:?}: {why}")),
        )
    }

    /// Where the volume's own directory is.
    pub fn location(&self) -> Location {
        Location {
            remote: self.remote.clone(),
            dir: self.base.join(&self.dir),
        }
    }

    /// The volume context its PV carries: the share as the peers' keys name it, the
    /// volume's directory, and what the driver made of it.
    pub fn context(&self, not_native: Option<&str>) -> HashMap<String, String> {
        let mut ctx = HashMap::new();
        let mut put = |k: &str, v: String| {
            ctx.insert(k.to_string(), v);
        };
        for (key, value) in self.remote.context(&self.base, &self.dir) {
            put(key, value);
        }
        if let Some(g) = self.traits.group() {
            put(GROUP_KEY, g.to_string());
        }
        if matches!(self.traits, Traits::Owners(_)) {
            put(OWNERS_KEY, "true".into());
        }
        if let Some(why) = not_native {
            put(NOT_NATIVE_KEY, why.to_string());
        }
        ctx
    }
}

/// The groups native and acting volumes on named shares get: a hash of the share and
/// the directory, so that a repeated CreateVolume finds the same one with no record
/// kept, in a range of their own above the share root's (which counts up from
/// [`super::NATIVE_GROUP_BASE`]) and below 2^31.
const HASHED_GROUP_BASE: u32 = 2_100_000_000;
const HASHED_GROUPS: u32 = 47_000_000;

/// The group of a volume made at `dir` of `remote`.
pub fn group_of(remote: &Remote, dir: &SubPath) -> u32 {
    use std::hash::Hasher;
    let mut h = fnv::FnvHasher::default();
    h.write(remote.kind().name().as_bytes());
    h.write(b"#");
    h.write(remote.id_field().as_bytes());
    h.write(b"#");
    h.write(dir.as_str().as_bytes());
    HASHED_GROUP_BASE + (h.finish() % u64::from(HASHED_GROUPS)) as u32
}

/// Whether a failed NFS attempt at one version lets the next be tried (mount.nfs
/// falls back on these: utils/mount/stropts.c `nfs_autonegotiate`).
fn falls_back(errno: Errno) -> bool {
    matches!(
        errno.0,
        libc::EPROTONOSUPPORT | libc::EINVAL | libc::ENOENT | libc::EPERM
    )
}

/// The error of a mount the kernel refused, by what it answered.
fn refused(loc: &Location, server: &str, creds: &Credentials, e: &FsMountError) -> ShareError {
    let what = format!("mounting {} (server at {server})", loc.describe());
    let said = if e.said.is_empty() {
        String::new()
    } else {
        format!("; the client said: {}", e.said.join("; "))
    };
    let answer = format!("{}{said}", e.errno);
    match e.errno.0 {
        libc::EACCES | libc::EPERM | libc::EKEYREJECTED | libc::EKEYEXPIRED | libc::ENOKEY => {
            let who = creds
                .user
                .as_deref()
                .map_or_else(|| "this node".to_string(), |u| format!("user {u}"));
            ShareError::Refused(format!(
                "{what}: the server refused access to {who}: {answer} (check the Secret's credentials and the share's access rules)"
            ))
        }
        libc::ENOENT | libc::ENOTDIR | libc::ESTALE => ShareError::NoSuchShare(format!(
            "{what}: the server has no such share or directory: {answer}"
        )),
        libc::ECONNREFUSED
        | libc::EHOSTUNREACH
        | libc::ENETUNREACH
        | libc::EHOSTDOWN
        | libc::ETIMEDOUT
        | libc::ECONNRESET
        | libc::ECONNABORTED
        | libc::ENETDOWN
        | libc::EPIPE
        | libc::EAGAIN
        | libc::EIO => ShareError::Unreachable(format!(
            "{what}: the server does not serve it now: {answer}"
        )),
        libc::EINVAL | libc::EPROTONOSUPPORT | libc::EOPNOTSUPP => {
            let key = e
                .key
                .as_deref()
                .map_or(String::new(), |k| format!(" ({k})"));
            ShareError::Rejected(format!(
                "{what}: the client refused its options{key}: {answer}"
            ))
        }
        libc::ENODEV if e.call == "fsopen" => ShareError::Backend(format!(
            "{what}: this node's kernel has no {} file system (load its module)",
            loc.remote.kind().mount_types()[0]
        )),
        _ => ShareError::Backend(format!("{what}: {} failed: {answer}", e.call)),
    }
}

/// Mounts `loc` (detached: attach it, or drop it) with the kernel's client, its
/// `client` options and `creds`, waiting no longer than `within`: a server that does
/// not answer by then is [`ShareError::TimedOut`], and the mount, should it end later,
/// is let go of unattached. `hold` is dropped once the kernel has answered, whenever
/// that is (a caller's guard that keeps a second mount of the same place from starting
/// meanwhile).
///
/// # Errors
/// The server's answer, mapped by what it means ([`refused`]); a credential never
/// appears in it.
pub fn mount(
    loc: &Location,
    client: &ClientOptions,
    creds: &Credentials,
    settings: &Settings,
    within: Duration,
    hold: impl Send + 'static,
) -> Result<OwnedFd, ShareError> {
    let (loc2, client, creds, settings) =
        (loc.clone(), client.clone(), creds.clone(), settings.clone());
    let (sent, answer) = std::sync::mpsc::sync_channel(1);
    let described = loc.describe();
    std::thread::Builder::new()
        .name("share-mount".into())
        .spawn(move || {
            let made = (|| {
                if let Some(ns) = &settings.net_ns {
                    crate::sys::process::enter_net_namespace(ns).map_err(|errno| {
                        ShareError::Io {
                            what: format!("the network namespace {} for the mount", ns.display()),
                            errno,
                        }
                    })?;
                }
                let (plans, server) = loc2.remote.plans(&loc2.dir, &client, &creds, &settings)?;
                let mut first = None;
                for plan in &plans {
                    match plan.mount() {
                        Ok(fd) => return Ok(fd),
                        Err(e) => {
                            let fall = falls_back(e.errno);
                            first.get_or_insert_with(|| refused(&loc2, &server, &creds, &e));
                            if !fall {
                                break;
                            }
                            tracing::debug!(share = %loc2.describe(), fstype = plan.fstype, error = %e, "trying the next version");
                        }
                    }
                }
                Err(first.unwrap_or_else(|| ShareError::Backend("no way to mount it".into())))
            })();
            drop(hold);
            // A mount made after the caller gave up is dropped here, unattached.
            let _ = sent.send(made);
        })
        .map_err(|e| ShareError::Backend(format!("mounting {described}: cannot start a thread: {e}")))?;
    answer.recv_timeout(within).unwrap_or_else(|_| {
        Err(ShareError::TimedOut(format!(
            "mounting {described}: the server did not answer within {} s; nothing is mounted",
            within.as_secs_f64().round()
        )))
    })
}

/// A share mounted in the driver's own work directory for the length of a call
/// (CreateVolume, DeleteVolume, ControllerExpandVolume): unmounted, and its
/// directory removed, on drop.
pub struct Attached {
    pub path: PathBuf,
}

impl Attached {
    /// Attaches the detached mount `fd` at a new directory of `work_dir` (made `0700`).
    ///
    /// # Errors
    /// Why it cannot be attached.
    pub fn new(fd: &OwnedFd, work_dir: &Path) -> Result<Attached, ShareError> {
        let failed =
            |what: String| move |e: std::io::Error| ShareError::Backend(format!("{what}: {e}"));
        std::fs::create_dir_all(work_dir).map_err(failed(format!("{}", work_dir.display())))?;
        std::fs::set_permissions(
            work_dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .map_err(failed(format!("{}", work_dir.display())))?;
        let path = work_dir.join(format!("share-{:032x}", crate::sys::process::random_u128()));
        std::fs::create_dir(&path).map_err(failed(format!("{}", path.display())))?;
        if let Err(e) = crate::sys::mount::attach_detached(fd.as_fd(), &path) {
            let _ = std::fs::remove_dir(&path);
            return Err(ShareError::Io {
                what: format!("attaching the share at {}", path.display()),
                errno: e,
            });
        }
        Ok(Attached { path })
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        if let Err(e) = crate::sys::mount::unmount_lazy(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot unmount the share the call mounted");
        }
        let _ = std::fs::remove_dir(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn paths_below_a_share_never_leave_it() {
        for bad in ["/etc", "a/../b", "..", "a//b", "a/", "./a", "a\nb"] {
            assert!(SubPath::parse(bad).is_err(), "{bad:?}");
        }
        let p = SubPath::parse("team/pvc-1").unwrap();
        assert_eq!(p.components().collect::<Vec<_>>(), ["team", "pvc-1"]);
        assert_eq!(SubPath::default().join(&p), p);
        assert_eq!(
            SubPath::parse("a").unwrap().join(&p).as_str(),
            "a/team/pvc-1"
        );
    }

    /// The peers' own StorageClasses, with only the provisioner changed: their
    /// parameters as external-provisioner hands them over (secret references taken
    /// out, `--extra-create-metadata` keys added).
    #[test]
    fn the_peers_classes_name_their_shares() {
        let metadata = [
            ("csi.storage.k8s.io/pvc/name", "data"),
            ("csi.storage.k8s.io/pvc/namespace", "team"),
            ("csi.storage.k8s.io/pv/name", "pvc-1"),
        ];
        // csi-driver-smb deploy/example/storageclass-smb.yaml
        let mut smb = params(&[("source", "//smb-server.default.svc.cluster.local/share")]);
        smb.extend(params(&metadata));
        let c = class(&smb, &[]).unwrap().unwrap();
        assert_eq!(c.remote.kind(), Kind::Smb);
        assert_eq!(c.sub_dir("pvc-1", &smb).unwrap().as_str(), "pvc-1");
        // csi-driver-nfs deploy/example/storageclass-nfs.yaml, with its subDir example
        let mut nfs = params(&[
            ("server", "nfs-server.default.svc.cluster.local"),
            ("share", "/"),
            ("subDir", "${pvc.metadata.namespace}/${pvc.metadata.name}"),
            ("mountPermissions", "0777"),
            ("onDelete", "archive"),
        ]);
        nfs.extend(params(&metadata));
        let c = class(&nfs, &[]).unwrap().unwrap();
        assert_eq!(c.sub_dir("pvc-1", &nfs).unwrap().as_str(), "team/data");
        assert_eq!(
            (c.on_delete, c.mount_permissions),
            (OnDelete::Archive, Some(0o777))
        );
        // ceph-csi examples/cephfs/storageclass.yaml
        let ceph = params(&[
            ("clusterID", "rook-ceph"),
            ("fsName", "myfs"),
            ("pool", "myfs-replicated"),
            ("mounter", "kernel"),
            ("kernelMountOptions", "ms_mode=secure"),
        ]);
        let c = class(&ceph, &[]).unwrap().unwrap();
        assert_eq!(c.client, vec![("ms_mode".into(), Some("secure".into()))]);
        assert_eq!(
            class(&params(&[("view", "fuse")]), &["view"]).unwrap(),
            None
        );
    }

    #[test]
    fn bad_parameters_are_refused_by_name_before_anything_is_mounted() {
        let msg = |p: &[(&str, &str)]| class(&params(p), &["view"]).unwrap_err();
        assert!(msg(&[("source", "smb-server/share")]).contains("source"));
        assert!(msg(&[("server", "s"), ("share", "data")]).contains("absolute"));
        assert!(msg(&[("server", "s")]).contains("both"));
        assert!(msg(&[("source", "//s/share"), ("colour", "red")]).contains("\"colour\""));
        assert!(msg(&[("source", "//s/x"), ("server", "s")]).contains("several"));
        assert!(msg(&[("source", "//s/x/../y")]).contains(".."));
        assert!(msg(&[("source", "//s/x"), ("subDir", "${pod.name}")]).contains("template"));
        assert!(
            msg(&[("server", "s"), ("share", "/"), ("onDelete", "shred")]).contains("onDelete")
        );
        assert!(msg(&[("clusterID", "c"), ("mounter", "fuse")]).contains("kernel"));
        assert!(msg(&[("clusterID", "c"), ("kernelMountOptions", "ro")]).contains("view"));
        let c = class(
            &params(&[
                ("server", "s"),
                ("share", "/"),
                ("subDir", "../${pvc.metadata.name}"),
            ]),
            &[],
        )
        .unwrap()
        .unwrap();
        let filled = params(&[("csi.storage.k8s.io/pvc/name", "x")]);
        assert!(c.sub_dir("pvc-1", &filled).unwrap_err().contains(".."));
        let c = class(
            &params(&[
                ("server", "s"),
                ("share", "/"),
                ("subDir", "${pvc.metadata.name}"),
            ]),
            &[],
        )
        .unwrap()
        .unwrap();
        assert!(
            c.sub_dir("pvc-1", &BTreeMap::new())
                .unwrap_err()
                .contains("--extra-create-metadata")
        );
        let evil = params(&[("csi.storage.k8s.io/pvc/name", "..")]);
        assert!(c.sub_dir("pvc-1", &evil).is_err());
    }

    #[test]
    fn mount_options_go_to_the_share_or_to_the_views() {
        let flags = |f: &[&str]| f.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // csi-driver-smb's class's mountOptions
        let (client, view) = split_flags(
            Kind::Smb,
            &flags(&[
                "dir_mode=0777",
                "file_mode=0777",
                "uid=1001",
                "gid=1001",
                "noperm",
                "mfsymlinks",
                "cache=strict",
                "noserverino",
            ]),
        )
        .unwrap();
        assert_eq!(
            view,
            [
                "dir_mode=0777",
                "file_mode=0777",
                "uid=1001",
                "gid=1001",
                "noperm"
            ]
        );
        assert_eq!(
            client.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["mfsymlinks", "cache", "noserverino"]
        );
        let (client, view) =
            split_flags(Kind::Nfs, &flags(&["nfsvers=4.1", "hard,nconnect=4", "ro"])).unwrap();
        assert_eq!(client.len(), 3);
        assert_eq!(view, ["ro"]);
        assert!(
            split_flags(Kind::Nfs, &flags(&["colour=red"]))
                .unwrap_err()
                .contains("`colour`")
        );
        assert!(
            split_flags(Kind::Smb, &flags(&["password=x"]))
                .unwrap_err()
                .contains("Secret")
        );
    }

    #[test]
    fn the_peers_static_pvs_name_their_shares() {
        let ctx = |p: &[(&str, &str)]| -> HashMap<String, String> {
            p.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        // csi-driver-smb deploy/example/pv-smb.yaml
        let a = attributes(&ctx(&[(
            "source",
            "//smb-server.default.svc.cluster.local/share",
        )]))
        .unwrap()
        .unwrap();
        assert_eq!(
            a.location.describe(),
            "//smb-server.default.svc.cluster.local/share"
        );
        assert_eq!(a.traits, Traits::Plain);
        // csi-driver-nfs deploy/example/pv-nfs-csi.yaml
        let a = attributes(&ctx(&[
            ("server", "nfs-server.default.svc.cluster.local"),
            ("share", "/"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            a.location.describe(),
            "nfs-server.default.svc.cluster.local:/"
        );
        // ceph-csi docs/static-pvc.md
        let a = attributes(&ctx(&[
            ("clusterID", "rook-ceph"),
            ("fsName", "myfs"),
            ("staticVolume", "true"),
            ("rootPath", "/volumes/testGroup/testSubVolume"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(a.location.dir.as_str(), "volumes/testGroup/testSubVolume");
        // An inline volume's own `source`, and a volume of the share root.
        assert_eq!(attributes(&ctx(&[("source", "share")])).unwrap(), None);
        assert_eq!(
            attributes(&ctx(&[("csi.storage.k8s.io/pod.name", "p")])).unwrap(),
            None
        );
        assert!(attributes(&ctx(&[("source", "//s/x"), ("subDir", "../../etc")])).is_err());
    }

    #[test]
    fn ids_of_made_volumes_round_trip_and_others_are_not_ours() {
        let (smb, base) = Smb::parse_source("//server/share/a#b%c").unwrap();
        let v = MadeVolume {
            remote: Remote::Smb(smb),
            base,
            dir: SubPath::parse("pvc-1").unwrap(),
            on_delete: OnDelete::Archive,
            traits: Traits::Plain,
        };
        assert!(!v.id().contains("a#b"), "{}", v.id());
        assert_eq!(MadeVolume::from_id(&v.id()).unwrap().unwrap(), v);
        let n = MadeVolume {
            remote: Remote::Nfs(Nfs::parse("10.0.0.2", "/exports").unwrap()),
            base: SubPath::default(),
            dir: SubPath::parse("team/data").unwrap(),
            on_delete: OnDelete::Delete,
            traits: Traits::Owners(2_100_000_001),
        };
        assert_eq!(MadeVolume::from_id(&n.id()).unwrap().unwrap(), n);
        let back = attributes(&n.context(None)).unwrap().unwrap();
        assert_eq!((back.location, back.traits), (n.location(), n.traits));
        for not_ours in [
            "pvc-1",
            "smb-server.default.svc.cluster.local/share##",
            "x#y",
        ] {
            assert!(MadeVolume::from_id(not_ours).is_none(), "{not_ours}");
        }
        assert!(
            MadeVolume::from_id("nfs#10.0.0.2:/e##..#delete#")
                .unwrap()
                .is_err()
        );
        assert_eq!(group_of(&n.remote, &n.dir), group_of(&n.remote, &n.dir));
        assert!(group_of(&n.remote, &n.dir) >= HASHED_GROUP_BASE);
    }

    /// Every kind a `kinds!` line lists is named in a volume id and in a PV's context
    /// by its own file, and both read back to the same volume.
    #[test]
    fn every_kind_names_its_volumes_in_ids_and_contexts_that_read_back() {
        let (smb, smb_base) = Smb::parse_source("//server/share/base").unwrap();
        let remotes = [
            (Remote::Smb(smb), smb_base),
            (
                Remote::Nfs(Nfs::parse("10.0.0.2", "/exports").unwrap()),
                SubPath::default(),
            ),
            (
                Remote::Cephfs(Ceph::parse(Some("10.0.0.3:6789"), None, Some("fs")).unwrap()),
                SubPath::parse("volumes/csi").unwrap(),
            ),
        ];
        let kinds: Vec<Kind> = remotes.iter().map(|(r, _)| r.kind()).collect();
        assert_eq!(kinds, Kind::ALL, "one volume of each kind");
        for (remote, base) in remotes {
            let kind = remote.kind();
            assert_eq!(Kind::from_name(kind.name()), Some(kind));
            let v = MadeVolume {
                remote,
                base,
                dir: SubPath::parse("pvc-1").unwrap(),
                on_delete: OnDelete::Delete,
                traits: Traits::Native(2_100_000_002),
            };
            assert_eq!(
                MadeVolume::from_id(&v.id()).unwrap().unwrap(),
                v,
                "{kind:?}"
            );
            let back = attributes(&v.context(None)).unwrap().unwrap();
            assert_eq!(
                (back.location, back.traits),
                (v.location(), v.traits),
                "{kind:?}"
            );
        }
    }
}
