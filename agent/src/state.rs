//! What the agent keeps on the host: the single-instance lock, the local version
//! file, the Facter fact, and the journal of runs (crash-safe, written atomically).
//!
//! The journal is what makes faults recoverable: a run that was in progress when the
//! agent died is found at the next start, and results that could not reach the store
//! stay here until they do.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use jio_common::keys::Step;
use jio_common::names::Version;
use jio_common::store::Revision;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

/// A state-file problem, naming the path.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("another jio-agent ({holder}) is already running on this host (lock {path})")]
    Locked { path: PathBuf, holder: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `data` to `path` atomically (temporary file, fsync, rename).
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<(), StateError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let tmp = path.with_extension("tmp-jio");
    let mut f = File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(data).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && let Ok(d) = File::open(dir)
    {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Holds the single-instance lock until dropped.
pub struct InstanceLock {
    _lock: Flock<File>,
}

/// Takes the agent's lock in `state_dir`, or says who holds it.
pub fn lock(state_dir: &Path) -> Result<InstanceLock, StateError> {
    std::fs::create_dir_all(state_dir).map_err(io(state_dir))?;
    let path = state_dir.join("agent.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(io(&path))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(mut lock) => {
            lock.set_len(0).map_err(io(&path))?;
            writeln!(&mut *lock, "{}", std::process::id()).map_err(io(&path))?;
            Ok(InstanceLock { _lock: lock })
        }
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
            let holder = std::fs::read_to_string(&path)
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .map(|pid| format!("pid {pid}"))
                .unwrap_or_else(|| "another process".into());
            Err(StateError::Locked { path, holder })
        }
        Err((_, e)) => Err(StateError::Io {
            path,
            source: e.into(),
        }),
    }
}

/// The version this host last converged to; `None` when it never did.
pub fn read_local_version(path: &Path) -> Result<Option<Version>, StateError> {
    match std::fs::read_to_string(path) {
        Ok(s) if s.trim().is_empty() => Ok(None),
        Ok(s) => Version::new(s.trim()).map(Some).map_err(|e| StateError::Invalid {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StateError::Io {
            path: path.to_path_buf(),
            source: e,
        }),
    }
}

pub fn write_local_version(path: &Path, v: &Version) -> Result<(), StateError> {
    write_atomic(path, format!("{v}\n").as_bytes())
}

/// The Facter fact the Puppet code reads (`current_version=<v>`).
pub fn write_fact(path: &Path, v: &Version) -> Result<(), StateError> {
    write_atomic(path, format!("current_version={v}\n").as_bytes())
}

/// A run that started and has not ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunStart {
    pub version: Version,
    pub started: u64,
    pub pid: u32,
    pub run_dir: PathBuf,
    /// The command running now, so a restarted agent can stop what a killed one left.
    #[serde(default)]
    pub child: Option<crate::runner::ProcessGroup>,
}

/// How the last run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunResult {
    Success,
    Failed,
    Interrupted,
}

impl RunResult {
    /// As stored and shown: `success`, `failed`, `interrupted`.
    pub fn as_str(self) -> &'static str {
        match self {
            RunResult::Success => "success",
            RunResult::Failed => "failed",
            RunResult::Interrupted => "interrupted",
        }
    }
}

/// The last finished (or interrupted) run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastRun {
    pub version: Version,
    pub started: u64,
    pub finished: u64,
    pub result: RunResult,
    /// The step that failed, or the last step that ran.
    pub step: String,
    pub reason: Option<String>,
    pub run_dir: PathBuf,
}

/// A step's outcome that must still be written to the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingReport {
    pub version: Version,
    #[serde(with = "step_serde")]
    pub step: Step,
    pub ok: bool,
    /// The value of the status leaf: a link to the logs, or empty.
    pub link: String,
    /// Unix time the step ended.
    pub at: u64,
    /// The step's composed log, to upload once the report is in the store.
    #[serde(default)]
    pub log: Option<PathBuf>,
    /// Its object name in Swift.
    #[serde(default)]
    pub object: Option<String>,
    /// The host's run result, written in the same transaction (the report of the
    /// run's last step, or of a failed soak).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<jio_common::values::HostResult>,
    /// A service's step of a composable rollout (then `step` is unused): its
    /// status entry is `/status/steps/<rollout>/<phase>/<service>/...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskRef>,
}

/// Which service's step a report is of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRef {
    pub rollout: String,
    /// `pre-<k>`, `post-<k>` or `finalize`.
    pub phase: String,
    pub service: jio_common::names::Service,
}

/// What this host did of a composable rollout's steps.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskJournal {
    /// The rollout (its id): anything else is forgotten when another begins.
    pub rollout: String,
    /// Tasks that succeeded: `<phase>/<service>/<task name>`.
    #[serde(default)]
    pub done: BTreeSet<String>,
    /// Services whose step succeeded: `<phase>/<service>`.
    #[serde(default)]
    pub finished: BTreeSet<String>,
    /// The phase a task of this host failed in (cleared when that phase passes):
    /// no later phase runs meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

mod step_serde {
    use jio_common::keys::Step;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(s: &Step, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_str(s.as_str())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Step, D::Error> {
        match String::deserialize(d)?.as_str() {
            "configured" => Ok(Step::Configured),
            "validated" => Ok(Step::Validated),
            other => Err(serde::de::Error::custom(format!("unknown step {other:?}"))),
        }
    }
}

/// The last failed upgrade, as the journal remembers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub version: Version,
    /// Unix time of the failure.
    pub at: u64,
    /// Consecutive failures at this version.
    pub attempts: u32,
    /// Mod revisions of the host, role and global enable keys the failed run was
    /// decided on; until the failure is in the store, any write to one of them
    /// (even of the same value) counts as a new decision.
    pub gate_revisions: [Revision; 3],
    /// The revision at which the failure's report landed. From then on only an
    /// enable key written after it counts as a new decision ("retry now"), as
    /// `jioctl status` counts a host as retrying: a write made while the run was
    /// still going, or before its failure was reported, is not one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported: Option<Revision>,
}

/// Fleet commands (`jioctl run`) on this host: what it finished, what it is
/// running, and the results not yet in the store. A command is in the journal
/// before its action starts, so an agent that dies while it runs reports it
/// `interrupted` at its next start instead of running it again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CommandJournal {
    /// Ids this host is done with (a result was written or is pending), oldest
    /// first; the newest `COMMANDS_KEPT` are kept.
    pub done: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_progress: Option<CommandRun>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreported: Vec<PendingCommandReport>,
}

/// Ids kept in `CommandJournal::done`: more than the store keeps (its history and
/// the active commands), so an id the store still admits the host to is known.
pub const COMMANDS_KEPT: usize = 500;

impl CommandJournal {
    pub fn is_done(&self, id: &str) -> bool {
        self.done.iter().any(|d| d == id)
    }

    pub fn mark_done(&mut self, id: &str) {
        if !self.is_done(id) {
            self.done.push(id.to_string());
        }
        if self.done.len() > COMMANDS_KEPT {
            let extra = self.done.len() - COMMANDS_KEPT;
            self.done.drain(..extra);
        }
    }
}

/// A command's action this host was about to start, or started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandRun {
    pub id: String,
    pub attempt: u32,
    pub started: u64,
    pub run_dir: PathBuf,
    /// The store took the start (before: it may or may not have).
    #[serde(default)]
    pub confirmed: bool,
    /// The command runs again after an interruption.
    #[serde(default)]
    pub rerun_interrupted: bool,
    /// The action's process group, so a restarted agent can stop it.
    #[serde(default)]
    pub child: Option<crate::runner::ProcessGroup>,
}

/// A command's result that must still be written to the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingCommandReport {
    pub id: String,
    pub result: jio_common::command_record::CommandResult,
    /// The composed output, to upload once the result is in the store, and its
    /// object name in Swift.
    #[serde(default)]
    pub log: Option<PathBuf>,
    #[serde(default)]
    pub object: Option<String>,
}

/// Where the versions this host is listed under are kept (`listed.json`).
pub fn listed_path(state_dir: &Path) -> PathBuf {
    state_dir.join("listed.json")
}

/// The versions under which this host has a `/running/versions` entry, as this
/// agent last wrote them, each with the revision of the report that wrote it. Only
/// the agent writes those entries (`forget-host` only deletes them), so it need not
/// list the whole fleet's to find its own: a listing of every host's entries by
/// every agent costs the store the square of the fleet. Before it is trusted, the
/// ledger checks that each entry is still in the store at that revision (an older
/// agent, or a state directory restored from an image, would have left it stale).
/// `None` when missing or unreadable.
pub fn load_listed(state_dir: &Path) -> Option<Vec<(Version, Revision)>> {
    let text = std::fs::read_to_string(listed_path(state_dir)).ok()?;
    let entries: Vec<(String, Revision)> = serde_json::from_str(&text).ok()?;
    entries
        .into_iter()
        .map(|(v, r)| Version::new(v).ok().map(|v| (v, r)))
        .collect()
}

/// Keeps `entries` as this host's listing (see `load_listed`). When it cannot be
/// written, the old file is removed (an unknown listing is read again; a stale one
/// would be trusted).
pub fn save_listed(state_dir: &Path, entries: &[(Version, Revision)]) -> Result<(), StateError> {
    let out: Vec<(&str, Revision)> = entries.iter().map(|(v, r)| (v.as_str(), *r)).collect();
    let text = serde_json::to_string(&out).unwrap_or_default();
    let path = listed_path(state_dir);
    write_atomic(&path, text.as_bytes()).inspect_err(|_| {
        let _ = std::fs::remove_file(&path);
    })
}

/// The journal file's content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Journal {
    pub in_progress: Option<RunStart>,
    pub last_run: Option<LastRun>,
    pub failure: Option<Failure>,
    pub unreported: Vec<PendingReport>,
    /// A composable rollout's steps done on this host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tasks: Option<TaskJournal>,
    /// Fleet commands on this host.
    #[serde(skip_serializing_if = "CommandJournal::is_empty")]
    pub commands: CommandJournal,
    /// A run that ends with a reboot, until the host is back (`crate::reboot`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reboot: Option<crate::reboot::RebootWait>,
}

impl CommandJournal {
    fn is_empty(&self) -> bool {
        self == &CommandJournal::default()
    }
}

impl Journal {
    pub fn path(state_dir: &Path) -> PathBuf {
        state_dir.join("journal.json")
    }

    pub fn load(state_dir: &Path) -> Result<Journal, StateError> {
        let path = Journal::path(state_dir);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| StateError::Invalid {
                path,
                reason: format!("not a valid journal ({e}); move it away to start afresh"),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Journal::default()),
            Err(e) => Err(StateError::Io { path, source: e }),
        }
    }

    pub fn save(&self, state_dir: &Path) -> Result<(), StateError> {
        let data = serde_json::to_vec_pretty(self).map_err(|e| StateError::Invalid {
            path: Journal::path(state_dir),
            reason: e.to_string(),
        })?;
        write_atomic(&Journal::path(state_dir), &data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_names_the_holder() {
        let d = tempfile::tempdir().unwrap();
        let _first = lock(d.path()).unwrap();
        let err = lock(d.path()).err().unwrap();
        let msg = err.to_string();
        assert!(msg.contains(&format!("pid {}", std::process::id())), "{msg}");
        drop(_first);
        assert!(lock(d.path()).is_ok());
    }

    #[test]
    fn local_version_round_trip_and_errors() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("etc/current_version");
        assert_eq!(read_local_version(&p).unwrap(), None);
        write_local_version(&p, &Version::new("v3").unwrap()).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "v3\n");
        assert_eq!(read_local_version(&p).unwrap(), Some(Version::new("v3").unwrap()));
        std::fs::write(&p, "not a/version\n").unwrap();
        assert!(
            read_local_version(&p)
                .unwrap_err()
                .to_string()
                .contains("current_version")
        );
    }

    #[test]
    fn journal_round_trip() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(Journal::load(d.path()).unwrap(), Journal::default());
        let j = Journal {
            unreported: vec![PendingReport {
                version: Version::new("v2").unwrap(),
                step: Step::Validated,
                ok: true,
                link: String::new(),
                at: 5,
                log: None,
                object: None,
                result: None,
                task: None,
            }],
            ..Journal::default()
        };
        j.save(d.path()).unwrap();
        assert_eq!(Journal::load(d.path()).unwrap(), j);
        std::fs::write(Journal::path(d.path()), "{").unwrap();
        assert!(
            Journal::load(d.path())
                .unwrap_err()
                .to_string()
                .contains("journal.json")
        );
    }
}
