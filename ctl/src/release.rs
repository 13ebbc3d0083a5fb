//! Writes that could let hosts start at once, outside any rolling rules
//! (`trigger-update`, `enable-puppet true --global`): counted on a snapshot, refused
//! unless `--force`, and written fenced on the epoch the count was made at.

use std::collections::BTreeMap;

use jio_common::fleet::{self, HostState, Snapshot};
use jio_common::names::HostName;
use jio_common::store::{Compare, DynStore, Op, StoreError, Txn};

use crate::context::Context;
use crate::exit::Failure;
use crate::writes;

/// The hosts a write of `after` would let start at once, outside any rules: hosts
/// whose gate would open, that are not at the desired version and not already moving.
pub fn released_by(before: &Snapshot, after: &Snapshot) -> Vec<HostName> {
    let was: BTreeMap<_, _> = fleet::classify(before)
        .into_iter()
        .map(|h| (h.host, h.state))
        .collect();
    fleet::classify(after)
        .into_iter()
        .filter(|h| {
            matches!(h.state, HostState::Upgrading | HostState::Lost)
                && h.reason.is_none()
                && !matches!(was.get(&h.host), Some(HostState::Upgrading | HostState::Lost))
        })
        .map(|h| h.host)
        .collect()
}

/// A fenced single write: applied only if the epoch has not moved since `snap` (what
/// the release count was computed on).
pub async fn write_checked(
    store: &DynStore,
    schema: &jio_common::keys::Schema,
    ops: Vec<Op>,
    snap: &Snapshot,
) -> Result<bool, StoreError> {
    let mut txn = Txn::new().when(Compare::ModRevision(schema.lock(fleet::EPOCH), snap.epoch));
    txn.ops = ops;
    txn.ops.push(Op::put(
        schema.lock(fleet::EPOCH),
        serde_json::to_string(&writes::holder()).unwrap_or_default(),
    ));
    Ok(store.txn(txn).await?.committed())
}

/// Writes `ops` (which `change` describes on a snapshot) unless they would let hosts
/// start at once outside any rolling rules; `force` writes anyway. Refused: exit 64,
/// nothing written.
pub async fn release_checked(
    ctx: &Context,
    store: &DynStore,
    ops: impl Fn(&Snapshot) -> Vec<Op>,
    force: bool,
    what: &str,
    change: impl Fn(&mut Snapshot),
) -> Result<(), Failure> {
    loop {
        let before = ctx.snapshot(store).await?;
        let mut after = before.clone();
        change(&mut after);
        let released = released_by(&before, &after);
        if !released.is_empty() && !force {
            return Err(Failure::usage(format!(
                "{what} would release {} host(s) at once, outside any rolling rules ({}{}); nothing was written. Use `jioctl upgrade` to roll out under the rules, or --force",
                released.len(),
                released
                    .iter()
                    .take(8)
                    .map(|h| h.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                if released.len() > 8 { ", ..." } else { "" }
            )));
        }
        if write_checked(store, ctx.schema(), ops(&before), &before).await? {
            if !released.is_empty() {
                eprintln!(
                    "jioctl: --force: {} host(s) released at once, outside any rolling rules",
                    released.len()
                );
            }
            return Ok(());
        }
        // Something changed what the count was computed on: count again.
    }
}
