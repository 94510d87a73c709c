/*
 * End-to-end tests of GET /metrics, the request log and the dispatcher's
 * textfile.
 *
 * Most tests run an idemflow-fcgi of their own (4 workers, as in
 * production) on a socket of their own and talk FastCGI to it directly, so
 * the counters they read were moved by nobody else. Those that read the
 * outbox gauges also get a database of their own: the gauges count the
 * whole outbox, and other tests create events in the harness database at
 * the same time.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <json-c/json.h>

#include "core/fp.h"
#include "http.h"
#include "tapi.h"
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

#define COLLECTION  "/v1/workflows"
#define JSON_CT     "Content-Type: application/json"
#define WORKERS     4
#define MAX_WORKERS 64

TestSuite(metrics, .timeout = 120);
TestSuite(logs, .timeout = 60);
TestSuite(textfile, .timeout = 60);
TestSuite(replay_cache, .timeout = 60);

static const char BODY_A[] = "{\"type\":\"m\",\"input\":{\"a\":1}}";
static const char BODY_B[] = "{\"type\":\"m\",\"input\":{\"a\":2}}";

/* --- A server of our own ----------------------------------------------- */

static struct tstack_pool own;

/* Runs after each test even when an assertion failed: the supervisor and
 * its workers, all in one process group. */
static void own_stop(void)
{
	tstack_pool_kill(&own, SIGKILL);
}

/* A path in the harness's directory, unique to this test process. */
static void stack_path(char *out, size_t size, const char *name)
{
	int n = snprintf(out, size, "%s/m%ld-%s", tstack_env("IDEMFLOW_STACK_DIR"), (long)getpid(),
	                 name);

	cr_assert(n > 0 && (size_t)n < size, "path too long: %s", out);
}

/* Start idemflow-fcgi with the harness configuration, our socket and the
 * database in $DATABASE_URL, plus overrides; wait for it and its workers. */
static void own_start(const char *const *overrides, long workers)
{
	const char *argv[40];
	size_t argc = 0;

	tstack_pool_paths(&own, "m");
	argv[argc++] = tstack_env("IDEMFLOW_FCGI");
	argv[argc++] = "--config";
	argv[argc++] = tstack_env("IDEMFLOW_CONF");
	argv[argc++] = "--db";
	argv[argc++] = tstack_env("DATABASE_URL");
	argv[argc++] = "--listen";
	argv[argc++] = own.sock;
	argv[argc++] = "--pid-file";
	argv[argc++] = own.pidfile;
	for (size_t i = 0; overrides && overrides[i]; i++) {
		cr_assert(argc < sizeof(argv) / sizeof(argv[0]) - 1);
		argv[argc++] = overrides[i];
	}
	argv[argc] = NULL;
	tstack_pool_run(&own, argv, 10000);
	cr_assert(tstack_wait_workers(own.pid, (size_t)workers, 10000),
	          "idemflow-fcgi does not have %ld workers; see %s", workers, own.log);
}

/*
 * A database of its own, migrated, made the one that every tstack helper
 * and every program started from here uses. Must come before anything
 * else touches the database.
 */
static void own_database(void)
{
	char name[64], hex[9], sql[128], conninfo[1024], out[512];
	PGconn *c;
	int rc;

	tstack_random_hex(hex, 4);
	snprintf(name, sizeof(name), "metrics_%ld_%s", (long)getpid(), hex);
	snprintf(sql, sizeof(sql), "CREATE DATABASE %s", name);
	c = tstack_db_connect();
	tstack_exec(c, sql);
	PQfinish(c);
	snprintf(conninfo, sizeof(conninfo), "%s dbname=%s", tstack_env("DATABASE_URL"), name);
	cr_assert_eq(setenv("DATABASE_URL", conninfo, 1), 0);
	rc = tstack_cli(out, sizeof(out), "migrate", NULL);
	cr_assert_eq(rc, 0, "migrate %s exited %d: %s", name, rc, tstack_cli_stderr());
}

/* --- Requests ------------------------------------------------------------- */

static struct http_response *fcgi(const char *method, const char *path, const char *const *headers,
                                  const char *body)
{
	struct http_response *r =
	    http_fcgi_request(own.sock, method, path, headers, body, body ? strlen(body) : 0);

	cr_assert_not_null(r, "%s %s: %s", method, path, http_error());
	return r;
}

/* POST /v1/workflows as t, with a key unless NULL; asserts the status. */
static struct http_response *post(const struct tstack_tenant *t, const char *key, const char *body,
                                  int status)
{
	char kh[512];
	const char *h[] = { t->auth, JSON_CT, NULL, NULL };
	struct http_response *r;

	if (key) {
		snprintf(kh, sizeof(kh), "Idempotency-Key: %s", key);
		h[2] = kh;
	}
	r = fcgi("POST", COLLECTION, h, body);
	cr_assert_eq(r->status, status, "POST %s: %d, want %d: %.300s", key ? key : "(no key)",
	             r->status, status, r->body);
	return r;
}

static void expect_status(const char *method, const char *path, const char *const *headers,
                          int status)
{
	struct http_response *r = fcgi(method, path, headers, NULL);

	cr_assert_eq(r->status, status, "%s %s: %d, want %d: %.300s", method, path, r->status,
	             status, r->body);
	http_response_free(r);
}

/* GET /metrics from 127.0.0.1 (allowed by default); the body, malloc'ed. */
static char *scrape(void)
{
	struct http_response *r = fcgi("GET", "/metrics", NULL, NULL);
	char *body;

	cr_assert_eq(r->status, 200, "GET /metrics: %d: %.300s", r->status, r->body);
	tstack_expect_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
	body = strdup(r->body);
	http_response_free(r);
	return body;
}

/* The sample line "<series> <value>" (series with its labels, exactly as
 * exposed): 1 and *value when present. */
static int sample_find(const char *body, const char *series, double *value)
{
	size_t n = strlen(series);

	for (const char *p = body; *p;) {
		const char *nl = strchr(p, '\n');
		if (strncmp(p, series, n) == 0 && p[n] == ' ') {
			*value = strtod(p + n + 1, NULL);
			return 1;
		}
		if (!nl)
			break;
		p = nl + 1;
	}
	return 0;
}

/* A series that must be exposed. */
static double sample(const char *body, const char *series)
{
	double v = 0;

	cr_assert(sample_find(body, series, &v), "no sample %s in:\n%s", series, body);
	return v;
}

/* A counter: absent until first incremented, so absent reads as 0. */
static double counter(const char *body, const char *series)
{
	double v = 0;

	sample_find(body, series, &v);
	return v;
}

static void expect_delta(const char *before, const char *after, const char *series, double want)
{
	double d = counter(after, series) - counter(before, series);

	cr_assert(d == want, "%s went up by %g, want %g", series, d, want);
}

/* --- Keeping every worker busy ------------------------------------------- */

struct racer {
	const char *const *headers;
	struct http_response *resp;
	char err[256];
};

static void *racer_run(void *arg)
{
	struct racer *r = arg;

	r->resp =
	    http_fcgi_request(own.sock, "POST", COLLECTION, r->headers, BODY_A, strlen(BODY_A));
	if (!r->resp)
		snprintf(r->err, sizeof(r->err), "%s", http_error());
	return NULL;
}

/*
 * n POSTs of one key that another session holds, all at once. Each keeps
 * a worker busy until idempotency_wait runs out and then gets 409 in
 * flight. Waits until n distinct server sessions are blocked behind the
 * holder at the same moment: that proves n different workers took them.
 */
static void in_flight_on_n_workers(const struct tstack_tenant *t, int n, long wait_ms)
{
	struct racer racers[MAX_WORKERS];
	pthread_t threads[MAX_WORKERS];
	char key[128], kh[256], holder[24];
	const char *h[] = { t->auth, JSON_CT, kh, NULL };
	PGconn *hold;
	double deadline;
	long blocked = 0;

	cr_assert(n <= MAX_WORKERS);
	tstack_key(key, sizeof(key), "inflight");
	snprintf(kh, sizeof(kh), "Idempotency-Key: %s", key);
	hold = tstack_db_connect();
	tstack_key_hold(hold, t, key);
	snprintf(holder, sizeof(holder), "%d", PQbackendPID(hold));
	for (int i = 0; i < n; i++) {
		racers[i] = (struct racer){ .headers = h };
		cr_assert_eq(pthread_create(&threads[i], NULL, racer_run, &racers[i]), 0);
	}
	deadline = tstack_now() + (double)wait_ms * 0.8 / 1000;
	while (blocked < n && tstack_now() < deadline) {
		tstack_sleep_ms(20);
		blocked = tstack_count("SELECT count(*) FROM pg_stat_activity"
		                       " WHERE $1::int = ANY (pg_blocking_pids(pid))"
		                       "   AND application_name LIKE '%-worker-%'",
		                       holder);
	}
	for (int i = 0; i < n; i++)
		pthread_join(threads[i], NULL);
	tstack_exec(hold, "ROLLBACK");
	PQfinish(hold);
	cr_assert_eq(blocked, n, "%ld workers were blocked on the held key at once, want %d",
	             blocked, n);
	for (int i = 0; i < n; i++) {
		cr_assert_not_null(racers[i].resp, "racer %d: %s", i, racers[i].err);
		tstack_expect_problem(racers[i].resp, 409, "/problems/idempotency-key-in-flight",
		                      COLLECTION);
		http_response_free(racers[i].resp);
	}
}

/* --- Counters ------------------------------------------------------------- */

Test(metrics, every_outcome_is_counted_exactly_across_four_workers, .fini = own_stop)
{
	static const char *const opts[] = { "--workers", "4", "--idempotency-wait", "3s", NULL };
	struct tstack_tenant t;
	struct http_response *r;
	char key[128], path[256], uuid[37], *id, *before, *after;
	const char *bad_auth[] = { "Authorization: Bearer idf_not_a_token", JSON_CT, NULL };
	const char *no_auth[] = { NULL };

	own_database();
	own_start(opts, WORKERS);
	tstack_tenant_create(&t, "metrics");
	const char *auth[] = { t.auth, NULL };
	before = scrape();

	/* One key: created, replayed twice, reused for another body. */
	tstack_key(key, sizeof(key), "outcomes");
	r = post(&t, key, BODY_A, 201);
	id = tstack_expect_created(r, "m", "{\"a\":1}");
	http_response_free(r);
	http_response_free(post(&t, key, BODY_A, 201));
	http_response_free(post(&t, key, BODY_A, 201));
	r = post(&t, key, BODY_B, 409);
	tstack_expect_problem(r, 409, "/problems/idempotency-key-reused", COLLECTION);
	http_response_free(r);
	/* Four at once behind a held key: every worker answers one. */
	in_flight_on_n_workers(&t, WORKERS, 3000);
	/* Refusals before any key is claimed. */
	http_response_free(post(&t, NULL, BODY_A, 400));
	tstack_key(key, sizeof(key), "badjson");
	http_response_free(post(&t, key, "{\"type\":", 400));
	{
		char kh[256];
		const char *h[] = { bad_auth[0], JSON_CT, kh, NULL };
		snprintf(kh, sizeof(kh), "Idempotency-Key: %s", key);
		r = fcgi("POST", COLLECTION, h, BODY_A);
		cr_assert_eq(r->status, 401);
		http_response_free(r);
	}
	/* The other routes, each under its template. */
	snprintf(path, sizeof(path), COLLECTION "/%s", id);
	expect_status("GET", path, auth, 200);
	tstack_uuid(uuid);
	snprintf(path, sizeof(path), COLLECTION "/%s", uuid);
	expect_status("GET", path, auth, 404);
	expect_status("GET", "/healthz", no_auth, 204);
	expect_status("DELETE", "/healthz", no_auth, 405);
	expect_status("GET", "/nope", no_auth, 404);
	expect_status("GET", COLLECTION "/a/b", auth, 404);
	after = scrape();

	expect_delta(before, after,
	             "idemflow_requests_total{route=\"/v1/workflows\",status=\"201\"}", 3);
	expect_delta(before, after,
	             "idemflow_requests_total{route=\"/v1/workflows\",status=\"409\"}", 5);
	expect_delta(before, after,
	             "idemflow_requests_total{route=\"/v1/workflows\",status=\"400\"}", 2);
	expect_delta(before, after,
	             "idemflow_requests_total{route=\"/v1/workflows\",status=\"401\"}", 1);
	expect_delta(before, after,
	             "idemflow_requests_total{route=\"/v1/workflows/{id}\",status=\"200\"}", 1);
	expect_delta(before, after,
	             "idemflow_requests_total{route=\"/v1/workflows/{id}\",status=\"404\"}", 1);
	expect_delta(before, after, "idemflow_requests_total{route=\"/healthz\",status=\"204\"}",
	             1);
	expect_delta(before, after, "idemflow_requests_total{route=\"/healthz\",status=\"405\"}",
	             1);
	expect_delta(before, after, "idemflow_requests_total{route=\"other\",status=\"404\"}", 2);
	/* The first scrape is counted once its answer is ready: by the second. */
	expect_delta(before, after, "idemflow_requests_total{route=\"/metrics\",status=\"200\"}",
	             1);

	expect_delta(before, after, "idemflow_idempotency_created_total{route=\"/v1/workflows\"}",
	             1);
	expect_delta(before, after, "idemflow_idempotency_replays_total{route=\"/v1/workflows\"}",
	             2);
	expect_delta(
	    before, after,
	    "idemflow_idempotency_conflicts_total{route=\"/v1/workflows\",reason=\"mismatch\"}", 1);
	expect_delta(
	    before, after,
	    "idemflow_idempotency_conflicts_total{route=\"/v1/workflows\",reason=\"in_flight\"}",
	    WORKERS);

	/* The histogram saw all 11 creates; the 4 that waited out the 3 s
	 * idempotency_wait are above the 1 s bucket, the 7 others in it. */
	expect_delta(before, after,
	             "idemflow_request_duration_seconds_count{route=\"/v1/workflows\"}", 11);
	expect_delta(
	    before, after,
	    "idemflow_request_duration_seconds_bucket{route=\"/v1/workflows\",le=\"+Inf\"}", 11);
	expect_delta(before, after,
	             "idemflow_request_duration_seconds_bucket{route=\"/v1/workflows\",le=\"1\"}",
	             7);
	double waited =
	    sample(after, "idemflow_request_duration_seconds_sum{route=\"/v1/workflows\"}") -
	    sample(before, "idemflow_request_duration_seconds_sum{route=\"/v1/workflows\"}");
	cr_assert(waited >= 4 * 3.0, "duration sum grew by %f s, want at least 12", waited);

	cr_assert_eq(sample(after, "idemflow_workers"), WORKERS);
	expect_delta(before, after, "idemflow_worker_restarts_total", 0);
	expect_delta(before, after, "idemflow_db_reconnects_total", 0);
	cr_assert_eq(sample(after, "idemflow_db_up"), 1);
	cr_assert_eq(sample(after, "idemflow_outbox_pending"), 1);
	cr_assert_eq(sample(after, "idemflow_outbox_dead"), 0);
	free(before);
	free(after);

	/* The outbox gauges follow the table: an old pending event and a
	 * dead one. */
	tstack_key(key, sizeof(key), "second");
	r = post(&t, key, BODY_B, 201);
	http_response_free(r);
	tstack_exec(tstack_db(),
	            "UPDATE outbox SET created_at = now() - interval '600 seconds'"
	            " WHERE workflow_id = $1",
	            id);
	tstack_exec(tstack_db(), "UPDATE outbox SET dead_at = now() WHERE workflow_id <> $1", id);
	after = scrape();
	cr_assert_eq(sample(after, "idemflow_outbox_pending"), 1);
	cr_assert_eq(sample(after, "idemflow_outbox_dead"), 1);
	double age = sample(after, "idemflow_outbox_oldest_pending_age_seconds");
	cr_assert(age >= 600 && age < 630, "oldest pending age %f, want 600 s and a little", age);
	free(after);
	free(id);
}

/* POST path as t with a fresh key; asserts the status. */
static struct http_response *post_to(const struct tstack_tenant *t, const char *path,
                                     const char *body, int status)
{
	char key[128], kh[256];
	const char *h[] = { t->auth, JSON_CT, kh, NULL };
	struct http_response *r;

	tstack_key(key, sizeof(key), "mc");
	snprintf(kh, sizeof(kh), "Idempotency-Key: %s", key);
	r = fcgi("POST", path, h, body);
	cr_assert_eq(r->status, status, "POST %s: %d, want %d: %.300s", path, r->status, status,
	             r->body);
	return r;
}

/* A workflow of one job step of type job_type; its id, malloc'ed. */
static char *one_job(const struct tstack_tenant *t, const char *job_type)
{
	char body[256], key[128];
	struct http_response *r;
	char *id;

	snprintf(body, sizeof(body),
	         "{\"type\":\"mc\",\"steps\":[{\"name\":\"s\",\"job_type\":\"%s\"}]}", job_type);
	tstack_key(key, sizeof(key), "mcwf");
	r = post(t, key, body, 201);
	id = tstack_json(r->body, "{id}");
	http_response_free(r);
	return id;
}

static void activate_as(const struct tstack_tenant *t, const char *job_type, const char *worker)
{
	char body[256];

	snprintf(body, sizeof(body),
	         "{\"job_type\":\"%s\",\"worker\":\"%s\",\"max_jobs\":1,\"lease_seconds\":60}",
	         job_type, worker);
	http_response_free(post_to(t, "/v1/jobs/activate", body, 200));
}

/* POST /v1/jobs/{wf}.s1/complete as worker under key; asserts the status. */
static struct http_response *complete_as(const struct tstack_tenant *t, const char *wf,
                                         const char *worker, const char *key, int status)
{
	char path[160], body[128], kh[256];
	const char *h[] = { t->auth, JSON_CT, kh, NULL };
	struct http_response *r;

	snprintf(path, sizeof(path), "/v1/jobs/%s.s1/complete", wf);
	snprintf(body, sizeof(body), "{\"worker\":\"%s\"}", worker);
	snprintf(kh, sizeof(kh), "Idempotency-Key: %s", key);
	r = fcgi("POST", path, h, body);
	cr_assert_eq(r->status, status, "complete %s as %s: %d, want %d: %.300s", wf, worker,
	             r->status, status, r->body);
	return r;
}

/* r is a problem of the given slug. */
static void expect_slug(const struct http_response *r, const char *slug)
{
	char *type = tstack_json(r->body, "{type}");
	size_t n = strlen(type), m = strlen(slug);

	cr_assert(n > m && strcmp(type + n - m, slug) == 0 && type[n - m - 1] == '/',
	          "problem type %s, want .../%s", type, slug);
	free(type);
}

static void lease_runs_out(const char *wf)
{
	tstack_exec(tstack_db(),
	            "UPDATE jobs SET due_at = now() - interval '1 second' WHERE workflow_id = $1",
	            wf);
}

#define COMPLETE_ROUTE "/v1/jobs/{key}/complete"

/*
 * Job completions: those that ran are counted, completed or skipped by
 * the lease check (a worker whose lease ran out, one whose job another
 * worker holds now, one whose job another worker finished), never a
 * replay nor a completion of no job; and a 202 is counted as such.
 */
Test(metrics, job_completions_and_skipped_ones_are_counted_exactly, .fini = own_stop)
{
	static const char *const opts[] = { "--workers", "4", NULL };
	struct tstack_tenant t;
	struct http_response *r, *first;
	char key[128], path[160], uuid[37], *a, *b, *c, *before, *after;

	own_database();
	own_start(opts, WORKERS);
	tstack_tenant_create(&t, "completions");
	a = one_job(&t, "mc-a");
	b = one_job(&t, "mc-b");
	c = one_job(&t, "mc-c");
	before = scrape();

	/* a: completed, then the same request again: a replay. */
	activate_as(&t, "mc-a", "w1");
	tstack_key(key, sizeof(key), "done");
	first = complete_as(&t, a, "w1", key, 200);
	r = complete_as(&t, a, "w1", key, 200);
	tstack_expect_header(r, "Idempotent-Replayed", "true");
	cr_assert_str_eq(r->body, first->body, "a replay answers the same bytes");
	http_response_free(r);
	http_response_free(first);
	/* b: its lease ran out before w1 completed it. */
	activate_as(&t, "mc-b", "w1");
	lease_runs_out(b);
	tstack_key(key, sizeof(key), "late");
	r = complete_as(&t, b, "w1", key, 409);
	expect_slug(r, "lease-expired");
	http_response_free(r);
	/* c: w2 took it over; w1's completion is refused, w2's counts, and
	 * w1's again finds it finished. */
	activate_as(&t, "mc-c", "w1");
	lease_runs_out(c);
	activate_as(&t, "mc-c", "w2");
	tstack_key(key, sizeof(key), "taken");
	r = complete_as(&t, c, "w1", key, 409);
	expect_slug(r, "not-lease-holder");
	http_response_free(r);
	tstack_key(key, sizeof(key), "w2");
	http_response_free(complete_as(&t, c, "w2", key, 200));
	tstack_key(key, sizeof(key), "again");
	r = complete_as(&t, c, "w1", key, 409);
	expect_slug(r, "job-not-active");
	http_response_free(r);
	/* No such job: not a completion that ran. */
	tstack_uuid(uuid);
	tstack_key(key, sizeof(key), "ghost");
	http_response_free(complete_as(&t, uuid, "w1", key, 404));
	/* A message the finished workflow a does not wait for: 202. */
	snprintf(path, sizeof(path), COLLECTION "/%s/messages", a);
	http_response_free(post_to(&t, path, "{\"message_id\":\"m1\",\"name\":\"late\"}", 202));
	after = scrape();

	expect_delta(before, after, "idemflow_job_completions_total", 5);
	expect_delta(before, after,
	             "idemflow_job_completions_skipped_total{reason=\"lease_expired\"}", 1);
	expect_delta(before, after,
	             "idemflow_job_completions_skipped_total{reason=\"not_lease_holder\"}", 1);
	expect_delta(before, after, "idemflow_job_completions_skipped_total{reason=\"not_active\"}",
	             1);
	expect_delta(before, after,
	             "idemflow_requests_total{route=\"" COMPLETE_ROUTE "\",status=\"200\"}", 3);
	expect_delta(before, after,
	             "idemflow_requests_total{route=\"" COMPLETE_ROUTE "\",status=\"409\"}", 3);
	expect_delta(before, after,
	             "idemflow_requests_total{route=\"" COMPLETE_ROUTE "\",status=\"404\"}", 1);
	expect_delta(before, after,
	             "idemflow_idempotency_replays_total{route=\"" COMPLETE_ROUTE "\"}", 1);
	expect_delta(
	    before, after,
	    "idemflow_requests_total{route=\"/v1/workflows/{id}/messages\",status=\"202\"}", 1);
	expect_delta(
	    before, after,
	    "idemflow_requests_total{route=\"/v1/workflows/{id}/messages\",status=\"other\"}", 0);
	free(before);
	free(after);
	free(a);
	free(b);
	free(c);
}

Test(metrics, totals_survive_every_worker_killed_with_sigkill, .fini = own_stop)
{
	static const char *const opts[] = { "--workers", "4", "--idempotency-wait", "2s", NULL };
	pid_t old[MAX_WORKERS], cur[MAX_WORKERS];
	struct tstack_tenant t;
	char key[128], *before, *after;
	size_t nold, ncur;
	double deadline;

	own_start(opts, WORKERS);
	tstack_tenant_create(&t, "survive");
	/* Counts in every worker's slot, then a few more anywhere. */
	in_flight_on_n_workers(&t, WORKERS, 2000);
	tstack_key(key, sizeof(key), "survive");
	http_response_free(post(&t, key, BODY_A, 201));
	http_response_free(post(&t, key, BODY_A, 201));
	before = scrape();

	nold = tstack_workers(own.pid, old, MAX_WORKERS);
	cr_assert_eq(nold, WORKERS);
	for (size_t i = 0; i < nold; i++)
		cr_assert_eq(kill(old[i], SIGKILL), 0, "kill %ld: %s", (long)old[i],
		             strerror(errno));
	/* Young deaths in a row: the respawns back off (up to 2 s here). */
	deadline = tstack_now() + 20;
	for (;;) {
		int replaced = 1;
		ncur = tstack_workers(own.pid, cur, MAX_WORKERS);
		for (size_t i = 0; i < ncur; i++)
			for (size_t j = 0; j < nold; j++)
				if (cur[i] == old[j])
					replaced = 0;
		if (replaced && ncur == WORKERS)
			break;
		cr_assert(tstack_now() < deadline, "workers not replaced within 20s; see %s",
		          own.log);
		tstack_sleep_ms(50);
	}
	after = scrape();

	expect_delta(before, after,
	             "idemflow_requests_total{route=\"/v1/workflows\",status=\"409\"}", 0);
	expect_delta(before, after,
	             "idemflow_requests_total{route=\"/v1/workflows\",status=\"201\"}", 0);
	cr_assert_eq(
	    counter(after, "idemflow_requests_total{route=\"/v1/workflows\",status=\"409\"}"),
	    WORKERS);
	cr_assert_eq(
	    counter(after, "idemflow_requests_total{route=\"/v1/workflows\",status=\"201\"}"), 2);
	cr_assert_eq(counter(after, "idemflow_idempotency_conflicts_total{route=\"/v1/"
	                            "workflows\",reason=\"in_flight\"}"),
	             WORKERS);
	cr_assert_eq(counter(after, "idemflow_idempotency_created_total{route=\"/v1/workflows\"}"),
	             1);
	cr_assert_eq(counter(after, "idemflow_idempotency_replays_total{route=\"/v1/workflows\"}"),
	             1);
	cr_assert_eq(
	    counter(after, "idemflow_request_duration_seconds_count{route=\"/v1/workflows\"}"),
	    WORKERS + 2);
	expect_delta(before, after, "idemflow_requests_total{route=\"/metrics\",status=\"200\"}",
	             1);
	expect_delta(before, after, "idemflow_worker_restarts_total", WORKERS);
	cr_assert_eq(sample(after, "idemflow_workers"), WORKERS);

	/* The new workers count on top of what the dead ones left. */
	http_response_free(post(&t, key, BODY_A, 201));
	free(after);
	after = scrape();
	cr_assert_eq(counter(after, "idemflow_idempotency_replays_total{route=\"/v1/workflows\"}"),
	             2);
	free(before);
	free(after);
}

/* --- Who may scrape --------------------------------------------------------- */

Test(metrics, refused_outside_the_allowlist_without_the_metrics_token, .fini = own_stop)
{
	char token[40], bearer[64], hex[17];
	const char *opts[] = {
		"--workers", "1", "--metrics-allow", "10.0.0.0/8, fd00::/8", "--metrics-token",
		token,       NULL
	};
	struct tstack_tenant t;
	struct http_response *r;
	const char *none[] = { NULL };
	const char *wrong[] = { "Authorization: Bearer idf_metrics_wrong", NULL };
	const char *with_token[] = { bearer, NULL };

	tstack_random_hex(hex, 8);
	snprintf(token, sizeof(token), "m_%s", hex);
	snprintf(bearer, sizeof(bearer), "Authorization: Bearer %s", token);
	own_start(opts, 1);
	tstack_tenant_create(&t, "scraper");
	const char *tenant[] = { t.auth, NULL };

	/* 127.0.0.1 is not in the list: no token, a tenant's token, a wrong
	 * token are all refused. */
	const char *const *refused[] = { none, tenant, wrong };
	for (size_t i = 0; i < 3; i++) {
		r = fcgi("GET", "/metrics", refused[i], NULL);
		tstack_expect_problem(r, 403, "/problems/forbidden", "/metrics");
		cr_assert_null(strstr(r->body, "idemflow_"), "a refusal leaked metrics: %s",
		               r->body);
		http_response_free(r);
	}
	/* Not even the method is revealed to a stranger. */
	r = fcgi("POST", "/metrics", none, NULL);
	tstack_expect_problem(r, 403, "/problems/forbidden", "/metrics");
	http_response_free(r);

	r = fcgi("POST", "/metrics", with_token, NULL);
	tstack_expect_problem(r, 405, "/problems/method-not-allowed", "/metrics");
	tstack_expect_header(r, "Allow", "GET");
	http_response_free(r);

	r = fcgi("GET", "/metrics", with_token, NULL);
	cr_assert_eq(r->status, 200, "with the metrics token: %d: %.300s", r->status, r->body);
	tstack_expect_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
	cr_assert_eq(sample(r->body, "idemflow_workers"), 1);
	cr_assert_eq(counter(r->body, "idemflow_requests_total{route=\"/metrics\",status=\"403\"}"),
	             4);
	cr_assert_eq(counter(r->body, "idemflow_requests_total{route=\"/metrics\",status=\"405\"}"),
	             1);
	http_response_free(r);
}

Test(metrics, a_bad_allowlist_stops_the_server_at_start_with_exit_78)
{
	char log[512];
	const char *argv[] = { tstack_env("IDEMFLOW_FCGI"), "--config",
		               tstack_env("IDEMFLOW_CONF"), "--listen",
		               "/nonexistent/never.sock",   "--metrics-allow",
		               "127.0.0.1,localhost",       NULL };
	int status;
	FILE *f;
	char text[4096] = "";
	size_t n;

	stack_path(log, sizeof(log), "badallow.log");
	pid_t pid = tstack_spawn(argv, log);
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 78, "status 0x%x, want exit 78",
	          status);
	f = fopen(log, "r");
	cr_assert_not_null(f);
	n = fread(text, 1, sizeof(text) - 1, f);
	text[n] = '\0';
	fclose(f);
	cr_assert_not_null(
	    strstr(text, "metrics_allow: \\\"localhost\\\" is not an IPv4 or IPv6 address"),
	    "the error must name the key and the entry: %s", text);
}

/* On nginx's metrics listener (the site itself passes no client address:
 * t/e2e/test_security.c). */
Test(metrics, nginx_passes_the_client_address_and_loopback_may_scrape)
{
	char *saved = strdup(tstack_env("IDEMFLOW_PORT"));
	struct http_response *r;

	setenv("IDEMFLOW_PORT", tstack_env("IDEMFLOW_METRICS_PORT"), 1);
	r = http_request("GET", "/metrics", NULL, NULL, 0);
	setenv("IDEMFLOW_PORT", saved, 1);
	free(saved);
	cr_assert_not_null(r, "GET /metrics: %s", http_error());
	cr_assert_eq(r->status, 200, "GET /metrics through nginx: %d: %.300s", r->status, r->body);
	tstack_expect_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
	cr_assert_eq(sample(r->body, "idemflow_workers"), tstack_conf_long("workers", 4));
	http_response_free(r);
}

/* --- Logs ------------------------------------------------------------------- */

static char *file_read(const char *path)
{
	FILE *f = fopen(path, "r");
	char *text;
	long n;

	cr_assert_not_null(f, "open %s: %s", path, strerror(errno));
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	text = malloc((size_t)n + 1);
	cr_assert_not_null(text);
	cr_assert_eq(fread(text, 1, (size_t)n, f), (size_t)n);
	text[n] = '\0';
	fclose(f);
	return text;
}

static void key_fp(char out[13], const char *key)
{
	uint8_t h[FP_LEN];
	char hex[2 * FP_LEN + 1];

	fp_token(h, key, strlen(key));
	fp_hex(hex, h, FP_LEN);
	memcpy(out, hex, 12);
	out[12] = '\0';
}

/* The JSON line of the request with this id, parsed. */
static struct json_object *json_line(const char *text, const char *request_id)
{
	char *copy = strdup(text), *save = NULL;
	struct json_object *found = NULL;

	for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		struct json_object *o = json_tokener_parse(line), *v;
		cr_assert_not_null(o, "not a JSON line: %s", line);
		if (!found && json_object_object_get_ex(o, "request_id", &v) &&
		    strcmp(json_object_get_string(v), request_id) == 0) {
			found = o;
			continue;
		}
		json_object_put(o);
	}
	free(copy);
	cr_assert_not_null(found, "no line with request_id %s in:\n%s", request_id, text);
	return found;
}

static void expect_json(struct json_object *o, const char *name, json_type type, const char *text)
{
	struct json_object *v;

	cr_assert(json_object_object_get_ex(o, name, &v), "no \"%s\" in %s", name,
	          json_object_to_json_string(o));
	cr_assert_eq(json_object_get_type(v), type, "\"%s\" has the wrong type in %s", name,
	             json_object_to_json_string(o));
	if (text)
		cr_assert_str_eq(json_object_get_string(v), text, "\"%s\" in %s", name,
		                 json_object_to_json_string(o));
}

Test(logs, json_request_line_has_route_outcome_and_key_fingerprint_never_key_or_token,
     .fini = own_stop)
{
	char logfile[512], key[128], fp[13], tenant[24];
	const char *opts[] = {
		"--workers", "1", "--log-format", "json", "--log-file", logfile, NULL
	};
	struct tstack_tenant t;
	struct http_response *r;
	struct json_object *o;
	char *text;

	stack_path(logfile, sizeof(logfile), "json.log");
	own_start(opts, 1);
	tstack_tenant_create(&t, "jsonlog");
	tstack_key(key, sizeof(key), "json-log");
	r = post(&t, key, BODY_A, 201);

	text = file_read(logfile);
	o = json_line(text, http_header(r, "X-Request-Id"));
	key_fp(fp, key);
	snprintf(tenant, sizeof(tenant), "%ld", t.id);
	expect_json(o, "level", json_type_string, "info");
	expect_json(o, "component", json_type_string, "worker");
	expect_json(o, "msg", json_type_string, "request");
	expect_json(o, "method", json_type_string, "POST");
	expect_json(o, "route", json_type_string, COLLECTION);
	expect_json(o, "status", json_type_int, "201");
	expect_json(o, "tenant", json_type_int, tenant);
	expect_json(o, "idem", json_type_string, "created");
	expect_json(o, "key_fp", json_type_string, fp);
	expect_json(o, "duration_ms", json_type_double, NULL);
	expect_json(o, "ts", json_type_string, NULL);
	cr_assert_null(strstr(text, key), "the raw Idempotency-Key is in the log");
	cr_assert_null(strstr(text, t.token), "a bearer token is in the log");
	json_object_put(o);
	free(text);
	http_response_free(r);
}

/* pid=N of every line with msg="log file reopened". */
static size_t reopened_pids(const char *text, long *pids, size_t max)
{
	size_t n = 0;

	for (const char *p = strstr(text, "msg=\"log file reopened\""); p;
	     p = strstr(p + 1, "msg=\"log file reopened\"")) {
		const char *line = p;
		while (line > text && line[-1] != '\n')
			line--;
		const char *pid = strstr(line, " pid=");
		cr_assert(pid && pid < p, "no pid before msg in: %.200s", line);
		if (n < max)
			pids[n++] = strtol(pid + 5, NULL, 10);
	}
	return n;
}

Test(logs, sigusr1_reopens_the_log_in_the_supervisor_and_every_worker, .fini = own_stop)
{
	char logfile[512], rotated[600], key[128], fp[13], want[64];
	const char *opts[] = { "--workers", "4", "--log-file", logfile, NULL };
	pid_t workers[MAX_WORKERS];
	long pids[16];
	struct tstack_tenant t;
	struct http_response *r;
	struct stat before, after;
	size_t n = 0, nworkers;
	char *text = NULL;
	double deadline;

	stack_path(logfile, sizeof(logfile), "rotate.log");
	snprintf(rotated, sizeof(rotated), "%s.1", logfile);
	own_start(opts, WORKERS);
	tstack_tenant_create(&t, "rotate");
	nworkers = tstack_workers(own.pid, workers, MAX_WORKERS);
	cr_assert_eq(nworkers, WORKERS);

	/* What logrotate does: move the file, then signal. */
	cr_assert_eq(rename(logfile, rotated), 0, "rename: %s", strerror(errno));
	cr_assert_eq(kill(own.pid, SIGUSR1), 0);
	deadline = tstack_now() + 5;
	while (n < 1 + WORKERS) {
		cr_assert(tstack_now() < deadline,
		          "%zu of %d processes reopened the log within 5s: %s", n, 1 + WORKERS,
		          text ? text : "(no new file)");
		tstack_sleep_ms(50);
		free(text);
		text = access(logfile, F_OK) == 0 ? file_read(logfile) : NULL;
		n = text ? reopened_pids(text, pids, 16) : 0;
	}
	cr_assert_eq(n, 1 + WORKERS, "reopened more than once: %s", text);
	for (size_t i = 0; i < nworkers; i++) {
		int seen = 0;
		for (size_t j = 0; j < n; j++)
			seen |= pids[j] == (long)workers[i];
		cr_assert(seen, "worker %ld did not reopen the log: %s", (long)workers[i], text);
	}
	free(text);

	/* From now on lines go to the new file only. */
	cr_assert_eq(stat(rotated, &before), 0);
	tstack_key(key, sizeof(key), "rotated");
	r = post(&t, key, BODY_A, 201);
	cr_assert_eq(stat(rotated, &after), 0);
	cr_assert_eq(after.st_size, before.st_size, "the old file still grows");
	text = file_read(logfile);
	key_fp(fp, key);
	snprintf(want, sizeof(want), "key_fp=%s", fp);
	cr_assert_not_null(strstr(text, http_header(r, "X-Request-Id")),
	                   "the request's line is not in the new file: %s", text);
	cr_assert_not_null(strstr(text, want), "no %s in the new file: %s", want, text);
	cr_assert_not_null(strstr(text, " route=/v1/workflows "), "no route in: %s", text);
	free(text);
	http_response_free(r);
}

/* --- The replay cache -------------------------------------------------------- */

/* Occurrences of needle in text. */
static int occurrences(const char *text, const char *needle)
{
	int n = 0;

	for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle))
		n++;
	return n;
}

/* The same status, headers (but the request's own X-Request-Id) and body. */
static void expect_same_answer(const struct http_response *r, const struct http_response *want)
{
	cr_assert_eq(r->status, want->status);
	cr_assert_eq(r->header_count, want->header_count, "headers differ in number");
	for (size_t i = 0; i < r->header_count; i++) {
		cr_assert_str_eq(r->headers[i].name, want->headers[i].name);
		if (strcasecmp(r->headers[i].name, "X-Request-Id") != 0)
			cr_assert_str_eq(r->headers[i].value, want->headers[i].value, "%s",
			                 r->headers[i].name);
	}
	cr_assert_eq(r->body_len, want->body_len);
	cr_assert_eq(memcmp(r->body, want->body, r->body_len), 0, "%s vs %s", r->body, want->body);
}

#define HITS    "idemflow_replay_cache_hits_total"
#define REPLAYS "idemflow_idempotency_replays_total{route=\"/v1/workflows\"}"

/*
 * One worker, a cache window longer than the test: the first replay asks
 * the database and the worker keeps the row; every later retry with that
 * token is answered from it, byte for byte as the first replay, a reuse
 * with another body is refused from it, and each hit is counted and
 * logged. Another token of the same tenant is not served from it.
 */
Test(replay_cache, retries_with_the_same_token_are_answered_from_memory, .fini = own_stop)
{
	char logfile[512], key[128], *before, *after, *text;
	const char *opts[] = { "--workers", "1", "--replay-cache-ttl", "60s", "--log-file",
		               logfile,     NULL };
	struct tstack_tenant t;
	struct http_response *first, *replay, *r;

	stack_path(logfile, sizeof(logfile), "rcache.log");
	own_start(opts, 1);
	tstack_tenant_create(&t, "rcache");
	tstack_key(key, sizeof(key), "rcache");
	first = post(&t, key, BODY_A, 201);
	before = scrape();
	replay = post(&t, key, BODY_A, 201);
	tstack_expect_header(replay, "Idempotent-Replayed", "true");
	cr_assert_str_eq(replay->body, first->body);
	for (int i = 0; i < 4; i++) {
		r = post(&t, key, BODY_A, 201);
		expect_same_answer(r, replay);
		http_response_free(r);
	}
	r = post(&t, key, BODY_B, 409);
	tstack_expect_problem(r, 409, "/problems/idempotency-key-reused", COLLECTION);
	http_response_free(r);
	after = scrape();
	expect_delta(before, after, REPLAYS, 5);
	expect_delta(before, after, HITS, 5);

	/* Another token asks the database once, then holds its own entry. */
	tstack_tenant_retoken(&t);
	http_response_free(post(&t, key, BODY_A, 201));
	http_response_free(post(&t, key, BODY_A, 201));
	free(before);
	before = after;
	after = scrape();
	expect_delta(before, after, HITS, 1);
	cr_assert_eq(tstack_count("SELECT count(*) FROM workflows WHERE tenant_id = $1", t.id_text),
	             1);

	text = file_read(logfile);
	cr_assert_eq(occurrences(text, " cache=hit"), 6, "request lines with cache=hit:\n%s", text);
	free(text);
	free(before);
	free(after);
	http_response_free(first);
	http_response_free(replay);
}

/* replay_cache_ttl = 0: every replay asks the database. */
Test(replay_cache, a_ttl_of_zero_turns_it_off, .fini = own_stop)
{
	const char *opts[] = { "--workers", "1", "--replay-cache-ttl", "0", NULL };
	struct tstack_tenant t;
	char key[128], *before, *after;

	own_start(opts, 1);
	tstack_tenant_create(&t, "rcache-off");
	tstack_key(key, sizeof(key), "rcache-off");
	http_response_free(post(&t, key, BODY_A, 201));
	before = scrape();
	for (int i = 0; i < 4; i++)
		http_response_free(post(&t, key, BODY_A, 201));
	after = scrape();
	expect_delta(before, after, REPLAYS, 4);
	expect_delta(before, after, HITS, 0);
	free(before);
	free(after);
}

/*
 * An entry never outlives its key: with a key TTL of 1 s and a cache window
 * of 60 s, the same request after the key expired creates anew instead of
 * replaying what the worker held.
 */
Test(replay_cache, an_entry_ends_when_its_key_expires, .fini = own_stop)
{
	const char *opts[] = { "--workers", "1", "--replay-cache-ttl", "60s", NULL };
	struct tstack_tenant t;
	struct http_response *first, *r;
	char key[128], out[256], *before, *after;
	double t0;
	int rc;

	own_start(opts, 1);
	tstack_tenant_create(&t, "rcache-exp");
	/* Below the floor of the default waits; 1 s is the floor of these. */
	rc = tstack_cli(out, sizeof(out), "--idempotency-wait", "100ms", "--statement-timeout", "0",
	                "--idempotency-ttl", "1s", "tenant", "set-ttl", t.name, "1s", NULL);
	cr_assert_eq(rc, 0, "tenant set-ttl exited %d: %s", rc, tstack_cli_stderr());
	tstack_key(key, sizeof(key), "rcache-exp");
	t0 = tstack_now();
	first = post(&t, key, BODY_A, 201);
	before = scrape();
	http_response_free(post(&t, key, BODY_A, 201));
	r = post(&t, key, BODY_A, 201);
	after = scrape();
	cr_assert(tstack_now() - t0 < 0.9, "the replays took too long to test the expiry");
	tstack_expect_header(r, "Idempotent-Replayed", "true");
	expect_delta(before, after, HITS, 1);
	http_response_free(r);

	tstack_sleep_ms((long)((t0 + 1.2 - tstack_now()) * 1000));
	r = post(&t, key, BODY_A, 201);
	cr_assert_null(http_header(r, "Idempotent-Replayed"), "the expired key was replayed");
	cr_assert_str_neq(r->body, first->body, "the expired key kept its first workflow");
	cr_assert_eq(tstack_count("SELECT count(*) FROM workflows WHERE tenant_id = $1", t.id_text),
	             2);
	http_response_free(r);
	http_response_free(first);
	free(before);
	free(after);
}

/* --- The dispatcher's textfile ---------------------------------------------- */

/* Run idemflow-dispatch --once with args; returns its exit status. */
static int dispatch(const char *textfile, const char *db, const char *exec, const char *attempts)
{
	char log[512];
	const char *argv[] = { tstack_env("IDEMFLOW_DISPATCH"),
		               "--db",
		               db,
		               "--once",
		               "--sink",
		               "exec",
		               "--exec",
		               exec,
		               "--max-attempts",
		               attempts,
		               "--textfile",
		               textfile,
		               NULL };
	int status;
	pid_t pid;

	stack_path(log, sizeof(log), "dispatch.log");
	pid = tstack_spawn(argv, log);
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status), "dispatcher died: 0x%x", status);
	return WEXITSTATUS(status);
}

static void create_events(const struct tstack_tenant *t, int n)
{
	for (int i = 0; i < n; i++) {
		char key[128];
		tstack_key(key, sizeof(key), "event");
		http_response_free(post(t, key, BODY_A, 201));
	}
}

Test(textfile, each_run_writes_its_counters_for_the_node_exporter, .fini = own_stop)
{
	char textfile[512], stray[600];
	struct tstack_tenant t;
	char *text;
	double now = (double)time(NULL);

	own_database();
	own_start((const char *const[]){ "--workers", "1", NULL }, 1);
	tstack_tenant_create(&t, "textfile");
	stack_path(textfile, sizeof(textfile), "dispatch.prom");

	/* Three events, all delivered. */
	create_events(&t, 3);
	double t0 = tstack_now();
	cr_assert_eq(dispatch(textfile, tstack_env("DATABASE_URL"), "exit 0", "8"), 0);
	double took = tstack_now() - t0;
	text = file_read(textfile);
	cr_assert_eq(sample(text, "idemflow_dispatch_last_run_success"), 1);
	cr_assert_eq(sample(text, "idemflow_dispatch_last_run_claimed"), 3);
	cr_assert_eq(sample(text, "idemflow_dispatch_last_run_published"), 3);
	cr_assert_eq(sample(text, "idemflow_dispatch_last_run_retried"), 0);
	cr_assert_eq(sample(text, "idemflow_dispatch_last_run_dead"), 0);
	cr_assert_eq(sample(text, "idemflow_dispatch_outbox_pending"), 0);
	cr_assert_eq(sample(text, "idemflow_dispatch_outbox_oldest_pending_age_seconds"), 0);
	double ts = sample(text, "idemflow_dispatch_last_run_timestamp_seconds");
	cr_assert(ts >= now - 1 && ts <= (double)time(NULL) + 1, "timestamp %f, started %f", ts,
	          now);
	/* Three deliveries by sh take some milliseconds, and the run no
	 * longer than the dispatcher's whole life. */
	double d = sample(text, "idemflow_dispatch_last_run_duration_seconds");
	cr_assert(d > 0 && d <= took, "last run took %.3f s, the dispatcher %.3f s", d, took);
	cr_assert_not_null(strstr(text, "# TYPE idemflow_dispatch_last_run_published gauge\n"));
	free(text);

	/* Two more that fail on their only attempt: dead. */
	create_events(&t, 2);
	cr_assert_eq(dispatch(textfile, tstack_env("DATABASE_URL"), "exit 1", "1"), 0);
	text = file_read(textfile);
	cr_assert_eq(sample(text, "idemflow_dispatch_last_run_claimed"), 2);
	cr_assert_eq(sample(text, "idemflow_dispatch_last_run_published"), 0);
	cr_assert_eq(sample(text, "idemflow_dispatch_last_run_dead"), 2);
	free(text);

	/* One that fails with attempts to spare: retried, still pending. */
	create_events(&t, 1);
	cr_assert_eq(dispatch(textfile, tstack_env("DATABASE_URL"), "exit 1", "8"), 0);
	text = file_read(textfile);
	cr_assert_eq(sample(text, "idemflow_dispatch_last_run_retried"), 1);
	cr_assert_eq(sample(text, "idemflow_dispatch_outbox_pending"), 1);
	free(text);

	/* A run that cannot reach the database says so, and claims nothing
	 * about the outbox. */
	cr_assert_eq(
	    dispatch(textfile, "host=/nonexistent dbname=x connect_timeout=1", "exit 0", "8"), 75);
	text = file_read(textfile);
	cr_assert_eq(sample(text, "idemflow_dispatch_last_run_success"), 0);
	cr_assert_null(strstr(text, "idemflow_dispatch_outbox_pending"), "%s", text);
	free(text);

	/* Written through a temporary file that is always renamed away. */
	snprintf(stray, sizeof(stray), "%s.*.tmp", textfile);
	glob_t g;
	cr_assert_eq(glob(stray, 0, NULL, &g), GLOB_NOMATCH, "a temporary textfile was left: %s",
	             g.gl_pathc ? g.gl_pathv[0] : "?");
	globfree(&g);
}
