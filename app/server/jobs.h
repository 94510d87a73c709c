/*
 * jobs.h - job handlers: activation under a lease; heartbeats, completion
 * and failure as compare-and-sets on (worker, lease). Called by api.c
 * after routing and authentication; the state changes are database
 * functions (sql/005_runs.sql, sql/009_incidents.sql) run through cmd.c.
 */
#ifndef IDF_JOBS_H
#define IDF_JOBS_H

#include "server/handler.h"

/* POST /v1/jobs/activate */
void jobs_activate(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp);

/* POST /v1/jobs/{key}/complete and /fail; key is the path segment
 * (borrowed), verb "complete" or "fail". */
void jobs_finish(struct handler_ctx *ctx, struct http_req *req, const char *key, const char *verb,
                 struct http_resp *resp);

/* POST /v1/jobs/{key}/heartbeat: the lease of the worker's activation
 * runs lease_seconds from now, with the compare-and-set of complete and
 * fail; an optional progress object is kept on the job. key is the path
 * segment (borrowed). */
void jobs_heartbeat(struct handler_ctx *ctx, struct http_req *req, const char *key,
                    struct http_resp *resp);

/* Split a job key "<workflow id>.s<step>" into its parts. Returns 0, or -1
 * when key is not one. wf has IDS_UUID_LEN + 1 bytes. */
int jobs_parse_key(const char *key, size_t len, char *wf, int *step);

#endif
