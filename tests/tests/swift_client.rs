//! The Swift client against a real Swift all-in-one (TempAuth).

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use jio_common::swift::{SwiftClient, SwiftSettings};
use jio_tests::Swift;

fn settings(swift: &Swift, user: &str, key: &str) -> SwiftSettings {
    SwiftSettings {
        auth_url: swift.auth_url(),
        user: user.into(),
        key_file: swift.key_file(key),
        container: "jio-test".into(),
        delete_after: Some("1d".into()),
        project: None,
        user_domain: "Default".into(),
        project_domain: "Default".into(),
        region: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_fetch_reauth_and_errors() {
    let mut swift = Swift::start().await;
    let client = SwiftClient::new(settings(&swift, "fleet:uploader", "s3cr3t")).unwrap();
    let url = client
        .upload(
            "compute1/v2/20261121T101500Z-configured.log",
            b"puppet said hello\n".to_vec(),
        )
        .await
        .unwrap();
    assert!(
        url.ends_with("/jio-test/compute1/v2/20261121T101500Z-configured.log"),
        "{url}"
    );
    assert_eq!(client.fetch(&url).await.unwrap(), b"puppet said hello\n");
    // Retention was set.
    let (token, _) = swift.login("fleet:uploader", "s3cr3t").await;
    let r = reqwest::Client::new()
        .head(&url)
        .header("X-Auth-Token", token)
        .send()
        .await
        .unwrap();
    assert!(r.headers().contains_key("x-delete-at"), "{:?}", r.headers());

    // Tokens invalidated (memcached restarted): the client logs in again by itself.
    swift.restart_memcached();
    let url2 = client
        .upload("compute1/v2/second.log", b"again".to_vec())
        .await
        .unwrap();
    assert_eq!(client.fetch(&url2).await.unwrap(), b"again");

    // Wrong key: a clear error that never shows the key.
    let bad = SwiftClient::new(settings(&swift, "fleet:uploader", "wrong-key-123")).unwrap();
    let err = bad.upload("x.log", b"x".to_vec()).await.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("authentication as \"fleet:uploader\"") && msg.contains("HTTP 401"),
        "{msg}"
    );
    assert!(
        !msg.contains("wrong-key-123") && !format!("{err:?}").contains("wrong-key-123"),
        "{msg}"
    );
    assert!(!err.transient());

    // Swift down: transient, and no token in the message.
    swift.stop_proxy();
    let err = client.upload("down.log", b"x".to_vec()).await.unwrap_err();
    assert!(err.transient(), "{err}");
    assert!(!err.to_string().contains("AUTH_tk"), "{err}");
    swift.start_proxy().await;
    client.upload("up-again.log", b"x".to_vec()).await.unwrap();
}
