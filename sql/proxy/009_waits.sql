-- proxy/009_waits.sql: the keyed create and the keyed commands with the
-- worker's lock_timeout as their last argument, set on the partition for
-- the call (sql/032_partition_waits_and_names.sql). The overloads without
-- it stay for workers of the previous build.

CREATE FUNCTION idemflow_keyed_command(
    p_tenant bigint, p_key text, p_method text, p_path text, p_fp bytea, p_ttl interval,
    p_bytes_fp bytea, p_actor text, p_traceparent text, p_tracestate text,
    p_sql text, p_args text[], p_store text[], p_lock_timeout text)
RETURNS TABLE (outcome text, rows text) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON idemflow_partition_of_tenant(p_tenant);
$$ LANGUAGE plproxy;

CREATE FUNCTION idemflow_create_keyed(
    p_token_hash bytea, p_key text, p_method text, p_path text, p_fp bytea,
    p_headers text, p_body text, p_created_at timestamptz, p_ttl interval,
    p_id uuid, p_type text, p_input jsonb, p_event_id text, p_payload_head text,
    p_bytes_fp bytea, p_payload_tail text, p_traceparent text, p_tracestate text,
    p_lock_timeout text)
RETURNS TABLE (tenant_id bigint, fingerprint bytea, status smallint, headers text, body text,
               expired boolean, request_bytes_fp bytea, ms_left bigint, token_id bigint,
               outcome text) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON idemflow_partition_of_token(p_token_hash);
$$ LANGUAGE plproxy;
