/*
 * metrics.h - Prometheus metrics of the whole worker pool: the counters and
 * their exposition. Nothing about HTTP: GET /metrics is ops.h's, and the
 * supervisor maps and updates the counters without knowing any request.
 *
 * The counters live in one shared memory segment that the supervisor maps
 * (MAP_SHARED | MAP_ANONYMOUS) before it forks the first worker, so every
 * worker inherits it and a scrape served by any worker sees them all. Each
 * worker counts into a slot of its own (the supervisor hands out the
 * lowest free one; a respawned worker takes over a dead one's slot and adds
 * to it), and a scrape sums the slots. A slot is never zeroed, so the
 * totals survive workers that die, are killed or are replaced. Every update
 * is a relaxed atomic add: slots keep workers off each other's cache
 * lines, and the atomics keep a shared slot exact in the rare case that
 * there are more live workers than slots, and a scrape from ever reading a
 * torn value.
 *
 * Label values are bounded: routes are templates (route.h), statuses
 * come from a fixed list (anything else is counted as "other").
 */
#ifndef IDF_METRICS_H
#define IDF_METRICS_H

#include "core/buf.h"
#include "core/err.h"
#include "core/idem.h"
#include "server/route.h"

#define METRICS_SLOTS 128

/*
 * Supervisor, before the first fork: map the shared counters (zeroed).
 * Calling it again keeps the existing segment. Returns 0 or -1 with e.
 */
int metrics_init(struct err *e) MUSTCHECK;

/* Supervisor, in a new worker right after fork: count into this slot. */
void metrics_use_slot(int slot);

/* Supervisor: the number of live workers, and one more unexpected exit. */
void metrics_set_workers(int live);
void metrics_worker_restarted(void);

/*
 * Worker, once per request, as soon as the answer is ready: so a client
 * that has its answer can already see it counted. route is the one the
 * router matched, from the request's context. reconnects is the
 * worker's db_reconnects() so far; only its growth is added.
 */
void metrics_request(enum route route, int status, enum idem_outcome idem, double seconds,
                     unsigned long reconnects);

/* Worker: the request just answered took its key row from the replay
 * cache (rcache.h), not from the database. */
void metrics_replay_cache_hit(void);

/* What a job completion that ran came to (not a replay of one, nor a
 * request refused before the command: 404, bad input, 5xx). The skips
 * are the completions the lease check refused: the worker's result was
 * not recorded. */
enum metrics_completion {
	MC_COMPLETED,
	MC_SKIPPED_LEASE_EXPIRED,    /* the worker's lease ran out */
	MC_SKIPPED_NOT_LEASE_HOLDER, /* another worker holds the lease now */
	MC_SKIPPED_NOT_ACTIVE,       /* the job is no longer active: finished by
	                              * another worker, or its workflow cancelled */
	MC__COUNT
};

/* Worker: count one job completion's outcome. */
void metrics_job_completion(enum metrics_completion outcome);

/* Gauges read from the database at scrape time: the outbox's, the jobs',
 * and the workflows parked in incident (one statement). */
struct metrics_outbox {
	long pending;
	double oldest_pending_s;
	long dead;
	long jobs_activatable;    /* jobs waiting for a worker to activate them */
	long jobs_leased;         /* active jobs whose lease still runs */
	long jobs_leases_expired; /* active jobs whose lease ran out (reap frees them) */
	long incidents;           /* workflows parked in incident */
};

/* Endpoints with a line of their own in
 * idemflow_endpoint_deliveries_pending: the most pending first; the rest
 * are summed in one line endpoint="other". */
#define METRICS_ENDPOINTS_TOP 10

/* The tenants' endpoints, as one /metrics statement reads them. */
struct metrics_deliveries {
	long disabled; /* endpoints disabled (by hand or for failing) */
	long pending;  /* pending deliveries, every endpoint */
	int n;         /* entries of top */
	struct {
		long tenant;
		char endpoint[40];
		long pending;
	} top[METRICS_ENDPOINTS_TOP];
};

/* Append the endpoints' gauges of md to out (after metrics_render()). */
void metrics_render_deliveries(struct buf *out, const struct metrics_deliveries *md);

/* Partitions with a line of their own in idemflow_partition_up; a
 * deployment with more shows the first ones only. */
#define METRICS_PARTITIONS_MAX 1024

/* Through a PL/Proxy proxy (routing = proxy): which partitions answered
 * this scrape's statements. The database gauges are sums over those. */
struct metrics_partitions {
	int n;                                          /* partitions the proxy names */
	unsigned char down[METRICS_PARTITIONS_MAX / 8]; /* bit p: partition p did not answer */
};

/* Append idemflow_partition_up, a line per partition of mp (after
 * metrics_render()). Not called for a single database, whose output has
 * no such series. */
void metrics_render_partitions(struct buf *out, const struct metrics_partitions *mp);

/*
 * Append the exposition (Prometheus text format 0.0.4) of the summed
 * counters, the pool's figures from the scoreboard (scoreboard.h) and the
 * build to out; ob NULL means the database statement failed
 * (idemflow_db_up 0, the outbox and job gauges left out).
 */
void metrics_render(struct buf *out, const struct metrics_outbox *ob);

/*
 * Does metrics_allow (comma-separated addresses and networks, IPv4 or
 * IPv6, "a.b.c.d/n"; "" allows none) contain addr? Returns 1 or 0, or -1
 * with e filled when the list does not parse (also used to check the
 * configuration before it is put in use: addr NULL).
 */
int metrics_allow_match(const char *allow, const char *addr, struct err *e);

#endif
