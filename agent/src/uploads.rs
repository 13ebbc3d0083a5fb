//! Run logs to Swift, without ever losing one or holding up a report.
//!
//! A step's report is written at once with an empty value. Once it is in the store,
//! its log is queued on disk (`<state_dir>/uploads/<id>.json` beside `<id>.log`); a
//! background task uploads the queue oldest first, with backoff while Swift is down
//! or refuses, and then writes the object's URL into the status leaf, but only if
//! the leaf is still the entry the log belongs to (its mod revision is unchanged).
//! The queue survives restarts and is bounded: the oldest logs give way first.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use jio_common::backoff::Backoff;
use jio_common::keys::Key;
use jio_common::store::{Compare, DynStore, Op, Revision, Txn, TxnOutcome};
use jio_common::swift::SwiftClient;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

/// Most logs kept waiting; beyond it the oldest are dropped (and that is logged).
pub const MAX_QUEUED: usize = 200;
/// Most bytes kept waiting.
pub const MAX_QUEUED_BYTES: u64 = 256 * 1024 * 1024;

/// One queued upload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Object name in the container: `<host>/<version>/<UTC time>-<phase>.log`.
    pub object: String,
    /// The status leaf to link.
    pub key: String,
    /// The leaf's mod revision when it was written.
    pub revision: Revision,
    /// The run result the log belongs to, linked too once uploaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<ResultLink>,
}

/// Which run result a log belongs to: the result at `key` of the run of `version`
/// that ended at `at` (a newer run's result is never given an older log).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultLink {
    pub key: String,
    pub version: String,
    pub at: u64,
}

pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("uploads")
}

/// Puts a composed log (already in the uploads directory) in the queue.
pub fn enqueue(state_dir: &Path, log: &Path, entry: &Entry) -> std::io::Result<()> {
    let meta = log.with_extension("json");
    crate::state::write_atomic(&meta, &serde_json::to_vec(entry).unwrap_or_default())
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    bound(state_dir);
    Ok(())
}

/// How many logs wait to be uploaded.
pub fn queue_length(state_dir: &Path) -> usize {
    queued(state_dir).len()
}

/// Queued entries, oldest first: (metadata path, log path).
fn queued(state_dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    let Ok(rd) = std::fs::read_dir(dir(state_dir)) else {
        return Vec::new();
    };
    let mut out: Vec<(PathBuf, PathBuf)> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let log = p.with_extension("log");
            (p, log)
        })
        .collect();
    out.sort();
    out
}

fn remove(meta: &Path, log: &Path) {
    let _ = std::fs::remove_file(meta);
    let _ = std::fs::remove_file(log);
}

/// Drops the oldest logs beyond the bounds.
fn bound(state_dir: &Path) {
    let q = queued(state_dir);
    let mut bytes: u64 = q
        .iter()
        .map(|(_, l)| std::fs::metadata(l).map(|m| m.len()).unwrap_or(0))
        .sum();
    let mut count = q.len();
    for (meta, log) in q {
        if count <= MAX_QUEUED && bytes <= MAX_QUEUED_BYTES {
            break;
        }
        let size = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        tracing::warn!(log = %log.display(), "upload queue full: dropping the oldest log");
        remove(&meta, &log);
        count -= 1;
        bytes = bytes.saturating_sub(size);
    }
}

/// Composes the files of one step into one log in the uploads directory.
pub fn compose(state_dir: &Path, id: &str, header: &str, files: &[PathBuf]) -> std::io::Result<PathBuf> {
    use std::io::Write as _;
    let d = dir(state_dir);
    std::fs::create_dir_all(&d)?;
    let path = d.join(format!("{id}.log"));
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path)?);
    writeln!(out, "== {header}")?;
    for f in files {
        let Ok(content) = std::fs::read(f) else { continue };
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        writeln!(out, "== {name} ({} bytes)", content.len())?;
        out.write_all(&content)?;
        if !content.ends_with(b"\n") && !content.is_empty() {
            writeln!(out)?;
        }
    }
    out.flush()?;
    out.get_ref().sync_all()?;
    Ok(path)
}

/// What one attempt at the queue's head did.
enum Attempt {
    Empty,
    Done,
    /// Swift or the store failed; wait before trying again.
    Failed(String),
}

/// The background uploader.
pub struct Uploader {
    state_dir: PathBuf,
    client: Arc<SwiftClient>,
    store: DynStore,
    pub wake: Arc<Notify>,
}

impl Uploader {
    pub fn new(state_dir: PathBuf, client: Arc<SwiftClient>, store: DynStore) -> Uploader {
        Uploader {
            state_dir,
            client,
            store,
            wake: Arc::new(Notify::new()),
        }
    }

    async fn attempt(&self) -> Attempt {
        let Some((meta, log)) = queued(&self.state_dir).into_iter().next() else {
            return Attempt::Empty;
        };
        let entry: Entry = match std::fs::read(&meta)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
        {
            Some(e) => e,
            None => {
                tracing::warn!(path = %meta.display(), "unreadable upload entry; dropping it");
                remove(&meta, &log);
                return Attempt::Done;
            }
        };
        let body = match tokio::fs::read(&log).await {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(path = %log.display(), error = %e, "queued log is gone; dropping its entry");
                remove(&meta, &log);
                return Attempt::Done;
            }
        };
        let url = match self.client.upload(&entry.object, body).await {
            Ok(u) => u,
            Err(e) => return Attempt::Failed(e.to_string()),
        };
        let Ok(key) = Key::new(entry.key.clone()) else {
            remove(&meta, &log);
            return Attempt::Done;
        };
        match link(&self.store, &key, entry.revision, &url).await {
            Ok(true) => tracing::info!(key = %key, %url, "run log uploaded and linked"),
            Ok(false) => {
                tracing::info!(key = %key, %url, "run log uploaded; its status entry was replaced meanwhile, so it is not linked")
            }
            Err(e) => return Attempt::Failed(e.to_string()),
        }
        if let Some(link) = &entry.result
            && let Ok(rkey) = Key::new(link.key.clone())
        {
            let linked = crate::results::update(&self.store, &rkey, |r| {
                let same_run = r.version.as_str() == link.version && r.at == link.at;
                if same_run && r.log.as_deref() != Some(url.as_str()) {
                    r.log = Some(url.clone());
                    return true;
                }
                false
            })
            .await;
            match linked {
                Ok(true) => tracing::info!(key = %rkey, %url, "run log linked from the run result"),
                Ok(false) => {}
                Err(e) => return Attempt::Failed(e.to_string()),
            }
        }
        remove(&meta, &log);
        Attempt::Done
    }

    /// Uploads until the queue is empty or `deadline` passes (for `once`).
    pub async fn drain(&self, deadline: Duration) -> usize {
        let end = tokio::time::Instant::now() + deadline;
        loop {
            match tokio::time::timeout_at(end, self.attempt()).await {
                Ok(Attempt::Done) => continue,
                Ok(Attempt::Empty) => return 0,
                Ok(Attempt::Failed(reason)) => {
                    tracing::warn!(%reason, "run logs not uploaded yet; they stay queued for the next run");
                    return queued(&self.state_dir).len();
                }
                Err(_) => return queued(&self.state_dir).len(),
            }
        }
    }

    /// Runs until `stop` turns true.
    pub async fn run(self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(300));
        let mut failing: Option<String> = None;
        loop {
            if *stop.borrow() {
                return;
            }
            let wait = match self.attempt().await {
                Attempt::Done => {
                    if failing.take().is_some() {
                        tracing::info!("run log uploads resumed");
                    }
                    backoff.succeed();
                    continue;
                }
                Attempt::Empty => Duration::from_secs(300),
                Attempt::Failed(reason) => {
                    if failing.as_deref() != Some(reason.as_str()) {
                        tracing::error!(%reason, queued = queued(&self.state_dir).len(), "cannot upload run logs; retrying with backoff");
                        failing = Some(reason);
                    }
                    backoff.fail()
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.wake.notified() => {}
                _ = stop.changed() => return,
            }
        }
    }
}

/// Writes `url` into the status leaf `key` if it is still the entry the report
/// wrote at `revision`; whether it did. A leaf whose mod revision is before
/// `revision` is that entry too: a store that skips a write of a key's current
/// value (Consul ≥ 1.6) left it as it was, so it is fenced on what it holds.
async fn link(
    store: &DynStore,
    key: &Key,
    revision: Revision,
    url: &str,
) -> Result<bool, jio_common::store::StoreError> {
    let mut expect = revision;
    for _ in 0..2 {
        let txn = Txn::new()
            .when(Compare::ModRevision(key.clone(), expect))
            .then(Op::put(key.clone(), url.to_string()));
        if let TxnOutcome::Committed(_) = store.txn(txn).await? {
            return Ok(true);
        }
        match store.get(key).await? {
            Some(kv) if kv.mod_revision < revision => expect = kv.mod_revision,
            _ => return Ok(false),
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_is_bounded_oldest_first() {
        let d = tempfile::tempdir().unwrap();
        for i in 0..(MAX_QUEUED + 3) {
            let log = compose(d.path(), &format!("{i:06}"), "h", &[]).unwrap();
            let e = Entry {
                object: format!("o{i}"),
                key: "/k".into(),
                revision: 1,
                result: None,
            };
            enqueue(d.path(), &log, &e).unwrap();
        }
        let q = queued(d.path());
        assert_eq!(q.len(), MAX_QUEUED);
        assert!(q[0].0.ends_with("000003.json"), "{:?}", q[0]);
    }

    /// On Consul a report that wrote a status leaf's current value again left its
    /// mod revision where it was: the log is still linked to it. A leaf replaced
    /// after the report is not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leaf_consul_kept_as_it_was_is_still_linked() {
        use jio_common::store::{ConsulStore, StoreUrl};
        let server = jio_tests::consul::ConsulServer::start(Default::default()).await;
        let url = StoreUrl::parse(&server.url()).unwrap();
        let store: DynStore = Arc::new(ConsulStore::new(&url, Duration::from_secs(2)).unwrap());
        let leaf = Key::new("/status/validated/success/v2/h1").unwrap();
        let other = Key::new("/results/h1").unwrap();
        let first = store.put(&leaf, "", None).await.unwrap();
        let report = Txn::new()
            .then(Op::put(leaf.clone(), ""))
            .then(Op::put(other.clone(), "second run"));
        let TxnOutcome::Committed(second) = store.txn(report).await.unwrap() else {
            panic!("an unconditional transaction")
        };
        let kept = store.get(&leaf).await.unwrap().unwrap().mod_revision;
        assert_eq!(kept, first, "Consul skipped the same-value write");
        assert!(second > first);
        assert!(link(&store, &leaf, second, "https://swift/log").await.unwrap());
        assert_eq!(
            store.get(&leaf).await.unwrap().unwrap().value,
            "https://swift/log"
        );
        // Replaced after the report (a later run): not linked.
        let later = store.put(&leaf, "", None).await.unwrap();
        assert!(!link(&store, &leaf, second, "https://swift/old").await.unwrap());
        assert_eq!(store.get(&leaf).await.unwrap().unwrap().mod_revision, later);
    }

    #[test]
    fn compose_names_each_part() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("puppet.stdout");
        std::fs::write(&a, "hello").unwrap();
        let log = compose(
            d.path(),
            "x",
            "host h1, version v2, configured",
            &[a, d.path().join("missing")],
        )
        .unwrap();
        let text = std::fs::read_to_string(log).unwrap();
        assert_eq!(
            text,
            "== host h1, version v2, configured\n== puppet.stdout (5 bytes)\nhello\n"
        );
    }
}
