//! The reboot that ends a run, decided without I/O: whether one is wanted, and what
//! a pass does while one is journaled.
//!
//! A run that needs a reboot keeps its slot through it: the agent journals the
//! reboot with the boot id it is leaving, keeps its run marker (state `rebooting`),
//! and runs the reboot command. At its next start it finds the journaled reboot:
//! a new boot id means the host is back (it validates again, and only then reports
//! the run and frees the slot); the same boot id past `reboot_timeout` means the
//! reboot never happened (the run failed). A host that still needs a reboot after
//! booting is failed, never rebooted again in the same run.

use std::path::PathBuf;
use std::time::Duration;

use jio_common::names::Version;
use serde::{Deserialize, Serialize};

pub use jio_common::rules::RebootPolicy;

/// The agent's reboot settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebootSettings {
    pub policy: RebootPolicy,
    /// Debian's `/var/run/reboot-required` (with its `.pkgs` beside it).
    pub required_file: PathBuf,
    /// Asked instead of the file when set: exit 0 = a reboot is required, 1 = not.
    pub check_command: Option<Vec<String>>,
    pub command: Vec<String>,
    /// How long after the reboot command the host must be back (new boot id).
    pub timeout: Duration,
    pub boot_id_file: PathBuf,
}

/// What says whether a reboot is required now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Required {
    /// The reboot-required file exists; the packages its `.pkgs` names.
    File {
        path: PathBuf,
        packages: Vec<String>,
    },
    /// The check command exited 0.
    Command(String),
    No,
}

/// Why the run ends with a reboot (`None`: it does not).
pub fn wanted(policy: RebootPolicy, required: &Required) -> Option<String> {
    match (policy, required) {
        (RebootPolicy::Never, _) => None,
        (RebootPolicy::Always, _) => Some("the agent's `reboot` setting is always".into()),
        (RebootPolicy::IfRequired, Required::No) => None,
        (RebootPolicy::IfRequired, r) => Some(required_text(r)),
    }
}

/// What a required reboot is required by, in words.
pub fn required_text(r: &Required) -> String {
    match r {
        Required::File { path, packages } if packages.is_empty() => format!("{} exists", path.display()),
        Required::File { path, packages } => {
            format!("{} exists (for {})", path.display(), packages.join(", "))
        }
        Required::Command(c) => format!("{c} says a reboot is required"),
        Required::No => "no reboot is required".into(),
    }
}

/// A run that ends with a reboot, in the journal until the host is back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebootWait {
    pub version: Version,
    /// When the run started, and the enable keys' revisions it started on.
    pub started: u64,
    pub gate_revisions: [jio_common::store::Revision; 3],
    pub run_dir: PathBuf,
    /// The rollout current when the run started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<String>,
    /// Why the host reboots.
    pub why: String,
    /// The boot id the host had when the run was validated.
    pub boot_id: String,
    /// When the reboot was journaled (the run was validated).
    pub since: u64,
    /// When the reboot command ran (`None`: not yet, waiting for a hold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked: Option<u64>,
    /// The fleet command (`jioctl reboot`) this reboot is the run of, if it is
    /// one: its result is reported instead of an upgrade's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The rollout has maintenance windows for this host: the reboot waits for the
    /// driver's permit (its host key rewritten after `waiting_rev`).
    #[serde(default)]
    pub permit: bool,
    /// The revision of the marker that said the reboot waits for its permit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_rev: Option<jio_common::store::Revision>,
}

/// What a pass does while a reboot is journaled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Not asked yet and held: wait (the slot is kept).
    Held(String),
    /// Not asked yet: run the reboot command.
    Reboot,
    /// Asked, same boot: wait until `until` (the reboot is under way).
    Wait { until: u64 },
    /// A new boot: validate again, then report.
    Back,
    /// Asked, and no new boot by the deadline: the run failed.
    NotBack(String),
}

/// What to do with `w`, the host's boot id now being `boot_id`.
pub fn next(w: &RebootWait, boot_id: &str, held: Option<String>, now: u64, timeout: Duration) -> Next {
    if boot_id != w.boot_id {
        return Next::Back;
    }
    match w.asked {
        None => match held {
            Some(h) => Next::Held(h),
            None => Next::Reboot,
        },
        Some(at) => {
            let until = at + timeout.as_secs();
            if now < until {
                Next::Wait { until }
            } else {
                Next::NotBack(format!(
                    "the host did not reboot within {} of the reboot command (boot id {} unchanged)",
                    jio_common::duration::format(timeout),
                    w.boot_id
                ))
            }
        }
    }
}

/// After the boot: the run's outcome given whether a reboot is still required.
pub fn after_boot(still: &Required) -> Result<(), String> {
    match still {
        Required::No => Ok(()),
        r => Err(format!(
            "a reboot is still required after rebooting ({}): not rebooting again in the same run",
            required_text(r)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(asked: Option<u64>) -> RebootWait {
        RebootWait {
            version: Version::new("v2").unwrap(),
            started: 10,
            gate_revisions: [1, 2, 3],
            run_dir: "/r".into(),
            rollout: None,
            why: "x".into(),
            boot_id: "aaa".into(),
            since: 90,
            asked,
            command: None,
            permit: false,
            waiting_rev: None,
        }
    }

    #[test]
    fn the_policy_and_what_requires_decide_whether_a_run_reboots() {
        let file = Required::File {
            path: "/var/run/reboot-required".into(),
            packages: vec!["linux-image-amd64".into()],
        };
        assert_eq!(wanted(RebootPolicy::Never, &file), None);
        assert_eq!(wanted(RebootPolicy::IfRequired, &Required::No), None);
        assert_eq!(
            wanted(RebootPolicy::IfRequired, &file).as_deref(),
            Some("/var/run/reboot-required exists (for linux-image-amd64)")
        );
        assert!(wanted(RebootPolicy::Always, &Required::No).is_some());
        assert!(
            RebootPolicy::parse("sometimes")
                .unwrap_err()
                .contains("never, if-required, always")
        );
    }

    #[test]
    fn a_journaled_reboot_waits_for_holds_then_for_a_new_boot_until_its_deadline() {
        let t = Duration::from_secs(600);
        assert_eq!(
            next(&wait(None), "aaa", Some("held (host c1)".into()), 100, t),
            Next::Held("held (host c1)".into())
        );
        assert_eq!(next(&wait(None), "aaa", None, 100, t), Next::Reboot);
        assert_eq!(
            next(&wait(Some(100)), "aaa", None, 699, t),
            Next::Wait { until: 700 }
        );
        assert!(
            matches!(next(&wait(Some(100)), "aaa", None, 700, t), Next::NotBack(r) if r.contains("within 10m") && r.contains("aaa"))
        );
        // A new boot id is the host back, whatever else holds.
        assert_eq!(
            next(&wait(Some(100)), "bbb", Some("held".into()), 5_000, t),
            Next::Back
        );
        assert_eq!(after_boot(&Required::No), Ok(()));
        assert!(
            after_boot(&Required::Command("check".into()))
                .unwrap_err()
                .contains("not rebooting again")
        );
    }
}
