//! Rollouts recorded in the store (issue 13), each against a real etcd with real
//! `jio-agent` daemons and real `jioctl` processes: a standby driver service taking
//! over from a killed one, pause and resume, abort, undo and history, a detached
//! rollout finished by the service, and a stuck rollout.
//!
//! Every test runs the independent invariant recorder (raw keys, not the project's
//! classification) and checks the configuration step's own log: the stand-in Puppet
//! appends a start and an end line per run to one shared file.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::time::{Duration, Instant};

use jio_common::keys::{Key, Schema};
use jio_common::rules::Rules;
use jio_common::store::DynStore;
use jio_tests::Recorder;
use jio_tests::inspect::{open, text, wait_for};

use common::fleet::{
    Fleet, finish, fleet_on_etcd, keys_under, max_overlap, now, register_host, signal, spawn,
};
use common::run;

const COMPUTE_2: &str = r#"{"rolling_rules":{"roles":{"compute":2}}}"#;
const COMPUTE_1: &str = r#"{"rolling_rules":{"roles":{"compute":1}}}"#;
const SIX: [&str; 6] = [
    "compute1", "compute2", "compute3", "compute4", "compute5", "compute6",
];

async fn recorder(s: &DynStore, rules: &str) -> Recorder {
    Recorder::start(s.clone(), Schema::default(), Rules::parse(rules).unwrap()).await
}

/// The rollout lock's holder pid, if held.
async fn lock_pid(s: &DynStore) -> Option<u32> {
    let kv = s.get(&Schema::default().lock("rollout")).await.unwrap()?;
    let v: serde_json::Value = serde_json::from_str(&kv.value).ok()?;
    v["pid"].as_u64().map(|p| p as u32)
}

/// Waits until no rollout is current (the last one ended).
/// Checks that the scraped metrics give the series `name` the value `want`.
#[track_caller]
fn assert_metric(scraped: &str, name: &str, want: f64) {
    assert_eq!(
        jio_tests::prometheus::value(scraped, name),
        Some(want),
        "{scraped}"
    );
}

async fn until_no_rollout(s: &DynStore, within: Duration) {
    wait_for("the rollout to end", within, || async {
        s.get(&Schema::default().current_rollout())
            .await
            .unwrap()
            .is_none()
    })
    .await;
}

/// Every recorded rollout, newest first (`jioctl rollout history --json`).
async fn history(url: &str) -> Vec<serde_json::Value> {
    let out = run(url, &["--json", "rollout", "history"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout).unwrap()
}

/// No violation, and the limit was reached (so the check could have failed).
async fn checked(rec: Recorder, f: &Fleet, from: f64, limit: usize) {
    let record = rec.stop().await;
    assert!(
        record.violations.is_empty(),
        "{:#?}\n{:#?}",
        record.violations,
        f.runs()
    );
    let runs = f.runs();
    let (most, at) = max_overlap(&runs, from);
    assert!(
        most <= limit,
        "{most} computes ran at once against a limit of {limit}: {at:?}\n{runs:#?}"
    );
    assert_eq!(record.max_in_flight.get("compute"), Some(&limit), "{record:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_driver_takes_over_within_the_lease_and_the_rollout_completes() {
    let (_etcd, url, f) = fleet_on_etcd(&SIX, 2.0).await;
    let s = open(&url).await;
    let rec = recorder(&s, COMPUTE_2).await;
    let t0 = now();
    let lease = Duration::from_secs(4);
    let mut a = spawn(&url, &["drive", "--lease", "4s"]);
    let mut b = spawn(&url, &["drive", "--lease", "4s"]);
    wait_for(
        "both driver services to register",
        Duration::from_secs(20),
        || async { keys_under(&s, "/drivers/").await.len() == 2 },
    )
    .await;
    let out = run(&url, &["upgrade", "v2", "--instructions", COMPUTE_2, "--detach"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("detached"), "{}", text(&out));
    wait_for("the first wave to run", Duration::from_secs(30), || async {
        f.started("v2") >= 2
    })
    .await;
    let holder = lock_pid(&s).await.expect("a service holds the lock");
    let (active, standby) = if holder == a.id().unwrap() {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    let standby_pid = standby.id().unwrap();
    signal(active, nix::sys::signal::Signal::SIGKILL);
    let killed = Instant::now();
    loop {
        if lock_pid(&s).await == Some(standby_pid) {
            break;
        }
        assert!(
            killed.elapsed() < lease + Duration::from_secs(1),
            "the standby did not take over within the lease plus 1 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = killed.elapsed();
    until_no_rollout(&s, Duration::from_secs(120)).await;
    assert!(f.all_at("v2"), "{:#?}", f.runs());
    checked(rec, &f, t0, 2).await;
    let h = history(&url).await;
    assert_eq!(h[0]["state"], "done", "{h:#?}");
    assert!(
        standby.try_wait().unwrap().is_none(),
        "the service stays up after the rollout (took over in {took:?})"
    );
    signal(standby, nix::sys::signal::Signal::SIGTERM);
    // The standby (whichever of the two it is) exits on SIGTERM; only then is the
    // other, killed one, reaped (killing the standby before it handled SIGTERM
    // would leave its lock to its lease).
    let deadline = Instant::now() + Duration::from_secs(10);
    while standby.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the standby did not exit on SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = a.kill().await;
    let _ = b.kill().await;
    assert!(
        s.get(&Schema::default().lock("rollout")).await.unwrap().is_none(),
        "no driver holds the lock once no rollout is active"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_admits_no_host_until_resumed() {
    let (_etcd, url, f) = fleet_on_etcd(&SIX, 3.0).await;
    let s = open(&url).await;
    let rec = recorder(&s, COMPUTE_2).await;
    let t0 = now();
    let follower = spawn(&url, &["upgrade", "v2", "--instructions", COMPUTE_2]);
    wait_for("the first wave to run", Duration::from_secs(30), || async {
        f.started("v2") >= 2
    })
    .await;
    let out = run(&url, &["rollout", "pause", "--reason", "night shift"]).await;
    let paused_at = now();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("paused by") && text(&out).contains("night shift"),
        "{}",
        text(&out)
    );
    // The hosts in flight finish; nothing new starts while paused.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let late: Vec<_> = f
        .runs()
        .into_iter()
        .filter(|r| r.start > paused_at + 0.5)
        .collect();
    assert!(late.is_empty(), "runs started while paused: {late:#?}");
    let in_flight_done = f.runs().iter().all(|r| r.end.is_some());
    assert!(in_flight_done, "the hosts in flight finished: {:#?}", f.runs());
    let st = text(&run(&url, &["rollout", "status"]).await);
    assert!(st.contains("paused") && st.contains("night shift"), "{st}");
    let out = run(&url, &["rollout", "pause"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("cannot be paused"), "{}", text(&out));
    let out = run(&url, &["rollout", "resume"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("resumed"), "{}", text(&out));
    let out = finish(follower, Duration::from_secs(120)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("is paused by"),
        "the follower said so: {}",
        text(&out)
    );
    assert!(f.all_at("v2"));
    checked(rec, &f, t0, 2).await;
    let h = history(&url).await;
    let states: Vec<&str> = h[0]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["running", "paused", "running", "done"], "{h:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_then_undo_and_history() {
    let names = ["compute1", "compute2", "compute3", "compute4"];
    let (_etcd, url, f) = fleet_on_etcd(&names, 1.5).await;
    let s = open(&url).await;
    let rec = recorder(&s, COMPUTE_1).await;
    let t0 = now();
    let follower = spawn(&url, &["upgrade", "v2", "--instructions", COMPUTE_1]);
    wait_for("two computes to start v2", Duration::from_secs(30), || async {
        f.started("v2") >= 2
    })
    .await;
    let out = run(&url, &["rollout", "abort", "--reason", "bad build"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("aborted") && text(&out).contains("goes back to v1"),
        "{}",
        text(&out)
    );
    let out = finish(follower, Duration::from_secs(20)).await;
    assert_eq!(out.status.code(), Some(6), "{}", text(&out));
    assert!(text(&out).contains("was aborted by"), "{}", text(&out));
    // Mixed and safe: nothing is armed, nothing more starts.
    assert_eq!(
        keys_under(&s, "/config_state/enable_puppet/").await,
        [(
            "/config_state/enable_puppet/global".to_string(),
            "false".to_string()
        )]
        .into()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let at_v2 = f
        .hosts
        .iter()
        .filter(|h| h.local_version().as_deref() == Some("v2"))
        .count();
    assert!(
        (1..4).contains(&at_v2),
        "the fleet is left mixed: {at_v2} of 4 at v2"
    );
    assert_eq!(f.started("v2"), at_v2, "nothing started after the abort");
    let out = run(&url, &["rollout", "resume"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("no rollout is active"), "{}", text(&out));
    // Undo: back to v1 with the same rules, followed to the end.
    let out = run(&url, &["rollout", "undo"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("back to v1"), "{}", text(&out));
    assert!(f.all_at("v1"), "{:#?}", f.runs());
    let record = rec.stop().await;
    assert!(record.violations.is_empty(), "{:#?}", record.violations);
    let (most, at) = max_overlap(&f.runs(), t0);
    assert!(most <= 1, "{most} ran at once: {at:?}");
    let h = history(&url).await;
    assert_eq!(h.len(), 2, "{h:#?}");
    assert_eq!(
        (&h[0]["version"], &h[0]["previous"], &h[0]["state"]),
        (&"v1".into(), &"v2".into(), &"done".into()),
        "{h:#?}"
    );
    assert_eq!(
        (&h[1]["version"], &h[1]["state"]),
        (&"v2".into(), &"aborted".into())
    );
    assert_eq!(h[0]["rules_digest"], h[1]["rules_digest"], "the same rules");
    let table = text(&run(&url, &["rollout", "history"]).await);
    assert!(
        table.contains("aborted") && table.contains("done") && table.contains("keeps the last 100"),
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_rollout_is_finished_by_the_driver_service() {
    let (_etcd, url, f) = fleet_on_etcd(&SIX, 1.0).await;
    let s = open(&url).await;
    let rec = recorder(&s, COMPUTE_2).await;
    let t0 = now();
    let service = spawn(&url, &["drive"]);
    wait_for(
        "the driver service to register",
        Duration::from_secs(20),
        || async { !keys_under(&s, "/drivers/").await.is_empty() },
    )
    .await;
    let started = Instant::now();
    let out = run(&url, &["upgrade", "v2", "--instructions", COMPUTE_2, "--detach"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "--detach returns at once"
    );
    assert!(text(&out).contains("detached"), "{}", text(&out));
    // A laptop following the service's rollout: Ctrl-C stops following only.
    wait_for("the service to drive", Duration::from_secs(20), || async {
        lock_pid(&s).await == service.id()
    })
    .await;
    let laptop = spawn(&url, &["upgrade", "v2", "--instructions", COMPUTE_2]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    signal(&laptop, nix::sys::signal::Signal::SIGINT);
    let out = finish(laptop, Duration::from_secs(10)).await;
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    assert!(
        text(&out).contains("following rollout") && text(&out).contains("it goes on, driven by its driver"),
        "{}",
        text(&out)
    );
    until_no_rollout(&s, Duration::from_secs(120)).await;
    assert!(f.all_at("v2"), "{:#?}", f.runs());
    checked(rec, &f, t0, 2).await;
    assert_eq!(history(&url).await[0]["state"], "done");
    signal(&service, nix::sys::signal::Signal::SIGTERM);
    let out = finish(service, Duration::from_secs(10)).await;
    assert_eq!(out.status.code(), Some(143), "{}", text(&out));
    assert!(text(&out).contains("stopped"), "{}", text(&out));
    assert!(keys_under(&s, "/drivers/").await.is_empty(), "it unregistered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_without_progress_becomes_stuck_and_names_its_hosts() {
    let (_etcd, url, f) = fleet_on_etcd(&["compute1", "compute2"], 0.3).await;
    let s = open(&url).await;
    // A host registered whose agent never runs: it will be lost once enabled.
    register_host(&s, "compute7", "compute").await;
    let rules = r#"{"rolling_rules":{"global":1},"progress_deadline":"3s"}"#;
    let rec = recorder(&s, rules).await;
    let out = run(&url, &["upgrade", "v2", "--instructions", rules]).await;
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    // Notes are folded to 80 columns in a pipe: read them whole.
    let t = common::unfolded(&text(&out));
    assert!(
        t.contains("is stuck") && t.contains("compute7: lost"),
        "the stuck rollout names its host: {t}"
    );
    assert!(
        t.contains("it waits until someone acts"),
        "waiting forever is said: {t}"
    );
    assert!(f.all_at("v2"));
    let st = text(&run(&url, &["status"]).await);
    assert!(st.contains("stuck") && st.contains("compute7"), "{st}");
    assert!(st.contains("waiting forever"), "{st}");
    // The record says so too, with the host and why.
    let j = run(&url, &["--json", "rollout", "status"]).await;
    let v: serde_json::Value = serde_json::from_slice(&j.stdout).unwrap();
    assert_eq!(v["rollout"]["state"], "stuck", "{v:#}");
    assert!(
        v["rollout"]["holding"]["compute7"]
            .as_str()
            .unwrap()
            .contains("lost")
    );
    let out = run(&url, &["rollout", "abort"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let record = rec.stop().await;
    assert!(record.violations.is_empty(), "{:#?}", record.violations);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_values_never_end_the_driver_service_nor_blind_status() {
    let (_etcd, url, f) = fleet_on_etcd(&["compute1", "compute2"], 0.3).await;
    let s = open(&url).await;
    let mut service = spawn(&url, &["drive", "--lease", "3s"]);
    wait_for(
        "the driver service to register",
        Duration::from_secs(20),
        || async { !keys_under(&s, "/drivers/").await.is_empty() },
    )
    .await;
    let schema = Schema::default();
    // A current id that is no id; then a record whose change time overflows any sum;
    // then a lock value no driver writes (without a lease: it would never go).
    s.put(&schema.current_rollout(), "garbage\u{1}", None)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let st = run(&url, &["status"]).await;
    assert_eq!(st.status.code(), Some(0), "{}", text(&st));
    assert!(
        text(&st).contains("/rollouts/current"),
        "the key is named: {}",
        text(&st)
    );
    let id = "20261123T020000Z-v2";
    let record = serde_json::json!({
        "id": id, "version": "v2", "previous": "v1", "rules": {"progress_deadline": "1h"},
        "state": "running",
        "changes": [{"state": "running", "by": "x", "at": u64::MAX}],
    });
    s.put(
        &Key::new(format!("/rollouts/{id}")).unwrap(),
        &record.to_string(),
        None,
    )
    .await
    .unwrap();
    s.put(&schema.current_version(), "v2", None).await.unwrap();
    s.put(&schema.current_rollout(), id, None).await.unwrap();
    s.put(&schema.lock("rollout"), "not json", None).await.unwrap();
    // The service reports the lock, takes it over and drives the rollout to its end.
    until_no_rollout(&s, Duration::from_secs(60)).await;
    assert!(f.all_at("v2"), "{:#?}", f.runs());
    assert!(service.try_wait().unwrap().is_none(), "the service is still up");
    signal(&service, nix::sys::signal::Signal::SIGTERM);
    let out = finish(service, Duration::from_secs(10)).await;
    assert_eq!(out.status.code(), Some(143), "{}", text(&out));
    assert!(
        text(&out).contains("/rollouts/current") && text(&out).contains("took over the rollout lock"),
        "{}",
        text(&out)
    );
}

/// `jioctl drive --metrics-listen`: the fleet per group, role and state, the
/// rollout's state and the lock, as Prometheus reads them (checked by promtool),
/// through a rollout that fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_service_exports_the_fleet_and_the_rollout_to_prometheus() {
    use jio_tests::prometheus::{check, until, value};
    let (_etcd, url, f) = fleet_on_etcd(&["compute1", "compute2", "compute3", "controller1"], 1.0).await;
    let port = jio_tests::free_port();
    let metrics = format!("http://127.0.0.1:{port}/metrics");
    let service = spawn(&url, &["drive", "--metrics-listen", &port.to_string()]);
    let scraped = until(
        &metrics,
        "jio_fleet_hosts{group=\"compute\",role=\"compute\",state=\"upgraded\"}",
        3.0,
    )
    .await;
    check(&scraped).unwrap();
    for (series, want) in [
        (
            "jio_fleet_hosts{group=\"controller\",role=\"controller\",state=\"upgraded\"}",
            Some(1.0),
        ),
        (
            "jio_fleet_hosts{group=\"compute\",role=\"compute\",state=\"failed\"}",
            Some(0.0),
        ),
        ("jio_fleet_desired_version_info{version=\"v1\"}", Some(1.0)),
        ("jio_drive_lock_held", Some(0.0)),
        ("jio_drive_store_up", Some(1.0)),
        ("jio_fleet_emergency_stop", Some(0.0)),
        ("jio_rollout_state{state=\"running\"}", None),
    ] {
        assert_eq!(value(&scraped, series), want, "{series} in\n{scraped}");
    }

    // compute3's configuration step fails: one compute at a time, then the rollout
    // stops as failed, and the metrics say all of it.
    f.fail("compute3", true);
    // Runs long enough to be seen through the metrics' 5s cache.
    f.set_seconds(6.0);
    let t0 = now();
    let out = run(&url, &["upgrade", "v2", "--instructions", COMPUTE_1, "--detach"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let scraped = until(
        &metrics,
        "jio_fleet_hosts{group=\"compute\",role=\"compute\",state=\"upgrading\"}",
        1.0,
    )
    .await;
    check(&scraped).unwrap();
    assert_metric(&scraped, "jio_fleet_group_in_flight{group=\"compute\"}", 1.0);
    assert_metric(&scraped, "jio_fleet_group_limit{group=\"compute\"}", 1.0);
    assert_metric(&scraped, "jio_drive_lock_held", 1.0);
    assert_metric(&scraped, "jio_rollout_state{state=\"running\"}", 1.0);
    assert_metric(&scraped, "jio_rollout_active", 1.0);
    assert_metric(&scraped, "jio_fleet_desired_version_info{version=\"v2\"}", 1.0);
    let scraped = until(&metrics, "jio_rollout_state{state=\"failed\"}", 1.0).await;
    check(&scraped).unwrap();
    assert_metric(
        &scraped,
        "jio_fleet_hosts{group=\"compute\",role=\"compute\",state=\"failed\"}",
        1.0,
    );
    assert_metric(&scraped, "jio_rollout_state{state=\"running\"}", 0.0);
    assert_metric(&scraped, "jio_rollout_active", 0.0);
    assert!(
        scraped
            .lines()
            .any(|l| l.starts_with("jio_rollout_info{") && l.contains("version=\"v2\",state=\"failed\"")),
        "{scraped}"
    );
    // Only what the failure left: the computes moved one at a time.
    let runs = f.runs();
    let (most, at) = max_overlap(&runs, t0);
    assert!(
        most <= 2,
        "{most} ran at once (a compute and the controller at most): {at:?}\n{runs:#?}"
    );
    signal(&service, nix::sys::signal::Signal::SIGTERM);
    let out = finish(service, Duration::from_secs(20)).await;
    assert!(
        text(&out).contains(&format!(
            "metrics of the fleet and the rollout on http://127.0.0.1:{port}/metrics"
        )),
        "{}",
        text(&out)
    );
}

/// Runs `jioctl args` on a terminal (a real pseudo terminal) of `cols` columns
/// and 24 rows, of type `term`: its exit code, and every screen it drew, as a
/// terminal shows them.
async fn on_a_terminal(url: &str, args: &[&str], cols: u16, term: &str) -> (Option<i32>, Vec<String>) {
    let t = common::terminal::Terminal::spawn_as(common::jioctl(url, args), cols, term);
    let (code, frames) = t.finish(Duration::from_secs(120)).await;
    (code, frames.into_iter().map(|f| f.text).collect())
}

/// `jioctl upgrade`'s progress on an 80-column terminal: a bar per rollout group
/// that fits the line (frames never pile up), the hosts in flight named, notes
/// stamped with the time; and timestamped lines per group when not on a terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_fits_the_terminal_with_a_bar_per_group() {
    let names = ["compute1", "compute2", "compute3", "compute4", "controller1"];
    let (_etcd, url, f) = fleet_on_etcd(&names, 1.5).await;
    let rules =
        r#"{"rolling_rules":{"roles":{"compute":2,"controller":1}},"role_order":{"compute":"controller"}}"#;
    let (code, screens) = on_a_terminal(&url, &["upgrade", "v2", "--instructions", rules], 80, "xterm").await;
    let last = screens.last().cloned().unwrap_or_default();
    assert_eq!(code, Some(0), "{last}");
    assert!(f.all_at("v2"), "{last}");
    // Every screen: at most one line per group (a frame drawn over the last, not
    // below it), none wider than the terminal.
    for s in &screens {
        for group in ["compute ", "controller "] {
            let n = s
                .lines()
                .filter(|l| l.starts_with(group) && l.contains("] "))
                .count();
            assert!(n <= 1, "{n} lines for {group:?} on one screen:\n{s}");
        }
    }
    assert!(
        screens.iter().any(|s| s
            .lines()
            .any(|l| l.starts_with("compute ") && l.contains("2 upgrading (compute"))),
        "the computes in flight are named: {last}"
    );
    let bar = |g: &str| {
        last.lines()
            .find(|l| l.starts_with(g))
            .unwrap_or_default()
            .to_string()
    };
    assert!(bar("compute ").contains("4/4"), "{last}");
    assert!(bar("controller ").contains("1/1"), "{last}");
    assert!(bar("compute ").contains(" done "), "{last}");
    assert!(
        screens.iter().any(|s| s
            .lines()
            .any(|l| l.starts_with("compute ") && l.contains(" eta "))),
        "an estimate while the computes move: {last}"
    );
    // The notes carry the time.
    assert!(last.lines().any(|l| l.contains(" UTC ")), "{last}");

    // 50 columns: a shorter bar that still fits a row and names the hosts.
    let (code, screens) = on_a_terminal(&url, &["upgrade", "v3", "--instructions", rules], 50, "xterm").await;
    let last = screens.last().cloned().unwrap_or_default();
    assert_eq!(code, Some(0), "{last}");
    for s in &screens {
        let bars: Vec<&str> = s
            .lines()
            .filter(|l| l.contains("/4 ") && l.contains(" upgrading"))
            .collect();
        assert!(bars.len() <= 1, "one bar row for the computes:\n{s}");
        // A bar that wrapped would leave its tail (the time left) on the next row.
        assert!(
            !s.lines().any(|l| l.starts_with("s ") || l.starts_with("ta ")),
            "a wrapped bar:\n{s}"
        );
    }
    // The counts take the bar's row (names are never cut mid-way); the notes
    // above it name the computes in flight.
    assert!(
        screens.iter().any(
            |s| s.lines().any(|l| l.contains("/4 ") && l.contains(" upgrading"))
                && s.contains("upgrading:")
                && s.contains("compute2")
        ),
        "the computes in flight are named on 50 columns: {last}"
    );
    // A terminal that cannot draw (TERM=dumb): the stamped lines, notes included.
    let (code, screens) = on_a_terminal(&url, &["upgrade", "v4", "--instructions", rules], 80, "dumb").await;
    let last = screens.last().cloned().unwrap_or_default();
    assert_eq!(code, Some(0), "{last}");
    let all = screens.join("\n");
    assert!(all.contains(" UTC waiting for: "), "{last}");
    assert!(all.contains(" UTC compute: 4/4 upgraded"), "{last}");

    // Not on a terminal: a stamped line per group whose counts changed.
    let out = run(&url, &["upgrade", "v5", "--instructions", rules]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stamped =
        regex::Regex::new(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC compute: \d/4 upgraded, \d upgrading")
            .unwrap();
    assert!(stdout.lines().any(|l| stamped.is_match(l)), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.ends_with("compute: 4/4 upgraded, 0 upgrading, 0 pending")),
        "{stdout}"
    );
    assert!(
        !stdout.contains('\x1b'),
        "no terminal codes in a pipe: {stdout:?}"
    );
}
