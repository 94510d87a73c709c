"""idemflow_inbox - idemflow's consumer inbox for Python consumers (psycopg2).

idemflow's dispatcher delivers every event at least once, with an id that
stays the same across retries. A consumer applies each event once by
claiming its id in the transaction that applies its effect. This module
uses only the SQL of inbox.sql (installed beside it, in
/usr/share/idemflow/consumer/), the same SQL libidemflow-inbox runs, so
consumers in C, Python or anything else can share one inbox:

    import psycopg2, idemflow_inbox

    conn = psycopg2.connect("dbname=billing")
    idemflow_inbox.setup(conn)               # once: applies inbox.sql

    def charge(cur, event):                  # the effect, on the same cursor
        cur.execute("INSERT INTO charges ...", ...)

    # per delivery: True = applied now, False = a duplicate, skipped
    applied = idemflow_inbox.handle(conn, "billing", event_id,
                                    lambda cur: charge(cur, event))
    # then acknowledge (2xx, ack); an exception: answer "try again" (5xx, nack)

handle() is claim() and the effect in one transaction, committed together;
claim() is the call to make inside a transaction of your own. A duplicate
is counted per consumer when its transaction commits; metrics() gives the
counts as Prometheus text. Run as a program it applies the SQL or prints
the metrics:

    python3 /usr/share/idemflow/consumer/idemflow_inbox.py setup   --db DSN
    python3 /usr/share/idemflow/consumer/idemflow_inbox.py metrics --db DSN [-o FILE]

(-o writes FILE.tmp and renames it, for node_exporter's textfile
collector.) See doc/consumers.md.
"""

import os
import sys

# Where inbox.sql is: beside this file once installed; in a source tree,
# sql/consumer/ of the tree.
_HERE = os.path.dirname(os.path.abspath(__file__))
_SQL_PLACES = (os.path.join(_HERE, "inbox.sql"),
               os.path.join(_HERE, "..", "..", "sql", "consumer", "inbox.sql"))


def sql_path():
    """The path of inbox.sql, or raise FileNotFoundError."""
    for p in _SQL_PLACES:
        if os.path.isfile(p):
            return os.path.normpath(p)
    raise FileNotFoundError("inbox.sql is not beside %s" % __file__)


def setup(conn, path=None):
    """Apply inbox.sql to conn's database (in the first schema of its
    search_path): idempotent, concurrent calls queue. conn must not be in a
    transaction: the file commits its own."""
    with open(path or sql_path(), encoding="utf-8") as f:
        text = f.read()
    old = conn.autocommit
    conn.autocommit = True  # the file holds its BEGIN and COMMIT
    try:
        with conn.cursor() as cur:
            cur.execute(text)
    finally:
        conn.autocommit = old


def claim(cur, consumer, event_id):
    """Inside the caller's transaction: True for the first delivery of
    event_id to consumer (apply the effect in the same transaction), False
    for a duplicate of a committed claim (skip it; counted when the
    transaction commits). A claim held by a transaction still open waits
    until that one ends."""
    if not consumer or not event_id:
        raise ValueError("consumer and event id must be non-empty")
    cur.execute("SELECT idemflow_inbox_claim(%s, %s)", (consumer, event_id))
    return cur.fetchone()[0] is True


def handle(conn, consumer, event_id, apply):
    """One delivery in one transaction: claim event_id and, the first time,
    call apply(cursor) for the effect; commit both. Returns True when the
    effect was applied, False for a duplicate. Raises (after a rollback)
    when anything failed: nothing was recorded, so the redelivery will
    apply it."""
    try:
        with conn.cursor() as cur:
            first = claim(cur, consumer, event_id)
            if first:
                apply(cur)
        conn.commit()
        return first
    except BaseException:
        if not conn.closed:
            conn.rollback()
        raise


def duplicates(cur, consumer):
    """The duplicates consumer has dropped (committed)."""
    cur.execute("SELECT d.duplicates FROM idemflow_inbox_duplicates() d WHERE d.consumer = %s",
                (consumer,))
    row = cur.fetchone()
    return row[0] if row else 0


def metrics(cur):
    """Every consumer's duplicates as Prometheus text (0.0.4)."""
    cur.execute("SELECT idemflow_inbox_metrics()")
    return cur.fetchone()[0]


def write_textfile(cur, path):
    """metrics() written to path through path.tmp and a rename."""
    text = metrics(cur)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def main(argv):
    import argparse

    import psycopg2  # Debian: python3-psycopg2

    ap = argparse.ArgumentParser(prog="idemflow_inbox.py",
                                 description="idemflow's consumer inbox: apply its SQL, "
                                             "or print its metrics")
    ap.add_argument("command", choices=("setup", "metrics"))
    ap.add_argument("--db", default="", help="libpq connection string (default: PG* variables)")
    ap.add_argument("-o", "--output", help="metrics: write this file (textfile collector)")
    a = ap.parse_args(argv)
    try:
        conn = psycopg2.connect(a.db)
    except psycopg2.Error as exc:
        print("idemflow_inbox: could not connect to database: %s" % str(exc).strip(),
              file=sys.stderr)
        return 69  # EX_UNAVAILABLE
    try:
        if a.command == "setup":
            setup(conn)
        else:
            with conn.cursor() as cur:
                if a.output:
                    write_textfile(cur, a.output)
                else:
                    sys.stdout.write(metrics(cur))
            conn.rollback()
    except psycopg2.Error as exc:
        print("idemflow_inbox: %s failed: %s" % (a.command, str(exc).strip()), file=sys.stderr)
        return 75  # EX_TEMPFAIL
    except OSError as exc:
        print("idemflow_inbox: %s" % exc, file=sys.stderr)
        return 73  # EX_CANTCREAT
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
