#!/usr/bin/python3
"""t/e2e/test_contract.py - every live answer is one doc/openapi.yaml describes.

Run by t/run-test, which gives it the e2e stack (PostgreSQL, idemflow-fcgi,
nginx; IDEMFLOW_URL, IDEMFLOW_CLI, DATABASE_URL, PG*, ...). It makes a tenant
and a token with the CLI, then sends through nginx a request for every route
and every error the document lists, and checks each answer against the
document: its status is one the operation lists, every header the document
marks required is there, every header it sends (but the transport's own)
is documented and matches its schema, and the body has the documented media
type and matches its JSON Schema (Draft 2020-12, Debian's python3-jsonschema).
Events read back from the history are checked against the webhooks' payload
schemas, and every event type is met.

It fails on an answer the document does not describe, on a documented
(route, method, status) pair or problem type no request reached (unless it
is listed in UNREACHED with the reason), and on an UNREACHED entry that was
reached after all. It prints what it covered.

Near its end it makes the database read-only (the app's 503s), then stops
idemflow-fcgi (nginx's 503 on every route): run-test's teardown copes with
both.
"""

import http.client
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid

import jsonschema
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
SRCDIR = os.environ.get("top_srcdir") or os.path.join(HERE, "..", "..")
DOC_PATH = os.path.join(SRCDIR, "doc", "openapi.yaml")
API_MD = os.path.join(SRCDIR, "doc", "api.md")
# The default problem_base_uri (app/core/conf.c): the test stack's types.
PROBLEMS = "https://idemflow.example/problems/"

# Headers of the transport, not of the API: never documented per answer.
TRANSPORT = {"date", "server", "content-type", "content-length", "connection",
             "keep-alive", "transfer-encoding"}

# RFC 9110's reason phrases (section 15) for every status idemflow-fcgi
# answers: nginx passes the worker's "Status: NNN Reason" on as the status
# line. nginx's own answers carry nginx's phrases, older names for some.
REASONS = {200: "OK", 201: "Created", 202: "Accepted", 204: "No Content",
           400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
           404: "Not Found", 405: "Method Not Allowed", 409: "Conflict",
           413: "Content Too Large", 414: "URI Too Long",
           415: "Unsupported Media Type", 422: "Unprocessable Content",
           429: "Too Many Requests", 500: "Internal Server Error",
           503: "Service Unavailable"}
NGINX_REASONS = {413: "Request Entity Too Large", 414: "Request-URI Too Large",
                 503: "Service Temporarily Unavailable"}

# Documented but not reached here, each with the reason; the test fails if
# one of them is reached (then it belongs in the coverage) or if anything
# else documented is not.
UNREACHED_REASON_500 = "internal: a bug or exhausted memory, which no request can cause"
UNREACHED_PROBLEMS = {
    "internal": UNREACHED_REASON_500,
    "outcome-unknown": "needs the connection lost during a commit: t/e2e/test_faults "
                       "makes it with a test-hooks build",
    "bad-body": "nginx reads the whole body before idemflow-fcgi sees it, so a "
                "body shorter than its Content-Length never reaches the app",
    "too-many-requests": "nginx's per-token limit_req is off in the test stack "
                         "(t/e2e/test_security turns it on in a copy of the site)",
}


class ContractError(Exception):
    pass


def fail(msg):
    raise ContractError(msg)


class Contract:
    """The document, its schemas, and what the live answers covered."""

    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            self.doc = yaml.safe_load(f)
        self.resolver = jsonschema.RefResolver(base_uri="", referrer=self.doc)
        self.covered = set()        # (path, METHOD, status)
        self.problems = set()       # slugs seen
        self.events = set()         # event types seen in the history
        self.delivered = set()      # event types delivered as webhooks
        self.components_seen = set()
        self.answers = 0
        self.requests = 0           # request bodies checked

    def ref(self, obj):
        while isinstance(obj, dict) and "$ref" in obj and len(obj) == 1:
            ptr = obj["$ref"]
            if not ptr.startswith("#/"):
                fail(f"non-local $ref {ptr}")
            obj = self.doc
            for part in ptr[2:].split("/"):
                obj = obj[part.replace("~1", "/").replace("~0", "~")]
        return obj

    def validate(self, value, schema, what):
        v = jsonschema.Draft202012Validator(schema, resolver=self.resolver)
        errors = sorted(v.iter_errors(value), key=lambda e: list(e.absolute_path))
        if errors:
            detail = "; ".join(
                f"at /{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}"
                for e in errors[:5])
            fail(f"{what}: {detail}")

    def check_response(self, resp_doc, what, status, headers, body):
        """Check one answer against one response object of the document."""
        resp_doc = self.ref(resp_doc)
        documented = {k.lower(): self.ref(v) for k, v in resp_doc.get("headers", {}).items()}
        for name, h in documented.items():
            if h.get("required") and name not in headers:
                fail(f"{what}: {status} lacks the required header {name}")
        for name, value in headers.items():
            if name in TRANSPORT:
                continue
            if name not in documented:
                fail(f"{what}: {status} sends header {name}: {value}, which the "
                     "document does not describe for this answer")
            self.validate(value, documented[name]["schema"], f"{what}: header {name}")
        content = resp_doc.get("content")
        ctype = headers.get("content-type")
        if not content:
            if body:
                fail(f"{what}: {status} has a body the document does not describe: {body[:200]!r}")
            return None
        if ctype is None:
            fail(f"{what}: {status} has no Content-Type")
        base = ctype.split(";")[0].strip().lower()
        if base not in content:
            fail(f"{what}: {status} is {ctype}, the document has {sorted(content)}")
        if base in ("application/json", "application/problem+json"):
            if ctype != base:
                fail(f"{what}: Content-Type {ctype!r}, expected {base!r} exactly")
            try:
                value = json.loads(body)
            except ValueError as e:
                fail(f"{what}: {status} body is not JSON ({e}): {body[:200]!r}")
        else:
            value = body.decode("utf-8")
        self.validate(value, content[base]["schema"], f"{what}: {status} body")
        if base == "application/problem+json":
            self.problems.add(value["type"].rsplit("/", 1)[-1])
        return value

    def check(self, path, method, status, headers, body):
        """An answer to METHOD on the documented PATH template."""
        item = self.doc["paths"].get(path)
        if item is None:
            fail(f"{method} {path}: not a path of the document")
        what = f"{method} {path}"
        op = item.get(method.lower())
        if op is None:
            # Not a method the path serves: 405 with Allow (after the 403
            # of /metrics), or nginx's 503 when no worker answers.
            if status == 405:
                if headers.get("allow") != item["x-allow"]:
                    fail(f"{what}: Allow {headers.get('allow')!r}, the document says "
                         f"{item['x-allow']!r}")
                resp_doc = self.doc["components"]["responses"]["MethodNotAllowed"]
            elif status == 403 and "403" in item.get("get", {}).get("responses", {}):
                resp_doc = item["get"]["responses"]["403"]
            elif status == 503:
                resp_doc = self.doc["components"]["responses"]["UnavailableNginx"]
            else:
                fail(f"{what}: {status} is not an answer the document allows to a "
                     "method the path does not serve")
            method = "*"
        else:
            responses = op["responses"]
            resp_doc = responses.get(str(status)) or responses.get(f"{status // 100}XX")
            if resp_doc is None:
                fail(f"{what}: status {status} is not documented (documented: "
                     f"{', '.join(sorted(responses))})")
        value = self.check_response(resp_doc, what, status, headers, body)
        self.covered.add((path, method, status))
        self.answers += 1
        return value

    def check_request(self, path, method, target, headers, body, status, answer):
        """The request against the operation's parameters and body: one the
        server accepted (2xx) must be one the document accepts, and a body
        the server refused as breaking the rules (422 invalid-workflow or
        invalid-request) one the document refuses."""
        item = self.doc["paths"][path]
        op = item.get(method.lower())
        if op is None:
            return
        what = f"request {method} {target}"
        slug = answer.get("type", "").rsplit("/", 1)[-1] if isinstance(answer, dict) else ""
        if 200 <= status < 300:
            params = [self.ref(p) for p in item.get("parameters", []) + op.get("parameters", [])]
            query = dict(q.split("=", 1) for q in target.partition("?")[2].split("&") if q)
            sent = {n.lower(): v for n, v in headers}
            for prm in params:
                if prm["in"] == "query" and prm["name"] in query:
                    v = query[prm["name"]]
                    if self.ref(prm["schema"]).get("type") == "integer":
                        v = int(v)
                    self.validate(v, prm["schema"], f"{what}: query {prm['name']}")
                elif prm["in"] == "header":
                    v = sent.get(prm["name"].lower())
                    if v is None and prm.get("required"):
                        fail(f"{what}: answered {status} without the required {prm['name']}")
                    if v is not None:
                        self.validate(v, prm["schema"], f"{what}: header {prm['name']}")
            for q in query:
                if not any(p["in"] == "query" and p["name"] == q for p in params):
                    fail(f"{what}: answered {status} to the undocumented query parameter {q}")
        if body is None or "requestBody" not in op:
            return
        try:
            doc_body = json.loads(body)
        except ValueError:
            return
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        v = jsonschema.Draft202012Validator(schema, resolver=self.resolver)
        if 200 <= status < 300:
            self.validate(doc_body, schema, f"{what}: body the server accepted")
            self.requests += 1
        elif status == 422 and slug in ("invalid-workflow", "invalid-request") \
                and v.is_valid(doc_body):
            fail(f"{what}: the server refused the body ({slug}) but the document "
                 f"accepts it: {body[:200]!r}")
        elif status == 422 and slug in ("invalid-workflow", "invalid-request"):
            self.requests += 1

    def check_component(self, name, what, status, headers, body):
        """An answer that no route owns (an unknown path, nginx's own)."""
        resp_doc = self.doc["components"]["responses"][name]
        value = self.check_response(resp_doc, what, status, headers, body)
        self.components_seen.add(name)
        self.answers += 1
        return value

    def documented_pairs(self):
        pairs = set()
        for path, item in self.doc["paths"].items():
            for method in ("get", "put", "post", "delete", "patch"):
                if method in item:
                    for status in item[method]["responses"]:
                        pairs.add((path, method.upper(), int(status)))
            pairs.add((path, "*", 405))
            # /metrics refuses a stranger before it looks at the method.
            if "403" in item.get("get", {}).get("responses", {}):
                pairs.add((path, "*", 403))
        return pairs


class Api:
    """HTTP through nginx, each answer checked by the contract."""

    def __init__(self, contract, host, port):
        self.c = contract
        self.host = host
        self.port = port

    def raw(self, method, target, headers=(), body=None, port=None):
        conn = http.client.HTTPConnection(self.host, port or self.port, timeout=30)
        try:
            conn.putrequest(method, target, skip_host=False, skip_accept_encoding=True)
            for name, value in headers:
                conn.putheader(name, value)
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            r = conn.getresponse()
            data = r.read()
            if r.reason not in (REASONS.get(r.status), NGINX_REASONS.get(r.status)):
                fail(f"{method} {target}: status line {r.status} {r.reason!r}, RFC 9110 "
                     f"says {REASONS.get(r.status)!r}")
            hdrs = {}
            for name, value in r.getheaders():
                name = name.lower()
                if name in hdrs:
                    fail(f"{method} {target}: header {name} sent twice")
                hdrs[name] = value
            return r.status, hdrs, data
        finally:
            conn.close()

    def call(self, route, method, target, expect, problem=None, token=None, key=None,
             body=None, ctype="application/json", headers=(), port=None):
        """Send, check against the contract, and check the test's own
        expectation (status and problem slug). Returns (status, headers,
        parsed body)."""
        hdrs = list(headers)
        if token is not None:
            hdrs.append(("Authorization", f"Bearer {token}"))
        if key is not None:
            hdrs.append(("Idempotency-Key", key))
        if body is not None:
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
            elif isinstance(body, str):
                body = body.encode()
            if ctype is not None:
                hdrs.append(("Content-Type", ctype))
        status, rh, data = self.raw(method, target, hdrs, body, port)
        what = f"{method} {target}"
        if status != expect:
            fail(f"{what}: status {status}, expected {expect}: {data[:300]!r}")
        if route is None:
            value = self.c.check_component("NotFound", what, status, rh, data)
        else:
            value = self.c.check(route, method, status, rh, data)
            self.c.check_request(route, method, target, hdrs, body, status, value)
        if problem is not None:
            got = value.get("type") if isinstance(value, dict) else None
            if got != f"{PROBLEMS}{problem}":
                fail(f"{what}: problem {got}, expected {PROBLEMS}{problem}")
        return status, rh, value


def cli(*args):
    out = subprocess.run([os.environ["IDEMFLOW_CLI"], "--db", os.environ["DATABASE_URL"],
                          *args], check=True, capture_output=True, text=True)
    return out.stdout.strip()


# The test's own sessions stay writable while the workers' are read-only.
PSQL_ENV = dict(os.environ, PGOPTIONS="-c default_transaction_read_only=off")


def psql(sql):
    """Run sql; its output, or a ContractError with psql's."""
    r = subprocess.run(["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql],
                       capture_output=True, text=True, env=PSQL_ENV, check=False)
    if r.returncode != 0:
        fail(f"psql {sql!r}: {r.stderr.strip()}")
    return r.stdout.strip()


class KeyHold:
    """A transaction that holds an Idempotency-Key row (uncommitted), as a
    request still being processed does."""

    def __init__(self, tenant_id, key):
        self.p = subprocess.Popen(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=PSQL_ENV)
        self.p.stdin.write(
            "BEGIN;\n"
            "INSERT INTO idempotency_keys (tenant_id, key, method, path, fingerprint, status,"
            " headers, body, created_at, expires_at) VALUES"
            f" ({tenant_id}, '{key}', 'POST', '/v1/workflows', decode('00', 'hex'), 201,"
            " '', '', now(), now() + interval '1 day');\n"
            "\\echo held\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if line.strip() != "held":
            fail(f"could not hold key {key}: psql said {line!r}")

    def release(self):
        self.p.communicate("ROLLBACK;\n\\q\n", timeout=30)


def uid():
    return str(uuid.uuid4())


def run(c, api):
    def call(*a, **kw):
        return api.call(*a, **kw)

    tenant = f"t-contract-{os.getpid()}-{secrets.token_hex(4)}"
    tenant_id = int(cli("tenant", "create", tenant))
    tok = cli("token", "create", "--tenant", tenant)
    T = tok

    WFS = "/v1/workflows"
    WF = "/v1/workflows/{id}"
    EV = "/v1/workflows/{id}/events"
    TR = "/v1/workflows/{id}/transitions"
    MSG = "/v1/workflows/{id}/messages"
    ACT = "/v1/jobs/activate"
    COMP = "/v1/jobs/{key}/complete"
    FAIL = "/v1/jobs/{key}/fail"
    HB = "/v1/jobs/{key}/heartbeat"
    RES = "/v1/workflows/{id}/resume"
    PUB = "/v1/messages"
    ghost = "01890000-0000-7000-8000-000000000000"

    # --- operations ---------------------------------------------------
    # The document itself, without a token: the YAML of this tree as JSON.
    _, _, served = call("/v1/openapi.json", "GET", "/v1/openapi.json", 200)
    if json.loads(json.dumps(served)) != json.loads(json.dumps(c.doc, default=str)):
        fail("GET /v1/openapi.json is not doc/openapi.yaml")
    call("/v1/openapi.json", "POST", "/v1/openapi.json", 405, "method-not-allowed", token=T,
         body={})
    call("/healthz", "GET", "/healthz", 204)
    call("/healthz", "POST", "/healthz", 405, "method-not-allowed", body={})
    call("/readyz", "GET", "/readyz", 200)
    call("/readyz", "DELETE", "/readyz", 405, "method-not-allowed")
    # The main listener passes no client address: only the token opens it.
    call("/metrics", "GET", "/metrics", 403, "forbidden", token=T)
    call("/metrics", "POST", "/metrics", 403, "forbidden", body={})
    mport = int(os.environ["IDEMFLOW_METRICS_PORT"])
    call("/metrics", "GET", "/metrics", 200, port=mport)
    call("/metrics", "PUT", "/metrics", 405, "method-not-allowed", body={}, port=mport)
    # The status page is opened exactly as /metrics is.
    call("/status", "GET", "/status", 403, "forbidden", token=T)
    call("/status", "POST", "/status", 403, "forbidden", body={})
    call("/status", "GET", "/status", 200, port=mport)
    call("/status", "GET", "/status?json=1&full=1", 200, port=mport)
    call("/status", "PUT", "/status", 405, "method-not-allowed", body={}, port=mport)

    # --- authentication, routes, methods -------------------------------
    call(WFS, "GET", WFS, 401, "unauthorized")
    _, h, _ = call(WFS, "POST", WFS, 401, "unauthorized", token="idf_nope", key=uid(),
                   body={"type": "x"})
    if "invalid_token" not in h["www-authenticate"]:
        fail(f"an unknown token's challenge lacks invalid_token: {h['www-authenticate']}")
    call(WFS, "DELETE", WFS, 405, "method-not-allowed", token=T)
    call(None, "GET", "/v1/nope", 404, "not-found", token=T)
    call(None, "GET", "/", 404, "not-found")
    call(None, "POST", "/v1/jobs/x/y", 404, "not-found", token=T, body={})

    # --- POST /v1/workflows --------------------------------------------
    k1 = uid()
    body1 = {"type": "order-flow", "input": {"order": 42}}
    _, h, wf = call(WFS, "POST", WFS, 201, token=T, key=k1, body=body1)
    plain_id = wf["id"]
    if h["location"] != f"/v1/workflows/{plain_id}":
        fail(f"Location {h['location']} is not the created workflow's")
    _, h, _ = call(WFS, "POST", WFS, 201, token=T, key=k1, body=body1)
    if h.get("idempotent-replayed") != "true":
        fail("a replayed create lacks Idempotent-Replayed: true")
    call(WFS, "POST", WFS, 409, "idempotency-key-reused", token=T, key=k1,
         body={"type": "other"})
    # The IETF draft's form, an RFC 8941 string, names the same key.
    _, h, _ = call(WFS, "POST", WFS, 201, token=T, key=f'"{k1}"', body=body1)
    if h.get("idempotent-replayed") != "true":
        fail("the quoted form of a key does not replay the bare form's answer")
    call(WFS, "POST", WFS, 400, "invalid-idempotency-key", token=T, key=f'"{k1}";v=1',
         body=body1)
    call(WFS, "POST", WFS, 400, "missing-idempotency-key", token=T, body=body1)
    call(WFS, "POST", WFS, 400, "invalid-idempotency-key", token=T, key="a b", body=body1)
    call(WFS, "POST", WFS, 400, "invalid-idempotency-key", token=T, body=body1,
         headers=[("Idempotency-Key", uid()), ("Idempotency-Key", uid())])
    call(WFS, "POST", WFS, 400, "invalid-json", token=T, key=uid(), body="{'type': 1}")
    call(WFS, "POST", WFS, 415, "unsupported-media-type", token=T, key=uid(),
         body=body1, ctype="text/plain")
    call(WFS, "POST", WFS, 422, "invalid-workflow", token=T, key=uid(),
         body={"type": "x", "colour": "red"})
    big = json.dumps({"type": "big", "input": {"pad": "x" * (1536 * 1024)}})
    call(WFS, "POST", WFS, 413, "body-too-large", token=T, key=uid(), body=big)
    huge = json.dumps({"type": "big", "input": {"pad": "x" * (2560 * 1024)}})
    call(WFS, "POST", WFS, 413, "body-too-large", token=T, key=uid(), body=huge)
    held = f"held-{uid()}"
    hold = KeyHold(tenant_id, held)
    try:
        call(WFS, "POST", WFS, 409, "idempotency-key-in-flight", token=T, key=held,
             body=body1)
    finally:
        hold.release()

    # A workflow that runs: a job with a retry, a wait, a job without.
    run_body = {"type": "order-run", "input": {"order": 7}, "business_key": f"O-{uid()}",
                "steps": [{"name": "reserve", "job_type": "ct-stock", "retries": 1},
                          {"name": "await-payment", "wait_for": "payment.succeeded"},
                          {"name": "ship", "job_type": "ct-ship"}]}
    _, _, w1 = call(WFS, "POST", WFS, 201, token=T, key=uid(), body=run_body)
    _, h, ex = call(WFS, "POST", WFS, 200, token=T, key=uid(), body=run_body)
    if ex["id"] != w1["id"] or h["location"] != f"/v1/workflows/{w1['id']}":
        fail("the business key's create did not answer the active workflow")
    w1id = w1["id"]

    # --- reads ---------------------------------------------------------
    call(WFS, "GET", WFS, 200, token=T)
    _, _, page = call(WFS, "GET", WFS + "?limit=1", 200, token=T)
    if page["next_cursor"] is None:
        fail("a page of 1 out of several has no next_cursor")
    call(WFS, "GET", WFS + f"?after={page['next_cursor']}&state=pending&type=order-run",
         200, token=T)
    call(WFS, "GET", WFS + "?limit=0", 422, "invalid-request", token=T)
    call(WFS, "GET", WFS + "?state=bogus", 422, "invalid-request", token=T)
    call(WF, "GET", f"{WFS}/{plain_id}", 200, token=T)
    call(WF, "GET", f"{WFS}/{plain_id}", 401, "unauthorized")
    call(WF, "GET", f"{WFS}/not-a-uuid", 404, "not-found", token=T)
    call(WF, "GET", f"{WFS}/{ghost}", 404, "not-found", token=T)
    call(WF, "PATCH", f"{WFS}/{plain_id}", 405, "method-not-allowed", token=T, body={})
    call(EV, "GET", f"{WFS}/{plain_id}/events", 200, token=T)
    call(EV, "GET", f"{WFS}/{plain_id}/events?after=x", 422, "invalid-request", token=T)
    call(EV, "GET", f"{WFS}/{ghost}/events", 404, "not-found", token=T)
    call(EV, "GET", f"{WFS}/{plain_id}/events", 401, "unauthorized")
    call(EV, "POST", f"{WFS}/{plain_id}/events", 405, "method-not-allowed", token=T, body={})

    # --- jobs ----------------------------------------------------------
    _, _, a = call(ACT, "POST", ACT, 200, token=T,
                   body={"job_type": "ct-stock", "worker": "w1", "lease_seconds": 60})
    if len(a["jobs"]) != 1:
        fail(f"activate handed out {len(a['jobs'])} jobs, expected 1")
    jkey = a["jobs"][0]["key"]
    jc = f"/v1/jobs/{jkey}/complete"
    jf = f"/v1/jobs/{jkey}/fail"
    kc = uid()
    call(COMP, "POST", jc, 409, "not-lease-holder", token=T, key=kc,
         body={"worker": "w2", "output": {}})
    _, h, _ = call(COMP, "POST", jc, 409, "not-lease-holder", token=T, key=kc,
                   body={"worker": "w2", "output": {}})
    if h.get("idempotent-replayed") != "true":
        fail("a replayed stored refusal lacks Idempotent-Replayed: true")
    call(FAIL, "POST", jf, 409, "not-lease-holder", token=T, body={"worker": "w2"})
    _, _, j = call(FAIL, "POST", jf, 200, token=T,
                   body={"worker": "w1", "error": "out of stock"})
    if j["state"] != "activatable":
        fail(f"a failure with a retry left made the job {j['state']}")
    call(ACT, "POST", ACT, 200, token=T, body={"job_type": "ct-stock", "worker": "w1"})
    # The lease runs out: made so by the test, not waited for.
    psql(f"UPDATE jobs SET due_at = now() - interval '1 second' WHERE tenant_id = {tenant_id}"
         f" AND workflow_id = '{w1id}' AND step = 1")
    call(COMP, "POST", jc, 409, "lease-expired", token=T, body={"worker": "w1"})
    call(FAIL, "POST", jf, 409, "lease-expired", token=T, body={"worker": "w1"})
    call(ACT, "POST", ACT, 200, token=T, body={"job_type": "ct-stock", "worker": "w1"})
    call(COMP, "POST", jc, 200, token=T, body={"worker": "w1", "output": {"held": True}})
    call(COMP, "POST", jc, 200, token=T, body={"worker": "w1", "output": {"held": True}})
    call(COMP, "POST", jc, 409, "job-not-active", token=T,
         body={"worker": "w1", "output": {"held": False}})
    call(FAIL, "POST", jf, 409, "job-not-active", token=T, body={"worker": "w1"})
    _, _, empty = call(ACT, "POST", ACT, 200, token=T,
                       body={"job_type": "ct-none", "worker": "w1", "max_jobs": 5})
    if empty["jobs"]:
        fail("activate of a type without jobs handed some out")
    ka = uid()
    call(ACT, "POST", ACT, 200, token=T, key=ka, body={"job_type": "ct-none", "worker": "w1"})
    call(ACT, "POST", ACT, 409, "idempotency-key-reused", token=T, key=ka,
         body={"job_type": "ct-none", "worker": "w2"})
    for route, target, good in ((ACT, ACT, {"job_type": "x", "worker": "w"}),
                                (COMP, jc, {"worker": "w"}),
                                (FAIL, jf, {"worker": "w"})):
        call(route, "POST", target, 401, "unauthorized", body=good)
        call(route, "GET", target, 405, "method-not-allowed", token=T)
        call(route, "POST", target, 400, "invalid-json", token=T, body="[1,")
        call(route, "POST", target, 400, "invalid-idempotency-key", token=T, key="\x7f",
             body=good)
        call(route, "POST", target, 415, "unsupported-media-type", token=T, body=good,
             ctype="application/xml")
        call(route, "POST", target, 413, "body-too-large", token=T, body=big)
        call(route, "POST", target, 422, "invalid-request", token=T,
             body=dict(good, colour="red"))
    call(COMP, "POST", "/v1/jobs/nope/complete", 404, "not-found", token=T,
         body={"worker": "w1"})
    call(FAIL, "POST", f"/v1/jobs/{ghost}.s1/fail", 404, "not-found", token=T,
         body={"worker": "w1"})
    # A completion whose output would take the next job's activation past
    # its bound: the workflow's input made large by the test, not sent.
    _, _, wb = call(WFS, "POST", WFS, 201, token=T, key=uid(),
                    body={"type": "ct-bound", "priority": 3,
                          "steps": [{"name": "a", "job_type": "ct-bound"},
                                    {"name": "b", "job_type": "ct-bound", "priority": 9}]})
    _, _, got = call(ACT, "POST", ACT, 200, token=T, body={"job_type": "ct-bound", "worker": "w1"})
    if [(j["priority"], j["steps"]) for j in got["jobs"]] != [(3, {})]:
        fail(f"the bound's first job: {got}")
    psql(f"UPDATE workflows SET input = jsonb_build_object('blob', repeat('x', 2100000))"
         f" WHERE tenant_id = {tenant_id} AND id = '{wb['id']}'")
    call(COMP, "POST", f"/v1/jobs/{wb['id']}.s1/complete", 413, "activation-too-large",
         token=T, body={"worker": "w1", "output": {}})

    # --- messages ------------------------------------------------------
    m = f"{WFS}/{w1id}/messages"
    pay = {"message_id": f"pay-{uid()}", "name": "payment.succeeded", "payload": {"ok": 1}}
    _, _, r = call(MSG, "POST", m, 200, token=T, body=pay)
    if not r["correlated"] or r["duplicate"]:
        fail(f"the awaited message was not correlated: {r}")
    _, _, r = call(MSG, "POST", m, 200, token=T, body=pay)
    if not r["duplicate"]:
        fail(f"the same message again is not a duplicate: {r}")
    call(MSG, "POST", m, 409, "message-id-reused", token=T, body=dict(pay, payload={"ok": 2}))
    call(MSG, "POST", m, 422, "invalid-request", token=T, body={"message_id": "x"})
    call(MSG, "POST", f"{WFS}/{ghost}/messages", 404, "not-found", token=T,
         body={"message_id": "x", "name": "y"})
    call(MSG, "POST", m, 401, "unauthorized", body=pay)
    call(MSG, "GET", m, 405, "method-not-allowed", token=T)
    call(MSG, "POST", m, 400, "invalid-json", token=T, body="nope")
    call(MSG, "POST", m, 415, "unsupported-media-type", token=T, body=pay, ctype=None)
    call(MSG, "POST", m, 413, "body-too-large", token=T, body=big)
    km = uid()
    call(MSG, "POST", m, 200, token=T, key=km, body=pay)
    call(MSG, "POST", m, 409, "idempotency-key-reused", token=T, key=km,
         body=dict(pay, name="other"))
    # --- messages by business key and timers ---------------------------
    bk = f"ct-{uid()}"
    call(WFS, "POST", WFS, 201, token=T, key=uid(),
         body={"type": "ct-pub", "business_key": bk,
               "steps": [{"name": "w", "wait_for": "pub", "timeout": "PT1H",
                          "on_timeout": "nap"},
                         {"name": "nap", "sleep": "PT1H"},
                         {"name": "then", "until": "2030-01-01T00:00:00Z"}]})
    pm = {"name": "pub", "business_key": bk, "message_id": f"pub-{uid()}", "ttl": "PT1M",
          "payload": {"a": 1}}
    _, _, r = call(PUB, "POST", PUB, 200, token=T, body=pm)
    if not r["correlated"] or r["duplicate"]:
        fail(f"the published message was not delivered: {r}")
    _, _, r = call(PUB, "POST", PUB, 200, token=T, body=pm)
    if not r["duplicate"]:
        fail(f"the same publication again is not a duplicate: {r}")
    early = {"name": "pub", "business_key": f"none-{uid()}", "message_id": f"pub-{uid()}"}
    call(PUB, "POST", PUB, 202, token=T, body=early)
    _, _, r = call(PUB, "POST", PUB, 200, token=T, body=early)
    if not r["duplicate"] or r["correlated"]:
        fail(f"a buffered message again is not an uncorrelated duplicate: {r}")
    call(PUB, "POST", PUB, 409, "message-id-reused", token=T, body=dict(pm, payload={"a": 2}))
    call(PUB, "POST", PUB, 400, "invalid-duration", token=T, body=dict(pm, ttl="1h"))
    call(PUB, "POST", PUB, 400, "invalid-json", token=T, body="nope")
    call(PUB, "POST", PUB, 422, "invalid-request", token=T, body={"name": "x"})
    call(PUB, "POST", PUB, 401, "unauthorized", body=pm)
    call(PUB, "GET", PUB, 405, "method-not-allowed", token=T)
    call(PUB, "POST", PUB, 415, "unsupported-media-type", token=T, body=pm, ctype=None)
    call(PUB, "POST", PUB, 413, "body-too-large", token=T, body=big)
    kp = uid()
    call(PUB, "POST", PUB, 202, token=T, key=kp,
         body={"name": "k", "business_key": f"k-{uid()}", "message_id": f"k-{uid()}"})
    call(PUB, "POST", PUB, 409, "idempotency-key-reused", token=T, key=kp, body=early)
    call(WFS, "POST", WFS, 400, "invalid-duration", token=T, key=uid(),
         body={"type": "ct-bad", "steps": [{"name": "a", "sleep": "soon"}]})

    # The last job fails for good: job.failed, workflow.failed.
    _, _, a = call(ACT, "POST", ACT, 200, token=T, body={"job_type": "ct-ship", "worker": "w9"})
    if len(a["jobs"]) != 1:
        fail(f"the ship job was not handed out: {a}")
    _, _, j = call(FAIL, "POST", f"/v1/jobs/{a['jobs'][0]['key']}/fail", 200, token=T,
                   body={"worker": "w9", "error": "no courier"})
    if j["state"] != "failed":
        fail(f"a failure without retries left made the job {j['state']}")

    # --- transitions ---------------------------------------------------
    _, _, w2 = call(WFS, "POST", WFS, 201, token=T, key=uid(),
                    body={"type": "waiter", "steps": [{"name": "w", "wait_for": "go"}]})
    t2 = f"{WFS}/{w2['id']}/transitions"
    call(MSG, "POST", f"{WFS}/{w2['id']}/messages", 202, token=T,
         body={"message_id": f"early-{uid()}", "name": "not-yet"})
    call(TR, "POST", t2, 409, "state-conflict", token=T,
         body={"to": "cancelled", "from": "running"})
    call(TR, "POST", t2, 422, "invalid-request", token=T, body={"to": "asleep"})
    call(TR, "POST", t2, 422, "invalid-transition", token=T, body={"to": "completed"})
    call(TR, "POST", f"{WFS}/{ghost}/transitions", 404, "not-found", token=T,
         body={"to": "cancelled"})
    call(TR, "POST", t2, 401, "unauthorized", body={"to": "cancelled"})
    call(TR, "GET", t2, 405, "method-not-allowed", token=T)
    call(TR, "POST", t2, 400, "invalid-json", token=T, body="")
    call(TR, "POST", t2, 415, "unsupported-media-type", token=T, body={"to": "cancelled"},
         ctype="application/jsonx")
    call(TR, "POST", t2, 413, "body-too-large", token=T, body=big)
    kt = uid()
    call(TR, "POST", t2, 200, token=T, key=kt, body={"to": "cancelled"})
    call(TR, "POST", t2, 409, "idempotency-key-reused", token=T, key=kt,
         body={"to": "cancelled", "from": "pending"})
    call(TR, "POST", t2, 200, token=T, body={"to": "cancelled"})
    call(TR, "POST", f"{WFS}/{w1id}/transitions", 422, "invalid-transition", token=T,
         body={"to": "cancelled"})

    # --- heartbeats -----------------------------------------------------
    # A payment step that parks its workflow in incident when it fails.
    pay_body = {"type": "ct-pay", "business_key": f"P-{uid()}",
                "steps": [{"name": "charge", "job_type": "ct-charge", "on_failure": "incident"},
                          {"name": "after", "job_type": "ct-after", "resumable": True}]}
    _, _, w4 = call(WFS, "POST", WFS, 201, token=T, key=uid(), body=pay_body)
    w4id = w4["id"]
    _, _, a = call(ACT, "POST", ACT, 200, token=T,
                   body={"job_type": "ct-charge", "worker": "w1", "lease_seconds": 60})
    hb = f"/v1/jobs/{a['jobs'][0]['key']}/heartbeat"
    _, _, j = call(HB, "POST", hb, 200, token=T,
                   body={"worker": "w1", "lease_seconds": 120, "progress": {"done": 1, "of": 2}})
    if j["progress"] != {"done": 1, "of": 2} or j["deadline"] <= a["jobs"][0]["deadline"]:
        fail(f"a heartbeat did not extend the lease or keep the progress: {j}")
    _, _, wv = call(WF, "GET", f"{WFS}/{w4id}", 200, token=T)
    if wv.get("progress") != {"done": 1, "of": 2}:
        fail(f"the workflow does not show its job's progress: {wv}")
    kh = uid()
    call(HB, "POST", hb, 200, token=T, key=kh, body={"worker": "w1"})
    _, h, _ = call(HB, "POST", hb, 200, token=T, key=kh, body={"worker": "w1"})
    if h.get("idempotent-replayed") != "true":
        fail("a replayed heartbeat lacks Idempotent-Replayed: true")
    call(HB, "POST", hb, 409, "idempotency-key-reused", token=T, key=kh,
         body={"worker": "w1", "lease_seconds": 5})
    call(HB, "POST", hb, 409, "not-lease-holder", token=T, body={"worker": "w2"})
    call(HB, "POST", hb, 400, "invalid-json", token=T, body="nope")
    call(HB, "POST", hb, 401, "unauthorized", body={"worker": "w1"})
    call(HB, "POST", f"/v1/jobs/{ghost}.s1/heartbeat", 404, "not-found", token=T,
         body={"worker": "w1"})
    call(HB, "GET", hb, 405, "method-not-allowed", token=T)
    call(HB, "POST", hb, 413, "body-too-large", token=T,
         body={"worker": "w1", "progress": {"log": "x" * 5000}})
    call(HB, "POST", hb, 413, "body-too-large", token=T, body=big)
    call(HB, "POST", hb, 415, "unsupported-media-type", token=T, body={"worker": "w1"},
         ctype="text/plain")
    call(HB, "POST", hb, 422, "invalid-request", token=T,
         body={"worker": "w1", "lease_seconds": 0})
    psql(f"UPDATE jobs SET due_at = now() - interval '1 second' WHERE tenant_id = {tenant_id}"
         f" AND workflow_id = '{w4id}' AND step = 1")
    call(HB, "POST", hb, 409, "lease-expired", token=T, body={"worker": "w1"})
    call(ACT, "POST", ACT, 200, token=T, body={"job_type": "ct-charge", "worker": "w1"})

    # --- incidents and resumes ------------------------------------------
    # Without retries left the step parks the workflow: workflow.incident.
    _, _, j = call(FAIL, "POST", hb.replace("/heartbeat", "/fail"), 200, token=T,
                   body={"worker": "w1", "error": "gateway down"})
    if j["state"] != "failed":
        fail(f"the charge job is {j['state']}, expected failed")
    call(HB, "POST", hb, 409, "job-not-active", token=T, body={"worker": "w1"})
    _, _, wv = call(WF, "GET", f"{WFS}/{w4id}", 200, token=T)
    if wv["state"] != "incident":
        fail(f"a failed step with on_failure incident left the workflow {wv['state']}")
    _, _, page = call(WFS, "GET", WFS + "?state=incident", 200, token=T)
    if [w["id"] for w in page["workflows"]] != [w4id]:
        fail(f"?state=incident lists {page}")
    _, _, ex = call(WFS, "POST", WFS, 200, token=T, key=uid(), body=pay_body)
    if ex["id"] != w4id or ex["state"] != "incident":
        fail("a workflow in incident does not hold its business key")
    res = f"{WFS}/{w4id}/resume"
    call(RES, "POST", f"{WFS}/{ghost}/resume", 404, "not-found", token=T, body={})
    call(RES, "POST", res, 401, "unauthorized", body={})
    call(RES, "GET", res, 405, "method-not-allowed", token=T)
    call(RES, "POST", res, 400, "invalid-json", token=T, body="[")
    call(RES, "POST", res, 413, "body-too-large", token=T, body=big)
    call(RES, "POST", res, 415, "unsupported-media-type", token=T, body={},
         ctype="text/plain")
    call(RES, "POST", res, 422, "invalid-request", token=T, body={"retries": -1})
    call(RES, "POST", f"{WFS}/{w1id}/resume", 422, "invalid-transition", token=T, body={})
    kr = uid()
    _, _, wv = call(RES, "POST", res, 200, token=T, key=kr, body={"retries": 1})
    if wv["state"] != "running":
        fail(f"a resumed workflow is {wv['state']}")
    _, h, _ = call(RES, "POST", res, 200, token=T, key=kr, body={"retries": 1})
    if h.get("idempotent-replayed") != "true":
        fail("a replayed resume lacks Idempotent-Replayed: true")
    call(RES, "POST", res, 409, "idempotency-key-reused", token=T, key=kr, body={})
    call(RES, "POST", res, 409, "state-conflict", token=T, body={"retries": 1})
    _, _, a = call(ACT, "POST", ACT, 200, token=T, body={"job_type": "ct-charge", "worker": "w3"})
    if len(a["jobs"]) != 1 or a["jobs"][0]["retries_left"] != 1:
        fail(f"the resumed job is not activatable with its fresh retries: {a}")
    call(COMP, "POST", hb.replace("/heartbeat", "/complete"), 200, token=T,
         body={"worker": "w3"})
    # Another incident, cancelled: workflow.cancelled from incident.
    _, _, w5 = call(WFS, "POST", WFS, 201, token=T, key=uid(),
                    body=dict(pay_body, business_key=f"P-{uid()}"))
    _, _, a = call(ACT, "POST", ACT, 200, token=T, body={"job_type": "ct-charge", "worker": "w"})
    call(FAIL, "POST", f"/v1/jobs/{a['jobs'][0]['key']}/fail", 200, token=T,
         body={"worker": "w"})
    call(TR, "POST", f"{WFS}/{w5['id']}/transitions", 200, token=T,
         body={"to": "cancelled", "from": "incident"})

    # A workflow that completes: workflow.completed.
    _, _, w3 = call(WFS, "POST", WFS, 201, token=T, key=uid(),
                    body={"type": "quick", "steps": [{"name": "q", "job_type": "ct-quick"}]})
    _, _, a = call(ACT, "POST", ACT, 200, token=T, body={"job_type": "ct-quick", "worker": "w"})
    call(COMP, "POST", f"/v1/jobs/{a['jobs'][0]['key']}/complete", 200, token=T,
         body={"worker": "w"})

    # Timers: a sleep fires (timer.fired), a wait times out (step.timed_out,
    # workflow.failed), both by idemflow reap.
    _, _, wt = call(WFS, "POST", WFS, 201, token=T, key=uid(),
                    body={"type": "ct-timer", "steps": [
                        {"name": "nap", "sleep": "PT0S"},
                        {"name": "w", "wait_for": "never", "timeout": "PT0S"}]})
    for _ in range(2):
        cli("reap")
    if psql(f"SELECT state FROM workflows WHERE id = '{wt['id']}'") != "failed":
        fail("the timer workflow did not sleep, time out and fail")

    # A saga: its second step fails, the first is undone. The compensating
    # job fails (incident), a cancel is refused, a resume lets it finish:
    # compensation.started, job.failed and workflow.incident of a
    # compensating job, workflow.resumed, step.compensated,
    # workflow.compensated.
    _, _, ws = call(WFS, "POST", WFS, 201, token=T, key=uid(),
                    body={"type": "ct-saga", "steps": [
                        {"name": "hold", "job_type": "ct-hold",
                         "compensate": {"job_type": "ct-release"}},
                        {"name": "pay", "job_type": "ct-pay"}]})
    for jt, verb in (("ct-hold", "complete"), ("ct-pay", "fail")):
        _, _, a = call(ACT, "POST", ACT, 200, token=T, body={"job_type": jt, "worker": "w"})
        call(COMP if verb == "complete" else FAIL, "POST",
             f"/v1/jobs/{a['jobs'][0]['key']}/{verb}", 200, token=T,
             body={"worker": "w", "output": {"held": 1}} if verb == "complete"
             else {"worker": "w", "error": "declined"})
    _, _, a = call(ACT, "POST", ACT, 200, token=T, body={"job_type": "ct-release", "worker": "w"})
    cj = a["jobs"][0]
    if cj["key"] != f"{ws['id']}.c1" or cj["compensates"]["output"] != {"held": 1}:
        fail(f"the compensating job is not the one of step 1: {cj}")
    call(FAIL, "POST", f"/v1/jobs/{cj['key']}/fail", 200, token=T,
         body={"worker": "w", "error": "bank down"})
    call(TR, "POST", f"{WFS}/{ws['id']}/transitions", 409, "state-conflict", token=T,
         body={"to": "cancelled"})
    _, _, wv = call(RES, "POST", f"{WFS}/{ws['id']}/resume", 200, token=T, body={})
    if wv["state"] != "compensating":
        fail(f"a resumed compensation is {wv['state']}")
    _, _, a = call(ACT, "POST", ACT, 200, token=T, body={"job_type": "ct-release", "worker": "w"})
    call(COMP, "POST", f"/v1/jobs/{a['jobs'][0]['key']}/complete", 200, token=T,
         body={"worker": "w"})
    _, _, wv = call(WF, "GET", f"{WFS}/{ws['id']}", 200, token=T)
    if wv["state"] != "compensated":
        fail(f"the saga ended {wv['state']}, not compensated")

    # --- a tenant's endpoints ------------------------------------------
    EPS = "/v1/endpoints"
    EP = "/v1/endpoints/{id}"
    SEC = "/v1/endpoints/{id}/secret"
    ROT = "/v1/endpoints/{id}/secret/rotate"
    REV = "/v1/endpoints/{id}/secret/revoke"
    ek = uid()
    eb = {"url": "https://billing.example/hooks", "filter_types": ["workflow.*", "job.completed"],
          "ordering": "workflow", "metadata": {"team": "billing"}}
    _, h, ep = call(EPS, "POST", EPS, 201, token=T, key=ek, body=eb)
    ep_id = ep["id"]
    if h["location"] != f"{EPS}/{ep_id}":
        fail(f"Location {h['location']} is not the created endpoint's")
    _, h, again = call(EPS, "POST", EPS, 201, token=T, key=ek, body=eb)
    if h.get("idempotent-replayed") != "true" or again != ep:
        fail("a replayed endpoint create is not the stored answer")
    call(EPS, "POST", EPS, 409, "idempotency-key-reused", token=T, key=ek,
         body={"url": "https://billing.example/other"})
    call(EPS, "POST", EPS, 400, "missing-idempotency-key", token=T, body=eb)
    call(EPS, "POST", EPS, 400, "invalid-json", token=T, key=uid(), body="{")
    call(EPS, "POST", EPS, 401, "unauthorized", key=uid(), body=eb)
    call(EPS, "POST", EPS, 413, "body-too-large", token=T, key=uid(), body=big)
    call(EPS, "POST", EPS, 415, "unsupported-media-type", token=T, key=uid(), body=eb,
         ctype="text/plain")
    call(EPS, "POST", EPS, 422, "invalid-request", token=T, key=uid(),
         body={"url": "https://h", "colour": "red"})
    call(EPS, "POST", EPS, 422, "invalid-request", token=T, key=uid(),
         body={"url": "ftp://h"})
    call(EPS, "POST", EPS, 422, "invalid-request", token=T, key=uid(),
         body={"url": "https://h", "filter_types": ["endpoint.disabled"]})
    call(EPS, "PUT", EPS, 405, "method-not-allowed", token=T, body={})
    call(EPS, "GET", f"{EPS}?limit=1", 200, token=T)
    call(EPS, "GET", f"{EPS}?limit=1&after={ghost}", 200, token=T)
    call(EPS, "GET", f"{EPS}?after=nope", 422, "invalid-request", token=T)
    call(EPS, "GET", EPS, 401, "unauthorized")
    e1 = f"{EPS}/{ep_id}"
    eg = f"{EPS}/{ghost}"
    call(EP, "GET", e1, 200, token=T)
    call(EP, "GET", eg, 404, "not-found", token=T)
    call(EP, "GET", f"{EPS}/nope", 404, "not-found", token=T)
    call(EP, "GET", e1, 401, "unauthorized")
    call(EP, "PUT", e1, 405, "method-not-allowed", token=T, body={})
    pk = uid()
    call(EP, "PATCH", e1, 200, token=T, key=pk, body={"disabled": True})
    _, h, _ = call(EP, "PATCH", e1, 200, token=T, key=pk, body={"disabled": True})
    if h.get("idempotent-replayed") != "true":
        fail("a replayed PATCH lacks Idempotent-Replayed: true")
    call(EP, "PATCH", e1, 409, "idempotency-key-reused", token=T, key=pk,
         body={"disabled": False})
    call(EP, "PATCH", e1, 200, token=T, body={"disabled": False, "filter_types": None})
    call(EP, "PATCH", e1, 400, "invalid-json", token=T, body="[")
    call(EP, "PATCH", e1, 401, "unauthorized", body={"disabled": False})
    call(EP, "PATCH", eg, 404, "not-found", token=T, body={"disabled": False})
    call(EP, "PATCH", e1, 413, "body-too-large", token=T, body=big)
    call(EP, "PATCH", e1, 415, "unsupported-media-type", token=T, body={}, ctype="text/plain")
    call(EP, "PATCH", e1, 422, "invalid-request", token=T, body={})
    s1 = f"{e1}/secret"
    call(SEC, "GET", s1, 200, token=T)
    call(SEC, "GET", f"{eg}/secret", 404, "not-found", token=T)
    call(SEC, "GET", s1, 401, "unauthorized")
    call(SEC, "POST", s1, 405, "method-not-allowed", token=T, body={})
    r1 = f"{e1}/secret/rotate"
    rk = uid()
    call(ROT, "POST", r1, 200, token=T, key=rk, body={"grace": "PT1H"})
    call(ROT, "POST", r1, 409, "idempotency-key-reused", token=T, key=rk,
         body={"grace": "PT2H"})
    call(ROT, "POST", r1, 200, token=T, body=None, ctype=None)
    call(ROT, "POST", r1, 400, "invalid-duration", token=T, body={"grace": "P8D"})
    call(ROT, "POST", r1, 401, "unauthorized", body={})
    call(ROT, "POST", f"{eg}/secret/rotate", 404, "not-found", token=T, body={})
    call(ROT, "POST", r1, 413, "body-too-large", token=T, body=big)
    call(ROT, "POST", r1, 415, "unsupported-media-type", token=T, body={}, ctype="text/plain")
    call(ROT, "POST", r1, 422, "invalid-request", token=T, body={"keep": True})
    call(ROT, "GET", r1, 405, "method-not-allowed", token=T)
    _, _, sec = call(SEC, "GET", s1, 200, token=T)
    if sec["previous_key"] is None or sec["previous_expires_at"] is None:
        fail(f"no previous secret during a rotation's grace: {sec}")
    v1 = f"{e1}/secret/revoke"
    vk = uid()
    call(REV, "POST", v1, 200, token=T, key=vk, body={})
    # Only {} is a revoke: a key is reused by another request (the rotate's).
    call(REV, "POST", v1, 409, "idempotency-key-reused", token=T, key=rk, body={})
    call(REV, "POST", v1, 200, token=T, body=None, ctype=None)
    call(REV, "POST", v1, 400, "invalid-json", token=T, body="nope")
    call(REV, "POST", v1, 401, "unauthorized", body={})
    call(REV, "POST", f"{eg}/secret/revoke", 404, "not-found", token=T, body={})
    call(REV, "POST", v1, 413, "body-too-large", token=T, body=big)
    call(REV, "POST", v1, 415, "unsupported-media-type", token=T, body={}, ctype="text/plain")
    call(REV, "POST", v1, 422, "invalid-request", token=T, body={"x": 1})
    call(REV, "GET", v1, 405, "method-not-allowed", token=T)
    _, _, ep2 = call(EPS, "POST", EPS, 201, token=T, key=uid(), body={"url": "http://h/x"})
    e2 = f"{EPS}/{ep2['id']}"
    dk = uid()
    call(EP, "DELETE", e2, 200, token=T, key=dk, body=None, ctype=None)
    call(EP, "DELETE", e2, 200, token=T, key=dk, body={})
    call(EP, "DELETE", e2, 409, "idempotency-key-reused", token=T, key=pk, body=None,
         ctype=None)
    call(EP, "DELETE", e2, 404, "not-found", token=T, body=None, ctype=None)
    call(EP, "DELETE", e1, 400, "invalid-json", token=T, body="nope")
    call(EP, "DELETE", e1, 401, "unauthorized", body=None, ctype=None)
    call(EP, "DELETE", e1, 413, "body-too-large", token=T, body=big)
    call(EP, "DELETE", e1, 415, "unsupported-media-type", token=T, body={}, ctype="text/plain")
    call(EP, "DELETE", e1, 422, "invalid-request", token=T, body={"force": True})
    # --- the event feed, deliveries, attempts, recover, resend ------------
    # (app/server/events.c). The endpoints and the state a dispatcher
    # leaves are rows of the test's own; they go again at the end.
    EVS = "/v1/events"
    EDL = "/v1/events/{id}/deliveries"
    ERS = "/v1/events/{id}/resend"
    EAT = "/v1/endpoints/{id}/attempts"
    EUN = "/v1/endpoints/{id}/undelivered"
    ERC = "/v1/endpoints/{id}/recover"
    whsec = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    ep, ep_billing = uid(), uid()
    psql(f"INSERT INTO endpoints (tenant_id, id, url, secret, filter_types) VALUES"
         f" ({tenant_id}, '{ep}', 'http://127.0.0.1:9/', '{whsec}', NULL),"
         f" ({tenant_id}, '{ep_billing}', 'http://127.0.0.1:9/', '{whsec}',"
         f" ARRAY['billing.*'])")
    _, _, we = call(WFS, "POST", WFS, 201, token=T, key=uid(), body={"type": "ct-fanout"})
    ev = f"{we['id']}.1"
    psql(f"UPDATE deliveries SET state = 'dead', attempts = 3, last_error = 'HTTP 500'"
         f" WHERE endpoint_id = '{ep}'")
    psql(f"INSERT INTO delivery_attempts (tenant_id, endpoint_id, workflow_id, seq, event_id,"
         f" trigger, started_at, duration_ms, status, outcome, response) VALUES"
         f" ({tenant_id}, '{ep}', '{we['id']}', 1, '{ev}', 'scheduled', now(), 3.5, 500,"
         f" 'http', 'oops')")
    _, _, page = call(EVS, "GET", EVS + "?limit=1", 200, token=T)
    if page["next_cursor"] is None:
        fail("a feed page of 1 out of several has no next_cursor")
    call(EVS, "GET", EVS + f"?after={page['next_cursor']}&limit=1000", 200, token=T)
    call(EVS, "GET", EVS, 401, "unauthorized")
    call(EVS, "GET", EVS + "?after=x", 422, "invalid-request", token=T)
    call(EVS, "POST", EVS, 405, "method-not-allowed", token=T, body={})
    _, _, dl = call(EDL, "GET", f"/v1/events/{ev}/deliveries", 200, token=T)
    # (the endpoints of the section above receive it too)
    got = [d["endpoint_id"] for d in dl["deliveries"]]
    if [e for e in got if e in (ep, ep_billing)] != [ep]:
        fail(f"the event's deliveries are {dl}, expected one to {ep}")
    call(EDL, "GET", f"/v1/events/{ev}/deliveries?after={ep}&limit=5", 200, token=T)
    call(EDL, "GET", f"/v1/events/{ev}/deliveries", 401, "unauthorized")
    call(EDL, "GET", f"/v1/events/{ghost}.1/deliveries", 404, "not-found", token=T)
    call(EDL, "GET", f"/v1/events/{ev}/deliveries?after=x", 422, "invalid-request", token=T)
    call(EDL, "POST", f"/v1/events/{ev}/deliveries", 405, "method-not-allowed", token=T,
         body={})
    _, _, at = call(EAT, "GET", f"/v1/endpoints/{ep}/attempts?status=failed&limit=10", 200,
                    token=T)
    if len(at["attempts"]) != 1:
        fail(f"the endpoint's failed attempts are {at}")
    call(EAT, "GET", f"/v1/endpoints/{ep}/attempts?status=500&after=999999999", 200, token=T)
    call(EAT, "GET", f"/v1/endpoints/{ep}/attempts", 401, "unauthorized")
    call(EAT, "GET", f"/v1/endpoints/{ghost}/attempts", 404, "not-found", token=T)
    call(EAT, "GET", f"/v1/endpoints/{ep}/attempts?status=bogus", 422, "invalid-request",
         token=T)
    call(EAT, "POST", f"/v1/endpoints/{ep}/attempts", 405, "method-not-allowed", token=T,
         body={})
    _, _, un = call(EUN, "GET", f"/v1/endpoints/{ep}/undelivered?state=dead", 200, token=T)
    if [d["event_id"] for d in un["deliveries"]] != [ev]:
        fail(f"the endpoint's dead deliveries are {un}")
    call(EUN, "GET", f"/v1/endpoints/{ep}/undelivered?after={ev}&limit=3", 200, token=T)
    call(EUN, "GET", f"/v1/endpoints/{ep}/undelivered", 401, "unauthorized")
    call(EUN, "GET", f"/v1/endpoints/{ghost}/undelivered", 404, "not-found", token=T)
    call(EUN, "GET", f"/v1/endpoints/{ep}/undelivered?state=delivered", 422,
         "invalid-request", token=T)
    call(EUN, "DELETE", f"/v1/endpoints/{ep}/undelivered", 405, "method-not-allowed",
         token=T)
    rc = f"/v1/endpoints/{ep}/recover"
    krc = uid()
    since = {"since": "2000-01-01T00:00:00Z", "types": ["workflow.*"], "states": ["dead"]}
    _, _, rec = call(ERC, "POST", rc, 200, token=T, key=krc, body=since)
    if rec != {"recovered": 1}:
        fail(f"recover answered {rec}, expected 1 recovered")
    _, h, _ = call(ERC, "POST", rc, 200, token=T, key=krc, body=since)
    if h.get("idempotent-replayed") != "true":
        fail("a replayed recover lacks Idempotent-Replayed: true")
    call(ERC, "POST", rc, 409, "idempotency-key-reused", token=T, key=krc,
         body={"since": "2001-01-01T00:00:00Z"})
    call(ERC, "POST", rc, 400, "missing-idempotency-key", token=T, body=since)
    call(ERC, "POST", rc, 400, "invalid-json", token=T, key=uid(), body="[")
    call(ERC, "POST", rc, 401, "unauthorized", key=uid(), body=since)
    call(ERC, "POST", f"/v1/endpoints/{ghost}/recover", 404, "not-found", token=T, key=uid(),
         body=since)
    call(ERC, "POST", rc, 413, "body-too-large", token=T, key=uid(), body=big)
    call(ERC, "POST", rc, 415, "unsupported-media-type", token=T, key=uid(), body=since,
         ctype="text/plain")
    call(ERC, "POST", rc, 422, "invalid-request", token=T, key=uid(),
         body={"since": "2000-01-01T00:00:00Z", "states": ["pending"]})
    call(ERC, "GET", rc, 405, "method-not-allowed", token=T)
    rs = f"/v1/events/{ev}/resend"
    krs = uid()
    _, _, d1 = call(ERS, "POST", rs, 200, token=T, key=krs, body={"endpoint_id": ep})
    if d1["state"] != "pending" or d1["attempts"] != 0:
        fail(f"a resent delivery is {d1}")
    _, h, _ = call(ERS, "POST", rs, 200, token=T, key=krs, body={"endpoint_id": ep})
    if h.get("idempotent-replayed") != "true":
        fail("a replayed resend lacks Idempotent-Replayed: true")
    call(ERS, "POST", rs, 409, "idempotency-key-reused", token=T, key=krs,
         body={"endpoint_id": ep_billing})
    call(ERS, "POST", rs, 409, "state-conflict", token=T, key=uid(),
         body={"endpoint_id": ep_billing})
    call(ERS, "POST", rs, 400, "missing-idempotency-key", token=T, body={"endpoint_id": ep})
    call(ERS, "POST", rs, 400, "invalid-json", token=T, key=uid(), body="{")
    call(ERS, "POST", rs, 401, "unauthorized", key=uid(), body={"endpoint_id": ep})
    call(ERS, "POST", f"/v1/events/{ghost}.1/resend", 404, "not-found", token=T, key=uid(),
         body={"endpoint_id": ep})
    call(ERS, "POST", rs, 413, "body-too-large", token=T, key=uid(), body=big)
    call(ERS, "POST", rs, 415, "unsupported-media-type", token=T, key=uid(),
         body={"endpoint_id": ep}, ctype="text/plain")
    call(ERS, "POST", rs, 422, "invalid-request", token=T, key=uid(),
         body={"endpoint_id": "x"})
    call(ERS, "GET", rs, 405, "method-not-allowed", token=T)
    mine = f"endpoint_id IN ('{ep}', '{ep_billing}')"
    psql(f"DELETE FROM delivery_attempts WHERE tenant_id = {tenant_id} AND {mine};"
         f" DELETE FROM deliveries WHERE tenant_id = {tenant_id} AND {mine};"
         f" DELETE FROM endpoints WHERE tenant_id = {tenant_id}"
         f" AND id IN ('{ep}', '{ep_billing}')")

    # Every event of these workflows against the webhooks' payload schemas
    # (the history holds the payloads the webhooks carry).
    for wid in (plain_id, w1id, w2["id"], w3["id"], w4id, w5["id"], wt["id"], ws["id"]):
        _, _, evs = call(EV, "GET", f"{WFS}/{wid}/events?limit=1000", 200, token=T)
        for ev in evs["events"]:
            hook = c.doc["webhooks"].get(ev["type"])
            if hook is None:
                fail(f"event type {ev['type']} has no webhook in the document")
            schema = hook["post"]["requestBody"]["content"]["application/json"]["schema"]
            c.validate(ev, schema, f"webhook {ev['type']} payload")
            c.events.add(ev["type"])

    # --- the webhooks, delivered -----------------------------------------
    webhooks(c, psql("SELECT count(*) FROM outbox"))

    # --- nginx's own ---------------------------------------------------
    raw_bad(c, api.host, api.port)
    status, rh, data = api.raw("GET", "/" + "a" * 9000)
    if status != 414:
        fail(f"a 9000-byte request line: {status}, expected 414")
    c.check_component("UriTooLong", "GET /aaa...", status, rh, data)

    # --- a read-only database: the app's 503 ---------------------------
    db = psql("SELECT current_database()")
    psql(f'ALTER DATABASE "{db}" SET default_transaction_read_only = on')
    try:
        renew_sessions()
        call(WFS, "POST", WFS, 503, "unavailable", token=T, key=uid(), body=body1)
        call("/readyz", "GET", "/readyz", 503, "unavailable")
        call(TR, "POST", f"{WFS}/{plain_id}/transitions", 503, "unavailable", token=T,
             body={"to": "cancelled"})
        call(MSG, "POST", f"{WFS}/{plain_id}/messages", 503, "unavailable", token=T,
             body={"message_id": f"ro-{uid()}", "name": "x"})
        call(PUB, "POST", PUB, 503, "unavailable", token=T,
             body={"message_id": f"ro-{uid()}", "name": "x", "business_key": "ro"})
        call(ACT, "POST", ACT, 503, "unavailable", token=T, key=uid(),
             body={"job_type": "ct-none", "worker": "w"})
        call(COMP, "POST", f"/v1/jobs/{plain_id}.s1/complete", 503, "unavailable", token=T,
             key=uid(), body={"worker": "w"})
        call(FAIL, "POST", f"/v1/jobs/{plain_id}.s1/fail", 503, "unavailable", token=T,
             key=uid(), body={"worker": "w"})
        call(HB, "POST", f"/v1/jobs/{plain_id}.s1/heartbeat", 503, "unavailable", token=T,
             key=uid(), body={"worker": "w"})
        call(RES, "POST", f"{WFS}/{plain_id}/resume", 503, "unavailable", token=T,
             key=uid(), body={})
        call(EPS, "POST", EPS, 503, "unavailable", token=T, key=uid(), body={"url": "https://h"})
        call(EP, "PATCH", e1, 503, "unavailable", token=T, body={"disabled": True})
        call(EP, "DELETE", e1, 503, "unavailable", token=T, key=uid(), body=None, ctype=None)
        call(ROT, "POST", r1, 503, "unavailable", token=T, key=uid(), body={})
        call(REV, "POST", v1, 503, "unavailable", token=T, key=uid(), body={})
    finally:
        psql(f'ALTER DATABASE "{db}" RESET default_transaction_read_only')

    # --- no worker: nginx's 503 on every route -------------------------
    stop_fcgi()
    for path, item in c.doc["paths"].items():
        target = path.replace("{id}", plain_id).replace("{key}", f"{plain_id}.s1")
        for method in ("get", "post"):
            if method in item:
                call(path, method.upper(), target, 503, "unavailable", token=T, key=uid(),
                     body={} if method == "post" else None)


def webhooks(c, outbox_rows):
    """Drain the outbox with idemflow-dispatch's HTTP sink into
    t/lib/receiver.py, and check every delivery against the webhooks."""
    import base64
    import tempfile

    secret = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
    with tempfile.TemporaryDirectory(prefix="idemflow-contract.") as tmp:
        log = os.path.join(tmp, "deliveries.jsonl")
        rcv = subprocess.Popen([sys.executable, os.path.join(HERE, "..", "lib", "receiver.py"),
                                "--log", log, "--secret", secret],
                               stdout=subprocess.PIPE, text=True)
        try:
            port = int(rcv.stdout.readline())
            d = subprocess.run([os.environ["IDEMFLOW_DISPATCH"], "--db",
                                os.environ["DATABASE_URL"], "--once", "--sink", "http",
                                "--url", f"http://127.0.0.1:{port}/hook", "--secret", secret],
                               capture_output=True, text=True, timeout=120, check=False)
            if d.returncode != 0:
                fail(f"idemflow-dispatch --once exited {d.returncode}: {d.stderr[-500:]}")
        finally:
            rcv.terminate()
            rcv.wait(timeout=30)
        with open(log, encoding="utf-8") as f:
            deliveries = [json.loads(line) for line in f]
    if len(deliveries) != int(outbox_rows):
        fail(f"{len(deliveries)} deliveries for {outbox_rows} outbox events")
    headers = {"webhook_id": "webhook-id", "webhook_timestamp": "webhook-timestamp",
               "webhook_signature": "webhook-signature", "idempotency_key": "Idempotency-Key",
               "traceparent": "traceparent", "tracestate": "tracestate"}
    for dl in deliveries:
        body = json.loads(dl["body"])
        hook = c.doc["webhooks"].get(body.get("type"))
        if hook is None:
            fail(f"a delivery of type {body.get('type')!r}, which has no webhook")
        op = hook["post"]
        what = f"webhook {body['type']} {dl['webhook_id']}"
        if "actor" in body:
            fail(f"{what}: a delivery carries the history's actor")
        if dl["method"] != "POST" or dl["content_type"] != "application/json":
            fail(f"{what}: {dl['method']} with Content-Type {dl['content_type']}")
        params = {c.ref(p)["name"]: c.ref(p) for p in op["parameters"]}
        for field, name in headers.items():
            prm = params[name]
            if dl[field] is None:
                if prm.get("required"):
                    fail(f"{what}: lacks the required header {name}")
                continue
            c.validate(dl[field], prm["schema"], f"{what}: header {name}")
        if dl["webhook_id"] != body["id"] or dl["idempotency_key"] != body["id"]:
            fail(f"{what}: webhook-id and Idempotency-Key are not the event id {body['id']}")
        if dl["signature_valid"] is not True:
            fail(f"{what}: the receiver's own Standard Webhooks check refused the signature")
        c.validate(body, op["requestBody"]["content"]["application/json"]["schema"],
                   f"{what}: body")
        c.delivered.add(body["type"])


def raw_bad(c, host, port):
    """A header line without a colon: nginx's 400 bad-request."""
    s = socket.create_connection((host, port), timeout=30)
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    if status != 400:
        fail(f"a header line without a colon: {lines[0]}, expected 400")
    hdrs = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        hdrs[name.strip().lower()] = value.strip()
    value = c.check_component("BadRequestNginx", "GET /healthz (bad header)", status, hdrs,
                              body)
    if value["type"] != f"{PROBLEMS}bad-request":
        fail(f"nginx's 400 is {value['type']}")


def renew_sessions():
    """End the workers' sessions and wait until they are gone, so that each
    worker's next request reconnects and gets the database's settings."""
    psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
         " WHERE application_name LIKE 'idemflow-worker-%'")
    deadline = time.monotonic() + 10
    while True:
        n = psql("SELECT count(*) FROM pg_stat_activity"
                 " WHERE application_name LIKE 'idemflow-worker-%'")
        if n == "0":
            return
        if time.monotonic() > deadline:
            fail(f"{n} worker sessions still there 10 s after pg_terminate_backend")
        time.sleep(0.05)


def stop_fcgi():
    """Stop the stack's idemflow-fcgi (its pid file) and wait until it is gone."""
    with open(os.environ["IDEMFLOW_FCGI_PIDFILE"], encoding="ascii") as f:
        pid = int(f.read().strip())
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if time.monotonic() > deadline:
            fail(f"idemflow-fcgi {pid} still runs 30 s after SIGTERM")
        time.sleep(0.05)


def report(c):
    documented = c.documented_pairs()
    unreached_ok = {}
    for pair in documented:
        if pair[2] == 500:
            unreached_ok[pair] = UNREACHED_REASON_500
    missing = sorted(p for p in documented - c.covered if p not in unreached_ok)
    stale = sorted(p for p in unreached_ok if p in c.covered)
    extra = sorted(c.covered - documented)
    types = set(c.doc["x-problem-types"])
    schema_types = {t.rsplit("/", 1)[-1] for t in
                    c.doc["components"]["schemas"]["Problem"]["properties"]["type"]["enum"]}
    errors = []
    if types != schema_types:
        errors.append(f"x-problem-types and the Problem schema's type enum differ: "
                      f"{sorted(types ^ schema_types)}")
    for slug, status in c.doc["x-problem-types"].items():
        sch = c.doc["components"]["schemas"].get(f"Problem-{slug}")
        # A configurable status (idempotency-key-reused) is an enum whose
        # first member is the default.
        st = sch["allOf"][1]["properties"]["status"] if sch is not None else {}
        if st.get("const", st.get("enum", [None])[0]) != status:
            errors.append(f"problem type {slug}: no Problem-{slug} schema of status {status}")
    # Each type is documented under a heading of the API reference whose
    # anchor (GitHub's: lower case, punctuation but '-' dropped, spaces to
    # '-') is its slug, so problem_base_uri = <api.md's URL># links to it.
    with open(API_MD, encoding="utf-8") as f:
        anchors = {re.sub(r"[^a-z0-9 _-]", "", m.group(1).strip().lower()).replace(" ", "-")
                   for m in re.finditer(r"^#+ (.*)$", f.read(), re.M)}
    for slug in sorted(types - anchors):
        errors.append(f"problem type {slug}: no section #{slug} in doc/api.md")
    p_missing = sorted(types - c.problems - set(UNREACHED_PROBLEMS))
    p_stale = sorted(set(UNREACHED_PROBLEMS) & c.problems)
    hooks = set(c.doc["webhooks"])
    e_missing = sorted((hooks - c.events) | (hooks - c.delivered))
    comps = {"NotFound", "BadRequestNginx", "UriTooLong"}
    c_missing = sorted(comps - c.components_seen)

    print(f"# answers checked: {c.answers}")
    print(f"# (route, method, status) covered: {len(documented & c.covered)} of "
          f"{len(documented)} documented")
    for path, method, status in sorted(documented & c.covered):
        print(f"ok - {method:6} {path} {status}")
    for pair in sorted(unreached_ok):
        if pair not in c.covered:
            print(f"# not reached: {pair[1]:6} {pair[0]} {pair[2]}: {unreached_ok[pair]}")
    print(f"# problem types covered: {len(c.problems & types)} of {len(types)}: "
          f"{' '.join(sorted(c.problems & types))}")
    for slug, why in sorted(UNREACHED_PROBLEMS.items()):
        print(f"# problem type not reached: {slug}: {why}")
    print(f"# webhook event types covered: {len(c.events & hooks)} of {len(hooks)} in the "
          f"history, {len(c.delivered & hooks)} of {len(hooks)} delivered: "
          f"{' '.join(sorted(c.delivered & hooks))}")
    if missing:
        errors.append("documented but never reached: " +
                      ", ".join(f"{m} {p} {s}" for p, m, s in missing))
    if stale:
        errors.append("listed as unreachable but reached: " +
                      ", ".join(f"{m} {p} {s}" for p, m, s in stale))
    if extra:
        errors.append(f"reached but not documented: {extra}")
    if p_missing:
        errors.append(f"problem types never reached: {p_missing}")
    if p_stale:
        errors.append(f"problem types listed as unreachable but reached: {p_stale}")
    if e_missing:
        errors.append(f"webhook event types never met: {e_missing}")
    if c_missing:
        errors.append(f"components never checked: {c_missing}")
    return errors


def main():
    t0 = time.monotonic()
    c = Contract(DOC_PATH)
    api = Api(c, os.environ.get("IDEMFLOW_HOST", "127.0.0.1"), int(os.environ["IDEMFLOW_PORT"]))
    try:
        run(c, api)
    except ContractError as e:
        print(f"not ok - {e}")
        print(f"# answers checked before the failure: {c.answers}")
        return 1
    errors = report(c)
    for e in errors:
        print(f"not ok - {e}")
    documented = c.documented_pairs()
    print(f"# coverage: {len(documented & c.covered)}/{len(documented)} (route, method, status), "
          f"{len(c.problems)}/{len(c.doc['x-problem-types'])} problem types, "
          f"{len(c.delivered)}/{len(c.doc['webhooks'])} event types delivered, "
          f"{c.answers} answers and {c.requests} request bodies checked, "
          f"{time.monotonic() - t0:.1f} s")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
