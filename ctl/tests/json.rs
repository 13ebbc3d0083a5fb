//! `--json` on every subcommand: stdout holds one JSON document (the words for
//! people go to stderr), objects carry `"schema": 1`, and `status --watch` is JSON
//! lines with a `type`. Real agents on a real etcd; every document parsed.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::process::Stdio;
use std::time::Duration;

use jio_tests::Etcd;
use jio_tests::inspect::text;
use serde_json::Value;
use tokio::io::AsyncBufReadExt as _;

use common::fleet::Fleet;
use common::{jioctl, run};

/// `jioctl --json ARGS`: its exit code and its stdout as one JSON document.
async fn doc(url: &str, args: &[&str]) -> (Option<i32>, Value) {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = jioctl(url, &all).stdin(Stdio::null()).output().await.unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "jioctl {all:?}: stdout is not one JSON document ({e}): {}",
            text(&out)
        )
    });
    (out.status.code(), v)
}

/// `jioctl --json status --watch`, and its lines (it is killed when dropped).
fn watch_json(
    url: &str,
) -> (
    tokio::process::Child,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) {
    let mut watch = jioctl(url, &["--json", "status", "--watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = tokio::io::BufReader::new(watch.stdout.take().unwrap()).lines();
    (watch, lines)
}

/// An object with the schema version, as every document of ours (not the
/// original's plain shapes) is.
fn ours(args: &[&str], v: &Value) {
    assert_eq!(v["schema"], 1, "{args:?}: {v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subcommand_prints_one_json_document() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let _f = Fleet::start(&url, &["controller1", "compute1", "compute2"], 0.3).await;
    // A followed rollout: its progress lines used to come before the document.
    let rules = r#"{"rolling_rules":{"global":1}}"#;
    let (code, v) = doc(&url, &["upgrade", "v1", "--instructions", rules]).await;
    assert_eq!(code, Some(0), "{v}");
    ours(&["upgrade"], &v);
    // The fleet already runs v1: nothing started, said in the same document.
    assert_eq!(v["already_done"], true, "{v}");
    assert_eq!(v["current_version"], "v1");
    assert_eq!(v["upgraded"]["compute"].as_array().unwrap().len(), 2, "{v}");
    // Each host in detail.
    let h = &v["hosts"]["compute1"];
    assert_eq!(h["role"], "compute", "{h}");
    assert_eq!(h["state"], "upgraded", "{h}");
    assert!(
        h["agent"]["state"].is_string() && h["agent"]["since"].is_u64(),
        "{h}"
    );
    assert_eq!(h["versions"], serde_json::json!(["v1"]), "{h}");
    assert_eq!(h["last_run"]["version"], "v1", "{h}");

    let ok = Some(0);
    let cases: Vec<(Vec<&str>, Option<i32>, bool)> = vec![
        (vec!["current-version"], ok, true),
        (vec!["status"], ok, true),
        (vec!["status", "--role", "compute"], ok, true),
        (vec!["explain", "compute1"], ok, true),
        (vec!["running-versions"], ok, false),
        (vec!["hosts-at-version", "v1"], ok, false),
        (vec!["verify-hosts", "v1", "compute1", "compute2"], ok, false),
        (vec!["check-single-version", "v1"], ok, false),
        (vec!["get-failures"], ok, false),
        (vec!["get-failures", "--hosts"], ok, false),
        (vec!["rollout", "status"], ok, true),
        (vec!["rollout", "history"], ok, false),
        (vec!["upgrade", "v2", "--noop", "--instructions", rules], ok, true),
        (vec!["enable-puppet", "false", "--host", "compute1"], ok, true),
        (vec!["enable-puppet", "--delete", "--host", "compute1"], ok, true),
        (vec!["hold", "compute2", "--reason", "disk"], ok, true),
        (vec!["release", "compute2"], ok, true),
        (vec!["trigger-update", "v1"], ok, true),
        (vec!["commands", "list"], ok, false),
        (
            vec![
                "upgrade",
                "v2",
                "--detach",
                "--instructions",
                r#"{"rolling_rules":{"global":0}}"#,
            ],
            ok,
            true,
        ),
        (vec!["global-disable-puppet"], ok, true),
    ];
    for (args, code, schema) in cases {
        let (got, v) = doc(&url, &args).await;
        assert_eq!(got, code, "{args:?}: {v}");
        if schema {
            ours(&args, &v);
        }
    }
    let (_, v) = doc(&url, &["current-version"]).await;
    assert_eq!(v["current_version"], "v2", "{v}");
    let (_, v) = doc(&url, &["enable-puppet", "true", "--role", "compute"]).await;
    assert_eq!(v["key"], "/config_state/enable_puppet/role/compute", "{v}");
    assert_eq!(v["value"], true, "{v}");

    // A stream: JSON lines, each with its type.
    let (_watch, mut lines) = watch_json(&url);
    let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    run(&url, &["enable-puppet", "false", "--host", "compute2"]).await;
    let second = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    for l in [first, second] {
        let v: Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert_eq!(v["type"], "status", "{l}");
        assert_eq!(v["schema"], 1, "{l}");
    }
}

/// `status --watch` while the store goes away and comes back: it says since when
/// the store is unreachable (once), then redraws once it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_watch_says_when_the_store_is_unreachable_and_recovers() {
    let mut etcd = Etcd::start().await;
    let url = etcd.url();
    let out = run(&url, &["trigger-update", "v1"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let (_watch, mut lines) = watch_json(&url);
    let mut next = async || -> Value {
        let l = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("a line within 60 s")
            .unwrap()
            .expect("status --watch ended");
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"))
    };
    assert_eq!(next().await["type"], "status");
    etcd.kill(0);
    let v = next().await;
    assert_eq!(v["type"], "unreachable", "{v}");
    assert!(v["since"].as_u64().is_some(), "{v}");
    etcd.restart(0).await;
    let v = next().await;
    assert_eq!(v["type"], "status", "redrawn once the store answers: {v}");
    assert_eq!(v["current_version"], "v1", "{v}");
    // And it watches again: a change is drawn.
    let out = run(&url, &["trigger-update", "v2"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v = next().await;
    assert_eq!(v["current_version"], "v2", "{v}");
}
