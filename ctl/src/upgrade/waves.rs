//! `upgrade --noop`: the whole planned sequence of waves, not only the first pass.
//! Pure: the planner is run on a simulated fleet in which every host admitted in a
//! wave (and every host already in flight) finishes before the next wave, and none
//! fails. Lost, blocked and failed hosts stay as they are, so a rollout that would
//! wait forever shows where it stops.

use std::collections::BTreeMap;

use serde::Serialize;

use jio_common::fleet::{self, HostState, Snapshot};
use jio_common::gate::KeyState;
use jio_common::names::{HostName, Version};
use jio_common::rules::Resolved;

use crate::render;

/// A snapshot as it will be once the rollout to `v` has started.
pub fn as_if_started(mut snap: Snapshot, v: &Version) -> Snapshot {
    if snap.current.as_ref() != Some(v) {
        snap.current = Some(v.clone());
        snap.global = KeyState::Set(false);
        snap.role_keys.clear();
        snap.host_keys.clear();
    }
    snap
}

/// Hosts admitted together, by group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Wave {
    pub groups: BTreeMap<String, Vec<HostName>>,
}

/// The waves, and what is left when they end (`None`: every host upgraded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Waves {
    pub waves: Vec<Wave>,
    pub then_waits_for: Option<String>,
}

/// Simulates the rollout on `snap` (as started) under `resolved`.
pub fn simulate(snap: &Snapshot, resolved: &Resolved) -> Waves {
    let mut hosts = fleet::classify(snap);
    let group_of = |h: &fleet::HostStatus| {
        resolved
            .group_of
            .get(&h.role)
            .cloned()
            .unwrap_or_else(|| h.role.to_string())
    };
    let mut waves = Vec::new();
    // Each round admits at least one host or finishes one in flight: bounded.
    for _ in 0..=2 * hosts.len() {
        let plan = jio_common::plan::plan(snap, &hosts, resolved, &jio_common::plan::Context::default());
        let mut wave: BTreeMap<String, Vec<HostName>> = BTreeMap::new();
        for h in hosts.iter_mut() {
            let admitted = h.state == HostState::Pending
                && (plan.enable_hosts.contains(&h.host) || plan.enable_roles.contains(&h.role));
            if !admitted {
                continue;
            }
            wave.entry(group_of(h)).or_default().push(h.host.clone());
            if snap.agents.contains_key(&h.host) {
                h.state = HostState::Upgrading;
            } else {
                // Enabled without a live agent: it will be lost, holding its slot.
                h.state = HostState::Lost;
                h.reason = Some("enabled, but its agent is not alive".into());
            }
        }
        if !wave.is_empty() {
            waves.push(Wave { groups: wave });
        }
        let in_flight = hosts.iter().any(|h| h.state == HostState::Upgrading);
        if !in_flight {
            let left = hosts
                .iter()
                .any(|h| matches!(h.state, HostState::Pending | HostState::Lost | HostState::Blocked));
            return Waves {
                waves,
                then_waits_for: left.then(|| render::waiting_line(&hosts, &plan)),
            };
        }
        // The wave (and whatever was in flight) finishes.
        for h in hosts.iter_mut() {
            if h.state == HostState::Upgrading {
                h.state = HostState::Upgraded;
                h.reason = None;
            }
        }
    }
    Waves {
        waves,
        then_waits_for: Some("the simulation did not settle (a bug: please report it)".into()),
    }
}

/// The waves as text.
pub fn to_text(w: &Waves) -> String {
    let mut out = format!(
        "{} wave(s), if every host admitted finishes and none fails:\n",
        w.waves.len()
    );
    for (i, wave) in w.waves.iter().enumerate() {
        let parts: Vec<String> = wave
            .groups
            .iter()
            .map(|(g, hs)| {
                let names: Vec<&str> = hs.iter().map(HostName::as_str).collect();
                format!("{g}: {}", names.join(", "))
            })
            .collect();
        out.push_str(&format!("  wave {}: {}\n", i + 1, parts.join("; ")));
    }
    match &w.then_waits_for {
        Some(line) => out.push_str(&format!("then it waits for: {line}\n")),
        None => out.push_str("then every host is upgraded\n"),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use jio_common::keys::Schema;
    use jio_common::rules::Rules;
    use jio_common::store::KeyValue;

    fn kv(key: &str, value: &str) -> KeyValue {
        let key = jio_common::keys::Key::new(key).unwrap();
        KeyValue::from_bytes(key, value.as_bytes().to_vec(), 1, 1, 1, None)
    }

    /// Hosts `(name, role)` at v1 with live idle agents; `lost` registered without one.
    fn fleet(hosts: &[(&str, &str)], lost: &[&str]) -> Snapshot {
        let mut kvs = vec![kv("/current_version", "v1")];
        for (h, role) in hosts {
            kvs.push(kv(
                &format!("/hosts/{h}"),
                &format!(r#"{{"role":"{role}","agent_version":"1","addresses":[],"first_seen":1}}"#),
            ));
            if !lost.contains(h) {
                kvs.push(kv(
                    &format!("/agents/{h}"),
                    r#"{"state":"idle","version":"v1","since":1,"pid":1}"#,
                ));
            }
            kvs.push(kv(&format!("/running/versions/v1/{h}"), "1"));
        }
        as_if_started(
            Snapshot::from_kvs(&Schema::default(), &kvs),
            &Version::new("v2").unwrap(),
        )
    }

    fn waves(rules: &str, snap: &Snapshot) -> Waves {
        let hosts = fleet::classify(snap);
        let roles = hosts.iter().map(|h| h.role.clone()).collect();
        simulate(snap, &Rules::parse(rules).unwrap().resolve(&roles).unwrap())
    }

    fn names(w: &Waves) -> Vec<String> {
        w.waves
            .iter()
            .map(|w| {
                w.groups
                    .iter()
                    .map(|(g, hs)| {
                        format!(
                            "{g}:{}",
                            hs.iter().map(HostName::as_str).collect::<Vec<_>>().join(",")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    }

    #[test]
    fn limits_and_order_make_the_waves() {
        let snap = fleet(
            &[
                ("controller1", "controller"),
                ("controller2", "controller"),
                ("compute1", "compute"),
                ("compute2", "compute"),
                ("compute3", "compute"),
            ],
            &[],
        );
        let w = waves(
            r#"{"rolling_rules":{"roles":{"controller":1,"compute":2}},"role_order":{"compute":"controller"}}"#,
            &snap,
        );
        assert_eq!(
            names(&w),
            [
                "controller:controller1",
                "controller:controller2",
                "compute:compute1,compute2",
                "compute:compute3"
            ]
        );
        assert_eq!(w.then_waits_for, None);
        assert!(
            to_text(&w).contains("wave 3: compute: compute1, compute2"),
            "{}",
            to_text(&w)
        );
    }

    #[test]
    fn a_frozen_role_or_a_lost_host_shows_where_it_stops() {
        let snap = fleet(&[("compute1", "compute"), ("db1", "db")], &[]);
        let w = waves(r#"{"rolling_rules":{"roles":{"compute":0}}}"#, &snap);
        assert_eq!(names(&w), ["db:db1"]);
        assert!(w.then_waits_for.unwrap().contains("frozen (limit 0)"));
        let snap = fleet(&[("compute1", "compute"), ("compute2", "compute")], &["compute2"]);
        let w = waves(r#"{"rolling_rules":{"global":1}}"#, &snap);
        // compute1 goes; compute2's agent is gone: it is never admitted.
        assert_eq!(names(&w), ["compute:compute1"]);
        let then = w.then_waits_for.unwrap();
        assert!(then.contains("1 lost (never admitted): compute2"), "{then}");
    }
}
