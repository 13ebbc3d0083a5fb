//! `jioctl status [--role R] [--watch]`: the fleet by state and role, once or on
//! every change (a watch, not polling).

use std::io::IsTerminal as _;

use std::collections::BTreeSet;

use clap::Args;
use futures_util::StreamExt as _;
use jio_common::command::resolve_targets;
use jio_common::command_record::Targets;
use jio_common::fleet::{self, Snapshot};
use jio_common::names::Role;

use jio_common::keys::Parsed;
use jio_common::store::{DynStore, ErrorKind, StoreError, WatchEvent, WatchStream};

use crate::context::{Access, Context};
use crate::exit::{Failure, Outcome};
use crate::status::{admission_of, only_role, to_text};
use crate::status_json::StatusJson;
use crate::status_view::{Layout, fit_height, terminal};

/// A host `status` exits 1 for: failed, lost, or without a live agent while it
/// is not upgraded (upgrading, pending or blocked: nothing moves it until its
/// agent is back).
fn troubled(snap: &Snapshot, h: &fleet::HostStatus) -> bool {
    use fleet::HostState::*;
    match h.state {
        Failed | Lost => true,
        Upgrading | Pending | Blocked => !snap.agents.contains_key(&h.host),
        Upgraded | Unknown => false,
    }
}

/// What ended a wait for a change.
enum Woken {
    /// Something changed: read again and redraw.
    Changed,
    /// The store went, or is back: read again, on a new watch.
    Reopen,
    /// The watch ended.
    Ended,
}

/// How long `--watch` waits without any change before it checks that the store
/// is still there.
const QUIET: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Args, Debug)]
pub struct Status {
    /// Only the hosts of this role (a role the fleet has)
    #[arg(long)]
    role: Option<Role>,
    /// Redraw on every change
    #[arg(long)]
    watch: bool,
    /// Every host on its own line too (at fleet size the view groups them)
    #[arg(long = "hosts", short = 'w', alias = "wide")]
    wide: bool,
    /// `--watch`: when the view drawn was read.
    #[arg(skip)]
    read_at: std::cell::Cell<u64>,
}

/// How long a `--watch` check that the store is there may take: a frozen store
/// answers nothing, and the view must say so.
const PING: std::time::Duration = std::time::Duration::from_secs(3);

impl Status {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let store = ctx.open(Access::Read).await?;
        let mut stream = None;
        let mut checked = false;
        // `--watch`: since when the store cannot be reached (said once per outage).
        let mut unreachable: Option<u64> = None;
        loop {
            let snap = match ctx.snapshot(&store).await {
                Ok(s) => s,
                Err(e) if self.watch && checked && e.kind() == ErrorKind::Unavailable => {
                    self.unreachable(ctx, &mut unreachable, &e);
                    stream = None;
                    tokio::time::sleep(QUIET).await;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            unreachable = None;
            if !checked {
                self.check_role(&snap)?;
            }
            checked = true;
            let role = self.role.as_ref();
            let drift = crate::drift::Drift::load_of(&store, ctx.schema(), &snap, |h| {
                role.is_none_or(|r| &snap.role_of(h) == r)
            })
            .await;
            let label = crate::status::store_label(store.url(), ctx.schema());
            let troubled = self.draw(ctx, &snap, &label, &drift)?;
            if !self.watch {
                // Like a check: 1 when a host shown has failed or is lost (the
                // output above says which), so a script or a probe can act on it.
                return if troubled {
                    Err(Failure::quiet(crate::exit::FAILED))
                } else {
                    Ok(())
                };
            }
            if stream.is_none() {
                match store.watch(&ctx.schema().root(), snap.revision + 1).await {
                    Ok(w) => stream = Some(w),
                    Err(e) if e.kind() == ErrorKind::Unavailable => {
                        self.unreachable(ctx, &mut unreachable, &e);
                        tokio::time::sleep(QUIET).await;
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            let Some(w) = stream.as_mut() else { continue };
            match self.wait_for_change(ctx, &store, w, &mut unreachable).await? {
                Woken::Changed => {}
                Woken::Reopen => {
                    stream = None;
                    continue;
                }
                Woken::Ended => return Ok(()),
            }
            // Coalesce a burst of changes into one redraw.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            while let Some(Some(_)) = futures_util::FutureExt::now_or_never(w.next()) {}
        }
    }

    /// `--role`: a role the fleet does not have is a usage error naming the roles
    /// it has.
    fn check_role(&self, snap: &Snapshot) -> Result<(), Failure> {
        if let Some(r) = self.role.as_ref()
            && let Err(errors) = resolve_targets(&Targets::Roles(vec![r.clone()]), snap)
        {
            let roles: BTreeSet<Role> = snap.hosts().iter().map(|h| snap.role_of(h)).collect();
            let roles: Vec<&str> = roles.iter().map(Role::as_str).collect();
            return Err(Failure::usage(format!(
                "{} (the fleet's roles: {})",
                errors.join("; "),
                if roles.is_empty() {
                    "none".into()
                } else {
                    roles.join(", ")
                }
            )));
        }
        Ok(())
    }

    /// Waits for a change; when all is quiet for a while, makes sure the store
    /// is still there (a frozen store sends no event and no error).
    async fn wait_for_change(
        &self,
        ctx: &Context,
        store: &DynStore,
        w: &mut WatchStream,
        unreachable: &mut Option<u64>,
    ) -> Result<Woken, Failure> {
        loop {
            match tokio::time::timeout(QUIET, w.next()).await {
                // An agent's clock, rewritten every minute, changes no view.
                Ok(Some(Ok(WatchEvent::Put(kv))))
                    if matches!(ctx.schema().parse(&kv.key), Some(Parsed::Clock(_))) => {}
                Ok(Some(Ok(_))) => return Ok(Woken::Changed),
                Ok(Some(Err(e))) if e.kind() == ErrorKind::Unavailable => {
                    self.unreachable(ctx, unreachable, &e);
                    return Ok(Woken::Reopen);
                }
                Ok(Some(Err(e))) => return Err(e.into()),
                Ok(None) => return Ok(Woken::Ended),
                Err(_quiet) => match bounded_ping(store).await {
                    // Back: read again and redraw, on a new watch.
                    Ok(_) if unreachable.is_some() => return Ok(Woken::Reopen),
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::Unavailable => {
                        self.unreachable(ctx, unreachable, &e);
                    }
                    Err(e) => return Err(e.into()),
                },
            }
        }
    }

    /// Says, once per outage, that the view drawn is as of before the store went.
    fn unreachable(&self, ctx: &Context, since: &mut Option<u64>, e: &StoreError) {
        if since.is_some() {
            return;
        }
        let now = jio_common::time::unix_now();
        *since = Some(now);
        if ctx.json {
            println!(
                "{}",
                serde_json::json!({
                    "type": "unreachable",
                    "schema": crate::out::JSON_SCHEMA,
                    "since": now,
                    "error": e.to_string(),
                })
            );
        } else {
            let line = format!(
                "STORE UNREACHABLE since {} ({e}); the view is as of {}, redrawn once the store answers",
                jio_common::time::utc_display(now),
                jio_common::time::utc_display(self.read_at.get())
            );
            if std::io::stdout().is_terminal() && terminal().is_some() {
                // Over the view's first line (its "as of"), so it is seen first.
                let cols = terminal().map(|(_, c)| c);
                print!(
                    "\x1b[s\x1b[H\x1b[2K{}\x1b[u",
                    crate::status_view::cut(&line, cols)
                );
                let _ = std::io::Write::flush(&mut std::io::stdout());
            } else {
                println!("{line}");
            }
        }
    }

    /// Draws the fleet; `true` when a host shown has failed or is lost.
    fn draw(
        &self,
        ctx: &Context,
        snap: &Snapshot,
        url: &str,
        drift: &crate::drift::Drift,
    ) -> Result<bool, Failure> {
        let now = jio_common::time::unix_now();
        self.read_at.set(now);
        let all = fleet::classify(snap);
        // What admits a host depends on the whole fleet, whatever is shown.
        let adm = admission_of(snap, &all, now);
        let hosts = only_role(all, self.role.as_ref());
        let troubled = hosts.iter().any(|h| troubled(snap, h));
        if ctx.json {
            let mut doc = StatusJson::document(snap, &hosts, &adm);
            doc.drift = Some(drift.json());
            if self.watch {
                // JSON lines: one compact document per change.
                doc.lead.insert(0, ("type", "status".into()));
                println!("{}", doc.render(false));
            } else {
                println!("{}", doc.render(true));
            }
            return Ok(troubled);
        }
        let tty = std::io::stdout().is_terminal();
        let layout = Layout::of_stdout(self.wide);
        let mut lines: Vec<String> = Vec::new();
        if self.watch {
            lines.push(format!(
                "as of {}, store revision {} (redrawn on every change)",
                jio_common::time::utc_display(now),
                snap.revision
            ));
        }
        lines.extend(to_text(snap, &hosts, &adm, url, layout).lines().map(String::from));
        lines.extend(drift_lines(drift, layout));
        match (self.watch, tty, terminal()) {
            (true, true, Some((rows, cols))) => {
                let lines: Vec<String> = fit_height(lines, rows)
                    .iter()
                    .map(|l| crate::status_view::cut(l, Some(cols)))
                    .collect();
                print!("\x1b[H\x1b[2J{}", lines.join("\n"));
                let _ = std::io::Write::flush(&mut std::io::stdout());
            }
            _ => {
                for line in lines {
                    println!("{line}");
                }
                if self.watch {
                    println!("--");
                }
            }
        }
        Ok(troubled)
    }
}

/// Package drift lines: folded to the width, and past 10 of them how many more
/// (`--hosts` shows all).
fn drift_lines(drift: &crate::drift::Drift, l: Layout) -> Vec<String> {
    const SHOWN: usize = 10;
    let all = drift.lines();
    let shown = if l.wide { all.len() } else { all.len().min(SHOWN) };
    let mut out: Vec<String> = all[..shown]
        .iter()
        .flat_map(|line| crate::status_view::fold(line, 4, l.width))
        .collect();
    if all.len() > shown {
        out.push(format!(
            "+{} more drift lines (jioctl status --hosts shows them)",
            all.len() - shown
        ));
    }
    out
}

/// The store's ping, an unanswered one after `PING` counted as unreachable.
async fn bounded_ping(store: &DynStore) -> Result<(), StoreError> {
    match tokio::time::timeout(PING, store.ping()).await {
        Ok(r) => r.map(|_| ()),
        Err(_) => Err(StoreError::Unavailable {
            url: store.url().to_string(),
            op: "ping",
            reason: format!("no answer within {} s", PING.as_secs()),
        }),
    }
}
