//! Fleet commands' tests share: the actions (scripts that log their own start and
//! end to one file shared by the fleet), the checks on that log, and reading a
//! command's keys.

#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use jio_tests::inspect::{open, text, wait_for};
use tokio::process::Child;

use super::fleet::{Fleet, Run, keys_under};
use super::secs;

/// The fleet's actions directory. `restart` logs its start (with its arguments) and
/// end to `actions.log`, sleeps `action-seconds`, fails (exit 3) where
/// `action-fail-<host>` exists. `stubborn` logs its start, records its pid, starts a
/// grandchild that ignores SIGTERM (its pid recorded too), and sleeps a minute.
pub struct Actions {
    pub dir: tempfile::TempDir,
}

impl Actions {
    pub fn new() -> Actions {
        let dir = tempfile::tempdir().unwrap();
        let actions = dir.path().join("actions");
        std::fs::create_dir_all(&actions).unwrap();
        let d = dir.path().display().to_string();
        let restart = format!(
            "#!/bin/sh\n\
             dir={d}\n\
             echo \"start $JIO_HOST $JIO_COMMAND $(date +%s.%N) $*\" >> \"$dir/actions.log\"\n\
             echo $$ >> \"$dir/pids\"\n\
             sleep \"$(cat \"$dir/action-seconds\")\"\n\
             echo \"end $JIO_HOST $JIO_COMMAND $(date +%s.%N)\" >> \"$dir/actions.log\"\n\
             if [ -e \"$dir/action-fail-$JIO_HOST\" ]; then echo \"nova-compute did not come back on $JIO_HOST\" >&2; exit 3; fi\n\
             echo \"restarted $* on $JIO_HOST\"\n"
        );
        let stubborn = format!(
            "#!/bin/sh\n\
             dir={d}\n\
             echo \"start $JIO_HOST $JIO_COMMAND $(date +%s.%N) $*\" >> \"$dir/actions.log\"\n\
             echo $$ > \"$dir/stubborn-$JIO_HOST\"\n\
             sh -c 'trap \"\" TERM; echo $$ > \"$1\"; exec sleep 60' sh \"$dir/grandchild-$JIO_HOST\" &\n\
             sleep 60\n\
             echo \"end $JIO_HOST $JIO_COMMAND $(date +%s.%N)\" >> \"$dir/actions.log\"\n"
        );
        for (name, body) in [("restart", restart), ("stubborn", stubborn)] {
            let p = actions.join(name);
            std::fs::write(&p, body).unwrap();
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        }
        let a = Actions { dir };
        a.set_seconds(0.3);
        a
    }

    pub fn actions_dir(&self) -> PathBuf {
        self.dir.path().join("actions")
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The action fails (exit 3, a line on stderr) on `host` from now on.
    pub fn fail(&self, host: &str) {
        std::fs::write(self.path(&format!("action-fail-{host}")), "").unwrap();
    }

    pub fn set_seconds(&self, s: f64) {
        std::fs::write(self.path("action-seconds"), s.to_string()).unwrap();
    }

    /// The agents' configuration lines for these actions.
    pub fn config(&self, allow_any: bool) -> String {
        format!(
            "actions_dir = {}\nallow_any_command = {allow_any}\n",
            jio_tests::host::toml_str(&self.actions_dir().display().to_string())
        )
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path("actions.log")).unwrap_or_default()
    }

    pub fn runs(&self) -> Vec<Run> {
        parse_log(&self.log())
    }

    /// The pid written to file `name` (0 when absent).
    pub fn pid(&self, name: &str) -> i32 {
        std::fs::read_to_string(self.path(name))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    pub fn all_pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.path("pids"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

/// Runs from `start HOST TAG TIME ...` / `end HOST TAG TIME` lines (the tag is the
/// command id, or the version in Puppet's log).
pub fn parse_log(text: &str) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 4 {
            continue;
        }
        let (kind, host, tag, at) = (f[0], f[1], f[2], f[3].parse::<f64>().unwrap());
        match kind {
            "start" => runs.push(Run {
                host: host.into(),
                version: tag.into(),
                start: at,
                end: None,
            }),
            _ => {
                if let Some(r) = runs
                    .iter_mut()
                    .rev()
                    .find(|r| r.host == host && r.version == tag && r.end.is_none())
                {
                    r.end = Some(at);
                }
            }
        }
    }
    runs
}

pub fn max_overlap(runs: &[Run]) -> (usize, Vec<String>) {
    super::fleet::max_overlap(runs, 0.0)
}

/// Hosts whose action started more than once for `id`.
pub fn repeated(runs: &[Run], id: &str) -> Vec<String> {
    let mut seen = std::collections::BTreeMap::<&str, usize>::new();
    for r in runs.iter().filter(|r| r.version == id) {
        *seen.entry(r.host.as_str()).or_default() += 1;
    }
    seen.into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(h, _)| h.to_string())
        .collect()
}

/// The id a `jioctl run` printed on stderr (`command <id> recorded`).
pub fn command_id(stderr: &str) -> String {
    stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("jioctl: command ")
                .and_then(|r| r.split_once(" recorded"))
        })
        .map(|(id, _)| id.to_string())
        .unwrap_or_else(|| panic!("no command id in: {stderr}"))
}

pub async fn command_record(url: &str, id: &str) -> serde_json::Value {
    let s = open(url).await;
    let kv = s
        .get(&jio_common::keys::Key::new(format!("/commands/{id}")).unwrap())
        .await
        .unwrap()
        .unwrap();
    serde_json::from_str(&kv.value).unwrap()
}

pub async fn result_of(url: &str, id: &str, host: &str) -> Option<serde_json::Value> {
    let s = open(url).await;
    let kv = s
        .get(&jio_common::keys::Key::new(format!("/command_runs/{id}/results/{host}")).unwrap())
        .await
        .unwrap()?;
    Some(serde_json::from_str(&kv.value).unwrap())
}

pub fn diagnostics(f: &Fleet, a: &Actions) -> String {
    let mut s = format!("actions.log:\n{}\n", a.log());
    for h in &f.hosts {
        s.push_str(&format!("--- {}:\n{}\n", h.name, f.agent_log(&h.name)));
    }
    s
}

/// Waits until `host` has started an action (by the action's own log).
pub async fn wait_started(a: &Actions, host: &str) {
    wait_for(&format!("{host} to start the action"), secs(60), || async {
        a.runs().iter().any(|r| r.host == host)
    })
    .await;
}

/// Alive and not a zombie.
pub fn process_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 2..].chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

/// The child's output if it exits within `within`; otherwise it is killed and
/// `Err` holds what it printed so far.
pub async fn finish_or_kill(mut child: Child, within: Duration) -> Result<Output, String> {
    match tokio::time::timeout(within, child.wait()).await {
        Ok(_) => Ok(child.wait_with_output().await.unwrap()),
        Err(_) => {
            let _ = child.start_kill();
            let out = child.wait_with_output().await.unwrap();
            Err(text(&out))
        }
    }
}

pub async fn inbox_of(url: &str, host: &str) -> Option<String> {
    let s = open(url).await;
    keys_under(&s, "/config_state/commands/")
        .await
        .get(&format!("/config_state/commands/{host}"))
        .cloned()
}

/// Two runs on one host that overlapped in time.
pub fn same_host_overlaps(runs: &[Run]) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (i, a) in runs.iter().enumerate() {
        for b in &runs[i + 1..] {
            let a_end = a.end.unwrap_or(f64::MAX);
            let b_end = b.end.unwrap_or(f64::MAX);
            if a.host == b.host && a.start < b_end && b.start < a_end {
                out.push((a.host.clone(), a.version.clone(), b.version.clone()));
            }
        }
    }
    out
}

/// The pids of the running `restart` actions of `actions_dir`.
pub fn action_pids(actions_dir: &std::path::Path) -> Vec<i32> {
    let mut out = Vec::new();
    let want = actions_dir.join("restart").display().to_string();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmd).split('\0').any(|a| a == want) {
            out.push(pid);
        }
    }
    out
}

/// `jioctl <args>` run to its end, which must come within two minutes (a hang
/// fails the test instead of holding the suite).
pub async fn run_bounded(url: &str, args: &[&str]) -> Output {
    super::fleet::finish(super::fleet::spawn(url, args), secs(120)).await
}

/// A real etcd with agents `names` converged to v1 that run these actions
/// (`allow_any_command` off); keep the `Etcd` alive for the test's length.
pub async fn action_fleet(names: &[&str]) -> (jio_tests::Etcd, String, Actions, Fleet) {
    let etcd = jio_tests::Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let f = Fleet::start_with(&url, &url, names, 0.1, |_| a.config(false)).await;
    (etcd, url, a, f)
}

/// Checks that a `jioctl` exited with `code`, showing its output, the actions'
/// log and every agent's log otherwise.
#[track_caller]
pub fn assert_exit(out: &Output, code: i32, f: &Fleet, a: &Actions) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{}\n{}",
        text(out),
        diagnostics(f, a)
    );
}

/// `jioctl run --role compute --instructions <instructions> <action...>`'s arguments.
pub fn on_computes<'a>(instructions: &'a str, action: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["run", "--role", "compute", "--instructions", instructions];
    args.extend_from_slice(action);
    args
}

/// Records `restart` on the compute role under `instructions` with `run --detach`
/// (checking it exits 0) and returns the command's id it printed.
pub async fn record_detached(url: &str, instructions: &str) -> String {
    let mut args = vec!["run", "--detach"];
    args.extend(on_computes(instructions, &["restart"]).into_iter().skip(1));
    let rec = run_bounded(url, &args).await;
    assert_eq!(rec.status.code(), Some(0), "{}", text(&rec));
    String::from_utf8_lossy(&rec.stdout).trim().to_string()
}

/// Kills host `i`'s agent (SIGKILL) and waits for it to be gone.
pub async fn kill_agent(f: &mut Fleet, i: usize) {
    f.daemons[i].start_kill().unwrap();
    let _ = f.daemons[i].wait().await;
}

/// Waits until `host`'s agent record has expired from the store.
pub async fn wait_agent_gone(url: &str, host: &str) {
    let s = open(url).await;
    let key = format!("/agents/{host}");
    wait_for(&format!("{host}'s agent record to expire"), secs(20), || async {
        !keys_under(&s, "/agents/").await.contains_key(&key)
    })
    .await;
}

/// Checks that `runs` of command `id` are `n`, one per host, never two at once.
#[track_caller]
pub fn assert_once_each_one_at_a_time(runs: &[Run], id: &str, n: usize, a: &Actions) {
    assert_eq!(runs.len(), n, "{}", a.log());
    assert!(repeated(runs, id).is_empty(), "{}", a.log());
    let (most, at) = max_overlap(runs);
    assert_eq!(most, 1, "{at:?}\n{}", a.log());
}

/// The id of the first command recorded in the store (by key).
pub async fn first_command_id(s: &jio_common::store::DynStore) -> String {
    keys_under(s, "/commands/")
        .await
        .keys()
        .next()
        .unwrap()
        .trim_start_matches("/commands/")
        .to_string()
}

/// `jioctl run --hosts <hosts> --instructions <instructions> <action...>`'s arguments.
pub fn on_hosts<'a>(hosts: &'a str, instructions: &'a str, action: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["run", "--hosts", hosts, "--instructions", instructions];
    args.extend_from_slice(action);
    args
}

/// Every run that kept a host busy: Puppet's runs of v2 and the actions' runs.
pub fn v2_and_action_runs(f: &Fleet, a: &Actions) -> Vec<Run> {
    let mut all: Vec<Run> = f.runs().into_iter().filter(|r| r.version == "v2").collect();
    all.extend(a.runs());
    all
}

/// A host's row of a command's table joined with the rows below it (its log and
/// reason go there when they do not fit the row): "" when the table has none.
pub fn host_rows(table: &str, host: &str) -> String {
    let mut rows = table
        .lines()
        .skip_while(|l| l.split_whitespace().next() != Some(host));
    let Some(first) = rows.next() else {
        return String::new();
    };
    let below = rows.take_while(|l| l.starts_with("    ")).map(str::trim);
    std::iter::once(first.trim_end())
        .chain(below)
        .collect::<Vec<_>>()
        .join(" ")
}
