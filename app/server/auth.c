/*
 * auth.c - the bearer token resolved to a tenant (auth.h).
 */
#include "server/auth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp.h"
#include "server/queries.h"
#include "server/rcache.h"
#include "server/scoreboard.h"

/* The request is authenticated as token id (api_tokens.id) of tenant:
 * what the log line and the rows it writes record (sql/014_actor.sql). */
static void authenticated(struct handler_ctx *ctx, long tenant, long id)
{
	ctx->tenant_id = tenant;
	ctx->token_id = id;
	if (id > 0)
		snprintf(ctx->actor, sizeof(ctx->actor), "token:%ld", id);
	else
		ctx->actor[0] = '\0';
}

static void refuse(struct handler_ctx *ctx, struct http_resp *resp, const struct http_req *req)
{
	/* Whatever the handler found of the key, the answer is the check's. */
	ctx->idem = IDEM_NONE;
	http_resp_reset(resp);
	http_resp_header(resp, "WWW-Authenticate",
	                 "Bearer realm=\"idemflow\", error=\"invalid_token\"");
	handler_problem(resp, req, P_UNAUTHORIZED, "the token is unknown or has been revoked");
}

/* Whether the replay cache may hold this request's key row. */
static int cacheable(const struct handler_ctx *ctx)
{
	return ctx->auth_keyed && ctx->conf->replay_cache_ttl > 0 && ctx->rcache != NULL;
}

void auth_reset(struct handler_ctx *ctx)
{
	authenticated(ctx, 0, 0);
	ctx->auth_pending = 0;
	ctx->auth_keyed = 0;
	ctx->auth_asked_at = 0;
	PQclear(ctx->key_row);
	ctx->key_row = NULL;
	ctx->cached = 0;
}

int auth_begin(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp, int want_key)
{
	const char *tok = http_bearer_token(req->authorization);

	ctx->auth_pending = 0;
	if (tok == NULL) {
		http_resp_header(resp, "WWW-Authenticate", "Bearer realm=\"idemflow\"");
		handler_problem(resp, req, P_UNAUTHORIZED,
		                "send Authorization: Bearer <token> with a token issued by "
		                "\"idemflow token create\"");
		return -1;
	}
	fp_token(ctx->token_fp, tok, strlen(tok));
	ctx->token_hex[0] = '\\';
	ctx->token_hex[1] = 'x';
	fp_hex(ctx->token_hex + 2, ctx->token_fp, FP_LEN);
	/* A keyed POST learns in the same round trip whether its key was
	 * used before: a replay then needs no other statement. */
	ctx->auth_keyed = want_key && req->idem_key_count == 1 && idem_key_valid(req->idem_key);
	if (cacheable(ctx)) {
		/* A retry this worker answered in the last replay_cache_ttl
		 * needs no round trip at all (rcache.h says what that risks). */
		ctx->auth_asked_at = rcache_now_ms();
		ctx->key_row =
		    rcache_get(ctx->rcache, ctx->token_fp, req->idem_key, ctx->auth_asked_at);
		if (ctx->key_row != NULL) {
			ctx->cached = 1;
			authenticated(ctx, atol(PQgetvalue(ctx->key_row, 0, KEY_COL_TENANT)),
			              atol(PQgetvalue(ctx->key_row, 0, KEY_COL_TOKEN)));
			return 0;
		}
	}
	ctx->auth_pending = 1;
	return 0;
}

int auth_settle(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp)
{
	const char *p[AUTH_KEY__N] = {
		[AUTH_KEY_TOKEN_HASH] = ctx->token_hex, [AUTH_KEY_KEY] = req->idem_key
	};
	struct err e;
	PGresult *res;
	int ok;

	if (!ctx->auth_pending)
		return 0;
	ctx->auth_pending = 0;
	_Static_assert((int)AUTH_KEY_TOKEN_HASH == (int)AUTH_TOKEN_HASH,
	               "Q_AUTH's $1 is Q_AUTH_KEY's");
	scoreboard_stage(SB_IN_DB);
	res = db_run(ctx->db, ctx->auth_keyed ? Q_AUTH_KEY : Q_AUTH,
	             ctx->auth_keyed ? AUTH_KEY__N : AUTH__N, p, &e);
	if (res == NULL) {
		e.outcome_unknown = 0; /* it only reads */
		ctx->idem = IDEM_NONE;
		http_resp_reset(resp);
		handler_db_error(ctx, resp, req, &e);
		return -1;
	}
	ok = PQntuples(res) == 1;
	if (ok)
		authenticated(
		    ctx, atol(PQgetvalue(res, 0, KEY_COL_TENANT)),
		    atol(PQgetvalue(res, 0, ctx->auth_keyed ? KEY_COL_TOKEN : AUTH_COL_TOKEN)));
	if (ok && ctx->auth_keyed && !PQgetisnull(res, 0, KEY_COL_FP)) {
		if (cacheable(ctx))
			rcache_put(ctx->rcache, ctx->token_fp, req->idem_key, res,
			           ctx->conf->replay_cache_ttl, ctx->auth_asked_at);
		ctx->key_row = res;
		res = NULL;
	}
	PQclear(res);
	if (!ok) {
		refuse(ctx, resp, req);
		return -1;
	}
	return 0;
}

int auth_check(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp, int want_key)
{
	if (auth_begin(ctx, req, resp, want_key) < 0)
		return -1;
	return auth_settle(ctx, req, resp);
}

int auth_checked(struct handler_ctx *ctx, const struct http_req *req, struct http_resp *resp,
                 const PGresult *row)
{
	ctx->auth_pending = 0;
	if (PQgetisnull(row, 0, KEY_COL_TENANT)) {
		refuse(ctx, resp, req);
		return -1;
	}
	authenticated(ctx, atol(PQgetvalue(row, 0, KEY_COL_TENANT)),
	              atol(PQgetvalue(row, 0, KEY_COL_TOKEN)));
	if (cacheable(ctx) && !PQgetisnull(row, 0, KEY_COL_FP))
		rcache_put(ctx->rcache, ctx->token_fp, req->idem_key, row,
		           ctx->conf->replay_cache_ttl, ctx->auth_asked_at);
	return 0;
}
