//! The Hiera data file is brought up to date before each run, and every host's
//! addresses are read only when something under `/active_roles/` changed: a run
//! with nothing changed costs one small request, not a read of the whole fleet's
//! addresses. Checked with etcd's own count of the bytes it sent.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use jio_agent::hiera::{Memo, refresh};
use jio_common::keys::{Key, Schema};
use jio_common::store::{CountingStore, DynStore};
use jio_tests::Etcd;
use jio_tests::etcd::metric_sum;
use jio_tests::inspect::open;

/// What etcd has sent its clients so far, in bytes.
async fn sent(etcd: &Etcd) -> f64 {
    let text = etcd.metrics(0).await.unwrap();
    metric_sum(&text, "etcd_network_client_grpc_sent_bytes_total", &[])
}

/// A real etcd holding `n` compute hosts' addresses (10.0.x.y), and the agent's
/// client of it, counting its requests.
async fn fleet_of(n: usize) -> (Etcd, DynStore, CountingStore) {
    let etcd = Etcd::start().await;
    let store = open(&etcd.url()).await;
    for i in 0..n {
        let key = Key::new(format!("/active_roles/compute/compute{i}/eth0")).unwrap();
        store
            .put(&key, &format!("10.0.{}.{}", i / 250, i % 250), None)
            .await
            .unwrap();
    }
    let counting = CountingStore::new(store.clone());
    (etcd, store, counting)
}

/// How many listings `counting` has seen.
fn listings(counting: &CountingStore) -> u64 {
    counting.by_op()[jio_common::store::counting::OPS
        .iter()
        .position(|o| *o == "list")
        .unwrap()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_are_read_again_only_when_they_changed() {
    let (etcd, store, counting) = fleet_of(500).await;
    let schema = Schema::default();
    let agent: DynStore = std::sync::Arc::new(counting.clone());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hieradata/jiocloud.yaml");
    let seen = Memo::new(&etcd.url());
    let lists = || listings(&counting);

    // The first run reads everything.
    let b0 = sent(&etcd).await;
    refresh(&agent, &schema, &file, &seen).await.unwrap();
    let b1 = sent(&etcd).await;
    assert_eq!(lists(), 1);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains("compute499") && text.contains("10.0.1.249"),
        "{text}"
    );

    // Nothing changed (a write beside the prefix does not count): one count.
    store
        .put(&Key::new("/running/versions/v1/compute1").unwrap(), "1", None)
        .await
        .unwrap();
    refresh(&agent, &schema, &file, &seen).await.unwrap();
    let b2 = sent(&etcd).await;
    assert_eq!(lists(), 1, "nothing under /active_roles/ changed: no read of it");
    let (full, unchanged) = (b1 - b0, b2 - b1);
    assert!(
        unchanged * 20.0 < full,
        "etcd sent {unchanged} bytes for a run with nothing changed, {full} for a full read"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);

    // A host gone (as forget-host or a lease's end deletes it): read again.
    store
        .delete(&Key::new("/active_roles/compute/compute7/eth0").unwrap())
        .await
        .unwrap();
    refresh(&agent, &schema, &file, &seen).await.unwrap();
    assert_eq!(lists(), 2);
    assert!(!std::fs::read_to_string(&file).unwrap().contains("\"compute7\""));

    // An address that moved: read again.
    store
        .put(
            &Key::new("/active_roles/compute/compute8/eth0").unwrap(),
            "192.0.2.8",
            None,
        )
        .await
        .unwrap();
    refresh(&agent, &schema, &file, &seen).await.unwrap();
    assert_eq!(lists(), 3);
    assert!(std::fs::read_to_string(&file).unwrap().contains("192.0.2.8"));

    // The file removed or damaged by hand: written again from a read, whatever
    // the store says.
    std::fs::remove_file(&file).unwrap();
    refresh(&agent, &schema, &file, &seen).await.unwrap();
    assert_eq!(lists(), 4);
    assert!(std::fs::read_to_string(&file).unwrap().contains("192.0.2.8"));
    std::fs::write(&file, "\"etcdlookup::active_roles\": {}\n").unwrap();
    refresh(&agent, &schema, &file, &seen).await.unwrap();
    assert_eq!(lists(), 5);
    assert!(std::fs::read_to_string(&file).unwrap().contains("192.0.2.8"));
}

/// What the file was written from is kept in the state directory: an agent
/// restarted (as a package upgrade restarts a whole fleet's) reads every host's
/// addresses again only when something changed, and trusts only what it kept of
/// the same store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_reads_the_addresses_again_only_when_they_changed() {
    let (etcd, store, counting) = fleet_of(50).await;
    let schema = Schema::default();
    let agent: DynStore = std::sync::Arc::new(counting.clone());
    let dir = tempfile::tempdir().unwrap();
    let (state, file) = (dir.path().join("state"), dir.path().join("hiera.yaml"));
    std::fs::create_dir_all(&state).unwrap();
    let lists = || listings(&counting);

    refresh(&agent, &schema, &file, &Memo::kept_in(&state, &etcd.url()))
        .await
        .unwrap();
    assert_eq!(lists(), 1);
    assert!(state.join("hiera.json").exists());

    // Restarted, nothing changed: no read.
    refresh(&agent, &schema, &file, &Memo::kept_in(&state, &etcd.url()))
        .await
        .unwrap();
    assert_eq!(
        lists(),
        1,
        "a restarted agent read the addresses though nothing changed"
    );

    // Restarted after a host registered: read again.
    store
        .put(
            &Key::new("/active_roles/compute/compute50/eth0").unwrap(),
            "10.0.0.50",
            None,
        )
        .await
        .unwrap();
    refresh(&agent, &schema, &file, &Memo::kept_in(&state, &etcd.url()))
        .await
        .unwrap();
    assert_eq!(lists(), 2);
    assert!(std::fs::read_to_string(&file).unwrap().contains("10.0.0.50"));

    // What was kept of another store is not trusted.
    refresh(
        &agent,
        &schema,
        &file,
        &Memo::kept_in(&state, "etcd://192.0.2.1:2379"),
    )
    .await
    .unwrap();
    assert_eq!(lists(), 3, "what was kept of another store was trusted");

    // Nor a damaged file.
    std::fs::write(state.join("hiera.json"), "{").unwrap();
    refresh(&agent, &schema, &file, &Memo::kept_in(&state, &etcd.url()))
        .await
        .unwrap();
    assert_eq!(lists(), 4, "a damaged hiera.json was trusted");
}
