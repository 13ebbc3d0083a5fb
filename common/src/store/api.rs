//! The store contract: one trait, its value types and errors. It follows etcd
//! v3's model (a global revision, per-key create/mod revisions, leases, watches
//! from a revision) in a shape that Consul can also fill, and knows nothing about
//! the key schema. Every backend and every user of a store depends on this module;
//! it depends on nothing of the store's.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;

use crate::keys::Key;

/// A store revision (etcd's revision, Consul's index). 0 means "never written".
pub type Revision = i64;

/// An opaque lease identifier (etcd's 64-bit ID as a decimal string, a Consul session ID).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct LeaseId(pub String);

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A granted lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub id: LeaseId,
    pub ttl: Duration,
}

/// One key and its value, with its revisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Key,
    pub value: String,
    pub create_revision: Revision,
    pub mod_revision: Revision,
    /// Number of writes since creation (1 after the first put).
    pub version: i64,
    pub lease: Option<LeaseId>,
    /// The stored bytes are not UTF-8 text (another program wrote them): `value`
    /// then holds an escaped rendering (`v\xff2`) for messages only, and every
    /// parser in `values` refuses it, naming the key.
    pub not_text: bool,
}

impl KeyValue {
    /// A key-value from stored bytes: text as it is, anything else escaped and
    /// marked `not_text`.
    pub fn from_bytes(
        key: Key,
        value: Vec<u8>,
        create_revision: Revision,
        mod_revision: Revision,
        version: i64,
        lease: Option<LeaseId>,
    ) -> KeyValue {
        let (value, not_text) = match String::from_utf8(value) {
            Ok(s) => (s, false),
            Err(e) => (crate::encode::escape_bytes(e.as_bytes()), true),
        };
        KeyValue {
            key,
            value,
            create_revision,
            mod_revision,
            version,
            lease,
            not_text,
        }
    }
}

/// A prefix listing and the revision it was read at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    pub kvs: Vec<KeyValue>,
    pub revision: Revision,
}

/// A condition of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compare {
    /// The key does not exist.
    Absent(Key),
    /// The key's mod revision equals this (0 also means absent).
    ModRevision(Key, Revision),
    /// The key exists and its value equals this.
    Value(Key, String),
}

/// A write of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put {
        key: Key,
        value: String,
        lease: Option<LeaseId>,
    },
    Delete(Key),
    /// Deletes every key starting with this prefix.
    DeletePrefix(Key),
}

impl Op {
    pub fn put(key: Key, value: impl Into<String>) -> Op {
        Op::Put {
            key,
            value: value.into(),
            lease: None,
        }
    }
}

/// An atomic transaction: if every compare holds, apply every op; otherwise nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Txn {
    pub compares: Vec<Compare>,
    pub ops: Vec<Op>,
}

impl Txn {
    pub fn new() -> Txn {
        Txn::default()
    }
    pub fn when(mut self, c: Compare) -> Txn {
        self.compares.push(c);
        self
    }
    pub fn then(mut self, op: Op) -> Txn {
        self.ops.push(op);
        self
    }
}

/// What became of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnOutcome {
    /// Every compare held and every op was applied at this revision.
    Committed(Revision),
    /// A compare failed: nothing was written. The store was at this revision.
    Lost(Revision),
}

impl TxnOutcome {
    pub fn committed(self) -> bool {
        matches!(self, TxnOutcome::Committed(_))
    }
}

/// One change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    Put(KeyValue),
    Delete {
        key: Key,
        revision: Revision,
    },
    /// The history between the requested revision and now was compacted away:
    /// here is the whole state of the prefix at `revision`; events follow from there.
    Reset {
        kvs: Vec<KeyValue>,
        revision: Revision,
    },
}

impl WatchEvent {
    pub fn revision(&self) -> Revision {
        match self {
            WatchEvent::Put(kv) => kv.mod_revision,
            WatchEvent::Delete { revision, .. } | WatchEvent::Reset { revision, .. } => *revision,
        }
    }
}

/// Events of a watch, in revision order, each exactly once. The stream ends only
/// when the store is dropped; transient disconnections are retried inside.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, StoreError>> + Send>>;

/// Broad classes of store failure, for callers that branch on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The store could not be reached or did not answer in time; retrying may help.
    Unavailable,
    /// The thing referred to does not exist (an expired lease).
    NotFound,
    /// The request or a stored value is malformed; retrying will not help.
    InvalidInput,
    /// The store refused (permissions, authentication).
    Denied,
}

/// A URL as echoed in messages: at most 120 characters (a 5,000-character URL must
/// not become a 5,000-character error line).
pub fn short(url: &str) -> String {
    const MAX: usize = 120;
    if url.chars().count() <= MAX {
        return url.to_string();
    }
    let mut out: String = url.chars().take(MAX).collect();
    out.push_str("...");
    out
}

/// A store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store {} is unreachable ({op}): {reason}", short(url))]
    Unavailable {
        url: String,
        op: &'static str,
        reason: String,
    },
    #[error(
        "store {} did not confirm {op} (it may or may not have been applied; re-read before retrying): {reason}",
        short(url)
    )]
    Ambiguous {
        url: String,
        op: &'static str,
        reason: String,
    },
    #[error("invalid store URL {:?}: {reason}", short(url))]
    InvalidUrl { url: String, reason: String },
    #[error("lease {lease} not found on {} (expired or revoked)", short(url))]
    LeaseNotFound { url: String, lease: LeaseId },
    #[error("store {} refused {op}: {message}", short(url))]
    Denied {
        url: String,
        op: &'static str,
        message: String,
    },
    #[error("store {} rejected {op}: {message}", short(url))]
    Rejected {
        url: String,
        op: &'static str,
        message: String,
    },
    #[error("embedded store {} failed during {op}: {source}", short(url))]
    Sqlite {
        url: String,
        op: &'static str,
        #[source]
        source: rusqlite::Error,
    },
}

impl StoreError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            StoreError::Unavailable { .. } | StoreError::Ambiguous { .. } => ErrorKind::Unavailable,
            StoreError::LeaseNotFound { .. } => ErrorKind::NotFound,
            StoreError::Denied { .. } => ErrorKind::Denied,
            StoreError::InvalidUrl { .. } | StoreError::Rejected { .. } => ErrorKind::InvalidInput,
            StoreError::Sqlite { source, .. } => match source.sqlite_error_code() {
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                    ErrorKind::Unavailable
                }
                Some(
                    rusqlite::ErrorCode::CannotOpen
                    | rusqlite::ErrorCode::PermissionDenied
                    | rusqlite::ErrorCode::ReadOnly,
                ) => ErrorKind::Denied,
                _ => ErrorKind::Unavailable,
            },
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A key-value store with revisions, transactions, leases and watches.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// The store's URL for messages (never holds a secret).
    fn url(&self) -> &str;

    /// The most operations (compares and writes) one transaction may hold.
    fn max_txn_ops(&self) -> usize {
        128
    }

    /// Whether a compare that a key is absent (`Compare::Absent`, or
    /// `ModRevision(k, 0)`) needs the right to write that key. Consul checks its
    /// `check-not-exists` as a write (`kvsPreApply`), so an agent whose token may
    /// only read the keys it fences on (holds, enable keys, the current rollout, the
    /// rollout lock) fences on their absence by reading them after its write.
    fn absent_compare_needs_write(&self) -> bool {
        false
    }

    /// Checks that the store answers; returns its current revision.
    async fn ping(&self) -> Result<Revision>;

    /// The key's value, or `None` when it does not exist.
    async fn get(&self, key: &Key) -> Result<Option<KeyValue>>;

    /// Several keys at once (missing ones are `None`), in one request where the
    /// store allows it.
    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<KeyValue>>> {
        futures_util::future::try_join_all(keys.iter().map(|k| self.get(k))).await
    }

    /// `get_many`, with the revision the keys were read at: every change after it is
    /// one a watch opened before the read delivers. 0 when the store cannot say
    /// (Consul: its read transactions carry no index), and then the caller must not
    /// combine the read with watch events.
    async fn get_many_at(&self, keys: &[Key]) -> Result<(Vec<Option<KeyValue>>, Revision)> {
        Ok((self.get_many(keys).await?, 0))
    }

    /// Every key starting with `prefix`, in key order, read at one revision.
    async fn list(&self, prefix: &Key) -> Result<Listing>;

    /// Whether what is under `prefix` may differ from `seen`, a listing of it: a
    /// key written after it, or fewer keys (one deleted). `false` is certain;
    /// `true` means "list again". etcd answers with two counts in one request; a
    /// store without such a count says `true`, so its callers list every time.
    async fn changed_since(&self, prefix: &Key, seen: &Seen) -> Result<bool> {
        let _ = (prefix, seen);
        Ok(true)
    }

    /// Whether `changed_since` asks the store (`false`: it says "list again" and
    /// sends nothing, so a caller may as well list).
    fn counts_changes(&self) -> bool {
        false
    }

    /// Writes `value`, bound to `lease` when given (the key is deleted when the lease
    /// ends). Fails with `LeaseNotFound` when the lease has already ended. Consul
    /// (≥ 1.6) skips a write of a key's current value: its mod revision does not
    /// move, no watch sees it, and the revision returned is the key's as it was.
    async fn put(&self, key: &Key, value: &str, lease: Option<&LeaseId>) -> Result<Revision>;

    /// Deletes one key; returns whether it existed. Deleting a missing key is not an
    /// error and does not advance the revision.
    async fn delete(&self, key: &Key) -> Result<bool>;

    /// Deletes every key starting with `prefix`; returns how many there were.
    async fn delete_prefix(&self, prefix: &Key) -> Result<u64>;

    /// Applies `txn` atomically. A failed compare is `Ok(TxnOutcome::Lost)`, not an
    /// error. `Ambiguous` means the outcome is unknown: re-read, then decide again.
    /// `Committed(r)`: every key the transaction changed has mod revision `r`. On
    /// Consul a put of a key's current value leaves that key at its old revision
    /// (see `put`): a caller that fences later writes on a key it wrote must write a
    /// value that differs each time (the plan epoch does), or read the key back.
    async fn txn(&self, txn: Txn) -> Result<TxnOutcome>;

    /// Grants a lease of at least `ttl` (a store may round a short TTL up).
    async fn grant_lease(&self, ttl: Duration) -> Result<Lease>;

    /// Renews a lease; returns its TTL. `LeaseNotFound` when it has already ended.
    async fn keep_alive(&self, lease: &LeaseId) -> Result<Duration>;

    /// Ends a lease at once and deletes its keys. Revoking an ended lease is not an error.
    async fn revoke_lease(&self, lease: &LeaseId) -> Result<()>;

    /// Watches every key starting with `prefix`, delivering events with a revision of
    /// at least `from` (0 = from now on). When `from` has been compacted away the first
    /// event is a `Reset` with the current state.
    async fn watch(&self, prefix: &Key, from: Revision) -> Result<WatchStream>;

    /// `watch` on each of `prefixes`, delivered as one stream; each key's events come
    /// in order. After a compaction the stream delivers resets that hold every key
    /// under the prefixes: one on etcd, one per prefix elsewhere, so a consumer reads
    /// again whatever it holds on any reset. etcd carries them all on one gRPC
    /// stream (what a client costs etcd grows with its streams far more than with
    /// its watches); other stores merge one watch per prefix.
    async fn watch_many(&self, prefixes: &[Key], from: Revision) -> Result<WatchStream> {
        let mut all = Vec::with_capacity(prefixes.len());
        for p in prefixes {
            all.push(self.watch(p, from).await?);
        }
        Ok(Box::pin(futures_util::stream::select_all(all)))
    }

    /// Discards history before `revision` (watches from older revisions get a `Reset`).
    async fn compact(&self, revision: Revision) -> Result<()>;
}

/// A shared handle on some store.
pub type DynStore = Arc<dyn Store>;

/// What a caller of `changed_since` remembers of a listing: its revision, how
/// many keys it held, and the newest of their mod revisions (a store restored from
/// an older copy has an older newest key, whatever its revision).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub revision: Revision,
    pub keys: usize,
    pub newest: Revision,
}

impl Seen {
    pub fn of(listing: &Listing) -> Seen {
        Seen {
            revision: listing.revision,
            keys: listing.kvs.len(),
            newest: listing.kvs.iter().map(|kv| kv.mod_revision).max().unwrap_or(0),
        }
    }
}

/// Whether opening the embedded store may create it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Create {
    /// A missing store is an error (read-only commands).
    Never,
    /// A missing file is created, a missing directory is an error.
    File,
    /// The file and its directories are created (the agent).
    FileAndDirs,
}

/// Stored key-values made by hand, for the unit tests of the floors above.
#[cfg(test)]
pub(crate) mod fixtures {
    use crate::keys::Key;
    use crate::store::api::{KeyValue, Revision};

    /// A key-value written once at `rev`, without a lease.
    pub(crate) fn kv_at(key: &str, value: &str, rev: Revision) -> KeyValue {
        KeyValue::from_bytes(
            Key::new(key).unwrap(),
            value.as_bytes().to_vec(),
            rev,
            rev,
            1,
            None,
        )
    }

    /// A key-value as a listing returns it, written once at revision 1.
    pub(crate) fn kv(key: &str, value: &str) -> KeyValue {
        kv_at(key, value, 1)
    }
}
