//! The fleet as `jioctl` sees it: a snapshot built from store listings (pure), and
//! each host's state for the current version.
//!
//! Reading a snapshot costs a fixed number of prefix listings, whatever the size of
//! the fleet; `Snapshot::from_kvs` and `classify` do no I/O, so tests can feed them
//! a replayed event history.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::gate::{self, Gate, GateKeys, KeyState};
use crate::hook_record::{HookKind, HookRecord, HookState};
use crate::keys::{EnableLevel, HoldTarget, Key, Outcome, Parsed, Schema, Step};
use crate::names::{HostName, Role, Service, Version};
use crate::phase::{Catalog, FinalizeGrant, Grant};
use crate::roles::RolePattern;
use crate::rollout::{RolloutId, RolloutRecord};
use crate::store::{DynStore, KeyValue, LeaseId, Revision, StoreError};
use crate::values::{AgentRecord, HoldRecord, HostRecord, HostResult, StepStatus, parse_json, parse_version};

/// The rollout lock's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct LockRecord {
    pub holder: String,
    pub host: String,
    pub pid: u32,
    pub since: u64,
}

/// The active rollout as read: the id `/rollouts/current` names and its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentRollout {
    /// The id as written in `/rollouts/current`.
    pub id: String,
    /// `/rollouts/current`'s mod revision (operators' writes compare on it).
    pub current_revision: Revision,
    /// The record, or why it cannot be used (naming the key).
    pub record: Result<RolloutRecord, String>,
    /// The record's mod revision (0 when it is missing).
    pub record_revision: Revision,
}

impl CurrentRollout {
    /// The key of the record `cur` (`/rollouts/current` as read) names, when it names
    /// a rollout id.
    pub fn record_key(schema: &Schema, cur: &KeyValue) -> Option<Key> {
        let id = crate::values::text(cur).ok()?.trim();
        Some(schema.rollout(&RolloutId::parse(id)?))
    }

    /// The rollout `cur` names, read from `record` (the key `record_key` names, as
    /// read; `None`: missing), judged as a snapshot judges it. For a reader that
    /// fetches the two keys alone (the agent).
    pub fn read(schema: &Schema, cur: &KeyValue, record: Option<&KeyValue>) -> CurrentRollout {
        let id = cur.value.trim().to_string();
        let records: BTreeMap<String, &KeyValue> = record.map(|kv| (id, kv)).into_iter().collect();
        current_rollout_of(schema, cur, &records)
    }

    /// The record, when it can be used.
    pub fn ok(&self) -> Option<&RolloutRecord> {
        self.record.as_ref().ok()
    }
}

/// Everything `status` and the planner need, read at (about) one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub current: Option<Version>,
    /// Registered hosts and their roles.
    pub roles: BTreeMap<HostName, Role>,
    /// Hosts at each version.
    pub running: BTreeMap<HostName, BTreeSet<Version>>,
    pub global: KeyState,
    pub role_keys: BTreeMap<Role, KeyState>,
    pub host_keys: BTreeMap<HostName, KeyState>,
    /// Mod revision of each enable key that is set (host, role and global).
    pub enable_revisions: BTreeMap<EnableLevel, Revision>,
    /// Failure entries for the current version, with their values (a log link, or
    /// the agent's reason).
    pub failures: BTreeMap<HostName, (Step, String)>,
    /// Mod revision of each failure entry in `failures`.
    pub failure_revisions: BTreeMap<HostName, Revision>,
    /// Hosts with a live agent, and its record (`None` when it cannot be read).
    pub agents: BTreeMap<HostName, Option<AgentRecord>>,
    /// Run markers: runs that started and were not yet seen to end, whether or not
    /// the agent is alive (`None` when the marker cannot be read).
    pub runs: BTreeMap<HostName, Option<AgentRecord>>,
    /// Each run marker's mod revision (a reboot's permit must be newer).
    pub run_revisions: BTreeMap<HostName, Revision>,
    /// Each live agent's clock as it last wrote it (Unix ms), readable ones.
    pub clocks: BTreeMap<HostName, u64>,
    pub lock: Option<LockRecord>,
    /// The rollout lock key as read (revision, lease), to fence plans on holding it.
    pub lock_key: Option<(Revision, Option<LeaseId>)>,
    /// The emergency stop written by `global-disable-puppet`, and its mod revision.
    pub halt: Option<(LockRecord, Revision)>,
    /// The active rollout (`/rollouts/current` and the record it names).
    pub rollout: Option<CurrentRollout>,
    /// `/current_version` is set but cannot be read: why (then `current` is `None`).
    pub current_invalid: Option<String>,
    /// Driver services (`jioctl drive`) alive, by name.
    pub drivers: BTreeMap<String, LockRecord>,
    /// Holds: what is kept out of every rollout. A hold whose record cannot be read
    /// still holds (the safe reading); why is in `problems`.
    pub holds: BTreeMap<HoldTarget, Option<HoldRecord>>,
    /// Each host's last-run result (`/results/<host>`), when readable.
    pub results: BTreeMap<HostName, HostResult>,
    /// Hosts whose `/results/<host>` cannot be read (why is in `problems`).
    pub results_invalid: BTreeSet<HostName>,
    /// Mod revision of the plan epoch key (0 when absent): every `jioctl` write of
    /// enable keys or the desired version bumps it, and a plan is applied only if it
    /// has not moved since the plan was computed.
    pub epoch: Revision,
    /// Values that could not be understood, by key (reported, otherwise ignored).
    pub problems: Vec<String>,
    /// The reader's time (Unix seconds), when it gave one: a rebooting host past
    /// its deadline is lost only by a clock.
    pub now: Option<u64>,
    /// Revision of the newest listing.
    pub revision: Revision,
    /// The role of a host that has not registered: from its name, by this rule
    /// (the default is the agent's; `jioctl` sets its configured one).
    pub role_pattern: RolePattern,
    /// Each host's service catalog (`/hosts/<host>/services`), or why it cannot be
    /// read (naming the key).
    pub catalogs: BTreeMap<HostName, Result<Catalog, String>>,
    /// The phase granted to each role (`/steps/roles/<role>`), readable ones.
    pub grants: BTreeMap<Role, Grant>,
    /// The finalize grant (`/steps/finalize`), when readable.
    pub finalize_grant: Option<FinalizeGrant>,
    /// The step statuses of the active rollout: (phase, service, host) → status.
    pub step_statuses: BTreeMap<(String, Service, HostName), StepStatus>,
    /// Mod revision of each readable `/results/<host>`.
    pub result_revisions: BTreeMap<HostName, Revision>,
    /// The fleet commands each host is admitted to (`/config_state/commands/<host>`,
    /// readable ids; hosts with none are absent).
    pub inboxes: BTreeMap<HostName, Vec<crate::names::CommandId>>,
    /// Hosts whose inbox cannot be read (all of it, or some ids): why is in
    /// `problems`. What cannot be read admits nothing (its agent cannot read it
    /// either); no driver admits a host through it.
    pub inboxes_invalid: BTreeSet<HostName>,
    /// Each host's maintenance hook (`/hooks/<host>`), readable ones.
    pub hooks: BTreeMap<HostName, HookRecord>,
    /// Mod revision of each readable hook record.
    pub hook_revisions: BTreeMap<HostName, Revision>,
    /// Hosts whose hook record cannot be read (why is in `problems`): each keeps a
    /// slot until the record is fixed or deleted (a hook may be running).
    pub hooks_invalid: BTreeSet<HostName>,
}

/// A composable rollout's step that failed on a host, from its last result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepFailure {
    /// `pre-<k>`, `post-<k>` or `finalize`.
    pub phase: String,
    pub service: Option<String>,
    pub task: Option<String>,
    /// The log link, else the message.
    pub value: String,
    /// The result's mod revision (an enable key written after it retries).
    pub revision: Revision,
}

impl Snapshot {
    /// Builds a snapshot from key-values of the schema (any order, any subset).
    pub fn from_kvs<'a>(schema: &Schema, kvs: impl IntoIterator<Item = &'a KeyValue>) -> Snapshot {
        let mut live = LiveSnapshot::default();
        for kv in kvs {
            live.put(schema, kv);
        }
        live.settle(schema);
        live.snap
    }

    /// The key of the record `/rollouts/current` names, when it names a rollout id.
    fn rollout_record_key(schema: &Schema, kvs: &[KeyValue]) -> Option<Key> {
        let current = schema.current_rollout();
        let kv = kvs.iter().find(|kv| kv.key == current)?;
        Some(schema.rollout(&RolloutId::parse(kv.value.trim())?))
    }

    /// Reads a snapshot with a fixed number of listings.
    pub async fn read(store: &DynStore, schema: &Schema) -> Result<Snapshot, StoreError> {
        Snapshot::read_for(store, schema, None).await
    }

    /// Like `read`; failures are read for `version` instead of the current version
    /// (to plan a rollout to `version` before it starts).
    pub async fn read_for(
        store: &DynStore,
        schema: &Schema,
        version: Option<&Version>,
    ) -> Result<Snapshot, StoreError> {
        let (kvs, revision) = Snapshot::read_kvs(store, schema, version).await?;
        let mut snap = Snapshot::from_kvs(schema, &kvs);
        snap.revision = revision;
        if let Some(v) = version
            && snap.current.as_ref() != Some(v)
        {
            // Failures were read for `version`; record them under it.
            snap.failures.clear();
            snap.failure_revisions.clear();
            for kv in &kvs {
                if let Some(Parsed::Status(step, Outcome::Failure, fv, h)) = schema.parse(&kv.key)
                    && &fv == v
                {
                    snap.failures.insert(h.clone(), (step, kv.value.clone()));
                    snap.failure_revisions.insert(h, kv.mod_revision);
                }
            }
        }
        Ok(snap)
    }

    /// The key-values a snapshot is built from, with a fixed number of listings, and
    /// the newest revision read. Failures are those of `version`, else of the
    /// current version.
    pub async fn read_kvs(
        store: &DynStore,
        schema: &Schema,
        version: Option<&Version>,
    ) -> Result<(Vec<KeyValue>, Revision), StoreError> {
        let (kvs, revisions) = Snapshot::read_kvs_at(store, schema, version).await?;
        Ok((kvs, revisions.into_iter().max().unwrap_or(0)))
    }

    /// Like `read_kvs`, with the revision of every listing. The desired version, the
    /// enable keys and the locks are read first, the agents' records after them: an
    /// agent starts a run only in a transaction fenced on the enable keys it read, so
    /// every run that the enable keys read here do not account for is in the later
    /// listing of the records.
    pub async fn read_kvs_at(
        store: &DynStore,
        schema: &Schema,
        version: Option<&Version>,
    ) -> Result<(Vec<KeyValue>, Vec<Revision>), StoreError> {
        // The locks (and so the plan epoch) first: everything a plan depends on is
        // read at or after the epoch it is fenced on, so a write that moved the epoch
        // before any of those reads is seen by them, and one after fails the fence.
        let locks = store.list(&schema.locks()).await?;
        // The desired version is listed (not read with a get) so that its read
        // revision is known: a change after it is in the watch a live view opens.
        let first = [
            schema.current_version(),
            // The enable keys and the fleet commands' admissions.
            schema.config_state(),
            schema.current_rollout(),
            schema.drivers(),
            schema.holds(),
            schema.steps(),
            // The maintenance hooks: written by drivers with the epoch, as enable keys.
            schema.hooks(),
        ];
        let mut early = futures_util::future::try_join_all(first.iter().map(|p| store.list(p))).await?;
        let record = Snapshot::rollout_record_key(schema, &early[2].kvs);
        let current_key = schema.current_version();
        let cur_version = version.cloned().or_else(|| {
            early[0]
                .kvs
                .iter()
                .find(|kv| kv.key == current_key)
                .and_then(|kv| parse_version(kv).ok().flatten())
        });
        let mut second: Vec<Key> = vec![
            schema.hosts(),
            schema.running_versions(),
            schema.agents(),
            schema.runs(),
            schema.clocks(),
        ];
        if let Some(v) = &cur_version {
            for step in Step::ALL {
                second.push(schema.status_version_prefix(step, Outcome::Failure, v));
            }
        }
        second.extend(record);
        // The active rollout's step statuses (composable rollouts), with the other
        // reports of the agents.
        let current_id = early[2]
            .kvs
            .iter()
            .find(|kv| kv.key == schema.current_rollout())
            .and_then(|kv| RolloutId::parse(kv.value.trim()));
        second.extend(current_id.map(|id| schema.step_statuses(id.as_str())));
        early.insert(0, locks);
        let mut late = futures_util::future::try_join_all(second.iter().map(|p| store.list(p))).await?;
        // The results after the versions: an agent reports a run's running version
        // and its result in one transaction, so a host seen at the new version here
        // is seen with that run's result (its soak is not skipped on an old one).
        late.push(store.list(&schema.results()).await?);
        let revisions: Vec<Revision> = early.iter().chain(late.iter()).map(|l| l.revision).collect();
        let kvs = early.into_iter().chain(late).flat_map(|l| l.kvs).collect();
        Ok((kvs, revisions))
    }

    /// Every known host: registered, found at some version, or in flight whatever
    /// the registry says (a run marker, an agent that says it runs something or
    /// whose record cannot be read, a maintenance hook): a host in flight always
    /// counts.
    pub fn hosts(&self) -> BTreeSet<HostName> {
        let running_agents = self
            .agents
            .iter()
            .filter(|(_, r)| r.as_ref().is_none_or(|r| r.state.running()))
            .map(|(h, _)| h);
        let in_hooks = self
            .hooks
            .keys()
            .chain(self.hooks_invalid.iter())
            .filter(|h| self.hook_stage(h).is_some());
        self.roles
            .keys()
            .chain(self.running.keys().filter(|h| !self.stray(h)))
            .chain(self.runs.keys())
            .chain(running_agents)
            .chain(in_hooks)
            .cloned()
            .collect()
    }

    /// Only `/running/versions/` names `h`, and by a name no host can have (RFC
    /// 1123): another program wrote it. Reported (`settle`), never shown as a host.
    fn stray(&self, h: &HostName) -> bool {
        !h.is_dns_name()
            && !self.roles.contains_key(h)
            && !self.agents.contains_key(h)
            && !self.runs.contains_key(h)
    }

    /// A host's role: registered, else from its name by `role_pattern`, else `unknown`.
    pub fn role_of(&self, h: &HostName) -> Role {
        self.roles
            .get(h)
            .cloned()
            .or_else(|| self.role_pattern.role_of(h))
            .unwrap_or_else(|| Role::new("unknown").unwrap_or_else(|_| unreachable!()))
    }

    /// The hold that keeps the host out (its own before its role's), if any.
    pub fn hold_of(&self, h: &HostName, role: &Role) -> Option<(HoldTarget, Option<&HoldRecord>)> {
        [HoldTarget::Host(h.clone()), HoldTarget::Role(role.clone())]
            .into_iter()
            .find_map(|t| self.holds.get(&t).map(|r| (t, r.as_ref())))
    }

    /// The host's last run failed at a composable rollout's step of the current
    /// version: of the active rollout, or of any rollout when none is active (a
    /// new rollout runs every step again). Its seed `/status/` entries say nothing
    /// of it, so this is what counts it failed.
    pub fn step_failure(&self, h: &HostName) -> Option<StepFailure> {
        let r = self.results.get(h)?;
        if r.ok || Some(&r.version) != self.current.as_ref() {
            return None;
        }
        let phase = r.step.clone()?;
        match crate::phase::parse_phase(&phase) {
            Some((Some(_), _)) => {}
            _ => return None,
        }
        if let Some(active) = self
            .rollout
            .as_ref()
            .filter(|c| c.ok().is_some_and(|r| r.state.active()))
            && r.rollout.as_deref() != Some(active.id.as_str())
        {
            return None;
        }
        Some(StepFailure {
            phase,
            service: r.service.clone(),
            task: r.task.clone(),
            value: r.log.clone().or_else(|| r.message.clone()).unwrap_or_default(),
            revision: self.result_revisions.get(h).copied().unwrap_or(0),
        })
    }

    /// Every host whose last run failed at a composable rollout's step.
    pub fn step_failures(&self) -> Vec<(HostName, StepFailure)> {
        self.results
            .keys()
            .filter_map(|h| self.step_failure(h).map(|f| (h.clone(), f)))
            .collect()
    }

    /// The host's gate (host → role → global).
    pub fn gate(&self, h: &HostName, role: &Role) -> Gate {
        gate::decide(&GateKeys {
            host: self.host_keys.get(h).cloned().unwrap_or_default(),
            role: self.role_keys.get(role).cloned().unwrap_or_default(),
            global: self.global.clone(),
        })
    }
}

/// A snapshot kept up to date one key at a time, for a reader that follows a
/// watch: a put or a delete parses that key alone, so a pass over a large fleet
/// costs no rebuild. `Snapshot::from_kvs` is the same fold over a listing, so the
/// two cannot read a key differently.
#[derive(Debug, Default)]
pub struct LiveSnapshot {
    snap: Snapshot,
    /// Problems by key, in the order their keys were first read.
    problems: Vec<(Key, String)>,
    /// The keys in `problems` (a put of a sound key then costs no scan of them).
    problem_keys: BTreeSet<Key>,
    /// Failure entries of every version read (the current one is picked when settled).
    failures: BTreeMap<Key, (Version, HostName, Step, String, Revision)>,
    current_rollout: Option<KeyValue>,
    records: BTreeMap<String, KeyValue>,
    /// Step statuses of every rollout read (the active one's are picked when settled).
    step_statuses: BTreeMap<Key, (String, String, Service, HostName, StepStatus)>,
    /// The rollout or the failures must be worked out again.
    unsettled: bool,
}

impl LiveSnapshot {
    /// Takes `kv` in place of what its key said before.
    pub fn put(&mut self, schema: &Schema, kv: &KeyValue) {
        let parsed = schema.parse(&kv.key);
        self.unset(&kv.key, parsed.as_ref());
        self.set(schema, kv, parsed);
        self.snap.revision = self.snap.revision.max(kv.mod_revision);
    }

    /// Forgets what `key` said.
    pub fn delete(&mut self, schema: &Schema, key: &Key) {
        self.unset(key, schema.parse(key).as_ref());
    }

    /// The snapshot as of the keys put so far.
    pub fn snapshot(&mut self, schema: &Schema) -> &mut Snapshot {
        self.settle(schema);
        &mut self.snap
    }

    fn problem(&mut self, key: &Key, p: String) {
        self.problem_keys.insert(key.clone());
        self.problems.push((key.clone(), p));
    }

    fn set(&mut self, schema: &Schema, kv: &KeyValue, parsed: Option<Parsed>) {
        let Some(parsed) = parsed else {
            if kv.key.starts_with(&schema.holds()) {
                self.problem(
                    &kv.key,
                    format!(
                        "key {} is under {} but names no valid host or role: it holds nothing",
                        kv.key,
                        schema.holds()
                    ),
                );
            }
            return;
        };
        match parsed {
            Parsed::CurrentVersion
            | Parsed::Host(_)
            | Parsed::RunningVersion(..)
            | Parsed::Enable(_)
            | Parsed::Status(..) => self.set_versions(kv, parsed),
            Parsed::Agent(_)
            | Parsed::Run(_)
            | Parsed::Clock(_)
            | Parsed::Result(_)
            | Parsed::Hold(_)
            | Parsed::Hook(_) => self.set_hosts(kv, parsed),
            Parsed::Lock(_) | Parsed::CurrentRollout | Parsed::Rollout(_) | Parsed::Driver(_) => {
                self.set_drivers(kv, parsed)
            }
            Parsed::Catalog(_)
            | Parsed::Grant(_)
            | Parsed::FinalizeGrant
            | Parsed::StepStatus(..)
            | Parsed::CommandInbox(_) => self.set_steps(kv, parsed),
            _ => {}
        }
    }

    /// The desired version, the registry, the versions hosts run, the enable keys and
    /// failure entries.
    fn set_versions(&mut self, kv: &KeyValue, parsed: Parsed) {
        let key_state = |l: &mut LiveSnapshot| {
            let st = KeyState::read(Some(kv));
            if let KeyState::Invalid(e) = &st {
                l.problem(&kv.key, e.clone());
            }
            st
        };
        match parsed {
            Parsed::CurrentVersion => {
                match parse_version(kv) {
                    Ok(v) => self.snap.current = v,
                    Err(e) => {
                        self.snap.current_invalid = Some(e.to_string());
                        self.problem(&kv.key, e.to_string());
                    }
                }
                self.unsettled = true;
            }
            Parsed::Host(h) => match parse_json::<HostRecord>(kv) {
                Ok(r) => {
                    self.snap.roles.insert(h, r.role);
                }
                Err(e) => self.problem(&kv.key, e.to_string()),
            },
            Parsed::RunningVersion(v, h) => {
                self.snap.running.entry(h).or_default().insert(v);
            }
            Parsed::Enable(level) => {
                let st = key_state(self);
                let s = &mut self.snap;
                s.enable_revisions.insert(level.clone(), kv.mod_revision);
                match level {
                    EnableLevel::Global => s.global = st,
                    EnableLevel::Role(r) => {
                        s.role_keys.insert(r, st);
                    }
                    EnableLevel::Host(h) => {
                        s.host_keys.insert(h, st);
                    }
                }
            }
            Parsed::Status(step, Outcome::Failure, v, h) => {
                self.failures
                    .insert(kv.key.clone(), (v, h, step, kv.value.clone(), kv.mod_revision));
                self.unsettled = true;
            }
            _ => {}
        }
    }

    /// Each host's agent record, run marker, clock, result and holds.
    fn set_hosts(&mut self, kv: &KeyValue, parsed: Parsed) {
        let record = |l: &mut LiveSnapshot| match parse_json::<AgentRecord>(kv) {
            Ok(r) => Some(r),
            Err(e) => {
                l.problem(&kv.key, e.to_string());
                None
            }
        };
        match parsed {
            // An unreadable record or marker still proves something: it counts
            // as running (the safe reading) and is reported.
            Parsed::Agent(h) => {
                let rec = record(self);
                self.snap.agents.insert(h, rec);
            }
            Parsed::Run(h) => {
                let rec = record(self);
                self.snap.run_revisions.insert(h.clone(), kv.mod_revision);
                self.snap.runs.insert(h, rec);
            }
            Parsed::Clock(h) => match kv.value.trim().parse::<u64>() {
                Ok(ms) => {
                    self.snap.clocks.insert(h, ms);
                }
                Err(_) => self.problem(
                    &kv.key,
                    format!("key {}: not a clock (Unix milliseconds): ignored", kv.key),
                ),
            },
            Parsed::Hold(t) => {
                let rec = match parse_json(kv) {
                    Ok(r) => Some(r),
                    Err(e) => {
                        self.problem(&kv.key, format!("{e} (it still holds until released)"));
                        None
                    }
                };
                self.snap.holds.insert(t, rec);
            }
            Parsed::Result(h) => match parse_json(kv) {
                Ok(r) => {
                    self.snap.result_revisions.insert(h.clone(), kv.mod_revision);
                    self.snap.results.insert(h, r);
                }
                Err(e) => {
                    self.problem(&kv.key, e.to_string());
                    self.snap.results_invalid.insert(h);
                }
            },
            Parsed::Hook(h) => match parse_json(kv) {
                Ok(r) => {
                    self.snap.hook_revisions.insert(h.clone(), kv.mod_revision);
                    self.snap.hooks.insert(h, r);
                }
                Err(e) => {
                    self.problem(
                        &kv.key,
                        format!("{e} (the host keeps its slot until it is fixed or deleted: a hook may be running)"),
                    );
                    self.snap.hooks_invalid.insert(h);
                }
            },
            _ => {}
        }
    }

    /// The rollout lock, the emergency stop and the plan epoch, the rollout records and
    /// the drivers.
    fn set_drivers(&mut self, kv: &KeyValue, parsed: Parsed) {
        match parsed {
            Parsed::Lock(name) if name == ROLLOUT_LOCK => {
                self.snap.lock = match parse_json(kv) {
                    Ok(r) => Some(r),
                    Err(e) => {
                        self.problem(
                            &kv.key,
                            format!("{e} (no driver writes such a lock: the next driver takes it over)"),
                        );
                        None
                    }
                };
                self.snap.lock_key = Some((kv.mod_revision, kv.lease.clone()));
            }
            Parsed::Lock(name) if name == HALT => {
                let rec = parse_json(kv).unwrap_or_else(|e| {
                    self.problem(&kv.key, e.to_string());
                    LockRecord {
                        holder: "unknown".into(),
                        host: "unknown".into(),
                        pid: 0,
                        since: 0,
                    }
                });
                self.snap.halt = Some((rec, kv.mod_revision));
            }
            Parsed::Lock(name) if name == EPOCH => self.snap.epoch = kv.mod_revision,
            Parsed::CurrentRollout => {
                self.current_rollout = Some(kv.clone());
                self.unsettled = true;
            }
            Parsed::Rollout(id) => {
                self.records.insert(id, kv.clone());
                self.unsettled = true;
            }
            Parsed::Driver(name) => match parse_json(kv) {
                Ok(r) => {
                    self.snap.drivers.insert(name, r);
                }
                Err(e) => self.problem(&kv.key, e.to_string()),
            },
            _ => {}
        }
    }

    /// Composable rollouts' catalogs, grants and step statuses, and the fleet
    /// commands' inboxes.
    fn set_steps(&mut self, kv: &KeyValue, parsed: Parsed) {
        match parsed {
            Parsed::Catalog(h) => {
                let cat = parse_json::<Catalog>(kv).map_err(|e| e.to_string());
                if let Err(e) = &cat {
                    self.problem(&kv.key, e.clone());
                }
                self.snap.catalogs.insert(h, cat);
            }
            Parsed::Grant(role) => match parse_json::<Grant>(kv) {
                Ok(g) => {
                    self.snap.grants.insert(role, g);
                }
                Err(e) => self.problem(
                    &kv.key,
                    format!("{e} (no driver writes such a grant: its hosts run no phase)"),
                ),
            },
            Parsed::FinalizeGrant => match parse_json::<FinalizeGrant>(kv) {
                Ok(g) => self.snap.finalize_grant = Some(g),
                Err(e) => self.problem(&kv.key, e.to_string()),
            },
            Parsed::StepStatus(id, phase, service, outcome, h) => {
                let value = crate::values::text(kv)
                    .map(str::to_string)
                    .unwrap_or_else(|e| e.to_string());
                self.step_statuses.insert(
                    kv.key.clone(),
                    (
                        id,
                        phase,
                        service,
                        h,
                        StepStatus {
                            outcome,
                            value,
                            revision: kv.mod_revision,
                        },
                    ),
                );
                self.unsettled = true;
            }
            Parsed::CommandInbox(h) => {
                let (ids, why) = crate::command_record::parse_inbox(kv);
                if let Some(why) = why {
                    self.problem(
                        &kv.key,
                        format!(
                            "{why} (no fleet command is admitted through it until it is fixed or deleted)"
                        ),
                    );
                    self.snap.inboxes_invalid.insert(h.clone());
                }
                if !ids.is_empty() {
                    self.snap.inboxes.insert(h, ids);
                }
            }
            _ => {}
        }
    }

    /// Removes what `key` (parsed as `parsed`) contributed.
    fn unset(&mut self, key: &Key, parsed: Option<&Parsed>) {
        if self.problem_keys.remove(key) {
            self.problems.retain(|(k, _)| k != key);
        }
        if let Some(parsed) = parsed {
            self.unset_hosts(key, parsed);
            self.unset_rollouts(key, parsed);
        }
    }

    /// What the versions, the enable keys, the failure entries, the inboxes and the
    /// agents' keys contributed.
    fn unset_hosts(&mut self, key: &Key, parsed: &Parsed) {
        let s = &mut self.snap;
        match parsed {
            Parsed::CurrentVersion => {
                s.current = None;
                s.current_invalid = None;
                self.unsettled = true;
            }
            Parsed::Host(h) => {
                s.roles.remove(h);
            }
            Parsed::RunningVersion(v, h) => {
                if let Some(vs) = s.running.get_mut(h) {
                    vs.remove(v);
                    if vs.is_empty() {
                        s.running.remove(h);
                    }
                }
            }
            Parsed::Enable(level) => {
                s.enable_revisions.remove(level);
                match level {
                    EnableLevel::Global => s.global = KeyState::Unset,
                    EnableLevel::Role(r) => {
                        s.role_keys.remove(r);
                    }
                    EnableLevel::Host(h) => {
                        s.host_keys.remove(h);
                    }
                }
            }
            Parsed::Status(_, Outcome::Failure, ..) => {
                self.unsettled |= self.failures.remove(key).is_some();
            }
            Parsed::CommandInbox(h) => {
                s.inboxes.remove(h);
                s.inboxes_invalid.remove(h);
            }
            Parsed::Agent(h) => {
                s.agents.remove(h);
            }
            Parsed::Run(h) => {
                s.runs.remove(h);
                s.run_revisions.remove(h);
            }
            Parsed::Clock(h) => {
                s.clocks.remove(h);
            }
            _ => {}
        }
    }

    /// What the locks, the rollouts, the holds, the results, the drivers and the
    /// composable keys contributed.
    fn unset_rollouts(&mut self, key: &Key, parsed: &Parsed) {
        let s = &mut self.snap;
        match parsed {
            Parsed::Lock(name) if name == ROLLOUT_LOCK => {
                s.lock = None;
                s.lock_key = None;
            }
            Parsed::Lock(name) if name == HALT => s.halt = None,
            Parsed::Lock(name) if name == EPOCH => s.epoch = 0,
            Parsed::CurrentRollout => {
                self.current_rollout = None;
                self.unsettled = true;
            }
            Parsed::Rollout(id) => {
                self.unsettled |= self.records.remove(id).is_some();
            }
            Parsed::Hold(t) => {
                s.holds.remove(t);
            }
            Parsed::Result(h) => {
                s.results.remove(h);
                s.result_revisions.remove(h);
                s.results_invalid.remove(h);
            }
            Parsed::Hook(h) => {
                s.hooks.remove(h);
                s.hook_revisions.remove(h);
                s.hooks_invalid.remove(h);
            }
            Parsed::Driver(name) => {
                s.drivers.remove(name);
            }
            Parsed::Catalog(h) => {
                s.catalogs.remove(h);
            }
            Parsed::Grant(role) => {
                s.grants.remove(role);
            }
            Parsed::FinalizeGrant => s.finalize_grant = None,
            Parsed::StepStatus(..) => {
                self.unsettled |= self.step_statuses.remove(key).is_some();
            }
            _ => {}
        }
    }

    /// Works out what depends on several keys: the active rollout, the current
    /// version's failures, and the problems in the order they were read.
    fn settle(&mut self, schema: &Schema) {
        let s = &mut self.snap;
        let mut rollout_problem = None;
        if std::mem::take(&mut self.unsettled) {
            s.rollout = self.current_rollout.as_ref().map(|cur| {
                let records = self.records.iter().map(|(id, kv)| (id.clone(), kv)).collect();
                current_rollout_of(schema, cur, &records)
            });
            s.failures.clear();
            s.failure_revisions.clear();
            if let Some(cur) = &s.current {
                for (v, h, step, link, rev) in self.failures.values() {
                    if v == cur {
                        s.failures.insert(h.clone(), (*step, link.clone()));
                        s.failure_revisions.insert(h.clone(), *rev);
                    }
                }
            }
            // A service's step on a host has one entry; should both be there (a
            // writer other than the agent), the newer one counts.
            s.step_statuses.clear();
            let id = self
                .current_rollout
                .as_ref()
                .map(|kv| kv.value.trim().to_string());
            for (rid, phase, service, h, st) in self.step_statuses.values() {
                if Some(rid) == id.as_ref() {
                    let k = (phase.clone(), service.clone(), h.clone());
                    if s.step_statuses
                        .get(&k)
                        .is_none_or(|old| old.revision < st.revision)
                    {
                        s.step_statuses.insert(k, st.clone());
                    }
                }
            }
        }
        if let Some(Err(e)) = s.rollout.as_ref().map(|r| &r.record) {
            rollout_problem = Some(e.clone());
        }
        s.problems.clear();
        s.problems.extend(self.problems.iter().map(|(_, p)| p.clone()));
        s.problems.extend(rollout_problem);
        let strays: Vec<String> = s
            .running
            .iter()
            .filter(|(h, _)| s.stray(h))
            .flat_map(|(h, vs)| vs.iter().map(move |v| format!("/running/versions/{v}/{h}")))
            .collect();
        for k in strays {
            s.problems.push(format!(
                "key {k}: not a host name any host has (letters, digits, '-' and '.' only) and no host registers it: ignored"
            ));
        }
    }
}

/// The name of the lock `jioctl upgrade` holds.
pub const ROLLOUT_LOCK: &str = "rollout";
/// The key whose mod revision fences plans (see `Snapshot::epoch`).
pub const EPOCH: &str = "epoch";
/// The emergency stop `global-disable-puppet` leaves: a driver that sees one newer
/// than its own start halts.
pub const HALT: &str = "halt";

/// The active rollout from `/rollouts/current` and the records read with it.
fn current_rollout_of(
    schema: &Schema,
    cur: &KeyValue,
    records: &BTreeMap<String, &KeyValue>,
) -> CurrentRollout {
    let id = cur.value.trim().to_string();
    let mut out = CurrentRollout {
        id: id.clone(),
        current_revision: cur.mod_revision,
        record: Err(String::new()),
        record_revision: 0,
    };
    let Some(rid) = crate::values::text(cur)
        .ok()
        .and_then(|t| RolloutId::parse(t.trim()))
    else {
        let e = crate::values::ValueError::new(
            &cur.key,
            &cur.value,
            "not a rollout id (a UTC stamp such as 20261123T020000Z, a dash and a version)",
        );
        out.record = Err(e.to_string());
        return out;
    };
    let key = schema.rollout(&rid);
    out.record = match records.get(id.as_str()) {
        None => Err(format!("key {}: missing (named by {})", key, cur.key)),
        Some(kv) => {
            out.record_revision = kv.mod_revision;
            match parse_json::<RolloutRecord>(kv) {
                Ok(r) if r.id == rid => Ok(r),
                Ok(r) => Err(format!("key {key}: the record is of rollout {}, not {rid}", r.id)),
                Err(e) => Err(e.to_string()),
            }
        }
    };
    out
}

/// A host's place in the rollout to the current version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HostState {
    Upgraded,
    /// Enabled and moving, retrying after an operator re-enabled it, or running
    /// something (for any version) whatever its enable keys say.
    Upgrading,
    Failed,
    Pending,
    /// Upgrading, but its agent's liveness lease is gone.
    Lost,
    /// The enable key that decides for it holds an invalid value: neither its agent
    /// nor `jioctl` moves it until the value is fixed.
    Blocked,
    /// No `/current_version` is set: there is nothing to be upgraded to, so no
    /// host can be said to be upgraded (its agent is idle).
    Unknown,
}

impl HostState {
    pub const ALL: [HostState; 7] = [
        HostState::Upgraded,
        HostState::Upgrading,
        HostState::Failed,
        HostState::Pending,
        HostState::Lost,
        HostState::Blocked,
        HostState::Unknown,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            HostState::Upgraded => "upgraded",
            HostState::Upgrading => "upgrading",
            HostState::Failed => "failed",
            HostState::Pending => "pending",
            HostState::Lost => "lost",
            HostState::Blocked => "blocked",
            HostState::Unknown => "unknown",
        }
    }
    /// Holds a rolling slot (started and not done).
    pub fn in_flight(self) -> bool {
        matches!(self, HostState::Upgrading | HostState::Lost | HostState::Failed)
    }
}

/// One host's classification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostStatus {
    pub host: HostName,
    pub role: Role,
    pub state: HostState,
    /// Why, where it is not obvious from the state (blocked, lost, still running an
    /// earlier version, retrying).
    pub reason: Option<String>,
}

impl Snapshot {
    /// The host's agent is running a command (any version), or its record cannot
    /// be read (counted as running: the safe reading).
    fn agent_running(&self, h: &HostName) -> Option<String> {
        if let Some(Some(r)) = self.runs.get(h)
            && r.state == crate::values::AgentState::Rebooting
        {
            return Some(self.rebooting(h, r));
        }
        let what = |r: &AgentRecord| match r.state {
            crate::values::AgentState::Command => "a fleet command".to_string(),
            state => format!(
                "{} {}",
                if state == crate::values::AgentState::Checking {
                    "a health check at"
                } else {
                    "puppet for"
                },
                r.version.as_ref().map(Version::as_str).unwrap_or("no version")
            ),
        };
        match (self.runs.get(h), self.agents.contains_key(h)) {
            (Some(Some(r)), false) => {
                return Some(format!(
                    "its run of {} never ended and its agent is not alive: it keeps its slot until the agent is back",
                    what(r)
                ));
            }
            (Some(None), _) => return Some("its run marker cannot be read".into()),
            (Some(Some(r)), true)
                if !self
                    .agents
                    .get(h)
                    .is_some_and(|a| a.as_ref().is_some_and(|a| a.state.running())) =>
            {
                return Some(format!("its agent is finishing its run of {}", what(r)));
            }
            _ => {}
        }
        // An inbox (or the part of it) that cannot be read admits nothing: its
        // agent cannot read it either, and runs only the ids it can.
        let inbox = || {
            self.inboxes.get(h).map(|ids| {
                format!(
                    "admitted to fleet command {}",
                    ids.iter().map(|i| i.as_str()).collect::<Vec<_>>().join(", ")
                )
            })
        };
        match self.agents.get(h) {
            Some(Some(r)) if r.state == crate::values::AgentState::Command => Some(format!(
                "its agent is running a fleet command{}",
                self.inboxes
                    .get(h)
                    .map(|ids| format!(
                        " ({})",
                        ids.iter().map(|i| i.as_str()).collect::<Vec<_>>().join(", ")
                    ))
                    .unwrap_or_default()
            )),
            Some(Some(r)) if r.state.running() => Some(format!(
                "its agent is {} {}",
                if r.state == crate::values::AgentState::Checking {
                    "running a health check at"
                } else {
                    "running puppet for"
                },
                r.version.as_ref().map(Version::as_str).unwrap_or("no version")
            )),
            Some(None) => Some("its agent's record cannot be read".into()),
            _ => inbox(),
        }
    }

    /// A run that ends with a reboot, from its run marker and the agent's record.
    fn rebooting(&self, h: &HostName, r: &AgentRecord) -> String {
        let v = r.version.as_ref().map(Version::as_str).unwrap_or("no version");
        let since = crate::time::utc_stamp(r.since);
        let agent = self.agents.get(h).and_then(|a| a.as_ref()).map(|a| a.state);
        match (r.until, agent) {
            (None, _) => format!(
                "its run to {v} ends with a reboot, waiting since {since} (for a hold to be released, or for the driver's permit inside its maintenance window)"
            ),
            (Some(_), Some(s)) if s != crate::values::AgentState::Rebooting => {
                format!("back from its reboot (run to {v}), validating")
            }
            (Some(u), Some(_)) => {
                format!(
                    "rebooting since {since} (run to {v}; back by {})",
                    crate::time::utc_stamp(u)
                )
            }
            (Some(u), None) if self.rebooting_lost(r) => format!(
                "rebooting since {since} and not back by {} (run to {v}): it keeps its slot; see docs/stuck.md",
                crate::time::utc_stamp(u)
            ),
            (Some(u), None) => format!(
                "rebooting since {since} (run to {v}; down, expected back by {})",
                crate::time::utc_stamp(u)
            ),
        }
    }

    /// The host's run marker says it reboots (or waits to).
    fn rebooting_marker(&self, h: &HostName) -> bool {
        matches!(self.runs.get(h), Some(Some(r)) if r.state == crate::values::AgentState::Rebooting)
    }

    /// A rebooting host whose deadline has passed (by the reader's clock).
    fn rebooting_lost(&self, r: &AgentRecord) -> bool {
        matches!((r.until, self.now), (Some(u), Some(now)) if now >= u)
    }

    /// An operator (or a plan) wrote one of the host's enable keys after its failure
    /// entry: its agent retries (it compares the same revisions), so the host is
    /// moving again, not failed.
    fn retrying(&self, h: &HostName, role: &Role, gate: &Gate) -> bool {
        let failed_at = match (self.failure_revisions.get(h), self.step_failure(h)) {
            (Some(a), Some(f)) => (*a).max(f.revision),
            (Some(a), None) => *a,
            (None, Some(f)) => f.revision,
            (None, None) => return false,
        };
        let failed_at = &failed_at;
        let keys = [
            EnableLevel::Host(h.clone()),
            EnableLevel::Role(role.clone()),
            EnableLevel::Global,
        ];
        gate.enabled
            && keys
                .iter()
                .any(|l| self.enable_revisions.get(l).is_some_and(|rev| rev > failed_at))
    }
}

/// Where a host stands in its maintenance hooks under the active rollout (see
/// `Snapshot::hook_stage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookStage<'a> {
    /// Its record cannot be read: it keeps a slot until it is fixed or deleted.
    Unreadable,
    /// A hook started and was not seen to end (whoever drives runs it again).
    Running(&'a HookRecord),
    /// Its `before` hook succeeded; its run has not reported success at the version.
    Drained(&'a HookRecord),
    /// Drained, and its run reported success at the version: its `after` hook is due.
    AfterDue(&'a HookRecord),
}

impl HookStage<'_> {
    /// Why the host holds its slot, for people.
    pub fn describe(&self, gate_enabled: bool) -> String {
        let when = crate::time::utc_display;
        match self {
            HookStage::Unreadable => {
                "its hook record cannot be read: it keeps its slot until the record is fixed or deleted"
                    .into()
            }
            HookStage::Running(r) if r.hook == HookKind::Before => format!("draining: {}", r.describe()),
            HookStage::Running(r) => format!("restoring: {}", r.describe()),
            HookStage::Drained(r) if gate_enabled => {
                format!(
                    "drained (before hook succeeded at {})",
                    when(r.ended.unwrap_or(r.started))
                )
            }
            HookStage::Drained(r) => format!(
                "drained by its before hook (at {}) but not enabled: it keeps its slot until it is enabled again",
                when(r.ended.unwrap_or(r.started))
            ),
            HookStage::AfterDue(r) => format!(
                "upgraded to {}; its after hook is due (drained since {})",
                r.version,
                when(r.ended.unwrap_or(r.started))
            ),
        }
    }
}

/// Maintenance hooks: where each host stands in them.
impl Snapshot {
    /// The id of the active rollout (its record readable and running, paused or stuck).
    pub fn active_rollout_id(&self) -> Option<&str> {
        self.rollout
            .as_ref()
            .filter(|c| c.ok().is_some_and(|r| r.state.active()))
            .map(|c| c.id.as_str())
    }

    /// The host's hook stage under the active rollout: `None` without a hook record
    /// of it, or once its `after` hook succeeded (its slot is free), or when the hook
    /// failed (`hook_failure`). A record of another rollout is history.
    pub fn hook_stage(&self, h: &HostName) -> Option<HookStage<'_>> {
        if self.hooks_invalid.contains(h) {
            return Some(HookStage::Unreadable);
        }
        let rec = self.hooks.get(h)?;
        if Some(rec.rollout.as_str()) != self.active_rollout_id() {
            return None;
        }
        match (rec.hook, rec.state) {
            (_, HookState::Running) => Some(HookStage::Running(rec)),
            (_, HookState::Failed) | (HookKind::After, HookState::Succeeded) => None,
            (HookKind::Before, HookState::Succeeded) if self.reported_at(h, &rec.version) => {
                Some(HookStage::AfterDue(rec))
            }
            (HookKind::Before, HookState::Succeeded) => Some(HookStage::Drained(rec)),
        }
    }

    /// The host's run reported success at `v` and nothing of it runs any more (an
    /// agent that reboots keeps its run marker until it is back and validated).
    fn reported_at(&self, h: &HostName, v: &Version) -> bool {
        self.running.get(h).is_some_and(|vs| vs.contains(v))
            && self.agent_running(h).is_none()
            && !self.failures.contains_key(h)
            && self.step_failure(h).is_none()
    }

    /// The host's hook failed at the current version: of the active rollout, or of
    /// any rollout when none is active (a new rollout runs the hooks again). It
    /// counts as a failed run.
    pub fn hook_failure(&self, h: &HostName) -> Option<&HookRecord> {
        let rec = self.hooks.get(h).filter(|r| r.state == HookState::Failed)?;
        if Some(&rec.version) != self.current.as_ref() {
            return None;
        }
        match self.active_rollout_id() {
            Some(id) if id != rec.rollout => None,
            _ => Some(rec),
        }
    }

    /// Every host whose hook failed at the current version (`hook_failure`).
    pub fn hook_failures(&self) -> Vec<(&HostName, &HookRecord)> {
        self.hooks
            .keys()
            .filter_map(|h| self.hook_failure(h).map(|r| (h, r)))
            .collect()
    }

    /// The host is in its hooks' slot and will move on by itself (a hook runs or is
    /// due, or it is drained): a rollout stopped on failures waits for it.
    pub fn in_hooks(&self, h: &HostName) -> bool {
        matches!(
            self.hook_stage(h),
            Some(HookStage::Running(_) | HookStage::Drained(_) | HookStage::AfterDue(_))
        )
    }

    /// How a host in its hooks' slot stands, where its hooks decide it: a hook runs
    /// or is due, its record cannot be read, or it is drained and not enabled (held,
    /// or disarmed when its window closed). `None`: its keys and agent decide.
    fn hook_status(
        &self,
        h: &HostName,
        gate: &Gate,
        held: Option<&HoldTarget>,
    ) -> Option<(HostState, Option<String>)> {
        let stage = self.hook_stage(h)?;
        if matches!(stage, HookStage::Drained(_)) && gate.enabled {
            return None;
        }
        let mut why = stage.describe(gate.enabled);
        if let Some(t) = held {
            why.push_str(&format!(" (held: {t})"));
        }
        Some((HostState::Upgrading, Some(why)))
    }
}

/// Classifies every host for the current version. Without a current version a
/// host is `Unknown` (there is nothing to move to, and nothing says it is there),
/// unless its agent runs.
pub fn classify(s: &Snapshot) -> Vec<HostStatus> {
    s.hosts()
        .into_iter()
        .map(|h| {
            let role = s.role_of(&h);
            let running = s.agent_running(&h);
            // A run that started and was not seen to end, with no live agent: lost
            // in flight (it keeps its slot), whatever its keys say.
            // A rebooting host is down until it is back: lost only past its deadline.
            let lost_run = match s.runs.get(&h) {
                Some(Some(r)) if r.state == crate::values::AgentState::Rebooting => {
                    !s.agents.contains_key(&h) && s.rebooting_lost(r)
                }
                Some(_) => !s.agents.contains_key(&h),
                None => false,
            };
            let (state, reason) = match &s.current {
                _ if lost_run && !s.failures.contains_key(&h) && s.step_failure(&h).is_none() => {
                    (HostState::Lost, running)
                }
                None => match running {
                    Some(r) => (HostState::Upgrading, Some(r)),
                    None => (HostState::Unknown, None),
                },
                Some(cur) => s.state_at(&h, &role, cur, running),
            };
            HostStatus {
                host: h,
                role,
                state,
                reason,
            }
        })
        .collect()
}

impl Snapshot {
    /// A host's state for the current version `cur`; `running`: what its agent runs.
    fn state_at(
        &self,
        h: &HostName,
        role: &Role,
        cur: &Version,
        running: Option<String>,
    ) -> (HostState, Option<String>) {
        let gate = self.gate(h, role);
        let upgraded = self.running.get(h).is_some_and(|vs| vs.contains(cur));
        let held = self.hold_of(h, role).map(|(t, _)| t);
        if let Some(rec) = self.hook_failure(h) {
            return (HostState::Failed, Some(rec.describe()));
        }
        if self.failures.contains_key(h) || self.step_failure(h).is_some() {
            return if self.retrying(h, role, &gate) {
                (
                    HostState::Upgrading,
                    Some("retrying: re-enabled after its failure".into()),
                )
            } else {
                (HostState::Failed, None)
            };
        }
        if let Some(r) = running {
            let shown = !gate.enabled || upgraded || self.rebooting_marker(h);
            return (HostState::Upgrading, shown.then_some(r));
        }
        if let Some(by_hooks) = self.hook_status(h, &gate, held.as_ref()) {
            return by_hooks;
        }
        if upgraded {
            (HostState::Upgraded, None)
        } else if let Some(why) = gate.blocked {
            (HostState::Blocked, Some(why))
        } else if let Some(t) = held {
            if gate.enabled {
                // Its agent does not start while held, but a release would start it
                // at once: it keeps its slot until its keys are reset (the planner
                // disables it).
                (
                    HostState::Upgrading,
                    Some(format!(
                        "held ({t}) but still enabled by its {} key: it keeps its slot until the key is reset",
                        gate.level.as_str()
                    )),
                )
            } else {
                (HostState::Pending, Some(format!("held ({t})")))
            }
        } else if !gate.enabled {
            (HostState::Pending, None)
        } else if self.agents.contains_key(h) {
            (HostState::Upgrading, None)
        } else {
            (
                HostState::Lost,
                Some("enabled, but its agent is not alive (no /agents record)".into()),
            )
        }
    }
}

/// `{state: {role: [hosts]}}`, every state present (the original's shape).
pub fn by_state_and_role(hosts: &[HostStatus]) -> BTreeMap<HostState, BTreeMap<Role, Vec<HostName>>> {
    let mut out: BTreeMap<HostState, BTreeMap<Role, Vec<HostName>>> =
        HostState::ALL.iter().map(|s| (*s, BTreeMap::new())).collect();
    for h in hosts {
        out.entry(h.state)
            .or_default()
            .entry(h.role.clone())
            .or_default()
            .push(h.host.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::api::fixtures::kv;

    const IDLE: &str = r#"{"state":"idle","version":"v1","since":1,"pid":1}"#;

    fn rec(role: &str) -> String {
        format!(r#"{{"role":"{role}","agent_version":"0.1.0","addresses":[],"first_seen":1}}"#)
    }

    #[test]
    fn a_current_rollout_read_alone_is_judged_as_a_snapshot_judges_it() {
        let s = Schema::default();
        let rec = RolloutRecord::start(Version::new("v2").unwrap(), None, serde_json::json!({}), "t", 1);
        let cur = kv("/rollouts/current", rec.id.as_str());
        let key = CurrentRollout::record_key(&s, &cur).unwrap();
        assert_eq!(key, s.rollout(&rec.id));
        let stored = kv(key.as_str(), &serde_json::to_string(&rec).unwrap());
        assert_eq!(CurrentRollout::read(&s, &cur, Some(&stored)).ok(), Some(&rec));
        let missing = CurrentRollout::read(&s, &cur, None).record.unwrap_err();
        assert!(
            missing.contains("missing (named by /rollouts/current)"),
            "{missing}"
        );
        let garbage = kv("/rollouts/current", "garbage");
        assert_eq!(CurrentRollout::record_key(&s, &garbage), None);
        let bad = CurrentRollout::read(&s, &garbage, None).record.unwrap_err();
        assert!(
            bad.contains("/rollouts/current") && bad.contains("not a rollout id"),
            "{bad}"
        );
    }

    #[test]
    fn the_role_of_a_host_that_never_registered_follows_the_role_pattern() {
        let kvs = vec![
            kv("/hosts/gw-9", &rec("gateway")),
            kv("/running/versions/v1/gw-9", "1"),
            kv("/running/versions/v1/bom-compute-3", "1"),
            kv("/running/versions/v1/compute12", "1"),
        ];
        let mut snap = Snapshot::from_kvs(&Schema::default(), &kvs);
        let role = |s: &Snapshot, h: &str| s.role_of(&HostName::new(h).unwrap()).to_string();
        assert_eq!(role(&snap, "compute12"), "compute", "the default is the agent's");
        assert_eq!(role(&snap, "bom-compute-3"), "unknown");
        snap.role_pattern = RolePattern::new(r"^[a-z]+-([a-z]+)-\d+$").unwrap();
        assert_eq!(role(&snap, "bom-compute-3"), "compute");
        assert_eq!(role(&snap, "compute12"), "unknown");
        assert_eq!(
            role(&snap, "gw-9"),
            "gateway",
            "registered: from /hosts, whatever the pattern"
        );
    }

    #[test]
    fn without_a_current_version_no_host_is_upgraded() {
        let kvs = vec![
            kv("/hosts/cp1", &rec("compute")),
            kv("/hosts/cp2", &rec("compute")),
            kv("/running/versions/v1/cp1", "1"),
            kv("/agents/cp1", IDLE),
        ];
        let snap = Snapshot::from_kvs(&Schema::default(), &kvs);
        for h in classify(&snap) {
            assert_eq!(h.state, HostState::Unknown, "{h:?}");
            assert!(!h.state.in_flight());
        }
    }

    #[test]
    fn classification() {
        let kvs = vec![
            kv("/current_version", "v2"),
            kv("/hosts/ctl1", &rec("controller")),
            kv("/hosts/ctl2", &rec("controller")),
            kv("/hosts/cp1", &rec("compute")),
            kv("/hosts/cp2", &rec("compute")),
            kv("/hosts/cp3", &rec("compute")),
            kv("/running/versions/v2/ctl1", "1"),
            kv("/running/versions/v1/ctl2", "1"),
            kv("/running/versions/v1/cp1", "1"),
            kv("/running/versions/v1/old9", "1"), // never registered: role from its name
            kv("/config_state/enable_puppet/global", "False"),
            kv("/config_state/enable_puppet/host/ctl2", "True"),
            kv("/config_state/enable_puppet/role/compute", "true"),
            kv("/config_state/enable_puppet/host/cp3", "false"),
            kv("/status/configured/failure/v2/cp2", "http://logs/cp2"),
            kv("/status/validated/failure/v1/cp1", ""), // another version: ignored
            kv("/agents/ctl2", IDLE),
        ];
        let snap = Snapshot::from_kvs(&Schema::default(), &kvs);
        let states: BTreeMap<String, (String, HostState)> = classify(&snap)
            .into_iter()
            .map(|h| (h.host.to_string(), (h.role.to_string(), h.state)))
            .collect();
        let want: BTreeMap<String, (String, HostState)> = [
            ("ctl1", "controller", HostState::Upgraded),
            ("ctl2", "controller", HostState::Upgrading),
            ("cp1", "compute", HostState::Lost),
            ("cp2", "compute", HostState::Failed),
            ("cp3", "compute", HostState::Pending),
            ("old9", "old", HostState::Pending),
        ]
        .into_iter()
        .map(|(h, r, s)| (h.to_string(), (r.to_string(), s)))
        .collect();
        assert_eq!(states, want);
        assert_eq!(snap.failures[&HostName::new("cp2").unwrap()].1, "http://logs/cp2");
    }

    fn kv_rev(key: &str, value: &str, rev: Revision) -> KeyValue {
        KeyValue {
            mod_revision: rev,
            ..kv(key, value)
        }
    }

    fn state_of(snap: &Snapshot, host: &str) -> (HostState, Option<String>) {
        let h = classify(snap)
            .into_iter()
            .find(|s| s.host.as_str() == host)
            .unwrap();
        (h.state, h.reason)
    }

    #[test]
    fn a_host_whose_agent_runs_is_in_flight_whatever_its_gate() {
        // Re-targeted to v3: every enable key was reset, but cp1's agent still runs
        // its v2 puppet and cp2's agent is checking its health.
        let kvs = vec![
            kv("/current_version", "v3"),
            kv("/config_state/enable_puppet/global", "false"),
            kv("/hosts/cp1", &rec("compute")),
            kv("/hosts/cp2", &rec("compute")),
            kv("/hosts/cp3", &rec("compute")),
            kv("/running/versions/v3/cp2", "1"),
            kv(
                "/agents/cp1",
                r#"{"state":"upgrading","version":"v2","since":1,"pid":1}"#,
            ),
            kv(
                "/agents/cp2",
                r#"{"state":"checking","version":"v3","since":1,"pid":1}"#,
            ),
            kv("/agents/cp3", IDLE),
        ];
        let snap = Snapshot::from_kvs(&Schema::default(), &kvs);
        let (st, why) = state_of(&snap, "cp1");
        assert_eq!(st, HostState::Upgrading);
        assert!(why.unwrap().contains("running puppet for v2"));
        let (st, why) = state_of(&snap, "cp2");
        assert_eq!(st, HostState::Upgrading);
        assert!(why.unwrap().contains("health check"));
        assert_eq!(state_of(&snap, "cp3").0, HostState::Pending);
        assert!(HostState::Upgrading.in_flight());
    }

    #[test]
    fn an_invalid_deciding_key_blocks_the_host_on_this_side_too() {
        let kvs = vec![
            kv("/current_version", "v2"),
            kv("/config_state/enable_puppet/global", "yes"),
            kv("/config_state/enable_puppet/host/cp2", "true"),
            kv("/hosts/cp1", &rec("compute")),
            kv("/hosts/cp2", &rec("compute")),
            kv("/agents/cp1", IDLE),
            kv("/agents/cp2", IDLE),
        ];
        let snap = Snapshot::from_kvs(&Schema::default(), &kvs);
        let (st, why) = state_of(&snap, "cp1");
        assert_eq!(st, HostState::Blocked);
        assert!(why.unwrap().contains("/config_state/enable_puppet/global"));
        assert!(!st.in_flight());
        // cp2's own key decides before the invalid global one.
        assert_eq!(state_of(&snap, "cp2").0, HostState::Upgrading);
    }

    #[test]
    fn a_failed_host_re_enabled_after_its_failure_is_retrying() {
        let base = |host_key_rev: Revision| {
            vec![
                kv("/current_version", "v2"),
                kv("/config_state/enable_puppet/global", "false"),
                kv_rev("/config_state/enable_puppet/host/cp1", "true", host_key_rev),
                kv("/hosts/cp1", &rec("compute")),
                kv("/agents/cp1", IDLE),
                kv_rev("/status/configured/failure/v2/cp1", "puppet exited 6", 10),
            ]
        };
        let snap = Snapshot::from_kvs(&Schema::default(), &base(5));
        assert_eq!(state_of(&snap, "cp1").0, HostState::Failed);
        let snap = Snapshot::from_kvs(&Schema::default(), &base(11));
        let (st, why) = state_of(&snap, "cp1");
        assert_eq!(st, HostState::Upgrading);
        assert!(why.unwrap().contains("retrying"));
    }

    #[test]
    fn unreadable_agent_records_and_locks_are_reported() {
        let kvs = vec![
            kv("/current_version", "v2"),
            kv("/config_state/enable_puppet/global", "false"),
            kv("/hosts/cp1", &rec("compute")),
            kv("/agents/cp1", "{not json"),
            kv(
                "/locks/halt",
                r#"{"holder":"alice","host":"l","pid":1,"since":1}"#,
            ),
        ];
        let snap = Snapshot::from_kvs(&Schema::default(), &kvs);
        // Counted as running: the safe reading.
        assert_eq!(state_of(&snap, "cp1").0, HostState::Upgrading);
        assert!(snap.problems.iter().any(|p| p.contains("/agents/cp1")));
        assert_eq!(snap.halt.as_ref().unwrap().0.holder, "alice");
    }

    #[test]
    fn holds_hold_whatever_their_value_and_bad_names_are_reported() {
        let kvs = vec![
            kv("/current_version", "v2"),
            kv("/config_state/enable_puppet/global", "true"),
            kv("/hosts/cp1", &rec("compute")),
            kv("/hosts/cp2", &rec("compute")),
            kv("/agents/cp1", IDLE),
            kv("/agents/cp2", IDLE),
            kv("/holds/host/cp1", "garbage"),
            kv("/holds/host/-x", "{}"),
        ];
        let snap = Snapshot::from_kvs(&Schema::default(), &kvs);
        // cp1 is held (its record cannot be read) and still enabled by the global
        // key: it keeps its slot until the planner disables it.
        let (st, why) = state_of(&snap, "cp1");
        assert_eq!(st, HostState::Upgrading);
        assert!(why.unwrap().contains("held (host cp1) but still enabled"));
        assert_eq!(state_of(&snap, "cp2").0, HostState::Upgrading);
        assert!(
            snap.problems
                .iter()
                .any(|p| p.contains("/holds/host/cp1") && p.contains("still holds"))
        );
        assert!(
            snap.problems
                .iter()
                .any(|p| p.contains("/holds/host/-x") && p.contains("holds nothing"))
        );
    }

    /// A fleet in rollout `20261123T020000Z-v2` (started at 1_795_399_200) with
    /// `extra` keys.
    fn in_rollout(extra: &[(&str, String)]) -> Snapshot {
        let rec = RolloutRecord::start(
            Version::new("v2").unwrap(),
            None,
            serde_json::json!({}),
            "t",
            1_795_399_200,
        );
        let mut kvs = vec![
            kv("/current_version", "v2"),
            kv("/config_state/enable_puppet/global", "false"),
            kv("/rollouts/current", rec.id.as_str()),
            kv(
                &format!("/rollouts/{}", rec.id),
                &serde_json::to_string(&rec).unwrap(),
            ),
            kv("/hosts/cp1", &rec_of("compute")),
            kv("/running/versions/v1/cp1", "1"),
            kv("/agents/cp1", IDLE),
        ];
        kvs.extend(extra.iter().map(|(k, v)| kv(k, v)));
        Snapshot::from_kvs(&Schema::default(), &kvs)
    }

    fn rec_of(role: &str) -> String {
        rec(role)
    }

    fn hook(rollout: &str, kind: &str, state: &str) -> String {
        format!(
            r#"{{"rollout":"{rollout}","version":"v2","role":"compute","hook":"{kind}","state":"{state}","started":1795399300,"driver":"mgmt1-42","exit_code":3,"message":"2 instances left"}}"#
        )
    }

    /// Keys besides the rollout's -> the host's state, and a word of its reason.
    type HookCase = (Vec<(&'static str, String)>, HostState, &'static str);

    fn hook_cases() -> Vec<HookCase> {
        const ID: &str = "20261123T020000Z-v2";
        const OLD: &str = "20261120T020000Z-v2";
        let at_v2 = || ("/running/versions/v2/cp1", "1".to_string());
        let enabled = || ("/config_state/enable_puppet/host/cp1", "true".to_string());
        let held = (
            "/holds/host/cp1",
            r#"{"by":"a","reason":null,"at":1}"#.to_string(),
        );
        let agent = r#"{"state":"upgrading","version":"v2","since":1,"pid":1}"#;
        let h = |kind: &str, state: &str| ("/hooks/cp1", hook(ID, kind, state));
        use HostState::*;
        vec![
            (vec![], Pending, ""),
            (
                vec![h("before", "running")],
                Upgrading,
                "draining: before hook running since",
            ),
            (vec![h("before", "succeeded"), enabled()], Upgrading, ""),
            (
                vec![h("before", "succeeded"), enabled(), ("/agents/cp1", agent.into())],
                Upgrading,
                "",
            ),
            (vec![h("before", "succeeded")], Upgrading, "but not enabled"),
            (
                vec![h("before", "succeeded"), held],
                Upgrading,
                "(held: host cp1)",
            ),
            (
                vec![h("before", "succeeded"), enabled(), at_v2()],
                Upgrading,
                "its after hook is due",
            ),
            (
                vec![h("after", "running"), at_v2()],
                Upgrading,
                "restoring: after hook running",
            ),
            (vec![h("after", "succeeded"), at_v2()], Upgraded, ""),
            (
                vec![h("before", "failed")],
                Failed,
                "before hook failed (exit 3): 2 instances left",
            ),
            (vec![h("after", "failed"), at_v2()], Failed, "after hook failed"),
            // Another rollout's record is history: the host is where its keys say.
            (vec![("/hooks/cp1", hook(OLD, "before", "running"))], Pending, ""),
            (vec![("/hooks/cp1", hook(OLD, "before", "failed"))], Pending, ""),
            (
                vec![("/hooks/cp1", "garbage".to_string())],
                Upgrading,
                "cannot be read",
            ),
        ]
    }

    #[test]
    fn a_host_holds_its_slot_from_its_before_hook_to_the_end_of_its_after_hook() {
        for (extra, want, says) in hook_cases() {
            let snap = in_rollout(&extra);
            let (st, why) = state_of(&snap, "cp1");
            let case = format!("{extra:?}");
            assert_eq!(st, want, "{case}: {why:?}");
            assert!(why.as_deref().unwrap_or("").contains(says), "{case}: {why:?}");
        }
        let bad = in_rollout(&[("/hooks/cp1", "garbage".to_string())]);
        let named = |p: &String| p.contains("/hooks/cp1") && p.contains("keeps its slot");
        assert!(bad.problems.iter().any(named), "{:?}", bad.problems);
    }

    #[test]
    fn a_failed_hook_of_the_last_rollout_still_counts_when_none_is_active() {
        let kvs = vec![
            kv("/current_version", "v2"),
            kv("/config_state/enable_puppet/global", "false"),
            kv("/hosts/cp1", &rec("compute")),
            kv("/running/versions/v1/cp1", "1"),
            kv("/agents/cp1", IDLE),
            kv("/hooks/cp1", &hook("20261123T020000Z-v2", "before", "failed")),
        ];
        let snap = Snapshot::from_kvs(&Schema::default(), &kvs);
        assert_eq!(state_of(&snap, "cp1").0, HostState::Failed);
        // At another version it is history.
        let mut kvs = kvs;
        kvs[0] = kv("/current_version", "v3");
        let snap = Snapshot::from_kvs(&Schema::default(), &kvs);
        assert_eq!(state_of(&snap, "cp1").0, HostState::Pending);
    }

    #[test]
    fn bad_values_are_reported_not_fatal() {
        let kvs = vec![
            kv("/current_version", "v2"),
            kv("/config_state/enable_puppet/global", "maybe"),
            kv("/hosts/x1", "not json"),
        ];
        let snap = Snapshot::from_kvs(&Schema::default(), &kvs);
        assert_eq!(snap.problems.len(), 2, "{:?}", snap.problems);
        assert!(snap.problems[0].contains("/config_state/enable_puppet/global"));
    }
}
