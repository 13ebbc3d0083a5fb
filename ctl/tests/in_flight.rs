//! A host counts as in flight while anything of ours runs on it, whatever the
//! registry says and whatever an operator tries: `forget-host` refuses it, a host
//! deleted from `/hosts` by hand keeps its slot, a dead agent's open run is `lost`
//! everywhere, and a bad `/rollouts/current` makes a follower wait instead of
//! ending. Real etcd, real agents; the limits are checked on the configuration
//! step's own log.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::time::Duration;

use jio_tests::inspect::{open, text, wait_for};

use common::fleet::{finish, fleet_on_etcd, keys_under, max_overlap, now, signal, spawn};
use common::run;

const THREE: [&str; 3] = ["compute1", "compute2", "compute3"];
const ONE_AT_A_TIME: &str = r#"{"rolling_rules":{"roles":{"compute":1}}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_host_refuses_a_host_in_flight_and_the_limit_holds() {
    let (etcd, url, f) = fleet_on_etcd(&THREE, 6.0).await;
    let s = open(&url).await;
    let t0 = now();
    let driver = spawn(&url, &["upgrade", "v2", "--instructions", ONE_AT_A_TIME]);
    wait_for("compute1's puppet to start", Duration::from_secs(30), || async {
        f.runs().iter().any(|r| r.version == "v2" && r.host == "compute1")
    })
    .await;
    let before = keys_under(&s, "/hosts/compute1").await;
    let out = run(&url, &["forget-host", "compute1", "--force", "-v"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("compute1 is in flight") && text(&out).contains("nothing was written"),
        "{}",
        text(&out)
    );
    assert_eq!(keys_under(&s, "/hosts/compute1").await, before);
    // Someone deletes its registration by hand: its run still holds the slot.
    for k in ["/hosts/compute1", "/running/versions/v1/compute1"] {
        let del = etcd.etcdctl(&["del", "--prefix", k]);
        assert!(del.status.success(), "{del:?}");
    }
    let st = run(&url, &["status", "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert!(
        v["hosts"]["compute1"]["state"].as_str() == Some("upgrading"),
        "an unregistered host in flight is still shown: {v:#}"
    );
    let out = finish(driver, Duration::from_secs(120)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let runs = f.runs();
    let (most, at) = max_overlap(&runs, t0);
    assert!(
        most <= 1,
        "{most} computes ran at once against a limit of 1: {at:?}\n{runs:#?}"
    );
    // Every compute moved, one after the other: the check could have failed.
    assert_eq!(runs.iter().filter(|r| r.version == "v2").count(), 3, "{runs:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_agents_open_run_is_lost_everywhere_and_keeps_its_slot() {
    let (_etcd, url, mut f) = fleet_on_etcd(&THREE, 8.0).await;
    let driver = spawn(&url, &["upgrade", "v2", "--instructions", ONE_AT_A_TIME]);
    wait_for("compute1's puppet to start", Duration::from_secs(30), || async {
        f.runs().iter().any(|r| r.version == "v2" && r.host == "compute1")
    })
    .await;
    signal(&f.daemons[0], nix::sys::signal::Signal::SIGKILL);
    let _ = f.daemons[0].wait().await;
    let s = open(&url).await;
    wait_for(
        "compute1's liveness record to expire",
        Duration::from_secs(40),
        || async { keys_under(&s, "/agents/compute1").await.is_empty() },
    )
    .await;
    let st = run(&url, &["status", "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(v["lost"]["compute"], serde_json::json!(["compute1"]), "{v:#}");
    assert_eq!(v["hosts"]["compute1"]["reason"]["code"], "lost", "{v:#}");
    assert!(
        v["hosts"]["compute1"]["reason"]["text"]
            .as_str()
            .unwrap()
            .contains("never ended"),
        "{v:#}"
    );
    assert_eq!(st.status.code(), Some(1), "a lost host: {}", text(&st));
    let human = text(&run(&url, &["status"]).await);
    assert!(human.contains("lost while in flight"), "{human}");
    // Its slot is kept: nothing else started, by Puppet's own log.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let v2: Vec<_> = f.runs().into_iter().filter(|r| r.version == "v2").collect();
    assert_eq!(v2.len(), 1, "{v2:#?}");
    signal(&driver, nix::sys::signal::Signal::SIGTERM);
    let _ = finish(driver, Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_current_rollout_value_makes_the_follower_wait_not_end() {
    let names = ["compute1", "compute2", "compute3", "compute4"];
    let (etcd, url, f) = fleet_on_etcd(&names, 3.0).await;
    let s = open(&url).await;
    let t0 = now();
    let driver = spawn(&url, &["upgrade", "v2", "--instructions", ONE_AT_A_TIME]);
    wait_for("compute1's puppet to start", Duration::from_secs(30), || async {
        f.started("v2") >= 1
    })
    .await;
    let cur = keys_under(&s, "/rollouts/current").await;
    let id = cur.values().next().unwrap().clone();
    // Not text, then an id that has no record, each for a few seconds.
    etcd.put_raw(b"/rollouts/current", b"x\xff").await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    etcd.put_raw(b"/rollouts/current", b"20260101T000000Z-v9").await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    etcd.put_raw(b"/rollouts/current", id.as_bytes()).await;
    let out = finish(driver, Duration::from_secs(120)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("/rollouts/current"), "the wait names the key: {t}");
    assert!(f.all_at("v2"));
    let (most, at) = max_overlap(&f.runs(), t0);
    assert!(most <= 1, "{most} at once: {at:?}");
}
