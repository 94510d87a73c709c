-- 003_ops.sql: retention (idemflow prune), per-tenant key TTL, and the
-- per-key replay and conflict counts behind "idemflow debug
-- idempotency-check".

-- NULL: the server's idempotency_ttl. The create statement reads it by
-- primary key and stores created_at + TTL in expires_at, so a change
-- applies to keys created afterwards; a stored key keeps its expiry.
ALTER TABLE tenants
    ADD COLUMN idempotency_ttl interval CHECK (idempotency_ttl > interval '0');

-- How often each key was replayed or refused. Workers add to these rows
-- in batches (at most one statement per worker per second), never on the
-- replay's own round trip, so a replay stays one read-only statement.
-- conflicts: the key was reused for a different request (409 reused);
-- in_flight: it came again while its first request was still running
-- (409 in flight). A row goes when prune removes its key.
CREATE TABLE idempotency_key_stats (
    tenant_id  bigint NOT NULL,
    key        text NOT NULL,
    replays    bigint NOT NULL DEFAULT 0,
    conflicts  bigint NOT NULL DEFAULT 0,
    in_flight  bigint NOT NULL DEFAULT 0,
    last_seen  timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, key)
);

-- Prune finds expired keys through this index, a batch at a time, instead
-- of scanning the whole table for every batch. expires_at grows with time,
-- so inserts land on the index's rightmost page: measured cost in README
-- ("Retention").
CREATE INDEX idempotency_keys_expires ON idempotency_keys (expires_at);

-- Delivered events, oldest first, for prune. Partial: an event enters it
-- only when the dispatcher marks it published, never on the create path.
CREATE INDEX outbox_published ON outbox (published_at) WHERE published_at IS NOT NULL;

-- Dead events, for the dead-letter gauge of /metrics and "outbox list
-- --dead": partial, so it costs nothing until an event dies.
CREATE INDEX outbox_dead ON outbox (id) WHERE dead_at IS NOT NULL;
