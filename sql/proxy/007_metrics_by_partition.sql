-- proxy/007_metrics_by_partition.sql: /metrics through the proxy says
-- which partition is missing from its sums, and serves the endpoint
-- gauges. Each partition is asked alone, as in 005_partitions_alone.sql,
-- and each function below answers one row per partition (the outbox) or
-- per partition and endpoint (the deliveries), with the error that kept a
-- partition from answering (NULL when it answered), so that the server's
-- statement (app/server/queries.c) sums the partitions that answered and
-- names the others (idemflow_partition_up). The older
-- idemflow_metrics_outbox() stays for the workers of the previous build.

-- The outbox and job counts, one row per partition: its counts, or NULLs
-- and the error.
CREATE FUNCTION idemflow_metrics_outbox_by_partition()
RETURNS TABLE (partition integer, pending bigint, oldest numeric, dead bigint,
               activatable bigint, leased bigint, expired bigint, incidents bigint, error text)
LANGUAGE plpgsql SET client_min_messages = error AS $$
BEGIN
    FOR p IN 0 .. idemflow_partition_count() - 1 LOOP
        partition := p;
        error := NULL;
        BEGIN
            SELECT o.pending, o.oldest, o.dead, o.activatable, o.leased, o.expired,
                   o.incidents
              INTO pending, oldest, dead, activatable, leased, expired, incidents
              FROM idemflow_metrics_outbox_on(p) o;
        EXCEPTION WHEN OTHERS THEN
            pending := NULL;
            oldest := NULL;
            dead := NULL;
            activatable := NULL;
            leased := NULL;
            expired := NULL;
            incidents := NULL;
            error := SQLERRM;
            RAISE LOG 'idemflow: partition % did not answer: %', p, SQLERRM;
        END;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- One partition's endpoint gauges (the partition's
-- idemflow_metrics_deliveries, sql/028_partition_metrics.sql).
CREATE FUNCTION idemflow_metrics_deliveries_on(p_partition integer, p_top integer)
RETURNS TABLE (k integer, disabled bigint, pending bigint, tenant_id bigint, endpoint_id uuid) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON p_partition;
    SELECT * FROM idemflow_metrics_deliveries(p_top);
$$ LANGUAGE plproxy;

-- Every partition's rows of idemflow_metrics_deliveries, each with its
-- partition; for a partition that did not answer one row with only the
-- partition and the error.
CREATE FUNCTION idemflow_metrics_deliveries_by_partition(p_top integer)
RETURNS TABLE (partition integer, k integer, disabled bigint, pending bigint, tenant_id bigint,
               endpoint_id uuid, error text)
LANGUAGE plpgsql SET client_min_messages = error AS $$
BEGIN
    FOR p IN 0 .. idemflow_partition_count() - 1 LOOP
        BEGIN
            RETURN QUERY SELECT p, d.k, d.disabled, d.pending, d.tenant_id, d.endpoint_id,
                                NULL::text
                           FROM idemflow_metrics_deliveries_on(p, p_top) d;
        EXCEPTION WHEN OTHERS THEN
            partition := p;
            k := NULL;
            disabled := NULL;
            pending := NULL;
            tenant_id := NULL;
            endpoint_id := NULL;
            error := SQLERRM;
            RAISE LOG 'idemflow: partition % did not answer: %', p, SQLERRM;
            RETURN NEXT;
        END;
    END LOOP;
END;
$$;
