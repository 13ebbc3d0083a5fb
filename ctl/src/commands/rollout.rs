//! `jioctl rollout status | pause | resume | promote | abort | history | undo`: the active
//! rollout as the store records it, and the operators' changes to it (each one
//! transaction; see `crate::rollouts`).

use std::time::Duration;

use clap::{Args, Subcommand};
use jio_common::fleet::{self, HostState, Snapshot};
use jio_common::rollout::{KEEP_HISTORY, RolloutRecord, RolloutState};
use jio_common::time::utc_display;

use crate::context::{Access, Context};
use crate::exit::{self, Failure, Outcome};
use crate::rollouts::{self, Change, ChangeError};
use crate::upgrade::Mode;

#[derive(Args, Debug)]
pub struct Rollout {
    #[command(subcommand)]
    command: RolloutCommand,
}

#[derive(Subcommand, Debug)]
enum RolloutCommand {
    /// The active rollout: its state, progress, driver and what it waits for
    Status,
    /// Stop admitting hosts at once (hosts in flight finish)
    Pause {
        /// Why (recorded and shown)
        #[arg(long)]
        reason: Option<String>,
        /// Resume by itself after this long (e.g. 30m)
        #[arg(long = "for", value_parser = crate::commands::upgrade::duration)]
        for_: Option<Duration>,
    },
    /// Go on with the same rules (a paused or stuck rollout)
    Resume,
    /// End the canary phase: admit the rest of the fleet under the rules
    Promote {
        /// Why (recorded and shown)
        #[arg(long)]
        reason: Option<String>,
    },
    /// End the rollout where it stands: the fleet is left mixed, every enable key reset
    Abort {
        /// Why (recorded and shown)
        #[arg(long)]
        reason: Option<String>,
    },
    /// Past rollouts, newest first: version, rules digest, who, when, outcome, duration
    History {
        /// Show at most this many
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Start a rollout back to the previous version with the same rules (an active
    /// rollout is aborted first, in the same transaction), and follow it
    Undo {
        /// Return as soon as it is recorded
        #[arg(long)]
        detach: bool,
        /// Go back even to a version whose last rollout was aborted or failed, or
        /// with rules whose intent is unclear, and without checking that its
        /// package snapshot exists
        #[arg(long)]
        force: bool,
    },
}

impl Rollout {
    pub async fn run(self, ctx: &Context) -> Outcome {
        match self.command {
            RolloutCommand::Status => status(ctx).await,
            RolloutCommand::History { limit } => history(ctx, limit).await,
            RolloutCommand::Pause { reason, for_ } => {
                let now = jio_common::time::unix_now();
                let until = for_.map(|d| now.saturating_add(d.as_secs().max(1)));
                change(ctx, Change::Pause { reason, until }).await
            }
            RolloutCommand::Resume => change(ctx, Change::Resume).await,
            RolloutCommand::Promote { reason } => change(ctx, Change::Promote { reason }).await,
            RolloutCommand::Abort { reason } => change(ctx, Change::Abort { reason }).await,
            RolloutCommand::Undo { detach, force } => undo(ctx, detach, force).await,
        }
    }
}

fn failure(e: ChangeError) -> Failure {
    match e {
        ChangeError::Store(e) => e.into(),
        ChangeError::NoRollout { .. } | ChangeError::Transition(_) | ChangeError::Unusable(_) => {
            Failure::new(exit::FAILED, e.to_string())
        }
        other => Failure::new(exit::SOFTWARE, other.to_string()),
    }
}

async fn change(ctx: &Context, c: Change) -> Outcome {
    let store = ctx.open(Access::Write).await?;
    let changed = match rollouts::change(&store, ctx.schema(), &c, jio_common::time::unix_now, || {
        ctx.snapshot(&store)
    })
    .await
    {
        Ok(c) => c,
        Err(ChangeError::EndedUnreadable(what)) => {
            println!("the current rollout was aborted: {what}");
            return Ok(());
        }
        Err(e) => return Err(failure(e)),
    };
    let r = &changed.record;
    let snap = ctx.snapshot(&store).await?;
    let in_flight = fleet::classify(&snap)
        .iter()
        .filter(|h| matches!(h.state, HostState::Upgrading | HostState::Lost))
        .count();
    if ctx.json {
        println!("{}", crate::out::document(serde_json::to_value(r)?));
        return Ok(());
    }
    match c {
        Change::Pause { .. } => println!(
            "{} (every enable key reset: hosts enabled but not started do not start)",
            crate::render::paused_line(r, in_flight)
        ),
        Change::Resume => {
            println!(
                "rollout {} to {} resumed: hosts are admitted again under the same rules",
                r.id, r.version
            );
            say_driver(&snap, r);
        }
        Change::Promote { .. } => {
            println!(
                "rollout {} to {} promoted: the canary phase is over, the rest is admitted under its rules",
                r.id, r.version
            );
            say_driver(&snap, r);
        }
        Change::Abort { .. } => println!(
            "rollout {} to {} aborted: the fleet is left as it is, every enable key reset; {}{}",
            r.id,
            r.version,
            crate::render::in_flight_finish(in_flight),
            r.previous
                .as_ref()
                .map(|p| format!("; `jioctl rollout undo` goes back to {p}"))
                .unwrap_or_default()
        ),
        Change::Undo { .. } => {}
    }
    Ok(())
}

/// Says who will drive `r`, or that nobody will until asked.
fn say_driver(snap: &Snapshot, r: &RolloutRecord) {
    if snap.lock.is_some() {
        println!("driven by {}", crate::writes::describe(&snap.lock));
    } else if !snap.drivers.is_empty() {
        println!(
            "the driver service(s) {} will drive it",
            snap.drivers.keys().cloned().collect::<Vec<_>>().join(", ")
        );
    } else {
        println!(
            "no driver is running: start `jioctl drive`, or run `jioctl upgrade {}{}` with the same rules to drive it from here",
            r.version,
            crate::status::stage_args(r)
        );
    }
}

/// Refuses an undo whose intent is unclear, unless `force`: back to a version whose
/// last rollout an operator aborted or that failed (quoting why and who), or with
/// rules the shared check refuses. Nothing is written before. `Ok(true)`: the
/// rules' intent is unclear and `force` overrides it (the new record says so).
async fn undo_check(
    ctx: &Context,
    store: &jio_common::store::DynStore,
    force: bool,
) -> Result<bool, Failure> {
    let snap = ctx.snapshot(store).await?;
    let rec = match snap.rollout.as_ref().and_then(|c| c.ok()) {
        Some(r) => Some(r.clone()),
        None => rollouts::last_record(store, ctx.schema()).await?,
    };
    let Some(rec) = rec else {
        return Ok(false); // `change` says there is nothing to undo.
    };
    let Some(back) = rec.previous.clone() else {
        return Ok(false);
    };
    crate::snapshots::check(ctx, store, &back, force, &format!("undo to {back}")).await?;
    let (records, _) = rollouts::history(store, ctx.schema()).await?;
    let last_to_back = records.iter().find(|r| r.version == back && r.id != rec.id);
    if let Some(r) = last_to_back {
        let why = match &r.state {
            // Replaced or halted is not a verdict on the build: only an operator's
            // abort or a failure is.
            RolloutState::Aborted {
                by,
                reason,
                superseded_by: None,
                emergency: false,
            } => Some(format!(
                "aborted by {by}{}",
                reason.as_ref().map(|x| format!(": {x:?}")).unwrap_or_default()
            )),
            RolloutState::Failed { hosts } => Some(format!("failed ({} host(s) failed)", hosts.len())),
            _ => None,
        };
        if let Some(why) = why
            && !force
        {
            return Err(Failure::usage(format!(
                "undo would go back to {back}, whose last rollout {} was {why}; nothing was written (give --force to go back to it all the same)",
                r.id
            )));
        }
    }
    let hosts = fleet::classify(&snap);
    let roles = hosts.iter().map(|h| h.role.clone()).collect();
    let rules = jio_common::rules::Rules::parse(&rec.rules.to_string())
        .map_err(|e| Failure::with(exit::INVALID_RULES, e.into()))?;
    let resolved = rules
        .resolve(&roles)
        .map_err(|e| Failure::with(exit::INVALID_RULES, e.into()))?;
    let moving = hosts.len();
    match jio_common::rules::check_intent(&resolved, rules.sets_no_limit().then_some(moving), false) {
        Ok(()) => Ok(false),
        Err(_) if force || rec.forced => Ok(true),
        Err(e) => Err(Failure::new(exit::INVALID_RULES, format!("undo: {e}"))),
    }
}

async fn undo(ctx: &Context, detach: bool, force: bool) -> Outcome {
    let store = ctx.open(Access::Write).await?;
    let force = undo_check(ctx, &store, force).await?;
    let changed = rollouts::change(
        &store,
        ctx.schema(),
        &Change::Undo { force },
        jio_common::time::unix_now,
        || ctx.snapshot(&store),
    )
    .await
    .map_err(failure)?;
    let Some(back) = changed.started else {
        return Err(Failure::new(exit::SOFTWARE, "undo recorded no rollout"));
    };
    if changed.aborted_first {
        crate::say!(
            "rollout {} to {} aborted (undone)",
            changed.record.id,
            changed.record.version
        );
    }
    crate::say!(
        "rollout {} back to {} started with the same rules ({}); current_version set to {}",
        back.id,
        back.version,
        back.rules_digest(),
        back.version
    );
    let (rules, _) = crate::commands::upgrade::load_rules(Some(back.rules.to_string()), None)?;
    let args = crate::upgrade::Args {
        version: back.version.clone(),
        rules,
        rules_json: back.rules.clone(),
        mode: if detach { Mode::Detach } else { Mode::Follow },
        noop: false,
        verbose: ctx.verbose > 0,
        json: ctx.json,
        quiet: false,
        timeout: None,
        stages: Vec::new(),
        // Checked above, before anything was written; the driver checks the
        // record (forced or not) on every pass.
        force: false,
        hooks: ctx.config.hooks.clone(),
    };
    crate::upgrade::follow(
        &store,
        ctx.schema(),
        &ctx.config.role_pattern,
        &back,
        args.mode,
        &args,
    )
    .await
}

async fn status(ctx: &Context) -> Outcome {
    let store = ctx.open(Access::Read).await?;
    let snap = ctx.snapshot_warned(&store).await?;
    let hosts = fleet::classify(&snap);
    let now = jio_common::time::unix_now();
    let composed = crate::status::admission(&snap, now).composed;
    if ctx.json {
        let last = match &snap.rollout {
            Some(_) => None,
            None => rollouts::last_record(&store, ctx.schema()).await?,
        };
        let mut j = serde_json::json!({
            "rollout": crate::status::rollout_json(&snap),
            "last": last,
            "lock": snap.lock,
            "drivers": snap.drivers,
            "progress": crate::progress::counts(&hosts),
        });
        if let Some(c) = &composed {
            j["stages"] = serde_json::json!(c.stages);
            j["finalize"] = serde_json::json!(c.finalize);
        }
        println!("{}", crate::out::document(j));
        return Ok(());
    }
    let Some(cur) = &snap.rollout else {
        match rollouts::last_record(&store, ctx.schema()).await? {
            Some(l) => println!(
                "no rollout is active; the last one, {} to {}, ended {} at {} (`jioctl rollout history` lists them)",
                l.id,
                l.version,
                l.state.name(),
                utc_display(l.changed_at())
            ),
            None => println!("no rollout is active, and none is recorded"),
        }
        return Ok(());
    };
    for line in crate::status::rollout_lines(&snap) {
        println!("{line}");
    }
    if let Some(r) = cur.ok() {
        if let Some(p) = &r.previous {
            println!("previous version: {p} (`jioctl rollout undo` goes back to it)");
        }
        for c in &r.changes {
            println!(
                "  {} {} by {}{}",
                utc_display(c.at),
                c.state,
                c.by,
                c.reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default()
            );
        }
        say_driver(&snap, r);
    }
    if let Some(c) = &composed {
        print!("{}", crate::render::stages(c));
    }
    for (role, c) in crate::progress::counts(&hosts) {
        println!("{}", crate::progress::plain_line(&role, &c));
    }
    Ok(())
}

/// Why a rollout ended, when someone or something ended it (not a plain finish).
fn end_reason(st: &RolloutState) -> Option<String> {
    match st {
        RolloutState::Aborted {
            by,
            reason,
            superseded_by,
            emergency,
            ..
        } => Some(match (superseded_by, emergency) {
            (Some(next), _) => format!("replaced by rollout {next} ({by})"),
            (None, true) => format!("halted by an emergency stop ({by} ran global-disable-puppet)"),
            (None, false) => format!(
                "aborted by {by}{}",
                reason.as_ref().map(|r| format!(": {r:?}")).unwrap_or_default()
            ),
        }),
        RolloutState::Failed { hosts } => Some(format!(
            "failed: {}",
            hosts
                .iter()
                .map(|(h, why)| format!("{h} ({why})"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        _ => None,
    }
}

async fn history(ctx: &Context, limit: usize) -> Outcome {
    let store = ctx.open(Access::Read).await?;
    let (records, problems) = rollouts::history(&store, ctx.schema()).await?;
    for p in &problems {
        eprintln!("jioctl: warning: {p}");
    }
    let shown: Vec<&RolloutRecord> = records.iter().take(limit).collect();
    if ctx.json {
        let j: Vec<serde_json::Value> = shown
            .iter()
            .map(|r| {
                let mut v = serde_json::json!(r);
                v["rules_digest"] = serde_json::json!(r.rules_digest());
                v["duration_s"] = serde_json::json!(r.duration_s());
                v
            })
            .collect();
        println!("{}", crate::out::document(serde_json::Value::Array(j)));
        return Ok(());
    }
    println!(
        "{:<34} {:<12} {:<12} {:<12} {:<20} {:<16} {:<9} {:>8}",
        "ROLLOUT", "VERSION", "FROM", "RULES", "BY", "STARTED", "OUTCOME", "DURATION"
    );
    for r in &shown {
        println!(
            "{:<34} {:<12} {:<12} {:<12} {:<20} {:<16} {:<9} {:>8}",
            r.id.as_str(),
            r.version.as_str(),
            r.previous.as_ref().map(|p| p.as_str()).unwrap_or("-"),
            r.rules_digest(),
            r.started_by(),
            utc_display(r.started_at()),
            outcome(&r.state),
            jio_common::duration::format(Duration::from_secs(r.duration_s()))
        );
        if let Some(why) = end_reason(&r.state) {
            println!("    {why}");
        }
    }
    println!(
        "{} of {} recorded rollout(s) shown; the store keeps the last {KEEP_HISTORY}",
        shown.len(),
        records.len()
    );
    Ok(())
}

fn outcome(s: &RolloutState) -> &'static str {
    match s {
        RolloutState::Aborted {
            superseded_by: Some(_),
            ..
        } => "replaced",
        RolloutState::Aborted { emergency: true, .. } => "halted",
        other => other.name(),
    }
}
