/* ops.c - /healthz, /readyz, /metrics, /status and /v1/openapi.json (see ops.h). */
#include "server/ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fp.h"
#include "core/migrate.h"
#include "server/metrics.h"
#include "server/openapi.h"
#include "server/queries.h"
#include "server/scoreboard.h"

/* Liveness: the process answers. Also the cheapest request there is, the
 * FastCGI ceiling. */
void ops_healthz(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp)
{
	resp->status = 204;
}

/*
 * The document with the configured problem_base_uri in place of the base
 * it was written with: every JSON string that begins with that base (the
 * problem type URIs, their examples) begins with base instead. The text of
 * descriptions that only mention the default is left as it is. No escaping
 * is needed: conf.c accepts no quote, backslash or control character in a
 * URI. Made once per worker and base (a reload may change the base); NULL
 * when memory ran out.
 */
static const char *openapi_rebased(const char *base, size_t *len)
{
	static char *doc, *doc_base;
	static size_t doc_len;
	const size_t ol = strlen(openapi_problem_base), nl = strlen(base);
	const char *p, *end = openapi_json + openapi_json_len, *hit;
	size_t n = 0, total;
	char *out, *w, *copy;

	if (doc != NULL && strcmp(doc_base, base) == 0) {
		*len = doc_len;
		return doc;
	}
	/* Each occurrence is a quote and the old base: count, then copy. */
	for (p = openapi_json; (hit = memmem(p, (size_t)(end - p), openapi_problem_base, ol));
	     p = hit + ol)
		if (hit > openapi_json && hit[-1] == '"')
			n++;
	total = openapi_json_len - n * ol + n * nl;
	out = malloc(total + 1);
	copy = strdup(base);
	if (out == NULL || copy == NULL) {
		free(out);
		free(copy);
		return NULL;
	}
	w = out;
	for (p = openapi_json; (hit = memmem(p, (size_t)(end - p), openapi_problem_base, ol));
	     p = hit + ol) {
		memcpy(w, p, (size_t)(hit - p));
		w += hit - p;
		if (hit > openapi_json && hit[-1] == '"') {
			memcpy(w, base, nl);
			w += nl;
		} else {
			memcpy(w, hit, ol);
			w += ol;
		}
	}
	memcpy(w, p, (size_t)(end - p));
	w += end - p;
	*w = '\0';
	free(doc);
	free(doc_base);
	doc = out;
	doc_base = copy;
	doc_len = (size_t)(w - out);
	*len = doc_len;
	return doc;
}

/* The contract, embedded at build time: no file to read, nothing to fail
 * but memory. The problem type URIs follow problem_base_uri. */
void ops_openapi(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp)
{
	const char *base = ctx->conf->problem_base_uri, *doc = openapi_json;
	size_t len = openapi_json_len;

	if (strcmp(base, openapi_problem_base) != 0 &&
	    (doc = openapi_rebased(base, &len)) == NULL) {
		handler_problem(resp, req, P_INTERNAL, "out of memory");
		return;
	}
	resp->status = 200;
	resp->content_type = "application/json";
	buf_append(&resp->body, doc, len);
}

#define READYZ_DIRECT_EVERY_MS 1000

/*
 * The schema version, read on a connection of our own, at most once a
 * READYZ_DIRECT_EVERY_MS per worker (the last result answers meanwhile;
 * the worker's own reconnects are paced by db_backoff_ms()). Only when the
 * worker's connection failed: a worker cannot connect at all when it cannot
 * prepare its statements, which is what a schema older than the build
 * usually causes (the statements name columns it lacks), and the reason is
 * what the operator needs. -1 with e filled when this fails too.
 */
/* /readyz needs no token: during an outage every probe would open a
 * connection of its own. A worker tries at most once a
 * READYZ_DIRECT_EVERY_MS and answers from that try meanwhile. The try
 * belongs to one outage: once the worker's own connection answers again
 * it is forgotten, so the next outage is not told with the last one's
 * reason. */
static struct {
	struct timespec at; /* 0: none */
	int version;
	struct err e;
} direct_last;

static int schema_version_direct(const struct conf *c, struct err *e)
{
	char appname[96];
	struct timespec now;
	PGconn *conn;

	clock_gettime(CLOCK_MONOTONIC, &now);
	if (direct_last.at.tv_sec != 0 && (now.tv_sec - direct_last.at.tv_sec) * 1000 +
	                                          (now.tv_nsec - direct_last.at.tv_nsec) / 1000000 <
	                                      READYZ_DIRECT_EVERY_MS) {
		*e = direct_last.e;
		return direct_last.version;
	}
	direct_last.at = now;
	err_clear(&direct_last.e);
	snprintf(appname, sizeof(appname), "%s-readyz", c->application_name);
	conn = db_connect_simple(c->db, appname, &direct_last.e);
	if (conn == NULL) {
		direct_last.version = -1;
	} else {
		direct_last.version = migrate_current(conn, &direct_last.e);
		PQfinish(conn);
	}
	*e = direct_last.e;
	return direct_last.version;
}

/*
 * Readiness: the database answers, takes writes, and its schema is the one
 * this build needs. One statement per probe on the worker's own
 * connection, with no cache: reading the version is as cheap as a SELECT 1
 * and is itself the round trip that proves the database reachable. When
 * that connection is down, the version read on a connection of its own
 * (schema_version_direct) is tried at most once a second. A
 * server in recovery (a standby) or read-only (a demoted primary,
 * default_transaction_read_only) is not ready, and the worker's connection
 * is dropped so its next statement reconnects (to the new primary, with a
 * multi-host conninfo). A schema newer than the build counts as ready:
 * during an upgrade the migration runs before the workers are replaced, and
 * the old workers must keep serving meanwhile (migrations only add).
 * Through a PL/Proxy proxy (routing = proxy) the statement asks every
 * partition: ready at the lowest version of those that answer, each
 * partition's state in the body, "degraded" while some do not answer and
 * 503 only when none does.
 */
void ops_readyz(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp)
{
	const int latest = migrate_latest();
	char detail[192], ra[24];
	struct err e, direct;
	PGresult *res = db_run(ctx->db, Q_SCHEMA_VERSION, 0, NULL, &e);
	const char *read_only = NULL;
	char *partitions = NULL, unreachable[128] = "";
	int version, reachable = -1;

	if (res != NULL) {
		version = atoi(PQgetvalue(res, 0, 0));
		if (strcmp(PQgetvalue(res, 0, 1), "t") == 0)
			read_only = "in recovery (a standby)";
		else if (strcmp(PQgetvalue(res, 0, 2), "on") == 0)
			read_only = "read-only (transaction_read_only is on)";
		/* routing = proxy: each partition's state as well. */
		if (PQnfields(res) > SCHEMA_COL_REACHABLE) {
			partitions = strdup(PQgetvalue(res, 0, SCHEMA_COL_PARTITIONS));
			snprintf(unreachable, sizeof(unreachable), "%s",
			         PQgetvalue(res, 0, SCHEMA_COL_UNREACHABLE));
			reachable = atoi(PQgetvalue(res, 0, SCHEMA_COL_REACHABLE));
		}
		PQclear(res);
		direct_last.at.tv_sec = 0;
	} else {
		ctx->err = e; /* for the log line */
		/* A proxy's own schema_migrations are the proxy's (sql/proxy/),
		 * not the partitions': no second opinion there. */
		version = strcmp(ctx->conf->routing, "proxy") == 0
		              ? -1
		              : schema_version_direct(ctx->conf, &direct);
		if (version < 0 && strcmp(ctx->conf->routing, "proxy") != 0)
			e = direct;
	}
	if (read_only != NULL) {
		db_reset(ctx->db);
		snprintf(detail, sizeof(detail), "the database is %s", read_only);
		snprintf(ra, sizeof(ra), "%ld", ctx->conf->retry_after);
		http_resp_header(resp, "Retry-After", ra);
		handler_problem(resp, req, P_UNAVAILABLE, detail);
		goto out;
	}
	/* Through a proxy: unready only when no partition answers. One that
	 * does not is its own tenants' 503s, whichever server they ask, so
	 * taking this server out of a balancer would help no one; the body
	 * says which (status "degraded"). */
	if (reachable == 0) {
		snprintf(detail, sizeof(detail), "no partition answers (unreachable: %s)",
		         unreachable);
		snprintf(ra, sizeof(ra), "%ld", ctx->conf->retry_after);
		http_resp_header(resp, "Retry-After", ra);
		handler_problem(resp, req, P_UNAVAILABLE, detail);
		goto out;
	}
	if (res != NULL && version >= latest) {
		resp->status = 200;
		resp->content_type = "application/json";
		buf_printf(&resp->body, "{\"status\":\"%s\",\"schema_version\":%d",
		           unreachable[0] != '\0' ? "degraded" : "ready", version);
		if (partitions != NULL)
			buf_printf(&resp->body, ",\"partitions\":%s", partitions);
		buf_puts(&resp->body, "}");
		goto out;
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
out:
	free(partitions);
}

int ops_metrics_token_match(const char *token, const char *authorization)
{
	uint8_t want[FP_LEN], got[FP_LEN];
	const char *tok = http_bearer_token(authorization);
	unsigned char diff = 0;

	if (token == NULL || *token == '\0' || tok == NULL)
		return 0;
	/* Digests have one length whatever was sent, so the comparison's
	 * time tells nothing about the token, not even its length. */
	fp_token(want, token, strlen(token));
	fp_token(got, tok, strlen(tok));
	for (size_t i = 0; i < FP_LEN; i++)
		diff |= (unsigned char)(want[i] ^ got[i]);
	return diff == 0;
}

/*
 * The operator's views (/metrics, /status) open to the addresses in
 * metrics_allow or with the metrics token, and then to GET only. Checked
 * before the method, so a stranger learns nothing about the resource.
 * Tenants' tokens are never looked up here: they open the API, not the
 * operator's view of every tenant. Returns 1 when allowed, 0 when resp
 * holds the refusal (403, or 405 once allowed).
 */
static int operator_allowed(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp,
                            const char *what)
{
	char detail[128];
	struct err e;

	if (metrics_allow_match(ctx->conf->metrics_allow, req->remote_addr, &e) != 1 &&
	    !ops_metrics_token_match(ctx->conf->metrics_token, req->authorization)) {
		snprintf(detail, sizeof(detail),
		         "%s is open to the addresses in metrics_allow, or with the metrics_token",
		         what);
		handler_problem(resp, req, P_FORBIDDEN, detail);
		return 0;
	}
	if (strcmp(req->method, "GET") != 0) {
		http_resp_header(resp, "Allow", "GET");
		handler_problem(resp, req, P_METHOD_NOT_ALLOWED, "this resource allows GET only");
		return 0;
	}
	return 1;
}

/* Q_METRICS_DELIVERIES's rows into md: 1, or 0 when they are not its. */
static int deliveries_read(const PGresult *res, struct metrics_deliveries *md)
{
	int n = PQntuples(res);

	if (n < 1 || n > METRICS_ENDPOINTS_TOP + 1)
		return 0;
	md->disabled = atol(PQgetvalue(res, 0, 1));
	md->pending = atol(PQgetvalue(res, 0, 2));
	md->n = n - 1;
	for (int i = 1; i < n; i++) {
		md->top[i - 1].tenant = atol(PQgetvalue(res, i, 3));
		snprintf(md->top[i - 1].endpoint, sizeof(md->top[i - 1].endpoint), "%s",
		         PQgetvalue(res, i, 4));
		md->top[i - 1].pending = atol(PQgetvalue(res, i, 2));
	}
	return 1;
}

/*
 * Through a proxy: the partitions' columns of the first row of res, how
 * many partitions there are (col_n) and those that did not answer
 * (col_down, "0,3"), into mp, where a partition is down once either
 * statement says so. Returns 1 when some partition answered this
 * statement, 0 when none did (its sums are of nothing).
 */
static int partitions_read(const PGresult *res, int col_n, int col_down,
                           struct metrics_partitions *mp)
{
	const char *p = PQgetvalue(res, 0, col_down);
	int n = atoi(PQgetvalue(res, 0, col_n)), down = 0;

	if (n > mp->n)
		mp->n = n;
	while (*p != '\0') {
		char *end;
		long k = strtol(p, &end, 10);
		if (end == p)
			break;
		if (k >= 0 && k < METRICS_PARTITIONS_MAX)
			mp->down[k / 8] |= (unsigned char)(1u << (k % 8));
		down++;
		p = *end == ',' ? end + 1 : end;
	}
	return down < n;
}

/* For the operator's scraper, not for tenants. Through a proxy every
 * statement asks each partition alone: the gauges are sums over those
 * that answered, idemflow_partition_up names the others, and when none
 * answered there is nothing to sum (idemflow_db_up 0, as when the
 * proxy itself does not answer). */
void ops_metrics(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp)
{
	struct metrics_outbox ob;
	struct metrics_deliveries md;
	struct metrics_partitions mp = { 0 };
	char top[8];
	const char *tp[METRICS_DELIVERIES__N] = { [METRICS_DELIVERIES_TOP] = top };
	struct err e;
	PGresult *res;
	int db_ok, md_ok = 0, proxied = 0;

	if (!operator_allowed(ctx, req, resp, "/metrics"))
		return;
	scoreboard_stage(SB_IN_DB);
	res = db_run(ctx->db, Q_METRICS_OUTBOX, 0, NULL, &e);
	db_ok = res != NULL;
	if (db_ok) {
		ob.pending = atol(PQgetvalue(res, 0, 0));
		ob.oldest_pending_s = atof(PQgetvalue(res, 0, 1));
		ob.dead = atol(PQgetvalue(res, 0, 2));
		ob.jobs_activatable = atol(PQgetvalue(res, 0, 3));
		ob.jobs_leased = atol(PQgetvalue(res, 0, 4));
		ob.jobs_leases_expired = atol(PQgetvalue(res, 0, 5));
		ob.incidents = atol(PQgetvalue(res, 0, 6));
		if (PQnfields(res) > METRICS_COL_UNREACHABLE) {
			proxied = 1;
			db_ok = partitions_read(res, METRICS_COL_PARTITIONS,
			                        METRICS_COL_UNREACHABLE, &mp);
		}
		PQclear(res);
	} else {
		ctx->err = e; /* for the request's log line */
	}
	if (db_ok) {
		snprintf(top, sizeof(top), "%d", METRICS_ENDPOINTS_TOP);
		res = db_run(ctx->db, Q_METRICS_DELIVERIES, METRICS_DELIVERIES__N, tp, &e);
		md_ok = res != NULL && deliveries_read(res, &md);
		if (md_ok && proxied && PQnfields(res) > METRICS_DELIVERIES_COL_UNREACHABLE)
			md_ok = partitions_read(res, METRICS_DELIVERIES_COL_PARTITIONS,
			                        METRICS_DELIVERIES_COL_UNREACHABLE, &mp);
		PQclear(res);
	}
	scoreboard_stage(SB_WRITING);
	resp->status = 200;
	resp->content_type = "text/plain; version=0.0.4; charset=utf-8";
	buf_reset(&resp->body);
	metrics_render(&resp->body, db_ok ? &ob : NULL);
	if (proxied)
		metrics_render_partitions(&resp->body, &mp);
	if (md_ok)
		metrics_render_deliveries(&resp->body, &md);
	if (resp->body.oom) {
		err_set(&e, ERR_INTERNAL, "out of memory");
		handler_db_error(ctx, resp, req, &e);
	}
}

/* Is name a parameter of the (still encoded) query string, with or
 * without a value ("json", "json=1", "a&full")? */
static int query_has(const char *query, const char *name)
{
	size_t n = strlen(name);

	for (const char *p = query; p != NULL && *p; p = strchr(p, '&'), p = p ? p + 1 : NULL)
		if (strncmp(p, name, n) == 0 && (p[n] == '\0' || p[n] == '&' || p[n] == '='))
			return 1;
	return 0;
}

/* For the operator, like php-fpm's status page; no database. */
void ops_status(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp)
{
	const char *accept = NULL;
	int json;
	struct err e;

	if (!operator_allowed(ctx, req, resp, "/status"))
		return;
	if (req->fcgi != NULL)
		accept = FCGX_GetParam("HTTP_ACCEPT", req->fcgi->envp);
	json = query_has(req->query, "json") ||
	       (accept != NULL && strstr(accept, "application/json") != NULL);
	scoreboard_stage(SB_WRITING);
	resp->status = 200;
	resp->content_type = json ? "application/json" : "text/plain; charset=utf-8";
	buf_reset(&resp->body);
	scoreboard_render(&resp->body, ctx->conf->application_name, json,
	                  query_has(req->query, "full"));
	if (resp->body.oom) {
		err_set(&e, ERR_INTERNAL, "out of memory");
		handler_db_error(ctx, resp, req, &e);
	}
}
