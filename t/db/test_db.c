/*
 * test_db.c - the keyed create statement against a real PostgreSQL.
 *
 * Proves that the unique index alone settles a race of 20 concurrent claims
 * of one key, and that a failure anywhere in the statement leaves no
 * workflow, no event and no key behind; that every connection pins the
 * session settings the SQL depends on, whatever defaults it is given; and
 * that reconnects back off. Needs $DATABASE_URL (a migrated database),
 * which t/run-test provides.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/db.h"
#include "core/fp.h"
#include "core/idem.h"
#include "core/ids.h"
#include "core/migrate.h"
#include "server/queries.h"
#include "twait.h"

static PGconn *admin;
static char tenant[24];
static char token_hex[2 + 2 * FP_LEN + 1]; /* the tenant's token's digest, a bytea parameter */

static long count(const char *sql)
{
	struct err e;
	const char *p[1] = { tenant };
	PGresult *res = db_exec(admin, sql, 1, p, &e);
	long n;

	cr_assert_not_null(res, "%s: %s", sql, e.msg);
	n = atol(PQgetvalue(res, 0, 0));
	PQclear(res);
	return n;
}

static void setup(void)
{
	struct err e;
	char name[64];
	PGresult *res;

	admin = db_connect_simple(getenv("DATABASE_URL"), "test_db", &e);
	cr_assert_not_null(admin, "%s", e.msg);
	snprintf(name, sizeof(name), "dbtest-%ld-%d", (long)getpid(), rand());
	const char *p[1] = { name };
	res = db_exec(admin, "INSERT INTO tenants (name) VALUES ($1) RETURNING id", 1, p, &e);
	cr_assert_not_null(res, "%s", e.msg);
	snprintf(tenant, sizeof(tenant), "%s", PQgetvalue(res, 0, 0));
	PQclear(res);
	/* A token of its own: the keyed create checks it. */
	uint8_t digest[FP_LEN];
	fp_token(digest, name, strlen(name));
	token_hex[0] = '\\';
	token_hex[1] = 'x';
	fp_hex(token_hex + 2, digest, FP_LEN);
	const char *tp[2] = { token_hex, tenant };
	res = db_exec(admin, "INSERT INTO api_tokens (token_hash, tenant_id) VALUES ($1, $2)", 2,
	              tp, &e);
	cr_assert_not_null(res, "%s", e.msg);
	PQclear(res);
}

static void teardown(void)
{
	PQfinish(admin);
}

static struct db *open_db(long lock_timeout_ms)
{
	struct err e;
	struct db_settings s = { .conninfo = getenv("DATABASE_URL"),
		                 .application_name = "test_db",
		                 .lock_timeout_ms = lock_timeout_ms,
		                 .stmts = queries,
		                 .nstmts = Q__COUNT };
	struct db *db = db_open(&s, &e);

	cr_assert_not_null(db);
	cr_assert_eq(e.code, ERR_NONE, "%s", e.msg);
	return db;
}

/* Parameters of Q_CREATE_KEYED for key, with a fresh workflow id, and
 * of Q_KEY_GET and Q_KEY_DELETE_EXPIRED for the same key. */
struct claim {
	char id[IDS_UUID_LEN + 1], event[IDS_UUID_LEN + 8], now[IDS_TS_LEN + 1];
	char fp[IDEM_FP_TEXT], bytes_fp[IDEM_FP_TEXT];
	const char *p[CREATE_KEYED__N];
	const char *kg[KEY_GET__N];
};

/* The outcome of a Q_CREATE_KEYED row. */
static const char *outcome(const PGresult *res)
{
	cr_assert_eq(PQntuples(res), 1);
	cr_assert_eq(PQnfields(res), CREATE_COL_OUTCOME + 1);
	return PQgetvalue(res, 0, CREATE_COL_OUTCOME);
}

static void claim_init(struct claim *c, const char *key, const char *body, const char *ttl)
{
	uint8_t d[FP_LEN];

	cr_assert_eq(ids_uuid7(c->id), 0);
	snprintf(c->event, sizeof(c->event), "%s.1", c->id);
	ids_now(c->now);
	fp_request(d, "POST", "/v1/workflows", body, strlen(body));
	idem_fp_text(c->fp, d);
	fp_request_bytes(d, "POST", "/v1/workflows", body, strlen(body));
	idem_fp_text(c->bytes_fp, d);
	const char *p[CREATE_KEYED__N] = { [CREATE_KEYED_TOKEN_HASH] = token_hex,
		                           [CREATE_KEYED_KEY] = key,
		                           [CREATE_KEYED_METHOD] = "POST",
		                           [CREATE_KEYED_PATH] = "/v1/workflows",
		                           [CREATE_KEYED_FP] = c->fp,
		                           [CREATE_KEYED_HEADERS] = "Location: x\r\n",
		                           [CREATE_KEYED_BODY] = body,
		                           [CREATE_KEYED_CREATED_AT] = c->now,
		                           [CREATE_KEYED_TTL] = ttl,
		                           [CREATE_KEYED_ID] = c->id,
		                           [CREATE_KEYED_TYPE] = "t",
		                           [CREATE_KEYED_INPUT] = "{}",
		                           [CREATE_KEYED_EVENT_ID] = c->event,
		                           [CREATE_KEYED_PAYLOAD_HEAD] = "{\"tenant_id\":",
		                           [CREATE_KEYED_BYTES_FP] = c->bytes_fp,
		                           [CREATE_KEYED_PAYLOAD_TAIL] = "}",
		                           [CREATE_KEYED_TRACEPARENT] = NULL,
		                           [CREATE_KEYED_TRACESTATE] = NULL };
	memcpy(c->p, p, sizeof(p));
	c->kg[KEY_GET_TENANT] = tenant;
	c->kg[KEY_GET_KEY] = key;
}

#define N 20

struct racer {
	pthread_barrier_t *go;
	const char *key;
	int created, existing, waited;
	char error[256];
};

static void *race(void *arg)
{
	struct racer *r = arg;
	struct claim c;
	struct err e;
	struct db *db = open_db(10000);
	PGresult *res;

	claim_init(&c, r->key, "{\"type\":\"t\"}", "1 hour");
	pthread_barrier_wait(r->go);
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, c.p, &e);
	if (res == NULL)
		snprintf(r->error, sizeof(r->error), "%s", e.msg);
	else if (strcmp(PQgetvalue(res, 0, CREATE_COL_OUTCOME), "taken") == 0)
		r->waited = 1; /* the owner committed while we waited */
	else if (strcmp(PQgetvalue(res, 0, CREATE_COL_OUTCOME), "created") == 0)
		r->created = 1;
	else
		r->existing = 1;
	PQclear(res);
	db_close(db);
	return NULL;
}

TestSuite(db, .init = setup, .fini = teardown, .timeout = 60);

Test(db, twenty_concurrent_claims_of_one_key_make_one_owner)
{
	pthread_t th[N];
	struct racer r[N];
	pthread_barrier_t go;
	int created = 0, others = 0;

	pthread_barrier_init(&go, NULL, N);
	for (int i = 0; i < N; i++) {
		r[i] = (struct racer){ .go = &go, .key = "race-key" };
		pthread_create(&th[i], NULL, race, &r[i]);
	}
	for (int i = 0; i < N; i++) {
		pthread_join(th[i], NULL);
		cr_assert_eq(r[i].error[0], '\0', "claim %d failed: %s", i, r[i].error);
		created += r[i].created;
		others += r[i].existing + r[i].waited;
	}
	pthread_barrier_destroy(&go);
	cr_assert_eq(created, 1, "exactly one owner");
	cr_assert_eq(others, N - 1);
	cr_assert_eq(count("SELECT count(*) FROM workflows WHERE tenant_id = $1"), 1);
	cr_assert_eq(count("SELECT count(*) FROM outbox WHERE tenant_id = $1"), 1);
	cr_assert_eq(count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1"), 1);
}

Test(db, a_failure_after_the_rows_are_written_leaves_none_of_them)
{
	struct db *db = open_db(5000);
	struct claim c;
	struct err e;
	PGresult *res;

	/* Make the outbox insert, the statement's last write, fail: its
	 * event id is taken already. The key and workflow rows were written
	 * by then, in the same transaction. */
	claim_init(&c, "doomed-key", "{\"type\":\"t\"}", "1 hour");
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, c.p, &e);
	cr_assert_not_null(res, "%s", e.msg);
	PQclear(res);
	struct claim d;
	claim_init(&d, "doomed-key-2", "{\"type\":\"t\"}", "1 hour");
	d.p[CREATE_KEYED_EVENT_ID] = c.event;
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, d.p, &e);
	cr_assert_null(res, "a duplicate event id must fail the statement");
	cr_assert_str_eq(e.sqlstate, "23505");
	cr_assert_eq(count("SELECT count(*) FROM workflows WHERE tenant_id = $1"), 1);
	cr_assert_eq(count("SELECT count(*) FROM outbox WHERE tenant_id = $1"), 1);
	cr_assert_eq(count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1"), 1,
	             "the failed request's key is not consumed");

	/* Its retry under the same key executes again and succeeds. */
	claim_init(&d, "doomed-key-2", "{\"type\":\"t\"}", "1 hour");
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, d.p, &e);
	cr_assert_not_null(res, "%s", e.msg);
	cr_assert_str_eq(outcome(res), "created");
	PQclear(res);
	cr_assert_eq(count("SELECT count(*) FROM workflows WHERE tenant_id = $1"), 2);
	db_close(db);
}

Test(db, a_rolled_back_transaction_leaves_no_workflow_event_or_key)
{
	struct db *db = open_db(5000);
	struct claim c;
	struct err e;
	PGresult *res;

	res = db_exec(db_conn(db), "BEGIN", 0, NULL, &e);
	cr_assert_not_null(res);
	PQclear(res);
	claim_init(&c, "rollback-key", "{\"type\":\"t\"}", "1 hour");
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, c.p, &e);
	cr_assert_not_null(res, "%s", e.msg);
	cr_assert_str_eq(outcome(res), "created");
	PQclear(res);
	res = db_exec(db_conn(db), "ROLLBACK", 0, NULL, &e);
	PQclear(res);
	cr_assert_eq(count("SELECT count(*) FROM workflows WHERE tenant_id = $1"), 0);
	cr_assert_eq(count("SELECT count(*) FROM outbox WHERE tenant_id = $1"), 0);
	cr_assert_eq(count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1"), 0);
	db_close(db);
}

Test(db, a_key_held_past_the_wait_is_a_lock_timeout)
{
	struct db *holder = open_db(5000), *waiter = open_db(300);
	struct claim c, d;
	struct err e;
	PGresult *res;

	res = db_exec(db_conn(holder), "BEGIN", 0, NULL, &e);
	PQclear(res);
	claim_init(&c, "held-key", "{\"type\":\"t\"}", "1 hour");
	res = db_run(holder, Q_CREATE_KEYED, CREATE_KEYED__N, c.p, &e);
	cr_assert_not_null(res, "%s", e.msg);
	PQclear(res);
	claim_init(&d, "held-key", "{\"type\":\"t\"}", "1 hour");
	res = db_run(waiter, Q_CREATE_KEYED, CREATE_KEYED__N, d.p, &e);
	cr_assert_null(res);
	cr_assert_eq(e.code, ERR_LOCK_TIMEOUT, "got %d (%s) %s", e.code, e.sqlstate, e.msg);
	res = db_exec(db_conn(holder), "ROLLBACK", 0, NULL, &e);
	PQclear(res);
	db_close(holder);
	db_close(waiter);
}

/* A tenant frozen for a move (sql/030_tenant_move.sql): its keyed create
 * is refused whole (IDFMV), nothing stored, and the worker's session,
 * which is fine, is kept: no reconnect for every refused request. */
Test(db, a_frozen_tenant_is_refused_whole_and_the_session_kept)
{
	struct db *db = open_db(5000);
	const char *p[1] = { tenant };
	struct claim c;
	struct err e;
	PGresult *res;

	res = db_exec(admin, "SELECT idemflow_tenant_freeze($1::bigint, 'source', 1)", 1, p, &e);
	cr_assert_not_null(res, "%s", e.msg);
	PQclear(res);
	claim_init(&c, "frozen-key", "{\"type\":\"t\"}", "1 hour");
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, c.p, &e);
	cr_assert_null(res);
	cr_assert_eq(e.code, ERR_DB_DOWN, "got %d (%s) %s", e.code, e.sqlstate, e.msg);
	cr_assert_str_eq(e.sqlstate, DB_TENANT_MOVING);
	cr_assert_eq(e.outcome_unknown, 0, "refused: nothing was committed");
	cr_assert_eq(count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1::bigint"),
	             0);
	cr_assert_eq(count("SELECT count(*) FROM workflows WHERE tenant_id = $1::bigint"), 0);
	cr_assert_eq(count("SELECT count(*) FROM outbox WHERE tenant_id = $1::bigint"), 0);
	res = db_run(db, Q_SCHEMA_VERSION, 0, NULL, &e);
	cr_assert_not_null(res, "%s", e.msg);
	PQclear(res);
	cr_assert_eq(db_reconnects(db), 0, "the session was dropped");
	res = db_exec(admin, "DELETE FROM frozen_tenants WHERE tenant_id = $1::bigint", 1, p, &e);
	cr_assert_not_null(res, "%s", e.msg);
	PQclear(res);
	claim_init(&c, "frozen-key", "{\"type\":\"t\"}", "1 hour");
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, c.p, &e);
	cr_assert_not_null(res, "%s", e.msg);
	cr_assert_str_eq(outcome(res), "created");
	PQclear(res);
	db_close(db);
}

Test(db, an_expired_key_is_reported_as_expired)
{
	struct db *db = open_db(5000);
	struct claim c, d;
	struct err e;
	PGresult *res;

	claim_init(&c, "old-key", "{\"type\":\"t\"}", "-1 second");
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, c.p, &e);
	cr_assert_not_null(res, "%s", e.msg);
	PQclear(res);
	claim_init(&d, "old-key", "{\"type\":\"t\"}", "1 hour");
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, d.p, &e);
	cr_assert_not_null(res, "%s", e.msg);
	cr_assert_str_eq(outcome(res), "existing");
	cr_assert_str_eq(PQgetvalue(res, 0, KEY_COL_TENANT), tenant);
	cr_assert_str_eq(PQgetvalue(res, 0, KEY_COL_EXPIRED), "t", "expired");
	PQclear(res);
	res = db_run(db, Q_KEY_DELETE_EXPIRED, KEY_GET__N, d.kg, &e);
	cr_assert_not_null(res, "%s", e.msg);
	PQclear(res);
	cr_assert_eq(count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1"), 0,
	             "the expired row is gone");
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, d.p, &e);
	cr_assert_str_eq(outcome(res), "created", "the key is claimed afresh");
	PQclear(res);
	db_close(db);
}

Test(db, an_unknown_or_revoked_token_writes_nothing)
{
	struct db *db = open_db(5000);
	struct claim c;
	struct err e;
	PGresult *res;
	const char *unknown = "\\x0000000000000000000000000000000000000000000000000000000000000000";

	claim_init(&c, "stranger-key", "{\"type\":\"t\"}", "1 hour");
	c.p[CREATE_KEYED_TOKEN_HASH] = unknown;
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, c.p, &e);
	cr_assert_not_null(res, "%s", e.msg);
	cr_assert_str_eq(outcome(res), "unauthorized");
	cr_assert(PQgetisnull(res, 0, KEY_COL_TENANT));
	PQclear(res);

	/* The tenant's own token, revoked: the same, even for a key the
	 * tenant has used. */
	claim_init(&c, "revoked-key", "{\"type\":\"t\"}", "1 hour");
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, c.p, &e);
	cr_assert_str_eq(outcome(res), "created");
	PQclear(res);
	const char *tp[1] = { token_hex };
	PQclear(db_exec(admin, "UPDATE api_tokens SET revoked_at = now() WHERE token_hash = $1", 1,
	                tp, &e));
	claim_init(&c, "revoked-key-2", "{\"type\":\"t\"}", "1 hour");
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, c.p, &e);
	cr_assert_str_eq(outcome(res), "unauthorized");
	PQclear(res);
	claim_init(&c, "revoked-key", "{\"type\":\"t\"}", "1 hour");
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, c.p, &e);
	cr_assert_str_eq(outcome(res), "unauthorized", "no stored answer for a revoked token");
	cr_assert(PQgetisnull(res, 0, KEY_COL_FP));
	PQclear(res);
	PQclear(db_exec(admin, "UPDATE api_tokens SET revoked_at = NULL WHERE token_hash = $1", 1,
	                tp, &e));
	cr_assert_eq(count("SELECT count(*) FROM workflows WHERE tenant_id = $1"), 1);
	cr_assert_eq(count("SELECT count(*) FROM outbox WHERE tenant_id = $1"), 1);
	cr_assert_eq(count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1"), 1);
	db_close(db);
}

Test(db, the_created_rows_carry_the_tenant_the_token_names_and_the_trace)
{
	struct db *db = open_db(5000);
	struct claim c;
	struct err e;
	PGresult *res;
	char want[128];
	const char *tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

	claim_init(&c, "traced-key", "{\"type\":\"t\"}", "1 hour");
	c.p[CREATE_KEYED_PAYLOAD_HEAD] = "{\"seq\":1,\"tenant_id\":";
	c.p[CREATE_KEYED_PAYLOAD_TAIL] = ",\"data\":{}}";
	c.p[CREATE_KEYED_TRACEPARENT] = tp;
	c.p[CREATE_KEYED_TRACESTATE] = "vendor=1";
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, c.p, &e);
	cr_assert_not_null(res, "%s", e.msg);
	cr_assert_str_eq(outcome(res), "created");
	cr_assert_str_eq(PQgetvalue(res, 0, KEY_COL_TENANT), tenant);
	cr_assert(PQgetisnull(res, 0, KEY_COL_FP), "a created row has no stored key row");
	PQclear(res);
	snprintf(want, sizeof(want), "{\"seq\":1,\"tenant_id\":%s,\"data\":{}}", tenant);
	const char *p[2] = { tenant, c.id };
	res = db_exec(admin,
	              "SELECT o.payload, o.traceparent, o.tracestate, w.traceparent, w.tracestate"
	              "  FROM outbox o JOIN workflows w ON w.id = o.workflow_id"
	              " WHERE o.tenant_id = $1 AND w.id = $2",
	              2, p, &e);
	cr_assert_not_null(res, "%s", e.msg);
	cr_assert_eq(PQntuples(res), 1);
	cr_assert_str_eq(PQgetvalue(res, 0, 0), want, "the payload's bytes");
	cr_assert_str_eq(PQgetvalue(res, 0, 1), tp);
	cr_assert_str_eq(PQgetvalue(res, 0, 2), "vendor=1");
	cr_assert_str_eq(PQgetvalue(res, 0, 3), tp);
	cr_assert_str_eq(PQgetvalue(res, 0, 4), "vendor=1");
	PQclear(res);

	/* Its retry reads the key row as Q_AUTH_KEY does, for the replay
	 * cache: the bytes' fingerprint and the milliseconds left. */
	claim_init(&c, "traced-key", "{\"type\":\"t\"}", "1 hour");
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, c.p, &e);
	cr_assert_str_eq(outcome(res), "existing");
	cr_assert_str_eq(PQgetvalue(res, 0, KEY_COL_TENANT), tenant);
	cr_assert_str_eq(PQgetvalue(res, 0, KEY_COL_STATUS), "201");
	cr_assert_str_eq(PQgetvalue(res, 0, KEY_COL_EXPIRED), "f");
	cr_assert_str_eq(PQgetvalue(res, 0, KEY_COL_BYTES_FP), c.bytes_fp);
	long left = atol(PQgetvalue(res, 0, KEY_COL_MS_LEFT));
	cr_assert(left > 3590000 && left <= 3600000, "ms left: %ld", left);
	PQclear(res);
	cr_assert_eq(count("SELECT count(*) FROM workflows WHERE tenant_id = $1"), 1);
	db_close(db);
}

/* One text value of sql with $1 = tenant and $2 = arg. */
static char *value(const char *sql, const char *arg)
{
	struct err e;
	const char *p[2] = { tenant, arg };
	PGresult *res = db_exec(admin, sql, 2, p, &e);
	char *v;

	cr_assert_not_null(res, "%s: %s", sql, e.msg);
	cr_assert_eq(PQntuples(res), 1, "%s", sql);
	v = strdup(PQgetisnull(res, 0, 0) ? "NULL" : PQgetvalue(res, 0, 0));
	PQclear(res);
	return v;
}

/*
 * The actor (sql/014_actor.sql): the plain keyed create writes the token
 * its own check found on the key, the workflow and the event, and answers
 * that token's id with the key row (also for a replay, as Q_AUTH_KEY
 * does); a command's statements take the actor Q_TRACE_SET set for the
 * transaction; what idemflow_fire_timers causes is the reaper's.
 */
Test(db, every_row_records_the_token_that_wrote_it_and_timers_the_reaper)
{
	struct db *db = open_db(5000);
	struct claim c;
	struct err e;
	PGresult *res;
	char token_id[24], actor[40], *v;

	v = value("SELECT id::text FROM api_tokens WHERE tenant_id = $1 AND token_hash = $2",
	          token_hex);
	snprintf(token_id, sizeof(token_id), "%s", v);
	snprintf(actor, sizeof(actor), "token:%s", token_id);
	free(v);

	claim_init(&c, "actor-key", "{\"type\":\"t\"}", "1 hour");
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, c.p, &e);
	cr_assert_not_null(res, "%s", e.msg);
	cr_assert_str_eq(outcome(res), "created");
	cr_assert_str_eq(PQgetvalue(res, 0, KEY_COL_TOKEN), token_id);
	PQclear(res);
	v = value("SELECT actor FROM idempotency_keys WHERE tenant_id = $1 AND key = $2",
	          "actor-key");
	cr_assert_str_eq(v, actor);
	free(v);
	v = value("SELECT actor FROM workflows WHERE tenant_id = $1 AND id = $2", c.id);
	cr_assert_str_eq(v, actor);
	free(v);
	v = value("SELECT actor FROM outbox WHERE tenant_id = $1 AND event_id = $2", c.event);
	cr_assert_str_eq(v, actor);
	free(v);
	claim_init(&c, "actor-key", "{\"type\":\"t\"}", "1 hour");
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, c.p, &e);
	cr_assert_str_eq(outcome(res), "existing");
	cr_assert_str_eq(PQgetvalue(res, 0, KEY_COL_TOKEN), token_id);
	PQclear(res);
	const char *ak[AUTH_KEY__N] = {
		[AUTH_KEY_TOKEN_HASH] = token_hex, [AUTH_KEY_KEY] = "actor-key"
	};
	res = db_run(db, Q_AUTH_KEY, AUTH_KEY__N, ak, &e);
	cr_assert_not_null(res, "%s", e.msg);
	cr_assert_eq(PQnfields(res), KEY_COL__N);
	cr_assert_str_eq(PQgetvalue(res, 0, KEY_COL_TOKEN), token_id);
	PQclear(res);
	res = db_run(db, Q_AUTH, AUTH__N, ak, &e);
	cr_assert_not_null(res, "%s", e.msg);
	cr_assert_str_eq(PQgetvalue(res, 0, AUTH_COL_TOKEN), token_id);
	PQclear(res);

	/* A command: Q_TRACE_SET's actor in the transaction, a create with a
	 * sleep step then a job step (the function's inserts name no actor). */
	char id[IDS_UUID_LEN + 1], now[IDS_TS_LEN + 1];
	cr_assert_eq(ids_uuid7(id), 0);
	ids_now(now);
	const char *ts[TRACE_SET__N] = { [TRACE_SET_TRACEPARENT] = NULL,
		                         [TRACE_SET_TRACESTATE] = NULL,
		                         [TRACE_SET_ACTOR] = actor };
	const char *cr[WF_CREATE_RUN__N] = {
		[WF_CREATE_RUN_TENANT] = tenant,
		[WF_CREATE_RUN_ID] = id,
		[WF_CREATE_RUN_TYPE] = "t",
		[WF_CREATE_RUN_INPUT] = "{}",
		[WF_CREATE_RUN_CREATED_AT] = now,
		[WF_CREATE_RUN_STEPS] = "[{\"name\": \"nap\", \"sleep\": \"PT0S\"}, "
		                        "{\"name\": \"j\", \"job_type\": \"j\"}]",
		[WF_CREATE_RUN_BUSINESS_KEY] = NULL,
		[WF_CREATE_RUN_PAYLOAD_HEAD] = "{\"tenant_id\":",
		[WF_CREATE_RUN_PAYLOAD_TAIL] = "}",
		[WF_CREATE_RUN_PRIORITY] = "0",
	};
	const struct db_call calls[4] = { { Q_BEGIN, 0, NULL },
		                          { Q_TRACE_SET, TRACE_SET__N, ts },
		                          { Q_WF_CREATE_RUN, WF_CREATE_RUN__N, cr },
		                          { Q_COMMIT, 0, NULL } };
	PGresult *r[4];
	int failed;
	cr_assert_eq(db_pipeline(db, 4, calls, r, &failed, &e), 0, "%s", e.msg);
	for (int i = 0; i < 4; i++)
		PQclear(r[i]);
	/* The transaction's setting ended with it. */
	res = db_exec(db_conn(db), "SELECT current_setting('idemflow.actor', true)", 0, NULL, &e);
	cr_assert_not_null(res, "%s", e.msg);
	cr_assert_str_eq(PQgetvalue(res, 0, 0), "");
	PQclear(res);

	res = db_exec(db_conn(db), "SELECT * FROM idemflow_fire_timers(1000)", 0, NULL, &e);
	cr_assert_not_null(res, "%s", e.msg);
	PQclear(res);
	char want[256];
	snprintf(want, sizeof(want),
	         "workflow.created=%s,workflow.started=system:reaper,timer.fired=system:reaper",
	         actor);
	v = value("SELECT string_agg(type || '=' || coalesce(actor, 'NULL'), ',' ORDER BY seq)"
	          "  FROM outbox WHERE tenant_id = $1 AND workflow_id = $2",
	          id);
	cr_assert_str_eq(v, want);
	free(v);
	v = value("SELECT actor FROM workflows WHERE tenant_id = $1 AND id = $2", id);
	cr_assert_str_eq(v, actor);
	free(v);
	v = value("SELECT coalesce(actor, 'NULL') FROM jobs WHERE tenant_id = $1"
	          " AND workflow_id = $2 AND step = 2",
	          id);
	cr_assert_str_eq(v, "system:reaper", "the job of the step the timer began");
	free(v);
	db_close(db);
}

Test(db, lost_connection_is_classified_as_down_and_reconnects)
{
	struct db *db = open_db(5000);
	struct claim c;
	struct err e;
	PGresult *res;
	char pid[16];

	snprintf(pid, sizeof(pid), "%d", PQbackendPID(db_conn(db)));
	const char *p[1] = { pid };
	res = db_exec(admin, "SELECT pg_terminate_backend($1::int)", 1, p, &e);
	cr_assert_not_null(res, "%s", e.msg);
	PQclear(res);
	usleep(100000);
	claim_init(&c, "after-kill", "{\"type\":\"t\"}", "1 hour");
	db_check(db);
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, c.p, &e);
	if (res == NULL) {
		/* Not noticed while idle: the statement failed as "down"... */
		cr_assert_eq(e.code, ERR_DB_DOWN, "%s", e.msg);
		sleep(1); /* reconnects are paced */
		res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, c.p, &e);
	}
	cr_assert_not_null(res, "reconnected: %s", e.msg);
	cr_assert_str_eq(outcome(res), "created");
	cr_assert_eq(db_reconnects(db), 1);
	PQclear(res);
	db_close(db);
}

Test(db, the_fault_injection_statement_fails_after_writing_and_leaves_nothing)
{
	struct db *db = open_db(5000);
	struct claim c;
	struct err e;
	PGresult *res;

	/* What --enable-test-hooks builds run for test_fail_after_write: the
	 * rows are inserted, then the statement fails, inside one
	 * transaction. */
	claim_init(&c, "fault-key", "{\"type\":\"t\"}", "1 hour");
	res = db_run(db, Q_CREATE_KEYED_FAIL, CREATE_KEYED__N, c.p, &e);
	cr_assert_null(res, "the statement must fail");
	cr_assert_str_eq(e.sqlstate, "22012", "division by zero, got %s: %s", e.sqlstate, e.msg);
	cr_assert_eq(count("SELECT count(*) FROM workflows WHERE tenant_id = $1"), 0);
	cr_assert_eq(count("SELECT count(*) FROM outbox WHERE tenant_id = $1"), 0);
	cr_assert_eq(count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1"), 0);
	/* The retry of the same request then creates it once. */
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, c.p, &e);
	cr_assert_not_null(res, "%s", e.msg);
	cr_assert_str_eq(outcome(res), "created");
	PQclear(res);
	db_close(db);
}

/* Defaults that an ALTER DATABASE ... SET could make, given here as the
 * session's startup options (the same precedence for a session). */
#define HOSTILE                                                                                    \
	" options='-c bytea_output=escape -c default_transaction_isolation=serializable"           \
	" -c DateStyle=SQL,DMY -c IntervalStyle=sql_standard -c TimeZone=Asia/Kathmandu"           \
	" -c search_path=pg_catalog -c extra_float_digits=-15 -c synchronous_commit=off"           \
	" -c transform_null_equals=on -c client_encoding=LATIN1'"

static const char *const pinned[][2] = {
	{ "bytea_output", "hex" },
	{ "default_transaction_isolation", "read committed" },
	{ "DateStyle", "ISO, MDY" },
	{ "IntervalStyle", "postgres" },
	{ "TimeZone", "UTC" },
	{ "search_path", "public" },
	{ "extra_float_digits", "1" },
	{ "synchronous_commit", "on" },
	{ "transform_null_equals", "off" },
	{ "client_encoding", "UTF8" },
};

static void expect_pinned(PGconn *conn)
{
	for (size_t i = 0; i < sizeof(pinned) / sizeof(pinned[0]); i++) {
		struct err e;
		const char *p[1] = { pinned[i][0] };
		PGresult *res = db_exec(conn, "SELECT current_setting($1)", 1, p, &e);
		cr_assert_not_null(res, "%s", e.msg);
		cr_assert_str_eq(PQgetvalue(res, 0, 0), pinned[i][1], "%s", pinned[i][0]);
		PQclear(res);
	}
}

static char *hostile_conninfo(const char *extra)
{
	char *s;

	cr_assert(asprintf(&s, "%s%s%s", getenv("DATABASE_URL"), HOSTILE, extra) > 0);
	return s;
}

Test(db, every_connection_pins_the_settings_the_sql_depends_on)
{
	char *ci = hostile_conninfo("");
	struct db_settings s = { .conninfo = ci,
		                 .application_name = "test_db",
		                 .lock_timeout_ms = 1234,
		                 .statement_timeout_ms = 5678,
		                 .stmts = queries,
		                 .nstmts = Q__COUNT };
	struct err e;
	struct db *db = db_open(&s, &e);
	PGconn *simple;
	PGresult *res;

	cr_assert_not_null(db);
	cr_assert_eq(e.code, ERR_NONE, "%s", e.msg);
	expect_pinned(db_conn(db));
	res =
	    db_exec(db_conn(db),
	            "SELECT current_setting('lock_timeout'), current_setting('statement_timeout'),"
	            "       current_setting('idle_in_transaction_session_timeout'),"
	            "       current_setting('default_transaction_read_only')",
	            0, NULL, &e);
	cr_assert_not_null(res, "%s", e.msg);
	cr_assert_str_eq(PQgetvalue(res, 0, 0), "1234ms");
	cr_assert_str_eq(PQgetvalue(res, 0, 1), "5678ms");
	cr_assert_str_eq(PQgetvalue(res, 0, 2), "10s",
	                 "a frozen worker holds its locks 10 s at most");
	cr_assert_str_eq(PQgetvalue(res, 0, 3), "off");
	PQclear(res);
	db_close(db);

	/* The CLI's connections too. */
	simple = db_connect_simple(ci, "test_db", &e);
	cr_assert_not_null(simple, "%s", e.msg);
	expect_pinned(simple);
	PQfinish(simple);
	free(ci);
}

/* Every level that acknowledges a commit before the synchronous standby
 * has it is raised to "on"; "remote_apply" (stronger) is kept. */
Test(db, synchronous_commit_is_at_least_on_whatever_the_default)
{
	const char *const levels[][2] = { { "off", "on" },
		                          { "local", "on" },
		                          { "remote_write", "on" },
		                          { "on", "on" },
		                          { "remote_apply", "remote_apply" } };

	for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++) {
		char *ci;
		struct err e;
		PGconn *conn;
		PGresult *res;

		cr_assert(asprintf(&ci, "%s options='-c synchronous_commit=%s'",
		                   getenv("DATABASE_URL"), levels[i][0]) > 0);
		conn = db_connect_simple(ci, "test_db", &e);
		cr_assert_not_null(conn, "%s", e.msg);
		res = db_exec(conn, "SELECT current_setting('synchronous_commit')", 0, NULL, &e);
		cr_assert_not_null(res, "%s", e.msg);
		cr_assert_str_eq(PQgetvalue(res, 0, 0), levels[i][1], "given %s", levels[i][0]);
		PQclear(res);
		PQfinish(conn);
		free(ci);
	}
}

/* The value of a connection option as libpq uses it, or "". */
static char *conn_option(PGconn *conn, const char *name)
{
	PQconninfoOption *opts = PQconninfo(conn);
	char *v = NULL;

	for (PQconninfoOption *o = opts; o != NULL && o->keyword != NULL; o++)
		if (strcmp(o->keyword, name) == 0)
			v = strdup(o->val != NULL ? o->val : "");
	PQconninfoFree(opts);
	cr_assert_not_null(v, "no option %s", name);
	return v;
}

static void expect_option(PGconn *conn, const char *name, const char *want)
{
	char *v = conn_option(conn, name);

	cr_assert_str_eq(v, want, "%s", name);
	free(v);
}

Test(db, keepalives_are_on_and_several_hosts_look_for_the_primary)
{
	const char *host = getenv("PGHOST"), *port = getenv("PGPORT");
	char multi[1024];
	struct err e;
	PGconn *c;

	c = db_connect_simple(getenv("DATABASE_URL"), "test_db", &e);
	cr_assert_not_null(c, "%s", e.msg);
	expect_option(c, "keepalives", "1");
	expect_option(c, "keepalives_idle", "10");
	expect_option(c, "keepalives_interval", "5");
	expect_option(c, "keepalives_count", "3");
	expect_option(c, "connect_timeout", "3");
	expect_option(c, "target_session_attrs", "any"); /* one host */
	PQfinish(c);

	/* The conninfo's own values win. */
	snprintf(multi, sizeof(multi), "%s keepalives_idle=42 connect_timeout=7",
	         getenv("DATABASE_URL"));
	c = db_connect_simple(multi, "test_db", &e);
	cr_assert_not_null(c, "%s", e.msg);
	expect_option(c, "keepalives_idle", "42");
	expect_option(c, "connect_timeout", "7");
	PQfinish(c);

	/* Several hosts (the first one refuses): read-write unless told. */
	snprintf(multi, sizeof(multi), "host=127.0.0.1,%s port=1,%s dbname=%s user=%s", host, port,
	         getenv("PGDATABASE"), getenv("PGUSER"));
	c = db_connect_simple(multi, "test_db", &e);
	cr_assert_not_null(c, "%s", e.msg);
	expect_option(c, "target_session_attrs", "read-write");
	PQfinish(c);
	snprintf(multi, sizeof(multi),
	         "host=127.0.0.1,%s port=1,%s dbname=%s user=%s target_session_attrs=any", host,
	         port, getenv("PGDATABASE"), getenv("PGUSER"));
	c = db_connect_simple(multi, "test_db", &e);
	cr_assert_not_null(c, "%s", e.msg);
	expect_option(c, "target_session_attrs", "any");
	PQfinish(c);
}

Test(db, reconnects_back_off_from_100_ms_to_at_most_1600_ms)
{
	static const long want[] = { 0, 100, 200, 400, 800, 1600, 1600, 1600, 1600 };
	struct db_settings s = { .conninfo = "host=127.0.0.1 port=1 dbname=x connect_timeout=1",
		                 .application_name = "test_db",
		                 .stmts = queries,
		                 .nstmts = Q__COUNT };
	struct timespec t0, t;
	struct err e;
	struct db *db;
	double elapsed;

	for (int i = 0; i < 9; i++)
		cr_assert_eq(db_backoff_ms(i), want[i], "after %d failures", i);
	cr_assert_eq(db_backoff_ms(1000), 1600);

	/* Against a dead address, statements fail at once; connects are
	 * tried at 0, 100, 300, 700 and 1500 ms: 5 in 1.6 s, not one per
	 * statement (nor one per 100 ms). */
	db = db_open(&s, &e);
	cr_assert_not_null(db);
	cr_assert_eq(e.code, ERR_DB_DOWN);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		PGresult *res = db_run(db, Q_SCHEMA_VERSION, 0, NULL, &e);
		cr_assert_null(res);
		cr_assert_eq(e.code, ERR_DB_DOWN);
		cr_assert_eq(e.outcome_unknown, 0, "nothing was sent");
		usleep(5000);
		clock_gettime(CLOCK_MONOTONIC, &t);
		elapsed = (double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9;
	} while (elapsed < 1.6);
	cr_assert(db_connect_attempts(db) >= 3 && db_connect_attempts(db) <= 6,
	          "%lu connects in 1.6 s", db_connect_attempts(db));
	db_close(db);
}

Test(db, a_read_only_server_is_unavailable_and_the_connection_is_dropped)
{
	char *ci = hostile_conninfo(""), *ro;
	struct claim c;
	struct err e;
	PGresult *res;

	cr_assert(asprintf(&ro, "%s options='-c default_transaction_read_only=on'",
	                   getenv("DATABASE_URL")) > 0);
	struct db_settings s = { .conninfo = ro,
		                 .application_name = "test_db",
		                 .lock_timeout_ms = 5000,
		                 .stmts = queries,
		                 .nstmts = Q__COUNT };
	struct db *db = db_open(&s, &e);
	cr_assert_not_null(db);
	cr_assert_eq(e.code, ERR_NONE, "%s", e.msg);
	claim_init(&c, "ro-key", "{\"type\":\"t\"}", "1 hour");
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, c.p, &e);
	cr_assert_null(res);
	cr_assert_eq(e.code, ERR_DB_DOWN, "%s", e.msg);
	cr_assert_str_eq(e.sqlstate, "25006");
	cr_assert_eq(e.outcome_unknown, 0, "refused: nothing was committed");
	/* The next statement connects again. */
	res = db_run(db, Q_SCHEMA_VERSION, 0, NULL, &e);
	cr_assert_not_null(res, "%s", e.msg);
	PQclear(res);
	cr_assert_eq(db_reconnects(db), 1);
	db_close(db);
	free(ro);
	free(ci);
}

/* A write refused by a read-only server drops the connection, and each
 * reconnect prepares every statement: the first is at once (a new primary
 * may be there); a new session refused again is kept, answering every
 * write with the server's refusal, and left again after a back-off. */
Test(db, a_read_only_server_is_asked_again_with_backoff)
{
	struct timespec t0, t;
	struct err e;
	char *ro;
	double elapsed;
	long refused = 0;

	cr_assert(asprintf(&ro, "%s options='-c default_transaction_read_only=on'",
	                   getenv("DATABASE_URL")) > 0);
	struct db_settings s = {
		.conninfo = ro, .application_name = "test_db", .stmts = queries, .nstmts = Q__COUNT
	};
	struct db *db = db_open(&s, &e);
	cr_assert_not_null(db);
	cr_assert_eq(e.code, ERR_NONE, "%s", e.msg);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		const char *kg[KEY_GET__N] = { [KEY_GET_TENANT] = "1", [KEY_GET_KEY] = "ro" };
		PGresult *res = db_run(db, Q_KEY_DELETE_EXPIRED, KEY_GET__N, kg, &e);
		cr_assert_null(res);
		cr_assert_eq(e.code, ERR_DB_DOWN, "%s", e.msg);
		refused += strcmp(e.sqlstate, "25006") == 0;
		usleep(5000);
		clock_gettime(CLOCK_MONOTONIC, &t);
		elapsed = (double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9;
	} while (elapsed < 1.6);
	/* Connects at 0 (open), 0, 100, 300, 700 and 1500 ms; every write
	 * in between is refused on the session kept meanwhile. */
	cr_assert(db_connect_attempts(db) >= 4 && db_connect_attempts(db) <= 6,
	          "%lu connects in 1.6 s (%ld writes refused)", db_connect_attempts(db), refused);
	cr_assert_gt(refused, 2 * (long)db_connect_attempts(db), "%ld writes refused", refused);
	db_close(db);
	free(ro);
}

/* The time a worker sends is its own clock's: it may be wrong. Whatever it
 * says, a key lives its TTL from the database's now(), and a new event is
 * due at the database's now(). */
Test(db, lifetimes_and_due_times_come_from_the_database_clock)
{
	struct db *db = open_db(5000);
	struct claim c;
	struct err e;
	PGresult *res;
	char id[IDS_UUID_LEN + 1];

	/* A worker two days slow: its key would be born expired. */
	claim_init(&c, "slow-clock", "{\"type\":\"t\"}", "1 hour");
	c.p[7] = "2000-01-01T00:00:00.000000Z";
	res = db_run(db, Q_CREATE_KEYED, CREATE_KEYED__N, c.p, &e);
	cr_assert_not_null(res, "%s", e.msg);
	cr_assert_str_eq(outcome(res), "created");
	PQclear(res);
	cr_assert_eq(count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1"
	                   " AND expires_at > now() + interval '59 minutes'"
	                   " AND created_at > now() - interval '1 minute'"),
	             1, "the key lives an hour from now");
	/* A worker a day fast: its events would wait a day. */
	cr_assert_eq(ids_uuid7(id), 0);
	const char *p[WF_CREATE_RUN__N] = {
		[WF_CREATE_RUN_TENANT] = tenant,
		[WF_CREATE_RUN_ID] = id,
		[WF_CREATE_RUN_TYPE] = "t",
		[WF_CREATE_RUN_INPUT] = "{}",
		[WF_CREATE_RUN_CREATED_AT] = "2099-01-01T00:00:00Z",
		[WF_CREATE_RUN_STEPS] = "[{\"name\":\"a\",\"job_type\":\"j\"}]",
		[WF_CREATE_RUN_BUSINESS_KEY] = NULL,
		[WF_CREATE_RUN_PAYLOAD_HEAD] = "{\"tenant_id\":",
		[WF_CREATE_RUN_PAYLOAD_TAIL] = "}",
		[WF_CREATE_RUN_PRIORITY] = "0",
	};
	res = db_run(db, Q_WF_CREATE_RUN, WF_CREATE_RUN__N, p, &e);
	cr_assert_not_null(res, "%s", e.msg);
	PQclear(res);
	cr_assert_eq(count("SELECT count(*) FROM outbox WHERE tenant_id = $1"
	                   " AND next_attempt_at <= now()"),
	             2, "both events are due now");
	db_close(db);
}

/* --- Migrations ----------------------------------------------------------- */

static PGconn *mig_conn(const char *db)
{
	char conninfo[512];
	PGconn *c;

	snprintf(conninfo, sizeof(conninfo), "host=%s port=%s user=%s dbname=%s", getenv("PGHOST"),
	         getenv("PGPORT"), getenv("PGUSER"), db);
	c = PQconnectdb(conninfo);
	cr_assert_eq(PQstatus(c), CONNECTION_OK, "%s", PQerrorMessage(c));
	return c;
}

static void mig_sql(PGconn *c, const char *sql)
{
	PGresult *res = PQexec(c, sql);

	cr_assert(PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK,
	          "%s: %s", sql, PQerrorMessage(c));
	PQclear(res);
}

static long mig_count(PGconn *c, const char *sql)
{
	PGresult *res = PQexec(c, sql);
	long n;

	cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "%s: %s", sql, PQerrorMessage(c));
	n = atol(PQgetvalue(res, 0, 0));
	PQclear(res);
	return n;
}

/* idemflow --db (db) migrate, its stdout to out; returns the pid. */
static pid_t mig_spawn(const char *db, const char *out)
{
	char conninfo[512];
	pid_t pid;

	snprintf(conninfo, sizeof(conninfo), "host=%s port=%s user=%s dbname=%s", getenv("PGHOST"),
	         getenv("PGPORT"), getenv("PGUSER"), db);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		dup2(fd, STDOUT_FILENO);
		dup2(fd, STDERR_FILENO);
		execl(getenv("IDEMFLOW_CLI"), "idemflow", "--db", conninfo, "migrate",
		      (char *)NULL);
		_exit(127);
	}
	return pid;
}

/* "migrate: applied N migration(s); ..." from out; -1 when absent. */
static int mig_applied(const char *out)
{
	FILE *f = fopen(out, "r");
	char line[512];
	int n = -1;

	cr_assert_not_null(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "migrate: applied %d migration", &n) == 1)
			break;
	fclose(f);
	return n;
}

static char mig_db[64];

static void mig_drop(void)
{
	char q[160];

	if (mig_db[0] == '\0')
		return;
	snprintf(q, sizeof(q), "DROP DATABASE IF EXISTS %s WITH (FORCE)", mig_db);
	PQclear(PQexec(admin, q));
	mig_db[0] = '\0';
	PQfinish(admin);
}

/*
 * Two "idemflow migrate" at once on an empty database: both wait on the
 * migrations' advisory lock (held here first, so that both are seen
 * waiting), then each migration is applied once, by one or the other,
 * and both succeed. A third run applies nothing.
 */
Test(migrate, two_concurrent_runs_queue_on_the_advisory_lock_and_apply_each_migration_once,
     .init = setup, .fini = mig_drop, .timeout = 60)
{
	char q[160], out[2][600], out3[620];
	pid_t pid[2];
	PGconn *hold;
	long waiting = 0;
	double deadline;
	int st;

	snprintf(mig_db, sizeof(mig_db), "migtest_%ld", (long)getpid());
	snprintf(q, sizeof(q), "CREATE DATABASE %s", mig_db);
	mig_sql(admin, q);
	hold = mig_conn(mig_db);
	mig_sql(hold, "SELECT pg_advisory_lock(7594306392197721975)");
	for (int i = 0; i < 2; i++) {
		snprintf(out[i], sizeof(out[i]), "%s/migrate-%ld-%d.out",
		         getenv("IDEMFLOW_STACK_DIR") ? getenv("IDEMFLOW_STACK_DIR") : "/tmp",
		         (long)getpid(), i);
		pid[i] = mig_spawn(mig_db, out[i]);
	}
	deadline = tstack_now() + 20;
	while (waiting < 2 && tstack_now() < deadline) {
		usleep(20 * 1000);
		waiting =
		    mig_count(hold, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
		                    "   AND NOT granted AND database = (SELECT oid FROM"
		                    "   pg_database WHERE datname = current_database())");
	}
	mig_sql(hold, "SELECT pg_advisory_unlock(7594306392197721975)");
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(waitpid(pid[i], &st, 0), pid[i]);
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "migrate %d ended with 0x%x", i,
		          st);
	}
	cr_assert_eq(waiting, 2, "%ld runs waited on the advisory lock, want 2", waiting);
	cr_assert_eq(mig_applied(out[0]) + mig_applied(out[1]), migrations_count,
	             "applied %d + %d of %d migrations", mig_applied(out[0]), mig_applied(out[1]),
	             migrations_count);
	snprintf(q, sizeof(q),
	         "SELECT (count(*) = count(DISTINCT version) AND count(*) = %d"
	         "  AND max(version) = %d)::int FROM schema_migrations",
	         migrations_count, migrate_latest());
	cr_assert_eq(mig_count(hold, q), 1, "schema_migrations: each version once, all of them");
	PQfinish(hold);

	/* Nothing left to do. */
	snprintf(out3, sizeof(out3), "%s.3", out[0]);
	pid[0] = mig_spawn(mig_db, out3);
	cr_assert_eq(waitpid(pid[0], &st, 0), pid[0]);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	cr_assert_eq(mig_applied(out3), 0);
}
