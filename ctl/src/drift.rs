//! Package drift: hosts of one role at one version whose installed package sets
//! differ, each named with the packages that differ from the role's most common
//! set. The grouping is `jio_common::packages::DriftGroup`'s; this module reads the
//! sets it needs (`/packages/<digest>`) and says it for people and for `--json`.

use std::collections::BTreeMap;

use jio_common::fleet::Snapshot;
use jio_common::keys::Schema;
use jio_common::names::{HostName, Role, Version};
use jio_common::packages::{DriftGroup, PackageChange, PackageSet, short_digest};
use jio_common::store::DynStore;
use serde_json::{Value, json};

/// The most sets one view reads for one role at one version (the most common
/// one first).
const MAX_SETS: usize = 8;
/// The most differences a line names for one host.
const SHOWN: usize = 4;

/// The recorded sets of the hosts at the version of their last successful run.
pub fn recorded(snap: &Snapshot) -> BTreeMap<(Role, Version), Vec<(HostName, String)>> {
    let mut by: BTreeMap<(Role, Version), Vec<(HostName, String)>> = BTreeMap::new();
    for (h, r) in &snap.results {
        let Some(p) = r.packages.as_ref().filter(|_| r.ok) else {
            continue;
        };
        if !snap.running.get(h).is_some_and(|v| v.contains(&r.version)) {
            continue;
        }
        by.entry((snap.role_of(h), r.version.clone()))
            .or_default()
            .push((h.clone(), p.digest.clone()));
    }
    by
}

/// One role at one version with more than one set.
#[derive(Debug, Clone)]
pub struct RoleDrift {
    pub role: Role,
    pub version: Version,
    pub group: DriftGroup<HostName>,
    /// Each drifted host's differences from the common set (`from`: the common
    /// set's version, `to`: the host's), or why they cannot be told.
    pub differs: BTreeMap<HostName, Result<Vec<PackageChange>, String>>,
}

/// The fleet's drift.
#[derive(Debug, Clone, Default)]
pub struct Drift {
    pub roles: Vec<RoleDrift>,
}

impl Drift {
    /// The drift of `snap`, with the sets it needs read from the store (a set that
    /// cannot be read is said, never an error).
    pub async fn load(store: &DynStore, schema: &Schema, snap: &Snapshot) -> Drift {
        Drift::load_of(store, schema, snap, |_| true).await
    }

    /// The drift among the hosts `keep` keeps.
    pub async fn load_of(
        store: &DynStore,
        schema: &Schema,
        snap: &Snapshot,
        keep: impl Fn(&HostName) -> bool,
    ) -> Drift {
        let mut sets: BTreeMap<String, Result<PackageSet, String>> = BTreeMap::new();
        let mut roles = Vec::new();
        for ((role, version), mut hosts) in recorded(snap) {
            hosts.retain(|(h, _)| keep(h));
            let Some(group) = DriftGroup::of(&hosts) else {
                continue;
            };
            for (d, _) in &group.sets {
                if !sets.contains_key(d) && sets.len() < MAX_SETS {
                    sets.insert(d.clone(), read_set(store, schema, d).await);
                }
            }
            let differs = group
                .drifted()
                .map(|(d, h)| (h.clone(), differences(&sets, &group.common, d)))
                .collect();
            roles.push(RoleDrift {
                role,
                version,
                group,
                differs,
            });
        }
        Drift { roles }
    }

    pub fn is_empty(&self) -> bool {
        self.roles.is_empty()
    }

    /// Lines for people: one per role and version, then one per drifted host.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for r in &self.roles {
            let common = &r.group.sets[0];
            let shared = if r.group.tie() {
                format!(
                    "no set is the most common (a tie); compared with {}",
                    short_digest(&common.0)
                )
            } else {
                format!(
                    "{} host(s) share the most common one ({})",
                    common.1.len(),
                    short_digest(&common.0)
                )
            };
            out.push(format!(
                "package drift: {} at {}: {} set(s); {shared}",
                r.role,
                r.version,
                r.group.sets.len()
            ));
            for (d, h) in r.group.drifted() {
                out.push(format!("  {h} ({}): {}", short_digest(d), said(&r.differs[h])));
            }
        }
        out
    }

    /// The `package_drift` document: `[{"role", "version", "common", "sets":
    /// {digest: [hosts]}, "hosts": {host: {"digest", "differs": [...] | "error"}}}]`.
    pub fn json(&self) -> Value {
        Value::Array(self.roles.iter().map(role_json).collect())
    }

    /// What `host` drifted by, if it did.
    pub fn of_host(&self, host: &HostName) -> Option<(&RoleDrift, &Result<Vec<PackageChange>, String>)> {
        self.roles
            .iter()
            .find_map(|r| r.differs.get(host).map(|d| (r, d)))
    }
}

fn role_json(r: &RoleDrift) -> Value {
    let sets: serde_json::Map<String, Value> = r
        .group
        .sets
        .iter()
        .map(|(d, hs)| (d.clone(), json!(hs)))
        .collect();
    let hosts: serde_json::Map<String, Value> = r
        .group
        .drifted()
        .map(|(d, h)| {
            let v = match &r.differs[h] {
                Ok(c) => json!({"digest": d, "differs": c}),
                Err(e) => json!({"digest": d, "error": e}),
            };
            (h.to_string(), v)
        })
        .collect();
    json!({"role": r.role, "version": r.version, "common": r.group.common, "sets": sets, "hosts": hosts})
}

/// The differences for people: the first few, and how many more.
pub fn said(d: &Result<Vec<PackageChange>, String>) -> String {
    match d {
        Err(e) => e.clone(),
        Ok(c) if c.is_empty() => "no package differs".into(),
        Ok(c) => {
            let mut s: Vec<String> = c.iter().take(SHOWN).map(ToString::to_string).collect();
            if c.len() > SHOWN {
                s.push(format!("+{} more", c.len() - SHOWN));
            }
            s.join(", ")
        }
    }
}

async fn read_set(store: &DynStore, schema: &Schema, digest: &str) -> Result<PackageSet, String> {
    let key = schema.package_set(digest);
    match store.get(&key).await {
        Ok(Some(kv)) => jio_common::values::text(&kv)
            .map_err(|e| e.to_string())
            .and_then(|t| PackageSet::from_text(t).map_err(|e| format!("key {key}: {e}")))
            .and_then(|set| {
                // Any agent may write a set: one that is not what its digest says is not used.
                (set.digest() == digest)
                    .then_some(set)
                    .ok_or_else(|| format!("the set stored under {key} does not match its digest"))
            }),
        Ok(None) => Err(format!("its package set is not stored ({key} is missing)")),
        Err(e) => Err(format!("cannot read {key}: {e}")),
    }
}

fn differences(
    sets: &BTreeMap<String, Result<PackageSet, String>>,
    common: &str,
    host: &str,
) -> Result<Vec<PackageChange>, String> {
    let get = |d: &str| match sets.get(d) {
        Some(Ok(s)) => Ok(s),
        Some(Err(e)) => Err(e.clone()),
        None => Err(format!(
            "not compared (more than {MAX_SETS} package sets in its role at its version)"
        )),
    };
    let (c, h) = (get(common)?, get(host)?);
    Ok(h.changes_since(c))
}
