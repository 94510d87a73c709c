/*
 * test_rcache.c - the replay cache: what it holds, for whom, and for how
 * long. Rows are built the way libpq builds a Q_AUTH_KEY result, without
 * a connection (PQmakeEmptyPGresult, PQsetResultAttrs, PQsetvalue).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "server/rcache.h"

static const char *const names[RCACHE_NCOLS] = { "tenant_id",        "fingerprint", "status",
	                                         "headers",          "body",        "expired",
	                                         "request_bytes_fp", "ms_left",     "id" };

/* A Q_AUTH_KEY row; a NULL value is a NULL column. */
static PGresult *row(const char *tenant, const char *fp, const char *status, const char *body,
                     const char *expired, const char *ms_left)
{
	PGresAttDesc att[RCACHE_NCOLS];
	const char *v[RCACHE_NCOLS] = { tenant,  fp,      status, "Location: /x\r\n", body, expired,
		                        "\\x00", ms_left, "42" };
	PGresult *r = PQmakeEmptyPGresult(NULL, PGRES_TUPLES_OK);

	cr_assert_not_null(r);
	memset(att, 0, sizeof(att));
	for (int i = 0; i < RCACHE_NCOLS; i++) {
		att[i].name = (char *)names[i];
		att[i].typlen = -1;
	}
	cr_assert(PQsetResultAttrs(r, RCACHE_NCOLS, att));
	for (int i = 0; i < RCACHE_NCOLS; i++)
		cr_assert(PQsetvalue(r, 0, i, (char *)v[i], v[i] == NULL ? -1 : (int)strlen(v[i])));
	return r;
}

static PGresult *live_row(const char *body)
{
	return row("7", "\\xab", "201", body, "f", "86400000");
}

static void token(uint8_t t[FP_LEN], int seed)
{
	memset(t, seed, FP_LEN);
}

Test(rcache, a_held_row_comes_back_whole_for_its_token_and_key)
{
	struct rcache rc = { 0 };
	uint8_t t[FP_LEN];
	PGresult *r = live_row("{\"id\":\"a\"}"), *got;

	token(t, 1);
	cr_assert_eq(rcache_put(&rc, t, "k1", r, 1000, 5000), 1);
	PQclear(r); /* the cache keeps its own copy */
	got = rcache_get(&rc, t, "k1", 5999);
	cr_assert_not_null(got);
	cr_assert_eq(PQntuples(got), 1);
	cr_assert_eq(PQnfields(got), RCACHE_NCOLS);
	cr_assert_str_eq(PQgetvalue(got, 0, 0), "7");
	cr_assert_str_eq(PQgetvalue(got, 0, 2), "201");
	cr_assert_str_eq(PQgetvalue(got, 0, 3), "Location: /x\r\n");
	cr_assert_str_eq(PQgetvalue(got, 0, 4), "{\"id\":\"a\"}");
	cr_assert_eq(PQgetlength(got, 0, 4), 10);
	cr_assert_str_eq(PQgetvalue(got, 0, KEY_COL_TOKEN), "42", "the asking token's id");
	PQclear(got);
	cr_assert_eq(rc.hits, 1);
	rcache_free(&rc);
}

Test(rcache, another_token_or_key_misses)
{
	struct rcache rc = { 0 };
	uint8_t t[FP_LEN], other[FP_LEN];
	PGresult *r = live_row("{}");

	token(t, 1);
	token(other, 1);
	other[FP_LEN - 1] = 2; /* same slot, another token */
	cr_assert_eq(rcache_put(&rc, t, "k1", r, 1000, 0), 1);
	cr_assert_null(rcache_get(&rc, other, "k1", 1));
	cr_assert_null(rcache_get(&rc, t, "k2", 1));
	cr_assert_null(rcache_get(&rc, t, "k", 1));
	cr_assert_eq(rc.hits, 0);
	PQclear(r);
	rcache_free(&rc);
}

Test(rcache, an_entry_ends_after_the_ttl_counted_from_before_the_statement)
{
	struct rcache rc = { 0 };
	uint8_t t[FP_LEN];
	PGresult *r = live_row("{}"), *got;

	token(t, 3);
	cr_assert_eq(rcache_put(&rc, t, "k", r, 1000, 10000), 1);
	got = rcache_get(&rc, t, "k", 10999);
	cr_assert_not_null(got, "1 ms before the deadline");
	PQclear(got);
	cr_assert_null(rcache_get(&rc, t, "k", 11000), "at the deadline");
	cr_assert_null(rcache_get(&rc, t, "k", 10500), "dropped once found void");
	PQclear(r);
	rcache_free(&rc);
}

Test(rcache, an_entry_never_outlives_its_key)
{
	struct rcache rc = { 0 };
	uint8_t t[FP_LEN];
	PGresult *r = row("7", "\\xab", "201", "{}", "f", "250"), *got;

	token(t, 4);
	cr_assert_eq(rcache_put(&rc, t, "k", r, 60000, 0), 1);
	got = rcache_get(&rc, t, "k", 249);
	cr_assert_not_null(got);
	PQclear(got);
	cr_assert_null(rcache_get(&rc, t, "k", 250), "the key had 250 ms left");
	PQclear(r);
	rcache_free(&rc);
}

Test(rcache, rows_not_to_hold_are_refused)
{
	struct rcache rc = { 0 };
	uint8_t t[FP_LEN];
	char big[RCACHE_MAX_ROW + 2];
	PGresult *rows[] = {
		row("7", NULL, NULL, NULL, NULL, NULL),    /* a new key: no key row */
		row("7", "\\xab", "0", "", "f", "1000"),   /* still being written */
		row("7", "\\xab", "201", "{}", "t", "0"),  /* expired */
		row("7", "\\xab", "201", "{}", "f", "-5"), /* expired since */
		row("7", "\\xab", "201", "{}", "f", NULL), /* no expiry known */
		row("7", "\\xab", "201", "{}", "f", "1x"), /* not a number */
	};

	token(t, 5);
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		cr_assert_eq(rcache_put(&rc, t, "k", rows[i], 1000, 0), 0, "row %zu", i);
		cr_assert_null(rcache_get(&rc, t, "k", 1), "row %zu", i);
		PQclear(rows[i]);
	}
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	PGresult *r = live_row(big);
	cr_assert_eq(rcache_put(&rc, t, "k", r, 1000, 0), 0, "larger than RCACHE_MAX_ROW");
	PQclear(r);
	r = live_row("{}");
	cr_assert_eq(rcache_put(&rc, t, "k", r, 0, 0), 0, "replay_cache_ttl = 0 holds nothing");
	cr_assert_eq(rc.puts, 0);
	PQclear(r);
	rcache_free(&rc);
}

Test(rcache, memory_is_bounded_by_the_slots)
{
	struct rcache rc = { 0 };
	uint8_t t[FP_LEN];
	char key[32];
	PGresult *r = live_row("{}");
	int held = 0;

	token(t, 6);
	for (int i = 0; i < 4 * RCACHE_SLOTS; i++) {
		snprintf(key, sizeof(key), "key-%d", i);
		cr_assert_eq(rcache_put(&rc, t, key, r, 1000, 0), 1);
	}
	for (int i = 0; i < 4 * RCACHE_SLOTS; i++) {
		snprintf(key, sizeof(key), "key-%d", i);
		PGresult *got = rcache_get(&rc, t, key, 1);
		held += got != NULL;
		PQclear(got);
	}
	cr_assert_leq(held, RCACHE_SLOTS);
	cr_assert_geq(held, RCACHE_SLOTS / 2, "the slots are spread: %d held", held);
	/* The last key put is always held: a new row takes its slot. */
	PGresult *got = rcache_get(&rc, t, key, 1);
	cr_assert_not_null(got);
	PQclear(got);
	PQclear(r);
	rcache_free(&rc);
}
