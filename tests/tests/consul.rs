//! Consul-only behaviour of the store layer, against the Consul API test server.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use jio_common::keys::Key;
use jio_common::store::{ConsulStore, DynStore, ErrorKind, Op, StoreUrl, Txn, WatchEvent};
use jio_tests::consul::{ConsulOptions, ConsulServer, reset_index};

fn client(url: &str) -> DynStore {
    Arc::new(ConsulStore::new(&StoreUrl::parse(url).unwrap(), Duration::from_secs(2)).unwrap())
}

fn k(s: &str) -> Key {
    Key::new(s).unwrap()
}

#[tokio::test]
async fn transactions_over_64_operations_are_refused_and_plans_split() {
    let server = ConsulServer::start(ConsulOptions::default()).await;
    let s = client(&server.url());
    assert_eq!(s.max_txn_ops(), 64);
    let ops: Vec<Op> = (0..65)
        .map(|i| Op::put(k(&format!("/big/{i:03}")), "x"))
        .collect();
    let err = s
        .txn(Txn {
            compares: vec![],
            ops,
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("at most 64"), "{err}");
    assert!(
        s.list(&k("/big/")).await.unwrap().kvs.is_empty(),
        "nothing was written"
    );
}

#[tokio::test]
async fn an_index_going_backwards_makes_the_watch_relist() {
    let server = ConsulServer::start(ConsulOptions::default()).await;
    let s = client(&server.url());
    let mut w = s.watch(&k("/x/"), 0).await.unwrap();
    s.put(&k("/x/a"), "1", None).await.unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        matches!(&ev, WatchEvent::Put(kv) if kv.key.as_str() == "/x/a"),
        "{ev:?}"
    );
    // A snapshot restore: the index goes back; the watch must start again from the state.
    reset_index(&server, 1).await;
    s.put(&k("/x/b"), "2", None).await.unwrap();
    let mut seen_b = false;
    let mut reset = false;
    while !(reset && seen_b) {
        let ev = tokio::time::timeout(Duration::from_secs(10), w.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        match ev {
            WatchEvent::Reset { kvs, .. } => {
                reset = true;
                assert!(kvs.iter().any(|kv| kv.key.as_str() == "/x/a"), "{kvs:?}");
                seen_b |= kvs.iter().any(|kv| kv.key.as_str() == "/x/b");
            }
            WatchEvent::Put(kv) => seen_b |= kv.key.as_str() == "/x/b",
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn acl_token_denied_is_a_clear_error_without_the_token() {
    let server = ConsulServer::start(ConsulOptions {
        token: Some("s3cret-acl-token".into()),
        datacenter: Some("bom1".into()),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let wrong = dir.path().join("wrong.token");
    std::fs::write(&wrong, "not-the-token-77\n").unwrap();
    let right = dir.path().join("right.token");
    std::fs::write(&right, "s3cret-acl-token\n").unwrap();
    for f in [&wrong, &right] {
        std::fs::set_permissions(f, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    }

    for url in [
        server.url(),
        format!("{}?token_file={}", server.url(), wrong.display()),
    ] {
        let err = client(&url).ping().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Denied, "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("Permission denied") && msg.contains(&server.addr().to_string()),
            "{msg}"
        );
        assert!(
            !msg.contains("not-the-token-77") && !msg.contains("s3cret"),
            "{msg}"
        );
    }
    let ok = client(&format!(
        "{}?token_file={}&dc=bom1",
        server.url(),
        right.display()
    ));
    ok.put(&k("/current_version"), "v1", None).await.unwrap();
    assert_eq!(ok.get(&k("/current_version")).await.unwrap().unwrap().value, "v1");
    // Another datacenter is refused with Consul's own words.
    let other = client(&format!(
        "{}?token_file={}&dc=fra1",
        server.url(),
        right.display()
    ));
    let err = other.get(&k("/current_version")).await.unwrap_err();
    assert!(err.to_string().contains("No path to datacenter"), "{err}");
}
