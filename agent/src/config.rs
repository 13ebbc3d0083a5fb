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

/// Where the Hiera data file is kept by default.
pub const DEFAULT_HIERA_FILE: &str = "/etc/puppet/hieradata/jiocloud.yaml";

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
    /// Where the services' upgrade task files are (composable rollouts).
    pub services_dir: PathBuf,
    /// A task's timeout when its file gives none.
    pub task_timeout: Duration,
    /// Where the fleet commands' actions are (`<actions_dir>/<name>`).
    pub actions_dir: PathBuf,
    /// A fleet command that names no installed action runs as the argument list
    /// it gives (off by default: a store write never becomes an arbitrary command).
    pub allow_any_command: bool,
    /// How long a fleet command's action may run when the command gives no timeout.
    pub command_timeout: Duration,
    pub retry_interval: Duration,
    pub health_interval: Duration,
    pub resync_interval: Duration,
    pub lease_ttl: Duration,
    pub stop_grace: Duration,
    pub store_retry: Duration,
    /// Where run logs go, when configured.
    pub swift: Option<std::sync::Arc<jio_common::swift::SwiftClient>>,
    /// How the log lines on stderr are written.
    pub log_format: LogFormat,
    /// The Hiera data file kept from `/active_roles/` (`None`: `hiera_file = ""`, off).
    pub hiera_file: Option<PathBuf>,
    /// Where the Prometheus metrics go (both off by default).
    pub metrics: MetricsOutputs,
    /// Whether and how a run ends with a reboot (`reboot*`, `boot_id_file`).
    pub reboot: crate::reboot::RebootSettings,
    /// The package snapshot of a version, and where the installed set is read.
    pub packages: crate::packages::PackageSettings,
}

/// `log_format`: lines for people (`text`, the default) or one JSON object per
/// line (`json`, for a log shipper).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
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
    pub services_dir: Option<PathBuf>,
    pub task_timeout: Option<String>,
    pub actions_dir: Option<PathBuf>,
    pub allow_any_command: Option<bool>,
    pub command_timeout: Option<String>,
    pub retry_interval: Option<String>,
    pub health_interval: Option<String>,
    pub resync_interval: Option<String>,
    pub lease_ttl: Option<String>,
    pub stop_grace: Option<String>,
    pub store_retry: Option<String>,
    pub log_format: Option<String>,
    pub hiera_file: Option<PathBuf>,
    pub metrics_listen: Option<String>,
    pub metrics_textfile: Option<PathBuf>,
    pub swift: Option<jio_common::swift::SwiftSettings>,
    pub reboot: Option<String>,
    pub reboot_required_file: Option<PathBuf>,
    pub reboot_check_command: Option<Vec<String>>,
    pub reboot_command: Option<Vec<String>>,
    pub reboot_timeout: Option<String>,
    pub boot_id_file: Option<PathBuf>,
    pub package_source: Option<String>,
    pub apt_sources_file: Option<PathBuf>,
    pub apt_preferences_file: Option<PathBuf>,
    pub dpkg_status_file: Option<PathBuf>,
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
    "services_dir",
    "task_timeout",
    "actions_dir",
    "allow_any_command",
    "command_timeout",
    "retry_interval",
    "health_interval",
    "resync_interval",
    "lease_ttl",
    "stop_grace",
    "store_retry",
    "log_format",
    "hiera_file",
    "metrics_listen",
    "metrics_textfile",
    "reboot",
    "reboot_required_file",
    "reboot_timeout",
    "boot_id_file",
    "package_source",
    "apt_sources_file",
    "apt_preferences_file",
    "dpkg_status_file",
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
    let (path, explicit) = match &ov.config_path {
        Some(p) => (p.clone(), true),
        None => (PathBuf::from(DEFAULT_CONFIG), false),
    };
    // A file that cannot be read or parsed is the one error: checking the rest
    // without it would only report what follows from its absence (a role guessed
    // from the system's host name, say).
    let file = read_file(&path, explicit).map_err(|e| ConfigError(vec![e]))?;
    let mut errors = Vec::new();
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
    toml::from_str(&text).map_err(|e| {
        jio_common::suggest::config_file_error(&path.display().to_string(), &e.to_string(), "    ")
    })
}

/// The values given for each key: flag > environment > file, and the errors found
/// so far (every one is reported, not only the first).
struct Sources<'a> {
    ov: &'a Overrides,
    errors: &'a mut Vec<String>,
}

impl Sources<'_> {
    /// The value of `key` and where it came from.
    fn pick(&self, key: &'static str, from_file: Option<String>) -> Option<(String, &'static str)> {
        self.ov
            .flags
            .get(key)
            .map(|v| (v.clone(), "flag"))
            .or_else(|| self.ov.env.get(key).map(|v| (v.clone(), "environment")))
            .or(from_file.map(|v| (v, "file")))
    }

    fn error(&mut self, e: String) {
        self.errors.push(e);
    }

    fn duration(&mut self, key: &'static str, file_v: Option<String>, default: &str) -> Duration {
        let (v, src) = self
            .pick(key, file_v)
            .unwrap_or_else(|| (default.to_string(), "default"));
        duration::parse(&v).unwrap_or_else(|e| {
            self.error(format!("{key} ({src}): {e}"));
            Duration::ZERO
        })
    }

    /// A path; an empty one is an error.
    fn path(&mut self, key: &'static str, v: Option<PathBuf>, default: &str) -> PathBuf {
        let from_file = v.map(|p| p.to_string_lossy().into_owned());
        let p = PathBuf::from(
            self.pick(key, from_file)
                .map(|p| p.0)
                .unwrap_or_else(|| default.to_string()),
        );
        if p.as_os_str().is_empty() {
            self.error(format!("{key}: must not be empty"));
        }
        p
    }

    /// A boolean (`true`/`false`).
    fn boolean(&mut self, key: &'static str, file_v: Option<bool>, default: bool) -> bool {
        match self.pick(key, file_v.map(|b| b.to_string())) {
            None => default,
            Some((v, src)) => match v.trim() {
                "true" => true,
                "false" => false,
                other => {
                    self.error(format!("{key} ({src}): {other:?} is not true or false"));
                    default
                }
            },
        }
    }

    /// A command from the file, or the default; it needs a program.
    fn command(&mut self, key: &str, v: Option<Vec<String>>, default: &[&str]) -> Vec<String> {
        let c = v.unwrap_or_else(|| default.iter().map(|a| a.to_string()).collect());
        if c.first().is_none_or(|p| p.is_empty()) {
            self.error(format!("{key}: a command needs a program"));
        }
        c
    }
}

/// Where the agent is and who it is: the store, the key prefix, the host and role.
struct Identity {
    store: Option<StoreUrl>,
    store_given: bool,
    schema: Option<Schema>,
    hostname: Option<HostName>,
    role: Option<Role>,
}

fn identity(
    src: &mut Sources<'_>,
    file: &mut FileConfig,
    system_hostname: impl FnOnce() -> Option<String>,
) -> Identity {
    let (store, store_given) = match src.pick("store", file.store.take()) {
        Some((v, from)) => match StoreUrl::parse(&v) {
            Ok(u) => {
                for e in u.check_files() {
                    src.error(format!("store ({from}): {e}"));
                }
                (Some(u), true)
            }
            Err(e) => {
                src.error(format!("store ({from}): {e}"));
                (None, true)
            }
        },
        None => (Some(default_store_url()), false),
    };
    let prefix = src.pick("prefix", file.prefix.take()).map(|p| p.0);
    let schema = Schema::new(&prefix.unwrap_or_default())
        .map_err(|e| src.error(format!("prefix: {e}")))
        .ok();
    let hostname = match src
        .pick("hostname", file.hostname.take())
        .map(|h| h.0)
        .or_else(system_hostname)
    {
        Some(h) => HostName::new(h)
            .map_err(|e| src.error(format!("hostname: {e}")))
            .ok(),
        None => {
            src.error("hostname: not configured and the system host name cannot be read".into());
            None
        }
    };
    let role = role(src, file, hostname.as_ref());
    Identity {
        store,
        store_given,
        schema,
        hostname,
        role,
    }
}

/// The configured role, or the one `role_pattern` finds in the host name.
fn role(src: &mut Sources<'_>, file: &mut FileConfig, hostname: Option<&HostName>) -> Option<Role> {
    let pattern = src
        .pick("role_pattern", file.role_pattern.take())
        .map(|p| p.0)
        .unwrap_or_else(|| DEFAULT_ROLE_PATTERN.to_string());
    let pattern = jio_common::roles::RolePattern::new(&pattern)
        .map_err(|e| src.error(format!("role_pattern {e}")))
        .ok();
    match (src.pick("role", file.role.take()), hostname, &pattern) {
        (Some((r, _)), _, _) => Role::new(r).map_err(|e| src.error(format!("role: {e}"))).ok(),
        (None, Some(h), Some(p)) => match p.role_of(h) {
            Some(r) => Some(r),
            None => {
                src.error(format!(
                    "role: not configured, and host name {h} does not match role_pattern {:?} (set `role` in the configuration)",
                    p.as_str()
                ));
                None
            }
        },
        _ => None,
    }
}

/// Timeouts and intervals.
struct Timing {
    pre_command: Duration,
    puppet: Duration,
    validation: Duration,
    task: Duration,
    command: Duration,
    retry: Duration,
    health: Duration,
    resync: Duration,
    lease_ttl: Duration,
    stop_grace: Duration,
    store_retry: Duration,
}

fn timing(src: &mut Sources<'_>, file: &mut FileConfig) -> Timing {
    let t = Timing {
        pre_command: src.duration("pre_command_timeout", file.pre_command_timeout.take(), "30m"),
        puppet: src.duration("puppet_timeout", file.puppet_timeout.take(), "30m"),
        validation: src.duration("validation_timeout", file.validation_timeout.take(), "10m"),
        task: src.duration("task_timeout", file.task_timeout.take(), "30m"),
        command: src.duration("command_timeout", file.command_timeout.take(), "30m"),
        retry: src.duration("retry_interval", file.retry_interval.take(), "10m"),
        health: src.duration("health_interval", file.health_interval.take(), "10m"),
        resync: src.duration("resync_interval", file.resync_interval.take(), "5m"),
        lease_ttl: src.duration("lease_ttl", file.lease_ttl.take(), "15s"),
        stop_grace: src.duration("stop_grace", file.stop_grace.take(), "30s"),
        store_retry: src.duration("store_retry", file.store_retry.take(), "10s"),
    };
    for (key, d) in [
        ("puppet_timeout", t.puppet),
        ("pre_command_timeout", t.pre_command),
        ("validation_timeout", t.validation),
        ("task_timeout", t.task),
        ("command_timeout", t.command),
        ("retry_interval", t.retry),
        ("resync_interval", t.resync),
        ("store_retry", t.store_retry),
    ] {
        if d.is_zero() {
            src.error(format!("{key}: must be greater than 0"));
        }
    }
    if t.lease_ttl < Duration::from_secs(2) {
        src.error(format!(
            "lease_ttl: {} is too short (at least 2s)",
            duration::format(t.lease_ttl)
        ));
    }
    t
}

/// The commands of the steps, and the pre-commands before Puppet.
fn commands(src: &mut Sources<'_>, file: &mut FileConfig) -> (Vec<Vec<String>>, Vec<String>, Vec<String>) {
    let pre_commands = file.pre_commands.take().unwrap_or_else(|| {
        vec![
            vec!["apt-get".into(), "update".into()],
            [
                "apt-get",
                "dist-upgrade",
                "-y",
                "--allow-downgrades",
                "-o",
                "Dpkg::Options::=--force-confold",
            ]
            .map(String::from)
            .to_vec(),
        ]
    });
    for (i, c) in pre_commands.iter().enumerate() {
        if c.first().is_none_or(|p| p.is_empty()) {
            src.error(format!("pre_commands[{i}]: a command needs a program"));
        }
    }
    let puppet = src.command(
        "puppet_command",
        file.puppet_command.take(),
        &[
            "puppet",
            "apply",
            "--detailed-exitcodes",
            "--logdest",
            "{log_jsonl}",
            "/etc/puppet/manifests/site.pp",
        ],
    );
    let validation = src.command(
        "validation_command",
        file.validation_command.take(),
        &[
            "run-parts",
            "--regex=.",
            "--verbose",
            "--exit-on-error",
            "--report",
            "{validation_dir}",
        ],
    );
    (pre_commands, puppet, validation)
}

fn build(
    mut file: FileConfig,
    ov: &Overrides,
    system_hostname: impl FnOnce() -> Option<String>,
    errors: &mut Vec<String>,
) -> Option<Config> {
    let mut src = Sources { ov, errors };
    let id = identity(&mut src, &mut file, system_hostname);
    let t = timing(&mut src, &mut file);
    let (pre_commands, puppet_command, validation_command) = commands(&mut src, &mut file);
    let p = paths(&mut src, &mut file);
    let allow_any_command = src.boolean("allow_any_command", file.allow_any_command.take(), false);
    let hiera_file = hiera_file(&mut src, &mut file);
    let metrics = metrics_outputs(&mut src, &mut file);
    let log_format = log_format(&mut src, &mut file);
    let swift = swift(&mut src, &mut file);
    let reboot = reboot_settings(&mut src, &mut file);
    let packages = package_settings(&mut src, &mut file);
    Some(Config {
        store: id.store?,
        store_given: id.store_given,
        schema: id.schema?,
        hostname: id.hostname?,
        role: id.role?,
        state_dir: p.state_dir,
        version_file: p.version_file,
        facts_file: p.facts_file,
        pre_commands,
        pre_command_timeout: t.pre_command,
        puppet_command,
        puppet_timeout: t.puppet,
        validation_command,
        validation_dir: p.validation_dir,
        validation_timeout: t.validation,
        services_dir: p.services_dir,
        task_timeout: t.task,
        actions_dir: p.actions_dir,
        allow_any_command,
        command_timeout: t.command,
        retry_interval: t.retry,
        health_interval: t.health,
        resync_interval: t.resync,
        lease_ttl: t.lease_ttl,
        stop_grace: t.stop_grace,
        store_retry: t.store_retry,
        swift,
        log_format,
        hiera_file,
        metrics,
        reboot,
        packages,
    })
}

/// `package_source` (`store`, `none` or a template), the files apt reads, and
/// dpkg's status file (`""`: no package sets recorded).
fn package_settings(src: &mut Sources<'_>, file: &mut FileConfig) -> crate::packages::PackageSettings {
    use crate::packages::SourceSetting;
    let source = match src.pick("package_source", file.package_source.take()) {
        None => SourceSetting::Store,
        Some((v, _)) => SourceSetting::parse(&v).unwrap_or_else(|e| {
            src.error(format!("package_source: {e}"));
            SourceSetting::Store
        }),
    };
    let dpkg_status = match src.pick(
        "dpkg_status_file",
        file.dpkg_status_file
            .take()
            .map(|p| p.to_string_lossy().into_owned()),
    ) {
        None => Some(PathBuf::from("/var/lib/dpkg/status")),
        Some((p, _)) if p.is_empty() => None,
        Some((p, _)) => Some(PathBuf::from(p)),
    };
    crate::packages::PackageSettings {
        source,
        sources_file: src.path(
            "apt_sources_file",
            file.apt_sources_file.take(),
            "/etc/apt/sources.list.d/jiocloud-snapshot.list",
        ),
        preferences_file: src.path(
            "apt_preferences_file",
            file.apt_preferences_file.take(),
            "/etc/apt/preferences.d/jiocloud-snapshot",
        ),
        dpkg_status,
    }
}

/// `reboot` (never, if-required, always), what says a reboot is required, how to
/// reboot and how long to wait for the new boot.
fn reboot_settings(src: &mut Sources<'_>, file: &mut FileConfig) -> crate::reboot::RebootSettings {
    use crate::reboot::RebootPolicy;
    let policy = match src.pick("reboot", file.reboot.take()) {
        None => RebootPolicy::IfRequired,
        Some((v, _)) => RebootPolicy::parse(&v).unwrap_or_else(|e| {
            src.error(format!("reboot: {e}"));
            RebootPolicy::IfRequired
        }),
    };
    let check_command = file.reboot_check_command.take();
    if check_command
        .as_ref()
        .is_some_and(|c| c.first().is_none_or(|p| p.is_empty()))
    {
        src.error("reboot_check_command: a command needs a program".to_string());
    }
    let timeout = src.duration("reboot_timeout", file.reboot_timeout.take(), "15m");
    if timeout.is_zero() {
        src.error("reboot_timeout: must be greater than 0".to_string());
    }
    crate::reboot::RebootSettings {
        policy,
        required_file: src.path(
            "reboot_required_file",
            file.reboot_required_file.take(),
            "/var/run/reboot-required",
        ),
        check_command,
        command: src.command(
            "reboot_command",
            file.reboot_command.take(),
            &["systemctl", "reboot"],
        ),
        timeout,
        boot_id_file: src.path(
            "boot_id_file",
            file.boot_id_file.take(),
            "/proc/sys/kernel/random/boot_id",
        ),
    }
}

/// The agent's files and directories.
struct Paths {
    state_dir: PathBuf,
    version_file: PathBuf,
    facts_file: PathBuf,
    validation_dir: PathBuf,
    services_dir: PathBuf,
    actions_dir: PathBuf,
}

/// The agent's files and directories, each from a flag, the file or its default.
fn paths(src: &mut Sources<'_>, file: &mut FileConfig) -> Paths {
    let state_dir = src.path("state_dir", file.state_dir.take(), "/var/lib/jiocloud");
    let version_file = src.path("version_file", file.version_file.take(), "/etc/current_version");
    let facts_file = src.path(
        "facts_file",
        file.facts_file.take(),
        "/etc/facter/facts.d/current_version.txt",
    );
    let validation_dir = src.path(
        "validation_dir",
        file.validation_dir.take(),
        "/usr/lib/jiocloud/tests",
    );
    let services_dir = src.path(
        "services_dir",
        file.services_dir.take(),
        "/usr/lib/jiocloud/services",
    );
    let actions_dir = src.path(
        "actions_dir",
        file.actions_dir.take(),
        "/usr/lib/jiocloud/actions",
    );
    Paths {
        state_dir,
        version_file,
        facts_file,
        validation_dir,
        services_dir,
        actions_dir,
    }
}

/// The Hiera file read for `hiera_file` lookups (`None`: set empty, none is read).
fn hiera_file(src: &mut Sources<'_>, file: &mut FileConfig) -> Option<PathBuf> {
    match src.pick(
        "hiera_file",
        file.hiera_file.take().map(|p| p.to_string_lossy().into_owned()),
    ) {
        None => Some(PathBuf::from(DEFAULT_HIERA_FILE)),
        Some((p, _)) if p.is_empty() => None,
        Some((p, _)) => Some(PathBuf::from(p)),
    }
}

/// Where the metrics are served and written (each optional).
fn metrics_outputs(src: &mut Sources<'_>, file: &mut FileConfig) -> MetricsOutputs {
    MetricsOutputs {
        listen: match src.pick("metrics_listen", file.metrics_listen.take()) {
            None => None,
            Some((v, _)) if v.is_empty() => None,
            Some((v, from)) => jio_common::exposition::parse_listen(&v)
                .map_err(|e| src.error(format!("metrics_listen: {v:?} (from the {from}) {e}")))
                .ok(),
        },
        textfile: match src.pick(
            "metrics_textfile",
            file.metrics_textfile
                .take()
                .map(|p| p.to_string_lossy().into_owned()),
        ) {
            None => None,
            Some((p, _)) if p.is_empty() => None,
            Some((p, from)) if !p.ends_with(".prom") => {
                src.error(format!(
                    "metrics_textfile: {p:?} (from the {from}) does not end in .prom, and node-exporter's textfile collector reads only *.prom files"
                ));
                None
            }
            Some((p, from)) if !p.starts_with('/') => {
                src.error(format!(
                    "metrics_textfile: {p:?} (from the {from}) is not an absolute path (node-exporter reads a directory of its own)"
                ));
                None
            }
            Some((p, _)) => Some(PathBuf::from(p)),
        },
    }
}

/// The log format: text (the default) or JSON.
fn log_format(src: &mut Sources<'_>, file: &mut FileConfig) -> LogFormat {
    match src.pick("log_format", file.log_format.take()) {
        None => LogFormat::Text,
        Some((v, _)) if v == "text" => LogFormat::Text,
        Some((v, _)) if v == "json" => LogFormat::Json,
        Some((v, from)) => {
            src.error(format!(
                "log_format: {v:?} (from the {from}) is neither \"text\" nor \"json\""
            ));
            LogFormat::Text
        }
    }
}

/// The Swift client run logs are uploaded with, when `[swift]` is configured.
fn swift(
    src: &mut Sources<'_>,
    file: &mut FileConfig,
) -> Option<std::sync::Arc<jio_common::swift::SwiftClient>> {
    file.swift.take().and_then(|settings| {
        jio_common::swift::SwiftClient::new(settings)
            .map(std::sync::Arc::new)
            .map_err(|e| src.error(format!("[swift]: {e}")))
            .ok()
    })
}

/// Where the metrics go, from the configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricsOutputs {
    pub listen: Option<std::net::SocketAddr>,
    pub textfile: Option<PathBuf>,
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
    fn metrics_are_off_by_default_and_on_the_loopback_for_a_bare_port() {
        let (_d, ov) = with_file("");
        assert_eq!(load(&ov, host).unwrap().metrics, MetricsOutputs::default());
        for (given, want) in [
            ("9464", "127.0.0.1:9464"),
            (":9464", "127.0.0.1:9464"),
            ("0.0.0.0:9100", "0.0.0.0:9100"),
            ("[::1]:9464", "[::1]:9464"),
        ] {
            let (_d, ov) = with_file(&format!("metrics_listen = \"{given}\"\n"));
            let c = load(&ov, host).unwrap();
            assert_eq!(
                c.metrics.listen.map(|a| a.to_string()).as_deref(),
                Some(want),
                "{given}"
            );
        }
        let (_d, ov) = with_file("metrics_listen = \"0\"\nmetrics_textfile = \"jio.prom\"\n");
        let msg = load(&ov, host).unwrap_err().to_string();
        assert!(msg.contains("port 0"), "{msg}");
        assert!(msg.contains("not an absolute path"), "{msg}");
        let (_d, ov) = with_file("metrics_listen = \"localhost:x\"\nmetrics_textfile = \"/tmp/jio.txt\"\n");
        let msg = load(&ov, host).unwrap_err().to_string();
        assert!(
            msg.contains("metrics_listen: \"localhost:x\" (from the file) is not an address"),
            "{msg}"
        );
        assert!(
            msg.contains("metrics_textfile: \"/tmp/jio.txt\" (from the file) does not end in .prom"),
            "{msg}"
        );
        let (_d, ov) = with_file("metrics_textfile = \"/var/lib/prometheus/node-exporter/jio-agent.prom\"\n");
        assert!(load(&ov, host).unwrap().metrics.textfile.is_some());
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
        assert!(
            msg.contains("unknown key `stroe`: did you mean `store`?"),
            "{msg}"
        );
        assert!(!msg.contains("swift"), "not every key listed: {msg}");
    }

    #[test]
    fn a_file_that_cannot_be_parsed_is_one_error_with_its_line() {
        // No role could be worked out from "gateway" either, but that only follows
        // from the file being unreadable: one error, not two.
        let (_d, ov) = with_file("hostname = \"compute9\n");
        let e = load(&ov, || Some("gateway".into())).unwrap_err();
        assert_eq!(e.0.len(), 1, "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("line 1, column 21\n"),
            "the parser's lines kept: {msg}"
        );
        assert!(msg.contains("| hostname = \"compute9"), "{msg}");
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
            msg.contains("host name gateway does not match role_pattern"),
            "{msg}"
        );
        let (_d, ov) = with_file("role = \"gw\"\n");
        assert_eq!(load(&ov, || Some("gateway".into())).unwrap().role.as_str(), "gw");
        let (_d, ov) = with_file("role_pattern = \"^(\"\n");
        assert!(load(&ov, host).unwrap_err().to_string().contains("role_pattern"));
    }
}
