-- 030_tenant_move.sql: what a partition needs to hand one tenant to
-- another partition ("idemflow tenant move", doc/distribution.md,
-- "Moving a tenant").
--
-- A tenant's rows keep their ids when they move, so every id a tenant's
-- rows draw from a sequence must be unique across the partitions, not
-- only the tenants' and tokens' ids (024): idemflow_partition_ids now
-- moves the outbox's and the attempt ledger's sequences to the
-- partition's range too.
--
-- The fence: a tenant listed in frozen_tenants takes no write of an event
-- on this partition. The check runs in the event trigger after the
-- tenant's subscriptions lock in SHARE mode (025), and the freeze
-- (idemflow_tenant_freeze) takes that lock in EXCLUSIVE mode, so:
--   - the freeze waits for every event transaction of the tenant already
--     past its lock, which commits (or not) before the freeze does, and
--     before the copy's snapshot, which comes after the freeze;
--   - an event transaction that asks for the lock after the freeze took
--     it waits for the freeze to commit, and its check, a new snapshot
--     (READ COMMITTED), sees the tenant frozen: it fails whole (SQLSTATE
--     IDFMV), nothing of it committed.
-- Every state change of a workflow writes its event in its transaction,
-- so every such change is fenced: a key and its workflow, a timer fired,
-- a job completed or failed, a message taken, an endpoint created,
-- changed or deleted (its trigger takes the same lock). A write without
-- an event calls idemflow_tenant_fence first to be fenced. The dispatcher, the reaper and the
-- timers skip a frozen tenant's rows (the claims, idemflow_reap,
-- idemflow_due_timers), and the directory's sync does not see its tokens
-- (idemflow_partition_tokens): during a move the tenant is on two
-- partitions, frozen on both until the proxy names the new one.
--
-- The move's own transactions (the copy on the target, the delete on the
-- source) set idemflow.move_tenant to the tenant's id: the triggers then
-- neither check the fence nor write deliveries, which are copied.

CREATE TABLE frozen_tenants (
    tenant_id bigint PRIMARY KEY,
    frozen_at timestamptz NOT NULL DEFAULT now(),
    -- 'source' or 'target': which end of a move this partition is.
    role text NOT NULL CHECK (role IN ('source', 'target')),
    -- the other end's partition number
    peer integer NOT NULL CHECK (peer >= 0)
);

COMMENT ON TABLE frozen_tenants IS
    'tenants being moved to or from this partition: no event of theirs is written (030_tenant_move.sql)';

-- A partition's ids: tenants, tokens, events and delivery attempts draw
-- from the partition's own range (p_partition * 2^48 upwards). Only
-- raises the sequences, so running it again is safe; on a partition set
-- up before this migration it moves the two new ones into the range (the
-- rows already written keep their ids: see idemflow_partition_ids_in_range).
CREATE OR REPLACE FUNCTION idemflow_partition_ids(p_partition integer)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_base bigint := p_partition::bigint << 48;
BEGIN
    IF p_partition < 0 OR p_partition > 32767 THEN
        RAISE EXCEPTION 'partition % is out of range (0 to 32767)', p_partition
            USING ERRCODE = '22023';
    END IF;
    IF p_partition = 0 THEN
        RETURN;
    END IF;
    PERFORM setval('tenants_id_seq', v_base) WHERE nextval('tenants_id_seq') < v_base;
    PERFORM setval('api_tokens_id_seq', v_base) WHERE nextval('api_tokens_id_seq') < v_base;
    PERFORM setval('outbox_id_seq', v_base) WHERE nextval('outbox_id_seq') < v_base;
    PERFORM setval('delivery_attempts_id_seq', v_base)
      WHERE nextval('delivery_attempts_id_seq') < v_base;
END;
$$;

-- True when this partition's sequences draw their next ids from the
-- range of partition p_partition: what a move checks on the target
-- before it copies a row there (the rows it holds may carry ids of other
-- ranges: a tenant moved in keeps its ids). False on a partition whose
-- ranges were never set (idemflow_partition_ids).
CREATE FUNCTION idemflow_partition_ids_in_range(p_partition integer)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT bool_and(r.v >= greatest(p_partition::bigint << 48, 1)
                    AND r.v < (p_partition::bigint + 1) << 48)
      FROM (SELECT last_value AS v FROM tenants_id_seq
            UNION ALL SELECT last_value FROM api_tokens_id_seq
            UNION ALL SELECT last_value FROM outbox_id_seq
            UNION ALL SELECT last_value FROM delivery_attempts_id_seq) r;
$$;

-- The last id each sequence drew (or will draw first): the target's
-- answer to idemflow_tenant_ids_fit on the source.
CREATE FUNCTION idemflow_partition_ids_last(OUT tenants bigint, OUT api_tokens bigint,
                                            OUT outbox bigint, OUT delivery_attempts bigint)
LANGUAGE sql STABLE AS $$
    SELECT (SELECT last_value FROM tenants_id_seq), (SELECT last_value FROM api_tokens_id_seq),
           (SELECT last_value FROM outbox_id_seq),
           (SELECT last_value FROM delivery_attempts_id_seq);
$$;

-- True when no id of the tenant's rows here is one that partition
-- p_partition will still draw: none in its range above the last id its
-- sequence drew (p_*_last, from idemflow_partition_ids_last there). An id
-- of another range is never drawn there; one of its range at or below
-- the last was drawn there before, by this tenant's own rows (a tenant
-- moving back), and a collision with a row it holds fails the copy.
CREATE FUNCTION idemflow_tenant_ids_fit(p_tenant bigint, p_partition integer,
                                        p_tenants_last bigint, p_tokens_last bigint,
                                        p_outbox_last bigint, p_attempts_last bigint)
RETURNS boolean LANGUAGE sql STABLE AS $$
    WITH r (lo, hi) AS (SELECT p_partition::bigint << 48, (p_partition::bigint + 1) << 48)
    SELECT NOT EXISTS (SELECT 1 FROM tenants, r
                        WHERE id = p_tenant AND id >= lo AND id < hi AND id > p_tenants_last)
       AND NOT EXISTS (SELECT 1 FROM api_tokens, r
                        WHERE tenant_id = p_tenant AND id >= lo AND id < hi
                          AND id > p_tokens_last)
       AND NOT EXISTS (SELECT 1 FROM outbox, r
                        WHERE tenant_id = p_tenant AND id >= lo AND id < hi
                          AND id > p_outbox_last)
       AND NOT EXISTS (SELECT 1 FROM delivery_attempts, r
                        WHERE tenant_id = p_tenant AND id >= lo AND id < hi
                          AND id > p_attempts_last);
$$;

-- As in 025_subscriptions_at_commit.sql, and the fence: an event of a
-- frozen tenant is refused after the lock; the move's copy writes none.
CREATE OR REPLACE FUNCTION idemflow_outbox_deliveries() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('idemflow.move_tenant', true) = NEW.tenant_id::text THEN
        RETURN NULL;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(idemflow_subscriptions_lock_key(NEW.tenant_id));
    IF EXISTS (SELECT 1 FROM frozen_tenants f WHERE f.tenant_id = NEW.tenant_id) THEN
        RAISE EXCEPTION 'tenant % is being moved to another partition', NEW.tenant_id
            USING ERRCODE = 'IDFMV', HINT = 'retry the same request later';
    END IF;
    INSERT INTO deliveries (tenant_id, endpoint_id, workflow_id, seq, outbox_id, state)
    SELECT NEW.tenant_id, e.id, NEW.workflow_id, NEW.seq, NEW.id,
           CASE WHEN e.disabled THEN 'skipped' ELSE 'pending' END
      FROM endpoints e
     WHERE e.tenant_id = NEW.tenant_id
       AND idemflow_type_matches(e.filter_types, NEW.type);
    RETURN NULL;
END
$$;

-- As in 025_subscriptions_at_commit.sql, and the fence: an endpoint of a
-- frozen tenant is neither created, changed nor deleted.
CREATE OR REPLACE FUNCTION idemflow_endpoints_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_tenant bigint := CASE WHEN TG_OP = 'DELETE' THEN OLD.tenant_id ELSE NEW.tenant_id END;
BEGIN
    PERFORM pg_advisory_xact_lock(idemflow_subscriptions_lock_key(v_tenant));
    IF coalesce(current_setting('idemflow.move_tenant', true), '') <> v_tenant::text
       AND EXISTS (SELECT 1 FROM frozen_tenants f WHERE f.tenant_id = v_tenant) THEN
        RAISE EXCEPTION 'tenant % is being moved to another partition', v_tenant
            USING ERRCODE = 'IDFMV', HINT = 'retry the same request later';
    END IF;
    IF TG_OP = 'DELETE' THEN
        DELETE FROM deliveries WHERE tenant_id = OLD.tenant_id AND endpoint_id = OLD.id;
        DELETE FROM delivery_attempts WHERE tenant_id = OLD.tenant_id AND endpoint_id = OLD.id;
    END IF;
    RETURN NULL;
END
$$;

-- As in 005_runs.sql, and a frozen tenant's jobs are left alone: its
-- rows are being copied, and the copy is what stays.
CREATE OR REPLACE FUNCTION idemflow_reap(p_batch integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    WITH due AS (
        SELECT tenant_id, workflow_id, step FROM jobs
         WHERE state = 'active' AND due_at <= now()
           AND NOT EXISTS (SELECT 1 FROM frozen_tenants f WHERE f.tenant_id = jobs.tenant_id)
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

-- As in 011_timer_isolation.sql, and a frozen tenant's timers wait: they
-- fire on the partition the tenant moves to (or stays on).
CREATE OR REPLACE FUNCTION idemflow_due_timers(p_batch integer)
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
                    WHERE x.tenant_id = tn.id AND x.fired_at IS NULL AND x.due_at <= now())
       AND NOT EXISTS (SELECT 1 FROM frozen_tenants f WHERE f.tenant_id = tn.id);
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
     WHERE NOT EXISTS (SELECT 1 FROM frozen_tenants f WHERE f.tenant_id = tn.id)
       FOR UPDATE OF w SKIP LOCKED;
END
$$;

-- As in 024_partition_functions.sql, without the frozen tenants: the
-- directory's sync sees a moving tenant on neither partition, and leaves
-- its entry to the move.
CREATE OR REPLACE FUNCTION idemflow_partition_tokens(p_partition integer)
RETURNS TABLE (token_hash bytea, tenant_id bigint)
LANGUAGE sql STABLE AS $$
    SELECT t.token_hash, t.tenant_id
      FROM api_tokens t
     WHERE NOT EXISTS (SELECT 1 FROM frozen_tenants f WHERE f.tenant_id = t.tenant_id);
$$;

-- The fence for a write that writes no event (a job's activation or
-- heartbeat, a message kept for later, a key stored without an event):
-- a partition function that routes such a command through the proxy
-- calls this first, in its transaction, and is then fenced as an event
-- writer is. Raises IDFMV when the tenant is frozen here.
CREATE FUNCTION idemflow_tenant_fence(p_tenant bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(idemflow_subscriptions_lock_key(p_tenant));
    IF EXISTS (SELECT 1 FROM frozen_tenants f WHERE f.tenant_id = p_tenant) THEN
        RAISE EXCEPTION 'tenant % is being moved to another partition', p_tenant
            USING ERRCODE = 'IDFMV', HINT = 'retry the same request later';
    END IF;
END;
$$;

-- Freeze a tenant on this partition: wait for its event transactions
-- under way, then refuse its events (the fence above). p_role is this
-- partition's end of the move, p_peer the other's number. Safe to repeat.
CREATE FUNCTION idemflow_tenant_freeze(p_tenant bigint, p_role text, p_peer integer)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(idemflow_subscriptions_lock_key(p_tenant));
    INSERT INTO frozen_tenants (tenant_id, role, peer)
    VALUES (p_tenant, p_role, p_peer)
        ON CONFLICT (tenant_id) DO NOTHING;
END;
$$;

-- The tenant's rows per table, by name, for the move's check of its copy.
CREATE FUNCTION idemflow_tenant_counts(p_tenant bigint)
RETURNS TABLE (tbl text, n bigint)
LANGUAGE sql STABLE AS $$
    SELECT 'tenants', count(*) FROM tenants WHERE id = p_tenant
    UNION ALL SELECT 'api_tokens', count(*) FROM api_tokens WHERE tenant_id = p_tenant
    UNION ALL SELECT 'endpoints', count(*) FROM endpoints WHERE tenant_id = p_tenant
    UNION ALL SELECT 'workflows', count(*) FROM workflows WHERE tenant_id = p_tenant
    UNION ALL SELECT 'jobs', count(*) FROM jobs WHERE tenant_id = p_tenant
    UNION ALL SELECT 'messages', count(*) FROM messages WHERE tenant_id = p_tenant
    UNION ALL SELECT 'timers', count(*) FROM timers WHERE tenant_id = p_tenant
    UNION ALL SELECT 'idempotency_keys', count(*) FROM idempotency_keys
                                          WHERE tenant_id = p_tenant
    UNION ALL SELECT 'idempotency_key_stats', count(*) FROM idempotency_key_stats
                                               WHERE tenant_id = p_tenant
    UNION ALL SELECT 'outbox', count(*) FROM outbox WHERE tenant_id = p_tenant
    UNION ALL SELECT 'deliveries', count(*) FROM deliveries WHERE tenant_id = p_tenant
    UNION ALL SELECT 'delivery_attempts', count(*) FROM delivery_attempts
                                           WHERE tenant_id = p_tenant;
$$;

-- Delete every row of a tenant on this partition, its fence last: the
-- source's end of a move once the proxy names the target, or the target's
-- when a move is undone. Returns the rows deleted.
CREATE FUNCTION idemflow_tenant_delete(p_tenant bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_n bigint := 0;
    v_rows bigint;
BEGIN
    PERFORM set_config('idemflow.move_tenant', p_tenant::text, true);
    DELETE FROM delivery_attempts WHERE tenant_id = p_tenant;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    v_n := v_n + v_rows;
    DELETE FROM deliveries WHERE tenant_id = p_tenant;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    v_n := v_n + v_rows;
    DELETE FROM outbox WHERE tenant_id = p_tenant;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    v_n := v_n + v_rows;
    DELETE FROM idempotency_key_stats WHERE tenant_id = p_tenant;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    v_n := v_n + v_rows;
    DELETE FROM idempotency_keys WHERE tenant_id = p_tenant;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    v_n := v_n + v_rows;
    DELETE FROM timers WHERE tenant_id = p_tenant;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    v_n := v_n + v_rows;
    DELETE FROM messages WHERE tenant_id = p_tenant;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    v_n := v_n + v_rows;
    DELETE FROM jobs WHERE tenant_id = p_tenant;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    v_n := v_n + v_rows;
    DELETE FROM workflows WHERE tenant_id = p_tenant;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    v_n := v_n + v_rows;
    DELETE FROM endpoints WHERE tenant_id = p_tenant;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    v_n := v_n + v_rows;
    DELETE FROM api_tokens WHERE tenant_id = p_tenant;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    v_n := v_n + v_rows;
    DELETE FROM tenants WHERE id = p_tenant;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    v_n := v_n + v_rows;
    DELETE FROM frozen_tenants WHERE tenant_id = p_tenant;
    RETURN v_n;
END;
$$;
