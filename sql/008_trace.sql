-- 008_trace.sql: the trace a request belongs to stays with the work it
-- caused (W3C Trace Context).
--
-- A workflow, a job and an outbox event keep the traceparent that the
-- request which made them passes on (version 00: the request's trace id,
-- its own span id as the parent, its flags) and the caller's tracestate,
-- so that a job activation, a webhook, an AMQP message or a command
-- continues that trace. The trace id is characters 4 to 35 of the
-- traceparent.
--
-- The commands' functions (005_runs.sql) insert jobs and events in many
-- places; rather than a trace argument on each of them, the server sets
-- idemflow.traceparent and idemflow.tracestate for the command's
-- transaction (set_config(..., true)) and the columns take them as their
-- default. A statement that names the columns (the plain create) passes
-- them itself. Rows made before this migration, by an older server, or
-- outside a request (idemflow reap) have NULL.

ALTER TABLE workflows
    ADD COLUMN traceparent text
        DEFAULT nullif(current_setting('idemflow.traceparent', true), '')
        CHECK (octet_length(traceparent) = 55),
    ADD COLUMN tracestate text
        DEFAULT nullif(current_setting('idemflow.tracestate', true), '')
        CHECK (octet_length(tracestate) <= 512);

ALTER TABLE jobs
    ADD COLUMN traceparent text
        DEFAULT nullif(current_setting('idemflow.traceparent', true), '')
        CHECK (octet_length(traceparent) = 55),
    ADD COLUMN tracestate text
        DEFAULT nullif(current_setting('idemflow.tracestate', true), '')
        CHECK (octet_length(tracestate) <= 512);

ALTER TABLE outbox
    ADD COLUMN traceparent text
        DEFAULT nullif(current_setting('idemflow.traceparent', true), '')
        CHECK (octet_length(traceparent) = 55),
    ADD COLUMN tracestate text
        DEFAULT nullif(current_setting('idemflow.tracestate', true), '')
        CHECK (octet_length(tracestate) <= 512);

COMMENT ON COLUMN workflows.traceparent IS
    'W3C traceparent passed on from the request that created it; NULL when none';
COMMENT ON COLUMN jobs.traceparent IS
    'W3C traceparent passed on from the request that began the step; NULL when none';
COMMENT ON COLUMN outbox.traceparent IS
    'W3C traceparent sent with the event; NULL when none';
COMMENT ON COLUMN workflows.tracestate IS 'the caller''s W3C tracestate, passed on as received';
COMMENT ON COLUMN jobs.tracestate IS 'the caller''s W3C tracestate, passed on as received';
COMMENT ON COLUMN outbox.tracestate IS 'the caller''s W3C tracestate, passed on as received';
