//! The safety defects of issue 11, each reproduced against a real etcd with real
//! `jio-agent` daemons and `jioctl` processes: re-targeting mid-rollout, a driver that
//! lost its lock, the emergency stop, a finished rollout left armed, invalid stored
//! values, lost hosts, the recovery race, signals and loose input.
//!
//! The limits are checked on the configuration step's own log: the stand-in Puppet
//! appends a start and an end line per run to a file shared by the fleet, and the
//! intervals from that file alone say how many hosts ran at once.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::time::{Duration, Instant};

use jio_common::keys::Schema;
use jio_tests::Etcd;
use jio_tests::etcd::etcdctl_put;
use jio_tests::inspect::{open, text, wait_for};
use tokio::process::Child;

use common::fleet::{
    Fleet, Run, finish, fleet_on_etcd, keys_under, max_overlap, now, register_host, signal, spawn,
};
use common::{assert_says, jioctl, run};

const SIX: [&str; 6] = [
    "compute1", "compute2", "compute3", "compute4", "compute5", "compute6",
];

const COMPUTE_2: &str = r#"{"rolling_rules":{"roles":{"compute":2}}}"#;

/// Checks that at most two computes ran at once from `t0` on, by the shared log;
/// returns the most that did and the runs.
#[track_caller]
fn at_most_two_at_once(f: &Fleet, t0: f64) -> (usize, Vec<Run>) {
    let runs = f.runs();
    let (most, at) = max_overlap(&runs, t0);
    assert!(
        most <= 2,
        "{most} computes ran at once against a limit of 2: {at:?}\n{runs:#?}"
    );
    (most, runs)
}

/// A driver of v2 under [`COMPUTE_2`], once its second wave (the third and fourth
/// computes) runs its puppet.
async fn second_wave_of_v2(url: &str, f: &Fleet) -> Child {
    let driver = spawn(url, &["upgrade", "v2", "--instructions", COMPUTE_2, "--retry"]);
    wait_for("the second wave of v2 runs", Duration::from_secs(60), || async {
        f.started("v2") >= 4
    })
    .await;
    driver
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_targeting_mid_rollout_keeps_the_limit() {
    let (_etcd, url, f) = fleet_on_etcd(&SIX, 4.0).await;
    let t0 = now();
    let rules = COMPUTE_2;
    // In the second wave the first two computes are done, so a re-targeted plan in
    // name order would pick them while compute3 and compute4 still run.
    let first = second_wave_of_v2(&url, &f).await;
    // Stop that driver the hard way, and re-target at once.
    signal(&first, nix::sys::signal::Signal::SIGKILL);
    let _ = finish(first, Duration::from_secs(5)).await;
    let out = run(&url, &["upgrade", "v3", "--instructions", rules, "--retry"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // The dead driver's lock (same host, its pid gone) was taken over at once.
    assert_says(&out, "took over the rollout lock");
    let (most, runs) = at_most_two_at_once(&f, t0);
    assert!(f.all_at("v3"));
    // The limit was reached, so the check could have failed.
    assert_eq!(most, 2, "{runs:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_agent_keeps_its_slot_across_a_re_target() {
    let names = ["compute1", "compute2", "compute3", "compute4"];
    let (_etcd, url, mut f) = fleet_on_etcd(&names, 4.0).await;
    let t0 = now();
    let rules = COMPUTE_2;
    let first = second_wave_of_v2(&url, &f).await;
    // compute3's agent freezes while its puppet runs: its lease ends, its run goes on.
    let agent3 = &f.daemons[2];
    signal(agent3, nix::sys::signal::Signal::SIGSTOP);
    tokio::time::sleep(Duration::from_secs(4)).await;
    signal(&first, nix::sys::signal::Signal::SIGKILL);
    let _ = finish(first, Duration::from_secs(5)).await;
    let second = spawn(&url, &["upgrade", "v3", "--instructions", rules, "--retry"]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let st = text(&run(&url, &["status"]).await);
    assert!(st.contains("compute3") && st.contains("never ended"), "{st}");
    signal(&f.daemons[2], nix::sys::signal::Signal::SIGCONT);
    let out = finish(second, Duration::from_secs(120)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    at_most_two_at_once(&f, t0);
    assert!(f.all_at("v3"));
    for d in &mut f.daemons {
        assert!(d.try_wait().unwrap().is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_that_lost_its_lock_writes_nothing_more() {
    let names = ["compute1", "compute2", "compute3", "compute4", "compute5"];
    let (_etcd, url, f) = fleet_on_etcd(&names, 3.0).await;
    let s = open(&url).await;
    let loose = r#"{"rolling_rules":{"roles":{"compute":2}}}"#;
    let strict = r#"{"rolling_rules":{"roles":{"compute":1}}}"#;
    let a = spawn(&url, &["upgrade", "v2", "--instructions", loose, "--retry"]);
    wait_for(
        "the first driver to admit two computes",
        Duration::from_secs(30),
        || async { f.started("v2") >= 2 },
    )
    .await;
    // Freeze it past the lock's lease (15 s); another operator takes over, stricter.
    signal(&a, nix::sys::signal::Signal::SIGSTOP);
    let frozen_at = now();
    let b = spawn(&url, &["upgrade", "v2", "--instructions", strict, "--retry"]);
    let lock = Schema::default().lock("rollout");
    let start = Instant::now();
    loop {
        let held = s.get(&lock).await.unwrap();
        if held.is_some_and(|kv| kv.value.contains(&format!("\"pid\":{}", b.id().unwrap()))) {
            break;
        }
        if start.elapsed() > Duration::from_secs(40) {
            signal(&a, nix::sys::signal::Signal::SIGKILL);
            signal(&b, nix::sys::signal::Signal::SIGTERM);
            let out = finish(b, Duration::from_secs(10)).await;
            panic!("the second driver never took the lock:\n{}", text(&out));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    signal(&a, nix::sys::signal::Signal::SIGCONT);
    let a = finish(a, Duration::from_secs(30)).await;
    // The second operator both took the lock and replaced the rollout (other rules):
    // the first learns one or the other first, and stops without writing.
    let t = text(&a);
    assert!(
        (a.status.code() == Some(4) && t.contains("lost the rollout lock"))
            || (a.status.code() == Some(6) && t.contains("was replaced by rollout")),
        "{t}"
    );
    let b = finish(b, Duration::from_secs(90)).await;
    assert_eq!(b.status.code(), Some(0), "{}", text(&b));
    // Runs that started once the first driver was frozen: one at a time.
    let runs = f.runs();
    let (most, at) = max_overlap(&runs, frozen_at + 1.0);
    assert!(
        most <= 1,
        "{most} ran at once under the holder's limit of 1: {at:?}\n{runs:#?}"
    );
    assert!(f.all_at("v2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emergency_stop_halts_the_driver_and_stays_stopped() {
    let names = ["compute1", "compute2", "compute3", "compute4"];
    let (_etcd, url, f) = fleet_on_etcd(&names, 2.0).await;
    let s = open(&url).await;
    let rules = r#"{"rolling_rules":{"roles":{"compute":1}}}"#;
    let driver = spawn(&url, &["upgrade", "v2", "--instructions", rules, "--retry"]);
    wait_for("the first compute to start", Duration::from_secs(30), || async {
        f.started("v2") >= 1
    })
    .await;
    let stop = run(&url, &["global-disable-puppet"]).await;
    let stopped_at = now();
    assert_eq!(stop.status.code(), Some(0), "{}", text(&stop));
    assert_says(&stop, "was running: it has been halted");
    let out = finish(driver, Duration::from_secs(20)).await;
    assert_eq!(out.status.code(), Some(6), "{}", text(&out));
    assert!(
        text(&out).contains("halted by an emergency stop")
            && text(&out).contains("ran global-disable-puppet"),
        "{}",
        text(&out)
    );
    // Nothing new starts afterwards.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let late: Vec<Run> = f
        .runs()
        .into_iter()
        .filter(|r| r.start > stopped_at + 1.0)
        .collect();
    assert!(
        late.is_empty(),
        "runs started after the emergency stop: {late:#?}"
    );
    assert_eq!(
        keys_under(&s, "/config_state/enable_puppet/").await,
        [(
            "/config_state/enable_puppet/global".to_string(),
            "false".to_string()
        )]
        .into()
    );
    let st = text(&run(&url, &["status"]).await);
    assert!(st.contains("emergency stop:"), "{st}");
    // Starting the upgrade again is the operator's decision to go on.
    let out = run(&url, &["upgrade", "v2", "--instructions", rules, "--retry"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_says(&out, "cleared the emergency stop");
    assert!(f.all_at("v2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_rollout_leaves_nothing_armed() {
    let names = ["compute1", "compute2", "compute3"];
    let (_etcd, url, f) = fleet_on_etcd(&names, 0.2).await;
    let s = open(&url).await;
    let out = run(&url, &["upgrade", "v2", "--retry", "--force"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        common::unfolded(&text(&out)).contains("nothing is left armed"),
        "{}",
        text(&out)
    );
    assert_eq!(
        keys_under(&s, "/config_state/enable_puppet/").await,
        [(
            "/config_state/enable_puppet/global".to_string(),
            "false".to_string()
        )]
        .into()
    );
    // The next trigger-update releases nobody.
    let out = run(&url, &["trigger-update", "v9"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(f.started("v9"), 0, "{:#?}", f.runs());
    // Opening the gate for everyone is refused, naming how many it would release.
    let out = run(&url, &["enable-puppet", "true", "--global"]).await;
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    assert_says(&out, "would release 3 host(s) at once");
    assert_eq!(
        s.get(&Schema::default().enable(&jio_common::keys::EnableLevel::Global))
            .await
            .unwrap()
            .unwrap()
            .value,
        "false",
        "nothing was written"
    );
    // With --force it is written, and said.
    let out = run(&url, &["enable-puppet", "true", "--global", "--force"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_says(&out, "3 host(s) released at once");
    wait_for(
        "the forced release to upgrade the fleet",
        Duration::from_secs(30),
        || async { f.all_at("v9") },
    )
    .await;
    // trigger-update refuses too once hosts are enabled.
    let out = run(&url, &["trigger-update", "v10"]).await;
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    assert!(text(&out).contains("would release 3 host(s)"), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_values_are_reported_and_the_rest_of_the_fleet_is_shown() {
    let (_etcd, url, mut f) = fleet_on_etcd(&["compute1", "compute2", "controller1"], 0.2).await;
    etcdctl_put(&url, b"/hosts/ghost1", b"{\"role\":\"x\xff\"}");
    etcdctl_put(&url, b"/agents/ghost2", b"\xfe");
    etcdctl_put(&url, b"/running/versions/v1/ghost3", b"\xff");
    etcdctl_put(&url, b"/status/configured/failure/v1/ghost4", b"\xff");
    etcdctl_put(&url, b"/hosts/bad\xffname", b"{}");
    etcdctl_put(
        &url,
        b"/hosts/compute9",
        br#"{"role":"compute","agent_version":"1","first_seen":"x"}"#,
    );
    for (args, fleet) in [
        (vec!["status"], "GROUP"),
        (vec!["status", "--json"], "compute1"),
        (vec!["running-versions"], "v1\t4 host(s)"),
        (
            vec!["upgrade", "v2", "--noop", "--force"],
            "would have enabled role compute",
        ),
    ] {
        let out = run(&url, &args).await;
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
        let t = text(&out);
        assert!(t.contains("/hosts/ghost1"), "{args:?} names the bad key: {t}");
        assert!(t.contains(fleet), "{args:?} still shows the fleet: {t}");
    }
    let st = text(&run(&url, &["status"]).await);
    assert!(
        st.lines()
            .any(|l| l.starts_with("compute ") && l.contains(" 2/2 ")),
        "the computes' group line: {st}"
    );
    assert!(
        st.contains("bad\\xffname"),
        "the undecodable key is named, escaped: {st}"
    );
    assert!(st.contains("first_seen"), "the bad field is named: {st}");

    // An invalid global key: the same meaning on both sides, the hosts are blocked.
    let out = run(&url, &["enable-puppet", "false", "--global"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run(&url, &["trigger-update", "v2"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    etcdctl_put(&url, b"/config_state/enable_puppet/global", b"yes");
    let st = text(&run(&url, &["status"]).await);
    // Its row in the REASON table says blocked, and by which key.
    assert!(
        st.lines().any(|l| l.starts_with("compute1 ")
            && l.contains("blocked")
            && l.contains("/config_state/enable_puppet/global")),
        "{st}"
    );
    // A rollout does not wait silently: it says what blocks it, and --timeout ends it.
    let out = run(&url, &["upgrade", "v2", "--retry", "--timeout", "3s", "--force"]).await;
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    assert!(
        text(&out).contains("--timeout passed") && text(&out).contains("blocked: compute1"),
        "{}",
        text(&out)
    );
    // The agents did not move either, and are still up.
    assert!(f.all_at("v1"));
    for d in &mut f.daemons {
        assert!(d.try_wait().unwrap().is_none(), "an agent exited");
    }
    drop(f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_host_is_named_while_the_rollout_waits() {
    let (_etcd, url, f) = fleet_on_etcd(&["compute1"], 0.2).await;
    let s = open(&url).await;
    // A host registered, whose agent never runs.
    register_host(&s, "compute7", "compute").await;
    let out = run(&url, &["upgrade", "v2", "--retry", "--timeout", "4s", "--force"]).await;
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    let t = text(&out);
    // Never admitted (issue 14): named as lost while the rollout waits.
    assert!(
        t.contains("waiting for:") && t.contains("1 lost (never admitted): compute7"),
        "{t}"
    );
    assert!(f.all_at("v2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_enabled_failed_host_counts_as_retrying_at_once() {
    let (_etcd, url, f) = fleet_on_etcd(&["compute1", "compute2", "compute3"], 0.5).await;
    f.fail("compute2", true);
    let rules = r#"{"rolling_rules": {"global": 1}}"#;
    let out = run(&url, &["upgrade", "v2", "--instructions", rules, "--retry"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_says(&out, "compute2: configured failed");
    f.fail("compute2", false);
    let out = run(&url, &["enable-puppet", "true", "--host", "compute2"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // At once: no "stopped: compute2 failed" while it is already running again.
    let st = text(&run(&url, &["status"]).await);
    assert!(st.contains("retrying"), "{st}");
    let out = run(&url, &["upgrade", "v2", "--instructions", rules, "--retry"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(f.all_at("v2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_and_sigint_release_the_lock() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let s = open(&url).await;
    let _f = Fleet::start(&url, &["compute1"], 0.2).await;
    let lock = Schema::default().lock("rollout");
    let frozen = r#"{"rolling_rules":{"roles":{"compute":0}}}"#;
    for (sig, code) in [
        (nix::sys::signal::Signal::SIGTERM, 143),
        (nix::sys::signal::Signal::SIGINT, 130),
    ] {
        let driver = spawn(&url, &["upgrade", "v2", "--instructions", frozen, "--retry"]);
        let start = Instant::now();
        while s.get(&lock).await.unwrap().is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the driver never took the lock"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        signal(&driver, sig);
        let out = finish(driver, Duration::from_secs(10)).await;
        assert_eq!(out.status.code(), Some(code), "{sig}: {}", text(&out));
        assert_says(&out, "the rollout lock is released");
        assert!(
            s.get(&lock).await.unwrap().is_none(),
            "{sig}: the lock is gone at once"
        );
    }
    // The frozen role is named while it waits.
    let out = run(
        &url,
        &[
            "upgrade",
            "v2",
            "--instructions",
            frozen,
            "--retry",
            "--timeout",
            "2s",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    assert!(text(&out).contains("frozen (limit 0)"), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_ends_jioctl_quietly() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let out = run(&url, &["trigger-update", "v1"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for args in [vec!["current-version"], vec!["status"]] {
        // `jioctl ... | head` once head has left: the read end is closed.
        let (reader, writer) = nix::unistd::pipe().unwrap();
        drop(reader);
        // (tokio's `output()` would replace the stdout given with a pipe of its own.)
        let out = jioctl(&url, &args)
            .stdout(std::process::Stdio::from(writer))
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
            .wait_with_output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?}: nothing said: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loose_input_is_refused() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let s = open(&url).await;
    let before = keys_under(&s, "/").await;
    let dup = r#"{"rolling_rules":{"global":1},"rolling_rules":{"global":5}}"#;
    let out = run(&url, &["upgrade", "v2", "--instructions", dup]).await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("given twice"), "{}", text(&out));
    for args in [
        vec!["trigger-update", "--", "--help"],
        vec!["upgrade", "--", "-v2"],
    ] {
        let out = run(&url, &args).await;
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", text(&out));
        assert!(text(&out).contains("must not begin with '-'"), "{}", text(&out));
    }
    assert_eq!(keys_under(&s, "/").await, before, "nothing was written");
    // The embedded store: read-only commands never create one, nor directories.
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no/such/dir/x.db");
    let url = format!("sqlite://{}", missing.display());
    let out = run(&url, &["status"]).await;
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("x.db"), "{}", text(&out));
    assert!(!dir.path().join("no").exists(), "no directory was created");
    let out = run(&url, &["trigger-update", "v1"]).await;
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!dir.path().join("no").exists(), "no directory was created");
    let out = run("sqlite://", &["status"]).await;
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonsense_is_refused_and_no_rules_is_said() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let s = open(&url).await;
    let _f = Fleet::start(&url, &["compute1", "controller1"], 0.2).await;
    let before = keys_under(&s, "/config_state/").await;
    // A misspelt host or role would write a key no agent reads.
    for (args, expect) in [
        (
            vec!["enable-puppet", "true", "--host", "compute9"],
            "--host compute9: not a host of the fleet",
        ),
        (
            vec!["enable-puppet", "false", "--role", "computer"],
            "--role computer: no host of the fleet has this role",
        ),
        (
            vec!["status", "--role", "computer"],
            "--role computer: no host of the fleet has this role (the fleet's roles: compute, controller)",
        ),
        (vec!["verify-hosts", "v1"], "no hosts to verify"),
    ] {
        let out = jioctl(&url, &args)
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(expect), "{args:?}: {}", text(&out));
    }
    assert_eq!(
        keys_under(&s, "/config_state/").await,
        before,
        "nothing was written"
    );
    // --force writes it for a host that has not joined yet; a known one needs none.
    let out = run(&url, &["enable-puppet", "false", "--host", "compute9", "--force"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run(&url, &["enable-puppet", "false", "--host", "compute1"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run(&url, &["status", "--role", "compute"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // No rules at all: refused, with how many hosts would start at once; forced,
    // said again.
    let out = run(&url, &["upgrade", "v2", "--noop"]).await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        text(&out).contains("the rules set no rolling limit")
            && text(&out).contains("2 host(s) would start at once"),
        "{}",
        text(&out)
    );
    let out = run(&url, &["upgrade", "v2", "--noop", "--force"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_says(&out, "--force: the rules set no rolling limit: 2 host(s)");
    let out = run(
        &url,
        &[
            "upgrade",
            "v2",
            "--noop",
            "--instructions",
            r#"{"rolling_rules":{"global":1}}"#,
        ],
    )
    .await;
    assert!(!text(&out).contains("no rolling limit"), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_host_removes_a_decommissioned_host_in_one_go() {
    let (_etcd, url, mut f) = fleet_on_etcd(&["compute1", "compute2"], 0.2).await;
    let s = open(&url).await;
    let out = run(
        &url,
        &[
            "upgrade",
            "v1",
            "--instructions",
            r#"{"rolling_rules":{"global":1}}"#,
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = run(&url, &["hold", "compute2"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let naming = |keys: &std::collections::BTreeMap<String, String>, h: &str| -> Vec<String> {
        keys.keys()
            .filter(|k| k.split('/').any(|seg| seg == h))
            .cloned()
            .collect()
    };
    let before = keys_under(&s, "/").await;
    assert!(naming(&before, "compute2").len() >= 5, "{before:#?}");
    // Alive: refused, nothing written.
    let out = run(&url, &["forget-host", "compute2"]).await;
    assert_eq!(out.status.code(), Some(64), "{}", text(&out));
    assert!(text(&out).contains("agent is alive"), "{}", text(&out));
    assert_eq!(keys_under(&s, "/").await, before, "nothing was written");
    // Decommissioned: its agent gone (its lease expires), every key naming it goes.
    f.daemons[1].kill().await.unwrap();
    wait_for("compute2's lease to expire", Duration::from_secs(20), || async {
        s.get(&Schema::default().agent(&jio_common::names::HostName::new("compute2").unwrap()))
            .await
            .unwrap()
            .is_none()
    })
    .await;
    let out = run(&url, &["forget-host", "compute2"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let after = keys_under(&s, "/").await;
    assert_eq!(naming(&after, "compute2"), Vec::<String>::new(), "{after:#?}");
    assert!(!naming(&after, "compute1").is_empty(), "the other host stays");
    let out = run(&url, &["status"]).await;
    assert!(!text(&out).contains("compute2"), "{}", text(&out));
    // Nothing left to forget: said, exit 1; --force forgets a live one.
    let out = run(&url, &["forget-host", "compute2"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("knows nothing of compute2"), "{}", text(&out));
    let out = run(&url, &["forget-host", "compute1", "--force"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// A store URL whose port is some other HTTP server's: named as not etcd, with the
/// status line it answered and never its body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_etcd_is_named_as_such() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        while let Ok((mut c, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = c.read(&mut buf).await;
                let _ = c
                    .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 15\r\n\r\nsecret-page-body")
                    .await;
            });
        }
    });
    let url = format!("etcd://127.0.0.1:{port}");
    // The client meets either HTTP/1 bytes read as HTTP/2 frames or a connection
    // the server closed after answering ("broken pipe"); the second is not always
    // named yet (see the closing note of issue 19), so this runs once.
    for _ in 0..1 {
        let out = run(&url, &["status"]).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("not etcd's gRPC API") && stderr.contains("HTTP/1.1 404 Not Found"),
            "{stderr}"
        );
        assert!(!stderr.contains("secret-page-body"), "{stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
}

/// Not a test of its own: the log parser above must see what overlapped.
#[test]
fn the_overlap_check_can_fail() {
    let r = |h: &str, s: f64, e: Option<f64>| Run {
        host: h.into(),
        version: "v2".into(),
        start: s,
        end: e,
    };
    let runs = [r("a", 0.0, Some(2.0)), r("b", 1.0, Some(3.0)), r("c", 2.5, None)];
    assert_eq!(max_overlap(&runs, 0.0).0, 2);
    assert_eq!(max_overlap(&runs, 2.1).0, 2);
}
