//! The agent's decision: a pure function from what was observed to one action.
//!
//! No I/O and no clock here; the caller passes `now`. Everything the agent does in a
//! pass is chosen by `decide`, and the tables in the tests below are the spec.

use std::time::Duration;

use jio_common::backoff::Backoff;
use jio_common::gate::{Gate, Level};
use jio_common::names::Version;
use jio_common::store::Revision;
use jio_common::values::AgentState;

use crate::runner::Outcome;
pub use crate::state::Failure;
use crate::state::RunResult;

/// Everything one decision needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    pub desired: Option<Version>,
    /// `/current_version` holds something that is not a version: why (naming the key).
    pub desired_invalid: Option<String>,
    /// Mod revision of `/current_version` as read (0: absent): a run starts only in a
    /// transaction that still finds it there.
    pub desired_revision: Revision,
    /// A `jioctl upgrade` driver holds the rollout lock (health repairs wait).
    pub rollout_lock: bool,
    pub local: Option<Version>,
    pub gate: Gate,
    pub gate_revisions: [Revision; 3],
    pub failure: Option<Failure>,
    /// Results that are in the journal but not yet in the store.
    pub unreported: bool,
    pub now: u64,
    pub retry_interval: Duration,
    /// The idle health check is due (the daemon's timer; never in `once`).
    pub health_due: bool,
    /// What the health checks found since the last upgrade.
    pub health: Health,
}

/// What the idle health checks found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Health {
    /// Nothing wrong was found (or nothing was checked yet).
    #[default]
    Good,
    /// The last check failed: Puppet runs once to repair.
    CheckFailed,
    /// The repair did not make the check pass (or could not start).
    RepairFailed,
}

impl Health {
    /// After a check with this outcome (`Interrupted` changes nothing).
    pub fn after_check(self, checked: &Outcome) -> Health {
        match checked {
            Outcome::Success { .. } => Health::Good,
            Outcome::Failure(_) => Health::CheckFailed,
            Outcome::Interrupted => self,
        }
    }

    /// After a repair: good only when Puppet and the check both passed.
    pub fn after_repair(self, repaired: &Outcome) -> Health {
        match repaired {
            Outcome::Success { .. } => Health::Good,
            Outcome::Failure(_) => Health::RepairFailed,
            Outcome::Interrupted => self,
        }
    }
}

/// Why an upgrade starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The gate allows it; `Level` says which key decided.
    Enabled(Level),
    /// The host has never converged: it converges whatever the gate says.
    FirstConverge,
}

/// The one action of a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Results of an earlier run must reach the store before anything else.
    Report,
    /// No `/current_version` is set.
    NoDesiredVersion,
    /// The local version is the desired one.
    UpToDate,
    /// A value this decision depends on is invalid (the reason names the key):
    /// nothing starts until it is fixed.
    Blocked {
        reason: String,
    },
    /// An upgrade is pending but the gate says no.
    Disabled {
        version: Version,
        level: Level,
    },
    /// The last attempt at this version failed; wait until `until` (Unix time) unless
    /// the desired version or the enable decision changes first.
    Backoff {
        version: Version,
        until: u64,
    },
    Upgrade {
        version: Version,
        why: Why,
    },
    /// Up to date and the health check is due: validate the local version.
    HealthCheck {
        version: Version,
    },
    /// The health check failed: run Puppet once to repair, then validate.
    Repair {
        version: Version,
    },
    /// A health check or repair would run, but a `jioctl upgrade` driver holds the
    /// rollout lock: it counts runs once they have started, so none starts behind
    /// its back.
    HealthHeld {
        version: Version,
    },
}

/// The longest wait between retries, as a multiple of the retry interval.
const MAX_BACKOFF_FACTOR: u32 = 16;

/// How long to wait after `attempts` consecutive failures.
pub fn backoff(retry_interval: Duration, attempts: u32) -> Duration {
    Backoff::new(retry_interval, retry_interval * MAX_BACKOFF_FACTOR).delay_after(attempts)
}

pub fn decide(o: &Observation) -> Decision {
    if o.unreported {
        return Decision::Report;
    }
    if let Some(reason) = &o.desired_invalid {
        return Decision::Blocked {
            reason: reason.clone(),
        };
    }
    let Some(desired) = o.desired.clone() else {
        return Decision::NoDesiredVersion;
    };
    if o.local.as_ref() == Some(&desired) {
        return health(o, desired);
    }
    // An unreadable enable key blocks even a first converge: it says something, and
    // nobody can tell what.
    if let Some(reason) = &o.gate.blocked {
        return Decision::Blocked {
            reason: reason.clone(),
        };
    }
    let why = if o.local.is_none() {
        Why::FirstConverge
    } else if o.gate.enabled {
        Why::Enabled(o.gate.level)
    } else {
        return Decision::Disabled {
            version: desired,
            level: o.gate.level,
        };
    };
    if let Some(f) = &o.failure
        && f.version == desired
        && f.gate_revisions == o.gate_revisions
    {
        let until = f.at + backoff(o.retry_interval, f.attempts).as_secs();
        if o.now < until {
            return Decision::Backoff {
                version: desired,
                until,
            };
        }
    }
    Decision::Upgrade {
        version: desired,
        why,
    }
}

/// Up to date: a repair when the last check failed, a check when one is due.
fn health(o: &Observation, version: Version) -> Decision {
    let repair = o.health == Health::CheckFailed;
    if !repair && !o.health_due {
        return Decision::UpToDate;
    }
    if o.rollout_lock {
        Decision::HealthHeld { version }
    } else if repair {
        Decision::Repair { version }
    } else {
        Decision::HealthCheck { version }
    }
}

/// The state the liveness record shows while nothing runs.
pub fn idle_state(d: &Decision, o: &Observation) -> AgentState {
    let failed_here = o
        .failure
        .as_ref()
        .is_some_and(|f| Some(&f.version) == o.desired.as_ref());
    let unhealthy = o.health != Health::Good && matches!(d, Decision::UpToDate | Decision::HealthHeld { .. });
    if failed_here || unhealthy {
        AgentState::Failed
    } else {
        AgentState::Idle
    }
}

/// The journal's failure after an upgrade to `version` ended with `result`: cleared
/// by a success, counted up by a failure (for the backoff), kept by an interruption.
pub fn failure_after(
    previous: Option<&Failure>,
    version: &Version,
    result: RunResult,
    now: u64,
    gate_revisions: [Revision; 3],
) -> Option<Failure> {
    match result {
        RunResult::Success => None,
        RunResult::Interrupted => previous.cloned(),
        RunResult::Failed => Some(Failure {
            version: version.clone(),
            at: now,
            attempts: match previous {
                Some(f) if &f.version == version => f.attempts + 1,
                _ => 1,
            },
            gate_revisions,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::new(s).unwrap()
    }
    const MIN: Duration = Duration::from_secs(60);

    fn failure(version: &str, at: u64, attempts: u32) -> Failure {
        Failure {
            version: v(version),
            at,
            attempts,
            gate_revisions: [0, 5, 0],
        }
    }

    fn obs(desired: Option<&str>, local: Option<&str>, enabled: bool, level: Level) -> Observation {
        Observation {
            desired: desired.map(v),
            desired_invalid: None,
            desired_revision: 3,
            rollout_lock: false,
            local: local.map(v),
            gate: Gate {
                enabled,
                level,
                blocked: None,
            },
            gate_revisions: [0, 5, 0],
            failure: None,
            unreported: false,
            now: 10_000,
            retry_interval: 10 * MIN,
            health_due: false,
            health: Health::Good,
        }
    }

    #[test]
    fn versions_and_gate() {
        use Decision::*;
        let table = [
            // desired, local, enabled, level => decision
            (None, None, true, Level::Default, NoDesiredVersion),
            (None, Some("v1"), false, Level::Global, NoDesiredVersion),
            (Some("v1"), Some("v1"), true, Level::Host, UpToDate),
            (Some("v1"), Some("v1"), false, Level::Global, UpToDate),
            (
                Some("v2"),
                Some("v1"),
                true,
                Level::Default,
                Upgrade {
                    version: v("v2"),
                    why: Why::Enabled(Level::Default),
                },
            ),
            (
                Some("v2"),
                Some("v1"),
                true,
                Level::Host,
                Upgrade {
                    version: v("v2"),
                    why: Why::Enabled(Level::Host),
                },
            ),
            (
                Some("v2"),
                Some("v1"),
                true,
                Level::Role,
                Upgrade {
                    version: v("v2"),
                    why: Why::Enabled(Level::Role),
                },
            ),
            (
                Some("v2"),
                Some("v1"),
                false,
                Level::Global,
                Disabled {
                    version: v("v2"),
                    level: Level::Global,
                },
            ),
            (
                Some("v2"),
                Some("v1"),
                false,
                Level::Role,
                Disabled {
                    version: v("v2"),
                    level: Level::Role,
                },
            ),
            (
                Some("v2"),
                Some("v1"),
                false,
                Level::Host,
                Disabled {
                    version: v("v2"),
                    level: Level::Host,
                },
            ),
            // A host that never converged goes whatever the gate says (bootstrap exception).
            (
                Some("v2"),
                None,
                false,
                Level::Global,
                Upgrade {
                    version: v("v2"),
                    why: Why::FirstConverge,
                },
            ),
            (
                Some("v2"),
                None,
                true,
                Level::Host,
                Upgrade {
                    version: v("v2"),
                    why: Why::FirstConverge,
                },
            ),
            // A downgrade is just another version.
            (
                Some("v1"),
                Some("v2"),
                true,
                Level::Global,
                Upgrade {
                    version: v("v1"),
                    why: Why::Enabled(Level::Global),
                },
            ),
        ];
        for (desired, local, enabled, level, want) in table {
            assert_eq!(
                decide(&obs(desired, local, enabled, level)),
                want,
                "{desired:?} {local:?} {enabled} {level:?}"
            );
        }
    }

    #[test]
    fn invalid_values_block_and_never_fail() {
        let blocked =
            |o: &Observation| matches!(decide(o), Decision::Blocked { reason } if reason.contains("/k"));
        // An invalid desired version: nothing to do until it is fixed.
        let mut o = obs(None, Some("v1"), true, Level::Default);
        o.desired_invalid = Some("value of key /k is invalid".into());
        assert!(blocked(&o));
        // An invalid deciding enable key: blocked, a first converge too.
        for local in [Some("v1"), None] {
            let mut o = obs(Some("v2"), local, false, Level::Global);
            o.gate.blocked = Some("value \"yes\" of key /k is invalid".into());
            assert!(blocked(&o), "{local:?}");
        }
        // Up to date stays up to date whatever the gate says.
        let mut o = obs(Some("v2"), Some("v2"), false, Level::Global);
        o.gate.blocked = Some("/k".into());
        assert_eq!(decide(&o), Decision::UpToDate);
        // Results waiting to be reported still come first.
        let mut o = obs(Some("v2"), Some("v1"), false, Level::Global);
        o.desired_invalid = Some("/k".into());
        o.unreported = true;
        assert_eq!(decide(&o), Decision::Report);
    }

    #[test]
    fn unreported_results_come_first() {
        let mut o = obs(Some("v2"), Some("v1"), true, Level::Host);
        o.unreported = true;
        assert_eq!(decide(&o), Decision::Report);
    }

    #[test]
    fn retry_rule() {
        let fail = |version: &str, at: u64, attempts: u32, revs: [Revision; 3]| Failure {
            version: v(version),
            at,
            attempts,
            gate_revisions: revs,
        };
        let base = obs(Some("v2"), Some("v1"), true, Level::Host);
        let cases = [
            // failure, now => upgrade?
            (fail("v2", 10_000, 1, [0, 5, 0]), 10_000, false), // just failed
            (fail("v2", 10_000, 1, [0, 5, 0]), 10_599, false), // inside 10 min
            (fail("v2", 10_000, 1, [0, 5, 0]), 10_600, true),  // interval passed
            (fail("v2", 10_000, 2, [0, 5, 0]), 10_600, false), // backs off: 20 min
            (fail("v2", 10_000, 2, [0, 5, 0]), 11_200, true),
            (fail("v2", 10_000, 3, [0, 5, 0]), 11_200, false), // 40 min
            (fail("v2", 10_000, 9, [0, 5, 0]), 10_000 + 16 * 600 - 1, false), // capped at 16x
            (fail("v2", 10_000, 9, [0, 5, 0]), 10_000 + 16 * 600, true),
            (fail("v1", 10_000, 1, [0, 5, 0]), 10_001, true), // desired version changed
            (fail("v2", 10_000, 1, [7, 5, 0]), 10_001, true), // host key rewritten since
            (fail("v2", 10_000, 1, [0, 6, 0]), 10_001, true), // role key rewritten since
        ];
        for (f, now, upgrade) in cases {
            let mut o = base.clone();
            o.failure = Some(f.clone());
            o.now = now;
            let d = decide(&o);
            assert_eq!(
                matches!(d, Decision::Upgrade { .. }),
                upgrade,
                "{f:?} now={now}: {d:?}"
            );
            if !upgrade {
                assert!(matches!(d, Decision::Backoff { .. }));
            }
        }
        // A failed first converge backs off too.
        let mut o = obs(Some("v2"), None, false, Level::Global);
        o.failure = Some(fail("v2", 10_000, 1, [0, 5, 0]));
        assert!(matches!(decide(&o), Decision::Backoff { until: 10_600, .. }));
    }

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(MIN, 0), Duration::ZERO);
        assert_eq!(backoff(MIN, 1), MIN);
        assert_eq!(backoff(MIN, 2), 2 * MIN);
        assert_eq!(backoff(MIN, 3), 4 * MIN);
        assert_eq!(backoff(MIN, 5), 16 * MIN);
        assert_eq!(backoff(MIN, 50), 16 * MIN);
    }

    #[test]
    fn health_checks_and_repairs() {
        use Decision::*;
        // health, due, lock => decision (the host is up to date at v1)
        let table = [
            (Health::Good, false, false, UpToDate),
            (Health::Good, true, false, HealthCheck { version: v("v1") }),
            (Health::Good, true, true, HealthHeld { version: v("v1") }),
            (Health::CheckFailed, false, false, Repair { version: v("v1") }),
            (Health::CheckFailed, false, true, HealthHeld { version: v("v1") }),
            (Health::RepairFailed, false, false, UpToDate),
            (
                Health::RepairFailed,
                true,
                false,
                HealthCheck { version: v("v1") },
            ),
        ];
        for (health, due, lock, want) in table {
            let mut o = obs(Some("v1"), Some("v1"), false, Level::Global);
            (o.health, o.health_due, o.rollout_lock) = (health, due, lock);
            assert_eq!(decide(&o), want, "{health:?} due={due} lock={lock}");
        }
        // A new desired version comes before any health check.
        let mut o = obs(Some("v2"), Some("v1"), true, Level::Host);
        (o.health, o.health_due) = (Health::CheckFailed, true);
        assert!(matches!(decide(&o), Upgrade { .. }));
    }

    #[test]
    fn health_transitions() {
        let fail = Outcome::Failure("x".into());
        let ok = Outcome::Success { changes: false };
        assert_eq!(Health::Good.after_check(&fail), Health::CheckFailed);
        assert_eq!(Health::RepairFailed.after_check(&ok), Health::Good);
        assert_eq!(
            Health::CheckFailed.after_check(&Outcome::Interrupted),
            Health::CheckFailed
        );
        assert_eq!(Health::CheckFailed.after_repair(&fail), Health::RepairFailed);
        assert_eq!(Health::CheckFailed.after_repair(&ok), Health::Good);
    }

    #[test]
    fn idle_states() {
        let mut o = obs(Some("v1"), Some("v1"), true, Level::Host);
        assert_eq!(idle_state(&Decision::UpToDate, &o), AgentState::Idle);
        o.health = Health::RepairFailed;
        assert_eq!(idle_state(&Decision::UpToDate, &o), AgentState::Failed);
        let held = Decision::HealthHeld { version: v("v1") };
        o.health = Health::CheckFailed;
        assert_eq!(idle_state(&held, &o), AgentState::Failed);
        let mut o = obs(Some("v2"), Some("v1"), true, Level::Host);
        o.failure = Some(failure("v2", 10_000, 1));
        let d = decide(&o);
        assert_eq!(idle_state(&d, &o), AgentState::Failed);
        o.failure = Some(failure("v1", 10_000, 1));
        assert_eq!(
            idle_state(
                &Decision::Disabled {
                    version: v("v2"),
                    level: Level::Host
                },
                &o
            ),
            AgentState::Idle
        );
    }

    #[test]
    fn recording_an_outcome() {
        let revs = [1, 2, 3];
        let first = failure_after(None, &v("v2"), RunResult::Failed, 100, revs).unwrap();
        assert_eq!((first.attempts, first.at), (1, 100));
        let second = failure_after(Some(&first), &v("v2"), RunResult::Failed, 200, revs).unwrap();
        assert_eq!((second.attempts, second.at), (2, 200));
        let other = failure_after(Some(&second), &v("v3"), RunResult::Failed, 300, revs).unwrap();
        assert_eq!(other.attempts, 1);
        assert_eq!(
            failure_after(Some(&second), &v("v2"), RunResult::Interrupted, 300, revs),
            Some(second.clone())
        );
        assert_eq!(
            failure_after(Some(&second), &v("v2"), RunResult::Success, 300, revs),
            None
        );
    }
}
