/*
 * dispatch.h - draining the outbox: claim due events, deliver them through
 * a sink, record the outcome. At least once, never holding a transaction
 * open across the network.
 *
 * A claim is one short statement: it picks due events with FOR UPDATE
 * SKIP LOCKED, skipping any event whose workflow still has an earlier
 * undelivered event (per-workflow order, no head-of-line blocking across
 * workflows), and leases them to this dispatcher (lease_owner,
 * lease_until). The outcome is written by a second statement, only where
 * the lease is still ours. A dispatcher that dies leaves leases that run
 * out; the events are then delivered again with the same event id.
 */
#ifndef IDF_DISPATCH_H
#define IDF_DISPATCH_H

#include "core/conf.h"
#include "core/err.h"
#include "dispatch/sink.h"

#define DISPATCH_BACKOFF_MAX    32
#define DISPATCH_LEASE_MARGIN_S 1 /* stop delivering this long before a lease ends */

struct dispatch_stats {
	long claimed;
	long published;
	long broker_duplicates; /* of published: the broker already held them */
	long retried;
	long dead;
	long pending;            /* undelivered, not dead, at the end */
	double oldest_pending_s; /* age of the oldest of them */
	double duration_s;
	/* The tenant endpoints' deliveries (fanout.h), when `endpoints` is on. */
	long ep_claimed;
	long ep_delivered;
	long ep_retried;
	long ep_dead;
	long ep_disabled; /* endpoints disabled for failing */
};

struct dispatcher;

/*
 * Connect, prepare, and in loop mode LISTEN. c, s and es are borrowed and
 * must outlive the dispatcher. es is the tenant endpoints' sink
 * (sink_http_open_endpoints()), or NULL when this dispatcher leaves them
 * to another (`endpoints = false`): with it, every round drains the
 * outbox through s, then the due deliveries through es. Returns NULL with e filled: ERR_CONFIG for
 * a bad backoff, ERR_DB_DOWN when the database is unreachable, ERR_DB for
 * other database errors (e.g. not migrated).
 */
struct dispatcher *dispatch_new(const struct conf *c, struct sink *s, struct sink *es,
                                struct err *e) MUSTCHECK;
void dispatch_free(struct dispatcher *d);

/* Run until nothing is due (once), or until stopped (loop), or until
 * max_runtime. Returns 0, or -1 with e filled when the database failed. */
int dispatch_run(struct dispatcher *d, struct dispatch_stats *st, struct err *e) MUSTCHECK;

/* Ask a running dispatch_run to stop after its current batch. Async-signal-safe. */
void dispatch_stop(void);

/* Parse "5s,5m,30m" into ms delays (at most max). Returns the count, or -1
 * with e filled naming the key and the bad element. */
int dispatch_backoff_parse(const char *spec, long *delays, int max, struct err *e);

/* The delay after failed attempt `attempt` (1-based): the schedule's entry,
 * the last one repeating, with +-20% jitter from *seed. */
long dispatch_backoff_delay(const long *delays, int n, int attempt, unsigned *seed);

#endif
