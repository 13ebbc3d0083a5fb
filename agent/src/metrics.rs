//! The agent's Prometheus metrics: what the daemon learns as it goes (versions,
//! the gate and the decision, runs and their steps, store errors), kept in one
//! shared record, and the two ways out: `/metrics` on `metrics_listen`, and a file
//! for node-exporter's textfile collector (`metrics_textfile`). Both are off by
//! default. Nothing here reads the store or decides anything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jio_common::exposition::{Exposition, Kind};

use crate::config::MetricsOutputs;
use crate::decide::{Decision, Observation};
use crate::pass::PassResult;
use crate::state::LastRun;

/// What the agent knows, as of its last pass.
#[derive(Debug, Default)]
struct Record {
    desired: Option<String>,
    local: Option<String>,
    /// The gate's answer (`enabled`, `disabled`, `blocked`) and its level.
    gate: Option<(&'static str, &'static str)>,
    decision: Option<&'static str>,
    last_run: Option<LastRun>,
    /// How long each step of the last run that ran it took, in seconds.
    steps: BTreeMap<&'static str, f64>,
    /// Finished runs by kind (`upgrade`, `health_check`, `repair`, `command`) and result.
    runs: BTreeMap<(&'static str, &'static str), u64>,
    /// Reboots that end runs, by event (`wanted`, `asked`, `back`, `not_back`).
    reboots: BTreeMap<&'static str, u64>,
    passes_failed: u64,
    store_errors: u64,
    watch_reopens: u64,
    /// The last pass could use the store (`None`: none has ended yet).
    store_up: Option<bool>,
}

/// The shared record; cheap to clone.
#[derive(Debug, Clone)]
pub struct Metrics {
    record: Arc<Mutex<Record>>,
    host: String,
    role: String,
    state_dir: PathBuf,
    started: f64,
    /// Wakes the textfile writer after a pass.
    changed: Arc<tokio::sync::Notify>,
}

impl Metrics {
    pub fn new(host: &str, role: &str, state_dir: &Path) -> Metrics {
        Metrics {
            record: Arc::default(),
            host: host.to_string(),
            role: role.to_string(),
            state_dir: state_dir.to_path_buf(),
            started: jio_common::time::unix_now() as f64,
            changed: Arc::default(),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Record) -> T) -> T {
        let mut r = self.record.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut r)
    }

    /// A pass observed `obs` and decided `decision`.
    pub fn decided(&self, obs: &Observation, decision: &Decision) {
        self.with(|r| {
            r.desired = obs.desired.as_ref().map(ToString::to_string);
            r.local = obs.local.as_ref().map(ToString::to_string);
            let answer = if obs.gate.blocked.is_some() {
                "blocked"
            } else if obs.gate.enabled {
                "enabled"
            } else {
                "disabled"
            };
            r.gate = Some((answer, obs.gate.level.as_str()));
            r.decision = Some(decision.kind());
        });
    }

    /// A step of a run took `took`.
    pub fn step(&self, step: &'static str, took: Duration) {
        self.with(|r| {
            r.steps.insert(step, took.as_secs_f64());
        });
    }

    /// A pass ended with `result`; `last_run` is the journal's last upgrade.
    pub fn passed(&self, result: &PassResult, last_run: Option<&LastRun>) {
        self.with(|r| {
            r.store_up = Some(true);
            let run = match result {
                PassResult::Ran { result, .. } => Some(("upgrade", result.as_str())),
                PassResult::Checked { ok, .. } => {
                    Some(("health_check", if *ok { "success" } else { "failed" }))
                }
                PassResult::Repaired { ok, .. } => Some(("repair", if *ok { "success" } else { "failed" })),
                // The same words for every kind: success, failed, interrupted, refused.
                PassResult::Command { outcome, .. } => Some((
                    "command",
                    match outcome {
                        jio_common::command_record::RunOutcome::Succeeded => "success",
                        o => o.as_str(),
                    },
                )),
                _ => None,
            };
            if let Some(k) = run {
                *r.runs.entry(k).or_default() += 1;
            }
            r.last_run = last_run.cloned();
        });
        self.changed.notify_one();
    }

    /// A run's reboot reached `event`: `wanted` (journaled), `asked` (the reboot
    /// command ran), `back` (a new boot), `not_back` (no new boot in time).
    pub fn reboot(&self, event: &'static str) {
        self.with(|r| *r.reboots.entry(event).or_default() += 1);
        self.changed.notify_one();
    }

    /// A pass failed; `store` says whether the store was unreachable.
    pub fn pass_failed(&self, store: bool) {
        self.with(|r| r.passes_failed += 1);
        if store {
            self.store_failed();
        } else {
            self.changed.notify_one();
        }
    }

    /// The store failed the daemon (a pass, a watch, or opening the watches).
    pub fn store_failed(&self) {
        self.with(|r| {
            r.store_errors += 1;
            r.store_up = Some(false);
        });
        self.changed.notify_one();
    }

    /// The store took a write again (the liveness record) after failing.
    pub fn store_answered(&self) {
        self.with(|r| r.store_up = Some(true));
        self.changed.notify_one();
    }

    /// The watches on the store were opened again (after they failed or ended).
    pub fn watches_reopened(&self) {
        self.with(|r| r.watch_reopens += 1);
    }

    /// The text of one scrape.
    pub fn render(&self) -> String {
        let queue = crate::uploads::queue_length(&self.state_dir) as f64;
        let r = self.record.lock().unwrap_or_else(|p| p.into_inner());
        let mut e = Exposition::new();
        self.render_identity(&mut e);
        render_pass(&mut e, &r);
        if let Some(run) = &r.last_run {
            render_last_run(&mut e, run);
        }
        render_counts(&mut e, &r);
        e.single(
            "jio_agent_upload_queue_length",
            Kind::Gauge,
            "Run logs waiting to be uploaded to Swift.",
            queue,
        );
        e.finish()
    }

    /// The agent's build, host, role and start time.
    fn render_identity(&self, e: &mut Exposition) {
        let host = || ("host", self.host.clone());
        e.family(
            "jio_agent_info",
            Kind::Gauge,
            "The agent's build, host and role (always 1).",
            [(
                vec![
                    ("version", env!("CARGO_PKG_VERSION").to_string()),
                    host(),
                    ("role", self.role.clone()),
                ],
                1.0,
            )],
        )
        .single(
            "jio_agent_start_time_seconds",
            Kind::Gauge,
            "When the agent started (Unix time).",
            self.started,
        );
    }
}

/// What the last pass read and decided: the desired and local versions, the gate
/// and the decision.
fn render_pass(e: &mut Exposition, r: &Record) {
    let version = |v: &Option<String>| {
        v.iter()
            .map(|v| (vec![("version", v.clone())], 1.0))
            .collect::<Vec<_>>()
    };
    e.family(
            "jio_agent_desired_version_info",
            Kind::Gauge,
            "The fleet's desired version (/current_version) as last read (always 1; absent when none is set).",
            version(&r.desired),
        )
        .family(
            "jio_agent_local_version_info",
            Kind::Gauge,
            "The version this host runs (always 1; absent before its first converge).",
            version(&r.local),
        )
        .family(
            "jio_agent_gate_info",
            Kind::Gauge,
            "The enable gate as last decided: enabled, disabled or blocked, and the key level that decided (host, role, global, default).",
            r.gate
                .iter()
                .map(|(d, l)| (vec![("decision", d.to_string()), ("level", l.to_string())], 1.0)),
        )
        .family(
            "jio_agent_decision_info",
            Kind::Gauge,
            "What the agent's last pass decided (up_to_date, upgrade, disabled, held, ...).",
            r.decision.iter().map(|d| (vec![("decision", d.to_string())], 1.0)),
        );
}

/// The last upgrade run: its version, result, end and duration.
fn render_last_run(e: &mut Exposition, run: &LastRun) {
    let labels = || {
        vec![
            ("version", run.version.to_string()),
            ("result", run.result.as_str().to_string()),
        ]
    };
    e.family(
        "jio_agent_last_run_info",
        Kind::Gauge,
        "The last upgrade run: its version and result (success, failed, interrupted).",
        [(
            {
                let mut l = labels();
                l.push(("step", run.step.clone()));
                l
            },
            1.0,
        )],
    )
    .single(
        "jio_agent_last_run_success",
        Kind::Gauge,
        "1 when the last upgrade run succeeded, 0 otherwise.",
        f64::from(u8::from(run.result == crate::state::RunResult::Success)),
    )
    .single(
        "jio_agent_last_run_timestamp_seconds",
        Kind::Gauge,
        "When the last upgrade run ended (Unix time).",
        run.finished as f64,
    )
    .single(
        "jio_agent_last_run_duration_seconds",
        Kind::Gauge,
        "How long the last upgrade run took.",
        run.finished.saturating_sub(run.started) as f64,
    );
}

/// The step durations, the run, failure and error counts and whether the store is up.
fn render_counts(e: &mut Exposition, r: &Record) {
    e.family(
            "jio_agent_step_duration_seconds",
            Kind::Gauge,
            "How long each step took the last time it ran (configure: pre-commands and Puppet; validate).",
            r.steps.iter().map(|(s, d)| (vec![("step", s.to_string())], *d)),
        )
        .family(
            "jio_agent_runs_total",
            Kind::Counter,
            "Runs since the agent started, by kind (upgrade, health_check, repair, command) and result.",
            r.runs
                .iter()
                .map(|((k, res), n)| (vec![("kind", k.to_string()), ("result", res.to_string())], *n as f64)),
        )
        .family(
            "jio_agent_reboots_total",
            Kind::Counter,
            "Reboots that end runs since the agent started, by event: wanted (journaled), asked (the reboot command ran), back (a new boot id), not_back (none by reboot_timeout).",
            r.reboots.iter().map(|(ev, n)| (vec![("event", ev.to_string())], *n as f64)),
        )
        .single(
            "jio_agent_failures_total",
            Kind::Counter,
            "Runs that failed since the agent started (every kind).",
            r.runs
                .iter()
                .filter(|((_, res), _)| *res == "failed")
                .map(|(_, n)| *n)
                .sum::<u64>() as f64,
        )
        .single(
            "jio_agent_pass_errors_total",
            Kind::Counter,
            "Passes that ended in an error (retried with backoff).",
            r.passes_failed as f64,
        )
        .single(
            "jio_agent_store_errors_total",
            Kind::Counter,
            "Store failures: passes that found it unreachable, watches that failed or could not be opened, liveness renewals that began to fail.",
            r.store_errors as f64,
        )
        .single(
            "jio_agent_store_reconnects_total",
            Kind::Counter,
            "Times a store watch was re-established after its connection was lost (by the store's client, or by the agent reopening it).",
            (r.watch_reopens + jio_common::store::watch_reconnects()) as f64,
        );
    if let Some(up) = r.store_up {
        e.single(
                "jio_agent_store_up",
                Kind::Gauge,
                "1 when the store last answered the agent (a pass, its liveness record), 0 when it last failed to.",
                f64::from(u8::from(up)),
            );
    }
}

#[async_trait::async_trait]
impl jio_common::exposition::Scrape for Metrics {
    async fn scrape(&self) -> String {
        self.render()
    }
}

/// How often the textfile is written even when no pass ended (the upload queue
/// changes on its own).
const TEXTFILE_EVERY: Duration = Duration::from_secs(15);

/// Serves and writes the metrics until `stop` turns true. A port that cannot be
/// taken or a file that cannot be written is logged (once per reason) and tried
/// again; it never stops the agent.
pub async fn run(metrics: Metrics, out: MetricsOutputs, stop: tokio::sync::watch::Receiver<bool>) {
    let serve = out.listen.map(|addr| {
        tokio::spawn(jio_common::exposition::serve(
            addr,
            Arc::new(metrics.clone()),
            stop.clone(),
            "metrics_listen",
            |at| tracing::info!(addr = %at, "serving metrics on /metrics"),
        ))
    });
    if let Some(path) = out.textfile {
        write_textfile(&metrics, &path, stop).await;
    }
    if let Some(s) = serve {
        let _ = s.await;
    }
}

async fn write_textfile(metrics: &Metrics, path: &Path, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut last_error = None;
    loop {
        let text = metrics.render();
        match crate::state::write_atomic(path, text.as_bytes()) {
            Ok(()) => {
                if last_error.take().is_some() {
                    tracing::info!(path = %path.display(), "the metrics file is written again");
                }
            }
            Err(e) => {
                let msg = e.to_string();
                if last_error.as_ref() != Some(&msg) {
                    tracing::warn!(path = %path.display(), error = %msg, "cannot write the metrics file; trying again");
                    last_error = Some(msg);
                }
            }
        }
        if *stop.borrow() {
            return;
        }
        tokio::select! {
            _ = metrics.changed.notified() => {}
            _ = tokio::time::sleep(TEXTFILE_EVERY) => {}
            _ = stop.changed() => {}
        }
    }
}
