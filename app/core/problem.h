/*
 * problem.h - RFC 9457 problem details, one stable type per kind of error.
 *
 * Every error answer of the API is application/problem+json with type,
 * title, status, detail, instance (the request path) and request_id. The
 * type is an absolute URI, problem_base_uri + "<slug>"
 * (https://idemflow.example/problems/<slug> by default), each documented
 * under a heading named after its slug in doc/api.md.
 */
#ifndef IDF_PROBLEM_H
#define IDF_PROBLEM_H

#include "core/buf.h"

enum problem_kind {
	P_NOT_FOUND,
	P_METHOD_NOT_ALLOWED,
	P_UNAUTHORIZED,
	P_UNSUPPORTED_MEDIA_TYPE,
	P_BODY_TOO_LARGE,
	P_BAD_BODY,
	P_MISSING_KEY,
	P_INVALID_KEY,
	P_INVALID_JSON,
	P_INVALID_WORKFLOW,
	P_KEY_REUSED,
	P_KEY_IN_FLIGHT,
	P_UNAVAILABLE,
	P_INTERNAL,
	P_FORBIDDEN,
	P_INVALID_REQUEST,
	P_LEASE_EXPIRED,
	P_NOT_LEASE_HOLDER,
	P_JOB_NOT_ACTIVE,
	P_STATE_CONFLICT,
	P_INVALID_TRANSITION,
	P_MESSAGE_REUSED,
	P_OUTCOME_UNKNOWN,
	P_INVALID_DURATION,
	P_ACTIVATION_TOO_LARGE,
	P__COUNT
};

struct problem_def {
	int status;
	const char *slug;
	const char *title;
};

/*
 * Set what the configuration decides, once per process before the first
 * answer (a worker at its start): the status of P_KEY_REUSED, 409 (the
 * default) or 422 (the IETF draft's), and the base URI of every type
 * (copied; NULL or one of 256 bytes or more keeps the current base;
 * conf.c checks that it is an absolute URI safe inside a JSON string).
 */
void problem_configure(int key_reused_status, const char *type_base);

/* The base URI types are written under. Borrowed, static. */
const char *problem_base_uri(void);

/* The status, slug and title of a kind. Borrowed, static. */
const struct problem_def *problem_def(enum problem_kind kind);

/* The kind whose slug is slug (as the database functions name them), or
 * P_INTERNAL when there is none. */
enum problem_kind problem_by_slug(const char *slug);

/*
 * Append the problem+json body to out. detail, instance and request_id may
 * be NULL (then omitted). ext_name/ext_value add one extension member with
 * a string value (e.g. "idempotency_key"), or are NULL.
 */
void problem_write(struct buf *out, enum problem_kind kind, const char *detail,
                   const char *instance, const char *request_id, const char *ext_name,
                   const char *ext_value);

#endif
