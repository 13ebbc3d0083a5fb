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
            let hosts = self.decide(&snap)?;
            if hosts.is_empty() {
                crate::say!("no host has failed the current version: nothing to retry");
                return Ok(());
            }
            if let Some(written) = enable(ctx, &store, &hosts, snap.epoch).await? {
                say_done(ctx, &snap, &hosts);
                return rewrite(ctx, &store, &hosts, written).await;
            }
        }
        Err(Failure::new(
            crate::exit::FAILED,
            format!(
                "the fleet changed under every one of {ATTEMPTS} tries (a driver writing); nothing was written: try again"
            ),
        ))
    }

    /// The hosts to re-enable, or why none is (nothing written).
    fn decide(&self, snap: &Snapshot) -> Result<Vec<HostName>, Failure> {
        if let Some((by, _)) = &snap.halt
            && !self.force
        {
            return Err(Failure::usage(format!(
                "an emergency stop is in force ({} ran global-disable-puppet): nothing was written; `jioctl upgrade VERSION` starts a new rollout, or --force retries all the same",
                crate::writes::describe(&Some(by.clone()))
            )));
        }
        let classified = fleet::classify(snap);
        let failed = |h: &HostName| {
            classified
                .iter()
                .any(|s| &s.host == h && s.state == HostState::Failed)
        };
        if self.failed {
            return Ok(classified
                .iter()
                .filter(|s| s.state == HostState::Failed)
                .map(|s| s.host.clone())
                .collect());
        }
        let named = super::hosts_named(&self.hosts, &self.hosts_flag)?;
        let hosts = resolve_targets(&Targets::Hosts(named), snap)
            .map_err(|e| Failure::usage(format!("{}; nothing was written", e.join("; "))))?;
        let not_failed: Vec<String> = hosts
            .iter()
            .filter(|h| !failed(h))
            .map(|h| not_failed_text(&classified, h))
            .collect();
        if !not_failed.is_empty() && !self.force {
            return Err(Failure::usage(format!(
                "{} not failed: nothing was written (--force runs it again all the same)",
                not_failed.join(", ")
            )));
        }
        Ok(hosts)
    }
}

/// `compute2 (upgraded)`: a host named that has not failed, and where it stands.
fn not_failed_text(classified: &[fleet::HostStatus], h: &HostName) -> String {
    let state = classified
        .iter()
        .find(|s| &s.host == h)
        .map_or("unknown", |s| s.state.as_str());
    format!("{h} ({state}) has")
}

/// Sets every host's key to true, in chunks each fenced on the epoch the decision
/// was made at (then on its own bump: any prefix is a safe retry of fewer hosts).
/// `None`: the first chunk lost to another write; decide again.
async fn enable(
    ctx: &Context,
    store: &DynStore,
    hosts: &[HostName],
    epoch: Revision,
) -> Result<Option<Revision>, Failure> {
    let key = ctx.schema().lock(fleet::EPOCH);
    let size = store.max_txn_ops().saturating_sub(2).max(1);
    let mut expect = epoch;
    for (i, chunk) in hosts.chunks(size).enumerate() {
        let mut txn = Txn::new().when(Compare::ModRevision(key.clone(), expect));
        txn.ops = chunk
            .iter()
            .map(|h| writes::enable_host(ctx.schema(), h))
            .collect();
        txn.ops.push(writes::epoch_put(ctx.schema()));
        match store.txn(txn).await.context("writing the enable keys")? {
            TxnOutcome::Committed(r) => expect = r,
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
    Ok(Some(expect))
}

/// A key already `true` whose write the store skipped (Consul) is said again, so
/// that its agent sees it move.
async fn rewrite(ctx: &Context, store: &DynStore, hosts: &[HostName], written: Revision) -> Outcome {
    for h in hosts {
        let key = ctx.schema().enable(&EnableLevel::Host(h.clone()));
        if let Some(kv) = store.get(&key).await.context("reading the enable key back")?
            && kv.mod_revision < written
        {
            super::enable_puppet::rewrite_true(ctx, store, &key, kv.mod_revision, written).await?;
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
