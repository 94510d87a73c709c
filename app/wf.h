/*
 * wf.h - workflow handlers: POST /v1/workflows, GET /v1/workflows/{id}.
 * Called by api.c after routing and authentication.
 */
#ifndef IDF_WF_H
#define IDF_WF_H

#include "api.h"

/* POST /v1/workflows: validate, then create once per Idempotency-Key. */
void wf_create(struct api_ctx *ctx, struct http_req *req, struct http_resp *resp);

/* GET /v1/workflows/{id}; id is the last path segment (borrowed). */
void wf_get(struct api_ctx *ctx, struct http_req *req, const char *id, struct http_resp *resp);

#endif
