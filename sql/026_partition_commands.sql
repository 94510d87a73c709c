-- 026_partition_commands.sql: more of the request path as partition
-- functions (doc/distribution.md, "PL/Proxy as built"): the unkeyed
-- create, the list of workflows, an endpoint and the list of endpoints,
-- the event feed, an endpoint's secret, an event's deliveries, an
-- endpoint's attempts and its undelivered events. Each is the server's statement of the same name
-- (app/server/queries.c) with its $n as parameters, one statement in one
-- transaction of the tenant's partition; the first argument, the tenant
-- id, routes the proxy's call (sql/proxy/004_commands.sql).

-- Q_CREATE_UNKEYED, and the request's trace context and actor, which a
-- single database takes from Q_TRACE_SET earlier in the same transaction:
-- through the proxy that transaction is the proxy's, so the proxy passes
-- them on as the last three arguments and they are set here, for this
-- call's transaction, as the columns' defaults (sql/008_trace.sql,
-- sql/014_actor.sql).
CREATE FUNCTION idemflow_create_unkeyed(
    p_tenant bigint, p_created_at timestamptz, p_id uuid, p_type text, p_input jsonb,
    p_event_id text, p_payload_head text, p_payload_tail text,
    p_traceparent text, p_tracestate text, p_actor text)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    PERFORM set_config('idemflow.traceparent', coalesce(p_traceparent, ''), true),
            set_config('idemflow.tracestate', coalesce(p_tracestate, ''), true),
            set_config('idemflow.actor', coalesce(p_actor, ''), true);
    WITH w AS (
      INSERT INTO workflows (tenant_id, id, type, state, input, created_at, updated_at)
      VALUES (p_tenant, p_id, p_type, 'pending', p_input, p_created_at, p_created_at)
      RETURNING tenant_id, id
    )
    INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload, created_at,
                        next_attempt_at)
    SELECT p_event_id, tenant_id, id, 1, 'workflow.created',
           p_payload_head || tenant_id || p_payload_tail, p_created_at, now()
      FROM w;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;

-- Q_WF_LIST: a page of the tenant's workflows (the statement's comment
-- says how the page and its byte budget work).
CREATE FUNCTION idemflow_wf_list(p_tenant bigint, p_state text, p_type text, p_after uuid,
                                 p_limit integer, p_budget bigint)
RETURNS TABLE (id uuid, type text, state text, input text, created_at text, business_key text,
               steps text, step integer, within boolean)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    WITH RECURSIVE page AS (
      (SELECT w.*, 1 AS n, 0::bigint AS start,
              octet_length(w.input::text)::bigint + octet_length(w.steps::text) AS run
         FROM workflows w
        WHERE w.tenant_id = p_tenant AND (p_state IS NULL OR w.state = p_state)
          AND (p_type IS NULL OR w.type = p_type)
          AND (p_after IS NULL OR w.id > p_after)
        ORDER BY w.id
        LIMIT 1)
      UNION ALL
      SELECT w.*, p.n + 1, p.run,
             p.run + octet_length(w.input::text) + octet_length(w.steps::text)
        FROM page p
       CROSS JOIN LATERAL (
             SELECT *
               FROM workflows w
              WHERE w.tenant_id = p_tenant AND (p_state IS NULL OR w.state = p_state)
                AND (p_type IS NULL OR w.type = p_type) AND w.id > p.id
              ORDER BY w.id
              LIMIT 1) w
       WHERE p.n < p_limit AND p.start < p_budget
    )
    SELECT g.id, g.type, g.state, g.input::text,
           to_char(g.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
           g.business_key, g.steps::text, g.step, g.start < p_budget
      FROM page g
     ORDER BY g.id;
END;
$$;

-- Q_ENDPOINT_GET: an endpoint as the server renders it, never its secret.
CREATE FUNCTION idemflow_endpoint_get(p_tenant bigint, p_id uuid)
RETURNS TABLE (id uuid, url text, filter_types text, ordering text, disabled boolean,
               disabled_reason text, metadata text, created_at text, updated_at text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT e.id, e.url, to_json(e.filter_types)::text, e.ordering, e.disabled,
           e.disabled_reason, e.metadata::text,
           to_char(e.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
           to_char(e.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
      FROM endpoints e
     WHERE e.tenant_id = p_tenant AND e.id = p_id;
END;
$$;

-- Q_ENDPOINT_LIST: a page of the tenant's endpoints, as Q_WF_EVENTS's.
CREATE FUNCTION idemflow_endpoint_list(p_tenant bigint, p_after uuid, p_limit integer,
                                       p_budget bigint)
RETURNS TABLE (id uuid, url text, filter_types text, ordering text, disabled boolean,
               disabled_reason text, metadata text, created_at text, updated_at text,
               within boolean)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT e.id, e.url, to_json(e.filter_types)::text, e.ordering, e.disabled,
           e.disabled_reason, e.metadata::text,
           to_char(e.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
           to_char(e.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
           e.start < p_budget
      FROM (SELECT s.*, lag(s.start, 1, 0::bigint) OVER (ORDER BY s.id) AS prev
              FROM (SELECT l.*, sum(l.size) OVER (ORDER BY l.id) - l.size AS start
                      FROM (SELECT x.*,
                                   octet_length(x.url)::bigint
                                   + octet_length(x.metadata::text)
                                   + coalesce(octet_length(x.filter_types::text), 0)
                                   + 200 AS size
                              FROM endpoints x
                             WHERE x.tenant_id = p_tenant
                               AND (p_after IS NULL OR x.id > p_after)
                             ORDER BY x.id
                             LIMIT p_limit) l) s) e
     WHERE e.prev < p_budget
     ORDER BY e.id;
END;
$$;

-- Q_EVENTS_FEED: the tenant's events after an outbox id, reading at most
-- p_scan outbox rows of the partition's tenants (the statement's comment
-- says how the page ends). Outbox ids are the partition's own: a feed's
-- position is only good on the partition that gave it, which is the
-- tenant's until the tenant moves.
CREATE FUNCTION idemflow_events_feed(p_tenant bigint, p_after bigint, p_limit integer,
                                     p_budget bigint, p_scan integer)
RETURNS TABLE (id bigint, payload text, within boolean, actor text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    WITH s AS MATERIALIZED (
      SELECT o.id, o.tenant_id
        FROM outbox o
       WHERE o.id > p_after
       ORDER BY o.id
       LIMIT p_scan
    )
    SELECT f.id, f.payload, f.within, f.actor
      FROM (SELECT t.id, t.payload, t.actor, t.start < p_budget AS within,
                   lag(t.start, 1, 0::bigint) OVER (ORDER BY t.id) AS prev
              FROM (SELECT l.id, l.payload, l.actor,
                           sum(octet_length(l.payload)::bigint) OVER (ORDER BY l.id)
                           - octet_length(l.payload) AS start
                      FROM (SELECT o.id, o.payload, o.actor
                              FROM s
                              JOIN outbox o ON o.id = s.id
                             WHERE s.tenant_id = p_tenant
                               AND o.type NOT LIKE 'endpoint.%'
                               AND o.type NOT LIKE 'delivery.%'
                             ORDER BY s.id
                             LIMIT p_limit) l) t) f
     WHERE f.prev < p_budget
     UNION ALL
    SELECT max(s.id), NULL, true, NULL
      FROM s
    HAVING count(*) = p_scan::bigint
     ORDER BY 1, 2;
END;
$$;

-- Q_ENDPOINT_SECRET: an endpoint's secrets; a previous one past its end
-- no longer signs and is not shown.
CREATE FUNCTION idemflow_endpoint_secret(p_tenant bigint, p_id uuid)
RETURNS TABLE (secret text, previous_secret text, previous_secret_until text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT e.secret,
           CASE WHEN e.previous_secret_until > now() THEN e.previous_secret END,
           CASE WHEN e.previous_secret_until > now()
                THEN to_char(e.previous_secret_until AT TIME ZONE 'UTC',
                             'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END
      FROM endpoints e
     WHERE e.tenant_id = p_tenant AND e.id = p_id;
END;
$$;

-- Q_EVENT_DELIVERIES: one event's deliveries, a page in endpoint id order.
CREATE FUNCTION idemflow_event_deliveries(p_tenant bigint, p_event text, p_after uuid,
                                          p_limit integer, p_budget bigint)
RETURNS TABLE (endpoint_id uuid, event_id text, state text, attempts integer,
               next_attempt_at text, last_error text, updated_at text, within boolean)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT x.endpoint_id, o.event_id, x.state, x.attempts,
           to_char(x.next_attempt_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
           x.last_error,
           to_char(x.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
           x.within
      FROM outbox o
      LEFT JOIN LATERAL (
           SELECT t.*, t.start < p_budget AS within
             FROM (SELECT l.*,
                          lag(l.start, 1, 0::bigint) OVER (ORDER BY l.endpoint_id) AS prev
                     FROM (SELECT d.endpoint_id, d.state, d.attempts, d.next_attempt_at,
                                  d.last_error, d.updated_at,
                                  sum(200 + octet_length(coalesce(d.last_error, ''))::bigint)
                                      OVER (ORDER BY d.endpoint_id)
                                  - 200 - octet_length(coalesce(d.last_error, '')) AS start
                             FROM (SELECT e.id
                                     FROM endpoints e
                                    WHERE e.tenant_id = o.tenant_id
                                      AND (p_after IS NULL OR e.id > p_after)
                                    ORDER BY e.id) e
                             JOIN deliveries d
                               ON d.tenant_id = o.tenant_id AND d.endpoint_id = e.id
                              AND d.workflow_id = o.workflow_id AND d.seq = o.seq
                            ORDER BY d.endpoint_id
                            LIMIT p_limit) l) t
            WHERE t.prev < p_budget) x ON true
     WHERE o.event_id = p_event AND o.tenant_id = p_tenant
     ORDER BY x.endpoint_id;
END;
$$;

-- Q_ENDPOINT_UNDELIVERED: one endpoint's deliveries in the given states,
-- a page along the deliveries' primary key.
CREATE FUNCTION idemflow_endpoint_undelivered(p_tenant bigint, p_id uuid, p_after_stream uuid,
                                              p_after_seq integer, p_states text[],
                                              p_limit integer, p_budget bigint)
RETURNS TABLE (event_id text, endpoint_id uuid, state text, attempts integer,
               next_attempt_at text, last_error text, updated_at text, within boolean)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT x.event_id, x.endpoint_id, x.state, x.attempts,
           to_char(x.next_attempt_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
           x.last_error,
           to_char(x.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
           x.within
      FROM endpoints e
      LEFT JOIN LATERAL (
           SELECT t.*, t.start < p_budget AS within
             FROM (SELECT l.*,
                          lag(l.start, 1, 0::bigint) OVER (ORDER BY l.workflow_id, l.seq)
                              AS prev
                     FROM (SELECT d.workflow_id, d.seq, d.workflow_id || '.' || d.seq AS event_id,
                                  d.endpoint_id, d.state, d.attempts, d.next_attempt_at,
                                  d.last_error, d.updated_at,
                                  sum(200 + octet_length(coalesce(d.last_error, ''))::bigint)
                                      OVER (ORDER BY d.workflow_id, d.seq)
                                  - 200 - octet_length(coalesce(d.last_error, '')) AS start
                             FROM deliveries d
                            WHERE d.tenant_id = e.tenant_id AND d.endpoint_id = e.id
                              AND d.state = ANY (p_states)
                              AND (p_after_stream IS NULL
                                   OR (d.workflow_id, d.seq) > (p_after_stream, p_after_seq))
                            ORDER BY d.workflow_id, d.seq
                            LIMIT p_limit) l) t
            WHERE t.prev < p_budget) x ON true
     WHERE e.tenant_id = p_tenant AND e.id = p_id
     ORDER BY x.workflow_id, x.seq;
END;
$$;

-- Q_ENDPOINT_ATTEMPTS: one endpoint's attempts, newest first, a page
-- along the ledger's primary key.
CREATE FUNCTION idemflow_endpoint_attempts(p_tenant bigint, p_id uuid, p_before bigint,
                                           p_outcome text, p_status integer, p_limit integer,
                                           p_budget bigint)
RETURNS TABLE (id bigint, event_id text, trigger text, started_at text,
               duration_ms double precision, status integer, outcome text, response text,
               within boolean)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT x.id, x.event_id, x.trigger,
           to_char(x.started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
           x.duration_ms, x.status, x.outcome, x.response, x.within
      FROM endpoints e
      LEFT JOIN LATERAL (
           SELECT t.*, t.start < p_budget AS within
             FROM (SELECT l.*, lag(l.start, 1, 0::bigint) OVER (ORDER BY l.id DESC) AS prev
                     FROM (SELECT a.id, a.event_id, a.trigger, a.started_at, a.duration_ms,
                                  a.status, a.outcome, a.response,
                                  sum(300 + octet_length(a.response)::bigint)
                                      OVER (ORDER BY a.id DESC)
                                  - 300 - octet_length(a.response) AS start
                             FROM delivery_attempts a
                            WHERE a.tenant_id = e.tenant_id AND a.endpoint_id = e.id
                              AND (p_before IS NULL OR a.id < p_before)
                              AND (p_outcome IS NULL
                                   OR (p_outcome = 'succeeded') = (a.outcome = 'succeeded'))
                              AND (p_status IS NULL OR a.status = p_status)
                            ORDER BY a.id DESC
                            LIMIT p_limit) l) t
            WHERE t.prev < p_budget) x ON true
     WHERE e.tenant_id = p_tenant AND e.id = p_id
     ORDER BY x.id DESC;
END;
$$;
