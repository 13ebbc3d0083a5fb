//! The composable part of a rollout's rules (seed 004): the roles-data document
//! (role → services), the stages (role lists, in the order written) and the
//! finalize rule, parsed from the rules' top-level table. Pure.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::names::{Role, Service};

/// The composable part of the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compose {
    /// `roles_data`: role → the services it runs, roles in the order written.
    pub roles_data: Vec<(Role, Vec<Service>)>,
    /// `stages`: stage → its roles, in the order written (empty: one stage `all`).
    pub stages: Vec<(String, Vec<Role>)>,
    /// `finalize.role`: whose first healthy host runs the finalize tasks.
    pub finalize_role: Option<Role>,
}

/// The name of the one stage of a composable rollout without `stages`.
pub const ALL: &str = "all";

impl Compose {
    /// The services `role` runs (none when roles-data does not list it).
    pub fn services_of(&self, role: &Role) -> &[Service] {
        self.roles_data
            .iter()
            .find(|(r, _)| r == role)
            .map_or(&[], |(_, s)| s.as_slice())
    }

    /// Every service of the roles-data document.
    pub fn all_services(&self) -> BTreeSet<&Service> {
        self.roles_data.iter().flat_map(|(_, s)| s.iter()).collect()
    }

    /// The stages with their roles, for a fleet with `roles`: without `stages`, one
    /// stage `all` holding every role.
    pub fn stages_for(&self, roles: &BTreeSet<Role>) -> Vec<(String, Vec<Role>)> {
        if self.stages.is_empty() {
            vec![(ALL.to_string(), roles.iter().cloned().collect())]
        } else {
            self.stages.clone()
        }
    }

    /// The names of every stage, in order.
    pub fn stage_names(&self) -> Vec<String> {
        if self.stages.is_empty() {
            vec![ALL.to_string()]
        } else {
            self.stages.iter().map(|(s, _)| s.clone()).collect()
        }
    }

    /// The stage `role` belongs to.
    pub fn stage_of(&self, role: &Role) -> Option<String> {
        if self.stages.is_empty() {
            return Some(ALL.to_string());
        }
        self.stages
            .iter()
            .find(|(_, roles)| roles.contains(role))
            .map(|(s, _)| s.clone())
    }

    /// The role whose first healthy host runs the finalize tasks: `finalize.role`,
    /// else the first role of the first stage, else the first role of roles-data.
    pub fn finalize_role(&self) -> Option<Role> {
        self.finalize_role
            .clone()
            .or_else(|| self.stages.first().and_then(|(_, r)| r.first().cloned()))
            .or_else(|| self.roles_data.first().map(|(r, _)| r.clone()))
    }

    /// Parses `roles_data`, `stages` and `finalize` of the rules' JSON `top` (its
    /// objects keep the order written: `serde_json`'s `preserve_order`). `None` without
    /// `roles_data` (then `stages` and `finalize` are errors).
    pub fn parse(top: &serde_json::Map<String, Value>, errors: &mut Vec<String>) -> Option<Compose> {
        let Some(rd) = top.get("roles_data") else {
            for k in ["stages", "finalize"] {
                if top.contains_key(k) {
                    errors.push(format!(
                        "{k} is given without roles_data: it is part of a composable rollout"
                    ));
                }
            }
            return None;
        };
        let c = Compose {
            roles_data: roles_data(rd, errors),
            stages: top.get("stages").map(|st| stages(st, errors)).unwrap_or_default(),
            finalize_role: top.get("finalize").and_then(|f| finalize_role(f, errors)),
        };
        for k in ["canary", "canary_soak", "min_healthy_time", "reboot"] {
            if top.contains_key(k) {
                errors.push(format!(
                    "{k} cannot be used with roles_data: a composable rollout moves every host of a stage in lockstep"
                ));
            }
        }
        Some(c)
    }

    /// Checks the document against the fleet's roles: every role in one stage, the
    /// finalize role present. Problems are errors; names without hosts are warnings.
    pub fn resolve(&self, roles: &BTreeSet<Role>, errors: &mut Vec<String>, warnings: &mut Vec<String>) {
        if !self.stages.is_empty() {
            for r in roles {
                if self.stage_of(r).is_none() {
                    errors.push(format!(
                        "stages: role {r} has hosts but is in no stage (stages: {})",
                        self.stage_names().join(", ")
                    ));
                }
            }
            for (s, rs) in &self.stages {
                for r in rs.iter().filter(|r| !roles.contains(*r)) {
                    warnings.push(format!("stages.{s} names role {r}, which has no hosts"));
                }
            }
        }
        for (r, _) in &self.roles_data {
            if !roles.contains(r) {
                warnings.push(format!("roles_data names role {r}, which has no hosts"));
            }
        }
        if let Some(r) = self.finalize_role()
            && !roles.contains(&r)
        {
            errors.push(match &self.finalize_role {
                Some(_) => format!("finalize.role: role {r} has no hosts to run the finalize tasks"),
                None => format!(
                    "finalize: by default the first role of the first stage ({r}) runs the finalize tasks, and it has no hosts: give finalize.role"
                ),
            });
        }
    }
}

/// `roles_data`: role → the services it runs, in the order written.
fn roles_data(rd: &Value, errors: &mut Vec<String>) -> Vec<(Role, Vec<Service>)> {
    let Value::Object(o) = rd else {
        errors.push(format!("roles_data: {rd} must be an object of roles"));
        return Vec::new();
    };
    let mut out = Vec::new();
    for (r, value) in o {
        let path = format!("roles_data.{r}");
        match Role::new(r.as_str()) {
            Ok(role) => out.push((role, services(&path, value, errors))),
            Err(e) => errors.push(format!("{path}: {e}")),
        }
    }
    if o.is_empty() {
        errors.push("roles_data: {} names no role".into());
    }
    out
}

/// One role's services: names, each once.
fn services(path: &str, value: &Value, errors: &mut Vec<String>) -> Vec<Service> {
    let Value::Array(a) = value else {
        errors.push(format!("{path}: {value} must be a list of service names"));
        return Vec::new();
    };
    let mut services: Vec<Service> = Vec::new();
    for s in a {
        match s.as_str().map(Service::new) {
            Some(Ok(s)) if services.contains(&s) => {
                errors.push(format!("{path}: service {s} is listed twice"))
            }
            Some(Ok(s)) => services.push(s),
            Some(Err(e)) => errors.push(format!("{path}: {e}")),
            None => errors.push(format!("{path}: {s} is not a service name")),
        }
    }
    services
}

/// `stages`: stage → its roles, in the order written; a role belongs to one stage.
fn stages(st: &Value, errors: &mut Vec<String>) -> Vec<(String, Vec<Role>)> {
    let o = match st {
        Value::Object(o) if !o.is_empty() => o,
        other => {
            errors.push(format!(
                "stages: {other} must be an object of stages (stage name → its roles)"
            ));
            return Vec::new();
        }
    };
    let mut seen: BTreeMap<Role, String> = BTreeMap::new();
    let mut out = Vec::new();
    for (s, value) in o {
        let path = format!("stages.{s}");
        if let Err(e) = Role::new(s.as_str()) {
            errors.push(format!("{path}: invalid stage name: {}", e.rule));
            continue;
        }
        out.push((s.clone(), stage_roles(&path, s, value, &mut seen, errors)));
    }
    out
}

fn stage_roles(
    path: &str,
    stage: &str,
    value: &Value,
    seen: &mut BTreeMap<Role, String>,
    errors: &mut Vec<String>,
) -> Vec<Role> {
    let a = match value {
        Value::Array(a) if !a.is_empty() => a,
        other => {
            errors.push(format!("{path}: {other} must be a non-empty list of roles"));
            return Vec::new();
        }
    };
    let mut roles = Vec::new();
    for r in a {
        match r.as_str().map(Role::new) {
            Some(Ok(r)) => {
                if let Some(other) = seen.insert(r.clone(), stage.to_string()) {
                    errors.push(format!(
                        "{path}: role {r} is already in stage {other}: a role belongs to one stage"
                    ));
                } else {
                    roles.push(r);
                }
            }
            Some(Err(e)) => errors.push(format!("{path}: {e}")),
            None => errors.push(format!("{path}: {r} is not a role")),
        }
    }
    roles
}

/// `finalize`: `{"role": ROLE}`.
fn finalize_role(f: &Value, errors: &mut Vec<String>) -> Option<Role> {
    let Value::Object(o) = f else {
        errors.push(format!(
            "finalize: {f} must be an object such as {{\"role\": \"controller\"}}"
        ));
        return None;
    };
    let mut role = None;
    for (k, v) in o {
        match (k.as_str(), v.as_str()) {
            ("role", Some(r)) => match Role::new(r) {
                Ok(r) => role = Some(r),
                Err(e) => errors.push(format!("finalize.role: {e}")),
            },
            ("role", None) => errors.push(format!("finalize.role: {v} must be a role name")),
            (other, _) => errors.push(format!("finalize: unknown key {other:?} (allowed: role)")),
        }
    }
    role
}
