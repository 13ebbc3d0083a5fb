//! The hostname → role rule: a regex whose first capture group is the role. The
//! agent uses it for its own role when none is configured, `jioctl` for hosts that
//! have not registered (a registered host's role always comes from `/hosts/<host>`).
//! One rule, so that the two programs cannot disagree. No I/O here.

use std::fmt;

use regex::Regex;

use crate::names::{HostName, Role};

/// The original tool's rule: letters followed by digits (and optionally `-...`);
/// the letters are the role.
pub const DEFAULT_ROLE_PATTERN: &str = r"^([a-z]+)[0-9]+(-.*)?$";

/// A validated `role_pattern`.
#[derive(Debug, Clone)]
pub struct RolePattern(Regex);

/// Why a `role_pattern` was refused (the message names the pattern and the rule).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{pattern:?}: {reason}")]
pub struct RolePatternError {
    pub pattern: String,
    pub reason: String,
}

impl RolePattern {
    /// Compiles `pattern`; it must have a capture group (the role).
    pub fn new(pattern: &str) -> Result<RolePattern, RolePatternError> {
        let error = |reason: String| RolePatternError {
            pattern: pattern.to_string(),
            reason,
        };
        match Regex::new(pattern) {
            Ok(r) if r.captures_len() >= 2 => Ok(RolePattern(r)),
            Ok(_) => Err(error("needs a capture group that matches the role".into())),
            // The last line of the regex error says what is wrong, in one line.
            Err(e) => Err(error(
                e.to_string()
                    .lines()
                    .last()
                    .unwrap_or_default()
                    .trim()
                    .to_string(),
            )),
        }
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// The role from the host name: the first capture group (`compute12` →
    /// `compute`, `ocdb3-prod` → `ocdb` with the default). `None` when the name does
    /// not match or the group is not a valid role.
    pub fn role_of(&self, host: &HostName) -> Option<Role> {
        let caps = self.0.captures(host.as_str())?;
        Role::new(caps.get(1)?.as_str()).ok()
    }
}

impl Default for RolePattern {
    fn default() -> Self {
        RolePattern(Regex::new(DEFAULT_ROLE_PATTERN).unwrap_or_else(|_| unreachable!()))
    }
}

impl PartialEq for RolePattern {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for RolePattern {}

impl fmt::Display for RolePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_the_original_rule() {
        let p = RolePattern::default();
        for (host, role) in [
            ("compute12", Some("compute")),
            ("ocdb3-prod", Some("ocdb")),
            ("controller1", Some("controller")),
            ("stmonwithosd1", Some("stmonwithosd")),
            ("old9", Some("old")),
            ("gateway", None),
            ("12compute", None),
            ("Compute1", None),
            ("cp1x", None),
        ] {
            let got = p.role_of(&HostName::new(host).unwrap());
            assert_eq!(got.as_ref().map(Role::as_str), role, "{host}");
        }
    }

    #[test]
    fn a_configured_pattern_and_bad_ones() {
        let p = RolePattern::new(r"^[a-z]+-([a-z]+)-\d+$").unwrap();
        let h = HostName::new("bom-gateway-3").unwrap();
        assert_eq!(p.role_of(&h).unwrap().as_str(), "gateway");
        let e = RolePattern::new("^[a-z]+$").unwrap_err().to_string();
        assert!(e.contains("\"^[a-z]+$\"") && e.contains("capture group"), "{e}");
        let e = RolePattern::new("^(").unwrap_err().to_string();
        assert!(e.starts_with("\"^(\": "), "{e}");
    }
}
