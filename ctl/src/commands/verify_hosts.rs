//! `jioctl verify-hosts V [HOST...]`: exit 0 only when every named host (arguments,
//! or stdin) runs V; the others are printed.

use std::collections::BTreeSet;
use std::io::BufRead as _;

use clap::Args;
use jio_common::names::{HostName, Version};
use serde_json::json;

use crate::context::{Access, Context};
use crate::exit::{self, Failure, Outcome};

#[derive(Args, Debug)]
pub struct VerifyHosts {
    /// The version every host must run
    version: Version,
    /// The hosts to check (none: read from stdin, whitespace-separated)
    hosts: Vec<HostName>,
}

/// Host names from stdin, whitespace-separated, each validated.
fn from_stdin() -> Result<Vec<HostName>, Failure> {
    let mut out = Vec::new();
    for line in std::io::stdin().lock().lines() {
        for name in line?.split_whitespace() {
            out.push(HostName::new(name).map_err(Failure::usage)?);
        }
    }
    Ok(out)
}

impl VerifyHosts {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let v = &self.version;
        let wanted: BTreeSet<HostName> = if self.hosts.is_empty() {
            from_stdin()?.into_iter().collect()
        } else {
            self.hosts.iter().cloned().collect()
        };
        if wanted.is_empty() {
            // `verify-hosts V < list` with an empty list: nothing was verified.
            return Err(Failure::usage(
                "no hosts to verify: give them as arguments or on stdin (the list read was empty)",
            ));
        }
        let store = ctx.open(Access::Read).await?;
        let at: BTreeSet<HostName> = super::lookup::hosts_at(&store, ctx.schema(), v)
            .await?
            .into_iter()
            .collect();
        let missing: Vec<&HostName> = wanted.iter().filter(|h| !at.contains(*h)).collect();
        if ctx.json {
            println!(
                "{}",
                json!({"version": v, "all_at_version": missing.is_empty(), "not_at_version": missing})
            );
        } else if missing.is_empty() {
            println!("true");
        } else {
            println!("false");
            for h in &missing {
                eprintln!("{h} is not at {v}");
            }
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(Failure::quiet(exit::FAILED))
        }
    }
}
