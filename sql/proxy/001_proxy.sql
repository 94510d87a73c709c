-- proxy/001_proxy.sql: the proxy database of a partitioned deployment
-- (doc/distribution.md, "PL/Proxy as built"). Applied by
-- "idemflow migrate --proxy", to the proxy only; the partitions get the
-- ordinary migrations (sql/NNN_name.sql).
--
-- The workers connect here. Every call they send is a function of the
-- same name and signature as a partition's (sql/024_partition_functions.sql),
-- written in PL/Proxy: CLUSTER names the partitions (the foreign server
-- idemflow_partitions, which the operator creates with one option p0,
-- p1, ... per partition, a power of two of them), RUN ON picks the one
-- partition the call goes to, from the directory below.
--
-- The directory: which partition holds a tenant, and which tenant a
-- token's hash belongs to. A tenant moves by a change of one row here;
-- the token keeps working. Unknown tokens and tenants go to partition 0,
-- which refuses a token it does not have (401), as one database does.
-- The directory only routes: a token revoked on its partition is refused
-- there, whatever the directory says.

CREATE EXTENSION IF NOT EXISTS plproxy;

CREATE TABLE idemflow_tenant_partitions (
    tenant_id bigint PRIMARY KEY,
    partition integer NOT NULL CHECK (partition >= 0)
);

CREATE TABLE idemflow_token_tenants (
    token_hash bytea PRIMARY KEY CHECK (octet_length(token_hash) = 32),
    tenant_id bigint NOT NULL
);

-- The routing functions RUN ON calls: a partition number, 0 to N-1
-- (PL/Proxy takes it as a hash and keeps its low bits: N is a power of 2).
CREATE FUNCTION idemflow_partition_of_tenant(p_tenant bigint)
RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT partition FROM idemflow_tenant_partitions
                      WHERE tenant_id = p_tenant), 0);
$$;

CREATE FUNCTION idemflow_partition_of_token(p_token_hash bytea)
RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT d.partition
                       FROM idemflow_token_tenants t
                       JOIN idemflow_tenant_partitions d USING (tenant_id)
                      WHERE t.token_hash = p_token_hash), 0);
$$;

-- How many partitions the foreign server names (its options p0, p1, ...).
CREATE FUNCTION idemflow_partition_count()
RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT count(*)::integer
      FROM pg_foreign_server s, unnest(s.srvoptions) AS o (opt)
     WHERE s.srvname = 'idemflow_partitions' AND o.opt ~ '^p[0-9]+=';
$$;

-- A statement the proxy does not route yet: refused, never run on the
-- proxy's own (empty) database.
CREATE FUNCTION idemflow_unrouted(p_name text, VARIADIC p_args text[] DEFAULT '{}')
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'idemflow: "%" is not routed through the proxy', p_name
        USING ERRCODE = '0A000',
              HINT = 'doc/distribution.md lists the commands a partitioned deployment serves';
END;
$$;

-- One partition's tokens, by partition number.
CREATE FUNCTION idemflow_partition_tokens(p_partition integer)
RETURNS TABLE (token_hash bytea, tenant_id bigint) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON p_partition;
$$ LANGUAGE plproxy;

-- Fill the directory from the partitions: every token with its tenant,
-- every tenant with the partition that holds it. Run after a tenant or a
-- token is created on a partition. A tenant found on two partitions is
-- an error (a move is a later, explicit procedure). Returns the tokens
-- added.
CREATE FUNCTION idemflow_directory_sync()
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_n integer := idemflow_partition_count();
    v_added integer := 0;
    v_rows integer;
    r record;
BEGIN
    IF v_n = 0 THEN
        RAISE EXCEPTION 'no partitions: create the server idemflow_partitions'
            USING ERRCODE = '42704';
    END IF;
    FOR p IN 0 .. v_n - 1 LOOP
        FOR r IN SELECT DISTINCT t.tenant_id FROM idemflow_partition_tokens(p) t LOOP
            INSERT INTO idemflow_tenant_partitions (tenant_id, partition)
            VALUES (r.tenant_id, p)
                ON CONFLICT (tenant_id) DO NOTHING;
            IF (SELECT partition FROM idemflow_tenant_partitions
                 WHERE tenant_id = r.tenant_id) <> p THEN
                RAISE EXCEPTION 'tenant % is on partition % and %', r.tenant_id,
                    (SELECT partition FROM idemflow_tenant_partitions
                      WHERE tenant_id = r.tenant_id), p
                    USING ERRCODE = '23505';
            END IF;
        END LOOP;
        INSERT INTO idemflow_token_tenants (token_hash, tenant_id)
        SELECT t.token_hash, t.tenant_id FROM idemflow_partition_tokens(p) t
            ON CONFLICT (token_hash) DO NOTHING;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        v_added := v_added + v_rows;
    END LOOP;
    RETURN v_added;
END;
$$;

-- The request path (sql/024_partition_functions.sql has each body).

CREATE FUNCTION idemflow_auth(p_token_hash bytea)
RETURNS TABLE (tenant_id bigint, token_id bigint) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON idemflow_partition_of_token(p_token_hash);
$$ LANGUAGE plproxy;

CREATE FUNCTION idemflow_auth_key(p_token_hash bytea, p_key text)
RETURNS TABLE (tenant_id bigint, fingerprint bytea, status smallint, headers text, body text,
               expired boolean, request_bytes_fp bytea, ms_left bigint, token_id bigint) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON idemflow_partition_of_token(p_token_hash);
$$ LANGUAGE plproxy;

CREATE FUNCTION idemflow_create_keyed(
    p_token_hash bytea, p_key text, p_method text, p_path text, p_fp bytea,
    p_headers text, p_body text, p_created_at timestamptz, p_ttl interval,
    p_id uuid, p_type text, p_input jsonb, p_event_id text, p_payload_head text,
    p_bytes_fp bytea, p_payload_tail text, p_traceparent text, p_tracestate text)
RETURNS TABLE (tenant_id bigint, fingerprint bytea, status smallint, headers text, body text,
               expired boolean, request_bytes_fp bytea, ms_left bigint, token_id bigint,
               outcome text) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON idemflow_partition_of_token(p_token_hash);
$$ LANGUAGE plproxy;

CREATE FUNCTION idemflow_key_get(p_tenant bigint, p_key text)
RETURNS TABLE (existing text, fingerprint bytea, status smallint, headers text, body text,
               expired boolean) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON idemflow_partition_of_tenant(p_tenant);
$$ LANGUAGE plproxy;

CREATE FUNCTION idemflow_key_delete_expired(p_tenant bigint, p_key text)
RETURNS integer AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON idemflow_partition_of_tenant(p_tenant);
$$ LANGUAGE plproxy;

CREATE FUNCTION idemflow_key_refresh(p_tenant bigint, p_key text, p_ttl interval)
RETURNS integer AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON idemflow_partition_of_tenant(p_tenant);
$$ LANGUAGE plproxy;

CREATE FUNCTION idemflow_wf_get(p_tenant bigint, p_id uuid)
RETURNS TABLE (id uuid, type text, state text, input text, created_at text, business_key text,
               steps text, step integer, progress text) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON idemflow_partition_of_tenant(p_tenant);
$$ LANGUAGE plproxy;

CREATE FUNCTION idemflow_keystats_flush(p_tenants bigint[], p_keys text[], p_replays integer[],
                                        p_conflicts integer[], p_in_flight integer[])
RETURNS SETOF integer AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON ALL;
$$ LANGUAGE plproxy;

CREATE FUNCTION idemflow_schema_version()
RETURNS TABLE (version integer, in_recovery boolean, read_only text) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON ALL;
$$ LANGUAGE plproxy;

CREATE FUNCTION idemflow_metrics_outbox()
RETURNS TABLE (pending bigint, oldest numeric, dead bigint, activatable bigint, leased bigint,
               expired bigint, incidents bigint) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON ALL;
$$ LANGUAGE plproxy;
