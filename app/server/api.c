/*
 * api.c - routing and authentication for the v1 API.
 *
 * Order of checks: route and method (404/405, no database), then the
 * bearer token (401), then the handler's own validation. A request that
 * fails any check writes nothing. A create checks its token in its own
 * statement (auth.h), answering as if the token had been checked first.
 * The route comes matched (route.h), once per request, and is kept on the
 * request's context for the counters and the log line.
 */
#include "server/api.h"

#include <stdio.h>
#include <string.h>

#include "server/auth.h"
#include "server/endpoints.h"
#include "server/events.h"
#include "server/jobs.h"
#include "server/messages.h"
#include "server/ops.h"
#include "server/queries.h"
#include "server/route.h"
#include "server/wf.h"

static void not_allowed(struct http_resp *resp, const struct http_req *req, const char *allow)
{
	char detail[96];

	snprintf(detail, sizeof(detail), "this resource allows %s only", allow);
	http_resp_header(resp, "Allow", allow);
	handler_problem(resp, req, P_METHOD_NOT_ALLOWED, detail);
}

static void job_complete(struct handler_ctx *ctx, struct http_req *req, const char *key,
                         struct http_resp *resp)
{
	jobs_finish(ctx, req, key, "complete", resp);
}

static void job_fail(struct handler_ctx *ctx, struct http_req *req, const char *key,
                     struct http_resp *resp)
{
	jobs_finish(ctx, req, key, "fail", resp);
}

/* Who may call a route's method. A POST changes state and is keyed: its
 * key row is fetched in the same round trip as the token. */
enum access {
	OPEN,      /* anyone: no token, no database before the handler */
	TOKEN,     /* a tenant's bearer token */
	TOKEN_KEY, /* a tenant's bearer token, and the Idempotency-Key's row */
	/* TOKEN_KEY, begun before the handler, which ends it (auth.h): a
	 * plain keyed create checks the token in its one round trip */
	TOKEN_KEY_LATE,
};

/*
 * The route table: which method of which route (route.h's templates) runs
 * which handler, behind which check. A route's methods, in table order,
 * are its Allow header. A NULL method takes every method: the handler
 * answers 405 itself, after a check of its own (/metrics tells a stranger
 * nothing, not even which methods exist).
 */
static const struct {
	enum route route;
	const char *method;
	enum access access;
	/* One of the two: by_id takes the template's {id} or {key}. */
	void (*plain)(struct handler_ctx *, struct http_req *, struct http_resp *);
	void (*by_id)(struct handler_ctx *, struct http_req *, const char *, struct http_resp *);
} table[] = {
	{ ROUTE_HEALTHZ, "GET", OPEN, ops_healthz, NULL },
	{ ROUTE_READYZ, "GET", OPEN, ops_readyz, NULL },
	/* For the operator's scraper, not for tenants: ops.c decides who. */
	{ ROUTE_METRICS, NULL, OPEN, ops_metrics, NULL },
	{ ROUTE_STATUS, NULL, OPEN, ops_status, NULL },
	{ ROUTE_WORKFLOWS, "GET", TOKEN, wf_list, NULL },
	{ ROUTE_WORKFLOWS, "POST", TOKEN_KEY_LATE, wf_create, NULL },
	{ ROUTE_WORKFLOW, "GET", TOKEN, NULL, wf_get },
	{ ROUTE_WF_EVENTS, "GET", TOKEN, NULL, wf_events },
	{ ROUTE_WF_TRANSITIONS, "POST", TOKEN_KEY, NULL, wf_transition },
	{ ROUTE_WF_MESSAGES, "POST", TOKEN_KEY, NULL, wf_message },
	{ ROUTE_JOBS_ACTIVATE, "POST", TOKEN_KEY, jobs_activate, NULL },
	{ ROUTE_JOB_COMPLETE, "POST", TOKEN_KEY, NULL, job_complete },
	{ ROUTE_JOB_FAIL, "POST", TOKEN_KEY, NULL, job_fail },
	{ ROUTE_JOB_HEARTBEAT, "POST", TOKEN_KEY, NULL, jobs_heartbeat },
	{ ROUTE_WF_RESUME, "POST", TOKEN_KEY, NULL, wf_resume },
	{ ROUTE_MESSAGES, "POST", TOKEN_KEY, wf_publish, NULL },
	/* The contract itself: public, like the documentation it is. */
	{ ROUTE_OPENAPI, "GET", OPEN, ops_openapi, NULL },
	/* A tenant's endpoints (endpoints.h). */
	{ ROUTE_ENDPOINTS, "GET", TOKEN, endpoints_list, NULL },
	{ ROUTE_ENDPOINTS, "POST", TOKEN_KEY, endpoints_create, NULL },
	{ ROUTE_ENDPOINT, "GET", TOKEN, NULL, endpoints_get },
	{ ROUTE_ENDPOINT, "PATCH", TOKEN_KEY, NULL, endpoints_update },
	{ ROUTE_ENDPOINT, "DELETE", TOKEN_KEY, NULL, endpoints_delete },
	{ ROUTE_ENDPOINT_SECRET, "GET", TOKEN, NULL, endpoints_secret },
	{ ROUTE_ENDPOINT_ROTATE, "POST", TOKEN_KEY, NULL, endpoints_rotate },
	{ ROUTE_ENDPOINT_REVOKE, "POST", TOKEN_KEY, NULL, endpoints_revoke },
	/* The event feed, deliveries, the attempt ledger (events.h). */
	{ ROUTE_EVENTS, "GET", TOKEN, events_feed, NULL },
	{ ROUTE_EVENT_DELIVERIES, "GET", TOKEN, NULL, events_deliveries },
	{ ROUTE_EVENT_RESEND, "POST", TOKEN_KEY, NULL, events_resend },
	{ ROUTE_ENDPOINT_ATTEMPTS, "GET", TOKEN, NULL, events_attempts },
	{ ROUTE_ENDPOINT_UNDELIVERED, "GET", TOKEN, NULL, events_undelivered },
	{ ROUTE_ENDPOINT_RECOVER, "POST", TOKEN_KEY, NULL, events_recover },
};
#define NTABLE (sizeof(table) / sizeof(table[0]))

void api_handle(struct handler_ctx *ctx, struct http_req *req, const struct route_hit *hit,
                struct http_resp *resp)
{
	size_t row = NTABLE, n = 0;
	char id[64], allow[48];

	auth_reset(ctx);
	ctx->bytes_fp[0] = '\0';
	ctx->idem = IDEM_NONE;
	ctx->created = 0;
	ctx->refused = -1;
	err_clear(&ctx->err);
	buf_reset(&ctx->body);

	/* The counters and the request's log line take the route from ctx. */
	ctx->route = hit->route;
	if (ctx->route == ROUTE_OTHER) {
		handler_problem(resp, req, P_NOT_FOUND, "no such resource");
		return;
	}
	/* An id longer than any id is no resource either, whatever the method. */
	if (hit->arg != NULL) {
		if (hit->arglen >= sizeof(id)) {
			handler_problem(resp, req, P_NOT_FOUND, "no such resource");
			return;
		}
		memcpy(id, hit->arg, hit->arglen);
		id[hit->arglen] = '\0';
	}
	allow[0] = '\0';
	for (size_t i = 0; i < NTABLE; i++) {
		if (table[i].route != ctx->route)
			continue;
		if (table[i].method == NULL || strcmp(table[i].method, req->method) == 0) {
			row = i;
			break;
		}
		if (n < sizeof(allow))
			n += (size_t)snprintf(allow + n, sizeof(allow) - n, "%s%s", n ? ", " : "",
			                      table[i].method);
	}
	if (row == NTABLE) {
		not_allowed(resp, req, allow);
		return;
	}
	switch (table[row].access) {
	case OPEN: break;
	case TOKEN:
	case TOKEN_KEY:
		if (auth_check(ctx, req, resp, table[row].access == TOKEN_KEY) < 0)
			return;
		break;
	case TOKEN_KEY_LATE:
		if (auth_begin(ctx, req, resp, 1) < 0)
			return;
		break;
	}
	if (table[row].by_id != NULL)
		table[row].by_id(ctx, req, id, resp);
	else
		table[row].plain(ctx, req, resp);
}
