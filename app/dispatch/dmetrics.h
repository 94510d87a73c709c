/*
 * dmetrics.h - the dispatcher's metrics while it runs: per sink and per
 * outcome counters, the broker's duplicates, and the delivery lag as a
 * Prometheus histogram, written to the `textfile` for node_exporter's
 * textfile collector.
 *
 * Why a textfile and not a port of its own: the dispatcher already writes
 * one at the end of a cron run, node_exporter is what scrapes a host's
 * batch jobs, and a file needs no listener, no address to configure and
 * no access control beside the server's /metrics. With --loop it is
 * rewritten after every round (a drain that came back empty, a wake-up
 * from LISTEN or the poll interval) and, while a long drain goes on, at
 * most once a second; every write goes through a temporary file and
 * rename(2), so the collector reads one whole file or the previous one.
 * idemflow_dispatch_last_write_timestamp_seconds tells a stale file (a
 * dispatcher that stopped) from a quiet one.
 *
 * The counters are the process's since it started (counters in
 * Prometheus's sense: a restart resets them). The lag is the time from an
 * event's creation, its payload's occurred_at (written by the statement
 * that writes created_at, from the same now()), to the sink's answer that
 * delivered it; an event whose payload has no occurred_at is counted but
 * not observed in the histogram.
 *
 * One dispatcher per process: the state is this module's, not a struct
 * handed around. Nothing here touches the database.
 */
#ifndef IDF_DMETRICS_H
#define IDF_DMETRICS_H

#include "core/err.h"
#include "dispatch/sink.h"

/*
 * Start counting for sink (its name, copied) and write to textfile
 * (borrowed for the run) after every round when loop. Without a textfile
 * ("" or NULL) the lag is not measured: nothing would show it.
 */
void dmetrics_start(const char *sink, const char *textfile, int loop);

/* One attempt's outcome: delivered, or failed and retried, or dead.
 * Called for every attempted event of a batch, once. */
void dmetrics_outcome(const struct sink_event *ev, const struct sink_outcome *o, int dead);

/* One attempt to deliver to a tenant endpoint (fanout.c): its ledger
 * class (struct sink_outcome's cls: succeeded, http, timeout, connect,
 * tls, other) and what became of the delivery: delivered, retried or
 * dead (dead: 1 when it went dead). */
void dmetrics_endpoint_attempt(const char *cls, int dead);

/* n endpoints were disabled for failing by this dispatcher's records. */
void dmetrics_endpoints_disabled(long n);

/* A round ended (with --loop): rewrite the textfile. A failed write is
 * logged once until one succeeds again, never fatal. */
void dmetrics_round(void);

/* What a run came to, for the end of a run's gauges (main.c copies its
 * struct dispatch_stats: dispatch.c includes this header, not the other
 * way round). */
struct dmetrics_run {
	long claimed, published, retried, dead, broker_duplicates, pending;
	double oldest_pending_s, duration_s;
};

/*
 * Write the textfile at the end of a run: the counters, and the last run's
 * gauges (run NULL: the run failed before it started; ok 0: it failed).
 * Returns 0, or -1 with e.
 */
int dmetrics_write(const char *path, const struct dmetrics_run *run, int ok,
                   struct err *e) MUSTCHECK;

/* The delivery lag of an event created at occurred_at (RFC 3339), seen
 * now (s since the epoch): seconds, >= 0; -1 when occurred_at is not a
 * time. For the tests. */
double dmetrics_lag(const char *occurred_at, double now);

#endif
