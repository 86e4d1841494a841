//! SMB shares (Azure Files, Samba, Windows servers), mounted with the kernel's CIFS
//! client as csi-driver-smb names them: `source: //server/share[/dir]`, the Secret's
//! `username`, `password` and `domain` (csi-driver-smb pkg/smb/smb.go, `sourceField`,
//! `usernameField`, `passwordField`, `domainField`; its keys are matched without
//! regard to case, as there).

use std::net::IpAddr;

use super::ShareError;
use super::named::{
    ClientOptions, Credentials, Keys, KindInfo, MountPlan, NamedShare, Role, Settings, SubPath,
    resolve,
};

/// An SMB share: its server and the share's name, no directory under it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Smb {
    pub server: String,
    pub share: String,
}

/// The CIFS client's options a StorageClass may give the share's mount (fs/smb/client/
/// fs_context.c `smb3_fs_parameters`), but those a view takes (`uid=`, `gid=`,
/// `file_mode=`, `dir_mode=`, `noperm`: the view's CIFS semantics, docs/SEMANTICS.md)
/// and those that name the share or its credentials, which come from `source` and the
/// Secret.
const CLIENT: &[&str] = &[
    "user_xattr",
    "nouser_xattr",
    "forceuid",
    "noforceuid",
    "forcegid",
    "noforcegid",
    "multichannel",
    "nomultichannel",
    "noblocksend",
    "noautotune",
    "nolease",
    "hard",
    "nohard",
    "soft",
    "nosoft",
    "nodelete",
    "mapposix",
    "nomapposix",
    "mapchars",
    "nomapchars",
    "sfu",
    "nosfu",
    "nodfs",
    "posixpaths",
    "noposixpaths",
    "unix",
    "nounix",
    "linux",
    "nolinux",
    "posix",
    "noposix",
    "nocase",
    "ignorecase",
    "brl",
    "nobrl",
    "handlecache",
    "nohandlecache",
    "forcemandatorylock",
    "forcemand",
    "setuids",
    "nosetuids",
    "intr",
    "nointr",
    "strictsync",
    "nostrictsync",
    "serverino",
    "noserverino",
    "rwpidforward",
    "cifsacl",
    "acl",
    "noacl",
    "locallease",
    "sign",
    "ignore_signature",
    "signloosely",
    "seal",
    "noac",
    "fsc",
    "mfsymlinks",
    "sloppy",
    "nosharesock",
    "persistenthandles",
    "nopersistenthandles",
    "resilienthandles",
    "noresilienthandles",
    "tcpnodelay",
    "notcpnodelay",
    "nosparse",
    "domainauto",
    "rdma",
    "modesid",
    "modefromsid",
    "compress",
    "witness",
    "guest",
    "backupuid",
    "backupgid",
    "cruid",
    "port",
    "min_enc_offload",
    "retrans",
    "esize",
    "bsize",
    "rasize",
    "rsize",
    "wsize",
    "actimeo",
    "acdirmax",
    "acregmax",
    "closetimeo",
    "echo_interval",
    "max_credits",
    "max_cached_dirs",
    "handletimeout",
    "snapshot",
    "max_channels",
    "ip",
    "addr",
    "srcaddr",
    "iocharset",
    "netbiosname",
    "servern",
    "ver",
    "vers",
    "sec",
    "cache",
];

/// Options that name what `source` and the Secret give.
const GIVEN: &[(&str, &str)] = &[
    ("user", "the Secret's username"),
    ("username", "the Secret's username"),
    ("pass", "the Secret's password"),
    ("password", "the Secret's password"),
    ("dom", "the Secret's domain"),
    ("domain", "the Secret's domain"),
    ("credentials", "the Secret"),
    ("cred", "the Secret"),
    ("unc", "source"),
    ("prefixpath", "source"),
    ("source", "source"),
];

/// Whether `key` is a CIFS client option a class may give, or what gives it instead.
pub fn client_option(key: &str) -> Result<bool, String> {
    if let Some((_, instead)) = GIVEN.iter().find(|(k, _)| *k == key) {
        return Err(format!(
            "{key} comes from {instead}, not from mount options"
        ));
    }
    Ok(CLIENT.contains(&key))
}

impl Smb {
    /// The share and the directory under it of a `source` (`//server/share[/dir...]`,
    /// `/` or `\` as separators, as the CIFS client takes them).
    ///
    /// # Errors
    /// What is wrong with it.
    pub fn parse_source(source: &str) -> Result<(Smb, SubPath), String> {
        let rest = source
            .strip_prefix("//")
            .or_else(|| source.strip_prefix("\\\\"))
            .ok_or_else(|| format!("{source:?} is not //server/share"))?;
        let rest = rest.replace('\\', "/");
        let mut parts = rest.splitn(3, '/');
        let server = parts.next().unwrap_or_default();
        let share = parts.next().unwrap_or_default();
        if server.is_empty() || share.is_empty() {
            return Err(format!("{source:?} is not //server/share"));
        }
        super::named::check_host(server).map_err(|why| format!("{source:?}: {why}"))?;
        if share
            .chars()
            .any(|c| c.is_control() || matches!(c, '#' | '%'))
        {
            return Err(format!(
                "{source:?}: the share name holds a control character, '#' or '%'"
            ));
        }
        let dir = SubPath::parse(parts.next().unwrap_or_default().trim_end_matches('/'))
            .map_err(|why| format!("{source:?}: {why}"))?;
        Ok((
            Smb {
                server: server.to_string(),
                share: share.to_string(),
            },
            dir,
        ))
    }

    /// How the CIFS client mounts `dir` of the share at `ip`: the root-only raw mount
    /// the views read (owner root, `0700`, as docs/DEPLOY.md's hand mount had it),
    /// `client` options after it, so that a class's own win, and the credentials.
    pub fn plan(
        &self,
        ip: IpAddr,
        dir: &SubPath,
        client: &[(String, Option<String>)],
        creds: &Credentials,
    ) -> MountPlan {
        let mut plan = MountPlan::new("cifs", self.describe(dir));
        plan.push("ip", Some(ip.to_string()));
        for (k, v) in [
            ("uid", "0"),
            ("gid", "0"),
            ("file_mode", "0700"),
            ("dir_mode", "0700"),
        ] {
            plan.push(k, Some(v.to_string()));
        }
        plan.extend(client.iter().filter(|(k, _)| k != "ip" && k != "addr"));
        if let Some(user) = &creds.user {
            plan.push("username", Some(user.clone()));
        }
        if let Some(password) = &creds.secret {
            plan.secret("password", password);
        }
        if let Some(domain) = &creds.domain {
            plan.push("domain", Some(domain.clone()));
        }
        plan
    }
}

/// The credentials of an SMB mount from a Secret's entries: `username` and
/// `password` (and `domain`), unless the class mounts as a guest (`guest`).
///
/// # Errors
/// The entry that is missing.
pub fn credentials(
    secrets: &std::collections::HashMap<String, String>,
    guest: bool,
    role: Role,
) -> Result<Credentials, String> {
    let get = |key: &str| {
        secrets
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let user = get("username");
    if user.is_none() && !guest {
        return Err(format!(
            "secrets: username missing (an SMB share's {} Secret has username and password; set {} and its namespace, or mount as a guest with the mount option guest)",
            role.secret_name(),
            role.storage_class_parameter()
        ));
    }
    Ok(Credentials {
        user,
        secret: get("password"),
        domain: get("domain"),
    })
}

/// The keys by which a class or a PV names an SMB share (csi-driver-smb's).
pub(super) const NAMING_KEYS: &[&str] = &["source"];
/// The keys an SMB class may give (csi-driver-smb's, lower case).
pub(super) const CLASS_KEYS: &[&str] = &["source", "subdir", "ondelete"];

impl NamedShare for Smb {
    const INFO: KindInfo = KindInfo {
        name: "smb",
        mount_types: &["cifs", "smb3"],
        naming_keys: NAMING_KEYS,
        class_keys: CLASS_KEYS,
    };

    fn client_option(key: &str) -> Result<bool, String> {
        client_option(key)
    }

    fn credentials(
        secrets: &std::collections::HashMap<String, String>,
        client: &ClientOptions,
        role: Role,
    ) -> Result<Credentials, String> {
        credentials(secrets, client.iter().any(|(k, _)| k == "guest"), role)
    }

    /// The share a class's `source` names, and the directory under it that volumes
    /// are made in, which is the share's own.
    fn class_share(keys: &Keys<'_>) -> Result<(Smb, SubPath, bool), String> {
        let source = keys.get("source").unwrap_or_default();
        let (smb, dir) =
            Smb::parse_source(source).map_err(|w| format!("parameters: source: {w}"))?;
        Ok((smb, dir, false))
    }

    /// An inline volume's `source: share|secrets` is ours; an SMB source starts `//`.
    fn named_in_context(keys: &Keys<'_>) -> bool {
        keys.get("source")
            .is_some_and(|s| s.starts_with("//") || s.starts_with("\\\\"))
    }

    /// The share a PV's `source` names, and the directory it shows.
    fn attributes_share(keys: &Keys<'_>) -> Result<(Smb, SubPath), String> {
        Smb::parse_source(keys.get("source").unwrap_or_default())
            .map_err(|w| format!("volume_context.source: {w}"))
    }

    /// The share an id's field names.
    ///
    /// # Errors
    /// What is wrong with it.
    fn from_id_field(s: &str) -> Result<Smb, String> {
        let (smb, dir) = Smb::parse_source(&format!("//{s}"))?;
        if !dir.is_empty() {
            return Err(format!("{s:?} is not server/share"));
        }
        Ok(smb)
    }

    /// The id's field: `server/share`.
    fn id_field(&self) -> String {
        format!("{}/{}", self.server, self.share)
    }

    /// `//server/share/dir`.
    fn describe(&self, dir: &SubPath) -> String {
        let mut s = format!("//{}/{}", self.server, self.share);
        if !dir.is_empty() {
            s.push('/');
            s.push_str(dir.as_str());
        }
        s
    }

    fn context(&self, base: &SubPath, dir: &SubPath) -> Vec<(&'static str, String)> {
        vec![
            ("source", self.describe(base)),
            ("subDir", dir.as_str().to_string()),
        ]
    }

    fn plans(
        &self,
        dir: &SubPath,
        client: &ClientOptions,
        creds: &Credentials,
        _: &Settings,
    ) -> Result<(Vec<MountPlan>, String), ShareError> {
        let ip = match client.iter().find(|(k, _)| k == "ip" || k == "addr") {
            Some((_, Some(ip))) => ip.parse().map_err(|_| {
                ShareError::Rejected(format!(
                    "{}: ip {ip:?} is not an address",
                    self.describe(dir)
                ))
            })?,
            _ => resolve(&self.server, 445)
                .map_err(|why| ShareError::Unreachable(format!("{}: {why}", self.describe(dir))))?,
        };
        Ok((vec![self.plan(ip, dir, client, creds)], ip.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_name_a_share_and_a_directory_under_it() {
        let (smb, dir) = Smb::parse_source("//smb-server.default.svc.cluster.local/share").unwrap();
        assert_eq!(smb.server, "smb-server.default.svc.cluster.local");
        assert_eq!(smb.share, "share");
        assert!(dir.is_empty());
        let (smb, dir) = Smb::parse_source("\\\\acct.file.core.windows.net\\data\\a\\b/").unwrap();
        assert_eq!(smb.describe(&dir), "//acct.file.core.windows.net/data/a/b");
        for bad in [
            "smb-server/share",
            "//server",
            "//server/",
            "///share",
            "//server/share/../etc",
            "//server/share/a//b",
            "//se rver/share",
            "//server/sh#are",
        ] {
            assert!(Smb::parse_source(bad).is_err(), "{bad}");
        }
        assert_eq!(Smb::from_id_field(&smb.id_field()).unwrap(), smb);
    }

    #[test]
    fn the_view_takes_cifs_semantics_and_the_secret_the_credentials() {
        assert_eq!(client_option("mfsymlinks"), Ok(true));
        assert_eq!(client_option("vers"), Ok(true));
        assert_eq!(client_option("colour"), Ok(false));
        assert!(client_option("password").unwrap_err().contains("Secret"));
        let secrets = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let c = credentials(
            &secrets(&[("Username", "bob "), ("password", "pa,ss")]),
            false,
            Role::NodeStage,
        )
        .unwrap();
        assert_eq!(c.user.as_deref(), Some("bob"));
        assert!(!format!("{c:?}").contains("pa,ss"));
        let why = credentials(&secrets(&[]), false, Role::NodeStage).unwrap_err();
        assert!(why.contains("node-stage-secret-name"), "{why}");
        assert!(credentials(&secrets(&[]), true, Role::NodeStage).is_ok());
    }
}
