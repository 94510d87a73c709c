/*
 * End-to-end tests of messages published by business key, POST
 * /v1/messages, through nginx and the worker pool against the real
 * database: delivered to the workflow with the key that waits for the
 * name, else kept until its ttl and taken by the first that begins such a
 * wait; expired ones are never delivered and are pruned; message_id
 * deduplicates within the tenant; another tenant never receives one; a
 * publication racing a create with the key is delivered either way.
 *
 * Every test works in a tenant of its own, so business keys and message
 * ids never meet another test's. idemflow prune counts every tenant's
 * messages: the test that reads its count runs alone (TSTACK_SEQUENTIAL).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
 * too short on a loaded machine: a publication racing a create, and five sends of one
 * message, wait on one another's locks.
 */
TSTACK_SETTINGS("idempotency_wait = 10s\n")

TSTACK_SEQUENTIAL

TestSuite(correlate, .timeout = 60);
TestSuite(buffered, .timeout = 60);
TestSuite(dedup, .timeout = 60);
TestSuite(bad_messages, .timeout = 60);

static struct http_response *publish(const struct tstack_tenant *t, const char *key,
                                     const char *body)
{
	return tstack_post(t, "/v1/messages", key, body);
}

static char *outbox_types(const char *wf)
{
	return tstack_text("SELECT string_agg(type, ',' ORDER BY seq) FROM outbox"
	                   " WHERE workflow_id = $1",
	                   wf);
}

static void expect_events(const struct tstack_tenant *t, const char *wf, const char *want)
{
	struct http_response *r;
	char path[128], *o, *h;

	o = outbox_types(wf);
	cr_assert_str_eq(o, want, "outbox of %s", wf);
	snprintf(path, sizeof(path), "/v1/workflows/%s/events", wf);
	r = tstack_get(t, path);
	tstack_expect_status(r, 200);
	h = tstack_text("SELECT string_agg(e ->> 'type', ',' ORDER BY (e ->> 'seq')::int)"
	                "  FROM jsonb_array_elements($1::jsonb -> 'events') e",
	                r->body);
	cr_assert_str_eq(h, want, "history of %s", wf);
	free(o);
	free(h);
	http_response_free(r);
}

static void expect_state(const char *wf, const char *want)
{
	char *s = tstack_text("SELECT state || '/' || step FROM workflows WHERE id = $1", wf);

	cr_assert_str_eq(s, want, "workflow %s (state/step)", wf);
	free(s);
}

/* A workflow of type with business key bk whose steps are steps. */
static char *create(const struct tstack_tenant *t, const char *type, const char *bk,
                    const char *steps)
{
	char body[512];

	snprintf(body, sizeof(body), "{\"type\":\"%s\",\"business_key\":\"%s\",\"steps\":[%s]}",
	         type, bk, steps);
	return tstack_create(t, body);
}

#define WAIT_PAY                                                                                   \
	"{\"name\":\"await\",\"wait_for\":\"pay\"},{\"name\":\"ship\",\"job_type\":\"ship\"}"

/* --- Delivered --------------------------------------------------------- */

Test(correlate, a_message_goes_to_the_workflow_with_the_key_that_waits_for_it)
{
	struct tstack_tenant t;
	struct http_response *r;
	char want[256], *wf, *other, *v;

	tstack_tenant_create(&t, "corr");
	wf = create(&t, "order", "O-1", WAIT_PAY);
	other = create(&t, "order", "O-2", WAIT_PAY);
	r = publish(&t, NULL,
	            "{\"name\":\"pay\",\"business_key\":\"O-1\",\"message_id\":\"p1\","
	            "\"ttl\":\"PT1H\",\"payload\":{\"amount\":5}}");
	tstack_expect_status(r, 200);
	tstack_expect_header(r, "Content-Type", "application/json");
	snprintf(want, sizeof(want),
	         "{\"message_id\":\"p1\",\"duplicate\":false,\"correlated\":true,"
	         "\"workflow_id\":\"%s\",\"step\":1}",
	         wf);
	cr_assert_str_eq(r->body, want);
	http_response_free(r);

	expect_state(wf, "running/2");
	expect_events(&t, wf, "workflow.created,workflow.started,job.completed");
	v = tstack_text("SELECT payload::jsonb -> 'data' FROM outbox WHERE workflow_id = $1"
	                " AND type = 'job.completed'",
	                wf);
	cr_assert_str_eq(v, "{\"name\": \"await\", \"step\": 1, \"output\": {\"amount\": 5}, "
	                    "\"message_id\": \"p1\", \"business_key\": \"O-1\"}");
	free(v);
	expect_state(other, "pending/1");
	expect_events(&t, other, "workflow.created");
	free(wf);
	free(other);
}

Test(correlate, of_two_workflows_waiting_with_the_key_the_earlier_wait_gets_it)
{
	struct tstack_tenant t;
	struct http_response *r;
	char *first, *second, *got;

	tstack_tenant_create(&t, "two");
	first = create(&t, "billing", "C-9", WAIT_PAY);
	second = create(&t, "shipping", "C-9", WAIT_PAY);
	r = publish(&t, NULL, "{\"name\":\"pay\",\"business_key\":\"C-9\",\"message_id\":\"a\"}");
	tstack_expect_status(r, 200);
	got = tstack_json(r->body, "{workflow_id}");
	cr_assert_str_eq(got, first);
	free(got);
	http_response_free(r);
	expect_state(second, "pending/1");
	r = publish(&t, NULL, "{\"name\":\"pay\",\"business_key\":\"C-9\",\"message_id\":\"b\"}");
	tstack_expect_status(r, 200);
	got = tstack_json(r->body, "{workflow_id}");
	cr_assert_str_eq(got, second);
	free(got);
	http_response_free(r);
	free(first);
	free(second);
}

Test(correlate, another_tenant_s_workflow_never_receives_it)
{
	struct tstack_tenant a, b;
	struct http_response *r;
	char *wf;

	tstack_tenant_create(&a, "owner");
	tstack_tenant_create(&b, "stranger");
	wf = create(&a, "order", "SHARED-1", WAIT_PAY);
	r = publish(&b, NULL,
	            "{\"name\":\"pay\",\"business_key\":\"SHARED-1\",\"message_id\":\"x\"}");
	tstack_expect_status(r, 202);
	char *c = tstack_json(r->body, "{correlated}");
	cr_assert_str_eq(c, "false");
	free(c);
	http_response_free(r);
	expect_state(wf, "pending/1");
	expect_events(&a, wf, "workflow.created");
	/* Nor does a workflow of tenant a that begins waiting later. */
	free(wf);
	wf = create(&a, "refund", "SHARED-1", WAIT_PAY);
	expect_state(wf, "pending/1");
	cr_assert_eq(tstack_count("SELECT count(*) FROM messages WHERE tenant_id = $1"
	                          " AND workflow_id IS NULL",
	                          b.id_text),
	             1);
	free(wf);
}

/* --- Buffered ---------------------------------------------------------- */

Test(buffered, a_message_no_one_waits_for_is_kept_and_taken_when_a_wait_begins)
{
	struct tstack_tenant t;
	struct http_response *r;
	char *wf, *exp, want[256];

	tstack_tenant_create(&t, "buf");
	r = publish(&t, NULL,
	            "{\"name\":\"pay\",\"business_key\":\"B-1\",\"message_id\":\"early\","
	            "\"ttl\":\"PT10M\",\"payload\":{\"n\":1}}");
	tstack_expect_status(r, 202);
	exp =
	    tstack_text("SELECT idemflow_ts(expires_at) FROM messages WHERE tenant_id = $1"
	                " AND message_id = 'early' AND expires_at = received_at + interval '10 m'",
	                t.id_text);
	cr_assert_not_null(exp);
	snprintf(want, sizeof(want),
	         "{\"message_id\":\"early\",\"duplicate\":false,\"correlated\":false,"
	         "\"expires_at\":\"%s\"}",
	         exp);
	cr_assert_str_eq(r->body, want);
	http_response_free(r);
	free(exp);

	/* A workflow with the key that first runs a job, then waits. */
	wf = create(
	    &t, "order", "B-1",
	    "{\"name\":\"reserve\",\"job_type\":\"reserve\"},"
	    "{\"name\":\"await\",\"wait_for\":\"pay\"},{\"name\":\"ship\",\"job_type\":\"ship\"}");
	r = tstack_post(&t, "/v1/jobs/activate", NULL,
	                "{\"job_type\":\"reserve\",\"worker\":\"w\",\"lease_seconds\":30}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	char path[160];
	snprintf(path, sizeof(path), "/v1/jobs/%s.s1/complete", wf);
	r = tstack_post(&t, path, NULL, "{\"worker\":\"w\"}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	expect_state(wf, "running/3");
	expect_events(&t, wf, "workflow.created,workflow.started,job.completed,job.completed");
	cr_assert_eq(tstack_count("SELECT count(*) FROM messages WHERE tenant_id = $1"
	                          " AND message_id = 'early' AND workflow_id = $2 AND step = 2",
	                          t.id_text, wf),
	             1);
	/* A second workflow with the key finds nothing left. */
	free(wf);
	wf = create(&t, "order2", "B-1", WAIT_PAY);
	expect_state(wf, "pending/1");
	free(wf);
}

Test(buffered, a_create_that_begins_with_the_wait_takes_it_at_once)
{
	struct tstack_tenant t;
	struct http_response *r;
	char *wf;

	tstack_tenant_create(&t, "bufc");
	r = publish(&t, NULL, "{\"name\":\"pay\",\"business_key\":\"B-2\",\"message_id\":\"m\"}");
	tstack_expect_status(r, 202);
	http_response_free(r);
	wf = create(&t, "order", "B-2", WAIT_PAY);
	expect_state(wf, "pending/2");
	expect_events(&t, wf, "workflow.created,job.completed");
	free(wf);
}

/*
 * A create whose own transaction takes a kept message moves on at once:
 * the answer (and the one stored under the key, replayed byte for byte)
 * is the state it left, as a read shows it, not "pending" at step 1.
 */
Test(buffered, a_create_that_takes_a_kept_message_answers_the_state_it_left)
{
	static const struct {
		const char *bk, *steps, *want;
	} cases[] = {
		{ "B-4", WAIT_PAY, "pending/2" },
		{ "B-5", "{\"name\":\"await\",\"wait_for\":\"pay\"}", "completed/1" },
	};
	struct tstack_tenant t;

	tstack_tenant_create(&t, "bufa");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct http_response *r, *again, *get;
		char body[512], key[64], path[128], *wf, *got;

		snprintf(body, sizeof(body),
		         "{\"name\":\"pay\",\"business_key\":\"%s\",\"message_id\":\"m%zu\"}",
		         cases[i].bk, i);
		r = publish(&t, NULL, body);
		tstack_expect_status(r, 202);
		http_response_free(r);

		snprintf(body, sizeof(body),
		         "{\"type\":\"order\",\"business_key\":\"%s\",\"steps\":[%s]}", cases[i].bk,
		         cases[i].steps);
		tstack_key(key, sizeof(key), "take");
		r = tstack_post(&t, "/v1/workflows", key, body);
		tstack_expect_status(r, 201);
		wf = tstack_text("SELECT $1::jsonb ->> 'id'", r->body);
		expect_state(wf, cases[i].want);
		got = tstack_text("SELECT ($1::jsonb ->> 'state') || '/' || ($1::jsonb ->> 'step')",
		                  r->body);
		cr_assert_str_eq(got, cases[i].want, "the create answered %s", r->body);
		free(got);
		snprintf(path, sizeof(path), "/v1/workflows/%s", wf);
		get = tstack_get(&t, path);
		tstack_expect_status(get, 200);
		cr_assert_str_eq(r->body, get->body, "the create's answer is what a read shows");
		again = tstack_post(&t, "/v1/workflows", key, body);
		tstack_expect_replay(again, r);
		http_response_free(again);
		http_response_free(get);
		http_response_free(r);
		free(wf);
	}
}

/*
 * A kept message lives at most message_ttl_max (30 days by default), not
 * the ten years a duration may say: a longer ttl is refused and nothing is
 * kept, so a tenant's unclaimed messages cannot pile up for years.
 */
Test(buffered, a_ttl_longer_than_message_ttl_max_is_refused_and_keeps_nothing)
{
	struct tstack_tenant t;
	struct http_response *r;

	tstack_tenant_create(&t, "bufttl");
	r = publish(&t, NULL,
	            "{\"name\":\"pay\",\"business_key\":\"L-1\",\"message_id\":\"long\","
	            "\"ttl\":\"P31D\"}");
	tstack_expect_problem(r, 400, "/problems/invalid-duration", "/v1/messages");
	http_response_free(r);
	cr_assert_eq(tstack_count("SELECT count(*) FROM messages WHERE tenant_id = $1", t.id_text),
	             0);
	r = publish(&t, NULL,
	            "{\"name\":\"pay\",\"business_key\":\"L-1\",\"message_id\":\"long\","
	            "\"ttl\":\"P30D\"}");
	tstack_expect_status(r, 202);
	http_response_free(r);
	cr_assert_eq(tstack_count("SELECT count(*) FROM messages WHERE tenant_id = $1"
	                          " AND expires_at = received_at + interval '30 days'",
	                          t.id_text),
	             1);
}

Test(buffered, an_expired_message_is_not_delivered_and_prune_deletes_it)
{
	struct tstack_tenant t;
	struct http_response *r;
	char out[512], *wf;
	long messages = -1;

	tstack_tenant_create(&t, "exp");
	r = publish(&t, NULL,
	            "{\"name\":\"pay\",\"business_key\":\"E-1\",\"message_id\":\"gone\","
	            "\"ttl\":\"PT0.2S\"}");
	tstack_expect_status(r, 202);
	http_response_free(r);
	while (tstack_count("SELECT count(*) FROM messages WHERE tenant_id = $1"
	                    " AND expires_at > now()",
	                    t.id_text) > 0)
		tstack_sleep_ms(20);
	wf = create(&t, "order", "E-1", WAIT_PAY);
	expect_state(wf, "pending/1");
	expect_events(&t, wf, "workflow.created");

	cr_assert_eq(tstack_cli(out, sizeof(out), "prune", NULL), 0, "%s", tstack_cli_stderr());
	const char *m = strstr(out, " messages=");
	cr_assert_not_null(m, "%s", out);
	cr_assert_eq(sscanf(m, " messages=%ld", &messages), 1);
	cr_assert_eq(messages, 1, "%s", out);
	cr_assert_eq(tstack_count("SELECT count(*) FROM messages WHERE tenant_id = $1", t.id_text),
	             0);
	/* Its id is free again once pruned: a new one is buffered. */
	r = publish(&t, NULL,
	            "{\"name\":\"pay\",\"business_key\":\"E-9\",\"message_id\":\"gone\"}");
	tstack_expect_status(r, 202);
	http_response_free(r);
	free(wf);
}

#define RACE_ROUNDS     20  /* at least */
#define RACE_ROUNDS_MAX 200 /* at most, until each order was seen */

struct publisher {
	const struct tstack_tenant *t;
	pthread_barrier_t *start;
	int round;
	long delay_us; /* after the barrier: the create's head start */
	struct http_response *resp;
};

static void *publish_run(void *arg)
{
	struct publisher *p = arg;
	char body[160];

	snprintf(body, sizeof(body),
	         "{\"name\":\"pay\",\"business_key\":\"R-%d\",\"message_id\":\"r-%d\"}", p->round,
	         p->round);
	pthread_barrier_wait(p->start);
	if (p->delay_us > 0)
		usleep((useconds_t)p->delay_us);
	p->resp = tstack_post_raw(p->t, "/v1/messages", NULL, body);
	return NULL;
}

/*
 * A publication and a create of a workflow that begins waiting for it, at
 * once: whichever commits first, the message reaches the workflow
 * (delivered, or buffered and taken by the create), never neither. Both
 * orders must have happened: the side that starts first alternates, by
 * 0 to 8 ms, and rounds go on (at most RACE_ROUNDS_MAX) until each was
 * seen.
 */
Test(buffered, a_message_racing_a_create_with_the_key_is_delivered_either_way)
{
	struct tstack_tenant t;
	int delivered = 0, taken = 0, i;

	tstack_tenant_create(&t, "race");
	for (i = 0; i < RACE_ROUNDS_MAX && (i < RACE_ROUNDS || delivered == 0 || taken == 0); i++) {
		pthread_barrier_t start;
		/* Even rounds: the create sleeps; odd: the publication. */
		long head_us = (long)(i / 2 % 5) * 2000;
		struct publisher p = { &t, &start, i, i % 2 ? head_us : 0, NULL };
		pthread_t th;
		char bk[16], *wf;

		snprintf(bk, sizeof(bk), "R-%d", i);
		cr_assert_eq(pthread_barrier_init(&start, NULL, 2), 0);
		cr_assert_eq(pthread_create(&th, NULL, publish_run, &p), 0);
		pthread_barrier_wait(&start);
		if (i % 2 == 0 && head_us > 0)
			usleep((useconds_t)head_us);
		wf = create(&t, "order", bk, WAIT_PAY);
		pthread_join(th, NULL);
		pthread_barrier_destroy(&start);
		cr_assert_not_null(p.resp, "round %d: %s", i, http_error());
		cr_assert(p.resp->status == 200 || p.resp->status == 202, "round %d: %d %s", i,
		          p.resp->status, p.resp->body);
		if (p.resp->status == 200)
			delivered++;
		else
			taken++;
		cr_assert_eq(tstack_count("SELECT count(*) FROM outbox WHERE workflow_id = $1"
		                          " AND type = 'job.completed'",
		                          wf),
		             1, "round %d: the message never reached the workflow", i);
		http_response_free(p.resp);
		free(wf);
	}
	cr_log_info("%d rounds: delivered at once: %d, buffered then taken: %d", i, delivered,
	            taken);
	cr_assert_gt(delivered, 0, "in %d rounds the create never came first", i);
	cr_assert_gt(taken, 0, "in %d rounds the publication never came first", i);
}

/* --- Deduplication ----------------------------------------------------- */

#define SENDS 5

struct sender {
	const struct tstack_tenant *t;
	pthread_barrier_t *start;
	struct http_response *resp;
};

static void *send_run(void *arg)
{
	struct sender *s = arg;

	pthread_barrier_wait(s->start);
	s->resp =
	    tstack_post_raw(s->t, "/v1/messages", NULL,
	                    "{\"name\":\"pay\",\"business_key\":\"D-1\",\"message_id\":\"dup\","
	                    "\"payload\":{\"v\":1}}");
	return NULL;
}

Test(dedup, the_same_message_posted_five_times_at_once_is_delivered_once)
{
	struct tstack_tenant t;
	struct sender s[SENDS];
	pthread_t th[SENDS];
	pthread_barrier_t start;
	char *wf, want[256];
	int fresh = 0, dups = 0;

	tstack_tenant_create(&t, "dup");
	wf = create(&t, "order", "D-1", WAIT_PAY);
	cr_assert_eq(pthread_barrier_init(&start, NULL, SENDS), 0);
	for (int i = 0; i < SENDS; i++) {
		s[i] = (struct sender){ &t, &start, NULL };
		cr_assert_eq(pthread_create(&th[i], NULL, send_run, &s[i]), 0);
	}
	for (int i = 0; i < SENDS; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&start);
	for (int i = 0; i < SENDS; i++) {
		cr_assert_not_null(s[i].resp, "send %d: %s", i, http_error());
		tstack_expect_status(s[i].resp, 200);
		char *d = tstack_json(s[i].resp->body, "{duplicate}");
		snprintf(want, sizeof(want),
		         "{\"message_id\":\"dup\",\"duplicate\":%s,\"correlated\":true,"
		         "\"workflow_id\":\"%s\",\"step\":1}",
		         d, wf);
		cr_assert_str_eq(s[i].resp->body, want);
		if (strcmp(d, "false") == 0)
			fresh++;
		else
			dups++;
		free(d);
		http_response_free(s[i].resp);
	}
	cr_assert_eq(fresh, 1);
	cr_assert_eq(dups, SENDS - 1);
	expect_events(&t, wf, "workflow.created,workflow.started,job.completed");
	free(wf);
}

Test(dedup, a_keyed_publication_replays_byte_for_byte)
{
	struct tstack_tenant t;
	struct http_response *first, *again;
	char key[64];
	const char *body = "{\"name\":\"pay\",\"business_key\":\"K-1\",\"message_id\":\"k\"}";

	tstack_tenant_create(&t, "keyed");
	tstack_key(key, sizeof(key), "pub");
	first = publish(&t, key, body);
	tstack_expect_status(first, 202);
	again = publish(&t, key, body);
	tstack_expect_status(again, 202);
	tstack_expect_header(again, "Idempotent-Replayed", "true");
	cr_assert_eq(again->body_len, first->body_len);
	cr_assert(memcmp(again->body, first->body, first->body_len) == 0, "%s / %s", again->body,
	          first->body);
	http_response_free(first);
	http_response_free(again);
	cr_assert_eq(tstack_count("SELECT count(*) FROM messages WHERE tenant_id = $1", t.id_text),
	             1);
}

Test(dedup, a_message_id_used_for_another_message_is_409_across_both_routes)
{
	struct tstack_tenant t;
	struct http_response *r;
	char path[128], *wf;

	tstack_tenant_create(&t, "reuse");
	r = publish(&t, NULL, "{\"name\":\"pay\",\"business_key\":\"U-1\",\"message_id\":\"u\"}");
	tstack_expect_status(r, 202);
	http_response_free(r);
	r = publish(&t, NULL, "{\"name\":\"pay\",\"business_key\":\"U-2\",\"message_id\":\"u\"}");
	tstack_expect_problem(r, 409, "/problems/message-id-reused", "/v1/messages");
	http_response_free(r);
	wf = create(&t, "order", "U-3", WAIT_PAY);
	snprintf(path, sizeof(path), "/v1/workflows/%s/messages", wf);
	r = tstack_post(&t, path, NULL, "{\"message_id\":\"u\",\"name\":\"pay\"}");
	tstack_expect_problem(r, 409, "/problems/message-id-reused", path);
	http_response_free(r);
	expect_state(wf, "pending/1");
	free(wf);
}

/* --- Bad input --------------------------------------------------------- */

Test(bad_messages, bad_bodies_are_refused_and_change_nothing)
{
	struct tstack_tenant t;
	static const struct {
		const char *body;
		int status;
		const char *type, *detail;
	} cases[] = {
		{ "{\"name\":\"pay\",\"business_key\":\"X\",\"message_id\":\"m\",\"ttl\":\"1h\"}",
		  400, "/problems/invalid-duration",
		  "\"ttl\": expected an ISO 8601 duration such as \"PT30S\" or \"P1DT2H\"" },
		{ "{\"name\":\"pay\",\"business_key\":\"X\",\"message_id\":\"m\",\"ttl\":\"P1M\"}",
		  400, "/problems/invalid-duration",
		  "\"ttl\": months have no fixed length: use days" },
		{ "{\"name\":\"pay\",\"business_key\":\"X\",\"message_id\":\"m\",\"ttl\":3600}",
		  400, "/problems/invalid-duration", "\"ttl\" must be a string" },
		{ "{\"name\":\"pay\",\"message_id\":\"m\"}", 422, "/problems/invalid-request",
		  "\"business_key\" is required" },
		{ "{\"name\":\"pay\",\"business_key\":\"X\"}", 422, "/problems/invalid-request",
		  "\"message_id\" is required" },
		{ "{\"name\":\"pay\",\"business_key\":\"X\",\"message_id\":\"m\",\"to\":\"y\"}",
		  422, "/problems/invalid-request",
		  "unknown member \"to\": expected name, business_key, message_id, ttl, payload" },
		{ "{\"name\":\"pay\",\"business_key\":\"X\",\"message_id\":\"m\",\"payload\":[1]}",
		  422, "/problems/invalid-request", "\"payload\" must be a JSON object" },
	};

	tstack_tenant_create(&t, "badmsg");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct http_response *r = publish(&t, NULL, cases[i].body);
		char *d;
		tstack_expect_problem(r, cases[i].status, cases[i].type, "/v1/messages");
		d = tstack_json(r->body, "{detail}");
		cr_assert_str_eq(d, cases[i].detail, "for %s", cases[i].body);
		free(d);
		http_response_free(r);
	}
	cr_assert_eq(tstack_count("SELECT count(*) FROM messages WHERE tenant_id = $1", t.id_text),
	             0);
}
