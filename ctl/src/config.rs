//! jioctl's settings: flag > environment > `~/.config/jiocloud/jioctl.toml` > default.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use jio_common::keys::Schema;
use jio_common::store::{StoreUrl, default_store_url};
use serde::Deserialize;

/// The file's keys (unknown keys are errors).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    store: Option<String>,
    prefix: Option<String>,
    swift: Option<jio_common::swift::SwiftSettings>,
}

/// The validated settings.
#[derive(Debug, Clone)]
pub struct Config {
    pub store: StoreUrl,
    pub store_given: bool,
    pub schema: Schema,
    /// Credentials for fetching run logs (`jioctl logs`).
    pub swift: Option<jio_common::swift::SwiftSettings>,
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
        Ok(t) => toml::from_str(&t)
            .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.to_string().trim().replace('\n', " "))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => Ok(FileConfig::default()),
        Err(e) => Err(e).with_context(|| format!("{}: cannot read", path.display())),
    }
}

/// Merges the sources; every problem is reported together.
pub fn load(
    path: Option<&Path>,
    flag_store: Option<&str>,
    flag_prefix: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<Config> {
    let file = match path {
        Some(p) => read(p, true)?,
        None => match default_path() {
            Some(p) => read(&p, false)?,
            None => FileConfig::default(),
        },
    };
    let mut errors = Vec::new();
    let store_raw = flag_store
        .map(String::from)
        .or_else(|| env("JIO_STORE"))
        .or(file.store);
    let store_given = store_raw.is_some();
    let store = match store_raw {
        Some(s) => StoreUrl::parse(&s).map_err(|e| errors.push(e.to_string())).ok(),
        None => Some(default_store_url()),
    };
    let prefix = flag_prefix
        .map(String::from)
        .or_else(|| env("JIO_PREFIX"))
        .or(file.prefix);
    let schema = Schema::new(prefix.as_deref().unwrap_or(""))
        .map_err(|e| errors.push(format!("prefix: {e}")))
        .ok();
    match (store, schema) {
        (Some(store), Some(schema)) if errors.is_empty() => Ok(Config {
            store,
            store_given,
            schema,
            swift: file.swift,
        }),
        _ => bail!("{}", errors.join("; ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_and_unknown_keys() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("jioctl.toml");
        std::fs::write(&p, "store = \"etcd://file:1\"\nprefix = \"/f\"\n").unwrap();
        let env = |k: &str| (k == "JIO_STORE").then(|| "etcd://env:2".to_string());
        let c = load(Some(&p), None, None, env).unwrap();
        assert_eq!(c.store.to_string(), "etcd://env:2");
        assert_eq!(c.schema.prefix(), "/f");
        let c = load(Some(&p), Some("etcd://flag:3"), Some("/x"), env).unwrap();
        assert_eq!(c.store.to_string(), "etcd://flag:3");
        assert_eq!(c.schema.prefix(), "/x");
        std::fs::write(&p, "stroe = 1\n").unwrap();
        assert!(
            load(Some(&p), None, None, |_| None)
                .unwrap_err()
                .to_string()
                .contains("stroe")
        );
        let err = load(None, Some("nope://x"), Some("bad"), |_| None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("nope://x") && err.contains("prefix"), "{err}");
    }
}
