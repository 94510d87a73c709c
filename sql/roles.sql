-- roles.sql: database roles with only the privileges each program uses.
--
-- Not a migration: "idemflow migrate" never runs it. Run it with psql as the
-- role that owns the schema (the one that runs "idemflow migrate"), after the
-- first migration and again after every upgrade; it can run any number of
-- times:
--
--   psql -v ON_ERROR_STOP=1 -d idemflow -f /usr/share/idemflow/sql/roles.sql
--
-- It creates three group roles, without LOGIN, when they are missing (that
-- takes CREATEROLE; without it, have them created first):
--
--   idemflow_server       what idemflow-fcgi's statements use
--   idemflow_dispatcher   what idemflow-dispatch's statements use
--   idemflow_maintenance  what the cron jobs "idemflow prune" and
--                         "idemflow reap" use, and "idemflow audit"
--                         (it only reads: keys, workflows, outbox,
--                         timers, jobs, and the tenants' names)
--
-- and grants each exactly that, table by table and, where a program reads or
-- writes only some columns, column by column. Each program then logs in as a
-- role of its own that is a member of its group, e.g.
--
--   CREATE ROLE idemflow_web LOGIN PASSWORD '...' IN ROLE idemflow_server;
--   CREATE ROLE idemflow_cron LOGIN PASSWORD '...' IN ROLE idemflow_dispatcher;
--   CREATE ROLE idemflow_maint LOGIN PASSWORD '...' IN ROLE idemflow_maintenance;
--
-- the names the shipped pg_service.conf gives each program's service (the
-- systemd unit and the cron jobs set PGSERVICE). No group owns anything, so
-- none can change the schema (no CREATE, ALTER, DROP, TRUNCATE), and none
-- can touch tenants or tokens: those, migrations and requeue stay with the
-- owner, through the idemflow CLI.
--
-- The identity columns (tenants.id, api_tokens.id, outbox.id) draw from their
-- sequences without USAGE on them, so no sequence is granted. A serial
-- column, if one ever comes, needs USAGE on its sequence here.
--
-- A migration that adds a table, or a statement that uses a table or column
-- in a new way, adds its grant here in the same change: t/db/test_roles.c runs
-- every route of the server, the dispatcher, and prune and reap (with leases,
-- timers and messages to handle) as these roles, and fails on a permission
-- error or on any table that neither group has a decision for.

\set ON_ERROR_STOP on

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'idemflow_server') THEN
        CREATE ROLE idemflow_server NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'idemflow_dispatcher') THEN
        CREATE ROLE idemflow_dispatcher NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'idemflow_maintenance') THEN
        CREATE ROLE idemflow_maintenance NOLOGIN;
    END IF;
END
$$;

BEGIN;

-- Start from nothing, so a privilege dropped from this file is revoked on
-- the next run too.
REVOKE ALL ON ALL TABLES IN SCHEMA public
    FROM idemflow_server, idemflow_dispatcher, idemflow_maintenance;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA public
    FROM idemflow_server, idemflow_dispatcher, idemflow_maintenance;
DO $$
DECLARE
    t record;
BEGIN
    -- Column grants are not covered by REVOKE ... ON ALL TABLES.
    FOR t IN SELECT DISTINCT table_name, grantee FROM information_schema.column_privileges
              WHERE table_schema = 'public'
                AND grantee IN ('idemflow_server', 'idemflow_dispatcher',
                                'idemflow_maintenance')
    LOOP
        EXECUTE format('REVOKE ALL (%s) ON %I FROM %I',
                       (SELECT string_agg(quote_ident(column_name), ', ')
                          FROM information_schema.columns
                         WHERE table_schema = 'public' AND table_name = t.table_name),
                       t.table_name, t.grantee);
    END LOOP;
END
$$;

GRANT USAGE ON SCHEMA public TO idemflow_server, idemflow_dispatcher, idemflow_maintenance;

-- idemflow-fcgi (app/server/queries.c).
-- GET /readyz reads the schema version.
GRANT SELECT ON schema_migrations TO idemflow_server;
-- Authentication: the token's digest to its tenant, and its id, which the
-- rows a request writes record as their actor (sql/014_actor.sql); never
-- the other columns.
GRANT SELECT (id, token_hash, tenant_id, revoked_at) ON api_tokens TO idemflow_server;
-- The create statement reads the tenant's key TTL; not its name.
GRANT SELECT (id, idempotency_ttl) ON tenants TO idemflow_server;
-- Keys are claimed, read, and deleted when expired and taken over.
GRANT SELECT, INSERT, DELETE ON idempotency_keys TO idemflow_server;
-- Replay and conflict counts: an upsert, and deleted with their key.
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_key_stats TO idemflow_server;
GRANT SELECT, INSERT ON workflows TO idemflow_server;
-- Commands on running workflows (sql/005_runs.sql, run as the caller):
-- the state, the current step and the event sequence change; the type, the
-- input, the steps and the business key never do.
GRANT UPDATE (state, step, last_seq, ended_at, updated_at) ON workflows TO idemflow_server;
GRANT SELECT, INSERT, UPDATE ON jobs TO idemflow_server;
GRANT SELECT, INSERT ON messages TO idemflow_server;
GRANT UPDATE (workflow_id, step) ON messages TO idemflow_server;
GRANT SELECT, INSERT, UPDATE, DELETE ON timers TO idemflow_server;
-- A command's answer is stored on its claimed key in its transaction.
GRANT UPDATE (status, headers, body) ON idempotency_keys TO idemflow_server;
-- Events are written with their workflow; /metrics counts pending and dead.
GRANT SELECT, INSERT ON outbox TO idemflow_server;

-- idemflow-dispatch (app/dispatch/dispatch.c): claims, leases and outcomes of events,
-- and nothing else; it cannot change an event's payload or type.
GRANT SELECT ON outbox TO idemflow_dispatcher;
GRANT UPDATE (lease_owner, lease_until, attempts, published_at, last_error, next_attempt_at,
              dead_at) ON outbox TO idemflow_dispatcher;

-- idemflow prune and idemflow reap (app/cli/prune.c, sql/005_runs.sql's
-- idemflow_reap): expired keys with their counts, and delivered events
-- past retention, are deleted; expired job leases are handed back. Prune
-- deletes by ctid, a system column that only a table-wide SELECT covers;
-- rows are picked FOR UPDATE, which PostgreSQL allows only with UPDATE on
-- some column: the least useful one of each table.
GRANT SELECT, DELETE ON idempotency_keys TO idemflow_maintenance;
GRANT UPDATE (expires_at) ON idempotency_keys TO idemflow_maintenance;
GRANT SELECT (tenant_id, key), DELETE ON idempotency_key_stats TO idemflow_maintenance;
GRANT SELECT, DELETE ON outbox TO idemflow_maintenance;
GRANT UPDATE (last_error) ON outbox TO idemflow_maintenance;
GRANT SELECT (tenant_id, workflow_id, step, state, due_at) ON jobs TO idemflow_maintenance;
GRANT UPDATE (state, due_at, updated_at) ON jobs TO idemflow_maintenance;
-- reap fires timers (sql/010_timers.sql): the workflow moves on to its next
-- step, writing its events; prune deletes expired unclaimed messages.
GRANT SELECT, INSERT, UPDATE, DELETE ON timers TO idemflow_maintenance;
-- A batch of timers is shared among the tenants that have due ones
-- (sql/011_timer_isolation.sql): their ids; "idemflow audit" reports
-- tenants by name and takes --tenant NAME.
GRANT SELECT (id, name) ON tenants TO idemflow_maintenance;
GRANT SELECT ON workflows TO idemflow_maintenance;
GRANT UPDATE (state, step, last_seq, ended_at, updated_at) ON workflows TO idemflow_maintenance;
GRANT SELECT, INSERT ON jobs TO idemflow_maintenance;
GRANT UPDATE (output, error) ON jobs TO idemflow_maintenance;
GRANT INSERT ON outbox TO idemflow_maintenance;
GRANT SELECT, DELETE ON messages TO idemflow_maintenance;
-- prune deletes ended workflows past workflow_retention (a tenant's own, or
-- the CLI's) with their jobs, timers, messages and events
-- (sql/019_workflow_retention.sql).
GRANT SELECT (workflow_retention) ON tenants TO idemflow_maintenance;
GRANT UPDATE (updated_at), DELETE ON workflows TO idemflow_maintenance;
GRANT DELETE ON jobs TO idemflow_maintenance;
GRANT UPDATE (workflow_id, step) ON messages TO idemflow_maintenance;

-- Tenant endpoints (sql/020_endpoints.sql). Whoever writes an event writes
-- its deliveries in the same transaction (the trigger on outbox runs as
-- the writer): the server and the maintenance role (timers) read the
-- endpoints and insert deliveries.
GRANT SELECT ON endpoints TO idemflow_server, idemflow_maintenance;
GRANT INSERT ON deliveries TO idemflow_server, idemflow_maintenance;
-- The routes read the deliveries and the attempt ledger.
GRANT SELECT ON deliveries, delivery_attempts TO idemflow_server;
-- The dispatcher claims deliveries, records their outcomes and every
-- attempt, and keeps each endpoint's health.
GRANT SELECT ON endpoints, deliveries TO idemflow_dispatcher;
GRANT UPDATE (state, attempts, next_attempt_at, trigger, lease_owner, lease_until,
              last_error, updated_at) ON deliveries TO idemflow_dispatcher;
GRANT INSERT ON delivery_attempts TO idemflow_dispatcher;
-- The /v1/endpoints routes: a tenant creates, changes and deletes its
-- endpoints and rotates their secrets; a delete takes the endpoint's
-- deliveries and attempts with it.
GRANT INSERT, UPDATE, DELETE ON endpoints TO idemflow_server;
GRANT DELETE ON deliveries, delivery_attempts TO idemflow_server;

-- Recover and resend (sql/022_recover.sql): the server's routes and the
-- CLI's "endpoint recover" and "event resend" set deliveries pending
-- again, each in one UPDATE.
GRANT UPDATE (state, attempts, next_attempt_at, trigger, lease_owner, lease_until,
              updated_at) ON deliveries TO idemflow_server, idemflow_maintenance;

-- The dispatcher's record of an attempt (sql/021_delivery_record.sql):
-- an endpoint's health, its auto-disable, and the operational events it
-- writes about the endpoint (endpoint.disabled, delivery.exhausted,
-- delivery.recovered) into the outbox, the endpoint's own stream.
GRANT UPDATE (failures, failing_since, disabled, disabled_reason, disabled_at, updated_at,
              actor, event_seq) ON endpoints TO idemflow_dispatcher;
GRANT UPDATE (exhausted_at) ON deliveries TO idemflow_dispatcher;
GRANT INSERT ON outbox TO idemflow_dispatcher;
-- prune deletes an event's deliveries and their attempts with it, and
-- keeps an event while a delivery of it is pending or dead (app/cli/prune.c).
GRANT SELECT, DELETE ON deliveries, delivery_attempts TO idemflow_maintenance;

-- The fence of a tenant being moved (sql/030_tenant_move.sql): whoever
-- writes an event reads it (the trigger runs as the writer), the
-- dispatcher's claims and reap's skip a frozen tenant. Freezing, copying
-- and deleting a tenant stay with the owner ("idemflow tenant move").
GRANT SELECT ON frozen_tenants TO idemflow_server, idemflow_dispatcher, idemflow_maintenance;

COMMIT;
