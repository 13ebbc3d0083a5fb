//! The benchmark harness on a tiny fleet: it works and its figures are consistent.
//! No assertion on time: speed is what `scripts/bench.sh` reports.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use jio_bench::{self as bench, Backend, Sizes};

async fn check(backend: Backend) {
    let sizes = Sizes::quick();
    let r = bench::run(backend, sizes.clone()).await;
    assert_eq!(r.reaction.samples, sizes.reaction_trials, "{r:?}");
    assert!(
        r.reaction.p50_ms > 0.0
            && r.reaction.p50_ms <= r.reaction.p99_ms
            && r.reaction.p99_ms <= r.reaction.max_ms
    );
    // One host after the other: every host but the last is followed by the next one's enable key.
    assert_eq!(r.scheduling.samples, sizes.scheduling_hosts - 1, "{r:?}");
    assert_eq!(r.makespan.upgraded, r.makespan.hosts, "{r:?}");
    assert_eq!(r.makespan.hosts, 10 * sizes.makespan_hosts_per_role);
    assert!(r.makespan.ideal_s > 0.0 && r.makespan.ratio >= 1.0, "{r:?}");
    assert!(r.makespan.requests_per_host > 0.0);
    assert_eq!(r.status.hosts, sizes.status_hosts);
    // A fixed number: locks; version, enable keys, current rollout, drivers, holds;
    // hosts, versions, agents, run markers, clocks, failures (2), the rollout
    // record; results; the maintenance hooks' records.
    assert!(r.status.store_requests <= 16, "{r:?}");
    assert!(
        r.footprint.rss_mb > 0.0 && r.footprint.agent_binary_mb > 0.0,
        "{r:?}"
    );
    // Besides its lease renewals, an idle agent writes its clock once a minute.
    let clock_puts = (r.footprint.idle_s / 60.0).ceil() as u64;
    assert!(
        r.footprint.store_requests >= r.footprint.lease_renewals
            && r.footprint.store_requests - r.footprint.lease_renewals <= clock_puts,
        "an idle agent makes no request but lease renewals and its clock: {r:?}"
    );
    assert!(bench::table(&r).contains("5. idle agent"));
    if backend == Backend::Etcd {
        // etcd's own count: one watch stream per agent, however many keys it watches.
        let reg = &r.makespan.etcd_registration;
        assert_eq!(reg.len(), 1, "{r:?}");
        assert!(
            reg[0].watch_streams >= 1.0 && reg[0].watch_streams <= r.makespan.hosts as f64,
            "one watch stream per agent at most: {reg:?}"
        );
        assert!(reg[0].watchers > reg[0].watch_streams, "{reg:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_harness_on_etcd() {
    check(Backend::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_harness_on_the_embedded_store() {
    check(Backend::Sqlite).await;
}

#[test]
fn ideal_makespan_of_the_rules() {
    let (rules, _) = bench::makespan_rules();
    let step = std::time::Duration::from_millis(200);
    // r9 alone: 100 hosts, limit 1: 100 waves of 0.2 s; every chain is shorter.
    assert_eq!(bench::ideal_makespan(rules, 100, step), step * 100);
    // 2 per role: r0 -> r3 -> r6 takes 1 + 1 + 1 waves; r9 (limit 1) 2 waves.
    assert_eq!(bench::ideal_makespan(rules, 2, step), step * 3);
}
