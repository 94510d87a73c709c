/*
 * End-to-end tests of what a job receives and when: the outputs of the
 * steps before it ("steps" beside the workflow's "input"), the bound on
 * them (413 activation-too-large), and priorities with their bounded head
 * start (sql/018_outputs_priority.sql), through nginx and the worker pool
 * against the real database.
 *
 * Every test works in a tenant of its own, so job types never meet
 * another test's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "http.h"
#include "tapi.h"
#include "tsql.h"
#include "tstack.h"

TSTACK_SETTINGS("idempotency_wait = 10s\n")

TestSuite(outputs, .timeout = 90);
TestSuite(bound, .timeout = 120);
TestSuite(priority, .timeout = 90);

/* --- Helpers ----------------------------------------------------------- */

/* POST /v1/jobs/activate: up to max jobs of type; expects 200. */
static struct http_response *activate(const struct tstack_tenant *t, const char *type, int max)
{
	struct http_response *r;
	char body[200];

	snprintf(body, sizeof(body),
	         "{\"job_type\":\"%s\",\"worker\":\"w\",\"max_jobs\":%d,\"lease_seconds\":60}",
	         type, max);
	r = tstack_post(t, "/v1/jobs/activate", NULL, body);
	tstack_expect_status(r, 200);
	return r;
}

/* The one job an activation of type hands out, as its answer's bytes
 * (malloc'ed); its workflow must be wf. */
static char *activate_one(const struct tstack_tenant *t, const char *type, const char *wf)
{
	struct http_response *r = activate(t, type, 1);
	char *n = tstack_text("SELECT jsonb_array_length($1::jsonb -> 'jobs')::text", r->body);
	char *got = tstack_json(r->body, "{jobs,0,workflow_id}"), *body;

	cr_assert_str_eq(n, "1", "activation: %.300s", r->body);
	cr_assert_str_eq(got, wf);
	body = strdup(r->body);
	free(n);
	free(got);
	http_response_free(r);
	return body;
}

static struct http_response *complete(const struct tstack_tenant *t, const char *wf, int step,
                                      const char *output)
{
	size_t len = strlen(output) + 64;
	char path[160], *body = malloc(len);
	struct http_response *r;

	cr_assert_not_null(body);
	snprintf(path, sizeof(path), "/v1/jobs/%s.s%d/complete", wf, step);
	snprintf(body, len, "{\"worker\":\"w\",\"output\":%s}", output);
	r = tstack_post(t, path, NULL, body);
	free(body);
	return r;
}

static void complete_ok(const struct tstack_tenant *t, const char *wf, int step, const char *output)
{
	struct http_response *r = complete(t, wf, step, output);

	tstack_expect_status(r, 200);
	http_response_free(r);
}

/* The job's answer holds exactly these bytes. */
static void expect_in(const char *body, const char *want)
{
	cr_assert_not_null(strstr(body, want), "expected %s in %.400s", want, body);
}

/* {"blob":"xxx...x"} with n x's (malloc'ed). */
static char *blob(size_t n)
{
	char *s = malloc(n + 16);

	cr_assert_not_null(s);
	memcpy(s, "{\"blob\":\"", 9);
	memset(s + 9, 'x', n);
	memcpy(s + 9 + n, "\"}", 3);
	return s;
}

/* Everything a tenant has written, as one string, to prove that a refused
 * request changed nothing. */
static char *tenant_snapshot(const struct tstack_tenant *t)
{
	return tstack_text(
	    "SELECT (SELECT coalesce(string_agg(state || step || last_seq, ',' ORDER BY id), '')"
	    "          FROM workflows WHERE tenant_id = $1) || '/' ||"
	    "       (SELECT count(*) FROM outbox WHERE tenant_id = $1) || '/' ||"
	    "       (SELECT coalesce(string_agg(step || state || coalesce(md5(output), '-'),"
	    "                                   ',' ORDER BY workflow_id, step), '')"
	    "          FROM jobs WHERE tenant_id = $1) || '/' ||"
	    "       (SELECT count(*) FROM messages WHERE tenant_id = $1) || '/' ||"
	    "       (SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1)",
	    t->id_text);
}

/* --- Outputs ----------------------------------------------------------- */

/*
 * Three job steps: the first receives "steps":{}, the second the first's
 * output under its name, the third both; "input" stays the workflow's.
 */
Test(outputs, each_step_receives_the_outputs_of_the_steps_before_it_by_name)
{
	struct tstack_tenant t;
	char *wf, *job;

	tstack_tenant_create(&t, "outputs");
	wf = tstack_create(&t, "{\"type\":\"order\",\"input\":{\"order\":7},\"steps\":["
	                       "{\"name\":\"reserve\",\"job_type\":\"o1\"},"
	                       "{\"name\":\"charge\",\"job_type\":\"o2\"},"
	                       "{\"name\":\"ship\",\"job_type\":\"o3\"}]}");

	job = activate_one(&t, "o1", wf);
	expect_in(job, ",\"input\":{\"order\":7},\"steps\":{},");
	free(job);
	complete_ok(&t, wf, 1, "{\"sku\":\"a\",\"n\":2}");

	job = activate_one(&t, "o2", wf);
	expect_in(job, ",\"input\":{\"order\":7},\"steps\":{\"reserve\":{\"n\":2,\"sku\":\"a\"}},");
	free(job);
	complete_ok(&t, wf, 2, "{\"charge_id\":\"ch_1\"}");

	job = activate_one(&t, "o3", wf);
	expect_in(job, ",\"input\":{\"order\":7},\"steps\":{\"charge\":{\"charge_id\":\"ch_1\"},"
	               "\"reserve\":{\"n\":2,\"sku\":\"a\"}},");
	free(job);
	free(wf);
}

/*
 * A wait step's output is its message's payload, under the step's name;
 * a sleep step has none. A job activated again (its lease ran out) gets
 * the same outputs.
 */
Test(outputs, a_wait_steps_payload_is_its_output_and_a_sleep_step_has_none)
{
	struct tstack_tenant t;
	struct http_response *r;
	char path[160], out[512], *wf, *job;

	tstack_tenant_create(&t, "waitout");
	wf = tstack_create(&t, "{\"type\":\"pay\",\"steps\":["
	                       "{\"name\":\"ask\",\"job_type\":\"w1\"},"
	                       "{\"name\":\"approval\",\"wait_for\":\"approved\"},"
	                       "{\"name\":\"pause\",\"sleep\":\"PT0S\"},"
	                       "{\"name\":\"pay\",\"job_type\":\"w2\"}]}");
	job = activate_one(&t, "w1", wf);
	expect_in(job, ",\"input\":{},\"steps\":{},");
	free(job);
	complete_ok(&t, wf, 1, "{\"asked\":true}");

	snprintf(path, sizeof(path), "/v1/workflows/%s/messages", wf);
	r = tstack_post(&t, path, NULL,
	                "{\"message_id\":\"m1\",\"name\":\"approved\","
	                "\"payload\":{\"by\":\"ann\",\"limit\":50}}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	/* The sleep's timer is due at once: the reaper fires it. */
	cr_assert_eq(tstack_cli(out, sizeof(out), "reap", NULL), 0, "reap: %s",
	             tstack_cli_stderr());

	job = activate_one(&t, "w2", wf);
	expect_in(job, ",\"steps\":{\"approval\":{\"by\":\"ann\",\"limit\":50},"
	               "\"ask\":{\"asked\":true}}");
	free(job);
	/* Handed out again once its lease is over: the same outputs. */
	tstack_exec(tstack_db(),
	            "UPDATE jobs SET due_at = now() WHERE workflow_id = $1 AND step = 4", wf);
	job = activate_one(&t, "w2", wf);
	expect_in(job, "\"activations\":2,");
	expect_in(job, ",\"steps\":{\"approval\":{\"by\":\"ann\",\"limit\":50},"
	               "\"ask\":{\"asked\":true}}");
	free(job);
	free(wf);
}

/* --- The bound --------------------------------------------------------- */

#define INPUT_BYTES 900000

/*
 * Input 900 kB, step 1's output 900 kB: step 2 is entered with about
 * 1.8 MB, within the 2 MiB an activation carries. Step 2's output of
 * 300 kB would enter step 3 with 2.1 MB: the completion is refused with
 * 413 activation-too-large and changes nothing; a smaller output then
 * completes it, and step 3's activation carries both outputs.
 */
Test(bound, a_completion_that_would_take_the_next_activation_past_2_MiB_is_refused)
{
	struct tstack_tenant t;
	struct http_response *r;
	char *big = blob(INPUT_BYTES), *mid = blob(300000), *body, *wf, *job, *before, *after;
	char path[160];
	size_t len = strlen(big) + 400;

	tstack_tenant_create(&t, "bound");
	body = malloc(len);
	cr_assert_not_null(body);
	snprintf(body, len,
	         "{\"type\":\"big\",\"input\":%s,\"steps\":[{\"name\":\"a\",\"job_type\":\"b1\"},"
	         "{\"name\":\"b\",\"job_type\":\"b2\"},{\"name\":\"c\",\"job_type\":\"b3\"}]}",
	         big);
	wf = tstack_create(&t, body);
	free(activate_one(&t, "b1", wf));
	complete_ok(&t, wf, 1, big);
	free(activate_one(&t, "b2", wf));

	before = tenant_snapshot(&t);
	r = complete(&t, wf, 2, mid);
	snprintf(path, sizeof(path), "/v1/jobs/%s.s2/complete", wf);
	tstack_expect_problem(r, 413, "/problems/activation-too-large", path);
	expect_in(r->body, "\"detail\":\"step 3 (\\\"c\\\") would be entered with ");
	expect_in(r->body, "bytes of workflow input and step outputs, more than the 2097152 an "
	                   "activation carries: nothing was changed\"");
	http_response_free(r);
	after = tenant_snapshot(&t);
	cr_assert_str_eq(after, before);

	complete_ok(&t, wf, 2, "{\"small\":true}");
	job = activate_one(&t, "b3", wf);
	expect_in(job, ",\"b\":{\"small\":true}},");
	cr_assert(strlen(job) > 2 * INPUT_BYTES, "step 3 carries the input and step 1's output");
	free(job);
	free(before);
	free(after);
	free(body);
	free(big);
	free(mid);
	free(wf);
}

/*
 * The same bound for a message, sent to the workflow or published by its
 * business key: a wait step's payload that would take the next job's
 * activation past it is refused with 413 and nothing is recorded; the wait
 * goes on and a smaller payload completes it.
 */
Test(bound, a_message_that_would_take_the_next_activation_past_2_MiB_is_refused)
{
	struct tstack_tenant t;
	struct http_response *r;
	char *big = blob(INPUT_BYTES), *mid = blob(300000), *body, *wf, *before, *after;
	char path[160];
	size_t len = strlen(big) + 400;

	tstack_tenant_create(&t, "msgbound");
	body = malloc(len);
	cr_assert_not_null(body);
	snprintf(body, len,
	         "{\"type\":\"big\",\"input\":%s,\"business_key\":\"bk-1\",\"steps\":["
	         "{\"name\":\"a\",\"job_type\":\"m1\"},{\"name\":\"w\",\"wait_for\":\"go\"},"
	         "{\"name\":\"c\",\"job_type\":\"m2\"}]}",
	         big);
	wf = tstack_create(&t, body);
	free(activate_one(&t, "m1", wf));
	complete_ok(&t, wf, 1, big);

	before = tenant_snapshot(&t);
	snprintf(path, sizeof(path), "/v1/workflows/%s/messages", wf);
	snprintf(body, len, "{\"message_id\":\"big-1\",\"name\":\"go\",\"payload\":%s}", mid);
	r = tstack_post(&t, path, NULL, body);
	tstack_expect_problem(r, 413, "/problems/activation-too-large", path);
	http_response_free(r);
	snprintf(body, len,
	         "{\"message_id\":\"big-2\",\"name\":\"go\",\"business_key\":\"bk-1\","
	         "\"payload\":%s}",
	         mid);
	r = tstack_post(&t, "/v1/messages", NULL, body);
	tstack_expect_problem(r, 413, "/problems/activation-too-large", "/v1/messages");
	http_response_free(r);
	after = tenant_snapshot(&t);
	cr_assert_str_eq(after, before);

	r = tstack_post(&t, path, NULL, "{\"message_id\":\"small-1\",\"name\":\"go\"}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	free(activate_one(&t, "m2", wf));
	free(before);
	free(after);
	free(body);
	free(big);
	free(mid);
	free(wf);
}

/*
 * An activation's byte budget (max_answer, 4 MiB) counts the outputs each
 * job carries, not only its workflow's input: five jobs whose "steps"
 * hold 1 MB each stop after the fourth, "truncated", and the fifth stays
 * activatable for the next call.
 */
Test(bound, an_activations_budget_counts_the_outputs_its_jobs_carry)
{
	enum { N = 5, OUT = 1000000 };
	struct tstack_tenant t;
	struct http_response *r;
	char *out = blob(OUT), *wf[N], *n;
	size_t cap = (size_t)tstack_conf_long("max_answer", 4L * 1024 * 1024);

	cr_assert_eq(cap, 4L * 1024 * 1024, "the test is sized for the default max_answer");
	tstack_tenant_create(&t, "budget");
	for (int i = 0; i < N; i++)
		wf[i] = tstack_create(&t, "{\"type\":\"g\",\"steps\":[{\"name\":\"a\",\"job_type\":"
		                          "\"g1\"},{\"name\":\"b\",\"job_type\":\"g2\"}]}");
	http_response_free(activate(&t, "g1", N));
	for (int i = 0; i < N; i++)
		complete_ok(&t, wf[i], 1, out);

	r = activate(&t, "g2", N);
	n = tstack_text("SELECT jsonb_array_length($1::jsonb -> 'jobs') || '/' ||"
	                "       coalesce($1::jsonb ->> 'truncated', 'false')",
	                r->body);
	cr_assert_str_eq(n, "4/true", "answer of %zu bytes", r->body_len);
	cr_assert(r->body_len < cap, "the answer is within max_answer: %zu bytes", r->body_len);
	free(n);
	http_response_free(r);
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE tenant_id = $1 AND step = 2"
	                          " AND state = 'activatable' AND activations = 0",
	                          t.id_text),
	             1);
	for (int i = 0; i < N; i++)
		free(wf[i]);
	free(out);
}

/* --- Priority ---------------------------------------------------------- */

/* A workflow of one job step of type, with the given top-level and step
 * members ("" for none); returns its id. */
static char *create_job(const struct tstack_tenant *t, const char *type, const char *top,
                        const char *step)
{
	char body[300];

	snprintf(body, sizeof(body),
	         "{\"type\":\"p\"%s,\"steps\":[{\"name\":\"s\",\"job_type\":\"%s\"%s}]}", top, type,
	         step);
	return tstack_create(t, body);
}

/* The workflow ids of an activation's jobs, in order, comma-separated. */
static char *activated_ids(const struct tstack_tenant *t, const char *type, int max)
{
	struct http_response *r = activate(t, type, max);
	char *ids = tstack_text("SELECT string_agg(j ->> 'workflow_id', ',' ORDER BY i)"
	                        "  FROM jsonb_array_elements($1::jsonb -> 'jobs')"
	                        "       WITH ORDINALITY AS a(j, i)",
	                        r->body);

	http_response_free(r);
	return ids;
}

/*
 * Ten priority-0 jobs, then one of a priority-9 workflow and one of a
 * priority-1 workflow whose step says 5: an activation of two hands out
 * the 9 and then the 5, though the ten were due first; the next one the
 * oldest of the ten. A job shows its priority.
 */
Test(priority, a_high_priority_job_is_activated_ahead_of_a_backlog_of_low_priority_ones)
{
	enum { N = 10 };
	struct tstack_tenant t;
	struct http_response *r;
	char *low[N], *high, *mid, want[200], *got;

	tstack_tenant_create(&t, "prio");
	for (int i = 0; i < N; i++)
		low[i] = create_job(&t, "pj", "", "");
	high = create_job(&t, "pj", ",\"priority\":9", "");
	mid = create_job(&t, "pj", ",\"priority\":1", ",\"priority\":5");
	cr_assert_eq(tstack_count("SELECT count(*) FROM workflows WHERE tenant_id = $1"
	                          " AND priority = 9 AND id = $2",
	                          t.id_text, high),
	             1);

	r = activate(&t, "pj", 2);
	got = tstack_text(
	    "SELECT string_agg((j ->> 'workflow_id') || ':' || (j ->> 'priority'),"
	    "                  ',' ORDER BY i)"
	    "  FROM jsonb_array_elements($1::jsonb -> 'jobs') WITH ORDINALITY AS a(j, i)",
	    r->body);
	snprintf(want, sizeof(want), "%s:9,%s:5", high, mid);
	cr_assert_str_eq(got, want);
	free(got);
	http_response_free(r);

	got = activated_ids(&t, "pj", 1);
	cr_assert_str_eq(got, low[0]);
	free(got);
	for (int i = 0; i < N; i++)
		free(low[i]);
	free(high);
	free(mid);
}

/*
 * The head start is bounded: priority p moves a job's place 10 s * p
 * earlier, so a priority-0 job due for 91 s goes before priority-9 jobs
 * that become due now, and one due for 60 s still waits behind them (they
 * have 30 s of head start on it). The ages are made by
 * moving due_at back rather than by waiting.
 */
Test(priority, a_stream_of_high_priority_work_cannot_starve_a_low_priority_job)
{
	enum { H = 5 };
	struct tstack_tenant t;
	char *old, *younger, *high[H], want[400], *got;
	size_t off;

	tstack_tenant_create(&t, "starve");
	old = create_job(&t, "sj", "", "");
	younger = create_job(&t, "sj", "", "");
	tstack_exec(
	    tstack_db(),
	    "UPDATE jobs SET due_at = due_at - interval '91 seconds' WHERE workflow_id = $1", old);
	tstack_exec(
	    tstack_db(),
	    "UPDATE jobs SET due_at = due_at - interval '60 seconds' WHERE workflow_id = $1",
	    younger);
	for (int i = 0; i < H; i++)
		high[i] = create_job(&t, "sj", ",\"priority\":9", "");

	got = activated_ids(&t, "sj", H + 2);
	off = (size_t)snprintf(want, sizeof(want), "%s", old);
	for (int i = 0; i < H; i++)
		off += (size_t)snprintf(want + off, sizeof(want) - off, ",%s", high[i]);
	snprintf(want + off, sizeof(want) - off, ",%s", younger);
	cr_assert_str_eq(got, want);
	free(got);
	for (int i = 0; i < H; i++)
		free(high[i]);
	free(old);
	free(younger);
}

/*
 * A priority is an integer from 0 to 9, on the workflow or on a job step;
 * anything else is 422 invalid-workflow and creates nothing. A workflow's
 * answer does not show it (the create's bytes stay what they were).
 */
Test(priority, a_priority_outside_0_to_9_or_on_a_step_without_a_job_is_refused)
{
	static const char *const bad[] = {
		"{\"type\":\"p\",\"priority\":10,\"steps\":[{\"name\":\"s\",\"job_type\":\"x\"}]}",
		"{\"type\":\"p\",\"priority\":-1}",
		"{\"type\":\"p\",\"priority\":\"9\"}",
		"{\"type\":\"p\",\"priority\":1.5}",
		"{\"type\":\"p\",\"steps\":[{\"name\":\"s\",\"job_type\":\"x\",\"priority\":10}]}",
		"{\"type\":\"p\",\"steps\":[{\"name\":\"s\",\"wait_for\":\"m\",\"priority\":1}]}",
		"{\"type\":\"p\",\"steps\":[{\"name\":\"s\",\"sleep\":\"PT1S\",\"priority\":1}]}",
	};
	static const char *const why[] = {
		"\\\"priority\\\" must be an integer from 0 to 9",
		"\\\"priority\\\" must be an integer from 0 to 9",
		"\\\"priority\\\" must be an integer from 0 to 9",
		"\\\"priority\\\" must be an integer from 0 to 9",
		"step 1: \\\"priority\\\" must be an integer from 0 to 9",
		"step 1: only a job step has \\\"priority\\\": it orders the activation of jobs",
		"step 1: only a job step has \\\"priority\\\": it orders the activation of jobs",
	};
	struct tstack_tenant t;
	struct http_response *r;
	char key[64], detail[160];

	tstack_tenant_create(&t, "badprio");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		tstack_key(key, sizeof(key), "badprio");
		r = tstack_post(&t, "/v1/workflows", key, bad[i]);
		tstack_expect_problem(r, 422, "/problems/invalid-workflow", "/v1/workflows");
		snprintf(detail, sizeof(detail), "\"detail\":\"%s\"", why[i]);
		expect_in(r->body, detail);
		http_response_free(r);
	}
	cr_assert_eq(tstack_count("SELECT count(*) FROM workflows WHERE tenant_id = $1", t.id_text),
	             0);

	/* Without steps it is kept, and not shown. */
	tstack_key(key, sizeof(key), "prio");
	r = tstack_post(&t, "/v1/workflows", key, "{\"type\":\"p\",\"priority\":3}");
	free(tstack_expect_created(r, "p", "{}"));
	http_response_free(r);
	cr_assert_eq(tstack_count("SELECT count(*) FROM workflows WHERE tenant_id = $1"
	                          " AND priority = 3",
	                          t.id_text),
	             1);
}

/* --- Business key ------------------------------------------------------ */

TestSuite(business_key, .timeout = 90);

/*
 * A compensating workflow holds its business key (016's index counts it
 * as active): a create with the key answers 200 with that workflow and
 * "existing": true. The state is set in the database: nothing on this
 * branch of the engine compensates yet.
 */
Test(business_key, a_compensating_workflow_is_the_existing_one_for_its_key)
{
	static const char body[] = "{\"type\":\"bk\",\"business_key\":\"K-1\","
	                           "\"steps\":[{\"name\":\"s\",\"job_type\":\"bk\"}]}";
	struct tstack_tenant t;
	struct http_response *r;
	char key[64], *wf, *got;

	tstack_tenant_create(&t, "compkey");
	wf = tstack_create(&t, body);
	tstack_exec(tstack_db(), "UPDATE workflows SET state = 'compensating' WHERE id = $1", wf);
	tstack_key(key, sizeof(key), "compkey");
	r = tstack_post(&t, "/v1/workflows", key, body);
	tstack_expect_status(r, 200);
	got = tstack_json(r->body, "{id}");
	cr_assert_str_eq(got, wf);
	expect_in(r->body, "\"state\":\"compensating\"");
	expect_in(r->body, "\"existing\":true}");
	cr_assert_eq(tstack_count("SELECT count(*) FROM workflows WHERE tenant_id = $1", t.id_text),
	             1);
	free(got);
	http_response_free(r);
	free(wf);
}
