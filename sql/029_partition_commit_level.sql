-- 029_partition_commit_level.sql: the commit level of the writes a
-- proxy sends, pinned as a worker pins it on its own connection.
--
-- A worker connected to its database raises synchronous_commit to "on"
-- at connect when a database or role default has it weaker ("off",
-- "local", "remote_write"), so an answer is sent only after its commit
-- is durable (app/core/db.c). Through a PL/Proxy proxy the statements run
-- on the proxy's own connection to the partition, with the partition's
-- defaults: a partition with ALTER DATABASE ... SET synchronous_commit =
-- off answered a create 201 before its commit was durable, and a crash
-- could then lose a created workflow whose key the client holds. Every
-- partition function that writes what an answer acknowledges now raises
-- it for its own transaction first: the keyed and the unkeyed create
-- (whole, otherwise as in 024_partition_functions.sql and
-- 026_partition_commands.sql), a key's refreshed expiry
-- (024_partition_functions.sql), a keyed command's stored answer
-- (027_partition_keyed_commands.sql, whose idemflow_keyed_command raises
-- it already).

-- synchronous_commit at least "on" until this transaction ends;
-- "remote_apply", stronger, is kept.
CREATE FUNCTION idemflow_commit_durable()
RETURNS void LANGUAGE sql AS $$
    SELECT set_config('synchronous_commit', 'on', true)
     WHERE current_setting('synchronous_commit') NOT IN ('on', 'remote_apply');
$$;

-- Q_CREATE_KEYED
CREATE OR REPLACE FUNCTION idemflow_create_keyed(
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
    PERFORM idemflow_commit_durable();
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

-- Q_CREATE_UNKEYED, its trace context and actor.
CREATE OR REPLACE FUNCTION idemflow_create_unkeyed(
    p_tenant bigint, p_created_at timestamptz, p_id uuid, p_type text, p_input jsonb,
    p_event_id text, p_payload_head text, p_payload_tail text,
    p_traceparent text, p_tracestate text, p_actor text)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    PERFORM idemflow_commit_durable();
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

-- Q_KEY_REFRESH
CREATE OR REPLACE FUNCTION idemflow_key_refresh(p_tenant bigint, p_key text, p_ttl interval)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    PERFORM idemflow_commit_durable();
    UPDATE idempotency_keys k
       SET expires_at = greatest(k.expires_at, now() + coalesce(
           (SELECT idempotency_ttl FROM tenants WHERE id = p_tenant), p_ttl))
     WHERE k.tenant_id = p_tenant AND k.key = p_key;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;

-- Q_KEY_STORE_ANSWER
CREATE OR REPLACE FUNCTION idemflow_key_store_answer(p_tenant bigint, p_key text, p_status smallint,
                                          p_headers text, p_body text)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    PERFORM idemflow_commit_durable();
    UPDATE idempotency_keys
       SET status = p_status, headers = p_headers, body = p_body
     WHERE tenant_id = p_tenant AND key = p_key AND status = 1;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;
