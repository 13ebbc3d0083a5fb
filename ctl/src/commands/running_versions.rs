//! `jioctl running-versions`: the versions hosts run, with counts.

use clap::Args;
use serde_json::json;

use crate::context::{Access, Context};
use crate::exit::Outcome;

#[derive(Args, Debug)]
pub struct RunningVersions {}

impl RunningVersions {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let store = ctx.open(Access::Read).await?;
        let snap = ctx.snapshot_warned(&store).await?;
        let v = super::lookup::versions(&snap);
        if ctx.json {
            println!("{}", json!(v));
        } else {
            for (version, hosts) in &v {
                println!("{version}\t{} host(s)", hosts.len());
            }
        }
        Ok(())
    }
}
