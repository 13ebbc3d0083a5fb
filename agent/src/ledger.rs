//! The journal on disk and the reports it holds until the store has them: a step's
//! report is journaled first, then written in one transaction; what the store cannot
//! take now stays for a later pass. A validated success moves the local version file
//! before its report goes out, so the store never shows a host upgraded unless the
//! host says so.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use jio_common::clock::DynClock;
use jio_common::keys::{Outcome as KeyOutcome, Schema, Step};
use jio_common::names::{HostName, Version};
use jio_common::store::{DynStore, Op, Revision};
use jio_common::time::utc_stamp;
use jio_common::values::AgentState;

use crate::error::AgentError;
use crate::runner::Outcome;
use crate::state::{self, Journal, PendingReport};
use crate::uploads;

/// The journal and where reports go.
pub struct Ledger {
    pub journal: Journal,
    state_dir: PathBuf,
    version_file: PathBuf,
    store: DynStore,
    schema: Schema,
    host: HostName,
    clock: DynClock,
    /// Run logs are composed and queued for Swift.
    logs: bool,
    upload_wake: Option<Arc<tokio::sync::Notify>>,
    /// Versions under which this host has a `/running/versions` entry, once known:
    /// from the state directory once checked against the store (`listed`), from
    /// this agent's own reports, or from one listing at the first validated report.
    running_versions: Option<Vec<Version>>,
    /// What the state directory says, not yet checked (see `state::load_listed`).
    listed: Option<Vec<(Version, Revision)>>,
    /// The last save failed (logged once until it works again).
    failing: bool,
    /// The agent's retry interval (a run result says when a failure is retried).
    retry_interval: std::time::Duration,
}

/// Where a ledger keeps things and reports to.
pub struct LedgerSetup {
    pub state_dir: PathBuf,
    pub version_file: PathBuf,
    pub store: DynStore,
    pub schema: Schema,
    pub host: HostName,
    pub clock: DynClock,
    pub logs: bool,
    pub retry_interval: std::time::Duration,
}

impl Ledger {
    pub fn load(s: LedgerSetup) -> Result<Ledger, AgentError> {
        Ok(Ledger {
            journal: Journal::load(&s.state_dir)?,
            running_versions: None,
            listed: crate::state::load_listed(&s.state_dir),
            state_dir: s.state_dir,
            version_file: s.version_file,
            store: s.store,
            schema: s.schema,
            host: s.host,
            clock: s.clock,
            logs: s.logs,
            upload_wake: None,
            failing: false,
            retry_interval: s.retry_interval,
        })
    }

    pub fn set_upload_wake(&mut self, wake: Arc<tokio::sync::Notify>) {
        self.upload_wake = Some(wake);
    }

    pub fn set_clock(&mut self, clock: DynClock) {
        self.clock = clock;
    }

    /// Trusts the state directory's listing only if each of its entries is still in
    /// the store at the revision this agent wrote it (one read); otherwise the next
    /// validated report lists the fleet's entries once. Done at the agent's first
    /// pass, so that a run's report does not wait for it (and again before a
    /// report if that read failed); nothing once checked.
    pub(crate) async fn check_listed(&mut self) {
        let Some(listed) = self.listed.take() else { return };
        if self.running_versions.is_some() {
            return;
        }
        let keys: Vec<_> = listed
            .iter()
            .map(|(v, _)| self.schema.running_version_host(v, &self.host))
            .collect();
        let Ok(found) = self.store.get_many(&keys).await else {
            self.listed = Some(listed); // checked at the next report
            return;
        };
        let current = found
            .iter()
            .zip(&listed)
            .all(|(kv, (_, rev))| kv.as_ref().is_some_and(|kv| kv.mod_revision == *rev));
        if current {
            self.running_versions = Some(listed.into_iter().map(|(v, _)| v).collect());
        } else {
            tracing::info!(
                "the versions this host was listed under changed outside this agent; listing them again"
            );
        }
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Saves the journal. A failure is logged (once until it works again) and the
    /// agent carries on: the journal in memory is right, and the next save writes it
    /// whole. Returns whether it was saved.
    pub fn save(&mut self) -> bool {
        match self.journal.save(&self.state_dir) {
            Ok(()) => {
                if std::mem::take(&mut self.failing) {
                    tracing::info!("the journal is written again");
                }
                true
            }
            Err(e) => {
                if !std::mem::replace(&mut self.failing, true) {
                    tracing::error!(error = %e, "cannot write the journal; results are kept in memory until it can be written");
                }
                false
            }
        }
    }

    /// Writes every pending report, oldest first. Only store errors are returned:
    /// the reports not yet written stay in the journal.
    pub async fn flush(&mut self) -> Result<(), AgentError> {
        self.flush_ending(None).await.map(|_| ())
    }

    /// Like `flush`; the newest report also ends its run (`end`) in the same
    /// transaction. Returns that transaction's revision and writes, if it did.
    async fn flush_ending(
        &mut self,
        end: Option<&RunEnd<'_>>,
    ) -> Result<Option<(Revision, Vec<Op>)>, AgentError> {
        let mut ended = None;
        while !self.journal.unreported.is_empty() {
            self.settle_local_version(0);
            let r = self.journal.unreported[0].clone();
            self.check_listed().await;
            let mut ops = crate::report::ops(
                &self.store,
                &self.schema,
                &self.host,
                &r,
                self.running_versions.as_deref(),
            )
            .await?;
            let revision = match end.filter(|_| self.journal.unreported.len() == 1) {
                Some(e) => {
                    ops.push(Op::Delete(e.marker.clone()));
                    let state = if r.ok {
                        AgentState::Idle
                    } else {
                        AgentState::Failed
                    };
                    let written = ops.clone();
                    let committed = e
                        .liveness
                        .commit(state, Some(r.version.clone()), vec![], ops)
                        .await?
                        .ok_or_else(|| crate::report::lost(&self.store))?;
                    ended = Some((committed, written));
                    committed
                }
                None => crate::report::commit(&self.store, ops).await?,
            };
            if r.step == Step::Validated && r.ok && r.task.is_none() {
                if let Err(e) = crate::state::save_listed(&self.state_dir, &[(r.version.clone(), revision)]) {
                    // Unknown at the next start: listed once again then.
                    tracing::warn!(error = %e, "cannot keep the versions this host is listed under");
                }
                self.running_versions = Some(vec![r.version.clone()]);
            }
            // A run's failed report is in the store: from now on only an enable key
            // written after it retries it at once (see `Failure::reported`).
            if !r.ok
                && r.result.is_some()
                && let Some(f) = self.journal.failure.as_mut()
                && f.version == r.version
            {
                f.reported = Some(revision);
            }
            tracing::info!(version = %r.version, step = r.step.as_str(), ok = r.ok, "reported");
            self.queue_log(&r, revision);
            self.journal.unreported.remove(0);
            self.save();
        }
        Ok(ended)
    }

    /// Queues a composed log for Swift, to be linked from `key` (a leaf the store
    /// holds at `revision`) and, with `result`, from the run result too.
    pub fn queue_upload(
        &self,
        log: &Path,
        object: &str,
        key: &jio_common::keys::Key,
        revision: Revision,
        result: Option<uploads::ResultLink>,
    ) {
        let entry = uploads::Entry {
            object: object.to_string(),
            key: key.to_string(),
            revision,
            result,
        };
        match uploads::enqueue(&self.state_dir, log, &entry) {
            Ok(()) => {
                if let Some(w) = &self.upload_wake {
                    w.notify_one();
                }
            }
            Err(e) => {
                tracing::warn!(log = %log.display(), error = %e, "cannot queue the run log for upload")
            }
        }
    }

    /// Queues the report's run log for Swift, linked from its status entry.
    fn queue_log(&self, r: &PendingReport, revision: jio_common::store::Revision) {
        let (Some(log), Some(object)) = (&r.log, &r.object) else {
            return;
        };
        let outcome = if r.ok {
            KeyOutcome::Success
        } else {
            KeyOutcome::Failure
        };
        let key = match &r.task {
            Some(t) => self
                .schema
                .step_status(&t.rollout, &t.phase, &t.service, outcome, &self.host),
            None => self.schema.status(r.step, outcome, &r.version, &self.host),
        };
        let result = r.result.as_ref().map(|res| uploads::ResultLink {
            key: self.schema.result(&self.host).to_string(),
            version: res.version.to_string(),
            at: res.at,
        });
        self.queue_upload(log, object, &key, revision, result);
    }

    /// For the pending validated success at `i`, the version file is written before
    /// the report goes out (the journal already holds the report, so a crash in
    /// between is reported at the next start). When it cannot be written, the report
    /// becomes the validation's failure with that reason (also appended to its log),
    /// and the reason is returned.
    fn settle_local_version(&mut self, i: usize) -> Option<String> {
        let vf = self.version_file.clone();
        let r = self.journal.unreported.get_mut(i)?;
        if r.step != Step::Validated || !r.ok || r.task.is_some() {
            return None;
        }
        if matches!(state::read_local_version(&vf), Ok(Some(v)) if v == r.version) {
            return None;
        }
        let e = state::write_local_version(&vf, &r.version).err()?;
        let reason = format!("the version file could not be written to {}: {e}", vf.display());
        tracing::error!(version = %r.version, %reason, "the upgrade counts as failed");
        r.ok = false;
        r.link = reason.clone();
        if let Some(res) = r.result.as_mut() {
            crate::results::fail(res, Step::Validated, &reason, None, self.retry_interval);
        }
        if let Some(log) = &r.log {
            let line = format!("== but the upgrade counts as failed: {reason}\n");
            let appended = std::fs::OpenOptions::new()
                .append(true)
                .open(log)
                .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
            if let Err(e) = appended {
                tracing::warn!(log = %log.display(), error = %e, "cannot add the reason to the run log");
            }
        }
        self.save();
        Some(reason)
    }

    /// Journals a step's report (durably where the journal can be written), then
    /// tries to write it to the store, with the host's run `result` when given (the
    /// run's last step). Returns the reason a validated success turned into a
    /// failure (the local version file could not be written).
    pub async fn report(
        &mut self,
        version: &Version,
        step: Step,
        outcome: &Outcome,
        run_dir: &Path,
        result: Option<jio_common::values::HostResult>,
    ) -> Option<String> {
        self.report_ending(version, step, outcome, run_dir, result, None, None)
            .await
            .failed
    }

    /// Like `report`, for the last report of a run, which ends it (`end`) in the
    /// same transaction when the store takes it. The journal closes the run
    /// (`close`) in the same save that holds the report, before anything is sent:
    /// an agent killed while the report is on the wire leaves a successor that
    /// knows how the run ended (a failure's backoff included), not an
    /// interrupted run.
    #[allow(clippy::too_many_arguments)]
    pub async fn report_ending(
        &mut self,
        version: &Version,
        step: Step,
        outcome: &Outcome,
        run_dir: &Path,
        result: Option<jio_common::values::HostResult>,
        end: Option<&RunEnd<'_>>,
        close: Option<&RunClose>,
    ) -> Reported {
        self.report_of(version, step, None, outcome, run_dir, result, end, close)
            .await
    }

    /// Like `report_ending`, for one service's step of a composable rollout.
    #[allow(clippy::too_many_arguments)]
    pub async fn report_task(
        &mut self,
        version: &Version,
        task: state::TaskRef,
        outcome: &Outcome,
        run_dir: &Path,
        result: Option<jio_common::values::HostResult>,
        end: Option<&RunEnd<'_>>,
        close: Option<&RunClose>,
    ) -> Reported {
        self.report_of(
            version,
            Step::Configured,
            Some(task),
            outcome,
            run_dir,
            result,
            end,
            close,
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn report_of(
        &mut self,
        version: &Version,
        step: Step,
        task: Option<state::TaskRef>,
        outcome: &Outcome,
        run_dir: &Path,
        result: Option<jio_common::values::HostResult>,
        end: Option<&RunEnd<'_>>,
        close: Option<&RunClose>,
    ) -> Reported {
        let whole_run = end.is_some_and(|e| e.whole_run);
        let mut r = self
            .pending_report(version, step, task.as_ref(), outcome, run_dir, whole_run)
            .await;
        r.result = result;
        r.task = task;
        self.journal.unreported.push(r);
        if let Some(c) = close {
            c.apply(&mut self.journal, outcome);
        }
        self.save();
        let failed = self.settle_local_version(self.journal.unreported.len() - 1);
        if let (Some(reason), Some(c)) = (&failed, close) {
            c.apply(&mut self.journal, &Outcome::Failure(reason.clone()));
            self.save();
        }
        let mut ended = None;
        match self.flush_ending(end).await {
            Ok(e) => ended = e,
            Err(e) if e.store_unavailable() => {
                tracing::warn!(error = %e, "store unreachable; the result stays in the journal and is reported when it is back")
            }
            Err(e) => {
                tracing::warn!(error = %e, "the store did not take the result; it stays in the journal and is retried")
            }
        }
        Reported { failed, ended }
    }

    /// A step's report. A failure's reason is the status leaf's value until a log
    /// link (with Swift) replaces it.
    async fn pending_report(
        &self,
        version: &Version,
        step: Step,
        task: Option<&state::TaskRef>,
        outcome: &Outcome,
        run_dir: &Path,
        whole_run: bool,
    ) -> PendingReport {
        let at = self.clock.unix_now();
        let reason = match outcome {
            Outcome::Failure(r) => Some(r.chars().take(500).collect::<String>()),
            _ => None,
        };
        let mut r = PendingReport {
            version: version.clone(),
            step,
            ok: outcome.ok(),
            link: reason.clone().unwrap_or_default(),
            at,
            log: None,
            object: None,
            result: None,
            task: None,
        };
        // What the log is of: the step, or the service's step.
        let what = match task {
            Some(t) => format!("{} {}", t.phase, t.service),
            None => step.as_str().to_string(),
        };
        if self.logs {
            let header = format!(
                "jio-agent run log: host {}, version {version}, {what} {}{}, run {}",
                self.host,
                if r.ok { "success" } else { "failure" },
                reason.map(|r| format!(" ({r})")).unwrap_or_default(),
                run_dir.display()
            );
            // Up to a few times 16 MiB of output: copied off the async workers.
            let (state_dir, dir) = (self.state_dir.clone(), run_dir.to_path_buf());
            let prefix = task.map(|t| format!("task-{}-{}-", t.phase, t.service));
            let composed = tokio::task::spawn_blocking(move || match prefix {
                Some(p) => compose_task_log(&state_dir, &p, at, &header, &dir),
                None => compose_log(&state_dir, step, whole_run, at, &header, &dir),
            })
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
            match composed {
                Ok(log) => {
                    r.log = Some(log);
                    r.object = Some(format!(
                        "{}/{version}/{}-{}.log",
                        self.host,
                        utc_stamp(at),
                        what.replace(' ', "-")
                    ));
                }
                Err(e) => tracing::warn!(error = %e, "cannot compose the run log; it will not be uploaded"),
            }
        }
        r
    }
}

/// One file holding a step's output files, for upload.
fn compose_log(
    state_dir: &Path,
    step: Step,
    whole_run: bool,
    at: u64,
    header: &str,
    run_dir: &Path,
) -> std::io::Result<PathBuf> {
    let names: Vec<String> = match (step, whole_run) {
        (Step::Validated, true) => {
            let mut v = configure_logs(run_dir);
            v.extend(["validation.stdout", "validation.stderr"].map(String::from));
            v
        }
        (Step::Configured, _) => configure_logs(run_dir),
        (Step::Validated, false) => ["validation.stdout", "validation.stderr"]
            .map(String::from)
            .to_vec(),
    };
    let files: Vec<PathBuf> = names.iter().map(|n| run_dir.join(n)).collect();
    // Logs of one second keep their order, and a restarted agent (another pid)
    // never overwrites one that is still queued.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let id = format!(
        "{}-{seq:06}-{}-{}",
        utc_stamp(at),
        std::process::id(),
        step.as_str()
    );
    uploads::compose(state_dir, &id, header, &files)
}

/// One file holding a service step's task outputs (`<prefix>*` in the run
/// directory, in the order the tasks ran), for upload.
fn compose_task_log(
    state_dir: &Path,
    prefix: &str,
    at: u64,
    header: &str,
    run_dir: &Path,
) -> std::io::Result<PathBuf> {
    let mut names: Vec<String> = std::fs::read_dir(run_dir)?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    let files: Vec<PathBuf> = names.iter().map(|n| run_dir.join(n)).collect();
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let id = format!(
        "{}-{seq:06}-{}-{}",
        utc_stamp(at),
        std::process::id(),
        prefix.trim_end_matches('-')
    );
    uploads::compose(state_dir, &id, header, &files)
}

/// The configure step's output files: the pre-commands' then Puppet's.
fn configure_logs(run_dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(run_dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .filter(|n| n.starts_with("pre-"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v.extend(["puppet.jsonl", "puppet.stdout", "puppet.stderr"].map(String::from));
    v
}

/// How a run's last report ends the run, in the same transaction.
pub struct RunEnd<'a> {
    /// Its record says the agent is idle again (or failed), on its lease.
    pub liveness: &'a crate::liveness::Liveness,
    /// The run marker, deleted.
    pub marker: jio_common::keys::Key,
    /// The configure step was not reported on its own: the log covers the whole run.
    pub whole_run: bool,
}

/// How the journal closes a run that ended at `ended` after `step` (pure): its
/// last run, the failure the retry backoff counts from, and no run in progress.
pub struct RunClose {
    pub version: Version,
    pub started: u64,
    pub ended: u64,
    pub step: Step,
    pub run_dir: PathBuf,
    /// The enable keys' mod revisions the run was decided on.
    pub gate_revisions: [jio_common::store::Revision; 3],
    /// The journal's failure before the run (applying twice counts once).
    pub previous: Option<state::Failure>,
    /// A composable rollout's phase (`pre-1`, `finalize`): the last run's step.
    pub phase: Option<String>,
}

impl RunClose {
    /// Closes the run in `j` with `outcome`; the result and its reason, for the log.
    pub fn apply(&self, j: &mut Journal, outcome: &Outcome) {
        let (result, reason) = ended_as(outcome);
        // The failure's time is the run result's, so that its `retry_at` is the retry.
        j.failure = crate::decide::failure_after(
            self.previous.as_ref(),
            &self.version,
            result,
            self.ended,
            self.gate_revisions,
        );
        j.in_progress = None;
        j.last_run = Some(state::LastRun {
            version: self.version.clone(),
            started: self.started,
            finished: self.ended,
            result,
            step: self.phase.clone().unwrap_or_else(|| self.step.as_str().into()),
            reason,
            run_dir: self.run_dir.clone(),
        });
    }
}

/// How a run that ended with `outcome` went, and why, as the journal says it.
pub fn ended_as(outcome: &Outcome) -> (state::RunResult, Option<String>) {
    use state::RunResult;
    match outcome {
        Outcome::Success { .. } => (RunResult::Success, None),
        Outcome::Failure(r) => (RunResult::Failed, Some(r.clone())),
        Outcome::Interrupted => (
            RunResult::Interrupted,
            Some("the agent was stopped during the run".into()),
        ),
    }
}

/// What became of a report.
pub struct Reported {
    /// Why a validated success turned into a failure (the local version file could
    /// not be written).
    pub failed: Option<String>,
    /// The run was ended in the report's transaction: its revision and writes.
    pub ended: Option<(Revision, Vec<Op>)>,
}
