//! The harness's notification receiver: a real HTTP server that records what is
//! POSTed to it in order, refuses connections while down and takes them again on
//! the same URL once up: what notification delivery is tested against.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::time::Duration;

use jio_tests::receiver::Receiver;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_records_posts_in_order_and_refuses_while_down() {
    let mut r = Receiver::start().await;
    let client = reqwest::Client::new();
    let post = |n: u32| {
        client
            .post(r.url())
            .json(&serde_json::json!({"event": "started", "n": n}))
            .send()
    };
    for n in 0..3 {
        assert_eq!(post(n).await.unwrap().status(), 200);
    }
    let url = r.url();
    r.down().await;
    let refused = reqwest::Client::new().post(&url).body("{}").send().await;
    assert!(refused.is_err(), "{refused:?}");
    r.up().await;
    let client = reqwest::Client::new();
    let ok = client.post(r.url()).body("not json").send().await.unwrap();
    assert_eq!(ok.status(), 200);
    let got = r.until(4, Duration::from_secs(10)).await;
    let ns: Vec<_> = got.iter().take(3).map(|v| v["n"].as_u64().unwrap()).collect();
    assert_eq!(ns, [0, 1, 2]);
    assert_eq!(got[3]["not_json"], "not json");
}
