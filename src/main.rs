//! The `mountgroup` command: parse the command line, set up logging, run a subcommand.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use mountgroup::config::ViewOptions;
use mountgroup::logfile::BoundedLog;
use tracing_subscriber::Layer;
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[derive(Parser)]
#[command(
    name = "mountgroup",
    version,
    about = "Group views of volumes: fsGroup at mount time, nothing chowned"
)]
struct Cli {
    /// Log filter in RUST_LOG syntax (e.g. `info`, `mountgroup=debug`); RUST_LOG wins if set.
    #[arg(long, global = true, default_value = "info")]
    log: String,
    /// Log lines for people (`human`) or for log collectors (`json`, one object a line).
    #[arg(long, global = true, default_value = "human", value_parser = ["human", "json"])]
    log_format: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mount a group view of SOURCE on MOUNTPOINT and serve it in the foreground.
    ///
    /// SIGINT or SIGTERM unmount and exit 0. See docs/SEMANTICS.md for the options.
    Mount(MountArgs),
    /// Serve the CSI plugin (Identity, Controller, Node) on a unix socket.
    ///
    /// Every flag has a default good for a local run on one machine.
    Serve(ServeArgs),
    /// Run the views for `serve --keeper-socket`, apart from the gRPC server, and take
    /// over the views other keepers run (a rolling update's old pod, an older binary).
    Keeper(KeeperArgs),
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ShareInitArg {
    Always,
    MountPoint,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// The CSI endpoint kubelet and the sidecars connect to.
    #[arg(long, default_value = "unix:///run/mountgroup/csi.sock")]
    endpoint: String,
    /// This node's id (default: the host name).
    #[arg(long)]
    node_id: Option<String>,
    /// The CSI driver name.
    #[arg(long, default_value = "mountgroup.csi.io")]
    driver_name: String,
    /// Where the node state and the view logs are kept.
    #[arg(long, default_value = "/var/lib/mountgroup/state")]
    state_dir: PathBuf,
    /// The share: the directory that holds every volume.
    #[arg(long, default_value = "/var/lib/mountgroup/share")]
    share_root: PathBuf,
    /// When a share root without the share's marker (.mountgroup-share) is laid out as
    /// a new share: `always` (a directory of this machine), or only when it is a
    /// `mount-point` (a share mounted on every node; until it is mounted the driver is
    /// not ready and creates nothing, so no volume lands on the node's own disk).
    #[arg(long, value_enum, default_value = "always")]
    share_init: ShareInitArg,
    /// The share's access key (mode 0600; generated if absent). Default:
    /// STATE_DIR/share.key. `none` runs without a key (local use only).
    #[arg(long, value_name = "PATH|none")]
    share_key_file: Option<String>,
    /// Where secret views keep their private tmpfs mounts (and the controller mounts a
    /// named share for the length of a call, under shares/).
    #[arg(long, default_value = "/run/mountgroup")]
    runtime_dir: PathBuf,
    /// The longest a NodeStageVolume or CreateVolume waits for a named share's server
    /// to answer its mount, in seconds, when the call's own deadline is longer (or
    /// none): then DEADLINE_EXCEEDED, naming the server, and nothing mounted.
    #[arg(long, value_name = "SECONDS", default_value_t = 50)]
    share_timeout: u64,
    /// ceph-csi's configuration file (its ConfigMap), where a StorageClass's or PV's
    /// `clusterID` finds its monitors.
    #[arg(long, value_name = "PATH", default_value = mountgroup::share::cephfs::CEPH_CSI_CONFIG)]
    ceph_csi_config: PathBuf,
    /// The network namespace to mount named shares in, e.g. `/proc/1/ns/net` (the
    /// host's, with hostPID): a node plugin in a pod of its own mounts there, so that
    /// a share's connection outlives the pod. Default: the driver's own.
    #[arg(long, value_name = "PATH")]
    mount_netns: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 0.0.0.0:9810).
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Have the keeper listening here run the views (`mountgroup keeper`, in a
    /// container of its own). Without it, a keeper inside this process runs them (at
    /// RUNTIME_DIR/keeper.sock): views are still recovered when they die, replaced
    /// when they hang, and taken over by the next `serve`.
    #[arg(long, value_name = "PATH")]
    keeper_socket: Option<PathBuf>,
    /// The Kubernetes API server asked whether a pod runs in a user namespace (whose
    /// native volumes are then FUSE views): `in-cluster` (the cluster's, from
    /// KUBERNETES_SERVICE_HOST, none outside a cluster), `none`, or HOST:PORT.
    #[arg(
        long,
        value_name = "in-cluster|none|HOST:PORT",
        default_value = "in-cluster"
    )]
    kube_api: String,
    /// The bearer token for --kube-api HOST:PORT (read at every request).
    #[arg(long, value_name = "PATH", default_value = mountgroup::kube::TOKEN_FILE)]
    kube_token_file: PathBuf,
    /// The CA that signs --kube-api HOST:PORT's certificate.
    #[arg(long, value_name = "PATH", default_value = mountgroup::kube::CA_FILE)]
    kube_ca_file: PathBuf,
}

/// The views' control directory, shared by `mount` and `keeper`.
#[derive(clap::Args)]
struct ControlDir {
    /// Where views listen for a process to hand themselves over to (a root-only
    /// directory): running `mountgroup mount` again on a mountpoint a view serves, with
    /// the same source and options, takes the view over live through it, and a keeper
    /// finds there the views it takes over.
    #[arg(
        long,
        value_name = "DIR",
        env = "MOUNTGROUP_CONTROL_DIR",
        default_value = mountgroup::transport::handover::DEFAULT_CONTROL_DIR
    )]
    control_dir: PathBuf,
}

#[derive(clap::Args)]
struct KeeperArgs {
    /// Where the driver (`serve --keeper-socket`) reaches the keeper.
    #[arg(long, default_value = mountgroup::volume::keeper::DEFAULT_SOCKET)]
    socket: PathBuf,
    #[command(flatten)]
    control: ControlDir,
    /// Exit 0 if the keeper at --socket runs in this container and has taken over
    /// the views that were there when it started (a readiness probe), 1 otherwise.
    #[arg(long)]
    probe: bool,
    /// Run each view in a cgroup of its own under this cgroup v2 directory (made if
    /// absent), outside the keeper's container: its death, or an OOM kill of its
    /// group, then ends no view. Needs the node's cgroup2 hierarchy mounted and the
    /// host's PID namespace (docs/DEPLOY.md).
    #[arg(long, value_name = "DIR")]
    views_cgroup: Option<PathBuf>,
    /// Bound each view's memory to this many bytes (memory.max of its cgroup; needs
    /// --views-cgroup and the memory controller there). Beyond it the kernel OOM-kills
    /// that view alone, which is then recovered.
    #[arg(long, value_name = "BYTES")]
    view_memory_max: Option<u64>,
    /// Replace a view that answers nothing for this many seconds (stopped, deadlocked)
    /// as if it had died; 0: never.
    #[arg(long, value_name = "SECONDS", default_value_t = mountgroup::volume::keeper::DEFAULT_HANG_TIMEOUT.as_secs_f64())]
    hang_timeout: f64,
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

fn serve(args: ServeArgs) -> ExitCode {
    let view_binary = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("mountgroup: cannot find its own binary to serve views: {e}");
            return ExitCode::FAILURE;
        }
    };
    let share_key_file = match args.share_key_file.as_deref() {
        Some("none") => None,
        Some(path) => Some(PathBuf::from(path)),
        None => Some(args.state_dir.join("share.key")),
    };
    use mountgroup::csi::server::KubeApi;
    let kube = match args.kube_api.as_str() {
        "in-cluster" => KubeApi::InCluster,
        "none" => KubeApi::None,
        other => match other
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.trim_matches(['[', ']']), p.parse::<u16>().ok()?)))
        {
            Some((host, port)) if !host.is_empty() => KubeApi::At {
                host: host.to_string(),
                port,
                token_file: args.kube_token_file,
                ca_file: args.kube_ca_file,
            },
            _ => {
                eprintln!("mountgroup: --kube-api {other:?} is not in-cluster, none or HOST:PORT");
                return ExitCode::from(2);
            }
        },
    };
    let cfg = mountgroup::csi::server::ServeConfig {
        share_key_file,
        share_timeout: std::time::Duration::from_secs(args.share_timeout.max(1)),
        ceph_csi_config: args.ceph_csi_config,
        mount_net_ns: args.mount_netns,
        metrics_addr: args.metrics_addr,
        runtime_dir: args.runtime_dir,
        endpoint: args.endpoint,
        node_id: args.node_id.unwrap_or_else(host_name),
        driver_name: args.driver_name,
        state_dir: args.state_dir,
        share_root: args.share_root,
        share_init: match args.share_init {
            ShareInitArg::Always => mountgroup::share::ShareInit::Always,
            ShareInitArg::MountPoint => mountgroup::share::ShareInit::Mounted,
        },
        view_binary,
        keeper_socket: args.keeper_socket,
        kube,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mountgroup: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(mountgroup::csi::server::serve(cfg));
    // Blocking-pool threads idle for up to ten seconds before they go, and a drop of
    // the runtime waits for them: exit as soon as the server has stopped.
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mountgroup: {e}");
            ExitCode::FAILURE
        }
    }
}

fn keeper(args: KeeperArgs) -> ExitCode {
    use mountgroup::volume::keeper;
    if args.probe {
        return match keeper::probe(&args.socket) {
            Ok(()) => ExitCode::SUCCESS,
            Err(why) => {
                eprintln!("mountgroup: keeper not ready: {why}");
                ExitCode::FAILURE
            }
        };
    }
    let binary = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("mountgroup: cannot find its own binary to serve views: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !(args.hang_timeout.is_finite() && args.hang_timeout >= 0.0) {
        eprintln!(
            "mountgroup: --hang-timeout must be a number of seconds, 0 or more, not {}",
            args.hang_timeout
        );
        return ExitCode::from(2);
    }
    let cfg = keeper::KeeperConfig {
        views_cgroup: args.views_cgroup,
        view_memory_max: args.view_memory_max,
        hang_timeout: (args.hang_timeout > 0.0)
            .then(|| std::time::Duration::from_secs_f64(args.hang_timeout)),
        ..keeper::KeeperConfig::new(args.socket, args.control.control_dir, binary)
    };
    match keeper::run(cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mountgroup: keeper: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(clap::Args)]
struct MountArgs {
    /// The backing directory.
    source: PathBuf,
    /// Where the view appears.
    mountpoint: PathBuf,
    /// Mount options, comma separated (gid=N, mode=fsgroup|cifs|native, disk_gid=N,
    /// ownership=emulate|emulate-user|off|share, ro, uid=, file_mode=, dir_mode=,
    /// noperm, passthrough=auto|on|off, direct_io=view|kernel, transport=dev|ring,
    /// threads=N, attr_timeout=S, entry_timeout=S; all in docs/SEMANTICS.md). May be
    /// repeated; later ones win.
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    /// A native view: the kernel's idmapped bind mount of SOURCE that shows SOURCE's
    /// own group as the `gid=` group (nosuid, nodev; `ro`, `noexec` and the access-time
    /// options apply), served by no process: the command mounts and exits, and
    /// `umount` removes it. Give SOURCE a group of its own and make it setgid, so that
    /// what is made in it is born in that group (docs/SEMANTICS.md, *Native views*).
    #[arg(long)]
    native: bool,
    /// Same as `-o gid=N`.
    #[arg(long, value_name = "N")]
    gid: Option<String>,
    /// Same as `-o mode=M`.
    #[arg(long, value_name = "fsgroup|cifs")]
    mode: Option<String>,
    /// Same as `-o ownership=O`. Without it, the view keeps what the source can keep,
    /// as the driver decides (docs/SEMANTICS.md).
    #[arg(long, value_name = "emulate|emulate-user|off|share")]
    ownership: Option<String>,
    /// Same as `-o passthrough=P`.
    #[arg(long, value_name = "auto|on|off")]
    passthrough: Option<String>,
    /// Same as `-o ro`.
    #[arg(long)]
    ro: bool,
    /// Write operation counters to this file every second (read by `serve`'s metrics).
    #[arg(long, value_name = "PATH")]
    metrics_file: Option<PathBuf>,
    /// Log to this file (and point standard error at it), rotated to PATH.1 when it
    /// reaches --log-max-bytes: a view's log never takes more than twice that.
    #[arg(long, value_name = "PATH")]
    log_file: Option<PathBuf>,
    #[command(flatten)]
    control: ControlDir,
    /// The size at which --log-file is rotated.
    #[arg(long, value_name = "BYTES", default_value_t = mountgroup::logfile::DEFAULT_MAX_BYTES)]
    log_max_bytes: u64,
}

impl MountArgs {
    /// Whether the options name `ownership=` (then they are served as given).
    fn names_ownership(&self) -> bool {
        self.ownership.is_some()
            || self
                .options
                .iter()
                .flat_map(|o| o.split(','))
                .any(|item| item.trim().starts_with("ownership="))
    }

    /// The option strings in order: `-o` first, then the long flags (which so win).
    fn option_strings(&self) -> Vec<String> {
        let mut v = self.options.clone();
        let long = [
            ("gid", &self.gid),
            ("mode", &self.mode),
            ("ownership", &self.ownership),
            ("passthrough", &self.passthrough),
        ];
        v.extend(
            long.iter()
                .filter_map(|(k, val)| val.as_ref().map(|val| format!("{k}={val}"))),
        );
        if self.ro {
            v.push("ro".into());
        }
        v
    }
}

/// The options the driver would serve `source` with (options that name no
/// `ownership=` are decided as the driver decides for its share), said in the log.
fn hand_mount_options(source: &std::path::Path, options: ViewOptions) -> ViewOptions {
    let (served, fallback) = mountgroup::volume::serve::hand_mount_options(source, &options);
    if let Some(f) = fallback {
        tracing::warn!(
            source = %source.display(),
            fallback = f.code(),
            why = %f,
            options = %served.to_option_string(),
            "not the options asked for, as the driver would serve this source; name ownership= to have exactly what is asked"
        );
    }
    served
}

fn init_logging(default: &str, json: bool, file: Option<BoundedLog>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let ansi = file.is_none() && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let writer = match file {
        Some(f) => BoxMakeWriter::new(f),
        None => BoxMakeWriter::new(std::io::stderr),
    };
    let fmt = tracing_subscriber::fmt::layer().with_writer(writer);
    let fmt = if json {
        fmt.json()
            .with_current_span(true)
            .with_filter(filter)
            .boxed()
    } else {
        fmt.with_ansi(ansi).with_filter(filter).boxed()
    };
    tracing_subscriber::registry()
        .with(fmt)
        .with(mountgroup::csi::authority::RefusedAuthority::layer())
        .init();
}

/// `mountgroup mount --native`: an idmapped bind mount of `source` on `mountpoint`
/// showing `source`'s group as the `gid=` group; nothing keeps running.
fn native_mount(
    source: &std::path::Path,
    mountpoint: &std::path::Path,
    options: &ViewOptions,
) -> ExitCode {
    use mountgroup::volume::serve::{ByHand, mount_native_by_hand};
    match mount_native_by_hand(source, mountpoint, options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mountgroup: {e}");
            match e {
                ByHand::Refused(_) => ExitCode::from(2),
                ByHand::Failed(_) => ExitCode::FAILURE,
            }
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log_file = match &cli.command {
        Command::Mount(MountArgs {
            log_file: Some(path),
            log_max_bytes,
            ..
        }) => match BoundedLog::open(path, *log_max_bytes, true) {
            Ok(f) => Some(f),
            Err(e) => {
                eprintln!("mountgroup: --log-file {}: {e}", path.display());
                return ExitCode::from(2);
            }
        },
        _ => None,
    };
    init_logging(&cli.log, cli.log_format == "json", log_file);
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Keeper(args) => keeper(args),
        Command::Mount(args) => {
            let strings = args.option_strings();
            let options = match ViewOptions::parse_all(strings.iter().map(String::as_str)) {
                Ok(o) => o,
                Err(e) => {
                    eprintln!("mountgroup: {e}");
                    return ExitCode::from(2);
                }
            };
            if args.native {
                return native_mount(&args.source, &args.mountpoint, &options);
            }
            let options = if args.names_ownership() {
                options
            } else {
                hand_mount_options(&args.source, options)
            };
            match mountgroup::transport::run_foreground(
                &args.source,
                &args.mountpoint,
                &options,
                args.metrics_file.as_deref(),
                Some(&args.control.control_dir),
                mountgroup::volume::keeper::KeeperClient::from_env().map(|k| {
                    std::sync::Arc::new(k)
                        as std::sync::Arc<dyn mountgroup::transport::handover::Holder + Send + Sync>
                }),
            ) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("mountgroup: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
