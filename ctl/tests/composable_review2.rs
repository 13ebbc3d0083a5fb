//! Second review of composable rollouts (issue 17), each against a real store with
//! real `jio-agent` daemons and real `jioctl` processes: multi-stage edge cases, the
//! finalize step under faults, the agent under signals and a store it cannot reach,
//! the watch switch when a composable rollout starts, two drivers, the JSON shapes,
//! and the embedded SQLite store and Consul. Order, overlap and repetition come from
//! the task log the fleet's scripts write (`common::composable`).

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use jio_common::keys::Key;
use jio_tests::Etcd;
use jio_tests::inspect::{open, text, wait_for};

use common::composable::{
    Fleet, Phase, PuppetKind, Service, Task, TaskRun, alive, count, finalize_violations, json,
    lockstep_violations, max_overlap, nova_compute, rollout_record, set, stage_order_violations,
    stage_states, wait_for_run,
};
use common::fleet::{keys_under, spawn};
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

fn key(k: &str) -> Key {
    Key::new(k).unwrap()
}

/// Keystone: one pre step and one post step.
fn keystone() -> Service {
    Service::new(
        "keystone",
        vec![Task::pre(1, "stop keystone"), Task::post(3, "keystone db sync")],
    )
}

/// nova_compute with one pre and one post step and a finalize task.
fn nova_compute_fin() -> Service {
    Service::new(
        "nova_compute",
        vec![
            Task::pre(1, "RPC pin nova-compute"),
            Task::post(3, "db sync"),
            Task::finalize("unpin RPC"),
        ],
    )
}

/// nova_compute with one pre and one post step (and no finalize task).
fn nova_compute_short() -> Service {
    Service::new(
        "nova_compute",
        vec![Task::pre(1, "RPC pin nova-compute"), Task::post(3, "db sync")],
    )
}

/// `jioctl upgrade` spawned, waited for at most `within`: its output, or a panic
/// naming what the fleet and `jioctl status` show when it did not end.
async fn ends_within(
    f: &Fleet,
    url: &str,
    child: tokio::process::Child,
    within: Duration,
) -> std::process::Output {
    match tokio::time::timeout(within, child.wait_with_output()).await {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let st = text(&run(url, &["status"]).await);
            panic!(
                "the driver did not end within {within:?}\n--- jioctl status\n{st}\n{}",
                f.diagnostics()
            )
        }
    }
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
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names = ["compute1", "compute2", "controller1"];
    let f = Fleet::start(
        &url,
        &names,
        &[keystone(), nova_compute_fin()],
        PuppetKind::StandIn,
    )
    .await;
    f.fail("controller1", "keystone", Phase::Pre(1));
    let rules = f.rules(
        r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "finalize": { "role": "controller" },
  "max_failures": 1,
  "rolling_rules": { "roles": { "compute": 2 } }
}"#,
    );
    let driver = spawn(&url, &["upgrade", "v2", "--instructions-file", &rules]);
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
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names = ["compute1", "controller1", "controller2"];
    let mut f = Fleet::start(
        &url,
        &names,
        &[keystone(), nova_compute_fin()],
        PuppetKind::StandIn,
    )
    .await;
    f.set_task_seconds("controller1", "nova_compute", Phase::Finalize, None, 30.0);
    let rules = f.rules(
        r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "finalize": { "role": "controller" }
}"#,
    );
    let driver = spawn(&url, &["upgrade", "v2", "--instructions-file", &rules]);
    let fin = wait_for_run(&f, "controller1's finalize to start", secs(60), |r| {
        r.host == "controller1" && r.phase == Phase::Finalize && r.version == "v2"
    })
    .await;
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
    assert_eq!(out.status.code(), Some(0), "{}\n{}", text(&out), f.diagnostics());
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
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names = ["compute1", "controller1", "controller2"];
    let f = Fleet::start(&url, &names, &[keystone(), nova_compute()], PuppetKind::StandIn).await;
    // post-4 is nova_compute's alone: the controllers are done by then.
    f.set_task_seconds("compute1", "nova_compute", Phase::Post(4), None, 5.0);
    let rules = f.rules(
        r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "finalize": { "role": "controller" }
}"#,
    );
    let driver = spawn(&url, &["upgrade", "v2", "--instructions-file", &rules]);
    wait_for_run(&f, "compute1's post-4 to start", secs(60), |r| {
        r.host == "compute1" && r.phase == Phase::Post(4) && r.version == "v2"
    })
    .await;
    let out = run(&url, &["hold", "controller1", "--reason", "review"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = ends_within(&f, &url, driver, secs(40)).await;
    assert_eq!(out.status.code(), Some(0), "{}\n{}", text(&out), f.diagnostics());
    let runs = f.runs_of("v2");
    let v = finalize_violations(&runs, "controller2", &[("nova_compute", "unpin RPC")]);
    assert!(v.is_empty(), "{v:#?}\n{}", f.diagnostics());
}

// ---------------------------------------------------------------------------
// The agent: SIGTERM, an unreachable store, the watch switch
// ---------------------------------------------------------------------------

/// Rules with one compute at a time.
const ONE_RULES: &str = r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "finalize": { "role": "controller" },
  "rolling_rules": { "roles": { "compute": 1 } }
}"#;

/// SIGTERM of an agent in the middle of a task (limit: one compute): the agent stops
/// the task and exits; its run marker stays (the host keeps its slot): no other
/// compute starts anything while it is down. Started again, it runs the interrupted
/// task again and the rollout ends done, one compute at a time, each other task once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_task_keeps_the_slot_and_the_step_resumes() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names = ["compute1", "compute2", "controller1"];
    let mut f = Fleet::start(
        &url,
        &names,
        &[keystone(), nova_compute_short()],
        PuppetKind::StandIn,
    )
    .await;
    // A short stop_grace: the task is stopped soon after the SIGTERM.
    let cfg = f.hosts[f.index("compute1")].config();
    let mut c = std::fs::read_to_string(&cfg).unwrap();
    c.push_str("stop_grace = \"1s\"\n");
    std::fs::write(&cfg, c).unwrap();
    f.kill_agent("compute1").await;
    f.restart_agent("compute1");
    f.set_task_seconds("compute1", "nova_compute", Phase::Pre(1), None, 30.0);
    let rules = f.rules(ONE_RULES);
    let driver = spawn(&url, &["upgrade", "v2", "--instructions-file", &rules]);
    let long = wait_for_run(&f, "compute1's pre-1 to start", secs(60), |r| {
        r.host == "compute1" && r.phase == Phase::Pre(1) && r.version == "v2"
    })
    .await;
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
    assert_eq!(out.status.code(), Some(0), "{}\n{}", text(&out), f.diagnostics());
    let runs = f.runs_of("v2");
    let d = f.diagnostics();
    assert_eq!(
        count(
            &runs,
            "compute1",
            "nova_compute",
            Phase::Pre(1),
            "RPC pin nova-compute"
        ),
        2,
        "{d}"
    );
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

/// The store becomes unreachable for compute1's agent (alone) while its pre-1 task
/// runs, and stays so after the task ended (limit: one compute): the report waits in
/// its journal, the host keeps its slot (its run marker stays) and no other compute
/// is admitted in its place. When the store is back, the report lands, the task is
/// not run again, and the rollout ends done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_ends_while_the_store_is_unreachable_keeps_its_slot() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names = ["compute1", "compute2", "controller1"];
    let mut f = Fleet::start(
        &url,
        &names,
        &[keystone(), nova_compute_short()],
        PuppetKind::StandIn,
    )
    .await;
    let proxy = Proxy::start(etcd.port(0)).await;
    repoint(&mut f, "compute1", &format!("etcd://127.0.0.1:{}", proxy.port)).await;
    let s = open(&url).await;
    wait_for("compute1's agent to be back", secs(20), || async {
        keys_under(&s, "/agents/").await.contains_key("/agents/compute1")
    })
    .await;
    f.set_task_seconds("compute1", "nova_compute", Phase::Pre(1), None, 3.0);
    let rules = f.rules(ONE_RULES);
    let driver = spawn(&url, &["upgrade", "v2", "--instructions-file", &rules]);
    wait_for_run(&f, "compute1's pre-1 to start", secs(60), |r| {
        r.host == "compute1" && r.phase == Phase::Pre(1) && r.version == "v2"
    })
    .await;
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
        assert_eq!(
            count(&runs, h, "nova_compute", Phase::Pre(1), "RPC pin nova-compute"),
            1,
            "{h}\n{d}"
        );
        assert_eq!(
            count(&runs, h, "nova_compute", Phase::Post(3), "db sync"),
            1,
            "{h}\n{d}"
        );
    }
    let (n, at) = max_overlap(&runs, &set(&["compute1", "compute2"]), Phase::Pre(1));
    assert!(n <= 1, "{at:?}\n{d}");
}

/// The watch switch: a composable rollout is recorded (`--detach`, no driver) while
/// every agent is idle; compute1 is enabled first (it waits: no phase is granted),
/// then its role's grant is written by hand. The agent learns of the grant from its
/// `/steps/` watch, not from a resync (5 min): its task starts within 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_agent_sees_the_first_grant_of_a_new_composable_rollout_promptly() {
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

/// Three stages, one host of the second held before the rollout: the stages run in
/// order, the held host is left behind (it runs nothing and stays at v1) and the
/// third stage goes on; the rollout ends done, saying who was held back. `status
/// --json` gives every stage's shape (`done`, `left_behind` naming the held host) and
/// `rollout status --json` the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_stages_with_a_host_held_in_the_second() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names = ["compute1", "compute2", "controller1", "stmon1", "stmon2"];
    let f = Fleet::start(
        &url,
        &names,
        &[keystone(), ceph_mon(), nova_compute_short()],
        PuppetKind::StandIn,
    )
    .await;
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

const STAGED: &str = r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "stages": { "controlplane": ["controller"], "compute": ["compute"] },
  "finalize": { "role": "controller" },
  "rolling_rules": { "roles": { "compute": 2 } }
}"#;

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
    let first = spawn(
        &url,
        &[
            "upgrade",
            "v2",
            "--instructions-file",
            &rules,
            "--stage",
            "controlplane",
        ],
    );
    wait_for_run(&f, "controller2's pre-1 to start", secs(60), |r| {
        r.host == "controller2" && r.phase == Phase::Pre(1) && r.version == "v2"
    })
    .await;
    let id = rollout_record(&url).await["id"].clone();
    let second = spawn(
        &url,
        &[
            "upgrade",
            "v2",
            "--instructions-file",
            &rules,
            "--stage",
            "compute",
        ],
    );
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
    assert_eq!(a.status.code(), Some(0), "{}\n{}", text(&a), f.diagnostics());
    assert_eq!(b.status.code(), Some(0), "{}\n{}", text(&b), f.diagnostics());
    let runs = f.runs_of("v2");
    let d = f.diagnostics();
    assert!(f.all_at(&names, "v2"), "{d}");
    let v = stage_order_violations(&runs, &set(&plane), &set(&computes));
    assert!(v.is_empty(), "{v:#?}\n{d}");
    assert_eq!(rollout_record(&url).await["state"], "done");
}

/// `rollout abort` of a composable rollout after its first stage, then `upgrade`
/// with the same rules: a new rollout, which runs the steps again (what a task did
/// is remembered per rollout) but not the Puppet run of hosts already at the
/// version, and its grants name it (the aborted one's are gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_then_the_same_rules_is_a_new_rollout_that_runs_the_steps_again() {
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
    let rules = f.rules(STAGED);
    f.upgrade(
        &url,
        &["v2", "--instructions-file", &rules, "--stage", "controlplane"],
        0,
        secs(60),
    )
    .await;
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
    assert_eq!(
        count(
            &runs,
            "compute1",
            "nova_compute",
            Phase::Pre(1),
            "RPC pin nova-compute"
        ),
        1,
        "{d}"
    );
    assert!(keys_under(&s, "/steps/").await.is_empty());
}

// ---------------------------------------------------------------------------
// Drivers
// ---------------------------------------------------------------------------

/// Two `jioctl upgrade` of the same version and rules started together (one drives,
/// the other follows): both end 0, each task ran once, in lockstep, within the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_drivers_racing_on_the_grants_run_each_task_once() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let names = ["compute1", "compute2", "compute3", "controller1"];
    let f = Fleet::start(&url, &names, &[keystone(), nova_compute()], PuppetKind::StandIn).await;
    let rules = f.rules(ONE_RULES);
    let a = spawn(&url, &["upgrade", "v2", "--instructions-file", &rules]);
    let b = spawn(&url, &["upgrade", "v2", "--instructions-file", &rules]);
    let a = ends_within(&f, &url, a, secs(90)).await;
    let b = ends_within(&f, &url, b, secs(30)).await;
    assert_eq!(a.status.code(), Some(0), "{}\n{}", text(&a), f.diagnostics());
    assert_eq!(b.status.code(), Some(0), "{}\n{}", text(&b), f.diagnostics());
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
    let computes = set(&["compute1", "compute2", "compute3"]);
    for phase in [
        Phase::Pre(1),
        Phase::Pre(2),
        Phase::Puppet,
        Phase::Post(3),
        Phase::Post(4),
    ] {
        let (n, at) = max_overlap(&runs, &computes, phase);
        assert!(n <= 1, "{phase}: {at:?}\n{d}");
    }
}

/// A `jioctl drive` service drives a staged rollout started `--detach`; a following
/// `jioctl upgrade --stage controlplane` ends 0 once the stage is done and says which
/// stage is left; `--stage compute` then continues the same rollout, which the
/// service drives to done. The service keeps running (and waiting) between stages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drive_service_and_a_following_upgrade_stage() {
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
    let mut service = spawn(&url, &["drive"]);
    let rules = f.rules(STAGED);
    let follower = spawn(
        &url,
        &[
            "upgrade",
            "v2",
            "--instructions-file",
            &rules,
            "--stage",
            "controlplane",
        ],
    );
    let out = ends_within(&f, &url, follower, secs(40)).await;
    assert_eq!(out.status.code(), Some(0), "{}\n{}", text(&out), f.diagnostics());
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
    f.upgrade(
        &url,
        &["v2", "--instructions-file", &rules, "--stage", "compute"],
        0,
        secs(60),
    )
    .await;
    let r = rollout_record(&url).await;
    assert_eq!(r["id"], id, "{r:#}");
    assert_eq!(r["state"], "done", "{r:#}");
    assert!(f.all_at(&names, "v2"), "{}", f.diagnostics());
    assert!(service.try_wait().unwrap().is_none(), "the drive service ended");
    let _ = service.start_kill();
}

// ---------------------------------------------------------------------------
// Other stores
// ---------------------------------------------------------------------------

/// A small composable rollout on `url`: done, in lockstep, finalize once, the
/// catalogs beside the host records, `/steps/` gone at the end.
async fn small_rollout_on(url: &str) {
    let names = ["compute1", "controller1"];
    let f = Fleet::start(
        url,
        &names,
        &[keystone(), nova_compute_fin()],
        PuppetKind::StandIn,
    )
    .await;
    let s = open(url).await;
    let reg = keys_under(&s, "/hosts/").await;
    for h in names {
        assert!(reg.contains_key(&format!("/hosts/{h}")), "{reg:?}");
        assert!(reg.contains_key(&format!("/hosts/{h}/services")), "{reg:?}");
    }
    // Both hosts are seen as hosts (the catalog key is not one).
    let st = json(url, &["status"]).await;
    let txt = st.to_string();
    assert!(!txt.contains("\"services\":{\"dir\""), "{st:#}");
    let rules = f.rules(
        r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "finalize": { "role": "controller" }
}"#,
    );
    let driver = spawn(url, &["upgrade", "v2", "--instructions-file", &rules]);
    // The grants are there while it runs.
    wait_for("a grant under /steps/", secs(30), || async {
        !keys_under(&s, "/steps/").await.is_empty()
    })
    .await;
    let out = ends_within(&f, url, driver, secs(60)).await;
    assert_eq!(out.status.code(), Some(0), "{}\n{}", text(&out), f.diagnostics());
    let runs = f.runs_of("v2");
    let d = f.diagnostics();
    assert!(f.all_at(&names, "v2"), "{d}");
    assert!(lockstep_violations(&runs, &set(&names)).is_empty(), "{d}");
    let v = finalize_violations(&runs, "controller1", &[("nova_compute", "unpin RPC")]);
    assert!(v.is_empty(), "{v:#?}\n{d}");
    assert!(
        keys_under(&s, "/steps/").await.is_empty(),
        "the grants outlived the rollout: {:?}",
        keys_under(&s, "/steps/").await
    );
    let reg = keys_under(&s, "/hosts/").await;
    for h in names {
        assert!(reg.contains_key(&format!("/hosts/{h}/services")), "{reg:?}");
    }
    let h = json(url, &["status"]).await;
    let hosts = h.to_string();
    assert!(
        hosts.contains("compute1") && hosts.contains("controller1"),
        "{h:#}"
    );
    assert_eq!(rollout_record(url).await["state"], "done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_composable_rollout_on_the_embedded_sqlite_store() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("store.db").display());
    // The agents create the store; jioctl's first write needs it to exist.
    let s = open(&url).await;
    s.put(&key("/current_version"), "v1", None).await.unwrap();
    small_rollout_on(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_composable_rollout_on_consul() {
    let server = jio_tests::consul::ConsulServer::start(jio_tests::consul::ConsulOptions::default()).await;
    small_rollout_on(&server.url()).await;
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
    let rules = f.rules(
        r#"{
  "roles_data": { "controller": ["keystone", "glance"], "compute": ["nova_compute"] },
  "finalize": { "role": "controller" }
}"#,
    );
    let driver = spawn(&url, &["upgrade", "v2", "--instructions-file", &rules]);
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
    assert_eq!(out.status.code(), Some(0), "{}\n{}", text(&out), f.diagnostics());
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

/// `rollout undo` of a staged composable rollout whose first stage is done: the
/// rollout back to v1 (same rules, every stage) is driven to done by `upgrade v1`
/// with those rules; the control plane is back at v1 and the computes, never
/// upgraded, stay at v1 without a Puppet run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_of_a_staged_composable_rollout_goes_back() {
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
    let rules = f.rules(STAGED);
    f.upgrade(
        &url,
        &["v2", "--instructions-file", &rules, "--stage", "controlplane"],
        0,
        secs(60),
    )
    .await;
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
