//! What a pass reads before it decides: the desired version, the three enable keys
//! and the rollout lock (one request), the local version, and what the journal and
//! the health checks remember. Reading only: nothing here writes or decides.

use jio_common::fleet::ROLLOUT_LOCK;
use jio_common::gate::{self, GateKeys, KeyState};
use jio_common::keys::{EnableLevel, Key, Schema};
use jio_common::names::{HostName, Role};
use jio_common::store::{Compare, DynStore, Revision, StoreError};
use jio_common::values::parse_version;

use crate::decide::{Health, Observation};
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

    /// The keys whose changes should wake the agent.
    pub fn watched_keys(&self) -> Vec<Key> {
        let mut keys = vec![self.schema.current_version()];
        keys.extend(self.gate_keys());
        keys
    }

    /// The compares that fence the start of a run on what `obs` read: the desired
    /// version and the three enable keys are still at those revisions.
    pub fn start_fence(&self, obs: &Observation) -> Vec<Compare> {
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

    /// `start_fence`, and the rollout lock still free (health checks and repairs).
    pub fn health_fence(&self, obs: &Observation) -> Vec<Compare> {
        let mut c = self.start_fence(obs);
        c.push(Compare::ModRevision(self.schema.lock(ROLLOUT_LOCK), 0));
        c
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
}

/// Reads everything one decision needs. An invalid value is part of what was
/// observed (the decision says the host is blocked), never an error.
pub async fn observe(store: &DynStore, who: Subject<'_>, mem: Memory<'_>) -> Result<Observation, AgentError> {
    let mut keys = vec![who.schema.current_version()];
    keys.extend(who.gate_keys());
    keys.push(who.schema.lock(ROLLOUT_LOCK));
    let got = store.get_many(&keys).await?;
    let [desired, h, r, g, lock] = <[_; 5]>::try_from(got).map_err(|_| {
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
    })
}
