//! The planner: a pure function from the fleet's status, the rules and the moment
//! to the enable keys a pass writes, and a reason for every host that is not
//! upgraded.
//!
//! Admission, for a pending host, in this order (the first that applies is its
//! reason): held; lost (no live agent); stopped on failures; the rollout paused; its
//! group waiting for the groups it follows; outside the group's maintenance window;
//! the canary phase (the group's canaries are out); frozen (limit 0); the group's
//! limit reached; the fleet cap reached. A host in flight keeps its slot until it is
//! upgraded and, with `min_healthy_time`, has soaked. Nothing here does I/O or reads
//! the clock: the caller passes `now`.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::fleet::{HookStage, HostState, HostStatus, Snapshot};
use crate::keys::HoldTarget;
use crate::names::{HostName, Role};
use crate::rollout::{RolloutRecord, RolloutState};
use crate::rules::Resolved;
use crate::window::{self, WindowState};

/// What the planner needs besides the fleet and the rules.
#[derive(Debug, Clone, Copy, Default)]
pub struct Context<'a> {
    /// Unix time of the pass.
    pub now: u64,
    /// The rollout being driven: its start, pause and canary phase. `None` plans as
    /// the original tool did (no canary phase, no soak window of its own).
    pub rollout: Option<&'a RolloutRecord>,
    /// Admit by host keys only, never by opening a role key (a composable
    /// rollout's phase: a role key would also start hosts left behind).
    pub host_keys_only: bool,
    /// Hosts outside `hosts` that hold a slot all the same (busy with something
    /// else: a fleet command's plan over its own hosts counts the fleet's busy
    /// ones): they count in their group's and the fleet's in-flight numbers, never
    /// in a group's size (percentages), its hosts left (`role_order`) or its plan.
    pub busy_outside: &'a [HostStatus],
    /// Roles whose hosts are drained by maintenance hooks around their slot: they
    /// are admitted by host keys only (the driver turns each admission into the
    /// start of the host's `before` hook), never by opening their role key.
    pub hook_roles: &'a [Role],
}

impl<'a> Context<'a> {
    /// The context of a pass over rollout `rec` at `now`, nobody busy outside it.
    pub fn of_rollout(now: u64, rec: &'a RolloutRecord, host_keys_only: bool) -> Self {
        Context {
            now,
            rollout: Some(rec),
            host_keys_only,
            busy_outside: &[],
            hook_roles: &[],
        }
    }

    /// This context, with the roles that have maintenance hooks.
    pub fn with_hook_roles(self, hook_roles: &'a [Role]) -> Self {
        Context { hook_roles, ..self }
    }
}

/// Why a host is where it is, for people (`text`) and programs (`code`, `at`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reason {
    pub code: ReasonCode,
    pub text: String,
    /// The moment the reason names (when a window opens, a soak ends, a host was
    /// last heard of, a retry is due), as Unix time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<u64>,
}

/// The machine-readable kind of a `Reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasonCode {
    /// Admitted by this plan (a read-only view: the driver's next pass admits it).
    Admitted,
    /// In flight: its agent runs, or it is enabled and about to.
    Upgrading,
    Retrying,
    Soaking,
    Failed,
    Lost,
    Blocked,
    Held,
    StoppedOnFailures,
    Paused,
    WaitingFor,
    OutsideWindow,
    Canary,
    Frozen,
    LimitReached,
    FleetCap,
    /// The active rollout (its record or its rules) cannot be used: nothing is
    /// admitted until it is fixed or ended.
    Unusable,
}

impl ReasonCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ReasonCode::Admitted => "admitted",
            ReasonCode::Upgrading => "upgrading",
            ReasonCode::Retrying => "retrying",
            ReasonCode::Soaking => "soaking",
            ReasonCode::Failed => "failed",
            ReasonCode::Lost => "lost",
            ReasonCode::Blocked => "blocked",
            ReasonCode::Held => "held",
            ReasonCode::StoppedOnFailures => "stopped_on_failures",
            ReasonCode::Paused => "paused",
            ReasonCode::WaitingFor => "waiting_for",
            ReasonCode::OutsideWindow => "outside_window",
            ReasonCode::Canary => "canary",
            ReasonCode::Frozen => "frozen",
            ReasonCode::LimitReached => "limit_reached",
            ReasonCode::FleetCap => "fleet_cap",
            ReasonCode::Unusable => "unusable",
        }
    }
}

fn reason(code: ReasonCode, text: String, at: Option<u64>) -> Reason {
    Reason { code, text, at }
}

/// What the planner decided for one group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupPlan {
    pub group: String,
    pub limit: Option<u64>,
    pub upgraded: usize,
    /// Hosts holding a slot: in flight, failed, lost, or soaking.
    pub in_flight: usize,
    pub pending: usize,
    /// Hosts whose enable key holds an invalid value (never admitted).
    #[serde(skip_serializing_if = "is_zero")]
    pub blocked: usize,
    /// Pending hosts kept out by a hold.
    #[serde(skip_serializing_if = "is_zero")]
    pub held: usize,
    /// Hosts or roles admitted by this plan, or why none.
    pub action: GroupAction,
}

/// What the planner does with one group's pending hosts (rendered for people by
/// `jioctl`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum GroupAction {
    /// No host of the group is pending (or every pending one is held).
    Done,
    /// More hosts failed than `max_failures`: nothing is admitted anywhere.
    StoppedOnFailure { failed: u64, max_failures: u64 },
    /// The rollout is paused.
    Paused,
    /// The groups it waits for (`role_order`) are not all upgraded.
    Wait { on: Vec<String> },
    /// Outside the group's maintenance windows; they open at `opens_at`.
    OutsideWindow { opens_at: Option<u64> },
    /// The canary phase: the group's canaries are out (or it has none); the rest
    /// waits for a promotion, by an operator or when the canaries have soaked
    /// (`soaked_at`, with `canary_soak`, once they all finished healthy).
    Canary {
        canaries: usize,
        #[serde(skip_serializing_if = "Option::is_none")]
        soaked_at: Option<u64>,
    },
    /// Every pending host fits: these role keys are enabled.
    EnableRoles { roles: Vec<Role> },
    /// These hosts are admitted by their host keys (up to the limits).
    Admit { hosts: Vec<HostName> },
    /// The limit is 0.
    Frozen,
    /// The group's limit is reached: nothing more until a host finishes.
    Full { in_flight: usize, limit: usize },
    /// The fleet cap is reached.
    FleetCap { in_flight: usize, cap: usize },
    /// Every pending host is held or lost.
    NoneAdmissible,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The canary phase as this plan saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CanaryPhase {
    /// Hosts that went in this rollout's canary phase.
    pub canaries: Vec<HostName>,
    /// When the canaries will have soaked (`canary_soak` after the driver saw them
    /// all finished); `None` without `canary_soak`, or before that.
    pub soaked_at: Option<u64>,
    /// The canaries soaked healthy: the driver promotes the rollout.
    pub promote: bool,
    /// Every canary just finished healthy: the driver records when (the soak
    /// counts from it).
    pub mark_done: bool,
}

/// The keys a pass writes, and why every other host stays where it is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub enable_roles: Vec<Role>,
    pub clear_host_keys: Vec<HostName>,
    pub enable_hosts: Vec<HostName>,
    pub groups: Vec<GroupPlan>,
    /// More hosts failed than `max_failures`: nothing was admitted.
    pub stopped_on_failures: bool,
    /// Hosts in flight across the fleet (soaking ones included), and the fleet cap.
    pub fleet_in_flight: usize,
    pub fleet_cap: Option<u64>,
    /// Upgraded hosts still soaking (`min_healthy_time`): they hold their slots.
    pub soaking: Vec<HostName>,
    /// Pending hosts kept out by a hold (a rollout ends without them).
    pub held: Vec<HostName>,
    /// In the canary phase (not yet promoted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryPhase>,
    /// The earliest moment the plan may change without any write (a soak ends, a
    /// window opens or closes): the driver plans again then.
    pub wake_at: Option<u64>,
    /// Every host that is not upgraded and settled, with why.
    pub reasons: BTreeMap<HostName, Reason>,
    /// Held hosts still enabled (by a role or global key) and not running, and
    /// enabled hosts not started when their window closed: their host keys are set
    /// to false, so that a release does not start them outside the plan, and no
    /// admission outlives its window.
    pub disable_hosts: Vec<HostName>,
    /// Hosts enabled but not started while their window is closed (by the driver's
    /// clock): this plan disarms them (they are in `disable_hosts` too).
    pub armed_outside_window: Vec<HostName>,
    /// Hosts whose validated run waits to reboot, inside their window (by the
    /// driver's clock) and not held: this plan rewrites their host key, which
    /// the agent takes as the permit to reboot (`reboot_permits`).
    pub permit_reboots: Vec<HostName>,
    /// Hosts whose validated run waits to reboot while their window is closed:
    /// they keep their slots, and the rollout waits on purpose.
    pub reboots_outside_window: Vec<HostName>,
    /// A host holding a slot has no live agent (lost in flight, or soaking): the
    /// rollout cannot be said to wait on purpose.
    #[serde(skip)]
    pub lost_in_flight: bool,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.enable_roles.is_empty()
            && self.clear_host_keys.is_empty()
            && self.enable_hosts.is_empty()
            && self.disable_hosts.is_empty()
            && self.permit_reboots.is_empty()
    }

    /// The rollout waits on purpose (a closed window, the canary phase, a soak): the
    /// progress deadline does not count meanwhile.
    pub fn waits_by_design(&self) -> bool {
        if self.lost_in_flight {
            return false;
        }
        !self.soaking.is_empty()
            || !self.armed_outside_window.is_empty()
            || !self.reboots_outside_window.is_empty()
            || self.groups.iter().any(|g| {
                matches!(
                    g.action,
                    GroupAction::OutsideWindow { .. } | GroupAction::Canary { .. }
                )
            })
    }

    fn wake(&mut self, t: u64) {
        self.wake_at = Some(self.wake_at.map_or(t, |w| w.min(t)));
    }
}

/// Nothing is in flight and nothing can be admitted, yet hosts remain: a rollout
/// under this plan will not move until someone acts (a frozen role, a lost or
/// blocked host, a role waiting for one of those). A wait for a window or a soak
/// ends by itself, so it is not forever.
pub fn waits_forever(hosts: &[HostStatus], plan: &Plan) -> bool {
    let held: BTreeSet<&HostName> = plan.held.iter().collect();
    plan.is_empty()
        && !plan.stopped_on_failures
        && plan.wake_at.is_none()
        && plan.soaking.is_empty()
        && !hosts.iter().any(|h| h.state == HostState::Upgrading)
        && hosts.iter().any(|h| {
            matches!(h.state, HostState::Pending | HostState::Lost | HostState::Blocked)
                && !held.contains(&h.host)
        })
}

/// Unix time as people read it in reasons.
pub fn when(t: u64) -> String {
    crate::time::utc_display(t)
}

/// One host's facts the planner derives beyond its classification.
struct Facts {
    /// Holds its slot soaking (`min_healthy_time`): why, and until when as its agent
    /// counts (the run's end plus the soak, on the agent's clock).
    soaking: Option<(String, Option<u64>)>,
    /// Upgraded by a run of this rollout: when it ended (the agent's clock).
    finished_here: Option<u64>,
}

/// Whether an upgraded host soaks, from its own result only: times are compared on
/// the agent's clock alone (its run's end and its last passing check), and which
/// rollout made the run is the id the agent recorded, so a skewed clock between the
/// agent and the driver changes nothing.
fn facts(snap: &Snapshot, h: &HostStatus, r: &Resolved, cx: &Context<'_>) -> Facts {
    let mut f = Facts {
        soaking: None,
        finished_here: None,
    };
    let (Some(cur), Some(rec)) = (&snap.current, cx.rollout) else {
        return f;
    };
    if h.state != HostState::Upgraded {
        return f;
    }
    let key = format!("/results/{}", h.host);
    let res = match snap.results.get(&h.host) {
        Some(res) => res,
        None if snap.results_invalid.contains(&h.host) => {
            if r.min_healthy_time.is_some() {
                // The safe reading: it may be this rollout's run.
                f.soaking = Some((
                    format!("its result {key} cannot be read: it soaks until it can"),
                    None,
                ));
            }
            return f;
        }
        // No result at all (an agent from before results): not this rollout's run.
        None => return f,
    };
    if &res.version != cur {
        if r.min_healthy_time.is_some() {
            f.soaking = Some((
                format!(
                    "at {cur}, but its result {key} is still for {}: waiting for its run's",
                    res.version
                ),
                None,
            ));
        }
        return f;
    }
    if !res.ok || res.rollout.as_deref() != Some(rec.id.as_str()) {
        return f;
    }
    f.finished_here = Some(res.at);
    if let Some(mht) = r.min_healthy_time {
        let until = res.at.saturating_add(mht.as_secs());
        if res.checked_at.is_none_or(|c| c < until) {
            f.soaking = Some((
                format!(
                    "soaking: upgraded at {}, healthy for min_healthy_time until {} by its agent's clock, then checked",
                    when(res.at),
                    when(until)
                ),
                Some(until),
            ));
        }
    }
    f
}

/// Decides which pending hosts may start, and why each other host waits. Pure.
///
/// One pass: the reasons of the hosts that are not pending, the disarming of
/// admissions outside their windows, then each group in turn (its waits, as named
/// rules in order, or its admissions), then the end of the canary phase.
pub fn plan(snap: &Snapshot, hosts: &[HostStatus], r: &Resolved, cx: &Context<'_>) -> Plan {
    let pass = Pass::new(snap, hosts, r, cx);
    let mut plan = Plan {
        stopped_on_failures: pass.stopped,
        fleet_cap: r.fleet_cap(hosts.len()),
        ..Plan::default()
    };
    plan.fleet_in_flight = hosts.iter().filter(|h| pass.holds_slot(h)).count() + cx.busy_outside.len();
    for h in hosts {
        if let Some(why) = pass.not_pending_reason(h, &mut plan) {
            plan.reasons.insert(h.host.clone(), why);
        }
        if pass.soaking(h) {
            plan.soaking.push(h.host.clone());
        }
    }
    disarm_outside_windows(snap, hosts, &mut plan, |h| {
        pass.window_of(&pass.group_of(&h.role))
    });
    reboot_permits(snap, hosts, &mut plan, |h| {
        pass.window_of(&pass.group_of(&h.role))
    });
    let mut fleet_in_flight = plan.fleet_in_flight;
    let mut canaries = Canaries::default();
    for (g, hs) in &pass.by_group {
        let group = pass.group_plan(g, hs, &mut plan, &mut fleet_in_flight, &mut canaries);
        plan.groups.push(group);
    }
    pass.readmit_drained(hosts, &mut plan);
    if pass.canary_phase {
        pass.end_canary_phase(canaries, &mut plan);
    }
    plan
}

/// What every rule of one pass reads: the hosts by group and their facts, and
/// where the rollout stands.
struct Pass<'a> {
    snap: &'a Snapshot,
    r: &'a Resolved,
    cx: &'a Context<'a>,
    failed: u64,
    max_failures: u64,
    /// More hosts failed than `max_failures`.
    stopped: bool,
    /// The rollout is paused: why, by whom, until when.
    paused: Option<(Option<String>, String, Option<u64>)>,
    canary_phase: bool,
    facts: BTreeMap<&'a HostName, Facts>,
    by_group: BTreeMap<String, Vec<&'a HostStatus>>,
}

/// This rollout's canaries, as the groups are planned: the hosts, and whether one
/// is still moving (not finished, or soaking).
#[derive(Default)]
struct Canaries {
    hosts: Vec<HostName>,
    moving: bool,
}

/// One group as a pass sees it, before deciding.
struct GroupView<'a> {
    /// Hosts holding a slot (theirs and busy ones outside the plan's hosts).
    holders: Vec<&'a HostName>,
    limit: Option<u64>,
    /// Its pending hosts, by name.
    pending: Vec<&'a HostStatus>,
    blocked: usize,
    /// Pending hosts that may be admitted (not held, not lost).
    candidates: Vec<&'a HostName>,
    held: usize,
    lost: usize,
    /// Hosts this rollout moved or is moving.
    touched: Vec<&'a HostName>,
    /// How many more canaries it may send out (during the canary phase).
    canary_room: Option<usize>,
    /// The groups it follows that still have hosts left.
    waiting: Vec<&'a String>,
    has_windows: bool,
    window: WindowState,
    group_room: usize,
    fleet_room: usize,
    /// A role of the group has maintenance hooks (its hosts go by host keys).
    hooked: bool,
}

impl<'a> Pass<'a> {
    fn new(snap: &'a Snapshot, hosts: &'a [HostStatus], r: &'a Resolved, cx: &'a Context<'a>) -> Pass<'a> {
        let failed = hosts.iter().filter(|h| h.state == HostState::Failed).count() as u64;
        let max_failures = r.max_failures.of(hosts.len(), false);
        let paused = cx.rollout.and_then(|rec| match &rec.state {
            RolloutState::Paused { reason, by, until } => Some((reason.clone(), by.clone(), *until)),
            _ => None,
        });
        let mut pass = Pass {
            snap,
            r,
            cx,
            failed,
            max_failures,
            stopped: failed > max_failures,
            paused,
            canary_phase: !r.canary.is_empty() && cx.rollout.is_some_and(|rec| rec.promoted.is_none()),
            facts: hosts.iter().map(|h| (&h.host, facts(snap, h, r, cx))).collect(),
            by_group: BTreeMap::new(),
        };
        for h in hosts {
            pass.by_group.entry(pass.group_of(&h.role)).or_default().push(h);
        }
        pass
    }

    fn group_of(&self, role: &Role) -> String {
        self.r
            .group_of
            .get(role)
            .cloned()
            .unwrap_or_else(|| role.to_string())
    }

    fn soaking(&self, h: &HostStatus) -> bool {
        self.facts.get(&h.host).is_some_and(|f| f.soaking.is_some())
    }

    fn holds_slot(&self, h: &HostStatus) -> bool {
        h.state.in_flight() || self.soaking(h)
    }

    /// Hosts of a group that are not yet upgraded and settled.
    fn left(&self, g: &str) -> usize {
        self.by_group.get(g).map_or(0, |hs| {
            hs.iter()
                .filter(|h| h.state != HostState::Upgraded || self.soaking(h))
                .count()
        })
    }

    fn windows(&self, g: &str) -> Vec<&'a window::Window> {
        self.r
            .windows
            .get(g)
            .map(|w| w.iter().collect())
            .unwrap_or_default()
    }

    fn window_of(&self, g: &str) -> WindowState {
        window::state(&self.windows(g), self.cx.now)
    }
}

/// The reasons of the hosts that are not pending.
impl Pass<'_> {
    fn not_pending_reason(&self, h: &HostStatus, plan: &mut Plan) -> Option<Reason> {
        let soaking = &self.facts[&h.host].soaking;
        match h.state {
            // No current version: there is no rollout to plan for.
            HostState::Unknown | HostState::Pending => None,
            HostState::Upgraded if soaking.is_none() => self
                .snap
                .hold_of(&h.host, &h.role)
                .map(|(t, rec)| held_reason(&t, rec)),
            HostState::Upgraded => soaking.as_ref().map(|(text, until)| {
                if self.snap.agents.contains_key(&h.host) {
                    reason(ReasonCode::Soaking, text.clone(), *until)
                } else {
                    plan.lost_in_flight = true;
                    let mut r = lost_reason(self.snap, &h.host, true);
                    r.text = format!("{}; its soak cannot end without it", r.text);
                    r
                }
            }),
            HostState::Upgrading => Some(self.upgrading_reason(h, plan)),
            HostState::Failed => Some(failed_reason(self.snap, &h.host)),
            HostState::Lost => {
                plan.lost_in_flight = true;
                Some(lost_reason(self.snap, &h.host, true))
            }
            HostState::Blocked => Some(reason(
                ReasonCode::Blocked,
                format!("blocked: {}", h.reason.clone().unwrap_or_default()),
                None,
            )),
        }
    }

    /// Why an upgrading host is in flight: retrying, held while still enabled (this
    /// plan disables it), what its agent runs, or admitted and not started.
    fn upgrading_reason(&self, h: &HostStatus, plan: &mut Plan) -> Reason {
        let res = self.snap.results.get(&h.host);
        match &h.reason {
            Some(why) if why.starts_with("retrying") => {
                let attempt = res.map_or(1, |r| r.attempt.saturating_add(1));
                reason(
                    ReasonCode::Retrying,
                    format!("retrying: attempt {attempt}, re-enabled after its failure"),
                    res.and_then(|r| r.retry_at),
                )
            }
            Some(why) if why.starts_with("held (") => {
                plan.disable_hosts.push(h.host.clone());
                let (t, rec) = self
                    .snap
                    .hold_of(&h.host, &h.role)
                    .unwrap_or((HoldTarget::Host(h.host.clone()), None));
                let mut r = held_reason(&t, rec);
                r.text = format!(
                    "{}; still enabled, so this plan sets its host key to false",
                    r.text
                );
                r
            }
            Some(why) => reason(ReasonCode::Upgrading, format!("in flight: {why}"), None),
            None => match self.snap.agents.get(&h.host) {
                Some(Some(a)) if a.state.running() => reason(
                    ReasonCode::Upgrading,
                    format!(
                        "in flight: its agent is running puppet for {}",
                        a.version.as_ref().map_or("-", |v| v.as_str())
                    ),
                    None,
                ),
                _ => self.admitted_not_started(h),
            },
        }
    }

    /// An admitted host whose agent has not started: about to, or disarmed by this
    /// plan when its window is closed by the driver's clock (an agent's clock decides
    /// no window; `disarm_outside_windows` disarms it).
    fn admitted_not_started(&self, h: &HostStatus) -> Reason {
        match self.window_of(&self.group_of(&h.role)) {
            WindowState::Closed { opens_at } => reason(
                ReasonCode::OutsideWindow,
                format!(
                    "enabled but not started, and outside the maintenance window: this plan disarms it (host key false); admitted again when the window opens{}",
                    opens_at.map(|t| format!(" at {}", when(t))).unwrap_or_default()
                ),
                opens_at,
            ),
            _ => reason(
                ReasonCode::Upgrading,
                "in flight: enabled, its agent is about to start".into(),
                None,
            ),
        }
    }
}

/// One group: what it holds, why its candidates wait, or whom it admits.
impl<'a> Pass<'a> {
    fn group_plan(
        &self,
        g: &str,
        hs: &[&'a HostStatus],
        plan: &mut Plan,
        fleet_in_flight: &mut usize,
        canaries: &mut Canaries,
    ) -> GroupPlan {
        let view = self.group_view(g, hs, plan, *fleet_in_flight, canaries);
        let action =
            if view.pending.is_empty() || (view.candidates.is_empty() && view.held == view.pending.len()) {
                GroupAction::Done
            } else if view.candidates.is_empty() {
                GroupAction::NoneAdmissible
            } else if let Some((action, why)) = self.wait_rules(g, &view, *fleet_in_flight, plan.fleet_cap) {
                for h in &view.candidates {
                    plan.reasons.insert((*h).clone(), why.clone());
                }
                action
            } else if self.all_fit(&view) {
                self.enable_roles(hs, &view, plan, fleet_in_flight)
            } else {
                self.admit_hosts(g, &view, plan, fleet_in_flight, canaries)
            };
        GroupPlan {
            group: g.to_string(),
            limit: view.limit,
            upgraded: hs
                .iter()
                .filter(|h| h.state == HostState::Upgraded && !self.soaking(h))
                .count(),
            in_flight: view.holders.len(),
            pending: view.pending.len(),
            blocked: view.blocked,
            held: view.held,
            action,
        }
    }

    /// The group as this pass sees it. Held and lost pending hosts are never
    /// admitted: their reasons are written here. During the canary phase, the
    /// hosts this rollout moved are its canaries.
    fn group_view(
        &self,
        g: &str,
        hs: &[&'a HostStatus],
        plan: &mut Plan,
        fleet_in_flight: usize,
        canaries: &mut Canaries,
    ) -> GroupView<'a> {
        let size = hs.len();
        let busy = self
            .cx
            .busy_outside
            .iter()
            .filter(|b| self.group_of(&b.role) == g);
        let holders: Vec<&HostName> = hs
            .iter()
            .filter(|h| self.holds_slot(h))
            .map(|h| &h.host)
            .chain(busy.map(|b| &b.host))
            .collect();
        let limit = self.r.limit_of(g, size);
        let mut pending: Vec<&HostStatus> = hs
            .iter()
            .filter(|h| h.state == HostState::Pending)
            .copied()
            .collect();
        pending.sort_by(|a, b| a.host.cmp(&b.host));
        let (candidates, held, lost) = self.candidates(&pending, plan);
        let touched: Vec<&HostName> = hs
            .iter()
            .filter(|h| h.state.in_flight() || self.facts[&h.host].finished_here.is_some())
            .map(|h| &h.host)
            .collect();
        if self.canary_phase {
            for h in hs.iter().filter(|h| touched.contains(&&h.host)) {
                canaries.hosts.push(h.host.clone());
                if self.facts[&h.host].finished_here.is_none() || self.soaking(h) {
                    canaries.moving = true;
                }
            }
        }
        let canary_room = self.canary_phase.then(|| {
            let quota = self.r.canary.get(g).map_or(0, |c| c.of(size, true)) as usize;
            quota.saturating_sub(touched.len())
        });
        let waiting = self
            .r
            .deps
            .get(g)
            .into_iter()
            .flatten()
            .filter(|d| self.left(d) > 0)
            .collect();
        let windows = self.windows(g);
        let has_windows = !windows.is_empty();
        let window = window::state(&windows, self.cx.now);
        if has_windows {
            match window {
                WindowState::Open { closes_at } => plan.wake(closes_at),
                WindowState::Closed { opens_at: Some(t) } => plan.wake(t),
                _ => {}
            }
        }
        let in_flight = holders.len();
        GroupView {
            limit,
            blocked: hs.iter().filter(|h| h.state == HostState::Blocked).count(),
            group_room: limit.map_or(usize::MAX, |l| (l as usize).saturating_sub(in_flight)),
            fleet_room: plan
                .fleet_cap
                .map_or(usize::MAX, |c| (c as usize).saturating_sub(fleet_in_flight)),
            holders,
            pending,
            candidates,
            held,
            lost,
            touched,
            canary_room,
            waiting,
            has_windows,
            window,
            hooked: hs.iter().any(|h| self.cx.hook_roles.contains(&h.role)),
        }
    }

    /// The pending hosts that may be admitted, and how many are held and lost (whose
    /// reasons this writes).
    fn candidates(&self, pending: &[&'a HostStatus], plan: &mut Plan) -> (Vec<&'a HostName>, usize, usize) {
        let mut candidates = Vec::new();
        let (mut held, mut lost) = (0, 0);
        for h in pending {
            if let Some((t, rec)) = self.snap.hold_of(&h.host, &h.role) {
                held += 1;
                plan.held.push(h.host.clone());
                plan.reasons.insert(h.host.clone(), held_reason(&t, rec));
            } else if !self.snap.agents.contains_key(&h.host) {
                lost += 1;
                plan.reasons
                    .insert(h.host.clone(), lost_reason(self.snap, &h.host, false));
            } else {
                candidates.push(&h.host);
            }
        }
        (candidates, held, lost)
    }
}

/// Why a group's candidates wait: the first rule that holds, in this order.
type Wait = Option<(GroupAction, Reason)>;

impl Pass<'_> {
    fn wait_rules(&self, g: &str, v: &GroupView<'_>, fleet_in_flight: usize, fleet_cap: Option<u64>) -> Wait {
        self.stopped_on_failures()
            .or_else(|| self.paused())
            .or_else(|| self.role_order(v))
            .or_else(|| outside_window(v))
            .or_else(|| canary_quota_used(v))
            .or_else(|| frozen(g, v))
            .or_else(|| limit_reached(g, v))
            .or_else(|| fleet_cap_reached(v, fleet_in_flight, fleet_cap))
    }

    /// More hosts failed than `max_failures`: nothing is admitted anywhere.
    fn stopped_on_failures(&self) -> Wait {
        let (failed, max_failures) = (self.failed, self.max_failures);
        self.stopped.then(|| {
            (
                GroupAction::StoppedOnFailure { failed, max_failures },
                reason(
                    ReasonCode::StoppedOnFailures,
                    format!("stopped: {failed} failed host(s), more than max_failures {max_failures}"),
                    None,
                ),
            )
        })
    }

    fn paused(&self) -> Wait {
        let (why, by, until) = self.paused.as_ref()?;
        let text = format!(
            "paused by {by}{}{}",
            why.as_ref().map(|w| format!(": {w}")).unwrap_or_default(),
            until.map(|t| format!(" (until {})", when(t))).unwrap_or_default()
        );
        Some((GroupAction::Paused, reason(ReasonCode::Paused, text, *until)))
    }

    /// `role_order`: the groups it follows are not all upgraded.
    fn role_order(&self, v: &GroupView<'_>) -> Wait {
        if v.waiting.is_empty() {
            return None;
        }
        let text = v
            .waiting
            .iter()
            .map(|d| {
                let n = self.left(d);
                format!("{d} ({n} host{} left)", if n == 1 { "" } else { "s" })
            })
            .collect::<Vec<_>>()
            .join(", ");
        let on = v.waiting.iter().map(|d| d.to_string()).collect();
        Some((
            GroupAction::Wait { on },
            reason(ReasonCode::WaitingFor, format!("waiting for {text}"), None),
        ))
    }
}

/// Outside the group's maintenance windows, by the driver's clock.
fn outside_window(v: &GroupView<'_>) -> Wait {
    let WindowState::Closed { opens_at } = v.window else {
        return None;
    };
    let text = match opens_at {
        Some(t) => format!("outside the maintenance window (opens at {})", when(t)),
        None => "outside the maintenance window (none opens in the coming week)".into(),
    };
    Some((
        GroupAction::OutsideWindow { opens_at },
        reason(ReasonCode::OutsideWindow, text, opens_at),
    ))
}

/// The canary phase, and the group sent out all its canaries.
fn canary_quota_used(v: &GroupView<'_>) -> Wait {
    (v.canary_room == Some(0)).then(|| {
        (
            GroupAction::Canary {
                canaries: v.touched.len(),
                soaked_at: None,
            },
            reason(
                ReasonCode::Canary,
                "canary phase: waits for the canaries (`jioctl rollout promote`, or canary_soak)".into(),
                None,
            ),
        )
    })
}

/// The group's limit is 0.
fn frozen(g: &str, v: &GroupView<'_>) -> Wait {
    (v.limit == Some(0)).then(|| {
        (
            GroupAction::Frozen,
            reason(ReasonCode::Frozen, format!("frozen: group {g} has limit 0"), None),
        )
    })
}

/// Every slot of the group is held.
fn limit_reached(g: &str, v: &GroupView<'_>) -> Wait {
    if v.group_room != 0 {
        return None;
    }
    let (in_flight, l) = (v.holders.len(), v.limit.unwrap_or(0) as usize);
    let holders = v
        .holders
        .iter()
        .map(|h| h.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    Some((
        GroupAction::Full { in_flight, limit: l },
        reason(
            ReasonCode::LimitReached,
            format!("limit reached: group {g} has {in_flight}/{l} in flight ({holders})"),
            None,
        ),
    ))
}

/// Every slot of the fleet is held.
fn fleet_cap_reached(v: &GroupView<'_>, in_flight: usize, fleet_cap: Option<u64>) -> Wait {
    if v.fleet_room != 0 {
        return None;
    }
    let cap = fleet_cap.unwrap_or(0) as usize;
    Some((
        GroupAction::FleetCap { in_flight, cap },
        reason(
            ReasonCode::FleetCap,
            format!("fleet cap reached: {in_flight}/{cap} hosts in flight"),
            None,
        ),
    ))
}

/// Admitting a group's candidates.
impl<'a> Pass<'a> {
    /// Every pending host fits, none is held, lost or blocked, no window or canary
    /// phase limits it, no role of it has maintenance hooks: the role keys may
    /// open. (A role key would override the invalid key that blocks a host, start a
    /// held or lost one, start hosts outside a window, or start them undrained.)
    fn all_fit(&self, v: &GroupView<'_>) -> bool {
        let (pending, in_flight) = (v.pending.len(), v.holders.len());
        !self.cx.host_keys_only
            && !v.hooked
            && v.held == 0
            && v.lost == 0
            && v.blocked == 0
            && !v.has_windows
            && !self.canary_phase
            && v.limit.is_none_or(|l| l >= (pending + in_flight) as u64)
            && v.fleet_room >= pending
    }

    /// Opens the group's role keys and clears its host keys.
    fn enable_roles(
        &self,
        hs: &[&'a HostStatus],
        v: &GroupView<'_>,
        plan: &mut Plan,
        fleet_in_flight: &mut usize,
    ) -> GroupAction {
        let roles: BTreeSet<&Role> = hs.iter().map(|h| &h.role).collect();
        for role in &roles {
            if self.snap.role_keys.get(*role) != Some(&crate::gate::KeyState::Set(true)) {
                plan.enable_roles.push((*role).clone());
            }
        }
        for h in hs {
            if self.snap.host_keys.contains_key(&h.host) {
                plan.clear_host_keys.push(h.host.clone());
            }
        }
        for h in &v.candidates {
            let why = reason(ReasonCode::Admitted, "admitted: its role is enabled".into(), None);
            plan.reasons.insert((*h).clone(), why);
        }
        *fleet_in_flight += v.candidates.len();
        GroupAction::EnableRoles {
            roles: roles.into_iter().cloned().collect(),
        }
    }

    /// Admits candidates by their host keys, in name order, up to the room the
    /// group's limit, the fleet cap and the canary quota leave.
    fn admit_hosts(
        &self,
        g: &str,
        v: &GroupView<'_>,
        plan: &mut Plan,
        fleet_in_flight: &mut usize,
        canaries: &mut Canaries,
    ) -> GroupAction {
        let room = v
            .group_room
            .min(v.fleet_room)
            .min(v.canary_room.unwrap_or(usize::MAX));
        let admit: Vec<HostName> = v.candidates.iter().take(room).map(|h| (*h).clone()).collect();
        let why_rest = rest_waits(g, v, room, admit.len(), *fleet_in_flight, plan.fleet_cap);
        for (i, h) in v.candidates.iter().enumerate() {
            let why = if i < admit.len() {
                reason(ReasonCode::Admitted, "admitted: a slot is free".into(), None)
            } else {
                why_rest.clone()
            };
            plan.reasons.insert((*h).clone(), why);
        }
        if self.canary_phase {
            canaries.hosts.extend(admit.iter().cloned());
            canaries.moving |= !admit.is_empty();
        }
        *fleet_in_flight += admit.len();
        plan.enable_hosts.extend(admit.iter().cloned());
        GroupAction::Admit { hosts: admit }
    }
}

impl Pass<'_> {
    /// A host drained by its `before` hook whose host key was reset (held, or
    /// disarmed when its window closed) still holds its slot: it is enabled again,
    /// without a new slot and without running its hook again, once nothing keeps
    /// it out (no hold, its window open, the rollout neither paused nor stopped).
    fn readmit_drained(&self, hosts: &[HostStatus], plan: &mut Plan) {
        if self.stopped || self.paused.is_some() {
            return;
        }
        for h in hosts {
            let gate = self.snap.gate(&h.host, &h.role);
            if !matches!(self.snap.hook_stage(&h.host), Some(HookStage::Drained(_)))
                || gate.enabled
                || gate.blocked.is_some()
                || self.snap.hold_of(&h.host, &h.role).is_some()
                || matches!(
                    self.window_of(&self.group_of(&h.role)),
                    WindowState::Closed { .. }
                )
            {
                continue;
            }
            plan.enable_hosts.push(h.host.clone());
            plan.reasons.insert(
                h.host.clone(),
                reason(
                    ReasonCode::Admitted,
                    "admitted again: drained by its before hook, it keeps its slot and is enabled again"
                        .into(),
                    None,
                ),
            );
        }
    }
}

/// Why the candidates past `room` wait: the canary quota, the group's limit or
/// the fleet cap, whichever made the room.
fn rest_waits(
    g: &str,
    v: &GroupView<'_>,
    room: usize,
    admitted: usize,
    in_flight: usize,
    cap: Option<u64>,
) -> Reason {
    if room == v.canary_room.unwrap_or(usize::MAX) {
        reason(
            ReasonCode::Canary,
            "canary phase: the rest waits for the canaries".into(),
            None,
        )
    } else if room == v.group_room {
        let limit = v.limit.unwrap_or(0);
        reason(
            ReasonCode::LimitReached,
            {
                // What is in flight once this pass's admissions land.
                let now = usize::try_from(limit)
                    .unwrap_or(usize::MAX)
                    .saturating_sub(v.group_room)
                    + admitted;
                if admitted == 0 {
                    format!("limit reached: group {g} has {now} of {limit} in flight")
                } else {
                    format!(
                        "limit reached: group {g} has {now} of {limit} in flight with the {admitted} admitted in this pass"
                    )
                }
            },
            None,
        )
    } else {
        reason(
            ReasonCode::FleetCap,
            format!(
                "fleet cap reached: {} of {} with this pass",
                in_flight + admitted,
                cap.unwrap_or(0)
            ),
            None,
        )
    }
}

impl Pass<'_> {
    /// The canaries are done when every one finished healthy and nothing more goes
    /// out as a canary; the soak counts from when the driver first saw that (its own
    /// clock, recorded in the rollout), never from the agents' clocks.
    fn end_canary_phase(&self, canaries: Canaries, plan: &mut Plan) {
        let now = self.cx.now;
        let done = !canaries.hosts.is_empty() && !canaries.moving && self.failed == 0 && plan.is_empty();
        let done_at = self.cx.rollout.and_then(|rec| rec.canaries_done_at);
        let soaked_at = self
            .r
            .canary_soak
            .filter(|_| done)
            .and_then(|soak| done_at.map(|t| t.saturating_add(soak.as_secs())));
        if let Some(t) = soaked_at
            && t > now
        {
            plan.wake(t);
        }
        if let Some(t) = soaked_at {
            for g in &mut plan.groups {
                if let GroupAction::Canary { soaked_at, .. } = &mut g.action {
                    *soaked_at = Some(t);
                }
            }
            for why in plan.reasons.values_mut() {
                if why.code == ReasonCode::Canary {
                    why.text = format!("canary phase: the canaries soak until {}", when(t));
                    why.at = Some(t);
                }
            }
        }
        plan.canary = Some(CanaryPhase {
            canaries: canaries.hosts,
            soaked_at,
            promote: soaked_at.is_some_and(|t| t <= now),
            mark_done: done && self.r.canary_soak.is_some() && done_at.is_none(),
        });
    }
}

/// No admission outlives its window (by the driver's clock; an agent's decides
/// none): every host enabled and not running when its group's window is closed is
/// disarmed, whatever its state (about to start, retrying, failed and waiting for
/// its backoff, lost before it started). A host with a run marker, or whose agent
/// runs or cannot be read, keeps its key: its run goes on.
fn disarm_outside_windows(
    snap: &Snapshot,
    hosts: &[HostStatus],
    plan: &mut Plan,
    window_of: impl Fn(&HostStatus) -> WindowState,
) {
    for h in hosts {
        let running = snap.runs.contains_key(&h.host)
            || snap
                .agents
                .get(&h.host)
                .is_some_and(|a| a.as_ref().is_none_or(|a| a.state.running()));
        if h.state == HostState::Upgraded
            || running
            || plan.disable_hosts.contains(&h.host)
            || !matches!(window_of(h), WindowState::Closed { .. })
            || !snap.gate(&h.host, &h.role).enabled
        {
            continue;
        }
        plan.armed_outside_window.push(h.host.clone());
        plan.disable_hosts.push(h.host.clone());
    }
}

/// A reboot that ends a run starts only inside its window, by the driver's clock
/// (an agent's clock decides none): a host whose validated run waits to reboot
/// (its marker says `rebooting`, not yet asked) gets its host key rewritten as the
/// permit, once per wait (the key's revision is then newer than the marker's)
/// while its window is open and no hold names it; with the window closed it keeps
/// its slot and the plan wakes when the window opens.
fn reboot_permits(
    snap: &Snapshot,
    hosts: &[HostStatus],
    plan: &mut Plan,
    window_of: impl Fn(&HostStatus) -> WindowState,
) {
    for h in hosts {
        let Some(Some(r)) = snap.runs.get(&h.host) else {
            continue;
        };
        if r.state != crate::values::AgentState::Rebooting
            || r.until.is_some()
            || !snap.agents.contains_key(&h.host)
        {
            continue;
        }
        let marker = snap.run_revisions.get(&h.host).copied().unwrap_or(0);
        let key = snap
            .enable_revisions
            .get(&crate::keys::EnableLevel::Host(h.host.clone()))
            .copied()
            .unwrap_or(0);
        match window_of(h) {
            WindowState::Closed { opens_at } => {
                plan.reboots_outside_window.push(h.host.clone());
                if let Some(t) = opens_at {
                    plan.wake(t);
                }
                plan.reasons.insert(
                    h.host.clone(),
                    reason(
                        ReasonCode::OutsideWindow,
                        format!(
                            "in flight: validated, its reboot waits for the maintenance window{}; it keeps its slot",
                            opens_at.map(|t| format!(" (opens at {})", when(t))).unwrap_or_default()
                        ),
                        opens_at,
                    ),
                );
            }
            _ if snap.hold_of(&h.host, &h.role).is_some() || key > marker => {}
            _ => plan.permit_reboots.push(h.host.clone()),
        }
    }
}

fn held_reason(t: &HoldTarget, rec: Option<&crate::values::HoldRecord>) -> Reason {
    let on = match t {
        HoldTarget::Host(_) => String::new(),
        HoldTarget::Role(r) => format!(" (its role {r})"),
    };
    match rec {
        Some(h) => reason(
            ReasonCode::Held,
            format!(
                "held{on} by {}{} since {}",
                h.by,
                h.reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default(),
                when(h.at)
            ),
            Some(h.at),
        ),
        None => reason(
            ReasonCode::Held,
            format!("held{on} (its hold record cannot be read; it still holds)"),
            None,
        ),
    }
}

/// The last time anything was heard of the host: its last result, its last health
/// check, the start of a run it never ended.
fn last_heard(snap: &Snapshot, h: &HostName) -> Option<u64> {
    let res = snap.results.get(h);
    [
        res.map(|r| r.at),
        res.and_then(|r| r.checked_at),
        snap.runs.get(h).and_then(|r| r.as_ref().map(|r| r.since)),
    ]
    .into_iter()
    .flatten()
    .max()
}

fn lost_reason(snap: &Snapshot, h: &HostName, in_flight: bool) -> Reason {
    let since = last_heard(snap, h);
    let heard = since
        .map(|t| format!("; last heard of at {}", when(t)))
        .unwrap_or_default();
    let run = match snap.runs.get(h) {
        Some(Some(r)) if r.state == crate::values::AgentState::Rebooting => format!(
            ", its run of {} ended with a reboot at {} and it was not back by {}",
            r.version.as_ref().map_or("-", |v| v.as_str()),
            when(r.since),
            r.until.map_or("-".into(), when)
        ),
        Some(Some(r)) => format!(
            ", its run of {} (started at {}) never ended",
            r.version.as_ref().map_or("-", |v| v.as_str()),
            when(r.since)
        ),
        Some(None) => ", its run marker cannot be read".into(),
        None => String::new(),
    };
    let text = if in_flight {
        format!(
            "lost while in flight: no live agent (no /agents/{h} lease){run}{heard}; it keeps its slot until its agent is back or an operator acts"
        )
    } else {
        format!("lost: no live agent (no /agents/{h} lease){heard}; never admitted")
    };
    reason(ReasonCode::Lost, text, since)
}

/// Text another tool may have written, as one short line: its first line, at most
/// 200 characters, ` …` when more was left out.
fn one_short_line(m: &str) -> String {
    let line = m.lines().next().unwrap_or_default();
    let short: String = line.chars().take(200).collect();
    let cut = short.len() < line.len() || m.lines().nth(1).is_some();
    format!("{short}{}", if cut { " …" } else { "" })
}

fn failed_reason(snap: &Snapshot, h: &HostName) -> Reason {
    if let Some(rec) = snap.hook_failure(h) {
        return reason(
            ReasonCode::Failed,
            format!("failed: its {}", rec.describe()),
            rec.ended,
        );
    }
    let (step, link) = snap
        .failures
        .get(h)
        .map(|(s, l)| (s.as_str().to_string(), l.clone()))
        .unwrap_or_default();
    let res = snap
        .results
        .get(h)
        .filter(|r| !r.ok && Some(&r.version) == snap.current.as_ref());
    let mut text = format!("failed at {}", res.and_then(|r| r.step.clone()).unwrap_or(step));
    if let Some(r) = res {
        if let Some(sv) = &r.service {
            text.push_str(&format!(", service {sv}"));
        }
        if let Some(t) = &r.task {
            text.push_str(&format!(", task {t:?}"));
        }
        if let Some(c) = r.exit_code {
            text.push_str(&format!(", exit {c}"));
        }
        if let Some(m) = &r.message {
            text.push_str(&format!(": {}", one_short_line(m)));
        }
    }
    // The failure entry holds a link, or the agent's reason when it had none.
    let is_link = link.starts_with("http://") || link.starts_with("https://");
    if !is_link && !link.is_empty() && res.is_none_or(|r| r.message.is_none()) {
        text.push_str(&format!(": {}", one_short_line(&link)));
    }
    let log = res
        .and_then(|r| r.log.clone())
        .or_else(|| is_link.then_some(link));
    match log {
        Some(l) => text.push_str(&format!(" (log: {l})")),
        None => {
            if let Some(d) = res.and_then(|r| r.run_dir.clone()) {
                text.push_str(&format!(" (logs on the host in {d})"));
            }
        }
    }
    reason(ReasonCode::Failed, text, res.map(|r| r.at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::api::fixtures::kv;

    /// A group with room, in no canary phase, within its window.
    fn free_group() -> GroupView<'static> {
        GroupView {
            holders: Vec::new(),
            limit: Some(2),
            pending: Vec::new(),
            blocked: 0,
            candidates: Vec::new(),
            held: 0,
            lost: 0,
            touched: Vec::new(),
            canary_room: None,
            waiting: Vec::new(),
            has_windows: false,
            window: WindowState::Always,
            group_room: 2,
            fleet_room: usize::MAX,
            hooked: false,
        }
    }

    /// Each of the group's wait rules on its own: when it holds, and what it says.
    #[test]
    fn each_wait_rule_holds_only_when_it_should() {
        let free = free_group();
        for (name, rule) in [
            ("window", outside_window(&free)),
            ("canary", canary_quota_used(&free)),
            ("frozen", frozen("compute", &free)),
            ("limit", limit_reached("compute", &free)),
            ("fleet cap", fleet_cap_reached(&free, 3, Some(10))),
        ] {
            assert!(rule.is_none(), "{name} holds on a free group");
        }
        let closed = GroupView {
            window: WindowState::Closed { opens_at: Some(3600) },
            ..free_group()
        };
        let (action, why) = outside_window(&closed).unwrap();
        assert_eq!(action, GroupAction::OutsideWindow { opens_at: Some(3600) });
        assert_eq!((why.code, why.at), (ReasonCode::OutsideWindow, Some(3600)));
        let canaries_out = GroupView {
            canary_room: Some(0),
            ..free_group()
        };
        assert_eq!(
            canary_quota_used(&canaries_out).unwrap().1.code,
            ReasonCode::Canary
        );
        let zero = GroupView {
            limit: Some(0),
            group_room: 0,
            ..free_group()
        };
        assert_eq!(frozen("compute", &zero).unwrap().0, GroupAction::Frozen);
        let h1 = HostName::new("compute1").unwrap();
        let h2 = HostName::new("compute2").unwrap();
        let full = GroupView {
            holders: vec![&h1, &h2],
            group_room: 0,
            ..free_group()
        };
        let (action, why) = limit_reached("compute", &full).unwrap();
        assert_eq!(
            action,
            GroupAction::Full {
                in_flight: 2,
                limit: 2
            }
        );
        assert!(
            why.text.contains("2/2 in flight (compute1, compute2)"),
            "{}",
            why.text
        );
        let capped = GroupView {
            fleet_room: 0,
            ..free_group()
        };
        let (action, _) = fleet_cap_reached(&capped, 10, Some(10)).unwrap();
        assert_eq!(
            action,
            GroupAction::FleetCap {
                in_flight: 10,
                cap: 10
            }
        );
    }

    /// The rest of a group past its room waits for whatever made the room: the
    /// canary quota first, then the group's limit, then the fleet cap.
    #[test]
    fn the_hosts_past_the_room_wait_for_what_made_it() {
        let v = GroupView {
            group_room: 1,
            fleet_room: 5,
            canary_room: Some(1),
            ..free_group()
        };
        assert_eq!(
            rest_waits("compute", &v, 1, 1, 0, Some(9)).code,
            ReasonCode::Canary
        );
        let v = GroupView {
            group_room: 1,
            fleet_room: 5,
            ..free_group()
        };
        let why = rest_waits("compute", &v, 1, 1, 0, Some(9));
        assert_eq!(why.code, ReasonCode::LimitReached);
        // It never says "admits 1 more (limit 1)" of a group at its limit.
        assert_eq!(
            why.text,
            "limit reached: group compute has 2 of 2 in flight with the 1 admitted in this pass"
        );
        let v = GroupView {
            group_room: 0,
            fleet_room: 5,
            ..free_group()
        };
        let full = rest_waits("compute", &v, 0, 0, 0, Some(9));
        assert_eq!(full.text, "limit reached: group compute has 2 of 2 in flight");
        let v = GroupView {
            group_room: 4,
            fleet_room: 1,
            ..free_group()
        };
        let why = rest_waits("compute", &v, 1, 1, 8, Some(9));
        assert_eq!(why.code, ReasonCode::FleetCap);
        assert!(why.text.contains("9 of 9 with this pass"), "{}", why.text);
    }
    use crate::fleet::classify;
    use crate::keys::Schema;
    use crate::rules::Rules;
    use crate::store::KeyValue;

    const IDLE: &str = r#"{"state":"idle","version":"v1","since":1,"pid":1}"#;

    /// A fleet at current version v2 after global-disable: `hosts` are
    /// `(name, role, state)` with state one of up, going, fail, wait.
    fn fleet(hosts: &[(&str, &str, &str)]) -> Snapshot {
        Snapshot::from_kvs(&Schema::default(), &fleet_kvs(hosts))
    }

    /// The key-values of `fleet`.
    fn fleet_kvs(hosts: &[(&str, &str, &str)]) -> Vec<KeyValue> {
        let mut kvs = vec![
            kv("/current_version", "v2"),
            kv("/config_state/enable_puppet/global", "false"),
        ];
        for (h, role, state) in hosts {
            kvs.push(kv(
                &format!("/hosts/{h}"),
                &format!(r#"{{"role":"{role}","agent_version":"1","addresses":[],"first_seen":1}}"#),
            ));
            kvs.push(kv(&format!("/agents/{h}"), IDLE));
            match *state {
                "up" => kvs.push(kv(&format!("/running/versions/v2/{h}"), "1")),
                "going" => kvs.push(kv(&format!("/config_state/enable_puppet/host/{h}"), "true")),
                "fail" => {
                    kvs.push(kv(&format!("/config_state/enable_puppet/host/{h}"), "true"));
                    kvs.push(kv(&format!("/status/configured/failure/v2/{h}"), ""));
                }
                _ => {}
            }
        }
        kvs
    }

    fn run(rules: &str, hosts: &[(&str, &str, &str)]) -> Plan {
        let snap = fleet(hosts);
        let statuses = classify(&snap);
        let roles = statuses.iter().map(|h| h.role.clone()).collect();
        let resolved = Rules::parse(rules).unwrap().resolve(&roles).unwrap();
        plan(&snap, &statuses, &resolved, &Context::default())
    }

    fn wait(on: &[&str]) -> GroupAction {
        GroupAction::Wait {
            on: on.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn names<T: AsRef<str>>(v: &[T]) -> Vec<&str> {
        v.iter().map(|x| x.as_ref()).collect()
    }

    #[test]
    fn the_seed_example_rolling_rules() {
        // global 1, compute 3: one controller, three computes at a time.
        let hosts = [
            ("ctl1", "controller", "wait"),
            ("ctl2", "controller", "wait"),
            ("cp1", "compute", "wait"),
            ("cp2", "compute", "wait"),
            ("cp3", "compute", "wait"),
            ("cp4", "compute", "wait"),
        ];
        let p = run(
            r#"{"rolling_rules": {"global": 1, "roles": {"compute": 3}}}"#,
            &hosts,
        );
        assert_eq!(names(&p.enable_hosts), vec!["cp1", "cp2", "cp3", "ctl1"]);
        assert!(p.enable_roles.is_empty());
    }

    #[test]
    fn limits_count_hosts_in_flight_and_failed() {
        let hosts = [
            ("cp1", "compute", "going"),
            ("cp2", "compute", "fail"),
            ("cp3", "compute", "wait"),
            ("cp4", "compute", "wait"),
            ("cp5", "compute", "up"),
        ];
        let p = run(
            r#"{"rolling_rules": {"roles": {"compute": 3}}, "max_failures": 1}"#,
            &hosts,
        );
        assert_eq!(names(&p.enable_hosts), vec!["cp3"]);
        let p = run(
            r#"{"rolling_rules": {"roles": {"compute": 2}}, "max_failures": 1}"#,
            &hosts,
        );
        assert!(p.is_empty());
        assert_eq!(
            p.groups[0].action,
            GroupAction::Full {
                in_flight: 2,
                limit: 2
            }
        );
    }

    #[test]
    fn everything_fits_enables_the_role_and_clears_host_keys() {
        let hosts = [
            ("cp1", "compute", "going"),
            ("cp2", "compute", "wait"),
            ("cp3", "compute", "wait"),
        ];
        let p = run(r#"{"rolling_rules": {"global": 3}}"#, &hosts);
        assert_eq!(names(&p.enable_roles), vec!["compute"]);
        assert_eq!(names(&p.clear_host_keys), vec!["cp1"]);
        assert!(p.enable_hosts.is_empty());
        // No rules: unlimited.
        let p = run("{}", &hosts);
        assert_eq!(names(&p.enable_roles), vec!["compute"]);
    }

    #[test]
    fn hosts_still_running_an_older_version_hold_their_slots() {
        // Re-targeted while cp1 and cp2 run their v1 puppet: limit 2, nothing fits.
        let mut kvs = vec![
            kv("/current_version", "v2"),
            kv("/config_state/enable_puppet/global", "false"),
        ];
        for h in ["cp1", "cp2", "cp3", "cp4"] {
            kvs.push(kv(
                &format!("/hosts/{h}"),
                r#"{"role":"compute","agent_version":"1","addresses":[],"first_seen":1}"#,
            ));
        }
        for h in ["cp1", "cp2"] {
            kvs.push(kv(
                &format!("/agents/{h}"),
                r#"{"state":"upgrading","version":"v1","since":1,"pid":1}"#,
            ));
        }
        for h in ["cp3", "cp4"] {
            kvs.push(kv(&format!("/agents/{h}"), IDLE));
        }
        let snap = Snapshot::from_kvs(&Schema::default(), &kvs);
        let statuses = classify(&snap);
        let roles = statuses.iter().map(|h| h.role.clone()).collect();
        let r = Rules::parse(r#"{"rolling_rules":{"roles":{"compute":2}}}"#)
            .unwrap()
            .resolve(&roles)
            .unwrap();
        let p = plan(&snap, &statuses, &r, &Context::default());
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(
            p.groups[0].action,
            GroupAction::Full {
                in_flight: 2,
                limit: 2
            }
        );
    }

    #[test]
    fn a_blocked_host_keeps_its_group_on_host_keys() {
        // The role key is invalid: enabling the role would overwrite it.
        let mut kvs = vec![
            kv("/current_version", "v2"),
            kv("/config_state/enable_puppet/global", "false"),
            kv("/config_state/enable_puppet/role/compute", "yes"),
            kv("/config_state/enable_puppet/host/cp2", "false"),
        ];
        for h in ["cp1", "cp2"] {
            kvs.push(kv(
                &format!("/hosts/{h}"),
                r#"{"role":"compute","agent_version":"1","addresses":[],"first_seen":1}"#,
            ));
            kvs.push(kv(&format!("/agents/{h}"), IDLE));
        }
        let snap = Snapshot::from_kvs(&Schema::default(), &kvs);
        let statuses = classify(&snap);
        let roles = statuses.iter().map(|h| h.role.clone()).collect();
        let r = Rules::parse("{}").unwrap().resolve(&roles).unwrap();
        let p = plan(&snap, &statuses, &r, &Context::default());
        assert!(p.enable_roles.is_empty() && p.clear_host_keys.is_empty(), "{p:?}");
        assert_eq!(names(&p.enable_hosts), vec!["cp2"]);
        assert_eq!(p.groups[0].blocked, 1);
    }

    #[test]
    fn zero_freezes_a_role_or_everything() {
        let hosts = [("ctl1", "controller", "wait"), ("cp1", "compute", "wait")];
        let p = run(
            r#"{"rolling_rules": {"global": 2, "roles": {"compute": 0}}}"#,
            &hosts,
        );
        assert_eq!(names(&p.enable_roles), vec!["controller"]);
        assert!(
            p.groups
                .iter()
                .any(|g| g.group == "compute" && g.action == GroupAction::Frozen)
        );
        let p = run(r#"{"rolling_rules": {"global": 0}}"#, &hosts);
        assert!(p.is_empty());
    }

    #[test]
    fn role_order_waits_for_every_host_of_the_dependency() {
        let hosts = [
            ("ctl1", "controller", "up"),
            ("ctl2", "controller", "going"),
            ("db1", "db", "up"),
            ("cp1", "compute", "wait"),
        ];
        let p = run(r#"{"role_order": {"compute": "controller"}}"#, &hosts);
        assert!(p.enable_hosts.is_empty() && p.enable_roles.is_empty());
        assert!(
            p.groups
                .iter()
                .any(|g| g.group == "compute" && g.action == wait(&["controller"]))
        );
        let hosts = [
            ("ctl1", "controller", "up"),
            ("db1", "db", "wait"),
            ("cp1", "compute", "wait"),
        ];
        // A list, under the other name: compute waits for db too.
        let p = run(
            r#"{"role_dependencies": {"compute": ["controller", "db"]}}"#,
            &hosts,
        );
        assert_eq!(names(&p.enable_roles), vec!["db"]);
        // A chain: compute waits for db, which waits for controller (done).
        let hosts = [
            ("ctl1", "controller", "up"),
            ("db1", "db", "up"),
            ("cp1", "compute", "wait"),
        ];
        let p = run(r#"{"role_order": {"compute": "db", "db": "controller"}}"#, &hosts);
        assert_eq!(names(&p.enable_roles), vec!["compute"]);
    }

    #[test]
    fn a_failed_dependency_blocks() {
        let hosts = [("ctl1", "controller", "fail"), ("cp1", "compute", "wait")];
        let p = run(
            r#"{"role_order": {"compute": "controller"}, "max_failures": 5}"#,
            &hosts,
        );
        assert!(p.is_empty());
    }

    #[test]
    fn groups_share_one_limit_and_one_order() {
        let hosts = [
            ("stmonleader1", "stmonleader", "going"),
            ("stmon1", "stmon", "wait"),
            ("stmonwithosd1", "stmonwithosd", "wait"),
            ("stmonwithosd2", "stmonwithosd", "wait"),
            ("cp1", "compute", "wait"),
        ];
        let rules = r#"{"group_mappings": {"ceph": ["st.*"]}, "rolling_rules": {"roles": {"ceph": 2}}, "role_order": {"compute": "ceph"}}"#;
        let p = run(rules, &hosts);
        assert_eq!(names(&p.enable_hosts), vec!["stmon1"]);
        assert!(
            p.groups
                .iter()
                .any(|g| g.group == "compute" && g.action == wait(&["ceph"]))
        );
        // A limit given for a role of the group applies to the group.
        let rules = r#"{"group_mappings": {"ceph": "st.*"}, "rolling_rules": {"roles": {"stmon": 3}}}"#;
        let p = run(rules, &hosts);
        assert_eq!(names(&p.enable_hosts), vec!["stmon1", "stmonwithosd1"]);
    }

    #[test]
    fn failures_stop_admission() {
        let hosts = [
            ("cp1", "compute", "fail"),
            ("cp2", "compute", "wait"),
            ("db1", "db", "wait"),
        ];
        let p = run("{}", &hosts);
        assert!(p.stopped_on_failures && p.is_empty());
        let p = run(r#"{"max_failures": 1}"#, &hosts);
        assert!(!p.stopped_on_failures);
        assert_eq!(names(&p.enable_roles), vec!["compute", "db"]);
    }

    #[test]
    fn each_group_says_what_was_done_with_it() {
        let hosts = [
            ("ctl1", "controller", "up"),
            ("cp1", "compute", "wait"),
            ("cp2", "compute", "wait"),
            ("db1", "db", "wait"),
        ];
        let host = |h: &str| HostName::new(h).unwrap();
        let role = |r: &str| Role::new(r).unwrap();
        let cases: [(&str, &[(&str, GroupAction)]); 3] = [
            (
                r#"{"rolling_rules": {"roles": {"compute": 1}}}"#,
                &[
                    (
                        "compute",
                        GroupAction::Admit {
                            hosts: vec![host("cp1")],
                        },
                    ),
                    ("controller", GroupAction::Done),
                    (
                        "db",
                        GroupAction::EnableRoles {
                            roles: vec![role("db")],
                        },
                    ),
                ],
            ),
            (
                r#"{"role_order": {"compute": "db"}}"#,
                &[("compute", wait(&["db"]))],
            ),
            (
                r#"{"rolling_rules": {"global": 0}}"#,
                &[("db", GroupAction::Frozen)],
            ),
        ];
        for (rules, want) in cases {
            let p = run(rules, &hosts);
            for (group, action) in want {
                let got = p.groups.iter().find(|g| g.group == *group).unwrap();
                assert_eq!(&got.action, action, "{rules}: {group}");
            }
        }
        let p = run("{}", &[("cp1", "compute", "fail"), ("cp2", "compute", "wait")]);
        assert_eq!(
            p.groups[0].action,
            GroupAction::StoppedOnFailure {
                failed: 1,
                max_failures: 0
            }
        );
    }

    /// Plans `kvs` (on top of `fleet(hosts)`) under `rules` for a rollout that
    /// started at 1000, at `now`.
    fn run_at(
        rules: &str,
        hosts: &[(&str, &str, &str)],
        extra: &[KeyValue],
        now: u64,
        promoted: bool,
    ) -> Plan {
        let mut kvs = fleet_kvs(hosts);
        kvs.extend(extra.iter().cloned());
        let snap = Snapshot::from_kvs(&Schema::default(), &kvs);
        let statuses = classify(&snap);
        let roles = statuses.iter().map(|h| h.role.clone()).collect();
        let resolved = Rules::parse(rules).unwrap().resolve(&roles).unwrap();
        let rec = record(rules, promoted, None);
        plan(
            &snap,
            &statuses,
            &resolved,
            &Context {
                now,
                rollout: Some(&rec),
                host_keys_only: false,
                busy_outside: &[],
                hook_roles: &[],
            },
        )
    }

    /// Plans `fleet(hosts)` with `extra` keys in rollout `ROLLOUT` (recorded as
    /// current) under `rules`, the computes having maintenance hooks.
    fn run_hooked(rules: &str, hosts: &[(&str, &str, &str)], extra: &[KeyValue], paused: bool) -> Plan {
        let mut rec = record(rules, true, None);
        if paused {
            rec = rec.pause("t", None, None, 1001).unwrap();
        }
        let mut kvs = fleet_kvs(hosts);
        kvs.push(kv("/rollouts/current", ROLLOUT));
        kvs.push(kv(
            &format!("/rollouts/{ROLLOUT}"),
            &serde_json::to_string(&rec).unwrap(),
        ));
        kvs.extend(extra.iter().cloned());
        let snap = Snapshot::from_kvs(&Schema::default(), &kvs);
        let statuses = classify(&snap);
        let roles = statuses.iter().map(|h| h.role.clone()).collect();
        let resolved = Rules::parse(rules).unwrap().resolve(&roles).unwrap();
        let hooked = [Role::new("compute").unwrap()];
        let cx = Context::of_rollout(1100, &rec, false).with_hook_roles(&hooked);
        plan(&snap, &statuses, &resolved, &cx)
    }

    fn hook_kv(h: &str, kind: &str, state: &str) -> KeyValue {
        kv(
            &format!("/hooks/{h}"),
            &format!(
                r#"{{"rollout":"{ROLLOUT}","version":"v2","role":"compute","hook":"{kind}","state":"{state}","started":1050,"driver":"mgmt1-1"}}"#
            ),
        )
    }

    #[test]
    fn hosts_in_their_hooks_hold_slots_and_hooked_roles_go_by_host_keys() {
        let hosts = [
            ("cp1", "compute", "wait"),
            ("cp2", "compute", "wait"),
            ("cp3", "compute", "wait"),
            ("db1", "db", "wait"),
        ];
        let two = r#"{"rolling_rules": {"roles": {"compute": 2}}}"#;
        let two_one_failure = r#"{"rolling_rules": {"roles": {"compute": 2}}, "max_failures": 1}"#;
        // (rules, extra keys) -> compute hosts admitted, compute's in flight, db's action
        let cases: Vec<(&str, Vec<KeyValue>, Vec<&str>, usize)> = vec![
            // Everything would fit, yet the computes go by host keys; db by its role.
            ("{}", vec![], vec!["cp1", "cp2", "cp3"], 0),
            (two, vec![], vec!["cp1", "cp2"], 0),
            (two, vec![hook_kv("cp1", "before", "running")], vec!["cp2"], 1),
            (
                two,
                vec![
                    hook_kv("cp1", "before", "running"),
                    hook_kv("cp2", "after", "running"),
                    kv("/running/versions/v2/cp2", "1"),
                ],
                vec![],
                2,
            ),
            // Upgraded and waiting for its after hook: still in flight.
            (
                two_one_failure,
                vec![
                    hook_kv("cp1", "before", "succeeded"),
                    kv("/running/versions/v2/cp1", "1"),
                    hook_kv("cp2", "before", "failed"),
                ],
                vec![],
                2,
            ),
            // Its after hook succeeded: the slot is free again.
            (
                two,
                vec![
                    hook_kv("cp1", "after", "succeeded"),
                    kv("/running/versions/v2/cp1", "1"),
                ],
                vec!["cp2", "cp3"],
                0,
            ),
        ];
        for (rules, extra, admitted, in_flight) in cases {
            let p = run_hooked(rules, &hosts, &extra, false);
            let case = format!("{rules} {extra:?}");
            let computes: Vec<&str> = p
                .enable_hosts
                .iter()
                .map(|h| h.as_str())
                .filter(|h| h.starts_with("cp"))
                .collect();
            assert_eq!(computes, admitted, "{case}");
            assert_eq!(names(&p.enable_roles), vec!["db"], "{case}");
            let g = p.groups.iter().find(|g| g.group == "compute").unwrap();
            assert_eq!(g.in_flight, in_flight, "{case}: {:?}", p.reasons);
        }
    }

    #[test]
    fn a_drained_host_whose_key_was_reset_is_enabled_again_only_when_nothing_keeps_it_out() {
        let hosts = [("cp1", "compute", "wait"), ("cp2", "compute", "wait")];
        let one = r#"{"rolling_rules": {"roles": {"compute": 1}}}"#;
        let drained = hook_kv("cp1", "before", "succeeded");
        let held = kv("/holds/host/cp1", r#"{"by":"a","reason":null,"at":1}"#);
        // (extra, paused) -> enabled again
        let cases = [
            (vec![drained.clone()], false, true),
            (vec![drained.clone(), held], false, false),
            (vec![drained.clone()], true, false),
            (
                vec![
                    drained.clone(),
                    kv("/config_state/enable_puppet/host/cp1", "true"),
                ],
                false,
                false,
            ),
        ];
        for (extra, paused, again) in cases {
            let p = run_hooked(one, &hosts, &extra, paused);
            let case = format!("{extra:?} paused={paused}");
            assert_eq!(
                p.enable_hosts.iter().any(|h| h.as_str() == "cp1"),
                again,
                "{case}"
            );
            // Never a second host: cp1 keeps its slot either way.
            assert!(!p.enable_hosts.iter().any(|h| h.as_str() == "cp2"), "{case}");
            let g = p.groups.iter().find(|g| g.group == "compute").unwrap();
            assert_eq!(g.in_flight, 1, "{case}");
        }
    }

    #[test]
    fn a_failed_hook_counts_against_max_failures_and_says_which_hook() {
        let hosts = [("cp1", "compute", "wait"), ("cp2", "compute", "wait")];
        let p = run_hooked("{}", &hosts, &[hook_kv("cp1", "before", "failed")], false);
        assert!(p.stopped_on_failures, "{p:?}");
        assert!(p.enable_hosts.is_empty());
        let why = &p.reasons[&HostName::new("cp1").unwrap()];
        assert_eq!(why.code, ReasonCode::Failed);
        assert!(
            why.text.contains("failed: its before hook failed"),
            "{}",
            why.text
        );
        let p = run_hooked(
            r#"{"max_failures": 1}"#,
            &hosts,
            &[hook_kv("cp1", "before", "failed")],
            false,
        );
        assert!(!p.stopped_on_failures);
        assert_eq!(names(&p.enable_hosts), vec!["cp2"]);
    }

    /// The rollout of `run_at`: started at 1000 (`ROLLOUT` is its id).
    fn record(rules: &str, promoted: bool, canaries_done_at: Option<u64>) -> RolloutRecord {
        let mut rec = RolloutRecord::start(
            crate::names::Version::new("v2").unwrap(),
            None,
            serde_json::from_str(rules).unwrap(),
            "t",
            1000,
        );
        if promoted {
            rec.promoted = Some(crate::rollout::Change {
                state: "promoted".into(),
                by: "t".into(),
                at: 1001,
                reason: None,
            });
        }
        rec.canaries_done_at = canaries_done_at;
        rec
    }

    const ROLLOUT: &str = "19700101T001640Z-v2";

    fn result(h: &str, at: u64, checked: Option<u64>) -> KeyValue {
        let c = checked
            .map(|c| format!(r#","checked_at":{c}"#))
            .unwrap_or_default();
        kv(
            &format!("/results/{h}"),
            &format!(r#"{{"version":"v2","ok":true,"at":{at}{c},"rollout":"{ROLLOUT}"}}"#),
        )
    }

    fn code(p: &Plan, h: &str) -> Option<ReasonCode> {
        p.reasons.get(&HostName::new(h).unwrap()).map(|r| r.code)
    }

    #[test]
    fn percentages_round_down_and_slots_are_at_least_one() {
        let four = [
            ("cp1", "compute", "wait"),
            ("cp2", "compute", "wait"),
            ("cp3", "compute", "wait"),
            ("cp4", "compute", "wait"),
        ];
        for (rules, admitted) in [
            (r#"{"rolling_rules": {"roles": {"compute": "50%"}}}"#, 2),
            (r#"{"rolling_rules": {"roles": {"compute": "10%"}}}"#, 1),
            (r#"{"rolling_rules": {"global": "75%"}}"#, 3),
            (r#"{"rolling_rules": {"fleet": "25%"}}"#, 1),
        ] {
            assert_eq!(run(rules, &four).enable_hosts.len(), admitted, "{rules}");
        }
        let failing = [
            ("cp1", "compute", "fail"),
            ("cp2", "compute", "fail"),
            ("cp3", "compute", "wait"),
            ("cp4", "compute", "wait"),
        ];
        assert!(!run(r#"{"max_failures": "50%"}"#, &failing).stopped_on_failures);
        assert!(run(r#"{"max_failures": "25%"}"#, &failing).stopped_on_failures);
        // 10% of 4 hosts is 0: any failure stops.
        assert!(run(r#"{"max_failures": "10%"}"#, &failing[..3]).stopped_on_failures);
    }

    #[test]
    fn the_fleet_cap_spans_groups() {
        let hosts = [
            ("cp1", "compute", "going"),
            ("cp2", "compute", "wait"),
            ("db1", "db", "wait"),
            ("db2", "db", "wait"),
            ("mon1", "mon", "wait"),
        ];
        let p = run(r#"{"rolling_rules": {"global": 2, "fleet": 3}}"#, &hosts);
        // One in flight, two more: compute's last one fits (its role key opens, the
        // slot counted), then db1 by its host key; the cap binds for the rest.
        assert_eq!(names(&p.enable_roles), vec!["compute"]);
        assert_eq!(names(&p.enable_hosts), vec!["db1"]);
        assert_eq!(code(&p, "db2"), Some(ReasonCode::FleetCap));
        assert_eq!(code(&p, "mon1"), Some(ReasonCode::FleetCap));
        assert_eq!(p.fleet_cap, Some(3));
    }

    #[test]
    fn a_soaking_host_keeps_its_slot_until_healthy_long_enough_and_checked() {
        let hosts = [
            ("cp1", "compute", "up"),
            ("cp2", "compute", "wait"),
            ("db1", "db", "wait"),
        ];
        let rules = r#"{"rolling_rules": {"roles": {"compute": 1}}, "min_healthy_time": "60s", "role_order": {"db": "compute"}}"#;
        // Upgraded at 2000: soaking until its agent reports a check passed at 2060 or
        // later (both times on the agent's clock; the driver's `now` plays no part).
        for (now, checked, soaking) in [
            (2030, None, true),
            (2030, Some(2040), true),
            (9999, None, true),
            (9999, Some(2059), true),
            (1, Some(2060), false),
        ] {
            let p = run_at(rules, &hosts, &[result("cp1", 2000, checked)], now, true);
            assert_eq!(!p.soaking.is_empty(), soaking, "at {now}, checked {checked:?}");
            if soaking {
                assert_eq!(code(&p, "cp1"), Some(ReasonCode::Soaking));
                assert_eq!(
                    code(&p, "cp2"),
                    Some(ReasonCode::LimitReached),
                    "it holds the slot"
                );
                assert_eq!(
                    code(&p, "db1"),
                    Some(ReasonCode::WaitingFor),
                    "compute is not done"
                );
                assert!(p.waits_by_design());
            } else {
                assert_eq!(code(&p, "cp2"), Some(ReasonCode::Admitted));
                assert!(!p.is_empty());
            }
        }
        // A run of another rollout: not soaking.
        let other = kv(
            "/results/cp1",
            r#"{"version":"v2","ok":true,"at":2000,"rollout":"19700101T000000Z-v2"}"#,
        );
        assert!(run_at(rules, &hosts, &[other], 2010, true).soaking.is_empty());
        // The safe readings: an unreadable result, or one still for the old version.
        for bad in [
            kv("/results/cp1", "garbage"),
            kv("/results/cp1", r#"{"version":"v1","ok":true,"at":5}"#),
        ] {
            let p = run_at(rules, &hosts, &[bad], 2010, true);
            assert_eq!(code(&p, "cp1"), Some(ReasonCode::Soaking), "{p:?}");
            assert_eq!(code(&p, "cp2"), Some(ReasonCode::LimitReached));
        }
        // Soaking without a live agent: lost, and not a wait by design.
        let mut kvs = vec![result("cp1", 2000, None)];
        let mut p = run_at(rules, &hosts, &kvs, 2010, true);
        assert!(!p.lost_in_flight);
        kvs.push(kv("/agents/cp1", "x"));
        let _ = &mut p;
        let hosts_dead = [("cp2", "compute", "wait")];
        let mut dead = fleet_kvs(&hosts_dead);
        dead.push(kv(
            "/hosts/cp1",
            r#"{"role":"compute","agent_version":"1","addresses":[],"first_seen":1}"#,
        ));
        dead.push(kv("/running/versions/v2/cp1", "1"));
        dead.push(result("cp1", 2000, None));
        let snap = Snapshot::from_kvs(&Schema::default(), &dead);
        let st = classify(&snap);
        let roles = st.iter().map(|h| h.role.clone()).collect();
        let res = Rules::parse(rules).unwrap().resolve(&roles).unwrap();
        let rec = record(rules, true, None);
        let p = plan(
            &snap,
            &st,
            &res,
            &Context {
                now: 2010,
                rollout: Some(&rec),
                host_keys_only: false,
                busy_outside: &[],
                hook_roles: &[],
            },
        );
        assert_eq!(code(&p, "cp1"), Some(ReasonCode::Lost));
        assert!(!p.waits_by_design(), "a lost soaking host is no wait by design");
    }

    #[test]
    fn canaries_go_first_then_soak_then_the_rest() {
        let hosts = [
            ("cp1", "compute", "wait"),
            ("cp2", "compute", "wait"),
            ("cp3", "compute", "wait"),
            ("db1", "db", "wait"),
        ];
        let rules = r#"{"canary": {"compute": 1}, "canary_soak": "10m"}"#;
        // First: one compute; db has no canary and waits.
        let p = run_at(rules, &hosts, &[], 1100, false);
        assert_eq!(names(&p.enable_hosts), vec!["cp1"]);
        assert!(p.enable_roles.is_empty());
        assert_eq!(code(&p, "cp2"), Some(ReasonCode::Canary));
        assert_eq!(code(&p, "db1"), Some(ReasonCode::Canary));
        // cp1 finished: the driver first records that the canaries are done (its
        // clock), then the rest waits the soak from then, then it promotes.
        let up = [
            ("cp1", "compute", "up"),
            ("cp2", "compute", "wait"),
            ("cp3", "compute", "wait"),
            ("db1", "db", "wait"),
        ];
        let p = run_at(rules, &up, &[result("cp1", 1200, None)], 1300, false);
        assert!(p.is_empty());
        let c = p.canary.clone().unwrap();
        assert_eq!((c.mark_done, c.soaked_at, c.promote), (true, None, false));
        let mut kvs = fleet_kvs(&up);
        kvs.push(result("cp1", 1200, None));
        let snap = Snapshot::from_kvs(&Schema::default(), &kvs);
        let st = classify(&snap);
        let roles = st.iter().map(|h| h.role.clone()).collect();
        let res = Rules::parse(rules).unwrap().resolve(&roles).unwrap();
        let rec = record(rules, false, Some(1300));
        let at = |now| {
            plan(
                &snap,
                &st,
                &res,
                &Context {
                    now,
                    rollout: Some(&rec),
                    host_keys_only: false,
                    busy_outside: &[],
                    hook_roles: &[],
                },
            )
        };
        let p = at(1400);
        let c = p.canary.clone().unwrap();
        assert_eq!((c.mark_done, c.soaked_at, c.promote), (false, Some(1900), false));
        assert_eq!(p.wake_at, Some(1900));
        assert!(
            p.reasons[&HostName::new("cp2").unwrap()]
                .text
                .contains("soak until")
        );
        assert!(at(1900).canary.unwrap().promote);
        // A failed canary: no promotion.
        let failed = [("cp1", "compute", "fail"), ("cp2", "compute", "wait")];
        let p = run_at(
            r#"{"canary": 1, "canary_soak": "1m", "max_failures": 1}"#,
            &failed,
            &[],
            5000,
            false,
        );
        assert!(!p.canary.unwrap().promote);
        // Promoted: everything fits, the role key opens.
        let p = run_at(rules, &up, &[result("cp1", 1200, None)], 1300, true);
        assert!(p.canary.is_none());
        assert_eq!(names(&p.enable_roles), vec!["compute", "db"]);
    }

    #[test]
    fn held_and_lost_hosts_are_never_admitted_and_say_why() {
        let hosts = [
            ("cp1", "compute", "wait"),
            ("cp2", "compute", "wait"),
            ("cp3", "compute", "wait"),
        ];
        let extra = [
            kv("/holds/host/cp1", r#"{"by":"alice@l","reason":"disk","at":1}"#),
            kv("/holds/role/db", "garbage"),
        ];
        let mut kvs = extra.to_vec();
        kvs.push(kv(
            "/hosts/db1",
            r#"{"role":"db","agent_version":"1","addresses":[],"first_seen":1}"#,
        ));
        kvs.push(kv("/agents/db1", IDLE));
        let p = run_at("{}", &hosts, &kvs, 2000, true);
        assert_eq!(
            names(&p.enable_hosts),
            vec!["cp2", "cp3"],
            "host keys, not the role key"
        );
        let r = &p.reasons[&HostName::new("cp1").unwrap()];
        assert_eq!(r.code, ReasonCode::Held);
        assert!(r.text.contains("alice@l: disk"), "{}", r.text);
        let r = &p.reasons[&HostName::new("db1").unwrap()];
        assert!(r.text.contains("cannot be read; it still holds"), "{}", r.text);
        assert_eq!(names(&p.held), vec!["cp1", "db1"]);
        // A pending host without an agent: lost, never admitted.
        let mut kvs: Vec<KeyValue> = Vec::new();
        for h in ["cp1", "cp2"] {
            kvs.push(kv(
                &format!("/hosts/{h}"),
                r#"{"role":"compute","agent_version":"1","addresses":[],"first_seen":1}"#,
            ));
        }
        kvs.push(kv("/agents/cp1", IDLE));
        kvs.push(kv("/current_version", "v2"));
        kvs.push(kv("/config_state/enable_puppet/global", "false"));
        let snap = Snapshot::from_kvs(&Schema::default(), &kvs);
        let st = classify(&snap);
        let roles = st.iter().map(|h| h.role.clone()).collect();
        let r = Rules::parse("{}").unwrap().resolve(&roles).unwrap();
        let p = plan(&snap, &st, &r, &Context::default());
        assert_eq!(names(&p.enable_hosts), vec!["cp1"]);
        assert_eq!(code(&p, "cp2"), Some(ReasonCode::Lost));
        assert_eq!(code(&p, "cp1"), Some(ReasonCode::Admitted));
    }
}
