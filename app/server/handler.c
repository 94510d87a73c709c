/*
 * handler.c - the problem answers and the trace context every handler
 * shares (see handler.h).
 */
#include "server/handler.h"

#include <stdio.h>
#include <string.h>

#include "core/log.h"

/* Raised by idemflow_enter_step (sql/018_outputs_priority.sql): the step
 * would be entered with more input and step outputs than an activation
 * carries. */
#define SQLSTATE_ACTIVATION_TOO_LARGE "IDF13"

void handler_trace_begin(struct handler_ctx *ctx, const struct http_req *req)
{
	static const char tp[] = "HTTP_TRACEPARENT=", ts[] = "HTTP_TRACESTATE=";
	const char *parent = NULL;
	char state[TRACE_STATE_MAX + 2];
	size_t slen = 0;
	int nparents = 0, state_ok = 1;

	for (char **e = req->fcgi != NULL ? req->fcgi->envp : NULL; e && *e; e++) {
		const char *env = *e;
		if (strncmp(env, "HTTP_TRACE", 10) != 0)
			continue;
		if (strncmp(env, tp, sizeof(tp) - 1) == 0) {
			parent = env + sizeof(tp) - 1;
			nparents++;
		} else if (strncmp(env, ts, sizeof(ts) - 1) == 0 && state_ok) {
			/* Headers of one name are one list: join them, and
			 * drop the lot when they do not fit. */
			const char *v = env + sizeof(ts) - 1;
			size_t n = strlen(v);
			if (slen + (slen > 0) + n > TRACE_STATE_MAX) {
				state_ok = 0;
				continue;
			}
			if (slen > 0)
				state[slen++] = ',';
			memcpy(state + slen, v, n);
			slen += n;
		}
	}
	state[slen] = '\0';
	if (trace_begin(&ctx->trace, parent, nparents, state_ok && slen > 0 ? state : NULL) < 0)
		log_warning("could not start a trace: no random bytes", "request_id=%s",
		            req->request_id);
}

const char *handler_traceparent(const struct handler_ctx *ctx)
{
	return ctx->trace.traceparent[0] != '\0' ? ctx->trace.traceparent : NULL;
}

const char *handler_tracestate(const struct handler_ctx *ctx)
{
	return ctx->trace.traceparent[0] != '\0' && ctx->trace.tracestate[0] != '\0'
	           ? ctx->trace.tracestate
	           : NULL;
}

const char *handler_actor(const struct handler_ctx *ctx)
{
	return ctx->actor[0] != '\0' ? ctx->actor : NULL;
}

void handler_problem(struct http_resp *resp, const struct http_req *req, enum problem_kind kind,
                     const char *detail)
{
	resp->status = problem_def(kind)->status;
	resp->content_type = "application/problem+json";
	buf_reset(&resp->body);
	problem_write(&resp->body, kind, detail, req->path, req->request_id, NULL, NULL);
}

/*
 * The one mapping from a database-layer error to an answer:
 * - the connection was lost while a write could have committed, or its
 *   commit stands only locally (its wait for the synchronous standby was
 *   cancelled): 503 outcome-unknown (only for methods that write: a GET
 *   writes nothing);
 * - the database is unavailable (down, read-only, shutting down, out of a
 *   resource), a serialization failure, a lock timeout, or the tenant is
 *   being moved to another partition (DB_TENANT_MOVING): 503 unavailable,
 *   nothing stored;
 * - a step entered with more input and outputs than an activation
 *   carries (SQLSTATE_ACTIVATION_TOO_LARGE): 413 activation-too-large, nothing
 *   stored;
 * - anything else is a bug: 500, nothing stored (the transaction rolled
 *   back).
 * Every 503 carries Retry-After.
 */
void handler_db_error(struct handler_ctx *ctx, struct http_resp *resp, const struct http_req *req,
                      const struct err *e)
{
	const int writes = strcmp(req->method, "GET") != 0 && strcmp(req->method, "HEAD") != 0;
	char ra[24];

	ctx->err = *e;
	if (strcmp(e->sqlstate, SQLSTATE_ACTIVATION_TOO_LARGE) == 0) {
		/* The message is the database's, after its "ERROR:  " and,
		 * through a proxy, PL/Proxy's "...: [cluster] REMOTE ERROR: ". */
		const char *m = strstr(e->msg, "] REMOTE ERROR: ");
		if (m != NULL)
			m += strlen("] REMOTE ERROR: ");
		else if ((m = strstr(e->msg, ":  ")) != NULL)
			m += 3;
		handler_problem(resp, req, P_ACTIVATION_TOO_LARGE, m != NULL ? m : e->msg);
		return;
	}
	if (e->code != ERR_DB_DOWN && e->code != ERR_SERIALIZE && e->code != ERR_LOCK_TIMEOUT) {
		handler_problem(resp, req, P_INTERNAL, "the request failed; nothing was stored");
		return;
	}
	snprintf(ra, sizeof(ra), "%ld", ctx->conf->retry_after);
	buf_reset(&resp->headers);
	http_resp_header(resp, "Retry-After", ra);
	if (e->code == ERR_DB_DOWN && e->outcome_unknown && writes) {
		handler_problem(
		    resp, req, P_OUTCOME_UNKNOWN,
		    req->idem_key != NULL
		        ? "the database did not confirm the request's commit (the connection "
		          "was lost, or the commit's wait for the standby was cancelled): it "
		          "may or may not have taken effect. Send the same request with the "
		          "same Idempotency-Key: it is safe, and answered as the first one "
		          "was or run now"
		        : "the database did not confirm the request's commit (the connection "
		          "was lost, or the commit's wait for the standby was cancelled): it "
		          "may or may not have taken effect, and without an Idempotency-Key "
		          "a retry may apply it twice");
		return;
	}
	if (strcmp(e->sqlstate, DB_TENANT_MOVING) == 0) {
		handler_problem(resp, req, P_UNAVAILABLE,
		                "the tenant is being moved to another partition; nothing was "
		                "stored, retry the same request after Retry-After");
		return;
	}
	if (strcmp(e->sqlstate, "25006") == 0) {
		handler_problem(
		    resp, req, P_UNAVAILABLE,
		    "the database is read-only (a standby, or set read-only); nothing was "
		    "stored, retry the same request later");
		return;
	}
	if (e->code == ERR_LOCK_TIMEOUT) {
		/* Not a key's owner (that is 409 key-in-flight, cmd.c): e.g. an
		 * endpoint change waiting for the tenant's open events
		 * (sql/025_subscriptions_at_commit.sql). */
		handler_problem(resp, req, P_UNAVAILABLE,
		                "the request waited longer than lock_timeout for another "
		                "transaction; nothing was stored, retry the same request later");
		return;
	}
	handler_problem(resp, req, P_UNAVAILABLE,
	                "the database is unavailable; nothing was stored, retry the same request "
	                "later");
}
