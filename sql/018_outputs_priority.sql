-- 018_outputs_priority.sql: step outputs within a bound, and priorities
-- that order the activation without starving anyone.
--
-- 1. Bounded activations. A job's activation carries its workflow's input
--    and the outputs of the steps completed before it ("steps",
--    sql/016_engine.sql). Each output is bounded by max_body, but 32 of
--    them are not bounded together. idemflow_activation_max() is the
--    bound: 2 MiB (2097152 bytes) for the input and the outputs, each
--    counted as PostgreSQL prints its jsonb, which is never shorter than
--    the canonical form the API writes. Half of max_answer's default, so a
--    job always fits a default activation's answer; twice max_body's, so
--    an input of max_body leaves as much room for the outputs.
--    idemflow_enter_step checks it whenever it enters a step that some
--    job step follows (or is): the outputs so far are part of that job's
--    activation, and they only grow. Past the bound it raises SQLSTATE
--    IDF13, which rolls back whatever brought the output (a completion,
--    a message, a kept message taken by a create's first wait; a timer's
--    firing ends in an incident, through idemflow_fire_timers'
--    per-timer subtransaction), and which the server answers 413
--    activation-too-large.
-- 2. Priorities. A job's priority is its step's "priority", else its
--    workflow's (idemflow_enter_step; idemflow_wf_create takes the
--    workflow's). An activation hands out due jobs in the order of
--    idemflow_job_rank(due_at, priority) = due_at - priority * 10 s: the
--    highest priority first among jobs that became due within 10 s of one
--    another per step of priority, the earliest due otherwise. Priority
--    buys a bounded head start, not precedence forever: once a job has
--    been due for 90 s, no job that becomes due later goes before it,
--    whatever its priority, so no stream of urgent work starves it. The
--    index jobs_rank serves the order in one range scan; it replaces
--    jobs_due, whose columns it begins with.
-- 3. idemflow_wf_create counts a compensating workflow as active, as
--    workflows_business_key does (016): before, a create with the key of
--    a compensating workflow found the index taken and no holder, and
--    looped.

-- The activation's bound, in bytes: the workflow's input and the outputs
-- of the steps before the job, as their jsonb prints.
CREATE FUNCTION idemflow_activation_max()
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 2097152::bigint
$$;

-- A job's place in the activation order: its due time moved earlier by
-- 10 s per step of priority. Immutable: the interval is seconds only, so
-- no time zone enters the subtraction (PostgreSQL marks every
-- timestamptz - interval stable because a month or a day may).
CREATE FUNCTION idemflow_job_rank(p_due timestamptz, p_priority smallint)
RETURNS timestamptz LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_due - p_priority * interval '10 seconds'
$$;

-- due_at last: the activation's "due now" is checked in the index too,
-- so a job whose rank has come but not its due time (a leased job of a
-- high priority) costs no heap visit.
CREATE INDEX jobs_rank ON jobs (tenant_id, job_type, idemflow_job_rank(due_at, priority), due_at)
    WHERE state IN ('activatable', 'active');
DROP INDEX jobs_due;

CREATE OR REPLACE FUNCTION idemflow_enter_step(p_tenant bigint, p_wf uuid, p_step integer)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_steps jsonb;
    v_key text;
    v_input_size bigint;
    v_priority smallint;
    v_def jsonb;
    v_msg_id text;
    v_payload text;
    v_size bigint;
    v_step integer := p_step;
BEGIN
    SELECT steps, business_key, octet_length(input::text), priority
      INTO v_steps, v_key, v_input_size, v_priority
      FROM workflows WHERE tenant_id = p_tenant AND id = p_wf;
    LOOP
        IF v_step > jsonb_array_length(v_steps) THEN
            UPDATE workflows SET state = 'completed', step = v_step - 1, ended_at = now(),
                                 updated_at = now()
             WHERE tenant_id = p_tenant AND id = p_wf;
            PERFORM idemflow_event(p_tenant, p_wf, 'workflow.completed',
                                   jsonb_build_object('state', 'completed'));
            RETURN;
        END IF;
        -- The next job's activation carries the input and the outputs so
        -- far: refuse what would take it past the bound.
        IF EXISTS (SELECT 1 FROM jsonb_array_elements(v_steps) WITH ORDINALITY AS s(d, i)
                    WHERE s.i >= v_step AND s.d ? 'job_type') THEN
            v_size := v_input_size
                      + octet_length(idemflow_step_outputs(p_tenant, p_wf, v_step)::text);
            IF v_size > idemflow_activation_max() THEN
                RAISE EXCEPTION USING ERRCODE = 'IDF13',
                    MESSAGE = format('step %s ("%s") would be entered with %s bytes of workflow input and step outputs, more than the %s an activation carries: nothing was changed',
                                     v_step, (v_steps -> (v_step - 1)) ->> 'name', v_size,
                                     idemflow_activation_max());
            END IF;
        END IF;
        v_def := v_steps -> (v_step - 1);
        UPDATE workflows SET step = v_step, updated_at = now()
         WHERE tenant_id = p_tenant AND id = p_wf;
        IF v_def ? 'sleep' OR v_def ? 'until' THEN
            INSERT INTO timers (tenant_id, workflow_id, step, kind, due_at, created_at)
            VALUES (p_tenant, p_wf, v_step, 'sleep',
                    CASE WHEN v_def ? 'sleep' THEN now() + (v_def ->> 'sleep')::interval
                         ELSE (v_def ->> 'until')::timestamptz END,
                    now());
            RETURN;
        END IF;
        INSERT INTO jobs (tenant_id, workflow_id, step, name, job_type, wait_for, state,
                          due_at, retries, priority, created_at, updated_at)
        VALUES (p_tenant, p_wf, v_step, v_def ->> 'name', v_def ->> 'job_type',
                v_def ->> 'wait_for',
                CASE WHEN v_def ? 'wait_for' THEN 'waiting' ELSE 'activatable' END,
                CASE WHEN v_def ? 'wait_for' THEN NULL ELSE now() END,
                coalesce((v_def ->> 'retries')::integer, 0),
                coalesce((v_def ->> 'priority')::smallint, v_priority), now(), now());
        IF NOT v_def ? 'wait_for' THEN
            RETURN;
        END IF;
        v_msg_id := NULL;
        SELECT message_id, payload INTO v_msg_id, v_payload FROM messages
         WHERE tenant_id = p_tenant AND workflow_id = p_wf AND name = v_def ->> 'wait_for'
           AND step IS NULL
         ORDER BY received_at, message_id LIMIT 1;
        IF v_msg_id IS NULL AND v_key IS NOT NULL THEN
            -- Another workflow with the key may be taking the same message:
            -- wait for it, and look again when the row it took drops out
            -- (LIMIT with FOR UPDATE returns no successor then).
            LOOP
                SELECT message_id, payload INTO v_msg_id, v_payload FROM messages
                 WHERE tenant_id = p_tenant AND workflow_id IS NULL AND business_key = v_key
                   AND name = v_def ->> 'wait_for' AND expires_at > now()
                 ORDER BY received_at, message_id LIMIT 1
                   FOR UPDATE;
                EXIT WHEN v_msg_id IS NOT NULL;
                EXIT WHEN NOT EXISTS (
                    SELECT 1 FROM messages
                     WHERE tenant_id = p_tenant AND workflow_id IS NULL AND business_key = v_key
                       AND name = v_def ->> 'wait_for' AND expires_at > now());
            END LOOP;
        END IF;
        IF v_msg_id IS NULL THEN
            IF v_def ? 'timeout' THEN
                INSERT INTO timers (tenant_id, workflow_id, step, kind, due_at, created_at)
                VALUES (p_tenant, p_wf, v_step, 'timeout',
                        now() + (v_def ->> 'timeout')::interval, now());
            END IF;
            RETURN;
        END IF;
        UPDATE messages SET workflow_id = p_wf, step = v_step
         WHERE tenant_id = p_tenant AND message_id = v_msg_id;
        UPDATE jobs SET state = 'completed', output = v_payload, updated_at = now()
         WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step = v_step;
        PERFORM idemflow_event(p_tenant, p_wf, 'job.completed',
                               jsonb_build_object('step', v_step, 'name', v_def ->> 'name',
                                                  'message_id', v_msg_id,
                                                  'output', v_payload::jsonb));
        v_step := v_step + 1;
    END LOOP;
END
$$;

-- The workflow's priority (0 to 9) is its steps' jobs' unless a step
-- names its own.
CREATE FUNCTION idemflow_wf_create(p_tenant bigint, p_id uuid, p_type text, p_input jsonb,
                                   p_at timestamptz, p_steps jsonb, p_business_key text,
                                   p_payload text, p_priority smallint)
RETURNS SETOF idemflow_wf_row LANGUAGE plpgsql AS $$
DECLARE
    w workflows;
BEGIN
    IF p_business_key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(idemflow_key_lock(p_tenant, p_business_key));
    END IF;
    LOOP
        INSERT INTO workflows (tenant_id, id, type, state, input, created_at, updated_at,
                               business_key, steps, priority)
        VALUES (p_tenant, p_id, p_type, 'pending', p_input, p_at, p_at, p_business_key,
                p_steps, p_priority)
        ON CONFLICT DO NOTHING
        RETURNING * INTO w;
        EXIT WHEN FOUND;
        -- A new statement sees the holder even when it committed while we
        -- waited; if it has ended since, try again.
        SELECT * INTO w FROM workflows
         WHERE tenant_id = p_tenant AND type = p_type AND business_key = p_business_key
           AND state IN ('pending', 'running', 'incident', 'compensating');
        IF FOUND THEN
            RETURN NEXT idemflow_wf_result(NULL, NULL, 'existing', w);
            RETURN;
        END IF;
        -- Not the key: the id itself is taken, which no retry changes.
        IF EXISTS (SELECT 1 FROM workflows WHERE tenant_id = p_tenant AND id = p_id) THEN
            RAISE unique_violation USING MESSAGE = format('workflow %s exists', p_id);
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

-- The previous release's call: priority 0.
CREATE OR REPLACE FUNCTION idemflow_wf_create(p_tenant bigint, p_id uuid, p_type text,
                                              p_input jsonb, p_at timestamptz, p_steps jsonb,
                                              p_business_key text, p_payload text)
RETURNS SETOF idemflow_wf_row LANGUAGE sql AS $$
    SELECT * FROM idemflow_wf_create(p_tenant, p_id, p_type, p_input, p_at, p_steps,
                                     p_business_key, p_payload, 0::smallint)
$$;

-- The previous release's activation, in the new order.
CREATE OR REPLACE FUNCTION idemflow_jobs_activate(p_tenant bigint, p_type text, p_worker text,
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
           AND jb.state IN ('activatable', 'active')
           AND idemflow_job_rank(jb.due_at, jb.priority) <= now() AND jb.due_at <= now()
         ORDER BY idemflow_job_rank(jb.due_at, jb.priority), jb.due_at
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

-- Due jobs by rank (idemflow_job_rank): the highest priority first, the
-- earliest due among equals, and no job passed by work that became due
-- more than 90 s after it.
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
           AND jb.state IN ('activatable', 'active')
           AND idemflow_job_rank(jb.due_at, jb.priority) <= now() AND jb.due_at <= now()
         ORDER BY idemflow_job_rank(jb.due_at, jb.priority), jb.due_at
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
