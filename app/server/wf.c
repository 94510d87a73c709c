/*
 * wf.c - workflows: create, read, list, history, transitions, resumes,
 * messages.
 *
 * A plain keyed create (no steps, no business key) is one SQL statement
 * (Q_CREATE_KEYED), so the key row with its stored response, the workflow
 * row and its workflow.created event commit together or not at all, in
 * one round trip. The workflow id and created_at are made here, before the
 * statement, so the response body can be stored by the same statement that
 * creates what it describes. A create with steps or a business key, and
 * every other command, runs a database function through cmd.c.
 */
#include "server/wf.h"

#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/canon.h"
#include "core/fp.h"
#include "core/ids.h"
#include "core/iso8601.h"
#include "server/cmd.h"
#include "server/queries.h"

#define WF_TYPE_MAX         128
#define WF_NAME_MAX         64
#define WF_STEPS_MAX        32 /* as JOBS_STEP_MAX */
#define WF_BUSINESS_KEY_MAX 255
#define WF_RETRIES_MAX      100
#define WF_PAGE_DEFAULT     100
#define WF_PAGE_MAX         1000
#define WF_GET_PROGRESS     8      /* Q_WF_GET's column after the workflow's */
#define WF_MESSAGE_TTL      "PT1H" /* a published message's ttl when none is given */

/* The members of a create body; all borrowed from the parsed body. */
struct wf_body {
	struct json_object *type;
	struct json_object *input;
	struct json_object *steps;
	const char *business_key;
};

/* A job step's failure policy: "on_failure" is "fail" (the default: the
 * workflow fails once the retries are used up) or "incident" (it waits in
 * incident for a resume); "resumable" (boolean) lets a failed workflow be
 * resumed at this step. *on_failure: the member, or NULL when absent. */
static int validate_failure(struct json_object *st, const char **on_failure, char *why, size_t wlen)
{
	struct json_object *v;

	if (cmd_text(st, "on_failure", 0, 16, on_failure, why, wlen) < 0)
		return -1;
	if (*on_failure != NULL && strcmp(*on_failure, "fail") != 0 &&
	    strcmp(*on_failure, "incident") != 0) {
		snprintf(why, wlen, "\"on_failure\" is \"fail\" or \"incident\"");
		return -1;
	}
	if (json_object_object_get_ex(st, "resumable", &v) &&
	    !json_object_is_type(v, json_type_boolean)) {
		snprintf(why, wlen, "\"resumable\" must be true or false");
		return -1;
	}
	return 0;
}

/* The longest wait, sleep or message ttl: about ten years. */
#define WF_DURATION_MAX_DAYS 3650L

/*
 * A duration of at most WF_DURATION_MAX_DAYS (whole days: P3650DT23H
 * passes), or an RFC 3339 time: what iso8601.h reads, which PostgreSQL
 * reads too. Returns 0, or -1 with why.
 */
static int check_time(const char *v, int is_time, char *why, size_t wlen)
{
	int64_t us;

	if (is_time)
		return iso8601_time(v, NULL, why, wlen);
	if (iso8601_duration(v, &us, why, wlen) < 0)
		return -1;
	if (us / (86400LL * 1000000LL) > WF_DURATION_MAX_DAYS) {
		snprintf(why, wlen, "at most P%ldD", WF_DURATION_MAX_DAYS);
		return -1;
	}
	return 0;
}

/*
 * The duration (or, when is_time, the time) member name of st, if present,
 * into *out (borrowed from st; NULL when absent): 0, or -1 with detail
 * filled ("<where>: "<name>": why").
 */
static int check_time_member(struct json_object *st, const char *name, int is_time,
                             const char *where, const char **out, char *detail, size_t dlen)
{
	const char *v;
	char why[160];

	*out = NULL;
	if (cmd_text(st, name, 0, 64, &v, why, sizeof(why)) < 0) {
		snprintf(detail, dlen, "%s%s%s", where, where[0] ? ": " : "", why);
		return -1;
	}
	*out = v;
	if (v == NULL)
		return 0;
	if (check_time(v, is_time, why, sizeof(why)) == 0)
		return 0;
	snprintf(detail, dlen, "%s%s\"%s\": %s", where, where[0] ? ": " : "", name, why);
	return -1;
}

/* Check one step definition (index i, 0-based) against the ones before.
 * On failure *kind says how: P_INVALID_DURATION for a malformed duration
 * or time, else it is left alone (P_INVALID_WORKFLOW). */
static int validate_step(struct json_object *steps, size_t i, enum problem_kind *kind, char *detail,
                         size_t dlen)
{
	static const char *const members[] = { "name",       "job_type",  "wait_for", "retries",
		                               "sleep",      "until",     "timeout",  "on_timeout",
		                               "on_failure", "resumable", NULL };
	struct json_object *st = json_object_array_get_idx(steps, i);
	const char *name, *job_type, *wait_for, *on_timeout, *on_failure, *v;
	char why[200], where[24];
	long retries;
	int kinds;

	if (!json_object_is_type(st, json_type_object)) {
		snprintf(detail, dlen, "step %zu must be a JSON object", i + 1);
		return -1;
	}
	if (cmd_members(st, members, why, sizeof(why)) < 0 ||
	    cmd_text(st, "name", 1, WF_NAME_MAX, &name, why, sizeof(why)) < 0 ||
	    cmd_text(st, "job_type", 0, WF_TYPE_MAX, &job_type, why, sizeof(why)) < 0 ||
	    cmd_text(st, "wait_for", 0, WF_TYPE_MAX, &wait_for, why, sizeof(why)) < 0 ||
	    cmd_text(st, "on_timeout", 0, WF_NAME_MAX, &on_timeout, why, sizeof(why)) < 0 ||
	    cmd_int(st, "retries", 0, WF_RETRIES_MAX, 0, &retries, why, sizeof(why)) < 0 ||
	    validate_failure(st, &on_failure, why, sizeof(why)) < 0)
		goto bad;
	snprintf(where, sizeof(where), "step %zu", i + 1);
	if (check_time_member(st, "sleep", 0, where, &v, detail, dlen) < 0 ||
	    check_time_member(st, "until", 1, where, &v, detail, dlen) < 0 ||
	    check_time_member(st, "timeout", 0, where, &v, detail, dlen) < 0) {
		*kind = P_INVALID_DURATION;
		return -1;
	}
	kinds = (job_type != NULL) + (wait_for != NULL) +
	        json_object_object_get_ex(st, "sleep", NULL) +
	        json_object_object_get_ex(st, "until", NULL);
	if (kinds != 1) {
		snprintf(why, sizeof(why),
		         "a step has exactly one of \"job_type\", \"wait_for\", \"sleep\" and "
		         "\"until\"");
		goto bad;
	}
	if (job_type == NULL && json_object_object_get_ex(st, "retries", NULL)) {
		snprintf(why, sizeof(why), "only a job step has \"retries\"");
		goto bad;
	}
	if (job_type == NULL &&
	    (on_failure != NULL || json_object_object_get_ex(st, "resumable", NULL))) {
		snprintf(why, sizeof(why),
		         "only a job step has \"on_failure\" and \"resumable\": only a job fails");
		goto bad;
	}
	if (wait_for == NULL && (json_object_object_get_ex(st, "timeout", NULL) ||
	                         json_object_object_get_ex(st, "on_timeout", NULL))) {
		snprintf(why, sizeof(why), "only a wait step has \"timeout\" and \"on_timeout\"");
		goto bad;
	}
	if (on_timeout != NULL && !json_object_object_get_ex(st, "timeout", NULL)) {
		snprintf(why, sizeof(why), "\"on_timeout\" needs a \"timeout\"");
		goto bad;
	}
	if (on_timeout != NULL) {
		/* A later step: a step begins once, so a workflow only moves on. */
		size_t n = json_object_array_length(steps), k;
		for (k = i + 1; k < n; k++) {
			struct json_object *other = json_object_array_get_idx(steps, k), *nm;
			if (json_object_is_type(other, json_type_object) &&
			    json_object_object_get_ex(other, "name", &nm) &&
			    json_object_is_type(nm, json_type_string) &&
			    strcmp(json_object_get_string(nm), on_timeout) == 0)
				break;
		}
		if (k == n) {
			snprintf(
			    why, sizeof(why),
			    "\"on_timeout\" names no later step: \"%.64s\" is not the name of a "
			    "step after this one",
			    on_timeout);
			goto bad;
		}
	}
	for (size_t k = 0; k < i; k++) {
		struct json_object *other, *n;
		other = json_object_array_get_idx(steps, k);
		if (json_object_object_get_ex(other, "name", &n) &&
		    strcmp(json_object_get_string(n), name) == 0) {
			snprintf(why, sizeof(why), "the name \"%s\" is already step %zu's", name,
			         k + 1);
			goto bad;
		}
	}
	return 0;
bad:
	snprintf(detail, dlen, "step %zu: %s", i + 1, why);
	return -1;
}

/* Check the parsed body; on failure fill detail and return -1. */
static int validate(struct json_object *root, struct wf_body *b, enum problem_kind *kind,
                    char *detail, size_t dlen)
{
	static const char *const members[] = { "type", "input", "steps", "business_key", NULL };
	const char *type;
	size_t n;

	memset(b, 0, sizeof(*b));
	if (cmd_members(root, members, detail, dlen) < 0 ||
	    cmd_text(root, "type", 1, WF_TYPE_MAX, &type, detail, dlen) < 0 ||
	    cmd_object(root, "input", &b->input, detail, dlen) < 0 ||
	    cmd_text(root, "business_key", 0, WF_BUSINESS_KEY_MAX, &b->business_key, detail, dlen) <
	        0)
		return -1;
	json_object_object_get_ex(root, "type", &b->type);
	if (!json_object_object_get_ex(root, "steps", &b->steps) || b->steps == NULL)
		return 0;
	if (!json_object_is_type(b->steps, json_type_array)) {
		snprintf(detail, dlen, "\"steps\" must be an array");
		return -1;
	}
	n = json_object_array_length(b->steps);
	if (n == 0 || n > WF_STEPS_MAX) {
		snprintf(detail, dlen, "\"steps\" must hold 1 to %d steps", WF_STEPS_MAX);
		return -1;
	}
	for (size_t i = 0; i < n; i++)
		if (validate_step(b->steps, i, kind, detail, dlen) < 0)
			return -1;
	return 0;
}

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

/* Canonical form of stored JSON text (jsonb prints in its own style). */
static int recanon(struct buf *out, const char *text, size_t len, struct err *e)
{
	struct json_object *v = canon_parse(text, len, 1000, e);
	int rc = v != NULL ? canon_write(out, v, e) : -1;

	json_object_put(v);
	return rc;
}

/* The view of the workflow in row `row` of res, columns from `col` on as
 * wf_write_row() reads them, its JSON canonical in tmp. 0, or -1 with e. */
static int row_view(struct wf_view *view, struct buf *tmp, const PGresult *res, int row, int col,
                    int existing, struct err *e)
{
	struct wf_view w = { 0 };
	size_t input_len;

	buf_reset(tmp);
	if (recanon(tmp, PQgetvalue(res, row, col + 3), (size_t)PQgetlength(res, row, col + 3), e) <
	    0)
		return err_set(e, ERR_INTERNAL, "stored input of workflow %s is not valid JSON",
		               PQgetvalue(res, row, col));
	input_len = tmp->len;
	if (strcmp(PQgetvalue(res, row, col + 6), "[]") != 0 &&
	    recanon(tmp, PQgetvalue(res, row, col + 6), (size_t)PQgetlength(res, row, col + 6), e) <
	        0)
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
#else
	(void)ctx;
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
	char location[64], event_id[IDS_UUID_LEN + 8], stored_headers[96];
	struct buf out;             /* the response body, also stored */
	struct buf payload;         /* the workflow.created event */
	const char *keyed[CK__N];   /* Q_CREATE_KEYED */
	const char *unkeyed[CU__N]; /* Q_CREATE_UNKEYED */
	const char *run[CR__N];     /* Q_WF_CREATE_RUN */
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
	/* The event's payload around its tenant id, each part a parameter
	 * (the keyed statement knows the tenant from the token), and whole
	 * when the tenant is known: runs and unkeyed creates have their
	 * token checked before they are prepared (cmd_run). */
	struct buf *pl = &cr->payload;
	size_t tail, whole = 0;
	buf_printf(pl, EVENT_HEAD, cr->event_id, cr->id);
	buf_putc(pl, '\0');
	tail = pl->len;
	buf_printf(pl, EVENT_TAIL, cr->now);
	buf_append(pl, cr->out.data, cr->out.len);
	buf_puts(pl, "}");
	buf_putc(pl, '\0');
	if (!ctx->auth_pending) {
		whole = pl->len;
		buf_printf(pl, EVENT_HEAD "%ld" EVENT_TAIL, cr->event_id, cr->id, ctx->tenant_id,
		           cr->now);
		buf_append(pl, cr->out.data, cr->out.len);
		buf_puts(pl, "}");
	}
	if (cr->out.oom || pl->oom) {
		err_set(&e, ERR_INTERNAL, "out of memory");
		handler_db_error(ctx, resp, req, &e);
		return -1;
	}

	cr->keyed[CK_TOKEN_HASH] = ctx->token_hex;
	cr->keyed[CK_KEY] = req->idem_key;
	cr->keyed[CK_METHOD] = req->method;
	cr->keyed[CK_PATH] = req->path;
	cr->keyed[CK_FP] = cr->fp_text;
	cr->keyed[CK_HEADERS] = cr->stored_headers;
	cr->keyed[CK_BODY] = cr->out.data;
	cr->keyed[CK_CREATED_AT] = cr->now;
	cr->keyed[CK_TTL] = cr->ttl;
	cr->keyed[CK_ID] = cr->id;
	cr->keyed[CK_TYPE] = type;
	cr->keyed[CK_INPUT] = cr->input;
	cr->keyed[CK_EVENT_ID] = cr->event_id;
	cr->keyed[CK_PAYLOAD_HEAD] = pl->data;
	cr->keyed[CK_BYTES_FP] = ctx->bytes_fp;
	cr->keyed[CK_PAYLOAD_TAIL] = pl->data + tail;
	cr->keyed[CK_TRACEPARENT] = handler_traceparent(ctx);
	cr->keyed[CK_TRACESTATE] = handler_tracestate(ctx);

	cr->unkeyed[CU_TENANT] = cr->tenant;
	cr->unkeyed[CU_CREATED_AT] = cr->now;
	cr->unkeyed[CU_ID] = cr->id;
	cr->unkeyed[CU_TYPE] = type;
	cr->unkeyed[CU_INPUT] = cr->input;
	cr->unkeyed[CU_EVENT_ID] = cr->event_id;
	cr->unkeyed[CU_PAYLOAD] = pl->data + whole;

	cr->run[CR_TENANT] = cr->tenant;
	cr->run[CR_ID] = cr->id;
	cr->run[CR_TYPE] = type;
	cr->run[CR_INPUT] = cr->input;
	cr->run[CR_CREATED_AT] = cr->now;
	cr->run[CR_STEPS] = cr->steps != NULL ? cr->steps : "[]";
	cr->run[CR_BUSINESS_KEY] = b->business_key;
	cr->run[CR_PAYLOAD] = pl->data + whole;
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
	(void)ctx;
	(void)req;
	(void)res;
	(void)e;
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

	(void)req;
	if (PQntuples(res) != 1)
		return err_set(e, ERR_INTERNAL, "idemflow_wf_create returned %d rows",
		               PQntuples(res));
	if (strcmp(PQgetvalue(res, 0, 2), "created") == 0) {
		if (strcmp(PQgetvalue(res, 0, 5), "pending") == 0 &&
		    (cr->steps == NULL || strcmp(PQgetvalue(res, 0, 10), "1") == 0)) {
			answer_created(resp, cr);
			return 0;
		}
		resp->status = 201;
		resp->content_type = "application/json";
		http_resp_header(resp, "Location", cr->location);
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
 * A plain create (no steps, no business key) is one statement, keyed or
 * not (CMD_TX_SINGLE); with steps or a business key it is a database
 * function run as a command (CMD_TX_PIPELINE). Either way through the
 * keyed-command runner (cmd.h), which answers a replay before anything
 * is rendered.
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
	if (validate(root, &b, &kind, detail, sizeof(detail)) < 0) {
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

	if (b.steps != NULL || b.business_key != NULL) {
		const struct cmd cmd = { .tx = CMD_TX_PIPELINE,
			                 .stmt = Q_WF_CREATE_RUN,
			                 .nparams = CR__N,
			                 .params = cr.run,
			                 .fp_text = fp_text,
			                 .prepare = create_prepare,
			                 .render = render_create_run,
			                 .arg = &cr };
		cmd_run(ctx, req, resp, &cmd);
	} else {
		const struct cmd cmd = { .tx = CMD_TX_SINGLE,
			                 .stmt = create_stmt(ctx),
			                 .nparams = CK__N,
			                 .params = cr.keyed,
			                 .unkeyed_stmt = Q_CREATE_UNKEYED,
			                 .unkeyed_nparams = CU__N,
			                 .unkeyed_params = cr.unkeyed,
			                 .fp_text = fp_text,
			                 .prepare = create_prepare,
			                 .render = render_created,
			                 .arg = &cr };
		cmd_run(ctx, req, resp, &cmd);
	}
out:
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
	if (recanon(tmp, PQgetvalue(res, 0, WF_GET_PROGRESS),
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
	const char *p[WG__N] = { [WG_TENANT] = tenant, [WG_ID] = id };
	res = db_run(ctx->db, Q_WF_GET, WG__N, p, &e);
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

/* A query parameter into out; "" when absent. -1 with resp filled when
 * it is malformed. */
static int query_param(const struct http_req *req, struct http_resp *resp, const char *name,
                       char *out, size_t outlen)
{
	char detail[128];
	int rc = http_query_param(req->query, name, out, outlen);

	if (rc < 0) {
		snprintf(detail, sizeof(detail),
		         "query parameter \"%s\" is malformed or longer than %zu bytes", name,
		         outlen - 1);
		handler_problem(resp, req, P_INVALID_REQUEST, detail);
		return -1;
	}
	if (rc == 0)
		out[0] = '\0';
	return 0;
}

/* limit=N within 1..WF_PAGE_MAX, WF_PAGE_DEFAULT when absent. */
static int query_limit(const struct http_req *req, struct http_resp *resp, long *limit)
{
	char v[16], *end;

	if (query_param(req, resp, "limit", v, sizeof(v)) < 0)
		return -1;
	*limit = WF_PAGE_DEFAULT;
	if (v[0] == '\0')
		return 0;
	*limit = strtol(v, &end, 10);
	if (*end != '\0' || end == v || *limit < 1 || *limit > WF_PAGE_MAX) {
		handler_problem(resp, req, P_INVALID_REQUEST,
		                "limit must be an integer from 1 to 1000");
		return -1;
	}
	return 0;
}

static int is_state(const char *s)
{
	static const char *const states[] = { "pending",   "running", "incident",
		                              "completed", "failed",  "cancelled" };

	for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++)
		if (strcmp(s, states[i]) == 0)
			return 1;
	return 0;
}

/* Append row i of res to out as one item of a page; 0, or -1 with e. */
typedef int (*page_item_fn)(struct handler_ctx *ctx, struct buf *out, const PGresult *res, int i,
                            struct err *e);

/* The longest end of a page: "],"next_cursor":"<uuid>"}". */
#define PAGE_TAIL_MAX 64

/*
 * Answer 200 {"<name>":[items],"next_cursor":...} from the first rows of
 * res: at most limit items and at most max_answer bytes, the first item
 * always (so a walk always moves on, even past an item bigger than the
 * cap). The query asked for one row more than limit and stopped one row
 * past its byte budget; column within_col says whether a row starts
 * within that budget. A row left over means a next page; the cursor is
 * column 0 of the last row shown.
 */
static void answer_page(struct handler_ctx *ctx, const struct http_req *req, struct http_resp *resp,
                        const char *name, const PGresult *res, int n, long limit, int within_col,
                        page_item_fn item)
{
	const size_t cap = (size_t)ctx->conf->max_answer;
	struct buf *b = &resp->body;
	int shown = 0;
	struct err e;

	buf_printf(b, "{\"%s\":[", name);
	for (int i = 0; i < n && i < limit; i++) {
		size_t mark = b->len;
		if (i > 0 && strcmp(PQgetvalue(res, i, within_col), "t") != 0)
			break;
		if (i > 0)
			buf_putc(b, ',');
		if (item(ctx, b, res, i, &e) < 0)
			goto fail;
		if (i > 0 && b->len + PAGE_TAIL_MAX > cap) {
			buf_truncate(b, mark); /* the next page starts with it */
			break;
		}
		shown++;
	}
	if (shown < n)
		buf_printf(b, "],\"next_cursor\":\"%s\"}", PQgetvalue(res, shown - 1, 0));
	else
		buf_puts(b, "],\"next_cursor\":null}");
	if (b->oom) {
		err_set(&e, ERR_INTERNAL, "out of memory");
		goto fail;
	}
	resp->status = 200;
	resp->content_type = "application/json";
	return;
fail:
	buf_reset(b);
	handler_db_error(ctx, resp, req, &e);
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
static int event_item(struct handler_ctx *ctx, struct buf *out, const PGresult *res, int i,
                      struct err *e)
{
	struct json_object *v;
	int rc;

	(void)ctx;
	v = canon_parse(PQgetvalue(res, i, 1), (size_t)PQgetlength(res, i, 1), 1000, e);
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

	if (query_param(req, resp, "state", state, sizeof(state)) < 0 ||
	    query_param(req, resp, "type", type, sizeof(type)) < 0 ||
	    query_param(req, resp, "after", after, sizeof(after)) < 0 ||
	    query_limit(req, resp, &limit) < 0)
		return;
	if (state[0] != '\0' && !is_state(state)) {
		handler_problem(
		    resp, req, P_INVALID_REQUEST,
		    "state must be one of pending, running, incident, completed, failed, "
		    "cancelled");
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
	const char *p[WL__N] = { [WL_TENANT] = tenant,
		                 [WL_STATE] = state[0] ? state : NULL,
		                 [WL_TYPE] = type[0] ? type : NULL,
		                 [WL_AFTER] = after[0] ? after : NULL,
		                 [WL_LIMIT] = lim,
		                 [WL_BUDGET] = budget };
	res = db_run(ctx->db, Q_WF_LIST, WL__N, p, &e);
	if (res == NULL) {
		handler_db_error(ctx, resp, req, &e);
		return;
	}
	n = PQntuples(res);
	answer_page(ctx, req, resp, "workflows", res, n, limit, 8, list_item);
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
	if (query_param(req, resp, "after", after, sizeof(after)) < 0 ||
	    query_limit(req, resp, &limit) < 0)
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
	const char *p[WE__N] = { [WE_TENANT] = tenant,
		                 [WE_ID] = id,
		                 [WE_AFTER] = after,
		                 [WE_LIMIT] = lim,
		                 [WE_BUDGET] = budget };
	res = db_run(ctx->db, Q_WF_EVENTS, WE__N, p, &e);
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
	answer_page(ctx, req, resp, "events", res, n, limit, 2, event_item);
	PQclear(res);
}

static int render_transition(struct handler_ctx *ctx, const struct http_req *req,
                             struct http_resp *resp, const PGresult *res, const struct cmd *c,
                             struct err *e)
{
	(void)req;
	(void)c;
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
		    "unknown state \"%s\": a workflow is pending, running, incident, completed, "
		    "failed or cancelled",
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
	const char *p[TR__N] = {
		[TR_TENANT] = tenant, [TR_ID] = id, [TR_TO] = to, [TR_FROM] = from
	};
	const struct cmd cmd = { .stmt = Q_WF_TRANSITION,
		                 .nparams = TR__N,
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
	const char *p[RS__N] = {
		[RS_TENANT] = tenant, [RS_ID] = id, [RS_RETRIES] = retries >= 0 ? nretries : NULL
	};
	const struct cmd cmd = { .stmt = Q_WF_RESUME,
		                 .nparams = RS__N,
		                 .params = p,
		                 .fp_text = fp_text,
		                 .render = render_transition };
	cmd_run(ctx, req, resp, &cmd);
out:
	json_object_put(root);
}

static int render_message(struct handler_ctx *ctx, const struct http_req *req,
                          struct http_resp *resp, const PGresult *res, const struct cmd *c,
                          struct err *e)
{
	const char *message_id = c->arg, *outcome;

	(void)ctx;
	(void)req;
	if (PQntuples(res) != 1)
		return err_set(e, ERR_INTERNAL, "idemflow_wf_message returned %d rows",
		               PQntuples(res));
	outcome = PQgetvalue(res, 0, 2);
	resp->status = strcmp(outcome, "recorded") == 0 ? 202 : 200;
	resp->content_type = "application/json";
	buf_puts(&resp->body, "{\"message_id\":");
	canon_write_string(&resp->body, message_id, strlen(message_id));
	buf_printf(&resp->body, ",\"duplicate\":%s,\"correlated\":%s",
	           strcmp(outcome, "duplicate") == 0 ? "true" : "false",
	           PQgetisnull(res, 0, 3) ? "false" : "true");
	if (!PQgetisnull(res, 0, 3))
		buf_printf(&resp->body, ",\"step\":%s", PQgetvalue(res, 0, 3));
	buf_putc(&resp->body, '}');
	return 0;
}

void wf_message(struct handler_ctx *ctx, struct http_req *req, const char *id,
                struct http_resp *resp)
{
	static const char *const members[] = { "message_id", "name", "payload", NULL };
	struct json_object *root, *payload;
	const char *message_id, *name;
	char tenant[24], detail[300], fp_text[IDEM_FP_TEXT];
	size_t off;

	root = cmd_read_json(ctx, req, resp, 0);
	if (root == NULL)
		return;
	if (cmd_members(root, members, detail, sizeof(detail)) < 0 ||
	    cmd_text(root, "message_id", 1, 255, &message_id, detail, sizeof(detail)) < 0 ||
	    cmd_text(root, "name", 1, WF_TYPE_MAX, &name, detail, sizeof(detail)) < 0 ||
	    cmd_object(root, "payload", &payload, detail, sizeof(detail)) < 0) {
		handler_problem(resp, req, P_INVALID_REQUEST, detail);
		goto out;
	}
	if (!ids_is_uuid(id)) {
		handler_problem(resp, req, P_NOT_FOUND, "no such workflow");
		goto out;
	}
	if (cmd_fingerprint(ctx, req, resp, root, fp_text) < 0)
		goto out;
	if (cmd_json_param(ctx, req, resp, payload, &off) < 0)
		goto out;
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	const char *p[MS__N] = { [MS_TENANT] = tenant,
		                 [MS_ID] = id,
		                 [MS_MESSAGE_ID] = message_id,
		                 [MS_NAME] = name,
		                 [MS_PAYLOAD] = ctx->scratch.data + off };
	const struct cmd cmd = { .stmt = Q_WF_MESSAGE,
		                 .nparams = MS__N,
		                 .params = p,
		                 .fp_text = fp_text,
		                 .render = render_message,
		                 .arg = (void *)message_id };
	cmd_run(ctx, req, resp, &cmd);
out:
	json_object_put(root);
}

static int render_publish(struct handler_ctx *ctx, const struct http_req *req,
                          struct http_resp *resp, const PGresult *res, const struct cmd *c,
                          struct err *e)
{
	const char *message_id = c->arg, *outcome;
	int delivered;

	(void)ctx;
	(void)req;
	if (PQntuples(res) != 1)
		return err_set(e, ERR_INTERNAL, "idemflow_message_publish returned %d rows",
		               PQntuples(res));
	outcome = PQgetvalue(res, 0, 2);
	delivered = !PQgetisnull(res, 0, 3);
	resp->status = strcmp(outcome, "buffered") == 0 ? 202 : 200;
	resp->content_type = "application/json";
	buf_puts(&resp->body, "{\"message_id\":");
	canon_write_string(&resp->body, message_id, strlen(message_id));
	buf_printf(&resp->body, ",\"duplicate\":%s,\"correlated\":%s",
	           strcmp(outcome, "duplicate") == 0 ? "true" : "false",
	           delivered ? "true" : "false");
	if (delivered)
		buf_printf(&resp->body, ",\"workflow_id\":\"%s\",\"step\":%s",
		           PQgetvalue(res, 0, 3), PQgetvalue(res, 0, 4));
	else
		buf_printf(&resp->body, ",\"expires_at\":\"%s\"", PQgetvalue(res, 0, 5));
	buf_putc(&resp->body, '}');
	return 0;
}

void wf_publish(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp)
{
	static const char *const members[] = { "name", "business_key", "message_id",
		                               "ttl",  "payload",      NULL };
	struct json_object *root, *payload;
	const char *message_id, *name, *key, *ttl;
	char tenant[24], ttl_max[24], detail[300], fp_text[IDEM_FP_TEXT];
	size_t off;

	root = cmd_read_json(ctx, req, resp, 0);
	if (root == NULL)
		return;
	if (cmd_members(root, members, detail, sizeof(detail)) < 0 ||
	    cmd_text(root, "name", 1, WF_TYPE_MAX, &name, detail, sizeof(detail)) < 0 ||
	    cmd_text(root, "business_key", 1, WF_BUSINESS_KEY_MAX, &key, detail, sizeof(detail)) <
	        0 ||
	    cmd_text(root, "message_id", 1, 255, &message_id, detail, sizeof(detail)) < 0 ||
	    cmd_object(root, "payload", &payload, detail, sizeof(detail)) < 0) {
		handler_problem(resp, req, P_INVALID_REQUEST, detail);
		goto out;
	}
	if (check_time_member(root, "ttl", 0, "", &ttl, detail, sizeof(detail)) < 0) {
		handler_problem(resp, req, P_INVALID_DURATION, detail);
		goto out;
	}
	if (cmd_fingerprint(ctx, req, resp, root, fp_text) < 0)
		goto out;
	if (cmd_json_param(ctx, req, resp, payload, &off) < 0)
		goto out;
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	snprintf(ttl_max, sizeof(ttl_max), "%ld", ctx->conf->message_ttl_max);
	const char *p[MP__N] = { [MP_TENANT] = tenant,
		                 [MP_MESSAGE_ID] = message_id,
		                 [MP_NAME] = name,
		                 [MP_BUSINESS_KEY] = key,
		                 [MP_TTL] = ttl != NULL ? ttl : WF_MESSAGE_TTL,
		                 [MP_PAYLOAD] = ctx->scratch.data + off,
		                 [MP_TTL_MAX] = ttl_max };
	const struct cmd cmd = { .stmt = Q_MESSAGE_PUBLISH,
		                 .nparams = MP__N,
		                 .params = p,
		                 .fp_text = fp_text,
		                 .render = render_publish,
		                 .arg = (void *)message_id };
	cmd_run(ctx, req, resp, &cmd);
out:
	json_object_put(root);
}
