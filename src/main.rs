//! The `mountgroup` command: parse the command line, set up logging, run a subcommand.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use mountgroup::config::ViewOptions;

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
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mount a group view of SOURCE on MOUNTPOINT and serve it in the foreground.
    ///
    /// SIGINT or SIGTERM unmount and exit 0. See docs/SEMANTICS.md for the options.
    Mount(MountArgs),
}

#[derive(clap::Args)]
struct MountArgs {
    /// The backing directory.
    source: PathBuf,
    /// Where the view appears.
    mountpoint: PathBuf,
    /// Mount options, comma separated (gid=N, mode=fsgroup|cifs, ownership=emulate|off,
    /// ro, uid=, file_mode=, dir_mode=, noperm, passthrough=auto|on|off, threads=N,
    /// attr_timeout=S, entry_timeout=S). May be repeated; later ones win.
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    /// Same as `-o gid=N`.
    #[arg(long, value_name = "N")]
    gid: Option<String>,
    /// Same as `-o mode=M`.
    #[arg(long, value_name = "fsgroup|cifs")]
    mode: Option<String>,
    /// Same as `-o ownership=O`.
    #[arg(long, value_name = "emulate|off")]
    ownership: Option<String>,
    /// Same as `-o passthrough=P`.
    #[arg(long, value_name = "auto|on|off")]
    passthrough: Option<String>,
    /// Same as `-o ro`.
    #[arg(long)]
    ro: bool,
}

impl MountArgs {
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

fn init_logging(default: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log);
    match cli.command {
        Command::Mount(args) => {
            let strings = args.option_strings();
            let options = match ViewOptions::parse_all(strings.iter().map(String::as_str)) {
                Ok(o) => o,
                Err(e) => {
                    eprintln!("mountgroup: {e}");
                    return ExitCode::from(2);
                }
            };
            match mountgroup::fs::run_foreground(&args.source, &args.mountpoint, &options) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("mountgroup: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
