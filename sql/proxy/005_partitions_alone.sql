-- proxy/005_partitions_alone.sql: /metrics' outbox counts and the key
-- counts' flush ask each partition alone, as /readyz does
-- (002_partitions_status.sql): one partition down no longer fails the
-- call whole. PL/Proxy's WARNING about the lost connection stays in the
-- proxy (client_min_messages): a worker reads a WARNING of class 01000 as
-- an unconfirmed commit (app/core/db.c). The functions keep their names and signatures, so the
-- server's statements (app/server/queries.c) do not change.

-- One partition's outbox and job counts (the partition's
-- idemflow_metrics_outbox, sql/024_partition_functions.sql).
CREATE FUNCTION idemflow_metrics_outbox_on(p_partition integer)
RETURNS TABLE (pending bigint, oldest numeric, dead bigint, activatable bigint, leased bigint,
               expired bigint, incidents bigint) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON p_partition;
    SELECT * FROM idemflow_metrics_outbox();
$$ LANGUAGE plproxy;

-- One row per partition that answered; one that did not is left out
-- (its counts are unknown: /readyz names it), logged in the proxy's log.
CREATE OR REPLACE FUNCTION idemflow_metrics_outbox()
RETURNS TABLE (pending bigint, oldest numeric, dead bigint, activatable bigint, leased bigint,
               expired bigint, incidents bigint)
LANGUAGE plpgsql SET client_min_messages = error AS $$
BEGIN
    FOR p IN 0 .. idemflow_partition_count() - 1 LOOP
        BEGIN
            RETURN QUERY SELECT * FROM idemflow_metrics_outbox_on(p);
        EXCEPTION WHEN OTHERS THEN
            RAISE LOG 'idemflow: partition % did not answer: %', p, SQLERRM;
        END;
    END LOOP;
END;
$$;

-- One partition's flush (the partition's idemflow_keystats_flush, which
-- keeps the counts of its own tenants).
CREATE FUNCTION idemflow_keystats_flush_on(p_partition integer, p_tenants bigint[],
                                           p_keys text[], p_replays integer[],
                                           p_conflicts integer[], p_in_flight integer[])
RETURNS SETOF integer AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON p_partition;
    SELECT idemflow_keystats_flush(p_tenants, p_keys, p_replays, p_conflicts, p_in_flight);
$$ LANGUAGE plproxy;

-- Each partition is given only the counts of the tenants the directory
-- puts on it, and asked alone. A partition that answers has stored its
-- tenants' counts, once: a RUN ON ALL call stored them on the partitions
-- that answered and then failed whole, and the worker sent them all
-- again. The counts of a partition that does not answer are dropped
-- (they are diagnostics; its tenants' requests are 503 meanwhile) with a
-- line in the proxy's log.
CREATE OR REPLACE FUNCTION idemflow_keystats_flush(p_tenants bigint[], p_keys text[],
                                                   p_replays integer[], p_conflicts integer[],
                                                   p_in_flight integer[])
RETURNS SETOF integer
LANGUAGE plpgsql SET client_min_messages = error AS $$
DECLARE
    v_t bigint[];
    v_k text[];
    v_r integer[];
    v_c integer[];
    v_f integer[];
BEGIN
    FOR p IN 0 .. idemflow_partition_count() - 1 LOOP
        SELECT array_agg(u.t ORDER BY u.ord), array_agg(u.k ORDER BY u.ord),
               array_agg(u.r ORDER BY u.ord), array_agg(u.c ORDER BY u.ord),
               array_agg(u.f ORDER BY u.ord)
          INTO v_t, v_k, v_r, v_c, v_f
          FROM unnest(p_tenants, p_keys, p_replays, p_conflicts, p_in_flight)
               WITH ORDINALITY AS u (t, k, r, c, f, ord)
         WHERE idemflow_partition_of_tenant(u.t) = p;
        CONTINUE WHEN v_t IS NULL;
        BEGIN
            RETURN QUERY SELECT * FROM idemflow_keystats_flush_on(p, v_t, v_k, v_r, v_c, v_f);
        EXCEPTION WHEN OTHERS THEN
            RAISE LOG 'idemflow: partition % did not take its key counts: %', p, SQLERRM;
        END;
    END LOOP;
END;
$$;
