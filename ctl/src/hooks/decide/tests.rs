use super::*;
use jio_common::keys::Key;
use jio_common::store::KeyValue;

const NOW: u64 = 1_795_400_000;

fn kv(key: &str, value: &str, rev: i64) -> KeyValue {
    KeyValue::from_bytes(Key::new(key).unwrap(), value.as_bytes().to_vec(), 1, rev, 1, None)
}

fn h(s: &str) -> HostName {
    HostName::new(s).unwrap()
}

fn rollout() -> RolloutRecord {
    RolloutRecord::start(
        Version::new("v2").unwrap(),
        None,
        serde_json::json!({}),
        "t",
        1_795_399_200,
    )
}

fn record(hook: HookKind, state: HookState, attempt: u32) -> HookRecord {
    let r = rollout();
    let mut rec = HookRecord::start(
        r.id.as_str(),
        &r.version,
        &Role::new("compute").unwrap(),
        hook,
        "mgmt1-1",
        NOW - 60,
    );
    rec.state = state;
    rec.attempt = attempt;
    rec
}

/// cp1 (compute, hooks) and db1 (no hooks) in the rollout, with `extra` keys.
fn snap(extra: &[(&str, String)]) -> Snapshot {
    let r = rollout();
    let reg =
        |role: &str| format!(r#"{{"role":"{role}","agent_version":"1","addresses":[],"first_seen":1}}"#);
    let mut kvs = vec![
        kv("/current_version", "v2", 2),
        kv("/config_state/enable_puppet/global", "false", 2),
        kv("/rollouts/current", r.id.as_str(), 3),
        kv(
            &format!("/rollouts/{}", r.id),
            &serde_json::to_string(&r).unwrap(),
            3,
        ),
        kv("/hosts/cp1", &reg("compute"), 1),
        kv("/hosts/db1", &reg("db"), 1),
        kv(
            "/agents/cp1",
            r#"{"state":"idle","version":"v1","since":1,"pid":1}"#,
            1,
        ),
    ];
    kvs.extend(extra.iter().map(|(k, v)| kv(k, v, 7)));
    Snapshot::from_kvs(&Schema::default(), &kvs)
}

fn hook_kv(rec: &HookRecord) -> (&'static str, String) {
    ("/hooks/cp1", serde_json::to_string(rec).unwrap())
}

fn roles(before: bool, after: bool) -> BTreeMap<Role, HookSpec> {
    let argv = |p: &str| Some(vec![p.to_string()]);
    BTreeMap::from([(
        Role::new("compute").unwrap(),
        HookSpec {
            before: before.then(|| argv("/hooks/before")).flatten(),
            after: after.then(|| argv("/hooks/after")).flatten(),
            timeout: Duration::from_secs(60),
        },
    )])
}

fn done(hook: HookKind, attempt: u32, result: Result<(), String>) -> Local {
    Local::Done(Done {
        key: RunKey {
            rollout: rollout().id.to_string(),
            hook,
            attempt,
        },
        result,
        exit_code: Some(3),
        ended: NOW,
        log: Some("/var/lib/jioctl/hooks/x.log".into()),
        tail: "2 instances left".into(),
    })
}

fn running(hook: HookKind, attempt: u32) -> Local {
    Local::Running(RunKey {
        rollout: rollout().id.to_string(),
        hook,
        attempt,
    })
}

/// The written values by key, the starts as `hook/attempt`, and the notes.
fn shape(d: &Decided) -> (BTreeMap<String, String>, Vec<String>, String) {
    let writes = d
        .ops
        .iter()
        .filter_map(|o| match o {
            Op::Put { key, value, .. } => Some((key.to_string(), value.clone())),
            _ => None,
        })
        .collect();
    let starts = d
        .starts
        .iter()
        .map(|s| format!("{}/{}", s.key.hook, s.key.attempt))
        .collect();
    (
        writes,
        starts,
        [d.notes.clone(), d.cannot.clone()].concat().join("; "),
    )
}

fn decide(extra: &[(&str, String)], roles: &BTreeMap<Role, HookSpec>, local: Option<Local>) -> Decided {
    let (schema, s, r) = (Schema::default(), snap(extra), rollout());
    let local: BTreeMap<HostName, Local> = local.into_iter().map(|l| (h("cp1"), l)).collect();
    progress(&Pass {
        schema: &schema,
        snap: &s,
        rec: &r,
        roles,
        local: &local,
        me: "mgmt2-9",
        now: NOW,
    })
}

#[test]
fn a_finished_before_hook_is_recorded_and_enables_the_host_only_when_it_succeeded() {
    let rec = record(HookKind::Before, HookState::Running, 1);
    let d = decide(
        &[hook_kv(&rec)],
        &roles(true, true),
        Some(done(HookKind::Before, 1, Ok(()))),
    );
    let (w, starts, says) = shape(&d);
    assert!(w["/hooks/cp1"].contains(r#""state":"succeeded""#), "{w:?}");
    assert_eq!(
        w.get("/config_state/enable_puppet/host/cp1").map(String::as_str),
        Some("true")
    );
    assert!(
        starts.is_empty() && says.contains("before hook succeeded"),
        "{says}"
    );
    assert_eq!(d.forget, vec![h("cp1")]);
    // Fenced on the record as read and on the rollout still current.
    let fenced: Vec<String> = d
        .compares
        .iter()
        .map(|c| match c {
            Compare::ModRevision(k, rev) => format!("{k}@{rev}"),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(fenced, vec!["/hooks/cp1@7", "/rollouts/current@3"]);
    let d = decide(
        &[hook_kv(&rec)],
        &roles(true, true),
        Some(done(HookKind::Before, 1, Err("exited 3".into()))),
    );
    let (w, _, says) = shape(&d);
    assert!(
        !w.contains_key("/config_state/enable_puppet/host/cp1"),
        "a failed before never enables: {w:?}"
    );
    let failed: HookRecord = serde_json::from_str(&w["/hooks/cp1"]).unwrap();
    assert_eq!(failed.state, HookState::Failed);
    assert_eq!(
        failed.message.as_deref(),
        Some("2 instances left"),
        "the exit code is in the record"
    );
    assert!(says.contains("counts as failed"), "{says}");
}

#[test]
fn a_hook_left_running_runs_again_and_one_running_here_is_left_alone() {
    let rec = record(HookKind::Before, HookState::Running, 1);
    // (local run, roles) -> starts, what it says
    let cases = [
        (
            None,
            roles(true, true),
            vec!["before/2"],
            "left running by mgmt1-1 (attempt 1); running it again",
        ),
        (Some(running(HookKind::Before, 1)), roles(true, true), vec![], ""),
        // Ended runs of this process wait for the record (it shows a later run).
        (Some(running(HookKind::Before, 2)), roles(true, true), vec![], ""),
        (
            None,
            BTreeMap::new(),
            vec![],
            "this driver has no before hook for role compute",
        ),
    ];
    for (local, roles, want, says) in cases {
        let case = format!("{local:?}");
        let d = decide(&[hook_kv(&rec)], &roles, local);
        let (w, starts, said) = shape(&d);
        assert_eq!(starts, want, "{case}");
        assert!(said.contains(says), "{case}: {said}");
        if !want.is_empty() {
            let again: HookRecord = serde_json::from_str(&w["/hooks/cp1"]).unwrap();
            assert_eq!((again.attempt, again.driver.as_str()), (2, "mgmt2-9"), "{case}");
        }
    }
}

#[test]
fn the_after_hook_starts_once_the_drained_host_reported_success() {
    let drained = record(HookKind::Before, HookState::Succeeded, 1);
    let at_v2 = ("/running/versions/v2/cp1", "1".to_string());
    let agent_busy = (
        "/agents/cp1",
        r#"{"state":"upgrading","version":"v2","since":1,"pid":1}"#.to_string(),
    );
    // (keys, roles, local) -> starts, the after record's state
    let cases = [
        (vec![hook_kv(&drained)], roles(true, true), None, vec![], None),
        (
            vec![hook_kv(&drained), at_v2.clone(), agent_busy],
            roles(true, true),
            None,
            vec![],
            None,
        ),
        (
            vec![hook_kv(&drained), at_v2.clone()],
            roles(true, true),
            None,
            vec!["after/1"],
            Some("running"),
        ),
        (
            vec![hook_kv(&drained), at_v2.clone()],
            roles(true, false),
            None,
            vec![],
            Some("succeeded"),
        ),
        // This process started it already; the record does not show it yet.
        (
            vec![hook_kv(&drained), at_v2.clone()],
            roles(true, true),
            Some(running(HookKind::After, 1)),
            vec![],
            None,
        ),
    ];
    for (keys, roles, local, want, state) in cases {
        let case = format!("{keys:?} {local:?}");
        let d = decide(&keys, &roles, local);
        let (w, starts, _) = shape(&d);
        assert_eq!(starts, want, "{case}");
        let rec = w
            .get("/hooks/cp1")
            .map(|v| serde_json::from_str::<HookRecord>(v).unwrap());
        assert_eq!(rec.as_ref().map(|r| r.state.as_str()), state, "{case}");
        assert!(rec.is_none_or(|r| r.hook == HookKind::After), "{case}");
        assert!(!w.contains_key("/config_state/enable_puppet/host/cp1"), "{case}");
    }
}

#[test]
fn admissions_of_hooked_roles_start_their_before_hook_instead_of_enabling() {
    let (schema, r) = (Schema::default(), rollout());
    let local = BTreeMap::new();
    // (keys, roles) -> enable keys the plan keeps, starts, records' states
    let cases = [
        (
            vec![],
            roles(true, true),
            vec!["db1"],
            vec!["before/1"],
            Some("running"),
        ),
        (vec![], roles(false, true), vec!["db1"], vec![], Some("succeeded")),
        (vec![], BTreeMap::new(), vec!["cp1", "db1"], vec![], None),
        // Drained and disarmed: enabled again, its hook not run again.
        (
            vec![hook_kv(&record(HookKind::Before, HookState::Succeeded, 1))],
            roles(true, true),
            vec!["cp1", "db1"],
            vec![],
            None,
        ),
    ];
    for (keys, roles, kept, want, state) in cases {
        let s = snap(&keys);
        let mut plan = Plan {
            enable_hosts: vec![h("cp1"), h("db1")],
            ..Plan::default()
        };
        let d = admissions(
            &Pass {
                schema: &schema,
                snap: &s,
                rec: &r,
                roles: &roles,
                local: &local,
                me: "mgmt2-9",
                now: NOW,
            },
            &mut plan,
        );
        let case = format!("{keys:?} {roles:?}");
        let (w, starts, _) = shape(&d);
        assert_eq!(
            plan.enable_hosts.iter().map(|h| h.as_str()).collect::<Vec<_>>(),
            kept,
            "{case}"
        );
        assert_eq!(starts, want, "{case}");
        let rec = w
            .get("/hooks/cp1")
            .map(|v| serde_json::from_str::<HookRecord>(v).unwrap());
        assert_eq!(rec.as_ref().map(|r| r.state.as_str()), state, "{case}");
        // Enabled at once only without a before hook.
        assert_eq!(
            w.contains_key("/config_state/enable_puppet/host/cp1"),
            state == Some("succeeded"),
            "{case}"
        );
    }
}
