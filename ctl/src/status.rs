//! The fleet's status for people and programs: the table and the JSON (pure; the
//! `status` command prints them).

use std::collections::BTreeMap;

use jio_common::fleet::{self, HostState, HostStatus, Snapshot};
use jio_common::names::{HostName, Role};
use jio_common::plan::GroupAction;
use jio_common::plan::{self, Context as PlanContext, Plan, Reason, ReasonCode};
use jio_common::rollout::RolloutState;
use jio_common::rules::Rules;
use serde_json::{Value, json};

/// The active rollout's record (with its rules digest), or why it cannot be used.
pub fn rollout_json(snap: &Snapshot) -> Value {
    match &snap.rollout {
        None => Value::Null,
        Some(c) => match &c.record {
            Ok(r) => {
                let mut v = json!(r);
                v["rules_digest"] = json!(r.rules_digest());
                v
            }
            Err(e) => json!({"id": c.id, "error": e}),
        },
    }
}

/// A status leaf's value is a link to the run's logs when it looks like one;
/// otherwise it is the agent's reason for the failure (or empty).
pub fn is_link(value: &str) -> bool {
    value.starts_with("http://") || value.starts_with("https://")
}

/// A failure entry's value for people: the link, the reason, or that there is none.
pub fn describe_entry(value: &str) -> String {
    if value.is_empty() {
        "(no log link, no reason recorded)".into()
    } else if is_link(value) {
        value.to_string()
    } else {
        format!("reason: {value}")
    }
}

/// Filters to one role.
pub fn only_role(hosts: Vec<HostStatus>, role: Option<&Role>) -> Vec<HostStatus> {
    match role {
        Some(r) => hosts.into_iter().filter(|h| &h.role == r).collect(),
        None => hosts,
    }
}

/// The human table.
pub fn to_text(snap: &Snapshot, hosts: &[HostStatus], adm: &Admission, store: &str) -> String {
    let mut s = header(snap, store);
    let down = upgraded_without_agent(snap, hosts);
    if !down.is_empty() {
        s.push_str(&format!(
            "agents down on {} upgraded host(s): {} (no /agents record: no health checks or repairs run there, and the next version will find it lost)\n",
            down.len(),
            crate::render::first_names(&down)
        ));
    }
    if let Some(p) = &adm.problem {
        s.push_str(&format!("warning: {p}\n"));
    }
    if let Some(line) = adm.plan.as_ref().and_then(window_line) {
        s.push_str(&line);
        s.push('\n');
    }
    if let Some(c) = &adm.composed {
        s.push_str(&crate::render::stages(c));
    }
    table(&mut s, hosts);
    explained(&mut s, hosts, &adm.reasons);
    s
}

/// The groups waiting for their maintenance window, and when it opens.
fn window_line(p: &Plan) -> Option<String> {
    let closed: Vec<String> = p
        .groups
        .iter()
        .filter_map(|g| match g.action {
            GroupAction::OutsideWindow { opens_at } => Some(format!(
                "{} (opens at {})",
                g.group,
                opens_at.map_or("no time in the coming week".into(), plan::when)
            )),
            _ => None,
        })
        .collect();
    (!closed.is_empty()).then(|| format!("maintenance window closed for: {}", closed.join(", ")))
}

/// Why every host stands where it does, from the planner under the active
/// rollout's rules (or, with none active, under no rules: what holds hosts back
/// besides the rules), at `now`.
pub struct Admission {
    pub reasons: BTreeMap<HostName, Reason>,
    pub plan: Option<Plan>,
    /// A composable rollout's stages and finalize step, as its driver sees them.
    pub composed: Option<jio_common::compose::Composed>,
    /// The rollout's rules cannot be used for this fleet: why.
    pub problem: Option<String>,
}

/// The groups the limits apply to, as the active rollout's rules make them (each
/// role its own group without a rollout, or when its rules do not fit the fleet),
/// with the rules resolved (`None`: not even the defaults resolve).
pub fn groups(
    snap: &Snapshot,
    hosts: &[HostStatus],
) -> (BTreeMap<Role, String>, Option<jio_common::rules::Resolved>) {
    let roles = hosts.iter().map(|h| h.role.clone()).collect();
    let rules = snap
        .rollout
        .as_ref()
        .and_then(|c| c.ok())
        .filter(|r| r.state.active())
        .and_then(|r| Rules::parse(&r.rules.to_string()).ok());
    let resolved = rules
        .and_then(|r| r.resolve(&roles).ok())
        .or_else(|| Rules::default().resolve(&roles).ok());
    match resolved {
        Some(r) => (r.group_of.clone(), Some(r)),
        None => (
            hosts
                .iter()
                .map(|h| (h.role.clone(), h.role.to_string()))
                .collect(),
            None,
        ),
    }
}

pub fn admission(snap: &Snapshot, now: u64) -> Admission {
    admission_of(snap, &fleet::classify(snap), now)
}

/// `admission`, with the whole fleet already classified (`fleet::classify`).
pub fn admission_of(snap: &Snapshot, hosts: &[HostStatus], now: u64) -> Admission {
    let active = snap
        .rollout
        .as_ref()
        .and_then(|c| c.ok())
        .filter(|r| r.state.active());
    // The active rollout's rules, parsed once for this view.
    let rules = active.map(|r| Rules::parse(&r.rules.to_string()));
    let InForce {
        resolved,
        mut unusable,
        problem,
    } = match rules_in_force(snap, rules.as_ref(), hosts) {
        Ok(in_force) => in_force,
        Err(problem) => {
            return Admission {
                reasons: BTreeMap::new(),
                plan: None,
                composed: None,
                problem: Some(problem),
            };
        }
    };
    let parsed = rules.as_ref().and_then(|r| r.as_ref().ok());
    if let (Some(r), Some(rules)) = (active, parsed)
        && unusable.is_none()
    {
        unusable = unclear_intent(r, rules, &resolved, hosts);
    }
    // The roles with hooks, as this rollout's hook records show them (a reader's
    // configuration need not have the driver's).
    let hooked: Vec<Role> = snap
        .hooks
        .values()
        .filter(|r| Some(r.rollout.as_str()) == snap.active_rollout_id())
        .map(|r| r.role.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let cx = PlanContext {
        now,
        rollout: if problem.is_some() { None } else { active },
        host_keys_only: false,
        busy_outside: &[],
        hook_roles: &hooked,
    };
    let plan = plan::plan(snap, hosts, &resolved, &cx);
    let composed = match (active, parsed.and_then(|r| r.compose.as_ref())) {
        (Some(r), Some(c)) if problem.is_none() => Some(composed(snap, r, c, &resolved, now)),
        _ => None,
    };
    // A composable rollout: each host's reason is its phase's.
    let mut reasons = composed
        .as_ref()
        .map_or_else(|| plan.reasons.clone(), |c| c.plan.reasons.clone());
    for r in reasons.values_mut().filter(|r| r.code == ReasonCode::Admitted) {
        not_admitted_after_all(r, unusable.as_deref(), active.is_some(), snap);
    }
    Admission {
        reasons,
        plan: if problem.is_some() { None } else { Some(plan) },
        composed,
        problem,
    }
}

/// The rules the planner works under, and why they admit nothing, if so.
struct InForce {
    resolved: jio_common::rules::Resolved,
    /// Why nothing is admitted whatever the plan says, when the rollout or its
    /// rules cannot be used; the reasons then come from the planner under no rules.
    unusable: Option<String>,
    /// The rollout's rules do not fit the fleet: why.
    problem: Option<String>,
}

/// The active rollout's rules (`active`; the defaults without one) resolved for the
/// fleet, or the defaults when they do not fit (`Err`: not even those resolve;
/// why the rules do not fit).
fn rules_in_force(
    snap: &Snapshot,
    active: Option<&Result<Rules, jio_common::rules::RulesError>>,
    hosts: &[HostStatus],
) -> Result<InForce, String> {
    let roles = hosts.iter().map(|h| h.role.clone()).collect();
    let unusable = snap
        .rollout
        .as_ref()
        .and_then(|c| c.record.as_ref().err())
        .map(|e| {
            format!(
                "the active rollout cannot be used ({e}): nothing is admitted until it is fixed or aborted"
            )
        });
    let resolved = match active {
        Some(Ok(rules)) => rules.resolve(&roles),
        Some(Err(e)) => Err(e.clone()),
        None => Rules::default().resolve(&roles),
    };
    match resolved {
        Ok(resolved) => Ok(InForce {
            resolved,
            unusable,
            problem: None,
        }),
        Err(e) => {
            let p = format!("the rollout's rules do not fit the fleet: {e}");
            let Ok(resolved) = Rules::default().resolve(&roles) else {
                return Err(p);
            };
            Ok(InForce {
                resolved,
                unusable: Some(format!("{p}; nothing is admitted")),
                problem: Some(p),
            })
        }
    }
}

/// The check every driver makes on every pass: rules whose intent is unclear
/// admit nothing unless forced. `Some`: why nothing is admitted.
fn unclear_intent(
    r: &jio_common::rollout::RolloutRecord,
    rules: &Rules,
    resolved: &jio_common::rules::Resolved,
    hosts: &[HostStatus],
) -> Option<String> {
    if rules.compose.is_some() {
        return None;
    }
    let moving = hosts.iter().filter(|h| h.state != HostState::Upgraded).count();
    jio_common::rules::check_intent(resolved, rules.sets_no_limit().then_some(moving), r.forced)
        .err()
        .map(|e| jio_common::rules::admits_nothing(&e))
}

/// A host the plan admits, as nobody admits it after all: the rollout cannot be
/// used (`unusable`), there is none (`!active`), or nobody drives it.
fn not_admitted_after_all(r: &mut Reason, unusable: Option<&str>, active: bool, snap: &Snapshot) {
    match (unusable, active) {
        (Some(why), _) => {
            r.code = ReasonCode::Unusable;
            r.text = why.to_string();
        }
        // Nothing drives pending hosts without a rollout: say so.
        (None, false) => {
            r.code = ReasonCode::WaitingFor;
            r.text = "pending: no rollout is active (`jioctl upgrade VERSION` starts one)".into();
        }
        // The plan is a read-only view: with nobody to drive the rollout, no
        // driver's pass admits the host.
        (None, true) if undriven_line(snap).is_some() => {
            r.code = ReasonCode::WaitingFor;
            r.text = "would be admitted by a driver's next pass, but no driver is running (`jioctl drive`, or `jioctl upgrade` with the same rules)".into();
        }
        (None, true) => {}
    }
}

/// The active composable rollout `r` (whose rules hold `c`) as its driver plans it
/// now.
fn composed(
    snap: &Snapshot,
    r: &jio_common::rollout::RolloutRecord,
    c: &jio_common::compose_rules::Compose,
    resolved: &jio_common::rules::Resolved,
    now: u64,
) -> jio_common::compose::Composed {
    let cx = PlanContext::of_rollout(now, r, true);
    jio_common::compose::plan(snap, c, resolved, &cx)
}

/// The version, the store, the lock holder, an emergency stop and the problems.
fn header(snap: &Snapshot, store: &str) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let cur = match (&snap.current, &snap.current_invalid) {
        (Some(v), _) => v.to_string(),
        (None, Some(why)) => format!("(invalid: {why})"),
        (None, None) => "(not set)".into(),
    };
    let _ = writeln!(s, "current version: {cur}    store: {store}");
    if let Some(l) = &snap.lock {
        let _ = writeln!(
            s,
            "rollout driven by {}",
            crate::writes::describe(&Some(l.clone()))
        );
    }
    if let Some((by, _)) = &snap.halt {
        let _ = writeln!(
            s,
            "emergency stop: {} ran global-disable-puppet; `jioctl upgrade` starts a new rollout",
            crate::writes::describe(&Some(by.clone()))
        );
    }
    if let Some(line) = undriven_line(snap) {
        let _ = writeln!(s, "{line}");
    }
    for line in rollout_lines(snap) {
        let _ = writeln!(s, "{line}");
    }
    for p in &snap.problems {
        let _ = writeln!(s, "warning: {p}");
    }
    for (h, skew) in skewed_agents(snap, jio_common::time::unix_now_ms()) {
        let _ = writeln!(s, "warning: {h}: {}", skew.describe());
    }
    s
}

/// The active rollout has nobody to drive it (no process holds the rollout lock and
/// no driver service runs): nothing is admitted, however calm the table looks.
pub fn undriven_line(snap: &Snapshot) -> Option<String> {
    let r = snap.rollout.as_ref()?.ok()?;
    if !r.state.active() || snap.lock.is_some() || !snap.drivers.is_empty() {
        return None;
    }
    Some(format!(
        "NOT DRIVEN: rollout {} is {} but no driver is running, so no host is admitted; start `jioctl drive`, or run `jioctl upgrade {}{}` with the same rules",
        r.id,
        r.state.name(),
        r.version,
        stage_args(r)
    ))
}

/// Upgraded hosts whose agent is not alive.
pub fn upgraded_without_agent<'a>(snap: &Snapshot, hosts: &'a [HostStatus]) -> Vec<&'a HostName> {
    hosts
        .iter()
        .filter(|h| h.state == HostState::Upgraded && !snap.agents.contains_key(&h.host))
        .map(|h| &h.host)
        .collect()
}

/// Agents whose clock is off this one's by more than the tolerance.
pub fn skewed_agents(snap: &Snapshot, now_ms: u64) -> Vec<(&HostName, jio_common::values::Skew)> {
    snap.clocks
        .iter()
        .filter_map(|(h, c)| Some((h, jio_common::values::Skew::of(*c, now_ms)?)))
        .collect()
}

/// The active rollout: its state, and what it waits for when it cannot move
/// without an operator.
pub fn rollout_lines(snap: &Snapshot) -> Vec<String> {
    let Some(cur) = &snap.rollout else {
        return vec![];
    };
    let Some(r) = cur.ok() else {
        return vec![format!(
            "rollout {}: its record cannot be used (see the warning)",
            cur.id
        )];
    };
    let mut out = vec![format!(
        "rollout {} to {}: {}, started by {} at {} (rules {})",
        r.id,
        r.version,
        r.state.name(),
        r.started_by(),
        jio_common::time::utc_display(r.started_at()),
        r.rules_digest()
    )];
    let hosts = fleet::classify(snap);
    match &r.state {
        RolloutState::Paused { .. } => {
            let in_flight = hosts
                .iter()
                .filter(|h| matches!(h.state, HostState::Upgrading | HostState::Lost))
                .count();
            out.push(crate::render::paused_line(r, in_flight));
        }
        RolloutState::Stuck { holding } => {
            out.push(format!(
                "stuck: no host finished within its progress_deadline; held by {}",
                holding
                    .iter()
                    .map(|(h, why)| format!("{h} ({why})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        _ => {}
    }
    let roles = hosts.iter().map(|h| h.role.clone()).collect();
    let rules = Rules::parse(&r.rules.to_string());
    let composable = rules.as_ref().is_ok_and(|r| r.compose.is_some());
    let plan = rules.and_then(|rules| rules.resolve(&roles)).map(|resolved| {
        let cx = PlanContext::of_rollout(jio_common::time::unix_now(), r, false);
        jio_common::plan::plan(snap, &hosts, &resolved, &cx)
    });
    match plan {
        Ok(p) if !composable && jio_common::plan::waits_forever(&hosts, &p) && r.state.name() != "paused" => {
            out.push(format!(
                "waiting forever: {}",
                crate::render::waiting_line_forever(&hosts, &p)
            ));
        }
        Ok(_) => {}
        Err(e) => out.push(format!("its rules no longer fit the fleet: {e}")),
    }
    out
}

/// The counts per role (a BLOCKED column only when a host is blocked).
fn table(s: &mut String, hosts: &[HostStatus]) {
    use std::fmt::Write as _;
    let mut per_role: BTreeMap<&Role, BTreeMap<HostState, usize>> = BTreeMap::new();
    for h in hosts {
        *per_role.entry(&h.role).or_default().entry(h.state).or_default() += 1;
    }
    let any_blocked = hosts.iter().any(|h| h.state == HostState::Blocked);
    let any_unknown = hosts.iter().any(|h| h.state == HostState::Unknown);
    let _ = writeln!(
        s,
        "{:<20} {:>9} {:>9} {:>7} {:>8} {:>5}{}{}",
        "ROLE",
        "UPGRADED",
        "UPGRADING",
        "FAILED",
        "PENDING",
        "LOST",
        if any_blocked { "  BLOCKED" } else { "" },
        if any_unknown { "  UNKNOWN" } else { "" }
    );
    for (role, counts) in &per_role {
        let c = |st| counts.get(&st).copied().unwrap_or(0);
        let total: usize = counts.values().sum();
        let _ = writeln!(
            s,
            "{:<20} {:>9} {:>9} {:>7} {:>8} {:>5}{}{}",
            role.as_str(),
            format!("{}/{}", c(HostState::Upgraded), total),
            c(HostState::Upgrading),
            c(HostState::Failed),
            c(HostState::Pending),
            c(HostState::Lost),
            if any_blocked {
                format!("  {:>7}", c(HostState::Blocked))
            } else {
                String::new()
            },
            if any_unknown {
                format!("  {:>7}", c(HostState::Unknown))
            } else {
                String::new()
            }
        );
    }
    if hosts.is_empty() {
        let _ = writeln!(s, "(no hosts)");
    }
    if any_unknown {
        let _ = writeln!(
            s,
            "no /current_version is set: no host can be said to be upgraded (`jioctl upgrade VERSION` sets it and rolls it out)"
        );
    }
}

/// One line per host with a reason (every host not upgraded, and soaking ones):
/// HOST, ROLE, STATE and REASON.
fn explained(s: &mut String, hosts: &[HostStatus], reasons: &BTreeMap<HostName, Reason>) {
    use std::fmt::Write as _;
    let rows: Vec<(&HostStatus, &Reason)> = hosts
        .iter()
        .filter_map(|h| reasons.get(&h.host).map(|r| (h, r)))
        .collect();
    if rows.is_empty() {
        return;
    }
    let w = rows
        .iter()
        .map(|(h, _)| h.host.as_str().len())
        .max()
        .unwrap_or(4)
        .max(4);
    let rw = rows
        .iter()
        .map(|(h, _)| h.role.as_str().len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(s, "\n{:<w$}  {:<rw$}  {:<9}  REASON", "HOST", "ROLE", "STATE");
    let mut rows = rows;
    rows.sort_by_key(|(h, r)| (state_rank(h.state, r), h.host.clone()));
    for (h, r) in rows {
        let state = if r.code == ReasonCode::Soaking {
            "soaking"
        } else {
            h.state.as_str()
        };
        let _ = writeln!(
            s,
            "{:<w$}  {:<rw$}  {:<9}  {}",
            h.host.as_str(),
            h.role.as_str(),
            state,
            r.text
        );
    }
}

/// Failed and lost hosts first, then moving ones, then the waiting ones.
fn state_rank(st: HostState, r: &Reason) -> u8 {
    match st {
        HostState::Failed => 0,
        HostState::Lost => 1,
        HostState::Blocked => 2,
        HostState::Upgrading => 3,
        HostState::Upgraded if r.code == ReasonCode::Soaking => 4,
        _ => 5,
    }
}

/// ` --stage a,b` when `r` is a composable rollout of some of its stages: what
/// continues it without starting the others.
pub fn stage_args(r: &jio_common::rollout::RolloutRecord) -> String {
    if r.stages.is_empty() {
        String::new()
    } else {
        format!(" --stage {}", r.stages.join(","))
    }
}
