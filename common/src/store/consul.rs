//! Consul through its HTTP API: KV with ModifyIndex, `/v1/txn`, sessions as leases,
//! blocking queries as watches.
//!
//! Mapping onto the store contract:
//! - Keys: the schema's leading `/` is Consul's root (`/hosts/h1` is `hosts/h1`), so
//!   both tools show the same key names on every backend.
//! - Revisions are Consul indexes. A listing's revision is the index of what it read
//!   (the greatest ModifyIndex under the prefix, or a later deletion there).
//! - Writes go through `/v1/txn` (at most 64 operations, `max_txn_ops`). A compare
//!   on a value has no Consul verb: the key is read first, and the transaction then
//!   checks the ModifyIndex it read, so a change in between still makes it lose.
//! - Leases are sessions (`Behavior=delete`, `LockDelay=0s`); a key bound to one is
//!   written with the `lock` verb. Consul's TTL is at least 10 s and a session is
//!   invalidated up to twice its TTL after the last renewal: `grant_lease` returns the
//!   TTL actually used.
//! - Watches are blocking queries on the prefix; each answer is diffed against the
//!   previous one. Consul keeps no history, so intermediate writes between two
//!   answers coalesce into the last one, and a watch from a past revision at which
//!   something has changed since starts with a `Reset` of the current state. An index
//!   that goes backwards (a snapshot restore) also gives a `Reset`, as the documentation
//!   says clients must re-read then.
//! - `compact` does nothing: Consul keeps no history to compact.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use backon::Retryable;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::api::{
    Compare, KeyValue, Lease, LeaseId, Listing, Op, Result, Revision, Store, StoreError, Txn, TxnOutcome,
    WatchEvent, WatchStream,
};
use super::client::{EndpointClient, endpoint_clients, error_chain, tls_failure};
use super::support::{Deadline, Endpoints, count_watch_reconnect, overlapping_ops, retry_policy};
use super::url::{StoreUrl, TlsSettings};
use crate::backoff::Backoff;
use crate::keys::Key;
use crate::secret::Secret;

/// Consul's limit on operations in one transaction.
pub const CONSUL_MAX_TXN_OPS: usize = 64;
/// Consul's shortest session TTL.
pub const CONSUL_MIN_TTL: Duration = Duration::from_secs(10);
/// How long a watch's blocking query asks Consul to wait.
const BLOCK_WAIT: Duration = Duration::from_secs(30);
/// One request's limit: longer than the 7 s (`rpc_hold_timeout`) a Consul server
/// holds a request while it elects a leader, so an election is waited out instead
/// of turning a transaction into one that was sent and not confirmed.
const CONSUL_REQUEST_TIMEOUT: Duration = Duration::from_secs(8);

/// A client of one Consul datacenter.
#[derive(Clone)]
pub struct ConsulStore {
    inner: Arc<Inner>,
}

struct Inner {
    url: String,
    endpoints: Endpoints,
    /// One per endpoint, in the order of `endpoints`.
    clients: Vec<EndpointClient>,
    tls: Option<TlsSettings>,
    token: Option<Secret>,
    datacenter: Option<String>,
    request_timeout: Duration,
    retry_budget: Duration,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawEntry {
    key: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    create_index: u64,
    #[serde(default)]
    modify_index: u64,
    #[serde(default)]
    session: Option<String>,
}

/// One HTTP answer.
struct Answer {
    status: u16,
    index: Option<u64>,
    body: Vec<u8>,
    /// `X-Consul-Results-Filtered-By-ACLs`: entries the token may not read were
    /// left out (Consul ≥ 1.13).
    filtered: bool,
}

enum Failure {
    NotSent(String),
    Unknown(String),
    /// TLS refused: retrying will not help.
    Refused(String),
}

fn ckey(k: &Key) -> &str {
    k.as_str().strip_prefix('/').unwrap_or(k.as_str())
}

impl ConsulStore {
    /// A client for `url` (a `consul://` or `consuls://` URL); reads the token file.
    pub fn new(url: &StoreUrl, retry_budget: Duration) -> Result<ConsulStore> {
        let StoreUrl::Consul {
            endpoints,
            tls,
            datacenter,
            token_file,
        } = url
        else {
            return Err(StoreError::InvalidUrl {
                url: url.to_string(),
                reason: "not a consul:// URL".into(),
            });
        };
        let token = match token_file {
            None => None,
            Some(p) => Some(
                crate::secret::read_secret_file(p).map_err(|r| StoreError::InvalidUrl {
                    url: url.without_query(),
                    reason: format!("ACL token file {}: {r}", p.display()),
                })?,
            ),
        };
        let clients =
            endpoint_clients(endpoints, tls.as_ref(), Duration::from_secs(1)).map_err(|reason| {
                StoreError::InvalidUrl {
                    url: url.without_query(),
                    reason,
                }
            })?;
        Ok(ConsulStore {
            inner: Arc::new(Inner {
                url: url.without_query(),
                endpoints: Endpoints::new(clients.iter().map(|c| c.base.clone()).collect(), "consul"),
                clients,
                tls: tls.clone(),
                token,
                datacenter: datacenter.clone(),
                request_timeout: CONSUL_REQUEST_TIMEOUT,
                retry_budget,
            }),
        })
    }
}

impl Inner {
    /// One request to the current endpoint, within `timeout` when given.
    async fn attempt(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Vec<u8>>,
        timeout: Option<Duration>,
    ) -> std::result::Result<Answer, Failure> {
        let (i, base) = self.endpoints.pick();
        let mut req = self.clients[i].http.request(method, self.url(base, path, query));
        if let Some(t) = &self.token {
            req = req.header("X-Consul-Token", t.expose());
        }
        if let Some(t) = timeout {
            req = req.timeout(t);
        }
        if let Some(b) = body {
            req = req.body(b);
        }
        let fail_over = |reason: &str| self.endpoints.fail_over(i, reason);
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => {
                let connect = e.is_connect();
                let reason = error_chain(&e.without_url());
                fail_over(&reason);
                return Err(self.not_answered(connect, reason));
            }
        };
        let status = resp.status().as_u16();
        let index = resp
            .headers()
            .get("x-consul-index")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let filtered = resp
            .headers()
            .get("x-consul-results-filtered-by-acls")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
        let body = match resp.bytes().await {
            Ok(b) => b.to_vec(),
            Err(e) => {
                let reason = e.without_url().to_string();
                fail_over(&reason);
                return Err(Failure::Unknown(reason));
            }
        };
        if let Some(failure) = refused_by_server(status, &body) {
            fail_over(&format!("HTTP {status}"));
            return Err(failure);
        }
        Ok(Answer {
            status,
            index,
            body,
            filtered,
        })
    }

    /// The request's URL on endpoint `base`, with the datacenter when one is set.
    fn url(&self, base: &str, path: &str, query: &[(&str, String)]) -> String {
        let mut params: Vec<String> = query
            .iter()
            .map(|(k, v)| {
                if v.is_empty() {
                    k.to_string()
                } else {
                    format!("{k}={}", crate::encode::path(v))
                }
            })
            .collect();
        if let Some(dc) = &self.datacenter {
            params.push(format!("dc={}", crate::encode::path(dc)));
        }
        if params.is_empty() {
            format!("{base}{path}")
        } else {
            format!("{base}{path}?{}", params.join("&"))
        }
    }

    /// A request that got no answer: refused by TLS, not sent (no connection), or
    /// perhaps applied.
    fn not_answered(&self, connect: bool, reason: String) -> Failure {
        if let Some(tls) = tls_failure(&reason, self.tls.as_ref()) {
            return Failure::Refused(tls);
        }
        if connect {
            Failure::NotSent(reason)
        } else {
            Failure::Unknown(reason)
        }
    }

    /// A request with retries across endpoints. `idempotent`: may be repeated when it
    /// may have been applied.
    async fn call(
        &self,
        op: &'static str,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Vec<u8>>,
        idempotent: bool,
    ) -> Result<Answer> {
        let backoff = retry_policy(self.retry_budget);
        let deadline = Deadline::after(self.retry_budget);
        let tls_refusals = std::sync::atomic::AtomicUsize::new(0);
        let res = (|| {
            self.attempt(
                method.clone(),
                path,
                query,
                body.clone(),
                Some(deadline.attempt_timeout(self.request_timeout)),
            )
        })
        .retry(backoff)
        .sleep(tokio::time::sleep)
        .when(|f| {
            let again = match f {
                Failure::NotSent(_) => true,
                Failure::Unknown(_) => idempotent,
                // Another endpoint may accept: final once every one has refused.
                Failure::Refused(_) => {
                    tls_refusals.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 < self.endpoints.len()
                }
            };
            again && deadline.open()
        })
        .await;
        let url = self.url.clone();
        let answer = match res {
            Ok(a) => a,
            Err(Failure::NotSent(reason)) => return Err(StoreError::Unavailable { url, op, reason }),
            Err(Failure::Unknown(reason)) if idempotent => {
                return Err(StoreError::Unavailable { url, op, reason });
            }
            Err(Failure::Unknown(reason)) => return Err(StoreError::Ambiguous { url, op, reason }),
            Err(Failure::Refused(message)) => return Err(StoreError::Denied { url, op, message }),
        };
        if answer.status == 403 || answer.status == 401 {
            let doing = if method == reqwest::Method::GET {
                "reading"
            } else {
                "writing"
            };
            return Err(StoreError::Denied {
                url,
                op,
                message: denied_message(&answer.body, doing, path),
            });
        }
        Ok(answer)
    }

    /// An entry as stored; a key that is not a valid key of ours is skipped with a
    /// warning naming it (it never fails the whole call).
    fn decode(&self, raw: RawEntry) -> Option<KeyValue> {
        let value = raw
            .value
            .map(|v| B64.decode(v).unwrap_or_default())
            .unwrap_or_default();
        let Ok(key) = Key::new(format!("/{}", raw.key)) else {
            tracing::warn!(
                store = %self.url,
                key = %crate::encode::escape_bytes(raw.key.as_bytes()),
                "skipping a key that is not a valid key (another program wrote it)"
            );
            return None;
        };
        // Consul keeps no per-key write count; 1 marks "exists".
        Some(KeyValue::from_bytes(
            key,
            value,
            raw.create_index as i64,
            raw.modify_index as i64,
            1,
            raw.session.map(LeaseId),
        ))
    }

    fn entries(&self, op: &'static str, a: &Answer) -> Result<Vec<KeyValue>> {
        if a.status == 404 {
            return Ok(Vec::new());
        }
        self.expect_ok(op, a)?;
        let raw: Vec<RawEntry> = serde_json::from_slice(&a.body)
            .map_err(|e| self.rejected(op, format!("unexpected answer: {e}")))?;
        Ok(raw.into_iter().filter_map(|r| self.decode(r)).collect())
    }

    fn rejected(&self, op: &'static str, message: String) -> StoreError {
        StoreError::Rejected {
            url: self.url.clone(),
            op,
            message,
        }
    }

    fn expect_ok(&self, op: &'static str, a: &Answer) -> Result<()> {
        if a.status == 200 {
            Ok(())
        } else {
            Err(self.rejected(
                op,
                format!("HTTP {}: {}", a.status, String::from_utf8_lossy(&a.body).trim()),
            ))
        }
    }

    async fn list_raw(
        &self,
        op: &'static str,
        prefix: &str,
        block: Option<u64>,
    ) -> Result<(Vec<KeyValue>, u64)> {
        let mut query = vec![("recurse", String::new())];
        let a = match block {
            None => {
                self.call(op, reqwest::Method::GET, &kv_path(prefix), &query, None, true)
                    .await?
            }
            Some(index) => {
                query.push(("index", index.to_string()));
                query.push(("wait", format!("{}s", BLOCK_WAIT.as_secs())));
                // Consul answers within the wait plus up to a sixteenth of it (its
                // jitter); a server that says nothing for longer is gone.
                let limit = BLOCK_WAIT + BLOCK_WAIT / 16 + self.request_timeout;
                match self
                    .attempt(reqwest::Method::GET, &kv_path(prefix), &query, None, Some(limit))
                    .await
                {
                    Ok(a) if a.status == 403 => {
                        return Err(StoreError::Denied {
                            url: self.url.clone(),
                            op,
                            message: denied_message(&a.body, "reading", &kv_path(prefix)),
                        });
                    }
                    Ok(a) => a,
                    Err(Failure::NotSent(reason) | Failure::Unknown(reason)) => {
                        return Err(StoreError::Unavailable {
                            url: self.url.clone(),
                            op,
                            reason,
                        });
                    }
                    Err(Failure::Refused(message)) => {
                        return Err(StoreError::Denied {
                            url: self.url.clone(),
                            op,
                            message,
                        });
                    }
                }
            }
        };
        if a.filtered {
            // A partial fleet is never used: a driver would count fewer hosts in
            // flight than there are.
            return Err(StoreError::Denied {
                url: self.url.clone(),
                op,
                message: format!(
                    "Consul left out keys under /{prefix} that this ACL token may not read; \
                     a partial listing is not used (the token needs read on every key under it)"
                ),
            });
        }
        let kvs = self.entries(op, &a)?;
        Ok((kvs, a.index.unwrap_or(0).max(1)))
    }

    /// Applies Consul txn operations; `Ok(None)` when a check failed (nothing written).
    /// `revision`: the caller wants the transaction's revision (a transaction that
    /// puts nothing then costs a read of the index after it); otherwise 0.
    async fn apply(
        &self,
        ops: Vec<Value>,
        idempotent: bool,
        revision: bool,
    ) -> Result<std::result::Result<Revision, String>> {
        if ops.len() > CONSUL_MAX_TXN_OPS {
            return Err(self.rejected(
                "transaction",
                format!(
                    "{} operations; Consul allows at most {CONSUL_MAX_TXN_OPS} in one transaction",
                    ops.len()
                ),
            ));
        }
        let body = serde_json::to_vec(&ops).unwrap_or_default();
        let keys = txn_keys(&ops);
        let a = self
            .call(
                "transaction",
                reqwest::Method::PUT,
                "/v1/txn",
                &[],
                Some(body),
                idempotent,
            )
            .await?;
        let answer = || serde_json::from_slice::<Value>(&a.body).unwrap_or(Value::Null);
        match a.status {
            // Consul answers a write transaction without `X-Consul-Index`: the
            // revision is the highest `ModifyIndex` of the keys it put (a changed
            // key's is the transaction's own; a skipped same-value write shows its
            // old one), or, when there are none (only deletes), the index read
            // after it.
            200 => Ok(Ok(match (a.index, put_index(&answer(), &ops)) {
                (Some(i), _) => i,
                (None, Some(m)) => m,
                (None, None) if revision => self.index().await?,
                (None, None) => 0,
            } as Revision)),
            409 => {
                let v = answer();
                if let Some(message) = txn_denied(&v, &keys) {
                    return Err(StoreError::Denied {
                        url: self.url.clone(),
                        op: "transaction",
                        message,
                    });
                }
                let what = v["Errors"][0]["What"].as_str().unwrap_or("a check failed");
                Ok(Err(what.to_string()))
            }
            413 => Err(self.rejected("transaction", too_large(&a.body, &keys))),
            _ => Err(self.rejected(
                "transaction",
                format!("HTTP {}: {}", a.status, String::from_utf8_lossy(&a.body).trim()),
            )),
        }
    }

    /// The KV store's current index (a read of a key that never exists).
    async fn index(&self) -> Result<u64> {
        let a = self
            .call(
                "ping",
                reqwest::Method::GET,
                &kv_path(".jio-ping"),
                &[],
                None,
                true,
            )
            .await?;
        if a.status != 200 && a.status != 404 {
            self.expect_ok("ping", &a)?;
        }
        Ok(a.index.unwrap_or(0).max(1))
    }
}

/// An answer that is no answer: rate limits (429; 503 "rate limit exceeded" for
/// writes) and a server without a leader (500 `No cluster leader`) refuse before
/// anything is applied, so another try is safe, on another server if there is one;
/// another server error that is not the API's own may have been applied.
fn refused_by_server(status: u16, body: &[u8]) -> Option<Failure> {
    let said = String::from_utf8_lossy(body);
    if status == 429
        || (status == 503 && said.contains("rate limit"))
        || (status >= 500 && said.contains("No cluster leader"))
    {
        return Some(Failure::NotSent(format!("HTTP {status}: {}", said.trim())));
    }
    if status >= 500 && !is_api_error(body) {
        return Some(Failure::Unknown(format!("HTTP {status}: {}", said.trim())));
    }
    None
}

/// Each operation's key, and whether Consul checks the token for writing it: read
/// for `get` and `check-index`, write for the rest (`check-not-exists` too).
fn txn_keys(ops: &[Value]) -> Vec<(bool, String)> {
    ops.iter()
        .map(|op| {
            let verb = op["KV"]["Verb"].as_str().unwrap_or("");
            let write = !matches!(verb, "get" | "check-index" | "check-session");
            (write, format!("/{}", op["KV"]["Key"].as_str().unwrap_or("")))
        })
        .collect()
}

/// The highest `ModifyIndex` among the results of the keys the transaction put:
/// only those count (a `check-index` or `get` result shows the index the key had
/// before it).
fn put_index(answer: &Value, ops: &[Value]) -> Option<u64> {
    let puts: Vec<&str> = ops
        .iter()
        .filter(|op| matches!(op["KV"]["Verb"].as_str(), Some("set" | "cas" | "lock")))
        .filter_map(|op| op["KV"]["Key"].as_str())
        .collect();
    answer["Results"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["KV"]["Key"].as_str().is_some_and(|k| puts.contains(&k)))
        .filter_map(|r| r["KV"]["ModifyIndex"].as_u64())
        .max()
}

/// ACL denials come back as 409 too, one error per operation refused: a refusal,
/// never a lost compare. The message names the keys refused for writing and for
/// reading.
fn txn_denied(answer: &Value, keys: &[(bool, String)]) -> Option<String> {
    let denied: Vec<&(bool, String)> = answer["Errors"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            e["What"]
                .as_str()
                .is_some_and(|w| w.to_ascii_lowercase().contains("permission denied"))
        })
        .filter_map(|e| keys.get(e["OpIndex"].as_u64()? as usize))
        .collect();
    if denied.is_empty() {
        return None;
    }
    let list = |write: bool| {
        let ks: Vec<&str> = denied
            .iter()
            .filter(|(w, _)| *w == write)
            .map(|(_, k)| k.as_str())
            .collect();
        ks.join(", ")
    };
    let parts: Vec<String> = [(true, "writing"), (false, "reading")]
        .into_iter()
        .map(|(w, doing)| (doing, list(w)))
        .filter(|(_, ks)| !ks.is_empty())
        .map(|(doing, ks)| format!("{doing} {ks}"))
        .collect();
    Some(format!(
        "Permission denied ({} with this ACL token)",
        parts.join("; ")
    ))
}

/// A transaction too large for Consul (413), naming the first keys it wrote.
fn too_large(body: &[u8], keys: &[(bool, String)]) -> String {
    let written: Vec<&str> = keys.iter().filter(|(w, _)| *w).map(|(_, k)| k.as_str()).collect();
    let shown = written.iter().take(3).copied().collect::<Vec<_>>().join(", ");
    let more = written.len().saturating_sub(3);
    format!(
        "{} (writing {shown}{}): Consul takes at most 512 KiB per value and per transaction",
        String::from_utf8_lossy(body).trim(),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    )
}

fn kv_path(key: &str) -> String {
    format!("/v1/kv/{}", crate::encode::path(key))
}

/// A 401/403 answer as one line: Consul's words, and the key (or endpoint) of `path`.
fn denied_message(body: &[u8], doing: &str, path: &str) -> String {
    let said = String::from_utf8_lossy(body).trim().to_string();
    let said = if said.is_empty() {
        "Permission denied".to_string()
    } else {
        said
    };
    match path.strip_prefix("/v1/kv/") {
        Some(key) => format!("{said} ({doing} /{key} with this ACL token)"),
        None => format!("{said} ({path} with this ACL token)"),
    }
}

/// Consul answers API errors in plain text; a 500 that says why is not a transport failure.
fn is_api_error(body: &[u8]) -> bool {
    let t = String::from_utf8_lossy(body);
    t.contains("invalid session") || t.contains("Invalid Session") || t.contains("No path to datacenter")
}

fn session_invalid(what: &str) -> bool {
    what.contains("invalid session") || what.contains("Invalid session")
}

fn ttl_string(d: Duration) -> String {
    format!("{}s", d.as_secs().max(CONSUL_MIN_TTL.as_secs()))
}

#[async_trait]
impl Store for ConsulStore {
    fn url(&self) -> &str {
        &self.inner.url
    }

    fn max_txn_ops(&self) -> usize {
        CONSUL_MAX_TXN_OPS
    }

    fn absent_compare_needs_write(&self) -> bool {
        true
    }

    async fn ping(&self) -> Result<Revision> {
        Ok(self.inner.index().await? as Revision)
    }

    async fn get(&self, key: &Key) -> Result<Option<KeyValue>> {
        let a = self
            .inner
            .call("get", reqwest::Method::GET, &kv_path(ckey(key)), &[], None, true)
            .await?;
        Ok(self
            .inner
            .entries("get", &a)?
            .into_iter()
            .find(|kv| kv.key == *key))
    }

    async fn list(&self, prefix: &Key) -> Result<Listing> {
        let (kvs, index) = self.inner.list_raw("list", ckey(prefix), None).await?;
        Ok(Listing {
            kvs,
            revision: index as Revision,
        })
    }

    async fn put(&self, key: &Key, value: &str, lease: Option<&LeaseId>) -> Result<Revision> {
        let mut op = json!({"Verb": "set", "Key": ckey(key), "Value": B64.encode(value)});
        if let Some(l) = lease {
            op["Verb"] = json!("lock");
            op["Session"] = json!(l.0);
        }
        match self.inner.apply(vec![json!({ "KV": op })], true, true).await? {
            Ok(rev) => Ok(rev),
            Err(what) if session_invalid(&what) => Err(StoreError::LeaseNotFound {
                url: self.inner.url.clone(),
                lease: lease.cloned().unwrap_or(LeaseId(String::new())),
            }),
            Err(what) => Err(self.inner.rejected("put", what)),
        }
    }

    async fn delete(&self, key: &Key) -> Result<bool> {
        // `get` fails when the key is missing, which rolls the delete back: one request.
        let ops = vec![
            json!({"KV": {"Verb": "get", "Key": ckey(key)}}),
            json!({"KV": {"Verb": "delete", "Key": ckey(key)}}),
        ];
        Ok(self.inner.apply(ops, true, false).await?.is_ok())
    }

    async fn delete_prefix(&self, prefix: &Key) -> Result<u64> {
        let (kvs, _) = self.inner.list_raw("delete prefix", ckey(prefix), None).await?;
        if kvs.is_empty() {
            return Ok(0);
        }
        let ops = vec![json!({"KV": {"Verb": "delete-tree", "Key": ckey(prefix)}})];
        self.inner
            .apply(ops, true, false)
            .await?
            .map_err(|w| self.inner.rejected("delete prefix", w))?;
        Ok(kvs.len() as u64)
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        if let Some(message) = overlapping_ops(&txn.ops) {
            return Err(self.inner.rejected("transaction", message));
        }
        let mut ops = Vec::new();
        for c in &txn.compares {
            match c {
                Compare::Absent(k) | Compare::ModRevision(k, 0) => {
                    ops.push(json!({"KV": {"Verb": "check-not-exists", "Key": ckey(k)}}))
                }
                Compare::ModRevision(k, r) => {
                    ops.push(json!({"KV": {"Verb": "check-index", "Key": ckey(k), "Index": r}}))
                }
                Compare::Value(k, v) => match self.get(k).await? {
                    Some(kv) if kv.value == *v => ops.push(
                        json!({"KV": {"Verb": "check-index", "Key": ckey(k), "Index": kv.mod_revision}}),
                    ),
                    _ => return Ok(TxnOutcome::Lost(self.ping().await?)),
                },
            }
        }
        let mut lease = None;
        for op in &txn.ops {
            ops.push(match op {
                Op::Put { key, value, lease: None } => {
                    json!({"KV": {"Verb": "set", "Key": ckey(key), "Value": B64.encode(value)}})
                }
                Op::Put {
                    key,
                    value,
                    lease: Some(l),
                } => {
                    lease = Some(l.clone());
                    json!({"KV": {"Verb": "lock", "Key": ckey(key), "Value": B64.encode(value), "Session": l.0}})
                }
                Op::Delete(k) => json!({"KV": {"Verb": "delete", "Key": ckey(k)}}),
                Op::DeletePrefix(p) => json!({"KV": {"Verb": "delete-tree", "Key": ckey(p)}}),
            });
        }
        match self.inner.apply(ops, false, true).await? {
            Ok(rev) => Ok(TxnOutcome::Committed(rev)),
            Err(what) if session_invalid(&what) => Err(StoreError::LeaseNotFound {
                url: self.inner.url.clone(),
                lease: lease.unwrap_or(LeaseId(String::new())),
            }),
            Err(_) => Ok(TxnOutcome::Lost(self.ping().await?)),
        }
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<Lease> {
        let ttl = ttl.max(CONSUL_MIN_TTL);
        // TTL-only (`NodeChecks: []`, Consul ≥ 1.7): without it a session inherits
        // the `serfHealth` check of the server that created it, and one server's
        // restart would end every liveness record and the rollout lock at once.
        // No lock-delay: a lock whose session ended may be taken again at once.
        let body = json!({
            "Name": "jio",
            "TTL": ttl_string(ttl),
            "Behavior": "delete",
            "LockDelay": "0s",
            "NodeChecks": [],
        });
        let a = self
            .inner
            .call(
                "lease grant",
                reqwest::Method::PUT,
                "/v1/session/create",
                &[],
                Some(body.to_string().into_bytes()),
                true,
            )
            .await?;
        self.inner.expect_ok("lease grant", &a)?;
        let v: Value = serde_json::from_slice(&a.body).unwrap_or(Value::Null);
        let id = v["ID"].as_str().ok_or_else(|| {
            self.inner
                .rejected("lease grant", "no session ID in the answer".into())
        })?;
        Ok(Lease {
            id: LeaseId(id.to_string()),
            ttl: Duration::from_secs(ttl.as_secs().max(CONSUL_MIN_TTL.as_secs())),
        })
    }

    async fn keep_alive(&self, lease: &LeaseId) -> Result<Duration> {
        let path = format!("/v1/session/renew/{}", crate::encode::path(&lease.0));
        let a = self
            .inner
            .call("lease keep-alive", reqwest::Method::PUT, &path, &[], None, true)
            .await?;
        if a.status == 404 {
            return Err(StoreError::LeaseNotFound {
                url: self.inner.url.clone(),
                lease: lease.clone(),
            });
        }
        self.inner.expect_ok("lease keep-alive", &a)?;
        let v: Value = serde_json::from_slice(&a.body).unwrap_or(Value::Null);
        let ttl = v[0]["TTL"]
            .as_str()
            .and_then(|t| crate::duration::parse(t).ok())
            .unwrap_or(CONSUL_MIN_TTL);
        Ok(ttl)
    }

    async fn revoke_lease(&self, lease: &LeaseId) -> Result<()> {
        let path = format!("/v1/session/destroy/{}", crate::encode::path(&lease.0));
        let a = self
            .inner
            .call("lease revoke", reqwest::Method::PUT, &path, &[], None, true)
            .await?;
        self.inner.expect_ok("lease revoke", &a)
    }

    async fn watch(&self, prefix: &Key, from: Revision) -> Result<WatchStream> {
        let (kvs, index) = self.inner.list_raw("watch", ckey(prefix), None).await?;
        let (tx, rx) = mpsc::channel(1024);
        // Something changed at or after `from`, and there is no history to replay it.
        if from > 0 && index as Revision >= from {
            let _ = tx
                .send(Ok(WatchEvent::Reset {
                    kvs: kvs.clone(),
                    revision: index as Revision,
                }))
                .await;
        }
        let inner = self.inner.clone();
        let prefix = prefix.clone();
        tokio::spawn(async move { watch_task(inner, prefix, kvs, index, tx).await });
        Ok(Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|ev| (ev, rx))
        })))
    }

    async fn compact(&self, _revision: Revision) -> Result<()> {
        Ok(())
    }
}

async fn watch_task(
    inner: Arc<Inner>,
    prefix: Key,
    kvs: Vec<KeyValue>,
    mut index: u64,
    tx: mpsc::Sender<Result<WatchEvent>>,
) {
    let mut state: BTreeMap<Key, KeyValue> = kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect();
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        let answer = tokio::select! {
            a = inner.list_raw("watch", ckey(&prefix), Some(index)) => a,
            _ = tx.closed() => return,
        };
        let (kvs, new_index) = match answer {
            Ok(x) => x,
            Err(e) => {
                if backoff.failures() == 0 {
                    tracing::warn!(prefix = %prefix, error = %e, "consul watch failed; retrying");
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff.fail_spread()) => {}
                    _ = tx.closed() => return,
                }
                continue;
            }
        };
        if backoff.succeed() {
            tracing::info!(prefix = %prefix, "consul watch reconnected");
            count_watch_reconnect();
        }
        let new_state: BTreeMap<Key, KeyValue> = kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect();
        if new_index < index {
            // The index went backwards (a restore): start again from what is there now.
            index = new_index;
            let ev = WatchEvent::Reset {
                kvs: new_state.values().cloned().collect(),
                revision: new_index as Revision,
            };
            state = new_state;
            if tx.send(Ok(ev)).await.is_err() {
                return;
            }
            continue;
        }
        if new_index == index {
            continue; // the wait ran out
        }
        let mut events: Vec<WatchEvent> = new_state
            .values()
            .filter(|kv| {
                state
                    .get(&kv.key)
                    .is_none_or(|old| old.mod_revision != kv.mod_revision)
            })
            .cloned()
            .map(WatchEvent::Put)
            .collect();
        for k in state.keys().filter(|k| !new_state.contains_key(*k)) {
            events.push(WatchEvent::Delete {
                key: k.clone(),
                revision: new_index as Revision,
            });
        }
        events.sort_by_key(WatchEvent::revision);
        for ev in events {
            if tx.send(Ok(ev)).await.is_err() {
                return;
            }
        }
        state = new_state;
        index = new_index;
    }
}
