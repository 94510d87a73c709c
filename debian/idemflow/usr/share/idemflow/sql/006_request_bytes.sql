-- 006_request_bytes.sql: a retry with the same bytes is known without parsing.
--
-- A key row keeps, next to the fingerprint of the canonical request (the
-- method, the path and the body in canonical JSON), one of the request
-- exactly as it came: the same method, path and body bytes. Clients
-- retry by resending the same bytes, so a replay compares this one first
-- and answers without parsing the body again; a request that differs in
-- its bytes (other whitespace, another member order) still gets the
-- canonical comparison, as before. Every keyed command keeps it (a create
-- in its one statement, the other commands when they claim their key);
-- rows made before this column leave it NULL and always take the canonical
-- comparison.

ALTER TABLE idempotency_keys ADD COLUMN request_bytes_fp bytea;

COMMENT ON COLUMN idempotency_keys.request_bytes_fp IS
    'BLAKE2b-256 of the request as received (method, path, body bytes); NULL for rows made before it';
