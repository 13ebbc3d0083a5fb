//! etcd over its native gRPC API (the `etcd-client` crate): one HTTP/2 connection
//! per endpoint carries every request, watch and lease renewal of a process, where
//! the JSON gateway (`etcd.rs`) needs an HTTP/1.1 connection per watch and a
//! translation inside etcd for every request.
//!
//! It is measured against the gateway (`jio-bench --store etcd-grpc`, BENCHMARKS.md)
//! and passes the same contract tests (plain, and with TLS, client certificates and
//! authentication; expired tokens are renewed). It is not yet what `etcd://` URLs
//! open: the gateway client's refusal messages (the key and user named, the
//! certificate-CN hint), per-endpoint `server_name` and its fail-over are not at
//! parity yet.

use std::time::Duration;

use async_trait::async_trait;
use backon::Retryable as _;
use etcd_client::{
    Certificate, Client, Compare as GCompare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    PutOptions, TlsOptions, Txn as GTxn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::sync::mpsc;

use super::{
    Compare, KeyValue, Lease, LeaseId, Listing, Op, Result, Revision, Store, StoreError, StoreUrl, Txn,
    TxnOutcome, WatchEvent, WatchStream,
};
use crate::backoff::Backoff;
use crate::keys::Key;

/// A client of one etcd cluster over gRPC.
#[derive(Clone)]
pub struct EtcdGrpcStore {
    client: Client,
    url: String,
    request_timeout: Duration,
    retry_budget: Duration,
}

impl EtcdGrpcStore {
    /// Connects (lazily: the first request opens the connection) to the endpoints of
    /// an `etcd://` or `etcds://` URL.
    pub async fn connect(url: &StoreUrl, retry_budget: Duration) -> Result<EtcdGrpcStore> {
        let invalid = |reason: String| StoreError::InvalidUrl {
            url: url.without_query(),
            reason,
        };
        let StoreUrl::Etcd { endpoints, tls, auth } = url else {
            return Err(invalid("not an etcd:// URL".into()));
        };
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_auto_token_refresh(true);
        if let Some(t) = tls {
            let mut o = TlsOptions::new();
            if let Some(ca) = &t.ca_file {
                let pem = std::fs::read(ca).map_err(|e| invalid(format!("ca_file {}: {e}", ca.display())))?;
                o = o.ca_certificate(Certificate::from_pem(pem));
            }
            if let (Some(c), Some(k)) = (&t.cert_file, &t.key_file) {
                let cert =
                    std::fs::read(c).map_err(|e| invalid(format!("cert_file {}: {e}", c.display())))?;
                crate::secret::check_private(k)
                    .map_err(|e| invalid(format!("key_file {}: {e}", k.display())))?;
                let key = std::fs::read(k).map_err(|e| invalid(format!("key_file {}: {e}", k.display())))?;
                o = o.identity(Identity::from_pem(cert, key));
            }
            if let Some(n) = &t.server_name {
                o = o.domain_name(n.clone());
            }
            opts = opts.with_tls(o);
        }
        if let Some(a) = auth {
            let password = crate::secret::read_secret_file(&a.password_file)
                .map_err(|e| invalid(format!("password_file {}: {e}", a.password_file.display())))?;
            opts = opts.with_user(a.user.clone(), password.expose());
        }
        let shown = url.without_query();
        let client = Client::connect(endpoints, Some(opts))
            .await
            .map_err(|e| classify(&shown, "connect", e, false))?;
        Ok(EtcdGrpcStore {
            client,
            url: shown,
            request_timeout: Duration::from_secs(3),
            retry_budget,
        })
    }

    /// One read, retried within the budget while the store is unreachable.
    async fn read<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let attempt = || async {
            match tokio::time::timeout(self.request_timeout, f(self.client.clone())).await {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => Err(classify(&self.url, op, e, false)),
                Err(_) => Err(StoreError::Unavailable {
                    url: self.url.clone(),
                    op,
                    reason: format!("no answer within {:?}", self.request_timeout),
                }),
            }
        };
        attempt
            .retry(super::retry_policy(self.retry_budget))
            .when(|e: &StoreError| matches!(e, StoreError::Unavailable { .. }))
            .await
    }

    /// One write, sent once: a failure after it may have been sent is ambiguous.
    async fn write<T, Fut>(&self, op: &'static str, fut: Fut) -> Result<T>
    where
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        match tokio::time::timeout(self.request_timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(classify(&self.url, op, e, true)),
            Err(_) => Err(StoreError::Ambiguous {
                url: self.url.clone(),
                op,
                reason: format!("no answer within {:?}", self.request_timeout),
            }),
        }
    }
}

/// Turns a client error into the store's classes. `write`: the request may have
/// reached etcd, so a lost answer is ambiguous.
fn classify(url: &str, op: &'static str, e: etcd_client::Error, write: bool) -> StoreError {
    use tonic::Code;
    let unavailable = |reason: String| {
        if write {
            StoreError::Ambiguous {
                url: url.to_string(),
                op,
                reason,
            }
        } else {
            StoreError::Unavailable {
                url: url.to_string(),
                op,
                reason,
            }
        }
    };
    match e {
        etcd_client::Error::GRpcStatus(s) => match s.code() {
            Code::PermissionDenied | Code::Unauthenticated => StoreError::Denied {
                url: url.to_string(),
                op,
                message: s.message().to_string(),
            },
            Code::NotFound => StoreError::LeaseNotFound {
                url: url.to_string(),
                lease: LeaseId(String::new()),
            },
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange | Code::ResourceExhausted => {
                StoreError::Rejected {
                    url: url.to_string(),
                    op,
                    message: s.message().to_string(),
                }
            }
            _ => unavailable(format!("{:?}: {}", s.code(), s.message())),
        },
        etcd_client::Error::LeaseKeepAliveError(m) if m.contains("not found") => StoreError::LeaseNotFound {
            url: url.to_string(),
            lease: LeaseId(String::new()),
        },
        etcd_client::Error::TransportError(t) => unavailable(super::client::error_chain(&t)),
        etcd_client::Error::InvalidArgs(reason) => StoreError::InvalidUrl {
            url: url.to_string(),
            reason,
        },
        etcd_client::Error::InvalidUri(e) => StoreError::InvalidUrl {
            url: url.to_string(),
            reason: e.to_string(),
        },
        other => unavailable(other.to_string()),
    }
}

fn decode(url: &str, kv: &etcd_client::KeyValue) -> Option<KeyValue> {
    let key = match std::str::from_utf8(kv.key()).ok().and_then(|k| Key::new(k).ok()) {
        Some(k) => k,
        None => {
            tracing::warn!(store = %url, key = %crate::encode::escape_bytes(kv.key()), "skipping a key that is not a valid key");
            return None;
        }
    };
    Some(KeyValue::from_bytes(
        key,
        kv.value().to_vec(),
        kv.create_revision(),
        kv.mod_revision(),
        kv.version(),
        (kv.lease() != 0).then(|| LeaseId(kv.lease().to_string())),
    ))
}

fn lease_id(url: &str, l: &LeaseId) -> Result<i64> {
    l.0.parse().map_err(|_| StoreError::LeaseNotFound {
        url: url.to_string(),
        lease: l.clone(),
    })
}

fn txn_op(url: &str, op: &Op) -> Result<TxnOp> {
    Ok(match op {
        Op::Put { key, value, lease } => {
            let mut o = PutOptions::new();
            if let Some(l) = lease {
                o = o.with_lease(lease_id(url, l)?);
            }
            TxnOp::put(key.as_str(), value.as_bytes(), Some(o))
        }
        Op::Delete(k) => TxnOp::delete(k.as_str(), None),
        Op::DeletePrefix(p) => {
            TxnOp::delete(p.as_str(), Some(etcd_client::DeleteOptions::new().with_prefix()))
        }
    })
}

#[async_trait]
impl Store for EtcdGrpcStore {
    fn url(&self) -> &str {
        &self.url
    }

    async fn ping(&self) -> Result<Revision> {
        let r = self
            .read("ping", |mut c| async move { c.txn(GTxn::new()).await })
            .await?;
        Ok(r.header().map_or(0, |h| h.revision()))
    }

    async fn get(&self, key: &Key) -> Result<Option<KeyValue>> {
        let r = self
            .read("get", |mut c| async move { c.get(key.as_str(), None).await })
            .await?;
        Ok(r.kvs().first().and_then(|kv| decode(&self.url, kv)))
    }

    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<KeyValue>>> {
        let ops: Vec<TxnOp> = keys.iter().map(|k| TxnOp::get(k.as_str(), None)).collect();
        let r = self
            .read("get", |mut c| {
                let t = GTxn::new().and_then(ops.clone());
                async move { c.txn(t).await }
            })
            .await?;
        let mut out: Vec<Option<KeyValue>> = r
            .op_responses()
            .into_iter()
            .map(|op| match op {
                TxnOpResponse::Get(g) => g.kvs().first().and_then(|kv| decode(&self.url, kv)),
                _ => None,
            })
            .collect();
        out.resize(keys.len(), None);
        Ok(out)
    }

    async fn list(&self, prefix: &Key) -> Result<Listing> {
        let r = self
            .read("list", |mut c| async move {
                c.get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
                    .await
            })
            .await?;
        Ok(Listing {
            kvs: r.kvs().iter().filter_map(|kv| decode(&self.url, kv)).collect(),
            revision: r.header().map_or(0, |h| h.revision()),
        })
    }

    async fn put(&self, key: &Key, value: &str, lease: Option<&LeaseId>) -> Result<Revision> {
        let mut o = PutOptions::new();
        if let Some(l) = lease {
            o = o.with_lease(lease_id(&self.url, l)?);
        }
        let mut c = self.client.clone();
        match self.write("put", c.put(key.as_str(), value, Some(o))).await {
            Ok(r) => Ok(r.header().map_or(0, |h| h.revision())),
            Err(StoreError::LeaseNotFound { url, .. }) => Err(StoreError::LeaseNotFound {
                url,
                lease: lease.cloned().unwrap_or(LeaseId(String::new())),
            }),
            Err(e) => Err(e),
        }
    }

    async fn delete(&self, key: &Key) -> Result<bool> {
        let mut c = self.client.clone();
        let r = self.write("delete", c.delete(key.as_str(), None)).await?;
        Ok(r.deleted() > 0)
    }

    async fn delete_prefix(&self, prefix: &Key) -> Result<u64> {
        let mut c = self.client.clone();
        let r = self
            .write(
                "delete prefix",
                c.delete(
                    prefix.as_str(),
                    Some(etcd_client::DeleteOptions::new().with_prefix()),
                ),
            )
            .await?;
        Ok(r.deleted().max(0) as u64)
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        if let Some(dup) = super::overlapping_ops(&txn.ops) {
            return Err(StoreError::Rejected {
                url: self.url.clone(),
                op: "transaction",
                message: dup,
            });
        }
        let compares: Vec<GCompare> = txn
            .compares
            .iter()
            .map(|c| match c {
                Compare::Absent(k) => GCompare::create_revision(k.as_str(), CompareOp::Equal, 0),
                Compare::ModRevision(k, r) => GCompare::mod_revision(k.as_str(), CompareOp::Equal, *r),
                Compare::Value(k, v) => GCompare::value(k.as_str(), CompareOp::Equal, v.as_bytes()),
            })
            .collect();
        let ops = txn
            .ops
            .iter()
            .map(|op| txn_op(&self.url, op))
            .collect::<Result<Vec<_>>>()?;
        let mut c = self.client.clone();
        match self
            .write("transaction", c.txn(GTxn::new().when(compares).and_then(ops)))
            .await
        {
            Ok(r) => {
                let rev = r.header().map_or(0, |h| h.revision());
                Ok(if r.succeeded() {
                    TxnOutcome::Committed(rev)
                } else {
                    TxnOutcome::Lost(rev)
                })
            }
            Err(StoreError::LeaseNotFound { url, .. }) => Err(StoreError::LeaseNotFound {
                url,
                lease: txn
                    .ops
                    .iter()
                    .find_map(|op| match op {
                        Op::Put { lease: Some(l), .. } => Some(l.clone()),
                        _ => None,
                    })
                    .unwrap_or(LeaseId(String::new())),
            }),
            Err(e) => Err(e),
        }
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<Lease> {
        let secs = ttl.as_secs_f64().ceil().max(1.0) as i64;
        let mut c = self.client.clone();
        let r = self.write("lease grant", c.lease_grant(secs, None)).await?;
        if !r.error().is_empty() || r.id() == 0 {
            return Err(StoreError::Rejected {
                url: self.url.clone(),
                op: "lease grant",
                message: r.error().to_string(),
            });
        }
        Ok(Lease {
            id: LeaseId(r.id().to_string()),
            ttl: Duration::from_secs(r.ttl().max(0) as u64),
        })
    }

    async fn keep_alive(&self, lease: &LeaseId) -> Result<Duration> {
        let id = lease_id(&self.url, lease)?;
        let not_found = || StoreError::LeaseNotFound {
            url: self.url.clone(),
            lease: lease.clone(),
        };
        let renew = async {
            let mut c = self.client.clone();
            let (mut keeper, mut stream) = c.lease_keep_alive(id).await?;
            keeper.keep_alive().await?;
            stream.message().await
        };
        match self.write("lease keep-alive", renew).await {
            // An ended lease answers with no TTL.
            Ok(Some(r)) if r.ttl() > 0 => Ok(Duration::from_secs(r.ttl() as u64)),
            Ok(_) => Err(not_found()),
            Err(StoreError::LeaseNotFound { .. }) => Err(not_found()),
            // A renewal changes nothing but the lease's deadline: not ambiguous.
            Err(StoreError::Ambiguous { url, op, reason }) => {
                Err(StoreError::Unavailable { url, op, reason })
            }
            Err(e) => Err(e),
        }
    }

    async fn revoke_lease(&self, lease: &LeaseId) -> Result<()> {
        let id = lease_id(&self.url, lease)?;
        let mut c = self.client.clone();
        match self.write("lease revoke", c.lease_revoke(id)).await {
            Ok(_) | Err(StoreError::LeaseNotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn watch(&self, prefix: &Key, from: Revision) -> Result<WatchStream> {
        // Pin "from now on" to a revision before returning (as the gateway does).
        let from = if from > 0 { from } else { self.ping().await? + 1 };
        let (tx, rx) = mpsc::channel(1024);
        let store = self.clone();
        let prefix = prefix.clone();
        tokio::spawn(async move { watch_task(store, prefix, from, tx).await });
        Ok(Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|ev| (ev, rx))
        })))
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let mut c = self.client.clone();
        match self
            .write(
                "compact",
                c.compact(
                    revision,
                    Some(etcd_client::CompactionOptions::new().with_physical()),
                ),
            )
            .await
        {
            Ok(_) => Ok(()),
            // Already compacted at or past this revision: the goal holds.
            Err(StoreError::Rejected { message, .. }) if message.contains("compacted") => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Why one watch stream ended.
enum WatchEnd {
    ReceiverGone,
    Compacted,
    Broken(String),
}

async fn watch_task(
    store: EtcdGrpcStore,
    prefix: Key,
    mut next: Revision,
    tx: mpsc::Sender<Result<WatchEvent>>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    let mut broken = false;
    loop {
        match watch_once(&store, &prefix, &mut next, &tx, &mut broken).await {
            WatchEnd::ReceiverGone => return,
            WatchEnd::Compacted => match store.list(&prefix).await {
                Ok(l) => {
                    next = l.revision + 1;
                    let ev = WatchEvent::Reset {
                        kvs: l.kvs,
                        revision: l.revision,
                    };
                    if tx.send(Ok(ev)).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(prefix = %prefix, error = %e, "watch could not re-list after compaction; retrying");
                    tokio::time::sleep(backoff.fail()).await;
                    continue;
                }
            },
            WatchEnd::Broken(reason) => {
                if !broken {
                    tracing::warn!(prefix = %prefix, %reason, "watch connection lost; reconnecting");
                    broken = true;
                }
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(backoff.fail()).await;
                continue;
            }
        }
        backoff.succeed();
    }
}

async fn watch_once(
    store: &EtcdGrpcStore,
    prefix: &Key,
    next: &mut Revision,
    tx: &mpsc::Sender<Result<WatchEvent>>,
    broken: &mut bool,
) -> WatchEnd {
    let mut c = store.client.clone();
    let opts = WatchOptions::new().with_prefix().with_start_revision(*next);
    let opened = tokio::select! {
        r = c.watch(prefix.as_str(), Some(opts)) => r,
        _ = tx.closed() => return WatchEnd::ReceiverGone,
    };
    let mut stream = match opened {
        Ok(s) => s,
        Err(e) => return WatchEnd::Broken(classify(&store.url, "watch", e, false).to_string()),
    };
    loop {
        let msg = tokio::select! {
            m = stream.message() => m,
            _ = tx.closed() => return WatchEnd::ReceiverGone,
        };
        let res = match msg {
            Ok(Some(r)) => r,
            Ok(None) => return WatchEnd::Broken("the server closed the watch stream".into()),
            Err(e) => return WatchEnd::Broken(classify(&store.url, "watch", e, false).to_string()),
        };
        if res.created() && *broken {
            tracing::info!(prefix = %prefix, "watch reconnected");
            *broken = false;
        }
        if res.canceled() {
            if res.compact_revision() > 0 {
                return WatchEnd::Compacted;
            }
            let reason = res.cancel_reason();
            if reason.contains("invalid auth token") || reason.contains("user name is empty") {
                // An expired token cancels the watch after it opened (the client
                // renews tokens only for refused requests): renew it, then reopen.
                if let Err(e) = store.client.refresh_token().await {
                    return WatchEnd::Broken(classify(&store.url, "watch", e, false).to_string());
                }
                return WatchEnd::Broken("the authentication token expired".into());
            }
            return WatchEnd::Broken(format!("watch canceled: {}", res.cancel_reason()));
        }
        let mut last = *next - 1;
        for ev in res.events() {
            let Some(kv) = ev.kv() else { continue };
            let rev = kv.mod_revision();
            if rev < *next {
                continue; // already delivered before a reconnection
            }
            let out = match ev.event_type() {
                EventType::Delete => decode(&store.url, kv).map(|kv| WatchEvent::Delete {
                    key: kv.key,
                    revision: rev,
                }),
                EventType::Put => decode(&store.url, kv).map(WatchEvent::Put),
            };
            if let Some(out) = out
                && tx.send(Ok(out)).await.is_err()
            {
                return WatchEnd::ReceiverGone;
            }
            last = last.max(rev);
        }
        *next = last + 1;
    }
}
