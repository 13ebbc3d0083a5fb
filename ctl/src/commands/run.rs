//! `jioctl run [--role R | --hosts H | --all] [--instructions ...] ACTION [ARGS...]`:
//! records a fleet command and follows it (driving it while nobody else does).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use jio_common::command_record::{CommandState, Targets};
use jio_common::names::{HostName, Role};

use crate::context::{Access, Context};
use crate::exit::{self, Failure, Outcome};
use crate::fleet_commands::{self, FollowEnd, FollowOpts, NewCommand};

#[derive(Args, Debug)]
pub struct Run {
    /// Run on every host of this role (repeat it, or give a comma-separated list)
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["hosts", "all"])]
    role: Vec<Role>,
    /// Run on these hosts (repeat it, or give a comma-separated list)
    #[arg(long, value_delimiter = ',', conflicts_with = "all")]
    hosts: Vec<HostName>,
    /// Run on every host of the fleet
    #[arg(long)]
    all: bool,
    /// The rolling rules as JSON [default: those of /etc/jio-upgrade.json when it exists]
    #[arg(long, conflicts_with = "instructions_file")]
    instructions: Option<String>,
    /// A file holding the rolling rules
    #[arg(long)]
    instructions_file: Option<PathBuf>,
    /// How long the action may run on each host before it is stopped and counts as failed [default: the agents' command_timeout, 30m]
    #[arg(long, value_parser = crate::commands::upgrade::duration)]
    timeout: Option<Duration>,
    /// A host whose agent stopped while the action ran runs it again (default: reported interrupted, not run again)
    #[arg(long)]
    rerun_interrupted: bool,
    /// Go ahead with rules that name roles or groups the fleet does not have (yet)
    #[arg(long)]
    force: bool,
    /// Return as soon as the command is recorded (a driver service drives it)
    #[arg(long)]
    detach: bool,
    /// The action: an executable in the agents' actions_dir (/usr/lib/jiocloud/actions), or a program where the agents allow any command
    action: String,
    /// The action's arguments: everything after ACTION is the action's (jioctl's
    /// own options go before ACTION)
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

/// jioctl's own options of `run`, as an operator might type them after ACTION.
const RUN_OPTIONS: [&str; 9] = [
    "--role",
    "--hosts",
    "--all",
    "--instructions",
    "--instructions-file",
    "--timeout",
    "--rerun-interrupted",
    "--detach",
    "--json",
];

/// The action's arguments that look like jioctl's own options.
fn options_after_action(args: &[String]) -> Vec<&str> {
    args.iter()
        .map(|a| a.split('=').next().unwrap_or(a))
        .filter(|a| RUN_OPTIONS.contains(a))
        .collect()
}

impl Run {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let targets = self.targets()?;
        self.check_action()?;
        let strict = (self.instructions.is_some() || self.instructions_file.is_some()) && !self.force;
        let (rules, rules_json) = load_rules(self.instructions, self.instructions_file)?;
        let store = ctx.open(Access::Write).await?;
        let schema = ctx.schema();
        let record = fleet_commands::create(
            &store,
            schema,
            &ctx.config.role_pattern,
            NewCommand {
                action: self.action,
                args: self.args,
                targets,
                rules,
                rules_json,
                timeout: self.timeout,
                rerun_interrupted: self.rerun_interrupted,
                strict,
            },
        )
        .await?;
        let id = record.id.clone();
        crate::out::tell(&format!(
            "command {id} recorded: {} on {} ({})",
            record.command_line(),
            jio_common::command::hosts_n(record.hosts.len()),
            record.targets
        ));
        if self.detach {
            return detached(ctx, &store, &record).await;
        }
        follow(ctx, &store, &id).await
    }

    /// Where to run it: `--all`, `--role` or `--hosts`; none is a usage error
    /// (naming those given after ACTION, which are the action's).
    fn targets(&self) -> Result<Targets, Failure> {
        match (self.all, self.role.is_empty(), self.hosts.is_empty()) {
            (true, _, _) => Ok(Targets::All),
            (false, false, _) => Ok(Targets::Roles(self.role.clone())),
            (false, true, false) => Ok(Targets::Hosts(self.hosts.clone())),
            (false, true, true) => {
                let late = options_after_action(&self.args);
                Err(Failure::usage(format!(
                    "say where to run it: --all, --role R or --hosts H, before ACTION (nothing was written){}",
                    if late.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; {} came after the action {:?}, so it would be the action's argument",
                            late.join(", "),
                            self.action
                        )
                    }
                )))
            }
        }
    }

    /// Notes jioctl's options given after ACTION (the action's arguments), and
    /// refuses an empty action or a zero timeout.
    fn check_action(&self) -> Result<(), Failure> {
        let late = options_after_action(&self.args);
        if !late.is_empty() {
            crate::out::tell(&format!(
                "note: {} comes after the action {:?}: it is passed to the action as its argument, not taken by jioctl (jioctl's options go before ACTION)",
                late.join(", "),
                self.action
            ));
        }
        if self.action.is_empty() {
            return Err(Failure::usage("the action is empty (nothing was written)"));
        }
        if self.action.starts_with('@') {
            return Err(Failure::usage(format!(
                "{:?}: actions starting with @ are built in (`jioctl reboot` for {}); nothing was written",
                self.action,
                jio_common::command_record::REBOOT_ACTION
            )));
        }
        if self.timeout.is_some_and(|t| t.is_zero()) {
            return Err(Failure::usage(
                "--timeout must be more than 0s (nothing was written)",
            ));
        }
        Ok(())
    }
}

/// `--detach`: says who drives the recorded command, and prints its id (or its
/// record, as JSON).
pub(crate) async fn detached(
    ctx: &Context,
    store: &jio_common::store::DynStore,
    record: &jio_common::command_record::CommandRecord,
) -> Outcome {
    let id = &record.id;
    let snap = ctx.snapshot(store).await?;
    if snap.drivers.is_empty() {
        crate::out::tell(&format!(
            "no driver service (jioctl drive) is running: nothing admits its hosts until one starts, or `jioctl commands follow {id}` drives it"
        ));
    } else {
        crate::out::tell(&format!(
            "the driver service{} {} drive{} it; `jioctl commands follow {id}` follows it",
            if snap.drivers.len() == 1 { "" } else { "s" },
            snap.drivers.keys().cloned().collect::<Vec<_>>().join(", "),
            if snap.drivers.len() == 1 { "s" } else { "" }
        ));
    }
    if ctx.json {
        println!(
            "{}",
            crate::out::document(serde_json::json!({ "command": record }))
        );
    } else {
        println!("{id}");
    }
    Ok(())
}

/// Follows (and drives, while nobody else does) the command until it ends, then
/// prints its table; Ctrl-C stops following (the command goes on).
pub async fn follow(
    ctx: &Context,
    store: &jio_common::store::DynStore,
    id: &jio_common::names::CommandId,
) -> Outcome {
    let (tx, rx) = tokio::sync::watch::channel(false);
    let opts = FollowOpts {
        drive: true,
        quiet: false,
        ttl: crate::writes::LOCK_TTL,
    };
    let schema = ctx.schema();
    let followed = fleet_commands::follow(store, schema, &ctx.config.role_pattern, id, opts, rx);
    tokio::pin!(followed);
    let end = tokio::select! {
        r = &mut followed => r,
        sig = crate::upgrade::interrupted() => {
            let _ = tx.send(true);
            // Let it release the lock before returning.
            let _ = followed.await;
            let running = fleet_commands::read(store, schema, &ctx.config.role_pattern, id)
                .await
                .map(|r| r.plan.running.len())
                .unwrap_or(0);
            let now = fleet_commands::who_drives_now(store, schema, id).await;
            crate::out::tell(&format!(
                "{sig}: stopped following command {id}; it goes on{}; {now}",
                match running {
                    0 => String::new(),
                    1 => " (the host running it finishes)".into(),
                    n => format!(" (the {n} hosts running it finish)"),
                }
            ));
            return Err(Failure::quiet(crate::upgrade::signal_code(sig)));
        }
    };
    match end.map_err(fleet_commands::failure)? {
        FollowEnd::Ended(r) => {
            fleet_commands::print_end(&r, ctx.json);
            if let CommandState::Cancelled { by, reason } | CommandState::Aborted { by, reason } =
                &r.record.state
            {
                crate::out::tell(&format!(
                    "command {id} was {} by {by}{}",
                    r.record.state.name(),
                    reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default()
                ));
            }
            fleet_commands::exit_of(&r.record.state)
        }
        FollowEnd::Stopped => Err(Failure::quiet(exit::SIGINT)),
    }
}

/// The rules of a command: given, or the rolling rules of the default rules file
/// (its rollout-only keys left out, and said so).
pub(crate) fn load_rules(
    instructions: Option<String>,
    file: Option<PathBuf>,
) -> Result<(jio_common::rules::Rules, serde_json::Value), Failure> {
    let given = instructions.is_some() || file.is_some();
    let text = match (instructions, file) {
        (Some(t), _) => t,
        (None, Some(p)) => std::fs::read_to_string(&p).map_err(|e| {
            Failure::usage(format!(
                "--instructions-file {}: {e} (nothing was written)",
                p.display()
            ))
        })?,
        (None, None) => match std::fs::read_to_string(crate::commands::upgrade::DEFAULT_RULES) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "{}".into(),
            Err(e) => {
                return Err(Failure::usage(format!(
                    "{}: {e}",
                    crate::commands::upgrade::DEFAULT_RULES
                )));
            }
        },
    };
    let text = if given {
        text
    } else {
        // The site's rules file also holds rollout-only settings: the rolling
        // rules apply to commands, the rest is left out.
        let mut v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            Failure::with(
                exit::INVALID_RULES,
                anyhow::anyhow!("{}: {e}", crate::commands::upgrade::DEFAULT_RULES),
            )
        })?;
        if let Some(m) = v.as_object_mut() {
            let dropped: Vec<String> = jio_common::command::NOT_FOR_COMMANDS
                .iter()
                .filter(|k| m.remove(**k).is_some())
                .map(|k| k.to_string())
                .collect();
            if !dropped.is_empty() {
                crate::out::tell(&format!(
                    "using the rolling rules of {}; {} apply to rollouts only and are left out",
                    crate::commands::upgrade::DEFAULT_RULES,
                    dropped.join(", ")
                ));
            }
        }
        v.to_string()
    };
    let rules =
        jio_common::command::parse_rules(&text).map_err(|e| Failure::with(exit::INVALID_RULES, e.into()))?;
    let json = serde_json::from_str(&text).map_err(|e| Failure::with(exit::INVALID_RULES, e.into()))?;
    Ok((rules, json))
}
