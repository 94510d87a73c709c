"""inbox.py - the test consumers' application, on idemflow's shipped inbox.

receiver.py and amqp_consumer.py apply events through this: the
deduplication is app/inbox/idemflow_inbox.py (the module installed as
/usr/share/idemflow/consumer/idemflow_inbox.py) over sql/consumer/inbox.sql,
in the consumer's own PostgreSQL database, exactly as a user's consumer
does it; so the chaos run tests what users get. What is the harness's own
is the effect, recorded in the same transaction as the claim:

  effects(message_id, workflow_id, via, at)  one row per application
                                             (exactly one per event when
                                             the inbox works)
  duplicates(message_id, via, at)            one row per redelivery the
                                             inbox dropped

Several processes share one inbox (the HTTP receiver and the RabbitMQ
consumer behind one service do) under one consumer name, so a redelivery
through the other transport is a duplicate too. Needs Debian's
python3-psycopg2.
"""

import os
import sys
import time

import psycopg2

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(TOP, "app", "inbox"))
import idemflow_inbox  # noqa: E402 - the shipped module, from the source tree

Error = psycopg2.Error
APPLIED = "applied"
DUPLICATE = "duplicate"

SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    message_id  text NOT NULL,
    workflow_id text,
    via         text NOT NULL,
    at          double precision NOT NULL
);
CREATE TABLE IF NOT EXISTS duplicates (
    message_id text NOT NULL,
    via        text NOT NULL,
    at         double precision NOT NULL
);
"""


class Inbox:
    """One connection to the consumer's database; not to be shared between
    threads. A connection lost (the database restarted) is opened again
    by the next claim."""

    def __init__(self, dsn, consumer, via):
        self.dsn = dsn
        self.consumer = consumer
        self.via = via
        self.conn = None
        self._connect()
        idemflow_inbox.setup(self.conn)
        with self.conn.cursor() as cur:
            cur.execute(SCHEMA)
        self.conn.commit()

    def _connect(self):
        if self.conn is None or self.conn.closed:
            self.conn = psycopg2.connect(self.dsn, connect_timeout=5,
                                         application_name="idemflow-test-" + self.via)

    def claim(self, message_id, workflow_id=None):
        """Apply the effect of message_id once: APPLIED the first time,
        DUPLICATE afterwards. Raises Error when nothing was recorded (the
        caller answers "try again")."""
        now = time.time()
        try:
            self._connect()
            with self.conn.cursor() as cur:
                if idemflow_inbox.claim(cur, self.consumer, message_id):
                    cur.execute("INSERT INTO effects (message_id, workflow_id, via, at)"
                                " VALUES (%s, %s, %s, %s)",
                                (message_id, workflow_id, self.via, now))
                    outcome = APPLIED
                else:
                    cur.execute("INSERT INTO duplicates (message_id, via, at) VALUES (%s, %s, %s)",
                                (message_id, self.via, now))
                    outcome = DUPLICATE
            self.conn.commit()
            return outcome
        except BaseException:
            if self.conn is not None and not self.conn.closed:
                try:
                    self.conn.rollback()
                except Error:
                    self.conn.close()
            raise

    def close(self):
        if self.conn is not None:
            self.conn.close()
