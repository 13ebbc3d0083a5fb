//! The fleet as `jioctl` sees it: a snapshot built from store listings (pure), and
//! each host's state for the current version.
//!
//! Reading a snapshot costs a fixed number of prefix listings, whatever the size of
//! the fleet; `Snapshot::from_kvs` and `classify` do no I/O, so tests can feed them
//! a replayed event history.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::gate::{self, Gate, GateKeys, KeyState};
use crate::keys::{EnableLevel, Key, Outcome, Parsed, Schema, Step};
use crate::names::{HostName, Role, Version};
use crate::store::{DynStore, KeyValue, Revision, StoreError};
use crate::values::{HostRecord, parse_json, parse_version};

/// The original tool's rule for a host that never registered: letters then digits.
pub fn role_from_name(host: &HostName) -> Option<Role> {
    let s = host.as_str();
    let letters: String = s.chars().take_while(|c| c.is_ascii_lowercase()).collect();
    let rest = &s[letters.len()..];
    (!letters.is_empty() && rest.starts_with(|c: char| c.is_ascii_digit()))
        .then(|| Role::new(letters).ok())
        .flatten()
}

/// The rollout lock's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct LockRecord {
    pub holder: String,
    pub host: String,
    pub pid: u32,
    pub since: u64,
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
    /// Failure entries for the current version, with their values (log links).
    pub failures: BTreeMap<HostName, (Step, String)>,
    /// Hosts with a live agent.
    pub agents: BTreeSet<HostName>,
    pub lock: Option<LockRecord>,
    /// Mod revision of the plan epoch key (0 when absent): every `jioctl` write of
    /// enable keys or the desired version bumps it, and a plan is applied only if it
    /// has not moved since the plan was computed.
    pub epoch: Revision,
    /// Values that could not be understood, by key (reported, otherwise ignored).
    pub problems: Vec<String>,
    /// Revision of the newest listing.
    pub revision: Revision,
}

impl Snapshot {
    /// Builds a snapshot from key-values of the schema (any order, any subset).
    pub fn from_kvs<'a>(schema: &Schema, kvs: impl IntoIterator<Item = &'a KeyValue>) -> Snapshot {
        let mut s = Snapshot::default();
        let mut failures: Vec<(Version, HostName, Step, String)> = Vec::new();
        for kv in kvs {
            let key_state = |s: &mut Snapshot, kv: &KeyValue| {
                let st = KeyState::read(Some(kv));
                if let KeyState::Invalid(e) = &st {
                    s.problems.push(e.clone());
                }
                st
            };
            match schema.parse(&kv.key) {
                Some(Parsed::CurrentVersion) => match parse_version(kv) {
                    Ok(v) => s.current = v,
                    Err(e) => s.problems.push(e.to_string()),
                },
                Some(Parsed::Host(h)) => match parse_json::<HostRecord>(kv) {
                    Ok(r) => {
                        s.roles.insert(h, r.role);
                    }
                    Err(e) => s.problems.push(e.to_string()),
                },
                Some(Parsed::RunningVersion(v, h)) => {
                    s.running.entry(h).or_default().insert(v);
                }
                Some(Parsed::Enable(EnableLevel::Global)) => s.global = key_state(&mut s, kv),
                Some(Parsed::Enable(EnableLevel::Role(r))) => {
                    let st = key_state(&mut s, kv);
                    s.role_keys.insert(r, st);
                }
                Some(Parsed::Enable(EnableLevel::Host(h))) => {
                    let st = key_state(&mut s, kv);
                    s.host_keys.insert(h, st);
                }
                Some(Parsed::Status(step, Outcome::Failure, v, h)) => {
                    failures.push((v, h, step, kv.value.clone()))
                }
                Some(Parsed::Agent(h)) => {
                    s.agents.insert(h);
                }
                Some(Parsed::Lock(name)) if name == ROLLOUT_LOCK => {
                    s.lock = serde_json::from_str(&kv.value).ok();
                }
                Some(Parsed::Lock(name)) if name == EPOCH => s.epoch = kv.mod_revision,
                _ => {}
            }
            s.revision = s.revision.max(kv.mod_revision);
        }
        if let Some(cur) = &s.current {
            for (v, h, step, link) in failures {
                if &v == cur {
                    s.failures.insert(h, (step, link));
                }
            }
        }
        s
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
            snap.failures = kvs
                .iter()
                .filter_map(|kv| match schema.parse(&kv.key) {
                    Some(Parsed::Status(step, Outcome::Failure, fv, h)) if &fv == v => {
                        Some((h, (step, kv.value.clone())))
                    }
                    _ => None,
                })
                .collect();
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
        let current = store.get(&schema.current_version()).await?;
        let cur_version = version
            .cloned()
            .or_else(|| current.as_ref().and_then(|kv| Version::new(kv.value.trim()).ok()));
        let mut prefixes: Vec<Key> = vec![
            schema.hosts(),
            schema.running_versions(),
            schema.enable_root(),
            schema.agents(),
            schema.locks(),
        ];
        if let Some(v) = &cur_version {
            for step in Step::ALL {
                prefixes.push(schema.status_version_prefix(step, Outcome::Failure, v));
            }
        }
        let listings = futures_util::future::try_join_all(prefixes.iter().map(|p| store.list(p))).await?;
        let revision = listings.iter().map(|l| l.revision).max().unwrap_or(0);
        let kvs = current
            .into_iter()
            .chain(listings.into_iter().flat_map(|l| l.kvs))
            .collect();
        Ok((kvs, revision))
    }

    /// Every known host: registered, or found at some version.
    pub fn hosts(&self) -> BTreeSet<HostName> {
        self.roles.keys().chain(self.running.keys()).cloned().collect()
    }

    /// A host's role: registered, else from its name, else `unknown`.
    pub fn role_of(&self, h: &HostName) -> Role {
        self.roles
            .get(h)
            .cloned()
            .or_else(|| role_from_name(h))
            .unwrap_or_else(|| Role::new("unknown").unwrap_or_else(|_| unreachable!()))
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

/// The name of the lock `jioctl upgrade` holds.
pub const ROLLOUT_LOCK: &str = "rollout";
/// The key whose mod revision fences plans (see `Snapshot::epoch`).
pub const EPOCH: &str = "epoch";

/// A host's place in the rollout to the current version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HostState {
    Upgraded,
    Upgrading,
    Failed,
    Pending,
    /// Upgrading, but its agent's liveness lease is gone.
    Lost,
}

impl HostState {
    pub const ALL: [HostState; 5] = [
        HostState::Upgraded,
        HostState::Upgrading,
        HostState::Failed,
        HostState::Pending,
        HostState::Lost,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            HostState::Upgraded => "upgraded",
            HostState::Upgrading => "upgrading",
            HostState::Failed => "failed",
            HostState::Pending => "pending",
            HostState::Lost => "lost",
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
}

/// Classifies every host for the current version. Without a current version every
/// host counts as upgraded (there is nothing to move to).
pub fn classify(s: &Snapshot) -> Vec<HostStatus> {
    s.hosts()
        .into_iter()
        .map(|h| {
            let role = s.role_of(&h);
            let state = match &s.current {
                None => HostState::Upgraded,
                Some(cur) => {
                    if s.failures.contains_key(&h) {
                        HostState::Failed
                    } else if s.running.get(&h).is_some_and(|vs| vs.contains(cur)) {
                        HostState::Upgraded
                    } else if !s.gate(&h, &role).enabled {
                        HostState::Pending
                    } else if s.agents.contains(&h) {
                        HostState::Upgrading
                    } else {
                        HostState::Lost
                    }
                }
            };
            HostStatus { host: h, role, state }
        })
        .collect()
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

    fn kv(key: &str, value: &str) -> KeyValue {
        KeyValue {
            key: Key::new(key).unwrap(),
            value: value.into(),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: None,
            not_text: false,
        }
    }
    fn rec(role: &str) -> String {
        format!(r#"{{"role":"{role}","agent_version":"0.1.0","addresses":[],"first_seen":1}}"#)
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
            kv("/agents/ctl2", "{}"),
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
