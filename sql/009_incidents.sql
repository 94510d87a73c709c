-- 009_incidents.sql: job heartbeats, and incidents that can be resumed.
--
-- Heartbeats: a worker extends the lease of the job it holds, with the
-- compare-and-set of complete and fail, and may report its progress (small
-- canonical JSON, kept on the job and shown with the workflow). A heartbeat
-- changes no state, so it writes no event: one per beat would flood the
-- outbox and every consumer with nothing to act on.
--
-- Incidents: a job step with "on_failure": "incident" that fails without
-- retries left parks its workflow in the new state 'incident' (event
-- workflow.incident) instead of failing it. An operator fixes the cause and
-- resumes it (idemflow_wf_resume, event workflow.resumed): the failed step's
-- job is activatable again with fresh retries. A failed workflow can be
-- resumed the same way when its failed step says "resumable": true. An
-- incident is not an end: the workflow keeps its business key, and can be
-- cancelled.
--
-- Replaced whole (sql/README.md, rule 3): idemflow_wf_create (an incident
-- holds its business key), idemflow_wf_transition (cancel from incident),
-- idemflow_job_fail (the incident).

ALTER TABLE workflows DROP CONSTRAINT workflows_state_check;
ALTER TABLE workflows ADD CONSTRAINT workflows_state_check
    CHECK (state IN ('pending', 'running', 'incident', 'completed', 'failed', 'cancelled'));

-- A workflow in incident still holds its business key: a create with the
-- same key answers it as 'existing' rather than starting a second one.
DROP INDEX workflows_business_key;
CREATE UNIQUE INDEX workflows_business_key ON workflows (tenant_id, type, business_key)
    WHERE business_key IS NOT NULL AND state IN ('pending', 'running', 'incident');

-- The incident gauge of GET /metrics counts these rows on every scrape;
-- GET /v1/workflows?state=incident walks workflows_state.
CREATE INDEX workflows_incident ON workflows (tenant_id, id) WHERE state = 'incident';

ALTER TABLE jobs
    ADD COLUMN progress text CHECK (octet_length(progress) <= 4096),  -- canonical JSON
    ADD COLUMN heartbeat_at timestamptz;

-- As in 007_db_clock.sql, with 'incident' among the states that hold a
-- business key (the ON CONFLICT clause names the index's predicate).
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
           WHERE business_key IS NOT NULL AND state IN ('pending', 'running', 'incident')
        DO NOTHING
        RETURNING * INTO w;
        EXIT WHEN FOUND;
        -- A new statement sees the holder even when it committed while we
        -- waited; if it has ended since, try again.
        SELECT * INTO w FROM workflows
         WHERE tenant_id = p_tenant AND type = p_type AND business_key = p_business_key
           AND state IN ('pending', 'running', 'incident');
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

-- As in 005_runs.sql, and a workflow in incident can be cancelled too (its
-- failed job stays failed).
CREATE OR REPLACE FUNCTION idemflow_wf_transition(p_tenant bigint, p_wf uuid, p_to text, p_from text)
RETURNS SETOF idemflow_wf_row LANGUAGE plpgsql AS $$
DECLARE
    w workflows;
BEGIN
    SELECT * INTO w FROM workflows WHERE tenant_id = p_tenant AND id = p_wf FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NEXT idemflow_wf_result('not-found', 'no such workflow', NULL, NULL);
        RETURN;
    END IF;
    IF w.state = p_to THEN
        RETURN NEXT idemflow_wf_result(NULL, NULL, 'unchanged', w);
        RETURN;
    END IF;
    IF p_from IS NOT NULL AND p_from <> w.state THEN
        RETURN NEXT idemflow_wf_result('state-conflict',
            format('the workflow is %s, not %s: nothing was changed', w.state, p_from),
            NULL, w);
        RETURN;
    END IF;
    IF p_to <> 'cancelled' OR w.state NOT IN ('pending', 'running', 'incident') THEN
        RETURN NEXT idemflow_wf_result('invalid-transition',
            CASE WHEN p_to <> 'cancelled'
                 THEN format('a workflow becomes %s by running; only "cancelled" can be asked for', p_to)
                 ELSE format('a %s workflow has ended and cannot be cancelled', w.state) END,
            NULL, w);
        RETURN;
    END IF;
    UPDATE workflows SET state = 'cancelled', ended_at = now(), updated_at = now()
     WHERE tenant_id = p_tenant AND id = p_wf;
    UPDATE jobs SET state = 'cancelled', updated_at = now()
     WHERE tenant_id = p_tenant AND workflow_id = p_wf
       AND state IN ('activatable', 'active', 'waiting');
    PERFORM idemflow_event(p_tenant, p_wf, 'workflow.cancelled',
                           jsonb_build_object('state', 'cancelled', 'from', w.state));
    SELECT * INTO w FROM workflows WHERE tenant_id = p_tenant AND id = p_wf;
    RETURN NEXT idemflow_wf_result(NULL, NULL, 'changed', w);
END
$$;

-- As in 005_runs.sql; without retries left, a step whose definition says
-- "on_failure": "incident" parks the workflow in incident (not ended: no
-- ended_at) instead of failing it.
CREATE OR REPLACE FUNCTION idemflow_job_fail(p_tenant bigint, p_wf uuid, p_step integer,
                                  p_worker text, p_error text, p_retry_after interval)
RETURNS SETOF idemflow_job_row LANGUAGE plpgsql AS $$
DECLARE
    l record;
    j jobs;
    v_incident boolean;
BEGIN
    SELECT * INTO l FROM idemflow_job_lock(p_tenant, p_wf, p_step, p_worker);
    IF l.problem IS NOT NULL THEN
        RETURN NEXT idemflow_job_problem(l.problem, l.detail);
        RETURN;
    END IF;
    j := l.j;
    IF j.retries > 0 THEN
        UPDATE jobs SET state = 'activatable', retries = retries - 1, failures = failures + 1,
                        error = p_error, worker = NULL, due_at = now() + p_retry_after,
                        updated_at = now()
         WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step = p_step
        RETURNING * INTO j;
        PERFORM idemflow_event(p_tenant, p_wf, 'job.failed',
                               jsonb_build_object('step', j.step, 'name', j.name,
                                                  'worker', p_worker, 'error', p_error,
                                                  'retries_left', j.retries, 'retrying', true));
        RETURN NEXT idemflow_job_result(j, NULL, NULL);
        RETURN;
    END IF;
    UPDATE jobs SET state = 'failed', failures = failures + 1, error = p_error,
                    due_at = NULL, updated_at = now()
     WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step = p_step
    RETURNING * INTO j;
    PERFORM idemflow_event(p_tenant, p_wf, 'job.failed',
                           jsonb_build_object('step', j.step, 'name', j.name,
                                              'worker', p_worker, 'error', p_error,
                                              'retries_left', 0, 'retrying', false));
    SELECT coalesce(steps -> (p_step - 1) ->> 'on_failure', 'fail') = 'incident'
      INTO v_incident FROM workflows WHERE tenant_id = p_tenant AND id = p_wf;
    IF v_incident THEN
        UPDATE workflows SET state = 'incident', updated_at = now()
         WHERE tenant_id = p_tenant AND id = p_wf;
        PERFORM idemflow_event(p_tenant, p_wf, 'workflow.incident',
                               jsonb_build_object('state', 'incident', 'step', j.step,
                                                  'name', j.name, 'error', p_error));
    ELSE
        UPDATE workflows SET state = 'failed', ended_at = now(), updated_at = now()
         WHERE tenant_id = p_tenant AND id = p_wf;
        PERFORM idemflow_event(p_tenant, p_wf, 'workflow.failed',
                               jsonb_build_object('state', 'failed', 'step', j.step,
                                                  'error', p_error));
    END IF;
    RETURN NEXT idemflow_job_result(j, NULL, NULL);
END
$$;

-- POST /v1/jobs/{key}/heartbeat: the compare-and-set of complete and fail
-- (idemflow_job_lock); the lease then runs p_lease from now, and p_progress
-- (canonical JSON, or NULL to keep the last one) is kept on the job. The
-- job row's columns, then the progress.
CREATE FUNCTION idemflow_job_heartbeat(p_tenant bigint, p_wf uuid, p_step integer,
                                       p_worker text, p_lease interval, p_progress text)
RETURNS TABLE (problem text, detail text, workflow_id uuid, step integer, name text,
               job_type text, state text, worker text, deadline text, activations integer,
               retries integer, output text, error text, input text, workflow_state text,
               progress text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    l record;
    j jobs;
BEGIN
    SELECT * INTO l FROM idemflow_job_lock(p_tenant, p_wf, p_step, p_worker);
    IF l.problem IS NOT NULL THEN
        -- A cancelled workflow cancelled its job: say so, so the worker
        -- stops; the problem type is complete's and fail's.
        IF l.problem = 'job-not-active' AND (l.j).state = 'cancelled' THEN
            l.detail := 'the workflow was cancelled and its job with it: stop working on it; nothing was changed';
        END IF;
        RETURN QUERY SELECT (idemflow_job_problem(l.problem, l.detail)).*, NULL::text;
        RETURN;
    END IF;
    UPDATE jobs SET due_at = now() + p_lease, progress = coalesce(p_progress, jobs.progress),
                    heartbeat_at = now(), updated_at = now()
     WHERE jobs.tenant_id = p_tenant AND jobs.workflow_id = p_wf AND jobs.step = p_step
    RETURNING * INTO j;
    RETURN QUERY SELECT (idemflow_job_result(j, NULL, NULL)).*, j.progress;
END
$$;

-- POST /v1/workflows/{id}/resume: a workflow in incident, or a failed one
-- whose failed step is resumable, runs again from that step: its job is
-- activatable at once with p_retries retries (NULL: the step's own), and
-- keeps its activations, failures, last error and progress. Resuming a
-- failed workflow takes its business key back, unless another workflow of
-- its type holds it by now.
CREATE FUNCTION idemflow_wf_resume(p_tenant bigint, p_wf uuid, p_retries integer)
RETURNS SETOF idemflow_wf_row LANGUAGE plpgsql AS $$
DECLARE
    w workflows;
    j jobs;
    v_def jsonb;
    v_retries integer;
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
    SELECT * INTO j FROM jobs
     WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step = w.step;
    IF NOT FOUND OR j.job_type IS NULL OR j.state <> 'failed'
       OR (w.state = 'failed' AND (v_def -> 'resumable') IS DISTINCT FROM 'true'::jsonb) THEN
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
    UPDATE jobs SET state = 'activatable', retries = v_retries, worker = NULL, due_at = now(),
                    updated_at = now()
     WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step = w.step;
    PERFORM idemflow_event(p_tenant, p_wf, 'workflow.resumed',
                           jsonb_build_object('state', 'running', 'from', w.state,
                                              'step', w.step, 'retries', v_retries));
    SELECT * INTO w FROM workflows WHERE tenant_id = p_tenant AND id = p_wf;
    RETURN NEXT idemflow_wf_result(NULL, NULL, 'resumed', w);
END
$$;
