/*
 * queries.h - every SQL statement the dispatcher runs, prepared once per
 * connection (and again after a reconnect) from one table, as the server's
 * are (app/server/queries.h).
 *
 * The SQL text lives in queries.c only; dispatch.c names a statement by its
 * enum and fills its parameters by name (the enums below). Each statement's
 * count is its parameter enum's __N: dispatch_queries_check() holds it
 * against the SQL before the dispatcher starts, and every call is held
 * against it before anything is sent.
 */
#ifndef IDF_DISPATCH_QUERIES_H
#define IDF_DISPATCH_QUERIES_H

#include "core/db.h"

enum dispatch_query_id {
	/* Lease up to a batch of due events, each the first pending one of
	 * its workflow -> (id, event_id, type, workflow_id, attempts, payload,
	 * traceparent, tracestate) per event. The attempt is counted when it
	 * starts, so a dispatcher that dies mid-delivery still leaves the
	 * attempt on record. */
	DQ_CLAIM,
	/* Mark delivered events published (enum dq_done_param). */
	DQ_DONE,
	/* Record failed attempts: retried later, or dead (enum
	 * dq_fail_param). The later events of a workflow whose event dies
	 * wait for its requeue: parked at 'infinity', they leave every
	 * claim's range (sql/012_held_events.sql). */
	DQ_FAIL,
	/* Claimed but never attempted (the lease was about to run out, or the
	 * run is stopping): hand them back untouched (enum
	 * dq_release_param). */
	DQ_RELEASE,
	/* -> (pending events, age in seconds of the oldest pending one or 0) */
	DQ_STATS,
	/* --loop: on every (re)connection, since a new session listens to
	 * nothing. */
	DQ_LISTEN,
	/* Tenant endpoints (fanout.c). Lease up to a batch of due pending
	 * deliveries of enabled endpoints, each, for an endpoint with
	 * ordering 'workflow', the first pending or dead one of its endpoint
	 * and workflow -> (tenant_id, endpoint_id, workflow_id, seq, attempts,
	 * event_id, type, payload, traceparent, tracestate, url, secret,
	 * previous secret or NULL) per delivery. The attempt is counted when
	 * it starts, as DQ_CLAIM's. */
	DQ_FCLAIM,
	/* Record attempts (enum dq_frecord_param) through
	 * idemflow_deliveries_record() (sql/021_delivery_record.sql) ->
	 * (recorded, disabled). */
	DQ_FRECORD,
	/* Claimed, never attempted: hand back (enum dq_frelease_param). */
	DQ_FRELEASE,
	DQ__COUNT
};

/*
 * The parameters of each statement, in $n order ($1 is the first name): a
 * caller fills its array by name, const char *p[DQ_DONE__N] = {[DQ_DONE_IDS]
 * = ...}, and passes the count. Text format; arrays are PostgreSQL's array
 * literals ("{1,2}"). The lease owner of the recording statements is the
 * claim's: a recording touches only the events its own claim leased.
 */

/* DQ_CLAIM */
enum dq_claim_param {
	DQ_CLAIM_BATCH, /* the most events to lease */
	DQ_CLAIM_OWNER, /* the lease owner: host:pid:n, new for every claim */
	DQ_CLAIM_LEASE, /* interval */
	DQ_CLAIM__N
};

/* DQ_DONE */
enum dq_done_param {
	DQ_DONE_IDS, /* bigint[] */
	DQ_DONE_OWNER,
	DQ_DONE__N
};

/* DQ_FAIL: the arrays are of one length, an event's entries at one index */
enum dq_fail_param {
	DQ_FAIL_IDS,       /* bigint[] */
	DQ_FAIL_OWNER,     /* the claim's */
	DQ_FAIL_ERRORS,    /* text[], kept as last_error */
	DQ_FAIL_DELAYS_MS, /* bigint[], until the next attempt */
	DQ_FAIL_DEAD,      /* bool[], true: the last attempt failed */
	DQ_FAIL__N
};

/* DQ_RELEASE */
enum dq_release_param {
	DQ_RELEASE_IDS, /* bigint[] */
	DQ_RELEASE_OWNER,
	DQ_RELEASE__N
};

/* DQ_FCLAIM */
enum dq_fclaim_param { DQ_FCLAIM_BATCH, DQ_FCLAIM_OWNER, DQ_FCLAIM_LEASE, DQ_FCLAIM__N };

/* DQ_FRECORD: the arrays are of one length, an attempt's entries at one index */
enum dq_frecord_param {
	DQ_FRECORD_OWNER,
	DQ_FRECORD_TENANTS,      /* bigint[] */
	DQ_FRECORD_ENDPOINTS,    /* uuid[] */
	DQ_FRECORD_WORKFLOWS,    /* uuid[] */
	DQ_FRECORD_SEQS,         /* integer[] */
	DQ_FRECORD_EVENT_IDS,    /* text[] */
	DQ_FRECORD_STARTED,      /* float8[]: unix seconds */
	DQ_FRECORD_DURATIONS,    /* float8[]: ms */
	DQ_FRECORD_STATUSES,     /* integer[]: 0 = no answer */
	DQ_FRECORD_OUTCOMES,     /* text[]: the ledger's classes */
	DQ_FRECORD_RESPONSES,    /* text[]: the first 4 KiB of each answer */
	DQ_FRECORD_ERRORS,       /* text[] */
	DQ_FRECORD_DELAYS_MS,    /* bigint[] */
	DQ_FRECORD_DEAD,         /* bool[] */
	DQ_FRECORD_MAX_FAILURES, /* endpoint_disable_failures */
	DQ_FRECORD_AFTER,        /* endpoint_disable_after, an interval */
	DQ_FRECORD__N
};

/* DQ_FRELEASE: the deliveries as four arrays of one length */
enum dq_frelease_param {
	DQ_FRELEASE_TENANTS,
	DQ_FRELEASE_ENDPOINTS,
	DQ_FRELEASE_WORKFLOWS,
	DQ_FRELEASE_SEQS,
	DQ_FRELEASE_OWNER,
	DQ_FRELEASE__N
};

/* DQ_STATS and DQ_LISTEN take no parameters. */
enum { DQ_STATS__N = 0, DQ_LISTEN__N = 0 };

extern const struct db_stmt dispatch_queries[DQ__COUNT];

/* db_stmt_check() over the whole table: 0, or -1 with e (ERR_INTERNAL)
 * naming the first statement whose count and SQL differ. idemflow-dispatch
 * runs it before it opens its sink or connects anywhere. */
int dispatch_queries_check(struct err *e) MUSTCHECK;

#endif
