/* problem.c - RFC 9457 problem details (see problem.h). */
#include "core/problem.h"

#include <string.h>

#include "core/canon.h"

/* Fixed but for the status of P_KEY_REUSED (problem_configure). */
static struct problem_def defs[P__COUNT] = {
	[P_NOT_FOUND] = { 404, "not-found", "Not Found" },
	[P_METHOD_NOT_ALLOWED] = { 405, "method-not-allowed", "Method Not Allowed" },
	[P_UNAUTHORIZED] = { 401, "unauthorized", "Unauthorized" },
	[P_UNSUPPORTED_MEDIA_TYPE] = { 415, "unsupported-media-type", "Unsupported Media Type" },
	[P_BODY_TOO_LARGE] = { 413, "body-too-large", "Content Too Large" },
	[P_BAD_BODY] = { 400, "bad-body", "Incomplete Request Body" },
	[P_MISSING_KEY] = { 400, "missing-idempotency-key", "Idempotency-Key Required" },
	[P_INVALID_KEY] = { 400, "invalid-idempotency-key", "Invalid Idempotency-Key" },
	[P_INVALID_JSON] = { 400, "invalid-json", "Invalid JSON" },
	[P_INVALID_WORKFLOW] = { 422, "invalid-workflow", "Invalid Workflow" },
	[P_KEY_REUSED] = { 409, "idempotency-key-reused", "Idempotency-Key Reused" },
	[P_KEY_IN_FLIGHT] = { 409, "idempotency-key-in-flight", "Request In Flight" },
	[P_UNAVAILABLE] = { 503, "unavailable", "Service Unavailable" },
	[P_INTERNAL] = { 500, "internal", "Internal Server Error" },
	[P_FORBIDDEN] = { 403, "forbidden", "Forbidden" },
	[P_INVALID_REQUEST] = { 422, "invalid-request", "Invalid Request" },
	[P_LEASE_EXPIRED] = { 409, "lease-expired", "Lease Expired" },
	[P_NOT_LEASE_HOLDER] = { 409, "not-lease-holder", "Not The Lease Holder" },
	[P_JOB_NOT_ACTIVE] = { 409, "job-not-active", "Job Not Active" },
	[P_STATE_CONFLICT] = { 409, "state-conflict", "State Conflict" },
	[P_INVALID_TRANSITION] = { 422, "invalid-transition", "Invalid Transition" },
	[P_MESSAGE_REUSED] = { 409, "message-id-reused", "Message Id Reused" },
	[P_OUTCOME_UNKNOWN] = { 503, "outcome-unknown", "Outcome Unknown" },
	[P_INVALID_DURATION] = { 400, "invalid-duration", "Invalid Duration" },
	[P_ACTIVATION_TOO_LARGE] = { 413, "activation-too-large", "Activation Too Large" },
};

/* conf.c's default: a process that never calls problem_configure (the
 * CLI, the tests) writes the same types as a default server. */
#define BASE_DEFAULT "https://idemflow.example/problems/"
static char base_uri[256] = BASE_DEFAULT;

void problem_configure(int key_reused_status, const char *type_base)
{
	defs[P_KEY_REUSED].status = key_reused_status;
	if (type_base != NULL && strlen(type_base) < sizeof(base_uri))
		strcpy(base_uri, type_base);
}

const char *problem_base_uri(void)
{
	return base_uri;
}

const struct problem_def *problem_def(enum problem_kind kind)
{
	return &defs[kind];
}

enum problem_kind problem_by_slug(const char *slug)
{
	for (int k = 0; k < P__COUNT; k++)
		if (strcmp(defs[k].slug, slug) == 0)
			return (enum problem_kind)k;
	return P_INTERNAL;
}

/* Values may echo client input (a path, a key): anything outside printable
 * ASCII becomes '?', so the body is valid JSON whatever the input was. */
static void member(struct buf *out, const char *name, const char *value)
{
	char safe[512];
	size_t n = 0;

	for (; value[n] && n < sizeof(safe) - 1; n++) {
		unsigned char c = (unsigned char)value[n];
		safe[n] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
	}
	safe[n] = '\0';
	buf_putc(out, ',');
	canon_write_string(out, name, strlen(name));
	buf_putc(out, ':');
	canon_write_string(out, safe, n);
}

void problem_write(struct buf *out, enum problem_kind kind, const char *detail,
                   const char *instance, const char *request_id, const char *ext_name,
                   const char *ext_value)
{
	const struct problem_def *d = &defs[kind];

	/* base_uri is JSON-safe: conf.c accepts no '"', '\\' or control. */
	buf_printf(out, "{\"type\":\"%s%s\",\"title\":\"%s\",\"status\":%d", base_uri, d->slug,
	           d->title, d->status);
	if (detail != NULL)
		member(out, "detail", detail);
	if (instance != NULL)
		member(out, "instance", instance);
	if (request_id != NULL)
		member(out, "request_id", request_id);
	if (ext_name != NULL && ext_value != NULL)
		member(out, ext_name, ext_value);
	buf_putc(out, '}');
}
