-- 028_partition_metrics.sql: /metrics' endpoint gauges as a partition
-- function (doc/distribution.md, "PL/Proxy as built"), so that a
-- partitioned deployment serves them: the proxy asks each partition alone
-- (sql/proxy/007_metrics_by_partition.sql), sums the totals and takes the
-- endpoints with the most pending deliveries across the partitions' own
-- tops. A single database keeps running the server's statement.

-- Q_METRICS_DELIVERIES, per partition: the server's statement with its $1
-- as p_top. The first row (k = 0) has the partition's disabled endpoints
-- and pending deliveries, the others (k = 1) the p_top endpoints with the
-- most pending deliveries. Each partition's top p_top holds every
-- endpoint of the top p_top across the partitions, since an endpoint
-- lives on its tenant's partition.
CREATE FUNCTION idemflow_metrics_deliveries(p_top integer)
RETURNS TABLE (k integer, disabled bigint, pending bigint, tenant_id bigint, endpoint_id uuid)
LANGUAGE sql STABLE AS $$
    SELECT 0, (SELECT count(*) FROM endpoints WHERE disabled), count(*), NULL::bigint,
           NULL::uuid
      FROM deliveries
     WHERE state = 'pending'
     UNION ALL
    SELECT 1, NULL, t.n, t.tenant_id, t.endpoint_id
      FROM (SELECT d.tenant_id, d.endpoint_id, count(*) AS n
              FROM deliveries d
             WHERE d.state = 'pending'
             GROUP BY d.tenant_id, d.endpoint_id
             ORDER BY n DESC, d.tenant_id, d.endpoint_id
             LIMIT p_top) t;
$$;
