//! `jioctl repo set|show|check|unset`: the site's package snapshot template
//! (`/config_state/package_source`), which every agent reads before a run unless
//! its own `package_source` says otherwise.

use clap::{Args, Subcommand};
use jio_common::names::Version;
use jio_common::packages::{SourceTemplate, redact_userinfo};
use jio_common::store::{Compare, DynStore, Op, Txn, TxnOutcome};
use serde_json::json;

use crate::context::{Access, Context};
use crate::exit::{self, Failure, Outcome};
use crate::snapshots;

#[derive(Args, Debug)]
pub struct Repo {
    #[command(subcommand)]
    command: RepoCommand,
}

#[derive(Subcommand, Debug)]
enum RepoCommand {
    /// Set the template: one sources line with {version}, e.g. 'deb [signed-by=/usr/share/keyrings/site.gpg] http://repo.example/snapshots/{version} bookworm main'
    #[command(after_help = examples!(
        ("jioctl repo set 'deb http://repo.example/snapshots/{version} bookworm main'", "a version is now the snapshot of that name"),
    ))]
    Set {
        /// The template (quote it: it holds spaces)
        template: String,
        /// Set it even while a rollout is active, or when the current version has no snapshot under it
        #[arg(long)]
        force: bool,
    },
    /// Print the template (user and password of its URL hidden)
    #[command(after_help = examples!(
        ("jioctl repo show", "the template"),
    ))]
    Show,
    /// Check that VERSION's snapshot exists: fetch its InRelease or Release
    #[command(after_help = examples!(
        ("jioctl repo check v42", "fetch v42's InRelease or Release: does its snapshot exist?"),
    ))]
    Check {
        /// The version to check
        version: Version,
    },
    /// Delete the stored package sets no host refers to any more
    #[command(after_help = examples!(
        ("jioctl repo prune", "delete the package sets no host refers to any more"),
    ))]
    Prune,
    /// Remove the template: agents keep their apt sources as they are
    #[command(after_help = examples!(
        ("jioctl repo unset", "remove the template; agents keep their apt sources"),
    ))]
    Unset {
        /// Remove it even while a rollout is active
        #[arg(long)]
        force: bool,
    },
}

impl Repo {
    pub async fn run(self, ctx: &Context) -> Outcome {
        match self.command {
            RepoCommand::Show => show(ctx).await,
            RepoCommand::Check { version } => check(ctx, &version).await,
            RepoCommand::Set { template, force } => set(ctx, &template, force).await,
            RepoCommand::Unset { force } => unset(ctx, force).await,
            RepoCommand::Prune => prune(ctx).await,
        }
    }
}

async fn show(ctx: &Context) -> Outcome {
    let store = ctx.open(Access::Read).await?;
    let t = snapshots::template(&store, ctx.schema()).await?;
    let shown = t.as_ref().map(|t| redact_userinfo(t.as_str()));
    if ctx.json {
        println!("{}", crate::out::document(json!({"package_source": shown})));
    } else {
        match &shown {
            Some(t) => println!("{t}"),
            None => println!("no package snapshot template: agents keep their apt sources as they are"),
        }
    }
    Ok(())
}

async fn check(ctx: &Context, version: &Version) -> Outcome {
    let store = ctx.open(Access::Read).await?;
    let Some(t) = snapshots::template(&store, ctx.schema()).await? else {
        return Err(Failure::new(
            exit::FAILED,
            "no package snapshot template is set (jioctl repo set TEMPLATE)",
        ));
    };
    let snap = t.snapshot(version).map_err(Failure::usage)?;
    match snapshots::fetch_release(&ctx.config.repo, &snap).await {
        Ok(url) => {
            if ctx.json {
                println!(
                    "{}",
                    crate::out::document(json!({"version": version, "found": true, "url": url}))
                );
            } else {
                println!("{version}: {url}");
            }
            Ok(())
        }
        Err(why) => {
            if ctx.json {
                println!(
                    "{}",
                    crate::out::document(json!({"version": version, "found": false, "why": why}))
                );
            }
            Err(Failure::new(
                exit::FAILED,
                format!("{version} has no readable package snapshot: {why}"),
            ))
        }
    }
}

/// Refuses a change of template while a rollout is active (its hosts would not
/// all get the same bits), or while `/rollouts/current` cannot be read, unless
/// `force`. Returns the compare the write is fenced on: `/rollouts/current` as read.
async fn refuse_during_rollout(
    ctx: &Context,
    store: &DynStore,
    force: bool,
    what: &str,
) -> Result<Compare, Failure> {
    let snap = ctx.snapshot(store).await?;
    let key = ctx.schema().current_rollout();
    let revision = store.get(&key).await?.map_or(0, |kv| kv.mod_revision);
    let fence = Compare::ModRevision(key, revision);
    if force {
        return Ok(fence);
    }
    match snap.rollout.as_ref().map(|c| c.ok()) {
        Some(Some(r)) if r.state.active() => Err(Failure::usage(format!(
            "{what}: rollout {} to {} is active, and its hosts left would get other packages than those done; nothing was written (wait for it to end, or give --force)",
            r.id, r.version
        ))),
        Some(None) => Err(Failure::usage(format!(
            "{what}: /rollouts/current cannot be read, so a rollout may be active; nothing was written (fix or remove it, or give --force)"
        ))),
        _ => Ok(fence),
    }
}

/// Writes `op` fenced on `fence`; a rollout that started meanwhile is refused.
async fn write_fenced(store: &DynStore, fence: Compare, op: Op, what: &str) -> Outcome {
    match store.txn(Txn::new().when(fence).then(op)).await? {
        TxnOutcome::Committed(_) => Ok(()),
        TxnOutcome::Lost(_) => Err(Failure::usage(format!(
            "{what}: a rollout started or ended while this ran; nothing was written (run it again)"
        ))),
    }
}

async fn set(ctx: &Context, template: &str, force: bool) -> Outcome {
    let t = SourceTemplate::parse(template).map_err(Failure::usage)?;
    let store = ctx.open(Access::Write).await?;
    let fence = refuse_during_rollout(ctx, &store, force, "repo set").await?;
    // The version hosts run now must have a snapshot under the new template: a
    // repair or a retry would install from it.
    if let Some(kv) = store.get(&ctx.schema().current_version()).await?
        && let Ok(Some(current)) = jio_common::values::parse_version(&kv)
    {
        let snap = t.snapshot(&current).map_err(|e| {
            Failure::usage(format!("repo set: the current version: {e}; nothing was written"))
        })?;
        if force {
            crate::say!("warning: --force: the package snapshot of {current} was not checked");
        } else if let Err(why) = snapshots::fetch_release(&ctx.config.repo, &snap).await {
            return Err(Failure::usage(format!(
                "repo set: the current version {current} has no readable package snapshot under this template ({why}); nothing was written (give --force to set it all the same)"
            )));
        }
    }
    let key = ctx.schema().package_source();
    write_fenced(&store, fence, Op::put(key, t.as_str().to_string()), "repo set").await?;
    crate::say!(
        "package snapshot template set: {} (agents write it before apt-get update, from their next run)",
        redact_userinfo(t.as_str())
    );
    Ok(())
}

async fn unset(ctx: &Context, force: bool) -> Outcome {
    let store = ctx.open(Access::Write).await?;
    let fence = refuse_during_rollout(ctx, &store, force, "repo unset").await?;
    if store.get(&ctx.schema().package_source()).await?.is_none() {
        crate::say!("no package snapshot template was set: nothing to remove");
        return Ok(());
    }
    write_fenced(
        &store,
        fence,
        Op::Delete(ctx.schema().package_source()),
        "repo unset",
    )
    .await?;
    crate::say!(
        "package snapshot template removed: from their next run, agents remove the sources entry and pin they wrote and keep the rest of their apt sources as they are"
    );
    Ok(())
}

async fn prune(ctx: &Context) -> Outcome {
    let store = ctx.open(Access::Write).await?;
    let gone = snapshots::prune(&store, ctx.schema()).await?;
    if ctx.json {
        println!("{}", crate::out::document(json!({"deleted": gone})));
    } else {
        crate::say!("deleted {} stored package set(s) no host refers to", gone.len());
    }
    Ok(())
}
