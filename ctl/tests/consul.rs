//! jioctl's fenced apply on Consul (the Consul API test server: no Consul server can
//! be installed here), whose transactions hold at most 64 operations.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use std::sync::Arc;
use std::time::Duration;

use jio_common::keys::{Key, Schema};
use jio_common::store::{ConsulStore, DynStore, Op, StoreUrl};
use jio_tests::consul::{ConsulOptions, ConsulServer};
use jioctl::writes::{Fenced, LockOutcome, RolloutLock, apply_fenced};

#[tokio::test]
async fn a_plan_of_150_writes_is_split_into_transactions_consul_takes() {
    let server = ConsulServer::start(ConsulOptions::default()).await;
    let url = StoreUrl::parse(&server.url()).expect("consul URL");
    let s: DynStore = Arc::new(ConsulStore::new(&url, Duration::from_secs(2)).expect("client"));
    assert_eq!(s.max_txn_ops(), 64);
    let schema = Schema::default();
    let ops: Vec<Op> = (0..150)
        .map(|i| {
            let key = Key::new(format!("/config_state/enable_puppet/host/h{i:03}")).expect("key");
            Op::put(key, "true")
        })
        .collect();
    let LockOutcome::Taken(lock) = RolloutLock::try_take(&s, &schema, jioctl::writes::LOCK_TTL)
        .await
        .expect("lock")
    else {
        panic!("the rollout lock is free")
    };
    assert_eq!(
        apply_fenced(&s, &schema, ops, 0, &lock).await.expect("apply"),
        Fenced::Applied
    );
    lock.release().await;
    let written = s.list(&schema.enable_level_prefix(false)).await.expect("list");
    assert_eq!(written.kvs.len(), 150);
}

/// Rewriting an enable key with `true` is the operator's "retry now" for a failed
/// host: its agent sees the key's mod revision move. Consul skips a write of the
/// value a key already holds, so `jioctl enable-puppet true` makes it move anyway
/// (etcd moves it by itself).
#[tokio::test]
async fn rewriting_true_moves_the_enable_key_on_consul() {
    let server = ConsulServer::start(ConsulOptions::default()).await;
    let url = StoreUrl::parse(&server.url()).expect("consul URL");
    let s: DynStore = Arc::new(ConsulStore::new(&url, Duration::from_secs(2)).expect("client"));
    let key = Key::new("/config_state/enable_puppet/host/compute1").expect("key");
    s.put(&key, "true", None).await.expect("put");
    let before = s.get(&key).await.expect("get").expect("key").mod_revision;
    // No agent registered compute1 here: --force writes its key all the same.
    let out = common::jioctl(
        &server.url(),
        &["enable-puppet", "true", "--host", "compute1", "--force"],
    )
    .output()
    .await
    .expect("jioctl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let after = s.get(&key).await.expect("get").expect("key");
    assert_eq!(after.value, "true");
    assert!(after.mod_revision > before, "{} > {before}", after.mod_revision);
}

/// `jioctl retry --failed` on Consul, past one of its transactions (64 operations):
/// every failed host's key already `true` moves, so each agent sees it.
#[tokio::test]
async fn retry_moves_every_failed_hosts_key_on_consul() {
    let server = ConsulServer::start(ConsulOptions::default()).await;
    let url = StoreUrl::parse(&server.url()).expect("consul URL");
    let s: DynStore = Arc::new(ConsulStore::new(&url, Duration::from_secs(2)).expect("client"));
    let key = |k: String| Key::new(k).expect("key");
    s.put(&key("/current_version".into()), "v2", None)
        .await
        .expect("put");
    let hosts: Vec<String> = (1..=70).map(|i| format!("compute{i}")).collect();
    let mut before = Vec::new();
    for h in &hosts {
        let reg = r#"{"role":"compute","agent_version":"0.1.0","addresses":[],"first_seen":1}"#;
        s.put(&key(format!("/hosts/{h}")), reg, None).await.expect("put");
        // Enabled, then failed: its key is `true` from before the failure.
        let k = key(format!("/config_state/enable_puppet/host/{h}"));
        before.push(s.put(&k, "true", None).await.expect("put"));
        s.put(&key(format!("/status/configured/failure/v2/{h}")), "", None)
            .await
            .expect("put");
    }
    let out = common::jioctl(&server.url(), &["retry", "--failed"])
        .output()
        .await
        .expect("jioctl");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("retrying compute1, compute2"), "{said}");
    for (h, was) in hosts.iter().zip(before) {
        let kv = s
            .get(&key(format!("/config_state/enable_puppet/host/{h}")))
            .await
            .expect("get")
            .expect("key");
        assert_eq!(kv.value, "true", "{h}");
        assert!(kv.mod_revision > was, "{h}: {} > {was}", kv.mod_revision);
    }
}
