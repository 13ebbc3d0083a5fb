//! One pass of the agent: observe (`observe`), decide (`decide`, pure), act at most
//! once, report each step (`ledger`). The steps run through an injected
//! `StepRunner` and Unix time comes from an injected clock; the daemon's loop that
//! calls `pass` is in `daemon`.

use std::sync::Arc;

use jio_common::clock::{DynClock, SystemClock};
use jio_common::fleet::ROLLOUT_LOCK;
use jio_common::keys::{Outcome as KeyOutcome, Step};
use jio_common::names::Version;
use jio_common::store::{Compare, DynStore, Op, StoreError};
use jio_common::values::{AgentRecord, AgentState};
use tokio::sync::watch;

use crate::config::Config;
use crate::decide::{self, Decision, Health, Observation, Why};
pub use crate::error::AgentError;
use crate::ledger::{Ledger, LedgerSetup, RunClose, RunEnd};
use crate::liveness::Liveness;
use crate::observe::{self, Memory, Subject};
use crate::pass::PassResult;
use crate::runner::{self, Outcome, ProcessGroup};
use crate::state::{Journal, LastRun, RunResult, RunStart};
use crate::steps::{CommandSteps, StepCtx, StepRunner};
use crate::{results, rundir};

mod commands;
mod packages;
mod reboot;
mod reboot_command;
mod tasks;

/// One host's agent.
pub struct Agent {
    cfg: Config,
    store: DynStore,
    steps: Arc<dyn StepRunner>,
    clock: DynClock,
    ledger: Ledger,
    liveness: Option<Liveness>,
    shutdown: watch::Receiver<bool>,
    last_decision: Option<Decision>,
    health: Health,
    /// This host's run marker may be in the store and no run is going on.
    run_marker: bool,
    /// Commands a killed agent left running, to stop before anything else.
    orphan: Option<ProcessGroup>,
    /// The rollout current when the run going on started (its id, for its result).
    run_rollout: Option<String>,
    /// When the run going on started, and the enable keys' mod revisions it was
    /// decided on (for the journal's record of how it ended).
    run_begun: (u64, [jio_common::store::Revision; 3]),
    /// The Hiera data was read for the run about to configure (while its start
    /// transaction was in flight): the configure step need not read it again.
    hiera_read: bool,
    /// What the Hiera data file was last written from (kept in the state directory).
    hiera_seen: Arc<crate::hiera::Memo>,
    /// The active rollout's rules, read once per rollout.
    rollout_cache: observe::RolloutCache,
    /// The keys of the last read, kept up to date by the daemon's watches.
    view: observe::View,
    /// The run this pass ended was ended by a transaction the view took in.
    view_took_end: bool,
    /// The services' task files, as read at the start of the pass.
    services: crate::services::Services,
    /// The catalog last published (`None`: nothing published by this agent yet).
    published: Option<jio_common::phase::Catalog>,
    /// The last note logged about fleet commands (logged again only when it changes).
    command_note: Option<String>,
    /// What the daemon exports to Prometheus.
    metrics: crate::metrics::Metrics,
    /// Runs may end with a reboot (the daemon; one-shot runs never reboot).
    reboots: bool,
    /// The rollout's `reboot` rule for the run going on (none: the agent's own).
    run_reboot: Option<jio_common::rules::RebootPolicy>,
    /// The run going on is under maintenance windows (its reboot needs a permit).
    run_windowed: bool,
    /// True while a reload waits: the daemon ends between passes, never in a run.
    reload: Option<watch::Receiver<bool>>,
    /// The package snapshot of the run going on.
    run_packages: crate::packages::PackageStep,
    /// dpkg's status file as last read (size, modification time).
    dpkg_stamp: Option<(u64, std::time::SystemTime)>,
    /// A package set its result refers to that could not be stored yet.
    unstored_set: Option<(String, jio_common::packages::PackageSet)>,
}

impl Agent {
    /// Loads the journal and turns a run that a dead agent left in progress into an
    /// interrupted one (it will be run again). The commands it left running are
    /// stopped by the first pass, before anything else happens.
    pub fn new(cfg: Config, store: DynStore, shutdown: watch::Receiver<bool>) -> Result<Agent, AgentError> {
        let mut agent = Agent::new_readonly(cfg, store, shutdown)?;
        let journal = &mut agent.ledger.journal;
        // A fleet command a dead agent left running: stopped first; the first pass
        // reports it interrupted (or runs it again, if the command allows).
        if let Some(child) = journal.commands.in_progress.as_ref().and_then(|r| r.child) {
            agent.orphan = Some(child);
        }
        if let Some(run) = journal.in_progress.take() {
            agent.orphan = run.child;
            tracing::warn!(
                version = %run.version,
                started = run.started,
                pid = run.pid,
                "found a run that never finished (the agent stopped during it); it counts as interrupted and will run again"
            );
            journal.last_run = Some(LastRun {
                version: run.version,
                started: run.started,
                finished: agent.clock.unix_now(),
                result: RunResult::Interrupted,
                step: "unknown".into(),
                reason: Some("the agent stopped during the run".into()),
                run_dir: run.run_dir,
            });
            agent.ledger.save();
        }
        Ok(agent)
    }

    /// For `status`: reads the journal without recovering or changing anything.
    pub fn new_readonly(
        cfg: Config,
        store: DynStore,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Agent, AgentError> {
        let clock: DynClock = Arc::new(SystemClock);
        let ledger = Ledger::load(LedgerSetup {
            state_dir: cfg.state_dir.clone(),
            version_file: cfg.version_file.clone(),
            store: store.clone(),
            schema: cfg.schema.clone(),
            host: cfg.hostname.clone(),
            clock: clock.clone(),
            logs: cfg.swift.is_some(),
            retry_interval: cfg.retry_interval,
        })?;
        let metrics = crate::metrics::Metrics::new(cfg.hostname.as_str(), cfg.role.as_str(), &cfg.state_dir);
        // What was kept is trusted only for the same store, prefix and file.
        let hiera_seen = Arc::new(crate::hiera::Memo::kept_in(
            &cfg.state_dir,
            &crate::hiera::source(&cfg.store.to_string(), &cfg.schema, cfg.hiera_file.as_deref()),
        ));
        Ok(Agent {
            metrics,
            reload: None,
            run_packages: Default::default(),
            dpkg_stamp: None,
            unstored_set: None,
            steps: Arc::new(CommandSteps::from_config(&cfg)),
            cfg,
            store,
            clock,
            ledger,
            liveness: None,
            shutdown,
            last_decision: None,
            health: Health::Good,
            run_marker: true,
            orphan: None,
            run_rollout: None,
            run_begun: (0, [0; 3]),
            hiera_read: false,
            hiera_seen,
            rollout_cache: None,
            view: observe::View::default(),
            view_took_end: false,
            services: crate::services::Services::default(),
            published: None,
            command_note: None,
            reboots: false,
            run_reboot: None,
            run_windowed: false,
        })
    }

    /// Runs the steps with `steps` instead of the configured commands.
    pub fn with_steps(mut self, steps: Arc<dyn StepRunner>) -> Agent {
        self.steps = steps;
        self
    }

    /// Takes Unix time from `clock` (the ledger's report times too).
    pub fn with_clock(mut self, clock: DynClock) -> Agent {
        self.ledger.set_clock(clock.clone());
        self.clock = clock;
        self
    }

    /// Wakes the Swift uploader when a run log is queued.
    pub fn set_upload_wake(&mut self, wake: Arc<tokio::sync::Notify>) {
        self.ledger.set_upload_wake(wake);
    }

    /// Keeps the host's liveness record through `l` (runs start fenced in it).
    /// Lets runs end with a reboot (the daemon's runs).
    pub fn set_reboots(&mut self, on: bool) {
        self.reboots = on;
    }

    /// A reboot is journaled: the host is rebooting (or waiting to).
    pub fn rebooting(&self) -> bool {
        self.ledger.journal.reboot.is_some()
    }

    pub fn set_liveness(&mut self, l: Liveness) {
        self.liveness = Some(l);
    }

    /// The liveness record's keeper, to stop it (revoking the lease).
    pub fn take_liveness(&mut self) -> Option<Liveness> {
        self.liveness.take()
    }

    /// Ends the daemon's loop between passes once `reload` turns true (SIGHUP with
    /// a changed configuration): a run going on finishes first.
    pub fn set_reload(&mut self, reload: watch::Receiver<bool>) {
        self.reload = Some(reload);
    }

    /// A reload is asked for: the daemon ends before its next pass.
    pub fn reload_asked(&self) -> bool {
        self.reload.as_ref().is_some_and(|r| *r.borrow())
    }

    /// Wakes when a reload is asked for (never, without one to follow).
    pub async fn reload_changed(&self) {
        let Some(mut r) = self.reload.clone() else {
            return std::future::pending().await;
        };
        // Asked for already (since the last look): at once.
        if *r.borrow_and_update() {
            return;
        }
        if r.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Records into `m` (the daemon's, already served) from now on.
    pub fn set_metrics(&mut self, m: crate::metrics::Metrics) {
        self.metrics = m;
    }

    /// What the daemon exports to Prometheus (shared with the metrics' server).
    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.metrics
    }

    pub fn journal(&self) -> &Journal {
        &self.ledger.journal
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub(crate) fn store(&self) -> &DynStore {
        &self.store
    }

    pub(crate) fn shutdown(&self) -> &watch::Receiver<bool> {
        &self.shutdown
    }

    pub(crate) fn clock_now(&self) -> u64 {
        self.clock.unix_now()
    }

    pub(crate) fn stopping(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// Forgets the last decision, so that the next one is logged again.
    pub(crate) fn forget_decision(&mut self) {
        self.last_decision = None;
    }

    pub(crate) fn subject(&self) -> Subject<'_> {
        Subject {
            schema: &self.cfg.schema,
            host: &self.cfg.hostname,
            role: &self.cfg.role,
        }
    }

    /// Reads what a decision needs (`health_due`: the daemon's health timer).
    pub async fn observe(&mut self, health_due: bool) -> Result<Observation, AgentError> {
        self.observe_with(health_due, true).await
    }

    /// Whether the active rollout is composable: then its phase grants are watched
    /// too (`Subject::steps_watch`).
    pub fn watches_steps(&self) -> bool {
        self.rollout_cache
            .as_ref()
            .is_some_and(|(_, r)| r.compose.is_some())
    }

    /// One event of the watches on `Subject::watched_keys` (the daemon's, or those
    /// of a program running its own loop), for the view a pass may use.
    pub fn watched(&mut self, ev: &jio_common::store::WatchEvent) {
        self.view.apply(ev);
    }

    /// The watches were reopened (events may have been missed): the next pass reads.
    pub fn watches_reopened(&mut self) {
        self.view.invalidate();
    }

    /// `observe`, from the view unless `read` is set or the view is unusable, and
    /// the inbox's commands.
    async fn observe_with(&mut self, health_due: bool, read: bool) -> Result<Observation, AgentError> {
        let mut cache = self.rollout_cache.take();
        let mem = Memory {
            journal: &self.ledger.journal,
            health: self.health,
            health_due,
            version_file: &self.cfg.version_file,
            retry_interval: self.cfg.retry_interval,
            now: self.clock.unix_now(),
            rollout_cache: &mut cache,
            services: &self.services,
        };
        let subject = Subject {
            schema: &self.cfg.schema,
            host: &self.cfg.hostname,
            role: &self.cfg.role,
        };
        let obs = observe::observe(&self.store, subject, mem, &mut self.view, read).await;
        self.rollout_cache = cache;
        let mut obs = obs?;
        self.read_commands(&mut obs).await?;
        Ok(obs)
    }

    /// One pass: stop a killed agent's orphans, clear a stale run marker, report what
    /// is pending, or observe, decide and act.
    pub async fn pass(&mut self, health_due: bool) -> Result<PassResult, AgentError> {
        if let Some(child) = self.orphan.take()
            && runner::stop_orphan(child).await
        {
            tracing::warn!(
                pgid = child.pgid,
                "stopped the commands a killed agent left running"
            );
        }
        // Whether this host's `/running/versions` entries are where the state
        // directory says, checked once after the start (not at a run's end).
        self.ledger.check_listed().await;
        // A run that ends with a reboot keeps its slot (its marker) until the host
        // is back and validated: nothing else happens meanwhile.
        if let Some(w) = self.ledger.journal.reboot.clone() {
            if !self.ledger.journal.unreported.is_empty() {
                self.ledger.flush().await?;
            }
            return self.pass_reboot(w).await;
        }
        // A run's report still in the journal keeps its marker: the host holds its
        // slot until the store has the run's outcome (a failure must stop the
        // rollout before another host is admitted in its place).
        if !self.ledger.journal.unreported.is_empty() {
            self.ledger.flush().await?;
            self.clear_run_marker().await?;
            return Ok(PassResult::Reported);
        }
        if !self.ledger.journal.commands.unreported.is_empty() {
            self.flush_commands(false).await?;
            self.clear_run_marker().await?;
            return Ok(PassResult::Reported);
        }
        self.clear_run_marker().await?;
        // A pass that may check health reads the lock and the result afresh (the
        // view does not follow them); so does a pass after one that wrote or failed.
        let read =
            health_due || self.health != Health::Good || !self.view.younger_than(self.cfg.resync_interval);
        // A pass that reads the store checks the published catalog too.
        self.load_services(read || !self.view.usable()).await?;
        let result = match self.observe_with(health_due, read).await {
            Ok(obs) => self.act(&obs).await,
            Err(e) => Err(e),
        };
        // After a run ended by one transaction the view took in, the view is as
        // good as a read (the watches bring the rest); anything else that wrote
        // or failed reads again.
        let took_end = std::mem::take(&mut self.view_took_end);
        let kept = matches!(result, Ok(PassResult::Idle(_)))
            || (took_end && matches!(result, Ok(PassResult::Ran { .. })));
        if !kept {
            self.view.invalidate();
        }
        result
    }

    /// Decides on `obs` and acts. A run starts only if nothing `obs` read has changed
    /// since: its start is fenced on the revisions `obs` holds (`Raced` otherwise).
    pub async fn act(&mut self, obs: &Observation) -> Result<PassResult, AgentError> {
        let decision = decide::decide(obs);
        self.note_commands(obs);
        if matches!(decision, Decision::Command { .. } | Decision::RecoverCommand) {
            self.last_decision = None;
            return self.command(decision, obs).await;
        }
        self.metrics.decided(obs, &decision);
        if self.last_decision.as_ref() != Some(&decision) {
            log_decision(&decision, obs);
            self.last_decision = Some(decision.clone());
        }
        let result = match decision {
            Decision::Upgrade { version, why } => self.upgrade(version, why, obs).await?,
            Decision::Tasks {
                version,
                phase,
                services,
            } => self.tasks(version, phase, services, obs).await?,
            Decision::HealthCheck { version } => self.check_health(version, obs, false).await?,
            Decision::SoakCheck { version } => self.check_health(version, obs, true).await?,
            Decision::Repair { version } => self.repair(version, obs).await?,
            Decision::Report => {
                self.ledger.flush().await?;
                PassResult::Reported
            }
            other => {
                self.follow_packages(obs).await;
                let state = decide::idle_state(&other, obs);
                self.set_record(state, obs.local.clone().or(obs.desired.clone()));
                PassResult::Idle(other)
            }
        };
        // After a run, and after each held health check (one line per check that
        // did not run), the next decision is logged again.
        if !matches!(result, PassResult::Idle(_) | PassResult::Reported)
            || matches!(result, PassResult::Idle(Decision::HealthHeld { .. }))
        {
            self.last_decision = None;
        }
        Ok(result)
    }

    fn set_record(&self, state: AgentState, version: Option<Version>) {
        if let Some(l) = &self.liveness {
            l.set(state, version);
        }
    }

    /// Writes the record that says a run starts (and the run marker), fenced on
    /// `compares`; `false` when the run must not start.
    async fn begin(
        &mut self,
        state: AgentState,
        version: &Version,
        compares: Vec<Compare>,
    ) -> Result<bool, AgentError> {
        self.begin_with(state, Some(version.clone()), compares, Vec::new())
            .await
    }

    /// `begin`, writing `ops` too in the same transaction.
    async fn begin_with(
        &mut self,
        state: AgentState,
        version: Option<Version>,
        compares: Vec<Compare>,
        ops: Vec<Op>,
    ) -> Result<bool, AgentError> {
        let Some(l) = &self.liveness else {
            // Without a liveness record (tests of a bare pass) there is nothing to fence.
            return Ok(true);
        };
        // The run marker outlives a frozen or killed agent (no lease): the host keeps
        // its slot until this agent has seen the run end and removed it.
        let record = AgentRecord {
            state,
            version: version.clone(),
            since: self.clock.unix_now(),
            pid: std::process::id(),
            until: None,
        };
        let marker_key = self.cfg.schema.run(&self.cfg.hostname);
        let marker = Op::put(
            marker_key.clone(),
            serde_json::to_string(&record).unwrap_or_default(),
        );
        // Where a compare that a key is absent needs the right to write it (Consul),
        // those keys are read after the write instead: the marker is in the store
        // before the read, so whoever writes one of them after the read finds the
        // host in flight, as after a fenced start on etcd.
        // A key this transaction writes itself is one the agent may write: its
        // compare stays in the transaction (read after, it would find its own write).
        let written: Vec<jio_common::keys::Key> = ops
            .iter()
            .filter_map(|op| match op {
                Op::Put { key, .. } | Op::Delete(key) => Some(key.clone()),
                Op::DeletePrefix(_) => None,
            })
            .collect();
        let (compares, absent): (Vec<Compare>, Vec<jio_common::keys::Key>) =
            if self.store.absent_compare_needs_write() {
                let (absent, kept): (Vec<Compare>, Vec<Compare>) =
                    compares.into_iter().partition(|c| match c {
                        Compare::Absent(k) | Compare::ModRevision(k, 0) => !written.contains(k),
                        _ => false,
                    });
                let keys = absent
                    .into_iter()
                    .filter_map(|c| match c {
                        Compare::Absent(k) | Compare::ModRevision(k, _) => Some(k),
                        Compare::Value(..) => None,
                    })
                    .collect();
                (kept, keys)
            } else {
                (compares, Vec::new())
            };
        let before = l.current();
        let mut also = vec![marker];
        also.extend(ops);
        let started = match l.commit(state, version, compares, also).await {
            Ok(committed) => committed.is_some(),
            Err(e) => {
                // Sent but unconfirmed (`Ambiguous`): the marker may be in the store,
                // so the next pass removes it (nothing runs; the liveness keeper
                // rewrites the record as it is here).
                if matches!(e, StoreError::Ambiguous { .. }) {
                    self.run_marker = true;
                }
                return Err(e.into());
            }
        };
        self.run_marker |= started;
        if started && !absent.is_empty() {
            let still_absent = self.store.get_many(&absent).await;
            if !matches!(&still_absent, Ok(kvs) if kvs.iter().all(Option::is_none)) {
                // Written since the decision read it absent (or unknown): no run.
                if let Some(l) = &self.liveness {
                    l.set(before.0, before.1);
                }
                if self.store.delete(&marker_key).await.is_ok() {
                    self.run_marker = false;
                }
                // What the start wrote besides goes too (a fleet command's start).
                for k in &written {
                    if let Err(e) = self.store.delete(k).await {
                        tracing::warn!(key = %k, error = %e, "cannot take back what a start that must not run wrote");
                    }
                }
                return match still_absent {
                    Err(e) => Err(e.into()),
                    Ok(_) => Ok(false),
                };
            }
        }
        Ok(started)
    }

    /// Removes the run marker once no run is going on (after a run, and at start-up:
    /// a killed agent's marker stays until its successor has stopped the orphans).
    /// Read first: only this agent writes its marker, and a delete is a write to
    /// every member even when the key is absent (a fleet starting at once would
    /// queue one per agent).
    async fn clear_run_marker(&mut self) -> Result<(), AgentError> {
        if self.run_marker && self.ledger.journal.reboot.is_none() {
            let key = self.cfg.schema.run(&self.cfg.hostname);
            if self.store.get(&key).await?.is_some() {
                self.store.delete(&key).await?;
            }
            self.run_marker = false;
        }
        Ok(())
    }

    /// Runs one step through the step runner, recording each command it starts in
    /// the journal (so that a successor can stop it should this agent die).
    async fn step(&mut self, step: Step, version: &Version, run_dir: &std::path::Path) -> Outcome {
        self.step_coded(step, version, run_dir).await.0
    }

    /// Before Puppet may run: the Hiera data file as the store has it now (one
    /// listing of `/active_roles/`). Read here rather than watched, so that a
    /// fleet's registrations cost no event per host per registration; a failure
    /// leaves the file as it was, said.
    pub(crate) async fn refresh_hiera(&self) {
        self.hiera_reader().await;
    }

    /// `refresh_hiera` as a future that borrows nothing of the agent, to overlap
    /// a start transaction.
    fn hiera_reader(&self) -> impl std::future::Future<Output = ()> + use<> {
        let (store, schema, path, seen) = (
            self.store.clone(),
            self.cfg.schema.clone(),
            self.cfg.hiera_file.clone(),
            self.hiera_seen.clone(),
        );
        async move {
            if let Some(path) = path
                && let Err(e) = crate::hiera::refresh(&store, &schema, &path, &seen).await
            {
                tracing::warn!(error = %e, "cannot read /active_roles/ for the hiera data; Puppet sees the file as it was");
            }
        }
    }

    /// `step`, and the exit code of the last command it ran.
    async fn step_coded(
        &mut self,
        step: Step,
        version: &Version,
        run_dir: &std::path::Path,
    ) -> (Outcome, Option<i32>) {
        if step == Step::Configured && !std::mem::take(&mut self.hiera_read) {
            self.refresh_hiera().await;
        }
        let steps = self.steps.clone();
        let ledger = &mut self.ledger;
        let mut on_spawn = |group: ProcessGroup| {
            if let Some(run) = ledger.journal.in_progress.as_mut() {
                run.child = Some(group);
                ledger.save();
            }
        };
        let mut ctx = StepCtx {
            version,
            host: &self.cfg.hostname,
            role: &self.cfg.role,
            run_dir,
            shutdown: &mut self.shutdown,
            on_spawn: &mut on_spawn,
            exit_code: None,
            packages: &self.run_packages,
        };
        let began = tokio::time::Instant::now();
        let (name, outcome) = match step {
            Step::Configured => ("configure", steps.configure(&mut ctx).await),
            Step::Validated => ("validate", steps.validate(&mut ctx).await),
        };
        self.metrics.step(name, began.elapsed());
        (outcome, ctx.exit_code)
    }

    /// One upgrade to `version`: configure, validate, report each step. Whatever goes
    /// wrong on the host (a command, a file that cannot be written) is a failed run
    /// with its reason, reported like any other.
    async fn upgrade(
        &mut self,
        version: Version,
        why: Why,
        obs: &Observation,
    ) -> Result<PassResult, AgentError> {
        let fence = self.subject().start_fence(obs);
        self.run_packages = self.package_step(&version, obs);
        // The start is fenced on `/rollouts/current`: this is the run's rollout.
        self.run_rollout = obs.rollout.id.clone();
        self.run_reboot = obs.rollout.reboot;
        self.run_windowed = obs.rollout.windowed;
        // The Hiera data is read while the start transaction is in flight (read
        // for nothing when the start loses its race: the file is current anyway).
        let hiera = self.hiera_reader();
        let (began, ()) = tokio::join!(self.begin(AgentState::Upgrading, &version, fence), hiera);
        if !began? {
            tracing::info!(%version, "the desired version, an enable key, a hold, the current rollout or the package snapshot template changed before the run could start; deciding again");
            return Ok(PassResult::Raced);
        }
        self.hiera_read = true;
        let started = self.clock.unix_now();
        self.run_begun = (started, obs.gate_revisions);
        let (run_dir, step, outcome, ended) = match self.prepare_run(&version, started) {
            Ok(run_dir) => {
                tracing::info!(%version, reason = %why, run_dir = %run_dir.display(), "upgrade starts");
                self.packages_before(&run_dir);
                let (step, outcome, ended) = self.configure_and_validate(&version, &run_dir).await;
                (run_dir, step, outcome, ended)
            }
            Err((run_dir, reason)) => {
                // Nothing ran: the configure step failed before its first command.
                self.hiera_read = false;
                let failed = Outcome::Failure(reason);
                let ended = self.clock.unix_now();
                let result = self.run_result(&version, Step::Configured, &failed, None, &run_dir, ended);
                self.report_end(
                    &version,
                    Step::Configured,
                    &failed,
                    &run_dir,
                    result,
                    false,
                    ended,
                )
                .await;
                (run_dir, Step::Configured, failed, ended)
            }
        };
        if let Some(w) = self.ledger.journal.reboot.clone() {
            return self.pass_reboot(w).await;
        }
        let result = self.record(&version, ended, step, &outcome, &run_dir);
        Ok(PassResult::Ran { version, result })
    }

    /// The host's result of the run to `version` that ended at `ended` with
    /// `outcome` at `step` (reported with that step).
    fn run_result(
        &self,
        version: &Version,
        step: Step,
        outcome: &Outcome,
        exit_code: Option<i32>,
        run_dir: &std::path::Path,
        ended: u64,
    ) -> jio_common::values::HostResult {
        let detail = match outcome {
            Outcome::Failure(_) => results::detail_from(run_dir, step),
            _ => None,
        };
        let end = results::RunEnd {
            version,
            step,
            outcome,
            exit_code,
            detail,
            run_dir,
            at: ended,
            rollout: self.run_rollout.clone(),
        };
        let attempt = results::attempt(self.ledger.journal.failure.as_ref(), version);
        results::of_run(&end, attempt, self.cfg.retry_interval)
    }

    /// Records how a run ended (pure transitions of the journal, then one save)
    /// unless its last report already did, and says so in the log and the liveness
    /// record.
    fn record(
        &mut self,
        version: &Version,
        ended: u64,
        step: Step,
        outcome: &Outcome,
        run_dir: &std::path::Path,
    ) -> RunResult {
        // A run still in progress here was not closed by a report (it was
        // interrupted); `prepare_run` failing left none, and its report closed it.
        if self.ledger.journal.in_progress.is_some() {
            let close = self.run_close(version, step, run_dir, ended);
            close.apply(&mut self.ledger.journal, outcome);
            self.ledger.save();
        }
        let (result, reason) = crate::ledger::ended_as(outcome);
        match result {
            RunResult::Success => {
                tracing::info!(%version, "upgrade succeeded");
                self.health = Health::Good;
                self.set_record(AgentState::Idle, Some(version.clone()));
            }
            RunResult::Failed => {
                let reason = reason.as_deref().unwrap_or("");
                tracing::error!(%version, step = step.as_str(), reason, "upgrade failed");
                self.set_record(AgentState::Failed, Some(version.clone()));
            }
            RunResult::Interrupted => tracing::warn!(%version, "upgrade interrupted; it will run again"),
        }
        result
    }

    /// How the journal closes the run going on, which ended at `ended` after `step`.
    fn run_close(&self, version: &Version, step: Step, run_dir: &std::path::Path, ended: u64) -> RunClose {
        let (started, gate_revisions) = self.run_begun;
        RunClose {
            version: version.clone(),
            started,
            ended,
            step,
            run_dir: run_dir.to_path_buf(),
            gate_revisions,
            previous: self.ledger.journal.failure.clone(),
            phase: None,
        }
    }

    /// Creates the run's directory and records the run in the journal. Without
    /// either nothing may run (a killed agent's run could not be found again): the
    /// error is the directory and the reason.
    fn prepare_run(
        &mut self,
        version: &Version,
        started: u64,
    ) -> Result<std::path::PathBuf, (std::path::PathBuf, String)> {
        let run_dir = rundir::create(&self.cfg.state_dir, version, started)?;
        let j = &mut self.ledger.journal;
        j.in_progress = Some(RunStart {
            version: version.clone(),
            started,
            pid: std::process::id(),
            run_dir: run_dir.clone(),
            child: None,
        });
        if let Err(e) = j.save(&self.cfg.state_dir) {
            j.in_progress = None;
            return Err((run_dir, format!("the journal could not be written: {e}")));
        }
        Ok(run_dir)
    }

    /// The configure step, then (when it succeeded) the validation. The run's last
    /// report carries its result and ends it: one transaction writes the status
    /// entry, the result, the running version, the liveness record and the run
    /// marker's removal. A configure step that succeeded is not reported on its own
    /// when the validation follows at once (the validated report's log covers both);
    /// it is when the run stops between the two. Returns the last step that ran,
    /// its outcome and when the run ended.
    async fn configure_and_validate(
        &mut self,
        version: &Version,
        run_dir: &std::path::Path,
    ) -> (Step, Outcome, u64) {
        let (configured, code) = self.step_coded(Step::Configured, version, run_dir).await;
        if configured == Outcome::Interrupted {
            return (Step::Configured, configured, self.clock.unix_now());
        }
        let ended = self.clock.unix_now();
        if !configured.ok() {
            let result = self.run_result(version, Step::Configured, &configured, code, run_dir, ended);
            self.report_end(
                version,
                Step::Configured,
                &configured,
                run_dir,
                result,
                false,
                ended,
            )
            .await;
            return (Step::Configured, configured, ended);
        }
        if self.stopping() {
            self.ledger
                .report(version, Step::Configured, &configured, run_dir, None)
                .await;
            return (Step::Configured, Outcome::Interrupted, self.clock.unix_now());
        }
        let (mut validated, code) = self.step_coded(Step::Validated, version, run_dir).await;
        let ended = self.clock.unix_now();
        if validated == Outcome::Interrupted {
            self.ledger
                .report(version, Step::Configured, &configured, run_dir, None)
                .await;
        } else {
            if validated.ok() {
                match self.reboot_wanted(run_dir).await.and_then(|why| match why {
                    Some(why) => self.journal_reboot(version, run_dir, why).map(|()| true),
                    None => Ok(false),
                }) {
                    Ok(true) => {
                        // Ends after the boot (`pass_reboot`); the configure step's
                        // report goes now.
                        self.ledger
                            .report(version, Step::Configured, &configured, run_dir, None)
                            .await;
                        return (Step::Validated, validated, ended);
                    }
                    Ok(false) => {}
                    Err(reason) => validated = Outcome::Failure(reason),
                }
            }
            let mut result = self.run_result(version, Step::Validated, &validated, code, run_dir, ended);
            self.attach_packages(&mut result, run_dir).await;
            if let Some(reason) = self
                .report_end(version, Step::Validated, &validated, run_dir, result, true, ended)
                .await
            {
                validated = Outcome::Failure(reason);
            }
        }
        (Step::Validated, validated, ended)
    }

    /// Reports a run's last step with its `result`, ending the run in the same
    /// transaction (see `configure_and_validate`). Returns why a validated success
    /// turned into a failure, if it did.
    #[allow(clippy::too_many_arguments)]
    async fn report_end(
        &mut self,
        version: &Version,
        step: Step,
        outcome: &Outcome,
        run_dir: &std::path::Path,
        result: jio_common::values::HostResult,
        whole_run: bool,
        ended: u64,
    ) -> Option<String> {
        let end = self.liveness.as_ref().map(|liveness| RunEnd {
            liveness,
            marker: self.cfg.schema.run(&self.cfg.hostname),
            whole_run,
        });
        let close = self.run_close(version, step, run_dir, ended);
        let reported = self
            .ledger
            .report_ending(
                version,
                step,
                outcome,
                run_dir,
                Some(result),
                end.as_ref(),
                Some(&close),
            )
            .await;
        if let Some((revision, writes)) = &reported.ended {
            self.run_marker = false;
            // The view takes the run's own writes (its result): no read after it.
            self.view_took_end = self.view.wrote(writes, *revision);
        }
        reported.failed
    }

    /// The idle health check: validate the local version. A check is a run like any
    /// other: it holds the host's slot, and it starts fenced on what it decided on
    /// and on the rollout lock being free.
    ///
    /// The soak's check (`soak`) starts whoever holds the rollout lock, and its
    /// failure is the version's failed validation, reported with the run result and
    /// never repaired. A check that passes records `checked_at` in the run result.
    async fn check_health(
        &mut self,
        version: Version,
        obs: &Observation,
        soak: bool,
    ) -> Result<PassResult, AgentError> {
        let (skipped, fence) = if soak {
            ("the soak's health check skipped", self.subject().soak_fence(obs))
        } else {
            ("health check skipped", self.subject().health_fence(obs))
        };
        let run_dir = match self
            .health_run(&version, AgentState::Checking, fence, skipped)
            .await?
        {
            Ok(d) => d,
            Err(instead) => return Ok(instead),
        };
        if soak {
            tracing::info!(%version, run_dir = %run_dir.display(), "health check of the min_healthy_time soak starts");
        }
        let checked = self.step(Step::Validated, &version, &run_dir).await;
        if checked == Outcome::Interrupted {
            return Ok(PassResult::Checked { version, ok: false });
        }
        self.health = self.health.after_check(&checked);
        let ok = checked.ok();
        if ok {
            self.mark_checked(&version).await?;
            if soak {
                tracing::info!(%version, "health check of the min_healthy_time soak passed");
            }
        }
        if ok && self.has_failure_entry(&version).await? {
            // Healthy again after a reported failure: say so.
            tracing::info!(%version, "health check passes again");
            self.ledger
                .report(&version, Step::Validated, &checked, &run_dir, None)
                .await;
        }
        if let Outcome::Failure(reason) = &checked {
            if soak {
                self.soak_failed(&version, reason, obs, &run_dir).await;
            } else {
                tracing::warn!(%version, %reason, "health check failed");
            }
        }
        let state = if ok { AgentState::Idle } else { AgentState::Failed };
        self.set_record(state, Some(version.clone()));
        Ok(PassResult::Checked { version, ok })
    }

    /// The soak's check failed: the version's validation failed, reported like an
    /// upgrade's (with the run result failed at validation); no repair follows.
    async fn soak_failed(
        &mut self,
        version: &Version,
        reason: &str,
        obs: &Observation,
        run_dir: &std::path::Path,
    ) {
        tracing::warn!(
            %version,
            %reason,
            "the health check failed during the min_healthy_time soak: reported as a failed validation of {version}; no repair"
        );
        self.health = Health::SoakFailed;
        let detail = results::detail_from(run_dir, Step::Validated);
        let result = obs
            .result
            .as_ref()
            .map(|run| results::soak_failed(run, reason, detail.as_deref(), run_dir));
        let failed = Outcome::Failure(format!(
            "the health check failed during the min_healthy_time soak: {reason}"
        ));
        self.ledger
            .report(version, Step::Validated, &failed, run_dir, result)
            .await;
    }

    /// A health check of the local `version` passed now: the run result of that
    /// version records it (`checked_at`), fenced on the result as read.
    async fn mark_checked(&self, version: &Version) -> Result<(), AgentError> {
        let now = self.clock.unix_now();
        let key = self.cfg.schema.result(&self.cfg.hostname);
        if results::update(&self.store, &key, |r| results::checked(r, version, now)).await? {
            tracing::debug!(%version, checked_at = now, "health check recorded in the run result");
        }
        Ok(())
    }

    /// The repair after a failed health check: Puppet once, then the check again;
    /// the outcome is reported for the local version.
    async fn repair(&mut self, version: Version, obs: &Observation) -> Result<PassResult, AgentError> {
        let skipped = "health check failed, but no repair now";
        let fence = self.subject().health_fence(obs);
        self.run_packages = self.package_step(&version, obs);
        let run_dir = match self
            .health_run(&version, AgentState::Upgrading, fence, skipped)
            .await?
        {
            Ok(d) => d,
            Err(instead) => {
                if matches!(instead, PassResult::Skipped { .. }) {
                    // It cannot run here: a failed repair until the next check.
                    self.health = Health::RepairFailed;
                }
                self.set_record(AgentState::Failed, Some(version));
                return Ok(instead);
            }
        };
        let configured = self.step(Step::Configured, &version, &run_dir).await;
        let outcome = match configured {
            Outcome::Interrupted => return Ok(PassResult::Repaired { version, ok: false }),
            Outcome::Failure(_) => {
                self.ledger
                    .report(&version, Step::Configured, &configured, &run_dir, None)
                    .await;
                configured
            }
            Outcome::Success { .. } => {
                let validated = self.step(Step::Validated, &version, &run_dir).await;
                if validated == Outcome::Interrupted {
                    return Ok(PassResult::Repaired { version, ok: false });
                }
                match self
                    .ledger
                    .report(&version, Step::Validated, &validated, &run_dir, None)
                    .await
                {
                    Some(reason) => Outcome::Failure(reason),
                    None => validated,
                }
            }
        };
        self.health = self.health.after_repair(&outcome);
        let ok = outcome.ok();
        tracing::info!(%version, repaired = ok, "health repair finished");
        let state = if ok { AgentState::Idle } else { AgentState::Failed };
        self.set_record(state, Some(version.clone()));
        Ok(PassResult::Repaired { version, ok })
    }

    /// The run directory of a health check or repair, once its fenced start won;
    /// otherwise what the pass did instead (logged with `skipped`).
    async fn health_run(
        &mut self,
        version: &Version,
        state: AgentState,
        fence: Vec<Compare>,
        skipped: &str,
    ) -> Result<Result<std::path::PathBuf, PassResult>, AgentError> {
        let run_dir = match rundir::create(&self.cfg.state_dir, version, self.clock.unix_now()) {
            Ok(d) => d,
            Err((_, reason)) => {
                tracing::error!(%version, %reason, "{skipped}");
                let version = version.clone();
                return Ok(Err(PassResult::Skipped { version }));
            }
        };
        if !self.begin(state, version, fence.clone()).await? {
            let lock_fenced = fence
                .iter()
                .any(|c| matches!(c, Compare::ModRevision(k, _) if *k == self.cfg.schema.lock(ROLLOUT_LOCK)));
            let why = if lock_fenced {
                self.why_fence_lost().await
            } else {
                "the desired version, an enable key or the package snapshot template changed since it was read"
            };
            tracing::warn!(%version, "{skipped}: {why}");
            return Ok(Err(PassResult::Raced));
        }
        Ok(Ok(run_dir))
    }

    /// Why a fenced start of a health check lost, for the log (one read).
    async fn why_fence_lost(&self) -> &'static str {
        match self.store.get(&self.cfg.schema.lock(ROLLOUT_LOCK)).await {
            Ok(Some(_)) => "a jioctl upgrade driver holds the rollout lock",
            Ok(None) => {
                "the desired version, an enable key or the package snapshot template changed since it was read"
            }
            Err(_) => {
                "the rollout lock, the desired version, an enable key or the package snapshot template changed"
            }
        }
    }

    async fn has_failure_entry(&self, v: &Version) -> Result<bool, AgentError> {
        for step in Step::ALL {
            let key = self
                .cfg
                .schema
                .status(step, KeyOutcome::Failure, v, &self.cfg.hostname);
            if self.store.get(&key).await?.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// Logs what a pass decided (the decisions of holds, rollouts and composable
/// rollouts by `log_rollout_decision`).
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
            tracing::info!(desired = %version, local, reason = %why, "upgrade allowed")
        }
        Decision::Report => tracing::info!("results waiting to be reported"),
        Decision::Blocked { reason } => tracing::error!(
            local,
            %reason,
            "blocked by an invalid value in the store: nothing starts until it is fixed (the agent keeps watching)"
        ),
        Decision::HealthCheck { version } => tracing::debug!(%version, "health check due"),
        Decision::Repair { version } => {
            tracing::info!(%version, "running puppet to repair the failed health check")
        }
        Decision::HealthHeld { version } if obs.health == Health::CheckFailed => tracing::warn!(
            %version,
            "health check failed, but no repair now: a jioctl upgrade driver holds the rollout lock"
        ),
        Decision::HealthHeld { version } => tracing::info!(
            %version,
            "health check skipped: a jioctl upgrade driver holds the rollout lock"
        ),
        _ => log_rollout_decision(d),
    }
}

/// Logs a decision made by a hold, the active rollout's rules or a composable
/// rollout's grants (`log_decision` logs the others).
fn log_rollout_decision(d: &Decision) {
    match d {
        Decision::Held { version, hold } => match &hold.record {
            Ok(h) => tracing::info!(
                key = %hold.key,
                "held by {}: {}; not starting the upgrade to {version}",
                h.by,
                h.reason.as_deref().unwrap_or("no reason given")
            ),
            Err(why) => tracing::warn!(
                key = %hold.key,
                "held by {} whose record cannot be read ({why}); it holds all the same: not starting the upgrade to {version}",
                hold.key
            ),
        },
        Decision::RolloutUnusable { version, reason } => tracing::warn!(
            %reason,
            "the active rollout's record cannot be used ({reason}): not starting the upgrade to {version} until it is fixed"
        ),
        Decision::Soaking { version, check_at } => tracing::info!(
            %version,
            "soaking (min_healthy_time): the health check runs at {}",
            jio_common::plan::when(*check_at)
        ),
        Decision::SoakCheck { version } => {
            tracing::debug!(%version, "the health check of the min_healthy_time soak is due")
        }
        Decision::Tasks {
            version,
            phase,
            services,
        } => tracing::info!(
            %version,
            phase,
            services = %services.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
            "composable rollout: the phase is granted; running its tasks"
        ),
        Decision::AwaitingPhase {
            version,
            problem: Some(problem),
            ..
        } => tracing::warn!(
            %version,
            "composable rollout: a phase grant cannot be read ({problem}); nothing runs until the driver writes it again"
        ),
        Decision::AwaitingPhase {
            version,
            granted,
            problem: None,
        } => tracing::info!(
            %version,
            granted = granted.as_deref().unwrap_or("nothing"),
            "composable rollout: waiting for the driver to grant a phase with work for this host"
        ),
        Decision::FailedHere { version, phase } => tracing::warn!(
            %version,
            "composable rollout: a step of this host failed ({phase}); it is retried when an operator enables it again (jioctl enable-puppet true --host), not on a timer"
        ),
        Decision::LeftBehind {
            version,
            missed,
            granted,
        } => tracing::warn!(
            %version,
            "composable rollout: {granted} is granted, but this host did not finish {missed} (a task failed, or it was held while the phase went on): it stays behind in this rollout (a new rollout retries it)"
        ),
        _ => {}
    }
}
