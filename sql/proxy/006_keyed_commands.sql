-- proxy/006_keyed_commands.sql: the keyed commands of two round trips
-- through the proxy, each call on the tenant's partition
-- (sql/027_partition_keyed_commands.sql): the claim, the command and its
-- rows in one call, the rendered answer in a second.

CREATE FUNCTION idemflow_keyed_command(
    p_tenant bigint, p_key text, p_method text, p_path text, p_fp bytea, p_ttl interval,
    p_bytes_fp bytea, p_actor text, p_traceparent text, p_tracestate text,
    p_sql text, p_args text[], p_store text[])
RETURNS TABLE (outcome text, rows text) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON idemflow_partition_of_tenant(p_tenant);
$$ LANGUAGE plproxy;

CREATE FUNCTION idemflow_key_store_answer(p_tenant bigint, p_key text, p_status smallint,
                                          p_headers text, p_body text)
RETURNS integer AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON idemflow_partition_of_tenant(p_tenant);
$$ LANGUAGE plproxy;
