/*
 * End-to-end tests of what an operator of a FastCGI pool expects, through
 * nginx: the status page (GET /status: its fields in text and JSON, every
 * worker with ?full, opened exactly as /metrics is), the slow-request log
 * (request_slowlog_timeout), request_terminate_timeout (the stuck worker
 * killed and replaced, nginx's 5xx, nothing of the request left in the
 * database), the pool's figures, build and job gauges in /metrics, and the
 * status page read while requests run.
 *
 * The harness's pool is reloaded once (SIGHUP) with the timeouts, a
 * metrics token and an idempotency_wait (PostgreSQL's lock_timeout) long
 * enough for a request to stay blocked on a lock the test holds. The tests
 * run one at a time: they count the pool's slow requests and kills, and
 * the whole jobs table.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <json-c/json.h>

#include "config.h"
#include "http.h"
#include "tapi.h"
#include "tlog.h"
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

#define TOKEN      "pool-status-token-0123456789"
#define BEARER     "Authorization: Bearer " TOKEN
#define SLOW_MS    1000
#define KILL_MS    4000
#define WORKERS    3
#define MAX_WORKER 64

TSTACK_SEQUENTIAL

TestSuite(pool, .timeout = 120);

/* --- The pool's configuration ---------------------------------------------- */

static int pid_in(pid_t p, const pid_t *set, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (set[i] == p)
			return 1;
	return 0;
}

/* Once per stack: add the settings to the harness's configuration file and
 * reload; wait until every worker is one started with them. */
static void pool_setup(void)
{
	const char *conf = tstack_env("IDEMFLOW_CONF");
	pid_t sup = tstack_supervisor_pid(), old[MAX_WORKER], cur[MAX_WORKER];
	size_t nold, ncur;
	double deadline;
	FILE *f;

	if (tstack_file_contains(conf, "request_terminate_timeout"))
		return;
	nold = tstack_workers(sup, old, MAX_WORKER);
	f = fopen(conf, "a");
	cr_assert_not_null(f, "%s: %s", conf, strerror(errno));
	fprintf(f,
	        "# t/e2e/test_pool.c\n"
	        "request_slowlog_timeout = %dms\n"
	        "request_terminate_timeout = %dms\n"
	        "idempotency_wait = 20s\n"
	        "metrics_token = %s\n",
	        SLOW_MS, KILL_MS, TOKEN);
	fclose(f);
	cr_assert_eq(kill(sup, SIGHUP), 0);
	deadline = tstack_now() + 30;
	for (;;) {
		int fresh = 1;
		ncur = tstack_workers(sup, cur, MAX_WORKER);
		for (size_t i = 0; i < ncur; i++)
			fresh &= !pid_in(cur[i], old, nold);
		if (fresh && ncur == WORKERS)
			break;
		cr_assert(tstack_now() < deadline, "the pool did not reload; see %s",
		          tstack_env("IDEMFLOW_FCGI_LOG"));
		tstack_sleep_ms(50);
	}
}

/* --- Requests ------------------------------------------------------------- */

/* A request on nginx's metrics listener (the client's address passed). */
static struct http_response *on_metrics_port(const char *method, const char *path,
                                             const char *const *headers)
{
	char *saved = strdup(tstack_env("IDEMFLOW_PORT"));
	struct http_response *r;

	setenv("IDEMFLOW_PORT", tstack_env("IDEMFLOW_METRICS_PORT"), 1);
	r = http_request(method, path, headers, NULL, 0);
	setenv("IDEMFLOW_PORT", saved, 1);
	free(saved);
	cr_assert_not_null(r, "%s %s: %s", method, path, http_error());
	return r;
}

/* GET path on the main site with the metrics token; asserts 200. */
static struct http_response *get_token(const char *path)
{
	const char *h[] = { BEARER, NULL };
	struct http_response *r = http_request("GET", path, h, NULL, 0);

	cr_assert_not_null(r, "GET %s: %s", path, http_error());
	cr_assert_eq(r->status, 200, "GET %s: %d: %.300s", path, r->status, r->body);
	return r;
}

static struct json_object *status_json(const char *path, struct http_response **out)
{
	struct http_response *r = get_token(path);
	struct json_object *j;

	tstack_expect_header(r, "Content-Type", "application/json");
	j = json_tokener_parse(r->body);
	cr_assert_not_null(j, "not JSON: %s", r->body);
	if (out != NULL)
		*out = r;
	else
		http_response_free(r);
	return j;
}

static long long jint(struct json_object *o, const char *key)
{
	struct json_object *v;

	cr_assert(json_object_object_get_ex(o, key, &v), "no \"%s\" in %s", key,
	          json_object_to_json_string(o));
	cr_assert(json_object_is_type(v, json_type_int), "\"%s\" is not an integer", key);
	return json_object_get_int64(v);
}

static const char *jstr(struct json_object *o, const char *key)
{
	struct json_object *v;

	cr_assert(json_object_object_get_ex(o, key, &v), "no \"%s\" in %s", key,
	          json_object_to_json_string(o));
	cr_assert(json_object_is_type(v, json_type_string), "\"%s\" is not a string", key);
	return json_object_get_string(v);
}

/* o has exactly these keys, in this order. */
static void expect_keys(struct json_object *o, const char *const *keys)
{
	size_t i = 0;

	json_object_object_foreach(o, k, v)
	{
		(void)v;
		cr_assert_not_null(keys[i], "unexpected key \"%s\"", k);
		cr_assert_str_eq(k, keys[i], "key %zu", i);
		i++;
	}
	cr_assert_null(keys[i], "missing key \"%s\"", keys[i]);
}

/* php-fpm's keys, in its order; idemflow's own after them. */
static const char *const pool_keys[] = { "pool",
	                                 "process manager",
	                                 "start time",
	                                 "start since",
	                                 "accepted conn",
	                                 "listen queue",
	                                 "max listen queue",
	                                 "listen queue len",
	                                 "idle processes",
	                                 "active processes",
	                                 "total processes",
	                                 "max active processes",
	                                 "max children reached",
	                                 "slow requests",
	                                 "terminated requests",
	                                 "config last reload success",
	                                 "config last reload success time",
	                                 NULL };

/* The value of a sample line "<series> <value>" of an exposition. */
static double sample(const char *body, const char *series)
{
	size_t n = strlen(series);

	for (const char *p = body; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		if (strncmp(p, series, n) == 0 && p[n] == ' ')
			return atof(p + n + 1);
	cr_assert_fail("no sample %s in:\n%s", series, body);
	return 0;
}

static char *scrape(void)
{
	struct http_response *r = on_metrics_port("GET", "/metrics", NULL);
	char *body;

	cr_assert_eq(r->status, 200, "GET /metrics: %d", r->status);
	body = strdup(r->body);
	http_response_free(r);
	return body;
}

/* Lines of the pool's log holding every one of the needles. */
static int log_lines(const char *a, const char *b, const char *c)
{
	FILE *f = fopen(tstack_env("IDEMFLOW_FCGI_LOG"), "r");
	char line[8192];
	int n = 0;

	cr_assert_not_null(f);
	while (fgets(line, sizeof(line), f))
		if (strstr(line, a) && (!b || strstr(line, b)) && (!c || strstr(line, c)))
			n++;
	fclose(f);
	return n;
}

/* --- The status page -------------------------------------------------------- */

Test(pool, status_page_has_php_fpm_fields_in_text_and_json)
{
	static const char *const text_keys[] = { "pool",
		                                 "process manager",
		                                 "start time",
		                                 "start since",
		                                 "accepted conn",
		                                 "listen queue",
		                                 "max listen queue",
		                                 "listen queue len",
		                                 "idle processes",
		                                 "active processes",
		                                 "total processes",
		                                 "max active processes",
		                                 "max children reached",
		                                 "slow requests",
		                                 "terminated requests",
		                                 "last reload",
		                                 "last reload success",
		                                 NULL };
	struct http_response *r;
	struct json_object *j;
	const char *p;
	const char *accept[] = { "Accept: application/json", NULL };

	pool_setup();
	r = on_metrics_port("GET", "/status", NULL);
	cr_assert_eq(r->status, 200, "GET /status by address: %d: %.300s", r->status, r->body);
	tstack_expect_header(r, "Content-Type", "text/plain; charset=utf-8");
	p = r->body;
	for (size_t i = 0; text_keys[i]; i++) {
		size_t n = strlen(text_keys[i]);
		cr_assert(strncmp(p, text_keys[i], n) == 0 && p[n] == ':',
		          "line %zu is not \"%s:\": %s", i, text_keys[i], r->body);
		p = strchr(p, '\n');
		cr_assert_not_null(p);
		p++;
	}
	cr_assert_str_eq(p, "", "more than the pool's lines without ?full: %s", r->body);
	cr_assert_not_null(strstr(r->body, "\ntotal processes:      3\n"), "%s", r->body);
	cr_assert_not_null(strstr(r->body, "\nlisten queue len:     1024\n"), "%s", r->body);
	http_response_free(r);

	j = status_json("/status?json", NULL);
	expect_keys(j, pool_keys);
	cr_assert_str_eq(jstr(j, "pool"), "idemflow");
	cr_assert_str_eq(jstr(j, "process manager"), "static");
	/* Seconds since the epoch, as php-fpm's collectors read them. */
	cr_assert(jint(j, "start time") > (long long)time(NULL) - 86400 &&
	              jint(j, "start time") <= (long long)time(NULL),
	          "start time %lld", jint(j, "start time"));
	cr_assert_leq(llabs((long long)time(NULL) - jint(j, "start time") - jint(j, "start since")),
	              1);
	cr_assert_geq(jint(j, "max active processes"), 1);
	cr_assert_eq(jint(j, "config last reload success"), 1);
	cr_assert_eq(jint(j, "total processes"), WORKERS);
	/* This request is the one busy worker. */
	cr_assert_eq(jint(j, "active processes"), 1);
	cr_assert_eq(jint(j, "idle processes"), WORKERS - 1);
	cr_assert_eq(jint(j, "listen queue"), 0);
	cr_assert_eq(jint(j, "listen queue len"), 1024);
	/* The counters, by what one more request does to them: accepted
	 * once, and neither high-water mark moves while one worker is busy. */
	{
		struct json_object *j2 = status_json("/status?json", NULL);

		cr_assert_eq(jint(j2, "accepted conn"), jint(j, "accepted conn") + 1);
		cr_assert_eq(jint(j2, "max listen queue"), jint(j, "max listen queue"));
		cr_assert_eq(jint(j2, "max children reached"), jint(j, "max children reached"));
		json_object_put(j2);
	}
	json_object_put(j);

	/* Accept: application/json asks for the same. */
	r = http_request("GET", "/status", (const char *const[]){ BEARER, accept[0], NULL }, NULL,
	                 0);
	cr_assert_not_null(r);
	cr_assert_eq(r->status, 200);
	tstack_expect_header(r, "Content-Type", "application/json");
	http_response_free(r);
}

Test(pool, full_lists_each_real_worker_with_its_request)
{
	static const char *const worker_keys[] = { "pid",
		                                   "state",
		                                   "start time",
		                                   "start since",
		                                   "requests",
		                                   "request duration",
		                                   "request method",
		                                   "request uri",
		                                   "content length",
		                                   "user",
		                                   "script",
		                                   "last request cpu",
		                                   "last request memory",
		                                   "request route",
		                                   "request id",
		                                   "rss bytes",
		                                   NULL };
	pid_t workers[MAX_WORKER];
	size_t nw, seen = 0, busy = 0;
	struct http_response *r;
	struct json_object *j, *procs;

	pool_setup();
	j = status_json("/status?json&full", &r);
	cr_assert(json_object_object_get_ex(j, "processes", &procs));
	nw = tstack_workers(tstack_supervisor_pid(), workers, MAX_WORKER);
	cr_assert_eq(nw, WORKERS);
	cr_assert_eq(json_object_array_length(procs), nw, "%s", r->body);
	for (size_t i = 0; i < json_object_array_length(procs); i++) {
		struct json_object *w = json_object_array_get_idx(procs, i);
		expect_keys(w, worker_keys);
		cr_assert(pid_in((pid_t)jint(w, "pid"), workers, nw), "pid %lld is no worker",
		          jint(w, "pid"));
		seen++;
		cr_assert_gt(jint(w, "rss bytes"), 1024 * 1024, "a worker's RSS: %lld",
		             jint(w, "rss bytes"));
		cr_assert_gt(jint(w, "last request memory"), 1024 * 1024);
		if (strcmp(jstr(w, "state"), "idle") != 0) {
			busy++;
			/* The worker answering this very request. */
			cr_assert_str_eq(jstr(w, "state"), "writing the answer");
			cr_assert_str_eq(jstr(w, "request method"), "GET");
			cr_assert_str_eq(jstr(w, "request uri"), "/status");
			cr_assert_str_eq(jstr(w, "request route"), "/status");
			cr_assert_str_eq(jstr(w, "request id"), http_header(r, "X-Request-Id"));
		}
	}
	cr_assert_eq(seen, nw);
	cr_assert_eq(busy, 1);
	json_object_put(j);
	http_response_free(r);

	/* The text form: one block per worker. */
	r = get_token("/status?full");
	size_t blocks = 0;
	for (const char *p = r->body; (p = strstr(p, "\npid:")) != NULL; p++)
		blocks++;
	cr_assert_eq(blocks, WORKERS, "%s", r->body);
	for (size_t i = 0; i < nw; i++) {
		char line[64];
		snprintf(line, sizeof(line), "\npid:                  %ld\n", (long)workers[i]);
		cr_assert_not_null(strstr(r->body, line), "worker %ld missing: %s",
		                   (long)workers[i], r->body);
	}
	http_response_free(r);
}

Test(pool, status_is_refused_exactly_as_metrics_is)
{
	struct tstack_tenant t;
	const char *none[] = { NULL };
	const char *wrong[] = { "Authorization: Bearer not-the-token", NULL };
	const char *token[] = { BEARER, NULL };
	const char *paths[] = { "/metrics", "/status" };
	struct http_response *r;

	pool_setup();
	tstack_tenant_create(&t, "status");
	const char *tenant[] = { t.auth, NULL };
	const char *const *refused[] = { none, tenant, wrong };
	/* The main site passes no client address: only the token opens them. */
	for (size_t k = 0; k < 2; k++) {
		for (size_t i = 0; i < 3; i++) {
			r = http_request("GET", paths[k], refused[i], NULL, 0);
			cr_assert_not_null(r);
			tstack_expect_problem(r, 403, "/problems/forbidden", paths[k]);
			cr_assert_null(strstr(r->body, "processes"), "%s", r->body);
			http_response_free(r);
		}
		r = http_request("POST", paths[k], none, "{}", 2);
		cr_assert_not_null(r);
		tstack_expect_problem(r, 403, "/problems/forbidden", paths[k]);
		http_response_free(r);
		r = http_request("POST", paths[k], token, "{}", 2);
		cr_assert_not_null(r);
		tstack_expect_problem(r, 405, "/problems/method-not-allowed", paths[k]);
		tstack_expect_header(r, "Allow", "GET");
		http_response_free(r);
		r = http_request("GET", paths[k], token, NULL, 0);
		cr_assert_not_null(r);
		cr_assert_eq(r->status, 200, "GET %s with the token: %d", paths[k], r->status);
		http_response_free(r);
	}
	r = http_request("GET", "/status", none, NULL, 0);
	cr_assert_not_null(r);
	cr_assert_not_null(strstr(r->body,
	                          "/status is open to the addresses in metrics_allow, or with the "
	                          "metrics_token"),
	                   "%s", r->body);
	http_response_free(r);
}

/* --- Slow and stuck requests ------------------------------------------------ */

struct bg {
	pthread_t th;
	const struct tstack_tenant *t;
	const char *method;
	char path[128];
	char key[64];
	struct http_response *r;
};

static void *bg_run(void *arg)
{
	struct bg *b = arg;

	if (strcmp(b->method, "POST") == 0)
		b->r = tstack_post_raw(b->t, b->path, b->key, "{\"type\":\"stuck\"}");
	else
		b->r = http_request("GET", b->path, (const char *const[]){ b->t->auth, NULL }, NULL,
		                    0);
	return NULL;
}

Test(pool, a_slow_request_leaves_one_line_with_its_stage)
{
	struct tstack_tenant t;
	struct bg b = { .method = "GET" };
	PGconn *hold = tstack_db_connect();
	pid_t blocked;
	char *id, *m0, *m1;
	double t0;

	pool_setup();
	tstack_tenant_create(&t, "slow");
	id = tstack_create(&t, "{\"type\":\"slow\"}");
	m0 = scrape();
	b.t = &t;
	snprintf(b.path, sizeof(b.path), "/v1/workflows/%s", id);
	/* The read waits behind the test's lock on the whole table. */
	tstack_exec(hold, "BEGIN");
	tstack_exec(hold, "LOCK TABLE workflows IN ACCESS EXCLUSIVE MODE");
	t0 = tstack_now();
	cr_assert_eq(pthread_create(&b.th, NULL, bg_run, &b), 0);
	blocked = tstack_blocked_worker(hold, 5000);
	cr_assert_gt(blocked, 0, "the request did not block on the lock");
	/* Past the slow-log timeout by more than two of the supervisor's
	 * one-second ticks: every tick sees it, one line is written. */
	while (log_lines("msg=\"slow request\"", NULL, NULL) == 0 && tstack_now() < t0 + 10)
		tstack_sleep_ms(50);
	tstack_sleep_ms(2500);
	tstack_exec(hold, "ROLLBACK");
	PQfinish(hold);
	pthread_join(b.th, NULL);
	cr_assert_not_null(b.r, "no answer: %s", http_error());
	cr_assert_eq(b.r->status, 200, "the slow read: %d %.300s", b.r->status, b.r->body);
	cr_assert_geq(tstack_now() - t0, (SLOW_MS + 2000) / 1000.0);

	char rid[96], pid[48];
	snprintf(rid, sizeof(rid), "request_id=%s ", http_header(b.r, "X-Request-Id"));
	snprintf(pid, sizeof(pid), "worker_pid=%ld ", (long)blocked);
	cr_assert_eq(log_lines("msg=\"slow request\"", NULL, NULL), 1,
	             "want exactly one slow-request line; see %s", tstack_env("IDEMFLOW_FCGI_LOG"));
	cr_assert_eq(log_lines("msg=\"slow request\"", rid, pid), 1, "not %s %s", rid, pid);
	cr_assert_eq(log_lines("msg=\"slow request\"", "stage=\"in the database\"",
	                       "route=/v1/workflows/{id} "),
	             1, "the line names its stage and route; see %s",
	             tstack_env("IDEMFLOW_FCGI_LOG"));
	cr_assert_eq(log_lines("msg=\"slow request\"", "method=GET ", "elapsed_ms="), 1);
	m1 = scrape();
	cr_assert_eq(sample(m1, "idemflow_slow_requests_total") -
	                 sample(m0, "idemflow_slow_requests_total"),
	             1);
	cr_assert_eq(sample(m1, "idemflow_worker_terminated_total"), 0);
	http_response_free(b.r);
	free(id);
	free(m0);
	free(m1);
}

Test(pool, a_stuck_request_is_killed_with_nothing_left_and_counted)
{
	struct tstack_tenant t;
	struct bg b = { .method = "POST", .path = "/v1/workflows" };
	PGconn *hold = tstack_db_connect();
	pid_t blocked, now[MAX_WORKER];
	size_t n;
	double t0, deadline;
	char *m;
	char app[64];

	pool_setup();
	tstack_tenant_create(&t, "stuck");
	tstack_key(b.key, sizeof(b.key), "stuck");
	b.t = &t;
	/* The create waits for its key, held uncommitted by the test as a
	 * concurrent request would (idempotency_wait is longer than the
	 * terminate timeout here). */
	tstack_key_hold(hold, &t, b.key);
	t0 = tstack_now();
	cr_assert_eq(pthread_create(&b.th, NULL, bg_run, &b), 0);
	blocked = tstack_blocked_worker(hold, 5000);
	cr_assert_gt(blocked, 0, "the create did not wait for its key");
	pthread_join(b.th, NULL);
	cr_assert_not_null(b.r, "no answer: %s", http_error());
	/* The worker died mid-request: nginx answers for it (its 502, as
	 * the site's problem+json 503). */
	tstack_expect_problem(b.r, 503, "/problems/unavailable", "/v1/workflows");
	cr_assert_geq(tstack_now() - t0, KILL_MS / 1000.0 - 0.1);
	cr_assert(tstack_pid_gone(blocked), "worker %ld still runs", (long)blocked);

	/* Its transaction dies with its connection: PostgreSQL notices the
	 * closed socket while the statement still waits for the key, and
	 * ends the session. Only then is the key let go: not a row is left. */
	snprintf(app, sizeof(app), "%%-worker-%ld", (long)blocked);
	deadline = tstack_now() + 10;
	while (tstack_count("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1",
	                    app) > 0) {
		cr_assert(tstack_now() < deadline, "the killed worker's session stays");
		tstack_sleep_ms(20);
	}
	tstack_exec(hold, "ROLLBACK");
	PQfinish(hold);
	tstack_expect_counts(&t, 0, 0, 0);

	char rid[96], pid[48];
	snprintf(rid, sizeof(rid), "request_id=%s ", http_header(b.r, "X-Request-Id"));
	snprintf(pid, sizeof(pid), "worker_pid=%ld ", (long)blocked);
	cr_assert_eq(log_lines("killing its worker", rid, pid), 1, "see %s",
	             tstack_env("IDEMFLOW_FCGI_LOG"));
	cr_assert_eq(log_lines("killing its worker", "stage=\"waiting for the key\"", NULL), 1);

	/* Replaced, and counted once, not as a crash. */
	cr_assert(tstack_wait_workers(tstack_supervisor_pid(), WORKERS, 10000));
	n = tstack_workers(tstack_supervisor_pid(), now, MAX_WORKER);
	cr_assert(!pid_in(blocked, now, n));
	m = scrape();
	cr_assert_eq(sample(m, "idemflow_worker_terminated_total"), 1, "%s", m);
	cr_assert_eq(sample(m, "idemflow_worker_restarts_total"), 0);
	free(m);
	struct json_object *j = status_json("/status?json", NULL);
	cr_assert_eq(jint(j, "terminated requests"), 1);
	json_object_put(j);
	http_response_free(b.r);
}

/* --- /metrics --------------------------------------------------------------- */

Test(pool, metrics_has_the_pool_build_and_job_gauges)
{
	struct tstack_tenant t;
	char *m, *id, series[256];

	pool_setup();
	tstack_tenant_create(&t, "jobs");
	id = tstack_create(&t, "{\"type\":\"jobs\"}");
	/* Two activatable, one leased, three with an expired lease, one done. */
	tstack_exec(tstack_db(),
	            "INSERT INTO jobs (tenant_id, workflow_id, step, name, job_type, state, due_at,"
	            "                  worker, created_at, updated_at)"
	            " SELECT $1::bigint, $2::uuid, s, 'j' || s, 'gauge', st, due, w, now(), now()"
	            "   FROM (VALUES (1, 'activatable', NULL::timestamptz, NULL),"
	            "                (2, 'activatable', NULL, NULL),"
	            "                (3, 'active', now() + interval '1 hour', 'w'),"
	            "                (4, 'active', now() - interval '1 second', 'w'),"
	            "                (5, 'active', now() - interval '1 hour', 'w'),"
	            "                (6, 'active', now() - interval '1 day', 'w'),"
	            "                (7, 'completed', NULL, 'w')) v(s, st, due, w)",
	            t.id_text, id);
	m = scrape();
	cr_assert_eq(sample(m, "idemflow_jobs_activatable"), 2);
	cr_assert_eq(sample(m, "idemflow_jobs_leased"), 1);
	cr_assert_eq(sample(m, "idemflow_jobs_leases_expired"), 3);
	snprintf(series, sizeof(series), "idemflow_build_info{version=\"%s\",commit=\"%s\"}",
	         PACKAGE_VERSION, IDEMFLOW_COMMIT);
	cr_assert_eq(sample(m, series), 1);
	/* A checkout knows its commit; a tree made by make distdir (the
	 * sanitizer pass, a release tarball) has no .git and says unknown. */
	if (getenv("top_srcdir") != NULL) {
		snprintf(series, sizeof(series), "%s/.git", getenv("top_srcdir"));
		if (access(series, F_OK) == 0)
			cr_assert_str_neq(IDEMFLOW_COMMIT, "unknown",
			                  "a checkout knows its commit");
		else
			cr_assert_str_eq(IDEMFLOW_COMMIT, "unknown", "no .git, yet a commit");
	}
	/* The scrape itself is the one busy worker. */
	cr_assert_eq(sample(m, "idemflow_pool_workers{state=\"busy\"}"), 1);
	cr_assert_eq(sample(m, "idemflow_pool_workers{state=\"idle\"}"), WORKERS - 1);
	cr_assert_eq(sample(m, "idemflow_listen_queue"), 0);
	cr_assert_eq(sample(m, "idemflow_listen_queue_length"), 1024);
	/* The counters, by what one more scrape does to them (as above). */
	{
		char *m2 = scrape();

		cr_assert_eq(sample(m2, "idemflow_accepted_connections_total"),
		             sample(m, "idemflow_accepted_connections_total") + 1);
		cr_assert_eq(sample(m2, "idemflow_listen_queue_max"),
		             sample(m, "idemflow_listen_queue_max"));
		cr_assert_eq(sample(m2, "idemflow_max_children_reached_total"),
		             sample(m, "idemflow_max_children_reached_total"));
		free(m2);
	}
	free(m);
	tstack_exec(tstack_db(), "DELETE FROM jobs WHERE tenant_id = $1", t.id_text);
	free(id);
}

/* --- Under load ------------------------------------------------------------- */

#define LOADERS 8

struct loader {
	pthread_t th;
	const struct tstack_tenant *t;
	const char *path;
	double until;
	long done, failed;
};

static void *load_run(void *arg)
{
	struct loader *l = arg;

	while (tstack_now() < l->until) {
		struct http_response *r = http_request(
		    "GET", l->path, (const char *const[]){ l->t->auth, NULL }, NULL, 0);
		if (r == NULL || r->status != 200)
			l->failed++;
		else
			l->done++;
		http_response_free(r);
	}
	return NULL;
}

Test(pool, status_answers_while_requests_run)
{
	struct tstack_tenant t;
	struct loader l[LOADERS];
	char *id, path[128];
	long reads = 0, max_active = 0, done = 0, failed = 0, max_queue = 0;
	long long last_accepted = 0, first_accepted = -1, reached0, reached1, queue_hw = 0;
	double t0;

	pool_setup();
	tstack_tenant_create(&t, "load");
	id = tstack_create(&t, "{\"type\":\"load\"}");
	snprintf(path, sizeof(path), "/v1/workflows/%s", id);
	struct json_object *j = status_json("/status?json", NULL);
	reached0 = jint(j, "max children reached");
	json_object_put(j);
	t0 = tstack_now();
	for (int i = 0; i < LOADERS; i++) {
		l[i] = (struct loader){ .t = &t, .path = path, .until = t0 + 3 };
		cr_assert_eq(pthread_create(&l[i].th, NULL, load_run, &l[i]), 0);
	}
	while (tstack_now() < t0 + 3) {
		struct json_object *s = status_json("/status?json&full", NULL);
		struct json_object *procs;
		long long active = jint(s, "active processes"), idle = jint(s, "idle processes");
		long long acc = jint(s, "accepted conn");
		cr_assert_eq(jint(s, "total processes"), WORKERS);
		cr_assert_eq(active + idle, WORKERS);
		cr_assert_geq(active, 1);
		cr_assert_geq(acc, last_accepted, "accepted_conn went back");
		cr_assert(json_object_object_get_ex(s, "processes", &procs));
		cr_assert_eq(json_object_array_length(procs), WORKERS);
		if (first_accepted < 0)
			first_accepted = acc;
		last_accepted = acc;
		if (active > max_active)
			max_active = active;
		if (jint(s, "listen queue") > max_queue)
			max_queue = jint(s, "listen queue");
		queue_hw = jint(s, "max listen queue");
		reads++;
		json_object_put(s);
	}
	for (int i = 0; i < LOADERS; i++) {
		pthread_join(l[i].th, NULL);
		done += l[i].done;
		failed += l[i].failed;
	}
	j = status_json("/status?json", NULL);
	reached1 = jint(j, "max children reached");
	json_object_put(j);
	fprintf(stderr,
	        "# status under load: %ld reads in 3 s while %d clients made %ld requests "
	        "(%ld failed); busy up to %ld of %d; accepted_conn %lld -> %lld; listen queue "
	        "seen up to %ld, high-water mark %lld; max_children_reached +%lld\n",
	        reads, LOADERS, done, failed, max_active, WORKERS, first_accepted, last_accepted,
	        max_queue, queue_hw, reached1 - reached0);
	cr_assert_eq(failed, 0);
	cr_assert_gt(reads, 10);
	cr_assert_geq(last_accepted - first_accepted, done / 2, "accepted_conn did not follow");
	/* Eight clients on three workers: the pool ran out of idle workers. */
	cr_assert_eq(max_active, WORKERS, "never every worker busy under load");
	cr_assert_gt(reached1, reached0, "max_children_reached did not count the full pool");
	free(id);
}
