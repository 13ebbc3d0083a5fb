//! Processes that die or restart mid-command: agents (with and without their
//! journal), drivers (killed, paused past their lease, SIGTERM of the service), and
//! a store that cannot be reached. Each host runs the action once.

use super::*;

/// The runs of command `id` in the action's log.
fn runs_of(a: &Actions, id: &str) -> Vec<Run> {
    a.runs().into_iter().filter(|r| r.version == id).collect()
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_mid_command_reports_it_interrupted_and_does_not_run_it_again() {
    let (_etcd, url, a, mut f) = action_fleet(&["compute1", "compute2"]).await;
    a.set_seconds(30.0);
    let follower = spawn(&url, &["run", "--hosts", "compute1", "restart", "nova"]);
    wait_started(&a, "compute1").await;
    let pids = action_pids(&a.actions_dir());
    assert!(!pids.is_empty(), "the action runs");
    // kill -9 the agent in the middle of the action, then start it again.
    signal(&f.daemons[0], nix::sys::signal::Signal::SIGKILL);
    let _ = f.daemons[0].wait().await;
    a.set_seconds(0.2);
    f.daemons[0] = f.spawn_agent(0);
    let out = finish(follower, secs(60)).await;
    assert_exit(&out, 1, &f, &a);
    let id = command_id(&text(&out));
    let r = result_of(&url, &id, "compute1").await.unwrap();
    assert_eq!(r["outcome"], "interrupted", "{r:#}");
    assert!(r["message"].as_str().unwrap().contains("not run again"), "{r:#}");
    // By the action's own log: started once, never again; and the new agent
    // stopped what the killed one left running.
    assert_eq!(a.runs().len(), 1, "{}", a.log());
    for p in pids {
        assert!(!process_alive(p), "the orphaned action {p} still runs");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("compute1") && l.contains("interrupted")),
        "{stdout}"
    );

    // With --rerun-interrupted the same fault runs it again (attempt 2), once.
    a.set_seconds(30.0);
    let follower = spawn(
        &url,
        &[
            "run",
            "--hosts",
            "compute2",
            "--rerun-interrupted",
            "restart",
            "nova",
        ],
    );
    wait_started(&a, "compute2").await;
    signal(&f.daemons[1], nix::sys::signal::Signal::SIGKILL);
    let _ = f.daemons[1].wait().await;
    a.set_seconds(0.2);
    f.daemons[1] = f.spawn_agent(1);
    let out = finish(follower, secs(60)).await;
    assert_exit(&out, 0, &f, &a);
    let id = command_id(&text(&out));
    let r = result_of(&url, &id, "compute2").await.unwrap();
    assert_eq!(r["outcome"], "succeeded", "{r:#}");
    assert_eq!(r["attempt"], 2, "{r:#}");
    let twice: Vec<Run> = a.runs().into_iter().filter(|r| r.host == "compute2").collect();
    assert_eq!(twice.len(), 2, "{}", a.log());
    assert!(twice[0].end.is_none() && twice[1].end.is_some(), "{}", a.log());
}

/// The agent stopped with SIGTERM (a restart) while the action runs: the action is
/// stopped after `stop_grace`, the next agent reports it `interrupted` and does not
/// run it again; `jioctl run` exits 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restarted_mid_command_reports_it_interrupted_and_does_not_rerun() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let mut f = Fleet::start_with(&url, &url, &["compute1"], 0.1, |_| {
        format!("{}stop_grace = \"1s\"\n", a.config(false))
    })
    .await;
    a.set_seconds(30.0);
    let follower = spawn(&url, &["run", "--hosts", "compute1", "restart"]);
    wait_started(&a, "compute1").await;
    let id = a.runs()[0].version.clone();
    signal(&f.daemons[0], Signal::SIGTERM);
    let stopped = tokio::time::timeout(secs(20), f.daemons[0].wait()).await;
    assert!(stopped.is_ok(), "the agent did not stop on SIGTERM");
    for p in a.all_pids() {
        assert!(!process_alive(p), "the action {p} outlived its agent");
    }
    a.set_seconds(0.2);
    f.daemons[0] = f.spawn_agent(0);
    let out = finish(follower, secs(60)).await;
    assert_exit(&out, 1, &f, &a);
    let r = result_of(&url, &id, "compute1").await.unwrap();
    assert_eq!(r["outcome"], "interrupted", "{r:#}");
    tokio::time::sleep(secs(1)).await;
    assert_eq!(a.runs().len(), 1, "run again: {}", a.log());
}

/// The agent is killed (SIGKILL) while the action runs and its journal deleted,
/// then restarted: the action must not run a second time on that host (its start
/// is in the store); the host is reported, the command ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restarted_without_its_journal_does_not_run_the_command_twice() {
    let (_etcd, url, a, mut f) = action_fleet(&["compute1", "compute2"]).await;
    a.set_seconds(3.0);
    let follower = spawn(&url, &on_computes(GLOBAL_ONE, &["restart"]));
    wait_started(&a, "compute1").await;
    let id = a.runs()[0].version.clone();
    kill_agent(&mut f, 0).await;
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
// Drivers racing, dying, paused
// ---------------------------------------------------------------------------

/// `jioctl run` killed with SIGKILL mid-command; two `commands follow` race to
/// take over. Each host runs once, never two at once under `global: 1`, both
/// followers exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_killed_mid_command_is_taken_over_and_each_host_runs_once() {
    let names = ["compute1", "compute2", "compute3"];
    let (_etcd, url, a, f) = action_fleet(&names).await;
    a.set_seconds(1.0);
    let mut driver = spawn(&url, &on_computes(GLOBAL_ONE, &["restart"]));
    wait_started(&a, "compute1").await;
    let id = a.runs()[0].version.clone();
    signal(&driver, Signal::SIGKILL);
    let _ = driver.wait().await; // reaped: its pid is gone
    let f1 = spawn(&url, &["commands", "follow", &id]);
    let f2 = spawn(&url, &["commands", "follow", &id]);
    let o1 = finish(f1, secs(60)).await;
    let o2 = finish(f2, secs(60)).await;
    for o in [&o1, &o2] {
        assert_eq!(o.status.code(), Some(0), "{}\n{}", text(o), diagnostics(&f, &a));
        assert!(text(o).contains("3 of 3 hosts succeeded"), "{}", text(o));
    }
    let runs = a.runs();
    assert_once_each_one_at_a_time(&runs, &id, 3, &a);
    assert_eq!(command_record(&url, &id).await["state"], "done");
}

/// The driver service is paused (SIGSTOP) past its 3 s lease mid-command; a
/// `commands follow` takes over; the stale service resumes. Its writes are fenced:
/// never two at once, each host once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_driver_that_lost_its_lease_cannot_admit_after_a_follower_took_over() {
    let names = ["compute1", "compute2", "compute3"];
    let (_etcd, url, a, f) = action_fleet(&names).await;
    a.set_seconds(1.5);
    let mut drive = spawn(&url, &["drive", "--lease", "3s"]);
    let id = record_detached(&url, GLOBAL_ONE).await;
    wait_started(&a, "compute1").await;
    signal(&drive, Signal::SIGSTOP);
    let follower = spawn(&url, &["commands", "follow", &id]);
    wait_started(&a, "compute2").await;
    signal(&drive, Signal::SIGCONT);
    let out = finish(follower, secs(60)).await;
    assert_exit(&out, 0, &f, &a);
    tokio::time::sleep(secs(1)).await;
    assert!(
        drive.try_wait().unwrap().is_none(),
        "the driver service ended after its pause"
    );
    let runs = a.runs();
    assert_once_each_one_at_a_time(&runs, &id, 3, &a);
}

/// `run --detach` with a driver service running: the service picks the command
/// up, drives it to `done` under `global: 1` (each host once, by the action's log),
/// withdraws every admission and releases the command's lock; it lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_service_drives_a_detached_command_to_its_end() {
    let names = ["compute1", "compute2", "compute3"];
    let (_etcd, url, a, f) = action_fleet(&names).await;
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
    let names = ["compute1", "compute2", "compute3"];
    let (_etcd, url, a, f) = action_fleet(&names).await;
    a.set_seconds(2.0);
    let d1 = spawn(&url, &["drive"]);
    let d2 = spawn(&url, &["drive"]);
    let s = open(&url).await;
    wait_for("both driver services to register", secs(20), || async {
        keys_under(&s, "/drivers/").await.len() == 2
    })
    .await;
    let id = record_detached(&url, GLOBAL_ONE).await;
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
