/*
 * wf.c - workflows: create, read, list, history, transitions, resumes.
 * The steps' checks are wf_steps.c's, the message routes messages.c's,
 * the paging page.c's.
 *
 * A plain keyed create (no steps, business key or priority) is one SQL statement
 * (Q_CREATE_KEYED), so the key row with its stored response, the workflow
 * row and its workflow.created event commit together or not at all, in
 * one round trip. The workflow id and created_at are made here, before the
 * statement, so the response body can be stored by the same statement that
 * creates what it describes. A create with steps, a business key or a
 * priority, and
 * every other command, runs a database function through cmd.c.
 */
#include "server/wf.h"

#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/canon.h"
#include "core/fp.h"
#include "core/ids.h"
#include "server/auth.h"
#include "server/cmd.h"
#include "server/page.h"
#include "server/queries.h"
#include "server/wf_steps.h"

#define WF_GET_PROGRESS 8 /* Q_WF_GET's column after the workflow's */

void wf_write(struct buf *out, const struct wf_view *w)
{
	buf_printf(out, "{\"id\":\"%s\",\"type\":", w->id);
	canon_write_string(out, w->type, strlen(w->type));
	buf_printf(out, ",\"state\":\"%s\",\"input\":", w->state);
	buf_append(out, w->input, w->input_len);
	buf_printf(out, ",\"created_at\":\"%s\"", w->created_at);
	if (w->business_key != NULL) {
		buf_puts(out, ",\"business_key\":");
		canon_write_string(out, w->business_key, strlen(w->business_key));
	}
	if (w->steps != NULL) {
		buf_puts(out, ",\"steps\":");
		buf_append(out, w->steps, w->steps_len);
		buf_printf(out, ",\"step\":%d", w->step);
	}
	if (w->progress != NULL) {
		buf_puts(out, ",\"progress\":");
		buf_append(out, w->progress, w->progress_len);
	}
	if (w->existing)
		buf_puts(out, ",\"existing\":true");
	buf_putc(out, '}');
}

/* The view of the workflow in row `row` of res, columns from `col` on as
 * wf_write_row() reads them, its JSON canonical in tmp. 0, or -1 with e. */
static int row_view(struct wf_view *view, struct buf *tmp, const PGresult *res, int row, int col,
                    int existing, struct err *e)
{
	struct wf_view w = { 0 };
	size_t input_len;

	buf_reset(tmp);
	if (canon_recanon(tmp, PQgetvalue(res, row, col + 3),
	                  (size_t)PQgetlength(res, row, col + 3), e) < 0)
		return err_set(e, ERR_INTERNAL, "stored input of workflow %s is not valid JSON",
		               PQgetvalue(res, row, col));
	input_len = tmp->len;
	if (strcmp(PQgetvalue(res, row, col + 6), "[]") != 0 &&
	    canon_recanon(tmp, PQgetvalue(res, row, col + 6),
	                  (size_t)PQgetlength(res, row, col + 6), e) < 0)
		return err_set(e, ERR_INTERNAL, "stored steps of workflow %s are not valid JSON",
		               PQgetvalue(res, row, col));
	if (tmp->oom)
		return err_set(e, ERR_INTERNAL, "out of memory");
	w.id = PQgetvalue(res, row, col);
	w.type = PQgetvalue(res, row, col + 1);
	w.state = PQgetvalue(res, row, col + 2);
	w.input = tmp->data;
	w.input_len = input_len;
	w.created_at = PQgetvalue(res, row, col + 4);
	w.business_key = PQgetisnull(res, row, col + 5) ? NULL : PQgetvalue(res, row, col + 5);
	if (tmp->len > input_len) {
		w.steps = tmp->data + input_len;
		w.steps_len = tmp->len - input_len;
		w.step = atoi(PQgetvalue(res, row, col + 7));
	}
	w.existing = existing;
	*view = w;
	return 0;
}

int wf_write_row(struct buf *out, struct buf *tmp, const PGresult *res, int row, int col,
                 int existing, struct err *e)
{
	struct wf_view w;

	if (row_view(&w, tmp, res, row, col, existing, e) < 0)
		return -1;
	wf_write(out, &w);
	return 0;
}

/* The create statement: the real one, or in a test-hooks build with
 * test_fail_after_write, one that fails after writing. */
static int create_stmt(const struct handler_ctx *ctx)
{
#ifdef IDEMFLOW_TEST_HOOKS
	if (ctx->conf->test_fail_after_write)
		return Q_CREATE_KEYED_FAIL;
#endif
	return Q_CREATE_KEYED;
}

/*
 * A create once its body is validated: what create_prepare() makes when
 * the request is not a replay (the workflow id, its answer and event, the
 * statements' parameters), and what the renders answer from. Strings
 * borrowed from the parsed body and ctx->scratch.
 */
struct create {
	const struct wf_body *b;
	const char *input; /* canonical */
	size_t input_len;
	const char *steps; /* canonical, or NULL */
	size_t steps_len;
	const char *fp_text;
	char id[IDS_UUID_LEN + 1], now[IDS_TS_LEN + 1], tenant[24], ttl[40];
	char location[64], event_id[IDS_UUID_LEN + 8], stored_headers[96], priority[24];
	struct buf out;                         /* the response body, also stored */
	struct buf payload;                     /* the workflow.created event */
	const char *keyed[CREATE_KEYED__N];     /* Q_CREATE_KEYED */
	const char *unkeyed[CREATE_UNKEYED__N]; /* Q_CREATE_UNKEYED */
	const char *run[WF_CREATE_RUN__N];      /* Q_WF_CREATE_RUN */
};

/* The workflow.created event's payload: EVENT_HEAD, the tenant id,
 * EVENT_TAIL, the workflow as answered, "}". */
#define EVENT_HEAD                                                                                 \
	"{\"id\":\"%s\",\"type\":\"workflow.created\",\"workflow_id\":\"%s\","                     \
	"\"seq\":1,\"tenant_id\":"
#define EVENT_TAIL ",\"occurred_at\":\"%s\",\"data\":"

static int create_prepare(struct handler_ctx *ctx, const struct http_req *req,
                          struct http_resp *resp, const struct cmd *c)
{
	struct create *cr = c->arg;
	const struct wf_body *b = cr->b;
	const char *type = json_object_get_string(b->type);
	struct err e;

	if (ids_uuid7(cr->id) < 0) {
		err_set(&e, ERR_INTERNAL, "could not read random bytes");
		handler_db_error(ctx, resp, req, &e);
		return -1;
	}
	ids_now(cr->now);
	snprintf(cr->tenant, sizeof(cr->tenant), "%ld", ctx->tenant_id);
	snprintf(cr->ttl, sizeof(cr->ttl), "%ld milliseconds", ctx->conf->idempotency_ttl);
	snprintf(cr->location, sizeof(cr->location), "/v1/workflows/%s", cr->id);
	snprintf(cr->event_id, sizeof(cr->event_id), "%s.1", cr->id);
	snprintf(cr->stored_headers, sizeof(cr->stored_headers), "Location: %s\r\n", cr->location);

	struct wf_view w = { .id = cr->id,
		             .type = type,
		             .state = "pending",
		             .input = cr->input,
		             .input_len = cr->input_len,
		             .created_at = cr->now,
		             .business_key = b->business_key,
		             .steps = cr->steps,
		             .steps_len = cr->steps_len,
		             .step = 1 };
	wf_write(&cr->out, &w);
	/* The event's payload around its tenant id, which every create
	 * statement puts between the two parts (queries.h): the keyed one
	 * learns the tenant from the token only in the statement. */
	struct buf *pl = &cr->payload;
	size_t tail;
	buf_printf(pl, EVENT_HEAD, cr->event_id, cr->id);
	buf_putc(pl, '\0');
	tail = pl->len;
	buf_printf(pl, EVENT_TAIL, cr->now);
	buf_append(pl, cr->out.data, cr->out.len);
	buf_puts(pl, "}");
	buf_putc(pl, '\0');
	if (cr->out.oom || pl->oom) {
		err_set(&e, ERR_INTERNAL, "out of memory");
		handler_db_error(ctx, resp, req, &e);
		return -1;
	}

	cr->keyed[CREATE_KEYED_TOKEN_HASH] = ctx->token_hex;
	cr->keyed[CREATE_KEYED_KEY] = req->idem_key;
	cr->keyed[CREATE_KEYED_METHOD] = req->method;
	cr->keyed[CREATE_KEYED_PATH] = req->path;
	cr->keyed[CREATE_KEYED_FP] = cr->fp_text;
	cr->keyed[CREATE_KEYED_HEADERS] = cr->stored_headers;
	cr->keyed[CREATE_KEYED_BODY] = cr->out.data;
	cr->keyed[CREATE_KEYED_CREATED_AT] = cr->now;
	cr->keyed[CREATE_KEYED_TTL] = cr->ttl;
	cr->keyed[CREATE_KEYED_ID] = cr->id;
	cr->keyed[CREATE_KEYED_TYPE] = type;
	cr->keyed[CREATE_KEYED_INPUT] = cr->input;
	cr->keyed[CREATE_KEYED_EVENT_ID] = cr->event_id;
	cr->keyed[CREATE_KEYED_PAYLOAD_HEAD] = pl->data;
	cr->keyed[CREATE_KEYED_BYTES_FP] = ctx->bytes_fp;
	cr->keyed[CREATE_KEYED_PAYLOAD_TAIL] = pl->data + tail;
	cr->keyed[CREATE_KEYED_TRACEPARENT] = handler_traceparent(ctx);
	cr->keyed[CREATE_KEYED_TRACESTATE] = handler_tracestate(ctx);

	cr->unkeyed[CREATE_UNKEYED_TENANT] = cr->tenant;
	cr->unkeyed[CREATE_UNKEYED_CREATED_AT] = cr->now;
	cr->unkeyed[CREATE_UNKEYED_ID] = cr->id;
	cr->unkeyed[CREATE_UNKEYED_TYPE] = type;
	cr->unkeyed[CREATE_UNKEYED_INPUT] = cr->input;
	cr->unkeyed[CREATE_UNKEYED_EVENT_ID] = cr->event_id;
	cr->unkeyed[CREATE_UNKEYED_PAYLOAD_HEAD] = pl->data;
	cr->unkeyed[CREATE_UNKEYED_PAYLOAD_TAIL] = pl->data + tail;

	cr->run[WF_CREATE_RUN_TENANT] = cr->tenant;
	cr->run[WF_CREATE_RUN_ID] = cr->id;
	cr->run[WF_CREATE_RUN_TYPE] = type;
	cr->run[WF_CREATE_RUN_INPUT] = cr->input;
	cr->run[WF_CREATE_RUN_CREATED_AT] = cr->now;
	cr->run[WF_CREATE_RUN_STEPS] = cr->steps != NULL ? cr->steps : "[]";
	cr->run[WF_CREATE_RUN_BUSINESS_KEY] = b->business_key;
	cr->run[WF_CREATE_RUN_PAYLOAD_HEAD] = pl->data;
	cr->run[WF_CREATE_RUN_PAYLOAD_TAIL] = pl->data + tail;
	snprintf(cr->priority, sizeof(cr->priority), "%ld", b->priority < 0 ? 0 : b->priority);
	cr->run[WF_CREATE_RUN_PRIORITY] = cr->priority;
	return 0;
}

static void answer_created(struct http_resp *resp, const struct create *cr)
{
	resp->status = 201;
	resp->content_type = "application/json";
	http_resp_header(resp, "Location", cr->location);
	buf_append(&resp->body, cr->out.data, cr->out.len);
}

/* A plain create: its answer was rendered before the statement. */
static int render_created(struct handler_ctx *ctx, const struct http_req *req,
                          struct http_resp *resp, const PGresult *res, const struct cmd *c,
                          struct err *e)
{
	answer_created(resp, c->arg);
	return 0;
}

/* A create with steps or a business key: the created workflow's answer
 * was rendered before the statement, as "pending" at step 1; the
 * 'existing' one comes from the row, and so does a created one that its
 * own transaction moved on (its first wait took a kept message), so the
 * answer, and what the key stores, is the state the create left. */
static int render_create_run(struct handler_ctx *ctx, const struct http_req *req,
                             struct http_resp *resp, const PGresult *res, const struct cmd *c,
                             struct err *e)
{
	const struct create *cr = c->arg;
	char location[64];

	if (PQntuples(res) != 1)
		return err_set(e, ERR_INTERNAL, "idemflow_wf_create returned %d rows",
		               PQntuples(res));
	if (strcmp(PQgetvalue(res, 0, 2), "created") == 0) {
		/* The prepared answer is the row's when the row is the one
		 * prepared: through a proxy the rows may be an earlier
		 * request's (cmd.c), rendered again. */
		if (strcmp(PQgetvalue(res, 0, 3), cr->id) == 0 &&
		    strcmp(PQgetvalue(res, 0, 5), "pending") == 0 &&
		    (cr->steps == NULL || strcmp(PQgetvalue(res, 0, 10), "1") == 0)) {
			answer_created(resp, cr);
			return 0;
		}
		resp->status = 201;
		resp->content_type = "application/json";
		snprintf(location, sizeof(location), "/v1/workflows/%s", PQgetvalue(res, 0, 3));
		http_resp_header(resp, "Location", location);
		return wf_write_row(&resp->body, &ctx->body, res, 0, 3, 0, e);
	}
	/* An active workflow already has this business key: that one. */
	resp->status = 200;
	resp->content_type = "application/json";
	snprintf(location, sizeof(location), "/v1/workflows/%s", PQgetvalue(res, 0, 3));
	http_resp_header(resp, "Location", location);
	return wf_write_row(&resp->body, &ctx->body, res, 0, 3, 1, e);
}

/*
 * A plain create (no steps, no business key, no priority) is one
 * statement, keyed or not (CMD_TX_SINGLE); with steps, a business key or
 * a priority it is a database function run as a command
 * (CMD_TX_PIPELINE). Either way through the
 * keyed-command runner (cmd.h), which answers a replay before anything
 * is rendered.
 *
 * The router only begins the token's check (auth_begin); this handler
 * ends it. A plain keyed create's statement checks the token itself
 * (auth_checked reads its row); every other create settles it before the
 * runner. A create answered without either (refused before, or in flight
 * on its key) settles it at the end: a bad token's 401 comes first.
 */
void wf_create(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp)
{
	const struct conf *c = ctx->conf;
	struct json_object *root = NULL;
	struct wf_body b;
	struct buf *sc = &ctx->scratch;
	char detail[300], fp_text[IDEM_FP_TEXT];
	struct create cr = { .b = &b, .fp_text = fp_text, .out = BUF_INIT, .payload = BUF_INIT };
	size_t input_off, steps_off = 0;
	enum problem_kind kind = P_INVALID_WORKFLOW;
	struct err e;

	root = cmd_read_json(ctx, req, resp, c->idempotency_key == IDEM_KEY_REQUIRED);
	if (root == NULL)
		goto out;
	if (wf_steps_body(root, &b, &kind, detail, sizeof(detail)) < 0) {
		handler_problem(resp, req, kind, detail);
		goto out;
	}

	/* The canonical body is what the fingerprint covers; the canonical
	 * input (and steps) are what is stored and echoed. All go in one
	 * scratch buffer, each followed by a NUL as text parameters. */
	if (cmd_fingerprint(ctx, req, resp, root, fp_text) < 0)
		goto out;
	input_off = sc->len;
	if (b.input != NULL) {
		if (canon_write(sc, b.input, &e) < 0) {
			handler_problem(resp, req, P_INVALID_JSON, e.msg);
			goto out;
		}
	} else {
		buf_puts(sc, "{}");
	}
	cr.input_len = sc->len - input_off;
	buf_putc(sc, '\0');
	if (b.steps != NULL) {
		steps_off = sc->len;
		if (canon_write(sc, b.steps, &e) < 0) {
			handler_problem(resp, req, P_INVALID_JSON, e.msg);
			goto out;
		}
		cr.steps_len = sc->len - steps_off;
		buf_putc(sc, '\0');
	}
	if (sc->oom) {
		handler_problem(resp, req, P_BODY_TOO_LARGE, "the body is too large to process");
		goto out;
	}
	cr.input = sc->data + input_off;
	cr.steps = b.steps != NULL ? sc->data + steps_off : NULL;

	if (b.steps != NULL || b.business_key != NULL || b.priority >= 0) {
		if (auth_settle(ctx, req, resp) < 0)
			goto out;
		const struct cmd cmd = { .tx = CMD_TX_PIPELINE,
			                 .stmt = Q_WF_CREATE_RUN,
			                 .nparams = WF_CREATE_RUN__N,
			                 .params = cr.run,
			                 .fp_text = fp_text,
			                 .prepare = create_prepare,
			                 .render = render_create_run,
			                 .arg = &cr };
		cmd_run(ctx, req, resp, &cmd);
	} else {
		if (req->idem_key == NULL && auth_settle(ctx, req, resp) < 0)
			goto out;
		const struct cmd cmd = { .tx = CMD_TX_SINGLE,
			                 .stmt = create_stmt(ctx),
			                 .nparams = CREATE_KEYED__N,
			                 .params = cr.keyed,
			                 .unkeyed_stmt = Q_CREATE_UNKEYED,
			                 .unkeyed_nparams = CREATE_UNKEYED__N,
			                 .unkeyed_params = cr.unkeyed,
			                 .fp_text = fp_text,
			                 .prepare = create_prepare,
			                 .checked = auth_checked,
			                 .render = render_created,
			                 .arg = &cr };
		cmd_run(ctx, req, resp, &cmd);
	}
out:
	/* A 5xx stands whatever the token: a bad one writes nothing, so it
	 * cannot have caused the failure. */
	if (resp->status < 500)
		auth_settle(ctx, req, resp);
	json_object_put(root);
	buf_free(&cr.out);
	buf_free(&cr.payload);
}

/* The progress of the current step's job, Q_WF_GET's last column, in
 * canonical form after the rest of w in tmp (row_view's buffer). 0, or -1
 * with e. */
static int get_progress(struct wf_view *w, struct buf *tmp, const PGresult *res, struct err *e)
{
	const size_t input_off = (size_t)(w->input - tmp->data), start = tmp->len;
	const size_t steps_off = w->steps != NULL ? (size_t)(w->steps - tmp->data) : 0;

	if (PQgetisnull(res, 0, WF_GET_PROGRESS))
		return 0;
	if (canon_recanon(tmp, PQgetvalue(res, 0, WF_GET_PROGRESS),
	                  (size_t)PQgetlength(res, 0, WF_GET_PROGRESS), e) < 0)
		return err_set(e, ERR_INTERNAL, "stored progress of workflow %s is not valid JSON",
		               w->id);
	if (tmp->oom)
		return err_set(e, ERR_INTERNAL, "out of memory");
	/* The buffer may have moved: the view points into it. */
	w->input = tmp->data + input_off;
	if (w->steps != NULL)
		w->steps = tmp->data + steps_off;
	w->progress = tmp->data + start;
	w->progress_len = tmp->len - start;
	return 0;
}

void wf_get(struct handler_ctx *ctx, struct http_req *req, const char *id, struct http_resp *resp)
{
	char tenant[24];
	struct wf_view w;
	struct err e;
	PGresult *res;

	if (!ids_is_uuid(id)) {
		handler_problem(resp, req, P_NOT_FOUND, "no such workflow");
		return;
	}
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	const char *p[WF_GET__N] = { [WF_GET_TENANT] = tenant, [WF_GET_ID] = id };
	res = db_run(ctx->db, Q_WF_GET, WF_GET__N, p, &e);
	if (res == NULL) {
		handler_db_error(ctx, resp, req, &e);
		return;
	}
	if (PQntuples(res) == 0) {
		/* Another tenant's workflow looks exactly like a missing one. */
		handler_problem(resp, req, P_NOT_FOUND, "no such workflow");
	} else if (row_view(&w, &ctx->scratch, res, 0, 0, 0, &e) < 0 ||
	           get_progress(&w, &ctx->scratch, res, &e) < 0) {
		handler_db_error(ctx, resp, req, &e);
	} else {
		wf_write(&resp->body, &w);
		resp->status = 200;
		resp->content_type = "application/json";
	}
	PQclear(res);
}

static int is_state(const char *s)
{
	static const char *const states[] = { "pending",   "running", "incident",  "compensating",
		                              "completed", "failed",  "cancelled", "compensated" };

	for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++)
		if (strcmp(s, states[i]) == 0)
			return 1;
	return 0;
}

static int list_item(struct handler_ctx *ctx, struct buf *out, const PGresult *res, int i,
                     struct err *e)
{
	return wf_write_row(out, &ctx->scratch, res, i, 0, 0, e);
}

/* Events are stored as the dispatcher sends them; pages show them in the
 * canonical form, like everything else the API answers, with one member
 * that a delivery does not carry: "actor", who caused the event
 * ("token:<id>", "system:reaper", or null for an event recorded before
 * actors were: sql/014_actor.sql). */
int wf_event_item(struct handler_ctx *ctx, struct buf *out, const PGresult *res, int i,
                  struct err *e)
{
	struct json_object *v;
	int rc;

	v = canon_parse(PQgetvalue(res, i, 1), (size_t)PQgetlength(res, i, 1), CANON_STORED_DEPTH,
	                e);
	if (v == NULL || !json_object_is_type(v, json_type_object)) {
		json_object_put(v);
		return err_set(e, ERR_INTERNAL, "stored event %s is not valid JSON",
		               PQgetvalue(res, i, 0));
	}
	json_object_object_add(
	    v, "actor",
	    PQgetisnull(res, i, 3) ? NULL : json_object_new_string(PQgetvalue(res, i, 3)));
	rc = canon_write(out, v, e);
	json_object_put(v);
	return rc;
}

void wf_list(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp)
{
	char tenant[24], state[16], type[WF_TYPE_MAX + 1], after[IDS_UUID_LEN + 1], lim[24];
	char budget[24];
	long limit;
	struct err e;
	PGresult *res;
	int n;

	if (page_param(req, resp, "state", state, sizeof(state)) < 0 ||
	    page_param(req, resp, "type", type, sizeof(type)) < 0 ||
	    page_param(req, resp, "after", after, sizeof(after)) < 0 ||
	    page_limit(req, resp, &limit) < 0)
		return;
	if (state[0] != '\0' && !is_state(state)) {
		handler_problem(
		    resp, req, P_INVALID_REQUEST,
		    "state must be one of pending, running, incident, compensating, completed, "
		    "failed, cancelled, compensated");
		return;
	}
	if (after[0] != '\0' && !ids_is_uuid(after)) {
		handler_problem(resp, req, P_INVALID_REQUEST,
		                "after must be the next_cursor of the previous page");
		return;
	}
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	snprintf(lim, sizeof(lim), "%ld", limit + 1);
	snprintf(budget, sizeof(budget), "%ld", ctx->conf->max_answer);
	const char *p[WF_LIST__N] = { [WF_LIST_TENANT] = tenant,
		                      [WF_LIST_STATE] = state[0] ? state : NULL,
		                      [WF_LIST_TYPE] = type[0] ? type : NULL,
		                      [WF_LIST_AFTER] = after[0] ? after : NULL,
		                      [WF_LIST_LIMIT] = lim,
		                      [WF_LIST_BUDGET] = budget };
	res = db_run(ctx->db, Q_WF_LIST, WF_LIST__N, p, &e);
	if (res == NULL) {
		handler_db_error(ctx, resp, req, &e);
		return;
	}
	n = PQntuples(res);
	page_answer(ctx, req, resp, "workflows", res, n, limit, 8, list_item);
	PQclear(res);
}

void wf_events(struct handler_ctx *ctx, struct http_req *req, const char *id,
               struct http_resp *resp)
{
	char tenant[24], after[24], lim[24], budget[24], *end;
	long limit, after_seq = 0;
	struct err e;
	PGresult *res;
	int n;

	if (!ids_is_uuid(id)) {
		handler_problem(resp, req, P_NOT_FOUND, "no such workflow");
		return;
	}
	if (page_param(req, resp, "after", after, sizeof(after)) < 0 ||
	    page_limit(req, resp, &limit) < 0)
		return;
	if (after[0] != '\0') {
		after_seq = strtol(after, &end, 10);
		if (*end != '\0' || after_seq < 0 || after_seq > 2147483647L) {
			handler_problem(resp, req, P_INVALID_REQUEST,
			                "after must be the next_cursor of the previous page");
			return;
		}
	}
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	snprintf(after, sizeof(after), "%ld", after_seq);
	snprintf(lim, sizeof(lim), "%ld", limit + 1);
	snprintf(budget, sizeof(budget), "%ld", ctx->conf->max_answer);
	const char *p[WF_EVENTS__N] = { [WF_EVENTS_TENANT] = tenant,
		                        [WF_EVENTS_ID] = id,
		                        [WF_EVENTS_AFTER] = after,
		                        [WF_EVENTS_LIMIT] = lim,
		                        [WF_EVENTS_BUDGET] = budget };
	res = db_run(ctx->db, Q_WF_EVENTS, WF_EVENTS__N, p, &e);
	if (res == NULL) {
		handler_db_error(ctx, resp, req, &e);
		return;
	}
	n = PQntuples(res);
	if (n == 0) {
		handler_problem(resp, req, P_NOT_FOUND, "no such workflow");
		PQclear(res);
		return;
	}
	if (PQgetisnull(res, 0, 0))
		n = 0;
	page_answer(ctx, req, resp, "events", res, n, limit, 2, wf_event_item);
	PQclear(res);
}

static int render_transition(struct handler_ctx *ctx, const struct http_req *req,
                             struct http_resp *resp, const PGresult *res, const struct cmd *c,
                             struct err *e)
{
	resp->status = 200;
	resp->content_type = "application/json";
	return wf_write_row(&resp->body, &ctx->body, res, 0, 3, 0, e);
}

void wf_transition(struct handler_ctx *ctx, struct http_req *req, const char *id,
                   struct http_resp *resp)
{
	static const char *const members[] = { "to", "from", NULL };
	struct json_object *root;
	const char *to, *from;
	char tenant[24], detail[300], fp_text[IDEM_FP_TEXT];

	root = cmd_read_json(ctx, req, resp, 0);
	if (root == NULL)
		return;
	if (cmd_members(root, members, detail, sizeof(detail)) < 0 ||
	    cmd_text(root, "to", 1, 16, &to, detail, sizeof(detail)) < 0 ||
	    cmd_text(root, "from", 0, 16, &from, detail, sizeof(detail)) < 0) {
		handler_problem(resp, req, P_INVALID_REQUEST, detail);
		goto out;
	}
	if (!is_state(to) || (from != NULL && !is_state(from))) {
		snprintf(
		    detail, sizeof(detail),
		    "unknown state \"%s\": a workflow is pending, running, incident, compensating, "
		    "completed, failed, cancelled or compensated",
		    is_state(to) ? from : to);
		handler_problem(resp, req, P_INVALID_REQUEST, detail);
		goto out;
	}
	if (!ids_is_uuid(id)) {
		handler_problem(resp, req, P_NOT_FOUND, "no such workflow");
		goto out;
	}
	if (cmd_fingerprint(ctx, req, resp, root, fp_text) < 0)
		goto out;
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	const char *p[WF_TRANSITION__N] = { [WF_TRANSITION_TENANT] = tenant,
		                            [WF_TRANSITION_ID] = id,
		                            [WF_TRANSITION_TO] = to,
		                            [WF_TRANSITION_FROM] = from };
	const struct cmd cmd = { .stmt = Q_WF_TRANSITION,
		                 .nparams = WF_TRANSITION__N,
		                 .params = p,
		                 .fp_text = fp_text,
		                 .render = render_transition };
	cmd_run(ctx, req, resp, &cmd);
out:
	json_object_put(root);
}

void wf_resume(struct handler_ctx *ctx, struct http_req *req, const char *id,
               struct http_resp *resp)
{
	static const char *const members[] = { "retries", NULL };
	struct json_object *root;
	long retries;
	char tenant[24], nretries[16], detail[300], fp_text[IDEM_FP_TEXT];

	root = cmd_read_json(ctx, req, resp, 0);
	if (root == NULL)
		return;
	if (cmd_members(root, members, detail, sizeof(detail)) < 0 ||
	    cmd_int(root, "retries", 0, WF_RETRIES_MAX, -1, &retries, detail, sizeof(detail)) < 0) {
		handler_problem(resp, req, P_INVALID_REQUEST, detail);
		goto out;
	}
	if (!ids_is_uuid(id)) {
		handler_problem(resp, req, P_NOT_FOUND, "no such workflow");
		goto out;
	}
	if (cmd_fingerprint(ctx, req, resp, root, fp_text) < 0)
		goto out;
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	snprintf(nretries, sizeof(nretries), "%ld", retries);
	/* Without "retries", the failed step's own count from its definition. */
	const char *p[WF_RESUME__N] = { [WF_RESUME_TENANT] = tenant,
		                        [WF_RESUME_ID] = id,
		                        [WF_RESUME_RETRIES] = retries >= 0 ? nretries : NULL };
	const struct cmd cmd = { .stmt = Q_WF_RESUME,
		                 .nparams = WF_RESUME__N,
		                 .params = p,
		                 .fp_text = fp_text,
		                 .render = render_transition };
	cmd_run(ctx, req, resp, &cmd);
out:
	json_object_put(root);
}
