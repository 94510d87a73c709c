/*
 * End-to-end tests of compensation (sagas), through nginx and the worker
 * pool: a job step's "compensate" names the job that undoes it; a workflow
 * that fails or is cancelled after such steps completed moves to
 * compensating and hands out their compensating jobs ("<wf>.c<k>") one at a
 * time, latest step first, each once, then ends compensated. Cancel racing
 * the last completion in both orders (forced with the workflow's row lock),
 * a compensating job out of retries parked in incident and resumed, two
 * reapers and two workers over many sagas, and definitions refused.
 *
 * Every test works in a tenant of its own.
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

/* Concurrent commands wait on one workflow's row: a lock_timeout of 10 s,
 * not the harness's 1 s, on a loaded machine. */
TSTACK_SETTINGS("idempotency_wait = 10s\n")

TestSuite(saga, .timeout = 180);

/* --- Helpers ----------------------------------------------------------- */

/* Activate up to max jobs of type for worker (lease in seconds); the
 * answer's body. */
static struct http_response *activate(const struct tstack_tenant *t, const char *type,
                                      const char *worker, int max, int lease)
{
	char body[256];

	snprintf(body, sizeof(body),
	         "{\"job_type\":\"%s\",\"worker\":\"%s\",\"max_jobs\":%d,\"lease_seconds\":%d}",
	         type, worker, max, lease);
	return tstack_post(t, "/v1/jobs/activate", NULL, body);
}

/* Activate one job of type and expect its key; the job as JSON text. */
static char *activate_key(const struct tstack_tenant *t, const char *type, const char *worker,
                          const char *key)
{
	struct http_response *r = activate(t, type, worker, 1, 30);
	char *n, *got, *job;

	tstack_expect_status(r, 200);
	n = tstack_text("SELECT jsonb_array_length($1::jsonb -> 'jobs')::text", r->body);
	cr_assert_str_eq(n, "1", "activation of %s: %s", type, r->body);
	got = tstack_json(r->body, "{jobs,0,key}");
	cr_assert_str_eq(got, key, "activation: %s", r->body);
	job = tstack_text("SELECT ($1::jsonb -> 'jobs' -> 0)::text", r->body);
	free(got);
	free(n);
	http_response_free(r);
	return job;
}

static void expect_no_job(const struct tstack_tenant *t, const char *type)
{
	struct http_response *r = activate(t, type, "x", 5, 30);

	tstack_expect_status(r, 200);
	cr_assert_str_eq(r->body, "{\"jobs\":[]}", "activation of %s", type);
	http_response_free(r);
}

/* POST /v1/jobs/<key>/<verb>. */
static struct http_response *job_post(const struct tstack_tenant *t, const char *key,
                                      const char *verb, const char *body)
{
	char path[160];

	snprintf(path, sizeof(path), "/v1/jobs/%s/%s", key, verb);
	return tstack_post_raw(t, path, NULL, body);
}

static void finish(const struct tstack_tenant *t, const char *key, const char *verb,
                   const char *body, const char *want_state)
{
	struct http_response *r = job_post(t, key, verb, body);
	char *v;

	tstack_expect_status(r, 200);
	v = tstack_json(r->body, "{state}");
	cr_assert_str_eq(v, want_state, "%s %s: %s", key, verb, r->body);
	free(v);
	http_response_free(r);
}

static struct http_response *cancel(const struct tstack_tenant *t, const char *wf)
{
	char path[160];

	snprintf(path, sizeof(path), "/v1/workflows/%s/transitions", wf);
	return tstack_post_raw(t, path, NULL, "{\"to\":\"cancelled\"}");
}

static void expect_state(const char *wf, const char *want)
{
	char *s = tstack_text("SELECT state FROM workflows WHERE id = $1", wf);

	cr_assert_str_eq(s, want, "workflow %s", wf);
	free(s);
}

/* The event types of wf in the outbox, in seq order, one space apart. */
static char *outbox_types(const char *wf)
{
	return tstack_text("SELECT string_agg(type, ' ' ORDER BY seq) FROM outbox"
	                   " WHERE workflow_id = $1",
	                   wf);
}

static void expect_events(const char *wf, const char *want)
{
	char *o = outbox_types(wf);

	cr_assert_str_eq(o, want, "events of %s", wf);
	free(o);
}

/* The data of wf's only event of type, as jsonb text. */
static char *event_data(const char *wf, const char *type)
{
	cr_assert_eq(tstack_count("SELECT count(*) FROM outbox WHERE workflow_id = $1"
	                          " AND type = $2",
	                          wf, type),
	             1, "one %s event of %s", type, wf);
	return tstack_text("SELECT (payload::jsonb -> 'data')::text FROM outbox"
	                   " WHERE workflow_id = $1 AND type = $2",
	                   wf, type);
}

static void expect_event_data(const char *wf, const char *type, const char *want)
{
	char *d = event_data(wf, type);

	cr_assert_str_eq(d, want, "%s of %s", type, wf);
	free(d);
}

/* JSON value v at path of json, as jsonb text, compared with want. */
static void expect_json(const char *json, const char *path, const char *want)
{
	char *v = tstack_text("SELECT ($1::jsonb #> $2::text[])::text", json, path);

	cr_assert_not_null(v, "%s in %s", path, json);
	cr_assert_str_eq(v, want, "%s in %s", path, json);
	free(v);
}

/* s in double quotes, in a static buffer. */
static const char *quoted(const char *s)
{
	static char q[64];

	snprintf(q, sizeof(q), "\"%s\"", s);
	return q;
}

/* Everything the tenant has written, to prove a refusal changed nothing. */
static char *tenant_snapshot(const struct tstack_tenant *t)
{
	return tstack_text(
	    "SELECT (SELECT coalesce(string_agg(state || last_seq, ',' ORDER BY id), '')"
	    "          FROM workflows WHERE tenant_id = $1) || '/' ||"
	    "       (SELECT count(*) FROM outbox WHERE tenant_id = $1) || '/' ||"
	    "       (SELECT count(*) FROM jobs WHERE tenant_id = $1)",
	    t->id_text);
}

/* reserve (undone by release), charge (undone by refund), ship. */
static const char SAGA[] = "{\"type\":\"order\",\"input\":{\"order\":7},\"steps\":["
                           "{\"name\":\"reserve\",\"job_type\":\"%s-reserve\","
                           "\"compensate\":{\"job_type\":\"%s-release\"}},"
                           "{\"name\":\"charge\",\"job_type\":\"%s-charge\","
                           "\"compensate\":{\"job_type\":\"%s-refund\",\"retries\":%d}},"
                           "{\"name\":\"ship\",\"job_type\":\"%s-ship\"}]}";

static char *create_saga(const struct tstack_tenant *t, const char *p, int refund_retries)
{
	char body[1024];

	snprintf(body, sizeof(body), SAGA, p, p, p, p, refund_retries, p);
	return tstack_create(t, body);
}

static char *key_of(const char *wf, char kind, int step)
{
	char *k = malloc(64);

	cr_assert_not_null(k);
	snprintf(k, 64, "%s.%c%d", wf, kind, step);
	return k;
}

/* Run steps 1 and 2 of a SAGA to completion, and activate step 3. */
static void run_to_ship(const struct tstack_tenant *t, const char *p, const char *wf)
{
	char type[64], *k, *job;

	snprintf(type, sizeof(type), "%s-reserve", p);
	k = key_of(wf, 's', 1);
	free(activate_key(t, type, "w", k));
	finish(t, k, "complete", "{\"worker\":\"w\",\"output\":{\"hold\":\"H1\"}}", "completed");
	free(k);
	snprintf(type, sizeof(type), "%s-charge", p);
	k = key_of(wf, 's', 2);
	job = activate_key(t, type, "w", k);
	expect_json(job, "{steps}", "{\"reserve\": {\"hold\": \"H1\"}}");
	free(job);
	finish(t, k, "complete", "{\"worker\":\"w\",\"output\":{\"payment\":\"P9\"}}", "completed");
	free(k);
	snprintf(type, sizeof(type), "%s-ship", p);
	k = key_of(wf, 's', 3);
	free(activate_key(t, type, "w", k));
	free(k);
}

/* --- The saga ------------------------------------------------------------ */

Test(saga, a_failed_third_step_undoes_the_second_then_the_first_each_once)
{
	struct tstack_tenant t;
	char *wf, *job, *k, *v;

	tstack_tenant_create(&t, "saga");
	wf = create_saga(&t, "a", 0);
	run_to_ship(&t, "a", wf);
	k = key_of(wf, 's', 3);
	finish(&t, k, "fail", "{\"worker\":\"w\",\"error\":\"no courier\"}", "failed");
	free(k);

	/* Not failed: compensating, the refund first, and only it. */
	expect_state(wf, "compensating");
	cr_assert_eq(tstack_count("SELECT count(*) FROM workflows WHERE id = $1"
	                          " AND ended_at IS NULL AND step = 3",
	                          wf),
	             1);
	expect_event_data(wf, "compensation.started",
	                  "{\"from\": \"failed\", \"step\": 3, \"error\": \"no courier\", "
	                  "\"state\": \"compensating\", \"steps\": [2, 1]}");
	expect_no_job(&t, "a-release");
	k = key_of(wf, 'c', 2);
	job = activate_key(&t, "a-refund", "u", k);
	expect_json(job, "{step}", "2");
	expect_json(job, "{name}", "\"charge\"");
	expect_json(job, "{job_type}", "\"a-refund\"");
	expect_json(job, "{input}", "{\"order\": 7}");
	expect_json(job, "{steps}", "{\"reserve\": {\"hold\": \"H1\"}}");
	{
		char want[256];
		snprintf(want, sizeof(want),
		         "{\"key\": \"%s.s2\", \"name\": \"charge\", \"step\": 2, "
		         "\"output\": {\"payment\": \"P9\"}}",
		         wf);
		expect_json(job, "{compensates}", want);
	}
	free(job);
	expect_no_job(&t, "a-release");
	{
		/* Listed by its state. */
		struct http_response *r = tstack_get(&t, "/v1/workflows?state=compensating");
		tstack_expect_status(r, 200);
		expect_json(r->body, "{workflows,0,id}", quoted(wf));
		expect_json(r->body, "{workflows,0,state}", "\"compensating\"");
		http_response_free(r);
	}
	finish(&t, k, "complete", "{\"worker\":\"u\",\"output\":{\"refund\":\"R1\"}}", "completed");
	/* The same completion again is a replay, not a second undo. */
	finish(&t, k, "complete", "{\"worker\":\"u\",\"output\":{\"refund\":\"R1\"}}", "completed");
	expect_no_job(&t, "a-refund");
	free(k);

	k = key_of(wf, 'c', 1);
	job = activate_key(&t, "a-release", "u", k);
	expect_json(job, "{steps}", "{}");
	{
		char want[256];
		snprintf(want, sizeof(want),
		         "{\"key\": \"%s.s1\", \"name\": \"reserve\", \"step\": 1, "
		         "\"output\": {\"hold\": \"H1\"}}",
		         wf);
		expect_json(job, "{compensates}", want);
	}
	free(job);
	finish(&t, k, "complete", "{\"worker\":\"u\",\"output\":{}}", "completed");
	free(k);

	expect_state(wf, "compensated");
	cr_assert_eq(tstack_count("SELECT count(*) FROM workflows WHERE id = $1"
	                          " AND ended_at IS NOT NULL",
	                          wf),
	             1);
	expect_events(wf, "workflow.created workflow.started job.completed job.completed "
	                  "job.failed compensation.started step.compensated step.compensated "
	                  "workflow.compensated");
	v = tstack_text("SELECT string_agg(payload::jsonb #>> '{data,step}', ',' ORDER BY seq)"
	                "  FROM outbox WHERE workflow_id = $1 AND type = 'step.compensated'",
	                wf);
	cr_assert_str_eq(v, "2,1");
	free(v);
	v = tstack_text("SELECT (payload::jsonb -> 'data')::text FROM outbox"
	                " WHERE workflow_id = $1 AND type = 'step.compensated'"
	                " ORDER BY seq LIMIT 1",
	                wf);
	cr_assert_str_eq(v, "{\"name\": \"charge\", \"step\": 2, \"output\": {\"refund\": "
	                    "\"R1\"}, \"worker\": \"u\", \"job_type\": \"a-refund\"}");
	free(v);
	expect_event_data(wf, "workflow.compensated",
	                  "{\"from\": \"failed\", \"state\": \"compensated\"}");
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1 AND step < 0"
	                          " AND state = 'completed' AND activations = 1",
	                          wf),
	             2);
	/* Ended: no cancel, no resume, no more jobs. */
	{
		struct http_response *r = cancel(&t, wf);
		tstack_expect_status(r, 422);
		http_response_free(r);
	}
	expect_no_job(&t, "a-release");
	expect_no_job(&t, "a-refund");
	{
		struct http_response *r = tstack_get(&t, "/v1/workflows?state=compensated");
		tstack_expect_status(r, 200);
		expect_json(r->body, "{workflows,0,id}", quoted(wf));
		http_response_free(r);
	}
	free(wf);
}

Test(saga, without_a_completed_compensable_step_failure_and_cancel_are_as_before)
{
	struct tstack_tenant t;
	struct http_response *r;
	char *wf, *k;

	tstack_tenant_create(&t, "plain");
	/* The first step fails: nothing completed, nothing to undo. */
	wf = create_saga(&t, "p", 0);
	k = key_of(wf, 's', 1);
	free(activate_key(&t, "p-reserve", "w", k));
	finish(&t, k, "fail", "{\"worker\":\"w\",\"error\":\"gone\"}", "failed");
	expect_state(wf, "failed");
	expect_events(wf, "workflow.created workflow.started job.failed workflow.failed");
	cr_assert_eq(
	    tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1 AND step < 0", wf), 0);
	free(k);
	free(wf);

	/* Cancelled while its first step is active: that step never
	 * completed, so it is not undone; its worker is told so. */
	wf = create_saga(&t, "p", 0);
	k = key_of(wf, 's', 1);
	free(activate_key(&t, "p-reserve", "w", k));
	r = cancel(&t, wf);
	tstack_expect_status(r, 200);
	http_response_free(r);
	expect_state(wf, "cancelled");
	expect_events(wf, "workflow.created workflow.started workflow.cancelled");
	r = job_post(&t, k, "complete", "{\"worker\":\"w\",\"output\":{}}");
	cr_assert_eq(r->status, 409, "%s", r->body);
	http_response_free(r);
	expect_no_job(&t, "p-release");
	free(k);
	free(wf);
}

Test(saga, a_timed_out_wait_after_a_compensable_step_compensates_it)
{
	struct tstack_tenant t;
	char out[256], *wf, *k;

	tstack_tenant_create(&t, "tmo");
	wf = tstack_create(&t, "{\"type\":\"tw\",\"steps\":["
	                       "{\"name\":\"book\",\"job_type\":\"tw-book\","
	                       "\"compensate\":{\"job_type\":\"tw-unbook\"}},"
	                       "{\"name\":\"confirm\",\"wait_for\":\"ok\",\"timeout\":\"PT1S\"}]}");
	k = key_of(wf, 's', 1);
	free(activate_key(&t, "tw-book", "w", k));
	finish(&t, k, "complete", "{\"worker\":\"w\",\"output\":{\"b\":1}}", "completed");
	free(k);
	tstack_sleep_ms(1300);
	cr_assert_eq(tstack_cli(out, sizeof(out), "reap", NULL), 0, "reap: %s",
	             tstack_cli_stderr());
	expect_state(wf, "compensating");
	expect_event_data(wf, "compensation.started",
	                  "{\"from\": \"failed\", \"step\": 2, \"error\": \"timed out\", "
	                  "\"state\": \"compensating\", \"steps\": [1]}");
	k = key_of(wf, 'c', 1);
	free(activate_key(&t, "tw-unbook", "u", k));
	finish(&t, k, "complete", "{\"worker\":\"u\",\"output\":{}}", "completed");
	free(k);
	expect_state(wf, "compensated");
	expect_events(wf, "workflow.created workflow.started job.completed step.timed_out "
	                  "compensation.started step.compensated workflow.compensated");
	free(wf);
}

/* A workflow parked in incident by a step's own job (not during its
 * compensation) may be cancelled: its completed steps are undone. */
Test(saga, a_cancel_of_an_incident_undoes_the_completed_steps)
{
	struct tstack_tenant t;
	struct http_response *r;
	char *wf, *k;

	tstack_tenant_create(&t, "cinc2");
	wf = tstack_create(&t,
	                   "{\"type\":\"ci\",\"steps\":["
	                   "{\"name\":\"a\",\"job_type\":\"ci-a\","
	                   "\"compensate\":{\"job_type\":\"ci-u\"}},"
	                   "{\"name\":\"b\",\"job_type\":\"ci-b\",\"on_failure\":\"incident\"}]}");
	k = key_of(wf, 's', 1);
	free(activate_key(&t, "ci-a", "w", k));
	finish(&t, k, "complete", "{\"worker\":\"w\",\"output\":{\"a\":1}}", "completed");
	free(k);
	k = key_of(wf, 's', 2);
	free(activate_key(&t, "ci-b", "w", k));
	finish(&t, k, "fail", "{\"worker\":\"w\",\"error\":\"x\"}", "failed");
	free(k);
	expect_state(wf, "incident");
	r = cancel(&t, wf);
	tstack_expect_status(r, 200);
	expect_json(r->body, "{state}", "\"compensating\"");
	http_response_free(r);
	expect_event_data(wf, "compensation.started",
	                  "{\"from\": \"cancelled\", \"step\": null, \"error\": null, "
	                  "\"state\": \"compensating\", \"steps\": [1]}");
	k = key_of(wf, 'c', 1);
	free(activate_key(&t, "ci-u", "u", k));
	finish(&t, k, "complete", "{\"worker\":\"u\",\"output\":{}}", "completed");
	free(k);
	expect_state(wf, "compensated");
	expect_events(wf, "workflow.created workflow.started job.completed job.failed "
	                  "workflow.incident compensation.started step.compensated "
	                  "workflow.compensated");
	free(wf);
}

/* --- Cancel racing the last completion ------------------------------------ */

struct racer {
	const struct tstack_tenant *t;
	char path[160];
	const char *body;
	struct http_response *resp;
};

static void *racer_run(void *arg)
{
	struct racer *r = arg;

	r->resp = tstack_post_raw(r->t, r->path, NULL, r->body);
	return NULL;
}

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
	double deadline = tstack_now() + 10;
	long got;

	while ((got = waiting_behind(holder)) < n && tstack_now() < deadline)
		tstack_sleep_ms(10);
	cr_assert_eq(got, n, "%ld requests waiting on the workflow's lock, want %ld", got, n);
}

#define RACE_ROUNDS 4

/*
 * The completion of the last step and the cancel both lock the workflow
 * first. Holding that lock here, sending one, seeing it wait, then the
 * other, and letting go puts them in the chosen order.
 */
Test(saga, cancel_racing_the_last_completion_in_both_orders)
{
	struct tstack_tenant t;

	tstack_tenant_create(&t, "race");
	for (int i = 0; i < RACE_ROUNDS; i++) {
		const int cancel_first = i % 2 == 0;
		char *wf = create_saga(&t, "r", 0), *k3 = key_of(wf, 's', 3);
		struct racer c = { &t, "", "{\"worker\":\"w\",\"output\":{\"ship\":1}}", NULL };
		struct racer x = { &t, "", "{\"to\":\"cancelled\"}", NULL };
		struct racer *first = cancel_first ? &x : &c, *second = cancel_first ? &c : &x;
		pthread_t a, b;
		PGconn *hold;

		run_to_ship(&t, "r", wf);
		snprintf(c.path, sizeof(c.path), "/v1/jobs/%s/complete", k3);
		snprintf(x.path, sizeof(x.path), "/v1/workflows/%s/transitions", wf);
		hold = tstack_db_connect();
		tstack_exec(hold, "BEGIN");
		tstack_exec(hold, "SELECT 1 FROM workflows WHERE id = $1 FOR UPDATE", wf);
		pthread_create(&a, NULL, racer_run, first);
		wait_behind(hold, 1);
		pthread_create(&b, NULL, racer_run, second);
		wait_behind(hold, 2);
		tstack_exec(hold, "ROLLBACK");
		PQfinish(hold);
		pthread_join(a, NULL);
		pthread_join(b, NULL);
		cr_assert_not_null(c.resp);
		cr_assert_not_null(x.resp);

		if (cancel_first) {
			/* The cancel took the active step 3 with it: its
			 * completion is refused, and steps 2 and 1 are undone. */
			tstack_expect_status(x.resp, 200);
			tstack_expect_problem(c.resp, 409, "/problems/job-not-active", c.path);
			expect_state(wf, "compensating");
			expect_event_data(
			    wf, "compensation.started",
			    "{\"from\": \"cancelled\", \"step\": null, \"error\": null, "
			    "\"state\": \"compensating\", \"steps\": [2, 1]}");
			char *k = key_of(wf, 'c', 2);
			free(activate_key(&t, "r-refund", "u", k));
			finish(&t, k, "complete", "{\"worker\":\"u\",\"output\":{}}", "completed");
			free(k);
			k = key_of(wf, 'c', 1);
			free(activate_key(&t, "r-release", "u", k));
			finish(&t, k, "complete", "{\"worker\":\"u\",\"output\":{}}", "completed");
			free(k);
			expect_state(wf, "compensated");
			expect_events(wf, "workflow.created workflow.started job.completed "
			                  "job.completed compensation.started step.compensated "
			                  "step.compensated workflow.compensated");
			expect_event_data(wf, "workflow.compensated",
			                  "{\"from\": \"cancelled\", \"state\": \"compensated\"}");
			cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1"
			                          " AND step = 3 AND state = 'cancelled'",
			                          wf),
			             1);
		} else {
			/* Completed first: it ended, and the cancel is refused. */
			tstack_expect_status(c.resp, 200);
			tstack_expect_problem(x.resp, 422, "/problems/invalid-transition", x.path);
			expect_state(wf, "completed");
			expect_events(wf, "workflow.created workflow.started job.completed "
			                  "job.completed job.completed workflow.completed");
		}
		cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1"
		                          " AND step < 0",
		                          wf),
		             cancel_first ? 2 : 0);
		expect_no_job(&t, "r-refund");
		expect_no_job(&t, "r-release");
		http_response_free(c.resp);
		http_response_free(x.resp);
		free(k3);
		free(wf);
	}
}

/* --- A compensation in incident ------------------------------------------- */

Test(saga, a_compensating_job_out_of_retries_parks_in_incident_and_a_resume_finishes)
{
	struct tstack_tenant t;
	struct http_response *r;
	char path[160], tpath[160], *wf, *k, *before, *after, *v;

	tstack_tenant_create(&t, "cinc");
	wf = create_saga(&t, "i", 1);
	run_to_ship(&t, "i", wf);
	k = key_of(wf, 's', 3);
	finish(&t, k, "fail", "{\"worker\":\"w\",\"error\":\"no courier\"}", "failed");
	free(k);

	/* The refund fails twice (one retry): incident, whatever
	 * on_failure says (the step has none: "fail"). */
	k = key_of(wf, 'c', 2);
	v = activate_key(&t, "i-refund", "u", k);
	expect_json(v, "{retries_left}", "1");
	free(v);
	finish(&t, k, "fail", "{\"worker\":\"u\",\"error\":\"bank down\"}", "activatable");
	free(activate_key(&t, "i-refund", "u", k));
	finish(&t, k, "fail", "{\"worker\":\"u\",\"error\":\"bank still down\"}", "failed");
	expect_state(wf, "incident");
	expect_no_job(&t, "i-refund");
	expect_no_job(&t, "i-release");
	v = tstack_text("SELECT string_agg((payload::jsonb -> 'data')::text, ' | ' ORDER BY seq)"
	                "  FROM outbox WHERE workflow_id = $1 AND type = 'job.failed'"
	                "   AND payload::jsonb #> '{data,compensation}' = 'true'",
	                wf);
	cr_assert_str_eq(v, "{\"name\": \"charge\", \"step\": 2, \"error\": \"bank down\", "
	                    "\"worker\": \"u\", \"retrying\": true, \"compensation\": true, "
	                    "\"retries_left\": 0} | {\"name\": \"charge\", \"step\": 2, \"error\": "
	                    "\"bank still down\", \"worker\": \"u\", \"retrying\": false, "
	                    "\"compensation\": true, \"retries_left\": 0}");
	free(v);
	expect_event_data(wf, "workflow.incident",
	                  "{\"name\": \"charge\", \"step\": 2, \"error\": \"bank still down\", "
	                  "\"state\": \"incident\", \"compensation\": true}");

	/* A cancel now is refused and changes nothing. */
	before = tenant_snapshot(&t);
	r = cancel(&t, wf);
	snprintf(tpath, sizeof(tpath), "/v1/workflows/%s/transitions", wf);
	tstack_expect_problem(r, 409, "/problems/state-conflict", tpath);
	v = tstack_json(r->body, "{detail}");
	cr_assert(strstr(v, "undoing its completed steps") != NULL, "%s", v);
	free(v);
	http_response_free(r);
	after = tenant_snapshot(&t);
	cr_assert_str_eq(after, before);
	free(after);
	free(before);

	/* The resume hands the same job out again with fresh retries. */
	snprintf(path, sizeof(path), "/v1/workflows/%s/resume", wf);
	r = tstack_post(&t, path, NULL, "{\"retries\":2}");
	tstack_expect_status(r, 200);
	v = tstack_json(r->body, "{state}");
	cr_assert_str_eq(v, "compensating", "%s", r->body);
	free(v);
	http_response_free(r);
	expect_event_data(wf, "workflow.resumed",
	                  "{\"from\": \"incident\", \"step\": 2, \"state\": \"compensating\", "
	                  "\"retries\": 2, \"compensation\": true}");
	v = activate_key(&t, "i-refund", "u2", k);
	expect_json(v, "{retries_left}", "2");
	expect_json(v, "{activations}", "3");
	free(v);
	/* Its worker extends its lease like any job's. */
	r = job_post(&t, k, "heartbeat", "{\"worker\":\"u2\",\"lease_seconds\":60}");
	cr_assert_not_null(r);
	tstack_expect_status(r, 200);
	expect_json(r->body, "{key}", quoted(k));
	expect_json(r->body, "{step}", "2");
	http_response_free(r);
	/* A cancel while compensating is refused too. */
	r = cancel(&t, wf);
	tstack_expect_problem(r, 409, "/problems/state-conflict", tpath);
	http_response_free(r);
	finish(&t, k, "complete", "{\"worker\":\"u2\",\"output\":{\"refund\":\"R2\"}}",
	       "completed");
	free(k);
	k = key_of(wf, 'c', 1);
	free(activate_key(&t, "i-release", "u2", k));
	finish(&t, k, "complete", "{\"worker\":\"u2\",\"output\":{}}", "completed");
	free(k);
	expect_state(wf, "compensated");
	expect_events(wf, "workflow.created workflow.started job.completed job.completed "
	                  "job.failed compensation.started job.failed job.failed "
	                  "workflow.incident workflow.resumed step.compensated step.compensated "
	                  "workflow.compensated");
	cr_assert_eq(
	    tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1 AND step < 0", wf), 2);
	free(wf);
}

/* --- Two reapers and two workers -------------------------------------------- */

#define FLEET 24

struct fleet {
	const struct tstack_tenant *t;
	double until;
	volatile int stop;
	int id;
	long abandoned, completed;
};

/* The first column of the first row of sql with text parameters a and b
 * (b may be NULL) on conn, malloc'ed; NULL on SQL NULL or an error. A
 * thread's own connection: the process's one is not shared. */
static char *conn_text(PGconn *conn, const char *sql, const char *a, const char *b)
{
	const char *params[2] = { a, b };
	PGresult *res = PQexecParams(conn, sql, b != NULL ? 2 : 1, NULL, params, NULL, NULL, 0);
	char *v = NULL;

	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 &&
	    !PQgetisnull(res, 0, 0))
		v = strdup(PQgetvalue(res, 0, 0));
	PQclear(res);
	return v;
}

/* A worker: takes "f-undo" jobs with a 1 s lease and completes them, except
 * the first activation of every third workflow's jobs, which it drops (its
 * lease runs out and the job is handed out again). */
static void *fleet_worker(void *arg)
{
	struct fleet *f = arg;
	PGconn *conn = PQconnectdb(tstack_env("DATABASE_URL"));
	char worker[16], body[256];

	snprintf(worker, sizeof(worker), "w%d", f->id);
	snprintf(body, sizeof(body),
	         "{\"job_type\":\"f-undo\",\"worker\":\"%s\",\"max_jobs\":3,"
	         "\"lease_seconds\":1}",
	         worker);
	while (PQstatus(conn) == CONNECTION_OK && !f->stop && tstack_now() < f->until) {
		struct http_response *r = tstack_post_raw(f->t, "/v1/jobs/activate", NULL, body);
		long n = 0;
		char *count;

		if (r == NULL || r->status != 200) {
			http_response_free(r);
			tstack_sleep_ms(50);
			continue;
		}
		count = conn_text(conn, "SELECT jsonb_array_length($1::jsonb -> 'jobs')", r->body,
		                  NULL);
		n = count != NULL ? atol(count) : 0;
		free(count);
		for (long i = 0; i < n; i++) {
			char idx[24], *key, *drop, done[256];
			struct http_response *c;

			snprintf(idx, sizeof(idx), "%ld", i);
			key = conn_text(conn, "SELECT $1::jsonb -> 'jobs' -> $2::int ->> 'key'",
			                r->body, idx);
			/* Its first activation, in a workflow whose i % 3 = 0. */
			drop = conn_text(
			    conn,
			    "SELECT ($1::jsonb -> 'jobs' -> $2::int ->> 'activations') = '1'"
			    "   AND (SELECT (input ->> 'i')::int % 3 = 0 FROM workflows"
			    "         WHERE id = split_part($1::jsonb -> 'jobs' -> $2::int ->> 'key',"
			    "                               '.', 1)::uuid)",
			    r->body, idx);
			if (key == NULL || drop == NULL) {
				free(key);
				free(drop);
				continue;
			}
			if (strcmp(drop, "t") == 0) {
				f->abandoned++;
			} else {
				snprintf(done, sizeof(done),
				         "{\"worker\":\"%s\",\"output\":{\"by\":\"%s\"}}", worker,
				         worker);
				c = job_post(f->t, key, "complete", done);
				f->completed += c != NULL && c->status == 200;
				http_response_free(c);
			}
			free(drop);
			free(key);
		}
		http_response_free(r);
		if (n == 0)
			tstack_sleep_ms(100);
	}
	PQfinish(conn);
	return NULL;
}

static void *fleet_reaper(void *arg)
{
	struct fleet *f = arg;
	char out[128];

	while (!f->stop && tstack_now() < f->until) {
		tstack_cli(out, sizeof(out), "reap", NULL);
		tstack_sleep_ms(300);
	}
	return NULL;
}

/*
 * FLEET sagas of four steps, "a" to "d"; "a", "b" and "d" have a
 * compensating job of type f-undo, "c" has none. By i % 4: 0, step "d"
 * fails (undo b, a); 1, cancelled while "c" is active (undo b, a; c was
 * never completed); 2, cancelled while "b" is active (undo a); 3, runs to
 * the end (nothing to undo). Then two workers and two reapers: every
 * compensable completed step is undone exactly once, latest first.
 */
Test(saga, two_reapers_and_two_workers_undo_each_completed_step_once)
{
	struct tstack_tenant t;
	char *wfs[FLEET];
	struct fleet w[2], rp[2];
	pthread_t tw[2], tr[2];
	char *k;

	tstack_tenant_create(&t, "fleet");
	for (int i = 0; i < FLEET; i++) {
		char body[768];
		int upto;

		snprintf(body, sizeof(body),
		         "{\"type\":\"fleet\",\"input\":{\"i\":%d},\"steps\":["
		         "{\"name\":\"a\",\"job_type\":\"f-a\",\"compensate\":{\"job_type\":"
		         "\"f-undo\",\"retries\":3}},"
		         "{\"name\":\"b\",\"job_type\":\"f-b\",\"compensate\":{\"job_type\":"
		         "\"f-undo\",\"retries\":3}},"
		         "{\"name\":\"c\",\"job_type\":\"f-c\"},"
		         "{\"name\":\"d\",\"job_type\":\"f-d\",\"compensate\":{\"job_type\":"
		         "\"f-undo\"}}]}",
		         i);
		wfs[i] = tstack_create(&t, body);
		upto = i % 4 == 2 ? 2 : i % 4 == 1 ? 3 : 4;
		for (int s = 1; s <= upto; s++) {
			char type[16];
			snprintf(type, sizeof(type), "f-%c", 'a' + s - 1);
			k = key_of(wfs[i], 's', s);
			free(activate_key(&t, type, "setup", k));
			if (s < upto || i % 4 == 3)
				finish(&t, k, "complete", "{\"worker\":\"setup\",\"output\":{}}",
				       "completed");
			else if (i % 4 == 0)
				finish(&t, k, "fail", "{\"worker\":\"setup\",\"error\":\"x\"}",
				       "failed");
			free(k);
		}
		if (i % 4 == 1 || i % 4 == 2) {
			struct http_response *r = cancel(&t, wfs[i]);
			tstack_expect_status(r, 200);
			http_response_free(r);
		}
	}

	for (int i = 0; i < 2; i++) {
		w[i] = (struct fleet){ &t, tstack_now() + 90, 0, i, 0, 0 };
		rp[i] = (struct fleet){ &t, tstack_now() + 90, 0, i, 0, 0 };
		pthread_create(&tw[i], NULL, fleet_worker, &w[i]);
		pthread_create(&tr[i], NULL, fleet_reaper, &rp[i]);
	}
	{
		double deadline = tstack_now() + 90;
		while (tstack_count("SELECT count(*) FROM workflows WHERE tenant_id = $1"
		                    " AND state = 'compensating'",
		                    t.id_text) > 0 &&
		       tstack_now() < deadline)
			tstack_sleep_ms(200);
	}
	for (int i = 0; i < 2; i++) {
		w[i].stop = rp[i].stop = 1;
		pthread_join(tw[i], NULL);
		pthread_join(tr[i], NULL);
	}
	cr_assert(w[0].abandoned + w[1].abandoned > 0, "no lease ran out");
	cr_assert(w[0].completed > 0 && w[1].completed > 0, "both workers completed: %ld %ld",
	          w[0].completed, w[1].completed);

	for (int i = 0; i < FLEET; i++) {
		const char *want_state = i % 4 == 3 ? "completed" : "compensated";
		const char *want_steps = i % 4 == 2 ? "1" : i % 4 == 3 ? "" : "2,1";
		char *got;

		expect_state(wfs[i], want_state);
		got = tstack_text(
		    "SELECT coalesce(string_agg(payload::jsonb #>> '{data,step}', ',' ORDER BY seq),"
		    "                '')"
		    "  FROM outbox WHERE workflow_id = $1 AND type = 'step.compensated'",
		    wfs[i]);
		cr_assert_str_eq(got, want_steps, "steps undone in workflow %d (%s)", i, wfs[i]);
		free(got);
		got =
		    tstack_text("SELECT coalesce(string_agg((-step)::text, ',' ORDER BY step), '')"
		                "  FROM jobs WHERE workflow_id = $1 AND step < 0"
		                "   AND state = 'completed'",
		                wfs[i]);
		cr_assert_str_eq(got,
		                 i % 4 == 2   ? "1"
		                 : i % 4 == 3 ? ""
		                              : "2,1",
		                 "compensating jobs of workflow %d", i);
		free(got);
		cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1"
		                          " AND step < 0",
		                          wfs[i]),
		             i % 4 == 2   ? 1
		             : i % 4 == 3 ? 0
		                          : 2);
		cr_assert_eq(tstack_count("SELECT count(*) FROM outbox WHERE workflow_id = $1"
		                          " AND type IN ('compensation.started',"
		                          "              'workflow.compensated')",
		                          wfs[i]),
		             i % 4 == 3 ? 0 : 2);
		free(wfs[i]);
	}
}

/* --- Definitions refused ----------------------------------------------------- */

Test(saga, bad_compensate_definitions_are_refused_and_nothing_is_stored)
{
	static const struct {
		const char *step;
		const char *detail;
	} cases[] = {
		{ "{\"name\":\"w\",\"wait_for\":\"m\",\"compensate\":{\"job_type\":\"u\"}}",
		  "step 2: only a job step has \"compensate\": a wait or a timer has nothing to "
		  "undo" },
		{ "{\"name\":\"s\",\"sleep\":\"PT1S\",\"compensate\":{\"job_type\":\"u\"}}",
		  "step 2: only a job step has \"compensate\": a wait or a timer has nothing to "
		  "undo" },
		{ "{\"name\":\"j\",\"job_type\":\"t\",\"compensate\":{\"job_type\":\"u\","
		  "\"priority\":1}}",
		  "step 2: \"compensate\": unknown member \"priority\": expected job_type, "
		  "retries" },
		{ "{\"name\":\"j\",\"job_type\":\"t\",\"compensate\":{\"job_type\":\"u\","
		  "\"retries\":101}}",
		  NULL },
		{ "{\"name\":\"j\",\"job_type\":\"t\",\"compensate\":{\"job_type\":\"u\","
		  "\"retries\":-1}}",
		  NULL },
		{ "{\"name\":\"j\",\"job_type\":\"t\",\"compensate\":{\"job_type\":\"u\","
		  "\"retries\":\"2\"}}",
		  NULL },
		{ "{\"name\":\"j\",\"job_type\":\"t\",\"compensate\":{\"retries\":1}}", NULL },
		{ "{\"name\":\"j\",\"job_type\":\"t\",\"compensate\":\"refund\"}",
		  "step 2: \"compensate\" must be an object {\"job_type\": ..., \"retries\": ...}" },
	};
	struct tstack_tenant t;

	tstack_tenant_create(&t, "bad");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char body[512], key[96], *detail;
		struct http_response *r;

		snprintf(body, sizeof(body),
		         "{\"type\":\"b\",\"steps\":[{\"name\":\"a\",\"job_type\":\"a\"},%s]}",
		         cases[i].step);
		tstack_key(key, sizeof(key), "bad");
		r = tstack_post(&t, "/v1/workflows", key, body);
		tstack_expect_problem(r, 422, "/problems/invalid-workflow", "/v1/workflows");
		detail = tstack_json(r->body, "{detail}");
		if (cases[i].detail != NULL)
			cr_assert_str_eq(detail, cases[i].detail, "case %zu", i);
		else
			cr_assert(strncmp(detail, "step 2: \"compensate\": ", 22) == 0,
			          "case %zu: %s", i, detail);
		free(detail);
		http_response_free(r);
	}
	tstack_expect_counts(&t, 0, 0, 0);
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE tenant_id = $1", t.id_text), 0);
}
