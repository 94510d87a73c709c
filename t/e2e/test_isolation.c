/*
 * test_isolation.c - tenants never see, replay or collide with each other.
 *
 * One table of the API's routes, one test per property, each run over every
 * row that the property applies to. A new route joins by appending a row:
 *  - ISO_CREATE: a keyed POST that creates something. The same key (and the
 *    same body) in two tenants makes two resources, and another body under
 *    the tenant's key is no conflict with the other tenant's use of it.
 *  - ISO_ITEM: a request on one resource ("{id}" in the path, the id from
 *    .make). For another tenant it is 404, exactly like a missing id, and it
 *    changes nothing of the owner's.
 *  - ISO_LIST: a listing. Another tenant's resources are never in it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <criterion/criterion.h>

#include "http.h"
#include "tapi.h"
#include "tsql.h"

#define JSON_CT "Content-Type: application/json"

TestSuite(isolation, .timeout = 60);

enum iso_kind { ISO_CREATE, ISO_ITEM, ISO_LIST };

struct iso_route {
	const char *name; /* for messages: "GET /v1/workflows/{id}" */
	enum iso_kind kind;
	const char *method;
	const char *path; /* "{id}" stands for the id that make() returns */
	const char *body; /* NULL: no body */
	/* ISO_CREATE: the created resource's id, from its 201 (malloc'ed). */
	char *(*created_id)(const struct http_response *r);
	/* ISO_ITEM, ISO_LIST: make one resource as t; its id (malloc'ed). */
	char *(*make)(const struct tstack_tenant *t);
	/* The owner's rows that a request must never change, as one text
	 * (malloc'ed) compared before and after; NULL: tstack's counts. */
	char *(*state)(const struct tstack_tenant *t);
};

/* --- Resources --------------------------------------------------------- */

static char *workflow_id(const struct http_response *r)
{
	cr_assert_eq(r->status, 201, "%d %s", r->status, r->body);
	return tstack_json(r->body, "{id}");
}

static char *make_workflow(const struct tstack_tenant *t)
{
	static const char body[] = "{\"type\":\"iso\",\"input\":{\"secret\":\"owner-only\"}}";
	char key[128], kh[160];
	struct http_response *r;
	char *id;

	tstack_key(key, sizeof(key), "iso-make");
	snprintf(kh, sizeof(kh), "Idempotency-Key: %s", key);
	const char *h[] = { t->auth, JSON_CT, kh, NULL };
	r = http_request("POST", "/v1/workflows", h, body, strlen(body));
	cr_assert_not_null(r, "%s", http_error());
	id = workflow_id(r);
	http_response_free(r);
	return id;
}

/* Everything of the tenant's workflows, events and keys, in one text. */
static char *workflow_state(const struct tstack_tenant *t)
{
	return tstack_text(
	    "SELECT coalesce(string_agg(x, '|' ORDER BY x), '') FROM ("
	    "  SELECT concat_ws(',', id, type, state, input::text, updated_at) AS x"
	    "    FROM workflows WHERE tenant_id = $1"
	    "  UNION ALL SELECT concat_ws(',', event_id, type, payload) FROM outbox"
	    "   WHERE tenant_id = $1"
	    "  UNION ALL SELECT concat_ws(',', key, status, body) FROM idempotency_keys"
	    "   WHERE tenant_id = $1) s",
	    t->id_text);
}

/* A workflow with a job step activated by worker "iso-w", then a wait
 * step: every command route has something to act on. Its id. */
static char *make_running(const struct tstack_tenant *t)
{
	static const char body[] = "{\"type\":\"iso-run\",\"input\":{\"secret\":\"owner-only\"},"
	                           "\"steps\":[{\"name\":\"a\",\"job_type\":\"iso\"},"
	                           "{\"name\":\"b\",\"wait_for\":\"go\"}]}";
	static const char act[] = "{\"job_type\":\"iso\",\"worker\":\"iso-w\"}";
	char key[128], kh[160];
	struct http_response *r;
	char *id;

	tstack_key(key, sizeof(key), "iso-run");
	snprintf(kh, sizeof(kh), "Idempotency-Key: %s", key);
	const char *h[] = { t->auth, JSON_CT, kh, NULL };
	r = http_request("POST", "/v1/workflows", h, body, strlen(body));
	cr_assert_not_null(r, "%s", http_error());
	id = workflow_id(r);
	http_response_free(r);
	h[2] = NULL;
	r = http_request("POST", "/v1/jobs/activate", h, act, strlen(act));
	cr_assert_not_null(r, "%s", http_error());
	cr_assert_not_null(strstr(r->body, id), "activation: %d %s", r->status, r->body);
	http_response_free(r);
	return id;
}

/* The workflow rows above plus the tenant's jobs and messages. */
static char *run_state(const struct tstack_tenant *t)
{
	char *w = workflow_state(t), *j, *out;

	j = tstack_text(
	    "SELECT coalesce(string_agg(x, '|' ORDER BY x), '') FROM ("
	    "  SELECT concat_ws(',', workflow_id, step, state, worker, due_at,"
	    "                   activations, retries, output, error) AS x"
	    "    FROM jobs WHERE tenant_id = $1"
	    "  UNION ALL SELECT concat_ws(',', message_id, workflow_id, step) FROM messages"
	    "   WHERE tenant_id = $1) s",
	    t->id_text);
	cr_assert(asprintf(&out, "%s#%s", w, j) > 0);
	free(w);
	free(j);
	return out;
}

/* --- The routes -------------------------------------------------------- */

static const struct iso_route routes[] = {
	{ "POST /v1/workflows", ISO_CREATE, "POST", "/v1/workflows",
	  "{\"type\":\"iso\",\"input\":{\"n\":1}}", workflow_id, NULL, workflow_state },
	{ "GET /v1/workflows/{id}", ISO_ITEM, "GET", "/v1/workflows/{id}", NULL, NULL,
	  make_workflow, workflow_state },
	{ "GET /v1/workflows/{id}/events", ISO_ITEM, "GET", "/v1/workflows/{id}/events", NULL, NULL,
	  make_running, run_state },
	{ "POST /v1/workflows/{id}/transitions", ISO_ITEM, "POST", "/v1/workflows/{id}/transitions",
	  "{\"to\":\"cancelled\"}", NULL, make_running, run_state },
	{ "POST /v1/workflows/{id}/messages", ISO_ITEM, "POST", "/v1/workflows/{id}/messages",
	  "{\"message_id\":\"iso-m\",\"name\":\"go\"}", NULL, make_running, run_state },
	{ "POST /v1/jobs/{key}/complete", ISO_ITEM, "POST", "/v1/jobs/{id}.s1/complete",
	  "{\"worker\":\"iso-w\",\"output\":{}}", NULL, make_running, run_state },
	{ "POST /v1/jobs/{key}/fail", ISO_ITEM, "POST", "/v1/jobs/{id}.s1/fail",
	  "{\"worker\":\"iso-w\",\"error\":\"x\"}", NULL, make_running, run_state },
	{ "GET /v1/workflows", ISO_LIST, "GET", "/v1/workflows", NULL, NULL, make_running, NULL },
};

#define NROUTES (sizeof(routes) / sizeof(routes[0]))

/* --- Helpers ----------------------------------------------------------- */

/* The route's path with id in place of "{id}" (malloc'ed). */
static char *route_path(const struct iso_route *rt, const char *id)
{
	const char *at = strstr(rt->path, "{id}");
	char *p;

	if (at == NULL)
		return strdup(rt->path);
	cr_assert(asprintf(&p, "%.*s%s%s", (int)(at - rt->path), rt->path, id, at + 4) > 0);
	return p;
}

static struct http_response *send_as(const struct iso_route *rt, const struct tstack_tenant *t,
                                     const char *path, const char *key, const char *body)
{
	char kh[160];
	const char *h[4] = { t->auth, NULL, NULL, NULL };
	struct http_response *r;
	size_t n = 1;

	if (body != NULL)
		h[n++] = JSON_CT;
	if (key != NULL) {
		snprintf(kh, sizeof(kh), "Idempotency-Key: %s", key);
		h[n++] = kh;
	}
	r = http_request(rt->method, path, h, body, body ? strlen(body) : 0);
	cr_assert_not_null(r, "%s: %s", rt->name, http_error());
	return r;
}

static char *owner_state(const struct iso_route *rt, const struct tstack_tenant *t)
{
	return rt->state ? rt->state(t) : strdup("");
}

/* Two problems that must look alike: same status, headers (by name and
 * count; values may differ only for the per-request ones), type, title and
 * detail. Each names its own path in instance. */
static void expect_same_problem(const struct http_response *a, const char *apath,
                                const struct http_response *b, const char *bpath, const char *what)
{
	static const char *fields[] = { "{type}", "{title}", "{status}", "{detail}" };

	tstack_expect_problem(a, b->status, NULL, apath);
	tstack_expect_problem(b, b->status, NULL, bpath);
	cr_assert_eq(a->header_count, b->header_count, "%s: %zu headers, a missing one has %zu",
	             what, a->header_count, b->header_count);
	for (size_t i = 0; i < a->header_count; i++) {
		const char *n = a->headers[i].name;
		cr_assert_eq(http_header_count(a, n), http_header_count(b, n), "%s: header %s",
		             what, n);
		if (strcasecmp(n, "X-Request-Id") != 0 && strcasecmp(n, "Date") != 0)
			cr_assert_str_eq(http_header(a, n), http_header(b, n), "%s: header %s",
			                 what, n);
	}
	for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
		char *x = tstack_json(a->body, fields[i]), *y = tstack_json(b->body, fields[i]);
		cr_assert_str_eq(x, y, "%s: %s differs from a missing one's", what, fields[i]);
		free(x);
		free(y);
	}
}

/* --- Properties -------------------------------------------------------- */

Test(isolation, one_key_in_two_tenants_makes_two_resources_and_no_conflict)
{
	for (size_t i = 0; i < NROUTES; i++) {
		const struct iso_route *rt = &routes[i];
		struct tstack_tenant a, b;
		struct http_response *ra, *rb, *again;
		char key[128], *ida, *idb, *sa;
		static const char other_body[] = "{\"type\":\"iso\",\"input\":{\"n\":2}}";

		if (rt->kind != ISO_CREATE)
			continue;
		tstack_tenant_create(&a, "iso-a");
		tstack_tenant_create(&b, "iso-b");
		tstack_key(key, sizeof(key), "shared");
		ra = send_as(rt, &a, rt->path, key, rt->body);
		ida = rt->created_id(ra);
		sa = owner_state(rt, &a);

		/* The same request under the same key, as B: B's own. */
		rb = send_as(rt, &b, rt->path, key, rt->body);
		cr_assert_eq(rb->status, ra->status, "%s: %d %s", rt->name, rb->status, rb->body);
		cr_assert_null(http_header(rb, "Idempotent-Replayed"),
		               "%s: B was answered with A's stored response", rt->name);
		idb = rt->created_id(rb);
		cr_assert_str_neq(ida, idb, "%s: B got A's resource", rt->name);
		cr_assert(rb->body_len != ra->body_len || memcmp(rb->body, ra->body, ra->body_len),
		          "%s: B got A's bytes", rt->name);

		/* B's replay is B's response, never A's. */
		again = send_as(rt, &b, rt->path, key, rt->body);
		tstack_expect_replay(again, rb);
		http_response_free(again);

		/* Another body under the key conflicts with B's own use only. */
		struct tstack_tenant c;
		tstack_tenant_create(&c, "iso-c");
		again = send_as(rt, &c, rt->path, key, other_body);
		cr_assert_eq(again->status, ra->status, "%s: C's first use of the key: %d %s",
		             rt->name, again->status, again->body);
		http_response_free(again);
		again = send_as(rt, &b, rt->path, key, other_body);
		tstack_expect_problem(again, 409, "/problems/idempotency-key-reused", rt->path);
		http_response_free(again);

		/* A's resource, and A's replay, are untouched by B and C. */
		char *sa2 = owner_state(rt, &a);
		cr_assert_str_eq(sa2, sa, "%s: A's rows changed", rt->name);
		again = send_as(rt, &a, rt->path, key, rt->body);
		tstack_expect_replay(again, ra);
		http_response_free(again);

		free(sa2);
		free(sa);
		free(ida);
		free(idb);
		http_response_free(ra);
		http_response_free(rb);
	}
}

Test(isolation, another_tenants_resource_is_404_exactly_like_a_missing_one)
{
	for (size_t i = 0; i < NROUTES; i++) {
		const struct iso_route *rt = &routes[i];
		struct tstack_tenant a, b;
		struct http_response *theirs, *missing, *own;
		char key[128], uuid[37], *id, *p_theirs, *p_missing, *before, *after;

		if (rt->kind != ISO_ITEM)
			continue;
		tstack_tenant_create(&a, "iso-owner");
		tstack_tenant_create(&b, "iso-other");
		id = rt->make(&a);
		tstack_uuid(uuid);
		p_theirs = route_path(rt, id);
		p_missing = route_path(rt, uuid);
		before = owner_state(rt, &a);

		tstack_key(key, sizeof(key), "iso-item");
		theirs = send_as(rt, &b, p_theirs, rt->body ? key : NULL, rt->body);
		tstack_key(key, sizeof(key), "iso-item");
		missing = send_as(rt, &b, p_missing, rt->body ? key : NULL, rt->body);
		cr_assert_eq(missing->status, 404, "%s on a missing id: %d %s", rt->name,
		             missing->status, missing->body);
		expect_same_problem(theirs, p_theirs, missing, p_missing, rt->name);
		cr_assert_null(strstr(theirs->body, "owner-only"), "%s leaked: %s", rt->name,
		               theirs->body);

		after = owner_state(rt, &a);
		cr_assert_str_eq(after, before, "%s by another tenant changed the owner's rows",
		                 rt->name);
		/* And the owner does reach it: the 404 was about the tenant. */
		tstack_key(key, sizeof(key), "iso-item");
		own = send_as(rt, &a, p_theirs, rt->body ? key : NULL, rt->body);
		cr_assert(own->status >= 200 && own->status < 300, "%s as the owner: %d %s",
		          rt->name, own->status, own->body);

		free(before);
		free(after);
		free(p_theirs);
		free(p_missing);
		free(id);
		http_response_free(theirs);
		http_response_free(missing);
		http_response_free(own);
	}
}

Test(isolation, listings_hold_only_the_tenants_own_resources)
{
	for (size_t i = 0; i < NROUTES; i++) {
		const struct iso_route *rt = &routes[i];
		struct tstack_tenant a, b;
		struct http_response *r;
		char *ida, *idb;

		if (rt->kind != ISO_LIST)
			continue;
		tstack_tenant_create(&a, "iso-list-a");
		tstack_tenant_create(&b, "iso-list-b");
		ida = rt->make(&a);
		idb = rt->make(&b);
		r = send_as(rt, &b, rt->path, NULL, NULL);
		cr_assert_eq(r->status, 200, "%s: %d %s", rt->name, r->status, r->body);
		cr_assert_not_null(strstr(r->body, idb), "%s: B's own %s missing", rt->name, idb);
		cr_assert_null(strstr(r->body, ida), "%s: B sees A's %s", rt->name, ida);
		http_response_free(r);
		free(ida);
		free(idb);
	}
}
