//! Stages: one rollout upgrades them in order, `--stage` continues or grows it,
//! its misuse is refused with nothing written, and a held host holds its stage.

use super::*;

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

const TWO_STAGES_RULES: &str = r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "stages": { "controlplane": ["controller"], "compute": ["compute"] },
  "finalize": { "role": "controller" }
}"#;

// ---------------------------------------------------------------------------
// Stages
// ---------------------------------------------------------------------------

const THREE_STAGES: &str = r#"{
  "roles_data": { "controller": ["keystone"], "stmon": ["ceph_mon"], "compute": ["nova_compute"] },
  "stages": { "controlplane": ["controller"], "storage": ["stmon"], "compute": ["compute"] },
  "finalize": { "role": "controller" },
  "rolling_rules": { "roles": { "compute": 2, "stmon": 2 } }
}"#;

fn ceph_mon() -> Service {
    Service::new(
        "ceph_mon",
        vec![Task::pre(1, "ceph health"), Task::post(3, "restart ceph-mon")],
    )
}

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

    f.upgrade_stage(&url, &rules, "controlplane", secs(90)).await;
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
    let st = text(&run(&url, &["status", "--hosts"]).await);
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

    f.upgrade_stage(&url, &rules, "compute", secs(90)).await;
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
    for phase in NOVA_PHASES {
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

/// `--stage` misuse: an unknown stage, `--stage` with rules that are not composable,
/// and a later stage before an earlier one: each a clear error, and nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stage_misuse_is_a_clear_error_and_writes_nothing() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    register(&url, &[("controller1", "controller"), ("compute1", "compute")]).await;
    let dir = tempfile::tempdir().unwrap();
    let staged = dir.path().join("staged.json");
    std::fs::write(&staged, TWO_STAGES_RULES).unwrap();
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
    std::fs::write(&rules, TWO_STAGES_RULES).unwrap();
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

/// Three stages, one host of the second held before the rollout: the stages run in
/// order, the held host is left behind (it runs nothing and stays at v1) and the
/// third stage goes on; the rollout ends done, saying who was held back. `status
/// --json` gives every stage's shape (`done`, `left_behind` naming the held host) and
/// `rollout status --json` the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_stages_with_a_host_held_in_the_second() {
    let names = ["compute1", "compute2", "controller1", "stmon1", "stmon2"];
    let (_etcd, url, f) = stand_in_fleet(&names, &[keystone(), ceph_mon(), nova_compute_short()]).await;
    let out = run(&url, &["hold", "stmon2", "--reason", "disk swap"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let rules = f.rules(THREE_STAGES);
    let mut driver = spawn(&url, &["upgrade", "v2", "--instructions-file", &rules]);
    // `status --json` while it runs: every stage's shape in every state seen.
    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut storage_left: Option<serde_json::Value> = None;
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(st) = driver.try_wait().unwrap() {
            break st;
        }
        assert!(
            started.elapsed() < secs(90),
            "the rollout did not end\n{}",
            f.diagnostics()
        );
        let st = json(&url, &["status"]).await;
        if let Some(stages) = st["stages"].as_array() {
            let names: Vec<&str> = stages.iter().map(|s| s["name"].as_str().unwrap_or("?")).collect();
            assert_eq!(names, vec!["controlplane", "storage", "compute"], "{st:#}");
            for s in stages {
                for field in ["name", "roles", "state", "phases", "hosts"] {
                    assert!(!s[field].is_null(), "stage without {field}: {s:#}");
                }
                assert!(
                    s["roles"].is_array() && s["phases"].is_array() && s["hosts"].is_u64(),
                    "{s:#}"
                );
                let state = s["state"].as_str().unwrap().to_string();
                assert!(
                    ["not_started", "waiting", "blocked", "running", "done"].contains(&state.as_str()),
                    "{s:#}"
                );
                if state == "running" {
                    for field in ["phase", "taking_part", "finished"] {
                        assert!(!s[field].is_null(), "a running stage without {field}: {s:#}");
                    }
                }
                if s["name"] == "storage" && !s["left_behind"].is_null() {
                    storage_left = Some(s["left_behind"].clone());
                }
                seen.entry(s["name"].as_str().unwrap().to_string())
                    .or_default()
                    .insert(state);
            }
            assert!(st["finalize"]["state"].is_string(), "{st:#}");
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    };
    assert_eq!(status.code(), Some(0), "{}", f.diagnostics());
    let out = {
        let mut o = String::new();
        use tokio::io::AsyncReadExt as _;
        if let Some(mut e) = driver.stderr.take() {
            let _ = e.read_to_string(&mut o).await;
        }
        if let Some(mut e) = driver.stdout.take() {
            let _ = e.read_to_string(&mut o).await;
        }
        o
    };
    let runs = f.runs_of("v2");
    let d = f.diagnostics();
    assert!(
        f.all_at(&["compute1", "compute2", "controller1", "stmon1"], "v2"),
        "{d}"
    );
    assert!(f.all_at(&["stmon2"], "v1"), "{d}");
    assert!(runs.iter().all(|r| r.host != "stmon2"), "the held host ran: {d}");
    for (a, b) in [
        (set(&["controller1"]), set(&["stmon1", "stmon2"])),
        (set(&["stmon1", "stmon2"]), set(&["compute1", "compute2"])),
    ] {
        let v = stage_order_violations(&runs, &a, &b);
        assert!(v.is_empty(), "{v:#?}\n{d}");
    }
    assert!(out.contains("stmon2"), "the end names the held host: {out}");
    assert!(
        seen.get("compute")
            .is_some_and(|s| s.contains("waiting") && s.contains("running")),
        "{seen:?}"
    );
    assert!(
        storage_left.as_ref().is_some_and(|l| l["stmon2"].is_string()),
        "the held host shows as left behind in its stage: {storage_left:?}"
    );
    let r = rollout_record(&url).await;
    assert_eq!(r["state"], "done", "{r:#}");
}

/// `upgrade --stage compute` while the control plane stage still runs: the same
/// rollout grows; the compute stage waits for the control plane to be done (no
/// compute task starts before every control-plane run ended), both commands end 0,
/// and the rollout ends done. The waiting stage shows as `waiting` meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_stage_started_while_the_first_runs_waits_for_it() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let plane = ["controller1", "controller2"];
    let computes = ["compute1", "compute2"];
    let names = ["compute1", "compute2", "controller1", "controller2"];
    let f = Fleet::start(
        &url,
        &names,
        &[keystone(), nova_compute_short()],
        PuppetKind::StandIn,
    )
    .await;
    f.set_task_seconds("controller2", "keystone", Phase::Pre(1), None, 4.0);
    let rules = f.rules(STAGED);
    let first = spawn_stage(&url, &rules, "controlplane");
    wait_v2_phase(&f, "controller2", Phase::Pre(1)).await;
    let id = rollout_record(&url).await["id"].clone();
    let second = spawn_stage(&url, &rules, "compute");
    wait_for("the record to list both stages", secs(20), || async {
        rollout_record(&url).await["stages"] != serde_json::json!(["controlplane"])
    })
    .await;
    let r = rollout_record(&url).await;
    assert_eq!(r["id"], id, "the same rollout: {r:#}");
    let states = stage_states(&url).await;
    assert_eq!(
        states.get("compute").map(|s| s.0.as_str()),
        Some("waiting"),
        "{states:?}"
    );
    let a = ends_within(&f, &url, first, secs(60)).await;
    let b = ends_within(&f, &url, second, secs(60)).await;
    f.assert_exit(&a, 0);
    f.assert_exit(&b, 0);
    let runs = f.runs_of("v2");
    let d = f.diagnostics();
    assert!(f.all_at(&names, "v2"), "{d}");
    let v = stage_order_violations(&runs, &set(&plane), &set(&computes));
    assert!(v.is_empty(), "{v:#?}\n{d}");
    assert_eq!(rollout_record(&url).await["state"], "done");
}

/// A `jioctl drive` service drives a staged rollout started `--detach`; a following
/// `jioctl upgrade --stage controlplane` ends 0 once the stage is done and says which
/// stage is left; `--stage compute` then continues the same rollout, which the
/// service drives to done. The service keeps running (and waiting) between stages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drive_service_and_a_following_upgrade_stage() {
    let names = ["compute1", "controller1"];
    let (_etcd, url, f) = stand_in_fleet(&names, &[keystone(), nova_compute_short()]).await;
    let mut service = spawn(&url, &["drive"]);
    let rules = f.rules(STAGED);
    let follower = spawn_stage(&url, &rules, "controlplane");
    let out = ends_within(&f, &url, follower, secs(40)).await;
    f.assert_exit(&out, 0);
    let out = text(&out);
    assert!(
        out.contains("not started: compute") && out.contains("--stage compute"),
        "the follower says which stage is left: {out}"
    );
    assert!(
        f.all_at(&["controller1"], "v2") && f.all_at(&["compute1"], "v1"),
        "{}",
        f.diagnostics()
    );
    assert!(
        service.try_wait().unwrap().is_none(),
        "the drive service ended between stages"
    );
    let id = rollout_record(&url).await["id"].clone();
    let rs = json(&url, &["rollout", "status"]).await;
    assert!(rs.is_object(), "{rs:#}");
    f.upgrade_stage(&url, &rules, "compute", secs(60)).await;
    let r = rollout_record(&url).await;
    assert_eq!(r["id"], id, "{r:#}");
    assert_eq!(r["state"], "done", "{r:#}");
    assert!(f.all_at(&names, "v2"), "{}", f.diagnostics());
    assert!(service.try_wait().unwrap().is_none(), "the drive service ended");
    let _ = service.start_kill();
}
