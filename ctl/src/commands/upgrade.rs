//! `jioctl upgrade VERSION`: the rules are read and checked here, the rollout is
//! `crate::upgrade`'s.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use jio_common::names::Version;
use jio_common::rules::Rules;

use crate::context::{Access, Context};
use crate::exit::{self, Failure, Outcome};

/// The default rules file.
pub const DEFAULT_RULES: &str = "/etc/jio-upgrade.json";

#[derive(Args, Debug)]
pub struct Upgrade {
    version: Version,
    /// The rules as JSON [default: /etc/jio-upgrade.json when it exists]
    #[arg(long, conflicts_with = "instructions_file")]
    instructions: Option<String>,
    /// A file holding the rules
    #[arg(long)]
    instructions_file: Option<PathBuf>,
    /// Print the plan, write nothing
    #[arg(long)]
    noop: bool,
    /// Repeat passes until nothing is pending or upgrading
    #[arg(long)]
    retry: bool,
    /// With --retry: give up (exit 5) when the rollout has not finished by then (e.g. 30m)
    #[arg(long, value_parser = duration, requires = "retry")]
    timeout: Option<Duration>,
}

impl Upgrade {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let rules = load_rules(self.instructions, self.instructions_file)?;
        let store = ctx
            .open(if self.noop { Access::Read } else { Access::Write })
            .await?;
        let args = crate::upgrade::Args {
            version: self.version,
            rules,
            noop: self.noop,
            retry: self.retry,
            verbose: ctx.verbose > 0,
            json: ctx.json,
            quiet: false,
            timeout: self.timeout,
        };
        crate::upgrade::rollout(&store, ctx.schema(), &ctx.config.role_pattern, args).await
    }
}

fn load_rules(instructions: Option<String>, file: Option<PathBuf>) -> Result<Rules, Failure> {
    let text = match (instructions, file) {
        (Some(t), _) => t,
        (None, Some(p)) => {
            std::fs::read_to_string(&p).map_err(|e| Failure::usage(format!("{}: {e}", p.display())))?
        }
        (None, None) => match std::fs::read_to_string(DEFAULT_RULES) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "{}".into(),
            Err(e) => return Err(Failure::usage(format!("{DEFAULT_RULES}: {e}"))),
        },
    };
    Rules::parse(&text).map_err(|e| Failure::with(exit::INVALID_RULES, e.into()))
}

/// A duration as `30s`, `10m`, `2h`.
fn duration(s: &str) -> Result<Duration, String> {
    jio_common::duration::parse(s)
}
