-- 013_limits.sql: bounds and serializations that were missing.
--
-- 1. A job activation bounded by max_answer (idemflow_jobs_activate).
-- 2. A heartbeat and the reap serialized on the job's row (idemflow_job_lock).
-- 3. Kept messages' ttl capped (idemflow_message_publish), fired timers pruned.
--
-- POST /v1/jobs/activate hands out at most max_jobs (100) jobs, each with
-- its workflow's input (up to max_body, 1 MiB): one answer could reach
-- hundreds of MiB, built in a worker and stored under the key. The new
-- idemflow_jobs_activate takes a byte budget (the server's max_answer) and
-- stops before the job that would take the answer past it; the first job
-- is always handed out, as a page's first item is always shown. A job not
-- handed out is not touched: it stays activatable (or active under its
-- lease) for the next call. When the budget stopped it, the function ends
-- with one more row, all NULL but detail = 'max_answer', which the server
-- turns into "truncated": true. A job's size is counted from the stored
-- texts (the workflow's input as jsonb prints it, which is never shorter
-- than its canonical form, the job's name, type, error and trace state, the
-- worker) plus 512 bytes for the members around them.
--
-- The old five-argument function stays for the workers of the previous
-- release until they are replaced (sql/README.md, rule 4).

CREATE FUNCTION idemflow_jobs_activate(p_tenant bigint, p_type text, p_worker text,
                                       p_max integer, p_lease interval, p_budget bigint)
RETURNS SETOF idemflow_job_row LANGUAGE plpgsql AS $$
DECLARE
    c record;
    j jobs;
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
        IF used > 0 AND used + c.size > p_budget THEN
            RETURN NEXT idemflow_job_problem(NULL, 'max_answer');
            RETURN;
        END IF;
        used := used + c.size;
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

-- A heartbeat racing idemflow reap at the end of a lease. idemflow_job_lock
-- locked the workflow but only read the job, and idemflow_reap takes the
-- job's row alone. A heartbeat begun before the deadline read the job as
-- active, waited in its UPDATE for a reap that had taken the row meanwhile,
-- then extended the reaped job: 200, yet the job activatable and the next
-- complete refused (lease-expired). The job's row is now locked here too,
-- after the workflow's (the order every command takes), so the heartbeat,
-- complete and fail serialize with the reap on it: whichever comes second
-- sees what the first did. Replaced whole, same signature.
CREATE OR REPLACE FUNCTION idemflow_job_lock(p_tenant bigint, p_wf uuid, p_step integer,
                                             p_worker text, OUT j jobs, OUT problem text,
                                             OUT detail text)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM workflows WHERE tenant_id = p_tenant AND id = p_wf FOR UPDATE;
    SELECT * INTO j FROM jobs
     WHERE tenant_id = p_tenant AND workflow_id = p_wf AND step = p_step AND job_type IS NOT NULL
       FOR UPDATE;
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

-- 3. Storage a tenant cannot grow for years. A message kept by business
-- key could live as long as a duration may say (about ten years): the
-- publication now takes the server's message_ttl_max (30 days by default)
-- and refuses a longer ttl (invalid-duration) before anything is written;
-- the six-argument function stays for the previous release's workers.
-- Fired timers were never deleted: idemflow prune now deletes those fired
-- before outbox_retention, found through timers_fired.
CREATE FUNCTION idemflow_message_publish(p_tenant bigint, p_message_id text, p_name text,
                                         p_key text, p_ttl interval, p_payload text,
                                         p_ttl_max interval)
RETURNS TABLE (problem text, detail text, outcome text, workflow_id uuid, step integer,
               expires_at text)
LANGUAGE plpgsql AS $$
BEGIN
    IF p_ttl > p_ttl_max THEN
        RETURN QUERY SELECT 'invalid-duration'::text,
            format('"ttl" %s is longer than the longest a message is kept (%s); nothing was kept',
                   p_ttl, p_ttl_max),
            NULL::text, NULL::uuid, NULL::integer, NULL::text;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM idemflow_message_publish(p_tenant, p_message_id, p_name, p_key,
                                                        p_ttl, p_payload);
END
$$;

CREATE INDEX timers_fired ON timers (fired_at) WHERE fired_at IS NOT NULL;
