//! A stand-in for kube-apiserver, for the one request the node plugin makes: `GET
//! /api/v1/namespaces/NS/pods/NAME` over TLS with a bearer token. It answers as
//! kube-apiserver does: the Pod as JSON (`spec.hostUsers` only where the pod sets it,
//! as the API server omits unset fields), and failures as a `Status` object with the
//! HTTP code (k8s.io/apimachinery/pkg/api/errors: `NewUnauthorized` 401,
//! `NewForbidden` 403 "pods \"x\" is forbidden: User ... cannot get resource ...",
//! `NewNotFound` 404 "pods \"x\" not found"). Its certificate is signed by a CA of its
//! own, which the test hands to the driver as the service account's `ca.crt`.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::Bytes;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

pub const TOKEN: &str = "stand-in-token";

/// What the stand-in knows of a pod.
#[derive(Clone, Copy, Debug)]
pub enum Known {
    /// A pod; `Some(h)`: its `spec.hostUsers`.
    Pod(Option<bool>),
    /// A pod in the node's user namespace whose init container adds a capability
    /// (`securityContext.capabilities.add`, as written in the pod's manifest).
    InitAdds(&'static str),
    /// Get is forbidden for the caller (RBAC).
    Forbidden,
}

/// A running stand-in: its address, and the files the driver is given.
pub struct ApiServer {
    pub addr: SocketAddr,
    pub ca_file: PathBuf,
    pub token_file: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ApiServer {
    /// The driver's arguments that point it here.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--kube-api".into(),
            self.addr.to_string(),
            "--kube-token-file".into(),
            self.token_file.display().to_string(),
            "--kube-ca-file".into(),
            self.ca_file.display().to_string(),
        ]
    }

    /// Serves the pods `pods` ("namespace/name" → what is known) on a free port of
    /// 127.0.0.1, with its CA and token written under `dir`.
    pub async fn start(dir: &Path, pods: HashMap<String, Known>) -> ApiServer {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()));
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        let ca_file = dir.join("ca.crt");
        std::fs::write(&ca_file, ca.pem()).unwrap();
        let token_file = dir.join("token");
        std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from_pem_slice(cert.pem().as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap(),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let pods = Arc::new(pods);
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, pods) = (acceptor.clone(), Arc::clone(&pods));
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req| {
                        let pods = Arc::clone(&pods);
                        async move { Ok::<_, std::convert::Infallible>(answer(&pods, &req)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        ApiServer {
            addr,
            ca_file,
            token_file,
            task,
        }
    }
}

fn status(code: u16, reason: &str, message: String) -> hyper::Response<Full<Bytes>> {
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    });
    hyper::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

fn answer<B>(
    pods: &HashMap<String, Known>,
    req: &hyper::Request<B>,
) -> hyper::Response<Full<Bytes>> {
    let authorized = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {TOKEN}"));
    if !authorized {
        return status(401, "Unauthorized", "Unauthorized".into());
    }
    let path = req.uri().path();
    let Some((ns, name)) = path
        .strip_prefix("/api/v1/namespaces/")
        .and_then(|r| r.split_once("/pods/"))
    else {
        return status(
            404,
            "NotFound",
            "the server could not find the requested resource".into(),
        );
    };
    match pods.get(&format!("{ns}/{name}")) {
        None => status(404, "NotFound", format!("pods \"{name}\" not found")),
        Some(Known::Forbidden) => status(
            403,
            "Forbidden",
            format!(
                "pods \"{name}\" is forbidden: User \"system:serviceaccount:mountgroup:mountgroup-node\" cannot get resource \"pods\" in API group \"\" in the namespace \"{ns}\""
            ),
        ),
        Some(known @ (Known::Pod(_) | Known::InitAdds(_))) => {
            let mut spec = serde_json::json!({
                "containers": [{"name": "app", "image": "busybox"}],
                "securityContext": {"fsGroup": 4242},
            });
            if let Known::Pod(Some(h)) = known {
                spec["hostUsers"] = serde_json::Value::Bool(*h);
            }
            if let Known::InitAdds(cap) = known {
                spec["initContainers"] = serde_json::json!([{
                    "name": "backup-agent",
                    "image": "busybox",
                    "securityContext": {"capabilities": {"add": [cap]}},
                }]);
            }
            let pod = serde_json::json!({
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {"name": name, "namespace": ns, "uid": "0f4e0001-7b1c-4d2a-9e55-3c1d2b8a6f10"},
                "spec": spec,
                "status": {"phase": "Pending"},
            });
            hyper::Response::builder()
                .status(200)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(pod.to_string())))
                .unwrap()
        }
    }
}
