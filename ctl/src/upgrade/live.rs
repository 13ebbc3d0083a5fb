//! The rollout's live view: the keys a snapshot reads, kept up to date from the
//! watch so that a pass costs no store request. It reads the store only when asked
//! to; it does not decide anything.

use std::collections::BTreeMap;

use jio_common::fleet::{LiveSnapshot, Snapshot};
use jio_common::keys::{Key, Outcome, Parsed, Schema};
use jio_common::roles::RolePattern;
use jio_common::store::{DynStore, KeyValue, Revision, StoreError, WatchEvent};

/// The keys a snapshot reads, kept up to date from the watch so that a pass costs
/// no store request (a full read only at the start, after a reset, and when the
/// desired version changes: failure entries are read per version).
pub struct LiveView {
    kvs: BTreeMap<Key, KeyValue>,
    /// The snapshot of `kvs`, kept up to date key by key.
    live: LiveSnapshot,
    revision: Revision,
    /// The oldest revision of the listings: the watch starts after it, so that no
    /// change between two listings is missed (events already seen are skipped).
    pub watch_from: Revision,
}

impl LiveView {
    pub async fn read(store: &DynStore, schema: &Schema) -> Result<LiveView, StoreError> {
        let (kvs, revisions) = Snapshot::read_kvs_at(store, schema, None).await?;
        let mut live = LiveSnapshot::default();
        for kv in &kvs {
            live.put(schema, kv);
        }
        Ok(LiveView {
            kvs: kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect(),
            live,
            revision: revisions.iter().copied().max().unwrap_or(0),
            watch_from: revisions.iter().copied().min().unwrap_or(0),
        })
    }

    pub fn snapshot(&mut self, schema: &Schema, role_pattern: &RolePattern) -> &Snapshot {
        let revision = self.revision;
        let s = self.live.snapshot(schema);
        s.revision = revision;
        s.now = Some(jio_common::time::unix_now());
        if &s.role_pattern != role_pattern {
            s.role_pattern = role_pattern.clone();
        }
        s
    }

    /// Applies a batch of events: `Reread` as soon as one needs it, else `Changed`
    /// when any changed what a plan depends on.
    pub fn apply_all(&mut self, schema: &Schema, events: impl IntoIterator<Item = WatchEvent>) -> Applied {
        let mut out = Applied::Nothing;
        for ev in events {
            match self.apply(schema, ev) {
                Applied::Nothing => {}
                Applied::Changed => out = Applied::Changed,
                Applied::Reread => return Applied::Reread,
            }
        }
        out
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
                    // Fleet commands' records and runs: a rollout's plan counts
                    // their hosts through the inboxes and the agents' records.
                    | Some(Parsed::Command(..))
                    | Some(Parsed::CommandRun(..))
                    | Some(Parsed::CommandLock(..))
                    // An agent's clock, rewritten every minute: no plan reads it.
                    | Some(Parsed::Clock(..))
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
                // Failure entries are read per version, and the record of a new current
                // rollout with it: read everything again.
                let version_changed = matches!(
                    schema.parse(&kv.key),
                    Some(Parsed::CurrentVersion | Parsed::CurrentRollout)
                ) && changed;
                self.live.put(schema, &kv);
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
                if matches!(
                    schema.parse(&key),
                    Some(Parsed::CurrentVersion | Parsed::CurrentRollout)
                ) {
                    Applied::Reread
                } else if self.kvs.remove(&key).is_some() {
                    self.live.delete(schema, &key);
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
pub enum Applied {
    Nothing,
    Changed,
    Reread,
}
