#!/usr/bin/python3
"""t/e2e/test_overload.py - many more clients than workers get answers.

Run by t/run-test with the e2e stack (PostgreSQL, idemflow-fcgi with its
pool, nginx from nginx/idemflow-local.conf.in), every request through
nginx. CLIENTS connections each send one keyed create at once, far more
than the pool's workers: nginx queues them, and each request in flight
holds two of nginx's connections (the client's and the one to the pool's
socket). Every client must get an answer: a 201, or a 503 problem+json
when the service sheds load; never a closed connection, a reset or a
timeout. The workflows created are exactly the 201s, and each key's
retry afterwards replays its answer.
"""

import asyncio
import json
import os
import subprocess
import sys

CLIENTS = 400
BODY = b'{"type":"overload","input":{"n":1}}'


class Failure(Exception):
    pass


def cli(*args):
    out = subprocess.run([os.environ["IDEMFLOW_CLI"], "--db", os.environ["DATABASE_URL"],
                          *args], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def psql(sql):
    r = subprocess.run(["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise Failure(f"psql {sql!r}: {r.stderr.strip()}")
    return r.stdout.strip()


async def create(token, key, gate):
    """One connection, one create once gate opens: (status, body) or the
    exception's name."""
    host = os.environ.get("IDEMFLOW_HOST", "127.0.0.1")
    port = int(os.environ["IDEMFLOW_PORT"])
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as e:
        return ("connect: " + type(e).__name__, b"")
    await gate.wait()
    req = (b"POST /v1/workflows HTTP/1.1\r\nHost: localhost\r\n"
           b"Authorization: Bearer " + token.encode() + b"\r\n"
           b"Content-Type: application/json\r\nIdempotency-Key: " + key.encode() + b"\r\n"
           b"Content-Length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)
    try:
        writer.write(req)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await asyncio.wait_for(reader.readexactly(length), 60)
        return (status, body)
    except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as e:
        return (type(e).__name__, b"")
    finally:
        writer.close()


async def storm(token, keys):
    gate = asyncio.Event()
    tasks = [asyncio.ensure_future(create(token, k, gate)) for k in keys]
    await asyncio.sleep(0.5)  # every connection open, then all at once
    gate.set()
    return await asyncio.gather(*tasks)


def main():
    name = "overload-%d" % os.getpid()
    tid = int(cli("tenant", "create", name))
    token = cli("token", "create", "--tenant", name)
    keys = ["ov-%d" % i for i in range(CLIENTS)]
    got = asyncio.run(storm(token, keys))
    by = {}
    for status, body in got:
        by[status] = by.get(status, 0) + 1
        if status == 503 and json.loads(body).get("status") != 503:
            print(f"not ok - a 503 without its problem+json body: {body[:200]!r}")
            return 1
    print(f"# {CLIENTS} clients at once: " +
          ", ".join(f"{k} x{v}" for k, v in sorted(by.items(), key=str)))
    bad = {k: v for k, v in by.items() if k not in (201, 503)}
    if bad:
        print(f"not ok - answers other than 201 and 503: {bad}")
        return 1
    made = int(psql(f"SELECT count(*) FROM workflows WHERE tenant_id = {tid}"))
    if made != by.get(201, 0):
        print(f"not ok - {made} workflows for {by.get(201, 0)} answers 201")
        return 1
    # A retry of each created one replays its answer, byte for byte.
    created = [(k, b) for k, (s, b) in zip(keys, got) if s == 201][:50]
    again = asyncio.run(storm(token, [k for k, _ in created]))
    for (k, first), (status, body) in zip(created, again):
        if status != 201 or body != first:
            print(f"not ok - the retry of {k} answered {status} {body[:200]!r}, not its 201")
            return 1
    if int(psql(f"SELECT count(*) FROM workflows WHERE tenant_id = {tid}")) != made:
        print("not ok - a retry created a workflow")
        return 1
    print(f"ok - {CLIENTS} clients at once, each answered; {made} workflows")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failure as e:
        print(f"not ok - {e}")
        sys.exit(1)
