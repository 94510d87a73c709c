/*
 * test_openapi.c - GET /v1/openapi.json follows the configured
 * problem_base_uri: the stack runs with a base of its own (not the
 * default the document is written with), and the served document names
 * every problem type under it, as the live problem answers do. Exact
 * bytes: the type URIs, the count of them, the length of the document.
 */
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "http.h"
#include "server/openapi.h"
#include "tapi.h"
#include "tstack.h"

#define BASE "https://api.example.org/errors/"

TSTACK_SETTINGS("problem_base_uri = " BASE "\n")

/* How many times needle occurs in the len bytes at s. */
static size_t count(const char *s, size_t len, const char *needle)
{
	size_t n = 0, nl = strlen(needle);

	for (const char *p = s; (p = memmem(p, len - (size_t)(p - s), needle, nl)) != NULL; p += nl)
		n++;
	return n;
}

static struct http_response *get_document(void)
{
	struct http_response *r = http_request("GET", "/v1/openapi.json", NULL, NULL, 0);

	cr_assert_not_null(r, "GET /v1/openapi.json: %s", http_error());
	tstack_expect_status(r, 200);
	tstack_expect_header(r, "Content-Type", "application/json");
	return r;
}

Test(openapi, the_problem_types_follow_problem_base_uri)
{
	struct http_response *r = get_document();
	/* In the embedded document, as written: the strings that begin with
	 * the default base (a quote before it). */
	size_t written =
	    count(openapi_json, openapi_json_len, "\"https://idemflow.example/problems/");

	cr_assert_str_eq(openapi_problem_base, "https://idemflow.example/problems/");
	/* 27 problem types in the enum, plus examples and the base itself. */
	cr_assert_geq(written, 28, "%zu", written);
	cr_assert_eq(count(r->body, r->body_len, "\"https://idemflow.example/problems/"), 0);
	cr_assert_eq(count(r->body, r->body_len, "\"" BASE), written);
	cr_assert_eq(r->body_len, openapi_json_len - written * strlen(openapi_problem_base) +
	                              written * strlen(BASE));
	cr_assert_not_null(memmem(r->body, r->body_len, "\"x-problem-base-uri\":\"" BASE "\"",
	                          strlen("\"x-problem-base-uri\":\"" BASE "\"")),
	                   "x-problem-base-uri is not " BASE);
	cr_assert_not_null(strstr(r->body, "\"" BASE "idempotency-key-reused\""),
	                   "no " BASE "idempotency-key-reused");
	cr_assert_not_null(strstr(r->body, "\"" BASE "not-found\""), "no " BASE "not-found");
	/* The prose that names the default as the default keeps it. */
	cr_assert_not_null(
	    strstr(r->body, "`https://idemflow.example/problems/<slug>` by default"));
	http_response_free(r);
}

Test(openapi, a_live_problem_has_a_type_the_document_lists)
{
	struct tstack_tenant t;
	struct http_response *doc = get_document(), *r;

	tstack_tenant_create(&t, "openapi");
	r = tstack_get(&t, "/v1/workflows/00000000-0000-4000-8000-000000000000");
	tstack_expect_status(r, 404);
	cr_assert_not_null(strstr(r->body, "\"type\":\"" BASE "not-found\""), "%s", r->body);
	cr_assert_not_null(strstr(doc->body, "\"" BASE "not-found\""));
	http_response_free(r);
	/* The same document on every request (the worker keeps it). */
	r = get_document();
	cr_assert_eq(r->body_len, doc->body_len);
	cr_assert_eq(memcmp(r->body, doc->body, doc->body_len), 0);
	http_response_free(r);
	http_response_free(doc);
}
