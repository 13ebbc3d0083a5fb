//! Fault injection: a fleet of real `jio-agent` daemons with real `puppet apply`,
//! driven by real `jioctl` processes on a 3-member etcd, under a random bounded
//! schedule of faults drawn from a seed; and the independent check.
//!
//! The check never asks the project what happened. The Puppet manifest every agent
//! applies appends a `start` and an `end` line (host, version, wall-clock time) to one
//! log file; the limits and the role order are checked on those intervals alone, the
//! convergence on the agents' own version files and `jioctl verify-hosts`, and the
//! lifecycle entries with the real `etcdctl`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::process::{require_binary, spawn_tied};
use crate::{Etcd, Host, Puppet};

/// splitmix64: a small seeded generator (the schedule must replay from its seed).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// One run of the configuration step, from the shared log.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub host: String,
    pub version: String,
    pub start: f64,
    /// The `end` line; a run without one (its Puppet was killed) ends when the next
    /// run of its host starts (a new run starts only once the old one was stopped),
    /// or is still going.
    pub end: Option<f64>,
}

/// Parses the shared log.
pub fn parse_runs(log: &str) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for line in log.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [kind, host, version, at] = f[..] else {
            continue;
        };
        let Ok(at) = at.parse::<f64>() else { continue };
        match kind {
            "start" => {
                // An earlier run of this host without an end was stopped before this one.
                if let Some(open) = runs.iter_mut().rev().find(|r| r.host == host && r.end.is_none()) {
                    open.end = Some(at);
                }
                runs.push(Run {
                    host: host.into(),
                    version: version.into(),
                    start: at,
                    end: None,
                });
            }
            "end" => {
                if let Some(r) = runs
                    .iter_mut()
                    .rev()
                    .find(|r| r.host == host && r.version == version && r.end.is_none())
                {
                    r.end = Some(at);
                }
            }
            _ => {}
        }
    }
    runs
}

/// The rules as the check reads them: each host's group, each group's limit, and
/// which group waits for which.
pub struct Invariants {
    pub group_of: BTreeMap<String, String>,
    pub limits: BTreeMap<String, usize>,
    /// (group, the group it waits for)
    pub order: Vec<(String, String)>,
}

impl Invariants {
    /// Every violation among the runs that start at or after `from`.
    pub fn violations(&self, runs: &[Run], from: f64) -> Vec<String> {
        let mut out = Vec::new();
        let group = |h: &str| self.group_of.get(h).cloned().unwrap_or_else(|| h.to_string());
        for r in runs.iter().filter(|r| r.start >= from) {
            let g = group(&r.host);
            let t = r.start;
            let at: Vec<String> = runs
                .iter()
                .filter(|o| group(&o.host) == g && o.start <= t && o.end.is_none_or(|e| e > t))
                .map(|o| format!("{}@{}", o.host, o.version))
                .collect();
            if let Some(limit) = self.limits.get(&g)
                && at.len() > *limit
            {
                out.push(format!(
                    "at {t:.3} {} hosts of {g} ran at once (limit {limit}): {}",
                    at.len(),
                    at.join(" ")
                ));
            }
            for (waiter, dep) in &self.order {
                if &g != waiter {
                    continue;
                }
                for (h, hg) in &self.group_of {
                    if hg != dep {
                        continue;
                    }
                    let done = runs
                        .iter()
                        .any(|o| &o.host == h && o.version == r.version && o.end.is_some_and(|e| e <= t));
                    if !done {
                        out.push(format!(
                            "at {t:.3} {} started {} before {h} ({dep}) had finished {}",
                            r.host, r.version, r.version
                        ));
                    }
                }
            }
        }
        out
    }
}

/// The kinds of fault a schedule draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    LeaderKill,
    StoreFreeze,
    AgentKill,
    AgentStop,
    DriverKill,
    /// SIGSTOP past the lock's lease while another operator takes over.
    DriverStop,
    Retarget,
    EmergencyStop,
    TwoOperators,
    BadVersion,
    BadEnable,
    BadHostRecord,
    /// `forget-host --force` on a host whose run marker is there (refused).
    ForgetInFlight,
    /// An agent started again with its clock 90 s off (libfaketime).
    SkewedClock,
    /// `/rollouts/current` not text for 3 s.
    BadCurrentRollout,
}

impl Fault {
    pub const ALL: [Fault; 15] = [
        Fault::LeaderKill,
        Fault::StoreFreeze,
        Fault::AgentKill,
        Fault::AgentStop,
        Fault::DriverKill,
        Fault::DriverStop,
        Fault::Retarget,
        Fault::EmergencyStop,
        Fault::TwoOperators,
        Fault::BadVersion,
        Fault::BadEnable,
        Fault::BadHostRecord,
        Fault::ForgetInFlight,
        Fault::SkewedClock,
        Fault::BadCurrentRollout,
    ];
}

/// libfaketime, from Debian's `faketime` (the skewed-clock fault).
pub const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// A schedule: faults at offsets from the start of the rollout.
pub fn schedule(seed: u64, faults: usize) -> Vec<(Duration, Fault)> {
    let mut rng = Rng::new(seed);
    let mut out: Vec<(Duration, Fault)> = Vec::new();
    for _ in 0..faults {
        let mut f = Fault::ALL[rng.below(Fault::ALL.len())];
        // At most one long driver freeze per schedule (it costs a lock lease).
        if f == Fault::DriverStop && out.iter().any(|(_, x)| *x == Fault::DriverStop) {
            f = Fault::DriverKill;
        }
        out.push((Duration::from_millis(1000 + rng.below(14_000) as u64), f));
    }
    out.sort_by_key(|(t, _)| *t);
    out
}

/// Wall-clock seconds, as `date +%s.%N` prints them.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

struct Node {
    host: Host,
    _puppet: Puppet,
    daemon: Option<Child>,
    log: PathBuf,
}

/// The fleet, its store and its drivers; everything is stopped on drop.
pub struct FaultFleet {
    pub etcd: Etcd,
    pub url: String,
    nodes: Vec<Node>,
    drivers: Vec<Child>,
    pub dir: tempfile::TempDir,
    agent_bin: PathBuf,
    jioctl_bin: PathBuf,
    pub rules: String,
    /// What happened, for the failure message.
    pub events: Vec<String>,
    started: Instant,
}

/// The fleet's hosts (the roles come from the names).
pub const HOSTS: [&str; 7] = [
    "controller1",
    "controller2",
    "compute1",
    "compute2",
    "compute3",
    "stmon1",
    "stmonwithosd1",
];

/// The rules every driver is given: one controller, two computes, one ceph host at
/// a time; computes after every controller.
pub const RULES: &str = r#"{"rolling_rules":{"global":1,"roles":{"compute":2}},"role_order":{"compute":"controller"},"group_mappings":{"ceph":["st.*"]}}"#;

pub fn invariants() -> Invariants {
    let group = |h: &str| {
        if h.starts_with("st") {
            "ceph"
        } else {
            h.trim_end_matches(|c: char| c.is_ascii_digit())
        }
        .to_string()
    };
    Invariants {
        group_of: HOSTS.iter().map(|h| (h.to_string(), group(h))).collect(),
        limits: [("controller", 1), ("compute", 2), ("ceph", 1)]
            .into_iter()
            .map(|(g, n)| (g.to_string(), n))
            .collect(),
        order: vec![("compute".into(), "controller".into())],
    }
}

impl FaultFleet {
    /// A 3-member etcd and the fleet converged to v1.
    pub async fn start(agent_bin: &Path, jioctl_bin: &Path) -> FaultFleet {
        let etcd = Etcd::cluster(3).await;
        let url = etcd.url();
        let dir = tempfile::Builder::new()
            .prefix("jio-faults-")
            .tempdir()
            .expect("temporary directory");
        let mut f = FaultFleet {
            etcd,
            url,
            nodes: Vec::new(),
            drivers: Vec::new(),
            dir,
            agent_bin: agent_bin.to_path_buf(),
            jioctl_bin: jioctl_bin.to_path_buf(),
            rules: RULES.to_string(),
            events: Vec::new(),
            started: Instant::now(),
        };
        f.etcdctl(&["put", "/current_version", "v1"]);
        let runlog = f.runlog();
        for name in HOSTS {
            let puppet = Puppet::new();
            // The configuration step's own log: puppet's exec resources write it.
            let line = |kind: &str| {
                format!(
                    "exec {{ 'jio-{kind}': command => '/bin/sh -c \"echo {kind} $JIO_HOST $JIO_VERSION $(env -u LD_PRELOAD -u FAKETIME date +%s.%N) >> {}\"' }}",
                    runlog.display()
                )
            };
            let manifest = puppet.manifest(
                "fleet",
                &format!(
                    "{}\n-> exec {{ 'jio-work': command => '/bin/sleep 1.5' }}\n-> {}\n",
                    line("start"),
                    line("end")
                ),
            );
            let host = Host::new(
                name,
                &f.url,
                &puppet.command(&manifest),
                "retry_interval = \"2s\"\nhealth_interval = \"0\"\nresync_interval = \"10s\"",
            );
            let log = f.dir.path().join(format!("{name}.log"));
            f.nodes.push(Node {
                host,
                _puppet: puppet,
                daemon: None,
                log,
            });
        }
        for i in 0..f.nodes.len() {
            f.start_agent(i);
        }
        f.wait_all_at("v1", Duration::from_secs(180)).await;
        f
    }

    pub fn runlog(&self) -> PathBuf {
        self.dir.path().join("runs.log")
    }

    pub fn runs(&self) -> Vec<Run> {
        parse_runs(&std::fs::read_to_string(self.runlog()).unwrap_or_default())
    }

    fn note(&mut self, what: String) {
        let line = format!("{:>7.2}s {what}", self.started.elapsed().as_secs_f64());
        eprintln!("faults: {line}");
        self.events.push(line);
    }

    fn start_agent(&mut self, i: usize) {
        self.start_agent_env(i, &[]);
    }

    fn start_agent_env(&mut self, i: usize, env: &[(&str, &str)]) {
        let n = &mut self.nodes[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&n.log)
            .expect("agent log");
        let child = spawn_tied(
            n.host
                .agent(&self.agent_bin, &["run"])
                .envs(env.iter().copied())
                .stdout(Stdio::null())
                .stderr(log),
        )
        .expect("start jio-agent");
        n.daemon = Some(child);
    }

    /// Runs `etcdctl` against the cluster; its stdout.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        self.etcdctl_raw(&args.iter().map(std::ffi::OsStr::new).collect::<Vec<_>>())
    }

    fn etcdctl_raw(&self, args: &[&std::ffi::OsStr]) -> String {
        let bin = require_binary("etcdctl", "apt-get install -y etcd-client");
        let out = Command::new(bin)
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.url.trim_start_matches("etcd://")))
            .arg("--command-timeout=15s")
            .args(args)
            .output()
            .expect("run etcdctl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn put_bytes(&self, key: &str, value: &[u8]) {
        crate::etcd::etcdctl_put(&self.url, key.as_bytes(), value);
    }

    fn jioctl(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.jioctl_bin);
        c.arg("--store")
            .arg(&self.url)
            .args(args)
            .env_remove("JIO_STORE")
            .env("HOME", "/nonexistent");
        c
    }

    /// Starts `jioctl upgrade v<version> --retry` under the rules.
    pub fn start_driver(&mut self, version: u32) {
        let n = self.drivers.len();
        let out = std::fs::File::create(self.dir.path().join(format!("driver{n}.log"))).expect("driver log");
        let child = spawn_tied(
            self.jioctl(&[
                "upgrade",
                &format!("v{version}"),
                "--instructions",
                RULES,
                "--retry",
            ])
            .stdout(out.try_clone().expect("log"))
            .stderr(out),
        )
        .expect("start jioctl");
        self.note(format!("driver {n} (pid {}) upgrades to v{version}", child.id()));
        self.drivers.push(child);
    }

    /// The newest driver that still runs.
    fn live_driver(&mut self) -> Option<usize> {
        (0..self.drivers.len())
            .rev()
            .find(|i| matches!(self.drivers[*i].try_wait(), Ok(None)))
    }

    fn signal_driver(&mut self, i: usize, sig: Signal) {
        let _ = kill(Pid::from_raw(self.drivers[i].id() as i32), sig);
    }

    /// Applies one fault (including its own undoing, where it has one).
    pub async fn inject(&mut self, fault: Fault, rng: &mut Rng, target: &mut u32) {
        match fault {
            Fault::LeaderKill => {
                let i = self.etcd.leader().await.unwrap_or(0);
                self.note(format!("kill -9 etcd member {i} (the leader)"));
                self.etcd.kill(i);
                tokio::time::sleep(Duration::from_secs(3)).await;
                self.etcd.restart(i).await;
                self.note(format!("etcd member {i} is back"));
            }
            Fault::StoreFreeze => {
                self.note("SIGSTOP every etcd member for 4 s".into());
                let pids: Vec<u32> = (0..self.etcd.len()).filter_map(|i| self.etcd.pid(i)).collect();
                for p in &pids {
                    let _ = kill(Pid::from_raw(*p as i32), Signal::SIGSTOP);
                }
                tokio::time::sleep(Duration::from_secs(4)).await;
                for p in &pids {
                    let _ = kill(Pid::from_raw(*p as i32), Signal::SIGCONT);
                }
                self.note("etcd thawed".into());
            }
            Fault::AgentKill => {
                let i = rng.below(self.nodes.len());
                self.note(format!("kill -9 the agent of {}, then start it again", HOSTS[i]));
                if let Some(mut c) = self.nodes[i].daemon.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                self.start_agent(i);
            }
            Fault::AgentStop => {
                let i = rng.below(self.nodes.len());
                self.note(format!("SIGSTOP the agent of {} for 5 s", HOSTS[i]));
                let pid = self.nodes[i].daemon.as_ref().map(|c| c.id());
                if let Some(p) = pid {
                    let _ = kill(Pid::from_raw(p as i32), Signal::SIGSTOP);
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    let _ = kill(Pid::from_raw(p as i32), Signal::SIGCONT);
                }
            }
            Fault::DriverKill => {
                if let Some(i) = self.live_driver() {
                    self.note(format!("kill -9 driver {i}"));
                    self.signal_driver(i, Signal::SIGKILL);
                    let _ = self.drivers[i].wait();
                }
                self.start_driver(*target);
            }
            Fault::DriverStop => {
                let Some(i) = self.live_driver() else {
                    self.start_driver(*target);
                    return;
                };
                self.note(format!(
                    "SIGSTOP driver {i} past its lock's lease (17 s); another operator starts"
                ));
                self.signal_driver(i, Signal::SIGSTOP);
                tokio::time::sleep(Duration::from_secs(1)).await;
                self.start_driver(*target);
                tokio::time::sleep(Duration::from_secs(16)).await;
                self.signal_driver(i, Signal::SIGCONT);
                self.note(format!("driver {i} resumed"));
            }
            Fault::Retarget => {
                if let Some(i) = self.live_driver() {
                    self.signal_driver(i, Signal::SIGTERM);
                    let _ = self.drivers[i].wait();
                }
                *target += 1;
                self.note(format!("re-target to v{target}"));
                self.start_driver(*target);
            }
            Fault::EmergencyStop => {
                let out = self.jioctl(&["global-disable-puppet"]).output().expect("jioctl");
                self.note(format!(
                    "emergency stop: {}",
                    String::from_utf8_lossy(&out.stdout).trim().replace('\n', " / ")
                ));
                tokio::time::sleep(Duration::from_secs(2)).await;
                self.start_driver(*target);
            }
            Fault::TwoOperators => {
                self.note("a second operator starts the same upgrade".into());
                self.start_driver(*target);
            }
            Fault::BadVersion => {
                self.note("/current_version = v\\xff9 (not UTF-8) for 3 s".into());
                self.put_bytes("/current_version", b"v\xff9");
                tokio::time::sleep(Duration::from_secs(3)).await;
                self.put_bytes("/current_version", format!("v{target}").as_bytes());
            }
            Fault::BadEnable => {
                self.note("enable_puppet/global = yes for 3 s".into());
                self.put_bytes("/config_state/enable_puppet/global", b"yes");
                tokio::time::sleep(Duration::from_secs(3)).await;
                self.put_bytes("/config_state/enable_puppet/global", b"false");
            }
            Fault::BadHostRecord => {
                let h = HOSTS[rng.below(HOSTS.len())];
                let key = format!("/hosts/{h}");
                let before = self.etcdctl(&["get", "--print-value-only", &key]);
                self.note(format!("{key} = not JSON for 3 s"));
                self.put_bytes(&key, b"{not json");
                tokio::time::sleep(Duration::from_secs(3)).await;
                self.put_bytes(&key, before.trim_end().as_bytes());
            }
            Fault::ForgetInFlight => {
                // Every agent paused first, so that no run can end (and its marker
                // go) between reading the markers and the command: forgetting an
                // idle host is a legitimate decommission, not this fault.
                let pids: Vec<Pid> = self
                    .nodes
                    .iter()
                    .filter_map(|n| n.daemon.as_ref().map(|c| Pid::from_raw(c.id() as i32)))
                    .collect();
                for p in &pids {
                    let _ = kill(*p, Signal::SIGSTOP);
                }
                let running = self.etcdctl(&["get", "--prefix", "--keys-only", "/runs/"]);
                let host = running
                    .lines()
                    .find_map(|k| k.strip_prefix("/runs/"))
                    .map(str::to_string);
                let out = host.as_ref().map(|h| {
                    self.jioctl(&["forget-host", h, "--force"])
                        .output()
                        .expect("jioctl")
                });
                for p in &pids {
                    let _ = kill(*p, Signal::SIGCONT);
                }
                match (host, out) {
                    (Some(h), Some(out)) => self.note(format!(
                        "forget-host {h} --force: exit {:?}: {}",
                        out.status.code(),
                        String::from_utf8_lossy(&out.stderr)
                            .lines()
                            .next()
                            .unwrap_or_default()
                    )),
                    _ => self.note("forget-host of a host in flight: none is in flight now".into()),
                }
            }
            Fault::SkewedClock => {
                let i = rng.below(self.nodes.len());
                let skew = if rng.below(2) == 0 { "-90s" } else { "+90s" };
                self.note(format!(
                    "restart the agent of {} with its clock at {skew}",
                    HOSTS[i]
                ));
                if let Some(mut c) = self.nodes[i].daemon.take() {
                    let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
                    let _ = c.wait();
                }
                self.start_agent_env(
                    i,
                    &[
                        ("LD_PRELOAD", FAKETIME_LIB),
                        ("FAKETIME", skew),
                        ("DONT_FAKE_MONOTONIC", "1"),
                    ],
                );
            }
            Fault::BadCurrentRollout => {
                let before = self.etcdctl(&["get", "--print-value-only", "/rollouts/current"]);
                self.note("/rollouts/current = x\\xff (not text) for 3 s".into());
                self.put_bytes("/rollouts/current", b"x\xff");
                tokio::time::sleep(Duration::from_secs(3)).await;
                if before.trim().is_empty() {
                    self.etcdctl(&["del", "/rollouts/current"]);
                } else {
                    self.put_bytes("/rollouts/current", before.trim_end().as_bytes());
                }
            }
        }
    }

    /// Ends every fault: every agent running, every driver stopped.
    pub fn heal(&mut self) {
        for i in 0..self.nodes.len() {
            if let Some(c) = &self.nodes[i].daemon {
                let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGCONT);
            }
            let dead = match self.nodes[i].daemon.as_mut() {
                Some(c) => !matches!(c.try_wait(), Ok(None)),
                None => true,
            };
            if dead {
                let name = self.nodes[i].host.name.clone();
                self.note(format!("the agent of {name} had exited; starting it"));
                self.start_agent(i);
            }
        }
        for i in 0..self.drivers.len() {
            let _ = kill(Pid::from_raw(self.drivers[i].id() as i32), Signal::SIGCONT);
            let _ = self.drivers[i].kill();
            let _ = self.drivers[i].wait();
        }
        self.note("healed: every fault ended, every driver stopped".into());
    }

    /// Drives to `v<version>` without faults; the exit code and the output.
    pub async fn finish(&mut self, version: u32) -> (Option<i32>, String) {
        self.note(format!("final driver: upgrade to v{version}"));
        let mut cmd = tokio::process::Command::from(self.jioctl(&[
            "upgrade",
            &format!("v{version}"),
            "--instructions",
            RULES,
            "--retry",
            "--timeout",
            "240s",
        ]));
        cmd.kill_on_drop(true);
        let out = tokio::time::timeout(Duration::from_secs(300), cmd.output())
            .await
            .expect("the final driver did not exit within 300 s")
            .expect("run jioctl");
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    /// Waits until every host's own version file says `v`.
    pub async fn wait_all_at(&self, v: &str, limit: Duration) {
        let start = Instant::now();
        while !self.local_versions().values().all(|x| x.as_deref() == Some(v)) {
            assert!(
                start.elapsed() < limit,
                "timed out after {limit:?} waiting for every host's version file to say {v}: {:?}",
                self.local_versions()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Each host's local version file.
    pub fn local_versions(&self) -> BTreeMap<String, Option<String>> {
        self.nodes
            .iter()
            .map(|n| (n.host.name.clone(), n.host.local_version()))
            .collect()
    }

    /// `jioctl verify-hosts` for every host.
    pub fn verify_hosts(&self, v: &str) -> bool {
        let mut args = vec!["verify-hosts", v];
        args.extend(HOSTS);
        self.jioctl(&args)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    /// Hosts that have other than exactly one lifecycle entry and one running
    /// version entry for `v`, read with `etcdctl`.
    pub fn double_states(&self, v: &str) -> Vec<String> {
        let status = self.etcdctl(&["get", "--prefix", "--keys-only", "/status/"]);
        let running = self.etcdctl(&["get", "--prefix", "--keys-only", "/running/versions/"]);
        let mut out = Vec::new();
        for h in HOSTS {
            let lifecycle = status
                .lines()
                .filter(|k| {
                    let p: Vec<&str> = k.split('/').collect();
                    p.len() == 6 && p[4] == v && p[5] == h && p[2] != "provisioned"
                })
                .count();
            let at: Vec<&str> = running
                .lines()
                .filter(|k| k.split('/').nth(4) == Some(h))
                .collect();
            if lifecycle != 1 || at.len() != 1 {
                out.push(format!(
                    "{h}: {lifecycle} lifecycle entries for {v}, running entries {at:?}"
                ));
            }
        }
        out
    }

    /// The logs worth reading when the check fails.
    pub fn diagnostics(&self) -> String {
        let mut s = format!("work directory: {}\n", self.dir.path().display());
        for (i, _) in self.drivers.iter().enumerate() {
            let t =
                std::fs::read_to_string(self.dir.path().join(format!("driver{i}.log"))).unwrap_or_default();
            let tail: Vec<&str> = t.lines().rev().take(8).collect();
            s.push_str(&format!(
                "--- driver {i}, last lines:\n{}\n",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
        s
    }
}

impl Drop for FaultFleet {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(c) = n.daemon.as_mut() {
                let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGCONT);
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        for c in &mut self.drivers {
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGCONT);
            let _ = c.kill();
            let _ = c.wait();
        }
        for i in 0..self.etcd.len() {
            if let Some(p) = self.etcd.pid(i) {
                let _ = kill(Pid::from_raw(p as i32), Signal::SIGCONT);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_finds_what_it_must() {
        let log = "\
start controller1 v2 10.0
end controller1 v2 12.0
start compute1 v2 11.0
end compute1 v2 13.0
start compute2 v2 12.5
start compute3 v2 12.6
start compute1 v3 14.0
end compute1 v3 15.0
";
        let runs = parse_runs(log);
        // compute1's first run closed by its end line, compute2's by nothing.
        assert_eq!(runs[1].end, Some(13.0));
        assert_eq!(runs[3].end, None);
        let v = invariants().violations(&runs, 0.0);
        // Three computes at once, and computes before controller2 had finished v2.
        assert!(
            v.iter().any(|x| x.contains("3 hosts of compute ran at once")),
            "{v:#?}"
        );
        assert!(
            v.iter()
                .any(|x| x.contains("compute1 started v2 before controller2")),
            "{v:#?}"
        );
        // A run killed without an end line ends where its host starts again.
        let runs = parse_runs("start compute1 v2 1.0\nstart compute1 v2 5.0\nend compute1 v2 6.0\n");
        assert_eq!(runs[0].end, Some(5.0));
        assert_eq!(runs[1].end, Some(6.0));
    }

    #[test]
    fn schedules_replay_from_their_seed() {
        assert_eq!(schedule(7, 5), schedule(7, 5));
        assert_ne!(schedule(7, 5), schedule(8, 5));
        assert!(
            schedule(3, 40)
                .iter()
                .filter(|(_, f)| *f == Fault::DriverStop)
                .count()
                <= 1
        );
    }
}
