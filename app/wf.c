/*
 * wf.c - creating and reading workflows.
 *
 * A keyed create is one SQL statement (Q_CREATE_KEYED), so the key row with
 * its stored response, the workflow row and its workflow.created event
 * commit together or not at all, in one round trip. The workflow id and
 * created_at are made here, before the statement, so the response body can
 * be stored by the same statement that creates what it describes.
 */
#include "wf.h"

#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canon.h"
#include "fp.h"
#include "ids.h"

#define WF_TYPE_MAX 128

/* Check the parsed body; on failure fill detail and return -1. */
static int validate(struct json_object *root, struct json_object **type,
		    struct json_object **input, char *detail, size_t dlen)
{
	const char *t;
	size_t tlen;

	*type = NULL;
	*input = NULL;
	json_object_object_foreach(root, name, val) {
		if (strcmp(name, "type") == 0) {
			*type = val;
		} else if (strcmp(name, "input") == 0) {
			*input = val;
		} else {
			snprintf(detail, dlen, "unknown member \"%.64s\": expected only type and input",
				 name);
			return -1;
		}
	}
	if (*type == NULL) {
		snprintf(detail, dlen, "\"type\" is required");
		return -1;
	}
	if (!json_object_is_type(*type, json_type_string)) {
		snprintf(detail, dlen, "\"type\" must be a string");
		return -1;
	}
	t = json_object_get_string(*type);
	tlen = (size_t)json_object_get_string_len(*type);
	if (tlen == 0 || tlen > WF_TYPE_MAX) {
		snprintf(detail, dlen, "\"type\" must be 1 to %d bytes long", WF_TYPE_MAX);
		return -1;
	}
	for (size_t i = 0; i < tlen; i++) {
		if ((unsigned char)t[i] < 0x20 || t[i] == 0x7f) {
			snprintf(detail, dlen, "\"type\" may not contain control characters");
			return -1;
		}
	}
	if (*input != NULL && !json_object_is_type(*input, json_type_object)) {
		snprintf(detail, dlen, "\"input\" must be a JSON object");
		return -1;
	}
	return 0;
}

/* Append the workflow representation shared by POST and GET. */
static void write_workflow(struct buf *out, const char *id, const char *type, size_t tlen,
			   const char *state, const char *input, size_t ilen, const char *created)
{
	buf_printf(out, "{\"id\":\"%s\",\"type\":", id);
	canon_write_string(out, type, tlen);
	buf_printf(out, ",\"state\":\"%s\",\"input\":", state);
	buf_append(out, input, ilen);
	buf_printf(out, ",\"created_at\":\"%s\"}", created);
}

static void answer_created(struct http_resp *resp, const char *location, const struct buf *body)
{
	resp->status = 201;
	resp->content_type = "application/json";
	http_resp_header(resp, "Location", location);
	buf_append(&resp->body, body->data, body->len);
}

/* A 409 about the key: conflict or in flight. */
static void key_problem(struct api_ctx *ctx, struct http_resp *resp, const struct http_req *req,
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
	problem_write(&resp->body, kind, detail, req->path, req->request_id, "idempotency_key",
		      req->idem_key);
}

/*
 * res holds an 'existing' row (outcome, fingerprint, status, headers, body,
 * expired) for a key that is not expired: replay it or refuse.
 */
static void answer_existing(struct api_ctx *ctx, struct http_resp *resp,
			    const struct http_req *req, const PGresult *res,
			    const char fp_text[IDEM_FP_TEXT])
{
	if (idem_compare(PQgetvalue(res, 0, 1), fp_text) == IDEM_CONFLICT) {
		key_problem(ctx, resp, req, P_KEY_REUSED);
		return;
	}
	ctx->idem = IDEM_REPLAYED;
	resp->status = atoi(PQgetvalue(res, 0, 2));
	resp->content_type = "application/json";
	buf_puts(&resp->headers, PQgetvalue(res, 0, 3));
	http_resp_header(resp, "Idempotent-Replayed", "true");
	buf_append(&resp->body, PQgetvalue(res, 0, 4), (size_t)PQgetlength(res, 0, 4));
}

/* The create statement: the real one, or in a test-hooks build with
 * test_fail_after_write, one that fails after writing. */
static int create_stmt(const struct api_ctx *ctx)
{
#ifdef IDEMFLOW_TEST_HOOKS
	if (ctx->conf->test_fail_after_write)
		return Q_CREATE_KEYED_FAIL;
#else
	(void)ctx;
#endif
	return Q_CREATE_KEYED;
}

/* Run the keyed create until it either owned the key or found its row.
 * p holds Q_CREATE_KEYED's parameters; p[4] is the fingerprint text. */
static void create_keyed(struct api_ctx *ctx, struct http_req *req, struct http_resp *resp,
			 const char *const p[14], const char *location, const struct buf *body)
{
	struct err e;

	/* Three rounds cover an expired key (delete it, claim again) and a
	 * row that vanished between the claim and the read (pruned). */
	for (int round = 0; round < 3; round++) {
		PGresult *res = db_run(ctx->db, create_stmt(ctx), 14, p, &e);
		if (res == NULL)
			goto db_error;
		if (PQntuples(res) == 0) {
			/* A concurrent owner committed while we waited on the
			 * unique index: its row is visible to a new statement. */
			PQclear(res);
			res = db_run(ctx->db, Q_KEY_GET, 2, p, &e);
			if (res == NULL)
				goto db_error;
			if (PQntuples(res) == 0) {
				PQclear(res);
				continue;
			}
		} else if (strcmp(PQgetvalue(res, 0, 0), "created") == 0) {
			PQclear(res);
			ctx->idem = IDEM_CREATED;
			ctx->created = 1;
			answer_created(resp, location, body);
			return;
		}
		if (strcmp(PQgetvalue(res, 0, 5), "t") != 0) {
			answer_existing(ctx, resp, req, res, p[4]);
			PQclear(res);
			return;
		}
		PQclear(res);
		/* Past its TTL a key is forgotten: remove the old row (only if
		 * it is still expired) and claim the key afresh. */
		res = db_run(ctx->db, Q_KEY_DELETE_EXPIRED, 2, p, &e);
		if (res == NULL)
			goto db_error;
		PQclear(res);
	}
	err_set(&e, ERR_INTERNAL, "idempotency key row kept changing; giving up");
db_error:
	if (e.code == ERR_LOCK_TIMEOUT)
		key_problem(ctx, resp, req, P_KEY_IN_FLIGHT);
	else
		api_db_error(ctx, resp, req, &e);
}

static void create_unkeyed(struct api_ctx *ctx, struct http_req *req, struct http_resp *resp,
			   const char *const p[14], const char *location, const struct buf *body)
{
	const char *q[7] = {p[0], p[7], p[9], p[10], p[11], p[12], p[13]};
	struct err e;
	PGresult *res = db_run(ctx->db, Q_CREATE_UNKEYED, 7, q, &e);

	if (res == NULL) {
		api_db_error(ctx, resp, req, &e);
		return;
	}
	PQclear(res);
	ctx->created = 1;
	answer_created(resp, location, body);
}

void wf_create(struct api_ctx *ctx, struct http_req *req, struct http_resp *resp)
{
	const struct conf *c = ctx->conf;
	struct json_object *root = NULL, *type, *input;
	struct buf *sc = &ctx->scratch;
	char detail[300];
	char id[IDS_UUID_LEN + 1], now[IDS_TS_LEN + 1], tenant[24], ttl[40];
	char location[64], event_id[IDS_UUID_LEN + 8], fp_text[IDEM_FP_TEXT];
	uint8_t fp[FP_LEN];
	struct buf out = BUF_INIT; /* the response body, also stored */
	struct buf payload = BUF_INIT;
	size_t canon_len, input_off, input_len;
	struct err e;

	if (!http_is_json(req->content_type)) {
		api_problem(resp, req, P_UNSUPPORTED_MEDIA_TYPE,
			    "send the body as Content-Type: application/json");
		goto out;
	}
	if (req->idem_key_count > 1) {
		api_problem(resp, req, P_INVALID_KEY, "send exactly one Idempotency-Key header");
		goto out;
	}
	if (req->idem_key == NULL && c->idempotency_key == IDEM_KEY_REQUIRED) {
		api_problem(resp, req, P_MISSING_KEY,
			    "POST /v1/workflows needs an Idempotency-Key header: a unique value per "
			    "logical request, such as a UUID, reused on every retry");
		goto out;
	}
	if (req->idem_key != NULL && !idem_key_valid(req->idem_key)) {
		api_problem(resp, req, P_INVALID_KEY,
			    "an Idempotency-Key is 1 to 255 printable ASCII characters, without "
			    "spaces");
		goto out;
	}
	switch (http_read_body(req, c->max_body, &ctx->body)) {
	case HTTP_BODY_OK:
		break;
	case HTTP_BODY_TOO_LARGE:
		snprintf(detail, sizeof(detail), "the body may be at most %ld bytes", c->max_body);
		api_problem(resp, req, P_BODY_TOO_LARGE, detail);
		goto out;
	case HTTP_BODY_SHORT:
		api_problem(resp, req, P_BAD_BODY, "the body ended before its Content-Length");
		goto out;
	}
	root = canon_parse(ctx->body.data ? ctx->body.data : "", ctx->body.len, (int)c->max_depth,
			   &e);
	if (root == NULL) {
		api_problem(resp, req, P_INVALID_JSON, e.msg);
		goto out;
	}
	if (!json_object_is_type(root, json_type_object)) {
		api_problem(resp, req, P_INVALID_JSON, "the body must be a JSON object");
		goto out;
	}
	if (validate(root, &type, &input, detail, sizeof(detail)) < 0) {
		api_problem(resp, req, P_INVALID_WORKFLOW, detail);
		goto out;
	}

	/* The canonical body is what the fingerprint covers; the canonical
	 * input is what is stored and echoed. Both go in one scratch buffer. */
	buf_reset(sc);
	if (canon_write(sc, root, &e) < 0) {
		api_problem(resp, req, P_INVALID_JSON, e.msg);
		goto out;
	}
	canon_len = sc->len;
	input_off = sc->len;
	if (input != NULL) {
		if (canon_write(sc, input, &e) < 0) {
			api_problem(resp, req, P_INVALID_JSON, e.msg);
			goto out;
		}
	} else {
		buf_puts(sc, "{}");
	}
	input_len = sc->len - input_off;
	buf_putc(sc, '\0'); /* the input is a text parameter */
	if (sc->oom) {
		api_problem(resp, req, P_BODY_TOO_LARGE, "the body is too large to process");
		goto out;
	}
	fp_request(fp, req->method, req->path, sc->data, canon_len);
	idem_fp_text(fp_text, fp);

	/* The key's row came with the authentication: a replay or a conflict
	 * is answered now, without another statement. */
	if (ctx->key_row != NULL) {
		if (strcmp(PQgetvalue(ctx->key_row, 0, 5), "t") != 0) {
			answer_existing(ctx, resp, req, ctx->key_row, fp_text);
			goto out;
		}
		/* Expired: the create below finds it again and takes it over. */
	}

	if (ids_uuid7(id) < 0) {
		err_set(&e, ERR_INTERNAL, "could not read random bytes");
		api_db_error(ctx, resp, req, &e);
		goto out;
	}
	ids_now(now);
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	snprintf(ttl, sizeof(ttl), "%ld milliseconds", c->idempotency_ttl);
	snprintf(location, sizeof(location), "/v1/workflows/%s", id);
	snprintf(event_id, sizeof(event_id), "%s.1", id);

	write_workflow(&out, id, json_object_get_string(type),
		       (size_t)json_object_get_string_len(type), "pending", sc->data + input_off,
		       input_len, now);
	buf_printf(&payload,
		   "{\"id\":\"%s\",\"type\":\"workflow.created\",\"workflow_id\":\"%s\",\"seq\":1,"
		   "\"tenant_id\":%ld,\"occurred_at\":\"%s\",\"data\":",
		   event_id, id, ctx->tenant_id, now);
	buf_append(&payload, out.data, out.len);
	buf_putc(&payload, '}');
	if (out.oom || payload.oom) {
		err_set(&e, ERR_INTERNAL, "out of memory");
		api_db_error(ctx, resp, req, &e);
		goto out;
	}

	char stored_headers[96];
	snprintf(stored_headers, sizeof(stored_headers), "Location: %s\r\n", location);
	const char *p[14] = {tenant,     req->idem_key, req->method,
			     req->path,  fp_text,       stored_headers,
			     out.data,   now,           ttl,
			     id,         json_object_get_string(type),
			     sc->data + input_off,      event_id,
			     payload.data};
	if (req->idem_key != NULL)
		create_keyed(ctx, req, resp, p, location, &out);
	else
		create_unkeyed(ctx, req, resp, p, location, &out);
out:
	json_object_put(root);
	buf_free(&out);
	buf_free(&payload);
}

void wf_get(struct api_ctx *ctx, struct http_req *req, const char *id, struct http_resp *resp)
{
	char tenant[24];
	struct err e;
	PGresult *res;
	struct json_object *input = NULL;

	if (!ids_is_uuid(id)) {
		api_problem(resp, req, P_NOT_FOUND, "no such workflow");
		return;
	}
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	const char *p[2] = {tenant, id};
	res = db_run(ctx->db, Q_WF_GET, 2, p, &e);
	if (res == NULL) {
		api_db_error(ctx, resp, req, &e);
		return;
	}
	if (PQntuples(res) == 0) {
		/* Another tenant's workflow looks exactly like a missing one. */
		api_problem(resp, req, P_NOT_FOUND, "no such workflow");
		goto out;
	}
	/* jsonb prints in its own style; answer in the canonical form that
	 * POST used. */
	input = canon_parse(PQgetvalue(res, 0, 3), (size_t)PQgetlength(res, 0, 3), 1000, &e);
	buf_reset(&ctx->scratch);
	if (input == NULL || canon_write(&ctx->scratch, input, &e) < 0) {
		err_set(&e, ERR_INTERNAL, "stored input of workflow %s is not valid JSON", id);
		api_db_error(ctx, resp, req, &e);
		goto out;
	}
	resp->status = 200;
	resp->content_type = "application/json";
	write_workflow(&resp->body, PQgetvalue(res, 0, 0), PQgetvalue(res, 0, 1),
		       (size_t)PQgetlength(res, 0, 1), PQgetvalue(res, 0, 2), ctx->scratch.data,
		       ctx->scratch.len, PQgetvalue(res, 0, 4));
out:
	json_object_put(input);
	PQclear(res);
}
