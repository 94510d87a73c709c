-- 023_type_matches.sql: idemflow_type_matches in PL/pgSQL: the same
-- answers, several times cheaper, on the create's path.
--
-- 020 wrote it in SQL "so that the planner inlines it", but the planner
-- never inlines an SQL function whose body holds a sub-select (the EXISTS
-- over unnest(p_filter)): every call ran through the SQL function
-- executor, once per endpoint of the tenant, in the trigger
-- outbox_deliveries of every event. With three endpoints that was half
-- of the trigger's cost (doc/performance.md, "The fan-out's cost"). A PL/pgSQL loop over the filter answers the
-- same, NULLs included (a NULL filter passes every type; a NULL element
-- or type makes "no match" unknown, as "= ANY" does), and its plan is
-- cached per session. The signature and its volatility stay, so the
-- trigger and every other caller are unchanged.

CREATE OR REPLACE FUNCTION idemflow_type_matches(p_filter text[], p_type text)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    f text;
    unknown boolean := false;
BEGIN
    -- NULL: every type.
    IF p_filter IS NULL THEN
        RETURN true;
    END IF;
    -- Exact names, and "prefix.*" globs: the prefix ends with the dot.
    FOREACH f IN ARRAY p_filter LOOP
        IF f = p_type OR (right(f, 2) = '.*' AND starts_with(p_type, left(f, -1))) THEN
            RETURN true;
        END IF;
        unknown := unknown OR f IS NULL OR p_type IS NULL;
    END LOOP;
    RETURN CASE WHEN unknown THEN NULL ELSE false END;
END
$$;
