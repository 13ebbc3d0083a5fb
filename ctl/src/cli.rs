//! Command line: parse, configure, run, map to a documented exit code.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use jio_common::keys::EnableLevel;
use jio_common::names::{HostName, Role, Version};
use jio_common::rules::Rules;
use jio_common::store::{self, DynStore, ErrorKind, Op, StoreError};
use jio_common::values::format_bool;

use crate::config::{self, Config};
use crate::{queries, status, upgrade, writes};

/// Exit codes (also in the README).
pub mod exit {
    pub const OK: u8 = 0;
    /// The rollout stopped on failures, or a check was false.
    pub const FAILED: u8 = 1;
    /// The store is unreachable.
    pub const UNREACHABLE: u8 = 2;
    /// The rules are invalid (nothing was written).
    pub const INVALID_RULES: u8 = 3;
    /// Another jioctl drives a rollout (without --retry), or this one lost the lock.
    pub const LOCKED: u8 = 4;
    /// `upgrade --timeout` passed before the rollout finished.
    pub const TIMED_OUT: u8 = 5;
    /// An emergency stop (`global-disable-puppet`) halted the rollout.
    pub const HALTED: u8 = 6;
    /// Stopped by SIGINT (Ctrl-C) / SIGTERM: 128 + the signal number, as shells do.
    pub const SIGINT: u8 = 130;
    pub const SIGTERM: u8 = 143;
    /// Bad command line, configuration or input (nothing was written).
    pub const USAGE: u8 = 64;
    /// Anything else.
    pub const SOFTWARE: u8 = 70;
}

/// The default rules file.
pub const DEFAULT_RULES: &str = "/etc/jio-upgrade.json";

#[derive(Parser, Debug)]
#[command(
    name = "jioctl",
    version,
    about = "Drive rolling upgrades of the jiocloud fleet"
)]
pub struct Cli {
    /// Store URL: etcd://host:port[,host:port...], sqlite://PATH or consul://host:port[?dc=NAME&token_file=PATH] [env: JIO_STORE]
    #[arg(long, global = true)]
    pub store: Option<String>,
    /// Namespace prefix of every key [env: JIO_PREFIX]
    #[arg(long, global = true)]
    pub prefix: Option<String>,
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

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Hosts by state (upgraded, upgrading, failed, pending, lost) and role
    Status {
        #[arg(long)]
        role: Option<String>,
        /// Redraw on every change
        #[arg(long)]
        watch: bool,
    },
    /// Set the desired version and start hosts under the rules
    Upgrade {
        version: String,
        /// The rules as JSON [default: /etc/jio-upgrade.json when it exists]
        #[arg(long, conflicts_with = "instructions_file")]
        instructions: Option<String>,
        /// A file holding the rules
        #[arg(long)]
        instructions_file: Option<PathBuf>,
        /// Print the plan, write nothing
        #[arg(long)]
        noop: bool,
        /// Repeat passes until nothing is pending or upgrading
        #[arg(long)]
        retry: bool,
        /// With --retry: give up (exit 5) when the rollout has not finished by then (e.g. 30m)
        #[arg(long, value_parser = parse_duration, requires = "retry")]
        timeout: Option<std::time::Duration>,
    },
    /// Delete every role and host enable_puppet key and set the global one to false
    #[command(alias = "global_disable_puppet")]
    GlobalDisablePuppet,
    /// Set /current_version (refused when it would release hosts outside any rules, unless --force)
    #[command(alias = "trigger_update")]
    TriggerUpdate {
        version: String,
        /// Write it even though it releases hosts at once, outside any rolling rules
        #[arg(long)]
        force: bool,
    },
    /// Print /current_version
    #[command(alias = "current_version")]
    CurrentVersion,
    /// Set (or delete) an enable_puppet key
    #[command(alias = "enable_puppet")]
    EnablePuppet {
        /// true or false (not with --delete)
        value: Option<String>,
        #[arg(long, group = "level")]
        global: bool,
        #[arg(long, group = "level")]
        role: Option<String>,
        #[arg(long, group = "level")]
        host: Option<String>,
        /// Remove the key instead
        #[arg(long)]
        delete: bool,
        /// With `true --global`: write it even though it releases hosts at once
        #[arg(long)]
        force: bool,
    },
    /// Versions hosts run, with counts
    #[command(alias = "running_versions")]
    RunningVersions,
    /// Hosts at a version
    #[command(alias = "hosts_at_version")]
    HostsAtVersion { version: String },
    /// Exit 0 only when every host (arguments, or stdin) is at VERSION
    #[command(alias = "verify_hosts")]
    VerifyHosts { version: String, hosts: Vec<String> },
    /// Exit 0 when VERSION is the only version running
    #[command(alias = "check_single_version")]
    CheckSingleVersion { version: String },
    /// Print the run log linked from a host's status entry (fetched from Swift)
    Logs {
        host: String,
        /// The version [default: the current version]
        #[arg(long)]
        version: Option<String>,
        /// Which step's log [default: the host's entry for the version]
        #[arg(long, value_parser = ["configured", "validated"])]
        phase: Option<String>,
        /// Swift auth URL [default: from [swift] in the configuration]
        #[arg(long)]
        swift_auth_url: Option<String>,
        /// Swift user (TempAuth account:user, or Keystone user)
        #[arg(long)]
        swift_user: Option<String>,
        /// File holding the Swift key (mode 0600)
        #[arg(long)]
        swift_key_file: Option<PathBuf>,
    },
    /// Failed hosts of the current version
    #[command(alias = "get_failures")]
    GetFailures {
        /// One line per host, with the log link
        #[arg(long)]
        hosts: bool,
    },
}

/// Parses and runs; returns the exit code.
pub fn main() -> u8 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { exit::USAGE } else { exit::OK };
        }
    };
    let filter = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("JIO_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("jioctl: cannot start the runtime: {e}");
            return exit::SOFTWARE;
        }
    };
    match rt.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("jioctl: {e:#}");
            match e.downcast_ref::<StoreError>() {
                Some(s) if s.kind() == ErrorKind::Unavailable => exit::UNREACHABLE,
                Some(s) if s.kind() == ErrorKind::InvalidInput => exit::USAGE,
                _ => exit::SOFTWARE,
            }
        }
    }
}

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    jio_common::duration::parse(s)
}

fn usage(msg: impl std::fmt::Display) -> anyhow::Result<u8> {
    eprintln!("jioctl: {msg}");
    Ok(exit::USAGE)
}

fn load_rules(instructions: Option<String>, file: Option<PathBuf>) -> Result<Rules, (u8, String)> {
    let text = match (instructions, file) {
        (Some(t), _) => t,
        (None, Some(p)) => {
            std::fs::read_to_string(&p).map_err(|e| (exit::USAGE, format!("{}: {e}", p.display())))?
        }
        (None, None) => match std::fs::read_to_string(DEFAULT_RULES) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "{}".into(),
            Err(e) => return Err((exit::USAGE, format!("{DEFAULT_RULES}: {e}"))),
        },
    };
    Rules::parse(&text).map_err(|e| (exit::INVALID_RULES, e.to_string()))
}

/// Opens the store for a command that only reads: an embedded store that does not
/// exist is an error, never created.
async fn connect(cfg: &Config) -> anyhow::Result<DynStore> {
    open(cfg, store::Create::Never).await
}

/// Opens the store for a command that writes: a missing embedded store file is
/// created, a missing directory is an error (jioctl never creates directories).
async fn connect_rw(cfg: &Config) -> anyhow::Result<DynStore> {
    open(cfg, store::Create::File).await
}

async fn open(cfg: &Config, create: store::Create) -> anyhow::Result<DynStore> {
    if !cfg.store_given {
        eprintln!(
            "jioctl: no store configured; using the embedded store {}",
            cfg.store
        );
    }
    Ok(store::open_opts(&cfg.store, std::time::Duration::from_secs(10), create).await?)
}

async fn dispatch(cli: Cli) -> anyhow::Result<u8> {
    let cfg = match config::load(
        cli.config.as_deref(),
        cli.store.as_deref(),
        cli.prefix.as_deref(),
        |k| std::env::var(k).ok(),
    ) {
        Ok(c) => c,
        Err(e) => return usage(format!("invalid configuration: {e:#}")),
    };
    let schema = cfg.schema.clone();
    let json = cli.json;
    // Validate every argument before touching the store.
    match cli.command {
        Command::Status { role, watch } => {
            let role = match role.map(Role::new).transpose() {
                Ok(r) => r,
                Err(e) => return usage(e),
            };
            let store = connect(&cfg).await?;
            status::run(&store, &schema, role.as_ref(), json, watch).await?;
            Ok(exit::OK)
        }
        Command::Upgrade {
            version,
            instructions,
            instructions_file,
            noop,
            retry,
            timeout,
        } => {
            let version = match Version::new(version) {
                Ok(v) => v,
                Err(e) => return usage(e),
            };
            let rules = match load_rules(instructions, instructions_file) {
                Ok(r) => r,
                Err((code, msg)) => {
                    eprintln!("jioctl: {msg}");
                    return Ok(code);
                }
            };
            let store = if noop {
                connect(&cfg).await?
            } else {
                connect_rw(&cfg).await?
            };
            upgrade::run(
                &store,
                &schema,
                upgrade::Args {
                    version,
                    rules,
                    noop,
                    retry,
                    verbose: cli.verbose > 0,
                    json,
                    quiet: false,
                    timeout,
                },
            )
            .await
        }
        Command::GlobalDisablePuppet => {
            let store = connect_rw(&cfg).await?;
            upgrade::emergency_stop(&store, &schema).await
        }
        Command::TriggerUpdate { version, force } => {
            let version = match Version::new(version) {
                Ok(v) => v,
                Err(e) => return usage(e),
            };
            let store = connect_rw(&cfg).await?;
            let ops = vec![Op::put(schema.current_version(), version.to_string())];
            let what = format!("trigger-update {version}");
            let wrote = release_checked(&store, &schema, ops, force, &what, |s| {
                s.current = Some(version.clone());
            })
            .await?;
            if let Some(code) = wrote {
                return Ok(code);
            }
            println!("current_version set to {version}");
            Ok(exit::OK)
        }
        Command::CurrentVersion => {
            let store = connect(&cfg).await?;
            match store.get(&schema.current_version()).await? {
                Some(kv) => match jio_common::values::parse_version(&kv) {
                    Ok(Some(v)) => {
                        println!("{v}");
                        Ok(exit::OK)
                    }
                    Ok(None) => {
                        eprintln!("jioctl: {} is empty", kv.key);
                        Ok(exit::FAILED)
                    }
                    Err(e) => {
                        eprintln!("jioctl: {e}");
                        Ok(exit::SOFTWARE)
                    }
                },
                None => {
                    eprintln!("jioctl: /current_version is not set");
                    Ok(exit::FAILED)
                }
            }
        }
        Command::EnablePuppet {
            value,
            global,
            role,
            host,
            delete,
            force,
        } => {
            let level = match (global, role, host) {
                (true, None, None) => EnableLevel::Global,
                (false, Some(r), None) => match Role::new(r) {
                    Ok(r) => EnableLevel::Role(r),
                    Err(e) => return usage(e),
                },
                (false, None, Some(h)) => match HostName::new(h) {
                    Ok(h) => EnableLevel::Host(h),
                    Err(e) => return usage(e),
                },
                _ => return usage("give exactly one of --global, --role ROLE, --host HOST"),
            };
            let key = schema.enable(&level);
            let op = match (delete, value.as_deref()) {
                (true, None) => Op::Delete(key.clone()),
                (true, Some(_)) => return usage("--delete takes no value"),
                (false, Some("true")) => Op::put(key.clone(), format_bool(true)),
                (false, Some("false")) => Op::put(key.clone(), format_bool(false)),
                (false, Some(other)) => return usage(format!("value {other:?}: expected true or false")),
                (false, None) => return usage("give true or false, or --delete"),
            };
            let store = connect_rw(&cfg).await?;
            if level == EnableLevel::Global && value.as_deref() == Some("true") {
                let what = "enable-puppet true --global".to_string();
                if let Some(code) = release_checked(&store, &schema, vec![op], force, &what, |s| {
                    s.global = jio_common::gate::KeyState::Set(true);
                })
                .await?
                {
                    return Ok(code);
                }
            } else {
                writes::write(&store, &schema, vec![op])
                    .await
                    .context("writing the enable key")?;
            }
            println!(
                "{key} {}",
                if delete {
                    "deleted".to_string()
                } else {
                    format!("= {}", value.unwrap_or_default())
                }
            );
            Ok(exit::OK)
        }
        Command::RunningVersions => queries::running_versions(&connect(&cfg).await?, &schema, json).await,
        Command::HostsAtVersion { version } => match Version::new(version) {
            Ok(v) => queries::hosts_at_version(&connect(&cfg).await?, &schema, &v, json).await,
            Err(e) => usage(e),
        },
        Command::VerifyHosts { version, hosts } => match Version::new(version) {
            Ok(v) => queries::verify_hosts(&connect(&cfg).await?, &schema, &v, hosts, json).await,
            Err(e) => usage(e),
        },
        Command::CheckSingleVersion { version } => match Version::new(version) {
            Ok(v) => queries::check_single_version(&connect(&cfg).await?, &schema, &v, json).await,
            Err(e) => usage(e),
        },
        Command::GetFailures { hosts } => {
            queries::get_failures(&connect(&cfg).await?, &schema, hosts, json).await
        }
        Command::Logs {
            host,
            version,
            phase,
            swift_auth_url,
            swift_user,
            swift_key_file,
        } => {
            let host = match HostName::new(host) {
                Ok(h) => h,
                Err(e) => return usage(e),
            };
            let version = match version.map(Version::new).transpose() {
                Ok(v) => v,
                Err(e) => return usage(e),
            };
            let settings = match swift_settings(cfg.swift.clone(), swift_auth_url, swift_user, swift_key_file)
            {
                Ok(s) => s,
                Err(msg) => return usage(msg),
            };
            let client = match jio_common::swift::SwiftClient::new(settings) {
                Ok(c) => c,
                Err(e) => return usage(e),
            };
            let store = connect(&cfg).await?;
            queries::logs(&store, &schema, &client, &host, version, phase.as_deref()).await
        }
    }
}

/// Writes `ops` (which `change` describes on a snapshot) unless they would let hosts
/// start at once outside any rolling rules; `--force` writes anyway. `Some(code)`:
/// refused, nothing written.
async fn release_checked(
    store: &DynStore,
    schema: &jio_common::keys::Schema,
    ops: Vec<Op>,
    force: bool,
    what: &str,
    change: impl Fn(&mut jio_common::fleet::Snapshot),
) -> anyhow::Result<Option<u8>> {
    loop {
        let before = jio_common::fleet::Snapshot::read(store, schema).await?;
        let mut after = before.clone();
        change(&mut after);
        let released = upgrade::released_by(&before, &after);
        if !released.is_empty() && !force {
            eprintln!(
                "jioctl: {what} would release {} host(s) at once, outside any rolling rules ({}{}); nothing was written. Use `jioctl upgrade` to roll out under the rules, or --force",
                released.len(),
                released
                    .iter()
                    .take(8)
                    .map(|h| h.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                if released.len() > 8 { ", ..." } else { "" }
            );
            return Ok(Some(exit::USAGE));
        }
        if upgrade::write_checked(store, schema, ops.clone(), &before).await? {
            if !released.is_empty() {
                eprintln!(
                    "jioctl: --force: {} host(s) released at once, outside any rolling rules",
                    released.len()
                );
            }
            return Ok(None);
        }
        // Something changed what the count was computed on: count again.
    }
}

/// The Swift settings for `logs`: flags over the configuration's `[swift]` section.
fn swift_settings(
    file: Option<jio_common::swift::SwiftSettings>,
    auth_url: Option<String>,
    user: Option<String>,
    key_file: Option<PathBuf>,
) -> Result<jio_common::swift::SwiftSettings, String> {
    let missing = "no Swift credentials: add a [swift] section (auth_url, user, key_file) to the configuration, or give --swift-auth-url, --swift-user and --swift-key-file";
    match file {
        Some(mut s) => {
            if let Some(u) = auth_url {
                s.auth_url = u;
            }
            if let Some(u) = user {
                s.user = u;
            }
            if let Some(k) = key_file {
                s.key_file = k;
            }
            Ok(s)
        }
        None => match (auth_url, user, key_file) {
            (Some(auth_url), Some(user), Some(key_file)) => {
                Ok(jio_common::swift::SwiftSettings::new(auth_url, user, key_file))
            }
            _ => Err(missing.into()),
        },
    }
}
