//! The words every kind of named share speaks (smb.rs, nfs.rs, cephfs.rs, and
//! remote.rs above them): a path below a share, a server's name, who asks for a mount
//! and with which credentials, a kernel client's options, and a mount to make.

use std::collections::HashMap;
use std::net::{IpAddr, ToSocketAddrs};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Duration;

use super::ShareError;
use crate::sys::mount::{FsMountError, FsParam};

/// What a kind of named share is, as its file says it.
pub struct KindInfo {
    /// Its name in volume ids and logs.
    pub name: &'static str,
    /// The file system types the mount table shows for a mount of it.
    pub mount_types: &'static [&'static str],
    /// The keys by which a class or a PV names a share of it (lower case).
    pub naming_keys: &'static [&'static str],
    /// The keys a class of it may give (lower case).
    pub class_keys: &'static [&'static str],
}

/// A kind of share the driver mounts, as its own file (smb.rs, nfs.rs, cephfs.rs)
/// says it: which keys name it and what a class may give, the share a class or a PV
/// names, how it is described, named in a volume id and in a PV's context, with which
/// credentials and how it is mounted. remote.rs lists the kinds (`kinds!`): a new kind
/// is one file and one line there.
pub trait NamedShare: Sized {
    const INFO: KindInfo;

    /// Whether `key` is an option of its kernel client a class may give the share's
    /// mount, or what gives it instead.
    fn client_option(key: &str) -> Result<bool, String>;

    /// The credentials of a mount of it, from a request's `secrets` (`role` says
    /// whose Secret they are), its client's options given.
    fn credentials(
        secrets: &HashMap<String, String>,
        client: &ClientOptions,
        role: Role,
    ) -> Result<Credentials, String>;

    /// The share a class's parameters name, the directory under it that volumes are
    /// made in, and whether that directory is the driver's to make where it is missing.
    fn class_share(keys: &Keys<'_>) -> Result<(Self, SubPath, bool), String>;

    /// Whether a PV's attributes name a share of this kind.
    fn named_in_context(keys: &Keys<'_>) -> bool {
        keys.has_any(Self::INFO.naming_keys)
    }

    /// The share a PV's attributes name, and the directory that its `subDir` is below.
    fn attributes_share(keys: &Keys<'_>) -> Result<(Self, SubPath), String>;

    /// The share a volume id's share field names ([`NamedShare::id_field`]).
    fn from_id_field(s: &str) -> Result<Self, String>;

    /// The share in a volume id.
    fn id_field(&self) -> String;

    /// The share's directory `dir` as its users write it; never a credential.
    fn describe(&self, dir: &SubPath) -> String;

    /// The volume context of a volume at `dir` below `base`: the share as the peers'
    /// keys name it.
    fn context(&self, base: &SubPath, dir: &SubPath) -> Vec<(&'static str, String)>;

    /// How `dir` of the share is mounted: the attempts in order, and the server's
    /// address for messages.
    fn plans(
        &self,
        dir: &SubPath,
        client: &ClientOptions,
        creds: &Credentials,
        settings: &Settings,
    ) -> Result<(Vec<MountPlan>, String), ShareError>;
}

/// A path below a share: relative, of components that are neither empty, `.` nor
/// `..`, no NUL and no control character; empty for the share itself. It can never
/// name a path outside the share (the driver also walks it with `RESOLVE_BENEATH` and
/// no symlinks, so that a symlink planted on the share leads nowhere).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubPath(String);

/// The longest path below a share taken.
const MAX_SUB_PATH: usize = 1024;

impl SubPath {
    /// Validates a path below a share.
    ///
    /// # Errors
    /// What is wrong with it.
    pub fn parse(s: &str) -> Result<SubPath, String> {
        if s.is_empty() {
            return Ok(SubPath::default());
        }
        if s.len() > MAX_SUB_PATH {
            return Err(format!("is longer than {MAX_SUB_PATH} bytes"));
        }
        if s.starts_with('/') {
            return Err("is absolute; it must be a path below the share".into());
        }
        if s.chars().any(char::is_control) {
            return Err("holds a control character".into());
        }
        for c in s.split('/') {
            match c {
                "" => return Err("has an empty component (`//` or a trailing `/`)".into()),
                "." | ".." => return Err(format!("has a `{c}` component")),
                _ => {}
            }
        }
        Ok(SubPath(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// This path, then `more` below it.
    pub fn join(&self, more: &SubPath) -> SubPath {
        match (self.is_empty(), more.is_empty()) {
            (true, _) => more.clone(),
            (_, true) => self.clone(),
            _ => SubPath(format!("{}/{}", self.0, more.0)),
        }
    }

    /// Its components, in order.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/').filter(|c| !c.is_empty())
    }
}

/// Checks a server's name: a DNS name or an IP address.
///
/// # Errors
/// What is wrong with it.
pub fn check_host(host: &str) -> Result<(), String> {
    if host.is_empty() {
        return Err("no server".into());
    }
    if host.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    if host.len() > 253 {
        return Err("the server's name is longer than 253 characters".into());
    }
    if let Some(c) = host
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')))
    {
        return Err(format!("the server's name holds {c:?}"));
    }
    Ok(())
}

/// Who asks for a mount, and so which Secret carries its credentials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Provisioner,
    ControllerExpand,
    NodeStage,
}

impl Role {
    pub fn secret_name(self) -> &'static str {
        match self {
            Role::Provisioner => "provisioner",
            Role::ControllerExpand => "controller-expand",
            Role::NodeStage => "node-stage",
        }
    }

    pub fn storage_class_parameter(self) -> &'static str {
        match self {
            Role::Provisioner => "csi.storage.k8s.io/provisioner-secret-name",
            Role::ControllerExpand => "csi.storage.k8s.io/controller-expand-secret-name",
            Role::NodeStage => "csi.storage.k8s.io/node-stage-secret-name",
        }
    }
}

/// The credentials of a mount: a user, its password or key, a domain. Never printed:
/// `Debug` shows only whether each is there.
#[derive(Clone, Default)]
pub struct Credentials {
    pub user: Option<String>,
    pub secret: Option<String>,
    pub domain: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("domain", &self.domain)
            .finish()
    }
}

/// Options of a share's kernel client, in the order given.
pub type ClientOptions = Vec<(String, Option<String>)>;

/// A mount to make: its type, its source, its parameters in order, and the values
/// that are secret (never in a message).
pub struct MountPlan {
    pub fstype: &'static str,
    pub source: String,
    params: Vec<(String, Option<String>)>,
    secrets: Vec<String>,
}

impl MountPlan {
    pub fn new(fstype: &'static str, source: String) -> MountPlan {
        MountPlan {
            fstype,
            source,
            params: Vec::new(),
            secrets: Vec::new(),
        }
    }

    pub fn push(&mut self, key: &str, value: Option<String>) {
        self.params.push((key.to_string(), value));
    }

    /// A parameter whose value is a secret.
    pub fn secret(&mut self, key: &str, value: &str) {
        self.secrets.push(value.to_string());
        self.push(key, Some(value.to_string()));
    }

    pub fn extend<'a>(&mut self, more: impl Iterator<Item = &'a (String, Option<String>)>) {
        self.params.extend(more.cloned());
    }

    /// Its parameters' keys, in order.
    pub fn keys(&self) -> Vec<&str> {
        self.params.iter().map(|(k, _)| k.as_str()).collect()
    }

    pub(super) fn mount(&self) -> Result<OwnedFd, FsMountError> {
        let mut params = vec![FsParam::Str("source", &self.source)];
        params.extend(self.params.iter().map(|(k, v)| match v {
            Some(v) => FsParam::Str(k, v),
            None => FsParam::Flag(k),
        }));
        crate::sys::mount::new_mount(self.fstype, &params, false).map_err(|mut e| {
            for said in &mut e.said {
                for s in &self.secrets {
                    if !s.is_empty() {
                        *said = said.replace(s.as_str(), "<redacted>");
                    }
                }
            }
            e
        })
    }
}

/// Parameters of a class's share, every key matched without regard to case, as the
/// peers match them (csi-driver-nfs `newNFSVolume`, csi-driver-smb `newSMBVolume`).
pub struct Keys<'a>(pub(super) Vec<(String, &'a str, &'a str)>);

impl<'a> Keys<'a> {
    pub fn new(map: impl Iterator<Item = (&'a String, &'a String)>) -> Keys<'a> {
        Keys(
            map.map(|(k, v)| (k.to_ascii_lowercase(), k.as_str(), v.as_str()))
                .collect(),
        )
    }

    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.0.iter().find(|(l, _, _)| l == key).map(|(_, _, v)| *v)
    }

    pub fn has_any(&self, keys: &[&str]) -> bool {
        keys.iter().any(|k| self.get(k).is_some())
    }
}

/// A mode a class or a PV gives in octal (csi-driver-nfs's `mountPermissions`), with
/// a `0o` before it where `prefixed` allows one; `None` for none (empty, or 0).
///
/// # Errors
/// A value that is not an octal mode.
pub fn octal_mode(v: Option<&str>, prefixed: bool) -> Result<Option<u32>, String> {
    let Some(v) = v.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let digits = if prefixed {
        v.trim_start_matches("0o")
    } else {
        v
    };
    let mode = u32::from_str_radix(digits, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("{v:?} is not an octal mode"))?;
    Ok(Some(mode).filter(|m| *m != 0))
}

/// What a driver's mounts of named shares need from its configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Where the controller mounts a share for the length of a call (root's only).
    pub work_dir: PathBuf,
    /// ceph-csi's configuration file, for `clusterID`.
    pub ceph_config: PathBuf,
    /// The longest a mount may take when the request carries no deadline of its own.
    pub timeout: Duration,
    /// The network namespace a mount's sockets are made in (the host's, for a node
    /// plugin in a pod of its own, whose namespace goes with the pod); `None`: the
    /// driver's own.
    pub net_ns: Option<PathBuf>,
}

/// The first address `host` resolves to (`port` for the lookup only).
pub(super) fn resolve(host: &str, port: u16) -> Result<IpAddr, String> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(ip);
    }
    (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("the server's name {host} does not resolve: {e}"))?
        .next()
        .map(|a| a.ip())
        .ok_or_else(|| format!("the server's name {host} resolves to no address"))
}
