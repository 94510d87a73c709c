/*
 * test_rowtext.c - a command's rows as a partition hands them back
 * through a proxy (idemflow_command_rows, sql/027_partition_keyed_commands.sql)
 * and as the server reads them back (app/server/rowtext.c): the same
 * values, as text, as the statement sent to the database itself gives.
 *
 * Proves: for a statement with the awkward values (NULL and the empty
 * string, quotes, backslashes, commas, parentheses, spaces and newlines,
 * JSON, arrays, times, booleans, numbers) and untyped parameters whose
 * types the statement infers, every column is named as PQexecParams names
 * it on the same connection, and every field of every row is the one it
 * gives, NULL where it is NULL; no row gives no row; a refusal the key
 * does not keep rolls back its claim and its effects; malformed rows are
 * refused with a reason.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "server/rowtext.h"
#include "tsql.h"

static const char stmt[] =
    "SELECT v.a, v.b, $1::bigint + v.n, $2 || v.b, v.j, v.t, v.arr, v.f, v.n::numeric / 3\n"
    "  FROM (VALUES (NULL, '', 1, '{\"x\": [1, \"a,b\"]}'::jsonb,\n"
    "                '2026-01-02 03:04:05.123456+00'::timestamptz, '{1,NULL,\"q\"}'::text[],\n"
    "                true),\n"
    "               ('x', 'a \"q\" \\ b', 2, 'null'::jsonb, NULL, '{}'::text[], false),\n"
    "               ('(,)', E'line\\nnext\\t', 3, '\"s\"'::jsonb, '-infinity', NULL, NULL))\n"
    "       AS v(a, b, n, j, t, arr, f)\n"
    " ORDER BY v.n\n";

static PGresult *direct(const char *const *p)
{
	PGresult *r = PQexecParams(tstack_db(), stmt, 2, NULL, p, NULL, NULL, 0);
	cr_assert_eq(PQresultStatus(r), PGRES_TUPLES_OK, "%s", PQerrorMessage(tstack_db()));
	return r;
}

/* idemflow_command_rows(stmt, args) read back by rowtext_result(). */
static PGresult *through_rows(const char *sql, const char *args)
{
	const char *p[2] = { sql, args };
	PGresult *r = PQexecParams(tstack_db(), "SELECT idemflow_command_rows($1, $2)", 2, NULL, p,
	                           NULL, NULL, 0);
	struct err e;
	PGresult *res;

	cr_assert_eq(PQresultStatus(r), PGRES_TUPLES_OK, "%s", PQerrorMessage(tstack_db()));
	res = rowtext_result(PQgetvalue(r, 0, 0), (size_t)PQgetlength(r, 0, 0), &e);
	cr_assert_not_null(res, "%s", e.msg);
	PQclear(r);
	return res;
}

Test(rowtext, every_value_as_the_database_gives_it)
{
	const char *p[2] = { "40", "pre " };
	PGresult *want = direct(p);
	PGresult *got = through_rows(stmt, "{40,\"pre \"}");

	cr_assert_eq(PQntuples(got), 3);
	cr_assert_eq(PQntuples(got), PQntuples(want));
	cr_assert_eq(PQnfields(got), PQnfields(want));
	for (int f = 0; f < PQnfields(want); f++)
		cr_assert_str_eq(PQfname(got, f), PQfname(want, f), "column %d", f);
	for (int t = 0; t < PQntuples(want); t++)
		for (int f = 0; f < PQnfields(want); f++) {
			cr_assert_eq(PQgetisnull(got, t, f), PQgetisnull(want, t, f),
			             "row %d field %d: NULL", t, f);
			cr_assert_eq(PQgetlength(got, t, f), PQgetlength(want, t, f),
			             "row %d field %d: \"%s\", want \"%s\"", t, f,
			             PQgetvalue(got, t, f), PQgetvalue(want, t, f));
			cr_assert_str_eq(PQgetvalue(got, t, f), PQgetvalue(want, t, f),
			                 "row %d field %d", t, f);
		}
	/* The awkward ones, spelled out. */
	cr_assert(PQgetisnull(got, 0, 0));
	cr_assert(!PQgetisnull(got, 0, 1));
	cr_assert_str_eq(PQgetvalue(got, 0, 1), "");
	cr_assert_str_eq(PQgetvalue(got, 1, 1), "a \"q\" \\ b");
	cr_assert_str_eq(PQgetvalue(got, 2, 0), "(,)");
	cr_assert_str_eq(PQgetvalue(got, 2, 1), "line\nnext\t");
	cr_assert_str_eq(PQgetvalue(got, 0, 4), "{\"x\": [1, \"a,b\"]}");
	cr_assert_str_eq(PQgetvalue(got, 0, 5), "2026-01-02 03:04:05.123456+00");
	PQclear(want);
	PQclear(got);
}

Test(rowtext, no_row_no_row)
{
	PGresult *got = through_rows("SELECT 1, $1::text WHERE false", "{a}");

	cr_assert_eq(PQntuples(got), 0);
	PQclear(got);
}

Test(rowtext, a_refusal_not_kept_rolls_back_its_claim_and_effects)
{
	long tenant = tstack_count("INSERT INTO tenants (name) VALUES ('rowtext') RETURNING id");
	char t[24], sql[200], *kept;
	PGresult *r;

	snprintf(t, sizeof(t), "%ld", tenant);
	/* The command writes, then refuses with a problem the key does not
	 * keep: neither its claim nor its write stays. */
	tstack_exec(tstack_db(), "CREATE TABLE rowtext_effects (n bigint)");
	snprintf(sql, sizeof(sql),
	         "WITH w AS (INSERT INTO rowtext_effects VALUES ($1::bigint) RETURNING n)\n"
	         "SELECT 'not-found'::text, 'gone'::text, n FROM w");
	r = PQexecParams(tstack_db(),
	                 "SELECT outcome, rows FROM idemflow_keyed_command($1, 'k1', 'POST', '/x',"
	                 " '\\x00', '1 hour', NULL, 'token:1', NULL, NULL, $2, '{7}',"
	                 " '{state-conflict}')",
	                 2, NULL, (const char *const[]){ t, sql }, NULL, NULL, 0);
	cr_assert_eq(PQresultStatus(r), PGRES_TUPLES_OK, "%s", PQerrorMessage(tstack_db()));
	cr_assert_str_eq(PQgetvalue(r, 0, 0), "unstored");
	cr_assert_str_eq(PQgetvalue(r, 0, 1),
	                 "{\"columns\" : [\"text\",\"text\",\"n\"], \"rows\" : "
	                 "[\"(not-found,gone,7)\"]}");
	PQclear(r);
	cr_assert_eq(tstack_count("SELECT count(*) FROM rowtext_effects"), 0);
	cr_assert_eq(tstack_count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1", t),
	             0);

	/* One it keeps: the claim, the write and the rows commit, status 1. */
	sql[strlen(sql) - strlen("'not-found'::text, 'gone'::text, n FROM w")] = '\0';
	strcat(sql, "'state-conflict'::text, 'no'::text, n FROM w");
	r = PQexecParams(tstack_db(),
	                 "SELECT outcome, rows FROM idemflow_keyed_command($1, 'k1', 'POST', '/x',"
	                 " '\\x00', '1 hour', NULL, 'token:1', NULL, NULL, $2, '{7}',"
	                 " '{state-conflict}')",
	                 2, NULL, (const char *const[]){ t, sql }, NULL, NULL, 0);
	cr_assert_eq(PQresultStatus(r), PGRES_TUPLES_OK, "%s", PQerrorMessage(tstack_db()));
	cr_assert_str_eq(PQgetvalue(r, 0, 0), "created");
	PQclear(r);
	cr_assert_eq(tstack_count("SELECT count(*) FROM rowtext_effects"), 1);
	kept = tstack_text("SELECT status || ' ' || body FROM idempotency_keys"
	                   " WHERE tenant_id = $1 AND key = 'k1'",
	                   t);
	cr_assert_str_eq(kept, "1 {\"columns\" : [\"text\",\"text\",\"n\"], \"rows\" : "
	                       "[\"(state-conflict,no,7)\"]}");
	free(kept);
	tstack_exec(tstack_db(), "DROP TABLE rowtext_effects");
}

Test(rowtext, malformed_rows_are_refused)
{
	static const struct {
		const char *json, *why;
	} bad[] = {
		{ "[]", "a command's rows are not {\"columns\":[...],\"rows\":[...]}" },
		{ "{\"columns\":[],\"rows\":{}}",
		  "a command's rows are not {\"columns\":[...],\"rows\":[...]}" },
		{ "{\"columns\":[1],\"rows\":[]}", "a command's column 0 has no name" },
		{ "{\"columns\":[\"a\"],\"rows\":[1]}", "a command's row 0 is not a string" },
		{ "{\"columns\":[\"a\"],\"rows\":[\"1,2\"]}",
		  "a command's row 0 is not a record's text" },
		{ "{\"columns\":[\"a\"],\"rows\":[\"(\\\"a)\"]}",
		  "a command's row 0 is not a record's text" },
		{ "{\"columns\":[\"a\",\"b\"],\"rows\":[\"(a,b)\",\"(c)\"]}",
		  "a command's row 1 has 1 fields, not 2" },
		{ "{\"columns\":[\"a\"],\"rows\":[\"(a)\"]",
		  "a command's rows are not {\"columns\":[...],\"rows\":[...]}" },
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct err e;
		cr_assert_null(rowtext_result(bad[i].json, strlen(bad[i].json), &e), "%s",
		               bad[i].json);
		cr_assert_str_eq(e.msg, bad[i].why, "%s", bad[i].json);
	}
}
