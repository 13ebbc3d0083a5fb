//! Run directories: `<state_dir>/runs/<start>-<version>`, holding each command's
//! output and Puppet's JSON log. Only the newest `KEEP_RUNS` are kept.

use std::path::{Path, PathBuf};

use jio_common::names::Version;
use jio_common::time::utc_stamp;

/// Runs kept in the state directory; older ones are removed.
const KEEP_RUNS: usize = 20;

/// Creates the directory of a run starting at `now`; the error is the directory
/// and the reason, naming it.
pub fn create(state_dir: &Path, version: &Version, now: u64) -> Result<PathBuf, (PathBuf, String)> {
    create_named(state_dir, version.as_str(), now)
}

/// Like `create`, for a run named `name` (a fleet command: `command-<id>`).
pub fn create_named(state_dir: &Path, name: &str, now: u64) -> Result<PathBuf, (PathBuf, String)> {
    let runs = state_dir.join("runs");
    let dir = runs.join(format!("{}-{}", utc_stamp(now), name));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        let reason = format!("cannot create the run directory {}: {e}", dir.display());
        return Err((dir, reason));
    }
    prune(&runs);
    Ok(dir)
}

fn prune(runs: &Path) {
    let Ok(rd) = std::fs::read_dir(runs) else { return };
    let mut dirs: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    if dirs.len() <= KEEP_RUNS {
        return;
    }
    dirs.sort();
    for d in &dirs[..dirs.len() - KEEP_RUNS] {
        let _ = std::fs::remove_dir_all(d);
    }
}
