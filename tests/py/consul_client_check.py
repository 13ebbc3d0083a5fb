#!/usr/bin/env python3
"""Checks the Consul API test server (tests/src/consul) with py-consul 1.8.0.

Usage: consul_client_check.py HOST:PORT [--token TOKEN] [--keep-going]

Each check drives the server with the real py-consul client and asserts what a
real Consul (1.8 or later) answers, per its documentation
(https://developer.hashicorp.com/consul/api-docs) and source (hashicorp/consul:
agent/kvs_endpoint.go, agent/txn_endpoint.go, agent/session_endpoint.go,
agent/consul/kvs_endpoint.go, agent/consul/txn_endpoint.go,
agent/consul/state/kvs.go, agent/consul/state/txn.go). One line is printed per
check; the first failed check ends the run with exit status 1 (all of them run
with --keep-going, for a full list).

With --token the server is expected to require that ACL token: the ACL checks
run first, then every other check with a client that sends it.
"""

import argparse
import base64
import json
import os
import sys
import threading
import time
import traceback
import uuid

import consul

# py-consul reads these before its arguments: a developer's shell must not change
# what is checked.
for _var in ("CONSUL_HTTP_ADDR", "CONSUL_HTTP_TOKEN", "CONSUL_HTTP_SSL", "CONSUL_HTTP_SSL_VERIFY"):
    os.environ.pop(_var, None)


class CheckFailed(Exception):
    pass


def expect(cond, msg):
    if not cond:
        raise CheckFailed(msg)


def expect_eq(got, want, what):
    if got != want:
        raise CheckFailed(f"{what}: got {got!r}, want {want!r}")


def raises(exc_type, fn, what):
    """Runs fn, which must raise exc_type; returns the exception."""
    try:
        got = fn()
    except exc_type as e:
        return e
    except Exception as e:  # noqa: BLE001 - the wrong kind of failure is a failed check
        raise CheckFailed(f"{what}: raised {type(e).__name__}: {e}, want {exc_type.__name__}") from e
    raise CheckFailed(f"{what}: returned {got!r}, want {exc_type.__name__} raised")


def http_error(exc, status, what):
    """py-consul raises ClientError('<status> <body>') for a 4xx it has no class for:
    checks the status and returns the body."""
    text = str(exc)
    # The classes py-consul has for some statuses drop the status from the message.
    named = {consul.ACLPermissionDenied: "403", consul.NotFound: "404", consul.ACLDisabled: "401"}
    code, body = named.get(type(exc)), text
    if code is None:
        code, _, body = text.partition(" ")
    expect_eq(code, str(status), f"{what}: HTTP status (py-consul said {text!r})")
    return body


def b64(s):
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


class Recorder:
    """The HTTP responses a py-consul client received (a requests response hook)."""

    def __init__(self, client):
        self.responses = []
        client.http.session.hooks["response"].append(self._hook)

    def _hook(self, response, *args, **kwargs):
        self.responses.append(response)

    def last(self):
        return self.responses[-1]

    def clear(self):
        self.responses.clear()


CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


class Ctx:
    def __init__(self, host, port, token):
        self.host = host
        self.port = port
        self.token = token

    def client(self):
        """A client as the project's code would use it (sends the token, if any)."""
        c = consul.Consul(host=self.host, port=self.port, token=self.token)
        if self.token:
            # py-consul 1.8.0's Txn.put sends no X-Consul-Token (it takes no token and
            # ignores the client's): put it on every request of this client.
            c.http.session.headers["X-Consul-Token"] = self.token
        return c


def entry(c, key):
    _, e = c.kv.get(key)
    expect(e is not None, f"{key} should exist")
    return e


# --- KV ----------------------------------------------------------------------


@check
def kv_round_trip(ctx, c, p):
    """kv.put / kv.get: value bytes, CreateIndex, ModifyIndex, LockIndex, Flags, and
    the index kv.get returns (X-Consul-Index) is the key's ModifyIndex
    (agent/consul/kvs_endpoint.go KVS.Get: reply.Index = ent.ModifyIndex)."""
    k = p + "key"
    value = b"hello \x00\xff world"
    expect_eq(c.kv.put(k, value), True, "kv.put")
    idx, e = c.kv.get(k)
    expect(e is not None, "kv.get after kv.put returned None")
    expect_eq(e["Key"], k, "Key")
    expect_eq(e["Value"], value, "Value")
    expect_eq(e["Flags"], 0, "Flags")
    expect_eq(e["LockIndex"], 0, "LockIndex")
    expect(isinstance(e["CreateIndex"], int) and e["CreateIndex"] > 0, f"CreateIndex {e['CreateIndex']!r}")
    expect_eq(e["ModifyIndex"], e["CreateIndex"], "ModifyIndex of a new key")
    expect_eq(int(idx), e["ModifyIndex"], "kv.get index (X-Consul-Index)")
    expect_eq(c.kv.put(k, "second"), True, "kv.put of a new value")
    idx2, e2 = c.kv.get(k)
    expect_eq(e2["Value"], b"second", "Value after the second put")
    expect_eq(e2["CreateIndex"], e["CreateIndex"], "CreateIndex after an update")
    expect(e2["ModifyIndex"] > e["ModifyIndex"], f"ModifyIndex should grow: {e['ModifyIndex']} -> {e2['ModifyIndex']}")
    expect_eq(int(idx2), e2["ModifyIndex"], "kv.get index after the update")
    return f"CreateIndex {e['CreateIndex']}, ModifyIndex {e['ModifyIndex']} -> {e2['ModifyIndex']}"


@check
def kv_recurse_and_keys(ctx, c, p):
    """kv.get(recurse=True) lists the entries under the prefix in key order, with the
    highest ModifyIndex under it as index; kv.get(keys=True) lists their keys."""
    tree = p + "tree/"
    for k, v in (("b", "2"), ("a", "1"), ("c/d", "3")):
        expect_eq(c.kv.put(tree + k, v), True, f"kv.put {tree + k}")
    c.kv.put(p + "treeless", "outside")  # shares the prefix without the slash
    idx, entries = c.kv.get(tree, recurse=True)
    expect(isinstance(entries, list), f"kv.get(recurse=True) returned {entries!r}")
    expect_eq([e["Key"] for e in entries], [tree + "a", tree + "b", tree + "c/d"], "keys under the prefix")
    expect_eq([e["Value"] for e in entries], [b"1", b"2", b"3"], "values under the prefix")
    expect_eq(int(idx), max(e["ModifyIndex"] for e in entries), "kv.get(recurse=True) index")
    kidx, keys = c.kv.get(tree, keys=True)
    expect_eq(keys, [tree + "a", tree + "b", tree + "c/d"], "kv.get(keys=True)")
    expect_eq(int(kidx), int(idx), "kv.get(keys=True) index")
    _, none = c.kv.get(p + "nothing/", recurse=True)
    expect_eq(none, None, "kv.get(recurse=True) of an empty prefix")
    _, none = c.kv.get(p + "nothing/", keys=True)
    expect_eq(none, None, "kv.get(keys=True) of an empty prefix")
    return f"{len(entries)} entries at index {idx}"


@check
def kv_missing_key(ctx, c, p):
    """A missing key: (index, None), the index being a real one (not 0)."""
    expect_eq(c.kv.put(p + "there", "x"), True, "kv.put")
    written = entry(c, p + "there")["ModifyIndex"]
    idx, e = c.kv.get(p + "not-there")
    expect_eq(e, None, "kv.get of a missing key")
    expect(idx is not None and int(idx) >= written, f"index of a missing key {idx!r}, want >= {written}")
    return f"index {idx}"


@check
def kv_delete(ctx, c, p):
    """kv.delete of a key, of an absent key, and of a tree (recurse)."""
    k = p + "key"
    c.kv.put(k, "x")
    expect_eq(c.kv.delete(k), True, "kv.delete")
    expect_eq(c.kv.get(k)[1], None, "kv.get after kv.delete")
    expect_eq(c.kv.delete(k), True, "kv.delete of an absent key")
    for i in range(3):
        c.kv.put(f"{p}tree/{i}", "x")
    c.kv.put(p + "keep", "x")
    expect_eq(c.kv.delete(p + "tree/", recurse=True), True, "kv.delete(recurse=True)")
    expect_eq(c.kv.get(p + "tree/", recurse=True)[1], None, "the tree after kv.delete(recurse=True)")
    expect(c.kv.get(p + "keep")[1] is not None, "kv.delete(recurse=True) deleted outside its prefix")
    return "ok"


@check
def kv_cas(ctx, c, p):
    """kv.put(cas=0) only creates; cas=N writes only at ModifyIndex N; kv.delete(cas=N)
    likewise, and a CAS delete of an absent key answers true
    (agent/consul/state/kvs.go kvsDeleteCASTxn: `return entry == nil`)."""
    k = p + "key"
    expect_eq(c.kv.put(k, "1", cas=0), True, "kv.put(cas=0) of an absent key")
    expect_eq(c.kv.put(k, "2", cas=0), False, "kv.put(cas=0) of a present key")
    e = entry(c, k)
    expect_eq(e["Value"], b"1", "value after a refused cas=0")
    m = e["ModifyIndex"]
    expect_eq(c.kv.put(k, "2", cas=m + 1000), False, "kv.put with a stale cas")
    expect_eq(entry(c, k)["ModifyIndex"], m, "ModifyIndex after a refused CAS")
    expect_eq(c.kv.put(k, "2", cas=m), True, "kv.put with the current cas")
    e2 = entry(c, k)
    expect_eq(e2["Value"], b"2", "value after a CAS write")
    expect(e2["ModifyIndex"] > m, "ModifyIndex should grow after a CAS write")
    expect_eq(c.kv.delete(k, cas=m), False, "kv.delete with a stale cas")
    expect(c.kv.get(k)[1] is not None, "a refused CAS delete deleted the key")
    expect_eq(c.kv.delete(k, cas=e2["ModifyIndex"]), True, "kv.delete with the current cas")
    expect_eq(c.kv.get(k)[1], None, "kv.get after a CAS delete")
    expect_eq(c.kv.delete(p + "never", cas=12345), True, "kv.delete(cas=N) of an absent key")
    return "ok"


@check
def kv_same_value_write_is_skipped(ctx, c, p):
    """Consul >= 1.6 skips a write that changes nothing: ModifyIndex stays
    (agent/consul/state/kvs.go kvsSetTxn: `existing.Equal(entry)` -> no write)."""
    k = p + "key"
    c.kv.put(k, "a")
    m1 = entry(c, k)["ModifyIndex"]
    expect_eq(c.kv.put(k, "a"), True, "kv.put of the same value")
    idx, e = c.kv.get(k)
    expect_eq(e["ModifyIndex"], m1, "ModifyIndex after writing the same value")
    expect_eq(int(idx), m1, "kv.get index after writing the same value")
    expect_eq(c.kv.put(k, "b"), True, "kv.put of another value")
    m3 = entry(c, k)["ModifyIndex"]
    expect(m3 > m1, f"ModifyIndex should grow on a new value: {m1} -> {m3}")
    return f"{m1} -> {m1} -> {m3}"


@check
def writes_carry_no_index_header(ctx, c, p):
    """Writes answer without X-Consul-Index: only reads (setMeta) set it
    (agent/kvs_endpoint.go KVSPut/KVSDelete, agent/txn_endpoint.go Txn,
    agent/session_endpoint.go SessionCreate/SessionRenew/SessionDestroy never call
    setMeta)."""
    rec = Recorder(c)
    wrote = []

    def no_index(what):
        r = rec.last()
        expect_eq(r.status_code, 200, f"{what}: status")
        expect(
            "X-Consul-Index" not in r.headers,
            f"{what}: answered with X-Consul-Index {r.headers.get('X-Consul-Index')!r}, a write has none",
        )
        wrote.append(what)

    c.kv.put(p + "key", "x")
    no_index("PUT /v1/kv")
    c.kv.delete(p + "key")
    no_index("DELETE /v1/kv")
    c.txn.put([{"KV": {"Verb": "set", "Key": p + "txn", "Value": b64("x")}}])
    no_index("PUT /v1/txn (a write)")
    sid = c.session.create(ttl=10)
    no_index("PUT /v1/session/create")
    c.session.renew(sid)
    no_index("PUT /v1/session/renew")
    c.session.destroy(sid)
    no_index("PUT /v1/session/destroy")
    c.kv.get(p + "txn")
    expect("X-Consul-Index" in rec.last().headers, "GET /v1/kv answered without X-Consul-Index")
    return ", ".join(wrote)


# --- blocking queries ---------------------------------------------------------


@check
def blocking_query_waits(ctx, c, p):
    """kv.get(index=i, wait='1s') with nothing changed answers after the wait
    (plus up to wait/16 of jitter), with the same index."""
    k = p + "key"
    c.kv.put(k, "x")
    idx, _ = c.kv.get(k)
    t0 = time.monotonic()
    idx2, e = c.kv.get(k, index=idx, wait="1s")
    took = time.monotonic() - t0
    expect(took >= 0.99, f"answered after {took:.3f}s, before its 1s wait")
    expect(took < 3.0, f"answered after {took:.3f}s, long after its 1s wait")
    expect_eq(int(idx2), int(idx), "index after a wait with no change")
    expect_eq(e["Value"], b"x", "value after the wait")
    return f"{took:.2f}s"


def write_later(ctx, delay, key, value, errors):
    """Writes from another thread (and another client) after delay seconds."""

    def run():
        try:
            time.sleep(delay)
            ctx.client().kv.put(key, value)
        except Exception as e:  # noqa: BLE001 - reported by the check
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t


@check
def blocking_query_wakes_on_change(ctx, c, p):
    """kv.get(index=i, wait=...) answers early, with a higher index, when the key changes."""
    k = p + "key"
    c.kv.put(k, "before")
    idx, _ = c.kv.get(k)
    errors = []
    t = write_later(ctx, 0.5, k, "after", errors)
    t0 = time.monotonic()
    idx2, e = c.kv.get(k, index=idx, wait="10s")
    took = time.monotonic() - t0
    t.join()
    expect(not errors, f"the writing thread failed: {errors}")
    expect(took < 5.0, f"answered after {took:.3f}s: the write did not wake the query")
    expect(int(idx2) > int(idx), f"index did not grow: {idx} -> {idx2}")
    expect_eq(e["Value"], b"after", "value after the wake-up")
    expect_eq(int(idx2), e["ModifyIndex"], "index after the wake-up")
    return f"woke after {took:.2f}s, index {idx} -> {idx2}"


@check
def blocking_query_ignores_same_value_write(ctx, c, p):
    """A write of the same value changes nothing (kvsSetTxn skips it), so it does
    not wake a blocking query on the key."""
    k = p + "key"
    c.kv.put(k, "same")
    idx, _ = c.kv.get(k)
    errors = []
    t = write_later(ctx, 0.3, k, "same", errors)
    t0 = time.monotonic()
    idx2, _ = c.kv.get(k, index=idx, wait="2s")
    took = time.monotonic() - t0
    t.join()
    expect(not errors, f"the writing thread failed: {errors}")
    expect(took >= 1.99, f"answered after {took:.3f}s: the same-value write woke the query")
    expect_eq(int(idx2), int(idx), "index after a same-value write")
    return f"{took:.2f}s"


# --- transactions -------------------------------------------------------------


@check
def txn_results(ctx, c, p):
    """txn.put of set + get + check-index + delete: 200; a result for set without its
    Value, one for get with it, one for check-index; none for delete
    (agent/consul/state/txn.go txnKVS: only get keeps the value; delete returns
    no entry)."""
    new, there, gone = p + "new", p + "there", p + "gone"
    c.kv.put(there, "kept")
    c.kv.put(gone, "bye")
    m = entry(c, there)["ModifyIndex"]
    rec = Recorder(c)
    r = c.txn.put(
        [
            {"KV": {"Verb": "set", "Key": new, "Value": b64("fresh")}},
            {"KV": {"Verb": "get", "Key": there}},
            {"KV": {"Verb": "check-index", "Key": there, "Index": m}},
            {"KV": {"Verb": "delete", "Key": gone}},
        ]
    )
    expect_eq(rec.last().status_code, 200, "status")
    expect(isinstance(r, dict), f"txn.put returned {r!r}")
    expect(not r.get("Errors"), f"Errors: {r.get('Errors')!r}")
    results = r.get("Results") or []
    kvs = [x.get("KV") or {} for x in results]
    expect_eq(
        [x.get("Key") for x in kvs],
        [new, there, there],
        f"keys of Results (set, get, check-index; none for delete), Results={results!r}",
    )
    s, g, ci = kvs
    expect_eq(s.get("Value"), None, "Value of the set result")
    expect(s["ModifyIndex"] > m, f"ModifyIndex of the set result {s['ModifyIndex']}, want > {m}")
    expect_eq(s["CreateIndex"], s["ModifyIndex"], "CreateIndex of the set result")
    expect(g.get("Value") is not None, "the get result has no Value")
    expect_eq(base64.b64decode(g["Value"]), b"kept", "Value of the get result")
    expect_eq(g["ModifyIndex"], m, "ModifyIndex of the get result")
    expect_eq(ci.get("Value"), None, "Value of the check-index result")
    expect_eq(ci["ModifyIndex"], m, "ModifyIndex of the check-index result")
    e = entry(c, new)
    expect_eq(e["Value"], b"fresh", "value written by the set")
    expect_eq(e["ModifyIndex"], s["ModifyIndex"], "ModifyIndex of the written key")
    expect_eq(c.kv.get(gone)[1], None, "the deleted key")
    return f"{len(results)} results"


@check
def txn_conflict(ctx, c, p):
    """A failing check-index: 409 (py-consul raises ConsulException), Errors[0] names
    the operation (OpIndex) and why (What); nothing is written."""
    there, new = p + "there", p + "new"
    c.kv.put(there, "x")
    m = entry(c, there)["ModifyIndex"]
    ops = [
        {"KV": {"Verb": "set", "Key": new, "Value": b64("no")}},
        {"KV": {"Verb": "check-index", "Key": there, "Index": m + 1000}},
    ]
    exc = raises(consul.ConsulException, lambda: c.txn.put(ops), "txn.put with a failing check-index")
    body = http_error(exc, 409, "txn.put with a failing check-index")
    try:
        doc = json.loads(body)
    except ValueError as e:
        raise CheckFailed(f"409 body is not JSON: {body!r}") from e
    errors = doc.get("Errors") or []
    expect(len(errors) >= 1, f"no Errors in {doc!r}")
    expect_eq(errors[0].get("OpIndex"), 1, "Errors[0].OpIndex")
    what = errors[0].get("What")
    expect(isinstance(what, str) and what, f"Errors[0].What {what!r}")
    expect_eq(doc.get("Results"), None, "Results of a failed transaction")
    expect_eq(c.kv.get(new)[1], None, "key set by the failed transaction")
    expect_eq(entry(c, there)["ModifyIndex"], m, "ModifyIndex of the checked key")
    return f"What: {what}"


@check
def txn_operation_limit(ctx, c, p):
    """64 operations pass; 65 are refused with 413 (agent/txn_endpoint.go maxTxnOps)
    and nothing is written."""
    ops64 = [{"KV": {"Verb": "set", "Key": f"{p}ok/{i:02}", "Value": b64("x")}} for i in range(64)]
    r = c.txn.put(ops64)
    expect_eq(len(r.get("Results") or []), 64, "results of a 64-operation transaction")
    ops65 = [{"KV": {"Verb": "set", "Key": f"{p}big/{i:02}", "Value": b64("x")}} for i in range(65)]
    exc = raises(consul.ConsulException, lambda: c.txn.put(ops65), "txn.put of 65 operations")
    body = http_error(exc, 413, "txn.put of 65 operations")
    expect_eq(c.kv.get(p + "big/", recurse=True)[1], None, "keys written by the refused transaction")
    return body.strip()


# --- sessions -----------------------------------------------------------------


def new_session(c):
    sid = c.session.create(ttl=10, behavior="delete")
    try:
        uuid.UUID(sid)
    except (TypeError, ValueError) as e:
        raise CheckFailed(f"session.create returned {sid!r}, not a UUID") from e
    return sid


@check
def session_create_and_renew(ctx, c, p):
    """session.create(ttl=10, behavior='delete') -> a UUID; session.renew returns the
    session, with the TTL and Behavior py-consul sent (as lowercase JSON keys, which
    Consul decodes case-insensitively)."""
    sid = new_session(c)
    s = c.session.renew(sid)
    expect(isinstance(s, dict), f"session.renew returned {s!r}")
    expect_eq(s.get("ID"), sid, "ID of the renewed session")
    expect_eq(s.get("TTL"), "10s", "TTL of the renewed session")
    expect_eq(s.get("Behavior"), "delete", "Behavior of the renewed session")
    c.session.destroy(sid)
    return sid


@check
def session_lock(ctx, c, p):
    """kv.put(acquire=sid) -> True, the entry holds the session (LockIndex 1); another
    session cannot acquire it."""
    k = p + "lock"
    sid = new_session(c)
    other = new_session(c)
    expect_eq(c.kv.put(k, "me", acquire=sid), True, "kv.put(acquire=sid)")
    e = entry(c, k)
    expect_eq(e.get("Session"), sid, "Session of the locked key")
    expect_eq(e["LockIndex"], 1, "LockIndex of the locked key")
    expect_eq(c.kv.put(k, "you", acquire=other), False, "kv.put(acquire=other session)")
    expect_eq(entry(c, k)["Value"], b"me", "value after a refused acquire")
    c.session.destroy(other)
    c.session.destroy(sid)
    return "ok"


@check
def session_destroy_deletes_keys(ctx, c, p):
    """session.destroy of a behavior='delete' session deletes the keys it holds."""
    k = p + "lock"
    sid = new_session(c)
    expect_eq(c.kv.put(k, "me", acquire=sid), True, "kv.put(acquire=sid)")
    expect_eq(c.session.destroy(sid), True, "session.destroy")
    _, e = c.kv.get(k)
    expect_eq(e, None, "the key held by a destroyed behavior=delete session")
    return "ok"


@check
def session_renew_after_destroy(ctx, c, p):
    """Renewing a destroyed session: 404, which py-consul 1.8.0 raises as NotFound."""
    sid = new_session(c)
    c.session.destroy(sid)
    raises(consul.NotFound, lambda: c.session.renew(sid), "session.renew of a destroyed session")
    return "NotFound"


# --- ACL (only with --token) --------------------------------------------------


def acl_checks(ctx):
    def no_token(ctx, c, p):
        """No token: KV reads and writes are refused with 403 (ACLPermissionDenied)."""
        bare = consul.Consul(host=ctx.host, port=ctx.port)
        raises(consul.ACLPermissionDenied, lambda: bare.kv.get(p + "key"), "kv.get without a token")
        raises(consul.ACLPermissionDenied, lambda: bare.kv.put(p + "key", "x"), "kv.put without a token")
        expect_eq(c.kv.get(p + "key")[1], None, "key written without a token")
        return "403"

    def wrong_token(ctx, c, p):
        """An unknown token: 403 ("ACL not found")."""
        bad = consul.Consul(host=ctx.host, port=ctx.port, token="not-" + ctx.token)
        raises(consul.ACLPermissionDenied, lambda: bad.kv.get(p + "key"), "kv.get with a wrong token")
        raises(consul.ACLPermissionDenied, lambda: bad.kv.put(p + "key", "x"), "kv.put with a wrong token")
        return "403"

    def token_header(ctx, c, p):
        """Consul(token=...) works, and sends the token as the X-Consul-Token header
        (not in the URL)."""
        good = consul.Consul(host=ctx.host, port=ctx.port, token=ctx.token)
        rec = Recorder(good)
        expect_eq(good.kv.put(p + "key", "x"), True, "kv.put with the token")
        expect_eq(good.kv.get(p + "key")[1]["Value"], b"x", "kv.get with the token")
        for r in rec.responses:
            expect_eq(r.request.headers.get("X-Consul-Token"), ctx.token, f"X-Consul-Token of {r.request.url}")
            expect("token=" not in r.request.url, f"the token is in the URL {r.request.url}")
        return f"{len(rec.responses)} requests with the header"

    def txn_without_token(ctx, c, p):
        """A write transaction with no token (py-consul 1.8.0's txn.put never sends
        one): real Consul resolves the anonymous token, and its per-operation ACL
        check fails in Txn.preCheck, answered as a transaction error: 409 with
        Errors[0].What "Permission denied..." (agent/consul/txn_endpoint.go
        preCheck, agent/txn_endpoint.go Txn), not 403."""
        plain = consul.Consul(host=ctx.host, port=ctx.port, token=ctx.token)
        ops = [{"KV": {"Verb": "set", "Key": p + "key", "Value": b64("x")}}]
        exc = raises(consul.ConsulException, lambda: plain.txn.put(ops), "txn.put without a token")
        body = http_error(exc, 409, "txn.put without a token")
        doc = json.loads(body)
        what = ((doc.get("Errors") or [{}])[0]).get("What") or ""
        expect("Permission denied" in what, f"Errors[0].What {what!r}")
        expect_eq(c.kv.get(p + "key")[1], None, "key written without a token")
        return "409 Permission denied"

    return [no_token, wrong_token, token_header, txn_without_token]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("addr", help="HOST:PORT of the server")
    ap.add_argument("--token", help="the ACL token the server requires")
    ap.add_argument("--keep-going", action="store_true", help="run every check even after a failure")
    args = ap.parse_args()
    host, _, port = args.addr.rpartition(":")
    ctx = Ctx(host, int(port), args.token)
    print(f"py-consul {consul.__version__} against {args.addr}" + (" with an ACL token" if args.token else ""))

    checks = (acl_checks(ctx) if args.token else []) + CHECKS
    prefix = "acl-" if args.token else "anon-"
    failed = []
    for fn in checks:
        name = fn.__name__
        c = ctx.client()
        try:
            detail = fn(ctx, c, f"pyc/{prefix}{name}/")
        except CheckFailed as e:
            failed.append(name)
            print(f"FAIL {name}: {e}\n     (real Consul: {' '.join(fn.__doc__.split())})", flush=True)
        except Exception as e:  # noqa: BLE001 - anything else is a failed check too
            failed.append(name)
            print(f"FAIL {name}: unexpected {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
        else:
            print(f"ok   {name}: {detail}", flush=True)
            continue
        if not args.keep_going:
            break
    if failed:
        print(f"{len(failed)} failed: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)
    print(f"all {len(checks)} checks passed")


if __name__ == "__main__":
    main()
