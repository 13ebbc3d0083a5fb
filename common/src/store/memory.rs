//! An in-memory store with the same trait and the same semantics as the real ones
//! (revisions, fenced transactions, leases, watches from a revision, compaction),
//! for pure logic tests and the agent's loop on paused time only: the contract
//! suite (`tests/tests/contract.rs`) runs it too, beside the real backends it never
//! replaces.
//!
//! Time is tokio's clock, so leases expire as paused time advances. Expiry is seen by
//! the next operation (any operation, or a watch being polled after a write).
//! `set_available(false)` makes every call fail as an unreachable store does, so a
//! test can take the store away and bring it back.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;

use super::api::{
    Compare, KeyValue, Lease, LeaseId, Listing, Op, Result, Revision, Store, StoreError, Txn, TxnOutcome,
    WatchEvent, WatchStream,
};
use super::support::overlapping_ops;
use crate::keys::Key;

/// The shortest lease granted, as etcd rounds short TTLs up.
const MIN_TTL: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
struct State {
    revision: Revision,
    kvs: BTreeMap<String, KeyValue>,
    /// Every event after `compacted`, in revision order.
    history: Vec<WatchEvent>,
    compacted: Revision,
    leases: HashMap<String, (Instant, Duration)>,
    next_lease: u64,
}

/// A store held in this process; clones share it.
#[derive(Clone)]
pub struct MemoryStore {
    url: Arc<str>,
    state: Arc<Mutex<State>>,
    events: broadcast::Sender<Arc<Vec<WatchEvent>>>,
    available: Arc<AtomicBool>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore {
            url: Arc::from("memory://"),
            // A new store is at revision 1, as a new etcd is: the first write is 2.
            state: Arc::new(Mutex::new(State {
                revision: 1,
                ..State::default()
            })),
            events: broadcast::channel(4096).0,
            available: Arc::new(AtomicBool::new(true)),
        }
    }

    /// Takes the store away (`false`: every call fails as `Unavailable`, watches
    /// deliver nothing) or brings it back.
    pub fn set_available(&self, up: bool) {
        self.available.store(up, Ordering::SeqCst);
    }

    /// Writes raw bytes under a raw key, as another program could: a value that is
    /// not text is kept and marked as such; a key name that is not a valid key is
    /// kept out of every answer, as the real stores skip it.
    pub fn put_raw(&self, key: &[u8], value: &[u8]) -> Result<Revision> {
        let mut s = self.lock("put")?;
        let Some(key) = std::str::from_utf8(key).ok().and_then(|k| Key::new(k).ok()) else {
            tracing::warn!(key = %crate::encode::escape_bytes(key), "skipped a key that is not a valid key name");
            return Ok(s.revision);
        };
        let rev = s.revision + 1;
        let (create, version) = s
            .kvs
            .get(key.as_str())
            .map_or((rev, 1), |old| (old.create_revision, old.version + 1));
        let kv = KeyValue::from_bytes(key.clone(), value.to_vec(), create, rev, version, None);
        s.kvs.insert(key.as_str().to_string(), kv.clone());
        s.revision = rev;
        s.history.push(WatchEvent::Put(kv.clone()));
        let _ = self.events.send(Arc::new(vec![WatchEvent::Put(kv)]));
        Ok(rev)
    }

    /// The state, once the store is reachable and expired leases are gone.
    fn lock(&self, op: &'static str) -> Result<MutexGuard<'_, State>> {
        if !self.available.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable {
                url: self.url.to_string(),
                op,
                reason: "the in-memory store was taken away by the test".into(),
            });
        }
        // A poisoned lock means a panic in a test: the state is still consistent
        // (every change is applied whole under the lock).
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let ended: Vec<String> = s
            .leases
            .iter()
            .filter(|(_, (deadline, _))| *deadline <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ended {
            self.end_lease(&mut s, &id);
        }
        Ok(s)
    }

    fn end_lease(&self, s: &mut State, id: &str) {
        s.leases.remove(id);
        let keys: Vec<Key> = s
            .kvs
            .values()
            .filter(|kv| kv.lease.as_ref().is_some_and(|l| l.0 == id))
            .map(|kv| kv.key.clone())
            .collect();
        if !keys.is_empty() {
            self.commit(s, keys.into_iter().map(Op::Delete).collect());
        }
    }

    /// Applies `ops` at one new revision and publishes their events. Ops that change
    /// nothing (deleting a missing key) do not advance the revision.
    fn commit(&self, s: &mut State, ops: Vec<Op>) -> Revision {
        let rev = s.revision + 1;
        let mut events = Vec::new();
        for op in ops {
            match op {
                Op::Put { key, value, lease } => {
                    let (create_revision, version) = match s.kvs.get(key.as_str()) {
                        Some(old) => (old.create_revision, old.version + 1),
                        None => (rev, 1),
                    };
                    let kv = KeyValue {
                        key: key.clone(),
                        value,
                        create_revision,
                        mod_revision: rev,
                        version,
                        lease,
                        not_text: false,
                    };
                    s.kvs.insert(key.as_str().to_string(), kv.clone());
                    events.push(WatchEvent::Put(kv));
                }
                Op::Delete(key) => {
                    if s.kvs.remove(key.as_str()).is_some() {
                        events.push(WatchEvent::Delete { key, revision: rev });
                    }
                }
                Op::DeletePrefix(prefix) => {
                    let keys: Vec<String> = s
                        .kvs
                        .keys()
                        .filter(|k| k.starts_with(prefix.as_str()))
                        .cloned()
                        .collect();
                    for k in keys {
                        if let Some(kv) = s.kvs.remove(&k) {
                            events.push(WatchEvent::Delete {
                                key: kv.key,
                                revision: rev,
                            });
                        }
                    }
                }
            }
        }
        if events.is_empty() {
            return s.revision;
        }
        s.revision = rev;
        s.history.extend(events.iter().cloned());
        // Nobody listening is not an error.
        let _ = self.events.send(Arc::new(events));
        rev
    }

    fn holds(s: &State, c: &Compare) -> bool {
        match c {
            Compare::Absent(k) => !s.kvs.contains_key(k.as_str()),
            Compare::ModRevision(k, rev) => s.kvs.get(k.as_str()).map_or(0, |kv| kv.mod_revision) == *rev,
            Compare::Value(k, v) => s.kvs.get(k.as_str()).is_some_and(|kv| &kv.value == v),
        }
    }

    fn check_lease(&self, s: &State, lease: Option<&LeaseId>) -> Result<()> {
        match lease {
            Some(l) if !s.leases.contains_key(&l.0) => Err(StoreError::LeaseNotFound {
                url: self.url.to_string(),
                lease: l.clone(),
            }),
            _ => Ok(()),
        }
    }

    fn listing(s: &State, prefix: &Key) -> Vec<KeyValue> {
        s.kvs
            .range(prefix.as_str().to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix.as_str()))
            .map(|(_, kv)| kv.clone())
            .collect()
    }
}

fn event_in(ev: &WatchEvent, prefix: &Key) -> bool {
    match ev {
        WatchEvent::Put(kv) => kv.key.starts_with(prefix),
        WatchEvent::Delete { key, .. } => key.starts_with(prefix),
        WatchEvent::Reset { .. } => true,
    }
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    fn url(&self) -> &str {
        &self.url
    }

    async fn ping(&self) -> Result<Revision> {
        Ok(self.lock("ping")?.revision)
    }

    async fn get(&self, key: &Key) -> Result<Option<KeyValue>> {
        Ok(self.lock("get")?.kvs.get(key.as_str()).cloned())
    }

    async fn get_many_at(&self, keys: &[Key]) -> Result<(Vec<Option<KeyValue>>, Revision)> {
        let s = self.lock("get")?;
        Ok((
            keys.iter().map(|k| s.kvs.get(k.as_str()).cloned()).collect(),
            s.revision,
        ))
    }

    async fn list(&self, prefix: &Key) -> Result<Listing> {
        let s = self.lock("list")?;
        Ok(Listing {
            kvs: MemoryStore::listing(&s, prefix),
            revision: s.revision,
        })
    }

    async fn put(&self, key: &Key, value: &str, lease: Option<&LeaseId>) -> Result<Revision> {
        let mut s = self.lock("put")?;
        self.check_lease(&s, lease)?;
        Ok(self.commit(
            &mut s,
            vec![Op::Put {
                key: key.clone(),
                value: value.to_string(),
                lease: lease.cloned(),
            }],
        ))
    }

    async fn delete(&self, key: &Key) -> Result<bool> {
        let mut s = self.lock("delete")?;
        let existed = s.kvs.contains_key(key.as_str());
        self.commit(&mut s, vec![Op::Delete(key.clone())]);
        Ok(existed)
    }

    async fn delete_prefix(&self, prefix: &Key) -> Result<u64> {
        let mut s = self.lock("delete prefix")?;
        let n = MemoryStore::listing(&s, prefix).len() as u64;
        self.commit(&mut s, vec![Op::DeletePrefix(prefix.clone())]);
        Ok(n)
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        if let Some(why) = overlapping_ops(&txn.ops) {
            return Err(StoreError::Rejected {
                url: self.url.to_string(),
                op: "txn",
                message: why,
            });
        }
        let size = txn.compares.len() + txn.ops.len();
        if size > self.max_txn_ops() {
            return Err(StoreError::Rejected {
                url: self.url.to_string(),
                op: "txn",
                message: format!(
                    "{size} operations in one transaction (at most {})",
                    self.max_txn_ops()
                ),
            });
        }
        let mut s = self.lock("txn")?;
        if !txn.compares.iter().all(|c| MemoryStore::holds(&s, c)) {
            return Ok(TxnOutcome::Lost(s.revision));
        }
        for op in &txn.ops {
            if let Op::Put { lease, .. } = op {
                self.check_lease(&s, lease.as_ref())?;
            }
        }
        Ok(TxnOutcome::Committed(self.commit(&mut s, txn.ops)))
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<Lease> {
        let mut s = self.lock("lease grant")?;
        let ttl = ttl.max(MIN_TTL);
        s.next_lease += 1;
        let id = s.next_lease.to_string();
        s.leases.insert(id.clone(), (Instant::now() + ttl, ttl));
        Ok(Lease { id: LeaseId(id), ttl })
    }

    async fn keep_alive(&self, lease: &LeaseId) -> Result<Duration> {
        let mut s = self.lock("lease keep-alive")?;
        match s.leases.get_mut(&lease.0) {
            Some((deadline, ttl)) => {
                *deadline = Instant::now() + *ttl;
                Ok(*ttl)
            }
            None => Err(StoreError::LeaseNotFound {
                url: self.url.to_string(),
                lease: lease.clone(),
            }),
        }
    }

    async fn revoke_lease(&self, lease: &LeaseId) -> Result<()> {
        let mut s = self.lock("lease revoke")?;
        self.end_lease(&mut s, &lease.0);
        Ok(())
    }

    async fn watch(&self, prefix: &Key, from: Revision) -> Result<WatchStream> {
        // Subscribe before reading the history, so that nothing falls in between.
        let rx = self.events.subscribe();
        let s = self.lock("watch")?;
        let first: Vec<WatchEvent> = if from > 0 && from < s.compacted {
            vec![WatchEvent::Reset {
                kvs: MemoryStore::listing(&s, prefix),
                revision: s.revision,
            }]
        } else {
            let from = if from > 0 { from } else { s.revision + 1 };
            s.history
                .iter()
                .filter(|e| e.revision() >= from && event_in(e, prefix))
                .cloned()
                .collect()
        };
        // Nothing before `from`, even from a revision still to come.
        let next = from.max(s.revision + 1);
        drop(s);
        let store = self.clone();
        let prefix = prefix.clone();
        let pending: std::collections::VecDeque<WatchEvent> = first.into();
        Ok(Box::pin(futures_util::stream::unfold(
            (pending, rx, next, store, prefix),
            |(mut pending, mut rx, mut next, store, prefix)| async move {
                loop {
                    if !pending.is_empty() {
                        // While the store is away its watches deliver nothing; what
                        // happened is delivered once it is back, as a reconnected
                        // watch would.
                        while !store.available.load(Ordering::SeqCst) {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                    if let Some(ev) = pending.pop_front() {
                        return Some((Ok(ev), (pending, rx, next, store, prefix)));
                    }
                    match rx.recv().await {
                        Ok(batch) => {
                            for ev in batch.iter() {
                                if ev.revision() >= next && event_in(ev, &prefix) {
                                    pending.push_back(ev.clone());
                                }
                            }
                            if let Some(last) = batch.last() {
                                next = next.max(last.revision() + 1);
                            }
                        }
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            // Fell behind: start again from the whole state.
                            let Ok(s) = store.lock("watch") else { continue };
                            pending.push_back(WatchEvent::Reset {
                                kvs: MemoryStore::listing(&s, &prefix),
                                revision: s.revision,
                            });
                            next = s.revision + 1;
                        }
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            },
        )))
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let mut s = self.lock("compact")?;
        if revision > s.revision {
            return Err(StoreError::Rejected {
                url: self.url.to_string(),
                op: "compact",
                message: format!("revision {revision} is in the future (current {})", s.revision),
            });
        }
        if revision > s.compacted {
            // History before `revision` goes; events at it stay.
            s.compacted = revision;
            s.history.retain(|e| e.revision() >= revision);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt as _;

    fn k(s: &str) -> Key {
        Key::new(s).expect("key")
    }

    #[tokio::test(start_paused = true)]
    async fn leases_end_with_tokio_time() {
        let m = MemoryStore::new();
        let lease = m.grant_lease(Duration::from_secs(3)).await.expect("grant");
        m.put(&k("/a"), "1", Some(&lease.id)).await.expect("put");
        tokio::time::sleep(Duration::from_secs(2)).await;
        m.keep_alive(&lease.id).await.expect("alive");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(m.get(&k("/a")).await.expect("get").is_some());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(m.get(&k("/a")).await.expect("get").is_none());
        assert!(m.keep_alive(&lease.id).await.is_err());
    }

    #[tokio::test]
    async fn taken_away_and_back() {
        let m = MemoryStore::new();
        m.set_available(false);
        let e = m.get(&k("/a")).await.expect_err("down");
        assert_eq!(e.kind(), super::super::ErrorKind::Unavailable);
        m.set_available(true);
        assert!(m.put(&k("/a"), "1", None).await.is_ok());
    }

    #[tokio::test]
    async fn watches_from_a_revision_and_after_compaction() {
        let m = MemoryStore::new();
        let r1 = m.put(&k("/p/a"), "1", None).await.expect("put");
        m.put(&k("/q"), "x", None).await.expect("put");
        let mut w = m.watch(&k("/p/"), r1).await.expect("watch");
        m.put(&k("/p/b"), "2", None).await.expect("put");
        let first = w.next().await.expect("event").expect("ok");
        assert_eq!(first.revision(), r1);
        let second = w.next().await.expect("event").expect("ok");
        assert!(matches!(second, WatchEvent::Put(kv) if kv.key.as_str() == "/p/b"));
        m.compact(r1 + 1).await.expect("compact");
        let mut w = m.watch(&k("/p/"), r1).await.expect("watch");
        let reset = w.next().await.expect("event").expect("ok");
        assert!(matches!(reset, WatchEvent::Reset { kvs, .. } if kvs.len() == 2));
    }
}
