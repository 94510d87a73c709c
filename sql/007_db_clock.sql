-- 007_db_clock.sql: a workflow's first event is due by the database's clock.
--
-- Every time that decides a key's lifetime, a lease or a due time comes
-- from the database's now(), never from the clock of the worker that sent
-- the statement: a worker whose clock runs ahead would otherwise hold an
-- event back by its error, and one that runs behind would make keys expire
-- early. p_at (the worker's time) stays the workflow's created_at, which
-- the answer shows; the event's next_attempt_at is now(). The keyed and
-- unkeyed single-statement creates (app/queries.c) do the same.

CREATE OR REPLACE FUNCTION idemflow_wf_create(p_tenant bigint, p_id uuid, p_type text, p_input jsonb,
                                   p_at timestamptz, p_steps jsonb, p_business_key text,
                                   p_payload text)
RETURNS SETOF idemflow_wf_row LANGUAGE plpgsql AS $$
DECLARE
    w workflows;
BEGIN
    LOOP
        INSERT INTO workflows (tenant_id, id, type, state, input, created_at, updated_at,
                               business_key, steps)
        VALUES (p_tenant, p_id, p_type, 'pending', p_input, p_at, p_at, p_business_key,
                p_steps)
        ON CONFLICT (tenant_id, type, business_key)
           WHERE business_key IS NOT NULL AND state IN ('pending', 'running')
        DO NOTHING
        RETURNING * INTO w;
        EXIT WHEN FOUND;
        -- A new statement sees the holder even when it committed while we
        -- waited; if it has ended since, try again.
        SELECT * INTO w FROM workflows
         WHERE tenant_id = p_tenant AND type = p_type AND business_key = p_business_key
           AND state IN ('pending', 'running');
        IF FOUND THEN
            RETURN NEXT idemflow_wf_result(NULL, NULL, 'existing', w);
            RETURN;
        END IF;
    END LOOP;
    INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload, created_at,
                        next_attempt_at)
    VALUES (p_id || '.1', p_tenant, p_id, 1, 'workflow.created', p_payload, p_at, now());
    IF jsonb_array_length(p_steps) > 0 THEN
        PERFORM idemflow_enter_step(p_tenant, p_id, 1);
    END IF;
    SELECT * INTO w FROM workflows WHERE tenant_id = p_tenant AND id = p_id;
    RETURN NEXT idemflow_wf_result(NULL, NULL, 'created', w);
END
$$;
