"""inbox.py - the consumer's inbox for the Python test consumers (stdlib only).

The same pattern as app/inbox/inbox.c, on SQLite instead of PostgreSQL, so that
a test consumer written in Python needs nothing beyond the standard
library: in ONE transaction, record the message id and apply the effect;
a redelivered message finds its id and its effect is skipped (counted as
a duplicate). A consumer that dies before the commit keeps neither, so
the redelivery applies it then.

Several processes may share one inbox file (the HTTP receiver and the
RabbitMQ consumer behind one service do): SQLite's file lock serializes
the transactions, and WAL mode lets readers run alongside.

Tables:
  inbox(message_id PRIMARY KEY, via, at)    one row per message applied
  effects(message_id, workflow_id, via, at) the effect: one row per
                                            application (exactly one per
                                            message when the inbox works)
  duplicates(message_id, via, at)           redeliveries that were dropped
"""

import sqlite3
import time

SCHEMA = """
CREATE TABLE IF NOT EXISTS inbox (
    message_id TEXT PRIMARY KEY,
    via        TEXT NOT NULL,
    at         REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS effects (
    message_id  TEXT NOT NULL,
    workflow_id TEXT,
    via         TEXT NOT NULL,
    at          REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS duplicates (
    message_id TEXT NOT NULL,
    via        TEXT NOT NULL,
    at         REAL NOT NULL
);
"""

APPLIED = "applied"
DUPLICATE = "duplicate"


class Inbox:
    """One connection to an inbox file; not to be shared between threads."""

    def __init__(self, path, via):
        self.via = via
        # isolation_level=None: transactions are begun and ended here, explicitly.
        self.db = sqlite3.connect(path, timeout=30, isolation_level=None,
                                  check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        # A commit survives the process being killed (the OS has the
        # pages); a power cut is not what these tests simulate.
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def claim(self, message_id, workflow_id=None):
        """Apply the effect of message_id once: APPLIED the first time,
        DUPLICATE afterwards. Raises sqlite3.Error when nothing was
        recorded (the caller answers "try again")."""
        now = time.time()
        self.db.execute("BEGIN IMMEDIATE")
        try:
            cur = self.db.execute(
                "INSERT INTO inbox (message_id, via, at) VALUES (?, ?, ?)"
                " ON CONFLICT (message_id) DO NOTHING", (message_id, self.via, now))
            if cur.rowcount == 1:
                self.db.execute(
                    "INSERT INTO effects (message_id, workflow_id, via, at) VALUES (?, ?, ?, ?)",
                    (message_id, workflow_id, self.via, now))
                outcome = APPLIED
            else:
                self.db.execute("INSERT INTO duplicates (message_id, via, at) VALUES (?, ?, ?)",
                                (message_id, self.via, now))
                outcome = DUPLICATE
            self.db.execute("COMMIT")
            return outcome
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def close(self):
        self.db.close()
