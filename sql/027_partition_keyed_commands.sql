-- 027_partition_keyed_commands.sql: the keyed commands of two round trips
-- through a PL/Proxy proxy (doc/distribution.md, "Keyed commands").
--
-- On one database such a command (a transition, a message, a job's
-- activation, completion, failure or heartbeat, a resume, an endpoint
-- command, a recover or resend, a create with steps, a business key or a
-- priority) runs as BEGIN; claim the key; the command; then, once the
-- server has rendered the answer from the command's rows, store it;
-- COMMIT. Through the proxy there is no transaction across two calls, so
-- the claim, the command and the command's rows commit together in one
-- call, idemflow_keyed_command, on the tenant's partition, and the
-- rendered answer follows in a second, idemflow_key_store_answer. Between
-- the two the key's row has status 1: its command is done and its rows
-- are kept in body, a JSON array of strings, each row in PostgreSQL's
-- record text ("(,,1,\"a b\")"). A request that finds such a row renders the
-- answer from those rows and stores it; whichever store comes first is
-- the key's answer, and every other request is given that one. A server
-- sends an answer only after it was stored, so every answer a client
-- sees for a key is the stored one, byte for byte.
--
-- The command is the server's statement (app/server/queries.c), passed
-- with its parameters as text, prepared once per partition session under
-- a name made from its text, with its parameters' types inferred as the
-- server's own prepare infers them. It runs with the caller's rights,
-- as the same statement sent to one database does.

-- Status 1: a command's rows, its answer not rendered yet (above).
COMMENT ON COLUMN idempotency_keys.status IS
    'the stored answer''s HTTP status; 0 while the claim is uncommitted; 1 through a proxy: the command is done and body holds its rows, the answer not stored yet (027_partition_keyed_commands.sql)';

-- The rows of p_sql run with p_args: a JSON array of their record texts.
CREATE FUNCTION idemflow_command_rows(p_sql text, p_args text[])
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_name text := 'idemflow_' || md5(p_sql);
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
        v_rows := v_rows || r::text;
    END LOOP;
    RETURN to_json(v_rows)::text;
END;
$$;

-- One command, keyed or not (p_key NULL), on the tenant's partition.
-- outcome: 'taken' (the key has a row: read it), 'created' (claimed; the
-- command and its rows committed, status 1), 'unstored' (the command's
-- refusal is not one a key keeps, p_store lists those it keeps: the
-- claim and the command rolled back), 'unkeyed'. rows: the command's,
-- as idemflow_command_rows gives them, except for 'taken'.
CREATE FUNCTION idemflow_keyed_command(
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
    PERFORM set_config('synchronous_commit', 'on', true)
     WHERE current_setting('synchronous_commit') NOT IN ('on', 'remote_apply');
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

-- The rendered answer of a key whose command is done (status 1). 1 when
-- this call stored it, 0 when the key's answer was stored already (or
-- the key is gone): read it then.
CREATE FUNCTION idemflow_key_store_answer(p_tenant bigint, p_key text, p_status smallint,
                                          p_headers text, p_body text)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    UPDATE idempotency_keys
       SET status = p_status, headers = p_headers, body = p_body
     WHERE tenant_id = p_tenant AND key = p_key AND status = 1;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;
