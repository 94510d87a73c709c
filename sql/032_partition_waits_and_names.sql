-- 032_partition_waits_and_names.sql: through the proxy, a command's rows
-- keep their columns' names, and a wait on a key's owner or a tenant's
-- lock is bounded as on one database.
--
-- A render reads some columns by name (a job's "steps", "priority",
-- "compensates", its trace context: app/server/jobs.c), and the rows of
-- 027_partition_keyed_commands.sql were values only: an activation
-- through the proxy answered its jobs without "steps". The rows are now
-- {"columns":["problem","detail",...],"rows":["(...)",...]}, the
-- columns named once, from the first row (none without a row).
--
-- A worker sets lock_timeout (idempotency_wait) on its own session, so a
-- request that waits for its key's owner, or for the tenant's open events
-- (025_subscriptions_at_commit.sql), gives up and answers 409 in flight
-- or 503. Through the proxy the wait happens in the proxy's session on the
-- partition, which has the partition's default (none): the request waited
-- for its statement_timeout. The keyed create and the keyed commands now
-- take the worker's lock_timeout as their last argument (the server
-- passes its proxy session's, current_setting('lock_timeout')) and set it
-- for their transaction. New overloads, each calling the one before:
-- workers of the previous build keep calling the old ones.

-- The rows of p_sql run with p_args: their columns' names and their
-- record texts.
CREATE OR REPLACE FUNCTION idemflow_command_rows(p_sql text, p_args text[])
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_name text := 'idemflow_' || md5(p_sql);
    v_columns text[];
    v_rows text[] := '{}';
    v_call text;
    r record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_prepared_statements WHERE name = v_name) THEN
        EXECUTE format('PREPARE %I AS %s', v_name, p_sql);
    END IF;
    IF coalesce(cardinality(p_args), 0) = 0 THEN
        v_call := format('EXECUTE %I', v_name);
    ELSE
        SELECT format('EXECUTE %I(%s)', v_name,
                      string_agg(quote_nullable(a), ', ' ORDER BY i))
          INTO v_call
          FROM unnest(p_args) WITH ORDINALITY AS u(a, i);
    END IF;
    FOR r IN EXECUTE v_call LOOP
        IF v_columns IS NULL THEN
            SELECT array_agg(k) INTO v_columns FROM json_object_keys(row_to_json(r)) AS k;
        END IF;
        v_rows := v_rows || r::text;
    END LOOP;
    RETURN json_build_object('columns', coalesce(v_columns, '{}'), 'rows', v_rows)::text;
END;
$$;

-- idemflow_keyed_command with the worker's lock_timeout. Its problem slug
-- is read from the rows as this file writes them, and a wait on the key's
-- owner past lock_timeout says so.
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
        -- A wait past lock_timeout here is on the key's owner (409 in
        -- flight), told apart by its message from a wait in the command
        -- (503): the same SQLSTATE, as on one database.
        BEGIN
            INSERT INTO idempotency_keys (tenant_id, key, method, path, fingerprint, status,
                                          headers, body, created_at, expires_at,
                                          request_bytes_fp, actor)
            VALUES (p_tenant, p_key, p_method, p_path, p_fp, 0, '', '', now(),
                    now() + coalesce((SELECT idempotency_ttl FROM tenants WHERE id = p_tenant),
                                     p_ttl),
                    p_bytes_fp, nullif(p_actor, ''))
                ON CONFLICT (tenant_id, key) DO NOTHING;
        EXCEPTION WHEN lock_not_available THEN
            RAISE EXCEPTION 'idemflow: the key''s owner held it past lock_timeout'
                USING ERRCODE = 'lock_not_available';
        END;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'taken'::text, NULL::text;
            RETURN;
        END IF;
        v_rows := idemflow_command_rows(p_sql, p_args);
        -- The first column of a command's first row is its problem's
        -- slug, or NULL (sql/005_runs.sql): a bare word in record text.
        v_problem := substring(v_rows::json -> 'rows' ->> 0 FROM '^\(([a-z-]+),');
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

CREATE FUNCTION idemflow_keyed_command(
    p_tenant bigint, p_key text, p_method text, p_path text, p_fp bytea, p_ttl interval,
    p_bytes_fp bytea, p_actor text, p_traceparent text, p_tracestate text,
    p_sql text, p_args text[], p_store text[], p_lock_timeout text)
RETURNS TABLE (outcome text, rows text)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout, true) WHERE p_lock_timeout IS NOT NULL;
    RETURN QUERY
    SELECT *
      FROM idemflow_keyed_command(p_tenant, p_key, p_method, p_path, p_fp, p_ttl, p_bytes_fp,
                                  p_actor, p_traceparent, p_tracestate, p_sql, p_args,
                                  p_store);
END;
$$;

-- Q_CREATE_KEYED with the worker's lock_timeout.
CREATE FUNCTION idemflow_create_keyed(
    p_token_hash bytea, p_key text, p_method text, p_path text, p_fp bytea,
    p_headers text, p_body text, p_created_at timestamptz, p_ttl interval,
    p_id uuid, p_type text, p_input jsonb, p_event_id text, p_payload_head text,
    p_bytes_fp bytea, p_payload_tail text, p_traceparent text, p_tracestate text,
    p_lock_timeout text)
RETURNS TABLE (tenant_id bigint, fingerprint bytea, status smallint, headers text, body text,
               expired boolean, request_bytes_fp bytea, ms_left bigint, token_id bigint,
               outcome text)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout, true) WHERE p_lock_timeout IS NOT NULL;
    RETURN QUERY
    SELECT *
      FROM idemflow_create_keyed(p_token_hash, p_key, p_method, p_path, p_fp, p_headers,
                                 p_body, p_created_at, p_ttl, p_id, p_type, p_input,
                                 p_event_id, p_payload_head, p_bytes_fp, p_payload_tail,
                                 p_traceparent, p_tracestate);
END;
$$;
