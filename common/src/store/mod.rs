//! The store layer: the contract (`api`), the backends (etcd, the embedded SQLite
//! store, Consul, an in-memory store for logic tests, and a counting wrapper), what
//! the backends share (`support`), and `open` by URL. Each backend depends on
//! `api` and `support` only; this module depends on them all and holds no code.

pub mod api;
mod client;
mod consul;
pub mod counting;
mod etcd;
mod memory;
mod open;
mod sqlite;
mod support;
mod url;

pub use self::api::*;
pub use self::client::http_client;
pub use self::consul::{CONSUL_MAX_TXN_OPS, CONSUL_MIN_TTL, ConsulStore};
pub use self::counting::CountingStore;
pub use self::etcd::{EtcdOptions, EtcdStore};
pub use self::memory::MemoryStore;
pub use self::open::{open, open_opts, open_with};
pub use self::sqlite::SqliteStore;
pub use self::support::watch_reconnects;
pub use self::url::{EtcdAuth, StoreUrl, TlsSettings, default_store_url};
