//! The rolling planner's admission on snapshots built by hand: holds on enabled
//! hosts, clock skew between agents and the driver, soaks, lost soaking hosts and
//! canaries, canary rules, windows, percentages, and the snapshot's read order.
//! Each test once failed on a defect that is now fixed.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod fixtures;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fixtures::{kv, kv_at};
use jio_common::fleet::{HostState, HostStatus, Snapshot, classify};
use jio_common::keys::{Key, Schema};
use jio_common::names::{HostName, Role, Version};
use jio_common::plan::{Context, GroupAction, Plan, ReasonCode, plan};
use jio_common::rollout::RolloutRecord;
use jio_common::rules::{Limit, Rules};
use jio_common::store::{DynStore, KeyValue};

/// 2026-11-23T12:00:00Z, a Monday.
const NOW: u64 = 1_795_435_200;
const IDLE: &str = r#"{"state":"idle","version":"v1","since":1,"pid":1}"#;
const HOLD: &str = r#"{"by":"sre@laptop","reason":"disk","at":1795435100}"#;
/// The id of a rollout to v2 that ran the day before (another rollout's runs).
const OLDER_ROLLOUT: &str = "20261122T000000Z-v2";

fn host(kvs: &mut Vec<KeyValue>, h: &str, role: &str, alive: bool) {
    kvs.push(kv(
        &format!("/hosts/{h}"),
        &format!(r#"{{"role":"{role}","agent_version":"1","addresses":[],"first_seen":1}}"#),
    ));
    if alive {
        kvs.push(kv(&format!("/agents/{h}"), IDLE));
    }
}

/// A validated v2 result, as an agent writes it (`at`, `checked_at`: its clock;
/// `rollout`: the rollout current when its run started).
fn result(at: u64, checked_at: Option<u64>, rollout: Option<&str>) -> String {
    let checked = checked_at
        .map(|c| format!(r#","checked_at":{c}"#))
        .unwrap_or_default();
    let rollout = rollout
        .map(|r| format!(r#","rollout":"{r}""#))
        .unwrap_or_default();
    format!(r#"{{"version":"v2","ok":true,"at":{at}{checked}{rollout},"attempt":1}}"#)
}

/// `h` runs v2, with its agent's result.
fn upgraded(kvs: &mut Vec<KeyValue>, h: &str, at: u64, checked_at: Option<u64>, rollout: Option<&str>) {
    kvs.push(kv(&format!("/running/versions/v2/{h}"), &at.to_string()));
    kvs.push(kv(&format!("/results/{h}"), &result(at, checked_at, rollout)));
}

fn base() -> Vec<KeyValue> {
    vec![
        kv("/current_version", "v2"),
        kv("/config_state/enable_puppet/global", "false"),
    ]
}

fn rollout(rules: &str, started: u64) -> RolloutRecord {
    RolloutRecord::start(
        Version::new("v2").unwrap(),
        Some(Version::new("v1").unwrap()),
        serde_json::from_str(rules).unwrap(),
        "alice@laptop",
        started,
    )
}

fn plan_of(snap: &Snapshot, rules: &str, rec: &RolloutRecord, now: u64) -> (Plan, Vec<HostStatus>) {
    let hosts = classify(snap);
    let roles: BTreeSet<Role> = hosts.iter().map(|h| h.role.clone()).collect();
    let resolved = Rules::parse(rules).unwrap().resolve(&roles).unwrap();
    let p = plan(
        snap,
        &hosts,
        &resolved,
        &Context {
            now,
            rollout: Some(rec),
            host_keys_only: false,
            busy_outside: &[],
            hook_roles: &[],
        },
    );
    (p, hosts)
}

fn run(kvs: &[KeyValue], rules: &str, rec: &RolloutRecord, now: u64) -> (Plan, Vec<HostStatus>) {
    plan_of(&Snapshot::from_kvs(&Schema::default(), kvs), rules, rec, now)
}

fn names(v: &[HostName]) -> Vec<&str> {
    v.iter().map(|h| h.as_str()).collect()
}

fn code(p: &Plan, h: &str) -> Option<ReasonCode> {
    p.reasons.get(&HostName::new(h).unwrap()).map(|r| r.code)
}

/// The plan starts `h`: by its host key, or by opening its role's key.
fn admitted(p: &Plan, h: &str) -> bool {
    code(p, h) == Some(ReasonCode::Admitted)
        && (p.enable_hosts.iter().any(|n| n.as_str() == h) || !p.enable_roles.is_empty())
}

fn status<'a>(hosts: &'a [HostStatus], h: &str) -> &'a HostStatus {
    hosts.iter().find(|s| s.host.as_str() == h).unwrap()
}

/// A held host that is still enabled (by its host, role or the global key) and not
/// running keeps its slot, and the plan sets its host key to false; once it is
/// disabled and the hold released, the group stays within its limit.
#[test]
fn a_hold_on_an_enabled_host_keeps_its_slot_and_the_plan_disables_it() {
    let rules = r#"{"rolling_rules":{"roles":{"compute":1}}}"#;
    let rec = rollout(rules, NOW - 60);
    let fleet = || {
        let mut kvs = base();
        for h in ["compute1", "compute2", "compute3"] {
            host(&mut kvs, h, "compute", true);
        }
        kvs
    };
    // Enabled by each level in turn, held by its own hold or its role's.
    for (enable, hold) in [
        (
            "/config_state/enable_puppet/host/compute1",
            "/holds/host/compute1",
        ),
        ("/config_state/enable_puppet/host/compute1", "/holds/role/compute"),
        ("/config_state/enable_puppet/role/compute", "/holds/host/compute1"),
        ("/config_state/enable_puppet/global", "/holds/host/compute1"),
    ] {
        let mut kvs = fleet();
        kvs.retain(|kv| kv.key.as_str() != enable);
        kvs.push(kv(enable, "true"));
        kvs.push(kv(hold, HOLD));
        let (p, hosts) = run(&kvs, rules, &rec, NOW);
        let c1 = status(&hosts, "compute1");
        assert_eq!(c1.state, HostState::Upgrading, "{enable}, {hold}");
        let why = c1.reason.as_deref().unwrap();
        assert!(why.starts_with("held ("), "{enable}, {hold}: {why}");
        assert_eq!(names(&p.disable_hosts), ["compute1"], "{enable}, {hold}: {p:#?}");
        assert_eq!(code(&p, "compute1"), Some(ReasonCode::Held), "{enable}, {hold}");
        assert!(p.enable_hosts.is_empty(), "{enable}, {hold}: {p:#?}");
        assert!(p.enable_roles.is_empty(), "{enable}, {hold}: {p:#?}");
    }

    // Armed by a host key (a pass admitted it, its agent has not started), then
    // held: it keeps the group's only slot.
    let mut kvs = fleet();
    kvs.push(kv("/config_state/enable_puppet/host/compute1", "true"));
    kvs.push(kv("/holds/host/compute1", HOLD));
    let (p, _) = run(&kvs, rules, &rec, NOW);
    assert_eq!(code(&p, "compute2"), Some(ReasonCode::LimitReached), "{p:#?}");
    assert_eq!(code(&p, "compute3"), Some(ReasonCode::LimitReached));
    assert_eq!((p.groups[0].in_flight, p.groups[0].limit), (1, Some(1)));

    // The driver applied it (host key false): now pending and held, its slot goes
    // to compute2.
    let mut kvs = fleet();
    kvs.push(kv("/config_state/enable_puppet/host/compute1", "false"));
    kvs.push(kv("/holds/host/compute1", HOLD));
    let (p, hosts) = run(&kvs, rules, &rec, NOW);
    assert_eq!(status(&hosts, "compute1").state, HostState::Pending);
    assert!(p.disable_hosts.is_empty());
    assert_eq!(names(&p.held), ["compute1"]);
    assert_eq!(names(&p.enable_hosts), ["compute2"]);

    // compute2 is armed, then `jioctl release compute1` deletes the hold: compute1
    // stays disabled, one host in flight under a limit of 1.
    let mut kvs = fleet();
    kvs.push(kv("/config_state/enable_puppet/host/compute1", "false"));
    kvs.push(kv("/config_state/enable_puppet/host/compute2", "true"));
    let (p, hosts) = run(&kvs, rules, &rec, NOW);
    let moving: Vec<&str> = hosts
        .iter()
        .filter(|h| h.state.in_flight())
        .map(|h| h.host.as_str())
        .collect();
    assert_eq!(moving, ["compute2"]);
    assert_eq!((p.groups[0].in_flight, p.groups[0].limit), (1, Some(1)));
    assert!(p.enable_hosts.is_empty(), "{p:#?}");
    assert_eq!(code(&p, "compute1"), Some(ReasonCode::LimitReached));
}

/// Which runs are this rollout's is the rollout id the agent recorded, not a
/// comparison of its clock with the driver's: a canary whose agent's clock is behind
/// is still the canary, and a run of another rollout whose agent's clock is ahead is
/// not.
#[test]
fn a_canary_is_this_rollouts_run_by_the_id_its_result_records_not_by_clocks() {
    let rules = r#"{"rolling_rules":{"roles":{"compute":2}},"canary":{"compute":1}}"#;
    let started = NOW - 300;
    let rec = rollout(rules, started);
    let fleet = || {
        let mut kvs = base();
        for h in ["compute1", "compute2", "compute3", "compute4"] {
            host(&mut kvs, h, "compute", true);
        }
        kvs
    };
    // compute1 finished 2 minutes after the start by the driver's clock, but its
    // agent's clock is 10 minutes behind: its result predates the start.
    let mut kvs = fleet();
    upgraded(
        &mut kvs,
        "compute1",
        started + 120 - 600,
        None,
        Some(rec.id.as_str()),
    );
    let (p, _) = run(&kvs, rules, &rec, NOW);
    assert!(p.enable_hosts.is_empty() && p.enable_roles.is_empty(), "{p:#?}");
    let canary = p.canary.as_ref().unwrap();
    assert_eq!(names(&canary.canaries), ["compute1"]);
    for h in ["compute2", "compute3", "compute4"] {
        assert_eq!(code(&p, h), Some(ReasonCode::Canary), "{h}: {p:#?}");
    }
    assert_eq!(
        p.groups[0].action,
        GroupAction::Canary {
            canaries: 1,
            soaked_at: None
        }
    );

    // compute1 is at v2 from another rollout's run (or from an agent that records
    // no rollout), its agent's clock ahead: not this rollout's canary, so the canary
    // slot is still free.
    for other in [Some(OLDER_ROLLOUT), None] {
        let mut kvs = fleet();
        upgraded(&mut kvs, "compute1", NOW + 600, None, other);
        let (p, _) = run(&kvs, rules, &rec, NOW);
        assert_eq!(names(&p.enable_hosts), ["compute2"], "{other:?}: {p:#?}");
        assert_eq!(names(&p.canary.as_ref().unwrap().canaries), ["compute2"]);
    }
}

/// Under `min_healthy_time` a run of this rollout soaks until its agent reports a
/// check at least that long after the run's end, both on the agent's clock: the
/// driver's `now` plays no part, so skew cannot skip or stretch the soak.
#[test]
fn the_soak_is_judged_on_the_agents_clock_alone() {
    let rules = r#"{"rolling_rules":{"roles":{"compute":1}},"min_healthy_time":"1h"}"#;
    let rec = rollout(rules, NOW - 300);
    // Upgraded 2 minutes ago by the driver's clock; the agent's is 10 minutes
    // behind, so its run ended "before" the rollout started.
    let at = NOW - 120 - 600;
    for (checked, now, soaks) in [
        (None, NOW, true),
        (Some(at + 1800), NOW, true),
        // The driver's clock far ahead does not end the soak.
        (None, NOW + 10 * 86_400, true),
        (Some(at + 3599), NOW + 10 * 86_400, true),
        // A check an hour after the run by the agent's clock ends it, even if the
        // driver's clock is behind both.
        (Some(at + 3600), at - 86_400, false),
        (Some(at + 3600), NOW, false),
    ] {
        let mut kvs = base();
        for h in ["compute1", "compute2"] {
            host(&mut kvs, h, "compute", true);
        }
        upgraded(&mut kvs, "compute1", at, checked, Some(rec.id.as_str()));
        let (p, _) = run(&kvs, rules, &rec, now);
        let case = format!("checked {checked:?}, now {now}");
        if soaks {
            assert_eq!(names(&p.soaking), ["compute1"], "{case}: {p:#?}");
            let why = &p.reasons[&HostName::new("compute1").unwrap()];
            assert_eq!(why.code, ReasonCode::Soaking, "{case}");
            assert_eq!(why.at, Some(at + 3600), "{case}: {}", why.text);
            assert_eq!(code(&p, "compute2"), Some(ReasonCode::LimitReached), "{case}");
            assert!(p.enable_hosts.is_empty(), "{case}");
            assert!(p.waits_by_design(), "{case}");
        } else {
            assert!(p.soaking.is_empty(), "{case}: {p:#?}");
            assert!(admitted(&p, "compute2"), "{case}: {p:#?}");
        }
    }
}

/// A soaking host whose agent is gone is named lost (its soak cannot end without
/// it) and is no wait by design, so the progress deadline counts.
#[test]
fn a_soaking_host_without_an_agent_is_lost_and_no_wait_by_design() {
    let rules = r#"{"rolling_rules":{"roles":{"compute":1}},"min_healthy_time":"10m"}"#;
    let rec = rollout(rules, NOW - 86_400);
    for alive in [true, false] {
        let mut kvs = base();
        host(&mut kvs, "compute1", "compute", alive);
        host(&mut kvs, "compute2", "compute", true);
        // 22 hours ago, never checked since.
        upgraded(&mut kvs, "compute1", NOW - 80_000, None, Some(rec.id.as_str()));
        let (p, _) = run(&kvs, rules, &rec, NOW);
        assert_eq!(names(&p.soaking), ["compute1"], "alive {alive}");
        // It still holds its slot either way (the safe reading).
        assert_eq!(
            code(&p, "compute2"),
            Some(ReasonCode::LimitReached),
            "alive {alive}"
        );
        let why = &p.reasons[&HostName::new("compute1").unwrap()];
        if alive {
            assert_eq!(why.code, ReasonCode::Soaking);
            assert!(!p.lost_in_flight);
            assert!(p.waits_by_design());
        } else {
            assert_eq!(why.code, ReasonCode::Lost, "{}", why.text);
            assert!(why.text.contains("soak"), "{}", why.text);
            assert!(p.lost_in_flight);
            assert!(!p.waits_by_design(), "the progress deadline counts: {p:#?}");
        }
    }
}

/// A lost canary (armed, no agent) makes the plan lost in flight: the canary phase
/// no longer resets the progress deadline.
#[test]
fn a_lost_canary_is_no_wait_by_design() {
    let rules = r#"{"canary":{"compute":1}}"#;
    let rec = rollout(rules, NOW - 86_400);
    let mut kvs = base();
    host(&mut kvs, "compute1", "compute", false); // armed, agent gone
    host(&mut kvs, "compute2", "compute", true);
    host(&mut kvs, "controller1", "controller", true);
    kvs.push(kv("/config_state/enable_puppet/host/compute1", "true"));
    let (p, hosts) = run(&kvs, rules, &rec, NOW);
    assert_eq!(status(&hosts, "compute1").state, HostState::Lost);
    assert_eq!(code(&p, "compute1"), Some(ReasonCode::Lost));
    assert_eq!(code(&p, "compute2"), Some(ReasonCode::Canary));
    assert!(p.lost_in_flight);
    assert!(!p.waits_by_design(), "{p:#?}");
}

/// Under `min_healthy_time`, an upgraded host whose result cannot be read, or is
/// still for the previous version, soaks (the safe reading); one with no result at
/// all does not, and without `min_healthy_time` nothing soaks.
#[test]
fn an_unreadable_or_stale_result_soaks() {
    let mht = r#"{"rolling_rules":{"roles":{"compute":1}},"min_healthy_time":"1h"}"#;
    let plain = r#"{"rolling_rules":{"roles":{"compute":1}}}"#;
    let stale = r#"{"version":"v1","ok":true,"at":5,"attempt":1}"#;
    for (rules, res, soaks) in [
        (mht, Some("garbage"), true),
        (mht, Some(stale), true),
        (mht, None, false),
        (plain, Some("garbage"), false),
        (plain, Some(stale), false),
    ] {
        let rec = rollout(rules, NOW - 300);
        let mut kvs = base();
        for h in ["compute1", "compute2"] {
            host(&mut kvs, h, "compute", true);
        }
        kvs.push(kv("/running/versions/v2/compute1", "1"));
        if let Some(r) = res {
            kvs.push(kv("/results/compute1", r));
        }
        let snap = Snapshot::from_kvs(&Schema::default(), &kvs);
        if res == Some("garbage") {
            assert!(snap.problems.iter().any(|p| p.contains("/results/compute1")));
            assert!(snap.results_invalid.contains(&HostName::new("compute1").unwrap()));
        }
        let (p, _) = plan_of(&snap, rules, &rec, NOW);
        let case = format!("{rules} with result {res:?}");
        if soaks {
            assert_eq!(names(&p.soaking), ["compute1"], "{case}: {p:#?}");
            assert_eq!(code(&p, "compute1"), Some(ReasonCode::Soaking), "{case}");
            assert_eq!(code(&p, "compute2"), Some(ReasonCode::LimitReached), "{case}");
            assert!(p.enable_hosts.is_empty(), "{case}");
        } else {
            assert!(p.soaking.is_empty(), "{case}: {p:#?}");
            assert!(admitted(&p, "compute2"), "{case}: {p:#?}");
        }
    }
}

/// A canary rule naming no group or role of the fleet is an error (it would end the
/// canary phase silently for the group meant), and 0 canaries are refused.
#[test]
fn canary_rules_naming_no_group_or_zero_canaries_are_refused() {
    let roles: BTreeSet<Role> = ["compute", "stmon"]
        .iter()
        .map(|r| Role::new(*r).unwrap())
        .collect();
    for rules in [
        r#"{"rolling_rules":{"roles":{"compute":3}},"canary":{"computes":1}}"#,
        r#"{"canary":{"compute":1,"computes":1}}"#,
    ] {
        let e = Rules::parse(rules)
            .unwrap()
            .resolve(&roles)
            .unwrap_err()
            .to_string();
        assert!(e.contains("computes"), "{rules}: {e}");
    }
    // A role stands for its group.
    let r = Rules::parse(r#"{"group_mappings":{"ceph":["st.*"]},"canary":{"stmon":1}}"#)
        .unwrap()
        .resolve(&roles)
        .unwrap();
    assert_eq!(r.canary.get("ceph"), Some(&Limit::Count(1)));
    assert_eq!(r.canary.len(), 1, "{:?}", r.canary);
    for rules in [
        r#"{"canary":0}"#,
        r#"{"canary":0,"canary_soak":"10m"}"#,
        r#"{"canary":{"compute":0}}"#,
        r#"{"canary":{"compute":0,"stmon":1}}"#,
    ] {
        assert!(Rules::parse(rules).is_err(), "{rules}");
    }
}

/// An enabled host that has not started when its group's window is closed (by the
/// driver's clock) is disarmed, and the wait is by design (no progress deadline);
/// with the window open it is about to start.
#[test]
fn an_enabled_host_outside_its_window_waits_by_design() {
    // 22:00-06:00 UTC; NOW is 12:00: closed, opens in 10 hours.
    let rules = r#"{"windows":[{"days":"daily","start":"22:00","end":"06:00"}]}"#;
    let rec = rollout(rules, NOW - 7 * 3600);
    let mut kvs = base();
    host(&mut kvs, "compute1", "compute", true);
    host(&mut kvs, "compute2", "compute", true);
    upgraded(
        &mut kvs,
        "compute2",
        NOW - 6 * 3600 - 60,
        Some(NOW - 6 * 3600),
        Some(rec.id.as_str()),
    );
    kvs.push(kv("/config_state/enable_puppet/host/compute1", "true"));
    let (p, hosts) = run(&kvs, rules, &rec, NOW);
    assert_eq!(status(&hosts, "compute1").state, HostState::Upgrading);
    let why = &p.reasons[&HostName::new("compute1").unwrap()];
    assert_eq!(why.code, ReasonCode::OutsideWindow, "{}", why.text);
    assert_eq!(why.at, Some(NOW + 10 * 3600));
    assert_eq!(names(&p.armed_outside_window), ["compute1"]);
    // No admission outlives its window: the driver's clock disarms it, fenced.
    assert_eq!(names(&p.disable_hosts), ["compute1"]);
    assert!(p.waits_by_design());
    // 23:00: the window is open.
    let (p, _) = run(&kvs, rules, &rec, NOW + 11 * 3600);
    assert_eq!(code(&p, "compute1"), Some(ReasonCode::Upgrading));
    assert!(p.armed_outside_window.is_empty());
    assert!(p.disable_hosts.is_empty());
    assert!(!p.waits_by_design());
}

/// When the window closes, every admitted host that is not running is disarmed,
/// whatever its state: one waiting for its retry's backoff after a failure, and
/// one whose agent died before it started. One whose run goes on keeps its key.
#[test]
fn no_admission_outlives_its_window_whatever_the_hosts_state() {
    // 22:00-06:00 UTC; NOW is 12:00: closed.
    let rules = r#"{"windows":[{"days":"daily","start":"22:00","end":"06:00"}],"max_failures":5}"#;
    let rec = rollout(rules, NOW - 7 * 3600);
    let mut kvs = base();
    host(&mut kvs, "compute1", "compute", true);
    host(&mut kvs, "compute2", "compute", false);
    host(&mut kvs, "compute3", "compute", true);
    kvs.push(kv("/status/configured/failure/v2/compute1", "puppet failed"));
    for h in ["compute1", "compute2", "compute3"] {
        kvs.push(kv(&format!("/config_state/enable_puppet/host/{h}"), "true"));
    }
    // compute3's run goes on.
    kvs.push(kv(
        "/runs/compute3",
        r#"{"state":"upgrading","version":"v2","since":1,"pid":7}"#,
    ));
    let (p, hosts) = run(&kvs, rules, &rec, NOW);
    assert_eq!(status(&hosts, "compute1").state, HostState::Failed);
    assert_eq!(status(&hosts, "compute2").state, HostState::Lost);
    assert_eq!(names(&p.disable_hosts), ["compute1", "compute2"], "{p:#?}");
    // With the window open, nothing is disarmed.
    let (p, _) = run(&kvs, rules, &rec, NOW + 11 * 3600);
    assert!(p.disable_hosts.is_empty(), "{p:#?}");
}

/// A validated run that waits to reboot keeps its slot; the driver permits the
/// reboot (rewrites its host key) only inside its window, by its own clock, not
/// while held, and once per wait (the key newer than the marker is the permit).
#[test]
fn a_reboot_waits_for_its_window_and_is_permitted_once_by_the_drivers_clock() {
    // 22:00-06:00 UTC; NOW is 12:00: closed, opens in 10 hours.
    let rules = r#"{"rolling_rules":{"roles":{"compute":1}},"windows":[{"days":"daily","start":"22:00","end":"06:00"}]}"#;
    let rec = rollout(rules, NOW - 7 * 3600);
    let mut kvs = base();
    host(&mut kvs, "compute1", "compute", true);
    host(&mut kvs, "compute2", "compute", true);
    kvs.push(kv_at("/config_state/enable_puppet/host/compute1", "true", 5));
    kvs.push(kv_at(
        "/runs/compute1",
        r#"{"state":"rebooting","version":"v2","since":1,"pid":7}"#,
        9,
    ));
    let (p, hosts) = run(&kvs, rules, &rec, NOW);
    assert_eq!(status(&hosts, "compute1").state, HostState::Upgrading);
    assert_eq!(code(&p, "compute1"), Some(ReasonCode::OutsideWindow));
    assert!(
        p.reasons[&HostName::new("compute1").unwrap()]
            .text
            .contains("its reboot waits for the maintenance window")
    );
    assert!(
        p.permit_reboots.is_empty() && p.disable_hosts.is_empty(),
        "{p:#?}"
    );
    assert_eq!(names(&p.reboots_outside_window), ["compute1"]);
    assert!(p.waits_by_design());
    assert_eq!(p.wake_at, Some(NOW + 10 * 3600));
    // The slot is kept: compute2 waits for the limit.
    assert_eq!(code(&p, "compute2"), Some(ReasonCode::OutsideWindow));
    // 23:00: open; the reboot is permitted, and compute2 still waits for the limit.
    let (p, _) = run(&kvs, rules, &rec, NOW + 11 * 3600);
    assert_eq!(names(&p.permit_reboots), ["compute1"]);
    assert!(!admitted(&p, "compute2"), "{p:#?}");
    // Permitted already (the key is newer than the marker): not again.
    let mut later = kvs.clone();
    later.retain(|kv| kv.key.as_str() != "/config_state/enable_puppet/host/compute1");
    later.push(kv_at("/config_state/enable_puppet/host/compute1", "true", 12));
    let (p, _) = run(&later, rules, &rec, NOW + 11 * 3600);
    assert!(p.permit_reboots.is_empty(), "{p:#?}");
    // Held: no permit (its agent waits for the release).
    let mut held = kvs.clone();
    held.push(kv("/holds/host/compute1", HOLD));
    let (p, _) = run(&held, rules, &rec, NOW + 11 * 3600);
    assert!(p.permit_reboots.is_empty(), "{p:#?}");
    // Asked already (the marker has a deadline): no permit.
    let mut asked = kvs.clone();
    asked.retain(|kv| kv.key.as_str() != "/runs/compute1");
    asked.push(kv_at(
        "/runs/compute1",
        r#"{"state":"rebooting","version":"v2","since":1,"pid":7,"until":1795500000}"#,
        9,
    ));
    let (p, _) = run(&asked, rules, &rec, NOW + 11 * 3600);
    assert!(p.permit_reboots.is_empty(), "{p:#?}");
}

/// A window naming a role of a group covers the whole group, for the agent
/// (`windows_for`) as for the driver (`resolve`).
#[test]
fn agent_and_driver_agree_on_a_window_naming_a_role_of_a_group() {
    let rules = Rules::parse(
        r#"{"group_mappings":{"ceph":["st.*"]},
            "windows":[{"days":"daily","start":"22:00","end":"06:00","groups":["stmon"]}]}"#,
    )
    .unwrap();
    let roles: BTreeSet<Role> = ["stmon", "stmonwithosd", "compute"]
        .iter()
        .map(|r| Role::new(*r).unwrap())
        .collect();
    let resolved = rules.resolve(&roles).unwrap();
    assert_eq!(resolved.windows.get("ceph").map(Vec::len), Some(1));
    for role in &roles {
        let group = &resolved.group_of[role];
        assert_eq!(
            rules.windows_for(role).len(),
            resolved.windows.get(group).map_or(0, Vec::len),
            "{role} (group {group})"
        );
    }
    assert_eq!(rules.windows_for(&Role::new("stmonwithosd").unwrap()).len(), 1);
    assert!(rules.windows_for(&Role::new("compute").unwrap()).is_empty());
}

/// Percentages are digits and `%` only: a sign or a space is refused.
#[test]
fn percentages_with_a_sign_or_a_space_are_refused() {
    for bad in ["+5%", " 5%", "5 %", "-5%"] {
        for rules in [
            format!(r#"{{"rolling_rules":{{"global":"{bad}"}}}}"#),
            format!(r#"{{"max_failures":"{bad}"}}"#),
            format!(r#"{{"canary":"{bad}"}}"#),
        ] {
            let e = Rules::parse(&rules).unwrap_err().to_string();
            assert!(e.contains("is not a percentage"), "{rules}: {e}");
        }
    }
    let r = Rules::parse(r#"{"rolling_rules":{"global":"5%"}}"#).unwrap();
    assert_eq!(r.global_limit, Some(Limit::Percent(5)));
    // "0%" means nothing to freeze in max_failures: whatever it says, not that.
    if let Err(e) = Rules::parse(r#"{"max_failures":"0%"}"#) {
        assert!(!e.to_string().contains("freeze"), "{e}");
    }
}

/// The canary soak counts from when the driver saw the canaries done (recorded in
/// the rollout), never from the agents' clocks.
#[test]
fn the_canary_soak_counts_from_canaries_done_at_on_the_drivers_clock() {
    let rules = r#"{"canary":{"compute":1},"canary_soak":"10m"}"#;
    // The canary's agent clock a day behind, or two hours ahead.
    for at in [NOW - 86_400, NOW + 7200] {
        let mut rec = rollout(rules, NOW - 3600);
        let mut kvs = base();
        for h in ["compute1", "compute2"] {
            host(&mut kvs, h, "compute", true);
        }
        upgraded(&mut kvs, "compute1", at, Some(at + 60), Some(rec.id.as_str()));
        let snap = Snapshot::from_kvs(&Schema::default(), &kvs);
        // First pass: every canary finished healthy, not yet recorded.
        let (p, _) = plan_of(&snap, rules, &rec, NOW);
        let c = p.canary.clone().unwrap();
        assert_eq!(names(&c.canaries), ["compute1"], "at {at}");
        assert_eq!(
            (c.mark_done, c.soaked_at, c.promote),
            (true, None, false),
            "at {at}"
        );
        assert!(p.is_empty(), "at {at}: {p:#?}");
        // The driver recorded it at NOW: the soak ends 10 minutes later.
        rec.canaries_done_at = Some(NOW);
        let (p, _) = plan_of(&snap, rules, &rec, NOW + 599);
        let c = p.canary.clone().unwrap();
        assert_eq!(
            (c.mark_done, c.soaked_at, c.promote),
            (false, Some(NOW + 600), false),
            "at {at}"
        );
        assert_eq!(code(&p, "compute2"), Some(ReasonCode::Canary));
        assert_eq!(names(&c.canaries), ["compute1"], "at {at}");
        let (p, _) = plan_of(&snap, rules, &rec, NOW + 600);
        assert!(p.canary.unwrap().promote, "at {at}");
    }
    // A canary still running: not done.
    let rec = rollout(rules, NOW - 3600);
    let mut kvs = base();
    for h in ["compute1", "compute2"] {
        host(&mut kvs, h, "compute", true);
    }
    kvs.push(kv("/config_state/enable_puppet/host/compute1", "true"));
    let (p, _) = run(&kvs, rules, &rec, NOW);
    let c = p.canary.unwrap();
    assert_eq!(names(&c.canaries), ["compute1"]);
    assert!(!c.mark_done && !c.promote);
}

/// A snapshot reads `/results/` after `/running/versions/`: an agent reports a run's
/// version and result in one transaction, so a host seen at the new version is seen
/// with that run's result. Reproduced with a store that serves the versions listing
/// late while the agent's report lands in between (paused time: deterministic).
#[tokio::test(start_paused = true)]
async fn a_snapshot_sees_the_new_result_with_the_new_version() {
    use async_trait::async_trait;
    use jio_common::store::{
        Lease, LeaseId, Listing, MemoryStore, Op, Result, Revision, Store, Txn, TxnOutcome, WatchStream,
    };

    /// Serves the `/running/versions/` listing 200 ms late; says when it was asked.
    struct Slow(DynStore, Arc<AtomicBool>);
    #[async_trait]
    impl Store for Slow {
        fn url(&self) -> &str {
            self.0.url()
        }
        async fn ping(&self) -> Result<Revision> {
            self.0.ping().await
        }
        async fn get(&self, key: &Key) -> Result<Option<KeyValue>> {
            self.0.get(key).await
        }
        async fn list(&self, prefix: &Key) -> Result<Listing> {
            if prefix.as_str().starts_with("/running/versions") {
                self.1.store(true, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            self.0.list(prefix).await
        }
        async fn put(&self, key: &Key, value: &str, lease: Option<&LeaseId>) -> Result<Revision> {
            self.0.put(key, value, lease).await
        }
        async fn delete(&self, key: &Key) -> Result<bool> {
            self.0.delete(key).await
        }
        async fn delete_prefix(&self, prefix: &Key) -> Result<u64> {
            self.0.delete_prefix(prefix).await
        }
        async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
            self.0.txn(txn).await
        }
        async fn grant_lease(&self, ttl: Duration) -> Result<Lease> {
            self.0.grant_lease(ttl).await
        }
        async fn keep_alive(&self, lease: &LeaseId) -> Result<Duration> {
            self.0.keep_alive(lease).await
        }
        async fn revoke_lease(&self, lease: &LeaseId) -> Result<()> {
            self.0.revoke_lease(lease).await
        }
        async fn watch(&self, prefix: &Key, from: Revision) -> Result<WatchStream> {
            self.0.watch(prefix, from).await
        }
        async fn compact(&self, revision: Revision) -> Result<()> {
            self.0.compact(revision).await
        }
    }

    let rules = r#"{"rolling_rules":{"roles":{"compute":1}},"min_healthy_time":"1h"}"#;
    let rec = rollout(rules, NOW - 300);
    let schema = Schema::default();
    let mem: DynStore = Arc::new(MemoryStore::new());
    let k = |s: &str| Key::new(s).unwrap();
    for kvp in base() {
        mem.put(&kvp.key, &kvp.value, None).await.unwrap();
    }
    for h in ["compute1", "compute2"] {
        mem.put(
            &k(&format!("/hosts/{h}")),
            r#"{"role":"compute","agent_version":"1","addresses":[],"first_seen":1}"#,
            None,
        )
        .await
        .unwrap();
        mem.put(&k(&format!("/agents/{h}")), IDLE, None).await.unwrap();
    }
    // compute1 is armed and running; its previous result is of v1.
    mem.put(&k("/config_state/enable_puppet/host/compute1"), "true", None)
        .await
        .unwrap();
    mem.put(
        &k("/results/compute1"),
        r#"{"version":"v1","ok":true,"at":1,"attempt":1}"#,
        None,
    )
    .await
    .unwrap();
    let asked = Arc::new(AtomicBool::new(false));
    let slow: DynStore = Arc::new(Slow(mem.clone(), asked.clone()));
    let reader = tokio::spawn(async move { Snapshot::read(&slow, &schema).await.unwrap() });
    // The agent reports its validated run while the snapshot is being read: running
    // version and result, one transaction.
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(
        asked.load(Ordering::SeqCst),
        "the reader is mid-read, waiting on the versions listing"
    );
    let t = Txn {
        compares: vec![],
        ops: vec![
            Op::put(k("/running/versions/v2/compute1"), NOW.to_string()),
            Op::put(k("/results/compute1"), result(NOW, None, Some(rec.id.as_str()))),
        ],
    };
    assert!(mem.txn(t).await.unwrap().committed());
    let snap = reader.await.unwrap();
    let (p, hosts) = plan_of(&snap, rules, &rec, NOW + 1);
    assert_eq!(status(&hosts, "compute1").state, HostState::Upgraded);
    let res = &snap.results[&HostName::new("compute1").unwrap()];
    assert_eq!(res.version.as_str(), "v2", "the new result with the new version");
    assert_eq!(res.rollout.as_deref(), Some(rec.id.as_str()));
    assert_eq!(names(&p.soaking), ["compute1"], "{p:#?}");
    assert_eq!(
        p.reasons[&HostName::new("compute1").unwrap()].at,
        Some(NOW + 3600),
        "soaking on its run's own result"
    );
    assert_eq!(code(&p, "compute2"), Some(ReasonCode::LimitReached));
    assert!(p.enable_hosts.is_empty());
}
