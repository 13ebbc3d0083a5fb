//! One module per subcommand: its arguments (typed, parsed and validated by clap
//! before anything touches the store) and its `run`. Errors go back as a `Failure`;
//! nothing here picks an exit code for an error it did not name. Every subcommand's
//! help ends with examples (`examples!`), each a real invocation (a test parses them).

/// A help's "Examples:" section: each invocation, then what it does.
macro_rules! examples {
    ($(($invocation:expr, $what:expr)),+ $(,)?) => {
        concat!("Examples:", $("\n  ", $invocation, "\n      ", $what),+)
    };
}

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
    #[command(after_help = examples!(
        ("jioctl status", "the fleet by state and role, and why each host waits"),
        ("jioctl status --role compute --watch", "the computes, redrawn on every change"),
        ("jioctl status --hosts", "every host on its own line too"),
    ))]
    Status(status::Status),
    /// Start a rollout to VERSION under the rules (recorded in the store) and follow it
    #[command(after_help = examples!(
        ("jioctl upgrade v42 --instructions-file /etc/jio-upgrade.json", "roll v42 out under these rules, and follow it"),
        ("jioctl upgrade v42 --noop", "print the waves it would admit, write nothing"),
        ("jioctl upgrade v42 --detach", "record the rollout and return; the driver service drives it"),
    ))]
    Upgrade(upgrade::Upgrade),
    /// The active rollout and past ones: status, pause, resume, abort, history, undo
    #[command(after_help = examples!(
        ("jioctl rollout status", "the active rollout: state, driver, progress"),
        ("jioctl rollout pause --reason 'night shift' --for 8h", "admit nothing for 8 hours; hosts in flight finish"),
        ("jioctl rollout history", "past rollouts, newest first"),
    ))]
    Rollout(rollout::Rollout),
    /// The driver service: drive whatever rollout is current while holding the rollout lock
    #[command(after_help = examples!(
        ("jioctl drive", "drive the current rollout, or stand by (as jioctl-drive.service does)"),
        ("jioctl drive --lease 20s --metrics-listen 127.0.0.1:9465", "a longer lease, and Prometheus metrics on /metrics"),
    ))]
    Drive(drive::Drive),
    /// Why a host is where it is: gate, hold, rollout, the rule that blocks, last run, agent
    #[command(after_help = examples!(
        ("jioctl explain compute7", "why compute7 is where it is, decision by decision"),
        ("jioctl --json explain compute7", "the same for programs"),
    ))]
    Explain(explain::Explain),
    /// Keep hosts (or a role) out of every rollout until released
    #[command(after_help = examples!(
        ("jioctl hold compute7 --reason 'disk swap'", "keep compute7 out of every rollout"),
        ("jioctl hold --hosts compute7,compute8", "the same for two hosts, named as run and reboot name them"),
        ("jioctl hold --role ceph --reason rebalancing", "keep every ceph host out"),
    ))]
    Hold(hold::Hold),
    /// Release held hosts (or a role)
    #[command(after_help = examples!(
        ("jioctl release compute7", "let compute7 be admitted again"),
        ("jioctl release --role ceph", "release the hold on the ceph role"),
    ))]
    Release(hold::Release),
    /// Delete every role and host enable_puppet key and set the global one to false
    #[command(alias = "global_disable_puppet")]
    #[command(after_help = examples!(
        ("jioctl global-disable-puppet", "the emergency stop: nothing more starts, the rollout is halted"),
    ))]
    GlobalDisablePuppet(global_disable_puppet::GlobalDisablePuppet),
    /// Set /current_version (refused when it would release hosts outside any rules, unless --force)
    #[command(alias = "trigger_update")]
    #[command(after_help = examples!(
        ("jioctl trigger-update v42", "set the desired version (refused if it releases hosts outside any rules)"),
        ("jioctl trigger-update v42 --force", "set it all the same"),
    ))]
    TriggerUpdate(trigger_update::TriggerUpdate),
    /// Print /current_version
    #[command(alias = "current_version")]
    #[command(after_help = examples!(
        ("jioctl current-version", "print the desired version"),
    ))]
    CurrentVersion(current_version::CurrentVersion),
    /// Set (or delete) an enable_puppet key
    #[command(alias = "enable_puppet")]
    #[command(after_help = examples!(
        ("jioctl enable-puppet true --host compute7", "let compute7 run Puppet, whatever its role's and the global key say"),
        ("jioctl enable-puppet false --role ceph", "stop the ceph hosts that have no key of their own"),
        ("jioctl enable-puppet --delete --host compute7", "remove compute7's key: its role's or the global key decides"),
    ))]
    EnablePuppet(enable_puppet::EnablePuppet),
    /// Versions hosts run, with counts
    #[command(alias = "running_versions")]
    #[command(after_help = examples!(
        ("jioctl running-versions", "each version hosts run, with how many"),
    ))]
    RunningVersions(running_versions::RunningVersions),
    /// Hosts at a version
    #[command(alias = "hosts_at_version")]
    #[command(after_help = examples!(
        ("jioctl hosts-at-version v41", "the hosts still at v41"),
    ))]
    HostsAtVersion(hosts_at_version::HostsAtVersion),
    /// Exit 0 only when every host (arguments, or stdin) is at VERSION
    #[command(alias = "verify_hosts")]
    #[command(after_help = examples!(
        ("jioctl verify-hosts v42 compute1 compute2", "exit 0 only if both run v42"),
        ("jioctl verify-hosts v42 --hosts compute1,compute2", "the same, hosts named as run names them"),
        ("echo compute1 compute2 | jioctl verify-hosts v42", "the hosts read from stdin"),
    ))]
    VerifyHosts(verify_hosts::VerifyHosts),
    /// Exit 0 when VERSION is the only version running
    #[command(alias = "check_single_version")]
    #[command(after_help = examples!(
        ("jioctl check-single-version v42", "exit 0 only if v42 is the one version running"),
    ))]
    CheckSingleVersion(check_single_version::CheckSingleVersion),
    /// Print the run log linked from a host's status entry (fetched from Swift)
    #[command(after_help = examples!(
        ("jioctl logs compute7", "compute7's run log for the current version"),
        ("jioctl logs compute7 --version v41 --phase validated", "its validation log of v41"),
        ("jioctl logs compute7 --command 20261125T031500Z-restart-nova", "its output of a fleet command"),
    ))]
    Logs(logs::Logs),
    /// Failed hosts of the current version
    #[command(alias = "get_failures")]
    #[command(after_help = examples!(
        ("jioctl get-failures", "the failed hosts of the current version"),
        ("jioctl get-failures --hosts", "one line per host, with the log link"),
    ))]
    GetFailures(get_failures::GetFailures),
    /// Run an action on hosts under the rolling rules, and follow it (a fleet command)
    #[command(after_help = examples!(
        ("jioctl run --role compute restart-nova", "run the action restart-nova on the computes under the rules, and follow it"),
        ("jioctl run --hosts compute1,compute2 --timeout 10m restart-service nova-api", "two hosts, the action with an argument, 10 minutes each at most"),
        ("jioctl run --all --detach restart-service web", "every host; a driver service drives it"),
    ))]
    Run(run::Run),
    /// Reboot hosts under the rolling rules, each host's slot held until it is back and validated (a fleet command)
    #[command(after_help = examples!(
        ("jioctl reboot --role compute --only-if-required", "reboot the computes that need it, under the rules"),
        ("jioctl reboot --hosts compute7,compute8", "reboot two hosts, one slot each until back and validated"),
    ))]
    Reboot(reboot::Reboot),
    /// Fleet commands: list, show, follow, cancel
    #[command(after_help = examples!(
        ("jioctl commands list", "fleet commands, newest first"),
        ("jioctl commands follow 20261125T031500Z-restart-nova", "follow one to its end"),
    ))]
    Commands(fleet_cmds::Commands),
    /// The package snapshot template: a version is a package snapshot (set, show, check, unset)
    #[command(after_help = examples!(
        ("jioctl repo show", "the package snapshot template"),
        ("jioctl repo check v42", "check that v42's snapshot exists"),
    ))]
    Repo(repo::Repo),
    /// Remove a decommissioned host from the store (every key that names it), in one transaction
    #[command(after_help = examples!(
        ("jioctl forget-host compute9", "remove the decommissioned compute9 from the store"),
    ))]
    ForgetHost(forget_host::ForgetHost),
    /// Run failed hosts' upgrade again now (their host enable key set to true)
    #[command(after_help = examples!(
        ("jioctl retry compute3", "run compute3's failed upgrade again now"),
        ("jioctl retry --failed", "every host that failed the current version"),
        ("jioctl retry compute3 --force", "also when compute3 has not failed"),
    ))]
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
