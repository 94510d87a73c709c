-- 015_audit.sql: the time window of "idemflow audit" (app/cli/audit.c).
--
-- The audit checks the keys and the workflows created since a moment
-- (--since, 24 hours by default), for every tenant or one. Neither table
-- had an index on the creation time: a window read the whole table, 5
-- million rows for 5 million keys, however short the window.
--
-- The indexes lead with created_at, then tenant_id. Every tenant's
-- window is one range, and each table page in it is read once: a
-- tenant's rows lie interleaved with the others' in the pages of their
-- time, so an index led by tenant_id, read tenant by tenant, read each of
-- those pages once per tenant (on 5 million keys of 10 tenants, 13 s for
-- 24 hours instead of 7 s: doc/performance.md, "The audit"). One tenant's
-- window is the same range, filtered on tenant_id inside the index: the
-- table is read for that tenant's rows only.
--
-- Each costs one more index entry per key and per workflow on the create
-- path; created_at grows with time, so inserts land on the rightmost page,
-- as they do in idempotency_keys_expires (003_ops.sql).
--
-- A migration runs in one transaction, so these are built without
-- CONCURRENTLY, and the build holds back writes to the table while it
-- runs (doc/performance.md, "The audit", has the time for 5 million rows).
-- On a large database, build them first by hand, under the same names,
-- and check that they are valid (\d shows none INVALID):
--
--   CREATE INDEX CONCURRENTLY idempotency_keys_created
--       ON idempotency_keys (created_at, tenant_id);
--   CREATE INDEX CONCURRENTLY workflows_created ON workflows (created_at, tenant_id);
--
-- and this migration finds them there (IF NOT EXISTS).

CREATE INDEX IF NOT EXISTS idempotency_keys_created ON idempotency_keys (created_at, tenant_id);

CREATE INDEX IF NOT EXISTS workflows_created ON workflows (created_at, tenant_id);
