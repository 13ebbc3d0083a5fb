//! The finalize step: run once, on the first healthy host of its role, and again
//! there (nowhere else) after a kill; a failed or held finalize host.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_finalize_task_fails_the_rollout_naming_the_host_and_the_task() {
    let names = ["compute1", "compute2", "controller1", "controller2"];
    let (_etcd, url, f) = stand_in_fleet(&names, &[keystone(), nova_compute()]).await;
    f.fail("controller1", "nova_compute", Phase::Finalize);
    let out = f.upgrade_under(&url, TWO_COMPUTES_RULES, 1, secs(90)).await;
    assert!(out.contains("controller1"), "{out}");
    let runs = f.runs_of("v2");
    // Every host was upgraded; only the deployment-wide step failed.
    assert!(f.all_at(&names, "v2"), "{}", f.diagnostics());
    // It ran once (not again elsewhere), after everything else had ended.
    let v = finalize_violations(&runs, "controller1", &[("nova_compute", "unpin RPC")]);
    assert!(v.is_empty(), "{v:#?}\n{}", f.diagnostics());
    assert_rollout_failed_naming(
        &url,
        &["controller1", "unpin RPC"],
        "the failed record names the host and the task",
    )
    .await;
}

// ---------------------------------------------------------------------------
// Finalize
// ---------------------------------------------------------------------------

/// `finalize.role` names a role whose only host failed its pre-1 task (within
/// max_failures): no host of that role can ever run the finalize tasks (a host left
/// behind never gets a later phase), so the rollout must end (failed, naming the
/// host and why finalize did not run) rather than wait for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finalize_role_whose_only_host_failed_ends_the_rollout() {
    let names = ["compute1", "compute2", "controller1"];
    let (_etcd, url, f) = stand_in_fleet(&names, &[keystone(), nova_compute_fin()]).await;
    f.fail("controller1", "keystone", Phase::Pre(1));
    let driver = f.spawn_upgrade(
        &url,
        r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "finalize": { "role": "controller" },
  "max_failures": 1,
  "rolling_rules": { "roles": { "compute": 2 } }
}"#,
    );
    let out = ends_within(&f, &url, driver, secs(45)).await;
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}\n{}", f.diagnostics());
    assert!(t.contains("controller1"), "{t}");
    let runs = f.runs_of("v2");
    assert!(
        runs.iter().all(|r| r.phase != Phase::Finalize),
        "finalize ran somewhere: {runs:#?}"
    );
    let r = rollout_record(&url).await;
    assert_eq!(r["state"], "failed", "{r:#}");
}

/// The finalize host's agent is killed (`kill -9`) in the middle of its finalize
/// task and stays down past its lease: the finalize step is not given to another
/// host while it is down (it ran there once already), `jioctl status` and `explain`
/// keep answering, and once the agent is back the interrupted task runs again on the
/// same host and the rollout ends done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_finalize_host_killed_mid_finalize_resumes_there_and_nowhere_else() {
    let names = ["compute1", "controller1", "controller2"];
    let (_etcd, url, mut f) = stand_in_fleet(&names, &[keystone(), nova_compute_fin()]).await;
    f.set_task_seconds("controller1", "nova_compute", Phase::Finalize, None, 30.0);
    let driver = f.spawn_upgrade(&url, FINALIZE_RULES);
    let fin = wait_v2_phase(&f, "controller1", Phase::Finalize).await;
    // explain during the finalize phase answers and names it.
    let out = run(&url, &["explain", "controller1"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    f.clear_task_seconds("controller1", "nova_compute", Phase::Finalize, None);
    f.kill_agent("controller1").await;
    // Past the lease (3 s): its liveness record is gone.
    let s = open(&url).await;
    wait_for("controller1's liveness record to expire", secs(15), || async {
        !keys_under(&s, "/agents/")
            .await
            .contains_key("/agents/controller1")
    })
    .await;
    tokio::time::sleep(secs(3)).await;
    let runs = f.runs_of("v2");
    let elsewhere: Vec<&TaskRun> = runs
        .iter()
        .filter(|r| r.phase == Phase::Finalize && r.host != "controller1")
        .collect();
    assert!(
        elsewhere.is_empty(),
        "finalize given to another host while controller1 was down: {elsewhere:#?}"
    );
    // Shown and explained; `status` exits 1: a host without a live agent.
    for (args, code) in [
        (vec!["status"], 1),
        (vec!["explain", "controller1"], 0),
        (vec!["--json", "status"], 1),
    ] {
        let out = run(&url, &args).await;
        assert_eq!(out.status.code(), Some(code), "jioctl {args:?}: {}", text(&out));
    }
    f.restart_agent("controller1");
    wait_for(
        "the restarted agent to stop the finalize task its predecessor left",
        secs(20),
        || async { !alive(fin.pid) },
    )
    .await;
    let out = ends_within(&f, &url, driver, secs(40)).await;
    f.assert_exit(&out, 0);
    let runs = f.runs_of("v2");
    let fins: Vec<&TaskRun> = runs.iter().filter(|r| r.phase == Phase::Finalize).collect();
    assert_eq!(fins.len(), 2, "the interrupted run and its rerun: {fins:#?}");
    assert!(fins.iter().all(|r| r.host == "controller1"), "{fins:#?}");
    assert!(fins[0].end.is_none() && fins[1].end.is_some(), "{fins:#?}");
    assert_eq!(rollout_record(&url).await["state"], "done");
}

/// The first controller is held after it finished every phase but before the
/// finalize step: finalize runs once, on the next healthy controller, and the rollout
/// ends done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finalize_host_held_before_finalize_gives_way_to_the_next_healthy_one() {
    let names = ["compute1", "controller1", "controller2"];
    let (_etcd, url, f) = stand_in_fleet(&names, &[keystone(), nova_compute()]).await;
    // post-4 is nova_compute's alone: the controllers are done by then.
    f.set_task_seconds("compute1", "nova_compute", Phase::Post(4), None, 5.0);
    let driver = f.spawn_upgrade(&url, FINALIZE_RULES);
    wait_v2_phase(&f, "compute1", Phase::Post(4)).await;
    let out = run(&url, &["hold", "controller1", "--reason", "review"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = ends_within(&f, &url, driver, secs(40)).await;
    f.assert_exit(&out, 0);
    let runs = f.runs_of("v2");
    let v = finalize_violations(&runs, "controller2", &[("nova_compute", "unpin RPC")]);
    assert!(v.is_empty(), "{v:#?}\n{}", f.diagnostics());
}
