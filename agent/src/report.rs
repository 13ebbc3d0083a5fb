//! What the agent writes to the store, built as pure transactions and applied once.
//!
//! A host is in exactly one of configured/success, configured/failure,
//! validated/success and validated/failure for a version: each report writes the new
//! entry and deletes the other three in one transaction. A validated success also
//! moves the host's `/running/versions` entry, in the same transaction.

use jio_common::keys::{Outcome, Parsed, Schema, Step};
use jio_common::names::{HostName, Interface, Role, Version};
use jio_common::store::{DynStore, Op, StoreError, Txn, TxnOutcome};
use jio_common::values::{HostRecord, InterfaceAddress, parse_json};

use crate::state::PendingReport;

/// The ops of one report: its status entry in place of the other three and, when
/// it carries one, the host's run result (`/results/<host>`).
pub fn report_ops(schema: &Schema, host: &HostName, r: &PendingReport) -> Vec<Op> {
    let mut ops = status_ops(schema, host, r);
    if let Some(result) = &r.result {
        ops.push(crate::results::put_op(&schema.result(host), result));
    }
    ops
}

/// The ops that put `r` in place of the host's other status entries for its version.
pub fn status_ops(schema: &Schema, host: &HostName, r: &PendingReport) -> Vec<Op> {
    let outcome = if r.ok { Outcome::Success } else { Outcome::Failure };
    if let Some(t) = &r.task {
        // A service's step: its entry in place of the other one.
        let other = if r.ok { Outcome::Failure } else { Outcome::Success };
        return vec![
            Op::put(
                schema.step_status(&t.rollout, &t.phase, &t.service, outcome, host),
                r.link.clone(),
            ),
            Op::Delete(schema.step_status(&t.rollout, &t.phase, &t.service, other, host)),
        ];
    }
    let mut ops = vec![Op::put(
        schema.status(r.step, outcome, &r.version, host),
        r.link.clone(),
    )];
    for step in Step::ALL {
        for o in Outcome::ALL {
            if (step, o) != (r.step, outcome) {
                ops.push(Op::Delete(schema.status(step, o, &r.version, host)));
            }
        }
    }
    ops
}

/// The ops that record `host` at `version` and remove it from every other version.
pub fn running_ops(
    schema: &Schema,
    host: &HostName,
    version: &Version,
    at: u64,
    others: &[Version],
) -> Vec<Op> {
    let mut ops = vec![Op::put(
        schema.running_version_host(version, host),
        at.to_string(),
    )];
    for o in others.iter().filter(|o| *o != version) {
        ops.push(Op::Delete(schema.running_version_host(o, host)));
    }
    ops
}

/// The versions under which `host` has a `/running/versions` entry (one listing).
pub async fn running_versions_of(
    store: &DynStore,
    schema: &Schema,
    host: &HostName,
) -> Result<Vec<Version>, StoreError> {
    let listing = store.list(&schema.running_versions()).await?;
    Ok(listing
        .kvs
        .iter()
        .filter_map(|kv| match schema.parse(&kv.key) {
            Some(Parsed::RunningVersion(v, h)) if &h == host => Some(v),
            _ => None,
        })
        .collect())
}

/// The ops of one report, with the host's `/running/versions` move when it is a
/// validated success. `known` are the versions the host is known to be listed
/// under; without them they are listed (one read).
pub async fn ops(
    store: &DynStore,
    schema: &Schema,
    host: &HostName,
    r: &PendingReport,
    known: Option<&[Version]>,
) -> Result<Vec<Op>, StoreError> {
    let mut ops = report_ops(schema, host, r);
    if r.step == Step::Validated && r.ok && r.task.is_none() {
        let others = match known {
            Some(k) => k.to_vec(),
            None => running_versions_of(store, schema, host).await?,
        };
        ops.extend(running_ops(schema, host, &r.version, r.at, &others));
    }
    Ok(ops)
}

/// Writes `ops` in one unconditional transaction; returns its revision.
pub async fn commit(store: &DynStore, ops: Vec<Op>) -> Result<jio_common::store::Revision, StoreError> {
    match store
        .txn(Txn {
            compares: vec![],
            ops,
        })
        .await?
    {
        TxnOutcome::Committed(rev) => Ok(rev),
        TxnOutcome::Lost(_) => Err(lost(store)),
    }
}

/// An unconditional transaction that was not applied: a store fault.
pub fn lost(store: &DynStore) -> StoreError {
    StoreError::Rejected {
        url: store.url().to_string(),
        op: "report",
        message: "an unconditional transaction was not applied".into(),
    }
}

/// Registers or refreshes `/hosts/<host>`, keeping the first-seen time.
pub async fn register(
    store: &DynStore,
    schema: &Schema,
    host: &HostName,
    role: &Role,
    addresses: Vec<InterfaceAddress>,
    now: u64,
) -> Result<(), StoreError> {
    let key = schema.host(host);
    let existing = store.get(&key).await?;
    let first_seen = existing
        .as_ref()
        .and_then(|kv| parse_json::<HostRecord>(kv).ok())
        .map(|r| r.first_seen)
        .unwrap_or(now);
    let record = HostRecord {
        role: role.clone(),
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        addresses,
        first_seen,
    };
    let value = serde_json::to_string(&record).unwrap_or_default();
    if existing.map(|kv| kv.value) != Some(value.clone()) {
        store.put(&key, &value, None).await?;
    }
    Ok(())
}

/// Publishes the host's addresses under `/active_roles/<role>/<host>/<interface>`
/// (the first address of each interface) and removes interfaces it no longer has,
/// in one transaction. `existing` are the entries there now: one that already holds
/// its address is not written again (an agent restarted with the same addresses
/// writes nothing, so no host's Hiera data needs reading again).
pub fn active_role_txn(
    schema: &Schema,
    host: &HostName,
    role: &Role,
    addresses: &[InterfaceAddress],
    existing: &[jio_common::store::KeyValue],
) -> Txn {
    let mut txn = Txn::new();
    let mut keep = std::collections::BTreeSet::new();
    for a in addresses {
        if let Ok(iface) = Interface::new(a.interface.clone())
            && keep.insert(schema.active_role(role, host, &iface))
        {
            let key = schema.active_role(role, host, &iface);
            let same = existing
                .iter()
                .any(|kv| kv.key == key && !kv.not_text && kv.lease.is_none() && kv.value == a.address);
            if !same {
                txn = txn.then(Op::put(key, a.address.clone()));
            }
        }
    }
    for kv in existing.iter().filter(|kv| !keep.contains(&kv.key)) {
        txn = txn.then(Op::Delete(kv.key.clone()));
    }
    txn
}

/// Reads the host's published interfaces and replaces them with `addresses`.
pub async fn publish_addresses(
    store: &DynStore,
    schema: &Schema,
    host: &HostName,
    role: &Role,
    addresses: &[InterfaceAddress],
) -> Result<(), StoreError> {
    let existing = store.list(&schema.active_role_host(role, host)).await?.kvs;
    let txn = active_role_txn(schema, host, role, addresses, &existing);
    if !txn.ops.is_empty() {
        store.txn(txn).await?;
    }
    Ok(())
}

/// `publish_addresses`, tried again after a failure (a backoff from 1 s to a
/// minute, each wait stretched by up to half at random so that a fleet started at
/// once does not retry at once) until it succeeds or `stop` turns true.
pub async fn keep_publishing(
    store: DynStore,
    schema: Schema,
    (host, role): (HostName, Role),
    addresses: Vec<InterfaceAddress>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut backoff = jio_common::backoff::Backoff::new(
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(60),
    );
    loop {
        let e = tokio::select! {
            r = publish_addresses(&store, &schema, &host, &role, &addresses) => match r {
                Ok(()) => return,
                Err(e) => e,
            },
            _ = stop.changed() => return,
        };
        let wait = backoff.fail_spread();
        tracing::warn!(error = %e, retry_in = ?wait, "cannot publish this host's addresses under /active_roles/; retrying");
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Records the first-boot outcome: success, or failed with the reason.
pub fn provisioned_txn(schema: &Schema, host: &HostName, failure: Option<&str>) -> Txn {
    let (put, del) = match failure {
        None => (
            schema.provisioned(Outcome::Success, host),
            schema.provisioned(Outcome::Failure, host),
        ),
        Some(_) => (
            schema.provisioned(Outcome::Failure, host),
            schema.provisioned(Outcome::Success, host),
        ),
    };
    Txn::new()
        .then(Op::put(put, failure.unwrap_or("")))
        .then(Op::Delete(del))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h() -> HostName {
        HostName::new("compute1").unwrap()
    }
    fn v(s: &str) -> Version {
        Version::new(s).unwrap()
    }

    fn keys(ops: &[Op]) -> Vec<String> {
        ops.iter()
            .map(|op| match op {
                Op::Put { key, value, .. } => format!("put {key}={value}"),
                Op::Delete(k) => format!("del {k}"),
                Op::DeletePrefix(k) => format!("delprefix {k}"),
            })
            .collect()
    }

    #[test]
    fn each_report_replaces_the_other_three_entries() {
        let s = Schema::default();
        let r = PendingReport {
            version: v("v2"),
            step: Step::Configured,
            ok: false,
            link: "http://swift/x".into(),
            at: 1,
            log: None,
            object: None,
            result: None,
            task: None,
        };
        assert_eq!(
            keys(&report_ops(&s, &h(), &r)),
            vec![
                "put /status/configured/failure/v2/compute1=http://swift/x",
                "del /status/configured/success/v2/compute1",
                "del /status/validated/success/v2/compute1",
                "del /status/validated/failure/v2/compute1",
            ]
        );
    }

    #[test]
    fn a_report_carries_the_run_result_and_keeps_the_log_link() {
        let s = Schema::default();
        let result = jio_common::values::HostResult {
            version: v("v2"),
            ok: false,
            step: Some("validated".into()),
            service: None,
            task: None,
            exit_code: Some(1),
            message: Some("validation exited 1".into()),
            run_dir: Some("/runs/1".into()),
            log: None,
            at: 7,
            checked_at: None,
            attempt: 1,
            retry_at: Some(607),
            rollout: None,
            packages: None,
        };
        let r = PendingReport {
            version: v("v2"),
            step: Step::Validated,
            ok: false,
            link: "http://swift/x".into(),
            at: 7,
            log: None,
            object: None,
            result: Some(result.clone()),
            task: None,
        };
        let ops = keys(&report_ops(&s, &h(), &r));
        assert_eq!(ops[0], "put /status/validated/failure/v2/compute1=http://swift/x");
        assert_eq!(
            ops.last().unwrap(),
            &format!(
                "put /results/compute1={}",
                serde_json::to_string(&result).unwrap()
            )
        );
        assert_eq!(ops.len(), 5);
    }

    #[test]
    fn running_version_moves() {
        let s = Schema::default();
        assert_eq!(
            keys(&running_ops(&s, &h(), &v("v2"), 99, &[v("v1"), v("v2"), v("v0")])),
            vec![
                "put /running/versions/v2/compute1=99",
                "del /running/versions/v1/compute1",
                "del /running/versions/v0/compute1",
            ]
        );
    }

    #[test]
    fn active_roles_replace_stale_interfaces() {
        let s = Schema::default();
        let role = Role::new("compute").unwrap();
        let addr = |i: &str, a: &str| InterfaceAddress {
            interface: i.into(),
            address: a.into(),
        };
        let kv = |i: &str, v: &str| jio_common::store::KeyValue {
            key: s.active_role(&role, &h(), &Interface::new(i).unwrap()),
            value: v.into(),
            mod_revision: 1,
            create_revision: 1,
            version: 1,
            lease: None,
            not_text: false,
        };
        let existing = vec![
            kv("eth0", "10.0.0.9"),
            kv("eth9", "10.0.9.1"),
            kv("eth2", "10.0.2.1"),
        ];
        let txn = active_role_txn(
            &s,
            &h(),
            &role,
            &[
                addr("eth0", "10.0.0.1"),
                addr("eth0", "fd00::1"),
                addr("eth1", "10.0.1.1"),
                addr("eth2", "10.0.2.1"),
            ],
            &existing,
        );
        // eth2 already holds its address: not written again.
        assert_eq!(
            keys(&txn.ops),
            vec![
                "put /active_roles/compute/compute1/eth0=10.0.0.1",
                "put /active_roles/compute/compute1/eth1=10.0.1.1",
                "del /active_roles/compute/compute1/eth9",
            ]
        );
    }

    #[test]
    fn provisioned_outcomes_are_exclusive() {
        let s = Schema::default();
        assert_eq!(
            keys(&provisioned_txn(&s, &h(), Some("no address")).ops),
            vec![
                "put /status/provisioned/failed/compute1=no address",
                "del /status/provisioned/success/compute1"
            ]
        );
    }
}
