//! The embedded store: etcd's semantics in one SQLite file (WAL mode), safe for
//! several processes on one host at once.
//!
//! Writes take SQLite's write lock (`BEGIN IMMEDIATE`), so revisions are assigned in
//! commit order across processes. Every change is also appended to an event log,
//! which watches read. Leases carry an absolute expiry time; expired leases are swept
//! (their keys deleted, as a revision of their own) on every access and by the event
//! pump while anyone watches. One pump thread per process notices commits (its own
//! process's at once, other processes' through `PRAGMA data_version` every 10 ms)
//! and fans new events out to that process's watches.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc as std_mpsc};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use tokio::sync::{broadcast, mpsc};

use super::api::{
    Compare, Create, KeyValue, Lease, LeaseId, Listing, Op, Result, Revision, Store, StoreError, Txn,
    TxnOutcome, WatchEvent, WatchStream,
};
use super::support::{overlapping_ops, prefix_end};
use crate::keys::Key;

/// History kept for watches that fall behind; older events are compacted away.
const EVENT_HISTORY: i64 = 100_000;
const POLL: Duration = Duration::from_millis(10);
const SWEEP_EVERY: Duration = Duration::from_millis(200);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('revision', 1), ('compact_revision', 0), ('next_lease', 1);
CREATE TABLE IF NOT EXISTS kv (
    key BLOB PRIMARY KEY, value TEXT NOT NULL,
    create_rev INTEGER NOT NULL, mod_rev INTEGER NOT NULL, version INTEGER NOT NULL, lease INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_by_lease ON kv(lease) WHERE lease IS NOT NULL;
CREATE TABLE IF NOT EXISTS events (
    rev INTEGER NOT NULL, seq INTEGER NOT NULL, key BLOB NOT NULL, value TEXT,
    create_rev INTEGER, version INTEGER, lease INTEGER,
    PRIMARY KEY (rev, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS leases (id INTEGER PRIMARY KEY, ttl_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS leases_by_expiry ON leases(expires_ms);
";

/// The embedded store in one SQLite file.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    url: String,
    path: PathBuf,
    conn: Mutex<Connection>,
    pump: Mutex<Option<Pump>>,
    stop: Arc<AtomicBool>,
}

struct Pump {
    events: broadcast::Sender<Arc<Batch>>,
    wake: std_mpsc::Sender<()>,
}

/// Events the pump read from the log: everything up to and including `upto`.
struct Batch {
    events: Vec<WatchEvent>,
    upto: Revision,
    /// Part of the history was compacted before the pump could read it.
    gap: bool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Lease deadlines are wall-clock milliseconds: they are shared through the file
/// with other processes, so they cannot be on any one process's clock.
#[allow(clippy::disallowed_methods)]
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn open_conn(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    Ok(conn)
}

impl SqliteStore {
    /// Opens (creating when missing) the store file and its parent directory.
    pub async fn open(path: &Path) -> Result<SqliteStore> {
        SqliteStore::open_with(path, Create::FileAndDirs).await
    }

    /// Opens the store file; `create` says whether a missing file, and a missing
    /// directory, may be created.
    pub async fn open_with(path: &Path, create: Create) -> Result<SqliteStore> {
        let url = format!("sqlite://{}", path.display());
        let path = path.to_path_buf();
        let u = url.clone();
        let p = path.clone();
        let conn = tokio::task::spawn_blocking(move || -> Result<Connection> {
            let refuse = |reason: String| StoreError::InvalidUrl {
                url: u.clone(),
                reason,
            };
            let dir = p.parent().filter(|d| !d.as_os_str().is_empty());
            match create {
                Create::Never if !p.exists() => {
                    return Err(refuse(format!(
                        "{} does not exist (read-only commands never create a store; check the path)",
                        p.display()
                    )));
                }
                Create::File if dir.is_some_and(|d| !d.is_dir()) => {
                    return Err(refuse(format!(
                        "directory {} does not exist (jioctl never creates directories)",
                        dir.map(|d| d.display().to_string()).unwrap_or_default()
                    )));
                }
                Create::FileAndDirs => {
                    if let Some(dir) = dir {
                        std::fs::create_dir_all(dir).map_err(|e| StoreError::Unavailable {
                            url: u.clone(),
                            op: "open",
                            reason: format!("cannot create {}: {e}", dir.display()),
                        })?;
                    }
                }
                _ => {}
            }
            let wrap = |source| StoreError::Sqlite {
                url: u.clone(),
                op: "open",
                source,
            };
            let conn = open_conn(&p).map_err(&wrap)?;
            conn.execute_batch(SCHEMA).map_err(&wrap)?;
            Ok(conn)
        })
        .await
        .map_err(|e| StoreError::Unavailable {
            url: url.clone(),
            op: "open",
            reason: e.to_string(),
        })??;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                url,
                path,
                conn: Mutex::new(conn),
                pump: Mutex::new(None),
                stop: Arc::new(AtomicBool::new(false)),
            }),
        })
    }

    /// Runs `f` on the connection in a blocking thread.
    async fn blocking<T: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let inner = self.inner.clone();
        let res = tokio::task::spawn_blocking(move || {
            let mut conn = inner.conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut conn)
        })
        .await
        .map_err(|e| StoreError::Unavailable {
            url: self.inner.url.clone(),
            op,
            reason: e.to_string(),
        })?;
        if let Some(p) = self.inner.pump.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            let _ = p.wake.send(());
        }
        res
    }

    fn wrap(&self, op: &'static str) -> impl Fn(rusqlite::Error) -> StoreError + Send + 'static {
        let url = self.inner.url.clone();
        move |source| StoreError::Sqlite {
            url: url.clone(),
            op,
            source,
        }
    }

    /// A write transaction: sweeps expired leases, then runs `f`.
    async fn write<T: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut Writer<'_>) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let wrap = self.wrap(op);
        let url = self.inner.url.clone();
        self.blocking(op, move |conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(&wrap)?;
            let mut w = Writer::begin(&tx, url).map_err(&wrap)?;
            w.sweep(now_ms()).map_err(&wrap)?;
            let out = f(&mut w)?;
            w.finish().map_err(&wrap)?;
            tx.commit().map_err(&wrap)?;
            Ok(out)
        })
        .await
    }

    /// A read at one revision; sweeps first when a lease has expired.
    async fn read<T: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&rusqlite::Transaction<'_>, Revision) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T> {
        let wrap = self.wrap(op);
        let url = self.inner.url.clone();
        self.blocking(op, move |conn| {
            let now = now_ms();
            let expired: Option<i64> = conn
                .query_row(
                    "SELECT 1 FROM leases WHERE expires_ms <= ?1 LIMIT 1",
                    [now],
                    |r| r.get(0),
                )
                .optional()
                .map_err(&wrap)?;
            if expired.is_some() {
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(&wrap)?;
                let mut w = Writer::begin(&tx, url).map_err(&wrap)?;
                w.sweep(now).map_err(&wrap)?;
                w.finish().map_err(&wrap)?;
                tx.commit().map_err(&wrap)?;
            }
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Deferred)
                .map_err(&wrap)?;
            let rev = meta(&tx, "revision").map_err(&wrap)?;
            let out = f(&tx, rev).map_err(&wrap)?;
            tx.commit().map_err(&wrap)?;
            Ok(out)
        })
        .await
    }

    fn pump(&self) -> Result<broadcast::Receiver<Arc<Batch>>> {
        let mut slot = self.inner.pump.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = slot.as_ref() {
            return Ok(p.events.subscribe());
        }
        let conn = open_conn(&self.inner.path).map_err(self.wrap("watch"))?;
        let start = meta(&conn, "revision").map_err(self.wrap("watch"))?;
        let (events, rx) = broadcast::channel(4096);
        let (wake, wake_rx) = std_mpsc::channel();
        let stop = self.inner.stop.clone();
        let tx = events.clone();
        let url = self.inner.url.clone();
        std::thread::Builder::new()
            .name("jio-sqlite-pump".into())
            .spawn(move || pump_thread(conn, url, start, tx, wake_rx, stop))
            .map_err(|e| StoreError::Unavailable {
                url: self.inner.url.clone(),
                op: "watch",
                reason: format!("cannot start the event thread: {e}"),
            })?;
        *slot = Some(Pump { events, wake });
        Ok(rx)
    }
}

fn meta(conn: &Connection, name: &str) -> rusqlite::Result<i64> {
    conn.query_row("SELECT value FROM meta WHERE name = ?1", [name], |r| r.get(0))
}

fn set_meta(conn: &Connection, name: &str, v: i64) -> rusqlite::Result<()> {
    conn.execute("UPDATE meta SET value = ?2 WHERE name = ?1", params![name, v])?;
    Ok(())
}

/// Applies changes inside one SQLite write transaction, assigning revisions.
struct Writer<'c> {
    tx: &'c rusqlite::Transaction<'c>,
    url: String,
    /// The last committed revision.
    current: Revision,
    /// Changes were made at `current + 1`.
    dirty: bool,
    seq: i64,
}

impl<'c> Writer<'c> {
    fn begin(tx: &'c rusqlite::Transaction<'c>, url: String) -> rusqlite::Result<Writer<'c>> {
        Ok(Writer {
            tx,
            url,
            current: meta(tx, "revision")?,
            dirty: false,
            seq: 0,
        })
    }

    fn rev(&self) -> Revision {
        self.current + 1
    }

    fn event(
        &mut self,
        key: &[u8],
        value: Option<&str>,
        create: i64,
        version: i64,
        lease: Option<i64>,
    ) -> rusqlite::Result<()> {
        self.tx.execute(
            "INSERT INTO events (rev, seq, key, value, create_rev, version, lease) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![self.rev(), self.seq, key, value, create, version, lease],
        )?;
        self.seq += 1;
        self.dirty = true;
        Ok(())
    }

    /// Closes the revision being written, if anything changed.
    fn finish(&mut self) -> rusqlite::Result<()> {
        if self.dirty {
            self.current += 1;
            set_meta(self.tx, "revision", self.current)?;
            self.dirty = false;
            self.seq = 0;
            if self.current % 1000 == 0 {
                let keep_from = self.current - EVENT_HISTORY;
                if keep_from > meta(self.tx, "compact_revision")? {
                    self.compact(keep_from)?;
                }
            }
        }
        Ok(())
    }

    fn compact(&self, revision: Revision) -> rusqlite::Result<()> {
        self.tx.execute("DELETE FROM events WHERE rev < ?1", [revision])?;
        set_meta(self.tx, "compact_revision", revision)
    }

    /// Ends every expired lease, deleting its keys, as a revision of its own.
    fn sweep(&mut self, now: i64) -> rusqlite::Result<()> {
        let expired: Vec<i64> = self
            .tx
            .prepare_cached("SELECT id FROM leases WHERE expires_ms <= ?1")?
            .query_map([now], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        if expired.is_empty() {
            return Ok(());
        }
        for id in expired {
            self.end_lease(id)?;
        }
        self.finish()
    }

    fn end_lease(&mut self, id: i64) -> rusqlite::Result<()> {
        let keys: Vec<Vec<u8>> = self
            .tx
            .prepare_cached("SELECT key FROM kv WHERE lease = ?1")?
            .query_map([id], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        for k in keys {
            self.delete(&k)?;
        }
        self.tx.execute("DELETE FROM leases WHERE id = ?1", [id])?;
        Ok(())
    }

    fn lease_exists(&self, id: i64) -> rusqlite::Result<bool> {
        Ok(self
            .tx
            .query_row("SELECT 1 FROM leases WHERE id = ?1", [id], |_| Ok(()))
            .optional()?
            .is_some())
    }

    fn row(&self, key: &[u8]) -> rusqlite::Result<Option<(Bytes, i64, i64, i64)>> {
        self.tx
            .prepare_cached("SELECT value, create_rev, mod_rev, version FROM kv WHERE key = ?1")?
            .query_row([key], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .optional()
    }

    fn put(&mut self, key: &[u8], value: &str, lease: Option<&LeaseId>) -> Result<()> {
        let url = self.url.clone();
        let wrap = move |source| StoreError::Sqlite {
            url: url.clone(),
            op: "put",
            source,
        };
        let lease_id = match lease {
            None => None,
            Some(l) => {
                let id = l.0.parse::<i64>().ok();
                match id {
                    Some(id) if self.lease_exists(id).map_err(&wrap)? => Some(id),
                    _ => {
                        return Err(StoreError::LeaseNotFound {
                            url: self.url.clone(),
                            lease: l.clone(),
                        });
                    }
                }
            }
        };
        let rev = self.rev();
        let (create, version) = match self.row(key).map_err(&wrap)? {
            Some((_, c, _, v)) => (c, v + 1),
            None => (rev, 1),
        };
        self.tx
            .prepare_cached(
                "INSERT INTO kv (key, value, create_rev, mod_rev, version, lease) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT(key) DO UPDATE SET value = ?2, create_rev = ?3, mod_rev = ?4, version = ?5, lease = ?6",
            )
            .and_then(|mut s| s.execute(params![key, value, create, rev, version, lease_id]))
            .map_err(&wrap)?;
        self.event(key, Some(value), create, version, lease_id)
            .map_err(&wrap)
    }

    fn delete(&mut self, key: &[u8]) -> rusqlite::Result<bool> {
        let n = self
            .tx
            .prepare_cached("DELETE FROM kv WHERE key = ?1")?
            .execute([key])?;
        if n > 0 {
            self.event(key, None, 0, 0, None)?;
        }
        Ok(n > 0)
    }

    fn delete_prefix(&mut self, prefix: &[u8]) -> rusqlite::Result<u64> {
        let keys: Vec<Vec<u8>> = range_keys(self.tx, prefix)?;
        for k in &keys {
            self.delete(k)?;
        }
        Ok(keys.len() as u64)
    }

    fn holds(&self, c: &Compare) -> rusqlite::Result<bool> {
        Ok(match c {
            Compare::Absent(k) => self.row(k.as_str().as_bytes())?.is_none(),
            Compare::ModRevision(k, r) => self.row(k.as_str().as_bytes())?.map_or(0, |row| row.2) == *r,
            Compare::Value(k, v) => self
                .row(k.as_str().as_bytes())?
                .is_some_and(|row| row.0.0 == v.as_bytes()),
        })
    }
}

fn range_keys(conn: &Connection, prefix: &[u8]) -> rusqlite::Result<Vec<Vec<u8>>> {
    match prefix_end(prefix) {
        Some(end) => conn
            .prepare_cached("SELECT key FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key")?
            .query_map(params![prefix, end], |r| r.get(0))?
            .collect(),
        None => conn
            .prepare_cached("SELECT key FROM kv WHERE key >= ?1 ORDER BY key")?
            .query_map(params![prefix], |r| r.get(0))?
            .collect(),
    }
}

/// A stored value's bytes, whether SQLite holds them as TEXT or as a BLOB (another
/// program may have written either, valid UTF-8 or not).
struct Bytes(Vec<u8>);

impl rusqlite::types::FromSql for Bytes {
    fn column_result(v: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        v.as_bytes().map(|b| Bytes(b.to_vec()))
    }
}

/// A row of `kv` or `events` as a `KeyValue`; keys that are not valid text are skipped
/// with a warning naming them (only another program could have written them).
fn to_kv(
    key: Vec<u8>,
    value: Bytes,
    create: i64,
    modr: i64,
    version: i64,
    lease: Option<i64>,
) -> Option<KeyValue> {
    let Some(key) = String::from_utf8(key.clone()).ok().and_then(|k| Key::new(k).ok()) else {
        tracing::warn!(
            key = %crate::encode::escape_bytes(&key),
            "embedded store: skipping a key that is not a valid text key (another program wrote it)"
        );
        return None;
    };
    Some(KeyValue::from_bytes(
        key,
        value.0,
        create,
        modr,
        version,
        lease.map(|l| LeaseId(l.to_string())),
    ))
}

fn list_range(conn: &Connection, prefix: &[u8]) -> rusqlite::Result<Vec<KeyValue>> {
    let map = |r: &rusqlite::Row<'_>| {
        Ok(to_kv(
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
        ))
    };
    let rows: Vec<Option<KeyValue>> = match prefix_end(prefix) {
        Some(end) => conn
            .prepare_cached(
                "SELECT key, value, create_rev, mod_rev, version, lease FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key",
            )?
            .query_map(params![prefix, end], map)?
            .collect::<rusqlite::Result<_>>()?,
        None => conn
            .prepare_cached("SELECT key, value, create_rev, mod_rev, version, lease FROM kv WHERE key >= ?1 ORDER BY key")?
            .query_map(params![prefix], map)?
            .collect::<rusqlite::Result<_>>()?,
    };
    Ok(rows.into_iter().flatten().collect())
}

/// Events with a revision of at least `from`, every key.
fn events_since(conn: &Connection, from: Revision) -> rusqlite::Result<Vec<WatchEvent>> {
    let mut stmt = conn.prepare_cached(
        "SELECT rev, key, value, create_rev, version, lease FROM events WHERE rev >= ?1 ORDER BY rev, seq",
    )?;
    let rows = stmt.query_map([from], |r| {
        let rev: i64 = r.get(0)?;
        let key: Vec<u8> = r.get(1)?;
        let value: Option<Bytes> = r.get(2)?;
        Ok(match value {
            Some(v) => to_kv(key, v, r.get(3)?, rev, r.get(4)?, r.get(5)?).map(WatchEvent::Put),
            None => String::from_utf8(key)
                .ok()
                .and_then(|k| Key::new(k).ok())
                .map(|key| WatchEvent::Delete { key, revision: rev }),
        })
    })?;
    Ok(rows
        .collect::<rusqlite::Result<Vec<_>>>()?
        .into_iter()
        .flatten()
        .collect())
}

fn event_key(ev: &WatchEvent) -> Option<&Key> {
    match ev {
        WatchEvent::Put(kv) => Some(&kv.key),
        WatchEvent::Delete { key, .. } => Some(key),
        WatchEvent::Reset { .. } => None,
    }
}

/// A dedicated OS thread (never an async worker): it blocks on its channel, and
/// times its lease sweep on the monotonic clock.
#[allow(clippy::disallowed_methods)]
fn pump_thread(
    conn: Connection,
    url: String,
    mut last: Revision,
    tx: broadcast::Sender<Arc<Batch>>,
    wake: std_mpsc::Receiver<()>,
    stop: Arc<AtomicBool>,
) {
    let mut conn = conn;
    let mut data_version: i64 = conn
        .pragma_query_value(None, "data_version", |r| r.get(0))
        .unwrap_or(0);
    let mut last_sweep = std::time::Instant::now();
    let mut failing = false;
    while !stop.load(Ordering::Relaxed) {
        let _ = wake.recv_timeout(POLL);
        let step = (|| -> rusqlite::Result<()> {
            if last_sweep.elapsed() >= SWEEP_EVERY {
                last_sweep = std::time::Instant::now();
                let now = now_ms();
                let due: Option<i64> =
                    conn.query_row("SELECT MIN(expires_ms) FROM leases", [], |r| r.get(0))?;
                if due.is_some_and(|d| d <= now) {
                    let t = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                    let mut w = Writer::begin(&t, url.clone())?;
                    w.sweep(now)?;
                    w.finish()?;
                    drop(w);
                    t.commit()?;
                }
            }
            let dv: i64 = conn.pragma_query_value(None, "data_version", |r| r.get(0))?;
            let current = meta(&conn, "revision")?;
            if dv == data_version && current == last {
                return Ok(());
            }
            data_version = dv;
            if current <= last {
                return Ok(());
            }
            let t = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
            let upto = meta(&t, "revision")?;
            let compacted = meta(&t, "compact_revision")?;
            let events = events_since(&t, last + 1)?;
            t.commit()?;
            let gap = compacted > last + 1;
            last = upto;
            // Nobody listening is fine: watches subscribe before they catch up.
            let _ = tx.send(Arc::new(Batch { events, upto, gap }));
            Ok(())
        })();
        match step {
            Ok(()) if failing => {
                tracing::info!(%url, "embedded store event thread recovered");
                failing = false;
            }
            Ok(()) => {}
            Err(e) if !failing => {
                tracing::warn!(%url, error = %e, "embedded store event thread cannot read the store; retrying");
                failing = true;
            }
            Err(_) => {}
        }
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn url(&self) -> &str {
        &self.inner.url
    }

    fn max_txn_ops(&self) -> usize {
        usize::MAX
    }

    async fn ping(&self) -> Result<Revision> {
        self.read("ping", |_, rev| Ok(rev)).await
    }

    async fn get(&self, key: &Key) -> Result<Option<KeyValue>> {
        Ok(self.get_many(std::slice::from_ref(key)).await?.pop().flatten())
    }

    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<KeyValue>>> {
        Ok(self.get_many_at(keys).await?.0)
    }

    async fn get_many_at(&self, keys: &[Key]) -> Result<(Vec<Option<KeyValue>>, Revision)> {
        let ks: Vec<Vec<u8>> = keys.iter().map(|k| k.as_str().as_bytes().to_vec()).collect();
        self.read("get", move |tx, rev| {
            let mut stmt = tx.prepare_cached(
                "SELECT key, value, create_rev, mod_rev, version, lease FROM kv WHERE key = ?1",
            )?;
            ks.iter()
                .map(|k| {
                    Ok(stmt
                        .query_row([k], |r| {
                            Ok(to_kv(
                                r.get(0)?,
                                r.get(1)?,
                                r.get(2)?,
                                r.get(3)?,
                                r.get(4)?,
                                r.get(5)?,
                            ))
                        })
                        .optional()?
                        .flatten())
                })
                .collect::<rusqlite::Result<Vec<_>>>()
                .map(|kvs| (kvs, rev))
        })
        .await
    }

    async fn list(&self, prefix: &Key) -> Result<Listing> {
        let p = prefix.as_str().as_bytes().to_vec();
        self.read("list", move |tx, revision| {
            Ok(Listing {
                kvs: list_range(tx, &p)?,
                revision,
            })
        })
        .await
    }

    async fn put(&self, key: &Key, value: &str, lease: Option<&LeaseId>) -> Result<Revision> {
        let (k, v, l) = (
            key.as_str().as_bytes().to_vec(),
            value.to_string(),
            lease.cloned(),
        );
        self.write("put", move |w| {
            w.put(&k, &v, l.as_ref())?;
            Ok(w.rev())
        })
        .await
    }

    async fn delete(&self, key: &Key) -> Result<bool> {
        let k = key.as_str().as_bytes().to_vec();
        let wrap = self.wrap("delete");
        self.write("delete", move |w| w.delete(&k).map_err(wrap)).await
    }

    async fn delete_prefix(&self, prefix: &Key) -> Result<u64> {
        let p = prefix.as_str().as_bytes().to_vec();
        let wrap = self.wrap("delete prefix");
        self.write("delete prefix", move |w| w.delete_prefix(&p).map_err(wrap))
            .await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        if let Some(message) = overlapping_ops(&txn.ops) {
            return Err(StoreError::Rejected {
                url: self.inner.url.clone(),
                op: "transaction",
                message,
            });
        }
        let wrap = self.wrap("transaction");
        self.write("transaction", move |w| {
            for c in &txn.compares {
                if !w.holds(c).map_err(&wrap)? {
                    return Ok(TxnOutcome::Lost(w.current));
                }
            }
            for op in &txn.ops {
                match op {
                    Op::Put { key, value, lease } => w.put(key.as_str().as_bytes(), value, lease.as_ref())?,
                    Op::Delete(k) => {
                        w.delete(k.as_str().as_bytes()).map_err(&wrap)?;
                    }
                    Op::DeletePrefix(p) => {
                        w.delete_prefix(p.as_str().as_bytes()).map_err(&wrap)?;
                    }
                }
            }
            Ok(TxnOutcome::Committed(if w.dirty { w.rev() } else { w.current }))
        })
        .await
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<Lease> {
        let ttl_ms = ttl.as_millis().max(1) as i64;
        let wrap = self.wrap("lease grant");
        let id = self
            .write("lease grant", move |w| {
                let id = meta(w.tx, "next_lease").map_err(&wrap)?;
                set_meta(w.tx, "next_lease", id + 1).map_err(&wrap)?;
                w.tx.execute(
                    "INSERT INTO leases (id, ttl_ms, expires_ms) VALUES (?1, ?2, ?3)",
                    params![id, ttl_ms, now_ms() + ttl_ms],
                )
                .map_err(&wrap)?;
                Ok(id)
            })
            .await?;
        Ok(Lease {
            id: LeaseId(id.to_string()),
            ttl,
        })
    }

    async fn keep_alive(&self, lease: &LeaseId) -> Result<Duration> {
        let (url, l) = (self.inner.url.clone(), lease.clone());
        let wrap = self.wrap("lease keep-alive");
        self.write("lease keep-alive", move |w| {
            let not_found = || StoreError::LeaseNotFound {
                url: url.clone(),
                lease: l.clone(),
            };
            let id = l.0.parse::<i64>().map_err(|_| not_found())?;
            let ttl: Option<i64> =
                w.tx.query_row("SELECT ttl_ms FROM leases WHERE id = ?1", [id], |r| r.get(0))
                    .optional()
                    .map_err(&wrap)?;
            let ttl = ttl.ok_or_else(not_found)?;
            w.tx.execute(
                "UPDATE leases SET expires_ms = ?2 WHERE id = ?1",
                params![id, now_ms() + ttl],
            )
            .map_err(&wrap)?;
            Ok(Duration::from_millis(ttl as u64))
        })
        .await
    }

    async fn revoke_lease(&self, lease: &LeaseId) -> Result<()> {
        let Ok(id) = lease.0.parse::<i64>() else {
            return Ok(());
        };
        let wrap = self.wrap("lease revoke");
        self.write("lease revoke", move |w| w.end_lease(id).map_err(wrap))
            .await
    }

    async fn watch(&self, prefix: &Key, from: Revision) -> Result<WatchStream> {
        let mut batches = self.pump()?;
        let current = self.ping().await?;
        let mut next = if from > 0 { from } else { current + 1 };
        let (tx, rx) = mpsc::channel::<Result<WatchEvent>>(1024);
        let store = self.clone();
        let prefix = prefix.clone();
        tokio::spawn(async move {
            let mut catch_up = true;
            loop {
                if catch_up {
                    // Read what the log holds from `next` on (or the whole state, when
                    // that part of the log was compacted), then follow the pump.
                    let p = prefix.as_str().as_bytes().to_vec();
                    let from = next;
                    let res = store
                        .read("watch", move |t, rev| {
                            let compacted = meta(t, "compact_revision")?;
                            if from < compacted {
                                Ok((true, list_range(t, &p)?, Vec::new(), rev))
                            } else {
                                Ok((false, Vec::new(), events_since(t, from)?, rev))
                            }
                        })
                        .await;
                    let out = match res {
                        Ok((true, kvs, _, rev)) => {
                            next = rev + 1;
                            vec![Ok(WatchEvent::Reset { kvs, revision: rev })]
                        }
                        Ok((false, _, evs, rev)) => {
                            next = rev + 1;
                            evs.into_iter()
                                .filter(|e| event_key(e).is_some_and(|k| k.starts_with(&prefix)))
                                .map(Ok)
                                .collect()
                        }
                        Err(e) => {
                            tracing::warn!(%prefix, error = %e, "watch cannot read the embedded store; retrying");
                            tokio::select! {
                                _ = tokio::time::sleep(Duration::from_millis(200)) => continue,
                                _ = tx.closed() => return,
                            }
                        }
                    };
                    for ev in out {
                        if tx.send(ev).await.is_err() {
                            return;
                        }
                    }
                    catch_up = false;
                }
                let batch = tokio::select! {
                    b = batches.recv() => b,
                    _ = tx.closed() => return,
                };
                match batch {
                    Ok(b) if b.gap && b.upto >= next => catch_up = true,
                    Ok(b) => {
                        for ev in &b.events {
                            if ev.revision() >= next
                                && event_key(ev).is_some_and(|k| k.starts_with(&prefix))
                                && tx.send(Ok(ev.clone())).await.is_err()
                            {
                                return;
                            }
                        }
                        next = next.max(b.upto + 1);
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => catch_up = true,
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Ok(Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|ev| (ev, rx))
        })))
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let url = self.inner.url.clone();
        let wrap = self.wrap("compact");
        self.write("compact", move |w| {
            if revision > w.current {
                return Err(StoreError::Rejected {
                    url,
                    op: "compact",
                    message: format!("revision {revision} is in the future (current {})", w.current),
                });
            }
            if revision > meta(w.tx, "compact_revision").map_err(&wrap)? {
                w.compact(revision).map_err(&wrap)?;
            }
            Ok(())
        })
        .await
    }
}
