//! Fleet commands (issue 18), against a real etcd with real `jio-agent` daemons
//! and `jioctl` processes: the rolling limit, a failure stopping the command,
//! actions that are not installed and `allow_any_command`, `kill -9` of an agent
//! mid-command, `cancel` mid-way, and a command and an upgrade on the same hosts.
//!
//! The action is a script that appends its own start and end to one file shared by
//! the fleet (and the upgrade's "Puppet" does the same in its own file): every
//! assertion on overlap and repetition comes from those files, never from jioctl's
//! classification. The unit tests at the end feed the checks logs that break them.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::time::Duration;

use jio_tests::Etcd;
use jio_tests::inspect::{open, text};

use common::commands::*;
use common::fleet::{Fleet, Run, finish, keys_under, signal, spawn};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

const COMPUTES: [&str; 6] = [
    "compute1", "compute2", "compute3", "compute4", "compute5", "compute6",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_under_a_limit_of_two_never_runs_on_more_than_two_hosts_at_once() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &COMPUTES, 0.1, |_| a.config(false)).await;
    a.set_seconds(0.8);
    let out = run_bounded(
        &url,
        &[
            "run",
            "--role",
            "compute",
            "--instructions",
            r#"{"rolling_rules": {"roles": {"compute": 2}}}"#,
            "restart",
            "nova-compute",
            "--graceful",
        ],
    )
    .await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        text(&out),
        diagnostics(&f, &a)
    );
    let runs = a.runs();
    // Every host ran it exactly once, with its arguments as a list.
    assert_eq!(runs.len(), COMPUTES.len(), "{}", a.log());
    for h in COMPUTES {
        assert_eq!(runs.iter().filter(|r| r.host == h).count(), 1, "{h}: {}", a.log());
    }
    assert!(
        a.log()
            .lines()
            .filter(|l| l.starts_with("start"))
            .all(|l| l.ends_with(" nova-compute --graceful")),
        "{}",
        a.log()
    );
    // Never more than two at once, by the action's own log; and two were reached,
    // so the check could fail.
    let (n, at) = max_overlap(&runs);
    assert!(n <= 2, "{n} hosts ran the action at once: {at:?}\n{}", a.log());
    assert_eq!(n, 2, "the limit was never reached: {}", a.log());
    // The summary names every host, its exit code and where its output is.
    let stdout = String::from_utf8_lossy(&out.stdout);
    for h in COMPUTES {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(h))
            .unwrap_or_else(|| panic!("{stdout}"));
        assert!(line.contains("succeeded") && line.contains(" 0 "), "{line}");
        assert!(line.contains("command-"), "the run directory: {line}");
    }
    assert!(stdout.contains("6 of 6 hosts succeeded"), "{stdout}");
    let id = command_id(&text(&out));
    let rec = command_record(&url, &id).await;
    assert_eq!(rec["state"], "done", "{rec:#}");
    // Nothing is left admitted.
    let s = open(&url).await;
    assert!(keys_under(&s, "/config_state/commands/").await.is_empty());
    // `commands show --json` agrees, host by host.
    let shown = run_bounded(&url, &["--json", "commands", "show", &id]).await;
    let v: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(v["counts"]["succeeded"], 6, "{v:#}");
    assert_eq!(v["hosts"][0]["exit_code"], 0, "{v:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_host_stops_the_command_under_max_failures() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &COMPUTES, 0.1, |_| a.config(false)).await;
    a.fail("compute2");
    let out = run_bounded(
        &url,
        &[
            "run",
            "--role",
            "compute",
            "--instructions",
            r#"{"rolling_rules": {"roles": {"compute": 1}}, "max_failures": 0}"#,
            "restart",
            "nova-compute",
        ],
    )
    .await;
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}\n{}",
        text(&out),
        diagnostics(&f, &a)
    );
    let runs = a.runs();
    // One at a time in name order: compute1, then compute2 fails; nothing after it.
    let hosts: Vec<&str> = runs.iter().map(|r| r.host.as_str()).collect();
    assert_eq!(hosts, ["compute1", "compute2"], "{}", a.log());
    let id = command_id(&text(&out));
    let rec = command_record(&url, &id).await;
    assert_eq!(rec["state"], "failed", "{rec:#}");
    let failed = result_of(&url, &id, "compute2").await.unwrap();
    assert_eq!(failed["outcome"], "failed", "{failed:#}");
    assert_eq!(failed["exit_code"], 3, "{failed:#}");
    assert!(
        failed["message"]
            .as_str()
            .unwrap()
            .contains("nova-compute did not come back"),
        "the message carries the action's own stderr: {failed:#}"
    );
    for h in ["compute3", "compute4", "compute5", "compute6"] {
        assert!(result_of(&url, &id, h).await.is_none(), "{h} has a result");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("compute2"))
        .unwrap_or_else(|| panic!("{}", text(&out)));
    assert!(line.contains("failed") && line.contains(" 3 "), "{stdout}");
    let line = stdout.lines().find(|l| l.starts_with("compute5")).unwrap();
    assert!(line.contains("not run"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_that_are_not_installed_are_refused_and_allow_any_command_runs_an_argument_list() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    // closed1 keeps the default (only installed actions); open1 allows any command.
    let f = Fleet::start_with(&url, &url, &["closed1", "open1"], 0.1, |h| a.config(h == "open1")).await;
    let marker = a.path("any.log");
    // An action that is installed nowhere: refused on closed1, with the reason.
    let out = run_bounded(&url, &["run", "--all", "flush-caches"]).await;
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}\n{}",
        text(&out),
        diagnostics(&f, &a)
    );
    let id = command_id(&text(&out));
    let refused = result_of(&url, &id, "closed1").await.unwrap();
    assert_eq!(refused["outcome"], "refused", "{refused:#}");
    let msg = refused["message"].as_str().unwrap();
    assert!(
        msg.contains("not installed") && msg.contains("allow_any_command is off"),
        "{msg}"
    );
    // On open1 it runs as a program, which does not exist: failed, not refused.
    let open = result_of(&url, &id, "open1").await.unwrap();
    assert_eq!(open["outcome"], "failed", "{open:#}");
    // An argument list: refused where it is off (never run), run where it is on.
    let out = run_bounded(
        &url,
        &[
            "run",
            "--all",
            "/bin/sh",
            "-c",
            &format!("echo \"$JIO_HOST\" >> {}", marker.display()),
        ],
    )
    .await;
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}\n{}",
        text(&out),
        diagnostics(&f, &a)
    );
    let id = command_id(&text(&out));
    let ran = std::fs::read_to_string(&marker).unwrap_or_default();
    assert_eq!(ran, "open1\n", "only the host that allows any command ran it");
    let refused = result_of(&url, &id, "closed1").await.unwrap();
    assert_eq!(refused["outcome"], "refused", "{refused:#}");
    assert!(
        refused["message"].as_str().unwrap().contains("allow_any_command"),
        "{refused:#}"
    );
    assert_eq!(
        result_of(&url, &id, "open1").await.unwrap()["outcome"],
        "succeeded"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("1 of 2 hosts succeeded"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_mid_command_reports_it_interrupted_and_does_not_run_it_again() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let mut f = Fleet::start_with(&url, &url, &["compute1", "compute2"], 0.1, |_| a.config(false)).await;
    a.set_seconds(30.0);
    let follower = spawn(&url, &["run", "--hosts", "compute1", "restart", "nova"]);
    wait_started(&a, "compute1").await;
    let pids = action_pids(&a.actions_dir());
    assert!(!pids.is_empty(), "the action runs");
    // kill -9 the agent in the middle of the action, then start it again.
    signal(&f.daemons[0], nix::sys::signal::Signal::SIGKILL);
    let _ = f.daemons[0].wait().await;
    a.set_seconds(0.2);
    f.daemons[0] = f.spawn_agent(0);
    let out = finish(follower, secs(60)).await;
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}\n{}",
        text(&out),
        diagnostics(&f, &a)
    );
    let id = command_id(&text(&out));
    let r = result_of(&url, &id, "compute1").await.unwrap();
    assert_eq!(r["outcome"], "interrupted", "{r:#}");
    assert!(r["message"].as_str().unwrap().contains("not run again"), "{r:#}");
    // By the action's own log: started once, never again; and the new agent
    // stopped what the killed one left running.
    assert_eq!(a.runs().len(), 1, "{}", a.log());
    for p in pids {
        assert!(!process_alive(p), "the orphaned action {p} still runs");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("compute1") && l.contains("interrupted")),
        "{stdout}"
    );

    // With --rerun-interrupted the same fault runs it again (attempt 2), once.
    a.set_seconds(30.0);
    let follower = spawn(
        &url,
        &[
            "run",
            "--hosts",
            "compute2",
            "--rerun-interrupted",
            "restart",
            "nova",
        ],
    );
    wait_started(&a, "compute2").await;
    signal(&f.daemons[1], nix::sys::signal::Signal::SIGKILL);
    let _ = f.daemons[1].wait().await;
    a.set_seconds(0.2);
    f.daemons[1] = f.spawn_agent(1);
    let out = finish(follower, secs(60)).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        text(&out),
        diagnostics(&f, &a)
    );
    let id = command_id(&text(&out));
    let r = result_of(&url, &id, "compute2").await.unwrap();
    assert_eq!(r["outcome"], "succeeded", "{r:#}");
    assert_eq!(r["attempt"], 2, "{r:#}");
    let twice: Vec<Run> = a.runs().into_iter().filter(|r| r.host == "compute2").collect();
    assert_eq!(twice.len(), 2, "{}", a.log());
    assert!(twice[0].end.is_none() && twice[1].end.is_some(), "{}", a.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_mid_way_lets_the_running_host_finish_and_starts_no_other() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let names = ["compute1", "compute2", "compute3", "compute4"];
    let f = Fleet::start_with(&url, &url, &names, 0.1, |_| a.config(false)).await;
    a.set_seconds(3.0);
    let follower = spawn(
        &url,
        &[
            "run",
            "--role",
            "compute",
            "--instructions",
            r#"{"rolling_rules": {"global": 1}}"#,
            "restart",
            "nova",
        ],
    );
    wait_started(&a, "compute1").await;
    let id = a.runs()[0].version.clone();
    let cancelled = run_bounded(&url, &["commands", "cancel", &id, "--reason", "wrong build"]).await;
    assert_eq!(cancelled.status.code(), Some(0), "{}", text(&cancelled));
    assert!(
        text(&cancelled).contains("1 host running it finishes"),
        "{}",
        text(&cancelled)
    );
    let at_cancel = super_now();
    let out = finish(follower, secs(60)).await;
    assert_eq!(
        out.status.code(),
        Some(6),
        "{}\n{}",
        text(&out),
        diagnostics(&f, &a)
    );
    let runs = a.runs();
    // The running host finished; no host started after the cancel.
    assert_eq!(runs.len(), 1, "{}", a.log());
    assert!(runs[0].end.is_some(), "{}", a.log());
    assert!(runs.iter().all(|r| r.start < at_cancel), "{}", a.log());
    let rec = command_record(&url, &id).await;
    assert_eq!(rec["state"], "cancelled", "{rec:#}");
    assert_eq!(rec["reason"], "wrong build", "{rec:#}");
    assert_eq!(
        result_of(&url, &id, "compute1").await.unwrap()["outcome"],
        "succeeded"
    );
    // Nothing is left admitted, and a second cancel says there is nothing to do.
    let s = open(&url).await;
    assert!(keys_under(&s, "/config_state/commands/").await.is_empty());
    let again = run_bounded(&url, &["commands", "cancel", &id]).await;
    assert_eq!(again.status.code(), Some(1), "{}", text(&again));
    assert!(text(&again).contains("already cancelled"), "{}", text(&again));
}

fn super_now() -> f64 {
    common::fleet::now()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_and_an_upgrade_never_run_at_once_on_a_host_and_share_the_limit() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let names = ["compute1", "compute2", "compute3"];
    let f = Fleet::start_with(&url, &url, &names, 0.1, |_| a.config(false)).await;
    f.set_seconds(1.0);
    a.set_seconds(1.0);
    let rules = r#"{"rolling_rules": {"roles": {"compute": 1}}}"#;
    let upgrade = spawn(&url, &["upgrade", "v2", "--instructions", rules]);
    let command = spawn(
        &url,
        &[
            "run",
            "--role",
            "compute",
            "--instructions",
            rules,
            "restart",
            "nova",
        ],
    );
    let up = finish(upgrade, secs(120)).await;
    let cmd = finish(command, secs(120)).await;
    assert_eq!(
        up.status.code(),
        Some(0),
        "{}\n{}",
        text(&up),
        diagnostics(&f, &a)
    );
    assert_eq!(
        cmd.status.code(),
        Some(0),
        "{}\n{}",
        text(&cmd),
        diagnostics(&f, &a)
    );
    assert!(f.all_at("v2"));
    // Puppet's log and the action's log, together.
    let mut all: Vec<Run> = f.runs().into_iter().filter(|r| r.version == "v2").collect();
    all.extend(a.runs());
    assert_eq!(all.len(), 6, "three upgrades and three commands:\n{all:#?}");
    // On one host, never both at once.
    let v = same_host_overlaps(&all);
    assert!(v.is_empty(), "{v:?}\n{all:#?}");
    // Across the role, one host in flight at a time, whatever it runs.
    let (n, at) = max_overlap(&all);
    assert_eq!(n, 1, "{n} compute hosts busy at once: {at:?}\n{all:#?}");
}

#[test]
fn the_log_checks_can_fail() {
    let log = "start compute1 c1 1.0 x\n\
               start compute2 c1 1.5 x\n\
               start compute1 v2 1.8\n\
               end compute1 c1 2.0\n\
               end compute2 c1 3.0\n\
               end compute1 v2 4.0\n\
               start compute2 c1 5.0 x\n";
    let runs = parse_log(log);
    assert_eq!(runs.len(), 4);
    assert_eq!(max_overlap(&runs).0, 3);
    assert_eq!(same_host_overlaps(&runs).len(), 1);
    assert_eq!(repeated(&runs, "c1"), ["compute2"]);
    assert!(runs[3].end.is_none());
    // A log that keeps every rule.
    let ok = parse_log("start a c1 1 x\nend a c1 2\nstart b c1 2.5 x\nend b c1 3\n");
    assert_eq!(max_overlap(&ok).0, 1);
    assert!(same_host_overlaps(&ok).is_empty());
    assert!(repeated(&ok, "c1").is_empty());
}

/// On Consul with ACLs (the Consul API test server), the agents under the README's
/// `jio-agent` policy: each host runs the command once, at its first attempt (a
/// start's compare on keys it writes itself stays in its transaction), under the
/// limit, by the action's own log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_on_consul_runs_once_per_host_under_the_agents_policy() {
    use jio_tests::consul::{AclToken, ConsulOptions, ConsulServer};
    let server = ConsulServer::start(ConsulOptions {
        token: Some("operator-c0ffee-secret".into()),
        tokens: vec![AclToken::jio_agent("agent-c0ffee-secret")],
        ..ConsulOptions::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let url = server.url_with_token(dir.path(), "operator.token", "operator-c0ffee-secret");
    let agents_url = server.url_with_token(dir.path(), "agent.token", "agent-c0ffee-secret");
    let a = Actions::new();
    let names = ["compute1", "compute2", "compute3"];
    let f = Fleet::start_with(&url, &agents_url, &names, 0.1, |_| a.config(false)).await;
    let follower = spawn(
        &url,
        &[
            "run",
            "--role",
            "compute",
            "--instructions",
            r#"{"rolling_rules": {"roles": {"compute": 1}}}"#,
            "restart",
            "nova",
        ],
    );
    let out = finish(follower, secs(60)).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        text(&out),
        diagnostics(&f, &a)
    );
    let id = command_id(&text(&out));
    let runs = a.runs();
    assert_eq!(runs.len(), 3, "{}", a.log());
    assert!(repeated(&runs, &id).is_empty(), "{}", a.log());
    assert_eq!(max_overlap(&runs).0, 1, "{}", a.log());
    for h in names {
        let r = result_of(&url, &id, h).await.unwrap();
        assert_eq!(r["outcome"], "succeeded", "{r:#}");
        assert_eq!(r["attempt"], 1, "{r:#}");
    }
}
