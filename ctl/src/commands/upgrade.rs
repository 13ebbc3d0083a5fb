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
    use jio_common::hook_record::{HookKind, HookState};
    // Not done while a stop is in force, the last rollout cannot be read or did
    // not end done (an aborted or failed rollout to V, a composable one whose later
    // stages never ran), or a host may be left drained by a maintenance hook.
    if snap.current.as_ref() != Some(v) || snap.halt.is_some() {
        return None;
    }
    if let Some(c) = &snap.rollout {
        let r = c.ok()?;
        if r.state.active() || (&r.version == v && r.state.name() != "done") {
            return None;
        }
    }
    if snap
        .hooks
        .values()
        .any(|r| !(r.hook == HookKind::After && r.state == HookState::Succeeded))
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
        "{v} is already rolled out: all {} host(s) run it{last}; nothing was started (--force starts a new rollout to {v} all the same, and also skips the checks of the rules' intent and of the package snapshot)",
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

#[cfg(test)]
mod tests {
    use super::*;
    use jio_common::fleet::Snapshot;
    use jio_common::keys::Schema;
    use jio_common::store::KeyValue;

    fn kv(key: &str, value: &str) -> KeyValue {
        let key = jio_common::keys::Key::new(key).unwrap();
        KeyValue::from_bytes(key, value.as_bytes().to_vec(), 1, 1, 1, None)
    }

    /// Two computes at v2, with `extra` keys.
    fn fleet(extra: &[(&str, &str)]) -> Snapshot {
        let reg = r#"{"role":"compute","agent_version":"1","addresses":[],"first_seen":1}"#;
        let agent = r#"{"state":"idle","version":"v2","since":1,"pid":1}"#;
        let mut kvs = vec![
            kv("/current_version", "v2"),
            kv("/config_state/enable_puppet/global", "false"),
        ];
        for h in ["compute1", "compute2"] {
            kvs.push(kv(&format!("/hosts/{h}"), reg));
            kvs.push(kv(&format!("/agents/{h}"), agent));
            kvs.push(kv(&format!("/running/versions/v2/{h}"), "1"));
        }
        kvs.extend(extra.iter().map(|(k, v)| kv(k, v)));
        Snapshot::from_kvs(&Schema::default(), &kvs)
    }

    #[test]
    fn a_version_is_done_only_when_nothing_is_left_to_do() {
        let v2 = Version::new("v2").unwrap();
        let done = already_done(&fleet(&[]), &v2).expect("every host runs v2");
        assert!(
            done.contains("v2 is already rolled out: all 2 host(s) run it"),
            "{done}"
        );
        assert!(already_done(&fleet(&[]), &Version::new("v3").unwrap()).is_none());
        let halt = r#"{"holder":"alice","host":"l","pid":1,"since":1}"#;
        assert!(
            already_done(&fleet(&[("/locks/halt", halt)]), &v2).is_none(),
            "an emergency stop"
        );
        assert!(
            already_done(&fleet(&[("/rollouts/current", "20261129T000000Z-v2")]), &v2).is_none(),
            "a current rollout whose record is missing"
        );
        let mut pending = fleet(&[]);
        pending.running.retain(|h, _| h.as_str() != "compute2");
        assert!(already_done(&pending, &v2).is_none(), "compute2 does not run v2");
    }
}
