//! Values in the store that no driver or agent wrote (bad bytes, unreadable
//! inboxes, records and log links, an admission to a command that is gone): each
//! is named with its key, and the rest goes on.

use super::*;

// ---------------------------------------------------------------------------
// Bad bytes in the store
// ---------------------------------------------------------------------------

/// Bad bytes in an untargeted host's inbox, in a record under `/commands/`, in a
/// run key of a command that does not exist: agents and the driver service live
/// on, a command on other hosts succeeds, `commands list` names the bad record,
/// the agent names its inbox key, `logs --command` without Swift is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bytes_in_command_keys_are_named_and_the_rest_goes_on() {
    let names = ["compute1", "compute2", "compute3"];
    let (_etcd, url, a, mut f) = action_fleet(&names).await;
    let mut drive = spawn(&url, &["drive", "--lease", "3s"]);
    let junk = "20261125T000000Z-junk";
    etcdctl_put(&url, b"/config_state/commands/compute3", b"\xff\xfe");
    etcdctl_put(&url, format!("/commands/{junk}").as_bytes(), b"\xff{");
    etcdctl_put(
        &url,
        format!("/command_runs/{junk}/results/compute1").as_bytes(),
        b"\xff",
    );
    etcdctl_put(&url, b"/commands/not-an-id", b"\xff");
    // No limit here: whether an unreadable inbox elsewhere takes a slot is the
    // next tests' question.
    let out = spawn(&url, &on_hosts("compute1,compute2", "{}", &["restart"]));
    let out = finish_or_kill(out, secs(30))
        .await
        .unwrap_or_else(|so_far| panic!("jioctl run never ended:\n{so_far}\n{}", diagnostics(&f, &a)));
    assert_exit(&out, 0, &f, &a);
    let id = command_id(&text(&out));
    let listed = run_bounded(&url, &["commands", "list"]).await;
    assert_eq!(listed.status.code(), Some(0), "{}", text(&listed));
    assert!(
        text(&listed)
            .lines()
            .any(|l| l.contains(junk) && l.contains("unreadable")),
        "{}",
        text(&listed)
    );
    assert!(text(&listed).contains(&id), "{}", text(&listed));
    let shown = run_bounded(&url, &["commands", "show", &id]).await;
    assert_eq!(shown.status.code(), Some(0), "{}", text(&shown));
    let shown = run_bounded(&url, &["commands", "show", junk]).await;
    assert_eq!(shown.status.code(), Some(1), "{}", text(&shown));
    assert!(
        text(&shown).contains(&format!("/commands/{junk}")),
        "{}",
        text(&shown)
    );
    let logs = run(&url, &["logs", "--command", &id, "compute1"]).await;
    assert_eq!(logs.status.code(), Some(1), "{}", text(&logs));
    assert!(
        text(&logs).contains("no log was uploaded (Swift is not configured on the host)"),
        "{}",
        text(&logs)
    );
    for (i, d) in f.daemons.iter_mut().enumerate() {
        assert!(d.try_wait().unwrap().is_none(), "agent {} ended", names[i]);
    }
    assert!(
        f.agent_log("compute3")
            .contains("/config_state/commands/compute3"),
        "{}",
        f.agent_log("compute3")
    );
    assert!(drive.try_wait().unwrap().is_none(), "the driver service ended");
    let status = run(&url, &["status"]).await;
    assert_eq!(status.status.code(), Some(0), "{}", text(&status));
}

/// An unreadable inbox on compute3 (which the agent cannot read either, so it runs
/// nothing from it; its `/agents` record says what it runs) must not take a slot
/// for ever: a command on compute1 under `global: 1` goes on.
/// Found: counting busy hosts outside the targets made the unreadable inbox a
/// slot taken for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_inbox_elsewhere_does_not_stall_a_command_for_ever() {
    let (_etcd, url, a, f) = action_fleet(&["compute1", "compute3"]).await;
    etcdctl_put(&url, b"/config_state/commands/compute3", b"\xff\xfe");
    let out = spawn(&url, &on_hosts("compute1", GLOBAL_ONE, &["restart"]));
    let out = finish_or_kill(out, secs(20)).await.unwrap_or_else(|so_far| {
        panic!(
            "the command never ran: compute3's unreadable inbox holds the only slot:\n{so_far}\n{}",
            diagnostics(&f, &a)
        )
    });
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// Found: the same unreadable inbox stalls an upgrade for ever: `classify`
/// counts compute3 in flight ("its command admissions cannot be read (counted as
/// admitted)") though its agent runs nothing, so under `compute: 1` no compute
/// host is ever enabled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_inbox_elsewhere_does_not_stall_an_upgrade_for_ever() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, &["compute1", "compute2", "compute3"], 0.1, |_| {
        a.config(false)
    })
    .await;
    etcdctl_put(&url, b"/config_state/commands/compute3", b"\xff\xfe");
    let up = spawn(&url, &["upgrade", "v2", "--instructions", ONE_COMPUTE]);
    let upgraded = tokio::time::timeout(secs(20), async {
        while !(f.hosts[0].local_version().as_deref() == Some("v2")
            && f.hosts[1].local_version().as_deref() == Some("v2"))
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let so_far = finish_or_kill(up, secs(1)).await;
    let so_far = match so_far {
        Ok(o) => text(&o),
        Err(t) => t,
    };
    assert!(
        upgraded.is_ok(),
        "compute1 and compute2 never upgraded: {:?} runs of v2:\n{so_far}",
        f.runs().iter().filter(|r| r.version == "v2").count()
    );
}

/// Bad bytes in a targeted host's inbox: the host counts as admitted (the safe
/// reading) and the command waits for it, naming the key; once the key is
/// repaired the command finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_targeted_host_with_an_unreadable_inbox_waits_named_until_repaired() {
    let (_etcd, url, a, f) = action_fleet(&["compute1", "compute2"]).await;
    etcdctl_put(&url, b"/config_state/commands/compute2", b"\xff");
    let follower = spawn(&url, &["run", "--role", "compute", "restart"]);
    wait_started(&a, "compute1").await;
    let s = open(&url).await;
    let id = a.runs()[0].version.clone();
    wait_for("compute1's result", secs(30), || async {
        result_of(&url, &id, "compute1").await.is_some()
    })
    .await;
    tokio::time::sleep(secs(1)).await;
    let shown = run_bounded(&url, &["--json", "commands", "show", &id]).await;
    assert_eq!(shown.status.code(), Some(0), "{}", text(&shown));
    assert!(
        text(&shown).contains("/config_state/commands/compute2"),
        "{}",
        text(&shown)
    );
    assert!(!a.runs().iter().any(|r| r.host == "compute2"), "{}", a.log());
    s.delete(&jio_common::keys::Key::new("/config_state/commands/compute2").unwrap())
        .await
        .unwrap();
    let out = finish(follower, secs(60)).await;
    assert_exit(&out, 0, &f, &a);
    assert_eq!(a.runs().len(), 2, "{}", a.log());
}

/// Bad bytes written into a command's own record while the driver service drives
/// it: the service lives on and drives the next command; `commands show` names the
/// key; the agents live on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_corrupted_mid_command_is_named_and_the_driver_service_goes_on() {
    let names = ["compute1", "compute2", "compute3"];
    let (_etcd, url, a, mut f) = action_fleet(&names).await;
    a.set_seconds(1.5);
    let mut drive = spawn(&url, &["drive", "--lease", "3s"]);
    let rec = run_bounded(
        &url,
        &[
            "run",
            "--detach",
            "--hosts",
            "compute1,compute2",
            "--instructions",
            GLOBAL_ONE,
            "restart",
        ],
    )
    .await;
    assert_eq!(rec.status.code(), Some(0), "{}", text(&rec));
    let id = String::from_utf8_lossy(&rec.stdout).trim().to_string();
    wait_started(&a, "compute1").await;
    etcdctl_put(&url, format!("/commands/{id}").as_bytes(), b"\xff\xfe");
    wait_for("compute1's result", secs(30), || async {
        result_of(&url, &id, "compute1").await.is_some()
    })
    .await;
    let shown = run_bounded(&url, &["commands", "show", &id]).await;
    assert_eq!(shown.status.code(), Some(1), "{}", text(&shown));
    assert!(
        text(&shown).contains(&format!("/commands/{id}")),
        "{}",
        text(&shown)
    );
    // The rest goes on: the service drives a new command on compute3.
    a.set_seconds(0.2);
    let rec = run_bounded(&url, &["run", "--detach", "--hosts", "compute3", "restart"]).await;
    let id3 = String::from_utf8_lossy(&rec.stdout).trim().to_string();
    wait_for("the next command to end", secs(30), || async {
        result_of(&url, &id3, "compute3").await.is_some()
    })
    .await;
    assert!(drive.try_wait().unwrap().is_none(), "the driver service ended");
    for (i, d) in f.daemons.iter_mut().enumerate() {
        assert!(d.try_wait().unwrap().is_none(), "agent {} ended", names[i]);
    }
    assert!(
        !a.runs().iter().any(|r| r.host == "compute2"),
        "compute2 ran a command whose record cannot be read: {}",
        a.log()
    );
}

/// Found: bad bytes in `/command_runs/<id>/logs/<host>` are dropped silently by
/// `Runs::from_kvs`: `commands show` never names the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_log_link_is_named_by_commands_show() {
    let (_etcd, url, _a, _f) = action_fleet(&["compute1"]).await;
    let out = run_bounded(&url, &["run", "--hosts", "compute1", "restart"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let id = command_id(&text(&out));
    let key = format!("/command_runs/{id}/logs/compute1");
    etcdctl_put(&url, key.as_bytes(), b"\xff\xfe");
    let shown = run_bounded(&url, &["commands", "show", &id]).await;
    assert_eq!(shown.status.code(), Some(0), "{}", text(&shown));
    let json = run_bounded(&url, &["--json", "commands", "show", &id]).await;
    assert!(
        text(&shown).contains(&key) || text(&json).contains(&key),
        "the unreadable log link is not named:\n{}\n{}",
        text(&shown),
        text(&json)
    );
}

/// Found: an admission naming a command whose record is gone (deleted by hand, or
/// by a tool) holds its host in flight for ever: every command (and upgrade) on
/// the host waits "busy: admitted to fleet command X", the agent skips the id,
/// the driver service follows only ids with a record, and `commands cancel X`
/// fails ("no fleet command"): only an etcdctl by hand frees the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_to_a_command_whose_record_is_gone_does_not_hold_the_host_for_ever() {
    let (_etcd, url, a, f) = action_fleet(&["compute1"]).await;
    let gone = "20261001T000000Z-gone";
    let s = open(&url).await;
    s.put(
        &Key::new("/config_state/commands/compute1").unwrap(),
        &format!(r#"["{gone}"]"#),
        None,
    )
    .await
    .unwrap();
    let drive = spawn(&url, &["drive", "--lease", "3s"]);
    let cancel = run_bounded(&url, &["commands", "cancel", gone]).await;
    let p = spawn(&url, &["run", "--hosts", "compute1", "restart"]);
    let out = finish_or_kill(p, secs(20)).await;
    drop(drive);
    let inbox = inbox_of(&url, "compute1").await;
    let out = out.unwrap_or_else(|so_far| {
        panic!(
            "compute1 is held for ever by an admission to {gone}, which has no record (inbox {inbox:?}); `commands cancel {gone}` said: {}\n{so_far}\n{}",
            text(&cancel),
            diagnostics(&f, &a)
        )
    });
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}
