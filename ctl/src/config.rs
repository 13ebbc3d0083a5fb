//! jioctl's settings: flag > environment > `~/.config/jiocloud/jioctl.toml` > default,
//! parsed once into a validated `Config`, every bad value reported together (the
//! maintenance hooks' tables included, each problem naming the file and the key).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use jio_common::keys::Schema;
use jio_common::roles::{DEFAULT_ROLE_PATTERN, RolePattern};
use jio_common::store::{StoreUrl, default_store_url};
use serde::Deserialize;

/// The file's keys (unknown keys are errors).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    store: Option<String>,
    prefix: Option<String>,
    role_pattern: Option<String>,
    swift: Option<jio_common::swift::SwiftSettings>,
    /// The driver's state directory (maintenance hooks' logs).
    state_dir: Option<PathBuf>,
    /// `[hooks.<role>]`: the maintenance hooks the driver runs around hosts' slots.
    #[serde(default)]
    hooks: std::collections::BTreeMap<String, crate::hooks::settings::HookTable>,
    /// `[repo]`: how the package snapshots' Release files are fetched.
    repo: Option<RepoTable>,
}

/// `[repo]`: TLS files as the store's, and a timeout.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RepoTable {
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    timeout: Option<String>,
}

/// How jioctl fetches a snapshot's Release file (`[repo]`).
#[derive(Debug, Clone)]
pub struct RepoSettings {
    pub tls: jio_common::store::TlsSettings,
    pub timeout: std::time::Duration,
}

impl Default for RepoSettings {
    fn default() -> Self {
        RepoSettings {
            tls: Default::default(),
            timeout: std::time::Duration::from_secs(10),
        }
    }
}

fn repo_settings(file_name: &str, t: Option<RepoTable>, errors: &mut Vec<String>) -> RepoSettings {
    let Some(t) = t else {
        return RepoSettings::default();
    };
    if t.cert_file.is_some() != t.key_file.is_some() {
        errors.push(format!(
            "{file_name}: [repo] cert_file and key_file go together (a client certificate and its key)"
        ));
    }
    let timeout = match t.timeout.as_deref().map(jio_common::duration::parse) {
        None => RepoSettings::default().timeout,
        Some(Ok(d)) if !d.is_zero() => d,
        Some(Ok(_)) => {
            errors.push(format!("{file_name}: [repo] timeout must be greater than 0"));
            RepoSettings::default().timeout
        }
        Some(Err(e)) => {
            errors.push(format!("{file_name}: [repo] timeout: {e}"));
            RepoSettings::default().timeout
        }
    };
    let tls = jio_common::store::TlsSettings {
        ca_file: t.ca_file,
        cert_file: t.cert_file,
        key_file: t.key_file,
        server_name: None,
    };
    RepoSettings { tls, timeout }
}

/// The settings given as flags (`None`: not given).
#[derive(Debug, Default, Clone)]
pub struct Flags {
    pub store: Option<String>,
    pub prefix: Option<String>,
    pub role_pattern: Option<String>,
}

/// The validated settings.
#[derive(Debug, Clone)]
pub struct Config {
    pub store: StoreUrl,
    pub store_given: bool,
    /// The configuration file read, or looked for (`None`: no home to look in).
    pub file: Option<PathBuf>,
    pub schema: Schema,
    /// The role of a host that has not registered, from its name (the agents' rule).
    pub role_pattern: RolePattern,
    /// Credentials for fetching run logs (`jioctl logs`).
    pub swift: Option<jio_common::swift::SwiftSettings>,
    /// The maintenance hooks a driver runs (none: no role has hooks).
    pub hooks: crate::hooks::settings::HookSettings,
    /// How package snapshots are checked (`[repo]`).
    pub repo: RepoSettings,
}

/// No store was configured, and the embedded store of the default path does not
/// exist: a usage error (exit 64) that says how to give one.
#[derive(Debug, thiserror::Error)]
#[error("no store configured: {how}; the default, an embedded store, cannot be used: {reason}")]
pub struct NoStore {
    pub how: String,
    pub reason: String,
}

impl Config {
    /// Where a store is given: the flag, the variable, and the file (by its path).
    pub fn how_to_give_a_store(&self) -> String {
        let file = match &self.file {
            Some(p) => format!("store = \"URL\" in {}", p.display()),
            None => "store = \"URL\" in the configuration file (--config)".to_string(),
        };
        format!("give --store URL, set JIO_STORE, or write {file}")
    }
}

/// The default configuration file.
pub fn default_path() -> Option<PathBuf> {
    std::env::var_os("XDG_CONFIG_HOME")
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .map(|d| d.join("jiocloud/jioctl.toml"))
}

fn read(path: &Path, explicit: bool) -> anyhow::Result<FileConfig> {
    match std::fs::read_to_string(path) {
        Ok(t) => toml::from_str(&t).map_err(|e| {
            anyhow::anyhow!(jio_common::suggest::config_file_error(
                &path.display().to_string(),
                &e.to_string(),
                "  "
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => Ok(FileConfig::default()),
        Err(e) => Err(e).with_context(|| format!("{}: cannot read", path.display())),
    }
}

/// Merges the sources; every problem is reported together.
pub fn load(
    path: Option<&Path>,
    flags: &Flags,
    env: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<Config> {
    let (file, file_path) = match path {
        Some(p) => (read(p, true)?, Some(p.to_path_buf())),
        None => match default_path() {
            Some(p) => (read(&p, false)?, Some(p)),
            None => (FileConfig::default(), None),
        },
    };
    let file_name = file_path
        .as_ref()
        .map_or("the configuration".to_string(), |p| p.display().to_string());
    let pick =
        |flag: &Option<String>, var: &str, file: Option<String>| flag.clone().or_else(|| env(var)).or(file);
    let mut errors = Vec::new();
    let store_raw = pick(&flags.store, "JIO_STORE", file.store);
    let store_given = store_raw.is_some();
    let store = match store_raw {
        Some(s) => StoreUrl::parse(&s)
            .map_err(|e| errors.push(e.to_string()))
            .ok()
            .inspect(|u| errors.extend(u.check_files().into_iter().map(|e| format!("store: {e}")))),
        None => Some(default_store_url()),
    };
    let prefix = pick(&flags.prefix, "JIO_PREFIX", file.prefix);
    let schema = Schema::new(prefix.as_deref().unwrap_or(""))
        .map_err(|e| errors.push(format!("prefix: {e}")))
        .ok();
    let pattern = pick(&flags.role_pattern, "JIO_ROLE_PATTERN", file.role_pattern);
    let role_pattern = RolePattern::new(pattern.as_deref().unwrap_or(DEFAULT_ROLE_PATTERN))
        .map_err(|e| errors.push(format!("role_pattern {e}")))
        .ok();
    let roles = crate::hooks::settings::validate(&file_name, file.hooks)
        .map_err(|e| errors.extend(e))
        .unwrap_or_default();
    let hooks = crate::hooks::settings::HookSettings {
        roles,
        state_dir: env("JIO_STATE_DIR")
            .map(PathBuf::from)
            .or(file.state_dir)
            .unwrap_or_else(|| crate::hooks::settings::default_state_dir(&env)),
        swift: file.swift.clone(),
    };
    let repo = repo_settings(&file_name, file.repo, &mut errors);
    match (store, schema, role_pattern) {
        (Some(store), Some(schema), Some(role_pattern)) if errors.is_empty() => Ok(Config {
            store,
            store_given,
            file: file_path,
            schema,
            role_pattern,
            swift: file.swift,
            hooks,
            repo,
        }),
        _ => bail!("{}", errors.join("; ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(store: Option<&str>, prefix: Option<&str>, role_pattern: Option<&str>) -> Flags {
        Flags {
            store: store.map(String::from),
            prefix: prefix.map(String::from),
            role_pattern: role_pattern.map(String::from),
        }
    }

    #[test]
    fn precedence_and_unknown_keys() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("jioctl.toml");
        std::fs::write(&p, "store = \"etcd://file:1\"\nprefix = \"/f\"\n").unwrap();
        let env = |k: &str| (k == "JIO_STORE").then(|| "etcd://env:2".to_string());
        let c = load(Some(&p), &Flags::default(), env).unwrap();
        assert_eq!(c.store.to_string(), "etcd://env:2");
        assert_eq!(c.schema.prefix(), "/f");
        let c = load(Some(&p), &flags(Some("etcd://flag:3"), Some("/x"), None), env).unwrap();
        assert_eq!(c.store.to_string(), "etcd://flag:3");
        assert_eq!(c.schema.prefix(), "/x");
        std::fs::write(&p, "stroe = 1\n").unwrap();
        assert!(
            load(Some(&p), &Flags::default(), |_| None)
                .unwrap_err()
                .to_string()
                .contains("stroe")
        );
        let err = load(
            None,
            &flags(Some("nope://x"), Some("bad"), Some("^[a-z]+$")),
            |_| None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("nope://x") && err.contains("prefix") && err.contains("role_pattern \"^[a-z]+$\""),
            "{err}"
        );
    }

    #[test]
    fn the_example_hook_configuration_loads() {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/hooks/jioctl.toml");
        let c = load(Some(&p), &Flags::default(), |_| None).unwrap();
        let roles: Vec<&str> = c.hooks.roles.keys().map(|r| r.as_str()).collect();
        assert_eq!(roles, vec!["ceph", "compute"]);
        let compute = &c.hooks.roles[&jio_common::names::Role::new("compute").unwrap()];
        assert_eq!(compute.timeout, std::time::Duration::from_secs(45 * 60));
        // Every hook it names is shipped beside it.
        for spec in c.hooks.roles.values() {
            for argv in [&spec.before, &spec.after].into_iter().flatten() {
                let name = std::path::Path::new(&argv[0]).file_name().unwrap();
                assert!(p.with_file_name(name).exists(), "{}", argv[0]);
            }
        }
    }

    #[test]
    fn role_pattern_flag_env_file_default() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("jioctl.toml");
        let c = load(Some(&d.path().join("absent.toml")), &Flags::default(), |_| None);
        assert!(c.is_err(), "an explicit file that does not exist is an error");
        std::fs::write(&p, "").unwrap();
        let c = load(Some(&p), &Flags::default(), |_| None).unwrap();
        assert_eq!(c.role_pattern.as_str(), DEFAULT_ROLE_PATTERN);
        std::fs::write(&p, "role_pattern = \"^file-([a-z]+)$\"\n").unwrap();
        let c = load(Some(&p), &Flags::default(), |_| None).unwrap();
        assert_eq!(c.role_pattern.as_str(), "^file-([a-z]+)$");
        let env = |k: &str| (k == "JIO_ROLE_PATTERN").then(|| "^env-([a-z]+)$".to_string());
        let c = load(Some(&p), &Flags::default(), env).unwrap();
        assert_eq!(c.role_pattern.as_str(), "^env-([a-z]+)$");
        let c = load(Some(&p), &flags(None, None, Some("^flag-([a-z]+)$")), env).unwrap();
        assert_eq!(c.role_pattern.as_str(), "^flag-([a-z]+)$");
        std::fs::write(&p, "role_pattern = \"^(\"\n").unwrap();
        let err = load(Some(&p), &Flags::default(), |_| None)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("role_pattern \"^(\": "), "{err}");
    }
}
