//! Fleet commands on this host (`jioctl run`): the inbox's commands read into the
//! observation, and what `decide` chose for them done: the first command of the
//! inbox that this host has not finished is run, refused, or reported interrupted,
//! before any upgrade is considered (a run already going always finishes first: the
//! agent runs one thing at a time).
//!
//! Exactly once: the command is in the journal before its start is written, and
//! its start is one transaction fenced on the inbox, the command's record (not
//! cancelled), the host's holds and its start and result keys as read. An agent
//! that finds a command in its journal at its next start (it died or was stopped
//! while the action ran) reports it `interrupted` and does not run it again,
//! unless the command was created with `--rerun-interrupted`.

use std::os::unix::fs::PermissionsExt as _;

use jio_common::command_record::{CommandRecord, CommandResult, RunOutcome, Started};
use jio_common::keys::{Key, RunPart};
use jio_common::names::CommandId;
use jio_common::store::{Compare, KeyValue, Op, Revision, Txn};
use jio_common::values::{AgentState, parse_json};

use super::Agent;
use crate::command_step::{Candidate, CommandStep};
use crate::config::Config;
use crate::decide::{self, Decision, Observation};
use crate::error::AgentError;
use crate::pass::PassResult;
use crate::runner::{self, Outcome, ProcessGroup, Spec};
use crate::state::{CommandRun, PendingCommandReport};

/// The argument list a command runs as on this host, or why it is refused: an
/// action installed in `actions_dir`, or (only with `allow_any_command`) the
/// action and arguments as given.
pub fn resolve(cfg: &Config, rec: &CommandRecord) -> Result<Vec<String>, String> {
    let a = &rec.action;
    let simple = !a.is_empty() && !a.contains('/') && a != "." && a != ".." && !a.starts_with('-');
    let mut why = None;
    if simple {
        let path = cfg.actions_dir.join(a);
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {
                let mut argv = vec![path.to_string_lossy().into_owned()];
                argv.extend(rec.args.iter().cloned());
                return Ok(argv);
            }
            Ok(_) => why = Some(format!("{} is not an executable file", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                why = Some(format!(
                    "action {a:?} is not installed on this host (no {})",
                    path.display()
                ))
            }
            Err(e) => why = Some(format!("cannot read {}: {e}", path.display())),
        }
    }
    if cfg.allow_any_command {
        let mut argv = vec![a.clone()];
        argv.extend(rec.args.iter().cloned());
        return Ok(argv);
    }
    Err(match why {
        Some(w) => format!(
            "refused: {w}, and allow_any_command is off in this agent's configuration (only installed actions run)"
        ),
        None => format!(
            "refused: {a:?} is not an action name, and an argument list runs only where the agent's allow_any_command = true"
        ),
    })
}

/// Why a command that was running when the agent stopped is not run again.
fn interrupted_reason(run: &CommandRun) -> String {
    format!(
        "the agent stopped while the action ran (attempt {}, started at {}); not run again{}",
        run.attempt,
        jio_common::plan::when(run.started),
        if run.rerun_interrupted {
            " (the command ended meanwhile)"
        } else {
            " (the command was not created with --rerun-interrupted)"
        }
    )
}

/// The environment an action runs with: the command, host, role, run directory
/// and attempt.
fn command_env(
    cfg: &Config,
    id: &CommandId,
    attempt: u32,
    run_dir: &std::path::Path,
) -> Vec<(String, String)> {
    [
        ("JIO_COMMAND", id.to_string()),
        ("JIO_HOST", cfg.hostname.to_string()),
        ("JIO_ROLE", cfg.role.to_string()),
        ("JIO_RUN_DIR", run_dir.display().to_string()),
        ("JIO_ATTEMPT", attempt.to_string()),
    ]
    .map(|(k, v)| (k.to_string(), v))
    .to_vec()
}

/// A failed action's message: the reason and the first meaningful line of its
/// stderr (else stdout); `None` unless it failed.
fn failure_message(outcome: &Outcome, run_dir: &std::path::Path) -> Option<String> {
    match outcome {
        Outcome::Failure(reason) => {
            let detail = ["action.stderr", "action.stdout"].iter().find_map(|n| {
                let text = std::fs::read_to_string(run_dir.join(n)).ok()?;
                crate::results::first_meaningful_line(&text)
            });
            Some(crate::results::message(reason, detail.as_deref()))
        }
        _ => None,
    }
}

impl Agent {
    /// Reads the inbox's commands this agent has not finished, each as its record,
    /// start and result (nothing while a run is in the journal: it is recovered
    /// first).
    pub(super) async fn read_commands(&self, obs: &mut Observation) -> Result<(), AgentError> {
        let commands = &self.ledger.journal.commands;
        obs.commands.in_progress = commands.in_progress.is_some();
        if obs.commands.in_progress {
            return Ok(());
        }
        let ids: Vec<CommandId> = obs
            .commands
            .inbox
            .iter()
            .filter(|id| !commands.is_done(id.as_str()))
            .cloned()
            .collect();
        let mut candidates = Vec::new();
        for id in ids {
            let got = self.store.get_many(&self.command_keys(&id)).await?;
            let Ok(kvs) = <[Option<KeyValue>; 3]>::try_from(got) else {
                continue;
            };
            candidates.push(self.candidate(id, kvs));
        }
        obs.commands.candidates = candidates;
        Ok(())
    }

    /// One command as read: its record, start and result.
    fn candidate(&self, id: CommandId, [rec_kv, started_kv, result_kv]: [Option<KeyValue>; 3]) -> Candidate {
        Candidate {
            id,
            host: self.cfg.hostname.clone(),
            record: rec_kv
                .as_ref()
                .map(|kv| parse_json::<CommandRecord>(kv).map_err(|e| e.to_string())),
            started: started_kv
                .as_ref()
                .map(|kv| parse_json::<Started>(kv).map_err(|e| e.to_string())),
            result: result_kv.is_some(),
            revisions: (
                rec_kv.map_or(0, |kv| kv.mod_revision),
                started_kv.map_or(0, |kv| kv.mod_revision),
            ),
        }
    }

    /// What `decide` made of the inbox, noted: a problem reading it, the commands
    /// skipped (forgotten when they never will run here), one held.
    pub(super) fn note_commands(&mut self, obs: &Observation) {
        if let Some(p) = &obs.commands.problem {
            self.note_command(format!("command inbox: {p}"), true);
        }
        let scan = decide::commands(obs);
        for (id, why, forget) in &scan.skipped {
            tracing::info!(command = %id, "fleet command not run here: {why}");
            if *forget {
                self.ledger.journal.commands.mark_done(id.as_str());
                self.ledger.save();
            }
        }
        if let Some((id, why)) = &scan.held {
            self.note_command(format!("fleet command {id} waits: the host is {why}"), false);
        }
    }

    /// Acts on `decide`'s choice for a fleet command: recover a run in the journal,
    /// or run, refuse or report interrupted one command of the inbox.
    pub(super) async fn command(
        &mut self,
        decision: Decision,
        obs: &Observation,
    ) -> Result<PassResult, AgentError> {
        let (id, step) = match decision {
            Decision::Command { id, step } => (id, step),
            _ => return self.recover_command(obs).await,
        };
        let Some(c) = obs.commands.candidates.iter().find(|c| c.id == id) else {
            return Ok(PassResult::Reported);
        };
        let started = c.started.clone().and_then(Result::ok);
        match step {
            CommandStep::Refuse { reason } => {
                tracing::warn!(command = %id, "{reason}");
                let at = started.map_or(0, |s| s.at);
                self.command_not_run(&id, RunOutcome::Refused, reason, at, 1)
                    .await
            }
            CommandStep::Interrupted { reason } => {
                tracing::warn!(command = %id, "fleet command interrupted: {reason}");
                let (at, attempt) = started.map_or((0, 1), |s| (s.at, s.attempt));
                self.command_not_run(&id, RunOutcome::Interrupted, reason, at, attempt)
                    .await
            }
            CommandStep::Run { attempt } => {
                let Some(Ok(rec)) = c.record.clone() else {
                    return Ok(PassResult::Reported);
                };
                self.command_run(rec, attempt, c.revisions, obs).await
            }
            // Never chosen by `decide` (a skip or a hold goes on to the upgrade's
            // decision).
            CommandStep::Skip { .. } | CommandStep::Held { .. } => Ok(PassResult::Reported),
        }
    }

    /// Logs a note about commands once until it changes.
    fn note_command(&mut self, note: String, error: bool) {
        if self.command_note.as_ref() != Some(&note) {
            if error {
                tracing::error!("{note}");
            } else {
                tracing::info!("{note}");
            }
            self.command_note = Some(note);
        }
    }

    /// A command in the journal from before this pass: an agent died or was
    /// stopped while it ran, or before its start was confirmed.
    async fn recover_command(&mut self, obs: &Observation) -> Result<PassResult, AgentError> {
        let Some(run) = self.ledger.journal.commands.in_progress.clone() else {
            return Ok(PassResult::Reported);
        };
        let Some(id) = CommandId::parse(&run.id) else {
            self.ledger.journal.commands.in_progress = None;
            self.ledger.save();
            return Ok(PassResult::Reported);
        };
        let got = self.store.get_many(&self.command_keys(&id)).await?;
        let kvs: [Option<KeyValue>; 3] = got.try_into().unwrap_or_default();
        if !run.confirmed {
            return self.recover_unconfirmed(&run, &id, kvs, obs).await;
        }
        let [rec_kv, _, result_kv] = kvs;
        let host = &self.cfg.hostname;
        let rerun = rec_kv
            .as_ref()
            .and_then(|kv| parse_json::<CommandRecord>(kv).ok())
            .is_some_and(|r| r.rerun_interrupted && r.state.active() && r.hosts.contains(host));
        if rerun && result_kv.is_none() {
            tracing::warn!(command = %id, attempt = run.attempt, "a fleet command was interrupted (the agent stopped while it ran); it runs again (--rerun-interrupted)");
            self.ledger.journal.commands.in_progress = None;
            self.ledger.save();
            return Ok(PassResult::Reported);
        }
        let reason = interrupted_reason(&run);
        tracing::warn!(command = %id, "fleet command interrupted: {reason}");
        let ended = self.clock.unix_now();
        let result = CommandResult {
            outcome: RunOutcome::Interrupted,
            exit_code: None,
            message: Some(reason),
            started: run.started,
            ended,
            run_dir: Some(run.run_dir.display().to_string()),
            attempt: run.attempt,
        };
        self.journal_command_result(&id, result, &run.run_dir);
        self.flush_commands(false).await?;
        Ok(PassResult::Reported)
    }

    /// The keys a command is read by on this host: its record, its start and its result.
    fn command_keys(&self, id: &CommandId) -> [Key; 3] {
        let host = &self.cfg.hostname;
        [
            self.cfg.schema.command(id),
            self.cfg.schema.command_run(id, RunPart::Started, host),
            self.cfg.schema.command_run(id, RunPart::Results, host),
        ]
    }

    /// A journaled command whose start was never confirmed: the action never ran
    /// (it is spawned only once the start is confirmed). If its start reached the
    /// store, the command runs now if it still may, else the start is taken back.
    async fn recover_unconfirmed(
        &mut self,
        run: &CommandRun,
        id: &CommandId,
        [rec_kv, started_kv, result_kv]: [Option<KeyValue>; 3],
        obs: &Observation,
    ) -> Result<PassResult, AgentError> {
        let host = self.cfg.hostname.clone();
        let record = rec_kv
            .as_ref()
            .and_then(|kv| parse_json::<CommandRecord>(kv).ok());
        // Whether the start reached the store is told by its record.
        let ours = started_kv
            .as_ref()
            .and_then(|kv| parse_json::<Started>(kv).ok())
            .is_some_and(|s| s.attempt == run.attempt && s.at == run.started);
        self.ledger.journal.commands.in_progress = None;
        self.ledger.save();
        let Some(kv) = started_kv.filter(|_| ours) else {
            tracing::info!(command = %id, "a fleet command's start was not written before the agent stopped; it never ran");
            return Ok(PassResult::Reported);
        };
        // Written but never run: it runs now if it still may, else the start
        // is taken back (fenced on it), so that nobody waits for it.
        if let Some(rec) = record.filter(|r| {
            r.state.active()
                && r.hosts.contains(&host)
                && obs.commands.inbox.contains(id)
                && obs.hold.is_none()
                && result_kv.is_none()
        }) {
            tracing::info!(command = %id, "a fleet command's start was written but its action never ran; it runs now");
            let rec_rev = rec_kv.map_or(0, |kv| kv.mod_revision);
            return self
                .command_run(rec, run.attempt, (rec_rev, kv.mod_revision), obs)
                .await;
        }
        let txn = Txn::new()
            .when(Compare::ModRevision(kv.key.clone(), kv.mod_revision))
            .then(Op::Delete(kv.key.clone()));
        self.store.txn(txn).await?;
        tracing::info!(command = %id, "a fleet command's start was written but its action never ran, and it may not run now; its start is taken back");
        Ok(PassResult::Reported)
    }

    /// Reports a command this host does not run (refused, or interrupted before).
    pub(super) async fn command_not_run(
        &mut self,
        id: &CommandId,
        outcome: RunOutcome,
        reason: String,
        started: u64,
        attempt: u32,
    ) -> Result<PassResult, AgentError> {
        let result = CommandResult {
            outcome,
            exit_code: None,
            message: Some(reason),
            started,
            ended: self.clock.unix_now(),
            run_dir: None,
            attempt,
        };
        let j = &mut self.ledger.journal.commands;
        j.mark_done(id.as_str());
        j.unreported.push(PendingCommandReport {
            id: id.to_string(),
            result,
            log: None,
            object: None,
        });
        self.ledger.save();
        self.flush_commands(false).await?;
        Ok(PassResult::Reported)
    }

    /// Runs the command's action: journaled, then started in a fenced transaction,
    /// then run under its timeout, then reported with the run's end.
    async fn command_run(
        &mut self,
        rec: CommandRecord,
        attempt: u32,
        revs: (Revision, Revision),
        obs: &Observation,
    ) -> Result<PassResult, AgentError> {
        if rec.action == jio_common::command_record::REBOOT_ACTION {
            return self.command_reboot(rec, attempt, revs, obs).await;
        }
        let id = rec.id.clone();
        let argv = match resolve(&self.cfg, &rec) {
            Ok(a) => a,
            Err(reason) => {
                tracing::warn!(command = %id, "{reason}");
                return self
                    .command_not_run(&id, RunOutcome::Refused, reason, 0, attempt)
                    .await;
            }
        };
        let now = self.clock.unix_now();
        let run_dir = match crate::rundir::create_named(&self.cfg.state_dir, &format!("command-{id}"), now) {
            Ok(d) => d,
            Err((_, reason)) => {
                return self
                    .command_not_run(&id, RunOutcome::Failed, reason, 0, attempt)
                    .await;
            }
        };
        self.journal_command_start(&rec, attempt, now, &run_dir);
        if !self.start_command(&id, attempt, now, revs, obs).await? {
            return Ok(PassResult::Raced);
        }
        tracing::info!(command = %id, attempt, argv = %crate::runner::display_argv(&argv), run_dir = %run_dir.display(), "fleet command starts");
        let (f, outcome) = self.run_action(&rec, &argv, attempt, &run_dir).await;
        let ended = self.clock.unix_now();
        if matches!(outcome, Outcome::Interrupted) {
            // The agent is stopping: the journal keeps the run, and the next start
            // reports it (or runs it again, if the command allows).
            if let Some(r) = self.ledger.journal.commands.in_progress.as_mut() {
                r.child = None;
            }
            self.ledger.save();
            return Ok(PassResult::Command {
                id: id.to_string(),
                outcome: RunOutcome::Interrupted,
            });
        }
        let result = CommandResult {
            outcome: if outcome.ok() {
                RunOutcome::Succeeded
            } else {
                RunOutcome::Failed
            },
            exit_code: match f.exit {
                runner::Exit::Code(c) => Some(c),
                _ => None,
            },
            message: failure_message(&outcome, &run_dir),
            started: now,
            ended,
            run_dir: Some(run_dir.display().to_string()),
            attempt,
        };
        let done = result.outcome;
        self.journal_command_result(&id, result, &run_dir);
        if let Err(e) = self.flush_commands(true).await {
            tracing::warn!(error = %e, "the command's result stays in the journal and is reported when the store takes it");
        }
        Ok(PassResult::Command {
            id: id.to_string(),
            outcome: done,
        })
    }

    /// Puts the command in the journal (not yet confirmed) before its start is written.
    pub(super) fn journal_command_start(
        &mut self,
        rec: &CommandRecord,
        attempt: u32,
        now: u64,
        run_dir: &std::path::Path,
    ) {
        self.ledger.journal.commands.in_progress = Some(CommandRun {
            id: rec.id.to_string(),
            attempt,
            started: now,
            run_dir: run_dir.to_path_buf(),
            confirmed: false,
            rerun_interrupted: rec.rerun_interrupted,
            child: None,
        });
        self.ledger.save();
    }

    /// Writes the command's start, fenced on the inbox, the record, the host's
    /// holds and its start and result keys; `false`: something changed (the
    /// journal entry is dropped), else the journal entry is confirmed.
    pub(super) async fn start_command(
        &mut self,
        id: &CommandId,
        attempt: u32,
        now: u64,
        (rec_rev, started_rev): (Revision, Revision),
        obs: &Observation,
    ) -> Result<bool, AgentError> {
        let schema = &self.cfg.schema;
        let host = &self.cfg.hostname;
        let mut fence = vec![
            Compare::ModRevision(schema.command_inbox(host), obs.commands.revision),
            Compare::ModRevision(schema.command(id), rec_rev),
            Compare::ModRevision(schema.command_run(id, RunPart::Started, host), started_rev),
            Compare::ModRevision(schema.command_run(id, RunPart::Results, host), 0),
        ];
        fence.extend(self.subject().hold_fence(obs));
        let start = Started {
            at: now,
            pid: std::process::id(),
            attempt,
        };
        let ops = vec![Op::put(
            schema.command_run(id, RunPart::Started, host),
            serde_json::to_string(&start).unwrap_or_default(),
        )];
        let version = obs.local.clone();
        if !self
            .begin_with(AgentState::Command, version.clone(), fence, ops)
            .await?
        {
            tracing::info!(command = %id, "the command's admission, record or a hold changed before it could start; deciding again");
            self.ledger.journal.commands.in_progress = None;
            self.ledger.save();
            return Ok(false);
        }
        if let Some(r) = self.ledger.journal.commands.in_progress.as_mut() {
            r.confirmed = true;
        }
        self.ledger.save();
        Ok(true)
    }

    /// Runs the action under its timeout (its process group journaled once
    /// spawned), and tells how it went.
    async fn run_action(
        &mut self,
        rec: &CommandRecord,
        argv: &[String],
        attempt: u32,
        run_dir: &std::path::Path,
    ) -> (runner::Finished, Outcome) {
        let env = command_env(&self.cfg, &rec.id, attempt, run_dir);
        let stdout = run_dir.join("action.stdout");
        let stderr = run_dir.join("action.stderr");
        let spec = Spec {
            argv,
            env: &env,
            timeout: rec
                .timeout_s
                .map_or(self.cfg.command_timeout, std::time::Duration::from_secs),
            stdout: &stdout,
            stderr: &stderr,
        };
        let ledger = &mut self.ledger;
        let mut on_spawn = |group: ProcessGroup| {
            if let Some(run) = ledger.journal.commands.in_progress.as_mut() {
                run.child = Some(group);
                ledger.save();
            }
        };
        let f = runner::run(&spec, &mut self.shutdown, self.cfg.stop_grace, &mut on_spawn).await;
        let outcome = runner::plain_outcome(&format!("action {:?}", rec.action), &f.exit);
        tracing::info!(command = %rec.id, exit = %f.exit, elapsed_ms = f.elapsed.as_millis() as u64, "fleet command finished");
        (f, outcome)
    }

    /// Journals a command's result to be reported (with its composed log): the
    /// command is done and no longer in progress.
    pub(super) fn journal_command_result(
        &mut self,
        id: &CommandId,
        result: CommandResult,
        run_dir: &std::path::Path,
    ) {
        let (log, object) = self.command_log(id, &result, run_dir);
        let j = &mut self.ledger.journal.commands;
        j.in_progress = None;
        j.mark_done(id.as_str());
        j.unreported.push(PendingCommandReport {
            id: id.to_string(),
            result,
            log,
            object,
        });
        self.ledger.save();
    }

    /// Composes the action's output into one log for Swift (when configured).
    fn command_log(
        &self,
        id: &CommandId,
        r: &CommandResult,
        run_dir: &std::path::Path,
    ) -> (Option<std::path::PathBuf>, Option<String>) {
        if self.cfg.swift.is_none() {
            return (None, None);
        }
        let stamp = jio_common::time::utc_stamp(r.ended);
        let header = format!(
            "jio-agent fleet command log: host {}, command {id}, attempt {}, {}, run {}",
            self.cfg.hostname,
            r.attempt,
            jio_common::command::result_text(r),
            r.run_dir.as_deref().unwrap_or("-")
        );
        let files = ["action.stdout", "action.stderr"].map(|n| run_dir.join(n));
        let name = format!("{stamp}-{}-command-{}", std::process::id(), id);
        match crate::uploads::compose(self.ledger.state_dir(), &name, &header, &files) {
            Ok(log) => (
                Some(log),
                Some(format!(
                    "{}/commands/{id}/{stamp}-attempt-{}.log",
                    self.cfg.hostname, r.attempt
                )),
            ),
            Err(e) => {
                tracing::warn!(error = %e, "cannot compose the command's log; it will not be uploaded");
                (None, None)
            }
        }
    }

    /// Writes the pending command results, oldest first; `end`: the newest ends
    /// the run going on (its marker goes, the agent's record says idle) in the
    /// same transaction.
    pub(super) async fn flush_commands(&mut self, end: bool) -> Result<(), AgentError> {
        while let Some(r) = self.ledger.journal.commands.unreported.first().cloned() {
            let Some(id) = CommandId::parse(&r.id) else {
                self.ledger.journal.commands.unreported.remove(0);
                self.ledger.save();
                continue;
            };
            let schema = &self.cfg.schema;
            let host = &self.cfg.hostname;
            let logs_key = schema.command_run(&id, RunPart::Logs, host);
            let mut ops = vec![Op::put(
                schema.command_run(&id, RunPart::Results, host),
                serde_json::to_string(&r.result).unwrap_or_default(),
            )];
            if r.log.is_some() {
                ops.push(Op::put(logs_key.clone(), String::new()));
            }
            let last = self.ledger.journal.commands.unreported.len() == 1;
            let revision = match (&self.liveness, end && last) {
                (Some(l), true) => {
                    ops.push(Op::Delete(schema.run(host)));
                    let state = l.current().0;
                    let state = if state == AgentState::Command {
                        AgentState::Idle
                    } else {
                        state
                    };
                    let rev = l
                        .commit(state, l.current().1, vec![], ops)
                        .await?
                        .ok_or_else(|| crate::report::lost(&self.store))?;
                    self.run_marker = false;
                    rev
                }
                _ => crate::report::commit(&self.store, ops).await?,
            };
            tracing::info!(command = %id, outcome = r.result.outcome.as_str(), "fleet command result reported");
            if let (Some(log), Some(object)) = (&r.log, &r.object) {
                self.ledger.queue_upload(log, object, &logs_key, revision, None);
            }
            self.ledger.journal.commands.unreported.remove(0);
            self.ledger.save();
        }
        Ok(())
    }
}
