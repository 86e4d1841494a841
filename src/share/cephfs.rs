//! CephFS, the kernel's client: the file systems a StorageClass or a PV names as
//! ceph-csi's do (its `clusterID`, resolved to monitors through ceph-csi's own
//! configuration file, or `monitors` directly; `fsName`; a static PV's `rootPath`),
//! with the Secret keys ceph-csi uses (`userID`/`userKey`, `adminID`/`adminKey`:
//! ceph-csi internal/util/credentials.go).
//!
//! Capacity enforced by CephFS: each volume's directory carries a quota
//! (`ceph.quota.max_bytes`, a virtual extended attribute the MDS keeps), which every
//! client of the file system enforces on every node, for root too: a write past it
//! fails with `EDQUOT`. Setting one needs the `p` flag in the client's MDS caps
//! (`allow rwp`); reading the quota and the directory's recursive size
//! (`ceph.dir.rbytes`) does not. Quotas are enforced by the clients, cooperatively and
//! with some lag (the CephFS documentation, *Quotas*): a burst can pass the limit by a
//! little before the MDS tells the clients.

use std::ffi::CStr;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::path::Path;

use super::ShareError;
use super::named::{
    ClientOptions, Credentials, Keys, KindInfo, MountPlan, NamedShare, Role, Settings, SubPath,
    resolve,
};
use crate::sys::{Errno, file, xattr};

use crate::sys::cephfs::{CEPH_DIR_RBYTES as RBYTES, CEPH_QUOTA_MAX_BYTES as MAX_BYTES};

/// Whether `path` is on CephFS.
pub fn is_cephfs(path: &Path) -> bool {
    file::open_root(path).is_ok_and(|fd| file::is_cephfs(fd.as_fd()))
}

fn number(path: &Path, name: &CStr) -> Result<u64, ShareError> {
    let failed = |errno| ShareError::Io {
        what: format!("{} of {}", name.to_string_lossy(), path.display()),
        errno,
    };
    let fd = file::open_root(path).map_err(failed)?;
    crate::sys::cephfs::ceph_number(fd.as_fd(), name).map_err(failed)
}

/// Limits the directory at `path` to `bytes`.
///
/// # Errors
/// `EACCES` where the client's caps lack the `p` flag, named as such.
pub fn limit(path: &Path, bytes: u64) -> Result<(), ShareError> {
    let fd = file::open_root(path).map_err(|errno| ShareError::Io {
        what: format!("volume directory {}", path.display()),
        errno,
    })?;
    xattr::set(fd.as_fd(), MAX_BYTES, bytes.to_string().as_bytes(), 0).map_err(|errno| {
        if errno == Errno(libc::EACCES) || errno == Errno(libc::EPERM) {
            ShareError::Backend(format!(
                "setting the CephFS quota of {} was refused ({errno}): the node's CephFS client needs the p flag in its MDS caps (allow rwp; docs/CAPACITY.md)",
                path.display()
            ))
        } else {
            ShareError::Io {
                what: format!("CephFS quota of {}", path.display()),
                errno,
            }
        }
    })
}

/// Whether quotas can be set on the share: its `volumes` directory's own quota is
/// written back as it is (0, none, as a rule), which needs the same caps as a volume's.
///
/// # Errors
/// Why not.
pub fn can_limit(volumes: &Path) -> Result<(), ShareError> {
    limit(volumes, number(volumes, MAX_BYTES)?)
}

/// The quota of the directory at `path` in bytes (`None`: none, or unreadable).
pub fn limit_bytes(path: &Path) -> Option<u64> {
    number(path, MAX_BYTES).ok().filter(|b| *b > 0)
}

/// Bytes the directory at `path` holds, recursively.
pub fn used_bytes(path: &Path) -> Option<u64> {
    number(path, RBYTES).ok()
}

/// Where the monitors of a Ceph cluster are: listed, or named by the cluster's id in
/// ceph-csi's configuration file (its ConfigMap `ceph-csi-config`, `config.json`:
/// `[{"clusterID": "...", "monitors": ["10.0.0.1:6789", ...]}]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Monitors {
    Listed(Vec<String>),
    Cluster(String),
}

/// A CephFS file system: its cluster's monitors and its name (the cluster's default
/// file system where none is named).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ceph {
    pub monitors: Monitors,
    pub fs_name: Option<String>,
}

/// Options of the kernel's CephFS client and libceph a class may give the share's
/// mount (fs/ceph/super.c `ceph_mount_parameters`, net/ceph/ceph_common.c
/// `ceph_parameters`), but those that name the file system, its monitors and the
/// credentials.
const CLIENT: &[&str] = &[
    "acl",
    "noacl",
    "asyncreaddir",
    "noasyncreaddir",
    "caps_max",
    "caps_wanted_delay_max",
    "caps_wanted_delay_min",
    "write_congestion_kb",
    "copyfrom",
    "nocopyfrom",
    "dcache",
    "nodcache",
    "dirstat",
    "nodirstat",
    "fsc",
    "nofsc",
    "ino32",
    "noino32",
    "poolperm",
    "nopoolperm",
    "quotadf",
    "noquotadf",
    "rasize",
    "rbytes",
    "norbytes",
    "readdir_max_bytes",
    "readdir_max_entries",
    "recover_session",
    "require_active_mds",
    "norequire_active_mds",
    "rsize",
    "wsize",
    "snapdirname",
    "wsync",
    "nowsync",
    "sparseread",
    "nosparseread",
    "mount_timeout",
    "osd_idle_ttl",
    "osdkeepalive",
    "osd_request_timeout",
    "read_from",
    "ms_mode",
    "crc",
    "nocrc",
    "cephx_require_signatures",
    "nocephx_require_signatures",
    "cephx_sign_messages",
    "nocephx_sign_messages",
    "tcp_nodelay",
    "notcp_nodelay",
    "share",
    "noshare",
    "abort_on_full",
];

/// Options that name what the class and the Secret give.
const GIVEN: &[(&str, &str)] = &[
    ("name", "the Secret's userID or adminID"),
    ("secret", "the Secret's userKey or adminKey"),
    ("secretfile", "the Secret's userKey or adminKey"),
    ("key", "the Secret's userKey or adminKey"),
    ("fs", "fsName"),
    ("mds_namespace", "fsName"),
    ("mon_addr", "monitors or clusterID"),
    ("fsid", "clusterID"),
    ("source", "monitors, fsName and rootPath"),
];

/// Whether `key` is a CephFS client option a class may give, or what gives it instead.
pub fn client_option(key: &str) -> Result<bool, String> {
    if let Some((_, instead)) = GIVEN.iter().find(|(k, _)| *k == key) {
        return Err(format!(
            "{key} comes from {instead}, not from mount options"
        ));
    }
    Ok(CLIENT.contains(&key))
}

/// Where ceph-csi's configuration file is mounted in its pods, and so where a
/// `clusterID` is looked up (ceph-csi internal/util/csiconfig.go `CsiConfigFile`).
pub const CEPH_CSI_CONFIG: &str = "/etc/ceph-csi-config/config.json";

impl Ceph {
    /// A file system from a class's or a PV's `monitors` or `clusterID`, and `fsName`.
    ///
    /// # Errors
    /// What is wrong with them.
    pub fn parse(
        monitors: Option<&str>,
        cluster: Option<&str>,
        fs_name: Option<&str>,
    ) -> Result<Ceph, String> {
        let monitors = match (monitors, cluster) {
            (Some(m), _) => {
                let listed: Vec<String> = m
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect();
                if listed.is_empty() {
                    return Err("monitors is empty".into());
                }
                for mon in &listed {
                    let (host, _) =
                        split_port(mon).map_err(|why| format!("monitors: {mon:?} {why}"))?;
                    super::named::check_host(host)
                        .map_err(|why| format!("monitors: {mon:?}: {why}"))?;
                }
                Monitors::Listed(listed)
            }
            (None, Some(c))
                if !c.is_empty()
                    && c.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) =>
            {
                Monitors::Cluster(c.to_string())
            }
            (None, Some(c)) => return Err(format!("clusterID {c:?} is not a cluster id")),
            (None, None) => return Err("monitors or clusterID missing".into()),
        };
        if let Some(f) = fs_name {
            if f.is_empty()
                || !f
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            {
                return Err(format!("fsName {f:?} is not a file system's name"));
            }
        }
        Ok(Ceph {
            monitors,
            fs_name: fs_name.map(str::to_string),
        })
    }

    /// The monitors to ask: listed, or from ceph-csi's configuration file at `config`.
    ///
    /// # Errors
    /// Why the cluster's monitors cannot be found.
    pub fn monitor_list(&self, config: &Path) -> Result<Vec<String>, String> {
        let cluster = match &self.monitors {
            Monitors::Listed(m) => return Ok(m.clone()),
            Monitors::Cluster(c) => c,
        };
        let body = std::fs::read(config).map_err(|e| {
            format!(
                "clusterID {cluster}: ceph-csi's configuration {} cannot be read ({e}): mount ceph-csi's ConfigMap there, or give the class monitors",
                config.display()
            )
        })?;
        let entries: Vec<serde_json::Value> = serde_json::from_slice(&body)
            .map_err(|e| format!("ceph-csi's configuration {}: {e}", config.display()))?;
        let entry = entries
            .iter()
            .find(|e| e["clusterID"].as_str() == Some(cluster.as_str()))
            .ok_or_else(|| {
                format!(
                    "clusterID {cluster} is not in ceph-csi's configuration {}",
                    config.display()
                )
            })?;
        let mons: Vec<String> = entry["monitors"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|m| m.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        if mons.is_empty() {
            return Err(format!(
                "clusterID {cluster} has no monitors in {}",
                config.display()
            ));
        }
        Ok(mons)
    }

    /// How the kernel's client mounts `dir` of the file system from the monitors at
    /// `addrs` (each `ip:port`), with `client` options and the credentials.
    pub fn plan(
        &self,
        addrs: &[String],
        dir: &SubPath,
        client: &[(String, Option<String>)],
        creds: &Credentials,
    ) -> MountPlan {
        let mut plan = MountPlan::new("ceph", format!("{}:/{}", addrs.join(","), dir.as_str()));
        if let Some(user) = &creds.user {
            plan.push("name", Some(user.clone()));
        }
        if let Some(key) = &creds.secret {
            plan.secret("secret", key);
        }
        if let Some(fs) = &self.fs_name {
            plan.push("mds_namespace", Some(fs.clone()));
        }
        plan.extend(client.iter());
        plan
    }
}

/// A monitor's host and port (`host`, `host:port`, `[v6]:port`, `v6` alone).
///
/// # Errors
/// A port that is not a number.
pub fn split_port(mon: &str) -> Result<(&str, Option<u16>), String> {
    let mon = mon
        .strip_prefix("v1:")
        .or_else(|| mon.strip_prefix("v2:"))
        .unwrap_or(mon);
    if let Some(rest) = mon.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("has an unclosed [")?;
        return match after.strip_prefix(':') {
            Some(p) => Ok((host, Some(p.parse().map_err(|_| "has a bad port")?))),
            None if after.is_empty() => Ok((host, None)),
            None => Err("is not [address]:port".into()),
        };
    }
    if mon.parse::<IpAddr>().is_ok() {
        return Ok((mon, None));
    }
    match mon.rsplit_once(':') {
        Some((h, p)) => Ok((h, Some(p.parse().map_err(|_| "has a bad port")?))),
        None => Ok((mon, None)),
    }
}

/// The credentials of a CephFS mount from a Secret's entries, as ceph-csi reads them:
/// the node's `userID` and `userKey`, else `adminID` and `adminKey`; the controller's
/// `adminID` and `adminKey`, else the user's.
///
/// # Errors
/// The entries that are missing.
pub fn credentials(
    secrets: &std::collections::HashMap<String, String>,
    role: Role,
) -> Result<Credentials, String> {
    let get = |key: &str| {
        secrets
            .get(key)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let pair = |id: &str, key: &str| Some((get(id)?, get(key)?));
    let (first, second) = match role {
        Role::NodeStage => (("userID", "userKey"), ("adminID", "adminKey")),
        Role::Provisioner | Role::ControllerExpand => {
            (("adminID", "adminKey"), ("userID", "userKey"))
        }
    };
    let (user, key) = pair(first.0, first.1)
        .or_else(|| pair(second.0, second.1))
        .ok_or_else(|| {
            format!(
                "secrets: {}/{} (or {}/{}) missing (set {} and its namespace to ceph-csi's Secret)",
                first.0,
                first.1,
                second.0,
                second.1,
                role.storage_class_parameter()
            )
        })?;
    Ok(Credentials {
        user: Some(user.trim_start_matches("client.").to_string()),
        secret: Some(key),
        domain: None,
    })
}

/// The keys by which a class or a PV names a CephFS file system (ceph-csi's).
pub(super) const NAMING_KEYS: &[&str] = &["clusterid", "monitors", "fsname"];
/// The keys a CephFS class may give (ceph-csi's, lower case).
pub(super) const CLASS_KEYS: &[&str] = &[
    "clusterid",
    "monitors",
    "fsname",
    "rootpath",
    "subvolumegroup",
    "pool",
    "volumenameprefix",
    "mounter",
    "kernelmountoptions",
    "fusemountoptions",
    "ondelete",
];

impl NamedShare for Ceph {
    const INFO: KindInfo = KindInfo {
        name: "cephfs",
        mount_types: &["ceph"],
        naming_keys: NAMING_KEYS,
        class_keys: CLASS_KEYS,
    };

    fn client_option(key: &str) -> Result<bool, String> {
        client_option(key)
    }

    fn credentials(
        secrets: &std::collections::HashMap<String, String>,
        _: &ClientOptions,
        role: Role,
    ) -> Result<Credentials, String> {
        credentials(secrets, role)
    }

    /// The file system a class names, the directory volumes are made in (`rootPath`, or
    /// `volumes/<subvolumeGroup>`), and whether the driver makes that directory where it
    /// is missing (a subvolume group, which ceph-csi makes on its first volume).
    ///
    /// # Errors
    /// A mounter other than the kernel's, FUSE options, a malformed key, named.
    fn class_share(keys: &Keys<'_>) -> Result<(Ceph, SubPath, bool), String> {
        let bad = |key: &str, why: String| format!("parameters: {key}: {why}");
        if let Some(m) = keys
            .get("mounter")
            .filter(|m| !m.eq_ignore_ascii_case("kernel"))
        {
            return Err(format!(
                "parameters: mounter {m:?}: mountgroup mounts CephFS with the kernel's client (mounter: kernel)"
            ));
        }
        if keys.get("fusemountoptions").is_some_and(|o| !o.is_empty()) {
            return Err(
                "parameters: fuseMountOptions: mountgroup mounts CephFS with the kernel's client; give kernelMountOptions".into(),
            );
        }
        let ceph = Ceph::parse(
            keys.get("monitors"),
            keys.get("clusterid"),
            keys.get("fsname"),
        )
        .map_err(|w| format!("parameters: {w}"))?;
        let (base, makes_base) = match (keys.get("rootpath"), keys.get("subvolumegroup")) {
            (Some(root), _) => (
                SubPath::parse(root.trim_start_matches('/')).map_err(|w| bad("rootPath", w))?,
                false,
            ),
            (None, Some(group)) => (
                SubPath::parse(&format!("volumes/{group}"))
                    .map_err(|w| bad("subvolumeGroup", w))?,
                true,
            ),
            (None, None) => (SubPath::default(), false),
        };
        Ok((ceph, base, makes_base))
    }

    /// The file system a PV names, and its `rootPath`.
    ///
    /// # Errors
    /// A malformed key, named.
    fn attributes_share(keys: &Keys<'_>) -> Result<(Ceph, SubPath), String> {
        let c = Ceph::parse(
            keys.get("monitors"),
            keys.get("clusterid"),
            keys.get("fsname"),
        )
        .map_err(|w| format!("volume_context: {w}"))?;
        let root = SubPath::parse(keys.get("rootpath").unwrap_or_default().trim_matches('/'))
            .map_err(|w| format!("volume_context.rootPath: {w}"))?;
        Ok((c, root))
    }

    /// The file system an id's field names.
    ///
    /// # Errors
    /// What is wrong with it.
    fn from_id_field(s: &str) -> Result<Ceph, String> {
        let (mons, fs) = s
            .split_once(';')
            .ok_or_else(|| format!("{s:?} is not monitors;fsName"))?;
        let fs = Some(fs).filter(|f| !f.is_empty());
        match mons.strip_prefix('@') {
            Some(cluster) => Ceph::parse(None, Some(cluster), fs),
            None => Ceph::parse(Some(mons), None, fs),
        }
    }

    /// The id's field: `<monitors>;<fsName>` or `@<clusterID>;<fsName>`.
    fn id_field(&self) -> String {
        let mons = match &self.monitors {
            Monitors::Listed(m) => m.join(","),
            Monitors::Cluster(c) => format!("@{c}"),
        };
        format!("{mons};{}", self.fs_name.as_deref().unwrap_or(""))
    }

    /// `ceph <monitors>:/dir (file system name)`.
    fn describe(&self, dir: &SubPath) -> String {
        let mons = match &self.monitors {
            Monitors::Listed(m) => m.join(","),
            Monitors::Cluster(c) => format!("cluster {c}"),
        };
        let fs = self.fs_name.as_deref().unwrap_or("its default file system");
        format!("CephFS {mons}:/{} ({fs})", dir.as_str())
    }

    fn context(&self, base: &SubPath, dir: &SubPath) -> Vec<(&'static str, String)> {
        let mut ctx = vec![match &self.monitors {
            Monitors::Listed(m) => ("monitors", m.join(",")),
            Monitors::Cluster(id) => ("clusterID", id.clone()),
        }];
        if let Some(f) = &self.fs_name {
            ctx.push(("fsName", f.clone()));
        }
        ctx.push(("rootPath", format!("/{}", base.join(dir).as_str())));
        ctx
    }

    /// Every monitor, its name resolved (ceph-csi's `clusterID` through its config).
    fn plans(
        &self,
        dir: &SubPath,
        client: &ClientOptions,
        creds: &Credentials,
        settings: &Settings,
    ) -> Result<(Vec<MountPlan>, String), ShareError> {
        let mons = self
            .monitor_list(&settings.ceph_config)
            .map_err(ShareError::Rejected)?;
        let mut addrs = Vec::new();
        for m in &mons {
            let (host, port) = split_port(m).map_err(|w| {
                ShareError::Rejected(format!("{}: monitor {m:?} {w}", self.describe(dir)))
            })?;
            let ip = resolve(host, port.unwrap_or(6789))
                .map_err(|why| ShareError::Unreachable(format!("{}: {why}", self.describe(dir))))?;
            let ip = match ip {
                IpAddr::V6(v6) => format!("[{v6}]"),
                IpAddr::V4(v4) => v4.to_string(),
            };
            addrs.push(match port {
                Some(p) => format!("{ip}:{p}"),
                None => ip,
            });
        }
        let shown = addrs.join(",");
        Ok((vec![self.plan(&addrs, dir, client, creds)], shown))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_systems_are_named_by_monitors_or_a_cluster_id() {
        let c = Ceph::parse(Some("127.0.0.1:6789, [fd00::1]:3300"), None, Some("cephfs")).unwrap();
        assert_eq!(Ceph::from_id_field(&c.id_field()).unwrap(), c);
        let c = Ceph::parse(None, Some("rook-ceph"), None).unwrap();
        assert_eq!(Ceph::from_id_field(&c.id_field()).unwrap(), c);
        assert!(Ceph::parse(None, None, None).is_err());
        assert!(Ceph::parse(Some("a:b"), None, None).is_err());
        assert!(Ceph::parse(None, Some("../x"), None).is_err());
        assert!(Ceph::parse(Some("m"), None, Some("a b")).is_err());
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.json");
        std::fs::write(
            &config,
            r#"[{"clusterID": "rook-ceph", "monitors": ["10.0.0.1:6789", "10.0.0.2:6789"]}]"#,
        )
        .unwrap();
        assert_eq!(
            c.monitor_list(&config).unwrap(),
            ["10.0.0.1:6789", "10.0.0.2:6789"]
        );
        let other = Ceph::parse(None, Some("other"), None).unwrap();
        assert!(other.monitor_list(&config).unwrap_err().contains("not in"));
        assert_eq!(
            split_port("v1:127.0.0.1:6789").unwrap(),
            ("127.0.0.1", Some(6789))
        );
        assert_eq!(split_port("fd00::1").unwrap(), ("fd00::1", None));
    }

    #[test]
    fn nodes_take_the_users_key_and_the_controller_the_admins() {
        let s: std::collections::HashMap<String, String> = [
            ("userID", "csi"),
            ("userKey", "uk"),
            ("adminID", "client.admin"),
            ("adminKey", "ak"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let node = credentials(&s, Role::NodeStage).unwrap();
        assert_eq!(
            (node.user.as_deref(), node.secret.as_deref()),
            (Some("csi"), Some("uk"))
        );
        let ctl = credentials(&s, Role::Provisioner).unwrap();
        assert_eq!(
            (ctl.user.as_deref(), ctl.secret.as_deref()),
            (Some("admin"), Some("ak"))
        );
        assert!(
            credentials(&Default::default(), Role::NodeStage)
                .unwrap_err()
                .contains("userID")
        );
        assert_eq!(client_option("ms_mode"), Ok(true));
        assert!(client_option("secret").is_err());
    }
}
