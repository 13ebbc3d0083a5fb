//! `jioctl forget-host HOST [--force]`: a decommissioned host leaves the store.
//! Every key that names it goes in one transaction: `/hosts/<host>` (and its service
//! catalog), `/active_roles/*/<host>/*`, `/running/versions/*/<host>`, its
//! `/status/` entries, its enable key, last result, run marker, hold and fleet
//! command inbox. Refused while its agent is alive (its `/agents/<host>` lease
//! holds), unless `--force`; refused while anything of ours runs there (its run
//! marker, or its agent says it runs), even with `--force`: a host in flight holds
//! its slot, and forgetting it would free the slot for another host. The
//! transaction checks that none of this changed since it was read.

use clap::Args;
use jio_common::keys::{EnableLevel, HoldTarget, Key, Parsed};
use jio_common::names::HostName;
use jio_common::store::{Compare, KeyValue, Op, Txn, TxnOutcome};
use jio_common::values::{AgentRecord, parse_json};
use serde_json::json;

use crate::context::{Access, Context};
use crate::exit::{self, Failure, Outcome};
use crate::writes;

#[derive(Args, Debug)]
pub struct ForgetHost {
    /// The decommissioned host
    host: HostName,
    /// Forget it even while its agent is alive (it registers again at its next start)
    #[arg(long)]
    force: bool,
}

impl ForgetHost {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let h = &self.host;
        let schema = ctx.schema();
        let store = ctx.open(Access::Write).await?;
        let (agent, marker, hook) = match &store
            .get_many(&[schema.agent(h), schema.run(h), schema.hook(h)])
            .await?[..]
        {
            [a, m, k] => (a.clone(), m.clone(), k.clone()),
            _ => (None, None, None),
        };
        refuse_if_busy(schema, h, agent.as_ref(), marker.as_ref(), self.force)?;
        refuse_if_hooked(h, hook.as_ref())?;
        let keys = keys_naming(&store, schema, h).await?;
        if keys.is_empty() {
            return Err(Failure::new(
                exit::FAILED,
                format!("the store knows nothing of {h}: nothing to forget"),
            ));
        }
        match store
            .txn(forget_txn(schema, h, agent.as_ref(), hook.as_ref(), &keys))
            .await?
        {
            TxnOutcome::Committed(_) => {}
            TxnOutcome::Lost(_) => {
                return Err(Failure::new(
                    exit::FAILED,
                    format!(
                        "{h}'s agent record or run marker changed while its keys were being read (an agent started, a run started, or the agent refreshed its record): nothing was written; run it again"
                    ),
                ));
            }
        }
        say_forgotten(ctx, h, &keys, agent.is_some());
        Ok(())
    }
}

/// Refuses a host in flight (even with `--force`), and one whose agent is alive
/// (unless `force`).
fn refuse_if_busy(
    schema: &jio_common::keys::Schema,
    h: &HostName,
    agent: Option<&KeyValue>,
    marker: Option<&KeyValue>,
    force: bool,
) -> Result<(), Failure> {
    if let Some(why) = in_flight(agent, marker) {
        return Err(Failure::new(
            exit::FAILED,
            format!(
                "{h} is in flight ({why}): forgetting it would free its slot for another host while it runs; nothing was written. Let its run end (`jioctl status {h}`), or stop its agent and delete its run marker {} once nothing runs there, then forget it",
                schema.run(h)
            ),
        ));
    }
    if agent.is_some() && !force {
        return Err(Failure::usage(format!(
            "{h}'s agent is alive ({} exists): stop it first, or give --force (it registers again at its next start); nothing was written",
            schema.agent(h)
        )));
    }
    Ok(())
}

/// Refuses a host whose maintenance hook runs (or may: its record cannot be read)
/// on a driver: forgetting its record would free its slot while the hook runs.
fn refuse_if_hooked(h: &HostName, hook: Option<&KeyValue>) -> Result<(), Failure> {
    let Some(kv) = hook else { return Ok(()) };
    let why = match jio_common::values::parse_json::<jio_common::hook_record::HookRecord>(kv) {
        Ok(r) if r.state == jio_common::hook_record::HookState::Running => r.describe(),
        Ok(_) => return Ok(()),
        Err(e) => e.to_string(),
    };
    Err(Failure::new(
        exit::FAILED,
        format!(
            "{h} is in its maintenance hook's slot ({why}): forgetting it would free its slot while its hook runs; nothing was written. Let the hook end (`jioctl explain {h}`), or delete {} once nothing runs",
            kv.key
        ),
    ))
}

/// Every key that names the host: listed where they can be many, read where
/// there is one.
async fn keys_naming(
    store: &jio_common::store::DynStore,
    schema: &jio_common::keys::Schema,
    h: &HostName,
) -> Result<Vec<Key>, Failure> {
    let mut keys: Vec<Key> = Vec::new();
    for prefix in [
        schema.hosts(),
        schema.active_roles(),
        schema.running_versions(),
        schema.status_root(),
    ] {
        for kv in store.list(&prefix).await?.kvs {
            if names_host(schema, &kv.key, h) {
                keys.push(kv.key);
            }
        }
    }
    let single = [
        schema.enable(&EnableLevel::Host(h.clone())),
        schema.result(h),
        schema.run(h),
        schema.hold(&HoldTarget::Host(h.clone())),
        schema.command_inbox(h),
        schema.clock(h),
        schema.hook(h),
    ];
    for (k, kv) in single.iter().zip(store.get_many(&single).await?) {
        if kv.is_some() {
            keys.push(k.clone());
        }
    }
    Ok(keys)
}

/// Whether `key` (under one of the listed prefixes) is one of host `h`'s.
fn names_host(schema: &jio_common::keys::Schema, key: &Key, h: &HostName) -> bool {
    match schema.parse(key) {
        Some(
            Parsed::Host(x)
            | Parsed::Catalog(x)
            | Parsed::ActiveRole(_, x, _)
            | Parsed::RunningVersion(_, x)
            | Parsed::Status(_, _, _, x)
            | Parsed::Provisioned(_, x)
            | Parsed::StepStatus(_, _, _, _, x),
        ) => &x == h,
        _ => false,
    }
}

/// The deletion of `keys` with the epoch's bump. An agent that starts meanwhile
/// would register again, one that starts a run (or a driver a hook) would hold a
/// slot: then it fails.
fn forget_txn(
    schema: &jio_common::keys::Schema,
    h: &HostName,
    agent: Option<&KeyValue>,
    hook: Option<&KeyValue>,
    keys: &[Key],
) -> Txn {
    let as_read = |key: Key, kv: Option<&KeyValue>| match kv {
        None => Compare::Absent(key),
        Some(kv) => Compare::ModRevision(key, kv.mod_revision),
    };
    let mut txn = Txn::new().when(Compare::Absent(schema.run(h)));
    txn = txn.when(as_read(schema.agent(h), agent));
    // A driver that starts a hook meanwhile: the host is in flight again.
    txn = txn.when(as_read(schema.hook(h), hook));
    txn.ops = keys.iter().cloned().map(Op::Delete).collect();
    txn.ops.push(writes::epoch_put(schema));
    txn
}

/// Says what was forgotten (each key when verbose; a JSON document when asked).
fn say_forgotten(ctx: &Context, h: &HostName, keys: &[Key], agent_was_alive: bool) {
    crate::say!("forgot {h}: {} key(s) deleted", keys.len());
    if ctx.verbose > 0 {
        for k in keys {
            crate::say!("  {k}");
        }
    }
    if ctx.json {
        println!(
            "{}",
            crate::out::document(json!({
                "host": h,
                "deleted": keys.iter().map(Key::as_str).collect::<Vec<_>>(),
                "agent_was_alive": agent_was_alive,
            }))
        );
    }
}

/// Why the host is in flight, from its agent's record and its run marker as read.
/// A record or marker that cannot be read counts as running (the safe reading).
fn in_flight(agent: Option<&KeyValue>, marker: Option<&KeyValue>) -> Option<String> {
    if let Some(m) = marker {
        return Some(match parse_json::<AgentRecord>(m) {
            Ok(r) => format!(
                "its run marker {} says a run of {} started and never ended",
                m.key,
                r.version.as_ref().map_or("no version", |v| v.as_str())
            ),
            Err(e) => format!("its run marker cannot be read: {e}"),
        });
    }
    let a = agent?;
    match parse_json::<AgentRecord>(a) {
        Ok(r) if r.state.running() => Some(format!(
            "its agent ({}, pid {}) is {} {}",
            a.key,
            r.pid,
            r.state.as_str(),
            r.version.as_ref().map_or("-", |v| v.as_str())
        )),
        Ok(_) => None,
        Err(e) => Some(format!("its agent's record cannot be read: {e}")),
    }
}
