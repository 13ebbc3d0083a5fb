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
/// resolved as `r`. Pure. The stages are walked in order: the first one not done
/// moves (its phase is granted, or its hosts admitted), later ones wait.
pub fn plan(given: &Snapshot, c: &Compose, r: &Resolved, cx: &Context<'_>) -> Composed {
    let snap = without_past_failures(given);
    let snap = snap.as_ref();
    let all = classify(snap);
    let mut out = Composed::empty();
    let Some(rec) = cx.rollout else {
        return out;
    };
    let Some(cur) = snap.current.clone() else {
        return out;
    };
    let roles: BTreeSet<Role> = all.iter().map(|h| h.role.clone()).collect();
    let stages = c.stages_for(&roles);
    let lv = match levels(&graph(c, snap)) {
        Ok(l) => l,
        Err(e) => {
            out.blocked_by_cycle(&all, &stages, &e);
            return out;
        }
    };
    let mut walk = Walk {
        snap,
        c,
        r,
        cx,
        id: rec.id.to_string(),
        version: &rec.version,
        cur,
        all: &all,
        lv,
        started: if rec.stages.is_empty() {
            c.stage_names()
        } else {
            rec.stages.clone()
        },
        max_failures: r.max_failures.of(all.len(), false),
        failed: BTreeMap::new(),
        moving: None,
        not_started: Vec::new(),
        out,
    };
    for (stage, stage_roles) in &stages {
        if walk.stage(stage, stage_roles).is_break() {
            return walk.out;
        }
    }
    walk.end()
}

/// The snapshot without Puppet failure entries older than the rollout's start: a
/// past rollout's, and this one runs the host again (its steps too), as
/// docs/composable.md says.
fn without_past_failures(given: &Snapshot) -> std::borrow::Cow<'_, Snapshot> {
    let started_at = given.rollout.as_ref().map_or(0, |c| c.current_revision);
    if !given.failure_revisions.values().any(|rev| *rev < started_at) {
        return std::borrow::Cow::Borrowed(given);
    }
    let mut s = given.clone();
    s.failure_revisions.retain(|h, rev| {
        let past = *rev < started_at;
        if past {
            s.failures.remove(h);
        }
        !past
    });
    std::borrow::Cow::Owned(s)
}

impl Composed {
    /// Nothing planned yet: no stage, finalize waiting, the rollout moving.
    fn empty() -> Self {
        Composed {
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
        }
    }

    /// The services' `after` form a cycle: every host is blocked, every stage waits.
    fn blocked_by_cycle(&mut self, all: &[HostStatus], stages: &[(String, Vec<Role>)], e: &str) {
        for h in all {
            self.plan.reasons.insert(
                h.host.clone(),
                reason(
                    ReasonCode::Blocked,
                    format!("blocked: {e} (fix the task files' `after`)"),
                ),
            );
        }
        self.stages = stages
            .iter()
            .map(|(s, roles)| StageView {
                state: "waiting",
                ..StageView::new(s, roles, 0)
            })
            .collect();
    }

    /// Gives every host of `members` the same reason.
    fn reason_for_all(&mut self, members: &[&HostStatus], code: ReasonCode, text: &str) {
        for h in members {
            self.plan
                .reasons
                .insert(h.host.clone(), reason(code, text.to_string()));
        }
    }
}

impl StageView {
    fn new(name: &str, roles: &[Role], hosts: usize) -> Self {
        StageView {
            name: name.to_string(),
            roles: roles.to_vec(),
            state: "not_started",
            phase: None,
            taking_part: None,
            finished: None,
            phases: Vec::new(),
            hosts,
            left_behind: BTreeMap::new(),
        }
    }
}

/// Each host's services with their steps.
type HostServices = BTreeMap<HostName, Vec<(Service, ServiceSteps)>>;

/// One pass over the stages, in order, and what it found so far.
struct Walk<'a> {
    snap: &'a Snapshot,
    c: &'a Compose,
    r: &'a Resolved,
    cx: &'a Context<'a>,
    id: String,
    version: &'a crate::names::Version,
    cur: crate::names::Version,
    all: &'a [HostStatus],
    lv: BTreeMap<Service, u32>,
    /// The stages the rollout started.
    started: Vec<String>,
    max_failures: u64,
    /// Failed hosts across the rollout, with why.
    failed: BTreeMap<String, String>,
    /// The stage that moves (running or blocked): later stages wait for it.
    moving: Option<String>,
    not_started: Vec<String>,
    out: Composed,
}

/// A stage's grants as read: each role's (of this rollout and stage), the earliest
/// phase they grant, and the hosts they recorded as left behind.
struct StageGrants {
    roles: Vec<Option<Grant>>,
    granted: Option<PhaseKey>,
    recorded: BTreeMap<HostName, String>,
}

impl StageGrants {
    /// Its roles' grants are written together, but a chunked write may have landed
    /// for some roles only, and one may have been overwritten. The phases before
    /// the earliest grant that names a phase of this stage are past; one that names
    /// none (or cannot be read) counts for nothing, and every role gets the current
    /// phase's grant written again.
    fn read(snap: &Snapshot, id: &str, stage: &str, roles: &[Role], seq: &[Phase]) -> Self {
        let grants: Vec<Option<Grant>> = roles
            .iter()
            .map(|r| {
                snap.grants
                    .get(r)
                    .filter(|g| g.rollout == id && g.stage == stage)
                    .cloned()
            })
            .collect();
        let keys: BTreeSet<&PhaseKey> = seq.iter().map(|p| &p.key).collect();
        let ours = || {
            grants
                .iter()
                .flatten()
                .filter(|g| g.key().is_some_and(|k| keys.contains(&k)))
        };
        StageGrants {
            granted: ours().filter_map(Grant::key).min(),
            recorded: ours().flat_map(|g| g.left_behind.clone()).collect(),
            roles: grants,
        }
    }

    fn is_past(&self, phase: &Phase) -> bool {
        self.granted.as_ref().is_some_and(|g| phase.key < *g)
    }
}

/// The stage's current phase: its index and the hosts taking part.
type Current = Option<(usize, Vec<HostName>)>;

impl Walk<'_> {
    /// One stage: not started, waiting for an earlier one, blocked, done, or
    /// running its current phase. `Break` when the rollout stopped on failures.
    fn stage(&mut self, stage: &str, roles: &[Role]) -> std::ops::ControlFlow<()> {
        use std::ops::ControlFlow::Continue;
        let members: Vec<&HostStatus> = self.all.iter().filter(|h| roles.contains(&h.role)).collect();
        let mut view = StageView::new(stage, roles, members.len());
        let (services, blocked) = self.member_services(&members);
        let seq = sequence(&services, &self.lv);
        view.phases = seq.iter().map(Phase::describe).collect();
        if !self.started.iter().any(|s| s == stage) {
            self.not_started(stage, &members, view);
            return Continue(());
        }
        if let Some(before) = &self.moving {
            view.state = "waiting";
            let text = format!("waiting for stage {before} to be done");
            self.out.reason_for_all(&members, ReasonCode::WaitingFor, &text);
            self.out.stages.push(view);
            return Continue(());
        }
        let blocked = self.unheld(blocked);
        if !blocked.is_empty() {
            self.blocked(stage, &members, &blocked, view);
            return Continue(());
        }
        let grants = StageGrants::read(self.snap, &self.id, stage, roles, &seq);
        let (left, current) = self.walk_phases(&members, &services, &seq, &grants);
        view.left_behind = left.clone();
        let Some((pi, part)) = current else {
            self.done(&members, &left, view);
            return Continue(());
        };
        let running = Running {
            stage,
            roles,
            members: &members,
            services: &services,
            phase: &seq[pi],
            part,
            left,
        };
        self.running(&running, &grants, view)
    }

    /// Each member's services, or why it cannot take part (no catalog, a task file
    /// missing or invalid).
    fn member_services(&self, members: &[&HostStatus]) -> (HostServices, BTreeMap<HostName, String>) {
        let mut services = BTreeMap::new();
        let mut blocked = BTreeMap::new();
        for h in members {
            match host_services(self.c, self.snap, &h.host, &h.role) {
                Ok(s) => {
                    services.insert(h.host.clone(), s);
                }
                Err(e) => {
                    blocked.insert(h.host.clone(), e);
                }
            }
        }
        (services, blocked)
    }

    fn not_started(&mut self, stage: &str, members: &[&HostStatus], view: StageView) {
        self.not_started.push(stage.to_string());
        let text = format!(
            "stage {stage} is not started (`jioctl upgrade {} --stage {stage}`)",
            self.version
        );
        self.out.reason_for_all(members, ReasonCode::WaitingFor, &text);
        self.out.stages.push(view);
    }

    /// The hosts that cannot take part and are not held: a held one stays behind
    /// instead of blocking the stage.
    fn unheld(&self, mut blocked: BTreeMap<HostName, String>) -> BTreeMap<HostName, String> {
        blocked.retain(|h, _| {
            self.all
                .iter()
                .find(|s| &s.host == h)
                .is_none_or(|s| self.snap.hold_of(&s.host, &s.role).is_none())
        });
        blocked
    }

    /// A member that cannot take part holds the whole stage until it is fixed or
    /// held.
    fn blocked(
        &mut self,
        stage: &str,
        members: &[&HostStatus],
        blocked: &BTreeMap<HostName, String>,
        mut view: StageView,
    ) {
        view.state = "blocked";
        self.moving = Some(stage.to_string());
        let names = blocked
            .keys()
            .map(HostName::as_str)
            .collect::<Vec<_>>()
            .join(", ");
        for h in members {
            let r = match blocked.get(&h.host) {
                Some(why) => reason(ReasonCode::Blocked, format!("blocked: {why}")),
                None => reason(
                    ReasonCode::WaitingFor,
                    format!(
                        "stage {stage} waits for blocked host(s) {names} (fix their task files, or hold them)"
                    ),
                ),
            };
            self.out.plan.reasons.insert(h.host.clone(), r);
        }
        self.out.stages.push(view);
    }

    /// Walks the phases: the first one not finished (at or after the grant) is the
    /// current one; hosts that did not finish an earlier one stay behind, with why.
    fn walk_phases(
        &mut self,
        members: &[&HostStatus],
        services: &HostServices,
        seq: &[Phase],
        grants: &StageGrants,
    ) -> (BTreeMap<HostName, String>, Current) {
        // Held and unable to take part: it stays behind.
        let mut left: BTreeMap<HostName, String> = members
            .iter()
            .filter(|h| !services.contains_key(&h.host))
            .map(|h| {
                let why = "held, and it cannot take part (see its task files)";
                (h.host.clone(), why.to_string())
            })
            .collect();
        for (pi, phase) in seq.iter().enumerate() {
            let part = taking_part(members, services, &left, phase);
            let open = self.open_hosts(&part, phase, services);
            if grants.is_past(phase) {
                for h in open {
                    let why = self.left_by_past_phase(&h, phase, services, &grants.recorded);
                    left.insert(h, why);
                }
                continue;
            }
            let settled = open.iter().all(|h| self.settled(h, phase, services));
            if open.is_empty() || (settled && grants.granted.as_ref() == Some(&phase.key)) {
                for h in open {
                    let why = self.left_by_finished_phase(&h, phase, services);
                    left.insert(h, why);
                }
                continue;
            }
            return (left, Some((pi, part)));
        }
        (left, None)
    }

    /// The hosts of `part` that did not finish `phase` (failed ones included);
    /// every finished or failed one counts in the progress.
    fn open_hosts(&mut self, part: &[HostName], phase: &Phase, services: &HostServices) -> Vec<HostName> {
        let mut open = Vec::new();
        for h in part {
            match phase_progress(self.snap, &self.cur, h, phase, services) {
                Progress::Done => self.out.progress += 1,
                Progress::Failed(..) => {
                    self.out.progress += 1;
                    open.push(h.clone());
                }
                Progress::Open => open.push(h.clone()),
            }
        }
        open
    }

    /// Why a host that did not finish a phase the stage has passed stays behind.
    fn left_by_past_phase(
        &mut self,
        h: &HostName,
        phase: &Phase,
        services: &HostServices,
        recorded: &BTreeMap<HostName, String>,
    ) -> String {
        if let Progress::Failed(why, _) = phase_progress(self.snap, &self.cur, h, phase, services) {
            return self.fail(h, failed_text(self.snap, h, &phase.name(), &why));
        }
        // Left behind when the phase moved on (held, as the driver recorded it
        // then): it stays behind at its version, as a held host does, also once
        // released.
        if let Some(r) = recorded.get(h).filter(|r| r.starts_with("held")) {
            return r.clone();
        }
        // It has tasks in a phase the stage has passed: they never ran (its task
        // files changed during the rollout). A failure, so the rollout cannot end
        // done without them.
        let text = format!(
            "missed phase {}: its tasks there never ran (they appeared after the stage had passed it: were its task files changed during the rollout?)",
            phase.describe()
        );
        self.fail(h, text)
    }

    /// Why a host that did not finish a finished phase stays behind: it failed, or
    /// it was held.
    fn left_by_finished_phase(&mut self, h: &HostName, phase: &Phase, services: &HostServices) -> String {
        match phase_progress(self.snap, &self.cur, h, phase, services) {
            Progress::Failed(why, _) => self.fail(h, failed_text(self.snap, h, &phase.name(), &why)),
            _ => format!("held while phase {} went on", phase.describe()),
        }
    }

    /// Records a failed host; returns its reason.
    fn fail(&mut self, h: &HostName, text: String) -> String {
        self.failed.insert(h.to_string(), text.clone());
        text
    }

    /// An open host lets its phase finish: failed and not retrying, or held, and
    /// never while its agent runs something (a retry of the step).
    fn settled(&self, h: &HostName, phase: &Phase, services: &HostServices) -> bool {
        !running(self.snap, h)
            && match phase_progress(self.snap, &self.cur, h, phase, services) {
                Progress::Failed(_, rev) => !retrying(self.snap, h, rev),
                _ => self.snap.hold_of(h, &self.snap.role_of(h)).is_some(),
            }
    }

    /// Every phase of the stage is finished: the hosts left behind say why.
    fn done(&mut self, members: &[&HostStatus], left: &BTreeMap<HostName, String>, mut view: StageView) {
        view.state = "done";
        for h in members {
            let Some(why) = left.get(&h.host) else {
                continue;
            };
            let code = left_code(why, ReasonCode::Held);
            self.out
                .plan
                .reasons
                .insert(h.host.clone(), reason(code, format!("left behind: {why}")));
            if code == ReasonCode::Held {
                self.out.plan.held.push(h.host.clone());
            }
        }
        self.out.stages.push(view);
    }
}

/// The hosts of the stage taking part in `phase`: not left behind, and with tasks
/// in it (every one for `puppet`).
fn taking_part(
    members: &[&HostStatus],
    services: &HostServices,
    left: &BTreeMap<HostName, String>,
    phase: &Phase,
) -> Vec<HostName> {
    let when = phase.when().unwrap_or(When::Pre);
    let takes_part = |h: &HostName| {
        !left.contains_key(h)
            && (phase.is_puppet()
                || services.get(h).is_some_and(|ss| {
                    ss.iter()
                        .any(|(s, st)| phase.services.contains(s) && st.has(when, phase.key.step))
                }))
    };
    members
        .iter()
        .map(|h| h.host.clone())
        .filter(|h| takes_part(h))
        .collect()
}

/// The reason code of a host left behind, from its reason's text: a held one gets
/// `held`.
fn left_code(why: &str, held: ReasonCode) -> ReasonCode {
    if why.starts_with("blocked") {
        ReasonCode::Blocked
    } else if why.starts_with("held") {
        held
    } else {
        ReasonCode::Failed
    }
}

fn stopped_text(failed: usize, max_failures: u64) -> String {
    format!("stopped: {failed} failed host(s), more than max_failures {max_failures}")
}

/// A stage with a phase going on.
struct Running<'s> {
    stage: &'s str,
    roles: &'s [Role],
    members: &'s [&'s HostStatus],
    services: &'s HostServices,
    phase: &'s Phase,
    part: Vec<HostName>,
    left: BTreeMap<HostName, String>,
}

impl Walk<'_> {
    /// The stage's current phase: stopped on failures, moved on (a new grant), or
    /// its hosts planned.
    fn running(
        &mut self,
        s: &Running<'_>,
        grants: &StageGrants,
        mut view: StageView,
    ) -> std::ops::ControlFlow<()> {
        view.state = "running";
        view.phase = Some(s.phase.describe());
        view.taking_part = Some(s.part.len());
        self.moving = Some(s.stage.to_string());
        if self.failed.len() as u64 > self.max_failures {
            self.stop(s, view);
            return std::ops::ControlFlow::Break(());
        }
        let mut want = Grant::of(&self.id, s.stage, s.phase);
        want.left_behind = s
            .left
            .iter()
            .filter(|(_, why)| !why.starts_with("missed"))
            .map(|(h, why)| (h.clone(), why.clone()))
            .collect();
        if grants
            .roles
            .iter()
            .any(|g| g.as_ref().is_none_or(|g| !g.same_phase(&want)))
        {
            self.move_on(s, &want, view);
        } else {
            self.plan_phase(s, view);
        }
        std::ops::ControlFlow::Continue(())
    }

    /// Stopped on failures: no phase moves on, nothing is admitted.
    fn stop(&mut self, s: &Running<'_>, view: StageView) {
        self.out.plan.stopped_on_failures = true;
        let stopped = stopped_text(self.failed.len(), self.max_failures);
        for h in s.members {
            let r = match s.left.get(&h.host) {
                Some(why) => reason(ReasonCode::Failed, why.clone()),
                None => reason(ReasonCode::StoppedOnFailures, stopped.clone()),
            };
            self.out.plan.reasons.insert(h.host.clone(), r);
        }
        self.out.stages.push(view);
        self.out.standing = Standing::Stopped {
            failed: std::mem::take(&mut self.failed),
        };
    }

    /// The phase moves on: the grant, and every enable key of the stage reset, in
    /// one transaction; the next pass admits.
    fn move_on(&mut self, s: &Running<'_>, want: &Grant, mut view: StageView) {
        for role in s.roles {
            self.out.grants.push((role.clone(), want.clone()));
            if self.snap.role_keys.contains_key(role) {
                self.out.reset_roles.push(role.clone());
            }
        }
        let text = format!("stage {} moves on to phase {}", s.stage, s.phase.describe());
        for h in s.members {
            if self.snap.host_keys.contains_key(&h.host) {
                self.out.reset_hosts.push(h.host.clone());
            }
        }
        self.out.reason_for_all(s.members, ReasonCode::WaitingFor, &text);
        view.finished = Some(0);
        self.out.stages.push(view);
    }

    /// Plans the phase under the rolling rules: its hosts (done ones as upgraded),
    /// and any other host whose agent runs something (it holds its slot).
    fn plan_phase(&mut self, s: &Running<'_>, mut view: StageView) {
        let ps = phase_snapshot(self.snap, &self.cur, s.phase, &s.part, s.services);
        let hosts = phase_hosts(self.snap, &ps, &s.part);
        let finished = hosts
            .iter()
            .filter(|h| s.part.contains(&h.host) && h.state == HostState::Upgraded)
            .count();
        view.finished = Some(finished);
        let pcx = Context {
            host_keys_only: true,
            busy_outside: &[],
            hook_roles: &[],
            ..*self.cx
        };
        let mut p = plan::plan(&ps, &hosts, self.r, &pcx);
        self.count_failed(s, &hosts);
        if self.failed.len() as u64 > self.max_failures && !p.stopped_on_failures {
            p.stopped_on_failures = true;
            let stopped = stopped_text(self.failed.len(), self.max_failures);
            for h in std::mem::take(&mut p.enable_hosts) {
                p.reasons
                    .insert(h, reason(ReasonCode::StoppedOnFailures, stopped.clone()));
            }
        }
        stage_reasons(&mut p, s, &hosts, finished);
        // Keep the reasons of other stages already given.
        for (h, why) in std::mem::take(&mut self.out.plan.reasons) {
            p.reasons.entry(h).or_insert(why);
        }
        self.out.plan = p;
        self.out.hosts = hosts;
        self.out.stages.push(view);
    }

    /// Failures count across the rollout, not just in this phase.
    fn count_failed(&mut self, s: &Running<'_>, hosts: &[HostStatus]) {
        for h in hosts.iter().filter(|h| h.state == HostState::Failed) {
            let text = match phase_progress(self.snap, &self.cur, &h.host, s.phase, s.services) {
                Progress::Failed(why, _) => failed_text(self.snap, &h.host, &s.phase.name(), &why),
                _ => format!("failed at {}", s.phase.name()),
            };
            self.failed.insert(h.host.to_string(), text);
        }
    }

    /// The end of the pass: a stage moves, some are not started, or the finalize
    /// step.
    fn end(mut self) -> Composed {
        let over = self.failed.len() as u64 > self.max_failures;
        if self.moving.is_some() {
            if self.out.plan.stopped_on_failures {
                self.out.standing = Standing::Stopped { failed: self.failed };
            }
            return self.out;
        }
        if !self.not_started.is_empty() {
            self.out.standing = if over {
                Standing::Stopped { failed: self.failed }
            } else {
                Standing::StagesDone {
                    not_started: self.not_started,
                }
            };
            return self.out;
        }
        // Every stage is done: the finalize step.
        Finalize {
            snap: self.snap,
            c: self.c,
            all: self.all,
            id: &self.id,
            out: &mut self.out,
            failed: self.failed,
            role: self.c.finalize_role(),
        }
        .run(self.max_failures);
        self.out
    }
}

/// The phase's hosts as classified in its snapshot, and any other host whose agent
/// runs something: it holds its slot, whatever its state says (a failed one
/// retrying).
fn phase_hosts(snap: &Snapshot, ps: &Snapshot, part: &[HostName]) -> Vec<HostStatus> {
    classify(ps)
        .into_iter()
        .filter(|h| part.contains(&h.host) || running(snap, &h.host))
        .map(|mut h| {
            if !part.contains(&h.host) && h.state != HostState::Upgrading {
                h.state = HostState::Upgrading;
                h.reason = Some("its agent is running something".into());
            }
            h
        })
        .collect()
}

/// The reasons of the stage's hosts the phase's plan does not give: left behind,
/// no task in the phase, or finished and waiting for the others.
fn stage_reasons(p: &mut Plan, s: &Running<'_>, hosts: &[HostStatus], finished: usize) {
    let waits = |what: &str| {
        format!(
            "{what} phase {}: waits for the stage's other hosts ({finished} of {} finished)",
            s.phase.describe(),
            s.part.len()
        )
    };
    for h in s.members {
        let r = if let Some(why) = s.left.get(&h.host) {
            // A held one counts as failed here (as it always did).
            reason(left_code(why, ReasonCode::Failed), format!("left behind: {why}"))
        } else if !s.part.contains(&h.host) {
            reason(ReasonCode::WaitingFor, waits("no task in"))
        } else if !p.reasons.contains_key(&h.host)
            && hosts
                .iter()
                .any(|x| x.host == h.host && x.state == HostState::Upgraded)
        {
            reason(ReasonCode::WaitingFor, waits("finished"))
        } else {
            continue;
        };
        p.reasons.insert(h.host.clone(), r);
    }
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

/// The finalize step as one pass decides it.
struct Finalize<'a> {
    snap: &'a Snapshot,
    c: &'a Compose,
    all: &'a [HostStatus],
    id: &'a str,
    out: &'a mut Composed,
    failed: BTreeMap<String, String>,
    role: Option<Role>,
}

impl Finalize<'_> {
    /// Runs the finalize step's decision, once every stage is done: which host runs
    /// it, and how far it is. A failure of it, or a host that cannot run it, ends the
    /// rollout failed.
    fn run(self, max_failures: u64) {
        if self.failed.len() as u64 > max_failures {
            self.out.finalize.state = "waiting";
            self.out.finalize.reason = Some("not run: more hosts failed than max_failures".into());
            self.out.standing = Standing::Stopped { failed: self.failed };
            return;
        }
        let declared = self.declared();
        if declared.is_empty() {
            self.out.finalize.state = "none";
            self.out.standing = Standing::Finished { failed: self.failed };
            return;
        }
        if let Some(why) = self.hosts_behind() {
            return self.end("not_run", "finalize", why);
        }
        let granted = self
            .snap
            .finalize_grant
            .as_ref()
            .filter(|g| g.rollout == self.id)
            .map(|g| g.host.clone());
        let Some(host) = self.host(granted.as_ref()) else {
            return self.no_host();
        };
        self.out.finalize.host = Some(host.clone());
        let mine = self.services_on(&host);
        self.out.finalize.services = mine.clone();
        if let Some(why) = missing_finalize(&declared, &mine, &host, self.role.as_ref()) {
            return self.end("failed", host.as_str(), why);
        }
        self.progress(&host, &mine, granted.as_ref());
    }

    /// Ends the rollout with the finalize step in `state`, a failure of `key` (a
    /// host, or `finalize`) saying why.
    fn end(mut self, state: &'static str, key: &str, why: String) {
        self.out.finalize.state = state;
        self.out.finalize.reason = Some(why.clone());
        self.failed.insert(key.to_string(), why);
        self.out.standing = Standing::Finished { failed: self.failed };
    }

    /// Services whose files declare finalize tasks, on any host.
    fn declared(&self) -> BTreeMap<Service, Vec<HostName>> {
        let services = self.c.all_services();
        let mut declared: BTreeMap<Service, Vec<HostName>> = BTreeMap::new();
        for (h, cat) in &self.snap.catalogs {
            let Ok(cat) = cat else { continue };
            for (s, st) in &cat.services {
                if st.finalize && services.contains(s) {
                    declared.entry(s.clone()).or_default().push(h.clone());
                }
            }
        }
        declared
    }

    /// The deployment-wide step comes after every host reached the version (it
    /// unpins what a host still at the old one needs): with a host failed or left
    /// behind, and the step not granted yet, it does not run, saying so.
    fn hosts_behind(&self) -> Option<String> {
        let snap = self.snap;
        let at_version = |h: &HostName| {
            snap.running
                .get(h)
                .is_some_and(|v| snap.current.as_ref().is_some_and(|c| v.contains(c)))
        };
        let behind: Vec<HostName> = self
            .all
            .iter()
            .filter(|h| {
                self.failed.contains_key(h.host.as_str())
                    || h.state != HostState::Upgraded
                    || !at_version(&h.host)
            })
            .map(|h| h.host.clone())
            .collect();
        if behind.is_empty() || snap.finalize_grant.as_ref().is_some_and(|g| g.rollout == self.id) {
            return None;
        }
        Some(format!(
            "finalize not run: not every host reached the version ({} did not: failed, held or left behind)",
            crate::values::host_list(&behind)
        ))
    }

    fn held(&self, h: &HostName) -> bool {
        self.snap.hold_of(h, &self.snap.role_of(h)).is_some()
    }

    /// The host to run the step. The granted host keeps it once it started there (a
    /// finalize task is never run on two hosts), and while it is only gone (its
    /// agent will be back); held before it started, the next healthy host takes it.
    fn host(&self, granted: Option<&HostName>) -> Option<HostName> {
        let snap = self.snap;
        let started = |h: &HostName| {
            running(snap, h)
                || snap
                    .step_statuses
                    .keys()
                    .any(|(p, _, sh)| p == "finalize" && sh == h)
        };
        let healthy = |h: &HostStatus| {
            Some(&h.role) == self.role.as_ref()
                && h.state == HostState::Upgraded
                && snap.agents.contains_key(&h.host)
                && snap.hold_of(&h.host, &h.role).is_none()
                && !self.failed.contains_key(h.host.as_str())
                && snap.catalogs.get(&h.host).is_some_and(|c| c.is_ok())
        };
        granted
            .filter(|h| started(h) || (!self.held(h) && !self.failed.contains_key(h.as_str())))
            .cloned()
            .or_else(|| self.all.iter().find(|h| healthy(h)).map(|h| h.host.clone()))
    }

    /// No host can run the step now. Held or gone hosts at the version may still
    /// come back; if none is left that could, the step cannot run: the rollout
    /// fails, saying so.
    fn no_host(self) {
        let role_name = self.role.as_ref().map_or("-", |r| r.as_str()).to_string();
        let could = self.all.iter().any(|h| {
            Some(&h.role) == self.role.as_ref()
                && h.state == HostState::Upgraded
                && !self.failed.contains_key(h.host.as_str())
        });
        if could {
            self.out.finalize.state = "waiting";
            self.out.finalize.reason = Some(format!(
                "finalize waits for a healthy host of role {role_name} (at the version, alive, not held)"
            ));
            return;
        }
        let why = format!(
            "finalize cannot run: no host of role {role_name} is at the version without having failed (the finalize role's hosts failed or were left behind)"
        );
        self.end("failed", "finalize", why);
    }

    /// The services with finalize tasks on `host`.
    fn services_on(&self, host: &HostName) -> Vec<Service> {
        let services = self.c.all_services();
        let cat = self.snap.catalogs.get(host).and_then(|c| c.as_ref().ok());
        cat.map(|c| {
            c.services
                .iter()
                .filter(|(s, st)| st.finalize && services.contains(s))
                .map(|(s, _)| s.clone())
                .collect()
        })
        .unwrap_or_default()
    }

    /// How far the step is on `host`: done, failed, or running (granted again
    /// when needed).
    fn progress(self, host: &HostName, mine: &[Service], granted: Option<&HostName>) {
        let refs: Vec<&Service> = mine.iter().collect();
        match task_progress(self.snap, host, "finalize", &refs) {
            Progress::Done => {
                self.out.finalize.state = "done";
                self.out.standing = Standing::Finished { failed: self.failed };
            }
            Progress::Failed(why, _) => {
                let text = failed_text(self.snap, host, "finalize", &why);
                self.end("failed", host.as_str(), text);
            }
            Progress::Open => {
                self.out.finalize.state = "running";
                let what = mine.iter().map(Service::as_str).collect::<Vec<_>>().join(", ");
                let enabled = self.snap.gate(host, &self.snap.role_of(host)).enabled;
                // Granted (again) to this host, and its key set, unless it is held:
                // a hold's keys are never set back on.
                if granted != Some(host) || (!enabled && !self.held(host)) {
                    self.out.finalize_grant = Some(FinalizeGrant {
                        rollout: self.id.to_string(),
                        host: host.clone(),
                    });
                }
                let why = self.running_reason(host, &what);
                self.out.plan.reasons.insert(host.clone(), why);
            }
        }
    }

    /// Why the finalize host is where it is while the step runs.
    fn running_reason(&self, host: &HostName, what: &str) -> Reason {
        if self.held(host) {
            return reason(
                ReasonCode::Held,
                format!("finalize ({what}) is granted to it, but it is held: the step waits for its release"),
            );
        }
        if !self.snap.agents.contains_key(host) {
            let mut r = lost_reason(host);
            r.text = format!("finalize ({what}) is granted to it, but {}", r.text);
            return r;
        }
        let text = if running(self.snap, host) {
            format!("running the finalize tasks of {what}")
        } else {
            format!("finalize ({what}) is granted to it: its agent is about to start")
        };
        reason(ReasonCode::Upgrading, text)
    }
}

/// The services declaring finalize tasks somewhere that the finalize host has none
/// for: the step cannot run them all.
fn missing_finalize(
    declared: &BTreeMap<Service, Vec<HostName>>,
    mine: &[Service],
    host: &HostName,
    role: Option<&Role>,
) -> Option<String> {
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
    if missing.is_empty() {
        return None;
    }
    Some(format!(
        "finalize cannot run every service's finalize tasks: {} (install its task file on the hosts of role {})",
        missing.join("; "),
        role.map_or("-", |r| r.as_str())
    ))
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
    use crate::rules::Rules;

    fn s(n: &str) -> Service {
        Service::new(n).unwrap()
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
