//! The composable planner (`jio_common::compose::plan`) on values in the store that
//! no driver wrote, or that changed under a rollout, fed through
//! `Snapshot::from_kvs` as a driver's pass would see them. Each test walks a small
//! fleet through its phases the way the driver and the agents would, and checks
//! what an operator would notice (a host skipping its post steps, a rollout `done`
//! that did not upgrade its hosts, a stage that never moves).

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod fixtures;

use std::collections::BTreeMap;

use jio_common::compose::{Composed, Standing};

use fixtures::compose::Scene;
use fixtures::{h, kv_at as kv};

/// Two controllers running keystone and two computes running nova_compute, one
/// stage (`all`), no finalize task, no limits.
const RULES: &str = r#"{
    "roles_data": {"controller": ["keystone"], "compute": ["nova_compute"]},
    "finalize": {"role": "controller"}
}"#;

const CTL: &str = r#"{"dir":"/s","services":{"keystone":{"pre":[1],"post":[3]}}}"#;

const CP: &str = r#"{"dir":"/s","services":{"nova_compute":{"pre":[1],"post":[3]}}}"#;

const HOSTS: [(&str, &str); 4] = [
    ("ctl1", "controller"),
    ("ctl2", "controller"),
    ("cp1", "compute"),
    ("cp2", "compute"),
];

/// Two controllers and two computes, each publishing its service's catalog.
impl Scene {
    fn new() -> Scene {
        Scene::start(RULES, &HOSTS, |role| if role == "controller" { CTL } else { CP })
    }

    fn step_done(&mut self, phase: &str, service: &str, host: &str) {
        self.step(phase, service, host, true);
    }

    /// Runs the stage up to (and with) the post-3 grant written: pre-1 and Puppet
    /// done on every host.
    fn walk_to_post_3(&mut self) {
        let c = self.pass();
        assert_eq!(
            c.grants.first().map(|g| g.1.phase.as_str()),
            Some("pre-1"),
            "{c:?}"
        );
        self.pass(); // admits
        for (h, role) in HOSTS {
            let s = if role == "controller" {
                "keystone"
            } else {
                "nova_compute"
            };
            self.step_done("pre-1", s, h);
        }
        let c = self.pass();
        assert_eq!(
            c.grants.first().map(|g| g.1.phase.as_str()),
            Some("puppet"),
            "{c:?}"
        );
        self.pass();
        for (h, _) in HOSTS {
            self.puppet_done(h);
        }
        let c = self.pass();
        assert_eq!(
            c.grants.first().map(|g| g.1.phase.as_str()),
            Some("post-3"),
            "{c:?}"
        );
    }
}

/// Passes until the plan writes nothing more (at most `n`), the last plan returned.
fn settle(sc: &mut Scene, n: usize) -> Composed {
    let mut c = sc.pass();
    for _ in 0..n {
        if !c.writes() {
            break;
        }
        c = sc.pass();
    }
    c
}

/// Baseline: the scene walks to the end and the rollout is done, every host having
/// finished post-3 (so the tests below can fail for the right reason).
#[test]
fn baseline_a_stage_walks_to_done_after_every_host_finished_post_3() {
    let mut sc = Scene::new();
    sc.walk_to_post_3();
    let c = sc.pass();
    assert_eq!(c.plan.enable_hosts.len(), 4, "{c:?}");
    // Not done before every host finished post-3.
    for (hst, role) in &HOSTS[..3] {
        let s = if *role == "controller" {
            "keystone"
        } else {
            "nova_compute"
        };
        sc.step_done("post-3", s, hst);
    }
    let c = sc.pass();
    assert_eq!(c.standing, Standing::Moving, "{c:?}");
    sc.step_done("post-3", "nova_compute", "cp2");
    let c = settle(&mut sc, 4);
    assert_eq!(
        c.standing,
        Standing::Finished {
            failed: BTreeMap::new()
        },
        "{c:?}"
    );
}

/// A task file that gains a `pre` step while the stage is past its `pre` phases (a
/// package update on the computes during Puppet, as the brief asks) must not make the
/// planner skip those hosts' `post` steps and call the rollout a success: the new
/// phase lies before the grant, so every compute is "left behind" (not as a
/// failure), post-3 goes on with the controllers only, and the rollout ends
/// `Finished` with no failure although db sync / start never ran on a compute.
#[test]
fn a_pre_step_added_after_the_pre_phases_does_not_skip_the_hosts_post_steps() {
    let mut sc = Scene::new();
    sc.walk_to_post_3();
    // The computes' nova_compute file now also has a pre-2 task.
    for hst in ["cp1", "cp2"] {
        sc.put(
            &format!("/hosts/{hst}/services"),
            r#"{"dir":"/s","services":{"nova_compute":{"pre":[1,2],"post":[3]}}}"#,
        );
    }
    let c = sc.pass();
    // The computes must still take part in post-3 (or the stage must stop and say
    // why); they may not be silently dropped.
    let dropped: Vec<String> = ["cp1", "cp2"]
        .iter()
        .map(|cp| {
            c.plan
                .reasons
                .get(&h(cp))
                .map(|r| r.text.clone())
                .unwrap_or_default()
        })
        .filter(|why| why.contains("left behind"))
        .collect();
    // Whatever the planner does, the rollout may not end without failures while the
    // computes never ran post-3.
    for (hst, _) in &HOSTS[..2] {
        sc.step_done("post-3", "keystone", hst);
    }
    let end = settle(&mut sc, 6);
    let success = matches!(&end.standing, Standing::Finished { failed } if failed.is_empty());
    assert!(
        dropped.is_empty() && !success,
        "computes dropped by a task file change: {dropped:?}; rollout ended as a success \
         although cp1 and cp2 never ran post-3: {success} ({:?})",
        end.standing
    );
}

/// A `/steps/roles/<role>` value that parses but names a phase the stage does not
/// have (`post-9`; no driver writes it) must not make the planner treat every
/// phase before it as past: it would leave every host behind and end the rollout
/// as a success with nobody upgraded.
#[test]
fn a_grant_naming_a_phase_the_stage_does_not_have_does_not_end_the_rollout() {
    let mut sc = Scene::new();
    let c = sc.pass();
    assert_eq!(c.grants.len(), 2, "{c:?}");
    let id = sc.id();
    let forged = format!(r#"{{"rollout":"{id}","stage":"all","phase":"post-9","services":[],"level":0}}"#);
    sc.put("/steps/roles/compute", &forged);
    sc.put("/steps/roles/controller", &forged);
    let c = settle(&mut sc, 6);
    assert!(
        !matches!(&c.standing, Standing::Finished { failed } if failed.is_empty()),
        "the rollout ended as a success with no host upgraded: {c:#?}"
    );
    // The stage still runs pre-1 (the driver rewrites the grant it does not know).
    let g = sc.grant_of("compute").unwrap();
    assert_eq!(g["phase"], "pre-1", "{g}");
}

/// A stage of two roles (`all`) whose grant for one role is not JSON: the driver
/// reports the key, and must either write the grant again or not admit the role's
/// hosts (their agents, seeing no grant, will never run the phase). Otherwise the
/// stage waits for ever on hosts that were admitted into a phase they cannot see.
#[test]
fn an_unreadable_grant_of_one_role_is_written_again_or_its_hosts_are_not_admitted() {
    let mut sc = Scene::new();
    sc.pass(); // grants pre-1 to both roles
    sc.put("/steps/roles/compute", "{not json");
    let snap = sc.snap();
    assert!(
        snap.problems.iter().any(|p| p.contains("/steps/roles/compute")),
        "the problem names the key: {:?}",
        snap.problems
    );
    let c = sc.plan();
    let rewrites = c.grants.iter().any(|(r, _)| r.as_str() == "compute");
    let admits_computes = c.plan.enable_hosts.iter().any(|x| x.as_str().starts_with("cp"));
    assert!(
        rewrites || !admits_computes,
        "the compute grant is unreadable, yet it is not rewritten and the computes are admitted: {c:#?}"
    );
}

/// A non-JSON grant of a stage's only role, a non-UTF-8 step status and a status
/// of another rollout: the planner reports the key, does not count the garbage as
/// progress, and writes the grant again.
#[test]
fn garbage_grants_and_statuses_are_named_and_never_count_as_progress() {
    let mut sc = Scene::new();
    sc.pass();
    sc.pass(); // admits every host into pre-1
    // A status of another rollout and a non-UTF-8 one for this rollout's phase.
    sc.put("/status/steps/1-v9/pre-1/nova_compute/success/cp1", "");
    let id = sc.id();
    let mut bad = kv(
        &format!("/status/steps/{id}/pre-1/nova_compute/bogus/cp2"),
        "x",
        50,
    );
    bad.not_text = true;
    sc.kvs.push(bad);
    sc.put(&format!("/status/steps/{id}/pre-9x/nova_compute/success/cp2"), "");
    for (hst, role) in HOSTS {
        if role == "controller" {
            sc.step_done("pre-1", "keystone", hst);
        }
    }
    let c = sc.pass();
    assert!(
        c.grants.is_empty(),
        "pre-1 is not finished on the computes: {c:#?}"
    );
    // Both grants unreadable: they are named, and written again.
    sc.put("/steps/roles/compute", "\u{1}garbage");
    sc.put("/steps/roles/controller", "[]");
    let snap = sc.snap();
    for k in ["/steps/roles/compute", "/steps/roles/controller"] {
        assert!(
            snap.problems.iter().any(|p| p.contains(k)),
            "{k}: {:?}",
            snap.problems
        );
    }
    let c = sc.plan();
    assert!(
        c.grants.iter().all(|(_, g)| g.phase == "pre-1"),
        "the grant is written again for the phase going on: {c:#?}"
    );
    assert!(c.standing == Standing::Moving, "{c:?}");
}
