//! Fleet commands: creating one (`jioctl run`), driving it under the rules (a
//! pass reads, `command::plan` decides, and one transaction fenced on the plan
//! epoch and the command's lock writes the admissions), following it, cancelling
//! it, and what is shown of it. `jioctl drive` drives every active command too.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use futures_util::StreamExt as _;
use futures_util::stream::SelectAll;
use jio_common::command::{self, CommandPlan, HostPhase};
use jio_common::command_record::{self, CommandRecord, CommandState, Runs, Targets};
use jio_common::fleet::{self, HostStatus, Snapshot};
use jio_common::keys::{Key, Schema};
use jio_common::names::CommandId;
use jio_common::names::{HostName, Role};
use jio_common::roles::RolePattern;
use jio_common::rules::{Resolved, Rules};
use jio_common::store::{Compare, DynStore, KeyValue, Op, StoreError, Txn, TxnOutcome, WatchStream};
use jio_common::time::unix_now;
use jio_common::values::parse_json;
use tokio::sync::watch;

use crate::exit::{self, Failure, Outcome};
use crate::progress::{Group, Part, Progress, Stream};
use crate::writes::{self, Fenced, LockOutcome, RolloutLock};

/// What a new command is.
pub struct NewCommand {
    pub action: String,
    pub args: Vec<String>,
    pub targets: Targets,
    pub rules: Rules,
    pub rules_json: serde_json::Value,
    pub timeout: Option<Duration>,
    pub rerun_interrupted: bool,
    /// The rules were given (not the site's file): a rule naming no host of the
    /// fleet (a misspelt role) is an error, not a warning.
    pub strict: bool,
}

/// The roles of `hosts`, as the fleet says.
fn roles_of(fleet: &Snapshot, hosts: &[HostName]) -> BTreeSet<Role> {
    hosts.iter().map(|h| fleet.role_of(h)).collect()
}

/// Most finished commands deleted with one new command.
const PRUNE: usize = 20;

/// Records a new command (its hosts resolved from the fleet now), deleting the
/// oldest finished commands beyond the history in the same transaction. Bad
/// targets or rules are errors naming them; nothing is written then.
pub async fn create(
    store: &DynStore,
    schema: &Schema,
    role_pattern: &RolePattern,
    new: NewCommand,
) -> Result<CommandRecord, Failure> {
    let mut fleet = Snapshot::read(store, schema).await?;
    fleet.role_pattern = role_pattern.clone();
    let hosts = checked_hosts(&new, &fleet)?;
    note_holds_and_stop(&fleet, &hosts);
    let records = command_records(store, schema).await?;
    let drop = to_prune(&records, &fleet);
    let now = unix_now();
    for n in 1..100u32 {
        let id = CommandId::new(now, &new.action, n);
        if records.iter().any(|(i, _)| i == &id) {
            continue;
        }
        let record = new_record(&new, id, &hosts, now);
        if store.txn(creation_txn(schema, &record, &drop)).await?.committed() {
            return Ok(record);
        }
    }
    Err(Failure::new(exit::SOFTWARE, "could not find a free command id"))
}

/// The new command's hosts: its targets resolved in `fleet`, once its rules check
/// (warnings said); bad targets or rules are errors naming them.
fn checked_hosts(new: &NewCommand, fleet: &Snapshot) -> Result<Vec<HostName>, Failure> {
    let hosts = command::resolve_targets(&new.targets, fleet)
        .map_err(|errors| Failure::usage(format!("nothing was written:\n  {}", errors.join("\n  "))))?;
    let resolved = new
        .rules
        .resolve(&roles_of(fleet, &fleet.hosts().into_iter().collect::<Vec<_>>()))
        .map_err(|e| Failure::with(exit::INVALID_RULES, anyhow::Error::new(e)))?;
    // Rules given on the command line are checked as a rollout's are (names the
    // fleet does not have); a command without rules runs under the defaults, and
    // its own targets bound it.
    jio_common::rules::check_intent(&resolved, None, !new.strict)
        .map_err(|e| Failure::with(exit::INVALID_RULES, anyhow!("{e}")))?;
    for w in &resolved.warnings {
        eprintln!("jioctl: warning: {w}");
    }
    Ok(hosts)
}

/// Notes what keeps the command from some hosts (holds) and what it runs despite
/// (an emergency stop).
fn note_holds_and_stop(fleet: &Snapshot, hosts: &[HostName]) {
    let held: Vec<&HostName> = hosts
        .iter()
        .filter(|h| fleet.hold_of(h, &fleet.role_of(h)).is_some())
        .collect();
    if !held.is_empty() {
        eprintln!(
            "jioctl: note: {} held: the command does not run there while held (released before the others are done, it does; else the command ends without it, not every host succeeded)",
            held.iter().map(|h| h.as_str()).collect::<Vec<_>>().join(", ")
                + if held.len() == 1 { " is" } else { " are" }
        );
    }
    if let Some((by, _)) = &fleet.halt {
        eprintln!(
            "jioctl: note: an emergency stop is in force (global-disable-puppet by {} on {}, {}): it keeps upgrades stopped; this command runs (a new stop would end it)",
            by.holder,
            by.host,
            jio_common::plan::when(by.since)
        );
    }
}

/// Every command in the store, oldest first (`None`: its record cannot be read).
async fn command_records(
    store: &DynStore,
    schema: &Schema,
) -> Result<Vec<(CommandId, Option<CommandRecord>)>, Failure> {
    let listing = store.list(&schema.commands()).await?;
    let mut records: Vec<(CommandId, Option<CommandRecord>)> = listing
        .kvs
        .iter()
        .filter_map(|kv| match schema.parse(&kv.key) {
            Some(jio_common::keys::Parsed::Command(id)) => Some((id, parse_json::<CommandRecord>(kv).ok())),
            _ => None,
        })
        .collect();
    records.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(records)
}

/// The commands a new one deletes: the oldest finished ones beyond the history.
/// One that cannot be read is kept (it may be running, written by a newer
/// jioctl), and so is one a host is still admitted to (its driver withdraws that
/// first).
fn to_prune<'a>(records: &'a [(CommandId, Option<CommandRecord>)], fleet: &Snapshot) -> Vec<&'a CommandId> {
    let admitted: BTreeSet<&CommandId> = fleet.inboxes.values().flatten().collect();
    let finished: Vec<&CommandId> = records
        .iter()
        .filter(|(id, r)| r.as_ref().is_some_and(|r| !r.state.active()) && !admitted.contains(id))
        .map(|(id, _)| id)
        .collect();
    // At most `PRUNE` per new command (two deletes each, in the creation's one
    // transaction, within what any store takes): a longer history shrinks over
    // the next commands.
    finished
        .iter()
        .take(
            finished
                .len()
                .saturating_sub(command_record::HISTORY - 1)
                .min(PRUNE),
        )
        .copied()
        .collect()
}

/// The record of `new` as command `id` on `hosts`, running since `now`.
fn new_record(new: &NewCommand, id: CommandId, hosts: &[HostName], now: u64) -> CommandRecord {
    let by = crate::rollouts::by();
    CommandRecord {
        id,
        action: new.action.clone(),
        args: new.args.clone(),
        targets: new.targets.clone(),
        hosts: hosts.to_vec(),
        rules: new.rules_json.clone(),
        timeout_s: new.timeout.map(|d| d.as_secs().max(1)),
        rerun_interrupted: new.rerun_interrupted,
        created_by: by.clone(),
        created_at: now,
        state: CommandState::Running,
        changes: vec![jio_common::rollout::Change {
            state: "running".into(),
            by,
            at: now,
            reason: None,
        }],
    }
}

/// One transaction: the record, if its id is still free, and the deletion of
/// the commands in `drop` (record and runs).
fn creation_txn(schema: &Schema, record: &CommandRecord, drop: &[&CommandId]) -> Txn {
    let id = &record.id;
    let mut txn = Txn::new().when(Compare::Absent(schema.command(id))).then(Op::put(
        schema.command(id),
        serde_json::to_string(record).unwrap_or_default(),
    ));
    for old in drop {
        txn.ops.push(Op::Delete(schema.command(old)));
        txn.ops.push(Op::DeletePrefix(schema.command_runs(old)));
    }
    txn
}

/// A command as read for one pass, and what its planner says.
pub struct Read {
    pub record: CommandRecord,
    pub record_kv: KeyValue,
    pub runs: Runs,
    pub fleet: Snapshot,
    pub plan: CommandPlan,
    /// The fleet's classification (roles of the hosts).
    pub statuses: Vec<HostStatus>,
    /// The stored rules cannot be used: why (nothing is admitted).
    pub rules_problem: Option<String>,
}

impl Read {
    pub fn role_of(&self, h: &HostName) -> Role {
        self.statuses
            .iter()
            .find(|s| &s.host == h)
            .map_or_else(|| self.fleet.role_of(h), |s| s.role.clone())
    }

    /// The command ended and no host with a live agent still runs it (a host
    /// whose agent is gone reports when it is back: nobody waits for it).
    pub fn finished(&self) -> bool {
        !self.record.state.active()
            && self
                .plan
                .running
                .iter()
                .all(|h| !self.fleet.agents.contains_key(h))
    }
}

/// Reads the command `id`, the fleet and the command's runs, and plans a pass.
pub async fn read(
    store: &DynStore,
    schema: &Schema,
    role_pattern: &RolePattern,
    id: &CommandId,
) -> anyhow::Result<Read> {
    // The fleet first: its listing of the locks holds the plan epoch the pass is
    // fenced on, so every admission and enable key the plan counts is at or after it.
    let mut fleet = Snapshot::read(store, schema).await?;
    fleet.role_pattern = role_pattern.clone();
    let key = schema.command(id);
    let record_kv = store
        .get(&key)
        .await?
        .ok_or_else(|| anyhow!("no fleet command {id} (jioctl commands list shows them)"))?;
    let record: CommandRecord =
        parse_json(&record_kv).with_context(|| format!("the record of command {id} cannot be used"))?;
    let listing = store.list(&schema.command_runs(id)).await?;
    let runs = Runs::from_kvs(schema, id, &listing.kvs);
    let statuses = fleet::classify(&fleet);
    let resolved: Result<Resolved, String> = command::parse_rules(&record.rules.to_string())
        .and_then(|r| r.resolve(&roles_of(&fleet, &fleet.hosts().into_iter().collect::<Vec<_>>())))
        .map_err(|e| format!("the rules in {key} cannot be used: {e}"));
    let view = command::View {
        record: &record,
        runs: &runs,
        fleet: &fleet,
        fleet_status: &statuses,
        created: record_kv.create_revision,
        now: unix_now(),
    };
    let (plan, rules_problem) = match &resolved {
        Ok(r) => (command::plan(&view, r), None),
        Err(e) => {
            // Nothing is admitted; the rest is shown as it is.
            let frozen = Rules::parse(r#"{"rolling_rules": {"global": 0}}"#)
                .ok()
                .and_then(|r| r.resolve(&roles_of(&fleet, &record.hosts)).ok());
            let mut p = frozen.map(|r| command::plan(&view, &r)).unwrap_or_default();
            p.admit.clear();
            p.end = None;
            (p, Some(e.clone()))
        }
    };
    Ok(Read {
        record,
        record_kv,
        runs,
        fleet,
        plan,
        statuses,
        rules_problem,
    })
}

/// The writes of the inboxes: `id` added for `admit`, removed for `release`. No
/// host is admitted through an inbox that cannot be read (its host counts as
/// admitted already); a withdrawal rewrites it with the ids that can be read (what
/// cannot be read was reported, by key, with the snapshot's problems).
fn inbox_ops(
    schema: &Schema,
    fleet: &Snapshot,
    id: &CommandId,
    admit: &[HostName],
    release: &[HostName],
) -> Vec<Op> {
    let invalid = |h: &HostName| fleet.inboxes_invalid.contains(h);
    let readable = |h: &HostName| -> BTreeSet<CommandId> {
        fleet
            .inboxes
            .get(h)
            .map(|ids| ids.iter().cloned().collect())
            .unwrap_or_default()
    };
    let mut changed: BTreeMap<&HostName, BTreeSet<CommandId>> = BTreeMap::new();
    for h in admit.iter().filter(|h| !invalid(h)) {
        changed.entry(h).or_insert_with(|| readable(h)).insert(id.clone());
    }
    for h in release {
        changed.entry(h).or_insert_with(|| readable(h)).remove(id);
    }
    changed
        .into_iter()
        .filter(|(h, ids)| &readable(h) != ids || invalid(h))
        .map(|(h, ids)| {
            if ids.is_empty() {
                Op::Delete(schema.command_inbox(h))
            } else {
                Op::put(schema.command_inbox(h), command_record::format_inbox(&ids))
            }
        })
        .collect()
}

/// A driver's pass: the plan's admissions and releases, and the command's end,
/// in transactions fenced on the epoch as read and on holding `lock` (the end
/// first, so that a prefix of the chunks never admits more than the whole).
async fn drive_pass(
    store: &DynStore,
    schema: &Schema,
    r: &Read,
    lock: &RolloutLock,
) -> Result<(Fenced, bool), StoreError> {
    let id = &r.record.id;
    let mut ops = Vec::new();
    if let Some(end) = &r.plan.end {
        let reason = match end {
            CommandState::Failed { failed_hosts: hosts } => Some(format!(
                "not every host succeeded: {}",
                hosts
                    .iter()
                    .take(5)
                    .map(|(h, w)| format!("{h} ({w})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            CommandState::Aborted { reason, .. } => reason.clone(),
            _ => None,
        };
        let rec = r.record.moved(end.clone(), "jioctl", unix_now(), reason);
        ops.push(Op::put(
            schema.command(id),
            serde_json::to_string(&rec).unwrap_or_default(),
        ));
    }
    ops.extend(inbox_ops(schema, &r.fleet, id, &r.plan.admit, &r.plan.release));
    if ops.is_empty() {
        return Ok((Fenced::Applied, false));
    }
    let f = writes::apply_fenced(store, schema, ops, r.fleet.epoch, lock).await?;
    Ok((f, true))
}

/// How following ended.
pub enum FollowEnd {
    /// The command ended and no host runs it any more.
    Ended(Box<Read>),
    /// Stopped by the caller (a signal, the driver service stopping).
    Stopped,
}

/// How to follow.
#[derive(Clone, Copy)]
pub struct FollowOpts {
    /// Take the command's lock and drive it when nobody else does.
    pub drive: bool,
    /// The driver service: only changes of who drives and the end, on stderr.
    pub quiet: bool,
    pub ttl: Duration,
}

/// The prefixes whose changes may change a command's plan.
fn watched(schema: &Schema, id: &CommandId) -> Vec<Key> {
    vec![
        schema.command(id),
        schema.command_runs(id),
        schema.config_state(),
        schema.agents(),
        schema.runs(),
        schema.holds(),
        schema.locks(),
    ]
}

async fn open_watches(store: &DynStore, keys: &[Key]) -> Option<SelectAll<WatchStream>> {
    let mut all = SelectAll::new();
    for k in keys {
        all.push(store.watch(k, 0).await.ok()?);
    }
    Some(all)
}

/// One line of progress: how many hosts are where, and what the rest waits for.
pub fn progress_line(r: &Read) -> String {
    let mut counts: BTreeMap<HostPhase, usize> = BTreeMap::new();
    for p in r.plan.phases.values() {
        *counts.entry(*p).or_default() += 1;
    }
    let parts: Vec<String> = counts
        .iter()
        .map(|(p, n)| format!("{n} {}", p.as_str()))
        .collect();
    let mut line = format!(
        "command {} ({}): {} on {}: {}",
        r.record.id,
        r.record.state.name(),
        r.record.command_line(),
        command::hosts_n(r.record.hosts.len()),
        parts.join(", ")
    );
    let waiting: Vec<(&HostName, &str)> = r
        .plan
        .phases
        .iter()
        .filter(|(_, p)| matches!(p, HostPhase::Pending | HostPhase::Admitted | HostPhase::Running))
        .filter_map(|(h, _)| r.plan.reasons.get(h).map(|w| (h, w.text.as_str())))
        .collect();
    if let Some(p) = &r.rules_problem {
        line.push_str(&format!("; nothing is admitted: {p}"));
    }
    if r.record.state.active() && r.runs.lock_absent {
        line.push_str(&format!(
            "; nobody drives it (no process holds its lock): `jioctl commands follow {}` or a driver service (`jioctl drive`) admits its hosts",
            r.record.id
        ));
    }
    if r.plan.waits_forever {
        line.push_str(
            "; nothing can move without an operator (a frozen group, a lost or unreadable host, or a group waiting for one): `jioctl commands cancel` ends it",
        );
    }
    if !waiting.is_empty() && !r.finished() {
        line.push_str(&format!("; waiting for: {}", grouped_waits(&waiting)));
    }
    line
}

/// Hosts that wait, grouped by reason: each reason once, with how many hosts and
/// the first few names (`+N more` for the rest), the largest groups first; at most
/// four reasons, then how many more.
pub fn grouped_waits(waiting: &[(&HostName, &str)]) -> String {
    grouped_wait_rows(waiting).join("; ")
}

/// `grouped_waits`, a row per reason.
pub fn grouped_wait_rows(waiting: &[(&HostName, &str)]) -> Vec<String> {
    const NAMES: usize = 3;
    const REASONS: usize = 4;
    // A reason that names its own host (`no /agents/stmon7 lease`) is the same
    // reason for each host: said once, the name as `<host>`.
    let mut by: BTreeMap<String, Vec<&HostName>> = BTreeMap::new();
    for (h, why) in waiting {
        by.entry(crate::render::shared_reason(h.as_str(), why))
            .or_default()
            .push(h);
    }
    let mut groups: Vec<(String, Vec<&HostName>)> = by.into_iter().collect();
    groups.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
    let mut parts: Vec<String> = groups
        .iter()
        .take(REASONS)
        .map(|(why, hosts)| {
            let mut names: Vec<String> = hosts.iter().take(NAMES).map(|h| h.to_string()).collect();
            if hosts.len() > NAMES {
                names.push(format!("+{} more", hosts.len() - NAMES));
            }
            format!("{} ({}): {why}", command::hosts_n(hosts.len()), names.join(", "))
        })
        .collect();
    if groups.len() > REASONS {
        parts.push(format!("+{} more reason(s)", groups.len() - REASONS));
    }
    parts
}

/// The hosts of a command by role, as the progress view shows them: done is
/// succeeded; the hosts running, admitted and those that did not succeed named.
pub fn view_groups(r: &Read) -> BTreeMap<String, Group> {
    let role_of: BTreeMap<&HostName, &Role> = r.statuses.iter().map(|s| (&s.host, &s.role)).collect();
    let mut by: BTreeMap<String, BTreeMap<HostPhase, Vec<String>>> = BTreeMap::new();
    for h in &r.record.hosts {
        let role = role_of
            .get(h)
            .map_or_else(|| r.fleet.role_of(h), |r| (*r).clone());
        let phase = r.plan.phases.get(h).copied().unwrap_or(HostPhase::Pending);
        let phases = by.entry(role.to_string()).or_default();
        phases.entry(phase).or_default().push(h.to_string());
    }
    by.into_iter()
        .map(|(role, phases)| (role.clone(), phase_group(role, phases)))
        .collect()
}

/// One role's hosts by phase as a progress group.
fn phase_group(role: String, mut phases: BTreeMap<HostPhase, Vec<String>>) -> Group {
    let mut take = |p: HostPhase| phases.remove(&p).unwrap_or_default();
    let done = take(HostPhase::Succeeded).len();
    let pending = take(HostPhase::Pending).len();
    let named =
        |p: HostPhase, hosts: Vec<String>, always: bool| Part::new(hosts.len(), p.as_str(), hosts, always);
    let parts = vec![
        named(HostPhase::Running, take(HostPhase::Running), true),
        named(HostPhase::Admitted, take(HostPhase::Admitted), false),
        named(HostPhase::Failed, take(HostPhase::Failed), false),
        named(HostPhase::Refused, take(HostPhase::Refused), false),
        named(HostPhase::Interrupted, take(HostPhase::Interrupted), false),
        named(HostPhase::NotRun, take(HostPhase::NotRun), false),
        Part::new(pending, "pending", vec![], true),
    ];
    let total = done + parts.iter().map(|p| p.n).sum::<usize>();
    Group {
        roles: [role].into(),
        done,
        total,
        done_word: "succeeded",
        parts,
    }
}

/// What a pass says besides the counts, each its own note: the command, whether
/// anything stops it, and what its hosts wait for (a note per reason).
pub fn pass_notes(r: &Read) -> Vec<String> {
    let id = &r.record.id;
    let mut notes = vec![format!(
        "command {id} ({}): {} on {}",
        r.record.state.name(),
        r.record.command_line(),
        command::hosts_n(r.record.hosts.len())
    )];
    if let Some(p) = &r.rules_problem {
        notes.push(format!("nothing is admitted: {p}"));
    }
    if r.record.state.active() && r.runs.lock_absent {
        notes.push(format!(
            "nobody drives command {id} (no process holds its lock): `jioctl commands follow {id}` or a driver service (`jioctl drive`) admits its hosts"
        ));
    }
    if r.plan.waits_forever {
        notes.push("nothing can move without an operator (a frozen group, a lost or unreadable host, or a group waiting for one): `jioctl commands cancel` ends it".into());
    }
    let failed: Vec<String> = r
        .plan
        .phases
        .iter()
        .filter(|(_, p)| matches!(p, HostPhase::Failed | HostPhase::Refused | HostPhase::Interrupted))
        .map(|(h, _)| h.to_string())
        .collect();
    if !failed.is_empty() {
        notes.push(format!(
            "did not succeed: {} ({})",
            command::hosts_n(failed.len()),
            crate::render::fit_names(&failed, 40)
        ));
    }
    let waiting = waiting_hosts(r);
    if !waiting.is_empty() && !r.finished() {
        // A note per reason: one that still holds is not said again.
        let rows = grouped_wait_rows(&waiting).into_iter();
        notes.extend(rows.map(|w| format!("waiting for: {w}")));
    }
    notes
}

/// The hosts not done and why, as the plan says.
fn waiting_hosts(r: &Read) -> Vec<(&HostName, &str)> {
    r.plan
        .phases
        .iter()
        .filter(|(_, p)| matches!(p, HostPhase::Pending | HostPhase::Admitted | HostPhase::Running))
        .filter_map(|(h, _)| r.plan.reasons.get(h).map(|w| (h, w.text.as_str())))
        .collect()
}

/// Follows the command `id` (driving it while `opts.drive` and nobody else does)
/// until it ends and no host runs it, or `stop` turns true. The command's lock is
/// released on every way out. A store that cannot be reached is waited for (and
/// said); a command that does not exist or cannot be read ends it with the error.
pub async fn follow(
    store: &DynStore,
    schema: &Schema,
    role_pattern: &RolePattern,
    id: &CommandId,
    opts: FollowOpts,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<FollowEnd> {
    let mut f = Follower {
        store,
        schema,
        role_pattern,
        id,
        view: view_for(&opts),
        opts,
        lock: None,
        told_holder: None,
        last_try: None,
        last_notes: Vec::new(),
    };
    let end = f.run(stop).await;
    if let Some(l) = f.lock.take() {
        l.release().await;
    }
    match &end {
        // Stopped following (Ctrl-C): the bars say it goes on, and who drives it.
        Ok(FollowEnd::Stopped) => {
            let now = who_drives_now(store, schema, id).await;
            f.view.went_on(Some(&format!("command {id} goes on; {now}")));
        }
        Ok(FollowEnd::Ended(_)) => f.view.finish(),
        Err(_) => f.view.went_on(None),
    }
    end
}

/// The progress view of a follower: bars on a terminal (stderr), stamped lines
/// otherwise; none for the driver service.
fn view_for(opts: &FollowOpts) -> Progress {
    if opts.quiet {
        return Progress::silent();
    }
    let mut v = Progress::on(Stream::Stderr, Stream::Stderr.is_terminal());
    v.take_log_lines();
    v
}

/// Who drives command `id` now, as the store says (within a few seconds): the
/// holder of its lock, or nobody (and what continues it).
pub async fn who_drives_now(store: &DynStore, schema: &Schema, id: &CommandId) -> String {
    let lock = tokio::time::timeout(Duration::from_secs(3), store.get(&schema.command_lock(id))).await;
    match lock {
        Ok(Ok(Some(kv))) => format!(
            "driven by {}",
            writes::describe(&jio_common::values::parse_json(&kv).ok())
        ),
        Ok(Ok(None)) => format!(
            "nobody drives it now: nothing more is admitted until `jioctl commands follow {id}` or a driver service (`jioctl drive`) takes it"
        ),
        _ => format!(
            "the store did not answer, so who drives it now is not known (`jioctl commands show {id}` shows it)"
        ),
    }
}

/// A follower's state between passes.
struct Follower<'a> {
    store: &'a DynStore,
    schema: &'a Schema,
    role_pattern: &'a RolePattern,
    id: &'a CommandId,
    opts: FollowOpts,
    lock: Option<RolloutLock>,
    told_holder: Option<String>,
    /// When this follower last tried to take the lock while another held it.
    last_try: Option<tokio::time::Instant>,
    /// Its progress: bars or lines, and the notes.
    view: Progress,
    /// The notes of the last pass (a note is said again only once it changed).
    last_notes: Vec<String>,
}

/// What one pass of a follower found.
enum Pass {
    /// It wrote (or lost a race): look again at once.
    Again,
    /// Nothing to write: wait for a change.
    Wait(Box<Read>),
    Ended(Box<Read>),
}

impl Follower<'_> {
    fn say(&mut self, s: &str) {
        if self.opts.quiet {
            eprintln!("jioctl drive: {s}");
        } else {
            self.view.note(s);
        }
    }

    /// Shows a pass: the groups' counts, and the notes that changed.
    fn show(&mut self, r: &Read) {
        self.view.show(view_groups(r));
        let notes = pass_notes(r);
        for n in notes.iter().filter(|n| !self.last_notes.contains(n)) {
            self.view.note(n);
        }
        self.last_notes = notes;
    }

    async fn run(&mut self, mut stop: watch::Receiver<bool>) -> anyhow::Result<FollowEnd> {
        let keys = watched(self.schema, self.id);
        let mut watches = open_watches(self.store, &keys).await;
        let mut backoff =
            jio_common::backoff::Backoff::new(Duration::from_millis(500), Duration::from_secs(15));
        let mut unreachable: Option<String> = None;
        loop {
            if *stop.borrow() {
                return Ok(FollowEnd::Stopped);
            }
            let mut wait = Duration::from_secs(if watches.is_some() { 60 } else { 2 });
            match self.pass().await {
                Ok(Pass::Again) => continue,
                Ok(Pass::Ended(r)) => {
                    if !self.opts.quiet {
                        self.show(&r);
                    }
                    return Ok(FollowEnd::Ended(r));
                }
                Ok(Pass::Wait(r)) => {
                    backoff.succeed();
                    if let Some(e) = unreachable.take() {
                        self.say(&format!("the store answers again (it failed with: {e})"));
                    }
                    if !self.opts.quiet {
                        self.show(&r);
                    }
                }
                Err(e) => {
                    let transient = e
                        .downcast_ref::<StoreError>()
                        .is_some_and(|e| e.kind() == jio_common::store::ErrorKind::Unavailable);
                    if !transient {
                        return Err(e);
                    }
                    let msg = format!("{e:#}");
                    if unreachable.as_deref() != Some(msg.as_str()) {
                        self.say(&format!(
                            "command {}: the store cannot be reached ({msg}); trying again (the command goes on; nothing is admitted meanwhile)",
                            self.id
                        ));
                        unreachable = Some(msg);
                    }
                    wait = backoff.fail();
                }
            }
            // Wait for a change (or a minute: leases end without an event).
            tokio::select! {
                ev = async {
                    match watches.as_mut() {
                        Some(w) => w.next().await,
                        None => std::future::pending().await,
                    }
                } => {
                    match ev {
                        Some(Ok(_)) => {
                            // Take in what else already arrived; one pass covers it.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            if let Some(w) = watches.as_mut() {
                                while let Some(Some(_)) = futures_util::FutureExt::now_or_never(w.next()) {}
                            }
                        }
                        _ => watches = open_watches(self.store, &keys).await,
                    }
                }
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => {}
            }
        }
    }

    /// Reads, takes the lock when it should, writes what the plan says.
    async fn pass(&mut self) -> anyhow::Result<Pass> {
        let id = self.id;
        if self.lock.as_ref().is_some_and(RolloutLock::lease_ended) {
            if let Some(l) = self.lock.take() {
                l.release().await;
            }
            self.say(&format!(
                "command {id}: the lock's lease ended (this process was cut off); nothing more is admitted by it"
            ));
        }
        let mut r = read(self.store, self.schema, self.role_pattern, id).await?;
        let work = r.record.state.active() || !r.plan.release.is_empty();
        // Another holder is tried again at most once a lease (a dead process of
        // this host, or a value no driver writes, is taken over at once).
        let due = self
            .last_try
            .is_none_or(|t| t.elapsed() >= self.opts.ttl || r.runs.lock_absent);
        if self.opts.drive && self.lock.is_none() && work && due {
            match RolloutLock::try_take_key(self.store, self.schema.command_lock(id), self.opts.ttl).await? {
                LockOutcome::Taken(l) => {
                    self.say(&format!("command {id}: driving it (this process holds its lock)"));
                    self.lock = Some(l);
                    self.told_holder = None;
                    self.last_try = None;
                }
                LockOutcome::Held(holder) => {
                    let who = writes::describe(&holder);
                    if self.told_holder.as_deref() != Some(who.as_str()) && !self.opts.quiet {
                        self.say(&format!("command {id}: {who} drives it; following"));
                    }
                    self.told_holder = Some(who);
                    self.last_try = Some(tokio::time::Instant::now());
                }
            }
        }
        if self.lock.is_some() {
            // Read before this process took it: the lock is not absent any more.
            r.runs.lock_absent = false;
        }
        if let Some(l) = &self.lock
            && work
        {
            match drive_pass(self.store, self.schema, &r, l).await? {
                (Fenced::Applied, true) => {
                    if !self.opts.quiet || r.plan.end.is_some() {
                        if !r.plan.admit.is_empty() {
                            self.say(&format!(
                                "command {id}: admitted {}",
                                jio_common::values::host_list(&r.plan.admit)
                            ));
                        }
                        if let Some(e) = &r.plan.end {
                            self.say(&format!("command {id}: ended {}", e.name()));
                        }
                    }
                    return Ok(Pass::Again);
                }
                (Fenced::Applied, false) => {}
                (Fenced::Moved, _) => return Ok(Pass::Again),
                (Fenced::LockLost, _) => {
                    if let Some(l) = self.lock.take() {
                        l.release().await;
                    }
                    self.say(&format!("command {id}: another process took its lock; following"));
                    return Ok(Pass::Again);
                }
            }
        }
        // Ended, nobody runs it, and nothing is left to withdraw (or this process
        // may not withdraw it: then whoever holds the lock does).
        if r.finished() && (r.plan.release.is_empty() || self.lock.is_none()) {
            return Ok(Pass::Ended(Box::new(r)));
        }
        Ok(Pass::Wait(Box::new(r)))
    }
}

/// One host's row of a command's table.
#[derive(Debug, serde::Serialize)]
pub struct HostRow {
    pub host: HostName,
    pub role: Role,
    pub phase: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// The Swift link to its output, when uploaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
    /// Where its output is on the host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_dir: Option<String>,
    /// Why (a failure's message, or what a host that has not run waits for).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

pub fn rows(r: &Read) -> Vec<HostRow> {
    r.record
        .hosts
        .iter()
        .map(|h| {
            let res = r.runs.results.get(h);
            let phase = r.plan.phases.get(h).copied().unwrap_or(HostPhase::Pending);
            HostRow {
                host: h.clone(),
                role: r.role_of(h),
                phase: phase.as_str(),
                exit_code: res.and_then(|x| x.exit_code),
                duration_s: res.filter(|x| x.started > 0).map(|x| x.duration_s()),
                attempt: res
                    .map(|x| x.attempt)
                    .or_else(|| r.runs.started.get(h).map(|s| s.attempt)),
                log: r.runs.logs.get(h).filter(|l| !l.is_empty()).cloned(),
                run_dir: res.and_then(|x| x.run_dir.clone()),
                reason: match res {
                    Some(x) if !x.ok() => x.message.clone(),
                    Some(_) => None,
                    None => match &r.record.state {
                        CommandState::Failed { failed_hosts: hosts } if phase == HostPhase::NotRun => {
                            hosts.get(h.as_str()).cloned()
                        }
                        s if phase == HostPhase::NotRun => {
                            Some(format!("not run: the command is {}", s.name()))
                        }
                        _ => r.plan.reasons.get(h).map(|w| w.text.clone()),
                    },
                },
            }
        })
        .collect()
}

/// The table of a command's hosts, for people, fitted to stdout's width.
pub fn table(r: &Read) -> String {
    table_in(&rows(r), crate::out::width())
}

/// The table in `width` columns: a LOG (a link, a run directory, or why) that
/// does not fit its row goes on the rows below it, folded; so does a reason.
pub fn table_in(rows: &[HostRow], width: usize) -> String {
    let w = |f: &dyn Fn(&HostRow) -> usize, min: usize| rows.iter().map(f).max().unwrap_or(0).max(min);
    let (wh, wr, wp) = (
        w(&|x| x.host.as_str().len(), 4),
        w(&|x| x.role.as_str().len(), 4),
        w(&|x| x.phase.len(), 6),
    );
    let mut out = format!(
        "{:<wh$}  {:<wr$}  {:<wp$}  {:>4}  {:>8}  LOG\n",
        "HOST", "ROLE", "RESULT", "EXIT", "DURATION"
    );
    for x in rows {
        let log = match (&x.log, &x.run_dir, &x.reason) {
            (Some(l), _, _) => l.clone(),
            (None, Some(d), _) => format!("{d} (on the host)"),
            (None, None, Some(why)) => why.clone(),
            _ => "-".into(),
        };
        let row = format!(
            "{:<wh$}  {:<wr$}  {:<wp$}  {:>4}  {:>8}",
            x.host.as_str(),
            x.role.as_str(),
            x.phase,
            x.exit_code.map_or("-".into(), |c| c.to_string()),
            x.duration_s.map_or("-".into(), |d| if d == 0 {
                "<1s".into()
            } else {
                format!("{d}s")
            }),
        );
        let mut below = Vec::new();
        if row.len() + 2 + log.chars().count() <= width {
            out.push_str(&format!("{row}  {log}\n"));
        } else {
            out.push_str(&format!("{}\n", row.trim_end()));
            below.push(log);
        }
        if let (Some(why), Some(_)) = (&x.reason, &x.log.as_ref().or(x.run_dir.as_ref())) {
            below.push(why.clone());
        }
        for text in below {
            for l in crate::render::fold(&format!("    {text}"), width, 6) {
                out.push_str(&l);
                out.push('\n');
            }
        }
    }
    out
}

/// The JSON of a command: its record, its hosts and the counts.
pub fn json(r: &Read) -> serde_json::Value {
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    for p in r.plan.phases.values() {
        *counts.entry(p.as_str()).or_default() += 1;
    }
    serde_json::json!({
        "command": r.record,
        "hosts": rows(r),
        "counts": counts,
        "finished": r.finished(),
        "driven": !r.runs.lock_absent,
        "waits_forever": r.plan.waits_forever,
        "problems": r.fleet.problems.iter().chain(&r.runs.problems).chain(&r.rules_problem).collect::<Vec<_>>(),
    })
}

/// The exit code of a command that ended: 0 only when every host succeeded.
pub fn exit_of(state: &CommandState) -> Outcome {
    match state {
        CommandState::Done => Ok(()),
        CommandState::Failed { .. } => Err(Failure::quiet(exit::FAILED)),
        CommandState::Cancelled { .. } | CommandState::Aborted { .. } => Err(Failure::quiet(exit::HALTED)),
        CommandState::Running => Err(Failure::quiet(exit::FAILED)),
    }
}

/// Prints how a command ended: the table (or JSON) and one line.
pub fn print_end(r: &Read, json_out: bool) {
    if json_out {
        println!("{}", crate::out::document(json(r)));
        return;
    }
    print!("{}", table(r));
    let ok = r
        .plan
        .phases
        .values()
        .filter(|p| **p == HostPhase::Succeeded)
        .count();
    println!(
        "command {} {}: {ok} of {} succeeded",
        r.record.id,
        r.record.state.name(),
        command::hosts_n(r.record.hosts.len())
    );
}

/// What `cancel` did.
pub struct Cancelled {
    /// The record as it was (`None`: there is none; its admissions were withdrawn).
    pub before: Option<CommandRecord>,
    /// Hosts still running it (they finish).
    pub running: usize,
    /// It was active, and is now cancelled.
    pub cancelled: bool,
    /// Admissions withdrawn.
    pub withdrawn: usize,
}

/// Maps a follower's or reader's error to an exit code: the store's by its kind,
/// anything else (no such command, an unreadable record) 1.
pub fn failure(e: anyhow::Error) -> Failure {
    if e.downcast_ref::<StoreError>().is_some() {
        Failure::from(e)
    } else {
        Failure::with(exit::FAILED, e)
    }
}

/// Cancels the command: no host starts it any more (hosts running it finish).
/// The record and the first withdrawals go in one transaction fenced on the epoch
/// and the record as read (an agent's start is fenced on the record, so none
/// starts after it); the rest of the withdrawals follow in chunks. Withdraws the
/// admissions an ended command left, too.
pub async fn cancel(
    store: &DynStore,
    schema: &Schema,
    role_pattern: &RolePattern,
    id: &CommandId,
    reason: Option<String>,
) -> Result<Cancelled, Failure> {
    for _ in 0..5 {
        if store.get(&schema.command(id)).await?.is_none() {
            return withdraw_orphan(store, schema, id).await;
        }
        let r = read(store, schema, role_pattern, id).await.map_err(failure)?;
        if let Some(done) = cancel_once(store, schema, r, id, &reason).await? {
            return Ok(done);
        }
    }
    Err(Failure::new(
        exit::FAILED,
        format!("command {id} kept changing while it was being cancelled; try again"),
    ))
}

/// One try at cancelling the command as read (`r`); `None`: it changed under us,
/// read it again.
async fn cancel_once(
    store: &DynStore,
    schema: &Schema,
    r: Read,
    id: &CommandId,
    reason: &Option<String>,
) -> Result<Option<Cancelled>, Failure> {
    let active = r.record.state.active();
    let mut first: Vec<Op> = active
        .then(|| cancelled_record_put(schema, &r.record, id, reason))
        .into_iter()
        .collect();
    // Every admission goes, wherever it is: hosts not started never start it,
    // started ones finish (their agents' records count them in flight).
    let mut rest = inbox_ops(schema, &r.fleet, id, &[], &admitted_to(&r.fleet, id));
    let withdrawn = rest.len();
    if first.is_empty() && rest.is_empty() {
        return Ok(Some(outcome(r, false, 0)));
    }
    // Each transaction: its compares, the epoch's bump, and at most what the
    // store takes.
    let size = writes::CHUNK.min(store.max_txn_ops().saturating_sub(3)).max(1);
    let n = rest.len().min(size.saturating_sub(first.len()));
    first.extend(rest.drain(..n));
    first.push(writes::epoch_put(schema));
    let txn = Txn {
        compares: vec![
            Compare::ModRevision(schema.lock(jio_common::fleet::EPOCH), r.fleet.epoch),
            Compare::ModRevision(schema.command(id), r.record_kv.mod_revision),
        ],
        ops: first,
    };
    let TxnOutcome::Committed(epoch) = store.txn(txn).await? else {
        return Ok(None);
    };
    let raced = withdraw_in_chunks(store, schema, &rest, size, epoch).await?;
    if raced && !active {
        return Ok(None);
    }
    Ok(Some(outcome(r, active, withdrawn)))
}

/// What cancelling the command as read (`r`) did.
fn outcome(r: Read, cancelled: bool, withdrawn: usize) -> Cancelled {
    Cancelled {
        running: r.plan.running.len(),
        before: Some(r.record),
        cancelled,
        withdrawn,
    }
}

/// The put of `record` moved to cancelled, by us, now, for `reason`.
fn cancelled_record_put(
    schema: &Schema,
    record: &CommandRecord,
    id: &CommandId,
    reason: &Option<String>,
) -> Op {
    let by = crate::rollouts::by();
    let rec = record.moved(
        CommandState::Cancelled {
            by: by.clone(),
            reason: reason.clone(),
        },
        &by,
        unix_now(),
        reason.clone(),
    );
    Op::put(
        schema.command(id),
        serde_json::to_string(&rec).unwrap_or_default(),
    )
}

/// The hosts whose inbox holds command `id`. Running hosts too: their agents'
/// records keep them in flight.
fn admitted_to(fleet: &Snapshot, id: &CommandId) -> Vec<HostName> {
    fleet
        .inboxes
        .iter()
        .filter(|(_, ids)| ids.contains(id))
        .map(|(h, _)| h.clone())
        .collect()
}

/// The rest of the withdrawals (nothing starts any more), `size` ops a
/// transaction, each chunk fenced on the epoch the one before left (`epoch`
/// first). True: a race lost (the caller reads again).
async fn withdraw_in_chunks(
    store: &DynStore,
    schema: &Schema,
    rest: &[Op],
    size: usize,
    mut epoch: jio_common::store::Revision,
) -> Result<bool, Failure> {
    let epoch_key = schema.lock(jio_common::fleet::EPOCH);
    for chunk in rest.chunks(size) {
        let mut txn = Txn::new().when(Compare::ModRevision(epoch_key.clone(), epoch));
        txn.ops.extend(chunk.iter().cloned());
        txn.ops.push(writes::epoch_put(schema));
        match store.txn(txn).await? {
            TxnOutcome::Committed(e) => epoch = e,
            TxnOutcome::Lost(_) => return Ok(true),
        }
    }
    Ok(false)
}

/// `cancel` of an id that has no record (deleted by hand): the admissions that
/// still name it are withdrawn (they would hold their hosts for ever), fenced on
/// the epoch; none is an error naming the id.
async fn withdraw_orphan(store: &DynStore, schema: &Schema, id: &CommandId) -> Result<Cancelled, Failure> {
    let mut fleet = Snapshot::read(store, schema).await?;
    fleet.inboxes.retain(|_, ids| ids.contains(id));
    let hosts: Vec<HostName> = fleet.inboxes.keys().cloned().collect();
    if hosts.is_empty() {
        return Err(Failure::new(
            exit::FAILED,
            format!("no fleet command {id} (jioctl commands list shows them), and no host is admitted to it"),
        ));
    }
    let mut txn = Txn::new().when(Compare::ModRevision(
        schema.lock(jio_common::fleet::EPOCH),
        fleet.epoch,
    ));
    txn.ops = inbox_ops(schema, &fleet, id, &[], &hosts);
    txn.ops.push(writes::epoch_put(schema));
    if !store.txn(txn).await?.committed() {
        return Err(Failure::new(
            exit::FAILED,
            format!("the admissions changed while withdrawing those of {id}; try again"),
        ));
    }
    eprintln!(
        "jioctl: no record of fleet command {id}: withdrew its admission{} on {}",
        if hosts.len() == 1 { "" } else { "s" },
        jio_common::values::host_list(&hosts)
    );
    Ok(Cancelled {
        before: None,
        running: 0,
        cancelled: false,
        withdrawn: hosts.len(),
    })
}

/// The driver service's share: drives every active command (one task each,
/// each taking the command's lock, standing by while another process holds it)
/// until `stop` turns true.
pub async fn drive_all(
    store: DynStore,
    schema: Schema,
    role_pattern: RolePattern,
    ttl: Duration,
    stop: watch::Receiver<bool>,
) {
    let mut tasks: BTreeMap<CommandId, tokio::task::JoinHandle<()>> = BTreeMap::new();
    let mut watch_cmds = store.watch(&schema.commands(), 0).await.ok();
    let mut stop2 = stop.clone();
    loop {
        if *stop.borrow() {
            break;
        }
        tasks.retain(|_, t| !t.is_finished());
        let admitted: BTreeSet<CommandId> = match store.list(&schema.command_inboxes()).await {
            Ok(l) => l
                .kvs
                .iter()
                .flat_map(|kv| command_record::parse_inbox(kv).0)
                .collect(),
            Err(_) => BTreeSet::new(),
        };
        if let Ok(listing) = store.list(&schema.commands()).await {
            for kv in &listing.kvs {
                let Some(jio_common::keys::Parsed::Command(id)) = schema.parse(&kv.key) else {
                    continue;
                };
                let active = parse_json::<CommandRecord>(kv).is_ok_and(|r| r.state.active());
                // An ended command a host is still admitted to is followed too: its
                // driver withdraws the admission (else it would hold the host).
                if !(active || admitted.contains(&id)) || tasks.contains_key(&id) {
                    continue;
                }
                let (s, sc, rp, st, i) = (
                    store.clone(),
                    schema.clone(),
                    role_pattern.clone(),
                    stop.clone(),
                    id.clone(),
                );
                let opts = FollowOpts {
                    drive: true,
                    quiet: true,
                    ttl,
                };
                tasks.insert(
                    id,
                    tokio::spawn(async move {
                        match follow(&s, &sc, &rp, &i, opts, st).await {
                            Ok(FollowEnd::Ended(r)) => {
                                eprintln!("jioctl drive: {}", progress_line(&r));
                            }
                            Ok(FollowEnd::Stopped) => {}
                            Err(e) => eprintln!("jioctl drive: command {i}: {e:#}"),
                        }
                    }),
                );
            }
        }
        tokio::select! {
            ev = async {
                match watch_cmds.as_mut() {
                    Some(w) => w.next().await,
                    None => std::future::pending().await,
                }
            } => {
                if !matches!(ev, Some(Ok(_))) {
                    watch_cmds = store.watch(&schema.commands(), 0).await.ok();
                }
            }
            _ = tokio::time::sleep(Duration::from_secs(15)) => {}
            _ = stop2.changed() => {}
        }
    }
    for (_, t) in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
}

/// The emergency stop's share: every active command's record ended `aborted`,
/// each write fenced on the record as read.
pub async fn abort_all_ops(
    store: &DynStore,
    schema: &Schema,
    by: &str,
) -> Result<Vec<(CommandId, Compare, Op)>, StoreError> {
    let listing = store.list(&schema.commands()).await?;
    let now = unix_now();
    Ok(listing
        .kvs
        .iter()
        .filter_map(|kv| {
            let Some(jio_common::keys::Parsed::Command(id)) = schema.parse(&kv.key) else {
                return None;
            };
            let rec = parse_json::<CommandRecord>(kv)
                .ok()
                .filter(|r| r.state.active())?;
            let reason = Some("emergency stop (global-disable-puppet)".to_string());
            let ended = rec.moved(
                CommandState::Aborted {
                    by: by.to_string(),
                    reason: reason.clone(),
                },
                by,
                now,
                reason,
            );
            Some((
                id.clone(),
                Compare::ModRevision(kv.key.clone(), kv.mod_revision),
                Op::put(
                    schema.command(&id),
                    serde_json::to_string(&ended).unwrap_or_default(),
                ),
            ))
        })
        .collect())
}

/// Reads a command id given by an operator.
pub fn parse_id(s: &str) -> Result<CommandId, String> {
    CommandId::parse(s).ok_or_else(|| {
        format!(
            "{s:?} is not a command id (like 20261125T031500Z-restart-nova; jioctl commands list shows them)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_hosts_are_grouped_by_reason_and_none_is_cut_without_saying_so() {
        let names: Vec<HostName> = (1..=9)
            .map(|i| HostName::new(format!("compute{i}")).unwrap())
            .collect();
        let ctl = HostName::new("controller1").unwrap();
        let mut waiting: Vec<(&HostName, &str)> =
            names.iter().map(|h| (h, "waiting for controller")).collect();
        waiting.push((&ctl, "running"));
        assert_eq!(
            grouped_waits(&waiting),
            "9 hosts (compute1, compute2, compute3, +6 more): waiting for controller; 1 host (controller1): running"
        );
        let many: Vec<String> = (0..6).map(|i| format!("reason {i}")).collect();
        let spread: Vec<(&HostName, &str)> = names.iter().zip(&many).map(|(h, w)| (h, w.as_str())).collect();
        let line = grouped_waits(&spread);
        assert!(line.ends_with("; +2 more reason(s)"), "{line}");
        assert_eq!(line.matches("reason ").count(), 4, "{line}");
        // 10,000 hosts, each named in its own reason: one reason, once.
        let lost: Vec<HostName> = (0..10_000)
            .map(|i| HostName::new(format!("stmon{i}")).unwrap())
            .collect();
        let whys: Vec<String> = lost
            .iter()
            .map(|h| format!("lost: no /agents/{h} lease"))
            .collect();
        let each: Vec<(&HostName, &str)> = lost.iter().zip(&whys).map(|(h, w)| (h, w.as_str())).collect();
        assert_eq!(
            grouped_waits(&each),
            "10000 hosts (stmon0, stmon1, stmon2, +9997 more): lost: no /agents/<host> lease"
        );
    }
}
