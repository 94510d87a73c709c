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

struct db_stmt {
	const char *name;
	const char *sql;
};

enum query_id {
	/* $1 token_hash (bytea hex) -> tenant_id */
	Q_AUTH,
	/*
	 * Authentication and the key's stored row in one read-only round
	 * trip, for a keyed POST: $1 token_hash, $2 key -> no row when the
	 * token is unknown or revoked, else (tenant_id, fingerprint, status,
	 * headers, body, expired) with the key's columns NULL when the key
	 * is new. Columns 1-5 are laid out as Q_CREATE_KEYED's 'existing'
	 * row, so a replay needs no other statement.
	 */
	Q_AUTH_KEY,
	/*
	 * One statement, hence one transaction: claim the key, insert the
	 * workflow and its workflow.created event, store the response.
	 * $1 tenant_id, $2 key, $3 method, $4 path, $5 fingerprint (bytea hex),
	 * $6 stored headers, $7 stored body, $8 created_at, $9 key ttl (interval;
	 * the tenant's idempotency_ttl wins when set),
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
	 * $7 payload. */
	Q_CREATE_UNKEYED,
	/* $1 tenant_id, $2 key -> the 'existing' row of Q_CREATE_KEYED */
	Q_KEY_GET,
	/* $1 tenant_id, $2 key: removes the row (and its counts) only if it
	 * has expired */
	Q_KEY_DELETE_EXPIRED,
	/* $1 tenant_id, $2 id -> (id, type, state, input, created_at) */
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
	/* -> the highest applied migration (0 when none), for GET /readyz */
	Q_SCHEMA_VERSION,
	/* GET /metrics, one cheap statement per scrape -> (pending events,
	 * age in seconds of the oldest pending one or 0, dead events) */
	Q_METRICS_OUTBOX,
	/* Wake dispatchers waiting in --loop (sent outside any create). */
	Q_NOTIFY,
	Q__COUNT
};

extern const struct db_stmt queries[Q__COUNT];

#endif
