-- proxy/008_tenant_move.sql: a tenant being moved to another partition
-- ("idemflow tenant move", doc/distribution.md, "Moving a tenant").
--
-- While the directory marks a tenant moving, no call of that tenant goes
-- to any partition: the routing functions that RUN ON calls refuse it
-- (SQLSTATE IDFMV, which a worker answers 503 with Retry-After), so a
-- request retried during the move is answered by no partition until the
-- directory names the new one in the same row that clears the mark, and
-- by that one only afterwards. The functions keep their names and
-- signatures: every PL/Proxy function's RUN ON picks the change up.

ALTER TABLE idemflow_tenant_partitions
    ADD COLUMN moving_to integer CHECK (moving_to >= 0),
    ADD COLUMN moving_since timestamptz,
    ADD CHECK ((moving_to IS NULL) = (moving_since IS NULL));

COMMENT ON COLUMN idemflow_tenant_partitions.moving_to IS
    'the partition the tenant is being moved to; its calls are refused meanwhile (NULL: not moving)';

-- Raises: the tenant's calls wait for its move. Typed as the routing
-- functions' value so that it can stand in a CASE of theirs.
CREATE FUNCTION idemflow_tenant_moving(p_tenant bigint, p_to integer)
RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'tenant % is being moved to partition %', p_tenant, p_to
        USING ERRCODE = 'IDFMV', HINT = 'retry the same request later';
END;
$$;

CREATE OR REPLACE FUNCTION idemflow_partition_of_tenant(p_tenant bigint)
RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT CASE WHEN d.moving_to IS NULL THEN d.partition
                                 ELSE idemflow_tenant_moving(d.tenant_id, d.moving_to) END
                       FROM idemflow_tenant_partitions d
                      WHERE d.tenant_id = p_tenant), 0);
$$;

CREATE OR REPLACE FUNCTION idemflow_partition_of_token(p_token_hash bytea)
RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT CASE WHEN d.moving_to IS NULL THEN d.partition
                                 ELSE idemflow_tenant_moving(d.tenant_id, d.moving_to) END
                       FROM idemflow_token_tenants t
                       JOIN idemflow_tenant_partitions d USING (tenant_id)
                      WHERE t.token_hash = p_token_hash), 0);
$$;

-- As in 005_partitions_alone.sql, and a moving tenant's counts are
-- dropped (they are diagnostics) instead of failing the whole flush.
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
         WHERE coalesce((SELECT CASE WHEN d.moving_to IS NULL THEN d.partition END
                           FROM idemflow_tenant_partitions d
                          WHERE d.tenant_id = u.t),
                        CASE WHEN EXISTS (SELECT 1 FROM idemflow_tenant_partitions d
                                           WHERE d.tenant_id = u.t) THEN -1 ELSE 0 END) = p;
        CONTINUE WHEN v_t IS NULL;
        BEGIN
            RETURN QUERY SELECT * FROM idemflow_keystats_flush_on(p, v_t, v_k, v_r, v_c, v_f);
        EXCEPTION WHEN OTHERS THEN
            RAISE LOG 'idemflow: partition % did not take its key counts: %', p, SQLERRM;
        END;
    END LOOP;
END;
$$;
