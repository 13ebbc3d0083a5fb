//! `jioctl commands list | show ID | follow ID | cancel ID`: fleet commands
//! recorded in the store (`crate::fleet_commands`).

use clap::{Args, Subcommand};
use jio_common::command_record::CommandRecord;
use jio_common::names::CommandId;
use jio_common::values::parse_json;

use crate::context::{Access, Context};
use crate::exit::{self, Failure, Outcome};
use crate::fleet_commands;

#[derive(Args, Debug)]
pub struct Commands {
    #[command(subcommand)]
    cmd: Sub,
}

#[derive(Subcommand, Debug)]
enum Sub {
    /// Fleet commands, newest first: active ones and the history (the last 100 finished)
    #[command(after_help = examples!(
        ("jioctl commands list --limit 5", "the five newest fleet commands"),
    ))]
    List {
        /// Show at most this many
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// One command: its record and every host's result (exit code, duration, log)
    #[command(after_help = examples!(
        ("jioctl commands show 20261125T031500Z-restart-nova", "its record and every host's result"),
    ))]
    Show {
        /// The command's id (`jioctl commands list` shows them)
        #[arg(value_parser = fleet_commands::parse_id)]
        id: CommandId,
    },
    /// Follow a command to its end, driving it while nobody else does
    #[command(after_help = examples!(
        ("jioctl commands follow 20261125T031500Z-restart-nova", "follow it to its end, driving it while nobody else does"),
    ))]
    Follow {
        /// The command's id (`jioctl commands list` shows them)
        #[arg(value_parser = fleet_commands::parse_id)]
        id: CommandId,
    },
    /// Stop admitting hosts: no host starts it any more; hosts running it finish
    #[command(after_help = examples!(
        ("jioctl commands cancel 20261125T031500Z-restart-nova --reason 'wrong action'", "no host starts it any more; hosts running it finish"),
    ))]
    Cancel {
        /// The command's id (`jioctl commands list` shows them)
        #[arg(value_parser = fleet_commands::parse_id)]
        id: CommandId,
        /// Why (recorded)
        #[arg(long)]
        reason: Option<String>,
    },
}

impl Commands {
    pub async fn run(self, ctx: &Context) -> Outcome {
        match self.cmd {
            Sub::List { limit } => list(ctx, limit).await,
            Sub::Show { id } => show(ctx, &id).await,
            Sub::Follow { id } => {
                let store = ctx.open(Access::Write).await?;
                crate::commands::run::follow(ctx, &store, &id).await
            }
            Sub::Cancel { id, reason } => cancel(ctx, &id, reason).await,
        }
    }
}

/// One listed command: its id and its record, or why it could not be read.
type Listed = (CommandId, Result<CommandRecord, String>);

/// `commands list`: the newest `limit` commands, as JSON or a table.
async fn list(ctx: &Context, limit: usize) -> Outcome {
    let schema = ctx.schema();
    let store = ctx.open(Access::Read).await?;
    let listing = store.list(&schema.commands()).await?;
    let mut recs: Vec<Listed> = listing
        .kvs
        .iter()
        .filter_map(|kv| match schema.parse(&kv.key) {
            Some(jio_common::keys::Parsed::Command(id)) => {
                Some((id, parse_json::<CommandRecord>(kv).map_err(|e| e.to_string())))
            }
            _ => None,
        })
        .collect();
    recs.sort_by(|a, b| b.0.cmp(&a.0));
    recs.truncate(limit);
    if ctx.json {
        print_list_json(&recs);
    } else {
        print_list_table(&recs);
    }
    Ok(())
}

fn print_list_json(recs: &[Listed]) {
    let v: Vec<serde_json::Value> = recs
        .iter()
        .map(|(id, r)| match r {
            Ok(r) => serde_json::to_value(r).unwrap_or_default(),
            Err(e) => serde_json::json!({ "id": id, "problem": e }),
        })
        .collect();
    println!("{}", serde_json::Value::Array(v));
}

fn print_list_table(recs: &[Listed]) {
    if recs.is_empty() {
        println!("no fleet commands");
        return;
    }
    println!(
        "{:<40}  {:<9}  {:>5}  {:<20}  COMMAND",
        "ID", "STATE", "HOSTS", "BY"
    );
    for (id, r) in recs {
        match r {
            Ok(r) => println!(
                "{:<40}  {:<9}  {:>5}  {:<20}  {}",
                id.as_str(),
                r.state.name(),
                r.hosts.len(),
                r.created_by,
                r.command_line()
            ),
            Err(e) => println!("{:<40}  unreadable: {e}", id.as_str()),
        }
    }
}

/// `commands show ID`: the record, its history and problems, and every host's result.
async fn show(ctx: &Context, id: &CommandId) -> Outcome {
    let store = ctx.open(Access::Read).await?;
    let r = fleet_commands::read(&store, ctx.schema(), &ctx.config.role_pattern, id)
        .await
        .map_err(fleet_commands::failure)?;
    if ctx.json {
        println!("{}", crate::out::document(fleet_commands::json(&r)));
        return Ok(());
    }
    print_record(&r.record);
    if let Some(p) = &r.rules_problem {
        println!("problem    {p}");
    }
    for p in r.runs.problems.iter() {
        println!("problem    {p}");
    }
    println!();
    print!("{}", fleet_commands::table(&r));
    if !r.finished() {
        println!("{}", fleet_commands::progress_line(&r));
    }
    Ok(())
}

/// The head of `commands show`: what the command runs, where, and its state changes.
fn print_record(rec: &CommandRecord) {
    println!("command    {}", rec.id);
    println!("runs       {}", rec.command_line());
    println!("on         {} ({} hosts)", rec.targets, rec.hosts.len());
    println!("rules      {}", rec.rules);
    println!(
        "timeout    {}",
        rec.timeout_s.map_or("the agents' command_timeout".into(), |s| {
            jio_common::duration::format(std::time::Duration::from_secs(s))
        })
    );
    println!("state      {}", rec.state.name());
    for c in &rec.changes {
        println!(
            "           {} by {} at {}{}",
            c.state,
            c.by,
            jio_common::plan::when(c.at),
            c.reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default()
        );
    }
}

/// `commands cancel ID`: cancel it, then say what happened (failing if there was nothing to cancel).
async fn cancel(ctx: &Context, id: &CommandId, reason: Option<String>) -> Outcome {
    let store = ctx.open(Access::Write).await?;
    let c = fleet_commands::cancel(&store, ctx.schema(), &ctx.config.role_pattern, id, reason).await?;
    if ctx.json {
        print_cancel_json(id, &c);
    }
    say_cancelled(id, &c)
}

fn print_cancel_json(id: &CommandId, c: &fleet_commands::Cancelled) {
    println!(
        "{}",
        crate::out::document(serde_json::json!({
            "id": id.as_str(),
            "cancelled": c.cancelled,
            "state_before": c.before.as_ref().map(|r| r.state.name()),
            "withdrawn": c.withdrawn,
            "running": c.running,
        }))
    );
}

/// The line `commands cancel` says; no command left to cancel is a (quiet) failure.
fn say_cancelled(id: &CommandId, c: &fleet_commands::Cancelled) -> Outcome {
    let running = c.running;
    let finishing = format!(
        "{running} host{} running it finish{}",
        if running == 1 { "" } else { "s" },
        if running == 1 { "es" } else { "" }
    );
    if c.cancelled {
        crate::say!("command {id} cancelled: no host starts it any more; {finishing}");
        return Ok(());
    }
    let state = c.before.as_ref().map_or("gone (no record)", |r| r.state.name());
    if c.withdrawn > 0 {
        crate::say!(
            "command {id} is already {state}; withdrew the {} admission{} it left",
            c.withdrawn,
            if c.withdrawn == 1 { "" } else { "s" }
        );
        return Ok(());
    }
    crate::say!(
        "command {id} is already {state}: nothing to cancel{}",
        if running > 0 {
            format!(" ({finishing})")
        } else {
            String::new()
        }
    );
    Err(Failure::quiet(exit::FAILED))
}
