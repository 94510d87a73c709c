-- 011_timer_isolation.sql: one timer that fails never stops the others,
-- and timers fire fairly across tenants.
--
-- idemflow_fire_timers took up to p_batch due timers of every tenant in one
-- statement. When one of them failed (a step whose "until" PostgreSQL
-- refuses, stored before the server checked offsets), the statement rolled
-- back, and so did the next round and every round after: one tenant's
-- value stopped every tenant's sleeps and timeouts. A batch now runs as
-- one subtransaction; when that fails for a reason that is not transient,
-- it runs again a timer at a time, each in a subtransaction of its own,
-- and a timer that fails alone is recorded on its row (timers.error) and
-- parks its workflow in 'incident' (event workflow.incident) at the
-- timer's step. The rest of the batch goes on. The quick path costs one
-- subtransaction a batch, not one a timer: a transaction with more than 64
-- subtransactions that wrote makes every snapshot of the cluster slower.
-- A resume of such a workflow sets its timer due again, for the next round
-- (idemflow_wf_resume, replaced whole).
--
-- Timers were taken strictly by due time, so an "until" far in the past
-- went ahead of everything, and one tenant's flood of them starved every
-- other tenant's sleeps and timeouts. The tenants with due timers now
-- share each batch equally (idemflow_due_timers), and within a tenant the
-- earliest go first.
--
-- Lease reaping (idemflow_reap), prune and the dispatcher's recording set
-- values on many tenants' rows too, but no row of theirs can fail on its
-- own: reaping sets constants, a prune deletes rows no foreign key refers
-- to, and the dispatcher's values are bounded numbers and text cut to valid
-- UTF-8 before it is sent. doc/reliability.md says so.

ALTER TABLE timers ADD COLUMN error text;

-- Each tenant's due timers, earliest first, for the fair share.
CREATE INDEX timers_tenant_due ON timers (tenant_id, due_at) WHERE fired_at IS NULL;

-- The errors worth a retry rather than an incident: serialization
-- failures and deadlocks, lock timeouts, resources, a cancel or shutdown,
-- a lost connection, internal errors. Anything else a timer's own data
-- caused, and another try would fail the same way.
CREATE FUNCTION idemflow_transient(p_sqlstate text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT left(p_sqlstate, 2) IN ('40', '53', '57', '58', '08', 'XX') OR p_sqlstate = '55P03'
$$;

-- About p_batch due timers with their workflows, locked (SKIP LOCKED: a
-- timer another reaper holds, or whose workflow is busy with a command, is
-- left for the next round, and the next due timer is taken instead, so
-- reapers running at once share the work). The tenants with due timers
-- share the batch equally: each takes at most ceil(p_batch / tenants) of
-- its earliest timers, so no tenant's flood holds back another's. Cost:
-- one probe of timers_tenant_due per tenant, and at most the batch's rows
-- (plus one per tenant, from the rounding).
CREATE FUNCTION idemflow_due_timers(p_batch integer)
RETURNS TABLE (tenant_id bigint, workflow_id uuid, step integer, kind text, due_at timestamptz,
               state text, wf_step integer, steps jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_share integer;
BEGIN
    SELECT greatest(1, ceil(p_batch::numeric / greatest(count(*), 1)))::integer INTO v_share
      FROM tenants tn
     WHERE EXISTS (SELECT 1 FROM timers x
                    WHERE x.tenant_id = tn.id AND x.fired_at IS NULL AND x.due_at <= now());
    RETURN QUERY
    SELECT t.tenant_id, t.workflow_id, t.step, t.kind, t.due_at, w.state, w.step, w.steps
      FROM tenants tn
     CROSS JOIN LATERAL (
           SELECT x.tenant_id, x.workflow_id, x.step, x.kind, x.due_at
             FROM timers x
            WHERE x.tenant_id = tn.id AND x.fired_at IS NULL AND x.due_at <= now()
            ORDER BY x.due_at
            LIMIT v_share
              FOR UPDATE SKIP LOCKED) t
      JOIN workflows w ON w.tenant_id = t.tenant_id AND w.id = t.workflow_id
       FOR UPDATE OF w SKIP LOCKED;
END
$$;

-- Fire one locked timer (a row of idemflow_due_timers): 'fired' (a sleep:
-- timer.fired, and the workflow goes on to its next step), 'timed_out' (a
-- wait's timeout: step.timed_out, its job fails, and the workflow goes on
-- to its on_timeout step or fails) or 'dropped' (its step is over: the
-- workflow was cancelled, the message came; deleted without an event).
CREATE FUNCTION idemflow_fire_timer(p_tenant bigint, p_wf uuid, p_step integer, p_kind text,
                                    p_due timestamptz, p_state text, p_wf_step integer,
                                    p_steps jsonb)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_def jsonb;
    v_job_state text;
    v_target integer;
BEGIN
    IF p_kind = 'timeout' THEN
        SELECT state INTO v_job_state FROM jobs
         WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step = p_step;
    END IF;
    IF p_state NOT IN ('pending', 'running') OR p_wf_step <> p_step
       OR (p_kind = 'timeout' AND v_job_state IS DISTINCT FROM 'waiting') THEN
        DELETE FROM timers WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step = p_step;
        RETURN 'dropped';
    END IF;
    UPDATE timers SET fired_at = now()
     WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step = p_step;
    IF p_state = 'pending' THEN
        UPDATE workflows SET state = 'running' WHERE tenant_id = p_tenant AND id = p_wf;
        PERFORM idemflow_event(p_tenant, p_wf, 'workflow.started',
                               jsonb_build_object('state', 'running'));
    END IF;
    v_def := p_steps -> (p_step - 1);
    IF p_kind = 'sleep' THEN
        PERFORM idemflow_event(p_tenant, p_wf, 'timer.fired',
                               jsonb_build_object('step', p_step, 'name', v_def ->> 'name',
                                                  'due_at', idemflow_ts(p_due)));
        PERFORM idemflow_enter_step(p_tenant, p_wf, p_step + 1);
        RETURN 'fired';
    END IF;
    UPDATE jobs SET state = 'failed', error = 'timed out', updated_at = now()
     WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step = p_step;
    PERFORM idemflow_event(p_tenant, p_wf, 'step.timed_out',
                           jsonb_build_object('step', p_step, 'name', v_def ->> 'name',
                                              'wait_for', v_def ->> 'wait_for',
                                              'timeout', v_def ->> 'timeout',
                                              'on_timeout', v_def -> 'on_timeout'));
    IF v_def ? 'on_timeout' THEN
        SELECT s.i INTO v_target
          FROM jsonb_array_elements(p_steps) WITH ORDINALITY AS s(d, i)
         WHERE s.d ->> 'name' = v_def ->> 'on_timeout';
        PERFORM idemflow_enter_step(p_tenant, p_wf, v_target);
    ELSE
        UPDATE workflows SET state = 'failed', ended_at = now(), updated_at = now()
         WHERE tenant_id = p_tenant AND id = p_wf;
        PERFORM idemflow_event(p_tenant, p_wf, 'workflow.failed',
                               jsonb_build_object('state', 'failed', 'step', p_step,
                                                  'error', 'timed out'));
    END IF;
    RETURN 'timed_out';
END
$$;

-- A timer that failed on its own: recorded on its row (no longer due),
-- and its workflow parked in 'incident' at the timer's step. A pending
-- workflow started as its first timer fired, as it does when one fires
-- (workflow.started), so its history reads as a job's incident does.
CREATE FUNCTION idemflow_timer_incident(p_tenant bigint, p_wf uuid, p_step integer,
                                        p_error text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE timers SET fired_at = now(), error = p_error
     WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step = p_step;
    IF (SELECT state FROM workflows WHERE tenant_id = p_tenant AND id = p_wf) = 'pending' THEN
        PERFORM idemflow_event(p_tenant, p_wf, 'workflow.started',
                               jsonb_build_object('state', 'running'));
    END IF;
    UPDATE workflows SET state = 'incident', updated_at = now()
     WHERE tenant_id = p_tenant AND id = p_wf;
    PERFORM idemflow_event(p_tenant, p_wf, 'workflow.incident',
                           jsonb_build_object('state', 'incident', 'step', p_step,
                                              'name', (SELECT steps -> (p_step - 1) ->> 'name'
                                                         FROM workflows
                                                        WHERE tenant_id = p_tenant
                                                          AND id = p_wf),
                                              'error', p_error));
END
$$;

-- idemflow reap: fire up to p_batch due timers, each tenant in turn. taken
-- counts the timers the batch took (0: none was due and free), incidents
-- those that failed on their own and parked their workflows. The old
-- function's three columns come first, as before.
DROP FUNCTION idemflow_fire_timers(integer);
CREATE FUNCTION idemflow_fire_timers(p_batch integer, OUT taken integer, OUT fired integer,
                                     OUT timed_out integer, OUT incidents integer)
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    v_outcome text;
    v_state text;
    v_msg text;
BEGIN
    taken := 0;
    fired := 0;
    timed_out := 0;
    incidents := 0;
    -- The quick path: the whole batch in one subtransaction.
    BEGIN
        FOR c IN SELECT * FROM idemflow_due_timers(p_batch) LOOP
            v_outcome := idemflow_fire_timer(c.tenant_id, c.workflow_id, c.step, c.kind,
                                             c.due_at, c.state, c.wf_step, c.steps);
            taken := taken + 1;
            fired := fired + (v_outcome = 'fired')::integer;
            timed_out := timed_out + (v_outcome = 'timed_out')::integer;
        END LOOP;
        RETURN;
    EXCEPTION WHEN OTHERS THEN
        IF idemflow_transient(SQLSTATE) THEN
            RAISE;
        END IF;
    END;
    -- A timer failed: everything above rolled back (its row locks too).
    -- Again, a timer at a time.
    taken := 0;
    fired := 0;
    timed_out := 0;
    FOR c IN SELECT * FROM idemflow_due_timers(p_batch) LOOP
        taken := taken + 1;
        BEGIN
            v_outcome := idemflow_fire_timer(c.tenant_id, c.workflow_id, c.step, c.kind,
                                             c.due_at, c.state, c.wf_step, c.steps);
        EXCEPTION WHEN OTHERS THEN
            v_state := SQLSTATE;
            GET STACKED DIAGNOSTICS v_msg = MESSAGE_TEXT;
            IF idemflow_transient(v_state) THEN
                RAISE;
            END IF;
            PERFORM idemflow_timer_incident(c.tenant_id, c.workflow_id, c.step,
                                            format('the %s timer could not fire: %s (SQLSTATE %s)',
                                                   c.kind, v_msg, v_state));
            v_outcome := 'incident';
        END;
        fired := fired + (v_outcome = 'fired')::integer;
        timed_out := timed_out + (v_outcome = 'timed_out')::integer;
        incidents := incidents + (v_outcome = 'incident')::integer;
    END LOOP;
END
$$;

-- As in 009_incidents.sql, and a workflow parked by a timer that could
-- not fire (idemflow_timer_incident) resumes too: its timer is due again
-- at once, for the next round of idemflow reap, which parks it again if
-- it still fails.
CREATE OR REPLACE FUNCTION idemflow_wf_resume(p_tenant bigint, p_wf uuid, p_retries integer)
RETURNS SETOF idemflow_wf_row LANGUAGE plpgsql AS $$
DECLARE
    w workflows;
    j jobs;
    v_def jsonb;
    v_retries integer;
    v_timer boolean;
BEGIN
    SELECT * INTO w FROM workflows WHERE tenant_id = p_tenant AND id = p_wf FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NEXT idemflow_wf_result('not-found', 'no such workflow', NULL, NULL);
        RETURN;
    END IF;
    IF w.state NOT IN ('incident', 'failed') THEN
        RETURN NEXT idemflow_wf_result('state-conflict',
            format('the workflow is %s: only a workflow in incident, or a failed one whose '
                   'failed step is resumable, can be resumed; nothing was changed', w.state),
            NULL, w);
        RETURN;
    END IF;
    v_def := w.steps -> (w.step - 1);
    v_timer := w.state = 'incident' AND EXISTS (
        SELECT 1 FROM timers
         WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step = w.step
           AND error IS NOT NULL);
    SELECT * INTO j FROM jobs
     WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step = w.step;
    IF NOT v_timer AND (NOT FOUND OR j.job_type IS NULL OR j.state <> 'failed'
       OR (w.state = 'failed' AND (v_def -> 'resumable') IS DISTINCT FROM 'true'::jsonb)) THEN
        RETURN NEXT idemflow_wf_result('invalid-transition',
            format('the workflow failed at step %s ("%s"), whose definition does not say '
                   '"resumable": true; nothing was changed', w.step, v_def ->> 'name'),
            NULL, w);
        RETURN;
    END IF;
    v_retries := coalesce(p_retries, (v_def ->> 'retries')::integer, 0);
    BEGIN
        UPDATE workflows SET state = 'running', ended_at = NULL, updated_at = now()
         WHERE tenant_id = p_tenant AND id = p_wf;
    EXCEPTION WHEN unique_violation THEN
        RETURN NEXT idemflow_wf_result('state-conflict',
            format('another %s workflow with business key "%s" is active now; nothing was changed',
                   w.type, w.business_key),
            NULL, w);
        RETURN;
    END;
    IF v_timer THEN
        UPDATE timers SET fired_at = NULL, error = NULL, due_at = least(due_at, now())
         WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step = w.step;
        PERFORM idemflow_event(p_tenant, p_wf, 'workflow.resumed',
                               jsonb_build_object('state', 'running', 'from', w.state,
                                                  'step', w.step, 'timer', true));
    ELSE
        UPDATE jobs SET state = 'activatable', retries = v_retries, worker = NULL,
                        due_at = now(), updated_at = now()
         WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step = w.step;
        PERFORM idemflow_event(p_tenant, p_wf, 'workflow.resumed',
                               jsonb_build_object('state', 'running', 'from', w.state,
                                                  'step', w.step, 'retries', v_retries));
    END IF;
    SELECT * INTO w FROM workflows WHERE tenant_id = p_tenant AND id = p_wf;
    RETURN NEXT idemflow_wf_result(NULL, NULL, 'resumed', w);
END
$$;
