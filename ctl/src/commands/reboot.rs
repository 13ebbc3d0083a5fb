//! `jioctl reboot (--role R | --hosts H,… | HOST… | --all) [--only-if-required]`: reboots
//! hosts under the rolling rules, as a fleet command whose action is the agent's
//! own reboot (`REBOOT_ACTION`). A host's slot is held from its start until it is
//! back with a new boot id and validated; the command shares the fleet with
//! rollouts and other commands, and follows, pauses and cancels like them.

use std::path::PathBuf;

use clap::Args;
use jio_common::command_record::{ONLY_IF_REQUIRED, REBOOT_ACTION, Targets};
use jio_common::names::{HostName, Role};

use crate::commands::run::{detached, follow, load_rules};
use crate::context::{Access, Context};
use crate::exit::{Failure, Outcome};
use crate::fleet_commands::{self, NewCommand};

#[derive(Args, Debug)]
pub struct Reboot {
    /// Reboot every host of this role (repeat it, or give a comma-separated list)
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["hosts", "all"])]
    role: Vec<Role>,
    /// Reboot these hosts (repeat it, or give a comma-separated list)
    #[arg(long, value_delimiter = ',', conflicts_with = "all")]
    hosts: Vec<HostName>,
    /// Reboot these hosts: the same as --hosts, named as hold names them
    #[arg(value_name = "HOST", conflicts_with_all = ["role", "all"])]
    host_arguments: Vec<HostName>,
    /// Reboot every host of the fleet
    #[arg(long)]
    all: bool,
    /// Reboot only the hosts that say a reboot is required (the agent's reboot_required_file or reboot_check_command); the others succeed at once
    #[arg(long)]
    only_if_required: bool,
    /// The rolling rules as JSON [default: those of /etc/jio-upgrade.json when it exists]
    #[arg(long, conflicts_with = "instructions_file")]
    instructions: Option<String>,
    /// A file holding the rolling rules
    #[arg(long)]
    instructions_file: Option<PathBuf>,
    /// Go ahead with rules that name roles or groups the fleet does not have (yet)
    #[arg(long)]
    force: bool,
    /// Return as soon as the command is recorded (a driver service drives it)
    #[arg(long)]
    detach: bool,
}

impl Reboot {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let hosts = crate::hosts_arg::hosts_named(&self.host_arguments, &self.hosts)?;
        let targets = match (self.all, self.role.is_empty(), hosts.is_empty()) {
            (true, _, _) => Targets::All,
            (false, false, _) => Targets::Roles(self.role.clone()),
            (false, true, false) => Targets::Hosts(hosts),
            (false, true, true) => {
                return Err(Failure::usage(
                    "say which hosts to reboot: --all, --role R or --hosts H (nothing was written)",
                ));
            }
        };
        let strict = (self.instructions.is_some() || self.instructions_file.is_some()) && !self.force;
        let (rules, rules_json) = load_rules(self.instructions, self.instructions_file)?;
        let store = ctx.open(Access::Write).await?;
        let args = if self.only_if_required {
            vec![ONLY_IF_REQUIRED.to_string()]
        } else {
            Vec::new()
        };
        let new = NewCommand {
            action: REBOOT_ACTION.into(),
            args,
            targets,
            rules,
            rules_json,
            timeout: None,
            rerun_interrupted: false,
            strict,
        };
        let record = fleet_commands::create(&store, ctx.schema(), &ctx.config.role_pattern, new).await?;
        eprintln!(
            "jioctl: command {} recorded: reboot{} of {} ({}); each host keeps its slot until it is back and validated",
            record.id,
            if self.only_if_required {
                " where required"
            } else {
                ""
            },
            jio_common::command::hosts_n(record.hosts.len()),
            record.targets
        );
        if self.detach {
            return detached(ctx, &store, &record).await;
        }
        follow(ctx, &store, &record.id).await
    }
}
