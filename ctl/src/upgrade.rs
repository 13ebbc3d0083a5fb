//! `jioctl upgrade`: set the desired version and drive the rollout under the rules.
//!
//! Each pass reads a snapshot, plans with the pure planner, and applies the plan in
//! transactions fenced on the plan epoch and on still holding the rollout lock; a
//! pass that lost the race plans again, a driver that lost the lock takes it again
//! or stops. With `--retry` passes repeat, woken by a watch on the namespace (not a
//! timer), until nothing is pending or upgrading, failures stop the rollout, an
//! emergency stop halts it, or `--timeout` passes. While it waits it says on what.
//! The last pass resets the enable keys, so a finished rollout leaves nothing armed.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;

use jio_common::fleet::{self, HALT, HostState, HostStatus, LockRecord, Snapshot};
use jio_common::gate::KeyState;
use jio_common::keys::{Key, Outcome, Parsed, Schema};
use jio_common::names::{Role, Version};
use jio_common::rules::{self, Plan, Rules};
use jio_common::store::{Compare, DynStore, ErrorKind, KeyValue, Op, Revision, StoreError, Txn, WatchEvent};

use crate::cli::exit;
use crate::progress::Progress;
use crate::writes::{self, Fenced, LockOutcome, RolloutLock};

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

/// The keys a snapshot reads, kept up to date from the watch so that a pass costs
/// no store request (a full read only at the start, after a reset, and when the
/// desired version changes: failure entries are read per version).
struct LiveView {
    kvs: BTreeMap<Key, KeyValue>,
    revision: Revision,
    /// The oldest revision of the listings: the watch starts after it, so that no
    /// change between two listings is missed (events already seen are skipped).
    watch_from: Revision,
}

impl LiveView {
    async fn read(store: &DynStore, schema: &Schema) -> Result<LiveView, StoreError> {
        let (kvs, revisions) = Snapshot::read_kvs_at(store, schema, None).await?;
        Ok(LiveView {
            kvs: kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect(),
            revision: revisions.iter().copied().max().unwrap_or(0),
            watch_from: revisions.iter().copied().min().unwrap_or(0),
        })
    }

    fn snapshot(&self, schema: &Schema) -> Snapshot {
        let mut s = Snapshot::from_kvs(schema, self.kvs.values());
        s.revision = self.revision;
        s
    }

    /// Applies one event: whether it changed what a plan depends on, and whether a
    /// full read is needed.
    fn apply(&mut self, schema: &Schema, ev: WatchEvent) -> Applied {
        self.revision = self.revision.max(ev.revision());
        let relevant = |k: &Key| {
            !matches!(
                schema.parse(k),
                None | Some(Parsed::ActiveRole(..))
                    | Some(Parsed::Provisioned(..))
                    | Some(Parsed::Status(_, Outcome::Success, ..))
            )
        };
        match ev {
            WatchEvent::Put(kv) => {
                if !relevant(&kv.key) {
                    return Applied::Nothing;
                }
                let old = self.kvs.get(&kv.key);
                if old.is_some_and(|o| o.mod_revision >= kv.mod_revision) {
                    return Applied::Nothing; // already in a listing
                }
                let changed = old.map(|o| (&o.value, o.not_text)) != Some((&kv.value, kv.not_text));
                let version_changed = schema.parse(&kv.key) == Some(Parsed::CurrentVersion) && changed;
                self.kvs.insert(kv.key.clone(), kv);
                if version_changed {
                    Applied::Reread
                } else if changed {
                    Applied::Changed
                } else {
                    Applied::Nothing
                }
            }
            WatchEvent::Delete { key, revision } => {
                if self.kvs.get(&key).is_some_and(|o| o.mod_revision > revision) {
                    return Applied::Nothing; // written again after this delete
                }
                if schema.parse(&key) == Some(Parsed::CurrentVersion) {
                    Applied::Reread
                } else if self.kvs.remove(&key).is_some() {
                    Applied::Changed
                } else {
                    Applied::Nothing
                }
            }
            WatchEvent::Reset { .. } => Applied::Reread,
        }
    }
}

/// What one watch event did to the live view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Applied {
    Nothing,
    Changed,
    Reread,
}

/// How long `--retry` keeps going while the store is unreachable.
const STORE_PATIENCE: Duration = Duration::from_secs(300);
/// While waiting, what blocks the rollout is printed on every change and at least
/// this often.
const WAITING_REMINDER: Duration = Duration::from_secs(60);

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

fn print_plan(plan: &Plan) {
    for g in &plan.groups {
        let limit = g
            .limit
            .map(|l| l.to_string())
            .unwrap_or_else(|| "unlimited".into());
        let blocked = if g.blocked > 0 {
            format!(" blocked {}", g.blocked)
        } else {
            String::new()
        };
        println!(
            "  {:<16} limit {:<9} upgraded {:<4} in flight {:<4} pending {:<4}{blocked} -> {}",
            g.group, limit, g.upgraded, g.in_flight, g.pending, g.action
        );
    }
}

fn admitted(plan: &Plan) -> Option<String> {
    let mut parts = Vec::new();
    if !plan.enable_roles.is_empty() {
        parts.push(format!(
            "role {}",
            plan.enable_roles
                .iter()
                .map(Role::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !plan.enable_hosts.is_empty() {
        parts.push(format!(
            "host {}",
            plan.enable_hosts
                .iter()
                .map(|h| h.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    (!parts.is_empty()).then(|| format!("enabled {}", parts.join("; ")))
}

/// At most this many hosts are named per kind in a waiting line.
const NAMED: usize = 8;

fn named(hosts: &[&HostStatus], with_reason: bool) -> String {
    let mut parts: Vec<String> = hosts
        .iter()
        .take(NAMED)
        .map(|h| match (&h.reason, with_reason) {
            (Some(r), true) => format!("{} ({r})", h.host),
            _ => h.host.to_string(),
        })
        .collect();
    if hosts.len() > NAMED {
        parts.push(format!("and {} more", hosts.len() - NAMED));
    }
    parts.join(", ")
}

/// What the rollout waits for, in one line: the hosts that are not done and why.
pub fn waiting_line(hosts: &[HostStatus], plan: &Plan) -> String {
    let of = |st: HostState| -> Vec<&HostStatus> { hosts.iter().filter(|h| h.state == st).collect() };
    let mut parts = Vec::new();
    let upgrading = of(HostState::Upgrading);
    if !upgrading.is_empty() {
        parts.push(format!(
            "{} upgrading: {}",
            upgrading.len(),
            named(&upgrading, true)
        ));
    }
    for (st, what) in [
        (HostState::Lost, "lost"),
        (HostState::Blocked, "blocked"),
        (HostState::Failed, "failed"),
    ] {
        let hs = of(st);
        if !hs.is_empty() {
            parts.push(format!("{} {what}: {}", hs.len(), named(&hs, true)));
        }
    }
    for g in &plan.groups {
        if g.pending > 0 {
            parts.push(format!("{} pending in {}: {}", g.pending, g.group, g.action));
        }
    }
    if parts.is_empty() {
        "nothing".into()
    } else {
        parts.join("; ")
    }
}

/// How a run ended, before the final status is printed.
enum End {
    Code(u8),
    /// Print the final status, then exit with the code.
    Show(u8),
}

/// Runs the command; returns the exit code.
pub async fn run(store: &DynStore, schema: &Schema, args: Args) -> anyhow::Result<u8> {
    // The revision this command started at: an emergency stop written after it halts
    // this run; one written before it was seen by the operator who started it.
    let started_at = store.ping().await?;
    // Check the rules against the fleet before anything is written.
    let snap = Snapshot::read_for(store, schema, Some(&args.version)).await?;
    for p in &snap.problems {
        eprintln!("jioctl: warning: {p}");
    }
    let roles = fleet::classify(&snap).into_iter().map(|h| h.role).collect();
    let resolved = match args.rules.resolve(&roles) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("jioctl: {e}");
            return Ok(exit::INVALID_RULES);
        }
    };
    for w in &resolved.warnings {
        eprintln!("jioctl: warning: {w}");
    }
    if args.noop {
        let snap = as_if_started(snap, &args.version);
        let hosts = fleet::classify(&snap);
        let plan = rules::plan(&snap, &hosts, &resolved);
        if args.json {
            println!("{}", serde_json::to_string_pretty(&plan)?);
        } else {
            println!("plan for {} (noop: nothing written):", args.version);
            print_plan(&plan);
            if let Some(a) = admitted(&plan) {
                println!("would have {a}");
            }
        }
        return Ok(exit::OK);
    }

    let deadline = args.timeout.map(|t| Instant::now() + t);
    let lock = tokio::select! {
        l = take_lock(store, schema, &args, deadline) => l?,
        sig = interrupted() => {
            eprintln!("jioctl: {sig}: stopped while waiting for the rollout lock; nothing was written");
            return Ok(signal_code(sig));
        }
    };
    let Some(lock) = lock else {
        return Ok(if args.retry { exit::TIMED_OUT } else { exit::LOCKED });
    };
    let mut lock = Some(lock);
    let result = tokio::select! {
        r = drive(store, schema, &args, &mut lock, started_at, deadline) => r,
        sig = interrupted() => {
            if let Some(l) = lock.take() {
                l.release().await;
            }
            eprintln!(
                "jioctl: {sig}: the rollout to {} is no longer driven; the rollout lock is released. Hosts already enabled go on; `jioctl global-disable-puppet` stops them",
                args.version
            );
            return Ok(signal_code(sig));
        }
    };
    if let Some(l) = lock.take() {
        l.release().await;
    }
    match result? {
        End::Code(c) => Ok(c),
        End::Show(c) => {
            if !args.quiet {
                finish(store, schema, &args).await?;
            }
            Ok(c)
        }
    }
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

/// Takes the rollout lock, waiting for it with `--retry`. `None`: not taken (the
/// reason was printed).
async fn take_lock(
    store: &DynStore,
    schema: &Schema,
    args: &Args,
    deadline: Option<Instant>,
) -> anyhow::Result<Option<RolloutLock>> {
    let key = schema.lock(fleet::ROLLOUT_LOCK);
    let mut last_said = None;
    loop {
        match RolloutLock::try_take(store, schema).await? {
            LockOutcome::Taken(l) => return Ok(Some(l)),
            LockOutcome::Held(holder) => {
                let who = writes::describe(&holder);
                if !args.retry {
                    eprintln!(
                        "jioctl: a rollout is already being driven by {who}; try again later or use --retry to wait"
                    );
                    return Ok(None);
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    eprintln!("jioctl: --timeout passed while waiting for the rollout lock held by {who}");
                    return Ok(None);
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
    }
}

/// Runs passes until the rollout ends.
async fn drive(
    store: &DynStore,
    schema: &Schema,
    args: &Args,
    lock: &mut Option<RolloutLock>,
    started_at: Revision,
    deadline: Option<Instant>,
) -> anyhow::Result<End> {
    let tty = std::io::stdout().is_terminal() && !args.json;
    let mut progress = if args.quiet {
        Progress::silent()
    } else {
        Progress::new(tty)
    };
    let mut view: Option<LiveView> = None;
    let mut watch = None;
    let mut unreachable_since: Option<Instant> = None;
    let mut waiting = Waiting::default();
    loop {
        if lock.as_ref().is_some_and(RolloutLock::lease_ended) {
            match retake(store, schema, lock).await? {
                Some(code) => return Ok(End::Code(code)),
                None => view = None,
            }
        }
        let Some(held) = lock.as_ref() else {
            return Ok(End::Code(exit::LOCKED));
        };
        let result = async {
            let v = match view.take() {
                Some(v) => v,
                None => {
                    // Something may have been missed: read everything again.
                    watch = None;
                    LiveView::read(store, schema).await?
                }
            };
            Ok::<_, PassError>(v)
        }
        .await;
        let pass = match result {
            Ok(mut v) => {
                let r = pass(store, schema, args, &mut progress, &mut v, held, started_at).await;
                view = Some(v);
                r
            }
            Err(e) => Err(e),
        };
        let (snap, outcome) = match pass {
            Ok(x) => {
                if unreachable_since.take().is_some() {
                    eprintln!("jioctl: store reachable again");
                }
                x
            }
            Err(PassError::Store(e)) if args.retry && e.kind() == ErrorKind::Unavailable => {
                let since = *unreachable_since.get_or_insert_with(|| {
                    eprintln!("jioctl: {e}; retrying");
                    Instant::now()
                });
                if since.elapsed() > STORE_PATIENCE {
                    return Err(e.into());
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    eprintln!("jioctl: --timeout passed while the store was unreachable");
                    return Ok(End::Code(exit::TIMED_OUT));
                }
                view = None;
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(PassError::Store(e)) => return Err(e.into()),
            Err(PassError::Rules(e)) => {
                eprintln!("jioctl: {e}");
                return Ok(End::Code(exit::INVALID_RULES));
            }
        };
        match outcome {
            PassOutcome::Replan => {
                view = None;
                continue;
            }
            PassOutcome::LockLost => {
                match retake(store, schema, lock).await? {
                    Some(code) => return Ok(End::Code(code)),
                    None => view = None,
                }
                continue;
            }
            PassOutcome::Again => continue,
            PassOutcome::Halted(by) => {
                eprintln!(
                    "jioctl: the rollout to {} was halted by an emergency stop: {} ran global-disable-puppet; every enable key was reset and this run enables nothing more (run `jioctl upgrade {}` again to resume)",
                    args.version,
                    writes::describe(&Some(by)),
                    args.version
                );
                return Ok(End::Code(exit::HALTED));
            }
            PassOutcome::Stopped => {
                report_failures(&snap, args);
                return Ok(End::Code(exit::FAILED));
            }
            PassOutcome::Finished { failed } => {
                return Ok(End::Show(if failed == 0 { exit::OK } else { exit::FAILED }));
            }
            PassOutcome::Continue { .. } if !args.retry => return Ok(End::Show(exit::OK)),
            PassOutcome::Continue { waiting: line } => {
                if let Some(line) = line {
                    waiting.note(&mut progress, line);
                }
            }
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            eprintln!(
                "jioctl: --timeout passed; the rollout to {} has not finished, waiting for {}",
                args.version,
                waiting.last.as_deref().unwrap_or("hosts still upgrading")
            );
            return Ok(End::Code(exit::TIMED_OUT));
        }
        if watch.is_none() {
            let from = view.as_ref().map(|v| v.watch_from).unwrap_or(snap.revision);
            watch = Some(store.watch(&schema.root(), from + 1).await?);
        }
        let Some(w) = watch.as_mut() else { continue };
        // Woken by any change; a slow resync guards against a silent watch, and the
        // waiting line is repeated while nothing moves.
        let nap = |d: Duration| {
            let mut d = d.min(waiting.until_reminder());
            if let Some(dl) = deadline {
                d = d.min(dl.saturating_duration_since(Instant::now()));
            }
            d.max(Duration::from_millis(10))
        };
        let first = match tokio::time::timeout(nap(Duration::from_secs(30)), w.next()).await {
            Ok(Some(Ok(ev))) => Some(ev),
            Ok(Some(Err(e))) => return Err(e.into()),
            Ok(None) | Err(_) => {
                view = None;
                None
            }
        };
        let mut events: Vec<WatchEvent> = first.into_iter().collect();
        let mut quiet = false;
        loop {
            while let Some(Some(Ok(ev))) = futures_util::FutureExt::now_or_never(w.next()) {
                events.push(ev);
            }
            let Some(v) = view.as_mut() else { break };
            let mut changed = false;
            for ev in events.drain(..) {
                match v.apply(schema, ev) {
                    Applied::Nothing => {}
                    Applied::Changed => changed = true,
                    Applied::Reread => {
                        view = None;
                        break;
                    }
                }
            }
            if changed || view.is_none() {
                break;
            }
            // Nothing a plan depends on changed: wait for more, without a pass.
            match tokio::time::timeout(nap(Duration::from_secs(30)), w.next()).await {
                Ok(Some(Ok(ev))) => events.push(ev),
                Ok(Some(Err(e))) => return Err(e.into()),
                Ok(None) | Err(_) => {
                    quiet = true;
                    break;
                }
            }
        }
        if quiet {
            // The slow resync (or the reminder): plan from a fresh read.
            view = None;
        }
    }
}

/// The lock's lease ended: take it again before writing anything, or stop.
/// `Some(code)`: stop with it.
async fn retake(
    store: &DynStore,
    schema: &Schema,
    lock: &mut Option<RolloutLock>,
) -> anyhow::Result<Option<u8>> {
    if let Some(old) = lock.take() {
        old.release().await;
    }
    match RolloutLock::try_take(store, schema).await? {
        LockOutcome::Taken(l) => {
            eprintln!(
                "jioctl: the rollout lock's lease had ended (this process was paused or cut off from the store); took the lock again, planning afresh"
            );
            *lock = Some(l);
            Ok(None)
        }
        LockOutcome::Held(holder) => {
            eprintln!(
                "jioctl: lost the rollout lock (its lease ended while this process was paused or cut off from the store); it is now held by {}; this run stops without writing anything more",
                writes::describe(&holder)
            );
            Ok(Some(exit::LOCKED))
        }
    }
}

/// The waiting line, printed on change and at least every `WAITING_REMINDER`.
#[derive(Default)]
struct Waiting {
    last: Option<String>,
    said_at: Option<Instant>,
}

impl Waiting {
    fn note(&mut self, progress: &mut Progress, line: String) {
        let due = self.said_at.is_none_or(|t| t.elapsed() >= WAITING_REMINDER);
        if self.last.as_ref() != Some(&line) || due {
            progress.note(&format!("waiting for: {line}"));
            self.said_at = Some(Instant::now());
        }
        self.last = Some(line);
    }

    fn until_reminder(&self) -> Duration {
        match self.said_at {
            Some(t) => WAITING_REMINDER.saturating_sub(t.elapsed()),
            None => WAITING_REMINDER,
        }
    }
}

enum PassError {
    Store(StoreError),
    Rules(rules::RulesError),
}

impl From<StoreError> for PassError {
    fn from(e: StoreError) -> Self {
        PassError::Store(e)
    }
}

enum PassOutcome {
    /// The store changed under the plan: read it again and plan again.
    Replan,
    /// The view is fresh: plan again at once.
    Again,
    /// The rollout lock is no longer ours: take it again or stop.
    LockLost,
    /// An emergency stop newer than this run.
    Halted(LockRecord),
    /// More failures than allowed (the enable keys were reset).
    Stopped,
    /// Nothing pending or upgrading (the enable keys were reset).
    Finished { failed: usize },
    /// Hosts are moving; `waiting` says on what, when nothing was admitted.
    Continue { waiting: Option<String> },
}

/// Writes `ops` fenced on what `snap` read and on still holding `lock`: `None` when
/// applied, or the end of the pass (replan, or the lock lost).
async fn fenced(
    store: &DynStore,
    schema: &Schema,
    ops: Vec<Op>,
    snap: &Snapshot,
    lock: &RolloutLock,
) -> Result<Option<(Snapshot, PassOutcome)>, StoreError> {
    Ok(
        match writes::apply_fenced(store, schema, ops, snap.epoch, lock).await? {
            Fenced::Applied => None,
            Fenced::Moved => Some((snap.clone(), PassOutcome::Replan)),
            Fenced::LockLost => Some((snap.clone(), PassOutcome::LockLost)),
        },
    )
}

/// Some enable key would still let a host start.
fn armed(snap: &Snapshot) -> bool {
    snap.global != KeyState::Set(false) || !snap.role_keys.is_empty() || !snap.host_keys.is_empty()
}

async fn pass(
    store: &DynStore,
    schema: &Schema,
    args: &Args,
    progress: &mut Progress,
    view: &mut LiveView,
    lock: &RolloutLock,
    started_at: Revision,
) -> Result<(Snapshot, PassOutcome), PassError> {
    let snap = view.snapshot(schema);
    if let Some((by, rev)) = &snap.halt {
        if *rev > started_at {
            return Ok((snap.clone(), PassOutcome::Halted(by.clone())));
        }
        // An emergency stop from before this command: starting it is the operator's
        // decision to go on. Clear it, fenced like any plan.
        let ops = vec![Op::Delete(schema.lock(HALT))];
        if let Some(end) = fenced(store, schema, ops, &snap, lock).await? {
            return Ok(end);
        }
        if !args.quiet {
            println!(
                "cleared the emergency stop by {} (it came before this upgrade was started)",
                writes::describe(&Some(by.clone()))
            );
        }
        return Ok((snap, PassOutcome::Replan));
    }
    if snap.current.as_ref() != Some(&args.version) {
        // First pass (or someone changed it): start the rollout in one transaction.
        let ops = writes::start_rollout_ops(schema, &args.version);
        if let Some(end) = fenced(store, schema, ops, &snap, lock).await? {
            return Ok(end);
        }
        if !args.quiet {
            println!(
                "current_version set to {} (puppet disabled globally; hosts start under the rules)",
                args.version
            );
        }
        // Failure entries are read per version: read everything again.
        *view = LiveView::read(store, schema).await?;
        return Ok((view.snapshot(schema), PassOutcome::Again));
    }
    let hosts = fleet::classify(&snap);
    let roles = hosts.iter().map(|h| h.role.clone()).collect();
    let resolved = args.rules.resolve(&roles).map_err(PassError::Rules)?;
    let plan = rules::plan(&snap, &hosts, &resolved);
    if args.verbose {
        println!("pass at revision {}:", snap.revision);
        print_plan(&plan);
    }
    if !plan.is_empty() {
        let ops = writes::plan_ops(schema, &plan);
        if let Some(end) = fenced(store, schema, ops, &snap, lock).await? {
            return Ok(end);
        }
        if let Some(a) = admitted(&plan) {
            progress.note(&a);
        }
        // The watch brings our own writes back into the view.
        return Ok((snap, PassOutcome::Continue { waiting: None }));
    }
    progress.update(&hosts);
    let count = |s: HostState| hosts.iter().filter(|h| h.state == s).count();
    let failed = count(HostState::Failed);
    let moving = count(HostState::Pending)
        + count(HostState::Upgrading)
        + count(HostState::Lost)
        + count(HostState::Blocked);
    let done = moving == 0;
    if done || plan.stopped_on_failures {
        // Leave nothing armed: a later trigger-update must not release the fleet.
        if armed(&snap) {
            let ops = writes::global_disable_ops(schema);
            if let Some(end) = fenced(store, schema, ops, &snap, lock).await? {
                return Ok(end);
            }
            if !args.quiet {
                println!("enable keys reset (puppet disabled globally): nothing is left armed");
            }
        }
        return Ok((
            snap,
            if done {
                PassOutcome::Finished { failed }
            } else {
                PassOutcome::Stopped
            },
        ));
    }
    Ok((
        snap,
        PassOutcome::Continue {
            waiting: Some(waiting_line(&hosts, &plan)),
        },
    ))
}

fn report_failures(snap: &Snapshot, args: &Args) {
    eprintln!(
        "jioctl: rollout to {} stopped: {} host(s) failed (max_failures {}); hosts already running finish their run",
        args.version,
        snap.failures.len(),
        args.rules.max_failures
    );
    for (h, (step, value)) in &snap.failures {
        eprintln!(
            "  {h}: {} failed: {}",
            step.as_str(),
            crate::status::describe_entry(value)
        );
    }
}

async fn finish(store: &DynStore, schema: &Schema, args: &Args) -> anyhow::Result<()> {
    let snap = Snapshot::read(store, schema).await?;
    let hosts = fleet::classify(&snap);
    if args.json {
        println!("{}", crate::status::to_json(&snap, &hosts));
    } else {
        print!("{}", crate::status::to_text(&snap, &hosts, store.url()));
    }
    Ok(())
}

/// `global-disable-puppet`: the emergency stop, and what it stopped.
pub async fn emergency_stop(store: &DynStore, schema: &Schema) -> anyhow::Result<u8> {
    let lock = store.get(&schema.lock(fleet::ROLLOUT_LOCK)).await?;
    writes::write(store, schema, writes::emergency_stop_ops(schema)).await?;
    println!("puppet disabled globally; every enable_puppet key removed");
    if let Some(kv) = lock {
        let who: Option<LockRecord> = jio_common::values::parse_json(&kv).ok();
        println!(
            "a rollout driven by {} was running: it has been halted (it enables nothing more and exits); hosts already running finish their run",
            writes::describe(&who)
        );
    }
    Ok(exit::OK)
}

/// How many hosts a write of `after` would let start at once, outside any rules:
/// hosts whose gate would open, that are not at the desired version and not
/// already moving.
pub fn released_by(before: &Snapshot, after: &Snapshot) -> Vec<jio_common::names::HostName> {
    let was: BTreeMap<_, _> = fleet::classify(before)
        .into_iter()
        .map(|h| (h.host, h.state))
        .collect();
    fleet::classify(after)
        .into_iter()
        .filter(|h| {
            matches!(h.state, HostState::Upgrading | HostState::Lost)
                && h.reason.is_none()
                && !matches!(was.get(&h.host), Some(HostState::Upgrading | HostState::Lost))
        })
        .map(|h| h.host)
        .collect()
}

/// A fenced single write for `trigger-update` / `enable-puppet`: applied only if the
/// epoch has not moved since `snap` (what the release count was computed on).
pub async fn write_checked(
    store: &DynStore,
    schema: &Schema,
    ops: Vec<Op>,
    snap: &Snapshot,
) -> Result<bool, StoreError> {
    let mut txn = Txn::new().when(Compare::ModRevision(schema.lock(fleet::EPOCH), snap.epoch));
    txn.ops = ops;
    txn.ops.push(Op::put(
        schema.lock(fleet::EPOCH),
        serde_json::to_string(&writes::holder()).unwrap_or_default(),
    ));
    Ok(store.txn(txn).await?.committed())
}
