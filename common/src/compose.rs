//! Composable service upgrades (seed 004): the pure planner of a composable
//! rollout. Its stored vocabulary is in `phase`, its rules in `compose_rules`.
//!
//! A composable rollout's rules carry a roles-data document (role → services), the
//! stages (role lists, in the order written) and the finalize rule. Each host's
//! agent publishes the catalog of its task files (`/hosts/<host>/services`): which
//! services it has, at which `pre` and `post` steps they have tasks, what they run
//! `after`, and whether they have finalize tasks. From those, a stage is a sequence
//! of phases: its `pre` steps, `puppet`, its `post` steps, each step split by
//! dependency level. The driver grants one phase at a time per stage
//! (`/steps/roles/<role>`), admits the hosts taking part under the rolling rules,
//! and grants the next phase only when every host taking part has finished the
//! current one. Nothing here does I/O or reads the clock.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::compose_rules::Compose;
use crate::fleet::{HostState, HostStatus, Snapshot, classify};
use crate::keys::{Outcome, Step};
use crate::names::{HostName, Role, Service};
use crate::phase::{FinalizeGrant, Grant, Phase, PhaseKey, ServiceSteps, When};
use crate::plan::{self, Context, Plan, Reason, ReasonCode};
use crate::rules::Resolved;

/// Each service's dependency level: 0 for a service that runs after nothing, else
/// one more than the highest level of the services it runs after. An error names a
/// cycle.
pub fn levels(graph: &BTreeMap<Service, BTreeSet<Service>>) -> Result<BTreeMap<Service, u32>, String> {
    fn visit(
        s: &Service,
        graph: &BTreeMap<Service, BTreeSet<Service>>,
        stack: &mut Vec<Service>,
        out: &mut BTreeMap<Service, u32>,
    ) -> Result<u32, String> {
        if let Some(l) = out.get(s) {
            return Ok(*l);
        }
        if let Some(pos) = stack.iter().position(|x| x == s) {
            let mut c: Vec<&str> = stack[pos..].iter().map(Service::as_str).collect();
            c.push(s.as_str());
            return Err(format!("the services' `after` form a cycle: {}", c.join(" -> ")));
        }
        stack.push(s.clone());
        let mut level = 0;
        for d in graph.get(s).into_iter().flatten() {
            level = level.max(visit(d, graph, stack, out)? + 1);
        }
        stack.pop();
        out.insert(s.clone(), level);
        Ok(level)
    }
    let mut out = BTreeMap::new();
    for s in graph.keys() {
        visit(s, graph, &mut Vec::new(), &mut out)?;
    }
    Ok(out)
}

/// The `after` graph of the rollout's services, from every host's catalog (an
/// `after` naming a service the rollout does not run is no constraint).
pub fn graph(c: &Compose, snap: &Snapshot) -> BTreeMap<Service, BTreeSet<Service>> {
    let all = c.all_services();
    let mut g: BTreeMap<Service, BTreeSet<Service>> =
        all.iter().map(|s| ((*s).clone(), BTreeSet::new())).collect();
    for cat in snap.catalogs.values().filter_map(|c| c.as_ref().ok()) {
        for (s, steps) in &cat.services {
            if let Some(deps) = g.get_mut(s) {
                deps.extend(steps.after.iter().filter(|d| all.contains(d) && *d != s).cloned());
            }
        }
    }
    g
}

/// A host's services with their steps, as its catalog says: `Err` when it cannot
/// take part (no catalog, a service without a usable task file), naming why.
fn host_services(
    c: &Compose,
    snap: &Snapshot,
    h: &HostName,
    role: &Role,
) -> Result<Vec<(Service, ServiceSteps)>, String> {
    let services = c.services_of(role);
    if services.is_empty() {
        return Ok(Vec::new());
    }
    let cat = match snap.catalogs.get(h) {
        None => {
            return Err(format!(
                "no service catalog (/hosts/{h}/services): its agent has published no task files (its services_dir does not exist, or the agent is older than composable rollouts)"
            ));
        }
        Some(Err(e)) => return Err(e.clone()),
        Some(Ok(cat)) => cat,
    };
    if let Some(e) = &cat.error {
        return Err(e.clone());
    }
    let mut out = Vec::new();
    for s in services {
        if let Some(p) = cat.problems.get(s) {
            return Err(format!("service {s}: {p}"));
        }
        match cat.services.get(s) {
            Some(steps) => out.push((s.clone(), steps.clone())),
            None => {
                return Err(format!(
                    "service {s} (roles_data for role {role}) has no task file on it ({}/{s}.toml)",
                    cat.dir
                ));
            }
        }
    }
    Ok(out)
}

/// The phases of a stage whose hosts run `services` (host → its services and
/// steps): every `pre` step in ascending order, split by dependency level, then
/// `puppet`, then the `post` steps likewise.
pub fn sequence(
    hosts: &BTreeMap<HostName, Vec<(Service, ServiceSteps)>>,
    levels: &BTreeMap<Service, u32>,
) -> Vec<Phase> {
    let mut by: BTreeMap<PhaseKey, BTreeSet<Service>> = BTreeMap::new();
    for services in hosts.values() {
        for (s, steps) in services {
            let level = levels.get(s).copied().unwrap_or(0);
            for (rank, list) in [(0u8, &steps.pre), (2u8, &steps.post)] {
                for step in list {
                    by.entry(PhaseKey {
                        rank,
                        step: *step,
                        level,
                    })
                    .or_default()
                    .insert(s.clone());
                }
            }
        }
    }
    by.insert(Phase::puppet().key, BTreeSet::new());
    by.into_iter()
        .map(|(key, services)| Phase {
            key,
            services: services.into_iter().collect(),
        })
        .collect()
}

/// A stage as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StageView {
    pub name: String,
    pub roles: Vec<Role>,
    /// `not_started`, `waiting` (an earlier stage is not done), `blocked` (a host
    /// cannot take part), `running`, `done`.
    pub state: &'static str,
    /// The phase going on (`running`): its name and services.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Hosts taking part in that phase, and how many finished it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub taking_part: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished: Option<usize>,
    /// Its phases, in order.
    pub phases: Vec<String>,
    /// Hosts of the stage.
    pub hosts: usize,
    /// Hosts left behind (failed, or held while their phase went on).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub left_behind: BTreeMap<HostName, String>,
}

/// The finalize step as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FinalizeView {
    /// `waiting` (stages not done), `running`, `done`, `failed`, `none` (no task),
    /// `not_run` (a host did not reach the version).
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<HostName>,
    pub services: Vec<Service>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// How the rollout stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// A stage moves (admit, or wait for hosts in flight).
    Moving,
    /// Every started stage is done; these stages are not started.
    StagesDone { not_started: Vec<String> },
    /// Every stage and the finalize step are done: the rollout ends (failed when
    /// hosts failed or were left behind failing).
    Finished { failed: BTreeMap<String, String> },
    /// More failures than `max_failures`.
    Stopped { failed: BTreeMap<String, String> },
}

/// What a driver's pass does in a composable rollout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Composed {
    /// Admissions of the phase going on (host keys only) and a reason for every
    /// host that is not done.
    pub plan: Plan,
    pub stages: Vec<StageView>,
    pub finalize: FinalizeView,
    /// Grants to write (the phase moved on), by role; the enable keys of
    /// `reset_hosts` and `reset_roles` are deleted in the same transaction.
    pub grants: Vec<(Role, Grant)>,
    pub reset_hosts: Vec<HostName>,
    pub reset_roles: Vec<Role>,
    /// The finalize grant to write, with its host's enable key set to true.
    pub finalize_grant: Option<FinalizeGrant>,
    pub standing: Standing,
    /// Host-phases finished so far (the progress deadline counts from a change).
    pub progress: usize,
    /// The statuses the plan was made on (the phase's hosts), for the progress view.
    pub hosts: Vec<HostStatus>,
}

impl Composed {
    /// Whether the pass writes anything.
    pub fn writes(&self) -> bool {
        !self.plan.is_empty() || !self.grants.is_empty() || self.finalize_grant.is_some()
    }
}

fn reason(code: ReasonCode, text: String) -> Reason {
    Reason { code, text, at: None }
}

/// A host's progress in one task phase: done, failed (the status's value and
/// revision), or neither.
enum Progress {
    Done,
    Failed(String, crate::store::Revision),
    Open,
}

fn task_progress(snap: &Snapshot, h: &HostName, phase: &str, services: &[&Service]) -> Progress {
    let mut done = true;
    for s in services {
        match snap
            .step_statuses
            .get(&(phase.to_string(), (*s).clone(), h.clone()))
        {
            Some(st) if st.outcome == Outcome::Success => {}
            Some(st) => return Progress::Failed(format!("service {s}: {}", st.value), st.revision),
            None => done = false,
        }
    }
    if done { Progress::Done } else { Progress::Open }
}

/// Plans one pass of the composable rollout `cx.rollout` (whose rules hold `c`),
/// resolved as `r`. Pure.
#[expect(
    clippy::too_many_lines,
    reason = "longer than a screen: to be cut into named steps (issue 33)"
)]
pub fn plan(given: &Snapshot, c: &Compose, r: &Resolved, cx: &Context<'_>) -> Composed {
    // A Puppet failure entry older than the rollout's start is a past rollout's:
    // this one runs the host again (its steps too), as docs/composable.md says.
    let started_at = given.rollout.as_ref().map_or(0, |c| c.current_revision);
    let fresh;
    let snap = if given.failure_revisions.values().any(|rev| *rev < started_at) {
        let mut s = given.clone();
        let old: Vec<HostName> = s
            .failure_revisions
            .iter()
            .filter(|(_, rev)| **rev < started_at)
            .map(|(h, _)| h.clone())
            .collect();
        for h in old {
            s.failures.remove(&h);
            s.failure_revisions.remove(&h);
        }
        fresh = s;
        &fresh
    } else {
        given
    };
    let all = classify(snap);
    let mut out = Composed {
        plan: Plan::default(),
        stages: Vec::new(),
        finalize: FinalizeView {
            state: "waiting",
            host: None,
            services: Vec::new(),
            reason: None,
        },
        grants: Vec::new(),
        reset_hosts: Vec::new(),
        reset_roles: Vec::new(),
        finalize_grant: None,
        standing: Standing::Moving,
        progress: 0,
        hosts: Vec::new(),
    };
    let Some(rec) = cx.rollout else {
        return out;
    };
    let id = rec.id.to_string();
    let Some(cur) = snap.current.clone() else {
        return out;
    };
    let roles: BTreeSet<Role> = all.iter().map(|h| h.role.clone()).collect();
    let stages = c.stages_for(&roles);
    let started: Vec<String> = if rec.stages.is_empty() {
        c.stage_names()
    } else {
        rec.stages.clone()
    };
    let total = all.len();
    let max_failures = r.max_failures.of(total, false);
    let lv = match levels(&graph(c, snap)) {
        Ok(l) => l,
        Err(e) => {
            for h in &all {
                out.plan.reasons.insert(
                    h.host.clone(),
                    reason(
                        ReasonCode::Blocked,
                        format!("blocked: {e} (fix the task files' `after`)"),
                    ),
                );
            }
            out.stages = stages
                .iter()
                .map(|(s, roles)| StageView {
                    name: s.clone(),
                    roles: roles.clone(),
                    state: "waiting",
                    phase: None,
                    taking_part: None,
                    finished: None,
                    phases: Vec::new(),
                    hosts: 0,
                    left_behind: BTreeMap::new(),
                })
                .collect();
            return out;
        }
    };
    let mut failed_all: BTreeMap<String, String> = BTreeMap::new();
    let mut active: Option<usize> = None;
    let mut earlier_not_done: Option<String> = None;
    let mut not_started: Vec<String> = Vec::new();
    for (si, (stage, stage_roles)) in stages.iter().enumerate() {
        let members: Vec<&HostStatus> = all.iter().filter(|h| stage_roles.contains(&h.role)).collect();
        let mut view = StageView {
            name: stage.clone(),
            roles: stage_roles.clone(),
            state: "not_started",
            phase: None,
            taking_part: None,
            finished: None,
            phases: Vec::new(),
            hosts: members.len(),
            left_behind: BTreeMap::new(),
        };
        // Each member's services, or why it cannot take part.
        let mut services: BTreeMap<HostName, Vec<(Service, ServiceSteps)>> = BTreeMap::new();
        let mut blocked: BTreeMap<HostName, String> = BTreeMap::new();
        for h in &members {
            match host_services(c, snap, &h.host, &h.role) {
                Ok(s) => {
                    services.insert(h.host.clone(), s);
                }
                Err(e) => {
                    blocked.insert(h.host.clone(), e);
                }
            }
        }
        let seq = sequence(&services, &lv);
        view.phases = seq.iter().map(Phase::describe).collect();
        if !started.contains(stage) {
            not_started.push(stage.clone());
            for h in &members {
                out.plan.reasons.insert(
                    h.host.clone(),
                    reason(
                        ReasonCode::WaitingFor,
                        format!(
                            "stage {stage} is not started (`jioctl upgrade {} --stage {stage}`)",
                            rec.version
                        ),
                    ),
                );
            }
            out.stages.push(view);
            continue;
        }
        if active.is_some() || earlier_not_done.is_some() {
            view.state = "waiting";
            let before = earlier_not_done.clone().unwrap_or_default();
            for h in &members {
                out.plan.reasons.insert(
                    h.host.clone(),
                    reason(
                        ReasonCode::WaitingFor,
                        format!("waiting for stage {before} to be done"),
                    ),
                );
            }
            out.stages.push(view);
            continue;
        }
        // A member that cannot take part (no catalog, a task file missing or
        // invalid) holds the whole stage until it is fixed or held.
        blocked.retain(|h, _| {
            all.iter()
                .find(|s| &s.host == h)
                .is_none_or(|s| snap.hold_of(&s.host, &s.role).is_none())
        });
        if !blocked.is_empty() {
            view.state = "blocked";
            active = Some(si);
            earlier_not_done = Some(stage.clone());
            let names = blocked
                .keys()
                .map(HostName::as_str)
                .collect::<Vec<_>>()
                .join(", ");
            for h in &members {
                let text = match blocked.get(&h.host) {
                    Some(why) => format!("blocked: {why}"),
                    None => format!(
                        "stage {stage} waits for blocked host(s) {names} (fix their task files, or hold them)"
                    ),
                };
                let code = if blocked.contains_key(&h.host) {
                    ReasonCode::Blocked
                } else {
                    ReasonCode::WaitingFor
                };
                out.plan.reasons.insert(h.host.clone(), reason(code, text));
            }
            out.stages.push(view);
            continue;
        }
        // The stage's grant: its roles' grants are written together, but a chunked
        // write may have landed for some roles only, and one may have been
        // overwritten. The phases before the earliest grant that names a phase of
        // this stage are past; one that names none (or cannot be read) counts for
        // nothing, and every role gets the current phase's grant written again.
        let role_grants: Vec<Option<Grant>> = stage_roles
            .iter()
            .map(|r| {
                snap.grants
                    .get(r)
                    .filter(|g| g.rollout == id && &g.stage == stage)
                    .cloned()
            })
            .collect();
        let keys: BTreeSet<&PhaseKey> = seq.iter().map(|p| &p.key).collect();
        let granted: Option<PhaseKey> = role_grants
            .iter()
            .flatten()
            .filter_map(Grant::key)
            .filter(|k| keys.contains(k))
            .min();
        // Why hosts were left behind when the stage's phases moved on.
        let recorded: BTreeMap<HostName, String> = role_grants
            .iter()
            .flatten()
            .filter(|g| g.key().is_some_and(|k| keys.contains(&k)))
            .flat_map(|g| g.left_behind.clone())
            .collect();
        // Walk the phases: the first one not finished (at or after the grant) is
        // the current one; hosts that did not finish an earlier one stay behind.
        let mut left: BTreeMap<HostName, String> = BTreeMap::new();
        for h in &members {
            if !services.contains_key(&h.host) {
                // Held and unable to take part: it stays behind.
                left.insert(
                    h.host.clone(),
                    "held, and it cannot take part (see its task files)".into(),
                );
            }
        }
        let mut current: Option<(usize, Vec<HostName>)> = None;
        for (pi, phase) in seq.iter().enumerate() {
            let takes_part = |h: &HostName| -> bool {
                if left.contains_key(h) {
                    return false;
                }
                if phase.is_puppet() {
                    return true;
                }
                let when = phase.when().unwrap_or(When::Pre);
                services.get(h).is_some_and(|ss| {
                    ss.iter()
                        .any(|(s, st)| phase.services.contains(s) && st.has(when, phase.key.step))
                })
            };
            let part: Vec<HostName> = members
                .iter()
                .map(|h| h.host.clone())
                .filter(|h| takes_part(h))
                .collect();
            let name = phase.name();
            let mut open = Vec::new();
            for h in &part {
                let progress = phase_progress(snap, &cur, h, phase, &services);
                match progress {
                    Progress::Done => out.progress += 1,
                    Progress::Failed(..) => {
                        out.progress += 1;
                        open.push(h.clone());
                    }
                    Progress::Open => open.push(h.clone()),
                }
            }
            let past = granted.as_ref().is_some_and(|g| phase.key < *g);
            if past {
                for h in open {
                    let why = match phase_progress(snap, &cur, &h, phase, &services) {
                        Progress::Failed(why, _) => {
                            let text = failed_text(snap, &h, &name, &why);
                            failed_all.insert(h.to_string(), text.clone());
                            text
                        }
                        // Left behind when the phase moved on (held, as the driver
                        // recorded it then): it stays behind at its version, as a
                        // held host does, also once released.
                        _ if recorded.get(&h).is_some_and(|r| r.starts_with("held")) => {
                            recorded.get(&h).cloned().unwrap_or_default()
                        }
                        // It has tasks in a phase the stage has passed: they never
                        // ran (its task files changed during the rollout). A failure,
                        // so the rollout cannot end done without them.
                        _ => {
                            let text = format!(
                                "missed phase {}: its tasks there never ran (they appeared after the stage had passed it: were its task files changed during the rollout?)",
                                phase.describe()
                            );
                            failed_all.insert(h.to_string(), text.clone());
                            text
                        }
                    };
                    left.insert(h, why);
                }
                continue;
            }
            // Finished: everyone taking part is done, failed, or held and idle.
            let settled = open.iter().all(|h| {
                // Never while its agent runs something (a retry of the step).
                !running(snap, h)
                    && match phase_progress(snap, &cur, h, phase, &services) {
                        Progress::Failed(_, rev) => !retrying(snap, h, rev),
                        _ => snap.hold_of(h, &snap.role_of(h)).is_some(),
                    }
            });
            if open.is_empty() || (settled && granted.as_ref() == Some(&phase.key)) {
                for h in open {
                    let why = match phase_progress(snap, &cur, &h, phase, &services) {
                        Progress::Failed(why, _) => {
                            let text = failed_text(snap, &h, &name, &why);
                            failed_all.insert(h.to_string(), text.clone());
                            text
                        }
                        _ => format!("held while phase {} went on", phase.describe()),
                    };
                    left.insert(h, why);
                }
                continue;
            }
            current = Some((pi, part));
            break;
        }
        view.left_behind = left.clone();
        let Some((pi, part)) = current else {
            view.state = "done";
            for h in &members {
                if let Some(why) = left.get(&h.host) {
                    let code = if why.starts_with("blocked") {
                        ReasonCode::Blocked
                    } else if why.starts_with("held") {
                        ReasonCode::Held
                    } else {
                        ReasonCode::Failed
                    };
                    out.plan
                        .reasons
                        .insert(h.host.clone(), reason(code, format!("left behind: {why}")));
                    if code == ReasonCode::Held {
                        out.plan.held.push(h.host.clone());
                    }
                }
            }
            out.stages.push(view);
            continue;
        };
        let phase = &seq[pi];
        view.state = "running";
        view.phase = Some(phase.describe());
        view.taking_part = Some(part.len());
        active = Some(si);
        earlier_not_done = Some(stage.clone());
        if failed_all.len() as u64 > max_failures {
            // Stopped on failures: no phase moves on, nothing is admitted.
            out.plan.stopped_on_failures = true;
            for h in &members {
                if let Some(why) = left.get(&h.host) {
                    out.plan
                        .reasons
                        .insert(h.host.clone(), reason(ReasonCode::Failed, why.clone()));
                } else {
                    out.plan.reasons.insert(
                        h.host.clone(),
                        reason(
                            ReasonCode::StoppedOnFailures,
                            format!(
                                "stopped: {} failed host(s), more than max_failures {max_failures}",
                                failed_all.len()
                            ),
                        ),
                    );
                }
            }
            out.stages.push(view);
            out.standing = Standing::Stopped { failed: failed_all };
            return out;
        }
        let mut want = Grant::of(&id, stage, phase);
        want.left_behind = left
            .iter()
            .filter(|(_, why)| !why.starts_with("missed"))
            .map(|(h, why)| (h.clone(), why.clone()))
            .collect();
        if role_grants
            .iter()
            .any(|g| g.as_ref().is_none_or(|g| !g.same_phase(&want)))
        {
            // The phase moves on: the grant, and every enable key of the stage
            // reset, in one transaction; the next pass admits.
            for role in stage_roles {
                out.grants.push((role.clone(), want.clone()));
                if snap.role_keys.contains_key(role) {
                    out.reset_roles.push(role.clone());
                }
            }
            for h in &members {
                if snap.host_keys.contains_key(&h.host) {
                    out.reset_hosts.push(h.host.clone());
                }
                out.plan.reasons.insert(
                    h.host.clone(),
                    reason(
                        ReasonCode::WaitingFor,
                        format!("stage {stage} moves on to phase {}", phase.describe()),
                    ),
                );
            }
            view.finished = Some(0);
            out.stages.push(view);
            continue;
        }
        // Plan the phase: its hosts (done ones as upgraded), and any other host
        // whose agent runs something (it holds its slot).
        let ps = phase_snapshot(snap, &cur, phase, &part, &services);
        let statuses = classify(&ps);
        let hosts: Vec<HostStatus> = statuses
            .into_iter()
            .filter(|h| part.contains(&h.host) || running(snap, &h.host))
            .map(|mut h| {
                // A host outside the phase whose agent runs something holds its
                // slot, whatever its state says (a failed one retrying).
                if !part.contains(&h.host) && h.state != HostState::Upgrading {
                    h.state = HostState::Upgrading;
                    h.reason = Some("its agent is running something".into());
                }
                h
            })
            .collect();
        view.finished = Some(
            hosts
                .iter()
                .filter(|h| part.contains(&h.host) && h.state == HostState::Upgraded)
                .count(),
        );
        let pcx = Context {
            host_keys_only: true,
            busy_outside: &[],
            ..*cx
        };
        let mut p = plan::plan(&ps, &hosts, r, &pcx);
        // Failures count across the rollout, not just in this phase.
        let failed_here: Vec<&HostStatus> = hosts.iter().filter(|h| h.state == HostState::Failed).collect();
        for h in &failed_here {
            if let Progress::Failed(why, _) = phase_progress(snap, &cur, &h.host, phase, &services) {
                failed_all.insert(
                    h.host.to_string(),
                    failed_text(snap, &h.host, &phase.name(), &why),
                );
            } else {
                failed_all.insert(h.host.to_string(), format!("failed at {}", phase.name()));
            }
        }
        if failed_all.len() as u64 > max_failures && !p.stopped_on_failures {
            p.stopped_on_failures = true;
            for h in std::mem::take(&mut p.enable_hosts) {
                p.reasons.insert(
                    h,
                    reason(
                        ReasonCode::StoppedOnFailures,
                        format!(
                            "stopped: {} failed host(s), more than max_failures {max_failures}",
                            failed_all.len()
                        ),
                    ),
                );
            }
        }
        for h in &members {
            if let Some(why) = left.get(&h.host) {
                let code = if why.starts_with("blocked") {
                    ReasonCode::Blocked
                } else {
                    ReasonCode::Failed
                };
                p.reasons
                    .insert(h.host.clone(), reason(code, format!("left behind: {why}")));
            } else if !part.contains(&h.host) {
                p.reasons.insert(
                    h.host.clone(),
                    reason(
                        ReasonCode::WaitingFor,
                        format!(
                            "no task in phase {}: waits for the stage's other hosts ({} of {} finished)",
                            phase.describe(),
                            view.finished.unwrap_or(0),
                            part.len()
                        ),
                    ),
                );
            } else if !p.reasons.contains_key(&h.host)
                && hosts
                    .iter()
                    .any(|s| s.host == h.host && s.state == HostState::Upgraded)
            {
                p.reasons.insert(
                    h.host.clone(),
                    reason(
                        ReasonCode::WaitingFor,
                        format!(
                            "finished phase {}: waits for the stage's other hosts ({} of {} finished)",
                            phase.describe(),
                            view.finished.unwrap_or(0),
                            part.len()
                        ),
                    ),
                );
            }
        }
        // Keep the reasons of other stages already given.
        for (h, why) in std::mem::take(&mut out.plan.reasons) {
            p.reasons.entry(h).or_insert(why);
        }
        out.plan = p;
        out.hosts = hosts;
        out.stages.push(view);
    }
    if active.is_some() {
        if out.plan.stopped_on_failures {
            out.standing = Standing::Stopped { failed: failed_all };
        }
        return out;
    }
    if !not_started.is_empty() {
        if failed_all.len() as u64 > max_failures {
            out.standing = Standing::Stopped { failed: failed_all };
        } else {
            out.standing = Standing::StagesDone { not_started };
        }
        return out;
    }
    // Every stage is done: the finalize step.
    finalize(snap, c, &all, &id, &mut out, failed_all, max_failures);
    out
}

/// Whether the host's agent runs something (its record or its run marker).
fn running(snap: &Snapshot, h: &HostName) -> bool {
    snap.runs.contains_key(h)
        || matches!(snap.agents.get(h), Some(Some(a)) if a.state.running())
        || matches!(snap.agents.get(h), Some(None))
}

/// An enable key of a host that failed at revision `rev` was written after it,
/// and lets it run: it retries (as its agent decides).
fn retrying(snap: &Snapshot, h: &HostName, rev: crate::store::Revision) -> bool {
    use crate::keys::EnableLevel;
    let role = snap.role_of(h);
    snap.gate(h, &role).enabled
        && [
            EnableLevel::Host(h.clone()),
            EnableLevel::Role(role),
            EnableLevel::Global,
        ]
        .iter()
        .any(|l| snap.enable_revisions.get(l).is_some_and(|r| *r > rev))
}

/// A host's progress in `phase`.
fn phase_progress(
    snap: &Snapshot,
    cur: &crate::names::Version,
    h: &HostName,
    phase: &Phase,
    services: &BTreeMap<HostName, Vec<(Service, ServiceSteps)>>,
) -> Progress {
    if phase.is_puppet() {
        if let Some((step, link)) = snap.failures.get(h) {
            let rev = snap.failure_revisions.get(h).copied().unwrap_or(0);
            return Progress::Failed(format!("{} failed: {link}", step.as_str()), rev);
        }
        return if snap.running.get(h).is_some_and(|v| v.contains(cur)) {
            Progress::Done
        } else {
            Progress::Open
        };
    }
    let when = phase.when().unwrap_or(When::Pre);
    let mine: Vec<&Service> = services
        .get(h)
        .map(|ss| {
            ss.iter()
                .filter(|(s, st)| phase.services.contains(s) && st.has(when, phase.key.step))
                .map(|(s, _)| s)
                .collect()
        })
        .unwrap_or_default();
    task_progress(snap, h, &phase.name(), &mine)
}

/// A failed host's reason: its result's service, task, exit code and log.
fn failed_text(snap: &Snapshot, h: &HostName, phase: &str, why: &str) -> String {
    let res = snap.results.get(h).filter(|r| !r.ok);
    match res {
        Some(r) if r.step.as_deref() == Some(phase) => {
            let mut t = format!("failed at {phase}");
            if let Some(s) = &r.service {
                t.push_str(&format!(", service {s}"));
            }
            if let Some(task) = &r.task {
                t.push_str(&format!(", task {task:?}"));
            }
            if let Some(c) = r.exit_code {
                t.push_str(&format!(", exit {c}"));
            }
            if let Some(m) = &r.message {
                t.push_str(&format!(": {}", m.lines().next().unwrap_or_default()));
            }
            match (&r.log, &r.run_dir) {
                (Some(l), _) => t.push_str(&format!(" (log: {l})")),
                (None, Some(d)) => t.push_str(&format!(" (logs on the host in {d})")),
                _ => {}
            }
            t
        }
        _ => format!("failed at {phase}: {why}"),
    }
}

/// The snapshot as the phase's planning sees it: a host that finished the phase is
/// at the version, one that did not is not, a failed one has its failure.
fn phase_snapshot(
    snap: &Snapshot,
    cur: &crate::names::Version,
    phase: &Phase,
    part: &[HostName],
    services: &BTreeMap<HostName, Vec<(Service, ServiceSteps)>>,
) -> Snapshot {
    let mut ps = snap.clone();
    if phase.is_puppet() {
        return ps;
    }
    ps.failures.clear();
    ps.failure_revisions.clear();
    for h in part {
        match phase_progress(snap, cur, h, phase, services) {
            Progress::Done => {
                ps.running.entry(h.clone()).or_default().insert(cur.clone());
            }
            Progress::Failed(why, rev) => {
                if let Some(v) = ps.running.get_mut(h) {
                    v.remove(cur);
                }
                ps.failures.insert(h.clone(), (Step::Configured, why));
                ps.failure_revisions.insert(h.clone(), rev);
            }
            Progress::Open => {
                if let Some(v) = ps.running.get_mut(h) {
                    v.remove(cur);
                }
            }
        }
    }
    ps
}

/// The finalize step, once every stage is done.
#[allow(clippy::too_many_arguments)]
#[expect(
    clippy::too_many_lines,
    reason = "longer than a screen: to be cut into named steps (issue 33)"
)]
fn finalize(
    snap: &Snapshot,
    c: &Compose,
    all: &[HostStatus],
    id: &str,
    out: &mut Composed,
    mut failed: BTreeMap<String, String>,
    max_failures: u64,
) {
    if failed.len() as u64 > max_failures {
        out.finalize.state = "waiting";
        out.finalize.reason = Some("not run: more hosts failed than max_failures".into());
        out.standing = Standing::Stopped { failed };
        return;
    }
    let services = c.all_services();
    // Services whose files declare finalize tasks, on any host.
    let mut declared: BTreeMap<Service, Vec<HostName>> = BTreeMap::new();
    for (h, cat) in &snap.catalogs {
        if let Ok(cat) = cat {
            for (s, st) in &cat.services {
                if st.finalize && services.contains(s) {
                    declared.entry(s.clone()).or_default().push(h.clone());
                }
            }
        }
    }
    if declared.is_empty() {
        out.finalize.state = "none";
        out.standing = Standing::Finished { failed };
        return;
    }
    // The deployment-wide step comes after every host reached the version (it
    // unpins what a host still at the old one needs): with a host failed or left
    // behind, it does not run, and the rollout ends failed, saying so.
    let behind: Vec<&HostName> = all
        .iter()
        .filter(|h| {
            failed.contains_key(h.host.as_str())
                || h.state != HostState::Upgraded
                || !snap
                    .running
                    .get(&h.host)
                    .is_some_and(|v| snap.current.as_ref().is_some_and(|c| v.contains(c)))
        })
        .map(|h| &h.host)
        .collect();
    if !behind.is_empty() && snap.finalize_grant.as_ref().is_none_or(|g| g.rollout != id) {
        let names: Vec<HostName> = behind.into_iter().cloned().collect();
        let why = format!(
            "finalize not run: not every host reached the version ({} did not: failed, held or left behind)",
            crate::values::host_list(&names)
        );
        out.finalize.state = "not_run";
        out.finalize.reason = Some(why.clone());
        failed.insert("finalize".to_string(), why);
        out.standing = Standing::Finished { failed };
        return;
    }
    let role = c.finalize_role();
    let granted = snap
        .finalize_grant
        .as_ref()
        .filter(|g| g.rollout == id)
        .map(|g| g.host.clone());
    let healthy = |h: &HostStatus| {
        Some(&h.role) == role.as_ref()
            && h.state == HostState::Upgraded
            && snap.agents.contains_key(&h.host)
            && snap.hold_of(&h.host, &h.role).is_none()
            && !failed.contains_key(h.host.as_str())
            && snap.catalogs.get(&h.host).is_some_and(|c| c.is_ok())
    };
    let held = |h: &HostName| snap.hold_of(h, &snap.role_of(h)).is_some();
    // The granted host keeps the step once it started there (a finalize task is
    // never run on two hosts), and while it is only gone (its agent will be back);
    // held before it started, the next healthy host takes it.
    let started = |h: &HostName| {
        running(snap, h)
            || snap
                .step_statuses
                .keys()
                .any(|(p, _, sh)| p == "finalize" && sh == h)
    };
    let kept = granted
        .clone()
        .filter(|h| started(h) || (!held(h) && !failed.contains_key(h.as_str())));
    let host = kept.or_else(|| all.iter().find(|h| healthy(h)).map(|h| h.host.clone()));
    let Some(host) = host else {
        let role_name = role.as_ref().map_or("-", |r| r.as_str());
        // Held or gone hosts at the version may still come back; if none is left
        // that could, the finalize step cannot run: the rollout fails, saying so.
        let could = all.iter().any(|h| {
            Some(&h.role) == role.as_ref()
                && h.state == HostState::Upgraded
                && !failed.contains_key(h.host.as_str())
        });
        if could {
            out.finalize.state = "waiting";
            out.finalize.reason = Some(format!(
                "finalize waits for a healthy host of role {role_name} (at the version, alive, not held)"
            ));
            return;
        }
        let why = format!(
            "finalize cannot run: no host of role {role_name} is at the version without having failed (the finalize role's hosts failed or were left behind)"
        );
        out.finalize.state = "failed";
        out.finalize.reason = Some(why.clone());
        failed.insert("finalize".to_string(), why);
        out.standing = Standing::Finished { failed };
        return;
    };
    out.finalize.host = Some(host.clone());
    let cat = snap.catalogs.get(&host).and_then(|c| c.as_ref().ok());
    let mine: Vec<Service> = cat
        .map(|c| {
            c.services
                .iter()
                .filter(|(s, st)| st.finalize && services.contains(s))
                .map(|(s, _)| s.clone())
                .collect()
        })
        .unwrap_or_default();
    out.finalize.services = mine.clone();
    let missing: Vec<String> = declared
        .iter()
        .filter(|(s, _)| !mine.contains(s))
        .map(|(s, hs)| {
            format!(
                "service {s} declares finalize tasks on {}, but the finalize host {host} has none for it",
                crate::values::host_list(hs)
            )
        })
        .collect();
    if !missing.is_empty() {
        let why = format!(
            "finalize cannot run every service's finalize tasks: {} (install its task file on the hosts of role {})",
            missing.join("; "),
            role.as_ref().map_or("-", |r| r.as_str())
        );
        out.finalize.state = "failed";
        out.finalize.reason = Some(why.clone());
        failed.insert(host.to_string(), why);
        out.standing = Standing::Finished { failed };
        return;
    }
    let refs: Vec<&Service> = mine.iter().collect();
    match task_progress(snap, &host, "finalize", &refs) {
        Progress::Done => {
            out.finalize.state = "done";
            out.standing = Standing::Finished { failed };
        }
        Progress::Failed(why, _) => {
            out.finalize.state = "failed";
            let text = failed_text(snap, &host, "finalize", &why);
            out.finalize.reason = Some(text.clone());
            failed.insert(host.to_string(), text);
            out.standing = Standing::Finished { failed };
        }
        Progress::Open => {
            out.finalize.state = "running";
            let what = mine.iter().map(Service::as_str).collect::<Vec<_>>().join(", ");
            let is_held = held(&host);
            let enabled = snap.gate(&host, &snap.role_of(&host)).enabled;
            // Granted (again) to this host, and its key set, unless it is held: a
            // hold's keys are never set back on.
            if granted.as_ref() != Some(&host) || (!enabled && !is_held) {
                out.finalize_grant = Some(FinalizeGrant {
                    rollout: id.to_string(),
                    host: host.clone(),
                });
            }
            let why = if is_held {
                reason(
                    ReasonCode::Held,
                    format!(
                        "finalize ({what}) is granted to it, but it is held: the step waits for its release"
                    ),
                )
            } else if !snap.agents.contains_key(&host) {
                let mut r = lost_reason(&host);
                r.text = format!("finalize ({what}) is granted to it, but {}", r.text);
                r
            } else if running(snap, &host) {
                reason(
                    ReasonCode::Upgrading,
                    format!("running the finalize tasks of {what}"),
                )
            } else {
                reason(
                    ReasonCode::Upgrading,
                    format!("finalize ({what}) is granted to it: its agent is about to start"),
                )
            };
            out.plan.reasons.insert(host.clone(), why);
        }
    }
}

/// A host without a live agent, for a reason.
fn lost_reason(h: &HostName) -> Reason {
    reason(
        ReasonCode::Lost,
        format!("its agent is not alive (no /agents/{h} lease): it waits for it to come back"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{Key, Schema};
    use crate::rollout::RolloutRecord;
    use crate::rules::Rules;
    use crate::store::KeyValue;

    fn s(n: &str) -> Service {
        Service::new(n).unwrap()
    }

    fn kv(key: &str, value: &str, rev: i64) -> KeyValue {
        KeyValue {
            key: Key::new(key).unwrap(),
            value: value.into(),
            create_revision: rev,
            mod_revision: rev,
            version: 1,
            lease: None,
            not_text: false,
        }
    }

    const RULES: &str = r#"{
        "roles_data": {"controller": ["keystone", "nova_api"], "compute": ["nova_compute"]},
        "stages": {"controlplane": ["controller"], "compute": ["compute"]},
        "rolling_rules": {"roles": {"compute": 1}}
    }"#;

    /// Two controllers (keystone, nova_api after keystone) and two computes.
    struct Scene {
        kvs: Vec<KeyValue>,
        rec: RolloutRecord,
        rev: i64,
    }

    impl Scene {
        fn new(stages: &[&str]) -> Scene {
            let mut rec = RolloutRecord::start(
                crate::names::Version::new("v2").unwrap(),
                None,
                serde_json::from_str(RULES).unwrap(),
                "t",
                100,
            );
            rec.stages = stages.iter().map(|s| s.to_string()).collect();
            let mut kvs = vec![
                kv("/current_version", "v2", 1),
                kv("/config_state/enable_puppet/global", "false", 1),
                kv("/rollouts/current", rec.id.as_str(), 1),
                kv(
                    &format!("/rollouts/{}", rec.id),
                    &serde_json::to_string(&rec).unwrap(),
                    1,
                ),
            ];
            let ctl = r#"{"dir":"/s","services":{"keystone":{"pre":[1],"post":[3]},"nova_api":{"after":["keystone"],"pre":[1]}}}"#;
            let cp = r#"{"dir":"/s","services":{"nova_compute":{"pre":[1,2],"post":[3],"finalize":true}}}"#;
            for (h, role, cat) in [
                ("ctl1", "controller", ctl),
                ("ctl2", "controller", ctl),
                ("cp1", "compute", cp),
                ("cp2", "compute", cp),
            ] {
                kvs.push(kv(
                    &format!("/hosts/{h}"),
                    &format!(r#"{{"role":"{role}","agent_version":"1","first_seen":1}}"#),
                    1,
                ));
                kvs.push(kv(&format!("/hosts/{h}/services"), cat, 1));
                kvs.push(kv(
                    &format!("/agents/{h}"),
                    r#"{"state":"idle","version":"v1","since":1,"pid":1}"#,
                    1,
                ));
                kvs.push(kv(&format!("/running/versions/v1/{h}"), "1", 1));
            }
            Scene { kvs, rec, rev: 10 }
        }

        fn put(&mut self, key: &str, value: &str) {
            self.rev += 1;
            self.kvs.retain(|k| k.key.as_str() != key);
            self.kvs.push(kv(key, value, self.rev));
        }

        fn del(&mut self, key: &str) {
            self.kvs.retain(|k| k.key.as_str() != key);
        }

        fn plan(&self) -> Composed {
            self.plan_with(0)
        }

        /// `plan`, with `max_failures` set to `max`.
        fn plan_with(&self, max: u64) -> Composed {
            let snap = Snapshot::from_kvs(&Schema::default(), &self.kvs);
            let text = RULES.replace("\"stages\"", &format!("\"max_failures\": {max}, \"stages\""));
            let rules = Rules::parse(&text).unwrap();
            let roles = classify(&snap).into_iter().map(|h| h.role).collect();
            let r = rules.resolve(&roles).unwrap();
            let mut rec = self.rec.clone();
            if let Some(cur) = snap.rollout.as_ref().and_then(|c| c.ok()) {
                rec = cur.clone();
            }
            let cx = Context {
                now: 200,
                rollout: Some(&rec),
                host_keys_only: true,
                busy_outside: &[],
            };
            plan(&snap, rules.compose.as_ref().unwrap(), &r, &cx)
        }

        /// Writes what a pass decided, as the driver would.
        fn apply(&mut self, c: &Composed) {
            for h in &c.reset_hosts {
                self.del(&format!("/config_state/enable_puppet/host/{h}"));
            }
            for (role, g) in &c.grants {
                self.put(
                    &format!("/steps/roles/{role}"),
                    &serde_json::to_string(g).unwrap(),
                );
            }
            for h in &c.plan.enable_hosts {
                self.put(&format!("/config_state/enable_puppet/host/{h}"), "true");
            }
            if let Some(f) = &c.finalize_grant {
                self.put("/steps/finalize", &serde_json::to_string(f).unwrap());
                self.put(&format!("/config_state/enable_puppet/host/{}", f.host), "true");
            }
        }

        /// Plans and applies until a pass writes nothing; its plan.
        fn settle(&mut self) -> Composed {
            for _ in 0..20 {
                let c = self.plan();
                if !c.writes() {
                    return c;
                }
                self.apply(&c);
            }
            panic!("the planner kept writing");
        }

        fn step_done(&mut self, phase: &str, service: &str, host: &str, ok: bool) {
            let o = if ok { "success" } else { "failure" };
            let id = self.rec.id.to_string();
            self.put(&format!("/status/steps/{id}/{phase}/{service}/{o}/{host}"), "");
        }
    }

    fn phase_of(c: &Composed, stage: &str) -> Option<String> {
        c.stages
            .iter()
            .find(|s| s.name == stage)
            .and_then(|s| s.phase.clone())
    }

    fn enabled(c: &Composed) -> Vec<&str> {
        c.plan.enable_hosts.iter().map(|h| h.as_str()).collect()
    }

    #[test]
    fn a_stage_moves_phase_by_phase_and_only_when_every_host_finished() {
        let mut sc = Scene::new(&["controlplane"]);
        // First pass: the stage's first phase is granted, nothing admitted yet.
        let c = sc.plan();
        assert_eq!(c.grants.len(), 1, "{:?}", c.grants);
        assert_eq!(c.grants[0].1.phase, "pre-1");
        assert_eq!(c.grants[0].1.services, vec![s("keystone")]);
        assert!(c.plan.enable_hosts.is_empty());
        assert_eq!(
            c.plan.reasons[&HostName::new("cp1").unwrap()].code,
            ReasonCode::WaitingFor
        );
        assert!(
            c.plan.reasons[&HostName::new("cp1").unwrap()]
                .text
                .contains("stage compute is not started")
        );
        sc.apply(&c);
        // Then both controllers are admitted (no limit).
        let c = sc.plan();
        assert!(c.grants.is_empty());
        assert_eq!(enabled(&c), vec!["ctl1", "ctl2"]);
        sc.apply(&c);
        // One finished: the phase does not move.
        sc.step_done("pre-1", "keystone", "ctl1", true);
        let c = sc.plan();
        assert!(c.grants.is_empty() && c.plan.enable_hosts.is_empty());
        assert_eq!(phase_of(&c, "controlplane").as_deref(), Some("pre-1 (keystone)"));
        // Both: nova_api's step 1 comes next (it runs after keystone), the keys reset.
        sc.step_done("pre-1", "keystone", "ctl2", true);
        let c = sc.plan();
        assert_eq!(c.grants[0].1.services, vec![s("nova_api")]);
        assert_eq!(c.reset_hosts.len(), 2);
        sc.apply(&c);
        let c = sc.plan();
        assert_eq!(enabled(&c), vec!["ctl1", "ctl2"]);
        sc.apply(&c);
        sc.step_done("pre-1", "nova_api", "ctl1", true);
        sc.step_done("pre-1", "nova_api", "ctl2", true);
        // Puppet: done when the hosts are at the version.
        let c = sc.plan();
        assert_eq!(c.grants[0].1.phase, "puppet");
        sc.apply(&c);
        let c = sc.plan();
        assert_eq!(enabled(&c), vec!["ctl1", "ctl2"]);
        sc.apply(&c);
        sc.put("/running/versions/v2/ctl1", "1");
        sc.del("/running/versions/v1/ctl1");
        let c = sc.plan();
        assert!(c.grants.is_empty(), "ctl2 has not finished puppet");
        sc.put("/running/versions/v2/ctl2", "1");
        sc.del("/running/versions/v1/ctl2");
        let c = sc.plan();
        assert_eq!(c.grants[0].1.phase, "post-3");
        sc.apply(&c);
        sc.apply(&sc.plan());
        sc.step_done("post-3", "keystone", "ctl1", true);
        sc.step_done("post-3", "keystone", "ctl2", true);
        // The stage is done; compute is not started.
        let c = sc.plan();
        assert_eq!(
            c.standing,
            Standing::StagesDone {
                not_started: vec!["compute".into()]
            }
        );
        assert!(!c.writes());
    }

    #[test]
    fn the_limit_holds_within_a_phase_and_a_failure_stops_the_rollout() {
        let mut sc = Scene::new(&[]);
        // Skip the control plane: mark its steps done and its hosts upgraded.
        for h in ["ctl1", "ctl2"] {
            sc.step_done("pre-1", "keystone", h, true);
            sc.step_done("pre-1", "nova_api", h, true);
            sc.step_done("post-3", "keystone", h, true);
            sc.put(&format!("/running/versions/v2/{h}"), "1");
            sc.del(&format!("/running/versions/v1/{h}"));
        }
        let c = sc.plan();
        assert_eq!(phase_of(&c, "controlplane"), None);
        assert_eq!(
            c.grants.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>(),
            vec!["compute"]
        );
        sc.apply(&c);
        // compute: 1 at a time.
        let c = sc.plan();
        assert_eq!(enabled(&c), vec!["cp1"]);
        sc.apply(&c);
        assert!(sc.plan().plan.enable_hosts.is_empty());
        sc.step_done("pre-1", "nova_compute", "cp1", true);
        let c = sc.plan();
        assert_eq!(enabled(&c), vec!["cp2"]);
        sc.apply(&c);
        sc.step_done("pre-1", "nova_compute", "cp2", false);
        let c = sc.plan();
        assert!(matches!(c.standing, Standing::Stopped { .. }), "{:?}", c.standing);
        let Standing::Stopped { failed } = c.standing else {
            unreachable!()
        };
        assert!(failed["cp2"].contains("failed at pre-1"), "{failed:?}");
    }

    #[test]
    fn a_host_without_its_task_file_blocks_its_stage() {
        let mut sc = Scene::new(&["controlplane"]);
        sc.put(
            "/hosts/ctl2/services",
            r#"{"dir":"/s","services":{"keystone":{"pre":[1]}}}"#,
        );
        let c = sc.plan();
        assert!(c.grants.is_empty() && !c.writes());
        let why = &c.plan.reasons[&HostName::new("ctl2").unwrap()];
        assert_eq!(why.code, ReasonCode::Blocked);
        assert!(
            why.text.contains("nova_api") && why.text.contains("/s/nova_api.toml"),
            "{}",
            why.text
        );
        assert!(
            c.plan.reasons[&HostName::new("ctl1").unwrap()]
                .text
                .contains("waits for blocked host(s) ctl2")
        );
    }

    /// Walks the compute stage to its pre-1 phase with cp1 and cp2 admitted.
    fn computes_in_pre_1() -> Scene {
        let mut sc = Scene::new(&[]);
        for h in ["ctl1", "ctl2"] {
            for (p, sv) in [
                ("pre-1", "keystone"),
                ("pre-1", "nova_api"),
                ("post-3", "keystone"),
            ] {
                sc.step_done(p, sv, h, true);
            }
            sc.put(&format!("/running/versions/v2/{h}"), "1");
            sc.del(&format!("/running/versions/v1/{h}"));
        }
        sc.settle();
        sc.step_done("pre-1", "nova_compute", "cp1", true);
        sc.settle();
        sc
    }

    #[test]
    fn a_failed_host_whose_agent_runs_again_holds_the_phase_and_its_slot() {
        // max_failures 1 for this test.
        let mut sc = computes_in_pre_1();
        let mut rec = sc.rec.clone();
        rec.rules =
            serde_json::from_str(&RULES.replace("\"stages\"", "\"max_failures\": 1, \"stages\"")).unwrap();
        sc.put(
            &format!("/rollouts/{}", rec.id),
            &serde_json::to_string(&rec).unwrap(),
        );
        sc.rec = rec;
        sc.step_done("pre-1", "nova_compute", "cp2", false);
        // cp2's agent runs its step again (a retry nobody asked the driver for):
        // the phase does not move on while it runs.
        sc.put(
            "/runs/cp2",
            r#"{"state":"upgrading","version":"v2","since":1,"pid":1}"#,
        );
        let c = sc.plan_with(1);
        assert!(c.grants.is_empty(), "moved on while cp2 runs: {:?}", c.grants);
        sc.del("/runs/cp2");
        let c = sc.plan_with(1);
        assert_eq!(
            c.grants.first().map(|(_, g)| g.phase.as_str()),
            Some("pre-2"),
            "{:?}",
            c.stages
        );
        // cp2 is recorded as left behind in the new grant.
        assert!(
            c.grants[0]
                .1
                .left_behind
                .contains_key(&HostName::new("cp2").unwrap())
        );
    }

    #[test]
    fn a_held_host_at_the_version_settles_and_a_release_keeps_it_behind() {
        let mut sc = computes_in_pre_1();
        // cp2 is already at v2 (a retried rollout) and held: pre-1 settles.
        sc.put("/running/versions/v2/cp2", "1");
        sc.del("/running/versions/v1/cp2");
        sc.put("/holds/host/cp2", r#"{"by":"t","reason":"disk","at":1}"#);
        let c = sc.plan();
        assert_eq!(
            c.grants.first().map(|(_, g)| g.phase.as_str()),
            Some("pre-2"),
            "{:?}",
            c.stages
        );
        sc.apply(&c);
        // Released: it stays behind as held, never a failure.
        sc.del("/holds/host/cp2");
        let c = sc.plan();
        let why = &c.plan.reasons[&HostName::new("cp2").unwrap()];
        assert!(why.text.contains("held"), "{why:?}");
        assert!(
            !matches!(c.standing, Standing::Stopped { .. }),
            "{:?}",
            c.standing
        );
    }

    #[test]
    fn a_puppet_failure_of_an_earlier_rollout_does_not_fail_the_host_again() {
        let mut sc = computes_in_pre_1();
        // A failure entry from before this rollout started (revision 0, below the
        // rollout's /rollouts/current revision).
        sc.kvs.push(kv("/status/configured/failure/v2/cp2", "", 0));
        let snap = Snapshot::from_kvs(&Schema::default(), &sc.kvs);
        assert!(snap.failures.contains_key(&HostName::new("cp2").unwrap()));
        sc.step_done("pre-1", "nova_compute", "cp2", true);
        sc.settle();
        for h in ["cp1", "cp2"] {
            sc.step_done("pre-2", "nova_compute", h, true);
        }
        // The puppet phase admits cp2 (limit 1: cp1 first, then cp2).
        let c = sc.settle();
        assert_eq!(
            phase_of(&c, "compute").as_deref(),
            Some("puppet"),
            "{:?}",
            c.stages
        );
        sc.put("/running/versions/v2/cp1", "1");
        sc.del("/running/versions/v1/cp1");
        let c = sc.settle();
        assert!(
            sc.kvs
                .iter()
                .any(|k| k.key.as_str() == "/config_state/enable_puppet/host/cp2" && k.value == "true"),
            "cp2 not admitted: {:?}",
            c.plan.reasons.get(&HostName::new("cp2").unwrap())
        );
    }

    #[test]
    fn finalize_does_not_run_while_a_host_is_behind() {
        let mut sc = Scene::new(&[]);
        let ctl = r#"{"dir":"/s","services":{"keystone":{"pre":[1],"post":[3]},"nova_api":{"after":["keystone"],"pre":[1]},"nova_compute":{"finalize":true}}}"#;
        sc.put("/hosts/ctl1/services", ctl);
        sc.put("/hosts/ctl2/services", ctl);
        // cp2 is held through the rollout: it stays at v1, left behind.
        sc.put("/holds/host/cp2", r#"{"by":"t","reason":"disk","at":1}"#);
        for h in ["ctl1", "ctl2", "cp1"] {
            sc.put(&format!("/running/versions/v2/{h}"), "1");
            sc.del(&format!("/running/versions/v1/{h}"));
        }
        for h in ["ctl1", "ctl2"] {
            for (p, sv) in [
                ("pre-1", "keystone"),
                ("pre-1", "nova_api"),
                ("post-3", "keystone"),
            ] {
                sc.step_done(p, sv, h, true);
            }
        }
        for p in ["pre-1", "pre-2", "post-3"] {
            sc.step_done(p, "nova_compute", "cp1", true);
        }
        let c = sc.settle();
        assert!(c.finalize_grant.is_none(), "{:?}", c.finalize);
        assert_eq!(c.finalize.state, "not_run");
        assert!(
            matches!(&c.standing, Standing::Finished { failed } if failed["finalize"].contains("cp2")),
            "{:?}",
            c.standing
        );
    }

    #[test]
    fn finalize_runs_once_on_the_first_healthy_host_after_everything() {
        let mut sc = Scene::new(&[]);
        for h in ["ctl1", "ctl2", "cp1", "cp2"] {
            sc.put(&format!("/running/versions/v2/{h}"), "1");
            sc.del(&format!("/running/versions/v1/{h}"));
        }
        for h in ["ctl1", "ctl2"] {
            for (p, sv) in [
                ("pre-1", "keystone"),
                ("pre-1", "nova_api"),
                ("post-3", "keystone"),
            ] {
                sc.step_done(p, sv, h, true);
            }
        }
        // nova_compute declares finalize tasks on the computes only: the finalize
        // host (a controller) cannot run them, which fails the rollout, named.
        for h in ["cp1", "cp2"] {
            for p in ["pre-1", "pre-2", "post-3"] {
                sc.step_done(p, "nova_compute", h, true);
            }
        }
        let c = sc.plan();
        assert_eq!(c.finalize.state, "failed", "{:?}", c.finalize);
        assert!(c.finalize.reason.as_ref().unwrap().contains("nova_compute"));
        // With the file on the controllers too, finalize is granted to ctl1 alone.
        let ctl = r#"{"dir":"/s","services":{"keystone":{"pre":[1],"post":[3]},"nova_api":{"after":["keystone"],"pre":[1]},"nova_compute":{"finalize":true}}}"#;
        sc.put("/hosts/ctl1/services", ctl);
        sc.put("/hosts/ctl2/services", ctl);
        let c = sc.plan();
        assert_eq!(c.finalize_grant.as_ref().map(|g| g.host.as_str()), Some("ctl1"));
        sc.apply(&c);
        let c = sc.plan();
        assert!(c.finalize_grant.is_none() && c.standing == Standing::Moving);
        sc.step_done("finalize", "nova_compute", "ctl1", true);
        let c = sc.plan();
        assert_eq!(
            c.standing,
            Standing::Finished {
                failed: BTreeMap::new()
            }
        );
        // A failed finalize fails the rollout.
        sc.step_done("finalize", "nova_compute", "ctl1", false);
        sc.del(&format!(
            "/status/steps/{}/finalize/nova_compute/success/ctl1",
            sc.rec.id
        ));
        let c = sc.plan();
        assert!(
            matches!(&c.standing, Standing::Finished { failed } if failed.contains_key("ctl1")),
            "{:?}",
            c.standing
        );
    }

    #[test]
    fn stages_and_roles_data_keep_the_order_written() {
        let r = Rules::parse(
            r#"{"roles_data": {"zeta": ["a"], "alpha": ["b"]}, "stages": {"zz": ["zeta"], "aa": ["alpha"]}}"#,
        )
        .unwrap();
        let c = r.compose.unwrap();
        assert_eq!(c.stage_names(), vec!["zz", "aa"]);
        assert_eq!(c.finalize_role().unwrap().as_str(), "zeta");
    }

    #[test]
    fn levels_follow_after_and_name_a_cycle() {
        let mut g: BTreeMap<Service, BTreeSet<Service>> = BTreeMap::new();
        g.insert(s("keystone"), BTreeSet::new());
        g.insert(s("nova_api"), [s("keystone")].into());
        g.insert(s("nova_compute"), [s("nova_api")].into());
        g.insert(s("glance"), [s("keystone")].into());
        let l = levels(&g).unwrap();
        assert_eq!(l[&s("keystone")], 0);
        assert_eq!(l[&s("nova_api")], 1);
        assert_eq!(l[&s("glance")], 1);
        assert_eq!(l[&s("nova_compute")], 2);
        g.insert(s("keystone"), [s("nova_compute")].into());
        let e = levels(&g).unwrap_err();
        assert!(e.contains("cycle") && e.contains("keystone"), "{e}");
    }

    #[test]
    fn a_stage_runs_pre_steps_then_puppet_then_post_steps_split_by_level() {
        let steps = |pre: &[u32], post: &[u32]| ServiceSteps {
            after: Vec::new(),
            pre: pre.to_vec(),
            post: post.to_vec(),
            finalize: false,
        };
        let mut hosts = BTreeMap::new();
        hosts.insert(
            HostName::new("ctl1").unwrap(),
            vec![
                (s("keystone"), steps(&[1], &[3])),
                (s("nova_api"), steps(&[1, 2], &[])),
            ],
        );
        hosts.insert(
            HostName::new("cp1").unwrap(),
            vec![(s("nova_compute"), steps(&[1, 2], &[3, 4]))],
        );
        let mut lv = BTreeMap::new();
        lv.insert(s("keystone"), 0);
        lv.insert(s("nova_api"), 1);
        lv.insert(s("nova_compute"), 0);
        let seq = sequence(&hosts, &lv);
        let names: Vec<String> = seq.iter().map(Phase::describe).collect();
        assert_eq!(
            names,
            vec![
                "pre-1 (keystone, nova_compute)",
                "pre-1 (nova_api)",
                "pre-2 (nova_compute)",
                "pre-2 (nova_api)",
                "puppet",
                "post-3 (keystone, nova_compute)",
                "post-4 (nova_compute)",
            ]
        );
    }
}
