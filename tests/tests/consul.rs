//! Consul-only behaviour of the store layer, against the Consul API test server.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use jio_common::keys::Key;
use jio_common::store::{
    Compare, ConsulStore, DynStore, ErrorKind, Op, StoreUrl, Txn, TxnOutcome, WatchEvent,
};
use jio_tests::consul::{ConsulOptions, ConsulServer, ConsulTls, control, expire_session, reset_index};
use jio_tests::pki::Pki;

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
        ..ConsulOptions::default()
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

    // No token (the anonymous token may do nothing), and a token Consul does not know.
    for (url, said) in [
        (server.url(), "Permission denied"),
        (
            format!("{}?token_file={}", server.url(), wrong.display()),
            "ACL not found",
        ),
    ] {
        let err = client(&url).ping().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Denied, "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains(said) && msg.contains(&server.addr().to_string()),
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

/// `consuls://` with a CA, a client certificate and a token, on an HTTPS server that
/// verifies clients (Consul's `verify_incoming`); every missing or wrong piece is
/// one clear line and nothing is written.
#[tokio::test]
async fn consul_over_tls_with_client_certificates() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(&dir.path().join("pki"));
    let server = ConsulServer::start(ConsulOptions {
        token: Some("s3cret-acl-token".into()),
        datacenter: None,
        tls: Some(ConsulTls {
            cert: pki.server.cert.clone(),
            key: pki.server.key.clone(),
            client_ca: Some(pki.ca.clone()),
        }),
        ..ConsulOptions::default()
    })
    .await;
    let token = dir.path().join("consul.token");
    std::fs::write(&token, "s3cret-acl-token\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let url = |ca: &std::path::Path, cert: Option<(&std::path::Path, &std::path::Path)>| {
        let mut u = format!("{}?ca_file={}", server.url(), ca.display());
        if let Some((c, k)) = cert {
            u.push_str(&format!("&cert_file={}&key_file={}", c.display(), k.display()));
        }
        u.push_str(&format!("&token_file={}", token.display()));
        u
    };
    let good = url(&pki.ca, Some((&pki.client.cert, &pki.client.key)));
    assert!(good.starts_with("consuls://"));
    let s = client(&good);
    s.put(&k("/tls/a"), "1", None).await.unwrap();
    assert_eq!(s.get(&k("/tls/a")).await.unwrap().unwrap().value, "1");
    // The same address checked under the name the certificate carries.
    let by_name = client(&format!("{good}&server_name=etcd.test"));
    assert_eq!(by_name.get(&k("/tls/a")).await.unwrap().unwrap().value, "1");

    for (what, bad, expect) in [
        (
            "another CA",
            url(&pki.other_ca, Some((&pki.client.cert, &pki.client.key))),
            "TLS: the server's certificate is not signed by ca_file",
        ),
        (
            "no client certificate",
            url(&pki.ca, None),
            "TLS: the server wants a client certificate and none is configured",
        ),
        (
            "an expired client certificate",
            url(&pki.ca, Some((&pki.client_expired.cert, &pki.client_expired.key))),
            "TLS: the server refused the client certificate",
        ),
    ] {
        let err = client(&bad).put(&k("/tls/a"), "2", None).await.unwrap_err();
        let msg = err.to_string();
        assert_eq!(err.kind(), ErrorKind::Denied, "{what}: {msg}");
        assert!(msg.contains(expect), "{what}: {msg}");
        assert!(!msg.contains('\n') && !msg.contains("s3cret"), "{what}: {msg}");
    }
    assert_eq!(
        s.get(&k("/tls/a")).await.unwrap().unwrap().value,
        "1",
        "nothing written"
    );
    // A TLS parameter on plain consul:// is refused, naming the rule.
    let err = StoreUrl::parse(&format!(
        "consul://{}?ca_file={}",
        server.addr(),
        pki.ca.display()
    ))
    .unwrap_err();
    assert!(err.to_string().contains("need TLS: use consuls://"), "{err}");
}

/// A token with the `jio-agent` policy (docs/tls-and-users.md): what it may not write is a
/// refusal naming the key, in a transaction too (Consul answers 409 there, which
/// must never read as a lost compare, or a driver would replan forever), and
/// nothing of the transaction is written.
#[tokio::test]
async fn acl_denials_name_the_key_and_are_never_lost_compares() {
    use jio_tests::consul::AclToken;
    let server = ConsulServer::start(ConsulOptions {
        token: Some("operator-secret-1".into()),
        tokens: vec![
            AclToken::jio_agent("agent-secret-2"),
            AclToken {
                secret: "partial-secret-3".into(),
                rules: vec![
                    (String::new(), jio_tests::consul::Access::Write),
                    ("runs/".into(), jio_tests::consul::Access::Deny),
                ],
            },
        ],
        ..ConsulOptions::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let token = |name: &str, secret: &str| client(&server.url_with_token(dir.path(), name, secret));
    let operator = token("operator.token", "operator-secret-1");
    let agent = token("agent.token", "agent-secret-2");
    operator.put(&k("/current_version"), "v1", None).await.unwrap();
    // Within its policy.
    agent
        .put(&k("/status/validated/success/v1/h1"), "", None)
        .await
        .unwrap();
    assert_eq!(
        agent.get(&k("/current_version")).await.unwrap().unwrap().value,
        "v1"
    );
    // A plain write outside it.
    let err = agent.put(&k("/current_version"), "v9", None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Denied, "{err}");
    assert!(
        err.to_string()
            .contains("Permission denied (writing /current_version with this ACL token)"),
        "{err}"
    );
    // A transaction: one allowed write, two denied ones, and a compare that a key
    // is absent, which Consul checks as a write (`check-not-exists`).
    let txn = Txn::new()
        .when(Compare::ModRevision(k("/current_version"), 0))
        .then(Op::put(k("/status/validated/success/v1/h2"), ""))
        .then(Op::put(k("/config_state/enable_puppet/global"), "true"))
        .then(Op::Delete(k("/locks/epoch")));
    let err = agent.txn(txn).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Denied, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("writing /current_version, /config_state/enable_puppet/global, /locks/epoch"),
        "{msg}"
    );
    assert!(!msg.contains("secret"), "{msg}");
    assert!(
        agent
            .get(&k("/status/validated/success/v1/h2"))
            .await
            .unwrap()
            .is_none()
    );
    // A delete it may not make is a refusal, not "there was nothing to delete".
    let err = agent.delete(&k("/current_version")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Denied, "{err}");
    assert_eq!(
        operator.get(&k("/current_version")).await.unwrap().unwrap().value,
        "v1"
    );
    // A token that may not read part of what it lists: Consul filters the list;
    // a partial fleet is refused, never used.
    operator.put(&k("/runs/h1"), "{}", None).await.unwrap();
    let partial = token("partial.token", "partial-secret-3");
    assert_eq!(partial.list(&k("/hosts/")).await.unwrap().kvs.len(), 0);
    let err = partial.list(&k("/")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Denied, "{err}");
    assert!(err.to_string().contains("left out keys under /"), "{err}");
}

/// The next watch event, within 10 s.
async fn next_event(w: &mut jio_common::store::WatchStream) -> WatchEvent {
    tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .expect("a watch event within 10 s")
        .expect("the watch goes on")
        .expect("no watch error")
}

/// Consul reaps deletion records (tombstones) about 15 minutes after a delete, so
/// the index of a prefix whose newest change was a delete goes down. A watch
/// waiting on the higher index still sees the next write at once (its index passes
/// the one waited on: nothing is missed); when its wait runs out first, it starts
/// again from the whole current state, a `Reset` whose revision is lower than the
/// events before it. What consumes it: the agent's view drops everything and the
/// next pass reads; `jioctl`'s driver reads the whole fleet again.
#[tokio::test]
async fn reaped_tombstones_lower_the_index_and_no_event_is_missed() {
    let server = ConsulServer::start(ConsulOptions {
        max_wait: Some(Duration::from_secs(3)),
        ..ConsulOptions::default()
    })
    .await;
    let s = client(&server.url());
    s.put(&k("/runs/a"), "1", None).await.unwrap();
    let mut w = s.watch(&k("/runs/"), 0).await.unwrap();
    s.put(&k("/runs/b"), "1", None).await.unwrap();
    assert!(matches!(next_event(&mut w).await, WatchEvent::Put(kv) if kv.key.as_str() == "/runs/b"));
    assert!(s.delete(&k("/runs/b")).await.unwrap());
    let deleted = match next_event(&mut w).await {
        WatchEvent::Delete { key, revision } if key.as_str() == "/runs/b" => revision,
        other => panic!("{other:?}"),
    };
    // Reaped, then written at once: the write is an event like any other (on a
    // slow machine the wait may run out first: a reset, then the write).
    control(&server, "reap").await;
    s.put(&k("/runs/c"), "1", None).await.unwrap();
    loop {
        match next_event(&mut w).await {
            WatchEvent::Put(kv) if kv.key.as_str() == "/runs/c" => {
                assert!(kv.mod_revision > deleted);
                break;
            }
            WatchEvent::Reset { kvs, .. } if kvs.iter().any(|kv| kv.key.as_str() == "/runs/c") => break,
            WatchEvent::Reset { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    // Deleted and reaped with nothing written after: the wait runs out on a lower
    // index.
    assert!(s.delete(&k("/runs/c")).await.unwrap());
    let deleted = next_event(&mut w).await.revision();
    control(&server, "reap").await;
    match next_event(&mut w).await {
        WatchEvent::Reset { kvs, revision } => {
            assert!(revision < deleted, "{revision} < {deleted}");
            let keys: Vec<&str> = kvs.iter().map(|kv| kv.key.as_str()).collect();
            assert_eq!(keys, ["/runs/a"]);
        }
        other => panic!("{other:?}"),
    }
    // And it goes on from there.
    s.put(&k("/runs/d"), "1", None).await.unwrap();
    assert!(matches!(next_event(&mut w).await, WatchEvent::Put(kv) if kv.key.as_str() == "/runs/d"));
}

/// Our sessions are TTL-only and have no lock-delay. A session made as Consul makes
/// one by default is bound to the node's `serfHealth` check (one server failing
/// ends it, with every key it holds) and keeps its keys from being locked again for
/// 15 s: both are shown on the same server, so the test cannot pass by the server
/// not modelling them.
#[tokio::test]
async fn sessions_outlive_a_failed_node_and_free_their_locks_at_once() {
    let server = ConsulServer::start(ConsulOptions::default()).await;
    let s = client(&server.url());
    let base = format!("http://{}", server.addr());
    let http = reqwest::Client::new();
    let ours = s.grant_lease(Duration::from_secs(10)).await.unwrap();
    s.put(&k("/agents/h1"), "idle", Some(&ours.id)).await.unwrap();
    let default_session = |body: &'static str| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            http.put(format!("{base}/v1/session/create"))
                .body(body)
                .send()
                .await
                .unwrap()
        }
    };
    let made = default_session(r#"{"TTL":"10s","Behavior":"delete"}"#).await;
    let id = made.json::<serde_json::Value>().await.unwrap()["ID"]
        .as_str()
        .unwrap()
        .to_string();
    let took = http
        .put(format!("{base}/v1/kv/locks/other?acquire={id}"))
        .body("x")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(took, "true");
    // The node's check turns critical.
    control(&server, "node/fail").await;
    assert!(
        s.get(&k("/agents/h1")).await.unwrap().is_some(),
        "our session survives"
    );
    assert!(
        s.get(&k("/locks/other")).await.unwrap().is_none(),
        "a default session ended with the node, and its key with it"
    );
    let refused = default_session(r#"{"TTL":"10s"}"#).await;
    assert_eq!(refused.status().as_u16(), 500);
    assert!(refused.text().await.unwrap().contains("serfHealth"));
    let second = s.grant_lease(Duration::from_secs(10)).await.unwrap();
    // The default session's key is under its 15 s lock-delay.
    let lock = |key: &str, lease: &jio_common::store::LeaseId| {
        Txn::new().when(Compare::Absent(k(key))).then(Op::Put {
            key: k(key),
            value: "mine".into(),
            lease: Some(lease.clone()),
        })
    };
    assert!(matches!(
        s.txn(lock("/locks/other", &second.id)).await.unwrap(),
        TxnOutcome::Lost(_)
    ));
    // Ours has none: its key can be locked again at once.
    expire_session(&server, &ours.id.0).await;
    assert!(s.get(&k("/agents/h1")).await.unwrap().is_none());
    assert!(s.txn(lock("/agents/h1", &second.id)).await.unwrap().committed());
    control(&server, "node/pass").await;
}

/// A value over Consul's 512 KiB is refused with one line naming the key, and
/// nothing is written.
#[tokio::test]
async fn a_value_over_512_kib_is_refused_naming_the_key() {
    let server = ConsulServer::start(ConsulOptions::default()).await;
    let s = client(&server.url());
    let big = "x".repeat(600 * 1024);
    let err = s.put(&k("/rollouts/r1"), &big, None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("/rollouts/r1") && msg.contains("512 KiB"), "{msg}");
    assert!(msg.len() < 400, "one line: {msg}");
    assert!(s.get(&k("/rollouts/r1")).await.unwrap().is_none());
}

/// A server electing a leader holds requests for up to 7 s (`rpc_hold_timeout`):
/// a transaction waits it out instead of coming back not confirmed. Rate limits
/// (429) refuse before anything is applied: retried, a transaction too.
#[tokio::test]
async fn an_election_is_waited_out_and_rate_limits_are_retried() {
    let server = ConsulServer::start(ConsulOptions::default()).await;
    let url = StoreUrl::parse(&server.url()).unwrap();
    let s: DynStore = Arc::new(ConsulStore::new(&url, Duration::from_secs(10)).unwrap());
    control(&server, "hold/5000").await;
    let started = std::time::Instant::now();
    let put = Txn::new().then(Op::put(k("/current_version"), "v2"));
    assert!(s.txn(put).await.unwrap().committed());
    assert!(started.elapsed() >= Duration::from_secs(5));
    control(&server, "hold/0").await;
    control(&server, "throttle/3").await;
    s.put(&k("/current_version"), "v3", None).await.unwrap();
    control(&server, "throttle/2").await;
    let put = Txn::new().then(Op::put(k("/current_version"), "v4"));
    assert!(s.txn(put).await.unwrap().committed());
    assert_eq!(s.get(&k("/current_version")).await.unwrap().unwrap().value, "v4");
}
