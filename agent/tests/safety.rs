//! jio-agent's part of issue 11, against a real etcd and real `run-parts`: no value
//! read from the store ends the daemon, a run starts only with a fenced record that
//! says so, and local write failures are failed runs with their reason.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use jio_common::keys::{EnableLevel, Key, Schema};
use jio_common::names::HostName;
use jio_common::store::{Compare, DynStore};
use jio_common::values::AgentState;
use jio_tests::etcd::etcdctl_put;
use jio_tests::inspect::{host_entries as entries, open, text};
use jio_tests::{Etcd, Host};
use tokio::process::{Child, Command};

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_jio-agent"))
}

async fn agent(host: &Host, args: &[&str]) -> Output {
    Command::from(host.agent(&bin(), args)).output().await.unwrap()
}

/// The daemon, its log in `log`.
fn spawn(host: &Host, log: &Path) -> Child {
    Command::from(host.agent(&bin(), &["run"]))
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(log).unwrap()))
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn wait_for<F, Fut>(what: &str, limit: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !f().await {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A "puppet" that exits 2 (changes), and records the host's `/agents` record as it
/// saw it when it started (read with the real `etcdctl`, not the project's code).
fn puppet_script(dir: &Path, url: &str, host: &str) -> Vec<String> {
    let script = dir.join("puppet.sh");
    let etcdctl = jio_tests::require_binary("etcdctl", "apt-get install -y etcd-client");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nETCDCTL_API=3 {} --endpoints={} get --print-value-only /agents/{host} >> {}/seen\nexit 2\n",
            etcdctl.display(),
            url.trim_start_matches("etcd://"),
            dir.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    vec![script.display().to_string()]
}

fn alive(d: &mut Child) -> bool {
    d.try_wait().unwrap().is_none()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_value_in_the_store_ends_the_daemon() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let s = open(&url).await;
    let schema = Schema::default();
    s.put(&schema.current_version(), "v1", None).await.unwrap();
    let work = tempfile::tempdir().unwrap();
    let host = Host::new(
        "compute1",
        &url,
        &puppet_script(work.path(), &url, "compute1"),
        "resync_interval = \"1h\"\nretry_interval = \"1h\"\nhealth_interval = \"0\"",
    );
    let log = work.path().join("agent.log");
    let mut daemon = spawn(&host, &log);
    wait_for("first converge", Duration::from_secs(30), || async {
        host.local_version().as_deref() == Some("v1")
    })
    .await;
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    // One bad byte in the desired version: logged naming the key, the daemon stays.
    etcdctl_put(&url, b"/current_version", b"v\xff2");
    wait_for("the error naming the key", Duration::from_secs(10), || async {
        log_text().contains("/current_version") && log_text().contains("not UTF-8")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(alive(&mut daemon), "the daemon exited: {}", log_text());
    // `once` and `pending-update` report it, never exit 64.
    let out = agent(&host, &["pending-update"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("/current_version"), "{}", text(&out));

    // An invalid deciding enable key blocks; the daemon stays up.
    etcdctl_put(&url, b"/config_state/enable_puppet/global", b"yes");
    etcdctl_put(&url, b"/current_version", b"v2");
    wait_for("the blocked decision", Duration::from_secs(10), || async {
        log_text().contains("blocked") && log_text().contains("/config_state/enable_puppet/global")
    })
    .await;
    assert!(alive(&mut daemon), "the daemon exited: {}", log_text());
    assert_eq!(
        host.local_version().as_deref(),
        Some("v1"),
        "a blocked host does not move"
    );
    let out = agent(&host, &["status"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("blocked"), "{}", text(&out));

    // Fixed: the watch wakes it and it acts at once.
    s.put(&schema.enable(&EnableLevel::Global), "true", None)
        .await
        .unwrap();
    wait_for(
        "the upgrade once the value is fixed",
        Duration::from_secs(30),
        || async { host.local_version().as_deref() == Some("v2") },
    )
    .await;
    assert!(alive(&mut daemon));
    // The error was logged once, not on every pass.
    assert_eq!(log_text().matches("not UTF-8").count(), 1, "{}", log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_starts_only_after_its_record_says_so() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let s = open(&url).await;
    s.put(&Schema::default().current_version(), "v1", None)
        .await
        .unwrap();
    let work = tempfile::tempdir().unwrap();
    let host = Host::new(
        "compute2",
        &url,
        &puppet_script(work.path(), &url, "compute2"),
        "health_interval = \"0\"",
    );
    let out = agent(&host, &["once"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let seen = std::fs::read_to_string(work.path().join("seen")).unwrap();
    assert!(
        seen.contains(r#""state":"upgrading""#) && seen.contains(r#""version":"v1""#),
        "when puppet started, the record said: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_start_loses_when_what_it_read_changed() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("store.db").display());
    let s: DynStore = open(&url).await;
    let schema = Schema::default();
    let host = HostName::new("compute3").unwrap();
    let enable = schema.enable(&EnableLevel::Host(host.clone()));
    let rev = s.put(&enable, "true", None).await.unwrap();
    let live = jio_agent::liveness::Liveness::start(
        s.clone(),
        schema.agent(&host),
        Duration::from_secs(3),
        AgentState::Idle,
        None,
    );
    let v = jio_common::names::Version::new("v2").unwrap();
    // The key moved since the decision read it: nothing is written.
    s.put(&enable, "false", None).await.unwrap();
    let won = live
        .begin(
            AgentState::Upgrading,
            Some(v.clone()),
            vec![Compare::ModRevision(enable.clone(), rev)],
            vec![],
        )
        .await
        .unwrap();
    assert!(!won);
    let record = |s: DynStore, k: Key| async move { s.get(&k).await.unwrap().map(|kv| kv.value) };
    wait_for("the idle record", Duration::from_secs(10), || {
        let (s, k) = (s.clone(), schema.agent(&host));
        async move { record(s, k).await.is_some_and(|v| v.contains("idle")) }
    })
    .await;
    // Unchanged since: the record says upgrading, bound to the lease.
    let rev = s.get(&enable).await.unwrap().unwrap().mod_revision;
    assert!(
        live.begin(
            AgentState::Upgrading,
            Some(v),
            vec![Compare::ModRevision(enable, rev)],
            vec![],
        )
        .await
        .unwrap()
    );
    let kv = s.get(&schema.agent(&host)).await.unwrap().unwrap();
    assert!(kv.value.contains("upgrading") && kv.lease.is_some(), "{kv:?}");
    // The keeper does not put an older record back.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        s.get(&schema.agent(&host))
            .await
            .unwrap()
            .unwrap()
            .value
            .contains("upgrading")
    );
    live.stop().await;
    assert!(
        s.get(&schema.agent(&host)).await.unwrap().is_none(),
        "the lease was revoked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_write_failures_are_failed_runs_with_their_reason() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let s = open(&url).await;
    let schema = Schema::default();
    s.put(&schema.current_version(), "v1", None).await.unwrap();
    let work = tempfile::tempdir().unwrap();
    let host = Host::new(
        "compute4",
        &url,
        &puppet_script(work.path(), &url, "compute4"),
        "retry_interval = \"1h\"\nhealth_interval = \"0\"",
    );
    let out = agent(&host, &["once"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // The version file cannot be written (its temporary file is in the way; the
    // tests run as root, so permissions would not stop it).
    std::fs::create_dir(host.version_file().with_extension("tmp-jio")).unwrap();
    s.put(&schema.current_version(), "v2", None).await.unwrap();
    let log = work.path().join("agent.log");
    let mut daemon = spawn(&host, &log);
    let failure = "/status/validated/failure/v2/compute4";
    wait_for("the validated failure", Duration::from_secs(30), || async {
        entries(&s, "compute4").await.contains(failure)
    })
    .await;
    let value = s.get(&Key::new(failure).unwrap()).await.unwrap().unwrap().value;
    assert!(value.contains("version file could not be written"), "{value}");
    let e = entries(&s, "compute4").await;
    assert!(
        !e.contains("/running/versions/v2/compute4"),
        "shown upgraded: {e:?}"
    );
    assert_eq!(host.local_version().as_deref(), Some("v1"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        alive(&mut daemon),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!log_text.contains("could not be reported"), "{log_text}");
    daemon.kill().await.unwrap();

    // The Facter fact cannot be written: a configured failure, with the reason.
    std::fs::remove_dir(host.version_file().with_extension("tmp-jio")).unwrap();
    let facts_dir = host.facts_file().parent().unwrap().to_path_buf();
    std::fs::remove_dir_all(&facts_dir).unwrap();
    std::fs::write(&facts_dir, "a file where a directory should be").unwrap();
    s.put(&schema.current_version(), "v3", None).await.unwrap();
    let out = agent(&host, &["once"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("Facter fact could not be written"),
        "{}",
        text(&out)
    );
    let value = s
        .get(&Key::new("/status/configured/failure/v3/compute4").unwrap())
        .await
        .unwrap()
        .unwrap()
        .value;
    assert!(value.contains("Facter fact could not be written"), "{value}");
    let status = agent(&host, &["status"]).await;
    assert!(!text(&status).contains("in progress"), "{}", text(&status));

    // A missing validation directory is named.
    std::fs::remove_file(&facts_dir).unwrap();
    std::fs::remove_dir_all(host.validation_dir()).unwrap();
    s.put(&schema.current_version(), "v4", None).await.unwrap();
    let out = agent(&host, &["once"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let value = s
        .get(&Key::new("/status/validated/failure/v4/compute4").unwrap())
        .await
        .unwrap()
        .unwrap()
        .value;
    assert!(
        value.contains("validation directory") && value.contains("does not exist"),
        "{value}"
    );
}
