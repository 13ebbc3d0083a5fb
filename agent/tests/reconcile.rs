//! The agent's reconcile loop on paused time: the in-memory store, scripted steps
//! and a clock that moves with tokio's, so that every timer is exact and a test of
//! "an hour later" takes no time. Pure logic only: the real store, Puppet and
//! run-parts are in `agent.rs`.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::sync::{Arc, Mutex};
use std::time::Duration;

use jio_agent::agent::Agent;
use jio_agent::config::{Overrides, SCALAR_KEYS};
use jio_agent::runner::Outcome;
use jio_agent::steps::ScriptedSteps;
use jio_common::clock::TokioClock;
use jio_common::keys::{EnableLevel, Schema, Step};
use jio_common::names::{HostName, Version};
use jio_common::store::{CountingStore, DynStore, MemoryStore, Store as _};
use tokio::sync::watch;
use tokio::time::Instant;

const START: u64 = 1_800_000_000;

/// One agent of host `compute1` on an in-memory store, its steps scripted, started
/// at v1 (its version file says so, and so does `/current_version`).
struct Rig {
    store: MemoryStore,
    /// The agent's store requests.
    counted: CountingStore,
    steps: Arc<ScriptedSteps>,
    /// When each step started (tokio's clock), in order.
    starts: Arc<Mutex<Vec<(Step, Version, Instant)>>>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    dir: tempfile::TempDir,
    t0: Instant,
}

fn v(s: &str) -> Version {
    Version::new(s).unwrap()
}

fn host() -> HostName {
    HostName::new("compute1").unwrap()
}

/// The configuration of `compute1` with its files in `dir` (at v1), with `settings`.
fn config(dir: &tempfile::TempDir, settings: &[(&str, &str)]) -> jio_agent::config::Config {
    let empty = dir.path().join("agent.toml");
    std::fs::write(&empty, "").unwrap();
    std::fs::write(dir.path().join("version"), "v1\n").unwrap();
    let mut ov = Overrides {
        config_path: Some(empty),
        ..Overrides::default()
    };
    let mut all = vec![
        ("store".to_string(), "etcd://127.0.0.1:9".to_string()),
        ("hostname".into(), "compute1".into()),
        ("state_dir".into(), dir.path().join("state").display().to_string()),
        (
            "version_file".into(),
            dir.path().join("version").display().to_string(),
        ),
        (
            "facts_file".into(),
            dir.path().join("facts").display().to_string(),
        ),
        // Never the default under /etc: a test writes only its own directory.
        (
            "hiera_file".into(),
            dir.path().join("hiera.yaml").display().to_string(),
        ),
        ("resync_interval".into(), "1h".into()),
        ("retry_interval".into(), "1m".into()),
        // Never the test machine's own reboot.
        ("reboot".into(), "never".into()),
        // Nor its apt files or its packages.
        (
            "apt_sources_file".into(),
            dir.path().join("snapshot.list").display().to_string(),
        ),
        (
            "apt_preferences_file".into(),
            dir.path().join("snapshot.pref").display().to_string(),
        ),
        ("dpkg_status_file".into(), String::new()),
        ("health_interval".into(), "0".into()),
    ];
    all.extend(settings.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    for (k, val) in all {
        let key = SCALAR_KEYS.iter().find(|x| **x == k).copied().unwrap();
        ov.flags.insert(key, val);
    }
    jio_agent::config::load(&ov, || None).unwrap()
}

async fn rig(settings: &[(&str, &str)], steps: ScriptedSteps) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir, settings);
    let store = MemoryStore::new();
    store
        .put(&Schema::default().current_version(), "v1", None)
        .await
        .unwrap();
    let starts = Arc::new(Mutex::new(Vec::new()));
    let seen = starts.clone();
    let steps = Arc::new(steps.on_step(Arc::new(move |step, _h, version| {
        seen.lock().unwrap().push((step, version.clone(), Instant::now()));
    })));
    let (stop, stop_rx) = watch::channel(false);
    let counted = CountingStore::new(Arc::new(store.clone()));
    let dynstore: DynStore = Arc::new(counted.clone());
    let agent = Agent::new(cfg, dynstore, stop_rx)
        .unwrap()
        .with_steps(steps.clone())
        .with_clock(Arc::new(TokioClock::starting_at(START)));
    let task = tokio::spawn(async move {
        jio_agent::daemon::serve(agent).await.unwrap();
    });
    Rig {
        store,
        counted,
        steps,
        starts,
        stop,
        task,
        dir,
        t0: Instant::now(),
    }
}

impl Rig {
    async fn put(&self, key: jio_common::keys::Key, value: &str) {
        self.store.put(&key, value, None).await.unwrap();
    }

    async fn desire(&self, version: &str) {
        self.put(Schema::default().current_version(), version).await;
    }

    async fn enable_global(&self) {
        self.put(Schema::default().enable(&EnableLevel::Global), "true")
            .await;
    }

    /// Seconds after the start at which each step of `step` started.
    fn at(&self, step: Step) -> Vec<u64> {
        self.starts
            .lock()
            .unwrap()
            .iter()
            .filter(|(s, _, _)| *s == step)
            .map(|(_, _, t)| t.duration_since(self.t0).as_secs())
            .collect()
    }

    fn local(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("version"))
            .unwrap()
            .trim()
            .to_string()
    }

    async fn running(&self, version: &str) -> bool {
        let key = Schema::default().running_version_host(&v(version), &host());
        self.store.get(&key).await.unwrap().is_some()
    }

    async fn stop(self) {
        self.stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("the daemon stops on the signal")
            .unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_watch_event_starts_an_upgrade_at_once() {
    let r = rig(
        &[],
        ScriptedSteps::new().taking(Duration::from_secs(20), Duration::from_secs(5)),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(r.at(Step::Configured).is_empty(), "nothing to do at v1");
    r.enable_global().await;
    r.desire("v2").await;
    // The resync is an hour away: only the watch can have woken it.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(r.at(Step::Configured), [10]);
    assert_eq!(r.at(Step::Validated), [30]);
    assert_eq!(r.local(), "v2");
    assert!(r.running("v2").await);
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_failure_backs_off_and_doubles() {
    let failing = (0..3).map(|i| Outcome::Failure(format!("puppet exited 4 (attempt {i})")));
    let r = rig(&[], ScriptedSteps::new().configure_outcomes(failing)).await;
    r.enable_global().await;
    r.desire("v2").await;
    tokio::time::sleep(Duration::from_secs(600)).await;
    // Retry interval 1 min: tries at 0, then 1, 2 and 4 minutes later.
    assert_eq!(r.at(Step::Configured), [0, 60, 180, 420]);
    assert_eq!(r.local(), "v2", "the fourth try succeeded");
    let failure = Schema::default().status(
        Step::Configured,
        jio_common::keys::Outcome::Failure,
        &v("v2"),
        &host(),
    );
    assert!(
        r.store.get(&failure).await.unwrap().is_none(),
        "the success cleared the failure entry"
    );
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_enable_key_write_retries_at_once() {
    let r = rig(
        &[("retry_interval", "1h")],
        ScriptedSteps::new().configure_outcomes([Outcome::Failure("puppet exited 4".into())]),
    )
    .await;
    r.enable_global().await;
    r.desire("v2").await;
    tokio::time::sleep(Duration::from_secs(100)).await;
    assert_eq!(r.at(Step::Configured), [0], "backing off for an hour");
    // An operator re-enables the host: a new decision, no backoff.
    r.put(Schema::default().enable(&EnableLevel::Host(host())), "true")
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(r.at(Step::Configured), [0, 100]);
    assert_eq!(r.local(), "v2");
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn health_checks_revalidate_and_repair() {
    let steps = ScriptedSteps::new()
        .taking(Duration::from_secs(10), Duration::from_secs(5))
        .validate_outcomes([
            Outcome::Success { changes: false },
            Outcome::Failure("validation exited 1".into()),
            Outcome::Success { changes: false },
        ]);
    let r = rig(&[("health_interval", "30s")], steps).await;
    tokio::time::sleep(Duration::from_secs(100)).await;
    // A check at 30 s passes (it ends at 35); the next one, at 65, fails, and Puppet
    // repairs at once (70 to 80), then validates again (80 to 85).
    assert_eq!(r.at(Step::Validated), [30, 65, 80]);
    assert_eq!(r.at(Step::Configured), [70]);
    let success = Schema::default().status(
        Step::Validated,
        jio_common::keys::Outcome::Success,
        &v("v1"),
        &host(),
    );
    assert!(
        r.store.get(&success).await.unwrap().is_some(),
        "the repair was reported"
    );
    // The next check comes an interval after the repair ended.
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(r.at(Step::Validated), [30, 65, 80, 115]);
    assert_eq!(r.steps.calls().len(), 5);
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn health_checks_wait_while_a_driver_holds_the_lock() {
    let r = rig(&[("health_interval", "30s")], ScriptedSteps::new()).await;
    r.put(Schema::default().lock("rollout"), r#"{"pid":1}"#).await;
    tokio::time::sleep(Duration::from_secs(100)).await;
    assert!(r.at(Step::Validated).is_empty(), "checked under the lock");
    r.store.delete(&Schema::default().lock("rollout")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(35)).await;
    assert_eq!(r.at(Step::Validated).len(), 1);
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_store_going_away_and_coming_back() {
    let r = rig(&[], ScriptedSteps::new()).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    r.store.set_available(false);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(!r.task.is_finished(), "the daemon ended while the store was away");
    // Back: passes retry with backoff capped at 30 s.
    r.store.set_available(true);
    r.enable_global().await;
    r.desire("v2").await;
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(r.local(), "v2");
    assert!(r.running("v2").await);
    let configured = r.at(Step::Configured);
    assert_eq!(configured.len(), 1);
    assert!((605..=636).contains(&configured[0]), "{configured:?}");
    // And the watches work again: with an hour's resync only they can wake it.
    r.desire("v3").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(r.at(Step::Configured), [configured[0], 636]);
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_repair_waits_for_the_driver_to_release_the_lock() {
    let steps = ScriptedSteps::new()
        .taking(Duration::from_secs(10), Duration::from_secs(5))
        .validate_outcomes([Outcome::Failure("validation exited 1".into())]);
    let r = rig(&[("health_interval", "30s")], steps).await;
    // The check runs from 30 to 35 s and fails; a driver takes the lock meanwhile.
    tokio::time::sleep(Duration::from_secs(32)).await;
    r.put(Schema::default().lock("rollout"), r#"{"pid":1}"#).await;
    tokio::time::sleep(Duration::from_secs(68)).await;
    assert_eq!(r.at(Step::Validated), [30]);
    assert!(r.at(Step::Configured).is_empty(), "repaired under the lock");
    // Released at 100 s: the repair comes with the next check's tick (125 s:
    // the lock is not watched; the timer restarts at 35, 65, 95).
    r.store.delete(&Schema::default().lock("rollout")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(r.at(Step::Configured), [125]);
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_health_check_that_cannot_start_waits_for_the_next_tick() {
    let r = rig(&[("health_interval", "30s")], ScriptedSteps::new()).await;
    // The run directories cannot be made (a file where the directory should be).
    let runs = r.dir.path().join("state").join("runs");
    std::fs::create_dir_all(runs.parent().unwrap()).unwrap();
    std::fs::write(&runs, "not a directory").unwrap();
    // Time moves by hand, a second at a time, so that an agent that loops without
    // waiting fails this test instead of keeping paused time from moving.
    let before = r.counted.requests();
    for second in 0..300 {
        tokio::time::advance(Duration::from_secs(1)).await;
        tokio::task::yield_now().await;
        let used = r.counted.requests() - before;
        // About one pass per check (a few requests each), not a loop.
        assert!(used < 100, "{used} store requests in {second} s");
    }
    assert!(r.at(Step::Validated).is_empty());
    r.stop().await;
}

impl Rig {
    /// Starts a rollout to `version` whose rules are `rules`, recorded at `START`.
    async fn rollout(&self, version: &str, rules: serde_json::Value) {
        let rec = jio_common::rollout::RolloutRecord::start(v(version), Some(v("v1")), rules, "test", START);
        let s = Schema::default();
        self.put(s.rollout(&rec.id), &serde_json::to_string(&rec).unwrap())
            .await;
        self.put(s.current_rollout(), rec.id.as_str()).await;
    }

    async fn result(&self) -> jio_common::values::HostResult {
        let kv = self
            .store
            .get(&Schema::default().result(&host()))
            .await
            .unwrap()
            .expect("a run result");
        serde_json::from_str(&kv.value).unwrap()
    }
}

#[tokio::test(start_paused = true)]
async fn the_soak_check_runs_under_the_drivers_lock_and_its_failure_fails_the_version() {
    let steps = ScriptedSteps::new()
        .taking(Duration::from_secs(10), Duration::from_secs(5))
        .validate_outcomes([
            Outcome::Success { changes: false },
            Outcome::Failure("validation exited 1".into()),
        ]);
    let r = rig(&[("health_interval", "1h")], steps).await;
    r.rollout("v2", serde_json::json!({"min_healthy_time": "10m"}))
        .await;
    r.put(Schema::default().lock("rollout"), r#"{"pid":1}"#).await;
    r.enable_global().await;
    r.desire("v2").await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    // Configured 0-10, validated 10-15: the run ended at 15.
    let run = r.result().await;
    assert!(run.ok && run.checked_at.is_none(), "{run:?}");
    assert_eq!((run.at, run.attempt), (START + 15, 1));
    // The soak's check comes M after the run ended, lock or not, and fails.
    tokio::time::sleep(Duration::from_secs(1000)).await;
    assert_eq!(r.at(Step::Validated), [10, 615]);
    assert_eq!(r.at(Step::Configured), [0], "a failed soak is never repaired");
    let failed = r.result().await;
    assert!(!failed.ok);
    assert_eq!(
        (failed.step.as_deref(), failed.at, failed.retry_at),
        (Some("validated"), START + 15, None)
    );
    assert!(
        failed
            .message
            .as_deref()
            .unwrap()
            .contains("min_healthy_time soak"),
        "{failed:?}"
    );
    let failure = Schema::default().status(
        Step::Validated,
        jio_common::keys::Outcome::Failure,
        &v("v2"),
        &host(),
    );
    assert!(r.store.get(&failure).await.unwrap().is_some());
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_passing_soak_check_records_checked_at() {
    let r = rig(
        &[],
        ScriptedSteps::new().taking(Duration::from_secs(10), Duration::from_secs(5)),
    )
    .await;
    r.rollout("v2", serde_json::json!({"min_healthy_time": "4s"}))
        .await;
    r.put(Schema::default().lock("rollout"), r#"{"pid":1}"#).await;
    r.enable_global().await;
    r.desire("v2").await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    // Ended at 15; checked at 19 (M after) to 24: at or past `at + M`, soaked.
    assert_eq!(r.at(Step::Validated), [10, 19]);
    let res = r.result().await;
    assert!(res.ok);
    assert_eq!((res.at, res.checked_at), (START + 15, Some(START + 24)));
    r.stop().await;
}

/// Windows are the driver's to decide, by its clock: an enabled agent starts at
/// once, whatever its own clock says of the rollout's window (the driver disarms
/// an admitted host when the window closes).
#[tokio::test(start_paused = true)]
async fn an_enabled_agent_starts_whatever_its_clock_says_of_the_window() {
    // START is 08:00 UTC; by the agent's clock the window opens at 08:10.
    let r = rig(&[], ScriptedSteps::new()).await;
    r.rollout(
        "v2",
        serde_json::json!({"windows": [{"days": "daily", "start": "08:10", "end": "09:00"}]}),
    )
    .await;
    r.enable_global().await;
    r.desire("v2").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let started = r.at(Step::Configured);
    assert_eq!(started.len(), 1, "{started:?}");
    assert!(started[0] < 5, "started at {started:?}, not at once");
    assert_eq!(r.local(), "v2");
    r.stop().await;
}

/// The number of `get_many` requests (the pass's read) made so far.
fn reads(c: &CountingStore) -> u64 {
    let i = jio_common::store::counting::OPS
        .iter()
        .position(|op| *op == "get_many")
        .unwrap();
    c.by_op()[i]
}

#[tokio::test(start_paused = true)]
async fn passes_woken_by_watches_and_after_a_run_read_nothing() {
    let r = rig(
        &[],
        ScriptedSteps::new().taking(Duration::from_secs(20), Duration::from_secs(5)),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let before = reads(&r.counted);
    assert!(before >= 1, "the first pass read");
    // Watched keys change; nothing is to be done (up to date): no read.
    r.enable_global().await;
    r.desire("v1").await;
    let hold = Schema::default().hold(&jio_common::keys::HoldTarget::Host(host()));
    r.put(hold.clone(), r#"{"reason":"test","at":1}"#).await;
    r.store.delete(&hold).await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(reads(&r.counted), before, "passes woken by watches used the view");
    // A new version starts at once on the view; the run's end is one transaction
    // the view takes in, so the pass after the run reads nothing either.
    r.desire("v2").await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(r.at(Step::Configured), [20]);
    assert_eq!(r.local(), "v2");
    assert_eq!(reads(&r.counted), before, "no read after the run");
    // The view after the run is right: the next version written starts at once,
    // still without a read.
    r.desire("v3").await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(r.local(), "v3");
    assert_eq!(reads(&r.counted), before, "no read after the second run");
    r.stop().await;
}

/// The view can miss an event that has not arrived yet (each key has its own
/// watch): a run decided on it is fenced like any other, and the next pass reads.
#[tokio::test(start_paused = true)]
async fn a_run_decided_on_a_stale_view_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir, &[]);
    let schema = Schema::default();
    let store = MemoryStore::new();
    store.put(&schema.current_version(), "v1", None).await.unwrap();
    let dynstore: DynStore = Arc::new(store.clone());
    let (_stop, stop_rx) = watch::channel(false);
    let steps = Arc::new(ScriptedSteps::new());
    let mut agent = Agent::new(cfg.clone(), dynstore.clone(), stop_rx)
        .unwrap()
        .with_steps(steps.clone())
        .with_clock(Arc::new(TokioClock::starting_at(START)));
    agent.set_liveness(jio_agent::liveness::Liveness::start(
        dynstore.clone(),
        schema.agent(&host()),
        cfg.lease_ttl,
        jio_common::values::AgentState::Idle,
        Some(v("v1")),
    ));
    let first = agent.pass(false).await.unwrap();
    assert!(matches!(first, jio_agent::pass::PassResult::Idle(_)), "{first:?}");
    // A hold written with the enable key and a new version: the view gets the
    // events of the last two only.
    let hold = schema.hold(&jio_common::keys::HoldTarget::Host(host()));
    store
        .put(&hold, r#"{"reason":"disk","at":1}"#, None)
        .await
        .unwrap();
    store
        .put(&schema.enable(&EnableLevel::Global), "true", None)
        .await
        .unwrap();
    store.put(&schema.current_version(), "v2", None).await.unwrap();
    for k in [schema.enable(&EnableLevel::Global), schema.current_version()] {
        let kv = store.get(&k).await.unwrap().unwrap();
        agent.watched(&jio_common::store::WatchEvent::Put(kv));
    }
    let stale = agent.pass(false).await.unwrap();
    assert!(
        matches!(stale, jio_agent::pass::PassResult::Raced),
        "the start is fenced on the hold key being absent: {stale:?}"
    );
    assert!(steps.calls().is_empty(), "nothing ran");
    let next = agent.pass(false).await.unwrap();
    assert!(
        matches!(
            next,
            jio_agent::pass::PassResult::Idle(jio_agent::decide::Decision::Held { .. })
        ),
        "the next pass read the hold: {next:?}"
    );
    assert!(steps.calls().is_empty(), "nothing ran");
}
