/*
 * fanout.h - delivering to the tenant endpoints (sql/020_endpoints.sql):
 * the delivery loop beside the outbox loop of dispatch.c.
 *
 * Each event of a tenant has, from the transaction that wrote it, one
 * delivery row per endpoint of the tenant whose filter matched. This loop
 * claims due pending deliveries (FOR UPDATE SKIP LOCKED, leased as events
 * are), POSTs each event's stored payload to its endpoint's URL, signed
 * with the endpoint's secret (and its previous one during a rotation's
 * grace period), and records every attempt in the ledger with
 * idemflow_deliveries_record() (sql/021_delivery_record.sql), which also
 * keeps each endpoint's health and writes the operational events.
 *
 * Isolation: the claim takes deliveries, not events. For an endpoint with
 * ordering 'workflow' it skips a delivery while an earlier one of the same
 * endpoint and workflow is pending or dead (a lookup in the deliveries'
 * primary key): a dead delivery holds back only its own endpoint's later
 * deliveries of that workflow, never another endpoint's, and never the
 * operator's sink, which drains the outbox as it always has.
 *
 * Not for: the configured sink's events (dispatch.c), the routes that
 * read the ledger or recover deliveries (the server).
 */
#ifndef IDF_FANOUT_H
#define IDF_FANOUT_H

#include "core/conf.h"
#include "core/db.h"
#include "core/err.h"
#include "dispatch/sink.h"

struct fanout_stats {
	long claimed;
	long delivered;
	long retried;
	long dead;
	long disabled; /* endpoints disabled for failing */
};

/* What a round needs from its dispatcher; everything borrowed. */
struct fanout {
	const struct conf *c;
	struct db *db;     /* the dispatcher's connection (prepared with dispatch_queries) */
	struct sink *sink; /* sink_http_open_endpoints() */
	const long *delays;
	int ndelays;
	unsigned *seed;
	/* The back-off and the lease margin of dispatch.h, handed down so
	 * that this module needs nothing of the loop above it. */
	long (*backoff)(const long *delays, int n, int attempt, unsigned *seed);
	int lease_margin_s;
	const char *owner;    /* host:pid */
	unsigned long claims; /* claims made: each leases under owner:f<n> */
};

/*
 * Claim, deliver and record batch after batch until a claim comes back
 * empty, *stopping becomes true or more(arg) says no more. While the
 * sink delivers batch k, a thread records batch k-1 and claims batch k+1
 * on the connection (the loop does not touch it meanwhile). Returns 1
 * when it claimed something, 0 when nothing was due, or -1 with e filled
 * when the database or the sink failed (claimed deliveries then wait for
 * their lease to run out and are sent again). What a stop leaves
 * unattempted is handed back.
 */
int fanout_drain(struct fanout *f, struct fanout_stats *st, volatile const int *stopping,
                 int (*more)(void *arg), void *arg, struct err *e) MUSTCHECK;

#endif
