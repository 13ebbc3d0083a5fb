//! A fleet of real `jio-agent` daemons on a real store whose "Puppet" logs each
//! run's start and end to one shared file: the configuration step's own log, from
//! which the tests check limits and pauses without the project's classification.

#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

use std::collections::BTreeMap;
use std::process::{Output, Stdio};
use std::time::Duration;

use jio_common::keys::Schema;
use jio_common::store::DynStore;
use jio_tests::Host;
use jio_tests::inspect::{open, wait_for};
use tokio::process::{Child, Command};

use super::{agent_bin, jioctl};

/// A driver in the background, its output collected.
pub fn spawn(url: &str, args: &[&str]) -> Child {
    jioctl(url, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

pub async fn finish(child: Child, within: Duration) -> Output {
    tokio::time::timeout(within, child.wait_with_output())
        .await
        .expect("jioctl did not exit in time")
        .unwrap()
}

pub fn signal(child: &Child, sig: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, sig).unwrap();
}

/// Wall-clock seconds, as `date +%s.%N` prints them.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// One run of the configuration step, from the shared log.
#[derive(Debug, Clone)]
pub struct Run {
    pub host: String,
    pub version: String,
    pub start: f64,
    /// `None`: still running.
    pub end: Option<f64>,
}

/// Agents on a real etcd whose "Puppet" logs its runs to one shared file.
pub struct Fleet {
    pub hosts: Vec<Host>,
    pub daemons: Vec<Child>,
    pub work: tempfile::TempDir,
}

impl Fleet {
    /// `names` converged to v1, with runs that take `seconds`.
    pub async fn start(url: &str, names: &[&str], seconds: f64) -> Fleet {
        Fleet::start_as(url, url, names, seconds).await
    }

    /// Like `start`, with the agents on `agent_url` (a restricted user) while the
    /// test reads and sets the version on `url`.
    pub async fn start_as(url: &str, agent_url: &str, names: &[&str], seconds: f64) -> Fleet {
        Fleet::start_with(url, agent_url, names, seconds, |_| String::new()).await
    }

    /// Like `start_as`, with `extra(host)` appended to each host's `agent.toml`.
    pub async fn start_with(
        url: &str,
        agent_url: &str,
        names: &[&str],
        seconds: f64,
        extra: impl Fn(&str) -> String,
    ) -> Fleet {
        let s = open(url).await;
        s.put(&Schema::default().current_version(), "v1", None)
            .await
            .unwrap();
        let work = tempfile::tempdir().unwrap();
        let script = work.path().join("puppet.sh");
        std::fs::write(
            &script,
            "#!/bin/sh\n\
             # The configuration step: logs its own start and end, then exits like\n\
             # `puppet apply --detailed-exitcodes` with changes (2), or 4 when the\n\
             # host's fail file exists.\n\
             dir=$(dirname \"$0\")\n\
             # The real clock, even under an agent whose clock is faked.\n\
             now() { env -u LD_PRELOAD -u FAKETIME date +%s.%N; }\n\
             echo \"start $JIO_HOST $JIO_VERSION $(now)\" >> \"$dir/runs.log\"\n\
             sleep \"$(cat \"$dir/seconds\")\"\n\
             echo \"end $JIO_HOST $JIO_VERSION $(now)\" >> \"$dir/runs.log\"\n\
             [ -e \"$dir/fail-$JIO_HOST\" ] && exit 4\n\
             exit 2\n",
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        std::fs::write(work.path().join("seconds"), "0.1").unwrap();
        let mut f = Fleet {
            hosts: Vec::new(),
            daemons: Vec::new(),
            work,
        };
        for name in names {
            let host = Host::new(
                name,
                agent_url,
                &[script.display().to_string()],
                &format!(
                    "retry_interval = \"1h\"\nhealth_interval = \"0\"\n{}",
                    extra(name)
                ),
            );
            f.hosts.push(host);
            let child = f.spawn_agent(f.hosts.len() - 1);
            f.daemons.push(child);
        }
        let hosts = &f.hosts;
        wait_for("the fleet to converge to v1", Duration::from_secs(60), || async {
            hosts.iter().all(|h| h.local_version().as_deref() == Some("v1"))
        })
        .await;
        // The local version is written before the run is reported: wait until every
        // run has ended in the store too (no run marker, every agent idle), so that a
        // recorder started next does not count the convergence against a limit.
        let s = open(url).await;
        wait_for("every v1 run to be reported", Duration::from_secs(60), || async {
            let agents = keys_under(&s, "/agents/").await;
            keys_under(&s, "/runs/").await.is_empty()
                && agents.len() == names.len()
                && agents.values().all(|v| v.contains("\"state\":\"idle\""))
        })
        .await;
        f.set_seconds(seconds);
        f
    }

    /// Starts host `i`'s agent daemon (its output appended to `<name>.log`).
    pub fn spawn_agent(&self, i: usize) -> Child {
        self.spawn_agent_env(i, &[])
    }

    /// Like `spawn_agent`, with these environment variables (a faked clock).
    pub fn spawn_agent_env(&self, i: usize, env: &[(&str, &str)]) -> Child {
        let host = &self.hosts[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.work.path().join(format!("{}.log", host.name)))
            .unwrap();
        let mut cmd = host.agent(&agent_bin(), &["run"]);
        cmd.envs(env.iter().copied());
        Command::from(cmd)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    }

    /// What host `name`'s agent logged.
    pub fn agent_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.work.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    pub fn set_seconds(&self, s: f64) {
        std::fs::write(self.work.path().join("seconds"), s.to_string()).unwrap();
    }

    pub fn fail(&self, host: &str, fail: bool) {
        let p = self.work.path().join(format!("fail-{host}"));
        if fail {
            std::fs::write(p, "").unwrap();
        } else {
            let _ = std::fs::remove_file(p);
        }
    }

    /// Every run in the shared log, in start order.
    pub fn runs(&self) -> Vec<Run> {
        let text = std::fs::read_to_string(self.work.path().join("runs.log")).unwrap_or_default();
        let mut runs: Vec<Run> = Vec::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [kind, host, version, at] = f[..] else {
                continue;
            };
            let at: f64 = at.parse().unwrap();
            match kind {
                "start" => runs.push(Run {
                    host: host.into(),
                    version: version.into(),
                    start: at,
                    end: None,
                }),
                _ => {
                    if let Some(r) = runs.iter_mut().rev().find(|r| r.host == host && r.end.is_none()) {
                        r.end = Some(at);
                    }
                }
            }
        }
        runs
    }

    /// Runs of `version` started so far.
    pub fn started(&self, version: &str) -> usize {
        self.runs().iter().filter(|r| r.version == version).count()
    }

    pub fn all_at(&self, v: &str) -> bool {
        self.hosts.iter().all(|h| h.local_version().as_deref() == Some(v))
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for d in &mut self.daemons {
            let _ = d.start_kill();
        }
    }
}

/// The most runs that overlapped at one instant (runs starting after `from` and
/// the ones still running then), from the log alone.
pub fn max_overlap(runs: &[Run], from: f64) -> (usize, Vec<String>) {
    let mut best = (0, Vec::new());
    for r in runs.iter().filter(|r| r.start >= from) {
        let t = r.start;
        let at: Vec<String> = runs
            .iter()
            .filter(|o| o.start <= t && o.end.is_none_or(|e| e > t))
            .map(|o| format!("{}@{}", o.host, o.version))
            .collect();
        if at.len() > best.0 {
            best = (at.len(), at);
        }
    }
    best
}

pub async fn keys_under(s: &DynStore, prefix: &str) -> BTreeMap<String, String> {
    s.list(&jio_common::keys::Key::new(prefix).unwrap())
        .await
        .unwrap()
        .kvs
        .into_iter()
        .map(|kv| (kv.key.to_string(), kv.value))
        .collect()
}

/// A real etcd with agents `names` converged to v1, their runs taking `seconds`;
/// keep the `Etcd` alive for the test's length.
pub async fn fleet_on_etcd(names: &[&str], seconds: f64) -> (jio_tests::Etcd, String, Fleet) {
    let etcd = jio_tests::Etcd::start().await;
    let url = etcd.url();
    let f = Fleet::start(&url, names, seconds).await;
    (etcd, url, f)
}

/// Registers host `name` of `role` in the store, as an agent would at its start;
/// no agent runs for it.
pub async fn register_host(s: &DynStore, name: &str, role: &str) {
    let record = format!(r#"{{"role":"{role}","agent_version":"0.1.0","addresses":[],"first_seen":1}}"#);
    s.put(
        &jio_common::keys::Key::new(format!("/hosts/{name}")).unwrap(),
        &record,
        None,
    )
    .await
    .unwrap();
}

/// Registers hosts `{role}{from}` .. `{role}{from + n - 1}` in the store at once
/// (no agent runs for them), every `failed_every`th with a failed run of
/// `version` on record; the names of those failed.
pub async fn register_hosts(
    s: &DynStore,
    role: &str,
    (from, n): (usize, usize),
    failed_every: usize,
    version: &str,
) -> Vec<String> {
    use jio_common::store::{Op, Txn};
    let key = |k: String| jio_common::keys::Key::new(k).unwrap();
    let record = format!(r#"{{"role":"{role}","agent_version":"0.1.0","addresses":[],"first_seen":1}}"#);
    let mut ops = Vec::new();
    let mut failed = Vec::new();
    for i in from..from + n {
        let h = format!("{role}{i}");
        ops.push(Op::put(key(format!("/hosts/{h}")), record.as_str()));
        if i % failed_every == 0 {
            ops.push(Op::put(
                key(format!("/status/configured/failure/{version}/{h}")),
                "",
            ));
            failed.push(h);
        }
    }
    for chunk in ops.chunks(100) {
        s.txn(Txn {
            compares: vec![],
            ops: chunk.to_vec(),
        })
        .await
        .unwrap();
    }
    failed
}
