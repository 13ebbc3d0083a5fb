//! `jioctl get-failures [--hosts]`: the failed hosts of the current version; exit 1
//! when there are any.

use std::collections::BTreeMap;

use clap::Args;
use jio_common::fleet::Snapshot;
use serde_json::json;

use crate::context::{Access, Context};
use crate::exit::{self, Failure, Outcome};
use crate::status::describe_entry;

#[derive(Args, Debug)]
pub struct GetFailures {
    /// One line per host, with the log link
    #[arg(long)]
    hosts: bool,
}

impl GetFailures {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let store = ctx.open(Access::Read).await?;
        let snap = ctx.snapshot_warned(&store).await?;
        // A composable rollout's failed steps count too, and failed maintenance hooks.
        let steps = snap.step_failures();
        let hooks = snap.hook_failures();
        if ctx.json {
            println!("{}", as_json(&snap));
        } else if self.hosts {
            for (h, (step, value)) in &snap.failures {
                println!(
                    "{h}\t{}\t{}\t{}",
                    snap.role_of(h),
                    step.as_str(),
                    describe_entry(value)
                );
            }
            for (h, f) in &steps {
                println!(
                    "{h}\t{}\t{} {}{}\t{}",
                    snap.role_of(h),
                    f.phase,
                    f.service.as_deref().unwrap_or("-"),
                    f.task.as_ref().map(|t| format!(" ({t})")).unwrap_or_default(),
                    describe_entry(&f.value)
                );
            }
            for (h, r) in &hooks {
                println!("{h}\t{}\t{} hook\t{}", r.role, r.hook, r.describe());
            }
        } else {
            let mut by_role: BTreeMap<String, usize> = BTreeMap::new();
            let failed: std::collections::BTreeSet<&jio_common::names::HostName> = snap
                .failures
                .keys()
                .chain(steps.iter().map(|(h, _)| h))
                .chain(hooks.iter().map(|(h, _)| *h))
                .collect();
            for h in &failed {
                *by_role.entry(snap.role_of(h).to_string()).or_default() += 1;
            }
            println!("{} failed host(s)", failed.len());
            for (r, n) in by_role {
                println!("  {r}: {n}");
            }
        }
        if snap.failures.is_empty() && steps.is_empty() && hooks.is_empty() {
            Ok(())
        } else {
            Err(Failure::quiet(exit::FAILED))
        }
    }
}

fn as_json(snap: &Snapshot) -> serde_json::Value {
    let mut v: BTreeMap<String, serde_json::Value> = snap
        .failures
        .iter()
        .map(|(h, (step, link))| {
            (
                h.to_string(),
                json!({"role": snap.role_of(h), "step": step.as_str(), "link": link}),
            )
        })
        .collect();
    for (h, r) in snap.hook_failures() {
        v.entry(h.to_string()).or_insert_with(|| {
            json!({"role": r.role, "step": format!("{} hook", r.hook), "link": r.log, "message": r.message})
        });
    }
    for (h, f) in snap.step_failures() {
        v.entry(h.to_string()).or_insert_with(|| {
            json!({"role": snap.role_of(&h), "step": f.phase, "service": f.service, "task": f.task, "link": f.value})
        });
    }
    json!(v)
}
