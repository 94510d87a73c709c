#!/usr/bin/env python3
"""t/schema/tenant_routing.py - would every table, unique index, foreign key
and server statement route to one tenant's shard if the schema were
distributed by tenant_id (Citus)? See doc/distribution.md.

Reads the placement of every table and the known exceptions from
t/schema/distribution.txt, the schema from a migrated database (psql), and
the server's statements from the C sources, preprocessed (so that macros
such as CREATE_KEYED expand) and read as their {"name", "sql"} tables.

Rules (each violation is one line on stdout; exit 1 if there is any):
  - every table of the public schema has a placement;
  - a distributed table has a NOT NULL tenant_id;
  - every unique index of a distributed table includes tenant_id;
  - a foreign key from a distributed table goes to a reference table, or to
    a distributed table through tenant_id on both sides; a reference or
    local table has no foreign key to a distributed one;
  - a function whose body reads or writes a distributed table takes the
    tenant as its first argument p_tenant (Citus routes a call by it), and
    each statement of its body on a distributed table fixes the tenant
    (tenant_id = p_tenant, or p_tenant in the tenant_id column of an INSERT);
  - a server statement that names a distributed table fixes the tenant
    (tenant_id = $N, or $N in the tenant_id column of an INSERT), or calls
    a function with p_tenant first;
  - every "allow" entry still matches something (no stale exceptions).
This is a lexical check of the statements, not a planner: it catches a new
statement that forgets the tenant, not one that names it and still joins
two tenants.

Usage: tenant_routing.py --db CONNINFO --srcdir DIR [--cpp CMD]
                         [--sources FILE...] [--extra-sql FILE]
  --extra-sql FILE  also check the statements in FILE (name<TAB>sql lines)
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys

REF_RE = re.compile(r"\b(?:FROM|JOIN|INTO|UPDATE|USING)\s+(?:ONLY\s+)?([a-z_][a-z0-9_]*)",
                    re.I)
CALL_RE = re.compile(r"\b(idemflow_[a-z0-9_]+)\s*\(\s*([^,)]*)", re.I)
INSERT_RE = re.compile(r"\bINSERT\s+INTO\s+([a-z_][a-z0-9_]*)(?:\s+AS\s+\w+)?\s*\(([^)]*)\)"
                       r"\s*VALUES\s*\(", re.I)
# {"name", nparams, "sql"...}: db.h's struct db_stmt
STMT_RE = re.compile(r'\{\s*"([a-z_0-9]+)"\s*,\s*[A-Za-z0-9_]+\s*,\s*((?:"(?:[^"\\]|\\.)*"\s*)+)\}',
                     re.S)
LIT_RE = re.compile(r'"((?:[^"\\]|\\.)*)"')


def load_placement(path):
    tables, allow = {}, {"unique": {}, "fkey": {}, "statement": {}, "function": {}}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            w = line.split()
            if w[0] == "table" and len(w) == 3 and w[2] in ("distributed", "reference", "local"):
                tables[w[1]] = w[2]
            elif w[0] == "allow" and len(w) >= 3 and w[1] in allow:
                allow[w[1]][w[2]] = " ".join(w[3:])
            else:
                sys.exit("%s:%d: cannot read: %s" % (path, n, line))
    return tables, allow


def psql_json(db, sql):
    p = subprocess.run(["psql", db, "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
    if p.returncode != 0:
        sys.exit("psql: %s" % p.stderr.strip())
    return json.loads(p.stdout or "null") or []


def split_top(s):
    """Split S at the commas outside parentheses and quotes."""
    out, depth, cur, q = [], 0, "", False
    for ch in s:
        if ch == "'":
            q = not q
        elif not q and ch == "(":
            depth += 1
        elif not q and ch == ")":
            if depth == 0:
                break
            depth -= 1
        elif not q and ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        cur += ch
    out.append(cur.strip())
    return out


def fixes_tenant(sql, param_re, dist):
    """True when SQL pins the tenant: tenant_id = PARAM, or PARAM in the
    tenant_id column of an INSERT ... VALUES into a distributed table."""
    if re.search(r"\btenant_id\s*=\s*" + param_re + r"\b", sql, re.I):
        return True
    for m in INSERT_RE.finditer(sql):
        if m.group(1) not in dist:
            continue
        cols = [c.strip().lower() for c in m.group(2).split(",")]
        vals = split_top(sql[m.end():])
        if "tenant_id" in cols and cols.index("tenant_id") < len(vals) and \
                re.fullmatch(param_re, vals[cols.index("tenant_id")]):
            return True
    return False


def dist_refs(sql, dist):
    return sorted({t for t in REF_RE.findall(sql) if t in dist})


def pkg_cflags():
    """The include flags of the libraries the sources include (as configure
    found them), so that the preprocessor gets through their headers."""
    p = subprocess.run(["pkg-config", "--cflags", "libpq", "json-c", "libb2", "libcurl",
                        "librabbitmq"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                       text=True, check=False)
    flags = shlex.split(p.stdout) if p.returncode == 0 else []
    p = subprocess.run(["pg_config", "--includedir"], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True, check=False)
    if p.returncode == 0 and p.stdout.strip():
        flags += ["-I", p.stdout.strip()]
    return flags


def server_statements(a):
    """[(name, sql)] from the C sources' statement tables."""
    out = []
    for src in a.sources:
        path = os.path.join(a.srcdir, src)
        cmd = shlex.split(a.cpp) + ["-P", "-D_GNU_SOURCE", "-I", os.path.join(a.srcdir, "app"),
                                    "-I", a.builddir, "-I", os.path.join(a.builddir, "app")]
        cmd += pkg_cflags()
        p = subprocess.run(cmd + [path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, check=False)
        if p.returncode != 0:
            sys.exit("%s: %s" % (" ".join(cmd), p.stderr.strip()[-2000:]))
        for m in STMT_RE.finditer(p.stdout):
            sql = "".join(LIT_RE.findall(m.group(2)))
            out.append((m.group(1), bytes(sql, "utf-8").decode("unicode_escape")))
    if a.extra_sql:
        with open(a.extra_sql, encoding="utf-8") as f:
            for line in f:
                if "\t" in line:
                    name, sql = line.rstrip("\n").split("\t", 1)
                    out.append((name, sql))
    return out


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--srcdir", required=True)
    ap.add_argument("--builddir", default=".")
    ap.add_argument("--cpp", default=os.environ.get("CPP") or "cc -E")
    ap.add_argument("--sources", nargs="*",
                    default=["app/server/queries.c", "app/dispatch/queries.c"])
    ap.add_argument("--placement")
    ap.add_argument("--extra-sql")
    a = ap.parse_args(argv)
    placement = a.placement or os.path.join(a.srcdir, "t", "schema", "distribution.txt")
    tables, allow = load_placement(placement)
    dist = {t for t, k in tables.items() if k == "distributed"}
    used = set()
    bad = []

    cat = psql_json(a.db, """
SELECT json_build_object(
 'tables', (SELECT json_agg(json_build_object('name', c.relname,
     'tenant_notnull', (SELECT a.attnotnull FROM pg_attribute a WHERE a.attrelid = c.oid
                          AND a.attname = 'tenant_id' AND NOT a.attisdropped)))
   FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')),
 'uniques', (SELECT json_agg(json_build_object('index', i.indexrelid::regclass::text,
     'table', t.relname, 'cols', (SELECT array_agg(coalesce(a.attname, 'expr') ORDER BY k.ord)
        FROM unnest(i.indkey) WITH ORDINALITY k(attnum, ord)
        LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum)))
   FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid
  WHERE i.indisunique AND t.relnamespace = 'public'::regnamespace),
 'fkeys', (SELECT json_agg(json_build_object('name', co.conname,
     'table', t.relname, 'ref', r.relname,
     'pairs', (SELECT array_agg(json_build_array(a.attname, b.attname) ORDER BY k.ord)
        FROM unnest(co.conkey, co.confkey) WITH ORDINALITY k(c1, c2, ord)
        JOIN pg_attribute a ON a.attrelid = co.conrelid AND a.attnum = k.c1
        JOIN pg_attribute b ON b.attrelid = co.confrelid AND b.attnum = k.c2)))
   FROM pg_constraint co JOIN pg_class t ON t.oid = co.conrelid
   JOIN pg_class r ON r.oid = co.confrelid
  WHERE co.contype = 'f' AND t.relnamespace = 'public'::regnamespace),
 'functions', (SELECT json_agg(json_build_object('name', p.proname,
     'args', p.proargnames, 'src', p.prosrc))
   FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace))""")

    # Tables.
    for t in cat["tables"] or []:
        if t["name"] not in tables:
            bad.append("table %s has no placement in t/schema/distribution.txt "
                       "(distributed by tenant_id, reference or local?)" % t["name"])
        elif tables[t["name"]] == "distributed" and not t["tenant_notnull"]:
            bad.append("distributed table %s has no NOT NULL tenant_id" % t["name"])

    # Unique indexes (primary keys and unique constraints included).
    for u in cat["uniques"] or []:
        if u["table"] not in dist or "tenant_id" in u["cols"]:
            continue
        key = "%s(%s)" % (u["table"], ",".join(u["cols"]))
        if key in allow["unique"]:
            used.add(("unique", key))
        else:
            bad.append("unique index %s on %s does not include tenant_id: Citus cannot "
                       "enforce it per shard" % (u["index"], key))

    # Foreign keys.
    for fk in cat["fkeys"] or []:
        src, ref = tables.get(fk["table"]), tables.get(fk["ref"])
        pairs = [tuple(p) for p in fk["pairs"]]
        key = "%s(%s)" % (fk["table"], ",".join(p[0] for p in pairs))
        ok = True
        if src == "distributed" and ref == "distributed":
            ok = ("tenant_id", "tenant_id") in pairs
        elif src == "distributed" and ref == "reference":
            ok = True
        elif src in ("reference", "local") and ref == "distributed":
            ok = False
        elif src == "local" and ref == "reference":
            ok = False
        if ok:
            continue
        if key in allow["fkey"]:
            used.add(("fkey", key))
        else:
            bad.append("foreign key %s %s -> %s(%s) does not keep to one tenant (%s -> %s)"
                       % (fk["name"], key, fk["ref"], ",".join(p[1] for p in pairs), src, ref))

    # Functions over distributed tables.
    tenant_first = set()
    for fn in cat["functions"] or []:
        src = fn["src"] or ""
        args = fn["args"] or []
        if args[:1] == ["p_tenant"]:
            tenant_first.add(fn["name"])
        refs = dist_refs(src, dist)
        if not refs:
            continue
        if fn["name"] in allow["function"]:
            used.add(("function", fn["name"]))
            continue
        if args[:1] != ["p_tenant"]:
            bad.append("function %s reads or writes %s but does not take p_tenant first"
                       % (fn["name"], ", ".join(refs)))
            continue
        for stmt in src.split(";"):
            r = dist_refs(stmt, dist)
            if r and not fixes_tenant(stmt, r"p_tenant", dist):
                bad.append("function %s: a statement on %s does not fix the tenant: %s"
                           % (fn["name"], ", ".join(r), " ".join(stmt.split())[:160]))

    # The server's statements.
    stmts = server_statements(a)
    if len(stmts) < 20:
        bad.append("found only %d server statements in %s: has their layout changed?"
                   % (len(stmts), ", ".join(a.sources)))
    for name, sql in stmts:
        refs = dist_refs(sql, dist)
        calls = [(f, first.strip()) for f, first in CALL_RE.findall(sql)]
        # The tenant's parameter, cast or not ($1, $1::bigint).
        routed_call = any(f in tenant_first and re.fullmatch(r"\$\d+(?:::[a-z]+)?", first)
                          for f, first in calls)
        if not refs and not routed_call and not any(f in tenant_first for f, _ in calls):
            continue
        if (refs and fixes_tenant(sql, r"\$\d+", dist)) or (not refs and routed_call):
            continue
        if name in allow["statement"]:
            used.add(("statement", name))
            continue
        what = ", ".join(refs) or ", ".join(f for f, _ in calls)
        bad.append("statement %s on %s does not fix the tenant (tenant_id = $N): it would "
                   "be multi-shard: %s" % (name, what, " ".join(sql.split())[:160]))

    for kind, entries in allow.items():
        for k in entries:
            if (kind, k) not in used:
                bad.append("t/schema/distribution.txt: allow %s %s matches nothing any more: "
                           "remove it" % (kind, k))

    for line in bad:
        print("tenant routing: " + line)
    print("tenant routing: %d tables, %d unique indexes, %d foreign keys, %d functions, "
          "%d server statements checked; %d exception(s) used; %d problem(s)"
          % (len(cat["tables"] or []), len(cat["uniques"] or []), len(cat["fkeys"] or []),
             len(cat["functions"] or []), len(stmts), len(used), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
