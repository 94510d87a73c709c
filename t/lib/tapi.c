/*
 * Tenants, tokens and keys; assertions on the API's answers; see tapi.h.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* asprintf, pipe2, open_memstream */
#endif
#include "tapi.h"

#include <ctype.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "core/problem.h"
#include "tsql.h"
#include "tstack.h"

/* --- Tenants and tokens ------------------------------------------------ */

void tstack_token_create(const char *tenant, char *out, size_t outsz)
{
	int rc = tstack_cli(out, outsz, "token", "create", "--tenant", tenant, NULL);

	cr_assert_eq(rc, 0, "idemflow token create --tenant %s exited %d: %s", tenant, rc,
	             tstack_cli_stderr());
	cr_assert(out[0] != '\0' && !strpbrk(out, " \t\r\n"),
	          "token create must print exactly one token, printed \"%s\"", out);
}

void tstack_token_revoke(const char *token)
{
	char out[256];
	int rc = tstack_cli(out, sizeof(out), "token", "revoke", token, NULL);

	cr_assert_eq(rc, 0, "idemflow token revoke exited %d: %s", rc, tstack_cli_stderr());
}

void tstack_tenant_create(struct tstack_tenant *t, const char *label)
{
	char hex[9], out[256], clean[33];
	size_t i;
	int rc;

	memset(t, 0, sizeof(*t));
	/* Tenant names allow [A-Za-z0-9._-]; test names may hold more. */
	for (i = 0; label[i] && i < sizeof(clean) - 1; i++)
		clean[i] = isalnum((unsigned char)label[i]) ? label[i] : '-';
	clean[i] = '\0';
	tstack_random_hex(hex, 4);
	snprintf(t->name, sizeof(t->name), "t-%s-%ld-%s", clean, (long)getpid(), hex);

	rc = tstack_cli(out, sizeof(out), "tenant", "create", t->name, NULL);
	cr_assert_eq(rc, 0, "idemflow tenant create %s exited %d: %s", t->name, rc,
	             tstack_cli_stderr());
	/* Take the id from the table, not from the CLI's wording. */
	t->id = tstack_count("SELECT id FROM tenants WHERE name = $1", t->name);
	snprintf(t->id_text, sizeof(t->id_text), "%ld", t->id);
	cr_assert_str_eq(out, t->id_text, "tenant create must print the tenant id");

	tstack_tenant_retoken(t);
}

void tstack_tenant_retoken(struct tstack_tenant *t)
{
	tstack_token_create(t->name, t->token, sizeof(t->token));
	snprintf(t->auth, sizeof(t->auth), "Authorization: Bearer %s", t->token);
}

/* --- Requests ---------------------------------------------------------- */

#define JSON_CT "Content-Type: application/json"

/* POST path as t with body and, unless key is NULL, an Idempotency-Key.
 * Safe on any thread (no assertions). */
struct http_response *tstack_post_raw(const struct tstack_tenant *t, const char *path,
                                      const char *key, const char *body)
{
	char kh[300];
	const char *h[] = { t->auth, JSON_CT, NULL, NULL };

	if (key != NULL) {
		snprintf(kh, sizeof(kh), "Idempotency-Key: %s", key);
		h[2] = kh;
	}
	return http_request("POST", path, h, body, strlen(body));
}

struct http_response *tstack_post(const struct tstack_tenant *t, const char *path, const char *key,
                                  const char *body)
{
	struct http_response *r = tstack_post_raw(t, path, key, body);

	cr_assert_not_null(r, "POST %s: %s", path, http_error());
	return r;
}

struct http_response *tstack_get(const struct tstack_tenant *t, const char *path)
{
	const char *h[] = { t->auth, NULL };
	struct http_response *r = http_request("GET", path, h, NULL, 0);

	cr_assert_not_null(r, "GET %s: %s", path, http_error());
	return r;
}

void tstack_expect_status(const struct http_response *r, int status)
{
	cr_assert_eq(r->status, status, "status %d, want %d; body: %.600s", r->status, status,
	             r->body);
}

/* Create a workflow from body (a fresh key); returns its id (malloc'ed). */
char *tstack_create(const struct tstack_tenant *t, const char *body)
{
	char key[96];
	struct http_response *r;
	char *id;

	tstack_key(key, sizeof(key), "wf");
	r = tstack_post(t, "/v1/workflows", key, body);
	tstack_expect_status(r, 201);
	id = tstack_json(r->body, "{id}");
	http_response_free(r);
	return id;
}

/* --- Unique names ------------------------------------------------------ */

void tstack_random_hex(char *out, size_t nbytes)
{
	unsigned char b[64];

	cr_assert(nbytes <= sizeof(b));
	cr_assert_eq(getrandom(b, nbytes, 0), (ssize_t)nbytes, "getrandom");
	for (size_t i = 0; i < nbytes; i++)
		snprintf(out + 2 * i, 3, "%02x", b[i]);
	out[2 * nbytes] = '\0';
}

void tstack_uuid(char out[37])
{
	unsigned char b[16];

	cr_assert_eq(getrandom(b, sizeof(b), 0), (ssize_t)sizeof(b));
	b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
	b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
	snprintf(out, 37,
	         "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
	         "%02x%02x%02x%02x%02x%02x",
	         b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
	         b[13], b[14], b[15]);
}

void tstack_key(char *out, size_t outsz, const char *label)
{
	char hex[17];

	tstack_random_hex(hex, 8);
	snprintf(out, outsz, "k-%s-%ld-%s", label, (long)getpid(), hex);
}

/* --- Assertions -------------------------------------------------------- */

void tstack_expect_header(const struct http_response *r, const char *name, const char *value)
{
	const char *v = http_header(r, name);

	cr_assert_not_null(v, "missing header %s (status %d, body %.300s)", name, r->status,
	                   r->body);
	cr_assert(strcmp(v, value) == 0, "header %s: \"%s\", want \"%s\"", name, v, value);
	cr_assert_eq(http_header_count(r, name), 1, "header %s sent %zu times", name,
	             http_header_count(r, name));
}

/* Field at path of a problem body must have the given JSON type. */
static char *problem_field(const struct http_response *r, const char *path, const char *type)
{
	char *t = tstack_json_type(r->body, path);

	cr_assert(t && strcmp(t, type) == 0, "problem field %s must be a %s, is %s: %s", path, type,
	          t ? t : "missing", r->body);
	free(t);
	return tstack_json(r->body, path);
}

void tstack_expect_problem(const struct http_response *r, int status, const char *type,
                           const char *instance)
{
	const char *rid;
	char *root, *v, want[16];

	cr_assert_not_null(r, "no response: %s", http_error());
	cr_assert_eq(r->status, status, "status %d, want %d; body: %.500s", r->status, status,
	             r->body);
	tstack_expect_header(r, "Content-Type", "application/problem+json");
	rid = http_header(r, "X-Request-Id");
	cr_assert_not_null(rid, "missing X-Request-Id");

	root = tstack_json_type(r->body, "{}");
	cr_assert_str_eq(root, "object", "problem body: %s", r->body);
	free(root);

	/* A test names a type "/problems/<slug>": the slug under the base
	 * the test stack's server has, the default problem_base_uri. */
	const char *base = problem_base_uri();
	char want_type[512];
	if (type != NULL && strncmp(type, "/problems/", 10) == 0)
		snprintf(want_type, sizeof(want_type), "%s%s", base, type + 10);
	else if (type != NULL)
		snprintf(want_type, sizeof(want_type), "%s", type);
	v = problem_field(r, "{type}", "string");
	if (type)
		cr_assert_str_eq(v, want_type, "problem type; body: %s", r->body);
	else
		cr_assert(strncmp(v, base, strlen(base)) == 0 && v[strlen(base)],
		          "problem type: %s", v);
	free(v);

	v = problem_field(r, "{title}", "string");
	cr_assert(v[0] != '\0', "empty problem title");
	free(v);

	snprintf(want, sizeof(want), "%d", status);
	v = problem_field(r, "{status}", "number");
	cr_assert_str_eq(v, want, "problem status must equal the HTTP status");
	free(v);

	v = problem_field(r, "{detail}", "string");
	free(v);

	v = problem_field(r, "{instance}", "string");
	cr_assert_str_eq(v, instance, "problem instance");
	free(v);

	v = problem_field(r, "{request_id}", "string");
	cr_assert_str_eq(v, rid, "request_id must equal X-Request-Id");
	free(v);
}

void tstack_expect_match(const char *s, const char *pattern, const char *what)
{
	regex_t re;
	int rc;

	cr_assert_eq(regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB), 0, "bad pattern %s", pattern);
	rc = regexec(&re, s, 0, NULL, 0);
	regfree(&re);
	cr_assert_eq(rc, 0, "%s \"%s\" does not match %s", what, s, pattern);
}

char *tstack_expect_created(const struct http_response *r, const char *type,
                            const char *canonical_input)
{
	char *id, *created_at, *want, location[64];
	const char *rid;

	cr_assert_not_null(r, "no response: %s", http_error());
	cr_assert_eq(r->status, 201, "status %d, body %.500s", r->status, r->body);
	tstack_expect_header(r, "Content-Type", "application/json");
	cr_assert_null(http_header(r, "Idempotent-Replayed"), "a first request is not a replay");
	rid = http_header(r, "X-Request-Id");
	cr_assert_not_null(rid, "missing X-Request-Id");
	tstack_expect_match(rid, "^[0-9a-f]{32}$", "X-Request-Id");

	id = tstack_json(r->body, "{id}");
	cr_assert_not_null(id, "no id in %s", r->body);
	tstack_expect_match(id,
	                    "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-"
	                    "[0-9a-f]{4}-[0-9a-f]{12}$",
	                    "id");
	snprintf(location, sizeof(location), "/v1/workflows/%s", id);
	tstack_expect_header(r, "Location", location);

	created_at = tstack_json(r->body, "{created_at}");
	cr_assert_not_null(created_at, "no created_at in %s", r->body);
	tstack_expect_match(created_at,
	                    "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}"
	                    ":[0-9]{2}(\\.[0-9]{1,9})?Z$",
	                    "created_at");

	cr_assert(asprintf(&want,
	                   "{\"id\":\"%s\",\"type\":\"%s\",\"state\":"
	                   "\"pending\",\"input\":%s,\"created_at\":"
	                   "\"%s\"}",
	                   id, type, canonical_input, created_at) > 0);
	cr_assert_eq(r->body_len, strlen(want), "body %.500s, want %.500s", r->body, want);
	cr_assert_str_eq(r->body, want);
	free(want);
	free(created_at);
	return id;
}

void tstack_expect_replay(const struct http_response *r, const struct http_response *first)
{
	cr_assert_not_null(r, "no response: %s", http_error());
	cr_assert_eq(r->status, first->status, "status %d, body %.500s", r->status, r->body);
	tstack_expect_header(r, "Idempotent-Replayed", "true");
	tstack_expect_header(r, "Location", http_header(first, "Location"));
	tstack_expect_header(r, "Content-Type", "application/json");
	cr_assert_eq(r->body_len, first->body_len, "replayed %.500s, first %.500s", r->body,
	             first->body);
	cr_assert(memcmp(r->body, first->body, r->body_len) == 0, "replayed %.500s, first %.500s",
	          r->body, first->body);
}
