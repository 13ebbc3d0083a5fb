//! A command's failures: `max_failures`, a failed host in a followed role, and a
//! timeout stop the damage and are reported.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_host_stops_the_command_under_max_failures() {
    let (_etcd, url, a, f) = action_fleet(&COMPUTES).await;
    a.fail("compute2");
    let out = run_bounded(
        &url,
        &on_computes(
            r#"{"rolling_rules": {"roles": {"compute": 1}}, "max_failures": 0}"#,
            &["restart", "nova-compute"],
        ),
    )
    .await;
    assert_exit(&out, 1, &f, &a);
    let runs = a.runs();
    // One at a time in name order: compute1, then compute2 fails; nothing after it.
    let hosts: Vec<&str> = runs.iter().map(|r| r.host.as_str()).collect();
    assert_eq!(hosts, ["compute1", "compute2"], "{}", a.log());
    let id = command_id(&text(&out));
    let rec = command_record(&url, &id).await;
    assert_eq!(rec["state"], "failed", "{rec:#}");
    let failed = result_of(&url, &id, "compute2").await.unwrap();
    assert_eq!(failed["outcome"], "failed", "{failed:#}");
    assert_eq!(failed["exit_code"], 3, "{failed:#}");
    assert!(
        failed["message"]
            .as_str()
            .unwrap()
            .contains("nova-compute did not come back"),
        "the message carries the action's own stderr: {failed:#}"
    );
    for h in ["compute3", "compute4", "compute5", "compute6"] {
        assert!(result_of(&url, &id, h).await.is_none(), "{h} has a result");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("compute2"))
        .unwrap_or_else(|| panic!("{}", text(&out)));
    assert!(line.contains("failed") && line.contains(" 3 "), "{stdout}");
    let line = stdout.lines().find(|l| l.starts_with("compute5")).unwrap();
    assert!(line.contains("not run"), "{stdout}");
}

// ---------------------------------------------------------------------------
// Rules
// ---------------------------------------------------------------------------

/// Found: `role_order` with a failure inside `max_failures`. controller1 fails
/// (allowed by `max_failures: 1`); compute waits for the controllers to succeed,
/// which can never happen any more (a command's host is never run again). The
/// command should end (`failed`, compute1 not run, exit 1); it runs for ever,
/// saying "waiting for controller (1 host left)" (`command::ending` ends a command
/// whose remaining hosts are all held, not one whose remaining hosts wait on a
/// role that failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_in_a_followed_role_within_max_failures_ends_the_command() {
    let (_etcd, url, a, f) = action_fleet(&["compute1", "controller1"]).await;
    a.fail("controller1");
    let follower = spawn(
        &url,
        &[
            "run",
            "--all",
            "--instructions",
            r#"{"role_order": {"compute": "controller"}, "max_failures": 1}"#,
            "restart",
        ],
    );
    let out = finish_or_kill(follower, secs(30)).await.unwrap_or_else(|so_far| {
        panic!(
            "the command never ends after controller1 failed (30 s):\n{so_far}\n{}",
            diagnostics(&f, &a)
        )
    });
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        a.runs().iter().all(|r| r.host != "compute1"),
        "compute1 ran though controller1 failed:\n{}",
        a.log()
    );
    assert!(t.contains("not run"), "{t}");
}

// ---------------------------------------------------------------------------
// Timeouts and interruptions
// ---------------------------------------------------------------------------

/// `--timeout 2s` on an action that would run a minute, with a grandchild that
/// ignores SIGTERM: reported failed (the timeout named), exit 1, and every process
/// of the action gone; the agent goes on to the next command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_stops_the_whole_action_and_is_reported_failed() {
    let (_etcd, url, a, f) = action_fleet(&["compute1"]).await;
    let started = std::time::Instant::now();
    let out = run_bounded(
        &url,
        &["run", "--hosts", "compute1", "--timeout", "2s", "stubborn"],
    )
    .await;
    assert_exit(&out, 1, &f, &a);
    assert!(started.elapsed() < secs(30), "took {:?}", started.elapsed());
    let id = command_id(&text(&out));
    let r = result_of(&url, &id, "compute1").await.unwrap();
    assert_eq!(r["outcome"], "failed", "{r:#}");
    let msg = r["message"].as_str().unwrap_or_default();
    assert!(msg.contains("did not finish within 2s"), "{r:#}");
    let (script, grandchild) = (a.pid("stubborn-compute1"), a.pid("grandchild-compute1"));
    assert!(script > 0 && grandchild > 0, "the action did not record its pids");
    assert!(!process_alive(script), "the action {script} still runs");
    assert!(
        !process_alive(grandchild),
        "its grandchild {grandchild} (ignoring SIGTERM) still runs"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("0 of 1 host succeeded"), "{stdout}");
    // The agent is free again.
    let next = run_bounded(&url, &["run", "--hosts", "compute1", "restart"]).await;
    assert_eq!(next.status.code(), Some(0), "{}", text(&next));
}
