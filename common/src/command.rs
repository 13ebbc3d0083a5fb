//! Fleet commands (`jioctl run`): an action run on a set of hosts under the same
//! rolling rules as upgrades. The record, each host's run, the admissions the
//! driver writes, and the pure planner that decides which hosts start next.
//!
//! A command's hosts are fixed when it is created. A host is admitted by its
//! inbox (`/config_state/commands/<host>`, the ids it may run), written only by
//! drivers in transactions fenced on the plan epoch, as enable keys are. Both
//! planners count the other's hosts in flight: an upgrade counts a host admitted
//! to a command (or whose agent runs one), a command counts a host enabled for
//! the upgrade (or whose agent runs anything). Nothing here does I/O or reads
//! the clock.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::command_record::{CommandRecord, CommandResult, CommandState, RunOutcome, Runs, Targets};
use crate::fleet::{HostState, HostStatus, Snapshot};
use crate::names::CommandId;
use crate::names::{HostName, Role};
use crate::plan::{self, Plan, Reason, ReasonCode};
use crate::rules::{Resolved, Rules, RulesError};
use crate::store::api::Revision;

/// Keys of the rules that mean nothing for a command.
pub const NOT_FOR_COMMANDS: [&str; 8] = [
    "reboot",
    "canary",
    "canary_soak",
    "min_healthy_time",
    "progress_deadline",
    "roles_data",
    "stages",
    "finalize",
];

/// Parses a command's rules: the upgrade rules, without those that only mean
/// something to a rollout. Every problem is named.
pub fn parse_rules(text: &str) -> Result<Rules, RulesError> {
    let rules = Rules::parse(text);
    let mut errors = match &rules {
        Ok(_) => Vec::new(),
        Err(e) => e.0.clone(),
    };
    if let Ok(serde_json::Value::Object(m)) = serde_json::from_str::<serde_json::Value>(text) {
        for k in NOT_FOR_COMMANDS {
            if m.contains_key(k) {
                errors.push(format!(
                    "{k}: applies to rollouts only, not to a command (a command's rules are rolling_rules, role_order, group_mappings, max_failures and windows)"
                ));
            }
        }
    }
    match rules {
        Ok(r) if errors.is_empty() => Ok(r),
        _ => Err(RulesError(errors)),
    }
}

/// One host's place in a command, for people and programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HostPhase {
    /// Not admitted yet.
    Pending,
    /// Admitted; its agent has not started the action.
    Admitted,
    Running,
    Succeeded,
    Failed,
    Refused,
    Interrupted,
    /// The command ended before it was run here.
    NotRun,
}

impl HostPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            HostPhase::Pending => "pending",
            HostPhase::Admitted => "admitted",
            HostPhase::Running => "running",
            HostPhase::Succeeded => "succeeded",
            HostPhase::Failed => "failed",
            HostPhase::Refused => "refused",
            HostPhase::Interrupted => "interrupted",
            HostPhase::NotRun => "not run",
        }
    }
}

/// Everything a command's planner reads.
pub struct View<'a> {
    pub record: &'a CommandRecord,
    pub runs: &'a Runs,
    /// The fleet as read (agents, holds, inboxes, enable keys, run markers).
    pub fleet: &'a Snapshot,
    /// The fleet's classification for upgrades (what else hosts are doing).
    pub fleet_status: &'a [HostStatus],
    /// The record's create revision: an emergency stop after it ends the command.
    pub created: Revision,
    pub now: u64,
}

/// What a pass of the command's driver writes, and where every host stands.
#[derive(Debug, Clone, Default)]
pub struct CommandPlan {
    /// Hosts to admit now.
    pub admit: Vec<HostName>,
    /// Hosts whose inbox still names the command though nothing more is to run
    /// there (ended, or the command ended before they started).
    pub release: Vec<HostName>,
    /// The planner's plan over the command's hosts (limits, reasons).
    pub plan: Plan,
    /// Each host's phase.
    pub phases: BTreeMap<HostName, HostPhase>,
    /// The command ends: its new state.
    pub end: Option<CommandState>,
    /// Hosts whose agent still runs the action (the command's end waits for
    /// nothing, but a follower waits for them).
    pub running: Vec<HostName>,
    /// Why each host that has not succeeded is where it is.
    pub reasons: BTreeMap<HostName, Reason>,
    /// Nothing runs, nothing is admitted and nothing can be, yet hosts are left
    /// (a frozen group, a lost host, a group waiting for one): only an operator
    /// moves it now. A window that opens later is not this.
    pub waits_forever: bool,
}

fn admitted(fleet: &Snapshot, id: &CommandId, h: &HostName) -> bool {
    fleet.inboxes.get(h).is_some_and(|ids| ids.contains(id))
}

/// Plans a pass of a command's driver. Pure.
///
/// Each host's state for the rolling planner (from its run, its admission, or
/// what else it is doing), the planner's pass over the command's hosts with the
/// fleet's busy hosts counted, the command's own reasons, the inboxes to withdraw,
/// and whether the command ends.
pub fn plan(v: &View<'_>, r: &Resolved) -> CommandPlan {
    let rec = v.record;
    let others = Others::new(v);
    let mut out = CommandPlan::default();
    let mut statuses: Vec<HostStatus> = Vec::new();
    for h in &rec.hosts {
        let (status, phase) = host_status(v, &others, h);
        out.phases.insert(h.clone(), phase);
        statuses.push(status);
    }
    let targets: BTreeSet<&HostName> = rec.hosts.iter().collect();
    let busy_outside = others.busy_outside(v, &targets);
    let cx = plan::Context {
        now: v.now,
        rollout: None,
        host_keys_only: true,
        busy_outside: &busy_outside,
        hook_roles: &[],
    };
    let mut p = plan::plan(v.fleet, &statuses, r, &cx);
    own_reasons(v, &statuses, &out.phases, &mut p);
    out.running = statuses
        .iter()
        .filter(|s| matches!(out.phases[&s.host], HostPhase::Running))
        .map(|s| s.host.clone())
        .collect();
    out.release = stale_inboxes(v, &targets);
    if rec.state.active() {
        end_or_admit(v, r, &statuses, &p, &mut out);
    }
    if !rec.state.active() || out.end.is_some() {
        for ph in out.phases.values_mut() {
            if matches!(ph, HostPhase::Pending | HostPhase::Admitted) {
                *ph = HostPhase::NotRun;
            }
        }
    }
    out.reasons = p.reasons.clone();
    out.waits_forever = rec.state.active()
        && out.end.is_none()
        && out.admit.is_empty()
        && p.wake_at.is_none()
        && out
            .phases
            .values()
            .all(|ph| !matches!(ph, HostPhase::Running | HostPhase::Admitted))
        && statuses.iter().any(|s| {
            matches!(s.state, HostState::Pending | HostState::Blocked | HostState::Lost)
                && !p.held.contains(&s.host)
        })
        && !statuses.iter().any(|s| s.state == HostState::Upgrading)
        && !moving_outside(v, r, &statuses, &busy_outside);
    out.plan = p;
    out
}

/// What else the fleet's hosts are doing: an upgrade, another command, or a phase of
/// an active composable rollout granted to their role (its hosts are between steps
/// even when no enable key says so: a service may be stopped until its post step).
struct Others<'a> {
    fleet: &'a Snapshot,
    status: BTreeMap<&'a HostName, &'a HostStatus>,
    composable: Option<String>,
}

impl<'a> Others<'a> {
    fn new(v: &View<'a>) -> Others<'a> {
        let composable = v
            .fleet
            .rollout
            .as_ref()
            .and_then(|c| c.ok())
            .filter(|r| r.state.active())
            .map(|r| r.id.to_string());
        Others {
            fleet: v.fleet,
            status: v.fleet_status.iter().map(|h| (&h.host, h)).collect(),
            composable,
        }
    }

    fn in_phase(&self, role: &Role) -> Option<String> {
        self.composable
            .as_ref()
            .and_then(|id| self.fleet.grants.get(role).filter(|g| &g.rollout == id))
            .map(|g| {
                format!(
                    "busy: its role is in phase {} of composable rollout {}; the command waits for the rollout",
                    g.phase, g.rollout
                )
            })
    }

    /// Why `h` is busy with something else, if it is.
    fn busy(&self, h: &HostName, role: &Role) -> Option<String> {
        self.status
            .get(h)
            .filter(|s| matches!(s.state, HostState::Upgrading | HostState::Lost))
            .map(|s| {
                format!(
                    "busy: {}; the command waits for it",
                    s.reason
                        .clone()
                        .unwrap_or_else(|| "enabled for the upgrade".into())
                )
            })
            .or_else(|| self.in_phase(role))
    }

    /// The fleet's other hosts count in the limits while they are busy (the role's
    /// limit holds across commands and upgrades); percentages, `max_failures` and
    /// `role_order` are of the command's own hosts.
    fn busy_outside(&self, v: &View<'_>, targets: &BTreeSet<&HostName>) -> Vec<HostStatus> {
        v.fleet_status
            .iter()
            .filter(|s| !targets.contains(&s.host))
            .filter_map(|s| {
                self.busy(&s.host, &s.role).map(|why| HostStatus {
                    host: s.host.clone(),
                    role: s.role.clone(),
                    state: HostState::Upgrading,
                    reason: Some(why),
                })
            })
            .collect()
    }
}

/// A command's host as the rolling planner sees it, and its phase in the command.
fn host_status(v: &View<'_>, others: &Others<'_>, h: &HostName) -> (HostStatus, HostPhase) {
    let role = others
        .status
        .get(h)
        .map_or_else(|| v.fleet.role_of(h), |s| s.role.clone());
    let held = v.fleet.hold_of(h, &role).is_some();
    let (state, reason, phase) = run_state(v, h, held).unwrap_or_else(|| {
        if v.fleet.inboxes_invalid.contains(h) && !held {
            // No admission goes through an inbox that cannot be read: it is named
            // until someone fixes (or deletes) it.
            (
                HostState::Blocked,
                Some(format!(
                    "its inbox /config_state/commands/{h} cannot be read: it cannot be admitted until the key is fixed or deleted"
                )),
                HostPhase::Pending,
            )
        } else if let Some(why) = others.busy(h, &role).filter(|_| !held) {
            // Busy with an upgrade or another command: it holds a slot here too.
            (HostState::Upgrading, Some(why), HostPhase::Pending)
        } else {
            (HostState::Pending, None, HostPhase::Pending)
        }
    });
    let status = HostStatus {
        host: h.clone(),
        role,
        state,
        reason,
    };
    (status, phase)
}

/// Where a host stands in the command's own run: its result, a result that cannot
/// be read, started, or admitted (`None`: none of these).
fn run_state(v: &View<'_>, h: &HostName, held: bool) -> Option<(HostState, Option<String>, HostPhase)> {
    let live = v.fleet.agents.contains_key(h);
    let in_flight = |why: &str, lost: &str, phase| {
        if live {
            (HostState::Upgrading, Some(why.to_string()), phase)
        } else {
            (HostState::Lost, Some(lost.to_string()), phase)
        }
    };
    if let Some(res) = v.runs.results.get(h) {
        let phase = match res.outcome {
            RunOutcome::Succeeded => HostPhase::Succeeded,
            RunOutcome::Failed => HostPhase::Failed,
            RunOutcome::Refused => HostPhase::Refused,
            RunOutcome::Interrupted => HostPhase::Interrupted,
        };
        let state = if res.ok() {
            HostState::Upgraded
        } else {
            HostState::Failed
        };
        Some((state, None, phase))
    } else if v.runs.invalid_results.contains(h) {
        Some((HostState::Failed, None, HostPhase::Failed))
    } else if v.runs.started(h) {
        Some(in_flight(
            "running the command",
            "started the command, but its agent is not alive",
            HostPhase::Running,
        ))
    } else if admitted(v.fleet, &v.record.id, h) && v.record.state.active() && !held {
        Some(in_flight(
            "admitted, its agent is about to start the command",
            "admitted, but its agent is not alive",
            HostPhase::Admitted,
        ))
    } else {
        None
    }
}

/// The reasons of hosts the command moved are the command's own.
fn own_reasons(v: &View<'_>, statuses: &[HostStatus], phases: &BTreeMap<HostName, HostPhase>, p: &mut Plan) {
    for s in statuses {
        let why = match phases[&s.host] {
            HostPhase::Succeeded => None,
            HostPhase::Failed | HostPhase::Refused | HostPhase::Interrupted => {
                let res = v.runs.results.get(&s.host);
                let text = match res {
                    Some(res) => result_text(res),
                    None => format!(
                        "its result at /command_runs/{}/results/{} cannot be read",
                        v.record.id, s.host
                    ),
                };
                Some(Reason {
                    code: ReasonCode::Failed,
                    text,
                    at: res.map(|r| r.ended),
                })
            }
            _ => p.reasons.get(&s.host).cloned(),
        };
        match why {
            Some(w) => {
                p.reasons.insert(s.host.clone(), w);
            }
            None => {
                p.reasons.remove(&s.host);
            }
        }
    }
}

/// Inboxes that name the command for nothing: the host's run ended, the command
/// ended, the host is held before it started, or it is not one of the command's
/// hosts.
fn stale_inboxes(v: &View<'_>, targets: &BTreeSet<&HostName>) -> Vec<HostName> {
    let id = &v.record.id;
    v.fleet
        .inboxes
        .iter()
        .filter(|(_, ids)| ids.contains(id))
        .filter(|(h, _)| {
            let role = v.fleet.role_of(h);
            !targets.contains(h)
                || v.runs.ended(h)
                || !v.record.state.active()
                || (!v.runs.started(h) && v.fleet.hold_of(h, &role).is_some())
        })
        .map(|(h, _)| h.clone())
        .collect()
}

/// An active command ends (an emergency stop after it was created, or `ending`),
/// withdrawing every admission; or it admits what the plan enables.
fn end_or_admit(v: &View<'_>, r: &Resolved, statuses: &[HostStatus], p: &Plan, out: &mut CommandPlan) {
    out.end = match v.fleet.halt.as_ref().filter(|(_, rev)| *rev > v.created) {
        Some((by, _)) => Some(CommandState::Aborted {
            by: by.holder.clone(),
            reason: Some(format!(
                "emergency stop (global-disable-puppet) by {} on {}",
                by.holder, by.host
            )),
        }),
        None => ending(statuses, &out.phases, p, v, r),
    };
    if out.end.is_none() {
        out.admit = p.enable_hosts.clone();
        return;
    }
    // The end withdraws every admission: hosts not started never start it, running
    // ones finish (their agents' records count them in flight).
    for (h, ids) in &v.fleet.inboxes {
        if ids.contains(&v.record.id) && !out.release.contains(h) {
            out.release.push(h.clone());
        }
    }
    out.release.sort();
}

/// Hosts outside the command, with a live agent, hold slots of a group where the
/// command's hosts wait (a rollout's hosts upgrading): they finish by themselves,
/// so waiting for them is not waiting forever. A lost one is not such a host.
fn moving_outside(v: &View<'_>, r: &Resolved, statuses: &[HostStatus], busy: &[HostStatus]) -> bool {
    let group = |role: &Role| r.group_of.get(role).cloned().unwrap_or_else(|| role.to_string());
    let waiting: BTreeSet<String> = statuses
        .iter()
        .filter(|s| s.state == HostState::Pending)
        .map(|s| group(&s.role))
        .collect();
    // Under a fleet cap, a live busy host of any group frees a slot when it ends.
    busy.iter().any(|b| {
        v.fleet.agents.contains_key(&b.host) && (r.fleet_limit.is_some() || waiting.contains(&group(&b.role)))
    })
}

/// Whether the command ends at this pass, and how: stopped on failures, done, or
/// failed with every host not run saying why. Hosts left to move: not ended.
fn ending(
    statuses: &[HostStatus],
    phases: &BTreeMap<HostName, HostPhase>,
    p: &Plan,
    v: &View<'_>,
    r: &Resolved,
) -> Option<CommandState> {
    let mut hosts = failed_hosts(statuses, phases, v);
    if p.stopped_on_failures {
        for s in statuses {
            if matches!(phases[&s.host], HostPhase::Pending | HostPhase::Admitted) {
                hosts.insert(
                    s.host.to_string(),
                    "not run: the command stopped on failures".into(),
                );
            }
        }
        return Some(CommandState::Failed { failed_hosts: hosts });
    }
    // Hosts left: not ended. Held ones are never admitted, nor are the pending
    // hosts of a group that waits for a group where the command ended with a
    // failure (a host never runs a command twice, so that group is never done):
    // with nothing else left to move, the command ends without them.
    let never = never_admitted(statuses, p, r);
    let held: BTreeSet<&HostName> = p.held.iter().collect();
    let open: Vec<&HostStatus> = statuses
        .iter()
        .filter(|s| !matches!(s.state, HostState::Upgraded | HostState::Failed))
        .collect();
    if open
        .iter()
        .any(|s| !held.contains(&s.host) && !never.contains_key(&s.host))
    {
        return None;
    }
    if hosts.is_empty() && open.is_empty() {
        return Some(CommandState::Done);
    }
    for s in open {
        let why = match never.get(&s.host) {
            Some(why) => why.clone(),
            None => {
                let why = p.reasons.get(&s.host).map_or("held", |r| r.text.as_str());
                format!("not run: {why}")
            }
        };
        hosts.insert(s.host.to_string(), why);
    }
    Some(CommandState::Failed { failed_hosts: hosts })
}

/// The hosts whose run failed, was refused or interrupted, with their result.
fn failed_hosts(
    statuses: &[HostStatus],
    phases: &BTreeMap<HostName, HostPhase>,
    v: &View<'_>,
) -> BTreeMap<String, String> {
    statuses
        .iter()
        .filter(|s| {
            matches!(
                phases[&s.host],
                HostPhase::Failed | HostPhase::Refused | HostPhase::Interrupted
            )
        })
        .map(|s| {
            let why = v
                .runs
                .results
                .get(&s.host)
                .map(result_text)
                .unwrap_or_else(|| "its result cannot be read".into());
            (s.host.to_string(), why)
        })
        .collect()
}

/// Pending hosts of a group that waits only for groups where the command ended
/// with a failure (every host finished, one failed): they are never admitted.
fn never_admitted<'s>(statuses: &'s [HostStatus], p: &Plan, r: &Resolved) -> BTreeMap<&'s HostName, String> {
    let group_of = |role: &Role| r.group_of.get(role).cloned().unwrap_or_else(|| role.to_string());
    let mut by_group: BTreeMap<String, Vec<&HostStatus>> = BTreeMap::new();
    for s in statuses {
        by_group.entry(group_of(&s.role)).or_default().push(s);
    }
    let dead: BTreeSet<String> = by_group
        .into_iter()
        .filter(|(_, hs)| {
            hs.iter()
                .all(|s| matches!(s.state, HostState::Upgraded | HostState::Failed))
                && hs.iter().any(|s| s.state == HostState::Failed)
        })
        .map(|(g, _)| g)
        .collect();
    let waits_on_dead = |g: &str| {
        let gp = p.groups.iter().find(|gp| gp.group == g)?;
        match &gp.action {
            crate::plan::GroupAction::Wait { on }
                if !on.is_empty() && on.iter().all(|d| dead.contains(d)) =>
            {
                Some(on.join(", "))
            }
            _ => None,
        }
    };
    statuses
        .iter()
        .filter(|s| s.state == HostState::Pending)
        .filter_map(|s| {
            let on = waits_on_dead(&group_of(&s.role))?;
            Some((
                &s.host,
                format!("not run: it waits for {on}, where the command failed"),
            ))
        })
        .collect()
}

/// A result for people: `exit 3: <message>`, `refused: <why>`...
pub fn result_text(r: &CommandResult) -> String {
    let mut s = r.outcome.as_str().to_string();
    match (&r.message, r.exit_code) {
        (Some(m), _) => {
            s.push_str(": ");
            s.push_str(m);
        }
        (None, Some(c)) => s.push_str(&format!(" (exit {c})")),
        (None, None) => {}
    }
    s
}

/// `1 host`, `2 hosts`.
pub fn hosts_n(n: usize) -> String {
    format!("{n} host{}", if n == 1 { "" } else { "s" })
}

/// The hosts a target names, from the fleet as read; every problem named (an
/// unknown host or a role without hosts).
pub fn resolve_targets(t: &Targets, fleet: &Snapshot) -> Result<Vec<HostName>, Vec<String>> {
    let all = fleet.hosts();
    match t {
        Targets::All => {
            if all.is_empty() {
                Err(vec![
                    "--all: the fleet has no hosts (none registered under /hosts/ or at a version)".into(),
                ])
            } else {
                Ok(all.into_iter().collect())
            }
        }
        Targets::Roles(roles) => {
            let mut errors = Vec::new();
            let mut out = BTreeSet::new();
            for r in roles {
                let of: Vec<&HostName> = all.iter().filter(|h| &fleet.role_of(h) == r).collect();
                if of.is_empty() {
                    errors.push(format!("--role {r}: no host of the fleet has this role"));
                }
                out.extend(of.into_iter().cloned());
            }
            if errors.is_empty() {
                Ok(out.into_iter().collect())
            } else {
                Err(errors)
            }
        }
        Targets::Hosts(hosts) => {
            let errors: Vec<String> = hosts
                .iter()
                .filter(|h| !all.contains(*h))
                .map(|h| format!("--hosts {h}: not a host of the fleet (not registered under /hosts/, not at any version)"))
                .collect();
            if errors.is_empty() {
                Ok(hosts
                    .iter()
                    .cloned()
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect())
            } else {
                Err(errors)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command_record::Started;
    use crate::values::{AgentRecord, AgentState};

    fn h(s: &str) -> HostName {
        HostName::new(s).unwrap()
    }

    fn id() -> CommandId {
        CommandId::parse("20261125T030000Z-restart").unwrap()
    }

    fn record(hosts: &[&str]) -> CommandRecord {
        CommandRecord {
            id: id(),
            action: "restart".into(),
            args: vec!["nova".into()],
            targets: Targets::All,
            hosts: hosts.iter().map(|x| h(x)).collect(),
            rules: serde_json::json!({}),
            timeout_s: None,
            rerun_interrupted: false,
            created_by: "alice@laptop".into(),
            created_at: 10,
            state: CommandState::Running,
            changes: vec![],
        }
    }

    /// A fleet of registered hosts with live, idle agents and no current version.
    fn fleet(hosts: &[&str]) -> Snapshot {
        let mut s = Snapshot::default();
        for x in hosts {
            s.roles
                .insert(h(x), Role::new(x.trim_end_matches(char::is_numeric)).unwrap());
            s.agents.insert(
                h(x),
                Some(AgentRecord {
                    state: AgentState::Idle,
                    version: None,
                    since: 0,
                    pid: 1,
                    until: None,
                }),
            );
        }
        s
    }

    fn result(outcome: RunOutcome) -> CommandResult {
        CommandResult {
            outcome,
            exit_code: Some(if outcome == RunOutcome::Succeeded { 0 } else { 3 }),
            message: None,
            started: 100,
            ended: 105,
            run_dir: None,
            attempt: 1,
        }
    }

    fn planned(rec: &CommandRecord, fleet: &Snapshot, runs: &Runs, rules: &str) -> CommandPlan {
        let statuses = crate::fleet::classify(fleet);
        let roles: BTreeSet<Role> = fleet.hosts().iter().map(|x| fleet.role_of(x)).collect();
        let r = parse_rules(rules).unwrap().resolve(&roles).unwrap();
        plan(
            &View {
                record: rec,
                runs,
                fleet,
                fleet_status: &statuses,
                created: 50,
                now: 1000,
            },
            &r,
        )
    }

    const LIMIT_2: &str = r#"{"rolling_rules": {"roles": {"compute": 2}}}"#;

    #[test]
    fn a_record_reads_back_in_every_state() {
        let mut failed = BTreeMap::new();
        failed.insert("compute1".to_string(), "exit 3".to_string());
        for state in [
            CommandState::Running,
            CommandState::Done,
            CommandState::Failed { failed_hosts: failed },
            CommandState::Cancelled {
                by: "bob".into(),
                reason: Some("wrong build".into()),
            },
            CommandState::Aborted {
                by: "carol".into(),
                reason: None,
            },
        ] {
            let rec = record(&["compute1"]).moved(state, "bob", 20, None);
            let text = serde_json::to_string(&rec).unwrap();
            let back: CommandRecord = serde_json::from_str(&text).unwrap();
            assert_eq!(back, rec, "{text}");
        }
    }

    #[test]
    fn ids_sort_by_time_and_name_the_action() {
        let a = CommandId::new(1_795_000_000, "/usr/sbin/service restart", 1);
        assert!(a.as_str().ends_with("-service-restart"), "{a}");
        assert_eq!(CommandId::parse(a.as_str()), Some(a.clone()));
        let b = CommandId::new(1_795_000_000, "restart", 2);
        assert!(b.as_str().ends_with("-restart-2"), "{b}");
        assert!(CommandId::new(1_795_000_001, "a", 1) > CommandId::new(1_795_000_000, "z", 1));
        for bad in [
            "",
            "restart",
            "2026-x",
            "20261125T030000Z-",
            "20261125T030000Z-a/b",
            "20261125T030000Z-a b",
        ] {
            assert_eq!(CommandId::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn rollout_only_rules_are_refused_by_name() {
        let e = parse_rules(r#"{"canary": 1, "min_healthy_time": "5m", "rolling_rules": {"global": 1}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("canary: applies to rollouts only"), "{e}");
        assert!(e.contains("min_healthy_time: applies to rollouts only"), "{e}");
        assert!(parse_rules(r#"{"rolling_rules": {"global": -1}}"#).is_err());
        assert!(parse_rules(r#"{"rolling_rules": {"global": 1}, "max_failures": "10%"}"#).is_ok());
    }

    #[test]
    fn hosts_are_admitted_up_to_the_limit_in_name_order() {
        let names = ["compute1", "compute2", "compute3", "compute4", "compute5"];
        let rec = record(&names);
        let mut f = fleet(&names);
        let mut runs = Runs::default();
        let p = planned(&rec, &f, &runs, LIMIT_2);
        assert_eq!(p.admit, [h("compute1"), h("compute2")]);
        assert!(p.end.is_none());
        // compute1 runs, compute2 is admitted: nothing more.
        f.inboxes.insert(h("compute1"), vec![id()]);
        f.inboxes.insert(h("compute2"), vec![id()]);
        runs.started.insert(
            h("compute1"),
            Started {
                at: 100,
                pid: 1,
                attempt: 1,
            },
        );
        let p = planned(&rec, &f, &runs, LIMIT_2);
        assert!(p.admit.is_empty(), "{:?}", p.admit);
        assert_eq!(p.phases[&h("compute1")], HostPhase::Running);
        assert_eq!(p.phases[&h("compute2")], HostPhase::Admitted);
        assert_eq!(p.running, [h("compute1")]);
        // compute1 succeeded: its slot goes to compute3, its admission is released.
        runs.results.insert(h("compute1"), result(RunOutcome::Succeeded));
        let p = planned(&rec, &f, &runs, LIMIT_2);
        assert_eq!(p.admit, [h("compute3")]);
        assert_eq!(p.release, [h("compute1")]);
    }

    #[test]
    fn a_host_busy_with_an_upgrade_or_another_command_holds_a_slot() {
        let names = ["compute1", "compute2", "compute3"];
        let rec = record(&names);
        let mut f = fleet(&names);
        // compute1's agent runs Puppet; compute2 is admitted to another command.
        f.agents.insert(
            h("compute1"),
            Some(AgentRecord {
                state: AgentState::Upgrading,
                version: None,
                since: 0,
                pid: 1,
                until: None,
            }),
        );
        f.inboxes.insert(
            h("compute2"),
            vec![CommandId::parse("20261125T020000Z-other").unwrap()],
        );
        let p = planned(&rec, &f, &Runs::default(), LIMIT_2);
        assert!(p.admit.is_empty(), "{:?}", p.admit);
        assert!(p.reasons[&h("compute1")].text.contains("busy"), "{:?}", p.reasons);
        assert!(
            p.reasons[&h("compute3")].text.contains("limit"),
            "{:?}",
            p.reasons
        );
        // An inbox that cannot be read admits nothing, and no host is admitted
        // through it: it is named until fixed.
        let mut f = fleet(&names);
        f.inboxes_invalid.insert(h("compute1"));
        let p = planned(&rec, &f, &Runs::default(), r#"{"rolling_rules": {"global": 1}}"#);
        assert_eq!(p.admit, [h("compute2")]);
        assert!(
            p.reasons[&h("compute1")].text.contains("cannot be read"),
            "{:?}",
            p.reasons
        );
    }

    #[test]
    fn a_failure_beyond_max_failures_ends_it_and_withdraws_every_admission() {
        let names = ["compute1", "compute2", "compute3", "compute4"];
        let rec = record(&names);
        let mut f = fleet(&names);
        let mut runs = Runs::default();
        runs.results.insert(h("compute1"), result(RunOutcome::Failed));
        f.inboxes.insert(h("compute1"), vec![id()]);
        f.inboxes.insert(h("compute2"), vec![id()]);
        runs.started.insert(
            h("compute3"),
            Started {
                at: 1,
                pid: 1,
                attempt: 1,
            },
        );
        f.inboxes.insert(h("compute3"), vec![id()]);
        let p = planned(&rec, &f, &runs, r#"{"rolling_rules": {"global": 3}}"#);
        let Some(CommandState::Failed { failed_hosts }) = &p.end else {
            panic!("{:?}", p.end)
        };
        assert!(
            failed_hosts["compute1"].starts_with("failed (exit 3)"),
            "{failed_hosts:?}"
        );
        assert!(!p.waits_forever);
        assert!(
            failed_hosts["compute4"].contains("stopped on failures"),
            "{failed_hosts:?}"
        );
        assert!(p.admit.is_empty());
        // Every admission is withdrawn: compute2 never starts, compute3 runs on
        // (its agent's record keeps it in flight).
        assert_eq!(p.release, [h("compute1"), h("compute2"), h("compute3")]);
        assert_eq!(p.running, [h("compute3")]);
        // Within the budget it goes on (the failed host keeps its slot).
        let p = planned(
            &rec,
            &f,
            &runs,
            r#"{"rolling_rules": {"global": 3}, "max_failures": 1}"#,
        );
        assert!(p.end.is_none());
        assert!(p.admit.is_empty(), "{:?}", p.admit);
        let p = planned(
            &rec,
            &f,
            &runs,
            r#"{"rolling_rules": {"global": 4}, "max_failures": 1}"#,
        );
        assert!(p.end.is_none());
        assert_eq!(p.admit, [h("compute4")]);
    }

    #[test]
    fn it_ends_done_when_every_host_succeeded_and_failed_without_held_hosts() {
        let names = ["compute1", "compute2"];
        let rec = record(&names);
        let mut f = fleet(&names);
        let mut runs = Runs::default();
        runs.results.insert(h("compute1"), result(RunOutcome::Succeeded));
        runs.results.insert(h("compute2"), result(RunOutcome::Succeeded));
        assert_eq!(planned(&rec, &f, &runs, "{}").end, Some(CommandState::Done));
        // compute2 held and never run: the command ends, without it, failed.
        runs.results.remove(&h("compute2"));
        f.holds.insert(crate::keys::HoldTarget::Host(h("compute2")), None);
        let p = planned(&rec, &f, &runs, "{}");
        let Some(CommandState::Failed { failed_hosts }) = &p.end else {
            panic!("{:?}", p.end)
        };
        assert!(
            failed_hosts["compute2"].starts_with("not run: held"),
            "{failed_hosts:?}"
        );
        assert_eq!(p.phases[&h("compute2")], HostPhase::NotRun);
        // A lost host (no agent) is waited for, not skipped.
        f.holds.clear();
        f.agents.remove(&h("compute2"));
        let p = planned(&rec, &f, &runs, "{}");
        assert!(p.end.is_none());
        assert!(p.admit.is_empty());
        assert_eq!(p.reasons[&h("compute2")].code, ReasonCode::Lost);
    }

    #[test]
    fn role_order_waits_for_the_command_to_succeed_on_the_roles_it_follows() {
        let names = ["compute1", "controller1"];
        let rec = record(&names);
        let f = fleet(&names);
        let mut runs = Runs::default();
        let rules = r#"{"role_order": {"compute": "controller"}}"#;
        let p = planned(&rec, &f, &runs, rules);
        assert_eq!(p.admit, [h("controller1")]);
        runs.results.insert(h("controller1"), result(RunOutcome::Failed));
        let p = planned(
            &rec,
            &f,
            &runs,
            r#"{"role_order": {"compute": "controller"}, "max_failures": 1}"#,
        );
        assert!(p.admit.is_empty(), "a failed controller does not let compute go");
        runs.results
            .insert(h("controller1"), result(RunOutcome::Succeeded));
        assert_eq!(planned(&rec, &f, &runs, rules).admit, [h("compute1")]);
    }

    #[test]
    fn busy_hosts_outside_the_command_count_in_its_limits() {
        // compute1 and compute2 upgrade; the command is for compute3 and compute4.
        let names = ["compute1", "compute2", "compute3", "compute4"];
        let rec = record(&["compute3", "compute4"]);
        let mut f = fleet(&names);
        for x in ["compute1", "compute2"] {
            f.agents.insert(
                h(x),
                Some(AgentRecord {
                    state: AgentState::Upgrading,
                    version: None,
                    since: 0,
                    pid: 1,
                    until: None,
                }),
            );
        }
        let p = planned(&rec, &f, &Runs::default(), LIMIT_2);
        assert!(p.admit.is_empty(), "{:?}", p.admit);
        assert!(
            p.reasons[&h("compute3")].text.contains("compute1"),
            "{:?}",
            p.reasons
        );
        assert!(
            !p.reasons.contains_key(&h("compute1")),
            "only the command's hosts have reasons"
        );
        let p = planned(
            &rec,
            &f,
            &Runs::default(),
            r#"{"rolling_rules": {"roles": {"compute": 3}}}"#,
        );
        assert_eq!(p.admit, [h("compute3")]);
        // max_failures as a percentage is of the command's hosts (2), not the fleet.
        let mut runs = Runs::default();
        runs.results.insert(h("compute3"), result(RunOutcome::Failed));
        let p = planned(&rec, &f, &runs, r#"{"max_failures": "50%"}"#);
        assert!(p.end.is_none(), "1 failure of 2 hosts is within 50%");
    }

    #[test]
    fn a_host_held_after_its_admission_is_withdrawn_and_left_out() {
        let names = ["compute1", "compute2"];
        let rec = record(&names);
        let mut f = fleet(&names);
        let mut runs = Runs::default();
        runs.results.insert(h("compute1"), result(RunOutcome::Succeeded));
        f.inboxes.insert(h("compute2"), vec![id()]);
        f.holds.insert(crate::keys::HoldTarget::Host(h("compute2")), None);
        let p = planned(&rec, &f, &runs, "{}");
        assert_eq!(p.release, [h("compute2")]);
        assert!(matches!(p.end, Some(CommandState::Failed { .. })), "{:?}", p.end);
        // An admission of a host the command does not name is withdrawn too.
        let mut f = fleet(&["compute1", "compute2", "compute3"]);
        f.inboxes.insert(h("compute3"), vec![id()]);
        let p = planned(&rec, &f, &Runs::default(), "{}");
        assert_eq!(p.release, [h("compute3")]);
    }

    #[test]
    fn a_role_in_a_phase_of_an_active_composable_rollout_is_busy() {
        let names = ["compute1", "compute2"];
        let rec = record(&names);
        let mut f = fleet(&names);
        let ro = crate::rollout::RolloutRecord::start(
            crate::names::Version::new("v2").unwrap(),
            None,
            serde_json::json!({}),
            "alice",
            100,
        );
        let grant = crate::phase::Grant {
            rollout: ro.id.to_string(),
            stage: "compute".into(),
            phase: "pre-1".into(),
            services: vec![],
            level: 0,
            left_behind: BTreeMap::new(),
        };
        f.rollout = Some(crate::fleet::CurrentRollout {
            id: ro.id.to_string(),
            current_revision: 1,
            record: Ok(ro.clone()),
            record_revision: 1,
        });
        f.grants.insert(Role::new("compute").unwrap(), grant);
        let p = planned(&rec, &f, &Runs::default(), "{}");
        assert!(p.admit.is_empty(), "{:?}", p.admit);
        assert!(
            p.reasons[&h("compute1")].text.contains("phase pre-1"),
            "{:?}",
            p.reasons
        );
        // Once the rollout ended, the role is free.
        f.rollout = None;
        assert_eq!(planned(&rec, &f, &Runs::default(), "{}").admit.len(), 2);
    }

    #[test]
    fn a_frozen_group_or_a_lost_host_waits_for_an_operator() {
        let names = ["compute1", "compute2"];
        let rec = record(&names);
        let f = fleet(&names);
        let p = planned(
            &rec,
            &f,
            &Runs::default(),
            r#"{"rolling_rules": {"roles": {"compute": 0}}}"#,
        );
        assert!(p.admit.is_empty());
        assert!(p.waits_forever, "{:?}", p.reasons);
        let p = planned(&rec, &f, &Runs::default(), LIMIT_2);
        assert!(!p.waits_forever);
        let mut f = fleet(&names);
        f.agents.clear();
        assert!(planned(&rec, &f, &Runs::default(), LIMIT_2).waits_forever);
    }

    #[test]
    fn a_group_waiting_for_one_where_the_command_failed_ends_it() {
        let names = ["compute1", "controller1"];
        let rec = record(&names);
        let f = fleet(&names);
        let mut runs = Runs::default();
        runs.results.insert(h("controller1"), result(RunOutcome::Failed));
        let p = planned(
            &rec,
            &f,
            &runs,
            r#"{"role_order": {"compute": "controller"}, "max_failures": 1}"#,
        );
        let Some(CommandState::Failed { failed_hosts }) = &p.end else {
            panic!("{:?}", p.end)
        };
        assert!(
            failed_hosts["compute1"].contains("waits for controller"),
            "{failed_hosts:?}"
        );
        // While the controller still runs, compute waits.
        runs.results.clear();
        runs.started.insert(
            h("controller1"),
            Started {
                at: 1,
                pid: 1,
                attempt: 1,
            },
        );
        let p = planned(
            &rec,
            &f,
            &runs,
            r#"{"role_order": {"compute": "controller"}, "max_failures": 1}"#,
        );
        assert!(p.end.is_none());
    }

    #[test]
    fn percentages_and_role_order_are_of_the_commands_own_hosts() {
        // Four computes in the fleet, the command names two: 50% of its computes
        // is one host at a time.
        let names = [
            "compute1",
            "compute2",
            "compute3",
            "compute4",
            "controller1",
            "controller2",
        ];
        let rec = record(&["compute1", "compute2", "controller1"]);
        let mut f = fleet(&names);
        let p = planned(
            &rec,
            &f,
            &Runs::default(),
            r#"{"rolling_rules": {"roles": {"compute": "50%"}}}"#,
        );
        assert_eq!(p.admit, [h("compute1"), h("controller1")]);
        let p = planned(
            &rec,
            &f,
            &Runs::default(),
            r#"{"rolling_rules": {"fleet": "34%"}}"#,
        );
        assert_eq!(p.admit.len(), 1, "34% of 3 hosts: {:?}", p.admit);
        // controller2, busy elsewhere, is not a host the compute group waits for.
        f.agents.insert(
            h("controller2"),
            Some(AgentRecord {
                state: AgentState::Upgrading,
                version: None,
                since: 0,
                pid: 1,
                until: None,
            }),
        );
        let mut runs = Runs::default();
        runs.results
            .insert(h("controller1"), result(RunOutcome::Succeeded));
        let p = planned(&rec, &f, &runs, r#"{"role_order": {"compute": "controller"}}"#);
        assert_eq!(p.admit, [h("compute1"), h("compute2")]);
    }

    #[test]
    fn an_emergency_stop_after_the_command_was_created_ends_it() {
        let names = ["compute1"];
        let rec = record(&names);
        let mut f = fleet(&names);
        let stop = crate::fleet::LockRecord {
            holder: "carol".into(),
            host: "laptop".into(),
            pid: 1,
            since: 0,
        };
        f.halt = Some((stop.clone(), 40));
        assert!(
            planned(&rec, &f, &Runs::default(), "{}").end.is_none(),
            "an older stop"
        );
        f.halt = Some((stop, 60));
        let p = planned(&rec, &f, &Runs::default(), "{}");
        assert!(matches!(p.end, Some(CommandState::Aborted { .. })), "{:?}", p.end);
        assert!(p.admit.is_empty());
    }
}
