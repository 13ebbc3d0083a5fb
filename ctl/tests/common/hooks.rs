//! Stand-in maintenance hooks that log their own start and end (with the wall
//! clock) and their environment to one shared file, and the jioctl configuration
//! that runs them: the tests judge the hooks' intervals from that log and the
//! configuration step's own log, never from jioctl's classification.
//!
//! A hook's behaviour is set per host by files in its directory: `fail-<hook>-<host>`
//! makes it print a reason and exit 3, `hang-<hook>-<host>` makes it wait (until
//! stopped) the first time only, `seconds` is how long it takes.

#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

use std::path::{Path, PathBuf};

/// The hooks' directory, their script and the configuration file.
pub struct Hooks {
    pub dir: tempfile::TempDir,
}

/// One run of a hook, from the shared log.
#[derive(Debug, Clone)]
pub struct HookRun {
    pub host: String,
    pub hook: String,
    pub start: f64,
    /// `None`: never ended (still running, or its process was killed outright).
    pub end: Option<f64>,
    /// `exit N`, or `stopped` (SIGTERM).
    pub how: Option<String>,
    /// Its environment: `JIO_ROLE=...` and the others, `JIO_STORE=...` if set.
    pub env: String,
}

impl Hooks {
    /// Stand-in hooks taking `seconds` each.
    pub fn new(seconds: f64) -> Hooks {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("hook.sh");
        std::fs::write(
            &script,
            r#"#!/bin/sh
# A stand-in maintenance hook: logs its start, its environment and its end.
dir=$(dirname "$0")
hook=$1
now() { date +%s.%N; }
log="$dir/hooks.log"
echo "start $JIO_HOST $hook $(now) role=$JIO_ROLE version=$JIO_VERSION rollout=$JIO_ROLLOUT hook=$JIO_HOOK store=${JIO_STORE:-none} etcdctl=${ETCDCTL_ENDPOINTS:-none}" >> "$log"
trap 'echo "end $JIO_HOST $hook $(now) stopped" >> "$log"; exit 143' TERM
if [ -e "$dir/hang-$hook-$JIO_HOST" ]; then
  rm -f "$dir/hang-$hook-$JIO_HOST"
  sleep 120 & wait $!
fi
sleep "$(cat "$dir/seconds")" & wait $!
if [ -e "$dir/fail-$hook-$JIO_HOST" ]; then
  echo "nova: 2 instances left on $JIO_HOST" >&2
  echo "end $JIO_HOST $hook $(now) exit 3" >> "$log"
  exit 3
fi
echo "$hook done on $JIO_HOST"
echo "end $JIO_HOST $hook $(now) exit 0" >> "$log"
"#,
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        std::fs::write(dir.path().join("seconds"), seconds.to_string()).unwrap();
        Hooks { dir }
    }

    pub fn script(&self) -> PathBuf {
        self.dir.path().join("hook.sh")
    }

    /// A jioctl configuration giving role `compute` both hooks (`timeout`), with
    /// the driver's state directory in the hooks' directory.
    pub fn config(&self, timeout: &str) -> PathBuf {
        self.config_with(timeout, "")
    }

    /// `config`, with `tables` (a `[swift]` section) after the hooks'.
    pub fn config_with(&self, timeout: &str, tables: &str) -> PathBuf {
        let s = self.script().display().to_string();
        self.config_text(&format!(
            "[hooks.compute]\nbefore = [\"{s}\", \"before\"]\nafter = [\"{s}\", \"after\"]\ntimeout = \"{timeout}\"\n{tables}"
        ))
    }

    /// A configuration file with `hooks` (and the state directory), written.
    pub fn config_text(&self, hooks: &str) -> PathBuf {
        let p = self.dir.path().join("jioctl.toml");
        let state = self.state_dir();
        std::fs::write(&p, format!("state_dir = \"{}\"\n{hooks}", state.display())).unwrap();
        p
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Makes `host`'s `hook` fail (exit 3 with a reason).
    pub fn fail(&self, hook: &str, host: &str) {
        std::fs::write(self.dir.path().join(format!("fail-{hook}-{host}")), "").unwrap();
    }

    /// Makes `host`'s `hook` wait until stopped, the first time it runs.
    pub fn hang_once(&self, hook: &str, host: &str) {
        std::fs::write(self.dir.path().join(format!("hang-{hook}-{host}")), "").unwrap();
    }

    /// Every hook run in the shared log, in start order.
    pub fn runs(&self) -> Vec<HookRun> {
        runs_in(&self.dir.path().join("hooks.log"))
    }

    /// Each host's interval in its slot: from its (first) `before` start to the end
    /// of its `after` (`None`: not ended yet).
    pub fn intervals(&self) -> Vec<(String, f64, Option<f64>)> {
        let runs = self.runs();
        let mut hosts: Vec<&str> = runs.iter().map(|r| r.host.as_str()).collect();
        hosts.dedup();
        hosts.sort();
        hosts.dedup();
        hosts
            .into_iter()
            .filter_map(|h| {
                let first = runs.iter().find(|r| r.host == h && r.hook == "before")?;
                let after_end = runs
                    .iter()
                    .filter(|r| r.host == h && r.hook == "after" && r.how.as_deref() == Some("exit 0"))
                    .find_map(|r| r.end);
                Some((h.to_string(), first.start, after_end))
            })
            .collect()
    }
}

fn runs_in(log: &Path) -> Vec<HookRun> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut runs: Vec<HookRun> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(kind), Some(host), Some(hook), Some(at)) = (f.first(), f.get(1), f.get(2), f.get(3)) else {
            continue;
        };
        let at: f64 = at.parse().unwrap();
        match *kind {
            "start" => runs.push(HookRun {
                host: host.to_string(),
                hook: hook.to_string(),
                start: at,
                end: None,
                how: None,
                env: f[4..].join(" "),
            }),
            _ => {
                if let Some(r) = runs
                    .iter_mut()
                    .rev()
                    .find(|r| r.host == *host && r.hook == *hook && r.end.is_none())
                {
                    r.end = Some(at);
                    r.how = Some(f[4..].join(" "));
                }
            }
        }
    }
    runs
}

/// The most slots (before start .. after end) that overlapped at one instant.
pub fn max_slots_at_once(intervals: &[(String, f64, Option<f64>)]) -> (usize, Vec<String>) {
    let mut best = (0, Vec::new());
    for (_, t, _) in intervals {
        let at: Vec<String> = intervals
            .iter()
            .filter(|(_, s, e)| s <= t && e.is_none_or(|e| e > *t))
            .map(|(h, _, _)| h.clone())
            .collect();
        if at.len() > best.0 {
            best = (at.len(), at);
        }
    }
    best
}

/// Every value `key` ever held, from the store's history (a watch from its first
/// revision, read until it goes quiet).
pub async fn values_ever(s: &jio_common::store::DynStore, key: &str) -> Vec<String> {
    use futures_util::StreamExt as _;
    let key = jio_common::keys::Key::new(key).unwrap();
    let mut w = s.watch(&key, 1).await.unwrap();
    let mut out = Vec::new();
    while let Ok(Some(Ok(ev))) = tokio::time::timeout(std::time::Duration::from_millis(500), w.next()).await {
        if let jio_common::store::WatchEvent::Put(kv) = ev
            && kv.key == key
        {
            out.push(kv.value);
        }
    }
    out
}
