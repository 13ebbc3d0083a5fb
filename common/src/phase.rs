//! The stored vocabulary of composable upgrades (seed 004): when a task runs, the
//! catalog a host publishes of its task files, the phases of a stage and their
//! names, the grant the driver writes per role, and a task's reported status. The
//! rules of a composable rollout are in `compose_rules`, its planner in `compose`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::names::{HostName, Service};

/// When a task runs, relative to the host's Puppet run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum When {
    Pre,
    Post,
    Finalize,
}

impl When {
    pub fn as_str(self) -> &'static str {
        match self {
            When::Pre => "pre",
            When::Post => "post",
            When::Finalize => "finalize",
        }
    }
}

/// What one service's task file says, as its host publishes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSteps {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<Service>,
    /// Steps with `pre` tasks, ascending.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre: Vec<u32>,
    /// Steps with `post` tasks, ascending.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub post: Vec<u32>,
    /// It has finalize tasks.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub finalize: bool,
}

impl ServiceSteps {
    /// Whether it has tasks at `step` of `when`.
    pub fn has(&self, when: When, step: u32) -> bool {
        match when {
            When::Pre => self.pre.contains(&step),
            When::Post => self.post.contains(&step),
            When::Finalize => self.finalize,
        }
    }
}

/// A host's service catalog, `/hosts/<host>/services`, written by its agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    /// The directory of its task files.
    pub dir: String,
    pub services: BTreeMap<Service, ServiceSteps>,
    /// Task files that cannot be used, by service: why (naming the file).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub problems: BTreeMap<Service, String>,
    /// The directory itself cannot be read: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One phase of a stage. Phases sort in the order they run.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PhaseKey {
    /// 0: pre, 1: puppet, 2: post.
    pub rank: u8,
    pub step: u32,
    /// The dependency level of its services (`after`).
    pub level: u32,
}

/// A phase: a step (or the Puppet run) and the services whose tasks run in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Phase {
    pub key: PhaseKey,
    /// Empty for `puppet`.
    pub services: Vec<Service>,
}

impl Phase {
    pub fn puppet() -> Phase {
        Phase {
            key: PhaseKey {
                rank: 1,
                step: 0,
                level: 0,
            },
            services: Vec::new(),
        }
    }

    pub fn is_puppet(&self) -> bool {
        self.key.rank == 1
    }

    pub fn when(&self) -> Option<When> {
        match self.key.rank {
            0 => Some(When::Pre),
            2 => Some(When::Post),
            _ => None,
        }
    }

    /// `pre-1`, `puppet`, `post-3`: the name in grants and status keys.
    pub fn name(&self) -> String {
        phase_name(self.when(), self.key.step)
    }

    /// The name and its services, for people.
    pub fn describe(&self) -> String {
        if self.is_puppet() {
            "puppet".into()
        } else {
            format!(
                "{} ({})",
                self.name(),
                self.services
                    .iter()
                    .map(Service::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    }
}

/// The name of a phase of `when` (`None`: puppet) at `step`.
pub fn phase_name(when: Option<When>, step: u32) -> String {
    match when {
        None => "puppet".into(),
        Some(When::Finalize) => "finalize".into(),
        Some(w) => format!("{}-{step}", w.as_str()),
    }
}

/// Parses a phase name (`pre-2`, `puppet`, `post-3`, `finalize`).
pub fn parse_phase(s: &str) -> Option<(Option<When>, u32)> {
    match s {
        "puppet" => return Some((None, 0)),
        "finalize" => return Some((Some(When::Finalize), 0)),
        _ => {}
    }
    let (w, n) = s.split_once('-')?;
    let when = match w {
        "pre" => When::Pre,
        "post" => When::Post,
        _ => return None,
    };
    let step: u32 = n.parse().ok().filter(|s| *s > 0)?;
    // One spelling per phase: `pre-1`, never `pre-01` or `pre-+1`.
    (step.to_string() == n).then_some((Some(when), step))
}

/// The phase granted to a role's hosts: `/steps/roles/<role>`, written by the driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    pub rollout: String,
    pub stage: String,
    /// `pre-<k>`, `puppet` or `post-<k>`.
    pub phase: String,
    /// The services whose tasks run in it (empty for `puppet`).
    #[serde(default)]
    pub services: Vec<Service>,
    /// Its place among the stage's phases (dependency level of its services).
    #[serde(default)]
    pub level: u32,
    /// The hosts the stage left behind in its earlier phases, and why (held,
    /// failed), as the driver saw it when the phase moved on: a host open in a past
    /// phase and not named here missed it (its task files changed since).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub left_behind: BTreeMap<HostName, String>,
}

impl Grant {
    /// The same phase (whatever the record of hosts left behind says).
    pub fn same_phase(&self, other: &Grant) -> bool {
        (
            &self.rollout,
            &self.stage,
            &self.phase,
            &self.services,
            self.level,
        ) == (
            &other.rollout,
            &other.stage,
            &other.phase,
            &other.services,
            other.level,
        )
    }
}

impl Grant {
    /// Its phase's sort key (`None`: not a phase name).
    pub fn key(&self) -> Option<PhaseKey> {
        let (when, step) = parse_phase(&self.phase)?;
        let rank = match when {
            Some(When::Pre) => 0,
            None => 1,
            Some(When::Post) => 2,
            Some(When::Finalize) => return None,
        };
        Some(PhaseKey {
            rank,
            step,
            level: self.level,
        })
    }

    pub fn when(&self) -> Option<When> {
        parse_phase(&self.phase).and_then(|(w, _)| w)
    }

    pub fn step(&self) -> u32 {
        parse_phase(&self.phase).map_or(0, |(_, s)| s)
    }

    pub(crate) fn of(rollout: &str, stage: &str, p: &Phase) -> Grant {
        Grant {
            rollout: rollout.to_string(),
            stage: stage.to_string(),
            phase: p.name(),
            services: p.services.clone(),
            level: p.key.level,
            left_behind: BTreeMap::new(),
        }
    }
}

/// The host that runs the finalize tasks: `/steps/finalize`, written by the driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinalizeGrant {
    pub rollout: String,
    pub host: HostName,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_have_names_that_parse_back() {
        for (name, want) in [
            ("pre-1", Some((Some(When::Pre), 1))),
            ("post-12", Some((Some(When::Post), 12))),
            ("puppet", Some((None, 0))),
            ("finalize", Some((Some(When::Finalize), 0))),
            ("pre-0", None),
            ("pre-01", None),
            ("mid-1", None),
            ("pre-", None),
        ] {
            assert_eq!(parse_phase(name), want, "{name}");
        }
    }
}
