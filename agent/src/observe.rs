//! What a pass reads before it decides: the desired version, the three enable keys,
//! the rollout lock, the holds on the host and its role, `/rollouts/current` and the
//! host's last result (one request), the active rollout's record (a second request,
//! only while a rollout is active), the local version, and what the journal and the
//! health checks remember. Reading only: nothing here writes or decides.

use jio_common::fleet::{CurrentRollout, ROLLOUT_LOCK};
use jio_common::gate::{self, GateKeys, KeyState};
use jio_common::keys::{EnableLevel, HoldTarget, Key, Schema};
use jio_common::names::{HostName, Role};
use jio_common::rules::Rules;
use jio_common::store::{Compare, DynStore, KeyValue, Revision, StoreError};
use jio_common::values::{HostResult, parse_json, parse_version};
use jio_common::window;

use crate::decide::{Health, Hold, Observation, RolloutFacts};
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
        keys
    }

    /// The compares on what every run decided on: the desired version and the
    /// three enable keys are still at the revisions `obs` read.
    fn decided_fence(&self, obs: &Observation) -> Vec<Compare> {
        let mut c = vec![Compare::ModRevision(
            self.schema.current_version(),
            obs.desired_revision,
        )];
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
    /// written after the observation wins) and `/rollouts/current` (its windows).
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
}

/// The active rollout's id and parsed rules, kept between passes: a record's rules
/// never change under its id, so a pass reads the record only when
/// `/rollouts/current` names another rollout (one store request per pass, not two).
/// A record that cannot be used is not kept: it is read again until it can.
pub type RolloutCache = Option<(String, Rules)>;

/// Reads everything one decision needs. An invalid value is part of what was
/// observed (the decision says the host is blocked), never an error.
pub async fn observe(store: &DynStore, who: Subject<'_>, mem: Memory<'_>) -> Result<Observation, AgentError> {
    let mut keys = vec![who.schema.current_version()];
    keys.extend(who.gate_keys());
    keys.push(who.schema.lock(ROLLOUT_LOCK));
    keys.extend(who.hold_keys());
    keys.push(who.schema.current_rollout());
    keys.push(who.schema.result(who.host));
    let got = store.get_many(&keys).await?;
    let [desired, h, r, g, lock, host_hold, role_hold, current, result] =
        <[_; 9]>::try_from(got).map_err(|_| {
            AgentError::Store(StoreError::Rejected {
                url: store.url().to_string(),
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
    let hold_revisions = [&host_hold, &role_hold].map(|kv| kv.as_ref().map_or(0, |kv| kv.mod_revision));
    let hold = [host_hold, role_hold]
        .into_iter()
        .flatten()
        .next()
        .map(|kv| Hold {
            key: kv.key.to_string(),
            record: parse_json(&kv).map_err(|e| e.to_string()),
        });
    let rollout_revision = current.as_ref().map_or(0, |kv| kv.mod_revision);
    let rollout = match &current {
        None => RolloutFacts::default(),
        Some(cur) => rollout_facts(store, who, cur, mem.now, mem.rollout_cache).await?,
    };
    Ok(Observation {
        desired,
        desired_invalid,
        desired_revision,
        rollout_lock: lock.is_some(),
        local: state::read_local_version(mem.version_file)?,
        gate: gate::decide(&GateKeys { host, role, global }),
        gate_revisions: revs,
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
    })
}

/// What the rollout `/rollouts/current` (as read: `cur`) names says for this host at
/// `now`: its windows for the host's role, `min_healthy_time` and start. A record
/// that is missing or cannot be read is a fact (`unusable`, naming the key).
async fn rollout_facts(
    store: &DynStore,
    who: Subject<'_>,
    cur: &KeyValue,
    now: u64,
    cache: &mut RolloutCache,
) -> Result<RolloutFacts, AgentError> {
    let facts = |id: &str, rules: &Rules| RolloutFacts {
        window: window::state(&rules.windows_for(who.role), now),
        min_healthy_time: rules.min_healthy_time,
        id: Some(id.to_string()),
        unusable: None,
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
