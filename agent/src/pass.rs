//! What one pass of the agent did: the decision it took when nothing ran, or what
//! ran and how it ended. Read by the daemon, the CLI and the metrics.

use jio_common::names::Version;

use crate::decide::Decision;
use crate::state::RunResult;

/// What a pass did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PassResult {
    /// Nothing to do (up to date, disabled, waiting, held, no desired version).
    Idle(Decision),
    /// Earlier results were written to the store.
    Reported,
    /// An upgrade ran.
    Ran { version: Version, result: RunResult },
    /// A health check ran; `ok` says whether it passed.
    Checked { version: Version, ok: bool },
    /// A repair (Puppet, then the check) ran.
    Repaired { version: Version, ok: bool },
    /// What the decision read changed before the run could start: nothing ran.
    Raced,
    /// A fleet command's action ran (`Interrupted`: the agent is stopping; the
    /// journal keeps it for the next start).
    Command {
        id: String,
        outcome: jio_common::command_record::RunOutcome,
    },
    /// A health check or repair could not start on this host (its run directory
    /// cannot be made): logged, and tried again at the next check.
    Skipped { version: Version },
    /// A run ends with a reboot: waiting for a hold to go (`until` none) or for
    /// the new boot (by `until`, Unix time). The host keeps its slot.
    Rebooting { version: Version, until: Option<u64> },
}
