//! What the agent does with the fleet commands of its inbox (`jioctl run`), decided
//! purely: each command this agent has not finished, as read, is skipped, waits for
//! a hold, runs, is refused, or is reported interrupted. `decide` takes the first
//! one that does something; the agent acts on it (`agent/commands`).

use jio_common::command_record::{CommandRecord, Started};
use jio_common::names::{CommandId, HostName};
use jio_common::store::Revision;

/// What the agent does with one command of its inbox (`step`, pure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandStep {
    /// Nothing to run for it; `forget`: remembered as done (it never will be).
    Skip {
        why: String,
        forget: bool,
    },
    /// A hold keeps the host out: the command waits.
    Held {
        why: String,
    },
    Run {
        attempt: u32,
    },
    /// Reported as refused, never run.
    Refuse {
        reason: String,
    },
    /// It was started before and this agent cannot say how it ended: reported
    /// `interrupted`, not run again.
    Interrupted {
        reason: String,
    },
}

/// One command of the host's inbox that this agent has not finished, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: CommandId,
    /// This host.
    pub host: HostName,
    /// The record (`None`: gone; `Err`: cannot be read, naming the key).
    pub record: Option<Result<CommandRecord, String>>,
    pub started: Option<Result<Started, String>>,
    /// A result is in the store already.
    pub result: bool,
    /// Mod revisions of the record and of the start as read (0: absent): a run
    /// starts only while they are so.
    pub revisions: (Revision, Revision),
}

/// The rule, in order: a command whose record is gone is skipped, one whose record
/// cannot be read is refused; one with a result is done; one started before (its
/// start is in the store, not in this agent's journal) is interrupted, or runs
/// again with `rerun_interrupted` while the command is active; an ended command is
/// skipped; one that does not name this host is refused; a held host waits;
/// otherwise it runs.
/// `hold`: the key of the hold that keeps this host out, if any.
pub fn step(c: &Candidate, hold: Option<&str>) -> CommandStep {
    let rec = match &c.record {
        None => {
            return CommandStep::Skip {
                why: "its record is gone".into(),
                forget: true,
            };
        }
        Some(Err(e)) => {
            return CommandStep::Refuse {
                reason: format!("refused: the command's record cannot be read: {e}"),
            };
        }
        Some(Ok(r)) => r,
    };
    if c.result {
        return CommandStep::Skip {
            why: "its result is in the store".into(),
            forget: true,
        };
    }
    let mine = rec.hosts.contains(&c.host);
    // A start nobody will ever end otherwise: its result says so, whatever the
    // command's state (a follower waits for it).
    let attempt = match &c.started {
        None => 1,
        Some(Ok(s)) if rec.rerun_interrupted && rec.state.active() && mine => s.attempt.saturating_add(1),
        Some(Ok(s)) => {
            return CommandStep::Interrupted {
                reason: format!(
                    "attempt {} started at {} and this agent has no record of it ending; not run again{}",
                    s.attempt,
                    jio_common::plan::when(s.at),
                    if rec.rerun_interrupted {
                        format!(" (the command is {})", rec.state.name())
                    } else {
                        " (the command was not created with --rerun-interrupted)".into()
                    }
                ),
            };
        }
        Some(Err(e)) => {
            return CommandStep::Interrupted {
                reason: format!("its start record cannot be read ({e}); not run again"),
            };
        }
    };
    if !rec.state.active() {
        return CommandStep::Skip {
            why: format!("the command is {}", rec.state.name()),
            forget: true,
        };
    }
    if !mine {
        return CommandStep::Refuse {
            reason: format!(
                "refused: this host is not one of the command's hosts ({})",
                rec.targets
            ),
        };
    }
    if let Some(key) = hold {
        return CommandStep::Held {
            why: format!("held ({key})"),
        };
    }
    CommandStep::Run { attempt }
}

/// The commands of the inbox, in order, as `step` takes them: those skipped (and
/// whether they are forgotten), a hold that keeps the next one waiting, and the
/// first that does something.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    pub skipped: Vec<(CommandId, String, bool)>,
    pub held: Option<(CommandId, String)>,
    pub act: Option<(CommandId, CommandStep)>,
}

/// Takes the candidates in order until one is held or does something.
pub fn scan(candidates: &[Candidate], hold: Option<&str>) -> Scan {
    let mut out = Scan::default();
    for c in candidates {
        match step(c, hold) {
            CommandStep::Skip { why, forget } => out.skipped.push((c.id.clone(), why, forget)),
            CommandStep::Held { why } => {
                out.held = Some((c.id.clone(), why));
                break;
            }
            other => {
                out.act = Some((c.id.clone(), other));
                break;
            }
        }
    }
    out
}

/// A command's record made by hand, for the unit tests of the agent.
#[cfg(test)]
pub(crate) mod fixtures {
    use jio_common::command_record::{CommandRecord, CommandState, Targets};
    use jio_common::names::{CommandId, HostName};

    /// A command's record naming `hosts`.
    pub(crate) fn rec(hosts: &[&str], rerun: bool, state: CommandState) -> CommandRecord {
        CommandRecord {
            id: CommandId::parse("20261125T030000Z-restart").unwrap(),
            action: "restart".into(),
            args: vec![],
            targets: Targets::All,
            hosts: hosts.iter().map(|h| HostName::new(*h).unwrap()).collect(),
            rules: serde_json::json!({}),
            timeout_s: None,
            rerun_interrupted: rerun,
            created_by: "alice".into(),
            created_at: 1,
            state,
            changes: vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::rec;
    use super::*;
    use crate::decide::Hold;
    use jio_common::command_record::CommandState;
    use jio_common::names::HostName;

    /// A command's record, its start, whether its result is in the store, its
    /// hold, and what the agent does with it.
    type Case<'a> = (
        Option<Result<CommandRecord, String>>,
        Option<Result<Started, String>>,
        bool,
        Option<&'a Hold>,
        &'a str,
    );

    /// The cases of `what_an_agent_does_with_a_command`, on compute1.
    fn command_cases(hold: &Hold) -> Vec<Case<'_>> {
        let started = Started {
            at: 5,
            pid: 1,
            attempt: 1,
        };
        let running = CommandState::Running;
        let cancelled = CommandState::Cancelled {
            by: "bob".into(),
            reason: None,
        };
        vec![
            (None, None, false, None, "skip"),
            (Some(Err("bad".into())), None, false, None, "refuse"),
            (
                Some(Ok(rec(&["compute1"], false, cancelled))),
                None,
                false,
                None,
                "skip",
            ),
            (
                Some(Ok(rec(&["compute2"], false, running.clone()))),
                None,
                false,
                None,
                "refuse",
            ),
            (
                Some(Ok(rec(&["compute1"], false, running.clone()))),
                None,
                true,
                None,
                "skip",
            ),
            (
                Some(Ok(rec(&["compute1"], false, running.clone()))),
                Some(Ok(started.clone())),
                false,
                None,
                "interrupted",
            ),
            (
                Some(Ok(rec(&["compute1"], false, running.clone()))),
                Some(Err("bad".into())),
                false,
                None,
                "interrupted",
            ),
            (
                Some(Ok(rec(&["compute1"], true, running.clone()))),
                Some(Ok(started.clone())),
                false,
                None,
                "run 2",
            ),
            (
                Some(Ok(rec(&["compute1"], true, running.clone()))),
                Some(Ok(started.clone())),
                false,
                Some(hold),
                "held",
            ),
            (
                Some(Ok(rec(&["compute1"], false, running.clone()))),
                None,
                false,
                Some(hold),
                "held",
            ),
            (
                Some(Ok(rec(&["compute1"], false, running.clone()))),
                None,
                false,
                None,
                "run 1",
            ),
        ]
    }

    /// What `step` decided, in a word (and the attempt of a run).
    fn step_name(s: &CommandStep) -> String {
        match s {
            CommandStep::Skip { .. } => "skip".to_string(),
            CommandStep::Held { .. } => "held".into(),
            CommandStep::Run { attempt } => format!("run {attempt}"),
            CommandStep::Refuse { .. } => "refuse".into(),
            CommandStep::Interrupted { .. } => "interrupted".into(),
        }
    }

    #[test]
    fn what_an_agent_does_with_a_command() {
        let h = HostName::new("compute1").unwrap();
        let hold = Hold {
            key: "/holds/host/compute1".into(),
            record: Err("x".into()),
        };
        let cases = command_cases(&hold);
        for (i, (record, started, result, hold, want)) in cases.into_iter().enumerate() {
            let c = Candidate {
                id: CommandId::parse("20261125T030000Z-restart").unwrap(),
                host: h.clone(),
                record,
                started,
                result,
                revisions: (0, 0),
            };
            let got = step_name(&step(&c, hold.map(|h| h.key.as_str())));
            assert_eq!(got, want, "case {i}");
        }
    }
}
