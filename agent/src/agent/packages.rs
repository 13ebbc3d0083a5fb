//! The agent's side of package snapshots: which snapshot a run writes (read from
//! the store when the run is about to start), the set a run started from, the
//! set its successful result records (stored once under its digest), and the
//! result kept up to date when dpkg's status changes while the host is idle.

use jio_common::names::Version;
use jio_common::packages::PackageSet;
use jio_common::store::{Compare, Op, Txn};
use jio_common::values::HostResult;

use super::Agent;
use crate::decide::Observation;
use crate::packages::{self, PackageStep};
use crate::results;

impl Agent {
    /// The package step of a run to `version`: the host's setting, else the
    /// store's template as the pass read it (the run's start is fenced on it).
    pub(super) fn package_step(&self, version: &Version, obs: &Observation) -> PackageStep {
        let key = self.cfg.schema.package_source();
        let stored = obs.package_source.as_deref().map(|v| (key.as_str(), v));
        PackageStep::of(&self.cfg.packages.source, stored, version)
    }

    /// Keeps the installed set the run starts from in its directory.
    pub(super) fn packages_before(&self, run_dir: &std::path::Path) {
        packages::save_before(&self.cfg.packages, run_dir);
    }

    /// A successful run's result records the installed set (and what the run
    /// changed); the set itself is stored once under its digest.
    pub(super) async fn attach_packages(&mut self, result: &mut HostResult, run_dir: &std::path::Path) {
        if !result.ok {
            return;
        }
        let Some((record, set)) = packages::after_run(&self.cfg.packages, run_dir, result.at) else {
            return;
        };
        self.store_set(&record.digest, &set).await;
        tracing::info!(digest = %record.digest, packages = record.count, changed = record.changed_count, "installed package set recorded");
        self.dpkg_stamp = packages::status_stamp(&self.cfg.packages);
        result.packages = Some(record);
    }

    /// Stores `set` under `digest` unless it is there (sets never change under a
    /// digest): one conditional transaction, which writes nothing when another
    /// host stored the set first. A set that cannot be stored now is kept and
    /// stored by a later idle pass (the result already refers to it).
    async fn store_set(&mut self, digest: &str, set: &PackageSet) {
        let key = self.cfg.schema.package_set(digest);
        let put = Txn::new()
            .when(Compare::ModRevision(key.clone(), 0))
            .then(Op::put(key.clone(), set.to_text()));
        match self.store.txn(put).await {
            Ok(_) => self.unstored_set = None,
            Err(e) => {
                tracing::warn!(key = %key, error = %e, "cannot store the installed package set now; trying again while idle");
                self.unstored_set = Some((digest.to_string(), set.clone()));
            }
        }
    }

    /// While idle: a set not stored yet is stored; and when dpkg's status file
    /// changed since it was last read (someone installed or removed packages by
    /// hand: drift), or the successful result at the local version carries no set
    /// (a composable rollout's step wrote it), the result takes the set now.
    pub(super) async fn follow_packages(&mut self, obs: &Observation) {
        if let Some((digest, set)) = self.unstored_set.take() {
            self.store_set(&digest, &set).await;
        }
        let Some(local) = obs.local.as_ref() else { return };
        let stamp = packages::status_stamp(&self.cfg.packages);
        let unrecorded = obs
            .result
            .as_ref()
            .is_some_and(|r| r.ok && &r.version == local && r.packages.is_none());
        if stamp.is_none() || (stamp == self.dpkg_stamp && !unrecorded) {
            return;
        }
        let Some(Ok(set)) = packages::read_installed(&self.cfg.packages) else {
            return;
        };
        let digest = set.digest();
        let now = self.clock.unix_now();
        let key = self.cfg.schema.result(&self.cfg.hostname);
        let change = |r: &mut HostResult| results::packages_changed(r, local, &set, &digest, now);
        match results::update(&self.store, &key, change).await {
            Ok(changed) => {
                if changed {
                    self.store_set(&digest, &set).await;
                    tracing::warn!(%digest, "the installed packages differ from the set the result recorded; the result records the new set");
                }
                self.dpkg_stamp = stamp;
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot record the installed packages now; trying again later")
            }
        }
    }
}
