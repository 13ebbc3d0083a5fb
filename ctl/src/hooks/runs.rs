//! The hooks this driver process runs: each in a task of its own, under the rollout
//! lock (a hook is stopped as soon as the lock may be lost, so that two drivers
//! never run the same hook at once), its log kept in the state directory and
//! uploaded to Swift when `[swift]` is set. Ended runs wait here until a pass
//! records them. It decides nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use jio_common::hook_record::HookKind;
use jio_common::names::HostName;
use jio_common::swift::SwiftClient;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::decide::{Done, HookStart, Local, RunKey};
use super::runner;
use super::settings::HookSettings;
use crate::writes::LockGuard;

/// Logs kept in `<state_dir>/hooks/`; older ones are removed.
const KEEP_LOGS: usize = 200;
/// How long an upload of a hook's log may take before the local path is recorded.
const UPLOAD_WITHIN: Duration = Duration::from_secs(30);
/// How often a running hook checks that the lock is still held.
const LOCK_CHECK: Duration = Duration::from_millis(250);

/// A hook task of this process.
struct Running {
    key: RunKey,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// An ended task's report: `None` when it was stopped (no outcome to record).
type Report = (HostName, RunKey, Option<Done>);

/// The hooks this process runs and the ended runs not yet recorded.
pub struct HookRuns {
    pub settings: HookSettings,
    /// This driver: `<host>-<pid>`.
    pub me: String,
    swift: Option<Arc<SwiftClient>>,
    running: BTreeMap<HostName, Running>,
    done: BTreeMap<HostName, Done>,
    tx: mpsc::UnboundedSender<Report>,
    rx: mpsc::UnboundedReceiver<Report>,
    /// Lines already said about hooks this driver cannot run.
    said: BTreeSet<String>,
}

impl HookRuns {
    pub fn new(settings: HookSettings, me: String) -> HookRuns {
        let swift = settings.swift.clone().and_then(|s| match SwiftClient::new(s) {
            Ok(c) => Some(Arc::new(c)),
            Err(e) => {
                eprintln!("jioctl: warning: hook logs stay on this host, not uploaded: {e}");
                None
            }
        });
        let (tx, rx) = mpsc::unbounded_channel();
        HookRuns {
            settings,
            me,
            swift,
            running: BTreeMap::new(),
            done: BTreeMap::new(),
            tx,
            rx,
            said: BTreeSet::new(),
        }
    }

    /// Whether any role has hooks.
    pub fn any(&self) -> bool {
        !self.settings.roles.is_empty()
    }

    /// This process's hooks, by host, as a pass sees them.
    pub fn local(&mut self) -> BTreeMap<HostName, Local> {
        self.collect();
        let running = self
            .running
            .iter()
            .map(|(h, r)| (h.clone(), Local::Running(r.key.clone())));
        let done = self.done.iter().map(|(h, d)| (h.clone(), Local::Done(d.clone())));
        running.chain(done).collect()
    }

    /// How many hooks run in this process.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Takes the reports of ended tasks.
    fn collect(&mut self) {
        while let Ok(report) = self.rx.try_recv() {
            self.ended(report);
        }
    }

    fn ended(&mut self, (host, key, done): Report) {
        if self.running.get(&host).is_some_and(|r| r.key == key) {
            self.running.remove(&host);
        }
        if let Some(d) = done {
            self.done.insert(host, d);
        }
    }

    /// Waits until a hook of this process ends (forever when none runs).
    pub async fn ended_one(&mut self) {
        if self.running.is_empty() {
            return std::future::pending().await;
        }
        if let Some(report) = self.rx.recv().await {
            self.ended(report);
        }
    }

    /// Forgets ended runs that are recorded (or overtaken).
    pub fn forget(&mut self, hosts: &[HostName]) {
        for h in hosts {
            self.done.remove(h);
        }
    }

    /// A line about a hook this driver cannot run, the first time it comes.
    pub fn first_time(&mut self, line: &str) -> bool {
        self.said.insert(line.to_string())
    }

    /// Starts a hook (its record says it runs) under `guard`.
    pub fn start(&mut self, s: HookStart, guard: LockGuard) {
        if let Some(old) = self.running.remove(&s.host) {
            let _ = old.stop.send(true);
        }
        let (stop, stop_rx) = watch::channel(false);
        let job = Job {
            state_dir: self.settings.state_dir.clone(),
            swift: self.swift.clone(),
            guard,
        };
        let (tx, host, key) = (self.tx.clone(), s.host.clone(), s.key.clone());
        let task = tokio::spawn(async move {
            let done = job.run(&s, stop_rx).await;
            let _ = tx.send((s.host.clone(), s.key.clone(), done));
        });
        self.running.insert(host, Running { key, stop, task });
    }

    /// Stops the hooks of every rollout but `keep` (an ended or replaced rollout's
    /// hooks run no further); they report as stopped.
    pub fn stop_unless(&mut self, keep: Option<&str>) {
        for r in self.running.values() {
            if Some(r.key.rollout.as_str()) != keep {
                let _ = r.stop.send(true);
            }
        }
    }

    /// Stops every hook and waits for their process groups to be stopped (before
    /// the lock is released, so that the next driver never runs one beside them).
    pub async fn stop_all(&mut self) -> usize {
        let running = std::mem::take(&mut self.running);
        for r in running.values() {
            let _ = r.stop.send(true);
        }
        let n = running.len();
        for (_, r) in running {
            let _ = tokio::time::timeout(Duration::from_secs(15), r.task).await;
        }
        n
    }
}

/// What a hook task needs besides its start.
struct Job {
    state_dir: PathBuf,
    swift: Option<Arc<SwiftClient>>,
    guard: LockGuard,
}

impl Job {
    /// Runs the hook; `None` when it was stopped (the lock may be lost, or the
    /// driver stops), else how it ended.
    async fn run(self, s: &HookStart, mut stop: watch::Receiver<bool>) -> Option<Done> {
        let group_file = runner::group_file(&self.state_dir, s.host.as_str());
        if runner::stop_left_behind(&group_file).await {
            eprintln!(
                "jioctl: stopped the {} hook of {} that a driver of this host left running",
                s.key.hook, s.host
            );
        }
        let started = jio_common::time::unix_now();
        let log = log_path(&self.state_dir, &s.host, s.key.hook, started);
        let vars = vec![
            ("JIO_HOST", s.host.to_string()),
            ("JIO_ROLE", s.role.to_string()),
            ("JIO_VERSION", s.version.to_string()),
            ("JIO_ROLLOUT", s.key.rollout.clone()),
            ("JIO_HOOK", s.key.hook.to_string()),
        ];
        let spec = runner::Spec {
            argv: &s.argv,
            vars,
            timeout: s.timeout,
            log: &log,
        };
        let (local_stop, mut local_rx) = watch::channel(false);
        let mine = std::sync::Mutex::new(None);
        let noted = |g: runner::ProcessGroup| {
            let text = serde_json::to_string(&g).unwrap_or_default();
            let _ = std::fs::write(&group_file, &text);
            if let Ok(mut m) = mine.lock() {
                *m = Some(text);
            }
        };
        let run = runner::run(&spec, &mut local_rx, noted);
        tokio::pin!(run);
        let exit = tokio::select! {
            e = &mut run => e,
            _ = must_stop(&self.guard, &mut stop) => {
                let _ = local_stop.send(true);
                run.await
            }
        };
        // Its own note only: a run that took over from this one wrote its own.
        let noted = mine.lock().ok().and_then(|m| m.clone());
        if noted.is_some() && std::fs::read_to_string(&group_file).ok() == noted {
            let _ = std::fs::remove_file(&group_file);
        }
        let result = runner::outcome(&exit)?;
        let ended = jio_common::time::unix_now();
        prune(log.parent());
        Some(Done {
            key: s.key.clone(),
            result: result.map_err(|why| format!("{} {why}", s.argv[0])),
            exit_code: runner::code(&exit),
            ended,
            log: Some(self.link(s, &log, started).await),
            tail: runner::tail(&log),
        })
    }

    /// The log's Swift link, else its path on this host.
    async fn link(&self, s: &HookStart, log: &Path, started: u64) -> String {
        let local = log.display().to_string();
        let (Some(swift), Ok(body)) = (&self.swift, std::fs::read(log)) else {
            return local;
        };
        let object = format!(
            "{}/{}/{}-hook-{}.log",
            s.host,
            s.version,
            jio_common::time::utc_stamp(started),
            s.key.hook
        );
        match tokio::time::timeout(UPLOAD_WITHIN, swift.upload(&object, body)).await {
            Ok(Ok(url)) => url,
            Ok(Err(e)) => {
                eprintln!(
                    "jioctl: the log of {}'s {} hook stays at {local}: {e}",
                    s.host, s.key.hook
                );
                local
            }
            Err(_) => {
                eprintln!(
                    "jioctl: the log of {}'s {} hook stays at {local}: Swift did not answer in time",
                    s.host, s.key.hook
                );
                local
            }
        }
    }
}

/// Resolves once the hook must stop: asked to, or the lock may be lost.
async fn must_stop(guard: &LockGuard, stop: &mut watch::Receiver<bool>) {
    loop {
        if *stop.borrow_and_update() || !guard.holds() {
            return;
        }
        tokio::select! {
            changed = stop.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(LOCK_CHECK) => {}
        }
    }
}

/// `<state_dir>/hooks/<UTC start>-<host>-<hook>.log`.
fn log_path(state_dir: &Path, host: &HostName, hook: HookKind, started: u64) -> PathBuf {
    state_dir.join("hooks").join(format!(
        "{}-{host}-{hook}.log",
        jio_common::time::utc_stamp(started)
    ))
}

/// Keeps the newest `KEEP_LOGS` logs.
fn prune(dir: Option<&Path>) {
    let Some(Ok(rd)) = dir.map(std::fs::read_dir) else {
        return;
    };
    let mut logs: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    if logs.len() <= KEEP_LOGS {
        return;
    }
    logs.sort();
    for p in &logs[..logs.len() - KEEP_LOGS] {
        let _ = std::fs::remove_file(p);
    }
}
