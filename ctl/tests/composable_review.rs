//! Review of composable rollouts (issue 17), each against a real etcd with real
//! `jio-agent` daemons (where agents matter) and real `jioctl` processes: operators'
//! moves in the middle of a phase (pause, emergency stop, re-targeting, `kill -9` of
//! the driver), hosts left behind (a failed task, a failed Puppet run) that an
//! operator enables again, `--stage` misuse, and a task that times out. Order,
//! overlap and repetition come from the task log the fleet's scripts write
//! (`common::composable`), never from jioctl's classification.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use jio_common::keys::Schema;
use jio_tests::Etcd;
use jio_tests::inspect::{open, text, wait_for};

use common::composable::{
    Fleet, Phase, PuppetKind, Service, Task, TaskRun, count, lockstep_violations, max_overlap, nova_compute,
    rollout_record, set, wait_for_run,
};
use common::fleet::{finish, keys_under, spawn};
use common::run;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Keystone: one pre step and one post step.
fn keystone() -> Service {
    Service::new(
        "keystone",
        vec![Task::pre(1, "stop keystone"), Task::post(3, "keystone db sync")],
    )
}

/// nova_compute with one pre and one post step (and no finalize task).
fn nova_compute_short() -> Service {
    Service::new(
        "nova_compute",
        vec![Task::pre(1, "RPC pin nova-compute"), Task::post(3, "db sync")],
    )
}

/// Everything in the store, for "nothing was written" (the epoch and lock keys
/// included: a refused command writes none of them either).
async fn dump(url: &str) -> BTreeMap<String, String> {
    let s = open(url).await;
    keys_under(&s, "/").await
}

/// The hosts' registry entries, as their agents would write them (no agent runs).
async fn register(url: &str, hosts: &[(&str, &str)]) {
    let s = open(url).await;
    let schema = Schema::default();
    s.put(&schema.current_version(), "v1", None).await.unwrap();
    for (h, role) in hosts {
        let key = jio_common::keys::Key::new(format!("/hosts/{h}")).unwrap();
        s.put(
            &key,
            &format!(r#"{{"role":"{role}","agent_version":"1","first_seen":1}}"#),
            None,
        )
        .await
        .unwrap();
    }
}

const STAGED_RULES: &str = r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "stages": { "controlplane": ["controller"], "compute": ["compute"] },
  "finalize": { "role": "controller" }
}"#;

/// `--stage` misuse: an unknown stage, `--stage` with rules that are not composable,
/// and a later stage before an earlier one: each a clear error, and nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stage_misuse_is_a_clear_error_and_writes_nothing() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    register(&url, &[("controller1", "controller"), ("compute1", "compute")]).await;
    let dir = tempfile::tempdir().unwrap();
    let staged = dir.path().join("staged.json");
    std::fs::write(&staged, STAGED_RULES).unwrap();
    let plain = dir.path().join("plain.json");
    std::fs::write(&plain, r#"{"rolling_rules": {"roles": {"compute": 1}}}"#).unwrap();
    let (staged, plain) = (staged.display().to_string(), plain.display().to_string());
    let before = dump(&url).await;
    for (args, code, says) in [
        (
            vec!["--instructions-file", &staged, "--stage", "bogus"],
            64,
            "no such stage",
        ),
        (
            vec!["--instructions-file", &plain, "--stage", "compute"],
            64,
            "no roles_data",
        ),
        (
            vec!["--instructions-file", &staged, "--stage", "compute"],
            64,
            "controlplane comes first",
        ),
    ] {
        let mut all = vec!["upgrade", "v2", "--detach"];
        all.extend(args.iter().copied());
        let out = run(&url, &all).await;
        let t = text(&out);
        assert_eq!(out.status.code(), Some(code), "jioctl {all:?}: {t}");
        assert!(t.contains(says), "jioctl {all:?}: {t}");
        assert_eq!(dump(&url).await, before, "jioctl {all:?} wrote something: {t}");
    }
}

/// `jioctl upgrade v2` (every stage) followed by `jioctl upgrade v2 --stage
/// controlplane` with the same rules follows the same rollout: it may not take the
/// compute stage away from a rollout that already runs it (its hosts would be told
/// "not started" while their grants and admissions stand).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn following_a_rollout_of_every_stage_with_stage_does_not_narrow_it() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    register(&url, &[("controller1", "controller"), ("compute1", "compute")]).await;
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("staged.json");
    std::fs::write(&rules, STAGED_RULES).unwrap();
    let rules = rules.display().to_string();
    let out = run(
        &url,
        &["upgrade", "v2", "--instructions-file", &rules, "--detach"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let r = rollout_record(&url).await;
    let id = r["id"].clone();
    let every = |r: &serde_json::Value| r["stages"].is_null() || r["stages"] == serde_json::json!([]);
    assert!(every(&r), "started with every stage: {r:#}");
    let out = run(
        &url,
        &[
            "upgrade",
            "v2",
            "--instructions-file",
            &rules,
            "--stage",
            "controlplane",
            "--detach",
        ],
    )
    .await;
    let r = rollout_record(&url).await;
    assert_eq!(r["id"], id, "the same rollout: {r:#}");
    assert!(
        every(&r) || r["stages"] == serde_json::json!(["controlplane", "compute"]),
        "`--stage controlplane` ({:?}: {}) took the compute stage away from the rollout: {r:#}",
        out.status.code(),
        text(&out)
    );
}

/// Rules for the left-behind tests: one controller, two computes, one failure
/// allowed, both computes at once.
const LEFT_RULES: &str = r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "finalize": { "role": "controller" },
  "max_failures": 1,
  "rolling_rules": { "roles": { "compute": 2 } }
}"#;

/// compute2 is left behind after failing in `failed_in`; while compute1's post-3
/// runs long (the post-3 grant stands), the operator enables compute2 again. Returns
/// the driver's output and the v2 runs.
async fn enable_a_left_behind_host(f: &Fleet, url: &str, release: bool, code: i32) -> (String, Vec<TaskRun>) {
    f.set_task_seconds("compute1", "nova_compute", Phase::Post(3), None, 12.0);
    let rules = f.rules(LEFT_RULES);
    let driver = spawn(url, &["upgrade", "v2", "--instructions-file", &rules]);
    wait_for_run(f, "compute1's post-3 to start", secs(60), |r| {
        r.host == "compute1" && r.phase == Phase::Post(3) && r.version == "v2"
    })
    .await;
    if release {
        let out = run(url, &["release", "compute2"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    }
    let out = run(url, &["enable-puppet", "true", "--host", "compute2"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = finish(driver, secs(60)).await;
    let t = text(&out);
    assert_eq!(
        out.status.code(),
        Some(code),
        "the rollout's end: {t}\n{}",
        f.diagnostics()
    );
    (t, f.runs_of("v2"))
}

/// A host whose pre-1 task failed (within max_failures) is left behind; enabled
/// again by an operator while post-3 is granted, its agent refuses the later phase:
/// it runs neither Puppet nor post-3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_task_failed_refuses_a_later_phase_even_when_enabled() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names = ["compute1", "compute2", "controller1"];
    let f = Fleet::start(
        &url,
        &names,
        &[keystone(), nova_compute_short()],
        PuppetKind::StandIn,
    )
    .await;
    f.fail("compute2", "nova_compute", Phase::Pre(1));
    let (out, runs) = enable_a_left_behind_host(&f, &url, false, 1).await;
    assert!(out.contains("compute2"), "{out}");
    let d = f.diagnostics();
    assert_eq!(
        count(
            &runs,
            "compute2",
            "nova_compute",
            Phase::Pre(1),
            "RPC pin nova-compute"
        ),
        1,
        "{d}"
    );
    assert_eq!(
        count(&runs, "compute2", "puppet", Phase::Puppet, "puppet"),
        0,
        "{d}"
    );
    assert_eq!(
        count(&runs, "compute2", "nova_compute", Phase::Post(3), "db sync"),
        0,
        "{d}"
    );
    assert!(f.all_at(&["compute2"], "v1"), "{d}");
    assert!(f.all_at(&["compute1", "controller1"], "v2"), "{d}");
}

/// The same with a failed Puppet run (its validation fails): compute2 never reached
/// the version, so its post-3 tasks (db sync, start the service) must not run on it
/// when an operator enables it again while post-3 is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_puppet_failed_refuses_the_post_phase_even_when_enabled() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names = ["compute1", "compute2", "controller1"];
    let f = Fleet::start(
        &url,
        &names,
        &[keystone(), nova_compute_short()],
        PuppetKind::StandIn,
    )
    .await;
    f.hosts[f.index("compute2")].set_validation(false);
    let (out, runs) = enable_a_left_behind_host(&f, &url, false, 1).await;
    assert!(out.contains("compute2"), "{out}");
    let d = f.diagnostics();
    assert_eq!(
        count(&runs, "compute2", "puppet", Phase::Puppet, "puppet"),
        1,
        "{d}"
    );
    assert_eq!(
        count(&runs, "compute2", "nova_compute", Phase::Post(3), "db sync"),
        0,
        "compute2 failed its Puppet phase, yet ran post-3's db sync\n{d}"
    );
}

/// Rules with one compute at a time, so that computes wait for admission.
const ONE_RULES: &str = r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "finalize": { "role": "controller" },
  "rolling_rules": { "roles": { "compute": 1 } }
}"#;

/// Starts a driver under ONE_RULES with compute1's pre-1 slow, and returns once
/// compute1 runs it (the other computes wait for their turn).
async fn mid_pre_1(f: &Fleet, url: &str, seconds: f64) -> tokio::process::Child {
    f.set_task_seconds("compute1", "nova_compute", Phase::Pre(1), None, seconds);
    let rules = f.rules(ONE_RULES);
    let driver = spawn(url, &["upgrade", "v2", "--instructions-file", &rules]);
    wait_for_run(f, "compute1's pre-1 to start", secs(60), |r| {
        r.host == "compute1" && r.phase == Phase::Pre(1) && r.version == "v2"
    })
    .await;
    driver
}

/// Waits until compute1's slow pre-1 run ended and every agent is idle again in
/// the store, then a little more for anything that would start on its own.
async fn settle_after_compute1(f: &Fleet, url: &str) {
    wait_for_run(f, "compute1's pre-1 to end", secs(30), |r| {
        r.host == "compute1" && r.phase == Phase::Pre(1) && r.end.is_some()
    })
    .await;
    let s = open(url).await;
    wait_for("every agent idle, no run marker", secs(20), || async {
        let agents = keys_under(&s, "/agents/").await;
        keys_under(&s, "/runs/").await.is_empty()
            && agents.values().all(|v| !v.contains("\"state\":\"upgrading\""))
    })
    .await;
    // Passes of the agents are woken by the keys they watch; a few seconds is many
    // passes (nothing here waits on a timer of the agent's).
    tokio::time::sleep(secs(3)).await;
}

/// `jioctl rollout pause` in the middle of pre-1: the host in flight finishes, no
/// task (nor Puppet) starts anywhere until `rollout resume`; then the rollout ends
/// done, in lockstep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_mid_phase_starts_nothing_until_resumed() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names = ["compute1", "compute2", "compute3", "controller1"];
    let f = Fleet::start(&url, &names, &[keystone(), nova_compute()], PuppetKind::StandIn).await;
    let driver = mid_pre_1(&f, &url, 4.0).await;
    let out = run(&url, &["rollout", "pause", "--reason", "review"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let paused_at = now();
    settle_after_compute1(&f, &url).await;
    let late: Vec<TaskRun> = f
        .runs_of("v2")
        .into_iter()
        .filter(|r| r.start > paused_at)
        .collect();
    assert!(
        late.is_empty(),
        "started while paused: {late:#?}\n{}",
        f.diagnostics()
    );
    let out = run(&url, &["rollout", "resume"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = finish(driver, secs(60)).await;
    assert_eq!(out.status.code(), Some(0), "{}\n{}", text(&out), f.diagnostics());
    let runs = f.runs_of("v2");
    assert!(f.all_at(&names, "v2"), "{}", f.diagnostics());
    let v = lockstep_violations(&runs, &set(&names));
    assert!(v.is_empty(), "{v:#?}\n{}", f.diagnostics());
    for phase in [
        Phase::Pre(1),
        Phase::Pre(2),
        Phase::Puppet,
        Phase::Post(3),
        Phase::Post(4),
    ] {
        let (n, at) = max_overlap(&runs, &set(&["compute1", "compute2", "compute3"]), phase);
        assert!(n <= 1, "{phase}: {at:?}\n{}", f.diagnostics());
    }
}

/// The emergency stop in the middle of pre-1: the driver stops (6), the host in
/// flight finishes, and nothing starts afterwards, neither a task nor Puppet (the
/// grants go with the rollout, the enable keys with the stop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emergency_stop_mid_phase_starts_nothing_afterwards() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names = ["compute1", "compute2", "compute3", "controller1"];
    let f = Fleet::start(&url, &names, &[keystone(), nova_compute()], PuppetKind::StandIn).await;
    let driver = mid_pre_1(&f, &url, 4.0).await;
    let out = run(&url, &["global-disable-puppet"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stopped_at = now();
    let out = finish(driver, secs(20)).await;
    assert_eq!(out.status.code(), Some(6), "{}", text(&out));
    settle_after_compute1(&f, &url).await;
    let late: Vec<TaskRun> = f.runs().into_iter().filter(|r| r.start > stopped_at).collect();
    assert!(
        late.is_empty(),
        "started after the emergency stop: {late:#?}\n{}",
        f.diagnostics()
    );
    assert!(f.all_at(&names, "v1"), "{}", f.diagnostics());
    let s = open(&url).await;
    assert!(
        keys_under(&s, "/steps/").await.is_empty(),
        "the grants end with the rollout"
    );
}

/// Re-targeting (`upgrade v3`, same rules) while compute1 still runs its v2 pre-1
/// task under a limit of one compute: no other compute starts anything (of v3)
/// while compute1's v2 task runs, from the task log; v3 then ends done in lockstep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retargeting_mid_phase_keeps_the_host_in_flight_in_its_groups_count() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names = ["compute1", "compute2", "compute3", "controller1"];
    let f = Fleet::start(&url, &names, &[keystone(), nova_compute()], PuppetKind::StandIn).await;
    let first = mid_pre_1(&f, &url, 5.0).await;
    let rules = f.rules(ONE_RULES);
    let second = spawn(&url, &["upgrade", "v3", "--instructions-file", &rules]);
    let out = finish(first, secs(20)).await;
    assert_eq!(
        out.status.code(),
        Some(6),
        "replaced by a newer rollout: {}",
        text(&out)
    );
    f.clear_task_seconds("compute1", "nova_compute", Phase::Pre(1), None);
    let out = finish(second, secs(60)).await;
    assert_eq!(out.status.code(), Some(0), "{}\n{}", text(&out), f.diagnostics());
    assert!(f.all_at(&names, "v3"), "{}", f.diagnostics());
    // Every compute run of any version and phase: at most one compute at a time.
    let runs = f.runs();
    let computes = set(&["compute1", "compute2", "compute3"]);
    let spans: Vec<&TaskRun> = runs
        .iter()
        .filter(|r| computes.contains(&r.host) && r.version != "v1")
        .collect();
    for a in &spans {
        for b in &spans {
            if a.host != b.host && a.start <= b.start && a.end.is_none_or(|e| e > b.start) {
                panic!(
                    "{} {} {} ran while {} {} {} did, against a limit of 1\n{}",
                    b.host,
                    b.version,
                    b.phase,
                    a.host,
                    a.version,
                    a.phase,
                    f.diagnostics()
                );
            }
        }
    }
    let v3 = f.runs_of("v3");
    let v = lockstep_violations(&v3, &set(&names));
    assert!(v.is_empty(), "{v:#?}\n{}", f.diagnostics());
}

/// `kill -9` of the driver in the middle of pre-1; a second `upgrade` takes the
/// lock over and finishes the rollout: each task once, lockstep and the limit hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_killed_mid_phase_is_taken_over_and_nothing_runs_twice() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names = ["compute1", "compute2", "compute3", "controller1"];
    let f = Fleet::start(&url, &names, &[keystone(), nova_compute()], PuppetKind::StandIn).await;
    let mut first = mid_pre_1(&f, &url, 3.0).await;
    first.start_kill().unwrap();
    first.wait().await.unwrap();
    let rules = f.rules(ONE_RULES);
    f.upgrade(&url, &["v2", "--instructions-file", &rules], 0, secs(60))
        .await;
    let runs = f.runs_of("v2");
    assert!(f.all_at(&names, "v2"), "{}", f.diagnostics());
    let v = lockstep_violations(&runs, &set(&names));
    assert!(v.is_empty(), "{v:#?}\n{}", f.diagnostics());
    for h in ["compute1", "compute2", "compute3"] {
        for (phase, task) in [
            (Phase::Pre(1), "RPC pin nova-compute"),
            (Phase::Post(3), "db sync"),
            (Phase::Post(4), "start nova-compute"),
        ] {
            assert_eq!(
                count(&runs, h, "nova_compute", phase, task),
                1,
                "{h} {task}\n{}",
                f.diagnostics()
            );
        }
    }
    for phase in [
        Phase::Pre(1),
        Phase::Pre(2),
        Phase::Puppet,
        Phase::Post(3),
        Phase::Post(4),
    ] {
        let (n, at) = max_overlap(&runs, &set(&["compute1", "compute2", "compute3"]), phase);
        assert!(n <= 1, "{phase}: {at:?}\n{}", f.diagnostics());
    }
}

/// A task past its own `timeout` is stopped (it never logs its end), fails its host
/// with a reason that says so, and with max_failures 0 the rollout stops: no later
/// phase starts anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_past_its_timeout_is_stopped_and_fails_the_rollout() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names = ["compute1", "compute2", "controller1"];
    let f = Fleet::start(
        &url,
        &names,
        &[keystone(), nova_compute_short()],
        PuppetKind::StandIn,
    )
    .await;
    // nova_compute's pre-1 task with a 1 s timeout; compute2's sleeps 20 s.
    let task = f.work.path().join("task.sh").display().to_string();
    let log = f.log_path().display().to_string();
    let q = jio_tests::host::toml_str;
    std::fs::write(
        f.work.path().join("services").join("nova_compute.toml"),
        format!(
            "[[task]]\nname = \"RPC pin nova-compute\"\nstep = 1\nwhen = \"pre\"\ncommand = [{}, {}]\ntimeout = \"1s\"\n\n[[task]]\nname = \"db sync\"\nstep = 3\nwhen = \"post\"\ncommand = [{}, {}]\n",
            q(&task),
            q(&log),
            q(&task),
            q(&log)
        ),
    )
    .unwrap();
    f.set_task_seconds("compute2", "nova_compute", Phase::Pre(1), None, 20.0);
    let rules = f.rules(
        r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "finalize": { "role": "controller" },
  "rolling_rules": { "roles": { "compute": 2 } }
}"#,
    );
    let started = std::time::Instant::now();
    let out = f
        .upgrade(&url, &["v2", "--instructions-file", &rules], 1, secs(50))
        .await;
    assert!(
        started.elapsed() < secs(20),
        "the task was not stopped at its timeout"
    );
    assert!(out.contains("compute2"), "{out}");
    let runs = f.runs_of("v2");
    let slow: Vec<&TaskRun> = runs
        .iter()
        .filter(|r| r.host == "compute2" && r.phase == Phase::Pre(1))
        .collect();
    assert_eq!(slow.len(), 1, "{slow:#?}");
    assert!(slow[0].end.is_none(), "stopped before its end: {slow:#?}");
    let later: Vec<&TaskRun> = runs.iter().filter(|r| r.phase > Phase::Pre(1)).collect();
    assert!(later.is_empty(), "{later:#?}\n{}", f.diagnostics());
    let r = rollout_record(&url).await;
    assert_eq!(r["state"], "failed", "{r:#}");
    let why = r.to_string();
    assert!(
        why.contains("RPC pin nova-compute") && why.contains("did not finish within 1s"),
        "the failure names the task and its timeout: {r:#}"
    );
}

/// A host held before the rollout is left behind in pre-1 (held while it went on);
/// released and enabled by an operator while post-3 is granted, it must not run
/// post-3's tasks: it ran neither its pre step nor Puppet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_left_behind_while_held_refuses_the_post_phase_when_released_and_enabled() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names = ["compute1", "compute2", "controller1"];
    let f = Fleet::start(
        &url,
        &names,
        &[keystone(), nova_compute_short()],
        PuppetKind::StandIn,
    )
    .await;
    let out = run(&url, &["hold", "compute2", "--reason", "disk swap"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let (_, runs) = enable_a_left_behind_host(&f, &url, true, 0).await;
    let d = f.diagnostics();
    assert_eq!(
        count(
            &runs,
            "compute2",
            "nova_compute",
            Phase::Pre(1),
            "RPC pin nova-compute"
        ),
        0,
        "{d}"
    );
    assert_eq!(
        count(&runs, "compute2", "puppet", Phase::Puppet, "puppet"),
        0,
        "{d}"
    );
    assert_eq!(
        count(&runs, "compute2", "nova_compute", Phase::Post(3), "db sync"),
        0,
        "compute2 skipped pre-1 and Puppet, yet ran post-3's db sync\n{d}"
    );
}

/// After a composable rollout ended `failed` on a task, `jioctl get-failures` (the
/// operators' check: exit 1 when hosts failed) still names the failed host, as it
/// does after a plain rollout failed in Puppet (its entries stay with the version).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_failures_still_names_a_host_whose_task_failed_after_the_rollout_ended() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names = ["compute1", "controller1"];
    let f = Fleet::start(
        &url,
        &names,
        &[keystone(), nova_compute_short()],
        PuppetKind::StandIn,
    )
    .await;
    f.fail("compute1", "nova_compute", Phase::Pre(1));
    let rules = f.rules(
        r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "finalize": { "role": "controller" }
}"#,
    );
    let out = f
        .upgrade(&url, &["v2", "--instructions-file", &rules], 1, secs(40))
        .await;
    assert!(out.contains("compute1"), "{out}");
    assert_eq!(rollout_record(&url).await["state"], "failed");
    let out = run(&url, &["get-failures", "--hosts"]).await;
    let t = text(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "get-failures after the failed rollout: {t}"
    );
    assert!(t.contains("compute1"), "{t}");
}

/// Garbage in the keys of a composable rollout before it starts: a grant that is not
/// JSON, a finalize grant for nobody, and a host's service catalog overwritten with
/// garbage. No daemon ends, `jioctl status` names the keys, and the rollout still
/// ends done: the driver writes the grants again, and the host's agent publishes its
/// catalog again (it is the only writer of that key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_grants_and_catalogs_are_named_and_repaired() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names = ["compute1", "controller1"];
    let mut f = Fleet::start(
        &url,
        &names,
        &[keystone(), nova_compute_short()],
        PuppetKind::StandIn,
    )
    .await;
    let s = open(&url).await;
    let key = |k: &str| jio_common::keys::Key::new(k).unwrap();
    s.put(&key("/steps/roles/controller"), "{not json", None)
        .await
        .unwrap();
    s.put(
        &key("/steps/finalize"),
        r#"{"rollout":"x","host":"nobody"}"#,
        None,
    )
    .await
    .unwrap();
    s.put(&key("/hosts/compute1/services"), "\u{7f}garbage", None)
        .await
        .unwrap();
    let out = run(&url, &["status"]).await;
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(
        t.contains("/hosts/compute1/services") && t.contains("/steps/roles/controller"),
        "{t}"
    );
    let rules = f.rules(
        r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "finalize": { "role": "controller" }
}"#,
    );
    let driver = spawn(&url, &["upgrade", "v2", "--instructions-file", &rules]);
    let out = tokio::time::timeout(secs(30), driver.wait_with_output()).await;
    for h in names {
        assert!(f.agent_running(h), "{h}'s agent ended\n{}", f.diagnostics());
    }
    let st = text(&run(&url, &["status"]).await);
    let out = out.unwrap_or_else(|_| panic!("the rollout did not end within 30 s:\n{st}"));
    let out = out.unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{st}\n{}",
        text(&out),
        f.diagnostics()
    );
    assert!(f.all_at(&names, "v2"), "{}", f.diagnostics());
}
