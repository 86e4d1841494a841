//! A DaemonSet rolling update (`maxSurge: 1`) as kubelet lives through it: two node
//! "pods", each with the driver and a node-driver-registrar stand-in in containers of
//! their own (PID namespaces, as tests/zero_downtime.rs makes them), a plugin-watcher
//! stand-in that registers and deregisters the driver as kubelet's does, and kubelet's
//! prober running the registrar's probes exactly as deploy/node.yaml declares them.
//! After the update the driver must be registered and a publish through it succeed.
//!
//! The stand-ins do what the upstream source does:
//! - node-driver-registrar v2.15.0 `cmd/csi-node-driver-registrar/main.go` `main`:
//!   connect to the driver's socket (waiting until it answers) and ask GetPluginInfo
//!   for the name; `node_register.go` `nodeRegister`: remove whatever is at
//!   `<registration dir>/<name>-reg.sock` (`util.CleanupSocketFile`) and listen there;
//!   `httpServer`'s `/healthz`: 404 when the socket file is gone, 500 when it does not
//!   answer GetInfo, else 200; `removeRegSocket`: on SIGTERM delete the socket path,
//!   unconditionally, and exit 0.
//! - kubelet `pkg/kubelet/pluginmanager` (pluginwatcher, reconciler): a socket that
//!   appears (or is replaced) in the registration directory is registered after a
//!   GetInfo on it; one that disappears is deregistered, and the CSI plugin's
//!   `DeRegisterPlugin` forgets the driver by name.
//! - kubelet's prober (`pkg/kubelet/prober`): liveness runs only once the startup
//!   probe has succeeded; `failureThreshold` failures in a row restart the container; a
//!   response from 200 to 399 is a success.
//!
//! The GetInfo exchange is a line protocol here rather than the pluginregistration
//! gRPC service: what matters to the update is who creates and deletes the socket.

mod common;
#[path = "common/container.rs"]
mod container;
#[path = "common/driver.rs"]
mod driver;
// container.rs starts keepers with it.
#[path = "common/keeper.rs"]
mod keeper;

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use container::*;
use driver::*;
use mountgroup::csi::pb;
use rustix::process::Signal;

const DRIVER: &str = "mountgroup.csi.io";

/// Not a test: the node-driver-registrar stand-in, run by
/// `a_rolling_update_ends_with_the_driver_registered` in a container of its own (this
/// test program started again with `--ignored --exact registrar_stand_in`).
#[test]
#[ignore = "the registrar stand-in's entry point, started by the rolling-update test"]
fn registrar_stand_in() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    let csi = PathBuf::from(var("STANDIN_CSI_ADDRESS"));
    let registration_dir = PathBuf::from(var("STANDIN_REGISTRATION_DIR"));
    let kubelet_path = var("STANDIN_KUBELET_REGISTRATION_PATH");
    let port_file = PathBuf::from(var("STANDIN_PORT_FILE"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        // main.go: connect (waiting for the driver) and ask its name.
        let name = loop {
            if let Ok(ch) = channel(csi.clone()).await {
                let mut id = pb::identity_client::IdentityClient::new(ch);
                if let Ok(r) = id.get_plugin_info(pb::GetPluginInfoRequest {}).await {
                    break r.into_inner().name;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // nodeRegister: CleanupSocketFile, then listen.
        let socket = registration_dir.join(format!("{name}-reg.sock"));
        let _ = fs::remove_file(&socket);
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        // removeRegSocket: SIGTERM deletes the path, whoever made it.
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
        let on_term = socket.clone();
        tokio::spawn(async move {
            term.recv().await;
            let _ = fs::remove_file(&on_term);
            std::process::exit(0);
        });
        // httpServer: /healthz on the --http-endpoint.
        let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        fs::write(&port_file, http.local_addr().unwrap().port().to_string()).unwrap();
        let (probe_socket, probe_name) = (socket.clone(), name.clone());
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            loop {
                let Ok((mut conn, _)) = http.accept().await else {
                    continue;
                };
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf).await;
                let (sock, want) = (probe_socket.clone(), probe_name.clone());
                // checkLiveRegistrationSocket: GetInfo on the socket, answered by this
                // same process (off the runtime's threads, which serve it).
                let answers = tokio::task::spawn_blocking(move || {
                    get_info(&sock).is_some_and(|(n, _)| n == want)
                });
                let status = if !probe_socket.exists() {
                    "404 Not Found"
                } else if answers.await.unwrap_or(false) {
                    "200 OK"
                } else {
                    "500 Internal Server Error"
                };
                let _ = conn
                    .write_all(
                        format!(
                            "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        )
                        .as_bytes(),
                    )
                    .await;
            }
        });
        // The Registration service: GetInfo answers the name and the endpoint.
        loop {
            let (conn, _) = listener.accept().await.unwrap();
            let answer = format!("{name}\n{kubelet_path}\n");
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                let mut conn = conn;
                let _ = conn.write_all(answer.as_bytes()).await;
            });
        }
    });
}

/// GetInfo on a registration socket: the driver's name and endpoint.
fn get_info(socket: &Path) -> Option<(String, String)> {
    let conn = std::os::unix::net::UnixStream::connect(socket).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut lines = BufReader::new(conn).lines();
    let name = lines.next()?.ok()?;
    let endpoint = lines.next()?.ok()?;
    Some((name, endpoint))
}

/// A container running this test program as the registrar stand-in; `restart` is
/// what kubelet does when its liveness probe fails.
struct Registrar {
    container: Option<Container>,
    port_file: PathBuf,
    env: Vec<(&'static str, String)>,
    log: PathBuf,
}

impl Registrar {
    fn start(root: &Path, pod: &str, csi: &Path, registration_dir: &Path) -> Registrar {
        let port_file = root.join(format!("{pod}-registrar.port"));
        let env = vec![
            ("STANDIN_CSI_ADDRESS", csi.to_str().unwrap().to_string()),
            (
                "STANDIN_REGISTRATION_DIR",
                registration_dir.to_str().unwrap().to_string(),
            ),
            (
                "STANDIN_KUBELET_REGISTRATION_PATH",
                csi.to_str().unwrap().to_string(),
            ),
            ("STANDIN_PORT_FILE", port_file.to_str().unwrap().to_string()),
        ];
        let mut r = Registrar {
            container: None,
            port_file,
            env,
            log: root.join(format!("{pod}-registrar.log")),
        };
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        let _ = fs::remove_file(&self.port_file);
        let env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.container = Some(Container::start_with_env(
            &std::env::current_exe().unwrap(),
            &["--ignored", "--exact", "registrar_stand_in", "--nocapture"],
            &env,
            &self.log,
        ));
    }

    /// As a runtime stops a container: SIGTERM, SIGKILL after the grace period.
    fn stop(&mut self) {
        if let Some(mut c) = self.container.take() {
            c.stop(Duration::from_secs(10));
        }
    }

    fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// GET /healthz with the probe's timeout; None when nothing answered in time.
    fn healthz(&self, timeout: Duration) -> Option<u16> {
        let port: u16 = fs::read_to_string(&self.port_file)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let mut conn = std::net::TcpStream::connect_timeout(
            &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            timeout,
        )
        .ok()?;
        conn.set_read_timeout(Some(timeout)).ok()?;
        conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .ok()?;
        let mut head = String::new();
        conn.read_to_string(&mut head).ok()?;
        head.split_whitespace().nth(1)?.parse().ok()
    }
}

/// A probe as deploy/node.yaml declares it on the registrar container.
#[derive(Clone, Copy, Debug)]
struct Probe {
    period: Duration,
    timeout: Duration,
    failure_threshold: u32,
}

/// The `startupProbe` and `livenessProbe` of the `node-driver-registrar` container in
/// deploy/node.yaml (either may be absent), and the `--http-endpoint` they reach.
fn registrar_probes() -> (Option<Probe>, Option<Probe>) {
    let yaml =
        fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/node.yaml")).unwrap();
    let start = yaml
        .find("- name: node-driver-registrar")
        .expect("a node-driver-registrar container");
    let rest = &yaml[start + 1..];
    let block = &rest[..rest.find("\n        - name:").unwrap_or(rest.len())];
    let probe = |key: &str| -> Option<Probe> {
        let at = block.find(&format!("{key}:"))?;
        let body: Vec<&str> = block[at..]
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("            "))
            .collect();
        let num = |k: &str, default: u64| {
            body.iter()
                .filter_map(|l| l.trim().strip_prefix(&format!("{k}:")))
                .map(|v| v.split('#').next().unwrap().trim().parse::<u64>().unwrap())
                .next()
                .unwrap_or(default)
        };
        // Kubernetes' defaults: period 10 s, timeout 1 s, failureThreshold 3.
        Some(Probe {
            period: Duration::from_secs(num("periodSeconds", 10)),
            timeout: Duration::from_secs(num("timeoutSeconds", 1)),
            failure_threshold: num("failureThreshold", 3) as u32,
        })
    };
    let (startup, liveness) = (probe("startupProbe"), probe("livenessProbe"));
    if startup.is_some() || liveness.is_some() {
        assert!(
            block.contains("--http-endpoint=:9809") && block.contains("path: /healthz"),
            "the registrar's probes reach its /healthz"
        );
    }
    (startup, liveness)
}

/// kubelet's prober for one registrar container: the startup probe until it succeeds,
/// then the liveness probe; a run of failures restarts the container.
fn prober(
    registrar: Arc<Mutex<Registrar>>,
    probing: Arc<AtomicBool>,
    restarts: Arc<Mutex<Vec<Instant>>>,
    ready: Arc<AtomicBool>,
) {
    let (startup, liveness) = registrar_probes();
    let Some(liveness) = liveness else {
        // No liveness probe: kubelet never restarts the container; it is ready once
        // running (a startup probe alone would still gate readiness, but not restart).
        ready.store(true, Ordering::Relaxed);
        return;
    };
    let mut started = startup.is_none();
    ready.store(started, Ordering::Relaxed);
    let mut failures = 0;
    while probing.load(Ordering::Relaxed) {
        let p = if started { liveness } else { startup.unwrap() };
        thread::sleep(p.period);
        // The pod's deletion ends probing at once: checked under the container's lock,
        // which the deletion takes to stop it.
        let mut r = registrar.lock().unwrap();
        if !probing.load(Ordering::Relaxed) {
            return;
        }
        let code = r.healthz(p.timeout);
        if code.is_some_and(|c| (200..400).contains(&c)) {
            started = true;
            // Without a readiness probe, a started container is ready.
            ready.store(true, Ordering::Relaxed);
            failures = 0;
            continue;
        }
        failures += 1;
        if failures >= p.failure_threshold {
            r.restart();
            restarts.lock().unwrap().push(Instant::now());
            started = startup.is_none();
            ready.store(started, Ordering::Relaxed);
            failures = 0;
        }
    }
}

/// kubelet's plugin watcher and reconciler, and the CSI plugin's registry of drivers:
/// driver name → endpoint, with every change and when it happened.
#[derive(Default)]
struct Kubelet {
    /// Where the containers' logs are, to show when something is not reached.
    logs: PathBuf,
    drivers: Mutex<HashMap<String, String>>,
    events: Mutex<Vec<(Instant, String)>>,
}

impl Kubelet {
    fn watch(self: &Arc<Self>, dir: PathBuf, stop: Arc<AtomicBool>) -> thread::JoinHandle<()> {
        let me = Arc::clone(self);
        thread::spawn(move || {
            // socket path → (inode, the driver it registered)
            let mut seen: HashMap<PathBuf, (u64, Option<String>)> = HashMap::new();
            while !stop.load(Ordering::Relaxed) {
                let now: HashMap<PathBuf, u64> = fs::read_dir(&dir)
                    .unwrap()
                    .filter_map(|e| e.ok())
                    .filter_map(|e| Some((e.path(), fs::symlink_metadata(e.path()).ok()?.ino())))
                    .collect();
                // Removed or replaced: deregistered (csi_plugin.go DeRegisterPlugin).
                let gone: Vec<PathBuf> = seen
                    .iter()
                    .filter(|(p, (ino, _))| now.get(*p) != Some(ino))
                    .map(|(p, _)| p.clone())
                    .collect();
                for p in gone {
                    if let Some((_, Some(name))) = seen.remove(&p) {
                        me.drivers.lock().unwrap().remove(&name);
                        me.events
                            .lock()
                            .unwrap()
                            .push((Instant::now(), format!("deregistered {name}")));
                    }
                }
                // New: GetInfo, then registered (RegisterPlugin); retried if it fails.
                for (p, ino) in now {
                    if seen.get(&p).is_some_and(|(_, n)| n.is_some()) {
                        continue;
                    }
                    let info = get_info(&p);
                    if let Some((name, endpoint)) = &info {
                        me.drivers
                            .lock()
                            .unwrap()
                            .insert(name.clone(), endpoint.clone());
                        me.events
                            .lock()
                            .unwrap()
                            .push((Instant::now(), format!("registered {name}")));
                    }
                    seen.insert(p, (ino, info.map(|(n, _)| n)));
                }
                thread::sleep(Duration::from_millis(20));
            }
        })
    }

    fn log_text(&self) -> String {
        let mut out = String::new();
        for e in fs::read_dir(&self.logs).unwrap().filter_map(|e| e.ok()) {
            if e.path().extension().is_some_and(|x| x == "log") {
                out += &format!(
                    "--- {}\n{}",
                    e.path().display(),
                    fs::read_to_string(e.path()).unwrap_or_default()
                );
            }
        }
        out
    }

    fn endpoint(&self) -> Option<String> {
        self.drivers.lock().unwrap().get(DRIVER).cloned()
    }

    /// When the last event of this kind happened.
    fn last(&self, kind: &str) -> Instant {
        self.events
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(_, e)| e.starts_with(kind))
            .map(|(t, _)| *t)
            .unwrap()
    }

    fn registrations(&self) -> usize {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, e)| e.starts_with("registered"))
            .count()
    }

    fn wait(&self, what: &str, limit: Duration, cond: impl Fn(&Self) -> bool) -> Instant {
        let deadline = Instant::now() + limit;
        while !cond(self) {
            assert!(
                Instant::now() < deadline,
                "{what}: not within {limit:?}; kubelet saw {:?}\n{}",
                self.events
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|(_, e)| e)
                    .collect::<Vec<_>>(),
                self.log_text()
            );
            thread::sleep(Duration::from_millis(20));
        }
        Instant::now()
    }

    /// The node client kubelet would use: the registered endpoint, or "driver not found".
    async fn node(&self) -> pb::node_client::NodeClient<tonic::transport::Channel> {
        let endpoint = self.endpoint().unwrap_or_else(|| {
            panic!("driver name {DRIVER} not found in the list of registered CSI drivers")
        });
        pb::node_client::NodeClient::new(channel(endpoint.into()).await.unwrap())
    }
}

/// A node plugin pod: the driver and its registrar, each in a container, and kubelet's
/// prober on the registrar. Its driver listens where every pod's does (a hostPath).
struct NodePod {
    driver: Driver,
    registrar: Arc<Mutex<Registrar>>,
    probing: Arc<AtomicBool>,
    prober: Option<thread::JoinHandle<()>>,
    /// Whether the pod is ready (its registrar's startup probe has succeeded).
    ready: Arc<AtomicBool>,
}

impl NodePod {
    fn start(
        root: &Path,
        name: &str,
        registration_dir: &Path,
        restarts: &Arc<Mutex<Vec<Instant>>>,
    ) -> NodePod {
        let driver = Driver::start_in(
            root,
            root.join("share"),
            CONTAINER,
            Path::new(BIN),
            &["--share-key-file", "none"],
        );
        let registrar = Arc::new(Mutex::new(Registrar::start(
            root,
            name,
            &driver.socket,
            registration_dir,
        )));
        let (probing, ready) = (
            Arc::new(AtomicBool::new(true)),
            Arc::new(AtomicBool::new(false)),
        );
        let prober = {
            let (r, p, n, ready) = (
                Arc::clone(&registrar),
                Arc::clone(&probing),
                Arc::clone(restarts),
                Arc::clone(&ready),
            );
            thread::spawn(move || prober(r, p, n, ready))
        };
        NodePod {
            driver,
            registrar,
            probing,
            prober: Some(prober),
            ready,
        }
    }

    /// The pod is deleted: probing ends, every container gets SIGTERM.
    fn stop(&mut self) {
        {
            let mut r = self.registrar.lock().unwrap();
            self.probing.store(false, Ordering::Relaxed);
            r.stop();
        }
        self.driver.signal_first_process(Signal::TERM);
        if let Some(p) = self.prober.take() {
            p.join().unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_update_ends_with_the_driver_registered() {
    let f = Fixture::new();
    let root = f.dir.path();
    let registration_dir = f.subdir("plugins_registry");
    let stop = Arc::new(AtomicBool::new(false));
    let kubelet = Arc::new(Kubelet {
        logs: root.to_path_buf(),
        ..Default::default()
    });
    let watcher = kubelet.watch(registration_dir.clone(), Arc::clone(&stop));
    let restarts = Arc::new(Mutex::new(Vec::new()));

    // The old pod: the driver and its registrar, each in a container, probed.
    let mut pod1 = NodePod::start(root, "pod1", &registration_dir, &restarts);
    kubelet.wait("the first registration", Duration::from_secs(30), |k| {
        k.endpoint().is_some()
    });
    let mut c = pod1.driver.clients().await;
    c.controller
        .create_volume(create_req("vol", 1 << 30))
        .await
        .unwrap();
    let staging = f.subdir("staging");
    let target1 = root.join("pod-a");
    let mut node = kubelet.node().await;
    node.node_stage_volume(stage_req("vol", &staging))
        .await
        .unwrap();
    node.node_publish_volume(publish_req("vol", &staging, &target1, "3001"))
        .await
        .unwrap();

    // maxSurge 1: the new pod starts beside the old one. Its driver waits for the
    // state directory; its registrar asks the old driver's name and replaces the
    // registration socket, and kubelet registers it again.
    let before = kubelet.registrations();
    let mut pod2 = NodePod::start(root, "pod2", &registration_dir, &restarts);
    kubelet.wait(
        "the new registrar's registration",
        Duration::from_secs(30),
        |k| k.registrations() > before,
    );
    // The DaemonSet controller stops the old pod once the new one is ready (with the
    // registrar's startup probe: once it has registered).
    kubelet.wait("the new pod ready", Duration::from_secs(60), |_| {
        pod2.ready.load(Ordering::Relaxed)
    });
    // The old pod is stopped: every container gets SIGTERM.
    let stopped = Instant::now();
    pod1.stop();
    kubelet.wait(
        "the old registrar's deregistration",
        Duration::from_secs(10),
        |k| k.endpoint().is_none(),
    );
    let lost = kubelet.last("deregistered");
    // kubelet must get the driver back by itself, within the probes' budget.
    let (startup, liveness) = registrar_probes();
    let budget = liveness
        .map(|l| l.period * (l.failure_threshold + 1) + l.timeout)
        .unwrap_or_default()
        + startup.map(|s| s.period * 2).unwrap_or_default()
        + Duration::from_secs(15);
    kubelet.wait(
        "the driver registered again after the update",
        budget.max(Duration::from_secs(30)),
        |k| k.endpoint().is_some(),
    );
    let back = kubelet.last("registered");
    eprintln!(
        "driver not found for {:?} (from the old pod's stop: {:?}); registrar restarts: {}",
        back - lost,
        back - stopped,
        restarts.lock().unwrap().len()
    );
    // Every call works again through the registration: a republish of the old pod's
    // target, a new pod's publish.
    let mut node = kubelet.node().await;
    node.node_publish_volume(publish_req("vol", &staging, &target1, "3001"))
        .await
        .expect("a republish after the update");
    let target2 = root.join("pod-b");
    node.node_publish_volume(publish_req("vol", &staging, &target2, "3002"))
        .await
        .expect("a publish after the update");
    assert_eq!(fs::metadata(&target2).unwrap().gid(), 3002);
    for t in [&target1, &target2] {
        node.node_unpublish_volume(unpublish_req("vol", t))
            .await
            .unwrap();
    }
    node.node_unstage_volume(unstage_req("vol", &staging))
        .await
        .unwrap();

    pod2.stop();
    stop.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
}
