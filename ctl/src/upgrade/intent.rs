//! A driver pass's decision, as data: the writes of one transaction, what to say
//! once they landed, and how the pass ends. Pure functions build it from what the
//! pass read (the snapshot, the rollout's record, its rules and the plan);
//! `Driver::act` applies it in one transaction fenced on the plan epoch and on
//! still holding the lock, and says its notes only once it landed. Nothing here
//! does I/O or reads the clock.

use std::collections::BTreeMap;
use std::time::Duration;

use jio_common::compose::{Composed, Standing};
use jio_common::fleet::{HostStatus, Snapshot};
use jio_common::keys::Schema;
use jio_common::names::HostName;
use jio_common::names::Version;
use jio_common::plan::{Plan, ReasonCode};
use jio_common::rollout::RolloutRecord;
use jio_common::rules::{self, Resolved, Rules};
use jio_common::store::{Compare, Op};

use super::next::{self, After, Deadline, PassOutcome, ProgressClock, Settled};
use crate::hooks::decide::{Decided, HookStart};
use crate::render;
use crate::rollouts;
use crate::status::stage_args;
use crate::writes;

/// Who the driver's changes of a record are by.
const BY: &str = "jioctl";

/// What one pass does.
#[derive(Debug)]
pub struct Intent {
    /// The writes, in one fenced transaction (none: nothing to write).
    pub ops: Vec<Op>,
    /// What the writes were decided on besides the plan epoch and the lock.
    pub compares: Vec<Compare>,
    /// Maintenance hooks to start once the writes (their records) landed.
    pub starts: Vec<HookStart>,
    /// Ended hook runs this process forgets once the writes landed.
    pub forget: Vec<HostName>,
    /// What to say once the writes landed.
    pub notes: Vec<Note>,
    /// How the pass ends once the writes landed.
    pub outcome: PassOutcome,
    /// A pass is due then without any change (the progress deadline).
    pub wake_at: Option<u64>,
    /// Bring the progress view up to date before acting (the rollout settled:
    /// nothing was admitted).
    pub refresh_progress: bool,
}

/// A line for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    Say(String),
    /// Hosts or roles admitted: said even by a quiet `jioctl upgrade`.
    Admitted(String),
}

impl Intent {
    fn ends(outcome: PassOutcome) -> Self {
        Intent {
            ops: Vec::new(),
            compares: Vec::new(),
            starts: Vec::new(),
            forget: Vec::new(),
            notes: Vec::new(),
            outcome,
            wake_at: None,
            refresh_progress: false,
        }
    }

    /// The record cannot change that way (it changed under the pass): plan again.
    pub fn replan() -> Self {
        Self::ends(PassOutcome::Replan)
    }

    fn write(ops: Vec<Op>, outcome: PassOutcome) -> Self {
        Intent {
            ops,
            ..Self::ends(outcome)
        }
    }

    fn say(mut self, line: String) -> Self {
        self.notes.push(Note::Say(line));
        self
    }

    fn waiting(line: String) -> Self {
        Self::ends(PassOutcome::Continue { waiting: Some(line) })
    }

    /// The hooks' own progress (`hooks::decide::progress`), written on its own: the
    /// watch brings it back, and the next pass plans with it.
    pub fn hooks(d: Decided) -> Self {
        Intent {
            ops: d.ops,
            compares: d.compares,
            starts: d.starts,
            forget: d.forget,
            notes: d.notes.into_iter().map(Note::Say).collect(),
            ..Self::ends(PassOutcome::Continue { waiting: None })
        }
    }
}

/// A paused rollout whose pause expired goes on.
pub fn resume(schema: &Schema, rec: &RolloutRecord, now: u64) -> Intent {
    let Some(resumed) = rec.pause_expired(now) else {
        return Intent::replan();
    };
    Intent::write(writes::update_ops(schema, &resumed), PassOutcome::Replan)
        .say(format!("rollout {}: its pause expired; it goes on", rec.id))
}

/// The desired version was changed outside the rollout: it ends, and its end
/// resets the keys it armed (under its rules, for its version).
pub fn version_moved(schema: &Schema, snap: &Snapshot, rec: &RolloutRecord, now: u64) -> Intent {
    let to = snap
        .current
        .as_ref()
        .map_or("nothing".to_string(), Version::to_string);
    let reason = format!("the desired version was changed to {to} outside this rollout");
    let Ok(ended) = rec.abort(BY, Some(reason.clone()), now) else {
        return Intent::replan();
    };
    Intent::write(writes::end_ops(schema, &ended, true), PassOutcome::Replan)
        .say(format!("rollout {} ended: {reason}", rec.id))
}

/// Why the rules admit nothing on today's fleet: the check `upgrade` made, made
/// again, unless the operator forced them.
pub fn refusal(
    rules: &Rules,
    resolved: &Resolved,
    hosts: &[HostStatus],
    rec: &RolloutRecord,
) -> Option<String> {
    let moving = hosts
        .iter()
        .filter(|h| h.state != jio_common::fleet::HostState::Upgraded)
        .count();
    let why = rules::check_intent(resolved, rules.sets_no_limit().then_some(moving), rec.forced).err()?;
    Some(format!(
        "{}; `jioctl upgrade {}{} --force` with the same rules records it forced and drives it as written, `jioctl rollout abort` ends it",
        rules::admits_nothing(&why),
        rec.version,
        stage_args(rec)
    ))
}

/// What a waiting pass is about.
#[derive(Debug, Clone, Copy)]
pub enum Unit {
    /// Hosts finish (a rolling rollout).
    Host,
    /// Hosts' steps finish (a composable rollout).
    Step,
}

/// A pass that admitted nothing while hosts move.
pub struct Wait<'a, H> {
    pub schema: &'a Schema,
    pub rec: &'a RolloutRecord,
    pub clock: &'a ProgressClock,
    /// What it waits for.
    pub line: String,
    /// What holds the rollout, asked only when it is marked stuck.
    pub holding: H,
    /// Something finished since the last pass.
    pub progressed: bool,
    /// The rules' `progress_deadline`.
    pub limit: Duration,
    pub now: u64,
    pub unit: Unit,
}

/// The progress deadline: mark the rollout stuck (naming what holds it), running
/// again once something finished; else wait, saying on what.
pub fn waiting<H: FnOnce() -> BTreeMap<String, String>>(w: Wait<'_, H>) -> Intent {
    let rec = w.rec;
    match next::deadline(rec, w.clock, w.progressed, w.limit, w.now) {
        Deadline::Stuck => {
            let Ok(stuck) = rec.stuck((w.holding)(), BY, w.now) else {
                return Intent::replan();
            };
            let what = match w.unit {
                Unit::Host => "no host",
                Unit::Step => "nothing",
            };
            Intent::write(writes::update_ops(w.schema, &stuck), PassOutcome::Replan).say(format!(
                "rollout {} is stuck: {what} finished within its progress_deadline ({}); waiting for: {}",
                rec.id,
                jio_common::duration::format(w.limit),
                w.line
            ))
        }
        Deadline::Unstuck => {
            let ops = rec
                .unstuck(BY, w.now)
                .map(|r| writes::update_ops(w.schema, &r))
                .unwrap_or_default();
            let what = match w.unit {
                Unit::Host => ": a host finished",
                Unit::Step => "",
            };
            Intent::write(ops, PassOutcome::Replan).say(format!("rollout {} moves again{what}", rec.id))
        }
        Deadline::Due(t) => Intent {
            wake_at: Some(t),
            ..Intent::waiting(w.line)
        },
        Deadline::None => Intent::waiting(w.line),
    }
}

/// A rolling rollout's pass, as read and planned.
pub struct Rolling<'a> {
    pub schema: &'a Schema,
    pub snap: &'a Snapshot,
    pub hosts: &'a [HostStatus],
    pub rec: &'a RolloutRecord,
    pub rules: &'a Rules,
    pub resolved: &'a Resolved,
    /// The plan, with nothing to admit when the rules were refused (its admissions
    /// of hosts with hooks taken out: they are in `hooks`).
    pub plan: &'a Plan,
    /// The plan's admissions of hosts with hooks: their `before` hooks start.
    pub hooks: &'a Decided,
    /// Why the rules admit nothing (`refusal`).
    pub refused: Option<&'a str>,
    pub clock: &'a ProgressClock,
    pub progressed: bool,
    pub now: u64,
}

/// A rolling rollout's pass: the canary phase moves on, the plan is written, the
/// rollout ends, or it waits.
pub fn rolling(p: &Rolling<'_>) -> Intent {
    if p.refused.is_none()
        && let Some(i) = canaries(p)
    {
        return i;
    }
    let (disarm, end) = match next::after_plan(p.snap, p.hosts, p.plan) {
        After::Apply => return admit(p),
        After::Settle { .. } if !p.hooks.ops.is_empty() => return admit(p),
        After::Settle { disarm, end } => (disarm, end),
    };
    let intent = match end {
        Settled::Finished { .. } | Settled::Stopped => finish_rolling(p, disarm, end),
        Settled::Waiting => waiting(Wait {
            schema: p.schema,
            rec: p.rec,
            clock: p.clock,
            line: p
                .refused
                .map_or_else(|| render::waiting_line_forever(p.hosts, p.plan), str::to_string),
            holding: || render::holding(p.hosts, p.plan, &p.resolved.group_of),
            progressed: p.progressed,
            limit: p.rules.progress_deadline,
            now: p.now,
            unit: Unit::Host,
        }),
    };
    Intent {
        refresh_progress: true,
        ..intent
    }
}

/// The plan's admissions and withdrawals, written; hosts with hooks admitted by
/// recording their `before` hooks running (started once this landed).
fn admit(p: &Rolling<'_>) -> Intent {
    let mut ops = writes::plan_ops(p.schema, p.plan);
    ops.extend(p.hooks.ops.iter().cloned());
    let mut i = Intent::write(
        ops,
        // The watch brings our own writes back into the view.
        PassOutcome::Continue { waiting: None },
    );
    i.starts = p.hooks.starts.clone();
    i.notes.extend(render::admitted(p.plan).map(Note::Admitted));
    i.notes.extend(p.hooks.notes.iter().cloned().map(Note::Admitted));
    i
}

/// The canary phase moves on: every canary finished healthy (the soak counts from
/// now, on this driver's clock), or they stayed healthy for `canary_soak`.
fn canaries(p: &Rolling<'_>) -> Option<Intent> {
    let canary = p.plan.canary.as_ref()?;
    let soak = p
        .rules
        .canary_soak
        .map(jio_common::duration::format)
        .unwrap_or_default();
    if canary.mark_done
        && let Some(done) = p.rec.canaries_done(p.now)
    {
        return Some(
            Intent::write(writes::update_ops(p.schema, &done), PassOutcome::Replan).say(format!(
                "rollout {}: every canary finished healthy; the rest waits for canary_soak ({soak})",
                p.rec.id
            )),
        );
    }
    if !canary.promote {
        return None;
    }
    let reason = format!("the canaries stayed healthy for canary_soak ({soak})");
    let Ok(promoted) = p.rec.promote(BY, Some(reason.clone()), p.now) else {
        return Some(Intent::replan());
    };
    Some(
        Intent::write(writes::update_ops(p.schema, &promoted), PassOutcome::Replan).say(format!(
            "rollout {} promoted: {reason}; the rest is admitted",
            p.rec.id
        )),
    )
}

/// Nothing moves any more: the rollout is recorded done or failed (stopped on
/// failures), its keys reset when it armed them.
fn finish_rolling(p: &Rolling<'_>, disarm: bool, end: Settled) -> Intent {
    let failed = rollouts::failed_hosts(p.snap);
    let Ok(mut ended) = p.rec.finish(failed.clone(), BY, p.now) else {
        return Intent::replan();
    };
    let held = (!p.plan.held.is_empty()).then(|| {
        format!(
            "held back (still at their version): {}",
            jio_common::values::host_list(&p.plan.held)
        )
    });
    if let Some(h) = &held
        && let Some(c) = ended.changes.last_mut()
    {
        c.reason = Some(h.clone());
    }
    let outcome = match end {
        Settled::Stopped => PassOutcome::Stopped {
            failures: failed.clone().into_iter().collect(),
        },
        _ => PassOutcome::Finished { failed: failed.len() },
    };
    let mut i = Intent::write(writes::end_ops(p.schema, &ended, disarm), outcome);
    if disarm {
        i = i.say("enable keys reset (puppet disabled globally): nothing is left armed".into());
    }
    i.say(format!(
        "rollout {} to {} {}{}",
        p.rec.id,
        p.rec.version,
        ended.state.name(),
        held.map(|h| format!("; {h}")).unwrap_or_default()
    ))
}

/// A composable rollout's pass, as read and planned.
pub struct Composable<'a> {
    pub schema: &'a Schema,
    pub rec: &'a RolloutRecord,
    pub composed: &'a Composed,
    /// The rules' `max_failures` on this fleet.
    pub max_failures: u64,
    /// A `jioctl upgrade` follows this rollout (it ends when its stages are done).
    pub following: bool,
    pub clock: &'a ProgressClock,
    pub progressed: bool,
    pub limit: Duration,
    pub now: u64,
}

/// A composable rollout's pass: a stage's phase moves on, the phase's hosts are
/// admitted, the finalize step is granted, or the rollout ends; otherwise it waits.
pub fn composable(p: &Composable<'_>) -> Intent {
    let composed = p.composed;
    if composed.writes() {
        return compose_writes(p.schema, composed);
    }
    match &composed.standing {
        Standing::Finished { failed } => finish_composable(p, failed, false),
        Standing::Stopped { failed } => finish_composable(p, failed, true),
        Standing::StagesDone { not_started } => {
            let line = stages_done_line(p.rec, not_started);
            if p.following {
                Intent::ends(PassOutcome::StagesDone(not_started.clone())).say(line)
            } else {
                Intent::waiting(line)
            }
        }
        Standing::Moving => waiting(Wait {
            schema: p.schema,
            rec: p.rec,
            clock: p.clock,
            line: render::compose_waiting(composed),
            holding: || {
                composed
                    .plan
                    .reasons
                    .iter()
                    .filter(|(_, r)| !matches!(r.code, ReasonCode::WaitingFor))
                    .map(|(h, r)| (h.to_string(), r.text.clone()))
                    .collect()
            },
            progressed: p.progressed,
            limit: p.limit,
            now: p.now,
            unit: Unit::Step,
        }),
    }
}

/// What a follower says when every started stage is done.
pub fn stages_done_line(rec: &RolloutRecord, not_started: &[String]) -> String {
    format!(
        "every started stage is done; not started: {} (`jioctl upgrade {} --stage {}` continues this rollout)",
        not_started.join(", "),
        rec.version,
        not_started.first().map_or("", |s| s.as_str())
    )
}

/// The grants, admissions and finalize grant of a composable pass, written.
fn compose_writes(schema: &Schema, composed: &Composed) -> Intent {
    let mut i = Intent::write(
        writes::compose_ops(schema, composed),
        PassOutcome::Continue { waiting: None },
    );
    if let Some((_, g)) = composed.grants.first() {
        let services = if g.services.is_empty() {
            String::new()
        } else {
            let names: Vec<&str> = g.services.iter().map(|s| s.as_str()).collect();
            format!(" ({})", names.join(", "))
        };
        i = i.say(format!("stage {}: phase {}{services} begins", g.stage, g.phase));
    }
    if let Some(f) = &composed.finalize_grant {
        i = i.say(format!("finalize: granted to {}", f.host));
    }
    if composed.grants.is_empty()
        && let Some(a) = render::admitted(&composed.plan)
    {
        i = i.say(a);
    }
    i
}

/// Every stage and the finalize step are done, or more hosts failed than allowed:
/// the rollout is recorded done or failed, and its keys reset.
fn finish_composable(p: &Composable<'_>, failed: &BTreeMap<String, String>, stopped: bool) -> Intent {
    let composed = p.composed;
    let Ok(mut ended) = p.rec.finish(failed.clone(), BY, p.now) else {
        return Intent::replan();
    };
    let mut why: Vec<String> = Vec::new();
    if stopped && let Some(at) = render::stopped_at(composed) {
        why.push(at);
    }
    if !composed.plan.held.is_empty() {
        why.push(format!(
            "held back (still at their version): {}",
            jio_common::values::host_list(&composed.plan.held)
        ));
    }
    if !why.is_empty()
        && let Some(ch) = ended.changes.last_mut()
    {
        ch.reason = Some(why.join("; "));
    }
    let over = if stopped {
        format!(
            ": {} host(s) failed, more than max_failures {}",
            failed.len(),
            p.max_failures
        )
    } else {
        String::new()
    };
    let mut i = Intent::write(
        writes::end_ops(p.schema, &ended, true),
        PassOutcome::Finished { failed: failed.len() },
    )
    .say(format!(
        "rollout {} to {} {}{over}",
        p.rec.id,
        p.rec.version,
        ended.state.name()
    ));
    for (h, why) in failed {
        i = i.say(format!("  {h}: {why}"));
    }
    if let Some(r) = ended.changes.last().and_then(|c| c.reason.as_ref()) {
        i = i.say(format!("  ({r})"));
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use jio_common::fleet::{HostState, HostStatus};
    use jio_common::names::{HostName, Role};
    use jio_common::plan::CanaryPhase;

    fn rec() -> RolloutRecord {
        RolloutRecord::start(
            Version::new("v2").unwrap(),
            Some(Version::new("v1").unwrap()),
            serde_json::json!({"canary": 1, "canary_soak": "10m"}),
            "alice@laptop",
            1_000,
        )
    }

    fn host(name: &str, state: HostState) -> HostStatus {
        HostStatus {
            host: HostName::new(name).unwrap(),
            role: Role::new("compute").unwrap(),
            state,
            reason: None,
        }
    }

    /// What an intent says, in short: whether it writes, its notes, its outcome.
    fn shape(i: &Intent) -> (bool, Vec<String>, String) {
        let notes = i
            .notes
            .iter()
            .map(|n| match n {
                Note::Say(l) => l.clone(),
                Note::Admitted(l) => format!("admitted: {l}"),
            })
            .collect();
        (!i.ops.is_empty(), notes, format!("{:?}", i.outcome))
    }

    #[test]
    fn the_progress_deadline_marks_stuck_moves_again_or_wakes_the_driver() {
        let schema = Schema::default();
        let running = rec();
        let stuck = running.stuck(BTreeMap::new(), BY, 1_100).unwrap();
        let limit = Duration::from_secs(300);
        let mut clock = ProgressClock::default();
        clock.since = 1_000;
        // (record, progressed, now) -> writes, first note, outcome, wake at
        let cases = [
            (&running, false, 1_200, false, None, "Continue", Some(1_300)),
            (
                &running,
                false,
                1_300,
                true,
                Some("is stuck: no host finished"),
                "Replan",
                None,
            ),
            (
                &stuck,
                true,
                1_400,
                true,
                Some("moves again: a host finished"),
                "Replan",
                None,
            ),
            (&stuck, false, 1_400, false, None, "Continue", None),
        ];
        for (r, progressed, now, writes, note, outcome, wake) in cases {
            let i = waiting(Wait {
                schema: &schema,
                rec: r,
                clock: &clock,
                line: "compute1 upgrading".into(),
                holding: || BTreeMap::from([("compute1".to_string(), "upgrading".to_string())]),
                progressed,
                limit,
                now,
                unit: Unit::Host,
            });
            let (w, notes, out) = shape(&i);
            let case = format!("{} progressed={progressed} now={now}", r.state.name());
            assert_eq!(w, writes, "{case}");
            assert_eq!(
                notes.first().map(|n| n.contains(note.unwrap_or(""))),
                note.map(|_| true),
                "{case}: {notes:?}"
            );
            assert!(out.starts_with(outcome), "{case}: {out}");
            assert_eq!(i.wake_at, wake, "{case}");
        }
    }

    #[test]
    fn canaries_move_on_only_when_the_rules_are_not_refused() {
        let schema = Schema::default();
        let r = rec();
        let rules = Rules::parse(&r.rules.to_string()).unwrap();
        let hosts = vec![
            host("compute1", HostState::Upgraded),
            host("compute2", HostState::Pending),
        ];
        let roles = hosts.iter().map(|h| h.role.clone()).collect();
        let resolved = rules.resolve(&roles).unwrap();
        let snap = Snapshot::default();
        let clock = ProgressClock::default();
        let phase = |mark_done, promote| Plan {
            canary: Some(CanaryPhase {
                canaries: vec![HostName::new("compute1").unwrap()],
                soaked_at: None,
                promote,
                mark_done,
            }),
            ..Plan::default()
        };
        // (mark_done, promote, refused) -> writes, what it says
        let cases = [
            (
                true,
                false,
                None,
                true,
                "every canary finished healthy; the rest waits for canary_soak (10m)",
            ),
            (
                false,
                true,
                None,
                true,
                "promoted: the canaries stayed healthy for canary_soak (10m)",
            ),
            (true, false, Some("refused"), false, ""),
            (false, true, Some("refused"), false, ""),
        ];
        for (mark_done, promote, refused, writes, says) in cases {
            let plan = phase(mark_done, promote);
            let i = rolling(&Rolling {
                schema: &schema,
                snap: &snap,
                hosts: &hosts,
                rec: &r,
                rules: &rules,
                resolved: &resolved,
                plan: &plan,
                hooks: &Decided::default(),
                refused,
                clock: &clock,
                progressed: false,
                now: 1_100,
            });
            let (w, notes, out) = shape(&i);
            let case = format!("mark_done={mark_done} promote={promote} refused={refused:?}");
            assert_eq!(w, writes, "{case}: {notes:?}");
            if writes {
                assert!(notes.iter().any(|n| n.contains(says)), "{case}: {notes:?}");
                assert_eq!(out, "Replan", "{case}");
            } else {
                // Refused: nothing moves, the pass waits saying why.
                assert!(out.contains("refused"), "{case}: {out}");
                assert!(i.refresh_progress, "{case}");
            }
        }
    }
}
