//! The maintenance hooks' settings, validated once at start-up: each role's
//! `before` and `after` argument lists and timeout, where their logs go (the
//! driver's state directory, and Swift when `[swift]` is set). It reads no file and
//! runs nothing.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use jio_common::hook_record::HookKind;
use jio_common::names::Role;
use serde::Deserialize;

/// How long a hook may run when its table gives no `timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// `[hooks.<role>]` as written (unknown keys are errors).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookTable {
    before: Option<Vec<String>>,
    after: Option<Vec<String>>,
    timeout: Option<String>,
}

/// One role's hooks: argument lists (never a shell string) and their timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookSpec {
    pub before: Option<Vec<String>>,
    pub after: Option<Vec<String>>,
    pub timeout: Duration,
}

impl HookSpec {
    /// The argument list of `kind`, when the role has one.
    pub fn argv(&self, kind: HookKind) -> Option<&[String]> {
        match kind {
            HookKind::Before => self.before.as_deref(),
            HookKind::After => self.after.as_deref(),
        }
    }
}

/// Every role's hooks, and where their logs go.
#[derive(Debug, Clone, Default)]
pub struct HookSettings {
    pub roles: BTreeMap<Role, HookSpec>,
    /// The driver's state directory: hook logs go under `hooks/` in it.
    pub state_dir: PathBuf,
    /// Where the logs are uploaded (the `[swift]` of jioctl's configuration).
    pub swift: Option<jio_common::swift::SwiftSettings>,
}

impl HookSettings {
    /// The roles that have hooks.
    pub fn hooked_roles(&self) -> Vec<Role> {
        self.roles.keys().cloned().collect()
    }
}

/// Validates the `[hooks]` tables of `file`: every problem, each naming the file
/// and the key.
pub fn validate(
    file: &str,
    tables: BTreeMap<String, HookTable>,
) -> Result<BTreeMap<Role, HookSpec>, Vec<String>> {
    let mut errors = Vec::new();
    let mut roles = BTreeMap::new();
    for (name, t) in tables {
        let key = format!("hooks.{}", toml_key(&name));
        let role = Role::new(&name)
            .map_err(|e| {
                errors.push(format!(
                    "{file}: [{key}]: {name:?} is not a role name: {}",
                    e.rule
                ))
            })
            .ok();
        let mut argv = |which: &str, v: Option<Vec<String>>| -> Option<Vec<String>> {
            let v = v?;
            match v.first() {
                None => errors.push(format!(
                    "{file}: {key}.{which}: an empty argument list (give [\"/path/to/program\", \"arg\", ...], or leave {which} out)"
                )),
                Some(p) if p.trim().is_empty() => {
                    errors.push(format!("{file}: {key}.{which}: the program (its first element) is empty"))
                }
                Some(_) => return Some(v),
            }
            None
        };
        let before = argv("before", t.before);
        let after = argv("after", t.after);
        let timeout = match t.timeout.as_deref().map(jio_common::duration::parse) {
            None => Some(DEFAULT_TIMEOUT),
            Some(Ok(d)) if d > Duration::ZERO => Some(d),
            Some(Ok(_)) => {
                errors.push(format!("{file}: {key}.timeout: must be more than 0"));
                None
            }
            Some(Err(e)) => {
                errors.push(format!("{file}: {key}.timeout: {e}"));
                None
            }
        };
        if before.is_none() && after.is_none() && errors.is_empty() {
            errors.push(format!("{file}: [{key}]: neither before nor after is given"));
        }
        if let (Some(role), Some(timeout)) = (role, timeout) {
            roles.insert(
                role,
                HookSpec {
                    before,
                    after,
                    timeout,
                },
            );
        }
    }
    if errors.is_empty() { Ok(roles) } else { Err(errors) }
}

/// A table name as TOML would need it written.
fn toml_key(name: &str) -> String {
    if !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        name.to_string()
    } else {
        format!("{name:?}")
    }
}

/// The driver's state directory when the configuration names none: systemd's
/// `STATE_DIRECTORY` for the service, `/var/lib/jioctl` for root, else the user's
/// `$XDG_STATE_HOME/jiocloud/jioctl` (`~/.local/state/...`).
pub fn default_state_dir(env: impl Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(d) = env("STATE_DIRECTORY").filter(|d| !d.is_empty()) {
        // systemd may give several, separated by colons: the first is ours.
        return PathBuf::from(d.split(':').next().unwrap_or(&d));
    }
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/lib/jioctl");
    }
    env("XDG_STATE_HOME")
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(|| PathBuf::from("."))
        .join("jiocloud/jioctl")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tables(toml_text: &str) -> BTreeMap<String, HookTable> {
        #[derive(Deserialize)]
        struct F {
            hooks: BTreeMap<String, HookTable>,
        }
        toml::from_str::<F>(toml_text).unwrap().hooks
    }

    #[test]
    fn hook_tables_are_checked_and_every_problem_names_the_file_and_key() {
        let ok = tables(
            "[hooks.compute]\nbefore = [\"/usr/lib/x/nova-before\", \"--wait\"]\nafter = [\"/usr/lib/x/nova-after\"]\ntimeout = \"10m\"\n[hooks.ceph]\nafter = [\"/bin/true\"]\n",
        );
        let roles = validate("/etc/j.toml", ok).unwrap();
        let compute = &roles[&Role::new("compute").unwrap()];
        assert_eq!(compute.timeout, Duration::from_secs(600));
        assert_eq!(compute.argv(HookKind::Before).unwrap()[1], "--wait");
        let ceph = &roles[&Role::new("ceph").unwrap()];
        assert_eq!((ceph.before.is_none(), ceph.timeout), (true, DEFAULT_TIMEOUT));
        // (table, what the error says)
        let cases = [
            (
                "[hooks.compute]\nbefore = []\n",
                "/etc/j.toml: hooks.compute.before: an empty argument list",
            ),
            (
                "[hooks.compute]\nafter = [\"\"]\n",
                "hooks.compute.after: the program (its first element) is empty",
            ),
            (
                "[hooks.compute]\nbefore = [\"/x\"]\ntimeout = \"soon\"\n",
                "hooks.compute.timeout: invalid duration \"soon\"",
            ),
            (
                "[hooks.compute]\nbefore = [\"/x\"]\ntimeout = \"0\"\n",
                "hooks.compute.timeout: must be more than 0",
            ),
            (
                "[hooks.\"com pute\"]\nbefore = [\"/x\"]\n",
                "[hooks.\"com pute\"]: \"com pute\" is not a role name",
            ),
            (
                "[hooks.compute]\ntimeout = \"1m\"\n",
                "neither before nor after is given",
            ),
        ];
        for (text, says) in cases {
            let err = validate("/etc/j.toml", tables(text)).unwrap_err().join("; ");
            assert!(err.contains(says), "{text}: {err}");
        }
        let both = tables("[hooks.a]\nbefore = []\n[hooks.b]\nafter = []\n");
        assert_eq!(
            validate("f", both).unwrap_err().len(),
            2,
            "every problem is reported"
        );
    }

    #[test]
    fn the_state_directory_follows_systemd_then_the_user() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(
            default_state_dir(env(&[("STATE_DIRECTORY", "/var/lib/jioctl:/x")])),
            PathBuf::from("/var/lib/jioctl")
        );
        if !nix::unistd::geteuid().is_root() {
            assert_eq!(
                default_state_dir(env(&[("HOME", "/home/a")])),
                PathBuf::from("/home/a/.local/state/jiocloud/jioctl")
            );
        }
    }
}
