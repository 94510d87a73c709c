#!/usr/bin/env python3
"""experiments.py - the HTTP, JSON and table parts of scripts/experiments.

Standard library only. Every subcommand prints its result on stdout (JSON
unless said otherwise) and exits non-zero only when it could not do its job;
judging the result is the caller's business.

  post       send N POST /v1/workflows, one after another or all at once
  retry      send one keyed POST again and again until it is answered 201
  deliveries summarise a t/lib/receiver.py --log file
  inbox-sql  SQL that feeds a receiver log through an inbox table
  kill-after run a command and SIGKILL it once a file has N lines
  q          evaluate a Python expression over a JSON file (d = its content)
  dburl      a connection string naming another database
  record     write one experiment's JSON record
  table      print the table of results
"""

import argparse
import http.client
import json
import os
import re
import signal
import sys
import textwrap
import threading
import time
import urllib.parse


# ------------------------------------------------------------------ HTTP

def _target(url):
    u = urllib.parse.urlsplit(url)
    if u.scheme != "http" or not u.hostname:
        raise SystemExit("experiments.py: not an http:// URL: %s" % url)
    return u.hostname, u.port or 80, (u.path.rstrip("/") or "")


def _problem_type(content_type, body):
    if not (content_type or "").startswith("application/problem+json"):
        return None
    try:
        return json.loads(body).get("type")
    except (ValueError, AttributeError):
        return None


def _exchange(conn, path, body, headers):
    """One request on CONN; a dict describing the answer (status 0 = no answer)."""
    started = time.monotonic()
    try:
        conn.request("POST", path, body, headers)
        resp = conn.getresponse()
        data = resp.read().decode("utf-8", errors="replace")
    except (OSError, http.client.HTTPException) as exc:
        return {"status": 0, "error": "%s: %s" % (type(exc).__name__, exc),
                "ms": round((time.monotonic() - started) * 1000, 1)}
    ctype = resp.getheader("Content-Type")
    return {
        "status": resp.status,
        "replayed": resp.getheader("Idempotent-Replayed") == "true",
        "location": resp.getheader("Location"),
        "content_type": ctype,
        "problem_type": _problem_type(ctype, data),
        "body": data,
        "ms": round((time.monotonic() - started) * 1000, 1),
    }


def _headers(token, key, body):
    h = {"Authorization": "Bearer " + token, "Content-Type": "application/json",
         "Content-Length": str(len(body)), "Connection": "close"}
    if key is not None:
        h["Idempotency-Key"] = key
    return h


def cmd_post(a):
    host, port, base = _target(a.url)
    path = base + "/v1/workflows"
    n = a.n
    results = [None] * n
    barrier = threading.Barrier(n) if a.concurrent and n > 1 else None

    def key_of(i):
        if a.key is not None:
            return a.key
        if a.key_prefix is not None:
            return "%s%d" % (a.key_prefix, i + 1)
        return None

    def body_of(i):
        return a.body.replace("{i}", str(i + 1)).encode()

    def one(i):
        body = body_of(i)
        conn = http.client.HTTPConnection(host, port, timeout=a.timeout)
        try:
            if barrier is not None:
                # Connect first, so that the requests leave together.
                try:
                    conn.connect()
                except OSError:
                    pass
                try:
                    barrier.wait(timeout=a.timeout)
                except threading.BrokenBarrierError:
                    pass
            r = _exchange(conn, path, body, _headers(a.token, key_of(i), body))
        finally:
            conn.close()
        r["i"] = i + 1
        r["key"] = key_of(i)
        results[i] = r

    if a.concurrent:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for i in range(n):
            one(i)
    json.dump(results, sys.stdout)
    print()


def cmd_retry(a):
    """The client of E06: the same keyed request until it gets its 201."""
    host, port, base = _target(a.url)
    path = base + "/v1/workflows"
    body = a.body.encode()
    deadline = time.monotonic() + a.deadline
    attempts = []
    while True:
        conn = http.client.HTTPConnection(host, port, timeout=a.timeout)
        try:
            r = _exchange(conn, path, body, _headers(a.token, a.key, body))
        finally:
            conn.close()
        r["at_s"] = round(a.deadline - (deadline - time.monotonic()), 3)
        attempts.append(r)
        retryable = r["status"] == 0 or r["status"] >= 500 or r["status"] == 409
        if not retryable or time.monotonic() + a.pause > deadline or len(attempts) >= a.max:
            break
        time.sleep(a.pause)
    json.dump({"attempts": attempts, "final": attempts[-1]}, sys.stdout)
    print()


# -------------------------------------------------------------- receiver

def _read_log(path):
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    out.append(json.loads(line))
    except FileNotFoundError:
        pass
    return out


def _tenant_of(entry):
    try:
        return json.loads(entry.get("body") or "").get("tenant_id")
    except (ValueError, AttributeError):
        return None


def _deliveries(path, tenant):
    entries = [e for e in _read_log(path) if e.get("path") != "/_control"]
    if tenant is not None:
        entries = [e for e in entries if _tenant_of(e) == tenant]
    entries.sort(key=lambda e: e["seq"])
    return entries


def cmd_deliveries(a):
    entries = _deliveries(a.log, a.tenant)
    ids = [e.get("webhook_id") for e in entries]
    json.dump({
        "total": len(entries),
        "distinct": len(set(ids)),
        "duplicates": len(ids) - len(set(ids)),
        "ids": ids,
        "statuses": [e.get("status") for e in entries],
        "by_id": {i: [e.get("status") for e in entries if e.get("webhook_id") == i]
                  for i in dict.fromkeys(ids)},
    }, sys.stdout)
    print()


def _sql_literal(s):
    return "'" + s.replace("'", "''") + "'"


def cmd_inbox_sql(a):
    """A consumer that deduplicates on webhook-id, in arrival order.

    The inbox row and the effect are written by one statement, hence one
    transaction: a redelivery inserts neither.
    """
    print("\\set ON_ERROR_STOP on")
    print("CREATE TEMP TABLE exp_inbox (message_id text PRIMARY KEY);")
    print("CREATE TEMP TABLE exp_effects (message_id text NOT NULL, seq integer NOT NULL);")
    for e in _deliveries(a.log, a.tenant):
        mid = e.get("webhook_id") or ""
        print("WITH claim AS (INSERT INTO exp_inbox VALUES (%s) ON CONFLICT DO NOTHING "
              "RETURNING message_id) INSERT INTO exp_effects SELECT message_id, %d FROM claim;"
              % (_sql_literal(mid), int(e["seq"])))
    print("SELECT (SELECT count(*) FROM exp_effects) || ' ' || (SELECT count(*) FROM exp_inbox);")


def cmd_kill_after(a):
    """Run COMMAND in a session of its own; SIGKILL it once --log has --lines lines.

    Starting the command here, rather than watching a process started
    elsewhere, keeps the kill within milliseconds of the N-th line.
    Exit 1 when the command ended by itself first or --timeout passed.
    """
    import subprocess
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        raise SystemExit("experiments.py kill-after: no command")
    err = open(a.stderr, "ab") if a.stderr else None
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                            start_new_session=True)
    deadline = time.monotonic() + a.timeout
    lines, killed = 0, False
    try:
        while proc.poll() is None:
            try:
                with open(a.log, "rb") as f:
                    lines = f.read().count(b"\n")
            except FileNotFoundError:
                lines = 0
            if lines >= a.lines or time.monotonic() >= deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                killed = True
                break
            time.sleep(0.002)
    finally:
        if proc.poll() is None and not killed:
            os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
    json.dump({"pid": proc.pid, "lines_at_kill": lines, "killed": killed, "rc": rc},
              sys.stdout)
    print()
    return 0 if killed and lines >= a.lines else 1


# ------------------------------------------------------------- utilities

def tally(values):
    """"201 x19, 503" for [201, ..., 503]: counts in order of first appearance."""
    counts = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return ", ".join("%s x%d" % (v, n) if n > 1 else str(v) for v, n in counts.items())


def lines(path):
    """The non-empty lines of a text file."""
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def cmd_q(a):
    with open(a.file, encoding="utf-8") as f:
        d = json.load(f)
    names = {"d": d, "json": json, "tally": tally, "lines": lines}
    v = eval(a.expr, names)  # noqa: S307 - expressions written in scripts/experiments
    if isinstance(v, bool):
        print("true" if v else "false")
    elif isinstance(v, str):
        print(v)
    elif isinstance(v, (int, float)) or v is None:
        print(json.dumps(v))
    elif isinstance(v, (list, tuple)) and all(isinstance(x, (str, int, float)) for x in v):
        print(" ".join(str(x) for x in v))
    else:
        print(json.dumps(v))


def cmd_dburl(a):
    c = a.conninfo.strip()
    if re.match(r"^postgres(ql)?://", c):
        u = urllib.parse.urlsplit(c)
        print(urllib.parse.urlunsplit((u.scheme, u.netloc, "/" + a.dbname, u.query, u.fragment)))
    else:
        # In a keyword/value string the last setting of a keyword wins.
        print("%s dbname=%s" % (c, a.dbname))


def _value(text):
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d+\.\d*(e-?\d+)?", text):
        return float(text)
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return None
    if text[:1] in "[{":
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def cmd_record(a):
    numbers = {}
    if os.path.exists(a.numbers):
        with open(a.numbers, encoding="utf-8") as f:
            for line in f:
                line = line.rstrip("\n")
                if "=" in line:
                    k, v = line.split("=", 1)
                    numbers[k] = _value(v)
    passed, observed = False, "error: the experiment stopped early (see %s)" % a.log
    if os.path.exists(a.verdict):
        with open(a.verdict, encoding="utf-8") as f:
            lines = f.read().split("\n", 1)
        passed = lines[0].strip() == "PASS"
        observed = (lines[1] if len(lines) > 1 else "").strip() or observed
    rec = {
        "id": a.id,
        "title": a.title,
        "expected": a.expected,
        "observed": observed,
        "pass": passed,
        "numbers": numbers,
        "started_at": a.started_at,
        "duration_s": round(a.duration, 3),
    }
    tmp = a.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(rec, f, indent=2, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, a.out)
    print("PASS" if passed else "FAIL")


COLUMNS = [("id", 4), ("experiment", 44), ("expected", 28), ("observed", 28), ("result", 6)]


def cmd_table(a):
    rows = []
    for path in a.records:
        with open(path, encoding="utf-8") as f:
            r = json.load(f)
        rows.append([r["id"], r["title"], r["expected"], r["observed"],
                     "PASS" if r["pass"] else "FAIL"])

    def line(cells):
        return "  ".join(c.ljust(w) for c, (_, w) in zip(cells, COLUMNS)).rstrip()

    print(line([name for name, _ in COLUMNS]))
    for row in rows:
        wrapped = [textwrap.wrap(cell, w, break_on_hyphens=False) or [""]
                   for cell, (_, w) in zip(row, COLUMNS)]
        for i in range(max(len(c) for c in wrapped)):
            print(line([c[i] if i < len(c) else "" for c in wrapped]))
    passed = sum(1 for r in rows if r[4] == "PASS")
    print()
    print("%d of %d experiments passed" % (passed, len(rows)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("post")
    p.add_argument("--url", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--key", help="the same Idempotency-Key on every request")
    p.add_argument("--key-prefix", help="a key per request: PREFIX1, PREFIX2, ...")
    p.add_argument("--body", required=True, help="{i} is replaced by the request number")
    p.add_argument("-n", type=int, default=1)
    p.add_argument("--concurrent", action="store_true", help="all at once (a barrier)")
    p.add_argument("--timeout", type=float, default=30)
    p.set_defaults(fn=cmd_post)

    p = sub.add_parser("retry")
    p.add_argument("--url", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--body", required=True)
    p.add_argument("--pause", type=float, default=0.2)
    p.add_argument("--deadline", type=float, default=30)
    p.add_argument("--max", type=int, default=50)
    p.add_argument("--timeout", type=float, default=20)
    p.set_defaults(fn=cmd_retry)

    p = sub.add_parser("deliveries")
    p.add_argument("--log", required=True)
    p.add_argument("--tenant", type=int)
    p.set_defaults(fn=cmd_deliveries)

    p = sub.add_parser("inbox-sql")
    p.add_argument("--log", required=True)
    p.add_argument("--tenant", type=int)
    p.set_defaults(fn=cmd_inbox_sql)

    p = sub.add_parser("kill-after")
    p.add_argument("--log", required=True)
    p.add_argument("--lines", type=int, required=True)
    p.add_argument("--timeout", type=float, default=20)
    p.add_argument("--stderr", help="append the command's output here")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_kill_after)

    p = sub.add_parser("q")
    p.add_argument("file")
    p.add_argument("expr")
    p.set_defaults(fn=cmd_q)

    p = sub.add_parser("dburl")
    p.add_argument("conninfo")
    p.add_argument("dbname")
    p.set_defaults(fn=cmd_dburl)

    p = sub.add_parser("record")
    for name in ("--out", "--id", "--title", "--expected", "--started-at",
                 "--numbers", "--verdict", "--log"):
        p.add_argument(name, required=True)
    p.add_argument("--duration", type=float, required=True)
    p.set_defaults(fn=cmd_record)

    p = sub.add_parser("table")
    p.add_argument("records", nargs="+")
    p.set_defaults(fn=cmd_table)

    a = ap.parse_args()
    return a.fn(a) or 0


if __name__ == "__main__":
    sys.exit(main())
