//! Rollout records in the store: creating one with the version change, the
//! operators' changes (pause, resume, abort, undo), the driver's end of one, and
//! history. What to do is decided by pure functions on a snapshot; each change is
//! one transaction that compares on what was read (the current rollout key and the
//! record), bumps the plan epoch (so a plan computed before it is never applied),
//! and is tried again from a fresh read when something moved.

use std::collections::BTreeMap;

use jio_common::fleet::{CurrentRollout, HALT, LockRecord, Snapshot};
use jio_common::keys::Schema;
use jio_common::names::Version;
use jio_common::rollout::{self, RolloutId, RolloutRecord, TransitionError};
use jio_common::store::{Compare, DynStore, Op, StoreError, Txn, TxnOutcome};

use crate::writes;

/// How often a change is tried again when the store moved under it.
const ATTEMPTS: usize = 20;

/// Who makes a change: `user@host`.
pub fn by() -> String {
    let h = writes::holder();
    format!("{}@{}", h.holder, h.host)
}

/// What `jioctl upgrade VERSION` does with the rollout that is current.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// The same version with the same rules is active: follow it.
    Follow(RolloutRecord),
    /// Start a new rollout; an active one (or an unreadable current one) is replaced.
    Create { replaces: Option<CurrentRollout> },
}

/// Decides whether `upgrade VERSION` with rules of `digest` follows the active
/// rollout or starts a new one.
pub fn begin(snap: &Snapshot, version: &Version, digest: &str) -> Begin {
    match &snap.rollout {
        Some(cur) => match cur.ok() {
            Some(r) if r.state.active() && &r.version == version && r.rules_digest() == digest => {
                Begin::Follow(r.clone())
            }
            _ => Begin::Create {
                replaces: Some(cur.clone()),
            },
        },
        None => Begin::Create { replaces: None },
    }
}

/// The version a new rollout to `version` goes back from: the desired version, or
/// (when the fleet is already told `version`) what the last rollout to it came from.
pub fn previous_of(snap: &Snapshot, version: &Version, last: Option<&RolloutRecord>) -> Option<Version> {
    match &snap.current {
        Some(c) if c != version => Some(c.clone()),
        _ => last
            .filter(|r| &r.version == version)
            .and_then(|r| r.previous.clone()),
    }
}

/// The compares that make a change apply only to the rollout state it was decided on.
fn compares_on(schema: &Schema, cur: Option<&CurrentRollout>) -> Vec<Compare> {
    match cur {
        None => vec![Compare::Absent(schema.current_rollout())],
        Some(c) => {
            let mut v = vec![Compare::ModRevision(schema.current_rollout(), c.current_revision)];
            if let Some(id) = RolloutId::parse(&c.id) {
                v.push(Compare::ModRevision(schema.rollout(&id), c.record_revision));
            }
            v
        }
    }
}

/// One transaction of `ops` on `compares`, with the epoch bump: `false` when
/// something moved.
async fn apply(
    store: &DynStore,
    schema: &Schema,
    compares: Vec<Compare>,
    ops: Vec<Op>,
) -> Result<bool, StoreError> {
    let mut txn = Txn::new();
    txn.compares = compares;
    txn.ops = ops;
    txn.ops.push(writes::epoch_put(schema));
    Ok(matches!(store.txn(txn).await?, TxnOutcome::Committed(_)))
}

/// A new rollout, as written.
#[derive(Debug)]
pub struct Created {
    pub record: RolloutRecord,
    /// The rollout it replaced, as it was.
    pub replaced: Option<CurrentRollout>,
    /// The emergency stop it cleared.
    pub cleared_halt: Option<LockRecord>,
    /// How many old records history no longer keeps were deleted.
    pub pruned: usize,
}

/// What `create` found instead of creating.
#[derive(Debug)]
pub enum Started {
    Created(Box<Created>),
    Follow(Box<RolloutRecord>),
}

/// What `jioctl upgrade` asks for.
pub struct Wanted<'a> {
    pub version: &'a Version,
    /// The rules, validated, as JSON (the record keeps them).
    pub rules: &'a serde_json::Value,
    /// The rules' stages in the order written (`stage_order`; empty: not composable).
    pub order: Vec<String>,
    /// The stages asked for (`--stage`; empty: every stage).
    pub stages: &'a [String],
    /// Recorded as forced past the check of the rules' intent.
    pub forced: bool,
}

/// A composable rollout's stages in the order its rules write them (empty for a
/// rolling one).
pub fn stage_order(rules: &jio_common::rules::Rules) -> Vec<String> {
    rules
        .compose
        .as_ref()
        .map(|c| c.stage_names())
        .unwrap_or_default()
}

/// Starts a rollout as `want` says, or follows the active one when it has the same
/// version and rules. The record, `/rollouts/current`, the desired version (with
/// every enable key reset, when the version changes), the end of a replaced rollout
/// and the clearing of an old emergency stop go in one transaction. `read` gives a
/// fresh snapshot.
pub async fn start<F, Fut>(
    store: &DynStore,
    schema: &Schema,
    want: &Wanted<'_>,
    now: impl Fn() -> u64,
    read: F,
) -> Result<Started, ChangeError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Snapshot, StoreError>>,
{
    let digest = rollout::digest(want.rules);
    let by = by();
    for _ in 0..ATTEMPTS {
        let snap = read().await?;
        let replaces = match begin(&snap, want.version, &digest) {
            Begin::Follow(r) => match follow_as_asked(store, schema, &snap, r, want).await? {
                Some(started) => return Ok(started),
                None => continue,
            },
            Begin::Create { replaces } => replaces,
        };
        let ids = record_ids(store, schema).await?;
        let last = match ids.last() {
            Some(id) => read_record(store, schema, id).await?,
            None => None,
        };
        let creating = Creating {
            schema,
            want,
            snap: &snap,
            replaces,
            ids,
            by: &by,
            digest: &digest,
            t: now(),
        };
        let record = creating.record(last.as_ref())?;
        let (created, compares, ops) = creating.writes(record);
        if applied(store, schema, compares, ops, &created.record).await? {
            return Ok(Started::Created(Box::new(created)));
        }
    }
    Err(ChangeError::Moving)
}

/// Following the active rollout: with more stages, or forced now where its rules'
/// intent no longer passes the check (every driver drives it as written from now
/// on), its record says so, compared on what was read. `None`: something moved.
async fn follow_as_asked(
    store: &DynStore,
    schema: &Schema,
    snap: &Snapshot,
    mut rec: RolloutRecord,
    want: &Wanted<'_>,
) -> Result<Option<Started>, ChangeError> {
    let wider = staged(&want.order, Some(&rec.stages), want.stages)?;
    let newly_forced = want.forced && !rec.forced;
    if wider.is_none() && !newly_forced {
        return Ok(Some(Started::Follow(Box::new(rec))));
    }
    if let Some(w) = wider {
        rec.stages = w;
    }
    rec.forced |= newly_forced;
    let compares = compares_on(schema, snap.rollout.as_ref());
    if apply(store, schema, compares, vec![writes::record_put(schema, &rec)]).await? {
        return Ok(Some(Started::Follow(Box::new(rec))));
    }
    Ok(None)
}

/// A new rollout being decided on what one read found.
struct Creating<'a> {
    schema: &'a Schema,
    want: &'a Wanted<'a>,
    snap: &'a Snapshot,
    /// The current rollout it replaces, as read.
    replaces: Option<CurrentRollout>,
    /// The ids of the records kept.
    ids: Vec<RolloutId>,
    by: &'a str,
    digest: &'a str,
    t: u64,
}

impl Creating<'_> {
    /// Its record (`last`: the newest record kept). Ids are a second's stamp and
    /// the version: two rollouts to one version in the same second get the next
    /// free second.
    fn record(&self, last: Option<&RolloutRecord>) -> Result<RolloutRecord, ChangeError> {
        let version = self.want.version;
        let mut record = RolloutRecord::start(
            version.clone(),
            previous_of(self.snap, version, last),
            self.want.rules.clone(),
            self.by,
            self.t,
        );
        record.forced = self.want.forced;
        if let Some(st) = self.stages()? {
            record.stages = st;
        }
        let mut stamp = self.t;
        while self.ids.contains(&record.id) {
            stamp += 1;
            record.id = RolloutId::new(stamp, version);
        }
        Ok(record)
    }

    /// The stages it starts. The active rollout to this version with other rules
    /// and a refused `--stage`: this would be a new rollout, which starts with the
    /// first stage. Say so.
    fn stages(&self) -> Result<Option<Vec<String>>, ChangeError> {
        let other_rules = self.active_replaced().filter(|r| &r.version == self.want.version);
        match staged(&self.want.order, None, self.want.stages) {
            Err(ChangeError::Unusable(e)) if other_rules.is_some() => {
                let r = other_rules
                    .map(|r| (r.id.to_string(), r.rules_digest()))
                    .unwrap_or_default();
                Err(ChangeError::Unusable(format!(
                    "{e}; note: the active rollout {} to {} has other rules ({}, these are {}), so this command would start a new rollout, not continue that one (give the same rules to continue it)",
                    r.0, self.want.version, r.1, self.digest
                )))
            }
            other => other,
        }
    }

    fn active_replaced(&self) -> Option<&RolloutRecord> {
        self.replaces
            .as_ref()
            .and_then(CurrentRollout::ok)
            .filter(|r| r.state.active())
    }

    /// What is written, in one transaction, and on which compares.
    fn writes(self, record: RolloutRecord) -> (Created, Vec<Compare>, Vec<Op>) {
        let (schema, snap, version) = (self.schema, self.snap, self.want.version);
        let mut ops = Vec::new();
        if snap.current.as_ref() != Some(version) {
            ops.extend(writes::start_rollout_ops(schema, version));
        } else if self.active_replaced().is_some() {
            // The keys the replaced rollout armed were admitted under its rules, not
            // these: the new one starts from nothing armed (hosts in flight finish
            // and keep their slots).
            ops.extend(writes::global_disable_ops(schema));
        }
        if let Some(old) = self.replaces.as_ref().and_then(CurrentRollout::ok)
            && let Ok(ended) = old.supersede(self.by, &record.id, self.t)
        {
            ops.push(writes::record_put(schema, &ended));
        }
        let cleared_halt = snap.halt.as_ref().map(|(h, _)| h.clone());
        if cleared_halt.is_some() {
            ops.push(Op::Delete(schema.lock(HALT)));
        }
        ops.push(writes::record_put(schema, &record));
        ops.push(Op::put(schema.current_rollout(), record.id.to_string()));
        let current = self.replaces.as_ref().and_then(|c| RolloutId::parse(&c.id));
        let prune: Vec<RolloutId> = rollout::beyond_history(&self.ids, current.as_ref())
            .into_iter()
            .take(20)
            .collect();
        ops.extend(prune.iter().map(|id| Op::Delete(schema.rollout(id))));
        let mut compares = compares_on(schema, self.replaces.as_ref());
        compares.push(Compare::Absent(schema.rollout(&record.id)));
        // The desired version and the halt as read: every jioctl write of them bumps it.
        compares.push(Compare::ModRevision(
            schema.lock(jio_common::fleet::EPOCH),
            snap.epoch,
        ));
        let created = Created {
            record,
            replaced: self.replaces,
            cleared_halt,
            pruned: prune.len(),
        };
        (created, compares, ops)
    }
}

/// Applies a new rollout's writes: whether they landed. Sent but not confirmed (a
/// timeout under load): the compares make it all or nothing, so the record as
/// stored says which. Ours is there and current: it was applied; otherwise nothing
/// was.
async fn applied(
    store: &DynStore,
    schema: &Schema,
    compares: Vec<Compare>,
    ops: Vec<Op>,
    record: &RolloutRecord,
) -> Result<bool, ChangeError> {
    match apply(store, schema, compares, ops).await {
        Ok(applied) => Ok(applied),
        Err(StoreError::Ambiguous { .. }) => {
            let stored = read_record(store, schema, &record.id).await?;
            let current = store.get(&schema.current_rollout()).await?;
            Ok(
                stored.as_ref() == Some(record)
                    && current.is_some_and(|kv| kv.value == record.id.to_string()),
            )
        }
        Err(e) => Err(e.into()),
    }
}

/// The stages the rollout `jioctl upgrade version --stage requested` with `rules`
/// would have on `snap` (empty: every stage), or why the command would be refused
/// (for `--noop`, which must say what the command would do).
pub fn stages_of(
    snap: &Snapshot,
    version: &Version,
    rules: &serde_json::Value,
    order: &[String],
    requested: &[String],
) -> Result<Vec<String>, String> {
    let (started, following) = match begin(snap, version, &rollout::digest(rules)) {
        Begin::Follow(r) => (Some(r.stages.clone()), true),
        Begin::Create { .. } => (None, false),
    };
    match staged(order, started.as_deref(), requested) {
        Ok(Some(s)) => Ok(s),
        Ok(None) if following => Ok(started.unwrap_or_default()),
        Ok(None) => Ok(Vec::new()),
        Err(e) => Err(e.to_string()),
    }
}

/// The stages a composable rollout has after `jioctl upgrade [--stage requested]`
/// (`order`: the rules' stages; `started`: the record's when following a rollout,
/// where empty means every stage, or `None` for a new rollout; `requested` empty:
/// every stage): `None` when the record needs no change (or, new, names every
/// stage). A stage may start only once every stage written before it has started
/// (or starts with it); stages never go away once started.
fn staged(
    order: &[String],
    started: Option<&[String]>,
    requested: &[String],
) -> Result<Option<Vec<String>>, ChangeError> {
    if order.is_empty() {
        return Ok(None);
    }
    let have: Vec<String> = match started {
        // Following a rollout of every stage: nothing to add.
        Some([]) => return Ok(None),
        Some(s) => s.to_vec(),
        None => Vec::new(),
    };
    let want: Vec<String> = order
        .iter()
        .filter(|s| requested.is_empty() || requested.contains(s) || have.contains(s))
        .cloned()
        .collect();
    if let Some(pos) = order.iter().rposition(|s| want.contains(s)) {
        let missing: Vec<&String> = order[..pos].iter().filter(|s| !want.contains(s)).collect();
        if !missing.is_empty() {
            return Err(ChangeError::Unusable(format!(
                "--stage {}: stage {} comes first in the rules and is not started (give --stage {} too, or first)",
                requested.join(","),
                missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
                missing[0]
            )));
        }
    }
    // Every stage: the record says nothing (as a rollout without --stage).
    let want = if want.len() == order.len() {
        Vec::new()
    } else {
        want
    };
    if started.is_some_and(|s| s == want.as_slice()) || (started.is_none() && want.is_empty()) {
        return Ok(None);
    }
    Ok(Some(want))
}

/// An operator's change of the current rollout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Pause {
        reason: Option<String>,
        until: Option<u64>,
    },
    Resume,
    /// Ends the canary phase: the rest of the fleet is admitted.
    Promote {
        reason: Option<String>,
    },
    Abort {
        reason: Option<String>,
    },
    /// `force`: the operator went ahead although the intent was unclear.
    Undo {
        force: bool,
    },
}

/// Why an operator's change was not made.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    #[error("no rollout is active{}", last.as_ref().map(|l| format!(" (the last one, {l})")).unwrap_or_default())]
    NoRollout { last: Option<String> },
    #[error(transparent)]
    Transition(#[from] TransitionError),
    #[error("{0}")]
    Unusable(String),
    /// Not an error: an unreadable current rollout was ended (abort).
    #[error("{0}")]
    EndedUnreadable(String),
    #[error("the rollout records kept changing under this change ({ATTEMPTS} attempts); nothing was written")]
    Moving,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What an operator's change wrote.
#[derive(Debug)]
pub struct Changed {
    /// The current (or last) rollout after the change.
    pub record: RolloutRecord,
    /// For undo: the new rollout back.
    pub started: Option<RolloutRecord>,
    /// For undo of an active rollout: it was aborted first (in the same transaction).
    pub aborted_first: bool,
}

/// The ops of a change decided on `cur` (the record as read) at `now`.
fn change_ops(
    schema: &Schema,
    snap: &Snapshot,
    rec: &RolloutRecord,
    change: &Change,
    by: &str,
    now: u64,
) -> Result<(Vec<Op>, Changed), TransitionError> {
    let mut ops = Vec::new();
    let changed = match change {
        Change::Pause { reason, until } => {
            let r = rec.pause(by, reason.clone(), *until, now)?;
            // Hosts enabled but not started must not start while paused: the keys go
            // (an agent's start is fenced on them); hosts in flight finish.
            ops.extend(writes::global_disable_ops(schema));
            ops.push(writes::record_put(schema, &r));
            Changed {
                record: r,
                started: None,
                aborted_first: false,
            }
        }
        Change::Resume => {
            let r = rec.resume(by, now)?;
            ops.push(writes::record_put(schema, &r));
            Changed {
                record: r,
                started: None,
                aborted_first: false,
            }
        }
        Change::Promote { reason } => {
            let r = rec.promote(by, reason.clone(), now)?;
            ops.push(writes::record_put(schema, &r));
            Changed {
                record: r,
                started: None,
                aborted_first: false,
            }
        }
        Change::Abort { reason } => {
            let r = rec.abort(by, reason.clone(), now)?;
            ops.extend(writes::end_ops(schema, &r, true));
            Changed {
                record: r,
                started: None,
                aborted_first: false,
            }
        }
        Change::Undo { force } => {
            let (ended, aborted_first) = if rec.state.active() {
                (rec.abort(by, Some("undone".into()), now)?, true)
            } else {
                (rec.clone(), false)
            };
            let mut back = ended.undo(by, now)?;
            back.forced |= *force;
            if aborted_first {
                ops.push(writes::record_put(schema, &ended));
            }
            if snap.current.as_ref() != Some(&back.version) {
                ops.extend(writes::start_rollout_ops(schema, &back.version));
            } else {
                ops.extend(writes::global_disable_ops(schema));
            }
            if snap.halt.is_some() {
                // Starting a rollout is the decision to go on after an emergency stop.
                ops.push(Op::Delete(schema.lock(HALT)));
            }
            ops.push(writes::record_put(schema, &back));
            ops.push(Op::put(schema.current_rollout(), back.id.to_string()));
            Changed {
                record: ended,
                started: Some(back),
                aborted_first,
            }
        }
    };
    Ok((ops, changed))
}

/// Applies an operator's change to the current rollout (undo: to the last one when
/// none is active).
pub async fn change<F, Fut>(
    store: &DynStore,
    schema: &Schema,
    change: &Change,
    now: impl Fn() -> u64,
    read: F,
) -> Result<Changed, ChangeError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Snapshot, StoreError>>,
{
    let by = by();
    for _ in 0..ATTEMPTS {
        let snap = read().await?;
        let (rec, compares) = match &snap.rollout {
            Some(cur) => match (&cur.record, change) {
                (Ok(r), _) => (r.clone(), compares_on(schema, Some(cur))),
                (Err(e), Change::Abort { .. }) => {
                    // An unreadable record can still be ended: the current key goes
                    // with every enable key; the record is left as it is.
                    let mut ops = vec![Op::Delete(schema.current_rollout())];
                    ops.extend(writes::global_disable_ops(schema));
                    if apply(store, schema, compares_on(schema, Some(cur)), ops).await? {
                        return Err(ChangeError::EndedUnreadable(format!(
                            "{e}; /rollouts/current no longer names it and every enable key was reset (the record is left as it is)"
                        )));
                    }
                    continue;
                }
                (Err(e), _) => {
                    return Err(ChangeError::Unusable(format!(
                        "{e}; `jioctl rollout abort` ends it"
                    )));
                }
            },
            None => {
                let last = last_record(store, schema).await?;
                match (change, last) {
                    (Change::Undo { .. }, Some(l)) => {
                        let cmp = vec![
                            Compare::Absent(schema.current_rollout()),
                            Compare::ModRevision(schema.lock(jio_common::fleet::EPOCH), snap.epoch),
                        ];
                        (l, cmp)
                    }
                    (_, last) => {
                        return Err(ChangeError::NoRollout {
                            last: last.map(|l| format!("{}, {}", l.id, l.state.name())),
                        });
                    }
                }
            }
        };
        let (ops, changed) = change_ops(schema, &snap, &rec, change, &by, now())?;
        if apply(store, schema, compares, ops).await? {
            return Ok(changed);
        }
    }
    Err(ChangeError::Moving)
}

/// The emergency stop's end of the current rollout, when one is active.
pub fn emergency_ops(
    schema: &Schema,
    snap: &Snapshot,
    by: &str,
    now: u64,
) -> (Vec<Compare>, Vec<Op>, Option<RolloutRecord>) {
    let Some(cur) = &snap.rollout else {
        return (vec![Compare::Absent(schema.current_rollout())], vec![], None);
    };
    let compares = compares_on(schema, Some(cur));
    match cur.ok().map(|r| r.emergency_stop(by, now)) {
        Some(Ok(ended)) => (compares, writes::end_ops(schema, &ended, false), Some(ended)),
        _ => (compares, vec![Op::Delete(schema.current_rollout())], None),
    }
}

/// Every record id in the store, oldest first.
pub async fn record_ids(store: &DynStore, schema: &Schema) -> Result<Vec<RolloutId>, StoreError> {
    let prefix = schema.rollouts();
    let listing = store.list(&prefix).await?;
    let mut ids: Vec<RolloutId> = listing
        .kvs
        .iter()
        .filter_map(|kv| kv.key.as_str().strip_prefix(prefix.as_str()))
        .filter_map(RolloutId::parse)
        .collect();
    ids.sort();
    Ok(ids)
}

/// One record (`None`: missing or unreadable).
pub async fn read_record(
    store: &DynStore,
    schema: &Schema,
    id: &RolloutId,
) -> Result<Option<RolloutRecord>, StoreError> {
    Ok(store
        .get(&schema.rollout(id))
        .await?
        .and_then(|kv| jio_common::values::parse_json(&kv).ok()))
}

/// The newest record.
pub async fn last_record(store: &DynStore, schema: &Schema) -> Result<Option<RolloutRecord>, StoreError> {
    match record_ids(store, schema).await?.last() {
        Some(id) => read_record(store, schema, id).await,
        None => Ok(None),
    }
}

/// Every record, newest first; records that cannot be read are reported by key.
pub async fn history(
    store: &DynStore,
    schema: &Schema,
) -> Result<(Vec<RolloutRecord>, Vec<String>), StoreError> {
    let prefix = schema.rollouts();
    let listing = store.list(&prefix).await?;
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for kv in &listing.kvs {
        if kv.key == schema.current_rollout() {
            continue;
        }
        match jio_common::values::parse_json::<RolloutRecord>(kv) {
            Ok(r) => out.push(r),
            Err(e) => problems.push(e.to_string()),
        }
    }
    out.sort_by(|a, b| b.id.cmp(&a.id));
    Ok((out, problems))
}

/// The failed hosts of a snapshot and why, for a record's `failed` state.
pub fn failed_hosts(snap: &Snapshot) -> BTreeMap<String, String> {
    let hooks = snap
        .hook_failures()
        .into_iter()
        .map(|(h, r)| (h.to_string(), r.describe()));
    snap.failures
        .iter()
        .map(|(h, (step, value))| {
            // The run's result says more than the entry's reason (what the failing
            // command printed: apt's `E:` line, Puppet's first error).
            let message = snap
                .results
                .get(h)
                .filter(|r| !r.ok && Some(&r.version) == snap.current.as_ref())
                .and_then(|r| r.message.as_deref());
            let why = match message {
                Some(m) if crate::status::is_link(value) => format!("{m} (log: {value})"),
                Some(m) => m.to_string(),
                None => crate::status::describe_entry(value),
            };
            (h.to_string(), format!("{} failed: {why}", step.as_str()))
        })
        .chain(hooks)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use jio_common::rollout::RolloutState;
    use jio_common::store::DynStore;

    fn v(s: &str) -> Version {
        Version::new(s).unwrap()
    }

    fn with(rec: Option<RolloutRecord>, current: Option<&str>) -> Snapshot {
        Snapshot {
            current: current.map(v),
            rollout: rec.map(|r| CurrentRollout {
                id: r.id.to_string(),
                current_revision: 5,
                record_revision: 5,
                record: Ok(r),
            }),
            ..Snapshot::default()
        }
    }

    #[test]
    fn upgrade_follows_the_same_rollout_and_replaces_any_other() {
        let rules = serde_json::json!({"rolling_rules": {"global": 1}});
        let d = rollout::digest(&rules);
        let running = RolloutRecord::start(v("v2"), Some(v("v1")), rules.clone(), "a", 10);
        let snap = with(Some(running.clone()), Some("v2"));
        assert_eq!(begin(&snap, &v("v2"), &d), Begin::Follow(running.clone()));
        // Other rules, another version, an ended one: a new rollout.
        assert!(matches!(
            begin(&snap, &v("v2"), "other"),
            Begin::Create { replaces: Some(_) }
        ));
        assert!(matches!(
            begin(&snap, &v("v3"), &d),
            Begin::Create { replaces: Some(_) }
        ));
        let done = running.finish(BTreeMap::new(), "d", 20).unwrap();
        assert!(matches!(
            begin(&with(Some(done), Some("v2")), &v("v2"), &d),
            Begin::Create { .. }
        ));
        assert_eq!(
            begin(&with(None, None), &v("v2"), &d),
            Begin::Create { replaces: None }
        );
    }

    #[test]
    fn the_previous_version() {
        let last = RolloutRecord::start(v("v2"), Some(v("v1")), serde_json::json!({}), "a", 10);
        // The fleet is told v1: a rollout to v2 goes back to v1.
        assert_eq!(
            previous_of(&with(None, Some("v1")), &v("v2"), None),
            Some(v("v1"))
        );
        // Again to v2 (after a failure): back to what the last rollout to v2 came from.
        assert_eq!(
            previous_of(&with(None, Some("v2")), &v("v2"), Some(&last)),
            Some(v("v1"))
        );
        assert_eq!(previous_of(&with(None, None), &v("v2"), None), None);
    }

    #[test]
    fn pause_resets_the_keys_and_undo_of_an_active_rollout_aborts_it_first() {
        let schema = Schema::default();
        let rec = RolloutRecord::start(v("v2"), Some(v("v1")), serde_json::json!({}), "a", 10);
        let snap = with(Some(rec.clone()), Some("v2"));
        let pause = Change::Pause {
            reason: Some("night".into()),
            until: None,
        };
        let (ops, ch) = change_ops(&schema, &snap, &rec, &pause, "bob", 20).unwrap();
        assert_eq!(ch.record.state.name(), "paused");
        assert!(ops.iter().any(|o| matches!(o, Op::DeletePrefix(_))), "{ops:?}");
        let (ops, ch) = change_ops(&schema, &snap, &rec, &Change::Undo { force: false }, "bob", 30).unwrap();
        assert!(ch.aborted_first);
        assert!(matches!(ch.record.state, RolloutState::Aborted { .. }));
        let back = ch.started.unwrap();
        assert_eq!(back.version, v("v1"));
        assert!(
            ops.iter()
                .any(|o| matches!(o, Op::Put { key, value, .. } if *key == schema.current_version() && value == "v1")),
            "{ops:?}"
        );
        assert!(change_ops(&schema, &snap, &rec, &Change::Resume, "bob", 40).is_err());
    }

    fn memory() -> DynStore {
        std::sync::Arc::new(jio_common::store::MemoryStore::new())
    }

    async fn started(store: &DynStore, rules: serde_json::Value, now: u64) -> Started {
        let schema = Schema::default();
        let want = Wanted {
            version: &v("v2"),
            rules: &rules,
            order: stage_order(&jio_common::rules::Rules::parse(&rules.to_string()).unwrap()),
            stages: &[],
            forced: false,
        };
        start(store, &schema, &want, || now, || Snapshot::read(store, &schema))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn replacing_an_active_rollout_of_the_same_version_disarms_its_keys() {
        let store = memory();
        let schema = Schema::default();
        let host = schema.enable(&jio_common::keys::EnableLevel::Host(
            jio_common::names::HostName::new("compute1").unwrap(),
        ));
        let Started::Created(a) =
            started(&store, serde_json::json!({"rolling_rules": {"global": 4}}), 10).await
        else {
            panic!("a new rollout");
        };
        // Its driver admitted a host under its rules.
        store.put(&host, "true", None).await.unwrap();
        let same = started(&store, serde_json::json!({"rolling_rules": {"global": 4}}), 11).await;
        assert!(
            matches!(same, Started::Follow(_)),
            "same version, same rules: followed"
        );
        assert!(
            store.get(&host).await.unwrap().is_some(),
            "following writes nothing"
        );
        let Started::Created(b) =
            started(&store, serde_json::json!({"rolling_rules": {"global": 1}}), 12).await
        else {
            panic!("other rules: a new rollout");
        };
        assert_eq!(
            b.replaced.as_ref().map(|c| c.id.clone()),
            Some(a.record.id.to_string())
        );
        assert!(
            store.get(&host).await.unwrap().is_none(),
            "the keys armed under the replaced rules are reset"
        );
        let old = read_record(&store, &schema, &a.record.id).await.unwrap().unwrap();
        assert!(
            matches!(old.state, RolloutState::Aborted { superseded_by: Some(ref n), .. } if *n == b.record.id)
        );
        // Same version and second again: the next free second.
        let Started::Created(c) = started(&store, serde_json::json!({}), 12).await else {
            panic!("a new rollout");
        };
        assert_ne!(c.record.id, b.record.id);
        assert_eq!(c.record.started_at(), 12, "the start is the real time");
    }

    #[test]
    fn undo_clears_an_emergency_stop() {
        let schema = Schema::default();
        let rec = RolloutRecord::start(v("v2"), Some(v("v1")), serde_json::json!({}), "a", 10)
            .emergency_stop("bob", 20)
            .unwrap();
        let mut snap = with(None, Some("v2"));
        snap.halt = Some((
            LockRecord {
                holder: "bob".into(),
                host: "ops".into(),
                pid: 1,
                since: 20,
            },
            7,
        ));
        let (ops, _) = change_ops(&schema, &snap, &rec, &Change::Undo { force: false }, "bob", 30).unwrap();
        assert!(ops.contains(&Op::Delete(schema.lock(HALT))), "{ops:?}");
    }

    /// A store that applies the first transaction and then reports it as not
    /// confirmed, as a timeout under load does.
    struct Unconfirmed {
        inner: DynStore,
        done: std::sync::atomic::AtomicBool,
    }

    #[async_trait::async_trait]
    impl jio_common::store::Store for Unconfirmed {
        fn url(&self) -> &str {
            self.inner.url()
        }
        async fn ping(&self) -> Result<i64, StoreError> {
            self.inner.ping().await
        }
        async fn get(
            &self,
            k: &jio_common::keys::Key,
        ) -> Result<Option<jio_common::store::KeyValue>, StoreError> {
            self.inner.get(k).await
        }
        async fn get_many(
            &self,
            k: &[jio_common::keys::Key],
        ) -> Result<Vec<Option<jio_common::store::KeyValue>>, StoreError> {
            self.inner.get_many(k).await
        }
        async fn list(&self, p: &jio_common::keys::Key) -> Result<jio_common::store::Listing, StoreError> {
            self.inner.list(p).await
        }
        async fn put(
            &self,
            k: &jio_common::keys::Key,
            v: &str,
            l: Option<&jio_common::store::LeaseId>,
        ) -> Result<i64, StoreError> {
            self.inner.put(k, v, l).await
        }
        async fn delete(&self, k: &jio_common::keys::Key) -> Result<bool, StoreError> {
            self.inner.delete(k).await
        }
        async fn delete_prefix(&self, p: &jio_common::keys::Key) -> Result<u64, StoreError> {
            self.inner.delete_prefix(p).await
        }
        async fn txn(&self, t: Txn) -> Result<TxnOutcome, StoreError> {
            let out = self.inner.txn(t).await?;
            if !self.done.swap(true, std::sync::atomic::Ordering::SeqCst) {
                return Err(StoreError::Ambiguous {
                    url: "memory".into(),
                    op: "transaction",
                    reason: "operation timed out".into(),
                });
            }
            Ok(out)
        }
        async fn grant_lease(
            &self,
            ttl: std::time::Duration,
        ) -> Result<jio_common::store::Lease, StoreError> {
            self.inner.grant_lease(ttl).await
        }
        async fn keep_alive(
            &self,
            l: &jio_common::store::LeaseId,
        ) -> Result<std::time::Duration, StoreError> {
            self.inner.keep_alive(l).await
        }
        async fn revoke_lease(&self, l: &jio_common::store::LeaseId) -> Result<(), StoreError> {
            self.inner.revoke_lease(l).await
        }
        async fn watch(
            &self,
            p: &jio_common::keys::Key,
            from: i64,
        ) -> Result<jio_common::store::WatchStream, StoreError> {
            self.inner.watch(p, from).await
        }
        async fn compact(&self, r: i64) -> Result<(), StoreError> {
            self.inner.compact(r).await
        }
    }

    #[tokio::test]
    async fn a_start_applied_but_not_confirmed_is_found_and_not_written_twice() {
        let schema = Schema::default();
        let inner = memory();
        let store: DynStore = std::sync::Arc::new(Unconfirmed {
            inner: inner.clone(),
            done: std::sync::atomic::AtomicBool::new(false),
        });
        let rules = serde_json::json!({"rolling_rules": {"global": 1}});
        let Started::Created(c) = started(&store, rules, 10).await else {
            panic!("the applied start is reported as created");
        };
        let ids = record_ids(&inner, &schema).await.unwrap();
        assert_eq!(ids, vec![c.record.id.clone()], "one record, written once");
        let current = inner.get(&schema.current_rollout()).await.unwrap().unwrap();
        assert_eq!(current.value, c.record.id.to_string());
    }
}

#[cfg(test)]
mod staged_tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn stages_only_grow_in_the_order_written() {
        let order = v(&["cp", "compute", "edge"]);
        // New rollouts.
        assert_eq!(staged(&order, None, &[]).unwrap(), None);
        assert_eq!(staged(&order, None, &v(&["cp"])).unwrap(), Some(v(&["cp"])));
        assert!(staged(&order, None, &v(&["compute"])).is_err());
        assert_eq!(
            staged(&order, None, &v(&["cp", "compute", "edge"])).unwrap(),
            None
        );
        // Following: more stages, never fewer.
        assert_eq!(
            staged(&order, Some(&v(&["cp"])), &v(&["compute"])).unwrap(),
            Some(v(&["cp", "compute"]))
        );
        assert_eq!(staged(&order, Some(&v(&["cp"])), &v(&["cp"])).unwrap(), None);
        assert_eq!(staged(&order, Some(&v(&["cp"])), &[]).unwrap(), Some(vec![]));
        assert_eq!(staged(&order, Some(&[]), &v(&["cp"])).unwrap(), None);
        assert!(staged(&order, Some(&v(&["cp"])), &v(&["edge"])).is_err());
        assert_eq!(
            staged(&order, Some(&v(&["cp", "compute"])), &v(&["edge"])).unwrap(),
            Some(vec![])
        );
    }
}
