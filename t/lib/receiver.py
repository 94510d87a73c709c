#!/usr/bin/env python3
"""receiver.py - a webhook receiver for the dispatcher tests (stdlib only; --inbox
also needs python3-psycopg2).

Listens on 127.0.0.1 (port 0 = any free port) with HTTP/1.1 keep-alive and
prints the port it got as the first line of stdout. Every POST except
/_control is a delivery: it is recorded, answered, and appended as one JSON
line to the --log file (flushed per line), failures included:

  {"seq": 1, "time": 1700000000.123, "conn": 1, "peer": "127.0.0.1:40312",
   "method": "POST", "path": "/hook", "http_version": "HTTP/1.1",
   "webhook_id": "...", "webhook_timestamp": "...", "webhook_signature": "...",
   "idempotency_key": "...", "content_type": "...", "user_agent": "...",
   "traceparent": "...", "tracestate": "...",
   "body": "...", "body_len": 42, "status": 200, "retry_after": null,
   "truncated": false, "duplicate": false, "signature_valid": null}

A missing header is null. "conn" numbers the TCP connections in the order
they were accepted, so reuse shows as one number across deliveries.
"duplicate" is true when an earlier delivery of the same webhook-id was
answered 2xx. With --secret, "signature_valid" is this script's own
Standard Webhooks check of the delivery (Python's hmac, independent of the
C code under test); without it, null. A delivery is logged when it has been decided, before any
delay_ms and before the answer is written: like a real receiver that
processed the event and then lost its client.

With --inbox DSN the receiver is also a consumer with an inbox
(t/lib/inbox.py over idemflow's shipped inbox, in the PostgreSQL database
DSN names, as consumer --consumer, transport --via; it needs
python3-psycopg2, nothing else does): a delivery it would answer 2xx is
applied through the inbox, keyed by its webhook-id, before it is logged
and answered, and "inbox" in its line says "applied" or "duplicate" (a
redelivery whose effect was skipped); null when not applied. An inbox
that cannot record the delivery makes the answer 503.

POST /_control takes a JSON object; the members given replace the current
settings, the others stay (send {"reset": true} to restore the defaults):

  fail_next       answer the next N deliveries with "status"       (0)
  status          status for fail_next and fail_rate               (503)
  retry_after     seconds sent as Retry-After with failures, or null (null)
  fail_rate       fraction of deliveries failed at random (--seed) (0.0)
  drop_rate       fraction of the others dropped at random: the
                  connection closed with no answer at all, logged
                  with status 0 (a receiver that dies or a network
                  that drops the request)                          (0.0)
  fail_ids        webhook-ids always answered "status_for_ids"     ([])
  status_for_ids                                                   (400)
  delay_ms        wait this long before every delivery's answer    (0)
  ok_status       status of a successful delivery                  (200)
  truncate_next   the next N answers announce a longer body than
                  they send, then close the connection (a receiver
                  dying mid-answer)                                (0)
  location        a Location header sent with failures, or null:
                  its UTF-8 bytes as they are, and a lone surrogate
                  \\udcXX as the raw byte XX (not UTF-8)           (null)

Precedence: fail_ids, then fail_next, then fail_rate, then drop_rate. It answers 200 with
the resulting settings. GET /_deliveries answers the JSON list of every
delivery so far.
"""

import argparse
import base64
import binascii
import hashlib
import hmac
import json
import os
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEFAULTS = {
    "fail_next": 0,
    "status": 503,
    "retry_after": None,
    "fail_rate": 0.0,
    "drop_rate": 0.0,
    "fail_ids": [],
    "status_for_ids": 400,
    "delay_ms": 0,
    "ok_status": 200,
    "truncate_next": 0,
    "location": None,
}

HEADERS = {
    "webhook_id": "webhook-id",
    "webhook_timestamp": "webhook-timestamp",
    "webhook_signature": "webhook-signature",
    "idempotency_key": "idempotency-key",
    "content_type": "content-type",
    "user_agent": "user-agent",
    "traceparent": "traceparent",
    "tracestate": "tracestate",
}


class State:
    """Everything the handler threads share, behind one lock."""

    def __init__(self, log_path, seed, key, inbox=None):
        self.key = key
        self.inbox = inbox
        self.inbox_error = ()  # the inbox's exception class, when there is one
        self.lock = threading.Lock()
        self.settings = json.loads(json.dumps(DEFAULTS))
        self.rng = random.Random(seed)
        self.log = open(log_path, "a", encoding="utf-8")
        self.deliveries = []
        self.acked = set()
        self.conns = 0

    def control(self, update):
        unknown = sorted(set(update) - set(DEFAULTS) - {"reset"})
        if unknown:
            raise ValueError("unknown setting %s" % ", ".join(unknown))
        with self.lock:
            if update.get("reset"):
                self.settings = json.loads(json.dumps(DEFAULTS))
            self.settings.update({k: v for k, v in update.items() if k != "reset"})
            return dict(self.settings)

    def signature_valid(self, headers, body):
        if self.key is None:
            return None
        if None in (headers["webhook_id"], headers["webhook_timestamp"],
                    headers["webhook_signature"]):
            return False
        content = b"%s.%s.%s" % (headers["webhook_id"].encode(),
                                 headers["webhook_timestamp"].encode(), body)
        want = b"v1," + base64.b64encode(hmac.new(self.key, content, hashlib.sha256).digest())
        # Bytes: compare_digest refuses non-ASCII text, and a header may hold any.
        return any(hmac.compare_digest(want, sig.encode("utf-8", "surrogateescape"))
                   for sig in headers["webhook_signature"].split(" "))

    def decide(self, event_id):
        """The status to answer, and whether it counts as a failure."""
        s = self.settings
        if event_id is not None and event_id in s["fail_ids"]:
            return s["status_for_ids"], True
        if s["fail_next"] > 0:
            s["fail_next"] -= 1
            return s["status"], True
        if s["fail_rate"] > 0 and self.rng.random() < s["fail_rate"]:
            return s["status"], True
        if s["drop_rate"] > 0 and self.rng.random() < s["drop_rate"]:
            return 0, True
        return s["ok_status"], False

    def record(self, handler, body):
        with self.lock:
            headers = {k: handler.headers.get(h) for k, h in HEADERS.items()}
            status, failed = self.decide(headers["webhook_id"])
            applied = None
            if self.inbox is not None and not failed and headers["webhook_id"] is not None:
                try:
                    applied = self.inbox.claim(headers["webhook_id"], _workflow_of(body))
                except self.inbox_error:
                    status, failed = 503, True
            retry_after = self.settings["retry_after"] if failed else None
            location = self.settings["location"] if failed else None
            truncate = self.settings["truncate_next"] > 0
            if truncate:
                self.settings["truncate_next"] -= 1
            entry = {
                "seq": len(self.deliveries) + 1,
                "time": time.time(),
                "conn": handler.conn,
                "peer": "%s:%d" % handler.client_address[:2],
                "method": handler.command,
                "path": handler.path,
                "http_version": handler.request_version,
            }
            entry.update(headers)
            entry.update({
                "body": body.decode("utf-8", errors="replace"),
                "body_len": len(body),
                "status": status,
                "retry_after": retry_after,
                "truncated": truncate,
                "signature_valid": self.signature_valid(headers, body),
                "duplicate": headers["webhook_id"] in self.acked,
                "inbox": applied,
            })
            if 200 <= status < 300 and headers["webhook_id"] is not None:
                self.acked.add(headers["webhook_id"])
            self.deliveries.append(entry)
            self.log.write(json.dumps(entry) + "\n")
            self.log.flush()
            return entry, self.settings["delay_ms"], location


def _workflow_of(body):
    try:
        return json.loads(body).get("workflow_id")
    except (ValueError, AttributeError):
        return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive unless the client says close
    # Headers and body are separate writes: with Nagle on, the body waits
    # for the client's delayed ACK (40 ms) on every kept-alive request.
    disable_nagle_algorithm = True
    server_version = "idemflow-test-receiver"
    state = None  # set in main()

    def setup(self):
        super().setup()
        with self.state.lock:
            self.state.conns += 1
            self.conn = self.state.conns

    def log_message(self, fmt, *args):
        pass  # the --log file is the record; stderr stays quiet

    def read_body(self):
        if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def answer(self, status, obj, extra=(), truncate=False):
        data = (json.dumps(obj) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data) + (100 if truncate else 0)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        if truncate:
            self.close_connection = True

    def do_GET(self):
        if self.path == "/_deliveries":
            with self.state.lock:
                snapshot = list(self.state.deliveries)
            self.answer(200, snapshot)
        else:
            self.answer(404, {"error": "not found"})

    def do_POST(self):
        body = self.read_body()
        if self.path == "/_control":
            try:
                update = json.loads(body or b"{}")
                if not isinstance(update, dict):
                    raise ValueError("not a JSON object")
                self.answer(200, self.state.control(update))
            except ValueError as exc:
                self.answer(400, {"error": str(exc)})
            return
        entry, delay_ms, location = self.state.record(self, body)
        if entry["status"] == 0:
            self.close_connection = True  # dropped: no answer at all
            return
        if delay_ms:
            time.sleep(delay_ms / 1000.0)
        extra = []
        if entry["retry_after"] is not None:
            extra.append(("Retry-After", str(entry["retry_after"])))
        if location is not None:
            # http.server writes header values as Latin-1: one byte each.
            raw = location.encode("utf-8", errors="surrogateescape")
            extra.append(("Location", raw.decode("latin-1")))
        try:
            self.answer(entry["status"], {"seq": entry["seq"]}, extra, entry["truncated"])
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up; it is logged already


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--log", required=True, help="append one JSON line per delivery here")
    ap.add_argument("--port", type=int, default=0, help="0 = any free port")
    ap.add_argument("--seed", type=int, default=0, help="seed of fail_rate's choices")
    ap.add_argument("--secret", help="check signatures: whsec_<base64> or raw text")
    ap.add_argument("--inbox", help="apply deliveries through an inbox in this PostgreSQL "
                    "database (a libpq connection string)")
    ap.add_argument("--consumer", default="idemflow-test", help="the consumer's name in the inbox")
    ap.add_argument("--via", default="http", help="this transport's name in the effects")
    args = ap.parse_args()

    key = None
    if args.secret is not None:
        if args.secret.startswith("whsec_"):
            try:
                key = base64.b64decode(args.secret[len("whsec_"):], validate=True)
            except binascii.Error:
                ap.error("--secret: not base64 after whsec_")
        else:
            key = args.secret.encode()
    inbox = None
    if args.inbox is not None:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from inbox import Error as InboxError, Inbox  # noqa: E402 - next to this script
        inbox = Inbox(args.inbox, args.consumer, args.via)
    Handler.state = State(args.log, args.seed, key, inbox)
    if inbox is not None:
        Handler.state.inbox_error = InboxError
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
