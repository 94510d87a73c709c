/* route.c - the route templates and matching a path against them (see route.h). */
#include "server/route.h"

#include <string.h>

static const struct {
	const char *template;
	int keyed;
} routes[ROUTE__COUNT] = {
	[ROUTE_WORKFLOWS] = { "/v1/workflows", 1 },
	[ROUTE_WORKFLOW] = { "/v1/workflows/{id}", 0 },
	[ROUTE_HEALTHZ] = { "/healthz", 0 },
	[ROUTE_READYZ] = { "/readyz", 0 },
	[ROUTE_METRICS] = { "/metrics", 0 },
	[ROUTE_WF_EVENTS] = { "/v1/workflows/{id}/events", 0 },
	[ROUTE_WF_TRANSITIONS] = { "/v1/workflows/{id}/transitions", 1 },
	[ROUTE_WF_MESSAGES] = { "/v1/workflows/{id}/messages", 1 },
	[ROUTE_JOBS_ACTIVATE] = { "/v1/jobs/activate", 1 },
	[ROUTE_JOB_COMPLETE] = { "/v1/jobs/{key}/complete", 1 },
	[ROUTE_JOB_FAIL] = { "/v1/jobs/{key}/fail", 1 },
	[ROUTE_STATUS] = { "/status", 0 },
	[ROUTE_JOB_HEARTBEAT] = { "/v1/jobs/{key}/heartbeat", 1 },
	[ROUTE_WF_RESUME] = { "/v1/workflows/{id}/resume", 1 },
	[ROUTE_MESSAGES] = { "/v1/messages", 1 },
	[ROUTE_OPENAPI] = { "/v1/openapi.json", 0 },
	[ROUTE_ENDPOINTS] = { "/v1/endpoints", 1 },
	[ROUTE_ENDPOINT] = { "/v1/endpoints/{id}", 1 },
	[ROUTE_ENDPOINT_SECRET] = { "/v1/endpoints/{id}/secret", 0 },
	[ROUTE_ENDPOINT_ROTATE] = { "/v1/endpoints/{id}/secret/rotate", 1 },
	[ROUTE_ENDPOINT_REVOKE] = { "/v1/endpoints/{id}/secret/revoke", 1 },
	[ROUTE_EVENTS] = { "/v1/events", 0 },
	[ROUTE_EVENT_DELIVERIES] = { "/v1/events/{id}/deliveries", 0 },
	[ROUTE_EVENT_RESEND] = { "/v1/events/{id}/resend", 1 },
	[ROUTE_ENDPOINT_ATTEMPTS] = { "/v1/endpoints/{id}/attempts", 0 },
	[ROUTE_ENDPOINT_UNDELIVERED] = { "/v1/endpoints/{id}/undelivered", 0 },
	[ROUTE_ENDPOINT_RECOVER] = { "/v1/endpoints/{id}/recover", 1 },
	[ROUTE_OTHER] = { "other", 0 },
};

/* Does path match template t? Sets the first "{...}" segment's text. */
static int matches(const char *t, const char *path, const char **arg, size_t *arglen)
{
	const char *p = path;
	int captured = 0;

	while (*t != '\0') {
		if (*t == '{') {
			size_t n = strcspn(p, "/");
			const char *close = strchr(t, '}');
			if (n == 0 || close == NULL)
				return 0;
			if (!captured) {
				*arg = p;
				*arglen = n;
				captured = 1;
			}
			p += n;
			t = close + 1;
		} else if (*t++ != *p++) {
			return 0;
		}
	}
	return *p == '\0';
}

enum route route_match(const char *path, const char **arg, size_t *arglen)
{
	const char *a = NULL;
	size_t n = 0;

	if (path == NULL)
		return ROUTE_OTHER;
	/* Templates are disjoint: at most one matches, so their order does
	 * not matter; a dozen comparisons are nothing next to a request. */
	for (int r = 0; r < ROUTE_OTHER; r++) {
		a = NULL;
		if (matches(routes[r].template, path, &a, &n)) {
			if (arg != NULL && a != NULL) {
				*arg = a;
				*arglen = n;
			}
			return (enum route)r;
		}
	}
	return ROUTE_OTHER;
}

const char *route_name(enum route r)
{
	return (unsigned)r < ROUTE__COUNT ? routes[r].template : routes[ROUTE_OTHER].template;
}

int route_keyed(enum route r)
{
	return (unsigned)r < ROUTE__COUNT && routes[r].keyed;
}
