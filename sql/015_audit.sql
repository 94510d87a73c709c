-- 015_audit.sql: the time window of "idemflow audit" (app/cli/audit.c).
--
-- The audit checks the keys and the workflows created since a moment
-- (--since, 24 hours by default), tenant by tenant. Neither table had an
-- index that starts with the tenant and then the creation time: a window
-- read the whole table, 5 million rows for 5 million keys, however short
-- the window. With these, a window reads only its own rows: the audit
-- runs one statement per tenant (tenant_id = $1 and created_at at or
-- after the window's start), which is also how it would run on a
-- database distributed by tenant_id.
--
-- Each costs one more index entry per key and per workflow on the create
-- path; created_at grows with time, so within a tenant inserts land on
-- the rightmost page, like idempotency_keys_expires (003_ops.sql).
--
-- A migration runs in one transaction, so these are built without
-- CONCURRENTLY, and the build holds back writes to the table while it
-- runs (doc/performance.md, "The audit", has the time for 5 million rows).
-- On a large database, build them first by hand, under the same names:
--
--   CREATE INDEX CONCURRENTLY idempotency_keys_created
--       ON idempotency_keys (tenant_id, created_at);
--   CREATE INDEX CONCURRENTLY workflows_created ON workflows (tenant_id, created_at);
--
-- and this migration finds them there (IF NOT EXISTS).

CREATE INDEX IF NOT EXISTS idempotency_keys_created ON idempotency_keys (tenant_id, created_at);

CREATE INDEX IF NOT EXISTS workflows_created ON workflows (tenant_id, created_at);
