//! `jioctl reboot` on this host: a fleet command whose action is the agent's own
//! reboot (`REBOOT_ACTION`). It starts like any command (journaled, then fenced
//! on the inbox, the record and the holds), so it shares the fleet's slots with
//! rollouts and other commands; it is then carried through the boot like a run's
//! reboot (`agent/reboot`), and its result is reported only when the host is back
//! with a new boot id and validated.

use jio_common::command_record::{CommandRecord, CommandResult, ONLY_IF_REQUIRED, RunOutcome};
use jio_common::keys::Step;
use jio_common::names::{CommandId, Version};
use jio_common::store::Revision;
use jio_common::values::AgentState;

use super::{Agent, AgentError};
use crate::decide::Observation;
use crate::pass::PassResult;
use crate::reboot::{self, RebootWait, Required};
use crate::runner::Outcome;

impl Agent {
    /// Runs `jioctl reboot`'s command `rec` on this host: nothing to do when only
    /// a required reboot was asked for and none is; otherwise started (fenced),
    /// journaled and carried out by `pass_reboot`.
    pub(super) async fn command_reboot(
        &mut self,
        rec: CommandRecord,
        attempt: u32,
        revs: (Revision, Revision),
        obs: &Observation,
    ) -> Result<PassResult, AgentError> {
        let id = rec.id.clone();
        let now = self.clock.unix_now();
        let run_dir = match crate::rundir::create_named(&self.cfg.state_dir, &format!("command-{id}"), now) {
            Ok(d) => d,
            Err((_, reason)) => {
                return self
                    .command_not_run(&id, RunOutcome::Failed, reason, 0, attempt)
                    .await;
            }
        };
        let Some(version) = obs.local.clone() else {
            let reason = "this host has no local version to validate after the reboot (it never converged)"
                .to_string();
            return self
                .command_not_run(&id, RunOutcome::Refused, reason, now, attempt)
                .await;
        };
        self.journal_command_start(&rec, attempt, now, &run_dir);
        if !self.start_command(&id, attempt, now, revs, obs).await? {
            return Ok(PassResult::Raced);
        }
        let only_if_required = rec.args.iter().any(|a| a == ONLY_IF_REQUIRED);
        let why = match self.reboot_required(&run_dir).await {
            Err(reason) => Err(reason),
            Ok(Required::No) if only_if_required => Ok(None),
            Ok(Required::No) => Ok(Some(format!("jioctl reboot (command {id})"))),
            Ok(r) => Ok(Some(reboot::required_text(&r))),
        };
        let why = match why {
            Ok(Some(why)) => why,
            Ok(None) => {
                tracing::info!(command = %id, "no reboot is required: nothing to do");
                let done = (
                    Outcome::Success { changes: false },
                    Some("no reboot was required".to_string()),
                );
                return self.report_command_reboot(&id, &run_dir, done, None).await;
            }
            Err(reason) => {
                return self
                    .report_command_reboot(&id, &run_dir, (Outcome::Failure(reason), None), None)
                    .await;
            }
        };
        tracing::info!(command = %id, %why, "jioctl reboot: this host reboots inside the command's slot");
        if let Err(reason) = self.journal_reboot_of(&version, &run_dir, why, Some(id.to_string())) {
            return self
                .report_command_reboot(&id, &run_dir, (Outcome::Failure(reason), None), None)
                .await;
        }
        let w = self.ledger.journal.reboot.clone().expect("journaled just now");
        self.pass_reboot(w).await
    }

    /// Ends the reboot of command `id`: after a new boot (`outcome` success) the
    /// host validates again and fails if a reboot is still required.
    pub(super) async fn end_command_reboot(
        &mut self,
        w: RebootWait,
        id: &str,
        outcome: Outcome,
    ) -> Result<PassResult, AgentError> {
        self.ledger.journal.reboot = None;
        self.ledger.save();
        let Some(id) = CommandId::parse(id) else {
            tracing::error!(
                command = id,
                "the journaled reboot names no valid command; it is dropped"
            );
            self.ledger.journal.commands.in_progress = None;
            self.ledger.save();
            return Ok(PassResult::Reported);
        };
        let (mut outcome, mut code) = (outcome, None);
        if outcome.ok() {
            self.set_record(AgentState::Command, Some(w.version.clone()));
            (outcome, code) = self.validate_after_boot(&w.version, &w.run_dir).await;
        }
        if outcome == Outcome::Interrupted {
            // The journal keeps the command: the next start reports it interrupted.
            return Ok(PassResult::Command {
                id: id.to_string(),
                outcome: RunOutcome::Interrupted,
            });
        }
        self.report_command_reboot(&id, &w.run_dir, (outcome, None), code)
            .await
    }

    /// The validation after a boot: the steps' own, then whether a reboot is
    /// still required (a failure: never a second reboot in the same run).
    pub(super) async fn validate_after_boot(
        &mut self,
        version: &Version,
        run_dir: &std::path::Path,
    ) -> (Outcome, Option<i32>) {
        let (outcome, code) = self.step_coded(Step::Validated, version, run_dir).await;
        if !outcome.ok() {
            return (outcome, code);
        }
        match self
            .reboot_required(run_dir)
            .await
            .and_then(|r| reboot::after_boot(&r))
        {
            Ok(()) => (outcome, code),
            Err(reason) => (Outcome::Failure(reason), code),
        }
    }

    /// Reports the command's result on this host (`done`: the outcome and a note
    /// for a success), which ends its slot.
    async fn report_command_reboot(
        &mut self,
        id: &CommandId,
        run_dir: &std::path::Path,
        done: (Outcome, Option<String>),
        exit_code: Option<i32>,
    ) -> Result<PassResult, AgentError> {
        let (outcome, note) = done;
        let run = self.ledger.journal.commands.in_progress.clone();
        let result = CommandResult {
            outcome: if outcome.ok() {
                RunOutcome::Succeeded
            } else {
                RunOutcome::Failed
            },
            exit_code,
            message: match &outcome {
                Outcome::Failure(reason) => Some(reason.clone()),
                _ => note,
            },
            started: run.as_ref().map_or(0, |r| r.started),
            ended: self.clock.unix_now(),
            run_dir: Some(run_dir.display().to_string()),
            attempt: run.as_ref().map_or(1, |r| r.attempt),
        };
        let ended = result.outcome;
        self.journal_command_result(id, result, run_dir);
        if let Err(e) = self.flush_commands(true).await {
            tracing::warn!(error = %e, "the command's result stays in the journal and is reported when the store takes it");
        }
        Ok(PassResult::Command {
            id: id.to_string(),
            outcome: ended,
        })
    }
}
