//! etcd-only behaviour: fail-over across a real 3-member cluster, and compatibility
//! with other tools (etcdctl) reading what the store layer wrote.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use jio_common::keys::{Key, Schema};
use jio_common::store::{EtcdOptions, EtcdStore, Store, StoreUrl};
use jio_tests::{Etcd, require_binary};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_carry_on_when_the_members_client_uses_dies() {
    let mut cluster = Etcd::cluster(3).await;
    cluster.close_own_connections().await;
    let url = StoreUrl::parse(&cluster.url()).unwrap();
    // The client starts at a member of its own choosing; the one it writes through
    // (the member this process is connected to) is the one killed below.
    let store = Arc::new(EtcdStore::new(&url, EtcdOptions::default()).unwrap());
    let done = Arc::new(AtomicUsize::new(0));
    let writer = {
        let (store, done) = (store.clone(), done.clone());
        tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut failed = 0;
            for i in 0..300 {
                let key = Key::new(format!("/ack/{i:04}")).unwrap();
                match store.put(&key, "x", None).await {
                    Ok(_) => acked.push(key.to_string()),
                    Err(_) => failed += 1,
                }
                done.store(i + 1, Ordering::Relaxed);
            }
            (acked, failed)
        })
    };
    while done.load(Ordering::Relaxed) < 50 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let conns: Vec<usize> = (0..3).map(|i| cluster.connections_to(i)).collect();
    assert_eq!(
        conns.iter().sum::<usize>(),
        1,
        "one connection carries the writes: {conns:?}"
    );
    let used = conns.iter().position(|n| *n == 1).unwrap();
    cluster.kill(used);
    let at_kill = done.load(Ordering::Relaxed);
    assert!(
        at_kill < 250,
        "the member must die while writes are running (died after {at_kill})"
    );
    let (acked, failed) = writer.await.unwrap();
    eprintln!("member {used} killed after {at_kill} writes");
    assert_eq!(failed, 0, "every write succeeds through the surviving members");
    assert_eq!(acked.len(), 300);

    // Read back through the survivors only.
    let others: Vec<String> = (0..3)
        .filter(|i| *i != used)
        .map(|i| cluster.endpoint(i).trim_start_matches("http://").to_string())
        .collect();
    let survivors = StoreUrl::parse(&format!("etcd://{}", others.join(","))).unwrap();
    let reader = EtcdStore::new(&survivors, EtcdOptions::default()).unwrap();
    let stored: BTreeSet<String> = reader
        .list(&Key::new("/ack/").unwrap())
        .await
        .unwrap()
        .kvs
        .into_iter()
        .map(|kv| kv.key.to_string())
        .collect();
    for key in &acked {
        assert!(stored.contains(key), "acknowledged write {key} was lost");
    }
}

#[tokio::test]
async fn etcdctl_reads_what_the_store_layer_wrote() {
    let etcdctl = require_binary("etcdctl", "apt-get install -y etcd-client");
    let etcd = Etcd::start().await;
    let store = EtcdStore::new(&StoreUrl::parse(&etcd.url()).unwrap(), EtcdOptions::default()).unwrap();
    let schema = Schema::default();
    store.put(&schema.current_version(), "v42", None).await.unwrap();
    let out = std::process::Command::new(etcdctl)
        .env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            &etcd.endpoint(0),
            "get",
            "/current_version",
            "--print-value-only",
        ])
        .output()
        .expect("run etcdctl");
    assert!(
        out.status.success(),
        "etcdctl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "v42");
}

/// A first endpoint that cannot be connected to (its name does not resolve) is
/// passed over by every request, a transaction included: nothing was sent to it, so
/// the transaction is not in doubt.
#[tokio::test]
async fn an_endpoint_never_connected_to_is_passed_over_by_a_transaction() {
    use jio_common::store::{Compare, Op, Txn, TxnOutcome};
    let etcd = Etcd::start().await;
    let url = StoreUrl::parse(&format!(
        "etcd://no-such-member.invalid:2379,127.0.0.1:{}",
        etcd.port(0)
    ))
    .unwrap();
    let store = EtcdStore::new(&url, EtcdOptions::default()).unwrap();
    let key = Key::new("/txn/first").unwrap();
    let out = store
        .txn(
            Txn::new()
                .when(Compare::Absent(key.clone()))
                .then(Op::put(key.clone(), "x")),
        )
        .await
        .unwrap();
    assert!(matches!(out, TxnOutcome::Committed(_)), "{out:?}");
    assert_eq!(store.get(&key).await.unwrap().unwrap().value, "x");
}

/// etcd refuses a token issued before a change of users or roles ("revision of
/// auth store is old"): the client authenticates again and nothing fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_of_roles_under_load_fail_no_request() {
    use jio_common::store::{Compare, Op, Txn};
    let etcd = Arc::new(Etcd::secure(300, "").await);
    let url = StoreUrl::parse(&etcd.url_as("jio-operator")).unwrap();
    let store = Arc::new(EtcdStore::new(&url, EtcdOptions::default()).unwrap());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let granter = {
        let (etcd, stop) = (etcd.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let path = format!("/unused/{n}");
                let out = etcd.etcdctl(&["role", "grant-permission", "jio-agent", "read", &path]);
                assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
                n += 1;
            }
            n
        })
    };
    let mut tasks = Vec::new();
    for t in 0..4 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut errors = Vec::new();
            for i in 0..300 {
                let key = Key::new(format!("/roles/{t}/{i}")).unwrap();
                let res = if i % 2 == 0 {
                    store.put(&key, "v", None).await.map(|_| ())
                } else {
                    let txn = Txn::new()
                        .when(Compare::Absent(key.clone()))
                        .then(Op::put(key.clone(), "v"));
                    store.txn(txn).await.map(|_| ())
                };
                if let Err(e) = res {
                    errors.push(e.to_string());
                }
            }
            errors
        }));
    }
    let mut errors = Vec::new();
    for t in tasks {
        errors.extend(t.await.unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    let grants = granter.join().unwrap();
    assert!(
        grants >= 3,
        "the roles changed during the writes ({grants} grants)"
    );
    assert!(
        errors.is_empty(),
        "{} of 1200 requests failed: {:?}",
        errors.len(),
        &errors[..errors.len().min(3)]
    );
}
