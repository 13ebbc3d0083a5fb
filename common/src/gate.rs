//! The enable gate: may a host run Puppet? Pure, shared by the agent and `jioctl`.
//!
//! The most specific `enable_puppet` key that is set decides: host, then role, then
//! global. When none is set the host is enabled (the original tool's default). A key
//! that is set to something unreadable decides too: the host is **blocked**, with the
//! reason naming the key, on both sides (the agent does not start, `jioctl` neither
//! admits it nor counts it as moving).

use crate::keys::EnableLevel;
use crate::names::{HostName, Role};
use crate::store::KeyValue;
use crate::values::parse_bool;

/// One enable key as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum KeyState {
    #[default]
    Unset,
    Set(bool),
    /// Set, but not to a boolean: the parse error, naming the key.
    Invalid(String),
}

impl KeyState {
    /// Reads one key (absent is `Unset`).
    pub fn read(kv: Option<&KeyValue>) -> KeyState {
        match kv {
            None => KeyState::Unset,
            Some(kv) => match parse_bool(kv) {
                Ok(b) => KeyState::Set(b),
                Err(e) => KeyState::Invalid(e.to_string()),
            },
        }
    }
}

impl From<Option<bool>> for KeyState {
    fn from(b: Option<bool>) -> KeyState {
        b.map_or(KeyState::Unset, KeyState::Set)
    }
}

/// The three keys a host's gate reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GateKeys {
    pub host: KeyState,
    pub role: KeyState,
    pub global: KeyState,
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
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Gate {
    /// False when blocked.
    pub enabled: bool,
    pub level: Level,
    /// The deciding key holds an invalid value: why the host is blocked.
    pub blocked: Option<String>,
}

/// Looks up host, then role, then global.
pub fn decide(keys: &GateKeys) -> Gate {
    for (state, level) in [
        (&keys.host, Level::Host),
        (&keys.role, Level::Role),
        (&keys.global, Level::Global),
    ] {
        match state {
            KeyState::Unset => continue,
            KeyState::Set(b) => {
                return Gate {
                    enabled: *b,
                    level,
                    blocked: None,
                };
            }
            KeyState::Invalid(why) => {
                return Gate {
                    enabled: false,
                    level,
                    blocked: Some(why.clone()),
                };
            }
        }
    }
    Gate {
        enabled: true,
        level: Level::Default,
        blocked: None,
    }
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
            let g = decide(&GateKeys {
                host: host.into(),
                role: role.into(),
                global: global.into(),
            });
            assert_eq!(
                (g.enabled, g.level, g.blocked),
                (enabled, level, None),
                "{host:?} {role:?} {global:?}"
            );
        }
    }

    #[test]
    fn an_invalid_deciding_key_blocks() {
        let bad = KeyState::Invalid("value \"yes\" of key /k is invalid".into());
        // The invalid key decides when it is the most specific one set.
        let g = decide(&GateKeys {
            host: KeyState::Unset,
            role: KeyState::Unset,
            global: bad.clone(),
        });
        assert!(!g.enabled && g.level == Level::Global);
        assert!(g.blocked.unwrap().contains("/k"));
        let g = decide(&GateKeys {
            host: KeyState::Unset,
            role: bad.clone(),
            global: KeyState::Set(true),
        });
        assert!(!g.enabled && g.level == Level::Role && g.blocked.is_some());
        // A more specific valid key decides before it.
        let g = decide(&GateKeys {
            host: KeyState::Set(true),
            role: KeyState::Unset,
            global: bad,
        });
        assert!(g.enabled && g.blocked.is_none());
    }
}
