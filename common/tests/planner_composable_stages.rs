//! The composable planner (`jio_common::compose::plan`) walking a stage phase by
//! phase: two controllers (keystone, nova_api after keystone) in stage
//! `controlplane` and two computes (nova_compute, at most one at a time) in stage
//! `compute`, fed through `Snapshot::from_kvs` as a driver's pass would see the
//! store, and written back as the driver would write it.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod fixtures;

use std::collections::BTreeMap;

use jio_common::compose::{Composed, Standing};
use jio_common::fleet::Snapshot;
use jio_common::keys::Schema;
use jio_common::names::Service;
use jio_common::plan::ReasonCode;

use fixtures::compose::Scene;
use fixtures::{h, kv_at as kv};

const RULES: &str = r#"{
    "roles_data": {"controller": ["keystone", "nova_api"], "compute": ["nova_compute"]},
    "max_failures": 0,
    "stages": {"controlplane": ["controller"], "compute": ["compute"]},
    "rolling_rules": {"roles": {"compute": 1}}
}"#;

/// `RULES` with `max_failures` 1.
const RULES_MAX_1: &str = r#"{
    "roles_data": {"controller": ["keystone", "nova_api"], "compute": ["nova_compute"]},
    "max_failures": 1,
    "stages": {"controlplane": ["controller"], "compute": ["compute"]},
    "rolling_rules": {"roles": {"compute": 1}}
}"#;

const HOSTS: [(&str, &str); 4] = [
    ("ctl1", "controller"),
    ("ctl2", "controller"),
    ("cp1", "compute"),
    ("cp2", "compute"),
];

/// Each role's catalog: keystone (pre 1, post 3) and nova_api (pre 1, after
/// keystone) on the controllers, nova_compute (pre 1 and 2, post 3, finalize) on the
/// computes.
fn catalog(role: &str) -> &'static str {
    if role == "controller" {
        r#"{"dir":"/s","services":{"keystone":{"pre":[1],"post":[3]},"nova_api":{"after":["keystone"],"pre":[1]}}}"#
    } else {
        r#"{"dir":"/s","services":{"nova_compute":{"pre":[1,2],"post":[3],"finalize":true}}}"#
    }
}

/// The controllers' catalog with nova_compute's finalize file on them too.
const CTL_WITH_FINALIZE: &str = r#"{"dir":"/s","services":{"keystone":{"pre":[1],"post":[3]},"nova_api":{"after":["keystone"],"pre":[1]},"nova_compute":{"finalize":true}}}"#;

impl Scene {
    /// The rollout of `RULES` over `HOSTS`, started with `stages` (empty: all).
    fn new(stages: &[&str]) -> Scene {
        Scene::start(RULES, &HOSTS, catalog).with_stages(stages)
    }

    /// Controller `host` finished every step of its stage.
    fn controller_done(&mut self, host: &str) {
        for (p, sv) in [
            ("pre-1", "keystone"),
            ("pre-1", "nova_api"),
            ("post-3", "keystone"),
        ] {
            self.step(p, sv, host, true);
        }
    }
}

fn s(n: &str) -> Service {
    Service::new(n).unwrap()
}

fn phase_of(c: &Composed, stage: &str) -> Option<String> {
    c.stages
        .iter()
        .find(|s| s.name == stage)
        .and_then(|s| s.phase.clone())
}

fn enabled(c: &Composed) -> Vec<&str> {
    c.plan.enable_hosts.iter().map(|h| h.as_str()).collect()
}

#[test]
fn a_stage_moves_phase_by_phase_and_only_when_every_host_finished() {
    let mut sc = Scene::new(&["controlplane"]);
    // First pass: the stage's first phase is granted, nothing admitted yet.
    let c = sc.plan();
    assert_eq!(c.grants.len(), 1, "{:?}", c.grants);
    assert_eq!(c.grants[0].1.phase, "pre-1");
    assert_eq!(c.grants[0].1.services, vec![s("keystone")]);
    assert!(c.plan.enable_hosts.is_empty());
    assert_eq!(c.plan.reasons[&h("cp1")].code, ReasonCode::WaitingFor);
    assert!(
        c.plan.reasons[&h("cp1")]
            .text
            .contains("stage compute is not started")
    );
    sc.apply(&c);
    // Then both controllers are admitted (no limit).
    let c = sc.plan();
    assert!(c.grants.is_empty());
    assert_eq!(enabled(&c), vec!["ctl1", "ctl2"]);
    sc.apply(&c);
    // One finished: the phase does not move.
    sc.step("pre-1", "keystone", "ctl1", true);
    let c = sc.plan();
    assert!(c.grants.is_empty() && c.plan.enable_hosts.is_empty());
    assert_eq!(phase_of(&c, "controlplane").as_deref(), Some("pre-1 (keystone)"));
    // Both: nova_api's step 1 comes next (it runs after keystone), the keys reset.
    sc.step("pre-1", "keystone", "ctl2", true);
    let c = sc.plan();
    assert_eq!(c.grants[0].1.services, vec![s("nova_api")]);
    assert_eq!(c.reset_hosts.len(), 2);
    sc.apply(&c);
    let c = sc.plan();
    assert_eq!(enabled(&c), vec!["ctl1", "ctl2"]);
    sc.apply(&c);
    sc.step("pre-1", "nova_api", "ctl1", true);
    sc.step("pre-1", "nova_api", "ctl2", true);
    // Puppet: done when the hosts are at the version.
    let c = sc.plan();
    assert_eq!(c.grants[0].1.phase, "puppet");
    sc.apply(&c);
    let c = sc.plan();
    assert_eq!(enabled(&c), vec!["ctl1", "ctl2"]);
    sc.apply(&c);
    sc.put("/running/versions/v2/ctl1", "1");
    sc.del("/running/versions/v1/ctl1");
    let c = sc.plan();
    assert!(c.grants.is_empty(), "ctl2 has not finished puppet");
    sc.put("/running/versions/v2/ctl2", "1");
    sc.del("/running/versions/v1/ctl2");
    let c = sc.plan();
    assert_eq!(c.grants[0].1.phase, "post-3");
    sc.apply(&c);
    sc.apply(&sc.plan());
    sc.step("post-3", "keystone", "ctl1", true);
    sc.step("post-3", "keystone", "ctl2", true);
    // The stage is done; compute is not started.
    let c = sc.plan();
    assert_eq!(
        c.standing,
        Standing::StagesDone {
            not_started: vec!["compute".into()]
        }
    );
    assert!(!c.writes());
}

#[test]
fn the_limit_holds_within_a_phase_and_a_failure_stops_the_rollout() {
    let mut sc = Scene::new(&[]);
    // Skip the control plane: mark its steps done and its hosts upgraded.
    for h in ["ctl1", "ctl2"] {
        sc.controller_done(h);
        sc.put(&format!("/running/versions/v2/{h}"), "1");
        sc.del(&format!("/running/versions/v1/{h}"));
    }
    let c = sc.plan();
    assert_eq!(phase_of(&c, "controlplane"), None);
    assert_eq!(
        c.grants.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>(),
        vec!["compute"]
    );
    sc.apply(&c);
    // compute: 1 at a time.
    let c = sc.plan();
    assert_eq!(enabled(&c), vec!["cp1"]);
    sc.apply(&c);
    assert!(sc.plan().plan.enable_hosts.is_empty());
    sc.step("pre-1", "nova_compute", "cp1", true);
    let c = sc.plan();
    assert_eq!(enabled(&c), vec!["cp2"]);
    sc.apply(&c);
    sc.step("pre-1", "nova_compute", "cp2", false);
    let c = sc.plan();
    assert!(matches!(c.standing, Standing::Stopped { .. }), "{:?}", c.standing);
    let Standing::Stopped { failed } = c.standing else {
        unreachable!()
    };
    assert!(failed["cp2"].contains("failed at pre-1"), "{failed:?}");
}

#[test]
fn a_host_without_its_task_file_blocks_its_stage() {
    let mut sc = Scene::new(&["controlplane"]);
    sc.put(
        "/hosts/ctl2/services",
        r#"{"dir":"/s","services":{"keystone":{"pre":[1]}}}"#,
    );
    let c = sc.plan();
    assert!(c.grants.is_empty() && !c.writes());
    let why = &c.plan.reasons[&h("ctl2")];
    assert_eq!(why.code, ReasonCode::Blocked);
    assert!(
        why.text.contains("nova_api") && why.text.contains("/s/nova_api.toml"),
        "{}",
        why.text
    );
    assert!(
        c.plan.reasons[&h("ctl1")]
            .text
            .contains("waits for blocked host(s) ctl2")
    );
}

/// Walks the compute stage to its pre-1 phase with cp1 and cp2 admitted.
fn computes_in_pre_1(rules: &'static str) -> Scene {
    let mut sc = Scene::start(rules, &HOSTS, catalog);
    for h in ["ctl1", "ctl2"] {
        sc.controller_done(h);
        sc.put(&format!("/running/versions/v2/{h}"), "1");
        sc.del(&format!("/running/versions/v1/{h}"));
    }
    sc.settle();
    sc.step("pre-1", "nova_compute", "cp1", true);
    sc.settle();
    sc
}

#[test]
fn a_failed_host_whose_agent_runs_again_holds_the_phase_and_its_slot() {
    // max_failures 1 for this test.
    let mut sc = computes_in_pre_1(RULES_MAX_1);
    sc.step("pre-1", "nova_compute", "cp2", false);
    // cp2's agent runs its step again (a retry nobody asked the driver for):
    // the phase does not move on while it runs.
    sc.put(
        "/runs/cp2",
        r#"{"state":"upgrading","version":"v2","since":1,"pid":1}"#,
    );
    let c = sc.plan();
    assert!(c.grants.is_empty(), "moved on while cp2 runs: {:?}", c.grants);
    sc.del("/runs/cp2");
    let c = sc.plan();
    assert_eq!(
        c.grants.first().map(|(_, g)| g.phase.as_str()),
        Some("pre-2"),
        "{:?}",
        c.stages
    );
    // cp2 is recorded as left behind in the new grant.
    assert!(c.grants[0].1.left_behind.contains_key(&h("cp2")));
}

#[test]
fn a_held_host_at_the_version_settles_and_a_release_keeps_it_behind() {
    let mut sc = computes_in_pre_1(RULES);
    // cp2 is already at v2 (a retried rollout) and held: pre-1 settles.
    sc.put("/running/versions/v2/cp2", "1");
    sc.del("/running/versions/v1/cp2");
    sc.put("/holds/host/cp2", r#"{"by":"t","reason":"disk","at":1}"#);
    let c = sc.plan();
    assert_eq!(
        c.grants.first().map(|(_, g)| g.phase.as_str()),
        Some("pre-2"),
        "{:?}",
        c.stages
    );
    sc.apply(&c);
    // Released: it stays behind as held, never a failure.
    sc.del("/holds/host/cp2");
    let c = sc.plan();
    let why = &c.plan.reasons[&h("cp2")];
    assert!(why.text.contains("held"), "{why:?}");
    assert!(
        !matches!(c.standing, Standing::Stopped { .. }),
        "{:?}",
        c.standing
    );
}

#[test]
fn a_puppet_failure_of_an_earlier_rollout_does_not_fail_the_host_again() {
    let mut sc = computes_in_pre_1(RULES);
    // A failure entry from before this rollout started (revision 0, below the
    // rollout's /rollouts/current revision).
    sc.kvs.push(kv("/status/configured/failure/v2/cp2", "", 0));
    let snap = Snapshot::from_kvs(&Schema::default(), &sc.kvs);
    assert!(snap.failures.contains_key(&h("cp2")));
    sc.step("pre-1", "nova_compute", "cp2", true);
    sc.settle();
    for h in ["cp1", "cp2"] {
        sc.step("pre-2", "nova_compute", h, true);
    }
    // The puppet phase admits cp2 (limit 1: cp1 first, then cp2).
    let c = sc.settle();
    assert_eq!(
        phase_of(&c, "compute").as_deref(),
        Some("puppet"),
        "{:?}",
        c.stages
    );
    sc.put("/running/versions/v2/cp1", "1");
    sc.del("/running/versions/v1/cp1");
    let c = sc.settle();
    assert!(
        sc.kvs
            .iter()
            .any(|k| k.key.as_str() == "/config_state/enable_puppet/host/cp2" && k.value == "true"),
        "cp2 not admitted: {:?}",
        c.plan.reasons.get(&h("cp2"))
    );
}

#[test]
fn finalize_does_not_run_while_a_host_is_behind() {
    let mut sc = Scene::new(&[]);
    let ctl = CTL_WITH_FINALIZE;
    sc.put("/hosts/ctl1/services", ctl);
    sc.put("/hosts/ctl2/services", ctl);
    // cp2 is held through the rollout: it stays at v1, left behind.
    sc.put("/holds/host/cp2", r#"{"by":"t","reason":"disk","at":1}"#);
    for h in ["ctl1", "ctl2", "cp1"] {
        sc.put(&format!("/running/versions/v2/{h}"), "1");
        sc.del(&format!("/running/versions/v1/{h}"));
    }
    for h in ["ctl1", "ctl2"] {
        sc.controller_done(h);
    }
    for p in ["pre-1", "pre-2", "post-3"] {
        sc.step(p, "nova_compute", "cp1", true);
    }
    let c = sc.settle();
    assert!(c.finalize_grant.is_none(), "{:?}", c.finalize);
    assert_eq!(c.finalize.state, "not_run");
    assert!(
        matches!(&c.standing, Standing::Finished { failed } if failed["finalize"].contains("cp2")),
        "{:?}",
        c.standing
    );
}

#[test]
fn finalize_runs_once_on_the_first_healthy_host_after_everything() {
    let mut sc = Scene::new(&[]);
    for h in ["ctl1", "ctl2", "cp1", "cp2"] {
        sc.put(&format!("/running/versions/v2/{h}"), "1");
        sc.del(&format!("/running/versions/v1/{h}"));
    }
    for h in ["ctl1", "ctl2"] {
        sc.controller_done(h);
    }
    // nova_compute declares finalize tasks on the computes only: the finalize
    // host (a controller) cannot run them, which fails the rollout, named.
    for h in ["cp1", "cp2"] {
        for p in ["pre-1", "pre-2", "post-3"] {
            sc.step(p, "nova_compute", h, true);
        }
    }
    let c = sc.plan();
    assert_eq!(c.finalize.state, "failed", "{:?}", c.finalize);
    assert!(c.finalize.reason.as_ref().unwrap().contains("nova_compute"));
    // With the file on the controllers too, finalize is granted to ctl1 alone.
    let ctl = CTL_WITH_FINALIZE;
    sc.put("/hosts/ctl1/services", ctl);
    sc.put("/hosts/ctl2/services", ctl);
    let c = sc.plan();
    assert_eq!(c.finalize_grant.as_ref().map(|g| g.host.as_str()), Some("ctl1"));
    sc.apply(&c);
    let c = sc.plan();
    assert!(c.finalize_grant.is_none() && c.standing == Standing::Moving);
    sc.step("finalize", "nova_compute", "ctl1", true);
    let c = sc.plan();
    assert_eq!(
        c.standing,
        Standing::Finished {
            failed: BTreeMap::new()
        }
    );
    // A failed finalize fails the rollout.
    sc.step("finalize", "nova_compute", "ctl1", false);
    sc.del(&format!(
        "/status/steps/{}/finalize/nova_compute/success/ctl1",
        sc.rec.id
    ));
    let c = sc.plan();
    assert!(
        matches!(&c.standing, Standing::Finished { failed } if failed.contains_key("ctl1")),
        "{:?}",
        c.standing
    );
}
