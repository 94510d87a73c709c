"""faultproxy.py - an HTTP/1.1 proxy that loses answers on purpose (stdlib only).

Put between a client and a server (the test stack's nginx, or a webhook
receiver) so that a client's retries really happen. Every request is read
whole (Content-Length bodies; Expect: 100-continue answered) and handled by
the next action of a plan, in the order the requests arrive; once the plan
is used up every request passes:

  pass            forward, read the whole answer, send it on
  drop            forward, read the whole answer, then close the client's
                  connection without a byte of it: the server did the work
                  and the client never hears of it (a lost answer)
  unknown[:N]     forward, read the whole answer, and send instead a
                  503 outcome-unknown problem with Retry-After: N (1): what
                  idemflow answers when its commit may or may not have
                  happened
  unavailable[:N] do not forward; answer 503 unavailable, Retry-After: N (1)

Every answer it sends says Connection: close and the connection is closed
after it, so each request is one connection and a client never writes into
a connection the proxy already closed. Each request is logged (Exchange)
with what the client sent, what the server answered (the raw bytes, before
any action) and what the client got, so a test can count requests exactly
and compare a replayed answer with the first one byte for byte.

Used in-process by the tests: FaultProxy(host, port).start(); .plan([...]);
.log; .close(). python3 faultproxy.py UPSTREAM_PORT [ACTION...] runs one by
hand and prints its port.
"""

import json
import socket
import sys
import threading
import time

PROBLEM_BASE = "https://idemflow.example/problems/"
MAX_HEAD = 64 * 1024
MAX_BODY = 8 * 1024 * 1024


class Exchange:
    """One request through the proxy. Times are time.monotonic()."""

    def __init__(self, n):
        self.n = n
        self.started = time.monotonic()
        self.finished = None
        self.method = None
        self.path = None
        self.headers = {}  # lowercased name -> value (the last one)
        self.body = b""
        self.action = None
        self.upstream = None  # the server's answer: (status, headers, body), raw
        self.upstream_raw = b""
        self.sent_status = None  # the status the client got; None: dropped
        self.error = None

    @property
    def key(self):
        """The Idempotency-Key as sent (quotes and all), or None."""
        return self.headers.get("idempotency-key")

    def __repr__(self):
        up = self.upstream[0] if self.upstream else None
        return (f"<#{self.n} {self.method} {self.path} key={self.key} {self.action}: "
                f"upstream {up}, sent {self.sent_status}>")


def _read_head(sock, buf):
    while b"\r\n\r\n" not in buf:
        if len(buf) > MAX_HEAD:
            raise ValueError("head too large")
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the end of the head")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    return head, rest


def _parse_head(head):
    lines = head.split(b"\r\n")
    headers = {}
    order = []
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().decode("latin-1")
        value = value.strip().decode("latin-1")
        headers[name.lower()] = value
        order.append((name, value))
    return lines[0].decode("latin-1"), headers, order


def _read_body(sock, rest, headers):
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise ValueError("chunked bodies are not supported")
    n = int(headers.get("content-length", "0"))
    if n > MAX_BODY:
        raise ValueError("body too large")
    while len(rest) < n:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the end of the body")
        rest += chunk
    return rest[:n]


def _problem(status, reason, slug, title, detail, retry_after, path):
    body = json.dumps({"type": PROBLEM_BASE + slug, "title": title, "status": status,
                       "detail": detail, "instance": path}, separators=(",", ":")).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/problem+json\r\n"
            f"Retry-After: {retry_after}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n")
    return head.encode("latin-1") + body


class FaultProxy:
    def __init__(self, upstream_host, upstream_port, host="127.0.0.1", timeout=60.0):
        self.upstream = (upstream_host, int(upstream_port))
        self.timeout = timeout
        self.log = []
        self._plan = []
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._sock = socket.create_server((host, 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self._closed = False
        self._thread = None

    # --- control ---------------------------------------------------------
    def start(self):
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()
        return self

    def close(self):
        self._closed = True
        try:
            self._sock.close()
        except OSError:
            pass

    def plan(self, actions):
        """Replace the plan: the next requests get these actions, in order."""
        with self._lock:
            self._plan = list(actions)

    def plan_left(self):
        with self._lock:
            return list(self._plan)

    def reset(self):
        """Forget the log and the plan."""
        with self._lock:
            self.log = []
            self._plan = []

    def finished(self):
        """The exchanges whose answer was sent (or dropped), in arrival order."""
        with self._lock:
            return [x for x in self.log if x.finished is not None]

    def wait_for(self, pred, timeout=30.0):
        """Wait until pred(finished exchanges) is true; returns them."""
        end = time.monotonic() + timeout
        with self._cv:
            while True:
                done = [x for x in self.log if x.finished is not None]
                if pred(done):
                    return done
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"faultproxy: still waiting; log: {self.log}")
                self._cv.wait(left)

    # --- the proxy -------------------------------------------------------
    def _accept_loop(self):
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _next(self):
        with self._lock:
            x = Exchange(len(self.log) + 1)
            self.log.append(x)
            action = self._plan.pop(0) if self._plan else "pass"
        x.action = action
        return x

    def _serve(self, conn):
        x = None
        conn.settimeout(self.timeout)
        try:
            try:
                head, rest = _read_head(conn, b"")
            except (ConnectionError, OSError):
                return  # a connection that never sent a request
            line, headers, order = _parse_head(head)
            if headers.get("expect", "").lower() == "100-continue":
                conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = _read_body(conn, rest, headers)
            x = self._next()
            x.method, x.path = line.split(" ")[0], line.split(" ")[1]
            x.headers, x.body = headers, body
            name, _, arg = x.action.partition(":")
            retry_after = int(arg) if arg else 1
            if name in ("pass", "drop", "unknown"):
                raw = self._forward(line, order, body)
                x.upstream_raw = raw
                x.upstream = self._parse_answer(raw)
            if name == "pass":
                conn.sendall(x.upstream_raw)
                x.sent_status = x.upstream[0]
            elif name == "drop":
                pass
            elif name == "unknown":
                conn.sendall(_problem(503, "Service Unavailable", "outcome-unknown",
                                      "Outcome Unknown",
                                      "injected by the fault proxy after the server answered",
                                      retry_after, x.path))
                x.sent_status = 503
            elif name == "unavailable":
                conn.sendall(_problem(503, "Service Unavailable", "unavailable",
                                      "Service Unavailable",
                                      "injected by the fault proxy; nothing was forwarded",
                                      retry_after, x.path))
                x.sent_status = 503
            else:
                raise ValueError(f"unknown action {x.action!r}")
        except Exception as e:  # recorded for the test to see, never raised
            if x is not None:
                x.error = f"{type(e).__name__}: {e}"
        finally:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
            if x is not None:
                with self._cv:
                    x.finished = time.monotonic()
                    self._cv.notify_all()

    def _forward(self, line, order, body):
        """Send the request upstream on a connection of its own; the whole
        answer's bytes, with its Connection header made "close"."""
        up = socket.create_connection(self.upstream, timeout=self.timeout)
        try:
            out = [line]
            for name, value in order:
                if name.lower() in ("connection", "expect", "keep-alive"):
                    continue
                out.append(f"{name}: {value}")
            out.append("Connection: close")
            up.sendall(("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + body)
            raw = b""
            while True:
                chunk = up.recv(65536)
                if not chunk:
                    break
                raw += chunk
            return raw
        finally:
            up.close()

    @staticmethod
    def _parse_answer(raw):
        head, _, body = raw.partition(b"\r\n\r\n")
        line, headers, _ = _parse_head(head)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = _dechunk(body)
        return int(line.split(" ")[1]), headers, body


def _dechunk(data):
    out = b""
    while True:
        size_line, _, data = data.partition(b"\r\n")
        n = int(size_line.split(b";")[0], 16)
        if n == 0:
            return out
        out += data[:n]
        data = data[n + 2:]


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: faultproxy.py UPSTREAM_PORT [ACTION...]")
    p = FaultProxy("127.0.0.1", int(sys.argv[1])).start()
    p.plan(sys.argv[2:])
    print(p.port, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
