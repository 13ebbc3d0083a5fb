//! `jioctl upgrade` and `jioctl drive`: rollouts recorded in the store, and the
//! driver that moves them.
//!
//! `upgrade` starts a rollout (its record, `/rollouts/current` and the desired
//! version in one transaction) or follows the active one with the same version and
//! rules, then follows it: it shows progress and, while no driver service is there
//! to do it, drives it itself under the rollout lock. `drive` is the service: it
//! drives whatever rollout is current while it holds the lock, and stands by while
//! another holds it.
//!
//! A driver's pass reads a snapshot, decides with the pure `next::step` and planner,
//! and writes at most one change fenced on the plan epoch and on still holding the
//! lock; a pass that lost the race plans again, a driver that lost the lock takes it
//! again or stops. Passes are woken by a watch on the namespace (not a timer), by a
//! pause's expiry and by the progress deadline. While it waits it says on what.

mod hook_pass;
mod intent;
mod live;
pub mod next;
pub mod waves;

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::time::Duration;

use tokio::time::Instant;

use futures_util::StreamExt as _;

use jio_common::clock::{DynClock, SystemClock};
use jio_common::compose_rules::Compose;
use jio_common::fleet::{self, HostState, HostStatus, Snapshot};
use jio_common::keys::Schema;
use jio_common::names::Version;
use jio_common::plan::Plan;
use jio_common::roles::RolePattern;
use jio_common::rollout::{RolloutId, RolloutRecord, RolloutState};
use jio_common::rules::{self, Rules};
use jio_common::store::{DynStore, ErrorKind, Op, Revision, StoreError, WatchEvent, WatchStream};
use jio_common::time::utc_display;

use crate::exit::{self, Failure, Outcome};
use crate::progress::Progress;
use crate::render;
use crate::rollouts::{self, Started};
use crate::status::stage_args;
use crate::writes::{self, Fenced, LockOutcome, RolloutLock};
use live::{Applied, LiveView};
use next::{DriverState, During, Ending, Next, Observed, PassOutcome, ProgressClock, Step, Waiting, Who};

/// How `jioctl upgrade` goes on once the rollout is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Follow it to its end, driving it while no driver service does (the default;
    /// `--retry` is the same).
    Follow,
    /// One pass, then return (`--once`).
    Once,
    /// Return as soon as it is recorded (`--detach`).
    Detach,
}

pub struct Args {
    pub version: Version,
    pub rules: Rules,
    /// The rules as given and validated (what the record keeps).
    pub rules_json: serde_json::Value,
    pub mode: Mode,
    pub noop: bool,
    pub verbose: bool,
    pub json: bool,
    /// Print nothing but errors (for programs that drive upgrades in-process).
    pub quiet: bool,
    /// `--timeout`: give up (exit `TIMED_OUT`) when the rollout has not finished by then.
    pub timeout: Option<Duration>,
    /// `--stage`: the stages of a composable rollout to start (empty: every stage).
    pub stages: Vec<String>,
    /// `--force`: rules whose intent is unclear go ahead (`rules::check_intent`).
    pub force: bool,
    /// The maintenance hooks this process runs while it drives.
    pub hooks: crate::hooks::HookSettings,
}

/// Runs a rollout in-process (for programs that embed it), with the default role
/// rule; the outcome is reported like the command's. Returns the exit code.
pub async fn run(store: &DynStore, schema: &Schema, args: Args) -> anyhow::Result<u8> {
    Ok(exit::report(
        rollout(store, schema, &RolePattern::default(), args).await,
    ))
}

/// The default rules file.
pub const DEFAULT_RULES: &str = "/etc/jio-upgrade.json";

/// Checks the rules against the fleet (nothing is written before), then prints the
/// planned waves (`--noop`), or records the rollout and follows it.
pub async fn rollout(store: &DynStore, schema: &Schema, role_pattern: &RolePattern, args: Args) -> Outcome {
    let read = || async {
        let mut s = Snapshot::read_for(store, schema, Some(&args.version)).await?;
        s.role_pattern = role_pattern.clone();
        Ok::<Snapshot, StoreError>(s)
    };
    let snap = read().await?;
    for p in &snap.problems {
        eprintln!("jioctl: warning: {p}");
    }
    let hosts = fleet::classify(&snap);
    let roles = hosts.iter().map(|h| h.role.clone()).collect();
    let resolved = args
        .rules
        .resolve(&roles)
        .map_err(|e| Failure::with(exit::INVALID_RULES, e.into()))?;
    if args.rules.compose.is_some()
        && let Some(why) = hook_pass::composable_refusal(&args.hooks, &hosts)
    {
        return Err(Failure::new(
            exit::INVALID_RULES,
            format!(
                "{why}: upgrade those roles with a rolling rollout, or start it from a configuration without their [hooks.*]; nothing was written"
            ),
        ));
    }
    let forced = check_intent(&snap, &resolved, &args)?;
    if args.noop {
        return noop(snap, &resolved, &args);
    }
    if args.rules.compose.is_some() && !args.quiet {
        // Hosts that cannot take part (a task file missing or invalid) hold their
        // stage: say so before anything is written.
        for (h, why) in blocked_by_task_files(&snap, &resolved, &args) {
            eprintln!(
                "jioctl: warning: {h} {why}: its stage will wait for it (fix its task files, or hold it)"
            );
        }
    }
    let clock: DynClock = std::sync::Arc::new(SystemClock);
    let want = rollouts::Wanted {
        version: &args.version,
        rules: &args.rules_json,
        order: rollouts::stage_order(&args.rules),
        stages: &args.stages,
        forced,
    };
    let started = tokio::select! {
        s = rollouts::start(store, schema, &want, || clock.unix_now(), read) => s,
        sig = interrupted() => return Err(Failure::new(
            signal_code(sig),
            format!("{sig}: stopped before the rollout was recorded; nothing was written"),
        )),
    };
    let record = match started {
        Ok(Started::Created(c)) => {
            if !args.quiet {
                say_created(&c, &snap);
            }
            c.record
        }
        Ok(Started::Follow(r)) => {
            if !args.quiet {
                crate::say!(
                    "following rollout {} to {} ({}), started by {} at {}",
                    r.id,
                    r.version,
                    r.state.name(),
                    r.started_by(),
                    utc_display(r.started_at())
                );
            }
            *r
        }
        Err(rollouts::ChangeError::Store(e)) => return Err(e.into()),
        Err(rollouts::ChangeError::Unusable(e)) => return Err(Failure::usage(e)),
        Err(e) => return Err(Failure::new(exit::SOFTWARE, e.to_string())),
    };
    follow(store, schema, role_pattern, &record, args.mode, &args).await
}

/// The shared check of the rules' intent (`rules::check_intent`) before a rollout
/// is recorded, with what `--force` lets through said as warnings. `Ok(true)`:
/// forced past a refusal (the record says so). Following the active rollout to
/// this version with these rules, which its operator forced, needs no `--force`.
fn check_intent(snap: &Snapshot, resolved: &rules::Resolved, args: &Args) -> Result<bool, Failure> {
    let moving = snap
        .hosts()
        .iter()
        .filter(|h| !snap.running.get(*h).is_some_and(|vs| vs.contains(&args.version)))
        .count();
    let unlimited = args.rules.sets_no_limit().then_some(moving);
    // Following the active rollout to this version with these rules, which its
    // operator forced: the intent was given then.
    let digest = jio_common::rollout::digest(&args.rules_json);
    let resumes_forced = snap.rollout.as_ref().and_then(|c| c.ok()).is_some_and(|r| {
        r.forced && r.state.active() && r.version == args.version && r.rules_digest() == digest
    });
    // Recorded as forced only when the check would have refused it.
    let forced = args.force && jio_common::rules::check_intent(resolved, unlimited, false).is_err();
    jio_common::rules::check_intent(resolved, unlimited, args.force || resumes_forced).map_err(|e| {
        Failure::new(
            exit::INVALID_RULES,
            format!("{e} (the rules come from --instructions, --instructions-file, or {DEFAULT_RULES})"),
        )
    })?;
    for w in &resolved.warnings {
        eprintln!("jioctl: warning: {w} (--force)");
    }
    if args.rules.sets_no_limit() {
        eprintln!(
            "jioctl: warning: --force: the rules set no rolling limit: {moving} host(s) not at {} may start at once",
            args.version
        );
    }
    Ok(forced)
}

/// Follows a recorded rollout as `mode` says (driving it while no driver service
/// does), and ends with its outcome.
pub async fn follow(
    store: &DynStore,
    schema: &Schema,
    role_pattern: &RolePattern,
    record: &RolloutRecord,
    mode: Mode,
    args: &Args,
) -> Outcome {
    let opts = DriverOpts {
        target: Some(record.id.clone()),
        daemon: false,
        follow: mode == Mode::Follow,
        verbose: args.verbose,
        json: args.json,
        quiet: args.quiet,
        ttl: writes::LOCK_TTL,
        timeout: args.timeout,
        clock: std::sync::Arc::new(SystemClock),
        hooks: args.hooks.clone(),
    };
    let mut driver = Driver::new(store, schema, role_pattern, opts);
    if record.rules == args.rules_json {
        // The rules `upgrade` parsed are the record's: not parsed again.
        driver.rules = Some((record.id.clone(), Ok(args.rules.clone())));
    }
    match mode {
        Mode::Detach => return detached(store, schema, record, args).await,
        Mode::Once => match RolloutLock::try_take(store, schema, writes::LOCK_TTL).await? {
            LockOutcome::Taken(l) => driver.lock = Some(l),
            LockOutcome::Held(holder) => {
                if !args.quiet {
                    crate::say!(
                        "rollout {} is driven by {}; this run writes nothing more",
                        record.id,
                        writes::describe(&holder)
                    );
                }
                return Ok(());
            }
        },
        Mode::Follow => {}
    }
    let ending = tokio::select! {
        r = driver.drive() => r,
        sig = interrupted() => {
            let driving = driver.release_all().await;
            let now = driver.who_drives_now(record).await;
            driver.progress.went_on(Some(&format!("rollout {} goes on; {now}", record.id)));
            let msg = driver.interrupted_message(sig, record, driving, &now);
            return Err(Failure::new(signal_code(sig), msg));
        }
    };
    driver.release().await;
    driver.conclude(ending?, record).await
}

fn say_created(c: &rollouts::Created, before: &Snapshot) {
    let r = &c.record;
    if let Some(old) = &c.replaced {
        match old.ok() {
            Some(o) if o.state.active() => crate::say_fit!(
                "rollout {} to {} ({}) is replaced by this one (recorded aborted)",
                o.id,
                o.version,
                o.state.name()
            ),
            Some(_) => {}
            None => crate::say_fit!(
                "/rollouts/current named {:?}, which could not be used; it now names this rollout",
                old.id
            ),
        }
    }
    if let Some(by) = &c.cleared_halt {
        crate::say_fit!(
            "cleared the emergency stop by {} (it came before this upgrade was started)",
            writes::describe(&Some(by.clone()))
        );
    }
    crate::say_fit!(
        "rollout {} to {} started by {} (rules {}{})",
        r.id,
        r.version,
        r.started_by(),
        r.rules_digest(),
        r.previous
            .as_ref()
            .map(|p| format!("; `jioctl rollout undo` goes back to {p}"))
            .unwrap_or_default()
    );
    if before.current.as_ref() != Some(&r.version) {
        crate::say_fit!(
            "current_version set to {} (puppet disabled globally; hosts start under the rules)",
            r.version
        );
    }
    if c.pruned > 0 {
        crate::say_fit!(
            "history keeps the last {} rollouts: {} older record(s) deleted",
            jio_common::rollout::KEEP_HISTORY,
            c.pruned
        );
    }
}

/// `--detach`: says who drives the rollout, and returns.
async fn detached(store: &DynStore, schema: &Schema, record: &RolloutRecord, args: &Args) -> Outcome {
    let snap = Snapshot::read(store, schema).await?;
    if args.quiet {
        return Ok(());
    }
    if args.json {
        println!(
            "{}",
            crate::out::document(serde_json::json!({
                "rollout": record.id.to_string(),
                "version": record.version,
                "state": record.state.name(),
                "driven_by": snap.lock_key.as_ref().map(|_| writes::describe(&snap.lock)),
                "drive_services": snap.drivers.keys().collect::<Vec<_>>(),
            }))
        );
    }
    match (&snap.lock_key, snap.drivers.is_empty()) {
        (Some(_), _) => crate::say!(
            "detached: rollout {} is driven by {}; `jioctl rollout status` shows it",
            record.id,
            writes::describe(&snap.lock)
        ),
        (None, false) => crate::say!(
            "detached: the driver service(s) {} will drive rollout {}; `jioctl rollout status` shows it",
            snap.drivers.keys().cloned().collect::<Vec<_>>().join(", "),
            record.id
        ),
        (None, true) => crate::say!(
            "detached: rollout {} is recorded, but no driver is running: start `jioctl drive` (a service), or run `jioctl upgrade {}{}` with the same rules to drive it from here",
            record.id,
            record.version,
            stage_args(record)
        ),
    }
    Ok(())
}

/// `--noop`: what the rollout would do, written nowhere.
fn noop(snap: Snapshot, resolved: &rules::Resolved, args: &Args) -> Outcome {
    let snap = waves::as_if_started(snap, &args.version);
    if let Some(c) = &args.rules.compose {
        return noop_composable(&snap, c, resolved, args);
    }
    let hosts = fleet::classify(&snap);
    let cx = jio_common::plan::Context {
        now: jio_common::time::unix_now(),
        rollout: None,
        host_keys_only: false,
        busy_outside: &[],
        hook_roles: &[],
    };
    let first = jio_common::plan::plan(&snap, &hosts, resolved, &cx);
    let waves = waves::simulate(&snap, resolved);
    if args.json {
        let j = serde_json::json!({
            "version": args.version,
            "plan": render::plan_json(&first),
            "waves": waves,
        });
        println!("{}", crate::out::document(j));
    } else {
        crate::say!("plan for {} (noop: nothing written):", args.version);
        print!("{}", render::plan_table(&first));
        if let Some(a) = render::admitted(&first) {
            crate::say!("would have {a}");
        }
        print!("{}", waves::to_text(&waves));
    }
    Ok(())
}

/// `--noop` of a composable rollout: its stages and their phases, from the hosts'
/// catalogs as they are now; refused as the command would be.
fn noop_composable(snap: &Snapshot, c: &Compose, resolved: &rules::Resolved, args: &Args) -> Outcome {
    let order = rollouts::stage_order(&args.rules);
    let stages = rollouts::stages_of(snap, &args.version, &args.rules_json, &order, &args.stages)
        .map_err(Failure::usage)?;
    let mut rec = trial_record(args, "noop");
    rec.stages = stages.clone();
    let cx = jio_common::plan::Context::of_rollout(jio_common::time::unix_now(), &rec, true);
    let mut composed = jio_common::compose::plan(snap, c, resolved, &cx);
    // Nothing runs yet: a stage this command starts is `starts`, not `running`.
    let starts = |name: &str| stages.is_empty() || stages.iter().any(|s| s == name);
    for st in &mut composed.stages {
        st.state = if starts(&st.name) { "starts" } else { "not_started" };
        st.phase = None;
        st.finished = None;
        st.taking_part = None;
    }
    let finalize_role = c.finalize_role().map(|r| r.to_string());
    if args.json {
        let j = serde_json::json!({
            "version": args.version,
            "stages": composed.stages,
            "finalize": {"role": finalize_role, "when": "after every stage is done, once, on the first healthy host of the role"},
        });
        println!("{}", crate::out::document(j));
        return Ok(());
    }
    crate::say!("composable rollout to {} (noop: nothing written):", args.version);
    for st in &composed.stages {
        let roles: Vec<&str> = st.roles.iter().map(|r| r.as_str()).collect();
        let what = if starts(&st.name) {
            "starts"
        } else {
            "not started by this command"
        };
        crate::say!("stage {} ({}): {what}", st.name, roles.join(", "));
        for p in &st.phases {
            crate::say!("  {p}");
        }
    }
    crate::say!(
        "finalize: once every stage is done, on the first healthy host of role {} (the finalize tasks its task files declare)",
        finalize_role.as_deref().unwrap_or("-")
    );
    for (h, r) in blocked(&composed) {
        crate::say!("{h}: {r}");
    }
    Ok(())
}

/// A record of a rollout under `args` that is not written, to plan with.
fn trial_record(args: &Args, by: &str) -> RolloutRecord {
    RolloutRecord::start(
        args.version.clone(),
        None,
        args.rules_json.clone(),
        by,
        jio_common::time::unix_now(),
    )
}

/// The hosts the composable planner finds blocked, and why.
fn blocked(composed: &jio_common::compose::Composed) -> Vec<(String, String)> {
    composed
        .plan
        .reasons
        .iter()
        .filter(|(_, r)| r.code == jio_common::plan::ReasonCode::Blocked)
        .map(|(h, r)| (h.to_string(), r.text.clone()))
        .collect()
}

/// The hosts a composable rollout under `args` would find blocked by their task
/// files, and why.
fn blocked_by_task_files(snap: &Snapshot, resolved: &rules::Resolved, args: &Args) -> Vec<(String, String)> {
    let Some(c) = &args.rules.compose else {
        return Vec::new();
    };
    let snap = waves::as_if_started(snap.clone(), &args.version);
    let rec = trial_record(args, "check");
    let cx = jio_common::plan::Context::of_rollout(jio_common::time::unix_now(), &rec, true);
    blocked(&jio_common::compose::plan(&snap, c, resolved, &cx))
}

/// SIGINT or SIGTERM, whichever comes first.
pub async fn interrupted() -> &'static str {
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

pub fn signal_code(sig: &str) -> u8 {
    if sig == "SIGTERM" {
        exit::SIGTERM
    } else {
        exit::SIGINT
    }
}

/// `jioctl drive`: the driver service. It registers itself (leased), then drives
/// whatever rollout is current while it holds the rollout lock, and stands by while
/// another process holds it. It ends only on SIGTERM or SIGINT (releasing the lock
/// at once), or on an error the store will not get over (a denied request).
pub async fn drive(
    store: &DynStore,
    schema: &Schema,
    role_pattern: &RolePattern,
    ttl: Duration,
    verbose: bool,
    hooks: crate::hooks::HookSettings,
) -> Outcome {
    let me = writes::holder();
    let name = format!("{}-{}", me.host, me.pid);
    let registration = tokio::spawn(register(store.clone(), schema.driver(&name), ttl));
    eprintln!(
        "jioctl drive: driver service {name} started (lease {}); it drives the current rollout whenever it holds the rollout lock, and every active fleet command whenever it holds the command's lock",
        jio_common::duration::format(ttl)
    );
    let (stop_commands, stopping) = tokio::sync::watch::channel(false);
    let commands = tokio::spawn(crate::fleet_commands::drive_all(
        store.clone(),
        schema.clone(),
        role_pattern.clone(),
        ttl,
        stopping,
    ));
    let opts = DriverOpts {
        target: None,
        daemon: true,
        follow: true,
        verbose,
        json: false,
        quiet: false,
        ttl,
        timeout: None,
        clock: std::sync::Arc::new(SystemClock),
        hooks,
    };
    let mut driver = Driver::new(store, schema, role_pattern, opts);
    let out = tokio::select! {
        r = driver.drive() => r.map(|_| ()),
        sig = interrupted() => {
            let held = driver.release_all().await;
            // The commands' drivers release their locks too.
            let _ = stop_commands.send(true);
            let _ = tokio::time::timeout(Duration::from_secs(10), commands).await;
            registration.abort();
            let _ = store.delete(&schema.driver(&name)).await;
            eprintln!(
                "jioctl drive: {sig}: driver service {name} stopped{}",
                if held { "; the rollout lock is released (a standby takes over at once)" } else { "" }
            );
            return Err(Failure::quiet(signal_code(sig)));
        }
    };
    driver.release().await;
    let _ = stop_commands.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), commands).await;
    registration.abort();
    out
}

/// Keeps `/drivers/<name>` alive on its own lease while the service runs; written
/// again when the lease ended (the store was cut off for longer than it).
async fn register(store: DynStore, key: jio_common::keys::Key, ttl: Duration) {
    let record = serde_json::to_string(&writes::holder()).unwrap_or_default();
    loop {
        let lease = match store.grant_lease(ttl).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot register the driver service; trying again");
                tokio::time::sleep(ttl / 3).await;
                continue;
            }
        };
        if let Err(e) = store.put(&key, &record, Some(&lease.id)).await {
            tracing::warn!(error = %e, "cannot register the driver service; trying again");
            tokio::time::sleep(ttl / 3).await;
            continue;
        }
        loop {
            tokio::time::sleep(ttl / 3).await;
            match store.keep_alive(&lease.id).await {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => break,
                Err(e) => tracing::warn!(error = %e, "cannot renew the driver service's lease"),
            }
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

/// How a driver is set up.
struct DriverOpts {
    /// The rollout a following `jioctl` follows; `None`: a driver service.
    target: Option<RolloutId>,
    daemon: bool,
    follow: bool,
    verbose: bool,
    json: bool,
    quiet: bool,
    /// The rollout lock's lease.
    ttl: Duration,
    timeout: Option<Duration>,
    clock: DynClock,
    /// The maintenance hooks it runs while it drives.
    hooks: crate::hooks::HookSettings,
}

/// The driver's shell: everything `next` needs to know, and the I/O it asks for.
struct Driver<'a> {
    store: &'a DynStore,
    schema: &'a Schema,
    role_pattern: &'a RolePattern,
    o: DriverOpts,
    lock: Option<RolloutLock>,
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
    /// The rules of the rollout being driven, parsed once.
    rules: Option<(RolloutId, Result<Rules, rules::RulesError>)>,
    /// When hosts last finished, for the progress deadline (per rollout).
    clock: (Option<RolloutId>, ProgressClock),
    /// Unix time a pass is due without any change (a pause's expiry, the deadline).
    wake_at: Option<u64>,
    /// Hosts in flight at the last pass.
    in_flight: usize,
    /// The rules' `max_failures` when the rollout stopped on failures.
    max_failures: u64,
    /// The maintenance hooks this process runs.
    hooks: crate::hooks::runs::HookRuns,
}

impl<'a> Driver<'a> {
    fn new(
        store: &'a DynStore,
        schema: &'a Schema,
        role_pattern: &'a RolePattern,
        o: DriverOpts,
    ) -> Driver<'a> {
        // `-v` prints every pass's plan: lines, not bars, around it.
        let tty = std::io::stdout().is_terminal() && !o.json && !o.daemon && !o.verbose;
        let me = writes::holder();
        let hooks = crate::hooks::runs::HookRuns::new(o.hooks.clone(), format!("{}-{}", me.host, me.pid));
        Driver {
            store,
            schema,
            role_pattern,
            lock: None,
            deadline: o.timeout.and_then(|t| Instant::now().checked_add(t)),
            progress: if o.quiet {
                Progress::silent()
            } else if o.daemon {
                Progress::new(tty)
            } else {
                // A follower's log lines are its notes (the service's go to its log).
                let mut p = Progress::new(tty);
                p.take_log_lines();
                p
            },
            o,
            view: None,
            watch: None,
            last_revision: 0,
            waiting: Waiting::default(),
            unreachable_since: None,
            store_error: None,
            rules: None,
            clock: (None, ProgressClock::default()),
            wake_at: None,
            in_flight: 0,
            max_failures: 0,
            hooks,
        }
    }

    /// Runs steps until the rollout ends (a driver service: until an error).
    /// Drives (or follows) until the rollout ends; the progress bars are finished
    /// before the caller says how it ended.
    async fn drive(&mut self) -> Result<Ending, Failure> {
        let ended = self.passes().await;
        match &ended {
            Ok(Ending::Finished { .. } | Ending::Stopped { .. } | Ending::Ended(_)) => self.progress.finish(),
            // This process stopped; the rollout did not (its end says why and what next).
            _ => self.progress.went_on(None),
        }
        ended
    }

    async fn passes(&mut self) -> Result<Ending, Failure> {
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
            follow: self.o.follow,
            daemon: self.o.daemon,
            deadline_passed: self.deadline.is_some_and(|d| now >= d),
            unreachable_for: self.unreachable_since.map(|t| now.saturating_duration_since(t)),
        }
    }

    /// Stops this process's hooks (the next driver runs them again), then releases
    /// the lock.
    async fn release(&mut self) {
        let stopped = self.hooks.stop_all().await;
        if stopped > 0 {
            self.note(&format!(
                "stopped {stopped} maintenance hook(s) this process ran; whoever drives next runs them again"
            ));
        }
        if let Some(l) = self.lock.take() {
            l.release().await;
        }
    }

    /// Releases the lock, including one this process wrote but was interrupted
    /// before it learned so: whether it held it.
    async fn release_all(&mut self) -> bool {
        let held = self.lock.is_some();
        self.release().await;
        writes::release_own(self.store, self.schema).await || held
    }

    /// A line for the daemon's log or the follower's output.
    fn note(&mut self, line: &str) {
        if self.o.daemon {
            eprintln!("jioctl drive: {line}");
        } else if !self.o.quiet {
            self.progress.note(line);
        }
    }

    /// What Ctrl-C (or SIGTERM) says: what goes on without this process, and who
    /// drives it now (`now`).
    fn interrupted_message(&self, sig: &str, record: &RolloutRecord, driving: bool, now: &str) -> String {
        if driving {
            format!(
                "{sig}: jioctl stopped driving rollout {} to {}; the rollout lock is released. {}; {now}; `jioctl rollout pause` or `jioctl rollout abort` stops it",
                record.id,
                record.version,
                crate::render::in_flight_finish(self.in_flight),
            )
        } else {
            format!(
                "{sig}: stopped following rollout {} to {}; it goes on, {now} (`jioctl rollout status` shows it)",
                record.id, record.version
            )
        }
    }

    /// Who drives the rollout now that this process let go, as read from the store
    /// (within a few seconds: a store that does not answer is said so).
    async fn who_drives_now(&self, record: &RolloutRecord) -> String {
        let read = Snapshot::read(self.store, self.schema);
        match tokio::time::timeout(Duration::from_secs(3), read).await {
            Ok(Ok(snap)) => who_drives(&snap, record),
            _ => format!(
                "the store did not answer, so who drives it now is not known (`jioctl rollout status` shows it; `jioctl upgrade {}{}` with the same rules drives it)",
                record.version,
                stage_args(record)
            ),
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
                    self.note("store reachable again");
                }
                if let (true, PassOutcome::Continue { waiting: Some(line) }) = (self.o.follow, &outcome)
                    && self.waiting.note(line.clone(), Instant::now())
                {
                    self.note(&format!("waiting for: {line}"));
                }
                Ok(Observed::Pass(outcome))
            }
            Err(PassError::Store(e)) if e.kind() == ErrorKind::Unavailable => {
                if self.o.follow && self.unreachable_since.is_none() {
                    self.note(&format!("{e}; retrying"));
                    self.unreachable_since = Some(Instant::now());
                }
                self.store_error = Some(e);
                Ok(Observed::Unreachable)
            }
            Err(PassError::Store(e)) => Err(e.into()),
            Err(PassError::Rules(e)) => {
                if self.o.daemon {
                    let line = format!(
                        "the current rollout's rules no longer fit the fleet: {e}; `jioctl rollout abort` ends it"
                    );
                    if self.waiting.note(line.clone(), Instant::now()) {
                        self.note(&line);
                    }
                }
                Ok(Observed::RulesInvalid(e))
            }
        }
    }

    /// The lock's lease ended or the fence found it gone: take it again before
    /// writing anything.
    async fn retake(&mut self) -> Result<Observed, Failure> {
        self.release().await;
        match RolloutLock::try_take(self.store, self.schema, self.o.ttl).await? {
            LockOutcome::Taken(l) => {
                self.note(
                    "the rollout lock's lease had ended (this process was paused or cut off from the store); took the lock again, planning afresh",
                );
                self.lock = Some(l);
                Ok(Observed::Retaken)
            }
            LockOutcome::Held(holder) => {
                if self.o.daemon {
                    self.note(&format!(
                        "lost the rollout lock to {}; standing by",
                        writes::describe(&holder)
                    ));
                }
                Ok(Observed::LockHeld(holder))
            }
        }
    }
}

/// Passes: read (or keep) the view, decide, write at most one fenced change.
impl Driver<'_> {
    async fn pass(&mut self) -> Result<PassOutcome, PassError> {
        let mut view = match self.view.take() {
            Some(v) => v,
            None => {
                // Something may have been missed: read everything again. The watch
                // opens first, from now, so that it delivers every change after the
                // read (events from before it are skipped key by key). A watch from
                // an older revision would do as well, but etcd serves one that starts
                // behind its current revision only at its next sync of such watches,
                // up to 100 ms later: the first completion of every wave would wait
                // for it.
                self.watch = None;
                self.watch = Some(self.store.watch(&self.schema.root(), 0).await?);
                LiveView::read(self.store, self.schema).await?
            }
        };
        let outcome = self.pass_on(view.snapshot(self.schema, self.role_pattern)).await;
        if matches!(outcome, Ok(PassOutcome::Again)) {
            view = LiveView::read(self.store, self.schema).await?;
        }
        self.view = Some(view);
        outcome
    }

    /// What this follower says if its stdout closes under it: it stops, and who
    /// drives the rollout then.
    fn closing_words(&self, snap: &Snapshot) {
        let Some(rec) = snap
            .rollout
            .as_ref()
            .and_then(|c| c.ok())
            .filter(|r| self.o.target.as_ref() == Some(&r.id) && r.state.active() && !self.o.daemon)
        else {
            crate::exit::set_closing_words(None);
            return;
        };
        let services: Vec<&str> = snap.drivers.keys().map(String::as_str).collect();
        let next = if services.is_empty() {
            format!(
                "nobody drives it now: run `jioctl upgrade {}{}` with the same rules, or start `jioctl drive`",
                rec.version,
                stage_args(rec)
            )
        } else {
            format!("the driver service(s) {} drive it now", services.join(", "))
        };
        crate::exit::set_closing_words(Some(format!(
            "its output was closed (a pager quit?): stopped {} rollout {} to {}; it stays recorded{}; {next}",
            if self.lock.is_some() {
                "driving"
            } else {
                "following"
            },
            rec.id,
            rec.version,
            if self.lock.is_some() {
                format!(
                    " and its lock is free once its lease ends ({} s)",
                    self.o.ttl.as_secs()
                )
            } else {
                String::new()
            }
        )));
    }

    async fn pass_on(&mut self, snap: &Snapshot) -> Result<PassOutcome, PassError> {
        self.last_revision = snap.revision;
        self.wake_at = None;
        let now = self.o.clock.unix_now();
        let who = self.who(snap);
        self.closing_words(snap);
        let hosts = fleet::classify(snap);
        self.in_flight = hosts
            .iter()
            .filter(|h| h.state.in_flight() && h.state != HostState::Failed)
            .count();
        // An ended or replaced rollout's hooks run no further.
        self.hooks.stop_unless(snap.active_rollout_id());
        match next::step(snap, self.o.target.as_ref(), who, now) {
            Step::Idle => {
                if self.o.daemon && self.lock.is_some() {
                    // Agents hold their health checks while a driver holds the lock.
                    self.release().await;
                    self.note("no rollout is active: released the rollout lock; standing by");
                }
                Ok(PassOutcome::Idle)
            }
            Step::Ended => {
                let rec = match &self.o.target {
                    Some(id) => rollouts::read_record(self.store, self.schema, id).await?,
                    None => None,
                };
                Ok(PassOutcome::Ended(rec.map(Box::new)))
            }
            Step::Unusable(problem) => Ok(PassOutcome::Continue {
                waiting: Some(format!(
                    "{problem}: the rollout admits nothing until it is fixed (`jioctl rollout abort` ends it)"
                )),
            }),
            Step::TakeLock => Ok(self.take().await?),
            Step::Watch(rec) => Ok(self.watch_pass(snap, &hosts, &rec, now)),
            Step::Paused(rec) => {
                // Hosts in flight finish, their hooks included.
                if let Some(outcome) = self.hook_pass(snap, &hosts, &rec, now).await? {
                    return Ok(outcome);
                }
                self.progress.update(snap, &hosts);
                if let RolloutState::Paused { until: Some(t), .. } = &rec.state {
                    self.wake_at = Some(*t);
                }
                Ok(PassOutcome::Continue {
                    waiting: Some(render::paused_line(&rec, self.in_flight)),
                })
            }
            Step::Stuck(rec) => Ok(PassOutcome::Stuck(match rec.state {
                RolloutState::Stuck { holding } => holding,
                _ => BTreeMap::new(),
            })),
            Step::Expired(rec) => {
                let i = intent::resume(self.schema, &rec, now);
                Ok(self.act(snap, &hosts, i).await?)
            }
            Step::VersionMoved(rec) => {
                let i = intent::version_moved(self.schema, snap, &rec, now);
                Ok(self.act(snap, &hosts, i).await?)
            }
            Step::Plan(rec) => self.plan_pass(snap, &hosts, &rec, now).await,
        }
    }

    /// Whether this process holds the lock, and whether it may take it. A lock
    /// left by a process of this host that no longer exists is taken over at once
    /// (`try_take` checks it again), not after its lease.
    fn who(&self, snap: &Snapshot) -> Who {
        let free = match (&snap.lock_key, &snap.lock) {
            (None, _) => true,
            // Unreadable: no driver wrote it, it would never be released.
            (Some(_), None) => true,
            (Some(_), Some(holder)) => writes::holder_is_dead(holder),
        };
        Who {
            holding: self.lock.is_some(),
            may_take: free && (self.o.daemon || snap.drivers.is_empty()),
        }
    }

    /// Following a rollout another process drives: what it waits for.
    fn watch_pass(
        &mut self,
        snap: &Snapshot,
        hosts: &[HostStatus],
        rec: &RolloutRecord,
        now: u64,
    ) -> PassOutcome {
        self.progress.update(snap, hosts);
        if let Some(outcome) = self.watch_composable(snap, hosts, rec, now) {
            return outcome;
        }
        let plan = self.plan_of(snap, hosts, rec, now).ok();
        PassOutcome::Continue {
            waiting: Some(format!(
                "rollout {} {}: {}",
                rec.id,
                driven_by(snap),
                plan.map(|(p, ..)| render::waiting_line_forever(hosts, &p))
                    .unwrap_or_else(|| "its rules do not fit the fleet".into())
            )),
        }
    }

    /// Takes the lock when it is free: plan at once, or say who has it.
    async fn take(&mut self) -> Result<PassOutcome, StoreError> {
        match RolloutLock::try_take(self.store, self.schema, self.o.ttl).await? {
            LockOutcome::Taken(l) => {
                self.lock = Some(l);
                let what = match &self.o.target {
                    Some(id) => format!("driving rollout {id} (no driver service holds it)"),
                    None => "took the rollout lock: driving the current rollout".into(),
                };
                self.note(&what);
                Ok(PassOutcome::Again)
            }
            LockOutcome::Held(holder) => Ok(PassOutcome::Continue {
                waiting: Some(format!("the rollout lock, held by {}", writes::describe(&holder))),
            }),
        }
    }

    /// The rollout's rules, parsed once per rollout, resolved for this fleet.
    fn rules_of(&mut self, rec: &RolloutRecord) -> Result<Rules, rules::RulesError> {
        if self.rules.as_ref().is_none_or(|(id, _)| id != &rec.id) {
            let parsed = Rules::parse(&rec.rules.to_string());
            self.rules = Some((rec.id.clone(), parsed));
        }
        match &self.rules {
            Some((_, r)) => r.clone(),
            None => Err(rules::RulesError(vec!["no rules".into()])),
        }
    }

    /// The rollout's rules, and the rules resolved for the fleet's roles.
    fn resolved_of(
        &mut self,
        hosts: &[HostStatus],
        rec: &RolloutRecord,
    ) -> Result<(Rules, rules::Resolved), rules::RulesError> {
        let rules = self.rules_of(rec)?;
        let roles = hosts.iter().map(|h| h.role.clone()).collect();
        let resolved = rules.resolve(&roles)?;
        Ok((rules, resolved))
    }

    /// The rolling plan of this pass, with the rules it was made under.
    fn plan_of(
        &mut self,
        snap: &Snapshot,
        hosts: &[HostStatus],
        rec: &RolloutRecord,
        now: u64,
    ) -> Result<(Plan, Rules, rules::Resolved), rules::RulesError> {
        let (rules, resolved) = self.resolved_of(hosts, rec)?;
        let hooked = self.hooks.settings.hooked_roles();
        let cx = jio_common::plan::Context::of_rollout(now, rec, false).with_hook_roles(&hooked);
        Ok((
            jio_common::plan::plan(snap, hosts, &resolved, &cx),
            rules,
            resolved,
        ))
    }

    /// Notes how much has finished, for the progress deadline (per rollout):
    /// whether that changed since the last pass.
    fn progressed(&mut self, rec: &RolloutRecord, finished: usize, now: u64) -> bool {
        if self.clock.0.as_ref() != Some(&rec.id) {
            self.clock = (Some(rec.id.clone()), ProgressClock::default());
        }
        self.clock.1.note(finished, now)
    }

    /// A rolling rollout's pass: plan, decide (`intent::rolling`), act.
    async fn plan_pass(
        &mut self,
        snap: &Snapshot,
        hosts: &[HostStatus],
        rec: &RolloutRecord,
        now: u64,
    ) -> Result<PassOutcome, PassError> {
        if let Some(outcome) = self.hook_pass(snap, hosts, rec, now).await? {
            return Ok(outcome);
        }
        if self.rules_of(rec).is_ok_and(|r| r.compose.is_some()) {
            if let Some(why) = hook_pass::composable_refusal(&self.hooks.settings, hosts) {
                return Ok(PassOutcome::Continue {
                    waiting: Some(format!(
                        "rollout {}: {why}: nothing is admitted (`jioctl rollout abort` ends it; drive it from a configuration without those [hooks.*])",
                        rec.id
                    )),
                });
            }
            return self.compose_pass(snap, hosts, rec, now).await;
        }
        let (mut plan, rules, resolved) = self.plan_of(snap, hosts, rec, now).map_err(PassError::Rules)?;
        // Rules whose intent is unclear admit nothing unless the operator forced
        // them; what the plan withdraws (disarms, held hosts) is still written.
        let refused = intent::refusal(&rules, &resolved, hosts, rec);
        if refused.is_some() {
            plan.enable_roles.clear();
            plan.enable_hosts.clear();
            plan.clear_host_keys.clear();
        }
        if self.o.verbose {
            crate::say!("pass at revision {}:", snap.revision);
            crate::say_text!("{}", render::plan_table(&plan));
        }
        let finished = hosts
            .iter()
            .filter(|h| matches!(h.state, HostState::Upgraded | HostState::Failed))
            .count();
        let progressed = self.progressed(rec, finished, now);
        if plan.waits_by_design() {
            // Not stuck: waiting for a window, the canaries or a soak.
            self.clock.1.since = now;
        }
        // A soak ending or a window opening changes the plan without any write.
        self.wake_at = plan.wake_at;
        // A host whose hook runs here is never started twice (its record may lag).
        let local = self.hooks.local();
        let hooks = self.hook_step(&local, now).admissions(snap, rec, &mut plan);
        let decided = intent::rolling(&intent::Rolling {
            schema: self.schema,
            snap,
            hosts,
            rec,
            rules: &rules,
            resolved: &resolved,
            plan: &plan,
            hooks: &hooks,
            refused: refused.as_deref(),
            clock: &self.clock.1,
            progressed,
            now,
        });
        let outcome = self.act(snap, hosts, decided).await?;
        if matches!(outcome, PassOutcome::Stopped { .. }) {
            self.max_failures = resolved.max_failures.of(hosts.len(), false);
        }
        Ok(outcome)
    }

    /// The hooks' step of a pass, over this process's hooks `local`.
    fn hook_step<'b>(
        &'b self,
        local: &'b BTreeMap<jio_common::names::HostName, crate::hooks::decide::Local>,
        now: u64,
    ) -> hook_pass::HookPass<'b> {
        hook_pass::HookPass {
            schema: self.schema,
            settings: &self.hooks.settings,
            local,
            me: &self.hooks.me,
            now,
        }
    }

    /// Records ended hooks, starts again the ones left running, starts `after`
    /// hooks that are due: `Some` when it wrote (the pass ends there), `None` when
    /// there was nothing to do (the pass plans). Only the lock's holder runs hooks.
    async fn hook_pass(
        &mut self,
        snap: &Snapshot,
        hosts: &[HostStatus],
        rec: &RolloutRecord,
        now: u64,
    ) -> Result<Option<PassOutcome>, StoreError> {
        if self.lock.is_none() {
            return Ok(None);
        }
        let local = self.hooks.local();
        let (progress, cannot) = self.hook_step(&local, now).progress(snap, rec);
        for line in &cannot {
            if self.hooks.first_time(line) {
                self.note(line);
            }
        }
        match progress {
            hook_pass::Progress::Plan { forget } => {
                self.hooks.forget(&forget);
                Ok(None)
            }
            hook_pass::Progress::Write(i) => Ok(Some(self.act(snap, hosts, i).await?)),
        }
    }

    /// Following a composable rollout another process drives: what it waits for,
    /// from the composable planner, and the end of a follower's stages when they
    /// are done. `None`: not a composable rollout.
    fn watch_composable(
        &mut self,
        snap: &Snapshot,
        hosts: &[HostStatus],
        rec: &RolloutRecord,
        now: u64,
    ) -> Option<PassOutcome> {
        let (rules, resolved) = self.resolved_of(hosts, rec).ok()?;
        let c = rules.compose.as_ref()?;
        let cx = jio_common::plan::Context::of_rollout(now, rec, true);
        let composed = jio_common::compose::plan(snap, c, &resolved, &cx);
        if let jio_common::compose::Standing::StagesDone { not_started } = &composed.standing
            && self.o.target.is_some()
        {
            self.note(&intent::stages_done_line(rec, not_started));
            return Some(PassOutcome::StagesDone(not_started.clone()));
        }
        Some(PassOutcome::Continue {
            waiting: Some(format!(
                "rollout {} {}: {}",
                rec.id,
                driven_by(snap),
                render::compose_waiting(&composed)
            )),
        })
    }

    /// A composable rollout's pass: plan, decide (`intent::composable`), act.
    async fn compose_pass(
        &mut self,
        snap: &Snapshot,
        hosts: &[HostStatus],
        rec: &RolloutRecord,
        now: u64,
    ) -> Result<PassOutcome, PassError> {
        let (rules, resolved) = self.resolved_of(hosts, rec).map_err(PassError::Rules)?;
        let Some(c) = rules.compose.as_ref() else {
            return Ok(PassOutcome::Replan);
        };
        let cx = jio_common::plan::Context::of_rollout(now, rec, true);
        let composed = jio_common::compose::plan(snap, c, &resolved, &cx);
        if self.o.verbose {
            crate::say!("pass at revision {}:", snap.revision);
            crate::say_text!("{}", render::stages(&composed));
            crate::say_text!("{}", render::plan_table(&composed.plan));
        }
        let progressed = self.progressed(rec, composed.progress, now);
        self.wake_at = composed.plan.wake_at;
        self.progress.update(snap, hosts);
        if !composed.writes()
            && matches!(
                composed.standing,
                jio_common::compose::Standing::StagesDone { .. }
            )
        {
            // Waiting for an operator by design: not stuck.
            self.clock.1.since = now;
        }
        let decided = intent::composable(&intent::Composable {
            schema: self.schema,
            rec,
            composed: &composed,
            max_failures: resolved.max_failures.of(hosts.len(), false),
            following: self.o.target.is_some(),
            clock: &self.clock.1,
            progressed,
            limit: rules.progress_deadline,
            now,
        });
        Ok(self.act(snap, hosts, decided).await?)
    }

    /// Applies what a pass decided: its writes in one transaction fenced on what
    /// `snap` read and on still holding the lock, then its notes; or the end of the
    /// pass when the write did not land (replan, or the lock lost).
    async fn act(
        &mut self,
        snap: &Snapshot,
        hosts: &[HostStatus],
        i: intent::Intent,
    ) -> Result<PassOutcome, StoreError> {
        if i.refresh_progress {
            self.progress.update(snap, hosts);
        }
        if let Some(t) = i.wake_at {
            self.wake_at = Some(self.wake_at.map_or(t, |w| w.min(t)));
        }
        if !i.ops.is_empty()
            && let Some(end) = self.fenced(i.compares, i.ops, snap).await?
        {
            return Ok(end);
        }
        // Recorded running: the hooks start now.
        if let Some(lock) = &self.lock {
            for s in i.starts {
                self.hooks.start(s, lock.guard());
            }
        }
        self.hooks.forget(&i.forget);
        for note in i.notes {
            match note {
                intent::Note::Say(line) => self.note(&line),
                intent::Note::Admitted(a) if self.o.daemon => eprintln!("jioctl drive: {a}"),
                intent::Note::Admitted(a) => self.progress.note(&a),
            }
        }
        Ok(i.outcome)
    }

    /// Writes `ops` fenced on what `snap` read and on still holding the lock: `None`
    /// when applied, or the end of the pass (replan, or the lock lost).
    async fn fenced(
        &self,
        compares: Vec<jio_common::store::Compare>,
        ops: Vec<Op>,
        snap: &Snapshot,
    ) -> Result<Option<PassOutcome>, StoreError> {
        let Some(lock) = &self.lock else {
            return Ok(Some(PassOutcome::LockLost));
        };
        Ok(
            match writes::apply_fenced_when(self.store, self.schema, compares, ops, snap.epoch, lock).await? {
                Fenced::Applied => None,
                Fenced::Moved => Some(PassOutcome::Replan),
                Fenced::LockLost => Some(PassOutcome::LockLost),
            },
        )
    }
}

/// Who drives a rollout this process follows.
fn driven_by(snap: &Snapshot) -> String {
    match (&snap.lock_key, snap.drivers.keys().cloned().collect::<Vec<_>>()) {
        (None, services) if !services.is_empty() => {
            format!(
                "waits for the driver service(s) {} to take it",
                services.join(", ")
            )
        }
        _ => format!("is driven by {}", writes::describe(&snap.lock)),
    }
}

/// Who drives `record` now, in the words the Ctrl-C message and the bars use:
/// the holder of the rollout lock, the driver services that take it over, or
/// nobody (and which command continues it).
fn who_drives(snap: &Snapshot, record: &RolloutRecord) -> String {
    let services: Vec<String> = snap.drivers.keys().cloned().collect();
    match (&snap.lock_key, services.is_empty()) {
        (Some(_), _) => format!("driven by its driver {}", writes::describe(&snap.lock)),
        (None, false) => format!(
            "driven by its driver: the driver service(s) {} take it over",
            services.join(", ")
        ),
        (None, true) => format!(
            "nobody drives it now: nothing more is admitted until a driver takes it: run `jioctl upgrade {}{}` again with the same rules (it follows and drives it), or start `jioctl drive`",
            record.version,
            stage_args(record)
        ),
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
                Wake::Event(ev) => events.push(ev),
                // The view is up to date: a pass records the hook.
                Wake::HookEnded => return Ok(()),
                Wake::Due => {
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

    /// The next event; `Due` when the resync, the reminder or the deadline is due
    /// first (or the watch ended: it is opened again); `HookEnded` when a hook of
    /// this process ended first.
    async fn next_event(&mut self) -> Result<Wake, Failure> {
        let now = Instant::now();
        let mut nap = Self::RESYNC.min(self.waiting.until_reminder(now));
        if let Some(d) = self.deadline {
            nap = nap.min(d.saturating_duration_since(now));
        }
        if let Some(t) = self.wake_at {
            // A second past it, so that the pass sees it due.
            let secs = t.saturating_sub(self.o.clock.unix_now()).saturating_add(1);
            nap = nap.min(Duration::from_secs(secs));
        }
        let Some(w) = self.watch.as_mut() else {
            return Ok(Wake::Due);
        };
        let hooks = &mut self.hooks;
        let next = tokio::select! {
            next = tokio::time::timeout(nap.max(Duration::from_millis(10)), w.next()) => next,
            _ = hooks.ended_one() => return Ok(Wake::HookEnded),
        };
        match next {
            Ok(Some(Ok(ev))) => Ok(Wake::Event(ev)),
            Ok(Some(Err(e))) => Err(e.into()),
            Ok(None) => {
                self.watch = None;
                Ok(Wake::Due)
            }
            Err(_) => Ok(Wake::Due),
        }
    }
}

/// What ended a wait for the next event.
enum Wake {
    Event(WatchEvent),
    Due,
    HookEnded,
}

/// The end: what to say, and the final status.
impl Driver<'_> {
    async fn conclude(&self, ending: Ending, record: &RolloutRecord) -> Outcome {
        // Following ends here: a closed output no longer stops anything.
        crate::exit::set_closing_words(None);
        let v = &record.version;
        let id = &record.id;
        let code = ending.code();
        let say = |msg: String| Err(Failure::new(code, msg));
        if ending.shows_status() && !self.o.quiet {
            self.finish().await?;
        }
        match ending {
            Ending::StagesDone(left) => {
                if !self.o.quiet {
                    crate::say!(
                        "the stages of rollout {id} started so far are done; not started: {} (`jioctl upgrade {v} --stage {}` with the same rules continues this rollout)",
                        left.join(", "),
                        left.first().map_or("", |s| s.as_str())
                    );
                }
                Ok(())
            }
            Ending::Applied | Ending::Finished { .. } => {
                if code == exit::OK {
                    if matches!(ending, Ending::Finished { .. }) {
                        self.prune_package_sets().await;
                    }
                    Ok(())
                } else {
                    Err(Failure::quiet(code))
                }
            }
            Ending::Stopped { failures } => say(self.stopped(record, &failures)),
            Ending::Ended(r) => match r.as_deref() {
                Some(RolloutRecord {
                    state: RolloutState::Done,
                    ..
                }) => {
                    self.prune_package_sets().await;
                    Ok(())
                }
                Some(r) => say(ended_message(r)),
                None => say(format!(
                    "rollout {id} to {v} is no longer the current rollout, and its record cannot be read"
                )),
            },
            Ending::Stuck(holding) => {
                let mut msg = format!(
                    "rollout {id} to {v} is stuck: no host finished within its progress_deadline; {} host(s) hold it:",
                    holding.len()
                );
                for (h, why) in &holding {
                    msg.push_str(&format!("\n  {h}: {why}"));
                }
                msg.push_str("\n`jioctl rollout resume` gives it another progress_deadline; `jioctl rollout abort` ends it");
                say(msg)
            }
            Ending::TimedOut(During::Waiting) => say(format!(
                "--timeout passed; the rollout to {v} has not finished, waiting for {}",
                self.waiting.last.as_deref().unwrap_or("hosts still upgrading")
            )),
            Ending::TimedOut(During::Unreachable) => {
                say("--timeout passed while the store was unreachable".into())
            }
            Ending::LockLost(holder) => say(format!(
                "lost the rollout lock (its lease ended while this process was paused or cut off from the store); it is now held by {}; this run stops without writing anything more (rollout {id} goes on under that driver)",
                writes::describe(&holder)
            )),
            Ending::InvalidRules(e) => say(format!(
                "rollout {id} to {v}: its rules no longer fit the fleet: {e}; it stays recorded but admits nothing (hosts in flight finish); `jioctl rollout abort` ends it and resets the enable keys"
            )),
        }
    }

    /// After a rollout ended well, the package sets no host uses any more go
    /// (best effort: a failure is said and changes nothing else).
    async fn prune_package_sets(&self) {
        match crate::snapshots::prune(self.store, self.schema).await {
            Ok(gone) if !gone.is_empty() && !self.o.quiet => {
                crate::say!(
                    "deleted {} stored package set(s) no host refers to any more",
                    gone.len()
                );
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot delete the package sets no host uses (jioctl repo prune does it later)")
            }
        }
    }

    fn stopped(&self, record: &RolloutRecord, failures: &[(String, String)]) -> String {
        let mut msg = format!(
            "rollout {} to {} stopped: {} host(s) failed (max_failures {}); hosts already running finish their run",
            record.id,
            record.version,
            failures.len(),
            self.max_failures
        );
        for line in crate::render::failure_lines(failures.iter().map(|(h, why)| (h, why))) {
            msg.push_str(&format!("\n{line}"));
        }
        let pairs: Vec<(&String, &String)> = failures.iter().map(|(h, why)| (h, why)).collect();
        for line in crate::render::retry_lines(&pairs) {
            msg.push_str(&format!("\n{line}"));
        }
        msg
    }

    async fn finish(&self) -> Result<(), StoreError> {
        let mut snap = Snapshot::read(self.store, self.schema).await?;
        snap.role_pattern = self.role_pattern.clone();
        let hosts = fleet::classify(&snap);
        let now = self.o.clock.unix_now();
        let adm = crate::status::admission_of(&snap, &hosts, now);
        if self.o.json {
            let doc = crate::status_json::StatusJson::document(&snap, &hosts, &adm);
            println!("{}", doc.render(true));
        } else {
            print!(
                "{}",
                crate::status::to_text(
                    &snap,
                    &hosts,
                    &adm,
                    &crate::status::store_label(self.store.url(), self.schema),
                    crate::status::Layout::of_stdout(false)
                )
            );
        }
        Ok(())
    }
}

/// Why a rollout this process followed ended elsewhere.
fn ended_message(r: &RolloutRecord) -> String {
    let (id, v) = (&r.id, &r.version);
    match &r.state {
        RolloutState::Failed { hosts } => {
            let mut msg = format!("rollout {id} to {v} failed: {} host(s) failed", hosts.len());
            for line in crate::render::failure_lines(hosts) {
                msg.push_str(&format!("\n{line}"));
            }
            let pairs: Vec<(&String, &String)> = hosts.iter().collect();
            for line in crate::render::retry_lines(&pairs) {
                msg.push_str(&format!("\n{line}"));
            }
            msg
        }
        RolloutState::Aborted {
            emergency: true, by, ..
        } => format!(
            "the rollout to {v} was halted by an emergency stop: {by} ran global-disable-puppet; every enable key was reset and nothing more is enabled (run `jioctl upgrade {v}` again to start it again)"
        ),
        RolloutState::Aborted {
            superseded_by: Some(next),
            by,
            ..
        } => format!("rollout {id} to {v} was replaced by rollout {next}, started by {by}"),
        RolloutState::Aborted { by, reason, .. } => format!(
            "rollout {id} to {v} was aborted by {by}{}; the fleet is left as it is, every enable key reset{}",
            reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default(),
            r.previous
                .as_ref()
                .map(|p| format!("; `jioctl rollout undo` goes back to {p}"))
                .unwrap_or_default()
        ),
        other => format!(
            "rollout {id} to {v} is no longer the current rollout (it is {} in its record)",
            other.name()
        ),
    }
}
