//! Values stored under the schema's keys: booleans, timestamps and JSON records.
//!
//! Parsing is strict and every error names the key it came from, so an operator can
//! find and fix the offending entry. Every parser takes the `KeyValue` as read, so a
//! value that is not UTF-8 text is refused here, like any other invalid value, and
//! never by the store layer for a whole listing. The agent and `jioctl` use the
//! same parsers, so both read a value the same way.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::keys::{Key, Outcome};
use crate::names::{HostName, Role, Version};
use crate::store::api::{KeyValue, Revision};

/// A stored value could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("value {value:?} of key {key} is invalid: {rule}")]
pub struct ValueError {
    pub key: Key,
    pub value: String,
    pub rule: Cow<'static, str>,
}

impl ValueError {
    pub fn new(key: &Key, value: &str, rule: impl Into<Cow<'static, str>>) -> Self {
        ValueError {
            key: key.clone(),
            value: value.chars().take(80).collect(),
            rule: rule.into(),
        }
    }
}

/// Booleans are written as `true`/`false`.
pub fn format_bool(b: bool) -> &'static str {
    if b { "true" } else { "false" }
}

/// The value as text; a value that is not UTF-8 is an error naming the key.
pub fn text(kv: &KeyValue) -> Result<&str, ValueError> {
    if kv.not_text {
        Err(ValueError::new(&kv.key, &kv.value, "not UTF-8 text"))
    } else {
        Ok(&kv.value)
    }
}

/// Reads `true`/`false`, the original tool's `True`/`False`, and `1`/`0`.
pub fn parse_bool(kv: &KeyValue) -> Result<bool, ValueError> {
    match text(kv)? {
        "true" | "True" | "1" => Ok(true),
        "false" | "False" | "0" => Ok(false),
        other => Err(ValueError::new(
            &kv.key,
            other,
            "expected true or false (True/False and 1/0 are accepted too)",
        )),
    }
}

/// Reads a version value (of `/current_version`). An empty value is `None`
/// (no desired version), as the original tool treated it.
pub fn parse_version(kv: &KeyValue) -> Result<Option<Version>, ValueError> {
    let t = text(kv)?.trim();
    if t.is_empty() {
        return Ok(None);
    }
    Version::new(t)
        .map(Some)
        .map_err(|e| ValueError::new(&kv.key, t, format!("not a valid version name: {}", e.rule)))
}

/// Reads the Unix time stored under `/running/versions/<v>/<host>`. The original tool
/// wrote a float (`time.time()`), so fractional seconds are accepted and truncated.
pub fn parse_unix_time(kv: &KeyValue) -> Result<u64, ValueError> {
    let v = text(kv)?.trim();
    if let Ok(n) = v.parse::<u64>() {
        return Ok(n);
    }
    match v.parse::<f64>() {
        Ok(f) if f.is_finite() && f >= 0.0 => Ok(f as u64),
        _ => Err(ValueError::new(&kv.key, v, "expected a Unix time in seconds")),
    }
}

/// The registry record under `/hosts/<host>`, written by the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostRecord {
    pub role: Role,
    pub agent_version: String,
    #[serde(default)]
    pub addresses: Vec<InterfaceAddress>,
    /// Unix time the host first registered.
    pub first_seen: u64,
}

/// One address of one interface of a host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterfaceAddress {
    pub interface: String,
    pub address: String,
}

/// What an agent is doing, in its liveness record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentState {
    Idle,
    /// Running Puppet: an upgrade, or a repair after a failed health check.
    Upgrading,
    /// Running the idle health check (validation only).
    Checking,
    Failed,
    /// Running a fleet command's action (`jioctl run`).
    Command,
    /// Rebooting at the end of a run (or back from the reboot and validating): the
    /// run marker keeps the host's slot until it is back and validated.
    Rebooting,
}

impl AgentState {
    /// As written in the record.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentState::Idle => "idle",
            AgentState::Upgrading => "upgrading",
            AgentState::Checking => "checking",
            AgentState::Failed => "failed",
            AgentState::Command => "command",
            AgentState::Rebooting => "rebooting",
        }
    }

    /// The agent is running a command: the host holds a rolling slot whatever its
    /// gate and whatever version it runs.
    pub fn running(self) -> bool {
        matches!(
            self,
            AgentState::Upgrading | AgentState::Checking | AgentState::Command | AgentState::Rebooting
        )
    }
}

/// The liveness record under `/agents/<host>`, bound to the agent's lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentRecord {
    pub state: AgentState,
    /// The version the agent is running (idle) or moving to (upgrading, failed).
    pub version: Option<Version>,
    /// Unix time the agent entered this state.
    pub since: u64,
    pub pid: u32,
    /// Rebooting: by when (Unix time) the host must be back with a new boot id, or
    /// its run fails (`reboot_timeout`). Past it with no live agent, it is lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<u64>,
}

/// An agent rewrites its clock (`/running/clocks/<host>`) at least this often.
pub const CLOCK_REFRESH: std::time::Duration = std::time::Duration::from_secs(60);

/// Skew below this is not worth a word (a record travels, clocks tick in seconds).
pub const SKEW_TOLERANCE_MS: u64 = 5_000;

/// How far an agent's clock is off the reader's, as far as one record can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skew {
    /// Ahead by at least this many milliseconds (a record cannot be written in the
    /// reader's future).
    Ahead(u64),
    /// Behind by at least this many milliseconds (the record is at most
    /// `CLOCK_REFRESH` old, give or take the tolerance).
    Behind(u64),
}

impl Skew {
    /// For people: "its clock is at least 90 s behind this one".
    pub fn describe(self) -> String {
        let (ms, dir) = match self {
            Skew::Ahead(ms) => (ms, "ahead of"),
            Skew::Behind(ms) => (ms, "behind"),
        };
        format!(
            "its agent's clock is at least {} s {dir} this one (its clock key /running/clocks/<host>); windows are decided by the driver's clock, soaks and retries by the agent's",
            ms / 1000
        )
    }
}

impl Skew {
    /// The skew of an agent whose clock key says `clock_ms`, read at `now_ms` (the
    /// reader's Unix milliseconds), when it exceeds `SKEW_TOLERANCE_MS`: ahead when
    /// it says a time later than now, behind when it says a time older than the key
    /// can be (it is rewritten every `CLOCK_REFRESH`).
    pub fn of(clock_ms: u64, now_ms: u64) -> Option<Skew> {
        let refresh = CLOCK_REFRESH.as_millis() as u64;
        if clock_ms > now_ms.saturating_add(SKEW_TOLERANCE_MS) {
            Some(Skew::Ahead(clock_ms - now_ms))
        } else if now_ms.saturating_sub(clock_ms) > refresh + 2 * SKEW_TOLERANCE_MS {
            Some(Skew::Behind(now_ms - clock_ms - refresh))
        } else {
            None
        }
    }
}

/// A hold under `/holds/host/<host>` or `/holds/role/<role>`: the host (or every
/// host of the role) is kept out of every rollout until the hold is released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HoldRecord {
    pub by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Unix time the hold was placed.
    pub at: u64,
    /// Enable keys the hold wrote (to false) where none was set: its release
    /// deletes those still false, so it leaves no key behind it did not find.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub created_keys: Vec<String>,
}

/// How the host's last run ended, under `/results/<host>` (written by the agent in
/// the transaction that reports the run; the seed's `/status` leaves keep holding
/// log links).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostResult {
    /// The version the run moved to.
    pub version: Version,
    /// `true`: configured and validated.
    pub ok: bool,
    /// The step that failed (`configured` or `validated`; in a composable
    /// rollout also `pre-<k>`, `post-<k>` or `finalize`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// The service whose task failed (composable rollouts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The task that failed (composable rollouts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// The failed command's exit code (none when it timed out or could not start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// One line: what failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The run directory on the host (its logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_dir: Option<String>,
    /// The run's log in Swift, when uploaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
    /// Unix time the run ended.
    pub at: u64,
    /// Unix time of the last health check that passed at this version after the run
    /// (the soak of `min_healthy_time` needs one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked_at: Option<u64>,
    /// Which attempt at this version it was (1 for the first).
    #[serde(default = "one")]
    pub attempt: u32,
    /// When a failed run will be retried by the agent on its own (Unix time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<u64>,
    /// The rollout that was current when the run started (its id), so that which
    /// runs a rollout made is known without comparing two machines' clocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<String>,
    /// The installed package set after a successful run (its digest, and what the
    /// run changed); kept up to date by the agent when dpkg's status changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages: Option<crate::packages::PackageRecord>,
}

fn one() -> u32 {
    1
}

/// Parses a JSON record, naming the key and, where serde can tell, the field.
pub fn parse_json<T: for<'de> Deserialize<'de>>(kv: &KeyValue) -> Result<T, ValueError> {
    let t = text(kv)?;
    serde_json::from_str(t).map_err(|e| {
        let what = e.to_string();
        // serde says "unknown field `x`", "missing field `role`", "invalid type: ...";
        // the position is noise for a one-line record.
        let what = what.split(" at line ").next().unwrap_or(&what).to_string();
        ValueError::new(&kv.key, t, format!("not a valid JSON record: {what}"))
    })
}

/// Host names as the original tool keyed them, for messages only.
pub fn host_list(hosts: &[HostName]) -> String {
    hosts.iter().map(HostName::as_str).collect::<Vec<_>>().join(", ")
}

/// One service's step on one host, from `/status/steps/<rollout>/<phase>/<service>/...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepStatus {
    pub outcome: Outcome,
    /// The log link, or the reason.
    pub value: String,
    pub revision: Revision,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(value: &str) -> KeyValue {
        crate::store::api::fixtures::kv("/config_state/enable_puppet/global", value)
    }

    #[test]
    fn booleans_accept_legacy_spellings() {
        for (s, want) in [
            ("true", true),
            ("True", true),
            ("1", true),
            ("false", false),
            ("False", false),
            ("0", false),
        ] {
            assert_eq!(parse_bool(&kv(s)), Ok(want), "{s}");
        }
        assert_eq!(format_bool(true), "true");
        assert_eq!(format_bool(false), "false");
    }

    #[test]
    fn bad_booleans_name_the_key() {
        for bad in ["", "yes", "TRUE", " true", "2", "flase"] {
            let err = parse_bool(&kv(bad)).unwrap_err();
            assert!(
                err.to_string().contains("/config_state/enable_puppet/global"),
                "{err}"
            );
        }
    }

    #[test]
    fn bytes_that_are_not_text_are_an_invalid_value() {
        let bad = KeyValue::from_bytes(
            Key::new("/current_version").unwrap(),
            b"v\xff2".to_vec(),
            1,
            1,
            1,
            None,
        );
        assert!(bad.not_text);
        let err = parse_version(&bad).unwrap_err().to_string();
        assert!(
            err.contains("/current_version") && err.contains("not UTF-8") && err.contains("xff2"),
            "{err}"
        );
        assert!(parse_bool(&bad).is_err());
        assert!(parse_json::<AgentRecord>(&bad).is_err());
    }

    #[test]
    fn versions() {
        assert_eq!(parse_version(&kv(" v2\n")), Ok(Some(Version::new("v2").unwrap())));
        assert_eq!(parse_version(&kv("")), Ok(None));
        let err = parse_version(&kv("--help")).unwrap_err().to_string();
        assert!(err.contains("must not begin with '-'"), "{err}");
    }

    #[test]
    fn unix_times() {
        assert_eq!(parse_unix_time(&kv("1700000000")), Ok(1_700_000_000));
        assert_eq!(parse_unix_time(&kv("1425000000.123")), Ok(1_425_000_000));
        assert!(parse_unix_time(&kv("-1")).is_err());
        assert!(parse_unix_time(&kv("soon")).is_err());
        assert!(parse_unix_time(&kv("NaN")).is_err());
    }

    #[test]
    fn clock_skew_is_told_only_beyond_what_one_record_can_explain() {
        let now = 1_000_000_000u64;
        // (agent's clock, skew read at `now`)
        let table = [
            (None, None),
            (Some(now), None),
            (Some(now + 4_000), None),
            (Some(now + 90_000), Some(Skew::Ahead(90_000))),
            // Written up to a refresh ago: a minute old is not skew.
            (Some(now - 60_000), None),
            (Some(now - 69_000), None),
            (Some(now - 150_000), Some(Skew::Behind(90_000))),
        ];
        for (clock, want) in table {
            assert_eq!(clock.and_then(|c| Skew::of(c, now)), want, "{clock:?}");
        }
        assert!(Skew::Behind(90_000).describe().contains("at least 90 s behind"));
    }

    #[test]
    fn records_round_trip_and_name_the_bad_field() {
        let rec = AgentRecord {
            state: AgentState::Upgrading,
            version: Some(Version::new("v2").unwrap()),
            since: 5,
            pid: 42,
            until: None,
        };
        let json = serde_json::to_string(&rec).unwrap();
        assert_eq!(json, r#"{"state":"upgrading","version":"v2","since":5,"pid":42}"#);
        assert_eq!(parse_json::<AgentRecord>(&kv(&json)), Ok(rec));
        let err =
            parse_json::<AgentRecord>(&kv(r#"{"state":"idle","version":null,"since":1,"pid":1,"x":1}"#))
                .unwrap_err()
                .to_string();
        assert!(err.contains("unknown field `x`"), "{err}");
        let err = parse_json::<HostRecord>(&kv(r#"{"role":"a/b","agent_version":"1","first_seen":1}"#))
            .unwrap_err()
            .to_string();
        assert!(err.contains("must not contain '/'"), "{err}");
        let err = parse_json::<HostRecord>(&kv(r#"{"agent_version":"1","first_seen":1}"#))
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing field `role`"), "{err}");
    }
}
