//! `jioctl forget-host HOST [--force]`: a decommissioned host leaves the store.
//! Every key that names it goes in one transaction: `/hosts/<host>` (and its service
//! catalog), `/active_roles/*/<host>/*`, `/running/versions/*/<host>`, its
//! `/status/` entries, its enable key, last result, run marker, hold and fleet
//! command inbox. Refused while its agent is alive (its `/agents/<host>` lease
//! holds), unless `--force`: the transaction checks that the lease is still gone.

use clap::Args;
use jio_common::keys::{EnableLevel, HoldTarget, Key, Parsed};
use jio_common::names::HostName;
use jio_common::store::{Compare, Op, Txn, TxnOutcome};
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
        let agent = store.get(&schema.agent(h)).await?;
        if agent.is_some() && !self.force {
            return Err(Failure::usage(format!(
                "{h}'s agent is alive ({} exists): stop it first, or give --force (it registers again at its next start); nothing was written",
                schema.agent(h)
            )));
        }
        // Every key that names the host: listed where they can be many, read where
        // there is one.
        let mut keys: Vec<Key> = Vec::new();
        for prefix in [
            schema.hosts(),
            schema.active_roles(),
            schema.running_versions(),
            schema.status_root(),
        ] {
            for kv in store.list(&prefix).await?.kvs {
                let mine = match schema.parse(&kv.key) {
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
                };
                if mine {
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
        ];
        for (k, kv) in single.iter().zip(store.get_many(&single).await?) {
            if kv.is_some() {
                keys.push(k.clone());
            }
        }
        if keys.is_empty() {
            return Err(Failure::new(
                exit::FAILED,
                format!("the store knows nothing of {h}: nothing to forget"),
            ));
        }
        let mut txn = Txn::new();
        if agent.is_none() {
            // An agent that starts meanwhile would register again: then refuse.
            txn = txn.when(Compare::Absent(schema.agent(h)));
        }
        txn.ops = keys.iter().cloned().map(Op::Delete).collect();
        txn.ops.push(writes::epoch_put(schema));
        match store.txn(txn).await? {
            TxnOutcome::Committed(_) => {}
            TxnOutcome::Lost(_) => {
                return Err(Failure::new(
                    exit::FAILED,
                    format!(
                        "{h}'s agent started while its keys were being read: nothing was written; run it again once the agent is stopped"
                    ),
                ));
            }
        }
        crate::say!("forgot {h}: {} key(s) deleted", keys.len());
        if ctx.verbose > 0 {
            for k in &keys {
                crate::say!("  {k}");
            }
        }
        if ctx.json {
            println!(
                "{}",
                crate::out::document(json!({
                    "host": h,
                    "deleted": keys.iter().map(Key::as_str).collect::<Vec<_>>(),
                    "agent_was_alive": agent.is_some(),
                }))
            );
        }
        Ok(())
    }
}
