//! The command line: the global flags, and `main`: parse, set up logging, build the
//! context, run the command, map its outcome to a documented exit code (`exit`).

use std::path::PathBuf;

use clap::Parser;

use crate::commands::Command;
use crate::config::{self, Flags};
use crate::context::Context;
use crate::exit::{self, Failure, Outcome};

/// The heading of the options every subcommand takes.
const GLOBAL: &str = "Global options";

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
    /// Store URL: etcd://HOST:PORT, sqlite://PATH, consul://HOST:PORT [env: JIO_STORE]
    ///
    /// The store every jioctl and agent of the fleet shares [env: JIO_STORE; file:
    /// store; default: the embedded store /var/lib/jiocloud/store.db for root,
    /// ~/.local/state/jiocloud/store.db for others]. Its forms:
    /// etcd://HOST:PORT, several endpoints separated by commas; etcds://HOST:PORT for
    /// TLS and users, with the query keys ca_file, cert_file, key_file, server_name,
    /// user and password_file; sqlite://PATH, an embedded store; consul://HOST:PORT or
    /// consuls://HOST:PORT for TLS, with the query keys dc, token_file and ca_file.
    /// For example etcds://10.0.0.11:2379,10.0.0.12:2379?ca_file=/etc/jiocloud/ca.pem
    #[arg(long, global = true, value_name = "URL", help_heading = GLOBAL)]
    pub store: Option<String>,
    /// Namespace prefix of every key [env: JIO_PREFIX]
    #[arg(long, global = true, help_heading = GLOBAL)]
    pub prefix: Option<String>,
    /// The role of an unregistered host, from its name [env: JIO_ROLE_PATTERN]
    ///
    /// The role of a host that has not registered, from its name: a regex whose first
    /// group is the role [env: JIO_ROLE_PATTERN; default: the agents'
    /// ^([a-z]+)[0-9]+(-.*)?$]
    #[arg(long, global = true, value_name = "REGEX", help_heading = GLOBAL)]
    pub role_pattern: Option<String>,
    /// Configuration file [default: ~/.config/jiocloud/jioctl.toml]
    #[arg(
        long,
        global = true,
        env = "JIOCTL_CONFIG",
        hide_env_values = true,
        value_name = "PATH",
        help_heading = GLOBAL
    )]
    pub config: Option<PathBuf>,
    /// Machine-readable output on stdout
    #[arg(long, global = true, help_heading = GLOBAL)]
    pub json: bool,
    /// More output: every pass's plan (upgrade), logs on stderr
    #[arg(short, long, global = true, action = clap::ArgAction::Count, help_heading = GLOBAL)]
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
