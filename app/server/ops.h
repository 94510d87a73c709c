/*
 * ops.h - the operator's endpoints: liveness (/healthz), readiness
 * (/readyz), the metrics exposition (/metrics) and the pool's status page
 * (/status).
 *
 * Handlers like the others (handler.h); the counters themselves live in
 * metrics.h, which knows nothing about HTTP.
 */
#ifndef IDF_OPS_H
#define IDF_OPS_H

#include "server/handler.h"

/* GET /healthz: 204, no database, no authentication. */
void ops_healthz(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp);

/* GET /readyz: 200 when the database answers, takes writes and has the
 * schema this build needs; 503 with Retry-After otherwise. */
void ops_readyz(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp);

/* GET /v1/openapi.json: the API's contract (openapi.h) as JSON, 200, to
 * anyone, with no database statement. */
void ops_openapi(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp);

/* /metrics, any method: 403 problem unless the client's address is in
 * metrics_allow or it sent the metrics token; then 405 for methods other
 * than GET; else the exposition of the pool's counters. */
void ops_metrics(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp);

/* /status, any method: refused as /metrics is (403, then 405); then the
 * pool's status page (scoreboard.h) as plain text, or JSON with ?json or
 * Accept: application/json; ?full adds one entry per worker. */
void ops_status(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp);

/* Is authorization ("Bearer <token>") the metrics token? Never true when
 * token is "". Compares BLAKE2b digests in constant time. */
int ops_metrics_token_match(const char *token, const char *authorization);

#endif
