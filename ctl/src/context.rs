//! What every command needs: the validated configuration, the output flags, and how
//! to open the store (reading never creates an embedded store; writing may create
//! its file, never a directory). It does not run commands nor print their output.

use jio_common::fleet::Snapshot;
use jio_common::keys::Schema;
use jio_common::store::{self, DynStore, StoreError};

use crate::config::Config;

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
    pub async fn open(&self, access: Access) -> Result<DynStore, StoreError> {
        let cfg = &self.config;
        if !cfg.store_given {
            eprintln!(
                "jioctl: no store configured; using the embedded store {}",
                cfg.store
            );
        }
        let create = match access {
            Access::Read => store::Create::Never,
            Access::Write => store::Create::File,
        };
        store::open_opts(&cfg.store, std::time::Duration::from_secs(10), create).await
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
