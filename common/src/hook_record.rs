//! A host's maintenance hook as recorded in the store (`/hooks/<host>`): which of
//! its role's hooks the driver runs or ran around its slot (`before`: drain it,
//! `after`: put it back), for which rollout, and how it ended. Only rollout
//! drivers (`jioctl drive`, a following `jioctl upgrade`) write it, in their fenced
//! transactions; everybody reads it with this one parser. Pure data.

use serde::{Deserialize, Serialize};

use crate::names::{Role, Version};

/// Which hook of a host's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HookKind {
    /// Runs before the host is enabled (drain it: disable its services, move its
    /// workloads away).
    Before,
    /// Runs once the host reported success at the target version (put it back).
    After,
}

impl HookKind {
    pub fn as_str(self) -> &'static str {
        match self {
            HookKind::Before => "before",
            HookKind::After => "after",
        }
    }
}

impl std::fmt::Display for HookKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How far the recorded hook got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HookState {
    /// Started and not seen to end: whoever drives the rollout runs it (again).
    Running,
    Succeeded,
    Failed,
}

impl HookState {
    pub fn as_str(self) -> &'static str {
        match self {
            HookState::Running => "running",
            HookState::Succeeded => "succeeded",
            HookState::Failed => "failed",
        }
    }
}

/// `/hooks/<host>`: the host's last hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookRecord {
    /// The rollout whose slot it is (an id, as `/rollouts/current` names it).
    pub rollout: String,
    pub version: Version,
    pub role: Role,
    pub hook: HookKind,
    pub state: HookState,
    /// Unix time it started (the driver's clock).
    pub started: u64,
    /// Unix time it ended; `None` while running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<u64>,
    /// The driver that runs (or ran) it: `<host>-<pid>`.
    pub driver: String,
    /// How many times this hook was started in this slot (a driver that died
    /// mid-hook leaves it to the next, which runs it again).
    #[serde(default = "one")]
    pub attempt: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Its output: a Swift link, or a path on the driver's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
    /// On failure: what went wrong and the end of its output (a few short lines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

fn one() -> u32 {
    1
}

impl HookRecord {
    /// The record of `hook` starting now in `rollout`'s slot for a host.
    pub fn start(
        rollout: &str,
        version: &Version,
        role: &Role,
        hook: HookKind,
        driver: &str,
        now: u64,
    ) -> HookRecord {
        HookRecord {
            rollout: rollout.to_string(),
            version: version.clone(),
            role: role.clone(),
            hook,
            state: HookState::Running,
            started: now,
            ended: None,
            driver: driver.to_string(),
            attempt: 1,
            exit_code: None,
            log: None,
            message: None,
        }
    }

    /// The same hook started again by `driver` (the last one left it running).
    pub fn restart(&self, driver: &str, now: u64) -> HookRecord {
        HookRecord {
            state: HookState::Running,
            started: now,
            ended: None,
            driver: driver.to_string(),
            attempt: self.attempt.saturating_add(1),
            exit_code: None,
            log: None,
            message: None,
            ..self.clone()
        }
    }

    /// This running hook, ended.
    pub fn ended(
        &self,
        ok: bool,
        at: u64,
        exit_code: Option<i32>,
        log: Option<String>,
        message: Option<String>,
    ) -> HookRecord {
        HookRecord {
            state: if ok {
                HookState::Succeeded
            } else {
                HookState::Failed
            },
            ended: Some(at),
            exit_code,
            log,
            message,
            ..self.clone()
        }
    }

    /// The host's slot is done with: its `after` hook succeeded.
    pub fn finished(&self) -> bool {
        self.hook == HookKind::After && self.state == HookState::Succeeded
    }

    /// One line for people: `before hook running since T (driver D)`, `after hook
    /// failed: exit 3: ...`.
    pub fn describe(&self) -> String {
        let when = crate::time::utc_display;
        match self.state {
            HookState::Running => format!(
                "{} hook running since {} (driver {}{})",
                self.hook,
                when(self.started),
                self.driver,
                if self.attempt > 1 {
                    format!(", attempt {}", self.attempt)
                } else {
                    String::new()
                }
            ),
            HookState::Succeeded => format!(
                "{} hook succeeded at {}",
                self.hook,
                when(self.ended.unwrap_or(self.started))
            ),
            HookState::Failed => {
                let mut s = format!("{} hook failed", self.hook);
                if let Some(c) = self.exit_code {
                    s.push_str(&format!(" (exit {c})"));
                }
                if let Some(m) = &self.message {
                    s.push_str(&format!(": {}", one_line(m)));
                }
                if let Some(l) = &self.log {
                    s.push_str(&format!(" (log: {l}{})", self.log_place()));
                }
                s
            }
        }
    }

    /// Where a log that is a path lives: on the driver's host.
    fn log_place(&self) -> String {
        match &self.log {
            Some(l) if l.starts_with('/') => {
                let host = self
                    .driver
                    .rsplit_once('-')
                    .map_or(self.driver.as_str(), |(h, _)| h);
                format!(" on {host}")
            }
            _ => String::new(),
        }
    }
}

/// A message on one line: its lines joined by ` | `, at most 300 characters.
pub fn one_line(m: &str) -> String {
    let joined = m
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ");
    if joined.chars().count() > 300 {
        let cut: String = joined.chars().take(300).collect();
        format!("{cut} …")
    } else {
        joined
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_says_where_its_hook_stands() {
        let v = Version::new("v2").unwrap();
        let r = Role::new("compute").unwrap();
        let start = HookRecord::start(
            "20261123T020000Z-v2",
            &v,
            &r,
            HookKind::Before,
            "mgmt1-42",
            1_795_399_200,
        );
        let text = serde_json::to_string(&start).unwrap();
        assert_eq!(serde_json::from_str::<HookRecord>(&text).unwrap(), start);
        assert!(text.contains(r#""hook":"before","state":"running""#), "{text}");
        assert_eq!(
            start.describe(),
            "before hook running since 2026-11-23 02:00:00 UTC (driver mgmt1-42)"
        );
        let again = start.restart("mgmt2-7", 1_795_399_260);
        assert_eq!(again.attempt, 2);
        assert!(
            again.describe().ends_with("(driver mgmt2-7, attempt 2)"),
            "{}",
            again.describe()
        );
        let failed = again.ended(
            false,
            1_795_399_300,
            Some(3),
            Some("/var/lib/jioctl/hooks/x.log".into()),
            Some("nova: 2 instances left\ngiving up\n".into()),
        );
        assert_eq!(
            failed.describe(),
            "before hook failed (exit 3): nova: 2 instances left | giving up (log: /var/lib/jioctl/hooks/x.log on mgmt2)"
        );
        assert!(!failed.finished());
        let after = HookRecord::start(&start.rollout, &v, &r, HookKind::After, "mgmt1-42", 1).ended(
            true,
            2,
            Some(0),
            None,
            None,
        );
        assert!(after.finished());
        for bad in ["{}", r#"{"rollout":"x"}"#, &text.replace("running", "sleeping")] {
            assert!(serde_json::from_str::<HookRecord>(bad).is_err(), "{bad}");
        }
    }
}
