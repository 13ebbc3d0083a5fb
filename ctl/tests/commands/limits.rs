//! The rolling rules hold for commands: role limits and the fleet cap (in numbers
//! and percentages of the command's hosts), counted with upgrades and other
//! commands on the same hosts, and role order.

use super::*;

/// Checks that `restart` on compute1 and compute2 of four compute hosts, under
/// `instructions` (a 50% limit), exits 0, runs on both and never on both at once.
async fn assert_one_at_a_time_on_two_of_four(instructions: &str) {
    let names = ["compute1", "compute2", "compute3", "compute4"];
    let (_etcd, url, a, f) = action_fleet(&names).await;
    a.set_seconds(1.5);
    let out = run_bounded(&url, &on_hosts("compute1,compute2", instructions, &["restart"])).await;
    assert_exit(&out, 0, &f, &a);
    let runs = a.runs();
    assert_eq!(runs.len(), 2, "{}", a.log());
    let (n, at) = max_overlap(&runs);
    assert_eq!(
        n,
        1,
        "50% of the command's 2 hosts is 1, yet {n} ran at once: {at:?}\n{}",
        a.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_under_a_limit_of_two_never_runs_on_more_than_two_hosts_at_once() {
    let (_etcd, url, a, f) = action_fleet(&COMPUTES).await;
    a.set_seconds(0.8);
    let out = run_bounded(
        &url,
        &on_computes(
            r#"{"rolling_rules": {"roles": {"compute": 2}}}"#,
            &["restart", "nova-compute", "--graceful"],
        ),
    )
    .await;
    assert_exit(&out, 0, &f, &a);
    let runs = a.runs();
    // Every host ran it exactly once, with its arguments as a list.
    assert_eq!(runs.len(), COMPUTES.len(), "{}", a.log());
    for h in COMPUTES {
        assert_eq!(runs.iter().filter(|r| r.host == h).count(), 1, "{h}: {}", a.log());
    }
    assert!(
        a.log()
            .lines()
            .filter(|l| l.starts_with("start"))
            .all(|l| l.ends_with(" nova-compute --graceful")),
        "{}",
        a.log()
    );
    // Never more than two at once, by the action's own log; and two were reached,
    // so the check could fail.
    let (n, at) = max_overlap(&runs);
    assert!(n <= 2, "{n} hosts ran the action at once: {at:?}\n{}", a.log());
    assert_eq!(n, 2, "the limit was never reached: {}", a.log());
    // The summary names every host, its exit code and where its output is.
    let stdout = String::from_utf8_lossy(&out.stdout);
    for h in COMPUTES {
        // The row, and below it the run directory when it does not fit the row.
        let line = host_rows(&stdout, h);
        assert!(line.contains("succeeded") && line.contains(" 0 "), "{line}");
        assert!(line.contains("command-"), "the run directory: {line}");
    }
    assert!(stdout.contains("6 of 6 hosts succeeded"), "{stdout}");
    let id = command_id(&text(&out));
    let rec = command_record(&url, &id).await;
    assert_eq!(rec["state"], "done", "{rec:#}");
    // Nothing is left admitted.
    let s = open(&url).await;
    assert!(keys_under(&s, "/config_state/commands/").await.is_empty());
    // `commands show --json` agrees, host by host.
    let shown = run_bounded(&url, &["--json", "commands", "show", &id]).await;
    let v: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(v["counts"]["succeeded"], 6, "{v:#}");
    assert_eq!(v["hosts"][0]["exit_code"], 0, "{v:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_and_an_upgrade_never_run_at_once_on_a_host_and_share_the_limit() {
    let names = ["compute1", "compute2", "compute3"];
    let (_etcd, url, a, f) = action_fleet(&names).await;
    f.set_seconds(1.0);
    a.set_seconds(1.0);
    let rules = r#"{"rolling_rules": {"roles": {"compute": 1}}}"#;
    let upgrade = spawn(&url, &["upgrade", "v2", "--instructions", rules]);
    let command = spawn(&url, &on_computes(rules, &["restart", "nova"]));
    let up = finish(upgrade, secs(120)).await;
    let cmd = finish(command, secs(120)).await;
    assert_exit(&up, 0, &f, &a);
    assert_exit(&cmd, 0, &f, &a);
    assert!(f.all_at("v2"));
    // Puppet's log and the action's log, together.
    let all = v2_and_action_runs(&f, &a);
    assert_eq!(all.len(), 6, "three upgrades and three commands:\n{all:#?}");
    // On one host, never both at once.
    let v = same_host_overlaps(&all);
    assert!(v.is_empty(), "{v:?}\n{all:#?}");
    // Across the role, one host in flight at a time, whatever it runs.
    let (n, at) = max_overlap(&all);
    assert_eq!(n, 1, "{n} compute hosts busy at once: {at:?}\n{all:#?}");
}

// ---------------------------------------------------------------------------
// Shared limits
// ---------------------------------------------------------------------------

/// Found: a command counts only its own hosts in flight. With `compute: 1`, a
/// command on compute2 starts while compute1's agent runs another command's action:
/// two compute hosts busy at once (`command::plan` gives `plan::plan` the statuses
/// of `rec.hosts` only, so busy hosts outside the targets never count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_counts_busy_hosts_outside_its_targets_against_the_role_limit() {
    let (_etcd, url, a, f) = action_fleet(&["compute1", "compute2"]).await;
    a.set_seconds(3.0);
    let first = spawn(&url, &on_hosts("compute1", ONE_COMPUTE, &["restart", "one"]));
    wait_started(&a, "compute1").await;
    let second = spawn(&url, &on_hosts("compute2", ONE_COMPUTE, &["restart", "two"]));
    let o1 = finish(first, secs(60)).await;
    let o2 = finish(second, secs(60)).await;
    assert_eq!(o1.status.code(), Some(0), "{}", text(&o1));
    assert_eq!(o2.status.code(), Some(0), "{}", text(&o2));
    let (n, at) = max_overlap(&a.runs());
    assert!(
        n <= 1,
        "{n} compute hosts ran actions at once under compute: 1: {at:?}\n{}",
        diagnostics(&f, &a)
    );
}

/// Found: a command on compute2 starts while compute1's agent runs
/// Puppet for an upgrade under the same `compute: 1`, so a compute host upgrades
/// while another runs the command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_waits_for_an_upgrade_on_another_host_of_the_role() {
    let (_etcd, url, a, f) = action_fleet(&["compute1", "compute2"]).await;
    f.set_seconds(3.0);
    a.set_seconds(0.5);
    let upgrade = spawn(&url, &["upgrade", "v2", "--instructions", ONE_COMPUTE]);
    wait_for("compute1's upgrade to start", secs(60), || async {
        f.runs().iter().any(|r| r.version == "v2")
    })
    .await;
    let command = spawn(&url, &on_hosts("compute2", ONE_COMPUTE, &["restart"]));
    let up = finish(upgrade, secs(120)).await;
    let cmd = finish(command, secs(120)).await;
    assert_eq!(up.status.code(), Some(0), "{}", text(&up));
    assert_eq!(cmd.status.code(), Some(0), "{}", text(&cmd));
    let all = v2_and_action_runs(&f, &a);
    let (n, at) = max_overlap(&all);
    assert!(
        n <= 1,
        "{n} compute hosts busy at once under compute: 1: {at:?}\n{all:#?}\n{}",
        diagnostics(&f, &a)
    );
}

/// Holds up (the other direction): an upgrade started while compute1 runs a
/// command waits for it under `compute: 1` (the upgrade classifies the whole fleet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_waits_for_a_command_on_another_host_of_the_role() {
    let (_etcd, url, a, f) = action_fleet(&["compute1", "compute2"]).await;
    f.set_seconds(0.5);
    a.set_seconds(3.0);
    let command = spawn(&url, &on_hosts("compute1", ONE_COMPUTE, &["restart"]));
    wait_started(&a, "compute1").await;
    let upgrade = spawn(&url, &["upgrade", "v2", "--instructions", ONE_COMPUTE]);
    let cmd = finish(command, secs(120)).await;
    let up = finish(upgrade, secs(120)).await;
    assert_eq!(cmd.status.code(), Some(0), "{}", text(&cmd));
    assert_eq!(up.status.code(), Some(0), "{}", text(&up));
    let all = v2_and_action_runs(&f, &a);
    let (n, at) = max_overlap(&all);
    assert!(n <= 1, "{n} compute hosts busy at once: {at:?}\n{all:#?}");
}

/// Two commands created at once on the same hosts, each under `global: 1`: each
/// counts the other's admitted and running hosts, so never two actions at once and
/// never two on one host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_commands_on_the_same_hosts_share_the_limit() {
    let (_etcd, url, a, f) = action_fleet(&["compute1", "compute2"]).await;
    a.set_seconds(0.7);
    let c1 = spawn(&url, &on_computes(GLOBAL_ONE, &["restart", "one"]));
    let c2 = spawn(&url, &on_computes(GLOBAL_ONE, &["restart", "two"]));
    let o1 = finish(c1, secs(60)).await;
    let o2 = finish(c2, secs(60)).await;
    assert_exit(&o1, 0, &f, &a);
    assert_exit(&o2, 0, &f, &a);
    let runs = a.runs();
    assert_eq!(runs.len(), 4, "{}", a.log());
    let (n, at) = max_overlap(&runs);
    assert_eq!(n, 1, "{at:?}\n{}", a.log());
}

// ---------------------------------------------------------------------------
// Many commands, windows, rollouts, the emergency stop
// ---------------------------------------------------------------------------

/// Three `jioctl run` at once on the same three hosts, each under `global: 1`:
/// each host runs each command once, never two actions at once anywhere (each
/// counts the others' hosts), every follower exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_commands_at_once_on_the_same_hosts_run_once_each_one_at_a_time() {
    let names = ["compute1", "compute2", "compute3"];
    let (_etcd, url, a, f) = action_fleet(&names).await;
    a.set_seconds(0.4);
    let ps: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|n| spawn(&url, &on_computes(GLOBAL_ONE, &["restart", n])))
        .collect();
    for p in ps {
        let o = finish(p, secs(120)).await;
        assert_eq!(o.status.code(), Some(0), "{}\n{}", text(&o), diagnostics(&f, &a));
    }
    let runs = a.runs();
    assert_eq!(runs.len(), 9, "{}", a.log());
    let ids: std::collections::BTreeSet<&str> = runs.iter().map(|r| r.version.as_str()).collect();
    assert_eq!(ids.len(), 3, "{}", a.log());
    for id in ids {
        assert!(repeated(&runs, id).is_empty(), "{}", a.log());
    }
    assert!(same_host_overlaps(&runs).is_empty(), "{}", a.log());
    let (n, at) = max_overlap(&runs);
    assert_eq!(n, 1, "{at:?}\n{}", a.log());
}

/// Found: a percentage limit is of the fleet's hosts of the role, not of the
/// command's hosts as docs/fleet-commands.md says ("counts or percentages of the command's
/// hosts"). A command on 2 of 4 compute hosts under `compute: "50%"` should run
/// one host at a time (50% of 2); it runs both at once (50% of 4: `plan::plan`
/// is given every host of the fleet, and `limit_of` takes the group's size there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_percentage_role_limit_is_of_the_commands_hosts() {
    assert_one_at_a_time_on_two_of_four(r#"{"rolling_rules": {"roles": {"compute": "50%"}}}"#).await;
}

/// Found: the same for the `fleet` cap: `fleet: "50%"` on a command of 2 hosts
/// (of a fleet of 4) lets both run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_percentage_fleet_cap_is_of_the_commands_hosts() {
    assert_one_at_a_time_on_two_of_four(r#"{"rolling_rules": {"fleet": "50%"}}"#).await;
}

/// Found: `role_order` waits for hosts the command does not name. controller2's
/// agent died while it ran another command (its run marker stays: the host is
/// lost). A command on controller1 and compute1 with `compute` after `controller`
/// runs on controller1, which succeeds, and then waits for ever: "waiting for
/// controller (1 host left)". docs/fleet-commands.md: a role's hosts start "only when the
/// command has succeeded on every host of the roles it follows"; controller2 is not
/// one of them (`command::plan` gives `plan::plan` the whole fleet, whose `left()`
/// counts every busy host of the role as not done).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_order_waits_only_for_the_commands_own_hosts_of_the_followed_role() {
    let names = ["compute1", "controller1", "controller2"];
    let (_etcd, url, a, mut f) = action_fleet(&names).await;
    let other = spawn(&url, &["run", "--hosts", "controller2", "stubborn"]);
    wait_started(&a, "controller2").await;
    kill_agent(&mut f, 2).await;
    drop(other); // killed: the other command stays active, undriven
    wait_agent_gone(&url, "controller2").await;
    let p = spawn(
        &url,
        &on_hosts(
            "controller1,compute1",
            r#"{"role_order": {"compute": "controller"}}"#,
            &["restart"],
        ),
    );
    let out = finish_or_kill(p, secs(20)).await;
    kill_pids(&[a.pid("stubborn-controller2"), a.pid("grandchild-controller2")]);
    let out = out.unwrap_or_else(|so_far| {
        panic!(
            "compute1 waits for controller2, which the command does not name:\n{so_far}\n{}",
            a.log()
        )
    });
    assert_exit(&out, 0, &f, &a);
}
