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

/* Answer req into resp. Never fails: errors become problem responses. */
void api_handle(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp);

#endif
