/*
 * endpoints.h - a tenant's endpoints (/v1/endpoints): its own receivers,
 * each a URL, a filter of event types, an ordering, a signing secret and
 * metadata (sql/020_endpoints.sql). Every event of the tenant whose type
 * the filter passes gets a delivery to the endpoint, written in the
 * event's own transaction.
 *
 * The commands (create, change, delete, rotate and revoke the secret)
 * are keyed through cmd.h; the reads page as page.h says. The secret is
 * never in an endpoint's JSON nor in any answer a key stores: only
 * GET /v1/endpoints/{id}/secret shows it, and it is never stored as an
 * answer. Another tenant's endpoint is 404, exactly like a missing one.
 */
#ifndef IDF_ENDPOINTS_H
#define IDF_ENDPOINTS_H

#include "server/handler.h"

/* POST /v1/endpoints: 201 with the endpoint and its Location. */
void endpoints_create(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp);
/* GET /v1/endpoints: the tenant's endpoints in id order, keyset pages. */
void endpoints_list(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp);
/* GET /v1/endpoints/{id} */
void endpoints_get(struct handler_ctx *ctx, struct http_req *req, const char *id,
                   struct http_resp *resp);
/* PATCH /v1/endpoints/{id}: url, filter_types, ordering, disabled, metadata. */
void endpoints_update(struct handler_ctx *ctx, struct http_req *req, const char *id,
                      struct http_resp *resp);
/* DELETE /v1/endpoints/{id}, with its deliveries and attempts. */
void endpoints_delete(struct handler_ctx *ctx, struct http_req *req, const char *id,
                      struct http_resp *resp);
/* GET /v1/endpoints/{id}/secret: the signing secrets. */
void endpoints_secret(struct handler_ctx *ctx, struct http_req *req, const char *id,
                      struct http_resp *resp);
/* POST /v1/endpoints/{id}/secret/rotate: a new secret; the old one signs
 * on for the grace period. */
void endpoints_rotate(struct handler_ctx *ctx, struct http_req *req, const char *id,
                      struct http_resp *resp);
/* POST /v1/endpoints/{id}/secret/revoke: the previous secret stops at once. */
void endpoints_revoke(struct handler_ctx *ctx, struct http_req *req, const char *id,
                      struct http_resp *resp);

/*
 * The checks of a body's members, exported for the unit tests. Each
 * returns 0, or -1 with detail (dlen bytes) filled with what a client can
 * act on.
 */
/* An http:// or https:// URL of at most 2048 bytes of printable ASCII,
 * with a host. */
int endpoints_check_url(const char *url, char *detail, size_t dlen);
/* An event type name ("workflow.created") or a glob ("workflow.*"):
 * dot-separated segments of [A-Za-z0-9_-], at most 128 bytes; not of the
 * operator's own types (endpoint.*, delivery.*). */
int endpoints_check_type(const char *name, char *detail, size_t dlen);
/* "whsec_" and the base64 (standard, padded) of 24 to 64 bytes. */
int endpoints_check_secret(const char *secret, char *detail, size_t dlen);

#endif
