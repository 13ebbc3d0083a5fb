//! The Consul test server's HTTP side: requests read off the wire, routed and
//! mapped onto `state` (JSON in, JSON out, the `X-Consul-Index` header), blocking
//! queries, ACL tokens, datacenters and the test controls.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::state::{Entry, InvalidSession, MAX_TXN_OPS, NewSession, State, TxnOp};
use super::{Access, AclToken, Shared};

pub(super) struct Request {
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

async fn read_request<R: tokio::io::AsyncRead + Unpin>(
    r: &mut BufReader<R>,
) -> std::io::Result<Option<Request>> {
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
    /// ACLs left entries out of the answer (`X-Consul-Results-Filtered-By-ACLs`).
    filtered: bool,
}

fn resp(status: u16, body: impl Into<Vec<u8>>, index: Option<u64>) -> Response {
    Response {
        status,
        body: body.into(),
        index,
        filtered: false,
    }
}

fn permission_denied() -> Response {
    resp(403, "Permission denied", None)
}

/// Whose request it is, under ACLs.
enum Who<'a> {
    /// ACLs are off, or a management token.
    All,
    /// A token with rules.
    Token(&'a AclToken),
    /// No token: the anonymous token, which may do nothing.
    Anonymous,
}

impl Who<'_> {
    fn may(&self, key: &str, want: Access) -> bool {
        match self {
            Who::All => true,
            Who::Token(t) => t.access(key) >= want,
            Who::Anonymous => false,
        }
    }

    /// Sessions: any known token.
    fn may_use_sessions(&self) -> bool {
        !matches!(self, Who::Anonymous)
    }
}

/// The request's token (`X-Consul-Token`, `Authorization: Bearer`, `?token=`), as
/// Consul resolves it: an unknown one is 403 `ACL not found`.
fn who<'a>(shared: &'a Shared, req: &Request) -> Result<Who<'a>, Response> {
    let opts = &shared.opts;
    if opts.token.is_none() && opts.tokens.is_empty() {
        return Ok(Who::All);
    }
    let bearer = req
        .headers
        .get("authorization")
        .and_then(|a| a.strip_prefix("Bearer "))
        .map(|t| t.trim().to_string());
    let given = req
        .headers
        .get("x-consul-token")
        .cloned()
        .or(bearer)
        .or_else(|| req.query.get("token").cloned())
        .filter(|t| !t.is_empty());
    let Some(t) = given else {
        return Ok(Who::Anonymous);
    };
    if opts.token.as_ref() == Some(&t) {
        return Ok(Who::All);
    }
    opts.tokens
        .iter()
        .find(|x| x.secret == t)
        .map(Who::Token)
        .ok_or_else(|| resp(403, "ACL not found", None))
}

pub(super) async fn serve_connection<S>(stream: S, shared: Arc<Shared>) -> std::io::Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
{
    let (rd, mut wr) = tokio::io::split(stream);
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
        if r.filtered {
            head.push_str("X-Consul-Results-Filtered-By-ACLs: true\r\n");
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
    use std::sync::atomic::Ordering;
    if !req.path.starts_with("/__test/") {
        let hold = shared.hold_ms.load(Ordering::SeqCst);
        if hold > 0 {
            tokio::time::sleep(Duration::from_millis(hold)).await;
        }
        if shared
            .throttle
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return resp(429, "rate limit exceeded, try again later", None);
        }
    }
    if req.path == "/v1/status/leader" {
        return resp(200, "\"127.0.0.1:8300\"", None);
    }
    let who = match who(shared, &req) {
        Ok(w) => w,
        Err(refused) => return refused,
    };
    let dc = shared.opts.datacenter.clone().unwrap_or_else(|| "dc1".into());
    if let Some(asked) = req.query.get("dc")
        && *asked != dc
    {
        return resp(500, "No path to datacenter", None);
    }
    let path = req.path.clone();
    if let Some(key) = path.strip_prefix("/v1/kv/") {
        return kv(shared, &req, key, &who).await;
    }
    if path == "/v1/txn" && req.method == "PUT" {
        return txn(shared, &req, &who);
    }
    if let Some(rest) = path.strip_prefix("/v1/session/") {
        if !who.may_use_sessions() {
            return permission_denied();
        }
        return session(shared, &req, rest);
    }
    if let Some(rest) = path.strip_prefix("/__test/") {
        let mut st = shared.state();
        if let Some(n) = rest.strip_prefix("index/").and_then(|n| n.parse::<u64>().ok()) {
            st.reset_index(n);
        } else if let Some(id) = rest.strip_prefix("expire/") {
            st.expire(Instant::now(), Some(id));
        } else if rest == "reap" {
            st.reap_tombstones();
        } else if let Some(how) = rest.strip_prefix("node/") {
            st.set_node_failed(how == "fail", Instant::now());
        } else if let Some(ms) = rest.strip_prefix("hold/").and_then(|n| n.parse::<u64>().ok()) {
            shared.hold_ms.store(ms, Ordering::SeqCst);
        } else if let Some(n) = rest.strip_prefix("throttle/").and_then(|n| n.parse::<u64>().ok()) {
            shared.throttle.store(n, Ordering::SeqCst);
        }
        drop(st);
        shared.changed.notify_waiters();
        return resp(200, "true", None);
    }
    resp(404, format!("no handler for {} {}", req.method, path), None)
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

async fn kv(shared: &Shared, req: &Request, key: &str, who: &Who<'_>) -> Response {
    // `?keys` lists the keys under the prefix, with or without `?recurse`.
    let recurse =
        req.query.contains_key("recurse") || (req.method == "GET" && req.query.contains_key("keys"));
    let writable = |st: &State| {
        who.may(key, Access::Write)
            && (!recurse || st.read(key, true).iter().all(|(k, _)| who.may(k, Access::Write)))
    };
    match req.method.as_str() {
        "GET" if !recurse && !who.may(key, Access::Read) => return permission_denied(),
        "PUT" | "DELETE" if !writable(&shared.state()) => return permission_denied(),
        _ => {}
    }
    let cas = req.query.get("cas").and_then(|c| c.parse::<u64>().ok());
    // Consul answers KV writes without `X-Consul-Index` (a write has no query meta).
    let answer = |ok: bool, _: &State| resp(200, if ok { "true" } else { "false" }, None);
    match req.method.as_str() {
        "GET" => read(shared, req, key, recurse, who).await,
        "PUT" if req.body.len() > MAX_BODY => too_large(req.body.len()),
        "PUT" => {
            let mut st = shared.state();
            let acquire = req.query.get("acquire").map(String::as_str);
            match st.put(key, req.body.clone(), cas, acquire) {
                Err(InvalidSession(sid)) => resp(500, format!("invalid session \"{sid}\""), None),
                Ok(false) => answer(false, &st),
                Ok(true) => {
                    let r = answer(true, &st);
                    drop(st);
                    shared.changed.notify_waiters();
                    r
                }
            }
        }
        "DELETE" => {
            let mut st = shared.state();
            let ok = st.delete(key, recurse, cas);
            let r = answer(ok, &st);
            drop(st);
            if ok {
                shared.changed.notify_waiters();
            }
            r
        }
        _ => resp(405, "method not allowed", None),
    }
}

/// A read, blocking while `?index=` is what the query would return and `wait` lasts.
async fn read(shared: &Shared, req: &Request, key: &str, recurse: bool, who: &Who<'_>) -> Response {
    let wait = parse_wait(req.query.get("wait")).min(shared.opts.max_wait.unwrap_or(Duration::MAX));
    let min_index = req
        .query
        .get("index")
        .and_then(|i| i.parse::<u64>().ok())
        .unwrap_or(0);
    let deadline = tokio::time::Instant::now() + wait;
    let restores = shared.state().restores;
    loop {
        let notified = shared.changed.notified();
        {
            let st = shared.state();
            let idx = st.query_index(key, recurse);
            // Consul answers once the index passes `min_index`, at a restore, or
            // when the wait runs out: an index that went down (tombstones reaped)
            // is seen only then.
            if min_index == 0
                || idx > min_index
                || st.restores != restores
                || tokio::time::Instant::now() >= deadline
            {
                let all = st.read(key, recurse);
                let entries: Vec<Value> = all
                    .iter()
                    .filter(|(k, _)| who.may(k, Access::Read))
                    .map(|(k, e)| entry_json(k, e))
                    .collect();
                let filtered = entries.len() < all.len();
                if entries.is_empty() {
                    return Response {
                        filtered,
                        ..resp(404, "", Some(idx))
                    };
                }
                let body = if req.query.contains_key("keys") {
                    json!(entries.iter().map(|e| e["Key"].clone()).collect::<Vec<_>>())
                } else {
                    json!(entries)
                };
                return Response {
                    filtered,
                    ..resp(200, body.to_string(), Some(idx))
                };
            }
        }
        let _ = tokio::time::timeout_at(deadline, notified).await;
    }
}

/// Consul's limit on a KV value (`kv_max_value_size`) and on a transaction's body
/// (`txn_max_req_len`): 512 KiB each.
const MAX_BODY: usize = 512 * 1024;

fn too_large(n: usize) -> Response {
    resp(
        413,
        format!("Request body({n} bytes) too large, max size: {MAX_BODY} bytes"),
        None,
    )
}

fn txn(shared: &Shared, req: &Request, who: &Who<'_>) -> Response {
    if req.body.len() > MAX_BODY {
        return too_large(req.body.len());
    }
    let ops: Vec<Value> = match serde_json::from_slice(&req.body) {
        Ok(Value::Array(a)) => a,
        _ => return resp(400, "Failed to parse body: expected a list of operations", None),
    };
    if ops.len() > MAX_TXN_OPS {
        let why = format!(
            "Transaction contains too many operations ({} > {MAX_TXN_OPS})",
            ops.len()
        );
        return resp(413, why, None);
    }
    let ops: Vec<TxnOp> = ops
        .iter()
        .map(|op| {
            let kv = &op["KV"];
            TxnOp {
                verb: kv["Verb"].as_str().unwrap_or("").to_string(),
                key: kv["Key"].as_str().unwrap_or("").to_string(),
                value: kv["Value"]
                    .as_str()
                    .map(|v| B64.decode(v).unwrap_or_default())
                    .unwrap_or_default(),
                index: kv["Index"].as_u64().unwrap_or(0),
                session: kv["Session"].as_str().unwrap_or("").to_string(),
            }
        })
        .collect();
    let mut st = shared.state();
    // Every operation's rights are checked before anything runs, as Consul's
    // `kvsPreApply` does: `check-index` (and `check-session`) need read, a `get` is
    // filtered on the way out instead, and everything else (`check-not-exists`
    // included) needs write. Each one refused is an error of its own, and nothing
    // is written.
    let denied: Vec<Value> = ops
        .iter()
        .enumerate()
        .filter(|(_, op)| {
            let want = match op.verb.as_str() {
                "get" => return false,
                "check-index" | "check-session" => Access::Read,
                _ => Access::Write,
            };
            let tree_ok =
                op.verb != "delete-tree" || st.read(&op.key, true).iter().all(|(k, _)| who.may(k, want));
            !(who.may(&op.key, want) && tree_ok)
        })
        .map(|(i, _)| json!({"OpIndex": i, "What": "Permission denied"}))
        .collect();
    if !denied.is_empty() {
        let body = json!({"Results": null, "Errors": denied});
        return resp(409, body.to_string(), None);
    }
    match st.txn(&ops) {
        Err((i, what)) => {
            let body = json!({"Results": null, "Errors": [{"OpIndex": i, "What": what}]});
            resp(409, body.to_string(), None)
        }
        Ok(results) => {
            let results: Vec<Value> = results
                .iter()
                .filter(|r| who.may(&r.key, Access::Read))
                .map(|r| {
                    let mut kv = entry_json(&r.key, &r.entry);
                    if !r.value {
                        kv["Value"] = Value::Null;
                    }
                    json!({"KV": kv})
                })
                .collect();
            // A transaction that writes has no query meta: no `X-Consul-Index`
            // (a read-only one answers with the index it read at).
            let read_only = ops
                .iter()
                .all(|op| op.verb == "get" || op.verb.starts_with("check-"));
            let index = read_only.then_some(st.index);
            drop(st);
            shared.changed.notify_waiters();
            resp(
                200,
                json!({"Results": results, "Errors": null}).to_string(),
                index,
            )
        }
    }
}

fn session(shared: &Shared, req: &Request, rest: &str) -> Response {
    let mut st = shared.state();
    if rest == "create" && req.method == "PUT" {
        // Consul decodes the body's field names without regard to case (`ttl`,
        // `TTL`), as Go's JSON decoder does.
        let body: Value = serde_json::from_slice(&req.body).unwrap_or(json!({}));
        let field = |name: &str| {
            body.as_object()
                .and_then(|o| o.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)))
                .map(|(_, v)| v.clone())
                .unwrap_or(Value::Null)
        };
        let ttl = match field("TTL").as_str().map(jio_common::duration::parse) {
            Some(Ok(d)) if d >= Duration::from_secs(10) && d <= Duration::from_secs(86_400) => d,
            Some(_) => return resp(500, "Invalid Session TTL: must be between 10s and 24h0m0s", None),
            None => Duration::from_secs(86_400),
        };
        let delete = field("Behavior").as_str() == Some("delete");
        // Without `NodeChecks` (or the older `Checks`), the node's `serfHealth`.
        let checks = match (field("NodeChecks"), field("Checks")) {
            (Value::Array(c), _) | (Value::Null, Value::Array(c)) => c,
            _ => vec![json!("serfHealth")],
        };
        let lock_delay = match &field("LockDelay") {
            Value::String(d) => jio_common::duration::parse(d).unwrap_or(Duration::from_secs(15)),
            // A number is nanoseconds.
            Value::Number(n) => Duration::from_nanos(n.as_u64().unwrap_or(0)),
            _ => Duration::from_secs(15),
        };
        let new = NewSession {
            ttl,
            delete,
            node_check: checks.iter().any(|c| c == "serfHealth"),
            lock_delay,
        };
        return match st.create_session(&new, Instant::now()) {
            Ok(id) => resp(200, json!({ "ID": id }).to_string(), None),
            Err(why) => resp(500, why, None),
        };
    }
    if let Some(id) = rest.strip_prefix("renew/") {
        return match st.renew(id, Instant::now()) {
            // The whole session, as Consul answers a renewal.
            Some((ttl, delete)) => {
                let session = json!([{
                    "ID": id,
                    "Name": "",
                    "Node": "test-server",
                    "LockDelay": 0,
                    "Behavior": if delete { "delete" } else { "release" },
                    "TTL": format!("{}s", ttl.as_secs()),
                    "NodeChecks": [],
                    "ServiceChecks": null,
                }]);
                resp(200, session.to_string(), None)
            }
            None => resp(404, format!("Session id '{id}' not found"), None),
        };
    }
    if let Some(id) = rest.strip_prefix("destroy/") {
        st.expire(Instant::now(), Some(id));
        drop(st);
        shared.changed.notify_waiters();
        return resp(200, "true", None);
    }
    resp(404, "unknown session endpoint", None)
}
