/*
 * ids.h - identifiers made by the service: workflow ids, bearer tokens,
 * timestamps. Randomness comes from getrandom(2), for workflow ids through
 * a small per-process pool that a fork empties (ids.c).
 */
#ifndef IDF_IDS_H
#define IDF_IDS_H

#include <stdatomic.h>
#include <stddef.h>
#include <time.h>

#include "core/err.h"

#define IDS_UUID_LEN  36 /* without NUL */
#define IDS_TOKEN_LEN 47 /* "idf_" + 43 base64url characters, without NUL */
#define IDS_TS_LEN    27 /* 2026-11-29T14:00:00.123456Z, without NUL */

/* Fill buf with n random bytes. */
int ids_random(void *buf, size_t n) MUSTCHECK;

/* The same, for an identifier (a workflow id, a trace or span id): from
 * the process's pool, which a fork empties, when n is at most
 * IDS_RANDOM_ID_MAX. Not for secrets: a token reads its own. */
#define IDS_RANDOM_ID_MAX 32
int ids_random_id(void *buf, size_t n) MUSTCHECK;

/* A new UUIDv7 (time-ordered, so inserts stay at the right edge of the
 * primary key index) in canonical text form: out has IDS_UUID_LEN + 1 bytes.
 * Its first 74 bits are the time in 1/4096 ms, never at or below the last
 * one made under the same floor (ids_share_clock): ids made one after the
 * other by the processes sharing it sort in the order they were made,
 * whatever the wall clock does. */
int ids_uuid7(char *out) MUSTCHECK;

/* ids_uuid7 at the wall-clock time *now instead of CLOCK_REALTIME's. */
int ids_uuid7_at(char *out, const struct timespec *now) MUSTCHECK;

/*
 * Make *floor (in a MAP_SHARED mapping, zero at first) the last timestamp
 * handed out, for this process and every process forked from it from then
 * on: the supervisor calls it once for its pool, so workers, respawned ones
 * included, never make an id at or below one another made, even after the
 * clock stepped back. Without it each process has a floor of its own.
 * Borrowed: the mapping outlives every process that uses it.
 */
void ids_share_clock(atomic_ullong *floor);

/* 1 when s is a UUID in canonical lowercase or uppercase text form. */
int ids_is_uuid(const char *s);

/* A new bearer token: out has IDS_TOKEN_LEN + 1 bytes. */
int ids_token(char *out) MUSTCHECK;

/* The current UTC time with microseconds: out has IDS_TS_LEN + 1 bytes. */
void ids_now(char *out);

#endif
