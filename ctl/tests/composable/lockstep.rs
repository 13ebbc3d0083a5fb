//! Steps in lockstep: no host starts a step before every host taking part finished
//! the one before, services wait for those they run after, and the limits hold.

use super::*;

const CONTROLLERS: [&str; 2] = ["controller1", "controller2"];

const COMPUTES: [&str; 4] = ["compute1", "compute2", "compute3", "compute4"];

/// `roles_data` with keystone on the controllers and the seed's nova-compute on the
/// computes, one controller and two computes at a time.
const LOCKSTEP_RULES: &str = r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "finalize": { "role": "controller" },
  "rolling_rules": { "roles": { "controller": 1, "compute": 2 } }
}"#;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockstep_with_real_puppet_no_host_starts_a_step_early_and_the_limits_hold() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names: Vec<&str> = CONTROLLERS.iter().chain(COMPUTES.iter()).copied().collect();
    let f = Fleet::start(&url, &names, &[keystone(), nova_compute()], PuppetKind::Real).await;
    f.upgrade_under(&url, LOCKSTEP_RULES, 0, secs(120)).await;
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
    for phase in NOVA_PHASES {
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

/// The watch switch: a composable rollout is recorded (`--detach`, no driver) while
/// every agent is idle; compute1 is enabled first (it waits: no phase is granted),
/// then its role's grant is written by hand. The agent learns of the grant from its
/// `/steps/` watch, not from a resync (5 min): its task starts within 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_agent_sees_the_first_grant_of_a_new_composable_rollout_promptly() {
    let names = ["compute1", "controller1"];
    let (_etcd, url, f) = stand_in_fleet(&names, &[keystone(), nova_compute_short()]).await;
    let rules = f.rules(ONE_RULES);
    let out = run(
        &url,
        &["upgrade", "v2", "--instructions-file", &rules, "--detach"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let id = rollout_record(&url).await["id"].as_str().unwrap().to_string();
    let s = open(&url).await;
    tokio::time::sleep(secs(1)).await;
    s.put(&key("/config_state/enable_puppet/host/compute1"), "true", None)
        .await
        .unwrap();
    // The agent decides to wait (no grant): nothing runs.
    tokio::time::sleep(secs(2)).await;
    assert!(f.runs_of("v2").is_empty(), "{}", f.diagnostics());
    let grant = format!(
        r#"{{"rollout":"{id}","stage":"all","phase":"pre-1","services":["keystone","nova_compute"],"level":0}}"#
    );
    let at = now();
    s.put(&key("/steps/roles/compute"), &grant, None).await.unwrap();
    let r = wait_for_run(&f, "compute1's pre-1 task to start", secs(30), |r| {
        r.host == "compute1" && r.phase == Phase::Pre(1)
    })
    .await;
    let took = r.start - at;
    assert!(
        took < 2.0,
        "the task started {took:.2} s after its grant was written (the /steps/ watch did not wake the agent)\n{}",
        f.diagnostics()
    );
}
