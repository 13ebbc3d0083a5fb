//! The benchmarks: reaction time, scheduling latency, rollout makespan, status at
//! scale and agent footprint, on a real etcd or the embedded store.
//!
//! They run the real code: agents are `jio_agent::agent::Agent`s (the reconcile
//! loop, watches, reports and liveness of `jio-agent run`) embedded many to a
//! process with a simulated configuration step; rollouts are driven by
//! `jioctl::upgrade::run` (its planner and fenced apply); status is
//! `Snapshot::read` plus the JSON of `jioctl status --json`; the footprint is the
//! release `jio-agent` binary itself.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use jio_agent::config::Overrides;
use jio_agent::steps::ScriptedSteps;
use jio_common::fleet::{self, Snapshot};
use jio_common::keys::{EnableLevel, Key, Parsed, Schema};
use jio_common::names::{HostName, Role, Version};
use jio_common::rules::Rules;
use jio_common::store::{CountingStore, DynStore, Op, SqliteStore, StoreUrl, Txn, WatchEvent};
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use jio_tests::Etcd;

pub mod probe;

/// Which store to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Etcd,
    /// etcd with TLS, client-certificate verification and authentication (as the
    /// `jio-operator` user, whose tokens last etcd's default 5 minutes).
    EtcdTls,
    Sqlite,
}

/// How big each benchmark is.
#[derive(Debug, Clone, Serialize)]
pub struct Sizes {
    pub reaction_trials: usize,
    pub scheduling_hosts: usize,
    pub scheduling_step: Duration,
    /// Hosts per role of the makespan fleet (10 roles).
    pub makespan_hosts_per_role: usize,
    pub makespan_step: Duration,
    pub status_hosts: usize,
    pub idle: Duration,
    /// Members of the etcd cluster (`--members`).
    pub members: usize,
}

impl Sizes {
    /// The figures the issue asks for.
    pub fn full() -> Sizes {
        Sizes {
            reaction_trials: 200,
            scheduling_hosts: 60,
            scheduling_step: Duration::from_millis(20),
            makespan_hosts_per_role: 100,
            makespan_step: Duration::from_millis(200),
            status_hosts: 10_000,
            idle: Duration::from_secs(60),
            members: 1,
        }
    }

    /// A tiny run that only checks the harness works (the test suite).
    pub fn quick() -> Sizes {
        Sizes {
            reaction_trials: 10,
            scheduling_hosts: 6,
            scheduling_step: Duration::from_millis(10),
            makespan_hosts_per_role: 2,
            makespan_step: Duration::from_millis(20),
            status_hosts: 200,
            idle: Duration::from_secs(2),
            members: 1,
        }
    }
}

/// Latency figures in milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    pub samples: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    fn of(mut v: Vec<Duration>) -> Latency {
        v.sort();
        let pick = |q: f64| {
            if v.is_empty() {
                return 0.0;
            }
            let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
            v[i].as_secs_f64() * 1000.0
        };
        Latency {
            samples: v.len(),
            p50_ms: pick(0.50),
            p99_ms: pick(0.99),
            max_ms: v.last().map(|d| d.as_secs_f64() * 1000.0).unwrap_or(0.0),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Makespan {
    pub hosts: usize,
    pub roles: usize,
    pub step_ms: u64,
    pub ideal_s: f64,
    pub measured_s: f64,
    pub ratio: f64,
    pub upgraded: usize,
    pub store_requests: u64,
    pub requests_per_host: f64,
    /// Requests per host by operation (`CountingStore`'s names), those made.
    pub per_host_by_op: BTreeMap<String, f64>,
    /// Where the time went: from the driver's start to the first configuration step.
    pub first_start_s: f64,
    /// The role with a limit of 1 (the longest chain): the mean time between one
    /// host's step starting and the next one's, less the step itself.
    pub serial_gap_ms: f64,
    /// From the last step's start to the driver's return (the step included).
    pub tail_s: f64,
    /// The serial gap cut into its parts, means over the limit-1 role's hosts (as
    /// a watch saw each key): one host's result to the next host's enable key (the
    /// driver), that key to the next run marker (the agent deciding and starting),
    /// the marker to the step, and the step's start to the host's result, less the
    /// step itself (the agent reporting).
    pub serial_parts_ms: SerialParts,
    /// From the agents' start until every liveness record was written.
    pub registered_s: f64,
    /// The agents' requests from their start until then (registering, their first
    /// read, the check of where their host is listed), per host; not in
    /// `requests_per_host`. The Hiera data each then reads once is in neither.
    pub startup_requests_per_host: f64,
    /// etcd before the agents started, its peaks while they registered, and what
    /// the rollout cost it (empty on the embedded store).
    pub etcd_before: Vec<probe::Member>,
    pub etcd_registration: Vec<probe::Member>,
    pub etcd_rollout: Vec<probe::Member>,
    /// etcd's gRPC proxy, when the agents went through one (`--proxy`): its peak
    /// resident memory and its CPU time over the whole run.
    pub proxy_peak_rss_mb: Option<f64>,
    pub proxy_cpu_s: Option<f64>,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct SerialParts {
    pub driver_ms: f64,
    pub agent_start_ms: f64,
    pub to_step_ms: f64,
    pub reporting_ms: f64,
}

impl SerialParts {
    /// From the watch's events and the step starts: the parts of each gap between
    /// consecutive hosts of the limit-1 role `prefix`, averaged.
    fn of(
        events: &[(Instant, Parsed)],
        starts: &[(HostName, Instant)],
        v: &Version,
        prefix: &str,
        step: Duration,
    ) -> Self {
        let first = |want: &dyn Fn(&Parsed) -> Option<HostName>| -> BTreeMap<HostName, Instant> {
            let mut m = BTreeMap::new();
            for (at, p) in events {
                if let Some(h) = want(p).filter(|h| h.as_str().starts_with(prefix)) {
                    m.entry(h).or_insert(*at);
                }
            }
            m
        };
        let enabled = first(&|p| match p {
            Parsed::Enable(EnableLevel::Host(h)) => Some(h.clone()),
            _ => None,
        });
        let marked = first(&|p| match p {
            Parsed::Run(h) => Some(h.clone()),
            _ => None,
        });
        let done = first(&|p| match p {
            Parsed::RunningVersion(w, h) if w == v => Some(h.clone()),
            _ => None,
        });
        let serial: Vec<&(HostName, Instant)> = starts
            .iter()
            .filter(|(h, _)| h.as_str().starts_with(prefix))
            .collect();
        let ms = |a: Option<&Instant>, b: Option<&Instant>| match (a, b) {
            (Some(a), Some(b)) if b >= a => Some((*b - *a).as_secs_f64() * 1000.0),
            _ => None,
        };
        let mean = |xs: Vec<f64>| {
            if xs.is_empty() {
                0.0
            } else {
                xs.iter().sum::<f64>() / xs.len() as f64
            }
        };
        let (mut d, mut a, mut t, mut r) = (vec![], vec![], vec![], vec![]);
        for w in serial.windows(2) {
            let ((prev, prev_start), (next, next_start)) = (w[0], w[1]);
            d.extend(ms(done.get(prev), enabled.get(next)));
            a.extend(ms(enabled.get(next), marked.get(next)));
            t.extend(ms(marked.get(next), Some(next_start)));
            r.extend(ms(Some(prev_start), done.get(prev)).map(|x| x - step.as_secs_f64() * 1000.0));
        }
        SerialParts {
            driver_ms: mean(d),
            agent_start_ms: mean(a),
            to_step_ms: mean(t),
            reporting_ms: mean(r),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Status {
    pub hosts: usize,
    pub wall_ms: f64,
    /// Where the time went: reading the snapshot, classifying, planning (why
    /// each host waits), writing the JSON document.
    pub read_ms: f64,
    pub classify_ms: f64,
    pub admission_ms: f64,
    pub json_ms: f64,
    pub store_requests: u64,
    pub json_bytes: usize,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Footprint {
    pub idle_s: f64,
    pub rss_mb: f64,
    /// Of which the heap, stacks and other private memory,
    pub rss_anon_mb: f64,
    /// and the program's own pages mapped from its file (shared with any other
    /// process running the same binary).
    pub rss_file_mb: f64,
    pub cpu_s: f64,
    pub store_requests: u64,
    pub lease_renewals: u64,
    pub agent_binary_mb: f64,
    pub jioctl_binary_mb: f64,
}

/// Every figure of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub backend: Backend,
    pub machine: String,
    pub sizes: Sizes,
    pub reaction: Latency,
    pub scheduling: Latency,
    pub makespan: Makespan,
    pub status: Status,
    pub footprint: Footprint,
}

/// A store for one benchmark, counting requests.
pub struct BenchStore {
    pub url: String,
    pub counting: CountingStore,
    pub store: DynStore,
    backend: Backend,
    /// Whether each embedded agent opens its own client (its own connections, as on
    /// a real site) instead of sharing this one (`JIO_BENCH_OWN_CONNECTIONS`).
    own_connections: bool,
    pub etcd: Option<Arc<Etcd>>,
    /// The embedded agents connect through etcd's gRPC proxy (`--proxy`).
    pub proxy: Option<jio_tests::etcd::GrpcProxy>,
    _dir: tempfile::TempDir,
}

impl BenchStore {
    pub async fn start(backend: Backend, members: usize) -> BenchStore {
        let dir = tempfile::Builder::new()
            .prefix("jio-bench-")
            .tempdir()
            .expect("temporary directory");
        let (url, inner, etcd): (String, DynStore, Option<Etcd>) = match backend {
            Backend::Etcd => {
                let etcd = Etcd::cluster_with(members.max(1), &RAFT_TIMING).await;
                favour(&etcd);
                let url = etcd.url();
                let store = jio_common::store::open(&StoreUrl::parse(&url).expect("url"))
                    .await
                    .expect("open etcd");
                (url, store, Some(etcd))
            }
            Backend::EtcdTls => {
                // JIO_BENCH_SECURE=tls or =auth: one of the two alone, to see what each costs.
                let part = std::env::var("JIO_BENCH_SECURE").unwrap_or_default();
                if !["", "tls", "auth"].contains(&part.as_str()) {
                    eprintln!(
                        "jio-bench: JIO_BENCH_SECURE must be tls or auth (or unset for both), not {part:?}"
                    );
                    std::process::exit(2);
                }
                let etcd = Etcd::secure_parts(part != "auth", part != "tls", 300, "").await;
                let url = etcd.url_as("jio-operator");
                let store = open_etcd(&url).await;
                (url, store, Some(etcd))
            }
            Backend::Sqlite => {
                let path = dir.path().join("store.db");
                let store = Arc::new(SqliteStore::open(&path).await.expect("open sqlite"));
                (format!("sqlite://{}", path.display()), store, None)
            }
        };
        let counting = CountingStore::new(inner);
        BenchStore {
            url,
            store: Arc::new(counting.clone()),
            counting,
            backend,
            own_connections: own_connections(),
            etcd: etcd.map(Arc::new),
            proxy: None,
            _dir: dir,
        }
    }
}

/// The benchmark's members: a heartbeat of 250 ms and elections after 2.5 s
/// (etcd's defaults are 100 ms and 1 s), as etcd's tuning guide advises for
/// members whose CPU is shared. On this machine the members share two cores with
/// thousands of simulated agents; with the defaults, a starved heartbeat started an
/// election every few seconds and nothing moved.
const RAFT_TIMING: [&str; 4] = ["--heartbeat-interval", "250", "--election-timeout", "2500"];

/// Gives etcd's threads priority over this process (`renice -n -5`), since on a
/// real site the agents run on other machines than etcd. Said when it cannot.
fn favour(etcd: &Etcd) {
    for i in 0..etcd.len() {
        let Some(pid) = etcd.pid(i) else { continue };
        let tids: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let done = std::process::Command::new("renice")
            .args(["-n", "-5", "-p"])
            .args(&tids)
            .stdout(std::process::Stdio::null())
            .status();
        if !done.is_ok_and(|s| s.success()) {
            eprintln!(
                "jio-bench: cannot raise etcd's priority (renice as root); it shares the CPU with the simulated agents"
            );
        }
    }
}

/// `JIO_BENCH_OWN_CONNECTIONS`: unset or 1 gives each agent its own client (its own
/// connections, as real nodes have); 0 shares one (as behind a proxy). Anything
/// else is refused rather than guessed.
fn own_connections() -> bool {
    match std::env::var("JIO_BENCH_OWN_CONNECTIONS").as_deref() {
        Err(_) | Ok("" | "1") => true,
        Ok("0") => false,
        Ok(other) => {
            eprintln!("jio-bench: JIO_BENCH_OWN_CONNECTIONS must be 0 or 1, not {other:?}");
            std::process::exit(2);
        }
    }
}

impl BenchStore {
    /// The store an embedded agent uses: this one, or its own client of it.
    pub async fn agent_client(&self) -> DynStore {
        if !self.own_connections {
            return self.store.clone();
        }
        let inner: DynStore = match (self.backend, &self.proxy) {
            (Backend::Sqlite, _) => return self.store.clone(),
            (_, Some(p)) => open_etcd(&p.url()).await,
            (Backend::Etcd | Backend::EtcdTls, None) => open_etcd(&self.url).await,
        };
        Arc::new(self.counting.sharing(inner))
    }
}

impl BenchStore {
    /// The embedded agents (each with its own client) go through etcd's gRPC proxy
    /// from now on; the driver and the operator stay on the members.
    pub async fn use_proxy(&mut self) {
        let Some(etcd) = self.etcd.as_ref().filter(|_| self.backend == Backend::Etcd) else {
            eprintln!("jio-bench: --proxy needs --store etcd");
            std::process::exit(2);
        };
        if !self.own_connections {
            eprintln!(
                "jio-bench: --proxy needs agents with their own connections (JIO_BENCH_OWN_CONNECTIONS unset)"
            );
            std::process::exit(2);
        }
        self.proxy = Some(etcd.grpc_proxy().await);
    }
}

/// A client of the etcd at `url`.
async fn open_etcd(url: &str) -> DynStore {
    let url = StoreUrl::parse(url).expect("url");
    jio_common::store::open(&url).await.expect("open etcd")
}

/// Agents embedded in this process.
pub struct SimFleet {
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// (host, version, when its configuration step started)
    pub starts: mpsc::UnboundedReceiver<(HostName, Version, Instant)>,
    /// Each agent's state directory, Hiera data file, and where its data comes
    /// from (`hiera::source`, as the agent names it).
    hiera: Vec<(PathBuf, PathBuf, String)>,
    dir: tempfile::TempDir,
}

impl SimFleet {
    /// Starts one agent per `(host, role)`, all at `local` version, on `store`.
    pub async fn start(bs: &BenchStore, hosts: &[(String, String)], step: Duration, local: &str) -> SimFleet {
        let dir = tempfile::Builder::new()
            .prefix("jio-bench-hosts-")
            .tempdir_in(if Path::new("/dev/shm").is_dir() {
                "/dev/shm"
            } else {
                "/tmp"
            })
            .expect("temporary directory");
        let empty = dir.path().join("empty.toml");
        std::fs::write(&empty, "").expect("write empty config");
        let (tx, starts) = mpsc::unbounded_channel();
        let (stop, stop_rx) = watch::channel(false);
        let schema = Schema::default();
        let mut tasks = Vec::new();
        let mut ops = Vec::new();
        let mut configs = Vec::new();
        let mut hiera = Vec::new();
        for (name, role) in hosts {
            let d = dir.path().join(name);
            std::fs::create_dir_all(&d).expect("host dir");
            std::fs::write(d.join("version"), format!("{local}\n")).expect("version file");
            std::fs::create_dir_all(d.join("state")).expect("state dir");
            let mut ov = Overrides {
                config_path: Some(empty.clone()),
                ..Overrides::default()
            };
            for (k, v) in [
                ("store", bs.url.clone()),
                ("hostname", name.clone()),
                ("role", role.clone()),
                ("state_dir", d.join("state").display().to_string()),
                ("version_file", d.join("version").display().to_string()),
                ("facts_file", d.join("facts").display().to_string()),
                ("hiera_file", d.join("hiera.yaml").display().to_string()),
                ("health_interval", "0".into()),
                ("resync_interval", "10m".into()),
                // Simulated hosts never reboot the machine they run on.
                ("reboot", "never".into()),
                // Nor record the machine's own packages as theirs.
                ("dpkg_status_file", String::new()),
            ] {
                ov.flags.insert(
                    jio_agent::config::SCALAR_KEYS
                        .iter()
                        .find(|x| **x == k)
                        .copied()
                        .expect("key"),
                    v,
                );
            }
            let cfg = jio_agent::config::load(&ov, || None).expect("agent config");
            let file = cfg.hiera_file.clone().expect("hiera file");
            let source = jio_agent::hiera::source(&cfg.store.to_string(), &cfg.schema, Some(&file));
            hiera.push((cfg.state_dir.clone(), file, source));
            let tx = tx.clone();
            let steps = ScriptedSteps::new()
                .taking(step, Duration::ZERO)
                .on_step(Arc::new(move |s, h, v| {
                    if s == jio_common::keys::Step::Configured {
                        let _ = tx.send((h.clone(), v.clone(), Instant::now()));
                    }
                }));
            let h = HostName::new(name.clone()).expect("host");
            ops.push(Op::put(
                schema.host(&h),
                format!(r#"{{"role":"{role}","agent_version":"bench","addresses":[],"first_seen":1}}"#),
            ));
            ops.push(Op::put(
                schema.running_version_host(&Version::new(local).expect("v"), &h),
                "1",
            ));
            configs.push((h, Role::new(role.clone()).expect("role"), cfg, steps));
        }
        // Register every host first (as first boots do), then start the agents.
        // Each knows where its host is listed, as an agent that has run before.
        let local_v = Version::new(local).expect("v");
        for (chunk, names) in ops.chunks(50).zip(hosts.chunks(25)) {
            let outcome = bs
                .store
                .txn(Txn {
                    compares: vec![],
                    ops: chunk.to_vec(),
                })
                .await
                .expect("register hosts");
            let jio_common::store::TxnOutcome::Committed(rev) = outcome else {
                panic!("registering hosts lost a transaction without compares");
            };
            for (name, _) in names {
                jio_agent::state::save_listed(
                    &dir.path().join(name).join("state"),
                    &[(local_v.clone(), rev)],
                )
                .expect("listed versions");
            }
        }
        // Each starts as `jio-agent run` does: its addresses published, then the
        // daemon. Their clients open a hundred at a time.
        let mut clients = Vec::new();
        for chunk in configs.chunks(100) {
            clients.extend(futures_util::future::join_all(chunk.iter().map(|_| bs.agent_client())).await);
        }
        for (i, ((host, role, cfg, steps), store)) in configs.into_iter().zip(clients).enumerate() {
            let agent = jio_agent::agent::Agent::new(cfg.clone(), store.clone(), stop_rx.clone())
                .expect("agent")
                .with_steps(Arc::new(steps));
            let addrs = vec![jio_common::values::InterfaceAddress {
                interface: "eth0".into(),
                address: format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255),
            }];
            let publish = jio_agent::report::keep_publishing(
                store.clone(),
                cfg.schema.clone(),
                (host, role),
                addrs,
                stop_rx.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let publishing = tokio::spawn(publish);
                if let Err(e) = jio_agent::daemon::serve(agent).await {
                    eprintln!("embedded agent failed: {e}");
                }
                let _ = publishing.await;
            }));
        }
        SimFleet {
            stop,
            tasks,
            starts,
            hiera,
            dir,
        }
    }

    /// Each agent's Hiera data read once, fifty at a time, as each host's last run
    /// before the rollout would have read it (kept in its state directory): a
    /// fleet that has run before starts a rollout with current Hiera data.
    pub async fn read_hiera_once(&self, bs: &BenchStore) {
        let schema = Schema::default();
        for chunk in self.hiera.chunks(50) {
            futures_util::future::join_all(chunk.iter().map(|(state, file, source)| {
                let (store, schema) = (bs.store.clone(), schema.clone());
                async move {
                    let memo = jio_agent::hiera::Memo::kept_in(state, source);
                    jio_agent::hiera::refresh(&store, &schema, file, &memo)
                        .await
                        .expect("read the hiera data");
                }
            }))
            .await;
        }
    }

    /// Waits until `n` agents have their liveness record (saying how many every 5 s),
    /// then a little more; how long it took. After 300 s it gives up, naming how many
    /// are missing.
    pub async fn settle(&self, bs: &BenchStore, n: usize) -> Result<Duration, String> {
        let agents = Schema::default().agents();
        let start = Instant::now();
        let mut said = Instant::now();
        loop {
            let have = bs.store.list(&agents).await.map(|l| l.kvs.len());
            if have.as_ref().is_ok_and(|h| *h >= n) {
                break;
            }
            if start.elapsed() > Duration::from_secs(300) {
                return Err(match have {
                    Ok(h) => format!("{} of {n} agents had not registered after 300 s", n - h),
                    Err(e) => format!("the agents could not be counted after 300 s: {e}"),
                });
            }
            if said.elapsed() > Duration::from_secs(5) {
                let at = start.elapsed().as_secs_f64();
                match have {
                    Ok(h) => eprintln!("{h} of {n} agents registered after {at:.0} s"),
                    Err(e) => eprintln!("after {at:.0} s the agents could not be counted: {e}"),
                }
                said = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let took = start.elapsed();
        eprintln!(
            "{n} agents registered (their liveness records written) in {:.1} s",
            took.as_secs_f64()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok(took)
    }

    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        drop(self.dir);
    }
}

fn put_op(k: Key, v: &str) -> Op {
    Op::put(k, v.to_string())
}

async fn wait_running(store: &DynStore, schema: &Schema, v: &Version, h: &HostName) {
    let key = schema.running_version_host(v, h);
    let start = Instant::now();
    while store.get(&key).await.ok().flatten().is_none() {
        assert!(start.elapsed() < Duration::from_secs(60), "{h} never reached {v}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Figure 1: from the write that allows a host to upgrade to its configuration step's start.
pub async fn reaction(bs: &BenchStore, trials: usize) -> Latency {
    let schema = Schema::default();
    let hosts = vec![("compute1".to_string(), "compute".to_string())];
    bs.store
        .put(&schema.current_version(), "r0", None)
        .await
        .expect("put");
    let mut fleet = SimFleet::start(bs, &hosts, Duration::ZERO, "r0").await;
    let h = HostName::new("compute1").expect("host");
    let host_key = schema.enable(&EnableLevel::Host(h.clone()));
    let global = schema.enable(&EnableLevel::Global);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut samples = Vec::new();
    for i in 1..=trials {
        let v = Version::new(format!("r{i}")).expect("v");
        // Even trials: the enable key allows it; odd ones: /current_version does.
        let by_key = i % 2 == 0;
        if by_key {
            let txn = Txn::new()
                .then(put_op(global.clone(), "false"))
                .then(put_op(schema.current_version(), v.as_str()));
            bs.store.txn(txn).await.expect("txn");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let t0 = Instant::now();
        if by_key {
            bs.store.put(&host_key, "true", None).await.expect("put");
        } else {
            bs.store
                .put(&schema.current_version(), v.as_str(), None)
                .await
                .expect("put");
        }
        let (_, got, at) = tokio::time::timeout(Duration::from_secs(30), fleet.starts.recv())
            .await
            .expect("the agent did not react in 30 s")
            .expect("channel");
        assert_eq!(got, v);
        samples.push(at.saturating_duration_since(t0));
        wait_running(&bs.store, &schema, &v, &h).await;
        if by_key {
            let txn = Txn::new()
                .then(Op::Delete(host_key.clone()))
                .then(Op::Delete(global.clone()));
            bs.store.txn(txn).await.expect("txn");
        }
    }
    fleet.stop().await;
    Latency::of(samples)
}

/// Records when each key changed, as seen by a watch.
async fn record_events(
    store: DynStore,
    schema: Schema,
) -> (
    watch::Sender<bool>,
    tokio::task::JoinHandle<Vec<(Instant, Parsed)>>,
) {
    let rev = store.ping().await.expect("ping");
    let mut w = store.watch(&schema.root(), rev + 1).await.expect("watch");
    let (stop, mut stop_rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        let mut out = Vec::new();
        loop {
            tokio::select! {
                ev = w.next() => match ev {
                    Some(Ok(WatchEvent::Put(kv))) => {
                        if let Some(p) = schema.parse(&kv.key) {
                            out.push((Instant::now(), p));
                        }
                    }
                    Some(Ok(_)) => {}
                    _ => return out,
                },
                _ = stop_rx.changed() => return out,
            }
        }
    });
    (stop, task)
}

fn upgrade_args(version: &str, rules: &str) -> jioctl::upgrade::Args {
    jioctl::upgrade::Args {
        version: Version::new(version).expect("v"),
        rules: Rules::parse(rules).expect("rules"),
        rules_json: serde_json::from_str(rules).expect("rules JSON"),
        mode: jioctl::upgrade::Mode::Follow,
        noop: false,
        verbose: false,
        json: false,
        quiet: true,
        timeout: None,
        stages: Vec::new(),
        force: false,
        hooks: Default::default(),
    }
}

/// Figure 2: from a host's `/running/versions` entry to the next enable key written
/// by `jioctl upgrade --retry` (one role, limit 1: strictly one after the other).
pub async fn scheduling(bs: &BenchStore, hosts: usize, step: Duration) -> Latency {
    let schema = Schema::default();
    bs.store
        .put(&schema.current_version(), "s1", None)
        .await
        .expect("put");
    let names: Vec<(String, String)> = (0..hosts)
        .map(|i| (format!("sched{i:04}"), "sched".to_string()))
        .collect();
    let fleet = SimFleet::start(bs, &names, step, "s1").await;
    fleet.settle(bs, names.len()).await.expect("registration");
    let (stop, rec) = record_events(bs.store.clone(), schema.clone()).await;
    let code = jioctl::upgrade::run(
        &bs.store,
        &schema,
        upgrade_args("s2", r#"{"rolling_rules": {"global": 1}}"#),
    )
    .await
    .expect("upgrade");
    assert_eq!(code, 0, "the scheduling rollout did not finish");
    let _ = stop.send(true);
    let events = rec.await.expect("recorder");
    fleet.stop().await;
    let s2 = Version::new("s2").expect("v");
    let mut samples = Vec::new();
    for (i, (t, p)) in events.iter().enumerate() {
        if matches!(p, Parsed::RunningVersion(v, _) if *v == s2)
            && let Some((t2, _)) = events[i + 1..].iter().find(|(_, q)| {
                matches!(
                    q,
                    Parsed::Enable(EnableLevel::Host(_)) | Parsed::Enable(EnableLevel::Role(_))
                )
            })
        {
            samples.push(t2.saturating_duration_since(*t));
        }
    }
    Latency::of(samples)
}

/// The makespan fleet: 10 roles, limits from 1 to 20, a role order chain of three
/// levels (r0 → r3 → r6, r1 → r4 → r7, r2 → r5 → r8), and r9 on its own.
pub fn makespan_rules() -> (&'static str, Vec<(&'static str, u64)>) {
    let rules = r#"{
        "rolling_rules": {"roles": {"r0": 20, "r1": 10, "r2": 5, "r3": 20, "r4": 4, "r5": 10, "r6": 2, "r7": 20, "r8": 10, "r9": 1}},
        "role_order": {"r3": "r0", "r6": "r3", "r4": "r1", "r7": "r4", "r5": "r2", "r8": "r5"}
    }"#;
    let limits = vec![
        ("r0", 20),
        ("r1", 10),
        ("r2", 5),
        ("r3", 20),
        ("r4", 4),
        ("r5", 10),
        ("r6", 2),
        ("r7", 20),
        ("r8", 10),
        ("r9", 1),
    ];
    (rules, limits)
}

/// The ideal rollout time: the longest chain of groups, each taking
/// ceil(hosts / limit) steps.
pub fn ideal_makespan(rules: &str, hosts_per_role: usize, step: Duration) -> Duration {
    let r = Rules::parse(rules).expect("rules");
    let roles: std::collections::BTreeSet<Role> = (0..10)
        .map(|i| Role::new(format!("r{i}")).expect("role"))
        .collect();
    let resolved = r.resolve(&roles).expect("resolve");
    fn finish(
        g: &str,
        resolved: &jio_common::rules::Resolved,
        per: usize,
        step: Duration,
        memo: &mut BTreeMap<String, Duration>,
    ) -> Duration {
        if let Some(d) = memo.get(g) {
            return *d;
        }
        let start = resolved
            .deps
            .get(g)
            .into_iter()
            .flatten()
            .map(|d| finish(d, resolved, per, step, memo))
            .max()
            .unwrap_or(Duration::ZERO);
        let waves = match resolved.limit_of(g, per) {
            Some(l) if l > 0 => per.div_ceil(l as usize),
            _ => 1,
        };
        let d = start + step * waves as u32;
        memo.insert(g.to_string(), d);
        d
    }
    let mut memo = BTreeMap::new();
    resolved
        .limits
        .keys()
        .map(|g| finish(g, &resolved, hosts_per_role, step, &mut memo))
        .max()
        .unwrap_or(Duration::ZERO)
}

/// Where the makespan's time went, from the steps' starts to `m2` after `t0` and
/// the watch's `events` (see `Makespan`).
struct Timing {
    first_start_s: f64,
    serial_gap_ms: f64,
    tail_s: f64,
    serial_parts_ms: SerialParts,
}

impl Timing {
    fn of(
        starts: &mut mpsc::UnboundedReceiver<(HostName, Version, Instant)>,
        events: &[(Instant, Parsed)],
        t0: Instant,
        measured: Duration,
        step: Duration,
    ) -> Timing {
        let mut mine: Vec<(HostName, Instant)> = Vec::new();
        while let Ok((h, v, at)) = starts.try_recv() {
            if v.as_str() == "m2" && at >= t0 {
                mine.push((h, at));
            }
        }
        mine.sort_by_key(|(_, at)| *at);
        let serial: Vec<Instant> = mine
            .iter()
            .filter(|(h, _)| h.as_str().starts_with("r9n"))
            .map(|(_, at)| *at)
            .collect();
        let serial_gap_ms = if serial.len() > 1 {
            let span = (*serial.last().unwrap_or(&t0) - serial[0]).as_secs_f64();
            (span / (serial.len() - 1) as f64 - step.as_secs_f64()) * 1000.0
        } else {
            0.0
        };
        Timing {
            first_start_s: mine.first().map_or(0.0, |(_, at)| (*at - t0).as_secs_f64()),
            serial_gap_ms,
            tail_s: mine
                .last()
                .map_or(0.0, |(_, at)| (t0 + measured - *at).as_secs_f64()),
            serial_parts_ms: SerialParts::of(events, &mine, &Version::new("m2").expect("v"), "r9n", step),
        }
    }
}

/// Figure 3: a whole rollout of 10 roles under the rules, against the ideal.
pub async fn makespan(bs: &BenchStore, per_role: usize, step: Duration) -> Makespan {
    let schema = Schema::default();
    let (rules, _) = makespan_rules();
    bs.store
        .put(&schema.current_version(), "m1", None)
        .await
        .expect("put");
    let names: Vec<(String, String)> = (0..10)
        .flat_map(|r| (0..per_role).map(move |i| (format!("r{r}n{i:04}"), format!("r{r}"))))
        .collect();
    let etcd_before = match &bs.etcd {
        Some(e) => probe::sample(e).await,
        None => Vec::new(),
    };
    let sampler = bs.etcd.clone().map(probe::Sampler::start);
    let startup_from = bs.counting.requests();
    let mut fleet = SimFleet::start(bs, &names, step, "m1").await;
    // A fleet is running long before a rollout: wait until every agent is up.
    let registered = fleet.settle(bs, names.len()).await;
    let etcd_registration = match sampler {
        Some(s) => s.stop().await,
        None => Vec::new(),
    };
    let startup_requests = bs.counting.requests() - startup_from;
    if registered.is_ok() {
        fleet.read_hiera_once(bs).await;
    }
    let registered_s = match registered {
        Ok(d) => d.as_secs_f64(),
        Err(e) => {
            for l in probe::lines(
                "etcd while the agents registered",
                &etcd_registration,
                &etcd_before,
                names.len(),
                Duration::from_secs(300),
            ) {
                eprintln!("{l}");
            }
            panic!("{e}");
        }
    };
    let etcd_at_start = match &bs.etcd {
        Some(e) => probe::sample(e).await,
        None => Vec::new(),
    };
    // The watch that times the serial role's keys has its own client, uncounted.
    let (stop_events, events) = record_events(
        jio_common::store::open(&StoreUrl::parse(&bs.url).expect("url"))
            .await
            .expect("open a client for the events"),
        schema.clone(),
    )
    .await;
    let before = bs.counting.requests();
    let before_ops = bs.counting.by_op();
    let t0 = Instant::now();
    let code = jioctl::upgrade::run(&bs.store, &schema, upgrade_args("m2", rules))
        .await
        .expect("upgrade");
    let measured = t0.elapsed();
    let _ = stop_events.send(true);
    let events = events.await.unwrap_or_default();
    let timing = Timing::of(&mut fleet.starts, &events, t0, measured, step);
    let requests = bs.counting.requests() - before;
    let per_host_by_op = bs
        .counting
        .by_op()
        .iter()
        .zip(before_ops)
        .zip(jio_common::store::counting::OPS)
        .filter(|((a, b), _)| **a > *b)
        .map(|((a, b), op)| (op.to_string(), (a - b) as f64 / names.len() as f64))
        .collect();
    assert_eq!(code, 0, "the makespan rollout did not finish");
    let etcd_rollout = match &bs.etcd {
        Some(e) => probe::since(&etcd_at_start, &probe::sample(e).await),
        None => Vec::new(),
    };
    let snap = Snapshot::read(&bs.store, &schema).await.expect("snapshot");
    let upgraded = fleet::classify(&snap)
        .iter()
        .filter(|h| h.state == fleet::HostState::Upgraded && h.host.as_str().starts_with('r'))
        .count();
    fleet.stop().await;
    let ideal = ideal_makespan(rules, per_role, step);
    Makespan {
        hosts: names.len(),
        roles: 10,
        step_ms: step.as_millis() as u64,
        ideal_s: ideal.as_secs_f64(),
        measured_s: measured.as_secs_f64(),
        ratio: measured.as_secs_f64() / ideal.as_secs_f64(),
        upgraded,
        store_requests: requests,
        requests_per_host: requests as f64 / names.len() as f64,
        per_host_by_op,
        first_start_s: timing.first_start_s,
        serial_gap_ms: timing.serial_gap_ms,
        tail_s: timing.tail_s,
        serial_parts_ms: timing.serial_parts_ms,
        registered_s,
        startup_requests_per_host: startup_requests as f64 / names.len() as f64,
        etcd_before,
        etcd_registration,
        etcd_rollout,
        proxy_peak_rss_mb: bs.proxy.as_ref().map(|p| proc_status_mb(p.pid(), "VmHWM:")),
        proxy_cpu_s: bs.proxy.as_ref().map(|p| proc_cpu_s(p.pid())),
    }
}

/// Figure 4: `jioctl status --json` for a generated fleet: read, classify, render.
pub async fn status(bs: &BenchStore, hosts: usize) -> Status {
    jio_tests::fleetgen::generate(&bs.store, hosts)
        .await
        .expect("generate");
    let schema = Schema::default();
    let before = bs.counting.requests();
    let t0 = Instant::now();
    let snap = Snapshot::read(&bs.store, &schema).await.expect("snapshot");
    let t1 = Instant::now();
    let classified = fleet::classify(&snap);
    let t2 = Instant::now();
    let adm = jioctl::status::admission_of(&snap, &classified, jio_common::time::unix_now());
    let t3 = Instant::now();
    let json = jioctl::status_json::StatusJson::document(&snap, &classified, &adm).render(true);
    let wall = t0.elapsed();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    Status {
        hosts: snap.hosts().len(),
        wall_ms: ms(wall),
        read_ms: ms(t1 - t0),
        classify_ms: ms(t2 - t1),
        admission_ms: ms(t3 - t2),
        json_ms: ms(t3.elapsed()),
        store_requests: bs.counting.requests() - before,
        json_bytes: json.len(),
    }
}

/// The directory holding this program, to find the binaries built beside it.
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.parent().expect("target dir").to_path_buf()
    } else {
        dir
    }
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn proc_cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rfind(')').map(|i| &stat[i + 2..]).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|x| x.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|x| x.parse().ok()).unwrap_or(0);
    ticks as f64 / 100.0
}

fn proc_rss_mb(pid: u32) -> f64 {
    proc_status_mb(pid, "VmRSS:")
}

/// A memory figure of `/proc/<pid>/status` (`VmRSS:`, `RssAnon:`, `RssFile:`), in MB.
fn proc_status_mb(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kb| kb as f64 / 1024.0)
        .unwrap_or(0.0)
}

/// Figure 5: the real `jio-agent run`, idle: memory, CPU and store requests.
pub async fn footprint(bs: &BenchStore, idle: Duration) -> Footprint {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let dir = bin_dir();
    // A release benchmark measures the agent as it is packaged: built for size
    // (Cargo.toml, [profile.agent]).
    let agent = if dir.ends_with("release") {
        dir.with_file_name("agent").join("jio-agent")
    } else {
        dir.join("jio-agent")
    };
    assert!(
        agent.exists(),
        "{} is missing: build it first (cargo build --profile agent -p jio-agent for a release benchmark, cargo build --bins otherwise; scripts/bench.sh does it)",
        agent.display()
    );
    let work = tempfile::tempdir().expect("temporary directory");
    let schema = Schema::default();
    bs.store
        .put(&schema.current_version(), "f1", None)
        .await
        .expect("put");
    std::fs::write(work.path().join("version"), "f1\n").expect("version");
    let config = format!(
        "store = \"{}\"\nhostname = \"idle1\"\nstate_dir = \"{}\"\nversion_file = \"{}\"\nfacts_file = \"{}\"\nhiera_file = \"{}\"\nreboot = \"never\"\ndpkg_status_file = \"\"\n",
        bs.url,
        work.path().join("state").display(),
        work.path().join("version").display(),
        work.path().join("facts").display(),
        work.path().join("hieradata/jiocloud.yaml").display()
    );
    std::fs::write(work.path().join("agent.toml"), config).expect("config");
    let mut child = tokio::process::Command::new(&agent)
        .arg("--config")
        .arg(work.path().join("agent.toml"))
        .arg("run")
        .env("JIO_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start jio-agent");
    let pid = child.id().expect("pid");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        while let Ok(Some(l)) = lines.next_line().await {
            let _ = tx.send(l);
        }
    });
    wait_line(&mut rx, "up to date")
        .await
        .expect("the agent did not settle");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let counts = |l: &str| {
        let num = |k: &str| {
            l.split(k)
                .nth(1)
                .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).find(|s| !s.is_empty()))
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0)
        };
        (num("store_requests="), num("lease_renewals="))
    };
    let usr1 = || {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGUSR1,
        )
    };
    usr1().expect("SIGUSR1");
    let a = counts(
        &wait_line(&mut rx, "store requests since start")
            .await
            .expect("counts"),
    );
    let cpu0 = proc_cpu_s(pid);
    let t0 = Instant::now();
    tokio::time::sleep(idle).await;
    usr1().expect("SIGUSR1");
    let b = counts(
        &wait_line(&mut rx, "store requests since start")
            .await
            .expect("counts"),
    );
    let cpu = proc_cpu_s(pid) - cpu0;
    let rss = proc_rss_mb(pid);
    let (rss_anon_mb, rss_file_mb) = (proc_status_mb(pid, "RssAnon:"), proc_status_mb(pid, "RssFile:"));
    let elapsed = t0.elapsed();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = tokio::time::timeout(Duration::from_secs(40), child.wait()).await;
    let size = |path: PathBuf| std::fs::metadata(path).map(|m| mb(m.len())).unwrap_or(0.0);
    Footprint {
        idle_s: elapsed.as_secs_f64(),
        rss_mb: rss,
        rss_anon_mb,
        rss_file_mb,
        cpu_s: cpu,
        store_requests: b.0 - a.0,
        lease_renewals: b.1 - a.1,
        agent_binary_mb: size(agent),
        jioctl_binary_mb: size(dir.join("jioctl")),
    }
}

/// The next line holding `needle`, within 30 s.
async fn wait_line(
    rx: &mut mpsc::UnboundedReceiver<String>,
    needle: &str,
) -> Result<String, tokio::time::error::Elapsed> {
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(l) = rx.recv().await {
            if l.contains(needle) {
                return l;
            }
        }
        panic!("jio-agent ended before logging {needle:?}");
    })
    .await
}

/// Cores and memory of this machine.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let mem_gb = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0 / 1024.0)
        .unwrap_or(0.0);
    format!("{cores} cores, {mem_gb:.0} GiB")
}

/// Raises the open-file limit to its hard maximum (a thousand agents hold four
/// watch connections each).
pub fn raise_nofile() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

/// Runs all five on `backend`, each on a fresh store.
pub async fn run(backend: Backend, sizes: Sizes) -> Report {
    raise_nofile();
    let reaction = reaction(
        &BenchStore::start(backend, sizes.members).await,
        sizes.reaction_trials,
    )
    .await;
    let scheduling = scheduling(
        &BenchStore::start(backend, sizes.members).await,
        sizes.scheduling_hosts,
        sizes.scheduling_step,
    )
    .await;
    let makespan = makespan(
        &BenchStore::start(backend, sizes.members).await,
        sizes.makespan_hosts_per_role,
        sizes.makespan_step,
    )
    .await;
    let status = status(
        &BenchStore::start(backend, sizes.members).await,
        sizes.status_hosts,
    )
    .await;
    let footprint = footprint(&BenchStore::start(backend, sizes.members).await, sizes.idle).await;
    Report {
        backend,
        machine: machine(),
        sizes,
        reaction,
        scheduling,
        makespan,
        status,
        footprint,
    }
}

/// What the makespan's fleet cost etcd: registration, then the rollout.
pub fn scale_lines(m: &Makespan) -> Vec<String> {
    let mut out = vec![format!(
        "{} agents registered in {:.1}s, {:.1} store requests per host from their start",
        m.hosts, m.registered_s, m.startup_requests_per_host
    )];
    if m.etcd_before.is_empty() {
        return out;
    }
    out.extend(probe::lines(
        "etcd while the agents registered (peaks):",
        &m.etcd_registration,
        &m.etcd_before,
        m.hosts,
        Duration::from_secs_f64(m.registered_s),
    ));
    out.extend(probe::lines(
        "etcd during the rollout (counters over it):",
        &m.etcd_rollout,
        &m.etcd_before,
        m.hosts,
        Duration::from_secs_f64(m.measured_s),
    ));
    if let (Some(rss), Some(cpu)) = (m.proxy_peak_rss_mb, m.proxy_cpu_s) {
        out.push(format!(
            "etcd grpc-proxy (the agents' only server): peak rss {rss:.0} MB ({:.3} MB per agent), cpu {cpu:.1}s",
            rss / m.hosts.max(1) as f64
        ));
    }
    out
}

/// The makespan's figures, one line each: the ratio first, then where the time
/// and the requests went, then what it cost etcd.
pub fn makespan_lines(m: &Makespan) -> Vec<String> {
    let by_op: Vec<String> = m
        .per_host_by_op
        .iter()
        .map(|(op, n)| format!("{op} {n:.2}"))
        .collect();
    let p = &m.serial_parts_ms;
    let mut out = vec![
        format!(
            "{} hosts, {} roles, {}ms step: {:.3}x (measured {:.2}s, ideal {:.2}s), {}/{} upgraded",
            m.hosts, m.roles, m.step_ms, m.ratio, m.measured_s, m.ideal_s, m.upgraded, m.hosts
        ),
        format!(
            "{:.1} store requests per host ({} in all): {}",
            m.requests_per_host,
            m.store_requests,
            by_op.join(", ")
        ),
        format!(
            "where the time went: first step after {:.2}s, r9 (limit 1) {:.1}ms between steps, last step start to end {:.2}s",
            m.first_start_s, m.serial_gap_ms, m.tail_s
        ),
        format!(
            "r9's gap, part by part: driver {:.1}ms, agent starting {:.1}ms, to the step {:.1}ms, reporting {:.1}ms",
            p.driver_ms, p.agent_start_ms, p.to_step_ms, p.reporting_ms
        ),
    ];
    out.extend(scale_lines(m));
    out
}

/// The table printed by `jio-bench`.
pub fn table(r: &Report) -> String {
    let mut s = String::new();
    use std::fmt::Write as _;
    let _ = writeln!(s, "jio-bench on {:?} ({})", r.backend, r.machine);
    let _ = writeln!(
        s,
        "{:<44} {:>12} {:>12} {:>12}",
        "figure", "p50 / value", "p99", "max"
    );
    let lat = |s: &mut String, name: &str, l: &Latency| {
        let _ = writeln!(
            s,
            "{:<44} {:>10.2}ms {:>10.2}ms {:>10.2}ms",
            format!("{name} ({} samples)", l.samples),
            l.p50_ms,
            l.p99_ms,
            l.max_ms
        );
    };
    lat(&mut s, "1. reaction latency", &r.reaction);
    lat(&mut s, "2. scheduling latency", &r.scheduling);
    let m = &r.makespan;
    let _ = writeln!(s, "3. makespan {}", makespan_lines(m).join("\n   "));
    let st = &r.status;
    let _ = writeln!(
        s,
        "{:<44} {:>10.1}ms   {} store requests, {} bytes of JSON (read {:.1}ms, classify {:.1}ms, plan {:.1}ms, JSON {:.1}ms)",
        format!("4. status --json ({} hosts)", st.hosts),
        st.wall_ms,
        st.store_requests,
        st.json_bytes,
        st.read_ms,
        st.classify_ms,
        st.admission_ms,
        st.json_ms
    );
    let f = &r.footprint;
    let _ = writeln!(
        s,
        "{:<44} {:>10.1}MB   private {:.1}MB, program file {:.1}MB, cpu {:.2}s, {} store requests ({} lease renewals)",
        format!("5. idle agent ({:.0}s)", f.idle_s),
        f.rss_mb,
        f.rss_anon_mb,
        f.rss_file_mb,
        f.cpu_s,
        f.store_requests,
        f.lease_renewals
    );
    let _ = writeln!(
        s,
        "{:<44} {:>10.1}MB   jioctl {:.1}MB",
        "   binary size jio-agent", f.agent_binary_mb, f.jioctl_binary_mb
    );
    s
}
