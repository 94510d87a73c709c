-- 020_endpoints.sql: tenant endpoints, one delivery per matching endpoint
-- born in the transaction that writes the event, and the attempt ledger.
--
-- The configured sink stays the operator's endpoint: every tenant, every
-- type, drained from the outbox as before. An endpoint is a tenant's own
-- receiver (a URL, its filter and its signing secret). Whatever writes an
-- event (a create, a completion, a timer, a cancel) writes it with an
-- INSERT INTO outbox, and the trigger below adds, in that same
-- transaction, a delivery row for every endpoint of the tenant whose
-- filter matches: a subscription that existed when the event committed
-- cannot miss it, and one created after sees only later events. There is
-- no moment at which an event exists and its deliveries do not.
--
-- An event's workflow_id names its stream: a workflow, or, for the
-- operational events the dispatcher writes about an endpoint
-- (endpoint.disabled, delivery.exhausted, delivery.recovered), the
-- endpoint. Those go to the operator's endpoint only, so the foreign key
-- from outbox to workflows goes; every workflow event is written by a
-- statement that has just written or locked its workflow.

ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_tenant_id_workflow_id_fkey;

CREATE TABLE endpoints (
    tenant_id bigint NOT NULL REFERENCES tenants (id),
    id uuid NOT NULL,
    url text NOT NULL CHECK (url ~ '^https?://[^[:space:]]+$' AND octet_length(url) <= 2048),
    -- NULL: every type. Otherwise exact names and "prefix.*" globs.
    filter_types text[] CHECK (cardinality(filter_types) BETWEEN 1 AND 64),
    -- 'workflow': a workflow's events reach the endpoint in seq order, and
    -- a dead delivery holds back that endpoint's later ones of the same
    -- workflow; 'none': each delivery on its own.
    ordering text NOT NULL DEFAULT 'workflow' CHECK (ordering IN ('workflow', 'none')),
    disabled boolean NOT NULL DEFAULT false,
    -- why: 'manual' (PATCH disabled=true) or 'failing' (auto-disable)
    disabled_reason text CHECK (disabled_reason IN ('manual', 'failing')),
    disabled_at timestamptz,
    metadata jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    -- Standard Webhooks: "whsec_" and the base64 of the key
    secret text NOT NULL CHECK (secret ~ '^whsec_[A-Za-z0-9+/]{32,88}={0,2}$'),
    -- after a rotation, the old secret, also signed with until then
    previous_secret text CHECK (previous_secret ~ '^whsec_[A-Za-z0-9+/]{32,88}={0,2}$'),
    previous_secret_until timestamptz,
    -- health: failed attempts in a row, and since when
    failures integer NOT NULL DEFAULT 0 CHECK (failures >= 0),
    failing_since timestamptz,
    -- the seq of the last operational event about this endpoint (its
    -- stream in the outbox: workflow_id = the endpoint's id)
    event_seq integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    actor text CHECK (actor ~ '^(token:[1-9][0-9]{0,18}|system:[a-z]{1,32})$'),
    PRIMARY KEY (tenant_id, id),
    CHECK ((previous_secret IS NULL) = (previous_secret_until IS NULL)),
    CHECK (disabled = (disabled_reason IS NOT NULL))
);

COMMENT ON TABLE endpoints IS
    'a tenant''s receivers: every event of the tenant whose type matches filter_types gets a delivery';

-- One row per (event, endpoint), keyed by the event's stream position
-- (workflow_id, seq), which also serves the per-workflow order: the
-- claim looks for an earlier pending or dead delivery of the same
-- endpoint and workflow in this key. No foreign keys: each is a trigger
-- that runs per row on the create's path; prune and DELETE
-- /v1/endpoints/{id} delete the rows that would dangle.
CREATE TABLE deliveries (
    tenant_id bigint NOT NULL,
    endpoint_id uuid NOT NULL,
    workflow_id uuid NOT NULL,
    seq integer NOT NULL,
    outbox_id bigint NOT NULL,
    -- pending: to send; delivered; dead: out of attempts (recoverable);
    -- skipped: born while its endpoint was disabled (recoverable)
    state text NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'delivered', 'dead', 'skipped')),
    attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    -- what asks for the next attempt, as the ledger records it: the
    -- dispatcher's own schedule, a resend (manual) or a recover
    trigger text NOT NULL DEFAULT 'scheduled' CHECK (trigger IN ('scheduled', 'manual', 'recover')),
    lease_owner text,
    lease_until timestamptz,
    last_error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, endpoint_id, workflow_id, seq)
);

COMMENT ON TABLE deliveries IS
    'one event to one endpoint; written with the event by outbox_deliveries()';

CREATE INDEX deliveries_due ON deliveries (next_attempt_at, outbox_id)
    WHERE state = 'pending';

-- Every attempt, as the dispatcher made it.
CREATE TABLE delivery_attempts (
    tenant_id bigint NOT NULL,
    endpoint_id uuid NOT NULL,
    id bigint GENERATED ALWAYS AS IDENTITY,
    workflow_id uuid NOT NULL,
    seq integer NOT NULL,
    event_id text NOT NULL,
    -- scheduled: the dispatcher's own; manual: a resend; recover: a recover
    trigger text NOT NULL CHECK (trigger IN ('scheduled', 'manual', 'recover')),
    started_at timestamptz NOT NULL,
    duration_ms double precision NOT NULL CHECK (duration_ms >= 0),
    -- the HTTP status; 0 when there was no answer
    status integer NOT NULL CHECK (status BETWEEN 0 AND 999),
    -- succeeded, or why not: http (a non-2xx answer), timeout, connect, tls,
    -- other
    outcome text NOT NULL
        CHECK (outcome IN ('succeeded', 'http', 'timeout', 'connect', 'tls', 'other')),
    -- the first 4 KiB of the answer's body, as text
    response text NOT NULL DEFAULT '' CHECK (octet_length(response) <= 4096),
    PRIMARY KEY (tenant_id, endpoint_id, id)
);

COMMENT ON TABLE delivery_attempts IS
    'the attempt ledger: one row per attempt to deliver an event to an endpoint';

CREATE INDEX delivery_attempts_event ON delivery_attempts (tenant_id, workflow_id, seq);

-- Does an event's type pass an endpoint's filter? NULL passes everything;
-- "workflow.*" passes "workflow.created" (the glob is a prefix ending in a
-- dot). SQL, so that the planner inlines it.
CREATE FUNCTION idemflow_type_matches(p_filter text[], p_type text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_filter IS NULL
        OR p_type = ANY (p_filter)
        OR EXISTS (SELECT 1
                     FROM unnest(p_filter) AS f
                    WHERE right(f, 2) = '.*'
                      AND starts_with(p_type, left(f, -1)))
$$;

-- The deliveries of one new event, in its transaction. A disabled
-- endpoint's is kept as skipped, never dropped. The trigger's WHEN keeps
-- the operational events (about endpoints and deliveries) out: they are
-- the operator's.
CREATE FUNCTION idemflow_outbox_deliveries() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO deliveries (tenant_id, endpoint_id, workflow_id, seq, outbox_id, state)
    SELECT NEW.tenant_id, e.id, NEW.workflow_id, NEW.seq, NEW.id,
           CASE WHEN e.disabled THEN 'skipped' ELSE 'pending' END
      FROM endpoints e
     WHERE e.tenant_id = NEW.tenant_id
       AND idemflow_type_matches(e.filter_types, NEW.type);
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_deliveries AFTER INSERT ON outbox
    FOR EACH ROW
    WHEN (NEW.type NOT LIKE 'endpoint.%' AND NEW.type NOT LIKE 'delivery.%')
    EXECUTE FUNCTION idemflow_outbox_deliveries();
