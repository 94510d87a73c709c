/*
 * api.h - the v1 HTTP API: routing, authentication, and the per-worker
 * context that handlers share.
 *
 * api_handle() turns one request into one response; it never writes to the
 * client itself. Handlers live in their own files (wf.c) and never include
 * one another.
 */
#ifndef IDF_API_H
#define IDF_API_H

#include "buf.h"
#include "conf.h"
#include "db.h"
#include "err.h"
#include "http.h"
#include "idem.h"
#include "problem.h"

/* One per worker process; buffers are reused across requests. */
struct api_ctx {
	const struct conf *conf; /* borrowed */
	struct db *db;           /* borrowed */
	struct rcache *rcache;   /* the worker's replay cache, or NULL; borrowed */
	struct buf body;         /* the request body */
	struct buf scratch;      /* canonical forms, payloads */
	/* Per request, for the access log: */
	long tenant_id;          /* 0 until authenticated */
	PGresult *key_row;       /* a keyed POST's stored key row, found while
				  * authenticating (Q_AUTH_KEY), or NULL; owned */
	char bytes_fp[IDEM_FP_TEXT]; /* a keyed command's request as received
				      * (cmd_read_json), stored with its key */
	enum idem_outcome idem;
	int cached;              /* the key row came from the replay cache */
	int created;             /* this request wrote an outbox event */
	struct err err;          /* why a 5xx happened */
};

/* Answer req into resp. Never fails: errors become problem responses. */
void api_handle(struct api_ctx *ctx, struct http_req *req, struct http_resp *resp);

/* Fill resp with a problem of the given kind (status, content type, body). */
void api_problem(struct http_resp *resp, const struct http_req *req, enum problem_kind kind,
		 const char *detail);

/* Fill resp with the problem that an error from the database layer calls
 * for (503 with Retry-After for outages, 500 otherwise); remembers e for the
 * log. */
void api_db_error(struct api_ctx *ctx, struct http_resp *resp, const struct http_req *req,
		  const struct err *e);

#endif
