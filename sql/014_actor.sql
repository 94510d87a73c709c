-- 014_actor.sql: who did it. Every idempotency key, workflow, outbox event,
-- job and message records its actor: the API token whose request wrote it,
-- or the part of the system that wrote it without a request.
--
-- An actor is text:
--   'token:<id>'     the request's bearer token, api_tokens.id (what
--                    "idemflow token list" shows and "token revoke --id"
--                    takes; a token is revoked, never deleted, so the id
--                    keeps naming it);
--   'system:reaper'  idemflow reap, firing timers (sleeps, wait timeouts)
--                    and the steps they begin (idemflow_fire_timers);
--   NULL             written before this migration, or by a server older
--                    than it while an upgrade rolls.
-- No foreign key: a create would pay a lookup in api_tokens per row it
-- writes, and the id is already the one the request's token check found.
--
-- As with the trace context (008_trace.sql), the functions of the commands
-- insert events, jobs and messages in many places: the server sets
-- idemflow.actor for the command's transaction (set_config(..., true)) and
-- the columns take it as their default. The plain keyed create names its
-- columns and writes the id that its own token check found; the key claim
-- of the other commands passes it. The reaper's function sets it for its
-- own transaction. Nothing here changes what a webhook carries: the actor
-- is shown by GET /v1/workflows/{id}/events, not delivered.
--
-- Existing rows take NULL without a rewrite (the default is not volatile);
-- the CHECKs scan each table once, under the migration's lock.

ALTER TABLE idempotency_keys
    ADD COLUMN actor text
        CHECK (actor ~ '^(token:[1-9][0-9]{0,18}|system:[a-z]{1,32})$');

ALTER TABLE workflows
    ADD COLUMN actor text
        DEFAULT nullif(current_setting('idemflow.actor', true), '')
        CHECK (actor ~ '^(token:[1-9][0-9]{0,18}|system:[a-z]{1,32})$');

ALTER TABLE outbox
    ADD COLUMN actor text
        DEFAULT nullif(current_setting('idemflow.actor', true), '')
        CHECK (actor ~ '^(token:[1-9][0-9]{0,18}|system:[a-z]{1,32})$');

ALTER TABLE jobs
    ADD COLUMN actor text
        DEFAULT nullif(current_setting('idemflow.actor', true), '')
        CHECK (actor ~ '^(token:[1-9][0-9]{0,18}|system:[a-z]{1,32})$');

ALTER TABLE messages
    ADD COLUMN actor text
        DEFAULT nullif(current_setting('idemflow.actor', true), '')
        CHECK (actor ~ '^(token:[1-9][0-9]{0,18}|system:[a-z]{1,32})$');

COMMENT ON COLUMN idempotency_keys.actor IS
    'who claimed the key: token:<api_tokens.id>; NULL before 014_actor.sql';
COMMENT ON COLUMN workflows.actor IS
    'who created it: token:<api_tokens.id>; NULL before 014_actor.sql';
COMMENT ON COLUMN outbox.actor IS
    'who caused the event: token:<api_tokens.id>, or system:reaper for a timer; NULL before 014_actor.sql';
COMMENT ON COLUMN jobs.actor IS
    'who began the step: token:<api_tokens.id>, or system:reaper after a timer; NULL before 014_actor.sql';
COMMENT ON COLUMN messages.actor IS
    'who sent the message: token:<api_tokens.id>; NULL before 014_actor.sql';

-- As in 011_timer_isolation.sql, and what the timers cause is recorded as
-- the reaper's: the events, and the jobs of the steps they begin.
CREATE OR REPLACE FUNCTION idemflow_fire_timers(p_batch integer, OUT taken integer,
                                                OUT fired integer, OUT timed_out integer,
                                                OUT incidents integer)
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    v_outcome text;
    v_state text;
    v_msg text;
BEGIN
    PERFORM set_config('idemflow.actor', 'system:reaper', true);
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
