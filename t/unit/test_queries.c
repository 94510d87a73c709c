/*
 * test_queries.c - every statement's parameter count is checked: against
 * its SQL when the statements are prepared (db_stmt_check, queries_check,
 * which idemflow-fcgi runs before it starts), and against every call
 * (db_run, db_pipeline), so a drifted count fails loudly instead of
 * binding values to the wrong $n. No database: the call checks come
 * before anything is sent.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "core/db.h"
#include "server/queries.h"

Test(queries, the_servers_table_matches_its_sql)
{
	struct err e;

	err_clear(&e);
	cr_assert_eq(queries_check(&e), 0, "%s", e.msg);
	cr_assert_eq(queries[Q_CREATE_KEYED].nparams, 18);
	cr_assert_eq(queries[Q_KEY_CLAIM].nparams, 8);
	cr_assert_eq(queries[Q_BEGIN].nparams, 0);
}

Test(queries, a_count_that_drifted_from_the_sql_fails)
{
	const struct db_stmt fewer = { "create_keyed", CREATE_KEYED__N - 1,
		                       queries[Q_CREATE_KEYED].sql };
	const struct db_stmt more = { "key_get", KEY_GET__N + 1, queries[Q_KEY_GET].sql };
	const struct db_stmt none = { "begin", 1, "BEGIN" };
	struct err e;

	cr_assert_eq(db_stmt_check(&fewer, &e), -1);
	cr_assert_eq(e.code, ERR_INTERNAL);
	cr_assert_str_eq(e.msg,
	                 "statement \"create_keyed\" declares 17 parameters but its SQL uses $18");
	cr_assert_eq(db_stmt_check(&more, &e), -1);
	cr_assert_str_eq(e.msg, "statement \"key_get\" declares 3 parameters but its SQL uses $2");
	cr_assert_eq(db_stmt_check(&none, &e), -1);
	cr_assert_str_eq(e.msg, "statement \"begin\" declares 1 parameters but its SQL uses none");
}

Test(queries, a_parameter_the_sql_skips_fails)
{
	const struct db_stmt gap = { "gap", 3, "SELECT $1, $3" };
	struct err e;

	cr_assert_eq(db_stmt_check(&gap, &e), -1);
	cr_assert_str_eq(e.msg,
	                 "statement \"gap\" declares 3 parameters but its SQL never uses $2");
}

Test(queries, dollars_in_quotes_and_comments_are_not_parameters)
{
	static const struct db_stmt ok[] = {
		{ "literal", 1, "SELECT $1, '$2', 'it''s $3', E'\\'$4'" },
		{ "ident", 1, "SELECT $1 AS \"$2\", a$3 FROM t" },
		{ "comments", 2, "SELECT $1, -- $3\n $2 /* $4 */" },
		{ "dollar", 1, "SELECT $1, $$ $2 $$, $f$ $3 $f$" },
		{ "cast", 10, "SELECT $1::int, $2, $3, $4, $5, $6, $7, $8, $9, $10::interval" },
	};
	struct err e;

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		cr_assert_eq(db_stmt_check(&ok[i], &e), 0, "%s: %s", ok[i].name, e.msg);
}

/* A handle whose connection fails: the call checks need none. */
static struct db *unconnected(void)
{
	const struct db_settings s = { .conninfo = "host=/nonexistent-idemflow port=1",
		                       .application_name = "test_queries",
		                       .stmts = queries,
		                       .nstmts = Q__COUNT };
	struct err e;
	struct db *db = db_open(&s, &e);

	cr_assert_not_null(db);
	return db;
}

Test(queries, a_call_with_the_wrong_count_sends_nothing)
{
	struct db *db = unconnected();
	const char *p[KEY_GET__N + 1] = { [KEY_GET_TENANT] = "1", [KEY_GET_KEY] = "k" };
	const struct db_call calls[2] = { { Q_BEGIN, 0, NULL }, { Q_KEY_GET, KEY_GET__N + 1, p } };
	PGresult *r[2];
	int failed = -1;
	struct err e;

	cr_assert_null(db_run(db, Q_KEY_GET, KEY_GET__N + 1, p, &e));
	cr_assert_eq(e.code, ERR_INTERNAL);
	cr_assert_str_eq(e.msg, "statement \"key_get\" called with 3 parameters, its table says 2");
	cr_assert_eq(db_pipeline(db, 2, calls, r, &failed, &e), -1);
	cr_assert_eq(failed, 1);
	cr_assert_str_eq(e.msg, "statement \"key_get\" called with 3 parameters, its table says 2");
	cr_assert_eq(db_connect_attempts(db), 1, "only db_open tried to connect");
	db_close(db);
}
