//! A composable rollout's steps on this host: the services' task files read and
//! published as the host's catalog, and a granted phase's tasks run in dependency
//! order, each service's step reported on its own (`/status/steps/...`), the
//! run's last report ending the run. A task that succeeded is in the journal
//! before the next one starts, so a killed agent's successor does not run it
//! again (unless it says it may: `idempotent`).

use std::path::Path;

use jio_common::keys::Step;
use jio_common::names::{Service, Version};
use jio_common::phase::{Catalog, When};
use jio_common::values::AgentState;

use super::Agent;
use crate::decide::Observation;
use crate::error::AgentError;
use crate::ledger::RunEnd;
use crate::pass::PassResult;
use crate::runner::{self, Outcome, ProcessGroup, Spec};
use crate::state::{RunResult, TaskJournal, TaskRef};

/// How a service's step went.
enum Ran {
    Done,
    Failed {
        task: Option<String>,
        reason: String,
        exit_code: Option<i32>,
    },
    Interrupted,
}

impl Agent {
    /// Reads the task files, and publishes what they say when it changed (a host
    /// without a task directory publishes nothing). With `verify`, the published
    /// copy is read back and written again when the store holds anything else (it
    /// was overwritten or deleted): the driver plans from it.
    pub(super) async fn load_services(&mut self, verify: bool) -> Result<(), AgentError> {
        self.services = crate::services::load(&self.cfg.services_dir);
        let catalog: Option<Catalog> = self.services.catalog();
        let Some(cat) = &catalog else {
            return Ok(());
        };
        let key = self.cfg.schema.catalog(&self.cfg.hostname);
        let value = serde_json::to_string(cat).unwrap_or_default();
        let changed = catalog != self.published;
        if !changed {
            if !verify {
                return Ok(());
            }
            match self.store.get(&key).await? {
                Some(kv) if kv.value == value => return Ok(()),
                _ => {
                    tracing::warn!(key = %key, "the published service catalog was changed or removed in the store; writing it again")
                }
            }
        }
        self.store.put(&key, &value, None).await?;
        if changed {
            for (s, p) in &cat.problems {
                tracing::error!(service = %s, "task file cannot be used: {p}");
            }
            tracing::info!(services = cat.services.len(), key = %key, "service catalog published");
        }
        self.published = catalog;
        Ok(())
    }

    /// What the daemon watches for while it waits: the task directory and the
    /// catalog it gave at the last pass (`None`: the host has no task files).
    pub fn services_poll(&self) -> Option<(std::path::PathBuf, Option<Catalog>)> {
        (self.services.exists || self.published.is_some())
            .then(|| (self.cfg.services_dir.clone(), self.services.catalog()))
    }

    /// Runs the tasks left of `services` in `phase` (`finalize`: their finalize
    /// tasks), fenced like an upgrade's start and on the grants as read.
    pub(super) async fn tasks(
        &mut self,
        version: Version,
        phase: String,
        services: Vec<Service>,
        obs: &Observation,
    ) -> Result<PassResult, AgentError> {
        let Some(rollout) = obs.rollout.id.clone() else {
            return Ok(PassResult::Raced);
        };
        let (when, step) = match jio_common::phase::parse_phase(&phase) {
            Some((Some(w), s)) => (w, s),
            _ => return Ok(PassResult::Raced),
        };
        let fence = self.subject().task_fence(obs);
        self.run_rollout = Some(rollout.clone());
        if !self.begin(AgentState::Upgrading, &version, fence).await? {
            tracing::info!(%version, phase, "the grant, the desired version, an enable key or the package snapshot template changed before the step could start; deciding again");
            return Ok(PassResult::Raced);
        }
        self.refresh_hiera().await;
        let started = self.clock.unix_now();
        self.run_begun = (started, obs.gate_revisions);
        self.journal_tasks_of(&rollout);
        let order = crate::services::in_order(&services, &self.services);
        let run_dir = match self.prepare_run(&version, started) {
            Ok(d) => d,
            Err((run_dir, reason)) => {
                if let Some(s) = order.first() {
                    let ran = Ran::Failed {
                        task: None,
                        reason,
                        exit_code: None,
                    };
                    self.service_ended(&version, &rollout, &phase, s, ran, &run_dir, true)
                        .await;
                }
                return Ok(PassResult::Ran {
                    version,
                    result: RunResult::Failed,
                });
            }
        };
        tracing::info!(%version, phase, run_dir = %run_dir.display(), "step starts");
        let mut result = RunResult::Success;
        for (i, s) in order.iter().enumerate() {
            let last = i + 1 == order.len();
            let ran = self
                .run_service(&version, &rollout, &phase, when, step, s, &run_dir)
                .await;
            match ran {
                Ran::Done => {
                    self.service_ended(&version, &rollout, &phase, s, Ran::Done, &run_dir, last)
                        .await;
                }
                Ran::Interrupted => {
                    self.step_interrupted(&version, &phase, &run_dir);
                    result = RunResult::Interrupted;
                    break;
                }
                failed => {
                    self.service_ended(&version, &rollout, &phase, s, failed, &run_dir, true)
                        .await;
                    result = RunResult::Failed;
                    break;
                }
            }
        }
        match result {
            RunResult::Success => {
                tracing::info!(%version, phase, "step succeeded");
                self.set_record(AgentState::Idle, obs.local.clone().or(Some(version.clone())));
            }
            RunResult::Failed => self.set_record(AgentState::Failed, Some(version.clone())),
            RunResult::Interrupted => {}
        }
        Ok(PassResult::Ran { version, result })
    }

    /// The journal's record of the rollout's steps on this host (started afresh
    /// for another rollout).
    fn journal_tasks_of(&mut self, rollout: &str) {
        let j = self.ledger.journal.tasks.get_or_insert_with(TaskJournal::default);
        if j.rollout != rollout {
            *j = TaskJournal {
                rollout: rollout.to_string(),
                ..TaskJournal::default()
            };
        }
    }

    /// The agent is stopping mid-step: the run is closed as interrupted in the
    /// journal, and the step resumes at the next start.
    fn step_interrupted(&mut self, version: &Version, phase: &str, run_dir: &Path) {
        let ended = self.clock.unix_now();
        let mut close = self.run_close(version, Step::Configured, run_dir, ended);
        close.phase = Some(phase.to_string());
        close.apply(&mut self.ledger.journal, &Outcome::Interrupted);
        self.ledger.save();
        tracing::warn!(%version, phase, "step interrupted; it resumes at the next start");
    }

    /// Runs one service's tasks of the step, skipping those done before.
    #[allow(clippy::too_many_arguments)]
    async fn run_service(
        &mut self,
        version: &Version,
        rollout: &str,
        phase: &str,
        when: When,
        step: u32,
        s: &Service,
        run_dir: &Path,
    ) -> Ran {
        let file = match self.services.get(s) {
            Ok(f) => f.clone(),
            Err(reason) => {
                return Ran::Failed {
                    task: None,
                    reason,
                    exit_code: None,
                };
            }
        };
        for (n, task) in file.tasks_at(when, step).into_iter().enumerate() {
            let key = format!("{phase}/{s}/{}", task.name);
            let done = self
                .ledger
                .journal
                .tasks
                .as_ref()
                .is_some_and(|t| t.done.contains(&key));
            if done && !task.idempotent {
                tracing::info!(service = %s, phase, task = %task.name, "task already succeeded in this rollout; not run again");
                continue;
            }
            if self.stopping() {
                return Ran::Interrupted;
            }
            let env = self.task_env(version, rollout, phase, s, &task.name, run_dir);
            let base = format!("task-{phase}-{s}-{n:02}");
            let f = self.run_task(s, phase, task, &env, (run_dir, &base)).await;
            let outcome = runner::plain_outcome(&format!("task {:?} of {s}", task.name), &f.exit);
            match outcome {
                Outcome::Success { .. } => self.task_done(key),
                Outcome::Interrupted => return Ran::Interrupted,
                Outcome::Failure(reason) => {
                    return Ran::Failed {
                        task: Some(task.name.clone()),
                        reason,
                        exit_code: match f.exit {
                            runner::Exit::Code(c) => Some(c),
                            _ => None,
                        },
                    };
                }
            }
        }
        Ran::Done
    }

    /// The environment a task runs with: the version, host, role, run directory,
    /// service, step, task and rollout.
    fn task_env(
        &self,
        version: &Version,
        rollout: &str,
        phase: &str,
        s: &Service,
        task: &str,
        run_dir: &Path,
    ) -> Vec<(String, String)> {
        [
            ("JIO_VERSION", version.to_string()),
            ("JIO_HOST", self.cfg.hostname.to_string()),
            ("JIO_ROLE", self.cfg.role.to_string()),
            ("JIO_RUN_DIR", run_dir.display().to_string()),
            ("JIO_SERVICE", s.to_string()),
            ("JIO_STEP", phase.to_string()),
            ("JIO_TASK", task.to_string()),
            ("JIO_ROLLOUT", rollout.to_string()),
        ]
        .map(|(k, v)| (k.to_string(), v))
        .to_vec()
    }

    /// Runs one task under its timeout, its output in the run directory's
    /// `base`.stdout and `base`.stderr (its process group journaled once spawned).
    async fn run_task(
        &mut self,
        s: &Service,
        phase: &str,
        task: &crate::services::Task,
        env: &[(String, String)],
        (run_dir, base): (&Path, &str),
    ) -> runner::Finished {
        let spec = Spec {
            argv: &task.command,
            env,
            timeout: task.timeout.unwrap_or(self.cfg.task_timeout),
            stdout: &run_dir.join(format!("{base}.stdout")),
            stderr: &run_dir.join(format!("{base}.stderr")),
        };
        tracing::info!(service = %s, phase, task = %task.name, command = %crate::runner::display_argv(&task.command), "task starts");
        let ledger = &mut self.ledger;
        let mut on_spawn = |group: ProcessGroup| {
            if let Some(run) = ledger.journal.in_progress.as_mut() {
                run.child = Some(group);
                ledger.save();
            }
        };
        let f = runner::run(&spec, &mut self.shutdown, self.cfg.stop_grace, &mut on_spawn).await;
        tracing::info!(service = %s, phase, task = %task.name, exit = %f.exit, elapsed_ms = f.elapsed.as_millis() as u64, "task finished");
        f
    }

    /// A task succeeded: in the journal before the next one starts.
    fn task_done(&mut self, key: String) {
        if let Some(t) = self.ledger.journal.tasks.as_mut() {
            t.done.insert(key);
        }
        if let Some(run) = self.ledger.journal.in_progress.as_mut() {
            run.child = None;
        }
        self.ledger.save();
    }

    /// Reports how one service's step ended. The last report of the run (`last`)
    /// carries the host's result and ends the run in the same transaction.
    #[allow(clippy::too_many_arguments)]
    async fn service_ended(
        &mut self,
        version: &Version,
        rollout: &str,
        phase: &str,
        s: &Service,
        ran: Ran,
        run_dir: &Path,
        last: bool,
    ) {
        let ended = self.clock.unix_now();
        let (outcome, task, exit_code) = match ran {
            Ran::Done => (Outcome::Success { changes: true }, None, None),
            Ran::Failed {
                task,
                reason,
                exit_code,
            } => (Outcome::Failure(reason), task, exit_code),
            Ran::Interrupted => (Outcome::Interrupted, None, None),
        };
        if let Some(t) = self.ledger.journal.tasks.as_mut() {
            match &outcome {
                Outcome::Success { .. } => {
                    t.finished.insert(format!("{phase}/{s}"));
                    if t.failed.as_deref() == Some(phase) {
                        t.failed = None;
                    }
                }
                _ => t.failed = Some(phase.to_string()),
            }
        }
        let result = last.then(|| {
            let mut r = self.run_result(version, Step::Configured, &outcome, exit_code, run_dir, ended);
            r.step = Some(phase.to_string());
            if !outcome.ok() {
                r.service = Some(s.to_string());
                r.task = task.clone();
                let detail = task_detail(run_dir, phase, s);
                if let Outcome::Failure(reason) = &outcome {
                    r.message = Some(crate::results::message(reason, detail.as_deref()));
                }
            }
            r
        });
        if let Outcome::Failure(reason) = &outcome {
            tracing::error!(%version, phase, service = %s, task = task.as_deref().unwrap_or("-"), reason, "step failed");
        }
        let end = if last {
            self.liveness.as_ref().map(|liveness| RunEnd {
                liveness,
                marker: self.cfg.schema.run(&self.cfg.hostname),
                whole_run: false,
            })
        } else {
            None
        };
        let close = last.then(|| {
            let mut c = self.run_close(version, Step::Configured, run_dir, ended);
            c.phase = Some(phase.to_string());
            c
        });
        let task_ref = TaskRef {
            rollout: rollout.to_string(),
            phase: phase.to_string(),
            service: s.clone(),
        };
        let reported = self
            .ledger
            .report_task(
                version,
                task_ref,
                &outcome,
                run_dir,
                result,
                end.as_ref(),
                close.as_ref(),
            )
            .await;
        if let Some((revision, writes)) = &reported.ended {
            self.run_marker = false;
            self.view_took_end = self.view.wrote(writes, *revision);
        }
    }
}

/// The first meaningful line of the failed task's output (its stderr, else stdout).
fn task_detail(run_dir: &Path, phase: &str, s: &Service) -> Option<String> {
    let prefix = format!("task-{phase}-{s}-");
    let mut names: Vec<String> = std::fs::read_dir(run_dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.starts_with(&prefix))
        .collect();
    names.sort();
    let base = names.last()?.rsplit_once('.')?.0.to_string();
    ["stderr", "stdout"].iter().find_map(|ext| {
        let text = std::fs::read_to_string(run_dir.join(format!("{base}.{ext}"))).ok()?;
        crate::results::first_meaningful_line(&text)
    })
}
