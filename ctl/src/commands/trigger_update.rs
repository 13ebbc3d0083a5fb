//! `jioctl trigger-update VERSION [--force]`: set `/current_version`, refused when
//! it would release hosts outside any rules.

use clap::Args;
use jio_common::names::Version;
use jio_common::store::Op;

use crate::context::{Access, Context};
use crate::exit::Outcome;
use crate::release::release_checked;

#[derive(Args, Debug)]
pub struct TriggerUpdate {
    /// The desired version to set (/current_version)
    version: Version,
    /// Write it even though it releases hosts at once, outside any rolling rules, and without checking that its package snapshot exists
    #[arg(long)]
    force: bool,
}

impl TriggerUpdate {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let store = ctx.open(Access::Write).await?;
        let v = self.version;
        crate::snapshots::check(ctx, &store, &v, self.force, &format!("trigger-update {v}")).await?;
        let schema = ctx.schema();
        let by = crate::rollouts::by();
        let ended = std::cell::RefCell::new(None);
        // An active rollout to another version ends with this write: its driver
        // would otherwise find the version moved under it.
        let ops = |s: &jio_common::fleet::Snapshot| {
            let mut ops = vec![Op::put(schema.current_version(), v.to_string())];
            let now = jio_common::time::unix_now();
            let reason = Some(format!("trigger-update set the desired version to {v}"));
            match s.rollout.as_ref().and_then(|c| c.ok()) {
                Some(r) if r.version != v && r.state.active() => {
                    if let Ok(e) = r.abort(&by, reason, now) {
                        ops.extend(crate::writes::end_ops(schema, &e, false));
                        *ended.borrow_mut() = Some(e);
                    }
                }
                _ => *ended.borrow_mut() = None,
            }
            ops
        };
        let what = format!("trigger-update {v}");
        release_checked(ctx, &store, ops, self.force, &what, |s| {
            s.current = Some(v.clone());
        })
        .await?;
        crate::say!("current_version set to {v}");
        let ended = ended.into_inner();
        if ctx.json {
            println!(
                "{}",
                crate::out::document(serde_json::json!({
                    "current_version": v,
                    "ended_rollout": ended.as_ref().map(|e| e.id.to_string()),
                }))
            );
        }
        if let Some(e) = ended {
            crate::say!(
                "rollout {} to {} ended (recorded aborted): the desired version is no longer its",
                e.id,
                e.version
            );
        }
        Ok(())
    }
}
