#!/usr/bin/env python3
"""scripts/lib/bench.py - the bookkeeping of scripts/bench.

scripts/bench starts the stack and drives it; this file does the rest:

  pgbench-script QUERIES_C [--scatter | --replay RUN CLIENTS PER]
                                   the create transaction of a worker, for pgbench
  dispatch-script QUERIES_C        the dispatcher's claim and mark, for pgbench
  fanout-script QUERIES_C          its claim and record of endpoint deliveries, for pgbench
  seed RECORDS URL TOKEN PREFIX N PAD
                                   create the keys PREFIX-1 .. PREFIX-N (memory)
  measure [options] -- CMD...      run a load generator (wrk or pgbench), with
                                   per-process CPU before and after; append a record
  rss RECORDS POINT SUP_PID SERVED LOG
                                   append the RSS of each worker (children of
                                   SUP_PID) and the requests LOG says it served
  dispatch RECORDS OUTPUT          append the numbers printed by scripts/bench-dispatch
  logged LOG OFFSET TENANT         the creates LOG holds from byte OFFSET on that the
                                   pool answered 201 for TENANT (idem=created)
  finish RECORDS FACTS OUTDIR [--doc FILE]
                                   results.json, the table on stdout, plots, and the
                                   section of FILE (doc/performance.md)
  report OUTDIR [--doc FILE]       the table, plots and section again from results.json

--readme FILE is accepted as another name of --doc FILE.

Records are JSON lines; results.json is built from them. Only the standard
library is used.
"""

import glob
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")

# The targets of the benchmark (issue "Benchmark").
TARGET_CREATES = 0.80  # keyed creates / pgbench, at TARGET_CONNS
TARGET_REPLAYS = 0.60  # replays / empty FastCGI (GET /healthz), at TARGET_CONNS
TARGET_CONNS = 16
TARGET_RSS_KIB = 8 * 1024  # per worker
TARGET_SCALE = 0.85  # creates with 5M keys / empty table
# Issue "creates as cheap as the machine allows": creates against the
# combined ceiling (an empty FastCGI answer plus the create's SQL).
TARGET_COMBINED = 0.85
TARGET_COMBINED_CONNS = (16, 64)
# Issue "load the way production brings it": a retry storm of cold replays
# against healthz combined with the replay's SQL, and p99 within 4x p50
# under overload.
TARGET_STORM = 0.85
TARGET_P99_P50 = 4.0
# Issue "fan-out born in the write's transaction": a create whose tenant
# has FANOUT_ENDPOINTS matching endpoints costs at most this much CPU
# (workers and PostgreSQL) per create as one whose tenant has none.
TARGET_FANOUT_CPU = 1.05
FANOUT_ENDPOINTS = 3
# "No growth beyond noise" between the two memory points, per worker: a
# page or two of malloc arena moves, a leak of even 100 bytes a request
# would be ~9 MiB over 90k requests.
RSS_NOISE_KIB = 64
# Above this share of the machine's CPU used by others during a run, the
# table warns that the run measured a busy machine.
NOISY_PCT = 20


def die(msg):
    print("bench.py: " + msg, file=sys.stderr)
    sys.exit(1)


# ------------------------------------------------------------ pgbench script

def _c_literals(text):
    """The concatenated C string literals in text, unescaped."""
    out = []
    for lit in re.findall(r'"((?:[^"\\\n]|\\.)*)"', text):
        out.append(re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "r": "\r"}.get(m.group(1), m.group(1)), lit))
    return "".join(out)


def _macro(src, name):
    """(params, body) of a function-like #define NAME(...) spanning \\-continued lines."""
    m = re.search(r"^#define\s+" + name + r"\(([^)]*)\)((?:.*\\\n)*.*)$", src, re.M)
    if not m:
        return None
    return [p.strip() for p in m.group(1).split(",")], m.group(2).replace("\\\n", "\n")


def _query(src, enum):
    """The SQL of queries[ENUM] in app/server/queries.c."""
    m = re.search(r"\[" + enum + r"\]\s*=\s*\{\s*\"[^\"]*\"\s*,(.*?)\}\s*,\s*$", src, re.S | re.M)
    if not m:
        die("cannot find [%s] in app/server/queries.c" % enum)
    # {"name", nparams, SQL}: the count (the statement's parameter enum) goes.
    entry = re.sub(r"^\s*[A-Za-z0-9_]+\s*,", "", m.group(1), count=1)
    call = re.match(r"\s*([A-Z_][A-Z0-9_]*)\((.*)\)\s*$", entry, re.S)
    if call:
        mac = _macro(src, call.group(1))
        if mac is None:
            die("cannot find the macro %s in app/server/queries.c" % call.group(1))
        params, body = mac
        arg = _c_literals(call.group(2))
        # Replace the macro parameter (a bare identifier between literals).
        parts = re.findall(r'"(?:[^"\\\n]|\\.)*"|[A-Za-z_][A-Za-z0-9_]*', body)
        sql = ""
        for p in parts:
            if p.startswith('"'):
                sql += _c_literals(p)
            elif p in params:
                sql += arg
        return sql
    return _c_literals(entry)


def _params(sql):
    return sorted({int(n) for n in re.findall(r"\$(\d+)", sql)})


# What a worker binds to Q_CREATE_KEYED's parameters (app/server/wf.c,
# create_prepare): pgbench variables (real parameters, so the statement and
# its plan are the same), except the three values that must differ per
# request, made from the per-client counter :k by small expressions, and
# the tracestate a request without one binds: NULL.
CREATE_PARAMS = {
    1: ":hash",                               # the token's digest, '\x' + 64 hex digits
    2: ":k",                                  # Idempotency-Key (text)
    3: ":method",
    4: ":path",
    5: ":fp",                                 # fingerprint, '\x' + 64 hex digits
    6: ":headers",                            # "Location: ...\r\n"
    7: ":body",                               # the stored response body
    8: ":ts",                                 # created_at, text
    9: ":ttl",                                # "86400000 milliseconds"
    # The workflow id: unique and increasing per client, like the worker's
    # time-ordered UUIDv7 (a random UUID would spread the index inserts).
    10: "lpad(:k::text, 32, '0')::uuid",
    11: ":wftype",
    12: ":input",
    13: "(lpad(:k::text, 32, '0')::uuid::text || '.1')",  # event id: "<id>.1"
    14: ":payload_head",                      # the event's payload up to its tenant id
    15: ":bfp",                               # fingerprint of the request's bytes
    16: ":payload_tail",                      # and after it
    17: ":traceparent",                       # a new trace's, as for a request without one
    18: "NULL",                               # tracestate
}


# --scatter: the key a random-looking 32 hex digits, spread over the key
# index like a client's random keys (and like the keys --large loads).
SCATTER_KEY = "md5(:k::text)"


def pgbench_script(queries_c, scatter=False, replay=None):
    src = open(queries_c, encoding="utf-8").read()
    create = _query(src, "Q_CREATE_KEYED")
    if _params(create) != sorted(CREATE_PARAMS):
        die("Q_CREATE_KEYED in app/server/queries.c no longer takes $1..$%d: update CREATE_PARAMS "
            "in scripts/lib/bench.py to match app/server/wf.c" % len(CREATE_PARAMS))
    cmap = dict(CREATE_PARAMS)
    if scatter:
        cmap[2] = SCATTER_KEY
    create = re.sub(r"\$(\d+)", lambda m: cmap[int(m.group(1))], create)
    squash = lambda s: re.sub(r"\s+", " ", s).strip()
    if replay:
        # The keys a run of this script made with CLIENTS clients of PER
        # transactions each, at random: every one a replay.
        run, clients, per = replay
        return (
            "-- generated by scripts/lib/bench.py from app/server/queries.c: the statement a\n"
            "-- worker runs for a keyed create (Q_CREATE_KEYED), here replaying a key run %d\n"
            "-- created (%d clients, %d transactions each), one round trip.\n"
            "\\set c random(0, %d)\n"
            "\\set n random(1, %d)\n"
            "\\set k %d * 1000000000000 + :c * 1000000000 + :n\n"
            % (run, clients, per, clients - 1, per, run)
            + squash(create) + ";\n"
        )
    return (
        "-- generated by scripts/lib/bench.py from app/server/queries.c: the statements a\n"
        "-- worker runs for one keyed create (Q_CREATE_KEYED, which checks the token), one round trip.\n"
        "-- :n counts this client's transactions; :k is unique over runs and clients%s.\n"
        "\\set n :n + 1\n"
        "\\set k :run * 1000000000000 + :client_id * 1000000000 + :n\n"
        % ("; the key is md5(:k)" if scatter else "")
        + squash(create) + ";\n"
    )


# ------------------------------------------------------- dispatcher script

def _c_table_entry(src, table, name):
    """The members of entry [NAME] of the C array TABLE, each the
    concatenation of its string literals."""
    m = re.search(r"\b" + table + r"\s*\[[^]]*\]\s*=\s*\{", src)
    if not m:
        die("cannot find the table %s" % table)
    body = src[m.end():]
    e = re.search(r"\[\s*" + name + r"\s*\]\s*=\s*\{", body)
    if not e:
        die("cannot find [%s] in %s" % (name, table))
    lits, i = [""], e.end()
    while i < len(body):
        c = body[i]
        if c == '"':
            j = i + 1
            while body[j] != '"':
                j += 2 if body[j] == "\\" else 1
            lits[-1] += _c_literals(body[i:j + 1])
            i = j + 1
        elif c == ",":
            lits.append("")
            i += 1
        elif body.startswith("/*", i):
            i = body.index("*/", i) + 2
        elif c == "}":
            return [x for x in lits if x]
        else:
            i += 1
    die("unterminated entry [%s] in %s" % (name, table))


# What the dispatcher binds (app/dispatch/dispatch.c, step_send; the names in
# app/dispatch/queries.h): pgbench variables.
CLAIM_PARAMS = {1: ":batch", 2: ":owner", 3: ":lease"}
DONE_PARAMS = {1: ":ids", 2: ":owner"}


def dispatch_script(queries_c):
    """The dispatcher's claim and mark, taken by name from dispatch_queries
    in app/dispatch/queries.c, as one pgbench transaction pair: DQ_CLAIM (its ids
    gathered into :ids), then DQ_DONE with them, each in its own
    transaction as the dispatcher runs them."""
    src = open(queries_c, encoding="utf-8").read()
    sql = {}
    for name, params in (("DQ_CLAIM", CLAIM_PARAMS), ("DQ_DONE", DONE_PARAMS)):
        lits = _c_table_entry(src, "dispatch_queries", name)
        if len(lits) != 2:
            die("[%s] in app/dispatch/queries.c is not {name, sql}" % name)
        if _params(lits[1]) != sorted(params):
            die("%s in app/dispatch/queries.c takes %s: update %s_PARAMS in scripts/lib/bench.py to "
                "match step_send()" % (name, " ".join("$%d" % n for n in _params(lits[1])),
                                       name[3:]))
        sql[name] = re.sub(r"\s+", " ", re.sub(r"\$(\d+)", lambda m: params[int(m.group(1))],
                                              lits[1])).strip()
    if not re.search(r"\bRETURNING\s+o\.id\b", sql["DQ_CLAIM"]):
        die("DQ_CLAIM in app/dispatch/queries.c no longer returns o.id first")
    return ("-- generated by scripts/lib/bench.py from app/dispatch/queries.c (dispatch_queries):\n"
            "-- the dispatcher's DQ_CLAIM, its ids into :ids, then DQ_DONE.\n"
            "WITH claimed AS (" + sql["DQ_CLAIM"] + ")\n"
            "SELECT coalesce(array_agg(id), '{}') AS ids FROM claimed \\gset\n"
            + sql["DQ_DONE"] + ";\n")


# The tenant endpoints' claim and record (app/dispatch/fanout.c): every
# attempt a success, as delivered to the benchmark's nginx (204, no body).
_N = "ARRAY[cardinality(:t::bigint[])]"
FCLAIM_PARAMS = {1: ":batch", 2: ":owner", 3: ":lease"}
FRECORD_PARAMS = {1: ":owner", 2: ":t", 3: ":e", 4: ":w", 5: ":s", 6: ":ids",
                  7: "array_fill(extract(epoch FROM clock_timestamp())::float8, %s)" % _N,
                  8: "array_fill(1.0::float8, %s)" % _N, 9: "array_fill(204, %s)" % _N,
                  10: "array_fill('succeeded'::text, %s)" % _N,
                  11: "array_fill(''::text, %s)" % _N, 12: "array_fill(''::text, %s)" % _N,
                  13: "array_fill(0::bigint, %s)" % _N, 14: "array_fill(false, %s)" % _N,
                  15: "10", 16: "'5 days'"}


def fanout_script(queries_c):
    """The tenant endpoints' claim and record, taken by name from
    dispatch_queries in app/dispatch/queries.c: DQ_FCLAIM (the keys and
    event ids gathered into arrays), then DQ_FRECORD with them, each in
    its own transaction as fanout.c runs them."""
    src = open(queries_c, encoding="utf-8").read()
    sql = {}
    for name, params in (("DQ_FCLAIM", FCLAIM_PARAMS), ("DQ_FRECORD", FRECORD_PARAMS)):
        lits = _c_table_entry(src, "dispatch_queries", name)
        if len(lits) != 2:
            die("[%s] in app/dispatch/queries.c is not {name, sql}" % name)
        if _params(lits[1]) != sorted(params):
            die("%s in app/dispatch/queries.c takes %s: update %s_PARAMS in scripts/lib/bench.py"
                % (name, " ".join("$%d" % n for n in _params(lits[1])), name[3:]))
        sql[name] = re.sub(r"\s+", " ", re.sub(r"\$(\d+)", lambda m: params[int(m.group(1))],
                                              lits[1])).strip()
    return ("-- generated by scripts/lib/bench.py from app/dispatch/queries.c (dispatch_queries):\n"
            "-- the dispatcher's DQ_FCLAIM, its keys into arrays, then DQ_FRECORD.\n"
            "WITH c AS (" + sql["DQ_FCLAIM"] + ")\n"
            "SELECT coalesce(array_agg(tenant_id), '{}') AS t,"
            " coalesce(array_agg(endpoint_id), '{}') AS e,"
            " coalesce(array_agg(workflow_id), '{}') AS w,"
            " coalesce(array_agg(seq), '{}') AS s,"
            " coalesce(array_agg(event_id), '{}') AS ids FROM c \\gset\n"
            + sql["DQ_FRECORD"] + ";\n")


# --------------------------------------------------------------- processes

def _stat(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            s = f.read()
    except OSError:
        return None
    rest = s[s.rindex(")") + 2:].split()
    # fields 3.. of proc(5): state ppid ...; utime stime are fields 14 and 15
    return {"ppid": int(rest[1]), "ticks": int(rest[11]) + int(rest[12]),
            "cticks": int(rest[13]) + int(rest[14])}


def _all_procs():
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(int(d))
            if st:
                procs[int(d)] = st
    return procs


def _tree(procs, root):
    """root and its descendants."""
    kids = {}
    for pid, st in procs.items():
        kids.setdefault(st["ppid"], []).append(pid)
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        if p in procs:
            out.append(p)
            todo.extend(kids.get(p, []))
    return out


def _machine_ticks():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    steal = v[7] if len(v) > 7 else 0
    return {"busy": sum(v[:8]) - idle - steal, "steal": steal, "all": sum(v[:8])}


def cpu_snapshot(groups):
    """CPU ticks of each group {name: root pid}: the live processes of the
    tree plus what the root has reaped (cutime + cstime). The workers,
    nginx's workers and PostgreSQL's backends are direct children of their
    root, so a backend that exits during a run (pgbench's) still counts."""
    procs = _all_procs()
    snap = {"groups": {}}
    for name, root in groups.items():
        pids = _tree(procs, root) if root else []
        snap["groups"][name] = sum(procs[p]["ticks"] for p in pids) + (
            procs[root]["cticks"] if root in procs else 0)
    snap["machine"] = _machine_ticks()
    snap["t"] = time.monotonic()
    return snap


def cpu_delta(a, b):
    d = {name: max(0, b["groups"][name] - a["groups"].get(name, 0)) / CLK_TCK
         for name in b["groups"]}
    d["machine_busy"] = (b["machine"]["busy"] - a["machine"]["busy"]) / CLK_TCK
    d["steal"] = (b["machine"]["steal"] - a["machine"]["steal"]) / CLK_TCK
    d["wall"] = b["t"] - a["t"]
    return d


# ---------------------------------------------------------------- measure

def _percentile(sorted_vals, q):
    if not sorted_vals:
        return None
    k = (len(sorted_vals) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


def parse_wrk(text):
    for line in text.splitlines():
        if line.startswith("BENCH_JSON "):
            j = json.loads(line[len("BENCH_JSON "):])
            secs = j["duration_us"] / 1e6
            lat = j["latency_us"]
            errs = j["errors"]
            return {
                "requests": j["requests"],
                "sent": j.get("sent", 0),
                "status": j.get("status", {}),
                "seconds": round(secs, 3),
                "rate": round(j["requests"] / secs, 1) if secs > 0 else 0.0,
                "p50_ms": round(lat["p50"] / 1000.0, 3),
                "p90_ms": round(lat["p90"] / 1000.0, 3),
                "p99_ms": round(lat["p99"] / 1000.0, 3),
                "p999_ms": round(lat["p999"] / 1000.0, 3),
                "mean_ms": round(lat["mean"] / 1000.0, 3),
                "max_ms": round(lat["max"] / 1000.0, 3),
                "errors": errs,
                "failed": sum(errs.values()),
            }
    return None


def parse_pgbench(text, logprefix):
    m = re.search(r"^tps = ([0-9.]+) \(without initial connection time\)", text, re.M)
    if not m:
        m = re.search(r"^tps = ([0-9.]+)", text, re.M)
    if not m and re.search(r"^number of transactions actually processed: 0$", text, re.M):
        # None in the time given (a loaded machine, a short warm-up).
        m = re.match(r"(0)", "0")
    if not m:
        return None
    lat = []
    for f in glob.glob(logprefix + ".*"):
        with open(f) as fh:
            for line in fh:
                parts = line.split()
                # client_id transaction_no time script_no time_epoch time_us
                if len(parts) >= 3 and parts[2].isdigit():
                    lat.append(int(parts[2]))
    lat.sort()
    proc = re.search(r"^number of transactions actually processed: (\d+)", text, re.M)
    failed = re.search(r"^number of failed transactions: (\d+)", text, re.M)
    dur = re.search(r"^duration: (\d+) s", text, re.M)
    n = int(proc.group(1)) if proc else len(lat)
    ms = lambda q: round(_percentile(lat, q) / 1000.0, 3) if lat else None
    return {
        "requests": n,
        "seconds": int(dur.group(1)) if dur else None,
        "rate": round(float(m.group(1)), 1),
        "p50_ms": ms(50), "p90_ms": ms(90), "p99_ms": ms(99), "p999_ms": ms(99.9),
        "mean_ms": round(sum(lat) / len(lat) / 1000.0, 3) if lat else None,
        "max_ms": round(lat[-1] / 1000.0, 3) if lat else None,
        "errors": {"failed": int(failed.group(1)) if failed else 0},
        "failed": int(failed.group(1)) if failed else 0,
    }


class PoolSampler:
    """Reads the pool's status page (GET /status?json on nginx's metrics
    listener) every 0.1 s while a load runs, and checks each answer:
    every field the status page promises is there, and idle + active =
    total. Keeps the reads, the bad ones, and the most busy workers and
    waiting connections seen."""

    FIELDS = ("pool", "process manager", "start time", "start since", "accepted conn",
              "listen queue", "max listen queue", "listen queue len", "idle processes",
              "active processes", "total processes", "max active processes",
              "max children reached", "slow requests", "terminated requests")

    def __init__(self, url):
        import threading
        self.url, self.stop_ev = url, threading.Event()
        self.got = {"reads": 0, "bad": 0, "max_active": 0, "total": 0, "max_queue": -1,
                    "accepted": 0}
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        import urllib.request
        g = self.got
        while not self.stop_ev.wait(0.1):
            try:
                with urllib.request.urlopen(self.url, timeout=5) as resp:
                    doc = json.loads(resp.read())
            except (OSError, ValueError):
                g["bad"] += 1
                continue
            g["reads"] += 1
            if any(k not in doc for k in self.FIELDS) or (
                    doc["idle processes"] + doc["active processes"] != doc["total processes"]) or (
                    doc["accepted conn"] < g["accepted"]):
                g["bad"] += 1
                continue
            g["accepted"] = doc["accepted conn"]
            g["max_active"] = max(g["max_active"], doc["active processes"])
            g["total"] = doc["total processes"]
            g["max_queue"] = max(g["max_queue"], doc["listen queue"])

    def stop(self):
        self.stop_ev.set()
        self.thread.join(10)
        return dict(self.got)


def cmd_measure(argv):
    import argparse
    ap = argparse.ArgumentParser(prog="bench.py measure")
    ap.add_argument("--records", required=True)
    ap.add_argument("--measure", required=True)
    ap.add_argument("--side", required=True)
    ap.add_argument("--conns", type=int, required=True)
    ap.add_argument("--kind", choices=["wrk", "pgbench"], required=True)
    ap.add_argument("--out", required=True, help="file for the generator's output")
    ap.add_argument("--logprefix", help="pgbench --log-prefix")
    ap.add_argument("--group", action="append", default=[], help="NAME=ROOTPID")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--extra", action="append", default=[], help="KEY=VALUE, stored as is")
    ap.add_argument("--status-url", help="the pool's /status?json, read during the run")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    groups = {}
    for g in a.group:
        name, _, pid = g.partition("=")
        groups[name] = int(pid) if pid.isdigit() else 0
    sampler = PoolSampler(a.status_url) if a.status_url else None
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = cpu_snapshot(groups)
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=a.timeout)
        out, rc = p.stdout.decode("utf-8", "replace"), p.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode("utf-8", "replace")
        rc = 124
    after = cpu_snapshot(groups)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    pool = sampler.stop() if sampler else None
    with open(a.out, "w") as f:
        f.write(out)
    res = parse_wrk(out) if a.kind == "wrk" else parse_pgbench(out, a.logprefix or "")
    if rc != 0 or res is None:
        sys.stderr.write(out[-3000:])
        die("%s exited with %d%s" % (cmd[0], rc, "" if res else " and printed no result"))
    cpu = cpu_delta(before, after)
    cpu["load"] = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    ours = sum(v for k, v in cpu.items() if k in groups or k == "load")
    cpu["other"] = max(0.0, cpu["machine_busy"] - ours)
    res["cpu_s"] = {k: round(v, 3) for k, v in cpu.items()}
    # Share of the machine's CPU time that went to processes outside this
    # benchmark during the run: the noise of a shared machine.
    ncpu = os.cpu_count() or 1
    res["others_pct"] = round(100.0 * cpu["other"] / max(cpu["wall"] * ncpu, 1e-9), 1)
    rec = {"measure": a.measure, "side": a.side, "conns": a.conns, "tool": a.kind}
    for kv in a.extra:
        k, _, v = kv.partition("=")
        rec[k] = v
    rec.update(res)
    if pool is not None:
        rec["pool"] = pool
    with open(a.records, "a") as f:
        f.write(json.dumps(rec) + "\n")
    print(json.dumps({k: rec.get(k) for k in ("rate", "p50_ms", "p99_ms", "requests", "failed")}))


# ---------------------------------------------------------------- memory

def worker_rss(sup):
    out = []
    for pid, st in sorted(_all_procs().items()):
        if st["ppid"] != sup:
            continue
        vals = {}
        try:
            with open("/proc/%d/status" % pid) as f:
                for line in f:
                    k, _, v = line.partition(":")
                    if k in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                        vals[k] = int(v.split()[0])
        except OSError:
            continue
        out.append({"pid": pid, "rss_kib": vals.get("VmRSS"), "anon_kib": vals.get("RssAnon"),
                    "file_kib": vals.get("RssFile"), "hwm_kib": vals.get("VmHWM")})
    return out


def served_by_pid(logpath):
    """Requests each worker logged (msg=request lines, by pid=)."""
    n = {}
    try:
        with open(logpath, encoding="utf-8", errors="replace") as f:
            for line in f:
                if " msg=request " in line:
                    m = re.search(r" pid=(\d+) ", line)
                    if m:
                        n[int(m.group(1))] = n.get(int(m.group(1)), 0) + 1
    except OSError:
        pass
    return n


def cmd_logged(argv):
    """logged LOG OFFSET TENANT: print how many request lines the pool
    wrote to LOG after byte OFFSET for a create of TENANT answered 201
    (idem=created: a new workflow). A line still being written is left
    for the next read."""
    path, offset, tenant = argv[0], int(argv[1]), argv[2]
    want = (" msg=request ", " method=POST ", " route=/v1/workflows ", " status=201 ",
            " tenant=%s " % tenant, " idem=created ")
    n = 0
    with open(path, "rb") as f:
        f.seek(offset)
        for raw in f:
            if not raw.endswith(b"\n"):
                break
            line = raw.decode("utf-8", "replace")
            if all(w in line for w in want):
                n += 1
    print(n)


def cmd_rss(argv):
    records, point, sup = argv[0], int(argv[1]), int(argv[2])
    served = int(argv[3]) if len(argv) > 3 else point
    by_pid = served_by_pid(argv[4]) if len(argv) > 4 else {}
    mix = argv[5] if len(argv) > 5 else None  # what the requests were
    w = worker_rss(sup)
    if not w:
        die("no workers under supervisor %d" % sup)
    for x in w:
        x["served"] = by_pid.get(x["pid"], 0)
    rec = {"measure": "memory", "point": point, "served": served, "workers": w}
    if mix:
        rec["mix"] = {"what": mix}
    with open(records, "a") as f:
        f.write(json.dumps(rec) + "\n")
    print(" ".join("%d:%dKiB/%d" % (x["pid"], x["rss_kib"], x["served"]) for x in w))


def cmd_seed(argv):
    """seed RECORDS URL TOKEN PREFIX N PAD [MEASURE]: create PREFIX-1 ..
    PREFIX-N, each with the body bench.lua's mix and storm replay (input.pad
    of PAD x's), over four keep-alive connections; append a record of
    MEASURE (default memory-seed)."""
    import http.client
    import threading
    import urllib.parse
    records, url, token, prefix, n, pad = argv[0], argv[1], argv[2], argv[3], int(argv[4]), \
        int(argv[5])
    measure = argv[6] if len(argv) > 6 else "memory-seed"
    body = ('{"type":"order-flow","input":{"pad":"%s"}}' % ("x" * pad)).encode()
    u = urllib.parse.urlsplit(url)
    statuses, lock = {}, threading.Lock()

    def run(part):
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        for i in range(part, n + 1, 4):
            conn.request("POST", "/v1/workflows", body, {
                "Authorization": "Bearer " + token, "Content-Type": "application/json",
                "Idempotency-Key": "%s-%d" % (prefix, i)})
            r = conn.getresponse()
            r.read()
            with lock:
                statuses[str(r.status)] = statuses.get(str(r.status), 0) + 1
        conn.close()

    th = [threading.Thread(target=run, args=(k,)) for k in range(1, 5)]
    t0 = time.monotonic()
    for t in th:
        t.start()
    for t in th:
        t.join()
    rec = {"measure": measure, "keys": n, "body_bytes": len(body), "status": statuses,
           "seconds": round(time.monotonic() - t0, 1), "ok": statuses == {"201": n}}
    with open(records, "a") as f:
        f.write(json.dumps(rec) + "\n")
    print(json.dumps(rec))
    if not rec["ok"]:
        die("seeding %d keys answered %s" % (n, statuses))


def cmd_dispatch(argv):
    records, output = argv[0], argv[1]
    text = open(output, encoding="utf-8", errors="replace").read()
    rec = {"measure": "dispatch"}
    m = re.search(r"idemflow-dispatch, (\d+) pending events per (?:measure|round), batch (\d+)"
                  r"(?:, (\d+) rounds)?", text)
    if m:
        rec["events"], rec["batch"] = int(m.group(1)), int(m.group(2))
        rec["rounds"] = int(m.group(3) or 1)
    m = re.search(r"^claim\+mark SQL only.*?\s(\d+)\s+([0-9.]+)\s*$", text, re.M)
    if m:
        rec["sql_only_rate"] = int(m.group(1))
    m = re.search(r"^http sink.*?\s(\d+)\s+([0-9.]+)\s*$", text, re.M)
    if m:
        rec["http_rate"], rec["http_ratio"] = int(m.group(1)), float(m.group(2))
    m = re.search(r"^amqp sink.*?\s(\d+)\s+([0-9.]+)\s*$", text, re.M)
    if m:
        rec["amqp_rate"], rec["amqp_ratio"] = int(m.group(1)), float(m.group(2))
    if "http_rate" not in rec:
        die("no numbers in the output of scripts/bench-dispatch (%s)" % output)
    with open(records, "a") as f:
        f.write(json.dumps(rec) + "\n")


# ---------------------------------------------------------------- results

def _read_records(path):
    recs = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                recs.append(json.loads(line))
    return recs


def _merge(recs):
    """Combine the rounds of one point (same measure, side and connections)
    into one record: requests and seconds add up, the rate is their
    quotient; latency percentiles are averaged weighted by requests (an
    approximation: the rounds are alike), the worst max is kept; CPU adds up."""
    out, index = [], {}
    for r in recs:
        if "requests" not in r or "side" not in r:
            out.append(r)
            continue
        key = (r["measure"], r["side"], r["conns"])
        if key not in index:
            index[key] = len(out)
            m = dict(r)
            m["rounds"] = 1
            m["cpu_s"] = dict(r.get("cpu_s", {}))
            m["errors"] = dict(r.get("errors", {}))
            m["status"] = dict(r.get("status", {}))
            if "pool" in r:
                m["pool"] = dict(r["pool"])
            if "rows" in r:
                m["rows"] = dict(r["rows"])
            out.append(m)
            continue
        m = out[index[key]]
        n0, n1 = m["requests"], r["requests"]
        for k in ("p50_ms", "p90_ms", "p99_ms", "p999_ms", "mean_ms"):
            if m.get(k) is not None and r.get(k) is not None and n0 + n1 > 0:
                m[k] = round((m[k] * n0 + r[k] * n1) / (n0 + n1), 3)
        if r.get("max_ms") is not None:
            m["max_ms"] = max(m.get("max_ms") or 0, r["max_ms"])
        w0, w1 = m["cpu_s"].get("wall", 0), r.get("cpu_s", {}).get("wall", 0)
        if m.get("others_pct") is not None and r.get("others_pct") is not None and w0 + w1 > 0:
            m["others_pct"] = round((m["others_pct"] * w0 + r["others_pct"] * w1) / (w0 + w1), 1)
        m["requests"] = n0 + n1
        m["seconds"] = round((m.get("seconds") or 0) + (r.get("seconds") or 0), 3)
        m["rate"] = round(m["requests"] / m["seconds"], 1) if m["seconds"] else 0.0
        m["failed"] = (m.get("failed") or 0) + (r.get("failed") or 0)
        for k, v in r.get("errors", {}).items():
            m["errors"][k] = m["errors"].get(k, 0) + v
        for k, v in r.get("status", {}).items():
            m["status"][k] = m["status"].get(k, 0) + v
        if "pool" in r and "pool" not in m:
            m["pool"] = dict(r["pool"])
        elif "pool" in r:
            p0, p1 = m["pool"], r["pool"]
            for k in ("reads", "bad"):
                p0[k] = p0.get(k, 0) + p1.get(k, 0)
            for k in ("max_active", "total", "max_queue", "accepted"):
                p0[k] = max(p0.get(k, 0), p1.get(k, 0))
        m["sent"] = (m.get("sent") or 0) + (r.get("sent") or 0)
        if "rows" in r and "rows" in m:
            m["rows"] = {k: m["rows"][k] + v if k != "ok" else m["rows"]["ok"] and v
                         for k, v in r["rows"].items()}
        elif "rows" in r:
            m["rows"] = dict(r["rows"])
        for k, v in r.get("cpu_s", {}).items():
            m["cpu_s"][k] = round(m["cpu_s"].get(k, 0) + v, 3)
        m["rounds"] += 1
    return out


def _side(recs, measure, side, conns=None):
    for r in recs:
        if r.get("measure") == measure and r.get("side") == side and (
                conns is None or r.get("conns") == conns):
            return r
    return None


def _slim(r):
    if r is None:
        return None
    keys = ("rate", "p50_ms", "p90_ms", "p99_ms", "p999_ms", "mean_ms", "max_ms", "requests",
            "seconds", "rounds", "failed", "errors", "cpu_s", "others_pct", "rows", "sent",
            "status", "tool", "pool")
    return {k: r[k] for k in keys if k in r}


def _ratio(a, b):
    if a is None or b is None or not b.get("rate"):
        return None
    return round(a["rate"] / b["rate"], 3)


def _rows_check(r):
    """A create run's workflows against its answers, exact: the run created
    exactly as many workflows as the pool logged creates answered 201
    (rows_end in scripts/bench). wrk's own count cannot be exact, since it
    stops with requests sent and unanswered; it must lie between: every
    answer that was not an error (wrk counts statuses >= 400 as errors; a
    fresh key is answered 201) was logged, and at most the unanswered
    requests beyond them."""
    answered = r["requests"] - r.get("errors", {}).get("status", 0)
    unread = max(0, (r.get("sent") or 0) - r["requests"])
    rows, logged = r["rows_written"]["workflows"], r["rows_written"]["logged_201"]
    return {"rows": rows, "logged_201": logged, "answered_201": answered, "unread": unread,
            "ok": rows == logged and answered <= logged <= answered + unread}


def _errors(r):
    """Error answers and transport errors of a record (wrk or pgbench);
    in a mix run the 409s it asks for are not errors."""
    if r is None:
        return 0
    e = dict(r.get("errors") or {})
    if r.get("status") and "status" in e:
        e["status"] = sum(v for k, v in r["status"].items() if k not in ("201", "409"))
    return sum(e.values())


def _clean(*recs):
    """No error answers, and every create run's rows match its answers."""
    for r in recs:
        if r is None:
            continue
        if _errors(r) or not r.get("rows", {}).get("ok", True):
            return False
    return True


def _transport_errors(r):
    """A record's socket errors and timeouts: no answer at all."""
    e = dict((r or {}).get("errors") or {})
    e.pop("status", None)
    return sum(e.values())


def _only_status(r, allowed):
    """True when every answer of run r had one of the allowed statuses."""
    st = (r or {}).get("status") or {}
    return bool(st) and all(k in allowed for k in st)


def _status_rate(r, status):
    """r's rate of answers with status, by its share of all answers."""
    if not r or not r.get("rate"):
        return None
    st = r.get("status") or {}
    total = sum(st.values())
    return r["rate"] * st.get(status, 0) / total if total else None


def _combined(healthz, pgbench):
    """The rate a create would reach if it cost exactly an empty FastCGI
    answer plus its SQL: 1 / (1/healthz + 1/pgbench)."""
    if not healthz or not pgbench or not healthz.get("rate") or not pgbench.get("rate"):
        return None
    return round(1.0 / (1.0 / healthz["rate"] + 1.0 / pgbench["rate"]), 1)


def _div(a, b):
    return round(a / b, 3) if a is not None and b else None


def build_results(recs, facts):
    res = {"date": facts.get("date"), "machine": facts.get("machine", {}),
           "settings": facts.get("settings", {}), "creates": [], "replays": [],
           "replays_nocache": [], "storm": [], "overload": [], "commit_delay": [],
           "memory": None, "scale": None, "fanout": None, "dispatch": None, "targets": []}
    rows = {r["tag"]: r["rows"] for r in recs if r.get("measure") == "rows"}
    for r in recs:
        if r.get("tag") in rows and r.get("tool") == "wrk":
            r["rows_written"] = rows[r["tag"]]
            r["rows"] = _rows_check(r)
    recs = _merge(recs)
    conns = sorted({r["conns"] for r in recs if r.get("measure") in ("creates", "replays")})
    for c in conns:
        h, p = _side(recs, "creates", "http", c), _side(recs, "creates", "pgbench", c)
        if h or p:
            res["creates"].append({"conns": c, "http": _slim(h), "ceiling": _slim(p),
                                   "ratio": _ratio(h, p)})
        for meas, sec in (("replays", "replays"), ("replays-nocache", "replays_nocache")):
            h, p = _side(recs, meas, "http", c), _side(recs, meas, "healthz", c)
            if h or p:
                res[sec].append({"conns": c, "http": _slim(h), "ceiling": _slim(p),
                                 "ratio": _ratio(h, p)})
    # The ceilings of a create. pgbench at c clients opens c backends while
    # the service keeps its pool, and on a small machine the rate falls as
    # backends are added: the machine's real ceiling is pgbench's best over
    # every client count. The combined ceiling adds an empty FastCGI answer
    # (GET /healthz at the same connections) to the SQL.
    # The counts include the pool's own size (scripts/bench adds it), the
    # backends the service itself holds; a best taken without it is not
    # the ceiling of the service's own shape, and no target is judged on it.
    pg = [x["ceiling"] for x in res["creates"] if x["ceiling"] and x["ceiling"].get("rate")]
    best = max(pg, key=lambda r: r["rate"]) if pg else None
    if best:
        best_c = next(x["conns"] for x in res["creates"] if x["ceiling"] is best)
        over = [x["conns"] for x in res["creates"] if x["ceiling"] and x["ceiling"].get("rate")]
        res["pgbench_best"] = {"rate": best["rate"], "conns": best_c, "over": over,
                               "pool_size": res["settings"].get("workers"),
                               "includes_pool": res["settings"].get("workers") in over}
        if not res["pgbench_best"]["includes_pool"]:
            best = None
    hz = {x["conns"]: x["ceiling"] for x in res["replays"] if x["ceiling"]}
    # Replays likewise against GET /healthz's best over the counts.
    hzs = [x for x in hz.values() if x.get("rate")]
    hz_best = max(hzs, key=lambda r: r["rate"]) if hzs else None
    if hz_best:
        res["healthz_best"] = {"rate": hz_best["rate"],
                               "conns": next(c for c, x in hz.items() if x is hz_best)}
    for x in res["replays"]:
        x["ratio_best"] = _ratio(x["http"], hz_best)
    for x in res["creates"]:
        h = x["http"]
        x["ratio_best"] = _ratio(h, best)
        x["healthz"] = hz[x["conns"]]["rate"] if x["conns"] in hz else None
        x["combined"] = _combined(hz.get(x["conns"]), x["ceiling"])
        x["combined_best"] = _combined(hz.get(x["conns"]), best)
        x["ratio_combined"] = _div(h and h["rate"], x["combined"])
        x["ratio_combined_best"] = _div(h and h["rate"], x["combined_best"])
        x["clean"] = _clean(x["http"], x["ceiling"])

    # The retry storm: every replay a key no worker has cached, against
    # healthz at the same count combined with pgbench replaying such keys
    # at its best over the client counts (the pool's size among them), as
    # the creates' ceiling is.
    sp = [r for r in recs if r.get("measure") == "storm" and r.get("side") == "pgbench"
          and r.get("rate")]
    sbest = max(sp, key=lambda r: r["rate"]) if sp else None
    if sbest:
        res["storm_pgbench_best"] = {"rate": sbest["rate"], "conns": sbest["conns"]}
    for c in sorted({r["conns"] for r in recs if r.get("measure") == "storm"
                     and r.get("side") == "http"}):
        h, p = _side(recs, "storm", "http", c), _side(recs, "storm", "pgbench", c)
        comb = _combined(hz.get(c), sbest)
        res["storm"].append({"conns": c, "http": _slim(h), "ceiling": _slim(p),
                             "healthz": hz[c]["rate"] if c in hz else None,
                             "combined": comb, "ratio_combined": _div(h and h["rate"], comb),
                             "status": (h or {}).get("status"),
                             "keys": next((r.get("keys") for r in recs
                                           if r.get("measure") == "storm-seed"), None),
                             "clean": _clean(h, p) and _only_status(h, ("201",))})
    # Overload: creates past the pool's size. An answer is a 201, or a fast
    # 503 or 429; a timeout or a socket error is not.
    for c in sorted({r["conns"] for r in recs if r.get("measure") == "overload"}):
        h = _side(recs, "overload", "http", c)
        best_comb = max((x["combined_best"] for x in res["creates"] if x.get("combined_best")),
                        default=None)
        res["overload"].append({"conns": c, "http": _slim(h), "status": (h or {}).get("status"),
                                "combined_best": best_comb,
                                "ratio_combined_best": _div(_status_rate(h, "201"), best_comb),
                                "p99_over_p50": _div(h and h.get("p99_ms"),
                                                     h and h.get("p50_ms")),
                                "clean": _only_status(h, ("201", "503", "429")) and
                                _transport_errors(h) == 0})

    # Group commit: each commit_delay setting's creates against pgbench
    # under the same setting.
    fs = next((r for r in recs if r.get("measure") == "fsync"), None)
    sets = sorted({r["measure"] for r in recs if r.get("measure", "").startswith("commit-")},
                  key=lambda m: int(m.split("-")[1]))
    for m in sets:
        _, delay, sib = m.split("-")
        pb = [r for r in recs if r.get("measure") == m and r.get("side") == "pgbench"
              and r.get("rate")]
        best = max(pb, key=lambda r: r["rate"]) if pb else None
        for c in sorted({r["conns"] for r in recs if r.get("measure") == m}):
            h, p = _side(recs, m, "http", c), _side(recs, m, "pgbench", c)
            res["commit_delay"].append({"commit_delay_us": int(delay),
                                        "commit_siblings": int(sib), "conns": c,
                                        "fdatasync_us": fs and fs["fdatasync_us"],
                                        "http": _slim(h), "ceiling": _slim(p),
                                        "pgbench_best": best and best["rate"],
                                        "ratio": _ratio(h, p), "ratio_best": _ratio(h, best),
                                        "clean": _clean(h, p)})

    mem = [r for r in recs if r.get("measure") == "memory"]
    if mem:
        points = sorted({r["point"] for r in mem})
        workers = {}
        for r in mem:
            for w in r["workers"]:
                workers.setdefault(w["pid"], {})[str(r["point"])] = w
        rows = []
        for pid, by in sorted(workers.items()):
            row = {"pid": pid}
            for pt in points:
                w = by.get(str(pt))
                row["rss_kib_%d" % pt] = w["rss_kib"] if w else None
                row["anon_kib_%d" % pt] = w["anon_kib"] if w else None
                row["served_%d" % pt] = w.get("served") if w else None
            lo, hi = [p for p in points if p > 0][:1], points[-1:]
            if lo and hi and by.get(str(lo[0])) and by.get(str(hi[0])):
                row["growth_kib"] = by[str(hi[0])]["rss_kib"] - by[str(lo[0])]["rss_kib"]
            rows.append(row)
        drive = [r for r in recs if r.get("measure") == "memory-drive"]
        seed = next((r for r in recs if r.get("measure") == "memory-seed"), None)
        res["memory"] = {"points": points,
                         "served": {str(r["point"]): r.get("served") for r in mem},
                         "workers": rows, "drive": [_slim(r) for r in drive],
                         "seed": seed and {k: v for k, v in seed.items() if k != "measure"},
                         "mix": next((r.get("mix") for r in mem if r.get("mix")), None),
                         "clean": _clean(*drive) and (seed is None or seed.get("ok", False))}

    sides = ("http-empty", "http-large", "http-own", "pgbench-empty", "pgbench-large",
             "pgbench-own")
    sc = {k: _side(recs, "scale", k) for k in sides}
    if sc["http-empty"] or sc["http-large"] or sc["http-own"]:
        load = next((r for r in recs if r.get("measure") == "scale-load"), {})
        res["scale"] = {"existing_keys": load.get("rows"), "load_seconds": load.get("seconds"),
                        "large_db_size": load.get("db_size"),
                        "conns": next(r for r in sc.values() if r)["conns"],
                        "empty": _slim(sc["http-empty"]), "large": _slim(sc["http-large"]),
                        "own": _slim(sc["http-own"]),
                        "ratio": _ratio(sc["http-large"], sc["http-empty"]),
                        "ratio_own": _ratio(sc["http-own"], sc["http-empty"]),
                        "pgbench_empty": _slim(sc["pgbench-empty"]),
                        "pgbench_large": _slim(sc["pgbench-large"]),
                        "pgbench_own": _slim(sc["pgbench-own"]),
                        "pgbench_ratio": _ratio(sc["pgbench-large"], sc["pgbench-empty"]),
                        "pgbench_ratio_own": _ratio(sc["pgbench-own"], sc["pgbench-empty"]),
                        "clean": _clean(*sc.values())}

    res["fanout"] = fanout_results(recs)

    d = next((r for r in recs if r.get("measure") == "dispatch"), None)
    if d:
        res["dispatch"] = {k: v for k, v in d.items() if k != "measure"}

    # Targets: a ratio is met only by a run without error answers whose
    # creates wrote exactly the rows they were answered 201 for.
    t = res["targets"]

    def target(name, want, observed, ok, clean):
        t.append({"name": name, "target": want, "observed": observed, "clean": clean,
                  "met": observed is not None and ok and clean})

    creates_clean = all(x["clean"] for x in res["creates"])
    c16 = next((x for x in res["creates"] if x["conns"] == TARGET_CONNS), None)
    if c16:
        target("keyed creates / pgbench's best, %d connections" % TARGET_CONNS,
               ">= %.2f" % TARGET_CREATES, c16["ratio_best"],
               c16["ratio_best"] is not None and c16["ratio_best"] >= TARGET_CREATES,
               creates_clean)
    for c in TARGET_COMBINED_CONNS:
        x = next((x for x in res["creates"] if x["conns"] == c), None)
        if x and x["ratio_combined_best"] is not None:
            target("keyed creates / combined ceiling, %d connections" % c,
                   ">= %.2f" % TARGET_COMBINED, x["ratio_combined_best"],
                   x["ratio_combined_best"] >= TARGET_COMBINED, creates_clean)
    r16 = next((x for x in res["replays"] if x["conns"] == TARGET_CONNS), None)
    if r16:
        target("replays / empty FastCGI's best, %d connections" % TARGET_CONNS,
               ">= %.2f" % TARGET_REPLAYS, r16["ratio_best"],
               r16["ratio_best"] is not None and r16["ratio_best"] >= TARGET_REPLAYS,
               all(_clean(x["http"], x["ceiling"]) for x in res["replays"]))
    for x in res["storm"]:
        target("retry storm (cold replays) / combined ceiling, %d connections" % x["conns"],
               ">= %.2f" % TARGET_STORM, x["ratio_combined"],
               x["ratio_combined"] is not None and x["ratio_combined"] >= TARGET_STORM,
               x["clean"])
    for x in res["overload"]:
        n = _transport_errors(x["http"])
        target("overload, %d connections: timeouts and socket errors" % x["conns"], "0", n,
               n == 0 and _only_status(x["http"], ("201", "503", "429")), True)
    c64 = next((x for x in res["creates"] if x["conns"] == 64), None)
    if c64 and c64.get("http") and c64["http"].get("p50_ms"):
        q = _div(c64["http"].get("p99_ms"), c64["http"]["p50_ms"])
        target("creates, 64 connections: p99 / p50", "<= %.0f" % TARGET_P99_P50, q,
               q is not None and q <= TARGET_P99_P50, creates_clean)
    if res["memory"]:
        pts = res["memory"]["points"]
        hi = pts[-1]
        rss = [w.get("rss_kib_%d" % hi) for w in res["memory"]["workers"]]
        rss = [x for x in rss if x is not None]
        target("worker RSS after %s requests, largest (KiB)" % _count(hi),
               "<= %d" % TARGET_RSS_KIB, max(rss) if rss else None,
               bool(rss) and max(rss) <= TARGET_RSS_KIB, res["memory"]["clean"])
        g = [w["growth_kib"] for w in res["memory"]["workers"] if "growth_kib" in w]
        lo = [p for p in pts if p > 0][0]
        target("worker RSS growth %s -> %s requests, largest (KiB)" % (_count(lo), _count(hi)),
               "<= %d (noise)" % RSS_NOISE_KIB, max(g) if g else None,
               bool(g) and max(g) <= RSS_NOISE_KIB, res["memory"]["clean"])
    scl = res["scale"]
    if scl:
        n = _count(scl["existing_keys"] or 0)
        for key, what in (("ratio", "another tenant's"), ("ratio_own", "its own")):
            if scl[key] is not None:
                target("creates, %s %s keys / empty table" % (what, n), ">= %.2f" % TARGET_SCALE,
                       scl[key], scl[key] >= TARGET_SCALE, scl["clean"])
    fo = res["fanout"]
    if fo and fo["cpu_ratio"] is not None:
        target("create CPU (workers + PostgreSQL), %d matching endpoints / none"
               % fo["endpoints"], "<= %.2f" % TARGET_FANOUT_CPU, fo["cpu_ratio"],
               fo["cpu_ratio"] <= TARGET_FANOUT_CPU, fo["clean"])
    return res


def cpu_ms_per_request(r, groups):
    """CPU milliseconds per request of a merged record, summed over the
    process groups named (e.g. workers and postgres); None without
    requests or CPU."""
    if not r or not r.get("requests") or "cpu_s" not in r:
        return None
    return round(sum(r["cpu_s"].get(g, 0.0) for g in groups) * 1000.0 / r["requests"], 4)


FANOUT_SIDES = ("http-none", "http-three", "pgbench-none", "pgbench-three")


def fanout_results(recs):
    """The fan-out measure from merged records: keyed creates (wrk) and the
    create's SQL (pgbench) for a tenant with no endpoint and with
    FANOUT_ENDPOINTS matching ones, rounds alternating. The cost is CPU per
    create, not the rate: on a shared machine the rate moves with the
    neighbours, the CPU a create takes much less. For the creates, the
    workers' and PostgreSQL's CPU (nginx and wrk do the same work on both
    sides); for pgbench, PostgreSQL's. None when the measure did not run."""
    s = {k: _side(recs, "fanout", k) for k in FANOUT_SIDES}
    if not any(s.values()):
        return None
    both = ("workers", "postgres")
    ms = {"http_none": cpu_ms_per_request(s["http-none"], both),
          "http_three": cpu_ms_per_request(s["http-three"], both),
          "pgbench_none": cpu_ms_per_request(s["pgbench-none"], ("postgres",)),
          "pgbench_three": cpu_ms_per_request(s["pgbench-three"], ("postgres",))}
    return {"conns": next(r for r in s.values() if r)["conns"],
            "endpoints": FANOUT_ENDPOINTS,
            "none": _slim(s["http-none"]), "three": _slim(s["http-three"]),
            "pgbench_none": _slim(s["pgbench-none"]),
            "pgbench_three": _slim(s["pgbench-three"]),
            "cpu_ms": ms,
            "cpu_ratio": _div(ms["http_three"], ms["http_none"]),
            "pgbench_cpu_ratio": _div(ms["pgbench_three"], ms["pgbench_none"]),
            "rate_ratio": _ratio(s["http-three"], s["http-none"]),
            "pgbench_rate_ratio": _ratio(s["pgbench-three"], s["pgbench-none"]),
            "clean": _clean(*s.values())}


def fanout_lines(fo):
    """The fan-out measure's lines of the table: CPU per create, side by
    side, and the rates."""
    if not fo:
        return []
    ms = fo["cpu_ms"]

    def side(name, r, cpu):
        return "    %-30s %9s %10s/s %6s%%" % (
            name, _f(cpu, "%.3f"), _f((r or {}).get("rate")),
            _f((r or {}).get("others_pct"), "%.0f"))

    return [
        "",
        "Fan-out: a create whose tenant has %d matching endpoints (a delivery each, "
        "written by the trigger) vs none, %s connections, rounds alternating:"
        % (fo["endpoints"], fo["conns"]),
        "    %-30s %9s %12s %7s" % ("", "CPU ms", "rate", "others"),
        side("creates, no endpoint", fo.get("none"), ms["http_none"]),
        side("creates, %d endpoints" % fo["endpoints"], fo.get("three"), ms["http_three"]),
        side("pgbench, same SQL, no endpoint", fo.get("pgbench_none"), ms["pgbench_none"]),
        side("pgbench, same SQL, %d endpoints" % fo["endpoints"], fo.get("pgbench_three"),
             ms["pgbench_three"]),
        "    CPU per create, %d endpoints / none: %s (workers + PostgreSQL), %s (pgbench: "
        "PostgreSQL); rate %s, %s" % (fo["endpoints"], _f(fo["cpu_ratio"], "%.3f"),
                                      _f(fo["pgbench_cpu_ratio"], "%.3f"),
                                      _f(fo["rate_ratio"], "%.3f"),
                                      _f(fo["pgbench_rate_ratio"], "%.3f")),
    ]


def _status_text(st):
    return ", ".join("%s x%d" % kv for kv in sorted((st or {}).items())) or "-"


def _count(n):
    if n is None:
        return "?"
    if n >= 1000000 and n % 1000000 == 0:
        return "%dM" % (n // 1000000)
    if n >= 1000 and n % 1000 == 0:
        return "%dk" % (n // 1000)
    return str(n)


def _f(v, fmt="%.0f"):
    return "-" if v is None else fmt % v


def _r(v):
    """A ratio to its ceiling. Above 1 the load outran its ceiling: at that
    count the ceiling is no ceiling, and the mark says so (the table's note
    explains it); targets are judged against the best only."""
    if v is None:
        return "-"
    return "%.2f%s" % (v, "!" if v > 1 else "")


def _over_one(res):
    """Whether any ratio of the table is above 1."""
    for sec in ("creates", "replays", "replays_nocache"):
        for x in res.get(sec) or []:
            for k in ("ratio", "ratio_best", "ratio_combined", "ratio_combined_best"):
                if x.get(k) is not None and x[k] > 1:
                    return True
    sc = res.get("scale") or {}
    return any(sc.get(k) is not None and sc[k] > 1
               for k in ("ratio", "ratio_own", "pgbench_ratio", "pgbench_ratio_own"))


CPU_COLS = (("load", "load"), ("nginx", "nginx"), ("workers", "workers"),
            ("postgres", "PostgreSQL"), ("other", "other"))


def _cpu_row(r):
    """CPU milliseconds per request by process group, and their total, from
    a record; None when it has none."""
    if not r or "cpu_s" not in r or not r.get("requests"):
        return None
    c, n = r["cpu_s"], r["requests"]
    ms = [c.get(k, 0.0) * 1000.0 / n for k, _ in CPU_COLS]
    return ms + [sum(ms)], 100.0 * c.get("machine_busy", 0) / max(c.get("wall", 0), 1e-9)


def _rows_text(r):
    """The rows check of a create record, short: workflows = logged 201s,
    and how many of them wrk stopped before reading."""
    rc = (r or {}).get("rows")
    if not rc:
        return "-"
    late = rc["logged_201"] - rc["answered_201"]
    if rc["ok"]:
        return "%d = %d%s" % (rc["rows"], rc["logged_201"],
                              " (%d unread by wrk)" % late if late else "")
    if rc["rows"] != rc["logged_201"]:
        return "%d workflows != %d logged 201s: WRONG" % (rc["rows"], rc["logged_201"])
    return "%d logged 201s, wrk read %d of %d sent: WRONG" % (
        rc["logged_201"], rc["answered_201"], rc["answered_201"] + rc["unread"])


def render_table(res):
    L = []
    m = res["machine"]
    s = res["settings"]
    L.append("idemflow benchmark, %s" % res.get("date", "?"))
    L.append("machine: %s cores (%s), %s MiB RAM, %s; PostgreSQL %s; nginx %s" % (
        m.get("nproc"), m.get("cpu_model"), m.get("mem_mib"), m.get("kernel"),
        m.get("postgresql"), m.get("nginx")))
    L.append("stack: %s workers, PostgreSQL fsync=%s synchronous_commit=%s "
             "shared_buffers=%s; %s s per point; load avg at start %s" % (
                 s.get("workers"), s.get("fsync"), s.get("synchronous_commit"),
                 s.get("shared_buffers"), s.get("seconds"), m.get("loadavg_start")))
    if s.get("pgbench_statements"):
        L.append("pgbench ceiling runs, per transaction: %s (from app/server/queries.c)" %
                 s["pgbench_statements"])
    L.append("")
    fmt = "%-36s %5s %8s %7s %7s   %8s %7s %7s %6s %7s"
    hdr = fmt % ("measure (vs ceiling)", "conns", "rate/s", "p50 ms", "p99 ms",
                 "ceil/s", "p50 ms", "p99 ms", "ratio", "others")
    L.append(hdr)
    L.append("-" * len(hdr))

    def row(name, conns, h, c, ratio):
        h, c = h or {}, c or {}
        fails = _errors(h) + _errors(c)
        noise = [x.get("others_pct") for x in (h, c) if x.get("others_pct") is not None]
        L.append(fmt % (
            name, conns, _f(h.get("rate")), _f(h.get("p50_ms"), "%.2f"),
            _f(h.get("p99_ms"), "%.2f"), _f(c.get("rate")), _f(c.get("p50_ms"), "%.2f"),
            _f(c.get("p99_ms"), "%.2f"), _r(ratio),
            ("%.0f%%" % max(noise)) if noise else "-") +
            ("  (%d errors!)" % fails if fails else ""))

    for i, x in enumerate(res["creates"]):
        row("keyed creates (vs pgbench, same SQL)" if i == 0 else "", x["conns"], x["http"],
            x["ceiling"], x["ratio"])
    for i, x in enumerate(res["replays"]):
        row("replays (vs GET /healthz, 204)" if i == 0 else "", x["conns"], x["http"],
            x["ceiling"], x["ratio"])
    for x in res.get("replays_nocache", []):
        row("  replay_cache_ttl = 0 (vs /healthz)", x["conns"], x["http"], x["ceiling"],
            x["ratio"])
    for i, x in enumerate(res.get("storm", [])):
        row("retry storm, cold (vs pgbench replays)" if i == 0 else "", x["conns"], x["http"],
            x["ceiling"], _ratio(x["http"], x["ceiling"]))
    sc = res.get("scale")
    if sc:
        n = _count(sc["existing_keys"] or 0)
        for key, what in (("large", "other tenant"), ("own", "own tenant")):
            if sc.get(key):
                row("creates, %s keys, %s" % (n, what), sc["conns"], sc[key],
                    sc["empty"], sc["ratio" if key == "large" else "ratio_own"])
        for key, what in (("pgbench_large", "other tenant"), ("pgbench_own", "own tenant")):
            if sc.get(key):
                row("  pgbench, same SQL, %s" % what, sc["conns"], sc[key],
                    sc.get("pgbench_empty"),
                    sc["pgbench_ratio" if key == "pgbench_large" else "pgbench_ratio_own"])
        if sc.get("load_seconds"):
            L.append("  (vs empty tables; %s rows each in idempotency_keys, workflows, outbox of "
                     "tenant bench-large, loaded in %.0f s; creates as tenant bench (other) and "
                     "as bench-large (own), random keys)" % (n, sc["load_seconds"]))
    L.extend(fanout_lines(res.get("fanout")))
    d = res.get("dispatch")
    if d:
        L.append(fmt % ("dispatch, http sink (vs its SQL alone)", "-", _f(d.get("http_rate")),
                        "", "", _f(d.get("sql_only_rate")), "", "", _f(d.get("http_ratio"), "%.2f"),
                        ""))
        L.append("  (events/s draining %s pending events, batch %s, %s alternating rounds: "
                 "scripts/bench-dispatch)" % (_count(d.get("events")), d.get("batch"),
                                              d.get("rounds", 1)))
    L.append("  rates in requests/s; others = share of the machine's CPU used by processes "
             "outside the benchmark during the run (noise)")
    noisy = [x.get("others_pct") for sec in ("creates", "replays", "replays_nocache")
             for row_ in res.get(sec, [])
             for x in (row_["http"] or {}, row_["ceiling"] or {})
             if x.get("others_pct") is not None]
    if noisy and max(noisy) > NOISY_PCT:
        L.append("  WARNING: other processes used up to %.0f%% of the CPU during this run: the "
                 "ratios measure a busy machine; rerun on a quiet one" % max(noisy))

    if res["creates"]:
        pb = res.get("pgbench_best") or {}
        L.append("")
        L.append("keyed creates against their ceilings (same run): pgbench's best is %s/s at "
                 "%s clients; combined = 1 / (1/healthz + 1/pgbench)" % (
                     _f(pb.get("rate")), pb.get("conns", "-")))
        cfmt = "%5s %9s   %9s %6s %8s   %9s %10s %6s %8s   %6s  %s"
        L.append(cfmt % ("conns", "creates/s", "pgbench/s", "ratio", "vs best", "healthz/s",
                         "combined/s", "ratio", "(same c)", "errors",
                         "workflows = logged 201s"))
        for x in res["creates"]:
            h = x["http"] or {}
            L.append(cfmt % (x["conns"], _f(h.get("rate")), _f((x["ceiling"] or {}).get("rate")),
                             _r(x["ratio"]), _r(x.get("ratio_best")),
                             _f(x.get("healthz")), _f(x.get("combined_best")),
                             _r(x.get("ratio_combined_best")),
                             _r(x.get("ratio_combined")),
                             _errors(x["http"]) + _errors(x["ceiling"]), _rows_text(h)))
        L.append("  combined/s: healthz at the same connections with pgbench's best; (same c): "
                 "the ratio with pgbench at the same count")
        if pb and not pb.get("includes_pool"):
            L.append("  WARNING: pgbench's best was taken over %s clients, without the pool's "
                     "size (%s): no target is judged against it" % (pb.get("over"),
                                                                    pb.get("pool_size")))

    if res.get("storm"):
        L.append("")
        sb = res.get("storm_pgbench_best") or {}
        L.append("retry storm: %s keys created beforehand, each replayed at most once per point "
                 "(no worker has it cached); combined = 1 / (1/healthz + 1/pgbench replaying, "
                 "its best: %s/s at %s clients)" % (_f(res["storm"][0].get("keys")),
                                                    _f(sb.get("rate")), sb.get("conns", "-")))
        sfmt = "%5s %9s   %9s %9s %10s %6s   %s"
        L.append(sfmt % ("conns", "replays/s", "pgbench/s", "healthz/s", "combined/s", "ratio",
                         "answers"))
        for x in res["storm"]:
            L.append(sfmt % (x["conns"], _f((x["http"] or {}).get("rate")),
                             _f((x["ceiling"] or {}).get("rate")), _f(x.get("healthz")),
                             _f(x.get("combined")), _r(x.get("ratio_combined")),
                             _status_text(x.get("status"))))
    if res.get("overload"):
        L.append("")
        L.append("overload: creates at more connections than the pool's %s workers (nginx "
                 "queues them); 201s/s against the best combined ceiling of the creates" %
                 res["settings"].get("workers"))
        ofmt = "%5s %8s %8s %8s %9s %6s   %s"
        L.append(ofmt % ("conns", "201s/s", "p50 ms", "p99 ms", "p99/p50", "ratio", "answers"))
        for x in res["overload"]:
            h = x["http"] or {}
            L.append(ofmt % (x["conns"], _f(_status_rate(h, "201")), _f(h.get("p50_ms"), "%.2f"),
                             _f(h.get("p99_ms"), "%.2f"), _f(x.get("p99_over_p50"), "%.1f"),
                             _r(x.get("ratio_combined_best")),
                             _status_text(x.get("status")) +
                             ("; %d socket errors/timeouts" % _transport_errors(h)
                              if _transport_errors(h) else "")))

    if res.get("commit_delay"):
        cd = res["commit_delay"]
        L.append("")
        L.append("group commit: one 8 kB WAL flush (fdatasync) takes %s us on this disk; creates "
                 "and pgbench under each commit_delay" % cd[0].get("fdatasync_us"))
        dfmt = "%9s %9s %5s %9s %8s %9s %8s %6s %8s %6s"
        L.append(dfmt % ("delay us", "siblings", "conns", "creates/s", "p99 ms", "pgbench/s",
                         "p99 ms", "ratio", "vs best", "errors"))
        for x in cd:
            h, c = x["http"] or {}, x["ceiling"] or {}
            L.append(dfmt % (x["commit_delay_us"], x["commit_siblings"], x["conns"],
                             _f(h.get("rate")), _f(h.get("p99_ms"), "%.2f"), _f(c.get("rate")),
                             _f(c.get("p99_ms"), "%.2f"), _r(x["ratio"]), _r(x["ratio_best"]),
                             _errors(x["http"]) + _errors(x["ceiling"])))
        L.append("  vs best: creates against pgbench's best count under the same setting")

    mem = res.get("memory")
    if mem:
        pts = mem["points"]
        L.append("")
        L.append("worker RSS (KiB)   " + "".join(
            "%12s" % ("start" if p == 0 else "after " + _count(p)) for p in pts) +
            "%10s   %-9s %s" % ("growth", "private", "requests served"))
        for w in mem["workers"]:
            L.append("  worker %-9d " % w["pid"] + "".join(
                "%12s" % _f(w.get("rss_kib_%d" % p)) for p in pts) +
                "%10s   %-9s %s" % (_f(w.get("growth_kib"), "%+d"),
                                    _f(w.get("anon_kib_%d" % pts[-1])),
                                    " / ".join(_f(w.get("served_%d" % p))
                                               for p in pts if p > 0)))
        mix = mem.get("mix") or {}
        seed = mem.get("seed") or {}
        statuses = {}
        for r in mem.get("drive") or []:
            for k, v in (r.get("status") or {}).items():
                statuses[k] = statuses.get(k, 0) + v
        L.append("  (requests answered to the pool of fresh workers: %s; %s; the mix at 16 "
                 "connections answered %s)" % (
                     ", ".join("%s" % mem["served"].get(str(p)) for p in pts if p > 0),
                     mix.get("what", "creates"),
                     ", ".join("%s x%d" % kv for kv in sorted(statuses.items())) or "-"))

    L.append("")
    L.append("%-58s %-16s %10s  %s" % ("target", "wanted", "observed", ""))
    for t in res["targets"]:
        obs = t["observed"]
        L.append("%-58s %-16s %10s  %s" % (t["name"], t["target"],
                                           _f(obs, "%.3f" if isinstance(obs, float) else "%d"),
                                           "met" if t["met"] else
                                           "MISSED" if t.get("clean", True) else
                                           "MISSED (errors or workflows != 201s)"))
    if _over_one(res):
        L.append("")
        L.append("! a ratio above 1: the load outran its ceiling at that count, so there the "
                 "ceiling is not a ceiling; targets are judged only against the best over "
                 "every count")
    cpu = []
    cfmt = "  %-22s %5s" + " %8s" * (len(CPU_COLS) + 1) + "   %s"

    def cpu_line(label, conns, r):
        got = _cpu_row(r)
        if got:
            ms, busy = got
            cpu.append(cfmt % ((label, conns) + tuple("%.3f" % v for v in ms) +
                               ("busy %.0f%%" % (busy / (os.cpu_count() or 1)),)))

    hz = {x["conns"]: x["ceiling"] for x in res["replays"]}
    for x in res["creates"]:
        cpu_line("creates", x["conns"], x["http"])
        cpu_line("pgbench, same SQL", x["conns"], x["ceiling"])
        cpu_line("healthz", x["conns"], hz.get(x["conns"]))
    for meas, label in (("replays", "replays"), ("replays_nocache", "replays, no cache")):
        for x in res.get(meas, []):
            if x["conns"] == TARGET_CONNS:
                cpu_line(label, x["conns"], x["http"])
    pools = [(x["conns"], x["http"]["pool"]) for x in res["creates"]
             if x.get("http") and x["http"].get("pool")]
    if pools:
        L.append("")
        L.append("The pool's status page (GET /status?json every 0.1 s) during the creates:")
        for c, pl in pools:
            L.append("  c=%-3d %5d reads, %d bad; busy up to %d of %d workers; up to %s "
                     "connections waiting" % (c, pl["reads"], pl["bad"], pl["max_active"],
                                              pl["total"], pl["max_queue"]
                                              if pl["max_queue"] >= 0 else "? (not told)"))
    if cpu:
        L.append("")
        L.append("CPU per request, ms, by process (load = wrk or pgbench; other = the rest of "
                 "the machine; busy = share of all cores):")
        L.append(cfmt % (("", "conns") + tuple(t for _, t in CPU_COLS) + ("total", "")))
        L.extend(cpu)
    return "\n".join(L) + "\n"


# ---------------------------------------------------------------- plots

def plot(res, outdir):
    gp = shutil.which("gnuplot")
    if not gp:
        print("bench.py: gnuplot not found: no plots (apt-get install gnuplot-nox)",
              file=sys.stderr)
        return []
    m = res["machine"]
    sub = "%s, %s cores, %s; %s workers; %s s per point" % (
        res.get("date", "")[:10], m.get("nproc"), m.get("cpu_model"),
        res["settings"].get("workers"), res["settings"].get("seconds"))
    made = []
    for name, title, what, ceil, xlabel in (
            ("creates", "Keyed creates: POST /v1/workflows through nginx",
             "POST, new Idempotency-Key each (wrk)",
             "ceiling: pgbench, the same SQL (auth + create), same socket",
             "concurrent connections (wrk) / clients (pgbench)"),
            ("replays", "Replays: the same key again through nginx",
             "POST, one fixed Idempotency-Key (wrk)",
             "ceiling: GET /healthz, empty FastCGI answer (wrk)",
             "concurrent connections (wrk)")):
        rows = [x for x in res[name] if x["http"] and x["ceiling"] and x["ratio"] is not None]
        if not rows:
            continue
        dat = os.path.join(outdir, name + ".dat")
        with open(dat, "w") as f:
            f.write("# conns rate ceiling ratio p50 p99 ceil_p50 ceil_p99\n")
            for x in rows:
                f.write("%d %.1f %.1f %.3f %s %s %s %s\n" % (
                    x["conns"], x["http"]["rate"], x["ceiling"]["rate"], x["ratio"],
                    x["http"]["p50_ms"], x["http"]["p99_ms"], x["ceiling"]["p50_ms"],
                    x["ceiling"]["p99_ms"]))
        png = os.path.join(outdir, name + ".png")
        # Labels: the higher of the two points of a column above it, the
        # other below, so they do not collide where the lines cross.
        labels = []
        for x in rows:
            up_h = x["http"]["rate"] >= x["ceiling"]["rate"]
            labels.append('set label "%.0f/s  x%.2f\\np50 %.1f ms, p99 %.1f ms" at %d,%.1f '
                          'center offset 0,%s font "sans,9" tc rgb "#1f77b4"' % (
                              x["http"]["rate"], x["ratio"], x["http"]["p50_ms"],
                              x["http"]["p99_ms"], x["conns"], x["http"]["rate"],
                              "1.8" if up_h else "-1.8"))
            labels.append('set label "%.0f/s" at %d,%.1f center offset 0,%s font "sans,9" '
                          'tc rgb "#555555"' % (x["ceiling"]["rate"], x["conns"],
                                                 x["ceiling"]["rate"],
                                                 "-1.2" if up_h else "1.2"))
        ymax = max(max(x["http"]["rate"], x["ceiling"]["rate"]) for x in rows) * 1.35
        # Replays: the cache-off point, on the same axes.
        extra = ""
        off = [x for x in res.get("replays_nocache", [])
               if x["http"] and x["ceiling"] and x["ratio"] is not None]
        if name == "replays" and off:
            dat_off = os.path.join(outdir, name + "-nocache.dat")
            with open(dat_off, "w") as f:
                f.write("# conns rate ceiling ratio\n")
                for x in off:
                    f.write("%d %.1f %.1f %.3f\n" % (x["conns"], x["http"]["rate"],
                                                     x["ceiling"]["rate"], x["ratio"]))
                    labels.append('set label "%.0f/s  x%.2f" at %d,%.1f left offset 1.2,0 '
                                  'font "sans,9" tc rgb "#d62728"' % (
                                      x["http"]["rate"], x["ratio"], x["conns"],
                                      x["http"]["rate"]))
            extra = (", \\\n     '%s' using 1:2 with points pt 9 ps 1.6 lc rgb '#d62728' "
                     "title \"the same with replay_cache_ttl = 0: every replay asks "
                     "PostgreSQL\"" % dat_off)
        script = """
set terminal pngcairo size 900,540 noenhanced font "sans,10"
set output '{png}'
set title "{title}\\n{sub}"
set logscale x 2
set xtics ({xt})
set xrange [{xmin}:{xmax}]
set yrange [0:{ymax:.0f}]
set xlabel "{xlabel}"
set ylabel "requests per second"
set grid
set key top left opaque box
{labels}
plot '{dat}' using 1:3 with linespoints lw 2 pt 7 ps 1.2 lc rgb '#888888' title "{ceil}", \\
     '' using 1:2 with linespoints lw 2 pt 5 ps 1.2 lc rgb '#1f77b4' title "{what}"{extra}
""".format(png=png, title=title, sub=sub, dat=dat, what=what, ceil=ceil, xlabel=xlabel,
           extra=extra,
           xt=",".join(str(x["conns"]) for x in rows), ymax=ymax, labels="\n".join(labels),
           xmin=rows[0]["conns"] / 1.5, xmax=rows[-1]["conns"] * 1.5)
        gpf = os.path.join(outdir, name + ".gp")
        with open(gpf, "w") as f:
            f.write(script)
        p = subprocess.run([gp, gpf], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if p.returncode != 0:
            print("bench.py: gnuplot failed on %s:\n%s" % (gpf, p.stdout.decode()),
                  file=sys.stderr)
            continue
        made.append(png)
    return made


# ---------------------------------------------------------------- doc/performance.md

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def doc_section(res, table, pngs, doc=None):
    m = res["machine"]
    lines = [
        BEGIN,
        "",
        "`scripts/bench` measures the service on one machine against that machine's own",
        "limits, each measure next to its ceiling in the same run, and prints the ratios.",
        "It starts a private stack on loopback (PostgreSQL with its default durable",
        "settings, `fsync` and `synchronous_commit` on; `idemflow-fcgi` with its default",
        "workers (four per CPU); nginx from `nginx/idemflow-local.conf.in`) and removes it at the end.",
        "",
        "| measure | load | ceiling |",
        "|---|---|---|",
        "| keyed creates | `wrk`, a new `Idempotency-Key` per request, 4/16/64 connections | "
        "`pgbench -M prepared` running the statement a worker runs per create "
        "(`Q_CREATE_KEYED`, which checks the token too, taken from `app/server/queries.c`) over "
        "the same unix socket: at the same client count, and its best over all counts (more "
        "backends slow a small machine down; the pool keeps its own); the combined ceiling "
        "1 / (1/healthz + 1/pgbench's best) |",
        "| replays | `wrk`, one key created beforehand, 4/16/64 connections; at 16 also "
        "with `replay_cache_ttl = 0` (every replay asks PostgreSQL) | `GET /healthz` "
        "(204, no database) through the same nginx |",
        "| retry storm | `wrk` replaying 100,000 keys created beforehand through the service, "
        "each at most once per point, at 16 and 64 connections: no replay finds its answer in "
        "a worker's replay cache | `pgbench` replaying keys it created with the same statement, "
        "at its best over 16, 64 and the pool's size clients, combined with `GET /healthz` at "
        "the same connections |",
        "| overload | `wrk` creates at 128 and 256 connections, past the pool's size, every "
        "answer counted by status; the 64-connection creates' p99 against their p50 | a 201, "
        "or a fast 503 or 429, for every request: no timeout, no socket error |",
        "| group commit (`--commit-delay`) | creates at 16 and 64 connections with "
        "`commit_delay` 0 (the default), half and all of one 8 kB `fdatasync` as "
        "`pg_test_fsync` times it in the cluster's directory (`commit_siblings` 5) | `pgbench` "
        "under the same setting, at its best count |",
        "| memory | RSS of each worker of a fresh pool, and the requests it served, after "
        "2,500 and 25,000 requests per worker: 4,096 keys with 6 KB inputs, then creates, replays and reuse "
        "conflicts of them (fills the replay cache and the per-key statistics) | no growth "
        "beyond noise |",
        "| scale (`--large`) | creates at 16 connections with random keys on a second "
        "database holding 5M keys, as another tenant and as the tenant that owns them | the "
        "same on the first database, emptied; the three alternate |",
        "| fan-out (`--fanout`) | creates at 16 connections for a tenant with three endpoints "
        "matching their event | the same for a tenant with none, alternating; CPU per create "
        "side by side ([The fan-out's cost](#the-fan-outs-cost)) |",
        "| dispatch | `scripts/bench-dispatch -n 25000 -r 2 --no-amqp` | the dispatcher's "
        "`DQ_CLAIM` and `DQ_DONE`, taken from `app/dispatch/queries.c`, alone; alternating rounds |",
        "",
        "Each point runs four rounds of 5 s per side, alternating (load, ceiling, ceiling,",
        "load, load, ceiling, ceiling, load), so that background load on a shared machine",
        "weighs on both sides alike; the `others` column says how much of the CPU other",
        "processes took during the run. On this machine single rounds of one side differ",
        "by up to a fifth (pgbench from 2,221 to 2,642 creates/s within one run), so a",
        "ratio within a few hundredths of its target is a tie, not a verdict. A target",
        "is met only by a run without error answers whose creates wrote one row per 201",
        "(wrk's unread answers at its stop aside). The CPU table gives milliseconds of CPU",
        "per request by process, for creates, pgbench and `/healthz` side by side.",
        "",
        "```sh",
        "scripts/bench                  # ~10 minutes: var/bench/results.json, var/bench/*.png",
        "scripts/bench --quick          # 3 s per point, smaller memory run: a smoke test",
        "scripts/bench --commit-delay   # adds the group commit measure (~3 minutes)",
        "scripts/bench --large          # adds the 5M-key measures (~12 minutes, ~8 GB of disk;",
        "                               # BENCH_LARGE_ROWS=100000 for a small one)",
        "scripts/bench --fanout-only    # the fan-out measure alone (~4 minutes)",
        "scripts/bench --update-doc     # also rewrites this section",
        "```",
        "",
        "Latest run (%s, on %s cores %s, %s MiB RAM, %s; load generator, nginx, workers "
        "and PostgreSQL share the cores):" % (
            res.get("date", "?"), m.get("nproc"), m.get("cpu_model"), m.get("mem_mib"),
            m.get("kernel")),
        "",
        "```",
        table.rstrip("\n"),
        "```",
        "",
    ]
    if pngs:
        base = os.path.dirname(os.path.abspath(doc)) if doc else os.getcwd()
        rel = [os.path.relpath(os.path.abspath(p), base) for p in pngs]
        lines.append("Plots generated by `scripts/bench` (not committed; `var/` is ignored): " +
                     ", ".join("`%s`" % r for r in rel) + ".")
        lines.append("")
        for r in rel:
            lines.append("![%s](%s)" % (os.path.splitext(os.path.basename(r))[0], r))
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def update_doc(path, section, begin=None, end=None, heading=None):
    """Put section (which holds its markers) in place of the text between
    begin and end (bench's markers by default) in the file at path; without
    the markers, under the page's title, or at the end under heading."""
    begin, end = begin or BEGIN, end or END
    text = open(path, encoding="utf-8").read()
    if begin in text and end in text:
        a = text.index(begin)
        b = text.index(end) + len(end)
        text = text[:a] + section + text[b:]
    elif heading:
        text = text.rstrip("\n") + "\n\n" + heading + "\n\n" + section + "\n"
    else:
        # No markers: the section goes right under the page's title.
        m = re.search(r"^# .*\n", text, re.M)
        at = m.end() if m else 0
        text = text[:at] + "\n" + section + "\n" + text[at:]
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def _publish(res, outdir, doc):
    table = render_table(res)
    with open(os.path.join(outdir, "table.txt"), "w") as f:
        f.write(table)
    sys.stdout.write(table)
    pngs = plot(res, outdir)
    for p in pngs:
        print("plot: %s" % p)
    if doc:
        update_doc(doc, doc_section(res, table, pngs, doc))
        print("section updated: %s" % doc)


def _opt_doc(argv):
    for opt in ("--doc", "--readme"):
        if opt in argv:
            i = argv.index(opt)
            return argv[:i] + argv[i + 2:], argv[i + 1]
    return argv, None


def cmd_finish(argv):
    argv, doc = _opt_doc(argv)
    records, facts_path, outdir = argv[:3]
    facts = json.load(open(facts_path))
    res = build_results(_read_records(records), facts)
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "results.json.tmp"), "w") as f:
        json.dump(res, f, indent=2)
        f.write("\n")
    os.replace(os.path.join(outdir, "results.json.tmp"), os.path.join(outdir, "results.json"))
    _publish(res, outdir, doc)
    # A create run whose workflows differ from the creates the pool
    # answered lost or doubled one: not a slow result but a wrong one.
    wrong = [x["conns"] for x in res["creates"]
             if not ((x["http"] or {}).get("rows") or {}).get("ok", True)]
    sc = res.get("scale") or {}
    wrong += ["scale " + k for k in ("empty", "large", "own")
              if not ((sc.get(k) or {}).get("rows") or {}).get("ok", True)]
    if wrong:
        die("the workflows created differ from the creates answered 201 at: %s" %
            ", ".join(str(w) for w in wrong))


def cmd_report(argv):
    argv, doc = _opt_doc(argv)
    outdir = argv[0]
    res = json.load(open(os.path.join(outdir, "results.json")))
    _publish(res, outdir, doc)


def cmd_facts(argv):
    """facts FILE KEY=VALUE...: the machine and settings as JSON."""
    path, kv = argv[0], dict(a.partition("=")[::2] for a in argv[1:])
    num = lambda k: int(kv[k]) if kv.get(k, "").isdigit() else kv.get(k)
    machine = {k: num(k) if k in ("nproc", "mem_mib") else kv.get(k)
               for k in ("nproc", "cpu_model", "mem_mib", "kernel", "postgresql", "nginx", "wrk",
                         "loadavg_start")}
    settings = {k: num(k) for k in ("workers", "seconds", "fsync", "synchronous_commit",
                                     "shared_buffers", "wal_sync_method", "commit",
                                     "uncommitted_app_files", "pgbench_statements",
                                     "sources_newer_than_binary")}
    settings["quick"] = kv.get("quick") == "1"
    settings["connections"] = [int(c) for c in kv.get("connections", "").split()]
    with open(path, "w") as f:
        json.dump({"date": kv.get("date"), "machine": machine, "settings": settings}, f,
                  indent=2)
        f.write("\n")


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(64)
    cmd, argv = sys.argv[1], sys.argv[2:]
    if cmd == "pgbench-script":
        replay = None
        if "--replay" in argv:
            i = argv.index("--replay")
            replay = tuple(int(x) for x in argv[i + 1:i + 4])
        sys.stdout.write(pgbench_script(argv[0], "--scatter" in argv[1:], replay))
    elif cmd == "dispatch-script":
        sys.stdout.write(dispatch_script(argv[0]))
    elif cmd == "fanout-script":
        sys.stdout.write(fanout_script(argv[0]))
    elif cmd == "seed":
        cmd_seed(argv)
    elif cmd == "measure":
        cmd_measure(argv)
    elif cmd == "rss":
        cmd_rss(argv)
    elif cmd == "logged":
        cmd_logged(argv)
    elif cmd == "dispatch":
        cmd_dispatch(argv)
    elif cmd == "facts":
        cmd_facts(argv)
    elif cmd == "finish":
        cmd_finish(argv)
    elif cmd == "report":
        cmd_report(argv)
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(64)


if __name__ == "__main__":
    main()
