//! The liveness record `/agents/<host>`, bound to a lease the agent keeps renewing,
//! so `jioctl` can tell a dead agent from a slow Puppet run, and count a host as in
//! flight while its agent runs anything.
//!
//! One task owns the lease: it renews every TTL/2 (a failed renewal is retried after
//! a second, then less often, at random moments), grants a new lease when the old
//! one ended (the store was unreachable for longer than the TTL), and rewrites the
//! record whenever it changes. With a clock key, it writes the agent's clock there
//! (bound to the lease) at every new lease and every `CLOCK_REFRESH`, so readers
//! can tell a skewed clock; no watcher wakes on that key. It logs on change, not
//! on every renewal. A run starts
//! with `commit`, which writes the record in a transaction fenced on what the agent
//! decided on, and ends with the run's last report, in one transaction with it; the
//! task and `commit` take turns on one lock, so a stale rewrite can
//! never land after the record that says a run started.

use std::sync::Arc;
use std::time::Duration;

use jio_common::keys::Key;
use jio_common::names::Version;
use jio_common::store::{Compare, DynStore, ErrorKind, LeaseId, Op, Revision, StoreError, Txn, TxnOutcome};
use jio_common::time::{unix_now, unix_now_ms};
use jio_common::values::{AgentRecord, AgentState, CLOCK_REFRESH};
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The lease, shared by the task and `commit`; holding the lock means writing the
/// record.
type Lease = Arc<Mutex<Option<LeaseId>>>;

/// Handle on the liveness task.
pub struct Liveness {
    record: watch::Sender<AgentRecord>,
    lease: Lease,
    key: Key,
    ttl: Duration,
    task: JoinHandle<()>,
    stop: watch::Sender<bool>,
    store: DynStore,
}

impl Liveness {
    pub fn start(
        store: DynStore,
        key: Key,
        ttl: Duration,
        state: AgentState,
        version: Option<Version>,
    ) -> Liveness {
        Liveness::start_reporting(store, (key, None), ttl, state, version, None)
    }

    /// `start`, telling `metrics` when the store stops (and starts again) taking
    /// the record: the daemon's first sign of a store gone quiet between passes.
    /// `keys`: the record's key, and the clock's (`Schema::clock`) when the agent
    /// publishes its clock.
    pub fn start_reporting(
        store: DynStore,
        keys: (Key, Option<Key>),
        ttl: Duration,
        state: AgentState,
        version: Option<Version>,
        metrics: Option<crate::metrics::Metrics>,
    ) -> Liveness {
        let key = keys.0.clone();
        let (record, rx) = watch::channel(AgentRecord {
            state,
            version,
            since: unix_now(),
            pid: std::process::id(),
            until: None,
        });
        let (stop, stop_rx) = watch::channel(false);
        let lease: Lease = Arc::new(Mutex::new(None));
        let task = tokio::spawn(keep(
            store.clone(),
            keys,
            ttl,
            lease.clone(),
            rx,
            stop_rx,
            metrics,
        ));
        Liveness {
            record,
            lease,
            key,
            ttl,
            task,
            stop,
            store,
        }
    }

    /// The record as this agent means it now: its state and version.
    pub fn current(&self) -> (AgentState, Option<Version>) {
        let r = self.record.borrow();
        (r.state, r.version.clone())
    }

    /// Updates the record (written at once when it changed).
    pub fn set(&self, state: AgentState, version: Option<Version>) {
        self.record.send_if_modified(|r| {
            if r.state == state && r.version == version {
                return false;
            }
            *r = AgentRecord {
                state,
                version,
                since: unix_now(),
                pid: r.pid,
                until: None,
            };
            true
        });
    }

    /// Writes the record in one transaction with `compares` and `also`: the record
    /// that says a run starts, fenced on what the decision read, with the run marker;
    /// or the one that says it ended, with the run's report. `Ok(None)`: a compare
    /// failed and nothing was written (the run must not start). An error (the store
    /// is unreachable, no lease can be had): nothing was written either.
    pub async fn commit(
        &self,
        state: AgentState,
        version: Option<Version>,
        compares: Vec<Compare>,
        also: Vec<Op>,
    ) -> Result<Option<Revision>, StoreError> {
        let mut lease = self.lease.lock().await;
        if lease.is_none() {
            *lease = Some(self.store.grant_lease(self.ttl).await?.id);
        }
        let record = AgentRecord {
            state,
            version,
            since: unix_now(),
            pid: std::process::id(),
            until: None,
        };
        let mut ops = vec![Op::Put {
            key: self.key.clone(),
            value: serde_json::to_string(&record).unwrap_or_default(),
            lease: lease.clone(),
        }];
        ops.extend(also);
        let txn = Txn { compares, ops };
        match self.store.txn(txn).await {
            Ok(TxnOutcome::Committed(rev)) => {
                // Written: the task has nothing to rewrite (it writes the record as it
                // is then whenever it must, under the same lock).
                self.record.send_if_modified(|r| {
                    *r = record;
                    false
                });
                Ok(Some(rev))
            }
            Ok(TxnOutcome::Lost(_)) => Ok(None),
            Err(e) => {
                if e.kind() == ErrorKind::NotFound {
                    *lease = None;
                }
                if matches!(e, StoreError::Ambiguous { .. }) {
                    // The store may hold `record` or the one before: the keeper
                    // rewrites the one this agent means (a run that starts after all
                    // commits again).
                    self.record.send_modify(|_| {});
                }
                Err(e)
            }
        }
    }

    /// Stops renewing and revokes the lease, which deletes the record.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        if let Some(lease) = self.lease.lock().await.take() {
            let _ = self.store.revoke_lease(&lease).await;
        }
    }
}

/// Applies `txn` (puts without compares). A store that refuses one of the writes
/// without an error (Consul: the key still held by a previous agent's session)
/// answers `Lost`: each is then written alone, so that the refusal is an error and
/// is retried, never taken for a write.
async fn write_all(store: &DynStore, txn: Txn) -> Result<(), StoreError> {
    if let TxnOutcome::Committed(_) = store.txn(txn.clone()).await? {
        return Ok(());
    }
    for op in txn.ops {
        if let Op::Put { key, value, lease } = op {
            store.put(&key, &value, lease.as_ref()).await?;
        }
    }
    Ok(())
}

async fn keep(
    store: DynStore,
    (key, clock_key): (Key, Option<Key>),
    ttl: Duration,
    shared: Lease,
    mut record: watch::Receiver<AgentRecord>,
    mut stop: watch::Receiver<bool>,
    metrics: Option<crate::metrics::Metrics>,
) {
    let mut k = Keeper::new(store, key, clock_key, ttl, shared, metrics);
    loop {
        let step = k.write_due(&mut record).await;
        k.note(step);
        let wake = k.wake_at();
        let woke = tokio::select! {
            _ = tokio::time::sleep_until(wake) => Woke::Due,
            changed = record.changed() => Woke::Record(changed.is_ok()),
            _ = stop.changed() => Woke::Stop,
        };
        match woke {
            Woke::Due => k.renew_if_due().await,
            Woke::Record(true) => k.dirty = true,
            Woke::Record(false) | Woke::Stop => return,
        }
    }
}

/// What woke the keeper: its time came, the record changed (`false`: its sender
/// is gone), or it is told to stop.
enum Woke {
    Due,
    Record(bool),
    Stop,
}

/// The liveness keeper's state between its steps: what it writes, under which
/// lease, what is due and whether the store is failing.
struct Keeper {
    store: DynStore,
    key: Key,
    clock_key: Option<Key>,
    ttl: Duration,
    shared: Lease,
    metrics: Option<crate::metrics::Metrics>,
    period: Duration,
    retries: jio_common::backoff::Backoff,
    dirty: bool,
    failing: bool,
    renew_at: Instant,
    clock_dirty: bool,
    clock_at: Instant,
    /// The lease the clock was last written under: a lease `commit` granted (the
    /// old one, and the clock with it, gone) gets the clock again.
    clock_lease: Option<LeaseId>,
}

impl Keeper {
    fn new(
        store: DynStore,
        key: Key,
        clock_key: Option<Key>,
        ttl: Duration,
        shared: Lease,
        metrics: Option<crate::metrics::Metrics>,
    ) -> Keeper {
        // Renewed every TTL/2 (the store is asked half as often as at TTL/3, and a dead
        // agent's record still ends at most one TTL after it died). A renewal that
        // failed is retried once a second until one works, and the next is due a
        // period after the last that worked: record changes never put it off.
        let period = ttl / 2;
        let retry = Duration::from_secs(1).min(period);
        // Failed writes are retried after 1 s, doubling up to a quarter of the TTL,
        // spread at random: a fleet whose store is overloaded must not retry in step.
        let retries = jio_common::backoff::Backoff::new(retry, (period / 2).max(retry));
        Keeper {
            store,
            key,
            clock_key,
            ttl,
            shared,
            metrics,
            period,
            retries,
            dirty: true,
            failing: false,
            renew_at: Instant::now() + period,
            clock_dirty: true,
            clock_at: Instant::now(),
            clock_lease: None,
        }
    }

    /// Writes what is due (the record when it changed, the clock when due), under
    /// the shared lease (granted first when there is none).
    async fn write_due(&mut self, record: &mut watch::Receiver<AgentRecord>) -> Result<(), StoreError> {
        let mut lease = self.shared.lock().await;
        if lease.is_none() {
            *lease = Some(self.store.grant_lease(self.ttl).await?.id);
            self.renew_at = Instant::now() + self.period;
            self.dirty = true;
            self.clock_dirty = true;
        }
        if self.clock_lease.as_ref() != lease.as_ref() {
            self.clock_dirty = true;
        }
        let clock_due =
            self.clock_key.is_some() && (self.clock_dirty || self.clock_at.elapsed() >= CLOCK_REFRESH);
        // The record and the clock in one write when both are due (a new
        // lease): one proposal per agent to etcd's members, not two.
        let mut txn = Txn::new();
        if self.dirty {
            let value = serde_json::to_string(&*record.borrow_and_update()).unwrap_or_default();
            txn = txn.then(Op::Put {
                key: self.key.clone(),
                value,
                lease: lease.clone(),
            });
        }
        if let (true, Some(ck)) = (clock_due, &self.clock_key) {
            txn = txn.then(Op::Put {
                key: ck.clone(),
                value: unix_now_ms().to_string(),
                lease: lease.clone(),
            });
        }
        if txn.ops.is_empty() {
            return Ok(());
        }
        if let Err(e) = write_all(&self.store, txn).await {
            if e.kind() == ErrorKind::NotFound {
                *lease = None;
            }
            return Err(e);
        }
        self.dirty = false;
        if clock_due {
            self.clock_dirty = false;
            self.clock_at = Instant::now();
            self.clock_lease = lease.clone();
        }
        Ok(())
    }

    /// Says (once) when the writes begin to fail and when they work again.
    fn note(&mut self, step: Result<(), StoreError>) {
        match step {
            Ok(()) if self.failing => {
                tracing::info!(key = %self.key, "liveness record restored");
                self.failing = false;
                if let Some(m) = &self.metrics {
                    m.store_answered();
                }
            }
            Ok(()) => {}
            Err(e) => {
                if !self.failing {
                    tracing::warn!(key = %self.key, error = %e, "cannot write the liveness record; retrying");
                    self.failing = true;
                    if let Some(m) = &self.metrics {
                        m.store_failed();
                    }
                }
            }
        }
    }

    /// When the next step is due: a retry while failing, else the next renewal
    /// (or clock refresh).
    fn wake_at(&mut self) -> Instant {
        if self.failing {
            Instant::now() + self.retries.fail_spread()
        } else {
            self.retries.succeed();
            match &self.clock_key {
                Some(_) => self.renew_at.min(self.clock_at + CLOCK_REFRESH),
                None => self.renew_at,
            }
        }
    }

    /// Renews the lease when its renewal is due and the store is not failing; a
    /// lease that ended is dropped (the next step grants a new one).
    async fn renew_if_due(&mut self) {
        let current = self.shared.lock().await.clone();
        if let Some(l) = current
            && !self.failing
            && Instant::now() >= self.renew_at
        {
            match self.store.keep_alive(&l).await {
                Ok(_) => self.renew_at = Instant::now() + self.period,
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    tracing::warn!(key = %self.key, "liveness lease ended; granting a new one");
                    let mut lease = self.shared.lock().await;
                    if lease.as_ref() == Some(&l) {
                        *lease = None;
                    }
                }
                Err(e) => {
                    tracing::warn!(key = %self.key, error = %e, "cannot renew the liveness lease; retrying");
                    self.failing = true;
                    if let Some(m) = &self.metrics {
                        m.store_failed();
                    }
                    // Only a write that succeeds says the record is back: the
                    // next step rewrites it (and meets the same refusal, said
                    // once, while it lasts). The renewal is then tried at once.
                    self.dirty = true;
                    self.renew_at = Instant::now();
                }
            }
        }
    }
}
