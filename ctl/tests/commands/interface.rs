//! What operators type and read: bad input refused with nothing written, actions
//! that are not installed, `--json` shapes, the history kept, and Consul.

use super::*;

/// A finished command's record, as an older `jioctl` would have left it.
fn finished_record(at: u64, host: &str) -> CommandRecord {
    CommandRecord {
        id: CommandId::new(at, "old", 1),
        action: "old".into(),
        args: vec![],
        targets: Targets::Hosts(vec![HostName::new(host).unwrap()]),
        hosts: vec![HostName::new(host).unwrap()],
        rules: serde_json::json!({}),
        timeout_s: None,
        rerun_interrupted: false,
        created_by: "alice@laptop".into(),
        created_at: at,
        state: CommandState::Done,
        changes: vec![],
    }
}

/// Writes `n` finished commands (each with a result under `/command_runs/`), the
/// oldest first; returns their ids.
async fn seed_history(url: &str, n: u64) -> Vec<String> {
    let s = open(url).await;
    let mut ids = Vec::new();
    for i in 0..n {
        let rec = finished_record(1_700_000_000 + i * 60, "compute1");
        let id = rec.id.to_string();
        s.put(
            &Key::new(format!("/commands/{id}")).unwrap(),
            &serde_json::to_string(&rec).unwrap(),
            None,
        )
        .await
        .unwrap();
        s.put(
            &Key::new(format!("/command_runs/{id}/results/compute1")).unwrap(),
            r#"{"outcome":"succeeded","exit_code":0,"started":1,"ended":2,"attempt":1}"#,
            None,
        )
        .await
        .unwrap();
        ids.push(id);
    }
    ids
}

// ---------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------

/// Bad host names, unknown hosts and roles, rollout-only or broken rules, bad
/// timeouts, unknown ids, `logs --command` without Swift: each refused with its
/// exit code and the value named, and nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_naming_the_value_and_nothing_is_written() {
    let (_etcd, url, _a, _f) = action_fleet(&["compute1", "controller1"]).await;
    let unknown = "20261125T000000Z-nope";
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (
            vec!["run", "--hosts", "compute1,nosuch9", "restart"],
            64,
            "nosuch9",
        ),
        (vec!["run", "--hosts", "Bad_Host!", "restart"], 64, "Bad_Host!"),
        (vec!["run", "--role", "nosuchrole", "restart"], 64, "nosuchrole"),
        (
            vec!["run", "--all", "--instructions", r#"{"canary": 1}"#, "restart"],
            3,
            "canary",
        ),
        (
            vec!["run", "--all", "--instructions", r#"{"stages": []}"#, "restart"],
            3,
            "stages",
        ),
        (
            vec![
                "run",
                "--all",
                "--instructions",
                r#"{"progress_deadline": "5m"}"#,
                "restart",
            ],
            3,
            "progress_deadline",
        ),
        (
            vec!["run", "--all", "--instructions", "{not json", "restart"],
            3,
            "malformed JSON",
        ),
        (
            vec![
                "run",
                "--all",
                "--instructions",
                r#"{"rolling_rules": {"global": -1}}"#,
                "restart",
            ],
            3,
            "global",
        ),
        (
            vec!["run", "--all", "--instructions", r#"{"rolling": {}}"#, "restart"],
            3,
            "rolling",
        ),
        (
            vec!["run", "--all", "--timeout", "0s", "restart"],
            64,
            "--timeout",
        ),
        (
            vec!["run", "--all", "--timeout", "banana", "restart"],
            64,
            "banana",
        ),
        (vec!["run", "restart"], 64, "--all"),
        (vec!["run", "--all", ""], 64, "empty"),
        (vec!["run", "--all", "--role", "compute", "restart"], 64, "--role"),
        (
            vec![
                "run",
                "--all",
                "--instructions-file",
                "/nonexistent/rules.json",
                "restart",
            ],
            64,
            "/nonexistent/rules.json",
        ),
        (vec!["commands", "show", "not-an-id"], 64, "not-an-id"),
        (vec!["commands", "show", unknown], 1, unknown),
        (vec!["commands", "follow", unknown], 1, unknown),
        (vec!["commands", "cancel", unknown], 1, unknown),
        // What the store says comes before asking for Swift credentials.
        (
            vec!["logs", "--command", unknown, "compute1"],
            1,
            "no fleet command",
        ),
        (vec!["logs", "--command", "garbage", "compute1"], 64, "garbage"),
    ];
    let mut wrong = Vec::new();
    for (args, code, names) in &cases {
        let out = run(&url, args).await;
        let t = text(&out);
        if out.status.code() != Some(*code) || !t.contains(names) {
            wrong.push(format!(
                "jioctl {args:?}: exit {:?} (want {code}), output must name {names:?}:\n{t}",
                out.status.code()
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let s = open(&url).await;
    for prefix in ["/commands/", "/command_runs/", "/config_state/commands/"] {
        let left = keys_under(&s, prefix).await;
        assert!(left.is_empty(), "bad input wrote under {prefix}: {left:?}");
    }
}

/// Found: a role misspelt in a command's rolling rules (`comptue`) is neither
/// refused nor warned about: the command runs with no limit at all, every host at
/// once. (`jioctl upgrade` at least warns, naming it; `fleet_commands::create`
/// drops `Resolved::warnings` and resolves against the command's own roles only.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misspelt_role_in_a_commands_rules_is_named_not_silently_dropped() {
    let names = ["compute1", "compute2", "compute3"];
    let (_etcd, url, a, f) = action_fleet(&names).await;
    a.set_seconds(1.0);
    let out = run_bounded(
        &url,
        &on_computes(r#"{"rolling_rules": {"roles": {"comptue": 1}}}"#, &["restart"]),
    )
    .await;
    let (n, at) = max_overlap(&a.runs());
    assert!(
        text(&out).contains("comptue"),
        "the misspelt role is never named (exit {:?}); {n} hosts ran at once ({at:?}):\n{}\n{}",
        out.status.code(),
        text(&out),
        diagnostics(&f, &a)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_that_are_not_installed_are_refused_and_allow_any_command_runs_an_argument_list() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    // closed1 keeps the default (only installed actions); open1 allows any command.
    let f = Fleet::start_with(&url, &url, &["closed1", "open1"], 0.1, |h| a.config(h == "open1")).await;
    let marker = a.path("any.log");
    // An action that is installed nowhere: refused on closed1, with the reason.
    let out = run_bounded(&url, &["run", "--all", "flush-caches"]).await;
    assert_exit(&out, 1, &f, &a);
    let id = command_id(&text(&out));
    let refused = result_of(&url, &id, "closed1").await.unwrap();
    assert_eq!(refused["outcome"], "refused", "{refused:#}");
    let msg = refused["message"].as_str().unwrap();
    assert!(
        msg.contains("not installed") && msg.contains("allow_any_command is off"),
        "{msg}"
    );
    // On open1 it runs as a program, which does not exist: failed, not refused.
    let open = result_of(&url, &id, "open1").await.unwrap();
    assert_eq!(open["outcome"], "failed", "{open:#}");
    // An argument list: refused where it is off (never run), run where it is on.
    let out = run_bounded(
        &url,
        &[
            "run",
            "--all",
            "/bin/sh",
            "-c",
            &format!("echo \"$JIO_HOST\" >> {}", marker.display()),
        ],
    )
    .await;
    assert_exit(&out, 1, &f, &a);
    let id = command_id(&text(&out));
    let ran = std::fs::read_to_string(&marker).unwrap_or_default();
    assert_eq!(ran, "open1\n", "only the host that allows any command ran it");
    let refused = result_of(&url, &id, "closed1").await.unwrap();
    assert_eq!(refused["outcome"], "refused", "{refused:#}");
    assert!(
        refused["message"].as_str().unwrap().contains("allow_any_command"),
        "{refused:#}"
    );
    assert_eq!(
        result_of(&url, &id, "open1").await.unwrap()["outcome"],
        "succeeded"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("1 of 2 hosts succeeded"), "{stdout}");
}

// ---------------------------------------------------------------------------
// Output and exit codes
// ---------------------------------------------------------------------------

/// `--json` of `run`, `commands show` and `commands list`, and `run --detach
/// --json`: the shapes docs/jioctl.md and docs/fleet-commands.md give.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_output_has_the_documented_shapes() {
    let (_etcd, url, a, f) = action_fleet(&["compute1", "compute2"]).await;
    a.fail("compute2");
    let out = run_bounded(
        &url,
        &[
            "--json",
            "run",
            "--role",
            "compute",
            "--instructions",
            r#"{"max_failures": 1}"#,
            "restart",
        ],
    )
    .await;
    assert_exit(&out, 1, &f, &a);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("run --json is not one JSON object ({e}):\n{}", text(&out)));
    for k in ["command", "hosts", "counts", "finished", "problems"] {
        assert!(v.get(k).is_some(), "run --json lacks {k}: {v}");
    }
    let id = v["command"]["id"].as_str().unwrap().to_string();
    assert_eq!(v["finished"], true, "{v}");
    assert_eq!(v["counts"]["succeeded"], 1, "{v}");
    assert_eq!(v["counts"]["failed"], 1, "{v}");
    let h2 = v["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["host"] == "compute2")
        .unwrap();
    assert_eq!(h2["role"], "compute", "{h2}");
    assert_eq!(h2["phase"], "failed", "{h2}");
    assert_eq!(h2["exit_code"], 3, "{h2}");
    assert!(
        h2["reason"].as_str().unwrap_or("").contains("did not come back"),
        "{h2}"
    );
    assert!(h2["run_dir"].is_string(), "{h2}");
    let show = run_bounded(&url, &["--json", "commands", "show", &id]).await;
    assert_eq!(show.status.code(), Some(0), "{}", text(&show));
    let s: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(s["hosts"], v["hosts"], "show --json and run --json differ");
    let list = run_bounded(&url, &["--json", "commands", "list"]).await;
    let l: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(l[0]["id"], id.as_str(), "{l}");
    assert_eq!(l[0]["state"], "failed", "{l}");
    let det = run_bounded(
        &url,
        &["--json", "run", "--detach", "--hosts", "compute1", "restart"],
    )
    .await;
    assert_eq!(det.status.code(), Some(0), "{}", text(&det));
    let d: serde_json::Value = serde_json::from_slice(&det.stdout).unwrap();
    assert_eq!(d["command"]["state"], "running", "{d}");
}

// ---------------------------------------------------------------------------
// History
// ---------------------------------------------------------------------------

/// 105 finished commands in the store: one more command keeps the newest 99 of
/// them and itself (100), deleting the oldest 6 with their runs, and no other run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_keeps_the_last_hundred_and_deletes_the_oldest_with_their_runs() {
    let (_etcd, url, a, f) = action_fleet(&["compute1"]).await;
    let ids = seed_history(&url, 105).await;
    let out = run_bounded(&url, &["run", "--hosts", "compute1", "restart"]).await;
    assert_exit(&out, 0, &f, &a);
    let new = command_id(&text(&out));
    let s = open(&url).await;
    let records = keys_under(&s, "/commands/").await;
    let runs = keys_under(&s, "/command_runs/").await;
    assert_eq!(records.len(), 100, "{:?}", records.keys().collect::<Vec<_>>());
    assert!(records.contains_key(&format!("/commands/{new}")));
    for (i, id) in ids.iter().enumerate() {
        let kept = i >= 6;
        assert_eq!(
            records.contains_key(&format!("/commands/{id}")),
            kept,
            "record {i} {id}"
        );
        assert_eq!(
            runs.contains_key(&format!("/command_runs/{id}/results/compute1")),
            kept,
            "runs of {i} {id}"
        );
    }
    let list = run(&url, &["--json", "commands", "list", "--limit", "500"]).await;
    let v: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 100, "{}", text(&list));
    assert_eq!(v[0]["id"], new.as_str(), "newest first");
}

/// Found: pruning the history is one transaction holding every deletion (two
/// operations per command, plus the new record), never split to what the store
/// takes. More than 100 finished commands can build up between two creations
/// (commands active when the last one was created end later: e.g. 70 detached
/// commands, one per host, then cancelled), and past 63 to delete the transaction
/// exceeds etcd's 128 operations (Consul's 64 past 31): every `jioctl run` fails
/// from then on, and nothing is pruned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_history_is_pruned_in_transactions_the_store_takes() {
    let (_etcd, url, a, f) = action_fleet(&["compute1"]).await;
    seed_history(&url, 170).await;
    let out = run_bounded(&url, &["run", "--hosts", "compute1", "restart"]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "a command cannot be created once 170 finished commands are stored:\n{}\n{}",
        text(&out),
        diagnostics(&f, &a)
    );
    // At most 20 of the oldest go with each new command: 170 + 1 - 20.
    let s = open(&url).await;
    assert_eq!(keys_under(&s, "/commands/").await.len(), 151);
    // The next commands shrink it further, each within what the store takes.
    for _ in 0..3 {
        let out = run_bounded(&url, &["run", "--hosts", "compute1", "restart"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    }
    assert_eq!(keys_under(&s, "/commands/").await.len(), 100);
}

/// On Consul with ACLs (the Consul API test server), the agents under docs/tls-and-users.md's
/// `jio-agent` policy: each host runs the command once, at its first attempt (a
/// start's compare on keys it writes itself stays in its transaction), under the
/// limit, by the action's own log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_on_consul_runs_once_per_host_under_the_agents_policy() {
    use jio_tests::consul::{AclToken, ConsulOptions, ConsulServer};
    let server = ConsulServer::start(ConsulOptions {
        token: Some("operator-c0ffee-secret".into()),
        tokens: vec![AclToken::jio_agent("agent-c0ffee-secret")],
        ..ConsulOptions::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let url = server.url_with_token(dir.path(), "operator.token", "operator-c0ffee-secret");
    let agents_url = server.url_with_token(dir.path(), "agent.token", "agent-c0ffee-secret");
    let a = Actions::new();
    let names = ["compute1", "compute2", "compute3"];
    let f = Fleet::start_with(&url, &agents_url, &names, 0.1, |_| a.config(false)).await;
    let follower = spawn(
        &url,
        &on_computes(
            r#"{"rolling_rules": {"roles": {"compute": 1}}}"#,
            &["restart", "nova"],
        ),
    );
    let out = finish(follower, secs(60)).await;
    assert_exit(&out, 0, &f, &a);
    let id = command_id(&text(&out));
    let runs = a.runs();
    assert_eq!(runs.len(), 3, "{}", a.log());
    assert!(repeated(&runs, &id).is_empty(), "{}", a.log());
    assert_eq!(max_overlap(&runs).0, 1, "{}", a.log());
    for h in names {
        let r = result_of(&url, &id, h).await.unwrap();
        assert_eq!(r["outcome"], "succeeded", "{r:#}");
        assert_eq!(r["attempt"], 1, "{r:#}");
    }
}
