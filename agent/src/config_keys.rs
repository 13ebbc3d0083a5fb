//! The agent's configuration keys as operators read them: `docs/reference/
//! configuration.md` is made from this table (`jio-gen`), a test fails when the page
//! differs from it, and tests check it against the keys the configuration file
//! accepts and the packaged, commented `agent.toml`.

/// One key of `agent.toml`: its name, its default, and what it does (Markdown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDoc {
    pub key: &'static str,
    pub default: &'static str,
    pub meaning: &'static str,
}

/// Every key of the file.
pub const KEYS: &[KeyDoc] = &[
    KeyDoc {
        key: "store",
        default: "`sqlite://` in the state directory of the user (see [stores](../stores.md))",
        meaning: "store URL",
    },
    KeyDoc {
        key: "prefix",
        default: "none",
        meaning: "namespace prefix of every key",
    },
    KeyDoc {
        key: "hostname",
        default: "the system host name (short)",
        meaning: "this host's name in keys",
    },
    KeyDoc {
        key: "role",
        default: "derived from the host name",
        meaning: "this host's role",
    },
    KeyDoc {
        key: "role_pattern",
        default: "`^([a-z]+)[0-9]+(-.*)?$`",
        meaning: "regex whose first group is the role (`compute12` → `compute`, `ocdb3-prod` → `ocdb`); a host name that yields no role and no `role` is a startup error",
    },
    KeyDoc {
        key: "state_dir",
        default: "`/var/lib/jiocloud`",
        meaning: "lock, journal, run logs, `listed.json`, `hiera.json`",
    },
    KeyDoc {
        key: "version_file",
        default: "`/etc/current_version`",
        meaning: "the local version",
    },
    KeyDoc {
        key: "facts_file",
        default: "`/etc/facter/facts.d/current_version.txt`",
        meaning: "the Facter fact",
    },
    KeyDoc {
        key: "pre_commands",
        default: "apt-get update; apt-get dist-upgrade -y --allow-downgrades ...",
        meaning: "list of argument lists, may be empty",
    },
    KeyDoc {
        key: "pre_command_timeout",
        default: "`30m`",
        meaning: "how long each of the `pre_commands` may run",
    },
    KeyDoc {
        key: "puppet_command",
        default: "`[\"puppet\", \"apply\", \"--detailed-exitcodes\", \"--logdest\", \"{log_jsonl}\", \"/etc/puppet/manifests/site.pp\"]`",
        meaning: "must follow `--detailed-exitcodes`",
    },
    KeyDoc {
        key: "puppet_timeout",
        default: "`30m`",
        meaning: "how long the Puppet run may take",
    },
    KeyDoc {
        key: "validation_command",
        default: "`[\"run-parts\", \"--regex=.\", \"--verbose\", \"--exit-on-error\", \"--report\", \"{validation_dir}\"]`",
        meaning: "0 is success",
    },
    KeyDoc {
        key: "validation_dir",
        default: "`/usr/lib/jiocloud/tests`",
        meaning: "the validation scripts (`{validation_dir}` in `validation_command`)",
    },
    KeyDoc {
        key: "validation_timeout",
        default: "`10m`",
        meaning: "how long the validation may take",
    },
    KeyDoc {
        key: "services_dir",
        default: "`/usr/lib/jiocloud/services`",
        meaning: "the services' upgrade task files of composable rollouts (`<service>.toml`)",
    },
    KeyDoc {
        key: "task_timeout",
        default: "`30m`",
        meaning: "a task's timeout when its file gives none",
    },
    KeyDoc {
        key: "actions_dir",
        default: "`/usr/lib/jiocloud/actions`",
        meaning: "the actions fleet commands may run (`<actions_dir>/<name>`, executable), installed by packages or Puppet",
    },
    KeyDoc {
        key: "allow_any_command",
        default: "`false`",
        meaning: "a fleet command that names no installed action runs as the argument list it gives (`true`/`false`; env `JIO_ALLOW_ANY_COMMAND`)",
    },
    KeyDoc {
        key: "command_timeout",
        default: "`30m`",
        meaning: "how long a fleet command's action may run on this host when the command gives no `--timeout`",
    },
    KeyDoc {
        key: "reboot",
        default: "`if-required`",
        meaning: "whether a run ends with a reboot inside the host's slot: `never`, `if-required` (the reboot-required file exists, or the check command exits 0) or `always`; the slot is freed only after the host is back with a new boot id and validated again",
    },
    KeyDoc {
        key: "reboot_required_file",
        default: "`/var/run/reboot-required`",
        meaning: "its presence says a reboot is required (Debian's; the packages in `<file>.pkgs` are named)",
    },
    KeyDoc {
        key: "reboot_check_command",
        default: "none",
        meaning: "asked instead of the file when set: exit 0 = a reboot is required, 1 = not, anything else fails the run",
    },
    KeyDoc {
        key: "reboot_command",
        default: "`[\"systemctl\", \"reboot\"]`",
        meaning: "how the agent reboots its host (its output goes to the run directory's `reboot.log`)",
    },
    KeyDoc {
        key: "reboot_timeout",
        default: "`15m`",
        meaning: "no new boot id this long after the reboot command: the run failed",
    },
    KeyDoc {
        key: "boot_id_file",
        default: "`/proc/sys/kernel/random/boot_id`",
        meaning: "where the host's boot id is read (a new one says the host rebooted)",
    },
    KeyDoc {
        key: "package_source",
        default: "`store`",
        meaning: "the package snapshot template: `store` (the one `jioctl repo set` wrote, if any), `none` (this host keeps its apt sources as they are), or this host's own one-line template such as `deb [signed-by=/usr/share/keyrings/site.gpg] http://repo.example/snapshots/{version} bookworm main` (see [package snapshots](../package-snapshots.md))",
    },
    KeyDoc {
        key: "apt_sources_file",
        default: "`/etc/apt/sources.list.d/jiocloud-snapshot.list`",
        meaning: "where the snapshot's sources entry is written before the `pre_commands`",
    },
    KeyDoc {
        key: "apt_preferences_file",
        default: "`/etc/apt/preferences.d/jiocloud-snapshot`",
        meaning: "where the snapshot's pin (priority 1001: downgrades included) is written",
    },
    KeyDoc {
        key: "dpkg_status_file",
        default: "`/var/lib/dpkg/status`",
        meaning: "dpkg's status file: the installed package set recorded after each successful run, and followed for drift; `\"\"` records none",
    },
    KeyDoc {
        key: "retry_interval",
        default: "`10m`",
        meaning: "first wait after a failure (doubles, up to 16×)",
    },
    KeyDoc {
        key: "health_interval",
        default: "`10m`",
        meaning: "idle re-validation; `0` turns it off",
    },
    KeyDoc {
        key: "resync_interval",
        default: "`5m`",
        meaning: "safety-net pass without any watch event",
    },
    KeyDoc {
        key: "lease_ttl",
        default: "`15s`",
        meaning: "liveness lease (at least `2s`)",
    },
    KeyDoc {
        key: "stop_grace",
        default: "`30s`",
        meaning: "how long a running command may finish after SIGTERM",
    },
    KeyDoc {
        key: "store_retry",
        default: "`10s`",
        meaning: "how long one store operation retries before the store counts as unreachable",
    },
    KeyDoc {
        key: "hiera_file",
        default: "`/etc/puppet/hieradata/jiocloud.yaml`",
        meaning: "the Hiera data file kept from `/active_roles/` (see [Hiera](../hiera.md)); `\"\"` turns it off",
    },
    KeyDoc {
        key: "metrics_listen",
        default: "none (off)",
        meaning: "serve Prometheus metrics on `GET /metrics` at `IP:PORT`; a bare port is on the loopback (see [metrics](../metrics.md))",
    },
    KeyDoc {
        key: "metrics_textfile",
        default: "none (off)",
        meaning: "write the metrics to this `*.prom` file (an absolute path) for node-exporter's textfile collector",
    },
    KeyDoc {
        key: "log_format",
        default: "`text`",
        meaning: "`text`: log lines for people, each led by its UTC time, except when stderr is journald's stream (`JOURNAL_STREAM` names it), which stamps every line itself; `json`: one JSON object per line (`timestamp`, `level`, `message` and the event's fields), for a log shipper. A command's own closing word (`jio-agent: ...` in text, as from `once`) is then a JSON line too, at level `ERROR` with its `exit_code`",
    },
    KeyDoc {
        key: "swift",
        default: "none",
        meaning: "the `[swift]` table: run log uploads (see [run logs in Swift](../swift-logs.md))",
    },
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn documented() -> BTreeSet<&'static str> {
        KEYS.iter().map(|k| k.key).collect()
    }

    /// The keys the file accepts are those serde lists when it meets an unknown one.
    #[test]
    fn every_key_the_file_accepts_is_documented_and_no_other() {
        let err = toml::from_str::<crate::config::FileConfig>("zz_unknown = 1")
            .unwrap_err()
            .to_string();
        let expected = err
            .split("expected one of")
            .nth(1)
            .unwrap_or_else(|| panic!("{err}"));
        let accepted: BTreeSet<&str> = expected.split('`').skip(1).step_by(2).collect();
        assert!(accepted.len() > 20, "{err}");
        assert_eq!(accepted, documented());
    }

    /// The packaged, commented agent.toml shows every key, and no other.
    #[test]
    fn the_packaged_file_shows_every_key() {
        let packaged = include_str!("../../packaging/agent/agent.toml");
        let top = packaged.split("[swift]").next().unwrap_or_default();
        let shown: BTreeSet<&str> = top
            .lines()
            .filter_map(|l| l.trim_start_matches('#').split_once(" = "))
            .map(|(k, _)| k.trim())
            .filter(|k| k.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            .chain(packaged.contains("[swift]").then_some("swift"))
            .collect();
        assert_eq!(shown, documented());
    }
}
