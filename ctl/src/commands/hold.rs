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
use jio_common::store::{Compare, Op, Txn, TxnOutcome};
use jio_common::suggest::closest;
use jio_common::values::{HoldRecord, format_bool};

use crate::context::{Access, Context};
use crate::exit::{Failure, Outcome};
use crate::writes;

#[derive(Args, Debug)]
pub struct Hold {
    /// Hosts to hold
    #[arg(required_unless_present_any = ["role", "hosts_flag"], conflicts_with = "role")]
    hosts: Vec<HostName>,
    /// Hosts to hold, as run and reboot name them (the same as the arguments; repeat
    /// it, or give a comma-separated list)
    #[arg(
        long = "hosts",
        value_name = "HOSTS",
        value_delimiter = ',',
        conflicts_with = "role"
    )]
    hosts_flag: Vec<HostName>,
    /// Hold every host of this role instead
    #[arg(long)]
    role: Option<Role>,
    /// Why (recorded and shown in status and explain)
    #[arg(long)]
    reason: Option<String>,
    /// Hold a host or role the fleet does not know (yet): a host that has not joined
    #[arg(long)]
    force: bool,
}

#[derive(Args, Debug)]
pub struct Release {
    /// Hosts to release
    #[arg(required_unless_present_any = ["role", "hosts_flag"], conflicts_with = "role")]
    hosts: Vec<HostName>,
    /// Hosts to release, as run and reboot name them (the same as the arguments;
    /// repeat it, or give a comma-separated list)
    #[arg(
        long = "hosts",
        value_name = "HOSTS",
        value_delimiter = ',',
        conflicts_with = "role"
    )]
    hosts_flag: Vec<HostName>,
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

/// What deleting an enable key would leave in force: the levels below it that now
/// decide (a host key: its role's and the global key; a role key: the global
/// key), and whether one of them that is set would then enable the host (a plan's
/// role key during a rollout, say). With none set, the host is back to the
/// default it had before the hold. `None`: not an enable key a hold writes.
fn without(
    snap: &jio_common::fleet::Snapshot,
    key: &jio_common::keys::Key,
    schema: &jio_common::keys::Schema,
) -> Option<(Vec<EnableLevel>, bool)> {
    use jio_common::gate::{GateKeys, decide};
    let role_state = |r: &Role| snap.role_keys.get(r).cloned().unwrap_or_default();
    match schema.parse(key)? {
        jio_common::keys::Parsed::Enable(EnableLevel::Host(h)) => {
            let role = snap.role_of(&h);
            let gate = decide(&GateKeys {
                host: KeyState::Unset,
                role: role_state(&role),
                global: snap.global.clone(),
            });
            Some((
                vec![EnableLevel::Role(role), EnableLevel::Global],
                gate.enabled && gate.level != jio_common::gate::Level::Default,
            ))
        }
        jio_common::keys::Parsed::Enable(EnableLevel::Role(_)) => {
            let gate = decide(&GateKeys {
                host: KeyState::Unset,
                role: KeyState::Unset,
                global: snap.global.clone(),
            });
            Some((
                vec![EnableLevel::Global],
                gate.enabled && gate.level != jio_common::gate::Level::Default,
            ))
        }
        _ => None,
    }
}

/// Targets the fleet does not know: a host with no record, version or agent, a
/// role no host has.
fn unknown_targets(snap: &jio_common::fleet::Snapshot, targets: &[HoldTarget]) -> Vec<String> {
    let known = snap.hosts();
    let roles: std::collections::BTreeSet<Role> = known.iter().map(|h| snap.role_of(h)).collect();
    targets
        .iter()
        .filter_map(|t| match t {
            HoldTarget::Host(h) if !known.contains(h) && !snap.agents.contains_key(h) => {
                let names: Vec<&str> = known.iter().map(|h| h.as_str()).collect();
                Some(format!(
                    "host {h} is not known in this fleet (no /hosts record, no running version, no live agent){}",
                    closest(h.as_str(), &names).map(|c| format!("; did you mean {c}?")).unwrap_or_default()
                ))
            }
            HoldTarget::Role(r) if !roles.contains(r) => {
                let names: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
                Some(format!(
                    "role {r} has no hosts in this fleet{} (roles: {})",
                    closest(r.as_str(), &names).map(|c| format!("; did you mean {c}?")).unwrap_or_default(),
                    names.join(", ")
                ))
            }
            _ => None,
        })
        .collect()
}

fn name(t: &HoldTarget) -> String {
    match t {
        HoldTarget::Host(h) => h.to_string(),
        HoldTarget::Role(r) => format!("--role {r}"),
    }
}

/// The hold's transaction on the fleet as read (`before`): each target's record
/// (with the enable keys it creates, and those of a hold it replaces) and the
/// enable keys it sets to false, fenced on the plan epoch, with the epoch bump.
fn hold_txn(
    schema: &jio_common::keys::Schema,
    before: &jio_common::fleet::Snapshot,
    targets: &[HoldTarget],
    reason: Option<&String>,
) -> Result<Txn, Failure> {
    let mut ops: Vec<Op> = Vec::new();
    for t in targets {
        // Held hosts are disabled in the same transaction: a host enabled but not
        // yet started must not start on its release outside the plan (a held host
        // still enabled keeps its slot until the planner disables it).
        let disable = disable_ops(schema, before, std::slice::from_ref(t));
        // A hold that replaces another keeps what the other created.
        let inherited = before
            .holds
            .get(t)
            .and_then(|r| r.as_ref())
            .map(|r| r.created_keys.clone())
            .unwrap_or_default();
        let mut created_keys: Vec<String> = disable
            .iter()
            .filter_map(|op| match op {
                Op::Put { key, .. } if !before.enable_revisions.keys().any(|l| &schema.enable(l) == key) => {
                    Some(key.to_string())
                }
                _ => None,
            })
            .chain(inherited)
            .collect();
        created_keys.sort();
        created_keys.dedup();
        let rec = HoldRecord {
            by: crate::rollouts::by(),
            reason: reason.cloned(),
            at: jio_common::time::unix_now(),
            created_keys,
        };
        let value = serde_json::to_string(&rec).map_err(anyhow::Error::from)?;
        ops.push(Op::put(schema.hold(t), value));
        ops.extend(disable);
    }
    ops.push(writes::epoch_put(schema));
    Ok(Txn {
        compares: vec![Compare::ModRevision(
            schema.lock(jio_common::fleet::EPOCH),
            before.epoch,
        )],
        ops,
    })
}

impl Hold {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let targets = targets(
            &crate::hosts_arg::hosts_named(&self.hosts, &self.hosts_flag)?,
            &self.role,
        );
        let reason = self.reason.filter(|r| !r.trim().is_empty());
        let store = ctx.open(Access::Write).await?;
        let before = ctx.snapshot(&store).await?;
        let unknown = unknown_targets(&before, &targets);
        if !unknown.is_empty() && !self.force {
            return Err(Failure::usage(format!(
                "{}; nothing was held (a misspelt name would leave the real one unprotected): check `jioctl status`, or give --force to hold a host that has not joined yet",
                unknown.join("; ")
            )));
        }
        let schema = ctx.schema();
        let mut before = before;
        let mut attempts = 0;
        // Fenced on the plan epoch as read: a plan written since (a key this hold
        // would then record as its own) makes it read again.
        while !matches!(
            store
                .txn(hold_txn(schema, &before, &targets, reason.as_ref())?)
                .await
                .context("writing the hold")?,
            TxnOutcome::Committed(_)
        ) {
            attempts += 1;
            if attempts >= 5 {
                return Err(Failure::new(
                    crate::exit::FAILED,
                    "plans kept writing enable keys while the hold was read (5 attempts); nothing was held: run it again",
                ));
            }
            before = ctx.snapshot(&store).await?;
        }
        // What the hold means for hosts already moving.
        let snap = ctx.snapshot(&store).await?;
        let hosts = fleet::classify(&snap);
        let known = snap.hosts();
        for t in &targets {
            say_held(t, &before, &known, &hosts, reason.as_ref());
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

/// What holding `t` did: a target the fleet does not know (held under
/// `--force`), the hold it replaced, and how many hosts it keeps out.
fn say_held(
    t: &HoldTarget,
    before: &jio_common::fleet::Snapshot,
    known: &std::collections::BTreeSet<HostName>,
    hosts: &[jio_common::fleet::HostStatus],
    reason: Option<&String>,
) {
    if let HoldTarget::Host(h) = t
        && !known.contains(h)
    {
        eprintln!(
            "jioctl: warning: --force: host {h} is not known in this fleet (no /hosts record, no running version): held all the same"
        );
    }
    if let Some(Some(old)) = before.holds.get(t) {
        crate::say!(
            "{t} was already held by {} since {}{}: this hold replaces it",
            old.by,
            jio_common::plan::when(old.at),
            old.reason
                .as_ref()
                .map(|r| format!(" ({r:?})"))
                .unwrap_or_default()
        );
    }
    let what = match t {
        HoldTarget::Host(h) => format!("host {h}"),
        HoldTarget::Role(r) => {
            let n = hosts.iter().filter(|h| &h.role == r).count();
            if n == 0 {
                eprintln!("jioctl: warning: --force: role {r} has no hosts in this fleet: held all the same");
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

/// The release's transaction (without the epoch bump): each hold deleted, fenced
/// on the hold as read now (a newer hold in its place is not released with this
/// one's keys), and the enable keys it created deleted where they still say false,
/// fenced on them and the keys below. Also the created keys kept false, because
/// deleting them would enable the host.
async fn release_txn(
    store: &jio_common::store::DynStore,
    schema: &jio_common::keys::Schema,
    snap: &jio_common::fleet::Snapshot,
    held: &[&HoldTarget],
) -> Result<(Txn, Vec<String>), Failure> {
    let mut txn = Txn::new();
    let mut kept: Vec<String> = Vec::new();
    for t in held {
        // The hold as read now: a newer hold in its place is not released
        // with this one's keys (the delete is fenced on it).
        let Some(hold_kv) = store.get(&schema.hold(t)).await? else {
            continue;
        };
        txn.compares
            .push(Compare::ModRevision(schema.hold(t), hold_kv.mod_revision));
        txn.ops.push(Op::Delete(schema.hold(t)));
        let created = jio_common::values::parse_json::<HoldRecord>(&hold_kv)
            .map(|r| r.created_keys)
            .unwrap_or_default();
        for k in created {
            let Ok(key) = jio_common::keys::Key::new(&k) else {
                continue;
            };
            let Some(kv) = store.get(&key).await? else {
                continue;
            };
            if kv.value.trim() != format_bool(false) {
                continue;
            }
            // Deleting it must not enable anything by itself (a role or the
            // global key that says true): then it stays false, and only a plan
            // or an operator enables the host.
            let Some((below, enables)) = without(snap, &key, schema) else {
                continue;
            };
            if enables {
                kept.push(k.clone());
                continue;
            }
            for level in below {
                let rev = snap.enable_revisions.get(&level).copied().unwrap_or(0);
                let c = Compare::ModRevision(schema.enable(&level), rev);
                if !txn.compares.contains(&c) {
                    txn.compares.push(c);
                }
            }
            txn.compares
                .push(Compare::ModRevision(key.clone(), kv.mod_revision));
            txn.ops.push(Op::Delete(key));
        }
    }
    Ok((txn, kept))
}

impl Release {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let targets = targets(
            &crate::hosts_arg::hosts_named(&self.hosts, &self.hosts_flag)?,
            &self.role,
        );
        let store = ctx.open(Access::Write).await?;
        let snap = ctx.snapshot(&store).await?;
        let (held, not_held): (Vec<&HoldTarget>, Vec<&HoldTarget>) =
            targets.iter().partition(|t| snap.holds.contains_key(t));
        let mut lines = Vec::new();
        for t in &not_held {
            let role_hint = match t {
                HoldTarget::Host(h) => snap
                    .hold_of(h, &snap.role_of(h))
                    .filter(|(ht, _)| matches!(ht, HoldTarget::Role(_)))
                    .map(|(ht, _)| format!(" (it is held through its {ht}: `jioctl release {}`)", name(&ht)))
                    .unwrap_or_default(),
                HoldTarget::Role(_) => String::new(),
            };
            lines.push(format!("{t} was not held: nothing to release{role_hint}"));
        }
        if held.is_empty() {
            // One line for one target, said once (as the error when nothing was held).
            if targets.len() == not_held.len() && !not_held.is_empty() {
                let why = if lines.len() == 1 {
                    lines.remove(0)
                } else {
                    format!("{}\nnothing was held: nothing was released", lines.join("\n"))
                };
                return Err(Failure::new(crate::exit::FAILED, why));
            }
            return Ok(());
        }
        for l in &lines {
            crate::say!("{l}");
        }
        let schema = ctx.schema();
        let (mut txn, kept) = release_txn(&store, schema, &snap, &held).await?;
        txn.ops.push(writes::epoch_put(schema));
        if let TxnOutcome::Lost(_) = store.txn(txn).await.context("deleting the hold")? {
            return Err(Failure::new(
                crate::exit::FAILED,
                "the hold, or an enable key it had set, changed while the release was read; nothing was released: run it again",
            ));
        }
        let active = snap
            .rollout
            .as_ref()
            .and_then(|c| c.ok())
            .is_some_and(|r| r.state.active());
        for t in &held {
            if active {
                crate::say!("released {t}: the rollout admits it again under its rules");
            } else {
                crate::say!("released {t}: no rollout is active; the next one admits it under its rules");
            }
        }
        for k in &kept {
            crate::say!(
                "kept {k} false, which the hold had set: without it a key below (the role's or the global key) would enable the host by itself; a rollout's plan or `jioctl enable-puppet` decides it"
            );
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
