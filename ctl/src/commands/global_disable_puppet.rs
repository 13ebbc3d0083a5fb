//! `jioctl global-disable-puppet`: the emergency stop, and what it stopped.

use clap::Args;
use jio_common::fleet::{self, LockRecord};

use crate::context::{Access, Context};
use crate::exit::Outcome;
use crate::writes;

#[derive(Args, Debug)]
pub struct GlobalDisablePuppet {}

impl GlobalDisablePuppet {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let store = ctx.open(Access::Write).await?;
        let schema = ctx.schema();
        let lock = store.get(&schema.lock(fleet::ROLLOUT_LOCK)).await?;
        writes::write(&store, schema, writes::emergency_stop_ops(schema)).await?;
        println!("puppet disabled globally; every enable_puppet key removed");
        if let Some(kv) = lock {
            let who: Option<LockRecord> = jio_common::values::parse_json(&kv).ok();
            println!(
                "a rollout driven by {} was running: it has been halted (it enables nothing more and exits); hosts already running finish their run",
                writes::describe(&who)
            );
        }
        Ok(())
    }
}
