//! Property tests of the planner on random fleets, rules and store states. The
//! checks are computed here from the generated input, not by the planner's own
//! helpers: what a plan enables (host keys, and every host of a role whose key it
//! opens) never exceeds a group limit or the fleet cap, never starts a group before
//! the groups it follows are done, and never admits a held, lost or out-of-window
//! host. Without the new rules a plan admits a subset of what the original tool's
//! planner (re-implemented below from its description) admits.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod fixtures;

use std::collections::{BTreeMap, BTreeSet};

use fixtures::kv;
use jio_common::fleet::{Snapshot, classify};
use jio_common::keys::Schema;
use jio_common::names::HostName;
use jio_common::plan::{Context, Plan, plan};
use jio_common::rollout::RolloutRecord;
use jio_common::rules::Rules;
use proptest::prelude::*;

const ROLES: [&str; 4] = ["controller", "db", "compute", "ceph"];
/// 2026-11-23T12:00:00Z, a Monday.
const NOW: u64 = 1_795_435_200;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Upgraded,
    /// Enabled by its host key, agent alive.
    Upgrading,
    /// Its agent runs puppet for the old version, whatever its keys.
    RunningOld,
    Failed,
    Pending,
    /// Pending without a live agent.
    PendingLost,
    /// Enabled without a live agent.
    EnabledLost,
}

#[derive(Debug, Clone)]
struct Host {
    role: usize,
    st: St,
    held: bool,
}

#[derive(Debug, Clone)]
struct Input {
    hosts: Vec<Host>,
    /// Per role: none, a count, or a percentage.
    limits: [Option<(bool, u64)>; 4],
    fleet: Option<(bool, u64)>,
    /// role index → role indexes it waits for (acyclic: only lower indexes).
    order: Vec<(usize, usize)>,
    max_failures: u64,
    /// Per role: a window open now, closed now, or none.
    windows: [Option<bool>; 4],
    canary: Option<u64>,
    held_role: Option<usize>,
}

fn st() -> impl Strategy<Value = St> {
    prop_oneof![
        3 => Just(St::Upgraded),
        2 => Just(St::Upgrading),
        1 => Just(St::RunningOld),
        1 => Just(St::Failed),
        6 => Just(St::Pending),
        1 => Just(St::PendingLost),
        1 => Just(St::EnabledLost),
    ]
}

fn limit() -> impl Strategy<Value = Option<(bool, u64)>> {
    prop_oneof![
        2 => Just(None),
        3 => (0u64..5).prop_map(|n| Some((false, n))),
        2 => (1u64..=100).prop_map(|p| Some((true, p))),
    ]
}

fn input(new_rules: bool) -> impl Strategy<Value = Input> {
    let hosts = prop::collection::vec(
        (
            0usize..4,
            st(),
            prop::bool::weighted(if new_rules { 0.15 } else { 0.0 }),
        )
            .prop_map(|(role, st, held)| Host { role, st, held }),
        1..24,
    );
    let order = prop::collection::vec((1usize..4, 0usize..4), 0..3)
        .prop_map(|v| v.into_iter().filter(|(a, b)| b < a).collect::<Vec<_>>());
    let windows =
        prop::array::uniform4(prop_oneof![2 => Just(None), 1 => Just(Some(true)), 1 => Just(Some(false))]);
    let extras = (
        if new_rules {
            limit().boxed()
        } else {
            Just(None).boxed()
        },
        if new_rules {
            windows.boxed()
        } else {
            Just([None; 4]).boxed()
        },
        if new_rules {
            prop::option::of(1u64..3).boxed()
        } else {
            Just(None).boxed()
        },
        if new_rules {
            prop::option::of(0usize..4).boxed()
        } else {
            Just(None).boxed()
        },
    );
    (hosts, prop::array::uniform4(limit()), order, 0u64..3, extras).prop_map(
        |(hosts, limits, order, max_failures, (fleet, windows, canary, held_role))| Input {
            hosts,
            limits,
            fleet,
            order,
            max_failures,
            windows,
            canary,
            held_role,
        },
    )
}

fn name(i: usize, h: &Host) -> String {
    format!("{}{i}", ROLES[h.role])
}

fn snapshot(inp: &Input) -> Snapshot {
    let mut kvs = vec![
        kv("/current_version", "v2"),
        kv("/config_state/enable_puppet/global", "false"),
    ];
    let idle = r#"{"state":"idle","version":"v1","since":1,"pid":1}"#;
    let hold = r#"{"by":"alice@l","reason":"disk","at":1}"#;
    for (i, h) in inp.hosts.iter().enumerate() {
        let n = name(i, h);
        kvs.push(kv(
            &format!("/hosts/{n}"),
            &format!(
                r#"{{"role":"{}","agent_version":"1","addresses":[],"first_seen":1}}"#,
                ROLES[h.role]
            ),
        ));
        let alive = !matches!(h.st, St::PendingLost | St::EnabledLost);
        if alive {
            let rec = if h.st == St::RunningOld {
                r#"{"state":"upgrading","version":"v1","since":1,"pid":1}"#
            } else {
                idle
            };
            kvs.push(kv(&format!("/agents/{n}"), rec));
        }
        match h.st {
            St::Upgraded => kvs.push(kv(&format!("/running/versions/v2/{n}"), "1")),
            St::Upgrading | St::EnabledLost => {
                kvs.push(kv(&format!("/config_state/enable_puppet/host/{n}"), "true"))
            }
            St::Failed => {
                kvs.push(kv(&format!("/config_state/enable_puppet/host/{n}"), "true"));
                kvs.push(kv(&format!("/status/configured/failure/v2/{n}"), ""));
            }
            _ => {}
        }
        if h.held {
            kvs.push(kv(&format!("/holds/host/{n}"), hold));
        }
    }
    if let Some(r) = inp.held_role {
        kvs.push(kv(&format!("/holds/role/{}", ROLES[r]), hold));
    }
    Snapshot::from_kvs(&Schema::default(), &kvs)
}

fn lim_json(l: (bool, u64)) -> serde_json::Value {
    if l.0 {
        serde_json::json!(format!("{}%", l.1))
    } else {
        serde_json::json!(l.1)
    }
}

fn rules_json(inp: &Input) -> serde_json::Value {
    let mut roles = serde_json::Map::new();
    for (i, l) in inp.limits.iter().enumerate() {
        if let Some(l) = l {
            roles.insert(ROLES[i].into(), lim_json(*l));
        }
    }
    let mut rr = serde_json::json!({ "roles": roles });
    if let Some(f) = inp.fleet {
        rr["fleet"] = lim_json(f);
    }
    let mut order: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in &inp.order {
        order.entry(ROLES[*a]).or_default().push(ROLES[*b]);
    }
    let mut v = serde_json::json!({
        "rolling_rules": rr,
        "role_order": order,
        "max_failures": inp.max_failures,
    });
    let mut windows = Vec::new();
    for (i, w) in inp.windows.iter().enumerate() {
        // 11:00-13:00 UTC contains NOW (12:00); 14:00-15:00 does not.
        match w {
            Some(true) => windows.push(
                serde_json::json!({"days": "daily", "start": "11:00", "end": "13:00", "groups": [ROLES[i]]}),
            ),
            Some(false) => windows.push(
                serde_json::json!({"days": "daily", "start": "14:00", "end": "15:00", "groups": [ROLES[i]]}),
            ),
            None => {}
        }
    }
    if !windows.is_empty() {
        v["windows"] = serde_json::json!(windows);
    }
    if let Some(c) = inp.canary {
        v["canary"] = serde_json::json!(c);
    }
    v
}

fn count(l: (bool, u64), n: usize) -> u64 {
    if l.0 { (n as u64 * l.1 / 100).max(1) } else { l.1 }
}

/// Every host the plan lets start: host keys, and pending hosts of opened roles.
fn admitted(inp: &Input, p: &Plan) -> BTreeSet<usize> {
    let hosts: BTreeSet<&str> = p.enable_hosts.iter().map(HostName::as_str).collect();
    let roles: BTreeSet<&str> = p.enable_roles.iter().map(|r| r.as_str()).collect();
    inp.hosts
        .iter()
        .enumerate()
        .filter(|(i, h)| {
            hosts.contains(name(*i, h).as_str())
                || (roles.contains(ROLES[h.role]) && matches!(h.st, St::Pending | St::PendingLost))
        })
        .map(|(i, _)| i)
        .collect()
}

fn run(inp: &Input) -> (Plan, RolloutRecord) {
    let snap = snapshot(inp);
    let statuses = classify(&snap);
    let roles = statuses.iter().map(|h| h.role.clone()).collect();
    let rules_v = rules_json(inp);
    let resolved = Rules::parse(&rules_v.to_string())
        .unwrap_or_else(|e| panic!("{rules_v}: {e}"))
        .resolve(&roles)
        .unwrap();
    let rec = RolloutRecord::start(
        jio_common::names::Version::new("v2").unwrap(),
        None,
        rules_v,
        "t",
        NOW - 60,
    );
    let cx = Context {
        now: NOW,
        rollout: Some(&rec),
        host_keys_only: false,
        busy_outside: &[],
        hook_roles: &[],
    };
    (plan(&snap, &statuses, &resolved, &cx), rec)
}

/// Holds a slot: runs anything, failed, or enabled (alive or not; held or not: a
/// release would start a held one at once, until its key is reset).
fn busy(_inp: &Input, h: &Host) -> bool {
    matches!(
        h.st,
        St::RunningOld | St::Failed | St::Upgrading | St::EnabledLost
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn no_plan_breaks_a_limit_an_order_a_hold_or_a_window(inp in input(true)) {
        let (p, _) = run(&inp);
        let adm = admitted(&inp, &p);
        let total = inp.hosts.len();
        let in_flight = inp.hosts.iter().filter(|h| busy(&inp, h)).count();
        // The fleet cap.
        if let Some(f) = inp.fleet {
            let cap = count(f, total) as usize;
            prop_assert!(
                adm.is_empty() || in_flight + adm.len() <= cap,
                "fleet cap {cap}: {in_flight} in flight + {} admitted", adm.len()
            );
        }
        for (ri, role) in ROLES.iter().enumerate() {
            let of_role: Vec<(usize, &Host)> = inp.hosts.iter().enumerate().filter(|(_, h)| h.role == ri).collect();
            let admitted_here = of_role.iter().filter(|(i, _)| adm.contains(i)).count();
            if admitted_here == 0 {
                continue;
            }
            // Group limits.
            if let Some(l) = inp.limits[ri] {
                let limit = count(l, of_role.len()) as usize;
                let busy = of_role.iter().filter(|(_, h)| busy(&inp, h)).count();
                prop_assert!(busy + admitted_here <= limit, "{role}: {busy} busy + {admitted_here} admitted > limit {limit}");
            }
            // Role order: every host of the groups it waits for is upgraded.
            for (a, b) in &inp.order {
                if *a == ri {
                    let done = inp.hosts.iter().filter(|h| h.role == *b).all(|h| h.st == St::Upgraded);
                    prop_assert!(done, "{role} admitted while {} is not done", ROLES[*b]);
                }
            }
            // Windows.
            prop_assert!(inp.windows[ri] != Some(false), "{role} admitted outside its window");
            // Failures.
            let failed = inp.hosts.iter().filter(|h| h.st == St::Failed).count() as u64;
            prop_assert!(failed <= inp.max_failures, "admitted after {failed} failures");
            // Canary: no more than the canary count of the role is touched.
            if let Some(c) = inp.canary {
                let touched = of_role.iter().filter(|(_, h)| busy(&inp, h)).count();
                prop_assert!(touched + admitted_here <= (c as usize).max(touched), "{role}: canary {c} but {touched} + {admitted_here}");
            }
        }
        // Held and lost hosts are never admitted.
        for i in &adm {
            let h = &inp.hosts[*i];
            prop_assert!(!h.held && inp.held_role != Some(h.role), "held host {} admitted", name(*i, h));
            prop_assert!(h.st != St::PendingLost, "lost host {} admitted", name(*i, h));
        }
        // A held host still enabled and not running is disabled by the plan.
        for (i, h) in inp.hosts.iter().enumerate() {
            let held = h.held || inp.held_role == Some(h.role);
            if held && matches!(h.st, St::Upgrading | St::EnabledLost) {
                let n = HostName::new(name(i, h)).unwrap();
                prop_assert!(p.disable_hosts.contains(&n), "{n} held and enabled, not disabled");
            }
        }
        // Every host that is not upgraded has a reason.
        for (i, h) in inp.hosts.iter().enumerate() {
            if h.st != St::Upgraded {
                let n = HostName::new(name(i, h)).unwrap();
                prop_assert!(p.reasons.contains_key(&n), "{n} has no reason");
            }
        }
    }

    #[test]
    fn without_the_new_rules_a_plan_admits_no_more_than_the_original(inp in input(false)) {
        let (p, _) = run(&inp);
        let adm = admitted(&inp, &p);
        let orig = original(&inp);
        for ri in 0..ROLES.len() {
            let here: Vec<usize> = adm.iter().copied().filter(|i| inp.hosts[*i].role == ri).collect();
            let (candidates, room) = &orig[ri];
            prop_assert!(here.len() <= *room, "{}: admitted {here:?}, the original admits {room}", ROLES[ri]);
            for i in &here {
                prop_assert!(candidates.contains(i), "{}: admitted {i}, not a candidate of the original", ROLES[ri]);
            }
        }
    }
}

/// The original tool's planner, from its description, per role: the hosts it may
/// admit and how many. It stops on more failures than max_failures; a role waits
/// until every host of the roles it follows runs the version; up to the limit hosts
/// of a role are in flight (enabled and not upgraded, failed included); no limit
/// admits every pending host.
fn original(inp: &Input) -> Vec<(BTreeSet<usize>, usize)> {
    let failed = inp.hosts.iter().filter(|h| h.st == St::Failed).count() as u64;
    (0..ROLES.len())
        .map(|ri| {
            let waits = inp.order.iter().filter(|(a, _)| *a == ri).any(|(_, b)| {
                inp.hosts
                    .iter()
                    .filter(|h| h.role == *b)
                    .any(|h| h.st != St::Upgraded)
            });
            if failed > inp.max_failures || waits {
                return (BTreeSet::new(), 0);
            }
            let of_role: Vec<(usize, &Host)> = inp
                .hosts
                .iter()
                .enumerate()
                .filter(|(_, h)| h.role == ri)
                .collect();
            let busy = of_role.iter().filter(|(_, h)| busy(inp, h)).count();
            let pending: BTreeSet<usize> = of_role
                .iter()
                .filter(|(_, h)| matches!(h.st, St::Pending | St::PendingLost))
                .map(|(i, _)| *i)
                .collect();
            let room = inp.limits[ri].map_or(pending.len(), |l| {
                (count(l, of_role.len()) as usize)
                    .saturating_sub(busy)
                    .min(pending.len())
            });
            (pending, room)
        })
        .collect()
}
