-- 021_delivery_record.sql: the dispatcher's side of the endpoints
-- (020_endpoints.sql): how an attempt is recorded, how an endpoint's
-- health follows, and the operational events it writes.
--
-- One call records a batch of attempts, in the order they are given:
-- each delivery still leased to the caller gets its ledger row (with the
-- trigger that asked for the attempt), its new state, and the trigger
-- back to 'scheduled'. Then its endpoint's health: a success resets the
-- count of failures in a row; a failure adds one, and an endpoint that
-- has failed both N times in a row and for a duration is disabled
-- (disabled_reason 'failing'), the decision being
-- idemflow_endpoint_should_disable(), a pure function of the time given,
-- so that a test with its own clock can show the threshold to the
-- attempt. Svix's rule is the guide: an endpoint failing for five days is
-- disabled; the count keeps an endpoint that saw one failure five days ago
-- and one now from being disabled on that alone.
--
-- The operational events go to the outbox of the endpoint's tenant, the
-- endpoint being their stream (workflow_id = the endpoint's id, seq =
-- endpoints.event_seq + 1): endpoint.disabled, delivery.exhausted (a
-- delivery went dead) and delivery.recovered (a delivery that had gone
-- dead was delivered after a recover or a resend). The trigger of 020
-- gives them no deliveries: they are the operator's, drained by the
-- configured sink.
--
-- deliveries.exhausted_at remembers that a delivery went dead, across the
-- recover or resend that makes it pending again (which resets its state,
-- attempts and trigger, not this), so that its success can say
-- delivery.recovered.

ALTER TABLE deliveries ADD COLUMN exhausted_at timestamptz;

COMMENT ON COLUMN deliveries.exhausted_at IS
    'when the delivery last went dead; cleared when it is delivered (delivery.recovered)';

-- Is an endpoint that has failed p_failures times in a row, the first of
-- them at p_failing_since, to be disabled at p_at? Both thresholds must be
-- reached.
CREATE FUNCTION idemflow_endpoint_should_disable(p_failures integer,
                                                 p_failing_since timestamptz,
                                                 p_at timestamptz, p_max_failures integer,
                                                 p_after interval)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_failing_since IS NOT NULL
       AND p_failures >= p_max_failures
       AND p_at - p_failing_since >= p_after
$$;

-- An operational event about endpoint p_endpoint of tenant p_tenant, in
-- the endpoint's own stream. Its event id is "<endpoint id>.<seq>", its
-- payload shaped as a workflow event's (workflow_id names the stream).
-- Held like a workflow's event when an earlier one of the stream is dead.
CREATE FUNCTION idemflow_endpoint_event(p_tenant bigint, p_endpoint uuid, p_type text,
                                        p_data jsonb, p_at timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_seq integer;
BEGIN
    UPDATE endpoints SET event_seq = event_seq + 1
     WHERE tenant_id = p_tenant AND id = p_endpoint
    RETURNING event_seq INTO v_seq;
    IF NOT FOUND THEN
        RETURN; -- deleted meanwhile: nobody to tell about it
    END IF;
    INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload, created_at,
                        next_attempt_at, actor)
    VALUES (p_endpoint || '.' || v_seq, p_tenant, p_endpoint, v_seq, p_type,
            jsonb_build_object('id', p_endpoint || '.' || v_seq, 'type', p_type,
                               'workflow_id', p_endpoint, 'seq', v_seq,
                               'tenant_id', p_tenant, 'occurred_at', idemflow_ts(p_at),
                               'data', p_data)::text,
            p_at,
            CASE WHEN EXISTS (SELECT 1 FROM outbox
                               WHERE tenant_id = p_tenant AND workflow_id = p_endpoint
                                 AND dead_at IS NOT NULL)
                 THEN 'infinity'::timestamptz ELSE now() END,
            'system:dispatch');
END
$$;

-- One attempt's effect on its endpoint's health, at p_at: a success
-- resets it (writing nothing when there is nothing to reset); a failure
-- counts, and disables the endpoint when idemflow_endpoint_should_disable
-- says so, writing endpoint.disabled. Returns true when this call
-- disabled the endpoint.
CREATE FUNCTION idemflow_endpoint_attempted(p_tenant bigint, p_endpoint uuid, p_ok boolean,
                                            p_at timestamptz, p_max_failures integer,
                                            p_after interval)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_failures integer;
    v_since timestamptz;
BEGIN
    IF p_ok THEN
        UPDATE endpoints SET failures = 0, failing_since = NULL
         WHERE tenant_id = p_tenant AND id = p_endpoint AND failures > 0;
        RETURN false;
    END IF;
    UPDATE endpoints SET failures = failures + 1, failing_since = coalesce(failing_since, p_at)
     WHERE tenant_id = p_tenant AND id = p_endpoint
    RETURNING failures, failing_since INTO v_failures, v_since;
    IF NOT FOUND OR NOT idemflow_endpoint_should_disable(v_failures, v_since, p_at,
                                                         p_max_failures, p_after) THEN
        RETURN false;
    END IF;
    UPDATE endpoints
       SET disabled = true, disabled_reason = 'failing', disabled_at = p_at,
           updated_at = p_at, actor = 'system:dispatch'
     WHERE tenant_id = p_tenant AND id = p_endpoint AND NOT disabled;
    IF NOT FOUND THEN
        RETURN false; -- already disabled (by hand, or by another dispatcher)
    END IF;
    PERFORM idemflow_endpoint_event(p_tenant, p_endpoint, 'endpoint.disabled',
                                    jsonb_build_object('endpoint_id', p_endpoint,
                                                       'reason', 'failing',
                                                       'failures', v_failures,
                                                       'failing_since', idemflow_ts(v_since)),
                                    p_at);
    RETURN true;
END
$$;

-- Record a batch of attempts made by lease owner p_owner, at p_at. The
-- arrays are of one length, an attempt's entries at one index. An attempt
-- whose delivery is no longer leased to p_owner (its lease ran out and
-- another dispatcher took it) is not recorded: that one records its own.
-- Returns the attempts recorded and the endpoints this call disabled.
CREATE FUNCTION idemflow_deliveries_record(p_owner text, p_at timestamptz,
                                           p_tenant bigint[], p_endpoint uuid[],
                                           p_workflow uuid[], p_seq integer[],
                                           p_event_id text[], p_started timestamptz[],
                                           p_duration_ms double precision[],
                                           p_status integer[], p_outcome text[],
                                           p_response text[], p_error text[],
                                           p_delay_ms bigint[], p_dead boolean[],
                                           p_max_failures integer, p_after interval,
                                           OUT recorded integer, OUT disabled integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_trigger text;
    v_attempts integer;
    v_exhausted timestamptz;
    v_ok boolean;
    v_state text;
BEGIN
    recorded := 0;
    disabled := 0;
    FOR i IN 1 .. coalesce(array_length(p_tenant, 1), 0) LOOP
        SELECT d.trigger, d.attempts, d.exhausted_at INTO v_trigger, v_attempts, v_exhausted
          FROM deliveries d
         WHERE d.tenant_id = p_tenant[i] AND d.endpoint_id = p_endpoint[i]
           AND d.workflow_id = p_workflow[i] AND d.seq = p_seq[i]
           AND d.lease_owner = p_owner
           FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        v_ok := p_outcome[i] = 'succeeded';
        v_state := CASE WHEN v_ok THEN 'delivered' WHEN p_dead[i] THEN 'dead' ELSE 'pending' END;
        INSERT INTO delivery_attempts (tenant_id, endpoint_id, workflow_id, seq, event_id,
                                       trigger, started_at, duration_ms, status, outcome,
                                       response)
        VALUES (p_tenant[i], p_endpoint[i], p_workflow[i], p_seq[i], p_event_id[i],
                v_trigger, p_started[i], greatest(p_duration_ms[i], 0), p_status[i],
                p_outcome[i], p_response[i]);
        UPDATE deliveries d
           SET state = v_state,
               next_attempt_at = CASE WHEN v_state = 'pending'
                                      THEN p_at + p_delay_ms[i] * interval '1 millisecond'
                                      ELSE d.next_attempt_at END,
               last_error = CASE WHEN v_ok THEN NULL ELSE p_error[i] END,
               trigger = 'scheduled', lease_owner = NULL, lease_until = NULL,
               exhausted_at = CASE WHEN v_ok THEN NULL
                                   WHEN v_state = 'dead' THEN p_at
                                   ELSE d.exhausted_at END,
               updated_at = p_at
         WHERE d.tenant_id = p_tenant[i] AND d.endpoint_id = p_endpoint[i]
           AND d.workflow_id = p_workflow[i] AND d.seq = p_seq[i];
        recorded := recorded + 1;
        IF idemflow_endpoint_attempted(p_tenant[i], p_endpoint[i], v_ok, p_at, p_max_failures,
                                       p_after) THEN
            disabled := disabled + 1;
        END IF;
        IF v_state = 'dead' THEN
            PERFORM idemflow_endpoint_event(
                p_tenant[i], p_endpoint[i], 'delivery.exhausted',
                jsonb_build_object('endpoint_id', p_endpoint[i], 'event_id', p_event_id[i],
                                   'workflow_id', p_workflow[i], 'seq', p_seq[i],
                                   'attempts', v_attempts, 'last_error', p_error[i]),
                p_at);
        ELSIF v_ok AND v_exhausted IS NOT NULL THEN
            PERFORM idemflow_endpoint_event(
                p_tenant[i], p_endpoint[i], 'delivery.recovered',
                jsonb_build_object('endpoint_id', p_endpoint[i], 'event_id', p_event_id[i],
                                   'workflow_id', p_workflow[i], 'seq', p_seq[i],
                                   'trigger', v_trigger, 'exhausted_at',
                                   idemflow_ts(v_exhausted)),
                p_at);
        END IF;
    END LOOP;
END
$$;
