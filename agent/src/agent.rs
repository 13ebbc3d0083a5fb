//! The agent's passes: observe the store and the host, decide (pure), act at most
//! once, report in one transaction per step. `run` loops passes, woken by watches.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt as _;
use jio_common::fleet::ROLLOUT_LOCK;
use jio_common::gate::{self, GateKeys, KeyState};
use jio_common::keys::{EnableLevel, Key, Outcome as KeyOutcome, Schema, Step};
use jio_common::names::{HostName, Role, Version};
use jio_common::store::{Compare, DynStore, ErrorKind, Op, Revision, StoreError};
use jio_common::time::{unix_now, utc_stamp};
use jio_common::values::{AgentState, parse_version};
use tokio::sync::watch;

use crate::config::{Config, Steps};
use crate::decide::{self, Decision, Failure, Observation, Why};
use crate::liveness::Liveness;
use crate::report;
use crate::runner::{self, Outcome, Spec};
use crate::state::{self, Journal, LastRun, PendingReport, RunResult, RunStart, StateError};
use crate::uploads;

/// Runs kept in the state directory; older ones are removed.
const KEEP_RUNS: usize = 20;

/// Why the agent could not carry on.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    State(#[from] StateError),
}

impl AgentError {
    pub fn store_unavailable(&self) -> bool {
        matches!(self, AgentError::Store(e) if e.kind() == ErrorKind::Unavailable)
    }
}

/// What a pass did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PassResult {
    /// Nothing to do (up to date, disabled, waiting, no desired version).
    Idle(Decision),
    /// Earlier results were written to the store.
    Reported,
    /// An upgrade ran.
    Ran { version: Version, result: RunResult },
    /// What the decision read changed before the run could start: nothing ran.
    Raced,
}

/// One host's agent.
pub struct Agent {
    pub cfg: Config,
    pub store: DynStore,
    pub journal: Journal,
    pub liveness: Option<Liveness>,
    shutdown: watch::Receiver<bool>,
    last_decision: Option<Decision>,
    /// The last idle health check failed and Puppet could not repair it.
    health_failed: bool,
    /// Wakes the Swift uploader when a log is queued.
    pub upload_wake: Option<std::sync::Arc<tokio::sync::Notify>>,
    /// Versions under which this host has a `/running/versions` entry, once known
    /// (learnt by one listing; kept up to date by this agent's own reports).
    running_versions: Option<Vec<Version>>,
    /// This host's run marker may be in the store and no run is going on: remove it.
    run_marker: bool,
    /// Commands a killed agent left running, to stop before anything else.
    orphan: Option<runner::ProcessGroup>,
    /// The last journal save failed (logged once until it works again).
    journal_failing: bool,
}

impl Agent {
    /// Loads the journal and turns a run that a dead agent left in progress into an
    /// interrupted one (it will be run again). The commands it left running are
    /// stopped by the first pass, before anything else happens.
    pub fn new(cfg: Config, store: DynStore, shutdown: watch::Receiver<bool>) -> Result<Agent, AgentError> {
        let mut agent = Agent::new_readonly(cfg, store, shutdown)?;
        if let Some(run) = agent.journal.in_progress.take() {
            agent.orphan = run.child;
            tracing::warn!(
                version = %run.version,
                started = run.started,
                pid = run.pid,
                "found a run that never finished (the agent stopped during it); it counts as interrupted and will run again"
            );
            agent.journal.last_run = Some(LastRun {
                version: run.version,
                started: run.started,
                finished: unix_now(),
                result: RunResult::Interrupted,
                step: "unknown".into(),
                reason: Some("the agent stopped during the run".into()),
                run_dir: run.run_dir,
            });
            agent.save_journal();
        }
        Ok(agent)
    }

    /// For `status`: reads the journal without recovering or changing anything.
    pub fn new_readonly(
        cfg: Config,
        store: DynStore,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Agent, AgentError> {
        let journal = Journal::load(&cfg.state_dir)?;
        Ok(Agent {
            cfg,
            store,
            journal,
            liveness: None,
            shutdown,
            last_decision: None,
            health_failed: false,
            upload_wake: None,
            running_versions: None,
            run_marker: true,
            orphan: None,
            journal_failing: false,
        })
    }

    fn schema(&self) -> &Schema {
        &self.cfg.schema
    }
    fn host(&self) -> &HostName {
        &self.cfg.hostname
    }
    fn role(&self) -> &Role {
        &self.cfg.role
    }

    /// The keys whose changes should wake the agent.
    pub fn watched_keys(&self) -> Vec<Key> {
        let s = self.schema();
        vec![
            s.current_version(),
            s.enable(&EnableLevel::Global),
            s.enable(&EnableLevel::Role(self.role().clone())),
            s.enable(&EnableLevel::Host(self.host().clone())),
        ]
    }

    /// Reads the desired version, the gate and the rollout lock. An invalid value is
    /// part of what was observed (the decision says the host is blocked), never an
    /// error.
    pub async fn observe(&self) -> Result<Observation, AgentError> {
        let s = self.schema();
        let keys = [
            s.current_version(),
            s.enable(&EnableLevel::Host(self.host().clone())),
            s.enable(&EnableLevel::Role(self.role().clone())),
            s.enable(&EnableLevel::Global),
            s.lock(ROLLOUT_LOCK),
        ];
        let got = self.store.get_many(&keys).await?;
        let [desired, h, r, g, lock] = <[_; 5]>::try_from(got).map_err(|_| {
            AgentError::Store(StoreError::Rejected {
                url: self.store.url().to_string(),
                op: "get",
                message: "the store answered a different number of keys".into(),
            })
        })?;
        let mut states: [KeyState; 3] = Default::default();
        let mut revs: [Revision; 3] = [0; 3];
        for (i, kv) in [h, r, g].into_iter().enumerate() {
            if let Some(kv) = kv {
                states[i] = KeyState::read(Some(&kv));
                revs[i] = kv.mod_revision;
            }
        }
        let desired_revision = desired.as_ref().map_or(0, |kv| kv.mod_revision);
        let (desired, desired_invalid) = match desired.as_ref().map(parse_version) {
            None => (None, None),
            Some(Ok(v)) => (v, None),
            Some(Err(e)) => (None, Some(e.to_string())),
        };
        let [host, role, global] = states;
        Ok(Observation {
            desired,
            desired_invalid,
            desired_revision,
            rollout_lock: lock.is_some(),
            local: state::read_local_version(&self.cfg.version_file)?,
            gate: gate::decide(&GateKeys { host, role, global }),
            gate_revisions: revs,
            failure: self.journal.failure.clone(),
            unreported: !self.journal.unreported.is_empty(),
            now: unix_now(),
            retry_interval: self.cfg.retry_interval,
        })
    }

    /// The compares that fence the start of an upgrade on what `obs` read: the
    /// desired version and the three enable keys are still at those revisions.
    fn start_fence(&self, obs: &Observation) -> Vec<Compare> {
        let s = self.schema();
        let gate_keys = [
            s.enable(&EnableLevel::Host(self.host().clone())),
            s.enable(&EnableLevel::Role(self.role().clone())),
            s.enable(&EnableLevel::Global),
        ];
        let mut c = vec![Compare::ModRevision(s.current_version(), obs.desired_revision)];
        c.extend(
            gate_keys
                .into_iter()
                .zip(obs.gate_revisions)
                .map(|(k, rev)| Compare::ModRevision(k, rev)),
        );
        c
    }

    /// Writes the record that says a run starts, fenced on `compares`; `false` when
    /// the run must not start (something changed, or the store cannot fence it).
    async fn begin(
        &mut self,
        state: AgentState,
        version: &Version,
        compares: Vec<Compare>,
    ) -> Result<bool, AgentError> {
        let Some(l) = &self.liveness else {
            // Without a liveness record (tests of a bare pass) there is nothing to fence.
            return Ok(true);
        };
        // The run marker outlives a frozen or killed agent (no lease): the host keeps
        // its slot until this agent has seen the run end and removed it.
        let marker = Op::put(
            self.schema().run(self.host()),
            serde_json::to_string(&jio_common::values::AgentRecord {
                state,
                version: Some(version.clone()),
                since: unix_now(),
                pid: std::process::id(),
            })
            .unwrap_or_default(),
        );
        let started = l
            .begin(state, Some(version.clone()), compares, vec![marker])
            .await?;
        if started {
            self.run_marker = true;
        }
        Ok(started)
    }

    /// Removes the run marker once no run is going on (after a run, and at start-up:
    /// a killed agent's marker stays until its successor has stopped the orphans).
    async fn clear_run_marker(&mut self) -> Result<(), AgentError> {
        if self.run_marker {
            self.store.delete(&self.schema().run(self.host())).await?;
            self.run_marker = false;
        }
        Ok(())
    }

    /// One pass: report what is pending, or observe, decide and act.
    pub async fn pass(&mut self) -> Result<PassResult, AgentError> {
        if let Some(child) = self.orphan.take()
            && runner::stop_orphan(child).await
        {
            tracing::warn!(
                pgid = child.pgid,
                "stopped the commands a killed agent left running"
            );
        }
        self.clear_run_marker().await?;
        if !self.journal.unreported.is_empty() {
            self.flush_reports().await?;
            return Ok(PassResult::Reported);
        }
        let obs = self.observe().await?;
        self.act(&obs).await
    }

    /// Decides on `obs` and acts. A run starts only if nothing `obs` read has changed
    /// since: its start is fenced on the revisions `obs` holds (`Raced` otherwise).
    pub async fn act(&mut self, obs: &Observation) -> Result<PassResult, AgentError> {
        let decision = decide::decide(obs);
        if self.last_decision.as_ref() != Some(&decision) {
            log_decision(&decision, obs);
            self.last_decision = Some(decision.clone());
        }
        match decision {
            Decision::Upgrade { version, why } => {
                if !self
                    .begin(AgentState::Upgrading, &version, self.start_fence(obs))
                    .await?
                {
                    tracing::info!(%version, "the desired version or an enable key changed before the run could start; deciding again");
                    self.last_decision = None;
                    return Ok(PassResult::Raced);
                }
                let result = self.upgrade(&version, why, obs).await;
                self.last_decision = None;
                Ok(PassResult::Ran { version, result })
            }
            Decision::Report => {
                self.flush_reports().await?;
                Ok(PassResult::Reported)
            }
            other => {
                let state = match &self.journal.failure {
                    Some(f) if Some(&f.version) == obs.desired.as_ref() => AgentState::Failed,
                    _ if self.health_failed && other == Decision::UpToDate => AgentState::Failed,
                    _ => AgentState::Idle,
                };
                self.set_liveness(state, obs.local.clone().or(obs.desired.clone()));
                Ok(PassResult::Idle(other))
            }
        }
    }

    /// Saves the journal. A failure is logged (once until it works again) and the
    /// agent carries on: the journal in memory is right, and the next save writes it
    /// whole. Returns whether it was saved.
    fn save_journal(&mut self) -> bool {
        match self.journal.save(&self.cfg.state_dir) {
            Ok(()) => {
                if std::mem::take(&mut self.journal_failing) {
                    tracing::info!("the journal is written again");
                }
                true
            }
            Err(e) => {
                if !std::mem::replace(&mut self.journal_failing, true) {
                    tracing::error!(error = %e, "cannot write the journal; results are kept in memory until it can be written");
                }
                false
            }
        }
    }

    fn set_liveness(&self, state: AgentState, version: Option<Version>) {
        if let Some(l) = &self.liveness {
            l.set(state, version);
        }
    }

    /// Writes every pending report, oldest first. A validated success moves the
    /// local version first (see `settle_local_version`). Only store errors are
    /// returned: the reports not yet written stay in the journal.
    pub async fn flush_reports(&mut self) -> Result<(), AgentError> {
        while !self.journal.unreported.is_empty() {
            self.settle_local_version(0);
            let r = self.journal.unreported[0].clone();
            let revision = report::apply(
                &self.store,
                self.schema(),
                self.host(),
                &r,
                self.running_versions.as_deref(),
            )
            .await?;
            if r.step == Step::Validated && r.ok {
                self.running_versions = Some(vec![r.version.clone()]);
            }
            tracing::info!(version = %r.version, step = r.step.as_str(), ok = r.ok, "reported");
            if let (Some(log), Some(object)) = (&r.log, &r.object) {
                let outcome = if r.ok {
                    KeyOutcome::Success
                } else {
                    KeyOutcome::Failure
                };
                let entry = uploads::Entry {
                    object: object.clone(),
                    key: self
                        .schema()
                        .status(r.step, outcome, &r.version, self.host())
                        .to_string(),
                    revision,
                };
                match uploads::enqueue(&self.cfg.state_dir, log, &entry) {
                    Ok(()) => {
                        if let Some(w) = &self.upload_wake {
                            w.notify_one();
                        }
                    }
                    Err(e) => {
                        tracing::warn!(log = %log.display(), error = %e, "cannot queue the run log for upload")
                    }
                }
            }
            self.journal.unreported.remove(0);
            self.save_journal();
        }
        Ok(())
    }

    /// The store shows a host upgraded only once its local version file says so:
    /// for the pending validated success at `i`, the version file is written before
    /// the report goes out (the journal already holds the report, so a crash in
    /// between is reported at the next start). When it cannot be written, the report
    /// becomes the validation's failure with that reason (also appended to its log),
    /// and the reason is returned.
    fn settle_local_version(&mut self, i: usize) -> Option<String> {
        let vf = self.cfg.version_file.clone();
        let r = self.journal.unreported.get_mut(i)?;
        if r.step != Step::Validated || !r.ok {
            return None;
        }
        if matches!(state::read_local_version(&vf), Ok(Some(v)) if v == r.version) {
            return None;
        }
        let e = state::write_local_version(&vf, &r.version).err()?;
        let reason = format!("the version file could not be written to {}: {e}", vf.display());
        tracing::error!(version = %r.version, %reason, "the upgrade counts as failed");
        r.ok = false;
        r.link = reason.clone();
        if let Some(log) = &r.log {
            let line = format!("== but the upgrade counts as failed: {reason}\n");
            let appended = std::fs::OpenOptions::new()
                .append(true)
                .open(log)
                .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
            if let Err(e) = appended {
                tracing::warn!(log = %log.display(), error = %e, "cannot add the reason to the run log");
            }
        }
        self.save_journal();
        Some(reason)
    }

    /// Keeps a step's report in the journal (durably where the journal can be
    /// written), then tries to write it to the store; what the store cannot take now
    /// stays in the journal for a later pass. Returns the reason a validated success
    /// turned into a failure (the local version file could not be written).
    async fn report(&mut self, r: PendingReport) -> Option<String> {
        self.journal.unreported.push(r);
        self.save_journal();
        let failed = self.settle_local_version(self.journal.unreported.len() - 1);
        match self.flush_reports().await {
            Ok(()) => {}
            Err(e) if e.store_unavailable() => {
                tracing::warn!(error = %e, "store unreachable; the result stays in the journal and is reported when it is back")
            }
            Err(e) => {
                tracing::warn!(error = %e, "the store did not take the result; it stays in the journal and is retried")
            }
        }
        failed
    }

    /// A step's report. A failure's reason is the status leaf's value until a log
    /// link (with Swift) replaces it.
    fn pending_report(
        &self,
        version: &Version,
        step: Step,
        outcome: &Outcome,
        run_dir: &Path,
    ) -> PendingReport {
        let at = unix_now();
        let ok = outcome.ok();
        let reason = match outcome {
            Outcome::Failure(r) => Some(r.chars().take(500).collect::<String>()),
            _ => None,
        };
        let mut r = PendingReport {
            version: version.clone(),
            step,
            ok,
            link: reason.clone().unwrap_or_default(),
            at,
            log: None,
            object: None,
        };
        if self.cfg.swift.is_none() {
            return r;
        }
        let names: Vec<String> = match step {
            Step::Configured => {
                let mut v: Vec<String> = std::fs::read_dir(run_dir)
                    .map(|rd| {
                        rd.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                            .filter(|n| n.starts_with("pre-"))
                            .collect()
                    })
                    .unwrap_or_default();
                v.sort();
                v.extend(["puppet.jsonl", "puppet.stdout", "puppet.stderr"].map(String::from));
                v
            }
            Step::Validated => ["validation.stdout", "validation.stderr"]
                .map(String::from)
                .to_vec(),
        };
        let files: Vec<PathBuf> = names.iter().map(|n| run_dir.join(n)).collect();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let stamp = utc_stamp(at);
        let id = format!("{stamp}-{nanos:09}-{}", step.as_str());
        let header = format!(
            "jio-agent run log: host {}, version {version}, {} {}{}, run {}",
            self.host(),
            step.as_str(),
            if ok { "success" } else { "failure" },
            reason.map(|r| format!(" ({r})")).unwrap_or_default(),
            run_dir.display()
        );
        match uploads::compose(&self.cfg.state_dir, &id, &header, &files) {
            Ok(log) => {
                r.log = Some(log);
                r.object = Some(format!("{}/{version}/{stamp}-{}.log", self.host(), step.as_str()));
            }
            Err(e) => tracing::warn!(error = %e, "cannot compose the run log; it will not be uploaded"),
        }
        r
    }

    /// Creates the directory of a new run; the error is the directory and the
    /// reason, naming it.
    fn new_run_dir(&self, version: &Version) -> Result<PathBuf, (PathBuf, String)> {
        let runs = self.cfg.state_dir.join("runs");
        let dir = runs.join(format!("{}-{}", utc_stamp(unix_now()), version));
        if let Err(e) = std::fs::create_dir_all(&dir) {
            let reason = format!("cannot create the run directory {}: {e}", dir.display());
            return Err((dir, reason));
        }
        prune_runs(&runs);
        Ok(dir)
    }

    fn env(&self, version: &Version, run_dir: &Path) -> Vec<(String, String)> {
        vec![
            ("JIO_VERSION".into(), version.to_string()),
            ("JIO_HOST".into(), self.host().to_string()),
            ("JIO_ROLE".into(), self.role().to_string()),
            ("JIO_RUN_DIR".into(), run_dir.display().to_string()),
        ]
    }

    async fn exec(
        &mut self,
        what: &str,
        argv: &[String],
        timeout: Duration,
        run_dir: &Path,
        name: &str,
        version: &Version,
    ) -> runner::Finished {
        let env = self.env(version, run_dir);
        let spec = Spec {
            argv,
            env: &env,
            timeout,
            stdout: &run_dir.join(format!("{name}.stdout")),
            stderr: &run_dir.join(format!("{name}.stderr")),
        };
        tracing::info!(step = what, command = ?argv, "starting");
        let journal = &mut self.journal;
        let state_dir = &self.cfg.state_dir;
        let f = runner::run(&spec, &mut self.shutdown, self.cfg.stop_grace, |group| {
            if let Some(run) = journal.in_progress.as_mut() {
                run.child = Some(group);
                if let Err(e) = journal.save(state_dir) {
                    tracing::warn!(error = %e, "cannot record the running command in the journal");
                }
            }
        })
        .await;
        tracing::info!(step = what, exit = ?f.exit, elapsed_ms = f.elapsed.as_millis() as u64, "finished");
        f
    }

    /// Puppet (after the fact file and pre-commands): the configure step.
    async fn configure(&mut self, version: &Version, run_dir: &Path) -> Outcome {
        if let Err(e) = state::write_fact(&self.cfg.facts_file, version) {
            return Outcome::Failure(format!(
                "the Facter fact could not be written to {}: {e}",
                self.cfg.facts_file.display()
            ));
        }
        if let Steps::Simulated(sim) = &self.cfg.steps {
            (sim.on_start)(self.host(), version);
            tokio::time::sleep(sim.configure).await;
            return Outcome::Success { changes: true };
        }
        for (i, cmd) in self.cfg.pre_commands.clone().iter().enumerate() {
            let f = self
                .exec(
                    "pre-command",
                    cmd,
                    self.cfg.pre_command_timeout,
                    run_dir,
                    &format!("pre-{i}"),
                    version,
                )
                .await;
            let o = runner::plain_outcome(&format!("pre-command {:?}", cmd.join(" ")), &f.exit);
            if !o.ok() {
                return o;
            }
        }
        let jsonl = run_dir.join("puppet.jsonl");
        let argv = substitute(&self.cfg.puppet_command, &jsonl, &self.cfg.validation_dir);
        let f = self
            .exec(
                "puppet",
                &argv,
                self.cfg.puppet_timeout,
                run_dir,
                "puppet",
                version,
            )
            .await;
        runner::puppet_outcome(&f.exit)
    }

    async fn validate(&mut self, version: &Version, run_dir: &Path) -> Outcome {
        if let Steps::Simulated(sim) = &self.cfg.steps {
            tokio::time::sleep(sim.validate).await;
            return Outcome::Success { changes: false };
        }
        if self
            .cfg
            .validation_command
            .iter()
            .any(|a| a.contains("{validation_dir}"))
            && !self.cfg.validation_dir.is_dir()
        {
            return Outcome::Failure(format!(
                "validation directory {} does not exist",
                self.cfg.validation_dir.display()
            ));
        }
        let argv = substitute(
            &self.cfg.validation_command,
            &run_dir.join("puppet.jsonl"),
            &self.cfg.validation_dir,
        );
        let f = self
            .exec(
                "validation",
                &argv,
                self.cfg.validation_timeout,
                run_dir,
                "validation",
                version,
            )
            .await;
        runner::plain_outcome("validation", &f.exit)
    }

    fn stopping(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// One upgrade to `version`: configure, validate, report each step. Whatever goes
    /// wrong on the host (a command, a file that cannot be written) is a failed run
    /// with its reason, reported like any other.
    async fn upgrade(&mut self, version: &Version, why: Why, obs: &Observation) -> RunResult {
        let started = unix_now();
        let (run_dir, step, outcome) = match self.prepare_run(version, started) {
            Ok(run_dir) => {
                tracing::info!(%version, reason = ?why, run_dir = %run_dir.display(), "upgrade starts");
                let (step, outcome) = self.configure_and_validate(version, &run_dir).await;
                (run_dir, step, outcome)
            }
            Err((run_dir, reason)) => {
                // Nothing ran: the configure step failed before its first command.
                let failed = Outcome::Failure(reason);
                self.report(self.pending_report(version, Step::Configured, &failed, &run_dir))
                    .await;
                (run_dir, "configured", failed)
            }
        };
        let (result, reason) = match &outcome {
            Outcome::Success { .. } => (RunResult::Success, None),
            Outcome::Failure(r) => (RunResult::Failed, Some(r.clone())),
            Outcome::Interrupted => (
                RunResult::Interrupted,
                Some("the agent was stopped during the run".into()),
            ),
        };
        self.journal.in_progress = None;
        self.journal.last_run = Some(LastRun {
            version: version.clone(),
            started,
            finished: unix_now(),
            result,
            step: step.into(),
            reason: reason.clone(),
            run_dir,
        });
        match result {
            RunResult::Success => self.journal.failure = None,
            RunResult::Failed => {
                let attempts = match &self.journal.failure {
                    Some(f) if &f.version == version => f.attempts + 1,
                    _ => 1,
                };
                self.journal.failure = Some(Failure {
                    version: version.clone(),
                    at: unix_now(),
                    attempts,
                    gate_revisions: obs.gate_revisions,
                });
            }
            RunResult::Interrupted => {}
        }
        self.save_journal();
        match result {
            RunResult::Success => {
                tracing::info!(%version, "upgrade succeeded");
                self.set_liveness(AgentState::Idle, Some(version.clone()));
            }
            RunResult::Failed => {
                tracing::error!(%version, step, reason = reason.as_deref().unwrap_or(""), "upgrade failed");
                self.set_liveness(AgentState::Failed, Some(version.clone()));
            }
            RunResult::Interrupted => tracing::warn!(%version, "upgrade interrupted; it will run again"),
        }
        result
    }

    /// Creates the run's directory and records the run in the journal. Without
    /// either nothing may run (a killed agent's run could not be found again): the
    /// error is the directory and the reason.
    fn prepare_run(&mut self, version: &Version, started: u64) -> Result<PathBuf, (PathBuf, String)> {
        let run_dir = self.new_run_dir(version)?;
        self.journal.in_progress = Some(RunStart {
            version: version.clone(),
            started,
            pid: std::process::id(),
            run_dir: run_dir.clone(),
            child: None,
        });
        if let Err(e) = self.journal.save(&self.cfg.state_dir) {
            self.journal.in_progress = None;
            return Err((run_dir, format!("the journal could not be written: {e}")));
        }
        Ok(run_dir)
    }

    /// The configure step, then (when it succeeded) the validation; each reported.
    /// Returns the last step that ran and its outcome.
    async fn configure_and_validate(&mut self, version: &Version, run_dir: &Path) -> (&'static str, Outcome) {
        let configured = self.configure(version, run_dir).await;
        if configured == Outcome::Interrupted {
            return ("configured", configured);
        }
        self.report(self.pending_report(version, Step::Configured, &configured, run_dir))
            .await;
        if !configured.ok() {
            return ("configured", configured);
        }
        if self.stopping() {
            return ("configured", Outcome::Interrupted);
        }
        let mut validated = self.validate(version, run_dir).await;
        if validated != Outcome::Interrupted
            && let Some(reason) = self
                .report(self.pending_report(version, Step::Validated, &validated, run_dir))
                .await
        {
            validated = Outcome::Failure(reason);
        }
        ("validated", validated)
    }

    /// The idle health check: validate; on failure run Puppet once to repair and
    /// validate again; report the outcome for the local version.
    ///
    /// A health check (and its repair) is a run like any other: it holds the host's
    /// slot, and it is fenced like an upgrade on what it decided on (the desired
    /// version and the enable keys), and also on the rollout lock being free: the
    /// driver of a `jioctl upgrade` counts a run once it has started, so none may
    /// start behind its back.
    pub async fn health_check(&mut self) -> Result<(), AgentError> {
        let obs = self.observe().await?;
        let Some(local) = obs.local.clone() else {
            return Ok(());
        };
        if decide::decide(&obs) != Decision::UpToDate {
            return Ok(()); // the next pass acts on what changed
        }
        if obs.rollout_lock {
            tracing::info!(version = %local, "health check skipped: a jioctl upgrade driver holds the rollout lock");
            return Ok(());
        }
        let run_dir = match self.new_run_dir(&local) {
            Ok(d) => d,
            Err((_, reason)) => {
                tracing::error!(version = %local, %reason, "health check skipped");
                return Ok(());
            }
        };
        let mut fence = self.start_fence(&obs);
        fence.push(Compare::ModRevision(self.schema().lock(ROLLOUT_LOCK), 0));
        if !self.begin(AgentState::Checking, &local, fence.clone()).await? {
            let why = self.why_fence_lost().await;
            tracing::info!(version = %local, "health check skipped: {why}");
            return Ok(());
        }
        let checked = self.validate(&local, &run_dir).await;
        if checked.ok() {
            self.health_failed = false;
            // Healthy again after a reported failure: say so.
            if self.has_failure_entry(&local).await? {
                tracing::info!(version = %local, "health check passes again");
                self.report(self.pending_report(&local, Step::Validated, &checked, &run_dir))
                    .await;
            }
            self.set_liveness(AgentState::Idle, Some(local.clone()));
            return Ok(());
        }
        if checked == Outcome::Interrupted {
            return Ok(());
        }
        if !self.begin(AgentState::Upgrading, &local, fence).await? {
            let why = self.why_fence_lost().await;
            tracing::warn!(version = %local, "health check failed, but no repair now: {why}");
            self.health_failed = true;
            self.set_liveness(AgentState::Failed, Some(local));
            return Ok(());
        }
        tracing::warn!(version = %local, "health check failed; running puppet to repair");
        let configured = self.configure(&local, &run_dir).await;
        if configured == Outcome::Interrupted {
            return Ok(());
        }
        let validated = if configured.ok() {
            self.validate(&local, &run_dir).await
        } else {
            configured.clone()
        };
        if validated == Outcome::Interrupted {
            return Ok(());
        }
        let repaired = if !configured.ok() {
            self.report(self.pending_report(&local, Step::Configured, &configured, &run_dir))
                .await;
            false
        } else {
            self.report(self.pending_report(&local, Step::Validated, &validated, &run_dir))
                .await
                .is_none()
                && validated.ok()
        };
        tracing::info!(version = %local, repaired, "health repair finished");
        self.health_failed = !repaired;
        self.set_liveness(
            if repaired {
                AgentState::Idle
            } else {
                AgentState::Failed
            },
            Some(local),
        );
        Ok(())
    }

    /// Why a fenced start of a health check lost, for the log (one read).
    async fn why_fence_lost(&self) -> &'static str {
        match self.store.get(&self.schema().lock(ROLLOUT_LOCK)).await {
            Ok(Some(_)) => "a jioctl upgrade driver holds the rollout lock",
            Ok(None) => "the desired version or an enable key changed since it was read",
            Err(_) => "the rollout lock, the desired version or an enable key changed",
        }
    }

    async fn has_failure_entry(&self, v: &Version) -> Result<bool, AgentError> {
        for step in Step::ALL {
            let key = self
                .schema()
                .status(step, jio_common::keys::Outcome::Failure, v, self.host());
            if self.store.get(&key).await?.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The daemon: passes woken by watches on the desired version and the enable
    /// keys, with a slow resync, retry timers and the idle health check.
    pub async fn run(&mut self) -> Result<(), AgentError> {
        let mut watches = self.open_watches().await;
        let mut store_backoff = Duration::from_millis(200);
        let mut next_health = tokio::time::Instant::now() + self.cfg.health_interval;
        // The last error logged: a failing pass is logged once, not on every retry.
        let mut last_error: Option<String> = None;
        loop {
            if self.stopping() {
                return Ok(());
            }
            let mut wait = self.cfg.resync_interval;
            let result = self.pass().await;
            if result.is_ok()
                && let Some(e) = last_error.take()
            {
                tracing::info!(was = %e, "passes work again");
            }
            match result {
                Ok(PassResult::Idle(Decision::Backoff { until, .. })) => {
                    store_backoff = Duration::from_millis(200);
                    wait = wait.min(Duration::from_secs(until.saturating_sub(unix_now()).max(1)));
                }
                Ok(PassResult::Reported) | Ok(PassResult::Ran { .. }) | Ok(PassResult::Raced) => {
                    store_backoff = Duration::from_millis(200);
                    continue; // look again at once
                }
                Ok(PassResult::Idle(d)) => {
                    store_backoff = Duration::from_millis(200);
                    if d == Decision::UpToDate
                        && !self.cfg.health_interval.is_zero()
                        && tokio::time::Instant::now() >= next_health
                    {
                        if let Err(e) = self.health_check().await {
                            tracing::warn!(error = %e, "health check could not finish");
                        }
                        next_health = tokio::time::Instant::now() + self.cfg.health_interval;
                        continue;
                    }
                    if d == Decision::UpToDate && !self.cfg.health_interval.is_zero() {
                        wait = wait.min(next_health.saturating_duration_since(tokio::time::Instant::now()));
                    }
                }
                // Nothing read from the store, and no local fault, ends the daemon: it
                // says what failed (once), and tries again with backoff.
                Err(e) => {
                    let msg = e.to_string();
                    if last_error.as_ref() != Some(&msg) {
                        if e.store_unavailable() {
                            tracing::warn!(error = %e, "store unreachable; retrying");
                        } else {
                            tracing::error!(error = %e, "the pass failed; retrying with backoff");
                        }
                        last_error = Some(msg);
                    }
                    self.last_decision = None;
                    wait = store_backoff;
                    store_backoff = (store_backoff * 2).min(Duration::from_secs(30));
                }
            }
            tokio::select! {
                ev = watches.next() => {
                    match ev {
                        Some(Ok(_)) => {}
                        Some(Err(e)) => {
                            tracing::warn!(error = %e, "watch failed; reopening");
                            tokio::time::sleep(Duration::from_millis(500)).await;
                            watches = self.open_watches().await;
                        }
                        None => watches = self.open_watches().await,
                    }
                    // Drain whatever else already arrived: one pass covers it all.
                    while let Some(Some(Ok(_))) = futures_util::FutureExt::now_or_never(watches.next()) {}
                }
                _ = tokio::time::sleep(wait) => {}
                _ = self.shutdown.changed() => {}
            }
        }
    }

    async fn open_watches(&self) -> futures_util::stream::SelectAll<jio_common::store::WatchStream> {
        let mut delay = Duration::from_millis(200);
        loop {
            let mut all = futures_util::stream::SelectAll::new();
            let mut failed = None;
            for key in self.watched_keys() {
                match self.store.watch(&key, 0).await {
                    Ok(w) => all.push(w),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            match failed {
                None => return all,
                Some(e) => {
                    tracing::warn!(error = %e, "cannot open watches; retrying");
                    let mut stop = self.shutdown.clone();
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = stop.changed() => return all,
                    }
                    delay = (delay * 2).min(Duration::from_secs(30));
                }
            }
        }
    }
}

/// Runs `agent` as a daemon: its liveness record, then the reconcile loop until the
/// shutdown signal; the lease is revoked at the end. `jio-agent run` and agents
/// embedded in another program (benchmarks) both go through here.
pub async fn serve(mut agent: Agent) -> Result<(), AgentError> {
    // Learn once where this host is listed, so that reports during a rollout do not
    // list the whole fleet's versions each time.
    match report::running_versions_of(&agent.store, agent.schema(), agent.host()).await {
        Ok(v) => agent.running_versions = Some(v),
        Err(e) => tracing::debug!(error = %e, "cannot list running versions yet; the first report will"),
    }
    let local = state::read_local_version(&agent.cfg.version_file).ok().flatten();
    agent.liveness = Some(Liveness::start(
        agent.store.clone(),
        agent.cfg.schema.agent(&agent.cfg.hostname),
        agent.cfg.lease_ttl,
        AgentState::Idle,
        local,
    ));
    let res = agent.run().await;
    if let Some(l) = agent.liveness.take() {
        l.stop().await;
    }
    res
}

fn log_decision(d: &Decision, obs: &Observation) {
    let local = obs.local.as_ref().map(Version::as_str).unwrap_or("none");
    match d {
        Decision::NoDesiredVersion => tracing::info!(local, "no desired version is set"),
        Decision::UpToDate => tracing::info!(local, "up to date"),
        Decision::Disabled { version, level } => {
            tracing::info!(desired = %version, local, decided_by = level.as_str(), "update pending, not enabled")
        }
        Decision::Backoff { version, until } => tracing::info!(
            desired = %version,
            local,
            retry_in_s = until.saturating_sub(obs.now),
            "last attempt failed; waiting before retrying"
        ),
        Decision::Upgrade { version, why } => {
            tracing::info!(desired = %version, local, reason = ?why, "upgrade allowed")
        }
        Decision::Report => tracing::info!("results waiting to be reported"),
        Decision::Blocked { reason } => tracing::error!(
            local,
            %reason,
            "blocked by an invalid value in the store: nothing starts until it is fixed (the agent keeps watching)"
        ),
    }
}

/// Replaces `{log_jsonl}` and `{validation_dir}` in a configured command.
fn substitute(argv: &[String], jsonl: &Path, validation_dir: &Path) -> Vec<String> {
    argv.iter()
        .map(|a| {
            a.replace("{log_jsonl}", &jsonl.display().to_string())
                .replace("{validation_dir}", &validation_dir.display().to_string())
        })
        .collect()
}

fn prune_runs(runs: &Path) {
    let Ok(rd) = std::fs::read_dir(runs) else { return };
    let mut dirs: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    if dirs.len() <= KEEP_RUNS {
        return;
    }
    dirs.sort();
    for d in &dirs[..dirs.len() - KEEP_RUNS] {
        let _ = std::fs::remove_dir_all(d);
    }
}
