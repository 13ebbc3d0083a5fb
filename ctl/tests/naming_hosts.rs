//! Hosts are named the same way everywhere: as arguments (`hold compute1`) or as
//! `run` names them (`--hosts compute1,compute2`), on `hold`, `release`,
//! `verify-hosts` and `reboot`; both at once must agree, else exit 64 with
//! nothing written. Against a real etcd.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use jio_tests::inspect::{open, text};

use common::fleet::{keys_under, register_host};
use common::run;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_are_named_as_arguments_or_with_hosts_alike() {
    let etcd = jio_tests::Etcd::start().await;
    let url = etcd.url();
    let s = open(&url).await;
    for h in ["compute1", "compute2", "compute3"] {
        register_host(&s, h, "compute").await;
    }
    let held = || async {
        keys_under(&s, "/holds/")
            .await
            .into_keys()
            .collect::<Vec<String>>()
    };
    // `--hosts` holds as the arguments do.
    let out = run(
        &url,
        &["hold", "--hosts", "compute1,compute2", "--reason", "disk swap"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run(&url, &["hold", "compute3"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        held().await,
        [
            "/holds/host/compute1",
            "/holds/host/compute2",
            "/holds/host/compute3"
        ]
    );
    // Both ways naming the same hosts: one release.
    let out = run(&url, &["release", "compute3", "--hosts", "compute3"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(held().await, ["/holds/host/compute1", "/holds/host/compute2"]);
    // Both ways naming different hosts: refused before anything is written, both shown.
    let before = keys_under(&s, "/").await;
    for args in [
        &["release", "compute1", "--hosts", "compute2"][..],
        &["hold", "compute3", "--hosts", "compute1,compute3"][..],
        &["verify-hosts", "v1", "compute1", "--hosts", "compute2"][..],
        &["reboot", "compute1", "--hosts", "compute2"][..],
    ] {
        let out = run(&url, args).await;
        let t = text(&out);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {t}");
        assert!(
            t.contains("hosts given two ways that differ: as arguments (")
                && t.contains(") and with --hosts (")
                && t.contains("name them one way (nothing was written)"),
            "{args:?}: {t}"
        );
        assert_eq!(t.trim().lines().count(), 1, "{args:?}: {t}");
    }
    let out = run(&url, &["hold", "compute3", "--hosts", "compute1,compute3"]).await;
    assert!(
        text(&out).contains("as arguments (compute3) and with --hosts (compute1,compute3)"),
        "{}",
        text(&out)
    );
    assert_eq!(keys_under(&s, "/").await, before, "a refused command wrote");
    // verify-hosts says the same either way.
    let a = run(&url, &["verify-hosts", "v1", "compute1", "compute2"]).await;
    let b = run(&url, &["verify-hosts", "v1", "--hosts", "compute1,compute2"]).await;
    assert_eq!(a.status.code(), b.status.code(), "{}\n{}", text(&a), text(&b));
    assert_eq!(text(&a), text(&b));
    assert!(text(&a).contains("compute1"), "{}", text(&a));
    // A role and hosts cannot go together, whichever way the hosts are named.
    for args in [
        &["reboot", "compute1", "--role", "compute"][..],
        &["hold", "--hosts", "compute1", "--role", "compute"][..],
    ] {
        let out = run(&url, args).await;
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", text(&out));
        assert!(
            text(&out).contains("cannot be used with"),
            "{args:?}: {}",
            text(&out)
        );
    }
}
