/*
 * test_faults.c - honest answers when the database misbehaves.
 *
 * Through nginx and the harness's pool unless a test says otherwise:
 * - hostile database-level settings (ALTER DATABASE ... SET bytea_output,
 *   default_transaction_isolation, DateStyle, search_path, ...) change
 *   nothing: honest retries replay byte for byte, concurrent duplicates
 *   converge, the CLI and the dispatcher work;
 * - a read-only database is 503 with Retry-After (not 500), /readyz says
 *   not ready, and each worker drops its connection so it picks up the
 *   writable server by itself;
 * - a connection lost while a write could have committed is 503
 *   outcome-unknown, and the retry with the same key finds out (a replay
 *   when it had committed); lost before anything could commit is 503
 *   unavailable, nothing stored; a commit whose wait for the synchronous
 *   standby was cancelled (committed locally only) is 503 outcome-unknown
 *   too, and a weaker synchronous_commit of the database is raised so
 *   that every commit waits for the standby;
 * - a multi-host conninfo finds the writable server after a "failover" with
 *   bounded back-off, without a pool restart;
 * - a key TTL too short for idempotency_wait is refused at start and on
 *   reload.
 *
 * The tests change database-wide settings (and, for one, the server's
 * synchronous_standby_names): they run one at a time, and each .fini
 * resets what it changed and ends the workers' sessions.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "http.h"
#include "tapi.h"
#include "tlog.h"
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

#define COLLECTION "/v1/workflows"
#define JSON_CT    "Content-Type: application/json"

/*
 * Settings of its own (TSTACK_SETTINGS): idempotency_wait, which is also
 * every worker's lock_timeout, is 10 s, not the harness's 1 s, a window
 * too short on a loaded machine: three workers wait on one held claim, and a waiting
 * session is terminated, all inside that wait.
 */
TSTACK_SETTINGS("idempotency_wait = 10s\n")

TSTACK_SEQUENTIAL

/* The test's own session, immune to the database-level settings it makes. */
static PGconn *admin;

static void exec_ok(PGconn *c, const char *sql)
{
	PGresult *res = PQexec(c, sql);
	ExecStatusType st = PQresultStatus(res);

	cr_assert(st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK, "%s: %s", sql,
	          PQerrorMessage(c));
	PQclear(res);
}

static void session_safe(PGconn *c)
{
	exec_ok(c,
	        "SET default_transaction_read_only = off; SET search_path = public;"
	        " SET bytea_output = 'hex'; SET default_transaction_isolation = 'read committed';"
	        " SET synchronous_commit = local; SET client_encoding = 'UTF8'");
}

/* ALTER DATABASE <ours> SET name = value (value as SQL text). */
static void db_set(const char *name, const char *value)
{
	char sql[512];

	snprintf(sql, sizeof(sql), "ALTER DATABASE \"%s\" SET %s = %s", PQdb(admin), name, value);
	exec_ok(admin, sql);
}

/*
 * End every session of the workers whose application_name starts with
 * prefix and wait until they are gone, so that each worker's next request
 * reconnects (and gets the database's settings as they are now).
 */
static void renew_sessions(const char *prefix)
{
	char like[128];
	const char *p[1] = { like };
	double deadline = tstack_now() + 10;
	PGresult *res;

	snprintf(like, sizeof(like), "%s-worker-%%", prefix);
	res = PQexecParams(admin,
	                   "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
	                   " WHERE application_name LIKE $1",
	                   1, NULL, p, NULL, NULL, 0);
	cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "%s", PQerrorMessage(admin));
	PQclear(res);
	for (;;) {
		res = PQexecParams(
		    admin, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1",
		    1, NULL, p, NULL, NULL, 0);
		cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "%s", PQerrorMessage(admin));
		long n = atol(PQgetvalue(res, 0, 0));
		PQclear(res);
		if (n == 0)
			return;
		cr_assert(tstack_now() < deadline, "%ld worker sessions outlived their end", n);
		tstack_sleep_ms(20);
	}
}

static void setup(void)
{
	admin = tstack_db_connect();
	session_safe(admin);
	session_safe(tstack_db()); /* the helpers' session, opened now */
}

static void teardown(void)
{
	char sql[256];

	if (admin == NULL)
		return;
	snprintf(sql, sizeof(sql), "ALTER DATABASE \"%s\" RESET ALL", PQdb(admin));
	PQclear(PQexec(admin, sql));
	PQclear(PQexec(admin,
	               "DO $$ BEGIN IF to_regclass('api_tokens_hidden') IS NOT NULL THEN"
	               " ALTER TABLE api_tokens_hidden RENAME TO api_tokens; END IF; END $$"));
	PQclear(PQexec(admin, "ALTER SYSTEM RESET synchronous_standby_names"));
	PQclear(PQexec(admin, "SELECT pg_reload_conf()"));
	PQclear(PQexec(admin, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
	                      " WHERE application_name LIKE '%-worker-%'"));
	PQfinish(admin);
	admin = NULL;
}

TestSuite(faults, .init = setup, .fini = teardown, .timeout = 120);

static struct http_response *post(const char *sock, const struct tstack_tenant *t, const char *path,
                                  const char *key, const char *body)
{
	char kh[300];
	const char *headers[] = { t->auth, JSON_CT, kh, NULL };
	struct http_response *r;

	snprintf(kh, sizeof(kh), "Idempotency-Key: %s", key);
	if (sock != NULL)
		r = http_fcgi_request(sock, "POST", path, headers, body, strlen(body));
	else
		r = http_request("POST", path, headers, body, strlen(body));
	cr_assert_not_null(r, "POST %s: %s", path, http_error());
	return r;
}

static struct http_response *get(const char *sock, const struct tstack_tenant *t, const char *path)
{
	const char *headers[] = { t != NULL ? t->auth : NULL, NULL };
	struct http_response *r;

	if (sock != NULL)
		r = http_fcgi_request(sock, "GET", path, t != NULL ? headers : NULL, NULL, 0);
	else
		r = http_request("GET", path, t != NULL ? headers : NULL, NULL, 0);
	cr_assert_not_null(r, "GET %s: %s", path, http_error());
	return r;
}

/* A 503 of the given type, with Retry-After, whose detail holds want. */
static void expect_503(const struct http_response *r, const char *type, const char *instance,
                       const char *want)
{
	char *detail;

	tstack_expect_problem(r, 503, type, instance);
	tstack_expect_header(r, "Retry-After", "1");
	detail = tstack_json(r->body, "{detail}");
	cr_assert_not_null(detail, "no detail: %s", r->body);
	cr_assert(strstr(detail, want) != NULL, "detail \"%s\" lacks \"%s\"", detail, want);
	free(detail);
}

static long tenant_rows(const struct tstack_tenant *t, const char *table)
{
	char sql[128];

	snprintf(sql, sizeof(sql), "SELECT count(*) FROM %s WHERE tenant_id = $1", table);
	return tstack_count(sql, t->id_text);
}

/* --- item 4: hostile settings ------------------------------------------ */

Test(faults, bytea_output_escape_still_replays_honest_retries)
{
	const char *body = "{\"type\":\"escape\",\"input\":{\"a\":1,\"b\":[2]}}";
	const char *same = "{ \"input\": { \"b\": [2], \"a\": 1 }, \"type\": \"escape\" }";
	const char *steps =
	    "{\"type\":\"escape-steps\",\"steps\":[{\"name\":\"s\",\"job_type\":\"j\"}]}";
	struct http_response *first, *r;
	struct tstack_tenant t;
	char key[128], key2[128];

	tstack_tenant_create(&t, "escape");
	db_set("bytea_output", "'escape'");
	renew_sessions("idemflow");

	tstack_key(key, sizeof(key), "escape");
	first = post(NULL, &t, COLLECTION, key, body);
	free(tstack_expect_created(first, "escape", "{\"a\":1,\"b\":[2]}"));
	/* Every worker (3) gets the retry at least once. */
	for (int i = 0; i < 4; i++) {
		r = post(NULL, &t, COLLECTION, key, i % 2 ? same : body);
		tstack_expect_replay(r, first);
		http_response_free(r);
	}
	/* A keyed command that claims its key in a transaction (cmd.c). */
	tstack_key(key2, sizeof(key2), "escape-steps");
	struct http_response *first2 = post(NULL, &t, COLLECTION, key2, steps);
	cr_assert_eq(first2->status, 201, "%d %s", first2->status, first2->body);
	for (int i = 0; i < 4; i++) {
		r = post(NULL, &t, COLLECTION, key2, steps);
		tstack_expect_replay(r, first2);
		http_response_free(r);
	}
	tstack_expect_counts(&t, 2, 2, 2);
	http_response_free(first);
	http_response_free(first2);
}

struct racer {
	const struct tstack_tenant *t;
	const char *key, *body;
	struct http_response *resp;
	char err[256];
};

static void *race(void *arg)
{
	struct racer *r = arg;
	char kh[300];
	const char *headers[] = { r->t->auth, JSON_CT, kh, NULL };

	snprintf(kh, sizeof(kh), "Idempotency-Key: %s", r->key);
	r->resp = http_request("POST", COLLECTION, headers, r->body, strlen(r->body));
	if (r->resp == NULL)
		snprintf(r->err, sizeof(r->err), "%s", http_error());
	return NULL;
}

/* Backend pids of worker sessions waiting on holder's locks: at least
 * want of them within timeout_ms, else the test fails. out: the first. */
static int wait_blocked(PGconn *holder, int want, long timeout_ms)
{
	char backend[24], *v;
	double deadline = tstack_now() + timeout_ms / 1000.0;

	snprintf(backend, sizeof(backend), "%d", PQbackendPID(holder));
	for (;;) {
		v = tstack_text("SELECT count(*) || ' ' || coalesce(min(pid), 0)"
		                "  FROM pg_stat_activity"
		                " WHERE $1::int = ANY (pg_blocking_pids(pid))"
		                "   AND application_name LIKE '%-worker-%'",
		                backend);
		int n = atoi(v), pid = atoi(strchr(v, ' ') + 1);
		free(v);
		if (n >= want)
			return pid;
		cr_assert(tstack_now() < deadline, "%d of %d workers blocked", n, want);
		tstack_sleep_ms(10);
	}
}

static void race_one_key(const char *isolation)
{
	const char *body = "{\"type\":\"race\",\"input\":{\"n\":7}}";
	struct tstack_tenant t;
	struct racer r[3];
	pthread_t th[3];
	char key[128];
	PGconn *hold;
	int created = 0;

	tstack_tenant_create(&t, "race");
	db_set("default_transaction_isolation", isolation);
	renew_sessions("idemflow");
	tstack_key(key, sizeof(key), "race");

	/* All three workers wait on one uncommitted claim of the key; when
	 * it goes, one of them wins and the two others must replay it. */
	hold = tstack_db_connect();
	session_safe(hold);
	tstack_key_hold(hold, &t, key);
	for (int i = 0; i < 3; i++) {
		r[i] = (struct racer){ .t = &t, .key = key, .body = body };
		cr_assert_eq(pthread_create(&th[i], NULL, race, &r[i]), 0);
	}
	wait_blocked(hold, 3, 5000);
	exec_ok(hold, "ROLLBACK");
	PQfinish(hold);
	for (int i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < 3; i++) {
		cr_assert_not_null(r[i].resp, "racer %d: %s", i, r[i].err);
		cr_assert_eq(r[i].resp->status, 201, "racer %d got %d: %s", i, r[i].resp->status,
		             r[i].resp->body);
		created += http_header(r[i].resp, "Idempotent-Replayed") == NULL;
		cr_assert_eq(r[i].resp->body_len, r[0].resp->body_len);
		cr_assert(memcmp(r[i].resp->body, r[0].resp->body, r[0].resp->body_len) == 0);
	}
	cr_assert_eq(created, 1, "%d answers were not replays", created);
	tstack_expect_counts(&t, 1, 1, 1);
	for (int i = 0; i < 3; i++)
		http_response_free(r[i].resp);
}

Test(faults, repeatable_read_default_still_converges_concurrent_duplicates)
{
	race_one_key("'repeatable read'");
}

Test(faults, serializable_default_still_converges_concurrent_duplicates)
{
	race_one_key("'serializable'");
}

Test(faults, hostile_session_defaults_leave_the_api_cli_and_dispatcher_working)
{
	static const char *const hostile[][2] = {
		{ "bytea_output", "'escape'" },
		{ "default_transaction_isolation", "'serializable'" },
		{ "DateStyle", "'SQL, DMY'" },
		{ "IntervalStyle", "'sql_standard'" },
		{ "TimeZone", "'Asia/Kathmandu'" },
		{ "extra_float_digits", "-15" },
		{ "search_path", "'pg_catalog'" },
		{ "standard_conforming_strings", "off" },
		{ "client_encoding", "'LATIN1'" },
		{ "transform_null_equals", "on" },
		{ "array_nulls", "off" },
		{ "synchronous_commit", "off" },
	};
	const char *body = "{\"type\":\"hostile\",\"input\":{\"s\":\"caf\xc3\xa9\"}}";
	struct http_response *first, *r;
	struct tstack_tenant t;
	char key[128], out[4096], line[256], path[600], file[512], cmd[1200];

	for (size_t i = 0; i < sizeof(hostile) / sizeof(hostile[0]); i++)
		db_set(hostile[i][0], hostile[i][1]);
	renew_sessions("idemflow");

	/* The CLI: a tenant, a TTL, and the list that prints both in the
	 * documented form (ISO time in UTC, postgres-style interval), and its
	 * workflow retention (the CLI's). */
	tstack_tenant_create(&t, "hostile");
	cr_assert_eq(tstack_cli(out, sizeof(out), "tenant", "set-ttl", t.name, "90m", NULL), 0,
	             "%s", tstack_cli_stderr());
	cr_assert_eq(tstack_cli(out, sizeof(out), "tenant", "list", NULL), 0, "%s",
	             tstack_cli_stderr());
	snprintf(line, sizeof(line),
	         "(^|\n)%ld\t%s\t[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:"
	         "[0-9]{2}(\\.[0-9]+)?\\+00\t01:30:00\tdefault(\n|$)",
	         t.id, t.name);
	tstack_expect_match(out, line, "tenant list");

	/* The API: a create, its replays, a read, a keyed command. */
	tstack_key(key, sizeof(key), "hostile");
	first = post(NULL, &t, COLLECTION, key, body);
	char *id = tstack_expect_created(first, "hostile", "{\"s\":\"caf\xc3\xa9\"}");
	for (int i = 0; i < 4; i++) {
		r = post(NULL, &t, COLLECTION, key, body);
		tstack_expect_replay(r, first);
		http_response_free(r);
	}
	snprintf(path, sizeof(path), "/v1/workflows/%s", id);
	r = get(NULL, &t, path);
	cr_assert_eq(r->status, 200, "%d %s", r->status, r->body);
	cr_assert(strstr(r->body, "\"s\":\"caf\xc3\xa9\"") != NULL, "%s", r->body);
	tstack_expect_match(r->body, "\"created_at\":\"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z\"",
	                    "created_at");
	http_response_free(r);
	snprintf(path, sizeof(path), "/v1/workflows/%s/transitions", id);
	tstack_key(key, sizeof(key), "hostile-cancel");
	http_response_free(first);
	first = post(NULL, &t, path, key, "{\"to\":\"cancelled\"}");
	cr_assert_eq(first->status, 200, "%d %s", first->status, first->body);
	r = post(NULL, &t, path, key, "{\"to\":\"cancelled\"}");
	cr_assert_eq(r->status, 200);
	tstack_expect_header(r, "Idempotent-Replayed", "true");
	http_response_free(r);
	http_response_free(first);

	/* The dispatcher delivers the tenant's event and records it. */
	snprintf(file, sizeof(file), "%s/faults-%ld.events", tstack_env("IDEMFLOW_STACK_DIR"),
	         (long)getpid());
	snprintf(cmd, sizeof(cmd), "cat >> '%s'; echo >> '%s'", file, file);
	const char *argv[] = { tstack_env("IDEMFLOW_DISPATCH"),
		               "--db",
		               tstack_env("DATABASE_URL"),
		               "--once",
		               "--sink",
		               "exec",
		               "--exec",
		               cmd,
		               NULL };
	snprintf(path, sizeof(path), "%s/faults-%ld.dispatch.log", tstack_env("IDEMFLOW_STACK_DIR"),
	         (long)getpid());
	pid_t pid = tstack_spawn(argv, path);
	int status;
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "dispatch status 0x%x (see %s)",
	          status, path);
	cr_assert_eq(tstack_count("SELECT count(*) FROM outbox WHERE tenant_id = $1"
	                          " AND published_at IS NULL",
	                          t.id_text),
	             0);
	cr_assert_eq(tenant_rows(&t, "outbox"), 2); /* created, cancelled */
	free(id);
}

/* --- item 5: read-only, lost connections, failover --------------------- */

Test(faults, read_only_database_is_503_not_ready_and_each_worker_reconnects)
{
	const char *body = "{\"type\":\"ro\",\"input\":{}}";
	long workers = tstack_conf_long("workers", 4);
	struct http_response *r;
	struct tstack_tenant t;
	char key[128], *detail;
	double deadline;
	int tries;

	tstack_tenant_create(&t, "ro");
	db_set("default_transaction_read_only", "on");
	renew_sessions("idemflow");

	tstack_key(key, sizeof(key), "ro");
	/* More tries than workers: every worker answers at least one. */
	for (int i = 0; i < 2 * workers; i++) {
		r = post(NULL, &t, COLLECTION, key, body);
		expect_503(r, "/problems/unavailable", COLLECTION, "read-only");
		http_response_free(r);
	}
	r = get(NULL, NULL, "/readyz");
	expect_503(r, "/problems/unavailable", "/readyz", "read-only");
	http_response_free(r);
	/* Reading still works. */
	r = get(NULL, &t, COLLECTION);
	cr_assert_eq(r->status, 200, "%d %s", r->status, r->body);
	http_response_free(r);
	cr_assert_eq(tenant_rows(&t, "workflows"), 0);
	cr_assert_eq(tenant_rows(&t, "idempotency_keys"), 0);

	/* Writable again. Nobody ends the workers' sessions now: a worker
	 * drops its session when it finds it read-only, at once the first
	 * time, then (each reconnect preparing every statement) after 100 ms
	 * doubling to 1.6 s; meanwhile it answers read-only, then the same
	 * request creates. */
	{
		char sql[256];
		snprintf(sql, sizeof(sql),
		         "ALTER DATABASE \"%s\" RESET default_transaction_read_only", PQdb(admin));
		exec_ok(admin, sql);
	}
	deadline = tstack_now() + 5;
	for (tries = 0; tstack_now() < deadline; tries++) {
		r = post(NULL, &t, COLLECTION, key, body);
		if (r->status == 201)
			break;
		expect_503(r, "/problems/unavailable", COLLECTION, "read-only");
		http_response_free(r);
		r = NULL;
		tstack_sleep_ms(50);
	}
	cr_assert_not_null(r, "still read-only after %d tries", tries);
	free(tstack_expect_created(r, "ro", "{}"));
	http_response_free(r);
	for (int i = 0; i <= workers; i++) {
		r = get(NULL, NULL, "/readyz");
		if (r->status == 200)
			break;
		detail = tstack_json(r->body, "{detail}");
		cr_assert(strstr(detail, "read-only") != NULL, "%s", r->body);
		free(detail);
		http_response_free(r);
		r = NULL;
	}
	cr_assert_not_null(r, "/readyz still not ready");
	http_response_free(r);
	tstack_expect_counts(&t, 1, 1, 1);
}

/*
 * Make every commit wait for a synchronous standby that never comes, and
 * return a session whose own commit is seen waiting (so the setting is in
 * force). A session ended during that wait has committed locally: exactly
 * the "connection lost after COMMIT was sent" case.
 */
static PGconn *sync_rep_on(void)
{
	double deadline = tstack_now() + 15;

	exec_ok(admin, "ALTER SYSTEM SET synchronous_standby_names = 'idemflow_no_standby'");
	exec_ok(admin, "SELECT pg_reload_conf()");
	for (;;) {
		PGconn *probe = tstack_db_connect();
		char pid[24];
		session_safe(probe);
		exec_ok(probe, "SET synchronous_commit = on");
		snprintf(pid, sizeof(pid), "%d", PQbackendPID(probe));
		cr_assert(PQsendQuery(probe, "CREATE TEMP TABLE faults_probe (x int)"));
		for (int i = 0; i < 50; i++) {
			if (tstack_count("SELECT count(*) FROM pg_stat_activity"
			                 " WHERE pid = $1::int AND wait_event = 'SyncRep'",
			                 pid) == 1)
				return probe;
			tstack_sleep_ms(20);
		}
		PQfinish(probe); /* committed before the reload took: again */
		cr_assert(tstack_now() < deadline, "commits never waited for the standby");
	}
}

/* Undo sync_rep_on(): the probe's commit returns once it is off. */
static void sync_rep_off(PGconn *probe)
{
	struct pollfd pfd = { .fd = PQsocket(probe), .events = POLLIN };
	double deadline = tstack_now() + 15;
	PGresult *res;

	exec_ok(admin, "ALTER SYSTEM RESET synchronous_standby_names");
	exec_ok(admin, "SELECT pg_reload_conf()");
	while (PQisBusy(probe)) {
		cr_assert(tstack_now() < deadline, "commits still wait for the standby");
		if (poll(&pfd, 1, 100) > 0)
			cr_assert(PQconsumeInput(probe), "%s", PQerrorMessage(probe));
	}
	while ((res = PQgetResult(probe)) != NULL)
		PQclear(res);
	PQfinish(probe);
}

struct pending {
	const struct tstack_tenant *t;
	const char *key, *body;
	struct http_response *resp;
	char err[256];
};

static void *pending_run(void *arg)
{
	struct pending *p = arg;
	char kh[300];
	const char *headers[] = { p->t->auth, JSON_CT, kh, NULL };

	snprintf(kh, sizeof(kh), "Idempotency-Key: %s", p->key);
	p->resp = http_request("POST", COLLECTION, headers, p->body, strlen(p->body));
	if (p->resp == NULL)
		snprintf(p->err, sizeof(p->err), "%s", http_error());
	return NULL;
}

/* The backend pid of a worker session whose statement is like query and
 * that waits for the standby, within 5 s. (A worker's later statements,
 * such as its NOTIFY, wait for the standby too.) */
static char *worker_waiting(const char *query)
{
	double deadline = tstack_now() + 5;
	char *v;

	for (;;) {
		v = tstack_text("SELECT min(pid)::text FROM pg_stat_activity"
		                " WHERE wait_event = 'SyncRep' AND query LIKE $1"
		                "   AND application_name LIKE 'idemflow-worker-%'",
		                query);
		if (v != NULL)
			return v;
		if (tstack_now() >= deadline) {
			v = tstack_text(
			    "SELECT string_agg(pid || ' ' || coalesce(wait_event, '-') || ' '"
			    " || left(query, 40), '; ') FROM pg_stat_activity"
			    " WHERE application_name LIKE 'idemflow-worker-%'");
			cr_assert_fail("no worker's \"%s\" waits for the standby; workers: %s",
			               query, v ? v : "none");
		}
		tstack_sleep_ms(10);
	}
}

/* POST body under key, end the worker's session while its commit (in the
 * statement like query) waits for the standby, and return the answer. */
static struct http_response *lose_at_commit(const struct tstack_tenant *t, const char *key,
                                            const char *body, const char *query)
{
	struct pending p = { .t = t, .key = key, .body = body };
	pthread_t th;
	char *pid;

	cr_assert_eq(pthread_create(&th, NULL, pending_run, &p), 0);
	pid = worker_waiting(query);
	tstack_exec(admin, "SELECT pg_terminate_backend($1::int)", pid);
	free(pid);
	pthread_join(th, NULL);
	cr_assert_not_null(p.resp, "%s", p.err);
	return p.resp;
}

Test(faults, connection_lost_after_commit_is_outcome_unknown_and_the_retry_replays)
{
	const char *plain = "{\"type\":\"lost\",\"input\":{\"p\":1}}";
	const char *steps =
	    "{\"type\":\"lost-steps\",\"steps\":[{\"name\":\"a\",\"job_type\":\"j\"}]}";
	struct http_response *r1, *r2, *again;
	struct tstack_tenant t;
	char k1[128], k2[128];
	PGconn *probe;

	tstack_tenant_create(&t, "lost");
	tstack_key(k1, sizeof(k1), "lost-plain");
	tstack_key(k2, sizeof(k2), "lost-steps");

	probe = sync_rep_on();
	/* The one-statement create (its commit is the statement's) ... */
	r1 = lose_at_commit(&t, k1, plain, "%INSERT INTO idempotency_keys %");
	/* ... and a command whose COMMIT is sent after its answer is stored. */
	r2 = lose_at_commit(&t, k2, steps, "COMMIT");
	sync_rep_off(probe);

	expect_503(r1, "/problems/outcome-unknown", COLLECTION, "same Idempotency-Key");
	expect_503(r2, "/problems/outcome-unknown", COLLECTION, "same Idempotency-Key");
	/* Both had committed: "nothing was stored" would have been false.
	 * The same request with the same key learns the outcome. */
	again = post(NULL, &t, COLLECTION, k1, plain);
	cr_assert_eq(again->status, 201, "%d %s", again->status, again->body);
	tstack_expect_header(again, "Idempotent-Replayed", "true");
	http_response_free(again);
	again = post(NULL, &t, COLLECTION, k2, steps);
	cr_assert_eq(again->status, 201, "%d %s", again->status, again->body);
	tstack_expect_header(again, "Idempotent-Replayed", "true");
	http_response_free(again);
	tstack_expect_counts(&t, 2, 2, 2);
	http_response_free(r1);
	http_response_free(r2);
}

/*
 * A role or database set to a level that acknowledges a commit before the
 * synchronous standby has it ("local", "remote_write") is raised to "on":
 * the create's commit waits for the standby, and is answered only once
 * the standby (here: none at all) lets it go.
 */
Test(faults, a_weaker_commit_level_is_raised_so_the_commit_waits_for_the_standby)
{
	const char *const levels[] = { "local", "remote_write" };
	struct tstack_tenant t;

	tstack_tenant_create(&t, "weak");
	for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++) {
		const char *body = "{\"type\":\"weak\",\"input\":{}}";
		struct pending p = { .t = &t, .body = body };
		char key[128], value[40];
		pthread_t th;
		PGconn *probe;
		char *pid;

		snprintf(value, sizeof(value), "'%s'", levels[i]);
		db_set("synchronous_commit", value);
		renew_sessions("idemflow");
		tstack_key(key, sizeof(key), levels[i]);
		p.key = key;
		probe = sync_rep_on();
		cr_assert_eq(pthread_create(&th, NULL, pending_run, &p), 0);
		/* With the level as set, no commit would wait at all (the
		 * worker may be flushing its key counts before the create). */
		pid = worker_waiting("%");
		cr_assert_eq(
		    tstack_count("SELECT count(*) FROM pg_stat_activity WHERE pid = $1::int"
		                 "   AND wait_event = 'SyncRep'",
		                 pid),
		    1, "synchronous_commit = %s", levels[i]);
		free(pid);
		sync_rep_off(probe);
		pthread_join(th, NULL);
		cr_assert_not_null(p.resp, "%s", p.err);
		cr_assert_eq(p.resp->status, 201, "%d %s", p.resp->status, p.resp->body);
		http_response_free(p.resp);
	}
	tstack_expect_counts(&t, 2, 2, 2);
}

/* POST body under key, cancel the worker's statement (like query) while
 * its commit waits for the standby, and return the answer. */
static struct http_response *cancel_at_commit(const struct tstack_tenant *t, const char *key,
                                              const char *body, const char *query)
{
	struct pending p = { .t = t, .key = key, .body = body };
	pthread_t th;
	char *pid;

	cr_assert_eq(pthread_create(&th, NULL, pending_run, &p), 0);
	pid = worker_waiting(query);
	tstack_exec(admin, "SELECT pg_cancel_backend($1::int)", pid);
	free(pid);
	pthread_join(th, NULL);
	cr_assert_not_null(p.resp, "%s", p.err);
	return p.resp;
}

/*
 * A cancelled wait for the synchronous standby does not fail the COMMIT:
 * PostgreSQL commits locally and warns. That commit may not survive a
 * failover, so it is never a 201: 503 outcome-unknown. The row is visible
 * on this primary at once, so the retry replays it.
 */
Test(faults, a_cancelled_commit_wait_is_outcome_unknown_and_the_retry_replays)
{
	const char *plain = "{\"type\":\"cancelled\",\"input\":{\"p\":1}}";
	const char *steps =
	    "{\"type\":\"cancelled-steps\",\"steps\":[{\"name\":\"a\",\"job_type\":\"j\"}]}";
	struct http_response *r1, *r2, *again;
	struct tstack_tenant t;
	char k1[128], k2[128];
	PGconn *probe;

	tstack_tenant_create(&t, "cancelled");
	tstack_key(k1, sizeof(k1), "cancel-plain");
	tstack_key(k2, sizeof(k2), "cancel-steps");

	probe = sync_rep_on();
	r1 = cancel_at_commit(&t, k1, plain, "%INSERT INTO idempotency_keys %");
	r2 = cancel_at_commit(&t, k2, steps, "COMMIT");
	expect_503(r1, "/problems/outcome-unknown", COLLECTION, "same Idempotency-Key");
	expect_503(r2, "/problems/outcome-unknown", COLLECTION, "same Idempotency-Key");
	sync_rep_off(probe);

	again = post(NULL, &t, COLLECTION, k1, plain);
	cr_assert_eq(again->status, 201, "%d %s", again->status, again->body);
	tstack_expect_header(again, "Idempotent-Replayed", "true");
	http_response_free(again);
	again = post(NULL, &t, COLLECTION, k2, steps);
	cr_assert_eq(again->status, 201, "%d %s", again->status, again->body);
	tstack_expect_header(again, "Idempotent-Replayed", "true");
	http_response_free(again);
	tstack_expect_counts(&t, 2, 2, 2);
	http_response_free(r1);
	http_response_free(r2);
}

/*
 * A worker killed while its commit waits for the synchronous standby: its
 * backend cannot notice (PostgreSQL checks nothing but a cancel, a
 * termination and the postmaster during that wait), so it keeps its
 * connection slot and the key's row until the standby acknowledges. Then
 * the commit completes as any other (durable), the backend sees its client
 * gone and ends, and the retry replays: one workflow. idemflow does not
 * terminate it: that would make a commit the standby lacks visible.
 */
Test(faults, a_killed_worker_s_waiting_commit_ends_durable_once_the_standby_is_back)
{
	const char *body = "{\"type\":\"killed\",\"input\":{}}";
	struct pending p = { .body = body };
	struct http_response *again;
	struct tstack_tenant t;
	char key[128], *pid, *app;
	double deadline;
	pthread_t th;
	PGconn *probe;

	tstack_tenant_create(&t, "killed");
	tstack_key(key, sizeof(key), "killed");
	p.t = &t;
	p.key = key;
	probe = sync_rep_on();
	cr_assert_eq(pthread_create(&th, NULL, pending_run, &p), 0);
	pid = worker_waiting("%INSERT INTO idempotency_keys %");
	app = tstack_text("SELECT application_name FROM pg_stat_activity WHERE pid = $1::int", pid);
	cr_assert_not_null(app);
	cr_assert_eq(kill((pid_t)atol(strrchr(app, '-') + 1), SIGKILL), 0, "%s", app);
	pthread_join(th, NULL);
	http_response_free(p.resp);
	/* The backend outlives its worker, still waiting. */
	tstack_sleep_ms(1500);
	cr_assert_eq(tstack_count("SELECT count(*) FROM pg_stat_activity WHERE pid = $1::int"
	                          "   AND wait_event = 'SyncRep'",
	                          pid),
	             1, "the killed worker's backend left the wait");
	cr_assert_eq(tenant_rows(&t, "idempotency_keys"), 0, "visible before the standby has it");
	sync_rep_off(probe);
	deadline = tstack_now() + 10;
	while (tstack_count("SELECT count(*) FROM pg_stat_activity WHERE pid = $1::int", pid) !=
	       0) {
		cr_assert(tstack_now() < deadline, "the killed worker's backend stayed");
		tstack_sleep_ms(20);
	}
	again = post(NULL, &t, COLLECTION, key, body);
	cr_assert_eq(again->status, 201, "%d %s", again->status, again->body);
	tstack_expect_header(again, "Idempotent-Replayed", "true");
	http_response_free(again);
	tstack_expect_counts(&t, 1, 1, 1);
	free(app);
	free(pid);
}

/*
 * A key's lifetime counts from its commit: a create whose COMMIT waited
 * for the standby longer than the key's TTL is not visible already
 * expired, so the retry replays instead of creating a second workflow.
 * For the one-statement create and a command committed in its own
 * COMMIT; the tenant's TTL (2 s, set below the floor by hand) is shorter
 * than the wait.
 */
Test(faults, a_key_lives_its_ttl_from_a_commit_that_waited_for_the_standby)
{
	const char *const bodies[] = {
		"{\"type\":\"long\",\"input\":{}}",
		"{\"type\":\"long-steps\",\"steps\":[{\"name\":\"a\",\"job_type\":\"j\"}]}",
	};
	struct tstack_tenant t;

	tstack_tenant_create(&t, "long");
	tstack_exec(admin,
	            "UPDATE tenants SET idempotency_ttl = interval '2 seconds' WHERE id = $1",
	            t.id_text);
	for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
		struct pending p = { .t = &t, .body = bodies[i] };
		struct http_response *again;
		char key[128];
		pthread_t th;
		PGconn *probe;

		tstack_key(key, sizeof(key), "long");
		p.key = key;
		probe = sync_rep_on();
		cr_assert_eq(pthread_create(&th, NULL, pending_run, &p), 0);
		free(worker_waiting(i == 0 ? "%INSERT INTO idempotency_keys %" : "COMMIT"));
		tstack_sleep_ms(3000); /* past the key's TTL from its claim */
		sync_rep_off(probe);
		pthread_join(th, NULL);
		cr_assert_not_null(p.resp, "%s", p.err);
		cr_assert_eq(p.resp->status, 201, "%d %s", p.resp->status, p.resp->body);
		http_response_free(p.resp);
		again = post(NULL, &t, COLLECTION, key, bodies[i]);
		cr_assert_eq(again->status, 201, "%d %s", again->status, again->body);
		tstack_expect_header(again, "Idempotent-Replayed", "true");
		http_response_free(again);
	}
	tstack_expect_counts(&t, 2, 2, 2);
}

/* Sessions ever started on the test database, as the statistics have
 * them (a session is counted once it has ended, at the latest). */
static long sessions_started(void)
{
	PQclear(PQexec(admin, "SELECT pg_stat_clear_snapshot()"));
	return tstack_count("SELECT sessions FROM pg_stat_database WHERE datname = $1",
	                    PQdb(admin));
}

/*
 * While the workers cannot connect (here: their statements cannot be
 * prepared, the schema being broken), /readyz reads the schema version on
 * a connection of its own to say why; /readyz needs no token, so that
 * connection is tried at most once a second per worker, and the probes in
 * between are answered from the last try.
 */
static struct http_response *send_readyz(int i, void *arg)
{
	(void)i;
	(void)arg;
	return get(NULL, NULL, "/readyz");
}

static void any_answer(const struct http_response *r, int i, void *arg)
{
	(void)r;
	(void)i;
	(void)arg;
}

Test(faults, readyz_during_an_outage_does_not_open_a_connection_per_probe)
{
	const int probes = 60;
	long before, opened;
	double deadline;

	exec_ok(admin, "ALTER TABLE api_tokens RENAME TO api_tokens_hidden");
	renew_sessions("idemflow");
	before = sessions_started();
	for (int i = 0; i < probes; i++) {
		struct http_response *r = get(NULL, NULL, "/readyz");
		expect_503(r, "/problems/unavailable", "/readyz", "database");
		http_response_free(r);
		tstack_sleep_ms(20);
	}
	/* Let the last sessions end and be counted. */
	deadline = tstack_now() + 3;
	tstack_sleep_ms(500);
	opened = sessions_started() - before;
	while (tstack_now() < deadline && opened < probes) {
		tstack_sleep_ms(100);
		opened = sessions_started() - before;
	}
	exec_ok(admin, "ALTER TABLE api_tokens_hidden RENAME TO api_tokens");
	cr_log_info("%d probes opened %ld sessions", probes, opened);
	/* Leave every worker connected: one still backing off would answer
	 * the next test's first request 503 at once. Past the longest pause
	 * (1.6 s), a probe on each worker connects it. */
	tstack_sleep_ms(2000);
	tstack_every_worker(tstack_supervisor_pid(), tstack_env("IDEMFLOW_FCGI_LOG"), 6, 50,
	                    send_readyz, any_answer, NULL);
	/* 3 workers over ~1.5 s: two tries each, and their own reconnects
	 * (100 ms doubling). */
	cr_assert(opened <= 30, "%d probes opened %ld sessions", probes, opened);
}

/* A worker waiting on a held key has its session ended. */
static struct http_response *lose_while_waiting(const struct tstack_tenant *t, const char *key,
                                                const char *body)
{
	struct pending p = { .t = t, .key = key, .body = body };
	char pid[24];
	pthread_t th;
	PGconn *hold = tstack_db_connect();

	session_safe(hold);
	tstack_key_hold(hold, t, key);
	cr_assert_eq(pthread_create(&th, NULL, pending_run, &p), 0);
	snprintf(pid, sizeof(pid), "%d", wait_blocked(hold, 1, 5000));
	tstack_exec(admin, "SELECT pg_terminate_backend($1::int)", pid);
	pthread_join(th, NULL);
	exec_ok(hold, "ROLLBACK");
	PQfinish(hold);
	cr_assert_not_null(p.resp, "%s", p.err);
	return p.resp;
}

Test(faults, connection_lost_before_commit_says_what_is_known)
{
	const char *plain = "{\"type\":\"cut\",\"input\":{}}";
	const char *steps =
	    "{\"type\":\"cut-steps\",\"steps\":[{\"name\":\"a\",\"job_type\":\"j\"}]}";
	struct http_response *r;
	struct tstack_tenant t;
	char k1[128], k2[128];

	tstack_tenant_create(&t, "cut");
	tstack_key(k1, sizeof(k1), "cut-plain");
	tstack_key(k2, sizeof(k2), "cut-steps");

	/* The one-statement create runs in an implicit transaction: cut
	 * off mid-statement it may or may not have committed. */
	r = lose_while_waiting(&t, k1, plain);
	expect_503(r, "/problems/outcome-unknown", COLLECTION, "same Idempotency-Key");
	http_response_free(r);
	/* A command cut off inside its explicit transaction, before its
	 * COMMIT was sent: known to have stored nothing. */
	r = lose_while_waiting(&t, k2, steps);
	expect_503(r, "/problems/unavailable", COLLECTION, "nothing was stored");
	http_response_free(r);

	/* Neither had committed: the retries create. */
	r = post(NULL, &t, COLLECTION, k1, plain);
	free(tstack_expect_created(r, "cut", "{}"));
	http_response_free(r);
	r = post(NULL, &t, COLLECTION, k2, steps);
	cr_assert_eq(r->status, 201, "%d %s", r->status, r->body);
	cr_assert_null(http_header(r, "Idempotent-Replayed"));
	http_response_free(r);
	tstack_expect_counts(&t, 2, 2, 2);
}

Test(faults, a_multi_host_conninfo_follows_the_writable_server_with_bounded_backoff)
{
	const char *body = "{\"type\":\"failover\",\"input\":{}}";
	struct tstack_pool p;
	struct tstack_tenant t;
	struct http_response *r;
	char db[1024], key[128], sql[256];
	pid_t before[8], after[8];
	size_t nb, na;

	tstack_tenant_create(&t, "failover");
	/* The first host refuses connections, the second is the server; no
	 * target_session_attrs: several hosts get read-write by default. */
	snprintf(db, sizeof(db), "host=127.0.0.1,%s port=1,%s dbname=%s user=%s",
	         tstack_env("PGHOST"), tstack_env("PGPORT"), tstack_env("PGDATABASE"),
	         tstack_env("PGUSER"));
	tstack_pool_paths(&p, "failover");
	const char *argv[] = { tstack_env("IDEMFLOW_FCGI"),
		               "--config",
		               tstack_env("IDEMFLOW_CONF"),
		               "--db",
		               db,
		               "--listen",
		               p.sock,
		               "--pid_file",
		               p.pidfile,
		               "--workers",
		               "2",
		               "--application_name",
		               "faults",
		               NULL };
	tstack_pool_run(&p, argv, 10000);
	cr_assert(tstack_wait_workers(p.pid, 2, 5000));
	nb = tstack_workers(p.pid, before, 8);

	tstack_key(key, sizeof(key), "failover-1");
	r = post(p.sock, &t, COLLECTION, key, body);
	cr_assert_eq(r->status, 201, "%d %s", r->status, r->body);
	http_response_free(r);

	/* "Demote": no host takes writes, and the sessions end. */
	db_set("default_transaction_read_only", "on");
	renew_sessions("faults");
	tstack_key(key, sizeof(key), "failover-2");
	double down_until = tstack_now() + 4; /* long enough to reach the cap */
	while (tstack_now() < down_until) {
		r = post(p.sock, &t, COLLECTION, key, body);
		tstack_expect_problem(r, 503, "/problems/unavailable", COLLECTION);
		http_response_free(r);
		tstack_sleep_ms(50);
	}
	r = get(p.sock, NULL, "/readyz");
	cr_assert_eq(r->status, 503, "%d %s", r->status, r->body);
	http_response_free(r);

	/* "Promote": the same pool finds the writable server by itself,
	 * within the back-off's cap (1.6 s) and a connect. */
	snprintf(sql, sizeof(sql), "ALTER DATABASE \"%s\" RESET default_transaction_read_only",
	         PQdb(admin));
	exec_ok(admin, sql);
	double t0 = tstack_now(), waited;
	for (;;) {
		r = post(p.sock, &t, COLLECTION, key, body);
		if (r->status == 201)
			break;
		tstack_expect_problem(r, 503, "/problems/unavailable", COLLECTION);
		http_response_free(r);
		cr_assert(tstack_now() - t0 < 10, "no worker reconnected within 10 s");
		tstack_sleep_ms(50);
	}
	waited = tstack_now() - t0;
	http_response_free(r);
	cr_log_info("writable again after %.2f s", waited);
	cr_assert(waited < 1.6 + 1.5, "reconnected only after %.2f s", waited);
	na = tstack_workers(p.pid, after, 8);
	cr_assert_eq(na, nb, "the pool was not restarted");
	for (size_t i = 0; i < nb && i < 8; i++)
		cr_assert_eq(after[i], before[i], "worker %ld was replaced", (long)before[i]);
	tstack_pool_kill(&p, SIGTERM);
	tstack_expect_counts(&t, 2, 2, 2);
}

/* --- a key TTL too short for the waits --------------------------------- */

static int file_has(const char *path, const char *needle)
{
	char buf[65536];
	FILE *f = fopen(path, "r");
	size_t n;

	if (f == NULL)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	return strstr(buf, needle) != NULL;
}

Test(faults, a_key_ttl_shorter_than_the_waits_is_refused_at_start_and_on_reload)
{
	struct tstack_pool p;
	struct tstack_tenant t;
	struct http_response *r;
	char conf[600], key[128];
	int status;
	FILE *f;

	tstack_pool_paths(&p, "ttl");
	/* At start: exit 78, naming the setting. */
	const char *bad[] = { tstack_env("IDEMFLOW_FCGI"),
		              "--config",
		              tstack_env("IDEMFLOW_CONF"),
		              "--listen",
		              p.sock,
		              "--pid_file",
		              p.pidfile,
		              "--idempotency_ttl",
		              "9s",
		              NULL };
	pid_t pid = tstack_spawn(bad, p.log);
	double deadline = tstack_now() + 10;
	while (waitpid(pid, &status, WNOHANG) == 0) {
		if (tstack_now() >= deadline) {
			kill(-pid, SIGKILL);
			waitpid(pid, &status, 0);
			cr_assert_fail("idemflow-fcgi started with idempotency_ttl = 9s");
		}
		tstack_sleep_ms(20);
	}
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 78, "status 0x%x", status);
	cr_assert(file_has(p.log, "\"idempotency_ttl\""), "the message names the setting");

	/* On reload: the old configuration stays. */
	snprintf(conf, sizeof(conf), "%s/ttl%ld.conf", tstack_env("IDEMFLOW_STACK_DIR"),
	         (long)getpid());
	f = fopen(conf, "w");
	cr_assert_not_null(f);
	fprintf(f,
	        "db = %s\nlisten = %s\npid_file = %s\nworkers = 1\nidempotency_wait = 1s\n"
	        "idempotency_ttl = 1h\n",
	        tstack_env("DATABASE_URL"), p.sock, p.pidfile);
	fclose(f);
	const char *good[] = { tstack_env("IDEMFLOW_FCGI"), "--config", conf, NULL };
	tstack_pool_run(&p, good, 10000);
	f = fopen(conf, "a");
	cr_assert_not_null(f);
	fprintf(f, "idempotency_ttl = 5s\n");
	fclose(f);
	cr_assert_eq(kill(p.pid, SIGHUP), 0);
	deadline = tstack_now() + 5;
	while (!file_has(p.log, "configuration not reloaded")) {
		cr_assert(tstack_now() < deadline, "no refusal in %s", p.log);
		tstack_sleep_ms(20);
	}
	cr_assert(file_has(p.log, "idempotency_ttl"));
	tstack_tenant_create(&t, "ttl");
	tstack_key(key, sizeof(key), "ttl");
	r = post(p.sock, &t, COLLECTION, key, "{\"type\":\"ttl\"}");
	cr_assert_eq(r->status, 201, "%d %s", r->status, r->body);
	http_response_free(r);
	/* The key lives for the old configuration's hour. */
	cr_assert_eq(tstack_count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1"
	                          " AND expires_at - created_at = interval '1 hour'",
	                          t.id_text),
	             1);
	tstack_pool_kill(&p, SIGTERM);
}
