/*
 * events.h - the tenant's event feed, the deliveries of its events to its
 * endpoints and their attempt ledger, and the two commands that send
 * deliveries again (recover and resend). Called by api.c after routing
 * and authentication; the endpoints themselves are endpoints.h's.
 *
 * A delivery is {"endpoint_id","event_id","state","attempts",
 * "next_attempt_at","last_error","updated_at"}; an attempt is {"id",
 * "event_id","trigger","started_at","duration_ms","status","outcome",
 * "response"}. Another tenant's event or endpoint is 404, as a missing
 * one is.
 */
#ifndef IDF_EVENTS_H
#define IDF_EVENTS_H

#include "server/handler.h"

/* Outbox rows read per page of the feed, of every tenant (EVENTS_FEED_SCAN
 * in queries.h): the most a page costs, whatever the tenant's share of
 * the outbox. */
#define EVENTS_SCAN_ROWS 10000

/* GET /v1/events?after=&limit=: the tenant's events in the order they
 * were written (their outbox id, the cursor), keyset pages. */
void events_feed(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp);

/* GET /v1/events/{id}/deliveries: one event's delivery to each endpoint,
 * pages in endpoint id order (?after=<endpoint id>). */
void events_deliveries(struct handler_ctx *ctx, struct http_req *req, const char *id,
                       struct http_resp *resp);

/* POST /v1/events/{id}/resend (keyed), {"endpoint_id"}: that delivery
 * pending again, due now, trigger 'manual'; 409 state-conflict when the
 * event has no delivery to that endpoint. */
void events_resend(struct handler_ctx *ctx, struct http_req *req, const char *id,
                   struct http_resp *resp);

/* GET /v1/endpoints/{id}/attempts?status=&after=&limit=: the endpoint's
 * attempts newest first; status is succeeded, failed or an HTTP status
 * (100 to 599). */
void events_attempts(struct handler_ctx *ctx, struct http_req *req, const char *id,
                     struct http_resp *resp);

/* GET /v1/endpoints/{id}/undelivered?state=&after=&limit=: the endpoint's
 * deliveries not delivered (pending, dead, skipped, or the one state
 * asked for), in event stream order (?after=<event id>). */
void events_undelivered(struct handler_ctx *ctx, struct http_req *req, const char *id,
                        struct http_resp *resp);

/* POST /v1/endpoints/{id}/recover (keyed), {"since","until","types",
 * "states"}: the matching dead and skipped deliveries pending again, due
 * now, trigger 'recover' -> {"recovered": n}. */
void events_recover(struct handler_ctx *ctx, struct http_req *req, const char *id,
                    struct http_resp *resp);

#endif
