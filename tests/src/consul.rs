//! A Consul HTTP API test server: no Consul server can be installed on these
//! machines, so the contract tests run against this faithful implementation of the
//! documented API (https://developer.hashicorp.com/consul/api-docs): KV, txn,
//! sessions, blocking queries, ACL tokens and datacenters.
//!
//! What it implements, as documented:
//! - `GET /v1/kv/<key>[?recurse][&keys]` → JSON entries (`CreateIndex`,
//!   `ModifyIndex`, `LockIndex`, `Key`, `Flags`, base64 `Value`, `Session`), 404 when
//!   nothing matches; `X-Consul-Index` on every answer.
//! - `PUT /v1/kv/<key>[?cas=N][&acquire=S][&release=S]` → `true`/`false`;
//!   `cas=0` means "only if absent". `DELETE /v1/kv/<key>[?recurse][&cas=N]`.
//! - `PUT /v1/txn`: up to 64 operations (`set`, `cas`, `get`, `delete`, `delete-tree`,
//!   `delete-cas`, `check-index`, `check-not-exists`, `lock`), all or nothing: 200
//!   with `Results`, 409 with `Errors` when an operation fails, 413 above 64.
//! - Sessions: `PUT /v1/session/create` (`TTL` from 10s to 86400s, `Behavior`
//!   `release` or `delete`), `/v1/session/renew/<id>` (404 when unknown),
//!   `/v1/session/destroy/<id>`. A session not renewed is invalidated after up to
//!   twice its TTL (here: exactly twice); its locks are released or its keys deleted.
//! - Blocking queries: `?index=N&wait=D` answers when the index of what the query
//!   reads exceeds N (the greatest ModifyIndex under the prefix, or a deletion there),
//!   or when `wait` (default 5m, at most 10m) passes.
//! - `X-Consul-Token` (or `?token=`): with an ACL token configured, anything else is
//!   403 `Permission denied`. `?dc=` other than the server's datacenter: 500
//!   `No path to datacenter`. `GET /v1/status/leader`.
//!
//! Differences, on purpose or out of scope: one node and no Raft (every read is
//! consistent); the index is one counter for all writes; `wait` has no jitter; ACL is
//! one token with full rights, not policies; no `flags` on txn ops.
//! Test controls (not Consul API): `PUT /__test/index/<n>` moves the index backwards,
//! as a restore from a snapshot does; `PUT /__test/expire/<session>` invalidates a
//! session at once, as a failed node check does.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

const MAX_TXN_OPS: usize = 64;

#[derive(Clone, Debug)]
struct Entry {
    value: Vec<u8>,
    create: u64,
    modify: u64,
    lock_index: u64,
    flags: u64,
    session: Option<String>,
}

#[derive(Clone, Debug)]
struct Session {
    ttl: Duration,
    deadline: Instant,
    delete: bool,
}

#[derive(Default)]
struct State {
    index: u64,
    kv: BTreeMap<String, Entry>,
    /// Deleted keys and the index of their deletion (for blocking queries).
    tombstones: BTreeMap<String, u64>,
    sessions: HashMap<String, Session>,
    next_session: u64,
}

impl State {
    fn bump(&mut self) -> u64 {
        self.index += 1;
        self.index
    }

    /// The index of what a query of `prefix` (or the exact key) reads.
    fn query_index(&self, key: &str, recurse: bool) -> u64 {
        let matches = |k: &str| if recurse { k.starts_with(key) } else { k == key };
        let live = self
            .kv
            .iter()
            .filter(|(k, _)| matches(k))
            .map(|(_, e)| e.modify)
            .max()
            .unwrap_or(0);
        let dead = self
            .tombstones
            .iter()
            .filter(|(k, _)| matches(k))
            .map(|(_, i)| *i)
            .max()
            .unwrap_or(0);
        // A query of nothing that ever existed still gets the store's index.
        let i = live.max(dead);
        if i == 0 { self.index.max(1) } else { i }
    }

    fn delete_key(&mut self, key: &str, at: u64) -> bool {
        if self.kv.remove(key).is_some() {
            self.tombstones.insert(key.to_string(), at);
            true
        } else {
            false
        }
    }

    fn set(&mut self, key: &str, value: Vec<u8>, at: u64) {
        match self.kv.get_mut(key) {
            Some(e) => {
                e.value = value;
                e.modify = at;
            }
            None => {
                self.tombstones.remove(key);
                self.kv.insert(
                    key.to_string(),
                    Entry {
                        value,
                        create: at,
                        modify: at,
                        lock_index: 0,
                        flags: 0,
                        session: None,
                    },
                );
            }
        }
    }

    /// Invalidates sessions whose deadline passed (or `only`), releasing or deleting their keys.
    fn expire(&mut self, now: Instant, only: Option<&str>) -> bool {
        let dead: Vec<(String, bool)> = self
            .sessions
            .iter()
            .filter(|(id, s)| only.map_or(s.deadline <= now, |o| o == id.as_str()))
            .map(|(id, s)| (id.clone(), s.delete))
            .collect();
        if dead.is_empty() {
            return false;
        }
        for (id, delete) in dead {
            self.sessions.remove(&id);
            let held: Vec<String> = self
                .kv
                .iter()
                .filter(|(_, e)| e.session.as_deref() == Some(id.as_str()))
                .map(|(k, _)| k.clone())
                .collect();
            for k in held {
                let at = self.bump();
                if delete {
                    self.delete_key(&k, at);
                } else if let Some(e) = self.kv.get_mut(&k) {
                    e.session = None;
                    e.modify = at;
                }
            }
        }
        true
    }

    fn entry_json(key: &str, e: &Entry) -> Value {
        let mut v = json!({
            "Key": key,
            "CreateIndex": e.create,
            "ModifyIndex": e.modify,
            "LockIndex": e.lock_index,
            "Flags": e.flags,
            "Value": if e.value.is_empty() { Value::Null } else { json!(B64.encode(&e.value)) },
        });
        if let Some(s) = &e.session {
            v["Session"] = json!(s);
        }
        v
    }
}

/// Settings of the test server.
#[derive(Clone, Debug, Default)]
pub struct ConsulOptions {
    /// When set, every request must carry this ACL token.
    pub token: Option<String>,
    /// The datacenter name (default `dc1`).
    pub datacenter: Option<String>,
}

struct Shared {
    state: Mutex<State>,
    changed: Notify,
    opts: ConsulOptions,
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
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let s = shared.clone();
            let h = tokio::spawn(async move {
                let _ = serve_connection(stream, s).await;
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
            state: Mutex::new(State {
                index: 1,
                ..State::default()
            }),
            changed: Notify::new(),
            opts,
        });
        let connections = Arc::new(Mutex::new(Vec::new()));
        let accept = accept_loop(listener, shared.clone(), connections.clone());
        let s = shared.clone();
        let reaper = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let expired = s.state.lock().expect("state").expire(Instant::now(), None);
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

    /// `consul://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("consul://{}", self.addr)
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// The current index.
    pub fn index(&self) -> u64 {
        self.shared.state.lock().expect("state").index
    }
}

impl Drop for ConsulServer {
    fn drop(&mut self) {
        self.stop();
        self.reaper.abort();
    }
}

struct Request {
    method: String,
    path: String,
    query: HashMap<String, String>,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

fn decode_pct(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(
                std::str::from_utf8(&b[i + 1..(i + 3).min(b.len())]).unwrap_or(""),
                16,
            )
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn read_request(r: &mut BufReader<tokio::net::tcp::OwnedReadHalf>) -> std::io::Result<Option<Request>> {
    let mut line = String::new();
    if r.read_line(&mut line).await? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("/").to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).await? == 0 {
            return Ok(None);
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let mut body = Vec::new();
    if let Some(n) = headers
        .get("content-length")
        .and_then(|v| v.parse::<usize>().ok())
    {
        body.resize(n, 0);
        r.read_exact(&mut body).await?;
    } else if headers
        .get("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).await?;
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            let mut chunk = vec![0u8; n + 2];
            r.read_exact(&mut chunk).await?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    }
    let (path, q) = target.split_once('?').unwrap_or((&target, ""));
    let query = q
        .split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode_pct(k), decode_pct(v))
        })
        .collect();
    Ok(Some(Request {
        method,
        path: decode_pct(path),
        query,
        headers,
        body,
    }))
}

struct Response {
    status: u16,
    body: Vec<u8>,
    index: Option<u64>,
}

fn resp(status: u16, body: impl Into<Vec<u8>>, index: Option<u64>) -> Response {
    Response {
        status,
        body: body.into(),
        index,
    }
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) -> std::io::Result<()> {
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    while let Some(req) = read_request(&mut rd).await? {
        let close = req
            .headers
            .get("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let r = handle(&shared, req).await;
        let reason = match r.status {
            200 => "OK",
            400 => "Bad Request",
            403 => "Forbidden",
            404 => "Not Found",
            409 => "Conflict",
            413 => "Payload Too Large",
            _ => "Error",
        };
        let mut head = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            r.status,
            r.body.len()
        );
        if let Some(i) = r.index {
            head.push_str(&format!("X-Consul-Index: {i}\r\nX-Consul-KnownLeader: true\r\n"));
        }
        head.push_str("\r\n");
        wr.write_all(head.as_bytes()).await?;
        wr.write_all(&r.body).await?;
        wr.flush().await?;
        if close {
            break;
        }
    }
    Ok(())
}

fn parse_wait(s: Option<&String>) -> Duration {
    let d = s
        .and_then(|w| jio_common::duration::parse(w).ok())
        .unwrap_or(Duration::from_secs(300));
    d.min(Duration::from_secs(600))
}

async fn handle(shared: &Shared, req: Request) -> Response {
    if let Some(t) = &shared.opts.token {
        let given = req.headers.get("x-consul-token").or(req.query.get("token"));
        if given != Some(t) {
            return resp(403, "Permission denied", None);
        }
    }
    let dc = shared.opts.datacenter.clone().unwrap_or_else(|| "dc1".into());
    if let Some(asked) = req.query.get("dc")
        && *asked != dc
    {
        return resp(500, "No path to datacenter", None);
    }
    let path = req.path.clone();
    if let Some(key) = path.strip_prefix("/v1/kv/") {
        return kv(shared, &req, key.to_string()).await;
    }
    if path == "/v1/txn" && req.method == "PUT" {
        return txn(shared, &req);
    }
    if path == "/v1/status/leader" {
        return resp(200, "\"127.0.0.1:8300\"", None);
    }
    if let Some(rest) = path.strip_prefix("/v1/session/") {
        return session(shared, &req, rest);
    }
    if let Some(rest) = path.strip_prefix("/__test/") {
        let mut st = shared.state.lock().expect("state");
        if let Some(n) = rest.strip_prefix("index/").and_then(|n| n.parse::<u64>().ok()) {
            st.index = n;
            for e in st.kv.values_mut() {
                e.modify = e.modify.min(n);
                e.create = e.create.min(n);
            }
            for i in st.tombstones.values_mut() {
                *i = (*i).min(n);
            }
        } else if let Some(id) = rest.strip_prefix("expire/") {
            st.expire(Instant::now(), Some(id));
        }
        drop(st);
        shared.changed.notify_waiters();
        return resp(200, "true", None);
    }
    resp(404, format!("no handler for {} {}", req.method, path), None)
}

async fn kv(shared: &Shared, req: &Request, key: String) -> Response {
    let recurse = req.query.contains_key("recurse");
    match req.method.as_str() {
        "GET" => {
            let wait = parse_wait(req.query.get("wait"));
            let min_index = req
                .query
                .get("index")
                .and_then(|i| i.parse::<u64>().ok())
                .unwrap_or(0);
            let deadline = tokio::time::Instant::now() + wait;
            loop {
                let notified = shared.changed.notified();
                {
                    let st = shared.state.lock().expect("state");
                    let idx = st.query_index(&key, recurse);
                    if min_index == 0
                        || idx > min_index
                        || idx < min_index
                        || tokio::time::Instant::now() >= deadline
                    {
                        let entries: Vec<Value> = st
                            .kv
                            .iter()
                            .filter(|(k, _)| if recurse { k.starts_with(&key) } else { **k == key })
                            .map(|(k, e)| State::entry_json(k, e))
                            .collect();
                        if entries.is_empty() {
                            return resp(404, "", Some(idx));
                        }
                        let body = if req.query.contains_key("keys") {
                            json!(entries.iter().map(|e| e["Key"].clone()).collect::<Vec<_>>())
                        } else {
                            json!(entries)
                        };
                        return resp(200, body.to_string(), Some(idx));
                    }
                }
                let _ = tokio::time::timeout_at(deadline, notified).await;
            }
        }
        "PUT" => {
            let mut st = shared.state.lock().expect("state");
            if let Some(cas) = req.query.get("cas").and_then(|c| c.parse::<u64>().ok()) {
                let cur = st.kv.get(&key).map(|e| e.modify).unwrap_or(0);
                if cur != cas {
                    return resp(200, "false", Some(st.index));
                }
            }
            if let Some(sid) = req.query.get("acquire") {
                if !st.sessions.contains_key(sid) {
                    return resp(500, format!("invalid session \"{sid}\""), None);
                }
                if let Some(e) = st.kv.get(&key)
                    && e.session.as_ref().is_some_and(|s| s != sid)
                {
                    return resp(200, "false", Some(st.index));
                }
                let at = st.bump();
                st.set(&key, req.body.clone(), at);
                if let Some(e) = st.kv.get_mut(&key)
                    && e.session.as_deref() != Some(sid.as_str())
                {
                    e.session = Some(sid.clone());
                    e.lock_index += 1;
                }
            } else {
                let at = st.bump();
                st.set(&key, req.body.clone(), at);
            }
            let i = st.index;
            drop(st);
            shared.changed.notify_waiters();
            resp(200, "true", Some(i))
        }
        "DELETE" => {
            let mut st = shared.state.lock().expect("state");
            if let Some(cas) = req.query.get("cas").and_then(|c| c.parse::<u64>().ok()) {
                let cur = st.kv.get(&key).map(|e| e.modify).unwrap_or(0);
                if cur != cas {
                    return resp(200, "false", Some(st.index));
                }
            }
            let keys: Vec<String> = st
                .kv
                .keys()
                .filter(|k| if recurse { k.starts_with(&key) } else { **k == key })
                .cloned()
                .collect();
            if !keys.is_empty() {
                let at = st.bump();
                for k in keys {
                    st.delete_key(&k, at);
                }
            }
            let i = st.index;
            drop(st);
            shared.changed.notify_waiters();
            resp(200, "true", Some(i))
        }
        _ => resp(405, "method not allowed", None),
    }
}

fn txn(shared: &Shared, req: &Request) -> Response {
    let ops: Vec<Value> = match serde_json::from_slice(&req.body) {
        Ok(Value::Array(a)) => a,
        _ => return resp(400, "Failed to parse body: expected a list of operations", None),
    };
    if ops.len() > MAX_TXN_OPS {
        return resp(
            413,
            format!(
                "Transaction contains too many operations ({} > {MAX_TXN_OPS})",
                ops.len()
            ),
            None,
        );
    }
    let mut st = shared.state.lock().expect("state");
    // Work on a copy; commit only if every operation succeeds.
    let mut work = State {
        index: st.index,
        kv: st.kv.clone(),
        tombstones: st.tombstones.clone(),
        sessions: st.sessions.clone(),
        next_session: st.next_session,
    };
    let at = work.index + 1;
    let mut results = Vec::new();
    let mut wrote = false;
    for (i, op) in ops.iter().enumerate() {
        let kvop = &op["KV"];
        let verb = kvop["Verb"].as_str().unwrap_or("");
        let key = kvop["Key"].as_str().unwrap_or("").to_string();
        let value = kvop["Value"]
            .as_str()
            .map(|v| B64.decode(v).unwrap_or_default())
            .unwrap_or_default();
        let index = kvop["Index"].as_u64().unwrap_or(0);
        let fail = |what: String| {
            resp(
                409,
                json!({"Results": null, "Errors": [{"OpIndex": i, "What": what}]}).to_string(),
                None,
            )
        };
        let cur = work.kv.get(&key).cloned();
        match verb {
            "set" => {
                work.set(&key, value, at);
                wrote = true;
            }
            "cas" => {
                if cur.as_ref().map(|e| e.modify).unwrap_or(0) != index {
                    return fail(format!("failed to set key \"{key}\", index is stale"));
                }
                work.set(&key, value, at);
                wrote = true;
            }
            "lock" => {
                let sid = kvop["Session"].as_str().unwrap_or("");
                if !work.sessions.contains_key(sid) {
                    return fail(format!("invalid session \"{sid}\""));
                }
                if cur
                    .as_ref()
                    .and_then(|e| e.session.as_deref())
                    .is_some_and(|s| s != sid)
                {
                    return fail(format!("failed to lock key \"{key}\", lock is already held"));
                }
                work.set(&key, value, at);
                if let Some(e) = work.kv.get_mut(&key)
                    && e.session.as_deref() != Some(sid)
                {
                    e.session = Some(sid.to_string());
                    e.lock_index += 1;
                }
                wrote = true;
            }
            "get" => match cur {
                Some(e) => results.push(json!({"KV": State::entry_json(&key, &e)})),
                None => return fail(format!("key \"{key}\" doesn't exist")),
            },
            "check-index" => {
                if cur.as_ref().map(|e| e.modify) != Some(index) {
                    return fail(format!(
                        "current modify index {} != {index}",
                        cur.map(|e| e.modify).unwrap_or(0)
                    ));
                }
            }
            "check-not-exists" => {
                if cur.is_some() {
                    return fail(format!("key \"{key}\" exists"));
                }
            }
            "delete" => {
                wrote |= work.delete_key(&key, at);
            }
            "delete-cas" => {
                if cur.as_ref().map(|e| e.modify) != Some(index) {
                    return fail(format!("failed to delete key \"{key}\", index is stale"));
                }
                wrote |= work.delete_key(&key, at);
            }
            "delete-tree" => {
                let keys: Vec<String> = work.kv.keys().filter(|k| k.starts_with(&key)).cloned().collect();
                for k in keys {
                    wrote |= work.delete_key(&k, at);
                }
            }
            other => return fail(format!("unknown KV verb \"{other}\"")),
        }
        if matches!(verb, "set" | "cas" | "lock")
            && let Some(e) = work.kv.get(&key)
        {
            results.push(json!({"KV": State::entry_json(&key, e)}));
        }
    }
    if wrote {
        work.index = at;
    }
    *st = work;
    let i = st.index;
    drop(st);
    shared.changed.notify_waiters();
    resp(
        200,
        json!({"Results": results, "Errors": null}).to_string(),
        Some(i),
    )
}

fn session(shared: &Shared, req: &Request, rest: &str) -> Response {
    let mut st = shared.state.lock().expect("state");
    if rest == "create" && req.method == "PUT" {
        let body: Value = serde_json::from_slice(&req.body).unwrap_or(json!({}));
        let ttl = body["TTL"].as_str().map(jio_common::duration::parse);
        let ttl = match ttl {
            Some(Ok(d)) if d >= Duration::from_secs(10) && d <= Duration::from_secs(86_400) => d,
            Some(_) => return resp(500, "Invalid Session TTL: must be between 10s and 24h0m0s", None),
            None => Duration::from_secs(86_400),
        };
        let delete = body["Behavior"].as_str() == Some("delete");
        st.next_session += 1;
        let id = format!(
            "{:08x}-0000-4000-8000-{:012x}",
            std::process::id(),
            st.next_session
        );
        st.sessions.insert(
            id.clone(),
            Session {
                ttl,
                // Invalidated after up to twice the TTL: here exactly twice.
                deadline: Instant::now() + ttl * 2,
                delete,
            },
        );
        let i = st.bump();
        return resp(200, json!({ "ID": id }).to_string(), Some(i));
    }
    if let Some(id) = rest.strip_prefix("renew/") {
        return match st.sessions.get_mut(id) {
            Some(s) => {
                s.deadline = Instant::now() + s.ttl * 2;
                let ttl = format!("{}s", s.ttl.as_secs());
                resp(200, json!([{"ID": id, "TTL": ttl}]).to_string(), Some(st.index))
            }
            None => resp(404, format!("Session id '{id}' not found"), Some(st.index)),
        };
    }
    if let Some(id) = rest.strip_prefix("destroy/") {
        st.expire(Instant::now(), Some(id));
        let i = st.index;
        drop(st);
        shared.changed.notify_waiters();
        return resp(200, "true", Some(i));
    }
    resp(404, "unknown session endpoint", None)
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
