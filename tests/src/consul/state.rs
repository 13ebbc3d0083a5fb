//! The state of the Consul test server, without HTTP: the KV store with its
//! indexes and tombstones, all-or-nothing transactions, and sessions with their
//! locks. `http` maps requests onto it; this part is tested on its own below.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// Most operations in one transaction, as Consul documents.
pub(super) const MAX_TXN_OPS: usize = 64;

/// One key's entry.
#[derive(Clone, Debug)]
pub(super) struct Entry {
    pub(super) value: Vec<u8>,
    pub(super) create: u64,
    pub(super) modify: u64,
    pub(super) lock_index: u64,
    pub(super) flags: u64,
    pub(super) session: Option<String>,
}

#[derive(Clone, Debug)]
struct Session {
    ttl: Duration,
    deadline: Instant,
    delete: bool,
    /// Bound to the node's `serfHealth` check (a session created without
    /// `NodeChecks: []`): invalidated when the node fails.
    node_check: bool,
    /// After the session ends, its keys cannot be locked again for this long.
    lock_delay: Duration,
}

/// What `PUT /v1/session/create` asks for.
#[derive(Debug, Clone)]
pub(super) struct NewSession {
    pub ttl: Duration,
    pub delete: bool,
    pub node_check: bool,
    pub lock_delay: Duration,
}

#[derive(Default, Clone)]
pub(super) struct State {
    pub(super) index: u64,
    pub(super) kv: BTreeMap<String, Entry>,
    /// Deleted keys and the index of their deletion (for blocking queries).
    tombstones: BTreeMap<String, u64>,
    sessions: HashMap<String, Session>,
    next_session: u64,
    /// The node's `serfHealth` check is critical.
    node_failed: bool,
    /// Keys under lock-delay, until when.
    lock_delays: HashMap<String, Instant>,
    /// Snapshot restores so far (each wakes every blocking query).
    pub(super) restores: u64,
}

impl State {
    pub(super) fn bump(&mut self) -> u64 {
        self.index += 1;
        self.index
    }

    /// The index of what a query of `prefix` (or the exact key) reads.
    pub(super) fn query_index(&self, key: &str, recurse: bool) -> u64 {
        let matches = |k: &str| if recurse { k.starts_with(key) } else { k == key };
        let live = self
            .kv
            .iter()
            .filter(|(k, _)| matches(k))
            .map(|(_, e)| e.modify)
            .max()
            .unwrap_or(0);
        let dead = self
            .tombstones
            .iter()
            .filter(|(k, _)| matches(k))
            .map(|(_, i)| *i)
            .max()
            .unwrap_or(0);
        // A query of nothing that ever existed still gets the store's index.
        let i = live.max(dead);
        if i == 0 { self.index.max(1) } else { i }
    }

    pub(super) fn delete_key(&mut self, key: &str, at: u64) -> bool {
        if self.kv.remove(key).is_some() {
            self.tombstones.insert(key.to_string(), at);
            true
        } else {
            false
        }
    }

    /// Writes `value`; whether anything changed. A write of the key's current value
    /// (and, for a lock, by its current session) is skipped, as Consul ≥ 1.6 does
    /// (`kvsSetTxn`: an entry equal to the existing one is not written): its
    /// `ModifyIndex` does not move and no blocking query wakes.
    pub(super) fn set(&mut self, key: &str, value: Vec<u8>, at: u64) -> bool {
        self.set_as(key, value, at, None)
    }

    /// `set`, by `lock` (`Some(session)`): the entry is equal only if that session
    /// already holds it.
    fn set_as(&mut self, key: &str, value: Vec<u8>, at: u64, lock: Option<&str>) -> bool {
        match self.kv.get_mut(key) {
            Some(e) if e.value == value && lock.is_none_or(|s| e.session.as_deref() == Some(s)) => false,
            Some(e) => {
                e.value = value;
                e.modify = at;
                true
            }
            None => {
                self.tombstones.remove(key);
                self.kv.insert(
                    key.to_string(),
                    Entry {
                        value,
                        create: at,
                        modify: at,
                        lock_index: 0,
                        flags: 0,
                        session: None,
                    },
                );
                true
            }
        }
    }

    /// Invalidates sessions whose deadline passed (or `only`), releasing or deleting their keys.
    pub(super) fn expire(&mut self, now: Instant, only: Option<&str>) -> bool {
        let dead: Vec<(String, bool)> = self
            .sessions
            .iter()
            .filter(|(id, s)| only.map_or(s.deadline <= now, |o| o == id.as_str()))
            .map(|(id, s)| (id.clone(), s.delete))
            .collect();
        if dead.is_empty() {
            return false;
        }
        for (id, delete) in dead {
            let lock_delay = self.sessions.remove(&id).map_or(Duration::ZERO, |s| s.lock_delay);
            let held: Vec<String> = self
                .kv
                .iter()
                .filter(|(_, e)| e.session.as_deref() == Some(id.as_str()))
                .map(|(k, _)| k.clone())
                .collect();
            for k in held {
                if !lock_delay.is_zero() {
                    self.lock_delays.insert(k.clone(), now + lock_delay);
                }
                let at = self.bump();
                if delete {
                    self.delete_key(&k, at);
                } else if let Some(e) = self.kv.get_mut(&k) {
                    e.session = None;
                    e.modify = at;
                }
            }
        }
        true
    }
}

/// One operation of a transaction, as decoded from its JSON.
#[derive(Debug, Clone, Default)]
pub(super) struct TxnOp {
    pub verb: String,
    pub key: String,
    pub value: Vec<u8>,
    pub index: u64,
    pub session: String,
}

/// One entry of a transaction's `Results`.
#[derive(Debug, Clone)]
pub(super) struct TxnResult {
    pub key: String,
    pub entry: Entry,
    /// Whether the answer carries the value (only a `get`'s does).
    pub value: bool,
}

/// Why a transaction failed: the operation and what Consul says.
pub(super) type TxnError = (usize, String);

/// Why a write could not be attempted (not a lost compare).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct InvalidSession(pub String);

impl State {
    /// A new store: Consul's index starts at 1.
    pub(super) fn new() -> State {
        State {
            index: 1,
            ..State::default()
        }
    }

    /// The entries a read of `key` (or everything under it) returns, in key order.
    pub(super) fn read(&self, key: &str, recurse: bool) -> Vec<(String, Entry)> {
        self.kv
            .iter()
            .filter(|(k, _)| if recurse { k.starts_with(key) } else { *k == key })
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect()
    }

    /// `PUT /v1/kv/<key>[?cas][&acquire]`: whether it was written.
    pub(super) fn put(
        &mut self,
        key: &str,
        value: Vec<u8>,
        cas: Option<u64>,
        acquire: Option<&str>,
    ) -> Result<bool, InvalidSession> {
        if let Some(cas) = cas
            && self.kv.get(key).map_or(0, |e| e.modify) != cas
        {
            return Ok(false);
        }
        let Some(sid) = acquire else {
            let at = self.index + 1;
            if self.set(key, value, at) {
                self.index = at;
            }
            return Ok(true);
        };
        if !self.sessions.contains_key(sid) {
            return Err(InvalidSession(sid.to_string()));
        }
        if self
            .kv
            .get(key)
            .is_some_and(|e| e.session.as_ref().is_some_and(|s| s != sid))
            || self.lock_delayed(key, Instant::now())
        {
            return Ok(false);
        }
        let at = self.index + 1;
        if self.set_as(key, value, at, Some(sid)) | self.take_lock(key, sid, at) {
            self.index = at;
        }
        Ok(true)
    }

    /// `sid` takes the lock on `key` (written at `at`); whether it changed hands.
    fn take_lock(&mut self, key: &str, sid: &str, at: u64) -> bool {
        if let Some(e) = self.kv.get_mut(key)
            && e.session.as_deref() != Some(sid)
        {
            e.session = Some(sid.to_string());
            e.lock_index += 1;
            e.modify = at;
            return true;
        }
        false
    }

    /// `DELETE /v1/kv/<key>[?recurse][&cas]`: whether the compare held.
    pub(super) fn delete(&mut self, key: &str, recurse: bool, cas: Option<u64>) -> bool {
        // `kvsDeleteCASTxn`: a compare on a key that is not there holds (there is
        // nothing to delete); on one at another index it fails.
        if let Some(cas) = cas
            && let Some(e) = self.kv.get(key)
            && e.modify != cas
        {
            return false;
        }
        let keys: Vec<String> = self.read(key, recurse).into_iter().map(|(k, _)| k).collect();
        if !keys.is_empty() {
            let at = self.bump();
            for k in keys {
                self.delete_key(&k, at);
            }
        }
        true
    }

    /// `PUT /v1/txn`: every operation at one index, or none. Returns what Consul
    /// (≥ 1.8, `state/txn.go`) returns per operation: `get` its entry with the
    /// value; `set`, `cas`, `lock` and `check-index` the entry without its value
    /// (a skipped same-value write shows the old `ModifyIndex`); the deletes and
    /// `check-not-exists` nothing. The index moves only if something changed.
    pub(super) fn txn(&mut self, ops: &[TxnOp]) -> Result<Vec<TxnResult>, TxnError> {
        let mut work = self.clone();
        let at = work.index + 1;
        let mut results = Vec::new();
        let mut wrote = false;
        for (i, op) in ops.iter().enumerate() {
            let fail = |what: String| Err((i, what));
            let key = op.key.as_str();
            let cur = work.kv.get(key).cloned();
            let at_index = |e: &Option<Entry>| e.as_ref().map(|e| e.modify);
            let mut result = None;
            match op.verb.as_str() {
                "set" => wrote |= work.set(key, op.value.clone(), at),
                "cas" if at_index(&cur).unwrap_or(0) != op.index => {
                    return fail(format!("failed to set key \"{key}\", index is stale"));
                }
                "cas" => wrote |= work.set(key, op.value.clone(), at),
                "lock" => {
                    let sid = op.session.as_str();
                    if !work.sessions.contains_key(sid) {
                        return fail(format!("invalid session \"{sid}\""));
                    }
                    if cur
                        .as_ref()
                        .and_then(|e| e.session.as_deref())
                        .is_some_and(|s| s != sid)
                    {
                        return fail(format!("failed to lock key \"{key}\", lock is already held"));
                    }
                    if work.lock_delayed(key, Instant::now()) {
                        return fail(format!("failed to lock key \"{key}\" due to lock delay"));
                    }
                    wrote |= work.set_as(key, op.value.clone(), at, Some(sid)) | work.take_lock(key, sid, at);
                }
                "get" => match cur {
                    Some(e) => result = Some((e, true)),
                    None => return fail(format!("key \"{key}\" doesn't exist")),
                },
                "check-index" if at_index(&cur) != Some(op.index) => {
                    let now = at_index(&cur).unwrap_or(0);
                    return fail(format!("current modify index {now} != {}", op.index));
                }
                "check-index" => result = cur.map(|e| (e, false)),
                "check-not-exists" if cur.is_some() => return fail(format!("key \"{key}\" exists")),
                "check-not-exists" => {}
                "delete" => wrote |= work.delete_key(key, at),
                "delete-cas" if at_index(&cur) != Some(op.index) => {
                    return fail(format!("failed to delete key \"{key}\", index is stale"));
                }
                "delete-cas" => wrote |= work.delete_key(key, at),
                "delete-tree" => {
                    for (k, _) in work.read(key, true) {
                        wrote |= work.delete_key(&k, at);
                    }
                }
                other => return fail(format!("unknown KV verb \"{other}\"")),
            }
            if matches!(op.verb.as_str(), "set" | "cas" | "lock") {
                result = work.kv.get(key).cloned().map(|e| (e, false));
            }
            if let Some((entry, value)) = result {
                results.push(TxnResult {
                    key: key.to_string(),
                    entry,
                    value,
                });
            }
        }
        if wrote {
            work.index = at;
        }
        *self = work;
        Ok(results)
    }

    /// `PUT /v1/session/create`: a new session invalidated after twice its TTL
    /// (Consul: up to twice) unless renewed. One bound to the node's check cannot
    /// be created while the check is critical (Consul's words are the error).
    pub(super) fn create_session(&mut self, new: &NewSession, now: Instant) -> Result<String, String> {
        if new.node_check && self.node_failed {
            return Err("Check 'serfHealth' is in critical state".into());
        }
        let NewSession {
            ttl,
            delete,
            node_check,
            lock_delay,
        } = new.clone();
        self.next_session += 1;
        let id = format!(
            "{:08x}-0000-4000-8000-{:012x}",
            std::process::id(),
            self.next_session
        );
        let deadline = now + ttl * 2;
        self.sessions.insert(
            id.clone(),
            Session {
                ttl,
                deadline,
                delete,
                node_check,
                lock_delay,
            },
        );
        self.bump();
        Ok(id)
    }

    /// The test control: the node's `serfHealth` check turns critical (`true`),
    /// which invalidates every session bound to it, or passes again.
    pub(super) fn set_node_failed(&mut self, failed: bool, now: Instant) {
        self.node_failed = failed;
        if failed {
            let bound: Vec<String> = self
                .sessions
                .iter()
                .filter(|(_, s)| s.node_check)
                .map(|(id, _)| id.clone())
                .collect();
            for id in bound {
                self.expire(now, Some(&id));
            }
        }
    }

    /// The test control: the tombstones are reaped, as Consul's tombstone GC does
    /// about 15 minutes after a delete; the index of a prefix whose newest change
    /// was a delete goes back to its newest live entry's.
    pub(super) fn reap_tombstones(&mut self) {
        self.tombstones.clear();
    }

    /// Whether `key` is under a lock-delay at `now`.
    pub(super) fn lock_delayed(&self, key: &str, now: Instant) -> bool {
        self.lock_delays.get(key).is_some_and(|until| *until > now)
    }

    /// `PUT /v1/session/renew/<id>`: its TTL, or `None` when it is unknown.
    pub(super) fn renew(&mut self, id: &str, now: Instant) -> Option<(Duration, bool)> {
        let s = self.sessions.get_mut(id)?;
        s.deadline = now + s.ttl * 2;
        Some((s.ttl, s.delete))
    }

    /// The test control: the index moves backwards, as a snapshot restore does (a
    /// restore also wakes every blocking query: `restores` counts them).
    pub(super) fn reset_index(&mut self, n: u64) {
        self.restores += 1;
        self.index = n;
        for e in self.kv.values_mut() {
            e.modify = e.modify.min(n);
            e.create = e.create.min(n);
        }
        for i in self.tombstones.values_mut() {
            *i = (*i).min(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(verb: &str, key: &str, index: u64) -> TxnOp {
        TxnOp {
            verb: verb.into(),
            key: key.into(),
            value: b"v".to_vec(),
            index,
            ..TxnOp::default()
        }
    }

    #[test]
    fn a_transaction_is_all_or_nothing_at_one_index() {
        let mut st = State::new();
        assert_eq!(st.put("a", b"1".to_vec(), None, None), Ok(true));
        let before = st.index;
        let err = st
            .txn(&[op("set", "b", 0), op("check-not-exists", "a", 0)])
            .unwrap_err();
        assert_eq!(err.0, 1);
        assert_eq!((st.index, st.kv.contains_key("b")), (before, false));
        let got = st.txn(&[op("set", "b", 0), op("delete", "a", 0)]).unwrap();
        assert_eq!(st.index, before + 1);
        assert_eq!(got[0].entry.modify, before + 1);
        assert!(!got[0].value, "a write's result carries no value");
        assert!(!st.kv.contains_key("a") && st.query_index("a", false) == before + 1);
    }

    #[test]
    fn a_same_value_write_is_skipped() {
        let mut st = State::new();
        assert_eq!(st.put("k", b"1".to_vec(), None, None), Ok(true));
        let (index, modify) = (st.index, st.kv["k"].modify);
        assert_eq!(st.put("k", b"1".to_vec(), None, None), Ok(true));
        assert_eq!((st.index, st.kv["k"].modify), (index, modify));
        // In a transaction: the result shows the old index; a get carries the
        // value, a check-index its entry, a delete nothing.
        let got = st
            .txn(&[
                TxnOp {
                    value: b"1".to_vec(),
                    ..op("set", "k", 0)
                },
                op("check-index", "k", modify),
                op("get", "k", 0),
                op("delete", "missing", 0),
            ])
            .unwrap();
        assert_eq!(st.index, index, "nothing changed");
        let shape: Vec<(u64, bool)> = got.iter().map(|r| (r.entry.modify, r.value)).collect();
        assert_eq!(shape, [(modify, false), (modify, false), (modify, true)]);
        assert_eq!(st.put("k", b"2".to_vec(), None, None), Ok(true));
        assert_eq!(st.kv["k"].modify, index + 1);
    }

    #[test]
    fn cas_and_sessions() {
        let mut st = State::new();
        assert_eq!(st.put("k", b"1".to_vec(), Some(0), None), Ok(true));
        assert_eq!(st.put("k", b"2".to_vec(), Some(0), None), Ok(false));
        let now = Instant::now();
        let new = NewSession {
            ttl: Duration::from_secs(10),
            delete: true,
            node_check: false,
            lock_delay: Duration::ZERO,
        };
        let sid = st.create_session(&new, now).unwrap();
        assert_eq!(st.put("lock", vec![], None, Some(&sid)), Ok(true));
        assert_eq!(
            st.put("lock", vec![], None, Some("nobody")),
            Err(InvalidSession("nobody".into()))
        );
        assert_eq!(st.renew(&sid, now), Some((Duration::from_secs(10), true)));
        // Not renewed for twice its TTL: invalidated, its key deleted.
        assert!(st.expire(now + Duration::from_secs(21), None));
        assert!(!st.kv.contains_key("lock") && st.renew(&sid, now).is_none());
    }
}
