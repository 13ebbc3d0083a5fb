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
    version: Version,
    /// Write it even though it releases hosts at once, outside any rolling rules
    #[arg(long)]
    force: bool,
}

impl TriggerUpdate {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let store = ctx.open(Access::Write).await?;
        let v = self.version;
        let ops = vec![Op::put(ctx.schema().current_version(), v.to_string())];
        let what = format!("trigger-update {v}");
        release_checked(ctx, &store, ops, self.force, &what, |s| {
            s.current = Some(v.clone());
        })
        .await?;
        println!("current_version set to {v}");
        Ok(())
    }
}
