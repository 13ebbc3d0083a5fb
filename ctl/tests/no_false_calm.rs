//! Screens and waits that say what really happens: a rollout nobody drives is
//! said at the top of `status` and `explain`; an agent down on an upgraded host is
//! named; a follower whose stdout closes says it stopped and who drives now; the
//! canary soak says when it ends; a fleet command waiting for slots a rollout's
//! hosts hold does not claim that nothing can move; values no program of ours
//! writes are named, not shown as hosts. Real etcd, real agents.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::process::Stdio;
use std::time::Duration;

use jio_tests::Etcd;
use jio_tests::inspect::{open, text, wait_for};

use common::commands::{Actions, wait_started};
use common::fleet::{Fleet, finish, fleet_on_etcd, keys_under, signal, spawn};
use common::{assert_says, jioctl, run};

const COMPUTE_1: &str = r#"{"rolling_rules":{"roles":{"compute":1}}}"#;

fn status_json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(out)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_nobody_drives_is_said_at_the_top() {
    let (_etcd, url, f) = fleet_on_etcd(&["compute1", "compute2"], 0.5).await;
    let out = run(&url, &["upgrade", "v2", "--detach", "--instructions", COMPUTE_1]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let st = text(&run(&url, &["status"]).await);
    let first = st.lines().take(3).collect::<Vec<_>>().join("\n");
    assert!(
        first.contains("NOT DRIVEN: rollout") && first.contains("`jioctl drive`"),
        "{st}"
    );
    assert!(!st.contains("admitted: its role is enabled"), "{st}");
    assert!(st.contains("no driver is running"), "{st}");
    let ex = text(&run(&url, &["explain", "compute1"]).await);
    assert!(ex.contains("NOT DRIVEN"), "{ex}");
    assert!(!ex.contains("admitted: its role is enabled"), "{ex}");
    let v = status_json(&run(&url, &["status", "--json"]).await);
    assert!(
        v["not_driven"].as_str().is_some_and(|l| l.contains("NOT DRIVEN")),
        "{v:#}"
    );
    // Nothing moved: nobody drives it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(f.started("v2"), 0);
    // Driven, the banner is gone.
    let driver = spawn(&url, &["upgrade", "v2", "--instructions", COMPUTE_1]);
    let out = finish(driver, Duration::from_secs(60)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!text(&run(&url, &["status"]).await).contains("NOT DRIVEN"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_down_on_an_upgraded_host_is_named_and_bad_values_are_not_hosts() {
    let (etcd, url, mut f) = fleet_on_etcd(&["compute1", "compute2", "compute3"], 0.1).await;
    let s = open(&url).await;
    signal(&f.daemons[1], nix::sys::signal::Signal::SIGKILL);
    let _ = f.daemons[1].wait().await;
    wait_for(
        "compute2's liveness record to expire",
        Duration::from_secs(40),
        || async { keys_under(&s, "/agents/compute2").await.is_empty() },
    )
    .await;
    let st = run(&url, &["status"]).await;
    assert_says(&st, "agents down on 1 upgraded host(s): compute2");
    let v = status_json(&run(&url, &["status", "--json"]).await);
    assert_eq!(v["agents_down"], serde_json::json!(["compute2"]), "{v:#}");
    // A running version for a name no host can have: a problem naming its key.
    etcd.put_raw(b"/running/versions/v1/Bad_Host", b"").await;
    let v = status_json(&run(&url, &["status", "--json"]).await);
    assert!(v["hosts"].get("Bad_Host").is_none(), "{v:#}");
    assert!(
        v["lost"]
            .as_object()
            .unwrap()
            .values()
            .all(|hs| !hs.to_string().contains("Bad_Host"))
    );
    assert!(
        v["problems"]
            .to_string()
            .contains("/running/versions/v1/Bad_Host"),
        "{v:#}"
    );
    // An invalid desired version is shown as such, not as unset.
    etcd.put_raw(b"/current_version", b"v\xff2").await;
    let st = text(&run(&url, &["status"]).await);
    assert!(st.contains("current version: (invalid:"), "{st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_whose_output_closes_says_it_stopped_and_who_drives_now() {
    let (_etcd, url, f) = fleet_on_etcd(&["compute1", "compute2", "compute3"], 2.0).await;
    let mut child = jioctl(&url, &["upgrade", "v2", "--instructions", COMPUTE_1])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("compute1 to start", Duration::from_secs(30), || async {
        f.started("v2") >= 1
    })
    .await;
    // The reader leaves, as `less` does when one quits it.
    drop(child.stdout.take());
    let out = finish(child, Duration::from_secs(60)).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{err}");
    assert!(
        err.contains("stopped driving rollout") && err.contains("nobody drives it now"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_canary_soak_says_when_it_ends() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let _f = Fleet::start(&url, &["compute1", "compute2", "compute3"], 0.3).await;
    let rules = r#"{"rolling_rules":{"roles":{"compute":1}},"canary":1,"canary_soak":"10m"}"#;
    let out = run(
        &url,
        &["upgrade", "v2", "--instructions", rules, "--timeout", "12s"],
    )
    .await;
    let t = text(&out);
    assert_eq!(out.status.code(), Some(5), "{t}");
    assert!(t.contains("the canaries soak until"), "{t}");
    assert!(!t.contains("waits for promotion"), "{t}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_waiting_for_a_rollouts_slots_does_not_cry_wolf() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1", "compute2"], 6.0, |_| a.config(false)).await;
    let driver = spawn(&url, &["upgrade", "v2", "--instructions", COMPUTE_1]);
    wait_for("compute1's puppet to start", Duration::from_secs(30), || async {
        f.started("v2") >= 1
    })
    .await;
    // compute1 holds the compute slot for the rollout: the command waits for it.
    let out = run(
        &url,
        &[
            "run",
            "--role",
            "compute",
            "--instructions",
            COMPUTE_1,
            "restart",
            "web",
        ],
    )
    .await;
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(!t.contains("nothing can move without an operator"), "{t}");
    assert!(!t.contains("nobody drives it"), "{t}");
    wait_started(&a, "compute2").await;
    let _ = finish(driver, Duration::from_secs(60)).await;
}
