//! What a running agent costs a real etcd, read from etcd's own metrics: one gRPC
//! watch stream per agent carrying its watches (not a stream per key), a lease
//! keep-alive stream, and no watch on `/active_roles/` (every agent writes there
//! when it registers, so a watch of it by every agent costs the store an event per
//! host per registration). The Hiera data is read before a run instead.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use jio_common::keys::Schema;
use jio_tests::etcd::metric_sum;
use jio_tests::inspect::{open, wait_for};
use jio_tests::{Etcd, Host};
use tokio::process::Command;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_jio-agent"))
}

/// (watch streams, watchers, open gRPC streams) as etcd counts them.
async fn streams(etcd: &Etcd) -> (f64, f64, f64) {
    let text = etcd.metrics(0).await.unwrap();
    let open = metric_sum(&text, "grpc_server_started_total", &["stream\""])
        - metric_sum(&text, "grpc_server_handled_total", &["stream\""]);
    (
        metric_sum(&text, "etcd_debugging_mvcc_watch_stream_total", &[]),
        metric_sum(&text, "etcd_debugging_mvcc_watcher_total", &[]),
        open,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_holds_one_watch_stream_and_no_watch_on_the_fleets_addresses() {
    let etcd = Etcd::start().await;
    let s = open(&etcd.url()).await;
    let schema = Schema::default();
    s.put(&schema.current_version(), "v1", None).await.unwrap();
    assert_eq!(
        streams(&etcd).await,
        (0.0, 0.0, 0.0),
        "nothing watches before the agents start"
    );
    let hosts: Vec<Host> = (1..=3)
        .map(|i| Host::new(&format!("compute{i}"), &etcd.url(), &["true".to_string()], ""))
        .collect();
    let mut daemons = Vec::new();
    for h in &hosts {
        daemons.push(
            Command::from(h.agent(&bin(), &["run"]))
                .stdout(Stdio::null())
                .stderr(Stdio::from(
                    std::fs::File::create(h.dir().join("agent.log")).unwrap(),
                ))
                .kill_on_drop(true)
                .spawn()
                .unwrap(),
        );
    }
    // Each converges to v1 (its Hiera data read before the run), then idles.
    for h in &hosts {
        wait_for("every agent to reach v1", Duration::from_secs(60), || async {
            h.local_version().as_deref() == Some("v1")
        })
        .await;
        let hiera = std::fs::read_to_string(h.hiera_file()).unwrap_or_default();
        assert!(hiera.contains("etcdlookup::active_roles"), "{hiera}");
    }
    wait_for("the agents' watches", Duration::from_secs(20), || async {
        streams(&etcd).await.0 >= 3.0
    })
    .await;
    let (watch_streams, watchers, open_streams) = streams(&etcd).await;
    // The desired version, three enable keys, two hold keys, the current rollout and
    // the command inbox: eight watches, on one stream.
    assert_eq!(watch_streams, 3.0, "one watch stream per agent");
    assert_eq!(watchers, 24.0, "eight watches per agent, none on /active_roles/");
    assert!(
        open_streams <= 6.0,
        "a watch stream and a keep-alive stream per agent, {open_streams} open"
    );
    // Registrations elsewhere in the fleet reach no agent: etcd sends nothing.
    let before = metric_sum(
        &etcd.metrics(0).await.unwrap(),
        "etcd_debugging_mvcc_events_total",
        &[],
    );
    for i in 0..50 {
        let key = format!("/active_roles/compute/new{i}/eth0");
        s.put(&jio_common::keys::Key::new(key).unwrap(), "10.9.0.1", None)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = metric_sum(
        &etcd.metrics(0).await.unwrap(),
        "etcd_debugging_mvcc_events_total",
        &[],
    );
    assert_eq!(after, before, "no watcher received the 50 registrations");
    for mut d in daemons {
        let _ = d.kill().await;
    }
}
