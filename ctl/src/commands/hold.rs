//! `jioctl hold HOST... | --role R [--reason R]` and `jioctl release HOST... | --role R`:
//! keep hosts out of every rollout until released. A hold is a record under
//! `/holds/host/<host>` or `/holds/role/<role>`, written with the plan epoch and the
//! held hosts' enable keys set to false in one transaction, so a plan computed before
//! it cannot land after it, and a release does not start anything by itself. The planner never
//! admits a held host and the agent never starts an upgrade while held; a run
//! already going finishes.

use anyhow::Context as _;
use clap::Args;
use jio_common::fleet::{self, HostState};
use jio_common::gate::KeyState;
use jio_common::keys::{EnableLevel, HoldTarget};
use jio_common::names::{HostName, Role};
use jio_common::store::Op;
use jio_common::values::{HoldRecord, format_bool};

use crate::context::{Access, Context};
use crate::exit::{Failure, Outcome};
use crate::writes;

#[derive(Args, Debug)]
pub struct Hold {
    /// Hosts to hold
    #[arg(required_unless_present = "role", conflicts_with = "role")]
    hosts: Vec<HostName>,
    /// Hold every host of this role instead
    #[arg(long)]
    role: Option<Role>,
    /// Why (recorded and shown in status and explain)
    #[arg(long)]
    reason: Option<String>,
}

#[derive(Args, Debug)]
pub struct Release {
    /// Hosts to release
    #[arg(required_unless_present = "role", conflicts_with = "role")]
    hosts: Vec<HostName>,
    /// Release the hold on this role instead
    #[arg(long)]
    role: Option<Role>,
}

fn targets(hosts: &[HostName], role: &Option<Role>) -> Vec<HoldTarget> {
    match role {
        Some(r) => vec![HoldTarget::Role(r.clone())],
        None => {
            let mut t: Vec<HoldTarget> = hosts.iter().cloned().map(HoldTarget::Host).collect();
            t.dedup();
            t
        }
    }
}

/// The enable keys a hold sets to false: each held host's own key, and for a role
/// its role key and the keys of its hosts that are set to true.
fn disable_ops(
    schema: &jio_common::keys::Schema,
    snap: &jio_common::fleet::Snapshot,
    targets: &[HoldTarget],
) -> Vec<Op> {
    let off = |l: EnableLevel| Op::put(schema.enable(&l), format_bool(false));
    let mut ops = Vec::new();
    for t in targets {
        match t {
            HoldTarget::Host(h) => ops.push(off(EnableLevel::Host(h.clone()))),
            HoldTarget::Role(r) => {
                ops.push(off(EnableLevel::Role(r.clone())));
                for (h, k) in &snap.host_keys {
                    if k == &KeyState::Set(true) && &snap.role_of(h) == r {
                        ops.push(off(EnableLevel::Host(h.clone())));
                    }
                }
            }
        }
    }
    ops
}

fn name(t: &HoldTarget) -> String {
    match t {
        HoldTarget::Host(h) => h.to_string(),
        HoldTarget::Role(r) => format!("--role {r}"),
    }
}

impl Hold {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let targets = targets(&self.hosts, &self.role);
        let reason = self.reason.filter(|r| !r.trim().is_empty());
        let rec = HoldRecord {
            by: crate::rollouts::by(),
            reason: reason.clone(),
            at: jio_common::time::unix_now(),
        };
        let value = serde_json::to_string(&rec).map_err(anyhow::Error::from)?;
        let store = ctx.open(Access::Write).await?;
        let before = ctx.snapshot(&store).await?;
        let mut ops: Vec<Op> = targets
            .iter()
            .map(|t| Op::put(ctx.schema().hold(t), value.clone()))
            .collect();
        // Held hosts are disabled in the same transaction: a host enabled but not yet
        // started must not start on its release outside the plan (a key the planner
        // wrote after this read fails its fence on the epoch this moves, and a held
        // host still enabled keeps its slot until the planner disables it).
        ops.extend(disable_ops(ctx.schema(), &before, &targets));
        writes::write(&store, ctx.schema(), ops)
            .await
            .context("writing the hold")?;
        // What the hold means for hosts already moving.
        let snap = ctx.snapshot(&store).await?;
        let hosts = fleet::classify(&snap);
        let known = snap.hosts();
        for t in &targets {
            if let HoldTarget::Host(h) = t
                && !known.contains(h)
            {
                eprintln!(
                    "jioctl: warning: host {h} is not known in this fleet (no /hosts record, no running version): held anyway"
                );
            }
            let what = match t {
                HoldTarget::Host(h) => format!("host {h}"),
                HoldTarget::Role(r) => {
                    let n = hosts.iter().filter(|h| &h.role == r).count();
                    if n == 0 {
                        eprintln!("jioctl: warning: role {r} has no hosts in this fleet: held anyway");
                    }
                    format!("role {r} ({n} host(s))")
                }
            };
            crate::say!(
                "held {what}{}: kept out of every rollout until `jioctl release {}`",
                reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default(),
                name(t)
            );
        }
        let running: Vec<&str> = hosts
            .iter()
            .filter(|h| h.state == HostState::Upgrading && snap.hold_of(&h.host, &h.role).is_some())
            .map(|h| h.host.as_str())
            .collect();
        if !running.is_empty() {
            crate::say!("already in flight, finishing their run: {}", running.join(", "));
        }
        if ctx.json {
            println!(
                "{}",
                crate::out::document(serde_json::json!({
                    "held": targets.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
                    "reason": reason,
                    "in_flight": running,
                }))
            );
        }
        Ok(())
    }
}

impl Release {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let targets = targets(&self.hosts, &self.role);
        let store = ctx.open(Access::Write).await?;
        let snap = ctx.snapshot(&store).await?;
        let (held, not_held): (Vec<&HoldTarget>, Vec<&HoldTarget>) =
            targets.iter().partition(|t| snap.holds.contains_key(t));
        for t in &not_held {
            let role_hint = match t {
                HoldTarget::Host(h) => snap
                    .hold_of(h, &snap.role_of(h))
                    .filter(|(ht, _)| matches!(ht, HoldTarget::Role(_)))
                    .map(|(ht, _)| format!(" (it is held through its {ht}: `jioctl release {}`)", name(&ht)))
                    .unwrap_or_default(),
                HoldTarget::Role(_) => String::new(),
            };
            crate::say!("{t} was not held: nothing to release{role_hint}");
        }
        if held.is_empty() {
            if targets.len() == not_held.len() && !not_held.is_empty() {
                return Err(Failure::new(
                    crate::exit::FAILED,
                    "nothing was held: nothing was released",
                ));
            }
            return Ok(());
        }
        let ops = held.iter().map(|t| Op::Delete(ctx.schema().hold(t))).collect();
        writes::write(&store, ctx.schema(), ops)
            .await
            .context("deleting the hold")?;
        for t in &held {
            crate::say!("released {t}: the rollout admits it again under its rules");
        }
        if ctx.json {
            println!(
                "{}",
                crate::out::document(serde_json::json!({
                    "released": held.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
                    "not_held": not_held.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
                }))
            );
        }
        Ok(())
    }
}
