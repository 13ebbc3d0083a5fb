//! A composable rollout on the embedded SQLite store and on Consul.

use super::*;

// ---------------------------------------------------------------------------
// Other stores
// ---------------------------------------------------------------------------

/// A small composable rollout on `url`: done, in lockstep, finalize once, the
/// catalogs beside the host records, `/steps/` gone at the end.
async fn small_rollout_on(url: &str) {
    let names = ["compute1", "controller1"];
    let f = Fleet::start(
        url,
        &names,
        &[keystone(), nova_compute_fin()],
        PuppetKind::StandIn,
    )
    .await;
    let s = open(url).await;
    let reg = keys_under(&s, "/hosts/").await;
    for h in names {
        assert!(reg.contains_key(&format!("/hosts/{h}")), "{reg:?}");
        assert!(reg.contains_key(&format!("/hosts/{h}/services")), "{reg:?}");
    }
    // Both hosts are seen as hosts (the catalog key is not one).
    let st = json(url, &["status"]).await;
    let txt = st.to_string();
    assert!(!txt.contains("\"services\":{\"dir\""), "{st:#}");
    let driver = f.spawn_upgrade(url, FINALIZE_RULES);
    // The grants are there while it runs.
    wait_for("a grant under /steps/", secs(30), || async {
        !keys_under(&s, "/steps/").await.is_empty()
    })
    .await;
    let out = ends_within(&f, url, driver, secs(60)).await;
    f.assert_exit(&out, 0);
    let runs = f.runs_of("v2");
    let d = f.diagnostics();
    assert!(f.all_at(&names, "v2"), "{d}");
    assert!(lockstep_violations(&runs, &set(&names)).is_empty(), "{d}");
    let v = finalize_violations(&runs, "controller1", &[("nova_compute", "unpin RPC")]);
    assert!(v.is_empty(), "{v:#?}\n{d}");
    assert!(
        keys_under(&s, "/steps/").await.is_empty(),
        "the grants outlived the rollout: {:?}",
        keys_under(&s, "/steps/").await
    );
    let reg = keys_under(&s, "/hosts/").await;
    for h in names {
        assert!(reg.contains_key(&format!("/hosts/{h}/services")), "{reg:?}");
    }
    let h = json(url, &["status"]).await;
    let hosts = h.to_string();
    assert!(
        hosts.contains("compute1") && hosts.contains("controller1"),
        "{h:#}"
    );
    assert_eq!(rollout_record(url).await["state"], "done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_composable_rollout_on_the_embedded_sqlite_store() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("store.db").display());
    // The agents create the store; jioctl's first write needs it to exist.
    let s = open(&url).await;
    s.put(&key("/current_version"), "v1", None).await.unwrap();
    small_rollout_on(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_composable_rollout_on_consul() {
    let server = jio_tests::consul::ConsulServer::start(jio_tests::consul::ConsulOptions::default()).await;
    small_rollout_on(&server.url()).await;
}
