-- 031_keyed_commands_fenced.sql: the keyed commands through the proxy
-- fenced while their tenant moves (doc/distribution.md, "Moving a
-- tenant").
--
-- A move freezes its tenant on the source partition and copies its rows:
-- a write that commits there after the copy is lost. Writes of events are
-- fenced by the outbox trigger (030_tenant_move.sql), but a keyed command
-- through the proxy may write none (a job's activation or heartbeat, a
-- message kept for later) and still claim a key and keep the command's
-- rows on it, and a stored answer writes no event either. Both now call
-- idemflow_tenant_fence first: they hold the tenant's lock in share mode
-- until they commit, so the freeze waits for them, and once the tenant is
-- frozen they are refused (IDFMV, 503), before anything is written. The
-- functions are otherwise as in 027_partition_keyed_commands.sql and
-- 029_partition_commit_level.sql (the commit level now pinned by
-- idemflow_commit_durable).

-- Q_KEYED_COMMAND
CREATE OR REPLACE FUNCTION idemflow_keyed_command(
    p_tenant bigint, p_key text, p_method text, p_path text, p_fp bytea, p_ttl interval,
    p_bytes_fp bytea, p_actor text, p_traceparent text, p_tracestate text,
    p_sql text, p_args text[], p_store text[])
RETURNS TABLE (outcome text, rows text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_rows text;
    v_problem text;
BEGIN
    -- The settings a worker pins on its own connection (app/core/db.c)
    -- that the command's text and its commit depend on, for this call's
    -- transaction: PL/Proxy's connection has the partition's defaults.
    PERFORM set_config('bytea_output', 'hex', true),
            set_config('DateStyle', 'ISO, MDY', true),
            set_config('IntervalStyle', 'postgres', true),
            set_config('TimeZone', 'UTC', true),
            set_config('extra_float_digits', '1', true),
            set_config('idemflow.traceparent', coalesce(p_traceparent, ''), true),
            set_config('idemflow.tracestate', coalesce(p_tracestate, ''), true),
            set_config('idemflow.actor', coalesce(p_actor, ''), true);
    PERFORM idemflow_commit_durable();
    -- A command may write no event (a job's activation or heartbeat, a
    -- message kept for later): fenced here, not by the event trigger.
    PERFORM idemflow_tenant_fence(p_tenant);
    IF p_key IS NULL THEN
        RETURN QUERY SELECT 'unkeyed'::text, idemflow_command_rows(p_sql, p_args);
        RETURN;
    END IF;
    BEGIN
        INSERT INTO idempotency_keys (tenant_id, key, method, path, fingerprint, status,
                                      headers, body, created_at, expires_at,
                                      request_bytes_fp, actor)
        VALUES (p_tenant, p_key, p_method, p_path, p_fp, 0, '', '', now(),
                now() + coalesce((SELECT idempotency_ttl FROM tenants WHERE id = p_tenant),
                                 p_ttl),
                p_bytes_fp, nullif(p_actor, ''))
            ON CONFLICT (tenant_id, key) DO NOTHING;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'taken'::text, NULL::text;
            RETURN;
        END IF;
        v_rows := idemflow_command_rows(p_sql, p_args);
        -- The first column of a command's first row is its problem's
        -- slug, or NULL (sql/005_runs.sql): a bare word in record text.
        v_problem := substring(v_rows::json ->> 0 FROM '^\(([a-z-]+),');
        IF v_problem IS NOT NULL AND NOT v_problem = ANY (p_store) THEN
            RAISE EXCEPTION USING ERRCODE = 'IF001';
        END IF;
        UPDATE idempotency_keys
           SET status = 1, body = v_rows
         WHERE tenant_id = p_tenant AND key = p_key;
        RETURN QUERY SELECT 'created'::text, v_rows;
    EXCEPTION WHEN SQLSTATE 'IF001' THEN
        RETURN QUERY SELECT 'unstored'::text, v_rows;
    END;
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
    PERFORM idemflow_tenant_fence(p_tenant);
    UPDATE idempotency_keys
       SET status = p_status, headers = p_headers, body = p_body
     WHERE tenant_id = p_tenant AND key = p_key AND status = 1;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;
