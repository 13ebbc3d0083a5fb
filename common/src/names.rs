//! Validated names: host names, roles and versions.
//!
//! Every name that enters the program goes through here once; the rest of the code
//! holds these types, never bare strings, so a key can never be built from a name
//! that would escape its place in the key schema.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::time::utc_stamp;

/// Longest name accepted, in bytes (the DNS limit for a host name).
pub const MAX_NAME_BYTES: usize = 253;

/// The rule a rejected name broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    Empty,
    Slash,
    Whitespace,
    Control,
    Dot,
    TooLong,
    /// A leading `-` would read as an option to the commands names are passed to.
    Dash,
}

impl fmt::Display for NameRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NameRule::Empty => "must not be empty",
            NameRule::Slash => "must not contain '/'",
            NameRule::Whitespace => "must not contain whitespace",
            NameRule::Control => "must not contain control characters",
            NameRule::Dot => "must not be '.' or '..'",
            NameRule::TooLong => "must be at most 253 bytes",
            NameRule::Dash => "must not begin with '-' (it would read as a command-line option)",
        })
    }
}

/// A name was rejected: which kind of name, the value, and the rule it broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {value:?}: {rule}")]
pub struct NameError {
    pub what: &'static str,
    pub value: String,
    pub rule: NameRule,
}

fn check(what: &'static str, value: &str) -> Result<(), NameError> {
    let fail = |rule| {
        Err(NameError {
            what,
            // Bound what we echo back: a 1 MB "name" must not become a 1 MB error line.
            value: value.chars().take(80).collect(),
            rule,
        })
    };
    if value.is_empty() {
        return fail(NameRule::Empty);
    }
    if value.len() > MAX_NAME_BYTES {
        return fail(NameRule::TooLong);
    }
    if value == "." || value == ".." {
        return fail(NameRule::Dot);
    }
    if value.starts_with('-') {
        return fail(NameRule::Dash);
    }
    for c in value.chars() {
        if c == '/' {
            return fail(NameRule::Slash);
        }
        if c.is_control() {
            return fail(NameRule::Control);
        }
        if c.is_whitespace() {
            return fail(NameRule::Whitespace);
        }
    }
    Ok(())
}

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);
        name_type!(@common $name, $what);
    };
    // Sorted as people count: `compute2` before `compute10`.
    ($(#[$doc:meta])* natural $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub struct $name(String);
        name_type!(@common $name, $what);

        impl Ord for $name {
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                natural_cmp(&self.0, &other.0)
            }
        }

        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }
    };
    (@common $name:ident, $what:literal) => {

        impl $name {
            /// Validates `value` against the name rules.
            pub fn new(value: impl Into<String>) -> Result<Self, NameError> {
                let value = value.into();
                check($what, &value)?;
                Ok(Self(value))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = NameError;
            fn from_str(s: &str) -> Result<Self, NameError> {
                Self::new(s)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::new(s).map_err(serde::de::Error::custom)
            }
        }
    };
}

name_type!(
    /// A host name as it appears in keys (`compute12`, `ocdb3-prod`), in natural
    /// order everywhere (`gcp2` before `gcp10`), JSON included.
    natural HostName,
    "host name"
);
name_type!(
    /// A role (`compute`, `controller`): the group a host belongs to.
    natural Role,
    "role"
);
name_type!(
    /// A version of the whole fleet's configuration (`v2`, `2024.11.3`).
    Version,
    "version"
);
name_type!(
    /// A network interface name, as published under `/active_roles/`.
    Interface,
    "interface"
);
name_type!(
    /// A service of a composable rollout (`nova_compute`): the stem of its task file.
    Service,
    "service"
);

/// Natural order: runs of digits compare as numbers (`a2` < `a10`), the rest
/// byte by byte; names equal so far (`a01`, `a1`) fall back to byte order, so the
/// order agrees with equality.
pub fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    let (mut x, mut y) = (a.as_bytes(), b.as_bytes());
    while let (Some(&p), Some(&q)) = (x.first(), y.first()) {
        let ord = if p.is_ascii_digit() && q.is_ascii_digit() {
            let (dx, rx) = split_digits(x);
            let (dy, ry) = split_digits(y);
            (x, y) = (rx, ry);
            let (tx, ty) = (trim_zeros(dx), trim_zeros(dy));
            tx.len().cmp(&ty.len()).then_with(|| tx.cmp(ty))
        } else {
            (x, y) = (&x[1..], &y[1..]);
            p.cmp(&q)
        };
        if ord.is_ne() {
            return ord;
        }
    }
    x.len().cmp(&y.len()).then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

fn split_digits(s: &[u8]) -> (&[u8], &[u8]) {
    let n = s.iter().take_while(|b| b.is_ascii_digit()).count();
    s.split_at(n)
}

fn trim_zeros(d: &[u8]) -> &[u8] {
    let n = d.iter().take_while(|&&b| b == b'0').count();
    &d[n..]
}

impl HostName {
    /// The name could be a real host's (RFC 1123: ASCII letters, digits, '-' and
    /// '.'). Names from the store that are not are reported, never shown as hosts.
    pub fn is_dns_name(&self) -> bool {
        self.0
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    }
}

/// A command's id: its creation (`YYYYMMDDTHHMMSSZ`, so ids sort by time), a dash
/// and the action's name (`20261125T031500Z-restart-nova`), with `-2`, `-3`... when
/// taken.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CommandId(String);

impl CommandId {
    /// The id of a command of `action` created at `at` (`n` > 1: the n-th of that
    /// second).
    pub fn new(at: u64, action: &str, n: u32) -> CommandId {
        let base = action.rsplit('/').next().unwrap_or(action);
        let mut name: String = base
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                    c
                } else {
                    '-'
                }
            })
            .take(48)
            .collect();
        name = name.trim_matches(|c| c == '-' || c == '.').to_string();
        if name.is_empty() {
            name = "command".into();
        }
        if n > 1 {
            name = format!("{name}-{n}");
        }
        CommandId(format!("{}-{name}", utc_stamp(at)))
    }

    /// An id as read from the store or given by an operator.
    pub fn parse(s: &str) -> Option<CommandId> {
        let (stamp, name) = s.split_once('-')?;
        let stamp_ok = stamp.len() == 16
            && stamp.ends_with('Z')
            && stamp.chars().filter(|c| !c.is_ascii_digit()).eq(['T', 'Z']);
        let name_ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        (stamp_ok && name_ok).then(|| CommandId(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for CommandId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn hosts_sort_as_people_count() {
        let mut names: Vec<HostName> = [
            "gcp10",
            "gcp2",
            "gcp1",
            "a01",
            "a1",
            "a",
            "b",
            "ocdb3-prod",
            "ocdb10",
            "x9y10",
            "x9y9",
            "x10",
        ]
        .iter()
        .map(|n| HostName::new(*n).unwrap())
        .collect();
        names.sort();
        let got: Vec<&str> = names.iter().map(|h| h.as_str()).collect();
        assert_eq!(
            got,
            [
                "a",
                "a01",
                "a1",
                "b",
                "gcp1",
                "gcp2",
                "gcp10",
                "ocdb3-prod",
                "ocdb10",
                "x9y9",
                "x9y10",
                "x10"
            ]
        );
        // Agrees with equality: only equal names compare equal.
        for a in &names {
            for b in &names {
                assert_eq!(a.cmp(b).is_eq(), a == b, "{a} {b}");
                assert_eq!(a.cmp(b), b.cmp(a).reverse(), "{a} {b}");
            }
        }
    }
    use super::*;

    #[test]
    fn only_rfc_1123_names_are_dns_names() {
        for (name, ok) in [
            ("compute1", true),
            ("ocdb3-prod.lab", true),
            ("Bad_Host", false),
            ("é", false),
        ] {
            assert_eq!(HostName::new(name).unwrap().is_dns_name(), ok, "{name}");
        }
    }

    #[test]
    fn accepts_ordinary_names() {
        for ok in [
            "compute12",
            "ocdb3-prod",
            "v2",
            "2024.11.3",
            "a",
            "x..y",
            ".hidden",
        ] {
            assert!(HostName::new(ok).is_ok(), "{ok}");
            assert!(Version::new(ok).is_ok(), "{ok}");
        }
        let max = "a".repeat(253);
        assert!(Role::new(max).is_ok());
    }

    #[test]
    fn rejects_each_bad_input_with_its_rule() {
        let cases: &[(&str, NameRule)] = &[
            ("", NameRule::Empty),
            ("a/b", NameRule::Slash),
            ("/", NameRule::Slash),
            ("a b", NameRule::Whitespace),
            ("a\u{a0}b", NameRule::Whitespace),
            ("tab\there", NameRule::Control),
            ("nl\n", NameRule::Control),
            ("nul\0", NameRule::Control),
            (".", NameRule::Dot),
            ("..", NameRule::Dot),
            ("--help", NameRule::Dash),
            ("-v2", NameRule::Dash),
        ];
        for (bad, rule) in cases {
            let err = HostName::new(*bad).unwrap_err();
            assert_eq!(err.rule, *rule, "{bad:?}");
            assert_eq!(err.what, "host name");
        }
        let long = "a".repeat(254);
        assert_eq!(Version::new(long).unwrap_err().rule, NameRule::TooLong);
        // Multi-byte characters count in bytes.
        let long_utf8 = "é".repeat(127);
        assert_eq!(Role::new(long_utf8).unwrap_err().rule, NameRule::TooLong);
    }

    #[test]
    fn error_names_value_and_rule() {
        let err = Role::new("web server").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid role \"web server\": must not contain whitespace"
        );
    }

    #[test]
    fn serde_validates() {
        let ok: HostName = serde_json::from_str("\"compute1\"").unwrap();
        assert_eq!(ok.as_str(), "compute1");
        assert!(serde_json::from_str::<HostName>("\"a/b\"").is_err());
    }
}
