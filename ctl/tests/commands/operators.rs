//! What operators do to a running command, and what it does to them: cancel,
//! holds, the emergency stop, windows, a paused rollout, a lost host.

use super::*;

fn super_now() -> f64 {
    common::fleet::now()
}

/// `HH:MM` (UTC) `offset` seconds from now.
fn hhmm(offset: i64) -> String {
    let t = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
        + offset)
        .rem_euclid(86_400);
    format!("{:02}:{:02}", t / 3600, (t / 60) % 60)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_mid_way_lets_the_running_host_finish_and_starts_no_other() {
    let names = ["compute1", "compute2", "compute3", "compute4"];
    let (_etcd, url, a, f) = action_fleet(&names).await;
    a.set_seconds(3.0);
    let follower = spawn(
        &url,
        &on_computes(r#"{"rolling_rules": {"global": 1}}"#, &["restart", "nova"]),
    );
    wait_started(&a, "compute1").await;
    let id = a.runs()[0].version.clone();
    let cancelled = run_bounded(&url, &["commands", "cancel", &id, "--reason", "wrong build"]).await;
    assert_eq!(cancelled.status.code(), Some(0), "{}", text(&cancelled));
    assert!(
        text(&cancelled).contains("1 host running it finishes"),
        "{}",
        text(&cancelled)
    );
    let at_cancel = super_now();
    let out = finish(follower, secs(60)).await;
    assert_exit(&out, 6, &f, &a);
    let runs = a.runs();
    // The running host finished; no host started after the cancel.
    assert_eq!(runs.len(), 1, "{}", a.log());
    assert!(runs[0].end.is_some(), "{}", a.log());
    assert!(runs.iter().all(|r| r.start < at_cancel), "{}", a.log());
    let rec = command_record(&url, &id).await;
    assert_eq!(rec["state"], "cancelled", "{rec:#}");
    assert_eq!(rec["reason"], "wrong build", "{rec:#}");
    assert_eq!(
        result_of(&url, &id, "compute1").await.unwrap()["outcome"],
        "succeeded"
    );
    // Nothing is left admitted, and a second cancel says there is nothing to do.
    let s = open(&url).await;
    assert!(keys_under(&s, "/config_state/commands/").await.is_empty());
    let again = run_bounded(&url, &["commands", "cancel", &id]).await;
    assert_eq!(again.status.code(), Some(1), "{}", text(&again));
    assert!(text(&again).contains("already cancelled"), "{}", text(&again));
}

/// Found: `commands cancel` while no driver follows the command leaves the
/// admission of the host that was running it in its inbox for ever (cancel keeps
/// started hosts; only a driver holding the lock releases, and neither
/// `commands follow` nor the driver service take the lock of a command that is no
/// longer active). The stale admission counts compute1 as in flight: a later
/// command on compute1 (or an upgrade) waits for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_command_without_a_follower_leaves_no_admission_behind() {
    let (_etcd, url, a, f) = action_fleet(&["compute1", "compute2"]).await;
    a.set_seconds(2.0);
    let follower = spawn(&url, &on_computes(GLOBAL_ONE, &["restart"]));
    wait_started(&a, "compute1").await;
    let id = a.runs()[0].version.clone();
    // Stop following (Ctrl-C): the command goes on, undriven.
    signal(&follower, Signal::SIGINT);
    let out = finish(follower, secs(30)).await;
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    let cancelled = run_bounded(&url, &["commands", "cancel", &id]).await;
    assert_eq!(cancelled.status.code(), Some(0), "{}", text(&cancelled));
    wait_for("compute1's result", secs(30), || async {
        result_of(&url, &id, "compute1").await.is_some()
    })
    .await;
    // A driver service and a follower of the command, as an operator would try.
    let drive = spawn(&url, &["drive"]);
    let followed = run_bounded(&url, &["commands", "follow", &id]).await;
    assert_eq!(followed.status.code(), Some(6), "{}", text(&followed));
    a.set_seconds(0.2);
    let again = spawn(&url, &["run", "--hosts", "compute1", "restart", "again"]);
    let again = finish_or_kill(again, secs(20)).await;
    let inbox = inbox_of(&url, "compute1").await;
    drop(drive);
    let again = again.unwrap_or_else(|so_far| {
        panic!(
            "a new command on compute1 never started: its inbox still names the cancelled command: {inbox:?}\n{so_far}\n{}",
            diagnostics(&f, &a)
        )
    });
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
    assert!(inbox.is_none(), "stale admission: {inbox:?}");
}

/// Found: a cancelled command's follower never ends while a host whose agent is
/// dead (killed mid-action, never back) still counts as running it: `jioctl run`
/// (and `commands follow`) wait for its result for ever, though nothing will ever
/// report it; the cancel said "1 host running it finishes". Expected: the follower
/// ends (exit 6), naming the host whose agent is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_commands_follower_ends_though_a_dead_agent_never_reports() {
    let (_etcd, url, a, mut f) = action_fleet(&["compute1", "compute2"]).await;
    a.set_seconds(30.0);
    let follower = spawn(&url, &on_computes(GLOBAL_ONE, &["restart"]));
    wait_started(&a, "compute1").await;
    let id = a.runs()[0].version.clone();
    kill_agent(&mut f, 0).await;
    wait_agent_gone(&url, "compute1").await;
    let c = run_bounded(&url, &["commands", "cancel", &id]).await;
    assert_eq!(c.status.code(), Some(0), "{}", text(&c));
    let out = finish_or_kill(follower, secs(20)).await;
    kill_pids(&a.all_pids());
    let out = out.unwrap_or_else(|so_far| {
        panic!("the follower of the cancelled command never ends (20 s):\n{so_far}")
    });
    assert_eq!(out.status.code(), Some(6), "{}", text(&out));
}

/// compute1's agent is stopped (SIGSTOP) and admitted meanwhile; the command is
/// cancelled; the agent resumes (SIGCONT): the action never starts; the agent then
/// runs a new command normally, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_paused_while_admitted_never_starts_a_command_cancelled_meanwhile() {
    let (_etcd, url, a, f) = action_fleet(&["compute1"]).await;
    signal(&f.daemons[0], Signal::SIGSTOP);
    let follower = spawn(&url, &["run", "--hosts", "compute1", "restart"]);
    let s = open(&url).await;
    wait_for("compute1 to be admitted", secs(20), || async {
        inbox_of(&url, "compute1").await.is_some()
    })
    .await;
    let id = first_command_id(&s).await;
    let c = run_bounded(&url, &["commands", "cancel", &id]).await;
    assert_eq!(c.status.code(), Some(0), "{}", text(&c));
    signal(&f.daemons[0], Signal::SIGCONT);
    let out = finish(follower, secs(30)).await;
    assert_eq!(out.status.code(), Some(6), "{}", text(&out));
    tokio::time::sleep(secs(4)).await;
    assert!(
        a.runs().is_empty(),
        "the cancelled command ran:\n{}\n{}",
        a.log(),
        diagnostics(&f, &a)
    );
    assert!(result_of(&url, &id, "compute1").await.is_none());
    let again = run_bounded(&url, &["run", "--hosts", "compute1", "restart", "again"]).await;
    assert_exit(&again, 0, &f, &a);
    assert_eq!(a.runs().len(), 1, "{}", a.log());
}

// ---------------------------------------------------------------------------
// Holds, the emergency stop, cancel
// ---------------------------------------------------------------------------

/// A hold placed after compute1 was admitted but before its agent started: the
/// action must not run while held (holds up: the agent's start is fenced on the
/// hold keys). Found:  meanwhile jioctl says compute1 is "admitted, its agent is
/// about to start the command" and never names the hold (`commands show`,
/// `run`'s progress), and the admission keeps its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_after_admission_keeps_the_action_from_starting_and_is_named() {
    let (_etcd, url, a, f) = action_fleet(&["compute1"]).await;
    a.set_seconds(0.2);
    // Freeze the agent (well within its 3 s lease), admit, hold, thaw.
    signal(&f.daemons[0], Signal::SIGSTOP);
    let follower = spawn(&url, &on_hosts("compute1", GLOBAL_ONE, &["restart"]));
    let wait = wait_for("compute1 to be admitted", secs(10), || async {
        inbox_of(&url, "compute1").await.is_some()
    });
    let admitted = tokio::time::timeout(secs(10), wait).await;
    let held = run(&url, &["hold", "compute1", "--reason", "disk replacement"]).await;
    signal(&f.daemons[0], Signal::SIGCONT);
    assert!(admitted.is_ok(), "compute1 was never admitted");
    assert_eq!(held.status.code(), Some(0), "{}", text(&held));
    tokio::time::sleep(secs(3)).await;
    assert!(
        a.runs().is_empty(),
        "the action ran on a held host:\n{}",
        diagnostics(&f, &a)
    );
    let s = open(&url).await;
    let ids: Vec<String> = keys_under(&s, "/commands/")
        .await
        .keys()
        .map(|k| k.trim_start_matches("/commands/").to_string())
        .collect();
    let id = ids.first().cloned().unwrap();
    let shown = run_bounded(&url, &["--json", "commands", "show", &id]).await;
    let v: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    let reason = v["hosts"][0]["reason"].as_str().unwrap_or_default().to_string();
    let phase = v["hosts"][0]["phase"].as_str().unwrap_or_default().to_string();
    // Release, and let it end however it ends (once, at most).
    let released = run(&url, &["release", "compute1"]).await;
    assert_eq!(released.status.code(), Some(0), "{}", text(&released));
    let out = finish_or_kill(follower, secs(30)).await;
    assert!(repeated(&a.runs(), &id).is_empty(), "{}", a.log());
    assert!(
        reason.contains("held") || phase.contains("held"),
        "while held, commands show says {phase}: {reason:?}\n{v:#}\nrun: {out:?}"
    );
}

/// The emergency stop mid-command: the command ends aborted, the running host
/// finishes, no other host starts, no admission is left, the follower exits 6 and
/// says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emergency_stop_mid_command_aborts_it_and_the_running_host_finishes() {
    let names = ["compute1", "compute2", "compute3"];
    let (_etcd, url, a, f) = action_fleet(&names).await;
    a.set_seconds(2.0);
    let follower = spawn(&url, &on_computes(GLOBAL_ONE, &["restart"]));
    wait_started(&a, "compute1").await;
    let id = a.runs()[0].version.clone();
    let stop = run(&url, &["global-disable-puppet"]).await;
    assert_eq!(stop.status.code(), Some(0), "{}", text(&stop));
    assert!(text(&stop).contains(&id), "{}", text(&stop));
    let at_stop = common::fleet::now();
    let out = finish(follower, secs(60)).await;
    assert_exit(&out, 6, &f, &a);
    assert!(text(&out).contains("aborted"), "{}", text(&out));
    let runs = a.runs();
    assert_eq!(runs.len(), 1, "{}", a.log());
    assert!(runs[0].end.is_some(), "the running host finished: {}", a.log());
    assert!(runs.iter().all(|r| r.start < at_stop), "{}", a.log());
    assert_eq!(command_record(&url, &id).await["state"], "aborted");
    assert_eq!(
        result_of(&url, &id, "compute1").await.unwrap()["outcome"],
        "succeeded"
    );
    // Nothing more starts later either.
    tokio::time::sleep(secs(2)).await;
    assert_eq!(a.runs().len(), 1, "{}", a.log());
    let s = open(&url).await;
    assert!(keys_under(&s, "/config_state/commands/").await.is_empty());
}

/// Found: After an emergency stop, a new command: the stop is still in force for
/// upgrades (a new `jioctl upgrade` says it clears it). A command should be refused
/// or at least say that it runs despite the emergency stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_created_after_the_emergency_stop_is_refused_or_says_so() {
    let (_etcd, url, a, f) = action_fleet(&["compute1"]).await;
    let stop = run(&url, &["global-disable-puppet"]).await;
    assert_eq!(stop.status.code(), Some(0), "{}", text(&stop));
    let out = run_bounded(&url, &["run", "--hosts", "compute1", "restart"]).await;
    let t = text(&out);
    assert!(
        out.status.code() != Some(0) || t.contains("emergency stop") || t.contains("global-disable-puppet"),
        "ran {} time(s) during the emergency stop, without a word:\n{t}\n{}",
        a.runs().len(),
        diagnostics(&f, &a)
    );
}

/// An emergency stop, then a new `upgrade` (which clears it), then a command: the
/// command runs and says nothing about an emergency stop; a second emergency stop
/// then ends a command created before it (aborted, exit 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_emergency_stop_cleared_by_an_upgrade_a_command_runs_and_a_new_stop_ends_it() {
    let (_etcd, url, a, f) = action_fleet(&["compute1", "compute2"]).await;
    let stop = run(&url, &["global-disable-puppet"]).await;
    assert_eq!(stop.status.code(), Some(0), "{}", text(&stop));
    let up = run_bounded(&url, &["upgrade", "v1", "--detach", "--force"]).await;
    assert_eq!(up.status.code(), Some(0), "{}", text(&up));
    let out = run_bounded(&url, &["run", "--hosts", "compute1", "restart"]).await;
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}\n{}", diagnostics(&f, &a));
    assert!(!t.contains("emergency stop"), "{t}");
    a.set_seconds(2.0);
    let p = spawn(&url, &on_computes(GLOBAL_ONE, &["restart"]));
    wait_for("a second run to start", secs(30), || async {
        a.runs().len() == 2
    })
    .await;
    let stop = run(&url, &["global-disable-puppet"]).await;
    assert_eq!(stop.status.code(), Some(0), "{}", text(&stop));
    let o = finish(p, secs(30)).await;
    assert_eq!(o.status.code(), Some(6), "{}", text(&o));
    tokio::time::sleep(secs(1)).await;
    assert_eq!(a.runs().len(), 2, "a host started after the stop:\n{}", a.log());
}

/// `windows`: outside its window nothing is admitted and the command says why;
/// inside one it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_waits_for_its_window_and_says_so() {
    let (_etcd, url, a, f) = action_fleet(&["compute1"]).await;
    let closed = format!(
        r#"{{"windows": [{{"days": "daily", "start": "{}", "end": "{}", "tz": "UTC"}}]}}"#,
        hhmm(6 * 3600),
        hhmm(7 * 3600)
    );
    let p = spawn(
        &url,
        &["run", "--hosts", "compute1", "--instructions", &closed, "restart"],
    );
    let waited = finish_or_kill(p, secs(6)).await;
    let so_far = match waited {
        Ok(o) => panic!("it ended outside its window: {}", text(&o)),
        Err(t) => t,
    };
    assert!(a.runs().is_empty(), "ran outside its window:\n{}", a.log());
    assert!(
        so_far.contains("window"),
        "the follower does not name the window:\n{so_far}"
    );
    let id = command_id(&so_far);
    let show = run_bounded(&url, &["commands", "show", &id]).await;
    assert!(text(&show).contains("window"), "{}", text(&show));
    let c = run_bounded(&url, &["commands", "cancel", &id]).await;
    assert_eq!(c.status.code(), Some(0), "{}", text(&c));
    let open_now = format!(
        r#"{{"windows": [{{"days": "daily", "start": "{}", "end": "{}", "tz": "UTC"}}]}}"#,
        hhmm(-3600),
        hhmm(3600)
    );
    let out = run_bounded(&url, &on_hosts("compute1", &open_now, &["restart"])).await;
    assert_exit(&out, 0, &f, &a);
    assert_eq!(a.runs().len(), 1, "{}", a.log());
}

/// A rollout to v2 recorded and paused (no host enabled): a command on the same
/// role is not held up by it (hosts neither enabled nor running are not busy),
/// and no host upgrades meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_rollout_does_not_hold_up_a_command() {
    let (_etcd, url, a, f) = action_fleet(&["compute1", "compute2"]).await;
    let up = run_bounded(
        &url,
        &[
            "upgrade",
            "v2",
            "--detach",
            "--instructions",
            r#"{"rolling_rules": {"roles": {"compute": 1}}}"#,
        ],
    )
    .await;
    assert_eq!(up.status.code(), Some(0), "{}", text(&up));
    let pause = run_bounded(&url, &["rollout", "pause"]).await;
    assert_eq!(pause.status.code(), Some(0), "{}", text(&pause));
    let out = run_bounded(
        &url,
        &on_computes(r#"{"rolling_rules": {"roles": {"compute": 1}}}"#, &["restart"]),
    )
    .await;
    assert_exit(&out, 0, &f, &a);
    assert_eq!(a.runs().len(), 2, "{}", a.log());
    assert_eq!(f.started("v2"), 0, "a host upgraded during the pause");
}

// ---------------------------------------------------------------------------
// Agents lost, paused, without their journal
// ---------------------------------------------------------------------------

/// compute2's agent is dead before the command (never admitted). The command runs
/// on compute1 and waits for compute2, saying why (`commands show`); a second
/// follower stops on Ctrl-C (130) at once; `commands cancel` ends it: the first
/// follower exits 6, compute2 `not run`, nothing left admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_left_with_only_a_lost_host_waits_says_why_and_is_cancelled() {
    let (_etcd, url, a, mut f) = action_fleet(&["compute1", "compute2"]).await;
    kill_agent(&mut f, 1).await;
    let s = open(&url).await;
    wait_agent_gone(&url, "compute2").await;
    let follower = spawn(&url, &["run", "--role", "compute", "restart"]);
    wait_for("compute1's result", secs(30), || async {
        let cmds = keys_under(&s, "/commands/").await;
        match cmds.keys().next() {
            Some(k) => result_of(&url, k.trim_start_matches("/commands/"), "compute1")
                .await
                .is_some(),
            None => false,
        }
    })
    .await;
    let id = first_command_id(&s).await;
    let show = run_bounded(&url, &["commands", "show", &id]).await;
    let t = text(&show);
    assert_eq!(show.status.code(), Some(0), "{t}");
    let line = host_rows(&t, "compute2");
    assert!(
        line.contains("not alive") || line.contains("lost") || line.contains("agent"),
        "compute2's row does not say its agent is gone:\n{t}"
    );
    let second = spawn(&url, &["commands", "follow", &id]);
    tokio::time::sleep(secs(1)).await;
    signal(&second, Signal::SIGINT);
    let o2 = finish(second, secs(15)).await;
    assert_eq!(o2.status.code(), Some(130), "{}", text(&o2));
    let c = run_bounded(&url, &["commands", "cancel", &id, "--reason", "compute2 is gone"]).await;
    assert_eq!(c.status.code(), Some(0), "{}", text(&c));
    let out = finish_or_kill(follower, secs(30))
        .await
        .unwrap_or_else(|so_far| panic!("the follower did not end after the cancel:\n{so_far}"));
    let t = text(&out);
    assert_eq!(out.status.code(), Some(6), "{t}\n{}", diagnostics(&f, &a));
    let row = t.lines().find(|l| l.starts_with("compute2")).unwrap_or_default();
    assert!(row.contains("not run"), "{t}");
    assert!(keys_under(&s, "/config_state/commands/").await.is_empty());
}
