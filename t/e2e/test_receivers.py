#!/usr/bin/python3
"""t/e2e/test_receivers.py - the webhook receiver snippets apply each event once.

Run by t/run-test with the e2e stack; the events are the real ones of
workflows created through nginx, delivered by the real idemflow-dispatch
(http sink). Each snippet, app/clients/python/webhook_receiver.py (its
effects in SQLite) and app/clients/node/webhook-receiver.mjs (its effects
printed), runs as the receiver, behind t/lib/faultproxy.py. For each it
proves, with exact counts:

- a delivery whose answer is lost after the receiver applied it is sent
  again by the dispatcher, with the same webhook-id, and the redelivery
  is answered 200 as a duplicate without a second effect: 3 events, 4
  deliveries, 3 effects;
- the receiver holds two secrets (as while rotating) and accepts the
  dispatcher's signature made with either;
- a dispatcher rotating its secret (secret and secret_previous) signs
  with both at once, "v1,<new> v1,<previous>": a receiver holding only
  the previous secret and one holding only the new one each apply the
  event once;
- a dispatcher signing with a secret the receiver does not hold is refused
  with 401, nothing applied, the event dead at once (a final 4xx); once
  requeued and signed with the right secret it is applied once;
- a body changed after signing is refused with 401 and not applied, nor
  its id recorded: the same event, untampered, is then applied; a
  signature older than five minutes is refused; a header carrying a bad
  signature next to a good one is accepted.
"""

import base64
import hashlib
import hmac
import http.client
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
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


def new_secret():
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


SECRET = new_secret()  # the dispatcher's
OLD = new_secret()  # the receiver's other one, as while rotating
WRONG = new_secret()  # nobody's


class Failure(Exception):
    pass


def fail(msg):
    raise Failure(msg)


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


class Receiver:
    """A snippet running as a program: its stdout lines, as they come."""

    def __init__(self, kind, tmp, secrets=None, name=None):
        self.kind = kind
        self.db = os.path.join(tmp, f"{name or kind}-inbox.sqlite3")
        if kind == "python":
            argv = [sys.executable, os.path.join(TOP, "app", "clients", "python",
                                                 "webhook_receiver.py"),
                    "--port", "0", "--db", self.db]
        else:
            argv = ["node", os.path.join(TOP, "app", "clients", "node", "webhook-receiver.mjs"),
                    "--port", "0"]
        env = dict(os.environ, WEBHOOK_SECRET=secrets or f"{OLD} {SECRET}",
                   PYTHONDONTWRITEBYTECODE="1")
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
        first = self.p.stdout.readline().strip()
        if not first.startswith("listening on http://127.0.0.1:"):
            fail(f"{kind} receiver: {first!r}")
        self.port = int(first.rsplit(":", 1)[1].strip("/"))
        self._lines = []
        self._cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            with self._cv:
                self._lines.append(line.split())
                self._cv.notify_all()

    def lines(self, n, timeout=10.0):
        """The first n lines, waiting for them (a line is printed as its
        delivery is decided)."""
        end = time.monotonic() + timeout
        with self._cv:
            while len(self._lines) < n:
                if not self._cv.wait(end - time.monotonic()):
                    fail(f"{self.kind} receiver: {len(self._lines)} lines, waited for {n}: "
                         f"{self._lines}")
            return list(self._lines)

    def outcomes(self, n):
        """(outcome, event id, status) of each decided delivery."""
        return [tuple(x) for x in self.lines(n) if x[0] != "effect"]

    def effects(self, n_lines):
        """The event ids the effect was applied to, in order."""
        if self.kind == "python":
            db = sqlite3.connect(self.db)
            try:
                return [r[0] for r in db.execute("SELECT event_id FROM effects ORDER BY rowid")]
            finally:
                db.close()
        return [x[1] for x in self.lines(n_lines) if x[0] == "effect"]

    def stop(self):
        self.p.terminate()
        self.p.wait(timeout=10)


def dispatch(url, secret, previous=None):
    """One idemflow-dispatch --once run; its exit status and log."""
    rotating = ["--secret-previous", previous] if previous else []
    r = subprocess.run([os.environ["IDEMFLOW_DISPATCH"], "--db", os.environ["DATABASE_URL"],
                        "--sink", "http", "--url", url, "--secret", secret, *rotating, "--once",
                        "--backoff", "100ms", "--timeout", "5s", "--parallel", "2"],
                       capture_output=True, text=True, timeout=60)
    return r.returncode, r.stderr


def pending():
    return int(psql("SELECT count(*) FROM outbox WHERE published_at IS NULL AND dead_at IS NULL"))


def drain(url, secret, runs=30, previous=None):
    """Dispatch until nothing is pending (a failed attempt is due again
    after the 100 ms backoff); the number of runs."""
    for n in range(1, runs + 1):
        rc, log = dispatch(url, secret, previous)
        if rc != 0:
            fail(f"idemflow-dispatch exited {rc}: {log}")
        if pending() == 0:
            return n
        time.sleep(0.1)
    fail(f"{pending()} events still pending after {runs} dispatcher runs")


def outbox(ids):
    rows = psql("SELECT event_id || ' ' || attempts || ' ' || (published_at IS NOT NULL) || ' ' "
                "|| (dead_at IS NOT NULL) FROM outbox WHERE event_id IN ("
                + ",".join(f"'{i}'" for i in ids) + ") ORDER BY event_id")
    return {r.split()[0]: tuple(r.split()[1:]) for r in rows.splitlines()}


def sign(secret, msg_id, ts, body):
    key = base64.b64decode(secret[len("whsec_"):])
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def post(port, headers, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/hooks/idemflow", body=body,
                     headers={"Content-Type": "application/json", **headers})
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


class Run:
    def __init__(self, client, kind, tmp):
        self.client = client
        self.rcv = Receiver(kind, tmp)
        self.proxy = faultproxy.FaultProxy("127.0.0.1", self.rcv.port).start()
        self.url = self.proxy.url + "/hooks/idemflow"
        self.kind = kind
        self.tmp = tmp
        self.n_lines = 0  # lines the receiver printed so far
        self.applied = []  # event ids applied, in order

    def create(self, n):
        """n workflows; their workflow.created event ids."""
        return [json.loads(self.client.create_workflow(f"hook-{self.kind}").body)["id"] + ".1"
                for _ in range(n)]

    def expect_lines(self, what, want_outcomes, want_effects):
        self.n_lines += len(want_outcomes) + (len(want_effects) if self.kind == "node" else 0)
        got = self.rcv.outcomes(self.n_lines)[-len(want_outcomes):] if want_outcomes else []
        expect(f"{what}: the receiver's answers", sorted(got), sorted(want_outcomes))
        self.applied += want_effects
        effects = self.rcv.effects(self.n_lines)
        expect(f"{what}: the effects, each event once", sorted(effects), sorted(self.applied))
        self.proxy.reset()

    def redelivery(self):
        ids = self.create(3)
        self.proxy.reset()
        self.proxy.plan(["drop"])
        drain(self.url, SECRET)
        ex = self.proxy.wait_for(lambda d: len(d) == len(self.proxy.log))
        expect("redelivery: deliveries", len(ex), 4)
        for x in ex:
            if x.error:
                fail(f"redelivery: the proxy failed on {x}: {x.error}")
        lost = ex[[x.action for x in ex].index("drop")]
        lost_id = lost.headers["webhook-id"]
        sent = sorted(x.headers["webhook-id"] for x in ex)
        expect("redelivery: the ids delivered", sent, sorted(ids + [lost_id]))
        again = [x for x in ex if x.headers["webhook-id"] == lost_id][1]
        expect("redelivery: the same event bytes", again.body, lost.body)
        expect("redelivery: the lost answer said", (lost.upstream[0], json.loads(lost.upstream[2])),
               (200, {"outcome": "applied"}))
        expect("redelivery: the redelivery's answer",
               (again.sent_status, json.loads(again.upstream[2])), (200, {"outcome": "duplicate"}))
        self.expect_lines("redelivery",
                          [("applied", i, "200") for i in ids] + [("duplicate", lost_id, "200")],
                          ids)
        want = {i: ("1", "true", "false") for i in ids}
        want[lost_id] = ("2", "true", "false")
        expect("redelivery: the outbox (attempts, published, dead)", outbox(ids), want)
        print(f"ok - {self.kind}: 3 events, one answer lost: 4 deliveries, the redelivery a "
              "duplicate, 3 effects")

    def wrong_secret(self):
        (eid,) = self.create(1)
        self.proxy.reset()
        rc, log = dispatch(self.url, WRONG)
        expect(f"dispatch with the wrong secret: exit status ({log})", rc, 0)
        expect("wrong secret: the outbox", outbox([eid]), {eid: ("1", "false", "true")})
        self.expect_lines("wrong secret",
                          [("refused:no-v1-signature-matches", eid, "401")], [])
        cli("outbox", "requeue", eid)
        drain(self.url, SECRET)
        self.expect_lines("requeued", [("applied", eid, "200")], [eid])
        expect("requeued (attempts start again): the outbox", outbox([eid]),
               {eid: ("1", "true", "false")})
        print(f"ok - {self.kind}: a signature with another secret refused with 401, nothing "
              "applied, the event dead; requeued, applied once")

    def tampered(self):
        eid = f"{uuid.uuid4()}.1"
        event = {"id": eid, "type": "workflow.created", "workflow_id": eid[:-2], "seq": 1,
                 "data": {"amount": 10}}
        body = json.dumps(event, separators=(",", ":")).encode()
        ts = str(int(time.time()))
        h = {"webhook-id": eid, "webhook-timestamp": ts,
             "webhook-signature": sign(SECRET, eid, ts, body)}
        bad = body.replace(b'"amount":10', b'"amount":99')
        expect("a tampered body: answer", post(self.rcv.port, h, bad),
               (401, {"outcome": "refused:no-v1-signature-matches"}))
        self.expect_lines("tampered", [("refused:no-v1-signature-matches", eid, "401")], [])
        old = str(int(time.time()) - 600)
        h_old = dict(h, **{"webhook-timestamp": old,
                           "webhook-signature": sign(SECRET, eid, old, body)})
        expect("a signature ten minutes old: answer", post(self.rcv.port, h_old, body),
               (401, {"outcome": "refused:webhook-timestamp-is-too-far-from-now"}))
        self.expect_lines("old", [("refused:webhook-timestamp-is-too-far-from-now", eid, "401")],
                          [])
        h_two = dict(h, **{"webhook-signature": sign(WRONG, eid, ts, body) + " "
                           + h["webhook-signature"]})
        expect("the untampered event, a bad signature beside the good one",
               post(self.rcv.port, h_two, body), (200, {"outcome": "applied"}))
        expect("the untampered event again", post(self.rcv.port, h, body),
               (200, {"outcome": "duplicate"}))
        self.expect_lines("untampered", [("applied", eid, "200"), ("duplicate", eid, "200")],
                          [eid])
        print(f"ok - {self.kind}: a tampered body and a stale timestamp refused with 401, "
              "not applied; the event itself applied once")

    def rotation(self):
        """The dispatcher signs with the new secret and the previous one;
        a receiver holding either alone applies the event."""
        new, previous = new_secret(), new_secret()
        for held, which in ((previous, "previous"), (new, "new")):
            rcv = Receiver(self.kind, self.tmp, secrets=held, name=f"{self.kind}-{which}")
            try:
                url = f"http://127.0.0.1:{rcv.port}/hooks/idemflow"
                (eid,) = self.create(1)
                drain(url, new, previous=previous)
                want = [("applied", eid, "200")]
                n = 2 if self.kind == "node" else 1
                expect(f"rotation, a receiver holding only the {which} secret: its answers",
                       rcv.outcomes(n), want)
                expect(f"rotation, only the {which} secret: the effects", rcv.effects(n), [eid])
                expect(f"rotation, only the {which} secret: the outbox", outbox([eid]),
                       {eid: ("1", "true", "false")})
            finally:
                rcv.stop()
        print(f"ok - {self.kind}: signed with a new and a previous secret at once, applied by "
              "a receiver holding only the previous one and by one holding only the new one")

    def close(self):
        self.proxy.close()
        self.rcv.stop()


def main():
    name = f"hooks-{uuid.uuid4().hex[:12]}"
    cli("tenant", "create", name)
    token = cli("token", "create", "--tenant", name)
    client = idemflow_client.Client(os.environ["IDEMFLOW_URL"], token)
    kinds = ["python"] + (["node"] if shutil.which("node") else [])
    rc = 0
    with tempfile.TemporaryDirectory(prefix="idemflow-hooks.") as tmp:
        for kind in kinds:
            run = Run(client, kind, tmp)
            try:
                for step in (run.redelivery, run.wrong_secret, run.tampered, run.rotation):
                    try:
                        step()
                    except Failure as e:
                        print(f"not ok - {kind}: {step.__name__}: {e}")
                        rc = 1
                    except Exception:
                        print(f"not ok - {kind}: {step.__name__}:\n{traceback.format_exc()}")
                        rc = 1
            finally:
                run.close()
    if rc == 0 and "node" not in kinds:
        print("skip - node: not found (scripts/deps installs nodejs)")
        return 77
    return rc


if __name__ == "__main__":
    sys.exit(main())
