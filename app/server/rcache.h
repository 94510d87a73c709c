/*
 * rcache.h - a worker's replay cache: the stored key rows it fetched with
 * a token in the last replay_cache_ttl, so that a retry of the same key
 * with the same token is answered without a round trip.
 *
 * What it holds is the row of Q_AUTH_KEY (the tenant, the key's
 * fingerprints and its stored response), under the token's digest and the
 * key: a hit stands for "this token was valid, and this key's row was
 * this, at most replay_cache_ttl ago". A stored response never changes
 * while its key lives, so the only things a hit can miss are a revocation
 * of the token and the key's expiry. The expiry is kept: an entry lives at
 * most until the key expires, measured by the database when the row was
 * read (KEY_COL_MS_LEFT, the milliseconds the key had left). The revocation is
 * the window: "idemflow token revoke" waits replay_cache_ttl before it
 * returns, so once it has returned no worker answers the token. A hit
 * only ever gives a token the stored answer of a key of its own tenant,
 * which any of the tenant's tokens could read the same way.
 *
 * Rows still being written (status 0) and expired rows are never held.
 * Memory is bounded: RCACHE_SLOTS entries, direct mapped (a new row takes
 * its slot from whatever held it), each at most RCACHE_MAX_ROW bytes of
 * values: about 2.2 MiB per worker when every slot holds a row that large,
 * 80 KiB of slots otherwise, allocated by the first row held.
 */
#ifndef IDF_RCACHE_H
#define IDF_RCACHE_H

#include <libpq-fe.h>
#include <stddef.h>
#include <stdint.h>

#include "core/fp.h"
#include "core/idem.h"
#include "server/queries.h"

#define RCACHE_SLOTS   256  /* a power of two */
#define RCACHE_MAX_ROW 8192 /* bytes of values; a larger row is not held */

/* A held row has Q_AUTH_KEY's columns (enum key_col, server/queries.h). */
enum { RCACHE_NCOLS = KEY_COL__N };

struct rcache_entry {
	PGresult *row;      /* NULL: free; owned */
	long long deadline; /* rcache_now_ms() after which the entry is void */
	uint8_t token[FP_LEN];
	char key[IDEM_KEY_MAX + 1];
};

struct rcache {
	struct rcache_entry *slots; /* RCACHE_SLOTS, allocated on the first put */
	unsigned long hits;
	unsigned long puts;
};

/* Milliseconds of CLOCK_MONOTONIC: the clock of every deadline. */
long long rcache_now_ms(void);

/* A zeroed struct rcache is an empty cache; free it with this. */
void rcache_free(struct rcache *rc);

/*
 * A copy of the row held for (token, key) whose deadline is after now, or
 * NULL. The caller owns the copy (PQclear). An entry found past its
 * deadline is dropped.
 */
PGresult *rcache_get(struct rcache *rc, const uint8_t token[FP_LEN], const char *key,
                     long long now);

/*
 * Hold a copy of row, a Q_AUTH_KEY result of one row for (token, key),
 * until asked_at + min(ttl_ms, the key's milliseconds left): asked_at is
 * rcache_now_ms() taken before the statement was sent, so the entry ends
 * no later than the key does. Returns 1 when held; 0 when the row is not
 * one to hold (no key row, status 0, expired, too large, ttl_ms <= 0) or
 * memory ran out, which costs nothing but the next round trip.
 */
int rcache_put(struct rcache *rc, const uint8_t token[FP_LEN], const char *key, const PGresult *row,
               long ttl_ms, long long asked_at);

#endif
