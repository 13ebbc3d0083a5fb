//! The store contract: every test body here runs unchanged against a real etcd, the
//! embedded SQLite store and the Consul API test server (`etcd::*`, `sqlite::*` and
//! `consul::*` in the test output).
//!
//! Where Consul's documented semantics differ, the body says so through the
//! backend's capabilities, never by skipping: Consul keeps no per-key write count and
//! no history (a blocking query returns the state now, so writes between two answers
//! coalesce), its transactions hold at most 64 operations, and a session's TTL is at
//! least 10 s and ends up to twice that after the last renewal.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use jio_common::keys::Key;
use jio_common::store::{
    Compare, ConsulStore, DynStore, ErrorKind, EtcdOptions, EtcdStore, MemoryStore, Op, SqliteStore, Store,
    StoreError, StoreUrl, Txn, TxnOutcome, WatchEvent, WatchStream,
};
use jio_tests::Etcd;
use jio_tests::consul::{ConsulOptions, ConsulServer};

enum Fixture {
    Etcd(Box<Etcd>),
    /// The in-memory store of the logic tests: held to the same contract.
    Memory(MemoryStore),
    Sqlite(tempfile::TempDir),
    Consul(ConsulServer),
}

struct Backend {
    store: DynStore,
    fixture: Fixture,
}

impl Backend {
    /// Whether the store keeps every write (etcd, SQLite), or only the latest state
    /// of each key (Consul).
    fn exact_history(&self) -> bool {
        !matches!(self.fixture, Fixture::Consul(_))
    }
}

impl Backend {
    async fn etcd() -> Backend {
        let etcd = Etcd::start().await;
        let store = open_etcd(&etcd.url());
        Backend {
            store,
            fixture: Fixture::Etcd(Box::new(etcd)),
        }
    }

    async fn sqlite() -> Backend {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = Arc::new(
            SqliteStore::open(&dir.path().join("store.db"))
                .await
                .expect("open sqlite"),
        );
        Backend {
            store,
            fixture: Fixture::Sqlite(dir),
        }
    }

    async fn memory() -> Backend {
        let m = MemoryStore::new();
        Backend {
            store: Arc::new(m.clone()),
            fixture: Fixture::Memory(m),
        }
    }

    async fn consul() -> Backend {
        let server = ConsulServer::start(ConsulOptions::default()).await;
        let store = open_consul(&server.url());
        Backend {
            store,
            fixture: Fixture::Consul(server),
        }
    }

    /// etcd with TLS, client certificates and authentication, as the `jio-operator`
    /// user of `packaging/etcd-roles.sh`; tokens expire after 2 s unused.
    async fn etcd_secure() -> Backend {
        let etcd = Etcd::secure(2, "").await;
        let store = open_etcd(&etcd.url_as("jio-operator"));
        Backend {
            store,
            fixture: Fixture::Etcd(Box::new(etcd)),
        }
    }

    /// A second, independent client of the same store (for SQLite: another
    /// connection to the same file, as another process would have).
    async fn another_client(&self) -> DynStore {
        match &self.fixture {
            Fixture::Etcd(e) if e.is_secure() => open_etcd(&e.url_as("jio-operator")),
            Fixture::Etcd(e) => open_etcd(&e.url()),
            Fixture::Sqlite(dir) => Arc::new(
                SqliteStore::open(&dir.path().join("store.db"))
                    .await
                    .expect("open sqlite"),
            ),
            Fixture::Consul(server) => open_consul(&server.url()),
            Fixture::Memory(m) => Arc::new(m.clone()),
        }
    }

    /// Writes raw bytes under a raw key, as another program could (no validation).
    async fn put_raw(&self, key: &[u8], value: &[u8]) {
        match &self.fixture {
            Fixture::Etcd(e) => e.put_raw(key, value).await,
            Fixture::Consul(c) => {
                // Consul keys are text in its API; the raw part is the value.
                let key = String::from_utf8_lossy(key.strip_prefix(b"/").unwrap_or(key)).into_owned();
                let r = reqwest::Client::new()
                    .put(format!("{}/v1/kv/{key}", c.url().replace("consul://", "http://")))
                    .body(value.to_vec())
                    .send()
                    .await
                    .unwrap();
                assert!(r.status().is_success(), "{r:?}");
            }
            Fixture::Memory(m) => {
                m.put_raw(key, value).unwrap();
            }
            Fixture::Sqlite(dir) => {
                let conn = rusqlite::Connection::open(dir.path().join("store.db")).unwrap();
                conn.busy_timeout(Duration::from_secs(10)).unwrap();
                let rev: i64 = conn
                    .query_row("SELECT value FROM meta WHERE name = 'revision'", [], |r| r.get(0))
                    .unwrap();
                conn.execute(
                    "INSERT OR REPLACE INTO kv (key, value, create_rev, mod_rev, version, lease) VALUES (?1, ?2, ?3, ?3, 1, NULL)",
                    rusqlite::params![key, value, rev + 1],
                )
                .unwrap();
                conn.execute("UPDATE meta SET value = ?1 WHERE name = 'revision'", [rev + 1])
                    .unwrap();
            }
        }
    }

    /// Restarts the server (etcd, Consul). The embedded store has no server to restart.
    async fn restart_server(&mut self) {
        match &mut self.fixture {
            Fixture::Etcd(e) => e.restart(0).await,
            Fixture::Consul(c) => c.restart().await,
            Fixture::Sqlite(_) | Fixture::Memory(_) => {}
        }
    }
}

fn open_etcd(url: &str) -> DynStore {
    let url = StoreUrl::parse(url).expect("etcd URL");
    Arc::new(EtcdStore::new(&url, EtcdOptions::default()).expect("etcd client"))
}

fn open_consul(url: &str) -> DynStore {
    let url = StoreUrl::parse(url).expect("consul URL");
    Arc::new(ConsulStore::new(&url, Duration::from_secs(10)).expect("consul client"))
}

fn k(s: &str) -> Key {
    Key::new(s).expect("test key")
}

/// Collects events until `want` have arrived or 20 s have passed.
async fn collect(w: &mut WatchStream, want: usize) -> Vec<WatchEvent> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while out.len() < want {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, w.next()).await {
            Ok(Some(Ok(ev))) => out.push(ev),
            Ok(Some(Err(e))) => panic!("watch error: {e}"),
            Ok(None) => panic!("watch ended after {} events", out.len()),
            Err(_) => panic!("only {} of {want} events arrived in 20 s: {out:?}", out.len()),
        }
    }
    out
}

/// Asserts no further event arrives within `d`.
async fn quiet(w: &mut WatchStream, d: Duration) {
    if let Ok(Some(ev)) = tokio::time::timeout(d, w.next()).await {
        panic!("unexpected extra event {ev:?}");
    }
}

async fn put_get_delete(b: Backend) {
    let s = &b.store;
    let key = k("/contract/a");
    assert_eq!(s.get(&key).await.unwrap(), None);
    let r1 = s.put(&key, "one", None).await.unwrap();
    let kv = s.get(&key).await.unwrap().expect("key exists after put");
    assert_eq!(
        (kv.value.as_str(), kv.create_revision, kv.mod_revision, kv.version),
        ("one", r1, r1, 1)
    );
    assert_eq!(kv.lease, None);
    let r2 = s.put(&key, "two", None).await.unwrap();
    assert!(r2 > r1);
    let kv = s.get(&key).await.unwrap().unwrap();
    assert_eq!(
        (kv.value.as_str(), kv.create_revision, kv.mod_revision),
        ("two", r1, r2)
    );
    // Consul keeps no count of writes per key.
    assert_eq!(kv.version, if b.exact_history() { 2 } else { 1 });
    // Values are text, including the empty string and non-ASCII.
    s.put(&k("/contract/empty"), "", None).await.unwrap();
    assert_eq!(s.get(&k("/contract/empty")).await.unwrap().unwrap().value, "");
    s.put(&k("/contract/ünï"), "värde ✓", None).await.unwrap();
    assert_eq!(
        s.get(&k("/contract/ünï")).await.unwrap().unwrap().value,
        "värde ✓"
    );

    // Several keys in one read; a missing one is None.
    let many = s
        .get_many(&[key.clone(), k("/contract/none"), k("/contract/empty")])
        .await
        .unwrap();
    assert_eq!(many.len(), 3);
    assert_eq!(many[0].as_ref().map(|kv| kv.value.as_str()), Some("two"));
    assert_eq!(many[1], None);
    assert_eq!(many[2].as_ref().map(|kv| kv.value.as_str()), Some(""));
    // With the revision of the read: the store's current one while nothing writes
    // (0 only on Consul, whose read transactions carry no index).
    let (again, at) = s
        .get_many_at(&[key.clone(), k("/contract/none"), k("/contract/empty")])
        .await
        .unwrap();
    assert_eq!(again, many);
    if matches!(b.fixture, Fixture::Consul(_)) {
        assert_eq!(at, 0, "Consul cannot say");
    } else {
        assert_eq!(at, s.ping().await.unwrap(), "read at the current revision");
    }
    assert!(s.delete(&key).await.unwrap());
    assert_eq!(s.get(&key).await.unwrap(), None);
    let before = s.ping().await.unwrap();
    assert!(
        !s.delete(&key).await.unwrap(),
        "deleting a missing key reports false"
    );
    assert_eq!(
        s.ping().await.unwrap(),
        before,
        "deleting a missing key does not advance the revision"
    );
    // A key that is a prefix of another is its own key.
    s.put(&k("/contract/p"), "1", None).await.unwrap();
    s.put(&k("/contract/p2"), "2", None).await.unwrap();
    assert_eq!(s.get(&k("/contract/p")).await.unwrap().unwrap().value, "1");
}

async fn list_ten_thousand_keys(b: Backend) {
    let s = &b.store;
    // Neighbours that a sloppy range would catch.
    for outside in ["/bulk", "/bulk0", "/bulj/x", "/bulk0/x"] {
        s.put(&k(outside), "outside", None).await.unwrap();
    }
    // Batches within every backend's transaction limit (Consul: 64 operations).
    let per = 50.min(s.max_txn_ops());
    let mut last = 0;
    for batch in 0..10_000 / per {
        let mut txn = Txn::new();
        for i in 0..per {
            let n = batch * per + i;
            txn = txn.then(Op::put(k(&format!("/bulk/{n:05}")), format!("value-{n}")));
        }
        match s.txn(txn).await.unwrap() {
            TxnOutcome::Committed(r) => last = r,
            other => panic!("unconditional txn lost: {other:?}"),
        }
    }
    let listing = s.list(&k("/bulk/")).await.unwrap();
    assert_eq!(listing.kvs.len(), 10_000);
    assert!(listing.revision >= last);
    for (i, kv) in listing.kvs.iter().enumerate() {
        assert_eq!(
            kv.key.as_str(),
            format!("/bulk/{i:05}"),
            "keys come back in order"
        );
        assert_eq!(kv.value, format!("value-{i}"));
    }
    assert_eq!(s.delete_prefix(&k("/bulk/")).await.unwrap(), 10_000);
    assert!(s.list(&k("/bulk/")).await.unwrap().kvs.is_empty());
    for outside in ["/bulk", "/bulk0", "/bulj/x", "/bulk0/x"] {
        assert!(s.get(&k(outside)).await.unwrap().is_some(), "{outside} survives");
    }
}

async fn txn_race_has_one_winner(b: Backend) {
    let key = k("/contract/leader");
    let mut tasks = Vec::new();
    for i in 0..8 {
        let s = b.another_client().await;
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let txn = Txn::new()
                .when(Compare::Absent(key.clone()))
                .then(Op::put(key, format!("task-{i}")));
            (i, s.txn(txn).await.unwrap())
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        let (i, outcome) = t.await.unwrap();
        if outcome.committed() {
            winners.push(i);
        }
    }
    assert_eq!(winners.len(), 1, "exactly one task wins: {winners:?}");
    let value = b.store.get(&key).await.unwrap().unwrap().value;
    assert_eq!(value, format!("task-{}", winners[0]));
}

async fn txn_compare_and_set_loses_no_update(b: Backend) {
    let key = k("/contract/counter");
    b.store.put(&key, "0", None).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let s = b.another_client().await;
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let mut lost = 0;
            for _ in 0..15 {
                loop {
                    let kv = s.get(&key).await.unwrap().unwrap();
                    let n: u64 = kv.value.parse().unwrap();
                    let txn = Txn::new()
                        .when(Compare::ModRevision(key.clone(), kv.mod_revision))
                        .then(Op::put(key.clone(), (n + 1).to_string()));
                    if s.txn(txn).await.unwrap().committed() {
                        break;
                    }
                    lost += 1;
                }
            }
            lost
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(b.store.get(&key).await.unwrap().unwrap().value, "90");
}

async fn txn_is_atomic(b: Backend) {
    let s = &b.store;
    s.put(&k("/t/c"), "old", None).await.unwrap();
    s.put(&k("/t/d/1"), "x", None).await.unwrap();
    s.put(&k("/t/d/2"), "y", None).await.unwrap();
    let mut w = s.watch(&k("/t/"), 0).await.unwrap();
    let ops = || {
        Txn::new()
            .then(Op::put(k("/t/a"), "A"))
            .then(Op::put(k("/t/b"), "B"))
            .then(Op::Delete(k("/t/c")))
            .then(Op::DeletePrefix(k("/t/d/")))
    };
    // A failing compare (of each kind) writes nothing.
    let before = s.ping().await.unwrap();
    for c in [
        Compare::Absent(k("/t/c")),
        Compare::ModRevision(k("/t/c"), 1),
        Compare::Value(k("/t/c"), "new".into()),
        Compare::Value(k("/t/missing"), String::new()),
    ] {
        let mut txn = ops();
        txn.compares.push(c.clone());
        assert!(
            matches!(s.txn(txn).await.unwrap(), TxnOutcome::Lost(_)),
            "{c:?} must fail"
        );
    }
    assert_eq!(
        s.ping().await.unwrap(),
        before,
        "failed transactions leave no trace"
    );
    assert_eq!(s.get(&k("/t/a")).await.unwrap(), None);
    assert_eq!(s.list(&k("/t/d/")).await.unwrap().kvs.len(), 2);

    // A holding compare applies every op at one revision.
    let c = s.get(&k("/t/c")).await.unwrap().unwrap();
    let mut txn = ops()
        .when(Compare::Value(k("/t/c"), "old".into()))
        .when(Compare::ModRevision(k("/t/c"), c.mod_revision))
        .when(Compare::Absent(k("/t/a")));
    txn.compares.push(Compare::ModRevision(k("/t/never"), 0));
    let TxnOutcome::Committed(rev) = s.txn(txn).await.unwrap() else {
        panic!("holding compares must commit");
    };
    let a = s.get(&k("/t/a")).await.unwrap().unwrap();
    let bb = s.get(&k("/t/b")).await.unwrap().unwrap();
    assert_eq!((a.mod_revision, bb.mod_revision), (rev, rev));
    assert_eq!(s.get(&k("/t/c")).await.unwrap(), None);
    assert!(s.list(&k("/t/d/")).await.unwrap().kvs.is_empty());
    let events = collect(&mut w, 5).await;
    assert!(
        events.iter().all(|e| e.revision() == rev),
        "one revision for all: {events:?}"
    );
    quiet(&mut w, Duration::from_millis(300)).await;
}

async fn txn_rejects_writing_a_key_twice(b: Backend) {
    let s = &b.store;
    s.put(&k("/dup/x"), "old", None).await.unwrap();
    let before = s.ping().await.unwrap();
    for txn in [
        Txn::new()
            .then(Op::put(k("/dup/a"), "1"))
            .then(Op::put(k("/dup/a"), "2")),
        Txn::new()
            .then(Op::Delete(k("/dup/a")))
            .then(Op::put(k("/dup/a"), "2")),
        Txn::new()
            .then(Op::DeletePrefix(k("/dup/")))
            .then(Op::put(k("/dup/b"), "2")),
    ] {
        let err = s.txn(txn).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        assert!(err.to_string().contains("duplicate key"), "{err}");
    }
    assert_eq!(
        s.ping().await.unwrap(),
        before,
        "a rejected transaction writes nothing"
    );
    assert_eq!(s.get(&k("/dup/x")).await.unwrap().unwrap().value, "old");
}

async fn lease_expiry_removes_bound_keys(b: Backend) {
    let s = &b.store;
    let lease = s.grant_lease(Duration::from_secs(2)).await.unwrap();
    s.put(&k("/live/a"), "alive", Some(&lease.id)).await.unwrap();
    let kv = s.get(&k("/live/a")).await.unwrap().unwrap();
    assert_eq!(kv.lease.as_ref(), Some(&lease.id));
    // Renewed: outlives its TTL.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        s.keep_alive(&lease.id).await.unwrap();
    }
    assert!(
        s.get(&k("/live/a")).await.unwrap().is_some(),
        "a renewed lease keeps its key"
    );
    // Not renewed: the key goes (Consul: up to twice the TTL it granted, at least 10 s).
    let limit = lease.ttl * 2 + Duration::from_secs(5);
    let start = Instant::now();
    while s.get(&k("/live/a")).await.unwrap().is_some() {
        assert!(start.elapsed() < limit, "key outlived its lease");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let err = s.keep_alive(&lease.id).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let err = s.put(&k("/live/b"), "x", Some(&lease.id)).await.unwrap_err();
    assert!(matches!(err, StoreError::LeaseNotFound { .. }), "{err}");

    // Revoked: the key goes at once; revoking again is fine.
    let l2 = s.grant_lease(Duration::from_secs(30)).await.unwrap();
    s.put(&k("/live/c"), "x", Some(&l2.id)).await.unwrap();
    s.revoke_lease(&l2.id).await.unwrap();
    assert_eq!(s.get(&k("/live/c")).await.unwrap(), None);
    s.revoke_lease(&l2.id).await.unwrap();
}

/// Renewals carry on across a restart of the server (etcd keeps its keep-alive
/// stream open between renewals: a broken one is opened again), and a revoked
/// lease is not found.
async fn keep_alive_carries_on_across_a_restart(mut b: Backend) {
    let lease = b.store.grant_lease(Duration::from_secs(30)).await.unwrap();
    let key = k("/contract/kept");
    b.store.put(&key, "x", Some(&lease.id)).await.unwrap();
    for _ in 0..3 {
        let ttl = b.store.keep_alive(&lease.id).await.unwrap();
        assert!(ttl > Duration::ZERO);
    }
    b.restart_server().await;
    let s = &b.store;
    let ttl = s.keep_alive(&lease.id).await.unwrap();
    assert!(ttl > Duration::ZERO, "renewed after the restart");
    assert!(s.keep_alive(&lease.id).await.unwrap() > Duration::ZERO);
    assert!(
        s.get(&key).await.unwrap().is_some(),
        "the bound key is still there"
    );
    s.revoke_lease(&lease.id).await.unwrap();
    let err = s.keep_alive(&lease.id).await.unwrap_err();
    assert!(matches!(err, StoreError::LeaseNotFound { .. }), "{err}");
    assert!(
        s.get(&key).await.unwrap().is_none(),
        "revoking deleted the bound key"
    );
}

async fn watch_delivers_every_event_in_order_across_restart(mut b: Backend) {
    let writer = b.another_client().await;
    let from = b.store.ping().await.unwrap() + 1;
    let mut w = b.store.watch(&k("/w/"), from).await.unwrap();
    let mut expected = Vec::new();
    for i in 0..40 {
        writer
            .put(&k(&format!("/w/{i}")), &format!("v{i}"), None)
            .await
            .unwrap();
        writer.put(&k("/elsewhere"), "noise", None).await.unwrap();
        expected.push(format!("put /w/{i}"));
        if i % 10 == 9 {
            writer.delete(&k(&format!("/w/{}", i - 1))).await.unwrap();
            expected.push(format!("delete /w/{}", i - 1));
        }
    }
    let first = if b.exact_history() {
        collect(&mut w, expected.len() / 2).await
    } else {
        collect(&mut w, 1).await
    };
    b.restart_server().await;
    for i in 40..80 {
        // Writes may race the restart: retry until the store takes them.
        let key = k(&format!("/w/{i}"));
        let start = Instant::now();
        while let Err(e) = writer.put(&key, &format!("v{i}"), None).await {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "store did not come back: {e}"
            );
        }
        expected.push(format!("put /w/{i}"));
    }
    if !b.exact_history() {
        // Only the latest state of each key: the events, applied in order, must end
        // in the store's state, with revisions that never go back.
        let mut all = first;
        let want: BTreeMap<String, String> = b
            .store
            .list(&k("/w/"))
            .await
            .unwrap()
            .kvs
            .into_iter()
            .map(|kv| (kv.key.to_string(), kv.value))
            .collect();
        let mut state: BTreeMap<String, String> = BTreeMap::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            state.clear();
            for e in &all {
                match e {
                    WatchEvent::Put(kv) => {
                        state.insert(kv.key.to_string(), kv.value.clone());
                    }
                    WatchEvent::Delete { key, .. } => {
                        state.remove(key.as_str());
                    }
                    WatchEvent::Reset { .. } => panic!("no reset expected: {e:?}"),
                }
            }
            if state == want {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the events never reached the store's state"
            );
            all.extend(collect(&mut w, 1).await);
        }
        let revs: Vec<i64> = all.iter().map(WatchEvent::revision).collect();
        assert!(
            revs.windows(2).all(|p| p[0] <= p[1]),
            "revisions never go back: {revs:?}"
        );
        return;
    }
    let rest = collect(&mut w, expected.len() - first.len()).await;
    let got: Vec<String> = first
        .iter()
        .chain(rest.iter())
        .map(|e| match e {
            WatchEvent::Put(kv) => format!("put {}", kv.key),
            WatchEvent::Delete { key, .. } => format!("delete {key}"),
            WatchEvent::Reset { .. } => "reset".into(),
        })
        .collect();
    assert_eq!(got, expected);
    let revs: Vec<i64> = first
        .iter()
        .chain(rest.iter())
        .map(WatchEvent::revision)
        .collect();
    assert!(
        revs.windows(2).all(|p| p[0] < p[1]),
        "revisions strictly increase: {revs:?}"
    );
    quiet(&mut w, Duration::from_millis(500)).await;
}

async fn watch_from_now_sees_only_new_events(b: Backend) {
    b.store.put(&k("/n/old"), "x", None).await.unwrap();
    let mut w = b.store.watch(&k("/n/"), 0).await.unwrap();
    b.store.put(&k("/n/new"), "y", None).await.unwrap();
    let ev = collect(&mut w, 1).await;
    match &ev[0] {
        WatchEvent::Put(kv) => assert_eq!((kv.key.as_str(), kv.value.as_str()), ("/n/new", "y")),
        other => panic!("expected the new put, got {other:?}"),
    }
    quiet(&mut w, Duration::from_millis(300)).await;
}

async fn watch_recovers_from_compaction(b: Backend) {
    let s = &b.store;
    let old = s.put(&k("/c/a"), "1", None).await.unwrap();
    s.put(&k("/c/b"), "2", None).await.unwrap();
    s.delete(&k("/c/a")).await.unwrap();
    let latest = s.put(&k("/c/c"), "3", None).await.unwrap();
    s.compact(latest).await.unwrap();
    s.compact(latest).await.unwrap(); // compacting again is harmless
    let mut w = s.watch(&k("/c/"), old).await.unwrap();
    let ev = collect(&mut w, 1).await;
    let WatchEvent::Reset { kvs, revision } = &ev[0] else {
        panic!("a watch from a compacted revision starts with a reset, got {ev:?}");
    };
    assert!(*revision >= latest);
    let state: BTreeMap<&str, &str> = kvs
        .iter()
        .map(|kv| (kv.key.as_str(), kv.value.as_str()))
        .collect();
    assert_eq!(state, BTreeMap::from([("/c/b", "2"), ("/c/c", "3")]));
    s.put(&k("/c/d"), "4", None).await.unwrap();
    let ev = collect(&mut w, 1).await;
    assert!(
        matches!(&ev[0], WatchEvent::Put(kv) if kv.key.as_str() == "/c/d"),
        "{ev:?}"
    );
}

/// Several prefixes on one watch (on etcd, one gRPC stream): every prefix's events
/// arrive, each key's in order, across a restart of the server; from a compacted
/// revision the first events are resets holding every prefix's keys (one on etcd).
async fn watch_many_carries_every_prefix_across_restart_and_compaction(mut b: Backend) {
    let writer = b.another_client().await;
    let prefixes = [k("/m/a/"), k("/m/b/"), k("/m/c/")];
    let from = b.store.ping().await.unwrap() + 1;
    let mut w = b.store.watch_many(&prefixes, from).await.unwrap();
    let write = async |range: std::ops::Range<usize>| {
        for i in range {
            let key = k(&format!("/m/{}/{}", ["a", "b", "c"][i % 3], i % 4));
            let start = Instant::now();
            // Writes may race the restart: retry until the store takes them.
            while let Err(e) = writer.put(&key, &format!("v{i}"), None).await {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "store did not come back: {e}"
                );
            }
            writer.put(&k("/m/elsewhere"), "noise", None).await.unwrap();
        }
    };
    write(0..30).await;
    let mut all = collect(&mut w, if b.exact_history() { 30 } else { 1 }).await;
    b.restart_server().await;
    write(30..60).await;
    // Each key ends at its last value, reached through events in revision order.
    let want: BTreeMap<String, String> = (0..60)
        .map(|i| {
            (
                format!("/m/{}/{}", ["a", "b", "c"][i % 3], i % 4),
                format!("v{i}"),
            )
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut state = BTreeMap::new();
        let mut last_rev: BTreeMap<String, i64> = BTreeMap::new();
        for e in &all {
            let WatchEvent::Put(kv) = e else {
                panic!("only puts were written: {e:?}")
            };
            let prev = last_rev.insert(kv.key.to_string(), kv.mod_revision);
            assert!(
                prev.is_none_or(|p| p < kv.mod_revision),
                "a key's events in order: {all:?}"
            );
            state.insert(kv.key.to_string(), kv.value.clone());
        }
        if state == want {
            if b.exact_history() {
                assert_eq!(all.len(), 60, "every event, once: {all:?}");
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the events never reached the store's state: {state:?}"
        );
        all.extend(collect(&mut w, 1).await);
    }
    quiet(&mut w, Duration::from_millis(300)).await;
    let latest = b.store.put(&k("/m/a/last"), "x", None).await.unwrap();
    b.store.compact(latest).await.unwrap();
    let mut w = b.store.watch_many(&prefixes, from).await.unwrap();
    let mut expected: std::collections::BTreeSet<String> = want.keys().cloned().collect();
    expected.insert("/m/a/last".into());
    // One reset holding every prefix's keys (etcd), or one per prefix.
    let mut keys = std::collections::BTreeSet::new();
    while keys != expected {
        let ev = collect(&mut w, 1).await;
        let WatchEvent::Reset { kvs, .. } = &ev[0] else {
            panic!("a watch from a compacted revision starts with resets, got {ev:?} with {keys:?} seen");
        };
        keys.extend(kvs.iter().map(|kv| kv.key.to_string()));
        assert!(keys.is_subset(&expected), "only the prefixes' keys: {keys:?}");
    }
}

/// A value (and, where the store allows it, a key name) that is not UTF-8 text is
/// reported as such, and never fails the listing, the get or the watch it is in.
async fn bytes_that_are_not_text_do_not_blind_a_listing(b: Backend) {
    let s = &b.store;
    s.put(&k("/t/a"), "1", None).await.unwrap();
    let mut w = s.watch(&k("/t/"), 0).await.unwrap();
    b.put_raw(b"/t/b", b"v\xff2").await;
    s.put(&k("/t/c"), "3", None).await.unwrap();
    if !matches!(b.fixture, Fixture::Consul(_)) {
        b.put_raw(b"/t/bad\xffkey", b"x").await;
    }
    let l = s.list(&k("/t/")).await.unwrap();
    let got: Vec<(&str, &str, bool)> = l
        .kvs
        .iter()
        .map(|kv| (kv.key.as_str(), kv.value.as_str(), kv.not_text))
        .collect();
    assert_eq!(
        got,
        vec![
            ("/t/a", "1", false),
            ("/t/b", "v\\xff2", true),
            ("/t/c", "3", false)
        ]
    );
    let one = s.get(&k("/t/b")).await.unwrap().unwrap();
    assert!(one.not_text);
    let many = s.get_many(&[k("/t/a"), k("/t/b")]).await.unwrap();
    assert!(many[1].as_ref().unwrap().not_text);
    // The watch goes on past the bad value (the embedded store's raw write bypasses
    // its event log, so there only the later put is seen).
    let want = if matches!(b.fixture, Fixture::Sqlite(_)) {
        1
    } else {
        2
    };
    let evs = collect(&mut w, want).await;
    let last = evs.last().unwrap();
    assert!(
        matches!(last, WatchEvent::Put(kv) if kv.key.as_str() == "/t/c" || kv.not_text),
        "{evs:?}"
    );
}

/// `changed_since` may say "list again" when nothing changed (a store without
/// counts always does), never "unchanged" after a change: a key added, one
/// rewritten with the same value, one deleted, one deleted and another added (the
/// same number of keys). etcd answers "unchanged" when nothing under the prefix
/// changed, whatever changed beside it.
async fn changed_since_misses_no_change_under_the_prefix(b: Backend) {
    use jio_common::store::Seen;
    let s = b.store.clone();
    let prefix = k("/cs/");
    s.put(&k("/cs/a"), "1", None).await.unwrap();
    s.put(&k("/cs/b"), "2", None).await.unwrap();
    let counts = matches!(b.fixture, Fixture::Etcd(_));
    let mut seen = Seen::of(&s.list(&prefix).await.unwrap());
    let changes: [(&str, Option<&str>); 5] = [
        ("/cs/c", Some("3")),
        ("/cs/a", Some("1")),
        ("/cs/b", None),
        ("/cs/a", None),
        ("/cs/d", Some("4")),
    ];
    for (i, (key, value)) in changes.iter().enumerate() {
        s.put(&k("/csx/beside"), &i.to_string(), None).await.unwrap();
        let unchanged = !s.changed_since(&prefix, &seen).await.unwrap();
        assert_eq!(
            unchanged, counts,
            "before change {i}: only etcd can tell nothing changed"
        );
        match value {
            Some(v) => {
                s.put(&k(key), v, None).await.unwrap();
            }
            None => {
                assert!(s.delete(&k(key)).await.unwrap());
            }
        }
        if i == 3 {
            // One deleted (above) and another added: as many keys as before.
            s.put(&k("/cs/e"), "5", None).await.unwrap();
        }
        assert!(
            s.changed_since(&prefix, &seen).await.unwrap(),
            "change {i} ({key} {value:?}) must be seen"
        );
        seen = Seen::of(&s.list(&prefix).await.unwrap());
    }
}

/// A store restored from an older copy behind the same address, whose revision has
/// since passed the one seen, with as many keys under the prefix: etcd answers
/// "changed" (its newest key there is older than the one seen).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_since_sees_a_store_restored_from_an_older_copy() {
    use jio_common::store::Seen;
    let prefix = k("/cs/");
    let (now, older) = (Etcd::start().await, Etcd::start().await);
    let (a, b) = (open_etcd(&now.url()), open_etcd(&older.url()));
    // The store as seen: its addresses written after 20 other writes.
    for i in 0..20 {
        a.put(&k("/elsewhere"), &i.to_string(), None).await.unwrap();
    }
    for key in ["/cs/a", "/cs/b"] {
        a.put(&k(key), "new", None).await.unwrap();
    }
    let seen = Seen::of(&a.list(&prefix).await.unwrap());
    assert!(!a.changed_since(&prefix, &seen).await.unwrap());
    // The older copy: the same keys written first, then more writes beside them
    // than the store seen ever had.
    for key in ["/cs/a", "/cs/b"] {
        b.put(&k(key), "old", None).await.unwrap();
    }
    for i in 0..40 {
        b.put(&k("/elsewhere"), &i.to_string(), None).await.unwrap();
    }
    assert!(b.list(&prefix).await.unwrap().revision > seen.revision);
    assert!(
        b.changed_since(&prefix, &seen).await.unwrap(),
        "an older copy with as many keys and a newer revision was taken for the store seen"
    );
}

macro_rules! contract {
    ($($name:ident),* $(,)?) => {
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::etcd().await).await
                }
            )*
        }
        mod etcd_tls_auth {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::etcd_secure().await).await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::sqlite().await).await
                }
            )*
        }
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::memory().await).await
                }
            )*
        }
        mod consul {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::consul().await).await
                }
            )*
        }
    };
}

contract!(
    put_get_delete,
    bytes_that_are_not_text_do_not_blind_a_listing,
    list_ten_thousand_keys,
    txn_race_has_one_winner,
    txn_compare_and_set_loses_no_update,
    txn_is_atomic,
    txn_rejects_writing_a_key_twice,
    lease_expiry_removes_bound_keys,
    keep_alive_carries_on_across_a_restart,
    watch_delivers_every_event_in_order_across_restart,
    watch_from_now_sees_only_new_events,
    watch_recovers_from_compaction,
    watch_many_carries_every_prefix_across_restart_and_compaction,
    changed_since_misses_no_change_under_the_prefix,
);

/// A store that accepts connections and never answers (a frozen etcd): the retry
/// budget is a deadline that counts the requests too.
#[tokio::test]
async fn a_silent_endpoint_fails_within_the_retry_budget() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Accept and hold every connection, answering nothing.
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        for c in listener.incoming().take(64) {
            conns.push(c);
        }
    });
    let url = StoreUrl::parse(&format!("etcd://127.0.0.1:{port}")).unwrap();
    let opts = EtcdOptions {
        retry_budget: Duration::from_secs(2),
        ..EtcdOptions::default()
    };
    let store = EtcdStore::new(&url, opts).unwrap();
    let start = Instant::now();
    let err = store.ping().await.unwrap_err();
    assert!(
        start.elapsed() < Duration::from_millis(3500),
        "a 2 s budget took {:?}",
        start.elapsed()
    );
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let consul = ConsulStore::new(
        &StoreUrl::parse(&format!("consul://127.0.0.1:{port}")).unwrap(),
        Duration::from_secs(2),
    )
    .unwrap();
    let start = Instant::now();
    let err = consul.ping().await.unwrap_err();
    assert!(
        start.elapsed() < Duration::from_millis(3500),
        "a 2 s budget took {:?}",
        start.elapsed()
    );
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    drop(held);
}

#[tokio::test]
async fn unreachable_etcd_is_a_quick_clear_error() {
    let port = jio_tests::free_port();
    let url = StoreUrl::parse(&format!("etcd://127.0.0.1:{port}")).unwrap();
    let opts = EtcdOptions {
        retry_budget: Duration::from_millis(500),
        ..EtcdOptions::default()
    };
    let store = EtcdStore::new(&url, opts).unwrap();
    let start = Instant::now();
    let err = store.ping().await.unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "gave up in {:?}",
        start.elapsed()
    );
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    let msg = err.to_string();
    assert!(msg.contains(&format!("127.0.0.1:{port}")), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
}
