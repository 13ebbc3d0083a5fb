//! Child processes under a contract: argument lists (never a shell string), a
//! timeout, the whole process group stopped on timeout or shutdown, stdout and
//! stderr copied concurrently to files with a size cap, and one table per kind of
//! command that turns an exit into an outcome.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::time::Instant;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::sync::watch;

/// Most bytes kept per stream; the rest is counted and dropped.
pub const MAX_OUTPUT: u64 = 16 * 1024 * 1024;
/// Time between SIGTERM and SIGKILL to the process group.
const KILL_AFTER: Duration = Duration::from_secs(5);

/// How a child ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    TimedOut(Duration),
    /// The agent is shutting down and the grace period ran out.
    Interrupted,
    NotStarted(String),
}

/// For logs: `exited 2`, `killed by signal 9`, `timed out after 30s`, ...
impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exited {c}"),
            Exit::Signal(s) => write!(f, "killed by signal {s}"),
            Exit::TimedOut(t) => write!(f, "timed out after {}", jio_common::duration::format(*t)),
            Exit::Interrupted => f.write_str("interrupted (the agent is stopping)"),
            Exit::NotStarted(e) => write!(f, "not started: {e}"),
        }
    }
}

/// An argument list for logs, as a shell would take it back: arguments with
/// spaces or quotes are single-quoted.
pub fn display_argv(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            let plain = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c));
            if plain {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A finished child.
#[derive(Debug, Clone)]
pub struct Finished {
    pub exit: Exit,
    pub elapsed: Duration,
}

/// What an exit means for a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Success { changes: bool },
    Failure(String),
    Interrupted,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        matches!(self, Outcome::Success { .. })
    }
}

/// `puppet apply --detailed-exitcodes`.
pub fn puppet_outcome(exit: &Exit) -> Outcome {
    match exit {
        Exit::Code(0) => Outcome::Success { changes: false },
        Exit::Code(2) => Outcome::Success { changes: true },
        Exit::Code(1) => {
            Outcome::Failure("puppet exited 1: the catalog did not compile (syntax or compile error)".into())
        }
        Exit::Code(4) => Outcome::Failure("puppet exited 4: some resources failed".into()),
        Exit::Code(6) => {
            Outcome::Failure("puppet exited 6: changes were made and some resources failed".into())
        }
        other => plain_failure("puppet", other),
    }
}

/// Commands that follow the usual convention: 0 is success.
pub fn plain_outcome(what: &str, exit: &Exit) -> Outcome {
    match exit {
        Exit::Code(0) => Outcome::Success { changes: false },
        other => plain_failure(what, other),
    }
}

fn plain_failure(what: &str, exit: &Exit) -> Outcome {
    match exit {
        Exit::Code(c) => Outcome::Failure(format!("{what} exited {c}")),
        Exit::Signal(s) => Outcome::Failure(format!("{what} was killed by signal {s}")),
        Exit::TimedOut(t) => Outcome::Failure(format!(
            "{what} did not finish within {} and was stopped",
            jio_common::duration::format(*t)
        )),
        Exit::Interrupted => Outcome::Interrupted,
        Exit::NotStarted(e) => Outcome::Failure(format!("{what} could not be started: {e}")),
    }
}

/// One command to run.
pub struct Spec<'a> {
    pub argv: &'a [String],
    pub env: &'a [(String, String)],
    pub timeout: Duration,
    /// Files receiving stdout and stderr (appended).
    pub stdout: &'a Path,
    pub stderr: &'a Path,
}

/// Runs `spec`. When `shutdown` turns true the child gets `grace` to finish on its
/// own, then its process group is stopped and the result is `Exit::Interrupted`.
pub async fn run(
    spec: &Spec<'_>,
    shutdown: &mut watch::Receiver<bool>,
    grace: Duration,
    on_spawn: impl FnOnce(ProcessGroup),
) -> Finished {
    let start = Instant::now();
    let finished = |exit| Finished {
        exit,
        elapsed: start.elapsed(),
    };
    let Some((program, args)) = spec.argv.split_first() else {
        return finished(Exit::NotStarted("empty command".into()));
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return finished(Exit::NotStarted(format!("{program}: {e}"))),
    };
    let pgid = child.id().map(|id| Pid::from_raw(id as i32));
    if let Some(id) = child.id()
        && let Some(start) = process_start_time(id)
    {
        on_spawn(ProcessGroup { pgid: id, start });
    }
    let out = tokio::spawn(copy_capped(child.stdout.take(), spec.stdout.to_path_buf()));
    let err = tokio::spawn(copy_capped(child.stderr.take(), spec.stderr.to_path_buf()));

    let deadline = tokio::time::sleep(spec.timeout);
    tokio::pin!(deadline);
    let mut stopping: Option<Exit> = None;
    let status = loop {
        if stopping.is_none() && *shutdown.borrow() {
            // Give the child its grace period, then stop it.
            match tokio::time::timeout(grace, child.wait()).await {
                Ok(s) => break s,
                Err(_) => {
                    stop_group(pgid, &mut child).await;
                    stopping = Some(Exit::Interrupted);
                    break child.wait().await;
                }
            }
        }
        tokio::select! {
            s = child.wait() => break s,
            _ = &mut deadline => {
                stop_group(pgid, &mut child).await;
                stopping = Some(Exit::TimedOut(spec.timeout));
                break child.wait().await;
            }
            changed = shutdown.changed() => {
                if changed.is_err() {
                    // The sender is gone: nobody can ask us to stop any more.
                    break child.wait().await;
                }
            }
        }
    };
    // After a normal exit nothing is killed (Puppet may have started daemons); output
    // still held open by a straggler is abandoned after a while.
    for copy in [out, err] {
        if tokio::time::timeout(KILL_AFTER, copy).await.is_err() {
            tracing::warn!(program = %program, "a process started by the command still holds its output open; no longer reading it");
        }
    }
    finished(stopping.unwrap_or_else(|| exit_of(status, program)))
}

/// How a child that was waited for ended.
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

/// A child's process group, identified so that it can be stopped after the agent
/// itself died, without ever hitting an unrelated process that reused the number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcessGroup {
    pub pgid: u32,
    /// The leader's start time in clock ticks since boot (`/proc/PID/stat`, field 22).
    pub start: u64,
}

/// The start time of process `pid`, from `/proc`.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; fields are counted after its closing ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The process `pid` that started at `start` still runs (exists and is not a
/// zombie).
fn running(pid: u32, start: u64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let Some(rest) = stat.rfind(')').and_then(|i| stat.get(i + 2..)) else {
        return false;
    };
    let mut fields = rest.split_whitespace();
    let state = fields.next();
    let started = fields.nth(18).and_then(|f| f.parse::<u64>().ok());
    started == Some(start) && !matches!(state, Some("Z" | "X"))
}

/// Stops a group left behind by an agent that died, if its leader is still the
/// same process. Returns whether it was found. Waits (without blocking the runtime)
/// up to `KILL_AFTER` for it to end before SIGKILL.
pub async fn stop_orphan(group: ProcessGroup) -> bool {
    if process_start_time(group.pgid) != Some(group.start) {
        return false;
    }
    let pg = Pid::from_raw(group.pgid as i32);
    let tree = process_tree(group.pgid);
    // A leader that already ended but was not reaped (a zombie: no init reaps it
    // in a container) ran nothing any more: nothing was left running.
    if tree.iter().all(|&(pid, start)| !running(pid, start)) {
        return false;
    }
    signal_all(pg, &tree, Signal::SIGTERM);
    for _ in 0..50 {
        tokio::time::sleep(KILL_AFTER / 50).await;
        if tree.iter().all(|&(pid, start)| !running(pid, start)) {
            return true;
        }
    }
    signal_all(pg, &tree, Signal::SIGKILL);
    true
}

/// Stops the child's whole tree: its process group, and every descendant that left
/// the group (Puppet runs `exec` resources in a session of their own). The tree is
/// collected first, because children are re-parented once their parent dies.
/// SIGTERM first, SIGKILL for whatever is left after `KILL_AFTER`.
async fn stop_group(pgid: Option<Pid>, child: &mut tokio::process::Child) {
    let Some(pg) = pgid else {
        let _ = child.start_kill();
        return;
    };
    let tree = process_tree(pg.as_raw() as u32);
    signal_all(pg, &tree, Signal::SIGTERM);
    if tokio::time::timeout(KILL_AFTER, child.wait()).await.is_err() {
        signal_all(pg, &process_tree(pg.as_raw() as u32), Signal::SIGKILL);
    }
    signal_all(pg, &tree, Signal::SIGKILL);
}

fn signal_all(pg: Pid, tree: &[(u32, u64)], sig: Signal) {
    let _ = killpg(pg, sig);
    for &(pid, start) in tree {
        // Only the very process that was collected, never one that reused its number.
        if process_start_time(pid) == Some(start) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), sig);
        }
    }
}

/// `root` and all its descendants, with their start times.
pub fn process_tree(root: u32) -> Vec<(u32, u64)> {
    let mut parent_of: Vec<(u32, u32, u64)> = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let Some(close) = stat.rfind(')') else { continue };
            let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
            if let (Some(ppid), Some(start)) = (
                fields.get(1).and_then(|p| p.parse().ok()),
                fields.get(19).and_then(|p| p.parse().ok()),
            ) {
                parent_of.push((pid, ppid, start));
            }
        }
    }
    let mut tree: Vec<(u32, u64)> = parent_of
        .iter()
        .filter(|p| p.0 == root)
        .map(|p| (p.0, p.2))
        .collect();
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i].0;
        for p in &parent_of {
            if p.1 == parent && !tree.iter().any(|t| t.0 == p.0) {
                tree.push((p.0, p.2));
            }
        }
        i += 1;
    }
    tree
}

async fn copy_capped(src: Option<impl AsyncRead + Unpin>, path: std::path::PathBuf) {
    let Some(mut src) = src else { return };
    let mut file = match tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .await
    {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot write command output; discarding it");
            None
        }
    };
    let mut kept: u64 = 0;
    let mut dropped: u64 = 0;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match src.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let room = MAX_OUTPUT.saturating_sub(kept) as usize;
        let take = n.min(room);
        if let Some(f) = file.as_mut()
            && take > 0
            && f.write_all(&buf[..take]).await.is_err()
        {
            file = None;
        }
        kept += take as u64;
        dropped += (n - take) as u64;
    }
    if let Some(f) = file.as_mut() {
        if dropped > 0 {
            let _ = f
                .write_all(format!("\n[jio-agent: {dropped} more bytes of output were dropped]\n").as_bytes())
                .await;
        }
        let _ = f.flush().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_lists_and_exits_read_as_text() {
        let argv: Vec<String> = ["puppet", "apply", "--logdest", "/tmp/a b", "it's", ""]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            display_argv(&argv),
            r"puppet apply --logdest '/tmp/a b' 'it'\''s' ''"
        );
        assert_eq!(Exit::Code(6).to_string(), "exited 6");
        assert_eq!(Exit::Signal(9).to_string(), "killed by signal 9");
    }
    use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    async fn go(a: &[&str], timeout: Duration, dir: &Path) -> Finished {
        let (_tx, mut rx) = watch::channel(false);
        let cmd = argv(a);
        let spec = Spec {
            argv: &cmd,
            env: &[],
            timeout,
            stdout: &dir.join("out"),
            stderr: &dir.join("err"),
        };
        run(&spec, &mut rx, Duration::from_secs(1), |_| {}).await
    }

    #[test]
    fn exit_code_table() {
        let p = |c| puppet_outcome(&Exit::Code(c));
        assert_eq!(p(0), Outcome::Success { changes: false });
        assert_eq!(p(2), Outcome::Success { changes: true });
        for c in [1, 4, 6, 3, 127] {
            assert!(!p(c).ok(), "{c}");
        }
        assert!(!puppet_outcome(&Exit::TimedOut(Duration::from_secs(3))).ok());
        assert_eq!(puppet_outcome(&Exit::Interrupted), Outcome::Interrupted);
        assert!(plain_outcome("validation", &Exit::Code(0)).ok());
        assert!(!plain_outcome("validation", &Exit::Code(1)).ok());
    }

    #[tokio::test]
    async fn captures_output_and_exit_code() {
        let d = tempfile::tempdir().unwrap();
        let f = go(
            &["sh", "-c", "echo out; echo err >&2; exit 3"],
            Duration::from_secs(5),
            d.path(),
        )
        .await;
        assert_eq!(f.exit, Exit::Code(3));
        assert_eq!(std::fs::read_to_string(d.path().join("out")).unwrap(), "out\n");
        assert_eq!(std::fs::read_to_string(d.path().join("err")).unwrap(), "err\n");
    }

    /// Whether `pid` ends (gone, or a zombie nobody reaps) within a second: a signal
    /// is delivered when the process is next scheduled, which on a loaded machine is
    /// not at once. A process left running stays, and fails this.
    async fn dies(pid: u32) -> bool {
        for _ in 0..100 {
            let running =
                std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z"));
            if !running {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    #[tokio::test]
    async fn timeout_stops_the_whole_group() {
        let d = tempfile::tempdir().unwrap();
        let pidfile = d.path().join("grandchild");
        let script = format!("sleep 300 & echo $! > {}; wait", pidfile.display());
        let f = go(&["sh", "-c", &script], Duration::from_millis(500), d.path()).await;
        assert!(matches!(f.exit, Exit::TimedOut(_)), "{:?}", f.exit);
        let pid: u32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        // The grandchild was in the group: it must be gone.
        assert!(dies(pid).await, "grandchild {pid} survived the timeout");
    }

    /// A group whose leader already ended (a zombie nobody reaped) left nothing
    /// running: not "stopped".
    #[tokio::test]
    async fn a_finished_orphan_is_not_stopped() {
        let mut child = std::process::Command::new("true")
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id();
        let start = process_start_time(pgid).unwrap();
        // Not reaped yet: a zombie once it exits.
        for _ in 0..100 {
            if !running(pgid, start) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(process_start_time(pgid), Some(start), "still a zombie");
        assert!(!stop_orphan(ProcessGroup { pgid, start }).await);
        child.wait().unwrap();
    }

    #[tokio::test]
    async fn orphans_are_identified_by_start_time() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id();
        let start = process_start_time(pgid).unwrap();
        // A different start time is a different process: left alone.
        assert!(
            !stop_orphan(ProcessGroup {
                pgid,
                start: start + 1
            })
            .await
        );
        assert!(child.try_wait().unwrap().is_none());
        assert!(stop_orphan(ProcessGroup { pgid, start }).await);
        assert!(child.wait().unwrap().signal().is_some());
    }

    #[tokio::test]
    async fn timeout_stops_descendants_in_other_sessions() {
        let d = tempfile::tempdir().unwrap();
        let pidfile = d.path().join("detached");
        let script = format!(
            "setsid sleep 300 > /dev/null 2>&1 & echo $! > {}; wait",
            pidfile.display()
        );
        // Long enough for the shell to have started its detached child even on a
        // loaded machine (right after a build): the test is about stopping it, not
        // about a fork racing the timeout.
        let f = go(&["sh", "-c", &script], Duration::from_secs(3), d.path()).await;
        assert!(matches!(f.exit, Exit::TimedOut(_)), "{:?}", f.exit);
        let pid: u32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        assert!(
            dies(pid).await,
            "the detached descendant {pid} survived the timeout"
        );
    }

    #[tokio::test]
    async fn normal_exit_leaves_started_daemons_alone() {
        let d = tempfile::tempdir().unwrap();
        let pidfile = d.path().join("daemon");
        let script = format!(
            "setsid sleep 30 > /dev/null 2>&1 < /dev/null & echo $! > {}",
            pidfile.display()
        );
        let f = go(&["sh", "-c", &script], Duration::from_secs(5), d.path()).await;
        assert_eq!(f.exit, Exit::Code(0));
        let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        assert!(
            std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "a daemon the command started was killed"
        );
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
    }

    #[tokio::test]
    async fn missing_program_is_not_started() {
        let d = tempfile::tempdir().unwrap();
        let f = go(&["/nonexistent/program"], Duration::from_secs(1), d.path()).await;
        assert!(matches!(f.exit, Exit::NotStarted(_)));
    }

    #[tokio::test]
    async fn output_is_capped() {
        let d = tempfile::tempdir().unwrap();
        let f = go(
            &["sh", "-c", "head -c 20000000 /dev/zero"],
            Duration::from_secs(20),
            d.path(),
        )
        .await;
        assert_eq!(f.exit, Exit::Code(0));
        let len = std::fs::metadata(d.path().join("out")).unwrap().len();
        assert!(len > MAX_OUTPUT && len < MAX_OUTPUT + 200, "{len}");
    }

    #[tokio::test]
    async fn shutdown_waits_for_grace_then_interrupts() {
        let d = tempfile::tempdir().unwrap();
        let (tx, mut rx) = watch::channel(false);
        let cmd = argv(&["sleep", "300"]);
        let spec = Spec {
            argv: &cmd,
            env: &[],
            timeout: Duration::from_secs(60),
            stdout: &d.path().join("out"),
            stderr: &d.path().join("err"),
        };
        let t = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            tx.send(true).unwrap();
            tx
        });
        let f = run(&spec, &mut rx, Duration::from_millis(300), |_| {}).await;
        assert_eq!(f.exit, Exit::Interrupted);
        assert!(f.elapsed >= Duration::from_millis(500));
        drop(t.await);
    }
}
