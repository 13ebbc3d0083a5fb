//! jio-agent against a real etcd (and the embedded store), real `puppet apply` and
//! real `run-parts`: outcomes, reports, and the faults the agent must survive.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use jio_common::keys::{EnableLevel, Schema};
use jio_common::names::HostName;
use jio_common::store::DynStore;
use jio_tests::inspect::{host_entries as entries, open, text, wait_for};
use jio_tests::{Etcd, Host, Puppet};
use tokio::process::{Child, Command};

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_jio-agent"))
}

async fn agent(host: &Host, args: &[&str]) -> Output {
    Command::from(host.agent(&bin(), args)).output().await.unwrap()
}

fn spawn(host: &Host, args: &[&str]) -> Child {
    Command::from(host.agent(&bin(), args))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

fn set(keys: &[&str]) -> BTreeSet<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

async fn put(s: &DynStore, key: jio_common::keys::Key, value: &str) {
    s.put(&key, value, None).await.unwrap();
}

async fn agent_state(s: &DynStore, host: &str) -> Option<String> {
    let key = Schema::default().agent(&HostName::new(host).unwrap());
    let kv = s.get(&key).await.ok()??;
    let v: serde_json::Value = serde_json::from_str(&kv.value).ok()?;
    Some(v["state"].as_str()?.to_string())
}

/// Processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline"))
            && String::from_utf8_lossy(&cmd).replace('\0', " ").contains(marker)
        {
            let zombie =
                std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z"));
            if !zombie {
                out.push(pid);
            }
        }
    }
    out
}

fn status_json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("status --json: {e}\n{}", text(o)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puppet_outcomes_are_reported() {
    let etcd = Etcd::start().await;
    let s = open(&etcd.url()).await;
    put(&s, Schema::default().current_version(), "v1").await;
    let puppet = Puppet::new();
    let scratch = puppet.scratch();
    // name, manifest, extra config, expected exit, expected entries
    let cases: Vec<(&str, String, &str, i32, Vec<String>)> = vec![
        (
            "changes1",
            format!("file {{ '{}/changes': content => 'v1' }}\n", scratch.display()),
            "",
            0,
            vec![
                "/status/validated/success/v1/changes1".into(),
                "/running/versions/v1/changes1".into(),
            ],
        ),
        (
            "nochange1",
            "notice('nothing to change')\n".into(),
            "",
            0,
            vec![
                "/status/validated/success/v1/nochange1".into(),
                "/running/versions/v1/nochange1".into(),
            ],
        ),
        (
            "fails4",
            "exec { 'broken': command => '/bin/false' }\n".into(),
            "",
            1,
            vec!["/status/configured/failure/v1/fails4".into()],
        ),
        (
            "fails6",
            format!(
                "file {{ '{}/six': content => 'x' }}\nexec {{ 'broken': command => '/bin/false' }}\n",
                scratch.display()
            ),
            "",
            1,
            vec!["/status/configured/failure/v1/fails6".into()],
        ),
        (
            "syntax1",
            "file { 'oops' \n".into(),
            "",
            1,
            vec!["/status/configured/failure/v1/syntax1".into()],
        ),
        (
            "hangs1",
            "exec { 'hang': command => '/bin/sleep 53.71', timeout => 0 }\n".into(),
            "puppet_timeout = \"3s\"",
            1,
            vec!["/status/configured/failure/v1/hangs1".into()],
        ),
    ];
    let mut tasks = Vec::new();
    let mut sandboxes = Vec::new();
    for (name, manifest, extra, code, want) in cases {
        // One Puppet sandbox per host, as on real nodes: concurrent runs sharing a
        // vardir can fail on each other's state files.
        let p = Puppet::new();
        let m = p.manifest(name, &manifest);
        let host = Host::new(name, &etcd.url(), &p.command(&m), extra);
        sandboxes.push(p);
        tasks.push(tokio::spawn(async move {
            let out = agent(&host, &["once"]).await;
            (name, host, out, code, want)
        }));
    }
    for t in tasks {
        let (name, host, out, code, want) = t.await.unwrap();
        assert_eq!(out.status.code(), Some(code), "{name}: {}", text(&out));
        let want: BTreeSet<String> = want.into_iter().collect();
        assert_eq!(entries(&s, name).await, want, "{name}");
        let st = status_json(&agent(&host, &["status", "--json"]).await);
        if code == 0 {
            assert_eq!(host.local_version().as_deref(), Some("v1"), "{name}");
            assert_eq!(st["last_run"]["result"], "success", "{name}");
            assert_eq!(
                std::fs::read_to_string(host.facts_file()).unwrap(),
                "current_version=v1\n"
            );
        } else {
            assert_eq!(
                host.local_version(),
                None,
                "{name}: a failed host keeps its version"
            );
            assert_eq!(st["last_run"]["result"], "failed", "{name}");
            let reason = st["last_run"]["reason"].as_str().unwrap().to_string();
            let expect = match name {
                "fails4" => "exited 4",
                "fails6" => "exited 6",
                "syntax1" => "exited 1",
                _ => "did not finish within 3s",
            };
            assert!(reason.contains(expect), "{name}: {reason}");
        }
        // Puppet's own JSON-lines log of the run is kept.
        let run_dir = PathBuf::from(st["last_run"]["run_dir"].as_str().unwrap());
        if name == "changes1" {
            let log = std::fs::read_to_string(run_dir.join("puppet.jsonl")).unwrap();
            assert!(log.lines().any(|l| l.contains("changes")), "{log}");
        }
    }
    assert!(
        processes_with("53.71").is_empty(),
        "the hung puppet run was not stopped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_failure_then_fix_then_next_version_leaves_nothing_stale() {
    let etcd = Etcd::start().await;
    let s = open(&etcd.url()).await;
    let schema = Schema::default();
    put(&s, schema.current_version(), "v1").await;
    let puppet = Puppet::new();
    let m = puppet.manifest("ok", "notice('ok')\n");
    let host = Host::new("db1", &etcd.url(), &puppet.command(&m), "");
    host.set_validation(false);

    let out = agent(&host, &["once"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(
        entries(&s, "db1").await,
        set(&["/status/validated/failure/v1/db1"])
    );
    assert_eq!(host.local_version(), None);

    // Not retried in a tight loop...
    host.set_validation(true);
    let out = agent(&host, &["once"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("waiting before retrying"), "{}", text(&out));
    // ...but at once when the operator re-enables the host.
    put(
        &s,
        schema.enable(&EnableLevel::Host(HostName::new("db1").unwrap())),
        "true",
    )
    .await;
    let out = agent(&host, &["once"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        entries(&s, "db1").await,
        set(&["/status/validated/success/v1/db1", "/running/versions/v1/db1"])
    );
    assert_eq!(host.local_version().as_deref(), Some("v1"));

    // The next version moves the running entry; the old version's status stays as history.
    put(&s, schema.current_version(), "v2").await;
    let out = agent(&host, &["once"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        entries(&s, "db1").await,
        set(&[
            "/status/validated/success/v1/db1",
            "/status/validated/success/v2/db1",
            "/running/versions/v2/db1"
        ])
    );
    assert_eq!(host.local_version().as_deref(), Some("v2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gate_and_bootstrap_exception() {
    let etcd = Etcd::start().await;
    let s = open(&etcd.url()).await;
    let schema = Schema::default();
    put(&s, schema.current_version(), "v1").await;
    put(&s, schema.enable(&EnableLevel::Global), "False").await; // the original's spelling
    let puppet = Puppet::new();
    let m = puppet.manifest("ok", "notice('ok')\n");
    let host = Host::new("compute7", &etcd.url(), &puppet.command(&m), "");

    // A new host converges although the gate says no.
    let out = agent(&host, &["bootstrap"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("provisioned compute7 (role compute)"),
        "{}",
        text(&out)
    );
    assert_eq!(host.local_version().as_deref(), Some("v1"));
    assert!(
        s.get(&schema.provisioned(
            jio_common::keys::Outcome::Success,
            &HostName::new("compute7").unwrap()
        ))
        .await
        .unwrap()
        .is_some()
    );
    let rec = s
        .get(&schema.host(&HostName::new("compute7").unwrap()))
        .await
        .unwrap()
        .unwrap();
    assert!(rec.value.contains("\"role\":\"compute\""), "{}", rec.value);

    // Later upgrades obey the gate: global false, then role true, then host false.
    put(&s, schema.current_version(), "v2").await;
    let out = agent(&host, &["once"]).await;
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out).contains("not enabled (global key)"), "{}", text(&out));
    let st = status_json(&agent(&host, &["status", "--json"]).await);
    assert_eq!(
        (st["enabled"].as_bool(), st["decided_by"].as_str()),
        (Some(false), Some("global"))
    );
    put(
        &s,
        schema.enable(&EnableLevel::Host(HostName::new("compute7").unwrap())),
        "0",
    )
    .await;
    put(
        &s,
        schema.enable(&EnableLevel::Role(
            jio_common::names::Role::new("compute").unwrap(),
        )),
        "true",
    )
    .await;
    let st = status_json(&agent(&host, &["status", "--json"]).await);
    assert_eq!(
        (st["enabled"].as_bool(), st["decided_by"].as_str()),
        (Some(false), Some("host"))
    );
    assert_eq!(agent(&host, &["pending-update"]).await.status.code(), Some(0));
    s.delete(&schema.enable(&EnableLevel::Host(HostName::new("compute7").unwrap())))
        .await
        .unwrap();
    let out = agent(&host, &["once"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(host.local_version().as_deref(), Some("v2"));
    assert_eq!(agent(&host, &["pending-update"]).await.status.code(), Some(1));

    // A value that is not a boolean is an error naming the key, and nothing runs.
    put(&s, schema.current_version(), "v3").await;
    put(&s, schema.enable(&EnableLevel::Global), "yes").await;
    s.delete(&schema.enable(&EnableLevel::Role(
        jio_common::names::Role::new("compute").unwrap(),
    )))
    .await
    .unwrap();
    let out = agent(&host, &["once"]).await;
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out).contains("/config_state/enable_puppet/global"),
        "{}",
        text(&out)
    );
    assert_eq!(host.local_version().as_deref(), Some("v2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_update_exit_codes_when_unreachable() {
    let port = jio_tests::free_port();
    let host = Host::new(
        "compute1",
        &format!("etcd://127.0.0.1:{port}"),
        &["true".to_string()],
        "store_retry = \"300ms\"",
    );
    let out = agent(&host, &["pending-update"]).await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("127.0.0.1:{port}")),
        "{}",
        text(&out)
    );
    std::fs::write(host.version_file(), "v1\n").unwrap();
    assert_eq!(agent(&host, &["pending-update"]).await.status.code(), Some(2));
    assert_eq!(agent(&host, &["once"]).await.status.code(), Some(2));
    assert_eq!(agent(&host, &["local-version"]).await.stdout, b"v1\n");
    let out = agent(&host, &["local-version", "bad/version"]).await;
    assert_eq!(out.status.code(), Some(64));
    assert!(text(&out).contains("must not contain '/'"), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_reacts_to_watches_and_refuses_a_second_instance() {
    let etcd = Etcd::start().await;
    let s = open(&etcd.url()).await;
    let schema = Schema::default();
    put(&s, schema.current_version(), "v1").await;
    let puppet = Puppet::new();
    let m = puppet.manifest("ok", "notice('ok')\n");
    // A 1 hour resync: only a watch can wake the agent in time.
    let host = Host::new(
        "ctrl1",
        &etcd.url(),
        &puppet.command(&m),
        "resync_interval = \"1h\"\nrole = \"controller\"",
    );
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("agent.log");
    let mut daemon = spawn_logged(&host, &log);
    wait_for("first converge", Duration::from_secs(30), || async {
        host.local_version().as_deref() == Some("v1")
    })
    .await;

    let out = agent(&host, &["once"]).await;
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("already running"), "{}", text(&out));

    put(&s, schema.enable(&EnableLevel::Global), "false").await;
    put(&s, schema.current_version(), "v2").await;
    // The daemon saw v2 and decided not to move (its own log says so).
    wait_for("the decision on v2", Duration::from_secs(10), || async {
        read(&log)
            .lines()
            .any(|l| l.contains("update pending, not enabled") && l.contains("v2"))
    })
    .await;
    assert_eq!(
        host.local_version().as_deref(),
        Some("v1"),
        "disabled: must not move"
    );
    put(
        &s,
        schema.enable(&EnableLevel::Role(
            jio_common::names::Role::new("controller").unwrap(),
        )),
        "true",
    )
    .await;
    // The local version moves first, the store's entries right after.
    wait_for("upgrade after the role key", Duration::from_secs(30), || async {
        host.local_version().as_deref() == Some("v2")
            && entries(&s, "ctrl1").await.contains("/running/versions/v2/ctrl1")
    })
    .await;
    assert_eq!(
        entries(&s, "ctrl1").await,
        set(&[
            "/status/validated/success/v1/ctrl1",
            "/status/validated/success/v2/ctrl1",
            "/running/versions/v2/ctrl1"
        ])
    );
    // The running entry is written before the record goes back to idle.
    wait_for("the agent to be idle again", Duration::from_secs(10), || async {
        agent_state(&s, "ctrl1").await.as_deref() == Some("idle")
    })
    .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), daemon.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    // A clean stop revokes the lease: the liveness record goes at once.
    assert_eq!(agent_state(&s, "ctrl1").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_outage_during_a_run_loses_nothing() {
    let mut etcd = Etcd::start().await;
    let s = open(&etcd.url()).await;
    put(&s, Schema::default().current_version(), "v1").await;
    let puppet = Puppet::new();
    let m = puppet.manifest("slow", "exec { 'slow': command => '/bin/sleep 3' }\n");
    let host = Host::new(
        "compute3",
        &etcd.url(),
        &puppet.command(&m),
        "store_retry = \"1s\"",
    );
    let mut daemon = spawn(&host, &["run"]);
    wait_for("the run to start", Duration::from_secs(30), || async {
        agent_state(&s, "compute3").await.as_deref() == Some("upgrading")
    })
    .await;
    etcd.kill(0);
    // Puppet and validation finish while the store is down; the results wait in the journal.
    wait_for("results journaled", Duration::from_secs(30), || async {
        std::fs::read_to_string(host.state_dir().join("journal.json"))
            .is_ok_and(|j| j.contains("\"validated\"") && j.contains("\"unreported\""))
    })
    .await;
    // The local version moves before the store: the store never shows a host
    // upgraded that its own version file does not; the journaled report follows
    // when the store is back.
    wait_for("the local version", Duration::from_secs(10), || async {
        host.local_version().as_deref() == Some("v1")
    })
    .await;
    assert!(
        daemon.try_wait().unwrap().is_none(),
        "the daemon keeps running while the store is down"
    );
    etcd.restart(0).await;
    let s = open(&etcd.url()).await;
    reported_at(&s, "compute3", "v1", Duration::from_secs(60)).await;
    assert_eq!(
        entries(&s, "compute3").await,
        set(&[
            "/status/validated/success/v1/compute3",
            "/running/versions/v1/compute3"
        ])
    );
    daemon.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_run_interrupts_and_reports_no_success() {
    let etcd = Etcd::start().await;
    let s = open(&etcd.url()).await;
    put(&s, Schema::default().current_version(), "v1").await;
    let puppet = Puppet::new();
    let m = puppet.manifest(
        "long",
        "exec { 'long': command => '/bin/sleep 41.77', timeout => 0 }\n",
    );
    let host = Host::new(
        "compute4",
        &etcd.url(),
        &puppet.command(&m),
        "stop_grace = \"1s\"",
    );
    let mut daemon = spawn(&host, &["run"]);
    wait_for("puppet to be running", Duration::from_secs(30), || async {
        agent_state(&s, "compute4").await.as_deref() == Some("upgrading")
            && !processes_with("41.77").is_empty()
    })
    .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), daemon.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(
        processes_with("41.77").is_empty(),
        "puppet's process group was not stopped"
    );
    assert_eq!(
        entries(&s, "compute4").await,
        BTreeSet::new(),
        "an interrupted run reports nothing"
    );
    assert_eq!(host.local_version(), None);
    let st = status_json(&agent(&host, &["status", "--json"]).await);
    assert_eq!(st["last_run"]["result"], "interrupted");
    assert!(st["in_progress"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_run_then_restart_ends_consistent() {
    let etcd = Etcd::start().await;
    let s = open(&etcd.url()).await;
    put(&s, Schema::default().current_version(), "v1").await;
    let puppet = Puppet::new();
    let m = puppet.manifest(
        "slow",
        "exec { 'slow': command => '/bin/sleep 2.93', timeout => 0 }\n",
    );
    let host = Host::new("compute5", &etcd.url(), &puppet.command(&m), "");
    let mut first = spawn(&host, &["run"]);
    wait_for("puppet to be running", Duration::from_secs(30), || async {
        agent_state(&s, "compute5").await.as_deref() == Some("upgrading")
            && !processes_with("2.93").is_empty()
    })
    .await;
    first.start_kill().unwrap();
    first.wait().await.unwrap();
    assert!(
        !processes_with("2.93").is_empty(),
        "puppet outlives a SIGKILLed agent"
    );

    let mut second = spawn(&host, &["run"]);
    wait_for("the rerun to finish", Duration::from_secs(60), || async {
        host.local_version().as_deref() == Some("v1")
            && entries(&s, "compute5")
                .await
                .contains("/running/versions/v1/compute5")
    })
    .await;
    assert_eq!(
        entries(&s, "compute5").await,
        set(&[
            "/status/validated/success/v1/compute5",
            "/running/versions/v1/compute5"
        ])
    );
    second.start_kill().unwrap();
    let out = second.wait_with_output().await.unwrap();
    let log = text(&out);
    assert!(log.contains("found a run that never finished"), "{log}");
    assert!(
        log.contains("stopped the commands a killed agent left running"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_and_run_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("store.db").display());
    let s = open(&url).await;
    let schema = Schema::default();
    put(&s, schema.current_version(), "v1").await;
    let puppet = Puppet::new();
    let m = puppet.manifest("ok", "notice('ok')\n");
    let host = Host::new("compute9", &url, &puppet.command(&m), "resync_interval = \"1h\"");
    let out = agent(&host, &["once"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        entries(&s, "compute9").await,
        set(&[
            "/status/validated/success/v1/compute9",
            "/running/versions/v1/compute9"
        ])
    );
    let mut daemon = spawn(&host, &["run"]);
    wait_for("the liveness record", Duration::from_secs(30), || async {
        agent_state(&s, "compute9").await.as_deref() == Some("idle")
    })
    .await;
    put(&s, schema.current_version(), "v2").await;
    wait_for("the upgrade to v2", Duration::from_secs(30), || async {
        host.local_version().as_deref() == Some("v2")
            && entries(&s, "compute9")
                .await
                .contains("/running/versions/v2/compute9")
    })
    .await;
    assert_eq!(
        entries(&s, "compute9").await,
        set(&[
            "/status/validated/success/v1/compute9",
            "/status/validated/success/v2/compute9",
            "/running/versions/v2/compute9"
        ])
    );
    daemon.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_health_check_repairs_reports_and_recovers() {
    let etcd = Etcd::start().await;
    let s = open(&etcd.url()).await;
    put(&s, Schema::default().current_version(), "v1").await;
    let puppet = Puppet::new();
    let marker = puppet.scratch().join("repairs");
    // Each Puppet run appends a line, so the test can count repair runs.
    let m = puppet.manifest(
        "count",
        &format!(
            "exec {{ 'count': command => '/bin/sh -c \\'echo run >> {}\\'' }}\n",
            marker.display()
        ),
    );
    let host = Host::new(
        "db4",
        &etcd.url(),
        &puppet.command(&m),
        "health_interval = \"1s\"",
    );
    let mut daemon = spawn(&host, &["run"]);
    wait_for("first converge", Duration::from_secs(30), || async {
        host.local_version().as_deref() == Some("v1")
    })
    .await;
    let runs = || {
        std::fs::read_to_string(&marker)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    assert_eq!(runs(), 1);

    // The service breaks: the health check fails, Puppet runs once to repair, the
    // failure is reported for the local version.
    host.set_validation(false);
    wait_for("the failure report", Duration::from_secs(30), || async {
        entries(&s, "db4")
            .await
            .contains("/status/validated/failure/v1/db4")
    })
    .await;
    assert!(runs() >= 2, "puppet ran to repair");
    // The liveness record follows the report.
    wait_for("the failed liveness state", Duration::from_secs(10), || async {
        agent_state(&s, "db4").await.as_deref() == Some("failed")
    })
    .await;

    // It recovers: the next health check reports success in place of the failure.
    host.set_validation(true);
    wait_for("the recovery report", Duration::from_secs(30), || async {
        entries(&s, "db4").await == set(&["/status/validated/success/v1/db4", "/running/versions/v1/db4"])
    })
    .await;
    daemon.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_notify_ready_after_the_store_answers_and_watchdog() {
    use std::os::unix::net::UnixDatagram;
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("notify");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    // The store is not up yet: no READY until it answers.
    let port = jio_tests::free_port();
    let host = Host::new(
        "ctrl9",
        &format!("etcd://127.0.0.1:{port}"),
        &["true".to_string()],
        "store_retry = \"200ms\"",
    );
    let mut daemon = Command::from(host.agent(&bin(), &["run"]))
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "400000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut buf = [0u8; 512];
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        if let Ok(n) = sock.recv(&mut buf) {
            panic!(
                "notified before the store answered: {}",
                String::from_utf8_lossy(&buf[..n])
            );
        }
    }
    // Start an etcd on that very port.
    let etcd_dir = tempfile::tempdir().unwrap();
    let client = format!("http://127.0.0.1:{port}");
    let peer = format!("http://127.0.0.1:{}", jio_tests::free_port());
    let mut etcd = std::process::Command::new(jio_tests::require_binary(
        "etcd",
        "apt-get install -y etcd-server",
    ))
    .args([
        "--data-dir",
        etcd_dir.path().to_str().unwrap(),
        "--listen-client-urls",
        &client,
        "--advertise-client-urls",
        &client,
    ])
    .args([
        "--listen-peer-urls",
        &peer,
        "--initial-advertise-peer-urls",
        &peer,
        "--initial-cluster",
        &format!("default={peer}"),
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let mut got = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20)
        && !(got.iter().any(|m: &String| m.starts_with("READY=1"))
            && got.iter().filter(|m| *m == "WATCHDOG=1").count() >= 2)
    {
        if let Ok(n) = sock.recv(&mut buf) {
            got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    let _ = etcd.kill();
    let _ = etcd.wait();
    assert!(
        got.first()
            .is_some_and(|m| m.starts_with("READY=1\nSTATUS=connected to etcd://")),
        "{got:?}"
    );
    assert!(got.iter().filter(|m| *m == "WATCHDOG=1").count() >= 2, "{got:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    daemon.wait().await.unwrap();
    let mut rest = Vec::new();
    while let Ok(n) = sock.recv(&mut buf) {
        rest.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert!(rest.iter().any(|m| m == "STOPPING=1"), "{rest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_configuration_in_place_or_says_why_not() {
    let etcd = Etcd::start().await;
    let s = open(&etcd.url()).await;
    let host = Host::new("compute7", &etcd.url(), &["true".to_string()], "");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("agent.log");
    let mut daemon = spawn_logged(&host, &log);
    let pid = nix::unistd::Pid::from_raw(daemon.id().unwrap() as i32);
    let hup = || nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    wait_for("the agent to run", Duration::from_secs(20), || async {
        agent_state(&s, "compute7").await.is_some()
    })
    .await;
    let good = std::fs::read_to_string(host.config()).unwrap();
    // The same configuration: said, nothing else happens.
    hup();
    wait_for(
        "the unchanged reload to be logged",
        Duration::from_secs(10),
        || async { read(&log).contains("SIGHUP: the configuration is unchanged; nothing to do") },
    )
    .await;
    // A configuration with a problem: said, and the daemon runs on as it was.
    std::fs::write(host.config(), format!("{good}no_such_key = 1\n")).unwrap();
    hup();
    wait_for(
        "the refused reload to be logged",
        Duration::from_secs(10),
        || async { read(&log).contains("SIGHUP: the configuration was not reloaded") },
    )
    .await;
    assert!(read(&log).contains("no_such_key"), "{}", read(&log));
    assert!(alive(&mut daemon), "{}", read(&log));
    // A valid one: the same process starts again in place, with it.
    std::fs::write(host.config(), format!("{good}role = \"storage\"\n")).unwrap();
    hup();
    wait_for(
        "the agent to run again with its new role",
        Duration::from_secs(30),
        || async { read(&log).contains("role=storage") },
    )
    .await;
    let l = read(&log);
    assert!(l.contains("starting again in place"), "{l}");
    assert_eq!(l.matches("jio-agent running").count(), 2, "{l}");
    assert!(alive(&mut daemon), "the same process (pid {pid}) runs on: {l}");
    wait_for("the new daemon to be live", Duration::from_secs(20), || async {
        agent_state(&s, "compute7").await.is_some()
    })
    .await;
    // A reload during a run: the run is not cut short; the reload comes after it.
    let marker = dir.path().join("puppet-runs");
    let slow = format!(
        "{good}puppet_command = [\"/bin/sh\", \"-c\", \"echo start >> {m}; sleep 3; echo end >> {m}; exit 2\"]\n",
        m = marker.display()
    );
    let slow = slow.replacen("puppet_command = [\"true\"]\n", "", 1);
    std::fs::write(host.config(), format!("{slow}role = \"storage\"\n")).unwrap();
    hup();
    wait_for(
        "the slow configuration to be running",
        Duration::from_secs(30),
        || async { read(&log).matches("jio-agent running").count() == 3 },
    )
    .await;
    put(&s, Schema::default().current_version(), "v9").await;
    wait_for("the slow run to start", Duration::from_secs(30), || async {
        read(&marker).contains("start")
    })
    .await;
    std::fs::write(
        host.config(),
        format!("{slow}role = \"storage\"\nretry_interval = \"1h\"\n"),
    )
    .unwrap();
    hup();
    wait_for("the agent to start again", Duration::from_secs(30), || async {
        read(&log).matches("jio-agent running").count() == 4
    })
    .await;
    assert_eq!(
        read(&marker),
        "start\nend\n",
        "the run finished before the reload: {}",
        read(&log)
    );
    assert_eq!(host.local_version().as_deref(), Some("v9"), "{}", read(&log));
    let l = read(&log);
    assert!(l.contains("as soon as no run is going on"), "{l}");
    assert!(!l.contains("interrupted"), "{l}");
    // A reload then at once a stop: the stop wins, it does not start again.
    std::fs::write(host.config(), format!("{good}role = \"compute\"\n")).unwrap();
    hup();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), daemon.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0), "{}", read(&log));
    assert_eq!(
        read(&log).matches("jio-agent running").count(),
        4,
        "{}",
        read(&log)
    );
}

// ---- Issue 11: stored values never end the daemon, fenced starts, local failures ----

/// The daemon, its stderr (the log) in `log`.
fn spawn_logged(host: &Host, log: &std::path::Path) -> Child {
    Command::from(host.agent(&bin(), &["run"]))
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(log).unwrap()))
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn alive(d: &mut Child) -> bool {
    d.try_wait().unwrap().is_none()
}

/// A shell script that appends the value of each key, as the real `etcdctl` reads
/// it at that moment, to its file (one line per run), then exits `code`.
fn record_script(script: &std::path::Path, url: &str, gets: &[(String, &std::path::Path)], code: i32) {
    let etcdctl = jio_tests::require_binary("etcdctl", "apt-get install -y etcd-client");
    let mut body = String::from("#!/bin/sh\n");
    for (key, file) in gets {
        body.push_str(&format!(
            "ETCDCTL_API=3 {} --endpoints={} get --print-value-only {key} >> {}\n",
            etcdctl.display(),
            url.trim_start_matches("etcd://"),
            file.display()
        ));
    }
    body.push_str(&format!("exit {code}\n"));
    std::fs::write(script, body).unwrap();
    std::fs::set_permissions(script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

/// A "puppet" (exits 2: changes) that records what the host's liveness record and
/// run marker said when it started: `<dir>/puppet-seen` and `<dir>/puppet-marker`.
fn recording_puppet(dir: &std::path::Path, url: &str, host: &str) -> Vec<String> {
    let script = dir.join("puppet.sh");
    let (seen, marker) = (dir.join("puppet-seen"), dir.join("puppet-marker"));
    record_script(
        &script,
        url,
        &[
            (format!("/agents/{host}"), &seen),
            (format!("/runs/{host}"), &marker),
        ],
        2,
    );
    vec![script.display().to_string()]
}

/// One host on a fresh etcd whose desired version is v1, its "puppet" the
/// [`recording_puppet`] (`puppet_runs` has a line per run).
struct Recorded {
    etcd: Etcd,
    url: String,
    s: DynStore,
    work: tempfile::TempDir,
    host: Host,
    puppet_runs: PathBuf,
}

async fn recorded(name: &str, config: &str) -> Recorded {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let s = open(&url).await;
    put(&s, Schema::default().current_version(), "v1").await;
    let work = tempfile::tempdir().unwrap();
    let host = Host::new(name, &url, &recording_puppet(work.path(), &url, name), config);
    let puppet_runs = work.path().join("puppet-seen");
    Recorded {
        etcd,
        url,
        s,
        work,
        host,
        puppet_runs,
    }
}

fn lines(path: &std::path::Path) -> usize {
    read(path).lines().count()
}

/// Waits for the host's `/running/versions/<version>/<host>` entry.
async fn reported_at(s: &DynStore, host: &str, version: &str, within: Duration) {
    let key = format!("/running/versions/{version}/{host}");
    wait_for(&key, within, || async { entries(s, host).await.contains(&key) }).await;
}

/// Waits for the failure entry `key` and returns its value (the reason).
async fn failure(s: &DynStore, key: &str, within: Duration) -> String {
    wait_for(key, within, || async { value(s, key).await.is_some() }).await;
    value(s, key).await.unwrap()
}

async fn value(s: &DynStore, key: &str) -> Option<String> {
    let key = jio_common::keys::Key::new(key).unwrap();
    s.get(&key).await.unwrap().map(|kv| kv.value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_stored_values_block_the_host_and_never_end_the_daemon() {
    let Recorded {
        etcd: _etcd,
        url,
        s,
        work,
        host,
        puppet_runs,
    } = recorded(
        "compute11",
        "resync_interval = \"1h\"\nretry_interval = \"1h\"\nhealth_interval = \"0\"",
    )
    .await;
    let host_key = "/config_state/enable_puppet/host/compute11";

    // A host key that is not text blocks even a first converge; `once` says so
    // (naming the key) and exits 1, not 64.
    etcdctl_put_bytes(&url, host_key.as_bytes(), b"tr\xffue");
    let out = agent(&host, &["once"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("blocked") && text(&out).contains(host_key),
        "{}",
        text(&out)
    );
    assert_eq!(lines(&puppet_runs), 0, "a blocked host ran puppet");
    assert_eq!(host.local_version(), None);

    // The daemon: one error naming the key, it stays up, and acts once it is fixed.
    let log = work.path().join("agent.log");
    let mut daemon = spawn_logged(&host, &log);
    wait_for(
        "the blocked decision in the log",
        Duration::from_secs(15),
        || async {
            read(&log).contains("blocked") && read(&log).contains(&format!("key {host_key} is invalid"))
        },
    )
    .await;
    let out = agent(&host, &["status"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("enabled:   blocked") && text(&out).contains(host_key),
        "{}",
        text(&out)
    );
    assert!(alive(&mut daemon), "{}", read(&log));
    put(
        &s,
        Schema::default().enable(&EnableLevel::Host(HostName::new("compute11").unwrap())),
        "true",
    )
    .await;
    wait_for(
        "the first converge once fixed",
        Duration::from_secs(30),
        || async { host.local_version().as_deref() == Some("v1") },
    )
    .await;

    // A desired version that is not text while the daemon runs: it stays up, says
    // which key and why, once.
    etcdctl_put_bytes(&url, b"/current_version", b"v\xff2");
    let bad = "key /current_version is invalid: not UTF-8";
    wait_for(
        "the error naming /current_version",
        Duration::from_secs(15),
        || async { read(&log).contains(bad) },
    )
    .await;
    let out = agent(&host, &["pending-update"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("/current_version"), "{}", text(&out));
    let out = agent(&host, &["status", "--json"]).await;
    let st = status_json(&out);
    assert!(
        st["desired_invalid"]
            .as_str()
            .unwrap()
            .contains("/current_version"),
        "{st}"
    );
    assert!(alive(&mut daemon), "{}", read(&log));

    // Fixed: the watch wakes it and it upgrades.
    etcdctl_put_bytes(&url, b"/current_version", b"v2");
    wait_for("the upgrade once fixed", Duration::from_secs(30), || async {
        host.local_version().as_deref() == Some("v2")
    })
    .await;
    assert!(alive(&mut daemon), "{}", read(&log));
    assert_eq!(read(&log).matches(bad).count(), 1, "logged once: {}", read(&log));
    assert_eq!(lines(&puppet_runs), 2);
    daemon.kill().await.unwrap();
}

/// Raw bytes through the real `etcdctl`.
fn etcdctl_put_bytes(url: &str, key: &[u8], value: &[u8]) {
    jio_tests::etcd::etcdctl_put(url, key, value);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_flight_record_says_upgrading_before_puppet_starts() {
    let Recorded {
        etcd: _etcd,
        url: _,
        s,
        work,
        host,
        puppet_runs: _,
    } = recorded("compute12", "resync_interval = \"1h\"\nhealth_interval = \"0\"").await;
    let log = work.path().join("agent.log");
    let mut daemon = spawn_logged(&host, &log);
    reported_at(&s, "compute12", "v1", Duration::from_secs(30)).await;
    let seen = read(&work.path().join("puppet-seen"));
    assert!(
        seen.contains(r#""state":"upgrading""#) && seen.contains(r#""version":"v1""#),
        "when puppet started, /agents/compute12 said: {seen:?}"
    );
    // So did the run marker that keeps the host's slot should the agent freeze.
    let marker = read(&work.path().join("puppet-marker"));
    assert!(
        marker.contains(r#""state":"upgrading""#) && marker.contains(r#""version":"v1""#),
        "when puppet started, /runs/compute12 said: {marker:?}"
    );
    // Back to idle once the run has been reported.
    wait_for("the idle record", Duration::from_secs(10), || async {
        agent_state(&s, "compute12").await.as_deref() == Some("idle")
    })
    .await;
    assert!(alive(&mut daemon), "{}", read(&log));
    daemon.kill().await.unwrap();
}

/// A run ends in one transaction: its validated entry, its result, the running
/// version, the idle liveness record and the run marker's removal carry one
/// revision; the configure step, followed at once by the validation, is never
/// written on its own; and the liveness task writes nothing more after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_ends_in_one_transaction() {
    use futures_util::StreamExt as _;
    use jio_common::store::WatchEvent;
    let Recorded {
        etcd: _etcd,
        url: _,
        s,
        work,
        host,
        puppet_runs: _,
    } = recorded("compute14", "resync_interval = \"1h\"\nhealth_interval = \"0\"").await;
    let from = s.ping().await.unwrap() + 1;
    let mut watch = s.watch(&Schema::default().root(), from).await.unwrap();
    let log = work.path().join("agent.log");
    let mut daemon = spawn_logged(&host, &log);
    reported_at(&s, "compute14", "v1", Duration::from_secs(30)).await;
    // A rewrite by the liveness task would follow the report at once: give it time
    // to show.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut events: Vec<(String, String, i64)> = Vec::new();
    while let Ok(Some(Ok(ev))) = tokio::time::timeout(Duration::from_millis(300), watch.next()).await {
        match ev {
            WatchEvent::Put(kv) => events.push(("put".into(), kv.key.to_string(), kv.mod_revision)),
            WatchEvent::Delete { key, revision } => events.push(("delete".into(), key.to_string(), revision)),
            WatchEvent::Reset { .. } => panic!("reset"),
        }
    }
    assert!(alive(&mut daemon), "{}", read(&log));
    daemon.kill().await.unwrap();
    let rev_of = |op: &str, key: &str| {
        let found: Vec<i64> = events
            .iter()
            .filter(|(o, k, _)| o == op && k == key)
            .map(|(_, _, r)| *r)
            .collect();
        assert_eq!(found.len(), 1, "{op} {key} once: {events:#?}");
        found[0]
    };
    let end = rev_of("put", "/status/validated/success/v1/compute14");
    assert_eq!(rev_of("put", "/results/compute14"), end, "{events:#?}");
    assert_eq!(
        rev_of("put", "/running/versions/v1/compute14"),
        end,
        "{events:#?}"
    );
    assert_eq!(rev_of("delete", "/runs/compute14"), end, "{events:#?}");
    assert!(
        !events
            .iter()
            .any(|(_, k, _)| k.starts_with("/status/configured/success/")),
        "the configure step was written on its own: {events:#?}"
    );
    // The liveness record: written at the start (upgrading) and at the end (idle),
    // each by its transaction, and never again.
    let records: Vec<i64> = events
        .iter()
        .filter(|(o, k, _)| o == "put" && k == "/agents/compute14")
        .map(|(_, _, r)| *r)
        .collect();
    let start = rev_of("put", "/runs/compute14");
    assert!(records.contains(&start) && records.contains(&end), "{events:#?}");
    assert!(
        records.iter().all(|r| *r <= start || *r == end),
        "the record was written again: {records:?} (start {start}, end {end})"
    );
    assert_eq!(records.iter().filter(|r| **r >= start).count(), 2, "{events:#?}");
    assert_eq!(agent_state(&s, "compute14").await.as_deref(), Some("idle"));
}

/// An agent in this process, configured from `host`'s file, with its liveness
/// record; it stops when the returned sender is dropped.
fn embedded_agent(host: &Host, s: &DynStore) -> (jio_agent::agent::Agent, tokio::sync::watch::Sender<bool>) {
    let ov = jio_agent::config::Overrides {
        config_path: Some(host.config()),
        ..Default::default()
    };
    let cfg = jio_agent::config::load(&ov, || None).unwrap();
    let (tx, rx) = tokio::sync::watch::channel(false);
    let mut a = jio_agent::agent::Agent::new(cfg.clone(), s.clone(), rx).unwrap();
    a.set_liveness(jio_agent::liveness::Liveness::start(
        s.clone(),
        cfg.schema.agent(&cfg.hostname),
        cfg.lease_ttl,
        jio_common::values::AgentState::Idle,
        None,
    ));
    (a, tx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_loses_when_what_the_decision_read_changed() {
    use jio_agent::pass::PassResult;
    let Recorded {
        etcd: _etcd,
        url: _,
        s,
        work: _work,
        host,
        puppet_runs,
    } = recorded("compute13", "").await;
    let schema = Schema::default();
    let h = HostName::new("compute13").unwrap();
    put(&s, schema.enable(&EnableLevel::Host(h.clone())), "true").await;
    let (mut a, _stop) = embedded_agent(&host, &s);

    // An operator disables the host between the observation and the start.
    let obs = a.observe(false).await.unwrap();
    put(&s, schema.enable(&EnableLevel::Host(h.clone())), "false").await;
    assert_eq!(a.act(&obs).await.unwrap(), PassResult::Raced);
    // The role and global keys, and the desired version, fence it too.
    for key in [
        schema.enable(&EnableLevel::Role(
            jio_common::names::Role::new("compute").unwrap(),
        )),
        schema.enable(&EnableLevel::Global),
        schema.current_version(),
    ] {
        put(&s, schema.enable(&EnableLevel::Host(h.clone())), "true").await;
        let obs = a.observe(false).await.unwrap();
        let same = s.get(&key).await.unwrap().map(|kv| kv.value);
        put(&s, key.clone(), same.as_deref().unwrap_or("true")).await;
        assert_eq!(a.act(&obs).await.unwrap(), PassResult::Raced, "{key}");
    }
    // So does the package snapshot template: set or changed since the read.
    let template = schema.package_source();
    put(
        &s,
        template.clone(),
        "deb http://repo.invalid/s/{version} bookworm main",
    )
    .await;
    let obs = a.observe(false).await.unwrap();
    put(
        &s,
        template.clone(),
        "deb http://repo.invalid/t/{version} bookworm main",
    )
    .await;
    assert_eq!(a.act(&obs).await.unwrap(), PassResult::Raced, "{template}");
    let obs = a.observe(false).await.unwrap();
    s.txn(jio_common::store::Txn::new().then(jio_common::store::Op::Delete(template.clone())))
        .await
        .unwrap();
    assert_eq!(
        a.act(&obs).await.unwrap(),
        PassResult::Raced,
        "{template} deleted"
    );
    assert_eq!(lines(&puppet_runs), 0, "puppet ran after a lost start");
    assert_eq!(host.local_version(), None);
    assert_ne!(agent_state(&s, "compute13").await.as_deref(), Some("upgrading"));

    // Nothing changed since: it starts, and Puppet sees the record.
    let obs = a.observe(false).await.unwrap();
    assert!(matches!(a.act(&obs).await.unwrap(), PassResult::Ran { .. }));
    assert_eq!(host.local_version().as_deref(), Some("v1"));
    assert!(read(&puppet_runs).contains(r#""state":"upgrading""#));
    a.take_liveness().unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_and_repairs_wait_for_the_rollout_driver() {
    let Recorded {
        etcd: _etcd,
        url,
        s,
        work,
        host,
        puppet_runs: _,
    } = recorded("db11", "resync_interval = \"1h\"\nhealth_interval = \"1s\"").await;
    let schema = Schema::default();
    // Validation records what the record said while it ran (run-parts runs 05 first).
    let checks = work.path().join("validation-seen");
    record_script(
        &host.validation_dir().join("05-record"),
        &url,
        &[("/agents/db11".to_string(), &checks)],
        0,
    );
    let puppet_runs = work.path().join("puppet-seen");
    let log = work.path().join("agent.log");
    let mut daemon = spawn_logged(&host, &log);
    wait_for("first converge", Duration::from_secs(30), || async {
        host.local_version().as_deref() == Some("v1")
    })
    .await;
    wait_for("a health check", Duration::from_secs(15), || async {
        read(&checks).contains(r#""state":"checking""#)
    })
    .await;
    assert_eq!(lines(&puppet_runs), 1);

    // A driver holds the rollout lock: no health check and no repair starts.
    put(&s, schema.lock(jio_common::fleet::ROLLOUT_LOCK), r#"{"pid":1}"#).await;
    let skipped = "health check skipped: a jioctl upgrade driver holds the rollout lock";
    // Once one check was held, none is in flight (a check that started before the
    // lock would have finished first): only then does validation start failing.
    wait_for("a skipped health check", Duration::from_secs(15), || async {
        read(&log).matches(skipped).count() >= 1
    })
    .await;
    host.set_validation(false);
    wait_for("two skipped health checks", Duration::from_secs(15), || async {
        read(&log).matches(skipped).count() >= 2
    })
    .await;
    assert_eq!(
        lines(&puppet_runs),
        1,
        "puppet ran under the lock: {}",
        read(&log)
    );
    assert!(
        !entries(&s, "db11")
            .await
            .contains("/status/validated/failure/v1/db11"),
        "{}",
        read(&log)
    );

    // Released: the failing check runs and Puppet repairs, its record upgrading.
    s.delete(&schema.lock(jio_common::fleet::ROLLOUT_LOCK))
        .await
        .unwrap();
    wait_for("the failure report", Duration::from_secs(30), || async {
        entries(&s, "db11")
            .await
            .contains("/status/validated/failure/v1/db11")
    })
    .await;
    assert!(lines(&puppet_runs) >= 2);
    assert!(
        read(&puppet_runs)
            .lines()
            .nth(1)
            .unwrap()
            .contains(r#""state":"upgrading""#),
        "{}",
        read(&puppet_runs)
    );
    assert!(alive(&mut daemon), "{}", read(&log));
    daemon.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_failures_are_failed_runs_with_their_reason_and_the_daemon_stays_up() {
    let Recorded {
        etcd: _etcd,
        url: _,
        s,
        work,
        host,
        puppet_runs,
    } = recorded(
        "compute14",
        "resync_interval = \"1h\"\nretry_interval = \"1h\"\nhealth_interval = \"0\"",
    )
    .await;
    let schema = Schema::default();
    let h = HostName::new("compute14").unwrap();
    // Tests run as root, which permissions do not stop: a regular file where a
    // directory should be does.
    let facts_dir = host.facts_file().parent().unwrap().to_path_buf();
    std::fs::write(&facts_dir, "not a directory").unwrap();
    let log = work.path().join("agent.log");
    let mut daemon = spawn_logged(&host, &log);
    let reenable = || async {
        // Any write of an enable key is a new decision: the failure backoff ends.
        put(&s, schema.enable(&EnableLevel::Host(h.clone())), "true").await;
    };

    // The Facter fact cannot be written: a configured failure with the file and
    // the OS error; nothing ran, the daemon is up and the host is not shown moving.
    let v = failure(
        &s,
        "/status/configured/failure/v1/compute14",
        Duration::from_secs(15),
    )
    .await;
    assert!(
        v.contains("Facter fact could not be written")
            && v.contains(&host.facts_file().display().to_string())
            && v.contains("os error"),
        "{v}"
    );
    assert_eq!(lines(&puppet_runs), 0);
    wait_for("the failed record", Duration::from_secs(10), || async {
        agent_state(&s, "compute14").await.as_deref() == Some("failed")
    })
    .await;
    assert!(alive(&mut daemon), "{}", read(&log));
    std::fs::remove_file(&facts_dir).unwrap();
    reenable().await;
    reported_at(&s, "compute14", "v1", Duration::from_secs(30)).await;
    assert_eq!(host.local_version().as_deref(), Some("v1"));

    // The version file cannot be written: the validation's failure, with the reason,
    // and never a running entry for the version the host is not at.
    let blocker = host.version_file().with_extension("tmp-jio");
    std::fs::create_dir(&blocker).unwrap();
    put(&s, schema.current_version(), "v2").await;
    let v = failure(
        &s,
        "/status/validated/failure/v2/compute14",
        Duration::from_secs(30),
    )
    .await;
    assert!(
        v.contains("version file could not be written") && v.contains("os error"),
        "{v}"
    );
    let e = entries(&s, "compute14").await;
    assert!(
        !e.contains("/running/versions/v2/compute14"),
        "shown upgraded: {e:?}"
    );
    assert!(e.contains("/running/versions/v1/compute14"), "{e:?}");
    assert_eq!(host.local_version().as_deref(), Some("v1"));
    assert!(alive(&mut daemon), "{}", read(&log));
    assert!(!read(&log).contains("could not be reported"), "{}", read(&log));
    // A restart tells no tale of a killed agent, and stays up.
    daemon.kill().await.unwrap();
    let log2 = work.path().join("agent2.log");
    let mut daemon = spawn_logged(&host, &log2);
    wait_for(
        "the restarted daemon's decision",
        Duration::from_secs(15),
        || async { read(&log2).contains("waiting before retrying") },
    )
    .await;
    assert!(!read(&log2).contains("never finished"), "{}", read(&log2));
    assert!(alive(&mut daemon), "{}", read(&log2));
    std::fs::remove_dir(&blocker).unwrap();
    reenable().await;
    reported_at(&s, "compute14", "v2", Duration::from_secs(30)).await;
    assert_eq!(host.local_version().as_deref(), Some("v2"));

    // The run directory cannot be made: a configured failure naming it; nothing ran.
    let runs = host.state_dir().join("runs");
    std::fs::remove_dir_all(&runs).unwrap();
    std::fs::write(&runs, "not a directory").unwrap();
    let before = lines(&puppet_runs);
    put(&s, schema.current_version(), "v3").await;
    let v = failure(
        &s,
        "/status/configured/failure/v3/compute14",
        Duration::from_secs(15),
    )
    .await;
    assert!(
        v.contains("cannot create the run directory") && v.contains("os error"),
        "{v}"
    );
    assert_eq!(lines(&puppet_runs), before);
    assert!(alive(&mut daemon), "{}", read(&log2));

    // A missing validation directory is named, not "validation exited 1".
    std::fs::remove_file(&runs).unwrap();
    std::fs::remove_dir_all(host.validation_dir()).unwrap();
    put(&s, schema.current_version(), "v4").await;
    let v = failure(
        &s,
        "/status/validated/failure/v4/compute14",
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        v,
        format!(
            "validation directory {} does not exist",
            host.validation_dir().display()
        )
    );
    assert!(alive(&mut daemon), "{}", read(&log2));
    let e = entries(&s, "compute14").await;
    assert!(!e.contains("/running/versions/v4/compute14"), "{e:?}");
    daemon.kill().await.unwrap();
}

/// On the embedded store: `begin` writes nothing when a compared key moved, the
/// keeper never puts an older record back, and stopping revokes the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_liveness_record_is_fenced_kept_and_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("store.db").display());
    let s: DynStore = open(&url).await;
    let schema = Schema::default();
    let host = HostName::new("compute15").unwrap();
    let enable = schema.enable(&EnableLevel::Host(host.clone()));
    let rev = s.put(&enable, "true", None).await.unwrap();
    let live = jio_agent::liveness::Liveness::start(
        s.clone(),
        schema.agent(&host),
        Duration::from_secs(3),
        jio_common::values::AgentState::Idle,
        None,
    );
    let v = jio_common::names::Version::new("v2").unwrap();
    // The key moved since the decision read it: nothing is written.
    s.put(&enable, "false", None).await.unwrap();
    let won = live
        .commit(
            jio_common::values::AgentState::Upgrading,
            Some(v.clone()),
            vec![jio_common::store::Compare::ModRevision(enable.clone(), rev)],
            vec![],
        )
        .await
        .unwrap();
    assert!(won.is_none());
    let record =
        |s: DynStore, k: jio_common::keys::Key| async move { s.get(&k).await.unwrap().map(|kv| kv.value) };
    wait_for("the idle record", Duration::from_secs(10), || {
        let (s, k) = (s.clone(), schema.agent(&host));
        async move { record(s, k).await.is_some_and(|v| v.contains("idle")) }
    })
    .await;
    // Unchanged since: the record says upgrading, bound to the lease.
    let rev = s.get(&enable).await.unwrap().unwrap().mod_revision;
    let committed = live
        .commit(
            jio_common::values::AgentState::Upgrading,
            Some(v),
            vec![jio_common::store::Compare::ModRevision(enable, rev)],
            vec![],
        )
        .await
        .unwrap();
    let kv = s.get(&schema.agent(&host)).await.unwrap().unwrap();
    assert_eq!(committed, Some(kv.mod_revision));
    assert!(kv.value.contains("upgrading") && kv.lease.is_some(), "{kv:?}");
    // The keeper neither puts an older record back nor writes the same one again
    // (two renewals later, the record is the transaction's own write).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = s.get(&schema.agent(&host)).await.unwrap().unwrap();
    assert!(after.value.contains("upgrading"), "{after:?}");
    assert_eq!(after.mod_revision, kv.mod_revision, "rewritten: {after:?}");
    live.stop().await;
    assert!(
        s.get(&schema.agent(&host)).await.unwrap().is_none(),
        "the lease was revoked"
    );
}

// ---- Admission an SRE can trust: run results, the soak, holds, windows ----

/// The host's `/results/<host>` as JSON, if any.
async fn result_of(s: &DynStore, host: &str) -> Option<serde_json::Value> {
    let v = value(s, &format!("/results/{host}")).await?;
    Some(serde_json::from_str(&v).unwrap())
}

/// Records a rollout to `version` (from `previous`) with `rules` as the active one.
async fn start_rollout(s: &DynStore, version: &str, rules: serde_json::Value) {
    let v = |x: &str| jio_common::names::Version::new(x).unwrap();
    let now = jio_common::time::unix_now();
    let rec = jio_common::rollout::RolloutRecord::start(v(version), Some(v("v1")), rules, "test", now);
    let schema = Schema::default();
    put(s, schema.rollout(&rec.id), &serde_json::to_string(&rec).unwrap()).await;
    put(s, schema.current_rollout(), rec.id.as_str()).await;
}

/// `HH:MM` UTC, `minutes` from now.
fn utc_hhmm(minutes: i64) -> String {
    let now = jio_common::time::unix_now() as i64;
    let t = (now + minutes * 60).rem_euclid(86_400);
    format!("{:02}:{:02}", t / 3600, (t % 3600) / 60)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_run_writes_its_result_and_the_status_leaf_keeps_its_value() {
    let etcd = Etcd::start().await;
    let s = open(&etcd.url()).await;
    let schema = Schema::default();
    put(&s, schema.current_version(), "v1").await;
    let puppet = Puppet::new();
    let m = puppet.manifest(
        "six",
        &format!(
            "file {{ '{}/six': content => 'x' }}\nexec {{ 'broken': command => '/bin/false' }}\n",
            puppet.scratch().display()
        ),
    );
    let host = Host::new(
        "compute31",
        &etcd.url(),
        &puppet.command(&m),
        "retry_interval = \"10m\"",
    );
    let out = agent(&host, &["once"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));

    let r = result_of(&s, "compute31").await.expect("a run result");
    assert_eq!(r["version"], "v1");
    assert_eq!(r["ok"], false);
    assert_eq!(r["step"], "configured");
    assert_eq!(r["exit_code"], 6);
    assert_eq!(r["attempt"], 1);
    let message = r["message"].as_str().unwrap();
    assert!(message.starts_with("puppet exited 6: "), "{message}");
    assert!(
        message.contains("Exec[broken]") && message.chars().count() <= 160,
        "{message}"
    );
    assert!(!message.contains('\n'), "{message}");
    let at = r["at"].as_u64().unwrap();
    assert_eq!(r["retry_at"].as_u64(), Some(at + 600));
    // The run directory is the run's, and holds Puppet's output.
    let st = status_json(&agent(&host, &["status", "--json"]).await);
    let run_dir = r["run_dir"].as_str().unwrap();
    assert_eq!(st["last_run"]["run_dir"].as_str(), Some(run_dir));
    assert!(read(&PathBuf::from(run_dir).join("puppet.jsonl")).contains("Exec[broken]"));
    // The status leaf holds what it held before results existed (the reason: no Swift).
    assert_eq!(
        value(&s, "/status/configured/failure/v1/compute31")
            .await
            .as_deref(),
        Some("puppet exited 6: changes were made and some resources failed")
    );

    // A retry of the same version is the second attempt.
    put(
        &s,
        schema.enable(&EnableLevel::Host(HostName::new("compute31").unwrap())),
        "true",
    )
    .await;
    let out = agent(&host, &["once"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let r = result_of(&s, "compute31").await.unwrap();
    assert_eq!(r["attempt"], 2);
    let at = r["at"].as_u64().unwrap();
    assert_eq!(r["retry_at"].as_u64(), Some(at + 1200), "the backoff doubles");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successful_run_soaks_and_is_checked_while_the_driver_holds_the_lock() {
    let Recorded {
        etcd: _etcd,
        url,
        s,
        work,
        host,
        puppet_runs,
    } = recorded("db31", "resync_interval = \"1h\"\nhealth_interval = \"0\"").await;
    let schema = Schema::default();
    // Validation records what the liveness record said while it ran.
    let checks = work.path().join("validation-seen");
    record_script(
        &host.validation_dir().join("05-record"),
        &url,
        &[("/agents/db31".to_string(), &checks)],
        0,
    );
    start_rollout(&s, "v1", serde_json::json!({"min_healthy_time": "4s"})).await;
    put(&s, schema.lock(jio_common::fleet::ROLLOUT_LOCK), r#"{"pid":1}"#).await;
    let log = work.path().join("agent.log");
    let mut daemon = spawn_logged(&host, &log);
    wait_for("the run result", Duration::from_secs(30), || async {
        result_of(&s, "db31").await.is_some()
    })
    .await;
    let r = result_of(&s, "db31").await.unwrap();
    assert_eq!(
        (r["version"].as_str(), r["ok"].as_bool()),
        (Some("v1"), Some(true))
    );
    assert!(r.get("step").is_none() && r.get("retry_at").is_none(), "{r}");
    let at = r["at"].as_u64().unwrap();
    assert_eq!(lines(&puppet_runs), 1);

    // Once min_healthy_time has passed (lock held), the soak's health check runs and
    // its pass is recorded at or past the end of the soak.
    wait_for("checked_at", Duration::from_secs(12), || async {
        result_of(&s, "db31")
            .await
            .is_some_and(|r| r["checked_at"].as_u64().is_some_and(|c| c >= at + 4))
    })
    .await;
    assert!(
        value(&s, "/locks/rollout").await.is_some(),
        "the lock was held all along"
    );
    // The check's own traces: the validation ran twice (the upgrade's, the soak's),
    // the second time with the record saying "checking", in a run directory of its
    // own whose output is the check's.
    let seen = read(&checks);
    assert_eq!(seen.lines().count(), 2, "{seen}");
    assert!(
        seen.lines().nth(1).unwrap().contains(r#""state":"checking""#),
        "{seen}"
    );
    let mut runs: Vec<PathBuf> = std::fs::read_dir(host.state_dir().join("runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    runs.sort();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_ne!(runs[1].display().to_string(), r["run_dir"].as_str().unwrap());
    assert!(read(&runs[1].join("validation.stdout")).contains("service answers"));
    assert!(!runs[1].join("puppet.stdout").exists(), "no puppet in a check");
    assert_eq!(lines(&puppet_runs), 1);
    assert!(read(&log).contains("health check of the min_healthy_time soak passed"));
    // The status leaf is as before.
    assert_eq!(
        entries(&s, "db31").await,
        set(&["/status/validated/success/v1/db31", "/running/versions/v1/db31"])
    );
    assert!(alive(&mut daemon), "{}", read(&log));
    daemon.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_host_does_not_start_until_the_hold_is_released() {
    let Recorded {
        etcd: _etcd,
        url: _,
        s,
        work,
        host,
        puppet_runs,
    } = recorded("compute32", "resync_interval = \"1h\"\nhealth_interval = \"0\"").await;
    let schema = Schema::default();
    let h = HostName::new("compute32").unwrap();
    let role = jio_common::names::Role::new("compute").unwrap();
    // Converged at v1 earlier; v2 is desired.
    std::fs::write(host.version_file(), "v1\n").unwrap();
    put(&s, schema.current_version(), "v2").await;
    let host_hold = schema.hold(&jio_common::keys::HoldTarget::Host(h.clone()));
    let role_hold = schema.hold(&jio_common::keys::HoldTarget::Role(role));
    put(
        &s,
        host_hold.clone(),
        r#"{"by":"asha","reason":"disk errors","at":1}"#,
    )
    .await;
    put(&s, role_hold.clone(), "not a hold record").await;
    let log = work.path().join("agent.log");
    let mut daemon = spawn_logged(&host, &log);
    wait_for("the idle record", Duration::from_secs(15), || async {
        agent_state(&s, "compute32").await.is_some()
    })
    .await;
    // Then the host is enabled: the hold still keeps it out.
    put(&s, schema.enable(&EnableLevel::Host(h.clone())), "true").await;
    let held = "held by asha: disk errors; not starting the upgrade to v2";
    wait_for("the hold's log line", Duration::from_secs(15), || async {
        read(&log).contains(held)
    })
    .await;
    assert_eq!(read(&log).matches(held).count(), 1, "logged once: {}", read(&log));
    assert_eq!(lines(&puppet_runs), 0, "started while held");
    assert_eq!(host.local_version().as_deref(), Some("v1"));
    assert_eq!(agent_state(&s, "compute32").await.as_deref(), Some("idle"));

    // The host's hold released: the role's, unreadable, still holds, named by key.
    s.delete(&host_hold).await.unwrap();
    wait_for(
        "the unreadable hold's log line",
        Duration::from_secs(15),
        || async { read(&log).contains("held by /holds/role/compute whose record cannot be read") },
    )
    .await;
    assert_eq!(lines(&puppet_runs), 0, "started while the role was held");

    // Released: it starts at once (the resync is an hour away: the watch woke it).
    let released = std::time::Instant::now();
    s.delete(&role_hold).await.unwrap();
    reported_at(&s, "compute32", "v2", Duration::from_secs(20)).await;
    assert!(released.elapsed() < Duration::from_secs(15));
    assert_eq!(lines(&puppet_runs), 1);
    assert_eq!(host.local_version().as_deref(), Some("v2"));
    assert!(alive(&mut daemon), "{}", read(&log));
    daemon.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_loses_when_a_hold_is_placed_after_the_decision_read() {
    use jio_agent::pass::PassResult;
    let Recorded {
        etcd: _etcd,
        url: _,
        s,
        work: _work,
        host,
        puppet_runs,
    } = recorded("compute33", "").await;
    let schema = Schema::default();
    let h = HostName::new("compute33").unwrap();
    put(&s, schema.enable(&EnableLevel::Host(h.clone())), "true").await;
    let (mut a, _stop) = embedded_agent(&host, &s);
    let obs = a.observe(false).await.unwrap();
    let hold = schema.hold(&jio_common::keys::HoldTarget::Host(h));
    put(&s, hold.clone(), r#"{"by":"asha","at":1}"#).await;
    assert_eq!(a.act(&obs).await.unwrap(), PassResult::Raced);
    assert_eq!(lines(&puppet_runs), 0, "puppet ran past a hold");
    // Decided again, it is held; released, it runs.
    let obs = a.observe(false).await.unwrap();
    assert!(matches!(
        a.act(&obs).await.unwrap(),
        PassResult::Idle(jio_agent::decide::Decision::Held { .. })
    ));
    s.delete(&hold).await.unwrap();
    let obs = a.observe(false).await.unwrap();
    assert!(matches!(a.act(&obs).await.unwrap(), PassResult::Ran { .. }));
    assert_eq!(lines(&puppet_runs), 1);
    a.take_liveness().unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
/// A rollout record that cannot be used holds every start; its windows are not
/// the agent's to decide (its clock may be wrong): the driver admits a host only
/// inside its window and disarms it when the window closes, so an agent that is
/// enabled starts, whatever its own clock says of the window.
async fn an_unusable_rollout_holds_starts_and_windows_are_the_drivers() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let s = open(&url).await;
    let schema = Schema::default();
    put(&s, schema.current_version(), "v2").await;
    put(&s, schema.enable(&EnableLevel::Global), "true").await;
    // Computes: a window that opens in two hours; databases: one open now.
    let rules = serde_json::json!({"windows": [
        {"days": "daily", "start": utc_hhmm(120), "end": utc_hhmm(180), "tz": "UTC", "groups": ["compute"]},
        {"days": "daily", "start": utc_hhmm(-60), "end": utc_hhmm(60), "tz": "UTC", "groups": ["db"]},
    ]});
    // First /rollouts/current names a record that is not there: nothing starts.
    let missing = "20260101T000000Z-v2";
    put(&s, schema.current_rollout(), missing).await;
    let work = tempfile::tempdir().unwrap();
    let mut daemons = Vec::new();
    let mut hosts = Vec::new();
    for name in ["compute34", "db34"] {
        let dir = work.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let host = Host::new(
            name,
            &url,
            &recording_puppet(&dir, &url, name),
            "resync_interval = \"1h\"\nhealth_interval = \"0\"",
        );
        std::fs::write(host.version_file(), "v1\n").unwrap();
        let log = dir.join("agent.log");
        daemons.push(spawn_logged(&host, &log));
        hosts.push((host, dir));
    }
    let log = |i: usize| read(&hosts[i].1.join("agent.log"));
    let runs = |i: usize| lines(&hosts[i].1.join("puppet-seen"));
    for i in 0..2 {
        wait_for(
            "the unusable rollout's log line",
            Duration::from_secs(15),
            || async {
                log(i).contains(&format!(
                    "key /rollouts/{missing}: missing (named by /rollouts/current)"
                ))
            },
        )
        .await;
        assert_eq!(runs(i), 0, "started without the rollout's rules: {}", log(i));
    }

    // The rollout is recorded (a new /rollouts/current wakes the agents).
    start_rollout(&s, "v2", rules).await;
    reported_at(&s, "db34", "v2", Duration::from_secs(30)).await;
    reported_at(&s, "compute34", "v2", Duration::from_secs(30)).await;
    assert!(!log(0).contains("outside the maintenance window"), "{}", log(0));
    assert_eq!((runs(0), runs(1)), (1, 1));
    for d in &mut daemons {
        assert!(alive(d));
        d.kill().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_lines_as_json_and_without_our_time_under_journald() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("store.db").display());
    // JSON: every log line is one object with its level, message and fields.
    let host = Host::new("compute8", &store, &["true".to_string()], "log_format = \"json\"");
    let out = agent(&host, &["once"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let logged: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?} in {stderr}")))
        .collect();
    assert!(
        logged
            .iter()
            .any(|v| v["message"] == "using store" && v["level"] == "INFO" && v["store"] == store.as_str()),
        "{stderr}"
    );
    // A command's closing word is a JSON line too, with its exit code.
    put(&open(&store).await, Schema::default().current_version(), "v2").await;
    let failing = Host::new(
        "compute7",
        &store,
        &["false".to_string()],
        "log_format = \"json\"",
    );
    let out = agent(&failing, &["once"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last: serde_json::Value = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?} in {stderr}")))
        .next_back()
        .unwrap();
    assert_eq!(last["level"], "ERROR", "{stderr}");
    assert_eq!(last["exit_code"], 1, "{stderr}");
    // Text on journald's stream (JOURNAL_STREAM names stderr): no time of ours,
    // journald stamps each line.
    let host = Host::new("compute9", &store, &["true".to_string()], "");
    let (reader, writer) = nix::unistd::pipe().unwrap();
    let st = nix::sys::stat::fstat(&writer).unwrap();
    let mut child = Command::from(host.agent(&bin(), &["once"]))
        .env("JOURNAL_STREAM", format!("{}:{}", st.st_dev, st.st_ino))
        .stdout(Stdio::null())
        .stderr(Stdio::from(writer))
        .spawn()
        .unwrap();
    assert_eq!(child.wait().await.unwrap().code(), Some(0));
    let mut journal = String::new();
    std::io::Read::read_to_string(&mut std::fs::File::from(reader), &mut journal).unwrap();
    let line = journal
        .lines()
        .find(|l| l.contains("using store"))
        .unwrap_or_default();
    assert!(
        line.starts_with(" INFO using store") || line.starts_with("INFO using store"),
        "{journal}"
    );
    // Without it (or with another stream named), the time leads each line.
    let out = Command::from(host.agent(&bin(), &["once"]))
        .env("JOURNAL_STREAM", "1:1")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.contains("using store"))
        .unwrap_or_default();
    assert!(line.starts_with("20"), "{stderr}");
}
