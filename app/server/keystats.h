/*
 * keystats.h - per-key replay and conflict counts, gathered in a worker's
 * memory and added to idempotency_key_stats in one statement at most once
 * a second.
 *
 * A replay must stay one read-only round trip, so nothing is written while
 * a request is answered: the worker notes the outcome, and later (after the
 * response has gone out, or when it has been idle for a second) flushes
 * every key it noted since the last flush with Q_KEYSTATS_FLUSH. Counts are
 * for debugging ("idemflow debug idempotency-check"), not for billing: a
 * worker killed with SIGKILL loses up to a second of them, and when more
 * distinct keys come in a second than the table holds, the extra ones are
 * not counted (keystats_dropped()).
 */
#ifndef IDF_KEYSTATS_H
#define IDF_KEYSTATS_H

#include <time.h>

#include "core/buf.h"
#include "core/db.h"
#include "core/err.h"
#include "core/idem.h"

#define KEYSTATS_SLOTS       1024 /* hash table size; a power of two */
#define KEYSTATS_MAX_KEYS    768  /* keys held between two flushes */
#define KEYSTATS_INTERVAL_MS 1000 /* at most one flush per interval */

struct keystats_entry {
	long tenant_id; /* 0: free slot */
	int replays;
	int conflicts;
	int in_flight;
	char key[IDEM_KEY_MAX + 1];
};

struct keystats {
	struct keystats_entry *slots; /* KEYSTATS_SLOTS, owned */
	int *order;                   /* used slot indexes, for the flush; owned */
	int n;                        /* keys held */
	unsigned long dropped;        /* notes lost to a full table */
	struct timespec last_flush;   /* CLOCK_MONOTONIC; attempted, not only succeeded */
	struct buf arr[5];            /* the flush's array parameters, reused */
};

/* Returns 0, or -1 when out of memory (ks is then unusable but safe to
 * free). */
int keystats_init(struct keystats *ks) MUSTCHECK;
void keystats_free(struct keystats *ks);

/* Count one request's outcome for (tenant_id, key); anything but a replay,
 * a reuse conflict or an in-flight refusal, and a request without a tenant
 * or a valid key, is ignored. key is copied. */
void keystats_note(struct keystats *ks, long tenant_id, const char *key, enum idem_outcome o);

/* Milliseconds until a flush is due: -1 when nothing is held, 0 when it
 * is due now. For the worker's poll timeout. */
long keystats_wait_ms(const struct keystats *ks);

/* Flush when something is held and the last attempt is at least
 * KEYSTATS_INTERVAL_MS old. Returns 1 when it flushed, 0 when there was
 * nothing to do yet, -1 with e filled when the statement failed (the counts
 * are kept and go with the next attempt). */
int keystats_flush_due(struct keystats *ks, struct db *db, struct err *e);

/* Flush now, whatever the interval (at worker exit). Same returns. */
int keystats_flush(struct keystats *ks, struct db *db, struct err *e);

/* Notes lost because the table was full. */
unsigned long keystats_dropped(const struct keystats *ks);

#endif
