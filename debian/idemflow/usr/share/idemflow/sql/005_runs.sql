-- 005_runs.sql: workflows that run.
--
-- A workflow may carry an ordered list of steps. Each step is either a job
-- that an external worker activates under a lease and then completes or
-- fails, or a wait for a named message. The current step has a row in
-- jobs; the next one gets its row when the current one completes. Every
-- command locks its workflow row first, so two commands on one workflow
-- are serialized and none of them loses the other's update; activation
-- takes its rows with SKIP LOCKED and so never waits on a command.
--
-- Every change writes its outbox event in the same transaction, with the
-- deterministic event id "<workflow id>.<seq>": workflows.last_seq counts
-- them under the workflow's row lock.

ALTER TABLE workflows
    ADD COLUMN business_key text CHECK (octet_length(business_key) BETWEEN 1 AND 255),
    ADD COLUMN steps jsonb NOT NULL DEFAULT '[]',
    ADD COLUMN step integer NOT NULL DEFAULT 0,      -- current step, 1-based; 0 = none
    ADD COLUMN last_seq integer NOT NULL DEFAULT 1,  -- workflow.created is seq 1
    ADD COLUMN ended_at timestamptz;

-- Business uniqueness: one active workflow per (tenant, type, key). An
-- index, not a read-then-write, so concurrent creates cannot both pass.
-- Once the workflow ends it leaves the index and a new one may start.
CREATE UNIQUE INDEX workflows_business_key ON workflows (tenant_id, type, business_key)
    WHERE business_key IS NOT NULL AND state IN ('pending', 'running');

-- GET /v1/workflows?state=...: keyset pagination on id within a state.
CREATE INDEX workflows_state ON workflows (tenant_id, state, id);

-- One row per step that has begun. A job step is activatable, then active
-- (leased to a worker until due_at), then completed or failed; a failure
-- with retries left makes it activatable again at due_at. A wait step is
-- waiting until its message comes. due_at is when an activatable job may
-- be handed out, or when an active job's lease runs out: an active job
-- past its due_at is activatable again, so one index finds both.
CREATE TABLE jobs (
    tenant_id     bigint NOT NULL,
    workflow_id   uuid NOT NULL,
    step          integer NOT NULL CHECK (step >= 1),
    name          text NOT NULL,
    job_type      text,                       -- NULL for a wait step
    wait_for      text,                       -- NULL for a job step
    state         text NOT NULL CHECK (state IN ('activatable', 'active', 'waiting',
                                                 'completed', 'failed', 'cancelled')),
    due_at        timestamptz,
    worker        text,
    retries       integer NOT NULL DEFAULT 0 CHECK (retries >= 0),  -- failures still allowed
    activations   integer NOT NULL DEFAULT 0,
    failures      integer NOT NULL DEFAULT 0,
    output        text,                       -- canonical JSON, as completed
    error         text,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, workflow_id, step),
    FOREIGN KEY (tenant_id, workflow_id) REFERENCES workflows (tenant_id, id),
    CHECK ((job_type IS NULL) <> (wait_for IS NULL))
);

CREATE INDEX jobs_due ON jobs (tenant_id, job_type, due_at)
    WHERE state IN ('activatable', 'active');
-- idemflow reap: expired leases of every tenant.
CREATE INDEX jobs_leases ON jobs (due_at) WHERE state = 'active';

-- Inbox of correlated messages: message_id is unique per tenant and is
-- inserted in the same transaction as its effect, so a redelivery finds
-- it and has no second effect. step is the step it completed, NULL while
-- it waits for a step that waits for it.
CREATE TABLE messages (
    tenant_id     bigint NOT NULL,
    message_id    text NOT NULL CHECK (octet_length(message_id) BETWEEN 1 AND 255),
    workflow_id   uuid NOT NULL,
    name          text NOT NULL,
    payload       text NOT NULL,              -- canonical JSON
    received_at   timestamptz NOT NULL,
    step          integer,
    PRIMARY KEY (tenant_id, message_id),
    FOREIGN KEY (tenant_id, workflow_id) REFERENCES workflows (tenant_id, id)
);
CREATE INDEX messages_unconsumed ON messages (tenant_id, workflow_id, name, received_at)
    WHERE step IS NULL;

CREATE FUNCTION idemflow_ts(t timestamptz) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;

-- Append the workflow's next event. The caller holds the workflow's row
-- lock, which is what makes the sequence gap-free and unique.
CREATE FUNCTION idemflow_event(p_tenant bigint, p_wf uuid, p_type text, p_data jsonb)
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
            now(), now());
END
$$;

-- Begin step p_step of a locked workflow, or complete the workflow when
-- there is no such step. A wait step whose message came early takes it
-- now and completes at once, so the loop may run through several steps.
CREATE FUNCTION idemflow_enter_step(p_tenant bigint, p_wf uuid, p_step integer)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_steps jsonb;
    v_def jsonb;
    v_msg record;
    v_step integer := p_step;
BEGIN
    SELECT steps INTO v_steps FROM workflows WHERE tenant_id = p_tenant AND id = p_wf;
    LOOP
        IF v_step > jsonb_array_length(v_steps) THEN
            UPDATE workflows SET state = 'completed', step = v_step - 1, ended_at = now(),
                                 updated_at = now()
             WHERE tenant_id = p_tenant AND id = p_wf;
            PERFORM idemflow_event(p_tenant, p_wf, 'workflow.completed',
                                   jsonb_build_object('state', 'completed'));
            RETURN;
        END IF;
        v_def := v_steps -> (v_step - 1);
        UPDATE workflows SET step = v_step, updated_at = now()
         WHERE tenant_id = p_tenant AND id = p_wf;
        INSERT INTO jobs (tenant_id, workflow_id, step, name, job_type, wait_for, state,
                          due_at, retries, created_at, updated_at)
        VALUES (p_tenant, p_wf, v_step, v_def ->> 'name', v_def ->> 'job_type',
                v_def ->> 'wait_for',
                CASE WHEN v_def ? 'wait_for' THEN 'waiting' ELSE 'activatable' END,
                CASE WHEN v_def ? 'wait_for' THEN NULL ELSE now() END,
                coalesce((v_def ->> 'retries')::integer, 0), now(), now());
        IF NOT v_def ? 'wait_for' THEN
            RETURN;
        END IF;
        SELECT message_id, payload INTO v_msg FROM messages
         WHERE tenant_id = p_tenant AND workflow_id = p_wf AND name = v_def ->> 'wait_for'
           AND step IS NULL
         ORDER BY received_at, message_id LIMIT 1;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        UPDATE messages SET step = v_step
         WHERE tenant_id = p_tenant AND message_id = v_msg.message_id;
        UPDATE jobs SET state = 'completed', output = v_msg.payload, updated_at = now()
         WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step = v_step;
        PERFORM idemflow_event(p_tenant, p_wf, 'job.completed',
                               jsonb_build_object('step', v_step, 'name', v_def ->> 'name',
                                                  'message_id', v_msg.message_id,
                                                  'output', v_msg.payload::jsonb));
        v_step := v_step + 1;
    END LOOP;
END
$$;

-- The row every command returns to the server, which renders it: problem
-- is NULL on success, else a problem slug (the server's problem types)
-- with its detail.
CREATE TYPE idemflow_wf_row AS (
    problem       text,
    detail        text,
    outcome       text,
    id            uuid,
    type          text,
    state         text,
    input         text,
    created_at    text,
    business_key  text,
    steps         text,
    step          integer
);

CREATE FUNCTION idemflow_wf_result(p_problem text, p_detail text, p_outcome text, w workflows)
RETURNS idemflow_wf_row LANGUAGE sql STABLE AS $$
    SELECT p_problem, p_detail, p_outcome, w.id, w.type, w.state, w.input::text,
           idemflow_ts(w.created_at), w.business_key, w.steps::text, w.step
$$;

-- Create a workflow that has steps or a business key (a plain one takes
-- the single-statement path of the server). p_payload is the
-- workflow.created event. When an active workflow of the same type
-- already has the business key, nothing is written and that workflow
-- comes back with outcome 'existing'.
CREATE FUNCTION idemflow_wf_create(p_tenant bigint, p_id uuid, p_type text, p_input jsonb,
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
    VALUES (p_id || '.1', p_tenant, p_id, 1, 'workflow.created', p_payload, p_at, p_at);
    IF jsonb_array_length(p_steps) > 0 THEN
        PERFORM idemflow_enter_step(p_tenant, p_id, 1);
    END IF;
    SELECT * INTO w FROM workflows WHERE tenant_id = p_tenant AND id = p_id;
    RETURN NEXT idemflow_wf_result(NULL, NULL, 'created', w);
END
$$;

-- POST /v1/workflows/{id}/transitions: a compare-and-set on the state.
-- Only a cancel can be asked for; the engine makes every other move.
CREATE FUNCTION idemflow_wf_transition(p_tenant bigint, p_wf uuid, p_to text, p_from text)
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
    IF p_to <> 'cancelled' OR w.state NOT IN ('pending', 'running') THEN
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

-- POST /v1/workflows/{id}/messages. The message id is claimed in the
-- transaction that applies the message, under the workflow's row lock.
-- outcome: 'correlated' (it completed the waiting step), 'recorded' (no
-- step waits for it now; a later wait step takes it), 'duplicate'.
CREATE FUNCTION idemflow_wf_message(p_tenant bigint, p_wf uuid, p_message_id text,
                                    p_name text, p_payload text)
RETURNS TABLE (problem text, detail text, outcome text, step integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    w workflows;
    m messages;
    j jobs;
BEGIN
    SELECT * INTO w FROM workflows WHERE tenant_id = p_tenant AND id = p_wf FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not-found', 'no such workflow', NULL::text, NULL::integer;
        RETURN;
    END IF;
    INSERT INTO messages (tenant_id, message_id, workflow_id, name, payload, received_at)
    VALUES (p_tenant, p_message_id, p_wf, p_name, p_payload, now())
    ON CONFLICT (tenant_id, message_id) DO NOTHING;
    IF NOT FOUND THEN
        SELECT * INTO m FROM messages
         WHERE messages.tenant_id = p_tenant AND message_id = p_message_id;
        IF m.workflow_id <> p_wf OR m.name <> p_name OR m.payload <> p_payload THEN
            RETURN QUERY SELECT 'message-id-reused',
                format('message_id "%s" was already used for a different message', p_message_id),
                NULL::text, NULL::integer;
            RETURN;
        END IF;
        RETURN QUERY SELECT NULL::text, NULL::text, 'duplicate', m.step;
        RETURN;
    END IF;
    SELECT * INTO j FROM jobs
     WHERE jobs.tenant_id = p_tenant AND workflow_id = p_wf AND jobs.step = w.step
       AND state = 'waiting' AND wait_for = p_name;
    IF NOT FOUND OR w.state NOT IN ('pending', 'running') THEN
        RETURN QUERY SELECT NULL::text, NULL::text, 'recorded', NULL::integer;
        RETURN;
    END IF;
    UPDATE messages SET step = j.step
     WHERE messages.tenant_id = p_tenant AND message_id = p_message_id;
    UPDATE jobs SET state = 'completed', output = p_payload, updated_at = now()
     WHERE jobs.tenant_id = p_tenant AND workflow_id = p_wf AND jobs.step = j.step;
    IF w.state = 'pending' THEN
        UPDATE workflows SET state = 'running' WHERE tenant_id = p_tenant AND id = p_wf;
        PERFORM idemflow_event(p_tenant, p_wf, 'workflow.started',
                               jsonb_build_object('state', 'running'));
    END IF;
    PERFORM idemflow_event(p_tenant, p_wf, 'job.completed',
                           jsonb_build_object('step', j.step, 'name', j.name,
                                              'message_id', p_message_id,
                                              'output', p_payload::jsonb));
    PERFORM idemflow_enter_step(p_tenant, p_wf, j.step + 1);
    RETURN QUERY SELECT NULL::text, NULL::text, 'correlated', j.step;
END
$$;

-- What job commands return: one row per job, or one problem row.
CREATE TYPE idemflow_job_row AS (
    problem         text,
    detail          text,
    workflow_id     uuid,
    step            integer,
    name            text,
    job_type        text,
    state           text,
    worker          text,
    deadline        text,
    activations     integer,
    retries         integer,
    output          text,
    error           text,
    input           text,
    workflow_state  text
);

CREATE FUNCTION idemflow_job_result(j jobs, p_input text, p_wf_state text)
RETURNS idemflow_job_row LANGUAGE sql STABLE AS $$
    SELECT NULL::text, NULL::text, j.workflow_id, j.step, j.name, j.job_type, j.state,
           j.worker, CASE WHEN j.state = 'active' THEN idemflow_ts(j.due_at) END,
           j.activations, j.retries, j.output, j.error, p_input, p_wf_state
$$;

CREATE FUNCTION idemflow_job_problem(p_problem text, p_detail text)
RETURNS idemflow_job_row LANGUAGE sql IMMUTABLE AS $$
    SELECT p_problem, p_detail, NULL::uuid, NULL::integer, NULL::text, NULL::text, NULL::text,
           NULL::text, NULL::text, NULL::integer, NULL::integer, NULL::text, NULL::text,
           NULL::text, NULL::text
$$;

-- POST /v1/jobs/activate: hand out up to p_max due jobs of one type. A
-- job whose lease ran out is due again (the lazy half of reaping). Both
-- the job and its workflow are taken with SKIP LOCKED: a job whose
-- workflow is busy with a command is simply left for the next call, so
-- concurrent activations never hand out one job twice and never wait.
CREATE FUNCTION idemflow_jobs_activate(p_tenant bigint, p_type text, p_worker text,
                                       p_max integer, p_lease interval)
RETURNS SETOF idemflow_job_row LANGUAGE plpgsql AS $$
DECLARE
    c record;
    j jobs;
BEGIN
    FOR c IN
        SELECT jb.workflow_id, jb.step, w.state AS wf_state, w.input::text AS input
          FROM jobs jb
          JOIN workflows w ON w.tenant_id = jb.tenant_id AND w.id = jb.workflow_id
         WHERE jb.tenant_id = p_tenant AND jb.job_type = p_type
           AND jb.state IN ('activatable', 'active') AND jb.due_at <= now()
         ORDER BY jb.due_at
         LIMIT p_max
           FOR UPDATE OF jb, w SKIP LOCKED
    LOOP
        UPDATE jobs SET state = 'active', worker = p_worker, due_at = now() + p_lease,
                        activations = activations + 1, updated_at = now()
         WHERE tenant_id = p_tenant AND workflow_id = c.workflow_id AND step = c.step
        RETURNING * INTO j;
        IF c.wf_state = 'pending' THEN
            UPDATE workflows SET state = 'running' WHERE tenant_id = p_tenant AND id = c.workflow_id;
            PERFORM idemflow_event(p_tenant, c.workflow_id, 'workflow.started',
                                   jsonb_build_object('state', 'running'));
        END IF;
        RETURN NEXT idemflow_job_result(j, c.input, 'running');
    END LOOP;
END
$$;

-- Lock the workflow and its job for a completion or failure from
-- p_worker. problem is NULL when the worker holds a live lease.
CREATE FUNCTION idemflow_job_lock(p_tenant bigint, p_wf uuid, p_step integer, p_worker text,
                                  OUT j jobs, OUT problem text, OUT detail text)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM workflows WHERE tenant_id = p_tenant AND id = p_wf FOR UPDATE;
    SELECT * INTO j FROM jobs
     WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step = p_step AND job_type IS NOT NULL;
    IF NOT FOUND THEN
        problem := 'not-found';
        detail := 'no such job';
    ELSIF j.state = 'active' AND j.worker = p_worker AND j.due_at > now() THEN
        problem := NULL;
    ELSIF j.state IN ('active', 'activatable') AND j.worker = p_worker THEN
        problem := 'lease-expired';
        detail := format('the lease of worker "%s" ran out; the job may be activated again and nothing was changed',
                         p_worker);
    ELSIF j.state = 'active' THEN
        problem := 'not-lease-holder';
        detail := format('the job is leased to another worker, not to "%s"; nothing was changed',
                         p_worker);
    ELSE
        problem := 'job-not-active';
        detail := format('the job is %s, not active; nothing was changed', j.state);
    END IF;
END
$$;

-- POST /v1/jobs/{key}/complete: a compare-and-set on (worker, lease). A
-- repeat by the same worker with the same output replays the result.
CREATE FUNCTION idemflow_job_complete(p_tenant bigint, p_wf uuid, p_step integer,
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
    PERFORM idemflow_event(p_tenant, p_wf, 'job.completed',
                           jsonb_build_object('step', j.step, 'name', j.name,
                                              'job_type', j.job_type, 'worker', p_worker,
                                              'output', p_output::jsonb));
    PERFORM idemflow_enter_step(p_tenant, p_wf, p_step + 1);
    RETURN NEXT idemflow_job_result(j, NULL, NULL);
END
$$;

-- POST /v1/jobs/{key}/fail: the same compare-and-set. With retries left
-- the job is activatable again after p_retry_after; without, the job and
-- its workflow fail.
CREATE FUNCTION idemflow_job_fail(p_tenant bigint, p_wf uuid, p_step integer,
                                  p_worker text, p_error text, p_retry_after interval)
RETURNS SETOF idemflow_job_row LANGUAGE plpgsql AS $$
DECLARE
    l record;
    j jobs;
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
    ELSE
        UPDATE jobs SET state = 'failed', failures = failures + 1, error = p_error,
                        due_at = NULL, updated_at = now()
         WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step = p_step
        RETURNING * INTO j;
        PERFORM idemflow_event(p_tenant, p_wf, 'job.failed',
                               jsonb_build_object('step', j.step, 'name', j.name,
                                                  'worker', p_worker, 'error', p_error,
                                                  'retries_left', 0, 'retrying', false));
        UPDATE workflows SET state = 'failed', ended_at = now(), updated_at = now()
         WHERE tenant_id = p_tenant AND id = p_wf;
        PERFORM idemflow_event(p_tenant, p_wf, 'workflow.failed',
                               jsonb_build_object('state', 'failed', 'step', j.step,
                                                  'error', p_error));
    END IF;
    RETURN NEXT idemflow_job_result(j, NULL, NULL);
END
$$;

-- idemflow reap: make jobs whose lease ran out activatable again, in
-- batches, for every tenant. Activation would take them anyway; reaping
-- makes the state say so. Returns how many were reaped.
CREATE FUNCTION idemflow_reap(p_batch integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    WITH due AS (
        SELECT tenant_id, workflow_id, step FROM jobs
         WHERE state = 'active' AND due_at <= now()
         ORDER BY due_at LIMIT p_batch
           FOR UPDATE SKIP LOCKED
    )
    UPDATE jobs j SET state = 'activatable', due_at = now(), updated_at = now()
      FROM due
     WHERE j.tenant_id = due.tenant_id AND j.workflow_id = due.workflow_id AND j.step = due.step;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
