//! A driver pass's decision about maintenance hooks, pure: from the snapshot, the
//! active rollout, the hooks' settings and the hooks this process runs, to the
//! writes of one fenced transaction and the hooks to start once it landed.
//!
//! The rules, for each host with a hook record of the active rollout:
//! - a hook this process ran ended: its record says how (a `before` that succeeded
//!   enables the host in the same transaction, fenced on the record and on
//!   `/rollouts/current`);
//! - a hook recorded running that this process does not run (its driver died, or
//!   this process lost the lock meanwhile): it runs again, never skipped;
//! - a drained host whose run reported success at the version: its `after` starts
//!   (with no `after` hook its slot is free at once);
//!
//! and for the plan's admissions: a host of a role with hooks is admitted by
//! recording its `before` hook running (the admission, fenced on the plan epoch as
//! an enable key is), and enabled only once it succeeded (at once without `before`).
//! A record that lags behind what this process wrote is waited for, not acted on.
//! Nothing here does I/O or reads the clock.

use std::collections::BTreeMap;
use std::time::Duration;

use jio_common::fleet::{HookStage, Snapshot};
use jio_common::hook_record::{HookKind, HookRecord, HookState};
use jio_common::keys::Schema;
use jio_common::names::{HostName, Role, Version};
use jio_common::plan::Plan;
use jio_common::rollout::RolloutRecord;
use jio_common::store::{Compare, Op};

use super::settings::HookSpec;
use crate::writes;

/// Which run of which hook, in which rollout's slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunKey {
    pub rollout: String,
    pub hook: HookKind,
    pub attempt: u32,
}

impl RunKey {
    fn of(rec: &HookRecord) -> RunKey {
        RunKey {
            rollout: rec.rollout.clone(),
            hook: rec.hook,
            attempt: rec.attempt,
        }
    }

    /// Runs of one slot in the order they happen: every `before` attempt, then
    /// every `after` attempt.
    fn pos(&self) -> (HookKind, u32) {
        (self.hook, self.attempt)
    }
}

/// A hook run of this process that ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    pub key: RunKey,
    /// `Ok`, or why it failed (`exited 3`, `did not finish within 10m ...`).
    pub result: Result<(), String>,
    pub exit_code: Option<i32>,
    /// Unix time it ended.
    pub ended: u64,
    /// A Swift link, or the path of its log on this host.
    pub log: Option<String>,
    /// The end of its output.
    pub tail: String,
}

/// A hook of this process, for one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Local {
    Running(RunKey),
    Done(Done),
}

impl Local {
    fn key(&self) -> &RunKey {
        match self {
            Local::Running(k) => k,
            Local::Done(d) => &d.key,
        }
    }
}

/// A hook to start once the transaction that records it running landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookStart {
    pub host: HostName,
    pub role: Role,
    pub version: Version,
    pub key: RunKey,
    pub argv: Vec<String>,
    pub timeout: Duration,
}

/// What a pass does about hooks.
#[derive(Debug, Default)]
pub struct Decided {
    pub ops: Vec<Op>,
    /// What the writes were decided on besides the plan epoch.
    pub compares: Vec<Compare>,
    pub starts: Vec<HookStart>,
    /// What to say once the writes landed.
    pub notes: Vec<String>,
    /// Hooks this driver cannot run (no `[hooks.<role>]` here): the host waits.
    pub cannot: Vec<String>,
    /// Ended runs that are recorded, or overtaken: this process forgets them.
    pub forget: Vec<HostName>,
}

/// What a hook decision reads.
pub struct Pass<'a> {
    pub schema: &'a Schema,
    pub snap: &'a Snapshot,
    pub rec: &'a RolloutRecord,
    pub roles: &'a BTreeMap<Role, HookSpec>,
    pub local: &'a BTreeMap<HostName, Local>,
    /// This driver: `<host>-<pid>`.
    pub me: &'a str,
    pub now: u64,
}

/// Hosts whose records a pass acts on at most (a transaction stays small).
const MOST: usize = 30;

/// The hooks' own progress: ended runs recorded, runs left behind started again,
/// `after` hooks started.
pub fn progress(p: &Pass<'_>) -> Decided {
    let mut d = Decided::default();
    let id = p.rec.id.as_str();
    for (h, local) in p.local {
        // Ended runs of another rollout's slots (a record that does not show this
        // rollout's yet lags behind this process's write: it is waited for).
        if local.key().rollout != id && matches!(local, Local::Done(_)) {
            d.forget.push(h.clone());
        }
    }
    let mine = p.snap.hooks.iter().filter(|(_, r)| r.rollout == id);
    for (h, rec) in mine {
        if d.starts.len() + d.ops.len() / 2 >= MOST {
            break;
        }
        let local = p.local.get(h);
        let here = RunKey::of(rec);
        if let Some(l) = local
            && l.key().pos() > here.pos()
        {
            continue; // The record lags behind what this process wrote.
        }
        match (rec.state, local) {
            (HookState::Running, Some(Local::Done(done))) if done.key == here => {
                record_end(p, h, rec, done, &mut d)
            }
            (HookState::Running, Some(Local::Running(k))) if *k == here => {}
            (HookState::Running, _) => run_again(p, h, rec, &mut d),
            _ => {
                if let Some(Local::Done(_)) = local {
                    d.forget.push(h.clone());
                }
                if let Some(HookStage::AfterDue(_)) = p.snap.hook_stage(h) {
                    start_after(p, h, rec, &mut d);
                }
            }
        }
    }
    d
}

/// The fences of a write decided on `h`'s record as read: the record itself and
/// the rollout still current.
fn fence(p: &Pass<'_>, h: &HostName, d: &mut Decided) {
    let rev = p.snap.hook_revisions.get(h).copied().unwrap_or(0);
    d.compares.push(Compare::ModRevision(p.schema.hook(h), rev));
    if let Some(c) = &p.snap.rollout
        && !d
            .compares
            .iter()
            .any(|x| matches!(x, Compare::ModRevision(k, _) if *k == p.schema.current_rollout()))
    {
        d.compares.push(Compare::ModRevision(
            p.schema.current_rollout(),
            c.current_revision,
        ));
    }
}

/// A run of this process ended: its record says how; a `before` that succeeded
/// enables the host.
fn record_end(p: &Pass<'_>, h: &HostName, rec: &HookRecord, done: &Done, d: &mut Decided) {
    // Its exit code is in the record: the message is then its output's end.
    let message = done
        .result
        .as_ref()
        .err()
        .map(|why| match (done.exit_code, done.tail.is_empty()) {
            (_, true) => why.clone(),
            (Some(_), false) => done.tail.clone(),
            (None, false) => format!("{why}\n{}", done.tail),
        });
    let ended = rec.ended(
        done.result.is_ok(),
        done.ended,
        done.exit_code,
        done.log.clone(),
        message,
    );
    fence(p, h, d);
    d.ops.push(writes::hook_put(p.schema, h, &ended));
    let took = format!("in {}s", done.ended.saturating_sub(rec.started));
    let line = match (&done.result, rec.hook) {
        (Ok(()), HookKind::Before) => {
            d.ops.push(writes::enable_host(p.schema, h));
            format!("{h}: before hook succeeded ({took}); enabled")
        }
        (Ok(()), HookKind::After) => format!("{h}: after hook succeeded ({took}); its slot is free"),
        (Err(_), _) => format!("{h}: {}; the host counts as failed", ended.describe()),
    };
    d.notes.push(line);
    d.forget.push(h.clone());
}

/// A hook recorded running that this process does not run: it runs again.
fn run_again(p: &Pass<'_>, h: &HostName, rec: &HookRecord, d: &mut Decided) {
    let Some(argv) = p.roles.get(&rec.role).and_then(|s| s.argv(rec.hook)) else {
        d.cannot.push(format!(
            "{h}: its {} hook is recorded running (by {}) but this driver has no {} hook for role {} in its configuration: it cannot run it, and the host keeps its slot",
            rec.hook, rec.driver, rec.hook, rec.role
        ));
        return;
    };
    let again = rec.restart(p.me, p.now);
    fence(p, h, d);
    d.ops.push(writes::hook_put(p.schema, h, &again));
    d.starts.push(start_of(p, h, &again, argv));
    d.notes.push(format!(
        "{h}: its {} hook was left running by {} (attempt {}); running it again",
        rec.hook, rec.driver, rec.attempt
    ));
}

/// A drained host reported success at the version: its `after` hook starts (its
/// slot is free at once when its role has none).
fn start_after(p: &Pass<'_>, h: &HostName, rec: &HookRecord, d: &mut Decided) {
    let Some(spec) = p.roles.get(&rec.role) else {
        d.cannot.push(format!(
            "{h}: its after hook is due but this driver has no [hooks.{}] in its configuration: the host keeps its slot",
            rec.role
        ));
        return;
    };
    let after = HookRecord::start(
        &rec.rollout,
        &rec.version,
        &rec.role,
        HookKind::After,
        p.me,
        p.now,
    );
    fence(p, h, d);
    match spec.argv(HookKind::After) {
        Some(argv) => {
            d.ops.push(writes::hook_put(p.schema, h, &after));
            d.starts.push(start_of(p, h, &after, argv));
            d.notes
                .push(format!("{h}: upgraded to {}; after hook starts", rec.version));
        }
        None => {
            let done = after.ended(true, p.now, None, None, Some("no after hook for its role".into()));
            d.ops.push(writes::hook_put(p.schema, h, &done));
            d.notes.push(format!(
                "{h}: upgraded to {} (its role has no after hook); its slot is free",
                rec.version
            ));
        }
    }
}

fn start_of(p: &Pass<'_>, h: &HostName, rec: &HookRecord, argv: &[String]) -> HookStart {
    HookStart {
        host: h.clone(),
        role: rec.role.clone(),
        version: rec.version.clone(),
        key: RunKey::of(rec),
        argv: argv.to_vec(),
        timeout: p
            .roles
            .get(&rec.role)
            .map_or(super::settings::DEFAULT_TIMEOUT, |s| s.timeout),
    }
}

/// The plan's admissions of hosts whose roles have hooks become the start of
/// their `before` hooks (taken out of `plan.enable_hosts`); a drained host the plan
/// enables again keeps its plain enable key.
pub fn admissions(p: &Pass<'_>, plan: &mut Plan) -> Decided {
    let mut d = Decided::default();
    let mut keep = Vec::new();
    for h in std::mem::take(&mut plan.enable_hosts) {
        let role = p.snap.role_of(&h);
        let stage = p.snap.hook_stage(&h);
        if p.local.contains_key(&h)
            || matches!(
                stage,
                Some(HookStage::Running(_) | HookStage::AfterDue(_) | HookStage::Unreadable)
            )
        {
            // Already in its slot (a plan never admits it): nothing starts twice.
            continue;
        }
        let drained = matches!(stage, Some(HookStage::Drained(_)));
        let Some(spec) = p.roles.get(&role).filter(|_| !drained) else {
            keep.push(h);
            continue;
        };
        let before = HookRecord::start(
            p.rec.id.as_str(),
            &p.rec.version,
            &role,
            HookKind::Before,
            p.me,
            p.now,
        );
        match spec.argv(HookKind::Before) {
            Some(argv) => {
                d.ops.push(writes::hook_put(p.schema, &h, &before));
                d.starts.push(start_of(p, &h, &before, argv));
                d.notes.push(format!("admitted {h}: its before hook starts"));
            }
            None => {
                let done = before.ended(
                    true,
                    p.now,
                    None,
                    None,
                    Some("no before hook for its role".into()),
                );
                d.ops.push(writes::hook_put(p.schema, &h, &done));
                d.ops.push(writes::enable_host(p.schema, &h));
                d.notes
                    .push(format!("admitted {h} (its role has no before hook): enabled"));
            }
        }
    }
    plan.enable_hosts = keep;
    d
}

#[cfg(test)]
mod tests;
