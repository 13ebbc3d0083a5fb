//! Operators' moves in the middle of a phase: pause, emergency stop, re-targeting,
//! abort and the same rules again, undo.

use super::*;

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
    let names = ["compute1", "compute2", "compute3", "controller1"];
    let (_etcd, url, f) = stand_in_fleet(&names, &[keystone(), nova_compute()]).await;
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
    f.assert_exit(&out, 0);
    let runs = f.runs_of("v2");
    assert!(f.all_at(&names, "v2"), "{}", f.diagnostics());
    let v = lockstep_violations(&runs, &set(&names));
    assert!(v.is_empty(), "{v:#?}\n{}", f.diagnostics());
    assert_one_compute_at_a_time(&runs, &f);
}

/// The emergency stop in the middle of pre-1: the driver stops (6), the host in
/// flight finishes, and nothing starts afterwards, neither a task nor Puppet (the
/// grants go with the rollout, the enable keys with the stop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emergency_stop_mid_phase_starts_nothing_afterwards() {
    let names = ["compute1", "compute2", "compute3", "controller1"];
    let (_etcd, url, f) = stand_in_fleet(&names, &[keystone(), nova_compute()]).await;
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
    let names = ["compute1", "compute2", "compute3", "controller1"];
    let (_etcd, url, f) = stand_in_fleet(&names, &[keystone(), nova_compute()]).await;
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
    f.assert_exit(&out, 0);
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

/// `rollout abort` of a composable rollout after its first stage, then `upgrade`
/// with the same rules: a new rollout, which runs the steps again (what a task did
/// is remembered per rollout) but not the Puppet run of hosts already at the
/// version, and its grants name it (the aborted one's are gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_then_the_same_rules_is_a_new_rollout_that_runs_the_steps_again() {
    let names = ["compute1", "controller1"];
    let (_etcd, url, f) = stand_in_fleet(&names, &[keystone(), nova_compute_short()]).await;
    let rules = f.rules(STAGED);
    f.upgrade_stage(&url, &rules, "controlplane", secs(60)).await;
    let first = rollout_record(&url).await["id"].as_str().unwrap().to_string();
    let out = run(&url, &["rollout", "abort", "--reason", "review"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let s = open(&url).await;
    assert!(
        keys_under(&s, "/steps/").await.is_empty(),
        "grants outlived the abort"
    );
    f.upgrade(&url, &["v2", "--instructions-file", &rules], 0, secs(60))
        .await;
    let r = rollout_record(&url).await;
    assert_ne!(r["id"].as_str().unwrap(), first, "{r:#}");
    assert_eq!(r["state"], "done", "{r:#}");
    let runs = f.runs_of("v2");
    let d = f.diagnostics();
    assert_eq!(
        count(&runs, "controller1", "keystone", Phase::Pre(1), "stop keystone"),
        2,
        "{d}"
    );
    assert_eq!(
        count(&runs, "controller1", "puppet", Phase::Puppet, "puppet"),
        1,
        "{d}"
    );
    assert_eq!(
        count(&runs, "compute1", "puppet", Phase::Puppet, "puppet"),
        1,
        "{d}"
    );
    assert_eq!(rpc_pins(&runs, "compute1"), 1, "{d}");
    assert!(keys_under(&s, "/steps/").await.is_empty());
}

/// `rollout undo` of a staged composable rollout whose first stage is done: the
/// rollout back to v1 (same rules, every stage) is driven to done by `upgrade v1`
/// with those rules; the control plane is back at v1 and the computes, never
/// upgraded, stay at v1 without a Puppet run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_of_a_staged_composable_rollout_goes_back() {
    let names = ["compute1", "controller1"];
    let (_etcd, url, f) = stand_in_fleet(&names, &[keystone(), nova_compute_short()]).await;
    let rules = f.rules(STAGED);
    f.upgrade_stage(&url, &rules, "controlplane", secs(60)).await;
    let before = f.runs().len();
    // `rollout undo` starts the rollout back and follows it to its end.
    let undo = spawn(&url, &["rollout", "undo"]);
    let out = ends_within(&f, &url, undo, secs(60)).await;
    let d = format!("--- undo\n{}\n{}", text(&out), f.diagnostics());
    assert_eq!(out.status.code(), Some(0), "{d}");
    let r = rollout_record(&url).await;
    assert_eq!(r["version"], "v1", "{r:#}");
    assert_eq!(r["state"], "done", "{r:#}");
    assert!(f.all_at(&names, "v1"), "{d}");
    let back: Vec<TaskRun> = f.runs()[before..].to_vec();
    let puppets = |h: &str| {
        back.iter()
            .filter(|r| r.host == h && r.phase == Phase::Puppet)
            .count()
    };
    assert_eq!(puppets("controller1"), 1, "{back:#?}\n{d}");
    assert_eq!(puppets("compute1"), 0, "{back:#?}\n{d}");
    // The control plane went back through its steps in lockstep (the computes, at
    // v1 throughout, ran their steps again too: a new rollout runs every step).
    assert!(
        lockstep_violations(&back, &set(&["controller1"])).is_empty(),
        "{d}"
    );
    let s = open(&url).await;
    assert!(keys_under(&s, "/steps/").await.is_empty());
}
