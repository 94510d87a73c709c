-- 002_dispatch.sql: what the outbox dispatcher needs.
--
-- A claim is a lease: the dispatcher that claimed an event owns it until
-- lease_until, so no transaction stays open while it talks to the network.
-- If it dies, the lease runs out and another run delivers the event again,
-- with the same event_id.
ALTER TABLE outbox
    ADD COLUMN lease_owner text,
    ADD COLUMN lease_until timestamptz;

-- Per-workflow order: the dispatcher looks up earlier undelivered events of
-- the same workflow through the (workflow_id, seq) unique index.

-- Wake dispatchers running with --loop. Row-level, so a statement that
-- inserts nothing (a replayed request) notifies nobody; identical
-- notifications within one transaction are folded into one by PostgreSQL.
CREATE FUNCTION idemflow_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('idemflow_outbox', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH ROW EXECUTE FUNCTION idemflow_outbox_notify();
