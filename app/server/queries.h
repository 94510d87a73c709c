/*
 * queries.h - every SQL statement the server runs, prepared once per
 * connection (and again after a reconnect) from one table.
 *
 * The SQL text lives in queries.c only; callers name a statement by its enum
 * and pass text-format parameters in the documented order.
 */
#ifndef IDF_QUERIES_H
#define IDF_QUERIES_H

#include <stddef.h>

#include "core/db.h"

enum query_id {
	/* $1 token_hash (bytea hex) -> tenant_id */
	Q_AUTH,
	/*
	 * Authentication and the key's stored row in one read-only round
	 * trip, for a keyed POST: $1 token_hash, $2 key -> no row when the
	 * token is unknown or revoked, else (tenant_id, fingerprint, status,
	 * headers, body, expired, request_bytes_fp, ms_left) with the key's
	 * columns NULL when the key is new; ms_left: whole milliseconds until
	 * the key expires (the replay cache's bound, rcache.h). Columns 1-5
	 * are laid out as Q_CREATE_KEYED's 'existing' row, so a replay needs
	 * no other statement.
	 */
	Q_AUTH_KEY,
	/*
	 * One statement, hence one transaction: claim the key, insert the
	 * workflow and its workflow.created event, store the response.
	 * $1 tenant_id, $2 key, $3 method, $4 path, $5 fingerprint (bytea hex),
	 * $6 stored headers, $7 stored body, $8 the workflow's created_at (as
	 * the answer shows it), $9 key ttl (interval; the tenant's
	 * idempotency_ttl wins when set; counted from the database's now(), as
	 * is the event's due time: no worker's clock decides a lifetime),
	 * $10 workflow id, $11 type, $12 input (canonical JSON), $13 event_id,
	 * $14 event payload.
	 * -> rows of (outcome, fingerprint, status, headers, body, expired):
	 *    one 'created' row when this request owned the key; one 'existing'
	 *    row when the key was committed before this statement began; none
	 *    when it was committed by a concurrent owner while we waited.
	 */
	Q_CREATE_KEYED,
	/* Unkeyed create (idempotency_key = optional), workflow and event only:
	 * $1 tenant_id, $2 created_at, $3 id, $4 type, $5 input, $6 event_id,
	 * $7 payload (the event is due at the database's now()). */
	Q_CREATE_UNKEYED,
	/* $1 tenant_id, $2 key -> the 'existing' row of Q_CREATE_KEYED */
	Q_KEY_GET,
	/* $1 tenant_id, $2 key: removes the row (and its counts) only if it
	 * has expired */
	Q_KEY_DELETE_EXPIRED,
	/* $1 tenant_id, $2 id -> one workflow row (WF_COLUMNS in queries.c):
	 * (id, type, state, input, created_at, business_key, steps, step) */
	Q_WF_GET,
	/* Q_CREATE_KEYED that fails with division by zero after its rows
	 * are written, so the transaction rolls back (--enable-test-hooks
	 * builds with test_fail_after_write; the statement exists in every
	 * build, the switch does not). */
	Q_CREATE_KEYED_FAIL,
	/* Add per-key counts (keystats.h): $1 tenant ids (bigint[]), $2 keys
	 * (text[]), $3 replays, $4 conflicts, $5 in-flight refusals (int[]),
	 * all of one length, each (tenant, key) once. */
	Q_KEYSTATS_FLUSH,
	/* -> (the highest applied migration (0 when none), in recovery,
	 * transaction_read_only), for GET /readyz */
	Q_SCHEMA_VERSION,
	/* GET /metrics, one cheap statement per scrape -> (pending events,
	 * age in seconds of the oldest pending one or 0, dead events) */
	Q_METRICS_OUTBOX,
	/* Wake dispatchers waiting in --loop (sent outside any create). */
	Q_NOTIFY,
	/* Transaction control, for commands that span two pipelines. */
	Q_BEGIN,
	Q_COMMIT,
	Q_ROLLBACK,
	/*
	 * Claim a key for a command inside the command's transaction:
	 * $1 tenant_id, $2 key, $3 method, $4 path, $5 fingerprint, $6 key
	 * ttl (interval) -> one row when this request owns the key, none when
	 * it was taken. The row stays invisible until Q_KEY_STORE and COMMIT.
	 */
	Q_KEY_CLAIM,
	/* $1 tenant_id, $2 key, $3 status, $4 headers, $5 body */
	Q_KEY_STORE,
	/* The commands (sql/005_runs.sql); each returns rows whose first
	 * two columns are (problem slug or NULL, detail). */
	/* $1 tenant, $2 id, $3 type, $4 input, $5 created_at, $6 steps,
	 * $7 business_key, $8 workflow.created payload -> idemflow_wf_row */
	Q_WF_CREATE_RUN,
	/* $1 tenant, $2 id, $3 to, $4 from (or NULL) -> idemflow_wf_row */
	Q_WF_TRANSITION,
	/* $1 tenant, $2 id, $3 message_id, $4 name, $5 payload
	 * -> (problem, detail, outcome, step) */
	Q_WF_MESSAGE,
	/* $1 tenant, $2 job_type, $3 worker, $4 max_jobs, $5 lease (interval)
	 * -> idemflow_job_row per job */
	Q_JOBS_ACTIVATE,
	/* $1 tenant, $2 workflow id, $3 step, $4 worker, $5 output */
	Q_JOB_COMPLETE,
	/* $1 tenant, $2 workflow id, $3 step, $4 worker, $5 error, $6 retry
	 * after (interval) */
	Q_JOB_FAIL,
	/* $1 tenant, $2 workflow id, $3 after seq, $4 limit -> (seq, payload)
	 * rows, one row of NULLs when there are none, no row when the
	 * workflow does not exist */
	Q_WF_EVENTS,
	/* $1 tenant, $2 state or NULL, $3 type or NULL, $4 after id or NULL,
	 * $5 limit -> workflow rows (as Q_WF_GET) in id order */
	Q_WF_LIST,
	Q__COUNT
};

extern const struct db_stmt queries[Q__COUNT];

#endif
