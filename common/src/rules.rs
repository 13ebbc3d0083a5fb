//! Upgrade rules (the instructions JSON) and the planner: a pure function from the
//! fleet's status and the rules to the enable keys to write.
//!
//! The rules are those of the design documents: `rolling_rules` (how many hosts of a
//! role may be in flight), `role_order` / `role_dependencies` (roles that wait for
//! other roles), `group_mappings` (regexes that make several roles one group), plus
//! `max_failures`. Parsing reports every problem at once; nothing here does I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use regex::Regex;
use serde_json::Value;

use crate::fleet::{HostState, HostStatus, Snapshot};
use crate::names::{HostName, Role};

/// The rules were rejected: one line per problem, each naming the value and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid rules: {}", .0.join("; "))]
pub struct RulesError(pub Vec<String>);

/// One group of `group_mappings`.
#[derive(Debug, Clone)]
pub struct GroupRule {
    pub name: String,
    pub patterns: Vec<Regex>,
}

/// Parsed rules.
#[derive(Debug, Clone)]
pub struct Rules {
    /// `rolling_rules.global`: the limit of every group without its own.
    pub global_limit: Option<u64>,
    /// `rolling_rules.roles`: limits by group or role name.
    pub limits: BTreeMap<String, u64>,
    /// `role_order`: name → the names it waits for.
    pub order: BTreeMap<String, Vec<String>>,
    pub groups: Vec<GroupRule>,
    /// Failed hosts tolerated before no new host is admitted (default 0).
    pub max_failures: u64,
    /// `progress_deadline`: how long a rollout may go without any host finishing
    /// while hosts are in flight or waiting, before it is marked stuck.
    pub progress_deadline: Duration,
}

/// The default `progress_deadline`.
pub const PROGRESS_DEADLINE: Duration = Duration::from_secs(3600);

impl Default for Rules {
    fn default() -> Rules {
        Rules {
            global_limit: None,
            limits: BTreeMap::new(),
            order: BTreeMap::new(),
            groups: Vec::new(),
            max_failures: 0,
            progress_deadline: PROGRESS_DEADLINE,
        }
    }
}

const TOP_KEYS: &[&str] = &[
    "rolling_rules",
    "role_order",
    "role_dependencies",
    "group_mappings",
    "max_failures",
    "progress_deadline",
];

fn count(path: &str, v: &Value, errors: &mut Vec<String>) -> Option<u64> {
    match v.as_u64() {
        Some(n) if n <= u32::MAX as u64 => Some(n),
        _ => {
            errors.push(format!(
                "{path}: {v} is not a count (a whole number from 0 to {})",
                u32::MAX
            ));
            None
        }
    }
}

fn name(path: &str, n: &str, errors: &mut Vec<String>) -> bool {
    match Role::new(n) {
        Ok(_) => true,
        Err(e) => {
            errors.push(format!("{path}: {e}"));
            false
        }
    }
}

/// One string or a list of strings.
fn strings(path: &str, v: &Value, errors: &mut Vec<String>) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_string) => {
            a.iter().filter_map(|x| x.as_str().map(String::from)).collect()
        }
        other => {
            errors.push(format!(
                "{path}: {other} must be a string or a non-empty list of strings"
            ));
            Vec::new()
        }
    }
}

impl Rules {
    /// Parses the instructions JSON.
    pub fn parse(text: &str) -> Result<Rules, RulesError> {
        let v = strict_json(text).map_err(|e| RulesError(vec![format!("malformed JSON: {e}")]))?;
        let Value::Object(top) = v else {
            return Err(RulesError(vec![format!(
                "the rules must be a JSON object, not {v}"
            )]));
        };
        let mut errors = Vec::new();
        let mut rules = Rules::default();
        for k in top.keys() {
            if !TOP_KEYS.contains(&k.as_str()) {
                errors.push(format!("unknown key {k:?} (allowed: {})", TOP_KEYS.join(", ")));
            }
        }
        if let Some(rr) = top.get("rolling_rules") {
            match rr {
                Value::Object(o) => {
                    for (k, v) in o {
                        match k.as_str() {
                            "global" => rules.global_limit = count("rolling_rules.global", v, &mut errors),
                            "roles" => match v {
                                Value::Object(roles) => {
                                    for (r, n) in roles {
                                        let path = format!("rolling_rules.roles.{r}");
                                        if name(&path, r, &mut errors)
                                            && let Some(n) = count(&path, n, &mut errors)
                                        {
                                            rules.limits.insert(r.clone(), n);
                                        }
                                    }
                                }
                                other => errors.push(format!(
                                    "rolling_rules.roles: {other} must be an object of counts"
                                )),
                            },
                            other => errors.push(format!(
                                "rolling_rules: unknown key {other:?} (allowed: global, roles)"
                            )),
                        }
                    }
                }
                other => errors.push(format!("rolling_rules: {other} must be an object")),
            }
        }
        let order = match (top.get("role_order"), top.get("role_dependencies")) {
            (Some(_), Some(_)) => {
                errors.push("role_order and role_dependencies are the same rule; give only one".into());
                None
            }
            (Some(o), None) => Some(("role_order", o)),
            (None, Some(o)) => Some(("role_dependencies", o)),
            (None, None) => None,
        };
        if let Some((key, o)) = order {
            match o {
                Value::Object(o) => {
                    for (r, deps) in o {
                        let path = format!("{key}.{r}");
                        if name(&path, r, &mut errors) {
                            let deps = strings(&path, deps, &mut errors);
                            for d in &deps {
                                name(&path, d, &mut errors);
                            }
                            rules.order.insert(r.clone(), deps);
                        }
                    }
                }
                other => errors.push(format!("{key}: {other} must be an object")),
            }
        }
        if let Some(g) = top.get("group_mappings") {
            match g {
                Value::Object(o) => {
                    for (group, pats) in o {
                        let path = format!("group_mappings.{group}");
                        if !name(&path, group, &mut errors) {
                            continue;
                        }
                        let mut patterns = Vec::new();
                        for p in strings(&path, pats, &mut errors) {
                            // Anchored at the start, like Python's re.match in the original.
                            match Regex::new(&format!("^(?:{p})")) {
                                Ok(re) => patterns.push(re),
                                Err(e) => errors.push(format!(
                                    "{path}: {p:?} is not a valid regex: {}",
                                    e.to_string().lines().last().unwrap_or_default().trim()
                                )),
                            }
                        }
                        rules.groups.push(GroupRule {
                            name: group.clone(),
                            patterns,
                        });
                    }
                }
                other => errors.push(format!("group_mappings: {other} must be an object")),
            }
        }
        if let Some(m) = top.get("max_failures") {
            rules.max_failures = count("max_failures", m, &mut errors).unwrap_or(0);
        }
        if let Some(d) = top.get("progress_deadline") {
            match d.as_str().map(crate::duration::parse) {
                Some(Ok(d)) if !d.is_zero() => rules.progress_deadline = d,
                Some(Ok(_)) => errors.push("progress_deadline: must be longer than 0".into()),
                Some(Err(e)) => errors.push(format!("progress_deadline: {e}")),
                None => errors.push(format!(
                    "progress_deadline: {d} must be a duration such as \"30m\" or \"2h\""
                )),
            }
        }
        if let Some(cycle) = find_cycle(&rules.order) {
            errors.push(format!("role_order has a cycle: {}", cycle.join(" -> ")));
        }
        if errors.is_empty() {
            Ok(rules)
        } else {
            Err(RulesError(errors))
        }
    }

    /// The group a role belongs to: the one whose pattern matches it, else its own.
    fn group_of(&self, role: &Role) -> Result<String, String> {
        let matched: Vec<&str> = self
            .groups
            .iter()
            .filter(|g| g.patterns.iter().any(|p| p.is_match(role.as_str())))
            .map(|g| g.name.as_str())
            .collect();
        match matched.as_slice() {
            [] => Ok(role.to_string()),
            [one] => Ok(one.to_string()),
            many => Err(format!(
                "group_mappings: role {:?} matches more than one group ({}); a role belongs to one group",
                role.as_str(),
                many.join(", ")
            )),
        }
    }

    /// Checks the rules against the fleet's roles: groups, order between groups.
    pub fn resolve(&self, roles: &BTreeSet<Role>) -> Result<Resolved, RulesError> {
        let mut errors = Vec::new();
        let mut warnings = Vec::new();
        let mut group_of = BTreeMap::new();
        for r in roles {
            match self.group_of(r) {
                Ok(g) => {
                    group_of.insert(r.clone(), g);
                }
                Err(e) => errors.push(e),
            }
        }
        let groups: BTreeSet<String> = group_of.values().cloned().collect();
        // A name in the rules is a group name, or a role (standing for its group).
        let lookup = |n: &str| -> Option<String> {
            if groups.contains(n) {
                return Some(n.to_string());
            }
            Role::new(n).ok().and_then(|r| group_of.get(&r).cloned())
        };
        for n in self.limits.keys() {
            if lookup(n).is_none() {
                warnings.push(format!("rolling_rules.roles names {n:?}, which has no hosts"));
            }
        }
        for g in &self.groups {
            if !groups.contains(&g.name) {
                warnings.push(format!("group_mappings.{} matches no role of any host", g.name));
            }
        }
        let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (n, ds) in &self.order {
            let Some(g) = lookup(n) else {
                warnings.push(format!("role_order names {n:?}, which has no hosts"));
                continue;
            };
            for d in ds {
                match lookup(d) {
                    None => warnings.push(format!("role_order: {n:?} waits for {d:?}, which has no hosts")),
                    Some(dg) if dg == g => errors.push(format!(
                        "role_order: {n:?} waits for {d:?}, but both are in group {g:?}: the group would wait for itself"
                    )),
                    Some(dg) => {
                        deps.entry(g.clone()).or_default().insert(dg);
                    }
                }
            }
        }
        let graph: BTreeMap<String, Vec<String>> = deps
            .iter()
            .map(|(k, v)| (k.clone(), v.iter().cloned().collect()))
            .collect();
        if let Some(c) = find_cycle(&graph) {
            errors.push(format!(
                "role_order has a cycle between groups: {}",
                c.join(" -> ")
            ));
        }
        if !errors.is_empty() {
            return Err(RulesError(errors));
        }
        let limits = groups
            .iter()
            .map(|g| {
                // A group's own number, else one given for a role in it, else global.
                let own = self.limits.get(g).copied().or_else(|| {
                    group_of
                        .iter()
                        .filter(|(_, rg)| *rg == g)
                        .filter_map(|(r, _)| self.limits.get(r.as_str()).copied())
                        .min()
                });
                (g.clone(), own.or(self.global_limit))
            })
            .collect();
        Ok(Resolved {
            group_of,
            deps,
            limits,
            max_failures: self.max_failures,
            warnings,
        })
    }
}

/// Parses JSON like `serde_json`, but an object that names a key twice is an error
/// (serde_json keeps the last one silently, so half of a rule would be ignored).
fn strict_json(text: &str) -> Result<Value, serde_json::Error> {
    use serde::de::{Deserialize, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
    struct Strict(Value);
    impl<'de> Deserialize<'de> for Strict {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Strict, D::Error> {
            d.deserialize_any(StrictVisitor)
        }
    }
    struct StrictVisitor;
    impl<'de> Visitor<'de> for StrictVisitor {
        type Value = Strict;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON value")
        }
        fn visit_bool<E>(self, v: bool) -> Result<Strict, E> {
            Ok(Strict(Value::Bool(v)))
        }
        fn visit_i64<E>(self, v: i64) -> Result<Strict, E> {
            Ok(Strict(v.into()))
        }
        fn visit_u64<E>(self, v: u64) -> Result<Strict, E> {
            Ok(Strict(v.into()))
        }
        fn visit_f64<E>(self, v: f64) -> Result<Strict, E> {
            Ok(Strict(
                serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number),
            ))
        }
        fn visit_str<E>(self, v: &str) -> Result<Strict, E> {
            Ok(Strict(Value::String(v.to_string())))
        }
        fn visit_string<E>(self, v: String) -> Result<Strict, E> {
            Ok(Strict(Value::String(v)))
        }
        fn visit_unit<E>(self) -> Result<Strict, E> {
            Ok(Strict(Value::Null))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Strict, A::Error> {
            let mut out = Vec::new();
            while let Some(Strict(v)) = seq.next_element()? {
                out.push(v);
            }
            Ok(Strict(Value::Array(out)))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Strict, A::Error> {
            let mut out = serde_json::Map::new();
            while let Some(k) = map.next_key::<String>()? {
                let Strict(v) = map.next_value()?;
                if out.insert(k.clone(), v).is_some() {
                    return Err(A::Error::custom(format!(
                        "key {k:?} is given twice in one object (which one was meant?)"
                    )));
                }
            }
            Ok(Strict(Value::Object(out)))
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let Strict(v) = Strict::deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

fn find_cycle(graph: &BTreeMap<String, Vec<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, Vec<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(pos) = stack.iter().position(|s| s == n) {
            let mut c = stack[pos..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.to_string());
        for d in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(d, graph, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for n in graph.keys() {
        if let Some(c) = visit(n, graph, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

/// Rules checked against the fleet's roles.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub group_of: BTreeMap<Role, String>,
    /// Group → groups it waits for.
    pub deps: BTreeMap<String, BTreeSet<String>>,
    /// Group → limit (`None`: unlimited).
    pub limits: BTreeMap<String, Option<u64>>,
    pub max_failures: u64,
    pub warnings: Vec<String>,
}

/// What the planner decided for one group.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GroupPlan {
    pub group: String,
    pub limit: Option<u64>,
    pub upgraded: usize,
    pub in_flight: usize,
    pub pending: usize,
    /// Hosts whose enable key holds an invalid value (never admitted).
    #[serde(skip_serializing_if = "is_zero")]
    pub blocked: usize,
    /// Hosts or roles admitted by this plan, or why none.
    pub action: GroupAction,
}

/// What the planner does with one group's pending hosts (rendered for people by
/// `jioctl`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum GroupAction {
    /// No host of the group is pending.
    Done,
    /// More hosts failed than `max_failures`: nothing is admitted anywhere.
    StoppedOnFailure { failed: u64, max_failures: u64 },
    /// The groups it waits for (`role_order`) are not all upgraded.
    Wait { on: Vec<String> },
    /// Every pending host fits: these role keys are enabled.
    EnableRoles { roles: Vec<Role> },
    /// These hosts are admitted by their host keys (up to the limit).
    Admit { hosts: Vec<HostName> },
    /// The limit is 0.
    Frozen,
    /// The limit is reached: nothing more until a host finishes.
    Full { in_flight: usize, limit: usize },
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The keys a pass writes.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Plan {
    pub enable_roles: Vec<Role>,
    pub clear_host_keys: Vec<HostName>,
    pub enable_hosts: Vec<HostName>,
    pub groups: Vec<GroupPlan>,
    /// More hosts failed than `max_failures`: nothing was admitted.
    pub stopped_on_failures: bool,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.enable_roles.is_empty() && self.clear_host_keys.is_empty() && self.enable_hosts.is_empty()
    }
}

/// Decides which pending hosts may start. Pure.
/// Nothing is in flight and nothing can be admitted, yet hosts remain: a rollout
/// under this plan will not move until someone acts (a frozen role, a lost or
/// blocked host, a role waiting for one of those).
pub fn waits_forever(hosts: &[HostStatus], plan: &Plan) -> bool {
    plan.is_empty()
        && !plan.stopped_on_failures
        && !hosts.iter().any(|h| h.state == HostState::Upgrading)
        && hosts
            .iter()
            .any(|h| matches!(h.state, HostState::Pending | HostState::Lost | HostState::Blocked))
}

pub fn plan(snap: &Snapshot, hosts: &[HostStatus], r: &Resolved) -> Plan {
    let failed = hosts.iter().filter(|h| h.state == HostState::Failed).count() as u64;
    let stopped = failed > r.max_failures;
    let group_of = |role: &Role| r.group_of.get(role).cloned().unwrap_or_else(|| role.to_string());
    let mut by_group: BTreeMap<String, Vec<&HostStatus>> = BTreeMap::new();
    for h in hosts {
        by_group.entry(group_of(&h.role)).or_default().push(h);
    }
    let done = |g: &str| {
        by_group
            .get(g)
            .is_none_or(|hs| hs.iter().all(|h| h.state == HostState::Upgraded))
    };
    let mut plan = Plan {
        stopped_on_failures: stopped,
        ..Plan::default()
    };
    for (g, hs) in &by_group {
        let upgraded = hs.iter().filter(|h| h.state == HostState::Upgraded).count();
        let in_flight = hs.iter().filter(|h| h.state.in_flight()).count();
        let mut pending: Vec<&HostName> = hs
            .iter()
            .filter(|h| h.state == HostState::Pending)
            .map(|h| &h.host)
            .collect();
        pending.sort();
        let limit = r.limits.get(g).copied().flatten();
        let waiting: Vec<&String> = r.deps.get(g).into_iter().flatten().filter(|d| !done(d)).collect();
        let action = if pending.is_empty() {
            GroupAction::Done
        } else if stopped {
            GroupAction::StoppedOnFailure {
                failed,
                max_failures: r.max_failures,
            }
        } else if !waiting.is_empty() {
            GroupAction::Wait {
                on: waiting.into_iter().cloned().collect(),
            }
        } else if !hs.iter().any(|h| h.state == HostState::Blocked)
            && limit.is_none_or(|l| l >= (pending.len() + in_flight) as u64)
        {
            // (Not with a blocked host in the group: a role key would override the
            // invalid key that blocks it, or clearing its host key would unblock it.)
            // Everything fits: open the role keys, clear their host keys.
            let roles: BTreeSet<&Role> = hs.iter().map(|h| &h.role).collect();
            for role in &roles {
                if snap.role_keys.get(*role) != Some(&crate::gate::KeyState::Set(true)) {
                    plan.enable_roles.push((*role).clone());
                }
            }
            for h in hs {
                if snap.host_keys.contains_key(&h.host) {
                    plan.clear_host_keys.push(h.host.clone());
                }
            }
            GroupAction::EnableRoles {
                roles: roles.into_iter().cloned().collect(),
            }
        } else {
            let l = limit.unwrap_or(u64::MAX) as usize;
            if in_flight < l {
                let admit: Vec<HostName> = pending.iter().take(l - in_flight).map(|h| (*h).clone()).collect();
                plan.enable_hosts.extend(admit.iter().cloned());
                GroupAction::Admit { hosts: admit }
            } else if l == 0 {
                GroupAction::Frozen
            } else {
                GroupAction::Full { in_flight, limit: l }
            }
        };
        plan.groups.push(GroupPlan {
            group: g.clone(),
            limit,
            upgraded,
            in_flight,
            pending: pending.len(),
            blocked: hs.iter().filter(|h| h.state == HostState::Blocked).count(),
            action,
        });
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::classify;
    use crate::keys::{Key, Schema};
    use crate::store::KeyValue;

    const IDLE: &str = r#"{"state":"idle","version":"v1","since":1,"pid":1}"#;

    fn kv(key: &str, value: &str) -> KeyValue {
        KeyValue {
            key: Key::new(key).unwrap(),
            value: value.into(),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: None,
            not_text: false,
        }
    }

    /// A fleet at current version v2 after global-disable: `hosts` are
    /// `(name, role, state)` with state one of up, going, fail, wait.
    fn fleet(hosts: &[(&str, &str, &str)]) -> Snapshot {
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
        Snapshot::from_kvs(&Schema::default(), &kvs)
    }

    fn run(rules: &str, hosts: &[(&str, &str, &str)]) -> Plan {
        let snap = fleet(hosts);
        let statuses = classify(&snap);
        let roles = statuses.iter().map(|h| h.role.clone()).collect();
        let resolved = Rules::parse(rules).unwrap().resolve(&roles).unwrap();
        plan(&snap, &statuses, &resolved)
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
        let snap = Snapshot::from_kvs(&Schema::default(), &kvs);
        let statuses = classify(&snap);
        let roles = statuses.iter().map(|h| h.role.clone()).collect();
        let r = Rules::parse(r#"{"rolling_rules":{"roles":{"compute":2}}}"#)
            .unwrap()
            .resolve(&roles)
            .unwrap();
        let p = plan(&snap, &statuses, &r);
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
        let p = plan(&snap, &statuses, &r);
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

    #[test]
    fn bad_rules_are_rejected_with_every_problem_named() {
        let cases = [
            ("{", "malformed JSON"),
            ("[]", "must be a JSON object"),
            (r#"{"rolling": {}}"#, "unknown key \"rolling\""),
            (
                r#"{"rolling_rules": {"global": -1}}"#,
                "rolling_rules.global: -1 is not a count",
            ),
            (
                r#"{"rolling_rules": {"global": 1.5}}"#,
                "rolling_rules.global: 1.5 is not a count",
            ),
            (
                r#"{"rolling_rules": {"global": "3"}}"#,
                "rolling_rules.global: \"3\" is not a count",
            ),
            (
                r#"{"rolling_rules": {"roles": {"compute": true}}}"#,
                "rolling_rules.roles.compute: true is not a count",
            ),
            (
                r#"{"rolling_rules": {"glob": 1}}"#,
                "rolling_rules: unknown key \"glob\"",
            ),
            (
                r#"{"rolling_rules": {"roles": {"a b": 1}}}"#,
                "must not contain whitespace",
            ),
            (
                r#"{"group_mappings": {"ceph": "st("}}"#,
                "group_mappings.ceph: \"st(\" is not a valid regex",
            ),
            (
                r#"{"group_mappings": {"ceph": 3}}"#,
                "must be a string or a non-empty list",
            ),
            (r#"{"role_order": {"a": "b", "b": "a"}}"#, "cycle: a -> b -> a"),
            (r#"{"role_order": {"a": "a"}}"#, "cycle: a -> a"),
            (
                r#"{"role_order": {"a": "b"}, "role_dependencies": {}}"#,
                "give only one",
            ),
            (r#"{"max_failures": -2}"#, "max_failures: -2 is not a count"),
            (
                r#"{"progress_deadline": 60}"#,
                "progress_deadline: 60 must be a duration",
            ),
            (
                r#"{"progress_deadline": "0"}"#,
                "progress_deadline: must be longer than 0",
            ),
            (r#"{"progress_deadline": "soon"}"#, "invalid duration \"soon\""),
            (
                r#"{"rolling_rules":{"global":1},"rolling_rules":{"global":5}}"#,
                "key \"rolling_rules\" is given twice",
            ),
            (
                r#"{"rolling_rules":{"roles":{"compute":1,"compute":9}}}"#,
                "key \"compute\" is given twice",
            ),
            (r#"{} {}"#, "malformed JSON"),
        ];
        for (text, want) in cases {
            let err = Rules::parse(text).unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
        assert_eq!(
            Rules::parse(r#"{"progress_deadline": "90s"}"#)
                .unwrap()
                .progress_deadline,
            Duration::from_secs(90)
        );
        assert_eq!(Rules::parse("{}").unwrap().progress_deadline, PROGRESS_DEADLINE);
        // Several problems at once.
        let err =
            Rules::parse(r#"{"x": 1, "max_failures": "a", "rolling_rules": {"global": -1}}"#).unwrap_err();
        assert_eq!(err.0.len(), 3, "{err}");
    }

    #[test]
    fn fleet_dependent_errors_and_warnings() {
        let roles: BTreeSet<Role> = ["stmon", "compute"]
            .iter()
            .map(|r| Role::new(*r).unwrap())
            .collect();
        let r = Rules::parse(r#"{"group_mappings": {"a": "st.*", "b": "stm.*"}}"#).unwrap();
        assert!(
            r.resolve(&roles)
                .unwrap_err()
                .to_string()
                .contains("matches more than one group")
        );
        let r =
            Rules::parse(r#"{"group_mappings": {"g": "st.*|comp.*"}, "role_order": {"stmon": "compute"}}"#)
                .unwrap();
        assert!(
            r.resolve(&roles)
                .unwrap_err()
                .to_string()
                .contains("wait for itself")
        );
        let r = Rules::parse(
            r#"{"rolling_rules": {"roles": {"ghost": 1}}, "role_order": {"compute": "nobody"}}"#,
        )
        .unwrap();
        let res = r.resolve(&roles).unwrap();
        assert_eq!(res.warnings.len(), 2, "{:?}", res.warnings);
        assert!(res.warnings[0].contains("ghost"));
    }
}
