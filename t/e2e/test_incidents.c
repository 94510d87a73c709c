/*
 * End-to-end tests of incidents (a step's "on_failure": "incident") and of
 * POST /v1/workflows/{id}/resume, through nginx and the worker pool: a job
 * that exhausts its retries parks its workflow in incident with its events
 * in order in the history and the outbox; a resume makes the job
 * activatable again with fresh retries and the workflow goes on; keyed
 * resumes replay; resumes of workflows that are not in incident (nor
 * failed at a resumable step) are refused; GET /v1/workflows?state=
 * incident lists them and GET /metrics counts them; another tenant sees
 * none of it.
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

/*
 * Settings of its own (TSTACK_SETTINGS): idempotency_wait, which is also
 * every worker's lock_timeout, is 10 s, not the harness's 1 s, a window
 * too short on a loaded machine: concurrent resumes wait on one workflow's row.
 */
TSTACK_SETTINGS("idempotency_wait = 10s\n")

TestSuite(incidents, .timeout = 90);

/* --- Helpers ----------------------------------------------------------- */

/* Activate one job of type for worker and expect it to be workflow wf's
 * step (its retries_left returned). */
static long activate_one(const struct tstack_tenant *t, const char *type, const char *worker,
                         const char *wf, int step)
{
	char body[256], want[64], *got, *n;
	struct http_response *r;
	long retries;

	snprintf(body, sizeof(body), "{\"job_type\":\"%s\",\"worker\":\"%s\"}", type, worker);
	r = tstack_post(t, "/v1/jobs/activate", NULL, body);
	tstack_expect_status(r, 200);
	n = tstack_text("SELECT jsonb_array_length($1::jsonb -> 'jobs')::text", r->body);
	cr_assert_str_eq(n, "1", "activation: %s", r->body);
	got = tstack_json(r->body, "{jobs,0,key}");
	snprintf(want, sizeof(want), "%s.s%d", wf, step);
	cr_assert_str_eq(got, want);
	free(got);
	got = tstack_json(r->body, "{jobs,0,retries_left}");
	retries = atol(got);
	free(got);
	free(n);
	http_response_free(r);
	return retries;
}

static void expect_no_job(const struct tstack_tenant *t, const char *type)
{
	char body[128];
	struct http_response *r;

	snprintf(body, sizeof(body), "{\"job_type\":\"%s\",\"worker\":\"x\"}", type);
	r = tstack_post(t, "/v1/jobs/activate", NULL, body);
	tstack_expect_status(r, 200);
	cr_assert_str_eq(r->body, "{\"jobs\":[]}");
	http_response_free(r);
}

static void finish(const struct tstack_tenant *t, const char *wf, int step, const char *verb,
                   const char *body, const char *want_state)
{
	char path[160], *v;
	struct http_response *r;

	snprintf(path, sizeof(path), "/v1/jobs/%s.s%d/%s", wf, step, verb);
	r = tstack_post(t, path, NULL, body);
	tstack_expect_status(r, 200);
	v = tstack_json(r->body, "{state}");
	cr_assert_str_eq(v, want_state, "%s: %s", path, r->body);
	free(v);
	http_response_free(r);
}

static struct http_response *resume(const struct tstack_tenant *t, const char *wf, const char *key,
                                    const char *body)
{
	char path[160];

	snprintf(path, sizeof(path), "/v1/workflows/%s/resume", wf);
	return tstack_post(t, path, key, body);
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

/* The same from the history route, as the tenant reads it. */
static char *history_types(const struct tstack_tenant *t, const char *wf)
{
	char path[160];
	struct http_response *r;
	char *types;

	snprintf(path, sizeof(path), "/v1/workflows/%s/events", wf);
	r = tstack_get(t, path);
	tstack_expect_status(r, 200);
	types = tstack_text("SELECT string_agg(e ->> 'type', ' ' ORDER BY (e ->> 'seq')::int)"
	                    "  FROM jsonb_array_elements($1::jsonb -> 'events') e",
	                    r->body);
	http_response_free(r);
	return types;
}

static void expect_events(const struct tstack_tenant *t, const char *wf, const char *want)
{
	char *o = outbox_types(wf), *h = history_types(t, wf);

	cr_assert_str_eq(o, want, "outbox of %s", wf);
	cr_assert_str_eq(h, want, "history of %s", wf);
	free(o);
	free(h);
}

/* Everything the tenant has written, to prove a refusal changed nothing. */
static char *tenant_snapshot(const struct tstack_tenant *t)
{
	return tstack_text(
	    "SELECT (SELECT coalesce(string_agg(state || last_seq, ',' ORDER BY id), '')"
	    "          FROM workflows WHERE tenant_id = $1) || '/' ||"
	    "       (SELECT count(*) FROM outbox WHERE tenant_id = $1) || '/' ||"
	    "       (SELECT coalesce(string_agg(state || coalesce(worker, '-') || activations"
	    "                                   || retries, ',' ORDER BY workflow_id, step), '')"
	    "          FROM jobs WHERE tenant_id = $1)",
	    t->id_text);
}

/* A payment step that goes to incident after one retry, then shipping. */
static const char PAY_FLOW[] =
    "{\"type\":\"pay\",\"business_key\":\"%s\",\"steps\":["
    "{\"name\":\"charge\",\"job_type\":\"%s\",\"retries\":1,\"on_failure\":\"incident\"},"
    "{\"name\":\"ship\",\"job_type\":\"%s-ship\"}]}";

static char *create_pay(const struct tstack_tenant *t, const char *bk, const char *type)
{
	char body[512];

	snprintf(body, sizeof(body), PAY_FLOW, bk, type, type);
	return tstack_create(t, body);
}

/* Fail step 1 of wf until its retries are used up (1 retry: two fails). */
static void exhaust(const struct tstack_tenant *t, const char *wf, const char *type)
{
	cr_assert_eq(activate_one(t, type, "w", wf, 1), 1);
	finish(t, wf, 1, "fail", "{\"worker\":\"w\",\"error\":\"card declined\"}", "activatable");
	cr_assert_eq(activate_one(t, type, "w", wf, 1), 0);
	finish(t, wf, 1, "fail", "{\"worker\":\"w\",\"error\":\"gateway down\"}", "failed");
}

/* --- The incident and the resume --------------------------------------- */

Test(incidents, exhausted_retries_park_the_workflow_and_a_resume_lets_it_go_on)
{
	struct tstack_tenant t;
	struct http_response *r, *again, *other;
	char path[160], key[96], *wf, *v;

	tstack_tenant_create(&t, "inc");
	wf = create_pay(&t, "O-1", "charge");
	exhaust(&t, wf, "charge");

	/* Parked, not failed: the step's job is failed, nothing comes next. */
	expect_state(wf, "incident");
	expect_events(&t, wf,
	              "workflow.created workflow.started job.failed job.failed workflow.incident");
	v = tstack_text("SELECT payload::jsonb ->> 'data' FROM outbox WHERE workflow_id = $1"
	                " AND type = 'workflow.incident'",
	                wf);
	cr_assert_str_eq(v, "{\"name\": \"charge\", \"step\": 1, \"error\": \"gateway down\", "
	                    "\"state\": \"incident\"}");
	free(v);
	cr_assert_eq(tstack_count("SELECT count(*) FROM workflows WHERE id = $1"
	                          " AND ended_at IS NULL",
	                          wf),
	             1, "an incident is not an end");
	expect_no_job(&t, "charge");
	expect_no_job(&t, "charge-ship");
	snprintf(path, sizeof(path), "/v1/workflows/%s", wf);
	r = tstack_get(&t, path);
	tstack_expect_status(r, 200);
	v = tstack_json(r->body, "{state}");
	cr_assert_str_eq(v, "incident");
	free(v);
	http_response_free(r);

	/* Resumed with 2 fresh retries, keyed: the answer is the workflow,
	 * running again at the failed step. */
	tstack_key(key, sizeof(key), "resume");
	snprintf(path, sizeof(path), "/v1/workflows/%s/resume", wf);
	r = resume(&t, wf, key, "{\"retries\":2}");
	tstack_expect_status(r, 200);
	v = tstack_json(r->body, "{state}");
	cr_assert_str_eq(v, "running");
	free(v);
	v = tstack_json(r->body, "{step}");
	cr_assert_str_eq(v, "1");
	free(v);
	/* The same key again: the stored answer, byte for byte. */
	again = resume(&t, wf, key, "{ \"retries\": 2 }");
	tstack_expect_status(again, 200);
	cr_assert_str_eq(again->body, r->body);
	tstack_expect_header(again, "Idempotent-Replayed", "true");
	/* Another key: the workflow is running, nothing to resume. */
	other = resume(&t, wf, NULL, "{\"retries\":2}");
	tstack_expect_problem(other, 409, "/problems/state-conflict", path);
	v = tstack_json(other->body, "{detail}");
	cr_assert_str_eq(v, "the workflow is running: only a workflow in incident, or a failed one "
	                    "whose failed step is resumable, can be resumed; nothing was changed");
	free(v);
	http_response_free(r);
	http_response_free(again);
	http_response_free(other);
	expect_state(wf, "running");
	expect_events(&t, wf,
	              "workflow.created workflow.started job.failed job.failed workflow.incident"
	              " workflow.resumed");
	v = tstack_text("SELECT payload::jsonb ->> 'data' FROM outbox WHERE workflow_id = $1"
	                " AND type = 'workflow.resumed'",
	                wf);
	cr_assert_str_eq(v, "{\"from\": \"incident\", \"step\": 1, \"state\": \"running\", "
	                    "\"retries\": 2}");
	free(v);

	/* The job is activatable with its fresh retries: one more failure is
	 * a retry, then it completes and the workflow goes on to the end. */
	cr_assert_eq(activate_one(&t, "charge", "w2", wf, 1), 2);
	finish(&t, wf, 1, "fail", "{\"worker\":\"w2\",\"error\":\"timeout\"}", "activatable");
	cr_assert_eq(activate_one(&t, "charge", "w2", wf, 1), 1);
	finish(&t, wf, 1, "complete", "{\"worker\":\"w2\",\"output\":{\"charged\":true}}",
	       "completed");
	cr_assert_eq(activate_one(&t, "charge-ship", "w3", wf, 2), 0);
	finish(&t, wf, 2, "complete", "{\"worker\":\"w3\"}", "completed");
	expect_state(wf, "completed");
	expect_events(
	    &t, wf,
	    "workflow.created workflow.started job.failed job.failed workflow.incident"
	    " workflow.resumed job.failed job.completed job.completed workflow.completed");
	cr_assert_eq(
	    tstack_count("SELECT activations FROM jobs WHERE workflow_id = $1 AND step = 1", wf),
	    4);
	free(wf);
}

Test(incidents, without_retries_the_resume_takes_the_steps_own_count)
{
	struct tstack_tenant t;
	struct http_response *r;
	char *wf;

	tstack_tenant_create(&t, "inc-default");
	wf = create_pay(&t, "O-2", "dflt");
	exhaust(&t, wf, "dflt");
	r = resume(&t, wf, NULL, "{}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	cr_assert_eq(activate_one(&t, "dflt", "w", wf, 1), 1, "the step says \"retries\": 1");
	free(wf);
}

/* --- Refusals ------------------------------------------------------------ */

Test(incidents, only_an_incident_or_a_resumable_failure_can_be_resumed)
{
	struct tstack_tenant t;
	struct http_response *r;
	char path[160], *pending, *running, *done, *cancelled, *failed, *v, *before, *after;
	const char *refused[4];

	tstack_tenant_create(&t, "inc-refuse");
	pending = tstack_create(
	    &t, "{\"type\":\"r\",\"steps\":[{\"name\":\"a\",\"job_type\":\"r-pending\"}]}");
	running = tstack_create(
	    &t, "{\"type\":\"r\",\"steps\":[{\"name\":\"a\",\"job_type\":\"r-running\"}]}");
	activate_one(&t, "r-running", "w", running, 1);
	done = tstack_create(
	    &t, "{\"type\":\"r\",\"steps\":[{\"name\":\"a\",\"job_type\":\"r-done\"}]}");
	activate_one(&t, "r-done", "w", done, 1);
	finish(&t, done, 1, "complete", "{\"worker\":\"w\"}", "completed");
	cancelled = tstack_create(
	    &t, "{\"type\":\"r\",\"steps\":[{\"name\":\"a\",\"job_type\":\"r-cancel\"}]}");
	snprintf(path, sizeof(path), "/v1/workflows/%s/transitions", cancelled);
	r = tstack_post(&t, path, NULL, "{\"to\":\"cancelled\"}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	/* Failed at a step without "resumable": true. */
	failed = tstack_create(
	    &t, "{\"type\":\"r\",\"steps\":[{\"name\":\"fragile\",\"job_type\":\"r-fail\"}]}");
	activate_one(&t, "r-fail", "w", failed, 1);
	finish(&t, failed, 1, "fail", "{\"worker\":\"w\"}", "failed");
	expect_state(failed, "failed");

	before = tenant_snapshot(&t);
	refused[0] = pending;
	refused[1] = running;
	refused[2] = done;
	refused[3] = cancelled;
	for (int i = 0; i < 4; i++) {
		char key[96];
		tstack_key(key, sizeof(key), "refused");
		snprintf(path, sizeof(path), "/v1/workflows/%s/resume", refused[i]);
		r = resume(&t, refused[i], key, "{\"retries\":1}");
		tstack_expect_problem(r, 409, "/problems/state-conflict", path);
		/* A refusal from the state found is stored under the key. */
		struct http_response *again = resume(&t, refused[i], key, "{\"retries\":1}");
		cr_assert_eq(again->status, 409);
		cr_assert_str_eq(again->body, r->body);
		tstack_expect_header(again, "Idempotent-Replayed", "true");
		http_response_free(again);
		http_response_free(r);
	}
	snprintf(path, sizeof(path), "/v1/workflows/%s/resume", failed);
	r = resume(&t, failed, NULL, "{}");
	tstack_expect_problem(r, 422, "/problems/invalid-transition", path);
	v = tstack_json(r->body, "{detail}");
	cr_assert_str_eq(v,
	                 "the workflow failed at step 1 (\"fragile\"), whose definition does not "
	                 "say \"resumable\": true; nothing was changed");
	free(v);
	http_response_free(r);

	/* Bad bodies and ids. */
	static const struct {
		const char *body;
		int status;
		const char *type;
	} cases[] = {
		{ "{\"retries\":-1}", 422, "/problems/invalid-request" },
		{ "{\"retries\":101}", 422, "/problems/invalid-request" },
		{ "{\"retries\":\"2\"}", 422, "/problems/invalid-request" },
		{ "{\"retries\":1,\"step\":2}", 422, "/problems/invalid-request" },
		{ "[1]", 400, "/problems/invalid-json" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		r = resume(&t, failed, NULL, cases[i].body);
		tstack_expect_problem(r, cases[i].status, cases[i].type, path);
		http_response_free(r);
	}
	r = tstack_post(&t, "/v1/workflows/not-a-uuid/resume", NULL, "{}");
	tstack_expect_problem(r, 404, "/problems/not-found", "/v1/workflows/not-a-uuid/resume");
	http_response_free(r);
	r = resume(&t, "01a00000-0000-7000-8000-000000000000", NULL, "{}");
	tstack_expect_problem(r, 404, "/problems/not-found",
	                      "/v1/workflows/01a00000-0000-7000-8000-000000000000/resume");
	http_response_free(r);
	r = tstack_get(&t, path);
	tstack_expect_problem(r, 405, "/problems/method-not-allowed", path);
	tstack_expect_header(r, "Allow", "POST");
	http_response_free(r);

	/* Step definitions: on_failure and resumable are checked at create. */
	static const char *const bad_steps[] = {
		"{\"type\":\"b\",\"steps\":[{\"name\":\"a\",\"job_type\":\"b\","
		"\"on_failure\":\"retry\"}]}",
		"{\"type\":\"b\",\"steps\":[{\"name\":\"a\",\"job_type\":\"b\","
		"\"resumable\":\"yes\"}]}",
		"{\"type\":\"b\",\"steps\":[{\"name\":\"a\",\"wait_for\":\"m\","
		"\"on_failure\":\"incident\"}]}",
		"{\"type\":\"b\",\"steps\":[{\"name\":\"a\",\"wait_for\":\"m\","
		"\"resumable\":true}]}",
	};
	for (size_t i = 0; i < sizeof(bad_steps) / sizeof(bad_steps[0]); i++) {
		char key[96];
		tstack_key(key, sizeof(key), "badstep");
		r = tstack_post(&t, "/v1/workflows", key, bad_steps[i]);
		tstack_expect_problem(r, 422, "/problems/invalid-workflow", "/v1/workflows");
		http_response_free(r);
	}

	after = tenant_snapshot(&t);
	cr_assert_str_eq(after, before, "a refused resume changed something");
	free(before);
	free(after);
	free(pending);
	free(running);
	free(done);
	free(cancelled);
	free(failed);
}

/* --- Failed workflows that may be resumed -------------------------------- */

Test(incidents, a_failed_workflow_resumes_at_a_resumable_step_unless_its_business_key_moved_on)
{
	struct tstack_tenant t;
	struct http_response *r;
	char path[160], *wf, *wf2, *newer, *v;
	const char *flow = "{\"type\":\"refund\",\"business_key\":\"R-1\",\"steps\":["
	                   "{\"name\":\"refund\",\"job_type\":\"refund\",\"resumable\":true}]}";

	tstack_tenant_create(&t, "inc-failed");
	wf = tstack_create(&t, flow);
	activate_one(&t, "refund", "w", wf, 1);
	finish(&t, wf, 1, "fail", "{\"worker\":\"w\",\"error\":\"bank closed\"}", "failed");
	expect_state(wf, "failed");
	r = resume(&t, wf, NULL, "{\"retries\":0}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	expect_state(wf, "running");
	cr_assert_eq(tstack_count("SELECT count(*) FROM workflows WHERE id = $1"
	                          " AND ended_at IS NULL",
	                          wf),
	             1);
	expect_events(&t, wf,
	              "workflow.created workflow.started job.failed workflow.failed"
	              " workflow.resumed");
	v = tstack_text("SELECT payload::jsonb -> 'data' ->> 'from' FROM outbox"
	                " WHERE workflow_id = $1 AND type = 'workflow.resumed'",
	                wf);
	cr_assert_str_eq(v, "failed");
	free(v);
	/* Running again, it holds its business key again. */
	{
		char key[96];
		tstack_key(key, sizeof(key), "bk");
		r = tstack_post(&t, "/v1/workflows", key, flow);
		tstack_expect_status(r, 200);
		wf2 = tstack_json(r->body, "{id}");
		cr_assert_str_eq(wf2, wf);
		http_response_free(r);
	}
	activate_one(&t, "refund", "w", wf, 1);
	finish(&t, wf, 1, "complete", "{\"worker\":\"w\"}", "completed");
	expect_state(wf, "completed");

	/* Failed again (a second workflow of the key); meanwhile a newer one
	 * took the key: the resume is refused and changes nothing. */
	free(wf);
	wf = tstack_create(&t, flow);
	activate_one(&t, "refund", "w", wf, 1);
	finish(&t, wf, 1, "fail", "{\"worker\":\"w\"}", "failed");
	newer = tstack_create(&t, flow);
	cr_assert_str_neq(newer, wf);
	snprintf(path, sizeof(path), "/v1/workflows/%s/resume", wf);
	r = resume(&t, wf, NULL, "{}");
	tstack_expect_problem(r, 409, "/problems/state-conflict", path);
	v = tstack_json(r->body, "{detail}");
	cr_assert_str_eq(v, "another refund workflow with business key \"R-1\" is active now; "
	                    "nothing was changed");
	free(v);
	http_response_free(r);
	expect_state(wf, "failed");
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1"
	                          " AND state = 'failed'",
	                          wf),
	             1);
	free(wf);
	free(wf2);
	free(newer);
}

Test(incidents, an_incident_holds_its_business_key_and_can_be_cancelled)
{
	struct tstack_tenant t;
	struct http_response *r;
	char path[160], *wf, *again, *v;
	char body[512];

	tstack_tenant_create(&t, "inc-cancel");
	wf = create_pay(&t, "O-9", "held");
	exhaust(&t, wf, "held");
	expect_state(wf, "incident");

	/* A create with the same business key answers the parked one. */
	snprintf(body, sizeof(body), PAY_FLOW, "O-9", "held", "held");
	{
		char key[96];
		tstack_key(key, sizeof(key), "bk");
		r = tstack_post(&t, "/v1/workflows", key, body);
		tstack_expect_status(r, 200);
		again = tstack_json(r->body, "{id}");
		cr_assert_str_eq(again, wf);
		v = tstack_json(r->body, "{state}");
		cr_assert_str_eq(v, "incident");
		free(v);
		free(again);
		http_response_free(r);
	}

	snprintf(path, sizeof(path), "/v1/workflows/%s/transitions", wf);
	r = tstack_post(&t, path, NULL, "{\"to\":\"cancelled\",\"from\":\"incident\"}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	expect_state(wf, "cancelled");
	expect_events(&t, wf,
	              "workflow.created workflow.started job.failed job.failed workflow.incident"
	              " workflow.cancelled");
	v = tstack_text("SELECT payload::jsonb -> 'data' ->> 'from' FROM outbox"
	                " WHERE workflow_id = $1 AND type = 'workflow.cancelled'",
	                wf);
	cr_assert_str_eq(v, "incident");
	free(v);
	snprintf(path, sizeof(path), "/v1/workflows/%s/resume", wf);
	r = resume(&t, wf, NULL, "{}");
	tstack_expect_problem(r, 409, "/problems/state-conflict", path);
	http_response_free(r);
	/* The key is free again. */
	again = tstack_create(&t, body);
	cr_assert_str_neq(again, wf);
	free(again);
	free(wf);
}

/* --- Concurrent resumes -------------------------------------------------- */

struct racer {
	const struct tstack_tenant *t;
	const char *wf;
	char key[96];
	pthread_barrier_t *start;
	struct http_response *resp;
};

static void *racer_run(void *arg)
{
	struct racer *s = arg;
	char path[160];

	snprintf(path, sizeof(path), "/v1/workflows/%s/resume", s->wf);
	pthread_barrier_wait(s->start);
	s->resp = tstack_post_raw(s->t, path, s->key, "{\"retries\":3}");
	return NULL;
}

#define RESUMERS 4

Test(incidents, concurrent_resumes_with_different_keys_resume_once)
{
	struct tstack_tenant t;
	struct racer s[RESUMERS];
	pthread_t th[RESUMERS];
	pthread_barrier_t start;
	char *wf;
	int ok = 0, refused = 0;

	tstack_tenant_create(&t, "inc-race");
	wf = create_pay(&t, "O-3", "race");
	exhaust(&t, wf, "race");
	cr_assert_eq(pthread_barrier_init(&start, NULL, RESUMERS), 0);
	for (int i = 0; i < RESUMERS; i++) {
		s[i] = (struct racer){ .t = &t, .wf = wf, .start = &start };
		tstack_key(s[i].key, sizeof(s[i].key), "race");
		cr_assert_eq(pthread_create(&th[i], NULL, racer_run, &s[i]), 0);
	}
	for (int i = 0; i < RESUMERS; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&start);
	for (int i = 0; i < RESUMERS; i++) {
		cr_assert_not_null(s[i].resp, "%s", http_error());
		if (s[i].resp->status == 200)
			ok++;
		else if (s[i].resp->status == 409 &&
		         strstr(s[i].resp->body, "/problems/state-conflict") != NULL)
			refused++;
		else
			cr_assert_fail("resume %d: %d %s", i, s[i].resp->status, s[i].resp->body);
		http_response_free(s[i].resp);
	}
	cr_assert_eq(ok, 1);
	cr_assert_eq(refused, RESUMERS - 1);
	cr_assert_eq(tstack_count("SELECT count(*) FROM outbox WHERE workflow_id = $1"
	                          " AND type = 'workflow.resumed'",
	                          wf),
	             1);
	cr_assert_eq(tstack_count("SELECT retries FROM jobs WHERE workflow_id = $1", wf), 3);
	free(wf);
}

/* --- The list, the metric, other tenants ---------------------------------- */

/* The incident gauge of one scrape, compared with the table while no
 * workflow can change state (other tests of this program run at once). */
static void expect_gauge_is_the_table(void)
{
	PGconn *hold = tstack_db_connect();
	char *port = strdup(tstack_env("IDEMFLOW_PORT"));
	struct http_response *r;
	const char *line;
	long want;

	tstack_exec(hold, "BEGIN");
	tstack_exec(hold, "LOCK TABLE workflows IN SHARE MODE");
	want = tstack_count("SELECT count(*) FROM workflows WHERE state = 'incident'");
	setenv("IDEMFLOW_PORT", tstack_env("IDEMFLOW_METRICS_PORT"), 1);
	r = http_request("GET", "/metrics", NULL, NULL, 0);
	setenv("IDEMFLOW_PORT", port, 1);
	free(port);
	tstack_exec(hold, "COMMIT");
	PQfinish(hold);
	cr_assert_not_null(r, "%s", http_error());
	tstack_expect_status(r, 200);
	line = strstr(r->body, "\nidemflow_workflows_incident ");
	cr_assert_not_null(line, "no incident gauge in %s", r->body);
	cr_assert_eq(atol(line + strlen("\nidemflow_workflows_incident ")), want, "%.80s", line);
	cr_assert_geq(want, 1);
	http_response_free(r);
}

Test(incidents, the_list_filters_incidents_the_gauge_counts_them_other_tenants_see_none)
{
	struct tstack_tenant a, b;
	struct http_response *r;
	char path[200], *parked[2], *v;

	tstack_tenant_create(&a, "inc-list-a");
	tstack_tenant_create(&b, "inc-list-b");
	for (int i = 0; i < 2; i++) {
		char bk[16];
		snprintf(bk, sizeof(bk), "L-%d", i);
		parked[i] = create_pay(&a, bk, "list");
		exhaust(&a, parked[i], "list");
	}
	free(tstack_create(&a,
	                   "{\"type\":\"pay\",\"steps\":[{\"name\":\"x\",\"job_type\":\"x\"}]}"));

	r = tstack_get(&a, "/v1/workflows?state=incident&limit=1");
	tstack_expect_status(r, 200);
	v = tstack_json(r->body, "{workflows,0,id}");
	cr_assert_str_eq(v, parked[0]);
	free(v);
	v = tstack_json(r->body, "{next_cursor}");
	cr_assert_str_eq(v, parked[0]);
	free(v);
	http_response_free(r);
	snprintf(path, sizeof(path), "/v1/workflows?state=incident&after=%s", parked[0]);
	r = tstack_get(&a, path);
	tstack_expect_status(r, 200);
	v = tstack_text("SELECT string_agg(w ->> 'id', ' ') || ' ' || ($1::jsonb ->> 'next_cursor'"
	                " IS NULL) FROM jsonb_array_elements($1::jsonb -> 'workflows') w",
	                r->body);
	char want[128];
	snprintf(want, sizeof(want), "%s true", parked[1]);
	cr_assert_str_eq(v, want);
	free(v);
	http_response_free(r);
	r = tstack_get(&a, "/v1/workflows?state=incident&type=none");
	cr_assert_str_eq(r->body, "{\"workflows\":[],\"next_cursor\":null}");
	http_response_free(r);

	/* Another tenant: an empty list, 404 for the ids. */
	r = tstack_get(&b, "/v1/workflows?state=incident");
	cr_assert_str_eq(r->body, "{\"workflows\":[],\"next_cursor\":null}");
	http_response_free(r);
	snprintf(path, sizeof(path), "/v1/workflows/%s/resume", parked[0]);
	r = resume(&b, parked[0], NULL, "{\"retries\":1}");
	tstack_expect_problem(r, 404, "/problems/not-found", path);
	http_response_free(r);
	expect_state(parked[0], "incident");

	expect_gauge_is_the_table();
	for (int i = 0; i < 2; i++)
		free(parked[i]);
}
