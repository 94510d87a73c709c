/*
 * wf.h - workflow handlers: create, read, list, history, transitions and
 * resumes (the message routes are messages.h's). Called by api.c after
 * routing and authentication.
 */
#ifndef IDF_WF_H
#define IDF_WF_H

#include "server/handler.h"

/* POST /v1/workflows: validate, then create once per Idempotency-Key (and
 * once per active business key). */
void wf_create(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp);

/* GET /v1/workflows/{id}; id is the last path segment (borrowed). */
void wf_get(struct handler_ctx *ctx, struct http_req *req, const char *id, struct http_resp *resp);

/* GET /v1/workflows?state=&type=&limit=&after=: keyset pages in id order. */
void wf_list(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp);

/* GET /v1/workflows/{id}/events?after=&limit=: the history, in order. */
void wf_events(struct handler_ctx *ctx, struct http_req *req, const char *id,
               struct http_resp *resp);

/* POST /v1/workflows/{id}/transitions: compare-and-set on the state. */
void wf_transition(struct handler_ctx *ctx, struct http_req *req, const char *id,
                   struct http_resp *resp);

/* POST /v1/workflows/{id}/resume: a workflow in incident, or a failed one
 * whose failed step is resumable, runs again from that step. */
void wf_resume(struct handler_ctx *ctx, struct http_req *req, const char *id,
               struct http_resp *resp);

/* A workflow as the API shows it; every string borrowed. input and steps
 * are canonical JSON; steps is NULL for a workflow without steps. */
struct wf_view {
	const char *id;
	const char *type;
	const char *state;
	const char *input;
	size_t input_len;
	const char *created_at;
	const char *business_key; /* or NULL */
	const char *steps;        /* or NULL */
	size_t steps_len;
	const char *progress; /* canonical JSON, or NULL (GET only) */
	size_t progress_len;
	int step;     /* the current step, with steps */
	int existing; /* answered for a business key that was taken */
};

/* Append w's JSON representation to out. */
void wf_write(struct buf *out, const struct wf_view *w);

/*
 * Append the representation of the workflow in row `row` of res, whose
 * columns from `col` on are (id, type, state, input, created_at,
 * business_key, steps, step), as in Q_WF_GET. tmp is scratch space.
 * Returns 0, or -1 with e filled when the stored JSON is unreadable.
 */
int wf_write_row(struct buf *out, struct buf *tmp, const PGresult *res, int row, int col,
                 int existing, struct err *e) MUSTCHECK;

/*
 * Append the event in row i of res, whose columns are (id, payload, ...,
 * actor at 3), as the history and the event feed show it: the stored
 * payload in the canonical form, with "actor". A page's item writer
 * (page.h); ctx is unused. Returns 0, or -1 with e filled.
 */
int wf_event_item(struct handler_ctx *ctx, struct buf *out, const PGresult *res, int i,
                  struct err *e) MUSTCHECK;

#endif
