//! Everything jioctl writes, and how: every write of the desired version or of an
//! enable key bumps the plan epoch (`/locks/epoch`) in the same transaction, and a
//! plan is applied only while the epoch is where the plan read it. So two operators,
//! or an operator and a running `upgrade`, can never both apply a stale plan.
//!
//! Large plans are split into transactions of at most `CHUNK` ops, fewer where the
//! store allows fewer (etcd refuses more than 128 per transaction by default, Consul
//! more than 64), each fenced on the epoch the previous one left. Every prefix of a plan is safe on its own: it admits no more hosts than the
//! whole plan would.

use std::time::Duration;

use jio_common::fleet::{EPOCH, LockRecord, ROLLOUT_LOCK};
use jio_common::keys::{EnableLevel, Schema};
use jio_common::names::Version;
use jio_common::rules::Plan;
use jio_common::store::{Compare, DynStore, ErrorKind, LeaseId, Op, Revision, StoreError, Txn, TxnOutcome};
use jio_common::time::unix_now;
use jio_common::values::format_bool;
use tokio::task::JoinHandle;

/// Most plan ops in one transaction; less where the store allows fewer (Consul: 64).
pub const CHUNK: usize = 100;

/// Who is writing, as recorded in the epoch and the lock.
pub fn holder() -> LockRecord {
    LockRecord {
        holder: std::env::var("USER")
            .ok()
            .filter(|u| !u.is_empty())
            .or_else(|| {
                nix::unistd::User::from_uid(nix::unistd::getuid())
                    .ok()
                    .flatten()
                    .map(|u| u.name)
            })
            .unwrap_or_else(|| format!("uid {}", nix::unistd::getuid())),
        host: nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "unknown".into()),
        pid: std::process::id(),
        since: unix_now(),
    }
}

fn epoch_put(schema: &Schema) -> Op {
    Op::put(
        schema.lock(EPOCH),
        serde_json::to_string(&holder()).unwrap_or_default(),
    )
}

/// Applies `ops` unconditionally, with the epoch bump, in one transaction.
pub async fn write(store: &DynStore, schema: &Schema, ops: Vec<Op>) -> Result<Revision, StoreError> {
    let mut txn = Txn {
        compares: vec![],
        ops,
    };
    txn.ops.push(epoch_put(schema));
    match store.txn(txn).await? {
        TxnOutcome::Committed(r) | TxnOutcome::Lost(r) => Ok(r),
    }
}

/// `global-disable-puppet`: every role and host enable key goes, global becomes
/// false. (Not one delete of the whole tree: a store refuses a transaction that
/// deletes a key it also puts.)
pub fn global_disable_ops(schema: &Schema) -> Vec<Op> {
    vec![
        Op::DeletePrefix(schema.enable_level_prefix(true)),
        Op::DeletePrefix(schema.enable_level_prefix(false)),
        Op::put(schema.enable(&EnableLevel::Global), format_bool(false)),
    ]
}

/// Starting a rollout to `v`: global disable and the new desired version, together.
pub fn start_rollout_ops(schema: &Schema, v: &Version) -> Vec<Op> {
    let mut ops = global_disable_ops(schema);
    ops.push(Op::put(schema.current_version(), v.to_string()));
    ops
}

/// The plan's writes, in a safe order.
pub fn plan_ops(schema: &Schema, plan: &Plan) -> Vec<Op> {
    let mut ops = Vec::new();
    for r in &plan.enable_roles {
        ops.push(Op::put(
            schema.enable(&EnableLevel::Role(r.clone())),
            format_bool(true),
        ));
    }
    for h in &plan.clear_host_keys {
        ops.push(Op::Delete(schema.enable(&EnableLevel::Host(h.clone()))));
    }
    for h in &plan.enable_hosts {
        ops.push(Op::put(
            schema.enable(&EnableLevel::Host(h.clone())),
            format_bool(true),
        ));
    }
    ops
}

/// Applies `ops` if the epoch is still at `epoch`; `false` when something changed
/// first (plan again). A plan split in chunks may stop after a prefix.
pub async fn apply_fenced(
    store: &DynStore,
    schema: &Schema,
    ops: Vec<Op>,
    epoch: Revision,
) -> Result<bool, StoreError> {
    let key = schema.lock(EPOCH);
    let mut expect = epoch;
    // Each transaction also holds the epoch compare and the epoch put.
    let size = CHUNK.min(store.max_txn_ops().saturating_sub(2)).max(1);
    for chunk in ops.chunks(size) {
        let mut txn = Txn::new().when(Compare::ModRevision(key.clone(), expect));
        txn.ops.extend(chunk.iter().cloned());
        txn.ops.push(epoch_put(schema));
        match store.txn(txn).await? {
            TxnOutcome::Committed(r) => expect = r,
            TxnOutcome::Lost(_) => return Ok(false),
        }
    }
    Ok(true)
}

/// The rollout lock, held while this process drives an upgrade.
pub struct RolloutLock {
    store: DynStore,
    lease: LeaseId,
    keeper: JoinHandle<()>,
}

/// Why the lock was not taken.
pub enum LockOutcome {
    Taken(RolloutLock),
    Held(Option<LockRecord>),
}

const LOCK_TTL: Duration = Duration::from_secs(15);

impl RolloutLock {
    /// Tries once to take the lock.
    pub async fn try_take(store: &DynStore, schema: &Schema) -> Result<LockOutcome, StoreError> {
        let key = schema.lock(ROLLOUT_LOCK);
        let lease = store.grant_lease(LOCK_TTL).await?;
        let record = serde_json::to_string(&holder()).unwrap_or_default();
        let txn = Txn::new().when(Compare::Absent(key.clone())).then(Op::Put {
            key: key.clone(),
            value: record,
            lease: Some(lease.id.clone()),
        });
        match store.txn(txn).await? {
            TxnOutcome::Committed(_) => {
                let (s, id) = (store.clone(), lease.id.clone());
                let keeper = tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(LOCK_TTL / 3).await;
                        match s.keep_alive(&id).await {
                            Ok(_) => {}
                            Err(e) if e.kind() == ErrorKind::NotFound => {
                                tracing::error!(
                                    "the rollout lock's lease ended; another jioctl may take over"
                                );
                                return;
                            }
                            Err(e) => tracing::warn!(error = %e, "cannot renew the rollout lock"),
                        }
                    }
                });
                Ok(LockOutcome::Taken(RolloutLock {
                    store: store.clone(),
                    lease: lease.id,
                    keeper,
                }))
            }
            TxnOutcome::Lost(_) => {
                let _ = store.revoke_lease(&lease.id).await;
                let current = store.get(&key).await?;
                Ok(LockOutcome::Held(
                    current.and_then(|kv| serde_json::from_str(&kv.value).ok()),
                ))
            }
        }
    }

    /// Releases the lock (revoking its lease deletes the key).
    pub async fn release(self) {
        self.keeper.abort();
        let _ = self.store.revoke_lease(&self.lease).await;
    }
}

/// "alice on laptop (pid 12, since 20261121T101500Z)".
pub fn describe(r: &Option<LockRecord>) -> String {
    match r {
        Some(r) => format!(
            "{} on {} (pid {}, since {})",
            r.holder,
            r.host,
            r.pid,
            jio_common::time::utc_stamp(r.since)
        ),
        None => "another jioctl".into(),
    }
}
