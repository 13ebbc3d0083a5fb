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

pub use crate::upgrade::DEFAULT_RULES;

#[derive(Args, Debug)]
pub struct Upgrade {
    /// The version to roll out
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
    /// A composable rollout: start (or continue the active rollout with) only these stages of the rules (repeat it, or give a comma-separated list); without it, every stage
    #[arg(long, value_delimiter = ',')]
    stage: Vec<String>,
    /// Go ahead with rules that name roles or groups the fleet does not have (yet), or that set no rolling limit; and without checking that VERSION's package snapshot exists
    #[arg(long)]
    force: bool,
}

impl Upgrade {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let (rules, rules_json) = load_rules(self.instructions, self.instructions_file)?;
        check_stages(&rules, &self.stage)?;
        let store = ctx
            .open(if self.noop { Access::Read } else { Access::Write })
            .await?;
        if !self.force && self.stage.is_empty() {
            let snap = ctx.snapshot(&store).await?;
            if let Some(done) = already_done(&snap, &self.version) {
                crate::say!("{done}");
                if ctx.json {
                    // What a followed rollout ends with: the fleet's status, said done already.
                    let hosts = jio_common::fleet::classify(&snap);
                    let adm = crate::status::admission_of(&snap, &hosts, jio_common::time::unix_now());
                    let mut doc = crate::status_json::StatusJson::document(&snap, &hosts, &adm);
                    doc.lead.push(("already_done", true.into()));
                    println!("{}", doc.render(true));
                }
                return Ok(());
            }
        }
        let what = format!("upgrade {}", self.version);
        crate::snapshots::check(ctx, &store, &self.version, self.force, &what).await?;
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
            stages: self.stage,
            force: self.force,
            hooks: ctx.config.hooks.clone(),
        };
        crate::upgrade::rollout(&store, ctx.schema(), &ctx.config.role_pattern, args).await
    }
}

/// `Some` (what to say) when `v` is the fleet's version, no rollout is active and
/// every host runs it: a new rollout would only move nothing "from" an older
/// version.
pub fn already_done(snap: &jio_common::fleet::Snapshot, v: &Version) -> Option<String> {
    use jio_common::fleet::HostState;
    if snap.current.as_ref() != Some(v) {
        return None;
    }
    if let Some(r) = snap.rollout.as_ref().and_then(|c| c.ok())
        && r.state.active()
    {
        return None;
    }
    let hosts = jio_common::fleet::classify(snap);
    if hosts.is_empty() || hosts.iter().any(|h| h.state != HostState::Upgraded) {
        return None;
    }
    let last = snap
        .rollout
        .as_ref()
        .and_then(|c| c.ok())
        .filter(|r| &r.version == v)
        .map(|r| format!(" (rollout {} {})", r.id, r.state.name()))
        .unwrap_or_default();
    Some(format!(
        "{v} is already rolled out: all {} host(s) run it{last}; nothing was started (--force starts a new rollout to {v} all the same)",
        hosts.len()
    ))
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

/// `--stage` names stages of the rules (which must be composable).
fn check_stages(rules: &Rules, stages: &[String]) -> Result<(), Failure> {
    if stages.is_empty() {
        return Ok(());
    }
    let Some(c) = &rules.compose else {
        return Err(Failure::usage(format!(
            "--stage {}: the rules have no roles_data: stages belong to a composable rollout",
            stages.join(",")
        )));
    };
    let names = c.stage_names();
    for s in stages {
        if !names.contains(s) {
            return Err(Failure::usage(format!(
                "--stage {s}: the rules have no such stage (stages: {})",
                names.join(", ")
            )));
        }
    }
    Ok(())
}

/// A duration as `30s`, `10m`, `2h`.
pub fn duration(s: &str) -> Result<Duration, String> {
    jio_common::duration::parse(s)
}
