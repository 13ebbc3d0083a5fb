//! `jioctl retry HOST... | --failed [--force]`: run a failed host's upgrade again
//! now. It does what the recovery has always been (`enable-puppet true --host H`:
//! the agent sees its host key written and runs at once), for several hosts, each
//! write fenced on the plan epoch the failures were read at.

use anyhow::Context as _;
use clap::Args;
use jio_common::command::resolve_targets;
use jio_common::command_record::Targets;
use jio_common::fleet::{self, HostState, Snapshot};
use jio_common::keys::EnableLevel;
use jio_common::names::HostName;
use jio_common::store::{Compare, DynStore, Revision, Txn, TxnOutcome};

use crate::context::{Access, Context};
use crate::exit::{Failure, Outcome};
use crate::writes;

#[derive(Args, Debug)]
pub struct Retry {
    /// The hosts to run again (hosts that failed the current version)
    #[arg(required_unless_present_any = ["failed", "hosts_flag"])]
    hosts: Vec<HostName>,
    /// The same hosts, as run and reboot name them (repeat it, or a comma-separated list)
    #[arg(long = "hosts", value_name = "HOSTS", value_delimiter = ',')]
    hosts_flag: Vec<HostName>,
    /// Every host that failed the current version
    #[arg(long, conflicts_with_all = ["hosts", "hosts_flag"])]
    failed: bool,
    /// Also a host that has not failed, or during an emergency stop
    #[arg(long)]
    force: bool,
}

/// How many times a retry decided on a snapshot is tried again when a driver wrote
/// in between.
const ATTEMPTS: usize = 5;

impl Retry {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let store = ctx.open(Access::Write).await?;
        for _ in 0..ATTEMPTS {
            let snap = ctx.snapshot(&store).await?;
            let (hosts, left_out) = self.decide(&snap)?;
            for line in &left_out {
                crate::say!("left out: {line}");
            }
            if hosts.is_empty() {
                crate::say!("no host to retry: nothing was written");
                return Ok(());
            }
            if let Some(written) = enable(ctx, &store, &hosts, snap.epoch).await? {
                rewrite(ctx, &store, &written).await?;
                say_done(ctx, &snap, &hosts);
                return Ok(());
            }
        }
        Err(Failure::new(
            crate::exit::FAILED,
            format!(
                "the fleet changed under every one of {ATTEMPTS} tries (a driver writing); nothing was written: try again"
            ),
        ))
    }

    /// The hosts to re-enable and, with `--failed`, the failed hosts left out and
    /// why; or why nothing is written.
    fn decide(&self, snap: &Snapshot) -> Result<(Vec<HostName>, Vec<String>), Failure> {
        if !self.force
            && let Some(why) = fleet_refuses(snap)
        {
            return Err(Failure::usage(format!(
                "{why}: nothing was written (--force retries all the same)"
            )));
        }
        let classified = fleet::classify(snap);
        let check = Check::of(snap, &classified);
        if self.failed {
            let mut hosts = Vec::new();
            let mut left_out = Vec::new();
            for h in classified.iter().filter(|s| s.state == HostState::Failed) {
                match check.refuses(&h.host).filter(|_| !self.force) {
                    Some(why) => left_out.push(format!("{why} (--force retries it all the same)")),
                    None => hosts.push(h.host.clone()),
                }
            }
            return Ok((hosts, left_out));
        }
        let named = crate::hosts_arg::hosts_named(&self.hosts, &self.hosts_flag)?;
        let hosts = resolve_targets(&Targets::Hosts(named), snap).map_err(|e| {
            Failure::usage(format!(
                "{}; nothing was written",
                e.join("; ").replace("--hosts ", "")
            ))
        })?;
        let refused: Vec<String> = hosts.iter().filter_map(|h| check.refuses(h)).collect();
        if !refused.is_empty() && !self.force {
            return Err(Failure::usage(format!(
                "{}: nothing was written (--force retries all the same)",
                refused.join("; ")
            )));
        }
        Ok((hosts, vec![]))
    }
}

/// Why no host may be retried now: an emergency stop, or a paused rollout.
fn fleet_refuses(snap: &Snapshot) -> Option<String> {
    if let Some((by, _)) = &snap.halt {
        return Some(format!(
            "an emergency stop is in force ({} ran global-disable-puppet; `jioctl upgrade VERSION` starts a new rollout)",
            crate::writes::describe(&Some(by.clone()))
        ));
    }
    let r = snap.rollout.as_ref()?.ok()?;
    matches!(r.state, jio_common::rollout::RolloutState::Paused { .. }).then(|| {
        format!(
            "rollout {} is paused (`jioctl rollout resume` goes on, and the plan retries nothing while paused)",
            r.id
        )
    })
}

/// What keeps one host from being retried, besides the fleet.
struct Check<'a> {
    snap: &'a Snapshot,
    classified: &'a [fleet::HostStatus],
    group_of: std::collections::BTreeMap<jio_common::names::Role, String>,
    resolved: Option<jio_common::rules::Resolved>,
    now: u64,
}

impl<'a> Check<'a> {
    fn of(snap: &'a Snapshot, classified: &'a [fleet::HostStatus]) -> Check<'a> {
        let (group_of, resolved) = crate::status::groups(snap, classified);
        Check {
            snap,
            classified,
            group_of,
            resolved,
            now: jio_common::time::unix_now(),
        }
    }

    /// Why `h` is not retried (`None`: it may be): it has not failed, its
    /// maintenance hook failed (a run would go undrained), it is held, or its
    /// group's maintenance window is closed.
    fn refuses(&self, h: &HostName) -> Option<String> {
        let status = self.classified.iter().find(|s| &s.host == h)?;
        if status.state != HostState::Failed {
            return Some(format!("{h} ({}) has not failed", status.state.as_str()));
        }
        if let Some(rec) = self.snap.hook_failure(h) {
            return Some(format!(
                "{h}: its {}; fix the host and start a new rollout (`jioctl upgrade VERSION` runs the hooks again; a retry would run without them)",
                rec.describe()
            ));
        }
        if let Some((t, rec)) = self.snap.hold_of(h, &status.role) {
            let by = rec.map(|r| format!(" by {}", r.by)).unwrap_or_default();
            return Some(format!("{h} is held ({t}{by}; `jioctl release` first)"));
        }
        let group = self.group_of.get(&status.role)?;
        let windows: Vec<&jio_common::window::Window> = self
            .resolved
            .as_ref()
            .and_then(|r| r.windows.get(group))
            .map(|w| w.iter().collect())
            .unwrap_or_default();
        let active = self
            .snap
            .rollout
            .as_ref()
            .and_then(|c| c.ok())
            .is_some_and(|r| r.state.active());
        match jio_common::window::state(&windows, self.now) {
            jio_common::window::WindowState::Closed { opens_at } if active => Some(format!(
                "{h}: the maintenance window of group {group} is closed{}",
                opens_at
                    .map(|t| format!(" (opens at {})", jio_common::plan::when(t)))
                    .unwrap_or_default()
            )),
            _ => None,
        }
    }
}

/// Sets every host's key to true, in chunks each fenced on the epoch the decision
/// was made at (then on its own bump: any prefix is a safe retry of fewer hosts).
/// `None`: the first chunk lost to another write; decide again. `Some`: each
/// host with the revision its chunk committed at, and the last epoch written.
async fn enable(
    ctx: &Context,
    store: &DynStore,
    hosts: &[HostName],
    epoch: Revision,
) -> Result<Option<Written>, Failure> {
    let key = ctx.schema().lock(fleet::EPOCH);
    let size = store.max_txn_ops().saturating_sub(2).max(1);
    let mut written = Written {
        at: Vec::new(),
        epoch,
    };
    for (i, chunk) in hosts.chunks(size).enumerate() {
        let mut txn = Txn::new().when(Compare::ModRevision(key.clone(), written.epoch));
        txn.ops = chunk
            .iter()
            .map(|h| writes::enable_host(ctx.schema(), h))
            .collect();
        txn.ops.push(writes::epoch_put(ctx.schema()));
        match store.txn(txn).await.context("writing the enable keys")? {
            TxnOutcome::Committed(r) => {
                written.epoch = r;
                written.at.extend(chunk.iter().map(|h| (h.clone(), r)));
            }
            TxnOutcome::Lost(_) if i == 0 => return Ok(None),
            TxnOutcome::Lost(_) => {
                return Err(Failure::new(
                    crate::exit::FAILED,
                    format!(
                        "retried the first {} host(s) only: the fleet changed before the rest was written; run the same command again",
                        i * size
                    ),
                ));
            }
        }
    }
    Ok(Some(written))
}

/// What `enable` wrote: each host and its chunk's revision, and the epoch after.
struct Written {
    at: Vec<(HostName, Revision)>,
    epoch: Revision,
}

/// A key already `true` whose write the store skipped (Consul: its revision is
/// older than its chunk's) is said again, false then true, so that its agent sees
/// it move; each rewrite fenced on the epoch the last one left.
async fn rewrite(ctx: &Context, store: &DynStore, written: &Written) -> Outcome {
    let mut epoch = written.epoch;
    for (h, at) in &written.at {
        let key = ctx.schema().enable(&EnableLevel::Host(h.clone()));
        if let Some(kv) = store.get(&key).await.context("reading the enable key back")?
            && kv.mod_revision < *at
        {
            epoch = super::enable_puppet::rewrite_true(ctx, store, &key, kv.mod_revision, epoch).await?;
        }
    }
    Ok(())
}

fn say_done(ctx: &Context, snap: &Snapshot, hosts: &[HostName]) {
    let version = snap
        .current
        .as_ref()
        .map_or("the current version".into(), ToString::to_string);
    crate::say!(
        "retrying {}: each host's enable key is set to true and its agent runs {version} again now (`jioctl status` follows them)",
        crate::render::names_fit(hosts.iter().map(ToString::to_string), 6)
    );
    if ctx.json {
        println!(
            "{}",
            crate::out::document(serde_json::json!({
                "retried": hosts,
                "version": snap.current,
            }))
        );
    }
}
