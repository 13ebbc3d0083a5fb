//! Composable rollouts (issue 17) on real agents: a fleet whose service tasks and
//! Puppet log their own start and end to one shared file, and the checks read from
//! that file alone (pure functions, never the project's classification).
//!
//! A log line is `start|end HOST SERVICE PHASE VERSION PID UNIX_TIME TASK...`:
//! PHASE is the task's `JIO_STEP` (`pre-1`, `post-3`, `finalize`) or `puppet` for
//! the host's Puppet run (SERVICE and TASK are `puppet` then), PID the process that
//! logs (Puppet's own pid for the real one), TASK the rest of the line (it may hold
//! spaces).

#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use jio_common::keys::Schema;
use jio_tests::host::toml_str;
use jio_tests::inspect::{open, text, wait_for};
use jio_tests::{Host, Puppet};
use tokio::process::{Child, Command};

use super::agent_bin;
use super::fleet::{finish, keys_under, spawn};

/// Where a task (or Puppet) runs in a host's upgrade, in the order a stage runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    Pre(u32),
    Puppet,
    Post(u32),
    Finalize,
}

impl Phase {
    pub fn parse(s: &str) -> Option<Phase> {
        match s {
            "puppet" => Some(Phase::Puppet),
            "finalize" => Some(Phase::Finalize),
            _ => {
                let (when, k) = s.split_once('-')?;
                let k: u32 = k.parse().ok().filter(|k| *k > 0)?;
                match when {
                    "pre" => Some(Phase::Pre(k)),
                    "post" => Some(Phase::Post(k)),
                    _ => None,
                }
            }
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Phase::Pre(k) => write!(f, "pre-{k}"),
            Phase::Puppet => f.write_str("puppet"),
            Phase::Post(k) => write!(f, "post-{k}"),
            Phase::Finalize => f.write_str("finalize"),
        }
    }
}

/// One run of one task (or of Puppet) on one host, from the shared log.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRun {
    pub host: String,
    pub service: String,
    pub phase: Phase,
    pub version: String,
    pub pid: u32,
    pub task: String,
    pub start: f64,
    /// `None`: still running, or killed before it could log its end.
    pub end: Option<f64>,
}

impl TaskRun {
    fn same_task(&self, o: &TaskRun) -> bool {
        self.host == o.host
            && self.service == o.service
            && self.phase == o.phase
            && self.task == o.task
            && self.version == o.version
    }

    fn name(&self) -> String {
        format!(
            "{} {}/{} {:?} ({}..{})",
            self.host,
            self.service,
            self.phase,
            self.task,
            self.start,
            self.end.map_or("never ended".into(), |e| e.to_string())
        )
    }
}

/// Every run in the log, in start order. An end line closes the open run of the
/// same task with the same pid, else the latest open run of the same task.
pub fn parse_log(text: &str) -> Vec<TaskRun> {
    let mut runs: Vec<TaskRun> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            continue;
        }
        let (Some(phase), Ok(pid), Ok(at)) = (Phase::parse(f[3]), f[5].parse::<u32>(), f[6].parse::<f64>())
        else {
            continue;
        };
        let run = TaskRun {
            host: f[1].into(),
            service: f[2].into(),
            phase,
            version: f[4].into(),
            pid,
            task: f[7..].join(" "),
            start: at,
            end: None,
        };
        match f[0] {
            "start" => runs.push(run),
            "end" => {
                let open = |r: &&mut TaskRun| r.end.is_none() && r.same_task(&run);
                let i = runs
                    .iter_mut()
                    .rposition(|r| open(&r) && r.pid == pid)
                    .or_else(|| runs.iter_mut().rposition(|r| open(&r)));
                if let Some(i) = i {
                    runs[i].end = Some(at);
                }
            }
            _ => {}
        }
    }
    runs.sort_by(|a, b| a.start.total_cmp(&b.start));
    runs
}

/// The runs of one version.
pub fn of_version(runs: &[TaskRun], version: &str) -> Vec<TaskRun> {
    runs.iter().filter(|r| r.version == version).cloned().collect()
}

/// A run that never ended and was started again later on its host: it was
/// interrupted (its agent killed) and the rerun stands for it.
fn superseded(runs: &[TaskRun], r: &TaskRun) -> bool {
    r.end.is_none() && runs.iter().any(|o| o.same_task(r) && o.start > r.start)
}

/// How many times a task started on a host.
pub fn count(runs: &[TaskRun], host: &str, service: &str, phase: Phase, task: &str) -> usize {
    runs.iter()
        .filter(|r| r.host == host && r.service == service && r.phase == phase && r.task == task)
        .count()
}

/// Lockstep within one stage (`hosts`): no run of a later phase started before every
/// run of an earlier phase, on every host of the stage, had ended. Finalize is left
/// to [`finalize_violations`]. An interrupted run that was started again counts by
/// its rerun; one that never ended and was not rerun blocks every later phase.
pub fn lockstep_violations(runs: &[TaskRun], hosts: &BTreeSet<String>) -> Vec<String> {
    let stage: Vec<&TaskRun> = runs
        .iter()
        .filter(|r| hosts.contains(&r.host) && r.phase != Phase::Finalize && !superseded(runs, r))
        .collect();
    let mut out = Vec::new();
    for b in &stage {
        for a in stage.iter().filter(|a| a.phase < b.phase) {
            match a.end {
                Some(e) if e <= b.start => {}
                _ => out.push(format!("{} started before {} had ended", b.name(), a.name())),
            }
        }
    }
    out
}

/// Every stage in order: no run of a host of `then` started before every run of a
/// host of `first` had ended (finalize aside).
pub fn stage_order_violations(
    runs: &[TaskRun],
    first: &BTreeSet<String>,
    then: &BTreeSet<String>,
) -> Vec<String> {
    let live = |set: &BTreeSet<String>| -> Vec<&TaskRun> {
        runs.iter()
            .filter(|r| set.contains(&r.host) && r.phase != Phase::Finalize && !superseded(runs, r))
            .collect()
    };
    let (a, b) = (live(first), live(then));
    let mut out = Vec::new();
    for y in &b {
        for x in &a {
            if x.end.is_none_or(|e| e > y.start) {
                out.push(format!("{} started before {} had ended", y.name(), x.name()));
            }
        }
    }
    out
}

/// The most of `hosts` in `phase` at one instant. A host is in the phase from its
/// first task's start to its last task's end (or for ever, if that never ended).
pub fn max_overlap(runs: &[TaskRun], hosts: &BTreeSet<String>, phase: Phase) -> (usize, Vec<String>) {
    let mut spans: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    for r in runs
        .iter()
        .filter(|r| r.phase == phase && hosts.contains(&r.host))
    {
        let end = if superseded(runs, r) {
            r.start
        } else {
            r.end.unwrap_or(f64::INFINITY)
        };
        let s = spans.entry(r.host.as_str()).or_insert((r.start, end));
        s.0 = s.0.min(r.start);
        s.1 = s.1.max(end);
    }
    let mut best = (0, Vec::new());
    for &(t, _) in spans.values() {
        let at: Vec<String> = spans
            .iter()
            .filter(|(_, (s, e))| *s <= t && *e > t)
            .map(|(h, _)| h.to_string())
            .collect();
        if at.len() > best.0 {
            best = (at.len(), at);
        }
    }
    best
}

/// Across the fleet: no run of `service` at a phase started before every run of
/// `dep` at the same phase (on every host that runs it) had ended.
pub fn after_violations(runs: &[TaskRun], service: &str, dep: &str) -> Vec<String> {
    let mut out = Vec::new();
    for s in runs
        .iter()
        .filter(|r| r.service == service && !superseded(runs, r))
    {
        for d in runs
            .iter()
            .filter(|r| r.service == dep && r.phase == s.phase && !superseded(runs, r))
        {
            if d.end.is_none_or(|e| e > s.start) {
                out.push(format!("{} started before {} had ended", s.name(), d.name()));
            }
        }
    }
    out
}

/// On `host` in `phase`: exactly `expected` ran, as (service, task), in that order,
/// each starting after the one before it had ended.
pub fn sequence_violations(
    runs: &[TaskRun],
    host: &str,
    phase: Phase,
    expected: &[(&str, &str)],
) -> Vec<String> {
    let got: Vec<&TaskRun> = runs
        .iter()
        .filter(|r| r.host == host && r.phase == phase && !superseded(runs, r))
        .collect();
    let names: Vec<(&str, &str)> = got
        .iter()
        .map(|r| (r.service.as_str(), r.task.as_str()))
        .collect();
    let mut out = Vec::new();
    if names != expected {
        out.push(format!("{host} {phase}: ran {names:?}, expected {expected:?}"));
    }
    for w in got.windows(2) {
        if w[0].end.is_none_or(|e| e > w[1].start) {
            out.push(format!(
                "{} started before {} had ended",
                w[1].name(),
                w[0].name()
            ));
        }
    }
    out
}

/// Finalize: every finalize task ran exactly once, all on `host`, each after every
/// other run (every task and Puppet run of every host) had ended. `tasks` are the
/// finalize tasks expected, as (service, task).
pub fn finalize_violations(runs: &[TaskRun], host: &str, tasks: &[(&str, &str)]) -> Vec<String> {
    let mut out = Vec::new();
    let fin: Vec<&TaskRun> = runs.iter().filter(|r| r.phase == Phase::Finalize).collect();
    for (service, task) in tasks {
        let n = fin
            .iter()
            .filter(|r| r.service == *service && r.task == *task)
            .count();
        if n != 1 {
            out.push(format!("finalize task {service}/{task:?} ran {n} times"));
        }
    }
    for f in &fin {
        if f.host != host {
            out.push(format!("{} ran on {}, not on {host}", f.name(), f.host));
        }
        for r in runs
            .iter()
            .filter(|r| r.phase != Phase::Finalize && !superseded(runs, r))
        {
            if r.end.is_none_or(|e| e > f.start) {
                out.push(format!("{} started before {} had ended", f.name(), r.name()));
            }
        }
    }
    out
}

/// When a task runs, as its file says.
#[derive(Debug, Clone, Copy)]
pub enum When {
    Pre(u32),
    Post(u32),
    Finalize,
}

/// One `[[task]]` of a service's task file.
#[derive(Debug, Clone)]
pub struct Task {
    pub name: &'static str,
    pub when: When,
    pub idempotent: bool,
}

impl Task {
    pub fn pre(step: u32, name: &'static str) -> Task {
        Task {
            name,
            when: When::Pre(step),
            idempotent: false,
        }
    }
    pub fn post(step: u32, name: &'static str) -> Task {
        Task {
            name,
            when: When::Post(step),
            idempotent: false,
        }
    }
    pub fn finalize(name: &'static str) -> Task {
        Task {
            name,
            when: When::Finalize,
            idempotent: false,
        }
    }
    pub fn idempotent(mut self) -> Task {
        self.idempotent = true;
        self
    }
}

/// A service's task file, `<services_dir>/<name>.toml`.
#[derive(Debug, Clone)]
pub struct Service {
    pub name: &'static str,
    pub after: Vec<&'static str>,
    pub tasks: Vec<Task>,
}

impl Service {
    pub fn new(name: &'static str, tasks: Vec<Task>) -> Service {
        Service {
            name,
            after: Vec::new(),
            tasks,
        }
    }
    pub fn after(mut self, deps: &[&'static str]) -> Service {
        self.after = deps.to_vec();
        self
    }

    /// The file, every task's command being `command`.
    pub fn toml(&self, command: &[String]) -> String {
        let cmd: Vec<String> = command.iter().map(|a| toml_str(a)).collect();
        let mut s = String::new();
        if !self.after.is_empty() {
            let a: Vec<String> = self.after.iter().map(|d| toml_str(d)).collect();
            s.push_str(&format!("after = [{}]\n", a.join(", ")));
        }
        for t in &self.tasks {
            s.push_str(&format!("\n[[task]]\nname = {}\n", toml_str(t.name)));
            match t.when {
                When::Pre(k) => s.push_str(&format!("step = {k}\nwhen = \"pre\"\n")),
                When::Post(k) => s.push_str(&format!("step = {k}\nwhen = \"post\"\n")),
                When::Finalize => s.push_str("when = \"finalize\"\n"),
            }
            s.push_str(&format!("command = [{}]\n", cmd.join(", ")));
            if t.idempotent {
                s.push_str("idempotent = true\n");
            }
        }
        s
    }
}

/// Keystone: one pre step and one post step.
pub fn keystone() -> Service {
    Service::new(
        "keystone",
        vec![Task::pre(1, "stop keystone"), Task::post(3, "keystone db sync")],
    )
}

/// nova_compute with one pre and one post step (and no finalize task).
pub fn nova_compute_short() -> Service {
    Service::new(
        "nova_compute",
        vec![Task::pre(1, "RPC pin nova-compute"), Task::post(3, "db sync")],
    )
}

/// The seed's nova-compute example as written: RPC pin (pre 1), stop (pre 2, may run
/// again), db sync (post 3), start (post 4), and unpin RPC at finalize.
pub fn nova_compute() -> Service {
    Service::new(
        "nova_compute",
        vec![
            Task::pre(1, "RPC pin nova-compute"),
            Task::pre(2, "stop nova-compute").idempotent(),
            Task::post(3, "db sync"),
            Task::post(4, "start nova-compute"),
            Task::finalize("unpin RPC"),
        ],
    )
}

/// The host's Puppet run: the real `puppet apply`, or a stand-in script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PuppetKind {
    Real,
    StandIn,
}

/// One task of the fleet: logs its start, sleeps (`seconds`, or
/// `seconds-HOST-SERVICE-PHASE-TASK`, or `seconds-HOST-SERVICE-PHASE`), logs its
/// end, fails when `fail-HOST-SERVICE-PHASE` exists. Every `JIO_*` variable of the
/// spec must be set (the task fails otherwise).
const TASK_SCRIPT: &str = r#"#!/bin/sh
set -eu
log=$1
dir=$(dirname "$log")
: "${JIO_RUN_DIR:?}" "${JIO_ROLE:?}" "${JIO_ROLLOUT:?}"
id="$JIO_HOST-$JIO_SERVICE-$JIO_STEP"
seconds=$(cat "$dir/seconds")
if [ -e "$dir/seconds-$id-$JIO_TASK" ]; then seconds=$(cat "$dir/seconds-$id-$JIO_TASK")
elif [ -e "$dir/seconds-$id" ]; then seconds=$(cat "$dir/seconds-$id"); fi
echo "start $JIO_HOST $JIO_SERVICE $JIO_STEP $JIO_VERSION $$ $(date +%s.%N) $JIO_TASK" >> "$log"
sleep "$seconds"
echo "end $JIO_HOST $JIO_SERVICE $JIO_STEP $JIO_VERSION $$ $(date +%s.%N) $JIO_TASK" >> "$log"
if [ -e "$dir/fail-$id" ]; then echo "failing: $dir/fail-$id exists" >&2; exit 3; fi
exit 0
"#;

/// The stand-in Puppet: logs its run, exits like `puppet apply --detailed-exitcodes`
/// with changes (2).
const PUPPET_SCRIPT: &str = r#"#!/bin/sh
set -eu
log=$1
echo "start $JIO_HOST puppet puppet $JIO_VERSION $$ $(date +%s.%N) puppet" >> "$log"
sleep "$(cat "$(dirname "$log")/seconds")"
echo "end $JIO_HOST puppet puppet $JIO_VERSION $$ $(date +%s.%N) puppet" >> "$log"
exit 2
"#;

/// Agents on a real store with `services_dir` and the services' task files.
pub struct Fleet {
    pub hosts: Vec<Host>,
    pub daemons: Vec<Option<Child>>,
    pub work: tempfile::TempDir,
    _puppets: Vec<Puppet>,
}

impl Fleet {
    /// `names` converged to v1 (tasks of 0.3 s), every agent's service catalog
    /// published. All hosts share one services directory holding `services`.
    pub async fn start(url: &str, names: &[&str], services: &[Service], puppet: PuppetKind) -> Fleet {
        Fleet::start_with(url, names, services, puppet, "health_interval = \"0\"").await
    }

    /// Like `start`, with `extra` lines in every agent's configuration (its
    /// `health_interval` among them).
    pub async fn start_with(
        url: &str,
        names: &[&str],
        services: &[Service],
        puppet: PuppetKind,
        extra: &str,
    ) -> Fleet {
        let s = open(url).await;
        s.put(&Schema::default().current_version(), "v1", None)
            .await
            .unwrap();
        let work = tempfile::Builder::new()
            .prefix("jio-composable-")
            .tempdir()
            .unwrap();
        let script = |name: &str, body: &str| {
            let p = work.path().join(name);
            std::fs::write(&p, body).unwrap();
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
            p.display().to_string()
        };
        let task = script("task.sh", TASK_SCRIPT);
        let stand_in = script("puppet.sh", PUPPET_SCRIPT);
        let log = work.path().join("tasks.log").display().to_string();
        std::fs::write(work.path().join("seconds"), "0.3").unwrap();
        let services_dir = work.path().join("services");
        std::fs::create_dir_all(&services_dir).unwrap();
        for svc in services {
            std::fs::write(
                services_dir.join(format!("{}.toml", svc.name)),
                svc.toml(&[task.clone(), log.clone()]),
            )
            .unwrap();
        }
        let mut f = Fleet {
            hosts: Vec::new(),
            daemons: Vec::new(),
            work,
            _puppets: Vec::new(),
        };
        for name in names {
            let cmd = match puppet {
                PuppetKind::StandIn => vec![stand_in.clone(), log.clone()],
                // One sandbox per host; exec resources log the run (`$PPID`: the
                // `puppet apply` process, the same for its start and its end).
                PuppetKind::Real => {
                    let p = Puppet::new();
                    let line = |kind: &str| {
                        format!(
                            "exec {{ 'jio-{kind}': command => '/bin/sh -c \"echo {kind} $JIO_HOST puppet puppet $JIO_VERSION $PPID $(date +%s.%N) puppet >> {log}\"' }}"
                        )
                    };
                    let m = p.manifest(
                        name,
                        &format!(
                            "{}\n-> exec {{ 'jio-work': command => '/bin/sleep 0.3' }}\n-> {}\n",
                            line("start"),
                            line("end")
                        ),
                    );
                    let cmd = p.command(&m);
                    f._puppets.push(p);
                    cmd
                }
            };
            let host = Host::new(
                name,
                url,
                &cmd,
                &format!(
                    "retry_interval = \"1h\"\n{extra}\nservices_dir = {}\ntask_timeout = \"1m\"",
                    toml_str(&services_dir.display().to_string())
                ),
            );
            f.hosts.push(host);
            f.daemons.push(None);
            f.start_agent(f.hosts.len() - 1);
        }
        let hosts = &f.hosts;
        wait_for("the fleet to converge to v1", Duration::from_secs(60), || async {
            hosts.iter().all(|h| h.local_version().as_deref() == Some("v1"))
        })
        .await;
        // Settled in the store too (no run marker, every agent idle), and every
        // agent's service catalog published, or a driver would find hosts blocked.
        wait_for(
            "every v1 run reported and every service catalog published",
            Duration::from_secs(60),
            || async {
                let agents = keys_under(&s, "/agents/").await;
                let registry = keys_under(&s, "/hosts/").await;
                keys_under(&s, "/runs/").await.is_empty()
                    && agents.len() == names.len()
                    && agents.values().all(|v| v.contains("\"state\":\"idle\""))
                    && names
                        .iter()
                        .all(|h| registry.contains_key(&format!("/hosts/{h}/services")))
            },
        )
        .await;
        f
    }

    fn start_agent(&mut self, i: usize) {
        let h = &self.hosts[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.agent_log(&h.name))
            .unwrap();
        let child = Command::from(h.agent(&agent_bin(), &["run"]))
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        self.daemons[i] = Some(child);
    }

    fn agent_log(&self, host: &str) -> PathBuf {
        self.work.path().join(format!("agent-{host}.log"))
    }

    pub fn index(&self, host: &str) -> usize {
        self.hosts.iter().position(|h| h.name == host).unwrap()
    }

    pub fn agent_pid(&self, host: &str) -> u32 {
        self.daemons[self.index(host)].as_ref().unwrap().id().unwrap()
    }

    /// `kill -9` of the host's agent (the test signals nothing else).
    pub async fn kill_agent(&mut self, host: &str) {
        let i = self.index(host);
        let mut c = self.daemons[i].take().unwrap();
        c.start_kill().unwrap();
        c.wait().await.unwrap();
    }

    pub fn restart_agent(&mut self, host: &str) {
        self.start_agent(self.index(host));
    }

    pub fn agent_running(&mut self, host: &str) -> bool {
        let i = self.index(host);
        self.daemons[i]
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    pub fn log_path(&self) -> PathBuf {
        self.work.path().join("tasks.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Every run in the shared log, in start order.
    pub fn runs(&self) -> Vec<TaskRun> {
        parse_log(&self.log())
    }

    /// The runs of the rollout to `version`.
    pub fn runs_of(&self, version: &str) -> Vec<TaskRun> {
        of_version(&self.runs(), version)
    }

    /// How long a task (`task`: one, `None`: every task of the host's service at
    /// that phase) sleeps from now on.
    pub fn set_task_seconds(
        &self,
        host: &str,
        service: &str,
        phase: Phase,
        task: Option<&str>,
        seconds: f64,
    ) {
        let mut name = format!("seconds-{host}-{service}-{phase}");
        if let Some(t) = task {
            name.push('-');
            name.push_str(t);
        }
        std::fs::write(self.work.path().join(name), seconds.to_string()).unwrap();
    }

    pub fn clear_task_seconds(&self, host: &str, service: &str, phase: Phase, task: Option<&str>) {
        let mut name = format!("seconds-{host}-{service}-{phase}");
        if let Some(t) = task {
            name.push('-');
            name.push_str(t);
        }
        let _ = std::fs::remove_file(self.work.path().join(name));
    }

    /// Makes the host's tasks of `service` at `phase` fail (after logging their end).
    pub fn fail(&self, host: &str, service: &str, phase: Phase) {
        std::fs::write(
            self.work.path().join(format!("fail-{host}-{service}-{phase}")),
            "",
        )
        .unwrap();
    }

    /// Writes the rules and returns the file's path, for `--instructions-file`.
    pub fn rules(&self, json: &str) -> String {
        let p = self.work.path().join("rules.json");
        std::fs::write(&p, json).unwrap();
        p.display().to_string()
    }

    pub fn all_at(&self, names: &[&str], v: &str) -> bool {
        self.hosts
            .iter()
            .filter(|h| names.contains(&h.name.as_str()))
            .all(|h| h.local_version().as_deref() == Some(v))
    }

    /// For assertion messages: the task log and the end of every agent's log.
    pub fn diagnostics(&self) -> String {
        let mut s = format!("--- task log\n{}", self.log());
        for h in &self.hosts {
            let log = std::fs::read_to_string(self.agent_log(&h.name)).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(25)..];
            s.push_str(&format!(
                "--- agent {} (last {} lines)\n{}\n",
                h.name,
                tail.len(),
                tail.join("\n")
            ));
        }
        s
    }

    /// `jioctl upgrade <args>` to its end (at most `within`), its output with the
    /// fleet's diagnostics when its exit code is not `code`.
    pub async fn upgrade(&self, url: &str, args: &[&str], code: i32, within: Duration) -> String {
        let mut all = vec!["upgrade"];
        all.extend_from_slice(args);
        let out = finish(spawn(url, &all), within).await;
        assert_eq!(
            out.status.code(),
            Some(code),
            "jioctl {all:?}:\n{}\n{}",
            text(&out),
            self.diagnostics()
        );
        text(&out)
    }

    /// `jioctl upgrade v2` under the rules `json` (written to the rules file), as
    /// `upgrade` runs and checks it.
    pub async fn upgrade_under(&self, url: &str, json: &str, code: i32, within: Duration) -> String {
        let rules = self.rules(json);
        self.upgrade(url, &["v2", "--instructions-file", &rules], code, within)
            .await
    }

    /// `jioctl upgrade v2 --stage <stage>` under the rules file `rules`, which must
    /// end 0 within `within` (as `upgrade` checks it).
    pub async fn upgrade_stage(&self, url: &str, rules: &str, stage: &str, within: Duration) -> String {
        let args = ["v2", "--instructions-file", rules, "--stage", stage];
        self.upgrade(url, &args, 0, within).await
    }

    /// `jioctl upgrade v2` under the rules `json` (written to the rules file), in
    /// the background.
    pub fn spawn_upgrade(&self, url: &str, json: &str) -> Child {
        let rules = self.rules(json);
        spawn(url, &["upgrade", "v2", "--instructions-file", &rules])
    }

    /// Checks that a `jioctl` exited with `code`, showing its output and the
    /// fleet's diagnostics otherwise.
    #[track_caller]
    pub fn assert_exit(&self, out: &std::process::Output, code: i32) {
        assert_eq!(
            out.status.code(),
            Some(code),
            "{}\n{}",
            text(out),
            self.diagnostics()
        );
    }
}

/// A real etcd with agents `names` converged to v1 under the stand-in Puppet,
/// sharing `services`; keep the `Etcd` alive for the test's length.
pub async fn stand_in_fleet(names: &[&str], services: &[Service]) -> (jio_tests::Etcd, String, Fleet) {
    let etcd = jio_tests::Etcd::start().await;
    let url = etcd.url();
    let f = Fleet::start(&url, names, services, PuppetKind::StandIn).await;
    (etcd, url, f)
}

/// `jioctl upgrade v2 --instructions-file <rules> --stage <stage>` in the background.
pub fn spawn_stage(url: &str, rules: &str, stage: &str) -> Child {
    spawn(
        url,
        &["upgrade", "v2", "--instructions-file", rules, "--stage", stage],
    )
}

/// Waits until `host`'s `phase` of the rollout to v2 has started, and returns its run.
pub async fn wait_v2_phase(f: &Fleet, host: &str, phase: Phase) -> TaskRun {
    wait_for_run(
        f,
        &format!("{host}'s {phase} to start"),
        Duration::from_secs(60),
        |r| r.host == host && r.phase == phase && r.version == "v2",
    )
    .await
}

/// nova_compute()'s phases, in the order a host runs them.
pub const NOVA_PHASES: [Phase; 5] = [
    Phase::Pre(1),
    Phase::Pre(2),
    Phase::Puppet,
    Phase::Post(3),
    Phase::Post(4),
];

/// Checks that no two of compute1, compute2 and compute3 ran one of nova_compute's
/// phases at once, by the task log.
#[track_caller]
pub fn assert_one_compute_at_a_time(runs: &[TaskRun], f: &Fleet) {
    for phase in NOVA_PHASES {
        let (n, at) = max_overlap(runs, &set(&["compute1", "compute2", "compute3"]), phase);
        assert!(n <= 1, "{phase}: {at:?}\n{}", f.diagnostics());
    }
}

/// Checks that the rollout record says `failed` and names each of `named`
/// (`what` says what it should name).
pub async fn assert_rollout_failed_naming(url: &str, named: &[&str], what: &str) {
    let r = rollout_record(url).await;
    assert_eq!(r["state"], "failed", "{r:#}");
    let record = r.to_string();
    assert!(named.iter().all(|n| record.contains(n)), "{what}: {r:#}");
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for d in self.daemons.iter_mut().flatten() {
            let _ = d.start_kill();
        }
    }
}

/// The host names as a set.
pub fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// `jioctl --json <args>`, which must succeed, as JSON.
pub async fn json(url: &str, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = super::run(url, &all).await;
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("jioctl {all:?}: {e}: {}", text(&out)));
    let want = if args.first() == Some(&"status") {
        super::status_code(&v)
    } else {
        0
    };
    assert_eq!(out.status.code(), Some(want), "jioctl {all:?}: {}", text(&out));
    v
}

/// The rollout record from `jioctl --json rollout status`: the active one
/// (`"rollout"`), or the last one once none is active (`"last"`).
pub async fn rollout_record(url: &str) -> serde_json::Value {
    let v = json(url, &["rollout", "status"]).await;
    if v["rollout"].is_null() {
        v["last"].clone()
    } else {
        v["rollout"].clone()
    }
}

/// The stages' states from `jioctl --json status`: name → (state, phase).
pub async fn stage_states(url: &str) -> BTreeMap<String, (String, String)> {
    let v = json(url, &["status"]).await;
    v["stages"]
        .as_array()
        .unwrap_or_else(|| panic!("no \"stages\" list in the status JSON: {v:#}"))
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or_default().to_string(),
                (
                    s["state"].as_str().unwrap_or_default().to_string(),
                    s["phase"].as_str().unwrap_or_default().to_string(),
                ),
            )
        })
        .collect()
}

/// The parent pid of a process, from `/proc/<pid>/stat` (`None`: it is gone).
pub fn parent_pid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Whether a process is alive (a zombie is not).
pub fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(Path::new(&format!("/proc/{pid}/stat"))).unwrap_or_default();
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
        .is_some_and(|state| state != "Z" && state != "X")
}

/// Waits until the shared log holds a run that `pred` accepts, and returns it.
pub async fn wait_for_run(
    f: &Fleet,
    what: &str,
    within: Duration,
    pred: impl Fn(&TaskRun) -> bool,
) -> TaskRun {
    let start = std::time::Instant::now();
    loop {
        if let Some(r) = f.runs().into_iter().find(|r| pred(r)) {
            return r;
        }
        assert!(
            start.elapsed() < within,
            "timed out after {within:?} waiting for {what}\n{}",
            f.diagnostics()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
