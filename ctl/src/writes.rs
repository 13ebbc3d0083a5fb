//! Everything jioctl writes, and how: every write of the desired version or of an
//! enable key bumps the plan epoch (`/locks/epoch`) in the same transaction, and a
//! plan is applied only while the epoch is where the plan read it. So two operators,
//! or an operator and a running `upgrade`, can never both apply a stale plan.
//!
//! A driver's writes are also fenced on still holding the rollout lock: every plan
//! transaction compares the lock key's mod revision with the one this process wrote
//! when it took the lock. A driver that was paused, or cut off, past the lock's lease
//! writes nothing; it finds out and takes the lock again, or stops.
//!
//! Large plans are split into transactions of at most `CHUNK` ops, fewer where the
//! store allows fewer (etcd refuses more than 128 per transaction by default, Consul
//! more than 64), each fenced on the epoch the previous one left. Every prefix of a
//! plan is safe on its own: it admits no more hosts than the whole plan would.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use jio_common::fleet::{EPOCH, HALT, LockRecord, ROLLOUT_LOCK};
use jio_common::hook_record::HookRecord;
use jio_common::keys::{EnableLevel, Schema};
use jio_common::names::{HostName, Version};
use jio_common::plan::Plan;
use jio_common::rollout::RolloutRecord;
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

/// The plan epoch's bump, recording who wrote. Every bump writes a new value (a
/// `bump` number that goes up by one from a random start in each process): a store
/// that skips a write of a key's current value (Consul ≥ 1.6) would otherwise leave
/// the epoch's mod revision where it was, and the next chunk of a plan, fenced on
/// the revision this one returned, would find it lost.
pub fn epoch_put(schema: &Schema) -> Op {
    #[derive(serde::Serialize)]
    struct Epoch {
        #[serde(flatten)]
        by: LockRecord,
        bump: u64,
    }
    static BUMPS: std::sync::OnceLock<std::sync::atomic::AtomicU64> = std::sync::OnceLock::new();
    let bumps = BUMPS.get_or_init(|| {
        use std::hash::{BuildHasher as _, Hasher as _};
        // The standard library seeds this from the OS's randomness.
        std::sync::atomic::AtomicU64::new(
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish(),
        )
    });
    let epoch = Epoch {
        by: holder(),
        bump: bumps.fetch_add(1, Ordering::SeqCst),
    };
    Op::put(
        schema.lock(EPOCH),
        serde_json::to_string(&epoch).unwrap_or_default(),
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

/// `global-disable-puppet`, the emergency stop: the enable keys are reset and the
/// halt record is left for a running driver to find (it stops, saying who stopped it).
pub fn emergency_stop_ops(schema: &Schema) -> Vec<Op> {
    let mut ops = global_disable_ops(schema);
    // No fleet command starts anywhere any more (running ones finish).
    ops.push(Op::DeletePrefix(schema.command_inboxes()));
    ops.push(Op::put(
        schema.lock(HALT),
        serde_json::to_string(&holder()).unwrap_or_default(),
    ));
    ops
}

/// Every role and host enable key goes, global becomes false. (Not one delete of
/// the whole tree: a store refuses a transaction that deletes a key it also puts.)
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
    // Disabling first: a prefix of the chunks only ever admits less.
    for h in &plan.disable_hosts {
        ops.push(Op::put(
            schema.enable(&EnableLevel::Host(h.clone())),
            format_bool(false),
        ));
    }
    for r in &plan.enable_roles {
        ops.push(Op::put(
            schema.enable(&EnableLevel::Role(r.clone())),
            format_bool(true),
        ));
    }
    for h in &plan.clear_host_keys {
        ops.push(Op::Delete(schema.enable(&EnableLevel::Host(h.clone()))));
    }
    for h in plan.enable_hosts.iter().chain(&plan.permit_reboots) {
        ops.push(enable_host(schema, h));
    }
    ops
}

/// A composable rollout's pass, in a safe order: the enable keys of a stage
/// whose phase moves on are deleted before its new grant is written (a prefix of
/// the chunks never leaves a host enabled under a phase it was not admitted to),
/// then the phase's admissions, then the finalize grant before its host's key.
pub fn compose_ops(schema: &Schema, c: &jio_common::compose::Composed) -> Vec<Op> {
    let mut ops = Vec::new();
    for h in &c.reset_hosts {
        ops.push(Op::Delete(schema.enable(&EnableLevel::Host(h.clone()))));
    }
    for r in &c.reset_roles {
        ops.push(Op::Delete(schema.enable(&EnableLevel::Role(r.clone()))));
    }
    for (role, g) in &c.grants {
        ops.push(Op::put(
            schema.grant(role),
            serde_json::to_string(g).unwrap_or_default(),
        ));
    }
    if c.grants.is_empty() {
        ops.extend(plan_ops(schema, &c.plan));
    }
    if let Some(f) = &c.finalize_grant {
        ops.push(Op::put(
            schema.finalize_grant(),
            serde_json::to_string(f).unwrap_or_default(),
        ));
        ops.push(Op::put(
            schema.enable(&EnableLevel::Host(f.host.clone())),
            format_bool(true),
        ));
    }
    ops
}

/// What became of a fenced write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// Every transaction was applied.
    Applied,
    /// Something wrote enable keys or the version since the plan was read (a prefix
    /// of a chunked plan may have been applied): plan again.
    Moved,
    /// The rollout lock is no longer this process's: nothing more was written.
    LockLost,
}

/// A rollout record's write.
pub fn record_put(schema: &Schema, r: &RolloutRecord) -> Op {
    Op::put(
        schema.rollout(&r.id),
        serde_json::to_string(r).unwrap_or_default(),
    )
}

/// The end of a rollout (done, failed, aborted): its record, `/rollouts/current`
/// removed, and (`disarm`) every enable key reset, so nothing is left armed.
pub fn end_ops(schema: &Schema, ended: &RolloutRecord, disarm: bool) -> Vec<Op> {
    let mut ops = Vec::new();
    if disarm {
        ops.extend(global_disable_ops(schema));
    }
    ops.push(record_put(schema, ended));
    ops.push(Op::Delete(schema.current_rollout()));
    // A composable rollout's phase grants end with it.
    ops.push(Op::DeletePrefix(schema.steps()));
    ops
}

/// A record's write alone (pause expiry, stuck, unstuck).
pub fn update_ops(schema: &Schema, r: &RolloutRecord) -> Vec<Op> {
    vec![record_put(schema, r)]
}

/// A host's maintenance hook record.
pub fn hook_put(schema: &Schema, h: &HostName, rec: &HookRecord) -> Op {
    Op::put(schema.hook(h), serde_json::to_string(rec).unwrap_or_default())
}

/// A host's own enable key, set.
pub fn enable_host(schema: &Schema, h: &HostName) -> Op {
    Op::put(schema.enable(&EnableLevel::Host(h.clone())), format_bool(true))
}

/// Applies `ops` if the epoch is still at `epoch` and `lock` is still held.
pub async fn apply_fenced(
    store: &DynStore,
    schema: &Schema,
    ops: Vec<Op>,
    epoch: Revision,
    lock: &RolloutLock,
) -> Result<Fenced, StoreError> {
    apply_fenced_when(store, schema, Vec::new(), ops, epoch, lock).await
}

/// `apply_fenced`, the first transaction also fenced on `compares` (what the
/// writes were decided on besides the epoch: a hook record, `/rollouts/current`).
pub async fn apply_fenced_when(
    store: &DynStore,
    schema: &Schema,
    mut compares: Vec<Compare>,
    ops: Vec<Op>,
    epoch: Revision,
    lock: &RolloutLock,
) -> Result<Fenced, StoreError> {
    let key = schema.lock(EPOCH);
    let mut expect = epoch;
    // Each transaction also holds the compares and the epoch put.
    let size = CHUNK
        .min(store.max_txn_ops().saturating_sub(3 + compares.len()))
        .max(1);
    for chunk in ops.chunks(size) {
        let mut txn = Txn::new()
            .when(Compare::ModRevision(key.clone(), expect))
            .when(Compare::ModRevision(lock.key.clone(), lock.revision));
        txn.compares.append(&mut compares);
        txn.ops.extend(chunk.iter().cloned());
        txn.ops.push(epoch_put(schema));
        match store.txn(txn).await? {
            TxnOutcome::Committed(r) => expect = r,
            TxnOutcome::Lost(_) => {
                return Ok(if lock.still_held().await? {
                    Fenced::Moved
                } else {
                    Fenced::LockLost
                });
            }
        }
    }
    Ok(Fenced::Applied)
}

/// The rollout lock, held while this process drives an upgrade.
pub struct RolloutLock {
    store: DynStore,
    key: jio_common::keys::Key,
    lease: LeaseId,
    /// The lock key's mod revision as this process wrote it: plans are fenced on it.
    revision: Revision,
    /// Set by the keeper when the lease ended.
    lost: Arc<AtomicBool>,
    /// Until when the lease surely lasts: the send time of the last renewal that
    /// worked, plus its TTL (the store counts from its receipt, later).
    valid_until: Arc<std::sync::Mutex<tokio::time::Instant>>,
    ttl: Duration,
    keeper: JoinHandle<()>,
}

/// What a task that must not outlive the rollout lock watches (a maintenance
/// hook): the lock's lease ended, or was not renewed for two thirds of its TTL
/// (another driver may take it once it ends).
#[derive(Debug, Clone)]
pub struct LockGuard {
    lost: Arc<AtomicBool>,
    valid_until: Arc<std::sync::Mutex<tokio::time::Instant>>,
    margin: Duration,
}

impl LockGuard {
    /// The lock is surely still held, with a margin.
    pub fn holds(&self) -> bool {
        let until = self
            .valid_until
            .lock()
            .map(|t| *t)
            .unwrap_or_else(|e| *e.into_inner());
        !self.lost.load(Ordering::SeqCst) && tokio::time::Instant::now() + self.margin < until
    }

    /// A guard that always holds (for tests of what runs under it).
    pub fn always() -> LockGuard {
        LockGuard {
            lost: Arc::new(AtomicBool::new(false)),
            valid_until: Arc::new(std::sync::Mutex::new(
                tokio::time::Instant::now() + Duration::from_secs(86_400 * 365),
            )),
            margin: Duration::ZERO,
        }
    }
}

/// Why the lock was not taken.
pub enum LockOutcome {
    Taken(RolloutLock),
    Held(Option<LockRecord>),
}

/// The rollout lock's lease, unless a driver service is given another.
pub const LOCK_TTL: Duration = Duration::from_secs(15);

impl RolloutLock {
    /// Tries once to take the lock. A lock whose holder is a process of this host
    /// that no longer exists (killed without a chance to release it) is taken over
    /// at once.
    pub async fn try_take(
        store: &DynStore,
        schema: &Schema,
        ttl: Duration,
    ) -> Result<LockOutcome, StoreError> {
        RolloutLock::try_take_key(store, schema.lock(ROLLOUT_LOCK), ttl).await
    }

    /// `try_take`, for the lock at `key` (a fleet command's driver lock).
    pub async fn try_take_key(
        store: &DynStore,
        key: jio_common::keys::Key,
        ttl: Duration,
    ) -> Result<LockOutcome, StoreError> {
        match RolloutLock::try_once(store, &key, ttl).await? {
            LockOutcome::Held(_) => {}
            taken => return Ok(taken),
        }
        let Some(current) = store.get(&key).await? else {
            return RolloutLock::try_once(store, &key, ttl).await;
        };
        let what = if key.as_str().ends_with(&format!("/{ROLLOUT_LOCK}")) {
            "the rollout lock".to_string()
        } else {
            format!("the lock {key}")
        };
        let record: Option<LockRecord> = jio_common::values::parse_json(&current).ok();
        // A holder of this host whose process is gone, or a value no driver writes
        // (it would never be released).
        if record.as_ref().is_none_or(holder_is_dead) {
            let txn = Txn::new()
                .when(Compare::ModRevision(key.clone(), current.mod_revision))
                .then(Op::Delete(key.clone()));
            if store.txn(txn).await?.committed() {
                match &record {
                    Some(_) => eprintln!(
                        "jioctl: took over {what} from {}: that process no longer exists",
                        describe(&record)
                    ),
                    None => eprintln!(
                        "jioctl: took over {what}: its value could not be read (no driver writes such a lock)"
                    ),
                }
                if let Some(lease) = &current.lease {
                    let _ = store.revoke_lease(lease).await;
                }
            }
            return RolloutLock::try_once(store, &key, ttl).await;
        }
        Ok(LockOutcome::Held(record))
    }

    async fn try_once(
        store: &DynStore,
        key: &jio_common::keys::Key,
        ttl: Duration,
    ) -> Result<LockOutcome, StoreError> {
        let asked = tokio::time::Instant::now();
        let lease = store.grant_lease(ttl).await?;
        let record = serde_json::to_string(&holder()).unwrap_or_default();
        let txn = Txn::new().when(Compare::Absent(key.clone())).then(Op::Put {
            key: key.clone(),
            value: record,
            lease: Some(lease.id.clone()),
        });
        match store.txn(txn).await? {
            TxnOutcome::Committed(committed) => {
                // The fence compares the key's own mod revision, as the store reports
                // it (on Consul a transaction's index need not be the key's).
                let revision = match store.get(key).await? {
                    Some(kv) if kv.lease.as_ref() == Some(&lease.id) => kv.mod_revision,
                    _ => committed,
                };
                let lost = Arc::new(AtomicBool::new(false));
                let valid_until = Arc::new(std::sync::Mutex::new(asked + ttl));
                let (s, id, flag, until) =
                    (store.clone(), lease.id.clone(), lost.clone(), valid_until.clone());
                let keeper = tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(ttl / 3).await;
                        let sent = tokio::time::Instant::now();
                        match s.keep_alive(&id).await {
                            Ok(_) => {
                                if let Ok(mut t) = until.lock() {
                                    *t = sent + ttl;
                                }
                            }
                            Err(e) if e.kind() == ErrorKind::NotFound => {
                                // The driver sees the flag before its next write, and
                                // the fence stops any write already under way.
                                flag.store(true, Ordering::SeqCst);
                                return;
                            }
                            Err(e) => tracing::warn!(error = %e, "cannot renew the rollout lock"),
                        }
                    }
                });
                Ok(LockOutcome::Taken(RolloutLock {
                    store: store.clone(),
                    key: key.clone(),
                    lease: lease.id,
                    revision,
                    lost,
                    valid_until,
                    ttl,
                    keeper,
                }))
            }
            TxnOutcome::Lost(_) => {
                let _ = store.revoke_lease(&lease.id).await;
                let current = store.get(key).await?;
                Ok(LockOutcome::Held(
                    current.and_then(|kv| jio_common::values::parse_json(&kv).ok()),
                ))
            }
        }
    }

    /// What a task that must stop when this lock is lost watches.
    pub fn guard(&self) -> LockGuard {
        LockGuard {
            lost: self.lost.clone(),
            valid_until: self.valid_until.clone(),
            margin: self.ttl / 3,
        }
    }

    /// The keeper found the lease ended (this process was paused, or the store was
    /// unreachable, for longer than the lease).
    pub fn lease_ended(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Reads the lock key: is it still the one this process wrote?
    pub async fn still_held(&self) -> Result<bool, StoreError> {
        Ok(self
            .store
            .get(&self.key)
            .await?
            .is_some_and(|kv| kv.mod_revision == self.revision))
    }

    /// Releases the lock (revoking its lease deletes the key).
    pub async fn release(self) {
        self.keeper.abort();
        let _ = self.store.revoke_lease(&self.lease).await;
    }
}

/// The holder ran on this host and its process is gone.
pub fn holder_is_dead(r: &LockRecord) -> bool {
    let me = holder();
    r.host == me.host
        && r.pid != me.pid
        && r.pid != 0
        && matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(r.pid as i32), None),
            Err(nix::errno::Errno::ESRCH)
        )
}

/// Releases the rollout lock if this very process holds it without knowing (it was
/// interrupted between writing the lock and learning it had): `true` when it did.
pub async fn release_own(store: &DynStore, schema: &Schema) -> bool {
    let key = schema.lock(ROLLOUT_LOCK);
    let Ok(Some(kv)) = store.get(&key).await else {
        return false;
    };
    let me = holder();
    let mine =
        jio_common::values::parse_json::<LockRecord>(&kv).is_ok_and(|r| r.pid == me.pid && r.host == me.host);
    match (mine, &kv.lease) {
        (true, Some(lease)) => store.revoke_lease(lease).await.is_ok(),
        _ => false,
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
            jio_common::time::utc_display(r.since)
        ),
        None => "another jioctl".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_lock_no_driver_wrote_is_taken_over() {
        let store: DynStore = std::sync::Arc::new(jio_common::store::MemoryStore::new());
        let schema = Schema::default();
        let key = schema.lock(ROLLOUT_LOCK);
        store.put(&key, "garbage", None).await.unwrap();
        let LockOutcome::Taken(lock) = RolloutLock::try_take(&store, &schema, LOCK_TTL).await.unwrap() else {
            panic!("an unreadable lock (no lease, no holder) would never be released");
        };
        assert!(lock.still_held().await.unwrap());
        // A live holder (this very process, another lock) is not taken over.
        let again = RolloutLock::try_take(&store, &schema, LOCK_TTL).await.unwrap();
        assert!(matches!(again, LockOutcome::Held(Some(_))));
        lock.release().await;
    }
}
