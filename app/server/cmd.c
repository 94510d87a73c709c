/* cmd.c - the keyed-command runner and the checks commands share (see cmd.h). */
#include "server/cmd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/canon.h"
#include "core/fp.h"
#include "server/queries.h"
#include "server/rowtext.h"
#include "server/scoreboard.h"

/* A 409 about the request's key: P_KEY_REUSED or P_KEY_IN_FLIGHT. */
static void key_problem(struct handler_ctx *ctx, struct http_resp *resp, const struct http_req *req,
                        enum problem_kind kind)
{
	char detail[400];

	if (kind == P_KEY_IN_FLIGHT) {
		char ra[24];
		ctx->idem = IDEM_IN_FLIGHT;
		snprintf(detail, sizeof(detail),
		         "a request with Idempotency-Key \"%s\" is still being processed; retry "
		         "later",
		         req->idem_key);
		snprintf(ra, sizeof(ra), "%ld", ctx->conf->retry_after);
		http_resp_header(resp, "Retry-After", ra);
	} else {
		ctx->idem = IDEM_CONFLICT;
		snprintf(detail, sizeof(detail),
		         "Idempotency-Key \"%s\" was already used for a different request; use a "
		         "new key for a new request",
		         req->idem_key);
	}
	resp->status = problem_def(kind)->status;
	resp->content_type = "application/problem+json";
	buf_reset(&resp->body);
	problem_write(&resp->body, kind, detail, req->path, req->request_id, "idempotency_key",
	              req->idem_key);
}

static int key_expired(const PGresult *row)
{
	return strcmp(PQgetvalue(row, 0, KEY_COL_EXPIRED), "t") == 0;
}

/* Through a proxy, a key whose command is done and whose answer is not
 * stored yet: its body holds the command's rows (status 1,
 * sql/027_partition_keyed_commands.sql). */
static int key_has_rows(const PGresult *row)
{
	return strcmp(PQgetvalue(row, 0, KEY_COL_STATUS), "1") == 0;
}

/* The server sends its statements to a PL/Proxy proxy (doc/distribution.md). */
static int proxied(const struct handler_ctx *ctx)
{
	return strcmp(ctx->conf->routing, "proxy") == 0;
}

/* Replay the stored answer of a key row (enum key_col) when its
 * fingerprint is fp_text, else answer 409 idempotency-key-reused. */
static void answer_existing(struct handler_ctx *ctx, struct http_resp *resp,
                            const struct http_req *req, const PGresult *row, const char *fp_text)
{
	if (idem_compare(PQgetvalue(row, 0, KEY_COL_FP), fp_text) == IDEM_CONFLICT) {
		key_problem(ctx, resp, req, P_KEY_REUSED);
		return;
	}
	ctx->idem = IDEM_REPLAYED;
	resp->status = atoi(PQgetvalue(row, 0, KEY_COL_STATUS));
	/* Every answer of the API with a status of 400 or more is a
	 * problem: the type need not be stored. */
	resp->content_type = resp->status >= 400 ? "application/problem+json" : "application/json";
	buf_puts(&resp->headers, PQgetvalue(row, 0, KEY_COL_HEADERS));
	http_resp_header(resp, "Idempotent-Replayed", "true");
	buf_append(&resp->body, PQgetvalue(row, 0, KEY_COL_BODY),
	           (size_t)PQgetlength(row, 0, KEY_COL_BODY));
}

/* The checks and the body read into ctx->body: 0, or -1 when resp holds
 * the answer. A keyed request's bytes fingerprint goes to ctx->bytes_fp. */
static int read_body(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp,
                     int key_required, int may_be_empty)
{
	const struct conf *c = ctx->conf;
	char detail[128];

	if (!http_is_json(req->content_type) &&
	    !(may_be_empty && req->content_type == NULL && req->content_length <= 0)) {
		handler_problem(resp, req, P_UNSUPPORTED_MEDIA_TYPE,
		                "send the body as Content-Type: application/json");
		return -1;
	}
	if (req->idem_key_count > 1) {
		handler_problem(resp, req, P_INVALID_KEY,
		                "send exactly one Idempotency-Key header");
		return -1;
	}
	if (req->idem_key == NULL && key_required) {
		handler_problem(resp, req, P_MISSING_KEY,
		                "this request needs an Idempotency-Key header: a unique value per "
		                "logical request, such as a UUID, reused on every retry");
		return -1;
	}
	if (req->idem_key != NULL && !idem_key_valid(req->idem_key)) {
		handler_problem(
		    resp, req, P_INVALID_KEY,
		    "an Idempotency-Key is an RFC 8941 string, \"key\" (\\\" and \\\\ the only "
		    "escapes, nothing after the closing quote), or the bare key; the key is 1 "
		    "to 255 printable ASCII characters, without spaces");
		return -1;
	}
	buf_reset(&ctx->body);
	scoreboard_stage(SB_READING);
	enum http_body_result got = http_read_body(req, c->max_body, &ctx->body);
	scoreboard_stage(SB_IN_DB);
	switch (got) {
	case HTTP_BODY_OK: break;
	case HTTP_BODY_TOO_LARGE:
		snprintf(detail, sizeof(detail), "the body may be at most %ld bytes", c->max_body);
		handler_problem(resp, req, P_BODY_TOO_LARGE, detail);
		return -1;
	case HTTP_BODY_SHORT:
		handler_problem(resp, req, P_BAD_BODY, "the body ended before its Content-Length");
		return -1;
	}
	ctx->bytes_fp[0] = '\0';
	if (req->idem_key != NULL) {
		uint8_t fp[FP_LEN];
		fp_request_bytes(fp, req->method, req->path, ctx->body.data ? ctx->body.data : "",
		                 ctx->body.len);
		idem_fp_text(ctx->bytes_fp, fp);
	}
	return 0;
}

/* The request is the one that made key row k when k was stored from
 * exactly these bytes (a row from before the column has no bytes). */
static int same_bytes(const struct handler_ctx *ctx, const PGresult *k)
{
	return ctx->bytes_fp[0] != '\0' && PQnfields(k) > KEY_COL_BYTES_FP &&
	       !PQgetisnull(k, 0, KEY_COL_BYTES_FP) &&
	       strcmp(PQgetvalue(k, 0, KEY_COL_BYTES_FP), ctx->bytes_fp) == 0;
}

/*
 * The key row found before the handler (ctx->key_row) is live and was stored
 * from exactly these bytes: answer the stored response without parsing the
 * body, and return 1. 0 otherwise (no row, expired, other bytes, a row
 * from before the column): the canonical comparison follows.
 */
static int replay_same_bytes(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp)
{
	const PGresult *k = ctx->key_row;

	if (k == NULL || key_expired(k) || key_has_rows(k) || !same_bytes(ctx, k))
		return 0;
	answer_existing(ctx, resp, req, k, PQgetvalue(k, 0, KEY_COL_FP));
	return 1;
}

static struct json_object *parse_body(struct handler_ctx *ctx, struct http_req *req,
                                      struct http_resp *resp)
{
	struct json_object *root;
	struct err e;

	root = canon_parse(ctx->body.data ? ctx->body.data : "", ctx->body.len,
	                   (int)ctx->conf->max_depth, &e);
	if (root == NULL) {
		handler_problem(resp, req, P_INVALID_JSON, e.msg);
		return NULL;
	}
	if (!json_object_is_type(root, json_type_object)) {
		json_object_put(root);
		handler_problem(resp, req, P_INVALID_JSON, "the body must be a JSON object");
		return NULL;
	}
	return root;
}

struct json_object *cmd_read_json(struct handler_ctx *ctx, struct http_req *req,
                                  struct http_resp *resp, int key_required)
{
	if (read_body(ctx, req, resp, key_required, 0) < 0)
		return NULL;
	/* A retry resends the same bytes: answered without parsing them. */
	if (replay_same_bytes(ctx, req, resp))
		return NULL;
	return parse_body(ctx, req, resp);
}

struct json_object *cmd_read_json_opt(struct handler_ctx *ctx, struct http_req *req,
                                      struct http_resp *resp, int key_required)
{
	struct json_object *root;

	if (read_body(ctx, req, resp, key_required, 1) < 0)
		return NULL;
	if (replay_same_bytes(ctx, req, resp))
		return NULL;
	if (ctx->body.len == 0) {
		root = json_object_new_object();
		if (root == NULL) {
			struct err e;
			err_set(&e, ERR_INTERNAL, "out of memory");
			handler_db_error(ctx, resp, req, &e);
		}
		return root;
	}
	return parse_body(ctx, req, resp);
}

int cmd_fingerprint(struct handler_ctx *ctx, const struct http_req *req, struct http_resp *resp,
                    struct json_object *root, char fp_text[IDEM_FP_TEXT])
{
	uint8_t fp[FP_LEN];
	struct err e;

	buf_reset(&ctx->scratch);
	if (canon_write(&ctx->scratch, root, &e) < 0) {
		handler_problem(resp, req, P_INVALID_JSON, e.msg);
		return -1;
	}
	if (ctx->scratch.oom) {
		handler_problem(resp, req, P_BODY_TOO_LARGE, "the body is too large to process");
		return -1;
	}
	fp_request(fp, req->method, req->path, ctx->scratch.data, ctx->scratch.len);
	idem_fp_text(fp_text, fp);
	return 0;
}

int cmd_json_param(struct handler_ctx *ctx, const struct http_req *req, struct http_resp *resp,
                   struct json_object *v, size_t *off)
{
	struct buf *sc = &ctx->scratch;
	struct err e;

	buf_putc(sc, '\0');
	*off = sc->len;
	if (v == NULL)
		buf_puts(sc, "{}");
	else if (canon_write(sc, v, &e) < 0) {
		handler_problem(resp, req, P_INVALID_JSON, e.msg);
		return -1;
	}
	buf_putc(sc, '\0');
	if (sc->oom) {
		handler_problem(resp, req, P_BODY_TOO_LARGE, "the body is too large to process");
		return -1;
	}
	return 0;
}

int cmd_stores(int kind)
{
	switch (kind) {
	case CMD_SUCCESS:
	case P_LEASE_EXPIRED:
	case P_NOT_LEASE_HOLDER:
	case P_JOB_NOT_ACTIVE:
	case P_STATE_CONFLICT:
	case P_INVALID_TRANSITION:
	case P_MESSAGE_REUSED: return 1;
	default: return 0;
	}
}

/* A command's answer from its rows: a problem row or the render.
 * Returns 1 when the answer is to be stored under the key (cmd_stores),
 * 0 when not, -1 with e filled on failure. */
static int answer_command(struct handler_ctx *ctx, const struct http_req *req,
                          struct http_resp *resp, const PGresult *res, const struct cmd *c,
                          struct err *e)
{
	if (PQntuples(res) > 0 && !PQgetisnull(res, 0, 0)) {
		enum problem_kind kind = problem_by_slug(PQgetvalue(res, 0, 0));
		handler_problem(resp, req, kind, PQgetvalue(res, 0, 1));
		if (cmd_stores((int)kind))
			ctx->refused = (int)kind;
		return cmd_stores((int)kind);
	}
	if (c->render(ctx, req, resp, res, c, e) < 0)
		return -1;
	if (resp->body.oom || resp->headers.oom)
		return err_set(e, ERR_INTERNAL, "out of memory");
	ctx->created = 1; /* may have written events: wake the dispatchers */
	return cmd_stores(CMD_SUCCESS);
}

static void clear_results(PGresult **r, int n)
{
	for (int i = 0; i < n; i++) {
		PQclear(r[i]);
		r[i] = NULL;
	}
}

/* A 5xx: whatever a render put in the headers goes. */
static void fail(struct handler_ctx *ctx, struct http_resp *resp, const struct http_req *req,
                 const struct err *e)
{
	buf_reset(&resp->headers);
	handler_db_error(ctx, resp, req, e);
}

/* Q_TRACE_SET's parameters, in p: the jobs, events, messages and
 * workflows a command inserts take the request's trace context and actor
 * as their default. */
static const char *const *trace_params(const struct handler_ctx *ctx, const char *p[TRACE_SET__N])
{
	p[TRACE_SET_TRACEPARENT] = handler_traceparent(ctx);
	p[TRACE_SET_TRACESTATE] = handler_tracestate(ctx);
	p[TRACE_SET_ACTOR] = handler_actor(ctx);
	return p;
}

/* The parameters of Q_KEY_STORE and Q_KEY_STORE_ANSWER: the answer in
 * resp, for req's key of tenant. */
struct key_answer {
	char status[12];
	const char *p[KEY_STORE__N];
};

static const char *const *key_answer(struct key_answer *a, const struct http_req *req,
                                     const struct http_resp *resp, const char *tenant)
{
	snprintf(a->status, sizeof(a->status), "%d", resp->status);
	a->p[KEY_STORE_TENANT] = tenant;
	a->p[KEY_STORE_KEY] = req->idem_key;
	a->p[KEY_STORE_STATUS] = a->status;
	a->p[KEY_STORE_HEADERS] = resp->headers.data ? resp->headers.data : "";
	a->p[KEY_STORE_BODY] = resp->body.data ? resp->body.data : "";
	return a->p;
}

/*
 * routing = proxy (doc/distribution.md, "Keyed commands through the
 * proxy"). A proxy runs each call in a transaction of its own on the
 * tenant's partition, so a command cannot span BEGIN ... COMMIT there:
 * Q_KEYED_COMMAND claims the key, runs the command and keeps its rows on
 * the key (status 1) in one call, and Q_KEY_STORE_ANSWER stores the
 * answer rendered from them. Whichever request stores first gives the key
 * its answer; an answer is sent only once it is stored, so every answer a
 * client sees for a key is the stored one.
 */

/* The text[] literal of n values, NULL for a null one, into b. */
static void array_literal(struct buf *b, int n, const char *const *v)
{
	buf_putc(b, '{');
	for (int i = 0; i < n; i++) {
		if (i > 0)
			buf_putc(b, ',');
		if (v[i] == NULL) {
			buf_puts(b, "NULL");
			continue;
		}
		buf_putc(b, '"');
		for (const char *c = v[i]; *c != '\0'; c++) {
			if (*c == '"' || *c == '\\')
				buf_putc(b, '\\');
			buf_putc(b, *c);
		}
		buf_putc(b, '"');
	}
	buf_puts(b, "}");
}

/* The problems a key keeps (cmd_stores), as a text[] literal. */
static const char *stored_problems(void)
{
	static struct buf lit = BUF_INIT;

	if (lit.len == 0) {
		const char *slugs[P__COUNT];
		int n = 0;

		for (int k = 0; k < P__COUNT; k++)
			if (cmd_stores(k))
				slugs[n++] = problem_def((enum problem_kind)k)->slug;
		array_literal(&lit, n, slugs);
	}
	return lit.data;
}

/*
 * Q_KEYED_COMMAND: c's command under key (claimed with ttl), or without a
 * key when key is NULL. Returns its one row, or NULL with e filled.
 */
static PGresult *keyed_command(struct handler_ctx *ctx, const struct http_req *req,
                               const struct cmd *c, const char *key, const char *ttl, struct err *e)
{
	char tenant[24];
	const char *p[KEYED_COMMAND__N];
	struct buf args = BUF_INIT;
	PGresult *res;

	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	array_literal(&args, c->nparams, c->params);
	if (args.oom) {
		buf_free(&args);
		err_set(e, ERR_INTERNAL, "out of memory");
		return NULL;
	}
	p[KEYED_COMMAND_TENANT] = tenant;
	p[KEYED_COMMAND_KEY] = key;
	p[KEYED_COMMAND_METHOD] = req->method;
	p[KEYED_COMMAND_PATH] = req->path;
	p[KEYED_COMMAND_FP] = c->fp_text;
	p[KEYED_COMMAND_TTL] = ttl;
	p[KEYED_COMMAND_BYTES_FP] = ctx->bytes_fp[0] != '\0' ? ctx->bytes_fp : NULL;
	p[KEYED_COMMAND_ACTOR] = handler_actor(ctx);
	p[KEYED_COMMAND_TRACEPARENT] = handler_traceparent(ctx);
	p[KEYED_COMMAND_TRACESTATE] = handler_tracestate(ctx);
	/* The statement as one database runs it: the partition prepares it. */
	p[KEYED_COMMAND_SQL] = queries[c->stmt].sql;
	p[KEYED_COMMAND_ARGS] = args.data;
	p[KEYED_COMMAND_STORE] = stored_problems();
	res = db_run(ctx->db, Q_KEYED_COMMAND, KEYED_COMMAND__N, p, e);
	buf_free(&args);
	if (res != NULL && (PQntuples(res) != 1 || PQnfields(res) != KEYED_COMMAND_COL_ROWS + 1)) {
		err_set(e, ERR_INTERNAL, "the keyed command returned %d rows of %d columns",
		        PQntuples(res), PQnfields(res));
		PQclear(res);
		res = NULL;
	}
	return res;
}

/* A command's answer from its rows as record texts (rowtext.h):
 * answer_command()'s return. */
static int answer_rows(struct handler_ctx *ctx, const struct http_req *req, struct http_resp *resp,
                       const struct cmd *c, const char *rows, size_t len, struct err *e)
{
	PGresult *res = rowtext_result(rows, len, e);
	int rc;

	if (res == NULL)
		return -1;
	rc = answer_command(ctx, req, resp, res, c, e);
	PQclear(res);
	return rc;
}

/* Q_KEY_STORE_ANSWER: 1 when the answer in resp is now the key's, 0 when
 * the key had one already, -1 with e filled. */
static int store_answer(struct handler_ctx *ctx, const struct http_req *req,
                        const struct http_resp *resp, struct err *e)
{
	char tenant[24];
	struct key_answer a;
	PGresult *r;
	int stored;

	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	r = db_run(ctx->db, Q_KEY_STORE_ANSWER, KEY_STORE__N, key_answer(&a, req, resp, tenant), e);
	if (r == NULL)
		return -1;
	stored = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "1") == 0;
	PQclear(r);
	return stored;
}

static void resp_clear(struct http_resp *resp)
{
	buf_reset(&resp->headers);
	buf_reset(&resp->body);
}

/*
 * The answer of a key whose command is done, from the command's rows:
 * stored, then sent (replay: a request that found the rows on the key).
 * When another request stored its answer first, that one is sent.
 */
static void answer_and_store(struct handler_ctx *ctx, const struct http_req *req,
                             struct http_resp *resp, const struct cmd *c, const char *rows,
                             size_t len, int replay)
{
	struct err e = { .code = ERR_NONE };
	const char *kg[KEY_GET__N];
	char tenant[24], ra[24];
	PGresult *k;

	if (answer_rows(ctx, req, resp, c, rows, len, &e) <= 0) {
		if (e.code == ERR_NONE)
			err_set(&e, ERR_INTERNAL, "a key's rows are not an answer it keeps");
		goto unstored;
	}
	if (replay) {
		ctx->created = 0;
		ctx->refused = 0;
	}
	switch (store_answer(ctx, req, resp, &e)) {
	case 1:
		ctx->idem = replay ? IDEM_REPLAYED : IDEM_CREATED;
		if (replay)
			http_resp_header(resp, "Idempotent-Replayed", "true");
		return;
	case 0: break;
	default: goto unstored;
	}
	/* Another request stored the key's answer first: that one. */
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	kg[KEY_GET_TENANT] = tenant;
	kg[KEY_GET_KEY] = req->idem_key;
	k = db_run(ctx->db, Q_KEY_GET, KEY_GET__N, kg, &e);
	if (k == NULL)
		goto unstored;
	if (PQntuples(k) != 1 || key_has_rows(k)) {
		err_set(&e, ERR_INTERNAL, "the key's answer was stored and is gone");
		PQclear(k);
		goto unstored;
	}
	resp_clear(resp);
	ctx->created = 0;
	ctx->refused = 0;
	answer_existing(ctx, resp, req, k, PQgetvalue(k, 0, KEY_COL_FP));
	PQclear(k);
	return;
unstored:
	/* The command took effect; its answer is on the key's rows, and the
	 * same request renders it again. */
	ctx->err = e;
	ctx->created = 0;
	resp_clear(resp);
	snprintf(ra, sizeof(ra), "%ld", ctx->conf->retry_after);
	http_resp_header(resp, "Retry-After", ra);
	handler_problem(resp, req, P_UNAVAILABLE,
	                "the request took effect, but its answer could not be stored; send "
	                "the same request with the same Idempotency-Key to receive it");
}

/*
 * Run one statement after Q_TRACE_SET, in one round trip and one
 * transaction (the implicit one of the pipeline, or the caller's): what
 * it inserts keeps the request's trace context. Returns the statement's
 * result, or NULL with e filled, as db_run() does.
 */
static PGresult *run_traced(struct handler_ctx *ctx, int stmt, int nparams,
                            const char *const *params, struct err *e)
{
	const char *tp[TRACE_SET__N];
	const struct db_call calls[2] = { { Q_TRACE_SET, TRACE_SET__N, trace_params(ctx, tp) },
		                          { stmt, nparams, params } };
	PGresult *r[2], *res = NULL;
	int failed;

	if (db_pipeline(ctx->db, 2, calls, r, &failed, e) == 0) {
		res = r[1];
		r[1] = NULL;
	}
	clear_results(r, 2);
	return res;
}

/* The work alone, in its own transaction. */
static void run_unkeyed(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp,
                        const struct cmd *c)
{
	struct err e;
	PGresult *res;

	if (c->tx == CMD_TX_SINGLE) {
		res = run_traced(ctx, c->unkeyed_stmt, c->unkeyed_nparams, c->unkeyed_params, &e);
		if (res != NULL) {
			ctx->created = 1;
			if (c->render(ctx, req, resp, res, c, &e) < 0) {
				ctx->created = 0;
				fail(ctx, resp, req, &e);
			}
		} else {
			fail(ctx, resp, req, &e);
		}
	} else if (proxied(ctx)) {
		res = keyed_command(ctx, req, c, NULL, NULL, &e);
		if (res == NULL ||
		    answer_rows(ctx, req, resp, c, PQgetvalue(res, 0, KEYED_COMMAND_COL_ROWS),
		                (size_t)PQgetlength(res, 0, KEYED_COMMAND_COL_ROWS), &e) < 0)
			fail(ctx, resp, req, &e);
	} else {
		res = run_traced(ctx, c->stmt, c->nparams, c->params, &e);
		if (res == NULL || answer_command(ctx, req, resp, res, c, &e) < 0)
			fail(ctx, resp, req, &e);
	}
	PQclear(res);
}

/* Store the answer in resp on the claimed key and commit. */
static int store_and_commit(struct handler_ctx *ctx, const struct http_req *req,
                            const struct http_resp *resp, const char *tenant, struct err *e)
{
	struct key_answer a;
	const struct db_call calls[2] = { { Q_KEY_STORE, KEY_STORE__N,
		                            key_answer(&a, req, resp, tenant) },
		                          { Q_COMMIT, 0, NULL } };
	PGresult *r[2];
	int failed;

	if (db_pipeline(ctx->db, 2, calls, r, &failed, e) < 0)
		return -1;
	clear_results(r, 2);
	return 0;
}

static void rollback(struct handler_ctx *ctx)
{
	struct err ignored;

	PQclear(db_run(ctx->db, Q_ROLLBACK, 0, NULL, &ignored));
}

/*
 * A key's lifetime counts from its commit, not from the claim's start
 * (the row's now()): a COMMIT may wait for the synchronous standby for as
 * long as the standby is away, and a key committed after its TTL would be
 * visible already expired, so the retry of the request that created it
 * would create a second workflow. After a claim-to-commit that took
 * KEY_REFRESH_AFTER_MS or more, the key's expiry is counted again from
 * now, before the answer is sent. A failure here changes nothing of the
 * answer: the key keeps its first expiry.
 */
#define KEY_REFRESH_AFTER_MS 1000

static long ms_since(const struct timespec *t0)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (now.tv_sec - t0->tv_sec) * 1000 + (now.tv_nsec - t0->tv_nsec) / 1000000;
}

static void refresh_key(struct handler_ctx *ctx, const char *key, const char *ttl,
                        const struct timespec *t0)
{
	char tenant[24];
	const char *p[KEY_REFRESH__N];
	struct err ignored;

	if (ms_since(t0) < KEY_REFRESH_AFTER_MS)
		return;
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	p[KEY_REFRESH_TENANT] = tenant;
	p[KEY_REFRESH_KEY] = key;
	p[KEY_REFRESH_TTL] = ttl;
	PQclear(db_run(ctx->db, Q_KEY_REFRESH, KEY_REFRESH__N, p, &ignored));
}

/* One keyed request: its key as statement parameters. */
struct keyed {
	char tenant[24];
	char ttl[40];
	const char *kc[KEY_CLAIM__N]; /* Q_KEY_CLAIM */
	const char *kg[KEY_GET__N];   /* Q_KEY_GET, Q_KEY_DELETE_EXPIRED */
};

/* What one claim-and-work transaction came to. */
enum attempt {
	ATTEMPT_DONE,   /* resp holds the answer: committed, or rolled back
	                 * when it is not one a key keeps */
	ATTEMPT_TAKEN,  /* another request holds the key; *row is its key row,
	                 * or NULL when it is to be read */
	ATTEMPT_FAILED, /* e says why; *in_flight when the claim waited
	                 * idempotency_wait for a concurrent owner */
};

/* CMD_TX_PIPELINE: BEGIN; Q_KEY_CLAIM; Q_TRACE_SET; the command in one round trip,
 * then Q_KEY_STORE; COMMIT in a second (rolled back instead when the key
 * was taken, or the answer is not one to store). */
static enum attempt attempt_pipeline(struct handler_ctx *ctx, const struct http_req *req,
                                     struct http_resp *resp, const struct cmd *c,
                                     const struct keyed *k, PGresult **row, int *in_flight,
                                     struct err *e)
{
	const char *tp[TRACE_SET__N];
	const struct db_call calls[4] = { { Q_BEGIN, 0, NULL },
		                          { Q_KEY_CLAIM, KEY_CLAIM__N, k->kc },
		                          { Q_TRACE_SET, TRACE_SET__N, trace_params(ctx, tp) },
		                          { c->stmt, c->nparams, c->params } };
	PGresult *r[4];
	struct timespec t0;
	int failed, rc;

	clock_gettime(CLOCK_MONOTONIC, &t0);

	if (db_pipeline(ctx->db, 4, calls, r, &failed, e) < 0) {
		*in_flight = failed == 1 && e->code == ERR_LOCK_TIMEOUT;
		return ATTEMPT_FAILED;
	}
	if (PQntuples(r[1]) != 1) {
		/* Taken: undo this run and answer as the key's owner did. */
		clear_results(r, 4);
		rollback(ctx);
		*row = NULL;
		return ATTEMPT_TAKEN;
	}
	rc = answer_command(ctx, req, resp, r[3], c, e);
	clear_results(r, 4);
	if (rc <= 0) {
		/* A failure, or not the command's outcome (a missing workflow
		 * or job): the command changed nothing, and the rollback frees
		 * the key for the retry. */
		rollback(ctx);
		return rc < 0 ? ATTEMPT_FAILED : ATTEMPT_DONE;
	}
	if (store_and_commit(ctx, req, resp, k->tenant, e) < 0) {
		ctx->created = 0;
		return ATTEMPT_FAILED;
	}
	refresh_key(ctx, req->idem_key, k->ttl, &t0);
	ctx->idem = IDEM_CREATED;
	return ATTEMPT_DONE;
}

/* CMD_TX_SINGLE: the statement claims, works and stores in one round
 * trip, the request's trace context among its parameters; its row goes to
 * c->checked first. It stores only its success: every refusal of a create
 * is a validation error, answered before the key is claimed. */
static enum attempt attempt_single(struct handler_ctx *ctx, const struct http_req *req,
                                   struct http_resp *resp, const struct cmd *c, PGresult **row,
                                   int *in_flight, struct err *e)
{
	struct timespec t0;
	PGresult *res;
	const char *outcome;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	res = db_run(ctx->db, c->stmt, c->nparams, c->params, e);

	if (res == NULL) {
		*in_flight = e->code == ERR_LOCK_TIMEOUT;
		return ATTEMPT_FAILED;
	}
	if (PQntuples(res) != 1 || PQnfields(res) != CREATE_COL_OUTCOME + 1) {
		err_set(e, ERR_INTERNAL, "the keyed statement returned %d rows of %d columns",
		        PQntuples(res), PQnfields(res));
		PQclear(res);
		return ATTEMPT_FAILED;
	}
	if (c->checked != NULL && c->checked(ctx, req, resp, res) < 0) {
		PQclear(res);
		return ATTEMPT_DONE;
	}
	outcome = PQgetvalue(res, 0, CREATE_COL_OUTCOME);
	if (strcmp(outcome, "taken") == 0) {
		/* A concurrent owner committed while we waited on the unique
		 * index: its row is visible to a new statement. */
		PQclear(res);
		*row = NULL;
		return ATTEMPT_TAKEN;
	}
	if (strcmp(outcome, "created") != 0) {
		*row = res; /* 'existing' */
		return ATTEMPT_TAKEN;
	}
	refresh_key(ctx, req->idem_key, c->params[CREATE_KEYED_TTL], &t0);
	ctx->idem = IDEM_CREATED;
	ctx->created = 1;
	if (c->render(ctx, req, resp, res, c, e) < 0) {
		/* Committed already: the retry replays what was stored. */
		PQclear(res);
		return ATTEMPT_FAILED;
	}
	PQclear(res);
	return ATTEMPT_DONE;
}

/* CMD_TX_PIPELINE through a proxy: the claim, the command and its rows in
 * one call, then the answer stored (see answer_and_store). */
static enum attempt attempt_proxied(struct handler_ctx *ctx, const struct http_req *req,
                                    struct http_resp *resp, const struct cmd *c,
                                    const struct keyed *k, PGresult **row, int *in_flight,
                                    struct err *e)
{
	struct timespec t0;
	PGresult *res;
	const char *outcome, *rows;
	size_t len;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	res = keyed_command(ctx, req, c, req->idem_key, k->ttl, e);
	if (res == NULL) {
		/* A wait on the key's owner says so (sql/032_partition_waits_and_names.sql);
		 * one in the command (an endpoint's change waiting for the
		 * tenant's open events) is a 503, as on one database. */
		*in_flight = e->code == ERR_LOCK_TIMEOUT &&
		             strstr(e->msg, "the key's owner held it past lock_timeout") != NULL;
		return ATTEMPT_FAILED;
	}
	outcome = PQgetvalue(res, 0, KEYED_COMMAND_COL_OUTCOME);
	rows = PQgetvalue(res, 0, KEYED_COMMAND_COL_ROWS);
	len = (size_t)PQgetlength(res, 0, KEYED_COMMAND_COL_ROWS);
	if (strcmp(outcome, "taken") == 0) {
		PQclear(res);
		*row = NULL;
		return ATTEMPT_TAKEN;
	}
	if (strcmp(outcome, "created") != 0) {
		/* 'unstored': rolled back, the key free again. */
		if (answer_rows(ctx, req, resp, c, rows, len, e) < 0) {
			PQclear(res);
			return ATTEMPT_FAILED;
		}
		PQclear(res);
		return ATTEMPT_DONE;
	}
	refresh_key(ctx, req->idem_key, k->ttl, &t0);
	answer_and_store(ctx, req, resp, c, rows, len, 0);
	PQclear(res);
	return ATTEMPT_DONE;
}

/* A live key row for c's request: its stored answer, or a conflict; or,
 * through a proxy, the answer from its command's rows when none is
 * stored yet. */
static void answer_key(struct handler_ctx *ctx, struct http_resp *resp, const struct http_req *req,
                       const PGresult *k, const struct cmd *c)
{
	const char *fp = same_bytes(ctx, k) ? PQgetvalue(k, 0, KEY_COL_FP) : c->fp_text;

	if (key_has_rows(k) && idem_compare(PQgetvalue(k, 0, KEY_COL_FP), fp) != IDEM_CONFLICT)
		answer_and_store(ctx, req, resp, c, PQgetvalue(k, 0, KEY_COL_BODY),
		                 (size_t)PQgetlength(k, 0, KEY_COL_BODY), 1);
	else
		answer_existing(ctx, resp, req, k, fp);
}

/* Claim the key until this request owned it or found its row. Three
 * rounds cover an expired key (delete it, claim again) and a row that
 * vanished between the claim and the read (pruned: claim again). */
static void run_keyed(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp,
                      const struct cmd *c)
{
	struct keyed k;
	struct err e;
	int in_flight;

	/* 0 until the single statement's row is read (cmd_run). */
	snprintf(k.tenant, sizeof(k.tenant), "%ld", ctx->tenant_id);
	snprintf(k.ttl, sizeof(k.ttl), "%ld milliseconds", ctx->conf->idempotency_ttl);
	k.kc[KEY_CLAIM_TENANT] = k.kg[KEY_GET_TENANT] = k.tenant;
	k.kc[KEY_CLAIM_KEY] = k.kg[KEY_GET_KEY] = req->idem_key;
	k.kc[KEY_CLAIM_METHOD] = req->method;
	k.kc[KEY_CLAIM_PATH] = req->path;
	k.kc[KEY_CLAIM_FP] = c->fp_text;
	k.kc[KEY_CLAIM_TTL] = k.ttl;
	k.kc[KEY_CLAIM_BYTES_FP] = ctx->bytes_fp;
	k.kc[KEY_CLAIM_ACTOR] = handler_actor(ctx);

	for (int round = 0; round < 3; round++) {
		PGresult *row = NULL;
		enum attempt a;
		int fresh;

		in_flight = 0;
		/* The claim and the command share a round trip; a wait in it is
		 * most often on the key's owner. */
		scoreboard_stage(SB_WAITING_KEY);
		if (c->tx == CMD_TX_SINGLE)
			a = attempt_single(ctx, req, resp, c, &row, &in_flight, &e);
		else if (proxied(ctx))
			a = attempt_proxied(ctx, req, resp, c, &k, &row, &in_flight, &e);
		else
			a = attempt_pipeline(ctx, req, resp, c, &k, &row, &in_flight, &e);
		scoreboard_stage(SB_IN_DB);
		if (a == ATTEMPT_DONE)
			return;
		if (a == ATTEMPT_FAILED)
			goto failed;
		/* The tenant is known now, whichever way the key was claimed. */
		snprintf(k.tenant, sizeof(k.tenant), "%ld", ctx->tenant_id);
		/* Taken by an owner that committed while the single statement
		 * waited on it: committed just now, so live whatever its
		 * expires_at says (a lifetime counts from the commit). */
		fresh = row == NULL && c->tx == CMD_TX_SINGLE;
		if (row == NULL) {
			row = db_run(ctx->db, Q_KEY_GET, KEY_GET__N, k.kg, &e);
			if (row == NULL)
				goto failed_waiting;
			if (PQntuples(row) == 0) {
				PQclear(row);
				continue;
			}
		}
		if (fresh || !key_expired(row)) {
			answer_key(ctx, resp, req, row, c);
			PQclear(row);
			return;
		}
		PQclear(row);
		/* Past its TTL a key is forgotten: remove the old row (only if
		 * it is still expired) and claim the key afresh. */
		row = db_run(ctx->db, Q_KEY_DELETE_EXPIRED, KEY_GET__N, k.kg, &e);
		if (row == NULL)
			goto failed_waiting;
		PQclear(row);
	}
	err_set(&e, ERR_INTERNAL, "idempotency key row kept changing; giving up");
	in_flight = 0;
	goto failed;
failed_waiting:
	/* Reading or deleting the key row waits only on its owner. */
	in_flight = e.code == ERR_LOCK_TIMEOUT;
failed:
	if (in_flight)
		key_problem(ctx, resp, req, P_KEY_IN_FLIGHT);
	else
		fail(ctx, resp, req, &e);
}

void cmd_run(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp,
             const struct cmd *c)
{
	/* The key's row came before the handler (ctx->key_row): a replay or a
	 * conflict is answered now, without another statement. Expired:
	 * the claim finds it again and takes it over. */
	if (ctx->key_row != NULL && !key_expired(ctx->key_row) && !key_has_rows(ctx->key_row)) {
		answer_existing(ctx, resp, req, ctx->key_row, c->fp_text);
		return;
	}
	if (c->prepare != NULL && c->prepare(ctx, req, resp, c) < 0)
		return;
	/* Through a proxy: the rows of a command done, rendered now, after
	 * what the render reads was prepared. */
	if (ctx->key_row != NULL && !key_expired(ctx->key_row)) {
		answer_key(ctx, resp, req, ctx->key_row, c);
		return;
	}
	if (req->idem_key == NULL)
		run_unkeyed(ctx, req, resp, c);
	else
		run_keyed(ctx, req, resp, c);
}

int cmd_members(struct json_object *root, const char *const *names, char *detail, size_t dlen)
{
	json_object_object_foreach(root, name, val)
	{
		const char *const *n;
		(void)val;
		for (n = names; *n != NULL && strcmp(*n, name) != 0; n++)
			;
		if (*n == NULL) {
			size_t off = (size_t)snprintf(detail, dlen,
			                              "unknown member \"%.64s\": expected", name);
			for (n = names; *n != NULL && off < dlen; n++)
				off += (size_t)snprintf(detail + off, dlen - off, "%s %s",
				                        n == names ? "" : ",", *n);
			return -1;
		}
	}
	return 0;
}

int cmd_text(struct json_object *root, const char *name, int required, size_t max, const char **out,
             char *detail, size_t dlen)
{
	struct json_object *v;
	const char *s;
	size_t len;

	*out = NULL;
	if (!json_object_object_get_ex(root, name, &v) || v == NULL) {
		if (!required)
			return 0;
		snprintf(detail, dlen, "\"%s\" is required", name);
		return -1;
	}
	if (!json_object_is_type(v, json_type_string)) {
		snprintf(detail, dlen, "\"%s\" must be a string", name);
		return -1;
	}
	s = json_object_get_string(v);
	len = (size_t)json_object_get_string_len(v);
	if (len == 0 || len > max) {
		snprintf(detail, dlen, "\"%s\" must be 1 to %zu bytes long", name, max);
		return -1;
	}
	for (size_t i = 0; i < len; i++) {
		if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) {
			snprintf(detail, dlen, "\"%s\" may not contain control characters", name);
			return -1;
		}
	}
	*out = s;
	return 0;
}

int cmd_int(struct json_object *root, const char *name, long min, long max, long def, long *out,
            char *detail, size_t dlen)
{
	struct json_object *v;
	int64_t n;

	*out = def;
	if (!json_object_object_get_ex(root, name, &v) || v == NULL)
		return 0;
	if (!json_object_is_type(v, json_type_int))
		goto bad;
	errno = 0;
	n = json_object_get_int64(v);
	if (errno != 0 || n < min || n > max)
		goto bad;
	*out = (long)n;
	return 0;
bad:
	snprintf(detail, dlen, "\"%s\" must be an integer from %ld to %ld", name, min, max);
	return -1;
}

int cmd_object(struct json_object *root, const char *name, struct json_object **out, char *detail,
               size_t dlen)
{
	struct json_object *v;

	*out = NULL;
	if (!json_object_object_get_ex(root, name, &v) || v == NULL)
		return 0;
	if (!json_object_is_type(v, json_type_object)) {
		snprintf(detail, dlen, "\"%s\" must be a JSON object", name);
		return -1;
	}
	*out = v;
	return 0;
}
