//! The configure and validate steps behind one trait: the real commands (the Facter
//! fact, pre-commands, Puppet, the validation) or a script (tests and benchmarks).
//! A step never returns an error: whatever goes wrong is its `Outcome`, with a reason
//! that says what really happened.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jio_common::keys::Step;
use jio_common::names::{HostName, Role, Version};
use tokio::sync::watch;

use crate::config::Config;
use crate::packages::PackageStep;
use crate::runner::{self, Outcome, ProcessGroup, Spec};
use crate::state;

/// What a step runs for, and how it reports the commands it starts.
pub struct StepCtx<'a> {
    pub version: &'a Version,
    pub host: &'a HostName,
    pub role: &'a Role,
    /// The run's directory: commands' output and Puppet's JSON log go there.
    pub run_dir: &'a Path,
    /// Turns true when the agent stops: a step ends as `Interrupted` after the grace.
    pub shutdown: &'a mut watch::Receiver<bool>,
    /// Called with each command's process group once it has started (the journal
    /// keeps it, so that a successor can stop what a killed agent left running).
    pub on_spawn: &'a mut (dyn FnMut(ProcessGroup) + Send),
    /// The exit code of the last command the step ran (none when it was killed,
    /// timed out or could not start): on a failure, the failing command's.
    pub exit_code: Option<i32>,
    /// The package snapshot the configure step writes before its pre-commands.
    pub packages: &'a crate::packages::PackageStep,
}

/// Runs the two steps of a run.
#[async_trait::async_trait]
pub trait StepRunner: Send + Sync {
    /// The configure step: Puppet (and what must come before it).
    async fn configure(&self, ctx: &mut StepCtx<'_>) -> Outcome;
    /// The validation of the configured host.
    async fn validate(&self, ctx: &mut StepCtx<'_>) -> Outcome;
}

/// The real steps: commands under the child-process contract of `runner`.
#[derive(Debug, Clone)]
pub struct CommandSteps {
    facts_file: PathBuf,
    pre_commands: Vec<Vec<String>>,
    pre_command_timeout: Duration,
    puppet_command: Vec<String>,
    puppet_timeout: Duration,
    validation_command: Vec<String>,
    validation_dir: PathBuf,
    validation_timeout: Duration,
    stop_grace: Duration,
    packages: crate::packages::PackageSettings,
}

impl CommandSteps {
    pub fn from_config(cfg: &Config) -> CommandSteps {
        CommandSteps {
            facts_file: cfg.facts_file.clone(),
            pre_commands: cfg.pre_commands.clone(),
            pre_command_timeout: cfg.pre_command_timeout,
            puppet_command: cfg.puppet_command.clone(),
            puppet_timeout: cfg.puppet_timeout,
            validation_command: cfg.validation_command.clone(),
            validation_dir: cfg.validation_dir.clone(),
            validation_timeout: cfg.validation_timeout,
            stop_grace: cfg.stop_grace,
            packages: cfg.packages.clone(),
        }
    }

    /// Runs one command; its output goes to `<run_dir>/<name>.stdout|stderr`.
    async fn exec(
        &self,
        what: &str,
        argv: &[String],
        timeout: Duration,
        name: &str,
        ctx: &mut StepCtx<'_>,
    ) -> runner::Finished {
        let env = [
            ("JIO_VERSION", ctx.version.to_string()),
            ("JIO_HOST", ctx.host.to_string()),
            ("JIO_ROLE", ctx.role.to_string()),
            ("JIO_RUN_DIR", ctx.run_dir.display().to_string()),
        ]
        .map(|(k, v)| (k.to_string(), v))
        .to_vec();
        let spec = Spec {
            argv,
            env: &env,
            timeout,
            stdout: &ctx.run_dir.join(format!("{name}.stdout")),
            stderr: &ctx.run_dir.join(format!("{name}.stderr")),
        };
        tracing::info!(step = what, command = %crate::runner::display_argv(argv), "starting");
        let on_spawn = &mut *ctx.on_spawn;
        let f = runner::run(&spec, ctx.shutdown, self.stop_grace, on_spawn).await;
        tracing::info!(step = what, exit = %f.exit, elapsed_ms = f.elapsed.as_millis() as u64, "finished");
        ctx.exit_code = match f.exit {
            runner::Exit::Code(c) => Some(c),
            _ => None,
        };
        f
    }

    fn substitute(&self, argv: &[String], run_dir: &Path) -> Vec<String> {
        substitute(argv, &run_dir.join("puppet.jsonl"), &self.validation_dir)
    }
}

#[async_trait::async_trait]
impl StepRunner for CommandSteps {
    async fn configure(&self, ctx: &mut StepCtx<'_>) -> Outcome {
        if let Err(e) = state::write_fact(&self.facts_file, ctx.version) {
            return Outcome::Failure(format!(
                "the Facter fact could not be written to {}: {e}",
                self.facts_file.display()
            ));
        }
        // The snapshot's sources and pin first: `apt-get update` reads them.
        match ctx.packages {
            // No template (any more): an old snapshot must not stay pinned.
            PackageStep::AsToday => match crate::packages::remove_snapshot(&self.packages) {
                Ok(true) => tracing::info!(
                    "no package snapshot template applies: removed the sources entry and pin an earlier run wrote"
                ),
                Ok(false) => {}
                Err(e) => {
                    return Outcome::Failure(format!(
                        "the package snapshot files of an earlier run could not be removed (no template applies now): {e}"
                    ));
                }
            },
            PackageStep::Unusable(why) => {
                return Outcome::Failure(format!(
                    "the package snapshot of {} cannot be used: {why}",
                    ctx.version
                ));
            }
            PackageStep::Snapshot(snap) => {
                if let Err(e) = crate::packages::write_snapshot(&self.packages, snap) {
                    return Outcome::Failure(format!(
                        "the package snapshot of {} could not be written: {e}",
                        ctx.version
                    ));
                }
                tracing::info!(version = %ctx.version, source = %jio_common::packages::redact_userinfo(&snap.sources_line()), "package snapshot written");
            }
        }
        for (i, cmd) in self.pre_commands.iter().enumerate() {
            let f = self
                .exec(
                    "pre-command",
                    cmd,
                    self.pre_command_timeout,
                    &format!("pre-{i}"),
                    ctx,
                )
                .await;
            let o = runner::plain_outcome(&format!("pre-command {:?}", short_command(cmd)), &f.exit);
            if !o.ok() {
                return o;
            }
        }
        let argv = self.substitute(&self.puppet_command, ctx.run_dir);
        let f = self
            .exec("puppet", &argv, self.puppet_timeout, "puppet", ctx)
            .await;
        runner::puppet_outcome(&f.exit)
    }

    async fn validate(&self, ctx: &mut StepCtx<'_>) -> Outcome {
        if self
            .validation_command
            .iter()
            .any(|a| a.contains("{validation_dir}"))
            && !self.validation_dir.is_dir()
        {
            return Outcome::Failure(format!(
                "validation directory {} does not exist",
                self.validation_dir.display()
            ));
        }
        let argv = self.substitute(&self.validation_command, ctx.run_dir);
        let f = self
            .exec("validation", &argv, self.validation_timeout, "validation", ctx)
            .await;
        runner::plain_outcome("validation", &f.exit)
    }
}

/// A command as a reason names it: its words, cut at 48 characters (a result's
/// message has room for what the command said, not for a long argument list).
fn short_command(argv: &[String]) -> String {
    let whole = argv.join(" ");
    match whole.char_indices().nth(48) {
        Some((i, _)) => format!("{}…", &whole[..i]),
        None => whole,
    }
}

/// Replaces `{log_jsonl}` and `{validation_dir}` in a configured command.
fn substitute(argv: &[String], jsonl: &Path, validation_dir: &Path) -> Vec<String> {
    argv.iter()
        .map(|a| {
            a.replace("{log_jsonl}", &jsonl.display().to_string())
                .replace("{validation_dir}", &validation_dir.display().to_string())
        })
        .collect()
}

/// Called when a scripted step starts, with the step, the host and the version.
pub type OnStep = Arc<dyn Fn(Step, &HostName, &Version) + Send + Sync>;

/// Steps that take a set time on tokio's clock and end as scripted: each call takes
/// the next outcome of its step's script, and succeeds once the script is used up.
/// For many agents in one process (benchmarks) and the loop's tests on paused time.
#[derive(Default)]
pub struct ScriptedSteps {
    configure_time: Duration,
    validate_time: Duration,
    configure_outcomes: Mutex<VecDeque<Outcome>>,
    validate_outcomes: Mutex<VecDeque<Outcome>>,
    on_step: Option<OnStep>,
    calls: Mutex<Vec<(Step, Version)>>,
}

impl ScriptedSteps {
    pub fn new() -> ScriptedSteps {
        ScriptedSteps::default()
    }

    /// Each step takes this long (tokio's clock).
    pub fn taking(mut self, configure: Duration, validate: Duration) -> ScriptedSteps {
        self.configure_time = configure;
        self.validate_time = validate;
        self
    }

    /// The outcomes of the next configure steps, in order.
    pub fn configure_outcomes(self, o: impl IntoIterator<Item = Outcome>) -> ScriptedSteps {
        lock(&self.configure_outcomes).extend(o);
        self
    }

    /// The outcomes of the next validations, in order.
    pub fn validate_outcomes(self, o: impl IntoIterator<Item = Outcome>) -> ScriptedSteps {
        lock(&self.validate_outcomes).extend(o);
        self
    }

    /// Adds outcomes while the agent runs.
    pub fn push(&self, step: Step, o: Outcome) {
        match step {
            Step::Configured => lock(&self.configure_outcomes).push_back(o),
            Step::Validated => lock(&self.validate_outcomes).push_back(o),
        }
    }

    /// Called as each step starts.
    pub fn on_step(mut self, f: OnStep) -> ScriptedSteps {
        self.on_step = Some(f);
        self
    }

    /// Every step run so far, in order.
    pub fn calls(&self) -> Vec<(Step, Version)> {
        lock(&self.calls).clone()
    }

    async fn step(&self, step: Step, ctx: &mut StepCtx<'_>) -> Outcome {
        lock(&self.calls).push((step, ctx.version.clone()));
        if let Some(f) = &self.on_step {
            f(step, ctx.host, ctx.version);
        }
        let (time, script) = match step {
            Step::Configured => (self.configure_time, &self.configure_outcomes),
            Step::Validated => (self.validate_time, &self.validate_outcomes),
        };
        let outcome = lock(script)
            .pop_front()
            .unwrap_or(Outcome::Success { changes: false });
        let stopped = async {
            while !*ctx.shutdown.borrow_and_update() {
                if ctx.shutdown.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(time) => outcome,
            _ = stopped => Outcome::Interrupted,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[async_trait::async_trait]
impl StepRunner for ScriptedSteps {
    async fn configure(&self, ctx: &mut StepCtx<'_>) -> Outcome {
        self.step(Step::Configured, ctx).await
    }

    async fn validate(&self, ctx: &mut StepCtx<'_>) -> Outcome {
        self.step(Step::Validated, ctx).await
    }
}
