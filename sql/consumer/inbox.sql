-- inbox.sql: idemflow's consumer inbox, for the consumer's own database.
--
-- Not a migration of the idemflow service: a consumer of idemflow's
-- events applies this file to ITS database (psql -f inbox.sql, or
-- idemflow_inbox_setup() of libidemflow-inbox, which carries this text),
-- as often as it likes: applying it again changes nothing, and two
-- processes applying it at once queue on an advisory lock. It creates, in
-- the first schema of the search_path:
--
--   idemflow_inbox         one row per (consumer, event id) claimed
--   idemflow_inbox_stats   per consumer, the duplicates dropped
--   idemflow_inbox_claim(consumer, event_id) -> boolean
--   idemflow_inbox_duplicates() -> (consumer, duplicates)
--   idemflow_inbox_metrics() -> the Prometheus text of the duplicates
--
-- The dispatcher delivers every event at least once, with an id that
-- stays the same across retries. Inside the transaction that applies the
-- event's effect, the consumer first calls
--
--   SELECT idemflow_inbox_claim('billing', :event_id);
--
-- true: the first delivery: apply the effect, then COMMIT. false: a
-- duplicate, already applied by a committed transaction: skip the effect,
-- COMMIT (which counts the drop) and acknowledge. A transaction that rolls
-- back takes its claim with it, so the next delivery applies the event.
-- Two deliveries claimed at once: the second waits on the first's
-- uncommitted row (the primary key) until that transaction ends, then
-- answers false if it committed, true if it rolled back. Under REPEATABLE
-- READ or SERIALIZABLE the second fails with a serialization failure
-- (40001) instead: retry the transaction, and the claim answers false.
--
-- Changes to this file only add: new functions, CREATE OR REPLACE of a
-- function with the same signature, columns added IF NOT EXISTS.
-- doc/consumers.md describes the inbox, its metric and its retention.

BEGIN;
-- Quiet: "already exists, skipping" on every application is no news.
SET LOCAL client_min_messages = warning;
SELECT pg_advisory_xact_lock(hashtext('idemflow_inbox'));

CREATE TABLE IF NOT EXISTS idemflow_inbox (
    consumer    text NOT NULL,
    event_id    text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

-- One row per consumer, written only by a duplicate: a first delivery
-- never touches it, so consumers' transactions do not queue on it.
CREATE TABLE IF NOT EXISTS idemflow_inbox_stats (
    consumer   text PRIMARY KEY,
    duplicates bigint NOT NULL DEFAULT 0
);

-- ON CONFLICT DO NOTHING, not a caught unique violation: that would abort
-- the caller's transaction.
CREATE OR REPLACE FUNCTION idemflow_inbox_claim(p_consumer text, p_event_id text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF p_consumer IS NULL OR p_event_id IS NULL THEN
        RAISE EXCEPTION 'idemflow_inbox_claim: consumer and event id must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    INSERT INTO idemflow_inbox (consumer, event_id)
    VALUES (p_consumer, p_event_id)
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
        RETURN true;
    END IF;
    INSERT INTO idemflow_inbox_stats AS s (consumer, duplicates)
    VALUES (p_consumer, 1)
    ON CONFLICT (consumer) DO UPDATE
    SET duplicates = s.duplicates + 1;
    RETURN false;
END
$$;

-- Every consumer that has claimed an event or dropped a duplicate, with
-- its duplicates (0 for none). The consumers of idemflow_inbox are read
-- by a skip over its primary key: one index probe per consumer, however
-- many events it holds.
CREATE OR REPLACE FUNCTION idemflow_inbox_duplicates()
RETURNS TABLE (consumer text, duplicates bigint) LANGUAGE sql STABLE AS $$
    WITH RECURSIVE c (consumer) AS (
        (SELECT i.consumer
         FROM idemflow_inbox i
         ORDER BY i.consumer
         LIMIT 1)
        UNION ALL
        SELECT (SELECT i.consumer
                FROM idemflow_inbox i
                WHERE i.consumer > c.consumer
                ORDER BY i.consumer
                LIMIT 1)
        FROM c
        WHERE c.consumer IS NOT NULL
    )
    SELECT consumer, coalesce(s.duplicates, 0)
    FROM (SELECT consumer FROM c WHERE consumer IS NOT NULL) k
    FULL JOIN idemflow_inbox_stats s USING (consumer)
    ORDER BY consumer COLLATE "C"
$$;

-- The same as Prometheus text (exposition format 0.0.4), one line per
-- consumer, the label value escaped as the format asks (\\, \", \n).
CREATE OR REPLACE FUNCTION idemflow_inbox_metrics()
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT '# HELP idemflow_inbox_duplicates_total Deliveries the inbox dropped as duplicates of an event already claimed.' || chr(10)
        || '# TYPE idemflow_inbox_duplicates_total counter' || chr(10)
        || coalesce(string_agg(format('idemflow_inbox_duplicates_total{consumer="%s"} %s',
                                      replace(replace(replace(d.consumer, E'\\', E'\\\\'),
                                                      '"', E'\\"'),
                                              chr(10), E'\\n'),
                                      d.duplicates) || chr(10),
                               '' ORDER BY d.consumer COLLATE "C"), '')
    FROM idemflow_inbox_duplicates() d
$$;

COMMIT;
