/*
 * test_endpoints.c - a tenant's endpoints (/v1/endpoints) through nginx and
 * the worker pool: the keyed commands (create, change, delete, rotate and
 * revoke the secret) with their exact answers and replays, the refusals
 * that store nothing, the keyset pages, the secret that no answer a key
 * stores ever holds, another tenant's endpoint as 404 on every route, and
 * deliveries born with the events committed after the endpoint.
 *
 * Every test works in a tenant of its own. Deliveries and attempts that
 * the dispatcher would write are inserted here with SQL.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "http.h"
#include "tapi.h"
#include "tsql.h"
#include "tstack.h"

#define JSON_CT "Content-Type: application/json"

/* A small answer budget, so that a list of endpoints takes several pages. */
TSTACK_SETTINGS("max_answer = 65536\n")

TestSuite(endpoints, .timeout = 90);
TestSuite(endpoint_secrets, .timeout = 60);
TestSuite(endpoint_isolation, .timeout = 90);
TestSuite(endpoint_deliveries, .timeout = 60);

/* method path as t, with an Idempotency-Key unless key is NULL, and a
 * JSON body unless body is NULL (then no Content-Type either). */
static struct http_response *req(const struct tstack_tenant *t, const char *method,
                                 const char *path, const char *key, const char *body)
{
	char kh[300];
	const char *h[4] = { t->auth, NULL, NULL, NULL };
	int n = 1;
	struct http_response *r;

	if (body != NULL)
		h[n++] = JSON_CT;
	if (key != NULL) {
		snprintf(kh, sizeof(kh), "Idempotency-Key: %s", key);
		h[n++] = kh;
	}
	r = http_request(method, path, h, body, body != NULL ? strlen(body) : 0);
	cr_assert_not_null(r, "%s %s: %s", method, path, http_error());
	return r;
}

/* A replay of first, an answer without a Location: same status and
 * bytes, flagged. */
static void expect_replay(const struct http_response *r, const struct http_response *first)
{
	cr_assert_eq(r->status, first->status, "status %d, body %.500s", r->status, r->body);
	tstack_expect_header(r, "Idempotent-Replayed", "true");
	cr_assert_null(http_header(r, "Location"));
	cr_assert_eq(r->body_len, first->body_len, "replayed %.500s, first %.500s", r->body,
	             first->body);
	cr_assert(memcmp(r->body, first->body, r->body_len) == 0, "replayed %.500s, first %.500s",
	          r->body, first->body);
}

/* POST /v1/endpoints with body under a fresh key; expects 201; the id. */
static char *create(const struct tstack_tenant *t, const char *body)
{
	char key[128];
	struct http_response *r;
	char *id;

	tstack_key(key, sizeof(key), "ep");
	r = req(t, "POST", "/v1/endpoints", key, body);
	tstack_expect_status(r, 201);
	id = tstack_json(r->body, "{id}");
	http_response_free(r);
	return id;
}

/* fmt with "%s" once: the id. */
static char *path_of(const char *fmt, const char *id)
{
	const char *at = strstr(fmt, "%s");
	char *p;

	cr_assert_not_null(at);
	cr_assert(asprintf(&p, "%.*s%s%s", (int)(at - fmt), fmt, id, at + 2) > 0);
	return p;
}

/* An endpoint's timestamps as the API writes them. */
static char *ts(const char *id, const char *col)
{
	char sql[256];

	snprintf(sql, sizeof(sql),
	         "SELECT to_char(%s AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
	         "  FROM endpoints WHERE id = $1",
	         col);
	return tstack_text_(sql, id, (const char *)NULL);
}

/* Everything stored of a tenant's endpoints, deliveries, attempts and
 * keys, as one text. */
static char *state(const struct tstack_tenant *t)
{
	return tstack_text(
	    "SELECT coalesce(string_agg(x, '|' ORDER BY x), '') FROM ("
	    "  SELECT concat_ws(',', id, url, filter_types, ordering, disabled, disabled_reason,"
	    "                   metadata, secret, previous_secret, previous_secret_until,"
	    "                   failures, updated_at) AS x"
	    "    FROM endpoints WHERE tenant_id = $1"
	    "  UNION ALL SELECT concat_ws(',', endpoint_id, workflow_id, seq, state)"
	    "    FROM deliveries WHERE tenant_id = $1"
	    "  UNION ALL SELECT concat_ws(',', endpoint_id, id) FROM delivery_attempts"
	    "   WHERE tenant_id = $1"
	    "  UNION ALL SELECT concat_ws(',', key, status, body) FROM idempotency_keys"
	    "   WHERE tenant_id = $1) s",
	    t->id_text);
}

/* --- Create ------------------------------------------------------------ */

Test(endpoints, create_answers_201_with_the_endpoint_and_replays_it_byte_for_byte)
{
	static const char body[] = "{\"url\":\"https://hooks.example/in?x=1\","
	                           "\"filter_types\":[\"workflow.*\",\"job.completed\"],"
	                           "\"metadata\":{\"b\":[1,2],\"a\":\"x\"}}";
	struct tstack_tenant t;
	struct http_response *r, *again, *other;
	char key[128], want[1024], *id, *loc, *created, *updated;

	tstack_tenant_create(&t, "ep-create");
	tstack_key(key, sizeof(key), "ep");
	r = req(&t, "POST", "/v1/endpoints", key, body);
	tstack_expect_status(r, 201);
	tstack_expect_header(r, "Content-Type", "application/json");
	id = tstack_json(r->body, "{id}");
	loc = path_of("/v1/endpoints/%s", id);
	tstack_expect_header(r, "Location", loc);
	created = ts(id, "created_at");
	updated = ts(id, "updated_at");
	snprintf(
	    want, sizeof(want),
	    "{\"id\":\"%s\",\"url\":\"https://hooks.example/in?x=1\","
	    "\"filter_types\":[\"workflow.*\",\"job.completed\"],\"ordering\":\"workflow\","
	    "\"disabled\":false,\"disabled_reason\":null,\"metadata\":{\"a\":\"x\",\"b\":[1,2]},"
	    "\"created_at\":\"%s\",\"updated_at\":\"%s\"}",
	    id, created, updated);
	cr_assert_str_eq(r->body, want);
	/* The secret is the server's: Standard Webhooks, 32 random bytes. */
	cr_assert_null(strstr(r->body, "whsec_"));
	cr_assert_eq(tstack_count("SELECT count(*) FROM endpoints WHERE tenant_id = $1 AND id = $2"
	                          "   AND secret ~ '^whsec_[A-Za-z0-9+/]{43}=$'"
	                          "   AND length(decode(substr(secret, 7), 'base64')) = 32"
	                          "   AND actor ~ '^token:' AND previous_secret IS NULL",
	                          t.id_text, id),
	             1);

	again = req(&t, "POST", "/v1/endpoints", key, body);
	tstack_expect_replay(again, r);
	/* The same request in another form (canonical JSON) replays too. */
	http_response_free(again);
	again = req(
	    &t, "POST", "/v1/endpoints", key,
	    "{ \"metadata\": {\"a\":\"x\",\"b\":[1,2]}, \"url\": \"https://hooks.example/in?x=1\","
	    " \"filter_types\": [\"workflow.*\", \"job.completed\"] }");
	tstack_expect_replay(again, r);
	other = req(&t, "POST", "/v1/endpoints", key, "{\"url\":\"https://hooks.example/other\"}");
	tstack_expect_problem(other, 409, "/problems/idempotency-key-reused", "/v1/endpoints");
	cr_assert_eq(tstack_count("SELECT count(*) FROM endpoints WHERE tenant_id = $1", t.id_text),
	             1);
	http_response_free(r);
	http_response_free(again);
	http_response_free(other);
	free(id);
	free(loc);
	free(created);
	free(updated);
}

Test(endpoints, create_defaults_every_type_workflow_order_and_two_secrets_differ)
{
	struct tstack_tenant t;
	struct http_response *r;
	char *a, *b, *p;

	tstack_tenant_create(&t, "ep-defaults");
	a = create(&t, "{\"url\":\"http://10.0.0.1:8080/h\"}");
	b = create(&t,
	           "{\"url\":\"http://10.0.0.1:8080/h\",\"ordering\":\"none\",\"disabled\":true}");
	p = path_of("/v1/endpoints/%s", a);
	r = req(&t, "GET", p, NULL, NULL);
	tstack_expect_status(r, 200);
	cr_assert_null(tstack_json(r->body, "{filter_types}"), "%s", r->body);
	cr_assert_not_null(strstr(r->body, "\"filter_types\":null,\"ordering\":\"workflow\","
	                                   "\"disabled\":false,\"disabled_reason\":null,"
	                                   "\"metadata\":{}"),
	                   "%s", r->body);
	http_response_free(r);
	free(p);
	p = path_of("/v1/endpoints/%s", b);
	r = req(&t, "GET", p, NULL, NULL);
	cr_assert_not_null(strstr(r->body, "\"ordering\":\"none\",\"disabled\":true,"
	                                   "\"disabled_reason\":\"manual\""),
	                   "%s", r->body);
	cr_assert_eq(
	    tstack_count("SELECT count(DISTINCT secret) FROM endpoints WHERE tenant_id = $1",
	                 t.id_text),
	    2);
	http_response_free(r);
	free(p);
	free(a);
	free(b);
}

/* Each refused body, the detail it gets (a prefix), and nothing stored. */
static const struct {
	const char *body;
	const char *detail;
} bad[] = {
	{ "{}", "\"url\" is required" },
	{ "{\"url\":\"ftp://h/x\"}", "\"url\" must start with https:// or http://" },
	{ "{\"url\":\"HTTPS://h/x\"}", "\"url\" must start with https:// or http://" },
	{ "{\"url\":\"https:///x\"}", "\"url\" must name a host after https://" },
	{ "{\"url\":\"https://h/a b\"}", "\"url\" may hold printable ASCII only" },
	{ "{\"url\":\"https://h/\\u00e9\"}", "\"url\" may hold printable ASCII only" },
	{ "{\"url\":\"https://h/\\u0001\"}", "\"url\" may not contain control characters" },
	{ "{\"url\":7}", "\"url\" must be a string" },
	{ "{\"url\":\"https://h\",\"filter_types\":[]}", "\"filter_types\" must be null" },
	{ "{\"url\":\"https://h\",\"filter_types\":\"workflow.*\"}",
	  "\"filter_types\" must be null" },
	{ "{\"url\":\"https://h\",\"filter_types\":[\"work flow\"]}",
	  "filter_types entry \"work flow\" is neither" },
	{ "{\"url\":\"https://h\",\"filter_types\":[\"workflow.\"]}",
	  "filter_types entry \"workflow.\" is neither" },
	{ "{\"url\":\"https://h\",\"filter_types\":[\"*\"]}",
	  "filter_types entry \"*\" is neither" },
	{ "{\"url\":\"https://h\",\"filter_types\":[\"a..b\"]}",
	  "filter_types entry \"a..b\" is neither" },
	{ "{\"url\":\"https://h\",\"filter_types\":[\"work*\"]}",
	  "filter_types entry \"work*\" is neither" },
	{ "{\"url\":\"https://h\",\"filter_types\":[\"a\",1]}",
	  "filter_types entry 2 is not a string" },
	{ "{\"url\":\"https://h\",\"filter_types\":[\"a.b\",\"a.b\"]}",
	  "filter_types names \"a.b\" twice" },
	{ "{\"url\":\"https://h\",\"filter_types\":[\"endpoint.disabled\"]}",
	  "filter_types entry \"endpoint.disabled\": endpoint.* and delivery.*" },
	{ "{\"url\":\"https://h\",\"ordering\":\"fifo\"}", "\"ordering\" is \"workflow\"" },
	{ "{\"url\":\"https://h\",\"disabled\":\"yes\"}", "\"disabled\" must be true or false" },
	{ "{\"url\":\"https://h\",\"metadata\":[1]}", "\"metadata\" must be a JSON object" },
	{ "{\"url\":\"https://h\",\"metadata\":null}", "\"metadata\" must be a JSON object" },
	{ "{\"url\":\"https://h\",\"secret\":\"whsec_c2hvcnQ=\"}", "a secret is \"whsec_\"" },
	{ "{\"url\":\"https://h\",\"secret\":\"c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0\"}",
	  "a secret is \"whsec_\"" },
	{ "{\"url\":\"https://h\",\"secret\":\"whsec_!!!!c2VjcmV0c2VjcmV0c2VjcmV0c2Vj\"}",
	  "a secret is \"whsec_\"" },
	{ "{\"url\":\"https://h\",\"colour\":\"red\"}",
	  "unknown member \"colour\": expected url," },
};

Test(endpoints, a_refused_body_is_422_with_a_precise_detail_and_stores_nothing)
{
	struct tstack_tenant t;
	char key[128], *detail;

	tstack_tenant_create(&t, "ep-bad");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct http_response *r;
		tstack_key(key, sizeof(key), "bad");
		r = req(&t, "POST", "/v1/endpoints", key, bad[i].body);
		tstack_expect_problem(r, 422, "/problems/invalid-request", "/v1/endpoints");
		detail = tstack_json(r->body, "{detail}");
		cr_assert(strncmp(detail, bad[i].detail, strlen(bad[i].detail)) == 0,
		          "%s: detail \"%s\", want \"%s...\"", bad[i].body, detail, bad[i].detail);
		free(detail);
		http_response_free(r);
	}
	cr_assert_eq(tstack_count("SELECT count(*) FROM endpoints WHERE tenant_id = $1", t.id_text),
	             0);
	cr_assert_eq(
	    tstack_count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1", t.id_text),
	    0);
}

Test(endpoints, the_bounds_are_exact)
{
	struct tstack_tenant t;
	struct http_response *r;
	char *body, *v, key[128], types[64 * 12 + 64];
	size_t n = 0;

	tstack_tenant_create(&t, "ep-bounds");
	/* A URL of 2048 bytes is taken, of 2049 refused. */
	cr_assert(asprintf(&body, "{\"url\":\"https://h/%0*d\"}", 2048 - 10, 0) > 0);
	free(create(&t, body));
	free(body);
	cr_assert(asprintf(&body, "{\"url\":\"https://h/%0*d\"}", 2049 - 10, 0) > 0);
	tstack_key(key, sizeof(key), "b");
	r = req(&t, "POST", "/v1/endpoints", key, body);
	tstack_expect_problem(r, 422, "/problems/invalid-request", "/v1/endpoints");
	http_response_free(r);
	free(body);
	/* 64 filter entries are taken, 65 refused. */
	for (int i = 0; i < 64; i++)
		n += (size_t)snprintf(types + n, sizeof(types) - n, "%s\"t%d.*\"", i ? "," : "", i);
	cr_assert(asprintf(&body, "{\"url\":\"https://h\",\"filter_types\":[%s]}", types) > 0);
	free(create(&t, body));
	free(body);
	cr_assert(asprintf(&body, "{\"url\":\"https://h\",\"filter_types\":[%s,\"x\"]}", types) >
	          0);
	tstack_key(key, sizeof(key), "b");
	r = req(&t, "POST", "/v1/endpoints", key, body);
	tstack_expect_problem(r, 422, "/problems/invalid-request", "/v1/endpoints");
	http_response_free(r);
	free(body);
	/* Metadata of 4096 canonical bytes is taken, of 4097 refused. */
	cr_assert(asprintf(&body, "{\"url\":\"https://h\",\"metadata\":{\"k\":\"%0*d\"}}", 4096 - 8,
	                   0) > 0);
	free(create(&t, body));
	free(body);
	cr_assert(asprintf(&body, "{\"url\":\"https://h\",\"metadata\":{\"k\":\"%0*d\"}}", 4097 - 8,
	                   0) > 0);
	tstack_key(key, sizeof(key), "b");
	r = req(&t, "POST", "/v1/endpoints", key, body);
	tstack_expect_problem(r, 422, "/problems/invalid-request", "/v1/endpoints");
	v = tstack_json(r->body, "{detail}");
	cr_assert_str_eq(v, "\"metadata\" may be at most 4096 bytes in canonical form");
	free(v);
	http_response_free(r);
	free(body);
	cr_assert_eq(tstack_count("SELECT count(*) FROM endpoints WHERE tenant_id = $1", t.id_text),
	             3);
}

/* --- Read -------------------------------------------------------------- */

Test(endpoints, the_list_pages_in_id_order_with_a_cursor)
{
	struct tstack_tenant t;
	struct http_response *r;
	char *ids[3], *cursor, *p, *got;

	tstack_tenant_create(&t, "ep-list");
	for (int i = 0; i < 3; i++)
		ids[i] = create(&t, "{\"url\":\"https://h/l\"}");
	r = req(&t, "GET", "/v1/endpoints?limit=2", NULL, NULL);
	tstack_expect_status(r, 200);
	got = tstack_json(r->body, "{endpoints,0,id}");
	cr_assert_str_eq(got, ids[0]);
	free(got);
	got = tstack_json(r->body, "{endpoints,1,id}");
	cr_assert_str_eq(got, ids[1]);
	free(got);
	cr_assert_null(tstack_json(r->body, "{endpoints,2}"));
	cursor = tstack_json(r->body, "{next_cursor}");
	cr_assert_str_eq(cursor, ids[1]);
	http_response_free(r);
	p = path_of("/v1/endpoints?limit=2&after=%s", cursor);
	r = req(&t, "GET", p, NULL, NULL);
	tstack_expect_status(r, 200);
	got = tstack_json(r->body, "{endpoints,0,id}");
	cr_assert_str_eq(got, ids[2]);
	free(got);
	cr_assert_null(strstr(r->body, "whsec_"));
	cr_assert_not_null(strstr(r->body, "],\"next_cursor\":null}"), "%s", r->body);
	http_response_free(r);
	free(p);
	r = req(&t, "GET", "/v1/endpoints?after=nope", NULL, NULL);
	tstack_expect_problem(r, 422, "/problems/invalid-request", "/v1/endpoints");
	http_response_free(r);
	r = req(&t, "GET", "/v1/endpoints?limit=0", NULL, NULL);
	tstack_expect_problem(r, 422, "/problems/invalid-request", "/v1/endpoints");
	http_response_free(r);
	free(cursor);
	for (int i = 0; i < 3; i++)
		free(ids[i]);
}

Test(endpoints, a_page_stays_within_the_answer_budget)
{
	struct tstack_tenant t;
	struct http_response *r;
	char *body, *cursor;
	long budget;
	int pages = 0, seen = 0;

	tstack_tenant_create(&t, "ep-budget");
	/* 40 endpoints of about 4 KiB each: past any max_answer of the stack. */
	cr_assert(
	    asprintf(&body, "{\"url\":\"https://h\",\"metadata\":{\"k\":\"%0*d\"}}", 4000, 0) > 0);
	for (int i = 0; i < 40; i++)
		free(create(&t, body));
	free(body);
	budget = tstack_conf_long("max_answer", 0);
	cr_assert_eq(budget, 65536);
	cursor = NULL;
	do {
		char *p = cursor ? path_of("/v1/endpoints?limit=1000&after=%s", cursor)
		                 : strdup("/v1/endpoints?limit=1000");
		r = req(&t, "GET", p, NULL, NULL);
		tstack_expect_status(r, 200);
		cr_assert_leq((long)r->body_len, budget);
		for (int i = 0;; i++) {
			char q[32], *v;
			snprintf(q, sizeof(q), "{endpoints,%d,id}", i);
			v = tstack_json(r->body, q);
			if (v == NULL)
				break;
			seen++;
			free(v);
		}
		free(cursor);
		cursor = tstack_json(r->body, "{next_cursor}");
		http_response_free(r);
		free(p);
		pages++;
	} while (cursor != NULL && pages < 50);
	cr_assert_eq(seen, 40);
	cr_assert_geq(pages, 3);
}

Test(endpoints, a_missing_or_malformed_id_is_404_and_wrong_methods_405)
{
	struct tstack_tenant t;
	struct http_response *r;
	char *v;
	static const char *const paths[] = { "/v1/endpoints/01890000-0000-7000-8000-000000000000",
		                             "/v1/endpoints/not-a-uuid" };

	tstack_tenant_create(&t, "ep-404");
	for (int i = 0; i < 2; i++) {
		char *p;
		r = req(&t, "GET", paths[i], NULL, NULL);
		tstack_expect_problem(r, 404, "/problems/not-found", paths[i]);
		v = tstack_json(r->body, "{detail}");
		cr_assert_str_eq(v, "no such endpoint");
		free(v);
		http_response_free(r);
		r = req(&t, "PATCH", paths[i], NULL, "{\"disabled\":true}");
		tstack_expect_problem(r, 404, "/problems/not-found", paths[i]);
		http_response_free(r);
		r = req(&t, "DELETE", paths[i], "k-del-404", NULL);
		tstack_expect_problem(r, 404, "/problems/not-found", paths[i]);
		http_response_free(r);
		p = path_of("%s/secret", paths[i]);
		r = req(&t, "GET", p, NULL, NULL);
		tstack_expect_problem(r, 404, "/problems/not-found", p);
		http_response_free(r);
		free(p);
	}
	/* A 404 is no outcome a key keeps. */
	cr_assert_eq(
	    tstack_count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1", t.id_text),
	    0);
	r = req(&t, "PUT", paths[0], NULL, "{}");
	tstack_expect_problem(r, 405, "/problems/method-not-allowed", paths[0]);
	tstack_expect_header(r, "Allow", "GET, PATCH, DELETE");
	http_response_free(r);
	r = req(&t, "DELETE", "/v1/endpoints", NULL, NULL);
	tstack_expect_header(r, "Allow", "GET, POST");
	http_response_free(r);
	r = req(&t, "GET", "/v1/endpoints/01890000-0000-7000-8000-000000000000/secret/rotate", NULL,
	        NULL);
	tstack_expect_header(r, "Allow", "POST");
	http_response_free(r);
}

/* --- Change and delete -------------------------------------------------- */

Test(endpoints, patch_changes_what_it_names_and_replays)
{
	struct tstack_tenant t;
	struct http_response *r, *again;
	char *id, *p, *v, *after, key[128];

	tstack_tenant_create(&t, "ep-patch");
	id = create(&t, "{\"url\":\"https://h/a\",\"filter_types\":[\"job.*\"],"
	                "\"metadata\":{\"team\":\"a\"}}");
	p = path_of("/v1/endpoints/%s", id);
	tstack_key(key, sizeof(key), "patch");
	r = req(&t, "PATCH", p, key,
	        "{\"url\":\"https://h/b\",\"filter_types\":null,\"ordering\":\"none\","
	        "\"metadata\":{\"team\":\"b\"}}");
	tstack_expect_status(r, 200);
	v = ts(id, "updated_at");
	cr_assert_not_null(strstr(r->body,
	                          "\"url\":\"https://h/b\",\"filter_types\":null,"
	                          "\"ordering\":\"none\",\"disabled\":false,"
	                          "\"disabled_reason\":null,\"metadata\":{\"team\":\"b\"}"),
	                   "%s", r->body);
	cr_assert_not_null(strstr(r->body, v), "%s", r->body);
	free(v);
	again = req(&t, "PATCH", p, key,
	            "{\"url\":\"https://h/b\",\"filter_types\":null,\"ordering\":\"none\","
	            "\"metadata\":{\"team\":\"b\"}}");
	expect_replay(again, r);
	http_response_free(again);
	again = req(&t, "PATCH", p, key, "{\"url\":\"https://h/c\"}");
	tstack_expect_problem(again, 409, "/problems/idempotency-key-reused", p);
	http_response_free(again);
	http_response_free(r);

	/* Only what is named changes. */
	r = req(&t, "PATCH", p, NULL, "{\"filter_types\":[\"a.b\",\"c.*\"]}");
	tstack_expect_status(r, 200);
	cr_assert_not_null(strstr(r->body, "\"url\":\"https://h/b\",\"filter_types\":[\"a.b\","
	                                   "\"c.*\"],\"ordering\":\"none\""),
	                   "%s", r->body);
	http_response_free(r);

	/* Disabled by hand; enabled again, its failures forgotten. */
	tstack_exec(tstack_db(),
	            "UPDATE endpoints SET failures = 7, failing_since = now() WHERE id = $1", id);
	r = req(&t, "PATCH", p, NULL, "{\"disabled\":true}");
	tstack_expect_status(r, 200);
	cr_assert_not_null(strstr(r->body, "\"disabled\":true,\"disabled_reason\":\"manual\""),
	                   "%s", r->body);
	cr_assert_eq(tstack_count("SELECT count(*) FROM endpoints WHERE id = $1"
	                          "   AND disabled_at IS NOT NULL AND failures = 7",
	                          id),
	             1);
	http_response_free(r);
	r = req(&t, "PATCH", p, NULL, "{\"disabled\":false}");
	tstack_expect_status(r, 200);
	cr_assert_not_null(strstr(r->body, "\"disabled\":false,\"disabled_reason\":null"), "%s",
	                   r->body);
	cr_assert_eq(tstack_count("SELECT count(*) FROM endpoints WHERE id = $1 AND NOT disabled"
	                          "   AND disabled_at IS NULL AND failures = 0"
	                          "   AND failing_since IS NULL",
	                          id),
	             1);
	http_response_free(r);

	/* Nothing to change, or a bad member: refused, nothing changed. */
	v = state(&t);
	r = req(&t, "PATCH", p, NULL, "{}");
	tstack_expect_problem(r, 422, "/problems/invalid-request", p);
	http_response_free(r);
	r = req(&t, "PATCH", p, NULL, "{\"secret\":\"whsec_x\"}");
	tstack_expect_problem(r, 422, "/problems/invalid-request", p);
	http_response_free(r);
	r = req(&t, "PATCH", p, NULL, "{\"url\":\"gopher://h\"}");
	tstack_expect_problem(r, 422, "/problems/invalid-request", p);
	http_response_free(r);
	after = state(&t);
	cr_assert_str_eq(after, v);
	free(after);
	free(v);
	free(p);
	free(id);
}

Test(endpoints, delete_takes_its_deliveries_and_attempts_and_only_those)
{
	struct tstack_tenant t;
	struct http_response *r, *again;
	char *a, *b, *p, want[256], key[128];

	tstack_tenant_create(&t, "ep-delete");
	a = create(&t, "{\"url\":\"https://h/a\"}");
	b = create(&t, "{\"url\":\"https://h/b\"}");
	/* What the trigger and the dispatcher would have written, for both. */
	tstack_exec(tstack_db(),
	            "INSERT INTO deliveries (tenant_id, endpoint_id, workflow_id, seq, outbox_id)"
	            " SELECT $1, e, gen_random_uuid(), s, 0"
	            "   FROM unnest(ARRAY[$2, $3]::uuid[]) e, generate_series(1, 2) s",
	            t.id_text, a, b);
	tstack_exec(tstack_db(),
	            "INSERT INTO delivery_attempts (tenant_id, endpoint_id, workflow_id, seq,"
	            "       event_id, trigger, started_at, duration_ms, status, outcome)"
	            " SELECT $1, e, gen_random_uuid(), 1, 'x.1', 'scheduled', now(), 1, 500, 'http'"
	            "   FROM unnest(ARRAY[$2, $3]::uuid[]) e",
	            t.id_text, a, b);
	p = path_of("/v1/endpoints/%s", a);
	tstack_key(key, sizeof(key), "del");
	/* No body, no Content-Type: a DELETE as clients send it. */
	r = req(&t, "DELETE", p, key, NULL);
	tstack_expect_status(r, 200);
	snprintf(want, sizeof(want),
	         "{\"id\":\"%s\",\"deleted\":true,\"deliveries\":2,\"attempts\":1}", a);
	cr_assert_str_eq(r->body, want);
	cr_assert_eq(tstack_count("SELECT count(*) FROM endpoints WHERE tenant_id = $1", t.id_text),
	             1);
	cr_assert_eq(tstack_count("SELECT count(*) FROM deliveries WHERE endpoint_id = $1", a), 0);
	cr_assert_eq(
	    tstack_count("SELECT count(*) FROM delivery_attempts WHERE endpoint_id = $1", a), 0);
	cr_assert_eq(tstack_count("SELECT count(*) FROM deliveries WHERE endpoint_id = $1", b), 2);
	cr_assert_eq(
	    tstack_count("SELECT count(*) FROM delivery_attempts WHERE endpoint_id = $1", b), 1);
	/* The retry replays; "{}" is the same request as no body. */
	again = req(&t, "DELETE", p, key, NULL);
	expect_replay(again, r);
	http_response_free(again);
	again = req(&t, "DELETE", p, key, "{}");
	expect_replay(again, r);
	http_response_free(again);
	/* A new request finds nothing. */
	again = req(&t, "DELETE", p, NULL, NULL);
	tstack_expect_problem(again, 404, "/problems/not-found", p);
	http_response_free(again);
	/* An empty body sent as JSON is no body either. */
	again = req(&t, "DELETE", p, NULL, "");
	tstack_expect_problem(again, 404, "/problems/not-found", p);
	http_response_free(again);
	again = req(&t, "GET", p, NULL, NULL);
	tstack_expect_problem(again, 404, "/problems/not-found", p);
	http_response_free(again);
	again = req(&t, "DELETE", p, NULL, "{\"force\":true}");
	tstack_expect_problem(again, 422, "/problems/invalid-request", p);
	http_response_free(again);
	again = req(&t, "DELETE", p, NULL, "nope");
	tstack_expect_problem(again, 400, "/problems/invalid-json", p);
	http_response_free(again);
	http_response_free(r);
	free(p);
	free(a);
	free(b);
}

/* --- Secrets ----------------------------------------------------------- */

static char *secret_of(const struct tstack_tenant *t, const char *id, int status)
{
	struct http_response *r;
	char *p = path_of("/v1/endpoints/%s/secret", id), *body;

	r = req(t, "GET", p, NULL, NULL);
	tstack_expect_status(r, status);
	tstack_expect_header(r, "Cache-Control", "no-store");
	body = strdup(r->body);
	http_response_free(r);
	free(p);
	return body;
}

Test(endpoint_secrets, a_given_secret_is_kept_and_shown_only_by_the_secret_route)
{
	static const char given[] = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
	struct tstack_tenant t;
	char *id, *s, want[256];

	tstack_tenant_create(&t, "ep-given");
	id = create(
	    &t, "{\"url\":\"https://h\",\"secret\":\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"}");
	s = secret_of(&t, id, 200);
	snprintf(want, sizeof(want),
	         "{\"key\":\"%s\",\"previous_key\":null,\"previous_expires_at\":null}", given);
	cr_assert_str_eq(s, want);
	free(s);
	free(id);
}

Test(endpoint_secrets, rotate_keeps_the_old_secret_for_the_grace_and_revoke_drops_it)
{
	struct tstack_tenant t;
	struct http_response *r, *again;
	char *id, *p, *old, *now, *s, *until, *upd, want[512], key[128];

	tstack_tenant_create(&t, "ep-rotate");
	id = create(&t, "{\"url\":\"https://h\"}");
	old = tstack_text("SELECT secret FROM endpoints WHERE id = $1", id);
	p = path_of("/v1/endpoints/%s/secret/rotate", id);
	tstack_key(key, sizeof(key), "rot");
	/* The default grace, 24 hours; no body at all. */
	r = req(&t, "POST", p, key, NULL);
	tstack_expect_status(r, 200);
	until = ts(id, "previous_secret_until");
	upd = ts(id, "updated_at");
	snprintf(want, sizeof(want),
	         "{\"endpoint_id\":\"%s\",\"previous_expires_at\":\"%s\",\"updated_at\":\"%s\"}",
	         id, until, upd);
	cr_assert_str_eq(r->body, want);
	cr_assert_eq(tstack_count("SELECT count(*) FROM endpoints WHERE id = $1"
	                          "   AND previous_secret = $2 AND secret <> $2"
	                          "   AND previous_secret_until = updated_at + interval '24 hours'",
	                          id, old),
	             1);
	now = tstack_text("SELECT secret FROM endpoints WHERE id = $1", id);
	s = secret_of(&t, id, 200);
	snprintf(want, sizeof(want),
	         "{\"key\":\"%s\",\"previous_key\":\"%s\",\"previous_expires_at\":\"%s\"}", now,
	         old, until);
	cr_assert_str_eq(s, want);
	free(s);
	/* The retry replays and rotates nothing more. */
	again = req(&t, "POST", p, key, NULL);
	expect_replay(again, r);
	http_response_free(again);
	cr_assert_eq(tstack_count("SELECT count(*) FROM endpoints WHERE id = $1 AND secret = $2"
	                          "   AND previous_secret = $3",
	                          id, now, old),
	             1);
	http_response_free(r);

	/* A given key, and a grace of an hour: the first new one is now the
	 * previous one. */
	r = req(&t, "POST", p, NULL,
	        "{\"grace\":\"PT1H\",\"key\":\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"}");
	tstack_expect_status(r, 200);
	cr_assert_eq(tstack_count("SELECT count(*) FROM endpoints WHERE id = $1"
	                          "   AND secret = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'"
	                          "   AND previous_secret = $2"
	                          "   AND previous_secret_until = updated_at + interval '1 hour'",
	                          id, now),
	             1);
	http_response_free(r);

	/* Revoke: the previous one stops at once. */
	free(p);
	p = path_of("/v1/endpoints/%s/secret/revoke", id);
	tstack_key(key, sizeof(key), "rev");
	r = req(&t, "POST", p, key, "{}");
	tstack_expect_status(r, 200);
	free(upd);
	upd = ts(id, "updated_at");
	snprintf(want, sizeof(want),
	         "{\"endpoint_id\":\"%s\",\"previous_expires_at\":null,\"updated_at\":\"%s\"}", id,
	         upd);
	cr_assert_str_eq(r->body, want);
	cr_assert_eq(
	    tstack_count("SELECT count(*) FROM endpoints WHERE id = $1"
	                 "   AND previous_secret IS NULL AND previous_secret_until IS NULL",
	                 id),
	    1);
	s = secret_of(&t, id, 200);
	cr_assert_str_eq(s, "{\"key\":\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\",\"previous_key\":"
	                    "null,\"previous_expires_at\":null}");
	free(s);
	http_response_free(r);

	/* No stored answer holds a secret. */
	cr_assert_eq(
	    tstack_count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1", t.id_text),
	    3);
	cr_assert_eq(tstack_count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1"
	                          "   AND (body LIKE '%whsec_%' OR headers LIKE '%whsec_%')",
	                          t.id_text),
	             0);
	free(p);
	free(old);
	free(now);
	free(until);
	free(upd);
	free(id);
}

Test(endpoint_secrets, a_grace_out_of_bounds_or_a_bad_key_is_refused)
{
	struct tstack_tenant t;
	struct http_response *r;
	char *id, *p, *before, *detail, *v;

	tstack_tenant_create(&t, "ep-grace");
	id = create(&t, "{\"url\":\"https://h\"}");
	p = path_of("/v1/endpoints/%s/secret/rotate", id);
	before = state(&t);
	r = req(&t, "POST", p, NULL, "{\"grace\":\"P8D\"}");
	tstack_expect_problem(r, 400, "/problems/invalid-duration", p);
	detail = tstack_json(r->body, "{detail}");
	cr_assert_str_eq(detail,
	                 "\"grace\" must be an ISO 8601 duration from PT0S to P7D (default PT24H)");
	free(detail);
	http_response_free(r);
	r = req(&t, "POST", p, NULL, "{\"grace\":\"24h\"}");
	tstack_expect_problem(r, 400, "/problems/invalid-duration", p);
	http_response_free(r);
	r = req(&t, "POST", p, NULL, "{\"key\":\"whsec_abc\"}");
	tstack_expect_problem(r, 422, "/problems/invalid-request", p);
	http_response_free(r);
	r = req(&t, "POST", p, NULL, "{\"keep\":true}");
	tstack_expect_problem(r, 422, "/problems/invalid-request", p);
	http_response_free(r);
	v = state(&t);
	cr_assert_str_eq(v, before);
	free(v);
	/* P7D is the longest; PT0S drops the old secret at once. */
	r = req(&t, "POST", p, NULL, "{\"grace\":\"P7D\"}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	r = req(&t, "POST", p, NULL, "{\"grace\":\"PT0S\"}");
	tstack_expect_status(r, 200);
	cr_assert_not_null(strstr(r->body, "\"previous_expires_at\":null"), "%s", r->body);
	http_response_free(r);
	cr_assert_eq(tstack_count("SELECT count(*) FROM endpoints WHERE id = $1"
	                          "   AND previous_secret IS NULL",
	                          id),
	             1);
	free(before);
	free(p);
	free(id);
}

/* --- Isolation --------------------------------------------------------- */

Test(endpoint_isolation, another_tenants_endpoint_is_404_on_every_route_and_unchanged)
{
	static const struct {
		const char *method, *fmt, *body;
	} routes[] = {
		{ "GET", "/v1/endpoints/%s", NULL },
		{ "PATCH", "/v1/endpoints/%s", "{\"disabled\":true}" },
		{ "DELETE", "/v1/endpoints/%s", NULL },
		{ "GET", "/v1/endpoints/%s/secret", NULL },
		{ "POST", "/v1/endpoints/%s/secret/rotate", "{}" },
		{ "POST", "/v1/endpoints/%s/secret/revoke", "{}" },
	};
	struct tstack_tenant owner, other;
	struct http_response *r;
	char *id, *before, *after, *mine, key[128];

	tstack_tenant_create(&owner, "ep-owner");
	tstack_tenant_create(&other, "ep-other");
	id = create(&owner, "{\"url\":\"https://h/owner\",\"metadata\":{\"s\":\"owner-only\"}}");
	tstack_exec(tstack_db(),
	            "INSERT INTO deliveries (tenant_id, endpoint_id, workflow_id, seq, outbox_id)"
	            " VALUES ($1, $2, gen_random_uuid(), 1, 0)",
	            owner.id_text, id);
	mine = create(&other, "{\"url\":\"https://h/other\"}");
	before = state(&owner);
	for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
		char *p = path_of(routes[i].fmt, id);
		/* With and without a key, as each route takes them. */
		for (int keyed = 0; keyed < 2; keyed++) {
			if (keyed && strcmp(routes[i].method, "GET") == 0)
				continue;
			tstack_key(key, sizeof(key), "iso");
			r = req(&other, routes[i].method, p, keyed ? key : NULL, routes[i].body);
			tstack_expect_problem(r, 404, "/problems/not-found", p);
			cr_assert_null(strstr(r->body, "owner"), "%s %s: %s", routes[i].method, p,
			               r->body);
			http_response_free(r);
		}
		free(p);
	}
	r = req(&other, "GET", "/v1/endpoints", NULL, NULL);
	tstack_expect_status(r, 200);
	cr_assert_null(strstr(r->body, id), "%s", r->body);
	cr_assert_not_null(strstr(r->body, mine), "%s", r->body);
	http_response_free(r);
	after = state(&owner);
	cr_assert_str_eq(after, before);
	cr_assert_eq(tstack_count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1",
	                          other.id_text),
	             1);
	/* The same key in two tenants: two endpoints. */
	tstack_key(key, sizeof(key), "both");
	r = req(&owner, "POST", "/v1/endpoints", key, "{\"url\":\"https://h/same\"}");
	tstack_expect_status(r, 201);
	http_response_free(r);
	r = req(&other, "POST", "/v1/endpoints", key, "{\"url\":\"https://h/same\"}");
	tstack_expect_status(r, 201);
	cr_assert_null(http_header(r, "Idempotent-Replayed"));
	http_response_free(r);
	free(before);
	free(after);
	free(mine);
	free(id);
}

/* --- Deliveries born with the event ------------------------------------- */

static long deliveries_of(const char *endpoint, const char *workflow)
{
	return tstack_count("SELECT count(*) FROM deliveries WHERE endpoint_id = $1"
	                    "   AND workflow_id = $2",
	                    endpoint, workflow);
}

Test(endpoint_deliveries, an_endpoint_waits_for_open_events_and_gets_only_later_ones)
{
	struct tstack_tenant t;
	PGconn *c;
	char *before, *ep, *after, *inflight, *other_ep, *p, key[128];
	struct http_response *r;

	tstack_tenant_create(&t, "ep-born");
	before = tstack_create(&t, "{\"type\":\"born\"}");
	/* An event's transaction still open: the endpoint's create waits for
	 * it (sql/025_subscriptions_at_commit.sql), here past lock_timeout,
	 * and answers 503 with nothing stored; the same key, once the event
	 * committed, creates it. The event committed before the endpoint
	 * existed: no delivery; the workflow's next event has one. */
	c = tstack_db_connect();
	inflight = tstack_text("SELECT gen_random_uuid()::text");
	tstack_exec(c, "BEGIN");
	tstack_exec(c,
	            "INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload)"
	            " VALUES ($2 || '.1', $1, $2::uuid, 1, 'workflow.created', '{}')",
	            t.id_text, inflight);
	tstack_key(key, sizeof(key), "ep-born");
	r = req(&t, "POST", "/v1/endpoints", key,
	        "{\"url\":\"https://h/born\",\"filter_types\":[\"workflow.*\"]}");
	tstack_expect_status(r, 503);
	cr_assert_not_null(strstr(r->body, "\"detail\":\"the request waited longer than "
	                                   "lock_timeout for another transaction; nothing was "
	                                   "stored, retry the same request later\""),
	                   "%s", r->body);
	http_response_free(r);
	cr_assert_eq(tstack_count("SELECT count(*) FROM endpoints WHERE tenant_id = $1", t.id_text),
	             0);
	tstack_exec(c, "COMMIT");
	r = req(&t, "POST", "/v1/endpoints", key,
	        "{\"url\":\"https://h/born\",\"filter_types\":[\"workflow.*\"]}");
	tstack_expect_status(r, 201);
	ep = tstack_json(r->body, "{id}");
	http_response_free(r);
	other_ep = create(&t, "{\"url\":\"https://h/jobs\",\"filter_types\":[\"job.*\"]}");
	tstack_exec(c,
	            "INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload)"
	            " VALUES ($2 || '.2', $1, $2::uuid, 2, 'workflow.started', '{}')",
	            t.id_text, inflight);
	PQfinish(c);
	after = tstack_create(&t, "{\"type\":\"born\"}");

	/* Committed before the endpoint: none. */
	cr_assert_eq(deliveries_of(ep, before), 0);
	/* Committed after it: one, pending, for the matching endpoint only. */
	cr_assert_eq(tstack_count("SELECT count(*) FROM deliveries WHERE endpoint_id = $1"
	                          "   AND workflow_id = $2 AND seq = 1 AND state = 'pending'",
	                          ep, after),
	             1);
	cr_assert_eq(deliveries_of(other_ep, after), 0);
	cr_assert_eq(tstack_count("SELECT count(*) FROM deliveries WHERE endpoint_id = $1"
	                          "   AND workflow_id = $2 AND seq = 1",
	                          ep, inflight),
	             0);
	cr_assert_eq(tstack_count("SELECT count(*) FROM deliveries WHERE endpoint_id = $1"
	                          "   AND workflow_id = $2 AND seq = 2",
	                          ep, inflight),
	             1);

	/* Disabled: a new event's delivery is kept as skipped. */
	p = path_of("/v1/endpoints/%s", ep);
	r = req(&t, "PATCH", p, NULL, "{\"disabled\":true}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	free(after);
	after = tstack_create(&t, "{\"type\":\"born\"}");
	cr_assert_eq(tstack_count("SELECT count(*) FROM deliveries WHERE endpoint_id = $1"
	                          "   AND workflow_id = $2 AND state = 'skipped'",
	                          ep, after),
	             1);
	free(p);
	free(before);
	free(after);
	free(inflight);
	free(ep);
	free(other_ep);
}

/* --- The admin CLI ----------------------------------------------------- */

TestSuite(endpoint_cli, .timeout = 60);

Test(endpoint_cli, list_and_show_name_the_endpoints_and_never_a_secret)
{
	struct tstack_tenant t;
	char out[4096], want[1024], *a, *b;

	tstack_tenant_create(&t, "ep-cli");
	cr_assert_eq(tstack_cli(out, sizeof(out), "endpoint", "list", t.name, NULL), 0, "%s",
	             tstack_cli_stderr());
	cr_assert_str_eq(out, "");
	a = create(&t, "{\"url\":\"https://h/a\"}");
	b = create(&t, "{\"url\":\"http://h/b\",\"filter_types\":[\"job.*\",\"workflow.created\"],"
	               "\"ordering\":\"none\",\"disabled\":true}");
	tstack_exec(tstack_db(),
	            "INSERT INTO deliveries (tenant_id, endpoint_id, workflow_id, seq, outbox_id)"
	            " SELECT $1, $2, gen_random_uuid(), s, 0 FROM generate_series(1, 3) s",
	            t.id_text, a);
	tstack_exec(tstack_db(), "UPDATE endpoints SET failures = 4 WHERE id = $1", a);
	cr_assert_eq(tstack_cli(out, sizeof(out), "endpoint", "list", t.name, NULL), 0, "%s",
	             tstack_cli_stderr());
	snprintf(want, sizeof(want),
	         "%s\thttps://h/a\tworkflow\tenabled\t*\t4\t3\n"
	         "%s\thttp://h/b\tnone\tdisabled:manual\tjob.*,workflow.created\t0\t0",
	         a, b);
	cr_assert_str_eq(out, want);
	cr_assert_eq(tstack_cli(out, sizeof(out), "endpoint", "show", t.name, b, NULL), 0, "%s",
	             tstack_cli_stderr());
	cr_assert_not_null(strstr(out, "filter_types           job.*,workflow.created\n"), "%s",
	                   out);
	cr_assert_not_null(strstr(out, "disabled_reason        manual\n"), "%s", out);
	cr_assert_null(strstr(out, "whsec_"), "%s", out);
	cr_assert_eq(tstack_cli(out, sizeof(out), "endpoint", "show", t.name, "nope", NULL), 65);
	cr_assert_eq(tstack_cli(out, sizeof(out), "endpoint", "list", "no-such-tenant-x", NULL),
	             65);
	cr_assert_str_eq(tstack_cli_stderr(), "idemflow: no tenant \"no-such-tenant-x\"\n");
	free(a);
	free(b);
}
