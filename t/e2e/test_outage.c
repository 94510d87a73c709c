/*
 * test_outage.c - PostgreSQL going away under the worker pool.
 *
 * Stops and restarts the harness's own PostgreSQL, so this binary has a
 * stack of its own (t/run-test) and one test that runs the scenes in order.
 * Proves: while the database is down every request gets a clean 503 with
 * Retry-After and nothing is half-written; once it is back the workers
 * reconnect by themselves and the retried request creates exactly once; a
 * restart while the workers are idle costs no failed request at all.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <json-c/json.h>

#include "http.h"
#include "tapi.h"
#include "tlog.h"
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

static const char BODY[] = "{\"type\":\"outage\",\"input\":{\"n\":1}}";

static struct http_response *post(const struct tstack_tenant *t, const char *key)
{
	char kh[300];
	struct http_response *r;

	snprintf(kh, sizeof(kh), "Idempotency-Key: %s", key);
	const char *headers[] = { t->auth, "Content-Type: application/json", kh, NULL };
	r = http_request("POST", "/v1/workflows", headers, BODY, strlen(BODY));
	cr_assert_not_null(r, "POST: %s", http_error());
	return r;
}

/* A 503 problem, checked with json-c: the shared helpers parse JSON in
 * PostgreSQL, which is exactly what is down here. */
static void expect_unavailable(const struct http_response *r)
{
	struct json_object *v, *m;

	cr_assert_eq(r->status, 503, "got %d: %s", r->status, r->body);
	tstack_expect_header(r, "Content-Type", "application/problem+json");
	tstack_expect_header(r, "Retry-After", "1");
	v = json_tokener_parse(r->body);
	cr_assert_not_null(v, "not JSON: %s", r->body);
	cr_assert(json_object_object_get_ex(v, "type", &m));
	cr_assert_str_eq(json_object_get_string(m),
	                 "https://idemflow.example/problems/unavailable");
	cr_assert(json_object_object_get_ex(v, "status", &m));
	cr_assert_eq(json_object_get_int(m), 503);
	cr_assert(json_object_object_get_ex(v, "request_id", &m));
	cr_assert_str_eq(json_object_get_string(m), http_header(r, "X-Request-Id"));
	json_object_put(v);
}

/* Rows of one kind for the tenant, on a fresh connection: the restarts
 * end every connection opened before them. */
static long rows(const struct tstack_tenant *t, const char *table)
{
	char sql[128];
	PGconn *c = tstack_db_connect();
	const char *p[1] = { t->id_text };
	PGresult *res;
	long n;

	snprintf(sql, sizeof(sql), "SELECT count(*) FROM %s WHERE tenant_id = $1", table);
	res = PQexecParams(c, sql, 1, NULL, p, NULL, NULL, 0);
	cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "%s", PQerrorMessage(c));
	n = atol(PQgetvalue(res, 0, 0));
	PQclear(res);
	PQfinish(c);
	return n;
}

static void expect_rows(const struct tstack_tenant *t, long n)
{
	cr_assert_eq(rows(t, "workflows"), n, "workflows");
	cr_assert_eq(rows(t, "outbox"), n, "outbox events");
	cr_assert_eq(rows(t, "idempotency_keys"), n, "keys");
}

/* Bursts twice as wide as the pool (3 workers), until the request log
 * shows that every worker answered. */
#define BURST      6
#define MAX_BURSTS 50
#define SHOTS_MAX  (BURST * MAX_BURSTS)

struct shots {
	const struct tstack_tenant *t;
	const char *key; /* one key for all, or NULL: a fresh key each */
	char keys[SHOTS_MAX][128];
	int created;
};

/* POST as in post(), on a burst's thread: no assertions. */
static struct http_response *send_post(int i, void *arg)
{
	struct shots *s = arg;
	char kh[300];

	snprintf(kh, sizeof(kh), "Idempotency-Key: %s", s->key ? s->key : s->keys[i]);
	const char *headers[] = { s->t->auth, "Content-Type: application/json", kh, NULL };
	return http_request("POST", "/v1/workflows", headers, BODY, strlen(BODY));
}

static void check_unavailable(const struct http_response *r, int i, void *arg)
{
	(void)i;
	(void)arg;
	expect_unavailable(r);
}

static void check_created(const struct http_response *r, int i, void *arg)
{
	struct shots *s = arg;

	cr_assert_eq(r->status, 201, "request %d after an idle restart got %d: %s", i, r->status,
	             r->body);
	s->created++;
}

TestSuite(outage, .timeout = 120);

Test(outage, database_down_gives_503_then_workers_reconnect_on_their_own)
{
	struct tstack_tenant t;
	struct http_response *r;
	char key[128];
	static struct shots shots;
	pid_t sup = tstack_supervisor_pid();
	const char *log = tstack_env("IDEMFLOW_FCGI_LOG");
	int n;

	cr_assert(tstack_wait_workers(sup, 3, 5000));
	tstack_tenant_create(&t, "outage");
	tstack_key(key, sizeof(key), "before");
	r = post(&t, key);
	cr_assert_eq(r->status, 201);
	http_response_free(r);

	/* Scene 1: PostgreSQL is stopped. Every worker (the request log
	 * names each) answers 503 with Retry-After; nothing hangs. */
	tstack_pg_ctl("stop");
	tstack_key(key, sizeof(key), "during");
	shots = (struct shots){ .t = &t, .key = key };
	n = tstack_every_worker(sup, log, BURST, MAX_BURSTS, send_post, check_unavailable, &shots);

	/* /metrics still answers: the counters (those 503s among them), and
	 * idemflow_db_up 0 in place of the gauges that need the database. */
	r = http_fcgi_request(tstack_env("IDEMFLOW_FCGI_SOCKET"), "GET", "/metrics", NULL, NULL, 0);
	cr_assert_not_null(r, "%s", http_error());
	cr_assert_eq(r->status, 200, "GET /metrics with the database down: %d %.300s", r->status,
	             r->body);
	cr_assert_not_null(strstr(r->body, "\nidemflow_db_up 0\n"), "%s", r->body);
	cr_assert_null(strstr(r->body, "\nidemflow_outbox_pending "), "a gauge without its data");
	{
		const char *at =
		    strstr(r->body, "\nidemflow_requests_total{route=\"/v1/workflows\","
		                    "status=\"503\"} ");
		cr_assert_not_null(at, "no 503 counter: %s", r->body);
		cr_assert_geq(atol(strchr(at, '}') + 2), n, "503s counted");
	}
	http_response_free(r);

	/* Scene 2: it is back. The same request, retried as a client would
	 * on 503, succeeds within a few seconds and creates exactly once. */
	tstack_pg_ctl("start");
	double deadline = tstack_now() + 10;
	int status = 0;
	while (tstack_now() < deadline) {
		r = post(&t, key);
		status = r->status;
		http_response_free(r);
		if (status != 503)
			break;
		tstack_sleep_ms(200);
	}
	cr_assert_eq(status, 201, "after the restart the retry got %d", status);
	expect_rows(&t, 2);

	/* Scene 3: a restart while the workers are idle. Each worker notices
	 * its closed connection before its next statement and reconnects:
	 * not one request fails. */
	tstack_pg_ctl("restart");
	shots = (struct shots){ .t = &t };
	for (int i = 0; i < SHOTS_MAX; i++)
		tstack_key(shots.keys[i], sizeof(shots.keys[i]), "after-restart");
	n = tstack_every_worker(sup, log, BURST, MAX_BURSTS, send_post, check_created, &shots);
	cr_assert_eq(shots.created, n);
	expect_rows(&t, 2 + n);
}
