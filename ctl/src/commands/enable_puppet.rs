//! `jioctl enable-puppet true|false (--global | --role R | --host H) [--force]`, or
//! `--delete`: set or delete one enable key (`true --global` refused like
//! `trigger-update` when it would release hosts at once).

use anyhow::Context as _;
use clap::Args;
use jio_common::command::resolve_targets;
use jio_common::command_record::Targets;
use jio_common::gate::KeyState;
use jio_common::keys::{EnableLevel, Key};
use jio_common::names::{HostName, Role};
use jio_common::store::{Compare, DynStore, Op, Revision, Txn, TxnOutcome};
use jio_common::values::format_bool;

use crate::context::{Access, Context};
use crate::exit::{Failure, Outcome};
use crate::release::release_checked;
use crate::writes;

#[derive(Args, Debug)]
pub struct EnablePuppet {
    /// true or false (not with --delete)
    #[arg(value_parser = true_or_false, action = clap::ArgAction::Set)]
    value: Option<bool>,
    /// The global key (`/config_state/enable_puppet`): every host without a host or role key
    #[arg(long, group = "level")]
    global: bool,
    /// The key of this role: its hosts without a host key
    #[arg(long, group = "level")]
    role: Option<Role>,
    /// The key of this host, which decides for it before its role's and the global key
    #[arg(long, group = "level")]
    host: Option<HostName>,
    /// Remove the key instead
    #[arg(long)]
    delete: bool,
    /// With `true --global`: write it even though it releases hosts at once; with
    /// `--host`/`--role`: write it for a host or role the fleet does not know (yet)
    #[arg(long)]
    force: bool,
}

fn true_or_false(s: &str) -> Result<bool, String> {
    match s {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err("expected true or false".into()),
    }
}

impl EnablePuppet {
    fn level(&self) -> Result<EnableLevel, Failure> {
        match (self.global, &self.role, &self.host) {
            (true, None, None) => Ok(EnableLevel::Global),
            (false, Some(r), None) => Ok(EnableLevel::Role(r.clone())),
            (false, None, Some(h)) => Ok(EnableLevel::Host(h.clone())),
            _ => Err(Failure::usage(
                "give exactly one of --global, --role ROLE, --host HOST",
            )),
        }
    }

    pub async fn run(self, ctx: &Context) -> Outcome {
        let level = self.level()?;
        let key = ctx.schema().enable(&level);
        let op = self.op(&key)?;
        let store = ctx.open(Access::Write).await?;
        if !self.delete && !self.force {
            refuse_unknown(ctx, &store, &level).await?;
        }
        if level == EnableLevel::Global && self.value == Some(true) {
            let what = "enable-puppet true --global";
            release_checked(
                ctx,
                &store,
                |_| vec![op.clone()],
                self.force,
                what,
                |s| {
                    s.global = KeyState::Set(true);
                },
            )
            .await?;
        } else {
            let written = writes::write(&store, ctx.schema(), vec![op])
                .await
                .context("writing the enable key")?;
            if self.value == Some(true)
                && let Some(kv) = store.get(&key).await.context("reading the enable key back")?
                && kv.mod_revision < written
            {
                rewrite_true(ctx, &store, &key, kv.mod_revision, written).await?;
            }
        }
        self.say_written(ctx, &key);
        Ok(())
    }

    /// The write this asks for: the key put or deleted.
    fn op(&self, key: &Key) -> Result<Op, Failure> {
        match (self.delete, self.value) {
            (true, None) => Ok(Op::Delete(key.clone())),
            (true, Some(_)) => Err(Failure::usage("--delete takes no value")),
            (false, Some(b)) => Ok(Op::put(key.clone(), format_bool(b))),
            (false, None) => Err(Failure::usage("give true or false, or --delete")),
        }
    }

    fn say_written(&self, ctx: &Context, key: &Key) {
        match self.value {
            Some(b) if !self.delete => crate::say!("{key} = {b}"),
            _ => crate::say!("{key} deleted"),
        }
        if ctx.json {
            println!(
                "{}",
                crate::out::document(serde_json::json!({
                    "key": key.as_str(),
                    "value": if self.delete { None } else { self.value },
                    "deleted": self.delete,
                }))
            );
        }
    }
}

/// A misspelt name would write a key no agent reads: refused, named.
async fn refuse_unknown(ctx: &Context, store: &DynStore, level: &EnableLevel) -> Outcome {
    let target = match level {
        EnableLevel::Global => None,
        EnableLevel::Role(r) => Some(Targets::Roles(vec![r.clone()])),
        EnableLevel::Host(h) => Some(Targets::Hosts(vec![h.clone()])),
    };
    if let Some(t) = target {
        let snap = ctx.snapshot(store).await?;
        if let Err(errors) = resolve_targets(&t, &snap) {
            return Err(Failure::usage(format!(
                "{}; nothing was written (--force writes it all the same, for a host that has not joined yet)",
                // Named by this command's own flag.
                errors.join("; ").replace("--hosts ", "--host ")
            )));
        }
    }
    Ok(())
}

/// Rewriting `true` is the operator's "retry now" for a failed host, which
/// its agent sees as the key's mod revision moving. Consul skips a write of
/// a key's current value, so the revision stays (`key_revision`, below the epoch
/// `written`): say it again in two steps (a moment of `false` holds nothing back
/// that was moving). Both writes are fenced on the plan epoch (every jioctl write
/// bumps it) and the first on the key: an emergency stop or any other write that
/// comes in between wins, and this says so.
pub(crate) async fn rewrite_true(
    ctx: &Context,
    store: &DynStore,
    key: &Key,
    key_revision: Revision,
    written: Revision,
) -> Result<Revision, Failure> {
    let epoch = ctx.schema().lock(jio_common::fleet::EPOCH);
    let mut expect = written;
    for b in [false, true] {
        let mut txn = Txn::new()
            .when(Compare::ModRevision(epoch.clone(), expect))
            .then(Op::put(key.clone(), format_bool(b)))
            .then(writes::epoch_put(ctx.schema()));
        if !b {
            txn = txn.when(Compare::ModRevision(key.clone(), key_revision));
        }
        match store.txn(txn).await.context("writing the enable key")? {
            TxnOutcome::Committed(r) => expect = r,
            TxnOutcome::Lost(_) => {
                let left = if b { "false" } else { "true, as it was" };
                return Err(Failure::new(
                    crate::exit::FAILED,
                    format!(
                        "{key} was rewritten as false then true so that a failed host's agent sees it (the store skips a write of the value a key holds), but another write came in between: the key is left {left}; check `jioctl status` and write it again if still wanted"
                    ),
                ));
            }
        }
    }
    Ok(expect)
}
