//! `jioctl hosts-at-version V`: the hosts at a version.

use clap::Args;
use jio_common::names::Version;
use serde_json::json;

use crate::context::{Access, Context};
use crate::exit::Outcome;

#[derive(Args, Debug)]
pub struct HostsAtVersion {
    /// The version whose hosts to list
    version: Version,
}

impl HostsAtVersion {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let store = ctx.open(Access::Read).await?;
        let hosts = super::lookup::hosts_at(&store, ctx.schema(), &self.version).await?;
        if ctx.json {
            println!("{}", json!(hosts));
        } else {
            for h in hosts {
                println!("{h}");
            }
        }
        Ok(())
    }
}
