//! The Kubernetes API, for the one question the node plugin asks it: may a pod have a
//! native view? Not when it runs in a user namespace of its own (`spec.hostUsers:
//! false`: its runtime idmaps every volume, which it cannot do to an idmapped mount),
//! nor when a container of it is privileged or adds a capability that reaches past a
//! bind mount; such pods get FUSE views (docs/SEMANTICS.md, *Native views*). In-cluster configuration as client-go's
//! `rest.InClusterConfig`: the API service's address from `KUBERNETES_SERVICE_HOST`
//! and `KUBERNETES_SERVICE_PORT`, the service account's token (read at every request:
//! kubelet rotates it) and CA from their mounted files. The token is never logged.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

use crate::volume::serve::{Pod, PodLookup, PodRef};

/// Where client-go finds the service account's token and CA.
pub const TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
pub const CA_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// How long a lookup may take before the publish gives up on it (and chooses FUSE).
const TIMEOUT: Duration = Duration::from_secs(3);

/// An API server the node plugin can ask.
pub struct ApiServer {
    host: String,
    port: u16,
    server_name: ServerName<'static>,
    token_file: PathBuf,
    tls: Arc<rustls::ClientConfig>,
    runtime: tokio::runtime::Handle,
}

impl ApiServer {
    /// The API server of the cluster this process runs in, or `None` outside one
    /// (`KUBERNETES_SERVICE_HOST` unset).
    ///
    /// # Errors
    /// What is wrong with the configuration (no CA file, a bad port).
    pub fn in_cluster(runtime: tokio::runtime::Handle) -> Option<Result<ApiServer, String>> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST").ok()?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        Some(
            port.parse::<u16>()
                .map_err(|_| format!("KUBERNETES_SERVICE_PORT {port:?} is not a port"))
                .and_then(|port| {
                    ApiServer::new(
                        &host,
                        port,
                        Path::new(TOKEN_FILE),
                        Path::new(CA_FILE),
                        runtime,
                    )
                }),
        )
    }

    /// An API server at `host:port` (an IP address or a DNS name), trusted through the
    /// certificates of `ca_file`, asked with the bearer token in `token_file`.
    ///
    /// # Errors
    /// The CA file cannot be read or holds no certificate; `host` is no server name.
    pub fn new(
        host: &str,
        port: u16,
        token_file: &Path,
        ca_file: &Path,
        runtime: tokio::runtime::Handle,
    ) -> Result<ApiServer, String> {
        let mut roots = rustls::RootCertStore::empty();
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca_file)
            .map_err(|e| format!("CA file {}: {e}", ca_file.display()))?
            .collect::<Result<_, _>>()
            .map_err(|e| format!("CA file {}: {e}", ca_file.display()))?;
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(format!("CA file {}: no certificate", ca_file.display()));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server_name = match host.parse::<IpAddr>() {
            Ok(ip) => ServerName::IpAddress(ip.into()),
            Err(_) => ServerName::try_from(host.to_string())
                .map_err(|e| format!("API server host {host:?}: {e}"))?,
        };
        Ok(ApiServer {
            host: host.to_string(),
            port,
            server_name,
            token_file: token_file.to_path_buf(),
            tls: Arc::new(tls),
            runtime,
        })
    }

    /// `GET /api/v1/namespaces/NS/pods/NAME`: the pod, as JSON.
    async fn get_pod(&self, pod: &PodRef) -> Result<serde_json::Value, String> {
        if !is_name(&pod.namespace) || !is_name(&pod.name) {
            return Err(format!(
                "{}/{} is not a pod's namespace and name",
                pod.namespace, pod.name
            ));
        }
        let token = std::fs::read_to_string(&self.token_file)
            .map_err(|e| format!("token file {}: {e}", self.token_file.display()))?;
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let tls = tokio_rustls::TlsConnector::from(Arc::clone(&self.tls))
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .map_err(|e| format!("HTTP: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let host = match self.host.parse::<std::net::Ipv6Addr>() {
            Ok(_) => format!("[{}]:{}", self.host, self.port),
            Err(_) => format!("{}:{}", self.host, self.port),
        };
        let req = hyper::Request::get(format!(
            "/api/v1/namespaces/{}/pods/{}",
            pod.namespace, pod.name
        ))
        .header(hyper::header::HOST, host)
        .header(hyper::header::ACCEPT, "application/json")
        .header(
            hyper::header::AUTHORIZATION,
            format!("Bearer {}", token.trim()),
        )
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("request: {e}"))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("HTTP: {e}"))?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("HTTP body: {e}"))?
            .to_bytes();
        if !status.is_success() {
            return Err(match status.as_u16() {
                401 | 403 => format!(
                    "the API server refused to give the pod ({status}): the node plugin's service account needs get on pods"
                ),
                404 => format!("no such pod ({status})"),
                _ => format!("the API server answered {status}"),
            });
        }
        serde_json::from_slice(&body).map_err(|e| format!("the pod is not JSON: {e}"))
    }
}

/// Whether `s` is a Kubernetes object name (DNS-1123: lower-case letters, digits, `-`
/// and `.`, at most 253): what may go into the request's path.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !s.starts_with(['-', '.'])
}

/// The capabilities that let a container reach past a native view: `DAC_READ_SEARCH`
/// opens any inode of the file system by handle (`open_by_handle_at(2)` with a
/// handle of the file system's root, which needs no guess, on the view's own mount:
/// fs/fhandle.c `may_decode_fh` asks `capable(CAP_DAC_READ_SEARCH)` and nothing of
/// the mount's subtree), `SYS_ADMIN` mounts what it likes, and `ALL` holds both.
const REACHING_CAPABILITIES: [&str; 3] = ["DAC_READ_SEARCH", "SYS_ADMIN", "ALL"];

/// What a pod's spec says: `spec.hostUsers` (absent: true, the node's namespace), and
/// whether any of its containers, init containers or ephemeral containers is
/// privileged or adds a capability that reaches past a native view (the names as
/// container runtimes read them: with or without `CAP_`, in any case).
pub fn pod_of(pod: &serde_json::Value) -> Pod {
    if let Some(serde_json::Value::Bool(false)) = pod.pointer("/spec/hostUsers") {
        return Pod::UserNamespace;
    }
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        let containers = pod
            .pointer(&format!("/spec/{list}"))
            .and_then(serde_json::Value::as_array);
        for c in containers.into_iter().flatten() {
            let name = c.get("name").and_then(|n| n.as_str()).unwrap_or("?");
            let sc = c.get("securityContext");
            if sc.and_then(|s| s.get("privileged")) == Some(&serde_json::Value::Bool(true)) {
                return Pod::Privileged(format!("its container {name} is privileged"));
            }
            let added = sc
                .and_then(|s| s.pointer("/capabilities/add"))
                .and_then(serde_json::Value::as_array);
            for cap in added.into_iter().flatten().filter_map(|c| c.as_str()) {
                let upper = cap.to_ascii_uppercase();
                let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
                if REACHING_CAPABILITIES.contains(&bare) {
                    return Pod::Privileged(format!("its container {name} adds {cap}"));
                }
            }
        }
    }
    Pod::HostUsers
}

impl PodLookup for ApiServer {
    fn pod(&self, pod: Option<&PodRef>) -> Pod {
        let Some(pod) = pod else {
            return Pod::Unknown(
                "the publish names no pod (the CSIDriver needs podInfoOnMount: true)".into(),
            );
        };
        // Called from a blocking thread of the runtime (a CSI call's).
        let lookup = self
            .runtime
            .block_on(async { tokio::time::timeout(TIMEOUT, self.get_pod(pod)).await });
        match lookup {
            Ok(Ok(json)) => pod_of(&json),
            Ok(Err(why)) => Pod::Unknown(why),
            Err(_) => Pod::Unknown(format!("no answer from the API server in {TIMEOUT:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_users_is_read_as_kube_apiserver_writes_it() {
        let pod = |spec: serde_json::Value| serde_json::json!({"kind": "Pod", "spec": spec});
        assert_eq!(
            pod_of(&pod(serde_json::json!({"hostUsers": false}))),
            Pod::UserNamespace
        );
        assert_eq!(
            pod_of(&pod(serde_json::json!({"hostUsers": true}))),
            Pod::HostUsers
        );
        assert_eq!(
            pod_of(&pod(serde_json::json!({}))),
            Pod::HostUsers,
            "absent: the node's"
        );
    }

    #[test]
    fn containers_that_reach_past_a_native_view_are_found() {
        let pod = |spec: serde_json::Value| serde_json::json!({"kind": "Pod", "spec": spec});
        let with = |list: &str, sc: serde_json::Value| {
            pod(serde_json::json!({
                "containers": [{"name": "app", "securityContext": {"capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}}}],
                list: [{"name": "x", "securityContext": sc}],
            }))
        };
        let privileged = |p: &serde_json::Value| matches!(pod_of(p), Pod::Privileged(_));
        for list in ["containers", "initContainers", "ephemeralContainers"] {
            assert!(
                privileged(&with(list, serde_json::json!({"privileged": true}))),
                "{list}"
            );
            for cap in [
                "DAC_READ_SEARCH",
                "CAP_DAC_READ_SEARCH",
                "cap_sys_admin",
                "ALL",
            ] {
                assert!(
                    privileged(&with(
                        list,
                        serde_json::json!({"capabilities": {"add": [cap]}})
                    )),
                    "{list} {cap}"
                );
            }
            for sc in [
                serde_json::json!({"privileged": false}),
                serde_json::json!({"capabilities": {"add": ["CHOWN", "NET_BIND_SERVICE"]}}),
                serde_json::json!({"capabilities": {"drop": ["ALL"]}}),
                serde_json::json!(null),
            ] {
                assert_eq!(
                    pod_of(&with(list, sc.clone())),
                    Pod::HostUsers,
                    "{list} {sc}"
                );
            }
        }
        assert_eq!(
            pod_of(&with(
                "initContainers",
                serde_json::json!({"capabilities": {"add": ["CAP_DAC_READ_SEARCH"]}})
            )),
            Pod::Privileged("its container x adds CAP_DAC_READ_SEARCH".into())
        );
        // A pod in a user namespace: its capabilities are its namespace's.
        assert_eq!(
            pod_of(&pod(
                serde_json::json!({"hostUsers": false, "containers": [{"name": "a", "securityContext": {"privileged": true}}]})
            )),
            Pod::UserNamespace
        );
    }

    #[test]
    fn only_object_names_go_into_the_path() {
        assert!(is_name("team-a") && is_name("web-0.x"));
        for bad in ["", "a/b", "..", "-a", "A", "a?b", "a%2fb", &"a".repeat(254)] {
            assert!(!is_name(bad), "{bad:?}");
        }
    }
}
