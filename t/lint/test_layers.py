#!/usr/bin/env python3
"""t/lint/test_layers.py [APPDIR] - the include graph of app/ keeps its layers.

app/core is what every program uses; app/server, app/dispatch, app/cli
and app/inbox build on it. The rules (doc/architecture.md):
  - every include of a project header names its layer ("core/db.h");
  - a layer includes only itself and the layers below it: core includes
    core alone, the others core and themselves, never one another;
  - no two modules (x.c with x.h) include each other, directly or not;
  - the router (server/api.h) is included by the worker alone: handlers
    share server/handler.h and never reach the route table;
  - inside the core, a module includes only the modules before it in the
    tour's order (the core's table of "Every file" in DOC), so that the
    core reads bottom-up: log, below canon, includes utf8 and not canon.
Prints every violation and exits 1 if there is one; APPDIR defaults to
$top_srcdir/app, DOC to $top_srcdir/doc/architecture.md.
"""
import os
import re
import sys

BELOW = {
    "core": {"core"},
    "server": {"core", "server"},
    "dispatch": {"core", "dispatch"},
    "cli": {"core", "cli"},
    "inbox": {"core", "inbox"},
}
# header module -> the only modules that may include it
PRIVATE = {"server/api": {"server/worker"}}
GENERATED = {"config.h"}  # configure's, in the build directory

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.environ.get("top_srcdir", "."), "app")
doc = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
    os.environ.get("top_srcdir", "."), "doc", "architecture.md")
problems = []
edges = {}
headers = set()
sources = []
for d, _, fs in os.walk(root):
    for f in fs:
        if f.endswith((".c", ".h")):
            rel = os.path.relpath(os.path.join(d, f), root)
            sources.append(rel)
            if f.endswith(".h"):
                headers.add(rel)
if not sources:
    sys.exit("no sources under %s" % root)


def module(rel):
    return os.path.splitext(rel)[0]


for rel in sorted(sources):
    m = module(rel)
    layer = rel.split("/")[0] if "/" in rel else None
    if layer not in BELOW:
        problems.append("%s: not in a layer (%s)" % (rel, ", ".join(sorted(BELOW))))
        continue
    edges.setdefault(m, set())
    text = open(os.path.join(root, rel), errors="replace").read()
    for n, line in enumerate(text.split("\n"), 1):
        mo = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
        if not mo or mo.group(1) in GENERATED:
            continue
        inc = mo.group(1)
        where = "%s:%d: #include \"%s\"" % (rel, n, inc)
        if inc not in headers:
            if any(h.endswith("/" + inc) for h in headers):
                problems.append(where + ": names no layer")
            else:
                problems.append(where + ": no such header under app/")
            continue
        target = inc.split("/")[0]
        if target not in BELOW[layer]:
            problems.append("%s: layer %s may not include layer %s" % (where, layer, target))
        tm = module(inc)
        if tm in PRIVATE and m != tm and m not in PRIVATE[tm]:
            problems.append("%s: only %s include it" % (where, ", ".join(sorted(PRIVATE[tm]))))
        if tm != m:
            edges[m].add(tm)

# The core's order: the rows "| `core/x.c` |" of the core's table, in
# the order the tour reads them. A generated file (core/migrations.c) is
# named in its module's row and not ordered.
core_order = []
in_core = False
for line in open(doc, encoding="utf-8"):
    if line.startswith("**"):
        in_core = line.startswith("**The core**")
    mo = re.match(r"\|\s*`core/([a-z0-9_]+)\.c`", line)
    if in_core and mo:
        core_order.append("core/" + mo.group(1))
if not core_order:
    problems.append("%s: no table of the core's files (**The core**)" % doc)
rank = {m: i for i, m in enumerate(core_order)}
for m in sorted(edges):
    if not m.startswith("core/") or m not in rank:
        continue
    for t in sorted(edges[m]):
        if t in rank and rank[t] > rank[m]:
            problems.append("%s includes %s, which comes after it in the core's order (%s)"
                            % (m, t, os.path.basename(doc)))

# Cycles: Tarjan's strongly connected components over modules.
index, low, stack, on, counter, cycles = {}, {}, [], set(), [0], []


def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in sorted(edges.get(v, ())):
        if w not in index:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            cycles.append(sorted(comp))


sys.setrecursionlimit(10000)
for v in sorted(edges):
    if v not in index:
        visit(v)
for c in cycles:
    problems.append("include cycle: " + " -> ".join(c))

for p in problems:
    print("FAIL: " + p)
print("%d modules, %d include edges, %d problems" % (
    len(edges), sum(len(e) for e in edges.values()), len(problems)))
sys.exit(1 if problems else 0)
