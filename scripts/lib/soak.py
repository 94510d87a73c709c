#!/usr/bin/env python3
"""scripts/lib/soak.py - the records of scripts/soak, read.

  line RECORDS                      one line on the last interval (the run's log)
  finish RECORDS OUTDIR [--doc FILE]
                                    the table and the targets on stdout and in
                                    OUTDIR/table.txt, OUTDIR/soak.png (gnuplot),
                                    and the section of FILE between the soak
                                    markers

Records are JSON lines: one "setup", one "interval" per interval, one "end".
Only the standard library is used.
"""

import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (its update_doc)

TABLES = ("idempotency_keys", "workflows", "outbox", "timers")
# The targets (issue "a day in thirty minutes").
PLATEAU = 1.25  # the last third's largest size / the middle third's
P99_STEADY = 1.5  # the last five intervals' p99 / the first five's
LAG_MAX_S = 5.0
BEGIN = "<!-- soak:begin -->"
END = "<!-- soak:end -->"


def read(path):
    setup, ivs, end = None, [], None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if r["kind"] == "setup":
                setup = r
            elif r["kind"] == "interval":
                ivs.append(r)
            elif r["kind"] == "end":
                end = r
    return setup, ivs, end


def rate(iv):
    w = iv.get("wrk") or {}
    secs = w.get("duration_us", 0) / 1e6
    return w.get("requests", 0) / secs if secs > 0 else 0.0


def pct(iv, p):
    w = iv.get("wrk") or {}
    return (w.get("latency_us") or {}).get(p, 0) / 1000.0


def size(iv, t):
    x = (iv.get("tables") or {}).get(t) or {}
    return x.get("table_bytes", 0) + x.get("index_bytes", 0)


def mib(n):
    return n / 1048576.0


def errors(iv):
    w = iv.get("wrk") or {}
    e = dict(w.get("errors") or {})
    e.pop("status", None)
    bad = sum(v for k, v in (w.get("status") or {}).items()
              if k not in ("200", "201", "409"))
    return sum(e.values()) + bad


def cmd_line(argv):
    _, ivs, _ = read(argv[0])
    iv = ivs[-1]
    w = iv.get("wrk") or {}
    print("%6.0f req/s, p50 %.1f ms, p99 %.1f ms, %s; lag max %.1f s; MiB %s" % (
        rate(iv), pct(iv, "p50"), pct(iv, "p99"),
        ", ".join("%s x%d" % kv for kv in sorted((w.get("status") or {}).items())),
        iv.get("lag_max_s", 0),
        " ".join("%s %.1f" % (t, mib(size(iv, t))) for t in TABLES)))


def mean(xs):
    return sum(xs) / len(xs) if xs else None


def targets(setup, ivs, end):
    t = []

    def add(name, want, observed, ok):
        t.append({"name": name, "target": want, "observed": observed,
                  "met": observed is not None and ok})

    n = len(ivs)
    third = n // 3
    if third >= 1:
        for tb in TABLES:
            mid = max(size(iv, tb) for iv in ivs[third:2 * third])
            last = max(size(iv, tb) for iv in ivs[2 * third:])
            r = last / mid if mid else None
            add("%s: size, last third / middle third" % tb, "<= %.2f" % PLATEAU, r,
                r is not None and r <= PLATEAU)
    k = min(5, n // 2)
    if k >= 1:
        first = mean([pct(iv, "p99") for iv in ivs[:k]])
        last = mean([pct(iv, "p99") for iv in ivs[-k:]])
        r = last / first if first else None
        add("p99, last %d intervals / first %d" % (k, k), "<= %.1f" % P99_STEADY, r,
            r is not None and r <= P99_STEADY)
    lag = max([iv.get("lag_max_s", 0) for iv in ivs] + [(end or {}).get("lag_max_s", 0)])
    add("dispatcher lag, largest (s)", "< %.0f" % LAG_MAX_S, lag, lag < LAG_MAX_S)
    errs = sum(errors(iv) for iv in ivs)
    add("error answers, timeouts and socket errors", "0", errs, errs == 0)
    if end is not None:
        add("idemflow audit exit status", "0", end.get("audit_exit"), end.get("audit_exit") == 0)
    return t


def table(setup, ivs, end):
    L = []
    s = setup or {}
    L.append("idemflow soak, %s, commit %s, %s cores" % (s.get("date"), s.get("commit"),
                                                        s.get("nproc")))
    L.append("capacity %s requests/s (the same traffic without pauses, %s connections); sent at "
             "%.0f%% of it; intervals of %s s" % (s.get("capacity"), s.get("conns"),
                                                  100 * float(s.get("load", 0)),
                                                  s.get("interval")))
    if ivs:
        m = mean([rate(iv) for iv in ivs])
        L.append("sent on average %.0f requests/s, %.0f%% of the capacity" % (
            m, 100.0 * m / float(s.get("capacity") or 1)))
    L.append("workflows with one %s sleep step; 20%% replays, 1%% conflicts; key TTL %s, "
             "outbox retention %s, history retention %s, workflow retention %s; prune every "
             "interval, reap --loop, dispatch --loop to a local receiver" % (
                 s.get("sleep_step"), s.get("key_ttl"), s.get("outbox_retention"),
                 s.get("history_retention"), s.get("workflow_retention")))
    L.append("")
    hdr = "%4s %6s %7s %7s %6s" % ("min", "req/s", "p50 ms", "p99 ms", "lag s")
    for tb in TABLES:
        hdr += " %9s" % (tb[:9] + " MiB" if len(tb) <= 5 else tb.split("_")[-1][:5] + " MiB")
    hdr += " %9s %5s" % ("dead", "autov")
    L.append(hdr)
    L.append("-" * len(hdr))
    for iv in ivs:
        tabs = iv.get("tables") or {}
        dead = sum((tabs.get(tb) or {}).get("dead", 0) for tb in TABLES)
        av = sum((tabs.get(tb) or {}).get("autovacuum", 0) for tb in TABLES)
        row = "%4s %6.0f %7.2f %7.2f %6.1f" % (
            "%.1f" % (iv["t"] / 60.0), rate(iv), pct(iv, "p50"), pct(iv, "p99"),
            iv.get("lag_max_s", 0))
        for tb in TABLES:
            row += " %9.1f" % mib(size(iv, tb))
        row += " %9d %5d" % (dead, av)
        L.append(row)
    L.append("  sizes: table + its indexes; dead: dead tuples of the four tables; autov: "
             "autovacuum runs on them so far")
    if end:
        L.append("")
        L.append("prune ran %s times; idemflow audit exited %s" % (end.get("prunes"),
                                                                 end.get("audit_exit")))
    L.append("")
    L.append("%-52s %-10s %10s" % ("target", "wanted", "observed"))
    for t in targets(setup, ivs, end):
        o = t["observed"]
        L.append("%-52s %-10s %10s  %s" % (t["name"], t["target"],
                                            "%.2f" % o if isinstance(o, float) else o,
                                            "met" if t["met"] else "MISSED"))
    return "\n".join(L) + "\n"


def plot(setup, ivs, outdir):
    gp = shutil.which("gnuplot")
    if not gp or not ivs:
        return None
    dat = os.path.join(outdir, "soak.dat")
    with open(dat, "w") as f:
        f.write("# minute rate p50 p99 lag " + " ".join(TABLES) + "\n")
        for iv in ivs:
            f.write("%.2f %.1f %.2f %.2f %.1f %s\n" % (
                iv["t"] / 60.0, rate(iv), pct(iv, "p50"), pct(iv, "p99"),
                iv.get("lag_max_s", 0), " ".join("%.2f" % mib(size(iv, t)) for t in TABLES)))
    png = os.path.join(outdir, "soak.png")
    s = setup or {}
    script = """
set terminal pngcairo size 900,900 noenhanced font "sans,10"
set output '{png}'
set multiplot layout 3,1 title "idemflow soak: {what}"
set grid
set key outside right
set xlabel "minutes"
set ylabel "requests/s"
set yrange [0:*]
plot '{dat}' using 1:2 with linespoints title "throughput"
set ylabel "ms"
set y2label "s"
set y2tics
set y2range [0:*]
plot '{dat}' using 1:3 with linespoints title "p50 (ms)", '' using 1:4 with linespoints title "p99 (ms)", \\
     '' using 1:5 axes x1y2 with linespoints title "dispatcher lag (s)"
unset y2tics
unset y2label
set ylabel "MiB"
plot {sizes}
unset multiplot
""".format(png=png, dat=dat, what="%s, %.0f%% of %s req/s" % (
        s.get("date", "")[:10], 100 * float(s.get("load", 0)), s.get("capacity")),
        sizes=", ".join("'%s' using 1:%d with linespoints title \"%s\"" % (dat, 6 + i, t)
                        for i, t in enumerate(TABLES)))
    subprocess.run([gp], input=script.encode(), check=True)
    return png




def cmd_finish(argv):
    records, outdir = argv[0], argv[1]
    doc = argv[argv.index("--doc") + 1] if "--doc" in argv else None
    setup, ivs, end = read(records)
    text = table(setup, ivs, end)
    with open(os.path.join(outdir, "table.txt"), "w") as f:
        f.write(text)
    sys.stdout.write(text)
    png = plot(setup, ivs, outdir)
    if png:
        print("plot: %s" % png)
    if doc:
        section = "%s\n\n```\n%s```\n\nPlot generated by `scripts/soak` (not committed; `var/` " \
                  "is ignored): `../var/soak/soak.png`.\n\n![soak](../var/soak/soak.png)\n\n%s" % (
                      BEGIN, text, END)
        bench.update_doc(doc, section, BEGIN, END, "## A day in thirty minutes")


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        sys.exit(64)
    cmd, argv = sys.argv[1], sys.argv[2:]
    if cmd == "line":
        cmd_line(argv)
    elif cmd == "finish":
        cmd_finish(argv)
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(64)


if __name__ == "__main__":
    main()
