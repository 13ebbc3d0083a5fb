//! Values stored under the schema's keys: booleans, timestamps and JSON records.
//!
//! Parsing is strict and every error names the key it came from, so an operator can
//! find and fix the offending entry.

use serde::{Deserialize, Serialize};

use crate::keys::Key;
use crate::names::{HostName, Role, Version};

/// A stored value could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("value {value:?} of key {key} is invalid: {rule}")]
pub struct ValueError {
    pub key: Key,
    pub value: String,
    pub rule: &'static str,
}

impl ValueError {
    pub fn new(key: &Key, value: &str, rule: &'static str) -> Self {
        ValueError {
            key: key.clone(),
            value: value.chars().take(80).collect(),
            rule,
        }
    }
}

/// Booleans are written as `true`/`false`.
pub fn format_bool(b: bool) -> &'static str {
    if b { "true" } else { "false" }
}

/// Reads `true`/`false`, the original tool's `True`/`False`, and `1`/`0`.
pub fn parse_bool(key: &Key, value: &str) -> Result<bool, ValueError> {
    match value {
        "true" | "True" | "1" => Ok(true),
        "false" | "False" | "0" => Ok(false),
        _ => Err(ValueError::new(
            key,
            value,
            "expected true or false (True/False and 1/0 are accepted too)",
        )),
    }
}

/// Reads a version value (of `/current_version`).
pub fn parse_version(key: &Key, value: &str) -> Result<Version, ValueError> {
    Version::new(value.trim()).map_err(|_| ValueError::new(key, value, "not a valid version name"))
}

/// Reads the Unix time stored under `/running/versions/<v>/<host>`. The original tool
/// wrote a float (`time.time()`), so fractional seconds are accepted and truncated.
pub fn parse_unix_time(key: &Key, value: &str) -> Result<u64, ValueError> {
    let v = value.trim();
    if let Ok(n) = v.parse::<u64>() {
        return Ok(n);
    }
    match v.parse::<f64>() {
        Ok(f) if f.is_finite() && f >= 0.0 => Ok(f as u64),
        _ => Err(ValueError::new(key, value, "expected a Unix time in seconds")),
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
    Upgrading,
    Failed,
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
}

/// Parses a JSON record, naming the key on failure.
pub fn parse_json<T: for<'de> Deserialize<'de>>(key: &Key, value: &str) -> Result<T, ValueError> {
    serde_json::from_str(value).map_err(|_| ValueError::new(key, value, "not a valid JSON record"))
}

/// Host names as the original tool keyed them, for messages only.
pub fn host_list(hosts: &[HostName]) -> String {
    hosts.iter().map(HostName::as_str).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k() -> Key {
        Key::new("/config_state/enable_puppet/global").unwrap()
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
            assert_eq!(parse_bool(&k(), s), Ok(want), "{s}");
        }
        assert_eq!(format_bool(true), "true");
        assert_eq!(format_bool(false), "false");
    }

    #[test]
    fn bad_booleans_name_the_key() {
        for bad in ["", "yes", "TRUE", " true", "2", "flase"] {
            let err = parse_bool(&k(), bad).unwrap_err();
            assert!(
                err.to_string().contains("/config_state/enable_puppet/global"),
                "{err}"
            );
        }
    }

    #[test]
    fn unix_times() {
        assert_eq!(parse_unix_time(&k(), "1700000000"), Ok(1_700_000_000));
        assert_eq!(parse_unix_time(&k(), "1425000000.123"), Ok(1_425_000_000));
        assert!(parse_unix_time(&k(), "-1").is_err());
        assert!(parse_unix_time(&k(), "soon").is_err());
        assert!(parse_unix_time(&k(), "NaN").is_err());
    }

    #[test]
    fn records_round_trip_and_reject_unknown_fields() {
        let rec = AgentRecord {
            state: AgentState::Upgrading,
            version: Some(Version::new("v2").unwrap()),
            since: 5,
            pid: 42,
        };
        let json = serde_json::to_string(&rec).unwrap();
        assert_eq!(json, r#"{"state":"upgrading","version":"v2","since":5,"pid":42}"#);
        assert_eq!(parse_json::<AgentRecord>(&k(), &json), Ok(rec));
        assert!(
            parse_json::<AgentRecord>(&k(), r#"{"state":"idle","version":null,"since":1,"pid":1,"x":1}"#)
                .is_err()
        );
        assert!(
            parse_json::<HostRecord>(&k(), r#"{"role":"a/b","agent_version":"1","first_seen":1}"#).is_err()
        );
    }
}
