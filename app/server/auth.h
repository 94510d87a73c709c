/*
 * auth.h - who is asking: a request's bearer token resolved to its tenant.
 *
 * This module is the only writer of the check's state in handler_ctx
 * (tenant_id, token_id, actor, the token's digest, auth_pending,
 * auth_keyed, auth_asked_at, key_row, cached): the router resets it and
 * begins or makes the check, a handler settles a check it began late.
 *
 * A keyed POST learns its key's stored row in the same round trip as its
 * tenant (Q_AUTH_KEY), so a replay needs no other statement; a retry this
 * worker has just answered needs none at all (rcache.h). A plain keyed
 * create goes further: its one statement checks the token itself
 * (Q_CREATE_KEYED), so the check is begun before the handler, and the
 * handler decides how it ends: with that statement's row
 * (auth_checked()), or with auth_settle() when it answers without it.
 * Either way the answers are those of a check made first: a bad token is
 * 401 whatever else is wrong with the request, and nothing is written.
 *
 * Return codes, as cmd.h's: 0 to go on, or -1 when resp holds the answer
 * (401, or 503 when the database cannot be asked), in place of whatever
 * it held.
 */
#ifndef IDF_AUTH_H
#define IDF_AUTH_H

#include <libpq-fe.h>

#include "server/handler.h"
#include "server/http.h"

/* Forget the last request's check: no tenant, no token, none begun, no
 * key row. The router calls it before anything else of a request. */
void auth_reset(struct handler_ctx *ctx);

/*
 * Check the token now. want_key: a keyed POST, whose key row comes with
 * the tenant into ctx->key_row. 0 when authenticated, or -1.
 */
int auth_check(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp,
               int want_key) MUSTCHECK;

/*
 * Begin the check without a statement: a missing token is 401 at once
 * (-1); a retry found in the replay cache is authenticated (ctx's tenant
 * and key row); otherwise the check is pending (ctx->auth_pending) until
 * auth_settle() or auth_checked(). 0 when the handler may go on.
 */
int auth_begin(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp,
               int want_key) MUSTCHECK;

/*
 * Finish a pending check with its own statement; nothing to do (0) when
 * none is pending. 0 when authenticated, or -1 (the request's key outcome
 * is then none: ctx->idem is IDEM_NONE).
 */
int auth_settle(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp);

/*
 * A statement checked the pending check's token: row is its first row,
 * laid out as the key row (queries.h, enum key_col: the tenant, NULL when
 * the token is unknown or revoked, then the key's columns and the token's
 * id). 0 when authenticated (a live key row of it goes into the replay
 * cache, as auth_check()'s would), or -1 with the 401. The check is over
 * either way.
 */
int auth_checked(struct handler_ctx *ctx, const struct http_req *req, struct http_resp *resp,
                 const PGresult *row);

#endif
