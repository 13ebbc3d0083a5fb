//! A failure shown to a person ends with the command that retries it, and
//! `jioctl retry` does what the recovery always was: the failed host runs again
//! at once (judged by the configuration step's own log), a host that has not
//! failed is refused with nothing written, and `explain` never promises a retry
//! its agent will not make. Real etcd, real `jio-agent` daemons, real `jioctl`.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::time::Duration;

use jio_common::keys::Key;
use jio_tests::inspect::{open, text, wait_for};

use common::fleet::fleet_on_etcd;
use common::run;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_host_is_retried_by_name_and_every_failure_says_how() {
    let (_etcd, url, f) = fleet_on_etcd(&["compute1", "compute2", "compute3"], 0.3).await;
    let s = open(&url).await;
    f.fail("compute1", true);
    let rules = r#"{"rolling_rules":{"roles":{"compute":1}}}"#;
    let out = run(&url, &["upgrade", "v2", "--instructions", rules]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("to retry: jioctl retry compute1"),
        "{}",
        text(&out)
    );

    // status: the failure, then how to retry it; no reason labelled a log.
    let st = text(&run(&url, &["status"]).await);
    assert!(st.contains("to retry: jioctl retry compute1"), "{st}");
    assert!(!st.contains("(log: puppet"), "{st}");
    // explain: the rollout ended and reset the keys, so the agent does not retry.
    let e = text(&run(&url, &["explain", "compute1"]).await);
    assert!(!e.contains("the agent retries at"), "{e}");
    assert!(e.contains("the host runs v1"), "{e}");

    // A host that has not failed, and one the fleet does not have: refused, nothing written.
    let host_key = |h: &str| Key::new(format!("/config_state/enable_puppet/host/{h}")).unwrap();
    for (args, says) in [
        (&["retry", "compute2"][..], "compute2 (pending) has not failed"),
        (&["retry", "compute9"][..], "compute9"),
    ] {
        let out = run(&url, args).await;
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(says), "{args:?}: {}", text(&out));
        assert!(text(&out).contains("nothing was written"), "{}", text(&out));
    }
    assert!(s.get(&host_key("compute2")).await.unwrap().is_none());
    // Held, it is refused too (a release would start it outside any plan).
    let out = run(&url, &["hold", "compute1", "--reason", "disk swap"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run(&url, &["retry", "--hosts", "compute1"]).await;
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    assert!(text(&out).contains("compute1 is held"), "{}", text(&out));
    let out = run(&url, &["release", "compute1"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // Fixed, then retried: its agent runs v2 again at once, by Puppet's own log.
    f.fail("compute1", false);
    let before = runs_of(&f, "compute1");
    let out = run(&url, &["retry", "compute1"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("retrying compute1"), "{}", text(&out));
    wait_for("compute1 to run v2 again", Duration::from_secs(30), || async {
        runs_of(&f, "compute1") > before
    })
    .await;
    // Nothing failed any more: --failed has nothing to do and says so.
    wait_for("no failure left", Duration::from_secs(30), || async {
        text(&run(&url, &["retry", "--failed"]).await).contains("no host to retry")
    })
    .await;
}

/// Runs of v2 that `host`'s configuration step started, by its own log.
fn runs_of(f: &common::fleet::Fleet, host: &str) -> usize {
    f.runs()
        .iter()
        .filter(|r| r.host == host && r.version == "v2")
        .count()
}
