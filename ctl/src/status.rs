//! The fleet's status for people and programs: the table and the JSON (pure; the
//! `status` command prints them).

use std::collections::BTreeMap;

use jio_common::fleet::{self, HostState, HostStatus, Snapshot};
use jio_common::names::{HostName, Role};
use jio_common::plan::GroupAction;
use jio_common::plan::{self, Context as PlanContext, Plan, Reason, ReasonCode};
use jio_common::rollout::RolloutState;
use jio_common::rules::Rules;

pub use crate::status_view::Layout;
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

/// Where the view was read: the store, and its key prefix when there is one (two
/// fleets in one etcd look different).
pub fn store_label(url: &str, schema: &jio_common::keys::Schema) -> String {
    match schema.prefix().trim_matches('/') {
        "" => url.to_string(),
        p => format!("{url}  prefix: /{p}"),
    }
}

/// The view for people: the header, then `status_view`'s body laid out by `l`.
pub fn to_text(snap: &Snapshot, hosts: &[HostStatus], adm: &Admission, store: &str, l: Layout) -> String {
    let mut s = header(snap, store, l);
    let down = upgraded_without_agent(snap, hosts);
    if !down.is_empty() {
        let line = format!(
            "agents down on {} upgraded host(s): {} (no /agents record: no health checks or repairs run there, and the next version will find it lost)",
            down.len(),
            crate::render::names_fit(down.iter().map(|h| h.to_string()), 3)
        );
        push_folded(&mut s, &line, l);
    }
    if let Some(p) = &adm.problem {
        push_folded(&mut s, &format!("warning: {p}"), l);
    }
    if let Some(line) = adm.plan.as_ref().and_then(window_line) {
        push_folded(&mut s, &line, l);
    }
    if let Some(c) = &adm.composed {
        s.push_str(&crate::render::stages(c));
    }
    let (group_of, _) = groups(snap, &fleet::classify(snap));
    let input = crate::status_view::Input {
        snap,
        hosts,
        reasons: &adm.reasons,
        group_of: &group_of,
        groups: adm.plan.as_ref().map_or(&[], |p| &p.groups),
    };
    for line in crate::status_view::body(&input, l) {
        s.push_str(&line);
        s.push('\n');
    }
    if hosts.iter().any(|h| h.state == HostState::Unknown) {
        push_folded(
            &mut s,
            "no /current_version is set: no host can be said to be upgraded (`jioctl upgrade VERSION` sets it and rolls it out)",
            l,
        );
    }
    s
}

/// `line` folded to the layout's width, and a newline.
fn push_folded(s: &mut String, line: &str, l: Layout) {
    for part in crate::status_view::fold(line, 2, l.width) {
        s.push_str(&part);
        s.push('\n');
    }
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

/// Problems and clock warnings listed one by one before `+N more`.
const WARNINGS: usize = 10;

/// The version, the store, the lock holder, an emergency stop and the problems.
fn header(snap: &Snapshot, store: &str, l: Layout) -> String {
    let mut s = String::new();
    let cur = match (&snap.current, &snap.current_invalid) {
        (Some(v), _) => v.to_string(),
        (None, Some(why)) => format!("(invalid: {why})"),
        (None, None) => "(not set)".into(),
    };
    let mut lines = vec![format!("current version: {cur}    store: {store}")];
    if let Some(lock) = &snap.lock {
        lines.push(format!(
            "rollout driven by {}",
            crate::writes::describe(&Some(lock.clone()))
        ));
    }
    if let Some((by, _)) = &snap.halt {
        lines.push(format!(
            "emergency stop: {} ran global-disable-puppet; `jioctl upgrade` starts a new rollout",
            crate::writes::describe(&Some(by.clone()))
        ));
    }
    lines.extend(undriven_line(snap));
    lines.extend(rollout_lines(snap));
    let warnings: Vec<String> = snap
        .problems
        .iter()
        .map(|p| format!("warning: {p}"))
        .chain(
            skewed_agents(snap, jio_common::time::unix_now_ms())
                .into_iter()
                .map(|(h, skew)| format!("warning: {h}: {}", skew.describe())),
        )
        .collect();
    let shown = if l.wide {
        warnings.len()
    } else {
        warnings.len().min(WARNINGS)
    };
    lines.extend(warnings[..shown].iter().cloned());
    if warnings.len() > shown {
        lines.push(format!(
            "+{} more warnings (jioctl status --hosts lists them all)",
            warnings.len() - shown
        ));
    }
    for line in lines {
        push_folded(&mut s, &line, l);
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
            let mut held: Vec<(&String, &String)> = holding.iter().collect();
            // The hosts in flight or lost first: the pending ones only wait.
            held.sort_by(|a, b| {
                let pending = |why: &str| why.starts_with("pending");
                pending(a.1)
                    .cmp(&pending(b.1))
                    .then_with(|| jio_common::names::natural_cmp(a.0, b.0))
            });
            out.push(format!(
                "stuck: no host finished within its progress_deadline; held by {}",
                crate::render::names_fit(held.iter().map(|(h, why)| format!("{h} ({why})")), 3)
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

/// ` --stage a,b` when `r` is a composable rollout of some of its stages: what
/// continues it without starting the others.
pub fn stage_args(r: &jio_common::rollout::RolloutRecord) -> String {
    if r.stages.is_empty() {
        String::new()
    } else {
        format!(" --stage {}", r.stages.join(","))
    }
}
