//! Run logs in a real Swift, linked from `/status`, fetched by `jioctl logs`.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use jio_common::keys::{Key, Schema};
use jio_common::store::DynStore;
use jio_tests::inspect::{open, text};
use jio_tests::{Etcd, Host, Puppet, Swift};
use tokio::process::Command;

use common::agent_bin;

fn swift_section(swift: &Swift, key: &str) -> String {
    format!(
        "[swift]\nauth_url = \"{}\"\nuser = \"fleet:uploader\"\nkey_file = \"{}\"\ncontainer = \"runlogs\"\ndelete_after = \"7d\"\n",
        swift.auth_url(),
        swift.key_file(key).display()
    )
}

/// A real etcd whose current version is v1 and a real Swift, started together;
/// with the store's URL and the store.
async fn etcd_and_swift_at_v1() -> (Etcd, Swift, String, DynStore) {
    let (etcd, swift) = tokio::join!(Etcd::start(), Swift::start());
    let url = etcd.url();
    let s = open(&url).await;
    s.put(&Schema::default().current_version(), "v1", None)
        .await
        .unwrap();
    (etcd, swift, url, s)
}

/// Writes an executable script at `path`.
fn write_script(path: &Path, body: &str) {
    std::fs::write(path, body).unwrap();
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

/// Each host's agent daemon (`jio-agent run`), its output discarded.
fn spawn_daemons(hosts: &[Host]) -> Vec<tokio::process::Child> {
    hosts
        .iter()
        .map(|h| {
            Command::from(h.agent(&agent_bin(), &["run"]))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .unwrap()
        })
        .collect()
}

/// `jioctl logs`' flags to read Swift as the uploader, with the key in `key`.
fn swift_flags(swift: &Swift, key: &Path) -> Vec<String> {
    vec![
        "--swift-auth-url".into(),
        swift.auth_url(),
        "--swift-user".into(),
        "fleet:uploader".into(),
        "--swift-key-file".into(),
        key.display().to_string(),
    ]
}

async fn leaf(s: &DynStore, key: &str) -> Option<String> {
    s.get(&Key::new(key).unwrap()).await.unwrap().map(|kv| kv.value)
}

async fn wait_leaf_url(s: &DynStore, key: &str, limit: Duration) -> String {
    let start = Instant::now();
    loop {
        if let Some(v) = leaf(s, key).await
            && v.starts_with("http")
        {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "{key} got no link in {limit:?} (value {:?})",
            leaf(s, key).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_leave_links_and_jioctl_logs_prints_a_failed_run() {
    let (_etcd, swift, url, s) = etcd_and_swift_at_v1().await;
    let puppet_ok = Puppet::new();
    let ok = puppet_ok.manifest("ok", "notice('hello from the manifest')\n");
    let good = Host::new(
        "compute1",
        &url,
        &puppet_ok.command(&ok),
        &swift_section(&swift, "s3cr3t"),
    );
    let puppet_bad = Puppet::new();
    let bad = puppet_bad.manifest("bad", "exec { 'broken': command => '/bin/false' }\n");
    let failing = Host::new(
        "compute2",
        &url,
        &puppet_bad.command(&bad),
        &swift_section(&swift, "s3cr3t"),
    );

    let (a, b) = tokio::join!(
        Command::from(good.agent(&agent_bin(), &["once"])).output(),
        Command::from(failing.agent(&agent_bin(), &["once"])).output()
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.status.code(), Some(0), "{}", text(&a));
    assert_eq!(b.status.code(), Some(1), "{}", text(&b));

    // The success leaf links the whole run's output (the configure step is reported
    // with the validation that follows it), fetchable with a token.
    let link = wait_leaf_url(
        &s,
        "/status/validated/success/v1/compute1",
        Duration::from_secs(5),
    )
    .await;
    assert!(
        link.contains("/runlogs/compute1/v1/") && link.ends_with("-validated.log"),
        "{link}"
    );
    let body = swift.get(&link).await;
    assert!(
        body.contains("== puppet.jsonl")
            && body.contains("== puppet.stdout")
            && body.contains("== validation.stdout")
            && body.contains("service answers"),
        "{body}"
    );

    // The failure leaf links Puppet's output.
    let link = wait_leaf_url(
        &s,
        "/status/configured/failure/v1/compute2",
        Duration::from_secs(5),
    )
    .await;
    assert!(link.ends_with("-configured.log"), "{link}");
    let body = swift.get(&link).await;
    assert!(
        body.contains("== puppet.jsonl") && body.contains("/bin/false"),
        "{body}"
    );

    // jioctl: get-failures shows the link; logs prints the log.
    let key = swift.key_file("s3cr3t");
    let jioctl = |args: &[&str]| common::jioctl(&url, args);
    let out = jioctl(&["get-failures", "--hosts"]).output().await.unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&link),
        "{}",
        text(&out)
    );
    let out = jioctl(&["logs", "compute2"])
        .args(swift_flags(&swift, &key))
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains("configured failure") && printed.contains("/bin/false"),
        "{printed}"
    );
    // Asking for a phase the host has no entry for is a clear error.
    let out = jioctl(&["logs", "compute2", "--phase", "validated"])
        .args(swift_flags(&swift, &key))
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("no validated status entry for v1"),
        "{}",
        text(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swift_down_during_a_run_then_agent_restart_loses_nothing() {
    let (etcd, mut swift) = tokio::join!(Etcd::start(), Swift::start());
    let url = etcd.url();
    let s = open(&url).await;
    let fake = format!("{}/../examples/fake-puppet.sh", env!("CARGO_MANIFEST_DIR"));
    let work = tempfile::tempdir().unwrap();
    let cmd = vec![
        fake,
        "--logdest".into(),
        "{log_jsonl}".into(),
        work.path().join("deployed").display().to_string(),
    ];
    let host = Host::new("db1", &url, &cmd, &swift_section(&swift, "s3cr3t"));
    swift.stop_proxy();
    s.put(&Schema::default().current_version(), "v1", None)
        .await
        .unwrap();

    let mut daemon = Command::from(host.agent(&agent_bin(), &["run"]))
        .env("FAKE_PUPPET_SECONDS", "0.2")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The status entry is written at once, with no link yet.
    let start = Instant::now();
    while leaf(&s, "/status/validated/success/v1/db1").await.is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no status entry while Swift is down"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        leaf(&s, "/status/validated/success/v1/db1").await.as_deref(),
        Some("")
    );
    let queued = || {
        std::fs::read_dir(host.state_dir().join("uploads"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    assert!(queued() >= 2, "the log waits on disk");

    // The agent dies while Swift is down; a new one takes over the queue.
    daemon.start_kill().unwrap();
    daemon.wait().await.unwrap();
    let mut daemon = Command::from(host.agent(&agent_bin(), &["run"]))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    swift.start_proxy().await;
    let link = wait_leaf_url(&s, "/status/validated/success/v1/db1", Duration::from_secs(60)).await;
    let body = swift.get(&link).await;
    assert!(
        body.contains("host db1, version v1, validated success") && body.contains("service answers"),
        "{body}"
    );
    let start = Instant::now();
    while queued() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the queue did not drain"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    daemon.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_a_clear_error_and_runs_are_still_reported() {
    let (_etcd, swift, url, s) = etcd_and_swift_at_v1().await;
    let host = Host::new(
        "db2",
        &url,
        &["true".to_string()],
        &swift_section(&swift, "not-the-key-42"),
    );
    let out = Command::from(host.agent(&agent_bin(), &["once"]))
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let log = text(&out);
    assert!(
        log.contains("swift authentication as \"fleet:uploader\"") && log.contains("HTTP 401"),
        "{log}"
    );
    assert!(!log.contains("not-the-key-42"), "the key leaked: {log}");
    assert!(log.contains("stay queued"), "{log}");
    assert_eq!(
        leaf(&s, "/status/validated/success/v1/db2").await.as_deref(),
        Some("")
    );
    assert!(
        s.get(&Key::new("/running/versions/v1/db2").unwrap())
            .await
            .unwrap()
            .is_some()
    );
}

/// A composable rollout's steps leave links too: each service's step entry under
/// `/status/steps/` is linked to a log holding its tasks' output, and a failed task
/// is named (service, step, task, exit code, log) by `explain` and `get-failures`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_composable_rollouts_steps_are_linked_and_a_failed_task_is_named() {
    let (_etcd, swift, url, s) = etcd_and_swift_at_v1().await;
    let services = tempfile::tempdir().unwrap();
    let script = services.path().join("task.sh");
    write_script(
        &script,
        "#!/bin/sh\n# Prints what it does; fails on the host named by its argument.\n\
         echo \"task $JIO_TASK of $JIO_SERVICE at $JIO_STEP on $JIO_HOST\"\n\
         if [ \"$JIO_HOST\" = \"$1\" ]; then echo 'boom: the database is locked' >&2; exit 3; fi\n",
    );
    let sh = script.display().to_string();
    std::fs::write(
        services.path().join("svc.toml"),
        format!(
            "[[task]]\nname = \"quiesce\"\nstep = 1\nwhen = \"pre\"\ncommand = [\"{sh}\", \"nobody\"]\n\n\
             [[task]]\nname = \"migrate\"\nstep = 2\nwhen = \"post\"\ncommand = [\"{sh}\", \"compute2\"]\n"
        ),
    )
    .unwrap();
    // One Puppet sandbox per host: two `puppet apply` at once on one vardir can
    // fail the first converge, and with retry_interval 1h the host would stay
    // short of v1.
    let puppets = [Puppet::new(), Puppet::new()];
    // Top-level keys before the [swift] table.
    let extra = format!(
        "services_dir = \"{}\"\nretry_interval = \"1h\"\nhealth_interval = \"0\"\n{}",
        services.path().display(),
        swift_section(&swift, "s3cr3t")
    );
    let hosts: Vec<Host> = ["compute1", "compute2"]
        .iter()
        .zip(&puppets)
        .map(|(h, puppet)| {
            let ok = puppet.manifest("ok", "notice('hello')\n");
            Host::new(h, &url, &puppet.command(&ok), &extra)
        })
        .collect();
    let mut daemons = spawn_daemons(&hosts);
    jio_tests::inspect::wait_for(
        "both hosts at v1 with their catalogs",
        Duration::from_secs(180),
        || async {
            hosts.iter().all(|h| h.local_version().as_deref() == Some("v1"))
                && leaf(&s, "/hosts/compute2/services").await.is_some()
                && leaf(&s, "/hosts/compute1/services").await.is_some()
                && s.list(&Key::new("/runs/").unwrap()).await.unwrap().kvs.is_empty()
        },
    )
    .await;
    let rules = r#"{"roles_data": {"compute": ["svc"]}, "rolling_rules": {"global": 1}}"#;
    let out = common::jioctl(
        &url,
        &["upgrade", "v2", "--instructions", rules, "--timeout", "2m"],
    )
    .output()
    .await
    .unwrap();
    // compute2's post step fails: the rollout stops (max_failures 0).
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let id = s
        .list(&Key::new("/rollouts/").unwrap())
        .await
        .unwrap()
        .kvs
        .iter()
        .filter_map(|kv| kv.key.as_str().strip_prefix("/rollouts/").map(str::to_string))
        .find(|k| k.ends_with("-v2"))
        .unwrap();
    let link = wait_leaf_url(
        &s,
        &format!("/status/steps/{id}/pre-1/svc/success/compute1"),
        Duration::from_secs(10),
    )
    .await;
    let body = swift.get(&link).await;
    assert!(
        body.contains("task quiesce of svc at pre-1 on compute1"),
        "{body}"
    );
    let failed = wait_leaf_url(
        &s,
        &format!("/status/steps/{id}/post-2/svc/failure/compute2"),
        Duration::from_secs(10),
    )
    .await;
    let body = swift.get(&failed).await;
    assert!(body.contains("boom: the database is locked"), "{body}");
    let jioctl = |args: &[&str]| common::jioctl(&url, args);
    // The result names the step, the service, the task, the exit code; its log
    // link arrives with the upload.
    jio_tests::inspect::wait_for(
        "compute2's result to carry its log link",
        Duration::from_secs(10),
        || async {
            leaf(&s, "/results/compute2")
                .await
                .is_some_and(|v| v.contains(&failed))
        },
    )
    .await;
    let out = jioctl(&["explain", "compute2"]).output().await.unwrap();
    let t = text(&out);
    assert!(
        t.contains("step post-2, service svc, task \"migrate\", exit 3")
            && t.contains("boom: the database is locked")
            && t.contains(&failed),
        "{t}"
    );
    let out = jioctl(&["get-failures", "--hosts"]).output().await.unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(
        t.lines()
            .any(|l| l.starts_with("compute2") && l.contains("post-2 svc") && l.contains(&failed)),
        "{t}"
    );
    // After the rollout ended, status still counts compute2 failed, and says where.
    let out = jioctl(&["status"]).output().await.unwrap();
    let t = text(&out);
    let line = t.lines().find(|l| l.starts_with("compute2")).unwrap_or_default();
    assert!(
        line.contains("failed at post-2, service svc, task \"migrate\", exit 3"),
        "{t}"
    );
    for d in &mut daemons {
        let _ = d.start_kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_commands_output_is_linked_and_jioctl_logs_command_prints_it() {
    let (_etcd, swift, url, s) = etcd_and_swift_at_v1().await;
    let actions = tempfile::tempdir().unwrap();
    let action = actions.path().join("restart");
    write_script(
        &action,
        "#!/bin/sh\necho \"restarting $1 on $JIO_HOST\"\n\
         [ \"$JIO_HOST\" = compute2 ] && { echo \"$1 did not come back on $JIO_HOST\" >&2; exit 3; }\nexit 0\n",
    );
    // Top-level keys before the [swift] table.
    let extra = format!(
        "actions_dir = \"{}\"\nhealth_interval = \"0\"\n{}",
        actions.path().display(),
        swift_section(&swift, "s3cr3t")
    );
    let hosts: Vec<Host> = ["compute1", "compute2"]
        .iter()
        .map(|h| Host::new(h, &url, &["/bin/true".to_string()], &extra))
        .collect();
    let mut daemons = spawn_daemons(&hosts);
    jio_tests::inspect::wait_for("both agents at v1", Duration::from_secs(60), || async {
        hosts.iter().all(|h| h.local_version().as_deref() == Some("v1"))
    })
    .await;
    let out = common::jioctl(&url, &["run", "--all", "restart", "nova-compute"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let id = common::commands::command_id(&text(&out));
    // Each host's output is uploaded and linked from its leaf.
    let link = wait_leaf_url(
        &s,
        &format!("/command_runs/{id}/logs/compute2"),
        Duration::from_secs(30),
    )
    .await;
    assert!(
        link.contains(&format!("/runlogs/compute2/commands/{id}/")),
        "{link}"
    );
    let body = swift.get(&link).await;
    assert!(
        body.contains("fleet command log") && body.contains("nova-compute did not come back on compute2"),
        "{body}"
    );
    wait_leaf_url(
        &s,
        &format!("/command_runs/{id}/logs/compute1"),
        Duration::from_secs(30),
    )
    .await;
    // jioctl logs --command prints it, and names what is missing otherwise.
    let key = swift.key_file("s3cr3t");
    let logs = |host: &str, id: &str| {
        let mut c = common::jioctl(&url, &["logs", host, "--command", id]);
        c.args(swift_flags(&swift, &key));
        c
    };
    let out = logs("compute1", &id).output().await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("restarting nova-compute on compute1"),
        "{}",
        text(&out)
    );
    let out = logs("compute1", "20200101T000000Z-nothing")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("no fleet command 20200101T000000Z-nothing"),
        "{}",
        text(&out)
    );
    // No secret in what jioctl or the agents say.
    assert!(!text(&out).contains("s3cr3t"));
    for d in &mut daemons {
        let _ = d.start_kill();
    }
}
