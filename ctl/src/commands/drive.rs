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
    /// Serve Prometheus metrics of the fleet and the rollout on GET /metrics at
    /// ADDR (IP:PORT; a bare port is on the loopback)
    #[arg(long, value_name = "ADDR", value_parser = jio_common::exposition::parse_listen)]
    metrics_listen: Option<std::net::SocketAddr>,
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
        let (_stop_metrics, stop) = tokio::sync::watch::channel(false);
        if let Some(addr) = self.metrics_listen {
            let scrape = std::sync::Arc::new(crate::metrics::FleetMetrics::new(
                store.clone(),
                ctx.schema().clone(),
            ));
            tokio::spawn(jio_common::exposition::serve(
                addr,
                scrape,
                stop,
                "--metrics-listen",
                |at| eprintln!("jioctl drive: metrics of the fleet and the rollout on http://{at}/metrics"),
            ));
        }
        crate::upgrade::drive(
            &store,
            ctx.schema(),
            &ctx.config.role_pattern,
            self.lease,
            ctx.verbose > 0,
            ctx.config.hooks.clone(),
        )
        .await
    }
}
