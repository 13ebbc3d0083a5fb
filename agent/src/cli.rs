//! Command line: parse, load the configuration, run a subcommand, map the result to
//! a documented exit code.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use jio_common::backoff::Backoff;
use jio_common::names::Version;
use jio_common::store::{self, DynStore, ErrorKind, StoreError};
use jio_common::time::unix_now;
use jio_common::values::AgentState;
use serde_json::json;
use tokio::sync::watch;

use crate::agent::{Agent, AgentError};
use crate::config::{self, Config, Overrides};
use crate::decide::{self, Decision};
use crate::identity;
use crate::liveness::Liveness;
use crate::pass::PassResult;
use crate::report;
use crate::state::{self, Journal, RunResult};
use crate::uploads::Uploader;

/// Exit codes.
pub mod exit {
    /// Every exit code as operators read it: the man page's EXIT STATUS and
    /// `docs/reference/exit-codes.md` are made from this table (`jio-gen`), and a
    /// test fails when either differs from it.
    pub const DOCUMENTED: &[(&str, &str)] = &[
        ("0", "success (`pending-update`: an update is pending)"),
        (
            "1",
            "the upgrade failed (also when a file it writes could not be written), or is waiting to retry after a failure, or waits for the reboot that ends it, or is blocked by an invalid value in the store, which it names (`pending-update`: up to date, or `/current_version` is invalid, which it names)",
        ),
        (
            "2",
            "the store is unreachable (or results could not be reported yet)",
        ),
        (
            "3",
            "`pending-update` only: the store is unreachable and there is no local version",
        ),
        ("4", "another jio-agent is running on this host"),
        ("5", "the run was interrupted by SIGTERM/SIGINT"),
        (
            "8",
            "the store refused (TLS, authentication or permission); the daemon (`run`) does not exit on it but says why and waits",
        ),
        ("64", "bad command line or configuration"),
        (
            "70",
            "a local file needed before deciding could not be read or written (the state directory, the journal, the local version file); the daemon never exits for a file a run writes: it reports the run as failed and retries",
        ),
    ];

    /// Success; for `pending-update`: an update is pending.
    pub const OK: u8 = 0;
    /// The upgrade failed, waits to retry, or is blocked by an invalid value in the
    /// store; for `pending-update`: up to date, or `/current_version` is invalid.
    pub const FAILED: u8 = 1;
    /// The store is unreachable.
    pub const UNREACHABLE: u8 = 2;
    /// `pending-update` only: the store is unreachable and there is no local version.
    pub const UNREACHABLE_NO_LOCAL: u8 = 3;
    /// Another jio-agent holds the lock.
    pub const LOCKED: u8 = 4;
    /// The run was interrupted by SIGTERM/SIGINT.
    pub const INTERRUPTED: u8 = 5;
    /// The store refused: TLS, authentication or permission (the daemon waits
    /// instead; the one-shot commands exit with this).
    pub const DENIED: u8 = 8;
    /// Bad command line or configuration.
    pub const USAGE: u8 = 64;
    /// A local file could not be read or written (never a stored value: an invalid
    /// one blocks the host, which `once` reports as `FAILED`).
    pub const SOFTWARE: u8 = 70;

    #[cfg(test)]
    mod tests {
        use super::*;

        /// Each code the agent can end with is documented once, and nothing else is.
        #[test]
        fn every_exit_code_is_documented_once() {
            let codes = [
                OK,
                FAILED,
                UNREACHABLE,
                UNREACHABLE_NO_LOCAL,
                LOCKED,
                INTERRUPTED,
                DENIED,
                USAGE,
                SOFTWARE,
            ];
            let documented: Vec<u8> = DOCUMENTED.iter().map(|(c, _)| c.parse::<u8>().unwrap()).collect();
            assert_eq!(documented, codes);
        }
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "jio-agent",
    version,
    about = "Node agent of the jiocloud fleet: upgrades this host when the store says so"
)]
pub struct Cli {
    /// Configuration file [default: /etc/jiocloud/agent.toml when it exists]
    #[arg(long, global = true, env = "JIO_CONFIG")]
    pub config: Option<PathBuf>,
    /// Store URL: etcd://HOST:PORT[,HOST:PORT...]; etcds://... for TLS and users (query keys ca_file, cert_file, key_file, server_name, user, password_file); sqlite://PATH; or consul[s]://HOST:PORT (query keys dc, token_file, ca_file) [env: JIO_STORE]
    #[arg(long, global = true)]
    pub store: Option<String>,
    /// Namespace prefix of every key [env: JIO_PREFIX]
    #[arg(long, global = true)]
    pub prefix: Option<String>,
    /// This host's name [env: JIO_HOSTNAME; default: the system host name]
    #[arg(long, global = true)]
    pub hostname: Option<String>,
    /// This host's role [env: JIO_ROLE; default: derived from the host name]
    #[arg(long, global = true)]
    pub role: Option<String>,
    /// State directory [env: JIO_STATE_DIR; default: /var/lib/jiocloud]
    #[arg(long, global = true)]
    pub state_dir: Option<PathBuf>,
    /// More logging (-v debug, -vv trace)
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// The daemon: react to the store, upgrade when allowed, report
    Run,
    /// One reconcile pass, then exit (for cron)
    Once,
    /// First boot: register, publish addresses, record provisioning, converge once
    Bootstrap,
    /// Exit 0 when an update is pending, 1 when up to date, 2 store unreachable, 3 unreachable and no local version
    #[command(alias = "pending_update")]
    PendingUpdate,
    /// Print the local version, or set it
    #[command(alias = "local_version")]
    LocalVersion {
        /// The version to record as this host's (none: print it)
        version: Option<String>,
    },
    /// What this host sees: desired and local version, enable decision, last run
    Status {
        /// Machine-readable output
        #[arg(long)]
        json: bool,
    },
}

/// Parses the command line and runs it; returns the exit code.
pub fn main() -> u8 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { exit::USAGE } else { exit::OK };
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("jio-agent: cannot start the runtime: {e}");
            return exit::SOFTWARE;
        }
    };
    rt.block_on(dispatch(cli))
}

/// The log on stderr: lines for people, without a time of our own when stderr is
/// journald's stream (it stamps every line itself), or JSON objects, one per line.
fn init_tracing(verbose: u8, format: config::LogFormat) {
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("JIO_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = match format {
        config::LogFormat::Json => {
            LOGS_JSON.store(true, std::sync::atomic::Ordering::Relaxed);
            fmt.json().flatten_event(true).with_current_span(false).try_init()
        }
        config::LogFormat::Text if stderr_is_journal() => fmt.without_time().with_ansi(false).try_init(),
        config::LogFormat::Text => fmt
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
    };
}

/// Whether stderr is the stream systemd connected to journald: `JOURNAL_STREAM`
/// names its device and inode (a child that inherited the variable with another
/// stderr is not).
fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let Some((dev, ino)) = std::env::var("JOURNAL_STREAM")
        .ok()
        .and_then(|v| {
            v.split_once(':')
                .map(|(d, i)| (d.parse::<u64>(), i.parse::<u64>()))
        })
        .and_then(|(d, i)| Some((d.ok()?, i.ok()?)))
    else {
        return false;
    };
    std::fs::metadata("/proc/self/fd/2").is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

fn overrides(cli: &Cli) -> Overrides {
    let mut ov = Overrides {
        config_path: cli.config.clone(),
        ..Overrides::default()
    }
    .with_env(|k| std::env::var(k).ok());
    for (key, v) in [
        ("store", cli.store.clone()),
        ("prefix", cli.prefix.clone()),
        ("hostname", cli.hostname.clone()),
        ("role", cli.role.clone()),
        (
            "state_dir",
            cli.state_dir.as_ref().map(|p| p.display().to_string()),
        ),
    ] {
        if let Some(v) = v {
            ov.flags.insert(key, v);
        }
    }
    ov
}

fn fail(msg: impl std::fmt::Display, code: u8) -> u8 {
    say(msg, Some(code));
    code
}

/// A command's own word on stderr, `jio-agent: ...`; under `log_format = "json"`
/// one JSON object like every log line (with `exit_code` when it ends the
/// command), so that a log shipper never meets a plain line.
fn say(msg: impl std::fmt::Display, exit_code: Option<u8>) {
    if LOGS_JSON.load(std::sync::atomic::Ordering::Relaxed) {
        match exit_code {
            Some(code) => tracing::error!(exit_code = code, "{msg}"),
            None => tracing::error!("{msg}"),
        }
    } else {
        eprintln!("jio-agent: {msg}");
    }
}

/// The log lines are JSON objects (`log_format = "json"`, once set up).
static LOGS_JSON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The exit code of a store that could not be used: refused (8), or unreachable (2).
fn store_code(e: &StoreError) -> u8 {
    match e.kind() {
        ErrorKind::Denied => exit::DENIED,
        ErrorKind::InvalidInput => exit::USAGE,
        _ => exit::UNREACHABLE,
    }
}

fn error_code(e: &AgentError) -> u8 {
    match e {
        AgentError::Store(s) if s.kind() == ErrorKind::Unavailable => exit::UNREACHABLE,
        AgentError::Store(s) if s.kind() == ErrorKind::InvalidInput => exit::USAGE,
        AgentError::Store(s) if s.kind() == ErrorKind::Denied => exit::DENIED,
        _ => exit::SOFTWARE,
    }
}

async fn dispatch(cli: Cli) -> u8 {
    // A daemon (started again by a reload, say) must not die of a SIGHUP that comes
    // before its handler listens: tokio's handler, once installed, stays.
    let _hup = matches!(cli.command, Command::Run)
        .then(|| tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok());
    let sources = overrides(&cli);
    let cfg = match config::load(&sources, identity::system_hostname) {
        Ok(c) => c,
        Err(e) => return fail(e, exit::USAGE),
    };
    init_tracing(cli.verbose, cfg.log_format);
    match cli.command {
        Command::LocalVersion { version } => local_version(&cfg, version),
        Command::PendingUpdate => pending_update(&cfg).await,
        Command::Status { json } => status(&cfg, json).await,
        Command::Once => once(cfg, false).await,
        Command::Bootstrap => once(cfg, true).await,
        Command::Run => run(cfg, sources).await,
    }
}

fn local_version(cfg: &Config, version: Option<String>) -> u8 {
    match version {
        None => match state::read_local_version(&cfg.version_file) {
            Ok(Some(v)) => {
                println!("{v}");
                exit::OK
            }
            Ok(None) => fail(
                format!(
                    "no local version ({} is missing or empty)",
                    cfg.version_file.display()
                ),
                exit::FAILED,
            ),
            Err(e) => fail(e, exit::SOFTWARE),
        },
        Some(v) => match Version::new(v) {
            Ok(v) => match state::write_local_version(&cfg.version_file, &v) {
                Ok(()) => exit::OK,
                Err(e) => fail(e, exit::SOFTWARE),
            },
            Err(e) => fail(e, exit::USAGE),
        },
    }
}

/// Opens the store and registers this host (every store-using subcommand does).
async fn connect(cfg: &Config) -> Result<DynStore, StoreError> {
    let how = if cfg.store_given {
        ""
    } else {
        " (default: no store configured)"
    };
    tracing::info!(store = %store::short(&cfg.store.to_string()), "using store{how}");
    let store = store::open_with(&cfg.store, cfg.store_retry).await?;
    report::register(
        &store,
        &cfg.schema,
        &cfg.hostname,
        &cfg.role,
        identity::addresses(),
        unix_now(),
    )
    .await?;
    Ok(store)
}

async fn pending_update(cfg: &Config) -> u8 {
    let local = match state::read_local_version(&cfg.version_file) {
        Ok(v) => v,
        Err(e) => return fail(e, exit::SOFTWARE),
    };
    let unreachable = |e: &dyn std::fmt::Display| {
        say(e, None);
        if local.is_some() {
            exit::UNREACHABLE
        } else {
            exit::UNREACHABLE_NO_LOCAL
        }
    };
    let store = match connect(cfg).await {
        Ok(s) => s,
        Err(e) => return unreachable(&e),
    };
    match store.get(&cfg.schema.current_version()).await {
        Err(e) => unreachable(&e),
        Ok(Some(kv)) => match jio_common::values::parse_version(&kv) {
            Ok(Some(v)) if Some(&v) != local.as_ref() => {
                println!("{v}");
                exit::OK
            }
            Ok(_) => exit::FAILED,
            // Nothing can be applied until the value is fixed: not pending.
            Err(e) => fail(format!("no update can be applied: {e}"), exit::FAILED),
        },
        Ok(None) => exit::FAILED,
    }
}

async fn status(cfg: &Config, as_json: bool) -> u8 {
    let store = match connect(cfg).await {
        Ok(s) => s,
        Err(e) => {
            let code = store_code(&e);
            return fail(e, code);
        }
    };
    let (_tx, rx) = watch::channel(false);
    let mut agent = match Agent::new_readonly(cfg.clone(), store, rx) {
        Ok(a) => a,
        Err(e) => return fail(&e, error_code(&e)),
    };
    let obs = match agent.observe(false).await {
        Ok(o) => o,
        Err(e) => return fail(&e, error_code(&e)),
    };
    let decision = decide::decide(&obs);
    let j = agent.journal();
    if as_json {
        let out = status_json(cfg, &obs, &decision, j);
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        return exit::OK;
    }
    print_status(cfg, &obs, &decision, j);
    exit::OK
}

/// `jio-agent status --json`: what the host observed and decided, and its journal.
fn status_json(
    cfg: &Config,
    obs: &decide::Observation,
    decision: &Decision,
    j: &Journal,
) -> serde_json::Value {
    json!({
        "host": cfg.hostname,
        "role": cfg.role,
        "store": cfg.store.to_string(),
        "desired": obs.desired,
        "desired_invalid": obs.desired_invalid,
        "local": obs.local,
        "enabled": obs.gate.enabled,
        "decided_by": obs.gate.level,
        "blocked": obs.gate.blocked,
        "decision": decision_text(decision),
        "last_run": j.last_run,
        "in_progress": j.in_progress,
        "unreported": j.unreported.len(),
    })
}

/// Prints `jio-agent status` as text, one line per fact.
fn print_status(cfg: &Config, obs: &decide::Observation, decision: &Decision, j: &Journal) {
    let none = || "none".to_string();
    println!("host:      {} (role {})", cfg.hostname, cfg.role);
    println!("store:     {}", cfg.store);
    match &obs.desired_invalid {
        Some(reason) => println!("desired:   invalid: {reason}"),
        None => println!(
            "desired:   {}",
            obs.desired.as_ref().map(ToString::to_string).unwrap_or_else(none)
        ),
    }
    println!(
        "local:     {}",
        obs.local.as_ref().map(ToString::to_string).unwrap_or_else(none)
    );
    let by = match obs.gate.level {
        jio_common::gate::Level::Default => "no enable_puppet key is set".to_string(),
        l => format!("decided by the {} key", l.as_str()),
    };
    match &obs.gate.blocked {
        Some(reason) => println!("enabled:   blocked ({by}): {reason}"),
        None => println!(
            "enabled:   {} ({by})",
            if obs.gate.enabled { "yes" } else { "no" }
        ),
    }
    println!("decision:  {}", decision_text(decision));
    match &j.last_run {
        Some(r) => println!(
            "last run:  {} {} at step {} ({}){}; logs in {}",
            r.version,
            r.result.as_str(),
            r.step,
            jio_common::time::utc_display(r.finished),
            r.reason.as_ref().map(|x| format!(": {x}")).unwrap_or_default(),
            r.run_dir.display()
        ),
        None => println!("last run:  none"),
    }
    if !j.unreported.is_empty() {
        println!(
            "waiting:   {} result(s) not yet reported to the store",
            j.unreported.len()
        );
    }
}

fn service_list(s: &[jio_common::names::Service]) -> String {
    s.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
}

fn decision_text(d: &Decision) -> String {
    match d {
        Decision::RecoverCommand => "recover a fleet command's run from before the agent stopped".into(),
        Decision::Command { id, .. } => format!("fleet command {id}"),
        Decision::Report => "report earlier results".into(),
        Decision::NoDesiredVersion => "idle: no desired version is set".into(),
        Decision::UpToDate => "idle: up to date".into(),
        Decision::Disabled { version, level } => {
            format!(
                "update to {version} pending, not enabled ({} key)",
                level.as_str()
            )
        }
        Decision::Backoff { version, until } => format!(
            "update to {version} failed; retry after {}",
            jio_common::time::utc_display(*until)
        ),
        Decision::Upgrade { version, .. } => format!("upgrade to {version}"),
        Decision::Blocked { reason } => format!("blocked: {reason}"),
        Decision::HealthCheck { version } => format!("health check of {version} due"),
        Decision::Repair { version } => format!("repair {version} (its health check failed)"),
        Decision::HealthHeld { version } => format!(
            "idle: the health check of {version} waits (a jioctl upgrade driver holds the rollout lock)"
        ),
        Decision::Held { version, hold } => match &hold.record {
            Ok(h) => format!(
                "held by {}: {}; not starting the upgrade to {version}",
                h.by,
                h.reason.as_deref().unwrap_or("no reason given")
            ),
            Err(why) => format!(
                "held by {} (unreadable: {why}); not starting the upgrade to {version}",
                hold.key
            ),
        },
        Decision::RolloutUnusable { version, reason } => {
            format!("the upgrade to {version} waits: the active rollout's record cannot be used: {reason}")
        }
        Decision::Soaking { version, check_at } => format!(
            "idle: {version} soaks (min_healthy_time); its health check runs at {}",
            jio_common::plan::when(*check_at)
        ),
        Decision::SoakCheck { version } => format!("the soak's health check of {version} is due"),
        Decision::Tasks {
            version,
            phase,
            services,
        } => format!("run {phase} of {} (rollout to {version})", service_list(services)),
        Decision::AwaitingPhase {
            version,
            problem: Some(problem),
            ..
        } => format!(
            "idle: the composable rollout to {version} waits: a phase grant cannot be read: {problem}"
        ),
        Decision::AwaitingPhase {
            version,
            granted,
            problem: None,
        } => match granted {
            Some(p) => format!(
                "idle: {p} is granted to this role and this host has nothing left in it (rollout to {version}); waiting for the next phase"
            ),
            None => {
                format!("idle: the composable rollout to {version} has granted no phase to this role yet")
            }
        },
        Decision::FailedHere { version, phase } => format!(
            "failed at {phase} in the rollout to {version}: retried when an operator enables this host again, not on a timer"
        ),
        Decision::LeftBehind {
            version,
            missed,
            granted,
        } => format!(
            "left behind in the rollout to {version}: {granted} is granted, but this host did not finish {missed} (retry with a new rollout)"
        ),
    }
}

/// SIGTERM/SIGINT turn the returned flag true.
fn shutdown_signal() -> watch::Receiver<bool> {
    shutdown_or_reload_signal(None).rx
}

/// What the signals ask of the daemon.
struct Signals {
    /// True once it must stop (SIGTERM/SIGINT, or `stop` below).
    rx: watch::Receiver<bool>,
    /// True while a reload is asked for: the daemon starts again in place once no
    /// run is going on.
    restart: watch::Receiver<bool>,
    /// Turns `rx` true: the daemon finished for a reload, its helpers stop too.
    stop: Arc<watch::Sender<bool>>,
}

/// SIGTERM/SIGINT turn the stop flag true. With `reload` (the daemon's sources of
/// configuration, and what it runs on), SIGHUP reads the configuration again: one
/// with a problem is logged and the daemon runs on as it was; the same one is said
/// and changes nothing (and calls off a reload still waiting); a changed one sets
/// the restart flag, which the daemon obeys once no run is going on (a run is never
/// cut short for a reload). A SIGTERM/SIGINT turns the restart flag back off: a
/// stop wins over a reload.
fn shutdown_or_reload_signal(reload: Option<(Overrides, String)>) -> Signals {
    let (tx, rx) = watch::channel(false);
    let tx = Arc::new(tx);
    let (restart_tx, restart_rx) = watch::channel(false);
    // Registered before the task runs, so a SIGHUP from now on never kills.
    let hup = reload
        .as_ref()
        .and_then(|_| tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok());
    let stop = tx.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
        else {
            return;
        };
        let mut hup = hup;
        loop {
            tokio::select! {
                _ = term.recv() => {
                    tracing::info!("SIGTERM: finishing up");
                    break;
                }
                _ = int.recv() => {
                    tracing::info!("SIGINT: finishing up");
                    break;
                }
                Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => None } } => {
                    let Some((ov, running)) = reload.as_ref() else { continue };
                    match config::load(ov, identity::system_hostname) {
                        Ok(c) if &fingerprint(&c) == running => {
                            if *restart_tx.borrow() {
                                tracing::info!("SIGHUP: the configuration is back to the one running; the reload that waited is called off");
                                let _ = restart_tx.send(false);
                            } else {
                                tracing::info!("SIGHUP: the configuration is unchanged; nothing to do");
                            }
                        }
                        Ok(_) => {
                            tracing::info!(
                                "SIGHUP: the configuration changed and is valid; starting again in place to apply it as soon as no run is going on (a run going on finishes first)"
                            );
                            let _ = restart_tx.send(true);
                        }
                        Err(e) => tracing::error!(
                            "SIGHUP: the configuration was not reloaded, this agent runs on with the one it started with: {e}"
                        ),
                    }
                }
            }
        }
        if *restart_tx.borrow() {
            tracing::info!("stop asked while a reload was under way: stopping instead of starting again");
            let _ = restart_tx.send(false);
        }
        let _ = tx.send(true);
        // The flags' senders stay (a closed channel would wake every waiter).
        std::future::pending::<()>().await;
        drop(restart_tx);
    });
    Signals {
        rx,
        restart: restart_rx,
        stop,
    }
}

/// Whether a reload still stands a moment before the process replaces itself. A
/// SIGTERM that came with the reload is taken by this process's handler; the
/// signal task must see it before the exec, or the new process would never know
/// it was asked to stop. The pause lets it (a stop wins over a reload).
async fn restart_wins(restarting: &impl Fn() -> bool) -> bool {
    if !restarting() {
        return false;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    restarting()
}

/// What a configuration amounts to, to tell a changed one from the same (never
/// shown: it may hold secrets' settings).
fn fingerprint(cfg: &Config) -> String {
    format!("{cfg:?}")
}

/// Set in the environment of a `jio-agent run` that started again in place.
const RESTARTED_ENV: &str = "JIO_AGENT_RESTARTED";

/// Replaces this process with a new `jio-agent` of the same arguments and
/// environment (the same PID, so systemd keeps it as the service's main process);
/// returns only if that fails.
fn restart_in_place() -> u8 {
    use std::os::unix::process::CommandExt as _;
    let mut args = std::env::args_os();
    let argv0 = args.next().map(PathBuf::from);
    // The binary as started (a package upgrade may have replaced it: then the new
    // one starts); /proc/self/exe when started through PATH.
    let exe = match argv0.filter(|p| p.components().count() > 1) {
        Some(p) => p,
        None => match std::env::current_exe() {
            // Replaced on disk since it started (a package upgrade): the new one.
            Ok(p) => p
                .to_str()
                .and_then(|t| t.strip_suffix(" (deleted)"))
                .map(PathBuf::from)
                .unwrap_or(p),
            Err(e) => {
                return fail(
                    format!("cannot restart: cannot find this program: {e}"),
                    exit::SOFTWARE,
                );
            }
        },
    };
    tracing::info!(exe = %exe.display(), "starting again in place");
    let e = std::process::Command::new(&exe)
        .args(args)
        .env(RESTARTED_ENV, "1")
        .exec();
    fail(format!("cannot restart {}: {e}", exe.display()), exit::SOFTWARE)
}

async fn once(cfg: Config, bootstrap: bool) -> u8 {
    let _lock = match state::lock(&cfg.state_dir) {
        Ok(l) => l,
        Err(e @ state::StateError::Locked { .. }) => return fail(e, exit::LOCKED),
        Err(e) => return fail(e, exit::SOFTWARE),
    };
    let store = match connect(&cfg).await {
        Ok(s) => s,
        Err(e) => {
            let code = store_code(&e);
            return fail(e, code);
        }
    };
    let mut agent = match Agent::new(cfg.clone(), store.clone(), shutdown_signal()) {
        Ok(a) => a,
        Err(e) => {
            if bootstrap {
                record_provisioned(&store, &cfg, Some(&e.to_string())).await;
            }
            return fail(&e, error_code(&e));
        }
    };
    if bootstrap && let Err(code) = provision(&store, &cfg).await {
        return code;
    }
    let result = passes(&mut agent, &store).await;
    drain_uploads(&cfg, &store).await;
    let code = once_outcome(&agent, &result);
    if !agent.journal().unreported.is_empty() {
        eprintln!(
            "jio-agent: {} result(s) could not be reported yet; they stay in {} and are reported by the next run",
            agent.journal().unreported.len(),
            Journal::path(&cfg.state_dir).display()
        );
        if code == exit::OK {
            return exit::UNREACHABLE;
        }
    }
    code
}

/// The first boot: publish the host's addresses and record it as provisioned.
async fn provision(store: &DynStore, cfg: &Config) -> Result<(), u8> {
    let addrs = identity::addresses();
    if let Err(e) = report::publish_addresses(store, &cfg.schema, &cfg.hostname, &cfg.role, &addrs).await {
        record_provisioned(store, cfg, Some(&format!("cannot publish addresses: {e}"))).await;
        return Err(fail(e, exit::UNREACHABLE));
    }
    if !record_provisioned(store, cfg, None).await {
        return Err(exit::UNREACHABLE);
    }
    println!(
        "jio-agent: provisioned {} (role {}), {} address(es) published",
        cfg.hostname,
        cfg.role,
        addrs.len()
    );
    Ok(())
}

/// `once`'s passes, with the liveness record kept for their length. A pass that
/// only reported earlier results, or found the store changed under its decision,
/// goes on to decide again (a few times).
async fn passes(agent: &mut Agent, store: &DynStore) -> Result<PassResult, AgentError> {
    let cfg = agent.config().clone();
    let local = agent.observe(false).await.ok().and_then(|o| o.local);
    agent.set_liveness(Liveness::start(
        store.clone(),
        cfg.schema.agent(&cfg.hostname),
        cfg.lease_ttl,
        AgentState::Idle,
        local,
    ));
    let mut result = agent.pass(false).await;
    for _ in 0..3 {
        if !matches!(result, Ok(PassResult::Reported) | Ok(PassResult::Raced)) {
            break;
        }
        result = agent.pass(false).await;
    }
    if let Some(l) = agent.take_liveness() {
        l.stop().await;
    }
    result
}

/// Uploads the queued run logs for a while; what is left stays queued.
async fn drain_uploads(cfg: &Config, store: &DynStore) {
    let Some(client) = &cfg.swift else { return };
    let left = Uploader::new(cfg.state_dir.clone(), client.clone(), store.clone())
        .drain(Duration::from_secs(30))
        .await;
    if left > 0 {
        eprintln!(
            "jio-agent: {left} run log(s) not uploaded yet; they stay queued in {}",
            crate::uploads::dir(&cfg.state_dir).display()
        );
    }
}

/// What `once` says about its last pass, and its exit code.
fn once_outcome(agent: &Agent, result: &Result<PassResult, AgentError>) -> u8 {
    match result {
        Ok(PassResult::Ran {
            result: RunResult::Success,
            version,
        }) => {
            println!("jio-agent: upgraded to {version}");
            exit::OK
        }
        Ok(PassResult::Ran {
            result: RunResult::Failed,
            version,
        }) => {
            let reason = agent
                .journal()
                .last_run
                .as_ref()
                .and_then(|r| r.reason.clone())
                .unwrap_or_default();
            fail(format!("upgrade to {version} failed: {reason}"), exit::FAILED)
        }
        Ok(PassResult::Ran {
            result: RunResult::Interrupted,
            version,
        }) => fail(format!("upgrade to {version} was interrupted"), exit::INTERRUPTED),
        Ok(PassResult::Idle(Decision::Backoff { version, .. })) => fail(
            format!("upgrade to {version} failed earlier; waiting before retrying"),
            exit::FAILED,
        ),
        Ok(PassResult::Idle(Decision::Blocked { reason })) => fail(
            format!("blocked by an invalid value in the store, nothing was run: {reason}"),
            exit::FAILED,
        ),
        Ok(PassResult::Idle(Decision::RolloutUnusable { reason, .. })) => fail(
            format!("the active rollout's record cannot be used, nothing was run: {reason}"),
            exit::FAILED,
        ),
        Ok(PassResult::Rebooting { version, until }) => fail(rebooting_text(version, *until), exit::FAILED),
        Ok(PassResult::Raced) => fail(
            "the desired version or an enable key kept changing while deciding; nothing was run",
            exit::FAILED,
        ),
        Ok(PassResult::Idle(d)) => {
            println!("jio-agent: {}", decision_text(d));
            exit::OK
        }
        Ok(PassResult::Reported) => exit::OK,
        Ok(PassResult::Command { id, outcome }) => match outcome {
            jio_common::command_record::RunOutcome::Succeeded => {
                println!("jio-agent: fleet command {id} succeeded");
                exit::OK
            }
            jio_common::command_record::RunOutcome::Interrupted => {
                fail(format!("fleet command {id} was interrupted"), exit::INTERRUPTED)
            }
            other => fail(format!("fleet command {id} {}", other.as_str()), exit::FAILED),
        },
        // `once` never asks for a health check; should one have run, say how it went.
        Ok(PassResult::Skipped { version }) => fail(
            format!("the health check of {version} could not start (see the log)"),
            exit::FAILED,
        ),
        Ok(PassResult::Checked { version, ok } | PassResult::Repaired { version, ok }) => {
            if *ok {
                println!("jio-agent: {version} is healthy");
                exit::OK
            } else {
                fail(format!("the health check of {version} failed"), exit::FAILED)
            }
        }
        Err(e) => fail(e, error_code(e)),
    }
}

/// What `once` says of a run that ends with a reboot it does not carry out.
fn rebooting_text(version: &jio_common::names::Version, until: Option<u64>) -> String {
    match until {
        Some(t) => format!(
            "the run to {version} ends with a reboot; the agent service waits for the new boot until {}",
            jio_common::time::utc_stamp(t)
        ),
        None => format!(
            "the run to {version} ends with a reboot, which waits (held, or left to the agent service)"
        ),
    }
}

async fn record_provisioned(store: &DynStore, cfg: &Config, failure: Option<&str>) -> bool {
    let txn = report::provisioned_txn(&cfg.schema, &cfg.hostname, failure);
    match store.txn(txn).await {
        Ok(_) => true,
        Err(e) => {
            say(format!("cannot record provisioning: {e}"), None);
            false
        }
    }
}

async fn run(cfg: Config, sources: Overrides) -> u8 {
    loop {
        match serve_until_stopped(cfg.clone(), sources.clone()).await {
            Ok(code) => return code,
            // Checked again now: the file may have changed while the daemon finished
            // up, and a new process that cannot start would leave the host unmanaged.
            Err(()) => match config::load(&sources, identity::system_hostname) {
                // The lock and every connection are gone with the old daemon's state.
                Ok(_) => return restart_in_place(),
                Err(e) => tracing::error!(
                    "the configuration changed again while finishing up and now has a problem; serving on with the one this agent started with: {e}"
                ),
            },
        }
    }
}

/// The daemon; `Err(())` when it stopped to start again (SIGHUP).
async fn serve_until_stopped(cfg: Config, sources: Overrides) -> Result<u8, ()> {
    let _lock = match state::lock(&cfg.state_dir) {
        Ok(l) => l,
        Err(e @ state::StateError::Locked { .. }) => return Ok(fail(e, exit::LOCKED)),
        Err(e) => return Ok(fail(e, exit::SOFTWARE)),
    };
    let signals = shutdown_or_reload_signal(Some((sources, fingerprint(&cfg))));
    let mut shutdown = signals.rx.clone();
    let restart = signals.restart.clone();
    let mut reload = signals.restart.clone();
    // After a reload systemd keeps the watchdog armed: ping it while the store is
    // waited for, too.
    let restarted = std::env::var_os(RESTARTED_ENV).is_some();
    if restarted {
        crate::notify::spawn_watchdog();
    }
    let restarting = move || *restart.borrow();
    // Prometheus metrics, when configured: served and written from now on (a store
    // that cannot be reached shows as `jio_agent_store_up 0`).
    let metrics = crate::metrics::Metrics::new(cfg.hostname.as_str(), cfg.role.as_str(), &cfg.state_dir);
    let metrics_task = (cfg.metrics != crate::config::MetricsOutputs::default()).then(|| {
        tokio::spawn(crate::metrics::run(
            metrics.clone(),
            cfg.metrics.clone(),
            shutdown.clone(),
        ))
    });
    let store = match wait_for_store(&cfg, &metrics, (&mut shutdown, &mut reload), &restarting).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    // Ready once the store answered: systemd's `Type=notify` waits for this.
    crate::notify::notify(&format!("READY=1\nSTATUS=connected to {}", cfg.store));
    if !restarted {
        crate::notify::spawn_watchdog();
    }
    // Retried until it lands: a host missing from /active_roles/ is missing from
    // every other host's Hiera data.
    let publishing = tokio::spawn(report::keep_publishing(
        store.clone(),
        cfg.schema.clone(),
        (cfg.hostname.clone(), cfg.role.clone()),
        identity::addresses(),
        shutdown.clone(),
    ));
    // Count store requests: the startup cost and the steady state are logged.
    let counting = store::CountingStore::new(store);
    let store: DynStore = Arc::new(counting.clone());
    let stop_uploads = shutdown.clone();
    let mut agent = match Agent::new(cfg.clone(), store.clone(), shutdown) {
        Ok(a) => a,
        Err(e) => return Ok(fail(&e, error_code(&e))),
    };
    agent.set_metrics(metrics.clone());
    let uploader = cfg.swift.as_ref().map(|client| {
        let u = Uploader::new(cfg.state_dir.clone(), client.clone(), store.clone());
        agent.set_upload_wake(u.wake.clone());
        tokio::spawn(u.run(stop_uploads))
    });
    log_counts_on_sigusr1(counting.clone());
    tracing::info!(host = %cfg.hostname, role = %cfg.role, "jio-agent running");
    agent.set_reload(signals.restart.clone());
    let res = crate::daemon::serve(agent).await;
    // The daemon finished (stopped, or for a reload with no run going on): its
    // helpers stop with it.
    let _ = signals.stop.send(true);
    // systemd's reload protocol: RELOADING=1, then the new process's READY=1.
    crate::notify::notify(if restarting() { "RELOADING=1" } else { "STOPPING=1" });
    log_counts(&counting);
    if let Some(u) = uploader {
        let _ = u.await;
    }
    let _ = publishing.await;
    if let Some(m) = metrics_task {
        let _ = m.await;
    }
    match res {
        Ok(()) if restart_wins(&restarting).await => Err(()),
        Ok(()) => {
            tracing::info!("stopped");
            Ok(exit::OK)
        }
        Err(e) => Ok(fail(&e, error_code(&e))),
    }
}

/// Connects to the store, waiting for it while it is unreachable or refuses this
/// agent (said once per reason); `Err`: what the daemon returns instead (it was
/// stopped or reloaded meanwhile, or the store cannot be used as configured).
async fn wait_for_store(
    cfg: &Config,
    metrics: &crate::metrics::Metrics,
    signals: (&mut watch::Receiver<bool>, &mut watch::Receiver<bool>),
    restarting: &impl Fn() -> bool,
) -> Result<DynStore, Result<u8, ()>> {
    let (shutdown, reload) = signals;
    // The daemon waits for the store instead of exiting.
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
    let mut last_refusal = String::new();
    loop {
        match connect(cfg).await {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == ErrorKind::Unavailable => {
                metrics.store_failed();
                if backoff.failures() == 0 {
                    tracing::warn!(error = %e, "store unreachable; waiting for it");
                }
            }
            // TLS, authentication or permission: fixed on the store's side (a
            // certificate re-issued, a password reset, a role granted) as often as
            // here, so the daemon waits and says why, again only when the reason changes.
            Err(e) if e.kind() == ErrorKind::Denied => {
                metrics.store_failed();
                let msg = e.to_string();
                if msg != last_refusal {
                    tracing::error!(error = %msg, "the store refused this agent; waiting (check its certificate, user, password and role)");
                    last_refusal = msg;
                }
            }
            Err(e) => return Err(Ok(fail(e, exit::USAGE))),
        }
        if let Some(code) = wait_or_stop(&mut backoff, shutdown, reload, restarting).await {
            return Err(code);
        }
    }
}

/// Waits the backoff's next delay before the store is tried again; `Some`: the
/// daemon stopped, or a reload came (what it returns then).
async fn wait_or_stop(
    backoff: &mut Backoff,
    shutdown: &mut watch::Receiver<bool>,
    reload: &mut watch::Receiver<bool>,
    restarting: &impl Fn() -> bool,
) -> Option<Result<u8, ()>> {
    tokio::select! {
        _ = tokio::time::sleep(backoff.fail_spread()) => None,
        _ = shutdown.changed() => Some(if restart_wins(restarting).await { Err(()) } else { Ok(exit::OK) }),
        // Nothing runs while the store is waited for: a reload applies now.
        _ = reload.changed() => if restarting() { Some(if restart_wins(restarting).await { Err(()) } else { Ok(exit::OK) }) } else { None },
    }
}

/// Logs the store requests and lease renewals since the start.
fn log_counts(counting: &store::CountingStore) {
    tracing::info!(
        store_requests = counting.requests(),
        lease_renewals = counting.keep_alives(),
        "store requests since start"
    );
}

/// SIGUSR1 logs the counts (for operators and the footprint benchmark).
fn log_counts_on_sigusr1(counting: store::CountingStore) {
    tokio::spawn(async move {
        let Ok(mut usr1) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
        else {
            return;
        };
        while usr1.recv().await.is_some() {
            log_counts(&counting);
        }
    });
}
