//! The rollout driver's decisions, pure. Within a pass: from the snapshot to what
//! the pass does (halt, clear an old stop, start, plan), and from the plan to
//! whether it applies it or settles (disarm, finish, stop, wait). Between passes:
//! from what the last step observed (a pass's outcome, the lock, the store) and
//! the driver's state to what it does next (plan again, take the lock again,
//! pause, wait for a change, or end with which code). No I/O and no clock here:
//! the shell passes what time it is, as facts.

use std::time::Duration;

use tokio::time::Instant;

use jio_common::fleet::{HostState, HostStatus, LockRecord, Snapshot};
use jio_common::gate::KeyState;
use jio_common::keys::Step;
use jio_common::names::{HostName, Version};
use jio_common::rules::{Plan, RulesError};
use jio_common::store::Revision;

use crate::exit;

/// How long `--retry` keeps going while the store is unreachable.
pub const STORE_PATIENCE: Duration = Duration::from_secs(300);
/// Pause between passes while the store is unreachable.
pub const UNREACHABLE_PAUSE: Duration = Duration::from_secs(1);
/// While waiting, what blocks the rollout is said on every change and at least
/// this often.
pub const WAITING_REMINDER: Duration = Duration::from_secs(60);

/// What a pass does, from its snapshot, before planning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Before {
    /// An emergency stop newer than this run: it halts the run.
    Halted(LockRecord),
    /// An emergency stop from before this run was seen by the operator who started
    /// it: starting it is the decision to go on, so it is cleared (fenced).
    ClearHalt(LockRecord),
    /// The desired version is not this run's (first pass, or someone changed it):
    /// start the rollout in one transaction.
    Start,
    Plan,
}

/// Decides what a pass does before planning.
pub fn before_plan(snap: &Snapshot, started_at: Revision, version: &Version) -> Before {
    match &snap.halt {
        Some((by, rev)) if *rev > started_at => Before::Halted(by.clone()),
        Some((by, _)) => Before::ClearHalt(by.clone()),
        None if snap.current.as_ref() != Some(version) => Before::Start,
        None => Before::Plan,
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
    let moving = count(HostState::Pending)
        + count(HostState::Upgrading)
        + count(HostState::Lost)
        + count(HostState::Blocked);
    let end = if moving == 0 {
        Settled::Finished {
            failed: count(HostState::Failed),
        }
    } else if plan.stopped_on_failures {
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
    /// An emergency stop newer than this run.
    Halted(LockRecord),
    /// More failures than allowed (the enable keys were reset).
    Stopped { failures: Vec<(HostName, Step, String)> },
    /// Nothing pending or upgrading (the enable keys were reset).
    Finished { failed: usize },
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
    /// `--retry`: keep going until the rollout ends.
    pub retry: bool,
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
    /// One pass was applied (without `--retry`).
    Applied,
    /// Nothing pending or upgrading; `failed` hosts failed.
    Finished {
        failed: usize,
    },
    /// Stopped on failures.
    Stopped {
        failures: Vec<(HostName, Step, String)>,
    },
    /// Halted by an emergency stop.
    Halted(LockRecord),
    TimedOut(During),
    /// Lost the rollout lock to another driver.
    LockLost(Option<LockRecord>),
    InvalidRules(RulesError),
}

impl Ending {
    /// The documented exit code.
    pub fn code(&self) -> u8 {
        match self {
            Ending::Applied | Ending::Finished { failed: 0 } => exit::OK,
            Ending::Finished { .. } | Ending::Stopped { .. } => exit::FAILED,
            Ending::Halted(_) => exit::HALTED,
            Ending::TimedOut(_) => exit::TIMED_OUT,
            Ending::LockLost(_) => exit::LOCKED,
            Ending::InvalidRules(_) => exit::INVALID_RULES,
        }
    }

    /// Whether the final status is shown.
    pub fn shows_status(&self) -> bool {
        matches!(self, Ending::Applied | Ending::Finished { .. })
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
        Observed::LockHeld(by) => Next::End(Ending::LockLost(by.clone())),
        Observed::RulesInvalid(e) => Next::End(Ending::InvalidRules(e.clone())),
        Observed::Unreachable if !s.retry => Next::GiveUp,
        Observed::Unreachable if s.unreachable_for.is_some_and(|d| d > STORE_PATIENCE) => Next::GiveUp,
        Observed::Unreachable if s.deadline_passed => Next::End(Ending::TimedOut(During::Unreachable)),
        Observed::Unreachable => Next::Pause(UNREACHABLE_PAUSE),
        Observed::Pass(p) => match p {
            PassOutcome::Replan => Next::Reread,
            PassOutcome::Again => Next::Pass,
            PassOutcome::LockLost => Next::Retake,
            PassOutcome::Halted(by) => Next::End(Ending::Halted(by.clone())),
            PassOutcome::Stopped { failures } => Next::End(Ending::Stopped {
                failures: failures.clone(),
            }),
            PassOutcome::Finished { failed } => Next::End(Ending::Finished { failed: *failed }),
            PassOutcome::Continue { .. } if !s.retry => Next::End(Ending::Applied),
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

    fn by() -> LockRecord {
        LockRecord {
            holder: "bob".into(),
            host: "ops1".into(),
            pid: 7,
            since: 1,
        }
    }

    #[test]
    fn what_a_pass_does_before_planning() {
        let v2 = Version::new("v2").unwrap();
        let snap = |current: &str, halt: Option<Revision>| Snapshot {
            current: Some(Version::new(current).unwrap()),
            halt: halt.map(|rev| (by(), rev)),
            ..Snapshot::default()
        };
        let started_at = 10;
        let cases = [
            (snap("v2", Some(11)), Before::Halted(by())),
            // A stop newer than the run halts it even before the rollout started.
            (snap("v1", Some(11)), Before::Halted(by())),
            (snap("v2", Some(10)), Before::ClearHalt(by())),
            (snap("v1", None), Before::Start),
            (snap("v2", None), Before::Plan),
        ];
        for (s, want) in cases {
            assert_eq!(before_plan(&s, started_at, &v2), want, "{:?}", s.halt);
        }
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
        let armed_snap = Snapshot::default(); // no global key: hosts would start
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
        let one_failed = [host("cp1", HostState::Failed), host("cp2", HostState::Upgraded)];
        let moving = [host("cp1", HostState::Failed), host("cp2", HostState::Upgrading)];
        let settle = |disarm, end| After::Settle { disarm, end };
        let cases: Vec<(&Snapshot, &[HostStatus], &Plan, After)> = vec![
            (&disarmed, &moving, &admit, After::Apply),
            (&disarmed, &moving, &nothing, settle(false, Settled::Waiting)),
            (&armed_snap, &moving, &nothing, settle(false, Settled::Waiting)),
            (&armed_snap, &moving, &stopped, settle(true, Settled::Stopped)),
            (&disarmed, &moving, &stopped, settle(false, Settled::Stopped)),
            (
                &armed_snap,
                &done,
                &nothing,
                settle(true, Settled::Finished { failed: 0 }),
            ),
            (
                &disarmed,
                &one_failed,
                &stopped,
                settle(false, Settled::Finished { failed: 1 }),
            ),
        ];
        for (i, (snap, hosts, plan, want)) in cases.into_iter().enumerate() {
            assert_eq!(after_plan(snap, hosts, plan), want, "case {i}");
        }
    }

    #[test]
    fn what_next() {
        let once = DriverState::default();
        let retry = DriverState { retry: true, ..once };
        let late = DriverState {
            deadline_passed: true,
            ..retry
        };
        let cut_off = |secs| DriverState {
            unreachable_for: Some(Duration::from_secs(secs)),
            ..retry
        };
        let moving = Observed::Pass(PassOutcome::Continue {
            waiting: Some("1 upgrading: cp1".into()),
        });
        let failure = vec![(HostName::new("cp2").unwrap(), Step::Configured, String::new())];
        let rules = RulesError(vec!["bad".into()]);
        let cases: Vec<(Observed, DriverState, Next)> = vec![
            // One pass without --retry: applied, status shown, exit 0.
            (moving.clone(), once, Next::End(Ending::Applied)),
            (moving.clone(), retry, Next::Wait),
            (moving.clone(), late, Next::End(Ending::TimedOut(During::Waiting))),
            (Observed::Pass(PassOutcome::Replan), retry, Next::Reread),
            (Observed::Pass(PassOutcome::Again), once, Next::Pass),
            (
                Observed::Pass(PassOutcome::Finished { failed: 0 }),
                late,
                Next::End(Ending::Finished { failed: 0 }),
            ),
            (
                Observed::Pass(PassOutcome::Finished { failed: 2 }),
                retry,
                Next::End(Ending::Finished { failed: 2 }),
            ),
            (
                Observed::Pass(PassOutcome::Stopped {
                    failures: failure.clone(),
                }),
                retry,
                Next::End(Ending::Stopped { failures: failure }),
            ),
            // Safety: a halt ends the run, whatever the deadline.
            (
                Observed::Pass(PassOutcome::Halted(by())),
                late,
                Next::End(Ending::Halted(by())),
            ),
            // Lock loss: take it again before writing anything; held by another: stop.
            (Observed::Pass(PassOutcome::LockLost), retry, Next::Retake),
            (Observed::LeaseEnded, once, Next::Retake),
            (Observed::Retaken, retry, Next::Reread),
            (
                Observed::LockHeld(Some(by())),
                retry,
                Next::End(Ending::LockLost(Some(by()))),
            ),
            (
                Observed::RulesInvalid(rules.clone()),
                retry,
                Next::End(Ending::InvalidRules(rules)),
            ),
            // The store: without --retry an error; with it, patience, then the deadline.
            (Observed::Unreachable, once, Next::GiveUp),
            (Observed::Unreachable, cut_off(10), Next::Pause(UNREACHABLE_PAUSE)),
            (Observed::Unreachable, cut_off(301), Next::GiveUp),
            (
                Observed::Unreachable,
                DriverState {
                    deadline_passed: true,
                    ..cut_off(10)
                },
                Next::End(Ending::TimedOut(During::Unreachable)),
            ),
        ];
        for (observed, state, want) in cases {
            assert_eq!(next(&observed, &state), want, "{observed:?} {state:?}");
        }
    }

    #[test]
    fn endings_have_the_documented_codes() {
        let cases = [
            (Ending::Applied, 0, true),
            (Ending::Finished { failed: 0 }, 0, true),
            (Ending::Finished { failed: 1 }, 1, true),
            (Ending::Stopped { failures: vec![] }, 1, false),
            (Ending::LockLost(None), 4, false),
            (Ending::TimedOut(During::Waiting), 5, false),
            (Ending::Halted(by()), 6, false),
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
