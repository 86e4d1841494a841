//! NFS exports, mounted with the kernel's NFS client as csi-driver-nfs names them:
//! `server`, `share` (the export's path), the version from the mount options
//! (`nfsvers=`, `vers=`; csi-driver-nfs pkg/nfs/nfs.go `paramServer`, `paramShare`).
//! No credentials: `sec=sys`, the server trusts the client's ids.

use std::net::IpAddr;

use super::ShareError;
use super::named::{
    ClientOptions, Credentials, Keys, KindInfo, MountPlan, NamedShare, Role, Settings, SubPath,
    resolve,
};

/// An NFS export: its server and the export's path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nfs {
    pub server: String,
    /// The export's path, absolute (`/` for an NFS 4 pseudo root).
    pub export: String,
}

/// The NFS client's options a StorageClass may give the share's mount (fs/nfs/
/// fs_context.c `nfs_fs_parameters`), but `source`, which `server` and `share` give.
const CLIENT: &[&str] = &[
    "ac",
    "noac",
    "acdirmax",
    "acdirmin",
    "acl",
    "noacl",
    "acregmax",
    "acregmin",
    "actimeo",
    "addr",
    "bg",
    "fg",
    "bsize",
    "clientaddr",
    "cto",
    "nocto",
    "fsc",
    "nofsc",
    "hard",
    "intr",
    "nointr",
    "local_lock",
    "lock",
    "nolock",
    "lookupcache",
    "migration",
    "nomigration",
    "minorversion",
    "mountaddr",
    "mounthost",
    "mountport",
    "mountproto",
    "mountvers",
    "namlen",
    "nconnect",
    "max_connect",
    "nfsvers",
    "port",
    "posix",
    "noposix",
    "proto",
    "rdirplus",
    "nordirplus",
    "rdma",
    "resvport",
    "noresvport",
    "retrans",
    "retry",
    "rsize",
    "sec",
    "sharecache",
    "nosharecache",
    "sloppy",
    "soft",
    "softerr",
    "softreval",
    "nosoftreval",
    "tcp",
    "timeo",
    "udp",
    "v2",
    "v3",
    "v4",
    "v4.0",
    "v4.1",
    "v4.2",
    "vers",
    "write",
    "wsize",
];

/// Whether `key` is an NFS client option a class may give, or what gives it instead.
pub fn client_option(key: &str) -> Result<bool, String> {
    if key == "source" {
        return Err("source comes from server and share, not from mount options".into());
    }
    Ok(CLIENT.contains(&key))
}

/// The versions a mount without one tries, newest first, as mount.nfs negotiates
/// (nfs-utils utils/mount/stropts.c `nfs_autonegotiate`): the next where the server
/// answers that it does not speak one (`EPROTONOSUPPORT`).
pub const NEGOTIATED: &[&str] = &["4.2", "4.1", "4.0", "3"];

/// The version `client` names (`vers=`, `nfsvers=`, `v3`, ...), if any.
pub fn version(client: &[(String, Option<String>)]) -> Option<String> {
    client
        .iter()
        .rev()
        .find_map(|(k, v)| match (k.as_str(), v) {
            ("vers" | "nfsvers", Some(v)) => Some(v.clone()),
            (k, None) if is_version_flag(k) => Some(k[1..].to_string()),
            _ => None,
        })
}

/// `v3`, `v4.1`, ...: a version as a flag.
fn is_version_flag(k: &str) -> bool {
    k.strip_prefix('v')
        .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
}

impl Nfs {
    /// An export from a class's or a PV's `server` and `share`.
    ///
    /// # Errors
    /// What is wrong with either.
    pub fn parse(server: &str, share: &str) -> Result<Nfs, String> {
        super::named::check_host(server).map_err(|why| format!("server {server:?}: {why}"))?;
        if !share.starts_with('/') {
            return Err(format!("share {share:?} is not an absolute path"));
        }
        let rel = SubPath::parse(share.trim_start_matches('/').trim_end_matches('/'))
            .map_err(|why| format!("share {share:?}: {why}"))?;
        Ok(Nfs {
            server: server.to_string(),
            export: format!("/{}", rel.as_str()),
        })
    }

    fn path(&self, dir: &SubPath) -> String {
        match (self.export.as_str(), dir.is_empty()) {
            (e, true) => e.to_string(),
            ("/", false) => format!("/{}", dir.as_str()),
            (e, false) => format!("{e}/{}", dir.as_str()),
        }
    }

    /// How the NFS client mounts `dir` of the export at `ip`, at `version` (`4.2`,
    /// `3`, ...), with `client` options but the version's.
    pub fn plan(
        &self,
        ip: IpAddr,
        dir: &SubPath,
        version: &str,
        client: &[(String, Option<String>)],
    ) -> MountPlan {
        let server = if self.server.parse::<std::net::Ipv6Addr>().is_ok() {
            format!("[{}]", self.server)
        } else {
            self.server.clone()
        };
        // The server's name as written (the mount table shows it, as mount.nfs
        // passes it), its address apart: the kernel resolves no names.
        let mut plan = MountPlan::new("nfs", format!("{server}:{}", self.path(dir)));
        plan.push("addr", Some(ip.to_string()));
        plan.push("vers", Some(version.to_string()));
        plan.extend(client.iter().filter(|(k, _)| {
            !(matches!(k.as_str(), "vers" | "nfsvers" | "addr") || is_version_flag(k))
        }));
        plan
    }
}

/// The keys by which a class or a PV names an NFS share (csi-driver-nfs's).
pub(super) const NAMING_KEYS: &[&str] = &["server", "share"];
/// The keys an NFS class may give (csi-driver-nfs's, lower case).
pub(super) const CLASS_KEYS: &[&str] =
    &["server", "share", "subdir", "ondelete", "mountpermissions"];

impl NamedShare for Nfs {
    const INFO: KindInfo = KindInfo {
        name: "nfs",
        mount_types: &["nfs", "nfs4"],
        naming_keys: NAMING_KEYS,
        class_keys: CLASS_KEYS,
    };

    fn client_option(key: &str) -> Result<bool, String> {
        client_option(key)
    }

    /// None: the server trusts the node (`sec=sys`).
    fn credentials(
        _: &std::collections::HashMap<String, String>,
        _: &ClientOptions,
        _: Role,
    ) -> Result<Credentials, String> {
        Ok(Credentials::default())
    }

    /// The export a class's `server` and `share` name; volumes are made at its root.
    fn class_share(keys: &Keys<'_>) -> Result<(Nfs, SubPath, bool), String> {
        let (Some(server), Some(share)) = (keys.get("server"), keys.get("share")) else {
            return Err("parameters: an NFS share needs both server and share".into());
        };
        let nfs =
            Nfs::parse(server, share).map_err(|w| format!("parameters: server/share: {w}"))?;
        Ok((nfs, SubPath::default(), false))
    }

    /// The export a PV's `server` and `share` name; its `subDir` is below the root.
    fn attributes_share(keys: &Keys<'_>) -> Result<(Nfs, SubPath), String> {
        let (Some(server), Some(share)) = (keys.get("server"), keys.get("share")) else {
            return Err("volume_context: an NFS share needs both server and share".into());
        };
        let nfs = Nfs::parse(server, share).map_err(|w| format!("volume_context.share: {w}"))?;
        Ok((nfs, SubPath::default()))
    }

    /// The export an id's field names.
    ///
    /// # Errors
    /// What is wrong with it.
    fn from_id_field(s: &str) -> Result<Nfs, String> {
        let (server, export) = s
            .rsplit_once(":/")
            .ok_or_else(|| format!("{s:?} is not server:/export"))?;
        Nfs::parse(
            server.trim_start_matches('[').trim_end_matches(']'),
            &format!("/{export}"),
        )
    }

    /// The id's field: `server:/export`.
    fn id_field(&self) -> String {
        format!("{}:{}", self.server, self.export)
    }

    /// `server:/export/dir`.
    fn describe(&self, dir: &SubPath) -> String {
        format!("{}:{}", self.server, self.path(dir))
    }

    fn context(&self, base: &SubPath, dir: &SubPath) -> Vec<(&'static str, String)> {
        vec![
            ("server", self.server.clone()),
            ("share", self.export.clone()),
            ("subDir", base.join(dir).as_str().to_string()),
        ]
    }

    /// Without a version the client negotiates, as mount.nfs does: each version in
    /// turn.
    fn plans(
        &self,
        dir: &SubPath,
        client: &ClientOptions,
        _: &Credentials,
        _: &Settings,
    ) -> Result<(Vec<MountPlan>, String), ShareError> {
        let ip = match client.iter().find(|(k, _)| k == "addr") {
            Some((_, Some(ip))) => ip.parse().map_err(|_| {
                ShareError::Rejected(format!(
                    "{}: addr {ip:?} is not an address",
                    self.describe(dir)
                ))
            })?,
            _ => resolve(&self.server, 2049)
                .map_err(|why| ShareError::Unreachable(format!("{}: {why}", self.describe(dir))))?,
        };
        let versions: Vec<String> = match version(client) {
            Some(v) => vec![v],
            None => NEGOTIATED.iter().map(|v| v.to_string()).collect(),
        };
        let plans = versions
            .iter()
            .map(|v| self.plan(ip, dir, v, client))
            .collect();
        Ok((plans, ip.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_are_absolute_and_the_version_comes_from_the_options() {
        let nfs = Nfs::parse("nfs-server.default.svc.cluster.local", "/").unwrap();
        assert_eq!(
            nfs.describe(&SubPath::parse("pvc-1").unwrap()),
            "nfs-server.default.svc.cluster.local:/pvc-1"
        );
        let nfs = Nfs::parse("10.0.0.2", "/exports/data/").unwrap();
        assert_eq!(nfs.export, "/exports/data");
        assert_eq!(Nfs::from_id_field(&nfs.id_field()).unwrap(), nfs);
        for (server, share) in [("a", "data"), ("a", "/x/../y"), ("", "/"), ("a b", "/")] {
            assert!(Nfs::parse(server, share).is_err(), "{server} {share}");
        }
        let opts = |o: &[(&str, Option<&str>)]| -> Vec<(String, Option<String>)> {
            o.iter()
                .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
                .collect()
        };
        assert_eq!(
            version(&opts(&[("nfsvers", Some("4.1"))])).as_deref(),
            Some("4.1")
        );
        assert_eq!(
            version(&opts(&[("hard", None), ("v3", None)])).as_deref(),
            Some("3")
        );
        assert_eq!(version(&opts(&[("hard", None)])), None);
        let plan = nfs.plan(
            "10.0.0.2".parse().unwrap(),
            &SubPath::parse("v").unwrap(),
            "3",
            &opts(&[("nfsvers", Some("3")), ("hard", None)]),
        );
        assert_eq!(plan.source, "10.0.0.2:/exports/data/v");
        let v6 = Nfs::parse("fd00::2", "/e").unwrap();
        assert_eq!(
            v6.plan("fd00::2".parse().unwrap(), &SubPath::default(), "4.2", &[])
                .source,
            "[fd00::2]:/e"
        );
        assert_eq!(plan.keys(), ["addr", "vers", "hard"]);
        assert!(client_option("source").is_err());
        assert_eq!(client_option("nconnect"), Ok(true));
    }
}
