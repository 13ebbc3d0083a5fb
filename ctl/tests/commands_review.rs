//! A review of fleet commands (issue 18): attacks on its promises, against a real
//! etcd with real `jio-agent` daemons and `jioctl` processes. Every check on overlap
//! and repetition comes from the action's own log (each start and end appended to
//! one file shared by the fleet), never from jioctl's classification.
//!
//! An attack that found a defect says so in its doc comment ("Found:"); each of
//! those failed before its fix.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::time::Duration;

use jio_tests::Etcd;
use jio_tests::etcd::etcdctl_put;
use jio_tests::inspect::{open, text, wait_for};
use nix::sys::signal::Signal;

use common::commands::*;
use common::fleet::{Fleet, Run, finish, keys_under, signal, spawn};
use common::run;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

const ONE_COMPUTE: &str = r#"{"rolling_rules": {"roles": {"compute": 1}}}"#;
const GLOBAL_ONE: &str = r#"{"rolling_rules": {"global": 1}}"#;

// ---------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------

/// Bad host names, unknown hosts and roles, rollout-only or broken rules, bad
/// timeouts, unknown ids, `logs --command` without Swift: each refused with its
/// exit code and the value named, and nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_naming_the_value_and_nothing_is_written() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let _f = Fleet::start_with(&url, &url, &["compute1", "controller1"], 0.1, |_| a.config(false)).await;
    let unknown = "20261125T000000Z-nope";
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (
            vec!["run", "--hosts", "compute1,nosuch9", "restart"],
            64,
            "nosuch9",
        ),
        (vec!["run", "--hosts", "Bad_Host!", "restart"], 64, "Bad_Host!"),
        (vec!["run", "--role", "nosuchrole", "restart"], 64, "nosuchrole"),
        (
            vec!["run", "--all", "--instructions", r#"{"canary": 1}"#, "restart"],
            3,
            "canary",
        ),
        (
            vec!["run", "--all", "--instructions", r#"{"stages": []}"#, "restart"],
            3,
            "stages",
        ),
        (
            vec![
                "run",
                "--all",
                "--instructions",
                r#"{"progress_deadline": "5m"}"#,
                "restart",
            ],
            3,
            "progress_deadline",
        ),
        (
            vec!["run", "--all", "--instructions", "{not json", "restart"],
            3,
            "malformed JSON",
        ),
        (
            vec![
                "run",
                "--all",
                "--instructions",
                r#"{"rolling_rules": {"global": -1}}"#,
                "restart",
            ],
            3,
            "global",
        ),
        (
            vec!["run", "--all", "--instructions", r#"{"rolling": {}}"#, "restart"],
            3,
            "rolling",
        ),
        (
            vec!["run", "--all", "--timeout", "0s", "restart"],
            64,
            "--timeout",
        ),
        (
            vec!["run", "--all", "--timeout", "banana", "restart"],
            64,
            "banana",
        ),
        (vec!["run", "restart"], 64, "--all"),
        (vec!["run", "--all", ""], 64, "empty"),
        (vec!["run", "--all", "--role", "compute", "restart"], 64, "--role"),
        (
            vec![
                "run",
                "--all",
                "--instructions-file",
                "/nonexistent/rules.json",
                "restart",
            ],
            64,
            "/nonexistent/rules.json",
        ),
        (vec!["commands", "show", "not-an-id"], 64, "not-an-id"),
        (vec!["commands", "show", unknown], 1, unknown),
        (vec!["commands", "follow", unknown], 1, unknown),
        (vec!["commands", "cancel", unknown], 1, unknown),
        // What the store says comes before asking for Swift credentials.
        (
            vec!["logs", "--command", unknown, "compute1"],
            1,
            "no fleet command",
        ),
        (vec!["logs", "--command", "garbage", "compute1"], 64, "garbage"),
    ];
    let mut wrong = Vec::new();
    for (args, code, names) in &cases {
        let out = run(&url, args).await;
        let t = text(&out);
        if out.status.code() != Some(*code) || !t.contains(names) {
            wrong.push(format!(
                "jioctl {args:?}: exit {:?} (want {code}), output must name {names:?}:\n{t}",
                out.status.code()
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let s = open(&url).await;
    for prefix in ["/commands/", "/command_runs/", "/config_state/commands/"] {
        let left = keys_under(&s, prefix).await;
        assert!(left.is_empty(), "bad input wrote under {prefix}: {left:?}");
    }
}

/// Found: a role misspelt in a command's rolling rules (`comptue`) is neither
/// refused nor warned about: the command runs with no limit at all, every host at
/// once. (`jioctl upgrade` at least warns, naming it; `fleet_commands::create`
/// drops `Resolved::warnings` and resolves against the command's own roles only.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misspelt_role_in_a_commands_rules_is_named_not_silently_dropped() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let names = ["compute1", "compute2", "compute3"];
    let f = Fleet::start_with(&url, &url, &names, 0.1, |_| a.config(false)).await;
    a.set_seconds(1.0);
    let out = run_bounded(
        &url,
        &[
            "run",
            "--role",
            "compute",
            "--instructions",
            r#"{"rolling_rules": {"roles": {"comptue": 1}}}"#,
            "restart",
        ],
    )
    .await;
    let (n, at) = max_overlap(&a.runs());
    assert!(
        text(&out).contains("comptue"),
        "the misspelt role is never named (exit {:?}); {n} hosts ran at once ({at:?}):\n{}\n{}",
        out.status.code(),
        text(&out),
        diagnostics(&f, &a)
    );
}

// ---------------------------------------------------------------------------
// Shared limits
// ---------------------------------------------------------------------------

/// Found: a command counts only its own hosts in flight. With `compute: 1`, a
/// command on compute2 starts while compute1's agent runs another command's action:
/// two compute hosts busy at once (`command::plan` gives `plan::plan` the statuses
/// of `rec.hosts` only, so busy hosts outside the targets never count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_counts_busy_hosts_outside_its_targets_against_the_role_limit() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1", "compute2"], 0.1, |_| a.config(false)).await;
    a.set_seconds(3.0);
    let first = spawn(
        &url,
        &[
            "run",
            "--hosts",
            "compute1",
            "--instructions",
            ONE_COMPUTE,
            "restart",
            "one",
        ],
    );
    wait_started(&a, "compute1").await;
    let second = spawn(
        &url,
        &[
            "run",
            "--hosts",
            "compute2",
            "--instructions",
            ONE_COMPUTE,
            "restart",
            "two",
        ],
    );
    let o1 = finish(first, secs(60)).await;
    let o2 = finish(second, secs(60)).await;
    assert_eq!(o1.status.code(), Some(0), "{}", text(&o1));
    assert_eq!(o2.status.code(), Some(0), "{}", text(&o2));
    let (n, at) = max_overlap(&a.runs());
    assert!(
        n <= 1,
        "{n} compute hosts ran actions at once under compute: 1: {at:?}\n{}",
        diagnostics(&f, &a)
    );
}

/// Found: a command on compute2 starts while compute1's agent runs
/// Puppet for an upgrade under the same `compute: 1`, so a compute host upgrades
/// while another runs the command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_waits_for_an_upgrade_on_another_host_of_the_role() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1", "compute2"], 0.1, |_| a.config(false)).await;
    f.set_seconds(3.0);
    a.set_seconds(0.5);
    let upgrade = spawn(&url, &["upgrade", "v2", "--instructions", ONE_COMPUTE]);
    wait_for("compute1's upgrade to start", secs(60), || async {
        f.runs().iter().any(|r| r.version == "v2")
    })
    .await;
    let command = spawn(
        &url,
        &[
            "run",
            "--hosts",
            "compute2",
            "--instructions",
            ONE_COMPUTE,
            "restart",
        ],
    );
    let up = finish(upgrade, secs(120)).await;
    let cmd = finish(command, secs(120)).await;
    assert_eq!(up.status.code(), Some(0), "{}", text(&up));
    assert_eq!(cmd.status.code(), Some(0), "{}", text(&cmd));
    let mut all: Vec<Run> = f.runs().into_iter().filter(|r| r.version == "v2").collect();
    all.extend(a.runs());
    let (n, at) = max_overlap(&all);
    assert!(
        n <= 1,
        "{n} compute hosts busy at once under compute: 1: {at:?}\n{all:#?}\n{}",
        diagnostics(&f, &a)
    );
}

/// Holds up (the other direction): an upgrade started while compute1 runs a
/// command waits for it under `compute: 1` (the upgrade classifies the whole fleet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_waits_for_a_command_on_another_host_of_the_role() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1", "compute2"], 0.1, |_| a.config(false)).await;
    f.set_seconds(0.5);
    a.set_seconds(3.0);
    let command = spawn(
        &url,
        &[
            "run",
            "--hosts",
            "compute1",
            "--instructions",
            ONE_COMPUTE,
            "restart",
        ],
    );
    wait_started(&a, "compute1").await;
    let upgrade = spawn(&url, &["upgrade", "v2", "--instructions", ONE_COMPUTE]);
    let cmd = finish(command, secs(120)).await;
    let up = finish(upgrade, secs(120)).await;
    assert_eq!(cmd.status.code(), Some(0), "{}", text(&cmd));
    assert_eq!(up.status.code(), Some(0), "{}", text(&up));
    let mut all: Vec<Run> = f.runs().into_iter().filter(|r| r.version == "v2").collect();
    all.extend(a.runs());
    let (n, at) = max_overlap(&all);
    assert!(n <= 1, "{n} compute hosts busy at once: {at:?}\n{all:#?}");
}

// ---------------------------------------------------------------------------
// Holds, the emergency stop, cancel
// ---------------------------------------------------------------------------

/// A hold placed after compute1 was admitted but before its agent started: the
/// action must not run while held (holds up: the agent's start is fenced on the
/// hold keys). Found:  meanwhile jioctl says compute1 is "admitted, its agent is
/// about to start the command" and never names the hold (`commands show`,
/// `run`'s progress), and the admission keeps its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_after_admission_keeps_the_action_from_starting_and_is_named() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1"], 0.1, |_| a.config(false)).await;
    a.set_seconds(0.2);
    // Freeze the agent (well within its 3 s lease), admit, hold, thaw.
    signal(&f.daemons[0], Signal::SIGSTOP);
    let follower = spawn(
        &url,
        &[
            "run",
            "--hosts",
            "compute1",
            "--instructions",
            GLOBAL_ONE,
            "restart",
        ],
    );
    let wait = wait_for("compute1 to be admitted", secs(10), || async {
        inbox_of(&url, "compute1").await.is_some()
    });
    let admitted = tokio::time::timeout(secs(10), wait).await;
    let held = run(&url, &["hold", "compute1", "--reason", "disk replacement"]).await;
    signal(&f.daemons[0], Signal::SIGCONT);
    assert!(admitted.is_ok(), "compute1 was never admitted");
    assert_eq!(held.status.code(), Some(0), "{}", text(&held));
    tokio::time::sleep(secs(3)).await;
    assert!(
        a.runs().is_empty(),
        "the action ran on a held host:\n{}",
        diagnostics(&f, &a)
    );
    let s = open(&url).await;
    let ids: Vec<String> = keys_under(&s, "/commands/")
        .await
        .keys()
        .map(|k| k.trim_start_matches("/commands/").to_string())
        .collect();
    let id = ids.first().cloned().unwrap();
    let shown = run_bounded(&url, &["--json", "commands", "show", &id]).await;
    let v: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    let reason = v["hosts"][0]["reason"].as_str().unwrap_or_default().to_string();
    let phase = v["hosts"][0]["phase"].as_str().unwrap_or_default().to_string();
    // Release, and let it end however it ends (once, at most).
    let released = run(&url, &["release", "compute1"]).await;
    assert_eq!(released.status.code(), Some(0), "{}", text(&released));
    let out = finish_or_kill(follower, secs(30)).await;
    assert!(repeated(&a.runs(), &id).is_empty(), "{}", a.log());
    assert!(
        reason.contains("held") || phase.contains("held"),
        "while held, commands show says {phase}: {reason:?}\n{v:#}\nrun: {out:?}"
    );
}

/// The emergency stop mid-command: the command ends aborted, the running host
/// finishes, no other host starts, no admission is left, the follower exits 6 and
/// says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emergency_stop_mid_command_aborts_it_and_the_running_host_finishes() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let names = ["compute1", "compute2", "compute3"];
    let f = Fleet::start_with(&url, &url, &names, 0.1, |_| a.config(false)).await;
    a.set_seconds(2.0);
    let follower = spawn(
        &url,
        &[
            "run",
            "--role",
            "compute",
            "--instructions",
            GLOBAL_ONE,
            "restart",
        ],
    );
    wait_started(&a, "compute1").await;
    let id = a.runs()[0].version.clone();
    let stop = run(&url, &["global-disable-puppet"]).await;
    assert_eq!(stop.status.code(), Some(0), "{}", text(&stop));
    assert!(text(&stop).contains(&id), "{}", text(&stop));
    let at_stop = common::fleet::now();
    let out = finish(follower, secs(60)).await;
    assert_eq!(
        out.status.code(),
        Some(6),
        "{}\n{}",
        text(&out),
        diagnostics(&f, &a)
    );
    assert!(text(&out).contains("aborted"), "{}", text(&out));
    let runs = a.runs();
    assert_eq!(runs.len(), 1, "{}", a.log());
    assert!(runs[0].end.is_some(), "the running host finished: {}", a.log());
    assert!(runs.iter().all(|r| r.start < at_stop), "{}", a.log());
    assert_eq!(command_record(&url, &id).await["state"], "aborted");
    assert_eq!(
        result_of(&url, &id, "compute1").await.unwrap()["outcome"],
        "succeeded"
    );
    // Nothing more starts later either.
    tokio::time::sleep(secs(2)).await;
    assert_eq!(a.runs().len(), 1, "{}", a.log());
    let s = open(&url).await;
    assert!(keys_under(&s, "/config_state/commands/").await.is_empty());
}

/// Found: `commands cancel` while no driver follows the command leaves the
/// admission of the host that was running it in its inbox for ever (cancel keeps
/// started hosts; only a driver holding the lock releases, and neither
/// `commands follow` nor the driver service take the lock of a command that is no
/// longer active). The stale admission counts compute1 as in flight: a later
/// command on compute1 (or an upgrade) waits for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_command_without_a_follower_leaves_no_admission_behind() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1", "compute2"], 0.1, |_| a.config(false)).await;
    a.set_seconds(2.0);
    let follower = spawn(
        &url,
        &[
            "run",
            "--role",
            "compute",
            "--instructions",
            GLOBAL_ONE,
            "restart",
        ],
    );
    wait_started(&a, "compute1").await;
    let id = a.runs()[0].version.clone();
    // Stop following (Ctrl-C): the command goes on, undriven.
    signal(&follower, Signal::SIGINT);
    let out = finish(follower, secs(30)).await;
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    let cancelled = run_bounded(&url, &["commands", "cancel", &id]).await;
    assert_eq!(cancelled.status.code(), Some(0), "{}", text(&cancelled));
    wait_for("compute1's result", secs(30), || async {
        result_of(&url, &id, "compute1").await.is_some()
    })
    .await;
    // A driver service and a follower of the command, as an operator would try.
    let drive = spawn(&url, &["drive"]);
    let followed = run_bounded(&url, &["commands", "follow", &id]).await;
    assert_eq!(followed.status.code(), Some(6), "{}", text(&followed));
    a.set_seconds(0.2);
    let again = spawn(&url, &["run", "--hosts", "compute1", "restart", "again"]);
    let again = finish_or_kill(again, secs(20)).await;
    let inbox = inbox_of(&url, "compute1").await;
    drop(drive);
    let again = again.unwrap_or_else(|so_far| {
        panic!(
            "a new command on compute1 never started: its inbox still names the cancelled command: {inbox:?}\n{so_far}\n{}",
            diagnostics(&f, &a)
        )
    });
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
    assert!(inbox.is_none(), "stale admission: {inbox:?}");
}

// ---------------------------------------------------------------------------
// Drivers racing, dying, paused
// ---------------------------------------------------------------------------

/// `jioctl run` killed with SIGKILL mid-command; two `commands follow` race to
/// take over. Each host runs once, never two at once under `global: 1`, both
/// followers exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_killed_mid_command_is_taken_over_and_each_host_runs_once() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let names = ["compute1", "compute2", "compute3"];
    let f = Fleet::start_with(&url, &url, &names, 0.1, |_| a.config(false)).await;
    a.set_seconds(1.0);
    let mut driver = spawn(
        &url,
        &[
            "run",
            "--role",
            "compute",
            "--instructions",
            GLOBAL_ONE,
            "restart",
        ],
    );
    wait_started(&a, "compute1").await;
    let id = a.runs()[0].version.clone();
    signal(&driver, Signal::SIGKILL);
    let _ = driver.wait().await; // reaped: its pid is gone
    let f1 = spawn(&url, &["commands", "follow", &id]);
    let f2 = spawn(&url, &["commands", "follow", &id]);
    let o1 = finish(f1, secs(60)).await;
    let o2 = finish(f2, secs(60)).await;
    for o in [&o1, &o2] {
        assert_eq!(o.status.code(), Some(0), "{}\n{}", text(o), diagnostics(&f, &a));
        assert!(text(o).contains("3 of 3 hosts succeeded"), "{}", text(o));
    }
    let runs = a.runs();
    assert_eq!(runs.len(), 3, "{}", a.log());
    assert!(repeated(&runs, &id).is_empty(), "{}", a.log());
    let (n, at) = max_overlap(&runs);
    assert_eq!(n, 1, "{at:?}\n{}", a.log());
    assert_eq!(command_record(&url, &id).await["state"], "done");
}

/// The driver service is paused (SIGSTOP) past its 3 s lease mid-command; a
/// `commands follow` takes over; the stale service resumes. Its writes are fenced:
/// never two at once, each host once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_driver_that_lost_its_lease_cannot_admit_after_a_follower_took_over() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let names = ["compute1", "compute2", "compute3"];
    let f = Fleet::start_with(&url, &url, &names, 0.1, |_| a.config(false)).await;
    a.set_seconds(1.5);
    let mut drive = spawn(&url, &["drive", "--lease", "3s"]);
    let rec = run_bounded(
        &url,
        &[
            "run",
            "--detach",
            "--role",
            "compute",
            "--instructions",
            GLOBAL_ONE,
            "restart",
        ],
    )
    .await;
    assert_eq!(rec.status.code(), Some(0), "{}", text(&rec));
    let id = String::from_utf8_lossy(&rec.stdout).trim().to_string();
    wait_started(&a, "compute1").await;
    signal(&drive, Signal::SIGSTOP);
    let follower = spawn(&url, &["commands", "follow", &id]);
    wait_started(&a, "compute2").await;
    signal(&drive, Signal::SIGCONT);
    let out = finish(follower, secs(60)).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        text(&out),
        diagnostics(&f, &a)
    );
    tokio::time::sleep(secs(1)).await;
    assert!(
        drive.try_wait().unwrap().is_none(),
        "the driver service ended after its pause"
    );
    let runs = a.runs();
    assert_eq!(runs.len(), 3, "{}", a.log());
    assert!(repeated(&runs, &id).is_empty(), "{}", a.log());
    let (n, at) = max_overlap(&runs);
    assert_eq!(n, 1, "{at:?}\n{}", a.log());
}

// ---------------------------------------------------------------------------
// Timeouts and interruptions
// ---------------------------------------------------------------------------

/// `--timeout 2s` on an action that would run a minute, with a grandchild that
/// ignores SIGTERM: reported failed (the timeout named), exit 1, and every process
/// of the action gone; the agent goes on to the next command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_stops_the_whole_action_and_is_reported_failed() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1"], 0.1, |_| a.config(false)).await;
    let started = std::time::Instant::now();
    let out = run_bounded(
        &url,
        &["run", "--hosts", "compute1", "--timeout", "2s", "stubborn"],
    )
    .await;
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}\n{}",
        text(&out),
        diagnostics(&f, &a)
    );
    assert!(started.elapsed() < secs(30), "took {:?}", started.elapsed());
    let id = command_id(&text(&out));
    let r = result_of(&url, &id, "compute1").await.unwrap();
    assert_eq!(r["outcome"], "failed", "{r:#}");
    let msg = r["message"].as_str().unwrap_or_default();
    assert!(msg.contains("did not finish within 2s"), "{r:#}");
    let (script, grandchild) = (a.pid("stubborn-compute1"), a.pid("grandchild-compute1"));
    assert!(script > 0 && grandchild > 0, "the action did not record its pids");
    assert!(!process_alive(script), "the action {script} still runs");
    assert!(
        !process_alive(grandchild),
        "its grandchild {grandchild} (ignoring SIGTERM) still runs"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("0 of 1 host succeeded"), "{stdout}");
    // The agent is free again.
    let next = run_bounded(&url, &["run", "--hosts", "compute1", "restart"]).await;
    assert_eq!(next.status.code(), Some(0), "{}", text(&next));
}

/// The agent stopped with SIGTERM (a restart) while the action runs: the action is
/// stopped after `stop_grace`, the next agent reports it `interrupted` and does not
/// run it again; `jioctl run` exits 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restarted_mid_command_reports_it_interrupted_and_does_not_rerun() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let mut f = Fleet::start_with(&url, &url, &["compute1"], 0.1, |_| {
        format!("{}stop_grace = \"1s\"\n", a.config(false))
    })
    .await;
    a.set_seconds(30.0);
    let follower = spawn(&url, &["run", "--hosts", "compute1", "restart"]);
    wait_started(&a, "compute1").await;
    let id = a.runs()[0].version.clone();
    signal(&f.daemons[0], Signal::SIGTERM);
    let stopped = tokio::time::timeout(secs(20), f.daemons[0].wait()).await;
    assert!(stopped.is_ok(), "the agent did not stop on SIGTERM");
    for p in a.all_pids() {
        assert!(!process_alive(p), "the action {p} outlived its agent");
    }
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
    let r = result_of(&url, &id, "compute1").await.unwrap();
    assert_eq!(r["outcome"], "interrupted", "{r:#}");
    tokio::time::sleep(secs(1)).await;
    assert_eq!(a.runs().len(), 1, "run again: {}", a.log());
}

// ---------------------------------------------------------------------------
// Bad bytes in the store
// ---------------------------------------------------------------------------

/// Bad bytes in an untargeted host's inbox, in a record under `/commands/`, in a
/// run key of a command that does not exist: agents and the driver service live
/// on, a command on other hosts succeeds, `commands list` names the bad record,
/// the agent names its inbox key, `logs --command` without Swift is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bytes_in_command_keys_are_named_and_the_rest_goes_on() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let names = ["compute1", "compute2", "compute3"];
    let mut f = Fleet::start_with(&url, &url, &names, 0.1, |_| a.config(false)).await;
    let mut drive = spawn(&url, &["drive", "--lease", "3s"]);
    let junk = "20261125T000000Z-junk";
    etcdctl_put(&url, b"/config_state/commands/compute3", b"\xff\xfe");
    etcdctl_put(&url, format!("/commands/{junk}").as_bytes(), b"\xff{");
    etcdctl_put(
        &url,
        format!("/command_runs/{junk}/results/compute1").as_bytes(),
        b"\xff",
    );
    etcdctl_put(&url, b"/commands/not-an-id", b"\xff");
    // No limit here: whether an unreadable inbox elsewhere takes a slot is the
    // next tests' question.
    let out = spawn(
        &url,
        &[
            "run",
            "--hosts",
            "compute1,compute2",
            "--instructions",
            "{}",
            "restart",
        ],
    );
    let out = finish_or_kill(out, secs(30))
        .await
        .unwrap_or_else(|so_far| panic!("jioctl run never ended:\n{so_far}\n{}", diagnostics(&f, &a)));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        text(&out),
        diagnostics(&f, &a)
    );
    let id = command_id(&text(&out));
    let listed = run_bounded(&url, &["commands", "list"]).await;
    assert_eq!(listed.status.code(), Some(0), "{}", text(&listed));
    assert!(
        text(&listed)
            .lines()
            .any(|l| l.contains(junk) && l.contains("unreadable")),
        "{}",
        text(&listed)
    );
    assert!(text(&listed).contains(&id), "{}", text(&listed));
    let shown = run_bounded(&url, &["commands", "show", &id]).await;
    assert_eq!(shown.status.code(), Some(0), "{}", text(&shown));
    let shown = run_bounded(&url, &["commands", "show", junk]).await;
    assert_eq!(shown.status.code(), Some(1), "{}", text(&shown));
    assert!(
        text(&shown).contains(&format!("/commands/{junk}")),
        "{}",
        text(&shown)
    );
    let logs = run(&url, &["logs", "--command", &id, "compute1"]).await;
    assert_eq!(logs.status.code(), Some(1), "{}", text(&logs));
    assert!(
        text(&logs).contains("no log was uploaded (Swift is not configured on the host)"),
        "{}",
        text(&logs)
    );
    for (i, d) in f.daemons.iter_mut().enumerate() {
        assert!(d.try_wait().unwrap().is_none(), "agent {} ended", names[i]);
    }
    assert!(
        f.agent_log("compute3")
            .contains("/config_state/commands/compute3"),
        "{}",
        f.agent_log("compute3")
    );
    assert!(drive.try_wait().unwrap().is_none(), "the driver service ended");
    let status = run(&url, &["status"]).await;
    assert_eq!(status.status.code(), Some(0), "{}", text(&status));
}

/// An unreadable inbox on compute3 (which the agent cannot read either, so it runs
/// nothing from it; its `/agents` record says what it runs) must not take a slot
/// for ever: a command on compute1 under `global: 1` goes on.
/// Found: counting busy hosts outside the targets made the unreadable inbox a
/// slot taken for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_inbox_elsewhere_does_not_stall_a_command_for_ever() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1", "compute3"], 0.1, |_| a.config(false)).await;
    etcdctl_put(&url, b"/config_state/commands/compute3", b"\xff\xfe");
    let out = spawn(
        &url,
        &[
            "run",
            "--hosts",
            "compute1",
            "--instructions",
            GLOBAL_ONE,
            "restart",
        ],
    );
    let out = finish_or_kill(out, secs(20)).await.unwrap_or_else(|so_far| {
        panic!(
            "the command never ran: compute3's unreadable inbox holds the only slot:\n{so_far}\n{}",
            diagnostics(&f, &a)
        )
    });
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// Found: the same unreadable inbox stalls an upgrade for ever: `classify`
/// counts compute3 in flight ("its command admissions cannot be read (counted as
/// admitted)") though its agent runs nothing, so under `compute: 1` no compute
/// host is ever enabled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_inbox_elsewhere_does_not_stall_an_upgrade_for_ever() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1", "compute2", "compute3"], 0.1, |_| {
        a.config(false)
    })
    .await;
    etcdctl_put(&url, b"/config_state/commands/compute3", b"\xff\xfe");
    let up = spawn(&url, &["upgrade", "v2", "--instructions", ONE_COMPUTE]);
    let upgraded = tokio::time::timeout(secs(20), async {
        while !(f.hosts[0].local_version().as_deref() == Some("v2")
            && f.hosts[1].local_version().as_deref() == Some("v2"))
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let so_far = finish_or_kill(up, secs(1)).await;
    let so_far = match so_far {
        Ok(o) => text(&o),
        Err(t) => t,
    };
    assert!(
        upgraded.is_ok(),
        "compute1 and compute2 never upgraded: {:?} runs of v2:\n{so_far}",
        f.runs().iter().filter(|r| r.version == "v2").count()
    );
}

/// Bad bytes written into a command's own record while the driver service drives
/// it: the service lives on and drives the next command; `commands show` names the
/// key; the agents live on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_corrupted_mid_command_is_named_and_the_driver_service_goes_on() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let names = ["compute1", "compute2", "compute3"];
    let mut f = Fleet::start_with(&url, &url, &names, 0.1, |_| a.config(false)).await;
    a.set_seconds(1.5);
    let mut drive = spawn(&url, &["drive", "--lease", "3s"]);
    let rec = run_bounded(
        &url,
        &[
            "run",
            "--detach",
            "--hosts",
            "compute1,compute2",
            "--instructions",
            GLOBAL_ONE,
            "restart",
        ],
    )
    .await;
    assert_eq!(rec.status.code(), Some(0), "{}", text(&rec));
    let id = String::from_utf8_lossy(&rec.stdout).trim().to_string();
    wait_started(&a, "compute1").await;
    etcdctl_put(&url, format!("/commands/{id}").as_bytes(), b"\xff\xfe");
    wait_for("compute1's result", secs(30), || async {
        result_of(&url, &id, "compute1").await.is_some()
    })
    .await;
    let shown = run_bounded(&url, &["commands", "show", &id]).await;
    assert_eq!(shown.status.code(), Some(1), "{}", text(&shown));
    assert!(
        text(&shown).contains(&format!("/commands/{id}")),
        "{}",
        text(&shown)
    );
    // The rest goes on: the service drives a new command on compute3.
    a.set_seconds(0.2);
    let rec = run_bounded(&url, &["run", "--detach", "--hosts", "compute3", "restart"]).await;
    let id3 = String::from_utf8_lossy(&rec.stdout).trim().to_string();
    wait_for("the next command to end", secs(30), || async {
        result_of(&url, &id3, "compute3").await.is_some()
    })
    .await;
    assert!(drive.try_wait().unwrap().is_none(), "the driver service ended");
    for (i, d) in f.daemons.iter_mut().enumerate() {
        assert!(d.try_wait().unwrap().is_none(), "agent {} ended", names[i]);
    }
    assert!(
        !a.runs().iter().any(|r| r.host == "compute2"),
        "compute2 ran a command whose record cannot be read: {}",
        a.log()
    );
}

/// Bad bytes in a targeted host's inbox: the host counts as admitted (the safe
/// reading) and the command waits for it, naming the key; once the key is
/// repaired the command finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_targeted_host_with_an_unreadable_inbox_waits_named_until_repaired() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1", "compute2"], 0.1, |_| a.config(false)).await;
    etcdctl_put(&url, b"/config_state/commands/compute2", b"\xff");
    let follower = spawn(&url, &["run", "--role", "compute", "restart"]);
    wait_started(&a, "compute1").await;
    let s = open(&url).await;
    let id = a.runs()[0].version.clone();
    wait_for("compute1's result", secs(30), || async {
        result_of(&url, &id, "compute1").await.is_some()
    })
    .await;
    tokio::time::sleep(secs(1)).await;
    let shown = run_bounded(&url, &["--json", "commands", "show", &id]).await;
    assert_eq!(shown.status.code(), Some(0), "{}", text(&shown));
    assert!(
        text(&shown).contains("/config_state/commands/compute2"),
        "{}",
        text(&shown)
    );
    assert!(!a.runs().iter().any(|r| r.host == "compute2"), "{}", a.log());
    s.delete(&jio_common::keys::Key::new("/config_state/commands/compute2").unwrap())
        .await
        .unwrap();
    let out = finish(follower, secs(60)).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        text(&out),
        diagnostics(&f, &a)
    );
    assert_eq!(a.runs().len(), 2, "{}", a.log());
}

/// Found: bad bytes in `/command_runs/<id>/logs/<host>` are dropped silently by
/// `Runs::from_kvs`: `commands show` never names the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_log_link_is_named_by_commands_show() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let _f = Fleet::start_with(&url, &url, &["compute1"], 0.1, |_| a.config(false)).await;
    let out = run_bounded(&url, &["run", "--hosts", "compute1", "restart"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let id = command_id(&text(&out));
    let key = format!("/command_runs/{id}/logs/compute1");
    etcdctl_put(&url, key.as_bytes(), b"\xff\xfe");
    let shown = run_bounded(&url, &["commands", "show", &id]).await;
    assert_eq!(shown.status.code(), Some(0), "{}", text(&shown));
    let json = run_bounded(&url, &["--json", "commands", "show", &id]).await;
    assert!(
        text(&shown).contains(&key) || text(&json).contains(&key),
        "the unreadable log link is not named:\n{}\n{}",
        text(&shown),
        text(&json)
    );
}

/// Two commands created at once on the same hosts, each under `global: 1`: each
/// counts the other's admitted and running hosts, so never two actions at once and
/// never two on one host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_commands_on_the_same_hosts_share_the_limit() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1", "compute2"], 0.1, |_| a.config(false)).await;
    a.set_seconds(0.7);
    let c1 = spawn(
        &url,
        &[
            "run",
            "--role",
            "compute",
            "--instructions",
            GLOBAL_ONE,
            "restart",
            "one",
        ],
    );
    let c2 = spawn(
        &url,
        &[
            "run",
            "--role",
            "compute",
            "--instructions",
            GLOBAL_ONE,
            "restart",
            "two",
        ],
    );
    let o1 = finish(c1, secs(60)).await;
    let o2 = finish(c2, secs(60)).await;
    assert_eq!(
        o1.status.code(),
        Some(0),
        "{}\n{}",
        text(&o1),
        diagnostics(&f, &a)
    );
    assert_eq!(
        o2.status.code(),
        Some(0),
        "{}\n{}",
        text(&o2),
        diagnostics(&f, &a)
    );
    let runs = a.runs();
    assert_eq!(runs.len(), 4, "{}", a.log());
    let (n, at) = max_overlap(&runs);
    assert_eq!(n, 1, "{at:?}\n{}", a.log());
}

/// Found: After an emergency stop, a new command: the stop is still in force for
/// upgrades (a new `jioctl upgrade` says it clears it). A command should be refused
/// or at least say that it runs despite the emergency stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_created_after_the_emergency_stop_is_refused_or_says_so() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1"], 0.1, |_| a.config(false)).await;
    let stop = run(&url, &["global-disable-puppet"]).await;
    assert_eq!(stop.status.code(), Some(0), "{}", text(&stop));
    let out = run_bounded(&url, &["run", "--hosts", "compute1", "restart"]).await;
    let t = text(&out);
    assert!(
        out.status.code() != Some(0) || t.contains("emergency stop") || t.contains("global-disable-puppet"),
        "ran {} time(s) during the emergency stop, without a word:\n{t}\n{}",
        a.runs().len(),
        diagnostics(&f, &a)
    );
}
