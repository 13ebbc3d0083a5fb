//! Hosts left behind (a failed task, a failed Puppet run, a hold) refuse the later
//! phases when an operator enables them again, and stay named.

use super::*;

/// Rules for the left-behind tests: one controller, two computes, one failure
/// allowed, both computes at once.
const LEFT_RULES: &str = r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "finalize": { "role": "controller" },
  "max_failures": 1,
  "rolling_rules": { "roles": { "compute": 2 } }
}"#;

/// How often compute2 ran each step the left-behind tests check, by the task log.
struct Compute2Ran {
    /// pre-1's `RPC pin nova-compute`.
    pre_1: usize,
    /// Puppet.
    puppet: usize,
    /// post-3's `db sync`.
    post_3: usize,
}

/// Counts compute2's runs of pre-1's RPC pin, Puppet and post-3's db sync.
fn compute2_ran(runs: &[TaskRun]) -> Compute2Ran {
    let n = |service, phase, task| count(runs, "compute2", service, phase, task);
    Compute2Ran {
        pre_1: n("nova_compute", Phase::Pre(1), "RPC pin nova-compute"),
        puppet: n("puppet", Phase::Puppet, "puppet"),
        post_3: n("nova_compute", Phase::Post(3), "db sync"),
    }
}

/// compute2 is left behind after failing in `failed_in`; while compute1's post-3
/// runs long (the post-3 grant stands), the operator enables compute2 again. Returns
/// the driver's output and the v2 runs.
async fn enable_a_left_behind_host(f: &Fleet, url: &str, release: bool, code: i32) -> (String, Vec<TaskRun>) {
    f.set_task_seconds("compute1", "nova_compute", Phase::Post(3), None, 12.0);
    let driver = f.spawn_upgrade(url, LEFT_RULES);
    wait_v2_phase(f, "compute1", Phase::Post(3)).await;
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
    let names = ["compute1", "compute2", "controller1"];
    let (_etcd, url, f) = stand_in_fleet(&names, &[keystone(), nova_compute_short()]).await;
    f.fail("compute2", "nova_compute", Phase::Pre(1));
    let (out, runs) = enable_a_left_behind_host(&f, &url, false, 1).await;
    assert!(out.contains("compute2"), "{out}");
    let d = f.diagnostics();
    let ran = compute2_ran(&runs);
    assert_eq!(ran.pre_1, 1, "{d}");
    assert_eq!(ran.puppet, 0, "{d}");
    assert_eq!(ran.post_3, 0, "{d}");
    assert!(f.all_at(&["compute2"], "v1"), "{d}");
    assert!(f.all_at(&["compute1", "controller1"], "v2"), "{d}");
}

/// The same with a failed Puppet run (its validation fails): compute2 never reached
/// the version, so its post-3 tasks (db sync, start the service) must not run on it
/// when an operator enables it again while post-3 is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_puppet_failed_refuses_the_post_phase_even_when_enabled() {
    let names = ["compute1", "compute2", "controller1"];
    let (_etcd, url, f) = stand_in_fleet(&names, &[keystone(), nova_compute_short()]).await;
    f.hosts[f.index("compute2")].set_validation(false);
    let (out, runs) = enable_a_left_behind_host(&f, &url, false, 1).await;
    assert!(out.contains("compute2"), "{out}");
    let d = f.diagnostics();
    let ran = compute2_ran(&runs);
    assert_eq!(ran.puppet, 1, "{d}");
    assert_eq!(
        ran.post_3, 0,
        "compute2 failed its Puppet phase, yet ran post-3's db sync\n{d}"
    );
}

/// A host held before the rollout is left behind in pre-1 (held while it went on);
/// released and enabled by an operator while post-3 is granted, it must not run
/// post-3's tasks: it ran neither its pre step nor Puppet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_left_behind_while_held_refuses_the_post_phase_when_released_and_enabled() {
    let names = ["compute1", "compute2", "controller1"];
    let (_etcd, url, f) = stand_in_fleet(&names, &[keystone(), nova_compute_short()]).await;
    let out = run(&url, &["hold", "compute2", "--reason", "disk swap"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let (_, runs) = enable_a_left_behind_host(&f, &url, true, 0).await;
    let d = f.diagnostics();
    let ran = compute2_ran(&runs);
    assert_eq!(ran.pre_1, 0, "{d}");
    assert_eq!(ran.puppet, 0, "{d}");
    assert_eq!(
        ran.post_3, 0,
        "compute2 skipped pre-1 and Puppet, yet ran post-3's db sync\n{d}"
    );
}

/// After a composable rollout ended `failed` on a task, `jioctl get-failures` (the
/// operators' check: exit 1 when hosts failed) still names the failed host, as it
/// does after a plain rollout failed in Puppet (its entries stay with the version).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_failures_still_names_a_host_whose_task_failed_after_the_rollout_ended() {
    let names = ["compute1", "controller1"];
    let (_etcd, url, f) = stand_in_fleet(&names, &[keystone(), nova_compute_short()]).await;
    f.fail("compute1", "nova_compute", Phase::Pre(1));
    let out = f.upgrade_under(&url, FINALIZE_RULES, 1, secs(40)).await;
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
