//! The reboot that ends a run (`crate::reboot` decides; this acts): journaled
//! before the reboot command runs, carried through the boot by the journal and the
//! run marker, and ended by a validation after the boot.

use std::path::Path;

use jio_common::keys::{EnableLevel, HoldTarget, Step};
use jio_common::names::Version;
use jio_common::store::{Compare, Op};
use jio_common::values::parse_bool;
use jio_common::values::{AgentRecord, AgentState};

use super::{Agent, AgentError};
use crate::pass::PassResult;
use crate::reboot::{self, Next, RebootWait, Required};
use crate::runner::{self, Outcome};
use crate::state::RunStart;

/// How long the reboot command itself may take to return.
const REBOOT_COMMAND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

impl Agent {
    /// Whether the run to `version`, just validated, ends with a reboot: why it
    /// does (`None`: it does not). A one-shot run (`bootstrap`, `converge`) never
    /// reboots: it says so and ends.
    pub(super) async fn reboot_wanted(&mut self, run_dir: &Path) -> Result<Option<String>, String> {
        let policy = self.run_reboot.unwrap_or(self.cfg.reboot.policy);
        if policy == reboot::RebootPolicy::Never {
            return Ok(None);
        }
        let required = self.reboot_required(run_dir).await?;
        let why = reboot::wanted(policy, &required);
        if let Some(why) = &why
            && !self.reboots
        {
            tracing::warn!(%why, "a reboot is wanted, but this one-shot run does not reboot (the agent service does, at the end of its runs)");
            return Ok(None);
        }
        Ok(why)
    }

    /// What says whether a reboot is required now: the check command when one is
    /// configured, else the reboot-required file.
    pub(super) async fn reboot_required(&mut self, run_dir: &Path) -> Result<Required, String> {
        let s = &self.cfg.reboot;
        if let Some(argv) = s.check_command.clone() {
            let shown = argv.join(" ");
            let done = self
                .run_reboot_child(&argv, &run_dir.join("reboot-check.log"))
                .await;
            return match done.exit {
                runner::Exit::Code(0) => Ok(Required::Command(shown)),
                runner::Exit::Code(1) => Ok(Required::No),
                other => match runner::plain_outcome(&format!("the reboot check `{shown}`"), &other) {
                    Outcome::Failure(reason) => Err(reason),
                    _ => Err(format!("the reboot check `{shown}` was interrupted")),
                },
            };
        }
        let path = s.required_file.clone();
        if !path.exists() {
            return Ok(Required::No);
        }
        let pkgs = path.with_extension("pkgs");
        let mut packages: Vec<String> = std::fs::read_to_string(pkgs)
            .unwrap_or_default()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect();
        packages.sort();
        packages.dedup();
        Ok(Required::File { path, packages })
    }

    /// Journals the reboot that ends the run to `version` (the slot stays held by
    /// the run marker); the next passes carry it out. `Err`: the host's boot id
    /// cannot be read or the journal cannot be written (the run fails: a reboot
    /// that cannot be told from no reboot must not start).
    pub(super) fn journal_reboot(
        &mut self,
        version: &Version,
        run_dir: &Path,
        why: String,
    ) -> Result<(), String> {
        self.journal_reboot_of(version, run_dir, why, None)
    }

    /// `journal_reboot`, of the fleet command `command` when it is one.
    pub(super) fn journal_reboot_of(
        &mut self,
        version: &Version,
        run_dir: &Path,
        why: String,
        command: Option<String>,
    ) -> Result<(), String> {
        let boot_id = self.boot_id()?;
        let (started, gate_revisions) = self.run_begun;
        let w = RebootWait {
            version: version.clone(),
            started,
            gate_revisions,
            run_dir: run_dir.to_path_buf(),
            rollout: self.run_rollout.clone(),
            why,
            boot_id,
            since: self.clock.unix_now(),
            asked: None,
            permit: command.is_none() && self.run_windowed,
            command,
            waiting_rev: None,
        };
        let j = &mut self.ledger.journal;
        let run = j.in_progress.take();
        j.reboot = Some(w.clone());
        if let Err(e) = j.save(&self.cfg.state_dir) {
            j.reboot = None;
            j.in_progress = run;
            return Err(format!("the journal could not be written before the reboot: {e}"));
        }
        tracing::info!(%version, why = %w.why, boot_id = %w.boot_id, "the run ends with a reboot; the host keeps its slot until it is back and validated");
        self.metrics.reboot("wanted");
        Ok(())
    }

    /// Runs the reboot check or the reboot command, its output in `log`.
    async fn run_reboot_child(&self, argv: &[String], log: &Path) -> runner::Finished {
        let spec = runner::Spec {
            argv,
            env: &[],
            timeout: REBOOT_COMMAND_TIMEOUT,
            stdout: log,
            stderr: log,
        };
        runner::run(&spec, &mut self.shutdown.clone(), self.cfg.stop_grace, |_| {}).await
    }

    /// The host's boot id now.
    fn boot_id(&self) -> Result<String, String> {
        let f = &self.cfg.reboot.boot_id_file;
        match std::fs::read_to_string(f) {
            Ok(s) if !s.trim().is_empty() => Ok(s.trim().to_string()),
            Ok(_) => Err(format!("the boot id file {} is empty", f.display())),
            Err(e) => Err(format!("the boot id file {} cannot be read: {e}", f.display())),
        }
    }

    /// A pass while a reboot is journaled: wait for a hold, reboot, wait for the
    /// new boot, or end the run (validated again after the boot, or failed).
    pub(super) async fn pass_reboot(&mut self, w: RebootWait) -> Result<PassResult, AgentError> {
        self.run_marker = true;
        let boot_id = match self.boot_id() {
            Ok(b) => b,
            Err(reason) => return self.end_reboot(w, Outcome::Failure(reason)).await,
        };
        let held = if w.asked.is_none() {
            self.held().await?
        } else {
            None
        };
        let now = self.clock.unix_now();
        match reboot::next(&w, &boot_id, held, now, self.cfg.reboot.timeout) {
            Next::Held(why) => {
                self.mark_rebooting(&w, None).await;
                tracing::info!(version = %w.version, %why, "the reboot waits for the hold to be released; the host keeps its slot");
                Ok(PassResult::Rebooting {
                    version: w.version,
                    until: None,
                })
            }
            // A one-shot run leaves the journaled reboot to the agent service.
            Next::Reboot if !self.reboots => Ok(PassResult::Rebooting {
                version: w.version,
                until: None,
            }),
            Next::Reboot if w.permit => self.reboot_when_permitted(w).await,
            Next::Reboot => self.reboot_now(w, Vec::new()).await,
            Next::Wait { until } => {
                self.mark_rebooting(&w, Some(until)).await;
                Ok(PassResult::Rebooting {
                    version: w.version,
                    until: Some(until),
                })
            }
            Next::NotBack(reason) => {
                self.metrics.reboot("not_back");
                self.end_reboot(w, Outcome::Failure(reason)).await
            }
            Next::Back => {
                tracing::info!(version = %w.version, was = %w.boot_id, now = %boot_id, "back from the reboot; validating again");
                self.metrics.reboot("back");
                self.end_reboot(w, Outcome::Success { changes: false }).await
            }
        }
    }

    /// A hold on this host or its role, in words (read afresh: a hold placed during
    /// the run stops the reboot, not only new runs).
    async fn held(&self) -> Result<Option<String>, AgentError> {
        let targets = [
            HoldTarget::Host(self.cfg.hostname.clone()),
            HoldTarget::Role(self.cfg.role.clone()),
        ];
        let keys: Vec<_> = targets.iter().map(|t| self.cfg.schema.hold(t)).collect();
        let found = self.store.get_many(&keys).await?;
        Ok(targets
            .iter()
            .zip(found)
            .find(|(_, kv)| kv.is_some())
            .map(|(t, _)| format!("held ({t})")))
    }

    /// Under maintenance windows the driver permits the reboot, by its clock:
    /// the marker says the reboot waits (its revision journaled), and the reboot
    /// starts once the host key was rewritten after it, fenced on that key.
    async fn reboot_when_permitted(&mut self, mut w: RebootWait) -> Result<PassResult, AgentError> {
        let waiting = PassResult::Rebooting {
            version: w.version.clone(),
            until: None,
        };
        let Some(waiting_rev) = w.waiting_rev else {
            if let Ok(Some(rev)) = self.write_rebooting(&w, None, Vec::new()).await {
                tracing::info!(version = %w.version, "the reboot waits for the driver's permit (its maintenance window); the host keeps its slot");
                w.waiting_rev = Some(rev);
                self.ledger.journal.reboot = Some(w);
                self.ledger.save();
            }
            return Ok(waiting);
        };
        // Only the rollout's driver permits: a rollout that ended will not.
        let current = self.store.get(&self.cfg.schema.current_rollout()).await?;
        let current = current.as_ref().map(|kv| kv.value.trim());
        if let Some(id) = w.rollout.clone()
            && current != Some(id.as_str())
        {
            let reason = format!(
                "rollout {id} ended before it permitted this host's reboot: the host was not rebooted"
            );
            return self.end_reboot(w, Outcome::Failure(reason)).await;
        }
        let key = self
            .cfg
            .schema
            .enable(&EnableLevel::Host(self.cfg.hostname.clone()));
        match self.store.get(&key).await? {
            Some(kv) if kv.mod_revision > waiting_rev && parse_bool(&kv) == Ok(true) => {
                let fence = vec![Compare::ModRevision(key, kv.mod_revision)];
                self.reboot_now(w, fence).await
            }
            _ => Ok(waiting),
        }
    }

    /// Runs the reboot command, journaled first as asked (a reboot that comes at
    /// once finds the journal saying so). With a `fence` (the permit), the marker
    /// that says so is written first, fenced: a permit taken back means no reboot.
    async fn reboot_now(&mut self, mut w: RebootWait, fence: Vec<Compare>) -> Result<PassResult, AgentError> {
        let now = self.clock.unix_now();
        let until = now + self.cfg.reboot.timeout.as_secs();
        w.asked = Some(now);
        let fenced = !fence.is_empty();
        if fenced && !matches!(self.write_rebooting(&w, Some(until), fence).await, Ok(Some(_))) {
            return Ok(PassResult::Rebooting {
                version: w.version,
                until: None,
            });
        }
        self.ledger.journal.reboot = Some(w.clone());
        if let Err(e) = self.ledger.journal.save(&self.cfg.state_dir) {
            let reason = format!("the journal could not be written before the reboot: {e}");
            return self.end_reboot(w, Outcome::Failure(reason)).await;
        }
        if !fenced {
            self.mark_rebooting(&w, Some(until)).await;
        }
        let argv = self.cfg.reboot.command.clone();
        let shown = argv.join(" ");
        tracing::warn!(version = %w.version, why = %w.why, command = %shown, "rebooting");
        self.metrics.reboot("asked");
        let done = self.run_reboot_child(&argv, &w.run_dir.join("reboot.log")).await;
        match runner::plain_outcome(&format!("the reboot command `{shown}`"), &done.exit) {
            Outcome::Failure(reason) => self.end_reboot(w, Outcome::Failure(reason)).await,
            // Asked (or stopped by the shutdown the reboot brings): wait for the boot.
            _ => Ok(PassResult::Rebooting {
                version: w.version,
                until: Some(until),
            }),
        }
    }

    /// Writes `rebooting` to the liveness record and the run marker (one
    /// transaction; the marker says by when the host must be back). A store that
    /// cannot take it now leaves the marker as it was: the slot is held either way.
    async fn mark_rebooting(&mut self, w: &RebootWait, until: Option<u64>) {
        if self
            .liveness
            .as_ref()
            .is_some_and(|l| l.current().0 == AgentState::Rebooting)
            && until.is_none()
        {
            return;
        }
        if let Err(e) = self.write_rebooting(w, until, Vec::new()).await {
            tracing::warn!(error = %e, "cannot record `rebooting` in the store (the run marker keeps the slot)");
        }
    }

    /// `rebooting` in the liveness record and the run marker, in one transaction
    /// fenced on `fence`: the revision written, `None` when a compare failed.
    async fn write_rebooting(
        &self,
        w: &RebootWait,
        until: Option<u64>,
        fence: Vec<Compare>,
    ) -> Result<Option<jio_common::store::Revision>, jio_common::store::StoreError> {
        let Some(l) = &self.liveness else {
            return Ok(Some(0));
        };
        let record = AgentRecord {
            state: AgentState::Rebooting,
            version: Some(w.version.clone()),
            since: w.asked.unwrap_or(w.since),
            pid: std::process::id(),
            until,
        };
        let marker = Op::put(
            self.cfg.schema.run(&self.cfg.hostname),
            serde_json::to_string(&record).unwrap_or_default(),
        );
        l.commit(
            AgentState::Rebooting,
            Some(w.version.clone()),
            fence,
            vec![marker],
        )
        .await
    }

    /// Ends the journaled run: after a new boot (`outcome` success) it validates
    /// again and fails if a reboot is still required; otherwise it fails with
    /// `outcome`'s reason. Reported like any run's end (which frees the slot).
    async fn end_reboot(&mut self, w: RebootWait, outcome: Outcome) -> Result<PassResult, AgentError> {
        if let Some(id) = w.command.clone() {
            return self.end_command_reboot(w, &id, outcome).await;
        }
        let j = &mut self.ledger.journal;
        j.reboot = None;
        j.in_progress = Some(RunStart {
            version: w.version.clone(),
            started: w.started,
            pid: std::process::id(),
            run_dir: w.run_dir.clone(),
            child: None,
        });
        self.ledger.save();
        self.run_begun = (w.started, w.gate_revisions);
        self.run_rollout = w.rollout.clone();
        let version = w.version;
        let (mut outcome, mut code) = (outcome, None);
        if outcome.ok() {
            self.set_record(AgentState::Upgrading, Some(version.clone()));
            (outcome, code) = self.validate_after_boot(&version, &w.run_dir).await;
        }
        let ended = self.clock.unix_now();
        if outcome != Outcome::Interrupted {
            let mut result = self.run_result(&version, Step::Validated, &outcome, code, &w.run_dir, ended);
            self.attach_packages(&mut result, &w.run_dir).await;
            if let Some(reason) = self
                .report_end(
                    &version,
                    Step::Validated,
                    &outcome,
                    &w.run_dir,
                    result,
                    true,
                    ended,
                )
                .await
            {
                outcome = Outcome::Failure(reason);
            }
        }
        let result = self.record(&version, ended, Step::Validated, &outcome, &w.run_dir);
        Ok(PassResult::Ran { version, result })
    }
}
