//! `jioctl check-single-version V`: exit 0 when V is the only version any host runs.

use std::collections::BTreeMap;

use clap::Args;
use jio_common::names::{HostName, Version};
use serde_json::json;

use crate::context::{Access, Context};
use crate::exit::{self, Failure, Outcome};

#[derive(Args, Debug)]
pub struct CheckSingleVersion {
    /// The version every host of the fleet must run
    version: Version,
}

impl CheckSingleVersion {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let v = &self.version;
        let store = ctx.open(Access::Read).await?;
        let snap = ctx.snapshot_warned(&store).await?;
        let others: BTreeMap<Version, Vec<HostName>> = super::lookup::versions(&snap)
            .into_iter()
            .filter(|(x, _)| x != v)
            .collect();
        if ctx.json {
            println!(
                "{}",
                json!({"version": v, "single": others.is_empty(), "other_versions": others})
            );
        } else if others.is_empty() {
            println!("true");
        } else {
            println!("false");
            for (x, hosts) in &others {
                eprintln!("{} host(s) at {x}", hosts.len());
            }
        }
        if others.is_empty() {
            Ok(())
        } else {
            Err(Failure::quiet(exit::FAILED))
        }
    }
}
