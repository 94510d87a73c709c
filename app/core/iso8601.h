/*
 * iso8601.h - ISO 8601 durations and RFC 3339 times, read exactly as far
 * as PostgreSQL reads them too.
 *
 * A workflow's "sleep", "until", "timeout" and a message's "ttl" reach
 * PostgreSQL as text long after the request that carried them: a timer is
 * set when its step begins, maybe in the reaper's batch for every tenant.
 * A value PostgreSQL refuses then fails that batch, not the request. So
 * what these parsers accept is a subset of what PostgreSQL's interval and
 * timestamptz input accept, and t/db/test_iso8601 holds them to it.
 *
 * Not for: dates without a time, week dates, durations in years, months
 * or weeks (a month has no fixed length), leap seconds, "24:00:00".
 * No allocation; nothing here touches errno or the locale.
 */
#ifndef IDF_ISO8601_H
#define IDF_ISO8601_H

#include <stddef.h>
#include <stdint.h>

/* The largest time-zone offset PostgreSQL takes: 15:59 (it refuses 16:00
 * with "time zone displacement out of range"). */
#define ISO8601_OFFSET_MAX_MIN (15 * 60 + 59)

/* The instants a time may name, in microseconds since 1970-01-01T00:00Z:
 * 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z, after the offset
 * is applied (PostgreSQL goes further; this keeps every instant a
 * four-digit year when written back in UTC). */
#define ISO8601_TIME_MIN_US (-62135596800LL * 1000000LL)
#define ISO8601_TIME_MAX_US (253402300800LL * 1000000LL - 1)

/*
 * An ISO 8601 duration PnDTnHnMn.nS (each part optional, at least one
 * present, in that order; 1 to 9 digits a part; only the seconds take a
 * fraction, of 1 to 6 digits). Returns 0 with *usecs (may be NULL) its
 * length in microseconds, or -1 with why (a phrase, no trailing period)
 * filled.
 */
int iso8601_duration(const char *s, int64_t *usecs, char *why, size_t wlen)
    __attribute__((warn_unused_result));

/*
 * An RFC 3339 date-time, "2026-12-01T20:00:00Z" or with an offset of at
 * most ISO8601_OFFSET_MAX_MIN ("+02:00"), up to six decimals of a second,
 * a real date and time, an instant within ISO8601_TIME_MIN_US and
 * ISO8601_TIME_MAX_US. Returns 0 with *unix_us (may be NULL) the instant,
 * or -1 with why filled.
 */
int iso8601_time(const char *s, int64_t *unix_us, char *why, size_t wlen)
    __attribute__((warn_unused_result));

#endif
