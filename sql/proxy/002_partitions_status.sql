-- proxy/002_partitions_status.sql: /readyz says which partitions are
-- reachable. Each partition is asked alone, so one that is down does not
-- hide the others' state (a RUN ON ALL call fails whole).

CREATE FUNCTION idemflow_schema_version_on(p_partition integer)
RETURNS TABLE (version integer, in_recovery boolean, read_only text) AS $$
    CLUSTER 'idemflow_partitions';
    RUN ON p_partition;
$$ LANGUAGE plproxy;

-- One row per partition: its schema version, whether it is in recovery
-- or read-only, and the error that kept it from answering (NULL when it
-- answered).
CREATE FUNCTION idemflow_partitions_status()
RETURNS TABLE (partition integer, version integer, in_recovery boolean, read_only text,
               error text)
LANGUAGE plpgsql AS $$
BEGIN
    FOR p IN 0 .. idemflow_partition_count() - 1 LOOP
        partition := p;
        error := NULL;
        BEGIN
            SELECT s.version, s.in_recovery, s.read_only
              INTO version, in_recovery, read_only
              FROM idemflow_schema_version_on(p) s;
        EXCEPTION WHEN OTHERS THEN
            version := NULL;
            in_recovery := NULL;
            read_only := NULL;
            error := SQLERRM;
        END;
        RETURN NEXT;
    END LOOP;
END;
$$;
