//! Faults mid-step: `kill -9` and SIGTERM of agents, a driver killed or racing
//! another, a task past its timeout, a store that cannot be reached, garbage in the
//! grants and catalogs. Each task runs once (the interrupted one again), in order.

use super::*;

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

/// A TCP proxy between one agent and etcd that can be cut (every connection closed,
/// new ones refused) and restored.
struct Proxy {
    port: u16,
    on: Arc<AtomicBool>,
    conns: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(to: u16) -> Proxy {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let on = Arc::new(AtomicBool::new(true));
        let conns: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let (on2, conns2) = (on.clone(), conns.clone());
        let accept = tokio::spawn(async move {
            loop {
                let Ok((mut a, _)) = l.accept().await else {
                    continue;
                };
                if !on2.load(Ordering::SeqCst) {
                    drop(a);
                    continue;
                }
                let h = tokio::spawn(async move {
                    if let Ok(mut b) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await {
                        let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
                    }
                });
                conns2.lock().unwrap().push(h.abort_handle());
            }
        });
        Proxy {
            port,
            on,
            conns,
            accept,
        }
    }

    fn cut(&self) {
        self.on.store(false, Ordering::SeqCst);
        for h in self.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }

    fn restore(&self) {
        self.on.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// Points the host's agent at `url` (its configuration's `store`) and restarts it.
async fn repoint(f: &mut Fleet, host: &str, url: &str) {
    let cfg = f.hosts[f.index(host)].config();
    let text = std::fs::read_to_string(&cfg).unwrap();
    let text: String = text
        .lines()
        .map(|l| {
            if l.starts_with("store = ") {
                format!("store = {}", jio_tests::host::toml_str(url))
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&cfg, text + "\n").unwrap();
    f.kill_agent(host).await;
    f.restart_agent(host);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_step_reruns_only_the_interrupted_task_and_the_step_completes() {
    let names = ["compute1", "compute2", "compute3", "controller1"];
    let (_etcd, url, mut f) = stand_in_fleet(&names, &[keystone(), nova_compute_for_the_kill()]).await;
    let (nc, victim, slow) = ("nova_compute", "compute2", "wait for instances");
    f.set_task_seconds(victim, nc, Phase::Pre(2), Some(slow), 30.0);
    let driver = f.spawn_upgrade(&url, TWO_COMPUTES_RULES);
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
    f.assert_exit(&out, 0);
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

/// Two services of one host at the same step and level run in name order (glance,
/// then keystone). The agent is killed (`kill -9`) after glance's step was reported,
/// while keystone's task runs. Started again, it does not run glance's task again,
/// runs keystone's interrupted task again (after glance's), and the rollout ends
/// done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_between_two_services_of_a_step_keeps_the_order_and_runs_the_first_once() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names = ["compute1", "controller1"];
    let glance = Service::new(
        "glance",
        vec![Task::pre(1, "stop glance"), Task::post(3, "glance db sync")],
    );
    let mut f = Fleet::start(
        &url,
        &names,
        &[keystone(), glance, nova_compute_short()],
        PuppetKind::StandIn,
    )
    .await;
    f.set_task_seconds("controller1", "keystone", Phase::Pre(1), None, 30.0);
    let driver = f.spawn_upgrade(
        &url,
        r#"{
  "roles_data": { "controller": ["keystone", "glance"], "compute": ["nova_compute"] },
  "finalize": { "role": "controller" }
}"#,
    );
    let long = wait_for_run(&f, "controller1's keystone pre-1 to start", secs(60), |r| {
        r.host == "controller1" && r.service == "keystone" && r.phase == Phase::Pre(1)
    })
    .await;
    // glance's step is in the store before keystone's task starts.
    let s = open(&url).await;
    let id = rollout_record(&url).await["id"].as_str().unwrap().to_string();
    let st = keys_under(&s, "/status/steps/").await;
    assert!(
        st.contains_key(&format!("/status/steps/{id}/pre-1/glance/success/controller1")),
        "{st:?}"
    );
    f.clear_task_seconds("controller1", "keystone", Phase::Pre(1), None);
    f.kill_agent("controller1").await;
    f.restart_agent("controller1");
    wait_for("the orphaned keystone task to be stopped", secs(20), || async {
        !alive(long.pid)
    })
    .await;
    let out = ends_within(&f, &url, driver, secs(50)).await;
    f.assert_exit(&out, 0);
    let runs = f.runs_of("v2");
    let d = f.diagnostics();
    assert_eq!(
        count(&runs, "controller1", "glance", Phase::Pre(1), "stop glance"),
        1,
        "{d}"
    );
    assert_eq!(
        count(&runs, "controller1", "keystone", Phase::Pre(1), "stop keystone"),
        2,
        "{d}"
    );
    let gl = runs
        .iter()
        .find(|r| r.host == "controller1" && r.service == "glance" && r.phase == Phase::Pre(1))
        .unwrap();
    for k in runs
        .iter()
        .filter(|r| r.host == "controller1" && r.service == "keystone" && r.phase == Phase::Pre(1))
    {
        assert!(
            gl.end.is_some_and(|e| e <= k.start),
            "keystone before glance ended: {d}"
        );
    }
    assert!(lockstep_violations(&runs, &set(&names)).is_empty(), "{d}");
}

/// SIGTERM of an agent in the middle of a task (limit: one compute): the agent stops
/// the task and exits; its run marker stays (the host keeps its slot): no other
/// compute starts anything while it is down. Started again, it runs the interrupted
/// task again and the rollout ends done, one compute at a time, each other task once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_task_keeps_the_slot_and_the_step_resumes() {
    let names = ["compute1", "compute2", "controller1"];
    let (_etcd, url, mut f) = stand_in_fleet(&names, &[keystone(), nova_compute_short()]).await;
    // A short stop_grace: the task is stopped soon after the SIGTERM.
    let cfg = f.hosts[f.index("compute1")].config();
    let mut c = std::fs::read_to_string(&cfg).unwrap();
    c.push_str("stop_grace = \"1s\"\n");
    std::fs::write(&cfg, c).unwrap();
    f.kill_agent("compute1").await;
    f.restart_agent("compute1");
    f.set_task_seconds("compute1", "nova_compute", Phase::Pre(1), None, 30.0);
    let driver = f.spawn_upgrade(&url, ONE_RULES);
    let long = wait_v2_phase(&f, "compute1", Phase::Pre(1)).await;
    f.clear_task_seconds("compute1", "nova_compute", Phase::Pre(1), None);
    let pid = f.agent_pid("compute1");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let i = f.index("compute1");
    let mut child = f.daemons[i].take().unwrap();
    let status = tokio::time::timeout(secs(30), child.wait())
        .await
        .unwrap_or_else(|_| panic!("the agent did not stop on SIGTERM\n{}", f.diagnostics()))
        .unwrap();
    let stopped_at = now();
    assert!(!alive(long.pid), "the task outlived its agent's SIGTERM");
    // The daemon (`run`) ends 0 after a graceful stop, as after a plain run (exit 5
    // is `once`'s).
    assert_eq!(status.code(), Some(0), "{status:?}\n{}", f.diagnostics());
    let s = open(&url).await;
    assert!(
        keys_under(&s, "/runs/").await.contains_key("/runs/compute1"),
        "the run marker went with the stopped agent: its host lost its slot mid-step\n{}",
        f.diagnostics()
    );
    tokio::time::sleep(secs(5)).await;
    let late: Vec<TaskRun> = f
        .runs_of("v2")
        .into_iter()
        .filter(|r| r.start > stopped_at && r.host.starts_with("compute"))
        .collect();
    assert!(
        late.is_empty(),
        "a compute started while compute1's step was interrupted: {late:#?}\n{}",
        f.diagnostics()
    );
    f.restart_agent("compute1");
    let out = ends_within(&f, &url, driver, secs(50)).await;
    f.assert_exit(&out, 0);
    let runs = f.runs_of("v2");
    let d = f.diagnostics();
    assert_eq!(rpc_pins(&runs, "compute1"), 2, "{d}");
    for (h, phase, task) in [
        ("compute2", Phase::Pre(1), "RPC pin nova-compute"),
        ("compute1", Phase::Post(3), "db sync"),
        ("compute2", Phase::Post(3), "db sync"),
    ] {
        assert_eq!(count(&runs, h, "nova_compute", phase, task), 1, "{h} {task}\n{d}");
    }
    let computes = set(&["compute1", "compute2"]);
    for phase in [Phase::Pre(1), Phase::Puppet, Phase::Post(3)] {
        let (n, at) = max_overlap(&runs, &computes, phase);
        assert!(n <= 1, "{phase}: {at:?}\n{d}");
    }
    assert!(lockstep_violations(&runs, &set(&names)).is_empty(), "{d}");
}

/// The store becomes unreachable for compute1's agent (alone) while its pre-1 task
/// runs, and stays so after the task ended (limit: one compute): the report waits in
/// its journal, the host keeps its slot (its run marker stays) and no other compute
/// is admitted in its place. When the store is back, the report lands, the task is
/// not run again, and the rollout ends done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_ends_while_the_store_is_unreachable_keeps_its_slot() {
    let names = ["compute1", "compute2", "controller1"];
    let (etcd, url, mut f) = stand_in_fleet(&names, &[keystone(), nova_compute_short()]).await;
    let proxy = Proxy::start(etcd.port(0)).await;
    repoint(&mut f, "compute1", &format!("etcd://127.0.0.1:{}", proxy.port)).await;
    let s = open(&url).await;
    wait_for("compute1's agent to be back", secs(20), || async {
        keys_under(&s, "/agents/").await.contains_key("/agents/compute1")
    })
    .await;
    f.set_task_seconds("compute1", "nova_compute", Phase::Pre(1), None, 3.0);
    let driver = f.spawn_upgrade(&url, ONE_RULES);
    wait_v2_phase(&f, "compute1", Phase::Pre(1)).await;
    proxy.cut();
    let cut_at = now();
    wait_for_run(&f, "compute1's pre-1 to end", secs(20), |r| {
        r.host == "compute1" && r.phase == Phase::Pre(1) && r.end.is_some()
    })
    .await;
    // Past the agent's lease, and a few of the driver's passes.
    tokio::time::sleep(secs(8)).await;
    let late: Vec<TaskRun> = f
        .runs_of("v2")
        .into_iter()
        .filter(|r| r.start > cut_at && r.host.starts_with("compute"))
        .collect();
    assert!(
        late.is_empty(),
        "started while compute1's report waited in its journal: {late:#?}\n{}",
        f.diagnostics()
    );
    assert!(
        keys_under(&s, "/runs/").await.contains_key("/runs/compute1"),
        "compute1's run marker is gone while its report is not in the store"
    );
    let st = text(&run(&url, &["status"]).await);
    proxy.restore();
    let out = ends_within(&f, &url, driver, secs(50)).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n--- status while cut\n{st}\n{}",
        text(&out),
        f.diagnostics()
    );
    let runs = f.runs_of("v2");
    let d = f.diagnostics();
    for h in ["compute1", "compute2"] {
        assert_eq!(rpc_pins(&runs, h), 1, "{h}\n{d}");
        assert_eq!(
            count(&runs, h, "nova_compute", Phase::Post(3), "db sync"),
            1,
            "{h}\n{d}"
        );
    }
    let (n, at) = max_overlap(&runs, &set(&["compute1", "compute2"]), Phase::Pre(1));
    assert!(n <= 1, "{at:?}\n{d}");
}

/// `kill -9` of the driver in the middle of pre-1; a second `upgrade` takes the
/// lock over and finishes the rollout: each task once, lockstep and the limit hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_killed_mid_phase_is_taken_over_and_nothing_runs_twice() {
    let names = ["compute1", "compute2", "compute3", "controller1"];
    let (_etcd, url, f) = stand_in_fleet(&names, &[keystone(), nova_compute()]).await;
    let mut first = mid_pre_1(&f, &url, 3.0).await;
    first.start_kill().unwrap();
    first.wait().await.unwrap();
    f.upgrade_under(&url, ONE_RULES, 0, secs(60)).await;
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
    assert_one_compute_at_a_time(&runs, &f);
}

// ---------------------------------------------------------------------------
// Drivers
// ---------------------------------------------------------------------------

/// Two `jioctl upgrade` of the same version and rules started together (one drives,
/// the other follows): both end 0, each task ran once, in lockstep, within the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_drivers_racing_on_the_grants_run_each_task_once() {
    let names = ["compute1", "compute2", "compute3", "controller1"];
    let (_etcd, url, f) = stand_in_fleet(&names, &[keystone(), nova_compute()]).await;
    let rules = f.rules(ONE_RULES);
    let a = spawn(&url, &["upgrade", "v2", "--instructions-file", &rules]);
    let b = spawn(&url, &["upgrade", "v2", "--instructions-file", &rules]);
    let a = ends_within(&f, &url, a, secs(90)).await;
    let b = ends_within(&f, &url, b, secs(30)).await;
    f.assert_exit(&a, 0);
    f.assert_exit(&b, 0);
    let runs = f.runs_of("v2");
    let d = f.diagnostics();
    assert!(lockstep_violations(&runs, &set(&names)).is_empty(), "{d}");
    for h in ["compute1", "compute2", "compute3"] {
        for (phase, task) in [
            (Phase::Pre(1), "RPC pin nova-compute"),
            (Phase::Post(3), "db sync"),
            (Phase::Post(4), "start nova-compute"),
        ] {
            assert_eq!(count(&runs, h, "nova_compute", phase, task), 1, "{h} {task}\n{d}");
        }
    }
    assert_one_compute_at_a_time(&runs, &f);
}

/// A task past its own `timeout` is stopped (it never logs its end), fails its host
/// with a reason that says so, and with max_failures 0 the rollout stops: no later
/// phase starts anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_past_its_timeout_is_stopped_and_fails_the_rollout() {
    let names = ["compute1", "compute2", "controller1"];
    let (_etcd, url, f) = stand_in_fleet(&names, &[keystone(), nova_compute_short()]).await;
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
    let rules = f.rules(TWO_COMPUTES_RULES);
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
    assert_rollout_failed_naming(
        &url,
        &["RPC pin nova-compute", "did not finish within 1s"],
        "the failure names the task and its timeout",
    )
    .await;
}

/// Garbage in the keys of a composable rollout before it starts: a grant that is not
/// JSON, a finalize grant for nobody, and a host's service catalog overwritten with
/// garbage. No daemon ends, `jioctl status` names the keys, and the rollout still
/// ends done: the driver writes the grants again, and the host's agent publishes its
/// catalog again (it is the only writer of that key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_grants_and_catalogs_are_named_and_repaired() {
    let names = ["compute1", "controller1"];
    let (_etcd, url, mut f) = stand_in_fleet(&names, &[keystone(), nova_compute_short()]).await;
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
    let driver = f.spawn_upgrade(&url, FINALIZE_RULES);
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
