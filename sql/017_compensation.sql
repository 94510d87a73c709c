-- 017_compensation.sql: compensation (sagas).
--
-- A job step may name the job that undoes it: "compensate": {"job_type":
-- t, "retries": n} in its definition (checked by app/server/wf_steps.c).
-- When a workflow fails (a job out of retries with on_failure "fail", a
-- wait that times out with no on_timeout) or is cancelled, after at least
-- one such step completed, it does not end: it moves to "compensating",
-- writes compensation.started instead of workflow.failed or
-- workflow.cancelled, and begins the compensating job of the last
-- completed step that has one. Each compensating job's completion
-- (step.compensated) begins the one of the completed step before it; after
-- the first step's, the workflow ends "compensated" (workflow.compensated).
--
-- The compensating job of step k is the row of jobs at step -k
-- (016_engine.sql): the primary key allows one, and each is inserted with
-- the workflow's row locked, so each completed step is undone at most once,
-- and in reverse order because only one is live at a time. A step whose
-- job never completed (cancelled while active, failed, or never begun) is
-- not undone.
--
-- A compensating job out of retries parks the workflow in "incident",
-- whatever the step's on_failure says (an undo that cannot be done needs a
-- person); idemflow_wf_resume hands the same job out again with fresh
-- retries. A compensating workflow, or one in incident during its
-- compensation, cannot be cancelled (state-conflict): cancelling it would
-- leave steps done and not undone.
--
-- Changed whole: idemflow_job_complete, idemflow_job_fail,
-- idemflow_wf_transition, idemflow_wf_resume, idemflow_fire_timer.
-- New: idemflow_compensate_next, idemflow_compensate_begin.

-- Begin the next compensating job of workflow p_wf (its row locked by the
-- caller): the one of the latest completed step that has a "compensate"
-- and no compensating job yet. With none left, the workflow ends
-- "compensated". Returns the step begun, or NULL when it ended.
CREATE FUNCTION idemflow_compensate_next(p_tenant bigint, p_wf uuid) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_step integer;
    v_name text;
    v_def jsonb;
    v_from text;
BEGIN
    SELECT s.step, s.name, w.steps -> (s.step - 1) -> 'compensate'
      INTO v_step, v_name, v_def
      FROM jobs s
      JOIN workflows w ON w.tenant_id = s.tenant_id AND w.id = s.workflow_id
     WHERE s.tenant_id = p_tenant AND s.workflow_id = p_wf AND s.step > 0
       AND s.state = 'completed' AND s.job_type IS NOT NULL
       AND w.steps -> (s.step - 1) ? 'compensate'
       AND NOT EXISTS (SELECT 1 FROM jobs c
                        WHERE c.tenant_id = s.tenant_id AND c.workflow_id = s.workflow_id
                          AND c.step = -s.step)
     ORDER BY s.step DESC
     LIMIT 1;
    IF FOUND THEN
        INSERT INTO jobs (tenant_id, workflow_id, step, name, job_type, state, due_at,
                          retries, priority, created_at, updated_at)
        SELECT p_tenant, p_wf, -v_step, v_name, v_def ->> 'job_type', 'activatable', now(),
               coalesce((v_def ->> 'retries')::integer, 0), w.priority, now(), now()
          FROM workflows w
         WHERE w.tenant_id = p_tenant AND w.id = p_wf;
        RETURN v_step;
    END IF;
    -- Whether it failed or was cancelled is in the event that began it
    -- (a live workflow's history is kept).
    SELECT o.payload::jsonb #>> '{data,from}' INTO v_from
      FROM outbox o
     WHERE o.tenant_id = p_tenant AND o.workflow_id = p_wf AND o.type = 'compensation.started'
     ORDER BY o.seq DESC
     LIMIT 1;
    UPDATE workflows SET state = 'compensated', ended_at = now(), updated_at = now()
     WHERE tenant_id = p_tenant AND id = p_wf;
    PERFORM idemflow_event(p_tenant, p_wf, 'workflow.compensated',
                           jsonb_build_object('state', 'compensated', 'from', v_from));
    RETURN NULL;
END
$$;

-- Workflow p_wf (its row locked by the caller) fails (p_from 'failed', at
-- step p_step with p_error) or is cancelled (p_from 'cancelled', its live
-- jobs already cancelled): when a completed step has a "compensate", it
-- moves to "compensating", writes compensation.started and begins the
-- first compensating job, and this returns true. Otherwise it changes
-- nothing and returns false: the caller ends the workflow as before.
CREATE FUNCTION idemflow_compensate_begin(p_tenant bigint, p_wf uuid, p_from text,
                                          p_step integer, p_error text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_steps jsonb;
BEGIN
    SELECT jsonb_agg(s.step ORDER BY s.step DESC) INTO v_steps
      FROM jobs s
      JOIN workflows w ON w.tenant_id = s.tenant_id AND w.id = s.workflow_id
     WHERE s.tenant_id = p_tenant AND s.workflow_id = p_wf AND s.step > 0
       AND s.state = 'completed' AND s.job_type IS NOT NULL
       AND w.steps -> (s.step - 1) ? 'compensate';
    IF v_steps IS NULL THEN
        RETURN false;
    END IF;
    UPDATE workflows SET state = 'compensating', ended_at = NULL, updated_at = now()
     WHERE tenant_id = p_tenant AND id = p_wf;
    PERFORM idemflow_event(p_tenant, p_wf, 'compensation.started',
                           jsonb_build_object('state', 'compensating', 'from', p_from,
                                              'steps', v_steps, 'step', p_step,
                                              'error', p_error));
    PERFORM idemflow_compensate_next(p_tenant, p_wf);
    RETURN true;
END
$$;

-- A compensating job's completion writes step.compensated (not
-- job.completed) and begins the next compensation.
CREATE OR REPLACE FUNCTION idemflow_job_complete(p_tenant bigint, p_wf uuid, p_step integer,
                                                 p_worker text, p_output text)
RETURNS SETOF idemflow_job_row LANGUAGE plpgsql AS $$
DECLARE
    l record;
    j jobs;
BEGIN
    SELECT * INTO l FROM idemflow_job_lock(p_tenant, p_wf, p_step, p_worker);
    j := l.j;
    IF l.problem IS NOT NULL THEN
        IF j.state = 'completed' AND j.worker = p_worker AND j.output = p_output THEN
            RETURN NEXT idemflow_job_result(j, NULL, NULL);
        ELSIF j.state = 'completed' THEN
            RETURN NEXT idemflow_job_problem('job-not-active',
                'the job was already completed by another worker or with another output; nothing was changed');
        ELSE
            RETURN NEXT idemflow_job_problem(l.problem, l.detail);
        END IF;
        RETURN;
    END IF;
    UPDATE jobs SET state = 'completed', output = p_output, due_at = NULL, updated_at = now()
     WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step = p_step
    RETURNING * INTO j;
    IF p_step < 0 THEN
        PERFORM idemflow_event(p_tenant, p_wf, 'step.compensated',
                               jsonb_build_object('step', -j.step, 'name', j.name,
                                                  'job_type', j.job_type, 'worker', p_worker,
                                                  'output', p_output::jsonb));
        PERFORM idemflow_compensate_next(p_tenant, p_wf);
        RETURN NEXT idemflow_job_result(j, NULL, NULL);
        RETURN;
    END IF;
    PERFORM idemflow_event(p_tenant, p_wf, 'job.completed',
                           jsonb_build_object('step', j.step, 'name', j.name,
                                              'job_type', j.job_type, 'worker', p_worker,
                                              'output', p_output::jsonb));
    PERFORM idemflow_enter_step(p_tenant, p_wf, p_step + 1);
    RETURN NEXT idemflow_job_result(j, NULL, NULL);
END
$$;

-- A step's job out of retries with on_failure "fail" begins the
-- compensation when there is one to do; a compensating job out of retries
-- parks the workflow in incident. A compensating job's job.failed says
-- "compensation": true and names the step it undoes.
CREATE OR REPLACE FUNCTION idemflow_job_fail(p_tenant bigint, p_wf uuid, p_step integer,
                                             p_worker text, p_error text,
                                             p_retry_after interval)
RETURNS SETOF idemflow_job_row LANGUAGE plpgsql AS $$
DECLARE
    l record;
    j jobs;
    v_incident boolean;
    v_data jsonb;
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
        v_data := jsonb_build_object('step', abs(j.step), 'name', j.name, 'worker', p_worker,
                                     'error', p_error, 'retries_left', j.retries,
                                     'retrying', true);
        IF p_step < 0 THEN
            v_data := v_data || jsonb_build_object('compensation', true);
        END IF;
        PERFORM idemflow_event(p_tenant, p_wf, 'job.failed', v_data);
        RETURN NEXT idemflow_job_result(j, NULL, NULL);
        RETURN;
    END IF;
    UPDATE jobs SET state = 'failed', failures = failures + 1, error = p_error,
                    due_at = NULL, updated_at = now()
     WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step = p_step
    RETURNING * INTO j;
    v_data := jsonb_build_object('step', abs(j.step), 'name', j.name, 'worker', p_worker,
                                 'error', p_error, 'retries_left', 0, 'retrying', false);
    IF p_step < 0 THEN
        PERFORM idemflow_event(p_tenant, p_wf, 'job.failed',
                               v_data || jsonb_build_object('compensation', true));
        UPDATE workflows SET state = 'incident', updated_at = now()
         WHERE tenant_id = p_tenant AND id = p_wf;
        PERFORM idemflow_event(p_tenant, p_wf, 'workflow.incident',
                               jsonb_build_object('state', 'incident', 'step', -j.step,
                                                  'name', j.name, 'error', p_error,
                                                  'compensation', true));
        RETURN NEXT idemflow_job_result(j, NULL, NULL);
        RETURN;
    END IF;
    PERFORM idemflow_event(p_tenant, p_wf, 'job.failed', v_data);
    SELECT coalesce(steps -> (p_step - 1) ->> 'on_failure', 'fail') = 'incident'
      INTO v_incident FROM workflows WHERE tenant_id = p_tenant AND id = p_wf;
    IF v_incident THEN
        UPDATE workflows SET state = 'incident', updated_at = now()
         WHERE tenant_id = p_tenant AND id = p_wf;
        PERFORM idemflow_event(p_tenant, p_wf, 'workflow.incident',
                               jsonb_build_object('state', 'incident', 'step', j.step,
                                                  'name', j.name, 'error', p_error));
    ELSIF NOT idemflow_compensate_begin(p_tenant, p_wf, 'failed', j.step, p_error) THEN
        UPDATE workflows SET state = 'failed', ended_at = now(), updated_at = now()
         WHERE tenant_id = p_tenant AND id = p_wf;
        PERFORM idemflow_event(p_tenant, p_wf, 'workflow.failed',
                               jsonb_build_object('state', 'failed', 'step', j.step,
                                                  'error', p_error));
    END IF;
    RETURN NEXT idemflow_job_result(j, NULL, NULL);
END
$$;

-- A cancel with completed steps to undo begins the compensation; a
-- compensating workflow, or one in incident during its compensation, is
-- not cancelled (state-conflict).
CREATE OR REPLACE FUNCTION idemflow_wf_transition(p_tenant bigint, p_wf uuid, p_to text,
                                                  p_from text)
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
    IF p_to = 'cancelled' AND (w.state = 'compensating' OR (w.state = 'incident' AND EXISTS (
           SELECT 1 FROM jobs
            WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step < 0
              AND state <> 'completed'))) THEN
        RETURN NEXT idemflow_wf_result('state-conflict',
            format('the workflow is %s: it is undoing its completed steps and cannot be '
                   'cancelled; nothing was changed (a compensation in incident goes on '
                   'with a resume)', w.state),
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
    UPDATE jobs SET state = 'cancelled', updated_at = now()
     WHERE tenant_id = p_tenant AND workflow_id = p_wf
       AND state IN ('activatable', 'active', 'waiting');
    IF NOT idemflow_compensate_begin(p_tenant, p_wf, 'cancelled', NULL, NULL) THEN
        UPDATE workflows SET state = 'cancelled', ended_at = now(), updated_at = now()
         WHERE tenant_id = p_tenant AND id = p_wf;
        PERFORM idemflow_event(p_tenant, p_wf, 'workflow.cancelled',
                               jsonb_build_object('state', 'cancelled', 'from', w.state));
    END IF;
    SELECT * INTO w FROM workflows WHERE tenant_id = p_tenant AND id = p_wf;
    RETURN NEXT idemflow_wf_result(NULL, NULL, 'changed', w);
END
$$;

-- A workflow in incident during its compensation resumes it: the failed
-- compensating job is handed out again with fresh retries (p_retries, or
-- the compensate's own).
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
    IF w.state = 'incident' THEN
        SELECT * INTO j FROM jobs
         WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step < 0 AND state = 'failed';
        IF FOUND THEN
            v_def := w.steps -> (-j.step - 1) -> 'compensate';
            v_retries := coalesce(p_retries, (v_def ->> 'retries')::integer, 0);
            UPDATE workflows SET state = 'compensating', updated_at = now()
             WHERE tenant_id = p_tenant AND id = p_wf;
            UPDATE jobs SET state = 'activatable', retries = v_retries, worker = NULL,
                            due_at = now(), updated_at = now()
             WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step = j.step;
            PERFORM idemflow_event(p_tenant, p_wf, 'workflow.resumed',
                                   jsonb_build_object('state', 'compensating', 'from', w.state,
                                                      'step', -j.step, 'retries', v_retries,
                                                      'compensation', true));
            SELECT * INTO w FROM workflows WHERE tenant_id = p_tenant AND id = p_wf;
            RETURN NEXT idemflow_wf_result(NULL, NULL, 'resumed', w);
            RETURN;
        END IF;
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

-- A wait that times out with no on_timeout begins the compensation when
-- there is one to do.
CREATE OR REPLACE FUNCTION idemflow_fire_timer(p_tenant bigint, p_wf uuid, p_step integer,
                                               p_kind text, p_due timestamptz, p_state text,
                                               p_wf_step integer, p_steps jsonb)
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
    ELSIF NOT idemflow_compensate_begin(p_tenant, p_wf, 'failed', p_step, 'timed out') THEN
        UPDATE workflows SET state = 'failed', ended_at = now(), updated_at = now()
         WHERE tenant_id = p_tenant AND id = p_wf;
        PERFORM idemflow_event(p_tenant, p_wf, 'workflow.failed',
                               jsonb_build_object('state', 'failed', 'step', p_step,
                                                  'error', 'timed out'));
    END IF;
    RETURN 'timed_out';
END
$$;
