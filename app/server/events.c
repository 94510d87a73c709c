/*
 * events.c - the event feed, one event's deliveries, an endpoint's attempt
 * ledger and undelivered events, and recover and resend (see events.h).
 *
 * The reads page as the other lists do (page.h): keyset cursors, at most
 * limit items and max_answer bytes. The two commands run a database
 * function (sql/022_recover.sql) through the keyed runner (cmd.h), so a
 * retry under the same Idempotency-Key replays the stored answer and sets
 * nothing pending a second time.
 */
#include "server/events.h"

#include "config.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/canon.h"
#include "core/ids.h"
#include "core/iso8601.h"
#include "server/cmd.h"
#include "server/page.h"
#include "server/queries.h"
#include "server/wf.h"

/* An event id, "<stream uuid>.<seq>" (wf.c), is at most this long. */
#define EVENTS_ID_MAX (IDS_UUID_LEN + 11)
/* The types of a recover: as an endpoint's filter_types (020_endpoints.sql). */
#define EVENTS_TYPES_MAX 64
#define EVENTS_TYPE_MAX  128
/* An array parameter in text form: {"a","b"} with its quotes and commas. */
#define EVENTS_TYPES_TEXT (EVENTS_TYPES_MAX * (EVENTS_TYPE_MAX * 2 + 3) + 3)

/* Is id an event id ("<uuid>.<seq>", seq 1 to 2^31 - 1)? When it is and
 * stream is not NULL, the uuid goes to stream and the seq to *seq. */
static int parse_event_id(const char *id, char stream[IDS_UUID_LEN + 1], long *seq)
{
	char uuid[IDS_UUID_LEN + 1], *end;
	size_t len = strlen(id);
	long n;

	if (len < IDS_UUID_LEN + 2 || len > EVENTS_ID_MAX || id[IDS_UUID_LEN] != '.')
		return 0;
	memcpy(uuid, id, IDS_UUID_LEN);
	uuid[IDS_UUID_LEN] = '\0';
	if (!ids_is_uuid(uuid) || id[IDS_UUID_LEN + 1] < '1' || id[IDS_UUID_LEN + 1] > '9')
		return 0;
	n = strtol(id + IDS_UUID_LEN + 1, &end, 10);
	if (*end != '\0' || n > 2147483647L)
		return 0;
	if (stream != NULL) {
		memcpy(stream, uuid, IDS_UUID_LEN + 1);
		*seq = n;
	}
	return 1;
}

static void write_text(struct buf *out, const char *name, const PGresult *res, int i, int col)
{
	buf_printf(out, ",\"%s\":", name);
	if (PQgetisnull(res, i, col))
		buf_puts(out, "null");
	else
		canon_write_string(out, PQgetvalue(res, i, col), (size_t)PQgetlength(res, i, col));
}

/* A delivery from row i: columns (endpoint or event, event or endpoint,
 * state, attempts, next_attempt_at, last_error, updated_at). */
static void write_delivery(struct buf *out, const PGresult *res, int i, int endpoint_col,
                           int event_col)
{
	buf_printf(out, "{\"endpoint_id\":\"%s\"", PQgetvalue(res, i, endpoint_col));
	write_text(out, "event_id", res, i, event_col);
	write_text(out, "state", res, i, 2);
	buf_printf(out, ",\"attempts\":%s", PQgetvalue(res, i, 3));
	write_text(out, "next_attempt_at", res, i, 4);
	write_text(out, "last_error", res, i, 5);
	write_text(out, "updated_at", res, i, 6);
	buf_putc(out, '}');
}

static int delivery_item(struct handler_ctx *ctx, struct buf *out, const PGresult *res, int i,
                         struct err *e)
{
	write_delivery(out, res, i, 0, 1);
	return 0;
}

static int undelivered_item(struct handler_ctx *ctx, struct buf *out, const PGresult *res, int i,
                            struct err *e)
{
	write_delivery(out, res, i, 1, 0);
	return 0;
}

/* An attempt from Q_ENDPOINT_ATTEMPTS's row i. */
static int attempt_item(struct handler_ctx *ctx, struct buf *out, const PGresult *res, int i,
                        struct err *e)
{
	buf_printf(out, "{\"id\":%s", PQgetvalue(res, i, 0));
	write_text(out, "event_id", res, i, 1);
	write_text(out, "trigger", res, i, 2);
	write_text(out, "started_at", res, i, 3);
	buf_printf(out, ",\"duration_ms\":%s,\"status\":%s", PQgetvalue(res, i, 4),
	           PQgetvalue(res, i, 5));
	write_text(out, "outcome", res, i, 6);
	write_text(out, "response", res, i, 7);
	buf_putc(out, '}');
	return 0;
}

/* A non-negative integer cursor within [0, max] into *out; 0 when absent.
 * Returns 0, or -1 with resp filled (422). */
static int int_cursor(const struct http_req *req, struct http_resp *resp, const char *text,
                      long long max, long long *out)
{
	char *end;

	*out = 0;
	if (text[0] == '\0')
		return 0;
	*out = strtoll(text, &end, 10);
	if (*end != '\0' || end == text || *out < 0 || *out > max) {
		handler_problem(resp, req, P_INVALID_REQUEST,
		                "after must be the next_cursor of the previous page");
		return -1;
	}
	return 0;
}

void events_feed(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp)
{
	char tenant[24], after[24], lim[24], budget[24], scan[24];
	long long after_id;
	long limit;
	const char *resume = NULL;
	struct err e;
	PGresult *res;
	int n;

	if (page_param(req, resp, "after", after, sizeof(after)) < 0 ||
	    page_limit(req, resp, &limit) < 0 ||
	    int_cursor(req, resp, after, 9223372036854775807LL, &after_id) < 0)
		return;
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	snprintf(after, sizeof(after), "%lld", after_id);
	snprintf(lim, sizeof(lim), "%ld", limit + 1);
	snprintf(budget, sizeof(budget), "%ld", ctx->conf->max_answer);
	snprintf(scan, sizeof(scan), "%d", EVENTS_SCAN_ROWS);
	const char *p[EVENTS_FEED__N] = { [EVENTS_FEED_TENANT] = tenant,
		                          [EVENTS_FEED_AFTER] = after,
		                          [EVENTS_FEED_LIMIT] = lim,
		                          [EVENTS_FEED_BUDGET] = budget,
		                          [EVENTS_FEED_SCAN] = scan };
	res = db_run(ctx->db, Q_EVENTS_FEED, EVENTS_FEED__N, p, &e);
	if (res == NULL) {
		handler_db_error(ctx, resp, req, &e);
		return;
	}
	n = PQntuples(res);
	/* The scan's last row: where the next page starts when every event
	 * of the tenant in this one is shown. */
	if (n > 0 && PQgetisnull(res, n - 1, 1)) {
		n--;
		resume = PQgetvalue(res, n, 0);
	}
	page_answer_from(ctx, req, resp, "events", res, n, limit, 2, wf_event_item, resume);
	PQclear(res);
}

/* The rows of a list under one resource: no row is a 404 (what), one row
 * of NULLs an empty page. */
static void answer_list(struct handler_ctx *ctx, const struct http_req *req, struct http_resp *resp,
                        PGresult *res, const struct err *e, const char *what, const char *name,
                        long limit, int within_col, page_item_fn item)
{
	int n;

	if (res == NULL) {
		handler_db_error(ctx, resp, req, e);
		return;
	}
	n = PQntuples(res);
	if (n == 0)
		handler_problem(resp, req, P_NOT_FOUND, what);
	else
		page_answer(ctx, req, resp, name, res, PQgetisnull(res, 0, 0) ? 0 : n, limit,
		            within_col, item);
	PQclear(res);
}

void events_deliveries(struct handler_ctx *ctx, struct http_req *req, const char *id,
                       struct http_resp *resp)
{
	char tenant[24], after[IDS_UUID_LEN + 1], lim[24], budget[24];
	long limit;
	struct err e;
	PGresult *res;

	if (!parse_event_id(id, NULL, NULL)) {
		handler_problem(resp, req, P_NOT_FOUND, "no such event");
		return;
	}
	if (page_param(req, resp, "after", after, sizeof(after)) < 0 ||
	    page_limit(req, resp, &limit) < 0)
		return;
	if (after[0] != '\0' && !ids_is_uuid(after)) {
		handler_problem(resp, req, P_INVALID_REQUEST,
		                "after must be the next_cursor of the previous page");
		return;
	}
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	snprintf(lim, sizeof(lim), "%ld", limit + 1);
	snprintf(budget, sizeof(budget), "%ld", ctx->conf->max_answer);
	const char *p[EVENT_DELIVERIES__N] = { [EVENT_DELIVERIES_TENANT] = tenant,
		                               [EVENT_DELIVERIES_EVENT] = id,
		                               [EVENT_DELIVERIES_AFTER] = after[0] ? after : NULL,
		                               [EVENT_DELIVERIES_LIMIT] = lim,
		                               [EVENT_DELIVERIES_BUDGET] = budget };
	res = db_run(ctx->db, Q_EVENT_DELIVERIES, EVENT_DELIVERIES__N, p, &e);
	answer_list(ctx, req, resp, res, &e, "no such event", "deliveries", limit, 7,
	            delivery_item);
}

void events_attempts(struct handler_ctx *ctx, struct http_req *req, const char *id,
                     struct http_resp *resp)
{
	char tenant[24], after[24], status[16], code[8], lim[24], budget[24];
	const char *outcome = NULL, *http_status = NULL;
	long long before;
	long limit;
	struct err e;
	PGresult *res;

	if (!ids_is_uuid(id)) {
		handler_problem(resp, req, P_NOT_FOUND, "no such endpoint");
		return;
	}
	if (page_param(req, resp, "after", after, sizeof(after)) < 0 ||
	    page_param(req, resp, "status", status, sizeof(status)) < 0 ||
	    page_limit(req, resp, &limit) < 0 ||
	    int_cursor(req, resp, after, 9223372036854775807LL, &before) < 0)
		return;
	if (strcmp(status, "succeeded") == 0 || strcmp(status, "failed") == 0) {
		outcome = status;
	} else if (status[0] != '\0') {
		char *end;
		long s = strtol(status, &end, 10);
		if (*end != '\0' || end - status != 3 || s < 100 || s > 599) {
			handler_problem(resp, req, P_INVALID_REQUEST,
			                "status must be succeeded, failed, or an HTTP status code "
			                "from 100 to 599");
			return;
		}
		snprintf(code, sizeof(code), "%ld", s);
		http_status = code;
	}
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	snprintf(lim, sizeof(lim), "%ld", limit + 1);
	snprintf(budget, sizeof(budget), "%ld", ctx->conf->max_answer);
	const char *p[ENDPOINT_ATTEMPTS__N] = { [ENDPOINT_ATTEMPTS_TENANT] = tenant,
		                                [ENDPOINT_ATTEMPTS_ENDPOINT] = id,
		                                [ENDPOINT_ATTEMPTS_BEFORE] =
		                                    after[0] ? after : NULL,
		                                [ENDPOINT_ATTEMPTS_OUTCOME] = outcome,
		                                [ENDPOINT_ATTEMPTS_STATUS] = http_status,
		                                [ENDPOINT_ATTEMPTS_LIMIT] = lim,
		                                [ENDPOINT_ATTEMPTS_BUDGET] = budget };
	res = db_run(ctx->db, Q_ENDPOINT_ATTEMPTS, ENDPOINT_ATTEMPTS__N, p, &e);
	answer_list(ctx, req, resp, res, &e, "no such endpoint", "attempts", limit, 8,
	            attempt_item);
}

/* The states a recover sets pending again. */
static int state_ok(const char *s)
{
	return strcmp(s, "dead") == 0 || strcmp(s, "skipped") == 0;
}

void events_undelivered(struct handler_ctx *ctx, struct http_req *req, const char *id,
                        struct http_resp *resp)
{
	char tenant[24], after[EVENTS_ID_MAX + 2], state[16], states[40], stream[IDS_UUID_LEN + 1];
	char seq_text[24], lim[24], budget[24];
	long seq = 0, limit;
	struct err e;
	PGresult *res;

	if (!ids_is_uuid(id)) {
		handler_problem(resp, req, P_NOT_FOUND, "no such endpoint");
		return;
	}
	if (page_param(req, resp, "after", after, sizeof(after)) < 0 ||
	    page_param(req, resp, "state", state, sizeof(state)) < 0 ||
	    page_limit(req, resp, &limit) < 0)
		return;
	if (after[0] != '\0' && !parse_event_id(after, stream, &seq)) {
		handler_problem(resp, req, P_INVALID_REQUEST,
		                "after must be the next_cursor of the previous page");
		return;
	}
	if (state[0] == '\0')
		snprintf(states, sizeof(states), "{pending,dead,skipped}");
	else if (strcmp(state, "pending") == 0 || state_ok(state))
		snprintf(states, sizeof(states), "{%s}", state);
	else {
		handler_problem(resp, req, P_INVALID_REQUEST,
		                "state must be one of pending, dead, skipped");
		return;
	}
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	snprintf(seq_text, sizeof(seq_text), "%ld", seq);
	snprintf(lim, sizeof(lim), "%ld", limit + 1);
	snprintf(budget, sizeof(budget), "%ld", ctx->conf->max_answer);
	const char *p[ENDPOINT_UNDELIVERED__N] = { [ENDPOINT_UNDELIVERED_TENANT] = tenant,
		                                   [ENDPOINT_UNDELIVERED_ENDPOINT] = id,
		                                   [ENDPOINT_UNDELIVERED_AFTER_STREAM] =
		                                       after[0] ? stream : NULL,
		                                   [ENDPOINT_UNDELIVERED_AFTER_SEQ] =
		                                       after[0] ? seq_text : NULL,
		                                   [ENDPOINT_UNDELIVERED_STATES] = states,
		                                   [ENDPOINT_UNDELIVERED_LIMIT] = lim,
		                                   [ENDPOINT_UNDELIVERED_BUDGET] = budget };
	res = db_run(ctx->db, Q_ENDPOINT_UNDELIVERED, ENDPOINT_UNDELIVERED__N, p, &e);
	answer_list(ctx, req, resp, res, &e, "no such endpoint", "deliveries", limit, 7,
	            undelivered_item);
}

/* --- The commands ------------------------------------------------------ */

static int render_resend(struct handler_ctx *ctx, const struct http_req *req,
                         struct http_resp *resp, const PGresult *res, const struct cmd *c,
                         struct err *e)
{
	if (PQntuples(res) != 1)
		return err_set(e, ERR_INTERNAL, "idemflow_event_resend returned %d rows",
		               PQntuples(res));
	resp->status = 200;
	resp->content_type = "application/json";
	/* Columns 2..8: endpoint, event, then as write_delivery's. */
	buf_printf(&resp->body, "{\"endpoint_id\":\"%s\"", PQgetvalue(res, 0, 2));
	write_text(&resp->body, "event_id", res, 0, 3);
	write_text(&resp->body, "state", res, 0, 4);
	buf_printf(&resp->body, ",\"attempts\":%s", PQgetvalue(res, 0, 5));
	write_text(&resp->body, "next_attempt_at", res, 0, 6);
	write_text(&resp->body, "last_error", res, 0, 7);
	write_text(&resp->body, "updated_at", res, 0, 8);
	buf_putc(&resp->body, '}');
	return 0;
}

void events_resend(struct handler_ctx *ctx, struct http_req *req, const char *id,
                   struct http_resp *resp)
{
	static const char *const members[] = { "endpoint_id", NULL };
	struct json_object *root;
	const char *endpoint;
	char tenant[24], detail[300], fp_text[IDEM_FP_TEXT];

	root = cmd_read_json(ctx, req, resp, 1);
	if (root == NULL)
		return;
	if (cmd_members(root, members, detail, sizeof(detail)) < 0 ||
	    cmd_text(root, "endpoint_id", 1, IDS_UUID_LEN, &endpoint, detail, sizeof(detail)) < 0) {
		handler_problem(resp, req, P_INVALID_REQUEST, detail);
		goto out;
	}
	if (!ids_is_uuid(endpoint)) {
		handler_problem(resp, req, P_INVALID_REQUEST, "\"endpoint_id\" must be a UUID");
		goto out;
	}
	if (!parse_event_id(id, NULL, NULL)) {
		handler_problem(resp, req, P_NOT_FOUND, "no such event");
		goto out;
	}
	if (cmd_fingerprint(ctx, req, resp, root, fp_text) < 0)
		goto out;
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	const char *p[EVENT_RESEND__N] = { [EVENT_RESEND_TENANT] = tenant,
		                           [EVENT_RESEND_EVENT] = id,
		                           [EVENT_RESEND_ENDPOINT] = endpoint };
	const struct cmd cmd = { .stmt = Q_EVENT_RESEND,
		                 .nparams = EVENT_RESEND__N,
		                 .params = p,
		                 .fp_text = fp_text,
		                 .render = render_resend };
	cmd_run(ctx, req, resp, &cmd);
out:
	json_object_put(root);
}

static int render_recover(struct handler_ctx *ctx, const struct http_req *req,
                          struct http_resp *resp, const PGresult *res, const struct cmd *c,
                          struct err *e)
{
	if (PQntuples(res) != 1)
		return err_set(e, ERR_INTERNAL, "idemflow_endpoint_recover returned %d rows",
		               PQntuples(res));
	resp->status = 200;
	resp->content_type = "application/json";
	buf_printf(&resp->body, "{\"recovered\":%s}", PQgetvalue(res, 0, 2));
	return 0;
}

/* An RFC 3339 member of root into *out (borrowed), *us its instant; absent
 * leaves *out NULL. Returns 0, or -1 with detail. */
static int time_member(struct json_object *root, const char *name, int required, const char **out,
                       int64_t *us, char *detail, size_t dlen)
{
	char why[128];

	if (cmd_text(root, name, required, 64, out, detail, dlen) < 0)
		return -1;
	if (*out != NULL && iso8601_time(*out, us, why, sizeof(why)) < 0) {
		snprintf(detail, dlen, "\"%s\" must be an RFC 3339 time: %s", name, why);
		return -1;
	}
	return 0;
}

/*
 * The array member name of root, of 1 to max strings each allowed by ok,
 * as a PostgreSQL array's text into out (outlen bytes): {"a","b"}. Absent:
 * *present 0. Returns 0, or -1 with detail.
 */
static int text_array(struct json_object *root, const char *name, size_t max, size_t item_max,
                      int (*ok)(const char *), const char *what, char *out, size_t outlen,
                      int *present, char *detail, size_t dlen)
{
	struct json_object *v;
	size_t n, len = 0;

	*present = 0;
	if (!json_object_object_get_ex(root, name, &v) || v == NULL)
		return 0;
	if (!json_object_is_type(v, json_type_array) || (n = json_object_array_length(v)) < 1 ||
	    n > max) {
		snprintf(detail, dlen, "\"%s\" must be an array of 1 to %zu %s", name, max, what);
		return -1;
	}
	len += (size_t)snprintf(out + len, outlen - len, "{");
	for (size_t i = 0; i < n; i++) {
		struct json_object *s = json_object_array_get_idx(v, i);
		const char *t;
		if (!json_object_is_type(s, json_type_string) ||
		    json_object_get_string_len(s) < 1 ||
		    (size_t)json_object_get_string_len(s) > item_max ||
		    !ok(t = json_object_get_string(s))) {
			snprintf(detail, dlen, "\"%s\"[%zu] is not one of %s", name, i, what);
			return -1;
		}
		/* Checked to hold no quote, backslash or control character. */
		len += (size_t)snprintf(out + len, outlen - len, "%s\"%s\"", i ? "," : "", t);
	}
	snprintf(out + len, outlen - len, "}");
	*present = 1;
	return 0;
}

/* An event type or a "prefix.*" glob: printable ASCII, no quote or
 * backslash, a '*' only as the glob's last character after a dot. */
static int type_ok(const char *s)
{
	size_t len = strlen(s);

	for (size_t i = 0; i < len; i++) {
		unsigned char ch = (unsigned char)s[i];
		if (ch <= 0x20 || ch >= 0x7f || ch == '"' || ch == '\\' || ch == ',' || ch == '{' ||
		    ch == '}')
			return 0;
		if (ch == '*' && (i != len - 1 || i == 0 || s[i - 1] != '.'))
			return 0;
	}
	return 1;
}

void events_recover(struct handler_ctx *ctx, struct http_req *req, const char *id,
                    struct http_resp *resp)
{
	static const char *const members[] = { "since", "until", "types", "states", NULL };
	struct json_object *root;
	const char *since, *until;
	int64_t since_us = 0, until_us = 0;
	char tenant[24], detail[300], fp_text[IDEM_FP_TEXT], states[40];
	char types[EVENTS_TYPES_TEXT];
	int has_types, has_states;

	root = cmd_read_json(ctx, req, resp, 1);
	if (root == NULL)
		return;
	if (cmd_members(root, members, detail, sizeof(detail)) < 0 ||
	    time_member(root, "since", 1, &since, &since_us, detail, sizeof(detail)) < 0 ||
	    time_member(root, "until", 0, &until, &until_us, detail, sizeof(detail)) < 0 ||
	    text_array(root, "types", EVENTS_TYPES_MAX, EVENTS_TYPE_MAX, type_ok,
	               "event types or \"prefix.*\" globs", types, sizeof(types), &has_types,
	               detail, sizeof(detail)) < 0 ||
	    text_array(root, "states", 2, 16, state_ok, "\"dead\", \"skipped\"", states,
	               sizeof(states), &has_states, detail, sizeof(detail)) < 0) {
		handler_problem(resp, req, P_INVALID_REQUEST, detail);
		goto out;
	}
	if (until != NULL && until_us <= since_us) {
		handler_problem(resp, req, P_INVALID_REQUEST, "\"until\" must be after \"since\"");
		goto out;
	}
	if (!ids_is_uuid(id)) {
		handler_problem(resp, req, P_NOT_FOUND, "no such endpoint");
		goto out;
	}
	if (cmd_fingerprint(ctx, req, resp, root, fp_text) < 0)
		goto out;
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	const char *p[ENDPOINT_RECOVER__N] = { [ENDPOINT_RECOVER_TENANT] = tenant,
		                               [ENDPOINT_RECOVER_ENDPOINT] = id,
		                               [ENDPOINT_RECOVER_SINCE] = since,
		                               [ENDPOINT_RECOVER_UNTIL] = until,
		                               [ENDPOINT_RECOVER_TYPES] = has_types ? types : NULL,
		                               [ENDPOINT_RECOVER_STATES] =
		                                   has_states ? states : "{dead,skipped}" };
	const struct cmd cmd = { .stmt = Q_ENDPOINT_RECOVER,
		                 .nparams = ENDPOINT_RECOVER__N,
		                 .params = p,
		                 .fp_text = fp_text,
		                 .render = render_recover };
	cmd_run(ctx, req, resp, &cmd);
out:
	json_object_put(root);
}
