//! The composable planner's finalize step when its host is held, lost, or cannot
//! exist, fed to `jio_common::compose::plan` through `Snapshot::from_kvs` as a
//! driver's pass would see the store.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod fixtures;

use jio_common::compose::{Composed, Standing};

use fixtures::compose::Scene;
use fixtures::h;

/// Two controllers running keystone (and nova_compute's finalize file) and one
/// compute; max_failures 1.
const RULES: &str = r#"{
    "roles_data": {"controller": ["keystone"], "compute": ["nova_compute"]},
    "finalize": {"role": "controller"},
    "max_failures": 1
}"#;

const CAT: &str =
    r#"{"dir":"/s","services":{"keystone":{"pre":[1]},"nova_compute":{"pre":[1],"finalize":true}}}"#;

/// Hosts that each publish the same catalog.
impl Scene {
    fn new(hosts: &[(&'static str, &'static str)]) -> Scene {
        Scene::start(RULES, hosts, |_| CAT)
    }

    /// Every host's pre-1 and Puppet done (but `failing`, which failed pre-1).
    fn through_the_stage(&mut self, failing: Option<&str>) -> Composed {
        let mut last = self.plan();
        for _ in 0..20 {
            let c = self.plan();
            self.apply(&c);
            for (h, role) in self.hosts.clone() {
                let svc = if role == "controller" {
                    "keystone"
                } else {
                    "nova_compute"
                };
                if Some(h) == failing {
                    self.step("pre-1", svc, h, false);
                    continue;
                }
                self.step("pre-1", svc, h, true);
                if c.stages.iter().any(|s| s.phase.as_deref() == Some("puppet")) {
                    self.put(&format!("/running/versions/v2/{h}"), "1");
                    self.del(&format!("/running/versions/v1/{h}"));
                }
            }
            last = c;
            if last.finalize_grant.is_some() || !matches!(last.standing, Standing::Moving) {
                break;
            }
        }
        last
    }
}

/// Baseline: the stage walks through and finalize is granted to ctl1.
#[test]
fn baseline_finalize_is_granted_to_the_first_controller() {
    let mut sc = Scene::new(&[("cp1", "compute"), ("ctl1", "controller"), ("ctl2", "controller")]);
    let c = sc.through_the_stage(None);
    assert_eq!(
        c.finalize_grant.as_ref().map(|g| g.host.as_str()),
        Some("ctl1"),
        "{c:#?}"
    );
}

/// The only host of finalize.role failed pre-1 (max_failures 1): the stage is done
/// without it and no host can ever run the finalize tasks. The rollout must end
/// (failed, naming the host), not wait for a healthy host that cannot come.
#[test]
fn the_only_finalize_host_failed_ends_the_rollout() {
    let mut sc = Scene::new(&[("cp1", "compute"), ("ctl1", "controller")]);
    let c = sc.through_the_stage(Some("ctl1"));
    assert!(c.finalize_grant.is_none(), "{c:#?}");
    assert!(
        matches!(&c.standing, Standing::Finished { failed } | Standing::Stopped { failed } if failed.contains_key("ctl1")),
        "the rollout waits for ever: {:?} / {:?}",
        c.standing,
        c.finalize
    );
}

/// The finalize host is held after the grant was written, before its agent started
/// (its agent refuses while held): the plan must not keep saying it runs the
/// finalize tasks; it names the hold, or gives the step to the next healthy host.
#[test]
fn a_finalize_host_held_after_its_grant_is_named_held_or_replaced() {
    let mut sc = Scene::new(&[("cp1", "compute"), ("ctl1", "controller"), ("ctl2", "controller")]);
    let c = sc.through_the_stage(None);
    assert_eq!(c.finalize_grant.as_ref().map(|g| g.host.as_str()), Some("ctl1"));
    sc.apply(&c);
    sc.put("/holds/host/ctl1", r#"{"by":"op","reason":"disk","at":150}"#);
    let c = sc.plan();
    let moved = c
        .finalize_grant
        .as_ref()
        .is_some_and(|g| g.host.as_str() == "ctl2");
    let why = c
        .plan
        .reasons
        .get(&h("ctl1"))
        .map(|r| r.text.clone())
        .unwrap_or_default();
    let fin_reason = c.finalize.reason.clone().unwrap_or_default();
    assert!(
        moved || why.contains("held") || fin_reason.contains("held"),
        "the finalize host is held, yet: ctl1 reason {why:?}, finalize {:?}",
        c.finalize
    );
}
