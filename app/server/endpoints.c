/*
 * endpoints.c - a tenant's endpoints and their signing secrets (see
 * endpoints.h): the body checks, the commands run through cmd.h, the
 * reads, and the one writer of an endpoint's JSON.
 *
 * An endpoint is one row (sql/020_endpoints.sql); every command is one
 * statement (queries.c, Q_ENDPOINT_*) that answers as the database
 * functions do, (problem or NULL, detail, ...), so that a missing
 * endpoint is a 404 that no key keeps. The ids and secrets are made here,
 * once the request is known not to be a replay.
 */
#include "server/endpoints.h"

#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/canon.h"
#include "core/ids.h"
#include "core/iso8601.h"
#include "server/cmd.h"
#include "server/page.h"
#include "server/queries.h"

#define ENDPOINTS_URL_MAX      2048 /* as the table's CHECK */
#define ENDPOINTS_TYPE_MAX     128  /* a filter entry */
#define ENDPOINTS_FILTER_MAX   64   /* entries, as the table's CHECK */
#define ENDPOINTS_METADATA_MAX 4096 /* bytes of canonical JSON */
#define ENDPOINTS_SECRET_BYTES 32   /* of a secret the server makes */
#define ENDPOINTS_KEY_MIN      24   /* decoded bytes of a given secret */
#define ENDPOINTS_KEY_MAX      64
/* "whsec_" and the base64 of ENDPOINTS_KEY_MAX bytes, and a NUL. */
#define ENDPOINTS_SECRET_MAX (6 + 4 * ((ENDPOINTS_KEY_MAX + 2) / 3) + 1)
#define ENDPOINTS_GRACE      "PT24H"         /* a rotation's default */
#define ENDPOINTS_GRACE_MAX  (7LL * 86400LL) /* seconds: P7D */

/* The endpoint's columns (queries.c, ENDPOINT_COLUMNS), from a row's
 * first one. */
enum {
	COL_ID,
	COL_URL,
	COL_FILTER, /* a JSON array, or NULL */
	COL_ORDERING,
	COL_DISABLED,
	COL_REASON, /* or NULL */
	COL_METADATA,
	COL_CREATED,
	COL_UPDATED,
	COL__N
};

/* The commands' first two columns: (problem, detail). */
#define CMD_COLS 2

static const char *const b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* --- Checks ------------------------------------------------------------ */

int endpoints_check_url(const char *url, char *detail, size_t dlen)
{
	size_t len = strlen(url), scheme;

	if (len == 0 || len > ENDPOINTS_URL_MAX) {
		snprintf(detail, dlen, "\"url\" must be 1 to %d bytes long", ENDPOINTS_URL_MAX);
		return -1;
	}
	for (size_t i = 0; i < len; i++) {
		unsigned char ch = (unsigned char)url[i];
		if (ch <= 0x20 || ch >= 0x7f) {
			snprintf(detail, dlen,
			         "\"url\" may hold printable ASCII only, without spaces: "
			         "percent-encode the rest (byte %zu)",
			         i + 1);
			return -1;
		}
	}
	if (strncmp(url, "https://", 8) == 0)
		scheme = 8;
	else if (strncmp(url, "http://", 7) == 0)
		scheme = 7;
	else {
		snprintf(detail, dlen, "\"url\" must start with https:// or http://");
		return -1;
	}
	if (strchr("/?#", url[scheme]) != NULL) {
		snprintf(detail, dlen, "\"url\" must name a host after %.*s", (int)scheme, url);
		return -1;
	}
	return 0;
}

static int segment_char(char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
	       ch == '_' || ch == '-';
}

int endpoints_check_type(const char *name, char *detail, size_t dlen)
{
	size_t len = strlen(name), n = len;

	if (len == 0 || len > ENDPOINTS_TYPE_MAX) {
		snprintf(detail, dlen, "a filter_types entry must be 1 to %d bytes long",
		         ENDPOINTS_TYPE_MAX);
		return -1;
	}
	/* A glob is a name followed by ".*". */
	if (len >= 2 && strcmp(name + len - 2, ".*") == 0)
		n = len - 2;
	for (size_t i = 0, seg = 0; i <= n; i++) {
		if (i == n || name[i] == '.') {
			if (seg == 0)
				goto bad;
			seg = 0;
		} else if (segment_char(name[i])) {
			seg++;
		} else {
			goto bad;
		}
	}
	if (strncmp(name, "endpoint.", 9) == 0 || strncmp(name, "delivery.", 9) == 0) {
		snprintf(
		    detail, dlen,
		    "filter_types entry \"%.128s\": endpoint.* and delivery.* events go to the "
		    "operator's sink only, never to an endpoint",
		    name);
		return -1;
	}
	return 0;
bad:
	snprintf(detail, dlen,
	         "filter_types entry \"%.128s\" is neither an event type (dot-separated parts of "
	         "letters, digits, '_' and '-', such as workflow.created) nor a glob of one "
	         "(such as workflow.*)",
	         name);
	return -1;
}

static int b64_value(char ch)
{
	const char *p = ch != '\0' ? strchr(b64, ch) : NULL;

	return p != NULL ? (int)(p - b64) : -1;
}

int endpoints_check_secret(const char *secret, char *detail, size_t dlen)
{
	const char *s;
	size_t len, pad = 0, bytes;

	if (strncmp(secret, "whsec_", 6) != 0)
		goto bad;
	s = secret + 6;
	len = strlen(s);
	if (len == 0 || len % 4 != 0)
		goto bad;
	while (pad < 2 && s[len - 1 - pad] == '=')
		pad++;
	for (size_t i = 0; i < len - pad; i++)
		if (b64_value(s[i]) < 0)
			goto bad;
	bytes = len / 4 * 3 - pad;
	if (bytes < ENDPOINTS_KEY_MIN || bytes > ENDPOINTS_KEY_MAX)
		goto bad;
	return 0;
bad:
	snprintf(detail, dlen,
	         "a secret is \"whsec_\" and the base64 (with its padding) of %d to %d random "
	         "bytes",
	         ENDPOINTS_KEY_MIN, ENDPOINTS_KEY_MAX);
	return -1;
}

/* A new secret from getrandom(2): out has ENDPOINTS_SECRET_MAX bytes. */
static int make_secret(char *out)
{
	unsigned char k[ENDPOINTS_SECRET_BYTES + 2] = { 0 };
	size_t o = 6;

	if (ids_random(k, ENDPOINTS_SECRET_BYTES) < 0)
		return -1;
	memcpy(out, "whsec_", 6);
	for (size_t i = 0; i < ENDPOINTS_SECRET_BYTES; i += 3) {
		unsigned v = (unsigned)k[i] << 16 | (unsigned)k[i + 1] << 8 | k[i + 2];
		size_t left = ENDPOINTS_SECRET_BYTES - i;
		out[o++] = b64[v >> 18 & 63];
		out[o++] = b64[v >> 12 & 63];
		out[o++] = left > 1 ? b64[v >> 6 & 63] : '=';
		out[o++] = left > 2 ? b64[v & 63] : '=';
	}
	out[o] = '\0';
	explicit_bzero(k, sizeof(k));
	return 0;
}

/*
 * filter_types: absent (*set 0), null (every type: *set 1, nothing
 * appended) or an array of 1 to 64 distinct checked entries, appended to
 * sc as a text[] literal and a NUL (*set 1, *off where it starts, *have
 * 1). Returns 0, or -1 with detail.
 */
static int filter_member(struct json_object *root, struct buf *sc, int *set, int *have, size_t *off,
                         char *detail, size_t dlen)
{
	struct json_object *v;
	size_t n;

	*set = *have = 0;
	if (!json_object_object_get_ex(root, "filter_types", &v))
		return 0;
	*set = 1;
	if (v == NULL)
		return 0;
	if (!json_object_is_type(v, json_type_array) || (n = json_object_array_length(v)) < 1 ||
	    n > ENDPOINTS_FILTER_MAX) {
		snprintf(detail, dlen,
		         "\"filter_types\" must be null (every type) or an array of 1 to %d event "
		         "types and globs",
		         ENDPOINTS_FILTER_MAX);
		return -1;
	}
	*off = sc->len;
	buf_putc(sc, '{');
	for (size_t i = 0; i < n; i++) {
		struct json_object *t = json_object_array_get_idx(v, i);
		const char *name;
		if (!json_object_is_type(t, json_type_string)) {
			snprintf(detail, dlen, "filter_types entry %zu is not a string", i + 1);
			return -1;
		}
		name = json_object_get_string(t);
		if ((size_t)json_object_get_string_len(t) != strlen(name)) {
			snprintf(detail, dlen, "filter_types entry %zu holds U+0000", i + 1);
			return -1;
		}
		if (endpoints_check_type(name, detail, dlen) < 0)
			return -1;
		for (size_t j = 0; j < i; j++) {
			if (strcmp(json_object_get_string(json_object_array_get_idx(v, j)), name) ==
			    0) {
				snprintf(detail, dlen, "filter_types names \"%s\" twice", name);
				return -1;
			}
		}
		/* Quoted: an entry "NULL" is a name, not a NULL. */
		buf_printf(sc, "%s\"%s\"", i ? "," : "", name);
	}
	buf_putc(sc, '}');
	buf_putc(sc, '\0');
	*have = 1;
	return 0;
}

/* ordering: absent (*out NULL), "workflow" or "none". */
static int ordering_member(struct json_object *root, const char **out, char *detail, size_t dlen)
{
	if (cmd_text(root, "ordering", 0, 16, out, detail, dlen) < 0)
		return -1;
	if (*out != NULL && strcmp(*out, "workflow") != 0 && strcmp(*out, "none") != 0) {
		snprintf(
		    detail, dlen,
		    "\"ordering\" is \"workflow\" (each workflow's events in order) or \"none\"");
		return -1;
	}
	return 0;
}

/* disabled: absent (*out NULL), or a boolean ("true"/"false"). */
static int disabled_member(struct json_object *root, const char **out, char *detail, size_t dlen)
{
	struct json_object *v;

	*out = NULL;
	if (!json_object_object_get_ex(root, "disabled", &v))
		return 0;
	if (v == NULL || !json_object_is_type(v, json_type_boolean)) {
		snprintf(detail, dlen, "\"disabled\" must be true or false");
		return -1;
	}
	*out = json_object_get_boolean(v) ? "true" : "false";
	return 0;
}

/* url: checked, *out borrowed from root (NULL when absent and optional). */
static int url_member(struct json_object *root, int required, const char **out, char *detail,
                      size_t dlen)
{
	if (cmd_text(root, "url", required, ENDPOINTS_URL_MAX, out, detail, dlen) < 0)
		return -1;
	return *out != NULL ? endpoints_check_url(*out, detail, dlen) : 0;
}

/*
 * metadata: absent (*have 0), or an object whose canonical form (at most
 * ENDPOINTS_METADATA_MAX bytes) goes into ctx->scratch at *off as a text
 * parameter. Returns 0; -1 with detail (a 422), or -2 when resp holds the
 * answer.
 */
static int metadata_member(struct handler_ctx *ctx, const struct http_req *req,
                           struct http_resp *resp, struct json_object *root, int *have, size_t *off,
                           char *detail, size_t dlen)
{
	struct json_object *v;

	*have = 0;
	if (!json_object_object_get_ex(root, "metadata", &v))
		return 0;
	if (v == NULL || !json_object_is_type(v, json_type_object)) {
		snprintf(detail, dlen, "\"metadata\" must be a JSON object");
		return -1;
	}
	if (cmd_json_param(ctx, req, resp, v, off) < 0)
		return -2;
	if (strlen(ctx->scratch.data + *off) > ENDPOINTS_METADATA_MAX) {
		snprintf(detail, dlen, "\"metadata\" may be at most %d bytes in canonical form",
		         ENDPOINTS_METADATA_MAX);
		return -1;
	}
	*have = 1;
	return 0;
}

/* --- Answers ----------------------------------------------------------- */

/* Append the endpoint in row i of res, its columns from col on, as JSON. */
static int write_endpoint(struct buf *out, const PGresult *res, int i, int col, struct err *e)
{
	const char *url = PQgetvalue(res, i, col + COL_URL);

	buf_printf(out, "{\"id\":\"%s\",\"url\":", PQgetvalue(res, i, col + COL_ID));
	canon_write_string(out, url, strlen(url));
	buf_puts(out, ",\"filter_types\":");
	if (PQgetisnull(res, i, col + COL_FILTER))
		buf_puts(out, "null");
	else if (canon_recanon(out, PQgetvalue(res, i, col + COL_FILTER),
	                       (size_t)PQgetlength(res, i, col + COL_FILTER), e) < 0)
		return -1;
	buf_printf(out, ",\"ordering\":\"%s\",\"disabled\":%s,\"disabled_reason\":",
	           PQgetvalue(res, i, col + COL_ORDERING),
	           strcmp(PQgetvalue(res, i, col + COL_DISABLED), "t") == 0 ? "true" : "false");
	if (PQgetisnull(res, i, col + COL_REASON))
		buf_puts(out, "null");
	else
		buf_printf(out, "\"%s\"", PQgetvalue(res, i, col + COL_REASON));
	buf_puts(out, ",\"metadata\":");
	if (canon_recanon(out, PQgetvalue(res, i, col + COL_METADATA),
	                  (size_t)PQgetlength(res, i, col + COL_METADATA), e) < 0)
		return -1;
	buf_printf(out, ",\"created_at\":\"%s\",\"updated_at\":\"%s\"}",
	           PQgetvalue(res, i, col + COL_CREATED), PQgetvalue(res, i, col + COL_UPDATED));
	if (out->oom)
		return err_set(e, ERR_INTERNAL, "out of memory");
	return 0;
}

/* One command's own: its parameters and what its answer needs. */
struct ep_cmd {
	char tenant[24];
	char id[IDS_UUID_LEN + 1];
	char grace[40];
	char secret[ENDPOINTS_SECRET_MAX];
	const char *p[ENDPOINT_UPDATE__N]; /* the largest parameter list */
	int secret_param;                  /* where a made secret goes, or -1 */
	int id_param;                      /* where a made id goes, or -1 */
};

/* Make what a command needs once it is known not to be a replay: a
 * created endpoint's id, a secret the request did not give. */
static int ep_prepare(struct handler_ctx *ctx, const struct http_req *req, struct http_resp *resp,
                      const struct cmd *c)
{
	struct ep_cmd *ec = c->arg;
	struct err e;

	if (ec->id_param >= 0) {
		if (ids_uuid7(ec->id) < 0)
			goto random;
		ec->p[ec->id_param] = ec->id;
	}
	if (ec->secret_param >= 0 && ec->p[ec->secret_param] == NULL) {
		if (make_secret(ec->secret) < 0)
			goto random;
		ec->p[ec->secret_param] = ec->secret;
	}
	return 0;
random:
	err_set(&e, ERR_INTERNAL, "could not read random bytes");
	handler_db_error(ctx, resp, req, &e);
	return -1;
}

static int one_row(const PGresult *res, const char *what, struct err *e)
{
	if (PQntuples(res) != 1)
		return err_set(e, ERR_INTERNAL, "%s returned %d rows", what, PQntuples(res));
	return 0;
}

static int render_created(struct handler_ctx *ctx, const struct http_req *req,
                          struct http_resp *resp, const PGresult *res, const struct cmd *c,
                          struct err *e)
{
	char location[64];

	/* From the row, not the id made for it: a render through a proxy
	 * may read rows made by an earlier request (cmd.c). */
	if (one_row(res, "the endpoint's insert", e) < 0)
		return -1;
	resp->status = 201;
	resp->content_type = "application/json";
	snprintf(location, sizeof(location), "/v1/endpoints/%s",
	         PQgetvalue(res, 0, CMD_COLS + COL_ID));
	http_resp_header(resp, "Location", location);
	return write_endpoint(&resp->body, res, 0, CMD_COLS, e);
}

static int render_endpoint(struct handler_ctx *ctx, const struct http_req *req,
                           struct http_resp *resp, const PGresult *res, const struct cmd *c,
                           struct err *e)
{
	if (one_row(res, "the endpoint's update", e) < 0)
		return -1;
	resp->status = 200;
	resp->content_type = "application/json";
	return write_endpoint(&resp->body, res, 0, CMD_COLS, e);
}

/* (.., .., id, deliveries, attempts) */
static int render_deleted(struct handler_ctx *ctx, const struct http_req *req,
                          struct http_resp *resp, const PGresult *res, const struct cmd *c,
                          struct err *e)
{
	if (one_row(res, "the endpoint's delete", e) < 0)
		return -1;
	resp->status = 200;
	resp->content_type = "application/json";
	buf_printf(&resp->body,
	           "{\"id\":\"%s\",\"deleted\":true,\"deliveries\":%s,\"attempts\":%s}",
	           PQgetvalue(res, 0, 2), PQgetvalue(res, 0, 3), PQgetvalue(res, 0, 4));
	return 0;
}

/* (.., .., id, previous secret's end or NULL, updated_at): the secret's
 * state without a secret, since a key stores this answer. */
static int render_secret_state(struct handler_ctx *ctx, const struct http_req *req,
                               struct http_resp *resp, const PGresult *res, const struct cmd *c,
                               struct err *e)
{
	if (one_row(res, "the secret's update", e) < 0)
		return -1;
	resp->status = 200;
	resp->content_type = "application/json";
	buf_printf(&resp->body,
	           "{\"endpoint_id\":\"%s\",\"previous_expires_at\":", PQgetvalue(res, 0, 2));
	if (PQgetisnull(res, 0, 3))
		buf_puts(&resp->body, "null");
	else
		buf_printf(&resp->body, "\"%s\"", PQgetvalue(res, 0, 3));
	buf_printf(&resp->body, ",\"updated_at\":\"%s\"}", PQgetvalue(res, 0, 4));
	return 0;
}

/* --- Routes ------------------------------------------------------------ */

/* A malformed id names no endpoint: the same 404 as a missing one. */
static int known_id(const struct http_req *req, struct http_resp *resp, const char *id)
{
	if (ids_is_uuid(id))
		return 1;
	handler_problem(resp, req, P_NOT_FOUND, "no such endpoint");
	return 0;
}

/* The body's filter_types and metadata, written into ctx->scratch at
 * *filter_off and *meta_off (see filter_member and metadata_member).
 * Returns 0; -1 with detail filled (422); -2 with resp filled. */
static int filter_and_metadata(struct handler_ctx *ctx, struct http_req *req,
                               struct http_resp *resp, struct json_object *root, int *set,
                               int *have_filter, size_t *filter_off, int *have_meta,
                               size_t *meta_off, char *detail, size_t dlen)
{
	int rc = metadata_member(ctx, req, resp, root, have_meta, meta_off, detail, dlen);

	if (rc < 0)
		return rc;
	if (filter_member(root, &ctx->scratch, set, have_filter, filter_off, detail, dlen) < 0)
		return -1;
	if (ctx->scratch.oom) {
		handler_problem(resp, req, P_BODY_TOO_LARGE, "the body is too large to process");
		return -2;
	}
	return 0;
}

void endpoints_create(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp)
{
	static const char *const members[] = { "url",      "filter_types", "ordering", "disabled",
		                               "metadata", "secret",       NULL };
	struct json_object *root;
	const char *url, *ordering, *disabled, *secret;
	char detail[400], fp_text[IDEM_FP_TEXT];
	size_t filter_off = 0, meta_off = 0;
	int set, have_filter, have_meta, rc;
	struct ep_cmd ec = { .secret_param = ENDPOINT_CREATE_SECRET,
		             .id_param = ENDPOINT_CREATE_ID };

	root = cmd_read_json(ctx, req, resp, ctx->conf->idempotency_key == IDEM_KEY_REQUIRED);
	if (root == NULL)
		return;
	if (cmd_members(root, members, detail, sizeof(detail)) < 0 ||
	    url_member(root, 1, &url, detail, sizeof(detail)) < 0 ||
	    ordering_member(root, &ordering, detail, sizeof(detail)) < 0 ||
	    disabled_member(root, &disabled, detail, sizeof(detail)) < 0 ||
	    cmd_text(root, "secret", 0, ENDPOINTS_SECRET_MAX - 1, &secret, detail, sizeof(detail)) <
	        0 ||
	    (secret != NULL && endpoints_check_secret(secret, detail, sizeof(detail)) < 0))
		goto invalid;
	if (cmd_fingerprint(ctx, req, resp, root, fp_text) < 0)
		goto out;
	rc = filter_and_metadata(ctx, req, resp, root, &set, &have_filter, &filter_off, &have_meta,
	                         &meta_off, detail, sizeof(detail));
	if (rc == -2)
		goto out;
	if (rc < 0)
		goto invalid;
	snprintf(ec.tenant, sizeof(ec.tenant), "%ld", ctx->tenant_id);
	ec.p[ENDPOINT_CREATE_TENANT] = ec.tenant;
	ec.p[ENDPOINT_CREATE_URL] = url;
	ec.p[ENDPOINT_CREATE_FILTER] = have_filter ? ctx->scratch.data + filter_off : NULL;
	ec.p[ENDPOINT_CREATE_ORDERING] = ordering != NULL ? ordering : "workflow";
	ec.p[ENDPOINT_CREATE_DISABLED] = disabled != NULL ? disabled : "false";
	ec.p[ENDPOINT_CREATE_METADATA] = have_meta ? ctx->scratch.data + meta_off : "{}";
	ec.p[ENDPOINT_CREATE_SECRET] = secret;
	ec.p[ENDPOINT_CREATE_ACTOR] = handler_actor(ctx);
	const struct cmd cmd = { .stmt = Q_ENDPOINT_CREATE,
		                 .nparams = ENDPOINT_CREATE__N,
		                 .params = ec.p,
		                 .fp_text = fp_text,
		                 .prepare = ep_prepare,
		                 .render = render_created,
		                 .arg = &ec };
	cmd_run(ctx, req, resp, &cmd);
	explicit_bzero(ec.secret, sizeof(ec.secret));
	goto out;
invalid:
	handler_problem(resp, req, P_INVALID_REQUEST, detail);
out:
	json_object_put(root);
}

void endpoints_update(struct handler_ctx *ctx, struct http_req *req, const char *id,
                      struct http_resp *resp)
{
	static const char *const members[] = { "url",      "filter_types", "ordering",
		                               "disabled", "metadata",     NULL };
	struct json_object *root;
	const char *url, *ordering, *disabled;
	char detail[400], fp_text[IDEM_FP_TEXT];
	size_t filter_off = 0, meta_off = 0;
	int set, have_filter, have_meta, rc;
	struct ep_cmd ec = { .secret_param = -1, .id_param = -1 };

	root = cmd_read_json(ctx, req, resp, 0);
	if (root == NULL)
		return;
	if (cmd_members(root, members, detail, sizeof(detail)) < 0 ||
	    url_member(root, 0, &url, detail, sizeof(detail)) < 0 ||
	    ordering_member(root, &ordering, detail, sizeof(detail)) < 0 ||
	    disabled_member(root, &disabled, detail, sizeof(detail)) < 0)
		goto invalid;
	if (json_object_object_length(root) == 0) {
		snprintf(detail, sizeof(detail),
		         "nothing to change: send one or more of url, filter_types, ordering, "
		         "disabled, metadata");
		goto invalid;
	}
	if (!known_id(req, resp, id))
		goto out;
	if (cmd_fingerprint(ctx, req, resp, root, fp_text) < 0)
		goto out;
	rc = filter_and_metadata(ctx, req, resp, root, &set, &have_filter, &filter_off, &have_meta,
	                         &meta_off, detail, sizeof(detail));
	if (rc == -2)
		goto out;
	if (rc < 0)
		goto invalid;
	snprintf(ec.tenant, sizeof(ec.tenant), "%ld", ctx->tenant_id);
	ec.p[ENDPOINT_UPDATE_TENANT] = ec.tenant;
	ec.p[ENDPOINT_UPDATE_ID] = id;
	ec.p[ENDPOINT_UPDATE_URL] = url;
	ec.p[ENDPOINT_UPDATE_FILTER_SET] = set ? "true" : "false";
	ec.p[ENDPOINT_UPDATE_FILTER] = have_filter ? ctx->scratch.data + filter_off : NULL;
	ec.p[ENDPOINT_UPDATE_ORDERING] = ordering;
	ec.p[ENDPOINT_UPDATE_DISABLED] = disabled;
	ec.p[ENDPOINT_UPDATE_METADATA] = have_meta ? ctx->scratch.data + meta_off : NULL;
	ec.p[ENDPOINT_UPDATE_ACTOR] = handler_actor(ctx);
	const struct cmd cmd = { .stmt = Q_ENDPOINT_UPDATE,
		                 .nparams = ENDPOINT_UPDATE__N,
		                 .params = ec.p,
		                 .fp_text = fp_text,
		                 .render = render_endpoint,
		                 .arg = &ec };
	cmd_run(ctx, req, resp, &cmd);
	goto out;
invalid:
	handler_problem(resp, req, P_INVALID_REQUEST, detail);
out:
	json_object_put(root);
}

/* A command on an endpoint whose body has no members, or may be left out
 * (DELETE, revoke): stmt with (tenant, id[, actor]). */
static void bare_command(struct handler_ctx *ctx, struct http_req *req, const char *id,
                         struct http_resp *resp, int stmt, int nparams, cmd_render_fn render)
{
	static const char *const members[] = { NULL };
	struct json_object *root;
	char detail[300], fp_text[IDEM_FP_TEXT];
	struct ep_cmd ec = { .secret_param = -1, .id_param = -1 };

	root = cmd_read_json_opt(ctx, req, resp, 0);
	if (root == NULL)
		return;
	if (cmd_members(root, members, detail, sizeof(detail)) < 0) {
		snprintf(detail, sizeof(detail),
		         "this request takes no members: send {} or no body");
		handler_problem(resp, req, P_INVALID_REQUEST, detail);
		goto out;
	}
	if (!known_id(req, resp, id))
		goto out;
	if (cmd_fingerprint(ctx, req, resp, root, fp_text) < 0)
		goto out;
	snprintf(ec.tenant, sizeof(ec.tenant), "%ld", ctx->tenant_id);
	ec.p[0] = ec.tenant;
	ec.p[1] = id;
	ec.p[2] = handler_actor(ctx);
	const struct cmd cmd = { .stmt = stmt,
		                 .nparams = nparams,
		                 .params = ec.p,
		                 .fp_text = fp_text,
		                 .render = render,
		                 .arg = &ec };
	cmd_run(ctx, req, resp, &cmd);
out:
	json_object_put(root);
}

void endpoints_delete(struct handler_ctx *ctx, struct http_req *req, const char *id,
                      struct http_resp *resp)
{
	bare_command(ctx, req, id, resp, Q_ENDPOINT_DELETE, ENDPOINT_GET__N, render_deleted);
}

void endpoints_revoke(struct handler_ctx *ctx, struct http_req *req, const char *id,
                      struct http_resp *resp)
{
	bare_command(ctx, req, id, resp, Q_ENDPOINT_REVOKE, ENDPOINT_REVOKE__N,
	             render_secret_state);
}

void endpoints_rotate(struct handler_ctx *ctx, struct http_req *req, const char *id,
                      struct http_resp *resp)
{
	static const char *const members[] = { "grace", "key", NULL };
	struct json_object *root;
	const char *grace, *key;
	char detail[300], why[128], fp_text[IDEM_FP_TEXT];
	int64_t us = 0;
	struct ep_cmd ec = { .secret_param = ENDPOINT_ROTATE_SECRET, .id_param = -1 };

	root = cmd_read_json_opt(ctx, req, resp, 0);
	if (root == NULL)
		return;
	if (cmd_members(root, members, detail, sizeof(detail)) < 0 ||
	    cmd_text(root, "grace", 0, 64, &grace, detail, sizeof(detail)) < 0 ||
	    cmd_text(root, "key", 0, ENDPOINTS_SECRET_MAX - 1, &key, detail, sizeof(detail)) < 0 ||
	    (key != NULL && endpoints_check_secret(key, detail, sizeof(detail)) < 0)) {
		handler_problem(resp, req, P_INVALID_REQUEST, detail);
		goto out;
	}
	if (iso8601_duration(grace != NULL ? grace : ENDPOINTS_GRACE, &us, why, sizeof(why)) < 0 ||
	    us > ENDPOINTS_GRACE_MAX * 1000000LL) {
		snprintf(
		    detail, sizeof(detail),
		    "\"grace\" must be an ISO 8601 duration from PT0S to P7D (default PT24H)%s%s",
		    us > ENDPOINTS_GRACE_MAX * 1000000LL ? "" : ": ",
		    us > ENDPOINTS_GRACE_MAX * 1000000LL ? "" : why);
		handler_problem(resp, req, P_INVALID_DURATION, detail);
		goto out;
	}
	if (!known_id(req, resp, id))
		goto out;
	if (cmd_fingerprint(ctx, req, resp, root, fp_text) < 0)
		goto out;
	snprintf(ec.tenant, sizeof(ec.tenant), "%ld", ctx->tenant_id);
	snprintf(ec.grace, sizeof(ec.grace), "%lld microseconds", (long long)us);
	ec.p[ENDPOINT_ROTATE_TENANT] = ec.tenant;
	ec.p[ENDPOINT_ROTATE_ID] = id;
	ec.p[ENDPOINT_ROTATE_SECRET] = key;
	ec.p[ENDPOINT_ROTATE_GRACE] = ec.grace;
	ec.p[ENDPOINT_ROTATE_ACTOR] = handler_actor(ctx);
	const struct cmd cmd = { .stmt = Q_ENDPOINT_ROTATE,
		                 .nparams = ENDPOINT_ROTATE__N,
		                 .params = ec.p,
		                 .fp_text = fp_text,
		                 .prepare = ep_prepare,
		                 .render = render_secret_state,
		                 .arg = &ec };
	cmd_run(ctx, req, resp, &cmd);
	explicit_bzero(ec.secret, sizeof(ec.secret));
out:
	json_object_put(root);
}

/* Run a read of one endpoint (tenant, id): its result, or NULL when resp
 * holds the answer (404 or 5xx). */
static PGresult *read_one(struct handler_ctx *ctx, const struct http_req *req,
                          struct http_resp *resp, const char *id, int stmt)
{
	char tenant[24];
	struct err e;
	PGresult *res;

	if (!known_id(req, resp, id))
		return NULL;
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	const char *p[ENDPOINT_GET__N] = { [ENDPOINT_GET_TENANT] = tenant, [ENDPOINT_GET_ID] = id };
	res = db_run(ctx->db, stmt, ENDPOINT_GET__N, p, &e);
	if (res == NULL) {
		handler_db_error(ctx, resp, req, &e);
		return NULL;
	}
	if (PQntuples(res) == 0) {
		/* Another tenant's endpoint looks exactly like a missing one. */
		handler_problem(resp, req, P_NOT_FOUND, "no such endpoint");
		PQclear(res);
		return NULL;
	}
	return res;
}

void endpoints_get(struct handler_ctx *ctx, struct http_req *req, const char *id,
                   struct http_resp *resp)
{
	PGresult *res = read_one(ctx, req, resp, id, Q_ENDPOINT_GET);
	struct err e;

	if (res == NULL)
		return;
	if (write_endpoint(&resp->body, res, 0, 0, &e) < 0) {
		buf_reset(&resp->body);
		handler_db_error(ctx, resp, req, &e);
	} else {
		resp->status = 200;
		resp->content_type = "application/json";
	}
	PQclear(res);
}

/* {"key":..,"previous_key":..,"previous_expires_at":..}: never stored,
 * read afresh every time. */
void endpoints_secret(struct handler_ctx *ctx, struct http_req *req, const char *id,
                      struct http_resp *resp)
{
	PGresult *res = read_one(ctx, req, resp, id, Q_ENDPOINT_SECRET);
	struct buf *b = &resp->body;

	if (res == NULL)
		return;
	buf_printf(b, "{\"key\":\"%s\",\"previous_key\":", PQgetvalue(res, 0, 0));
	if (PQgetisnull(res, 0, 1))
		buf_puts(b, "null,\"previous_expires_at\":null}");
	else
		buf_printf(b, "\"%s\",\"previous_expires_at\":\"%s\"}", PQgetvalue(res, 0, 1),
		           PQgetvalue(res, 0, 2));
	resp->status = 200;
	resp->content_type = "application/json";
	/* Not for caches between the client and us. */
	http_resp_header(resp, "Cache-Control", "no-store");
	PQclear(res);
}

static int list_item(struct handler_ctx *ctx, struct buf *out, const PGresult *res, int i,
                     struct err *e)
{
	return write_endpoint(out, res, i, 0, e);
}

void endpoints_list(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp)
{
	char tenant[24], after[IDS_UUID_LEN + 1], lim[24], budget[24];
	long limit;
	struct err e;
	PGresult *res;

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
	const char *p[ENDPOINT_LIST__N] = { [ENDPOINT_LIST_TENANT] = tenant,
		                            [ENDPOINT_LIST_AFTER] = after[0] ? after : NULL,
		                            [ENDPOINT_LIST_LIMIT] = lim,
		                            [ENDPOINT_LIST_BUDGET] = budget };
	res = db_run(ctx->db, Q_ENDPOINT_LIST, ENDPOINT_LIST__N, p, &e);
	if (res == NULL) {
		handler_db_error(ctx, resp, req, &e);
		return;
	}
	page_answer(ctx, req, resp, "endpoints", res, PQntuples(res), limit, COL__N, list_item);
	PQclear(res);
}
