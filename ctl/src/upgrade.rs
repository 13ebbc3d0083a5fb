//! `jioctl upgrade`: set the desired version and drive the rollout under the rules.
//!
//! Each pass reads a snapshot, plans with the pure planner, and applies the plan in
//! transactions fenced on the plan epoch and on still holding the rollout lock; a
//! pass that lost the race plans again, a driver that lost the lock takes it again
//! or stops. With `--retry` passes repeat, woken by a watch on the namespace (not a
//! timer), until nothing is pending or upgrading, failures stop the rollout, an
//! emergency stop halts it, or `--timeout` passes. While it waits it says on what.
//! The last pass resets the enable keys, so a finished rollout leaves nothing armed.
//!
//! What to do after each step is decided by the pure `next::next`; this module is
//! the shell around it: the store, the watch, the lock, the clock and the output.

mod live;
pub mod next;

use std::io::IsTerminal as _;
use std::time::Duration;

use tokio::time::Instant;

use futures_util::StreamExt as _;

use jio_common::fleet::{self, HALT, LockRecord, Snapshot};
use jio_common::gate::KeyState;
use jio_common::keys::Schema;
use jio_common::names::Version;
use jio_common::roles::RolePattern;
use jio_common::rules::{self, Plan, Resolved, Rules};
use jio_common::store::{DynStore, ErrorKind, Op, Revision, StoreError, WatchEvent, WatchStream};

use crate::exit::{self, Failure, Outcome};
use crate::progress::Progress;
use crate::render;
use crate::writes::{self, Fenced, LockOutcome, RolloutLock};
use live::{Applied, LiveView};
use next::{After, Before, DriverState, During, Ending, Next, Observed, PassOutcome, Settled, Waiting};

pub struct Args {
    pub version: Version,
    pub rules: Rules,
    pub noop: bool,
    pub retry: bool,
    pub verbose: bool,
    pub json: bool,
    /// Print nothing but errors (for programs that drive upgrades in-process).
    pub quiet: bool,
    /// `--timeout`: give up (exit `TIMED_OUT`) when the rollout has not finished by then.
    pub timeout: Option<Duration>,
}

/// Runs a rollout in-process (for programs that embed it), with the default role
/// rule; the outcome is reported like the command's. Returns the exit code.
pub async fn run(store: &DynStore, schema: &Schema, args: Args) -> anyhow::Result<u8> {
    Ok(exit::report(
        rollout(store, schema, &RolePattern::default(), args).await,
    ))
}

/// A snapshot as it will be once the rollout to `v` has started (for `--noop`).
fn as_if_started(mut snap: Snapshot, v: &Version) -> Snapshot {
    if snap.current.as_ref() != Some(v) {
        snap.current = Some(v.clone());
        snap.global = KeyState::Set(false);
        snap.role_keys.clear();
        snap.host_keys.clear();
    }
    snap
}

/// Checks the rules against the fleet (nothing is written before), then prints the
/// plan (`--noop`) or drives the rollout under the lock.
pub async fn rollout(store: &DynStore, schema: &Schema, role_pattern: &RolePattern, args: Args) -> Outcome {
    // The revision this command started at: an emergency stop written after it halts
    // this run; one written before it was seen by the operator who started it.
    let started_at = store.ping().await?;
    let mut snap = Snapshot::read_for(store, schema, Some(&args.version)).await?;
    snap.role_pattern = role_pattern.clone();
    for p in &snap.problems {
        eprintln!("jioctl: warning: {p}");
    }
    let roles = fleet::classify(&snap).into_iter().map(|h| h.role).collect();
    let resolved = args
        .rules
        .resolve(&roles)
        .map_err(|e| Failure::with(exit::INVALID_RULES, e.into()))?;
    for w in &resolved.warnings {
        eprintln!("jioctl: warning: {w}");
    }
    if args.noop {
        return noop(snap, &resolved, &args);
    }
    let deadline = args.timeout.map(|t| Instant::now() + t);
    let lock = tokio::select! {
        l = take_lock(store, schema, &args, deadline) => l?,
        sig = interrupted() => return Err(Failure::new(
            signal_code(sig),
            format!("{sig}: stopped while waiting for the rollout lock; nothing was written"),
        )),
    };
    let mut driver = Driver::new(store, schema, role_pattern, &args, lock, started_at, deadline);
    let ending = tokio::select! {
        r = driver.drive() => r,
        sig = interrupted() => {
            driver.release().await;
            return Err(Failure::new(signal_code(sig), format!(
                "{sig}: the rollout to {} is no longer driven; the rollout lock is released. Hosts already enabled go on; `jioctl global-disable-puppet` stops them",
                args.version
            )));
        }
    };
    driver.release().await;
    driver.conclude(ending?).await
}

fn noop(snap: Snapshot, resolved: &Resolved, args: &Args) -> Outcome {
    let snap = as_if_started(snap, &args.version);
    let hosts = fleet::classify(&snap);
    let plan = rules::plan(&snap, &hosts, resolved);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&render::plan_json(&plan))?);
    } else {
        println!("plan for {} (noop: nothing written):", args.version);
        print!("{}", render::plan_table(&plan));
        if let Some(a) = render::admitted(&plan) {
            println!("would have {a}");
        }
    }
    Ok(())
}

/// SIGINT or SIGTERM, whichever comes first.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

fn signal_code(sig: &str) -> u8 {
    if sig == "SIGTERM" {
        exit::SIGTERM
    } else {
        exit::SIGINT
    }
}

/// Takes the rollout lock, waiting for it with `--retry`.
async fn take_lock(
    store: &DynStore,
    schema: &Schema,
    args: &Args,
    deadline: Option<Instant>,
) -> Result<RolloutLock, Failure> {
    let key = schema.lock(fleet::ROLLOUT_LOCK);
    let mut last_said = None;
    loop {
        let holder = match RolloutLock::try_take(store, schema).await? {
            LockOutcome::Taken(l) => return Ok(l),
            LockOutcome::Held(holder) => holder,
        };
        let who = writes::describe(&holder);
        if !args.retry {
            return Err(Failure::new(
                exit::LOCKED,
                format!("a rollout is already being driven by {who}; try again later or use --retry to wait"),
            ));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Failure::new(
                exit::TIMED_OUT,
                format!("--timeout passed while waiting for the rollout lock held by {who}"),
            ));
        }
        if last_said.as_ref() != Some(&who) {
            eprintln!("jioctl: waiting for the rollout lock held by {who}");
            last_said = Some(who);
        }
        let rev = store.ping().await?;
        let mut w = store.watch(&key, rev + 1).await?;
        if store.get(&key).await?.is_some() {
            let wait = deadline
                .map(|d| d.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::from_secs(30))
                .min(Duration::from_secs(30));
            let _ = tokio::time::timeout(wait, w.next()).await;
        }
    }
}

/// Why a pass did not finish.
enum PassError {
    Store(StoreError),
    Rules(rules::RulesError),
}

impl From<StoreError> for PassError {
    fn from(e: StoreError) -> Self {
        PassError::Store(e)
    }
}

/// The driver's shell: everything `next::next` needs to know, and the I/O it asks for.
struct Driver<'a> {
    store: &'a DynStore,
    schema: &'a Schema,
    role_pattern: &'a RolePattern,
    args: &'a Args,
    lock: Option<RolloutLock>,
    started_at: Revision,
    deadline: Option<Instant>,
    progress: Progress,
    view: Option<LiveView>,
    watch: Option<WatchStream>,
    /// The revision of the last pass's snapshot (where a watch starts without a view).
    last_revision: Revision,
    waiting: Waiting,
    unreachable_since: Option<Instant>,
    /// The error of the last pass the store did not answer.
    store_error: Option<StoreError>,
}

impl<'a> Driver<'a> {
    fn new(
        store: &'a DynStore,
        schema: &'a Schema,
        role_pattern: &'a RolePattern,
        args: &'a Args,
        lock: RolloutLock,
        started_at: Revision,
        deadline: Option<Instant>,
    ) -> Driver<'a> {
        let tty = std::io::stdout().is_terminal() && !args.json;
        Driver {
            store,
            schema,
            role_pattern,
            args,
            lock: Some(lock),
            started_at,
            deadline,
            progress: if args.quiet {
                Progress::silent()
            } else {
                Progress::new(tty)
            },
            view: None,
            watch: None,
            last_revision: 0,
            waiting: Waiting::default(),
            unreachable_since: None,
            store_error: None,
        }
    }

    /// Runs steps until the rollout ends.
    async fn drive(&mut self) -> Result<Ending, Failure> {
        let mut observed = self.observe().await?;
        loop {
            match next::next(&observed, &self.state()) {
                Next::Pass => {}
                Next::Reread => self.view = None,
                Next::Retake => {
                    observed = self.retake().await?;
                    continue;
                }
                Next::Pause(d) => {
                    self.view = None;
                    tokio::time::sleep(d).await;
                }
                Next::Wait => self.wait_for_change().await?,
                Next::GiveUp => {
                    return Err(match self.store_error.take() {
                        Some(e) => e.into(),
                        None => Failure::new(exit::SOFTWARE, "the store failed"),
                    });
                }
                Next::End(ending) => return Ok(ending),
            }
            observed = self.observe().await?;
        }
    }

    fn state(&self) -> DriverState {
        let now = Instant::now();
        DriverState {
            retry: self.args.retry,
            deadline_passed: self.deadline.is_some_and(|d| now >= d),
            unreachable_for: self.unreachable_since.map(|t| now.saturating_duration_since(t)),
        }
    }

    async fn release(&mut self) {
        if let Some(l) = self.lock.take() {
            l.release().await;
        }
    }

    /// Checks the lock, then runs a pass; says what changed about the store.
    async fn observe(&mut self) -> Result<Observed, Failure> {
        if self.lock.as_ref().is_some_and(RolloutLock::lease_ended) {
            return Ok(Observed::LeaseEnded);
        }
        match self.pass().await {
            Ok(outcome) => {
                if self.unreachable_since.take().is_some() {
                    eprintln!("jioctl: store reachable again");
                }
                if let (true, PassOutcome::Continue { waiting: Some(line) }) = (self.args.retry, &outcome)
                    && self.waiting.note(line.clone(), Instant::now())
                {
                    self.progress.note(&format!("waiting for: {line}"));
                }
                Ok(Observed::Pass(outcome))
            }
            Err(PassError::Store(e)) if e.kind() == ErrorKind::Unavailable => {
                if self.args.retry && self.unreachable_since.is_none() {
                    eprintln!("jioctl: {e}; retrying");
                    self.unreachable_since = Some(Instant::now());
                }
                self.store_error = Some(e);
                Ok(Observed::Unreachable)
            }
            Err(PassError::Store(e)) => Err(e.into()),
            Err(PassError::Rules(e)) => Ok(Observed::RulesInvalid(e)),
        }
    }

    /// The lock's lease ended or the fence found it gone: take it again before
    /// writing anything.
    async fn retake(&mut self) -> Result<Observed, Failure> {
        self.release().await;
        match RolloutLock::try_take(self.store, self.schema).await? {
            LockOutcome::Taken(l) => {
                eprintln!(
                    "jioctl: the rollout lock's lease had ended (this process was paused or cut off from the store); took the lock again, planning afresh"
                );
                self.lock = Some(l);
                Ok(Observed::Retaken)
            }
            LockOutcome::Held(holder) => Ok(Observed::LockHeld(holder)),
        }
    }
}

/// Passes: read (or keep) the view, plan, write at most one fenced change.
impl Driver<'_> {
    async fn pass(&mut self) -> Result<PassOutcome, PassError> {
        let mut view = match self.view.take() {
            Some(v) => v,
            None => {
                // Something may have been missed: read everything again.
                self.watch = None;
                LiveView::read(self.store, self.schema).await?
            }
        };
        let outcome = self.pass_on(&mut view).await;
        self.view = Some(view);
        outcome
    }

    async fn pass_on(&mut self, view: &mut LiveView) -> Result<PassOutcome, PassError> {
        let snap = view.snapshot(self.schema, self.role_pattern);
        self.last_revision = snap.revision;
        match next::before_plan(&snap, self.started_at, &self.args.version) {
            Before::Halted(by) => return Ok(PassOutcome::Halted(by)),
            Before::ClearHalt(by) => return Ok(self.clear_halt(&snap, &by).await?),
            Before::Start => return Ok(self.start(view, &snap).await?),
            Before::Plan => {}
        }
        let hosts = fleet::classify(&snap);
        let roles = hosts.iter().map(|h| h.role.clone()).collect();
        let resolved = self.args.rules.resolve(&roles).map_err(PassError::Rules)?;
        let plan = rules::plan(&snap, &hosts, &resolved);
        if self.args.verbose {
            println!("pass at revision {}:", snap.revision);
            print!("{}", render::plan_table(&plan));
        }
        match next::after_plan(&snap, &hosts, &plan) {
            After::Apply => Ok(self.apply(&snap, &plan).await?),
            After::Settle { disarm, end } => {
                self.progress.update(&hosts);
                if disarm && let Some(end) = self.disarm(&snap).await? {
                    return Ok(end);
                }
                Ok(match end {
                    Settled::Finished { failed } => PassOutcome::Finished { failed },
                    Settled::Stopped => PassOutcome::Stopped {
                        failures: snap
                            .failures
                            .iter()
                            .map(|(h, (step, value))| (h.clone(), *step, value.clone()))
                            .collect(),
                    },
                    Settled::Waiting => PassOutcome::Continue {
                        waiting: Some(render::waiting_line(&hosts, &plan)),
                    },
                })
            }
        }
    }

    async fn apply(&mut self, snap: &Snapshot, plan: &Plan) -> Result<PassOutcome, StoreError> {
        let ops = writes::plan_ops(self.schema, plan);
        if let Some(end) = self.fenced(ops, snap).await? {
            return Ok(end);
        }
        if let Some(a) = render::admitted(plan) {
            self.progress.note(&a);
        }
        // The watch brings our own writes back into the view.
        Ok(PassOutcome::Continue { waiting: None })
    }

    /// Writes `ops` fenced on what `snap` read and on still holding the lock: `None`
    /// when applied, or the end of the pass (replan, or the lock lost).
    async fn fenced(&self, ops: Vec<Op>, snap: &Snapshot) -> Result<Option<PassOutcome>, StoreError> {
        let Some(lock) = &self.lock else {
            return Ok(Some(PassOutcome::LockLost));
        };
        Ok(
            match writes::apply_fenced(self.store, self.schema, ops, snap.epoch, lock).await? {
                Fenced::Applied => None,
                Fenced::Moved => Some(PassOutcome::Replan),
                Fenced::LockLost => Some(PassOutcome::LockLost),
            },
        )
    }

    /// Clears an emergency stop from before this run, fenced like any plan.
    async fn clear_halt(&mut self, snap: &Snapshot, by: &LockRecord) -> Result<PassOutcome, StoreError> {
        let ops = vec![Op::Delete(self.schema.lock(HALT))];
        if let Some(end) = self.fenced(ops, snap).await? {
            return Ok(end);
        }
        if !self.args.quiet {
            println!(
                "cleared the emergency stop by {} (it came before this upgrade was started)",
                writes::describe(&Some(by.clone()))
            );
        }
        Ok(PassOutcome::Replan)
    }

    /// First pass (or someone changed the version): start the rollout in one
    /// transaction.
    async fn start(&mut self, view: &mut LiveView, snap: &Snapshot) -> Result<PassOutcome, StoreError> {
        let ops = writes::start_rollout_ops(self.schema, &self.args.version);
        if let Some(end) = self.fenced(ops, snap).await? {
            return Ok(end);
        }
        if !self.args.quiet {
            println!(
                "current_version set to {} (puppet disabled globally; hosts start under the rules)",
                self.args.version
            );
        }
        // Failure entries are read per version: read everything again.
        *view = LiveView::read(self.store, self.schema).await?;
        Ok(PassOutcome::Again)
    }

    /// Leaves nothing armed (a later trigger-update must not release the fleet):
    /// `None` when done, or the end of the pass.
    async fn disarm(&mut self, snap: &Snapshot) -> Result<Option<PassOutcome>, StoreError> {
        let ops = writes::global_disable_ops(self.schema);
        if let Some(end) = self.fenced(ops, snap).await? {
            return Ok(Some(end));
        }
        if !self.args.quiet {
            println!("enable keys reset (puppet disabled globally): nothing is left armed");
        }
        Ok(None)
    }
}

/// Waiting: woken by any change; a slow resync guards against a silent watch, and
/// the waiting line is repeated while nothing moves.
impl Driver<'_> {
    /// The slow resync.
    const RESYNC: Duration = Duration::from_secs(30);

    /// Waits until something a plan depends on changed (the view is up to date), or
    /// until the resync, the reminder or the deadline is due (the view is dropped:
    /// the next pass reads afresh).
    async fn wait_for_change(&mut self) -> Result<(), Failure> {
        if self.watch.is_none() {
            let from = self.view.as_ref().map_or(self.last_revision, |v| v.watch_from);
            self.watch = Some(self.store.watch(&self.schema.root(), from + 1).await?);
        }
        let mut events = Vec::new();
        loop {
            match self.next_event().await? {
                Some(ev) => events.push(ev),
                None => {
                    self.view = None;
                    return Ok(());
                }
            }
            if let Some(w) = self.watch.as_mut() {
                while let Some(Some(Ok(ev))) = futures_util::FutureExt::now_or_never(w.next()) {
                    events.push(ev);
                }
            }
            let Some(v) = self.view.as_mut() else {
                return Ok(());
            };
            match v.apply_all(self.schema, events.drain(..)) {
                // Nothing a plan depends on changed: wait for more, without a pass.
                Applied::Nothing => {}
                Applied::Changed => return Ok(()),
                Applied::Reread => {
                    self.view = None;
                    return Ok(());
                }
            }
        }
    }

    /// The next event, or `None` when the resync, the reminder or the deadline is
    /// due first (or the watch ended: it is opened again).
    async fn next_event(&mut self) -> Result<Option<WatchEvent>, Failure> {
        let now = Instant::now();
        let mut nap = Self::RESYNC.min(self.waiting.until_reminder(now));
        if let Some(d) = self.deadline {
            nap = nap.min(d.saturating_duration_since(now));
        }
        let Some(w) = self.watch.as_mut() else {
            return Ok(None);
        };
        match tokio::time::timeout(nap.max(Duration::from_millis(10)), w.next()).await {
            Ok(Some(Ok(ev))) => Ok(Some(ev)),
            Ok(Some(Err(e))) => Err(e.into()),
            Ok(None) => {
                self.watch = None;
                Ok(None)
            }
            Err(_) => Ok(None),
        }
    }
}

/// The end: what to say, and the final status.
impl Driver<'_> {
    async fn conclude(&self, ending: Ending) -> Outcome {
        let v = &self.args.version;
        let code = ending.code();
        let say = |msg: String| Err(Failure::new(code, msg));
        match ending {
            Ending::Applied | Ending::Finished { .. } => {
                if !self.args.quiet {
                    self.finish().await?;
                }
                if code == exit::OK {
                    Ok(())
                } else {
                    Err(Failure::quiet(code))
                }
            }
            Ending::Stopped { failures } => say(self.stopped(&failures)),
            Ending::Halted(by) => say(format!(
                "the rollout to {v} was halted by an emergency stop: {} ran global-disable-puppet; every enable key was reset and this run enables nothing more (run `jioctl upgrade {v}` again to resume)",
                writes::describe(&Some(by)),
            )),
            Ending::TimedOut(During::Waiting) => say(format!(
                "--timeout passed; the rollout to {v} has not finished, waiting for {}",
                self.waiting.last.as_deref().unwrap_or("hosts still upgrading")
            )),
            Ending::TimedOut(During::Unreachable) => {
                say("--timeout passed while the store was unreachable".into())
            }
            Ending::LockLost(holder) => say(format!(
                "lost the rollout lock (its lease ended while this process was paused or cut off from the store); it is now held by {}; this run stops without writing anything more",
                writes::describe(&holder)
            )),
            Ending::InvalidRules(e) => Err(Failure::with(code, e.into())),
        }
    }

    fn stopped(&self, failures: &[(jio_common::names::HostName, jio_common::keys::Step, String)]) -> String {
        let mut msg = format!(
            "rollout to {} stopped: {} host(s) failed (max_failures {}); hosts already running finish their run",
            self.args.version,
            failures.len(),
            self.args.rules.max_failures
        );
        for (h, step, value) in failures {
            msg.push_str(&format!(
                "\n  {h}: {} failed: {}",
                step.as_str(),
                crate::status::describe_entry(value)
            ));
        }
        msg
    }

    async fn finish(&self) -> Result<(), StoreError> {
        let mut snap = Snapshot::read(self.store, self.schema).await?;
        snap.role_pattern = self.role_pattern.clone();
        let hosts = fleet::classify(&snap);
        if self.args.json {
            println!("{}", crate::status::to_json(&snap, &hosts));
        } else {
            print!("{}", crate::status::to_text(&snap, &hosts, self.store.url()));
        }
        Ok(())
    }
}
