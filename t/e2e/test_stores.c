/*
 * End-to-end tests of what a request leaves behind: which answers an
 * Idempotency-Key keeps (the command's own outcomes, and nothing else),
 * and how big an answer and a worker may grow whatever a tenant asks for.
 *
 * Every test works in a tenant of its own.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "http.h"
#include "tstack.h"

#define JSON_CT "Content-Type: application/json"

TestSuite(keys, .timeout = 90);

static struct http_response *post(const struct tstack_tenant *t, const char *path,
				  const char *key, const char *body)
{
	char kh[300];
	const char *h[] = {t->auth, JSON_CT, NULL, NULL};
	struct http_response *r;

	if (key != NULL) {
		snprintf(kh, sizeof(kh), "Idempotency-Key: %s", key);
		h[2] = kh;
	}
	r = http_request("POST", path, h, body, strlen(body));
	cr_assert_not_null(r, "POST %s: %s", path, http_error());
	return r;
}

static void expect_status(const struct http_response *r, int status)
{
	cr_assert_eq(r->status, status, "status %d, want %d; body: %.600s", r->status, status,
		     r->body);
}

static char *create(const struct tstack_tenant *t, const char *body)
{
	char key[96];
	struct http_response *r;
	char *id;

	tstack_key(key, sizeof(key), "wf");
	r = post(t, "/v1/workflows", key, body);
	expect_status(r, 201);
	id = tstack_json(r->body, "{id}");
	http_response_free(r);
	return id;
}

static void activate_one(const struct tstack_tenant *t, const char *type, const char *worker,
			 int lease)
{
	char body[256];
	struct http_response *r;

	snprintf(body, sizeof(body),
		 "{\"job_type\":\"%s\",\"worker\":\"%s\",\"lease_seconds\":%d}", type, worker,
		 lease);
	r = post(t, "/v1/jobs/activate", NULL, body);
	expect_status(r, 200);
	cr_assert_eq(tstack_count("SELECT jsonb_array_length($1::jsonb -> 'jobs')", r->body), 1,
		     "activation: %s", r->body);
	http_response_free(r);
}

/* r replays first: same status, Content-Type and body bytes, flagged. */
static void expect_replay(const struct http_response *r, const struct http_response *first)
{
	cr_assert_eq(r->status, first->status, "status %d, body %.500s", r->status, r->body);
	tstack_expect_header(r, "Idempotent-Replayed", "true");
	tstack_expect_header(r, "Content-Type", http_header(first, "Content-Type"));
	cr_assert_eq(r->body_len, first->body_len, "replayed %.500s, first %.500s", r->body,
		     first->body);
	cr_assert(memcmp(r->body, first->body, r->body_len) == 0, "replayed %.500s, first %.500s",
		  r->body, first->body);
}

static long key_rows(const char *key)
{
	return tstack_count("SELECT count(*) FROM idempotency_keys WHERE key = $1", key);
}

/* --- Only results are stored under a key --------------------------------- */

/*
 * A keyed completion of a job that does not exist yet answers 404 and
 * leaves the key free: once the job exists and is leased, the same key
 * and the same request complete it (executed, not replayed), and only
 * then is the answer kept and replayed.
 */
Test(keys, a_missing_job_is_not_stored_and_the_same_key_works_once_it_exists)
{
	const char *body = "{\"worker\":\"w\",\"output\":{\"n\":2}}";
	struct tstack_tenant t;
	struct http_response *a, *b, *c;
	char key[96], path[160], *wf;

	tstack_tenant_create(&t, "missing");
	wf = create(&t, "{\"type\":\"m\",\"steps\":[{\"name\":\"a\",\"job_type\":\"m1\"},"
			"{\"name\":\"b\",\"job_type\":\"m2\"}]}");
	snprintf(path, sizeof(path), "/v1/jobs/%s.s2/complete", wf);
	tstack_key(key, sizeof(key), "early");
	a = post(&t, path, key, body);
	tstack_expect_problem(a, 404, "/problems/not-found", path);
	cr_assert_eq(key_rows(key), 0, "a 404 does not consume the key");

	activate_one(&t, "m1", "w", 60);
	char p1[160];
	snprintf(p1, sizeof(p1), "/v1/jobs/%s.s1/complete", wf);
	http_response_free(post(&t, p1, NULL, "{\"worker\":\"w\"}"));
	activate_one(&t, "m2", "w", 60);

	b = post(&t, path, key, body);
	expect_status(b, 200);
	cr_assert_null(http_header(b, "Idempotent-Replayed"), "executed, not replayed");
	char *state = tstack_json(b->body, "{state}");
	cr_assert_str_eq(state, "completed");
	free(state);
	cr_assert_eq(key_rows(key), 1);
	c = post(&t, path, key, body);
	expect_replay(c, b);
	http_response_free(a);
	http_response_free(b);
	http_response_free(c);
	free(wf);
}

/*
 * A keyed transition or message to a workflow that does not exist answers
 * 404 and stores nothing: the same key then serves a corrected request
 * (another path is another request) instead of idempotency-key-reused.
 */
Test(keys, a_missing_workflow_is_not_stored_and_a_corrected_request_may_reuse_the_key)
{
	static const struct {
		const char *verb;
		const char *body;
		int status;
	} cases[] = {
	    {"transitions", "{\"to\":\"cancelled\"}", 200},
	    {"messages", "{\"message_id\":\"m-1\",\"name\":\"go\"}", 202},
	};
	struct tstack_tenant t;
	char key[96], path[200], missing[37];

	tstack_tenant_create(&t, "missingwf");
	tstack_uuid(missing);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *wf = create(&t, "{\"type\":\"mw\"}");
		struct http_response *a, *b;

		tstack_key(key, sizeof(key), cases[i].verb);
		snprintf(path, sizeof(path), "/v1/workflows/%s/%s", missing, cases[i].verb);
		a = post(&t, path, key, cases[i].body);
		tstack_expect_problem(a, 404, "/problems/not-found", path);
		cr_assert_eq(key_rows(key), 0, "%s: a 404 does not consume the key",
			     cases[i].verb);
		snprintf(path, sizeof(path), "/v1/workflows/%s/%s", wf, cases[i].verb);
		b = post(&t, path, key, cases[i].body);
		expect_status(b, cases[i].status);
		cr_assert_null(http_header(b, "Idempotent-Replayed"));
		cr_assert_eq(key_rows(key), 1);
		http_response_free(a);
		http_response_free(b);
		free(wf);
	}
}

/* A request that breaks a command's rules is refused before the key is
 * claimed: nothing is stored, and the corrected request under the same
 * key executes. */
Test(keys, a_validation_error_is_not_stored)
{
	struct tstack_tenant t;
	struct http_response *a, *b;
	char key[96], path[200], *wf;
	static const struct {
		const char *path; /* "/transitions": the workflow's */
		const char *bad, *good;
		int bad_status, good_status;
		const char *type;
	} cases[] = {
	    {"/transitions", "{\"to\":\"sleeping\"}", "{\"to\":\"cancelled\"}",
	     422, 200, "/problems/invalid-request"},
	    {"/v1/jobs/activate", "{\"job_type\":\"v\",\"worker\":\"w\",\"max_jobs\":0}",
	     "{\"job_type\":\"v\",\"worker\":\"w\"}", 422, 200, "/problems/invalid-request"},
	    {"/v1/workflows", "{\"type\":\"\"}", "{\"type\":\"v\"}", 422, 201,
	     "/problems/invalid-workflow"},
	    {"/v1/workflows", "{\"type\":", "{\"type\":\"v\"}", 400, 201, "/problems/invalid-json"},
	};

	tstack_tenant_create(&t, "valid");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		wf = create(&t, "{\"type\":\"v\"}");
		if (cases[i].path[0] == '/' && cases[i].path[1] == 't')
			snprintf(path, sizeof(path), "/v1/workflows/%s%s", wf, cases[i].path);
		else
			snprintf(path, sizeof(path), "%s", cases[i].path);
		tstack_key(key, sizeof(key), "v");
		a = post(&t, path, key, cases[i].bad);
		tstack_expect_problem(a, cases[i].bad_status, cases[i].type, path);
		cr_assert_eq(key_rows(key), 0, "case %zu", i);
		b = post(&t, path, key, cases[i].good);
		expect_status(b, cases[i].good_status);
		cr_assert_null(http_header(b, "Idempotent-Replayed"));
		cr_assert_eq(key_rows(key), 1, "case %zu", i);
		http_response_free(a);
		http_response_free(b);
		free(wf);
	}
}

/* Send body to path twice under one fresh key: the first answer is the
 * refusal (status, type), stored; the second is its replay, byte for byte. */
static void expect_stored_refusal(const struct tstack_tenant *t, const char *path,
				  const char *body, int status, const char *type)
{
	struct http_response *a, *b;
	char key[96];

	tstack_key(key, sizeof(key), "refusal");
	a = post(t, path, key, body);
	tstack_expect_problem(a, status, type, path);
	cr_assert_null(http_header(a, "Idempotent-Replayed"));
	cr_assert_eq(tstack_count("SELECT count(*) FROM idempotency_keys WHERE key = $1"
				  " AND status = $2::int",
				  key, status == 409 ? "409" : "422"),
		     1, "%s is stored under its key", type);
	b = post(t, path, key, body);
	expect_replay(b, a);
	http_response_free(a);
	http_response_free(b);
}

/* Every refusal a command decides from the state it finds is its outcome:
 * stored, and replayed byte for byte. */
Test(keys, every_refusal_of_a_command_is_stored_and_replayed_byte_for_byte)
{
	struct tstack_tenant t;
	char path[200], *wf;

	tstack_tenant_create(&t, "refusals");

	/* lease-expired: the worker's lease of 1 s ran out. */
	wf = create(&t, "{\"type\":\"r\",\"steps\":[{\"name\":\"a\",\"job_type\":\"rl\"}]}");
	activate_one(&t, "rl", "w", 1);
	tstack_sleep_ms(1300);
	snprintf(path, sizeof(path), "/v1/jobs/%s.s1/complete", wf);
	expect_stored_refusal(&t, path, "{\"worker\":\"w\"}", 409, "/problems/lease-expired");
	free(wf);

	/* not-lease-holder, then job-not-active on the completed job. */
	wf = create(&t, "{\"type\":\"r\",\"steps\":[{\"name\":\"a\",\"job_type\":\"rh\"}]}");
	activate_one(&t, "rh", "w", 60);
	snprintf(path, sizeof(path), "/v1/jobs/%s.s1/complete", wf);
	expect_stored_refusal(&t, path, "{\"worker\":\"intruder\"}", 409,
			      "/problems/not-lease-holder");
	http_response_free(post(&t, path, NULL, "{\"worker\":\"w\",\"output\":{\"v\":1}}"));
	expect_stored_refusal(&t, path, "{\"worker\":\"w\",\"output\":{\"v\":2}}", 409,
			      "/problems/job-not-active");
	free(wf);

	/* state-conflict and invalid-transition. */
	wf = create(&t, "{\"type\":\"r\"}");
	snprintf(path, sizeof(path), "/v1/workflows/%s/transitions", wf);
	expect_stored_refusal(&t, path, "{\"to\":\"cancelled\",\"from\":\"running\"}", 409,
			      "/problems/state-conflict");
	expect_stored_refusal(&t, path, "{\"to\":\"completed\"}", 422,
			      "/problems/invalid-transition");

	/* message-id-reused. */
	snprintf(path, sizeof(path), "/v1/workflows/%s/messages", wf);
	http_response_free(post(&t, path, NULL, "{\"message_id\":\"x\",\"name\":\"go\"}"));
	expect_stored_refusal(&t, path, "{\"message_id\":\"x\",\"name\":\"stop\"}", 409,
			      "/problems/message-id-reused");
	free(wf);
}
