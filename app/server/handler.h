/*
 * handler.h - what every handler of the v1 API shares: the per-worker
 * request context and the two ways to answer with a problem.
 *
 * Handlers (wf.c, messages.c, jobs.c, ops.c, ...) include this header and never the
 * router (api.h) nor one another; the router includes them.
 */
#ifndef IDF_HANDLER_H
#define IDF_HANDLER_H

#include <libpq-fe.h>

#include "core/buf.h"
#include "core/conf.h"
#include "core/db.h"
#include "core/err.h"
#include "core/fp.h"
#include "core/idem.h"
#include "core/problem.h"
#include "core/trace.h"
#include "server/http.h"
#include "server/route.h"

/* One per worker process; buffers are reused across requests. */
struct handler_ctx {
	const struct conf *conf; /* borrowed */
	struct db *db;           /* borrowed */
	struct rcache *rcache;   /* the worker's replay cache, or NULL; borrowed */
	struct buf body;         /* the request body */
	struct buf scratch;      /* canonical forms, payloads */
	/* Per request, for the access log: */
	enum route route; /* matched once, by the worker, before anything
	                   * else; the counters and the log line read it */
	/* Who asks: written by auth.c alone (auth.h). */
	long tenant_id; /* 0 until authenticated */
	long token_id;  /* the bearer token's api_tokens.id, 0 until authenticated */
	char actor[32]; /* "token:<token_id>", "" until authenticated: what the
	                 * rows the request writes record (sql/014_actor.sql) */
	/* The bearer token's check (auth.h): */
	uint8_t token_fp[FP_LEN];           /* the token's digest */
	char token_hex[2 + 2 * FP_LEN + 1]; /* the same as a bytea parameter */
	int auth_pending;                   /* begun, not yet settled */
	int auth_keyed;                     /* with the key's row (Q_AUTH_KEY) */
	long long auth_asked_at;            /* rcache_now_ms() at the check's start */
	PGresult *key_row;                  /* a keyed POST's stored key row, found while
	                                     * authenticating (Q_AUTH_KEY), or NULL; owned */
	char bytes_fp[IDEM_FP_TEXT];        /* a keyed command's request as received
	                                     * (cmd_read_json), stored with its key */
	enum idem_outcome idem;
	int cached;         /* the key row came from the replay cache */
	int created;        /* this request wrote an outbox event */
	int refused;        /* the command's own refusal (enum problem_kind, one
	                     * cmd_stores() keeps), or -1: for the metrics */
	struct trace trace; /* the request's span (handler_trace_begin); what
	                     * it creates keeps trace.traceparent */
	struct err err;     /* why a 5xx happened */
};

/*
 * Begin the request's span in ctx->trace from its traceparent and
 * tracestate headers (HTTP_TRACEPARENT, HTTP_TRACESTATE): the caller's
 * trace continued, or a new one when the header is absent, malformed or
 * sent twice. Never refuses a request; several tracestate headers are
 * joined with ",".
 */
void handler_trace_begin(struct handler_ctx *ctx, const struct http_req *req);

/* ctx->trace's traceparent and tracestate as statement parameters: NULL
 * (SQL NULL) for what the request has not. */
const char *handler_traceparent(const struct handler_ctx *ctx);
const char *handler_tracestate(const struct handler_ctx *ctx);

/* ctx->actor as a statement parameter: NULL (SQL NULL) until authenticated. */
const char *handler_actor(const struct handler_ctx *ctx);

/* Fill resp with a problem of the given kind (status, content type, body). */
void handler_problem(struct http_resp *resp, const struct http_req *req, enum problem_kind kind,
                     const char *detail);

/* Fill resp with the problem that an error from the database layer calls
 * for (503 with Retry-After for outages, 500 otherwise); remembers e for the
 * log. */
void handler_db_error(struct handler_ctx *ctx, struct http_resp *resp, const struct http_req *req,
                      const struct err *e);

#endif
