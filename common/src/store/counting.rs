//! A store wrapper that counts requests, for tests and benchmarks that check how
//! many round trips an operation costs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use super::{
    DynStore, KeyValue, Lease, LeaseId, Listing, Result, Revision, Store, Txn, TxnOutcome, WatchStream,
};
use crate::keys::Key;

/// Counts every call to the wrapped store (a watch counts once, when opened).
#[derive(Clone)]
pub struct CountingStore {
    inner: DynStore,
    count: Arc<AtomicU64>,
    keep_alives: Arc<AtomicU64>,
}

impl CountingStore {
    pub fn new(inner: DynStore) -> CountingStore {
        CountingStore {
            inner,
            count: Arc::new(AtomicU64::new(0)),
            keep_alives: Arc::new(AtomicU64::new(0)),
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

    fn tick(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl Store for CountingStore {
    fn url(&self) -> &str {
        self.inner.url()
    }
    async fn ping(&self) -> Result<Revision> {
        self.tick();
        self.inner.ping().await
    }
    async fn get(&self, key: &Key) -> Result<Option<KeyValue>> {
        self.tick();
        self.inner.get(key).await
    }
    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<KeyValue>>> {
        self.tick();
        self.inner.get_many(keys).await
    }
    async fn list(&self, prefix: &Key) -> Result<Listing> {
        self.tick();
        self.inner.list(prefix).await
    }
    async fn put(&self, key: &Key, value: &str, lease: Option<&LeaseId>) -> Result<Revision> {
        self.tick();
        self.inner.put(key, value, lease).await
    }
    async fn delete(&self, key: &Key) -> Result<bool> {
        self.tick();
        self.inner.delete(key).await
    }
    async fn delete_prefix(&self, prefix: &Key) -> Result<u64> {
        self.tick();
        self.inner.delete_prefix(prefix).await
    }
    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        self.tick();
        self.inner.txn(txn).await
    }
    async fn grant_lease(&self, ttl: Duration) -> Result<Lease> {
        self.tick();
        self.inner.grant_lease(ttl).await
    }
    async fn keep_alive(&self, lease: &LeaseId) -> Result<Duration> {
        self.tick();
        self.keep_alives.fetch_add(1, Ordering::Relaxed);
        self.inner.keep_alive(lease).await
    }
    async fn revoke_lease(&self, lease: &LeaseId) -> Result<()> {
        self.tick();
        self.inner.revoke_lease(lease).await
    }
    async fn watch(&self, prefix: &Key, from: Revision) -> Result<WatchStream> {
        self.tick();
        self.inner.watch(prefix, from).await
    }
    async fn compact(&self, revision: Revision) -> Result<()> {
        self.tick();
        self.inner.compact(revision).await
    }
}
