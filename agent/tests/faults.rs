//! Faults around the start and the end of a run (paused time, the in-memory store
//! behind `Faulty`, which fails, hangs or answers `Ambiguous` to chosen
//! transactions, and kills an agent as SIGKILL does). Written by two adversarial
//! reviews of the end-of-run transaction; the first four tests each failed before
//! their fix.

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
        // Never the default under /etc: a test writes only its own directory.
        ("hiera_file".into(), dir.join("hiera.yaml").display().to_string()),
        ("resync_interval".into(), "1h".into()),
        ("retry_interval".into(), "10m".into()),
        // Never the test machine's own reboot.
        ("reboot".into(), "never".into()),
        // Nor its apt files or its packages.
        (
            "apt_sources_file".into(),
            dir.join("snapshot.list").display().to_string(),
        ),
        (
            "apt_preferences_file".into(),
            dir.join("snapshot.pref").display().to_string(),
        ),
        ("dpkg_status_file".into(), String::new()),
        ("health_interval".into(), "0".into()),
    ];
    for (k, val) in all {
        let key = SCALAR_KEYS.iter().find(|x| **x == k).copied().unwrap();
        ov.flags.insert(key, val);
    }
    jio_agent::config::load(&ov, || None).unwrap()
}

#[derive(Default)]
struct Faults {
    fail_reports: AtomicBool,
    hang_reports: AtomicBool,
    ambiguous_starts: AtomicU32,
    /// End-of-run txns (a status put with the marker's delete): applied, then
    /// answered `Ambiguous`.
    ambiguous_ends: AtomicU32,
    /// End-of-run txns answered `Ambiguous` without being applied.
    ambiguous_ends_lost: AtomicU32,
    /// Plain deletes of the run marker fail (store unreachable).
    fail_marker_deletes: AtomicBool,
    dead: AtomicBool,
    /// Transactions that put a status entry and were applied.
    status_writes: AtomicU32,
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
fn ambiguous() -> StoreError {
    StoreError::Ambiguous {
        url: "memory://".into(),
        op: "txn",
        reason: "injected: no answer in time".into(),
    }
}

impl Faulty {
    fn new(m: &MemoryStore) -> Faulty {
        Faulty {
            inner: m.clone(),
            f: Arc::default(),
        }
    }
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
fn deletes_under(txn: &Txn, prefix: &str) -> bool {
    txn.ops
        .iter()
        .any(|op| matches!(op, Op::Delete(key) if key.as_str().starts_with(prefix)))
}
fn take(n: &AtomicU32) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
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
        if key.as_str().starts_with("/runs/") && self.f.fail_marker_deletes.load(Ordering::SeqCst) {
            return Err(unavailable("delete"));
        }
        self.inner.delete(key).await
    }
    async fn delete_prefix(&self, prefix: &Key) -> R<u64> {
        self.check("delete_prefix")?;
        self.inner.delete_prefix(prefix).await
    }
    async fn txn(&self, txn: Txn) -> R<TxnOutcome> {
        self.check("txn")?;
        let report = puts_under(&txn, "/status/");
        if report {
            if self.f.hang_reports.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            if self.f.fail_reports.load(Ordering::SeqCst) {
                return Err(unavailable("txn"));
            }
        }
        if report && deletes_under(&txn, "/runs/") {
            if take(&self.f.ambiguous_ends_lost) {
                return Err(ambiguous());
            }
            if take(&self.f.ambiguous_ends) {
                let applied = self.inner.txn(txn).await?;
                assert!(applied.committed());
                self.f.status_writes.fetch_add(1, Ordering::SeqCst);
                return Err(ambiguous());
            }
        }
        if puts_under(&txn, "/runs/") && take(&self.f.ambiguous_starts) {
            let applied = self.inner.txn(txn).await?;
            assert!(applied.committed(), "the injected start was applied");
            return Err(ambiguous());
        }
        let out = self.inner.txn(txn).await?;
        if report && out.committed() {
            self.f.status_writes.fetch_add(1, Ordering::SeqCst);
        }
        Ok(out)
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

thread_local! {
    /// One Unix clock per test (each paused test runs on its own thread), so that a
    /// restarted agent's time goes on from its predecessor's.
    static CLOCK: std::cell::Cell<Option<TokioClock>> = const { std::cell::Cell::new(None) };
}

fn clock() -> TokioClock {
    CLOCK.with(|c| {
        let clock = c.get().unwrap_or_else(|| TokioClock::starting_at(START));
        c.set(Some(clock));
        clock
    })
}

fn start(dir: &std::path::Path, store: &Faulty, steps: Arc<ScriptedSteps>) -> Daemon {
    let (stop, stop_rx) = watch::channel(false);
    let dynstore: DynStore = Arc::new(store.clone());
    let agent = Agent::new(config(dir), dynstore, stop_rx)
        .unwrap()
        .with_steps(steps)
        .with_clock(Arc::new(clock()));
    let task = tokio::spawn(async move {
        let _ = jio_agent::daemon::serve(agent).await;
    });
    Daemon { stop, task }
}

/// Stops the daemon as SIGTERM does.
async fn stop(d: Daemon) {
    d.stop.send(true).unwrap();
    let _ = d.task.await;
}

/// Kills the daemon (SIGKILL): nothing it left behind writes again.
async fn kill(d: Daemon, store: &Faulty) {
    d.task.abort();
    let _ = d.task.await;
    store.f.dead.store(true, Ordering::SeqCst);
    drop(d.stop);
}

async fn setup(m: &MemoryStore) {
    clock();
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

/// A state directory, the store (v1 desired, compute1 registered) and a fault
/// wrapper over it.
async fn scene() -> (tempfile::TempDir, MemoryStore, Faulty) {
    let dir = tempfile::tempdir().unwrap();
    let m = MemoryStore::new();
    setup(&m).await;
    let store = Faulty::new(&m);
    (dir, m, store)
}

/// Enables the fleet and moves it to v2.
async fn go_v2(m: &MemoryStore) {
    let s = Schema::default();
    m.put(&s.enable(&EnableLevel::Global), "true", None)
        .await
        .unwrap();
    m.put(&s.current_version(), "v2", None).await.unwrap();
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

/// (ok, attempt) of `/results/<host>`.
async fn result(m: &MemoryStore) -> Option<(bool, u64)> {
    let raw = get(m, Schema::default().result(&host())).await?;
    let j: serde_json::Value = serde_json::from_str(&raw).unwrap();
    Some((j["ok"].as_bool().unwrap(), j["attempt"].as_u64().unwrap_or(1)))
}

fn journal(dir: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("state/journal.json")).unwrap()).unwrap()
}

fn configures(steps: &ScriptedSteps) -> usize {
    steps
        .calls()
        .iter()
        .filter(|(st, _)| *st == Step::Configured)
        .count()
}

fn failing_validation() -> ScriptedSteps {
    ScriptedSteps::new()
        .taking(Duration::from_secs(20), Duration::from_secs(5))
        .validate_outcomes([Outcome::Failure("validation failed".into())])
}

async fn sleep(s: u64) {
    tokio::time::sleep(Duration::from_secs(s)).await;
}

/// The run's last report (a failure) cannot land, and a pause disables the fleet
/// meanwhile: the run marker stays until the report is in the store, so the host
/// holds its slot throughout (a driver must not admit another host in its place
/// before the failure stops the rollout). Once the report lands the host is
/// `failed`. (Before the fix the next pass deleted the marker first: `pending`.)
#[tokio::test(start_paused = true)]
async fn a_runs_marker_stays_until_its_report_lands() {
    let (dir, m, store) = scene().await;
    let steps = Arc::new(failing_validation());
    let d = start(dir.path(), &store, steps.clone());
    sleep(5).await;
    go_v2(&m).await;
    sleep(5).await;
    let s = Schema::default();
    assert_eq!(steps.calls().len(), 1, "the run started");
    assert!(get(&m, s.run(&host())).await.is_some(), "run marker written");
    // A pause disables the fleet; the run goes on. The store will not take
    // the run's report for a while.
    m.put(&s.enable(&EnableLevel::Global), "false", None)
        .await
        .unwrap();
    store.f.fail_reports.store(true, Ordering::SeqCst);
    sleep(30).await;
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
    sleep(60).await;
    assert!(get(&m, failure).await.is_some(), "the report landed at last");
    let (after, _) = state_of(&m).await;
    stop(d).await;
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
    let (dir, m, store) = scene().await;
    store.f.ambiguous_starts.store(1, Ordering::SeqCst);
    let steps = Arc::new(ScriptedSteps::new());
    let d = start(dir.path(), &store, steps.clone());
    sleep(5).await;
    go_v2(&m).await;
    // The start is applied, the agent hears Ambiguous and backs off (200 ms);
    // meanwhile a pause disables the fleet.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        store.f.ambiguous_starts.load(Ordering::SeqCst),
        0,
        "the start was tried"
    );
    let s = Schema::default();
    m.put(&s.enable(&EnableLevel::Global), "false", None)
        .await
        .unwrap();
    sleep(3 * 3600).await;
    let marker = get(&m, s.run(&host())).await;
    let record = get(&m, s.agent(&host())).await;
    let (state, reason) = state_of(&m).await;
    stop(d).await;
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
    let (dir, m, first) = scene().await;
    let steps = Arc::new(failing_validation());
    let d = start(dir.path(), &first, steps.clone());
    sleep(5).await;
    first.f.hang_reports.store(true, Ordering::SeqCst);
    go_v2(&m).await;
    sleep(30).await;
    assert_eq!(steps.calls().len(), 2, "configure and validate ran");
    // Killed while its report is on the wire.
    kill(d, &first).await;
    let second = Faulty::new(&m);
    let d = start(dir.path(), &second, steps.clone());
    sleep(60).await;
    let result = result(&m).await;
    stop(d).await;
    assert_eq!(
        configures(&steps),
        1,
        "the failed v2 was run again within a minute of the restart (retry interval 10 min); result {result:?}"
    );
    assert_eq!(result, Some((false, 1)), "the successor reported the failure");
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

/// The end-of-run transaction of a failed run is applied and answered `Ambiguous`.
/// The host ends `failed`: the marker is gone, the record says `failed` (not
/// `upgrading`), the report is pending no more, the failure is counted once (the
/// retry after 10 min is attempt 2).
#[tokio::test(start_paused = true)]
async fn an_ambiguous_end_of_a_failed_run() {
    let (dir, m, store) = scene().await;
    store.f.ambiguous_ends.store(1, Ordering::SeqCst);
    let steps = Arc::new(failing_validation());
    let d = start(dir.path(), &store, steps.clone());
    sleep(5).await;
    go_v2(&m).await;
    sleep(60).await;
    let s = Schema::default();
    let marker = get(&m, s.run(&host())).await;
    let record = get(&m, s.agent(&host())).await;
    let (state, reason) = state_of(&m).await;
    let writes = store.f.status_writes.load(Ordering::SeqCst);
    let j = journal(dir.path());
    let first = result(&m).await;
    sleep(11 * 60).await;
    let second = result(&m).await;
    let runs = configures(&steps);
    stop(d).await;
    eprintln!(
        "after 1 min: marker {marker:?}, record {record:?}, state {state:?} ({reason:?}), status writes {writes}, \
         unreported {}, failure {}, result {first:?}; after 12 min: runs {runs}, result {second:?}",
        j["unreported"], j["failure"]
    );
    assert_eq!(store.f.ambiguous_ends.load(Ordering::SeqCst), 0, "fault hit");
    assert!(marker.is_none(), "marker left: {marker:?}");
    assert!(record.as_deref().unwrap().contains("\"failed\""), "{record:?}");
    assert_eq!(state, HostState::Failed);
    assert_eq!(j["unreported"].as_array().unwrap().len(), 0);
    assert_eq!(j["failure"]["attempts"], 1);
    assert_eq!(first, Some((false, 1)));
    assert_eq!(runs, 2);
    assert_eq!(second, Some((true, 2)));
}

/// The same, for a successful run: the host ends `upgraded`, idle, marker gone,
/// ran once.
#[tokio::test(start_paused = true)]
async fn an_ambiguous_end_of_a_successful_run() {
    let (dir, m, store) = scene().await;
    store.f.ambiguous_ends.store(1, Ordering::SeqCst);
    let steps = Arc::new(ScriptedSteps::new().taking(Duration::from_secs(20), Duration::from_secs(5)));
    let d = start(dir.path(), &store, steps.clone());
    sleep(5).await;
    go_v2(&m).await;
    sleep(120).await;
    let s = Schema::default();
    let marker = get(&m, s.run(&host())).await;
    let record = get(&m, s.agent(&host())).await;
    let (state, reason) = state_of(&m).await;
    let running = get(&m, s.running_version_host(&v("v2"), &host())).await;
    let writes = store.f.status_writes.load(Ordering::SeqCst);
    let runs = configures(&steps);
    let r = result(&m).await;
    stop(d).await;
    eprintln!(
        "marker {marker:?}, record {record:?}, state {state:?} ({reason:?}), running {running:?}, status writes {writes}, runs {runs}, result {r:?}"
    );
    assert!(marker.is_none());
    assert!(record.as_deref().unwrap().contains("\"idle\""), "{record:?}");
    assert_eq!(state, HostState::Upgraded);
    assert!(running.is_some());
    assert_eq!(runs, 1);
    assert_eq!(r, Some((true, 1)));
}

/// The end-of-run transaction is answered `Ambiguous` and was NOT applied: the
/// marker stays while the report is pending, then both settle.
#[tokio::test(start_paused = true)]
async fn an_ambiguous_unapplied_end_of_a_failed_run() {
    let (dir, m, store) = scene().await;
    store.f.ambiguous_ends_lost.store(1, Ordering::SeqCst);
    let steps = Arc::new(failing_validation());
    let d = start(dir.path(), &store, steps.clone());
    sleep(5).await;
    go_v2(&m).await;
    sleep(60).await;
    let s = Schema::default();
    let marker = get(&m, s.run(&host())).await;
    let record = get(&m, s.agent(&host())).await;
    let (state, _) = state_of(&m).await;
    let writes = store.f.status_writes.load(Ordering::SeqCst);
    let r = result(&m).await;
    let runs = configures(&steps);
    stop(d).await;
    eprintln!(
        "marker {marker:?}, record {record:?}, state {state:?}, writes {writes}, result {r:?}, runs {runs}"
    );
    assert_eq!(store.f.ambiguous_ends_lost.load(Ordering::SeqCst), 0, "fault hit");
    assert!(marker.is_none());
    assert!(record.as_deref().unwrap().contains("\"failed\""), "{record:?}");
    assert_eq!(state, HostState::Failed);
    assert_eq!(writes, 1);
    assert_eq!(r, Some((false, 1)));
    assert_eq!(runs, 1);
}

/// An ambiguous (applied) start while the fleet stays enabled: the run starts once
/// (on the next pass), the marker is consistent, the host ends upgraded.
#[tokio::test(start_paused = true)]
async fn an_ambiguous_start_then_still_enabled_runs_once() {
    let (dir, m, store) = scene().await;
    store.f.ambiguous_starts.store(1, Ordering::SeqCst);
    let steps = Arc::new(ScriptedSteps::new().taking(Duration::from_secs(20), Duration::from_secs(5)));
    let d = start(dir.path(), &store, steps.clone());
    sleep(5).await;
    go_v2(&m).await;
    sleep(10).await;
    let s = Schema::default();
    let marker_during = get(&m, s.run(&host())).await;
    let (during, _) = state_of(&m).await;
    sleep(3600).await;
    let marker = get(&m, s.run(&host())).await;
    let record = get(&m, s.agent(&host())).await;
    let (state, reason) = state_of(&m).await;
    let r = result(&m).await;
    stop(d).await;
    eprintln!(
        "during: marker {marker_during:?}, {during:?}; after: marker {marker:?}, record {record:?}, state {state:?} ({reason:?}), calls {:?}, result {r:?}",
        steps.calls()
    );
    assert_eq!(store.f.ambiguous_starts.load(Ordering::SeqCst), 0);
    assert!(marker_during.is_some(), "the run holds its marker");
    assert_eq!(steps.calls().len(), 2, "configure and validate, once");
    assert!(marker.is_none());
    assert!(record.as_deref().unwrap().contains("\"idle\""));
    assert_eq!(state, HostState::Upgraded);
    assert_eq!(r, Some((true, 1)));
}

/// Three failures of v2 with a graceful restart between the second and the third:
/// the results say attempts 1, 2, 3, and each retry waits its backoff (10, 20 min).
#[tokio::test(start_paused = true)]
async fn attempts_count_across_a_restart() {
    let (dir, m, store) = scene().await;
    let fail = || Outcome::Failure("validation failed".into());
    let steps = Arc::new(
        ScriptedSteps::new()
            .taking(Duration::from_secs(20), Duration::from_secs(5))
            .validate_outcomes([fail(), fail(), fail()]),
    );
    let d = start(dir.path(), &store, steps.clone());
    sleep(5).await;
    go_v2(&m).await;
    sleep(60).await;
    let r1 = (configures(&steps), result(&m).await);
    sleep(11 * 60).await;
    let r2 = (configures(&steps), result(&m).await);
    stop(d).await;
    let d = start(dir.path(), &store, steps.clone());
    sleep(15 * 60).await;
    let early = configures(&steps);
    sleep(10 * 60).await;
    let r3 = (configures(&steps), result(&m).await);
    stop(d).await;
    eprintln!("r1 {r1:?} r2 {r2:?} runs 15 min after restart {early} r3 {r3:?}");
    assert_eq!(r1, (1, Some((false, 1))));
    assert_eq!(r2, (2, Some((false, 2))));
    assert_eq!(early, 2, "the 2nd failure's 20 min backoff survived the restart");
    assert_eq!(r3, (3, Some((false, 3))));
}

/// The same with a kill while the 2nd failure's report is on the wire: the
/// successor reports attempt 2, waits its 20 min, and the next run is attempt 3.
#[tokio::test(start_paused = true)]
async fn attempts_count_across_a_kill_at_the_report() {
    let (dir, m, first) = scene().await;
    let fail = || Outcome::Failure("validation failed".into());
    let steps = Arc::new(
        ScriptedSteps::new()
            .taking(Duration::from_secs(20), Duration::from_secs(5))
            .validate_outcomes([fail(), fail(), fail()]),
    );
    let d = start(dir.path(), &first, steps.clone());
    sleep(5).await;
    go_v2(&m).await;
    sleep(60).await;
    let r1 = result(&m).await;
    first.f.hang_reports.store(true, Ordering::SeqCst);
    sleep(11 * 60).await;
    assert_eq!(configures(&steps), 2);
    kill(d, &first).await;
    let second = Faulty::new(&m);
    let d = start(dir.path(), &second, steps.clone());
    sleep(60).await;
    let r2 = result(&m).await;
    sleep(14 * 60).await;
    let early = configures(&steps);
    sleep(10 * 60).await;
    let r3 = (configures(&steps), result(&m).await);
    stop(d).await;
    eprintln!("r1 {r1:?} r2 {r2:?} runs 15 min after restart {early} r3 {r3:?}");
    assert_eq!(r1, Some((false, 1)));
    assert_eq!(r2, Some((false, 2)));
    assert_eq!(early, 2);
    assert_eq!(r3, (3, Some((false, 3))));
}

/// Killed while a failure's report is on the wire; before the successor starts,
/// the operator writes the enable key. That write came before the failure was in
/// the store, so it is not a "retry now" for it (`jioctl status` shows the host
/// failed, not retrying): the successor reports the failure and backs off. An
/// enable write after the report retries at once, as attempt 2.
#[tokio::test(start_paused = true)]
async fn an_enable_write_before_the_failure_is_reported_does_not_retry_it() {
    let (dir, m, first) = scene().await;
    let steps = Arc::new(failing_validation());
    let d = start(dir.path(), &first, steps.clone());
    sleep(5).await;
    go_v2(&m).await;
    first.f.hang_reports.store(true, Ordering::SeqCst);
    sleep(30).await;
    assert_eq!(steps.calls().len(), 2);
    kill(d, &first).await;
    let s = Schema::default();
    m.put(&s.enable(&EnableLevel::Global), "true", None)
        .await
        .unwrap();
    let second = Faulty::new(&m);
    let d = start(dir.path(), &second, steps.clone());
    sleep(60).await;
    let (state, why) = state_of(&m).await;
    assert_eq!(configures(&steps), 1, "no retry at once: {state:?} ({why:?})");
    assert_eq!(state, HostState::Failed, "{why:?}");
    assert_eq!(result(&m).await, Some((false, 1)));
    // Re-enabled after the failure landed: "retry now".
    m.put(&s.enable(&EnableLevel::Global), "true", None)
        .await
        .unwrap();
    sleep(60).await;
    let r = result(&m).await;
    let (after, _) = state_of(&m).await;
    stop(d).await;
    assert_eq!(configures(&steps), 2, "retried at once");
    assert_eq!(r, Some((true, 2)));
    assert_eq!(after, HostState::Upgraded);
}

/// The operator writes the enable key while a run goes on, and the run then
/// fails: a write made before the failure is not a "retry now" for it. The agent
/// backs off, and `jioctl status` agrees (failed, not retrying).
#[tokio::test(start_paused = true)]
async fn an_enable_write_during_a_failing_run_does_not_retry_it() {
    let (dir, m, store) = scene().await;
    let steps = Arc::new(failing_validation());
    let d = start(dir.path(), &store, steps.clone());
    sleep(5).await;
    go_v2(&m).await;
    sleep(10).await;
    assert_eq!(configures(&steps), 1, "running");
    let s = Schema::default();
    m.put(&s.enable(&EnableLevel::Global), "true", None)
        .await
        .unwrap();
    sleep(60).await;
    let (state, why) = state_of(&m).await;
    stop(d).await;
    assert_eq!(
        configures(&steps),
        1,
        "retried at once after a failure that followed the write"
    );
    assert_eq!(state, HostState::Failed, "{why:?}");
}

/// The version file cannot be written (its temporary path is a directory): a
/// validated success becomes a failure, reported as attempt 1, with the failure's
/// backoff (no run again within 5 min).
#[tokio::test(start_paused = true)]
async fn an_unwritable_version_file_fails_the_run_with_a_backoff() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("version.tmp-jio")).unwrap();
    let m = MemoryStore::new();
    setup(&m).await;
    let store = Faulty::new(&m);
    let steps = Arc::new(ScriptedSteps::new().taking(Duration::from_secs(20), Duration::from_secs(5)));
    let d = start(dir.path(), &store, steps.clone());
    sleep(5).await;
    go_v2(&m).await;
    sleep(5 * 60).await;
    let s = Schema::default();
    let r = result(&m).await;
    let (state, _) = state_of(&m).await;
    let marker = get(&m, s.run(&host())).await;
    let j = journal(dir.path());
    let runs = configures(&steps);
    stop(d).await;
    eprintln!(
        "runs {runs}, result {r:?}, state {state:?}, marker {marker:?}, journal failure {} last_run {}",
        j["failure"], j["last_run"]
    );
    assert_eq!(runs, 1);
    assert_eq!(r, Some((false, 1)));
    assert_eq!(state, HostState::Failed);
    assert!(marker.is_none());
    assert_eq!(j["failure"]["attempts"], 1);
    assert_eq!(j["last_run"]["result"], "failed");
}

/// The same, killed while that failure's report is on the wire: the successor
/// keeps the backoff.
#[tokio::test(start_paused = true)]
async fn an_unwritable_version_file_then_a_kill_at_the_report_keeps_the_backoff() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("version.tmp-jio")).unwrap();
    let m = MemoryStore::new();
    setup(&m).await;
    let first = Faulty::new(&m);
    let steps = Arc::new(ScriptedSteps::new().taking(Duration::from_secs(20), Duration::from_secs(5)));
    let d = start(dir.path(), &first, steps.clone());
    sleep(5).await;
    first.f.hang_reports.store(true, Ordering::SeqCst);
    go_v2(&m).await;
    sleep(30).await;
    kill(d, &first).await;
    let second = Faulty::new(&m);
    let d = start(dir.path(), &second, steps.clone());
    sleep(5 * 60).await;
    let r = result(&m).await;
    let runs = configures(&steps);
    let (state, _) = state_of(&m).await;
    stop(d).await;
    eprintln!("runs {runs}, result {r:?}, state {state:?}");
    assert_eq!(runs, 1);
    assert_eq!(r, Some((false, 1)));
    assert_eq!(state, HostState::Failed);
}

/// the backoff, and the host is `failed`.
#[tokio::test(start_paused = true)]
async fn a_kill_after_the_report_lands_before_the_marker_delete() {
    let (dir, m, first) = scene().await;
    let steps = Arc::new(failing_validation());
    let d = start(dir.path(), &first, steps.clone());
    sleep(5).await;
    first.f.fail_reports.store(true, Ordering::SeqCst);
    first.f.fail_marker_deletes.store(true, Ordering::SeqCst);
    go_v2(&m).await;
    sleep(30).await;
    first.f.fail_reports.store(false, Ordering::SeqCst);
    sleep(60).await;
    let s = Schema::default();
    let landed = result(&m).await;
    let marker_mid = get(&m, s.run(&host())).await;
    kill(d, &first).await;
    let second = Faulty::new(&m);
    let d = start(dir.path(), &second, steps.clone());
    sleep(5 * 60).await;
    let marker = get(&m, s.run(&host())).await;
    let (state, _) = state_of(&m).await;
    let runs = configures(&steps);
    let writes = first.f.status_writes.load(Ordering::SeqCst) + second.f.status_writes.load(Ordering::SeqCst);
    stop(d).await;
    eprintln!(
        "landed {landed:?} marker then {marker_mid:?}; after restart: marker {marker:?}, state {state:?}, runs {runs}, status writes {writes}"
    );
    assert_eq!(landed, Some((false, 1)));
    assert!(marker_mid.is_some());
    assert!(marker.is_none());
    assert_eq!(state, HostState::Failed);
    assert_eq!(runs, 1);
    assert_eq!(writes, 1);
}

/// Stopped during validation (an interrupted run): the configure step's own report
/// hangs and the agent is killed. The successor reports it, removes the marker,
/// runs the upgrade again (an interrupted run is no failure: attempt 1) and ends
/// upgraded.
#[tokio::test(start_paused = true)]
async fn a_kill_during_the_configure_report_of_an_interrupted_run() {
    let (dir, m, first) = scene().await;
    let steps = Arc::new(ScriptedSteps::new().taking(Duration::from_secs(20), Duration::from_secs(30)));
    let d = start(dir.path(), &first, steps.clone());
    sleep(5).await;
    go_v2(&m).await;
    sleep(25).await;
    assert_eq!(steps.calls().len(), 2, "validating");
    first.f.hang_reports.store(true, Ordering::SeqCst);
    d.stop.send(true).unwrap();
    sleep(10).await;
    assert!(!d.task.is_finished(), "hung on the configure report");
    let j0 = journal(dir.path());
    kill(d, &first).await;
    let second = Faulty::new(&m);
    let d = start(dir.path(), &second, steps.clone());
    sleep(5 * 60).await;
    let s = Schema::default();
    let marker = get(&m, s.run(&host())).await;
    let (state, _) = state_of(&m).await;
    let r = result(&m).await;
    let runs = configures(&steps);
    let j = journal(dir.path());
    stop(d).await;
    eprintln!(
        "at the kill: in_progress {} unreported {}; after: marker {marker:?} state {state:?} result {r:?} runs {runs}, failure {}",
        j0["in_progress"].is_object(),
        j0["unreported"].as_array().map(|a| a.len()).unwrap_or(0),
        j["failure"]
    );
    assert!(marker.is_none());
    assert_eq!(runs, 2);
    assert_eq!(r, Some((true, 1)));
    assert_eq!(state, HostState::Upgraded);
}

/// On Consul a compare that a key is absent needs the right to write it, which the
/// `jio-agent` policy does not give on holds, enable keys or the current rollout:
/// the agent writes its start, then reads those keys. A hold written between the
/// decision's read and the start is found: no run, the run marker is removed and
/// the liveness record is as before. (Against the Consul API test server, with the
/// policy's token; real Consul refuses such a start outright with 409.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_consul_a_hold_written_before_the_start_is_found_after_it() {
    use jio_common::store::{ConsulStore, StoreUrl};
    use jio_tests::consul::{AclToken, ConsulOptions, ConsulServer};
    let server = ConsulServer::start(ConsulOptions {
        token: Some("operator-secret-9".into()),
        tokens: vec![AclToken::jio_agent("agent-secret-8")],
        ..ConsulOptions::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let open = |name: &str, secret: &str| -> DynStore {
        let url = StoreUrl::parse(&server.url_with_token(dir.path(), name, secret)).unwrap();
        Arc::new(ConsulStore::new(&url, Duration::from_secs(5)).unwrap())
    };
    let operator = open("operator.token", "operator-secret-9");
    let store = open("agent.token", "agent-secret-8");
    let s = Schema::default();
    operator.put(&s.current_version(), "v2", None).await.unwrap();
    let cfg = config(dir.path());
    let (_stop, stop_rx) = watch::channel(false);
    let steps = Arc::new(ScriptedSteps::new());
    let mut agent = Agent::new(cfg.clone(), store.clone(), stop_rx)
        .unwrap()
        .with_steps(steps.clone());
    agent.set_liveness(jio_agent::liveness::Liveness::start(
        store.clone(),
        s.agent(&host()),
        cfg.lease_ttl,
        jio_common::values::AgentState::Idle,
        Some(v("v1")),
    ));
    let obs = agent.observe(false).await.unwrap();
    operator
        .put(
            &s.hold(&jio_common::keys::HoldTarget::Host(host())),
            r#"{"reason":"disk","at":1}"#,
            None,
        )
        .await
        .unwrap();
    let result = agent.act(&obs).await.unwrap();
    assert_eq!(result, jio_agent::pass::PassResult::Raced);
    assert!(steps.calls().is_empty(), "nothing ran");
    assert!(
        store.get(&s.run(&host())).await.unwrap().is_none(),
        "no run marker left"
    );
    let record = async || store.get(&s.agent(&host())).await.unwrap().map(|kv| kv.value);
    for _ in 0..50 {
        if record().await.is_some_and(|r| r.contains("\"idle\"")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        record().await.unwrap().contains("\"idle\""),
        "{:?}",
        record().await
    );
    // With the hold gone, the same decision starts and runs.
    operator
        .delete(&s.hold(&jio_common::keys::HoldTarget::Host(host())))
        .await
        .unwrap();
    let obs = agent.observe(false).await.unwrap();
    let ran = agent.act(&obs).await.unwrap();
    assert!(matches!(ran, jio_agent::pass::PassResult::Ran { .. }), "{ran:?}");
    if let Some(l) = agent.take_liveness() {
        l.stop().await;
    }
}
