"""webhook_receiver - receive idemflow's webhooks and apply each event once
(Python 3.8+, standard library only: http.server, hmac, sqlite3).

idemflow-dispatch delivers every event at least once: after a lost answer,
a timeout or a crash it sends the same event again, with the same id. This
receiver makes the effect happen once all the same:

1. verify the Standard Webhooks signature over the body's raw bytes:
   webhook-signature holds one or more "v1,<base64 HMAC-SHA256 of
   id.timestamp.body>" separated by spaces (several while a secret is
   rotated; any match will do), webhook-timestamp must be within five
   minutes of now (an old delivery replayed by someone else is refused);
   a secret "whsec_<base64>" is the decoded bytes, any other secret its
   own bytes, as idemflow-dispatch takes it. A bad or missing signature is
   401 and nothing is applied: the dispatcher treats a 4xx other than 408
   and 429 as final (the event is dead until an operator requeues it);
2. in one SQLite transaction, record the event id in an inbox table and,
   only when the id is new, apply the effect with the same connection:
   both commit or neither. A redelivery finds the id and is answered 200
   without a second effect. A failure rolls both back and answers 500, so
   the event comes again.

The effect here (apply_event) writes one row to a table; replace it with
yours, keeping it on the connection it is given. With PostgreSQL, the
same shape is idemflow's consumer inbox (doc/clients.md).

    WEBHOOK_SECRET='whsec_...' python3 webhook_receiver.py --db inbox.sqlite3 --port 8000

WEBHOOK_SECRET may hold several secrets separated by spaces (the old and
the new one while rotating). The secret is read from the environment, not
the command line, which other users can read.

MIT licensed, like idemflow.
"""

import argparse
import base64
import binascii
import hashlib
import hmac
import json
import os
import sqlite3
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOLERANCE = 300  # seconds between webhook-timestamp and now, either way
MAX_BODY = 16 * 1024 * 1024


class InvalidSignature(Exception):
    pass


def secret_key(secret):
    """The HMAC key of a secret, as idemflow-dispatch reads it."""
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret[len("whsec_"):], validate=True)
        except binascii.Error as e:
            raise ValueError("the text after whsec_ is not base64") from e
    return secret.encode()


def verify(keys, headers, body, now=None, tolerance=TOLERANCE):
    """Check a delivery; returns its webhook-id, or raises InvalidSignature.
    keys: HMAC keys (secret_key()); headers: a mapping whose get() finds
    the webhook-* headers; body: the raw bytes as received."""
    msg_id = headers.get("webhook-id")
    ts = headers.get("webhook-timestamp")
    sigs = headers.get("webhook-signature")
    if not msg_id or not ts or not sigs:
        raise InvalidSignature("missing webhook-id, webhook-timestamp or webhook-signature")
    if not ts.isdigit():
        raise InvalidSignature("webhook-timestamp is not unix seconds")
    now = time.time() if now is None else now
    if abs(now - int(ts)) > tolerance:
        raise InvalidSignature("webhook-timestamp is too far from now")
    signed = f"{msg_id}.{ts}.".encode() + body
    expected = [base64.b64encode(hmac.new(k, signed, hashlib.sha256).digest()).decode()
                for k in keys]
    for entry in sigs.split(" "):
        version, _, sig = entry.partition(",")
        if version != "v1":
            continue
        # compare_digest: the time taken tells nothing about the expected value.
        if any(hmac.compare_digest(sig, e) for e in expected):
            return msg_id
    raise InvalidSignature("no v1 signature matches")


SCHEMA = """
CREATE TABLE IF NOT EXISTS inbox (
    event_id    TEXT PRIMARY KEY,
    received_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS effects (
    event_id    TEXT PRIMARY KEY,
    type        TEXT NOT NULL,
    workflow_id TEXT
);
"""


def apply_event(db, event):
    """The effect: yours goes here, on db, inside the inbox's transaction."""
    db.execute("INSERT INTO effects (event_id, type, workflow_id) VALUES (?, ?, ?)",
               (event["id"], event["type"], event.get("workflow_id")))


class Inbox:
    """Event ids already applied, in the SQLite file path."""

    def __init__(self, path):
        self.path = path
        with self._connect() as db:
            db.executescript(SCHEMA)

    def _connect(self):
        # isolation_level=None: this code says BEGIN and COMMIT itself.
        return sqlite3.connect(self.path, timeout=30, isolation_level=None)

    def process(self, event, apply=apply_event):
        """Apply event once: "applied", or "duplicate" when its id was
        applied before. Raises (and keeps nothing) when apply fails."""
        db = self._connect()
        try:
            # IMMEDIATE takes the write lock now: two deliveries of one id
            # at once queue here, and the second finds the first's row.
            db.execute("BEGIN IMMEDIATE")
            cur = db.execute("INSERT OR IGNORE INTO inbox (event_id, received_at) VALUES (?, ?)",
                             (event["id"], time.time()))
            if cur.rowcount == 0:
                db.execute("ROLLBACK")
                return "duplicate"
            apply(db, event)
            db.execute("COMMIT")
            return "applied"
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        finally:
            db.close()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the dispatcher uses it
    keys = []
    inbox = None

    def _answer(self, status, outcome, event_id=None):
        print(f"{outcome} {event_id or '-'} {status}", flush=True)
        body = json.dumps({"outcome": outcome}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            self.close_connection = True
            return self._answer(413, "too-large")
        body = self.rfile.read(n)
        try:
            event_id = verify(self.keys, self.headers, body)
        except InvalidSignature as e:
            return self._answer(401, f"refused:{str(e).replace(' ', '-')}",
                                self.headers.get("webhook-id"))
        try:
            event = json.loads(body)
        except ValueError:
            return self._answer(400, "invalid-json", event_id)
        if not isinstance(event, dict) or event.get("id") != event_id:
            return self._answer(400, "id-mismatch", event_id)
        try:
            outcome = self.inbox.process(event)
        except Exception as e:  # nothing kept: the dispatcher sends it again
            print(f"error applying {event_id}: {e}", file=sys.stderr, flush=True)
            return self._answer(500, "failed", event_id)
        self._answer(200, outcome, event_id)

    def log_message(self, fmt, *args):  # one line per delivery is printed above
        pass


def main():
    ap = argparse.ArgumentParser(description="Receive idemflow webhooks, apply each once.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0: any free port")
    ap.add_argument("--db", required=True, help="the SQLite file of the inbox and effects")
    args = ap.parse_args()
    secrets = os.environ.get("WEBHOOK_SECRET", "").split()
    if not secrets:
        sys.exit("webhook_receiver: set WEBHOOK_SECRET (whsec_... ; several, space-separated, "
                 "while rotating)")
    Handler.keys = [secret_key(s) for s in secrets]
    Handler.inbox = Inbox(args.db)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"listening on http://{args.host}:{server.server_address[1]}/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
