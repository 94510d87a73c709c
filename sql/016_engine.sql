-- 016_engine.sql: the shapes that compensation, step outputs and
-- priorities share.
--
-- 1. Two workflow states: "compensating" (a failed or cancelled workflow
--    undoing the steps it completed) and "compensated" (it has undone
--    them: an end state, like completed, failed and cancelled). A
--    compensating workflow is live: its business key stays taken.
-- 2. A compensating job is a row of jobs at step -k, k the step it undoes:
--    the primary key (tenant, workflow, step) keeps one step job and one
--    compensating job per step, and every statement that names a step
--    (step = k, k >= 1) keeps meaning the step's own job. Its API key is
--    "<workflow id>.c<k>" beside the step job's "<workflow id>.s<k>".
-- 3. A priority, 0 to 9 (higher first, 0 by default), on workflows (for
--    their steps) and on jobs (the step's own, or the workflow's).
-- 4. A job's row as the API shows it gains "steps" (the outputs of the
--    steps completed before it, by step name), "compensates" (for a
--    compensating job: the step it undoes, with that step's output) and
--    "priority". idemflow_step_outputs and idemflow_job_compensates build
--    the first two; an activation fills them.

ALTER TABLE workflows DROP CONSTRAINT workflows_state_check;
ALTER TABLE workflows ADD CONSTRAINT workflows_state_check
    CHECK (state IN ('pending', 'running', 'incident', 'compensating', 'completed', 'failed',
                     'cancelled', 'compensated'));
ALTER TABLE workflows ADD COLUMN priority smallint NOT NULL DEFAULT 0
    CHECK (priority BETWEEN 0 AND 9);
COMMENT ON COLUMN workflows.priority IS 'the priority of its steps'' jobs that name none: 0 to 9, higher first';

DROP INDEX workflows_business_key;
CREATE UNIQUE INDEX workflows_business_key ON workflows (tenant_id, type, business_key)
    WHERE business_key IS NOT NULL
      AND state IN ('pending', 'running', 'incident', 'compensating');

ALTER TABLE jobs DROP CONSTRAINT jobs_step_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_step_check CHECK (step <> 0);
COMMENT ON COLUMN jobs.step IS 'the step, 1-based; -k for the job that compensates step k';
ALTER TABLE jobs ADD COLUMN priority smallint NOT NULL DEFAULT 0
    CHECK (priority BETWEEN 0 AND 9);
COMMENT ON COLUMN jobs.priority IS '0 to 9, higher first: the step''s, else its workflow''s';

ALTER TYPE idemflow_job_row ADD ATTRIBUTE steps text;
ALTER TYPE idemflow_job_row ADD ATTRIBUTE compensates text;
ALTER TYPE idemflow_job_row ADD ATTRIBUTE priority integer;

CREATE OR REPLACE FUNCTION idemflow_job_problem(p_problem text, p_detail text)
RETURNS idemflow_job_row LANGUAGE sql IMMUTABLE AS $$
    SELECT p_problem, p_detail, NULL::uuid, NULL::integer, NULL::text, NULL::text, NULL::text,
           NULL::text, NULL::text, NULL::integer, NULL::integer, NULL::text, NULL::text,
           NULL::text, NULL::text, NULL::text, NULL::text, NULL::integer
$$;

-- steps and compensates are an activation's: NULL here.
CREATE OR REPLACE FUNCTION idemflow_job_result(j jobs, p_input text, p_wf_state text)
RETURNS idemflow_job_row LANGUAGE sql STABLE AS $$
    SELECT NULL::text, NULL::text, j.workflow_id, j.step, j.name, j.job_type, j.state,
           j.worker, CASE WHEN j.state = 'active' THEN idemflow_ts(j.due_at) END,
           j.activations, j.retries, j.output, j.error, p_input, p_wf_state,
           NULL::text, NULL::text, j.priority::integer
$$;

-- The heartbeat's answer keeps its columns: the job row's first fifteen,
-- then the progress.
CREATE OR REPLACE FUNCTION idemflow_job_heartbeat(p_tenant bigint, p_wf uuid, p_step integer,
                                                  p_worker text, p_lease interval,
                                                  p_progress text)
RETURNS TABLE (problem text, detail text, workflow_id uuid, step integer, name text,
               job_type text, state text, worker text, deadline text, activations integer,
               retries integer, output text, error text, input text, workflow_state text,
               progress text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    l record;
    j jobs;
    r idemflow_job_row;
BEGIN
    SELECT * INTO l FROM idemflow_job_lock(p_tenant, p_wf, p_step, p_worker);
    IF l.problem IS NOT NULL THEN
        -- A cancelled workflow cancelled its job: say so, so the worker
        -- stops; the problem type is complete's and fail's.
        IF l.problem = 'job-not-active' AND (l.j).state = 'cancelled' THEN
            l.detail := 'the workflow was cancelled and its job with it: stop working on it; nothing was changed';
        END IF;
        r := idemflow_job_problem(l.problem, l.detail);
        RETURN QUERY SELECT r.problem, r.detail, r.workflow_id, r.step, r.name, r.job_type,
                            r.state, r.worker, r.deadline, r.activations, r.retries, r.output,
                            r.error, r.input, r.workflow_state, NULL::text;
        RETURN;
    END IF;
    UPDATE jobs SET due_at = now() + p_lease, progress = coalesce(p_progress, jobs.progress),
                    heartbeat_at = now(), updated_at = now()
     WHERE jobs.tenant_id = p_tenant AND jobs.workflow_id = p_wf AND jobs.step = p_step
    RETURNING * INTO j;
    r := idemflow_job_result(j, NULL, NULL);
    RETURN QUERY SELECT r.problem, r.detail, r.workflow_id, r.step, r.name, r.job_type,
                        r.state, r.worker, r.deadline, r.activations, r.retries, r.output,
                        r.error, r.input, r.workflow_state, j.progress;
END
$$;

-- The outputs of the steps of workflow p_wf completed before step
-- p_before, as one object by step name ('{}' when none): what the job of
-- step p_before receives beside the workflow's input. A wait step's
-- output is its message's payload.
CREATE FUNCTION idemflow_step_outputs(p_tenant bigint, p_wf uuid, p_before integer)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_object_agg(name, output::jsonb ORDER BY step), '{}'::jsonb)
      FROM jobs
     WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step BETWEEN 1 AND p_before - 1
       AND state = 'completed' AND output IS NOT NULL
$$;

-- For a compensating job (p_step = -k): the step it undoes, as the API
-- shows it, with that step's output. NULL for a step's own job.
CREATE FUNCTION idemflow_job_compensates(p_tenant bigint, p_wf uuid, p_step integer)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('step', s.step, 'name', s.name,
                              'key', p_wf || '.s' || s.step,
                              'output', s.output::jsonb)::text
      FROM jobs s
     WHERE p_step < 0 AND s.tenant_id = p_tenant AND s.workflow_id = p_wf AND s.step = -p_step
$$;

-- The activation fills steps, compensates and priority, counts them in
-- the budget, and answers the workflow's state as it leaves it (a
-- compensating workflow stays compensating).
CREATE OR REPLACE FUNCTION idemflow_jobs_activate(p_tenant bigint, p_type text, p_worker text,
                                                  p_max integer, p_lease interval,
                                                  p_budget bigint)
RETURNS SETOF idemflow_job_row LANGUAGE plpgsql AS $$
DECLARE
    c record;
    j jobs;
    r idemflow_job_row;
    v_steps text;
    v_comp text;
    used bigint := 0;
BEGIN
    FOR c IN
        SELECT jb.workflow_id, jb.step, w.state AS wf_state, w.input::text AS input,
               512 + octet_length(w.input::text) + octet_length(jb.name)
                   + octet_length(jb.job_type) + octet_length(p_worker)
                   + coalesce(octet_length(jb.error), 0)
                   + coalesce(octet_length(jb.tracestate), 0) AS size
          FROM jobs jb
          JOIN workflows w ON w.tenant_id = jb.tenant_id AND w.id = jb.workflow_id
         WHERE jb.tenant_id = p_tenant AND jb.job_type = p_type
           AND jb.state IN ('activatable', 'active') AND jb.due_at <= now()
         ORDER BY jb.due_at
         LIMIT p_max
           FOR UPDATE OF jb, w SKIP LOCKED
    LOOP
        v_steps := idemflow_step_outputs(p_tenant, c.workflow_id, abs(c.step))::text;
        v_comp := idemflow_job_compensates(p_tenant, c.workflow_id, c.step);
        IF used > 0 AND used + c.size + octet_length(v_steps)
                        + coalesce(octet_length(v_comp), 0) > p_budget THEN
            RETURN NEXT idemflow_job_problem(NULL, 'max_answer');
            RETURN;
        END IF;
        used := used + c.size + octet_length(v_steps) + coalesce(octet_length(v_comp), 0);
        UPDATE jobs SET state = 'active', worker = p_worker, due_at = now() + p_lease,
                        activations = activations + 1, updated_at = now()
         WHERE tenant_id = p_tenant AND workflow_id = c.workflow_id AND step = c.step
        RETURNING * INTO j;
        IF c.wf_state = 'pending' THEN
            UPDATE workflows SET state = 'running' WHERE tenant_id = p_tenant AND id = c.workflow_id;
            PERFORM idemflow_event(p_tenant, c.workflow_id, 'workflow.started',
                                   jsonb_build_object('state', 'running'));
        END IF;
        r := idemflow_job_result(j, c.input,
                                 CASE WHEN c.wf_state = 'pending' THEN 'running'
                                      ELSE c.wf_state END);
        r.steps := v_steps;
        r.compensates := v_comp;
        RETURN NEXT r;
    END LOOP;
END
$$;
