//! `jioctl status [--role R] [--watch]`: the fleet by state and role, once or on
//! every change (a watch, not polling).

use std::io::IsTerminal as _;

use std::collections::BTreeSet;

use clap::Args;
use futures_util::StreamExt as _;
use jio_common::command::{Targets, resolve_targets};
use jio_common::fleet::{self, Snapshot};
use jio_common::names::Role;

use crate::context::{Access, Context};
use crate::exit::{Failure, Outcome};
use crate::status::{only_role, to_json, to_text};

#[derive(Args, Debug)]
pub struct Status {
    /// Only the hosts of this role (a role the fleet has)
    #[arg(long)]
    role: Option<Role>,
    /// Redraw on every change
    #[arg(long)]
    watch: bool,
}

impl Status {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let store = ctx.open(Access::Read).await?;
        let mut stream = None;
        let mut checked = false;
        loop {
            let snap = ctx.snapshot(&store).await?;
            if let Some(r) = self.role.as_ref().filter(|_| !checked) {
                checked = true;
                if let Err(errors) = resolve_targets(&Targets::Roles(vec![r.clone()]), &snap) {
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
            }
            self.draw(ctx, &snap, store.url())?;
            if !self.watch {
                return Ok(());
            }
            if stream.is_none() {
                stream = Some(store.watch(&ctx.schema().root(), snap.revision + 1).await?);
            }
            let Some(w) = stream.as_mut() else { continue };
            match w.next().await {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => return Ok(()),
            }
            // Coalesce a burst of changes into one redraw.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            while let Some(Some(_)) = futures_util::FutureExt::now_or_never(w.next()) {}
        }
    }

    fn draw(&self, ctx: &Context, snap: &Snapshot, url: &str) -> Outcome {
        let hosts = only_role(fleet::classify(snap), self.role.as_ref());
        if ctx.json {
            let v = to_json(snap, &hosts, jio_common::time::unix_now());
            if self.watch {
                // JSON lines: one compact document per change.
                let mut line = serde_json::Map::new();
                line.insert("type".into(), "status".into());
                line.insert("schema".into(), crate::out::JSON_SCHEMA.into());
                if let serde_json::Value::Object(m) = v {
                    line.extend(m);
                }
                println!("{}", serde_json::Value::Object(line));
            } else {
                println!("{}", crate::out::document(v));
            }
            return Ok(());
        }
        let tty = std::io::stdout().is_terminal();
        if self.watch && tty {
            print!("\x1b[H\x1b[2J");
        }
        print!("{}", to_text(snap, &hosts, url, jio_common::time::unix_now()));
        if self.watch && !tty {
            println!("--");
        }
        Ok(())
    }
}
