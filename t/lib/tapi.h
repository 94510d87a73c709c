/*
 * Requests with keys and tokens: tenants and their bearer tokens (made
 * with the admin CLI), unique names and Idempotency-Keys, and the
 * assertions on the API's answers every e2e suite repeats.
 */
#ifndef IDEMFLOW_T_TAPI_H
#define IDEMFLOW_T_TAPI_H

#include <stddef.h>

#include "http.h"

struct tstack_tenant {
	long id;
	char id_text[24]; /* id as a query parameter */
	char name[64];
	char token[128];
	char auth[160]; /* "Authorization: Bearer <token>" */
};

/* A fresh tenant named after label, with one bearer token. */
void tstack_tenant_create(struct tstack_tenant *t, const char *label);
void tstack_token_create(const char *tenant, char *out, size_t outsz);
void tstack_token_revoke(const char *token);
/* Give t a new token of the same tenant. A worker's replay cache holds
 * key rows per token (app/server/rcache.h): a test that changes a stored row in
 * the database asks again with a token no worker has used. */
void tstack_tenant_retoken(struct tstack_tenant *t);

/*
 * Requests as tenant t through nginx. tstack_post_raw: POST path with body
 * (application/json) and, unless key is NULL, an Idempotency-Key; safe on
 * any thread (no assertions), NULL when no answer came (http_error()).
 * tstack_post and tstack_get: the same, and the test fails without an
 * answer. tstack_create: POST /v1/workflows with body under a fresh key,
 * expects 201 and returns the id (malloc'ed).
 */
struct http_response *tstack_post_raw(const struct tstack_tenant *t, const char *path,
                                      const char *key, const char *body);
struct http_response *tstack_post(const struct tstack_tenant *t, const char *path, const char *key,
                                  const char *body);
struct http_response *tstack_get(const struct tstack_tenant *t, const char *path);
char *tstack_create(const struct tstack_tenant *t, const char *body);
/* r's status is status (the body is quoted when it is not). */
void tstack_expect_status(const struct http_response *r, int status);

/* Unique names: nbytes random bytes as hex, a v4 uuid, a fresh key. */
void tstack_random_hex(char *out, size_t nbytes);
void tstack_uuid(char out[37]);
void tstack_key(char *out, size_t outsz, const char *label);

/* Assertions shared by the e2e suites. */
void tstack_expect_header(const struct http_response *r, const char *name, const char *value);
/* A problem+json response. type "/problems/<slug>" is the slug under the
 * default problem_base_uri (https://idemflow.example/problems/<slug>);
 * NULL accepts any type under it. */
void tstack_expect_problem(const struct http_response *r, int status, const char *type,
                           const char *instance);
/* s matches the extended regular expression pattern. */
void tstack_expect_match(const char *s, const char *pattern, const char *what);
/*
 * A first (not replayed) 201 from POST /v1/workflows: Location and body
 * name the same id, and the body is exactly the documented bytes
 * {"id","type","state":"pending","input":<canonical_input>,"created_at"}.
 * Returns the id (malloc'ed).
 */
char *tstack_expect_created(const struct http_response *r, const char *type,
                            const char *canonical_input);
/* A replay of first: same status, Location and body bytes, flagged. */
void tstack_expect_replay(const struct http_response *r, const struct http_response *first);

#endif
