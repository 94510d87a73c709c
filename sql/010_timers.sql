-- 010_timers.sql: timers, wait timeouts and messages correlated by business key.
--
-- A step may sleep ("sleep": an ISO 8601 duration, or "until": a time),
-- and a wait step may time out ("timeout", then "on_timeout": the name of a
-- later step, or the workflow fails). Both are rows of timers, written as
-- the step begins; idemflow reap fires the due ones (idemflow_fire_timers),
-- found through the partial index timers_due, claimed FOR UPDATE SKIP
-- LOCKED, each under its workflow's row lock like every command, so a
-- timer fires once however many reapers run, and a message and a timeout
-- racing for one wait are serialized: whichever takes the workflow's lock
-- first wins, and the other finds the wait over. A timer whose step is no
-- longer current (the workflow was cancelled, the message came first) is
-- deleted without an event.
--
-- POST /v1/messages addresses a message by its business key instead of a
-- workflow id (idemflow_message_publish): it goes to the tenant's active
-- workflow with that key whose current step waits for its name; with none
-- waiting it is kept until its expires_at and taken by the first workflow
-- with that key that begins such a wait in time (idemflow_enter_step).
-- message_id is unique per tenant across both routes. The buffered message
-- and the wait could each be written while the other is not yet
-- committed; an advisory lock on (tenant, business key), taken by the
-- publication before any workflow lock and by a create with a business key
-- before its insert, and the publication's lock on every active workflow
-- with the key, make one of them see the other.
--
-- Functions replaced whole: idemflow_enter_step (sleep steps, timeouts,
-- buffered messages), idemflow_wf_message (a message id used by the other
-- route is "reused"; a correlated wait drops its timeout), idemflow_wf_create
-- (the advisory lock).

CREATE TABLE timers (
    tenant_id     bigint NOT NULL,
    workflow_id   uuid NOT NULL,
    step          integer NOT NULL CHECK (step >= 1),
    kind          text NOT NULL CHECK (kind IN ('sleep', 'timeout')),
    due_at        timestamptz NOT NULL,
    fired_at      timestamptz,
    created_at    timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, workflow_id, step),
    FOREIGN KEY (tenant_id, workflow_id) REFERENCES workflows (tenant_id, id)
);
-- idemflow reap: the due timers of every tenant, earliest first; fired
-- ones leave the index.
CREATE INDEX timers_due ON timers (due_at) WHERE fired_at IS NULL;

-- A message published by business key has no workflow until one takes it.
ALTER TABLE messages
    ALTER COLUMN workflow_id DROP NOT NULL,
    ADD COLUMN business_key text CHECK (octet_length(business_key) BETWEEN 1 AND 255),
    ADD COLUMN expires_at timestamptz,
    ADD CONSTRAINT messages_addressed
        CHECK (workflow_id IS NOT NULL OR (business_key IS NOT NULL AND expires_at IS NOT NULL));
-- The buffered messages of a key (a wait step looks here), and their
-- expiry (idemflow prune deletes them).
CREATE INDEX messages_buffered ON messages (tenant_id, business_key, name, received_at)
    WHERE workflow_id IS NULL;
CREATE INDEX messages_expiry ON messages (expires_at) WHERE workflow_id IS NULL;

-- The active workflows of a business key, whatever their type.
CREATE INDEX workflows_active_key ON workflows (tenant_id, business_key)
    WHERE business_key IS NOT NULL AND state IN ('pending', 'running');

-- The advisory lock of a tenant's business key.
CREATE FUNCTION idemflow_key_lock(p_tenant bigint, p_key text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT hashtextextended(p_tenant || '/' || p_key, 1010)
$$;

-- Begin step p_step of a locked workflow, or complete the workflow when
-- there is no such step. A sleep step writes its timer and waits for it. A
-- wait step whose message came early (sent to this workflow, or published
-- for its business key and not yet expired) takes it now and completes at
-- once, so the loop may run through several steps; one still waiting
-- writes its timeout's timer, if it has one.
CREATE OR REPLACE FUNCTION idemflow_enter_step(p_tenant bigint, p_wf uuid, p_step integer)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_steps jsonb;
    v_key text;
    v_def jsonb;
    v_msg_id text;
    v_payload text;
    v_step integer := p_step;
BEGIN
    SELECT steps, business_key INTO v_steps, v_key
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
                          due_at, retries, created_at, updated_at)
        VALUES (p_tenant, p_wf, v_step, v_def ->> 'name', v_def ->> 'job_type',
                v_def ->> 'wait_for',
                CASE WHEN v_def ? 'wait_for' THEN 'waiting' ELSE 'activatable' END,
                CASE WHEN v_def ? 'wait_for' THEN NULL ELSE now() END,
                coalesce((v_def ->> 'retries')::integer, 0), now(), now());
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

-- Create a workflow that has steps or a business key (a plain one takes
-- the single-statement path of the server). p_payload is the
-- workflow.created event. When an active workflow of the same type
-- already has the business key, nothing is written and that workflow
-- comes back with outcome 'existing'. With a business key, the key's
-- advisory lock comes first (see the header). A workflow in 'incident'
-- (009_incidents.sql) holds its key as well; the insert names no conflict
-- target, so it defers to whichever partial index holds the key.
CREATE OR REPLACE FUNCTION idemflow_wf_create(p_tenant bigint, p_id uuid, p_type text,
                                              p_input jsonb, p_at timestamptz, p_steps jsonb,
                                              p_business_key text, p_payload text)
RETURNS SETOF idemflow_wf_row LANGUAGE plpgsql AS $$
DECLARE
    w workflows;
BEGIN
    IF p_business_key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(idemflow_key_lock(p_tenant, p_business_key));
    END IF;
    LOOP
        INSERT INTO workflows (tenant_id, id, type, state, input, created_at, updated_at,
                               business_key, steps)
        VALUES (p_tenant, p_id, p_type, 'pending', p_input, p_at, p_at, p_business_key,
                p_steps)
        ON CONFLICT DO NOTHING
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

-- POST /v1/workflows/{id}/messages. The message id is claimed in the
-- transaction that applies the message, under the workflow's row lock.
-- outcome: 'correlated' (it completed the waiting step), 'recorded' (no
-- step waits for it now; a later wait step takes it), 'duplicate'. A
-- message id already published by business key is another message.
CREATE OR REPLACE FUNCTION idemflow_wf_message(p_tenant bigint, p_wf uuid, p_message_id text,
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
        IF m.workflow_id IS DISTINCT FROM p_wf OR m.business_key IS NOT NULL
           OR m.name <> p_name OR m.payload <> p_payload THEN
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
    DELETE FROM timers
     WHERE timers.tenant_id = p_tenant AND workflow_id = p_wf AND timers.step = j.step;
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

-- POST /v1/messages: publish a message for the tenant's workflow with
-- business key p_key that waits for p_name. outcome: 'correlated' (it
-- completed that wait), 'buffered' (none waits: kept until expires_at for
-- the first that begins such a wait), 'duplicate' (message_id seen before,
-- for this same message: nothing changes, the row says where it went).
-- When several workflows with the key wait for the name (workflows of
-- different types), the one whose wait began first takes it (then the
-- lower workflow id); a message is delivered to one workflow only.
CREATE FUNCTION idemflow_message_publish(p_tenant bigint, p_message_id text, p_name text,
                                         p_key text, p_ttl interval, p_payload text)
RETURNS TABLE (problem text, detail text, outcome text, workflow_id uuid, step integer,
               expires_at text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    m messages;
    c record;
BEGIN
    PERFORM pg_advisory_xact_lock(idemflow_key_lock(p_tenant, p_key));
    -- Every active workflow with the key, locked as a command locks it:
    -- one in the middle of beginning a wait is waited for, and seen.
    PERFORM 1 FROM workflows
     WHERE tenant_id = p_tenant AND business_key = p_key AND state IN ('pending', 'running')
     ORDER BY id
       FOR UPDATE;
    INSERT INTO messages (tenant_id, message_id, workflow_id, name, payload, received_at,
                          business_key, expires_at)
    VALUES (p_tenant, p_message_id, NULL, p_name, p_payload, now(), p_key, now() + p_ttl)
    ON CONFLICT (tenant_id, message_id) DO NOTHING;
    IF NOT FOUND THEN
        SELECT * INTO m FROM messages
         WHERE messages.tenant_id = p_tenant AND message_id = p_message_id;
        IF m.business_key IS DISTINCT FROM p_key OR m.name <> p_name
           OR m.payload <> p_payload THEN
            RETURN QUERY SELECT 'message-id-reused',
                format('message_id "%s" was already used for a different message', p_message_id),
                NULL::text, NULL::uuid, NULL::integer, NULL::text;
            RETURN;
        END IF;
        RETURN QUERY SELECT NULL::text, NULL::text, 'duplicate', m.workflow_id, m.step,
                            CASE WHEN m.workflow_id IS NULL THEN idemflow_ts(m.expires_at) END;
        RETURN;
    END IF;
    SELECT w.id AS wf, w.state, j.step, j.name INTO c
      FROM workflows w
      JOIN jobs j ON j.tenant_id = w.tenant_id AND j.workflow_id = w.id AND j.step = w.step
     WHERE w.tenant_id = p_tenant AND w.business_key = p_key
       AND w.state IN ('pending', 'running') AND j.state = 'waiting' AND j.wait_for = p_name
     ORDER BY j.created_at, w.id
     LIMIT 1;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::text, NULL::text, 'buffered', NULL::uuid, NULL::integer,
                            idemflow_ts(now() + p_ttl);
        RETURN;
    END IF;
    UPDATE messages SET workflow_id = c.wf, step = c.step
     WHERE messages.tenant_id = p_tenant AND message_id = p_message_id;
    UPDATE jobs SET state = 'completed', output = p_payload, updated_at = now()
     WHERE jobs.tenant_id = p_tenant AND jobs.workflow_id = c.wf AND jobs.step = c.step;
    DELETE FROM timers
     WHERE timers.tenant_id = p_tenant AND timers.workflow_id = c.wf AND timers.step = c.step;
    IF c.state = 'pending' THEN
        UPDATE workflows SET state = 'running' WHERE tenant_id = p_tenant AND id = c.wf;
        PERFORM idemflow_event(p_tenant, c.wf, 'workflow.started',
                               jsonb_build_object('state', 'running'));
    END IF;
    PERFORM idemflow_event(p_tenant, c.wf, 'job.completed',
                           jsonb_build_object('step', c.step, 'name', c.name,
                                              'message_id', p_message_id,
                                              'business_key', p_key,
                                              'output', p_payload::jsonb));
    PERFORM idemflow_enter_step(p_tenant, c.wf, c.step + 1);
    RETURN QUERY SELECT NULL::text, NULL::text, 'correlated', c.wf, c.step, NULL::text;
END
$$;

-- idemflow reap: fire up to p_batch due timers of every tenant, in one
-- transaction. A timer and its workflow are taken together with SKIP
-- LOCKED: another reaper's timers are skipped, and so is a workflow busy
-- with a command (its timer stays due, for the next round), so a reaper
-- never waits. A sleep writes timer.fired and the workflow goes on to its
-- next step; a timeout writes step.timed_out, fails the wait's job, and the
-- workflow goes on to its on_timeout step, or fails. A timer whose step is
-- over (the workflow was cancelled, its message came) is deleted. taken
-- counts the timers the batch took: fewer than p_batch means it was the
-- last.
CREATE FUNCTION idemflow_fire_timers(p_batch integer, OUT taken integer, OUT fired integer,
                                     OUT timed_out integer)
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    v_def jsonb;
    v_job_state text;
    v_target integer;
BEGIN
    taken := 0;
    fired := 0;
    timed_out := 0;
    FOR c IN
        SELECT t.tenant_id, t.workflow_id, t.step, t.kind, t.due_at,
               w.state, w.step AS wf_step, w.steps
          FROM timers t
          JOIN workflows w ON w.tenant_id = t.tenant_id AND w.id = t.workflow_id
         WHERE t.fired_at IS NULL AND t.due_at <= now()
         ORDER BY t.due_at
         LIMIT p_batch
           FOR UPDATE OF t, w SKIP LOCKED
    LOOP
        taken := taken + 1;
        v_job_state := NULL;
        IF c.kind = 'timeout' THEN
            SELECT state INTO v_job_state FROM jobs
             WHERE tenant_id = c.tenant_id AND workflow_id = c.workflow_id AND step = c.step;
        END IF;
        IF c.state NOT IN ('pending', 'running') OR c.wf_step <> c.step
           OR (c.kind = 'timeout' AND v_job_state IS DISTINCT FROM 'waiting') THEN
            DELETE FROM timers
             WHERE tenant_id = c.tenant_id AND workflow_id = c.workflow_id AND step = c.step;
            CONTINUE;
        END IF;
        UPDATE timers SET fired_at = now()
         WHERE tenant_id = c.tenant_id AND workflow_id = c.workflow_id AND step = c.step;
        IF c.state = 'pending' THEN
            UPDATE workflows SET state = 'running'
             WHERE tenant_id = c.tenant_id AND id = c.workflow_id;
            PERFORM idemflow_event(c.tenant_id, c.workflow_id, 'workflow.started',
                                   jsonb_build_object('state', 'running'));
        END IF;
        v_def := c.steps -> (c.step - 1);
        IF c.kind = 'sleep' THEN
            PERFORM idemflow_event(c.tenant_id, c.workflow_id, 'timer.fired',
                                   jsonb_build_object('step', c.step, 'name', v_def ->> 'name',
                                                      'due_at', idemflow_ts(c.due_at)));
            PERFORM idemflow_enter_step(c.tenant_id, c.workflow_id, c.step + 1);
            fired := fired + 1;
            CONTINUE;
        END IF;
        UPDATE jobs SET state = 'failed', error = 'timed out', updated_at = now()
         WHERE tenant_id = c.tenant_id AND workflow_id = c.workflow_id AND step = c.step;
        PERFORM idemflow_event(c.tenant_id, c.workflow_id, 'step.timed_out',
                               jsonb_build_object('step', c.step, 'name', v_def ->> 'name',
                                                  'wait_for', v_def ->> 'wait_for',
                                                  'timeout', v_def ->> 'timeout',
                                                  'on_timeout', v_def -> 'on_timeout'));
        timed_out := timed_out + 1;
        IF v_def ? 'on_timeout' THEN
            SELECT s.i INTO v_target
              FROM jsonb_array_elements(c.steps) WITH ORDINALITY AS s(d, i)
             WHERE s.d ->> 'name' = v_def ->> 'on_timeout';
            PERFORM idemflow_enter_step(c.tenant_id, c.workflow_id, v_target);
        ELSE
            UPDATE workflows SET state = 'failed', ended_at = now(), updated_at = now()
             WHERE tenant_id = c.tenant_id AND id = c.workflow_id;
            PERFORM idemflow_event(c.tenant_id, c.workflow_id, 'workflow.failed',
                                   jsonb_build_object('state', 'failed', 'step', c.step,
                                                      'error', 'timed out'));
        END IF;
    END LOOP;
END
$$;
