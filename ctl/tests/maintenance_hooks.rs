//! Maintenance hooks around a host's slot (issue 34): the driver runs each role's
//! `before` hook before the host is enabled and its `after` hook once the host
//! reported success, and the slot is held from the start of one to the end of the
//! other. Real etcd, real agents, real jioctl; stand-in hooks log their own start
//! and end, and the stand-in Puppet its runs, so that the limits are judged from
//! those logs alone.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::time::Duration;

use jio_tests::inspect::{open, text, wait_for};

use common::fleet::{Fleet, finish, fleet_on_etcd, keys_under, signal};
use common::hooks::{Hooks, max_slots_at_once, values_ever};
use common::{assert_says, jioctl, run};

const ONE_AT_A_TIME: &str = r#"{"rolling_rules":{"roles":{"compute":1}}}"#;

/// `jioctl --config <config> <args>` on `url`, with a store URL and an etcd
/// client setting in its environment that no hook may see.
fn driver(url: &str, config: &std::path::Path, args: &[&str]) -> tokio::process::Child {
    let mut c = jioctl(url, &[&["--config", config.to_str().unwrap()], args].concat());
    c.env("JIO_STORE", url)
        .env("ETCDCTL_ENDPOINTS", url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    c.spawn().unwrap()
}

/// Checks, from the hooks' log and Puppet's, that each host's v2 run happened
/// inside its slot: after its `before` hook succeeded and before its `after` hook
/// started.
#[track_caller]
fn runs_inside_their_slots(hooks: &Hooks, f: &Fleet) {
    let runs = hooks.runs();
    for r in f.runs().iter().filter(|r| r.version == "v2") {
        let before_end = runs
            .iter()
            .filter(|h| h.host == r.host && h.hook == "before" && h.how.as_deref() == Some("exit 0"))
            .find_map(|h| h.end);
        let after_start = runs
            .iter()
            .find(|h| h.host == r.host && h.hook == "after")
            .map(|h| h.start);
        let end = r.end.unwrap();
        assert!(
            before_end.is_some_and(|b| b <= r.start) && after_start.is_none_or(|a| a >= end),
            "{}'s run {}..{end} is not inside its slot: {runs:#?}",
            r.host,
            r.start
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_limit_of_one_hosts_are_drained_one_at_a_time_around_their_runs() {
    let (_etcd, url, f) = fleet_on_etcd(&["compute1", "compute2", "compute3"], 0.5).await;
    let hooks = Hooks::new(0.3);
    let config = hooks.config("1m");
    let d = driver(&url, &config, &["upgrade", "v2", "--instructions", ONE_AT_A_TIME]);
    // While compute1 drains, everyone can see it.
    wait_for(
        "compute1's before hook to start",
        Duration::from_secs(30),
        || async { hooks.runs().iter().any(|r| r.host == "compute1") },
    )
    .await;
    let out = finish(d, Duration::from_secs(120)).await;
    let intervals = hooks.intervals();
    let (most, at) = max_slots_at_once(&intervals);
    assert!(
        most <= 1,
        "{most} hosts were between before and after at once: {at:?}\n{intervals:#?}"
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Every compute went through both hooks and its run: the check could fail.
    assert_eq!(intervals.len(), 3, "{intervals:#?}");
    assert!(
        intervals.iter().all(|(_, _, end)| end.is_some()),
        "{intervals:#?}"
    );
    assert_eq!(f.started("v2"), 3);
    runs_inside_their_slots(&hooks, &f);
    for r in hooks.runs() {
        assert!(
            r.env.contains("role=compute version=v2 rollout=")
                && r.env.contains(&format!("hook={}", r.hook))
                && r.env.contains("store=none etcdctl=none"),
            "a hook's environment: {r:?}"
        );
    }
    let said = text(&out);
    assert!(
        said.contains("admitted compute1: its before hook starts"),
        "{said}"
    );
    assert!(said.contains("compute3: after hook succeeded"), "{said}");
}

/// `status --json` of the fleet.
async fn status(url: &str) -> serde_json::Value {
    let st = run(url, &["status", "--json"]).await;
    serde_json::from_slice(&st.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_before_hook_fails_the_host_which_is_never_enabled() {
    let (_etcd, url, f) = fleet_on_etcd(&["compute1", "compute2"], 0.3).await;
    let hooks = Hooks::new(0.2);
    hooks.fail("before", "compute1");
    let config = hooks.config("1m");
    // max_failures 0: its failure stops the rollout, as a failed run would.
    let d = driver(&url, &config, &["upgrade", "v2", "--instructions", ONE_AT_A_TIME]);
    let out = finish(d, Duration::from_secs(60)).await;
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("stopped: 1 host(s) failed (max_failures 0)")
            && said.contains("compute1: before hook failed (exit 3): nova: 2 instances left on compute1"),
        "{said}"
    );
    // Never enabled, never run: by the store's history and Puppet's own log.
    let s = open(&url).await;
    let keys = values_ever(&s, "/config_state/enable_puppet/host/compute1").await;
    assert!(!keys.iter().any(|v| v == "true"), "{keys:?}");
    assert_eq!(f.started("v2"), 0, "{:#?}", f.runs());
    // Nothing more was admitted after the failure.
    assert!(
        hooks.runs().iter().all(|r| r.host == "compute1"),
        "{:#?}",
        hooks.runs()
    );
    let v = status(&url).await;
    assert_eq!(v["failed"]["compute"], serde_json::json!(["compute1"]), "{v:#}");
    let why = v["hosts"]["compute1"]["reason"]["text"].as_str().unwrap();
    assert!(why.contains("before hook failed (exit 3)"), "{why}");
    assert_eq!(v["hosts"]["compute1"]["hook"]["state"], "failed", "{v:#}");
    let log = v["hosts"]["compute1"]["log"].as_str().unwrap();
    let kept = std::fs::read_to_string(log).unwrap();
    assert!(
        kept.contains("nova: 2 instances left on compute1"),
        "{log}: {kept}"
    );
    assert!(log.starts_with(hooks.state_dir().to_str().unwrap()), "{log}");
    let human = text(&run(&url, &["status"]).await);
    assert!(human.contains("failed: its before hook failed"), "{human}");
    let failures = run(&url, &["get-failures", "--hosts"]).await;
    assert_eq!(failures.status.code(), Some(1), "{}", text(&failures));
    assert!(
        text(&failures).contains("compute1\tcompute\tbefore hook\tbefore hook failed (exit 3)"),
        "{}",
        text(&failures)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_after_hook_fails_the_upgraded_host_and_its_log_is_in_swift() {
    let ((_etcd, url, f), swift) = tokio::join!(fleet_on_etcd(&["compute1"], 0.3), jio_tests::Swift::start());
    let hooks = Hooks::new(0.2);
    hooks.fail("after", "compute1");
    let section = format!(
        "[swift]\nauth_url = \"{}\"\nuser = \"fleet:uploader\"\nkey_file = \"{}\"\ncontainer = \"runlogs\"\n",
        swift.auth_url(),
        swift.key_file("s3cr3t").display()
    );
    let config = hooks.config_with("1m", &section);
    let d = driver(&url, &config, &["upgrade", "v2", "--instructions", ONE_AT_A_TIME]);
    let out = finish(d, Duration::from_secs(60)).await;
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("compute1: after hook failed (exit 3)"), "{said}");
    assert_eq!(f.started("v2"), 1, "it was upgraded before its after hook ran");
    runs_inside_their_slots(&hooks, &f);
    let v = status(&url).await;
    assert_eq!(v["failed"]["compute"], serde_json::json!(["compute1"]), "{v:#}");
    let history = text(&run(&url, &["rollout", "history"]).await);
    assert!(history.contains("failed"), "{history}");
    let explained = text(&run(&url, &["explain", "compute1"]).await);
    assert!(
        explained.contains("maintenance hook: after hook failed (exit 3)"),
        "{explained}"
    );
    // Its log was uploaded as run logs are, and the record links it.
    let link = v["hosts"]["compute1"]["hook"]["log"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        link.contains("/runlogs/compute1/v2/") && link.ends_with("-hook-after.log"),
        "{link}"
    );
    let body = swift.get(&link).await;
    assert!(body.contains("nova: 2 instances left on compute1"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_killed_in_a_hook_is_replaced_and_the_hook_runs_again() {
    let (_etcd, url, f) = fleet_on_etcd(&["compute1", "compute2"], 0.3).await;
    let hooks = Hooks::new(0.2);
    hooks.hang_once("before", "compute1");
    let config = hooks.config("1m");
    let a = driver(&url, &config, &["upgrade", "v2", "--instructions", ONE_AT_A_TIME]);
    wait_for(
        "compute1's before hook to start",
        Duration::from_secs(30),
        || async { hooks.runs().iter().any(|r| r.host == "compute1") },
    )
    .await;
    // A driver service stands by (the lock is held) and shows the hook running.
    let port = jio_tests::free_port();
    let addr = format!("127.0.0.1:{port}");
    let b = driver(
        &url,
        &config,
        &["drive", "--lease", "3s", "--metrics-listen", &addr],
    );
    let running = "jio_fleet_hooks{hook=\"before\",state=\"running\"}";
    let scraped = jio_tests::prometheus::until(&format!("http://{addr}/metrics"), running, 1.0).await;
    assert!(
        scraped.contains("jio_fleet_hook_running_since_seconds{host=\"compute1\",hook=\"before\"}"),
        "{scraped}"
    );
    let v = status(&url).await;
    let why = v["hosts"]["compute1"]["reason"]["text"].as_str().unwrap();
    assert!(why.contains("draining: before hook running since"), "{why}");
    signal(&a, nix::sys::signal::Signal::SIGKILL);
    let _ = finish(a, Duration::from_secs(10)).await;
    let s = open(&url).await;
    wait_for(
        "the service to finish the rollout",
        Duration::from_secs(90),
        || async { keys_under(&s, "/rollouts/current").await.is_empty() },
    )
    .await;
    signal(&b, nix::sys::signal::Signal::SIGTERM);
    let out = finish(b, Duration::from_secs(30)).await;
    let said = text(&out);
    assert!(
        said.contains("compute1: its before hook was left running by"),
        "{said}"
    );
    // Run again, never beside the first: that one was stopped before it started.
    let before: Vec<_> = hooks
        .runs()
        .into_iter()
        .filter(|r| r.host == "compute1" && r.hook == "before")
        .collect();
    assert_eq!(before.len(), 2, "{before:#?}");
    assert_eq!(before[0].how.as_deref(), Some("stopped"), "{before:#?}");
    assert!(before[0].end.unwrap() <= before[1].start, "{before:#?}");
    let intervals = hooks.intervals();
    let (most, at) = max_slots_at_once(&intervals);
    assert!(most <= 1, "{most} hosts at once: {at:?}\n{intervals:#?}");
    assert_eq!(
        intervals.iter().filter(|(_, _, e)| e.is_some()).count(),
        2,
        "{intervals:#?}"
    );
    runs_inside_their_slots(&hooks, &f);
    let v = status(&url).await;
    assert_eq!(
        v["upgraded"]["compute"],
        serde_json::json!(["compute1", "compute2"]),
        "{v:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_hook_configuration_is_refused_and_nothing_is_written() {
    let (_etcd, url, _f) = fleet_on_etcd(&["compute1"], 0.1).await;
    let hooks = Hooks::new(0.1);
    let s = open(&url).await;
    let watched = [
        "/current_version",
        "/rollouts/",
        "/config_state/",
        "/hooks/",
        "/locks/",
    ];
    let mut before = Vec::new();
    for k in watched {
        before.push(keys_under(&s, k).await);
    }
    let script = hooks.script().display().to_string();
    // (table, what the error names)
    let cases = [
        (
            "[hooks.compute]\nbefore = []\n",
            "hooks.compute.before: an empty argument list",
        ),
        (
            &format!("[hooks.compute]\nbefore = [\"{script}\"]\ntimeout = \"ten minutes\"\n"),
            "hooks.compute.timeout: invalid duration",
        ),
        (&format!("[hooks.compute]\nbefroe = [\"{script}\"]\n"), "befroe"),
        (
            &format!("[hooks.\"com pute\"]\nbefore = [\"{script}\"]\n"),
            "is not a role name",
        ),
    ];
    for (table, names) in cases {
        let config = hooks.config_text(table);
        for args in [
            &["upgrade", "v2", "--instructions", ONE_AT_A_TIME][..],
            &["drive"][..],
        ] {
            let out = finish(driver(&url, &config, args), Duration::from_secs(20)).await;
            let said = text(&out);
            assert_eq!(out.status.code(), Some(64), "{table} {args:?}: {said}");
            assert!(
                said.contains(config.to_str().unwrap()) && said.contains(names),
                "{table}: {said}"
            );
        }
    }
    // Composable rollouts run no hooks: refused before anything is written.
    let config = hooks.config("1m");
    let rules = r#"{"roles_data":{"compute":["nova_compute"]}}"#;
    let out = finish(
        driver(&url, &config, &["upgrade", "v2", "--instructions", rules]),
        Duration::from_secs(20),
    )
    .await;
    let said = text(&out);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(
        said.contains("composable rollouts run no maintenance hooks") && said.contains("nothing was written"),
        "{said}"
    );
    for (k, was) in watched.iter().zip(before) {
        assert_eq!(keys_under(&s, k).await, was, "{k}");
    }
    assert!(hooks.runs().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_stuck_in_its_hook_is_named_when_the_rollout_is_stuck() {
    let (_etcd, url, f) = fleet_on_etcd(&["compute1", "compute2"], 0.1).await;
    let hooks = Hooks::new(0.1);
    hooks.hang_once("before", "compute1");
    let config = hooks.config("10m");
    let rules = r#"{"rolling_rules":{"roles":{"compute":1}},"progress_deadline":"3s"}"#;
    let d = driver(&url, &config, &["upgrade", "v2", "--instructions", rules]);
    let out = finish(d, Duration::from_secs(60)).await;
    let said = text(&out);
    assert_eq!(out.status.code(), Some(7), "{said}");
    assert!(
        said.contains("is stuck")
            && said.contains("compute1: upgrading: draining: before hook running since"),
        "{said}"
    );
    // The follower stopped its hook as it left: the next driver runs it again.
    assert!(said.contains("stopped 1 maintenance hook(s)"), "{said}");
    let before: Vec<_> = hooks.runs().into_iter().filter(|r| r.hook == "before").collect();
    assert_eq!(before.len(), 1, "{before:#?}");
    assert_eq!(before[0].how.as_deref(), Some("stopped"), "{before:#?}");
    assert_eq!(f.started("v2"), 0);
    // Its record still says the hook runs: its slot cannot be forgotten.
    let s = open(&url).await;
    let record = keys_under(&s, "/hooks/").await;
    let out = run(&url, &["forget-host", "compute1", "--force"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_says(
        &out,
        "compute1 is in its maintenance hook's slot (before hook running since",
    );
    assert_eq!(keys_under(&s, "/hooks/").await, record);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_hook_record_keeps_its_slot_is_named_and_never_ends_the_driver() {
    let (etcd, url, f) = fleet_on_etcd(&["compute1", "compute2"], 0.1).await;
    let hooks = Hooks::new(0.1);
    let config = hooks.config("1m");
    etcd.put_raw(b"/hooks/compute2", b"{not json").await;
    let two = r#"{"rolling_rules":{"roles":{"compute":2}}}"#;
    let d = driver(
        &url,
        &config,
        &["upgrade", "v2", "--instructions", two, "--timeout", "8s"],
    );
    let out = finish(d, Duration::from_secs(60)).await;
    let said = text(&out);
    // compute1 went through; compute2 holds its slot, named, and the driver went on
    // until its --timeout.
    assert_eq!(out.status.code(), Some(5), "{said}");
    assert!(
        said.contains("/hooks/compute2") && said.contains("cannot be read"),
        "{said}"
    );
    assert_eq!(
        f.runs()
            .iter()
            .filter(|r| r.version == "v2")
            .map(|r| r.host.as_str())
            .collect::<Vec<_>>(),
        ["compute1"]
    );
    assert!(
        hooks.runs().iter().all(|r| r.host == "compute1"),
        "{:#?}",
        hooks.runs()
    );
    let v = status(&url).await;
    assert_eq!(v["hosts"]["compute2"]["state"], "upgrading", "{v:#}");
    assert!(v["problems"].to_string().contains("/hooks/compute2"), "{v:#}");
    // Deleted by an operator: the next driver finishes the rollout.
    let del = etcd.etcdctl(&["del", "/hooks/compute2"]);
    assert!(del.status.success(), "{del:?}");
    let d = driver(&url, &config, &["upgrade", "v2", "--instructions", two]);
    let out = finish(d, Duration::from_secs(60)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(f.started("v2"), 2);
}
