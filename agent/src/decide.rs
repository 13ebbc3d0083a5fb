//! The agent's decision: a pure function from what was observed to one action.
//!
//! No I/O and no clock here; the caller passes `now`. Everything the agent does in a
//! pass is chosen by `decide`, and the tables in the tests below are the spec.
//!
//! Admission: an upgrade the gate allows still waits while a hold names the host or
//! its role (whatever the hold's value), and while the active rollout's record cannot
//! be used. A first converge ignores the rollout, as it ignores the gate (the host
//! serves nothing yet), but not a hold. A run already going always finishes: these
//! rules only gate starts. Maintenance windows are not decided here: the agent's
//! clock may be wrong, so the driver decides them by its own clock, admits a host
//! only inside its window and disarms, fenced, every admitted host that has not
//! started when the window closes (an agent starts only in a transaction fenced on
//! the enable keys it read).
//!
//! The soak: after a successful upgrade under a rollout with `min_healthy_time` M,
//! the host holds its slot until a health check passes after the run, so one runs
//! at M/2 after the run ended, even while a driver holds the rollout lock.

use std::time::Duration;

use jio_common::backoff::Backoff;
use jio_common::gate::{Gate, Level};
use jio_common::names::Version;
use jio_common::store::Revision;
use jio_common::values::{AgentState, HoldRecord, HostResult};

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
    /// The hold that keeps this host out (its own before its role's), if any.
    pub hold: Option<Hold>,
    /// Mod revisions of the host's and the role's hold keys (0: absent): a run starts
    /// only in a transaction that still finds them so.
    pub hold_revisions: [Revision; 2],
    /// What the active rollout's rules say for this host.
    pub rollout: RolloutFacts,
    /// Mod revision of `/rollouts/current` (0: no active rollout), fenced on too.
    pub rollout_revision: Revision,
    /// The host's last run result (`/results/<host>`), when there is a readable one.
    pub result: Option<HostResult>,
    /// What a composable rollout asks of this host.
    pub compose: ComposeFacts,
    /// The fleet commands this host is admitted to.
    pub commands: CommandFacts,
    /// The site's package snapshot template as read (`/config_state/package_source`,
    /// its text), and its mod revision (0: absent): a run starts only while it is so.
    pub package_source: Option<String>,
    pub package_source_revision: Revision,
}

/// The host's inbox of fleet commands (`/config_state/commands/<host>`), as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandFacts {
    /// The ids it is admitted to, oldest first.
    pub inbox: Vec<jio_common::names::CommandId>,
    /// The inbox's mod revision (0: absent): a command starts only while it is so.
    pub revision: Revision,
    /// The inbox (or some of it) cannot be read: why, naming the key.
    pub problem: Option<String>,
    /// A command's run is in the journal from before this pass (the agent stopped
    /// while it ran, or before its start was confirmed).
    pub in_progress: bool,
    /// The inbox's commands this agent has not finished, oldest first, as read
    /// (not read while a run is in the journal).
    pub candidates: Vec<crate::command_step::Candidate>,
}

/// What the active composable rollout asks of this host (`active` false: the
/// active rollout, if any, is not composable).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ComposeFacts {
    pub active: bool,
    /// The phase granted to the host's role, for the active rollout.
    pub grant: Option<jio_common::phase::Grant>,
    /// The host's services with tasks left in the granted phase.
    pub left: Vec<jio_common::names::Service>,
    /// The finalize step is granted to this host, for the active rollout.
    pub finalize: bool,
    /// The services with finalize tasks left on this host.
    pub finalize_left: Vec<jio_common::names::Service>,
    /// Mod revisions of the role's grant and the finalize grant (0: absent).
    pub grant_revisions: [Revision; 2],
    /// The first of this host's own steps (`pre-1 of nova`) that sorts before the
    /// granted phase and did not finish in this rollout: it missed it (a task
    /// failed, or it was held or left behind while the phase went on).
    pub unfinished: Option<String>,
    /// The first of its steps that did not finish, whatever is granted (the
    /// finalize step needs them all).
    pub unfinished_any: Option<String>,
    /// A grant key holds something no driver writes: why, naming the key (it
    /// grants nothing).
    pub problem: Option<String>,
    /// This host ran a step of the active rollout already (its journal says so).
    pub touched: bool,
}

/// A hold on the host or its role, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The hold's key.
    pub key: String,
    /// The record, or why it cannot be read (it holds all the same).
    pub record: Result<HoldRecord, String>,
}

/// The facts of the active rollout's rules this host needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RolloutFacts {
    /// `min_healthy_time`: how long an upgraded host soaks.
    pub min_healthy_time: Option<Duration>,
    /// The active rollout's id: a result whose `rollout` is another id is not its
    /// run (no clock of another machine is compared).
    pub id: Option<String>,
    /// `/rollouts/current` names a record that is missing or cannot be read: why,
    /// naming the key. No upgrade starts meanwhile.
    pub unusable: Option<String>,
    /// The rollout's `reboot` rule for this host (none: the agent's setting).
    pub reboot: Option<jio_common::rules::RebootPolicy>,
    /// The rollout has maintenance windows for this host's role: a reboot that
    /// ends its run waits for the driver's permit.
    pub windowed: bool,
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
    /// The health check of the `min_healthy_time` soak failed: reported as the
    /// version's validation failure, and never repaired (the rollout must see it).
    SoakFailed,
}

impl Health {
    /// After a check with this outcome (`Interrupted` changes nothing). A failed
    /// soak stays failed until a check passes: it is never repaired.
    pub fn after_check(self, checked: &Outcome) -> Health {
        match checked {
            Outcome::Success { .. } => Health::Good,
            Outcome::Failure(_) if self == Health::SoakFailed => Health::SoakFailed,
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

/// For logs: `enabled by the role key`, `first converge`.
impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Why::Enabled(jio_common::gate::Level::Default) => f.write_str("enabled by default (no key set)"),
            Why::Enabled(l) => write!(f, "enabled by the {} key", l.as_str()),
            Why::FirstConverge => f.write_str("first converge (whatever the enable keys say)"),
        }
    }
}

/// The one action of a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// A fleet command's run is in the journal from before this pass: report it
    /// interrupted, run it again, or take its start back (`agent/commands`).
    RecoverCommand,
    /// A fleet command of the inbox: run it, refuse it, or report it interrupted.
    Command {
        id: jio_common::names::CommandId,
        step: crate::command_step::CommandStep,
    },
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
    /// An upgrade would start, but a hold keeps the host (or its role) out.
    Held {
        version: Version,
        hold: Hold,
    },
    /// An upgrade would start, but the active rollout's record cannot be used (the
    /// reason names the key): its windows are unknown, so nothing starts.
    RolloutUnusable {
        version: Version,
        reason: String,
    },
    /// Upgraded and soaking: the soak's health check runs at `check_at` (Unix time).
    Soaking {
        version: Version,
        check_at: u64,
    },
    /// The soak's health check is due: validate the local version, even while a
    /// driver holds the rollout lock (the host holds its own slot meanwhile).
    SoakCheck {
        version: Version,
    },
    /// A composable rollout's phase is granted and enabled: run the tasks left of
    /// `services` in it (`phase` `finalize`: the finalize tasks).
    Tasks {
        version: Version,
        phase: String,
        services: Vec<jio_common::names::Service>,
    },
    /// A composable rollout is active and no phase with work for this host is
    /// granted to it: it waits for the driver.
    AwaitingPhase {
        version: Version,
        /// What is granted (its phase), if anything.
        granted: Option<String>,
        /// A grant that cannot be read, naming its key.
        problem: Option<String>,
    },
    /// A step of this host failed at this version and no enable key was written
    /// since its failure was reported: in a composable rollout it is not retried on
    /// a timer (its stage may have moved on without it), only when an operator
    /// enables it again (or by a new rollout).
    FailedHere {
        version: Version,
        phase: String,
    },
    /// A phase is granted, but this host did not finish an earlier one (`missed`:
    /// one of its steps, or `puppet`): it stays behind in this rollout.
    LeftBehind {
        version: Version,
        missed: String,
        granted: String,
    },
}

impl Decision {
    /// A short name for metrics and JSON (`up_to_date`, `upgrade`, `disabled`...).
    pub fn kind(&self) -> &'static str {
        match self {
            Decision::RecoverCommand => "recover_command",
            Decision::Command { .. } => "command",
            Decision::Report => "report",
            Decision::NoDesiredVersion => "no_desired_version",
            Decision::UpToDate => "up_to_date",
            Decision::Blocked { .. } => "blocked",
            Decision::Disabled { .. } => "disabled",
            Decision::Backoff { .. } => "backoff",
            Decision::Upgrade { .. } => "upgrade",
            Decision::HealthCheck { .. } => "health_check",
            Decision::Repair { .. } => "repair",
            Decision::HealthHeld { .. } => "health_held",
            Decision::Held { .. } => "held",
            Decision::RolloutUnusable { .. } => "rollout_unusable",
            Decision::Soaking { .. } => "soaking",
            Decision::SoakCheck { .. } => "soak_check",
            Decision::Tasks { .. } => "tasks",
            Decision::AwaitingPhase { .. } => "awaiting_phase",
            Decision::FailedHere { .. } => "failed_here",
            Decision::LeftBehind { .. } => "left_behind",
        }
    }
}

/// What the inbox's commands come to (nothing while a run is in the journal: it
/// is recovered first).
pub fn commands(o: &Observation) -> crate::command_step::Scan {
    if o.commands.in_progress {
        return crate::command_step::Scan::default();
    }
    let hold = o.hold.as_ref().map(|h| h.key.as_str());
    crate::command_step::scan(&o.commands.candidates, hold)
}

/// The longest wait between retries, as a multiple of the retry interval.
const MAX_BACKOFF_FACTOR: u32 = 16;

/// How long to wait after `attempts` consecutive failures.
pub fn backoff(retry_interval: Duration, attempts: u32) -> Duration {
    Backoff::new(retry_interval, retry_interval * MAX_BACKOFF_FACTOR).delay_after(attempts)
}

pub fn decide(o: &Observation) -> Decision {
    // Fleet commands first: a command this host was admitted to runs before an
    // upgrade starts (never during one: the agent runs one thing at a time).
    if o.commands.in_progress {
        return Decision::RecoverCommand;
    }
    if let Some((id, step)) = commands(o).act {
        return Decision::Command { id, step };
    }
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
    if o.compose.active && o.local.is_some() {
        return composable(o, desired);
    }
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
    if let Some(hold) = &o.hold {
        return Decision::Held {
            version: desired,
            hold: hold.clone(),
        };
    }
    if why != Why::FirstConverge
        && let Some(reason) = &o.rollout.unusable
    {
        return Decision::RolloutUnusable {
            version: desired,
            reason: reason.clone(),
        };
    }
    if let Some(f) = &o.failure
        && f.version == desired
        && !retry_now(f, o.gate_revisions)
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

/// The decision under a composable rollout (the host converged once before): a
/// granted phase with tasks left runs them, the `puppet` phase upgrades as usual,
/// and nothing else starts. Whatever the enable keys say, a host never runs a phase
/// before it finished its own earlier steps, nor a step after Puppet (`post`,
/// `finalize`) before it is at the version: a host left behind stays behind.
fn composable(o: &Observation, desired: Version) -> Decision {
    let c = &o.compose;
    let at_version = o.local.as_ref() == Some(&desired);
    let left_behind = |missed: &str, granted: &str| Decision::LeftBehind {
        version: desired.clone(),
        missed: missed.to_string(),
        granted: granted.to_string(),
    };
    let (phase, services, unfinished) = if c.finalize && !c.finalize_left.is_empty() {
        ("finalize".to_string(), c.finalize_left.clone(), &c.unfinished_any)
    } else {
        match &c.grant {
            Some(g) if g.phase == "puppet" => {
                if at_version {
                    return health(o, desired);
                }
                if let Some(missed) = &c.unfinished {
                    return left_behind(missed, "puppet");
                }
                if let Some(d) = failed_here(o, &desired, "puppet") {
                    return d;
                }
                return upgrade(o, desired, Why::Enabled(o.gate.level));
            }
            Some(g) if !c.left.is_empty() => (g.phase.clone(), c.left.clone(), &c.unfinished),
            other => {
                if at_version {
                    return health(o, desired);
                }
                // Nothing of this rollout ran here yet (its stage is not started, or
                // not yet at it): the host stays at its version, and healthy: its
                // health checks of that version go on (held while a driver holds
                // the rollout lock, as always).
                let failed_here = o.failure.as_ref().is_some_and(|f| f.version == desired);
                if !c.touched
                    && !failed_here
                    && let Some(local) = o.local.clone()
                    && let d @ (Decision::HealthCheck { .. } | Decision::Repair { .. }) = health(o, local)
                {
                    return d;
                }
                return Decision::AwaitingPhase {
                    version: desired,
                    granted: other.as_ref().map(|g| g.phase.clone()),
                    problem: c.problem.clone(),
                };
            }
        }
    };
    if !at_version && (phase == "finalize" || phase.starts_with("post-")) {
        return left_behind("puppet", &phase);
    }
    if let Some(missed) = unfinished {
        return left_behind(missed, &phase);
    }
    if let Some(d) = failed_here(o, &desired, &phase) {
        return d;
    }
    match upgrade(o, desired.clone(), Why::Enabled(o.gate.level)) {
        Decision::Upgrade { version, .. } => Decision::Tasks {
            version,
            phase,
            services,
        },
        other => other,
    }
}

/// A failed step at `desired` that nobody re-enabled since: no retry (see
/// `Decision::FailedHere`). An enabled host only; the gate decides otherwise.
fn failed_here(o: &Observation, desired: &Version, phase: &str) -> Option<Decision> {
    let f = o.failure.as_ref().filter(|f| &f.version == desired)?;
    (o.gate.enabled && o.gate.blocked.is_none() && !retry_now(f, o.gate_revisions)).then(|| {
        Decision::FailedHere {
            version: desired.clone(),
            phase: phase.to_string(),
        }
    })
}

/// An upgrade (or a step) that would start: the gate, a hold, the rollout's
/// record and a failure's backoff may still keep it.
fn upgrade(o: &Observation, desired: Version, why: Why) -> Decision {
    if let Some(reason) = &o.gate.blocked {
        return Decision::Blocked {
            reason: reason.clone(),
        };
    }
    if !o.gate.enabled {
        return Decision::Disabled {
            version: desired,
            level: o.gate.level,
        };
    }
    if let Some(hold) = &o.hold {
        return Decision::Held {
            version: desired,
            hold: hold.clone(),
        };
    }
    if let Some(reason) = &o.rollout.unusable {
        return Decision::RolloutUnusable {
            version: desired,
            reason: reason.clone(),
        };
    }
    if let Some(f) = &o.failure
        && f.version == desired
        && !retry_now(f, o.gate_revisions)
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

/// Whether the enable keys (their mod revisions `gate`) say "retry now" to the
/// failure `f`: one written after its report landed, or, before it is known to have
/// landed, any write since the run was decided.
fn retry_now(f: &Failure, gate: [Revision; 3]) -> bool {
    match f.reported {
        Some(reported) => gate.iter().any(|rev| *rev > reported),
        None => f.gate_revisions != gate,
    }
}

/// Up to date: a repair when the last check failed, the soak's check when it is
/// pending, a check when one is due.
fn health(o: &Observation, version: Version) -> Decision {
    let repair = o.health == Health::CheckFailed;
    if !repair && let Some(check_at) = soak_check_at(o) {
        // Any check while the soak is pending is the soak's check.
        return if o.now >= check_at || o.health_due {
            Decision::SoakCheck { version }
        } else {
            Decision::Soaking { version, check_at }
        };
    }
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

/// When the soak's health check is due (Unix time), while one is pending: the last
/// result is this rollout's successful run to the local version, the rules set
/// `min_healthy_time` M, and no check has passed M or more after the run ended. It
/// comes M after the run ended (at least a second): the host has stayed healthy that
/// long by this agent's own clock, and `checked_at` at or past `at + M` is what
/// releases its slot (the planner compares only these two times, both this clock's).
pub fn soak_check_at(o: &Observation) -> Option<u64> {
    let m = o.rollout.min_healthy_time?;
    let r = o.result.as_ref()?;
    let due = r.at.saturating_add(m.as_secs().max(1));
    let pending = r.ok
        && Some(&r.version) == o.local.as_ref()
        && o.rollout.id.is_some()
        && r.rollout == o.rollout.id
        && r.checked_at.is_none_or(|c| c < due);
    pending.then_some(due)
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
            reported: None,
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
            reported: None,
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
            hold: None,
            hold_revisions: [0, 0],
            rollout: RolloutFacts::default(),
            rollout_revision: 0,
            result: None,
            compose: ComposeFacts::default(),
            commands: CommandFacts::default(),
            package_source: None,
            package_source_revision: 0,
        }
    }

    /// A composable rollout is active; `grant` is the phase granted to the role.
    fn composable(grant: Option<&str>, left: &[&str], enabled: bool, local: &str) -> Observation {
        let mut o = obs(Some("v2"), Some(local), enabled, Level::Host);
        o.compose = ComposeFacts {
            active: true,
            grant: grant.map(|p| jio_common::phase::Grant {
                rollout: "r".into(),
                stage: "all".into(),
                phase: p.into(),
                services: vec![],
                level: 0,
                left_behind: Default::default(),
            }),
            left: left
                .iter()
                .map(|s| jio_common::names::Service::new(*s).unwrap())
                .collect(),
            ..ComposeFacts::default()
        };
        o
    }

    /// One service, by name.
    fn svc(n: &str) -> Vec<jio_common::names::Service> {
        vec![jio_common::names::Service::new(n).unwrap()]
    }

    /// Running the tasks of `phase` for the service `s`, at v2.
    fn tasks(phase: &str, s: &str) -> Decision {
        Decision::Tasks {
            version: v("v2"),
            phase: phase.into(),
            services: svc(s),
        }
    }

    #[test]
    fn a_composable_rollout_runs_only_the_granted_phase() {
        granted_phases_run_when_enabled();
        a_host_that_missed_a_step_is_left_behind();
        failures_holds_and_health_checks_in_a_composable_rollout();
    }

    /// Only a granted step phase with work left runs, when enabled; the puppet
    /// phase is the usual upgrade.
    fn granted_phases_run_when_enabled() {
        // A step phase with work left, enabled: its tasks run.
        assert_eq!(
            decide(&composable(Some("pre-1"), &["nova"], true, "v1")),
            tasks("pre-1", "nova")
        );
        // Not enabled: nothing runs.
        assert!(matches!(
            decide(&composable(Some("pre-1"), &["nova"], false, "v1")),
            Decision::Disabled { .. }
        ));
        // Nothing left for this host in the phase, or no phase granted: it waits,
        // even enabled (no Puppet run outside the puppet phase).
        for o in [
            composable(Some("pre-1"), &[], true, "v1"),
            composable(None, &[], true, "v1"),
            composable(Some("post-3"), &[], true, "v1"),
        ] {
            assert!(
                matches!(decide(&o), Decision::AwaitingPhase { .. }),
                "{:?}",
                decide(&o)
            );
        }
        // The puppet phase is the usual upgrade.
        assert!(matches!(
            decide(&composable(Some("puppet"), &[], true, "v1")),
            Decision::Upgrade { .. }
        ));
        // Post steps run at the new version; without one, an up-to-date host idles.
        assert_eq!(
            decide(&composable(Some("post-3"), &["nova"], true, "v2")),
            tasks("post-3", "nova")
        );
        assert_eq!(decide(&composable(None, &[], true, "v2")), Decision::UpToDate);
    }

    /// A host that did not finish an earlier step (or Puppet) is left behind; the
    /// finalize step granted to it runs.
    fn a_host_that_missed_a_step_is_left_behind() {
        // A host that did not finish an earlier step is left behind.
        let mut o = composable(Some("pre-2"), &["nova"], true, "v1");
        o.compose.unfinished = Some("pre-1 of nova".into());
        assert!(matches!(decide(&o), Decision::LeftBehind { .. }));
        o.compose.grant = Some(jio_common::phase::Grant {
            rollout: "r".into(),
            stage: "all".into(),
            phase: "puppet".into(),
            services: vec![],
            level: 0,
            left_behind: Default::default(),
        });
        assert!(matches!(decide(&o), Decision::LeftBehind { .. }));
        // A step after Puppet needs the host at the version (its Puppet run failed,
        // or it was held while the puppet phase went on).
        let o = composable(Some("post-3"), &["nova"], true, "v1");
        assert!(
            matches!(decide(&o), Decision::LeftBehind { ref missed, .. } if missed == "puppet"),
            "{:?}",
            decide(&o)
        );
        // The finalize step granted to this host, with work left.
        let mut o = composable(Some("post-3"), &[], true, "v2");
        o.compose.finalize = true;
        o.compose.finalize_left = svc("nova");
        assert_eq!(decide(&o), tasks("finalize", "nova"));
        o.compose.unfinished_any = Some("post-4 of nova".into());
        assert!(matches!(decide(&o), Decision::LeftBehind { .. }));
    }

    /// A failed step waits for its enable key, a hold keeps a step from starting,
    /// and health checks go on only where the stage did not reach.
    fn failures_holds_and_health_checks_in_a_composable_rollout() {
        // A failed step is not retried on a timer in a composable rollout; a
        // write of its enable key after the failure was reported retries it.
        let mut o = composable(Some("pre-1"), &["nova"], true, "v1");
        o.failure = Some(Failure {
            version: v("v2"),
            at: 0,
            attempts: 1,
            gate_revisions: [0, 5, 0],
            reported: Some(9),
        });
        o.now = 1_000_000;
        assert!(
            matches!(decide(&o), Decision::FailedHere { .. }),
            "{:?}",
            decide(&o)
        );
        o.gate_revisions = [10, 5, 0];
        assert_eq!(decide(&o), tasks("pre-1", "nova"));
        // A hold keeps a step from starting, as it keeps an upgrade.
        let mut o = composable(Some("pre-1"), &["nova"], true, "v1");
        o.hold = Some(Hold {
            key: "/holds/host/compute1".into(),
            record: Err("x".into()),
        });
        assert!(matches!(decide(&o), Decision::Held { .. }));
        // A host its stage has not reached keeps its health checks of its version
        // (when no driver holds the lock); one that ran a step of it does not.
        let mut o = composable(None, &[], false, "v1");
        o.health_due = true;
        assert_eq!(decide(&o), Decision::HealthCheck { version: v("v1") });
        o.rollout_lock = true;
        assert!(matches!(decide(&o), Decision::AwaitingPhase { .. }));
        o.rollout_lock = false;
        o.compose.touched = true;
        assert!(matches!(decide(&o), Decision::AwaitingPhase { .. }));
        // A first converge still converges (the host serves nothing yet).
        let mut o = composable(None, &[], false, "v1");
        o.local = None;
        assert!(matches!(
            decide(&o),
            Decision::Upgrade {
                why: Why::FirstConverge,
                ..
            }
        ));
    }

    /// A case of `versions_and_gate`: desired, local, enabled, level => decision.
    type GateCase = (Option<&'static str>, Option<&'static str>, bool, Level, Decision);

    /// The upgrade to `version`, and why.
    fn upgrade(version: &str, why: Why) -> Decision {
        Decision::Upgrade {
            version: v(version),
            why,
        }
    }

    /// The update to `version` pending, not enabled at `level`.
    fn disabled(version: &str, level: Level) -> Decision {
        Decision::Disabled {
            version: v(version),
            level,
        }
    }

    /// The cases of `versions_and_gate`.
    fn versions_and_gate_cases() -> [GateCase; 13] {
        use Decision::*;
        use Level::*;
        let (v1, v2) = (Some("v1"), Some("v2"));
        [
            // desired, local, enabled, level => decision
            (None, None, true, Default, NoDesiredVersion),
            (None, v1, false, Global, NoDesiredVersion),
            (v1, v1, true, Host, UpToDate),
            (v1, v1, false, Global, UpToDate),
            (v2, v1, true, Default, upgrade("v2", Why::Enabled(Default))),
            (v2, v1, true, Host, upgrade("v2", Why::Enabled(Host))),
            (v2, v1, true, Role, upgrade("v2", Why::Enabled(Role))),
            (v2, v1, false, Global, disabled("v2", Global)),
            (v2, v1, false, Role, disabled("v2", Role)),
            (v2, v1, false, Host, disabled("v2", Host)),
            // A host that never converged goes whatever the gate says (bootstrap exception).
            (v2, None, false, Global, upgrade("v2", Why::FirstConverge)),
            (v2, None, true, Host, upgrade("v2", Why::FirstConverge)),
            // A downgrade is just another version.
            (v1, v2, true, Global, upgrade("v1", Why::Enabled(Global))),
        ]
    }

    #[test]
    fn versions_and_gate() {
        let table = versions_and_gate_cases();
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
            reported: None,
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
        // Once the failure's report landed (at revision 20), only a key written
        // after it retries at once: one written during the run (revision 6, after
        // the decision read 5) does not.
        let reported = |revs| Failure {
            reported: Some(20),
            ..fail("v2", 10_000, 1, revs)
        };
        for (f, gate, upgrade) in [
            (reported([0, 5, 0]), [0, 5, 0], false),
            (reported([0, 5, 0]), [0, 6, 0], false), // written during the run
            (reported([0, 5, 0]), [21, 5, 0], true), // the host key, after the report
            (reported([0, 5, 0]), [0, 5, 22], true), // the global key, after it
            (reported([0, 5, 0]), [0, 0, 0], false), // the role key deleted
        ] {
            let mut o = base.clone();
            o.failure = Some(f.clone());
            o.gate_revisions = gate;
            o.now = 10_001;
            let d = decide(&o);
            assert_eq!(
                matches!(d, Decision::Upgrade { .. }),
                upgrade,
                "{f:?} {gate:?}: {d:?}"
            );
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

    fn hold(key: &str, by: &str) -> Hold {
        Hold {
            key: key.into(),
            record: Ok(HoldRecord {
                by: by.into(),
                reason: Some("disk".into()),
                at: 1,
                created_keys: Vec::new(),
            }),
        }
    }

    #[test]
    fn admission_holds_and_the_rollout() {
        use Decision::*;
        let host_hold = hold("/holds/host/compute1", "sre");
        let unreadable = Hold {
            key: "/holds/role/compute".into(),
            record: Err("value \"x\" of key /holds/role/compute is invalid".into()),
        };
        let bad = Some("key /rollouts/r: missing (named by /rollouts/current)".to_string());
        let up = |why| Upgrade {
            version: v("v2"),
            why,
        };
        let enabled = Why::Enabled(Level::Host);
        let held = |h: &Hold| Held {
            version: v("v2"),
            hold: h.clone(),
        };
        // local, enabled, hold, rollout unusable => decision. No window: the agent's
        // clock decides none (the driver disarms a host when its window closes).
        let table = [
            (Some("v1"), true, None, None, up(enabled)),
            (Some("v1"), true, Some(host_hold.clone()), None, held(&host_hold)),
            // An unreadable hold holds all the same.
            (
                Some("v1"),
                true,
                Some(unreadable.clone()),
                None,
                held(&unreadable),
            ),
            // A hold comes before the rollout.
            (
                Some("v1"),
                true,
                Some(host_hold.clone()),
                bad.clone(),
                held(&host_hold),
            ),
            (
                Some("v1"),
                true,
                None,
                bad.clone(),
                RolloutUnusable {
                    version: v("v2"),
                    reason: bad.clone().unwrap(),
                },
            ),
            // The gate decides first: a disabled host is just disabled.
            (
                Some("v1"),
                false,
                Some(host_hold.clone()),
                None,
                Disabled {
                    version: v("v2"),
                    level: Level::Host,
                },
            ),
            // A first converge ignores the rollout, not a hold.
            (None, false, None, bad.clone(), up(Why::FirstConverge)),
            (None, false, Some(host_hold.clone()), None, held(&host_hold)),
            // Up to date: nothing to admit, whatever holds.
            (Some("v2"), true, Some(host_hold.clone()), bad.clone(), UpToDate),
        ];
        for (local, enabled, h, unusable, want) in table {
            let mut o = obs(Some("v2"), local, enabled, Level::Host);
            o.hold = h.clone();
            o.rollout.unusable = unusable.clone();
            assert_eq!(decide(&o), want, "{local:?} enabled={enabled} {h:?} {unusable:?}");
            assert_ne!(
                idle_state(&decide(&o), &o),
                AgentState::Failed,
                "waiting is not failing"
            );
        }
        // Held, a failed attempt still shows failed.
        let mut o = obs(Some("v2"), Some("v1"), true, Level::Host);
        o.hold = Some(host_hold);
        o.failure = Some(failure("v2", 10_000, 1));
        assert_eq!(idle_state(&decide(&o), &o), AgentState::Failed);
        // Once nothing holds, the backoff still applies.
        let mut o = obs(Some("v2"), Some("v1"), true, Level::Host);
        o.failure = Some(failure("v2", 10_000, 1));
        assert!(matches!(decide(&o), Backoff { until: 10_600, .. }));
    }

    fn result(version: &str, ok: bool, at: u64, checked_at: Option<u64>) -> HostResult {
        HostResult {
            version: v(version),
            ok,
            step: None,
            service: None,
            task: None,
            exit_code: None,
            message: None,
            run_dir: None,
            log: None,
            at,
            checked_at,
            attempt: 1,
            retry_at: None,
            rollout: Some(ROLLOUT.into()),
            packages: None,
        }
    }

    const ROLLOUT: &str = "20261123T020000Z-v2";

    #[test]
    fn the_soak_check() {
        use Decision::*;
        let m = Some(Duration::from_secs(600));
        let soaking = Soaking {
            version: v("v2"),
            check_at: 10_600,
        };
        let check = SoakCheck { version: v("v2") };
        let r = |checked| Some(result("v2", true, 10_000, checked));
        let mut other = result("v2", true, 10_000, None);
        other.rollout = Some("20261122T020000Z-v2".into());
        // min_healthy_time, result, now, lock, health due => decision
        let table = [
            // Just upgraded: the check comes once it has been healthy for M.
            (m, r(None), 10_000, false, false, soaking.clone()),
            (m, r(None), 10_599, true, false, soaking.clone()),
            (m, r(None), 10_600, false, false, check.clone()),
            // The driver's lock does not hold it: the host holds its own slot.
            (m, r(None), 10_600, true, false, check.clone()),
            // Late (the agent was down): still due until a check passed.
            (m, r(None), 99_000, true, false, check.clone()),
            // An idle check due meanwhile runs as the soak's check.
            (m, r(None), 10_001, true, true, check.clone()),
            // Checks before the end of the soak do not end it.
            (m, r(Some(10_000)), 10_600, true, false, check.clone()),
            (m, r(Some(10_599)), 10_600, true, false, check.clone()),
            (m, r(Some(10_599)), 10_300, true, false, soaking.clone()),
            // Checked at the end of the soak or later: soaked, nothing pending.
            (m, r(Some(10_600)), 10_700, true, false, UpToDate),
            (
                m,
                r(Some(10_600)),
                10_700,
                true,
                true,
                HealthHeld { version: v("v2") },
            ),
            // No min_healthy_time, a failed run, another version, another rollout's run.
            (None, r(None), 10_600, true, false, UpToDate),
            (
                m,
                Some(result("v2", false, 10_000, None)),
                10_600,
                true,
                false,
                UpToDate,
            ),
            (
                m,
                Some(result("v1", true, 10_000, None)),
                10_600,
                true,
                false,
                UpToDate,
            ),
            (m, Some(other), 10_600, true, false, UpToDate),
            (m, None, 10_600, true, false, UpToDate),
        ];
        for (mht, res, now, lock, due, want) in table {
            let mut o = obs(Some("v2"), Some("v2"), true, Level::Host);
            o.rollout.min_healthy_time = mht;
            o.rollout.id = Some(ROLLOUT.into());
            (o.result, o.now, o.rollout_lock, o.health_due) = (res.clone(), now, lock, due);
            assert_eq!(
                decide(&o),
                want,
                "{mht:?} {res:?} now={now} lock={lock} due={due}"
            );
        }
        // The check comes at least a second after the run.
        let mut o = obs(Some("v2"), Some("v2"), true, Level::Host);
        o.rollout.id = Some(ROLLOUT.into());
        o.rollout.min_healthy_time = Some(Duration::from_secs(0));
        o.result = Some(result("v2", true, 10_000, None));
        assert_eq!(soak_check_at(&o), Some(10_001));
        // A failed soak is never repaired, and shows failed until a check passes.
        let mut o = obs(Some("v2"), Some("v2"), true, Level::Host);
        o.health = Health::SoakFailed;
        assert_eq!(decide(&o), UpToDate);
        assert_eq!(idle_state(&UpToDate, &o), AgentState::Failed);
        o.health_due = true;
        assert_eq!(decide(&o), HealthCheck { version: v("v2") });
        let fail = Outcome::Failure("x".into());
        assert_eq!(Health::SoakFailed.after_check(&fail), Health::SoakFailed);
        assert_eq!(
            Health::SoakFailed.after_check(&Outcome::Success { changes: false }),
            Health::Good
        );
    }

    /// A command of the inbox, as read on compute1: `hosts` it names, its start.
    fn command(n: u32, hosts: &[&str], started: Option<u32>) -> crate::command_step::Candidate {
        use jio_common::command_record::{CommandState, Started};
        use jio_common::names::{CommandId, HostName};
        let id = CommandId::parse(&format!("20261125T03000{n}Z-restart")).unwrap();
        let mut record = crate::command_step::fixtures::rec(hosts, false, CommandState::Running);
        record.id = id.clone();
        crate::command_step::Candidate {
            id,
            host: HostName::new("compute1").unwrap(),
            record: Some(Ok(record)),
            started: started.map(|attempt| {
                Ok(Started {
                    at: 5,
                    pid: 1,
                    attempt,
                })
            }),
            result: false,
            revisions: (7, 0),
        }
    }

    #[test]
    fn fleet_commands_are_decided_before_an_upgrade() {
        use crate::command_step::CommandStep;
        let upgrade_due = || obs(Some("v2"), Some("v1"), true, Level::Host);
        let step_of = |o: &Observation| match decide(o) {
            Decision::Command { id, step } => format!("{} {step:?}", id.as_str()),
            other => other.kind().to_string(),
        };
        // (candidates, in_progress, held) -> what the pass does
        let cases: Vec<(Vec<crate::command_step::Candidate>, bool, bool, String)> = vec![
            (vec![], false, false, "upgrade".into()),
            (
                vec![command(1, &["compute1"], None)],
                false,
                false,
                format!("20261125T030001Z-restart {:?}", CommandStep::Run { attempt: 1 }),
            ),
            // A run in the journal is recovered before anything else.
            (
                vec![command(1, &["compute1"], None)],
                true,
                false,
                "recover_command".into(),
            ),
            // A command for other hosts is refused; one started before this agent
            // knew of it is reported interrupted.
            (
                vec![command(1, &["compute2"], None)],
                false,
                false,
                "20261125T030001Z-restart Refuse".into(),
            ),
            (
                vec![command(2, &["compute1"], Some(1))],
                false,
                false,
                "20261125T030002Z-restart Interrupted".into(),
            ),
            // A held host runs no command, nor the upgrade.
            (vec![command(1, &["compute1"], None)], false, true, "held".into()),
        ];
        for (i, (candidates, in_progress, held, want)) in cases.into_iter().enumerate() {
            let mut o = upgrade_due();
            o.commands.candidates = candidates;
            o.commands.in_progress = in_progress;
            if held {
                o.hold = Some(Hold {
                    key: "/holds/host/compute1".into(),
                    record: Err("x".into()),
                });
            }
            let got = step_of(&o);
            assert!(got.starts_with(&want), "case {i}: {got}, want {want}");
        }
        // Commands skipped are noted, the first that acts is chosen, and nothing
        // after a held one is looked at.
        let mut o = upgrade_due();
        let mut gone = command(1, &["compute1"], None);
        gone.record = None;
        o.commands.candidates = vec![gone, command(2, &["compute1"], None)];
        let scan = commands(&o);
        assert_eq!(scan.skipped.len(), 1);
        assert!(scan.skipped[0].2, "a command whose record is gone is forgotten");
        assert_eq!(
            scan.act.map(|(id, _)| id.as_str().to_string()).as_deref(),
            Some("20261125T030002Z-restart")
        );
    }
}
