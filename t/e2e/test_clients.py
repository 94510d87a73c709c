#!/usr/bin/python3
"""t/e2e/test_clients.py - the reference clients retry the right way.

Run by t/run-test with the e2e stack (PostgreSQL, idemflow-fcgi, nginx).
Both clients, app/clients/python/idemflow_client.py (in this process) and
app/clients/node/idemflow-client.mjs (through t/lib/client_driver.mjs),
talk to nginx through t/lib/faultproxy.py, which loses answers on purpose
on a fixed plan, so that the retries happen. For each client it proves,
with exact request counts seen by the proxy and exact row counts:

- answers lost after the server did the work: each logical request sends
  one random key (a UUIDv4) on every attempt, with the same body; one
  request makes one workflow (one key row, one outbox event), and the
  answer the client returns is the first one the server wrote, byte for
  byte (status, Location, body), flagged Idempotent-Replayed;
- 503 outcome-unknown (the server committed, the client was told it may
  not have): retried with the same key, no sooner than Retry-After, and
  answered with the first answer's bytes; 503 unavailable likewise, and
  then the retry is what creates;
- a real 409 idempotency-key-in-flight (the key's row held in PostgreSQL
  past idempotency_wait): waited for and retried, then created once;
- a key reused with another body: 409 idempotency-key-reused, raised after
  exactly one request; other 4xx (422, 401, 404) likewise never retried;
- the bounds: max_attempts gives up with the key in hand, and a later call
  with that key gets the first answer; a Retry-After past the deadline
  gives up at once without waiting;
- a workflow worked through its jobs and messages with every call's
  answer lost once: one job activation, one completion, one message, the
  workflow completed with exactly its events.
"""

import base64
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
import uuid

sys.dont_write_bytecode = True  # nothing written into the source tree
TOP = os.environ.get("top_srcdir", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(TOP, "t", "lib"))
sys.path.insert(0, os.path.join(TOP, "app", "clients", "python"))

import faultproxy  # noqa: E402
import idemflow_client  # noqa: E402

PSQL_ENV = dict(os.environ, PGOPTIONS="-c default_transaction_read_only=off")
OPTS = {"max_attempts": 8, "deadline": 20.0, "base_delay": 0.02, "max_delay": 0.2}


class Failure(Exception):
    pass


def fail(msg):
    raise Failure(msg)


_out = threading.Lock()


def say(line):
    """One line of the report, whole, from any thread."""
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def expect(what, got, want):
    if got != want:
        fail(f"{what}: got {got!r}, expected {want!r}")


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


class Tenant:
    def __init__(self, label):
        self.name = f"{label}-{uuid.uuid4().hex[:12]}"
        self.id = int(cli("tenant", "create", self.name))
        self.token = cli("token", "create", "--tenant", self.name)

    def counts(self):
        """(workflows, key rows, outbox events) of this tenant."""
        row = psql(f"SELECT (SELECT count(*) FROM workflows WHERE tenant_id = {self.id}) "
                   f"|| ' ' || (SELECT count(*) FROM idempotency_keys "
                   f"WHERE tenant_id = {self.id}) "
                   f"|| ' ' || (SELECT count(*) FROM outbox WHERE tenant_id = {self.id})")
        return tuple(int(n) for n in row.split())


class KeyHold:
    """The key's row inserted and left uncommitted in a psql session, as a
    first request that is still running holds it: a create with the key
    waits on it for idempotency_wait (1 s in the test stack), then gets
    409 idempotency-key-in-flight."""

    def __init__(self, tenant, key):
        self.p = subprocess.Popen(["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, env=PSQL_ENV)
        self.p.stdin.write(
            "BEGIN;\n"
            "INSERT INTO idempotency_keys (tenant_id, key, method, path, fingerprint, status,"
            " headers, body, created_at, expires_at)"
            f" VALUES ({tenant.id}, '{key}', 'POST', '/v1/workflows', decode('00', 'hex'),"
            " 201, '', '', now(), now() + interval '1 day');\n"
            "SELECT 'held';\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline().strip()
        if line != "held":
            fail(f"could not hold the key: {line!r}")

    def release(self):
        self.p.stdin.write("ROLLBACK;\n")
        self.p.stdin.close()
        self.p.wait(timeout=30)


# --- the two clients behind one interface ------------------------------------
class PythonClient:
    name = "python"

    def __init__(self, url):
        self.url = url
        self.pool = concurrent.futures.ThreadPoolExecutor(4)

    def start(self, token, op, args, key=None, **opts):
        c = idemflow_client.Client(self.url, token, **{**OPTS, **opts})
        kw = {} if key is None else {"key": key}
        calls = {
            "create": lambda: c.create_workflow(args["type"], args.get("input"),
                                                steps=args.get("steps"),
                                                business_key=args.get("business_key"),
                                                priority=args.get("priority"), **kw),
            "activate": lambda: c.activate_jobs(args["job_type"], args["worker"],
                                                max_jobs=args.get("max_jobs"),
                                                lease_seconds=args.get("lease_seconds"), **kw),
            "complete": lambda: c.complete_job(args["job_key"], args["worker"],
                                               args.get("output"), **kw),
            "heartbeat": lambda: c.heartbeat_job(args["job_key"], args["worker"],
                                                 lease_seconds=args.get("lease_seconds"),
                                                 progress=args.get("progress"), **kw),
            "publish": lambda: c.publish_message(args["name"], args["business_key"],
                                                 args["message_id"], args.get("payload"),
                                                 **kw),
            "get": lambda: c.get_workflow(args["id"]),
        }

        def run():
            t0 = time.monotonic()
            try:
                a = calls[op]()
                r = {"ok": True, "status": a.status, "headers": a.headers, "body": a.body,
                     "key": a.key, "attempts": a.attempts, "replayed": a.replayed}
            except idemflow_client.ApiError as e:
                r = {"ok": False, "error": "ApiError", "status": e.status,
                     "problem_type": e.problem_type, "key": e.key, "attempts": e.attempts}
            except idemflow_client.RetriesExhausted as e:
                r = {"ok": False, "error": "RetriesExhausted", "key": e.key,
                     "attempts": e.attempts,
                     "status": getattr(e.last, "status", None)}
            r["ms"] = (time.monotonic() - t0) * 1000
            return r

        return self.pool.submit(run)

    def close(self):
        self.pool.shutdown()


class NodeClient:
    name = "node"

    def __init__(self, url):
        self.url = url
        self.p = subprocess.Popen(
            ["node", os.path.join(TOP, "t", "lib", "client_driver.mjs"),
             os.path.join(TOP, "app", "clients", "node", "idemflow-client.mjs")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.n = 0
        self.lock = threading.Lock()
        self.futures = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            r = json.loads(line)
            if "body_b64" in r:
                r["body"] = base64.b64decode(r.pop("body_b64"))
            with self.lock:
                f = self.futures.pop(r.pop("id"))
            f.set_result(r)

    def start(self, token, op, args, key=None, **opts):
        names = {"max_attempts": "maxAttempts", "deadline": "deadlineMs",
                 "base_delay": "baseDelayMs", "max_delay": "maxDelayMs"}
        client = {"baseUrl": self.url, "token": token}
        for k, v in {**OPTS, **opts}.items():
            client[names[k]] = v * 1000 if k != "max_attempts" else v
        f = concurrent.futures.Future()
        with self.lock:
            self.n += 1
            self.futures[self.n] = f
            cmd = {"id": self.n, "client": client, "op": op, "args": args}
            if key is not None:
                cmd["key"] = key
            self.p.stdin.write(json.dumps(cmd) + "\n")
            self.p.stdin.flush()
        return f

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=30)


# --- helpers -----------------------------------------------------------------
def call(client, proxy, token, op, args, plan=(), key=None, **opts):
    """One logical request with the proxy's plan; returns (result, the
    exchanges it made)."""
    proxy.reset()
    proxy.plan(plan)
    r = client.start(token, op, args, key, **opts).result(timeout=60)
    # The client may have its answer before the proxy has closed the
    # connection and noted the exchange finished.
    ex = proxy.wait_for(lambda done: len(done) == len(proxy.log))
    if r.get("error") not in (None, "ApiError", "RetriesExhausted"):
        fail(f"{op}: the client failed: {r}")
    if proxy.plan_left():
        fail(f"{op}: plan not used up: {proxy.plan_left()} left; the client: {r}")
    expect(f"{op}: requests seen by the proxy", len(ex), r["attempts"])
    for x in ex:
        if x.error:
            fail(f"{op}: the proxy failed on {x}: {x.error}")
    return r, ex


def unquote(sf):
    expect("the Idempotency-Key is an RFC 8941 string", (sf[0], sf[-1]), ('"', '"'))
    return sf[1:-1]


def one_key(what, r, ex):
    """Every exchange carried the same key, the client's, a random UUID,
    and the same body bytes."""
    keys = {x.key for x in ex}
    expect(f"{what}: one key on every attempt", len(keys), 1)
    key = unquote(keys.pop())
    expect(f"{what}: the key the client reports", r["key"], key)
    expect(f"{what}: the key is a random (version 4) UUID", uuid.UUID(key).version, 4)
    expect(f"{what}: one body on every attempt", len({x.body for x in ex}), 1)
    return key


def same_as_first(what, r, first):
    """The answer the client returned is the first one the server wrote."""
    st, hdrs, body = first.upstream
    expect(f"{what}: the first answer is not a replay", hdrs.get("idempotent-replayed"), None)
    expect(f"{what}: status", r["status"], st)
    expect(f"{what}: body, byte for byte", r["body"], body)
    expect(f"{what}: Location", r["headers"].get("location"), hdrs.get("location"))
    expect(f"{what}: flagged a replay", r.get("replayed"), True)


# --- the scenarios -----------------------------------------------------------
def lost_answers(c, proxy):
    t = Tenant(f"{c.name}-lost")
    keys = set()
    total = 0
    for i in range(6):
        drops = i % 3
        body = {"type": "order", "input": {"order": i}}
        r, ex = call(c, proxy, t.token, "create", body, ["drop"] * drops)
        what = f"create {i} with {drops} lost answer(s)"
        expect(f"{what}: attempts", r["attempts"], drops + 1)
        expect(f"{what}: actions", [x.action for x in ex], ["drop"] * drops + ["pass"])
        keys.add(one_key(what, r, ex))
        expect(f"{what}: every attempt reached the server",
               [x.upstream[0] for x in ex], [201] * (drops + 1))
        if drops:
            same_as_first(what, r, ex[0])
        else:
            expect(f"{what}: a first answer", (r["status"], r.get("replayed")), (201, False))
        total += drops + 1
    expect("a key per logical request", len(keys), 6)
    expect("rows after 6 creates in 12 requests", (t.counts(), total), ((6, 6, 6), 12))
    say(f"ok - {c.name}: 6 creates, 6 answers lost: 12 requests, one key each, "
          "6 workflows, each answer the first one byte for byte")


def outcome_unknown_and_unavailable(c, proxy):
    t = Tenant(f"{c.name}-503")
    r, ex = call(c, proxy, t.token, "create", {"type": "unknown"}, ["unknown"])
    one_key("outcome-unknown", r, ex)
    expect("outcome-unknown: statuses sent", [x.sent_status for x in ex], [503, 201])
    expect("outcome-unknown: the first attempt committed", ex[0].upstream[0], 201)
    same_as_first("outcome-unknown", r, ex[0])
    gap = ex[1].started - ex[0].finished
    if gap < 1.0:
        fail(f"outcome-unknown: retried {gap:.3f} s after Retry-After: 1")
    expect("outcome-unknown: rows", t.counts(), (1, 1, 1))

    r, ex = call(c, proxy, t.token, "create", {"type": "unavailable"}, ["unavailable"])
    one_key("unavailable", r, ex)
    expect("unavailable: statuses sent", [x.sent_status for x in ex], [503, 201])
    expect("unavailable: the first attempt never reached the server", ex[0].upstream, None)
    expect("unavailable: the retry created", (r["status"], r.get("replayed")), (201, False))
    gap = ex[1].started - ex[0].finished
    if gap < 1.0:
        fail(f"unavailable: retried {gap:.3f} s after Retry-After: 1")
    expect("unavailable: rows", t.counts(), (2, 2, 2))
    say(f"ok - {c.name}: 503 outcome-unknown and unavailable retried with the same key "
          "after Retry-After; one workflow each")


def in_flight(c, proxy):
    t = Tenant(f"{c.name}-inflight")
    key = f"held-{uuid.uuid4()}"
    proxy.reset()
    hold = KeyHold(t, key)
    try:
        f = c.start(t.token, "create", {"type": "held"}, key)
        first = proxy.wait_for(lambda done: len(done) >= 1)[0]
    finally:
        hold.release()
    r = f.result(timeout=60)
    # The proxy notes an exchange finished after its answer went out: the
    # client may have read the last one first.
    ex = proxy.wait_for(lambda done: len(done) >= r["attempts"])
    expect("in-flight: the first answer", (first.upstream[0], first.sent_status), (409, 409))
    expect("in-flight: its problem type", json.loads(first.upstream[2])["type"],
           "https://idemflow.example/problems/idempotency-key-in-flight")
    expect("in-flight: its Retry-After", first.upstream[1].get("retry-after"), "1")
    expect("in-flight: result", (r["ok"], r["status"], r.get("replayed"), r["attempts"]),
           (True, 201, False, 2))
    expect("in-flight: requests", len(ex), 2)
    expect("in-flight: one key", {unquote(x.key) for x in ex}, {key})
    if ex[1].started - ex[0].finished < 1.0:
        fail("in-flight: retried sooner than Retry-After: 1")
    expect("in-flight: rows", t.counts(), (1, 1, 1))
    say(f"ok - {c.name}: 409 idempotency-key-in-flight waited for, then one workflow")


def never_retried(c, proxy):
    t = Tenant(f"{c.name}-final")
    key = f"reused-{uuid.uuid4()}"
    r, ex = call(c, proxy, t.token, "create", {"type": "first"}, key=key)
    expect("reuse: the first create", (r["status"], len(ex)), (201, 1))
    before = t.counts()
    r, ex = call(c, proxy, t.token, "create", {"type": "second"}, key=key)
    expect("reuse: answer", (r["ok"], r.get("error"), r["status"], r.get("problem_type")),
           (False, "ApiError", 409, "idempotency-key-reused"))
    expect("reuse: requests (never retried)", (r["attempts"], len(ex)), (1, 1))
    expect("reuse: rows", t.counts(), before)

    r, ex = call(c, proxy, t.token, "create", {"type": ""})
    expect("422: answer", (r["status"], r.get("problem_type"), len(ex)),
           (422, "invalid-workflow", 1))
    r, ex = call(c, proxy, "idf_not-a-token", "create", {"type": "x"})
    expect("401: answer", (r["status"], r.get("problem_type"), len(ex)), (401, "unauthorized", 1))
    r, ex = call(c, proxy, t.token, "complete",
                 {"job_key": f"{uuid.uuid4()}.s1", "worker": "w"})
    expect("404: answer", (r["status"], r.get("problem_type"), len(ex)), (404, "not-found", 1))
    expect("rows after the refusals", t.counts(), before)
    say(f"ok - {c.name}: 409 idempotency-key-reused, 422, 401, 404: one request each, "
          "never retried")


def bounded(c, proxy):
    t = Tenant(f"{c.name}-bounds")
    r, ex = call(c, proxy, t.token, "create", {"type": "lost"}, ["drop"] * 3, max_attempts=3)
    expect("max_attempts: gave up", (r.get("error"), r["attempts"], len(ex)),
           ("RetriesExhausted", 3, 3))
    key = one_key("max_attempts", r, ex)
    expect("max_attempts: the first attempt committed", t.counts(), (1, 1, 1))
    r2, ex2 = call(c, proxy, t.token, "create", {"type": "lost"}, key=key)
    expect("a later call with the key: one request", len(ex2), 1)
    same_as_first("a later call with the key", r2, ex[0])
    expect("max_attempts: still one workflow", t.counts(), (1, 1, 1))

    r, ex = call(c, proxy, t.token, "create", {"type": "late"}, ["unavailable:30"],
                 deadline=2.0)
    expect("deadline: gave up at once", (r.get("error"), r["attempts"], r["status"], len(ex)),
           ("RetriesExhausted", 1, 503, 1))
    if r["ms"] > 10000:  # not the 30 s wait (the bound is loose: a busy machine)
        fail(f"deadline: took {r['ms']:.0f} ms to give up on Retry-After: 30")
    expect("deadline: nothing created", t.counts(), (1, 1, 1))
    say(f"ok - {c.name}: max_attempts gives up with the key, whose retry replays; "
          "a Retry-After past the deadline gives up without waiting")


def jobs_and_messages(c, proxy):
    t = Tenant(f"{c.name}-jobs")
    jt = f"pick-{uuid.uuid4().hex[:8]}"
    bk = f"O-{uuid.uuid4().hex[:8]}"
    steps = [{"name": "pick", "job_type": jt}, {"name": "await", "wait_for": "paid"}]
    r, ex = call(c, proxy, t.token, "create",
                 {"type": "order", "business_key": bk, "steps": steps, "priority": 4}, ["drop"])
    same_as_first("create with steps", r, ex[0])
    wf = json.loads(r["body"])["id"]

    r, ex = call(c, proxy, t.token, "activate",
                 {"job_type": jt, "worker": "w-1", "lease_seconds": 60}, ["drop"])
    one_key("activate", r, ex)
    same_as_first("activate", r, ex[0])
    jobs = json.loads(r["body"])["jobs"]
    expect("activate: the lost answer's job, not an empty list, of the workflow's priority",
           [(j["workflow_id"], j["step"], j["activations"], j["priority"]) for j in jobs],
           [(wf, 1, 1, 4)])
    job = jobs[0]["key"]

    r, ex = call(c, proxy, t.token, "heartbeat",
                 {"job_key": job, "worker": "w-1", "progress": {"done": 1}}, ["drop"])
    one_key("heartbeat", r, ex)
    same_as_first("heartbeat", r, ex[0])

    r, ex = call(c, proxy, t.token, "complete",
                 {"job_key": job, "worker": "w-1", "output": {"picked": True}}, ["unknown"])
    one_key("complete", r, ex)
    same_as_first("complete", r, ex[0])

    msg = f"pay-{uuid.uuid4().hex[:8]}"
    r, ex = call(c, proxy, t.token, "publish",
                 {"name": "paid", "business_key": bk, "message_id": msg,
                  "payload": {"amount": 42}}, ["drop", "drop"])
    one_key("publish", r, ex)
    same_as_first("publish", r, ex[0])
    got = json.loads(r["body"])
    expect("publish: correlated once", (got["duplicate"], got["correlated"], got["workflow_id"]),
           (False, True, wf))

    r, ex = call(c, proxy, t.token, "get", {"id": wf})
    expect("the workflow", (r["status"], json.loads(r["body"])["state"]), (200, "completed"))
    events = psql(f"SELECT string_agg(type, ' ' ORDER BY seq) FROM outbox "
                  f"WHERE tenant_id = {t.id}")
    expect("its events, each once", events,
           "workflow.created workflow.started job.completed job.completed workflow.completed")
    expect("its job rows", psql(f"SELECT count(*) || ' ' || max(activations) FROM jobs "
                                f"WHERE tenant_id = {t.id}"), "2 1")
    say(f"ok - {c.name}: activate, heartbeat, complete and publish, each answer lost: "
          "one activation, one completion, one message, the workflow completed")


def run_client(cls, upstream):
    """Every scenario with one client behind a proxy of its own; the
    status (0 or 1)."""
    proxy = faultproxy.FaultProxy(*upstream).start()
    c = cls(proxy.url)
    rc = 0
    try:
        for s in SCENARIOS:
            try:
                s(c, proxy)
            except Failure as e:
                say(f"not ok - {c.name}: {s.__name__}: {e}")
                rc = 1
            except Exception:  # a broken client or test: report, go on
                say(f"not ok - {c.name}: {s.__name__}:\n{traceback.format_exc()}")
                rc = 1
    finally:
        c.close()
        proxy.close()
    return rc


SCENARIOS = [lost_answers, outcome_unknown_and_unavailable, in_flight, never_retried, bounded,
             jobs_and_messages]


def main():
    upstream = (os.environ.get("IDEMFLOW_HOST", "127.0.0.1"), os.environ["IDEMFLOW_PORT"])
    clients = [PythonClient]
    if shutil.which("node"):
        clients.append(NodeClient)
    # The clients side by side (tenants and proxies of their own): their
    # Retry-After waits overlap.
    with concurrent.futures.ThreadPoolExecutor(len(clients)) as pool:
        rc = max(pool.map(lambda cls: run_client(cls, upstream), clients))
    if rc == 0 and NodeClient not in clients:
        say("skip - node: not found (scripts/deps installs nodejs)")
        return 77
    return rc


if __name__ == "__main__":
    sys.exit(main())
