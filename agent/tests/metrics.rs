//! The agent's Prometheus metrics against a real etcd, real `puppet apply` and
//! real `run-parts`, scraped over HTTP by a real client and checked by Prometheus's
//! own `promtool`: the versions, the gate and the level that decided, runs and
//! failures, the steps' times, the store going away and coming back, and the
//! node-exporter textfile.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use jio_common::keys::{EnableLevel, Schema};
use jio_common::names::HostName;
use jio_tests::inspect::{open, wait_for};
use jio_tests::prometheus::{check, scrape, until, value};
use jio_tests::{Etcd, Host, Puppet, free_port};
use tokio::process::Command;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_jio-agent"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_the_agent_and_pass_promtool() {
    let mut etcd = Etcd::start().await;
    let s = open(&etcd.url()).await;
    let schema = Schema::default();
    s.put(&schema.current_version(), "v1", None).await.unwrap();
    let puppet = Puppet::new();
    let m = puppet.manifest("m", "notice('converging')\n");
    let port = free_port();
    let extra = format!(
        "metrics_listen = \"127.0.0.1:{port}\"\nmetrics_textfile = \"{{dir}}/node-exporter/jio-agent.prom\"\nretry_interval = \"1h\"\nstore_retry = \"1s\""
    );
    let host = Host::new("metrics1", &etcd.url(), &puppet.command(&m), "");
    let textfile = host.dir().join("node-exporter/jio-agent.prom");
    std::fs::create_dir_all(textfile.parent().unwrap()).unwrap();
    let cfg = std::fs::read_to_string(host.config()).unwrap();
    std::fs::write(
        host.config(),
        format!(
            "{cfg}{}\n",
            extra.replace("{dir}", &host.dir().display().to_string())
        ),
    )
    .unwrap();
    let log = host.dir().join("agent.log");
    let mut agent = Command::from(host.agent(&bin(), &["run"]))
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/metrics");

    // The first converge: the versions, the gate (no key set: the default), one
    // successful upgrade and the time of each step.
    let text = until(&url, "jio_agent_last_run_success", 1.0).await;
    check(&text).unwrap();
    for (series, want) in [
        ("jio_agent_desired_version_info{version=\"v1\"}", 1.0),
        ("jio_agent_local_version_info{version=\"v1\"}", 1.0),
        ("jio_agent_gate_info{decision=\"enabled\",level=\"default\"}", 1.0),
        (
            "jio_agent_last_run_info{version=\"v1\",result=\"success\",step=\"validated\"}",
            1.0,
        ),
        ("jio_agent_runs_total{kind=\"upgrade\",result=\"success\"}", 1.0),
        ("jio_agent_failures_total", 0.0),
        ("jio_agent_upload_queue_length", 0.0),
    ] {
        assert_eq!(value(&text, series), Some(want), "{series} in\n{text}");
    }
    for step in ["configure", "validate"] {
        let took = value(
            &text,
            &format!("jio_agent_step_duration_seconds{{step=\"{step}\"}}"),
        );
        assert!(took.is_some_and(|t| t > 0.0), "{step} took {took:?} in\n{text}");
    }
    let text = until(&url, "jio_agent_decision_info{decision=\"up_to_date\"}", 1.0).await;
    assert_eq!(value(&text, "jio_agent_store_up"), Some(1.0), "{text}");

    // The host key says no to v2: the gate names the host level, nothing runs.
    let h = HostName::new("metrics1").unwrap();
    s.put(&schema.enable(&EnableLevel::Host(h.clone())), "false", None)
        .await
        .unwrap();
    s.put(&schema.current_version(), "v2", None).await.unwrap();
    let text = until(
        &url,
        "jio_agent_gate_info{decision=\"disabled\",level=\"host\"}",
        1.0,
    )
    .await;
    check(&text).unwrap();
    assert_eq!(
        value(&text, "jio_agent_desired_version_info{version=\"v2\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(&text, "jio_agent_local_version_info{version=\"v1\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(&text, "jio_agent_desired_version_info{version=\"v1\"}"),
        None,
        "{text}"
    );

    // Enabled again with a validation that fails: one failure, the last run failed.
    host.set_validation(false);
    s.put(&schema.enable(&EnableLevel::Host(h)), "true", None)
        .await
        .unwrap();
    let text = until(&url, "jio_agent_failures_total", 1.0).await;
    check(&text).unwrap();
    assert_eq!(value(&text, "jio_agent_last_run_success"), Some(0.0), "{text}");
    assert_eq!(
        value(
            &text,
            "jio_agent_last_run_info{version=\"v2\",result=\"failed\",step=\"validated\"}"
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(&text, "jio_agent_runs_total{kind=\"upgrade\",result=\"failed\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(&text, "jio_agent_gate_info{decision=\"enabled\",level=\"host\"}"),
        Some(1.0),
        "{text}"
    );

    // The textfile for node-exporter says the same, and passes promtool too.
    wait_for(
        "the textfile to show the failure",
        Duration::from_secs(30),
        || {
            let t = std::fs::read_to_string(&textfile).unwrap_or_default();
            async move { value(&t, "jio_agent_failures_total") == Some(1.0) }
        },
    )
    .await;
    check(&std::fs::read_to_string(&textfile).unwrap()).unwrap();

    // Only GET /metrics is served.
    let c = reqwest::Client::new();
    let root = c.get(format!("http://127.0.0.1:{port}/")).send().await.unwrap();
    assert_eq!(root.status(), 404);
    let post = c.post(&url).send().await.unwrap();
    assert_eq!(post.status(), 405);
    let ok = c.get(&url).send().await.unwrap();
    assert_eq!(
        ok.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );

    // The store goes away: the agent says so, counts it, and recovers.
    etcd.kill(0);
    // A write on a watched key while etcd is down is impossible; a resync pass is
    // what finds the store gone, so make the next pass come now by waiting for the
    // watch to fail.
    let text = until(&url, "jio_agent_store_up", 0.0).await;
    check(&text).unwrap();
    assert!(
        value(&text, "jio_agent_store_errors_total").is_some_and(|n| n >= 1.0),
        "{text}"
    );
    etcd.restart(0).await;
    until(&url, "jio_agent_store_up", 1.0).await;
    // Its watches reconnected: counted.
    let mut scraped = String::new();
    for _ in 0..300 {
        scraped = scrape(&url).await;
        if value(&scraped, "jio_agent_store_reconnects_total").is_some_and(|n| n >= 1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        value(&scraped, "jio_agent_store_reconnects_total").is_some_and(|n| n >= 1.0),
        "{scraped}"
    );
    // The watches follow the store that came back: a new version is taken up at
    // once (the resync is minutes away).
    host.set_validation(true);
    s.put(&schema.current_version(), "v3", None).await.unwrap();
    let text = until(&url, "jio_agent_local_version_info{version=\"v3\"}", 1.0).await;
    check(&text).unwrap();

    // A port already taken does not stop an agent: it says so, upgrades all the
    // same, and serves once the port is free.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port2 = taken.local_addr().unwrap().port();
    let m2 = puppet.manifest("m2", "notice('converging')\n");
    let host2 = Host::new(
        "metrics2",
        &etcd.url(),
        &puppet.command(&m2),
        &format!("metrics_listen = \"{port2}\""),
    );
    let log2 = host2.dir().join("agent.log");
    let mut agent2 = Command::from(host2.agent(&bin(), &["run"]))
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log2).unwrap()))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_for(
        "the second agent to upgrade to v3",
        Duration::from_secs(60),
        || {
            let v = host2.local_version();
            async move { v.as_deref() == Some("v3") }
        },
    )
    .await;
    let said = std::fs::read_to_string(&log2).unwrap();
    assert!(
        said.contains("cannot serve metrics on metrics_listen")
            && said.contains(&format!("127.0.0.1:{port2}")),
        "{said}"
    );
    drop(taken);
    let text = until(
        &format!("http://127.0.0.1:{port2}/metrics"),
        "jio_agent_local_version_info{version=\"v3\"}",
        1.0,
    )
    .await;
    check(&text).unwrap();
    agent2.kill().await.unwrap();

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), agent.wait())
        .await
        .unwrap()
        .unwrap();
    let log = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("serving metrics on /metrics"), "{log}");
}
