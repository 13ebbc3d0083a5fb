//! When the operator's intent is unclear, `jioctl` refuses, says how to force it,
//! and changes nothing (every key under `/` compared before and after): rules that
//! name a role the fleet does not have, no rolling limit at all, a hold on a name
//! the fleet does not have, an undo back to a version whose rollout was aborted.
//! Real etcd; the fleet is registered as its agents would register it.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use jio_tests::Etcd;
use jio_tests::inspect::text;

use common::run;

/// Registers `hosts` (as their agents do) at v1, with v1 desired.
fn fleet(etcd: &Etcd, hosts: &[&str]) {
    let put = |k: &str, v: &str| {
        let o = etcd.etcdctl(&["put", k, v]);
        assert!(o.status.success(), "{o:?}");
    };
    put("/current_version", "v1");
    for h in hosts {
        let role = h.trim_end_matches(|c: char| c.is_ascii_digit());
        put(
            &format!("/hosts/{h}"),
            &format!(r#"{{"role":"{role}","agent_version":"test","first_seen":1}}"#),
        );
        put(&format!("/running/versions/v1/{h}"), "");
    }
}

/// Every key and value under `/`.
fn dump(etcd: &Etcd) -> String {
    let o = etcd.etcdctl(&["get", "--prefix", "/"]);
    assert!(o.status.success(), "{o:?}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

const HOSTS: [&str; 5] = ["controller1", "compute1", "compute2", "compute3", "compute4"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_naming_what_the_fleet_lacks_or_setting_no_limit_are_refused() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    fleet(&etcd, &HOSTS);
    let before = dump(&etcd);
    let typo =
        r#"{"rolling_rules":{"roles":{"comptue":1,"controller":1}},"role_order":{"compute":["controler"]}}"#;
    for extra in [&["--noop"][..], &["--detach"][..]] {
        let mut args = vec!["upgrade", "v6", "--instructions", typo];
        args.extend(extra);
        let out = run(&url, &args).await;
        let t = text(&out);
        assert_eq!(out.status.code(), Some(3), "{t}");
        assert!(
            t.contains("\"comptue\"") && t.contains("\"controler\""),
            "every name listed: {t}"
        );
        assert!(t.contains("--force") && t.contains("nothing was written"), "{t}");
    }
    // No rules at all: how many hosts would start at once.
    let out = run(&url, &["upgrade", "v9", "--detach"]).await;
    let t = text(&out);
    assert_eq!(out.status.code(), Some(3), "{t}");
    assert!(
        t.contains("no rolling limit") && t.contains("5 host(s) would start at once"),
        "{t}"
    );
    // A fleet command with the misspelt rules is refused by the same check.
    let out = run(&url, &["run", "--all", "--instructions", typo, "true"]).await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("\"comptue\""), "{}", text(&out));
    assert_eq!(dump(&etcd), before, "a refused command changed the store");
    // Forced, it goes ahead as written.
    let out = run(&url, &["upgrade", "v9", "--detach", "--force"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_ne!(dump(&etcd), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_refuse_unknown_names_say_what_they_replace_and_leave_no_key_behind() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    fleet(&etcd, &HOSTS);
    let before = dump(&etcd);
    for args in [
        &["hold", "compute9"][..],
        &["hold", "--role", "comptue"][..],
        &["hold", "compute1", "compute9"][..],
    ] {
        let out = run(&url, args).await;
        let t = text(&out);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {t}");
        assert!(t.contains("nothing was held") && t.contains("--force"), "{t}");
    }
    let t = text(&run(&url, &["hold", "--role", "comptue"]).await);
    assert!(t.contains("did you mean compute?"), "{t}");
    assert_eq!(dump(&etcd), before, "a refused hold changed the store");
    // A host that has not joined yet, on purpose.
    let out = run(&url, &["hold", "compute9", "--force"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run(&url, &["release", "compute9"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Holding again replaces the reason, and says so.
    assert!(
        run(&url, &["hold", "compute1", "--reason", "disk"])
            .await
            .status
            .success()
    );
    let again = text(&run(&url, &["hold", "compute1", "--reason", "memory"]).await);
    assert!(
        again.contains("\"disk\"") && again.contains("replaces it"),
        "{again}"
    );
    // The release leaves no enable key the hold created.
    let out = run(&url, &["release", "compute1"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let after = dump(&etcd);
    assert!(
        !after.contains("/config_state/enable_puppet/host/compute1"),
        "{after}"
    );
    assert!(!after.contains("/holds/"), "{after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_back_to_an_aborted_version_is_refused_quoting_why() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    fleet(&etcd, &HOSTS);
    let rules = r#"{"rolling_rules":{"roles":{"compute":1,"controller":1}}}"#;
    let out = run(&url, &["upgrade", "v2", "--detach", "--instructions", rules]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Rollout ids are stamped to the second: one rollout per second.
    let next_second = || tokio::time::sleep(std::time::Duration::from_millis(1100));
    next_second().await;
    let out = run(&url, &["rollout", "abort", "--reason", "bad build"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Back to v1 (recorded, not driven: no agents here), then ended by hand.
    next_second().await;
    let out = run(&url, &["rollout", "undo", "--detach"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    next_second().await;
    let out = run(&url, &["rollout", "abort", "--reason", "enough"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let before = dump(&etcd);
    let out = run(&url, &["rollout", "undo", "--detach"]).await;
    let t = text(&out);
    assert_eq!(out.status.code(), Some(64), "{t}");
    assert!(
        t.contains("back to v2") && t.contains("\"bad build\"") && t.contains("--force"),
        "{t}"
    );
    assert_eq!(dump(&etcd), before, "a refused undo changed the store");
    // The history says why each one ended.
    let h = text(&run(&url, &["rollout", "history"]).await);
    assert!(h.contains("\"bad build\"") && h.contains("\"enough\""), "{h}");
    let out = run(&url, &["rollout", "undo", "--detach", "--force"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}
