#!/usr/bin/python3
"""t/e2e/test_idem_key.py - the Idempotency-Key header as the IETF draft has it.

Run by t/run-test with the e2e stack (PostgreSQL, idemflow-fcgi, nginx),
every request through nginx. It proves:

- the header is an RFC 8941 sf-string: "k" names the key k, and the bare
  form k (what idemflow accepted before) names the same key, so a retry in
  either form replays the other's answer, and the key stored is k;
- malformed quoting is 400 invalid-idempotency-key, with the exact problem
  body, and writes nothing;
- a key reused with a different request is 409 by default, and 422 once
  idempotency_mismatch_status = 422 is in the configuration (reloaded with
  SIGHUP), with the same problem type; neither writes anything;
- problem types are absolute, https://idemflow.example/problems/<slug> by
  default, under problem_base_uri once that is configured.
"""

import http.client
import json
import os
import signal
import subprocess
import sys
import time
import uuid

WFS = "/v1/workflows"
PSQL_ENV = dict(os.environ)


class Failure(Exception):
    pass


def fail(msg):
    raise Failure(msg)


def cli(*args):
    out = subprocess.run([os.environ["IDEMFLOW_CLI"], "--db", os.environ["DATABASE_URL"],
                          *args], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def psql(sql):
    r = subprocess.run(["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql],
                       capture_output=True, text=True, env=PSQL_ENV, check=False)
    if r.returncode != 0:
        fail(f"psql {sql!r}: {r.stderr.strip()}")
    return r.stdout.strip()


def post(token, key, body):
    """POST /v1/workflows through nginx with the Idempotency-Key value key
    (bytes, sent as they are). Returns (status, reason, headers, body)."""
    conn = http.client.HTTPConnection(os.environ.get("IDEMFLOW_HOST", "127.0.0.1"),
                                      int(os.environ["IDEMFLOW_PORT"]), timeout=30)
    try:
        data = json.dumps(body).encode()
        conn.putrequest("POST", WFS, skip_accept_encoding=True)
        conn.putheader("Authorization", f"Bearer {token}")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Idempotency-Key", key)
        conn.putheader("Content-Length", str(len(data)))
        conn.endheaders(data)
        r = conn.getresponse()
        return r.status, r.reason, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def expect(what, got, want):
    if got != want:
        fail(f"{what}: got {got!r}, expected {want!r}")


DEFAULT_BASE = "https://idemflow.example/problems/"
DOC_BASE = "https://docs.example.com/idemflow/api.html#"


def problem_bytes(slug, title, status, detail, request_id, key=None, base=DEFAULT_BASE):
    """The exact body problem.c writes (members in its order)."""
    body = (f'{{"type":"{base}{slug}","title":"{title}","status":{status},'
            f'"detail":{json.dumps(detail)},"instance":"{WFS}","request_id":"{request_id}"')
    if key is not None:
        body += f',"idempotency_key":{json.dumps(key)}'
    return (body + "}").encode()


class Tenant:
    def __init__(self, label):
        self.name = f"{label}-{uuid.uuid4().hex[:12]}"
        self.id = int(cli("tenant", "create", self.name))
        self.token = cli("token", "create", "--tenant", self.name)

    def counts(self):
        return psql(f"SELECT (SELECT count(*) FROM workflows WHERE tenant_id = {self.id}) "
                    f"|| ' ' || (SELECT count(*) FROM idempotency_keys "
                    f"WHERE tenant_id = {self.id}) "
                    f"|| ' ' || (SELECT count(*) FROM outbox WHERE tenant_id = {self.id})")


def quoted_and_bare_are_one_key():
    t = Tenant("sfstring")
    body = {"type": "order", "input": {"n": 1}}
    key = f"order-{uuid.uuid4()}"
    st, reason, h, first = post(t.token, f'"{key}"', body)
    expect("quoted create: status", (st, reason), (201, "Created"))
    if "idempotent-replayed" in h:
        fail("a first create is flagged as replayed")
    st, _, h, again = post(t.token, key, body)
    expect("bare retry: status", st, 201)
    expect("bare retry: Idempotent-Replayed", h.get("idempotent-replayed"), "true")
    expect("bare retry: body", again, first)
    st, _, h, again = post(t.token, f'"{key}"', body)
    expect("quoted retry: Idempotent-Replayed", (st, h.get("idempotent-replayed")),
           (201, "true"))
    expect("quoted retry: body", again, first)
    stored = psql(f"SELECT key FROM idempotency_keys WHERE tenant_id = {t.id}")
    expect("the stored key is the one inside the quotes", stored, key)
    expect("rows after one create and two retries", t.counts(), "1 1 1")

    # The two escapes: "a\"b\\c" is the key a"b\c, which the bare form
    # spells as it is.
    body = {"type": "escaped"}
    st, _, _, first = post(t.token, '"a\\"b\\\\c"', body)
    expect("escaped create: status", st, 201)
    st, _, h, again = post(t.token, 'a"b\\c', body)
    expect("escaped key, bare retry", (st, h.get("idempotent-replayed"), again),
           (201, "true", first))
    stored = psql(f"SELECT key FROM idempotency_keys WHERE tenant_id = {t.id} "
                  "AND key LIKE 'a%'")
    expect("the stored escaped key", stored, 'a"b\\c')
    # A bare value that ends in a quote is a bare key, quote and all.
    st, _, h, _ = post(t.token, 'a"b\\c"', body)
    expect("a bare key is not unquoted", (st, h.get("idempotent-replayed")), (201, None))
    print("ok - \"k\" and k name one key; a retry in either form replays")


MALFORMED = [
    (b'"unterminated', "an unterminated string"),
    (b'"k\\"', "the closing quote escaped"),
    (b'"a\\nb"', "an escape RFC 8941 does not have"),
    (b'"trailing\\', "a backslash at the end"),
    (b'"caf\xc3\xa9"', "a byte outside printable ASCII"),
    (b'"a\tb"', "a control character"),
    (b'"k";v=1', "a parameter"),
    (b'"k";v', "a parameter without a value"),
    (b'"k"x', "garbage after the closing quote"),
    (b'"k", "l"', "a list, not an item"),
    (b'""', "an empty key"),
    (b'"a b"', "a space inside the key (a valid sf-string, not a valid key)"),
    (b'"' + b"k" * 256 + b'"', "256 characters inside the quotes"),
]

INVALID_DETAIL = ("an Idempotency-Key is an RFC 8941 string, \"key\" (\\\" and \\\\ the only "
                  "escapes, nothing after the closing quote), or the bare key; the key is 1 "
                  "to 255 printable ASCII characters, without spaces")


def malformed_quoting_is_refused():
    t = Tenant("malformed")
    for key, why in MALFORMED:
        st, reason, h, body = post(t.token, key, {"type": "never"})
        what = f"{why} ({key[:40]!r})"
        expect(f"{what}: status", (st, reason), (400, "Bad Request"))
        expect(f"{what}: Content-Type", h.get("content-type"), "application/problem+json")
        expect(f"{what}: body", body,
               problem_bytes("invalid-idempotency-key", "Invalid Idempotency-Key", 400,
                             INVALID_DETAIL, h.get("x-request-id")))
    expect("rows after every malformed key", t.counts(), "0 0 0")
    print(f"ok - {len(MALFORMED)} malformed values: 400 invalid-idempotency-key, nothing written")


def reused(t, status, reason, base=DEFAULT_BASE):
    key = f"reuse-{uuid.uuid4()}"
    st, _, _, _ = post(t.token, f'"{key}"', {"type": "first"})
    expect("reuse: the first create", st, 201)
    before = t.counts()
    st, got_reason, h, body = post(t.token, key, {"type": "second"})
    expect("reuse: status", (st, got_reason), (status, reason))
    detail = (f"Idempotency-Key \"{key}\" was already used for a different request; use a "
              "new key for a new request")
    expect("reuse: body", body,
           problem_bytes("idempotency-key-reused", "Idempotency-Key Reused", status, detail,
                         h.get("x-request-id"), key, base))
    expect("reuse: rows", t.counts(), before)


def workers(supervisor):
    with open(f"/proc/{supervisor}/task/{supervisor}/children", encoding="ascii") as f:
        return set(f.read().split())


def reload_with(line):
    """Append line to the stack's configuration, SIGHUP the supervisor and
    wait until none of the workers that read the old one is left."""
    with open(os.environ["IDEMFLOW_CONF"], "a", encoding="utf-8") as f:
        f.write(line + "\n")
    with open(os.environ["IDEMFLOW_FCGI_PIDFILE"], encoding="ascii") as f:
        sup = int(f.read().strip())
    old = workers(sup)
    os.kill(sup, signal.SIGHUP)
    deadline = time.monotonic() + 20
    while True:
        now = workers(sup)
        if now and not now & old:
            return
        if time.monotonic() > deadline:
            fail(f"the old workers {sorted(now & old)} still run 20 s after SIGHUP")
        time.sleep(0.05)


def mismatch_status_is_configured():
    t = Tenant("mismatch")
    reused(t, 409, "Conflict")
    print("ok - a key reused with a different request: 409 by default")
    reload_with("idempotency_mismatch_status = 422\nproblem_base_uri = " + DOC_BASE)
    reused(t, 422, "Unprocessable Content", DOC_BASE)
    print("ok - idempotency_mismatch_status = 422: 422, the same problem type")
    print(f"ok - problem_base_uri = {DOC_BASE}: types under that base")


def main():
    tests = [quoted_and_bare_are_one_key, malformed_quoting_is_refused,
             mismatch_status_is_configured]
    for test in tests:
        try:
            test()
        except Failure as e:
            print(f"not ok - {test.__name__}: {e}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
