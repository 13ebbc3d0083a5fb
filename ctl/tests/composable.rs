//! Composable service upgrades (issue 17), each against a real etcd with real
//! `jio-agent` daemons and `jioctl` processes: steps in lockstep across a stage with
//! the real `puppet apply` between the pre and post steps, the rolling limits within
//! each step, a service that runs after another across hosts and on one host, the
//! deployment-wide finalize (once, last; its failure fails the rollout), a staged
//! rollout, and `kill -9` of an agent in the middle of a step.
//!
//! The services' tasks are a script that appends its own start and end to one file
//! shared by the fleet (and Puppet does the same): every assertion on order, overlap
//! and repetition comes from that file alone (`common::composable`), never from
//! jioctl's classification. The unit tests at the end feed those checks hand-made
//! logs that break each rule, so that the checks can fail.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use jio_tests::Etcd;
use jio_tests::inspect::{open, text, wait_for};

use common::composable::{
    Fleet, Phase, PuppetKind, Service, Task, after_violations, alive, count, finalize_violations,
    lockstep_violations, max_overlap, nova_compute, of_version, parent_pid, parse_log, rollout_record,
    sequence_violations, set, stage_order_violations, stage_states, wait_for_run,
};
use common::fleet::{finish, keys_under, spawn};
use common::run;

const CONTROLLERS: [&str; 2] = ["controller1", "controller2"];
const COMPUTES: [&str; 4] = ["compute1", "compute2", "compute3", "compute4"];

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Keystone: one pre step and one post step.
fn keystone() -> Service {
    Service::new(
        "keystone",
        vec![Task::pre(1, "stop keystone"), Task::post(3, "keystone db sync")],
    )
}

/// `roles_data` with keystone on the controllers and the seed's nova-compute on the
/// computes, one controller and two computes at a time.
const LOCKSTEP_RULES: &str = r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "finalize": { "role": "controller" },
  "rolling_rules": { "roles": { "controller": 1, "compute": 2 } }
}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockstep_with_real_puppet_no_host_starts_a_step_early_and_the_limits_hold() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names: Vec<&str> = CONTROLLERS.iter().chain(COMPUTES.iter()).copied().collect();
    let f = Fleet::start(&url, &names, &[keystone(), nova_compute()], PuppetKind::Real).await;
    let rules = f.rules(LOCKSTEP_RULES);
    f.upgrade(&url, &["v2", "--instructions-file", &rules], 0, secs(120))
        .await;
    let runs = f.runs_of("v2");
    assert!(f.all_at(&names, "v2"), "{}", f.diagnostics());

    // No host started a phase (pre-1, pre-2, puppet, post-3, post-4) before every
    // host had finished the one before.
    let v = lockstep_violations(&runs, &set(&names));
    assert!(v.is_empty(), "{v:#?}\n{}", f.diagnostics());

    // Each host ran exactly its own tasks, once, in their phases; the controllers
    // take no part in pre-2 and post-4 (keystone has no task there).
    let ks = "keystone";
    let nc = "nova_compute";
    let puppet = [("puppet", "puppet")];
    for h in CONTROLLERS {
        for (phase, want) in [
            (Phase::Pre(1), vec![(ks, "stop keystone")]),
            (Phase::Pre(2), vec![]),
            (Phase::Puppet, puppet.to_vec()),
            (Phase::Post(3), vec![(ks, "keystone db sync")]),
            (Phase::Post(4), vec![]),
        ] {
            let v = sequence_violations(&runs, h, phase, &want);
            assert!(v.is_empty(), "{v:#?}\n{}", f.diagnostics());
        }
    }
    for h in COMPUTES {
        for (phase, want) in [
            (Phase::Pre(1), vec![(nc, "RPC pin nova-compute")]),
            (Phase::Pre(2), vec![(nc, "stop nova-compute")]),
            (Phase::Puppet, puppet.to_vec()),
            (Phase::Post(3), vec![(nc, "db sync")]),
            (Phase::Post(4), vec![(nc, "start nova-compute")]),
        ] {
            let v = sequence_violations(&runs, h, phase, &want);
            assert!(v.is_empty(), "{v:#?}\n{}", f.diagnostics());
        }
    }

    // Within each phase the rolling limits held, and were reached (so the check
    // could have failed).
    let mut most: BTreeMap<&str, usize> = BTreeMap::new();
    for phase in [
        Phase::Pre(1),
        Phase::Pre(2),
        Phase::Puppet,
        Phase::Post(3),
        Phase::Post(4),
    ] {
        for (role, hosts, limit) in [("controller", &CONTROLLERS[..], 1), ("compute", &COMPUTES[..], 2)] {
            let (n, at) = max_overlap(&runs, &set(hosts), phase);
            assert!(
                n <= limit,
                "{n} {role} hosts ran {phase} at once against a limit of {limit}: {at:?}\n{}",
                f.diagnostics()
            );
            let m = most.entry(role).or_default();
            *m = (*m).max(n);
        }
    }
    assert_eq!(most.get("compute"), Some(&2), "{}", f.diagnostics());
    assert_eq!(most.get("controller"), Some(&1), "{}", f.diagnostics());

    // Finalize: once, on the first controller, after every task and Puppet run.
    let v = finalize_violations(&runs, "controller1", &[(nc, "unpin RPC")]);
    assert!(v.is_empty(), "{v:#?}\n{}", f.diagnostics());
    let r = rollout_record(&url).await;
    assert_eq!(r["state"], "done", "{r:#}");
}

/// Keystone with two pre-1 tasks (file order), a post step and a finalize task.
fn keystone_with_finalize() -> Service {
    Service::new(
        "keystone",
        vec![
            Task::pre(1, "keystone maintenance on"),
            Task::pre(1, "stop keystone"),
            Task::post(3, "keystone db sync"),
            Task::finalize("keystone expand contract"),
        ],
    )
}

/// nova_api runs each of its steps after keystone's, everywhere.
fn nova_api() -> Service {
    Service::new(
        "nova_api",
        vec![
            Task::pre(1, "stop nova-api"),
            Task::post(3, "api db sync"),
            Task::post(3, "start nova-api"),
            Task::finalize("online data migrations"),
        ],
    )
    .after(&["keystone"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_after_keystone_waits_for_keystone_on_every_host_and_on_its_own() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    // keystone alone on identity*, nova_api alone on api*, both on controller1.
    let names = ["api1", "api2", "controller1", "identity1", "identity2"];
    let f = Fleet::start(
        &url,
        &names,
        &[keystone_with_finalize(), nova_api()],
        PuppetKind::StandIn,
    )
    .await;
    // identity2's keystone is slow at step 1 and at step 3: a nova_api that did not
    // wait for it everywhere would start while it still runs.
    f.set_task_seconds("identity2", "keystone", Phase::Pre(1), None, 1.5);
    f.set_task_seconds("identity2", "keystone", Phase::Post(3), None, 1.5);
    let rules = f.rules(
        r#"{
  "roles_data": {
    "identity": ["keystone"],
    "controller": ["keystone", "nova_api"],
    "api": ["nova_api"]
  },
  "finalize": { "role": "controller" },
  "rolling_rules": { "roles": { "identity": 2, "api": 2, "controller": 1 } }
}"#,
    );
    f.upgrade(&url, &["v2", "--instructions-file", &rules], 0, secs(90))
        .await;
    let runs = f.runs_of("v2");
    assert!(f.all_at(&names, "v2"), "{}", f.diagnostics());

    // Across hosts: every nova_api step started after keystone's same step ended on
    // every host that runs keystone.
    let v = after_violations(&runs, "nova_api", "keystone");
    assert!(v.is_empty(), "{v:#?}\n{}", f.diagnostics());
    // It was put to the test: both services ran their steps where the rules say.
    for (h, service, phase, task) in [
        ("identity1", "keystone", Phase::Pre(1), "stop keystone"),
        ("identity2", "keystone", Phase::Pre(1), "stop keystone"),
        ("controller1", "keystone", Phase::Pre(1), "stop keystone"),
        ("controller1", "nova_api", Phase::Pre(1), "stop nova-api"),
        ("api1", "nova_api", Phase::Pre(1), "stop nova-api"),
        ("api2", "nova_api", Phase::Post(3), "start nova-api"),
        ("identity2", "keystone", Phase::Post(3), "keystone db sync"),
    ] {
        assert_eq!(
            count(&runs, h, service, phase, task),
            1,
            "{h} {task}\n{}",
            f.diagnostics()
        );
    }

    // On the host that runs both: keystone's tasks first (in file order), then
    // nova_api's, each after the one before ended; the finalize tasks too.
    let (ks, na) = ("keystone", "nova_api");
    for (h, phase, want) in [
        (
            "controller1",
            Phase::Pre(1),
            vec![
                (ks, "keystone maintenance on"),
                (ks, "stop keystone"),
                (na, "stop nova-api"),
            ],
        ),
        (
            "controller1",
            Phase::Post(3),
            vec![
                (ks, "keystone db sync"),
                (na, "api db sync"),
                (na, "start nova-api"),
            ],
        ),
        (
            "controller1",
            Phase::Finalize,
            vec![(ks, "keystone expand contract"), (na, "online data migrations")],
        ),
        (
            "identity1",
            Phase::Pre(1),
            vec![(ks, "keystone maintenance on"), (ks, "stop keystone")],
        ),
        (
            "api1",
            Phase::Post(3),
            vec![(na, "api db sync"), (na, "start nova-api")],
        ),
    ] {
        let v = sequence_violations(&runs, h, phase, &want);
        assert!(v.is_empty(), "{v:#?}\n{}", f.diagnostics());
    }

    let v = lockstep_violations(&runs, &set(&names));
    assert!(v.is_empty(), "{v:#?}\n{}", f.diagnostics());
    let v = finalize_violations(
        &runs,
        "controller1",
        &[(ks, "keystone expand contract"), (na, "online data migrations")],
    );
    assert!(v.is_empty(), "{v:#?}\n{}", f.diagnostics());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_finalize_task_fails_the_rollout_naming_the_host_and_the_task() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names = ["compute1", "compute2", "controller1", "controller2"];
    let f = Fleet::start(&url, &names, &[keystone(), nova_compute()], PuppetKind::StandIn).await;
    f.fail("controller1", "nova_compute", Phase::Finalize);
    let rules = f.rules(
        r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "finalize": { "role": "controller" },
  "rolling_rules": { "roles": { "compute": 2 } }
}"#,
    );
    let out = f
        .upgrade(&url, &["v2", "--instructions-file", &rules], 1, secs(90))
        .await;
    assert!(out.contains("controller1"), "{out}");
    let runs = f.runs_of("v2");
    // Every host was upgraded; only the deployment-wide step failed.
    assert!(f.all_at(&names, "v2"), "{}", f.diagnostics());
    // It ran once (not again elsewhere), after everything else had ended.
    let v = finalize_violations(&runs, "controller1", &[("nova_compute", "unpin RPC")]);
    assert!(v.is_empty(), "{v:#?}\n{}", f.diagnostics());
    let r = rollout_record(&url).await;
    assert_eq!(r["state"], "failed", "{r:#}");
    let record = r.to_string();
    assert!(
        record.contains("controller1") && record.contains("unpin RPC"),
        "the failed record names the host and the task: {r:#}"
    );
}

/// The staged rollout's rules: the control plane, then the computes.
const STAGED_RULES: &str = r#"{
  "roles_data": {
    "controller": ["keystone", "nova_api"],
    "stmon": ["ceph_mon"],
    "compute": ["nova_compute"]
  },
  "stages": { "controlplane": ["controller", "stmon"], "compute": ["compute"] },
  "finalize": { "role": "controller" },
  "rolling_rules": { "roles": { "controller": 1, "compute": 1 } }
}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_rollout_upgrades_the_control_plane_then_the_rest_as_one_rollout() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let s = open(&url).await;
    let plane = ["controller1", "controller2", "stmon1"];
    let computes = ["compute1", "compute2"];
    let names: Vec<&str> = plane.iter().chain(computes.iter()).copied().collect();
    let ceph_mon = Service::new(
        "ceph_mon",
        vec![Task::pre(1, "ceph health"), Task::post(3, "restart ceph-mon")],
    );
    // Health checks every second: the hosts a stage has not reached keep theirs.
    let mut f = Fleet::start_with(
        &url,
        &names,
        &[keystone(), nova_api(), ceph_mon, nova_compute()],
        PuppetKind::StandIn,
        "health_interval = \"1s\"",
    )
    .await;
    let rules = f.rules(STAGED_RULES);

    f.upgrade(
        &url,
        &["v2", "--instructions-file", &rules, "--stage", "controlplane"],
        0,
        secs(90),
    )
    .await;
    // Between the stages (no driver holds the lock), the computes, still at v1, go
    // on checking their health at v1: their run directories say so.
    let checks = |h: &str| {
        let dir = f.hosts[f.index(h)].state_dir().join("runs");
        std::fs::read_dir(dir)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with("-v1"))
                    .filter(|e| e.path().join("validation.stdout").exists())
                    .count()
            })
            .unwrap_or(0)
    };
    let before: Vec<usize> = computes.iter().map(|h| checks(h)).collect();
    wait_for(
        "a health check of v1 on each compute between the stages",
        secs(20),
        || async { computes.iter().zip(&before).all(|(h, b)| checks(h) > *b) },
    )
    .await;
    let runs = f.runs_of("v2");
    assert!(f.all_at(&plane, "v2"), "{}", f.diagnostics());
    // The computes stayed at v1: not one of their tasks, nor their Puppet, ran.
    assert!(f.all_at(&computes, "v1"), "{}", f.diagnostics());
    let early: Vec<_> = runs.iter().filter(|r| r.host.starts_with("compute")).collect();
    assert!(early.is_empty(), "{early:#?}");
    // Finalize waits for every stage.
    assert!(
        runs.iter().all(|r| r.phase != Phase::Finalize),
        "{}",
        f.diagnostics()
    );
    let v = lockstep_violations(&runs, &set(&plane));
    assert!(v.is_empty(), "{v:#?}\n{}", f.diagnostics());
    // The stages' states, for programs and for people.
    let stages = stage_states(&url).await;
    assert_eq!(
        stages.get("controlplane").map(|s| s.0.as_str()),
        Some("done"),
        "{stages:?}"
    );
    assert_eq!(
        stages.get("compute").map(|s| s.0.as_str()),
        Some("not_started"),
        "{stages:?}"
    );
    // Each compute says why it waits (the spec's wording is `stage compute not
    // started`; "is not started" reads the same).
    let st = text(&run(&url, &["status"]).await);
    for h in computes {
        let line = st.lines().find(|l| l.starts_with(h)).unwrap_or_default();
        assert!(
            line.contains("stage compute") && line.contains("not started"),
            "{h}: {line:?}\n{st}"
        );
    }
    let r = rollout_record(&url).await;
    let id = r["id"].as_str().unwrap().to_string();
    assert_eq!(r["stages"], serde_json::json!(["controlplane"]), "{r:#}");
    let rs = text(&run(&url, &["rollout", "status"]).await);
    assert!(rs.contains("controlplane"), "{rs}");
    // The computes' agents are up and alive in the store, at the old version.
    for h in computes {
        assert!(f.agent_running(h), "{h}\n{}", f.diagnostics());
    }
    let agents = keys_under(&s, "/agents/").await;
    for h in computes {
        assert!(agents.contains_key(&format!("/agents/{h}")), "{agents:?}");
    }

    f.upgrade(
        &url,
        &["v2", "--instructions-file", &rules, "--stage", "compute"],
        0,
        secs(90),
    )
    .await;
    let runs = f.runs_of("v2");
    assert!(f.all_at(&names, "v2"), "{}", f.diagnostics());
    let r = rollout_record(&url).await;
    assert_eq!(r["id"], id.as_str(), "the same rollout went on: {r:#}");
    assert_eq!(r["state"], "done", "{r:#}");
    // Every stage started: the record lists both, or none (no list means every stage).
    assert!(
        r["stages"] == serde_json::json!(["controlplane", "compute"])
            || r["stages"].is_null()
            || r["stages"] == serde_json::json!([]),
        "{r:#}"
    );
    // The computes ran their steps in lockstep, one at a time, after the control
    // plane had finished; finalize came last.
    for v in [
        lockstep_violations(&runs, &set(&computes)),
        stage_order_violations(&runs, &set(&plane), &set(&computes)),
        finalize_violations(
            &runs,
            "controller1",
            &[
                ("nova_api", "online data migrations"),
                ("nova_compute", "unpin RPC"),
            ],
        ),
    ] {
        assert!(v.is_empty(), "{v:#?}\n{}", f.diagnostics());
    }
    for phase in [
        Phase::Pre(1),
        Phase::Pre(2),
        Phase::Puppet,
        Phase::Post(3),
        Phase::Post(4),
    ] {
        let (n, at) = max_overlap(&runs, &set(&computes), phase);
        assert!(n <= 1, "{n} computes in {phase} at once: {at:?}");
    }
    for h in computes {
        assert_eq!(
            count(&runs, h, "nova_compute", Phase::Post(4), "start nova-compute"),
            1
        );
    }
}

/// nova-compute with a step 2 whose third task runs long on the host whose agent is
/// killed: the first task may run again (idempotent), the second may not.
fn nova_compute_for_the_kill() -> Service {
    Service::new(
        "nova_compute",
        vec![
            Task::pre(1, "RPC pin nova-compute"),
            Task::pre(2, "disable scheduling").idempotent(),
            Task::pre(2, "stop nova-compute"),
            Task::pre(2, "wait for instances"),
            Task::pre(2, "record stop"),
            Task::post(3, "start nova-compute"),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_step_reruns_only_the_interrupted_task_and_the_step_completes() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names = ["compute1", "compute2", "compute3", "controller1"];
    let mut f = Fleet::start(
        &url,
        &names,
        &[keystone(), nova_compute_for_the_kill()],
        PuppetKind::StandIn,
    )
    .await;
    let (nc, victim, slow) = ("nova_compute", "compute2", "wait for instances");
    f.set_task_seconds(victim, nc, Phase::Pre(2), Some(slow), 30.0);
    let rules = f.rules(
        r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "finalize": { "role": "controller" },
  "rolling_rules": { "roles": { "compute": 2 } }
}"#,
    );
    let driver = spawn(&url, &["upgrade", "v2", "--instructions-file", &rules]);
    let long = wait_for_run(&f, "compute2's long task of step 2 to run", secs(60), |r| {
        r.host == victim && r.phase == Phase::Pre(2) && r.task == slow && r.end.is_none()
    })
    .await;
    // The agent runs it: its child, found by pid.
    assert_eq!(
        parent_pid(long.pid),
        Some(f.agent_pid(victim)),
        "{long:?}\n{}",
        f.diagnostics()
    );
    // The rerun must not wait as long.
    f.clear_task_seconds(victim, nc, Phase::Pre(2), Some(slow));
    f.kill_agent(victim).await;
    f.restart_agent(victim);
    wait_for(
        "the restarted agent to stop the task its predecessor left running",
        secs(20),
        || async { !alive(long.pid) },
    )
    .await;
    let out = finish(driver, secs(90)).await;
    assert_eq!(out.status.code(), Some(0), "{}\n{}", text(&out), f.diagnostics());
    assert!(f.all_at(&names, "v2"), "{}", f.diagnostics());
    let runs = f.runs_of("v2");

    // On compute2: what had succeeded before the kill did not run again, the
    // idempotent task at most once more, the interrupted one again (to its end), and
    // the step went on to its last task and the next step.
    let n = |phase, task| count(&runs, victim, nc, phase, task);
    let d = f.diagnostics();
    assert_eq!(n(Phase::Pre(1), "RPC pin nova-compute"), 1, "{d}");
    assert!((1..=2).contains(&n(Phase::Pre(2), "disable scheduling")), "{d}");
    assert_eq!(n(Phase::Pre(2), "stop nova-compute"), 1, "{d}");
    assert_eq!(n(Phase::Pre(2), slow), 2, "{d}");
    let waits: Vec<_> = runs
        .iter()
        .filter(|r| r.host == victim && r.task == slow)
        .collect();
    assert!(
        waits[0].end.is_none(),
        "the interrupted run was stopped: {waits:#?}"
    );
    assert!(waits[1].end.is_some(), "{waits:#?}");
    assert_eq!(n(Phase::Pre(2), "record stop"), 1, "{d}");
    assert_eq!(n(Phase::Post(3), "start nova-compute"), 1, "{d}");
    // Everywhere else, every task once.
    for h in ["compute1", "compute3"] {
        for (phase, task) in [
            (Phase::Pre(1), "RPC pin nova-compute"),
            (Phase::Pre(2), "disable scheduling"),
            (Phase::Pre(2), "stop nova-compute"),
            (Phase::Pre(2), slow),
            (Phase::Pre(2), "record stop"),
            (Phase::Post(3), "start nova-compute"),
        ] {
            assert_eq!(count(&runs, h, nc, phase, task), 1, "{h} {task}\n{d}");
        }
    }
    // And the lockstep held through the kill: nobody started post-3 (or Puppet)
    // before compute2 had finished step 2.
    let v = lockstep_violations(&runs, &set(&names));
    assert!(v.is_empty(), "{v:#?}\n{d}");
    let (most, at) = max_overlap(&runs, &set(&["compute1", "compute2", "compute3"]), Phase::Pre(2));
    assert!(most <= 2, "{at:?}\n{d}");
}

// The checks themselves, on hand-made logs: each must catch what it is for.

fn line(kind: &str, host: &str, service: &str, phase: &str, pid: u32, at: f64, task: &str) -> String {
    format!("{kind} {host} {service} {phase} v2 {pid} {at} {task}\n")
}

/// A hand-made run: `(host, service, phase, pid, start, end, task)`, an end of
/// `None` leaving the run open.
type Made<'a> = (&'a str, &'a str, &'a str, u32, f64, Option<f64>, &'a str);

/// Hand-made runs as log lines, in time order.
fn log(runs: &[Made<'_>]) -> String {
    let mut lines: Vec<(f64, String)> = Vec::new();
    for &(h, s, p, pid, start, end, task) in runs {
        lines.push((start, line("start", h, s, p, pid, start, task)));
        if let Some(e) = end {
            lines.push((e, line("end", h, s, p, pid, e, task)));
        }
    }
    lines.sort_by(|a, b| a.0.total_cmp(&b.0));
    lines.into_iter().map(|(_, l)| l).collect()
}

#[test]
fn the_log_parser_pairs_ends_with_starts_and_keeps_task_names_whole() {
    let text = "start c1 nova_compute pre-1 v2 10 100.5 RPC pin nova-compute\n\
                start c1 puppet puppet v1 11 99.0 puppet\n\
                garbage line\n\
                end c1 nova_compute pre-1 v2 10 101.25 RPC pin nova-compute\n\
                start c2 nova_compute finalize v2 12 102 unpin RPC\n";
    let runs = parse_log(text);
    assert_eq!(runs.len(), 3, "{runs:#?}");
    assert_eq!(runs[0].phase, Phase::Puppet);
    assert_eq!(runs[1].task, "RPC pin nova-compute");
    assert_eq!(runs[1].end, Some(101.25));
    assert_eq!(runs[2].phase, Phase::Finalize);
    assert_eq!(runs[2].end, None);
    assert_eq!(of_version(&runs, "v2").len(), 2);
    assert!(Phase::Pre(9) < Phase::Puppet && Phase::Puppet < Phase::Post(1));
    assert!(Phase::Post(4) < Phase::Finalize && Phase::Pre(1) < Phase::Pre(2));
    assert_eq!(Phase::parse("pre-0"), None);
    assert_eq!(Phase::parse("post-3"), Some(Phase::Post(3)));
}

#[test]
fn the_lockstep_check_catches_a_step_started_before_another_host_finished() {
    let hosts = set(&["c1", "c2"]);
    let ok = parse_log(&log(&[
        ("c1", "n", "pre-1", 1, 1.0, Some(2.0), "a"),
        ("c2", "n", "pre-1", 2, 1.5, Some(3.0), "a"),
        ("c1", "n", "pre-2", 3, 3.1, Some(4.0), "b"),
        ("c2", "puppet", "puppet", 4, 4.1, Some(5.0), "puppet"),
        ("c1", "puppet", "puppet", 5, 4.2, Some(5.5), "puppet"),
        ("c2", "n", "post-3", 6, 5.6, Some(6.0), "c"),
    ]));
    assert_eq!(lockstep_violations(&ok, &hosts), Vec::<String>::new());
    // c1 starts step 2 while c2 still runs step 1.
    let early = parse_log(&log(&[
        ("c1", "n", "pre-1", 1, 1.0, Some(2.0), "a"),
        ("c2", "n", "pre-1", 2, 1.5, Some(3.0), "a"),
        ("c1", "n", "pre-2", 3, 2.5, Some(4.0), "b"),
    ]));
    let v = lockstep_violations(&early, &hosts);
    assert_eq!(v.len(), 1, "{v:#?}");
    assert!(
        v[0].contains("c1 n/pre-2") && v[0].contains("c2 n/pre-1"),
        "{v:#?}"
    );
    // Puppet starting while a post step runs elsewhere is just as wrong.
    let puppet_late = parse_log(&log(&[
        ("c1", "puppet", "puppet", 1, 1.0, Some(3.0), "puppet"),
        ("c2", "n", "post-1", 2, 2.0, Some(4.0), "c"),
    ]));
    assert_eq!(lockstep_violations(&puppet_late, &hosts).len(), 1);
    // A run that never ended blocks every later phase, unless it was run again.
    let open = parse_log(&log(&[
        ("c1", "n", "pre-1", 1, 1.0, None, "a"),
        ("c2", "n", "pre-2", 2, 5.0, Some(6.0), "b"),
    ]));
    assert_eq!(lockstep_violations(&open, &hosts).len(), 1);
    let rerun = parse_log(&log(&[
        ("c1", "n", "pre-1", 1, 1.0, None, "a"),
        ("c1", "n", "pre-1", 7, 3.0, Some(4.0), "a"),
        ("c2", "n", "pre-2", 2, 5.0, Some(6.0), "b"),
    ]));
    assert_eq!(lockstep_violations(&rerun, &hosts), Vec::<String>::new());
    // Hosts of another stage are not this stage's business.
    assert_eq!(lockstep_violations(&early, &set(&["c1"])), Vec::<String>::new());
}

#[test]
fn the_overlap_counts_hosts_in_a_phase_not_tasks() {
    let runs = parse_log(&log(&[
        ("c1", "n", "pre-1", 1, 1.0, Some(2.0), "a"),
        ("c1", "m", "pre-1", 2, 2.0, Some(3.0), "b"),
        ("c2", "n", "pre-1", 3, 2.5, Some(3.5), "a"),
        ("c3", "n", "pre-1", 4, 2.9, Some(4.0), "a"),
        ("c4", "n", "pre-2", 5, 2.9, Some(4.0), "a"),
    ]));
    let (n, at) = max_overlap(&runs, &set(&["c1", "c2", "c3", "c4"]), Phase::Pre(1));
    assert_eq!(n, 3, "{at:?}");
    let (n, _) = max_overlap(&runs, &set(&["c1", "c2"]), Phase::Pre(1));
    assert_eq!(n, 2);
}

#[test]
fn the_dependency_and_order_checks_catch_an_early_dependent() {
    // api1's nova_api step 1 starts while keystone's step 1 still runs on id2.
    let runs = parse_log(&log(&[
        ("id1", "keystone", "pre-1", 1, 1.0, Some(2.0), "k"),
        ("id2", "keystone", "pre-1", 2, 1.0, Some(4.0), "k"),
        ("api1", "nova_api", "pre-1", 3, 3.0, Some(5.0), "n"),
        ("api1", "nova_api", "post-3", 4, 6.0, Some(7.0), "n3"),
    ]));
    let v = after_violations(&runs, "nova_api", "keystone");
    assert_eq!(v.len(), 1, "{v:#?}");
    assert!(v[0].contains("api1") && v[0].contains("id2"), "{v:#?}");
    // On one host: nova_api overlapping keystone, and tasks out of file order.
    let runs = parse_log(&log(&[
        ("c1", "keystone", "pre-1", 1, 1.0, Some(2.0), "k2"),
        ("c1", "keystone", "pre-1", 2, 2.0, Some(3.0), "k1"),
        ("c1", "nova_api", "pre-1", 3, 2.5, Some(4.0), "n"),
    ]));
    let want = [("keystone", "k1"), ("keystone", "k2"), ("nova_api", "n")];
    let v = sequence_violations(&runs, "c1", Phase::Pre(1), &want);
    assert_eq!(v.len(), 2, "{v:#?}");
    let good = [("keystone", "k2"), ("keystone", "k1"), ("nova_api", "n")];
    assert_eq!(sequence_violations(&runs, "c1", Phase::Pre(1), &good).len(), 1);
}

#[test]
fn the_finalize_check_catches_a_second_run_an_early_one_and_a_wrong_host() {
    let base = [
        ("c1", "n", "pre-1", 1, 1.0, Some(2.0), "a"),
        ("c2", "puppet", "puppet", 2, 2.5, Some(5.0), "puppet"),
    ];
    let want = [("n", "unpin")];
    let mut ok = base.to_vec();
    ok.push(("c1", "n", "finalize", 3, 6.0, Some(7.0), "unpin"));
    assert_eq!(
        finalize_violations(&parse_log(&log(&ok)), "c1", &want),
        Vec::<String>::new()
    );
    let mut twice = ok.clone();
    twice.push(("c2", "n", "finalize", 4, 8.0, Some(9.0), "unpin"));
    let v = finalize_violations(&parse_log(&log(&twice)), "c1", &want);
    assert_eq!(v.len(), 2, "twice, and once on c2: {v:#?}");
    let mut early = base.to_vec();
    early.push(("c1", "n", "finalize", 3, 4.0, Some(4.5), "unpin"));
    let v = finalize_violations(&parse_log(&log(&early)), "c1", &want);
    assert_eq!(v.len(), 1, "before c2's Puppet ended: {v:#?}");
    let v = finalize_violations(&parse_log(&log(&base)), "c1", &want);
    assert_eq!(v.len(), 1, "never ran: {v:#?}");
    // Stages: the second may not start before the first ended.
    let runs = parse_log(&log(&base));
    assert_eq!(
        stage_order_violations(&runs, &set(&["c1"]), &set(&["c2"])),
        Vec::<String>::new()
    );
    assert_eq!(
        stage_order_violations(&runs, &set(&["c2"]), &set(&["c1"])).len(),
        1
    );
}
