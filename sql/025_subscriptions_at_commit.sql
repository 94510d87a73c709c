-- 025_subscriptions_at_commit.sql: an endpoint that exists when an event
-- commits gets its delivery; one created, changed or deleted while the
-- event's transaction is open waits for that transaction to end.
--
-- 020's trigger reads the endpoints when the event's statement runs, not
-- when its transaction commits: an endpoint committed in between existed
-- at the event's commit and got no delivery, and an endpoint deleted in
-- between kept the delivery that an open transaction wrote. Now the event
-- writer takes a per-tenant advisory lock in SHARE mode before it reads
-- the endpoints, and whatever changes which events an endpoint gets
-- (INSERT, DELETE, an UPDATE of filter_types or disabled) takes it in
-- EXCLUSIVE mode, both held until the transaction ends:
--   - an endpoint change waits for the event transactions of its tenant
--     already past their read, so it commits after them: the endpoint did
--     not exist (or still did, unchanged) when they committed;
--   - an event writer that asks after the change took the lock waits for
--     it to commit, and its read, a new snapshot (READ COMMITTED: each
--     statement of the PL/pgSQL function takes one), sees the change.
-- Every writer of events runs READ COMMITTED (app/server, the reaper, the
-- dispatcher's operational events, which the trigger leaves out anyway).
--
-- The cost: one shared lock per event (the lock manager, no I/O); while an
-- endpoint change waits, the tenant's new events wait behind it, for as
-- long as the longest event transaction of that tenant then open. Other
-- tenants never wait: the key is the tenant's.

-- The lock of one tenant's subscriptions: 64 bits of a hash of a constant
-- and the tenant id, so it shares no key with "idemflow migrate"'s lock.
CREATE FUNCTION idemflow_subscriptions_lock_key(p_tenant bigint)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended('idemflow.subscriptions', p_tenant)
$$;

CREATE OR REPLACE FUNCTION idemflow_outbox_deliveries() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(idemflow_subscriptions_lock_key(NEW.tenant_id));
    INSERT INTO deliveries (tenant_id, endpoint_id, workflow_id, seq, outbox_id, state)
    SELECT NEW.tenant_id, e.id, NEW.workflow_id, NEW.seq, NEW.id,
           CASE WHEN e.disabled THEN 'skipped' ELSE 'pending' END
      FROM endpoints e
     WHERE e.tenant_id = NEW.tenant_id
       AND idemflow_type_matches(e.filter_types, NEW.type);
    RETURN NULL;
END
$$;

-- A deleted endpoint's deliveries and attempts go with it here, after the
-- lock: a delivery that an event transaction open at the DELETE wrote is
-- committed by then, and this statement's new snapshot sees it (the
-- DELETE's own statement could not). DELETE /v1/endpoints/{id} deletes
-- the ones it sees itself and counts them; these are the rest.
CREATE FUNCTION idemflow_endpoints_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_advisory_xact_lock(idemflow_subscriptions_lock_key(OLD.tenant_id));
        DELETE FROM deliveries WHERE tenant_id = OLD.tenant_id AND endpoint_id = OLD.id;
        DELETE FROM delivery_attempts WHERE tenant_id = OLD.tenant_id AND endpoint_id = OLD.id;
    ELSE
        PERFORM pg_advisory_xact_lock(idemflow_subscriptions_lock_key(NEW.tenant_id));
    END IF;
    RETURN NULL;
END
$$;

-- AFTER ... FOR EACH ROW: once per row the statement changed, at its end,
-- inside its transaction.
CREATE TRIGGER endpoints_changed AFTER INSERT OR DELETE OR UPDATE OF filter_types, disabled
    ON endpoints
    FOR EACH ROW
    EXECUTE FUNCTION idemflow_endpoints_changed();
