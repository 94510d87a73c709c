/*
 * route.h - the routes of the v1 API as names: one id per path template,
 * and the template that is its label in the metrics and the access log.
 *
 * Knows paths, not HTTP: the worker matches a request's path once with
 * route_match(), shows the route on the scoreboard and hands the match to
 * the router (api.c), which keeps the route on the request's context; the
 * counters (metrics.c) and the log line read it from there.
 */
#ifndef IDF_ROUTE_H
#define IDF_ROUTE_H

#include <stddef.h>

/* In the order the metrics are written out. */
enum route {
	ROUTE_WORKFLOWS,      /* /v1/workflows */
	ROUTE_WORKFLOW,       /* /v1/workflows/{id} */
	ROUTE_HEALTHZ,        /* /healthz */
	ROUTE_READYZ,         /* /readyz */
	ROUTE_METRICS,        /* /metrics */
	ROUTE_WF_EVENTS,      /* /v1/workflows/{id}/events */
	ROUTE_WF_TRANSITIONS, /* /v1/workflows/{id}/transitions */
	ROUTE_WF_MESSAGES,    /* /v1/workflows/{id}/messages */
	ROUTE_JOBS_ACTIVATE,  /* /v1/jobs/activate */
	ROUTE_JOB_COMPLETE,   /* /v1/jobs/{key}/complete */
	ROUTE_JOB_FAIL,       /* /v1/jobs/{key}/fail */
	ROUTE_STATUS,         /* /status */
	ROUTE_JOB_HEARTBEAT,  /* /v1/jobs/{key}/heartbeat */
	ROUTE_WF_RESUME,      /* /v1/workflows/{id}/resume */
	ROUTE_MESSAGES,       /* /v1/messages */
	ROUTE_OPENAPI,        /* /v1/openapi.json */

	/* A tenant's endpoints (endpoints.h). */
	ROUTE_ENDPOINTS,       /* /v1/endpoints */
	ROUTE_ENDPOINT,        /* /v1/endpoints/{id} */
	ROUTE_ENDPOINT_SECRET, /* /v1/endpoints/{id}/secret */
	ROUTE_ENDPOINT_ROTATE, /* /v1/endpoints/{id}/secret/rotate */
	ROUTE_ENDPOINT_REVOKE, /* /v1/endpoints/{id}/secret/revoke */

	/* The event feed, deliveries and the attempt ledger (events.h). */
	ROUTE_EVENTS,               /* /v1/events */
	ROUTE_EVENT_DELIVERIES,     /* /v1/events/{id}/deliveries */
	ROUTE_EVENT_RESEND,         /* /v1/events/{id}/resend */
	ROUTE_ENDPOINT_ATTEMPTS,    /* /v1/endpoints/{id}/attempts */
	ROUTE_ENDPOINT_UNDELIVERED, /* /v1/endpoints/{id}/undelivered */
	ROUTE_ENDPOINT_RECOVER,     /* /v1/endpoints/{id}/recover */

	ROUTE_OTHER, /* no template matched (404s) */
	ROUTE__COUNT
};

/*
 * The route whose template path matches, or ROUTE_OTHER. A "{...}" in a
 * template matches one non-empty segment (no '/'), of any length; the
 * first one's text is set in *arg and *arglen (pointing into path) when
 * arg is not NULL, and left alone when the template has none.
 */
enum route route_match(const char *path, const char **arg, size_t *arglen);

/* A request's path as route_match() found it: the route, and the text of
 * its template's first "{...}" (pointing into the path; NULL when the
 * template has none). */
struct route_hit {
	enum route route;
	const char *arg;
	size_t arglen;
};

/* The template of r ("/v1/workflows/{id}"), "other" for ROUTE_OTHER and
 * anything out of range: a bounded label, never a raw path. Static. */
const char *route_name(enum route r);

/* 1 when r takes an Idempotency-Key (it has a keyed POST, PATCH or
 * DELETE), else 0. */
int route_keyed(enum route r);

#endif
