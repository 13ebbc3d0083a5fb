//! The command line: the global flags, and `main`: parse, set up logging, build the
//! context, run the command, map its outcome to a documented exit code (`exit`).

use std::path::PathBuf;

use clap::Parser;

use crate::commands::Command;
use crate::config::{self, Flags};
use crate::context::Context;
use crate::exit::{self, Failure, Outcome};

#[derive(Parser, Debug)]
#[command(
    name = "jioctl",
    version,
    about = "Drive rolling upgrades of the jiocloud fleet",
    after_help = concat!(
        "Examples:\n",
        "  jioctl status                 the fleet by state and role, and why each host waits\n",
        "  jioctl upgrade v42 --instructions-file /etc/jio-upgrade.json\n",
        "                                roll v42 out under the rules, and follow it\n",
        "  jioctl --json status          the same for programs (one JSON document)\n",
        "  jioctl global-disable-puppet  the emergency stop\n",
        "  jioctl run --role compute restart-nova\n",
        "                                a fleet command, role by role under the rules\n",
        "\n",
        "Exit status: 0 success, 1 failed, 2 store unreachable, 3 invalid rules,\n",
        "8 refused by the store, 64 bad usage; the whole table is in jioctl(1)."
    )
)]
pub struct Cli {
    /// Store URL: etcd://HOST:PORT[,HOST:PORT...]; etcds://... for TLS and users (query keys ca_file, cert_file, key_file, server_name, user, password_file); sqlite://PATH; or consul[s]://HOST:PORT (query keys dc, token_file, ca_file) [env: JIO_STORE]
    #[arg(long, global = true)]
    pub store: Option<String>,
    /// Namespace prefix of every key [env: JIO_PREFIX]
    #[arg(long, global = true)]
    pub prefix: Option<String>,
    /// The role of a host that has not registered, from its name: a regex whose first group is the role [env: JIO_ROLE_PATTERN; default: the agents' ^([a-z]+)[0-9]+(-.*)?$]
    #[arg(long, global = true)]
    pub role_pattern: Option<String>,
    /// Configuration file [default: ~/.config/jiocloud/jioctl.toml]
    #[arg(long, global = true, env = "JIOCTL_CONFIG")]
    pub config: Option<PathBuf>,
    /// Machine-readable output on stdout
    #[arg(long, global = true)]
    pub json: bool,
    /// More output: every pass's plan (upgrade), logs on stderr
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

/// Parses and runs; returns the exit code.
pub fn main() -> u8 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // clap says what was wrong with which argument (or prints the help).
            let _ = e.print();
            return if e.use_stderr() { exit::USAGE } else { exit::OK };
        }
    };
    init_logging(cli.verbose);
    let outcome = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(run(cli)),
        Err(e) => Err(Failure::with(
            exit::SOFTWARE,
            anyhow::Error::new(e).context("cannot start the runtime"),
        )),
    };
    exit::report(outcome)
}

fn init_logging(verbose: u8) {
    let filter = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("JIO_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter)),
        )
        // Through the progress bars, when they are drawn: a log line never cuts one.
        .with_writer(|| crate::out::Stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// Builds the context from the configuration and runs the command.
pub async fn run(cli: Cli) -> Outcome {
    let flags = Flags {
        store: cli.store,
        prefix: cli.prefix,
        role_pattern: cli.role_pattern,
    };
    let config = config::load(cli.config.as_deref(), &flags, |k| std::env::var(k).ok())
        .map_err(|e| Failure::usage(format!("invalid configuration: {e:#}")))?;
    crate::out::json_mode(cli.json);
    let ctx = Context {
        config,
        json: cli.json,
        verbose: cli.verbose,
    };
    cli.command.run(&ctx).await
}
