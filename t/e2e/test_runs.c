/*
 * End-to-end tests of workflows that run: steps executed by external
 * workers under leases, compare-and-set completions and transitions,
 * business keys, deduplicated messages and the event history, through
 * nginx and the worker pool against the real database.
 *
 * Every test works in a tenant of its own, so job types, business keys and
 * message ids never meet another test's.
 */
#include <errno.h>
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
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

/*
 * Settings of its own (TSTACK_SETTINGS): idempotency_wait, which is also
 * every worker's lock_timeout, is 10 s, not the harness's 1 s, a window
 * too short on a loaded machine: concurrent deliveries, creates and activations wait on
 * one another's row locks.
 */
TSTACK_SETTINGS("idempotency_wait = 10s\n")

TestSuite(steps, .timeout = 90);
TestSuite(lease, .timeout = 60);
TestSuite(retries, .timeout = 60);
TestSuite(messages, .timeout = 60);
TestSuite(business_key, .timeout = 60);
TestSuite(transitions, .timeout = 90);
TestSuite(reap, .timeout = 60);
TestSuite(history, .timeout = 60);
TestSuite(bad_input, .timeout = 60);
TestSuite(keyed_commands, .timeout = 60);

/* --- Helpers ----------------------------------------------------------- */

/* POST /v1/jobs/activate for one job of type; returns the response. */
static struct http_response *activate(const struct tstack_tenant *t, const char *type,
                                      const char *worker, int max, int lease)
{
	char body[256];

	snprintf(body, sizeof(body),
	         "{\"job_type\":\"%s\",\"worker\":\"%s\",\"max_jobs\":%d,\"lease_seconds\":%d}",
	         type, worker, max, lease);
	return tstack_post(t, "/v1/jobs/activate", NULL, body);
}

/* Activate and expect exactly one job, of workflow wf (when not NULL). */
static void activate_one(const struct tstack_tenant *t, const char *type, const char *worker,
                         int lease, const char *wf)
{
	struct http_response *r = activate(t, type, worker, 1, lease);
	char *n, *got;

	tstack_expect_status(r, 200);
	n = tstack_text("SELECT jsonb_array_length($1::jsonb -> 'jobs')::text", r->body);
	cr_assert_str_eq(n, "1", "activation: %s", r->body);
	if (wf != NULL) {
		got = tstack_json(r->body, "{jobs,0,workflow_id}");
		cr_assert_str_eq(got, wf);
		free(got);
	}
	free(n);
	http_response_free(r);
}

static struct http_response *finish(const struct tstack_tenant *t, const char *wf, int step,
                                    const char *verb, const char *key, const char *body)
{
	char path[160];

	snprintf(path, sizeof(path), "/v1/jobs/%s.s%d/%s", wf, step, verb);
	return tstack_post(t, path, key, body);
}

static struct http_response *complete(const struct tstack_tenant *t, const char *wf, int step,
                                      const char *worker)
{
	char body[160];

	snprintf(body, sizeof(body), "{\"worker\":\"%s\",\"output\":{\"by\":\"%s\"}}", worker,
	         worker);
	return finish(t, wf, step, "complete", NULL, body);
}

static long events(const struct tstack_tenant *t, const char *wf, const char *type)
{
	return tstack_count("SELECT count(*) FROM outbox WHERE tenant_id = $1 AND workflow_id = $2"
	                    " AND type = $3",
	                    t->id_text, wf, type);
}

static char *wf_state(const char *wf)
{
	return tstack_text("SELECT state FROM workflows WHERE id = $1", wf);
}

static void expect_state(const char *wf, const char *want)
{
	char *s = wf_state(wf);

	cr_assert_str_eq(s, want, "workflow %s", wf);
	free(s);
}

/* Everything a tenant has written, as one string, to prove that a refused
 * request changed nothing. */
static char *tenant_snapshot(const struct tstack_tenant *t)
{
	return tstack_text(
	    "SELECT (SELECT count(*) FROM workflows WHERE tenant_id = $1) || '/' ||"
	    "       (SELECT coalesce(string_agg(state || last_seq, ',' ORDER BY id), '')"
	    "          FROM workflows WHERE tenant_id = $1) || '/' ||"
	    "       (SELECT count(*) FROM outbox WHERE tenant_id = $1) || '/' ||"
	    "       (SELECT coalesce(string_agg(state || coalesce(worker, '-') || activations"
	    "                                   || retries, ',' ORDER BY workflow_id, step), '')"
	    "          FROM jobs WHERE tenant_id = $1) || '/' ||"
	    "       (SELECT count(*) FROM messages WHERE tenant_id = $1) || '/' ||"
	    "       (SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1)",
	    t->id_text);
}

/* --- Steps ------------------------------------------------------------- */

#define STEP_WORKFLOWS 4
#define STEP_TYPES     3

/*
 * A worker process: activates jobs of the three types in turn, logs
 * "<name> <key>\n" to fd for every job it executes, completes it. Runs
 * until killed. No assertions: it is a child.
 */
static void worker_loop(const struct tstack_tenant *t, const char *name, int fd)
{
	static const char *const types[STEP_TYPES] = { "reserve", "charge", "ship" };

	for (;;) {
		for (int i = 0; i < STEP_TYPES; i++) {
			char body[200], key[128], path[200];
			struct http_response *r;
			const char *k;

			snprintf(body, sizeof(body),
			         "{\"job_type\":\"%s\",\"worker\":\"%s\",\"lease_seconds\":30}",
			         types[i], name);
			r = tstack_post_raw(t, "/v1/jobs/activate", NULL, body);
			k = r != NULL ? strstr(r->body, "\"key\":\"") : NULL;
			if (k == NULL) {
				http_response_free(r);
				continue;
			}
			k += 7;
			snprintf(key, sizeof(key), "%.*s", (int)strcspn(k, "\""), k);
			http_response_free(r);
			char line[200];
			int n = snprintf(line, sizeof(line), "%s %s\n", name, key);
			if (write(fd, line, (size_t)n) != n)
				_exit(3);
			snprintf(path, sizeof(path), "/v1/jobs/%s/complete", key);
			snprintf(body, sizeof(body), "{\"worker\":\"%s\",\"output\":{}}", name);
			http_response_free(tstack_post_raw(t, path, NULL, body));
		}
	}
}

/*
 * An activation's answer is bounded as a page is: six jobs whose workflow
 * inputs are 900 KB each would make an answer of 5.4 MB (and 100 such jobs
 * one of 90 MB, stored under the key). It stops before the job that would
 * pass max_answer (4 MiB), says "truncated", and the jobs left out are
 * untouched: still activatable, never activated, handed out by the next
 * call.
 */
Test(steps, an_activation_stops_before_max_answer_and_leaves_the_rest_activatable)
{
	enum { BIG = 900 * 1000, N = 6 };
	struct tstack_tenant t;
	struct http_response *r;
	char *body = malloc(BIG + 200), *n;
	size_t cap = (size_t)tstack_conf_long("max_answer", 4L * 1024 * 1024);
	int off, got;

	cr_assert_not_null(body);
	tstack_tenant_create(&t, "actbound");
	off = snprintf(body, BIG + 200,
	               "{\"type\":\"big\",\"steps\":[{\"name\":\"a\",\"job_type\":\"big\"}],"
	               "\"input\":{\"blob\":\"");
	memset(body + off, 'x', BIG);
	snprintf(body + off + BIG, 200, "\"}}");
	for (int i = 0; i < N; i++)
		free(tstack_create(&t, body));
	free(body);

	r = activate(&t, "big", "w1", 100, 60);
	tstack_expect_status(r, 200);
	cr_assert_leq(r->body_len, cap, "an answer of %zu bytes, max_answer %zu", r->body_len, cap);
	n = tstack_text("SELECT jsonb_array_length($1::jsonb -> 'jobs')::text", r->body);
	got = atoi(n);
	free(n);
	/* 4 x ~900 KB fit in 4 MiB, a fifth does not. */
	cr_assert_eq(got, 4, "%d jobs", got);
	n = tstack_text("SELECT ($1::jsonb -> 'truncated')::text", r->body);
	cr_assert_str_eq(n, "true");
	free(n);
	http_response_free(r);
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE tenant_id = $1"
	                          " AND state = 'active' AND worker = 'w1' AND activations = 1",
	                          t.id_text),
	             4);
	cr_assert_eq(
	    tstack_count("SELECT count(*) FROM jobs WHERE tenant_id = $1"
	                 " AND state = 'activatable' AND worker IS NULL AND activations = 0",
	                 t.id_text),
	    N - 4, "the jobs left out were not touched");
	cr_assert_eq(tstack_count("SELECT count(*) FROM workflows WHERE tenant_id = $1"
	                          " AND state = 'pending'",
	                          t.id_text),
	             N - 4);

	r = activate(&t, "big", "w2", 100, 60);
	tstack_expect_status(r, 200);
	n = tstack_text("SELECT jsonb_array_length($1::jsonb -> 'jobs')::text ||"
	                " coalesce(($1::jsonb -> 'truncated')::text, ' whole')",
	                r->body);
	cr_assert_str_eq(n, "2 whole", "the rest, and nothing cut");
	free(n);
	http_response_free(r);
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE tenant_id = $1"
	                          " AND state = 'active' AND worker = 'w2' AND activations = 1",
	                          t.id_text),
	             N - 4);
}

Test(steps, three_steps_driven_by_two_competing_workers_run_each_step_once)
{
	struct tstack_tenant t;
	char *ids[STEP_WORKFLOWS];
	pid_t kids[2];
	int fds[2];
	double deadline;

	tstack_tenant_create(&t, "steps");
	for (int i = 0; i < STEP_WORKFLOWS; i++)
		ids[i] = tstack_create(
		    &t, "{\"type\":\"order\",\"input\":{\"n\":1},\"steps\":["
		        "{\"name\":\"reserve-stock\",\"job_type\":\"reserve\"},"
		        "{\"name\":\"charge-card\",\"job_type\":\"charge\",\"retries\":3},"
		        "{\"name\":\"ship\",\"job_type\":\"ship\"}]}");
	cr_assert_eq(pipe(fds), 0);
	for (int w = 0; w < 2; w++) {
		kids[w] = fork();
		cr_assert_neq(kids[w], -1);
		if (kids[w] == 0) {
			close(fds[0]);
			worker_loop(&t, w == 0 ? "w-1" : "w-2", fds[1]);
			_exit(0);
		}
	}
	close(fds[1]);
	deadline = tstack_now() + 60;
	while (tstack_count("SELECT count(*) FROM workflows WHERE tenant_id = $1"
	                    " AND state = 'completed'",
	                    t.id_text) < STEP_WORKFLOWS &&
	       tstack_now() < deadline)
		tstack_sleep_ms(100);
	for (int w = 0; w < 2; w++) {
		kill(kids[w], SIGKILL);
		waitpid(kids[w], NULL, 0);
	}

	/* The executions the workers logged: each job exactly once. */
	char log[16384];
	size_t len = 0;
	ssize_t n;
	while (len < sizeof(log) - 1 && (n = read(fds[0], log + len, sizeof(log) - 1 - len)) > 0)
		len += (size_t)n;
	log[len] = '\0';
	close(fds[0]);
	/* Competing, not taking turns at being idle: each executed jobs. */
	int by[2] = { 0, 0 };
	for (const char *p = log; *p; p = strchr(p, '\n') + 1) {
		by[0] += strncmp(p, "w-1 ", 4) == 0;
		by[1] += strncmp(p, "w-2 ", 4) == 0;
		if (strchr(p, '\n') == NULL)
			break;
	}
	cr_log_info("jobs executed: w-1 %d, w-2 %d", by[0], by[1]);
	cr_assert(by[0] > 0 && by[1] > 0, "one worker executed every job: w-1 %d, w-2 %d", by[0],
	          by[1]);
	cr_assert_eq(by[0] + by[1], STEP_WORKFLOWS * STEP_TYPES);
	for (int i = 0; i < STEP_WORKFLOWS; i++) {
		expect_state(ids[i], "completed");
		for (int s = 1; s <= STEP_TYPES; s++) {
			char key[128];
			int seen = 0;
			snprintf(key, sizeof(key), "%s.s%d\n", ids[i], s);
			for (const char *p = log; (p = strstr(p, key)) != NULL; p += strlen(key))
				seen++;
			cr_assert_eq(seen, 1, "job %.*s executed %d times", (int)strlen(key) - 1,
			             key, seen);
		}
		cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1"
		                          " AND state = 'completed' AND activations = 1",
		                          ids[i]),
		             STEP_TYPES);
		cr_assert_eq(events(&t, ids[i], "workflow.created"), 1);
		cr_assert_eq(events(&t, ids[i], "workflow.started"), 1);
		cr_assert_eq(events(&t, ids[i], "job.completed"), STEP_TYPES);
		cr_assert_eq(events(&t, ids[i], "workflow.completed"), 1);
		cr_assert_eq(
		    tstack_count("SELECT count(*) FROM outbox WHERE workflow_id = $1", ids[i]),
		    STEP_TYPES + 3);
		free(ids[i]);
	}
}

/* --- Leases ------------------------------------------------------------ */

Test(lease, a_completion_after_the_lease_ran_out_is_refused_and_another_workers_wins)
{
	struct tstack_tenant t;
	struct http_response *r;
	char *wf, *before, *after;

	tstack_tenant_create(&t, "lease");
	wf = tstack_create(&t, "{\"type\":\"l\",\"steps\":[{\"name\":\"a\",\"job_type\":\"slow\"},"
	                       "{\"name\":\"b\",\"job_type\":\"next\"}]}");
	activate_one(&t, "slow", "sleepy", 1, wf);
	tstack_sleep_ms(1300); /* past the 1 s lease */

	/* Nobody took it yet: the late worker is told its lease ran out. */
	char path[160];
	snprintf(path, sizeof(path), "/v1/jobs/%s.s1/complete", wf);
	before = tenant_snapshot(&t);
	r = complete(&t, wf, 1, "sleepy");
	tstack_expect_problem(r, 409, "/problems/lease-expired", path);
	http_response_free(r);
	after = tenant_snapshot(&t);
	cr_assert_str_eq(after, before, "a refused completion changed something");
	free(after);

	/* Another worker gets the job again, with the same key. */
	activate_one(&t, "slow", "fresh", 30, wf);
	r = complete(&t, wf, 1, "sleepy");
	tstack_expect_problem(r, 409, "/problems/not-lease-holder", path);
	http_response_free(r);
	r = complete(&t, wf, 1, "fresh");
	tstack_expect_status(r, 200);
	char *v = tstack_json(r->body, "{worker}");
	cr_assert_str_eq(v, "fresh");
	free(v);
	v = tstack_json(r->body, "{activations}");
	cr_assert_str_eq(v, "2");
	free(v);
	http_response_free(r);

	/* The second step is activatable once, the first completed once. */
	cr_assert_eq(events(&t, wf, "job.completed"), 1);
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1 AND step = 2"
	                          " AND state = 'activatable'",
	                          wf),
	             1);
	free(before);
	free(wf);
}

Test(lease, a_repeated_completion_by_the_same_worker_replays_and_a_different_output_is_refused)
{
	struct tstack_tenant t;
	struct http_response *a, *b, *c;
	char *wf;

	tstack_tenant_create(&t, "repeat");
	wf = tstack_create(&t, "{\"type\":\"r\",\"steps\":[{\"name\":\"a\",\"job_type\":\"x\"},"
	                       "{\"name\":\"b\",\"job_type\":\"y\"}]}");
	activate_one(&t, "x", "w", 30, wf);
	a = finish(&t, wf, 1, "complete", NULL, "{\"worker\":\"w\",\"output\":{\"v\":1}}");
	b = finish(&t, wf, 1, "complete", NULL, "{\"output\":{\"v\":1},\"worker\":\"w\"}");
	c = finish(&t, wf, 1, "complete", NULL, "{\"worker\":\"w\",\"output\":{\"v\":2}}");
	tstack_expect_status(a, 200);
	tstack_expect_status(b, 200);
	cr_assert_str_eq(b->body, a->body, "the repeat did not replay the result");
	char path[160];
	snprintf(path, sizeof(path), "/v1/jobs/%s.s1/complete", wf);
	tstack_expect_problem(c, 409, "/problems/job-not-active", path);
	cr_assert_eq(events(&t, wf, "job.completed"), 1);
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1", wf), 2);
	http_response_free(a);
	http_response_free(b);
	http_response_free(c);
	free(wf);
}

/* --- Retries ----------------------------------------------------------- */

Test(retries, exhausted_retries_fail_the_workflow)
{
	struct tstack_tenant t;
	struct http_response *r;
	char *wf, *v;

	tstack_tenant_create(&t, "retries");
	wf = tstack_create(&t,
	                   "{\"type\":\"p\",\"steps\":[{\"name\":\"charge\",\"job_type\":\"pay\","
	                   "\"retries\":1},{\"name\":\"after\",\"job_type\":\"never\"}]}");

	activate_one(&t, "pay", "w", 30, wf);
	r = finish(&t, wf, 1, "fail", NULL,
	           "{\"worker\":\"w\",\"error\":\"card declined\",\"retry_after_seconds\":2}");
	tstack_expect_status(r, 200);
	v = tstack_json(r->body, "{state}");
	cr_assert_str_eq(v, "activatable");
	free(v);
	v = tstack_json(r->body, "{retries_left}");
	cr_assert_str_eq(v, "0");
	free(v);
	http_response_free(r);
	expect_state(wf, "running");

	/* Not before retry_after_seconds. */
	r = activate(&t, "pay", "w", 1, 30);
	cr_assert_str_eq(r->body, "{\"jobs\":[]}");
	http_response_free(r);
	tstack_sleep_ms(2200);
	activate_one(&t, "pay", "w", 30, wf);

	r = finish(&t, wf, 1, "fail", NULL, "{\"worker\":\"w\",\"error\":\"declined again\"}");
	tstack_expect_status(r, 200);
	v = tstack_json(r->body, "{state}");
	cr_assert_str_eq(v, "failed");
	free(v);
	http_response_free(r);

	expect_state(wf, "failed");
	cr_assert_eq(events(&t, wf, "job.failed"), 2);
	cr_assert_eq(events(&t, wf, "workflow.failed"), 1);
	cr_assert_eq(events(&t, wf, "job.completed"), 0);
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1", wf), 1,
	             "a step after the failed one began");
	free(wf);
}

/* --- Messages ---------------------------------------------------------- */

struct sender {
	const struct tstack_tenant *t;
	const char *path;
	const char *key; /* or NULL */
	const char *body;
	pthread_barrier_t *start;
	struct http_response *resp;
};

static void *sender_run(void *arg)
{
	struct sender *s = arg;

	if (s->start != NULL)
		pthread_barrier_wait(s->start);
	s->resp = tstack_post_raw(s->t, s->path, s->key, s->body);
	return NULL;
}

Test(messages, a_message_delivered_five_times_three_concurrently_completes_the_step_once)
{
	struct tstack_tenant t;
	struct sender s[5];
	pthread_t th[3];
	pthread_barrier_t start;
	char path[128], *wf;
	const char *body =
	    "{\"message_id\":\"pay-77\",\"name\":\"payment.succeeded\",\"payload\":{\"amount\":5}}";
	int fresh = 0, dups = 0;

	tstack_tenant_create(&t, "msg");
	wf = tstack_create(
	    &t, "{\"type\":\"m\",\"steps\":[{\"name\":\"await-payment\","
	        "\"wait_for\":\"payment.succeeded\"},{\"name\":\"ship\",\"job_type\":\"ship\"}]}");
	snprintf(path, sizeof(path), "/v1/workflows/%s/messages", wf);
	cr_assert_eq(pthread_barrier_init(&start, NULL, 3), 0);
	for (int i = 0; i < 5; i++)
		s[i] = (struct sender){ &t, path, NULL, body, i < 3 ? &start : NULL, NULL };
	for (int i = 0; i < 3; i++)
		cr_assert_eq(pthread_create(&th[i], NULL, sender_run, &s[i]), 0);
	for (int i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&start);
	sender_run(&s[3]);
	sender_run(&s[4]);

	for (int i = 0; i < 5; i++) {
		cr_assert_not_null(s[i].resp, "delivery %d: %s", i, http_error());
		tstack_expect_status(s[i].resp, 200);
		char *d = tstack_json(s[i].resp->body, "{duplicate}");
		if (strcmp(d, "false") == 0)
			fresh++;
		else
			dups++;
		free(d);
		http_response_free(s[i].resp);
	}
	cr_assert_eq(fresh, 1);
	cr_assert_eq(dups, 4);
	cr_assert_eq(events(&t, wf, "job.completed"), 1);
	cr_assert_eq(tstack_count("SELECT count(*) FROM messages WHERE tenant_id = $1", t.id_text),
	             1);
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1 AND step = 2"
	                          " AND state = 'activatable'",
	                          wf),
	             1);
	free(wf);
}

Test(messages, a_message_no_step_waits_for_is_recorded_with_202_and_taken_by_a_later_wait)
{
	struct tstack_tenant t;
	struct http_response *r;
	char path[128], *wf;

	tstack_tenant_create(&t, "early");
	wf = tstack_create(&t, "{\"type\":\"e\",\"steps\":[{\"name\":\"work\",\"job_type\":\"w\"},"
	                       "{\"name\":\"await\",\"wait_for\":\"done\"}]}");
	snprintf(path, sizeof(path), "/v1/workflows/%s/messages", wf);
	r = tstack_post(&t, path, NULL, "{\"message_id\":\"early-1\",\"name\":\"done\"}");
	tstack_expect_status(r, 202);
	cr_assert_str_eq(r->body,
	                 "{\"message_id\":\"early-1\",\"duplicate\":false,\"correlated\":false}");
	http_response_free(r);
	expect_state(wf, "pending");

	activate_one(&t, "w", "w", 30, wf);
	r = complete(&t, wf, 1, "w");
	tstack_expect_status(r, 200);
	http_response_free(r);
	/* The wait step took the recorded message at once. */
	expect_state(wf, "completed");
	cr_assert_eq(events(&t, wf, "job.completed"), 2);
	free(wf);
}

Test(messages, a_message_id_reused_for_a_different_message_is_a_conflict)
{
	struct tstack_tenant t;
	struct http_response *r;
	char path[128], *wf, *before, *after;

	tstack_tenant_create(&t, "msgreuse");
	wf = tstack_create(&t, "{\"type\":\"e\",\"steps\":[{\"name\":\"await\",\"wait_for\":\"a\"},"
	                       "{\"name\":\"w\",\"job_type\":\"w\"}]}");
	snprintf(path, sizeof(path), "/v1/workflows/%s/messages", wf);
	r = tstack_post(&t, path, NULL,
	                "{\"message_id\":\"m\",\"name\":\"a\",\"payload\":{\"v\":1}}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	before = tenant_snapshot(&t);
	r = tstack_post(&t, path, NULL,
	                "{\"message_id\":\"m\",\"name\":\"a\",\"payload\":{\"v\":2}}");
	tstack_expect_problem(r, 409, "/problems/message-id-reused", path);
	http_response_free(r);
	after = tenant_snapshot(&t);
	cr_assert_str_eq(after, before);
	free(before);
	free(after);
	free(wf);
}

/* --- Business keys ----------------------------------------------------- */

#define BK_RACERS 20

Test(business_key, twenty_concurrent_creates_with_one_business_key_make_one_active_workflow)
{
	struct tstack_tenant t;
	struct sender s[BK_RACERS];
	pthread_t th[BK_RACERS];
	pthread_barrier_t start;
	char keys[BK_RACERS][96], *first = NULL;
	int created = 0, existing = 0;
	const char *body = "{\"type\":\"order\",\"business_key\":\"O-123\",\"steps\":["
	                   "{\"name\":\"a\",\"job_type\":\"bk\"}]}";

	tstack_tenant_create(&t, "bk");
	cr_assert_eq(pthread_barrier_init(&start, NULL, BK_RACERS), 0);
	for (int i = 0; i < BK_RACERS; i++) {
		tstack_key(keys[i], sizeof(keys[i]), "bk");
		s[i] = (struct sender){ &t, "/v1/workflows", keys[i], body, &start, NULL };
	}
	for (int i = 0; i < BK_RACERS; i++)
		cr_assert_eq(pthread_create(&th[i], NULL, sender_run, &s[i]), 0);
	for (int i = 0; i < BK_RACERS; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&start);
	for (int i = 0; i < BK_RACERS; i++) {
		struct http_response *r = s[i].resp;
		char *id, *ex;
		cr_assert_not_null(r, "request %d: %s", i, http_error());
		cr_assert(r->status == 201 || r->status == 200, "status %d: %.400s", r->status,
		          r->body);
		id = tstack_json(r->body, "{id}");
		ex = tstack_json(r->body, "{existing}");
		if (r->status == 201) {
			created++;
			cr_assert_null(ex);
		} else {
			existing++;
			cr_assert_str_eq(ex, "true");
		}
		if (first == NULL)
			first = strdup(id);
		cr_assert_str_eq(id, first, "two workflows for one business key");
		free(id);
		free(ex);
		http_response_free(r);
	}
	cr_assert_eq(created, 1);
	cr_assert_eq(existing, BK_RACERS - 1);
	cr_assert_eq(tstack_count("SELECT count(*) FROM workflows WHERE tenant_id = $1", t.id_text),
	             1);
	cr_assert_eq(
	    tstack_count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1", t.id_text),
	    BK_RACERS);

	/* Once it has ended, the business key may start a new workflow. */
	char path[128];
	snprintf(path, sizeof(path), "/v1/workflows/%s/transitions", first);
	struct http_response *r =
	    tstack_post(&t, path, NULL, "{\"to\":\"cancelled\",\"from\":\"pending\"}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	char *again = tstack_create(&t, body);
	cr_assert_str_neq(again, first);
	cr_assert_eq(tstack_count("SELECT count(*) FROM workflows WHERE tenant_id = $1"
	                          " AND state IN ('pending', 'running')",
	                          t.id_text),
	             1);
	free(again);
	free(first);
}

/* --- Transitions ------------------------------------------------------- */

Test(transitions, cancel_is_a_compare_and_set_and_repeating_it_is_a_no_op)
{
	struct tstack_tenant t;
	struct http_response *r, *again;
	char path[128], *wf, *before, *after;

	tstack_tenant_create(&t, "cas");
	wf =
	    tstack_create(&t, "{\"type\":\"c\",\"steps\":[{\"name\":\"a\",\"job_type\":\"cas\"}]}");
	snprintf(path, sizeof(path), "/v1/workflows/%s/transitions", wf);

	before = tenant_snapshot(&t);
	r = tstack_post(&t, path, NULL, "{\"to\":\"cancelled\",\"from\":\"running\"}");
	tstack_expect_problem(r, 409, "/problems/state-conflict", path);
	http_response_free(r);
	r = tstack_post(&t, path, NULL, "{\"to\":\"completed\",\"from\":\"pending\"}");
	tstack_expect_problem(r, 422, "/problems/invalid-transition", path);
	http_response_free(r);
	after = tenant_snapshot(&t);
	cr_assert_str_eq(after, before);
	free(after);

	r = tstack_post(&t, path, NULL, "{\"to\":\"cancelled\",\"from\":\"pending\"}");
	tstack_expect_status(r, 200);
	again = tstack_post(&t, path, NULL, "{\"to\":\"cancelled\",\"from\":\"pending\"}");
	tstack_expect_status(again, 200);
	cr_assert_str_eq(again->body, r->body, "the repeat is not the same answer");
	expect_state(wf, "cancelled");
	cr_assert_eq(events(&t, wf, "workflow.cancelled"), 1);
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1"
	                          " AND state = 'cancelled'",
	                          wf),
	             1);
	http_response_free(r);
	http_response_free(again);

	/* Ended: cancelling from cancelled is the no-op, from anything
	 * else the conflict. */
	r = tstack_post(&t, path, NULL, "{\"to\":\"cancelled\",\"from\":\"running\"}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	cr_assert_eq(events(&t, wf, "workflow.cancelled"), 1);
	free(before);
	free(wf);
}

struct racer2 {
	const struct tstack_tenant *t;
	char path[160];
	const char *body;
	pthread_barrier_t *start;
	struct http_response *resp;
};

static void *racer2_run(void *arg)
{
	struct racer2 *r = arg;

	pthread_barrier_wait(r->start);
	r->resp = tstack_post_raw(r->t, r->path, NULL, r->body);
	return NULL;
}

#define CANCEL_ROUNDS 8

/* Worker sessions waiting behind holder's lock, directly or behind a
 * session that waits for it. */
static long waiting_behind(PGconn *holder)
{
	char backend[24];

	snprintf(backend, sizeof(backend), "%d", PQbackendPID(holder));
	return tstack_count("SELECT count(*) FROM pg_stat_activity a"
	                    " WHERE a.application_name LIKE '%-worker-%'"
	                    "   AND ($1::int = ANY (pg_blocking_pids(a.pid)) OR EXISTS ("
	                    "        SELECT 1 FROM pg_stat_activity b"
	                    "         WHERE $1::int = ANY (pg_blocking_pids(b.pid))"
	                    "           AND b.pid = ANY (pg_blocking_pids(a.pid))))",
	                    backend);
}

static void wait_behind(PGconn *holder, long n)
{
	double deadline = tstack_now() + 5;
	long got;

	while ((got = waiting_behind(holder)) < n && tstack_now() < deadline)
		tstack_sleep_ms(10);
	cr_assert_eq(got, n, "%ld requests waiting on the workflow's lock, want %ld", got, n);
}

/*
 * The completion and the cancel both lock the workflow first. Holding that
 * lock here, sending one, seeing it wait, then the other, and letting go
 * puts them in a chosen order: every order is seen, half the rounds each.
 */
Test(transitions, cancel_racing_a_completion_leaves_a_consistent_state_and_its_events)
{
	struct tstack_tenant t;
	int completed_first = 0, cancelled_first = 0;

	tstack_tenant_create(&t, "race");
	for (int i = 0; i < CANCEL_ROUNDS; i++) {
		char *wf =
		    tstack_create(&t, "{\"type\":\"cr\",\"steps\":[{\"name\":\"a\",\"job_type\":"
		                      "\"cr\"},{\"name\":\"b\",\"job_type\":\"cr2\"}]}");
		struct racer2 c = { &t, "", "{\"worker\":\"w\",\"output\":{}}", NULL, NULL };
		struct racer2 x = { &t, "", "{\"to\":\"cancelled\",\"from\":\"running\"}", NULL,
			            NULL };
		int complete_first = i % 2 == 0;
		struct racer2 *first = complete_first ? &c : &x, *second = complete_first ? &x : &c;
		pthread_barrier_t start1, start2;
		pthread_t a, b;
		PGconn *hold;

		activate_one(&t, "cr", "w", 30, wf);
		snprintf(c.path, sizeof(c.path), "/v1/jobs/%s.s1/complete", wf);
		snprintf(x.path, sizeof(x.path), "/v1/workflows/%s/transitions", wf);
		hold = tstack_db_connect();
		tstack_exec(hold, "BEGIN");
		tstack_exec(hold, "SELECT 1 FROM workflows WHERE id = $1 FOR UPDATE", wf);
		cr_assert_eq(pthread_barrier_init(&start1, NULL, 1), 0);
		cr_assert_eq(pthread_barrier_init(&start2, NULL, 1), 0);
		first->start = &start1;
		second->start = &start2;
		pthread_create(&a, NULL, racer2_run, first);
		wait_behind(hold, 1);
		pthread_create(&b, NULL, racer2_run, second);
		wait_behind(hold, 2);
		tstack_exec(hold, "ROLLBACK");
		PQfinish(hold);
		pthread_join(a, NULL);
		pthread_join(b, NULL);
		pthread_barrier_destroy(&start1);
		pthread_barrier_destroy(&start2);
		cr_assert_not_null(c.resp);
		cr_assert_not_null(x.resp);

		/* The cancel always wins in the end: it needs state running,
		 * which the completion keeps. */
		tstack_expect_status(x.resp, 200);
		expect_state(wf, "cancelled");
		cr_assert_eq(events(&t, wf, "workflow.cancelled"), 1);
		cr_assert_eq(events(&t, wf, "workflow.completed"), 0);
		/* Which went first is read from the answers, not from the
		 * order chosen: the counts below show both orders happened. */
		if (c.resp->status == 200) {
			/* Completion first: step 2 began and was cancelled. */
			completed_first++;
			tstack_expect_status(c.resp, 200);
			cr_assert_eq(events(&t, wf, "job.completed"), 1);
			cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1"
			                          " AND step = 2 AND state = 'cancelled'",
			                          wf),
			             1);
			cr_assert_eq(
			    tstack_count("SELECT max(seq) FROM outbox WHERE workflow_id = $1", wf),
			    4);
		} else {
			cancelled_first++;
			tstack_expect_problem(c.resp, 409, "/problems/job-not-active", c.path);
			cr_assert_eq(events(&t, wf, "job.completed"), 0);
			cr_assert_eq(
			    tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1", wf),
			    1);
			cr_assert_eq(
			    tstack_count("SELECT max(seq) FROM outbox WHERE workflow_id = $1", wf),
			    3);
		}
		http_response_free(c.resp);
		http_response_free(x.resp);
		free(wf);
	}
	cr_assert_eq(completed_first, CANCEL_ROUNDS / 2,
	             "the completion went first in %d of %d rounds", completed_first,
	             CANCEL_ROUNDS);
	cr_assert_eq(cancelled_first, CANCEL_ROUNDS / 2, "the cancel went first in %d of %d rounds",
	             cancelled_first, CANCEL_ROUNDS);
}

/* --- Reaper ------------------------------------------------------------ */

Test(reap, idemflow_reap_makes_expired_jobs_activatable_again)
{
	struct tstack_tenant t;
	char out[256], *wf;

	tstack_tenant_create(&t, "reap");
	wf =
	    tstack_create(&t, "{\"type\":\"rp\",\"steps\":[{\"name\":\"a\",\"job_type\":\"rp\"}]}");
	activate_one(&t, "rp", "gone", 1, wf);
	tstack_sleep_ms(1300);
	cr_assert_eq(tstack_cli(out, sizeof(out), "reap", NULL), 0, "reap: %s",
	             tstack_cli_stderr());
	tstack_expect_match(out, "^reap: jobs=[1-9][0-9]*$", "reap output");
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1"
	                          " AND state = 'activatable'",
	                          wf),
	             1);
	/* The dead worker's completion is refused; a new one gets it. */
	char path[160];
	snprintf(path, sizeof(path), "/v1/jobs/%s.s1/complete", wf);
	struct http_response *r = complete(&t, wf, 1, "gone");
	tstack_expect_problem(r, 409, "/problems/lease-expired", path);
	http_response_free(r);
	activate_one(&t, "rp", "alive", 30, wf);
	r = complete(&t, wf, 1, "alive");
	tstack_expect_status(r, 200);
	http_response_free(r);
	expect_state(wf, "completed");
	free(wf);
}

/* --- History and lists ------------------------------------------------- */

Test(history, events_come_in_order_with_cursor_pages)
{
	struct tstack_tenant t;
	struct http_response *r;
	char path[200], *wf, *cursor, *v;

	tstack_tenant_create(&t, "hist");
	wf = tstack_create(&t, "{\"type\":\"h\",\"steps\":[{\"name\":\"a\",\"job_type\":\"h\"}]}");
	activate_one(&t, "h", "w", 30, wf);
	r = complete(&t, wf, 1, "w");
	http_response_free(r);

	/* created, started, job.completed, workflow.completed: 2 + 2. */
	snprintf(path, sizeof(path), "/v1/workflows/%s/events?limit=2", wf);
	r = tstack_get(&t, path);
	tstack_expect_status(r, 200);
	v = tstack_text("SELECT string_agg(e ->> 'type', ',') FROM"
	                " jsonb_array_elements($1::jsonb -> 'events') e",
	                r->body);
	cr_assert_str_eq(v, "workflow.created,workflow.started");
	free(v);
	cursor = tstack_json(r->body, "{next_cursor}");
	cr_assert_str_eq(cursor, "2");
	http_response_free(r);
	snprintf(path, sizeof(path), "/v1/workflows/%s/events?limit=2&after=%s", wf, cursor);
	r = tstack_get(&t, path);
	v = tstack_text("SELECT string_agg((e ->> 'seq') || (e ->> 'id'), ',') FROM"
	                " jsonb_array_elements($1::jsonb -> 'events') e",
	                r->body);
	char want[200];
	snprintf(want, sizeof(want), "3%s.3,4%s.4", wf, wf);
	cr_assert_str_eq(v, want);
	free(v);
	v = tstack_json_type(r->body, "{next_cursor}");
	cr_assert_str_eq(v, "null");
	free(v);
	http_response_free(r);
	free(cursor);
	free(wf);
}

/*
 * The list promises creation order for one client's sequential creates,
 * whichever workers make them (ids are time-ordered to a fraction of a
 * millisecond), and a page walk sees every workflow committed before it
 * started once, and one created during the walk on a later page.
 */
Test(history, workflows_are_listed_by_keyset_pages_with_filters)
{
	enum { BEFORE = 30, DURING = 3, TOTAL = BEFORE + DURING, LIMIT = 4 };
	struct tstack_tenant t;
	char *ids[TOTAL], path[200], *cursor = NULL;
	int seen = 0, made = 0, pages = 0;

	tstack_tenant_create(&t, "list");
	for (; made < BEFORE; made++)
		ids[made] = tstack_create(&t, "{\"type\":\"listed\",\"steps\":[{\"name\":\"a\","
		                              "\"job_type\":\"l\"}]}");
	free(tstack_create(&t, "{\"type\":\"other\"}"));
	do {
		struct http_response *r;
		if (cursor == NULL)
			snprintf(path, sizeof(path), "/v1/workflows?type=listed&limit=%d", LIMIT);
		else
			snprintf(path, sizeof(path), "/v1/workflows?type=listed&limit=%d&after=%s",
			         LIMIT, cursor);
		r = tstack_get(&t, path);
		tstack_expect_status(r, 200);
		long n =
		    tstack_count("SELECT jsonb_array_length($1::jsonb -> 'workflows')", r->body);
		cr_assert_eq(n, seen + LIMIT <= TOTAL ? LIMIT : TOTAL - seen, "page %d", pages);
		for (int k = 0; k < n; k++) {
			char p2[64];
			snprintf(p2, sizeof(p2), "{workflows,%d,id}", k);
			char *id = tstack_json(r->body, p2);
			cr_assert_str_eq(id, ids[seen], "page %d item %d: creation order", pages,
			                 k);
			seen++;
			free(id);
		}
		free(cursor);
		cursor = tstack_json(r->body, "{next_cursor}");
		http_response_free(r);
		/* Created during the walk: shown on a later page. */
		if (++pages == 2)
			for (; made < TOTAL; made++)
				ids[made] = tstack_create(&t, "{\"type\":\"listed\"}");
	} while (cursor != NULL && pages < 20);
	cr_assert_null(cursor);
	cr_assert_eq(seen, TOTAL);

	struct http_response *r = tstack_get(&t, "/v1/workflows?state=cancelled");
	cr_assert_str_eq(r->body, "{\"workflows\":[],\"next_cursor\":null}");
	http_response_free(r);
	r = tstack_get(&t, "/v1/workflows?state=sleeping");
	tstack_expect_problem(r, 422, "/problems/invalid-request", "/v1/workflows");
	http_response_free(r);
	for (int i = 0; i < TOTAL; i++)
		free(ids[i]);
}

/* --- Bad input ---------------------------------------------------------- */

Test(bad_input, every_malformed_command_gets_a_precise_problem_and_changes_nothing)
{
	static const struct {
		const char *path; /* %s: the workflow id */
		const char *body;
		int status;
		const char *type;
	} cases[] = {
		{ "/v1/jobs/%s.s9/complete", "{\"worker\":\"w\"}", 404, "/problems/not-found" },
		{ "/v1/jobs/nonsense/complete", "{\"worker\":\"w\"}", 404, "/problems/not-found" },
		{ "/v1/jobs/%s.s1/complete", "{\"worker\":\"intruder\"}", 409,
		  "/problems/not-lease-holder" },
		{ "/v1/jobs/%s.s1/complete", "{\"output\":{}}", 422, "/problems/invalid-request" },
		{ "/v1/jobs/%s.s1/complete", "{\"worker\":\"w\",\"output\":[1]}", 422,
		  "/problems/invalid-request" },
		{ "/v1/jobs/%s.s1/fail", "{\"worker\":\"w\",\"retry_after_seconds\":-1}", 422,
		  "/problems/invalid-request" },
		{ "/v1/jobs/activate", "{\"job_type\":\"b\",\"worker\":\"w\",\"lease_seconds\":-5}",
		  422, "/problems/invalid-request" },
		{ "/v1/jobs/activate",
		  "{\"job_type\":\"b\",\"worker\":\"w\",\"lease_seconds\":99999999999999}", 422,
		  "/problems/invalid-request" },
		{ "/v1/jobs/activate", "{\"job_type\":\"b\",\"worker\":\"w\",\"max_jobs\":0}", 422,
		  "/problems/invalid-request" },
		{ "/v1/jobs/activate", "{\"worker\":\"w\"}", 422, "/problems/invalid-request" },
		{ "/v1/jobs/activate", "{\"job_type\":\"b\",\"worker\":\"w\",\"extra\":1}", 422,
		  "/problems/invalid-request" },
		{ "/v1/jobs/activate", "{\"job_type\":", 400, "/problems/invalid-json" },
		{ "/v1/workflows/%s/transitions", "{\"to\":\"sleeping\"}", 422,
		  "/problems/invalid-request" },
		{ "/v1/workflows/%s/transitions", "{\"to\":\"cancelled\",\"from\":\"nowhere\"}",
		  422, "/problems/invalid-request" },
		{ "/v1/workflows/%s/transitions", "{\"to\":\"running\",\"from\":\"running\"}", 200,
		  NULL },
		{ "/v1/workflows/%s/messages", "{\"name\":\"x\"}", 422,
		  "/problems/invalid-request" },
		{ "/v1/workflows/%s/messages",
		  "{\"message_id\":\"m\",\"name\":\"x\",\"payload\":3}", 422,
		  "/problems/invalid-request" },
		{ "/v1/workflows/%s/messages", "{\"message_id\":\"\",\"name\":\"x\"}", 422,
		  "/problems/invalid-request" },
		{ "/v1/workflows/01a00000-0000-7000-8000-000000000000/messages",
		  "{\"message_id\":\"m\",\"name\":\"x\"}", 404, "/problems/not-found" },
	};
	struct tstack_tenant t;
	char *wf, *before, *after, steps[4096];
	size_t off;

	tstack_tenant_create(&t, "bad");
	wf = tstack_create(&t, "{\"type\":\"b\",\"steps\":[{\"name\":\"a\",\"job_type\":\"b\"}]}");
	activate_one(&t, "b", "w", 60, wf);
	before = tenant_snapshot(&t);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char path[200];
		struct http_response *r;
		const char *pct = strstr(cases[i].path, "%s");
		if (pct != NULL)
			snprintf(path, sizeof(path), "%.*s%s%s", (int)(pct - cases[i].path),
			         cases[i].path, wf, pct + 2);
		else
			snprintf(path, sizeof(path), "%s", cases[i].path);
		r = tstack_post(&t, path, NULL, cases[i].body);
		if (cases[i].type != NULL)
			tstack_expect_problem(r, cases[i].status, cases[i].type, path);
		else
			tstack_expect_status(r, cases[i].status);
		http_response_free(r);
	}

	/* Workflows: too many steps, a step with both kinds, duplicate
	 * names. */
	off = (size_t)snprintf(steps, sizeof(steps), "{\"type\":\"b\",\"steps\":[");
	for (int i = 0; i < 33; i++)
		off += (size_t)snprintf(steps + off, sizeof(steps) - off,
		                        "%s{\"name\":\"s%d\",\"job_type\":\"b\"}", i ? "," : "", i);
	snprintf(steps + off, sizeof(steps) - off, "]}");
	const char *bad_workflows[] = {
		steps,
		"{\"type\":\"b\",\"steps\":[]}",
		"{\"type\":\"b\",\"steps\":[{\"name\":\"a\",\"job_type\":\"b\",\"wait_for\":\"m\"}]"
		"}",
		"{\"type\":\"b\",\"steps\":[{\"name\":\"a\",\"job_type\":\"b\"},"
		"{\"name\":\"a\",\"job_type\":\"c\"}]}",
		"{\"type\":\"b\",\"steps\":[{\"name\":\"a\",\"wait_for\":\"m\",\"retries\":2}]}",
		"{\"type\":\"b\",\"steps\":[{\"name\":\"a\",\"job_type\":\"b\",\"retries\":-1}]}",
		"{\"type\":\"b\",\"business_key\":\"\"}",
		"{\"type\":\"b\",\"business_key\":7}",
	};
	for (size_t i = 0; i < sizeof(bad_workflows) / sizeof(bad_workflows[0]); i++) {
		char key[96];
		struct http_response *r;
		tstack_key(key, sizeof(key), "bad");
		r = tstack_post(&t, "/v1/workflows", key, bad_workflows[i]);
		tstack_expect_problem(r, 422, "/problems/invalid-workflow", "/v1/workflows");
		http_response_free(r);
	}
	after = tenant_snapshot(&t);
	cr_assert_str_eq(after, before, "a refused request changed something");
	free(before);
	free(after);
	free(wf);
}

/* --- Keyed commands ----------------------------------------------------- */

Test(keyed_commands, a_keyed_activation_replays_the_same_jobs_and_a_changed_body_conflicts)
{
	struct tstack_tenant t;
	struct http_response *a, *b, *c;
	char key[96], *wf;

	tstack_tenant_create(&t, "keyact");
	wf = tstack_create(&t, "{\"type\":\"k\",\"steps\":[{\"name\":\"a\",\"job_type\":\"k\"}]}");
	free(tstack_create(&t, "{\"type\":\"k\",\"steps\":[{\"name\":\"a\",\"job_type\":\"k\"}]}"));
	tstack_key(key, sizeof(key), "act");
	a = tstack_post(&t, "/v1/jobs/activate", key, "{\"job_type\":\"k\",\"worker\":\"w\"}");
	b = tstack_post(&t, "/v1/jobs/activate", key, "{\"worker\":\"w\",\"job_type\":\"k\"}");
	c = tstack_post(&t, "/v1/jobs/activate", key, "{\"job_type\":\"k\",\"worker\":\"w2\"}");
	tstack_expect_status(a, 200);
	tstack_expect_status(b, 200);
	cr_assert_str_eq(b->body, a->body);
	tstack_expect_header(b, "Idempotent-Replayed", "true");
	tstack_expect_problem(c, 409, "/problems/idempotency-key-reused", "/v1/jobs/activate");
	/* One activation in all: the second workflow's job is still free. */
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE tenant_id = $1"
	                          " AND state = 'active'",
	                          t.id_text),
	             1);
	http_response_free(a);
	http_response_free(b);
	http_response_free(c);

	/* A refused completion is stored under its key and replayed. */
	tstack_key(key, sizeof(key), "refused");
	a = finish(&t, wf, 1, "complete", key, "{\"worker\":\"nobody\"}");
	b = finish(&t, wf, 1, "complete", key, "{\"worker\":\"nobody\"}");
	{
		char path[160];
		snprintf(path, sizeof(path), "/v1/jobs/%s.s1/complete", wf);
		tstack_expect_problem(a, 409, "/problems/not-lease-holder", path);
	}
	/* The replay is the stored answer, the first request_id included. */
	cr_assert_eq(b->status, 409);
	tstack_expect_header(b, "Content-Type", "application/problem+json");
	tstack_expect_header(b, "Idempotent-Replayed", "true");
	cr_assert_str_eq(b->body, a->body);
	http_response_free(a);
	http_response_free(b);
	free(wf);
}

/*
 * Every keyed command keeps the fingerprint of its request's bytes, and a
 * retry with the same bytes is replayed without the canonical comparison:
 * with the stored canonical fingerprint tampered with, the same bytes still
 * replay and reformatted JSON is a conflict.
 */
Test(keyed_commands, a_retry_with_the_same_bytes_replays_without_the_canonical_comparison)
{
	const char *body = "{\"job_type\":\"sb\",\"worker\":\"w\"}";
	struct tstack_tenant t;
	struct http_response *a, *b, *c;
	char key[96];

	tstack_tenant_create(&t, "samebytes");
	free(tstack_create(&t,
	                   "{\"type\":\"sb\",\"steps\":[{\"name\":\"a\",\"job_type\":\"sb\"}]}"));
	tstack_key(key, sizeof(key), "sb");
	a = tstack_post(&t, "/v1/jobs/activate", key, body);
	tstack_expect_status(a, 200);
	cr_assert_eq(
	    tstack_count("SELECT count(*) FROM idempotency_keys WHERE key = $1"
	                 " AND request_bytes_fp IS NOT NULL AND request_bytes_fp <> fingerprint",
	                 key),
	    1, "the command's key keeps the fingerprint of its bytes");
	tstack_exec(tstack_db(), "UPDATE idempotency_keys SET fingerprint = '\\x00' WHERE key = $1",
	            key);
	b = tstack_post(&t, "/v1/jobs/activate", key, body);
	c = tstack_post(&t, "/v1/jobs/activate", key, "{\"worker\":\"w\",\"job_type\":\"sb\"}");
	tstack_expect_status(b, 200);
	cr_assert_str_eq(b->body, a->body);
	tstack_expect_header(b, "Idempotent-Replayed", "true");
	tstack_expect_problem(c, 409, "/problems/idempotency-key-reused", "/v1/jobs/activate");
	http_response_free(a);
	http_response_free(b);
	http_response_free(c);
}

/* --- Tenant isolation ---------------------------------------------------- */

TestSuite(isolation, .timeout = 60);

Test(isolation, no_route_of_a_running_workflow_reaches_another_tenants_rows)
{
	struct tstack_tenant a, b;
	struct http_response *r;
	char path[200], *wf, *before, *after, *n;
	const char *body =
	    "{\"type\":\"iso\",\"business_key\":\"B-1\",\"steps\":["
	    "{\"name\":\"w\",\"job_type\":\"iso\"},{\"name\":\"m\",\"wait_for\":\"go\"}]}";

	tstack_tenant_create(&a, "iso-a");
	tstack_tenant_create(&b, "iso-b");
	wf = tstack_create(&a, body);
	activate_one(&a, "iso", "wa", 60, wf);
	before = tenant_snapshot(&a);

	/* B sees nothing of A's: every route answers as for a missing id. */
	snprintf(path, sizeof(path), "/v1/workflows/%s/events", wf);
	r = tstack_get(&b, path);
	tstack_expect_problem(r, 404, "/problems/not-found", path);
	http_response_free(r);
	r = tstack_get(&b, "/v1/workflows?type=iso");
	cr_assert_str_eq(r->body, "{\"workflows\":[],\"next_cursor\":null}");
	http_response_free(r);
	snprintf(path, sizeof(path), "/v1/workflows/%s/transitions", wf);
	r = tstack_post(&b, path, NULL, "{\"to\":\"cancelled\"}");
	tstack_expect_problem(r, 404, "/problems/not-found", path);
	http_response_free(r);
	snprintf(path, sizeof(path), "/v1/workflows/%s/messages", wf);
	r = tstack_post(&b, path, NULL, "{\"message_id\":\"x\",\"name\":\"go\"}");
	tstack_expect_problem(r, 404, "/problems/not-found", path);
	http_response_free(r);
	r = activate(&b, "iso", "wb", 10, 60);
	cr_assert_str_eq(r->body, "{\"jobs\":[]}");
	http_response_free(r);
	for (int i = 0; i < 2; i++) {
		const char *verb = i == 0 ? "complete" : "fail";
		snprintf(path, sizeof(path), "/v1/jobs/%s.s1/%s", wf, verb);
		r = finish(&b, wf, 1, verb, NULL, "{\"worker\":\"wa\"}");
		tstack_expect_problem(r, 404, "/problems/not-found", path);
		http_response_free(r);
	}
	after = tenant_snapshot(&a);
	cr_assert_str_eq(after, before, "another tenant changed A's rows");
	free(after);

	/* The same business key, message id and command key in B are B's own. */
	char *wfb = tstack_create(&b, body);
	cr_assert_str_neq(wfb, wf);
	snprintf(path, sizeof(path), "/v1/workflows/%s/messages", wfb);
	r = tstack_post(&b, path, "shared-key", "{\"message_id\":\"shared\",\"name\":\"go\"}");
	tstack_expect_status(r, 202);
	http_response_free(r);
	snprintf(path, sizeof(path), "/v1/workflows/%s/messages", wf);
	r = tstack_post(&a, path, "shared-key", "{\"message_id\":\"shared\",\"name\":\"go\"}");
	tstack_expect_status(r, 202);
	n = tstack_json(r->body, "{duplicate}");
	cr_assert_str_eq(n, "false");
	free(n);
	cr_assert_null(http_header(r, "Idempotent-Replayed"));
	http_response_free(r);
	free(before);
	free(wfb);
	free(wf);
}

#define ACTIVATORS 10

Test(lease, concurrent_activations_never_hand_out_one_job_twice)
{
	struct tstack_tenant t;
	struct sender s[ACTIVATORS];
	pthread_t th[ACTIVATORS];
	pthread_barrier_t start;
	char bodies[ACTIVATORS][128];
	long handed = 0;

	tstack_tenant_create(&t, "activators");
	for (int i = 0; i < 20; i++)
		free(tstack_create(
		    &t, "{\"type\":\"ca\",\"steps\":[{\"name\":\"a\",\"job_type\":\"ca\"}]}"));
	cr_assert_eq(pthread_barrier_init(&start, NULL, ACTIVATORS), 0);
	for (int i = 0; i < ACTIVATORS; i++) {
		snprintf(bodies[i], sizeof(bodies[i]),
		         "{\"job_type\":\"ca\",\"worker\":\"a%d\",\"max_jobs\":3}", i);
		s[i] = (struct sender){ &t, "/v1/jobs/activate", NULL, bodies[i], &start, NULL };
		cr_assert_eq(pthread_create(&th[i], NULL, sender_run, &s[i]), 0);
	}
	for (int i = 0; i < ACTIVATORS; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&start);

	/* Every key handed out once, to the worker the table names. */
	PGconn *db = tstack_db();
	for (int i = 0; i < ACTIVATORS; i++) {
		cr_assert_not_null(s[i].resp);
		tstack_expect_status(s[i].resp, 200);
		const char *p[2] = { s[i].resp->body, NULL };
		PGresult *res = PQexecParams(db,
		                             "SELECT j ->> 'key', j ->> 'worker' FROM "
		                             "jsonb_array_elements($1::jsonb -> 'jobs') j",
		                             1, NULL, p, NULL, NULL, 0);
		cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK);
		for (int k = 0; k < PQntuples(res); k++) {
			char wf[37];
			snprintf(wf, sizeof(wf), "%.36s", PQgetvalue(res, k, 0));
			cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1"
			                          " AND worker = $2 AND activations = 1",
			                          wf, PQgetvalue(res, k, 1)),
			             1, "job %s is not %s's alone", PQgetvalue(res, k, 0),
			             PQgetvalue(res, k, 1));
			handed++;
		}
		PQclear(res);
		http_response_free(s[i].resp);
	}
	cr_assert_eq(handed, tstack_count("SELECT count(*) FROM jobs WHERE tenant_id = $1"
	                                  " AND state = 'active'",
	                                  t.id_text));
	cr_assert_eq(handed, 20, "SKIP LOCKED left jobs behind while %ld were asked for",
	             (long)ACTIVATORS * 3);
}
