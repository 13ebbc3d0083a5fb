//! What every command needs: the validated configuration, the output flags, and how
//! to open the store (reading never creates an embedded store; writing may create
//! its file, never a directory). It does not run commands nor print their output.

use std::io::IsTerminal as _;
use std::time::Duration;

use jio_common::fleet::Snapshot;
use jio_common::keys::Schema;
use jio_common::store::{self, DynStore, StoreError};

use crate::config::{Config, NoStore};

/// How long opening the store retries before it is reported unreachable.
const OPEN_RETRY: Duration = Duration::from_secs(10);

/// How long a terminal waits in silence for the store before being told it is tried.
const CONNECTING_NOTE_AFTER: Duration = Duration::from_secs(1);

/// Whether a command writes (and so may create a missing embedded store file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// The context a command runs in.
pub struct Context {
    pub config: Config,
    /// `--json`: machine-readable output on stdout.
    pub json: bool,
    /// `-v` count.
    pub verbose: u8,
}

impl Context {
    pub fn schema(&self) -> &Schema {
        &self.config.schema
    }

    /// Opens the store: with `Access::Read` an embedded store that does not exist is
    /// an error, with `Access::Write` its file is created (its directory never is).
    /// On a terminal (not under `--json`), a store that has not answered within a
    /// second is said to be tried, so that the wait before an error is explained.
    pub async fn open(&self, access: Access) -> anyhow::Result<DynStore> {
        let cfg = &self.config;
        let create = match access {
            Access::Read => store::Create::Never,
            Access::Write => store::Create::File,
        };
        let opening = store::open_opts(&cfg.store, OPEN_RETRY, create);
        let opened = if !self.json && std::io::stderr().is_terminal() {
            tokio::pin!(opening);
            match tokio::time::timeout(CONNECTING_NOTE_AFTER, &mut opening).await {
                Ok(r) => r,
                Err(_) => {
                    eprintln!(
                        "jioctl: connecting to {}: no answer yet, trying for up to {}",
                        cfg.store,
                        jio_common::duration::format(OPEN_RETRY)
                    );
                    opening.await
                }
            }
        } else {
            opening.await
        };
        if cfg.store_given {
            return Ok(opened?);
        }
        let how = cfg.how_to_give_a_store();
        match opened {
            Ok(s) => {
                eprintln!(
                    "jioctl: no store configured ({how}); using the embedded store {}",
                    cfg.store
                );
                Ok(s)
            }
            // The embedded store of the default path (or its directory) is missing:
            // that no store was given is the news, more than that file.
            Err(StoreError::InvalidUrl { reason, .. }) => Err(NoStore { how, reason }.into()),
            Err(e) => Err(e.into()),
        }
    }

    /// Reads a snapshot, with the configured role rule for unregistered hosts.
    pub async fn snapshot(&self, store: &DynStore) -> Result<Snapshot, StoreError> {
        let mut snap = Snapshot::read(store, self.schema()).await?;
        snap.role_pattern = self.config.role_pattern.clone();
        snap.now = Some(jio_common::time::unix_now());
        Ok(snap)
    }

    /// Like `snapshot`, and every value it could not understand is reported (by
    /// key) on stderr; the rest is used as it is.
    pub async fn snapshot_warned(&self, store: &DynStore) -> Result<Snapshot, StoreError> {
        let snap = self.snapshot(store).await?;
        for p in &snap.problems {
            eprintln!("jioctl: warning: {p}");
        }
        Ok(snap)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design

    use super::*;

    /// No store given and the default embedded store missing: the error says the
    /// three ways to give one (the file by its path), exit 64, and nothing is created.
    #[tokio::test]
    async fn no_store_configured_names_the_flag_the_variable_and_the_file() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("jioctl.toml");
        std::fs::write(&file, "").unwrap();
        let mut config = crate::config::load(Some(&file), &Default::default(), |_| None).unwrap();
        assert!(!config.store_given);
        let embedded = d.path().join("state/store.db");
        config.store = store::StoreUrl::parse(&format!("sqlite://{}", embedded.display())).unwrap();
        let ctx = Context {
            config,
            json: false,
            verbose: 0,
        };
        for access in [Access::Read, Access::Write] {
            let Err(e) = ctx.open(access).await else {
                panic!("{access:?}: opened a store nobody configured");
            };
            let said = format!("{e:#}");
            for part in [
                "no store configured: give --store URL, set JIO_STORE, or write store = \"URL\" in ",
                &file.display().to_string(),
                &d.path().join("state").display().to_string(),
            ] {
                assert!(said.contains(part), "{access:?}: {said}");
            }
            let f = crate::exit::Failure::from(e);
            assert_eq!(f.code(), crate::exit::USAGE, "{access:?}: {said}");
        }
        assert!(!d.path().join("state").exists());
    }
}
