/*
 * auth.h - who is asking: a request's bearer token resolved to its tenant.
 *
 * A keyed POST learns its key's stored row in the same round trip as its
 * tenant (Q_AUTH_KEY), so a replay needs no other statement; a retry this
 * worker has just answered needs none at all (rcache.h). A plain keyed
 * create goes further: its one statement checks the token itself
 * (Q_CREATE_KEYED), so the token's check is begun before the handler and
 * settled by whichever comes first, that statement or auth_settle().
 * Either way the answers are those of a check made first: a bad token is
 * 401 whatever else is wrong with the request, and nothing is written.
 */
#ifndef IDF_AUTH_H
#define IDF_AUTH_H

#include <libpq-fe.h>

#include "server/handler.h"
#include "server/http.h"

/*
 * Check the token now. want_key: a keyed POST, whose key row comes with
 * the tenant into ctx->key_row. Returns 1 when authenticated, 0 when resp
 * holds the answer (401, or 503 when the database cannot be asked).
 */
int auth_check(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp, int want_key);

/*
 * Begin the check without a statement: a missing token is 401 at once
 * (returns 0), a retry found in the replay cache is authenticated (ctx's
 * tenant and key row); otherwise ctx->auth_pending is set. Returns 1 when
 * the handler may go on.
 */
int auth_begin(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp, int want_key);

/*
 * Finish a begun check with its statement, when nothing has yet. Returns
 * 1 when authenticated; 0 when the token is bad or the database cannot be
 * asked, with resp holding that answer in place of whatever it held.
 */
int auth_settle(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp);

/* The statement of a begun check found the token unknown or revoked:
 * resp holds the 401, and the check is over. */
void auth_refused(struct handler_ctx *ctx, const struct http_req *req, struct http_resp *resp);

/* The statement of a begun check found the token good: row (Q_CREATE_KEYED's
 * KEY_COL__N columns) gives the tenant, and a live key row of it goes into
 * the replay cache as auth_check's would. The check is over. */
void auth_passed(struct handler_ctx *ctx, const struct http_req *req, const PGresult *row);

#endif
