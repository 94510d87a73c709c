-- 024_partition_functions.sql: the request path as functions, for a
-- database that is one partition behind a PL/Proxy proxy
-- (doc/distribution.md, "PL/Proxy as built").
--
-- Every call a worker sends through a proxy is one function call whose
-- first argument routes it: a token's hash (the proxy's directory knows
-- the token's tenant, and the tenant's partition) or a tenant id. The
-- proxy (sql/proxy/) has a PL/Proxy function of each name and signature
-- below; it runs the call on the tenant's partition, where it is the
-- function below, one statement in one transaction of that partition.
--
-- Each function is the server's statement of the same name
-- (app/server/queries.c) with the statement's $n as the function's
-- parameters, so the key's promises hold per partition exactly as on one
-- database: the keyed create claims the key, inserts the workflow and its
-- event and stores the answer in one statement. A single database keeps
-- running the statements themselves (routing = direct): these functions
-- cost it nothing.
--
-- PL/pgSQL, not SQL: a PL/pgSQL function keeps its plans for the session,
-- a SQL function that writes is planned again at every call.

-- A partition's ids: tenants and tokens draw from the partition's own
-- range (p_partition * 2^48 upwards), so a tenant's id is unique across
-- the partitions and stays the same when the tenant moves. Only raises
-- the sequences, so running it again is safe.
CREATE FUNCTION idemflow_partition_ids(p_partition integer)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_base bigint := p_partition::bigint << 48;
BEGIN
    IF p_partition < 0 OR p_partition > 32767 THEN
        RAISE EXCEPTION 'partition % is out of range (0 to 32767)', p_partition
            USING ERRCODE = '22023';
    END IF;
    IF p_partition = 0 THEN
        RETURN;
    END IF;
    PERFORM setval('tenants_id_seq', v_base) WHERE nextval('tenants_id_seq') < v_base;
    PERFORM setval('api_tokens_id_seq', v_base) WHERE nextval('api_tokens_id_seq') < v_base;
END;
$$;

-- The tokens of this partition and their tenants, for the proxy's
-- directory (idemflow_directory_sync). The argument routes the proxy's
-- call; it is not read here.
CREATE FUNCTION idemflow_partition_tokens(p_partition integer)
RETURNS TABLE (token_hash bytea, tenant_id bigint)
LANGUAGE sql STABLE AS $$
    SELECT token_hash, tenant_id FROM api_tokens;
$$;

-- Q_AUTH
CREATE FUNCTION idemflow_auth(p_token_hash bytea)
RETURNS TABLE (tenant_id bigint, token_id bigint)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT tenant_id, id
      FROM api_tokens
     WHERE token_hash = p_token_hash AND revoked_at IS NULL;
END;
$$;

-- Q_AUTH_KEY
CREATE FUNCTION idemflow_auth_key(p_token_hash bytea, p_key text)
RETURNS TABLE (tenant_id bigint, fingerprint bytea, status smallint, headers text, body text,
               expired boolean, request_bytes_fp bytea, ms_left bigint, token_id bigint)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT t.tenant_id, k.fingerprint, k.status, k.headers, k.body,
           k.expires_at <= now(), k.request_bytes_fp,
           floor(extract(epoch FROM k.expires_at - now()) * 1000)::bigint,
           t.id
      FROM api_tokens t
      LEFT JOIN idempotency_keys k ON k.tenant_id = t.tenant_id AND k.key = p_key
     WHERE t.token_hash = p_token_hash AND t.revoked_at IS NULL;
END;
$$;

-- Q_CREATE_KEYED: the token's check, the key's claim, the workflow, its
-- workflow.created event and the stored answer in one statement.
CREATE FUNCTION idemflow_create_keyed(
    p_token_hash bytea, p_key text, p_method text, p_path text, p_fp bytea,
    p_headers text, p_body text, p_created_at timestamptz, p_ttl interval,
    p_id uuid, p_type text, p_input jsonb, p_event_id text, p_payload_head text,
    p_bytes_fp bytea, p_payload_tail text, p_traceparent text, p_tracestate text)
RETURNS TABLE (tenant_id bigint, fingerprint bytea, status smallint, headers text, body text,
               expired boolean, request_bytes_fp bytea, ms_left bigint, token_id bigint,
               outcome text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH t AS (
      SELECT tenant_id, id, 'token:' || id AS actor
        FROM api_tokens
       WHERE token_hash = p_token_hash AND revoked_at IS NULL
    ), k AS (
      INSERT INTO idempotency_keys (tenant_id, key, method, path, fingerprint, status,
                                    headers, body, created_at, expires_at,
                                    request_bytes_fp, actor)
      SELECT tenant_id, p_key, p_method, p_path, p_fp, 201, p_headers, p_body, now(),
             now() + coalesce((SELECT idempotency_ttl
                                 FROM tenants
                                WHERE id = t.tenant_id), p_ttl),
             p_bytes_fp, actor
        FROM t
          ON CONFLICT (tenant_id, key) DO NOTHING
      RETURNING tenant_id, actor
    ), w AS (
      INSERT INTO workflows (tenant_id, id, type, state, input, created_at, updated_at,
                             traceparent, tracestate, actor)
      SELECT tenant_id, p_id, p_type, 'pending', p_input, p_created_at, p_created_at,
             p_traceparent, p_tracestate, actor
        FROM k
      RETURNING tenant_id, id, actor
    ), o AS (
      INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload,
                          created_at, next_attempt_at, traceparent, tracestate, actor)
      SELECT p_event_id, tenant_id, id, 1, 'workflow.created',
             p_payload_head || tenant_id || p_payload_tail, p_created_at, now(),
             p_traceparent, p_tracestate, actor
        FROM w
      RETURNING 1
    )
    SELECT t.tenant_id, x.fingerprint, x.status, x.headers, x.body,
           x.expires_at <= now(), x.request_bytes_fp,
           floor(extract(epoch FROM x.expires_at - now()) * 1000)::bigint, t.id,
           CASE WHEN t.tenant_id IS NULL THEN 'unauthorized'
                WHEN EXISTS (SELECT 1 FROM o) THEN 'created'
                WHEN x.key IS NULL THEN 'taken'
                ELSE 'existing' END
      FROM (VALUES (1)) AS one (n)
      LEFT JOIN t ON true
      LEFT JOIN idempotency_keys x
             ON x.tenant_id = t.tenant_id AND x.key = p_key
            AND NOT EXISTS (SELECT 1 FROM k);
END;
$$;

-- Q_KEY_GET
CREATE FUNCTION idemflow_key_get(p_tenant bigint, p_key text)
RETURNS TABLE (existing text, fingerprint bytea, status smallint, headers text, body text,
               expired boolean)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT 'existing'::text, fingerprint, status, headers, body, expires_at <= now()
      FROM idempotency_keys
     WHERE tenant_id = p_tenant AND key = p_key;
END;
$$;

-- Q_KEY_DELETE_EXPIRED: the key and its counts, only if it has expired.
CREATE FUNCTION idemflow_key_delete_expired(p_tenant bigint, p_key text)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    WITH d AS (
      DELETE FROM idempotency_keys k
       WHERE k.tenant_id = p_tenant AND k.key = p_key AND k.expires_at <= now()
      RETURNING k.tenant_id, k.key
    )
    DELETE FROM idempotency_key_stats s
     USING d
     WHERE s.tenant_id = d.tenant_id AND s.key = d.key;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;

-- Q_KEY_REFRESH: a key's lifetime counted again from now, never shortened.
CREATE FUNCTION idemflow_key_refresh(p_tenant bigint, p_key text, p_ttl interval)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    UPDATE idempotency_keys k
       SET expires_at = greatest(k.expires_at, now() + coalesce(
           (SELECT idempotency_ttl FROM tenants WHERE id = p_tenant), p_ttl))
     WHERE k.tenant_id = p_tenant AND k.key = p_key;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;

-- Q_WF_GET
CREATE FUNCTION idemflow_wf_get(p_tenant bigint, p_id uuid)
RETURNS TABLE (id uuid, type text, state text, input text, created_at text, business_key text,
               steps text, step integer, progress text)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT w.id, w.type, w.state, w.input::text,
           to_char(w.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
           w.business_key, w.steps::text, w.step,
           (SELECT j.progress::text FROM jobs j
             WHERE j.tenant_id = p_tenant AND j.workflow_id = w.id AND j.step = w.step)
      FROM workflows w
     WHERE w.tenant_id = p_tenant AND w.id = p_id;
END;
$$;

-- Q_WF_EVENTS: a page of a workflow's history (the statement's comment in
-- app/server/queries.c says how the page and its byte budget work).
CREATE FUNCTION idemflow_wf_events(p_tenant bigint, p_id uuid, p_after integer,
                                   p_limit integer, p_budget bigint)
RETURNS TABLE (seq integer, payload text, within boolean, actor text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT e.seq, e.payload, e.within, e.actor
      FROM workflows w
      LEFT JOIN LATERAL (
           SELECT t.seq, t.payload, t.start < p_budget AS within, t.actor
             FROM (SELECT s.seq, s.payload, s.actor, s.start,
                          lag(s.start, 1, 0::bigint) OVER (ORDER BY s.seq) AS prev
                     FROM (SELECT l.seq, l.payload, l.actor,
                                  sum(octet_length(l.payload)::bigint)
                                      OVER (ORDER BY l.seq)
                                  - octet_length(l.payload) AS start
                             FROM (SELECT o.seq, o.payload, o.actor
                                     FROM outbox o
                                    WHERE o.tenant_id = w.tenant_id
                                      AND o.workflow_id = w.id
                                      AND o.seq > p_after
                                    ORDER BY o.seq
                                    LIMIT p_limit) l) s) t
            WHERE t.prev < p_budget) e ON true
     WHERE w.tenant_id = p_tenant AND w.id = p_id
     ORDER BY e.seq;
END;
$$;

-- Q_KEYSTATS_FLUSH: a worker's batch holds keys of tenants of every
-- partition; the proxy sends it to all of them, and each adds the counts
-- of its own tenants. Rows in (tenant_id, key) order, as the statement.
CREATE FUNCTION idemflow_keystats_flush(p_tenants bigint[], p_keys text[], p_replays integer[],
                                        p_conflicts integer[], p_in_flight integer[])
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    INSERT INTO idempotency_key_stats AS s
           (tenant_id, key, replays, conflicts, in_flight, last_seen)
    SELECT u.tenant_id, u.key, u.replays, u.conflicts, u.in_flight, now()
      FROM unnest(p_tenants, p_keys, p_replays, p_conflicts, p_in_flight)
           AS u(tenant_id, key, replays, conflicts, in_flight)
     WHERE EXISTS (SELECT 1 FROM tenants t WHERE t.id = u.tenant_id)
     ORDER BY u.tenant_id, u.key
        ON CONFLICT (tenant_id, key) DO UPDATE
       SET replays = s.replays + excluded.replays,
           conflicts = s.conflicts + excluded.conflicts,
           in_flight = s.in_flight + excluded.in_flight,
           last_seen = excluded.last_seen;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;

-- Q_SCHEMA_VERSION, per partition: the proxy's /readyz reads every one.
CREATE FUNCTION idemflow_schema_version()
RETURNS TABLE (version integer, in_recovery boolean, read_only text)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(max(m.version), 0), pg_is_in_recovery(),
           current_setting('transaction_read_only')
      FROM schema_migrations m;
$$;

-- The same for one partition by number, for the proxy's /readyz, which
-- asks each partition alone (idemflow_partitions_status). The argument
-- routes the proxy's call; it is not read here.
CREATE FUNCTION idemflow_schema_version_on(p_partition integer)
RETURNS TABLE (version integer, in_recovery boolean, read_only text)
LANGUAGE sql STABLE AS $$
    SELECT * FROM idemflow_schema_version();
$$;

-- Q_METRICS_OUTBOX, per partition: the proxy sums the partitions' rows.
CREATE FUNCTION idemflow_metrics_outbox()
RETURNS TABLE (pending bigint, oldest numeric, dead bigint, activatable bigint, leased bigint,
               expired bigint, incidents bigint)
LANGUAGE sql STABLE AS $$
    SELECT o.pending, o.oldest::numeric, o.dead,
           j.activatable, j.leased, j.expired, i.incidents
      FROM (SELECT count(*) AS pending,
                   coalesce(extract(epoch FROM now() - min(created_at)), 0) AS oldest,
                   (SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL) AS dead
              FROM outbox
             WHERE published_at IS NULL AND dead_at IS NULL) o,
           (SELECT count(*) FILTER (WHERE state = 'activatable') AS activatable,
                   count(*) FILTER (WHERE state = 'active' AND due_at > now()) AS leased,
                   count(*) FILTER (WHERE state = 'active' AND due_at <= now()) AS expired
              FROM jobs
             WHERE state IN ('activatable', 'active')) j,
           (SELECT count(*) AS incidents FROM workflows WHERE state = 'incident') i;
$$;
