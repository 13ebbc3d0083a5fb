//! One module per subcommand: its arguments (typed, parsed and validated by clap
//! before anything touches the store) and its `run`. Errors go back as a `Failure`;
//! nothing here picks an exit code for an error it did not name.

mod check_single_version;
mod current_version;
mod drive;
mod enable_puppet;
mod explain;
mod fleet_cmds;
mod forget_host;
mod get_failures;
mod global_disable_puppet;
mod hold;
mod hosts_at_version;
mod logs;
mod lookup;
mod reboot;
mod repo;
mod retry;
mod rollout;
pub(crate) mod run;
mod running_versions;
mod status;
mod trigger_update;
mod upgrade;
mod verify_hosts;

use clap::Subcommand;

use crate::context::Context;
use crate::exit::Outcome;

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Hosts by state (upgraded, upgrading, failed, pending, lost) and role
    Status(status::Status),
    /// Start a rollout to VERSION under the rules (recorded in the store) and follow it
    Upgrade(upgrade::Upgrade),
    /// The active rollout and past ones: status, pause, resume, abort, history, undo
    Rollout(rollout::Rollout),
    /// The driver service: drive whatever rollout is current while holding the rollout lock
    Drive(drive::Drive),
    /// Why a host is where it is: gate, hold, rollout, the rule that blocks, last run, agent
    Explain(explain::Explain),
    /// Keep hosts (or a role) out of every rollout until released
    Hold(hold::Hold),
    /// Release held hosts (or a role)
    Release(hold::Release),
    /// Delete every role and host enable_puppet key and set the global one to false
    #[command(alias = "global_disable_puppet")]
    GlobalDisablePuppet(global_disable_puppet::GlobalDisablePuppet),
    /// Set /current_version (refused when it would release hosts outside any rules, unless --force)
    #[command(alias = "trigger_update")]
    TriggerUpdate(trigger_update::TriggerUpdate),
    /// Print /current_version
    #[command(alias = "current_version")]
    CurrentVersion(current_version::CurrentVersion),
    /// Set (or delete) an enable_puppet key
    #[command(alias = "enable_puppet")]
    EnablePuppet(enable_puppet::EnablePuppet),
    /// Versions hosts run, with counts
    #[command(alias = "running_versions")]
    RunningVersions(running_versions::RunningVersions),
    /// Hosts at a version
    #[command(alias = "hosts_at_version")]
    HostsAtVersion(hosts_at_version::HostsAtVersion),
    /// Exit 0 only when every host (arguments, or stdin) is at VERSION
    #[command(alias = "verify_hosts")]
    VerifyHosts(verify_hosts::VerifyHosts),
    /// Exit 0 when VERSION is the only version running
    #[command(alias = "check_single_version")]
    CheckSingleVersion(check_single_version::CheckSingleVersion),
    /// Print the run log linked from a host's status entry (fetched from Swift)
    Logs(logs::Logs),
    /// Failed hosts of the current version
    #[command(alias = "get_failures")]
    GetFailures(get_failures::GetFailures),
    /// Run an action on hosts under the rolling rules, and follow it (a fleet command)
    Run(run::Run),
    /// Reboot hosts under the rolling rules, each host's slot held until it is back and validated (a fleet command)
    Reboot(reboot::Reboot),
    /// Fleet commands: list, show, follow, cancel
    Commands(fleet_cmds::Commands),
    /// The package snapshot template: a version is a package snapshot (set, show, check, unset)
    Repo(repo::Repo),
    /// Remove a decommissioned host from the store (every key that names it), in one transaction
    ForgetHost(forget_host::ForgetHost),
    /// Run failed hosts' upgrade again now (their host enable key set to true)
    Retry(retry::Retry),
}

impl Command {
    pub async fn run(self, ctx: &Context) -> Outcome {
        match self {
            Command::Status(c) => c.run(ctx).await,
            Command::Upgrade(c) => c.run(ctx).await,
            Command::Rollout(c) => c.run(ctx).await,
            Command::Drive(c) => c.run(ctx).await,
            Command::Explain(c) => c.run(ctx).await,
            Command::Hold(c) => c.run(ctx).await,
            Command::Release(c) => c.run(ctx).await,
            Command::GlobalDisablePuppet(c) => c.run(ctx).await,
            Command::TriggerUpdate(c) => c.run(ctx).await,
            Command::CurrentVersion(c) => c.run(ctx).await,
            Command::EnablePuppet(c) => c.run(ctx).await,
            Command::RunningVersions(c) => c.run(ctx).await,
            Command::HostsAtVersion(c) => c.run(ctx).await,
            Command::VerifyHosts(c) => c.run(ctx).await,
            Command::CheckSingleVersion(c) => c.run(ctx).await,
            Command::Logs(c) => c.run(ctx).await,
            Command::GetFailures(c) => c.run(ctx).await,
            Command::ForgetHost(c) => c.run(ctx).await,
            Command::Run(c) => c.run(ctx).await,
            Command::Reboot(c) => c.run(ctx).await,
            Command::Commands(c) => c.run(ctx).await,
            Command::Repo(c) => c.run(ctx).await,
            Command::Retry(c) => c.run(ctx).await,
        }
    }
}
