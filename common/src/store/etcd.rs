//! etcd v3 through its HTTP/JSON gateway (`/v3/...`), with endpoint fail-over.
//!
//! Encoding facts this module handles (measured on etcd 3.4): keys and values are
//! base64, every int64 is a JSON string, zero and false fields are omitted, the watch
//! is a chunked stream of one JSON object per line.
//!
//! Retry policy: a request that cannot have been applied (connection refused) is
//! retried on the next endpoint. A request that may have been applied (timeout,
//! dropped connection, 5xx) is retried only when repeating it is harmless; for a
//! transaction it becomes `StoreError::Ambiguous` so the caller re-reads and decides.
//!
//! Security (`etcds://`, `user` and `password_file`): TLS and client certificates are
//! set up in `client`. With a user, a token is obtained from `/v3/auth/authenticate`
//! before the first request and sent raw in `Authorization` (the gateway refuses a
//! `Bearer` prefix). etcd answers 401 (code 16) once the token has expired (simple
//! tokens last 5 minutes): the token is dropped, one request authenticates again,
//! and the refused request is sent again. That is always safe, even for a
//! transaction, because etcd checks the token before applying anything. The
//! password is read from its file at each authentication, so it can be rotated
//! without a restart; it and the token appear in no message.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use backon::Retryable;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use futures_util::StreamExt as _;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::client::{EndpointClient, endpoint_clients, error_chain, tls_failure};
use super::{
    Compare, Deadline, KeyValue, Lease, LeaseId, Listing, Op, Result, Revision, Store, StoreError, StoreUrl,
    Txn, TxnOutcome, WatchEvent, WatchStream, prefix_end,
};
use super::{Endpoints, retry_policy};
use super::{EtcdAuth, TlsSettings};
use crate::backoff::Backoff;
use crate::keys::Key;
use crate::secret::Secret;

/// Timeouts and retry budget of the etcd client.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// Limit for one unary request to one endpoint.
    pub request_timeout: Duration,
    /// Limit for opening a connection to one endpoint.
    pub connect_timeout: Duration,
    /// Total time one operation may spend retrying across endpoints.
    pub retry_budget: Duration,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            request_timeout: Duration::from_secs(3),
            connect_timeout: Duration::from_secs(1),
            retry_budget: Duration::from_secs(10),
        }
    }
}

/// A client of one etcd cluster.
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// The store as messages name it: scheme and endpoints (no query).
    url: String,
    endpoints: Endpoints,
    /// One per endpoint, in the order of `endpoints`.
    clients: Vec<EndpointClient>,
    tls: Option<TlsSettings>,
    auth: Option<Auth>,
    opts: EtcdOptions,
}

/// The user and its current token.
struct Auth {
    user: String,
    password_file: std::path::PathBuf,
    token: std::sync::Mutex<TokenState>,
    /// Held while authenticating, so that a token expiring under many requests is
    /// renewed once.
    renewing: tokio::sync::Mutex<()>,
    /// Tokens obtained so far (the first one included).
    obtained: std::sync::atomic::AtomicU64,
}

#[derive(Clone)]
enum TokenState {
    /// None yet, or the last one expired.
    Missing,
    Valid(Secret),
    /// The server has authentication disabled: requests go without a token until it
    /// asks for one.
    NotEnabled,
}

/// Why one attempt failed.
enum Failure {
    /// Not applied; try another endpoint.
    NotSent(String),
    /// Maybe applied.
    Unknown(String),
    /// The gateway answered with an error.
    Status { http: u16, code: i64, message: String },
    /// The answer could not be decoded.
    Decode(String),
    /// The token was refused as invalid or expired (nothing was applied); the next
    /// attempt authenticates again.
    TokenExpired,
    /// Authentication failed, or the request was refused: retrying will not help.
    Refused(String),
    /// This endpoint refused the TLS connection: another endpoint may not.
    Tls(String),
}

impl EtcdStore {
    /// A client for the endpoints of `url` (which must be an `etcd://` or `etcds://`
    /// URL). Reads and checks the TLS files and the password file; sends nothing.
    pub fn new(url: &StoreUrl, opts: EtcdOptions) -> Result<EtcdStore> {
        let invalid = |reason: String| StoreError::InvalidUrl {
            url: url.without_query(),
            reason,
        };
        let StoreUrl::Etcd { endpoints, tls, auth } = url else {
            return Err(invalid("not an etcd:// URL".into()));
        };
        let clients = endpoint_clients(endpoints, tls.as_ref(), opts.connect_timeout).map_err(invalid)?;
        let auth = match auth {
            None => None,
            Some(EtcdAuth { user, password_file }) => {
                crate::secret::read_secret_file(password_file)
                    .map_err(|r| invalid(format!("password_file {}: {r}", password_file.display())))?;
                Some(Auth {
                    user: user.clone(),
                    password_file: password_file.clone(),
                    token: std::sync::Mutex::new(TokenState::Missing),
                    renewing: tokio::sync::Mutex::new(()),
                    obtained: std::sync::atomic::AtomicU64::new(0),
                })
            }
        };
        Ok(EtcdStore {
            inner: Arc::new(Inner {
                url: url.without_query(),
                endpoints: Endpoints::new(clients.iter().map(|c| c.base.clone()).collect(), "etcd"),
                clients,
                tls: tls.clone(),
                auth,
                opts,
            }),
        })
    }

    /// How many tokens this client has obtained (0 without a user): more than one
    /// means a token was renewed.
    pub fn tokens_obtained(&self) -> u64 {
        self.inner
            .auth
            .as_ref()
            .map_or(0, |a| a.obtained.load(std::sync::atomic::Ordering::Relaxed))
    }
}

impl Auth {
    fn current(&self) -> TokenState {
        self.token
            .lock()
            .map(|t| t.clone())
            .unwrap_or(TokenState::Missing)
    }

    fn set(&self, state: TokenState) {
        if let Ok(mut t) = self.token.lock() {
            *t = state;
        }
    }

    /// Forgets `used` if it is still the current token (another request may have
    /// renewed it already).
    fn expired(&self, used: Option<&Secret>) {
        if let Ok(mut t) = self.token.lock() {
            let same = match (&*t, used) {
                (TokenState::Valid(cur), Some(u)) => cur == u,
                (TokenState::NotEnabled, None) => true,
                _ => false,
            };
            if same {
                *t = TokenState::Missing;
            }
        }
    }
}
impl Inner {
    async fn attempt<R: DeserializeOwned>(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<R, Failure> {
        let token = self.token(timeout).await?;
        let (i, base) = self.endpoints.pick();
        let mut req = self.clients[i]
            .http
            .post(format!("{base}{path}"))
            .timeout(timeout)
            .json(body);
        if let Some(t) = &token {
            req = req.header(reqwest::header::AUTHORIZATION, t.expose());
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => return Err(self.send_failure(i, e)),
        };
        let status = resp.status();
        let bytes = match resp.bytes().await {
            Ok(b) => b,
            Err(e) => {
                let reason = error_chain(&e.without_url());
                self.endpoints.fail_over(i, &reason);
                return Err(Failure::Unknown(reason));
            }
        };
        if !status.is_success() {
            let err: GatewayError = serde_json::from_slice(&bytes).unwrap_or_default();
            let message = if err.message.is_empty() {
                String::from_utf8_lossy(&bytes).trim().chars().take(200).collect()
            } else {
                err.message
            };
            if let Some(auth) = &self.auth {
                let expired = status.as_u16() == 401 || err.code == 16;
                let asks_for_one = token.is_none() && err.code == 3 && message.contains("user name is empty");
                if expired || asks_for_one {
                    auth.expired(token.as_ref());
                    return Err(Failure::TokenExpired);
                }
            }
            if message.contains("CommonName of client") {
                return Err(self.common_name_refused());
            }
            if self.auth.is_none() && message.contains("user name is empty") {
                return Err(Failure::Refused(format!(
                    "{message}: etcd has authentication on; give user and password_file in the store URL"
                )));
            }
            if status.is_server_error() {
                self.endpoints.fail_over(i, &message);
            }
            return Err(Failure::Status {
                http: status.as_u16(),
                code: err.code,
                message,
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| Failure::Decode(e.to_string()))
    }

    /// What a request that got no answer means: a TLS refusal (final), a connection
    /// never made (not applied), or a request that may have been applied.
    fn send_failure(&self, i: usize, e: reqwest::Error) -> Failure {
        let connect = e.is_connect();
        let reason = error_chain(&e.without_url());
        self.endpoints.fail_over(i, &reason);
        if let Some(tls) = tls_failure(&reason, self.tls.as_ref()) {
            return Failure::Tls(tls);
        }
        if connect {
            Failure::NotSent(reason)
        } else {
            Failure::Unknown(reason)
        }
    }

    /// A failed authentication request: the request it precedes was not sent, so it
    /// may be sent again whatever it is (a TLS refusal stays one).
    fn auth_send_failure(&self, i: usize, e: reqwest::Error) -> Failure {
        match self.send_failure(i, e) {
            Failure::Unknown(r) => Failure::NotSent(format!("authentication: {r}")),
            f => f,
        }
    }

    /// The token to send: none without a user; the current one; or a new one,
    /// obtained by one request while the others wait for it.
    async fn token(&self, timeout: Duration) -> Result<Option<Secret>, Failure> {
        let Some(auth) = &self.auth else { return Ok(None) };
        match auth.current() {
            TokenState::Valid(t) => return Ok(Some(t)),
            TokenState::NotEnabled => return Ok(None),
            TokenState::Missing => {}
        }
        // Another request is authenticating: wait for it, within this attempt's time.
        let Ok(_one) = tokio::time::timeout(timeout, auth.renewing.lock()).await else {
            return Err(Failure::NotSent(
                "timed out waiting for another request's authentication".into(),
            ));
        };
        match auth.current() {
            TokenState::Valid(t) => return Ok(Some(t)),
            TokenState::NotEnabled => return Ok(None),
            TokenState::Missing => {}
        }
        let password = crate::secret::read_secret_file(&auth.password_file)
            .map_err(|r| Failure::Refused(format!("password_file {}: {r}", auth.password_file.display())))?;
        let (i, base) = self.endpoints.pick();
        let body = json!({ "name": auth.user, "password": password.expose() });
        let resp = self.clients[i]
            .http
            .post(format!("{base}/v3/auth/authenticate"))
            .timeout(timeout)
            .json(&body)
            .send()
            .await
            .map_err(|e| self.auth_send_failure(i, e))?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| self.auth_send_failure(i, e))?;
        if status.is_success() {
            #[derive(Deserialize, Default)]
            #[serde(default)]
            struct Answer {
                token: String,
            }
            let a: Answer = serde_json::from_slice(&bytes).map_err(|e| Failure::Decode(e.to_string()))?;
            if a.token.is_empty() {
                return Err(Failure::Decode("authentication answered without a token".into()));
            }
            let n = auth.obtained.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if n > 0 {
                tracing::info!(store = %self.url, user = %auth.user, "etcd token renewed");
            }
            let token = Secret::new(a.token);
            auth.set(TokenState::Valid(token.clone()));
            return Ok(Some(token));
        }
        let mut err: GatewayError = serde_json::from_slice(&bytes).unwrap_or_default();
        if err.message.is_empty() {
            err.message = String::from_utf8_lossy(&bytes).trim().chars().take(200).collect();
        }
        if err.message.contains("CommonName of client") {
            return Err(self.common_name_refused());
        }
        if err.message.contains("authentication is not enabled") {
            tracing::warn!(store = %self.url, user = %auth.user, "etcd has authentication disabled; sending requests without a token until it asks for one");
            auth.set(TokenState::NotEnabled);
            return Ok(None);
        }
        if status.is_server_error() {
            // Nothing of the request it precedes was sent.
            self.endpoints.fail_over(i, &err.message);
            return Err(Failure::NotSent(format!("authentication: {}", err.message)));
        }
        Err(Failure::Refused(format!(
            "authentication as user {:?} failed: {} (password read from {})",
            auth.user,
            err.message.trim_start_matches("etcdserver: "),
            auth.password_file.display()
        )))
    }

    /// etcd's gateway refuses a client certificate with a CommonName once
    /// authentication is on (etcd would take the CommonName as the user).
    fn common_name_refused(&self) -> Failure {
        Failure::Refused(format!(
            "etcd's gateway refuses client certificates that carry a CommonName while authentication is on (etcd would take it as the user name); issue {} without one (a subject such as O=jiocloud) and authenticate with user and password_file",
            self.tls.as_ref().and_then(|t| t.cert_file.as_ref()).map_or_else(
                || "the client certificate".to_string(),
                |p| p.display().to_string()
            )
        ))
    }

    /// Names what was refused, and as whom, in a permission error.
    fn denied_on(&self, e: StoreError, what: impl FnOnce() -> String) -> StoreError {
        match e {
            StoreError::Denied { url, op, message } if message.contains("permission denied") => {
                StoreError::Denied {
                    url,
                    op,
                    message: match &self.auth {
                        Some(a) => format!("{message} ({} as user {:?})", what(), a.user),
                        None => format!("{message} ({})", what()),
                    },
                }
            }
            e => e,
        }
    }

    /// One operation with retries. `idempotent` says whether repeating a request that
    /// may have been applied is harmless.
    async fn call<R: DeserializeOwned>(
        &self,
        op: &'static str,
        path: &str,
        body: Value,
        idempotent: bool,
    ) -> Result<R, CallError> {
        let backoff = retry_policy(self.opts.retry_budget);
        // A TLS refusal is final once every endpoint has refused.
        let tls_refusals = std::sync::atomic::AtomicUsize::new(0);
        let retryable = |f: &Failure| match f {
            Failure::NotSent(_) | Failure::TokenExpired => true,
            Failure::Unknown(_) => idempotent,
            Failure::Status { http, code, .. } => *http >= 500 && (idempotent || *code == 14),
            Failure::Tls(_) => {
                tls_refusals.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 < self.endpoints.len()
            }
            Failure::Decode(_) | Failure::Refused(_) => false,
        };
        let deadline = Deadline::after(self.opts.retry_budget);
        let res = (|| self.attempt::<R>(path, &body, deadline.attempt_timeout(self.opts.request_timeout)))
            .retry(backoff)
            .sleep(tokio::time::sleep)
            .when(|f| retryable(f) && deadline.open())
            .await;
        res.map_err(|f| self.classify(op, f, idempotent))
    }

    fn classify(&self, op: &'static str, f: Failure, idempotent: bool) -> CallError {
        let url = self.url.clone();
        CallError::Store(match f {
            Failure::NotSent(reason) => StoreError::Unavailable { url, op, reason },
            Failure::Refused(message) | Failure::Tls(message) => StoreError::Denied { url, op, message },
            Failure::TokenExpired => StoreError::Denied {
                url,
                op,
                message: "etcd kept refusing the authentication token as invalid".into(),
            },
            Failure::Unknown(reason) if idempotent => StoreError::Unavailable { url, op, reason },
            Failure::Unknown(reason) => StoreError::Ambiguous { url, op, reason },
            Failure::Decode(reason) => StoreError::Rejected {
                url,
                op,
                message: format!("unexpected answer: {reason}"),
            },
            Failure::Status { code: 5, message, .. } => return CallError::NotFound(message),
            Failure::Status {
                code: 11, message, ..
            } => return CallError::OutOfRange(message),
            Failure::Status { http, message, .. } if http >= 500 => {
                if idempotent {
                    StoreError::Unavailable {
                        url,
                        op,
                        reason: message,
                    }
                } else {
                    StoreError::Ambiguous {
                        url,
                        op,
                        reason: message,
                    }
                }
            }
            Failure::Status {
                http: 401 | 403,
                message,
                ..
            }
            | Failure::Status {
                code: 7 | 16,
                message,
                ..
            } => StoreError::Denied { url, op, message },
            Failure::Status { message, .. } => StoreError::Rejected { url, op, message },
        })
    }

    async fn range(&self, op: &'static str, body: Value) -> Result<RangeResponse> {
        self.call(op, "/v3/kv/range", body, true)
            .await
            .map_err(|e| e.into_store(&self.url, op))
    }

    /// A key-value as stored. A key that is not a valid text key (another program
    /// wrote it) is skipped with a warning naming it; it never fails the whole call.
    fn decode_kv(&self, raw: RawKv) -> Option<KeyValue> {
        let key = decode_key(&self.url, &raw.key)?;
        Some(KeyValue::from_bytes(
            key,
            B64.decode(&raw.value).unwrap_or_default(),
            raw.create_revision,
            raw.mod_revision,
            raw.version,
            (raw.lease != 0).then(|| LeaseId(raw.lease.to_string())),
        ))
    }
}

/// The outcome of `call` before it is mapped for a particular operation.
enum CallError {
    Store(StoreError),
    /// gRPC code 5: a lease (or key) that does not exist.
    NotFound(String),
    /// gRPC code 11: a compacted or future revision.
    OutOfRange(String),
}

impl CallError {
    fn into_store(self, url: &str, op: &'static str) -> StoreError {
        match self {
            CallError::Store(e) => e,
            CallError::NotFound(message) | CallError::OutOfRange(message) => StoreError::Rejected {
                url: url.to_string(),
                op,
                message,
            },
        }
    }
}

/// Keys as a message names them: the first three, then how many more.
fn key_list<'a>(keys: impl Iterator<Item = &'a Key>) -> String {
    let keys: Vec<&Key> = keys.collect();
    let mut s = keys
        .iter()
        .take(3)
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    if keys.len() > 3 {
        s.push_str(&format!(" and {} more", keys.len() - 3));
    }
    s
}

fn b64(s: &[u8]) -> String {
    B64.encode(s)
}

/// A stored key name, or `None` (with a warning naming it, escaped) when it is not
/// a valid text key.
fn decode_key(url: &str, b: &str) -> Option<Key> {
    let bytes = B64.decode(b).unwrap_or_default();
    let key = String::from_utf8(bytes.clone())
        .ok()
        .and_then(|k| Key::new(k).ok());
    if key.is_none() {
        tracing::warn!(
            store = %url,
            key = %crate::encode::escape_bytes(&bytes),
            "skipping a key that is not a valid text key (another program wrote it)"
        );
    }
    key
}

fn range_body(prefix: &Key) -> Value {
    let mut body = json!({ "key": b64(prefix.as_str().as_bytes()) });
    body["range_end"] = json!(b64(
        &prefix_end(prefix.as_str().as_bytes()).unwrap_or_else(|| vec![0])
    ));
    body
}

/// etcd sends int64 as strings, but accept numbers too.
fn de_i64<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Num {
        S(String),
        N(i64),
    }
    match Num::deserialize(d)? {
        Num::N(n) => Ok(n),
        Num::S(s) => s.parse().map_err(serde::de::Error::custom),
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct GatewayError {
    message: String,
    code: i64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Header {
    #[serde(deserialize_with = "de_i64")]
    revision: i64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawKv {
    key: String,
    value: String,
    #[serde(deserialize_with = "de_i64")]
    create_revision: i64,
    #[serde(deserialize_with = "de_i64")]
    mod_revision: i64,
    #[serde(deserialize_with = "de_i64")]
    version: i64,
    #[serde(deserialize_with = "de_i64")]
    lease: i64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RangeResponse {
    header: Header,
    kvs: Vec<RawKv>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WriteResponse {
    header: Header,
    #[serde(deserialize_with = "de_i64")]
    deleted: i64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TxnResponse {
    header: Header,
    succeeded: bool,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "UPPERCASE")]
struct LeaseGrant {
    #[serde(deserialize_with = "de_i64")]
    id: i64,
    #[serde(deserialize_with = "de_i64")]
    ttl: i64,
    #[serde(rename = "error")]
    error: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct KeepAliveResponse {
    result: LeaseGrant,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WatchLine {
    result: Option<WatchResult>,
    error: Option<GatewayError>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WatchResult {
    created: bool,
    canceled: bool,
    #[serde(deserialize_with = "de_i64")]
    compact_revision: i64,
    cancel_reason: String,
    events: Vec<RawEvent>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawEvent {
    #[serde(rename = "type")]
    kind: String,
    kv: RawKv,
}

#[async_trait]
impl Store for EtcdStore {
    fn url(&self) -> &str {
        &self.inner.url
    }

    async fn ping(&self) -> Result<Revision> {
        // An empty transaction: linearizable, answered with the cluster's current
        // revision, and allowed to any user (a range over a key would need read
        // permission on that key).
        let r: TxnResponse = self
            .inner
            .call("ping", "/v3/kv/txn", json!({}), true)
            .await
            .map_err(|e| e.into_store(&self.inner.url, "ping"))?;
        Ok(r.header.revision)
    }

    async fn get(&self, key: &Key) -> Result<Option<KeyValue>> {
        let body = json!({ "key": b64(key.as_str().as_bytes()) });
        let resp = self
            .inner
            .range("get", body)
            .await
            .map_err(|e| self.inner.denied_on(e, || format!("reading {key}")))?;
        Ok(resp
            .kvs
            .into_iter()
            .next()
            .and_then(|kv| self.inner.decode_kv(kv)))
    }

    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<KeyValue>>> {
        // One read-only transaction of ranges: one request, one revision.
        let success: Vec<Value> = keys
            .iter()
            .map(|k| json!({ "request_range": { "key": b64(k.as_str().as_bytes()) } }))
            .collect();
        let body = json!({ "compare": [], "success": success });
        let r: Value = self
            .inner
            .call("get", "/v3/kv/txn", body, true)
            .await
            .map_err(|e| e.into_store(&self.inner.url, "get"))
            .map_err(|e| {
                self.inner
                    .denied_on(e, || format!("reading {}", key_list(keys.iter())))
            })?;
        let responses = r["responses"].as_array().cloned().unwrap_or_default();
        let mut out = Vec::with_capacity(keys.len());
        for i in 0..keys.len() {
            let range: RangeResponse = responses
                .get(i)
                .map(|x| serde_json::from_value(x["response_range"].clone()).unwrap_or_default())
                .unwrap_or_default();
            out.push(
                range
                    .kvs
                    .into_iter()
                    .next()
                    .and_then(|kv| self.inner.decode_kv(kv)),
            );
        }
        Ok(out)
    }

    async fn list(&self, prefix: &Key) -> Result<Listing> {
        let resp = self
            .inner
            .range("list", range_body(prefix))
            .await
            .map_err(|e| self.inner.denied_on(e, || format!("reading {prefix}")))?;
        let revision = resp.header.revision;
        let kvs = resp
            .kvs
            .into_iter()
            .filter_map(|kv| self.inner.decode_kv(kv))
            .collect();
        Ok(Listing { kvs, revision })
    }

    async fn put(&self, key: &Key, value: &str, lease: Option<&LeaseId>) -> Result<Revision> {
        let mut body = json!({ "key": b64(key.as_str().as_bytes()), "value": b64(value.as_bytes()) });
        if let Some(l) = lease {
            body["lease"] = json!(l.0);
        }
        match self
            .inner
            .call::<WriteResponse>("put", "/v3/kv/put", body, true)
            .await
        {
            Ok(r) => Ok(r.header.revision),
            Err(CallError::NotFound(_)) => Err(StoreError::LeaseNotFound {
                url: self.inner.url.clone(),
                lease: lease.cloned().unwrap_or(LeaseId(String::new())),
            }),
            Err(e) => Err(self
                .inner
                .denied_on(e.into_store(&self.inner.url, "put"), || format!("writing {key}"))),
        }
    }

    async fn delete(&self, key: &Key) -> Result<bool> {
        let body = json!({ "key": b64(key.as_str().as_bytes()) });
        let r: WriteResponse = self
            .inner
            .call("delete", "/v3/kv/deleterange", body, true)
            .await
            .map_err(|e| e.into_store(&self.inner.url, "delete"))
            .map_err(|e| self.inner.denied_on(e, || format!("deleting {key}")))?;
        Ok(r.deleted > 0)
    }

    async fn delete_prefix(&self, prefix: &Key) -> Result<u64> {
        let r: WriteResponse = self
            .inner
            .call("delete prefix", "/v3/kv/deleterange", range_body(prefix), true)
            .await
            .map_err(|e| e.into_store(&self.inner.url, "delete prefix"))
            .map_err(|e| self.inner.denied_on(e, || format!("deleting {prefix}")))?;
        Ok(r.deleted.max(0) as u64)
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        let compare: Vec<Value> = txn
            .compares
            .iter()
            .map(|c| match c {
                Compare::Absent(k) => json!({"target": "CREATE", "result": "EQUAL", "key": b64(k.as_str().as_bytes()), "create_revision": "0"}),
                Compare::ModRevision(k, r) => json!({"target": "MOD", "result": "EQUAL", "key": b64(k.as_str().as_bytes()), "mod_revision": r.to_string()}),
                Compare::Value(k, v) => json!({"target": "VALUE", "result": "EQUAL", "key": b64(k.as_str().as_bytes()), "value": b64(v.as_bytes())}),
            })
            .collect();
        let success: Vec<Value> = txn
            .ops
            .iter()
            .map(|op| match op {
                Op::Put { key, value, lease } => {
                    let mut p = json!({"key": b64(key.as_str().as_bytes()), "value": b64(value.as_bytes())});
                    if let Some(l) = lease {
                        p["lease"] = json!(l.0);
                    }
                    json!({ "request_put": p })
                }
                Op::Delete(k) => json!({"request_delete_range": {"key": b64(k.as_str().as_bytes())}}),
                Op::DeletePrefix(p) => json!({ "request_delete_range": range_body(p) }),
            })
            .collect();
        let body = json!({ "compare": compare, "success": success });
        match self
            .inner
            .call::<TxnResponse>("transaction", "/v3/kv/txn", body, false)
            .await
        {
            Ok(r) if r.succeeded => Ok(TxnOutcome::Committed(r.header.revision)),
            Ok(r) => Ok(TxnOutcome::Lost(r.header.revision)),
            Err(CallError::NotFound(_)) => Err(StoreError::LeaseNotFound {
                url: self.inner.url.clone(),
                lease: txn
                    .ops
                    .iter()
                    .find_map(|op| match op {
                        Op::Put { lease: Some(l), .. } => Some(l.clone()),
                        _ => None,
                    })
                    .unwrap_or(LeaseId(String::new())),
            }),
            Err(e) => Err(self
                .inner
                .denied_on(e.into_store(&self.inner.url, "transaction"), || {
                    let written = txn.ops.iter().map(|op| match op {
                        Op::Put { key, .. } | Op::Delete(key) | Op::DeletePrefix(key) => key,
                    });
                    format!("writing {}", key_list(written))
                })),
        }
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<Lease> {
        let secs = ttl.as_secs_f64().ceil().max(1.0) as i64;
        let r: LeaseGrant = self
            .inner
            .call(
                "lease grant",
                "/v3/lease/grant",
                json!({ "TTL": secs.to_string() }),
                true,
            )
            .await
            .map_err(|e| e.into_store(&self.inner.url, "lease grant"))?;
        if !r.error.is_empty() || r.id == 0 {
            return Err(StoreError::Rejected {
                url: self.inner.url.clone(),
                op: "lease grant",
                message: r.error,
            });
        }
        Ok(Lease {
            id: LeaseId(r.id.to_string()),
            ttl: Duration::from_secs(r.ttl.max(0) as u64),
        })
    }

    async fn keep_alive(&self, lease: &LeaseId) -> Result<Duration> {
        let not_found = || StoreError::LeaseNotFound {
            url: self.inner.url.clone(),
            lease: lease.clone(),
        };
        match self
            .inner
            .call::<KeepAliveResponse>(
                "lease keep-alive",
                "/v3/lease/keepalive",
                json!({ "ID": lease.0 }),
                true,
            )
            .await
        {
            // An ended lease answers with no TTL (zero fields are omitted).
            Ok(r) if r.result.ttl > 0 => Ok(Duration::from_secs(r.result.ttl as u64)),
            Ok(_) | Err(CallError::NotFound(_)) => Err(not_found()),
            Err(e) => Err(e.into_store(&self.inner.url, "lease keep-alive")),
        }
    }

    async fn revoke_lease(&self, lease: &LeaseId) -> Result<()> {
        match self
            .inner
            .call::<Value>("lease revoke", "/v3/lease/revoke", json!({ "ID": lease.0 }), true)
            .await
        {
            Ok(_) | Err(CallError::NotFound(_)) => Ok(()),
            Err(e) => Err(e.into_store(&self.inner.url, "lease revoke")),
        }
    }

    async fn watch(&self, prefix: &Key, from: Revision) -> Result<WatchStream> {
        // Pin "from now on" to a revision before returning, so that a reconnection
        // later resumes from there and nothing written after this call is missed.
        let from = if from > 0 { from } else { self.ping().await? + 1 };
        let (tx, rx) = mpsc::channel(1024);
        let inner = self.inner.clone();
        let prefix = prefix.clone();
        tokio::spawn(async move { watch_task(inner, prefix, from, tx).await });
        Ok(Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|ev| (ev, rx))
        })))
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let body = json!({ "revision": revision.to_string(), "physical": true });
        match self
            .inner
            .call::<Value>("compact", "/v3/kv/compaction", body, true)
            .await
        {
            Ok(_) => Ok(()),
            // Already compacted at or past this revision: the goal holds.
            Err(CallError::OutOfRange(m)) if m.contains("compacted") => Ok(()),
            Err(e) => Err(e.into_store(&self.inner.url, "compact")),
        }
    }
}

/// Why one watch connection ended.
enum WatchEnd {
    ReceiverGone,
    Compacted,
    Broken(String),
}

async fn watch_task(
    inner: Arc<Inner>,
    prefix: Key,
    mut next: Revision,
    tx: mpsc::Sender<Result<WatchEvent>>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    let mut broken = false;
    loop {
        match watch_once(&inner, &prefix, &mut next, &tx, &mut broken).await {
            WatchEnd::ReceiverGone => return,
            WatchEnd::Compacted => {
                // History is gone: hand over the whole state and resume after it.
                let resp = inner.range("watch re-list", range_body(&prefix)).await;
                let listing = resp.map(|r| Listing {
                    kvs: r.kvs.into_iter().filter_map(|kv| inner.decode_kv(kv)).collect(),
                    revision: r.header.revision,
                });
                match listing {
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
                }
            }
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

/// A failure to open a watch, as the watch's warning says it.
fn watch_failure(inner: &Inner, f: Failure) -> String {
    match inner.classify("watch", f, true) {
        CallError::Store(e) => e.to_string(),
        CallError::NotFound(m) | CallError::OutOfRange(m) => m,
    }
}

async fn watch_once(
    inner: &Inner,
    prefix: &Key,
    next: &mut Revision,
    tx: &mpsc::Sender<Result<WatchEvent>>,
    broken: &mut bool,
) -> WatchEnd {
    let token = match inner.token(inner.opts.request_timeout).await {
        Ok(t) => t,
        Err(f) => return WatchEnd::Broken(watch_failure(inner, f)),
    };
    let (i, base) = inner.endpoints.pick();
    let mut create = range_body(prefix);
    create["start_revision"] = json!(next.to_string());
    let body = json!({ "create_request": create });
    let mut req = inner.clients[i].http.post(format!("{base}/v3/watch")).json(&body);
    if let Some(t) = &token {
        req = req.header(reqwest::header::AUTHORIZATION, t.expose());
    }
    let resp = tokio::select! {
        r = req.send() => r,
        _ = tx.closed() => return WatchEnd::ReceiverGone,
    };
    let resp = match resp {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => {
            let reason = format!("HTTP {}", r.status());
            inner.endpoints.fail_over(i, &reason);
            return WatchEnd::Broken(reason);
        }
        Err(e) => return WatchEnd::Broken(watch_failure(inner, inner.send_failure(i, e))),
    };
    let mut stream = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let chunk = tokio::select! {
            c = stream.next() => c,
            _ = tx.closed() => return WatchEnd::ReceiverGone,
        };
        let chunk = match chunk {
            Some(Ok(c)) => c,
            Some(Err(e)) => {
                let reason = error_chain(&e.without_url());
                inner.endpoints.fail_over(i, &reason);
                return WatchEnd::Broken(reason);
            }
            None => return WatchEnd::Broken("the server closed the watch stream".into()),
        };
        buf.extend_from_slice(&chunk);
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let parsed: WatchLine = match serde_json::from_slice(&line) {
                Ok(p) => p,
                Err(e) => return WatchEnd::Broken(format!("undecodable watch message: {e}")),
            };
            if let Some(err) = parsed.error {
                return WatchEnd::Broken(format!("watch error: {}", err.message));
            }
            let Some(res) = parsed.result else { continue };
            if res.created && *broken {
                tracing::info!(prefix = %prefix, endpoint = %base, "watch reconnected");
                *broken = false;
            }
            if res.canceled {
                if res.compact_revision > 0 {
                    return WatchEnd::Compacted;
                }
                if let Some(auth) = &inner.auth {
                    let r = &res.cancel_reason;
                    if r.contains("Unauthenticated") || r.contains("user name is empty") {
                        // Expired: the next connection authenticates again.
                        auth.expired(token.as_ref());
                        return WatchEnd::Broken("the authentication token expired".into());
                    }
                    if r.contains("PermissionDenied") {
                        return WatchEnd::Broken(format!(
                            "permission denied (watching {prefix} as user {:?})",
                            auth.user
                        ));
                    }
                }
                return WatchEnd::Broken(format!("watch canceled: {}", res.cancel_reason));
            }
            let mut last = *next - 1;
            for ev in res.events {
                let rev = ev.kv.mod_revision;
                if rev < *next {
                    continue; // already delivered before a reconnection
                }
                let out = if ev.kind == "DELETE" {
                    decode_key(&inner.url, &ev.kv.key).map(|key| WatchEvent::Delete { key, revision: rev })
                } else {
                    inner.decode_kv(ev.kv).map(WatchEvent::Put)
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
}
