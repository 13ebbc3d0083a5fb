//! Opening a store by its URL, and checking that it answers.

use std::sync::Arc;
use std::time::Duration;

use super::api::{Create, DynStore, Result};
use super::consul::ConsulStore;
use super::etcd::{EtcdOptions, EtcdStore};
use super::sqlite::SqliteStore;
use super::url::StoreUrl;

/// Opens the store named by `url` and checks that it answers.
pub async fn open(url: &StoreUrl) -> Result<DynStore> {
    open_with(url, Duration::from_secs(10)).await
}

/// Like `open`; `retry` bounds how long one operation retries before the store is
/// reported unreachable.
pub async fn open_with(url: &StoreUrl, retry: Duration) -> Result<DynStore> {
    open_opts(url, retry, Create::FileAndDirs).await
}

/// Like `open_with`; `create` says what a missing embedded store may become.
pub async fn open_opts(url: &StoreUrl, retry: Duration, create: Create) -> Result<DynStore> {
    let store: DynStore = match url {
        StoreUrl::Etcd { .. } => Arc::new(EtcdStore::new(
            url,
            EtcdOptions {
                retry_budget: retry,
                ..EtcdOptions::default()
            },
        )?),
        StoreUrl::Sqlite { path } => Arc::new(SqliteStore::open_with(path, create).await?),
        StoreUrl::Consul { .. } => Arc::new(ConsulStore::new(url, retry)?),
    };
    store.ping().await?;
    Ok(store)
}
