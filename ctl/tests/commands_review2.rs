//! A second review of fleet commands: attacks the first review did not make, against
//! a real etcd with real `jio-agent` daemons and `jioctl` processes. Overlap and
//! repetition are checked on the action's own log, never on jioctl's classification.
//! Every `jioctl` is bounded: a hang fails the test.
//!
//! An attack that found a defect says so in its doc comment ("Found:").

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::time::Duration;

use jio_common::command_record::{CommandRecord, CommandState, Targets};
use jio_common::keys::Key;
use jio_common::names::CommandId;
use jio_common::names::HostName;
use jio_tests::Etcd;
use jio_tests::inspect::{open, text, wait_for};
use nix::sys::signal::Signal;

use common::commands::*;
use common::fleet::{Fleet, Run, finish, keys_under, signal, spawn};
use common::run;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

const GLOBAL_ONE: &str = r#"{"rolling_rules": {"global": 1}}"#;

/// The runs of command `id` in the action's log.
fn runs_of(a: &Actions, id: &str) -> Vec<Run> {
    a.runs().into_iter().filter(|r| r.version == id).collect()
}

/// A finished command's record, as an older `jioctl` would have left it.
fn finished_record(at: u64, host: &str) -> CommandRecord {
    CommandRecord {
        id: CommandId::new(at, "old", 1),
        action: "old".into(),
        args: vec![],
        targets: Targets::Hosts(vec![HostName::new(host).unwrap()]),
        hosts: vec![HostName::new(host).unwrap()],
        rules: serde_json::json!({}),
        timeout_s: None,
        rerun_interrupted: false,
        created_by: "alice@laptop".into(),
        created_at: at,
        state: CommandState::Done,
        changes: vec![],
    }
}

/// Writes `n` finished commands (each with a result under `/command_runs/`), the
/// oldest first; returns their ids.
async fn seed_history(url: &str, n: u64) -> Vec<String> {
    let s = open(url).await;
    let mut ids = Vec::new();
    for i in 0..n {
        let rec = finished_record(1_700_000_000 + i * 60, "compute1");
        let id = rec.id.to_string();
        s.put(
            &Key::new(format!("/commands/{id}")).unwrap(),
            &serde_json::to_string(&rec).unwrap(),
            None,
        )
        .await
        .unwrap();
        s.put(
            &Key::new(format!("/command_runs/{id}/results/compute1")).unwrap(),
            r#"{"outcome":"succeeded","exit_code":0,"started":1,"ended":2,"attempt":1}"#,
            None,
        )
        .await
        .unwrap();
        ids.push(id);
    }
    ids
}

// ---------------------------------------------------------------------------
// Rules
// ---------------------------------------------------------------------------

/// Found: `role_order` with a failure inside `max_failures`. controller1 fails
/// (allowed by `max_failures: 1`); compute waits for the controllers to succeed,
/// which can never happen any more (a command's host is never run again). The
/// command should end (`failed`, compute1 not run, exit 1); it runs for ever,
/// saying "waiting for controller (1 host left)" (`command::ending` ends a command
/// whose remaining hosts are all held, not one whose remaining hosts wait on a
/// role that failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_in_a_followed_role_within_max_failures_ends_the_command() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1", "controller1"], 0.1, |_| a.config(false)).await;
    a.fail("controller1");
    let follower = spawn(
        &url,
        &[
            "run",
            "--all",
            "--instructions",
            r#"{"role_order": {"compute": "controller"}, "max_failures": 1}"#,
            "restart",
        ],
    );
    let out = finish_or_kill(follower, secs(30)).await.unwrap_or_else(|so_far| {
        panic!(
            "the command never ends after controller1 failed (30 s):\n{so_far}\n{}",
            diagnostics(&f, &a)
        )
    });
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        a.runs().iter().all(|r| r.host != "compute1"),
        "compute1 ran though controller1 failed:\n{}",
        a.log()
    );
    assert!(t.contains("not run"), "{t}");
}

/// Found: a percentage limit is of the fleet's hosts of the role, not of the
/// command's hosts as the README says ("counts or percentages of the command's
/// hosts"). A command on 2 of 4 compute hosts under `compute: "50%"` should run
/// one host at a time (50% of 2); it runs both at once (50% of 4: `plan::plan`
/// is given every host of the fleet, and `limit_of` takes the group's size there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_percentage_role_limit_is_of_the_commands_hosts() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let names = ["compute1", "compute2", "compute3", "compute4"];
    let f = Fleet::start_with(&url, &url, &names, 0.1, |_| a.config(false)).await;
    a.set_seconds(1.5);
    let out = run_bounded(
        &url,
        &[
            "run",
            "--hosts",
            "compute1,compute2",
            "--instructions",
            r#"{"rolling_rules": {"roles": {"compute": "50%"}}}"#,
            "restart",
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
    assert_eq!(runs.len(), 2, "{}", a.log());
    let (n, at) = max_overlap(&runs);
    assert_eq!(
        n,
        1,
        "50% of the command's 2 hosts is 1, yet {n} ran at once: {at:?}\n{}",
        a.log()
    );
}

/// Found: the same for the `fleet` cap: `fleet: "50%"` on a command of 2 hosts
/// (of a fleet of 4) lets both run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_percentage_fleet_cap_is_of_the_commands_hosts() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let names = ["compute1", "compute2", "compute3", "compute4"];
    let f = Fleet::start_with(&url, &url, &names, 0.1, |_| a.config(false)).await;
    a.set_seconds(1.5);
    let out = run_bounded(
        &url,
        &[
            "run",
            "--hosts",
            "compute1,compute2",
            "--instructions",
            r#"{"rolling_rules": {"fleet": "50%"}}"#,
            "restart",
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
    assert_eq!(runs.len(), 2, "{}", a.log());
    let (n, at) = max_overlap(&runs);
    assert_eq!(
        n,
        1,
        "50% of the command's 2 hosts is 1, yet {n} ran at once: {at:?}\n{}",
        a.log()
    );
}

// ---------------------------------------------------------------------------
// History
// ---------------------------------------------------------------------------

/// 105 finished commands in the store: one more command keeps the newest 99 of
/// them and itself (100), deleting the oldest 6 with their runs, and no other run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_keeps_the_last_hundred_and_deletes_the_oldest_with_their_runs() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1"], 0.1, |_| a.config(false)).await;
    let ids = seed_history(&url, 105).await;
    let out = run_bounded(&url, &["run", "--hosts", "compute1", "restart"]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        text(&out),
        diagnostics(&f, &a)
    );
    let new = command_id(&text(&out));
    let s = open(&url).await;
    let records = keys_under(&s, "/commands/").await;
    let runs = keys_under(&s, "/command_runs/").await;
    assert_eq!(records.len(), 100, "{:?}", records.keys().collect::<Vec<_>>());
    assert!(records.contains_key(&format!("/commands/{new}")));
    for (i, id) in ids.iter().enumerate() {
        let kept = i >= 6;
        assert_eq!(
            records.contains_key(&format!("/commands/{id}")),
            kept,
            "record {i} {id}"
        );
        assert_eq!(
            runs.contains_key(&format!("/command_runs/{id}/results/compute1")),
            kept,
            "runs of {i} {id}"
        );
    }
    let list = run(&url, &["--json", "commands", "list", "--limit", "500"]).await;
    let v: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 100, "{}", text(&list));
    assert_eq!(v[0]["id"], new.as_str(), "newest first");
}

/// Found: pruning the history is one transaction holding every deletion (two
/// operations per command, plus the new record), never split to what the store
/// takes. More than 100 finished commands can build up between two creations
/// (commands active when the last one was created end later: e.g. 70 detached
/// commands, one per host, then cancelled), and past 63 to delete the transaction
/// exceeds etcd's 128 operations (Consul's 64 past 31): every `jioctl run` fails
/// from then on, and nothing is pruned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_history_is_pruned_in_transactions_the_store_takes() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1"], 0.1, |_| a.config(false)).await;
    seed_history(&url, 170).await;
    let out = run_bounded(&url, &["run", "--hosts", "compute1", "restart"]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "a command cannot be created once 170 finished commands are stored:\n{}\n{}",
        text(&out),
        diagnostics(&f, &a)
    );
    // At most 20 of the oldest go with each new command: 170 + 1 - 20.
    let s = open(&url).await;
    assert_eq!(keys_under(&s, "/commands/").await.len(), 151);
    // The next commands shrink it further, each within what the store takes.
    for _ in 0..3 {
        let out = run_bounded(&url, &["run", "--hosts", "compute1", "restart"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    }
    assert_eq!(keys_under(&s, "/commands/").await.len(), 100);
}

// ---------------------------------------------------------------------------
// The driver service
// ---------------------------------------------------------------------------

/// The pid in a leased lock's value (0 when absent).
async fn lock_pid(url: &str, id: &str) -> u32 {
    let s = open(url).await;
    let Some(kv) = s
        .get(&Key::new(format!("/command_runs/{id}/lock")).unwrap())
        .await
        .unwrap()
    else {
        return 0;
    };
    serde_json::from_str::<serde_json::Value>(&kv.value)
        .ok()
        .and_then(|v| v["pid"].as_u64())
        .unwrap_or(0) as u32
}

async fn wait_state(url: &str, id: &str, state: &str, within: Duration) {
    wait_for(&format!("command {id} to be {state}"), within, || async {
        command_record(url, id).await["state"] == state
    })
    .await;
}

/// `run --detach` with a driver service running: the service picks the command
/// up, drives it to `done` under `global: 1` (each host once, by the action's log),
/// withdraws every admission and releases the command's lock; it lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_service_drives_a_detached_command_to_its_end() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let names = ["compute1", "compute2", "compute3"];
    let f = Fleet::start_with(&url, &url, &names, 0.1, |_| a.config(false)).await;
    a.set_seconds(0.5);
    let mut drive = spawn(&url, &["drive", "--lease", "3s"]);
    // The service registers before the command is recorded.
    let s = open(&url).await;
    wait_for("the driver service to register", secs(20), || async {
        !keys_under(&s, "/drivers/").await.is_empty()
    })
    .await;
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
    assert!(text(&rec).contains("drive"), "{}", text(&rec));
    let id = String::from_utf8_lossy(&rec.stdout).trim().to_string();
    wait_state(&url, &id, "done", secs(60)).await;
    wait_for("the admissions and the lock to go", secs(20), || async {
        keys_under(&s, "/config_state/commands/").await.is_empty() && lock_pid(&url, &id).await == 0
    })
    .await;
    let runs = runs_of(&a, &id);
    assert_eq!(runs.len(), 3, "{}\n{}", a.log(), diagnostics(&f, &a));
    assert!(repeated(&runs, &id).is_empty(), "{}", a.log());
    assert_eq!(max_overlap(&runs).0, 1, "{}", a.log());
    assert!(drive.try_wait().unwrap().is_none(), "the driver service ended");
}

/// Two driver services; the one driving the command gets SIGTERM mid-command: it
/// exits 143 and releases the command's lock at once, the standby takes over
/// without waiting for the lease (15 s), the command ends `done`, each host once,
/// never two at once under `global: 1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_of_the_driving_service_hands_the_command_to_the_standby_at_once() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let names = ["compute1", "compute2", "compute3"];
    let f = Fleet::start_with(&url, &url, &names, 0.1, |_| a.config(false)).await;
    a.set_seconds(2.0);
    let d1 = spawn(&url, &["drive"]);
    let d2 = spawn(&url, &["drive"]);
    let s = open(&url).await;
    wait_for("both driver services to register", secs(20), || async {
        keys_under(&s, "/drivers/").await.len() == 2
    })
    .await;
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
    let holder = lock_pid(&url, &id).await;
    let (driving, standby) = if d1.id() == Some(holder) {
        (d1, d2)
    } else {
        assert_eq!(d2.id(), Some(holder), "neither service holds the command's lock");
        (d2, d1)
    };
    signal(&driving, Signal::SIGTERM);
    let out = finish(driving, secs(20)).await;
    assert_eq!(out.status.code(), Some(143), "{}", text(&out));
    wait_state(&url, &id, "done", secs(60)).await;
    let runs = runs_of(&a, &id);
    let mut standby = standby;
    assert!(standby.try_wait().unwrap().is_none(), "the standby service ended");
    assert_eq!(runs.len(), 3, "{}\n{}", a.log(), diagnostics(&f, &a));
    assert!(repeated(&runs, &id).is_empty(), "{}", a.log());
    assert_eq!(max_overlap(&runs).0, 1, "{}", a.log());
    // compute2 started soon after compute1 ended: nobody waited out the lease.
    let c1_end = runs.iter().find(|r| r.host == "compute1").unwrap().end.unwrap();
    let c2_start = runs.iter().find(|r| r.host == "compute2").unwrap().start;
    assert!(
        c2_start - c1_end < 8.0,
        "compute2 started {:.1} s after compute1 ended: the standby waited for the lease\n{}",
        c2_start - c1_end,
        a.log()
    );
    assert!(keys_under(&s, "/config_state/commands/").await.is_empty());
}

// ---------------------------------------------------------------------------
// Agents lost, paused, without their journal
// ---------------------------------------------------------------------------

/// compute2's agent is dead before the command (never admitted). The command runs
/// on compute1 and waits for compute2, saying why (`commands show`); a second
/// follower stops on Ctrl-C (130) at once; `commands cancel` ends it: the first
/// follower exits 6, compute2 `not run`, nothing left admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_left_with_only_a_lost_host_waits_says_why_and_is_cancelled() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let mut f = Fleet::start_with(&url, &url, &["compute1", "compute2"], 0.1, |_| a.config(false)).await;
    f.daemons[1].start_kill().unwrap();
    let _ = f.daemons[1].wait().await;
    let s = open(&url).await;
    wait_for("compute2's agent record to expire", secs(20), || async {
        !keys_under(&s, "/agents/").await.contains_key("/agents/compute2")
    })
    .await;
    let follower = spawn(&url, &["run", "--role", "compute", "restart"]);
    wait_for("compute1's result", secs(30), || async {
        let cmds = keys_under(&s, "/commands/").await;
        match cmds.keys().next() {
            Some(k) => result_of(&url, k.trim_start_matches("/commands/"), "compute1")
                .await
                .is_some(),
            None => false,
        }
    })
    .await;
    let id = keys_under(&s, "/commands/")
        .await
        .keys()
        .next()
        .unwrap()
        .trim_start_matches("/commands/")
        .to_string();
    let show = run_bounded(&url, &["commands", "show", &id]).await;
    let t = text(&show);
    assert_eq!(show.status.code(), Some(0), "{t}");
    let line = t.lines().find(|l| l.starts_with("compute2")).unwrap_or_default();
    assert!(
        line.contains("not alive") || line.contains("lost") || line.contains("agent"),
        "compute2's row does not say its agent is gone:\n{t}"
    );
    let second = spawn(&url, &["commands", "follow", &id]);
    tokio::time::sleep(secs(1)).await;
    signal(&second, Signal::SIGINT);
    let o2 = finish(second, secs(15)).await;
    assert_eq!(o2.status.code(), Some(130), "{}", text(&o2));
    let c = run_bounded(&url, &["commands", "cancel", &id, "--reason", "compute2 is gone"]).await;
    assert_eq!(c.status.code(), Some(0), "{}", text(&c));
    let out = finish_or_kill(follower, secs(30))
        .await
        .unwrap_or_else(|so_far| panic!("the follower did not end after the cancel:\n{so_far}"));
    let t = text(&out);
    assert_eq!(out.status.code(), Some(6), "{t}\n{}", diagnostics(&f, &a));
    let row = t.lines().find(|l| l.starts_with("compute2")).unwrap_or_default();
    assert!(row.contains("not run"), "{t}");
    assert!(keys_under(&s, "/config_state/commands/").await.is_empty());
}

/// compute1's agent is stopped (SIGSTOP) and admitted meanwhile; the command is
/// cancelled; the agent resumes (SIGCONT): the action never starts; the agent then
/// runs a new command normally, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_paused_while_admitted_never_starts_a_command_cancelled_meanwhile() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1"], 0.1, |_| a.config(false)).await;
    signal(&f.daemons[0], Signal::SIGSTOP);
    let follower = spawn(&url, &["run", "--hosts", "compute1", "restart"]);
    let s = open(&url).await;
    wait_for("compute1 to be admitted", secs(20), || async {
        inbox_of(&url, "compute1").await.is_some()
    })
    .await;
    let id = keys_under(&s, "/commands/")
        .await
        .keys()
        .next()
        .unwrap()
        .trim_start_matches("/commands/")
        .to_string();
    let c = run_bounded(&url, &["commands", "cancel", &id]).await;
    assert_eq!(c.status.code(), Some(0), "{}", text(&c));
    signal(&f.daemons[0], Signal::SIGCONT);
    let out = finish(follower, secs(30)).await;
    assert_eq!(out.status.code(), Some(6), "{}", text(&out));
    tokio::time::sleep(secs(4)).await;
    assert!(
        a.runs().is_empty(),
        "the cancelled command ran:\n{}\n{}",
        a.log(),
        diagnostics(&f, &a)
    );
    assert!(result_of(&url, &id, "compute1").await.is_none());
    let again = run_bounded(&url, &["run", "--hosts", "compute1", "restart", "again"]).await;
    assert_eq!(
        again.status.code(),
        Some(0),
        "{}\n{}",
        text(&again),
        diagnostics(&f, &a)
    );
    assert_eq!(a.runs().len(), 1, "{}", a.log());
}

/// The agent is killed (SIGKILL) while the action runs and its journal deleted,
/// then restarted: the action must not run a second time on that host (its start
/// is in the store); the host is reported, the command ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restarted_without_its_journal_does_not_run_the_command_twice() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let mut f = Fleet::start_with(&url, &url, &["compute1", "compute2"], 0.1, |_| a.config(false)).await;
    a.set_seconds(3.0);
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
    f.daemons[0].start_kill().unwrap();
    let _ = f.daemons[0].wait().await;
    std::fs::remove_file(f.hosts[0].state_dir().join("journal.json")).unwrap();
    let child = f.spawn_agent(0);
    f.daemons[0] = child;
    let out = finish(follower, secs(60)).await;
    let t = text(&out);
    tokio::time::sleep(secs(4)).await; // the orphan ends on its own
    let runs = runs_of(&a, &id);
    assert!(
        repeated(&runs, &id).is_empty(),
        "ran twice on a host:\n{}\n{}",
        a.log(),
        diagnostics(&f, &a)
    );
    assert_eq!(out.status.code(), Some(1), "{t}\n{}", diagnostics(&f, &a));
    let r = result_of(&url, &id, "compute1").await.unwrap();
    assert_eq!(r["outcome"], "interrupted", "{r}");
    eprintln!(
        "note: actions at once (the orphan is unknown without the journal): {:?}",
        max_overlap(&runs)
    );
}

// ---------------------------------------------------------------------------
// Many commands, windows, rollouts, the emergency stop
// ---------------------------------------------------------------------------

/// Three `jioctl run` at once on the same three hosts, each under `global: 1`:
/// each host runs each command once, never two actions at once anywhere (each
/// counts the others' hosts), every follower exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_commands_at_once_on_the_same_hosts_run_once_each_one_at_a_time() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let names = ["compute1", "compute2", "compute3"];
    let f = Fleet::start_with(&url, &url, &names, 0.1, |_| a.config(false)).await;
    a.set_seconds(0.4);
    let ps: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|n| {
            spawn(
                &url,
                &[
                    "run",
                    "--role",
                    "compute",
                    "--instructions",
                    GLOBAL_ONE,
                    "restart",
                    n,
                ],
            )
        })
        .collect();
    for p in ps {
        let o = finish(p, secs(120)).await;
        assert_eq!(o.status.code(), Some(0), "{}\n{}", text(&o), diagnostics(&f, &a));
    }
    let runs = a.runs();
    assert_eq!(runs.len(), 9, "{}", a.log());
    let ids: std::collections::BTreeSet<&str> = runs.iter().map(|r| r.version.as_str()).collect();
    assert_eq!(ids.len(), 3, "{}", a.log());
    for id in ids {
        assert!(repeated(&runs, id).is_empty(), "{}", a.log());
    }
    assert!(same_host_overlaps(&runs).is_empty(), "{}", a.log());
    let (n, at) = max_overlap(&runs);
    assert_eq!(n, 1, "{at:?}\n{}", a.log());
}

/// `HH:MM` (UTC) `offset` seconds from now.
fn hhmm(offset: i64) -> String {
    let t = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
        + offset)
        .rem_euclid(86_400);
    format!("{:02}:{:02}", t / 3600, (t / 60) % 60)
}

/// `windows`: outside its window nothing is admitted and the command says why;
/// inside one it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_waits_for_its_window_and_says_so() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1"], 0.1, |_| a.config(false)).await;
    let closed = format!(
        r#"{{"windows": [{{"days": "daily", "start": "{}", "end": "{}", "tz": "UTC"}}]}}"#,
        hhmm(6 * 3600),
        hhmm(7 * 3600)
    );
    let p = spawn(
        &url,
        &["run", "--hosts", "compute1", "--instructions", &closed, "restart"],
    );
    let waited = finish_or_kill(p, secs(6)).await;
    let so_far = match waited {
        Ok(o) => panic!("it ended outside its window: {}", text(&o)),
        Err(t) => t,
    };
    assert!(a.runs().is_empty(), "ran outside its window:\n{}", a.log());
    assert!(
        so_far.contains("window"),
        "the follower does not name the window:\n{so_far}"
    );
    let id = command_id(&so_far);
    let show = run_bounded(&url, &["commands", "show", &id]).await;
    assert!(text(&show).contains("window"), "{}", text(&show));
    let c = run_bounded(&url, &["commands", "cancel", &id]).await;
    assert_eq!(c.status.code(), Some(0), "{}", text(&c));
    let open_now = format!(
        r#"{{"windows": [{{"days": "daily", "start": "{}", "end": "{}", "tz": "UTC"}}]}}"#,
        hhmm(-3600),
        hhmm(3600)
    );
    let out = run_bounded(
        &url,
        &[
            "run",
            "--hosts",
            "compute1",
            "--instructions",
            &open_now,
            "restart",
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
    assert_eq!(a.runs().len(), 1, "{}", a.log());
}

/// A rollout to v2 recorded and paused (no host enabled): a command on the same
/// role is not held up by it (hosts neither enabled nor running are not busy),
/// and no host upgrades meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_rollout_does_not_hold_up_a_command() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1", "compute2"], 0.1, |_| a.config(false)).await;
    let up = run_bounded(
        &url,
        &[
            "upgrade",
            "v2",
            "--detach",
            "--instructions",
            r#"{"rolling_rules": {"roles": {"compute": 1}}}"#,
        ],
    )
    .await;
    assert_eq!(up.status.code(), Some(0), "{}", text(&up));
    let pause = run_bounded(&url, &["rollout", "pause"]).await;
    assert_eq!(pause.status.code(), Some(0), "{}", text(&pause));
    let out = run_bounded(
        &url,
        &[
            "run",
            "--role",
            "compute",
            "--instructions",
            r#"{"rolling_rules": {"roles": {"compute": 1}}}"#,
            "restart",
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
    assert_eq!(a.runs().len(), 2, "{}", a.log());
    assert_eq!(f.started("v2"), 0, "a host upgraded during the pause");
}

/// An emergency stop, then a new `upgrade` (which clears it), then a command: the
/// command runs and says nothing about an emergency stop; a second emergency stop
/// then ends a command created before it (aborted, exit 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_emergency_stop_cleared_by_an_upgrade_a_command_runs_and_a_new_stop_ends_it() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1", "compute2"], 0.1, |_| a.config(false)).await;
    let stop = run(&url, &["global-disable-puppet"]).await;
    assert_eq!(stop.status.code(), Some(0), "{}", text(&stop));
    let up = run_bounded(&url, &["upgrade", "v1", "--detach", "--force"]).await;
    assert_eq!(up.status.code(), Some(0), "{}", text(&up));
    let out = run_bounded(&url, &["run", "--hosts", "compute1", "restart"]).await;
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}\n{}", diagnostics(&f, &a));
    assert!(!t.contains("emergency stop"), "{t}");
    a.set_seconds(2.0);
    let p = spawn(
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
    wait_for("a second run to start", secs(30), || async {
        a.runs().len() == 2
    })
    .await;
    let stop = run(&url, &["global-disable-puppet"]).await;
    assert_eq!(stop.status.code(), Some(0), "{}", text(&stop));
    let o = finish(p, secs(30)).await;
    assert_eq!(o.status.code(), Some(6), "{}", text(&o));
    tokio::time::sleep(secs(1)).await;
    assert_eq!(a.runs().len(), 2, "a host started after the stop:\n{}", a.log());
}

// ---------------------------------------------------------------------------
// Output and exit codes
// ---------------------------------------------------------------------------

/// `--json` of `run`, `commands show` and `commands list`, and `run --detach
/// --json`: the shapes the README gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_output_has_the_documented_shapes() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1", "compute2"], 0.1, |_| a.config(false)).await;
    a.fail("compute2");
    let out = run_bounded(
        &url,
        &[
            "--json",
            "run",
            "--role",
            "compute",
            "--instructions",
            r#"{"max_failures": 1}"#,
            "restart",
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
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("run --json is not one JSON object ({e}):\n{}", text(&out)));
    for k in ["command", "hosts", "counts", "finished", "problems"] {
        assert!(v.get(k).is_some(), "run --json lacks {k}: {v}");
    }
    let id = v["command"]["id"].as_str().unwrap().to_string();
    assert_eq!(v["finished"], true, "{v}");
    assert_eq!(v["counts"]["succeeded"], 1, "{v}");
    assert_eq!(v["counts"]["failed"], 1, "{v}");
    let h2 = v["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["host"] == "compute2")
        .unwrap();
    assert_eq!(h2["role"], "compute", "{h2}");
    assert_eq!(h2["phase"], "failed", "{h2}");
    assert_eq!(h2["exit_code"], 3, "{h2}");
    assert!(
        h2["reason"].as_str().unwrap_or("").contains("did not come back"),
        "{h2}"
    );
    assert!(h2["run_dir"].is_string(), "{h2}");
    let show = run_bounded(&url, &["--json", "commands", "show", &id]).await;
    assert_eq!(show.status.code(), Some(0), "{}", text(&show));
    let s: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(s["hosts"], v["hosts"], "show --json and run --json differ");
    let list = run_bounded(&url, &["--json", "commands", "list"]).await;
    let l: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(l[0]["id"], id.as_str(), "{l}");
    assert_eq!(l[0]["state"], "failed", "{l}");
    let det = run_bounded(
        &url,
        &["--json", "run", "--detach", "--hosts", "compute1", "restart"],
    )
    .await;
    assert_eq!(det.status.code(), Some(0), "{}", text(&det));
    let d: serde_json::Value = serde_json::from_slice(&det.stdout).unwrap();
    assert_eq!(d["command"]["state"], "running", "{d}");
}

/// A store that does not answer (a closed port): each command exits 2, naming
/// the store, within bounded time; a follower says it cannot reach the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_exits_2() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("etcd://127.0.0.1:{port}");
    let id = "20261125T000000Z-restart";
    let cases: Vec<Vec<&str>> = vec![
        vec!["run", "--hosts", "compute1", "restart"],
        vec!["run", "--detach", "--all", "restart"],
        vec!["commands", "list"],
        vec!["commands", "show", id],
        vec!["commands", "cancel", id],
    ];
    let mut wrong = Vec::new();
    for args in &cases {
        let out = finish_or_kill(spawn(&url, args), secs(40)).await;
        match out {
            Ok(o) if o.status.code() == Some(2) => {}
            Ok(o) => wrong.push(format!("{args:?}: exit {:?}: {}", o.status.code(), text(&o))),
            Err(t) => wrong.push(format!("{args:?}: still running after 40 s: {t}")),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let follow = finish_or_kill(spawn(&url, &["commands", "follow", id]), secs(15)).await;
    let t = match &follow {
        Ok(o) => {
            assert_eq!(o.status.code(), Some(2), "{}", text(o));
            text(o)
        }
        Err(t) => t.clone(),
    };
    assert!(
        t.contains("reach") || t.contains("unreachable") || t.contains(&port.to_string()),
        "{t}"
    );
}

// ---------------------------------------------------------------------------
// Hosts outside the command, dead agents, dangling admissions
// ---------------------------------------------------------------------------

/// Kills a process group leader's processes recorded by the actions (tidying up
/// orphans a killed agent left).
fn kill_pids(pids: &[i32]) {
    for p in pids {
        if *p > 0 {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p), Signal::SIGKILL);
        }
    }
}

/// Found: `role_order` waits for hosts the command does not name. controller2's
/// agent died while it ran another command (its run marker stays: the host is
/// lost). A command on controller1 and compute1 with `compute` after `controller`
/// runs on controller1, which succeeds, and then waits for ever: "waiting for
/// controller (1 host left)". The README: a role's hosts start "only when the
/// command has succeeded on every host of the roles it follows"; controller2 is not
/// one of them (`command::plan` gives `plan::plan` the whole fleet, whose `left()`
/// counts every busy host of the role as not done).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_order_waits_only_for_the_commands_own_hosts_of_the_followed_role() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let names = ["compute1", "controller1", "controller2"];
    let mut f = Fleet::start_with(&url, &url, &names, 0.1, |_| a.config(false)).await;
    let other = spawn(&url, &["run", "--hosts", "controller2", "stubborn"]);
    wait_started(&a, "controller2").await;
    f.daemons[2].start_kill().unwrap();
    let _ = f.daemons[2].wait().await;
    drop(other); // killed: the other command stays active, undriven
    let s = open(&url).await;
    wait_for("controller2's agent record to expire", secs(20), || async {
        !keys_under(&s, "/agents/")
            .await
            .contains_key("/agents/controller2")
    })
    .await;
    let p = spawn(
        &url,
        &[
            "run",
            "--hosts",
            "controller1,compute1",
            "--instructions",
            r#"{"role_order": {"compute": "controller"}}"#,
            "restart",
        ],
    );
    let out = finish_or_kill(p, secs(20)).await;
    kill_pids(&[a.pid("stubborn-controller2"), a.pid("grandchild-controller2")]);
    let out = out.unwrap_or_else(|so_far| {
        panic!(
            "compute1 waits for controller2, which the command does not name:\n{so_far}\n{}",
            a.log()
        )
    });
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        text(&out),
        diagnostics(&f, &a)
    );
}

/// Found: a cancelled command's follower never ends while a host whose agent is
/// dead (killed mid-action, never back) still counts as running it: `jioctl run`
/// (and `commands follow`) wait for its result for ever, though nothing will ever
/// report it; the cancel said "1 host running it finishes". Expected: the follower
/// ends (exit 6), naming the host whose agent is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_commands_follower_ends_though_a_dead_agent_never_reports() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let mut f = Fleet::start_with(&url, &url, &["compute1", "compute2"], 0.1, |_| a.config(false)).await;
    a.set_seconds(30.0);
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
    f.daemons[0].start_kill().unwrap();
    let _ = f.daemons[0].wait().await;
    let s = open(&url).await;
    wait_for("compute1's agent record to expire", secs(20), || async {
        !keys_under(&s, "/agents/").await.contains_key("/agents/compute1")
    })
    .await;
    let c = run_bounded(&url, &["commands", "cancel", &id]).await;
    assert_eq!(c.status.code(), Some(0), "{}", text(&c));
    let out = finish_or_kill(follower, secs(20)).await;
    kill_pids(&a.all_pids());
    let out = out.unwrap_or_else(|so_far| {
        panic!("the follower of the cancelled command never ends (20 s):\n{so_far}")
    });
    assert_eq!(out.status.code(), Some(6), "{}", text(&out));
}

/// Found: an admission naming a command whose record is gone (deleted by hand, or
/// by a tool) holds its host in flight for ever: every command (and upgrade) on
/// the host waits "busy: admitted to fleet command X", the agent skips the id,
/// the driver service follows only ids with a record, and `commands cancel X`
/// fails ("no fleet command"): only an etcdctl by hand frees the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_to_a_command_whose_record_is_gone_does_not_hold_the_host_for_ever() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1"], 0.1, |_| a.config(false)).await;
    let gone = "20261001T000000Z-gone";
    let s = open(&url).await;
    s.put(
        &Key::new("/config_state/commands/compute1").unwrap(),
        &format!(r#"["{gone}"]"#),
        None,
    )
    .await
    .unwrap();
    let drive = spawn(&url, &["drive", "--lease", "3s"]);
    let cancel = run_bounded(&url, &["commands", "cancel", gone]).await;
    let p = spawn(&url, &["run", "--hosts", "compute1", "restart"]);
    let out = finish_or_kill(p, secs(20)).await;
    drop(drive);
    let inbox = inbox_of(&url, "compute1").await;
    let out = out.unwrap_or_else(|so_far| {
        panic!(
            "compute1 is held for ever by an admission to {gone}, which has no record (inbox {inbox:?}); `commands cancel {gone}` said: {}\n{so_far}\n{}",
            text(&cancel),
            diagnostics(&f, &a)
        )
    });
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}
