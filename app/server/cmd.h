/*
 * cmd.h - running a state-changing request at most once per
 * Idempotency-Key (the keyed-command runner), and the request checks
 * every command shares.
 *
 * The runner owns the one loop every keyed request goes through: a live
 * key row found before the runner is replayed byte for byte, or refused as a
 * conflict when it was made by another request (409); otherwise the key
 * is claimed and the work done in one transaction. When the claim finds
 * the key taken, the stored answer is replayed (or refused); an expired
 * key is deleted and claimed again; a claim that waited idempotency_wait
 * on a concurrent owner is answered 409 in flight; after three rounds the
 * row "kept changing" (500). What differs between requests is how the
 * claim and the work share their transaction (enum cmd_tx):
 *
 *   CMD_TX_PIPELINE  BEGIN; claim the key; the command   -- one round trip
 *                    store the rendered answer on the key; COMMIT
 *   CMD_TX_SINGLE    one statement claims, works and stores (a plain
 *                    create, Q_CREATE_KEYED)                 -- one round trip
 *
 * so the key, the work's effects and its stored answer commit together or
 * not at all. A command is one statement (a database function,
 * sql/005_runs.sql) that answers with rows whose first two columns are
 * (problem slug or NULL, detail). Without a key the work runs alone, in
 * its own transaction.
 *
 * Return codes: a function here that can answer the request itself
 * returns 0 to go on, or -1 when resp holds the answer (as auth.h's do);
 * one that fails otherwise returns 0, or -1 with an err filled.
 */
#ifndef IDF_CMD_H
#define IDF_CMD_H

#include <json-c/json.h>

#include "server/handler.h"

struct cmd;

/*
 * Render a successful result into resp (status, headers, body). Returns
 * 0, or -1 with e filled for a 500 (nothing is stored or committed then).
 * res: the command's rows (CMD_TX_PIPELINE), the 'created' key row or the
 * unkeyed statement's result (CMD_TX_SINGLE).
 */
typedef int (*cmd_render_fn)(struct handler_ctx *ctx, const struct http_req *req,
                             struct http_resp *resp, const PGresult *res, const struct cmd *c,
                             struct err *e);

/*
 * Make what the statement needs once the request is known not to be a
 * replay (ids, the rendered answer): fills the parameter arrays c points
 * at, through c->arg. Returns 0, or -1 when resp holds the answer.
 */
typedef int (*cmd_prepare_fn)(struct handler_ctx *ctx, const struct http_req *req,
                              struct http_resp *resp, const struct cmd *c);

/*
 * CMD_TX_SINGLE: what the handler reads first in the statement's row,
 * before the runner reads its outcome: the statement may have checked
 * what the handler could not check before it (a create's token:
 * auth_checked()). Returns 0 to go on, or -1 when resp holds the answer
 * (the statement then wrote nothing).
 */
typedef int (*cmd_checked_fn)(struct handler_ctx *ctx, const struct http_req *req,
                              struct http_resp *resp, const PGresult *row);

/* How a keyed request's claim and work share one transaction. */
enum cmd_tx {
	CMD_TX_PIPELINE, /* BEGIN; Q_KEY_CLAIM; stmt, then Q_KEY_STORE; COMMIT */
	CMD_TX_SINGLE,   /* stmt claims, works and stores, the trace context
	                  * among its parameters: a row as Q_CREATE_KEYED's */
};

struct cmd {
	enum cmd_tx tx;
	int stmt; /* enum query_id: the command, or the keyed statement */
	int nparams;
	const char *const *params; /* borrowed */
	/* CMD_TX_SINGLE: the statement without a key (CMD_TX_PIPELINE runs
	 * stmt alone). */
	int unkeyed_stmt;
	int unkeyed_nparams;
	const char *const *unkeyed_params; /* borrowed */
	const char *fp_text;               /* the request's fingerprint (idem_fp_text) */
	cmd_prepare_fn prepare;            /* or NULL */
	cmd_checked_fn checked;            /* CMD_TX_SINGLE's, or NULL */
	cmd_render_fn render;
	void *arg; /* for prepare and render */
};

/*
 * The one rule for what a key keeps. A command's own outcome is stored and
 * replayed for the key's lifetime: its success (CMD_SUCCESS) and the
 * refusals it decides from the state it finds (lease-expired,
 * not-lease-holder, job-not-active, state-conflict, invalid-transition,
 * message-id-reused). Every other answer leaves the key free: validation
 * errors (answered before the key is claimed), a missing workflow or job,
 * a 5xx. Returns 1 to store, 0 not to; kind is an enum problem_kind.
 */
#define CMD_SUCCESS (-1)
int cmd_stores(int kind);

/*
 * The keyed-command runner: run c for req, at most once per
 * Idempotency-Key, and answer it in resp. Sets ctx->idem and ctx->created
 * for the log and the metrics. Never fails: errors become problem answers.
 * The caller has authenticated the request, or left to the keyed single
 * statement what it could not check (c->checked): ctx->tenant_id is then 0
 * until that statement's row is read.
 */
void cmd_run(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp,
             const struct cmd *c);

/*
 * The checks before a command's own validation: Content-Type, at most one
 * valid Idempotency-Key (required when key_required), the body within
 * max_body, valid JSON that is an object. Returns the parsed body (caller
 * json_object_put()s it), or NULL when resp holds the answer: a 4xx, or the
 * stored response when the request's key row was made from exactly these
 * bytes (ctx->bytes_fp, kept with every key: a retry resends the same
 * bytes, and is then replayed without parsing them).
 */
struct json_object *cmd_read_json(struct handler_ctx *ctx, struct http_req *req,
                                  struct http_resp *resp, int key_required);

/*
 * cmd_read_json() for a command whose body may be left out (DELETE, a
 * rotate or revoke): no body, with no Content-Type or a JSON one, reads
 * as {} (fingerprinted as {}, as the canonical form has it). A body that
 * is sent is checked as cmd_read_json() checks it.
 */
struct json_object *cmd_read_json_opt(struct handler_ctx *ctx, struct http_req *req,
                                      struct http_resp *resp, int key_required);

/*
 * Write the canonical form of root into ctx->scratch (from its start) and
 * the request's fingerprint over method, path and that form into fp_text.
 * Returns 0, or -1 when resp holds the 4xx answer.
 */
int cmd_fingerprint(struct handler_ctx *ctx, const struct http_req *req, struct http_resp *resp,
                    struct json_object *root, char fp_text[IDEM_FP_TEXT]);

/*
 * Append the canonical form of v ("{}" when v is NULL) to ctx->scratch as a
 * text parameter of its own (NUL before and after); *off is where it starts.
 * Returns 0, or -1 when resp holds the 4xx answer.
 */
int cmd_json_param(struct handler_ctx *ctx, const struct http_req *req, struct http_resp *resp,
                   struct json_object *v, size_t *off);

/*
 * Member checks for command bodies; each returns 0, or -1 with a detail a
 * client can act on. Text must be 1..max bytes without control characters.
 */
/* Every member of root is one of names (a NULL-terminated list). */
int cmd_members(struct json_object *root, const char *const *names, char *detail, size_t dlen);
/* *out: the string member name (borrowed from root), or NULL when absent
 * and not required. */
int cmd_text(struct json_object *root, const char *name, int required, size_t max, const char **out,
             char *detail, size_t dlen);
/* *out: the integer member name within [min, max], or def when absent. */
int cmd_int(struct json_object *root, const char *name, long min, long max, long def, long *out,
            char *detail, size_t dlen);
/* *out: the object member name (borrowed), or NULL when absent. */
int cmd_object(struct json_object *root, const char *name, struct json_object **out, char *detail,
               size_t dlen);

#endif
