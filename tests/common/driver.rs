//! A `mountgroup serve` child process and tonic clients that talk to it over its
//! unix socket, the way kubelet and the sidecars do. Dropping the driver stops it and
//! unmounts every view and staging bind under its directory, even when a test fails.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use mountgroup::csi::pb;
use mountgroup::csi::pb::controller_client::ControllerClient;
use mountgroup::csi::pb::identity_client::IdentityClient;
use mountgroup::csi::pb::node_client::NodeClient;
use mountgroup::csi::pb::volume_capability::access_mode::Mode;
use mountgroup::csi::pb::volume_capability::{AccessMode, AccessType, MountVolume};
use rustix::process::{Pid, Signal, kill_process};
use tonic::transport::Channel;

use super::BIN;

pub struct Driver {
    child: Option<Child>,
    /// A command the driver runs under (e.g. `unshare --pid --fork`), which must exec
    /// the rest; and the binary it runs.
    wrapper: Vec<String>,
    bin: PathBuf,
    /// Extra `serve` arguments.
    args: Vec<String>,
    pub root: PathBuf,
    pub socket: PathBuf,
    pub state: PathBuf,
    pub share: PathBuf,
    pub log: PathBuf,
}

pub struct Clients {
    pub identity: IdentityClient<Channel>,
    pub controller: ControllerClient<Channel>,
    pub node: NodeClient<Channel>,
}

impl Driver {
    /// Starts `mountgroup serve` with everything under `root`, without a share key
    /// (the protocol tests; the key has its own tests), and waits for its socket.
    pub fn start(root: &Path) -> Driver {
        Driver::start_with(root, root.join("share"), &["--share-key-file", "none"])
    }

    /// [`Driver::start`] without waiting for anything: the process runs, its socket
    /// may not exist yet.
    pub fn launch(root: &Path) -> Driver {
        let mut d = Driver::unstarted(
            root,
            root.join("share"),
            &[],
            Path::new(BIN),
            &["--share-key-file", "none"],
        );
        d.spawn_process();
        d
    }

    /// Starts `mountgroup serve` with the share at `share` and extra arguments; with
    /// no `--share-key-file` the driver generates its key in the state directory.
    pub fn start_with(root: &Path, share: PathBuf, args: &[&str]) -> Driver {
        Driver::start_in(root, share, &[], Path::new(BIN), args)
    }

    /// [`Driver::start`] with metrics served on a free port (`--metrics-addr`, found
    /// with [`Driver::metrics_addr`]) and JSON logs.
    pub fn start_with_metrics(root: &Path) -> Driver {
        Driver::start_with_metrics_and(root, &[])
    }

    /// [`Driver::start_with_metrics`] with `extra` arguments.
    pub fn start_with_metrics_and(root: &Path, extra: &[&str]) -> Driver {
        let mut args = vec![
            "--share-key-file",
            "none",
            "--metrics-addr",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ];
        args.extend(extra);
        Driver::start_with(root, root.join("share"), &args)
    }

    /// A driver whose views the keeper at `keeper` runs (`serve --keeper-socket`, as
    /// the DaemonSet runs it), without a share key, under `wrapper`, with the binary
    /// `bin` and `extra` arguments.
    pub fn start_kept(
        root: &Path,
        wrapper: &[&str],
        bin: &Path,
        keeper: &Path,
        extra: &[&str],
    ) -> Driver {
        let mut args = vec![
            "--share-key-file",
            "none",
            "--keeper-socket",
            keeper.to_str().unwrap(),
        ];
        args.extend(extra);
        Driver::start_in(root, root.join("share"), wrapper, bin, &args)
    }

    /// [`Driver::start_with`] under `wrapper` (a command and its arguments that execs
    /// the rest), with the binary `bin`.
    pub fn start_in(
        root: &Path,
        share: PathBuf,
        wrapper: &[&str],
        bin: &Path,
        args: &[&str],
    ) -> Driver {
        let mut d = Driver::unstarted(root, share, wrapper, bin, args);
        d.spawn();
        d
    }

    fn unstarted(
        root: &Path,
        share: PathBuf,
        wrapper: &[&str],
        bin: &Path,
        args: &[&str],
    ) -> Driver {
        Driver {
            child: None,
            wrapper: wrapper.iter().map(|s| s.to_string()).collect(),
            bin: bin.to_path_buf(),
            args: args.iter().map(|s| s.to_string()).collect(),
            root: root.to_path_buf(),
            socket: root.join("csi/csi.sock"),
            state: root.join("state"),
            share,
            log: root.join("driver.log"),
        }
    }

    /// Starts the process and waits until it listens on its socket.
    fn spawn(&mut self) {
        self.spawn_process();
        let deadline = Instant::now() + Duration::from_secs(30);
        // A socket file may be left from before: wait until someone listens on it.
        while std::os::unix::net::UnixStream::connect(&self.socket).is_err() {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("driver exited with {status}: {}", self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "no socket after 30 s: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn spawn_process(&mut self) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = crate::common::command_under(&self.wrapper, &self.bin);
        cmd.arg("serve")
            .arg("--endpoint")
            .arg(format!("unix://{}", self.socket.display()))
            .arg("--node-id")
            .arg("test-node")
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--share-root")
            .arg(&self.share)
            .arg("--runtime-dir")
            .arg(self.root.join("run"))
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if self.args.iter().any(|a| a == "--log") {
            // The test chose a filter; RUST_LOG would override it.
            cmd.env_remove("RUST_LOG");
        } else {
            cmd.env("RUST_LOG", "mountgroup=debug,info");
        }
        self.child = Some(cmd.spawn().unwrap());
    }

    /// The address its metrics are served at (`--metrics-addr`, with `--log-format
    /// json`), as it logged it.
    pub fn metrics_addr(&self) -> String {
        let log = self.log_text();
        // The last: a driver restarted on the same state appends to its log.
        log.lines()
            .rev()
            .find(|l| l.contains("serving metrics"))
            .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .and_then(|v| v["fields"]["addr"].as_str().map(String::from))
            .unwrap_or_else(|| panic!("no metrics address logged: {log}"))
    }

    /// The share key the driver generated.
    pub fn key(&self) -> String {
        fs::read_to_string(self.state.join("share.key")).expect("a generated share key")
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// SIGKILL: the driver dies mid-life, its views do not.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// Waits until the driver's process (or its wrapper) has exited.
    pub fn wait_exit(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.wait().unwrap();
        }
    }

    /// SIGTERM, and the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut c = self.child.take()?;
        let _ = kill_process(Pid::from_raw(c.id() as i32).unwrap(), Signal::TERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(s) = c.try_wait().unwrap() {
                return s.code();
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Signals the first process of the driver's container (the wrapper's child, as
    /// a runtime signals a container) and waits for the container to end.
    pub fn signal_first_process(&mut self, signal: Signal) {
        let wrapper = self.pid();
        let init = fs::read_to_string(format!("/proc/{wrapper}/task/{wrapper}/children"))
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse::<i32>()
            .unwrap();
        kill_process(Pid::from_raw(init).unwrap(), signal).unwrap();
        self.wait_exit();
    }

    /// Starts the driver again on the same directories.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop the driver first");
        self.spawn();
    }

    pub async fn clients(&self) -> Clients {
        let channel = channel(self.socket.clone()).await.unwrap();
        Clients {
            identity: IdentityClient::new(channel.clone()),
            controller: ControllerClient::new(channel.clone()),
            node: NodeClient::new(channel),
        }
    }

    /// Every mount point below the driver's directory.
    pub fn mounts_below(&self) -> Vec<PathBuf> {
        mounts_below(&self.root)
    }
}

/// A gRPC channel to a unix socket, as kubelet and the sidecars dial one.
pub async fn channel(path: PathBuf) -> Result<Channel, tonic::transport::Error> {
    tonic::transport::Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
}

pub fn mounts_below(root: &Path) -> Vec<PathBuf> {
    let prefix = root.to_string_lossy().to_string();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&prefix))
        .map(|m| PathBuf::from(m.replace("\\040", " ")))
        .collect()
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.terminate();
        // Views are processes of their own: unmounting ends them.
        for m in mounts_below(&self.root).into_iter().rev() {
            let _ = rustix::mount::unmount(&m, rustix::mount::UnmountFlags::DETACH);
        }
    }
}

/// A mount capability with flags and a group.
pub fn mount_cap(flags: &[&str], group: &str, mode: Mode) -> pb::VolumeCapability {
    pb::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: String::new(),
            mount_flags: flags.iter().map(|s| s.to_string()).collect(),
            volume_mount_group: group.into(),
        })),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

pub fn rw_cap(group: &str) -> pb::VolumeCapability {
    mount_cap(&[], group, Mode::SingleNodeMultiWriter)
}

pub fn create_req(name: &str, bytes: i64) -> pb::CreateVolumeRequest {
    pb::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![rw_cap("")],
        ..Default::default()
    }
}

pub fn stage_req(id: &str, staging: &Path) -> pb::NodeStageVolumeRequest {
    pb::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_string_lossy().into(),
        volume_capability: Some(rw_cap("")),
        ..Default::default()
    }
}

pub fn publish_req(
    id: &str,
    staging: &Path,
    target: &Path,
    group: &str,
) -> pb::NodePublishVolumeRequest {
    pb::NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_string_lossy().into(),
        target_path: target.to_string_lossy().into(),
        volume_capability: Some(rw_cap(group)),
        ..Default::default()
    }
}

/// A publish with `mount_flags`, a group and `readonly`, as kubelet sends a PV's
/// `mountOptions` and a pod's volume.
pub fn publish_flags(
    id: &str,
    staging: &Path,
    target: &Path,
    flags: &[&str],
    group: &str,
    readonly: bool,
) -> pb::NodePublishVolumeRequest {
    pb::NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_string_lossy().into(),
        target_path: target.to_string_lossy().into(),
        volume_capability: Some(mount_cap(flags, group, Mode::SingleNodeMultiWriter)),
        readonly,
        ..Default::default()
    }
}

pub fn unpublish_req(id: &str, target: &Path) -> pb::NodeUnpublishVolumeRequest {
    pb::NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.to_string_lossy().into(),
    }
}

pub fn stats_req(id: &str, path: &Path) -> pb::NodeGetVolumeStatsRequest {
    pb::NodeGetVolumeStatsRequest {
        volume_id: id.into(),
        volume_path: path.to_string_lossy().into(),
        staging_target_path: String::new(),
    }
}

/// The bytes NodeGetVolumeStats reports for the volume `id` at `target`.
pub async fn stats_bytes(c: &mut Clients, id: &str, target: &Path) -> pb::VolumeUsage {
    c.node
        .node_get_volume_stats(stats_req(id, target))
        .await
        .unwrap()
        .into_inner()
        .usage
        .into_iter()
        .find(|u| u.unit == pb::volume_usage::Unit::Bytes as i32)
        .unwrap()
}

/// The condition NodeGetVolumeStats reports for the volume `id` at `target`: whether
/// it is abnormal, and the message. Fails if the answer takes a minute (kubelet's
/// deadline is two).
pub async fn volume_condition(c: &mut Clients, id: &str, target: &Path) -> (bool, String) {
    let answer = tokio::time::timeout(
        Duration::from_secs(60),
        c.node.node_get_volume_stats(stats_req(id, target)),
    )
    .await
    .expect("NodeGetVolumeStats answered within a minute")
    .unwrap()
    .into_inner();
    let condition = answer.volume_condition.unwrap();
    (condition.abnormal, condition.message)
}

pub fn unstage_req(id: &str, staging: &Path) -> pb::NodeUnstageVolumeRequest {
    pb::NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_string_lossy().into(),
    }
}

/// Asserts a call failed with `code` and a message that names `needle`.
pub fn expect<T: std::fmt::Debug>(r: Result<T, tonic::Status>, code: tonic::Code, needle: &str) {
    let e = r.expect_err("expected an error");
    assert_eq!(e.code(), code, "{e:?}");
    assert!(
        e.message().contains(needle),
        "{:?} should name {needle:?}",
        e.message()
    );
}

impl Clients {
    /// Creates the volume `vol` (1 GiB), stages it at `staging` and publishes it at
    /// `target` with the fsGroup `gid`, as a pod's first use of a new PVC does.
    pub async fn create_stage_publish(
        &mut self,
        vol: &str,
        staging: &Path,
        target: &Path,
        gid: &str,
    ) {
        self.create_stage_publish_with(vol, staging, publish_req(vol, staging, target, gid))
            .await;
    }

    /// [`Clients::create_stage_publish`] with a publish request of the test's own (other
    /// mount flags, another access mode).
    pub async fn create_stage_publish_with(
        &mut self,
        vol: &str,
        staging: &Path,
        publish: pb::NodePublishVolumeRequest,
    ) {
        self.create_and_stage(vol, staging).await;
        self.node.node_publish_volume(publish).await.unwrap();
    }

    /// Creates the volume `vol` (1 GiB) and stages it at `staging`.
    pub async fn create_and_stage(&mut self, vol: &str, staging: &Path) {
        self.controller
            .create_volume(create_req(vol, 1 << 30))
            .await
            .unwrap();
        self.node
            .node_stage_volume(stage_req(vol, staging))
            .await
            .unwrap();
    }

    /// Unpublishes `vol` from `target` and unstages it from `staging`, as kubelet does
    /// when the last pod using it goes.
    pub async fn unpublish_unstage(&mut self, vol: &str, target: &Path, staging: &Path) {
        self.node
            .node_unpublish_volume(unpublish_req(vol, target))
            .await
            .unwrap();
        self.node
            .node_unstage_volume(unstage_req(vol, staging))
            .await
            .unwrap();
    }

    /// The node's advertised RPC capabilities.
    pub async fn node_capabilities(&mut self) -> Vec<i32> {
        self.node
            .node_get_capabilities(pb::NodeGetCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner()
            .capabilities
            .iter()
            .filter_map(|c| {
                c.r#type
                    .as_ref()
                    .map(|pb::node_service_capability::Type::Rpc(r)| r.r#type)
            })
            .collect()
    }

    /// The controller's advertised RPC capabilities.
    pub async fn controller_capabilities(&mut self) -> Vec<i32> {
        self.controller
            .controller_get_capabilities(pb::ControllerGetCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner()
            .capabilities
            .iter()
            .filter_map(|c| {
                c.r#type
                    .as_ref()
                    .map(|pb::controller_service_capability::Type::Rpc(r)| r.r#type)
            })
            .collect()
    }
}

/// The `mountgroup_view_mechanism` sample of `target`: (mechanism, fallback).
pub fn mechanism(addr: &str, target: &Path) -> (String, String) {
    let text = scrape(addr);
    let line = text
        .lines()
        .find(|l| {
            l.starts_with("mountgroup_view_mechanism{")
                && l.contains(&format!("target=\"{}\"", target.display()))
        })
        .unwrap_or_else(|| panic!("no mechanism for {}:\n{text}", target.display()));
    let label = |name: &str| {
        let start = line.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
        line[start..start + line[start..].find('"').unwrap()].to_string()
    };
    (label("mechanism"), label("fallback"))
}

/// Names the pod of a publish as kubelet does with `podInfoOnMount` (pod `name` in
/// namespace `team`).
pub fn for_pod(r: &mut pb::NodePublishVolumeRequest, name: &str) {
    r.volume_context = std::collections::HashMap::from([
        ("csi.storage.k8s.io/pod.name".to_string(), name.to_string()),
        (
            "csi.storage.k8s.io/pod.namespace".to_string(),
            "team".to_string(),
        ),
    ]);
}

/// `GET /metrics` at `addr`: the Prometheus text.
pub fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(
        out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200"),
        "{out}"
    );
    out
}

/// The value of the first sample line that starts with `prefix`.
pub fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// What a pod of the fsGroup `group` gets from the driver's default publish: a driver
/// on `root/share` (metrics on, no share key), the volume `vol` created, staged at
/// `staging` and published at `root/target`, which is unmounted on drop.
pub async fn default_publish(
    root: &Path,
    staging: &Path,
    group: u32,
) -> (Driver, Clients, PathBuf, super::common::Unmount) {
    let d = Driver::start_with_metrics_and(root, &[]);
    let mut c = d.clients().await;
    let target = root.join("target");
    c.create_stage_publish("vol", staging, &target, &group.to_string())
        .await;
    let unmount = super::common::Unmount(target.clone());
    (d, c, target, unmount)
}
