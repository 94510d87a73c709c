-- 001_init.sql: tenants, API tokens, idempotency keys, workflows, outbox.
--
-- Every hot table is keyed by tenant_id first, so each command touches one
-- tenant's rows and the tables can later be distributed by tenant. The hot
-- tables carry tenant_id without a foreign key to tenants: that check would
-- take a KEY SHARE lock on the one tenant row for every insert, and all of a
-- tenant's concurrent requests would queue on it. Tenants are never deleted.

CREATE TABLE tenants (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL UNIQUE
                CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$'),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Bearer tokens are stored as BLAKE2b-256 hashes, never in plaintext.
CREATE TABLE api_tokens (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    token_hash  bytea NOT NULL UNIQUE CHECK (octet_length(token_hash) = 32),
    tenant_id   bigint NOT NULL REFERENCES tenants (id),
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

-- One row per (tenant, key): the unique index settles every race. The
-- response is kept as text, not jsonb, because a replay must be
-- byte-identical and jsonb would reorder keys.
CREATE TABLE idempotency_keys (
    tenant_id    bigint NOT NULL,
    key          text NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 255),
    method       text NOT NULL,
    path         text NOT NULL,
    fingerprint  bytea NOT NULL,            -- BLAKE2b-256 of method, path, canonical body
    status       smallint NOT NULL,         -- stored response
    headers      text NOT NULL,             -- "Name: value" lines that a replay repeats
    body         text NOT NULL,
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, key)
);

CREATE TABLE workflows (
    tenant_id   bigint NOT NULL,
    id          uuid NOT NULL,
    type        text NOT NULL,
    state       text NOT NULL DEFAULT 'pending'
                CHECK (state IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
    input       jsonb NOT NULL,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, id)
);

-- The transactional outbox: written in the same transaction as the state
-- change it announces. event_id is deterministic (workflow id "." seq) and
-- stays the same across delivery attempts, so consumers can deduplicate.
CREATE TABLE outbox (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id         text NOT NULL UNIQUE,
    tenant_id        bigint NOT NULL,
    workflow_id      uuid NOT NULL,
    seq              integer NOT NULL,
    type             text NOT NULL,
    payload          text NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_error       text,
    published_at     timestamptz,
    dead_at          timestamptz,
    UNIQUE (workflow_id, seq),
    FOREIGN KEY (tenant_id, workflow_id) REFERENCES workflows (tenant_id, id)
);

-- What a dispatcher scans: only events still to deliver.
CREATE INDEX outbox_due ON outbox (next_attempt_at, id)
    WHERE published_at IS NULL AND dead_at IS NULL;
