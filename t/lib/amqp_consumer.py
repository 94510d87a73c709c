#!/usr/bin/env python3
"""amqp_consumer.py - a RabbitMQ consumer with an inbox, for tests (stdlib and
python3-psycopg2, for the inbox).

The RabbitMQ counterpart of receiver.py: it declares the exchange the
dispatcher's amqp sink publishes to (a durable topic exchange), a durable
queue bound to it with a binding key, and consumes with manual
acknowledgements. Every message is applied through the inbox
(t/lib/inbox.py over idemflow's shipped inbox, in the PostgreSQL database
--inbox names, as consumer --consumer), keyed by its message_id (the
event id), and acknowledged
only after the inbox committed: a consumer killed in between gets the
message again from the broker (redelivered), and the inbox drops it.

It prints "ready" on stdout once it consumes, and appends one JSON line
per message to --log (flushed per line):

  {"seq": 1, "time": 1700000000.1, "message_id": "...", "type": "...",
   "routing_key": "...", "redelivered": false, "delivery_tag": 1,
   "body_len": 412, "inbox": "applied" | "duplicate" | "error"}

A message whose inbox transaction failed is rejected with requeue, so it
comes again. Only what the consumer needs of AMQP 0-9-1 is here: PLAIN
login, one channel, no heartbeats; a lost connection ends the process
with status 1 (whoever runs it restarts it).

Usage: amqp_consumer.py --url amqp://guest:guest@127.0.0.1:5672/
           --exchange idemflow --queue NAME [--binding-key '#']
           --inbox DSN [--consumer NAME] [--via amqp] --log FILE [--prefetch 100]
"""

import argparse
import json
import os
import socket
import struct
import sys
import time
import urllib.parse

FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE

# (class, method) ids of AMQP 0-9-1.
CONNECTION_START, CONNECTION_START_OK = (10, 10), (10, 11)
CONNECTION_TUNE, CONNECTION_TUNE_OK = (10, 30), (10, 31)
CONNECTION_OPEN, CONNECTION_OPEN_OK = (10, 40), (10, 41)
CONNECTION_CLOSE, CONNECTION_CLOSE_OK = (10, 50), (10, 51)
CHANNEL_OPEN, CHANNEL_OPEN_OK = (20, 10), (20, 11)
CHANNEL_CLOSE = (20, 40)
EXCHANGE_DECLARE, EXCHANGE_DECLARE_OK = (40, 10), (40, 11)
QUEUE_DECLARE, QUEUE_DECLARE_OK = (50, 10), (50, 11)
QUEUE_BIND, QUEUE_BIND_OK = (50, 20), (50, 21)
BASIC_QOS, BASIC_QOS_OK = (60, 10), (60, 11)
BASIC_CONSUME, BASIC_CONSUME_OK = (60, 20), (60, 21)
BASIC_DELIVER = (60, 60)
BASIC_ACK = (60, 80)
BASIC_REJECT = (60, 90)


class AmqpError(Exception):
    pass


# ------------------------------------------------------------- encoding

def shortstr(s):
    b = s.encode()
    return struct.pack("B", len(b)) + b


def longstr(b):
    return struct.pack(">I", len(b)) + b


EMPTY_TABLE = struct.pack(">I", 0)


class Reader:
    """Reads AMQP fields from a method or header payload."""

    def __init__(self, data):
        self.data = data
        self.pos = 0

    def take(self, n):
        if self.pos + n > len(self.data):
            raise AmqpError("truncated frame")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def octet(self):
        return self.take(1)[0]

    def short(self):
        return struct.unpack(">H", self.take(2))[0]

    def long(self):
        return struct.unpack(">I", self.take(4))[0]

    def longlong(self):
        return struct.unpack(">Q", self.take(8))[0]

    def shortstr(self):
        return self.take(self.octet()).decode("utf-8", errors="replace")

    def longstr(self):
        return self.take(self.long())

    def skip_table(self):
        self.take(self.long())


# --------------------------------------------------------------- client

class Connection:
    def __init__(self, url, timeout=10):
        u = urllib.parse.urlsplit(url)
        if u.scheme != "amqp":
            raise AmqpError("not an amqp:// URL: %s" % url)
        self.vhost = urllib.parse.unquote(u.path[1:]) if len(u.path) > 1 else "/"
        self.sock = socket.create_connection((u.hostname or "127.0.0.1", u.port or 5672),
                                             timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self.expect(0, CONNECTION_START)
        user = urllib.parse.unquote(u.username or "guest")
        password = urllib.parse.unquote(u.password or "guest")
        self.method(0, CONNECTION_START_OK, EMPTY_TABLE + shortstr("PLAIN") +
                    longstr(b"\x00" + user.encode() + b"\x00" + password.encode()) +
                    shortstr("en_US"))
        tune = Reader(self.expect(0, CONNECTION_TUNE))
        channel_max, frame_max = tune.short(), tune.long()
        self.frame_max = frame_max or 131072
        # heartbeat 0: none; a test consumer lives minutes, on loopback.
        self.method(0, CONNECTION_TUNE_OK,
                    struct.pack(">HIH", channel_max or 1, self.frame_max, 0))
        self.method(0, CONNECTION_OPEN, shortstr(self.vhost) + shortstr("") + b"\x00")
        self.expect(0, CONNECTION_OPEN_OK)
        self.method(1, CHANNEL_OPEN, shortstr(""))
        self.expect(1, CHANNEL_OPEN_OK)

    # frames

    def send_frame(self, ftype, channel, payload):
        self.sock.sendall(struct.pack(">BHI", ftype, channel, len(payload)) + payload +
                          bytes([FRAME_END]))

    def method(self, channel, cm, args=b""):
        self.send_frame(FRAME_METHOD, channel, struct.pack(">HH", *cm) + args)

    def read_exact(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AmqpError("connection closed by the broker")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def frame(self):
        ftype, channel, size = struct.unpack(">BHI", self.read_exact(7))
        payload = self.read_exact(size)
        if self.read_exact(1)[0] != FRAME_END:
            raise AmqpError("bad frame end")
        return ftype, channel, payload

    def next_method(self):
        """The next method frame (heartbeats skipped): (channel, (class, method), Reader)."""
        while True:
            ftype, channel, payload = self.frame()
            if ftype == FRAME_HEARTBEAT:
                continue
            if ftype != FRAME_METHOD:
                raise AmqpError("unexpected frame type %d" % ftype)
            r = Reader(payload)
            cm = (r.short(), r.short())
            if cm in (CONNECTION_CLOSE, CHANNEL_CLOSE):
                code, text = r.short(), r.shortstr()
                raise AmqpError("broker closed the %s: %d %s" % (
                    "connection" if cm == CONNECTION_CLOSE else "channel", code, text))
            return channel, cm, r

    def expect(self, channel, cm):
        ch, got, r = self.next_method()
        if ch != channel or got != cm:
            raise AmqpError("expected method %s on channel %d, got %s on %d" %
                            (cm, channel, got, ch))
        return r.data[r.pos:]

    # what the consumer needs

    def setup(self, exchange, queue, binding_key, prefetch):
        # bits: passive, durable, auto-delete, internal, no-wait
        self.method(1, EXCHANGE_DECLARE, struct.pack(">H", 0) + shortstr(exchange) +
                    shortstr("topic") + bytes([0b00010]) + EMPTY_TABLE)
        self.expect(1, EXCHANGE_DECLARE_OK)
        # bits: passive, durable, exclusive, auto-delete, no-wait
        self.method(1, QUEUE_DECLARE, struct.pack(">H", 0) + shortstr(queue) +
                    bytes([0b00010]) + EMPTY_TABLE)
        self.expect(1, QUEUE_DECLARE_OK)
        self.method(1, QUEUE_BIND, struct.pack(">H", 0) + shortstr(queue) + shortstr(exchange) +
                    shortstr(binding_key) + b"\x00" + EMPTY_TABLE)
        self.expect(1, QUEUE_BIND_OK)
        self.method(1, BASIC_QOS, struct.pack(">IHB", 0, prefetch, 0))
        self.expect(1, BASIC_QOS_OK)
        # bits: no-local, no-ack, exclusive, no-wait
        self.method(1, BASIC_CONSUME, struct.pack(">H", 0) + shortstr(queue) + shortstr("") +
                    b"\x00" + EMPTY_TABLE)
        self.expect(1, BASIC_CONSUME_OK)
        self.sock.settimeout(None)

    def deliveries(self):
        """Yield (delivery_tag, redelivered, routing_key, properties, body)."""
        while True:
            _, cm, r = self.next_method()
            if cm != BASIC_DELIVER:
                continue
            r.shortstr()  # consumer tag
            tag = r.longlong()
            redelivered = bool(r.octet() & 1)
            r.shortstr()  # exchange
            routing_key = r.shortstr()
            ftype, _, payload = self.frame()
            if ftype != FRAME_HEADER:
                raise AmqpError("expected a content header")
            h = Reader(payload)
            h.short()  # class
            h.short()  # weight
            size = h.longlong()
            props = parse_properties(h)
            body = b""
            while len(body) < size:
                ftype, _, payload = self.frame()
                if ftype != FRAME_BODY:
                    raise AmqpError("expected a content body")
                body += payload
            yield tag, redelivered, routing_key, props, body

    def ack(self, tag):
        self.method(1, BASIC_ACK, struct.pack(">QB", tag, 0))

    def reject(self, tag):
        self.method(1, BASIC_REJECT, struct.pack(">QB", tag, 1))  # requeue


def parse_properties(r):
    """The basic properties a consumer looks at (the rest are skipped)."""
    flags = r.short()
    props = {}
    fields = [  # bit 15 first
        ("content_type", "shortstr"), ("content_encoding", "shortstr"), ("headers", "table"),
        ("delivery_mode", "octet"), ("priority", "octet"), ("correlation_id", "shortstr"),
        ("reply_to", "shortstr"), ("expiration", "shortstr"), ("message_id", "shortstr"),
        ("timestamp", "longlong"), ("type", "shortstr"), ("user_id", "shortstr"),
        ("app_id", "shortstr"), ("cluster_id", "shortstr")]
    for i, (name, kind) in enumerate(fields):
        if not flags & (1 << (15 - i)):
            continue
        if kind == "table":
            r.skip_table()
        else:
            props[name] = getattr(r, kind)()
    return props


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--exchange", default="idemflow")
    ap.add_argument("--queue", required=True)
    ap.add_argument("--binding-key", default="#")
    ap.add_argument("--inbox", required=True,
                    help="the inbox's PostgreSQL database (a libpq connection string)")
    ap.add_argument("--consumer", default="idemflow-test", help="the consumer's name in the inbox")
    ap.add_argument("--via", default="amqp", help="this transport's name in the effects")
    ap.add_argument("--log", required=True, help="append one JSON line per message here")
    ap.add_argument("--prefetch", type=int, default=100)
    a = ap.parse_args()

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from inbox import Error as InboxError, Inbox  # noqa: E402 - next to this script

    try:
        inbox = Inbox(a.inbox, a.consumer, a.via)
    except InboxError as exc:
        print("amqp_consumer: could not open the inbox: %s" % str(exc).strip(), file=sys.stderr,
              flush=True)
        return 1
    log = open(a.log, "a", encoding="utf-8")
    seq = 0
    try:
        conn = Connection(a.url)
        conn.setup(a.exchange, a.queue, a.binding_key, a.prefetch)
        print("ready", flush=True)
        for tag, redelivered, routing_key, props, body in conn.deliveries():
            seq += 1
            mid = props.get("message_id")
            try:
                workflow = json.loads(body).get("workflow_id")
            except (ValueError, AttributeError):
                workflow = None
            try:
                outcome = inbox.claim(mid, workflow) if mid else "error"
            except InboxError:
                outcome = "error"
            # Logged before the acknowledgement: like receiver.py, a line
            # means "processed", whether or not the broker heard of it.
            log.write(json.dumps({
                "seq": seq, "time": time.time(), "message_id": mid, "type": props.get("type"),
                "routing_key": routing_key, "redelivered": redelivered, "delivery_tag": tag,
                "body_len": len(body), "inbox": outcome}) + "\n")
            log.flush()
            if outcome == "error":
                conn.reject(tag)
                # The database is away (restarting): the broker hands the
                # message back at once; do not spin on it meanwhile.
                time.sleep(0.2)
            else:
                conn.ack(tag)
    except (AmqpError, OSError) as exc:
        print("amqp_consumer: %s" % exc, file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
