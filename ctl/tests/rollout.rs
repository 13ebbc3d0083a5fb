//! jioctl driving real jio-agent processes on a real etcd: limits and order never
//! violated (checked at every revision), concurrent drivers, failures, scale, and
//! bad input that must write nothing.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use jio_common::fleet::Snapshot;
use jio_common::keys::{Key, Schema};
use jio_common::rules::Rules;
use jio_common::store::{CountingStore, DynStore};
use jio_tests::inspect::{host_entries as entries, open, text, wait_for};
use jio_tests::{Etcd, Host, Puppet, Recorder};
use tokio::process::{Child, Command};

use common::{agent_bin, jioctl, run};

fn fake_puppet() -> String {
    format!("{}/../examples/fake-puppet.sh", env!("CARGO_MANIFEST_DIR"))
}

/// Hosts with running agents, converged to v1.
struct Fleet {
    hosts: Vec<Host>,
    daemons: Vec<Child>,
    _puppets: Vec<Puppet>,
    /// Where the fake Puppet of each host writes.
    work: tempfile::TempDir,
}

impl Fleet {
    fn fake_target(&self, host: &str) -> PathBuf {
        self.work.path().join(host)
    }
}

enum Kind {
    /// examples/fake-puppet.sh, fast.
    Fake,
    /// The real puppet apply.
    Real,
}

async fn fleet(url: &str, names: &[&str], kind: Kind) -> Fleet {
    let s = open(url).await;
    // Set by the test when the agents' credentials may not (Consul's agent token).
    let current = Schema::default().current_version();
    if s.get(&current).await.unwrap().is_none() {
        s.put(&current, "v1", None).await.unwrap();
    }
    let work = tempfile::tempdir().unwrap();
    let mut puppets = Vec::new();
    let mut hosts = Vec::new();
    let mut daemons = Vec::new();
    for name in names {
        let cmd = match kind {
            // One sandbox per host, as every node has its own Puppet state.
            Kind::Real => {
                let p = Puppet::new();
                let target = p.scratch().join(name);
                let cmd = p.command(&p.manifest(
                    name,
                    &format!("file {{ '{}': content => 'managed' }}\n", target.display()),
                ));
                puppets.push(p);
                cmd
            }
            Kind::Fake => vec![
                fake_puppet(),
                "--logdest".into(),
                "{log_jsonl}".into(),
                work.path().join(name).display().to_string(),
            ],
        };
        // A long failure retry: a failed host comes back only when re-enabled.
        let host = Host::new(
            name,
            url,
            &cmd,
            "retry_interval = \"1h\"\nhealth_interval = \"0\"",
        );
        let child = Command::from(host.agent(&agent_bin(), &["run"]))
            .env("FAKE_PUPPET_SECONDS", "0.3")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        hosts.push(host);
        daemons.push(child);
    }
    wait_for(
        "the fleet to converge to v1",
        Duration::from_secs(120),
        || async { hosts.iter().all(|h| h.local_version().as_deref() == Some("v1")) },
    )
    .await;
    // An agent writes its version file before it reports to the store: wait until
    // the store, too, shows every host upgraded and none of them running anything,
    // or a recorder started now would count the end of the first convergence (no
    // limits apply to it) as hosts in flight.
    let expected = names.len();
    wait_for(
        "the store to show the fleet settled at v1",
        Duration::from_secs(60),
        || {
            let s = s.clone();
            async move {
                let snap = Snapshot::read(&s, &Schema::default()).await.unwrap();
                let hosts = jio_common::fleet::classify(&snap);
                hosts.len() == expected
                    && hosts
                        .iter()
                        .all(|h| h.state == jio_common::fleet::HostState::Upgraded && h.reason.is_none())
            }
        },
    )
    .await;
    Fleet {
        hosts,
        daemons,
        _puppets: puppets,
        work,
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for d in &mut self.daemons {
            let _ = d.start_kill();
        }
    }
}

async fn assert_all_upgraded(s: &DynStore, hosts: &[Host]) {
    for h in hosts {
        assert_eq!(h.local_version().as_deref(), Some("v2"), "{}", h.name);
        let want: BTreeSet<String> = [
            format!("/status/validated/success/v1/{}", h.name),
            format!("/status/validated/success/v2/{}", h.name),
            format!("/running/versions/v2/{}", h.name),
        ]
        .into_iter()
        .collect();
        assert_eq!(entries(s, &h.name).await, want, "{}", h.name);
    }
}

const EIGHT: [&str; 8] = [
    "controller1",
    "controller2",
    "compute1",
    "compute2",
    "compute3",
    "compute4",
    "stmon1",
    "stmonwithosd1",
];

fn rolling_rules() -> (PathBuf, Rules) {
    let p = PathBuf::from(format!("{}/../examples/rolling.json", env!("CARGO_MANIFEST_DIR")));
    let rules = Rules::parse(&std::fs::read_to_string(&p).unwrap()).unwrap();
    (p, rules)
}

/// A recorder of the store `s` under the example rolling rules, with the path of
/// those rules' file.
async fn record_rolling(s: &DynStore) -> (Recorder, String) {
    let (path, rules) = rolling_rules();
    let rec = Recorder::start(s.clone(), Schema::default(), rules).await;
    (rec, path.to_str().unwrap().to_string())
}

/// `jioctl upgrade v2 --retry` under the rules file `path`: its arguments.
fn upgrade_under(path: &str) -> [&str; 5] {
    ["upgrade", "v2", "--instructions-file", path, "--retry"]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_with_real_puppet_never_breaks_a_limit_or_the_order() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let s = open(&url).await;
    let f = fleet(&url, &EIGHT, Kind::Real).await;
    let (rec, path) = record_rolling(&s).await;
    let out = run(&url, &upgrade_under(&path)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let record = rec.stop().await;
    assert!(record.violations.is_empty(), "{:#?}", record.violations);
    // The limits were actually reached, so the test could have caught a breach.
    assert_eq!(record.max_in_flight.get("compute"), Some(&2), "{record:?}");
    assert_eq!(record.max_in_flight.get("controller"), Some(&1), "{record:?}");
    assert_eq!(record.max_in_flight.get("ceph"), Some(&1), "{record:?}");
    let first_compute = record
        .started
        .iter()
        .position(|h| h.starts_with("compute"))
        .unwrap();
    let last_controller = record
        .started
        .iter()
        .rposition(|h| h.starts_with("controller"))
        .unwrap();
    assert!(last_controller < first_compute, "{:?}", record.started);
    assert_all_upgraded(&s, &f.hosts).await;
    assert!(text(&out).contains("compute"), "{}", text(&out));
    // The lock is released at the end.
    assert!(s.get(&Schema::default().lock("rollout")).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_drivers_at_once_still_respect_the_rules() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let s = open(&url).await;
    let f = fleet(&url, &EIGHT, Kind::Fake).await;
    let (rec, path) = record_rolling(&s).await;
    let args = upgrade_under(&path);
    let (a, b) = tokio::join!(run(&url, &args), run(&url, &args));
    assert_eq!(a.status.code(), Some(0), "{}", text(&a));
    assert_eq!(b.status.code(), Some(0), "{}", text(&b));
    // One started the rollout; the other found it (same version, same rules) and
    // followed it: only the holder of the lock drove it.
    assert!(
        text(&a).contains("following rollout") || text(&b).contains("following rollout"),
        "one must have followed the other's rollout:\n{}\n{}",
        text(&a),
        text(&b)
    );
    let record = rec.stop().await;
    assert!(record.violations.is_empty(), "{:#?}", record.violations);
    assert_eq!(record.max_in_flight.get("compute"), Some(&2));
    assert_all_upgraded(&s, &f.hosts).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_host_stops_the_rollout_and_fixing_it_continues() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let s = open(&url).await;
    let names = ["compute1", "compute2", "compute3", "compute4"];
    let f = fleet(&url, &names, Kind::Fake).await;
    // compute2's "puppet" cannot write its file any more: it will exit 4.
    let broken = f.fake_target("compute2");
    std::fs::remove_file(&broken).unwrap();
    std::fs::create_dir(&broken).unwrap();
    let rules = r#"{"rolling_rules": {"global": 1}}"#;
    let out = run(&url, &["upgrade", "v2", "--instructions", rules, "--retry"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("stopped") && text(&out).contains("compute2: configured failed"),
        "{}",
        text(&out)
    );
    let failures = run(&url, &["get-failures", "--hosts"]).await;
    assert_eq!(failures.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&failures.stdout).starts_with("compute2\tcompute\tconfigured"),
        "{}",
        text(&failures)
    );
    let st: serde_json::Value =
        serde_json::from_slice(&run(&url, &["status", "--json"]).await.stdout).unwrap();
    assert_eq!(st["failed"]["compute"], serde_json::json!(["compute2"]));
    assert_eq!(
        st["pending"]["compute"],
        serde_json::json!(["compute3", "compute4"])
    );

    // Fix the host, tell its agent to try again now, and re-run the rollout.
    std::fs::remove_dir(&broken).unwrap();
    let out = run(&url, &["enable-puppet", "true", "--host", "compute2"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    wait_for(
        "compute2 to retry and reach v2",
        Duration::from_secs(30),
        || async { f.hosts[1].local_version().as_deref() == Some("v2") },
    )
    .await;
    let out = run(&url, &["upgrade", "v2", "--instructions", rules, "--retry"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_all_upgraded(&s, &f.hosts).await;
    assert_eq!(run(&url, &["get-failures"]).await.status.code(), Some(0));
    assert_eq!(
        run(&url, &["check-single-version", "v2"]).await.status.code(),
        Some(0)
    );
}

async fn generate(s: &DynStore, n: usize) {
    jio_tests::fleetgen::generate(s, n).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_requests_do_not_grow_with_the_fleet() {
    let mut counts = Vec::new();
    for n in [100, 10_000] {
        let etcd = Etcd::start().await;
        let s = open(&etcd.url()).await;
        generate(&s, n).await;
        let counting = CountingStore::new(s.clone());
        let dynamic: DynStore = Arc::new(counting.clone());
        let snap = Snapshot::read(&dynamic, &Schema::default()).await.unwrap();
        assert_eq!(snap.hosts().len(), n);
        counts.push(counting.requests());
        if n == 10_000 {
            let out = run(&etcd.url(), &["status", "--json"]).await;
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            // The generated fleet has failed hosts: exit 1, as documented.
            assert_eq!(out.status.code(), Some(common::status_code(&v)), "{}", text(&out));
            assert_eq!(common::status_code(&v), 1, "the generated fleet has failures");
            let total: usize = ["upgraded", "upgrading", "failed", "pending", "lost"]
                .iter()
                .map(|k| {
                    v[k].as_object()
                        .unwrap()
                        .values()
                        .map(|l| l.as_array().unwrap().len())
                        .sum::<usize>()
                })
                .sum();
            assert_eq!(total, 10_000);
            assert_eq!(
                v["failed"]
                    .as_object()
                    .unwrap()
                    .values()
                    .map(|l| l.as_array().unwrap().len())
                    .sum::<usize>(),
                104
            );
        }
    }
    assert_eq!(
        counts[0], counts[1],
        "store requests for 100 and 10,000 hosts: {counts:?}"
    );
    // The locks, then the version, enable keys, current rollout, driver services,
    // holds, phase grants and maintenance hooks, then hosts, versions, agents, run
    // markers, clocks, results, failures (2) and the rollout record (none here).
    assert!(counts[0] <= 16, "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_writes_nothing() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let s = open(&url).await;
    generate(&s, 8).await;
    s.put(
        &Key::new("/hosts/stmon99").unwrap(),
        r#"{"role":"stmon","agent_version":"1","addresses":[],"first_seen":1}"#,
        None,
    )
    .await
    .unwrap();
    // Its agent is alive (a host without one is never admitted, so no wave).
    s.put(
        &Key::new("/agents/stmon99").unwrap(),
        r#"{"state":"idle","version":"v1","since":1,"pid":1}"#,
        None,
    )
    .await
    .unwrap();
    let before = s.ping().await.unwrap();
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec!["upgrade", "v3", "--instructions", "{"], 3, "malformed JSON"),
        (
            vec![
                "upgrade",
                "v3",
                "--instructions",
                r#"{"rolling_rules": {"global": -1}}"#,
            ],
            3,
            "rolling_rules.global: -1",
        ),
        (
            vec![
                "upgrade",
                "v3",
                "--instructions",
                r#"{"role_order": {"a": "b", "b": "a"}}"#,
            ],
            3,
            "cycle",
        ),
        (
            vec![
                "upgrade",
                "v3",
                "--instructions",
                r#"{"group_mappings": {"x": "st.*", "y": "stm.*"}}"#,
            ],
            3,
            "matches more than one group",
        ),
        (
            vec!["upgrade", "v3", "--instructions", r#"{"roles": {}}"#],
            3,
            "unknown key \"roles\"",
        ),
        (vec!["upgrade", "bad/version"], 64, "must not contain '/'"),
        (vec!["enable-puppet", "true", "--host", "web 1"], 64, "whitespace"),
        (
            vec!["enable-puppet", "yes", "--global"],
            64,
            "expected true or false",
        ),
        (vec!["verify-hosts", "v1", "../etc"], 64, "invalid host name"),
        (vec!["status", "--role", ".."], 64, "must not be '.' or '..'"),
        // No rules at all: refused, saying how many hosts would start at once.
        (vec!["upgrade", "v3", "--noop"], 3, "host(s) would start at once"),
        (vec!["upgrade", "v3", "--noop", "--force"], 0, "plan for v3"),
        // The whole planned sequence, not only the first pass.
        (
            vec!["upgrade", "v3", "--noop", "--force"],
            0,
            "wave(s), if every host admitted finishes and none fails:\n  wave 1:",
        ),
    ];
    for (args, code, needle) in cases {
        let out = run(&url, &args).await;
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(needle), "{args:?}: {}", text(&out));
        assert_eq!(s.ping().await.unwrap(), before, "{args:?} wrote to the store");
    }
    // An unreachable store: a one-line error naming it, exit 2.
    let port = jio_tests::free_port();
    let dead = format!("etcd://127.0.0.1:{port}");
    let out = jioctl(&dead, &["status"]).output().await.unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("127.0.0.1:{port}")),
        "{}",
        text(&out)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim().lines().count(),
        1,
        "{}",
        text(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_is_named_and_once_writes_nothing_more() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let s = open(&url).await;
    generate(&s, 4).await;
    let lease = s.grant_lease(Duration::from_secs(30)).await.unwrap();
    s.put(
        &Schema::default().lock("rollout"),
        r#"{"holder":"alice","host":"laptop7","pid":4242,"since":1700000000}"#,
        Some(&lease.id),
    )
    .await
    .unwrap();
    let enable = jio_common::keys::Key::new("/config_state/enable_puppet/").unwrap();
    let keys = |kvs: Vec<jio_common::store::KeyValue>| -> Vec<(String, String)> {
        kvs.into_iter().map(|kv| (kv.key.to_string(), kv.value)).collect()
    };
    let before = keys(s.list(&enable).await.unwrap().kvs);
    // One pass: the rollout is recorded, and left to the driver that holds the lock.
    let out = run(&url, &["upgrade", "v2", "--once", "--force"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("is driven by alice on laptop7 (pid 4242")
            && text(&out).contains("writes nothing more"),
        "{}",
        text(&out)
    );
    assert_eq!(
        keys(s.list(&enable).await.unwrap().kvs),
        before,
        "no enable key was written"
    );
    assert!(
        s.get(&Schema::default().current_rollout())
            .await
            .unwrap()
            .is_some(),
        "the rollout is recorded"
    );
    let st = run(&url, &["status"]).await;
    assert!(
        text(&st).contains("rollout driven by alice on laptop7"),
        "{}",
        text(&st)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_watch_redraws_on_change() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let s = open(&url).await;
    generate(&s, 4).await;
    let mut child = jioctl(&url, &["status", "--watch", "--json"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(next_json(&mut lines).await["current_version"], "v2");
    // Each change is drawn once, and the first line after a change is that change's:
    // a redraw while nothing changed (polling) would come first and fail this. The
    // runs of `jioctl trigger-update` in between give a timer time to fire (forced:
    // the generated fleet has enabled hosts with live agents, which it would release
    // outside any rules).
    for v in ["v9", "v10", "v11"] {
        let out = run(&url, &["trigger-update", v, "--force"]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let drawn = next_json(&mut lines).await;
        assert_eq!(
            drawn["current_version"], v,
            "the redraw after setting {v} must be the change's, not a redraw of nothing: {drawn}"
        );
    }
    child.kill().await.unwrap();
}

async fn next_json(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) -> serde_json::Value {
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    serde_json::from_str(&line).unwrap()
}

/// On Consul with ACLs on: the agents hold a token with docs/tls-and-users.md's `jio-agent`
/// policy, `jioctl` a management token. Every agent's write is within its policy
/// (a denied one would fail its run), and the rollout survives every session
/// expiring midway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_on_consul_survives_sessions_expiring_midway() {
    use jio_tests::consul::{AclToken, ConsulOptions, ConsulServer, expire_session};
    let server = ConsulServer::start(ConsulOptions {
        token: Some("operator-7e1c-secret".into()),
        tokens: vec![AclToken::jio_agent("agent-5b2a-secret")],
        ..ConsulOptions::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let url = server.url_with_token(dir.path(), "operator.token", "operator-7e1c-secret");
    let agents_url = server.url_with_token(dir.path(), "agent.token", "agent-5b2a-secret");
    let s = open(&url).await;
    // The agent token may not move the fleet.
    let agent_store = open(&agents_url).await;
    let err = agent_store
        .put(&Schema::default().current_version(), "v9", None)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("Permission denied (writing /current_version"),
        "{err}"
    );
    s.put(&Schema::default().current_version(), "v1", None)
        .await
        .unwrap();
    let f = fleet(&agents_url, &EIGHT, Kind::Fake).await;
    let (rec, path) = record_rolling(&s).await;
    let driver = jioctl(&url, &upgrade_under(&path))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once the first host is through, Consul invalidates every session (as when nodes
    // fail their checks): liveness records and the rollout lock vanish.
    let v2 = Key::new("/running/versions/v2/").unwrap();
    wait_for("a host to reach v2", Duration::from_secs(60), || async {
        !s.list(&v2).await.unwrap().kvs.is_empty()
    })
    .await;
    let schema = Schema::default();
    let mut expired = 0;
    for prefix in [schema.agents(), schema.locks()] {
        for kv in s.list(&prefix).await.unwrap().kvs {
            if let Some(l) = kv.lease {
                expire_session(&server, &l.0).await;
                expired += 1;
            }
        }
    }
    assert!(
        expired >= 8,
        "expected the agents' sessions and the lock's, got {expired}"
    );
    let out = tokio::time::timeout(Duration::from_secs(120), driver.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let record = rec.stop().await;
    assert!(record.violations.is_empty(), "{:#?}", record.violations);
    assert_all_upgraded(&s, &f.hosts).await;
    // Every agent made itself a new session and put its liveness record back.
    wait_for(
        "every liveness record to come back",
        Duration::from_secs(30),
        || async { s.list(&schema.agents()).await.unwrap().kvs.len() >= EIGHT.len() },
    )
    .await;
}
