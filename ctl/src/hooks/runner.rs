//! One hook run under the child-process contract: an argument list (never a shell
//! string), its own process group, a timeout after which the whole group is
//! stopped (SIGTERM, then SIGKILL), stdout and stderr in one log file cut to a size
//! cap once it ended, and one table that turns the exit into an outcome.
//!
//! The output goes to the log file itself, not through pipes this process reads: a
//! hook must outlive a driver killed outright without dying of a broken pipe at its
//! next line of output (the next driver stops it cleanly, then runs it again).
//! The hook's environment is the driver's without jioctl's own settings and the
//! store clients' variables (no store credential reaches it), plus `JIO_HOST`,
//! `JIO_ROLE`, `JIO_VERSION`, `JIO_ROLLOUT` and `JIO_HOOK`.
//!
//! A driver that dies leaves its hook running; the process group is noted in a
//! file of the state directory so that the next driver on the same host stops it
//! (if it is still that very process) before it runs the hook again.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::sync::watch;
use tokio::time::Instant;

/// Most bytes of output kept in the log once the hook ended; the rest is dropped.
pub const MAX_OUTPUT: u64 = 16 * 1024 * 1024;
/// Time between SIGTERM and SIGKILL to the process group.
const KILL_AFTER: Duration = Duration::from_secs(5);
/// How much of the output's end goes into the hook's record.
const TAIL: u64 = 600;

/// Variables of the driver's environment that never reach a hook: jioctl's own
/// settings (the store URL among them) and the store clients'.
const WITHHELD: [&str; 4] = ["JIO_", "JIOCTL_", "ETCDCTL_", "CONSUL_"];

/// One hook to run.
pub struct Spec<'a> {
    pub argv: &'a [String],
    /// `JIO_HOST` and the others.
    pub vars: Vec<(&'static str, String)>,
    pub timeout: Duration,
    /// The log file (created, or appended to).
    pub log: &'a Path,
}

/// How a hook ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    TimedOut(Duration),
    NotStarted(String),
    /// Stopped by the driver (it lost the rollout lock, or is stopping): no outcome;
    /// whoever drives next runs it again.
    Stopped,
}

/// What an exit means: `Ok` on success, else why it failed; `None` when stopped.
pub fn outcome(exit: &Exit) -> Option<Result<(), String>> {
    Some(match exit {
        Exit::Code(0) => Ok(()),
        Exit::Code(c) => Err(format!("exited {c}")),
        Exit::Signal(s) => Err(format!("was killed by signal {s}")),
        Exit::TimedOut(t) => Err(format!(
            "did not finish within {} and was stopped",
            jio_common::duration::format(*t)
        )),
        Exit::NotStarted(e) => Err(format!("could not be started: {e}")),
        Exit::Stopped => return None,
    })
}

/// The exit code, when it exited.
pub fn code(exit: &Exit) -> Option<i32> {
    match exit {
        Exit::Code(c) => Some(*c),
        _ => None,
    }
}

/// Runs `spec` until it ends, times out, or `stop` turns true. `on_spawn` gets the
/// process group as soon as it runs.
pub async fn run(
    spec: &Spec<'_>,
    stop: &mut watch::Receiver<bool>,
    on_spawn: impl FnOnce(ProcessGroup),
) -> Exit {
    let Some((program, args)) = spec.argv.split_first() else {
        return Exit::NotStarted("empty command".into());
    };
    let file = match open_log(spec.log).await {
        Ok(f) => f,
        Err(e) => return Exit::NotStarted(format!("cannot write its log {}: {e}", spec.log.display())),
    };
    let (out, err) = match (file.try_clone(), file.try_clone()) {
        (Ok(o), Ok(e)) => (o, e),
        (Err(e), _) | (_, Err(e)) => return Exit::NotStarted(format!("its log {}: {e}", spec.log.display())),
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .process_group(0)
        .kill_on_drop(true);
    for (k, _) in std::env::vars_os() {
        if WITHHELD.iter().any(|p| k.to_string_lossy().starts_with(p)) {
            cmd.env_remove(k);
        }
    }
    cmd.envs(spec.vars.iter().map(|(k, v)| (k, v)));
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Exit::NotStarted(format!("{program}: {e}")),
    };
    let pgid = child.id();
    if let Some(id) = pgid
        && let Some(start) = process_start_time(id)
    {
        on_spawn(ProcessGroup { pgid: id, start });
    }
    let exit = tokio::select! {
        s = child.wait() => exit_of(s, program),
        _ = tokio::time::sleep(spec.timeout) => {
            stop_group(pgid, &mut child).await;
            Exit::TimedOut(spec.timeout)
        }
        _ = stopped(stop) => {
            stop_group(pgid, &mut child).await;
            Exit::Stopped
        }
    };
    cap(spec.log, MAX_OUTPUT);
    exit
}

/// Resolves when `stop` is (or turns) true; never when its sender is gone.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    loop {
        if *stop.borrow_and_update() {
            return;
        }
        if stop.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

async fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    if let Some(d) = path.parent() {
        tokio::fs::create_dir_all(d).await?;
    }
    let f = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .await?;
    Ok(f.into_std().await)
}

/// Cuts a log longer than `max` bytes to its first `max` bytes, and says so.
fn cap(log: &Path, max: u64) {
    use std::io::{Seek as _, Write as _};
    let Ok(len) = std::fs::metadata(log).map(|m| m.len()) else {
        return;
    };
    if len <= max {
        return;
    }
    if let Ok(mut f) = std::fs::OpenOptions::new().write(true).open(log)
        && f.set_len(max).is_ok()
        && f.seek(std::io::SeekFrom::End(0)).is_ok()
    {
        let _ = writeln!(f, "\n[jioctl: {} more bytes of output were dropped]", len - max);
    }
}

fn exit_of(status: std::io::Result<std::process::ExitStatus>, program: &str) -> Exit {
    match status {
        Ok(s) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)) {
            (Some(c), _) => Exit::Code(c),
            (None, Some(sig)) => Exit::Signal(sig),
            (None, None) => Exit::Code(-1),
        },
        Err(e) => Exit::NotStarted(format!("waiting for {program}: {e}")),
    }
}

/// The end of a log, a few short lines, for the hook's record.
pub fn tail(log: &Path) -> String {
    let Ok(bytes) = std::fs::read(log) else {
        return String::new();
    };
    let from = bytes.len().saturating_sub(TAIL as usize);
    let text = String::from_utf8_lossy(&bytes[from..]);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect();
    // The first line may be cut: keep whole lines when there is more than one.
    let skip = usize::from(from > 0 && lines.len() > 1);
    lines[skip..]
        .iter()
        .rev()
        .take(5)
        .rev()
        .copied()
        .collect::<Vec<_>>()
        .join("\n")
}

/// A hook's process group, identified so that it can be stopped after the driver
/// died without ever hitting an unrelated process that reused the number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcessGroup {
    pub pgid: u32,
    /// The leader's start time in clock ticks since boot (`/proc/PID/stat`, field 22).
    pub start: u64,
}

/// The start time of process `pid`, from `/proc`.
fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; fields are counted after its closing ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Stops the child's process group: SIGTERM, then SIGKILL after `KILL_AFTER`.
async fn stop_group(pgid: Option<u32>, child: &mut tokio::process::Child) {
    let Some(pg) = pgid.map(|p| Pid::from_raw(p as i32)) else {
        let _ = child.start_kill();
        return;
    };
    let _ = killpg(pg, Signal::SIGTERM);
    if tokio::time::timeout(KILL_AFTER, child.wait()).await.is_err() {
        let _ = killpg(pg, Signal::SIGKILL);
        let _ = child.wait().await;
    }
    // Whatever of the group outlived its leader.
    let _ = killpg(pg, Signal::SIGKILL);
}

/// Where a running hook's process group is noted: `<state_dir>/hooks/<host>.pgid`.
pub fn group_file(state_dir: &Path, host: &str) -> PathBuf {
    state_dir.join("hooks").join(format!("{host}.pgid"))
}

/// Stops the group noted in `file` by a driver of this host that died, if its
/// leader is still that very process; the note is removed. Returns whether a group
/// was stopped.
pub async fn stop_left_behind(file: &Path) -> bool {
    let Some(group) = std::fs::read_to_string(file)
        .ok()
        .and_then(|t| serde_json::from_str::<ProcessGroup>(&t).ok())
    else {
        return false;
    };
    let _ = std::fs::remove_file(file);
    if process_start_time(group.pgid) != Some(group.start) {
        return false;
    }
    let pg = Pid::from_raw(group.pgid as i32);
    let _ = killpg(pg, Signal::SIGTERM);
    let deadline = Instant::now() + KILL_AFTER;
    while Instant::now() < deadline && killpg(pg, None).is_ok() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = killpg(pg, Signal::SIGKILL);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    async fn go(a: &[&str], timeout: Duration, log: &Path) -> Exit {
        let (_tx, mut rx) = watch::channel(false);
        let cmd = argv(a);
        let spec = Spec {
            argv: &cmd,
            vars: vec![("JIO_HOST", "compute1".into())],
            timeout,
            log,
        };
        run(&spec, &mut rx, |_| {}).await
    }

    #[tokio::test]
    async fn exits_map_to_outcomes_and_the_output_lands_in_one_log() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("sub/h.log");
        let script = "echo out-$JIO_HOST; echo err >&2; sleep 0.2; echo last; exit 3";
        let exit = go(&["/bin/sh", "-c", script], Duration::from_secs(10), &log).await;
        assert_eq!(exit, Exit::Code(3));
        assert_eq!(outcome(&exit), Some(Err("exited 3".into())));
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains("out-compute1") && text.contains("err"), "{text}");
        assert!(tail(&log).ends_with("last"), "{}", tail(&log));
        let exit = go(&["/nonexistent/hook"], Duration::from_secs(10), &log).await;
        assert!(
            matches!(&exit, Exit::NotStarted(e) if e.contains("/nonexistent/hook")),
            "{exit:?}"
        );
        assert_eq!(
            outcome(&go(&["/bin/true"], Duration::from_secs(10), &log).await),
            Some(Ok(()))
        );
    }

    #[test]
    fn a_long_log_is_cut_and_says_so() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("h.log");
        std::fs::write(&log, "x".repeat(100)).unwrap();
        cap(&log, 40);
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.starts_with(&"x".repeat(40)), "{text}");
        assert!(
            text.ends_with("[jioctl: 60 more bytes of output were dropped]\n"),
            "{text}"
        );
        cap(&log, 1000);
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            text,
            "a short log is left alone"
        );
    }

    #[tokio::test]
    async fn a_timeout_stops_the_whole_group() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("h.log");
        let marker = d.path().join("late");
        let script = format!("(sleep 2; touch {}) & sleep 30", marker.display());
        let started = Instant::now();
        let exit = go(&["/bin/sh", "-c", &script], Duration::from_millis(300), &log).await;
        assert_eq!(exit, Exit::TimedOut(Duration::from_millis(300)));
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(
            outcome(&exit)
                .unwrap()
                .unwrap_err()
                .contains("did not finish within 300ms")
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!marker.exists(), "the group's background child was stopped too");
    }
}
