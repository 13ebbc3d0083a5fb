//! Where a host is listed in `/running/versions/`: the agent remembers it in its
//! state directory instead of listing the whole fleet's entries at every start, and
//! still leaves its host under exactly one version when those entries changed
//! behind it (an older agent, a restored state directory): a host listed under an
//! old version too would count as already there when a rollout goes back to it.
//! Real etcd, real `puppet apply`.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::BTreeSet;
use std::path::PathBuf;

use jio_common::keys::Schema;
use jio_common::names::{HostName, Version};
use jio_tests::inspect::{host_entries, open, text};
use jio_tests::{Etcd, Host, Puppet};
use tokio::process::Command;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_jio-agent"))
}

async fn once(host: &Host) {
    let out = Command::from(host.agent(&bin(), &["once"]))
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

async fn listed(s: &jio_common::store::DynStore, host: &str) -> BTreeSet<String> {
    host_entries(s, host)
        .await
        .into_iter()
        .filter(|k| k.starts_with("/running/versions/"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_stays_listed_under_one_version_when_its_entries_changed_behind_the_agent() {
    let etcd = Etcd::start().await;
    let s = open(&etcd.url()).await;
    let schema = Schema::default();
    let puppet = Puppet::new();
    let m = puppet.manifest("ok", "notice('ok')\n");
    let host = Host::new("db1", &etcd.url(), &puppet.command(&m), "");
    let h = HostName::new("db1").unwrap();
    let v = |x: &str| Version::new(x).unwrap();

    s.put(&schema.current_version(), "v1", None).await.unwrap();
    once(&host).await;
    assert_eq!(
        listed(&s, "db1").await,
        BTreeSet::from(["/running/versions/v1/db1".to_string()])
    );
    let kept = std::fs::read_to_string(host.state_dir().join("listed.json")).unwrap();
    assert!(kept.contains("\"v1\""), "{kept}");

    // Trusted while it holds: v2 moves the entry without a listing of the fleet's.
    s.put(&schema.current_version(), "v2", None).await.unwrap();
    once(&host).await;
    assert_eq!(
        listed(&s, "db1").await,
        BTreeSet::from(["/running/versions/v2/db1".to_string()])
    );

    // Behind the agent's back (as an older agent would report v9): its v2 entry goes
    // and one under v9 appears. The state directory still says v2.
    s.delete(&schema.running_version_host(&v("v2"), &h))
        .await
        .unwrap();
    s.put(&schema.running_version_host(&v("v9"), &h), "1", None)
        .await
        .unwrap();
    s.put(&schema.current_version(), "v3", None).await.unwrap();
    once(&host).await;
    assert_eq!(
        listed(&s, "db1").await,
        BTreeSet::from(["/running/versions/v3/db1".to_string()]),
        "the stale listing was noticed and the v9 entry removed"
    );
}
