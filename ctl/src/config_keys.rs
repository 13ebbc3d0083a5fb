//! jioctl's configuration keys as operators read them: the jioctl section of
//! `docs/reference/configuration.md` is made from this table (`jio-gen`), and a test
//! loads a file holding every key's example.

/// One key of `jioctl.toml`: its name, its default, what it does (Markdown), and an
/// example of it as the file holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDoc {
    pub key: &'static str,
    pub default: &'static str,
    pub meaning: &'static str,
    pub example: &'static str,
}

/// Every key of the file.
pub const KEYS: &[KeyDoc] = &[
    KeyDoc {
        key: "store",
        default: "`sqlite://` in the state directory of the user (see [stores](../stores.md))",
        meaning: "store URL (`--store`, `JIO_STORE`)",
        example: "store = \"etcd://10.0.0.11:2379,10.0.0.12:2379\"",
    },
    KeyDoc {
        key: "prefix",
        default: "none",
        meaning: "namespace prefix of every key (`--prefix`, `JIO_PREFIX`)",
        example: "prefix = \"/jio\"",
    },
    KeyDoc {
        key: "role_pattern",
        default: "`^([a-z]+)[0-9]+(-.*)?$`",
        meaning: "the role of a host that has not registered, from its name: the agents' rule (`--role-pattern`, `JIO_ROLE_PATTERN`)",
        example: "role_pattern = \"^([a-z]+)[0-9]+(-.*)?$\"",
    },
    KeyDoc {
        key: "state_dir",
        default: "the service's `STATE_DIRECTORY` (`/var/lib/jioctl`), `/var/lib/jioctl` for root, else `~/.local/state/jiocloud/jioctl`",
        meaning: "where a driver keeps the maintenance hooks' logs (`hooks/`, the newest 200) (`JIO_STATE_DIR`)",
        example: "state_dir = \"/var/lib/jioctl\"",
    },
    KeyDoc {
        key: "swift",
        default: "none",
        meaning: "the `[swift]` table, as the agent's: `jioctl logs` fetches run logs with it, and a driver uploads the hooks' logs (see [run logs in Swift](../swift-logs.md))",
        example: "[swift]\nauth_url = \"https://swift.example.net/auth/v1.0\"\nuser = \"fleet:ops\"\nkey_file = \"/etc/jiocloud/swift.key\"",
    },
    KeyDoc {
        key: "hooks.<role>.before",
        default: "none",
        meaning: "the maintenance hook a driver runs before a host of `<role>` is enabled (drain it), as an argument list: `[\"/path/to/program\", \"arg\", ...]`; it must succeed for the host to be enabled (see [maintenance hooks](../maintenance-hooks.md))",
        example: "[hooks.compute]\nbefore = [\"/usr/local/lib/jiocloud/hooks/nova-before\"]",
    },
    KeyDoc {
        key: "hooks.<role>.after",
        default: "none",
        meaning: "the hook a driver runs once a host of `<role>` reported success at the new version (put it back); it must succeed for its slot to be free",
        example: "[hooks.ceph]\nafter = [\"/usr/local/lib/jiocloud/hooks/ceph-after\"]",
    },
    KeyDoc {
        key: "hooks.<role>.timeout",
        default: "`30m`",
        meaning: "how long each of the role's hooks may run; then its whole process group is stopped and the host fails",
        example: "[hooks.db]\nbefore = [\"/bin/true\"]\ntimeout = \"10m\"",
    },
    KeyDoc {
        key: "repo",
        default: "none: the system's trusted CAs, no client certificate, `timeout = \"10s\"`",
        meaning: "the `[repo]` table: how `upgrade`, `trigger-update`, `rollout undo` and `repo` fetch a package snapshot's `InRelease`/`Release` (see [package snapshots](../package-snapshots.md)): `ca_file` (the CAs of the repository's HTTPS server, PEM), `cert_file` and `key_file` (a client certificate and its key, for a repository that verifies clients), `timeout`",
        example: "[repo]\nca_file = \"/etc/jiocloud/repo-ca.pem\"\ntimeout = \"10s\"",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_with_every_documented_key_loads() {
        let d = tempfile::tempdir().unwrap();
        let key_file = d.path().join("swift.key");
        std::fs::write(&key_file, "k").unwrap();
        std::fs::set_permissions(&key_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        // Top-level keys first: a TOML table takes every key after it.
        let (tables, plain): (Vec<&KeyDoc>, Vec<&KeyDoc>) =
            KEYS.iter().partition(|k| k.example.starts_with('['));
        let text: Vec<String> = plain
            .iter()
            .chain(&tables)
            .map(|k| {
                k.example
                    .replace("/etc/jiocloud/swift.key", &key_file.display().to_string())
            })
            .collect();
        let p = d.path().join("jioctl.toml");
        std::fs::write(&p, text.join("\n")).unwrap();
        let c = crate::config::load(Some(&p), &crate::config::Flags::default(), |_| None).unwrap();
        assert_eq!(c.hooks.roles.len(), 3);
        assert!(c.swift.is_some());
        assert_eq!(c.hooks.state_dir, std::path::PathBuf::from("/var/lib/jioctl"));
    }
}
