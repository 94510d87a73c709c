#!/usr/bin/python3
"""t/e2e/test_dashboard.py - the Grafana dashboard and the alert rules name
only series that idemflow serves.

Run by t/run-test, which gives it the e2e stack (PostgreSQL, idemflow-fcgi,
nginx; IDEMFLOW_METRICS_PORT, IDEMFLOW_DISPATCH, DATABASE_URL, ...). The
series that exist are read live: GET /metrics from the server through
nginx's metrics listener, and the textfiles one run of idemflow-dispatch
and one of idemflow audit write. Then:
  - etc/grafana/idemflow-dashboard.json is valid JSON and a dashboard
    Grafana imports: a uid and title, panels with unique ids, a grid
    position and a Prometheus query each, on the $datasource variable;
  - every PromQL expression in it (panels and template variables), and in
    etc/idemflow-rules.yml, names only metrics of those sets, or the
    series Prometheus adds for every scrape ("up").
A panel or rule that names an unknown metric fails the test, and so does
an entry of PENDING (below) that nothing uses. The checker is itself
tested first on expressions with a known answer.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
SRCDIR = os.environ.get("top_srcdir") or os.path.join(HERE, "..", "..")
DASHBOARD = os.path.join(SRCDIR, "etc", "grafana", "idemflow-dashboard.json")
RULES = os.path.join(SRCDIR, "etc", "idemflow-rules.yml")

# Series a panel or rule may name before the server serves them (none
# today). Each is accepted while /metrics lacks it, with a note; once
# /metrics serves it, the entry is no longer needed and is reported so.
PENDING = set()

KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on",
            "ignoring", "group_left", "group_right", "inf", "nan", "atan2"}
NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")

failures = []


SCRAPE_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg, file=sys.stderr)


def metric_names(expr):
    """The metric names a PromQL expression selects."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    e = re.sub(r"\$\{[^}]*\}|\$\w+", "", e)      # Grafana's variables
    e = re.sub(r"\{[^}]*\}", "", e)               # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)              # ranges and subqueries
    # Label lists of by/without/on/ignoring/group_left/group_right.
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    # Numbers and durations (0.99, 1e3, 5m, 0x1f) before names.
    e = re.sub(r"(?<![\w:])(0x[0-9a-fA-F]+|[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?"
               r"(ms|[smhdwy])*)", " ", e)
    names = set()
    for m in NAME.finditer(e):
        rest = e[m.end():].lstrip()
        if rest.startswith("(") or m.group(0).lower() in KEYWORDS:
            continue
        names.add(m.group(0))
    return names


def self_test():
    cases = {
        'sum by (route, le) (rate(idemflow_x_bucket{job=~"$job",route="a b"}[$__rate_interval]))':
            {"idemflow_x_bucket"},
        'histogram_quantile(0.99, sum by (le) (rate(a_b[5m]))) > 0.5 and on (job) c == 0':
            {"a_b", "c"},
        'time() - max by (instance) (d_ts offset 1h)': {"d_ts"},
        'max without (instance) (e) > 1e3 unless f{x="rate(g)"}': {"e", "f"},
    }
    for expr, want in cases.items():
        got = metric_names(expr)
        if got != want:
            fail("checker: %r gave %s, want %s" % (expr, sorted(got), sorted(want)))


def exposition_names(text):
    """Every series name an exposition declares (# TYPE, with a histogram's
    _bucket, _sum and _count) or holds: a labelled counter has no sample
    before its first count."""
    names = set()
    for line in text.splitlines():
        m = re.match(r"# TYPE (\S+) (\w+)", line)
        if m:
            names.add(m.group(1))
            if m.group(2) == "histogram":
                names |= {m.group(1) + s for s in ("_bucket", "_sum", "_count")}
            elif m.group(2) == "summary":
                names |= {m.group(1) + s for s in ("_sum", "_count")}
        elif line and not line.startswith("#"):
            names.add(NAME.match(line).group(0))
    return names


def server_names():
    port = os.environ["IDEMFLOW_METRICS_PORT"]
    with urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port, timeout=10) as r:
        assert r.status == 200, r.status
        return exposition_names(r.read().decode())


def dispatcher_names():
    with tempfile.TemporaryDirectory() as d:
        textfile = os.path.join(d, "idemflow_dispatch.prom")
        subprocess.run([os.environ["IDEMFLOW_DISPATCH"], "--db", os.environ["DATABASE_URL"],
                        "--once", "--sink", "exec", "--exec", "true",
                        "--textfile", textfile],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(textfile) as f:
            return exposition_names(f.read())


def auditor_names():
    """The gauges of idemflow audit's textfile (written whether the data
    holds every invariant, exit 0, or not, exit 65)."""
    with tempfile.TemporaryDirectory() as d:
        textfile = os.path.join(d, "idemflow_audit.prom")
        r = subprocess.run([os.environ["IDEMFLOW_CLI"], "--db", os.environ["DATABASE_URL"],
                            "audit", "--textfile", textfile],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if r.returncode not in (0, 65):
            fail("idemflow audit exited %d" % r.returncode)
            return set()
        with open(textfile) as f:
            return exposition_names(f.read())


def dashboard_exprs(dash):
    """(where, expr) for every query of the dashboard; checks its shape."""
    out = []
    for key in ("uid", "title", "panels", "templating", "schemaVersion"):
        if key not in dash:
            fail("dashboard: no %s" % key)
    ids = set()
    variables = {v.get("name") for v in dash.get("templating", {}).get("list", [])}
    if "datasource" not in variables:
        fail("dashboard: no $datasource variable")
    for p in dash.get("panels", []):
        where = "panel %s (%s)" % (p.get("id"), p.get("title"))
        if p.get("id") in ids:
            fail("%s: id used twice" % where)
        ids.add(p.get("id"))
        if not all(k in p.get("gridPos", {}) for k in "hwxy"):
            fail("%s: no full gridPos" % where)
        if p.get("type") == "row":
            continue
        if p.get("datasource", {}).get("uid") != "${datasource}":
            fail("%s: not on the $datasource variable" % where)
        targets = p.get("targets") or []
        if not targets:
            fail("%s: no query" % where)
        for t in targets:
            if not t.get("expr"):
                fail("%s: target %s has no expr" % (where, t.get("refId")))
            out.append((where, t.get("expr", "")))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.match(r"\s*label_values\(\s*(.*),\s*\w+\s*\)\s*$", q or "")
        if not m:
            fail("variable %s: not a label_values() query: %r" % (v.get("name"), q))
            continue
        out.append(("variable " + v["name"], m.group(1)))
    return out


def rules_exprs(rules):
    out = []
    for g in rules.get("groups", []):
        for r in g.get("rules", []):
            out.append(("rule " + (r.get("alert") or r.get("record")), r["expr"]))
    return out


def main():
    self_test()
    with open(DASHBOARD) as f:
        try:
            dash = json.load(f)
        except ValueError as e:
            fail("%s is not JSON: %s" % (DASHBOARD, e))
            dash = {}
    with open(RULES) as f:
        rules = yaml.safe_load(f)
    served = server_names()
    dispatched = dispatcher_names()
    audited = auditor_names()
    # Series Prometheus makes itself for every target it scrapes (the
    # IdemflowDown rule reads "up").
    known = served | dispatched | audited | SCRAPE_SERIES
    used_pending = set()
    exprs = dashboard_exprs(dash) + rules_exprs(rules)
    for where, expr in exprs:
        names = metric_names(expr)
        if not names:
            fail("%s: no metric in %r" % (where, expr))
        for n in sorted(names):
            if n in known:
                continue
            if n in PENDING:
                used_pending.add(n)
                continue
            fail("%s: unknown metric %s (served: %s)" % (where, n, ", ".join(sorted(known))))
    for n in sorted(PENDING - used_pending - known):
        fail("PENDING lists %s, which nothing uses" % n)
    for n in sorted(PENDING & known):
        print("note: %s is served now; remove it from PENDING" % n)
    for n in sorted(used_pending):
        print("note: %s is not served yet (PENDING)" % n)
    print("%d expressions checked against %d served, %d dispatcher and %d audit series"
          % (len(exprs), len(served), len(dispatched), len(audited)))
    if failures:
        print("%d failure(s)" % len(failures), file=sys.stderr)
        sys.exit(1)
    print("dashboard and rules: ok")


if __name__ == "__main__":
    main()
