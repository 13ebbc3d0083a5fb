//! The Hiera data file (seed 003): every role's hosts and their addresses from
//! `/active_roles/<role>/<host>/<interface>`, for Puppet's `lookup()`, as
//! `etcdlookup::active_roles` (role → host → interface → address) and one key per
//! role, `etcdlookup::active_roles::<role>` (host → interface → address).
//!
//! Before each run of its own that may run Puppet (an upgrade's configuration
//! step, a composable rollout's tasks) the agent asks the store whether anything
//! under `/active_roles/` changed since it last read it (two counts in one
//! request), and reads it and writes the file only then (or when the file no
//! longer holds what it wrote); nothing watches the
//! prefix, so a fleet's registrations cost the store no event per host per
//! registration, and a rollout no read of every host's addresses per host. It is written atomically (a temporary
//! file renamed over it), and only when its text changes. Rendering is pure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use jio_common::keys::{Key, Parsed, Schema};
use jio_common::store::{DynStore, KeyValue, Revision, Seen, StoreError};

/// role → host → interface → address.
pub type ActiveRoles = BTreeMap<String, BTreeMap<String, BTreeMap<String, String>>>;

/// The file's text: block YAML, every scalar double-quoted (an address read from
/// the store cannot inject structure).
pub fn render(roles: &ActiveRoles) -> String {
    let q = |s: &str| {
        let mut out = String::from("\"");
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    };
    let hosts = |out: &mut String, hosts: &BTreeMap<String, BTreeMap<String, String>>, indent: &str| {
        for (h, ifaces) in hosts {
            out.push_str(&format!("{indent}{}:\n", q(h)));
            for (i, addr) in ifaces {
                out.push_str(&format!("{indent}  {}: {}\n", q(i), q(addr)));
            }
        }
    };
    let mut out = String::from("# Written by jio-agent from /active_roles/ in the store; do not edit.\n");
    if roles.is_empty() {
        out.push_str("\"etcdlookup::active_roles\": {}\n");
        return out;
    }
    out.push_str("\"etcdlookup::active_roles\":\n");
    for (role, hs) in roles {
        out.push_str(&format!("  {}:\n", q(role)));
        hosts(&mut out, hs, "    ");
    }
    for (role, hs) in roles {
        out.push_str(&format!("{}:\n", q(&format!("etcdlookup::active_roles::{role}"))));
        hosts(&mut out, hs, "  ");
    }
    out
}

/// Adds (or with `None`, removes) one `/active_roles/` key's entry.
fn apply(roles: &mut ActiveRoles, schema: &Schema, key: &Key, value: Option<&str>) {
    let Some(Parsed::ActiveRole(r, h, i)) = schema.parse(key) else {
        return;
    };
    match value {
        Some(v) => {
            roles
                .entry(r.to_string())
                .or_default()
                .entry(h.to_string())
                .or_default()
                .insert(i.as_str().to_string(), v.to_string());
        }
        None => {
            if let Some(hs) = roles.get_mut(r.as_str()) {
                if let Some(ifs) = hs.get_mut(h.as_str()) {
                    ifs.remove(i.as_str());
                    if ifs.is_empty() {
                        hs.remove(h.as_str());
                    }
                }
                if hs.is_empty() {
                    roles.remove(r.as_str());
                }
            }
        }
    }
}

/// A stored entry; one that is not text is left out, named.
fn put(roles: &mut ActiveRoles, schema: &Schema, kv: &KeyValue) {
    if kv.not_text {
        tracing::warn!(key = %kv.key, "not text: left out of the hiera data");
        apply(roles, schema, &kv.key, None);
    } else {
        apply(roles, schema, &kv.key, Some(&kv.value));
    }
}

fn from_kvs(schema: &Schema, kvs: &[KeyValue]) -> ActiveRoles {
    let mut roles = ActiveRoles::new();
    for kv in kvs {
        put(&mut roles, schema, kv);
    }
    roles
}

/// Writes `text` to `path` atomically, creating its directory; nothing when the
/// file already holds it. Whether it wrote.
pub fn write(path: &Path, text: &str) -> std::io::Result<bool> {
    if std::fs::read_to_string(path).is_ok_and(|t| t == text) {
        return Ok(false);
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("yaml.jio-tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(true)
}

/// What the file was last written from: the listing's revision and key count, a
/// digest of the text written, and one of the store it was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Written {
    revision: Revision,
    keys: usize,
    newest: Revision,
    text: u64,
    store: u64,
}

fn digest(text: &str) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// What the file was last written from, kept in memory and in the state directory
/// (`hiera.json`): an agent restarted (a package upgrade restarts the whole fleet's)
/// need not read every host's addresses again when nothing changed. What another
/// store, or another build's digest, wrote is not trusted: the next run reads.
pub struct Memo {
    last: Mutex<Option<Written>>,
    kept: Option<PathBuf>,
    store: u64,
}

impl Memo {
    /// Kept in memory only. `store` names where the data comes from (`source`).
    pub fn new(store: &str) -> Memo {
        Memo {
            last: Mutex::new(None),
            kept: None,
            store: digest(store),
        }
    }

    /// Kept in `<state_dir>/hiera.json` too, and read from it when memory has
    /// nothing (at the first run after a start).
    pub fn kept_in(state_dir: &Path, store: &str) -> Memo {
        Memo {
            kept: Some(state_dir.join("hiera.json")),
            ..Memo::new(store)
        }
    }

    fn get(&self) -> Option<Written> {
        let mut last = self.last.lock().ok()?;
        if last.is_none() {
            *last = self
                .kept
                .as_ref()
                .and_then(|p| std::fs::read_to_string(p).ok())
                .and_then(|t| serde_json::from_str::<Written>(&t).ok())
                .filter(|w| w.store == self.store);
        }
        *last
    }

    fn set(&self, w: Option<Written>) {
        if let Ok(mut last) = self.last.lock() {
            *last = w;
        }
        let Some(p) = &self.kept else { return };
        let kept = w
            .and_then(|w| serde_json::to_string(&w).ok())
            .is_some_and(|text| crate::state::write_atomic(p, text.as_bytes()).is_ok());
        if !kept {
            // A stale one would be trusted; a missing one only costs a read.
            let _ = std::fs::remove_file(p);
        }
    }
}

/// What a `Memo` is kept for: the store, the schema's prefix and the file, as one
/// string (only its digest is kept).
pub fn source(store: &str, schema: &Schema, file: Option<&Path>) -> String {
    format!(
        "{store}\n{}\n{}",
        schema.active_roles(),
        file.map(|f| f.display().to_string()).unwrap_or_default()
    )
}

/// Brings the file up to date with `/active_roles/`. `memo` is what the file was
/// last written from: when the file still holds that text and the store says
/// nothing under the prefix changed since (one small request), nothing is read;
/// otherwise the prefix is read and the file written, and `memo` moves on. A
/// fleet's hosts then read every host's addresses only when they change, not on
/// every run.
pub async fn refresh(store: &DynStore, schema: &Schema, path: &Path, memo: &Memo) -> Result<(), StoreError> {
    let prefix = schema.active_roles();
    if let Some(last) = memo.get()
        && store.counts_changes()
        && std::fs::read_to_string(path).is_ok_and(|t| digest(&t) == last.text)
        && !store
            .changed_since(
                &prefix,
                &Seen {
                    revision: last.revision,
                    keys: last.keys,
                    newest: last.newest,
                },
            )
            .await?
    {
        return Ok(());
    }
    let listing = store.list(&prefix).await?;
    let text = render(&from_kvs(schema, &listing.kvs));
    let saved = save(path, &text);
    let seen = Seen::of(&listing);
    memo.set(saved.then(|| Written {
        revision: seen.revision,
        keys: seen.keys,
        newest: seen.newest,
        text: digest(&text),
        store: memo.store,
    }));
    Ok(())
}

/// Writes the file; whether it holds `text` now.
fn save(path: &Path, text: &str) -> bool {
    match write(path, text) {
        Ok(true) => {
            tracing::info!(file = %path.display(), "hiera data written");
            true
        }
        Ok(false) => true,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "cannot write the hiera data file");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_hosts_and_addresses_render_as_quoted_yaml() {
        let schema = Schema::default();
        let kv = |k: &str, v: &str| KeyValue {
            key: Key::new(k).unwrap(),
            value: v.to_string(),
            mod_revision: 1,
            create_revision: 1,
            version: 1,
            lease: None,
            not_text: false,
        };
        let mut roles = from_kvs(
            &schema,
            &[
                kv("/active_roles/controller/controller1/eth0", "10.0.0.1"),
                kv("/active_roles/controller/controller2/eth0", "10.0.0.2"),
                kv("/active_roles/compute/compute1/eth0", "evil\"\n: {x}"),
            ],
        );
        let text = render(&roles);
        assert!(
            text.contains(
                "\"etcdlookup::active_roles::controller\":\n  \"controller1\":\n    \"eth0\": \"10.0.0.1\"\n"
            ),
            "{text}"
        );
        assert!(text.contains("\"eth0\": \"evil\\\"\\u000a: {x}\""), "{text}");
        apply(
            &mut roles,
            &schema,
            &Key::new("/active_roles/controller/controller2/eth0").unwrap(),
            None,
        );
        let text = render(&roles);
        assert!(!text.contains("controller2"), "{text}");
        apply(
            &mut roles,
            &schema,
            &Key::new("/active_roles/compute/compute1/eth0").unwrap(),
            None,
        );
        assert!(!render(&roles).contains("compute"), "an emptied role goes");
    }

    #[test]
    fn the_file_is_replaced_whole_and_only_on_change() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("hieradata/jiocloud.yaml");
        assert!(write(&p, "a: 1\n").unwrap());
        assert!(!write(&p, "a: 1\n").unwrap());
        assert!(write(&p, "a: 2\n").unwrap());
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "a: 2\n");
        assert_eq!(
            std::fs::read_dir(p.parent().unwrap()).unwrap().count(),
            1,
            "no temporary left"
        );
    }
}
