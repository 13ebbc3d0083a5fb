//! A Consul HTTP API test server: no Consul server can be installed on these
//! machines, so the contract tests run against this faithful implementation of the
//! documented API (https://developer.hashicorp.com/consul/api-docs): KV, txn,
//! sessions, blocking queries, ACL tokens and datacenters.
//!
//! What it implements, as documented:
//! - `GET /v1/kv/<key>[?recurse][&keys]` → JSON entries (`CreateIndex`,
//!   `ModifyIndex`, `LockIndex`, `Key`, `Flags`, base64 `Value`, `Session`), 404 when
//!   nothing matches; `X-Consul-Index` on every read.
//! - `PUT /v1/kv/<key>[?cas=N][&acquire=S][&release=S]` → `true`/`false`;
//!   `cas=0` means "only if absent". `DELETE /v1/kv/<key>[?recurse][&cas=N]`.
//! - `PUT /v1/txn`: up to 64 operations (`set`, `cas`, `get`, `delete`, `delete-tree`,
//!   `delete-cas`, `check-index`, `check-not-exists`, `lock`), all or nothing: 200
//!   with `Results`, 409 with `Errors` when an operation fails, 413 above 64.
//!   `Results` as Consul 1.8+ gives them (`state/txn.go`): a `get` its entry with the
//!   value; `set`, `cas`, `lock` and `check-index` the entry without the value; the
//!   deletes and `check-not-exists` nothing.
//! - A write of a key's current value (and, for `lock`, by the session that holds
//!   it) is skipped, as Consul ≥ 1.6 does: `ModifyIndex` stays, no blocking query
//!   wakes, a transaction's result shows the old index (≥ 1.8; 1.6 and 1.7 showed
//!   the new one), and a transaction that changed nothing leaves the index as it was.
//! - Writes (KV `PUT`/`DELETE`, a transaction that writes, session create, renew
//!   and destroy) answer without `X-Consul-Index`: they carry no query meta. A
//!   read-only transaction answers with it.
//! - Sessions: `PUT /v1/session/create` (`TTL` from 10s to 86400s, `Behavior`
//!   `release` or `delete`), `/v1/session/renew/<id>` (404 when unknown),
//!   `/v1/session/destroy/<id>`. A session not renewed is invalidated after up to
//!   twice its TTL (here: exactly twice); its locks are released or its keys deleted.
//! - Blocking queries: `?index=N&wait=D` answers when the index of what the query
//!   reads exceeds N (the greatest ModifyIndex under the prefix, or a deletion there),
//!   when `wait` (default 5m, at most 10m) passes, or at a snapshot restore.
//! - ACLs (`ConsulOptions::token`, `tokens`): the token from `X-Consul-Token`,
//!   `Authorization: Bearer` or `?token=`. A management token may do anything; a
//!   token with `key_prefix` rules (`AclToken`) is checked per key, as Consul does:
//!   a read or write of a key it may not is 403 `Permission denied`; a `?recurse`
//!   read (blocking or not) is filtered to what it may read, with
//!   `X-Consul-Results-Filtered-By-ACLs: true` when something was left out
//!   (Consul ≥ 1.13); an operation of a transaction it may not do fails the whole
//!   transaction with 409 and `Errors` (`Permission denied`, one per operation). No
//!   token: the anonymous token, which may do nothing. An unknown token: 403
//!   `ACL not found`. `GET /v1/status/leader` needs no token.
//! - `?dc=` other than the server's datacenter: 500 `No path to datacenter`.
//!
//! Differences, on purpose or out of scope: one node and no Raft (every read is
//! consistent); the index is one counter for all writes; `wait` has no jitter; ACL
//! rules cover keys only (any known token may use sessions); no `flags` on txn ops.
//! HTTPS (`ConsulOptions::tls`): the server's certificate, and optionally a CA that
//! every client certificate must chain to (Consul's `verify_incoming`); a refused
//! handshake drops the connection.
//! - Sessions bound to the node's `serfHealth` check unless created with
//!   `NodeChecks: []` (or the older `Checks: []`): the node failing invalidates them,
//!   and creating one while it is failed is 500 `Check 'serfHealth' is in critical
//!   state`. `LockDelay` (default 15s): the keys of an ended session cannot be
//!   locked by another for that long (`acquire` answers `false`, a transaction's
//!   `lock` fails).
//!
//! Test controls (not Consul API): `PUT /__test/index/<n>` moves the index backwards,
//! as a restore from a snapshot does; `PUT /__test/expire/<session>` invalidates a
//! session at once; `PUT /__test/reap` reaps the tombstones, as Consul's tombstone GC
//! does about 15 minutes after a delete (a prefix's index may then go down, seen by
//! a blocking query when its wait runs out, or when the index passes the one it
//! asked for); `PUT /__test/node/fail` (`/pass`) turns the node's `serfHealth`
//! check critical (passing); `PUT /__test/hold/<ms>` holds every answer that long,
//! as a server electing a leader does (up to 7 s, `rpc_hold_timeout`);
//! `PUT /__test/throttle/<n>` refuses the next n requests with 429, as Consul's
//! rate limit does.

mod http;
mod state;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use self::state::State;

/// Settings of the test server.
#[derive(Clone, Debug, Default)]
pub struct ConsulOptions {
    /// When set (or when `tokens` is not empty), ACLs are on: this token has every
    /// right (a management token), a request without a token is the anonymous
    /// token's (no right, as with `default_policy = "deny"`), and an unknown token
    /// is refused with 403 `ACL not found`.
    pub token: Option<String>,
    /// Further tokens, each with its `key_prefix` rules.
    pub tokens: Vec<AclToken>,
    /// Blocking queries wait at most this long, whatever `wait` asks (a test of what
    /// follows a wait running out need not last 30 s).
    pub max_wait: Option<Duration>,
    /// The datacenter name (default `dc1`).
    pub datacenter: Option<String>,
    /// HTTPS, as Consul's `https` port with `verify_incoming` when `client_ca` is set.
    pub tls: Option<ConsulTls>,
}

/// An ACL token and its rules on keys: the rule of the longest matching
/// `key_prefix` decides, as in Consul's ACL policies; no matching rule denies.
/// Sessions may be created and renewed with any known token.
#[derive(Clone, Debug)]
pub struct AclToken {
    pub secret: String,
    /// `(key_prefix, access)`, the prefix without the leading `/`.
    pub rules: Vec<(String, Access)>,
}

/// What a `key_prefix` rule allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    Deny,
    Read,
    Write,
}

impl AclToken {
    /// A token with docs/tls-and-users.md's `jio-agent` policy: read everything, write only
    /// what an agent writes (`packaging/etcd-roles.sh`'s split, for Consul).
    pub fn jio_agent(secret: &str) -> AclToken {
        let mut rules = vec![(String::new(), Access::Read)];
        for p in [
            "status/",
            "running/",
            "hosts/",
            "agents/",
            "active_roles/",
            "runs/",
            "results/",
            "command_runs/",
        ] {
            rules.push((p.to_string(), Access::Write));
        }
        AclToken {
            secret: secret.to_string(),
            rules,
        }
    }

    /// The access this token has to `key` (without the leading `/`).
    pub fn access(&self, key: &str) -> Access {
        self.rules
            .iter()
            .filter(|(prefix, _)| key.starts_with(prefix.as_str()))
            .max_by_key(|(prefix, _)| prefix.len())
            .map_or(Access::Deny, |(_, a)| *a)
    }
}

/// The server's certificate, and the CA its clients' certificates must chain to.
#[derive(Clone, Debug)]
pub struct ConsulTls {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    /// Verify clients against this CA (`verify_incoming`); `None`: no client certificate.
    pub client_ca: Option<std::path::PathBuf>,
}

fn acceptor(tls: &ConsulTls) -> tokio_rustls::TlsAcceptor {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(tokio_rustls::rustls::crypto::aws_lc_rs::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&tls.cert)
        .expect("server certificate")
        .collect::<Result<_, _>>()
        .expect("server certificate PEM");
    let key = PrivateKeyDer::from_pem_file(&tls.key).expect("server key");
    let builder = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("protocol versions");
    let builder = match &tls.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = tokio_rustls::rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca).expect("client CA") {
                roots.add(c.expect("client CA PEM")).expect("client CA");
            }
            let verifier = tokio_rustls::rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(certs, key)
        .expect("server TLS configuration");
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

/// What the connections share: the state, a wake-up for blocking queries, the options.
struct Shared {
    state: Mutex<State>,
    changed: Notify,
    opts: ConsulOptions,
    /// Test control: every answer is held this long (a leader election).
    hold_ms: std::sync::atomic::AtomicU64,
    /// Test control: this many next requests are refused with 429.
    throttle: std::sync::atomic::AtomicU64,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic under the lock leaves a consistent state (changes are applied whole).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A running test server, stopped on drop.
pub struct ConsulServer {
    addr: std::net::SocketAddr,
    shared: Arc<Shared>,
    accept: Option<tokio::task::JoinHandle<()>>,
    reaper: tokio::task::JoinHandle<()>,
    connections: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    connections: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
) -> tokio::task::JoinHandle<()> {
    let tls = shared.opts.tls.as_ref().map(acceptor);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let s = shared.clone();
            let tls = tls.clone();
            let h = tokio::spawn(async move {
                match tls {
                    // A refused handshake (no or a bad client certificate) drops
                    // the connection, as Consul does.
                    Some(a) => {
                        if let Ok(stream) = a.accept(stream).await {
                            let _ = http::serve_connection(stream, s).await;
                        }
                    }
                    None => {
                        let _ = http::serve_connection(stream, s).await;
                    }
                }
            });
            connections.lock().expect("connections").push(h.abort_handle());
        }
    })
}

impl ConsulServer {
    pub async fn start(opts: ConsulOptions) -> ConsulServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the Consul test server");
        let addr = listener.local_addr().expect("address");
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new()),
            changed: Notify::new(),
            opts,
            hold_ms: Default::default(),
            throttle: Default::default(),
        });
        let connections = Arc::new(Mutex::new(Vec::new()));
        let accept = accept_loop(listener, shared.clone(), connections.clone());
        let s = shared.clone();
        let reaper = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let expired = s.state().expire(Instant::now(), None);
                if expired {
                    s.changed.notify_waiters();
                }
            }
        });
        ConsulServer {
            addr,
            shared,
            accept: Some(accept),
            reaper,
            connections,
        }
    }

    /// Stops answering: the listener closes and every open connection drops.
    pub fn stop(&mut self) {
        if let Some(a) = self.accept.take() {
            a.abort();
        }
        for c in self.connections.lock().expect("connections").drain(..) {
            c.abort();
        }
    }

    /// Starts answering again on the same port, with the same data (a server restart).
    pub async fn restart(&mut self) {
        self.stop();
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        self.accept = Some(accept_loop(
            listener,
            self.shared.clone(),
            self.connections.clone(),
        ));
    }

    /// `url()` with `secret` as its ACL token, from a file written (mode 0600) in
    /// `dir` under `name`.
    pub fn url_with_token(&self, dir: &std::path::Path, name: &str, secret: &str) -> String {
        use std::os::unix::fs::PermissionsExt as _;
        let f = dir.join(name);
        std::fs::write(&f, secret).expect("token file");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).expect("token file mode");
        format!("{}?token_file={}", self.url(), f.display())
    }

    /// `consul://127.0.0.1:PORT` (`consuls://` with TLS).
    pub fn url(&self) -> String {
        let scheme = if self.shared.opts.tls.is_some() {
            "consuls"
        } else {
            "consul"
        };
        format!("{scheme}://{}", self.addr)
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// The current index.
    pub fn index(&self) -> u64 {
        self.shared.state().index
    }
}

impl Drop for ConsulServer {
    fn drop(&mut self) {
        self.stop();
        self.reaper.abort();
    }
}

/// Moves the server's index backwards (a snapshot restore), through its test control.
pub async fn reset_index(server: &ConsulServer, to: u64) {
    let mut s = TcpStream::connect(server.addr()).await.expect("connect");
    let req = format!(
        "PUT /__test/index/{to} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
}

/// Invalidates a session at once, through the server's test control.
pub async fn expire_session(server: &ConsulServer, id: &str) {
    let mut s = TcpStream::connect(server.addr()).await.expect("connect");
    let req = format!(
        "PUT /__test/expire/{id} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
}

/// Sends one test control (`PUT /__test/<what>`) to the server.
pub async fn control(server: &ConsulServer, what: &str) {
    let mut s = TcpStream::connect(server.addr()).await.expect("connect");
    let req =
        format!("PUT /__test/{what} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
}
