//! Prometheus metrics on HTTP (`serve --metrics-addr`): every CSI call by method and
//! gRPC code with its duration, measured by a tower layer around the gRPC server (so
//! calls refused by validation count too); the node's views (serving or dead, and
//! whether kernel passthrough is on); and the operations of all views on the node,
//! summed from the snapshots the view processes write.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http_body_util::Full;
use hyper::body::Bytes;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tonic::codegen::http;

use crate::transport::probe::KernelFuse;
use crate::transport::stats::{BUCKETS, Snapshot};
use crate::volume::node::{Node, ViewInfo, ViewState};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    method: String,
    code: String,
}

fn call_histogram() -> Histogram {
    // 0.5 ms to about 16 s: a view takes milliseconds to mount, a btrfs subvolume more.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// The driver's metrics.
pub struct Metrics {
    registry: Registry,
    calls: Family<CallLabels, Histogram, fn() -> Histogram>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// `kernel`: what this kernel's FUSE offers views (`None`: it could not be asked).
    pub fn new(
        node: Arc<Node>,
        capacity_enforced: bool,
        kernel: Option<KernelFuse>,
    ) -> Arc<Metrics> {
        let mut registry = Registry::default();
        let calls = Family::<CallLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            call_histogram,
        );
        registry.register(
            "mountgroup_csi_operation_duration_seconds",
            "CSI calls by method and gRPC code, and how long they took",
            calls.clone(),
        );
        registry.register_collector(Box::new(NodeCollector {
            node,
            capacity_enforced,
            kernel,
        }));
        Arc::new(Metrics { registry, calls })
    }

    /// Counts one CSI call.
    pub fn observe(&self, method: &str, code: tonic::Code, seconds: f64) {
        self.calls
            .get_or_create(&CallLabels {
                method: method.to_string(),
                code: format!("{code:?}"),
            })
            .observe(seconds);
    }

    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "metrics could not be encoded");
        }
        out
    }
}

/// The node's views, read at every scrape.
struct NodeCollector {
    node: Arc<Node>,
    capacity_enforced: bool,
    kernel: Option<KernelFuse>,
}

impl std::fmt::Debug for NodeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeCollector")
    }
}

/// One sample of a per-view metric.
enum Sample {
    Gauge(i64),
    GaugeF(f64),
    Counter(u64),
    CounterF(f64),
}

/// The per-view metrics, each read from a view's snapshot: name, help, value. What
/// each view costs is its process's memory and CPU time; a view that was recovered or
/// taken over starts its CPU count again (a new process), as Prometheus counters may.
type PerView = (&'static str, &'static str, fn(&Snapshot) -> Sample);
const PER_VIEW: &[PerView] = &[
    (
        "mountgroup_view_passthrough",
        "1 when a view's reads and writes go through kernel FUSE passthrough",
        |s| Sample::Gauge(i64::from(s.passthrough)),
    ),
    (
        "mountgroup_view_idmap",
        "1 when a container runtime can idmap a view's mount (FUSE_ALLOW_IDMAP negotiated); 0 on a kernel without it, or for a noperm view",
        |s| Sample::Gauge(i64::from(s.idmap)),
    ),
    (
        "mountgroup_view_ring_requests",
        "Requests a view received over FUSE over io_uring (transport=ring) rather than /dev/fuse",
        |s| Sample::Counter(s.ring_requests),
    ),
    (
        "mountgroup_view_oldest_request_seconds",
        "How long the oldest request a view is serving has waited (0: none); a request stuck alone while other workers answer shows here and not in the keeper's liveness check",
        |s| Sample::GaugeF(s.oldest_request_seconds),
    ),
    (
        "mountgroup_view_requests_in_progress",
        "Requests a view is serving now, each on a worker of its own: while its share stalls or its server is away, as many as its callers waiting on it (up to the view's max_threads)",
        |s| Sample::Gauge(s.requests_in_progress as i64),
    ),
    (
        "mountgroup_view_walked_ahead_dirs",
        "Directories a view listed and warmed ahead of a walk through it",
        |s| Sample::Counter(s.walked_ahead),
    ),
    (
        "mountgroup_view_opened_ahead_lookups",
        "Lookups a view answered with an entry it opened ahead of a walk through it",
        |s| Sample::Counter(s.opened_ahead),
    ),
    (
        "mountgroup_view_resident_memory_bytes",
        "Resident memory of the process serving a view",
        |s| Sample::Gauge(s.process.resident_bytes as i64),
    ),
    (
        "mountgroup_view_cpu_seconds",
        "CPU time used by the process serving a view, user and system",
        |s| Sample::CounterF(s.process.cpu_seconds),
    ),
];

impl Collector for NodeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        if let Some(k) = self.kernel {
            encoder
                .encode_descriptor(
                    "mountgroup_node_fuse_idmap",
                    "1 when this node's kernel lets a container runtime idmap a view (FUSE_ALLOW_IDMAP, Linux 6.12+), which a pod in a user namespace (hostUsers: false) needs; 0 when it does not",
                    None,
                    MetricType::Gauge,
                )?
                .encode_gauge(&i64::from(k.idmap))?;
        }
        let views = self.node.views_overview();
        encode_views(&mut encoder, &views)?;
        encode_per_view(&mut encoder, &views)?;
        encode_operations(&mut encoder, &views)?;
        encoder
            .encode_descriptor(
                "mountgroup_share_capacity_enforced",
                "1 when the share enforces volume capacity (btrfs quota groups), 0 when advisory",
                None,
                MetricType::Gauge,
            )?
            .encode_gauge(&i64::from(self.capacity_enforced))?;
        Ok(())
    }
}

/// The views by state, and how each is served.
fn encode_views(
    encoder: &mut DescriptorEncoder<'_>,
    views: &[ViewInfo],
) -> Result<(), std::fmt::Error> {
    let mut m = encoder.encode_descriptor(
        "mountgroup_views",
        "Published views by state: serving; waiting (its mount did not answer within a second: its share stalls or its server is away); dead",
        None,
        MetricType::Gauge,
    )?;
    for (name, state) in [
        ("serving", ViewState::Serving),
        ("waiting", ViewState::Waiting),
        ("dead", ViewState::Dead),
    ] {
        let n = views.iter().filter(|v| v.state == state).count() as i64;
        m.encode_family(&[("state", name)])?.encode_gauge(&n)?;
    }

    // Per view: how it is served, and why not natively where its volume is native.
    let mut m = encoder.encode_descriptor(
        "mountgroup_view_mechanism",
        "1 for each published view, labelled by how it is served (native: an idmapped bind mount; fuse; fuse-native: a FUSE view with the native presentation; fuse-as-callers: that, acting as each caller on a share that keeps owners; fuse-cifs; fuse-user-xattr) and, for a native volume served by FUSE, why (fallback)",
        None,
        MetricType::Gauge,
    )?;
    for v in views {
        let target = v.target.display().to_string();
        m.encode_family(&[
            ("volume_id", v.volume_id.as_str()),
            ("target", target.as_str()),
            ("mechanism", v.mechanism),
            ("fallback", v.fallback.as_deref().unwrap_or("")),
        ])?
        .encode_gauge(&1)?;
    }
    Ok(())
}

/// Each view's own samples ([`PER_VIEW`]), of the views that serve or wait on their
/// share and wrote a snapshot, labelled by volume and target.
fn encode_per_view(
    encoder: &mut DescriptorEncoder<'_>,
    views: &[ViewInfo],
) -> Result<(), std::fmt::Error> {
    // Per view: the views that serve, or wait on their share, and wrote a
    // snapshot, labelled by volume and target.
    let per_view: Vec<(&str, String, &Snapshot)> = views
        .iter()
        .filter(|v| v.state != ViewState::Dead)
        .filter_map(|v| {
            let s = v.stats.as_ref()?;
            Some((v.volume_id.as_str(), v.target.display().to_string(), s))
        })
        .collect();
    for (name, help, value) in PER_VIEW {
        let kind = match value(&Snapshot::default()) {
            Sample::Gauge(_) | Sample::GaugeF(_) => MetricType::Gauge,
            Sample::Counter(_) | Sample::CounterF(_) => MetricType::Counter,
        };
        let mut m = encoder.encode_descriptor(name, help, None, kind)?;
        for (volume_id, target, snapshot) in &per_view {
            let labels = [("volume_id", *volume_id), ("target", target.as_str())];
            let mut m = m.encode_family(&labels)?;
            match value(snapshot) {
                Sample::Gauge(g) => m.encode_gauge(&g)?,
                Sample::GaugeF(g) => m.encode_gauge(&g)?,
                Sample::Counter(c) => m.encode_counter::<NoLabelSet, _, u64>(&c, None)?,
                Sample::CounterF(c) => m.encode_counter::<NoLabelSet, _, u64>(&c, None)?,
            }
        }
    }
    Ok(())
}

/// The FUSE operations of all the node's views together: counts, errors, errnos,
/// durations.
fn encode_operations(
    encoder: &mut DescriptorEncoder<'_>,
    views: &[ViewInfo],
) -> Result<(), std::fmt::Error> {
    let mut total = Snapshot::default();
    for s in views.iter().filter_map(|v| v.stats.as_ref()) {
        total.add(s);
    }
    let mut m = encoder.encode_descriptor(
        "mountgroup_view_operations",
        "FUSE operations served by the node's views",
        None,
        MetricType::Counter,
    )?;
    for (op, o) in &total.ops {
        m.encode_family(&[("op", op.as_str())])?
            .encode_counter::<NoLabelSet, _, u64>(&o.count, None)?;
    }
    let mut m = encoder.encode_descriptor(
        "mountgroup_view_operation_errors",
        "FUSE operations the node's views answered with an error",
        None,
        MetricType::Counter,
    )?;
    for (op, o) in &total.ops {
        m.encode_family(&[("op", op.as_str())])?
            .encode_counter::<NoLabelSet, _, u64>(&o.errors, None)?;
    }
    let mut m = encoder.encode_descriptor(
        "mountgroup_view_operation_errnos",
        "FUSE operations the node's views answered with an error, by errno",
        None,
        MetricType::Counter,
    )?;
    for (op, o) in &total.ops {
        for (errno, n) in &o.errnos {
            m.encode_family(&[("op", op.as_str()), ("errno", errno.as_str())])?
                .encode_counter::<NoLabelSet, _, u64>(n, None)?;
        }
    }
    let mut m = encoder.encode_descriptor(
        "mountgroup_view_operation_duration_seconds",
        "How long the node's views took to serve FUSE operations",
        None,
        MetricType::Histogram,
    )?;
    for (op, o) in &total.ops {
        // The snapshot is cumulative per bucket; the encoder wants each bucket's own.
        let mut buckets = Vec::with_capacity(BUCKETS.len() + 1);
        let mut below = 0;
        for (bound, cumulative) in BUCKETS.iter().zip(&o.buckets) {
            buckets.push((*bound, cumulative - below));
            below = *cumulative;
        }
        buckets.push((f64::INFINITY, o.count.saturating_sub(below)));
        m.encode_family(&[("op", op.as_str())])?
            .encode_histogram::<NoLabelSet>(o.sum_seconds, o.count, &buckets, None)?;
    }
    Ok(())
}

/// A tower layer that times every gRPC call and counts it by method and code.
#[derive(Clone)]
pub struct MetricsLayer(pub Arc<Metrics>);

impl<S> tower::Layer<S> for MetricsLayer {
    type Service = Metered<S>;
    fn layer(&self, inner: S) -> Metered<S> {
        Metered {
            inner,
            metrics: Arc::clone(&self.0),
        }
    }
}

/// The service [`MetricsLayer`] wraps around the gRPC routes.
#[derive(Clone)]
pub struct Metered<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, B, R> tower::Service<http::Request<B>> for Metered<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // "/csi.v1.Node/NodePublishVolume" → "NodePublishVolume"
        let method = req
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let metrics = Arc::clone(&self.metrics);
        // The clone that was made ready is the one to call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let start = Instant::now();
        Box::pin(async move {
            let response = inner.call(req).await?;
            // An error is a trailers-only response: its grpc-status is in the headers.
            // A success carries grpc-status 0 in the trailers.
            let code = response
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<i32>().ok())
                .map_or(tonic::Code::Ok, tonic::Code::from_i32);
            metrics.observe(&method, code, start.elapsed().as_secs_f64());
            Ok(response)
        })
    }
}

/// Serves `GET /metrics` on `listener` until the process ends, in a task of its own.
/// The caller binds it, so that a bad `--metrics-addr` is refused before the driver
/// starts anything.
pub fn serve_http(listener: tokio::net::TcpListener, metrics: Arc<Metrics>) {
    if let Ok(bound) = listener.local_addr() {
        tracing::info!(addr = %bound, "serving metrics at /metrics");
    }
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let metrics = Arc::clone(&metrics);
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let metrics = Arc::clone(&metrics);
                        async move {
                            let response = if req.uri().path() == "/metrics" {
                                http::Response::builder()
                                    .header(
                                        "content-type",
                                        "text/plain; version=0.0.4; charset=utf-8",
                                    )
                                    .body(Full::new(Bytes::from(metrics.encode())))
                            } else {
                                http::Response::builder()
                                    .status(404)
                                    .body(Full::new(Bytes::from_static(b"not found\n")))
                            };
                            response.map_err(|e| std::io::Error::other(e.to_string()))
                        }
                    });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
}
