-- 004_notify.sql: no NOTIFY inside the create transaction.
--
-- A transaction that notifies takes one database-wide lock from its commit
-- until its WAL is flushed, so the row trigger of 002 serialized every
-- create (measured: 208 of 221 sampled active sessions waited on it at 16
-- clients). The workers now send NOTIFY idemflow_outbox themselves, after
-- answering, at most once per NOTIFY_EVERY_MS each (app/worker.c); the
-- dispatcher's --loop still wakes on it, with its poll as the fallback.
DROP TRIGGER outbox_notify ON outbox;
DROP FUNCTION idemflow_outbox_notify();
