//! A store wrapper that counts requests, for tests and benchmarks that check how
//! many round trips an operation costs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use super::api::{
    DynStore, KeyValue, Lease, LeaseId, Listing, Result, Revision, Seen, Store, Txn, TxnOutcome, WatchStream,
};
use crate::keys::Key;

const N_OPS: usize = 14;

/// The operations counted, in the order of `CountingStore::by_op`.
pub const OPS: [&str; N_OPS] = [
    "ping",
    "get",
    "get_many",
    "list",
    "count",
    "put",
    "delete",
    "delete_prefix",
    "txn",
    "grant_lease",
    "keep_alive",
    "revoke_lease",
    "watch",
    "compact",
];

/// Counts every call to the wrapped store (a watch counts once, when opened), in
/// all and by operation.
#[derive(Clone)]
pub struct CountingStore {
    inner: DynStore,
    count: Arc<AtomicU64>,
    keep_alives: Arc<AtomicU64>,
    per_op: Arc<[AtomicU64; N_OPS]>,
}

impl CountingStore {
    pub fn new(inner: DynStore) -> CountingStore {
        CountingStore {
            inner,
            count: Arc::new(AtomicU64::new(0)),
            keep_alives: Arc::new(AtomicU64::new(0)),
            per_op: Arc::new(std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }

    /// Another client (`inner`) counted with this one: the counts are shared.
    pub fn sharing(&self, inner: DynStore) -> CountingStore {
        CountingStore {
            inner,
            ..self.clone()
        }
    }

    /// Requests so far.
    pub fn requests(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Lease renewals so far (also counted in `requests`).
    pub fn keep_alives(&self) -> u64 {
        self.keep_alives.load(Ordering::Relaxed)
    }

    /// Requests so far by operation, in the order of `OPS`.
    pub fn by_op(&self) -> [u64; N_OPS] {
        std::array::from_fn(|i| self.per_op[i].load(Ordering::Relaxed))
    }

    fn tick(&self, op: &str) {
        self.count.fetch_add(1, Ordering::Relaxed);
        if let Some(i) = OPS.iter().position(|o| *o == op) {
            self.per_op[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[async_trait]
impl Store for CountingStore {
    fn url(&self) -> &str {
        self.inner.url()
    }
    fn max_txn_ops(&self) -> usize {
        self.inner.max_txn_ops()
    }
    fn absent_compare_needs_write(&self) -> bool {
        self.inner.absent_compare_needs_write()
    }
    async fn ping(&self) -> Result<Revision> {
        self.tick("ping");
        self.inner.ping().await
    }
    async fn get(&self, key: &Key) -> Result<Option<KeyValue>> {
        self.tick("get");
        self.inner.get(key).await
    }
    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<KeyValue>>> {
        self.tick("get_many");
        self.inner.get_many(keys).await
    }
    async fn get_many_at(&self, keys: &[Key]) -> Result<(Vec<Option<KeyValue>>, Revision)> {
        self.tick("get_many");
        self.inner.get_many_at(keys).await
    }
    async fn list(&self, prefix: &Key) -> Result<Listing> {
        self.tick("list");
        self.inner.list(prefix).await
    }
    async fn changed_since(&self, prefix: &Key, seen: &Seen) -> Result<bool> {
        if self.inner.counts_changes() {
            self.tick("count");
        }
        self.inner.changed_since(prefix, seen).await
    }
    fn counts_changes(&self) -> bool {
        self.inner.counts_changes()
    }
    async fn put(&self, key: &Key, value: &str, lease: Option<&LeaseId>) -> Result<Revision> {
        self.tick("put");
        self.inner.put(key, value, lease).await
    }
    async fn delete(&self, key: &Key) -> Result<bool> {
        self.tick("delete");
        self.inner.delete(key).await
    }
    async fn delete_prefix(&self, prefix: &Key) -> Result<u64> {
        self.tick("delete_prefix");
        self.inner.delete_prefix(prefix).await
    }
    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        self.tick("txn");
        self.inner.txn(txn).await
    }
    async fn grant_lease(&self, ttl: Duration) -> Result<Lease> {
        self.tick("grant_lease");
        self.inner.grant_lease(ttl).await
    }
    async fn keep_alive(&self, lease: &LeaseId) -> Result<Duration> {
        self.tick("keep_alive");
        self.keep_alives.fetch_add(1, Ordering::Relaxed);
        self.inner.keep_alive(lease).await
    }
    async fn revoke_lease(&self, lease: &LeaseId) -> Result<()> {
        self.tick("revoke_lease");
        self.inner.revoke_lease(lease).await
    }
    async fn watch(&self, prefix: &Key, from: Revision) -> Result<WatchStream> {
        self.tick("watch");
        self.inner.watch(prefix, from).await
    }
    async fn watch_many(&self, prefixes: &[Key], from: Revision) -> Result<WatchStream> {
        self.tick("watch");
        self.inner.watch_many(prefixes, from).await
    }
    async fn compact(&self, revision: Revision) -> Result<()> {
        self.tick("compact");
        self.inner.compact(revision).await
    }
}
