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
    #[command(after_help = examples!(
        ("jioctl rollout status", "the active rollout: its state, driver, progress and what it waits for"),
        ("jioctl --json rollout status", "the same for programs"),
    ))]
    Status,
    /// Stop admitting hosts at once (hosts in flight finish)
    #[command(after_help = examples!(
        ("jioctl rollout pause --reason 'night shift' --for 8h", "admit nothing for 8 hours; hosts in flight finish"),
        ("jioctl rollout pause", "admit nothing until `jioctl rollout resume`"),
    ))]
    Pause {
        /// Why (recorded and shown)
        #[arg(long)]
        reason: Option<String>,
        /// Resume by itself after this long (e.g. 30m)
        #[arg(long = "for", value_parser = crate::commands::upgrade::duration)]
        for_: Option<Duration>,
    },
    /// Go on with the same rules (a paused or stuck rollout)
    #[command(after_help = examples!(
        ("jioctl rollout resume", "admit hosts again under the same rules"),
    ))]
    Resume,
    /// End the canary phase: admit the rest of the fleet under the rules
    #[command(after_help = examples!(
        ("jioctl rollout promote --reason 'canaries healthy'", "end the canary phase: the rest of the fleet is admitted"),
    ))]
    Promote {
        /// Why (recorded and shown)
        #[arg(long)]
        reason: Option<String>,
    },
    /// End the rollout where it stands: the fleet is left mixed, every enable key reset
    #[command(after_help = examples!(
        ("jioctl rollout abort --reason 'bad build'", "end the rollout; the fleet is left mixed and safe"),
    ))]
    Abort {
        /// Why (recorded and shown)
        #[arg(long)]
        reason: Option<String>,
    },
    /// Past rollouts, newest first: version, rules digest, who, when, outcome, duration
    #[command(after_help = examples!(
        ("jioctl rollout history --limit 5", "the last five rollouts, and why each ended"),
        ("jioctl --json rollout history", "every recorded rollout, whole, for programs"),
    ))]
    History {
        /// Show at most this many
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Start a rollout back to the previous version with the same rules (an active
    /// rollout is aborted first, in the same transaction), and follow it
    #[command(after_help = examples!(
        ("jioctl rollout undo", "back to the previous version with the same rules, and follow it"),
        ("jioctl rollout undo --detach", "record it and return; the driver service drives it"),
    ))]
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
    print!(
        "{}",
        history_table(&shown, records.len(), jio_common::time::unix_now())
    );
    Ok(())
}

/// The widest line `rollout history` prints (a terminal's default width).
const HISTORY_WIDTH: usize = 80;

/// `rollout history`'s table: one row per rollout in at most `HISTORY_WIDTH`
/// columns, why it ended on a line under it; what is too long to fit is cut with
/// `…` (`--json` gives it in full). The rollout id is no column of its own: it is
/// the start and the version, both shown. An active rollout's duration runs to `now`.
fn history_table(shown: &[&RolloutRecord], recorded: usize, now: u64) -> String {
    let rows: Vec<[String; 7]> = shown
        .iter()
        .map(|r| {
            [
                utc_minute(r.started_at()),
                r.version.to_string(),
                r.previous.as_ref().map_or("-".to_string(), |p| p.to_string()),
                r.rules_digest(),
                r.started_by().to_string(),
                outcome(&r.state).to_string(),
                // An active rollout has lasted until now, not until its last change.
                span(if r.state.active() {
                    now.saturating_sub(r.started_at())
                } else {
                    r.duration_s()
                }),
            ]
        })
        .collect();
    let header = [
        "STARTED (UTC)",
        "VERSION",
        "FROM",
        "RULES",
        "BY",
        "OUTCOME",
        "DURATION",
    ];
    let mut widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| width(&r[i]))
                .chain([width(header[i])])
                .max()
                .unwrap_or(0)
        })
        .collect();
    fit_widths(&mut widths, &header.map(width));
    let cut = std::cell::Cell::new(false);
    let line = |cells: [&str; 7]| {
        let last = cells.len() - 1;
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            let (c, was_cut) = fit(c, widths[i]);
            cut.set(cut.get() | was_cut);
            let pad = " ".repeat(widths[i] - width(&c));
            if i == last {
                l.push_str(&format!("{pad}{c}"));
            } else {
                l.push_str(&format!("{c}{pad}  "));
            }
        }
        l.push('\n');
        l
    };
    let mut out = line(header);
    for (r, row) in shown.iter().zip(&rows) {
        out.push_str(&line(std::array::from_fn(|i| row[i].as_str())));
        if let Some(why) = end_reason(&r.state) {
            let (why, was_cut) = fit(&why, HISTORY_WIDTH - 4);
            cut.set(cut.get() | was_cut);
            out.push_str(&format!("    {why}\n"));
        }
    }
    out.push_str(&format!(
        "{} of {recorded} recorded rollout(s) shown; the store keeps the last {KEEP_HISTORY}\n",
        shown.len()
    ));
    if cut.get() {
        out.push_str("text cut with … is whole in `jioctl --json rollout history`\n");
    }
    out
}

/// Narrows the columns until the row fits `HISTORY_WIDTH`: who started it gives
/// way first (down to 12 columns), then the widest of the free-text columns (who,
/// the versions), none below `least` (its header).
fn fit_widths(widths: &mut [usize], least: &[usize]) {
    const FLEXIBLE: [usize; 3] = [4, 1, 2];
    let total = |w: &[usize]| w.iter().sum::<usize>() + 2 * (w.len() - 1);
    while total(widths) > HISTORY_WIDTH {
        let by_first = (widths[4] > 12).then_some(4);
        let Some(i) = by_first.or_else(|| {
            FLEXIBLE
                .iter()
                .copied()
                .filter(|&i| widths[i] > least[i])
                .max_by_key(|&i| widths[i])
        }) else {
            break;
        };
        widths[i] -= 1;
    }
}

/// Characters, as a terminal shows them (ids, versions and names are ASCII; a
/// reason may not be).
fn width(s: &str) -> usize {
    console::measure_text_width(s)
}

/// `s` in at most `w` columns: cut with `…` when longer (and whether it was).
fn fit(s: &str, w: usize) -> (String, bool) {
    if width(s) <= w {
        return (s.to_string(), false);
    }
    (console::truncate_str(s, w, "…").into_owned(), true)
}

/// A start to the minute, `2026-11-23 02:00` (the zone is in the header).
fn utc_minute(secs: u64) -> String {
    let full = utc_display(secs);
    full.get(..16).unwrap_or(&full).to_string()
}

/// A duration in its two largest units, every one written the same way: `0s`,
/// `2s`, `1m05s`, `2h03m`, `3d04h`.
fn span(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match secs {
        0..60 => format!("{s}s"),
        60..3600 => format!("{m}m{s:02}s"),
        3600..86_400 => format!("{h}h{m:02}m"),
        _ => format!("{d}d{h:02}h"),
    }
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design

    use std::collections::BTreeMap;

    use jio_common::names::Version;

    use super::*;

    const T0: u64 = 1_795_267_815; // 2026-11-21 13:30:15 UTC

    fn v(s: &str) -> Version {
        Version::new(s).unwrap()
    }

    fn started(version: &str, previous: Option<&str>, by: &str) -> RolloutRecord {
        let rules = serde_json::json!({"max_in_flight": 2});
        RolloutRecord::start(v(version), previous.map(v), rules, by, T0)
    }

    #[test]
    fn durations_are_written_one_way() {
        for (secs, want) in [
            (0, "0s"),
            (2, "2s"),
            (59, "59s"),
            (60, "1m00s"),
            (65, "1m05s"),
            (3599, "59m59s"),
            (3600, "1h00m"),
            (7380, "2h03m"),
            (86_399, "23h59m"),
            (86_400 + 4 * 3600 + 59, "1d04h"),
        ] {
            assert_eq!(span(secs), want, "{secs}s");
        }
    }

    /// The table of the issue (137 columns, STARTED out of line, `0` beside `2s`)
    /// fits 80 columns, each column starts where its header does, and a reason
    /// too long for a line is cut, the footer saying where it is whole.
    #[test]
    fn history_fits_eighty_columns_in_aligned_columns() {
        let done = started("v2", Some("v1"), "alice@mgmt1")
            .finish(BTreeMap::new(), "alice@mgmt1", T0 + 65)
            .unwrap();
        let aborted = started(
            "v3-hotfix-2026.11",
            Some("v2"),
            "operator-on-call@management-node-7",
        )
        .abort("bob@mgmt2", Some("bad build".into()), T0)
        .unwrap();
        let failed_hosts: BTreeMap<String, String> = (1..=12)
            .map(|i| (format!("compute{i}"), "validation failed (exit 1)".to_string()))
            .collect();
        let failed = started("v4", Some("v3-hotfix-2026.11"), "carol@mgmt3")
            .finish(failed_hosts, "carol@mgmt3", T0 + 7380)
            .unwrap();
        let table = history_table(&[&failed, &aborted, &done], 3, T0 + 9000);
        let lines: Vec<&str> = table.lines().collect();
        for l in &lines {
            assert!(width(l) <= 80, "{} columns: {l:?}\n{table}", width(l));
        }
        let header = lines[0];
        assert!(header.starts_with("STARTED (UTC)"), "{table}");
        let rows: Vec<&str> = lines.iter().copied().filter(|l| l.starts_with("2026-")).collect();
        assert_eq!(rows.len(), 3, "{table}");
        // Every row's cells start under their header's (counted in columns: `…`
        // is one column of three bytes).
        let cols = |l: &str| l.chars().collect::<Vec<char>>();
        for name in ["VERSION", "FROM", "RULES", "BY", "OUTCOME"] {
            let at = cols(header).iter().collect::<String>().find(name).unwrap();
            for r in &rows {
                let r = cols(r);
                assert!(
                    r[at] != ' ' && r[at - 1] == ' ' && r[at - 2] == ' ',
                    "{name} in {r:?}\n{table}"
                );
            }
        }
        // Durations end where DURATION does, written one way.
        for (r, d) in rows.iter().zip(["2h03m", "0s", "1m05s"]) {
            assert!(r.ends_with(&format!(" {d}")), "{r:?}");
            assert_eq!(width(r), width(header), "{r:?}\n{table}");
        }
        assert!(rows[0].starts_with("2026-11-21 13:30  v4 "), "{table}");
        assert!(rows[2].contains(" v2 ") && rows[2].contains(" v1 ") && rows[2].contains(" done "));
        // The long name gave way, cut where it shows.
        assert!(rows[1].contains("  operator…  "), "{table}");
        // Why each ended, under it: the short reason whole, the long one cut.
        assert_eq!(
            lines[lines.iter().position(|l| *l == rows[1]).unwrap() + 1],
            "    aborted by bob@mgmt2: \"bad build\""
        );
        let failed_why = lines[2];
        assert!(
            failed_why.starts_with("    failed: compute1 (validation failed (exit 1))"),
            "{table}"
        );
        assert!(failed_why.ends_with('…'), "{table}");
        assert_eq!(
            lines[lines.len() - 2..],
            [
                "3 of 3 recorded rollout(s) shown; the store keeps the last 100",
                "text cut with … is whole in `jioctl --json rollout history`"
            ],
            "{table}"
        );
    }

    /// Nothing cut, nothing said about cutting; short columns stay short.
    #[test]
    fn a_short_history_is_not_padded_nor_cut() {
        let r = started("v2", None, "root@m1");
        let table = history_table(&[&r], 1, T0 + 65);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert!(
            lines[1].contains("  -  ") && lines[1].contains(" running "),
            "{table}"
        );
        assert!(lines[1].ends_with(" 1m05s"), "running for 1m05s so far: {table}");
        assert!(!table.contains('…') && !table.contains("--json"), "{table}");
        assert!(width(lines[0]) < 80, "{table}");
    }
}
