-- proxy/003_events.sql: GET /v1/workflows/{id}/events through the proxy,
-- on the tenant's partition (sql/024_partition_functions.sql).

CREATE FUNCTION idemflow_wf_events(p_tenant bigint, p_id uuid, p_after integer,
                                   p_limit integer, p_budget bigint)
RETURNS TABLE (seq integer, payload text, within boolean, actor text) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON idemflow_partition_of_tenant(p_tenant);
$$ LANGUAGE plproxy;
