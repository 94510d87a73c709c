/* cmd.c - commands run once per Idempotency-Key (see cmd.h). */
#include "server/cmd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/canon.h"
#include "core/fp.h"
#include "server/queries.h"

void cmd_key_problem(struct handler_ctx *ctx, struct http_resp *resp, const struct http_req *req,
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

/* res: (outcome, fingerprint, status, headers, body, expired). */
void cmd_answer_existing(struct handler_ctx *ctx, struct http_resp *resp, const struct http_req *req,
                         const PGresult *res, const char fp_text[IDEM_FP_TEXT])
{
	if (idem_compare(PQgetvalue(res, 0, 1), fp_text) == IDEM_CONFLICT) {
		cmd_key_problem(ctx, resp, req, P_KEY_REUSED);
		return;
	}
	ctx->idem = IDEM_REPLAYED;
	resp->status = atoi(PQgetvalue(res, 0, 2));
	/* Every answer of the API with a status of 400 or more is a
	 * problem: the type need not be stored. */
	resp->content_type = resp->status >= 400 ? "application/problem+json" : "application/json";
	buf_puts(&resp->headers, PQgetvalue(res, 0, 3));
	http_resp_header(resp, "Idempotent-Replayed", "true");
	buf_append(&resp->body, PQgetvalue(res, 0, 4), (size_t)PQgetlength(res, 0, 4));
}

/* The checks and the body read into ctx->body: 0, or -1 when resp holds
 * the answer. A keyed request's bytes fingerprint goes to ctx->bytes_fp. */
static int read_body(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp,
                     int key_required)
{
	const struct conf *c = ctx->conf;
	char detail[128];

	if (!http_is_json(req->content_type)) {
		handler_problem(resp, req, P_UNSUPPORTED_MEDIA_TYPE,
		            "send the body as Content-Type: application/json");
		return -1;
	}
	if (req->idem_key_count > 1) {
		handler_problem(resp, req, P_INVALID_KEY, "send exactly one Idempotency-Key header");
		return -1;
	}
	if (req->idem_key == NULL && key_required) {
		handler_problem(resp, req, P_MISSING_KEY,
		            "this request needs an Idempotency-Key header: a unique value per "
		            "logical request, such as a UUID, reused on every retry");
		return -1;
	}
	if (req->idem_key != NULL && !idem_key_valid(req->idem_key)) {
		handler_problem(resp, req, P_INVALID_KEY,
		            "an Idempotency-Key is 1 to 255 printable ASCII characters, without "
		            "spaces");
		return -1;
	}
	buf_reset(&ctx->body);
	switch (http_read_body(req, c->max_body, &ctx->body)) {
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

/*
 * The request is the one that made its key row when the row (fetched with
 * the token, ctx->key_row) is live and was stored from exactly these bytes:
 * answer the stored response without parsing the body, and return 1. 0
 * otherwise (no row, expired, other bytes, a row from before the column):
 * the canonical comparison follows.
 */
static int replay_same_bytes(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp)
{
	const PGresult *k = ctx->key_row;

	/* Column 6 of Q_AUTH_KEY is request_bytes_fp, column 5 expired. */
	if (k == NULL || ctx->bytes_fp[0] == '\0' || PQnfields(k) < 7 || PQgetisnull(k, 0, 6) ||
	    strcmp(PQgetvalue(k, 0, 5), "t") == 0 || strcmp(PQgetvalue(k, 0, 6), ctx->bytes_fp) != 0)
		return 0;
	cmd_answer_existing(ctx, resp, req, k, PQgetvalue(k, 0, 1));
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

struct json_object *cmd_read_json(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp,
                                  int key_required)
{
	if (read_body(ctx, req, resp, key_required) < 0)
		return NULL;
	/* A retry resends the same bytes: answered without parsing them. */
	if (replay_same_bytes(ctx, req, resp))
		return NULL;
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

/* The command's answer from its result: a problem row or the render.
 * Returns 1 when the answer is to be stored under the key (cmd_stores),
 * 0 when not, -1 with e filled on failure. */
static int answer(struct handler_ctx *ctx, const struct http_req *req, struct http_resp *resp,
                  const PGresult *res, const struct cmd *c, struct err *e)
{
	if (PQntuples(res) > 0 && !PQgetisnull(res, 0, 0)) {
		enum problem_kind kind = problem_by_slug(PQgetvalue(res, 0, 0));
		handler_problem(resp, req, kind, PQgetvalue(res, 0, 1));
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

static void fail(struct handler_ctx *ctx, struct http_resp *resp, const struct http_req *req,
                 const struct err *e)
{
	buf_reset(&resp->headers);
	handler_db_error(ctx, resp, req, e);
}

/* The command's statement alone, in its own transaction. */
static void run_unkeyed(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp,
                        const struct cmd *c)
{
	struct err e;
	PGresult *res = db_run(ctx->db, c->stmt, c->nparams, c->params, &e);

	if (res == NULL || answer(ctx, req, resp, res, c, &e) < 0)
		fail(ctx, resp, req, &e);
	PQclear(res);
}

/* Store the answer in resp on the claimed key and commit. */
static int store_and_commit(struct handler_ctx *ctx, const struct http_req *req,
                            const struct http_resp *resp, const char *tenant, struct err *e)
{
	char status[8];
	const char *sp[5] = {tenant, req->idem_key, status,
	                     resp->headers.data ? resp->headers.data : "",
	                     resp->body.data ? resp->body.data : ""};
	const struct db_call calls[2] = {{Q_KEY_STORE, 5, sp}, {Q_COMMIT, 0, NULL}};
	PGresult *r[2];
	int failed;

	snprintf(status, sizeof(status), "%d", resp->status);
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

void cmd_run(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp, const struct cmd *c)
{
	char tenant[24], ttl[40];
	struct err e;

	if (ctx->key_row != NULL && strcmp(PQgetvalue(ctx->key_row, 0, 5), "t") != 0) {
		cmd_answer_existing(ctx, resp, req, ctx->key_row, c->fp_text);
		return;
	}
	if (req->idem_key == NULL) {
		run_unkeyed(ctx, req, resp, c);
		return;
	}
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	snprintf(ttl, sizeof(ttl), "%ld milliseconds", ctx->conf->idempotency_ttl);
	const char *kp[7] = {tenant,    req->idem_key, req->method, req->path,
	                     c->fp_text, ttl,          ctx->bytes_fp};
	const struct db_call calls[3] = {
	    {Q_BEGIN, 0, NULL}, {Q_KEY_CLAIM, 7, kp}, {c->stmt, c->nparams, c->params}};

	/* Three rounds, as for a create: an expired key is deleted and
	 * claimed again; a row that vanished meanwhile was pruned. */
	for (int round = 0; round < 3; round++) {
		PGresult *r[3], *res;
		int failed;

		if (db_pipeline(ctx->db, 3, calls, r, &failed, &e) < 0) {
			if (failed == 1 && e.code == ERR_LOCK_TIMEOUT)
				cmd_key_problem(ctx, resp, req, P_KEY_IN_FLIGHT);
			else
				fail(ctx, resp, req, &e);
			return;
		}
		if (PQntuples(r[1]) == 1) {
			int rc = answer(ctx, req, resp, r[2], c, &e);
			clear_results(r, 3);
			if (rc < 0) {
				rollback(ctx);
				fail(ctx, resp, req, &e);
				return;
			}
			if (rc == 0) {
				/* Not the command's outcome (a missing workflow
				 * or job): the command changed nothing, and the
				 * rollback frees the key for the retry. */
				rollback(ctx);
				return;
			}
			if (store_and_commit(ctx, req, resp, tenant, &e) < 0) {
				ctx->created = 0;
				fail(ctx, resp, req, &e);
				return;
			}
			ctx->idem = IDEM_CREATED;
			return;
		}
		/* Taken: undo this run and answer as the key's owner did. */
		clear_results(r, 3);
		rollback(ctx);
		res = db_run(ctx->db, Q_KEY_GET, 2, kp, &e);
		if (res == NULL) {
			fail(ctx, resp, req, &e);
			return;
		}
		if (PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 5), "t") != 0) {
			cmd_answer_existing(ctx, resp, req, res, c->fp_text);
			PQclear(res);
			return;
		}
		PQclear(res);
		res = db_run(ctx->db, Q_KEY_DELETE_EXPIRED, 2, kp, &e);
		if (res == NULL) {
			fail(ctx, resp, req, &e);
			return;
		}
		PQclear(res);
	}
	err_set(&e, ERR_INTERNAL, "idempotency key row kept changing; giving up");
	fail(ctx, resp, req, &e);
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
