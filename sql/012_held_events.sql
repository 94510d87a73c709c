-- 012_held_events.sql: events held back behind a dead one leave the
-- dispatcher's scan.
--
-- An event is delivered only after every earlier event of its workflow
-- (per-workflow order). Behind a dead event, every later event of the
-- workflow waits until an operator requeues the dead one, and each claim
-- walked all of them through outbox_due, probing each one's predecessors:
-- with 100,000 such events (one tenant's resumes of a workflow whose event
-- died), a claim of 100 took 2.4 s, on every claim, for every tenant.
--
-- Such an event is now parked: its next_attempt_at is 'infinity', past
-- the range every claim reads. The dispatcher parks the later events of a
-- workflow as it marks one dead (d_fail); idemflow_event parks a new event
-- of a workflow that has a dead one (a probe of the small partial index
-- below: dead events only); idemflow outbox requeue makes them due again.
-- Those already held back are parked here.

-- The dead events of a workflow (few: dead events are an operator's to
-- handle).
CREATE INDEX outbox_dead_workflow ON outbox (tenant_id, workflow_id, seq)
    WHERE dead_at IS NOT NULL;

-- As in 005_runs.sql, and a workflow with a dead event parks the new one.
CREATE OR REPLACE FUNCTION idemflow_event(p_tenant bigint, p_wf uuid, p_type text, p_data jsonb)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_seq integer;
BEGIN
    UPDATE workflows SET last_seq = last_seq + 1, updated_at = now()
     WHERE tenant_id = p_tenant AND id = p_wf
    RETURNING last_seq INTO v_seq;
    INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload, created_at,
                        next_attempt_at)
    VALUES (p_wf || '.' || v_seq, p_tenant, p_wf, v_seq, p_type,
            jsonb_build_object('id', p_wf || '.' || v_seq, 'type', p_type,
                               'workflow_id', p_wf, 'seq', v_seq, 'tenant_id', p_tenant,
                               'occurred_at', idemflow_ts(now()), 'data', p_data)::text,
            now(),
            CASE WHEN EXISTS (SELECT 1 FROM outbox
                               WHERE tenant_id = p_tenant AND workflow_id = p_wf
                                 AND dead_at IS NOT NULL)
                 THEN 'infinity'::timestamptz ELSE now() END);
END
$$;

UPDATE outbox o SET next_attempt_at = 'infinity'
 WHERE o.published_at IS NULL AND o.dead_at IS NULL
   AND EXISTS (SELECT 1 FROM outbox d
                WHERE d.tenant_id = o.tenant_id AND d.workflow_id = o.workflow_id
                  AND d.dead_at IS NOT NULL AND d.seq < o.seq);
