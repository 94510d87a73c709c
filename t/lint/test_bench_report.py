#!/usr/bin/python3
"""t/lint/test_bench_report.py - the benchmarks' judgements, on known records.

scripts/bench and scripts/soak take minutes and print numbers; the code that
turns their records into ratios and targets is plain Python and is tested
here on records made up for it, so that a target cannot be met by a slip of
arithmetic:

- bench.py: a retry storm's ratio is its rate over the combined ceiling of
  healthz at the same count and pgbench replaying; an answer other than 201
  makes it unclean; an overload point with a timeout or a socket error
  misses its target while 503s do not; each commit_delay setting is its
  own row against pgbench under the same setting; the fan-out's cost is CPU
  per create (workers and PostgreSQL for the creates, PostgreSQL for
  pgbench), its rounds added up, not the rate nor nginx's or wrk's CPU,
  and 6% more misses the 5% target while 4% meets it;
- soak.py: sizes that keep growing miss the plateau target, sizes that
  level off meet it; a p99 that doubles misses; a lag of 5 s misses; an
  audit that failed misses.
"""

import os
import re
import sys

TOP = os.environ.get("top_srcdir") or os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(TOP, "scripts", "lib"))

import bench  # noqa: E402
import soak  # noqa: E402

FAILED = []


def check(name, cond, detail=""):
    print("%s - %s%s" % ("ok" if cond else "not ok", name,
                         (": " + detail) if detail and not cond else ""))
    if not cond:
        FAILED.append(name)


def wrk(measure, side, conns, rate, status=None, errors=None, p50=1.0, p99=2.0):
    secs = 10.0
    e = {"connect": 0, "read": 0, "write": 0, "status": 0, "timeout": 0}
    e.update(errors or {})
    return {"measure": measure, "side": side, "conns": conns, "tool": "wrk",
            "requests": int(rate * secs), "seconds": secs, "rate": rate, "p50_ms": p50,
            "p99_ms": p99, "errors": e, "failed": sum(e.values()), "status": status or {}}


def target(res, prefix):
    return next(t for t in res["targets"] if t["name"].startswith(prefix))


def bench_records():
    recs = [
        wrk("replays", "healthz", 16, 6000.0), wrk("replays", "http", 16, 5000.0),
        wrk("replays", "healthz", 64, 6000.0), wrk("replays", "http", 64, 5000.0),
        {"measure": "storm-seed", "keys": 1000},
        wrk("storm", "http", 16, 3600.0, {"201": 36000}),
        wrk("storm", "pgbench", 16, 12000.0),
        wrk("storm", "http", 64, 1000.0, {"201": 9000, "409": 1000}),
        wrk("storm", "pgbench", 64, 500.0),
        wrk("creates", "http", 16, 2000.0), wrk("creates", "pgbench", 16, 3000.0),
        wrk("overload", "http", 128, 2000.0, {"201": 15000, "503": 5000},
            {"status": 5000}),
        wrk("overload", "http", 256, 2000.0, {"201": 20000}, {"timeout": 3}),
        {"measure": "fsync", "fdatasync_us": 4000},
        wrk("commit-0-5", "http", 16, 2000.0), wrk("commit-0-5", "pgbench", 16, 2500.0),
        wrk("commit-2000-5", "http", 16, 2400.0), wrk("commit-2000-5", "pgbench", 16, 3000.0),
    ]
    return recs


def test_bench():
    res = bench.build_results(bench_records(), {"settings": {"workers": 16}})
    s16 = next(x for x in res["storm"] if x["conns"] == 16)
    want = 1 / (1 / 6000.0 + 1 / 12000.0)
    check("storm combined ceiling", abs(s16["combined"] - want) < 0.01,
          "%s != %s" % (s16["combined"], want))
    check("storm ratio", abs(s16["ratio_combined"] - 0.9) < 1e-9)
    check("storm 16 met", target(res, "retry storm (cold replays) / combined ceiling, 16")["met"])
    s64 = next(x for x in res["storm"] if x["conns"] == 64)
    check("the storm's ceiling is pgbench's best count, not its 64",
          abs(s64["combined"] - want) < 0.01, str(s64["combined"]))
    t64 = target(res, "retry storm (cold replays) / combined ceiling, 64")
    check("storm with 409s is not clean", not t64["clean"] and not t64["met"])
    o128 = target(res, "overload, 128")
    check("503s are answers", o128["met"] and o128["observed"] == 0, str(o128))
    o256 = target(res, "overload, 256")
    check("timeouts miss the overload target", not o256["met"] and o256["observed"] == 3,
          str(o256))
    ov = next(x for x in res["overload"] if x["conns"] == 128)
    check("overload 201 rate", abs(bench._status_rate(ov["http"], "201") - 1500.0) < 1e-9)
    cd = res["commit_delay"]
    check("a row per commit_delay setting", [(x["commit_delay_us"], x["conns"]) for x in cd]
          == [(0, 16), (2000, 16)], str(cd))
    check("commit_delay ratio against its own pgbench", abs(cd[1]["ratio"] - 0.8) < 1e-9)
    text = bench.render_table(res)
    check("the table shows the storm", "retry storm" in text and "group commit" in text)


def fanout(side, rate, secs, workers, postgres, nginx=3.0, load=2.0, status=None):
    r = wrk("fanout", side, 16, rate, status)
    r["seconds"] = secs
    r["requests"] = int(rate * secs)
    r["cpu_s"] = {"workers": workers, "postgres": postgres, "nginx": nginx, "load": load,
                  "wall": secs}
    return r


def test_fanout():
    # Two rounds a side. none: 10,000 creates, 4+2 and 3+1 s of workers +
    # PostgreSQL = 1.0 ms each; three: 8,000 creates (a slower machine
    # then), 3.6+2.6 and 1.0+1.28 s = 1.06 ms each; nginx's and wrk's CPU
    # left out. pgbench: 2.0 and 2.08 ms of PostgreSQL per create.
    recs = [fanout("http-none", 1000.0, 6.0, 4.0, 2.0),
            fanout("http-three", 500.0, 10.0, 3.6, 2.6, nginx=9.0),
            fanout("http-three", 600.0, 5.0, 1.0, 1.28),
            fanout("http-none", 800.0, 5.0, 3.0, 1.0),
            fanout("pgbench-none", 1000.0, 5.0, 0.0, 10.0),
            fanout("pgbench-three", 1000.0, 5.0, 0.0, 10.4)]
    res = bench.build_results(recs, {"settings": {}})
    fo = res["fanout"]
    check("fan-out CPU per create, none", abs(fo["cpu_ms"]["http_none"] - 1.0) < 1e-9,
          str(fo["cpu_ms"]))
    check("fan-out CPU per create, three", abs(fo["cpu_ms"]["http_three"] - 1.06) < 1e-9,
          str(fo["cpu_ms"]))
    check("fan-out pgbench CPU ratio", abs(fo["pgbench_cpu_ratio"] - 1.04) < 1e-9,
          str(fo["pgbench_cpu_ratio"]))
    want = (8000 / 15.0) / (10000 / 11.0)
    check("fan-out rate ratio is the rates'", abs(fo["rate_ratio"] - want) < 1e-3,
          str(fo["rate_ratio"]))
    t = target(res, "create CPU (workers + PostgreSQL), 3 matching endpoints")
    check("6% more CPU misses the fan-out target", not t["met"] and abs(t["observed"] - 1.06)
          < 1e-9, str(t))
    recs[2] = fanout("http-three", 600.0, 5.0, 1.0, 1.12)
    t = target(bench.build_results(recs, {"settings": {}}), "create CPU (workers + PostgreSQL)")
    check("4% more CPU meets the fan-out target", t["met"] and abs(t["observed"] - 1.04) < 1e-9,
          str(t))
    text = bench.render_table(res)
    check("the table shows the fan-out side by side", "creates, 3 endpoints" in text and
          "1.060" in text and "1.000" in text, text)
    check("no fan-out measure, no fan-out section",
          bench.build_results(bench_records(), {"settings": {}})["fanout"] is None)


def interval(i, sizes, p99=10.0, lag=0.5, status=None):
    return {"kind": "interval", "i": i, "t": 60 * i, "lag_max_s": lag,
            "wrk": {"requests": 60000, "duration_us": 60e6,
                    "status": status or {"201": 59000, "409": 1000},
                    "errors": {"connect": 0, "read": 0, "write": 0, "status": 0, "timeout": 0},
                    "latency_us": {"p50": 2000, "p99": p99 * 1000}},
            "tables": {t: {"table_bytes": s, "index_bytes": 0, "dead": 0, "autovacuum": 0}
                       for t, s in zip(soak.TABLES, sizes)}}


def soak_target(ts, prefix):
    return next(t for t in ts if t["name"].startswith(prefix))


def test_soak():
    flat = [interval(i, [100 + (i < 4) * i * 20] * 4) for i in range(1, 13)]
    end = {"kind": "end", "audit_exit": 0, "lag_max_s": 0.5}
    ts = soak.targets({}, flat, end)
    check("sizes that level off plateau",
          all(t["met"] for t in ts if "size" in t["name"]), str(ts))
    check("steady p99 is met", soak_target(ts, "p99")["met"])
    check("a clean run meets every target", all(t["met"] for t in ts), str(ts))
    grow = [interval(i, [100 * i] * 4) for i in range(1, 13)]
    ts = soak.targets({}, grow, end)
    check("sizes that keep growing miss", not soak_target(ts, "workflows: size")["met"])
    worse = [interval(i, [100] * 4, p99=10.0 if i <= 6 else 25.0) for i in range(1, 13)]
    check("a p99 that grows 2.5x misses", not soak_target(soak.targets({}, worse, end),
                                                           "p99")["met"])
    lag = [interval(i, [100] * 4, lag=5.0 if i == 7 else 0.5) for i in range(1, 13)]
    check("a lag of 5 s misses", not soak_target(soak.targets({}, lag, end),
                                                 "dispatcher lag")["met"])
    bad = [interval(i, [100] * 4, status={"201": 10, "500": 1}) for i in range(1, 13)]
    check("a 500 misses", not soak_target(soak.targets({}, bad, end), "error answers")["met"])
    check("a failed audit misses",
          not soak_target(soak.targets({}, flat, dict(end, audit_exit=65)), "idemflow audit")[
              "met"])
    text = soak.table({"capacity": 1000, "load": 0.7}, flat, end)
    rows = [ln for ln in text.splitlines() if re.match(r"^\s*\d+\.\d\s+\d+\s", ln)]
    check("the soak table has a row per interval", len(rows) == 12, "%d rows" % len(rows))


def main():
    test_bench()
    test_fanout()
    test_soak()
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
