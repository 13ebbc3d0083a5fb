//! A fleet command's stored vocabulary (`jioctl run`): which hosts it was asked
//! for, its record and state, each host's run (started, result, log link), the
//! inbox of ids a host is admitted to, and the view of a command's runs read from
//! the store. Its planner is in `command`.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::keys::RunPart;
use crate::names::{CommandId, HostName, Role};
use crate::rollout::Change;
use crate::store::api::KeyValue;

/// Finished commands kept as history; older ones are deleted when a command is
/// created.
pub const HISTORY: usize = 100;

/// The built-in action of `jioctl reboot`: the agent reboots its host inside the
/// command's slot and reports success once it is back with a new boot id and
/// validated (with `--only-if-required`: only when a reboot is required). Names
/// starting with `@` are built in: `jioctl run` refuses them as actions.
pub const REBOOT_ACTION: &str = "@reboot";

/// `jioctl reboot --only-if-required`, as the argument of `REBOOT_ACTION`.
pub const ONLY_IF_REQUIRED: &str = "--only-if-required";

/// Which hosts a command was asked for (its hosts are resolved from this once).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Targets {
    All,
    Roles(Vec<Role>),
    Hosts(Vec<HostName>),
}

impl std::fmt::Display for Targets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Targets::All => f.write_str("all hosts"),
            Targets::Roles(r) => write!(
                f,
                "role{} {}",
                if r.len() == 1 { "" } else { "s" },
                r.iter().map(Role::as_str).collect::<Vec<_>>().join(", ")
            ),
            Targets::Hosts(h) => {
                let names: Vec<&str> = h.iter().take(8).map(HostName::as_str).collect();
                write!(
                    f,
                    "host{} {}{}",
                    if h.len() == 1 { "" } else { "s" },
                    names.join(", "),
                    if h.len() > 8 {
                        format!(" and {} more", h.len() - 8)
                    } else {
                        String::new()
                    }
                )
            }
        }
    }
}

/// Where a command stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum CommandState {
    Running,
    /// Every host succeeded.
    Done,
    /// Not every host succeeded: each that did not, with why (failed, refused,
    /// interrupted, or held and never run).
    Failed {
        failed_hosts: BTreeMap<String, String>,
    },
    /// `jioctl commands cancel`: no more hosts start; running ones finish.
    Cancelled {
        by: String,
        reason: Option<String>,
    },
    /// Ended by the emergency stop (`global-disable-puppet`).
    Aborted {
        by: String,
        reason: Option<String>,
    },
}

impl CommandState {
    pub fn name(&self) -> &'static str {
        match self {
            CommandState::Running => "running",
            CommandState::Done => "done",
            CommandState::Failed { .. } => "failed",
            CommandState::Cancelled { .. } => "cancelled",
            CommandState::Aborted { .. } => "aborted",
        }
    }

    pub fn active(&self) -> bool {
        matches!(self, CommandState::Running)
    }
}

/// The record at `/commands/<id>`: what to run, where, under which rules, who
/// asked, and where it stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandRecord {
    pub id: CommandId,
    /// An action's name (`<actions_dir>/<name>` on the node), or a program when
    /// the nodes allow any command.
    pub action: String,
    pub args: Vec<String>,
    pub targets: Targets,
    /// The hosts, resolved from `targets` when the command was created.
    pub hosts: Vec<HostName>,
    /// The rules as given and validated.
    pub rules: serde_json::Value,
    /// How long the action may run on one host (seconds); `None`: the agent's
    /// `command_timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<u64>,
    /// A run interrupted by a crash or a restart of the agent runs again.
    #[serde(default)]
    pub rerun_interrupted: bool,
    /// Who created it (`user@host`) and when.
    pub created_by: String,
    pub created_at: u64,
    #[serde(flatten)]
    pub state: CommandState,
    pub changes: Vec<Change>,
}

impl CommandRecord {
    /// The record after a change to `state`, by `by`.
    pub fn moved(&self, state: CommandState, by: &str, at: u64, reason: Option<String>) -> CommandRecord {
        let mut r = self.clone();
        r.changes.push(Change {
            state: state.name().into(),
            by: by.into(),
            at,
            reason,
        });
        r.state = state;
        r
    }

    /// The action and its arguments, as a person would type them.
    pub fn command_line(&self) -> String {
        std::iter::once(&self.action)
            .chain(&self.args)
            .map(|a| {
                if !a.is_empty()
                    && a.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c))
                {
                    a.clone()
                } else {
                    format!("'{}'", a.replace('\'', "'\\''"))
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Written by the agent when it starts the action (`/command_runs/<id>/started/<host>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    pub at: u64,
    pub pid: u32,
    /// 1, or more when an interrupted run runs again (`--rerun-interrupted`).
    pub attempt: u32,
}

/// How a host's run of a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    Succeeded,
    /// The action ran and failed (an exit code, a signal, its timeout).
    Failed,
    /// The agent would not run it (not installed, not allowed): it never ran.
    Refused,
    /// The agent stopped (a crash, a restart) while it ran; not run again unless
    /// the command allows it.
    Interrupted,
}

impl RunOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            RunOutcome::Succeeded => "succeeded",
            RunOutcome::Failed => "failed",
            RunOutcome::Refused => "refused",
            RunOutcome::Interrupted => "interrupted",
        }
    }
}

/// `/command_runs/<id>/results/<host>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandResult {
    pub outcome: RunOutcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why, on one line (absent on success).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the action started (0: it never did) and ended, on the agent's clock.
    pub started: u64,
    pub ended: u64,
    /// Where its output is on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_dir: Option<String>,
    pub attempt: u32,
}

impl CommandResult {
    pub fn ok(&self) -> bool {
        self.outcome == RunOutcome::Succeeded
    }

    pub fn duration_s(&self) -> u64 {
        if self.started == 0 {
            0
        } else {
            self.ended.saturating_sub(self.started)
        }
    }
}

/// The ids a host is admitted to, oldest first (`/config_state/commands/<host>`).
pub type Inbox = Vec<CommandId>;

/// Reads an inbox: the ids that can be read, and why the rest cannot (naming the key).
pub fn parse_inbox(kv: &KeyValue) -> (Inbox, Option<String>) {
    match crate::values::parse_json::<Vec<String>>(kv) {
        Ok(ids) => {
            let mut bad = Vec::new();
            let mut out: Inbox = ids
                .iter()
                .filter_map(|s| {
                    let id = CommandId::parse(s);
                    if id.is_none() {
                        bad.push(format!("{s:?}"));
                    }
                    id
                })
                .collect();
            out.sort();
            out.dedup();
            let why = (!bad.is_empty())
                .then(|| format!("{}: not command ids, ignored: {}", kv.key, bad.join(", ")));
            (out, why)
        }
        Err(e) => (Vec::new(), Some(e.to_string())),
    }
}

/// The JSON of an inbox.
pub fn format_inbox(ids: &BTreeSet<CommandId>) -> String {
    serde_json::to_string(&ids.iter().map(CommandId::as_str).collect::<Vec<_>>()).unwrap_or_default()
}

/// What the store holds of one command's runs, by host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Runs {
    pub started: BTreeMap<HostName, Started>,
    pub results: BTreeMap<HostName, CommandResult>,
    pub logs: BTreeMap<HostName, String>,
    /// Values that cannot be read, by key (a result that cannot be read counts as
    /// a failure: the safe reading).
    pub problems: Vec<String>,
    pub invalid_results: BTreeSet<HostName>,
    pub invalid_started: BTreeSet<HostName>,
    /// Nobody holds the command's lock (`/command_runs/<id>/lock` is absent).
    pub lock_absent: bool,
}

impl Runs {
    /// Builds the view from a listing of `/command_runs/<id>/`.
    pub fn from_kvs<'a>(
        schema: &crate::keys::Schema,
        id: &CommandId,
        kvs: impl IntoIterator<Item = &'a KeyValue>,
    ) -> Runs {
        let mut r = Runs {
            lock_absent: true,
            ..Runs::default()
        };
        for kv in kvs {
            let parsed = schema.parse(&kv.key);
            if matches!(&parsed, Some(crate::keys::Parsed::CommandLock(kid)) if kid == id) {
                r.lock_absent = false;
                continue;
            }
            let Some(crate::keys::Parsed::CommandRun(kid, part, h)) = parsed else {
                continue;
            };
            if &kid != id {
                continue;
            }
            match part {
                RunPart::Started => match crate::values::parse_json::<Started>(kv) {
                    Ok(s) => {
                        r.started.insert(h, s);
                    }
                    Err(e) => {
                        r.problems.push(e.to_string());
                        r.invalid_started.insert(h);
                    }
                },
                RunPart::Results => match crate::values::parse_json::<CommandResult>(kv) {
                    Ok(s) => {
                        r.results.insert(h, s);
                    }
                    Err(e) => {
                        r.problems.push(e.to_string());
                        r.invalid_results.insert(h);
                    }
                },
                RunPart::Logs => match crate::values::text(kv) {
                    Ok(t) => {
                        r.logs.insert(h, t.to_string());
                    }
                    Err(e) => r.problems.push(e.to_string()),
                },
            }
        }
        r
    }

    /// The host's run ended (a result, or one that cannot be read).
    pub fn ended(&self, h: &HostName) -> bool {
        self.results.contains_key(h) || self.invalid_results.contains(h)
    }

    /// The host's agent started the action.
    pub fn started(&self, h: &HostName) -> bool {
        self.started.contains_key(h) || self.invalid_started.contains(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inbox_keeps_the_ids_it_can_read_and_names_the_rest() {
        let kv = KeyValue {
            key: crate::keys::Key::new("/config_state/commands/compute1").unwrap(),
            value: r#"["20261125T030000Z-b", "nonsense", "20261125T020000Z-a"]"#.into(),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: None,
            not_text: false,
        };
        let (ids, why) = parse_inbox(&kv);
        assert_eq!(
            ids.iter().map(CommandId::as_str).collect::<Vec<_>>(),
            ["20261125T020000Z-a", "20261125T030000Z-b"]
        );
        assert!(why.unwrap().contains("\"nonsense\""));
        let bad = KeyValue {
            value: "{".into(),
            ..kv
        };
        let (ids, why) = parse_inbox(&bad);
        assert!(ids.is_empty());
        assert!(why.unwrap().contains("/config_state/commands/compute1"));
    }
}
