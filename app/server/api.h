/*
 * api.h - the v1 HTTP API's router: the route table, authentication and
 * the order of checks.
 *
 * api_handle() turns one request into one response; it never writes to the
 * client itself. Handlers live in their own files (wf.c, jobs.c, ops.c)
 * and share handler.h; none of them includes this header.
 */
#ifndef IDF_API_H
#define IDF_API_H

#include "server/handler.h"
#include "server/route.h"

/* Answer req, whose path matched hit (route_match(), done once by the
 * caller), into resp. Never fails: errors become problem responses. */
void api_handle(struct handler_ctx *ctx, struct http_req *req, const struct route_hit *hit,
                struct http_resp *resp);

#endif
