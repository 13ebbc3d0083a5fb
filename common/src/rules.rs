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
use serde_json::{Map, Value};

use crate::names::Role;
use crate::window::Window;

// The planner lives in `plan`; its types are part of the rules' vocabulary.

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

/// A limit as written: a count, or a percentage of the hosts it limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(untagged)]
pub enum Limit {
    Count(u64),
    /// 1 to 100.
    Percent(u8),
}

impl Limit {
    /// The count for `n` hosts. A percentage rounds down; for a slot limit
    /// (`at_least_one`) it is never below 1, so `"25%"` of 2 hosts is 1.
    pub fn of(self, n: usize, at_least_one: bool) -> u64 {
        match self {
            Limit::Count(c) => c,
            Limit::Percent(p) => {
                let v = n as u64 * u64::from(p) / 100;
                if at_least_one { v.max(1) } else { v }
            }
        }
    }
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Limit::Count(c) => write!(f, "{c}"),
            Limit::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// `canary`: how many hosts go first, before the rest waits for a promotion.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Canary {
    #[default]
    None,
    /// The same number in every group.
    Each(Limit),
    /// By group (or role) name; groups not named get no canary and wait.
    Groups(BTreeMap<String, Limit>),
}

/// Parsed rules.
#[derive(Debug, Clone)]
pub struct Rules {
    /// `rolling_rules.global`: the limit of every group without its own.
    pub global_limit: Option<Limit>,
    /// `rolling_rules.roles`: limits by group or role name.
    pub limits: BTreeMap<String, Limit>,
    /// `rolling_rules.fleet`: hosts in flight across every group.
    pub fleet_limit: Option<Limit>,
    /// `role_order`: name → the names it waits for.
    pub order: BTreeMap<String, Vec<String>>,
    pub groups: Vec<GroupRule>,
    /// Failed hosts tolerated before no new host is admitted (default 0); a
    /// percentage is of the hosts in the rollout, rounded down.
    pub max_failures: Limit,
    /// `progress_deadline`: how long a rollout may go without any host finishing
    /// while hosts are in flight or waiting, before it is marked stuck.
    pub progress_deadline: Duration,
    pub canary: Canary,
    /// `canary_soak`: after the canaries are upgraded, how long they must stay
    /// healthy before the rest is admitted without `jioctl rollout promote`.
    pub canary_soak: Option<Duration>,
    /// `min_healthy_time`: a host keeps its slot until it has stayed validated for
    /// this long (and passed a health check since).
    pub min_healthy_time: Option<Duration>,
    /// `windows`: when hosts may start (none: at any time).
    pub windows: Vec<Window>,
    /// `roles_data`, `stages`, `finalize`: a composable rollout (seed 004).
    pub compose: Option<crate::compose_rules::Compose>,
    /// `reboot`: whether a host's run ends with a reboot, for every host (`global`)
    /// or by group or role; none set: the agent's own `reboot` setting decides.
    pub reboot: BTreeMap<String, RebootPolicy>,
}

/// When a run ends with a reboot (the rules' `reboot`, the agent's `reboot`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RebootPolicy {
    Never,
    /// When the host says a reboot is required (Debian's reboot-required file, or
    /// the agent's check command).
    IfRequired,
    Always,
}

impl RebootPolicy {
    pub fn parse(s: &str) -> Result<RebootPolicy, String> {
        match s {
            "never" => Ok(RebootPolicy::Never),
            "if-required" => Ok(RebootPolicy::IfRequired),
            "always" => Ok(RebootPolicy::Always),
            other => Err(format!("{other:?} is not one of never, if-required, always")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RebootPolicy::Never => "never",
            RebootPolicy::IfRequired => "if-required",
            RebootPolicy::Always => "always",
        }
    }
}

/// The default `progress_deadline`.
pub const PROGRESS_DEADLINE: Duration = Duration::from_secs(3600);

impl Default for Rules {
    fn default() -> Rules {
        Rules {
            global_limit: None,
            limits: BTreeMap::new(),
            fleet_limit: None,
            order: BTreeMap::new(),
            groups: Vec::new(),
            max_failures: Limit::Count(0),
            progress_deadline: PROGRESS_DEADLINE,
            canary: Canary::None,
            canary_soak: None,
            min_healthy_time: None,
            windows: Vec::new(),
            compose: None,
            reboot: BTreeMap::new(),
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
    "canary",
    "canary_soak",
    "min_healthy_time",
    "windows",
    "roles_data",
    "stages",
    "finalize",
    "reboot",
];

/// A count, or a percentage written as a string (`"25%"`, 1 to 100).
fn limit(path: &str, v: &Value, errors: &mut Vec<String>) -> Option<Limit> {
    if let Some(p) = v.as_str().and_then(|s| s.strip_suffix('%')) {
        let digits = !p.is_empty() && p.chars().all(|c| c.is_ascii_digit());
        return match p.parse::<u8>() {
            Ok(n) if digits && (1..=100).contains(&n) => Some(Limit::Percent(n)),
            _ => {
                errors.push(format!(
                    "{path}: {v} is not a percentage (a whole number from \"1%\" to \"100%\")"
                ));
                None
            }
        };
    }
    match v.as_u64() {
        Some(n) if n <= u32::MAX as u64 => Some(Limit::Count(n)),
        _ => {
            errors.push(format!(
                "{path}: {v} is not a count (a whole number from 0 to {}) or a percentage such as \"25%\"",
                u32::MAX
            ));
            None
        }
    }
}

/// A canary count: a limit that is not 0 (no canary would never end by itself).
fn canary_count(path: &str, v: &Value, errors: &mut Vec<String>) -> Option<Limit> {
    match limit(path, v, errors)? {
        Limit::Count(0) => {
            errors.push(format!("{path}: 0 canaries: give at least 1 (or no canary rule)"));
            None
        }
        l => Some(l),
    }
}

fn duration(path: &str, d: &Value, errors: &mut Vec<String>) -> Option<Duration> {
    match d.as_str().map(crate::duration::parse) {
        Some(Ok(d)) if !d.is_zero() => Some(d),
        Some(Ok(_)) => {
            errors.push(format!("{path}: must be longer than 0"));
            None
        }
        Some(Err(e)) => {
            errors.push(format!("{path}: {e}"));
            None
        }
        None => {
            errors.push(format!(
                "{path}: {d} must be a duration such as \"30m\" or \"2h\""
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
    /// No rolling limit at all (no global, group, role or fleet limit, and not
    /// composable): every host that needs to move may start at once.
    pub fn sets_no_limit(&self) -> bool {
        self.global_limit.is_none()
            && self.limits.is_empty()
            && self.fleet_limit.is_none()
            && self.compose.is_none()
    }

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
        rules.parse_rolling_rules(&top, &mut errors);
        rules.parse_order(&top, &mut errors);
        rules.parse_groups(&top, &mut errors);
        rules.parse_failures_and_times(&top, &mut errors);
        rules.parse_canary(&top, &mut errors);
        rules.parse_windows(&top, &mut errors);
        rules.parse_reboot(&top, &mut errors);
        rules.compose = crate::compose_rules::Compose::parse(&top, &mut errors);
        if let Some(cycle) = find_cycle(&rules.order) {
            errors.push(format!("role_order has a cycle: {}", cycle.join(" -> ")));
        }
        if errors.is_empty() {
            Ok(rules)
        } else {
            Err(RulesError(errors))
        }
    }

    /// `rolling_rules`: the global and fleet limits and the limits by role.
    fn parse_rolling_rules(&mut self, top: &Map<String, Value>, errors: &mut Vec<String>) {
        if let Some(rr) = top.get("rolling_rules") {
            match rr {
                Value::Object(o) => {
                    for (k, v) in o {
                        match k.as_str() {
                            "global" => self.global_limit = limit("rolling_rules.global", v, errors),
                            "fleet" => self.fleet_limit = limit("rolling_rules.fleet", v, errors),
                            "roles" => match v {
                                Value::Object(roles) => {
                                    for (r, n) in roles {
                                        let path = format!("rolling_rules.roles.{r}");
                                        if name(&path, r, errors)
                                            && let Some(n) = limit(&path, n, errors)
                                        {
                                            self.limits.insert(r.clone(), n);
                                        }
                                    }
                                }
                                other => errors.push(format!(
                                    "rolling_rules.roles: {other} must be an object of counts"
                                )),
                            },
                            other => errors.push(format!(
                                "rolling_rules: unknown key {other:?} (allowed: global, fleet, roles)"
                            )),
                        }
                    }
                }
                other => errors.push(format!("rolling_rules: {other} must be an object")),
            }
        }
    }
    /// `role_order` (or its old name `role_dependencies`).
    fn parse_order(&mut self, top: &Map<String, Value>, errors: &mut Vec<String>) {
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
                        if name(&path, r, errors) {
                            let deps = strings(&path, deps, errors);
                            for d in &deps {
                                name(&path, d, errors);
                            }
                            self.order.insert(r.clone(), deps);
                        }
                    }
                }
                other => errors.push(format!("{key}: {other} must be an object")),
            }
        }
    }
    /// `group_mappings`: groups of roles by regex, anchored at the start.
    fn parse_groups(&mut self, top: &Map<String, Value>, errors: &mut Vec<String>) {
        if let Some(g) = top.get("group_mappings") {
            match g {
                Value::Object(o) => {
                    for (group, pats) in o {
                        let path = format!("group_mappings.{group}");
                        if !name(&path, group, errors) {
                            continue;
                        }
                        let mut patterns = Vec::new();
                        for p in strings(&path, pats, errors) {
                            // Anchored at the start, like Python's re.match in the original.
                            match Regex::new(&format!("^(?:{p})")) {
                                Ok(re) => patterns.push(re),
                                Err(e) => errors.push(format!(
                                    "{path}: {p:?} is not a valid regex: {}",
                                    e.to_string().lines().last().unwrap_or_default().trim()
                                )),
                            }
                        }
                        self.groups.push(GroupRule {
                            name: group.clone(),
                            patterns,
                        });
                    }
                }
                other => errors.push(format!("group_mappings: {other} must be an object")),
            }
        }
    }
    /// `max_failures`, `progress_deadline`, `canary_soak` and `min_healthy_time`.
    fn parse_failures_and_times(&mut self, top: &Map<String, Value>, errors: &mut Vec<String>) {
        if let Some(m) = top.get("max_failures") {
            self.max_failures = limit("max_failures", m, errors).unwrap_or(Limit::Count(0));
        }
        if let Some(d) = top.get("progress_deadline")
            && let Some(d) = duration("progress_deadline", d, errors)
        {
            self.progress_deadline = d;
        }
        if let Some(d) = top.get("canary_soak") {
            self.canary_soak = duration("canary_soak", d, errors);
        }
        if let Some(d) = top.get("min_healthy_time") {
            self.min_healthy_time = duration("min_healthy_time", d, errors);
        }
    }
    /// `reboot`: one policy for every host, or policies by group or role (with
    /// `global` for the rest).
    fn parse_reboot(&mut self, top: &Map<String, Value>, errors: &mut Vec<String>) {
        let Some(r) = top.get("reboot") else { return };
        let mut one = |path: &str, name: &str, v: &Value, errors: &mut Vec<String>| match v
            .as_str()
            .map(RebootPolicy::parse)
        {
            Some(Ok(p)) => {
                self.reboot.insert(name.to_string(), p);
            }
            Some(Err(e)) => errors.push(format!("{path}: {e}")),
            None => errors.push(format!(
                "{path}: {v} must be \"never\", \"if-required\" or \"always\""
            )),
        };
        match r {
            Value::Object(o) => {
                for (k, v) in o {
                    let path = format!("reboot.{k}");
                    if k == "global" || name(&path, k, errors) {
                        one(&path, k, v, errors);
                    }
                }
            }
            v => one("reboot", "global", v, errors),
        }
    }

    /// The rules' reboot policy for hosts of `role`: by role, then its group, then
    /// `global` (none: the agent's own setting).
    pub fn reboot_for(&self, role: &Role) -> Option<RebootPolicy> {
        let group = self.group_of(role).unwrap_or_else(|_| role.to_string());
        [role.as_str(), group.as_str(), "global"]
            .iter()
            .find_map(|k| self.reboot.get(*k).copied())
    }

    /// `canary`: one count, or counts by group (and `canary_soak` needs it).
    fn parse_canary(&mut self, top: &Map<String, Value>, errors: &mut Vec<String>) {
        if let Some(c) = top.get("canary") {
            self.canary = match c {
                Value::Object(o) => {
                    let mut by = BTreeMap::new();
                    for (g, n) in o {
                        let path = format!("canary.{g}");
                        if name(&path, g, errors)
                            && let Some(n) = canary_count(&path, n, errors)
                        {
                            by.insert(g.clone(), n);
                        }
                    }
                    if by.is_empty() && errors.is_empty() {
                        errors.push("canary: {} names no group: give a count, or counts by group".into());
                    }
                    Canary::Groups(by)
                }
                other => canary_count("canary", other, errors).map_or(Canary::None, Canary::Each),
            };
        }
        if self.canary_soak.is_some() && self.canary == Canary::None {
            errors.push("canary_soak is given without canary: there is nothing to soak".into());
        }
    }
    /// `windows`: a non-empty list of maintenance windows.
    fn parse_windows(&mut self, top: &Map<String, Value>, errors: &mut Vec<String>) {
        if let Some(w) = top.get("windows") {
            match w {
                Value::Array(a) if !a.is_empty() => {
                    for (i, w) in a.iter().enumerate() {
                        if let Some(w) = Window::parse(&format!("windows[{i}]"), w, errors) {
                            self.windows.push(w);
                        }
                    }
                }
                other => errors.push(format!("windows: {other} must be a non-empty list of windows")),
            }
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

    /// The windows that apply to hosts of `role` (empty: they may start at any time):
    /// those naming its group or the role, and those naming no group. What the agent
    /// checks before it starts an upgrade.
    pub fn windows_for(&self, role: &Role) -> Vec<&Window> {
        let group = self.group_of(role).unwrap_or_else(|_| role.to_string());
        // A name is a group, or a role standing for its group (as `resolve` reads it).
        let names_group = |n: &str| {
            n == group
                || Role::new(n)
                    .ok()
                    .is_some_and(|r| self.group_of(&r).is_ok_and(|g| g == group))
        };
        self.windows
            .iter()
            .filter(|w| {
                w.groups
                    .as_ref()
                    .is_none_or(|gs| gs.iter().any(|g| names_group(g)))
            })
            .collect()
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
        let names = Names {
            groups: group_of.values().cloned().collect(),
            group_of,
        };
        for n in self.limits.keys() {
            if names.lookup(n).is_none() {
                warnings.push(format!("rolling_rules.roles names {n:?}, which has no hosts"));
            }
        }
        // A misspelt name would leave its hosts to the agents' own setting: refused.
        for n in self.reboot.keys().filter(|n| *n != "global") {
            if names.lookup(n).is_none() {
                errors.push(format!(
                    "reboot names {n:?}, which is no group or role of the fleet"
                ));
            }
        }
        let canary = self.resolve_canary(&names, &mut errors);
        let windows = self.resolve_windows(&names, &mut warnings);
        for g in &self.groups {
            if !names.groups.contains(&g.name) {
                warnings.push(format!("group_mappings.{} matches no role of any host", g.name));
            }
        }
        let deps = self.resolve_order(&names, &mut errors, &mut warnings);
        if let Some(c) = &self.compose {
            c.resolve(roles, &mut errors, &mut warnings);
        }
        if !errors.is_empty() {
            return Err(RulesError(errors));
        }
        Ok(Resolved {
            limits: self.group_limits(&names),
            group_of: names.group_of,
            deps,
            fleet_limit: self.fleet_limit,
            max_failures: self.max_failures,
            canary,
            canary_soak: self.canary_soak,
            min_healthy_time: self.min_healthy_time,
            windows,
            warnings,
        })
    }

    /// The canary counts by group. A name that is no group or role is an error, not
    /// a warning: a misspelt group would end the canary phase silently for the
    /// group meant.
    fn resolve_canary(&self, names: &Names, errors: &mut Vec<String>) -> BTreeMap<String, Limit> {
        let mut canary = BTreeMap::new();
        match &self.canary {
            Canary::None => {}
            Canary::Each(n) => {
                canary = names.groups.iter().map(|g| (g.clone(), *n)).collect();
            }
            Canary::Groups(by) => {
                for (n, c) in by {
                    match names.lookup(n) {
                        Some(g) => {
                            canary.insert(g, *c);
                        }
                        None => errors.push(format!(
                            "canary.{n}: {n:?} is no group or role of this fleet (groups: {})",
                            names.groups.iter().cloned().collect::<Vec<_>>().join(", ")
                        )),
                    }
                }
            }
        }
        canary
    }

    /// The windows by group (a window naming no group applies to every group).
    fn resolve_windows(&self, names: &Names, warnings: &mut Vec<String>) -> BTreeMap<String, Vec<Window>> {
        let mut windows: BTreeMap<String, Vec<Window>> = BTreeMap::new();
        for (i, w) in self.windows.iter().enumerate() {
            match &w.groups {
                None => {
                    for g in &names.groups {
                        windows.entry(g.clone()).or_default().push(w.clone());
                    }
                }
                Some(group_names) => {
                    for n in group_names {
                        match names.lookup(n) {
                            Some(g) => windows.entry(g).or_default().push(w.clone()),
                            None => warnings.push(format!("windows[{i}] names {n:?}, which has no hosts")),
                        }
                    }
                }
            }
        }
        windows
    }

    /// The groups each group waits for (`role_order`), without a cycle.
    fn resolve_order(
        &self,
        names: &Names,
        errors: &mut Vec<String>,
        warnings: &mut Vec<String>,
    ) -> BTreeMap<String, BTreeSet<String>> {
        let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (n, ds) in &self.order {
            let Some(g) = names.lookup(n) else {
                warnings.push(format!("role_order names {n:?}, which has no hosts"));
                continue;
            };
            for d in ds {
                match names.lookup(d) {
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
        deps
    }

    /// Each group's limits: its own number, else those given for roles in it (the
    /// smallest applies), else global.
    fn group_limits(&self, names: &Names) -> BTreeMap<String, Vec<Limit>> {
        names
            .groups
            .iter()
            .map(|g| {
                let own: Vec<Limit> = match self.limits.get(g) {
                    Some(l) => vec![*l],
                    None => names
                        .group_of
                        .iter()
                        .filter(|(_, rg)| *rg == g)
                        .filter_map(|(r, _)| self.limits.get(r.as_str()).copied())
                        .collect(),
                };
                let all = if own.is_empty() {
                    self.global_limit.into_iter().collect()
                } else {
                    own
                };
                (g.clone(), all)
            })
            .collect()
    }
}

/// Refuses rules whose intent is unclear, unless `force`: rules that name a role,
/// group or window target the fleet does not have (a misspelt role would lift the
/// limit meant for it), and, with `unlimited: Some(n)`, rules that set no rolling
/// limit at all (every one of `n` hosts would start at once). The one check
/// `upgrade`, `run`, `rollout undo` and the driver service share; `Err` lists every
/// reason, and says how to force it.
pub fn check_intent(resolved: &Resolved, unlimited: Option<usize>, force: bool) -> Result<(), String> {
    if force {
        return Ok(());
    }
    let mut why: Vec<String> = resolved.warnings.clone();
    if let Some(n) = unlimited {
        why.push(format!(
            "the rules set no rolling limit (no rolling_rules, no fleet limit): {n} host(s) would start at once"
        ));
    }
    if why.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the rules' intent is unclear, so nothing was written:\n  {}\ngive --force to go ahead as written (a role that will exist later, or no limit on purpose)",
        why.join("\n  ")
    ))
}

/// A refusal of `check_intent` as a driver (or a view of it) says it about a
/// rollout already recorded: on one line, and nothing is admitted (rather than
/// written).
pub fn admits_nothing(refusal: &str) -> String {
    refusal
        .replace("nothing was written", "nothing is admitted")
        .replace(":\n  ", ": ")
        .replace("\n  ", "; ")
        .replace('\n', "; ")
}

impl Resolved {
    /// The group's slot limit for a group of `size` hosts (`None`: unlimited).
    pub fn limit_of(&self, group: &str, size: usize) -> Option<u64> {
        self.limits.get(group)?.iter().map(|l| l.of(size, true)).min()
    }

    /// The fleet cap for a fleet of `size` hosts (`None`: no cap).
    pub fn fleet_cap(&self, size: usize) -> Option<u64> {
        self.fleet_limit.map(|l| l.of(size, true))
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
    /// Group → its limits (the smallest applies; none: unlimited). Several when
    /// roles of one group have their own.
    pub limits: BTreeMap<String, Vec<Limit>>,
    /// Hosts in flight across the fleet (`None`: no cap).
    pub fleet_limit: Option<Limit>,
    pub max_failures: Limit,
    /// Group → how many canaries it has (empty: no canary phase).
    pub canary: BTreeMap<String, Limit>,
    pub canary_soak: Option<Duration>,
    pub min_healthy_time: Option<Duration>,
    /// Group → the windows it starts hosts in (absent: at any time).
    pub windows: BTreeMap<String, Vec<Window>>,
    pub warnings: Vec<String>,
}

/// The fleet's groups, and each role's group: a name in the rules is a group name,
/// or a role standing for its group.
struct Names {
    groups: BTreeSet<String>,
    group_of: BTreeMap<Role, String>,
}

impl Names {
    fn lookup(&self, n: &str) -> Option<String> {
        if self.groups.contains(n) {
            return Some(n.to_string());
        }
        Role::new(n).ok().and_then(|r| self.group_of.get(&r).cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rules that must be refused, and what the refusal must say.
    const BAD_RULES: &[(&str, &str)] = &[
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
        (
            r#"{"rolling_rules": {"fleet": "0%"}}"#,
            "rolling_rules.fleet: \"0%\" is not a percentage (a whole number from \"1%\" to \"100%\")",
        ),
        (
            r#"{"rolling_rules": {"roles": {"compute": "150%"}}}"#,
            "rolling_rules.roles.compute: \"150%\" is not a percentage",
        ),
        (
            r#"{"max_failures": "ten%"}"#,
            "max_failures: \"ten%\" is not a percentage",
        ),
        (r#"{"canary": -1}"#, "canary: -1 is not a count"),
        (r#"{"canary": 0}"#, "canary: 0 canaries"),
        (r#"{"canary": {"compute": 0}}"#, "canary.compute: 0 canaries"),
        (r#"{"canary": {}}"#, "names no group"),
        (r#"{"max_failures": "+5%"}"#, "is not a percentage"),
        (
            r#"{"canary": {"compute": true}}"#,
            "canary.compute: true is not a count",
        ),
        (r#"{"canary_soak": "10m"}"#, "canary_soak is given without canary"),
        (
            r#"{"canary": 1, "canary_soak": 600}"#,
            "canary_soak: 600 must be a duration",
        ),
        (
            r#"{"min_healthy_time": "0"}"#,
            "min_healthy_time: must be longer than 0",
        ),
        (r#"{"windows": []}"#, "windows: [] must be a non-empty list"),
        (
            r#"{"windows": [{"days": "weekdays", "start": "22:00", "end": "06:00"}]}"#,
            "windows[0].days: \"weekdays\" is not a day",
        ),
        (
            r#"{"windows": [{"days": "mon", "start": "22:00", "end": "06:00", "tz": "Mumbai"}]}"#,
            "windows[0].tz: \"Mumbai\" is not a time zone",
        ),
        (
            r#"{"reboot": "sometimes"}"#,
            "reboot: \"sometimes\" is not one of never, if-required, always",
        ),
        (r#"{"reboot": {"compute": true}}"#, "reboot.compute: true must be"),
    ];

    #[test]
    fn the_reboot_rule_applies_by_role_then_group_then_global_and_names_only_known_ones() {
        let r = Rules::parse(
            r#"{"group_mappings": {"storage": "st.*"}, "reboot": {"global": "never", "storage": "always", "stmon": "if-required"}}"#,
        )
        .unwrap();
        let role = |s: &str| Role::new(s).unwrap();
        assert_eq!(r.reboot_for(&role("stmon")), Some(RebootPolicy::IfRequired));
        assert_eq!(r.reboot_for(&role("stceph")), Some(RebootPolicy::Always));
        assert_eq!(r.reboot_for(&role("compute")), Some(RebootPolicy::Never));
        assert_eq!(Rules::parse("{}").unwrap().reboot_for(&role("compute")), None);
        let one = Rules::parse(r#"{"reboot": "always"}"#).unwrap();
        assert_eq!(one.reboot_for(&role("compute")), Some(RebootPolicy::Always));
        let roles: BTreeSet<Role> = [role("compute")].into();
        let typo = Rules::parse(r#"{"reboot": {"computee": "never"}}"#).unwrap();
        assert!(
            typo.resolve(&roles)
                .unwrap_err()
                .to_string()
                .contains("reboot names \"computee\"")
        );
    }

    #[test]
    fn bad_rules_are_rejected_with_every_problem_named() {
        for (text, want) in BAD_RULES {
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
