/*
 * End-to-end tests of job heartbeats (POST /v1/jobs/{key}/heartbeat)
 * through nginx and the worker pool: a heartbeat extends the lease of the
 * worker's activation with the compare-and-set of complete and fail, keeps
 * the job away from other workers until the new deadline, reports
 * progress that the workflow shows, is refused (409) to a stale worker,
 * after the lease ran out, after a completion and once the workflow was
 * cancelled, and converges with a completion that races it.
 *
 * Every test works in a tenant of its own. Times are the database's:
 * the test waits for the database's clock to pass a deadline the server
 * answered, never for a fixed sleep.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "http.h"
#include "tapi.h"
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

/*
 * Settings of its own (TSTACK_SETTINGS): idempotency_wait, which is also
 * every worker's lock_timeout, is 10 s, not the harness's 1 s, a window
 * too short on a loaded machine: heartbeats and reapers wait on one job's row.
 */
TSTACK_SETTINGS("idempotency_wait = 10s\n")

TestSuite(heartbeat, .timeout = 90);

/* --- Helpers ----------------------------------------------------------- */

static struct http_response *activate(const struct tstack_tenant *t, const char *type,
                                      const char *worker, int lease)
{
	char body[256];

	snprintf(body, sizeof(body), "{\"job_type\":\"%s\",\"worker\":\"%s\",\"lease_seconds\":%d}",
	         type, worker, lease);
	return tstack_post(t, "/v1/jobs/activate", NULL, body);
}

/* Activate and expect exactly one job, of workflow wf; its deadline
 * (malloc'ed). */
static char *activate_one(const struct tstack_tenant *t, const char *type, const char *worker,
                          int lease, const char *wf)
{
	struct http_response *r = activate(t, type, worker, lease);
	char *n, *got, *deadline;

	tstack_expect_status(r, 200);
	n = tstack_text("SELECT jsonb_array_length($1::jsonb -> 'jobs')::text", r->body);
	cr_assert_str_eq(n, "1", "activation: %s", r->body);
	got = tstack_json(r->body, "{jobs,0,workflow_id}");
	cr_assert_str_eq(got, wf);
	deadline = tstack_json(r->body, "{jobs,0,deadline}");
	free(n);
	free(got);
	http_response_free(r);
	return deadline;
}

static void expect_no_job(const struct tstack_tenant *t, const char *type, const char *worker)
{
	struct http_response *r = activate(t, type, worker, 30);

	tstack_expect_status(r, 200);
	cr_assert_str_eq(r->body, "{\"jobs\":[]}", "the job was handed out again");
	http_response_free(r);
}

static void job_path(char *out, size_t size, const char *wf, const char *verb)
{
	snprintf(out, size, "/v1/jobs/%s.s1/%s", wf, verb);
}

static struct http_response *heartbeat(const struct tstack_tenant *t, const char *wf,
                                       const char *key, const char *body)
{
	char path[160];

	job_path(path, sizeof(path), wf, "heartbeat");
	return tstack_post(t, path, key, body);
}

static struct http_response *complete(const struct tstack_tenant *t, const char *wf,
                                      const char *worker)
{
	char path[160], body[160];

	job_path(path, sizeof(path), wf, "complete");
	snprintf(body, sizeof(body), "{\"worker\":\"%s\",\"output\":{\"by\":\"%s\"}}", worker,
	         worker);
	return tstack_post(t, path, NULL, body);
}

/* Poll until the database's clock is past ts (an answered deadline). */
static void wait_past(const char *ts)
{
	double deadline = tstack_now() + 30;

	while (tstack_count("SELECT count(*) FROM (SELECT 1) x WHERE now() > $1::timestamptz",
	                    ts) == 0) {
		cr_assert(tstack_now() < deadline, "the database's clock never passed %s", ts);
		tstack_sleep_ms(50);
	}
}

/* The member at path of r's body (malloc'ed), the test failing without it. */
static char *member(const struct http_response *r, const char *path)
{
	char *v = tstack_json(r->body, path);

	cr_assert_not_null(v, "no %s in %s", path, r->body);
	return v;
}

/* Everything the tenant has written, to prove a refusal changed nothing. */
static char *tenant_snapshot(const struct tstack_tenant *t)
{
	return tstack_text(
	    "SELECT (SELECT coalesce(string_agg(state || last_seq, ',' ORDER BY id), '')"
	    "          FROM workflows WHERE tenant_id = $1) || '/' ||"
	    "       (SELECT count(*) FROM outbox WHERE tenant_id = $1) || '/' ||"
	    "       (SELECT coalesce(string_agg(state || coalesce(worker, '-') || activations"
	    "                                   || coalesce(due_at::text, '-')"
	    "                                   || coalesce(progress, '-'), ','"
	    "                                   ORDER BY workflow_id, step), '')"
	    "          FROM jobs WHERE tenant_id = $1)",
	    t->id_text);
}

static const char ONE_JOB[] =
    "{\"type\":\"hb\",\"steps\":[{\"name\":\"long\",\"job_type\":\"%s\"}]}";

static char *create_one_job(const struct tstack_tenant *t, const char *type)
{
	char body[256];

	snprintf(body, sizeof(body), ONE_JOB, type);
	return tstack_create(t, body);
}

/* --- The lease --------------------------------------------------------- */

Test(heartbeat, extends_the_lease_keeps_the_job_from_others_and_refuses_the_stale_worker)
{
	struct tstack_tenant t;
	struct http_response *r;
	char path[160], *wf, *d1, *d2, *d3, *v, *before, *after;

	tstack_tenant_create(&t, "hb-lease");
	wf = create_one_job(&t, "long");
	d1 = activate_one(&t, "long", "w1", 1, wf);

	/* The lease now runs 30 s from now, and the progress is kept. */
	r = heartbeat(
	    &t, wf, NULL,
	    "{\"worker\":\"w1\",\"lease_seconds\":30,\"progress\":{\"done\":1,\"of\":3}}");
	tstack_expect_status(r, 200);
	d2 = member(r, "{deadline}");
	cr_assert(strcmp(d2, d1) > 0, "deadline %s is not after %s", d2, d1);
	v = member(r, "{progress}");
	cr_assert_str_eq(v, "{\"of\": 3, \"done\": 1}");
	free(v);
	v = member(r, "{state}");
	cr_assert_str_eq(v, "active");
	free(v);
	cr_assert_not_null(strstr(r->body, ",\"progress\":{\"done\":1,\"of\":3}}"), "%s", r->body);
	http_response_free(r);
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1"
	                          " AND due_at > now() + interval '20 seconds'"
	                          " AND heartbeat_at IS NOT NULL",
	                          wf),
	             1);

	/* Past the first deadline, nobody else gets the job, not even after
	 * a reap. */
	wait_past(d1);
	expect_no_job(&t, "long", "w2");
	tstack_exec(tstack_db(), "SELECT idemflow_reap(1000)");
	expect_no_job(&t, "long", "w2");

	/* The workflow shows the progress of its current step's job. */
	snprintf(path, sizeof(path), "/v1/workflows/%s", wf);
	r = tstack_get(&t, path);
	tstack_expect_status(r, 200);
	cr_assert_not_null(strstr(r->body, ",\"step\":1,\"progress\":{\"done\":1,\"of\":3}}"), "%s",
	                   r->body);
	http_response_free(r);

	/* Without "progress" the last one stays. A lease of 1 s: it runs
	 * from now, so this shortens it. */
	r = heartbeat(&t, wf, NULL, "{\"worker\":\"w1\",\"lease_seconds\":1}");
	tstack_expect_status(r, 200);
	d3 = member(r, "{deadline}");
	cr_assert(strcmp(d3, d2) < 0, "deadline %s is not before %s", d3, d2);
	v = member(r, "{progress,done}");
	cr_assert_str_eq(v, "1");
	free(v);
	http_response_free(r);

	/* The lease ran out: the late heartbeat is refused and changes
	 * nothing. */
	wait_past(d3);
	job_path(path, sizeof(path), wf, "heartbeat");
	before = tenant_snapshot(&t);
	r = heartbeat(&t, wf, NULL, "{\"worker\":\"w1\",\"progress\":{\"done\":2,\"of\":3}}");
	tstack_expect_problem(r, 409, "/problems/lease-expired", path);
	http_response_free(r);
	after = tenant_snapshot(&t);
	cr_assert_str_eq(after, before, "a refused heartbeat changed something");
	free(after);
	free(before);

	/* Another worker has it now: the stale one is refused. */
	free(activate_one(&t, "long", "w2", 30, wf));
	before = tenant_snapshot(&t);
	r = heartbeat(&t, wf, NULL, "{\"worker\":\"w1\"}");
	tstack_expect_problem(r, 409, "/problems/not-lease-holder", path);
	http_response_free(r);
	after = tenant_snapshot(&t);
	cr_assert_str_eq(after, before, "a stale worker's heartbeat changed something");
	free(after);
	free(before);
	r = heartbeat(&t, wf, NULL, "{\"worker\":\"w2\",\"progress\":{\"done\":3,\"of\":3}}");
	tstack_expect_status(r, 200);
	v = member(r, "{activations}");
	cr_assert_str_eq(v, "2");
	free(v);
	http_response_free(r);

	/* After the completion a heartbeat is refused: the worker stops. */
	r = complete(&t, wf, "w2");
	tstack_expect_status(r, 200);
	http_response_free(r);
	r = heartbeat(&t, wf, NULL, "{\"worker\":\"w2\"}");
	tstack_expect_problem(r, 409, "/problems/job-not-active", path);
	http_response_free(r);

	/* A heartbeat writes no event: created, started, completed twice. */
	v = tstack_text("SELECT string_agg(type, ' ' ORDER BY seq) FROM outbox"
	                " WHERE tenant_id = $1 AND workflow_id = $2",
	                t.id_text, wf);
	cr_assert_str_eq(v, "workflow.created workflow.started job.completed workflow.completed");
	free(v);
	free(d1);
	free(d2);
	free(d3);
	free(wf);
}

Test(heartbeat, a_cancelled_workflow_tells_its_worker_to_stop)
{
	struct tstack_tenant t;
	struct http_response *r;
	char path[160], tpath[160], *wf, *v;

	tstack_tenant_create(&t, "hb-cancel");
	wf = create_one_job(&t, "cx");
	free(activate_one(&t, "cx", "w", 30, wf));
	snprintf(tpath, sizeof(tpath), "/v1/workflows/%s/transitions", wf);
	r = tstack_post(&t, tpath, NULL, "{\"to\":\"cancelled\"}");
	tstack_expect_status(r, 200);
	http_response_free(r);

	job_path(path, sizeof(path), wf, "heartbeat");
	r = heartbeat(&t, wf, NULL, "{\"worker\":\"w\",\"progress\":{\"n\":1}}");
	tstack_expect_problem(r, 409, "/problems/job-not-active", path);
	v = member(r, "{detail}");
	cr_assert_str_eq(v, "the workflow was cancelled and its job with it: stop working on it; "
	                    "nothing was changed");
	free(v);
	http_response_free(r);
	/* As complete and fail answer it. */
	job_path(path, sizeof(path), wf, "complete");
	r = complete(&t, wf, "w");
	tstack_expect_problem(r, 409, "/problems/job-not-active", path);
	http_response_free(r);
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1"
	                          " AND state = 'cancelled' AND progress IS NULL",
	                          wf),
	             1);
	free(wf);
}

/* --- Keys and bad input ------------------------------------------------ */

Test(heartbeat, a_keyed_heartbeat_replays_byte_for_byte_and_extends_once)
{
	struct tstack_tenant t;
	struct http_response *a, *b, *c;
	char key[96], *wf, *deadline, *due;

	tstack_tenant_create(&t, "hb-key");
	wf = create_one_job(&t, "k");
	free(activate_one(&t, "k", "w", 30, wf));
	tstack_key(key, sizeof(key), "hb");
	a = heartbeat(&t, wf, key,
	              "{\"worker\":\"w\",\"lease_seconds\":600,\"progress\":{\"p\":1}}");
	tstack_expect_status(a, 200);
	deadline = member(a, "{deadline}");
	tstack_sleep_ms(20); /* a second extension would move the deadline */
	b = heartbeat(&t, wf, key,
	              "{\"progress\":{\"p\":1},\"lease_seconds\":600,\"worker\":\"w\"}");
	tstack_expect_status(b, 200);
	cr_assert_str_eq(b->body, a->body, "the replay is not the stored answer");
	cr_assert_eq(b->body_len, a->body_len);
	tstack_expect_header(b, "Idempotent-Replayed", "true");
	cr_assert_null(http_header(a, "Idempotent-Replayed"));
	due = tstack_text("SELECT to_char(due_at AT TIME ZONE 'UTC',"
	                  " 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') FROM jobs WHERE workflow_id = $1",
	                  wf);
	cr_assert_str_eq(due, deadline, "the replay extended the lease again");

	/* The same key for another heartbeat is the key's conflict. */
	c = heartbeat(&t, wf, key, "{\"worker\":\"w\",\"lease_seconds\":60}");
	{
		char path[160];
		job_path(path, sizeof(path), wf, "heartbeat");
		tstack_expect_problem(c, 409, "/problems/idempotency-key-reused", path);
	}
	http_response_free(a);
	http_response_free(b);
	http_response_free(c);
	free(due);
	free(deadline);
	free(wf);
}

Test(heartbeat, bad_heartbeats_get_a_precise_problem_and_change_nothing)
{
	struct tstack_tenant t, other;
	struct http_response *r;
	char *wf, *before, *after, path[160], *v;
	char big[6000];
	size_t off;

	tstack_tenant_create(&t, "hb-bad");
	tstack_tenant_create(&other, "hb-other");
	wf = create_one_job(&t, "bad");
	free(activate_one(&t, "bad", "w", 30, wf));
	before = tenant_snapshot(&t);
	job_path(path, sizeof(path), wf, "heartbeat");

	/* progress is kept small: over 4096 bytes in canonical form is 413. */
	off = (size_t)snprintf(big, sizeof(big), "{\"worker\":\"w\",\"progress\":{\"log\":\"");
	memset(big + off, 'x', 4090);
	off += 4090;
	snprintf(big + off, sizeof(big) - off, "\"}}");
	r = heartbeat(&t, wf, NULL, big);
	tstack_expect_problem(r, 413, "/problems/body-too-large", path);
	v = member(r, "{detail}");
	cr_assert_str_eq(v, "\"progress\" is 4100 bytes in canonical JSON; at most 4096 are kept: "
	                    "report counters and a short message, not results");
	free(v);
	http_response_free(r);
	/* 4096 exactly is kept. */
	off = (size_t)snprintf(big, sizeof(big), "{\"worker\":\"w\",\"progress\":{\"log\":\"");
	memset(big + off, 'y', 4086);
	off += 4086;
	snprintf(big + off, sizeof(big) - off, "\"}}");
	r = heartbeat(&t, wf, NULL, big);
	tstack_expect_status(r, 200);
	http_response_free(r);
	cr_assert_eq(
	    tstack_count("SELECT octet_length(progress) FROM jobs WHERE workflow_id = $1", wf),
	    4096);
	free(before);
	before = tenant_snapshot(&t);

	static const struct {
		const char *body;
		int status;
		const char *type;
	} cases[] = {
		{ "{\"worker\":\"w\",\"lease_seconds\":0}", 422, "/problems/invalid-request" },
		{ "{\"worker\":\"w\",\"lease_seconds\":86401}", 422, "/problems/invalid-request" },
		{ "{\"worker\":\"w\",\"progress\":[1]}", 422, "/problems/invalid-request" },
		{ "{\"worker\":\"w\",\"progress\":\"half\"}", 422, "/problems/invalid-request" },
		{ "{\"lease_seconds\":10}", 422, "/problems/invalid-request" },
		{ "{\"worker\":\"w\",\"output\":{}}", 422, "/problems/invalid-request" },
		{ "{\"worker\":", 400, "/problems/invalid-json" },
		{ "{\"worker\":\"intruder\"}", 409, "/problems/not-lease-holder" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		r = heartbeat(&t, wf, NULL, cases[i].body);
		tstack_expect_problem(r, cases[i].status, cases[i].type, path);
		http_response_free(r);
	}

	/* No such job; another tenant's job looks the same. */
	r = tstack_post(&t, "/v1/jobs/nonsense/heartbeat", NULL, "{\"worker\":\"w\"}");
	tstack_expect_problem(r, 404, "/problems/not-found", "/v1/jobs/nonsense/heartbeat");
	http_response_free(r);
	snprintf(path, sizeof(path), "/v1/jobs/%s.s2/heartbeat", wf);
	r = tstack_post(&t, path, NULL, "{\"worker\":\"w\"}");
	tstack_expect_problem(r, 404, "/problems/not-found", path);
	http_response_free(r);
	job_path(path, sizeof(path), wf, "heartbeat");
	r = heartbeat(&other, wf, NULL, "{\"worker\":\"w\",\"progress\":{\"x\":1}}");
	tstack_expect_problem(r, 404, "/problems/not-found", path);
	http_response_free(r);
	r = tstack_get(&t, path);
	tstack_expect_problem(r, 405, "/problems/method-not-allowed", path);
	tstack_expect_header(r, "Allow", "POST");
	http_response_free(r);

	after = tenant_snapshot(&t);
	cr_assert_str_eq(after, before, "a refused heartbeat changed something");
	free(after);
	free(before);
	free(wf);
}

/* --- Racing a completion ----------------------------------------------- */

#define RACE_ROUNDS 12

struct racer {
	const struct tstack_tenant *t;
	char path[160];
	const char *body;
	pthread_barrier_t *start;
	struct http_response *resp;
};

static void *racer_run(void *arg)
{
	struct racer *s = arg;

	pthread_barrier_wait(s->start);
	s->resp = tstack_post_raw(s->t, s->path, NULL, s->body);
	return NULL;
}

/*
 * Two heartbeats and the completion of one job, sent at once, many times:
 * the workflow's row lock serializes them, so every interleaving ends the
 * same way. The completion succeeds once; a heartbeat either came first
 * (200, the job still active) or after it (409 job-not-active); one
 * job.completed event.
 */
Test(heartbeat, two_heartbeats_racing_a_completion_converge)
{
	struct tstack_tenant t;
	int before_done = 0, after_done = 0;

	tstack_tenant_create(&t, "hb-race");
	for (int round = 0; round < RACE_ROUNDS; round++) {
		struct racer s[3];
		pthread_t th[3];
		pthread_barrier_t start;
		char *wf = create_one_job(&t, "race");
		char *v;

		free(activate_one(&t, "race", "w", 60, wf));
		cr_assert_eq(pthread_barrier_init(&start, NULL, 3), 0);
		for (int i = 0; i < 3; i++) {
			s[i] = (struct racer){ .t = &t, .start = &start };
			job_path(s[i].path, sizeof(s[i].path), wf,
			         i < 2 ? "heartbeat" : "complete");
			s[i].body = i == 0   ? "{\"worker\":\"w\",\"progress\":{\"beat\":1}}"
			            : i == 1 ? "{\"worker\":\"w\",\"lease_seconds\":120}"
			                     : "{\"worker\":\"w\",\"output\":{\"ok\":true}}";
			cr_assert_eq(pthread_create(&th[i], NULL, racer_run, &s[i]), 0);
		}
		for (int i = 0; i < 3; i++)
			pthread_join(th[i], NULL);
		pthread_barrier_destroy(&start);
		for (int i = 0; i < 3; i++)
			cr_assert_not_null(s[i].resp, "round %d request %d: %s", round, i,
			                   http_error());
		tstack_expect_status(s[2].resp, 200);
		v = member(s[2].resp, "{state}");
		cr_assert_str_eq(v, "completed");
		free(v);
		for (int i = 0; i < 2; i++) {
			if (s[i].resp->status == 200) {
				v = member(s[i].resp, "{state}");
				cr_assert_str_eq(v, "active", "round %d", round);
				free(v);
				before_done++;
			} else {
				tstack_expect_problem(s[i].resp, 409, "/problems/job-not-active",
				                      s[i].path);
				after_done++;
			}
		}
		cr_assert_eq(tstack_count("SELECT count(*) FROM outbox WHERE workflow_id = $1"
		                          " AND type = 'job.completed'",
		                          wf),
		             1, "round %d", round);
		v = tstack_text("SELECT state || ' ' || output FROM jobs WHERE workflow_id = $1",
		                wf);
		cr_assert_str_eq(v, "completed {\"ok\":true}", "round %d", round);
		free(v);
		v = tstack_text("SELECT state FROM workflows WHERE id = $1", wf);
		cr_assert_str_eq(v, "completed");
		free(v);
		/* Whatever the order was, a heartbeat now is refused. */
		struct http_response *r = heartbeat(&t, wf, NULL, "{\"worker\":\"w\"}");
		tstack_expect_problem(r, 409, "/problems/job-not-active", s[0].path);
		http_response_free(r);
		for (int i = 0; i < 3; i++)
			http_response_free(s[i].resp);
		free(wf);
	}
	cr_log_info("heartbeats before the completion: %d, after it: %d", before_done, after_done);
	cr_assert_eq(before_done + after_done, 2 * RACE_ROUNDS);
}
