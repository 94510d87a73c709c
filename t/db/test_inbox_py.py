#!/usr/bin/env python3
"""t/db/test_inbox_py.py - the Python consumer module (app/inbox/idemflow_inbox.py)
against a real PostgreSQL ($DATABASE_URL, from t/run-test).

Proves, in a schema of its own: its command line applies inbox.sql (twice);
two deliveries of one event through handle() on two connections, the
second shown blocked by the first's open transaction, give one effect and
one counted duplicate; an effect that raises rolls its claim back, so the
next delivery applies it; `metrics -o FILE` writes the exact Prometheus
text, the same bytes as the SQL function. Needs python3-psycopg2 (Debian's:
run under /usr/bin/python3 when this interpreter lacks it).
"""

import os
import subprocess
import sys
import threading
import time

try:
    import psycopg2
except ImportError:
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    print("skip: python3-psycopg2 is not installed (scripts/deps)")
    sys.exit(77)

TOP = os.environ.get("top_srcdir") or os.path.join(os.path.dirname(__file__), "..", "..")
MODULE = os.path.join(TOP, "app", "inbox", "idemflow_inbox.py")
sys.path.insert(0, os.path.dirname(MODULE))
import idemflow_inbox  # noqa: E402

FAILS = []


def check(what, got, want):
    if got == want:
        print("ok: %s" % what)
    else:
        print("FAIL: %s: got %r, want %r" % (what, got, want))
        FAILS.append(what)


def main():
    base = os.environ["DATABASE_URL"]
    schema = "inbox_py_%d" % os.getpid()
    admin = psycopg2.connect(base)
    admin.autocommit = True
    admin.cursor().execute("CREATE SCHEMA %s" % schema)
    dsn = "%s options='-c search_path=%s'" % (base, schema)

    for n in (1, 2):
        p = subprocess.run([sys.executable, MODULE, "setup", "--db", dsn],
                           capture_output=True, text=True)
        check("setup from the command line, run %d: exit 0, nothing said" % n,
              (p.returncode, p.stdout, p.stderr), (0, "", ""))

    a, b = psycopg2.connect(dsn), psycopg2.connect(dsn)
    with a.cursor() as cur:
        cur.execute("CREATE TABLE effects (event_id text NOT NULL, applied_by text NOT NULL)")
    a.commit()

    def effect(who):
        return lambda cur: cur.execute("INSERT INTO effects VALUES ('evt-1', %s)", (who,))

    # a claims and applies inside an open transaction; b's delivery waits.
    with a.cursor() as cur:
        check("a's claim: the first delivery", idemflow_inbox.claim(cur, "billing", "evt-1"), True)
        effect("a")(cur)
    out = {}
    t = threading.Thread(target=lambda: out.update(
        b=idemflow_inbox.handle(b, "billing", "evt-1", effect("b"))))
    t.start()
    blocked = False
    deadline = time.monotonic() + 10
    with admin.cursor() as cur:
        while time.monotonic() < deadline and not blocked:
            cur.execute("SELECT %s = ANY (pg_blocking_pids(%s))",
                        (a.get_backend_pid(), b.get_backend_pid()))
            blocked = cur.fetchone()[0]
            time.sleep(0.01)
    check("b's claim waits on a's open transaction", (blocked, "b" in out), (True, False))
    a.commit()
    t.join(30)
    check("b's delivery, once a committed: a duplicate", out.get("b"), False)
    with admin.cursor() as cur:
        cur.execute("SELECT count(*), min(applied_by) FROM %s.effects" % schema)
        check("one effect, a's", cur.fetchone(), (1, "a"))
    with a.cursor() as cur:
        check("one duplicate counted", idemflow_inbox.duplicates(cur, "billing"), 1)
    a.commit()

    # An effect that fails takes its claim with it.
    def boom(cur):
        raise RuntimeError("the effect failed")
    try:
        idemflow_inbox.handle(a, "billing", "evt-2", boom)
        check("a failing effect raises", "returned", "raised")
    except RuntimeError:
        check("a failing effect raises", "raised", "raised")
    check("the next delivery applies it",
          idemflow_inbox.handle(a, "billing", "evt-2", lambda cur: None), True)

    want = ("# HELP idemflow_inbox_duplicates_total Deliveries the inbox dropped as duplicates"
            " of an event already claimed.\n"
            "# TYPE idemflow_inbox_duplicates_total counter\n"
            'idemflow_inbox_duplicates_total{consumer="billing"} 1\n')
    out_file = os.path.join(os.environ.get("TMPDIR", "/tmp"), "%s.prom" % schema)
    p = subprocess.run([sys.executable, MODULE, "metrics", "--db", dsn, "-o", out_file],
                       capture_output=True, text=True)
    check("metrics -o: exit 0", (p.returncode, p.stderr), (0, ""))
    with open(out_file, encoding="utf-8") as f:
        check("metrics -o: the exact text", f.read(), want)
    check("no temporary file left", os.path.exists(out_file + ".tmp"), False)
    os.unlink(out_file)
    with a.cursor() as cur:
        check("the module's metrics(): the same bytes", idemflow_inbox.metrics(cur), want)
    a.close()
    b.close()
    admin.cursor().execute("DROP SCHEMA %s CASCADE" % schema)
    admin.close()
    print("%d failed" % len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
