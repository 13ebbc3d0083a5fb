//! What a pass reads before it decides: the desired version, the three enable keys,
//! the rollout lock, the holds on the host and its role, `/rollouts/current` and the
//! host's last result (one request), the active rollout's record (a second request,
//! only while a rollout is active and its id is new), the local version, and what the
//! journal and the health checks remember. Reading only: nothing here writes or
//! decides.
//!
//! A pass woken by a watch need not read at all: `View` keeps the keys of the last
//! read, brought up to date by the watches' events since. It serves a pass only
//! when nothing but those events can have changed what it holds (see `View`); what
//! a run then starts on is fenced on the revisions it holds, as after a read.

use jio_common::fleet::{CurrentRollout, ROLLOUT_LOCK};
use jio_common::gate::{self, GateKeys, KeyState};
use jio_common::keys::{EnableLevel, HoldTarget, Key, Schema};
use jio_common::names::{HostName, Role, Service, Version};
use jio_common::phase::{FinalizeGrant, Grant, When};
use jio_common::rules::Rules;
use jio_common::store::{Compare, DynStore, KeyValue, Op, Revision, StoreError, WatchEvent};
use jio_common::values::{HostResult, parse_json, parse_version};

use crate::decide::{CommandFacts, ComposeFacts, Health, Hold, Observation, RolloutFacts};
use crate::error::AgentError;
use crate::state::{self, Journal};

/// Who is observing: the host, its role and where things are.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub schema: &'a Schema,
    pub host: &'a HostName,
    pub role: &'a Role,
}

impl Subject<'_> {
    /// The host, role and global enable keys, in that order.
    fn gate_keys(&self) -> [Key; 3] {
        [
            self.schema.enable(&EnableLevel::Host(self.host.clone())),
            self.schema.enable(&EnableLevel::Role(self.role.clone())),
            self.schema.enable(&EnableLevel::Global),
        ]
    }

    /// The host's and its role's hold keys, in that order.
    fn hold_keys(&self) -> [Key; 2] {
        [
            self.schema.hold(&HoldTarget::Host(self.host.clone())),
            self.schema.hold(&HoldTarget::Role(self.role.clone())),
        ]
    }

    /// The keys whose changes should wake the agent (a hold's release at once).
    pub fn watched_keys(&self) -> Vec<Key> {
        let mut keys = vec![self.schema.current_version()];
        keys.extend(self.gate_keys());
        keys.extend(self.hold_keys());
        keys.push(self.schema.current_rollout());
        keys.push(self.schema.command_inbox(self.host));
        keys
    }

    /// The prefix of the phase grants, watched (one watch for the role's grant and
    /// the finalize grant) only while a composable rollout is active.
    pub fn steps_watch(&self) -> Key {
        self.schema.steps()
    }

    /// The phase granted to the host's role and the finalize grant (composable
    /// rollouts), in that order.
    fn grant_keys(&self) -> [Key; 2] {
        [self.schema.grant(self.role), self.schema.finalize_grant()]
    }

    /// The fence of a composable rollout's step: the start's, and the grants still
    /// as read.
    pub fn task_fence(&self, obs: &Observation) -> Vec<Compare> {
        let mut c = self.start_fence(obs);
        c.extend(
            self.grant_keys()
                .into_iter()
                .zip(obs.compose.grant_revisions)
                .map(|(k, rev)| Compare::ModRevision(k, rev)),
        );
        c
    }

    /// The compares on what every run decided on: the desired version, the
    /// three enable keys and the package snapshot template are still at the
    /// revisions `obs` read.
    fn decided_fence(&self, obs: &Observation) -> Vec<Compare> {
        let mut c = vec![
            Compare::ModRevision(self.schema.current_version(), obs.desired_revision),
            Compare::ModRevision(self.schema.package_source(), obs.package_source_revision),
        ];
        c.extend(
            self.gate_keys()
                .into_iter()
                .zip(obs.gate_revisions)
                .map(|(k, rev)| Compare::ModRevision(k, rev)),
        );
        c
    }

    /// The compares that fence the start of an upgrade on what `obs` read: the
    /// desired version, the enable keys, both hold keys (still absent: a hold
    /// written after the observation wins) and `/rollouts/current` (its soak and id).
    pub fn start_fence(&self, obs: &Observation) -> Vec<Compare> {
        let mut c = self.decided_fence(obs);
        c.extend(
            self.hold_keys()
                .into_iter()
                .zip(obs.hold_revisions)
                .map(|(k, rev)| Compare::ModRevision(k, rev)),
        );
        c.push(Compare::ModRevision(
            self.schema.current_rollout(),
            obs.rollout_revision,
        ));
        c
    }

    /// The compares that the host's and its role's hold keys are still as `obs`
    /// read them (a hold written since wins).
    pub fn hold_fence(&self, obs: &Observation) -> Vec<Compare> {
        self.hold_keys()
            .into_iter()
            .zip(obs.hold_revisions)
            .map(|(k, rev)| Compare::ModRevision(k, rev))
            .collect()
    }

    /// The fence of a health check or repair: what it decided on, and the rollout
    /// lock still free. Holds do not stop health checks.
    pub fn health_fence(&self, obs: &Observation) -> Vec<Compare> {
        let mut c = self.decided_fence(obs);
        c.push(Compare::ModRevision(self.schema.lock(ROLLOUT_LOCK), 0));
        c
    }

    /// The fence of the soak's health check: what it decided on, whoever holds the
    /// rollout lock (the host holds its own slot while it soaks).
    pub fn soak_fence(&self, obs: &Observation) -> Vec<Compare> {
        self.decided_fence(obs)
    }
}

/// What the agent remembers, beside the store.
pub struct Memory<'a> {
    pub journal: &'a Journal,
    pub health: Health,
    pub health_due: bool,
    pub version_file: &'a std::path::Path,
    pub retry_interval: std::time::Duration,
    pub now: u64,
    /// The active rollout's parsed rules, by its id (see `RolloutCache`).
    pub rollout_cache: &'a mut RolloutCache,
    /// The services' task files as read for this pass.
    pub services: &'a crate::services::Services,
}

/// The active rollout's id and parsed rules, kept between passes: a record's rules
/// never change under its id, so a pass reads the record only when
/// `/rollouts/current` names another rollout (one store request per pass, not two).
/// A record that cannot be used is not kept: it is read again until it can.
pub type RolloutCache = Option<(String, Rules)>;

/// The keys of the last read, kept up to date by the watches' events.
///
/// It holds the keys a pass reads, as read at revision `at`, then every watch
/// event on a watched key with a later revision. The watches were open before the
/// read (they are opened first, and a reopened watch makes the view unusable until
/// the next read), so no change after `at` to a watched key is missed; one may only
/// not have arrived yet, and then its event wakes the agent again. The rollout lock
/// and the host's result are not watched: they count only for health checks and the
/// soak, and a pass that may check health reads (`Agent::pass`).
#[derive(Debug, Default)]
pub struct View {
    /// The revision of the read; 0: no usable read (the next pass reads).
    at: Revision,
    /// When the read was made.
    read_at: Option<tokio::time::Instant>,
    keys: Vec<(Key, Option<KeyValue>)>,
}

impl View {
    /// Whether a pass may use the view instead of reading.
    pub fn usable(&self) -> bool {
        self.at > 0
    }

    /// Whether the view comes from a read made less than `age` ago (the daemon's
    /// resync reads, as a safety net under the watches).
    pub fn younger_than(&self, age: std::time::Duration) -> bool {
        self.read_at.is_some_and(|t| t.elapsed() < age)
    }

    /// The next pass reads (after the agent wrote, a watch was reopened, or a pass
    /// failed).
    pub fn invalidate(&mut self) {
        self.at = 0;
    }

    /// One watch event. Events from before the read are already in it; a key that
    /// only shares a watched key's prefix (`/enable/host/compute10` for `compute1`)
    /// is not one of the view's keys; a reset (after a compaction) drops the view.
    pub fn apply(&mut self, ev: &WatchEvent) {
        if !self.usable() {
            return;
        }
        let (key, value, revision) = match ev {
            WatchEvent::Put(kv) => (&kv.key, Some(kv), kv.mod_revision),
            WatchEvent::Delete { key, revision } => (key, None, *revision),
            WatchEvent::Reset { .. } => return self.invalidate(),
        };
        if revision <= self.at {
            return;
        }
        if let Some((_, slot)) = self.keys.iter_mut().find(|(k, _)| k == key)
            && slot.as_ref().is_none_or(|kv| kv.mod_revision < revision)
        {
            *slot = value.cloned();
        }
    }

    /// This agent's own transaction `ops`, committed at `revision`: the view holds
    /// what it wrote to the view's keys (the host's result), as a read after it
    /// would. Returns whether the view is usable (a store without revisions never
    /// is). Later events on those keys still win; earlier ones are already in.
    pub fn wrote(&mut self, ops: &[Op], revision: Revision) -> bool {
        if !self.usable() || revision <= self.at {
            return false;
        }
        for op in ops {
            let (key, value, lease) = match op {
                Op::Put { key, value, lease } => (key, Some(value), lease),
                Op::Delete(key) => (key, None, &None),
                // Not written by a run's end; whatever it deleted, read again.
                Op::DeletePrefix(_) => {
                    self.invalidate();
                    return false;
                }
            };
            if let Some((_, slot)) = self.keys.iter_mut().find(|(k, _)| k == key)
                && slot.as_ref().is_none_or(|kv| kv.mod_revision < revision)
            {
                let before = slot.take();
                *slot = value.map(|value| KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                    create_revision: before.as_ref().map_or(revision, |kv| kv.create_revision),
                    mod_revision: revision,
                    version: before.as_ref().map_or(1, |kv| kv.version + 1),
                    lease: lease.clone(),
                    not_text: false,
                });
            }
        }
        true
    }

    /// The values of `keys`, if the view holds them all.
    fn values(&self, keys: &[Key]) -> Option<Vec<Option<KeyValue>>> {
        if !self.usable() || self.keys.len() != keys.len() {
            return None;
        }
        self.keys
            .iter()
            .zip(keys)
            .map(|((k, v), want)| (k == want).then(|| v.clone()))
            .collect()
    }
}

/// Reads everything one decision needs: from `view` when `read` is false and it is
/// usable, else from the store (and the view starts again from that read). An
/// invalid value is part of what was observed (the decision says the host is
/// blocked), never an error.
pub async fn observe(
    store: &DynStore,
    who: Subject<'_>,
    mem: Memory<'_>,
    view: &mut View,
    read: bool,
) -> Result<Observation, AgentError> {
    let keys = observed_keys(who);
    let got = read_observed(store, view, &keys, read).await?;
    let [
        desired,
        h,
        r,
        g,
        lock,
        host_hold,
        role_hold,
        current,
        result,
        grant,
        finalize,
        inbox,
        package_source,
    ] = <[_; 13]>::try_from(got).map_err(|_| {
        AgentError::Store(StoreError::Rejected {
            url: store.url().to_string(),
            op: "get",
            message: "the store answered a different number of keys".into(),
        })
    })?;
    let (gate_keys, gate_revisions) = gate_facts([h, r, g]);
    let desired_revision = desired.as_ref().map_or(0, |kv| kv.mod_revision);
    let (desired, desired_invalid) = desired_version(desired.as_ref());
    let (hold, hold_revisions) = hold_facts(host_hold, role_hold);
    let rollout_revision = current.as_ref().map_or(0, |kv| kv.mod_revision);
    let rollout = current_rollout(store, who, current.as_ref(), mem.rollout_cache).await?;
    let compose = compose_facts(
        who,
        &rollout,
        mem.rollout_cache.as_ref().map(|(_, r)| r),
        [&grant, &finalize],
        mem.journal,
        mem.services,
    );
    Ok(Observation {
        desired,
        desired_invalid,
        desired_revision,
        rollout_lock: lock.is_some(),
        local: state::read_local_version(mem.version_file)?,
        gate: gate::decide(&gate_keys),
        gate_revisions,
        failure: mem.journal.failure.clone(),
        unreported: !mem.journal.unreported.is_empty(),
        now: mem.now,
        retry_interval: mem.retry_interval,
        health_due: mem.health_due,
        health: mem.health,
        hold,
        hold_revisions,
        rollout,
        rollout_revision,
        // An unreadable result is overwritten by the next run; until then there is
        // no soak to check.
        result: result.as_ref().and_then(|kv| parse_json::<HostResult>(kv).ok()),
        compose,
        commands: command_facts(inbox.as_ref()),
        package_source_revision: package_source.as_ref().map_or(0, |kv| kv.mod_revision),
        // Not text: the run fails saying so, with the key (`PackageStep::of`).
        package_source: package_source.map(|kv| {
            if kv.not_text {
                "(not UTF-8 text)".to_string()
            } else {
                kv.value
            }
        }),
    })
}

/// The desired version as read (`None` when unset or invalid), and why it is invalid.
fn desired_version(kv: Option<&KeyValue>) -> (Option<Version>, Option<String>) {
    match kv.map(parse_version) {
        None => (None, None),
        Some(Ok(v)) => (v, None),
        Some(Err(e)) => (None, Some(e.to_string())),
    }
}

/// The active rollout's facts, from `/rollouts/current` as read (and the cache).
async fn current_rollout(
    store: &DynStore,
    who: Subject<'_>,
    current: Option<&KeyValue>,
    cache: &mut RolloutCache,
) -> Result<RolloutFacts, AgentError> {
    match current {
        None => {
            // No rollout: none is cached (nor watched for, see `Agent::watches_steps`).
            *cache = None;
            Ok(RolloutFacts::default())
        }
        Some(cur) => rollout_facts(store, who, cur, cache).await,
    }
}

/// The thirteen keys a decision reads, in the order `observe` takes them apart.
fn observed_keys(who: Subject<'_>) -> Vec<Key> {
    let mut keys = vec![who.schema.current_version()];
    keys.extend(who.gate_keys());
    keys.push(who.schema.lock(ROLLOUT_LOCK));
    keys.extend(who.hold_keys());
    keys.push(who.schema.current_rollout());
    keys.push(who.schema.result(who.host));
    keys.extend(who.grant_keys());
    keys.push(who.schema.command_inbox(who.host));
    // Not watched: read by every pass that reads, and fenced on by every start (a
    // change since the read makes the start lose, and the next pass reads it).
    keys.push(who.schema.package_source());
    keys
}

/// The keys' values from `view` when `read` is false and it has them all, else
/// from the store (and the view starts again from that read).
async fn read_observed(
    store: &DynStore,
    view: &mut View,
    keys: &[Key],
    read: bool,
) -> Result<Vec<Option<KeyValue>>, AgentError> {
    if let Some(got) = view.values(keys).filter(|_| !read) {
        return Ok(got);
    }
    view.invalidate();
    let (got, at) = store.get_many_at(keys).await?;
    if got.len() == keys.len() {
        view.keys = keys.iter().cloned().zip(got.iter().cloned()).collect();
        view.at = at;
        view.read_at = Some(tokio::time::Instant::now());
    }
    Ok(got)
}

/// The enable gate's host, role and global keys as read, and their revisions.
fn gate_facts(kvs: [Option<KeyValue>; 3]) -> (GateKeys, [Revision; 3]) {
    let mut states: [KeyState; 3] = Default::default();
    let mut revs: [Revision; 3] = [0; 3];
    for (i, kv) in kvs.into_iter().enumerate() {
        if let Some(kv) = kv {
            states[i] = KeyState::read(Some(&kv));
            revs[i] = kv.mod_revision;
        }
    }
    let [host, role, global] = states;
    (GateKeys { host, role, global }, revs)
}

/// The hold that keeps the host out (its own before its role's), and both holds' revisions.
fn hold_facts(host_hold: Option<KeyValue>, role_hold: Option<KeyValue>) -> (Option<Hold>, [Revision; 2]) {
    let hold_revisions = [&host_hold, &role_hold].map(|kv| kv.as_ref().map_or(0, |kv| kv.mod_revision));
    let hold = [host_hold, role_hold]
        .into_iter()
        .flatten()
        .next()
        .map(|kv| Hold {
            key: kv.key.to_string(),
            record: parse_json(&kv).map_err(|e| e.to_string()),
        });
    (hold, hold_revisions)
}

/// The fleet commands this host is admitted to, from its inbox as read.
fn command_facts(inbox: Option<&KeyValue>) -> CommandFacts {
    let Some(kv) = inbox else {
        return CommandFacts::default();
    };
    let (ids, problem) = jio_common::command_record::parse_inbox(kv);
    CommandFacts {
        inbox: ids,
        revision: kv.mod_revision,
        problem,
        ..CommandFacts::default()
    }
}

/// What a composable rollout asks of this host: the phase granted to its role (or
/// the finalize step granted to it) for the active rollout, and which of its
/// services have tasks left in it (by its task files and its journal).
fn compose_facts(
    who: Subject<'_>,
    rollout: &RolloutFacts,
    rules: Option<&Rules>,
    grants: [&Option<KeyValue>; 2],
    journal: &Journal,
    services: &crate::services::Services,
) -> ComposeFacts {
    let grant_revisions = grants.map(|kv| kv.as_ref().map_or(0, |kv| kv.mod_revision));
    let mut f = ComposeFacts {
        grant_revisions,
        ..ComposeFacts::default()
    };
    let (Some(id), Some(c)) = (&rollout.id, rules.and_then(|r| r.compose.as_ref())) else {
        return f;
    };
    f.active = true;
    let mine = c.services_of(who.role);
    let tasks = Tasks {
        id,
        journal,
        services,
    };
    let (grant, finalize, problem) = parse_grants(grants);
    f.problem = problem;
    if let Some(g) = grant
        && &g.rollout == id
    {
        if let Some(when) = g.when() {
            let granted: Vec<&Service> = mine.iter().filter(|s| g.services.contains(s)).collect();
            f.left = tasks.left(when, g.step(), &g.phase, granted.into_iter());
        }
        f.grant = Some(g);
    }
    if let Some(g) = finalize
        && &g.rollout == id
        && &g.host == who.host
    {
        let with_finalize = tasks.with_finalize(c.all_services());
        f.finalize_left = tasks.left(When::Finalize, 0, "finalize", with_finalize.into_iter());
        f.finalize = true;
    }
    let steps = own_steps(mine, services);
    if let Some(g) = &f.grant
        && let Some(k) = g.key()
    {
        f.unfinished = tasks
            .unfinished_before(&steps, (k.rank, k.step))
            .or_else(|| tasks.unfinished_at_step(g, mine));
    }
    f.unfinished_any = tasks.unfinished_before(&steps, (3, 0));
    f.touched = journal.tasks.as_ref().is_some_and(|t| {
        &t.rollout == id && !(t.done.is_empty() && t.finished.is_empty() && t.failed.is_none())
    });
    f
}

/// The phase grant and the finalize grant as read, and why either grants nothing.
fn parse_grants(grants: [&Option<KeyValue>; 2]) -> (Option<Grant>, Option<FinalizeGrant>, Option<String>) {
    let mut problems = Vec::new();
    let grant = grants[0].as_ref().and_then(|kv| {
        parse_json::<Grant>(kv)
            .map_err(|e| problems.push(format!("{e} (no driver writes such a grant: it grants nothing)")))
            .ok()
    });
    let finalize = grants[1].as_ref().and_then(|kv| {
        parse_json::<FinalizeGrant>(kv)
            .map_err(|e| problems.push(format!("{e} (no driver writes such a grant: it grants nothing)")))
            .ok()
    });
    let problem = (!problems.is_empty()).then(|| problems.join("; "));
    (grant, finalize, problem)
}

/// This host's own steps, in the order phases run: (rank, step), phase name, service.
fn own_steps<'a>(
    mine: &'a [Service],
    services: &crate::services::Services,
) -> Vec<((u8, u32), String, &'a Service)> {
    let mut steps: Vec<((u8, u32), String, &Service)> = Vec::new();
    for s in mine {
        if let Ok(file) = services.get(s) {
            for t in &file.tasks {
                let rank = match t.when {
                    When::Pre => 0,
                    When::Post => 2,
                    When::Finalize => continue,
                };
                steps.push((
                    (rank, t.step),
                    jio_common::phase::phase_name(Some(t.when), t.step),
                    s,
                ));
            }
        }
    }
    steps.sort();
    steps
}

/// The services' task files and what the journal says finished in the active rollout.
struct Tasks<'a> {
    id: &'a String,
    journal: &'a Journal,
    services: &'a crate::services::Services,
}

impl Tasks<'_> {
    /// The service finished this phase in the active rollout.
    fn done(&self, phase: &str, s: &Service) -> bool {
        self.journal
            .tasks
            .as_ref()
            .is_some_and(|t| &t.rollout == self.id && t.finished.contains(&format!("{phase}/{s}")))
    }

    /// Left in a step: a service whose file has tasks there (or cannot be read:
    /// running it says why) and that did not finish it.
    fn left<'s>(
        &self,
        when: When,
        step: u32,
        phase: &str,
        among: impl Iterator<Item = &'s Service>,
    ) -> Vec<Service> {
        among
            .filter(|s| match self.services.get(s) {
                Ok(file) => !file.tasks_at(when, step).is_empty(),
                Err(_) => true,
            })
            .filter(|s| !self.done(phase, s))
            .cloned()
            .collect::<Vec<_>>()
    }

    /// The services (of all roles) whose files have finalize tasks.
    fn with_finalize<'s>(&self, all: impl IntoIterator<Item = &'s Service>) -> Vec<&'s Service> {
        all.into_iter()
            .filter(|s| {
                self.services
                    .get(s)
                    .is_ok_and(|f| !f.tasks_at(When::Finalize, 0).is_empty())
            })
            .collect()
    }

    /// The first of this host's steps before `point` that did not finish in this rollout.
    fn unfinished_before(&self, steps: &[((u8, u32), String, &Service)], point: (u8, u32)) -> Option<String> {
        steps
            .iter()
            .filter(|(k, ..)| *k < point)
            .find(|(_, p, s)| !self.done(p, s))
            .map(|(_, p, s)| format!("{p} of {s}"))
    }

    /// At the granted step: a service of this host that a granted one runs after
    /// (through its own `after`, or through others) must have finished it first.
    fn unfinished_at_step(&self, g: &Grant, mine: &[Service]) -> Option<String> {
        let when = g.when()?;
        let after_of = |x: &Service| self.services.get(x).map(|f| f.after.clone()).unwrap_or_default();
        let mut before: Vec<Service> = Vec::new();
        let mut todo: Vec<Service> = g
            .services
            .iter()
            .filter(|x| mine.contains(x))
            .flat_map(after_of)
            .collect();
        while let Some(x) = todo.pop() {
            if !before.contains(&x) {
                todo.extend(after_of(&x));
                before.push(x);
            }
        }
        before
            .iter()
            .filter(|x| mine.contains(x) && !g.services.contains(x))
            .filter(|x| {
                self.services
                    .get(x)
                    .is_ok_and(|f| !f.tasks_at(when, g.step()).is_empty())
            })
            .find(|x| !self.done(&g.phase, x))
            .map(|x| format!("{} of {x}", g.phase))
    }
}

/// What the rollout `/rollouts/current` (as read: `cur`) names says for this host:
/// its `min_healthy_time` and id. A record that is missing or cannot be read is a
/// fact (`unusable`, naming the key). Its windows are the driver's to decide.
async fn rollout_facts(
    store: &DynStore,
    who: Subject<'_>,
    cur: &KeyValue,
    cache: &mut RolloutCache,
) -> Result<RolloutFacts, AgentError> {
    let facts = |id: &str, rules: &Rules| RolloutFacts {
        min_healthy_time: rules.min_healthy_time,
        id: Some(id.to_string()),
        unusable: None,
        reboot: rules.reboot_for(who.role),
        windowed: !rules.windows_for(who.role).is_empty(),
    };
    // A rollout's rules never change under its id: read its record once.
    if let Some((id, rules)) = cache.as_ref()
        && cur.value.trim() == id
    {
        return Ok(facts(id, rules));
    }
    *cache = None;
    let unusable = |reason: String| RolloutFacts {
        unusable: Some(reason),
        ..RolloutFacts::default()
    };
    let record = match CurrentRollout::record_key(who.schema, cur) {
        Some(key) => store.get(&key).await?,
        None => None,
    };
    let current = CurrentRollout::read(who.schema, cur, record.as_ref());
    let record = match current.record {
        Ok(r) => r,
        Err(reason) => return Ok(unusable(reason)),
    };
    let key = who.schema.rollout(&record.id);
    let rules = match Rules::parse(&record.rules.to_string()) {
        Ok(r) => r,
        Err(e) => return Ok(unusable(format!("key {key}: the rollout's rules: {e}"))),
    };
    let id = record.id.to_string();
    let out = facts(&id, &rules);
    *cache = Some((id, rules));
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn key(s: &str) -> Key {
        Key::new(s).unwrap()
    }

    fn kv(k: &str, v: &str, rev: Revision) -> KeyValue {
        KeyValue::from_bytes(key(k), v.as_bytes().to_vec(), rev, rev, 1, None)
    }

    /// A view read at revision 10: `/a` holds "1" (written at 5), `/b` is absent.
    fn view() -> (View, Vec<Key>) {
        let keys = vec![key("/a"), key("/b")];
        let v = View {
            at: 10,
            read_at: Some(tokio::time::Instant::now()),
            keys: vec![(key("/a"), Some(kv("/a", "1", 5))), (key("/b"), None)],
        };
        (v, keys)
    }

    fn value(v: &View, keys: &[Key], i: usize) -> Option<String> {
        v.values(keys).unwrap()[i].as_ref().map(|kv| kv.value.clone())
    }

    #[tokio::test]
    async fn events_after_the_read_are_applied_and_older_ones_are_not() {
        let (mut v, keys) = view();
        // Already in the read: a put of /b then its delete, both before revision 10.
        v.apply(&WatchEvent::Put(kv("/b", "old", 8)));
        v.apply(&WatchEvent::Delete {
            key: key("/a"),
            revision: 9,
        });
        assert_eq!(value(&v, &keys, 0).as_deref(), Some("1"));
        assert_eq!(value(&v, &keys, 1), None);
        // After it.
        v.apply(&WatchEvent::Put(kv("/b", "new", 11)));
        v.apply(&WatchEvent::Delete {
            key: key("/a"),
            revision: 12,
        });
        assert_eq!(value(&v, &keys, 0), None);
        assert_eq!(value(&v, &keys, 1).as_deref(), Some("new"));
        // A late event older than what the view holds for its key changes nothing.
        v.apply(&WatchEvent::Put(kv("/b", "late", 11)));
        assert_eq!(value(&v, &keys, 1).as_deref(), Some("new"));
    }

    #[tokio::test]
    async fn the_agents_own_writes_are_taken_as_a_read_would() {
        let (mut v, keys) = view();
        let ops = [Op::put(key("/b"), "mine"), Op::put(key("/other"), "x")];
        assert!(v.wrote(&ops, 12));
        assert_eq!(value(&v, &keys, 1).as_deref(), Some("mine"));
        assert_eq!(v.values(&keys).unwrap()[1].as_ref().unwrap().mod_revision, 12);
        // An event that was already in before the write changes nothing; a later
        // one wins.
        v.apply(&WatchEvent::Put(kv("/b", "before", 11)));
        assert_eq!(value(&v, &keys, 1).as_deref(), Some("mine"));
        assert!(v.wrote(&[Op::Delete(key("/a"))], 13));
        assert_eq!(value(&v, &keys, 0), None);
        v.apply(&WatchEvent::Put(kv("/b", "after", 14)));
        assert_eq!(value(&v, &keys, 1).as_deref(), Some("after"));
        // A write from before the read is in it already; a prefix delete, or a
        // view that is not usable, leaves the next pass to read.
        assert!(!v.wrote(&[Op::put(key("/b"), "stale")], 9));
        assert_eq!(value(&v, &keys, 1).as_deref(), Some("after"));
        assert!(!v.wrote(&[Op::DeletePrefix(key("/"))], 15));
        assert!(!v.usable());
        assert!(!v.wrote(&ops, 16));
    }

    #[tokio::test]
    async fn a_key_that_only_shares_the_prefix_is_not_taken() {
        let (mut v, keys) = view();
        v.apply(&WatchEvent::Put(kv("/b0", "other host", 11)));
        assert_eq!(value(&v, &keys, 1), None);
    }

    #[tokio::test]
    async fn a_reset_or_an_invalidation_makes_the_next_pass_read() {
        let (mut v, keys) = view();
        v.apply(&WatchEvent::Reset {
            kvs: vec![],
            revision: 20,
        });
        assert!(!v.usable());
        assert!(v.values(&keys).is_none());
        // Events on an unusable view are dropped: they are in the next read.
        v.apply(&WatchEvent::Put(kv("/b", "x", 21)));
        assert!(v.values(&keys).is_none());
        let (mut v, keys) = view();
        v.invalidate();
        assert!(v.values(&keys).is_none());
        // Other keys than the view's: read.
        let (v, _) = view();
        assert!(v.values(&[key("/a"), key("/c")]).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn an_old_read_is_not_used() {
        let (v, _) = view();
        assert!(v.younger_than(std::time::Duration::from_secs(60)));
        tokio::time::sleep(std::time::Duration::from_secs(61)).await;
        assert!(!v.younger_than(std::time::Duration::from_secs(60)));
    }
}
