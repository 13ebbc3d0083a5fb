//! The agent's configuration: file, environment and flags merged once at startup
//! (flag > environment > file > default) into a validated `Config`.
//!
//! Every bad value is reported in one go; unknown keys in the file are errors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use jio_common::duration;
use jio_common::keys::Schema;
use jio_common::names::{HostName, Role};
use jio_common::store::{StoreUrl, default_store_url};
use serde::Deserialize;

/// Where the configuration file is looked for when `--config` is not given.
pub const DEFAULT_CONFIG: &str = "/etc/jiocloud/agent.toml";

/// The original tool's rule: letters followed by digits; the letters are the role
/// (the one rule, shared with `jioctl`).
pub use jio_common::roles::DEFAULT_ROLE_PATTERN;

/// How the configure and validate steps run.
#[derive(Clone, Default)]
pub enum Steps {
    /// Real commands: pre-commands, Puppet, validation (the only choice in a file).
    #[default]
    Commands,
    /// Simulated steps of fixed durations, for many agents in one process (benchmarks).
    Simulated(SimulatedSteps),
}

/// Called when a simulated configure step starts, with the host and the version.
pub type OnStart = std::sync::Arc<dyn Fn(&HostName, &jio_common::names::Version) + Send + Sync>;

/// A simulated configure step: it calls `on_start` with the host and version, then
/// takes `configure`; validation takes `validate`. Both succeed.
#[derive(Clone)]
pub struct SimulatedSteps {
    pub configure: Duration,
    pub validate: Duration,
    pub on_start: OnStart,
}

impl std::fmt::Debug for Steps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Steps::Commands => f.write_str("Commands"),
            Steps::Simulated(s) => write!(f, "Simulated({:?}, {:?})", s.configure, s.validate),
        }
    }
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub store: StoreUrl,
    /// Whether the store was given (flag, environment or file) or is the default.
    pub store_given: bool,
    pub schema: Schema,
    pub hostname: HostName,
    pub role: Role,
    pub state_dir: PathBuf,
    pub version_file: PathBuf,
    pub facts_file: PathBuf,
    pub pre_commands: Vec<Vec<String>>,
    pub pre_command_timeout: Duration,
    pub puppet_command: Vec<String>,
    pub puppet_timeout: Duration,
    pub validation_command: Vec<String>,
    pub validation_dir: PathBuf,
    pub validation_timeout: Duration,
    pub retry_interval: Duration,
    pub health_interval: Duration,
    pub resync_interval: Duration,
    pub lease_ttl: Duration,
    pub stop_grace: Duration,
    pub store_retry: Duration,
    /// Where run logs go, when configured.
    pub swift: Option<std::sync::Arc<jio_common::swift::SwiftClient>>,
    /// Real commands, unless an embedding program simulates the steps.
    pub steps: Steps,
}

/// The file's keys; every one optional, unknown ones rejected.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub store: Option<String>,
    pub prefix: Option<String>,
    pub hostname: Option<String>,
    pub role: Option<String>,
    pub role_pattern: Option<String>,
    pub state_dir: Option<PathBuf>,
    pub version_file: Option<PathBuf>,
    pub facts_file: Option<PathBuf>,
    pub pre_commands: Option<Vec<Vec<String>>>,
    pub pre_command_timeout: Option<String>,
    pub puppet_command: Option<Vec<String>>,
    pub puppet_timeout: Option<String>,
    pub validation_command: Option<Vec<String>>,
    pub validation_dir: Option<PathBuf>,
    pub validation_timeout: Option<String>,
    pub retry_interval: Option<String>,
    pub health_interval: Option<String>,
    pub resync_interval: Option<String>,
    pub lease_ttl: Option<String>,
    pub stop_grace: Option<String>,
    pub store_retry: Option<String>,
    pub swift: Option<jio_common::swift::SwiftSettings>,
}

/// Scalar settings that may come from the environment (`JIO_<NAME>`) or a flag.
pub const SCALAR_KEYS: &[&str] = &[
    "store",
    "prefix",
    "hostname",
    "role",
    "role_pattern",
    "state_dir",
    "version_file",
    "facts_file",
    "pre_command_timeout",
    "puppet_timeout",
    "validation_dir",
    "validation_timeout",
    "retry_interval",
    "health_interval",
    "resync_interval",
    "lease_ttl",
    "stop_grace",
    "store_retry",
];

/// Every problem found, one per line.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n  {}", .0.join("\n  "))]
pub struct ConfigError(pub Vec<String>);

/// What the command line and environment supplied, by key.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub config_path: Option<PathBuf>,
    /// Values from flags, by key.
    pub flags: BTreeMap<&'static str, String>,
    /// Values from the environment, by key.
    pub env: BTreeMap<&'static str, String>,
}

impl Overrides {
    /// Reads `JIO_<KEY>` for every scalar key from `lookup` (the process environment
    /// in production, a map in tests).
    pub fn with_env(mut self, lookup: impl Fn(&str) -> Option<String>) -> Self {
        for key in SCALAR_KEYS {
            if let Some(v) = lookup(&format!("JIO_{}", key.to_uppercase())) {
                self.env.insert(key, v);
            }
        }
        self
    }
}

/// Loads and validates. `system_hostname` is asked only when no host name is configured.
pub fn load(ov: &Overrides, system_hostname: impl FnOnce() -> Option<String>) -> Result<Config, ConfigError> {
    let mut errors = Vec::new();
    let (path, explicit) = match &ov.config_path {
        Some(p) => (p.clone(), true),
        None => (PathBuf::from(DEFAULT_CONFIG), false),
    };
    let file = match read_file(&path, explicit) {
        Ok(f) => f,
        Err(e) => {
            errors.push(e);
            FileConfig::default()
        }
    };
    let cfg = build(file, ov, system_hostname, &mut errors);
    match cfg {
        Some(c) if errors.is_empty() => Ok(c),
        _ => Err(ConfigError(errors)),
    }
}

fn read_file(path: &Path, explicit: bool) -> Result<FileConfig, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => return Ok(FileConfig::default()),
        Err(e) => return Err(format!("{}: cannot read: {e}", path.display())),
    };
    toml::from_str(&text)
        .map_err(|e| format!("{}: {}", path.display(), e.to_string().trim().replace('\n', " ")))
}

fn build(
    file: FileConfig,
    ov: &Overrides,
    system_hostname: impl FnOnce() -> Option<String>,
    errors: &mut Vec<String>,
) -> Option<Config> {
    // flag > environment > file
    let pick = |key: &'static str, from_file: Option<String>| -> Option<(String, &'static str)> {
        ov.flags
            .get(key)
            .map(|v| (v.clone(), "flag"))
            .or_else(|| ov.env.get(key).map(|v| (v.clone(), "environment")))
            .or(from_file.map(|v| (v, "file")))
    };
    let path_of = |p: Option<PathBuf>| p.map(|p| p.to_string_lossy().into_owned());

    let (store, store_given) = match pick("store", file.store) {
        Some((v, src)) => match StoreUrl::parse(&v) {
            Ok(u) => (Some(u), true),
            Err(e) => {
                errors.push(format!("store ({src}): {e}"));
                (None, true)
            }
        },
        None => (Some(default_store_url()), false),
    };
    let schema = match Schema::new(&pick("prefix", file.prefix).map(|p| p.0).unwrap_or_default()) {
        Ok(s) => Some(s),
        Err(e) => {
            errors.push(format!("prefix: {e}"));
            None
        }
    };
    let hostname = match pick("hostname", file.hostname)
        .map(|h| h.0)
        .or_else(system_hostname)
    {
        Some(h) => HostName::new(h)
            .map_err(|e| errors.push(format!("hostname: {e}")))
            .ok(),
        None => {
            errors.push("hostname: not configured and the system host name cannot be read".into());
            None
        }
    };
    let pattern = pick("role_pattern", file.role_pattern)
        .map(|p| p.0)
        .unwrap_or_else(|| DEFAULT_ROLE_PATTERN.to_string());
    let pattern = jio_common::roles::RolePattern::new(&pattern)
        .map_err(|e| errors.push(format!("role_pattern {e}")))
        .ok();
    let role = match (pick("role", file.role), &hostname, &pattern) {
        (Some((r, _)), _, _) => Role::new(r).map_err(|e| errors.push(format!("role: {e}"))).ok(),
        (None, Some(h), Some(p)) => match p.role_of(h) {
            Some(r) => Some(r),
            None => {
                errors.push(format!(
                    "role: not configured, and host name {h:?} does not match role_pattern {:?} (set `role` in the configuration)",
                    p.as_str()
                ));
                None
            }
        },
        _ => None,
    };

    let mut dur = |key: &'static str, file_v: Option<String>, default: &str| -> Duration {
        let (v, src) = pick(key, file_v).unwrap_or_else(|| (default.to_string(), "default"));
        duration::parse(&v).unwrap_or_else(|e| {
            errors.push(format!("{key} ({src}): {e}"));
            Duration::ZERO
        })
    };
    let pre_command_timeout = dur("pre_command_timeout", file.pre_command_timeout, "30m");
    let puppet_timeout = dur("puppet_timeout", file.puppet_timeout, "30m");
    let validation_timeout = dur("validation_timeout", file.validation_timeout, "10m");
    let retry_interval = dur("retry_interval", file.retry_interval, "10m");
    let health_interval = dur("health_interval", file.health_interval, "10m");
    let resync_interval = dur("resync_interval", file.resync_interval, "5m");
    let lease_ttl = dur("lease_ttl", file.lease_ttl, "15s");
    let stop_grace = dur("stop_grace", file.stop_grace, "30s");
    let store_retry = dur("store_retry", file.store_retry, "10s");
    for (key, d) in [
        ("puppet_timeout", puppet_timeout),
        ("pre_command_timeout", pre_command_timeout),
        ("validation_timeout", validation_timeout),
        ("retry_interval", retry_interval),
        ("resync_interval", resync_interval),
        ("store_retry", store_retry),
    ] {
        if d.is_zero() {
            errors.push(format!("{key}: must be greater than 0"));
        }
    }
    if lease_ttl < Duration::from_secs(2) {
        errors.push(format!(
            "lease_ttl: {} is too short (at least 2s)",
            duration::format(lease_ttl)
        ));
    }

    let pre_commands = file.pre_commands.unwrap_or_else(|| {
        vec![
            vec!["apt-get".into(), "update".into()],
            vec![
                "apt-get".into(),
                "dist-upgrade".into(),
                "-y".into(),
                "-o".into(),
                "Dpkg::Options::=--force-confold".into(),
            ],
        ]
    });
    for (i, c) in pre_commands.iter().enumerate() {
        if c.first().is_none_or(|p| p.is_empty()) {
            errors.push(format!("pre_commands[{i}]: a command needs a program"));
        }
    }
    let puppet_command = file.puppet_command.unwrap_or_else(|| {
        [
            "puppet",
            "apply",
            "--detailed-exitcodes",
            "--logdest",
            "{log_jsonl}",
            "/etc/puppet/manifests/site.pp",
        ]
        .map(String::from)
        .to_vec()
    });
    if puppet_command.first().is_none_or(|p| p.is_empty()) {
        errors.push("puppet_command: a command needs a program".into());
    }
    let validation_command = file.validation_command.unwrap_or_else(|| {
        [
            "run-parts",
            "--regex=.",
            "--verbose",
            "--exit-on-error",
            "--report",
            "{validation_dir}",
        ]
        .map(String::from)
        .to_vec()
    });
    if validation_command.first().is_none_or(|p| p.is_empty()) {
        errors.push("validation_command: a command needs a program".into());
    }

    let path = |key: &'static str, v: Option<PathBuf>, default: &str| -> PathBuf {
        PathBuf::from(
            pick(key, path_of(v))
                .map(|p| p.0)
                .unwrap_or_else(|| default.to_string()),
        )
    };
    let state_dir = path("state_dir", file.state_dir, "/var/lib/jiocloud");
    let version_file = path("version_file", file.version_file, "/etc/current_version");
    let facts_file = path(
        "facts_file",
        file.facts_file,
        "/etc/facter/facts.d/current_version.txt",
    );
    let validation_dir = path("validation_dir", file.validation_dir, "/usr/lib/jiocloud/tests");
    for (key, p) in [
        ("state_dir", &state_dir),
        ("version_file", &version_file),
        ("facts_file", &facts_file),
        ("validation_dir", &validation_dir),
    ] {
        if p.as_os_str().is_empty() {
            errors.push(format!("{key}: must not be empty"));
        }
    }

    let swift = match file.swift {
        None => None,
        Some(settings) => match jio_common::swift::SwiftClient::new(settings) {
            Ok(c) => Some(std::sync::Arc::new(c)),
            Err(e) => {
                errors.push(format!("[swift]: {e}"));
                None
            }
        },
    };

    Some(Config {
        store: store?,
        store_given,
        schema: schema?,
        hostname: hostname?,
        role: role?,
        state_dir,
        version_file,
        facts_file,
        pre_commands,
        pre_command_timeout,
        puppet_command,
        puppet_timeout,
        validation_command,
        validation_dir,
        validation_timeout,
        retry_interval,
        health_interval,
        resync_interval,
        lease_ttl,
        stop_grace,
        store_retry,
        swift,
        steps: Steps::Commands,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_file(text: &str) -> (tempfile::TempDir, Overrides) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("agent.toml");
        std::fs::write(&p, text).unwrap();
        (
            dir,
            Overrides {
                config_path: Some(p),
                ..Overrides::default()
            },
        )
    }

    fn host() -> Option<String> {
        Some("compute12".into())
    }

    #[test]
    fn defaults_follow_the_original_tool() {
        let (_d, ov) = with_file("");
        let c = load(&ov, host).unwrap();
        assert_eq!(c.role.as_str(), "compute");
        assert_eq!(c.version_file, PathBuf::from("/etc/current_version"));
        assert_eq!(c.retry_interval, Duration::from_secs(600));
        assert_eq!(c.lease_ttl, Duration::from_secs(15));
        assert!(!c.store_given);
        assert_eq!(c.puppet_command[0], "puppet");
    }

    #[test]
    fn flag_beats_environment_beats_file() {
        let (_d, mut ov) = with_file("store = \"etcd://file:1\"\nretry_interval = \"1m\"\nrole = \"db\"\n");
        ov = ov.with_env(|k| match k {
            "JIO_STORE" => Some("etcd://env:2".into()),
            "JIO_RETRY_INTERVAL" => Some("2m".into()),
            _ => None,
        });
        ov.flags.insert("store", "etcd://flag:3".into());
        let c = load(&ov, host).unwrap();
        assert_eq!(c.store.to_string(), "etcd://flag:3");
        assert_eq!(c.retry_interval, Duration::from_secs(120));
        assert_eq!(c.role.as_str(), "db");
        assert!(c.store_given);
    }

    #[test]
    fn every_error_is_reported_at_once() {
        let (_d, ov) = with_file(
            "store = \"redis://x:1\"\nretry_interval = \"soon\"\nlease_ttl = \"1s\"\nprefix = \"jio\"\npuppet_command = []\n",
        );
        let err = load(&ov, || Some("web server".into())).unwrap_err();
        let msg = err.to_string();
        for needle in [
            "store (file)",
            "retry_interval (file)",
            "lease_ttl",
            "prefix",
            "puppet_command",
            "hostname",
        ] {
            assert!(msg.contains(needle), "{needle} missing from:\n{msg}");
        }
    }

    #[test]
    fn swift_key_file_must_be_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let d = tempfile::tempdir().unwrap();
        let key = d.path().join("swift.key");
        std::fs::write(&key, "s3cr3t\n").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let text = format!(
            "[swift]\nauth_url = \"http://127.0.0.1:1/auth/v1.0\"\nuser = \"fleet:uploader\"\nkey_file = \"{}\"\n",
            key.display()
        );
        let (_d, ov) = with_file(&text);
        let msg = load(&ov, host).unwrap_err().to_string();
        assert!(msg.contains("readable by group or others"), "{msg}");
        assert!(!msg.contains("s3cr3t"));
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = load(&ov, host).unwrap();
        assert_eq!(c.swift.unwrap().settings().container, "jiocloud-logs");
        let (_d, ov) = with_file(&format!("{text}colour = \"red\"\n"));
        assert!(load(&ov, host).unwrap_err().to_string().contains("colour"));
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let (_d, ov) = with_file("stroe = \"etcd://x:1\"\n");
        let msg = load(&ov, host).unwrap_err().to_string();
        assert!(msg.contains("stroe"), "{msg}");
    }

    #[test]
    fn missing_explicit_file_is_an_error() {
        let ov = Overrides {
            config_path: Some("/nonexistent/agent.toml".into()),
            ..Overrides::default()
        };
        assert!(
            load(&ov, host)
                .unwrap_err()
                .to_string()
                .contains("/nonexistent/agent.toml")
        );
    }

    #[test]
    fn host_without_role_is_a_startup_error() {
        let (_d, ov) = with_file("");
        let msg = load(&ov, || Some("gateway".into())).unwrap_err().to_string();
        assert!(
            msg.contains("\"gateway\"") && msg.contains("role_pattern"),
            "{msg}"
        );
        let (_d, ov) = with_file("role = \"gw\"\n");
        assert_eq!(load(&ov, || Some("gateway".into())).unwrap().role.as_str(), "gw");
        let (_d, ov) = with_file("role_pattern = \"^(\"\n");
        assert!(load(&ov, host).unwrap_err().to_string().contains("role_pattern"));
    }
}
