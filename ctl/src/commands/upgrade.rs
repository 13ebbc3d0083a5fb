//! `jioctl upgrade VERSION`: the rules are read and checked here, the rollout is
//! `crate::upgrade`'s.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use jio_common::names::Version;
use jio_common::rules::Rules;

use crate::context::{Access, Context};
use crate::exit::{self, Failure, Outcome};
use crate::upgrade::Mode;

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
    /// Print the planned waves, write nothing
    #[arg(long)]
    noop: bool,
    /// Follow the rollout to its end (the default; kept for scripts)
    #[arg(long, conflicts_with_all = ["once", "detach"])]
    retry: bool,
    /// Record the rollout (or find it) and run one pass, without following it
    #[arg(long, conflicts_with = "detach")]
    once: bool,
    /// Return as soon as the rollout is recorded (a driver service drives it)
    #[arg(long)]
    detach: bool,
    /// Give up following (exit 5) when the rollout has not finished by then (e.g. 30m); the rollout itself goes on
    #[arg(long, value_parser = duration, conflicts_with_all = ["once", "detach"])]
    timeout: Option<Duration>,
}

impl Upgrade {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let (rules, rules_json) = load_rules(self.instructions, self.instructions_file)?;
        let store = ctx
            .open(if self.noop { Access::Read } else { Access::Write })
            .await?;
        let mode = match (self.once, self.detach) {
            (true, _) => Mode::Once,
            (_, true) => Mode::Detach,
            _ => Mode::Follow,
        };
        let args = crate::upgrade::Args {
            version: self.version,
            rules,
            rules_json,
            mode,
            noop: self.noop,
            verbose: ctx.verbose > 0,
            json: ctx.json,
            quiet: false,
            timeout: self.timeout,
        };
        crate::upgrade::rollout(&store, ctx.schema(), &ctx.config.role_pattern, args).await
    }
}

/// The rules, checked, and their JSON as given (what a rollout record keeps).
pub fn load_rules(
    instructions: Option<String>,
    file: Option<PathBuf>,
) -> Result<(Rules, serde_json::Value), Failure> {
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
    let rules = Rules::parse(&text).map_err(|e| Failure::with(exit::INVALID_RULES, e.into()))?;
    // Parsed strictly above, so it is one JSON object.
    let json = serde_json::from_str(&text).map_err(|e| Failure::with(exit::INVALID_RULES, e.into()))?;
    Ok((rules, json))
}

/// A duration as `30s`, `10m`, `2h`.
pub fn duration(s: &str) -> Result<Duration, String> {
    jio_common::duration::parse(s)
}
