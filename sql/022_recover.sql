-- 022_recover.sql: recover an endpoint's dead and skipped deliveries, and
-- resend one event to one endpoint (POST /v1/endpoints/{id}/recover,
-- POST /v1/events/{id}/resend, and the CLI's "endpoint recover" and
-- "event resend", which run the same functions).
--
-- Both set a delivery pending, due now, with its attempts back at 0 and
-- the trigger that the attempt ledger records for the next attempt
-- ('recover' or 'manual'). The API runs them under an Idempotency-Key
-- whose stored answer a retry replays: a retried recover sends each event
-- once more, not twice. Neither enables a disabled endpoint.
--
-- Each returns rows whose first two columns are (problem slug or NULL,
-- detail), as the commands of 005_runs.sql do. An event is found by its
-- event id, "<stream uuid>.<seq>", through outbox's unique index; its
-- delivery to an endpoint by the deliveries' primary key.

-- The deliveries of one endpoint whose state is in p_states ('dead',
-- 'skipped') and whose event was created in [p_since, p_until) with a
-- type that p_types passes (NULL: every type; names and "prefix.*" globs,
-- as an endpoint's filter_types). -> one row: (problem, detail, how many
-- were set pending).
CREATE FUNCTION idemflow_endpoint_recover(p_tenant bigint, p_endpoint uuid,
                                          p_since timestamptz, p_until timestamptz,
                                          p_types text[], p_states text[])
RETURNS TABLE (problem text, detail text, recovered bigint)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM endpoints WHERE tenant_id = p_tenant AND id = p_endpoint;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not-found', 'no such endpoint', NULL::bigint;
        RETURN;
    END IF;
    RETURN QUERY
    WITH u AS (
        UPDATE deliveries d
           SET state = 'pending', attempts = 0, next_attempt_at = now(),
               trigger = 'recover', lease_owner = NULL, lease_until = NULL,
               updated_at = now()
          FROM outbox o
         WHERE d.tenant_id = p_tenant AND d.endpoint_id = p_endpoint
           AND d.state = ANY (p_states)
           AND o.id = d.outbox_id
           AND o.created_at >= p_since AND o.created_at < p_until
           AND idemflow_type_matches(p_types, o.type)
        RETURNING 1
    )
    SELECT NULL::text, NULL::text, count(*) FROM u;
END
$$;

-- One event's delivery to one endpoint, pending again whatever its state
-- (a delivered one is sent once more). An event without a delivery to
-- that endpoint (created before the endpoint, or not passed by its
-- filter) is a state-conflict: a resend repeats a delivery, it does not
-- subscribe. -> one row: (problem, detail, endpoint_id, event_id, state,
-- attempts, next_attempt_at, last_error, updated_at).
CREATE FUNCTION idemflow_event_resend(p_tenant bigint, p_event text, p_endpoint uuid)
RETURNS TABLE (problem text, detail text, endpoint_id uuid, event_id text, state text,
               attempts integer, next_attempt_at timestamptz, last_error text,
               updated_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    ev outbox%ROWTYPE;
BEGIN
    SELECT * INTO ev FROM outbox o WHERE o.event_id = p_event AND o.tenant_id = p_tenant;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not-found', 'no such event', NULL::uuid, NULL::text, NULL::text,
                            NULL::integer, NULL::timestamptz, NULL::text, NULL::timestamptz;
        RETURN;
    END IF;
    PERFORM 1 FROM endpoints e WHERE e.tenant_id = p_tenant AND e.id = p_endpoint;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not-found', 'no such endpoint', NULL::uuid, NULL::text, NULL::text,
                            NULL::integer, NULL::timestamptz, NULL::text, NULL::timestamptz;
        RETURN;
    END IF;
    RETURN QUERY
    UPDATE deliveries d
       SET state = 'pending', attempts = 0, next_attempt_at = now(), trigger = 'manual',
           lease_owner = NULL, lease_until = NULL, updated_at = now()
     WHERE d.tenant_id = p_tenant AND d.endpoint_id = p_endpoint
       AND d.workflow_id = ev.workflow_id AND d.seq = ev.seq
    RETURNING NULL::text, NULL::text, d.endpoint_id, ev.event_id, d.state, d.attempts,
              d.next_attempt_at, d.last_error, d.updated_at;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'state-conflict',
                            format('event %s has no delivery to endpoint %s: it was written '
                                   'before the endpoint existed, or the endpoint''s '
                                   'filter_types do not pass its type', p_event, p_endpoint),
                            NULL::uuid, NULL::text, NULL::text, NULL::integer,
                            NULL::timestamptz, NULL::text, NULL::timestamptz;
    END IF;
END
$$;
