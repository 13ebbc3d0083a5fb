//! `jioctl verify-hosts V [HOST... | --hosts H,…] [--same-packages]`: exit 0 only when every named
//! host (arguments, or stdin) runs V (and, with `--same-packages`, every role among
//! them has one installed package set at V); the others are printed.

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
    /// The hosts to check, as run and reboot name them (the same as the arguments;
    /// repeat it, or give a comma-separated list)
    #[arg(long = "hosts", value_name = "HOSTS", value_delimiter = ',')]
    hosts_flag: Vec<HostName>,
    /// Also require the same installed package set on every host of a role (each
    /// must have recorded one at VERSION)
    #[arg(long)]
    same_packages: bool,
}

/// What `--same-packages` found: hosts with no set recorded at the version, the
/// roles with more than one set, and each problem as a line.
struct SamePackages {
    unrecorded: Vec<HostName>,
    drift: crate::drift::Drift,
    problems: Vec<String>,
}

async fn same_packages(
    ctx: &Context,
    store: &jio_common::store::DynStore,
    v: &Version,
    wanted: &BTreeSet<HostName>,
) -> Result<SamePackages, Failure> {
    let snap = ctx.snapshot(store).await?;
    let unrecorded: Vec<HostName> = wanted
        .iter()
        .filter(|h| {
            !snap
                .results
                .get(*h)
                .is_some_and(|r| r.ok && &r.version == v && r.packages.is_some())
        })
        .cloned()
        .collect();
    let mut drift = crate::drift::Drift::load_of(store, ctx.schema(), &snap, |h| wanted.contains(h)).await;
    drift.roles.retain(|r| &r.version == v);
    let mut problems: Vec<String> = unrecorded
        .iter()
        .map(|h| {
            format!(
                "{h} has no installed package set recorded at {v} (no successful run at {v} recorded one)"
            )
        })
        .collect();
    problems.extend(drift.lines());
    Ok(SamePackages {
        unrecorded,
        drift,
        problems,
    })
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
        let named = crate::hosts_arg::hosts_named(&self.hosts, &self.hosts_flag)?;
        let wanted: BTreeSet<HostName> = if named.is_empty() {
            from_stdin()?.into_iter().collect()
        } else {
            named.into_iter().collect()
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
        let packages = if self.same_packages {
            Some(same_packages(ctx, &store, v, &wanted).await?)
        } else {
            None
        };
        let ok = missing.is_empty() && packages.as_ref().is_none_or(|p| p.problems.is_empty());
        if ctx.json {
            let mut doc =
                json!({"version": v, "all_at_version": missing.is_empty(), "not_at_version": missing});
            if let Some(p) = &packages {
                doc["same_packages"] = json!(p.problems.is_empty());
                doc["without_package_set"] = json!(p.unrecorded);
                doc["package_drift"] = p.drift.json();
            }
            println!("{doc}");
        } else {
            println!("{ok}");
            for h in &missing {
                eprintln!("{h} is not at {v}");
            }
            for line in packages.iter().flat_map(|p| &p.problems) {
                eprintln!("{line}");
            }
        }
        if ok {
            Ok(())
        } else {
            Err(Failure::quiet(exit::FAILED))
        }
    }
}
