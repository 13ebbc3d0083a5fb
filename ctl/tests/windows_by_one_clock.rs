//! Maintenance windows are decided by the driver's clock alone: agents whose clock
//! runs 90 s behind or ahead (libfaketime) still start inside the window the driver
//! admitted them in, and `status` warns about their clocks. Every start is checked on
//! the configuration step's own log, written with the real clock.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::time::Duration;

use jio_tests::Etcd;
use jio_tests::inspect::{open, text, wait_for};

use common::fleet::{Fleet, finish, keys_under, now, signal};
use common::run;

const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skewed_agent_clock_never_moves_a_start_outside_the_window() {
    assert!(
        std::path::Path::new(FAKETIME_LIB).exists(),
        "{FAKETIME_LIB} is missing: install it with `apt-get install -y faketime`"
    );
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let s = open(&url).await;
    let names = ["compute1", "compute2", "compute3"];
    let mut f = Fleet::start(&url, &names, 4.0).await;
    // compute1's agent runs 90 s behind, compute2's 90 s ahead.
    for (i, skew) in [(0, "-90s"), (1, "+90s")] {
        signal(&f.daemons[i], nix::sys::signal::Signal::SIGTERM);
        let _ = f.daemons[i].wait().await;
        f.daemons[i] = f.spawn_agent_env(
            i,
            &[
                ("LD_PRELOAD", FAKETIME_LIB),
                ("FAKETIME", skew),
                ("DONT_FAKE_MONOTONIC", "1"),
            ],
        );
        let pid = f.daemons[i].id().unwrap();
        let key = format!("/agents/{}", names[i]);
        wait_for(
            "the skewed agent to be alive",
            Duration::from_secs(30),
            || async {
                keys_under(&s, &key)
                    .await
                    .values()
                    .any(|v| v.contains(&format!("\"pid\":{pid}")))
            },
        )
        .await;
    }
    // A one-minute window opening at the next minute at least 15 s away.
    let t = now() as u64;
    let opens = (t + 15).div_ceil(60) * 60;
    let hm = |at: u64| format!("{:02}:{:02}", (at / 3600) % 24, (at / 60) % 60);
    let rules = format!(
        r#"{{"rolling_rules":{{"roles":{{"compute":2}}}},"windows":[{{"days":"daily","start":"{}","end":"{}"}}]}}"#,
        hm(opens),
        hm(opens + 60)
    );
    let driver = common::fleet::spawn(&url, &["upgrade", "v2", "--instructions", &rules]);
    wait_for(
        "compute1 to start inside the window",
        Duration::from_secs(120),
        || async { f.runs().iter().any(|r| r.version == "v2" && r.host == "compute1") },
    )
    .await;
    let st = text(&run(&url, &["status"]).await);
    assert!(
        st.contains("compute1: its agent's clock is at least") && st.contains("behind this one"),
        "{st}"
    );
    assert!(
        st.contains("compute2: its agent's clock is at least") && st.contains("ahead of this one"),
        "{st}"
    );
    let out = finish(driver, Duration::from_secs(120)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let runs: Vec<_> = f.runs().into_iter().filter(|r| r.version == "v2").collect();
    assert_eq!(runs.len(), 3, "{runs:#?}");
    for r in &runs {
        assert!(
            r.start >= opens as f64 && r.start < (opens + 60) as f64 + 1.0,
            "{} started at {} outside the window [{opens}, {}) by the real clock\n{runs:#?}",
            r.host,
            r.start,
            opens + 60
        );
    }
}
