//! Lookups that several read-only commands share (no output, no exit codes).

use std::collections::BTreeMap;

use jio_common::fleet::Snapshot;
use jio_common::keys::{Parsed, Schema};
use jio_common::names::{HostName, Version};
use jio_common::store::{DynStore, StoreError};

/// The hosts at each version.
pub fn versions(snap: &Snapshot) -> BTreeMap<Version, Vec<HostName>> {
    let mut out: BTreeMap<Version, Vec<HostName>> = BTreeMap::new();
    let hosts = snap.hosts();
    // A name no host can have, which only /running/versions has, is reported
    // (the snapshot's problems), not counted.
    for (h, vs) in snap.running.iter().filter(|(h, _)| hosts.contains(*h)) {
        for v in vs {
            out.entry(v.clone()).or_default().push(h.clone());
        }
    }
    out
}

/// The hosts with a `/running/versions/<v>/` entry.
pub async fn hosts_at(store: &DynStore, schema: &Schema, v: &Version) -> Result<Vec<HostName>, StoreError> {
    Ok(store
        .list(&schema.running_version(v))
        .await?
        .kvs
        .iter()
        .filter_map(|kv| match schema.parse(&kv.key) {
            Some(Parsed::RunningVersion(_, h)) => Some(h),
            _ => None,
        })
        .collect())
}
