/*
 * api.c - routing and authentication for the v1 API.
 *
 * Order of checks: route and method (404/405, no database), then the
 * bearer token (401), then the handler's own validation. A request that
 * fails any check writes nothing.
 */
#include "server/api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp.h"
#include "core/migrate.h"
#include "server/jobs.h"
#include "server/metrics.h"
#include "server/queries.h"
#include "server/rcache.h"
#include "server/wf.h"

/* Resolve the bearer token to a tenant (and, when want_key, fetch the
 * request's Idempotency-Key row into ctx->key_row). Returns 1 when
 * authenticated, 0 when resp now holds the answer (401 or 503). */
static int authenticate(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp,
                        int want_key)
{
	const char *tok = http_bearer_token(req->authorization);
	uint8_t hash[FP_LEN];
	char hex[2 + 2 * FP_LEN + 1];
	struct err e;
	PGresult *res;
	int ok;

	if (tok == NULL) {
		http_resp_header(resp, "WWW-Authenticate", "Bearer realm=\"idemflow\"");
		handler_problem(resp, req, P_UNAUTHORIZED,
		            "send Authorization: Bearer <token> with a token issued by "
		            "\"idemflow token create\"");
		return 0;
	}
	fp_token(hash, tok, strlen(tok));
	hex[0] = '\\';
	hex[1] = 'x';
	fp_hex(hex + 2, hash, FP_LEN);
	/* A keyed POST learns in the same round trip whether its key was
	 * used before: a replay then needs no other statement. */
	int keyed = want_key && req->idem_key_count == 1 && idem_key_valid(req->idem_key);
	const long ttl = ctx->conf->replay_cache_ttl;
	const int use_cache = keyed && ttl > 0 && ctx->rcache != NULL;
	long long asked_at = 0;
	if (use_cache) {
		/* A retry this worker answered in the last replay_cache_ttl
		 * needs no round trip at all (rcache.h says what that risks). */
		asked_at = rcache_now_ms();
		ctx->key_row = rcache_get(ctx->rcache, hash, req->idem_key, asked_at);
		if (ctx->key_row != NULL) {
			ctx->cached = 1;
			ctx->tenant_id = atol(PQgetvalue(ctx->key_row, 0, KEY_COL_TENANT));
			return 1;
		}
	}
	const char *p[AK__N] = {[AK_TOKEN_HASH] = hex, [AK_KEY] = req->idem_key};
	_Static_assert((int)AK_TOKEN_HASH == (int)AU_TOKEN_HASH, "Q_AUTH's $1 is Q_AUTH_KEY's");
	res = db_run(ctx->db, keyed ? Q_AUTH_KEY : Q_AUTH, keyed ? AK__N : AU__N, p, &e);
	if (res == NULL) {
		e.outcome_unknown = 0; /* it only reads */
		handler_db_error(ctx, resp, req, &e);
		return 0;
	}
	ok = PQntuples(res) == 1;
	if (ok)
		ctx->tenant_id = atol(PQgetvalue(res, 0, KEY_COL_TENANT));
	if (ok && keyed && !PQgetisnull(res, 0, KEY_COL_FP)) {
		if (use_cache)
			rcache_put(ctx->rcache, hash, req->idem_key, res, ttl, asked_at);
		ctx->key_row = res;
		res = NULL;
	}
	PQclear(res);
	if (!ok) {
		http_resp_header(resp, "WWW-Authenticate",
		                 "Bearer realm=\"idemflow\", error=\"invalid_token\"");
		handler_problem(resp, req, P_UNAUTHORIZED, "the token is unknown or has been revoked");
	}
	return ok;
}

static void not_allowed(struct http_resp *resp, const struct http_req *req, const char *allow)
{
	char detail[96];

	snprintf(detail, sizeof(detail), "this resource allows %s only", allow);
	http_resp_header(resp, "Allow", allow);
	handler_problem(resp, req, P_METHOD_NOT_ALLOWED, detail);
}

/*
 * The schema version, read on a connection of our own. Only when the
 * worker's connection failed: a worker cannot connect at all when it cannot
 * prepare its statements, which is what a schema older than the build
 * usually causes (the statements name columns it lacks), and the reason is
 * what the operator needs. -1 with e filled when this fails too.
 */
static int schema_version_direct(const struct conf *c, struct err *e)
{
	char appname[96];
	PGconn *conn;
	int v;

	snprintf(appname, sizeof(appname), "%s-readyz", c->application_name);
	conn = db_connect_simple(c->db, appname, e);
	if (conn == NULL)
		return -1;
	v = migrate_current(conn, e);
	PQfinish(conn);
	return v;
}

/*
 * Readiness: the database answers, takes writes, and its schema is the one
 * this build needs. One statement per probe on the worker's own
 * connection, with no cache: reading the version is as cheap as a SELECT 1
 * and is itself the round trip that proves the database reachable. A
 * server in recovery (a standby) or read-only (a demoted primary,
 * default_transaction_read_only) is not ready, and the worker's connection
 * is dropped so its next statement reconnects (to the new primary, with a
 * multi-host conninfo). A schema newer than the build counts as ready:
 * during an upgrade the migration runs before the workers are replaced, and
 * the old workers must keep serving meanwhile (migrations only add).
 */
static void readyz(struct handler_ctx *ctx, const struct http_req *req, struct http_resp *resp)
{
	const int latest = migrate_latest();
	char detail[128], ra[24];
	struct err e, direct;
	PGresult *res = db_run(ctx->db, Q_SCHEMA_VERSION, 0, NULL, &e);
	const char *read_only = NULL;
	int version;

	if (res != NULL) {
		version = atoi(PQgetvalue(res, 0, 0));
		if (strcmp(PQgetvalue(res, 0, 1), "t") == 0)
			read_only = "in recovery (a standby)";
		else if (strcmp(PQgetvalue(res, 0, 2), "on") == 0)
			read_only = "read-only (transaction_read_only is on)";
		PQclear(res);
	} else {
		ctx->err = e; /* for the log line */
		version = schema_version_direct(ctx->conf, &direct);
		if (version < 0)
			e = direct;
	}
	if (read_only != NULL) {
		db_reset(ctx->db);
		snprintf(detail, sizeof(detail), "the database is %s", read_only);
		snprintf(ra, sizeof(ra), "%ld", ctx->conf->retry_after);
		http_resp_header(resp, "Retry-After", ra);
		handler_problem(resp, req, P_UNAVAILABLE, detail);
		return;
	}
	if (res != NULL && version >= latest) {
		resp->status = 200;
		resp->content_type = "application/json";
		buf_printf(&resp->body, "{\"status\":\"ready\",\"schema_version\":%d}", version);
		return;
	}
	if (version >= 0 && version < latest)
		snprintf(detail, sizeof(detail),
		         "schema at version %d, expected %d: run \"idemflow migrate\"", version,
		         latest);
	else if (e.code == ERR_DB_DOWN)
		snprintf(detail, sizeof(detail), "database unreachable");
	else
		snprintf(detail, sizeof(detail), "database error (see the server log)");
	snprintf(ra, sizeof(ra), "%ld", ctx->conf->retry_after);
	http_resp_header(resp, "Retry-After", ra);
	handler_problem(resp, req, P_UNAVAILABLE, detail);
}

/* Split "seg/rest" into seg (copied into out) and rest ("" or after the
 * slash). Returns 0, or -1 when seg is empty or does not fit. */
static int split_segment(const char *path, char *out, size_t outlen, const char **rest)
{
	size_t n = strcspn(path, "/");

	if (n == 0 || n >= outlen)
		return -1;
	memcpy(out, path, n);
	out[n] = '\0';
	*rest = path[n] == '/' ? path + n + 1 : path + n;
	return 0;
}

/* A POST that changes state: authenticated with its key row at hand. */
static int post_allowed(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp)
{
	if (strcmp(req->method, "POST") != 0) {
		not_allowed(resp, req, "POST");
		return 0;
	}
	return authenticate(ctx, req, resp, 1);
}

/* /v1/workflows/{id}[/events|/transitions|/messages] */
static void route_workflow(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp,
                           const char *tail)
{
	char id[64];
	const char *sub;

	if (split_segment(tail, id, sizeof(id), &sub) < 0) {
		handler_problem(resp, req, P_NOT_FOUND, "no such resource");
		return;
	}
	if (strcmp(sub, "") == 0 && tail[strlen(id)] == '\0') {
		if (strcmp(req->method, "GET") != 0)
			not_allowed(resp, req, "GET");
		else if (authenticate(ctx, req, resp, 0))
			wf_get(ctx, req, id, resp);
	} else if (strcmp(sub, "events") == 0) {
		if (strcmp(req->method, "GET") != 0)
			not_allowed(resp, req, "GET");
		else if (authenticate(ctx, req, resp, 0))
			wf_events(ctx, req, id, resp);
	} else if (strcmp(sub, "transitions") == 0) {
		if (post_allowed(ctx, req, resp))
			wf_transition(ctx, req, id, resp);
	} else if (strcmp(sub, "messages") == 0) {
		if (post_allowed(ctx, req, resp))
			wf_message(ctx, req, id, resp);
	} else {
		handler_problem(resp, req, P_NOT_FOUND, "no such resource");
	}
}

/* /v1/jobs/activate, /v1/jobs/{key}/complete, /v1/jobs/{key}/fail */
static void route_jobs(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp,
                       const char *tail)
{
	char key[64];
	const char *verb;

	if (strcmp(tail, "activate") == 0) {
		if (post_allowed(ctx, req, resp))
			jobs_activate(ctx, req, resp);
		return;
	}
	if (split_segment(tail, key, sizeof(key), &verb) < 0 ||
	    (strcmp(verb, "complete") != 0 && strcmp(verb, "fail") != 0)) {
		handler_problem(resp, req, P_NOT_FOUND, "no such resource");
		return;
	}
	if (post_allowed(ctx, req, resp))
		jobs_finish(ctx, req, key, verb, resp);
}

void api_handle(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp)
{
	static const char wf_prefix[] = "/v1/workflows/";
	static const char jobs_prefix[] = "/v1/jobs/";
	const char *path = req->path;

	ctx->tenant_id = 0;
	PQclear(ctx->key_row);
	ctx->key_row = NULL;
	ctx->bytes_fp[0] = '\0';
	ctx->idem = IDEM_NONE;
	ctx->cached = 0;
	ctx->created = 0;
	err_clear(&ctx->err);
	buf_reset(&ctx->body);

	/* Liveness: the process answers. No database, no authentication;
	 * also the cheapest request there is, the FastCGI ceiling. */
	if (strcmp(path, "/healthz") == 0) {
		if (strcmp(req->method, "GET") != 0)
			not_allowed(resp, req, "GET");
		else
			resp->status = 204;
		return;
	}
	if (strcmp(path, "/readyz") == 0) {
		if (strcmp(req->method, "GET") != 0)
			not_allowed(resp, req, "GET");
		else
			readyz(ctx, req, resp);
		return;
	}
	/* For the operator's scraper, not for tenants: metrics.c decides who. */
	if (strcmp(path, "/metrics") == 0) {
		metrics_handle(ctx, req, resp);
		return;
	}
	if (strcmp(path, "/v1/workflows") == 0) {
		if (strcmp(req->method, "POST") == 0) {
			if (authenticate(ctx, req, resp, 1))
				wf_create(ctx, req, resp);
		} else if (strcmp(req->method, "GET") == 0) {
			if (authenticate(ctx, req, resp, 0))
				wf_list(ctx, req, resp);
		} else {
			not_allowed(resp, req, "GET, POST");
		}
		return;
	}
	if (strncmp(path, wf_prefix, sizeof(wf_prefix) - 1) == 0) {
		route_workflow(ctx, req, resp, path + sizeof(wf_prefix) - 1);
		return;
	}
	if (strncmp(path, jobs_prefix, sizeof(jobs_prefix) - 1) == 0) {
		route_jobs(ctx, req, resp, path + sizeof(jobs_prefix) - 1);
		return;
	}
	handler_problem(resp, req, P_NOT_FOUND, "no such resource");
}
