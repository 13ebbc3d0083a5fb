//! The agent's decision: a pure function from what was observed to one action.
//!
//! No I/O and no clock here; the caller passes `now`. Everything the agent does in a
//! pass is chosen by `decide`, and the tables in the tests below are the spec.

use std::time::Duration;

use jio_common::gate::{Gate, Level};
use jio_common::names::Version;
use jio_common::store::Revision;
use serde::{Deserialize, Serialize};

/// The last failed upgrade, as the journal remembers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub version: Version,
    /// Unix time of the failure.
    pub at: u64,
    /// Consecutive failures at this version.
    pub attempts: u32,
    /// Mod revisions of the host, role and global enable keys when it failed; any
    /// write to one of them (even of the same value) counts as a new decision.
    pub gate_revisions: [Revision; 3],
}

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
}

/// The longest wait between retries, as a multiple of the retry interval.
const MAX_BACKOFF_FACTOR: u32 = 16;

/// How long to wait after `attempts` consecutive failures.
pub fn backoff(retry_interval: Duration, attempts: u32) -> Duration {
    let factor = 1u32 << attempts.saturating_sub(1).min(4);
    retry_interval * factor.min(MAX_BACKOFF_FACTOR)
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
        return Decision::UpToDate;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::new(s).unwrap()
    }
    const MIN: Duration = Duration::from_secs(60);

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
        assert_eq!(backoff(MIN, 0), MIN);
        assert_eq!(backoff(MIN, 1), MIN);
        assert_eq!(backoff(MIN, 2), 2 * MIN);
        assert_eq!(backoff(MIN, 3), 4 * MIN);
        assert_eq!(backoff(MIN, 5), 16 * MIN);
        assert_eq!(backoff(MIN, 50), 16 * MIN);
    }
}
