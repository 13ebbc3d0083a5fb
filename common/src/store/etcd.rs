//! etcd v3 over its gRPC API (the `etcd-client` crate, on tonic): one HTTP/2
//! connection to the current endpoint carries every request, watch and lease
//! renewal of a process. (The JSON gateway it replaced needed an HTTP/1.1
//! connection per watch and a translation inside etcd for every request;
//! BENCHMARKS.md has the comparison.)
//!
//! Endpoints and retries: one endpoint is current; a failure moves every request on
//! to the next. A request that cannot have been applied (the connection was refused,
//! TLS refused it, authentication failed before it) is sent again at once. One that
//! may have been applied (no answer in time, a connection broken under it) is sent
//! again only when repeating it is harmless; a transaction then becomes
//! `StoreError::Ambiguous`, so the caller re-reads and decides. An operation retries
//! for at most its budget, requests included.
//!
//! Security (`etcds://`, `user` and `password_file`): the CA, the client certificate
//! and its key are read and checked when the store is opened; `server_name` is the
//! name checked in every endpoint's certificate (and sent as SNI) while connecting
//! to the endpoint's own address. With a user, the client authenticates when it
//! first uses an endpoint (reading the password file then) and sends the token with
//! every request. etcd refuses an expired token (simple tokens last 5 minutes by
//! default) with "invalid auth token": the client authenticates again and resends,
//! which is safe even for a transaction, because etcd checks the token before
//! applying anything. If that fails too, the endpoint's connection is rebuilt, which
//! reads the password file again (a password can be rotated without a restart).
//! Over gRPC, etcd takes the user from the token when one is sent, and from the
//! client certificate's CommonName only when none is. The password and the token
//! appear in no message.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use backon::Retryable as _;
use etcd_client::{
    Certificate, Client, Compare as GCompare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    PutOptions, SortOrder, SortTarget, TlsOptions, Txn as GTxn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::sync::mpsc;

use super::api::{
    Compare, KeyValue, Lease, LeaseId, Listing, Op, Result, Revision, Seen, Store, StoreError, Txn,
    TxnOutcome, WatchEvent, WatchStream,
};
use super::client::{error_chain, tls_failure, tls_pem};
use super::support::{Deadline, Endpoints, count_watch_reconnect, overlapping_ops, retry_policy};
use super::url::{EtcdAuth, StoreUrl, TlsSettings};
use crate::backoff::Backoff;
use crate::keys::Key;

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
    members: Vec<Member>,
    tls: Option<TlsSettings>,
    auth: Option<EtcdAuth>,
    /// Said once: the server has authentication off although a user is configured.
    auth_off_said: AtomicBool,
    /// Tokens obtained so far, on every endpoint.
    tokens: std::sync::atomic::AtomicU64,
    /// The open keep-alive stream of each lease being renewed. A renewal takes its
    /// lease's out while it uses it: one cut short (a timeout) leaves nothing behind
    /// whose late answer the next renewal could mistake for its own.
    keepers: std::sync::Mutex<std::collections::HashMap<i64, Keeper>>,
    opts: EtcdOptions,
}

/// One endpoint and its connection, made when first needed.
struct Member {
    uri: String,
    connect: ConnectOptions,
    state: std::sync::Mutex<MemberState>,
    /// Held while the connection is made or authenticated, so that many requests
    /// needing it do it once.
    making: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct MemberState {
    client: Option<Client>,
    /// The connection carries a token that etcd has not refused yet (or needs none).
    ready: bool,
    /// Counts authentications, so that a refusal of an old token does not discard a
    /// new one.
    generation: u64,
}

/// Which connection an attempt uses: its endpoint and its authentication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Conn {
    member: usize,
    generation: u64,
}

/// A lease's keep-alive stream, kept open between renewals (one request on an open
/// stream each, rather than a stream opened per renewal).
struct Keeper {
    conn: Conn,
    keeper: etcd_client::LeaseKeeper,
    stream: etcd_client::LeaseKeepAliveStream,
}

/// Why one attempt failed.
enum Failure {
    /// Not applied; try the next endpoint.
    NotSent(String),
    /// Maybe applied.
    Unknown(String),
    /// etcd answered with an error.
    Status(tonic::Code, String),
    /// The token was refused (nothing was applied); the next attempt authenticates
    /// again.
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
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(opts.connect_timeout)
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            // Expired tokens are renewed here, reading the password file again.
            .with_auto_token_refresh(false)
            // A member cut off from the leader refuses requests and cancels watches
            // (etcd's "hasleader" metadata) instead of answering from its own state
            // or going silent: the client moves on to another endpoint.
            .with_require_leader(true);
        if let Some(t) = tls {
            let pem = tls_pem(t).map_err(invalid)?;
            let mut o = TlsOptions::new();
            if let Some(ca) = pem.ca {
                o = o.ca_certificate(Certificate::from_pem(ca));
            }
            if let Some((cert, key)) = pem.identity {
                o = o.identity(Identity::from_pem(cert, key));
            }
            if let Some(n) = &t.server_name {
                o = o.domain_name(n.clone());
            }
            connect = connect.with_tls(o);
        }
        if let Some(a) = auth {
            crate::secret::read_secret_file(&a.password_file)
                .map_err(|r| invalid(format!("password_file {}: {r}", a.password_file.display())))?;
        }
        let scheme = if tls.is_some() { "https" } else { "http" };
        let members = endpoints
            .iter()
            .map(|e| Member {
                uri: format!("{scheme}://{e}"),
                connect: connect.clone(),
                state: std::sync::Mutex::new(MemberState::default()),
                making: tokio::sync::Mutex::new(()),
            })
            .collect();
        Ok(EtcdStore {
            inner: Arc::new(Inner {
                url: url.without_query(),
                endpoints: Endpoints::new(
                    endpoints.iter().map(|e| format!("{scheme}://{e}")).collect(),
                    "etcd",
                ),
                members,
                tls: tls.clone(),
                auth: auth.clone(),
                auth_off_said: AtomicBool::new(false),
                tokens: std::sync::atomic::AtomicU64::new(0),
                keepers: std::sync::Mutex::new(std::collections::HashMap::new()),
                opts,
            }),
        })
    }
}

impl Member {
    /// The connection and its generation, if it is ready for requests.
    fn ready(&self) -> Option<(Client, u64)> {
        let st = self.state.lock().ok()?;
        match (&st.client, st.ready) {
            (Some(c), true) => Some((c.clone(), st.generation)),
            _ => None,
        }
    }

    /// etcd refused the token sent with a request of `generation`: the next request
    /// authenticates again (unless another one already did).
    fn token_refused(&self, generation: u64) {
        if let Ok(mut st) = self.state.lock()
            && st.generation == generation
        {
            st.ready = false;
        }
    }
}

impl Inner {
    /// The connection to endpoint `i` and its generation: made, and authenticated,
    /// if it is not ready.
    async fn client(&self, i: usize, timeout: Duration) -> Result<(Client, u64), Failure> {
        let m = &self.members[i];
        if let Some(ready) = m.ready() {
            return Ok(ready);
        }
        let Ok(_one) = tokio::time::timeout(timeout, m.making.lock()).await else {
            return Err(Failure::NotSent(
                "timed out waiting for another request's authentication".into(),
            ));
        };
        if let Some(ready) = m.ready() {
            return Ok(ready);
        }
        let existing = m.state.lock().ok().and_then(|st| st.client.clone());
        let mut client = match existing {
            Some(c) => c,
            // Sends nothing: the connection is made by the first request.
            None => Client::connect([m.uri.as_str()], Some(m.connect.clone()))
                .await
                .map_err(|e| Failure::Refused(format!("cannot set up a client for {}: {e}", m.uri)))?,
        };
        if let Some(auth) = &self.auth {
            self.authenticate(i, auth, &mut client, timeout).await?;
        }
        let mut st = m
            .state
            .lock()
            .map_err(|_| Failure::Refused("a client thread panicked".into()))?;
        st.client = Some(client.clone());
        st.ready = true;
        st.generation += 1;
        Ok((client, st.generation))
    }

    /// Obtains a token for `client` (reading the password file now), or finds that
    /// etcd has authentication off.
    async fn authenticate(
        &self,
        i: usize,
        auth: &EtcdAuth,
        client: &mut Client,
        timeout: Duration,
    ) -> Result<(), Failure> {
        let password = crate::secret::read_secret_file(&auth.password_file)
            .map_err(|r| Failure::Refused(format!("password_file {}: {r}", auth.password_file.display())))?;
        let creds = Some((auth.user.clone(), password.expose().to_string()));
        let e = match tokio::time::timeout(timeout, client.update_user(creds)).await {
            Ok(Ok(())) => {
                if self.tokens.fetch_add(1, Ordering::Relaxed) > 0 {
                    tracing::info!(store = %self.url, user = %auth.user, "etcd token renewed");
                }
                return Ok(());
            }
            Ok(Err(e)) => e,
            Err(_) => {
                let reason = format!("authentication: no answer within {timeout:?}");
                self.endpoints.fail_over(i, &reason);
                return Err(Failure::NotSent(reason));
            }
        };
        Err(match self.failure(i, 0, e) {
            Failure::Status(_, msg) if msg.contains("authentication is not enabled") => {
                if !self.auth_off_said.swap(true, Ordering::Relaxed) {
                    tracing::warn!(store = %self.url, user = %auth.user, "etcd has authentication disabled; sending requests without a token until it asks for one");
                }
                // Forget any old token.
                let _ = client.update_user(None).await;
                return Ok(());
            }
            Failure::Status(_, msg) => Failure::Refused(format!(
                "authentication as user {:?} failed: {} (password read from {})",
                auth.user,
                msg.trim_start_matches("etcdserver: "),
                auth.password_file.display()
            )),
            // Nothing of the request it precedes was sent.
            Failure::Unknown(r) => Failure::NotSent(format!("authentication: {r}")),
            f => f,
        })
    }

    /// What a client error means for the attempt that got it.
    fn failure(&self, i: usize, generation: u64, e: etcd_client::Error) -> Failure {
        let status = match e {
            etcd_client::Error::GRpcStatus(s) => s,
            etcd_client::Error::TransportError(t) => {
                let reason = error_chain(&t);
                self.endpoints.fail_over(i, &reason);
                return self.unanswered(reason, false);
            }
            etcd_client::Error::LeaseKeepAliveError(m) if m.contains("not found") => {
                return Failure::Status(tonic::Code::NotFound, m);
            }
            other => return Failure::Unknown(other.to_string()),
        };
        let code = status.code();
        let message = status.message().to_string();
        // tonic reports a transport failure with the cause as the source: a
        // connection it could not make (refused, a name that does not resolve, a TLS
        // handshake) is a `tonic::ConnectError` somewhere in the chain, and then
        // nothing was sent.
        if let Some(source) = std::error::Error::source(&status) {
            let chain = error_chain(source);
            self.endpoints.fail_over(i, &chain);
            return self.unanswered(format!("{message}: {chain}"), never_connected(source));
        }
        match code {
            // Refused before anything was applied: a token that expired, or one
            // from before a change of users or roles (etcd's own client
            // authenticates again on both).
            tonic::Code::Unauthenticated => {
                self.members[i].token_refused(generation);
                Failure::TokenExpired
            }
            tonic::Code::InvalidArgument if message.contains("revision of auth store is old") => {
                self.members[i].token_refused(generation);
                Failure::TokenExpired
            }
            // A member cut off from the leader (the requests say they need one) or
            // one shedding load answers before proposing anything.
            tonic::Code::Unavailable if message.contains("no leader") => {
                self.endpoints.fail_over(i, &message);
                Failure::NotSent(message)
            }
            tonic::Code::ResourceExhausted if message.contains("too many requests") => {
                Failure::NotSent(message)
            }
            tonic::Code::InvalidArgument if message.contains("user name is empty") => {
                if self.auth.is_some() {
                    // Authentication was off and has been turned on.
                    self.members[i].token_refused(generation);
                    self.auth_off_said.store(false, Ordering::Relaxed);
                    Failure::TokenExpired
                } else {
                    Failure::Refused(format!(
                        "{message}: etcd has authentication on; give user and password_file in the store URL"
                    ))
                }
            }
            tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Internal
            | tonic::Code::Aborted => {
                self.endpoints.fail_over(i, &message);
                Failure::Unknown(message)
            }
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => Failure::Unknown(message),
            code => Failure::Status(code, message),
        }
    }

    /// A request that got no answer: a TLS refusal (final for this endpoint), a
    /// connection never made (not applied), or a request that may have been applied.
    fn unanswered(&self, reason: String, not_sent: bool) -> Failure {
        if let Some(tls) = tls_failure(&reason, self.tls.as_ref()) {
            return Failure::Tls(tls);
        }
        if not_sent {
            Failure::NotSent(reason)
        } else {
            Failure::Unknown(reason)
        }
    }

    /// One attempt of `f` on the current endpoint.
    async fn attempt<T, F, Fut>(&self, f: &F, timeout: Duration) -> Result<T, Failure>
    where
        F: Fn(Client, Conn) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let (i, _) = self.endpoints.pick();
        let (client, generation) = self.client(i, timeout).await?;
        let conn = Conn {
            member: i,
            generation,
        };
        match tokio::time::timeout(timeout, f(client, conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.failure(i, generation, e)),
            Err(_) => {
                let reason = format!("no answer within {timeout:?}");
                self.endpoints.fail_over(i, &reason);
                Err(Failure::Unknown(reason))
            }
        }
    }

    /// One operation with retries. `idempotent` says whether repeating a request that
    /// may have been applied is harmless.
    async fn call<T, F, Fut>(&self, op: &'static str, idempotent: bool, f: F) -> Result<T, CallError>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.call_on(op, idempotent, |c, _| f(c)).await
    }

    /// `call`, telling `f` which connection its client is.
    async fn call_on<T, F, Fut>(&self, op: &'static str, idempotent: bool, f: F) -> Result<T, CallError>
    where
        F: Fn(Client, Conn) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        // A TLS refusal is final once every endpoint has refused.
        let tls_refusals = std::sync::atomic::AtomicUsize::new(0);
        let retryable = |f: &Failure| match f {
            Failure::NotSent(_) | Failure::TokenExpired => true,
            Failure::Unknown(_) => idempotent,
            Failure::Tls(_) => tls_refusals.fetch_add(1, Ordering::Relaxed) + 1 < self.endpoints.len(),
            Failure::Status(..) | Failure::Refused(_) => false,
        };
        let deadline = Deadline::after(self.opts.retry_budget);
        let res = (|| self.attempt(&f, deadline.attempt_timeout(self.opts.request_timeout)))
            .retry(retry_policy(self.opts.retry_budget))
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
            // The budget ran out while tokens were being renewed: transient.
            Failure::TokenExpired => StoreError::Unavailable {
                url,
                op,
                reason: "etcd refused the authentication token until the retry budget ran out".into(),
            },
            Failure::Unknown(reason) if idempotent => StoreError::Unavailable { url, op, reason },
            Failure::Unknown(reason) => StoreError::Ambiguous { url, op, reason },
            Failure::Status(tonic::Code::NotFound, message) => return CallError::NotFound(message),
            Failure::Status(tonic::Code::OutOfRange, message) => return CallError::OutOfRange(message),
            Failure::Status(tonic::Code::PermissionDenied, message) => {
                StoreError::Denied { url, op, message }
            }
            Failure::Status(_, message) => StoreError::Rejected { url, op, message },
        })
    }

    /// Names what was refused, and as whom, in a permission error.
    fn denied_on(&self, e: StoreError, what: impl FnOnce() -> String) -> StoreError {
        match e {
            StoreError::Denied { url, op, message } if message.contains("permission denied") => {
                StoreError::Denied {
                    url,
                    op,
                    message: match (&self.auth, self.tls.as_ref().and_then(|t| t.cert_file.as_ref())) {
                        (Some(a), _) => format!("{message} ({} as user {:?})", what(), a.user),
                        // etcd took the user from the certificate's CommonName.
                        (None, Some(cert)) => format!(
                            "{message} ({} with no user given, as the CommonName of {}: etcd has authentication on; give user and password_file in the store URL)",
                            what(),
                            cert.display()
                        ),
                        (None, None) => format!("{message} ({})", what()),
                    },
                }
            }
            e => e,
        }
    }

    /// A read: retried, and a refusal names the keys.
    async fn read<T, F, Fut>(&self, op: &'static str, what: impl FnOnce() -> String, f: F) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.call(op, true, f)
            .await
            .map_err(|e| self.denied_on(e.into_store(&self.url, op), what))
    }
}

/// The outcome of `call` before it is mapped for a particular operation.
enum CallError {
    Store(StoreError),
    /// gRPC NotFound: a lease that does not exist.
    NotFound(String),
    /// gRPC OutOfRange: a compacted or future revision.
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

/// The first line of a plain HTTP/1 server's answer to `GET /version` (`HTTP/1.0
/// 404 File not found`), if one answers within 2 s and it is not etcd's own answer
/// (etcd serves `/version` over HTTP/1 too, naming `etcdserver`). The rest of the
/// answer is read only to tell, never shown.
async fn http1_status_line(addr: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let probe = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(format!("GET /version HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut answer = Vec::new();
        let mut buf = [0u8; 1024];
        while answer.len() < 4096 {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
        let head = String::from_utf8_lossy(&answer);
        let line = head.lines().next()?.trim();
        (line.starts_with("HTTP/") && !head.contains("etcdserver"))
            .then(|| line.chars().take(80).collect::<String>())
    };
    tokio::time::timeout(Duration::from_secs(2), probe)
        .await
        .ok()
        .flatten()
}

/// Why the TLS server at `addr` refuses this client, when it does so for want of
/// a client certificate (none is configured): a handshake, then a read without
/// writing anything, so the server's alert comes before it closes. A request
/// written meanwhile can lose that alert to a reset, which then reads as a plain
/// closed connection. `None` when the server does not refuse it (or cannot be
/// asked: no `ca_file` to check it with, a client certificate given).
async fn tls_refusal(addr: &str, tls: &TlsSettings) -> Option<String> {
    use rustls_pki_types::pem::PemObject as _;
    use tokio::io::AsyncReadExt as _;
    use tokio_rustls::rustls;
    if tls.cert_file.is_some() {
        return None;
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_file_iter(tls.ca_file.as_ref()?).ok()? {
        roots.add(cert.ok()?).ok()?;
    }
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
            .with_safe_default_protocol_versions()
            .ok()?
            .with_root_certificates(roots)
            .with_no_client_auth();
    let host = addr
        .rsplit_once(':')
        .map_or(addr, |(h, _)| h)
        .trim_matches(['[', ']']);
    let name =
        rustls_pki_types::ServerName::try_from(tls.server_name.clone().unwrap_or_else(|| host.to_string()))
            .ok()?;
    let probe = async {
        let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
        let mut s = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .ok()?;
        let mut b = [0u8; 1];
        match s.read(&mut b).await {
            Err(e) => tls_failure(&error_chain(&e), Some(tls)),
            Ok(_) => None,
        }
    };
    tokio::time::timeout(Duration::from_secs(2), probe)
        .await
        .ok()
        .flatten()
}

/// Whether an error's chain says the connection was never made.
fn never_connected(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.downcast_ref::<tonic::ConnectError>().is_some() {
            return true;
        }
        cur = err.source();
    }
    false
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

/// A key-value as stored. A key that is not a valid text key (another program wrote
/// it) is skipped with a warning naming it; it never fails the whole call.
fn decode(url: &str, kv: &etcd_client::KeyValue) -> Option<KeyValue> {
    let key = match std::str::from_utf8(kv.key()).ok().and_then(|k| Key::new(k).ok()) {
        Some(k) => k,
        None => {
            tracing::warn!(
                store = %url,
                key = %crate::encode::escape_bytes(kv.key()),
                "skipping a key that is not a valid text key (another program wrote it)"
            );
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

fn revision<H>(h: Option<&H>, rev: impl Fn(&H) -> i64) -> Revision {
    h.map_or(0, rev)
}

#[async_trait]
impl Store for EtcdStore {
    fn url(&self) -> &str {
        &self.inner.url
    }

    async fn ping(&self) -> Result<Revision> {
        // An empty transaction: answered with the member's current revision, and
        // allowed to any user (a read of a key would need permission on that key).
        // etcd answers it from the member's own state, but a member without a leader
        // refuses it (the requests require one).
        let r = self
            .inner
            .read(
                "ping",
                || "reading the revision".to_string(),
                |mut c| async move { c.txn(GTxn::new()).await },
            )
            .await;
        match r {
            Ok(r) => Ok(revision(r.header(), |h| h.revision())),
            // An HTTP/1 answer read as HTTP/2 frames: not etcd at all. Said as such,
            // with the server's status line (never its body).
            // (or, as often, the connection broken or closed while the client wrote
            // to a server that had answered and closed; the probe below asks the
            // server itself, and a real etcd's answer is never named so)
            Err(StoreError::Unavailable { url, op, reason })
                if reason.contains("frame with invalid size")
                    || reason.contains("broken pipe")
                    || reason.contains("connection reset")
                    || reason.contains("connection closed") =>
            {
                let mut answers = Vec::new();
                for e in self.inner.endpoints.urls() {
                    if let Some(addr) = e.strip_prefix("http://")
                        && let Some(line) = http1_status_line(addr).await
                    {
                        answers.push(format!("{addr} answered {line:?}"));
                    }
                }
                let reason = if answers.is_empty() && !reason.contains("frame with invalid size") {
                    // A broken connection, and no other server answers: as it was.
                    reason
                } else if answers.is_empty() {
                    format!("not etcd's gRPC API (the server does not speak HTTP/2): {reason}")
                } else {
                    format!(
                        "not etcd's gRPC API: an HTTP/1 server answered ({}); is the port etcd's client port (usually 2379)?",
                        answers.join(", ")
                    )
                };
                Err(StoreError::Unavailable { url, op, reason })
            }
            // A TLS server without a word: one that wants a client certificate
            // closes on a client without one, and the alert saying so can be lost.
            Err(StoreError::Unavailable { url, op, reason }) if self.inner.tls.is_some() => {
                if let Some(tls) = &self.inner.tls {
                    for e in self.inner.endpoints.urls() {
                        if let Some(addr) = e.strip_prefix("https://")
                            && let Some(message) = tls_refusal(addr, tls).await
                        {
                            return Err(StoreError::Denied { url, op, message });
                        }
                    }
                }
                Err(StoreError::Unavailable { url, op, reason })
            }
            Err(e) => Err(e),
        }
    }

    async fn get(&self, key: &Key) -> Result<Option<KeyValue>> {
        let r = self
            .inner
            .read(
                "get",
                || format!("reading {key}"),
                |mut c| async move { c.get(key.as_str(), None).await },
            )
            .await?;
        Ok(r.kvs().first().and_then(|kv| decode(&self.inner.url, kv)))
    }

    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<KeyValue>>> {
        Ok(self.get_many_at(keys).await?.0)
    }

    async fn get_many_at(&self, keys: &[Key]) -> Result<(Vec<Option<KeyValue>>, Revision)> {
        // One read-only transaction of ranges: one request, one revision.
        let ops: Vec<TxnOp> = keys.iter().map(|k| TxnOp::get(k.as_str(), None)).collect();
        let r = self
            .inner
            .read(
                "get",
                || format!("reading {}", key_list(keys.iter())),
                |mut c| {
                    let t = GTxn::new().and_then(ops.clone());
                    async move { c.txn(t).await }
                },
            )
            .await?;
        let mut out: Vec<Option<KeyValue>> = r
            .op_responses()
            .into_iter()
            .map(|op| match op {
                TxnOpResponse::Get(g) => g.kvs().first().and_then(|kv| decode(&self.inner.url, kv)),
                _ => None,
            })
            .collect();
        out.resize(keys.len(), None);
        Ok((out, revision(r.header(), |h| h.revision())))
    }

    async fn changed_since(&self, prefix: &Key, seen: &Seen) -> Result<bool> {
        // At one revision: how many keys there are (etcd counts them in its index),
        // and the newest key's mod revision. Any put under the prefix makes a newer
        // one; a delete makes fewer keys unless a put came with it; a store restored
        // from an older copy has an older newest key. etcd still scans the prefix:
        // what this saves is sending every value.
        let count = GetOptions::new().with_prefix().with_count_only();
        let newest = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_sort(SortTarget::Mod, SortOrder::Descend)
            .with_limit(1);
        let ops = vec![
            TxnOp::get(prefix.as_str(), Some(count)),
            TxnOp::get(prefix.as_str(), Some(newest)),
        ];
        let r = self
            .inner
            .read(
                "count",
                || format!("counting {prefix}"),
                |mut c| {
                    let t = GTxn::new().and_then(ops.clone());
                    async move { c.txn(t).await }
                },
            )
            .await?;
        let answers: Vec<(i64, Revision)> = r
            .op_responses()
            .into_iter()
            .filter_map(|op| match op {
                TxnOpResponse::Get(g) => Some((g.count(), g.kvs().first().map_or(0, |kv| kv.mod_revision()))),
                _ => None,
            })
            .collect();
        // A store whose revision went back (rebuilt from scratch) is not the one seen.
        let behind = revision(r.header(), |h| h.revision()) < seen.revision;
        Ok(behind
            || match answers[..] {
                [(keys, _), (_, newest)] => keys != seen.keys as i64 || newest != seen.newest,
                _ => true,
            })
    }

    fn counts_changes(&self) -> bool {
        true
    }

    async fn list(&self, prefix: &Key) -> Result<Listing> {
        let r = self
            .inner
            .read(
                "list",
                || format!("reading {prefix}"),
                |mut c| async move {
                    c.get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
                        .await
                },
            )
            .await?;
        Ok(Listing {
            kvs: r
                .kvs()
                .iter()
                .filter_map(|kv| decode(&self.inner.url, kv))
                .collect(),
            revision: revision(r.header(), |h| h.revision()),
        })
    }

    async fn put(&self, key: &Key, value: &str, lease: Option<&LeaseId>) -> Result<Revision> {
        let mut o = PutOptions::new();
        if let Some(l) = lease {
            o = o.with_lease(lease_id(&self.inner.url, l)?);
        }
        // Writing the same value again is harmless: retried like a read.
        match self
            .inner
            .call("put", true, |mut c| {
                let o = o.clone();
                async move { c.put(key.as_str(), value, Some(o)).await }
            })
            .await
        {
            Ok(r) => Ok(revision(r.header(), |h| h.revision())),
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
        let r = self
            .inner
            .call("delete", true, |mut c| async move {
                c.delete(key.as_str(), None).await
            })
            .await
            .map_err(|e| {
                self.inner.denied_on(e.into_store(&self.inner.url, "delete"), || {
                    format!("deleting {key}")
                })
            })?;
        Ok(r.deleted() > 0)
    }

    async fn delete_prefix(&self, prefix: &Key) -> Result<u64> {
        let r = self
            .inner
            .call("delete prefix", true, |mut c| async move {
                c.delete(
                    prefix.as_str(),
                    Some(etcd_client::DeleteOptions::new().with_prefix()),
                )
                .await
            })
            .await
            .map_err(|e| {
                self.inner
                    .denied_on(e.into_store(&self.inner.url, "delete prefix"), || {
                        format!("deleting {prefix}")
                    })
            })?;
        Ok(r.deleted().max(0) as u64)
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        if let Some(dup) = overlapping_ops(&txn.ops) {
            return Err(StoreError::Rejected {
                url: self.inner.url.clone(),
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
            .map(|op| txn_op(&self.inner.url, op))
            .collect::<Result<Vec<_>>>()?;
        let res = self
            .inner
            .call("transaction", false, |mut c| {
                let t = GTxn::new().when(compares.clone()).and_then(ops.clone());
                async move { c.txn(t).await }
            })
            .await;
        match res {
            Ok(r) => {
                let rev = revision(r.header(), |h| h.revision());
                Ok(if r.succeeded() {
                    TxnOutcome::Committed(rev)
                } else {
                    TxnOutcome::Lost(rev)
                })
            }
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
        let r = self
            .inner
            .call("lease grant", true, |mut c| async move {
                c.lease_grant(secs, None).await
            })
            .await
            .map_err(|e| e.into_store(&self.inner.url, "lease grant"))?;
        if !r.error().is_empty() || r.id() == 0 {
            return Err(StoreError::Rejected {
                url: self.inner.url.clone(),
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
        let id = lease_id(&self.inner.url, lease)?;
        let not_found = || StoreError::LeaseNotFound {
            url: self.inner.url.clone(),
            lease: lease.clone(),
        };
        let inner = &self.inner;
        let res = inner
            .call_on("lease keep-alive", true, |mut c, conn| async move {
                let kept = inner
                    .keepers
                    .lock()
                    .ok()
                    .and_then(|mut k| k.remove(&id))
                    .filter(|k| k.conn == conn);
                let mut k = match kept {
                    Some(k) => k,
                    None => {
                        let (keeper, stream) = c.lease_keep_alive(id).await?;
                        Keeper { conn, keeper, stream }
                    }
                };
                k.keeper.keep_alive().await?;
                let answer = k.stream.message().await?.ok_or_else(|| {
                    etcd_client::Error::LeaseKeepAliveError("the server closed the keep-alive stream".into())
                })?;
                if answer.ttl() > 0
                    && let Ok(mut all) = inner.keepers.lock()
                {
                    all.insert(id, k);
                }
                Ok(answer)
            })
            .await;
        match res {
            // An ended lease answers with no TTL.
            Ok(r) if r.ttl() > 0 => Ok(Duration::from_secs(r.ttl() as u64)),
            Ok(_) | Err(CallError::NotFound(_)) => Err(not_found()),
            Err(e) => Err(e.into_store(&self.inner.url, "lease keep-alive")),
        }
    }

    async fn revoke_lease(&self, lease: &LeaseId) -> Result<()> {
        let id = lease_id(&self.inner.url, lease)?;
        if let Ok(mut k) = self.inner.keepers.lock() {
            k.remove(&id);
        }
        match self
            .inner
            .call(
                "lease revoke",
                true,
                |mut c| async move { c.lease_revoke(id).await },
            )
            .await
        {
            Ok(_) | Err(CallError::NotFound(_)) => Ok(()),
            Err(e) => Err(e.into_store(&self.inner.url, "lease revoke")),
        }
    }

    async fn watch(&self, prefix: &Key, from: Revision) -> Result<WatchStream> {
        self.watch_many(std::slice::from_ref(prefix), from).await
    }

    async fn watch_many(&self, prefixes: &[Key], from: Revision) -> Result<WatchStream> {
        // Pin "from now on" to a revision before returning, so that a reconnection
        // later resumes from there and nothing written after this call is missed.
        let from = if from > 0 { from } else { self.ping().await? + 1 };
        let (tx, rx) = mpsc::channel(1024);
        let store = self.clone();
        let watched = prefixes.iter().map(|p| (p.clone(), from)).collect();
        tokio::spawn(async move { watch_task(store, watched, tx).await });
        Ok(Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|ev| (ev, rx))
        })))
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        match self
            .inner
            .call("compact", true, |mut c| async move {
                c.compact(
                    revision,
                    Some(etcd_client::CompactionOptions::new().with_physical()),
                )
                .await
            })
            .await
        {
            Ok(_) => Ok(()),
            // Already compacted at or past this revision: the goal holds.
            Err(CallError::OutOfRange(m)) if m.contains("compacted") => Ok(()),
            Err(e) => Err(e.into_store(&self.inner.url, "compact")),
        }
    }
}

/// Why one watch stream ended.
enum WatchEnd {
    ReceiverGone,
    Compacted,
    Broken(String),
}

/// The prefixes of one watch stream, each with the first revision it has not
/// delivered yet.
type Watched = Vec<(Key, Revision)>;

async fn watch_task(store: EtcdStore, mut watched: Watched, tx: mpsc::Sender<Result<WatchEvent>>) {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    let mut broken = false;
    loop {
        match watch_once(&store, &mut watched, &tx, &mut broken, &mut backoff).await {
            WatchEnd::ReceiverGone => return,
            WatchEnd::Compacted => match relist(&store, &mut watched).await {
                Ok(ev) => {
                    if tx.send(Ok(ev)).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    if tx.is_closed() {
                        return;
                    }
                    tracing::warn!(prefix = %watched_names(&watched), error = %e, "watch could not re-list after compaction; retrying");
                    tokio::time::sleep(backoff.fail_spread()).await;
                    continue;
                }
            },
            WatchEnd::Broken(reason) => {
                if !broken {
                    tracing::warn!(prefix = %watched_names(&watched), %reason, "watch connection lost; reconnecting");
                    broken = true;
                }
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(backoff.fail_spread()).await;
                continue;
            }
        }
        backoff.succeed();
    }
}

/// The prefixes, for a log line.
fn watched_names(watched: &Watched) -> String {
    let names: Vec<&str> = watched.iter().map(|(k, _)| k.as_str()).collect();
    names.join(" ")
}

/// After a compaction: every prefix read again, as one `Reset`; each resumes after
/// its own listing.
/// Nothing moves until every prefix is read: a listing that fails part-way leaves
/// them all behind the compaction, so the next attempt re-lists them all again.
async fn relist(store: &EtcdStore, watched: &mut Watched) -> Result<WatchEvent> {
    let mut kvs = Vec::new();
    let mut nexts = Vec::with_capacity(watched.len());
    for (prefix, _) in watched.iter() {
        let l = store.list(prefix).await?;
        nexts.push(l.revision + 1);
        kvs.extend(l.kvs);
    }
    let revision = nexts.iter().max().map_or(0, |n| n - 1);
    for ((_, next), n) in watched.iter_mut().zip(nexts) {
        *next = n;
    }
    Ok(WatchEvent::Reset { kvs, revision })
}

/// One watch stream on the current endpoint, carrying a watch per prefix, until it
/// ends.
async fn watch_once(
    store: &EtcdStore,
    watched: &mut Watched,
    tx: &mpsc::Sender<Result<WatchEvent>>,
    broken: &mut bool,
    backoff: &mut Backoff,
) -> WatchEnd {
    let inner = &store.inner;
    let (i, _) = inner.endpoints.pick();
    let describe = |f: Failure| match inner.classify("watch", f, true) {
        CallError::Store(e) => e.to_string(),
        CallError::NotFound(m) | CallError::OutOfRange(m) => m,
    };
    let (mut c, generation) = match inner.client(i, inner.opts.request_timeout).await {
        Ok(c) => c,
        Err(f) => return WatchEnd::Broken(describe(f)),
    };
    let Some(((first, from), rest)) = watched.split_first() else {
        tx.closed().await;
        return WatchEnd::ReceiverGone;
    };
    let opts = |from: Revision| WatchOptions::new().with_prefix().with_start_revision(from);
    let opened = tokio::select! {
        r = tokio::time::timeout(inner.opts.request_timeout, async {
            // The other prefixes' watches on the same stream: etcd answers each
            // creation in the order asked.
            let mut stream = c.watch(first.as_str(), Some(opts(*from))).await?;
            for (prefix, from) in rest {
                stream.watch(prefix.as_str(), Some(opts(*from))).await?;
            }
            Ok::<_, etcd_client::Error>(stream)
        }) => r,
        _ = tx.closed() => return WatchEnd::ReceiverGone,
    };
    let mut stream = match opened {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return WatchEnd::Broken(describe(inner.failure(i, generation, e))),
        Err(_) => {
            let reason = format!("no answer within {:?}", inner.opts.request_timeout);
            inner.endpoints.fail_over(i, &reason);
            return WatchEnd::Broken(reason);
        }
    };
    // Watch id → position in `watched`, learnt from the creations' answers.
    let mut ids: Vec<i64> = Vec::with_capacity(watched.len());
    loop {
        let msg = tokio::select! {
            m = stream.message() => m,
            _ = tx.closed() => return WatchEnd::ReceiverGone,
        };
        let res = match msg {
            Ok(Some(r)) => r,
            Ok(None) => {
                inner.endpoints.fail_over(i, "the server closed the watch stream");
                return WatchEnd::Broken("the server closed the watch stream".into());
            }
            Err(e) => return WatchEnd::Broken(describe(inner.failure(i, generation, e))),
        };
        if res.created() {
            ids.push(res.watch_id());
            if ids.len() == 1 {
                // A stream that opened: the next failure starts its backoff afresh.
                backoff.succeed();
                if *broken {
                    tracing::info!(prefix = %watched_names(watched), "watch reconnected");
                    count_watch_reconnect();
                    *broken = false;
                }
            }
        }
        if res.canceled() {
            return canceled(inner, i, generation, &res, watched);
        }
        let Some(at) = ids.iter().position(|id| *id == res.watch_id()) else {
            continue;
        };
        if let Err(end) = deliver(inner, &res, &mut watched[at], tx).await {
            return end;
        }
    }
}

/// Sends `res`'s events not delivered yet for one prefix, and moves its revision on.
async fn deliver(
    inner: &Inner,
    res: &etcd_client::WatchResponse,
    (_, next): &mut (Key, Revision),
    tx: &mpsc::Sender<Result<WatchEvent>>,
) -> std::result::Result<(), WatchEnd> {
    let mut last = *next - 1;
    for ev in res.events() {
        let Some(kv) = ev.kv() else { continue };
        let rev = kv.mod_revision();
        if rev < *next {
            continue; // already delivered before a reconnection
        }
        let out = match ev.event_type() {
            EventType::Delete => decode(&inner.url, kv).map(|kv| WatchEvent::Delete {
                key: kv.key,
                revision: rev,
            }),
            EventType::Put => decode(&inner.url, kv).map(WatchEvent::Put),
        };
        if let Some(out) = out
            && tx.send(Ok(out)).await.is_err()
        {
            return Err(WatchEnd::ReceiverGone);
        }
        last = last.max(rev);
    }
    *next = last + 1;
    Ok(())
}

/// Why etcd canceled a watch of the stream, and what follows: a compaction re-lists;
/// anything else reconnects the whole stream.
fn canceled(
    inner: &Inner,
    i: usize,
    generation: u64,
    res: &etcd_client::WatchResponse,
    watched: &Watched,
) -> WatchEnd {
    if res.compact_revision() > 0 {
        return WatchEnd::Compacted;
    }
    let reason = res.cancel_reason();
    if reason.contains("invalid auth token") || reason.contains("user name is empty") {
        // An expired token cancels a watch after it opened: the next attempt
        // authenticates again.
        inner.members[i].token_refused(generation);
        return WatchEnd::Broken("the authentication token expired".into());
    }
    if reason.contains("permission denied") {
        let e = inner.denied_on(
            StoreError::Denied {
                url: inner.url.clone(),
                op: "watch",
                message: reason.to_string(),
            },
            || format!("watching {}", watched_names(watched)),
        );
        return WatchEnd::Broken(e.to_string());
    }
    if reason.contains("no leader") {
        // This member is cut off from the leader: watch through another.
        inner.endpoints.fail_over(i, reason);
    }
    WatchEnd::Broken(format!("watch canceled: {reason}"))
}
