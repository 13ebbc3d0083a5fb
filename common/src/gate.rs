//! The enable gate: may a host run Puppet? Pure, shared by the agent and `jioctl`.
//!
//! The most specific `enable_puppet` key that is set decides: host, then role, then
//! global. When none is set the host is enabled (the original tool's default).

use crate::keys::EnableLevel;
use crate::names::{HostName, Role};

/// The three keys a host's gate reads (already parsed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GateKeys {
    pub host: Option<bool>,
    pub role: Option<bool>,
    pub global: Option<bool>,
}

/// Which level decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Host,
    Role,
    Global,
    /// No key is set.
    Default,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Host => "host",
            Level::Role => "role",
            Level::Global => "global",
            Level::Default => "default",
        }
    }

    /// The key level this names, for a given host and role.
    pub fn key_level(self, host: &HostName, role: &Role) -> Option<EnableLevel> {
        match self {
            Level::Host => Some(EnableLevel::Host(host.clone())),
            Level::Role => Some(EnableLevel::Role(role.clone())),
            Level::Global => Some(EnableLevel::Global),
            Level::Default => None,
        }
    }
}

/// The gate's answer and the level that gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Gate {
    pub enabled: bool,
    pub level: Level,
}

/// Looks up host, then role, then global.
pub fn decide(keys: GateKeys) -> Gate {
    let (enabled, level) = match (keys.host, keys.role, keys.global) {
        (Some(h), _, _) => (h, Level::Host),
        (None, Some(r), _) => (r, Level::Role),
        (None, None, Some(g)) => (g, Level::Global),
        (None, None, None) => (true, Level::Default),
    };
    Gate { enabled, level }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_specific_set_key_decides() {
        let t = Some(true);
        let f = Some(false);
        let table = [
            // host, role, global => enabled, level
            (None, None, None, true, Level::Default),
            (None, None, f, false, Level::Global),
            (None, None, t, true, Level::Global),
            (None, t, f, true, Level::Role),
            (None, f, t, false, Level::Role),
            (t, f, f, true, Level::Host),
            (f, t, t, false, Level::Host),
            (t, None, f, true, Level::Host),
            (f, None, None, false, Level::Host),
        ];
        for (host, role, global, enabled, level) in table {
            let g = decide(GateKeys { host, role, global });
            assert_eq!(
                (g.enabled, g.level),
                (enabled, level),
                "{host:?} {role:?} {global:?}"
            );
        }
    }
}
