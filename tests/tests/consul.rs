//! Consul-only behaviour of the store layer, against the Consul API test server.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use jio_common::keys::Key;
use jio_common::store::{Compare, ConsulStore, DynStore, ErrorKind, Op, StoreUrl, Txn, WatchEvent};
use jio_tests::consul::{ConsulOptions, ConsulServer, ConsulTls, reset_index};
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

/// A token with the `jio-agent` policy (README): what it may not write is a
/// refusal naming the key, in a transaction too (Consul answers 409 there, which
/// must never read as a lost compare, or a driver would replan forever), and
/// nothing of the transaction is written.
#[tokio::test]
async fn acl_denials_name_the_key_and_are_never_lost_compares() {
    use jio_tests::consul::AclToken;
    let server = ConsulServer::start(ConsulOptions {
        token: Some("operator-secret-1".into()),
        tokens: vec![AclToken::jio_agent("agent-secret-2")],
        ..ConsulOptions::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let token = |name: &str, secret: &str| {
        let f = dir.path().join(name);
        std::fs::write(&f, secret).unwrap();
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        client(&format!("{}?token_file={}", server.url(), f.display()))
    };
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
    // A transaction: one allowed write, two denied ones.
    let txn = Txn::new()
        .when(Compare::ModRevision(k("/current_version"), 0))
        .then(Op::put(k("/status/validated/success/v1/h2"), ""))
        .then(Op::put(k("/config_state/enable_puppet/global"), "true"))
        .then(Op::Delete(k("/locks/epoch")));
    let err = agent.txn(txn).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Denied, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("writing /config_state/enable_puppet/global, /locks/epoch"),
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
}
