/*
 * test_iso8601.c - whatever core/iso8601.h takes, PostgreSQL takes too,
 * as the same instant or the same length.
 *
 * A timer's "until", "sleep" or "timeout" is cast by PostgreSQL only when
 * its step begins, perhaps inside the reaper's batch for every tenant, so
 * the parsers must never take a value PostgreSQL refuses. Every value of
 * a grid over each field's edges (years, months, days, times, offsets,
 * fractions), and strings drawn from the designators at random, goes to
 * both: each one the parser takes must be taken by PostgreSQL and read as
 * the same microsecond. (The parsers refuse some values PostgreSQL takes:
 * they are stricter on purpose.)
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/buf.h"
#include "core/db.h"
#include "core/iso8601.h"

static PGconn *conn;

static void setup(void)
{
	struct err e;
	PGresult *res;

	conn = db_connect_simple(getenv("DATABASE_URL"), "test_iso8601", &e);
	cr_assert_not_null(conn, "%s", e.msg);
	/* What PostgreSQL makes of one value, NULL when it refuses it. */
	res = PQexec(conn,
	             "SET TimeZone = 'UTC';"
	             "CREATE FUNCTION pg_temp.ts_us(v text) RETURNS bigint LANGUAGE plpgsql AS $$"
	             "BEGIN RETURN (extract(epoch FROM v::timestamptz) * 1000000)::bigint;"
	             "EXCEPTION WHEN OTHERS THEN RETURN NULL; END $$;"
	             "CREATE FUNCTION pg_temp.iv_us(v text) RETURNS bigint LANGUAGE plpgsql AS $$"
	             "BEGIN RETURN (extract(epoch FROM v::interval) * 1000000)::bigint;"
	             "EXCEPTION WHEN OTHERS THEN RETURN NULL; END $$;");
	cr_assert_eq(PQresultStatus(res), PGRES_COMMAND_OK, "%s", PQerrorMessage(conn));
	PQclear(res);
}

static void teardown(void)
{
	PQfinish(conn);
}

TestSuite(iso8601, .init = setup, .fini = teardown);

/*
 * Send the values in batches to fn (ts_us or iv_us) beside what the parser
 * made of them; every one the parser took must come back equal.
 */
static void compare(const char *fn, int (*parse)(const char *, int64_t *, char *, size_t),
                    char **values, long n)
{
	char sql[512], why[128];
	long taken = 0;

	snprintf(sql, sizeof(sql),
	         "SELECT v, want, got FROM (SELECT v, want, pg_temp.%s(v) AS got"
	         "  FROM unnest($1::text[], $2::bigint[]) AS u(v, want)) s"
	         " WHERE want IS NOT NULL AND got IS DISTINCT FROM want",
	         fn);
	for (long at = 0; at < n; at += 5000) {
		struct buf arr = { 0 }, want = { 0 };
		long end = at + 5000 < n ? at + 5000 : n;
		const char *p[2];
		PGresult *res;

		for (long i = at; i < end; i++) {
			int64_t us = 0;
			int ok = parse(values[i], &us, why, sizeof(why)) == 0;
			char num[32];

			buf_append(&arr, i == at ? "{\"" : ",\"", 2);
			buf_append(&arr, values[i], strlen(values[i]));
			buf_append(&arr, "\"", 1);
			if (ok)
				snprintf(num, sizeof(num), "%s%" PRId64, i == at ? "{" : ",", us);
			else
				snprintf(num, sizeof(num), "%sNULL", i == at ? "{" : ",");
			buf_append(&want, num, strlen(num));
			taken += ok;
		}
		buf_append(&arr, "}", 2);
		buf_append(&want, "}", 2);
		p[0] = arr.data;
		p[1] = want.data;
		res = PQexecParams(conn, sql, 2, NULL, p, NULL, NULL, 0);
		cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "%s", PQerrorMessage(conn));
		for (int r = 0; r < PQntuples(res) && r < 10; r++)
			cr_log_error("\"%s\": the parser took it as %s, PostgreSQL %s",
			             PQgetvalue(res, r, 0), PQgetvalue(res, r, 1),
			             PQgetisnull(res, r, 2) ? "refused it" : PQgetvalue(res, r, 2));
		cr_assert_eq(PQntuples(res), 0, "%d values the parser took read otherwise",
		             PQntuples(res));
		PQclear(res);
		buf_free(&arr);
		buf_free(&want);
	}
	/* Not a vacuous pass: a good share of the values were taken. */
	cr_assert_gt(taken, n / 20, "only %ld of %ld values taken", taken, n);
	cr_log_info("%s: %ld values, %ld taken by the parser, each read alike", fn, n, taken);
}

static char *dup(const char *s)
{
	char *d = strdup(s);

	cr_assert_not_null(d);
	return d;
}

/* n random strings of 1 to 14 characters from alphabet. */
static long draw(char **out, long at, long n, const char *alphabet, unsigned *seed)
{
	size_t na = strlen(alphabet);

	for (long i = 0; i < n; i++) {
		char s[16];
		int len = 1 + rand_r(seed) % 14;
		for (int k = 0; k < len; k++)
			s[k] = alphabet[rand_r(seed) % na];
		s[len] = '\0';
		out[at + i] = dup(s);
	}
	return at + n;
}

Test(iso8601, every_time_the_parser_takes_postgresql_takes_as_the_same_instant)
{
	static const char *const years[] = { "0001", "0002", "1582", "1900", "1969", "1970",
		                             "2000", "2024", "2026", "9998", "9999" };
	static const char *const months[] = { "00", "01", "02", "04", "12", "13" };
	static const char *const days[] = { "00", "01", "28", "29", "30", "31", "32" };
	static const char *const times[] = { "00:00:00", "23:59:59", "24:00:00", "12:60:00",
		                             "12:00:60" };
	static const char *const fracs[] = { "", ".5", ".999999" };
	static const char *const zones[] = { "Z",      "+00:00", "-00:00", "+01:30", "+15:59",
		                             "-15:59", "+16:00", "-16:00", "+23:59", "-23:59" };
	long cap = 11L * 6 * 7 * 5 * 3 * 10 + 20000, n = 0;
	char **v = calloc((size_t)cap, sizeof(*v));
	unsigned seed = 8601;

	cr_assert_not_null(v);
	for (size_t a = 0; a < 11; a++)
		for (size_t b = 0; b < 6; b++)
			for (size_t c = 0; c < 7; c++)
				for (size_t d = 0; d < 5; d++)
					for (size_t f = 0; f < 3; f++)
						for (size_t z = 0; z < 10; z++) {
							char s[64];
							snprintf(s, sizeof(s), "%s-%s-%sT%s%s%s",
							         years[a], months[b], days[c],
							         times[d], fracs[f], zones[z]);
							v[n++] = dup(s);
						}
	n = draw(v, n, 20000, "0123456789-:T.Z+", &seed);
	compare("ts_us", iso8601_time, v, n);
	for (long i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

Test(iso8601, every_duration_the_parser_takes_postgresql_takes_as_the_same_length)
{
	static const char *const nums[] = { "0", "1", "59", "60", "86399", "999999999" };
	static const char *const fracs[] = { "", ".5", ".000001", ".999999" };
	long cap = 6L * 6 * 6 * 6 * 4 * 2 + 30000, n = 0;
	char **v = calloc((size_t)cap, sizeof(*v));
	unsigned seed = 8601;

	cr_assert_not_null(v);
	/* P<d>DT<h>H<m>M<s>S and the same without days. */
	for (size_t d = 0; d < 6; d++)
		for (size_t h = 0; h < 6; h++)
			for (size_t m = 0; m < 6; m++)
				for (size_t s = 0; s < 6; s++)
					for (size_t f = 0; f < 4; f++) {
						char str[96];
						snprintf(str, sizeof(str), "P%sDT%sH%sM%s%sS",
						         nums[d], nums[h], nums[m], nums[s],
						         fracs[f]);
						v[n++] = dup(str);
						snprintf(str, sizeof(str), "PT%sH%s%sS", nums[h],
						         nums[s], fracs[f]);
						v[n++] = dup(str);
					}
	n = draw(v, n, 30000, "P1T2D3H4M5S9.0", &seed);
	compare("iv_us", iso8601_duration, v, n);
	for (long i = 0; i < n; i++)
		free(v[i]);
	free(v);
}
