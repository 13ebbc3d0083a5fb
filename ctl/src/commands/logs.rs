//! `jioctl logs HOST [--version V] [--phase configured|validated]`: print the run
//! log linked from the host's status entry, fetched from Swift.

use std::io::Write as _;
use std::path::PathBuf;

use clap::Args;
use jio_common::keys::{Outcome as StepOutcome, Step};
use jio_common::names::{HostName, Version};
use jio_common::store::{DynStore, KeyValue};
use jio_common::swift::{SwiftClient, SwiftSettings};

use crate::context::{Access, Context};
use crate::exit::{self, Failure, Outcome};

#[derive(Args, Debug)]
pub struct Logs {
    /// The host whose run (or fleet command) output to print
    host: HostName,
    /// The output of a fleet command on HOST instead (its id, from jioctl commands list)
    #[arg(long, value_parser = crate::fleet_commands::parse_id, conflicts_with_all = ["version", "phase"])]
    command: Option<jio_common::names::CommandId>,
    /// The version [default: the current version]
    #[arg(long)]
    version: Option<Version>,
    /// Which step's log [default: the host's entry for the version]
    #[arg(long, value_parser = ["configured", "validated"])]
    phase: Option<String>,
    /// Swift auth URL [default: from [swift] in the configuration]
    #[arg(long)]
    swift_auth_url: Option<String>,
    /// Swift user (TempAuth account:user, or Keystone user)
    #[arg(long)]
    swift_user: Option<String>,
    /// File holding the Swift key (mode 0600)
    #[arg(long)]
    swift_key_file: Option<PathBuf>,
}

fn failed(msg: impl std::fmt::Display) -> Failure {
    Failure::new(exit::FAILED, msg.to_string())
}

impl Logs {
    pub async fn run(mut self, ctx: &Context) -> Outcome {
        if let Some(id) = self.command.take() {
            // What the store says first: a command that does not exist, or a host
            // that uploaded nothing, is said without asking for Swift credentials.
            let store = ctx.open(Access::Read).await?;
            let link = self.command_link(ctx, &store, &id).await?;
            let settings = self.swift_settings(ctx.config.swift.clone())?;
            let client = SwiftClient::new(settings).map_err(Failure::usage)?;
            let body = client.fetch(&link).await.map_err(failed)?;
            return print_log(ctx, &self.host, &body);
        }
        let settings = self.swift_settings(ctx.config.swift.clone())?;
        let client = SwiftClient::new(settings).map_err(Failure::usage)?;
        let store = ctx.open(Access::Read).await?;
        let version = match self.version.take() {
            Some(v) => v,
            None => current_version(ctx, &store).await?,
        };
        let kv = self.entry(ctx, &store, &version).await?;
        if kv.not_text {
            return Err(failed(format!(
                "{} holds a value that is not UTF-8 text ({})",
                kv.key, kv.value
            )));
        }
        if kv.value.is_empty() {
            return Err(failed(format!(
                "{} has no log link yet (the upload is still queued on the host, or Swift is not configured there)",
                kv.key
            )));
        }
        if !crate::status::is_link(&kv.value) {
            return Err(failed(format!(
                "{} has no log link; the agent reported: {}",
                kv.key, kv.value
            )));
        }
        let body = client.fetch(&kv.value).await.map_err(failed)?;
        print_log(ctx, &self.host, &body)
    }

    /// The link to the host's output of the fleet command `id`, which its agent
    /// wrote once the upload was done; or why there is none.
    async fn command_link(
        &self,
        ctx: &Context,
        store: &DynStore,
        id: &jio_common::names::CommandId,
    ) -> Result<String, Failure> {
        use jio_common::keys::RunPart;
        let schema = ctx.schema();
        if store.get(&schema.command(id)).await?.is_none() {
            return Err(failed(format!(
                "no fleet command {id} (jioctl commands list shows them)"
            )));
        }
        let result_key = schema.command_run(id, RunPart::Results, &self.host);
        let result = store.get(&result_key).await?;
        let run_dir = result
            .as_ref()
            .and_then(|kv| {
                jio_common::values::parse_json::<jio_common::command_record::CommandResult>(kv).ok()
            })
            .and_then(|r| r.run_dir);
        let key = schema.command_run(id, RunPart::Logs, &self.host);
        let on_host = run_dir
            .map(|d| format!("; its output is in {d} on {}", self.host))
            .unwrap_or_default();
        let Some(kv) = store.get(&key).await? else {
            return Err(failed(match result {
                None => format!(
                    "{} has no result for command {id} yet (not run, or still running)",
                    self.host
                ),
                Some(_) => format!(
                    "{} ran command {id} but no log was uploaded (Swift is not configured on the host){on_host}",
                    self.host
                ),
            }));
        };
        if kv.value.is_empty() {
            return Err(failed(format!(
                "{key} has no log link yet (the upload is still queued on the host){on_host}"
            )));
        }
        if !crate::status::is_link(&kv.value) {
            return Err(failed(format!("{key} does not hold a link: {}", kv.value)));
        }
        Ok(kv.value)
    }

    /// The host's status entry for `version` (of `--phase` when given).
    async fn entry(&self, ctx: &Context, store: &DynStore, version: &Version) -> Result<KeyValue, Failure> {
        let phase = self.phase.as_deref();
        let mut found = None;
        for step in Step::ALL {
            if phase.is_some_and(|p| p != step.as_str()) {
                continue;
            }
            for outcome in StepOutcome::ALL {
                let key = ctx.schema().status(step, outcome, version, &self.host);
                if let Some(kv) = store.get(&key).await? {
                    found = Some(kv);
                }
            }
        }
        found.ok_or_else(|| {
            failed(format!(
                "{} has no {}status entry for {version}",
                self.host,
                phase.map(|p| format!("{p} ")).unwrap_or_default()
            ))
        })
    }

    /// The Swift settings: flags over the configuration's `[swift]` section.
    fn swift_settings(&mut self, file: Option<SwiftSettings>) -> Result<SwiftSettings, Failure> {
        let (auth_url, user, key_file) = (
            self.swift_auth_url.take(),
            self.swift_user.take(),
            self.swift_key_file.take(),
        );
        match (file, auth_url, user, key_file) {
            (Some(mut s), auth_url, user, key_file) => {
                s.auth_url = auth_url.unwrap_or(s.auth_url);
                s.user = user.unwrap_or(s.user);
                s.key_file = key_file.unwrap_or(s.key_file);
                Ok(s)
            }
            (None, Some(auth_url), Some(user), Some(key_file)) => {
                Ok(SwiftSettings::new(auth_url, user, key_file))
            }
            _ => Err(Failure::usage(
                "no Swift credentials: add a [swift] section (auth_url, user, key_file) to the configuration, or give --swift-auth-url, --swift-user and --swift-key-file",
            )),
        }
    }
}

async fn current_version(ctx: &Context, store: &DynStore) -> Result<Version, Failure> {
    match store.get(&ctx.schema().current_version()).await? {
        Some(kv) => match jio_common::values::parse_version(&kv)? {
            Some(v) => Ok(v),
            None => Err(failed("/current_version is empty; give --version")),
        },
        None => Err(failed("/current_version is not set; give --version")),
    }
}

/// The log as fetched (`--json`: `{"schema", "host", "log"}`). A reader that left
/// (`jioctl logs H | head`) ends it quietly, as a closed pipe ends any command.
fn print_log(ctx: &Context, host: &HostName, body: &[u8]) -> Outcome {
    let written = if ctx.json {
        let doc = crate::out::document(serde_json::json!({
            "host": host,
            "log": String::from_utf8_lossy(body),
        }));
        writeln!(std::io::stdout(), "{doc}")
    } else {
        std::io::stdout()
            .write_all(body)
            .and_then(|()| std::io::stdout().flush())
    };
    match written {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(Failure::quiet(exit::CLOSED_OUTPUT)),
        other => Ok(other?),
    }
}
