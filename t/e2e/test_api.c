/*
 * End-to-end tests of the HTTP API through nginx, against the stack that
 * t/run-test starts (3 workers, idempotency_wait = 1s).
 *
 * Criterion runs each Test in its own process, possibly in parallel, so
 * every test works in a tenant of its own with keys of its own, and counts
 * only that tenant's rows.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
#define RACERS     20

/* The smallest valid workflow, for tests about everything but the body. */
static const char MIN_BODY[] = "{\"type\":\"x\",\"input\":{}}";

/*
 * Settings of its own (TSTACK_SETTINGS): idempotency_wait, which is also
 * every worker's lock_timeout, is 10 s, not the harness's 1 s, a window
 * too short on a loaded machine: a worker killed while it waits on a held key, 20
 * requests of one key queued on its claim.
 */
TSTACK_SETTINGS("idempotency_wait = 10s\n")

TestSuite(create, .timeout = 60);
TestSuite(replay, .timeout = 60);
TestSuite(concurrency, .timeout = 60);
TestSuite(in_flight, .timeout = 60);
TestSuite(idempotency_key, .timeout = 60);
TestSuite(validation, .timeout = 60);
TestSuite(auth, .timeout = 60);
TestSuite(routing, .timeout = 60);
TestSuite(isolation, .timeout = 60);
TestSuite(crash, .timeout = 60);

/* --- Helpers ----------------------------------------------------------- */

static struct http_response *request(const char *method, const char *path,
                                     const char *const *headers, const char *body, size_t body_len)
{
	struct http_response *r = http_request(method, path, headers, body, body_len);

	cr_assert_not_null(r, "%s %s: %s", method, path, http_error());
	return r;
}

/* "Idempotency-Key: <key>" into buf, or NULL when key is NULL. */
static const char *key_header(char *buf, size_t size, const char *key)
{
	if (!key)
		return NULL;
	snprintf(buf, size, "Idempotency-Key: %s", key);
	return buf;
}

/* POST /v1/workflows as t with a JSON body and, unless NULL, a key. */
static struct http_response *post(const struct tstack_tenant *t, const char *key, const char *body)
{
	char kh[1024];
	const char *h[] = { t->auth, JSON_CT, key_header(kh, sizeof(kh), key), NULL };

	return request("POST", COLLECTION, h, body, strlen(body));
}

static struct http_response *get(const struct tstack_tenant *t, const char *path)
{
	const char *h[] = { t->auth, NULL };

	return request("GET", path, h, NULL, 0);
}

static void expect_no_header(const struct http_response *r, const char *name)
{
	cr_assert_null(http_header(r, name), "unexpected %s: %s", name, http_header(r, name));
}

/* --- create ------------------------------------------------------------ */

Test(create, post_returns_201_with_location_and_body_and_writes_one_row_each)
{
	struct tstack_tenant t;
	struct http_response *r;
	char key[128], *id, *created_at;

	tstack_tenant_create(&t, "create");
	tstack_key(key, sizeof(key), "create");
	r = post(&t, key, "{\"type\":\"order.ship\",\"input\":{\"b\":2,\"a\":1}}");
	id = tstack_expect_created(r, "order.ship", "{\"a\":1,\"b\":2}");
	created_at = tstack_json(r->body, "{created_at}");

	tstack_expect_counts(&t, 1, 1, 1);
	cr_assert_eq(tstack_count("SELECT count(*) FROM workflows"
	                          " WHERE tenant_id = $1 AND id = $2"
	                          "   AND type = 'order.ship' AND state = 'pending'"
	                          "   AND input = '{\"a\":1,\"b\":2}'::jsonb"
	                          "   AND created_at = $3::timestamptz",
	                          t.id_text, id, created_at),
	             1, "workflow row does not match the response %s", r->body);
	cr_assert_eq(tstack_count("SELECT count(*) FROM outbox"
	                          " WHERE tenant_id = $1 AND workflow_id = $2"
	                          "   AND type = 'workflow.created'",
	                          t.id_text, id),
	             1, "no workflow.created event for %s", id);
	cr_assert_eq(tstack_count("SELECT count(*) FROM idempotency_keys"
	                          " WHERE tenant_id = $1 AND key = $2"
	                          "   AND status = 201",
	                          t.id_text, key),
	             1, "no stored 201 for key %s", key);

	free(created_at);
	free(id);
	http_response_free(r);
}

Test(create, input_is_returned_in_canonical_form)
{
	struct tstack_tenant t;
	struct http_response *r;
	char key[128], *id;

	tstack_tenant_create(&t, "canon");
	tstack_key(key, sizeof(key), "canon");
	/* Reordered members at every level, whitespace, and an escape that
	 * the canonical form writes as literal UTF-8. */
	r = post(&t, key,
	         "{ \"input\" : { \"b\" : [1, {\"d\": true, \"c\": null}],"
	         " \"a\" : \"\\u00e9\" } , \"type\" : \"x\" }");
	id =
	    tstack_expect_created(r, "x", "{\"a\":\"\xc3\xa9\",\"b\":[1,{\"c\":null,\"d\":true}]}");
	tstack_expect_counts(&t, 1, 1, 1);
	free(id);
	http_response_free(r);
}

/*
 * Integers beyond 64 bits are the doubles they read as, in the POST's echo
 * and in GET, which reads the input back from jsonb (jsonb prints 1e30 as
 * 31 digits). json-c alone would clamp each to a 64-bit limit.
 */
Test(create, integers_beyond_64_bits_are_doubles_in_post_and_get)
{
	static const char want[] = "{\"big\":18446744073709551616,\"e\":1e+30,"
	                           "\"i\":-9223372036854775808,\"u\":18446744073709551615}";
	struct tstack_tenant t;
	struct http_response *r, *g;
	char key[128], path[64], *id, *input;

	tstack_tenant_create(&t, "bigint");
	tstack_key(key, sizeof(key), "bigint");
	r = post(&t, key,
	         "{\"type\":\"x\",\"input\":{\"big\":18446744073709551616,\"e\":1e30,"
	         "\"i\":-9223372036854775809,\"u\":18446744073709551615}}");
	id = tstack_expect_created(r, "x", want);
	snprintf(path, sizeof(path), COLLECTION "/%s", id);
	g = get(&t, path);
	cr_assert_eq(g->status, 200, "status %d, body %.500s", g->status, g->body);
	input = strstr(g->body, "\"input\":");
	cr_assert(input && strncmp(input + 8, want, strlen(want)) == 0,
	          "GET input differs from %s: %s", want, g->body);
	tstack_expect_counts(&t, 1, 1, 1);
	free(id);
	http_response_free(g);
	http_response_free(r);
}

/* --- replay ------------------------------------------------------------ */

Test(replay, five_keyed_repeats_create_one_workflow_and_replay_four_times)
{
	const char *body = "{\"type\":\"x\",\"input\":{\"n\":5}}";
	struct tstack_tenant t;
	struct http_response *first;
	char key[128], *id;

	tstack_tenant_create(&t, "replay5");
	tstack_key(key, sizeof(key), "replay5");
	first = post(&t, key, body);
	id = tstack_expect_created(first, "x", "{\"n\":5}");
	for (int i = 0; i < 4; i++) {
		struct http_response *r = post(&t, key, body);

		tstack_expect_replay(r, first);
		http_response_free(r);
	}
	tstack_expect_counts(&t, 1, 1, 1);
	free(id);
	http_response_free(first);
}

Test(replay, reordered_members_and_whitespace_are_the_same_request)
{
	struct tstack_tenant t;
	struct http_response *first, *again;
	char key[128], *id;

	tstack_tenant_create(&t, "reorder");
	tstack_key(key, sizeof(key), "reorder");
	first = post(&t, key, "{\"input\":{\"b\":2,\"a\":1},\"type\":\"x\"}");
	id = tstack_expect_created(first, "x", "{\"a\":1,\"b\":2}");
	again = post(&t, key, "{ \"type\": \"x\", \"input\": {\"a\":1, \"b\":2} }");
	tstack_expect_replay(again, first);
	tstack_expect_counts(&t, 1, 1, 1);
	free(id);
	http_response_free(again);
	http_response_free(first);
}

Test(replay, same_key_with_different_body_is_409_and_writes_nothing)
{
	const char *body = "{\"type\":\"x\",\"input\":{\"a\":1}}";
	struct tstack_tenant t;
	struct http_response *first, *r;
	char key[128], *id, *named;

	tstack_tenant_create(&t, "reused");
	tstack_key(key, sizeof(key), "reused");
	first = post(&t, key, body);
	id = tstack_expect_created(first, "x", "{\"a\":1}");

	r = post(&t, key, "{\"type\":\"x\",\"input\":{\"a\":2}}");
	tstack_expect_problem(r, 409, "/problems/idempotency-key-reused", COLLECTION);
	expect_no_header(r, "Idempotent-Replayed");
	named = tstack_json(r->body, "{idempotency_key}");
	cr_assert_not_null(named, "409 must name the key: %s", r->body);
	cr_assert_str_eq(named, key);
	free(named);
	http_response_free(r);
	tstack_expect_counts(&t, 1, 1, 1);

	/* The conflict left the stored response intact. */
	r = post(&t, key, body);
	tstack_expect_replay(r, first);
	http_response_free(r);

	free(id);
	http_response_free(first);
}

/*
 * A retry with the very bytes of the first request is answered from the key
 * row's request_bytes_fp, without parsing the body; other bytes are compared
 * by their canonical fingerprint. Proved by tampering with the stored
 * canonical fingerprint: the same bytes still replay (only the bytes
 * fingerprint was compared), reformatted JSON is now a conflict (only the
 * canonical one was). A row without request_bytes_fp (older rows) replays
 * by the canonical comparison alone.
 */
Test(replay, same_bytes_replay_without_the_canonical_comparison_other_bytes_use_it)
{
	const char *body = "{\"type\":\"x\",\"input\":{\"a\":1,\"b\":2}}";
	const char *reformatted = "{ \"input\": {\"b\":2, \"a\":1}, \"type\": \"x\" }";
	struct tstack_tenant t;
	struct http_response *first, *r;
	char key[128], *id;

	tstack_tenant_create(&t, "bytesfp");
	tstack_key(key, sizeof(key), "bytesfp");
	first = post(&t, key, body);
	id = tstack_expect_created(first, "x", "{\"a\":1,\"b\":2}");
	cr_assert_eq(
	    tstack_count("SELECT count(*) FROM idempotency_keys WHERE key = $1"
	                 " AND request_bytes_fp IS NOT NULL AND request_bytes_fp <> fingerprint",
	                 key),
	    1, "the create stores the fingerprint of its bytes");

	tstack_exec(tstack_db(), "UPDATE idempotency_keys SET fingerprint = '\\x00' WHERE key = $1",
	            key);
	r = post(&t, key, body);
	tstack_expect_replay(r, first);
	http_response_free(r);
	r = post(&t, key, reformatted);
	tstack_expect_problem(r, 409, "/problems/idempotency-key-reused", COLLECTION);
	http_response_free(r);

	/* Without the bytes fingerprint the same bytes meet the tampered
	 * canonical one: a conflict, so the replay above did not use it. A
	 * new token, so that the row is read again, not from a worker's
	 * replay cache. */
	tstack_exec(tstack_db(),
	            "UPDATE idempotency_keys SET request_bytes_fp = NULL WHERE key = $1", key);
	tstack_tenant_retoken(&t);
	r = post(&t, key, body);
	tstack_expect_problem(r, 409, "/problems/idempotency-key-reused", COLLECTION);
	http_response_free(r);
	tstack_expect_counts(&t, 1, 1, 1);
	free(id);
	http_response_free(first);
}

/* A row made before request_bytes_fp existed replays by its canonical
 * fingerprint, whatever the bytes. */
Test(replay, a_row_without_the_bytes_fingerprint_replays_by_the_canonical_one)
{
	struct tstack_tenant t;
	struct http_response *first, *r;
	char key[128], *id;

	tstack_tenant_create(&t, "oldrow");
	tstack_key(key, sizeof(key), "oldrow");
	first = post(&t, key, "{\"type\":\"x\",\"input\":{\"n\":1}}");
	id = tstack_expect_created(first, "x", "{\"n\":1}");
	tstack_exec(tstack_db(),
	            "UPDATE idempotency_keys SET request_bytes_fp = NULL WHERE key = $1", key);
	r = post(&t, key, "{\"type\":\"x\",\"input\":{\"n\":1}}");
	tstack_expect_replay(r, first);
	http_response_free(r);
	r = post(&t, key, "{\"input\":{\"n\":1},\"type\":\"x\"}");
	tstack_expect_replay(r, first);
	http_response_free(r);
	r = post(&t, key, "{\"type\":\"x\",\"input\":{\"n\":2}}");
	tstack_expect_problem(r, 409, "/problems/idempotency-key-reused", COLLECTION);
	http_response_free(r);
	tstack_expect_counts(&t, 1, 1, 1);
	free(id);
	http_response_free(first);
}

/* --- concurrency ------------------------------------------------------- */

struct racer {
	pthread_barrier_t *start;
	const char *const *headers;
	const char *body;
	struct http_response *resp;
	char err[512];
};

static void *racer_run(void *arg)
{
	struct racer *rc = arg;

	pthread_barrier_wait(rc->start);
	rc->resp = http_request("POST", COLLECTION, rc->headers, rc->body, strlen(rc->body));
	if (!rc->resp)
		snprintf(rc->err, sizeof(rc->err), "%s", http_error());
	return NULL;
}

Test(concurrency, twenty_simultaneous_posts_with_one_key_create_one_workflow)
{
	const char *body = "{\"type\":\"race\",\"input\":{\"r\":20}}";
	struct racer racers[RACERS];
	pthread_t threads[RACERS];
	pthread_barrier_t start;
	struct tstack_tenant t;
	const struct http_response *fresh = NULL;
	char key[128], kh[160], *id, *row;
	size_t replays = 0;

	tstack_tenant_create(&t, "race");
	tstack_key(key, sizeof(key), "race");
	const char *headers[] = { t.auth, JSON_CT, key_header(kh, sizeof(kh), key), NULL };

	cr_assert_eq(pthread_barrier_init(&start, NULL, RACERS), 0);
	for (int i = 0; i < RACERS; i++) {
		racers[i] = (struct racer){ .start = &start, .headers = headers, .body = body };
		cr_assert_eq(pthread_create(&threads[i], NULL, racer_run, &racers[i]), 0);
	}
	for (int i = 0; i < RACERS; i++)
		pthread_join(threads[i], NULL);
	pthread_barrier_destroy(&start);

	for (int i = 0; i < RACERS; i++) {
		const struct http_response *r = racers[i].resp;
		const char *replayed;

		cr_assert_not_null(r, "request %d: %s", i, racers[i].err);
		cr_assert_eq(r->status, 201, "request %d: status %d, body %.500s", i, r->status,
		             r->body);
		replayed = http_header(r, "Idempotent-Replayed");
		if (replayed) {
			cr_assert_str_eq(replayed, "true");
			replays++;
		} else {
			cr_assert_null(fresh, "two requests were not replays");
			fresh = r;
		}
	}
	cr_assert_not_null(fresh, "every request claimed to be a replay");
	cr_assert_eq(replays, RACERS - 1);
	id = tstack_expect_created(fresh, "race", "{\"r\":20}");
	for (int i = 0; i < RACERS; i++)
		if (racers[i].resp != fresh)
			tstack_expect_replay(racers[i].resp, fresh);

	tstack_expect_counts(&t, 1, 1, 1);
	row = tstack_text("SELECT id::text FROM workflows WHERE tenant_id = $1", t.id_text);
	cr_assert_str_eq(row, id);
	free(row);
	free(id);
	for (int i = 0; i < RACERS; i++)
		http_response_free(racers[i].resp);
}

/* --- in flight --------------------------------------------------------- */

Test(in_flight, key_held_past_idempotency_wait_is_409_with_retry_after)
{
	const char *body = MIN_BODY;
	long wait_ms = tstack_conf_ms("idempotency_wait", 5000);
	struct tstack_tenant t;
	struct http_response *r;
	char key[128], retry_after[32], *id;
	double t0, elapsed;
	PGconn *hold;

	if (!tstack_conf_get("retry_after", retry_after, sizeof(retry_after)))
		strcpy(retry_after, "1");
	tstack_tenant_create(&t, "inflight");
	tstack_key(key, sizeof(key), "inflight");

	hold = tstack_db_connect();
	tstack_key_hold(hold, &t, key);
	t0 = tstack_now();
	r = post(&t, key, body);
	elapsed = tstack_now() - t0;
	tstack_exec(hold, "ROLLBACK");
	PQfinish(hold);

	tstack_expect_problem(r, 409, "/problems/idempotency-key-in-flight", COLLECTION);
	tstack_expect_header(r, "Retry-After", retry_after);
	/* It waited for the holder, but not much longer than promised. */
	cr_assert(elapsed >= wait_ms / 1000.0 * 0.9,
	          "answered after %.3fs, idempotency_wait is %ldms", elapsed, wait_ms);
	cr_assert(elapsed < wait_ms / 1000.0 + 5, "answered after %.3fs, idempotency_wait is %ldms",
	          elapsed, wait_ms);
	http_response_free(r);
	tstack_expect_counts(&t, 0, 0, 0);

	/* Once the holder is gone the key is free for a first request. */
	r = post(&t, key, body);
	id = tstack_expect_created(r, "x", "{}");
	tstack_expect_counts(&t, 1, 1, 1);
	free(id);
	http_response_free(r);
}

/* --- idempotency key syntax -------------------------------------------- */

Test(idempotency_key, missing_key_is_400_and_writes_nothing)
{
	struct tstack_tenant t;
	struct http_response *r;

	tstack_tenant_create(&t, "nokey");
	r = post(&t, NULL, MIN_BODY);
	tstack_expect_problem(r, 400, "/problems/missing-idempotency-key", COLLECTION);
	tstack_expect_counts(&t, 0, 0, 0);
	http_response_free(r);
}

Test(idempotency_key, malformed_keys_are_400_and_write_nothing)
{
	char long_key[257];
	const char *keys[] = {
		long_key,      /* 256 characters: one too many */
		"has space",   /* 0x20 is outside 0x21..0x7E */
		"ctl\x01key",  /* control character */
		"del\x7fkey",  /* DEL */
		"caf\xc3\xa9", /* non-ASCII (UTF-8 é) */
	};
	struct tstack_tenant t;

	memset(long_key, 'k', 256);
	long_key[256] = '\0';
	tstack_tenant_create(&t, "badkey");
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		struct http_response *r = post(&t, keys[i], MIN_BODY);

		tstack_expect_problem(r, 400, "/problems/invalid-idempotency-key", COLLECTION);
		tstack_expect_counts(&t, 0, 0, 0);
		http_response_free(r);
	}
}

Test(idempotency_key, key_of_255_printable_characters_is_accepted_and_replayed)
{
	struct tstack_tenant t;
	struct http_response *first, *again;
	char key[256], *id;

	/* Every allowed byte 0x21..0x7E, cycled up to the maximum length. */
	for (int i = 0; i < 255; i++)
		key[i] = (char)(0x21 + i % (0x7E - 0x21 + 1));
	key[255] = '\0';
	tstack_tenant_create(&t, "longkey");
	first = post(&t, key, MIN_BODY);
	id = tstack_expect_created(first, "x", "{}");
	again = post(&t, key, MIN_BODY);
	tstack_expect_replay(again, first);
	tstack_expect_counts(&t, 1, 1, 1);
	cr_assert_eq(tstack_count("SELECT count(*) FROM idempotency_keys"
	                          " WHERE tenant_id = $1 AND key = $2",
	                          t.id_text, key),
	             1, "the key must be stored byte for byte");
	free(id);
	http_response_free(again);
	http_response_free(first);
}

/* --- validation -------------------------------------------------------- */

Test(validation, invalid_bodies_are_rejected_without_consuming_the_key)
{
	static const struct {
		const char *body;
		int status;
		const char *type;
	} cases[] = {
		{ "{\"type\":", 400, "/problems/invalid-json" },
		{ "", 400, "/problems/invalid-json" },
		{ "{\"type\":\"x\",\"input\":{}} trailing", 400, "/problems/invalid-json" },
		{ "[{\"type\":\"x\",\"input\":{}}]", 400, "/problems/invalid-json" },
		{ "null", 400, "/problems/invalid-json" },
		{ "\"x\"", 400, "/problems/invalid-json" },
		{ "{\"input\":{}}", 422, "/problems/invalid-workflow" },
		{ "{\"type\":\"\",\"input\":{}}", 422, "/problems/invalid-workflow" },
		{ "{\"type\":7,\"input\":{}}", 422, "/problems/invalid-workflow" },
		{ "{\"type\":\"x\",\"input\":[1]}", 422, "/problems/invalid-workflow" },
		{ "{\"type\":\"x\",\"input\":\"s\"}", 422, "/problems/invalid-workflow" },
		/* json-c would have cut this key to "a". */
		{ "{\"type\":\"x\",\"input\":{\"a\\u0000b\":1}}", 400, "/problems/invalid-json" },
	};
	struct tstack_tenant t;
	struct http_response *r;
	char key[128], *id;

	tstack_tenant_create(&t, "invalid");
	tstack_key(key, sizeof(key), "invalid");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		r = post(&t, key, cases[i].body);
		cr_assert_eq(r->status, cases[i].status, "body '%s': status %d, want %d; %.500s",
		             cases[i].body, r->status, cases[i].status, r->body);
		tstack_expect_problem(r, cases[i].status, cases[i].type, COLLECTION);
		tstack_expect_counts(&t, 0, 0, 0);
		http_response_free(r);
	}
	/* The same key still creates: rejected requests are not stored. */
	r = post(&t, key, "{\"type\":\"x\",\"input\":{\"ok\":true}}");
	id = tstack_expect_created(r, "x", "{\"ok\":true}");
	tstack_expect_counts(&t, 1, 1, 1);
	free(id);
	http_response_free(r);
}

/* {"type":"pad","input":{"p":"aaa..."}} of exactly len bytes. */
static char *padded_body(size_t len)
{
	static const char head[] = "{\"type\":\"pad\",\"input\":{\"p\":\"";
	static const char tail[] = "\"}}";
	char *b = malloc(len + 1);

	cr_assert_not_null(b);
	cr_assert(len > sizeof(head) + sizeof(tail));
	memcpy(b, head, sizeof(head) - 1);
	memset(b + sizeof(head) - 1, 'a', len - (sizeof(head) - 1) - (sizeof(tail) - 1));
	memcpy(b + len - (sizeof(tail) - 1), tail, sizeof(tail) - 1);
	b[len] = '\0';
	return b;
}

Test(validation, body_over_max_body_is_413_and_writes_nothing)
{
	long max_body = tstack_conf_long("max_body", 1048576);
	struct tstack_tenant t;
	struct http_response *r;
	char key[128], *body;

	tstack_tenant_create(&t, "toolarge");
	tstack_key(key, sizeof(key), "toolarge");
	body = padded_body((size_t)max_body + (size_t)max_body / 2);
	r = post(&t, key, body);
	tstack_expect_problem(r, 413, "/problems/body-too-large", COLLECTION);
	tstack_expect_counts(&t, 0, 0, 0);
	free(body);
	http_response_free(r);
}

Test(validation, body_of_exactly_max_body_bytes_is_accepted)
{
	long max_body = tstack_conf_long("max_body", 1048576);
	struct tstack_tenant t;
	struct http_response *r;
	char key[128], *body, *input, *id;

	tstack_tenant_create(&t, "maxbody");
	tstack_key(key, sizeof(key), "maxbody");
	body = padded_body((size_t)max_body);
	r = post(&t, key, body);
	/* The body is already canonical, so input is its "input" member. */
	input = strstr(body, "{\"p\":");
	input[strlen(input) - 1] = '\0';
	id = tstack_expect_created(r, "pad", input);
	tstack_expect_counts(&t, 1, 1, 1);
	free(id);
	free(body);
	http_response_free(r);
}

Test(validation, content_type_other_than_json_is_415_and_writes_nothing)
{
	const char *types[] = { "Content-Type: text/plain",
		                "Content-Type: application/x-www-form-urlencoded", NULL };
	struct tstack_tenant t;
	char key[128], kh[160];

	tstack_tenant_create(&t, "mediatype");
	tstack_key(key, sizeof(key), "mediatype");
	key_header(kh, sizeof(kh), key);
	/* The last round sends no Content-Type at all. */
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		const char *h[] = { t.auth, kh, types[i], NULL };
		struct http_response *r;

		r = request("POST", COLLECTION, h, MIN_BODY, strlen(MIN_BODY));
		tstack_expect_problem(r, 415, "/problems/unsupported-media-type", COLLECTION);
		tstack_expect_counts(&t, 0, 0, 0);
		http_response_free(r);
	}
}

Test(validation, json_content_type_with_charset_parameter_is_accepted)
{
	struct tstack_tenant t;
	struct http_response *r;
	char key[128], kh[160], *id;

	tstack_tenant_create(&t, "charset");
	tstack_key(key, sizeof(key), "charset");
	const char *h[] = { t.auth, key_header(kh, sizeof(kh), key),
		            "Content-Type: application/json; charset=utf-8", NULL };

	r = request("POST", COLLECTION, h, MIN_BODY, strlen(MIN_BODY));
	id = tstack_expect_created(r, "x", "{}");
	tstack_expect_counts(&t, 1, 1, 1);
	free(id);
	http_response_free(r);
}

/* --- auth -------------------------------------------------------------- */

/* RFC 6750 section 3.1: a challenge names an error only when a token was
 * presented and rejected. */
#define CHALLENGE           "Bearer realm=\"idemflow\""
#define CHALLENGE_BAD_TOKEN CHALLENGE ", error=\"invalid_token\""

/*
 * A POST with the given Authorization line (or none) under key is refused
 * with the given challenge, and nothing is stored under the key (there is
 * no tenant to count by, so the key itself is counted).
 */
static void expect_unauthorized(const char *auth, const char *key, const char *challenge)
{
	char kh[1024];
	const char *h[] = { JSON_CT, key_header(kh, sizeof(kh), key), auth, NULL };
	struct http_response *r;

	r = request("POST", COLLECTION, h, MIN_BODY, strlen(MIN_BODY));
	tstack_expect_problem(r, 401, "/problems/unauthorized", COLLECTION);
	tstack_expect_header(r, "WWW-Authenticate", challenge);
	cr_assert_eq(tstack_count("SELECT count(*) FROM idempotency_keys"
	                          " WHERE key = $1",
	                          key),
	             0, "a refused request stored its key");
	http_response_free(r);
}

Test(auth, missing_unknown_or_malformed_credentials_are_401)
{
	struct {
		const char *auth;
		const char *challenge;
	} cases[] = {
		{ NULL, CHALLENGE },
		{ NULL, CHALLENGE_BAD_TOKEN }, /* unknown token, set below */
		{ "Authorization: Bearer", CHALLENGE },
		{ "Authorization: Basic dXNlcjpwYXNz", CHALLENGE },
		{ "Authorization: Bearer not-a-token", CHALLENGE_BAD_TOKEN },
	};
	char unknown[80], hex[33], key[128];

	tstack_random_hex(hex, 16);
	snprintf(unknown, sizeof(unknown), "Authorization: Bearer %s", hex);
	cases[1].auth = unknown;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		tstack_key(key, sizeof(key), "auth");
		expect_unauthorized(cases[i].auth, key, cases[i].challenge);
	}
}

/*
 * A create checks its token in its own statement, yet a bad token is
 * answered first whatever else is wrong with the request, as if it had
 * been checked before the body: 401, and nothing written.
 */
Test(auth, a_bad_token_is_401_before_anything_wrong_with_the_create)
{
	static const struct {
		const char *ct; /* Content-Type line, or NULL */
		int keyed;      /* 0: no key, 1: a key, 2: an invalid key */
		const char *body;
	} cases[] = {
		{ JSON_CT, 1, MIN_BODY },                    /* nothing else wrong */
		{ JSON_CT, 1, "{\"type\":" },                /* invalid JSON */
		{ JSON_CT, 1, "{\"input\":{}}" },            /* no type */
		{ JSON_CT, 1, "[1]" },                       /* not an object */
		{ "Content-Type: text/plain", 1, MIN_BODY }, /* unsupported media type */
		{ JSON_CT, 0, MIN_BODY },                    /* no Idempotency-Key */
		/* valid runs: the token is checked before their statements */
		{ JSON_CT, 1, "{\"type\":\"x\",\"steps\":[{\"name\":\"a\",\"job_type\":\"j\"}]}" },
		{ JSON_CT, 1, "{\"type\":\"x\",\"business_key\":\"b\"}" },
		/* an invalid key */
		{ JSON_CT, 2, MIN_BODY },
	};
	char unknown[80], hex[33], key[128], kh[1024];

	tstack_random_hex(hex, 16);
	snprintf(unknown, sizeof(unknown), "Authorization: Bearer %s", hex);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *h[4] = { unknown }, **p = h + 1;
		struct http_response *r;

		tstack_key(key, sizeof(key), "badtok");
		if (cases[i].ct != NULL)
			*p++ = cases[i].ct;
		if (cases[i].keyed == 1)
			*p++ = key_header(kh, sizeof(kh), key);
		else if (cases[i].keyed == 2)
			*p++ = "Idempotency-Key: \"unterminated";
		*p = NULL;
		r = request("POST", COLLECTION, h, cases[i].body, strlen(cases[i].body));
		cr_assert_eq(r->status, 401, "case %zu: %d %s", i, r->status, r->body);
		tstack_expect_problem(r, 401, "/problems/unauthorized", COLLECTION);
		tstack_expect_header(r, "WWW-Authenticate", CHALLENGE_BAD_TOKEN);
		cr_assert_eq(
		    tstack_count("SELECT count(*) FROM idempotency_keys WHERE key = $1", key), 0,
		    "case %zu stored its key", i);
		http_response_free(r);
	}
}

struct replays {
	const struct tstack_tenant *t;
	const char *key;
	const struct http_response *first;
};

/* A keyed POST on a burst's thread: no assertions. */
static struct http_response *send_replay(int i, void *arg)
{
	const struct replays *s = arg;
	char kh[1024];
	const char *h[] = { s->t->auth, JSON_CT, key_header(kh, sizeof(kh), s->key), NULL };

	(void)i;
	return http_request("POST", COLLECTION, h, MIN_BODY, strlen(MIN_BODY));
}

static void check_replay(const struct http_response *r, int i, void *arg)
{
	(void)i;
	tstack_expect_replay(r, ((const struct replays *)arg)->first);
}

static void check_refused(const struct http_response *r, int i, void *arg)
{
	(void)i;
	(void)arg;
	tstack_expect_problem(r, 401, "/problems/unauthorized", COLLECTION);
	tstack_expect_header(r, "WWW-Authenticate", CHALLENGE_BAD_TOKEN);
}

Test(auth, revoked_token_is_401_even_for_a_replay)
{
	struct tstack_tenant t;
	struct http_response *r;
	char key[128], fresh[128], *id;
	struct replays s = { &t, key, NULL };
	pid_t sup = tstack_supervisor_pid();
	const char *log = tstack_env("IDEMFLOW_FCGI_LOG");

	tstack_tenant_create(&t, "revoked");
	tstack_key(key, sizeof(key), "revoked");
	r = post(&t, key, MIN_BODY);
	id = tstack_expect_created(r, "x", "{}");
	/* Replays first, until every worker (the request log names each)
	 * holds the row in its replay cache; revoke returns only once those
	 * have lapsed. */
	s.first = r;
	tstack_every_worker(sup, log, 6, 50, send_replay, check_replay, &s);
	http_response_free(r);

	double t0 = tstack_now();
	tstack_token_revoke(t.token);
	double waited = tstack_now() - t0;
	long ttl = tstack_conf_ms("replay_cache_ttl", 1000);
	cr_assert_geq(waited * 1000, (double)ttl,
	              "token revoke returned after %.3f s, before "
	              "replay_cache_ttl (%ld ms) had passed",
	              waited, ttl);
	tstack_key(fresh, sizeof(fresh), "revoked");
	expect_unauthorized(t.auth, fresh, CHALLENGE_BAD_TOKEN);
	/* The stored response is not handed out without a valid token, by
	 * any worker, although every one had it cached. */
	tstack_every_worker(sup, log, 6, 50, send_replay, check_refused, &s);
	tstack_expect_counts(&t, 1, 1, 1);
	free(id);
}

/* --- routing ----------------------------------------------------------- */

Test(routing, delete_on_the_collection_is_405_allowing_get_and_post)
{
	struct tstack_tenant t;
	struct http_response *r;
	const char *h[2];

	tstack_tenant_create(&t, "delete");
	h[0] = t.auth;
	h[1] = NULL;
	r = request("DELETE", COLLECTION, h, NULL, 0);
	tstack_expect_problem(r, 405, NULL, COLLECTION);
	tstack_expect_header(r, "Allow", "GET, POST");
	tstack_expect_counts(&t, 0, 0, 0);
	http_response_free(r);
}

Test(routing, post_on_a_workflow_is_405_allowing_get)
{
	struct tstack_tenant t;
	struct http_response *r;
	char key[128], kh[160], uuid[37], path[64];

	tstack_tenant_create(&t, "postitem");
	tstack_key(key, sizeof(key), "postitem");
	tstack_uuid(uuid);
	snprintf(path, sizeof(path), COLLECTION "/%s", uuid);
	const char *h[] = { t.auth, JSON_CT, key_header(kh, sizeof(kh), key), NULL };

	r = request("POST", path, h, MIN_BODY, strlen(MIN_BODY));
	tstack_expect_problem(r, 405, NULL, path);
	tstack_expect_header(r, "Allow", "GET");
	tstack_expect_counts(&t, 0, 0, 0);
	http_response_free(r);
}

Test(routing, unknown_route_is_404)
{
	struct tstack_tenant t;
	struct http_response *r;

	tstack_tenant_create(&t, "noroute");
	r = get(&t, "/v1/nothing");
	tstack_expect_problem(r, 404, "/problems/not-found", "/v1/nothing");
	tstack_expect_counts(&t, 0, 0, 0);
	http_response_free(r);
}

/* --- tenant isolation -------------------------------------------------- */

Test(isolation, same_key_in_two_tenants_creates_two_workflows)
{
	const char *body = "{\"type\":\"x\",\"input\":{\"shared\":1}}";
	struct tstack_tenant a, b;
	struct http_response *ra, *rb;
	char key[128], *ida, *idb;

	tstack_tenant_create(&a, "iso-a");
	tstack_tenant_create(&b, "iso-b");
	tstack_key(key, sizeof(key), "shared");
	ra = post(&a, key, body);
	ida = tstack_expect_created(ra, "x", "{\"shared\":1}");
	rb = post(&b, key, body);
	idb = tstack_expect_created(rb, "x", "{\"shared\":1}");
	cr_assert_str_neq(ida, idb, "tenant B got tenant A's workflow");
	tstack_expect_counts(&a, 1, 1, 1);
	tstack_expect_counts(&b, 1, 1, 1);
	free(ida);
	free(idb);
	http_response_free(ra);
	http_response_free(rb);
}

Test(isolation, a_workflow_is_visible_only_to_its_own_tenant)
{
	struct tstack_tenant a, b;
	struct http_response *created, *r;
	char key[128], path[64], uuid[37], *id, *same;

	tstack_tenant_create(&a, "owner");
	tstack_tenant_create(&b, "other");
	tstack_key(key, sizeof(key), "owner");
	created = post(&a, key, "{\"type\":\"x\",\"input\":{\"v\":[1,2]}}");
	id = tstack_expect_created(created, "x", "{\"v\":[1,2]}");
	snprintf(path, sizeof(path), COLLECTION "/%s", id);

	r = get(&b, path);
	tstack_expect_problem(r, 404, "/problems/not-found", path);
	http_response_free(r);

	r = get(&a, path);
	cr_assert_eq(r->status, 200, "status %d, body %.500s", r->status, r->body);
	tstack_expect_header(r, "Content-Type", "application/json");
	/* Same document; GET need not reproduce POST's bytes. */
	same = tstack_text("SELECT ($1::jsonb = $2::jsonb)::text", r->body, created->body);
	cr_assert_str_eq(same, "true", "GET %s, POST %s", r->body, created->body);
	free(same);
	http_response_free(r);

	tstack_uuid(uuid);
	snprintf(path, sizeof(path), COLLECTION "/%s", uuid);
	r = get(&a, path);
	tstack_expect_problem(r, 404, "/problems/not-found", path);
	http_response_free(r);

	r = get(&a, COLLECTION "/not-a-uuid");
	tstack_expect_problem(r, 404, "/problems/not-found", COLLECTION "/not-a-uuid");
	http_response_free(r);

	free(id);
	http_response_free(created);
}

/* --- crash recovery ---------------------------------------------------- */

struct pending_post {
	const char *const *headers;
	const char *body;
	struct http_response *resp;
	char err[512];
};

static void *pending_post_run(void *arg)
{
	struct pending_post *p = arg;

	p->resp = http_request("POST", COLLECTION, p->headers, p->body, strlen(p->body));
	if (!p->resp)
		snprintf(p->err, sizeof(p->err), "%s", http_error());
	return NULL;
}

static int pid_in(pid_t pid, const pid_t *pids, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (pids[i] == pid)
			return 1;
	return 0;
}

Test(crash, worker_killed_mid_request_is_retried_to_exactly_one_workflow)
{
	const char *body = "{\"type\":\"crash\",\"input\":{\"k\":9}}";
	long workers = tstack_conf_long("workers", 4);
	long wait_ms = tstack_conf_ms("idempotency_wait", 5000);
	pid_t sup = tstack_supervisor_pid(), victim, pids[64];
	struct pending_post pending = { 0 };
	struct tstack_tenant t;
	struct http_response *r = NULL;
	char key[128], kh[160], *id, *row;
	pthread_t thread;
	size_t n;
	PGconn *hold;

	cr_assert(tstack_wait_workers(sup, (size_t)workers, 5000),
	          "supervisor %ld does not have %ld workers", (long)sup, workers);
	tstack_tenant_create(&t, "crash");
	tstack_key(key, sizeof(key), "crash");
	const char *headers[] = { t.auth, JSON_CT, key_header(kh, sizeof(kh), key), NULL };

	/* Park a worker inside the request: its insert waits on our row. */
	hold = tstack_db_connect();
	tstack_key_hold(hold, &t, key);
	pending.headers = headers;
	pending.body = body;
	cr_assert_eq(pthread_create(&thread, NULL, pending_post_run, &pending), 0);
	/* Kill well inside idempotency_wait, or it would answer 409. */
	victim = tstack_blocked_worker(hold, wait_ms / 2);
	cr_assert(victim > 0, "no worker blocked on the held key");
	n = tstack_workers(sup, pids, 64);
	cr_assert(pid_in(victim, pids, n < 64 ? n : 64),
	          "blocked session's pid %ld is not a worker of %ld", (long)victim, (long)sup);
	cr_assert_eq(kill(victim, SIGKILL), 0);
	tstack_exec(hold, "ROLLBACK");
	PQfinish(hold);
	pthread_join(thread, NULL);

	/* nginx turns the upstream's dying (502) into its 503 problem. */
	cr_assert_not_null(pending.resp, "killed request: %s", pending.err);
	tstack_expect_problem(pending.resp, 503, "/problems/unavailable", COLLECTION);
	tstack_expect_header(pending.resp, "Retry-After", "1");

	/* The client retries with the same key until it gets its answer. */
	for (int i = 0; i < 20; i++) {
		r = post(&t, key, body);
		if (r->status == 201)
			break;
		http_response_free(r);
		r = NULL;
		tstack_sleep_ms(200);
	}
	cr_assert_not_null(r, "no 201 after 20 retries");
	tstack_expect_header(r, "Content-Type", "application/json");
	id = tstack_json(r->body, "{id}");
	cr_assert_not_null(id, "no id in %s", r->body);

	tstack_expect_counts(&t, 1, 1, 1);
	row = tstack_text("SELECT id::text FROM workflows WHERE tenant_id = $1", t.id_text);
	cr_assert_str_eq(row, id, "the retry must answer with the one workflow");

	/* The supervisor replaced the killed worker. */
	cr_assert(tstack_wait_workers(sup, (size_t)workers, 5000),
	          "workers not back to %ld within 5s", workers);
	n = tstack_workers(sup, pids, 64);
	cr_assert(!pid_in(victim, pids, n < 64 ? n : 64), "killed worker %ld still listed",
	          (long)victim);

	free(row);
	free(id);
	http_response_free(r);
	http_response_free(pending.resp);
}

Test(routing, healthz_answers_204_without_a_token_or_the_database)
{
	struct http_response *r = request("GET", "/healthz", NULL, NULL, 0);

	cr_assert_eq(r->status, 204);
	cr_assert_eq(r->body_len, 0);
	cr_assert_not_null(http_header(r, "X-Request-Id"));
	http_response_free(r);
	r = request("POST", "/healthz", NULL, "", 0);
	cr_assert_eq(r->status, 405);
	tstack_expect_header(r, "Allow", "GET");
	http_response_free(r);
}

Test(create, a_create_wakes_listening_dispatchers_after_it_commits)
{
	struct tstack_tenant t;
	char key[128], kh[160], wpid[24];
	struct http_response *r;
	PGconn *c = tstack_db_connect();
	PGnotify *n = NULL;
	double deadline;
	long worker, backend, others = 0;
	char *id;

	PQclear(PQexec(c, "LISTEN idemflow_outbox"));
	tstack_tenant_create(&t, "notify");
	tstack_key(key, sizeof(key), "notify");
	const char *headers[] = { t.auth, JSON_CT, key_header(kh, sizeof(kh), key), NULL };
	r = request("POST", COLLECTION, headers, MIN_BODY, strlen(MIN_BODY));
	id = tstack_expect_created(r, "x", "{}");
	/* Other tests create too: only a notification from the session of
	 * the worker that answered (the request log names it) counts. */
	worker = tstack_worker_of(tstack_env("IDEMFLOW_FCGI_LOG"), http_header(r, "X-Request-Id"));
	cr_assert(worker > 0, "no request line for %s", http_header(r, "X-Request-Id"));
	http_response_free(r);
	snprintf(wpid, sizeof(wpid), "%ld", worker);
	backend = tstack_count("SELECT pid FROM pg_stat_activity"
	                       " WHERE application_name LIKE '%-worker-' || $1",
	                       wpid);
	/* The worker notifies on its own after answering, within ~100 ms. */
	deadline = tstack_now() + 3;
	while (n == NULL && tstack_now() < deadline) {
		PQconsumeInput(c);
		while ((n = PQnotifies(c)) != NULL && n->be_pid != backend) {
			others++;
			PQfreemem(n);
		}
		if (n == NULL)
			tstack_sleep_ms(20);
	}
	cr_assert_not_null(n,
	                   "no NOTIFY idemflow_outbox from worker %ld (backend %ld) after a"
	                   " create; %ld from other sessions",
	                   worker, backend, others);
	cr_assert_str_eq(n->relname, "idemflow_outbox");
	/* After the commit: what it announces is there to be read. */
	cr_assert_eq(tstack_count("SELECT count(*) FROM outbox WHERE workflow_id = $1", id), 1);
	PQfreemem(n);
	PQfinish(c);
	free(id);
}
