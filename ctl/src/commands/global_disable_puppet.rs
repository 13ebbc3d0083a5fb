//! `jioctl global-disable-puppet`: the emergency stop, and what it stopped. In one
//! transaction: every enable key reset, the halt record, and the active rollout
//! ended (`aborted`, by the emergency stop).

use clap::Args;
use jio_common::fleet::LockRecord;
use jio_common::store::TxnOutcome;

use crate::context::{Access, Context};
use crate::exit::{self, Failure, Outcome};
use crate::{rollouts, writes};

#[derive(Args, Debug)]
pub struct GlobalDisablePuppet {}

impl GlobalDisablePuppet {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let store = ctx.open(Access::Write).await?;
        let schema = ctx.schema();
        let by = rollouts::by();
        for _ in 0..20 {
            let snap = ctx.snapshot(&store).await?;
            let (compares, end, ended) =
                rollouts::emergency_ops(schema, &snap, &by, jio_common::time::unix_now());
            let mut txn = jio_common::store::Txn::new();
            txn.compares = compares;
            txn.ops = writes::emergency_stop_ops(schema);
            txn.ops.extend(end);
            // Every active fleet command ends too, fenced on its record as read.
            let commands = crate::fleet_commands::abort_all_ops(&store, schema, &by).await?;
            let aborted: Vec<String> = commands.iter().map(|(id, _, _)| id.to_string()).collect();
            for (_, c, op) in commands {
                txn.compares.push(c);
                txn.ops.push(op);
            }
            txn.ops.push(writes::epoch_put(schema));
            if !matches!(store.txn(txn).await?, TxnOutcome::Committed(_)) {
                continue; // the rollout changed under it: read again
            }
            crate::say!("puppet disabled globally; every enable_puppet key removed");
            if !aborted.is_empty() {
                crate::say!(
                    "fleet command{} {} ended (aborted by the emergency stop); no host starts one any more, hosts running one finish it",
                    if aborted.len() == 1 { "" } else { "s" },
                    aborted.join(", ")
                );
            }
            if ctx.json {
                println!(
                    "{}",
                    crate::out::document(serde_json::json!({
                        "emergency_stop": true,
                        "halted_rollout": ended.as_ref().map(|r| r.id.to_string()),
                        "halted_driver": snap.lock.as_ref().map(|_| writes::describe(&snap.lock)),
                        "aborted_commands": aborted,
                    }))
                );
            }
            let who: Option<LockRecord> = snap.lock.clone();
            match (ended, &snap.lock) {
                (Some(r), _) => crate::say!(
                    "rollout {} to {}{} was running: it has been halted (recorded aborted by the emergency stop; nothing more is enabled); hosts already running finish their run",
                    r.id,
                    r.version,
                    who.as_ref()
                        .map(|_| format!(", driven by {}", writes::describe(&who)))
                        .unwrap_or_default()
                ),
                (None, Some(_)) => crate::say!(
                    "a rollout driven by {} was running: it has been halted; hosts already running finish their run",
                    writes::describe(&who)
                ),
                (None, None) => {}
            }
            return Ok(());
        }
        Err(Failure::new(
            exit::SOFTWARE,
            "the rollout records kept changing; the emergency stop was not written: run it again",
        ))
    }
}
