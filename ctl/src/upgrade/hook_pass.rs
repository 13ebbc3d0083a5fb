//! The driver's part in maintenance hooks, as pure steps: before planning, the
//! hooks' own progress (`hooks::decide::progress`) becomes an intent of its own
//! (written in its own fenced transaction); the plan's admissions of hosts with
//! hooks become the start of their `before` hooks (`hooks::decide::admissions`).
//! Composable rollouts run no hooks: a configuration that gives hooks to roles of
//! the fleet refuses to start or drive one.

use std::collections::BTreeMap;

use jio_common::fleet::{HostStatus, Snapshot};
use jio_common::keys::Schema;
use jio_common::names::HostName;
use jio_common::plan::Plan;
use jio_common::rollout::RolloutRecord;

use super::intent::Intent;
use crate::hooks::HookSettings;
use crate::hooks::decide::{self, Decided, Local};

/// What a hook step reads besides the snapshot.
pub struct HookPass<'a> {
    pub schema: &'a Schema,
    pub settings: &'a HookSettings,
    pub local: &'a BTreeMap<HostName, Local>,
    /// This driver: `<host>-<pid>`.
    pub me: &'a str,
    pub now: u64,
}

/// What the hooks' progress does this pass.
pub enum Progress {
    /// Nothing to write: forget these ended runs, and plan.
    Plan { forget: Vec<HostName> },
    /// Write this (and end the pass there).
    Write(Intent),
}

impl HookPass<'_> {
    fn pass<'a>(&'a self, snap: &'a Snapshot, rec: &'a RolloutRecord) -> decide::Pass<'a> {
        decide::Pass {
            schema: self.schema,
            snap,
            rec,
            roles: &self.settings.roles,
            local: self.local,
            me: self.me,
            now: self.now,
        }
    }

    /// Ended hooks recorded, hooks left running started again, `after` hooks
    /// started; and the hooks this driver cannot run, said.
    pub fn progress(&self, snap: &Snapshot, rec: &RolloutRecord) -> (Progress, Vec<String>) {
        let id = rec.id.as_str();
        if self.local.is_empty() && !snap.hooks.values().any(|r| r.rollout == id) {
            return (Progress::Plan { forget: Vec::new() }, Vec::new());
        }
        let mut d = decide::progress(&self.pass(snap, rec));
        let cannot = std::mem::take(&mut d.cannot);
        if d.ops.is_empty() {
            return (Progress::Plan { forget: d.forget }, cannot);
        }
        (Progress::Write(Intent::hooks(d)), cannot)
    }

    /// The plan's admissions of hosts whose roles have hooks, taken out of `plan`.
    pub fn admissions(&self, snap: &Snapshot, rec: &RolloutRecord, plan: &mut Plan) -> Decided {
        if self.settings.roles.is_empty() {
            return Decided::default();
        }
        decide::admissions(&self.pass(snap, rec), plan)
    }
}

/// Why a composable rollout cannot go with these hooks: roles of the fleet have
/// hooks, and composable rollouts run none.
pub fn composable_refusal(settings: &HookSettings, hosts: &[HostStatus]) -> Option<String> {
    let hooked: Vec<&str> = settings
        .roles
        .keys()
        .filter(|r| hosts.iter().any(|h| &h.role == *r))
        .map(|r| r.as_str())
        .collect();
    (!hooked.is_empty()).then(|| {
        format!(
            "composable rollouts run no maintenance hooks, and this configuration gives hooks to role(s) {} of the fleet",
            hooked.join(", ")
        )
    })
}
