//! `jioctl drive`: the driver service (see `crate::upgrade::drive`).

use std::time::Duration;

use clap::Args;

use crate::context::{Access, Context};
use crate::exit::{Failure, Outcome};

#[derive(Args, Debug)]
pub struct Drive {
    /// The rollout lock's lease: a standby takes over this long after this service
    /// stops answering (e.g. 15s)
    #[arg(long, value_parser = crate::commands::upgrade::duration, default_value = "15s")]
    lease: Duration,
}

impl Drive {
    pub async fn run(self, ctx: &Context) -> Outcome {
        if self.lease < Duration::from_secs(2) {
            return Err(Failure::usage(format!(
                "--lease {}: must be at least 2s (the lease is renewed every third of it)",
                jio_common::duration::format(self.lease)
            )));
        }
        let store = ctx.open(Access::Write).await?;
        crate::upgrade::drive(
            &store,
            ctx.schema(),
            &ctx.config.role_pattern,
            self.lease,
            ctx.verbose > 0,
        )
        .await
    }
}
