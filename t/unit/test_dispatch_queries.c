/*
 * test_dispatch_queries.c - the dispatcher's statements are checked as the
 * server's are (test_queries.c): each one's parameter count against its
 * SQL, which idemflow-dispatch does before it opens its sink or connects
 * (dispatch_queries_check), so a count that drifted from its SQL stops
 * the dispatcher at start with the statement named, instead of binding
 * values to the wrong $n in the middle of a run. No database.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "core/db.h"
#include "dispatch/queries.h"

Test(dispatch_queries, the_dispatchers_table_matches_its_sql)
{
	struct err e;

	err_clear(&e);
	cr_assert_eq(dispatch_queries_check(&e), 0, "%s", e.msg);
	cr_assert_eq(dispatch_queries[DQ_CLAIM].nparams, 3);
	cr_assert_eq(dispatch_queries[DQ_DONE].nparams, 2);
	cr_assert_eq(dispatch_queries[DQ_FAIL].nparams, 5);
	cr_assert_eq(dispatch_queries[DQ_RELEASE].nparams, 2);
	cr_assert_eq(dispatch_queries[DQ_STATS].nparams, 0);
	cr_assert_eq(dispatch_queries[DQ_LISTEN].nparams, 0);
}

/* Every statement with one parameter more, and one fewer, than its SQL
 * uses: the check refuses each, naming it. */
Test(dispatch_queries, a_count_one_off_from_the_sql_fails_naming_the_statement)
{
	for (int i = 0; i < DQ__COUNT; i++) {
		const struct db_stmt *ok = &dispatch_queries[i];
		struct db_stmt more = *ok, fewer = *ok;
		char want[160];
		struct err e;

		more.nparams = ok->nparams + 1;
		cr_assert_eq(db_stmt_check(&more, &e), -1, "%s", ok->name);
		cr_assert_eq(e.code, ERR_INTERNAL);
		if (ok->nparams == 0)
			snprintf(want, sizeof(want),
			         "statement \"%s\" declares 1 parameters but its SQL uses none",
			         ok->name);
		else
			snprintf(want, sizeof(want),
			         "statement \"%s\" declares %d parameters but its SQL uses $%d",
			         ok->name, more.nparams, ok->nparams);
		cr_assert_str_eq(e.msg, want);
		if (ok->nparams == 0)
			continue;
		fewer.nparams = ok->nparams - 1;
		cr_assert_eq(db_stmt_check(&fewer, &e), -1, "%s", ok->name);
		snprintf(want, sizeof(want),
		         "statement \"%s\" declares %d parameters but its SQL uses $%d", ok->name,
		         fewer.nparams, ok->nparams);
		cr_assert_str_eq(e.msg, want);
	}
}
