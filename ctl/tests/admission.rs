//! Admission (issue 14), each against a real etcd with real `jio-agent` daemons and
//! real `jioctl` processes: a held host stays behind while the rest finish, a lost
//! agent is never admitted and is named, a maintenance window closing mid-rollout,
//! a canary rollout that waits and is promoted, `min_healthy_time` holding a slot,
//! the fleet cap, and `jioctl explain` for each reason.
//!
//! Every test runs the independent invariant recorder (raw keys, not the project's
//! classification) and checks the configuration step's own log: the stand-in Puppet
//! appends a start and an end line per run to one shared file.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::time::Duration;

use futures_util::StreamExt as _;
use jio_common::keys::{Key, Schema};
use jio_common::rules::Rules;
use jio_common::store::{DynStore, WatchEvent};
use jio_tests::inspect::{open, text, wait_for};
use jio_tests::{Etcd, Recorder};

use common::fleet::{Fleet, finish, fleet_on_etcd, keys_under, max_overlap, now, spawn};
use common::{assert_says, run};

const SIX: [&str; 6] = [
    "compute1", "compute2", "compute3", "compute4", "compute5", "compute6",
];

async fn recorder(s: &DynStore, rules: &str) -> Recorder {
    Recorder::start(s.clone(), Schema::default(), Rules::parse(rules).unwrap()).await
}

/// `jioctl explain HOST`, which must succeed.
async fn explain(url: &str, host: &str) -> String {
    let out = run(url, &["explain", host]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    text(&out)
}

/// The status JSON's reason for `host`: (code, text).
async fn reason(url: &str, host: &str) -> (String, String) {
    let out = run(url, &["--json", "status"]).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(common::status_code(&v)), "{}", text(&out));
    let r = &v["reasons"][host];
    (
        r["code"].as_str().unwrap_or_default().to_string(),
        r["text"].as_str().unwrap_or_default().to_string(),
    )
}

/// Every put under `prefix` from now on, collected in the background until the
/// sender is dropped or sent to.
async fn puts_under(
    s: &DynStore,
    prefix: &str,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Vec<String>>,
) {
    let rev = s.list(&Key::new(prefix).unwrap()).await.unwrap().revision;
    let mut w = s.watch(&Key::new(prefix).unwrap(), rev + 1).await.unwrap();
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut keys = Vec::new();
        loop {
            tokio::select! {
                ev = w.next() => match ev {
                    Some(Ok(WatchEvent::Put(kv))) => keys.push(kv.key.to_string()),
                    Some(Ok(_)) => {}
                    _ => return keys,
                },
                _ = &mut stopped => return keys,
            }
        }
    });
    (stop, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_host_stays_at_its_version_while_the_rest_finish() {
    let (_etcd, url, f) = fleet_on_etcd(&SIX, 0.5).await;
    let s = open(&url).await;
    let rules = r#"{"rolling_rules":{"roles":{"compute":2}}}"#;
    let out = run(&url, &["hold", "compute2", "--reason", "disk swap"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_says(&out, "held host compute2 (disk swap)");
    // Bad input changes nothing.
    let out = run(&url, &["hold", "bad host"]).await;
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    let out = run(&url, &["release", "compute3"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("was not held"), "{}", text(&out));
    assert_eq!(text(&out).trim().lines().count(), 1, "said once: {}", text(&out));
    let (code, why) = reason(&url, "compute2").await;
    assert_eq!(code, "held", "{why}");
    assert!(why.contains("disk swap"), "{why}");
    let rec = recorder(&s, rules).await;
    let t0 = now();
    let out = run(&url, &["upgrade", "v2", "--instructions", rules]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("held back"),
        "the end names the held host: {}",
        text(&out)
    );
    // From the configuration step's own log: compute2 never ran v2, the rest did.
    let runs = f.runs();
    let v2: Vec<&str> = runs
        .iter()
        .filter(|r| r.version == "v2")
        .map(|r| r.host.as_str())
        .collect();
    assert!(!v2.contains(&"compute2"), "{runs:#?}");
    assert_eq!(v2.len(), 5, "{runs:#?}");
    assert_eq!(f.hosts[1].local_version().as_deref(), Some("v1"));
    let (most, at) = max_overlap(&runs, t0);
    assert!(most <= 2, "{at:?}");
    let record = rec.stop().await;
    assert!(record.violations.is_empty(), "{:#?}", record.violations);
    let h = run(&url, &["--json", "rollout", "history"]).await;
    let h: Vec<serde_json::Value> = serde_json::from_slice(&h.stdout).unwrap();
    assert_eq!(h[0]["state"], "done", "{h:#?}");
    let last = h[0]["changes"].as_array().unwrap().last().unwrap().clone();
    assert!(last["reason"].as_str().unwrap().contains("compute2"), "{h:#?}");
    let e = explain(&url, "compute2").await;
    assert!(
        e.contains("hold: host compute2 held by") && e.contains("disk swap"),
        "{e}"
    );
    // Released, a new rollout to the same version moves it.
    let out = run(&url, &["release", "compute2"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run(&url, &["upgrade", "v2", "--instructions", rules]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(f.all_at("v2"), "{:#?}", f.runs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_hold_keeps_every_host_of_the_role_out_and_its_dependents_wait() {
    let (_etcd, url, f) = fleet_on_etcd(&["controller1", "compute1", "compute2"], 0.3).await;
    let s = open(&url).await;
    let out = run(
        &url,
        &["hold", "--role", "controller", "--reason", "db migration"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let rules = r#"{"role_order":{"compute":"controller"},"progress_deadline":"4s"}"#;
    let rec = recorder(&s, rules).await;
    // No limit on purpose: the order alone keeps the computes waiting.
    let out = run(&url, &["upgrade", "v2", "--instructions", rules, "--force"]).await;
    // Nothing can move: the computes wait for a held controller, which never goes.
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    assert_eq!(f.started("v2"), 0, "{:#?}", f.runs());
    let (code, why) = reason(&url, "compute1").await;
    assert_eq!(code, "waiting_for", "{why}");
    assert!(why.contains("controller (1 host left)"), "{why}");
    let (code, why) = reason(&url, "controller1").await;
    assert_eq!(code, "held", "{why}");
    assert!(
        why.contains("its role controller") && why.contains("db migration"),
        "{why}"
    );
    let out = run(&url, &["release", "controller1"]).await;
    assert_says(&out, "held through its role controller");
    let out = run(&url, &["release", "--role", "controller"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run(&url, &["rollout", "resume"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run(&url, &["upgrade", "v2", "--instructions", rules]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(f.all_at("v2"), "{:#?}", f.runs());
    let record = rec.stop().await;
    assert!(record.violations.is_empty(), "{:#?}", record.violations);
    assert_eq!(record.started.first().map(String::as_str), Some("controller1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_agent_is_never_admitted_and_is_named() {
    let (_etcd, url, mut f) = fleet_on_etcd(&["compute1", "compute2", "compute3"], 0.5).await;
    let s = open(&url).await;
    // compute2's agent stops; its lease (3 s) ends.
    f.daemons[1].kill().await.unwrap();
    wait_for("compute2's lease to end", Duration::from_secs(20), || async {
        s.get(&Key::new("/agents/compute2").unwrap())
            .await
            .unwrap()
            .is_none()
    })
    .await;
    let (stop, enabled) = puts_under(&s, "/config_state/enable_puppet/host/").await;
    let rules = r#"{"rolling_rules":{"roles":{"compute":1}},"progress_deadline":"4s"}"#;
    let rec = recorder(&s, rules).await;
    let out = run(&url, &["upgrade", "v2", "--instructions", rules]).await;
    assert_eq!(
        out.status.code(),
        Some(7),
        "stuck on the lost host: {}",
        text(&out)
    );
    let t = text(&out);
    assert!(t.contains("compute2: lost: no live agent"), "{t}");
    let _ = stop.send(());
    let puts = enabled.await.unwrap();
    assert!(
        !puts.iter().any(|k| k.ends_with("/compute2")),
        "compute2 was never enabled: {puts:?}"
    );
    assert!(puts.iter().any(|k| k.ends_with("/compute1")), "{puts:?}");
    let (code, why) = reason(&url, "compute2").await;
    assert_eq!(code, "lost", "{why}");
    let st = text(&run(&url, &["status"]).await);
    assert!(st.contains("compute2") && st.contains("never admitted"), "{st}");
    let e = explain(&url, "compute2").await;
    assert!(e.contains("agent: not alive (no /agents/compute2 lease)"), "{e}");
    let out = run(&url, &["rollout", "abort"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let record = rec.stop().await;
    assert!(record.violations.is_empty(), "{:#?}", record.violations);
    assert_eq!(f.started("v2"), 2, "{:#?}", f.runs());
}

/// `HH:MM` of a Unix time (UTC).
fn hhmm(t: u64) -> String {
    format!("{:02}:{:02}", (t % 86_400) / 3600, (t % 3600) / 60)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_closing_mid_rollout_stops_admission_and_says_when_it_opens() {
    let (_etcd, url, f) = fleet_on_etcd(&SIX, 3.0).await;
    let s = open(&url).await;
    // The window closes at the next minute boundary at least 15 s away; the rollout
    // starts 10 s before it, so that some hosts go and the rest is left.
    let t = now() as u64;
    let mut close = (t / 60 + 1) * 60;
    if close - t < 15 {
        close += 60;
    }
    let rules = format!(
        r#"{{"rolling_rules":{{"roles":{{"compute":1}}}},"windows":[{{"days":"daily","start":"{}","end":"{}","tz":"UTC"}}]}}"#,
        hhmm(t - 3600),
        hhmm(close)
    );
    wait_for(
        "10 s before the window closes",
        Duration::from_secs(80),
        || async { now() as u64 + 10 >= close },
    )
    .await;
    let rec = recorder(&s, &rules).await;
    let t0 = now();
    let follower = spawn(&url, &["upgrade", "v2", "--instructions", &rules]);
    wait_for("the window to close", Duration::from_secs(30), || async {
        now() as u64 >= close + 3
    })
    .await;
    let started = f.started("v2");
    assert!(
        started >= 1,
        "some hosts went while the window was open: {:#?}",
        f.runs()
    );
    assert!(
        started < 6,
        "the window closed before every host went: {:#?}",
        f.runs()
    );
    // Nothing starts after the close (from the configuration step's own log).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let late: Vec<_> = f
        .runs()
        .into_iter()
        .filter(|r| r.start > close as f64 + 1.0)
        .collect();
    assert!(late.is_empty(), "runs started after the window closed: {late:#?}");
    let pending = SIX
        .iter()
        .find(|h| f.runs().iter().all(|r| r.host != **h || r.version != "v2"));
    let (code, why) = reason(&url, pending.unwrap()).await;
    assert_eq!(code, "outside_window", "{why}");
    assert!(why.contains("opens at") && why.contains(&hhmm(t - 3600)), "{why}");
    let e = explain(&url, pending.unwrap()).await;
    assert!(e.contains("outside the maintenance window (opens at"), "{e}");
    let st = text(&run(&url, &["status"]).await);
    assert!(st.contains("outside the maintenance window (opens at"), "{st}");
    // Not stuck: waiting for a window is on purpose.
    let j = run(&url, &["--json", "rollout", "status"]).await;
    let v: serde_json::Value = serde_json::from_slice(&j.stdout).unwrap();
    assert_eq!(v["rollout"]["state"], "running", "{v:#}");
    common::fleet::signal(&follower, nix::sys::signal::Signal::SIGINT);
    let out = finish(follower, Duration::from_secs(20)).await;
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    let out = run(&url, &["rollout", "abort"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let record = rec.stop().await;
    assert!(record.violations.is_empty(), "{:#?}", record.violations);
    let (most, _) = max_overlap(&f.runs(), t0);
    assert!(most <= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_cap_holds_across_groups() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let s = open(&url).await;
    let names = [
        "compute1", "compute2", "compute3", "db1", "db2", "db3", "mon1", "mon2",
    ];
    let f = Fleet::start(&url, &names, 1.5).await;
    // Each group may have 2 in flight, the fleet 3 (or "40%" of 8 = 3).
    let rules = r#"{"rolling_rules":{"global":2,"fleet":"40%"}}"#;
    let rec = recorder(&s, rules).await;
    let t0 = now();
    let out = run(&url, &["upgrade", "v2", "--instructions", rules]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(f.all_at("v2"));
    let record = rec.stop().await;
    assert!(record.violations.is_empty(), "{:#?}", record.violations);
    assert_eq!(record.max_fleet_in_flight, 3, "the cap was reached: {record:#?}");
    let (most, at) = max_overlap(&f.runs(), t0);
    assert!(most <= 3, "{most} ran at once against a cap of 3: {at:?}");
    assert_eq!(keys_under(&s, "/holds/").await.len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_each_reason() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let _s = open(&url).await;
    let _f = Fleet::start(
        &url,
        &[
            "controller1",
            "controller2",
            "compute1",
            "compute2",
            "db1",
            "db2",
            "mon1",
        ],
        30.0,
    )
    .await;
    // A rollout that starts controller1 (limit 1), leaves controller2 at the limit,
    // computes waiting for controllers, db frozen, mon over the fleet cap of 1.
    let rules = r#"{"rolling_rules":{"roles":{"controller":1,"db":0},"fleet":1},"role_order":{"compute":"controller"}}"#;
    let follower = spawn(&url, &["upgrade", "v2", "--instructions", rules]);
    wait_for("controller1 to start", Duration::from_secs(30), || async {
        reason(&url, "controller1").await.0 == "upgrading"
    })
    .await;
    let cases = [
        ("controller1", "upgrading", "in flight"),
        (
            "controller2",
            "limit_reached",
            "limit reached: group controller has 1/1 in flight (controller1)",
        ),
        ("compute1", "waiting_for", "waiting for controller (2 hosts left)"),
        ("db1", "frozen", "frozen: group db has limit 0"),
        ("mon1", "fleet_cap", "fleet cap reached: 1/1 hosts in flight"),
    ];
    for (host, code, want) in cases {
        let (c, why) = reason(&url, host).await;
        assert_eq!(c, code, "{host}: {why}");
        assert!(why.contains(want), "{host}: {why}");
        let e = explain(&url, host).await;
        assert!(e.contains(want), "{host}: {e}");
        assert!(
            e.contains("gate (the most specific key that is set decides)"),
            "{e}"
        );
        assert!(e.contains("agent: alive"), "{e}");
    }
    let e = explain(&url, "controller1").await;
    assert!(
        e.contains("/config_state/enable_puppet/host/controller1") && e.contains("<- decides"),
        "{e}"
    );
    let out = run(&url, &["rollout", "pause", "--reason", "lunch"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let (c, why) = reason(&url, "controller2").await;
    assert_eq!(c, "paused", "{why}");
    assert!(why.contains("lunch"), "{why}");
    let out = run(&url, &["explain", "nosuchhost"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("not known in this fleet"), "{}", text(&out));
    let out = run(&url, &["rollout", "abort"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = finish(follower, Duration::from_secs(20)).await;
    assert_eq!(out.status.code(), Some(6), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_rollout_waits_then_is_promoted_and_a_soak_promotes_by_itself() {
    let (_etcd, url, f) = fleet_on_etcd(&SIX, 1.0).await;
    let s = open(&url).await;
    let rules = r#"{"rolling_rules":{"roles":{"compute":2}},"canary":1}"#;
    let rec = recorder(&s, rules).await;
    let t0 = now();
    let follower = spawn(&url, &["upgrade", "v2", "--instructions", rules]);
    // The canary goes and finishes; the rest waits for a promotion.
    wait_for("the canary to finish", Duration::from_secs(30), || async {
        f.runs().iter().any(|r| r.version == "v2" && r.end.is_some())
            && s.get(&Key::new("/results/compute1").unwrap())
                .await
                .unwrap()
                .is_some()
    })
    .await;
    wait_for(
        "the rest to wait for the canary",
        Duration::from_secs(10),
        || async { reason(&url, "compute2").await.0 == "canary" },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(f.started("v2"), 1, "only the canary ran: {:#?}", f.runs());
    let e = explain(&url, "compute3").await;
    assert!(e.contains("canary phase"), "{e}");
    let out = run(&url, &["rollout", "promote", "--reason", "canary looks fine"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("promoted"), "{}", text(&out));
    let out = finish(follower, Duration::from_secs(120)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(f.all_at("v2"));
    let runs = f.runs();
    let canary_end = runs.iter().find(|r| r.version == "v2").unwrap().end.unwrap();
    assert!(
        runs.iter()
            .filter(|r| r.version == "v2")
            .skip(1)
            .all(|r| r.start > canary_end),
        "the rest went after the canary: {runs:#?}"
    );
    let (most, at) = max_overlap(&runs, t0);
    assert!(most <= 2, "{at:?}");
    let record = rec.stop().await;
    assert!(record.violations.is_empty(), "{:#?}", record.violations);
    // A soak: the rest goes by itself once the canary stayed healthy for 4 s.
    let soak = r#"{"rolling_rules":{"roles":{"compute":2}},"canary":1,"canary_soak":"4s"}"#;
    let out = run(&url, &["upgrade", "v3", "--instructions", soak]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("promoted"), "{}", text(&out));
    let runs: Vec<_> = f.runs().into_iter().filter(|r| r.version == "v3").collect();
    let canary_end = runs[0].end.unwrap();
    // Results carry whole seconds: at least 3 s after the canary's own end.
    assert!(
        runs[1..].iter().all(|r| r.start >= canary_end + 3.0),
        "the rest waited for the soak: {runs:#?}"
    );
    let h = run(&url, &["--json", "rollout", "history"]).await;
    let h: Vec<serde_json::Value> = serde_json::from_slice(&h.stdout).unwrap();
    assert_eq!(h[0]["promoted"]["by"], "jioctl", "{h:#?}");
    assert!(
        h[1]["promoted"]["reason"]
            .as_str()
            .unwrap()
            .contains("canary looks fine")
    );
    // An undo skips the canary phase: everything goes back at the limit.
    let out = run(&url, &["rollout", "undo"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(f.all_at("v2"), "{:#?}", f.runs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_healthy_time_keeps_the_slot_until_the_host_soaked() {
    let (_etcd, url, f) = fleet_on_etcd(&["compute1", "compute2", "compute3"], 0.5).await;
    let s = open(&url).await;
    let rules = r#"{"rolling_rules":{"roles":{"compute":1}},"min_healthy_time":"4s"}"#;
    let rec = recorder(&s, rules).await;
    let follower = spawn(&url, &["upgrade", "v2", "--instructions", rules]);
    wait_for("a host to soak", Duration::from_secs(30), || async {
        reason(&url, "compute1").await.0 == "soaking"
    })
    .await;
    let st = text(&run(&url, &["status"]).await);
    assert!(st.contains("soaking") && st.contains("min_healthy_time"), "{st}");
    let e = explain(&url, "compute1").await;
    assert!(e.contains("soaking: upgraded at"), "{e}");
    let out = finish(follower, Duration::from_secs(120)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(f.all_at("v2"));
    // From the configuration step's own log: each host started at least the soak
    // (less a second: results carry whole seconds) after the previous one ended.
    let runs: Vec<_> = f.runs().into_iter().filter(|r| r.version == "v2").collect();
    assert_eq!(runs.len(), 3, "{runs:#?}");
    for w in runs.windows(2) {
        let gap = w[1].start - w[0].end.unwrap();
        assert!(
            gap >= 3.0,
            "{} started {gap:.1} s after {} ended: {runs:#?}",
            w[1].host,
            w[0].host
        );
    }
    // The soak's health check ran (the agent recorded it after the run).
    let r: serde_json::Value = serde_json::from_str(
        &s.get(&Key::new("/results/compute3").unwrap())
            .await
            .unwrap()
            .unwrap()
            .value,
    )
    .unwrap();
    assert!(
        r["checked_at"].as_u64().unwrap() > r["at"].as_u64().unwrap(),
        "{r}"
    );
    let record = rec.stop().await;
    assert!(record.violations.is_empty(), "{:#?}", record.violations);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_a_failed_then_retrying_host() {
    let (_etcd, url, f) = fleet_on_etcd(&["compute1", "compute2", "compute3"], 0.3).await;
    f.fail("compute1", true);
    let rules = r#"{"rolling_rules":{"roles":{"compute":1}}}"#;
    let out = run(&url, &["upgrade", "v2", "--instructions", rules]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let (code, why) = reason(&url, "compute1").await;
    assert_eq!(code, "failed", "{why}");
    assert!(why.contains("failed at configured, exit 4"), "{why}");
    let (code, why) = reason(&url, "compute2").await;
    assert_eq!(code, "stopped_on_failures", "{why}");
    assert!(
        why.contains("1 failed host(s), more than max_failures 0"),
        "{why}"
    );
    let e = explain(&url, "compute1").await;
    for want in [
        "state: failed",
        "last run: to v2 failed",
        "step configured, exit 4",
        "run directory on the host:",
    ] {
        assert!(e.contains(want), "{want}: {e}");
    }
    // Fixed and re-enabled: retrying until its run reports.
    f.fail("compute1", false);
    f.set_seconds(4.0);
    let out = run(&url, &["enable-puppet", "true", "--host", "compute1"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    wait_for("compute1 to retry", Duration::from_secs(10), || async {
        reason(&url, "compute1").await.0 == "retrying"
    })
    .await;
    let e = explain(&url, "compute1").await;
    assert!(e.contains("retrying: attempt 2"), "{e}");
}

/// `/config_state/...` and other values, read raw.
async fn get(s: &DynStore, key: &str) -> Option<String> {
    s.get(&Key::new(key).unwrap()).await.unwrap().map(|kv| kv.value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holding_an_armed_host_disables_it_and_its_release_starts_nothing_outside_the_plan() {
    use nix::sys::signal::Signal;
    let (_etcd, url, f) = fleet_on_etcd(&["compute1", "compute2", "compute3"], 6.0).await;
    let s = open(&url).await;
    let rules = r#"{"rolling_rules":{"roles":{"compute":1}}}"#;
    let rec = recorder(&s, rules).await;
    // compute1's agent is frozen: it will be enabled and not start.
    let pid = |i: usize| nix::unistd::Pid::from_raw(f.daemons[i].id().unwrap() as i32);
    nix::sys::signal::kill(pid(0), Signal::SIGSTOP).unwrap();
    let t0 = now();
    let follower = spawn(&url, &["upgrade", "v2", "--instructions", rules]);
    wait_for("compute1 to be enabled", Duration::from_secs(30), || async {
        get(&s, "/config_state/enable_puppet/host/compute1")
            .await
            .as_deref()
            == Some("true")
    })
    .await;
    let out = run(&url, &["hold", "compute1", "--reason", "disk swap"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // The hold disabled it in the same transaction; its slot goes to compute2.
    assert_eq!(
        get(&s, "/config_state/enable_puppet/host/compute1")
            .await
            .as_deref(),
        Some("false")
    );
    wait_for("compute2 to start v2", Duration::from_secs(30), || async {
        f.runs().iter().any(|r| r.host == "compute2" && r.version == "v2")
    })
    .await;
    // The agent comes back: held and disabled, it does not start; its release
    // leaves it to the plan, which waits for compute2's slot.
    nix::sys::signal::kill(pid(0), Signal::SIGCONT).unwrap();
    wait_for("compute1's agent to be back", Duration::from_secs(20), || async {
        get(&s, "/agents/compute1").await.is_some()
    })
    .await;
    let out = run(&url, &["release", "compute1"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = finish(follower, Duration::from_secs(120)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(f.all_at("v2"), "{:#?}", f.runs());
    let runs = f.runs();
    let (most, at) = max_overlap(&runs, t0);
    assert!(
        most <= 1,
        "{most} computes ran at once under a limit of 1: {at:?}\n{runs:#?}"
    );
    let record = rec.stop().await;
    assert!(record.violations.is_empty(), "{:#?}", record.violations);
}
