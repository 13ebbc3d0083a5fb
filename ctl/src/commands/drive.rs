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
    #[arg(long, value_name = "ADDR", value_parser = listen_addr)]
    metrics_listen: Option<std::net::SocketAddr>,
}

/// `--metrics-listen`: `IP:PORT`, or a bare port (`9465`, `:9465`) on the loopback.
fn listen_addr(v: &str) -> Result<std::net::SocketAddr, String> {
    let port = v.strip_prefix(':').unwrap_or(v);
    if let Ok(p) = port.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], p)));
    }
    v.parse()
        .map_err(|_| "not an address to listen on: give IP:PORT (127.0.0.1:9465, [::1]:9465) or a port for the loopback".to_string())
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
            ));
            eprintln!("jioctl drive: metrics of the fleet and the rollout on http://{addr}/metrics");
        }
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
