//! A run that needs a reboot ends with one, inside the host's slot: the slot is
//! held from the configuration step through the reboot to the validation after the
//! boot; a host that does not come back keeps it (rebooting, then lost); a reboot
//! that never happens, or one that did not clear what required it, fails the run
//! and is never tried again in the same run; a hold stops a reboot that has not
//! begun. Real etcd, real agents and driver; reboots are played by the hosts' own
//! reboot commands and the test (`common::reboot`), and every check reads the
//! steps' own logs: the configuration step's, the reboot command's and the
//! validation scripts'.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::time::Duration;

use jio_tests::inspect::{open, text, wait_for};

use common::fleet::{Fleet, finish, now, spawn};
use common::reboot::{Boots, log_validations, validations};
use common::run;

const THREE: [&str; 3] = ["compute1", "compute2", "compute3"];
const ONE_AT_A_TIME: &str = r#"{"rolling_rules":{"roles":{"compute":1}}}"#;

async fn status_json(url: &str) -> serde_json::Value {
    let out = run(url, &["status", "--json"]).await;
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)))
}

fn reason(v: &serde_json::Value, host: &str) -> String {
    v["hosts"][host]["reason"]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Slots `(host, from, to)` from the logs: each must end before the next begins.
fn assert_one_at_a_time(mut slots: Vec<(String, f64, f64)>) {
    slots.sort_by(|a, b| a.1.total_cmp(&b.1));
    for w in slots.windows(2) {
        assert!(
            w[0].2 < w[1].1,
            "{}'s slot began at {} before {} was back and validated at {}",
            w[1].0,
            w[1].1,
            w[0].0,
            w[0].2
        );
    }
}

/// Runs the driver to its end while the boots are played; samples `status`
/// whenever a host is down. Returns the driver's output and the samples.
async fn drive_with_boots(
    url: &str,
    f: &mut Fleet,
    boots: &mut Boots,
    mut driver: tokio::process::Child,
) -> (std::process::Output, Vec<(String, String, String)>) {
    let mut samples = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(150);
    while driver.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the rollout did not end in time"
        );
        boots.tick(f);
        for h in boots.down_now(f) {
            let v = status_json(url).await;
            let state = v["hosts"][&h]["state"].as_str().unwrap_or_default().to_string();
            samples.push((h.clone(), state, reason(&v, &h)));
            let explained = text(&run(url, &["explain", &h]).await);
            samples.push((h.clone(), "explain".into(), explained));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (finish(driver, Duration::from_secs(5)).await, samples)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_host_reboots_inside_its_slot_and_frees_it_only_when_back_and_validated() {
    let etcd = jio_tests::Etcd::start().await;
    let url = etcd.url();
    let prom = tempfile::tempdir().unwrap();
    let textfile = |h: &str| prom.path().join(format!("{h}.prom"));
    let mut f = Fleet::start_with(&url, &url, &THREE, 0.3, |h| {
        format!("metrics_textfile = {:?}\n", textfile(h).display().to_string())
    })
    .await;
    log_validations(&f);
    for h in &f.hosts {
        std::fs::write(h.reboot_required_file(), "*** System restart required ***\n").unwrap();
        std::fs::write(
            h.reboot_required_file().with_extension("pkgs"),
            "linux-image-amd64\n",
        )
        .unwrap();
    }
    let t0 = now();
    let mut boots = Boots::new(Duration::from_secs(2), &[]);
    let args = ["upgrade", "v2", "--instructions", ONE_AT_A_TIME];
    let (out, samples) = drive_with_boots(&url, &mut f, &mut boots, spawn(&url, &args)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(f.all_at("v2"));
    // From the logs alone: each host's slot, from its configuration step's start to
    // its validation after the boot, holds its reboot (down) and boot (up), and no
    // two slots overlap.
    let runs = f.runs();
    let vals = validations(&f);
    let mut slots = Vec::new();
    for h in &f.hosts {
        let reboots = h.reboots();
        assert_eq!(
            reboots.len(),
            1,
            "{} rebooted {} times: {reboots:?}",
            h.name,
            reboots.len()
        );
        assert_eq!(h.boot_id(), "boot-1", "{} did not boot again", h.name);
        let start = runs
            .iter()
            .find(|r| r.host == h.name && r.version == "v2" && r.start >= t0)
            .unwrap()
            .start;
        let down = reboots[0].1;
        let up = boots.ups.iter().find(|(n, _)| n == &h.name).unwrap().1;
        let back = vals
            .iter()
            .find(|(n, id, _)| n == &h.name && id == "boot-1")
            .unwrap_or_else(|| panic!("{} was not validated after its boot: {vals:?}", h.name))
            .2;
        assert!(
            start < down && down < up && up < back,
            "{}: start {start} down {down} up {up} validated {back}",
            h.name
        );
        slots.push((h.name.clone(), start, back));
    }
    assert_one_at_a_time(slots);
    // While a host was down, status said so (and it was still in flight).
    assert!(
        samples
            .iter()
            .any(|(_, state, why)| state == "upgrading" && why.contains("rebooting since")),
        "{samples:#?}"
    );
    assert!(
        samples
            .iter()
            .any(|(_, kind, why)| kind == "explain" && why.contains("rebooting since")),
        "{samples:#?}"
    );
    assert!(
        samples.iter().all(|(_, state, _)| state != "lost"),
        "{samples:#?}"
    );
    // Each agent, started again by the boot, counted the boot it came back from.
    for h in THREE {
        let m = std::fs::read_to_string(textfile(h)).unwrap_or_default();
        assert!(
            m.contains("jio_agent_reboots_total{event=\"back\"} 1"),
            "{h}: {m}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_does_not_come_back_keeps_its_slot_and_is_lost_past_its_deadline() {
    let etcd = jio_tests::Etcd::start().await;
    let url = etcd.url();
    let mut f = Fleet::start_with(&url, &url, &THREE, 0.2, |_| "reboot_timeout = \"6s\"\n".into()).await;
    std::fs::write(f.hosts[0].reboot_required_file(), "").unwrap();
    let t0 = now();
    let rules = r#"{"rolling_rules":{"roles":{"compute":1}},"progress_deadline":"10s"}"#;
    let driver = spawn(&url, &["upgrade", "v2", "--instructions", rules]);
    let mut boots = Boots::new(Duration::from_secs(1), &["compute1"]);
    let s = open(&url).await;
    let until = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        boots.tick(&mut f);
        let v = status_json(&url).await;
        if v["hosts"]["compute1"]["state"] == "lost" && reason(&v, "compute1").contains("not back by") {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "compute1 is not lost past its deadline: {v:#}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    wait_for(
        "the rollout to be marked stuck",
        Duration::from_secs(30),
        || async {
            let out = run(&url, &["rollout", "status"]).await;
            text(&out).contains("stuck") && text(&out).contains("compute1")
        },
    )
    .await;
    // Nothing of the role moved while compute1 held the slot.
    let others: Vec<_> = f
        .runs()
        .into_iter()
        .filter(|r| r.start >= t0 && r.host != "compute1")
        .collect();
    assert!(others.is_empty(), "{others:#?}");
    assert!(!common::fleet::keys_under(&s, "/runs/compute1").await.is_empty());
    // Its agent comes back on the same boot: the reboot never happened, the run failed.
    f.daemons[0] = f.spawn_agent(0);
    wait_for("compute1's run to fail", Duration::from_secs(30), || async {
        let v = status_json(&url).await;
        v["hosts"]["compute1"]["state"] == "failed"
    })
    .await;
    let v = status_json(&url).await;
    let failed = v["hosts"]["compute1"].to_string();
    assert!(failed.contains("did not reboot within 6s"), "{failed}");
    assert_eq!(f.hosts[0].reboots().len(), 1);
    let out = finish(driver, Duration::from_secs(60)).await;
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reboot_that_leaves_it_required_fails_the_host_and_is_not_tried_again() {
    let etcd = jio_tests::Etcd::start().await;
    let url = etcd.url();
    let mut f = Fleet::start(&url, &["compute1"], 0.1).await;
    log_validations(&f);
    let h = &f.hosts[0];
    std::fs::write(h.reboot_required_file(), "").unwrap();
    std::fs::write(h.dir().join("keep-required"), "").unwrap();
    let mut boots = Boots::new(Duration::from_secs(1), &[]);
    let args = ["upgrade", "v2", "--instructions", ONE_AT_A_TIME];
    let (out, _) = drive_with_boots(&url, &mut f, &mut boots, spawn(&url, &args)).await;
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    let v = status_json(&url).await;
    assert_eq!(v["hosts"]["compute1"]["state"], "failed", "{v:#}");
    assert!(
        v["hosts"]["compute1"]
            .to_string()
            .contains("still required after rebooting"),
        "{v:#}"
    );
    // Validated after the boot, and rebooted once only.
    assert!(validations(&f).iter().any(|(_, id, _)| id == "boot-1"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(f.hosts[0].reboots().len(), 1, "{:?}", f.hosts[0].reboots());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_placed_during_the_run_stops_its_reboot_until_released() {
    let etcd = jio_tests::Etcd::start().await;
    let url = etcd.url();
    let mut f = Fleet::start(&url, &["compute1"], 3.0).await;
    std::fs::write(f.hosts[0].reboot_required_file(), "").unwrap();
    let driver = spawn(&url, &["upgrade", "v2", "--instructions", ONE_AT_A_TIME]);
    wait_for("compute1's puppet to start", Duration::from_secs(30), || async {
        f.runs().iter().any(|r| r.version == "v2")
    })
    .await;
    let out = run(&url, &["hold", "compute1", "--reason", "disk check"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    wait_for(
        "the reboot to wait for the hold",
        Duration::from_secs(30),
        || async { reason(&status_json(&url).await, "compute1").contains("ends with a reboot, waiting") },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(f.hosts[0].reboots().is_empty(), "rebooted while held");
    let out = run(&url, &["release", "compute1"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let mut boots = Boots::new(Duration::from_secs(1), &[]);
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while !(f.all_at("v2") && f.hosts[0].boot_id() == "boot-1") {
        assert!(
            std::time::Instant::now() < until,
            "compute1 did not reboot and upgrade after the release"
        );
        boots.tick(&mut f);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let out = finish(driver, Duration::from_secs(60)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jioctl_reboot_reboots_one_host_at_a_time_each_back_and_validated_before_the_next() {
    let etcd = jio_tests::Etcd::start().await;
    let url = etcd.url();
    let mut f = Fleet::start(&url, &THREE, 0.1).await;
    log_validations(&f);
    let mut boots = Boots::new(Duration::from_secs(2), &[]);
    let args = ["reboot", "--role", "compute", "--instructions", ONE_AT_A_TIME];
    let (out, samples) = drive_with_boots(&url, &mut f, &mut boots, spawn(&url, &args)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let vals = validations(&f);
    let mut slots = Vec::new();
    for h in &f.hosts {
        let reboots = h.reboots();
        assert_eq!(reboots.len(), 1, "{}: {reboots:?}", h.name);
        let down = reboots[0].1;
        let back = vals
            .iter()
            .find(|(n, id, _)| n == &h.name && id == "boot-1")
            .unwrap_or_else(|| panic!("{} was not validated after its boot: {vals:?}", h.name))
            .2;
        slots.push((h.name.clone(), down, back));
    }
    assert_one_at_a_time(slots);
    assert!(
        samples.iter().any(|(_, _, why)| why.contains("rebooting since")),
        "{samples:#?}"
    );
    // Only where required: compute2 alone says it needs one.
    std::fs::write(f.hosts[1].reboot_required_file(), "").unwrap();
    let args = [
        "reboot",
        "--all",
        "--only-if-required",
        "--instructions",
        ONE_AT_A_TIME,
    ];
    let (out, _) = drive_with_boots(&url, &mut f, &mut boots, spawn(&url, &args)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let counts: Vec<usize> = f.hosts.iter().map(|h| h.reboots().len()).collect();
    assert_eq!(counts, vec![1, 2, 1], "only compute2 reboots again");
    assert!(
        text(&out).contains("no reboot was required") || text(&out).contains("succeeded"),
        "{}",
        text(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_window_the_reboot_starts_only_with_the_drivers_permit() {
    let etcd = jio_tests::Etcd::start().await;
    let url = etcd.url();
    let mut f = Fleet::start(&url, &["compute1"], 0.1).await;
    std::fs::write(f.hosts[0].reboot_required_file(), "").unwrap();
    // A window open now (by this machine's clock, which the driver uses).
    let t = now() as u64;
    let hm = |at: u64| format!("{:02}:{:02}", (at / 3600) % 24, (at / 60) % 60);
    let rules = format!(
        r#"{{"rolling_rules":{{"roles":{{"compute":1}}}},"windows":[{{"days":"daily","start":"{}","end":"{}"}}]}}"#,
        hm(t - 3600),
        hm(t + 3600)
    );
    let mut boots = Boots::new(Duration::from_secs(1), &[]);
    let args = ["upgrade", "v2", "--instructions", rules.as_str()];
    let (out, _) = drive_with_boots(&url, &mut f, &mut boots, spawn(&url, &args)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(f.hosts[0].reboots().len(), 1);
    assert_eq!(f.hosts[0].boot_id(), "boot-1");
    let log = f.agent_log("compute1");
    let waited = log.find("waits for the driver's permit").expect(&log);
    let rebooted = log.find("rebooting").expect(&log);
    assert!(waited < rebooted, "{log}");
    assert!(text(&out).contains("the reboot of compute1"), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_hooks_hold_the_slot_from_before_through_the_reboot_to_after() {
    let etcd = jio_tests::Etcd::start().await;
    let url = etcd.url();
    let mut f = Fleet::start(&url, &["compute1", "compute2"], 0.2).await;
    log_validations(&f);
    for h in &f.hosts {
        std::fs::write(h.reboot_required_file(), "").unwrap();
    }
    let hooks = common::hooks::Hooks::new(0.2);
    let config = hooks.config("1m");
    let mut c = common::jioctl(
        &url,
        &[
            "--config",
            config.to_str().unwrap(),
            "upgrade",
            "v2",
            "--instructions",
            ONE_AT_A_TIME,
        ],
    );
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut boots = Boots::new(Duration::from_secs(2), &[]);
    let (out, _) = drive_with_boots(&url, &mut f, &mut boots, c.spawn().unwrap()).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // From the hooks' own log, the reboot commands' and the boots: each host went
    // down and came back between its before hook's start and its after hook's end,
    // and was validated after its boot before its after hook began.
    let intervals = hooks.intervals();
    assert_eq!(intervals.len(), 2, "{intervals:#?}");
    let vals = validations(&f);
    let runs = hooks.runs();
    for h in &f.hosts {
        let (_, from, to) = intervals.iter().find(|(n, _, _)| n == &h.name).unwrap().clone();
        let to = to.unwrap_or_else(|| panic!("{}'s after hook did not end", h.name));
        let down = h.reboots()[0].1;
        let up = boots.ups.iter().find(|(n, _)| n == &h.name).unwrap().1;
        let back = vals
            .iter()
            .find(|(n, id, _)| n == &h.name && id == "boot-1")
            .unwrap()
            .2;
        let after = runs
            .iter()
            .find(|r| r.host == h.name && r.hook == "after")
            .unwrap()
            .start;
        assert!(
            from < down && down < up && up < back && back < after && after < to,
            "{}: before {from} down {down} up {up} validated {back} after {after}..{to}",
            h.name
        );
    }
    assert_one_at_a_time(
        intervals
            .into_iter()
            .map(|(n, a, b)| (n, a, b.unwrap()))
            .collect(),
    );
}
