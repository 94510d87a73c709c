/*
 * messages.h - the message routes: a message to one workflow, and a
 * message published by business key. Called by api.c after routing and
 * authentication.
 */
#ifndef IDF_MESSAGES_H
#define IDF_MESSAGES_H

#include "server/handler.h"

/* POST /v1/workflows/{id}/messages: deduplicated by message_id; id is
 * the workflow's path segment (borrowed). */
void wf_message(struct handler_ctx *ctx, struct http_req *req, const char *id,
                struct http_resp *resp);

/* POST /v1/messages: a message for the workflow with its business key
 * that waits for its name, else kept until its ttl (sql/010_timers.sql);
 * deduplicated by message_id within the tenant. */
void wf_publish(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp);

#endif
