//! The rollout driver's decisions, pure. Within a pass: from the snapshot and the
//! current rollout's record to what the pass does (stand by, take the lock, watch,
//! stay paused, resume an expired pause, end a rollout whose version was moved,
//! plan), from the plan to whether it applies it or settles (end the rollout done or
//! failed, resetting the keys; wait), and the progress deadline (stuck, unstuck). Between passes:
//! from what the last step observed (a pass's outcome, the lock, the store) and
//! the driver's state to what it does next (plan again, take the lock again,
//! pause, wait for a change, or end with which code). No I/O and no clock here:
//! the shell passes what time it is, as facts.

use std::time::Duration;

use tokio::time::Instant;

use std::collections::BTreeMap;

use jio_common::fleet::{HostState, HostStatus, LockRecord, Snapshot};
use jio_common::gate::KeyState;
use jio_common::plan::Plan;
use jio_common::rollout::{RolloutId, RolloutRecord, RolloutState};
use jio_common::rules::RulesError;

use crate::exit;

/// How long `--retry` keeps going while the store is unreachable.
pub const STORE_PATIENCE: Duration = Duration::from_secs(300);
/// Pause between passes while the store is unreachable.
pub const UNREACHABLE_PAUSE: Duration = Duration::from_secs(1);
/// While waiting, what blocks the rollout is said on every change and at least
/// this often.
pub const WAITING_REMINDER: Duration = Duration::from_secs(60);

/// Who this driver is, as facts at the start of a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Who {
    /// It holds the rollout lock.
    pub holding: bool,
    /// It may take the lock now: the lock is free and (for a following `jioctl`) no
    /// driver service is there to take it.
    pub may_take: bool,
}

/// What a pass does, from its snapshot, before planning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// No rollout is active: nothing to drive (a driver service waits).
    Idle,
    /// The rollout this `jioctl` follows is no longer the current one: it ended, or
    /// another replaced it.
    Ended,
    /// `/rollouts/current` or its record cannot be used: why, naming the key.
    Unusable(String),
    /// The lock is free: take it, then drive.
    TakeLock,
    /// Another process drives it: show its progress.
    Watch(RolloutRecord),
    /// Paused: nothing is admitted; hosts in flight finish.
    Paused(RolloutRecord),
    /// Stuck: a following `jioctl` stops and names what holds it.
    Stuck(RolloutRecord),
    /// A pause whose expiry passed: resume it (fenced).
    Expired(RolloutRecord),
    /// The desired version is no longer the rollout's (written outside rollouts):
    /// end it (fenced), without touching the keys of whoever wrote it.
    VersionMoved(RolloutRecord),
    /// Plan under the rollout's rules.
    Plan(RolloutRecord),
}

/// Decides what a pass does before planning. `target`: the rollout a following
/// `jioctl` follows (`None`: a driver service, which drives whatever is current).
pub fn step(snap: &Snapshot, target: Option<&RolloutId>, who: Who, now: u64) -> Step {
    let Some(cur) = &snap.rollout else {
        return if target.is_some() { Step::Ended } else { Step::Idle };
    };
    // A value that names no usable rollout (not an id, or an id without a record)
    // ends nothing: nobody replaced the rollout, a value is to be fixed. Only a
    // usable record of another rollout means it was replaced.
    let rec = match &cur.record {
        Err(e) => return Step::Unusable(e.clone()),
        Ok(r) => r.clone(),
    };
    if target.is_some_and(|t| t.as_str() != cur.id) {
        return Step::Ended;
    }
    if !rec.state.active() {
        return if target.is_some() { Step::Ended } else { Step::Idle };
    }
    let paused = matches!(rec.state, RolloutState::Paused { .. });
    if target.is_some() && matches!(rec.state, RolloutState::Stuck { .. }) {
        return Step::Stuck(rec);
    }
    if !who.holding {
        return if who.may_take {
            Step::TakeLock
        } else if paused {
            Step::Paused(rec)
        } else {
            Step::Watch(rec)
        };
    }
    if let Some(problem) = &snap.current_invalid {
        // Not a change of version: a value to fix. Nothing is admitted meanwhile.
        return Step::Unusable(problem.clone());
    }
    if snap.current.as_ref() != Some(&rec.version) {
        return Step::VersionMoved(rec);
    }
    if paused {
        return if rec.pause_expired(now).is_some() {
            Step::Expired(rec)
        } else {
            Step::Paused(rec)
        };
    }
    Step::Plan(rec)
}

/// When hosts last finished, as this driver saw them: the progress deadline counts
/// from it (or from the rollout's last change, whichever is later).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProgressClock {
    finished: Option<usize>,
    /// Unix time of the last change in how many hosts finished (or of the first note).
    pub since: u64,
}

impl ProgressClock {
    /// Notes how many hosts have finished (upgraded or failed) at `now`: whether
    /// that changed since the last note.
    pub fn note(&mut self, finished: usize, now: u64) -> bool {
        let changed = self.finished.is_some_and(|f| f != finished);
        if self.finished != Some(finished) {
            self.since = now;
        }
        self.finished = Some(finished);
        changed
    }
}

/// What the progress deadline asks of a waiting pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// No host finished for `progress_deadline`: mark the rollout stuck.
    Stuck,
    /// It was stuck and a host finished: running again.
    Unstuck,
    /// Look again at this Unix time.
    Due(u64),
    /// Not counted (paused, or ended).
    None,
}

/// Decides the progress deadline of a waiting pass.
pub fn deadline(
    rec: &RolloutRecord,
    clock: &ProgressClock,
    progressed: bool,
    limit: Duration,
    now: u64,
) -> Deadline {
    match rec.state {
        RolloutState::Stuck { .. } if progressed => Deadline::Unstuck,
        RolloutState::Running => {
            // Times come from the store: never overflow on them.
            let due = clock.since.max(rec.changed_at()).saturating_add(limit.as_secs());
            if now >= due {
                Deadline::Stuck
            } else {
                Deadline::Due(due)
            }
        }
        _ => Deadline::None,
    }
}

/// What a pass does with its plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Write the plan (fenced).
    Apply,
    /// Nothing to admit. `disarm`: reset the enable keys first (fenced), so that a
    /// finished or stopped rollout leaves nothing armed.
    Settle { disarm: bool, end: Settled },
}

/// How a pass that admitted nothing ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Nothing pending, upgrading, lost or blocked.
    Finished { failed: usize },
    /// More failures than allowed.
    Stopped,
    /// Hosts are moving: wait for them.
    Waiting,
}

/// Some enable key would still let a host start.
pub fn armed(snap: &Snapshot) -> bool {
    snap.global != KeyState::Set(false) || !snap.role_keys.is_empty() || !snap.host_keys.is_empty()
}

/// Decides what a pass does with its plan.
pub fn after_plan(snap: &Snapshot, hosts: &[HostStatus], plan: &Plan) -> After {
    if !plan.is_empty() {
        return After::Apply;
    }
    let count = |s: HostState| hosts.iter().filter(|h| h.state == s).count();
    // Held hosts stay behind (the rollout ends without them); soaking ones still
    // hold their slots.
    let moving = count(HostState::Pending) - plan.held.len()
        + count(HostState::Upgrading)
        + count(HostState::Lost)
        + count(HostState::Blocked)
        + plan.soaking.len();
    let end = if moving == 0 {
        Settled::Finished {
            failed: count(HostState::Failed),
        }
    } else if plan.stopped_on_failures && !hosts.iter().any(|h| snap.in_hooks(&h.host)) {
        // Hosts in their hooks' slot finish first (their after hooks put them back).
        Settled::Stopped
    } else {
        return After::Settle {
            disarm: false,
            end: Settled::Waiting,
        };
    };
    After::Settle {
        disarm: armed(snap),
        end,
    }
}

/// How one pass ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PassOutcome {
    /// The store changed under the plan: read it again and plan again.
    Replan,
    /// The view is fresh: plan again at once.
    Again,
    /// The rollout lock is no longer ours: take it again or stop.
    LockLost,
    /// No rollout is active.
    Idle,
    /// The followed rollout is no longer current: its record as it ended.
    Ended(Option<Box<RolloutRecord>>),
    /// The followed rollout is stuck: the hosts that hold it, and why.
    Stuck(BTreeMap<String, String>),
    /// More failures than allowed (the rollout was recorded failed, the enable keys reset).
    Stopped {
        /// Each failed host, and why (its failed step or hook).
        failures: Vec<(String, String)>,
    },
    /// Nothing pending or upgrading (the rollout was recorded done or failed).
    Finished { failed: usize },
    /// A composable rollout's started stages are done; these are not started.
    StagesDone(Vec<String>),
    /// Hosts are moving; `waiting` says on what, when nothing was admitted.
    Continue { waiting: Option<String> },
}

/// What the driver's last step observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    Pass(PassOutcome),
    /// The lock's lease ended before the pass (seen by its keeper).
    LeaseEnded,
    /// The lock was taken again.
    Retaken,
    /// Taking the lock again failed: someone else holds it.
    LockHeld(Option<LockRecord>),
    /// The store did not answer during the pass.
    Unreachable,
    /// The rules no longer fit the fleet (a role appeared that breaks them).
    RulesInvalid(RulesError),
}

/// The driver's state, as facts at the moment of deciding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DriverState {
    /// Keep going until the rollout ends (not `--once`).
    pub follow: bool,
    /// A driver service (`jioctl drive`): it never ends on its own.
    pub daemon: bool,
    /// `--timeout` has passed.
    pub deadline_passed: bool,
    /// How long the store has been unreachable, if it is.
    pub unreachable_for: Option<Duration>,
}

/// What the rollout was doing when `--timeout` passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum During {
    Waiting,
    Unreachable,
}

/// How a rollout ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// One pass was applied (`--once`).
    Applied,
    /// Nothing pending or upgrading; `failed` hosts failed.
    Finished {
        failed: usize,
    },
    /// The stages this composable rollout was started with are done; these are not.
    StagesDone(Vec<String>),
    /// Stopped on failures.
    Stopped {
        /// Each failed host, and why (its failed step or hook).
        failures: Vec<(String, String)>,
    },
    /// The followed rollout ended elsewhere, or was replaced: its record.
    Ended(Option<Box<RolloutRecord>>),
    /// The followed rollout is stuck: the hosts that hold it, and why.
    Stuck(BTreeMap<String, String>),
    TimedOut(During),
    /// Lost the rollout lock to another driver.
    LockLost(Option<LockRecord>),
    InvalidRules(RulesError),
}

impl Ending {
    /// The documented exit code.
    pub fn code(&self) -> u8 {
        match self {
            Ending::Applied | Ending::Finished { failed: 0 } | Ending::StagesDone(_) => exit::OK,
            Ending::Finished { .. } | Ending::Stopped { .. } => exit::FAILED,
            Ending::Ended(r) => match r.as_deref().map(|r| &r.state) {
                Some(RolloutState::Done) => exit::OK,
                Some(RolloutState::Failed { .. }) | None => exit::FAILED,
                // Aborted, replaced, or taken out of /rollouts/current by hand.
                Some(_) => exit::HALTED,
            },
            Ending::Stuck(_) => exit::STUCK,
            Ending::TimedOut(_) => exit::TIMED_OUT,
            Ending::LockLost(_) => exit::LOCKED,
            Ending::InvalidRules(_) => exit::INVALID_RULES,
        }
    }

    /// Whether the final status is shown.
    pub fn shows_status(&self) -> bool {
        match self {
            Ending::Applied | Ending::Finished { .. } | Ending::StagesDone(_) => true,
            Ending::Ended(r) => matches!(
                r.as_deref().map(|r| &r.state),
                Some(RolloutState::Done | RolloutState::Failed { .. })
            ),
            _ => false,
        }
    }
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Plan again from the live view as it is.
    Pass,
    /// Plan again from a fresh read.
    Reread,
    /// Take the rollout lock again (before writing anything).
    Retake,
    /// Read afresh after this pause.
    Pause(Duration),
    /// Wait for a change that a plan depends on.
    Wait,
    /// Give up with the store's error.
    GiveUp,
    End(Ending),
}

/// The decision.
pub fn next(observed: &Observed, s: &DriverState) -> Next {
    match observed {
        Observed::LeaseEnded => Next::Retake,
        Observed::Retaken => Next::Reread,
        // A driver service goes back to standing by; a following jioctl stops.
        Observed::LockHeld(_) if s.daemon => Next::Reread,
        Observed::LockHeld(by) => Next::End(Ending::LockLost(by.clone())),
        Observed::RulesInvalid(_) if s.daemon => Next::Wait,
        Observed::RulesInvalid(e) => Next::End(Ending::InvalidRules(e.clone())),
        Observed::Unreachable if s.daemon => Next::Pause(UNREACHABLE_PAUSE),
        Observed::Unreachable if !s.follow => Next::GiveUp,
        Observed::Unreachable if s.unreachable_for.is_some_and(|d| d > STORE_PATIENCE) => Next::GiveUp,
        Observed::Unreachable if s.deadline_passed => Next::End(Ending::TimedOut(During::Unreachable)),
        Observed::Unreachable => Next::Pause(UNREACHABLE_PAUSE),
        Observed::Pass(p) => match p {
            PassOutcome::Replan => Next::Reread,
            PassOutcome::Again => Next::Pass,
            PassOutcome::LockLost => Next::Retake,
            PassOutcome::Idle | PassOutcome::Stopped { .. } | PassOutcome::Finished { .. } if s.daemon => {
                Next::Wait
            }
            PassOutcome::Idle => Next::End(Ending::Ended(None)),
            PassOutcome::Ended(r) => Next::End(Ending::Ended(r.clone())),
            PassOutcome::Stuck(h) => Next::End(Ending::Stuck(h.clone())),
            PassOutcome::Stopped { failures } => Next::End(Ending::Stopped {
                failures: failures.clone(),
            }),
            PassOutcome::Finished { failed } => Next::End(Ending::Finished { failed: *failed }),
            PassOutcome::StagesDone(_) if s.daemon => Next::Wait,
            PassOutcome::StagesDone(left) => Next::End(Ending::StagesDone(left.clone())),
            PassOutcome::Continue { .. } if s.daemon => Next::Wait,
            PassOutcome::Continue { .. } if !s.follow => Next::End(Ending::Applied),
            PassOutcome::Continue { .. } if s.deadline_passed => Next::End(Ending::TimedOut(During::Waiting)),
            PassOutcome::Continue { .. } => Next::Wait,
        },
    }
}

/// The waiting line: said when it changed and at least every `WAITING_REMINDER`.
#[derive(Debug, Default)]
pub struct Waiting {
    /// The last line noted (said or not).
    pub last: Option<String>,
    said_at: Option<Instant>,
}

impl Waiting {
    /// Notes `line` at `now`: whether it is to be said.
    pub fn note(&mut self, line: String, now: Instant) -> bool {
        let due = self
            .said_at
            .is_none_or(|t| now.saturating_duration_since(t) >= WAITING_REMINDER);
        let say = self.last.as_ref() != Some(&line) || due;
        if say {
            self.said_at = Some(now);
        }
        self.last = Some(line);
        say
    }

    /// How long until the line is to be repeated.
    pub fn until_reminder(&self, now: Instant) -> Duration {
        match self.said_at {
            Some(t) => WAITING_REMINDER.saturating_sub(now.saturating_duration_since(t)),
            None => WAITING_REMINDER,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jio_common::fleet::CurrentRollout;
    use jio_common::names::{HostName, Version};

    fn lock() -> LockRecord {
        LockRecord {
            holder: "bob".into(),
            host: "ops1".into(),
            pid: 7,
            since: 1,
        }
    }

    fn rec() -> RolloutRecord {
        RolloutRecord::start(
            Version::new("v2").unwrap(),
            Some(Version::new("v1").unwrap()),
            serde_json::json!({}),
            "alice@laptop",
            1_000,
        )
    }

    fn snap(r: Option<RolloutRecord>, current: &str) -> Snapshot {
        Snapshot {
            current: Some(Version::new(current).unwrap()),
            rollout: r.map(|r| CurrentRollout {
                id: r.id.to_string(),
                current_revision: 3,
                record_revision: 3,
                record: Ok(r),
            }),
            ..Snapshot::default()
        }
    }

    /// A rollout in each state, and a current rollout that cannot be read.
    struct Rollouts {
        r: RolloutRecord,
        id: RolloutId,
        other: RolloutId,
        paused: RolloutRecord,
        stuck: RolloutRecord,
        done: RolloutRecord,
        unusable: Snapshot,
    }

    /// A case of `step`: the fleet, the rollout followed, who holds the lock, now,
    /// and the step wanted.
    type StepCase<'a> = (Snapshot, Option<&'a RolloutId>, Who, u64, Step);

    const HOLDING: Who = Who {
        holding: true,
        may_take: false,
    };
    const FREE: Who = Who {
        holding: false,
        may_take: true,
    };

    impl Rollouts {
        fn new() -> Rollouts {
            let r = rec();
            Rollouts {
                id: r.id.clone(),
                other: RolloutId::new(2_000, &Version::new("v3").unwrap()),
                paused: r.pause("bob", None, Some(1_500), 1_100).unwrap(),
                stuck: r.stuck(BTreeMap::new(), "jioctl", 1_200).unwrap(),
                done: r.finish(BTreeMap::new(), "jioctl", 1_300).unwrap(),
                unusable: Snapshot {
                    rollout: Some(CurrentRollout {
                        id: "garbage".into(),
                        current_revision: 3,
                        record_revision: 0,
                        record: Err("key /rollouts/current: bad".into()),
                    }),
                    ..Snapshot::default()
                },
                r,
            }
        }

        /// No rollout, another one, an ended one, or one that cannot be read.
        fn none_to_drive(&self) -> Vec<StepCase<'_>> {
            let (r, id) = (&self.r, &self.id);
            vec![
                // A driver service with nothing to do; a follower whose rollout is gone.
                (snap(None, "v2"), None, HOLDING, 1_000, Step::Idle),
                (snap(None, "v2"), Some(id), HOLDING, 1_000, Step::Ended),
                (
                    snap(Some(r.clone()), "v2"),
                    Some(&self.other),
                    HOLDING,
                    1_000,
                    Step::Ended,
                ),
                (
                    snap(Some(self.done.clone()), "v2"),
                    None,
                    HOLDING,
                    1_400,
                    Step::Idle,
                ),
                (
                    self.unusable.clone(),
                    None,
                    HOLDING,
                    1_000,
                    Step::Unusable("key /rollouts/current: bad".into()),
                ),
                // A follower whose rollout id was overwritten with garbage (or an id
                // with no record) waits for the value to be fixed: nobody ended it.
                (
                    self.unusable.clone(),
                    Some(id),
                    HOLDING,
                    1_000,
                    Step::Unusable("key /rollouts/current: bad".into()),
                ),
            ]
        }

        /// A running rollout, by who holds the lock and where the version is.
        fn running(&self) -> Vec<StepCase<'_>> {
            let (r, id, paused) = (&self.r, &self.id, &self.paused);
            vec![
                (snap(Some(r.clone()), "v2"), Some(id), FREE, 1_000, Step::TakeLock),
                (
                    snap(Some(r.clone()), "v2"),
                    Some(id),
                    Who::default(),
                    1_000,
                    Step::Watch(r.clone()),
                ),
                (
                    snap(Some(paused.clone()), "v2"),
                    None,
                    Who::default(),
                    1_000,
                    Step::Paused(paused.clone()),
                ),
                (
                    snap(Some(r.clone()), "v2"),
                    None,
                    HOLDING,
                    1_000,
                    Step::Plan(r.clone()),
                ),
                (
                    snap(Some(r.clone()), "v9"),
                    None,
                    HOLDING,
                    1_000,
                    Step::VersionMoved(r.clone()),
                ),
            ]
        }

        /// A paused and a stuck rollout.
        fn paused_or_stuck(&self) -> Vec<StepCase<'_>> {
            let (paused, stuck) = (&self.paused, &self.stuck);
            vec![
                // A pause holds until its expiry, then the holder resumes it.
                (
                    snap(Some(paused.clone()), "v2"),
                    None,
                    HOLDING,
                    1_499,
                    Step::Paused(paused.clone()),
                ),
                (
                    snap(Some(paused.clone()), "v2"),
                    None,
                    HOLDING,
                    1_500,
                    Step::Expired(paused.clone()),
                ),
                // A stuck rollout: a follower stops; a driver service keeps driving it.
                (
                    snap(Some(stuck.clone()), "v2"),
                    Some(&self.id),
                    HOLDING,
                    1_000,
                    Step::Stuck(stuck.clone()),
                ),
                (
                    snap(Some(stuck.clone()), "v2"),
                    None,
                    HOLDING,
                    1_000,
                    Step::Plan(stuck.clone()),
                ),
            ]
        }
    }

    #[test]
    fn what_a_pass_does_before_planning() {
        let f = Rollouts::new();
        let cases = [f.none_to_drive(), f.running(), f.paused_or_stuck()].concat();
        for (i, (s, target, who, now, want)) in cases.into_iter().enumerate() {
            assert_eq!(step(&s, target, who, now), want, "case {i}");
        }
    }

    #[test]
    fn the_progress_deadline() {
        let r = rec(); // started at 1_000
        let limit = Duration::from_secs(600);
        let mut clock = ProgressClock::default();
        assert!(!clock.note(0, 1_100), "the first note is not progress");
        assert_eq!(deadline(&r, &clock, false, limit, 1_200), Deadline::Due(1_700));
        assert_eq!(deadline(&r, &clock, false, limit, 1_700), Deadline::Stuck);
        assert!(!clock.note(0, 1_650));
        assert!(clock.note(1, 1_690), "a host finished");
        assert_eq!(deadline(&r, &clock, true, limit, 1_700), Deadline::Due(2_290));
        let stuck = r.stuck(BTreeMap::new(), "jioctl", 1_700).unwrap();
        assert_eq!(deadline(&stuck, &clock, false, limit, 5_000), Deadline::None);
        assert_eq!(deadline(&stuck, &clock, true, limit, 5_000), Deadline::Unstuck);
        // A resume counts from the resume.
        let resumed = stuck.resume("bob", 4_000).unwrap();
        assert_eq!(
            deadline(&resumed, &clock, false, limit, 4_100),
            Deadline::Due(4_600)
        );
        let paused = r.pause("bob", None, None, 1_100).unwrap();
        assert_eq!(deadline(&paused, &clock, false, limit, 9_999), Deadline::None);
        // Times from the store never overflow the arithmetic.
        let mut late = r.clone();
        late.changes.push(jio_common::rollout::Change {
            state: "running".into(),
            by: "x".into(),
            at: u64::MAX,
            reason: None,
        });
        assert_eq!(
            deadline(&late, &clock, false, limit, 5_000),
            Deadline::Due(u64::MAX)
        );
    }

    #[test]
    fn what_a_pass_does_with_its_plan() {
        let host = |name: &str, state| HostStatus {
            host: HostName::new(name).unwrap(),
            role: jio_common::names::Role::new("compute").unwrap(),
            state,
            reason: None,
        };
        let disarmed = Snapshot {
            global: KeyState::Set(false),
            ..Snapshot::default()
        };
        let armed_snap = Snapshot::default();
        let admit = Plan {
            enable_hosts: vec![HostName::new("cp2").unwrap()],
            ..Plan::default()
        };
        let nothing = Plan::default();
        let stopped = Plan {
            stopped_on_failures: true,
            ..Plan::default()
        };
        let done = [host("cp1", HostState::Upgraded), host("cp2", HostState::Upgraded)];
        let moving = [host("cp1", HostState::Failed), host("cp2", HostState::Upgrading)];
        let settle = |disarm, end| After::Settle { disarm, end };
        assert_eq!(after_plan(&disarmed, &moving, &admit), After::Apply);
        assert_eq!(
            after_plan(&armed_snap, &moving, &nothing),
            settle(false, Settled::Waiting)
        );
        assert_eq!(
            after_plan(&armed_snap, &moving, &stopped),
            settle(true, Settled::Stopped)
        );
        assert_eq!(
            after_plan(&armed_snap, &done, &nothing),
            settle(true, Settled::Finished { failed: 0 })
        );
    }

    /// A driver: one pass, following, a service, following past its deadline.
    #[derive(Clone, Copy)]
    struct Drivers {
        once: DriverState,
        follow: DriverState,
        daemon: DriverState,
        late: DriverState,
    }

    /// A case of `next`: what was observed, the driver, and what it does next.
    type NextCase = (Observed, DriverState, Next);

    impl Drivers {
        fn new() -> Drivers {
            let once = DriverState::default();
            let follow = DriverState { follow: true, ..once };
            let daemon = DriverState {
                follow: true,
                daemon: true,
                ..once
            };
            let late = DriverState {
                deadline_passed: true,
                ..follow
            };
            Drivers {
                once,
                follow,
                daemon,
                late,
            }
        }

        /// After a pass.
        fn passes(self) -> Vec<NextCase> {
            let Drivers {
                once,
                follow,
                daemon,
                late,
            } = self;
            let moving = Observed::Pass(PassOutcome::Continue {
                waiting: Some("1 upgrading: cp1".into()),
            });
            let done = rec().finish(BTreeMap::new(), "jioctl", 2).unwrap();
            let held = Some(Box::new(done));
            vec![
                (moving.clone(), once, Next::End(Ending::Applied)),
                (moving.clone(), follow, Next::Wait),
                (moving.clone(), daemon, Next::Wait),
                (moving.clone(), late, Next::End(Ending::TimedOut(During::Waiting))),
                (Observed::Pass(PassOutcome::Replan), follow, Next::Reread),
                (Observed::Pass(PassOutcome::Again), once, Next::Pass),
                (
                    Observed::Pass(PassOutcome::Finished { failed: 0 }),
                    follow,
                    Next::End(Ending::Finished { failed: 0 }),
                ),
                // A driver service goes on to the next rollout.
                (
                    Observed::Pass(PassOutcome::Finished { failed: 0 }),
                    daemon,
                    Next::Wait,
                ),
                (Observed::Pass(PassOutcome::Idle), daemon, Next::Wait),
                (
                    Observed::Pass(PassOutcome::Ended(held.clone())),
                    follow,
                    Next::End(Ending::Ended(held)),
                ),
                (
                    Observed::Pass(PassOutcome::Stuck(BTreeMap::new())),
                    follow,
                    Next::End(Ending::Stuck(BTreeMap::new())),
                ),
                (Observed::Pass(PassOutcome::LockLost), follow, Next::Retake),
            ]
        }

        /// The lock, the rules and the store.
        fn around_passes(self) -> Vec<NextCase> {
            let Drivers {
                once, follow, daemon, ..
            } = self;
            let rules = RulesError(vec!["bad".into()]);
            let unreachable_for = |secs, d: DriverState| DriverState {
                unreachable_for: Some(Duration::from_secs(secs)),
                ..d
            };
            vec![
                (Observed::LeaseEnded, once, Next::Retake),
                (Observed::Retaken, follow, Next::Reread),
                (
                    Observed::LockHeld(Some(lock())),
                    follow,
                    Next::End(Ending::LockLost(Some(lock()))),
                ),
                (Observed::LockHeld(Some(lock())), daemon, Next::Reread),
                (
                    Observed::RulesInvalid(rules.clone()),
                    follow,
                    Next::End(Ending::InvalidRules(rules.clone())),
                ),
                (Observed::RulesInvalid(rules), daemon, Next::Wait),
                // The store: one pass gives up; following, patience; a service never gives up.
                (Observed::Unreachable, once, Next::GiveUp),
                (
                    Observed::Unreachable,
                    unreachable_for(10, follow),
                    Next::Pause(UNREACHABLE_PAUSE),
                ),
                (Observed::Unreachable, unreachable_for(301, follow), Next::GiveUp),
                (
                    Observed::Unreachable,
                    unreachable_for(9_999, daemon),
                    Next::Pause(UNREACHABLE_PAUSE),
                ),
            ]
        }
    }

    #[test]
    fn what_next() {
        let d = Drivers::new();
        let cases = [d.passes(), d.around_passes()].concat();
        for (observed, state, want) in cases {
            assert_eq!(next(&observed, &state), want, "{observed:?} {state:?}");
        }
    }

    #[test]
    fn endings_have_the_documented_codes() {
        let r = rec();
        let ended = |s: RolloutRecord| Ending::Ended(Some(Box::new(s)));
        let cases = [
            (Ending::Applied, 0, true),
            (Ending::Finished { failed: 0 }, 0, true),
            (Ending::Finished { failed: 1 }, 1, true),
            (Ending::Stopped { failures: vec![] }, 1, false),
            (ended(r.finish(BTreeMap::new(), "d", 2).unwrap()), 0, true),
            (
                ended(
                    r.finish(BTreeMap::from([("c".into(), "x".into())]), "d", 2)
                        .unwrap(),
                ),
                1,
                true,
            ),
            (ended(r.abort("bob", None, 2).unwrap()), 6, false),
            (ended(r.emergency_stop("bob", 2).unwrap()), 6, false),
            (Ending::Ended(None), 1, false),
            (Ending::Stuck(BTreeMap::new()), 7, false),
            (Ending::LockLost(None), 4, false),
            (Ending::TimedOut(During::Waiting), 5, false),
            (Ending::InvalidRules(RulesError(vec![])), 3, false),
        ];
        for (e, code, shows) in cases {
            assert_eq!((e.code(), e.shows_status()), (code, shows), "{e:?}");
        }
    }

    #[test]
    fn the_waiting_line_is_said_on_change_and_every_minute() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut w = Waiting::default();
        assert!(w.note("a".into(), at(0)), "the first line");
        assert!(!w.note("a".into(), at(10)), "unchanged, not due");
        assert_eq!(w.until_reminder(at(10)), Duration::from_secs(50));
        assert!(w.note("b".into(), at(20)), "changed");
        assert!(!w.note("b".into(), at(79)));
        assert!(w.note("b".into(), at(80)), "due a minute after it was said");
        assert_eq!(w.last.as_deref(), Some("b"));
    }
}
