//! Faults around the start and the end of a run (paused time, the in-memory store
//! behind a wrapper that injects faults on chosen transactions). Written by an
//! adversarial review of the end-of-run transaction; each test failed before its fix.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use jio_agent::agent::Agent;
use jio_agent::config::{Overrides, SCALAR_KEYS};
use jio_agent::runner::Outcome;
use jio_agent::steps::ScriptedSteps;
use jio_common::clock::TokioClock;
use jio_common::fleet::{HostState, Snapshot, classify};
use jio_common::keys::{EnableLevel, Key, Schema, Step};
use jio_common::names::{HostName, Version};
use jio_common::store::{
    DynStore, KeyValue, Lease, LeaseId, Listing, MemoryStore, Op, Revision, Store, StoreError, Txn,
    TxnOutcome, WatchStream,
};
use tokio::sync::watch;

const START: u64 = 1_800_000_000;
type R<T> = Result<T, StoreError>;

fn v(s: &str) -> Version {
    Version::new(s).unwrap()
}
fn host() -> HostName {
    HostName::new("compute1").unwrap()
}

fn config(dir: &std::path::Path) -> jio_agent::config::Config {
    let empty = dir.join("agent.toml");
    std::fs::write(&empty, "").unwrap();
    if !dir.join("version").exists() {
        std::fs::write(dir.join("version"), "v1\n").unwrap();
    }
    let mut ov = Overrides {
        config_path: Some(empty),
        ..Overrides::default()
    };
    let all = vec![
        ("store".to_string(), "etcd://127.0.0.1:9".to_string()),
        ("hostname".into(), "compute1".into()),
        ("state_dir".into(), dir.join("state").display().to_string()),
        ("version_file".into(), dir.join("version").display().to_string()),
        ("facts_file".into(), dir.join("facts").display().to_string()),
        ("resync_interval".into(), "1h".into()),
        ("retry_interval".into(), "10m".into()),
        ("health_interval".into(), "0".into()),
    ];
    for (k, val) in all {
        let key = SCALAR_KEYS.iter().find(|x| **x == k).copied().unwrap();
        ov.flags.insert(key, val);
    }
    jio_agent::config::load(&ov, || None).unwrap()
}

/// What the wrapper does to a transaction that writes a status entry (a report)
/// or the run marker (a start).
#[derive(Default)]
struct Faults {
    /// Reports fail as an unreachable store does (nothing applied).
    fail_reports: AtomicBool,
    /// Reports never answer (the agent is killed while waiting).
    hang_reports: AtomicBool,
    /// The next start is applied, and the caller told `Ambiguous` (etcd: no answer
    /// in time, a connection broken under the request).
    ambiguous_starts: AtomicU32,
    /// Every call fails (a killed process's leftovers cannot write).
    dead: AtomicBool,
}

#[derive(Clone)]
struct Faulty {
    inner: MemoryStore,
    f: Arc<Faults>,
}

fn unavailable(op: &'static str) -> StoreError {
    StoreError::Unavailable {
        url: "memory://".into(),
        op,
        reason: "injected".into(),
    }
}

impl Faulty {
    fn check(&self, op: &'static str) -> R<()> {
        if self.f.dead.load(Ordering::SeqCst) {
            return Err(unavailable(op));
        }
        Ok(())
    }
}

fn puts_under(txn: &Txn, prefix: &str) -> bool {
    txn.ops
        .iter()
        .any(|op| matches!(op, Op::Put { key, .. } if key.as_str().starts_with(prefix)))
}

#[async_trait]
impl Store for Faulty {
    fn url(&self) -> &str {
        "memory://"
    }
    async fn ping(&self) -> R<Revision> {
        self.check("ping")?;
        self.inner.ping().await
    }
    async fn get(&self, key: &Key) -> R<Option<KeyValue>> {
        self.check("get")?;
        self.inner.get(key).await
    }
    async fn get_many_at(&self, keys: &[Key]) -> R<(Vec<Option<KeyValue>>, Revision)> {
        self.check("get")?;
        self.inner.get_many_at(keys).await
    }
    async fn list(&self, prefix: &Key) -> R<Listing> {
        self.check("list")?;
        self.inner.list(prefix).await
    }
    async fn put(&self, key: &Key, value: &str, lease: Option<&LeaseId>) -> R<Revision> {
        self.check("put")?;
        self.inner.put(key, value, lease).await
    }
    async fn delete(&self, key: &Key) -> R<bool> {
        self.check("delete")?;
        self.inner.delete(key).await
    }
    async fn delete_prefix(&self, prefix: &Key) -> R<u64> {
        self.check("delete_prefix")?;
        self.inner.delete_prefix(prefix).await
    }
    async fn txn(&self, txn: Txn) -> R<TxnOutcome> {
        self.check("txn")?;
        if puts_under(&txn, "/status/") {
            if self.f.hang_reports.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            if self.f.fail_reports.load(Ordering::SeqCst) {
                return Err(unavailable("txn"));
            }
        }
        if puts_under(&txn, "/runs/")
            && self
                .f
                .ambiguous_starts
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            let applied = self.inner.txn(txn).await?;
            assert!(applied.committed(), "the injected start was applied");
            return Err(StoreError::Ambiguous {
                url: "memory://".into(),
                op: "txn",
                reason: "injected: no answer in time".into(),
            });
        }
        self.inner.txn(txn).await
    }
    async fn grant_lease(&self, ttl: Duration) -> R<Lease> {
        self.check("grant_lease")?;
        self.inner.grant_lease(ttl).await
    }
    async fn keep_alive(&self, lease: &LeaseId) -> R<Duration> {
        self.check("keep_alive")?;
        self.inner.keep_alive(lease).await
    }
    async fn revoke_lease(&self, lease: &LeaseId) -> R<()> {
        self.check("revoke_lease")?;
        self.inner.revoke_lease(lease).await
    }
    async fn watch(&self, prefix: &Key, from: Revision) -> R<WatchStream> {
        self.check("watch")?;
        self.inner.watch(prefix, from).await
    }
    async fn compact(&self, revision: Revision) -> R<()> {
        self.inner.compact(revision).await
    }
}

struct Daemon {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

fn start(dir: &std::path::Path, store: &Faulty, steps: Arc<ScriptedSteps>) -> Daemon {
    let (stop, stop_rx) = watch::channel(false);
    let dynstore: DynStore = Arc::new(store.clone());
    let agent = Agent::new(config(dir), dynstore, stop_rx)
        .unwrap()
        .with_steps(steps)
        .with_clock(Arc::new(TokioClock::starting_at(START)));
    let task = tokio::spawn(async move {
        let _ = jio_agent::daemon::serve(agent).await;
    });
    Daemon { stop, task }
}

async fn setup(m: &MemoryStore) {
    let s = Schema::default();
    m.put(&s.current_version(), "v1", None).await.unwrap();
    m.put(
        &s.host(&host()),
        r#"{"role":"compute","agent_version":"0.1.0","addresses":[],"first_seen":1}"#,
        None,
    )
    .await
    .unwrap();
}

async fn state_of(m: &MemoryStore) -> (HostState, Option<String>) {
    let store: DynStore = Arc::new(m.clone());
    let snap = Snapshot::read(&store, &Schema::default()).await.unwrap();
    let h = classify(&snap).into_iter().find(|h| h.host == host()).unwrap();
    (h.state, h.reason)
}

async fn get(m: &MemoryStore, k: Key) -> Option<String> {
    m.get(&k).await.unwrap().map(|kv| kv.value)
}

/// The run's last report (a failure) cannot land, and a pause disables the fleet
/// meanwhile: the run marker stays until the report is in the store, so the host
/// holds its slot throughout (a driver must not admit another host in its place
/// before the failure stops the rollout). Once the report lands the host is
/// `failed`. (Before the fix the next pass deleted the marker first: `pending`.)
#[tokio::test(start_paused = true)]
async fn a_runs_marker_stays_until_its_report_lands() {
    let dir = tempfile::tempdir().unwrap();
    let m = MemoryStore::new();
    setup(&m).await;
    let store = Faulty {
        inner: m.clone(),
        f: Arc::default(),
    };
    let steps = Arc::new(
        ScriptedSteps::new()
            .taking(Duration::from_secs(20), Duration::from_secs(5))
            .validate_outcomes([Outcome::Failure("validation failed".into())]),
    );
    let d = start(dir.path(), &store, steps.clone());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let s = Schema::default();
    m.put(&s.enable(&EnableLevel::Global), "true", None)
        .await
        .unwrap();
    m.put(&s.current_version(), "v2", None).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(steps.calls().len(), 1, "the run started");
    assert!(get(&m, s.run(&host())).await.is_some(), "run marker written");
    // A pause disables the fleet; the run goes on. The store will not take
    // the run's report for a while.
    m.put(&s.enable(&EnableLevel::Global), "false", None)
        .await
        .unwrap();
    store.f.fail_reports.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(steps.calls().len(), 2, "configure and validate ran");
    let failure = s.status(
        Step::Validated,
        jio_common::keys::Outcome::Failure,
        &v("v2"),
        &host(),
    );
    assert!(
        get(&m, failure.clone()).await.is_none(),
        "the report did not land"
    );
    let marker = get(&m, s.run(&host())).await;
    let record = get(&m, s.agent(&host())).await;
    let (state, reason) = state_of(&m).await;
    store.f.fail_reports.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(get(&m, failure).await.is_some(), "the report landed at last");
    let (after, _) = state_of(&m).await;
    d.stop.send(true).unwrap();
    let _ = d.task.await;
    eprintln!(
        "while the report was pending: marker {marker:?}, record {record:?}, state {state:?} ({reason:?}); after: {after:?}"
    );
    assert_eq!(after, HostState::Failed);
    assert!(
        state.in_flight(),
        "while its failure report was pending the host held no slot: marker {marker:?}, record {record:?}, classified {state:?} ({reason:?})"
    );
}

/// The start's transaction is applied but the agent is told `Ambiguous`; a pause
/// disables the fleet before its next pass. Nothing runs, and the agent removes the
/// run marker and rewrites its `upgrading` record: the host does not count as in
/// flight for good. (Before the fix both stayed until the agent restarted.)
#[tokio::test(start_paused = true)]
async fn an_ambiguous_start_does_not_leave_the_host_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let m = MemoryStore::new();
    setup(&m).await;
    let store = Faulty {
        inner: m.clone(),
        f: Arc::default(),
    };
    store.f.ambiguous_starts.store(1, Ordering::SeqCst);
    let steps = Arc::new(ScriptedSteps::new());
    let d = start(dir.path(), &store, steps.clone());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let s = Schema::default();
    m.put(&s.enable(&EnableLevel::Global), "true", None)
        .await
        .unwrap();
    m.put(&s.current_version(), "v2", None).await.unwrap();
    // The start is applied, the agent hears Ambiguous and backs off (200 ms);
    // meanwhile a pause disables the fleet.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        store.f.ambiguous_starts.load(Ordering::SeqCst),
        0,
        "the start was tried"
    );
    m.put(&s.enable(&EnableLevel::Global), "false", None)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3 * 3600)).await;
    let marker = get(&m, s.run(&host())).await;
    let record = get(&m, s.agent(&host())).await;
    let (state, reason) = state_of(&m).await;
    d.stop.send(true).unwrap();
    let _ = d.task.await;
    eprintln!("3 h later: marker {marker:?}, record {record:?}, state {state:?} ({reason:?})");
    assert!(steps.calls().is_empty(), "nothing ran");
    assert!(
        marker.is_none() && !record.as_deref().unwrap_or("").contains("upgrading"),
        "3 h later, nothing running, the host still counts as running puppet: marker {marker:?}, record {record:?}, state {state:?} ({reason:?})"
    );
}

/// The agent is killed after its failed run's report is journaled and before it
/// lands. Its successor reports the failure and waits out the retry interval (10
/// min) before running the same version again: the journal closed the run in the
/// save that holds the report. (Before the fix the failure was recorded only once
/// the report had landed, and the successor retried at once.)
#[tokio::test(start_paused = true)]
async fn a_restart_after_a_kill_at_the_report_keeps_the_failures_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let m = MemoryStore::new();
    setup(&m).await;
    let first = Faulty {
        inner: m.clone(),
        f: Arc::default(),
    };
    let steps = Arc::new(
        ScriptedSteps::new()
            .taking(Duration::from_secs(20), Duration::from_secs(5))
            .validate_outcomes([Outcome::Failure("validation failed".into())]),
    );
    let d = start(dir.path(), &first, steps.clone());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let s = Schema::default();
    m.put(&s.enable(&EnableLevel::Global), "true", None)
        .await
        .unwrap();
    first.f.hang_reports.store(true, Ordering::SeqCst);
    m.put(&s.current_version(), "v2", None).await.unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(steps.calls().len(), 2, "configure and validate ran");
    // Killed while its report is on the wire.
    d.task.abort();
    let _ = d.task.await;
    first.f.dead.store(true, Ordering::SeqCst);
    drop(d.stop);
    let second = Faulty {
        inner: m.clone(),
        f: Arc::default(),
    };
    let d = start(dir.path(), &second, steps.clone());
    tokio::time::sleep(Duration::from_secs(60)).await;
    let result = get(&m, s.result(&host())).await;
    d.stop.send(true).unwrap();
    let _ = d.task.await;
    let configures = steps
        .calls()
        .iter()
        .filter(|(st, _)| *st == Step::Configured)
        .count();
    eprintln!("configure steps: {configures}; result: {result:?}");
    assert_eq!(
        configures, 1,
        "the failed v2 was run again within a minute of the restart (retry interval 10 min); result {result:?}"
    );
}

/// The store goes away just before a lease renewal is due and comes back before the
/// lease's TTL is up: the renewal is made as soon as the store is back, so the
/// liveness record keeps its lease and the agent never looks dead. (Before, the
/// renewal after an outage waited a whole period, past the TTL.)
#[tokio::test(start_paused = true)]
async fn a_renewal_missed_in_an_outage_is_made_as_soon_as_the_store_is_back() {
    let m = MemoryStore::new();
    let s = Schema::default();
    let store: DynStore = Arc::new(m.clone());
    let ttl = Duration::from_secs(15);
    let l = jio_agent::liveness::Liveness::start(
        store,
        s.agent(&host()),
        ttl,
        jio_common::values::AgentState::Idle,
        None,
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let first = m.get(&s.agent(&host())).await.unwrap().unwrap().lease;
    assert!(first.is_some(), "the record is on a lease");
    // Down from 4.5 s to 10.5 s: the renewal due at 7.5 s fails; the lease ends
    // at 15 s unless it is renewed once the store is back.
    tokio::time::sleep(Duration::from_millis(4400)).await;
    m.set_available(false);
    tokio::time::sleep(Duration::from_secs(6)).await;
    m.set_available(true);
    tokio::time::sleep(Duration::from_secs(3 * ttl.as_secs())).await;
    let after = m.get(&s.agent(&host())).await.unwrap().unwrap();
    l.stop().await;
    assert_eq!(
        after.lease, first,
        "the lease ended in a 6 s outage of a 15 s TTL and a new one was granted"
    );
}
