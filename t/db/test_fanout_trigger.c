/*
 * test_fanout_trigger.c - the deliveries the trigger outbox_deliveries
 * writes with each event (sql/020_endpoints.sql), and the filter it
 * matches types with, idemflow_type_matches (sql/023_type_matches.sql).
 *
 * Proves: the function gives the answers of its first definition on a
 * table of filters and types (NULL filter, exact names, "prefix.*" globs
 * at one and two levels, look-alikes that are no glob, NULL elements and
 * types, an empty filter); and one event of a tenant with five endpoints
 * gets exactly one delivery per matching one, pending, or skipped for the
 * disabled one, none for the endpoint whose filter does not pass its type
 * nor for another tenant's endpoint; an operational event
 * (endpoint.disabled) gets none. And subscriptions are decided at commit
 * (the at_commit tests, sql/025_subscriptions_at_commit.sql).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "tsql.h"

/* filter (an array literal or NULL), type (or NULL), the answer ("t",
 * "f" or NULL): the answers of 020's SQL definition. */
static const struct {
	const char *filter, *type, *want;
} cases[] = {
	{ NULL, "a.b", "t" },
	{ "{a.*}", "a.b", "t" },
	{ "{a.*}", "ab.c", "f" },
	{ "{a.b.*}", "a.b.c", "t" },
	{ "{a.b.*}", "a.c", "f" },
	{ "{a.*}", "a", "f" },
	{ "{x,a.b.c.*}", "a.b.c", "f" },
	{ "{x,a.b.*}", "a.b.c.d", "t" },
	{ "{a.b}", "a.b", "t" },
	{ "{a+.*}", "a+.x", "t" },
	{ "{a..*}", "a.x", "f" },
	{ "{*}", "a.b", "f" },
	{ "{.*}", "a.b", "f" },
	{ "{.*}", ".x", "t" },
	{ "{step.*}", "step.timed_out", "t" },
	{ "{workflow.created,invoice.paid}", "workflow.created", "t" },
	{ "{workflow.created,invoice.paid}", "workflow.completed", "f" },
	{ "{a.*}", "a.", "t" },
	{ "{a.*}", "a.b.", "t" },
	{ "{NULL}", "a.b", NULL },
	{ "{NULL,a.b}", "a.b", "t" },
	{ "{a.*,NULL}", "b.c", NULL },
	{ "{a.b}", NULL, NULL },
	{ NULL, NULL, "t" },
	{ "{}", "a", "f" },
	{ "{}", NULL, "f" },
};

/* A parameter that stands for NULL: the helpers' lists end at NULL. */
#define SQL_NULL "-"
static const char *nz(const char *s)
{
	return s != NULL ? s : SQL_NULL;
}

Test(type_matches, answers)
{
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *got =
		    tstack_text("SELECT idemflow_type_matches(NULLIF($1, '" SQL_NULL "')::text[],"
		                " NULLIF($2, '" SQL_NULL "'))",
		                nz(cases[i].filter), nz(cases[i].type));

		cr_expect(
		    (got == NULL && cases[i].want == NULL) ||
		        (got != NULL && cases[i].want != NULL && strcmp(got, cases[i].want) == 0),
		    "idemflow_type_matches(%s, %s) = %s, expected %s",
		    cases[i].filter ? cases[i].filter : "NULL",
		    cases[i].type ? cases[i].type : "NULL", got ? got : "NULL",
		    cases[i].want ? cases[i].want : "NULL");
		free(got);
	}
}

#define SECRET "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

static char *tenant(const char *name)
{
	return tstack_text("INSERT INTO tenants (name) VALUES ($1) RETURNING id", name);
}

static void endpoint(const char *tenant_id, const char *id, const char *filter,
                     const char *disabled)
{
	tstack_exec(tstack_db(),
	            "INSERT INTO endpoints (tenant_id, id, url, filter_types, secret, disabled,"
	            " disabled_reason)"
	            " VALUES ($1, $2, 'http://127.0.0.1:9/hook', NULLIF($3, '" SQL_NULL
	            "')::text[],"
	            " '" SECRET "',"
	            " $4::boolean, CASE WHEN $4::boolean THEN 'manual' END)",
	            tenant_id, id, nz(filter), disabled);
}

static void event(const char *tenant_id, const char *event_id, const char *workflow_id,
                  const char *seq, const char *type)
{
	tstack_exec(tstack_db(),
	            "INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload)"
	            " VALUES ($1, $2, $3, $4::integer, $5, '{}')",
	            event_id, tenant_id, workflow_id, seq, type);
}

#define E_ALL      "00000000-0000-4000-8000-00000000000a"
#define E_GLOB     "00000000-0000-4000-8000-00000000000b"
#define E_EXACT    "00000000-0000-4000-8000-00000000000c"
#define E_OTHER    "00000000-0000-4000-8000-00000000000d"
#define E_DISABLED "00000000-0000-4000-8000-00000000000e"
#define E_FOREIGN  "00000000-0000-4000-8000-00000000000f"
#define WF         "00000000-0000-4000-8000-000000000100"

Test(trigger, one_delivery_per_matching_endpoint)
{
	char *t = tenant("fanout-trigger"), *u = tenant("fanout-trigger-other");
	char *states;

	endpoint(t, E_ALL, NULL, "false");
	endpoint(t, E_GLOB, "{workflow.*}", "false");
	endpoint(t, E_EXACT, "{invoice.paid,workflow.created}", "false");
	endpoint(t, E_OTHER, "{invoice.*}", "false");
	endpoint(t, E_DISABLED, "{workflow.created}", "true");
	endpoint(u, E_FOREIGN, NULL, "false");

	event(t, "fanout-trigger-1", WF, "1", "workflow.created");
	states = tstack_text("SELECT string_agg(right(endpoint_id::text, 1) || '=' || state, ','"
	                     " ORDER BY endpoint_id)"
	                     " FROM deliveries d JOIN outbox o ON o.id = d.outbox_id"
	                     " WHERE o.event_id = 'fanout-trigger-1' AND d.tenant_id = o.tenant_id"
	                     " AND d.workflow_id = o.workflow_id AND d.seq = o.seq");
	cr_assert_str_eq(states, "a=pending,b=pending,c=pending,e=skipped");
	cr_assert_eq(tstack_count("SELECT count(*) FROM deliveries WHERE tenant_id = $1", u), 0);

	/* An operational event of an endpoint: the operator's only. */
	event(t, "fanout-trigger-2", E_OTHER, "1", "endpoint.disabled");
	cr_assert_eq(tstack_count("SELECT count(*) FROM deliveries WHERE tenant_id = $1", t), 4);
	free(states);
	free(t);
	free(u);
}

/*
 * Subscriptions at commit (sql/025_subscriptions_at_commit.sql): an
 * endpoint created, or deleted, while an event's transaction is open
 * waits for it; an event written while an endpoint's creation is open
 * waits for that, then sees the endpoint. Each wait is seen in pg_locks
 * (an advisory lock not granted to the waiting session) before the other
 * side ends, so the order of the commits is the test's, not the clock's.
 */
#define E_LATE  "00000000-0000-4000-8000-000000000201"
#define E_EARLY "00000000-0000-4000-8000-000000000202"
#define E_GONE  "00000000-0000-4000-8000-000000000203"
#define WF2     "00000000-0000-4000-8000-000000000200"

/* Wait (up to 10 s) until conn's backend waits for an advisory lock. */
static void expect_lock_wait(PGconn *conn, const char *what)
{
	char pid[16];

	snprintf(pid, sizeof(pid), "%d", PQbackendPID(conn));
	for (int i = 0; i < 1000; i++) {
		if (tstack_count("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
		                 " AND NOT granted AND pid = $1::integer",
		                 pid) == 1)
			return;
		usleep(10 * 1000);
	}
	/* Go on: what the rows say then is the other half of the failure. */
	cr_expect_fail("%s did not wait for the subscriptions lock", what);
}

/* Send sql on conn without waiting for its answer. */
static void send_async(PGconn *conn, const char *sql)
{
	cr_assert_eq(PQsendQuery(conn, sql), 1, "%s", PQerrorMessage(conn));
}

/* The answer of what send_async sent: a command that succeeded. */
static void expect_done(PGconn *conn, const char *what)
{
	PGresult *res;
	int ok = 1;

	while ((res = PQgetResult(conn)) != NULL) {
		if (PQresultStatus(res) != PGRES_COMMAND_OK &&
		    PQresultStatus(res) != PGRES_TUPLES_OK)
			ok = 0;
		cr_expect(ok, "%s: %s", what, PQresultErrorMessage(res));
		PQclear(res);
	}
	cr_assert(ok, "%s failed", what);
}

static char *insert_endpoint_sql(const char *tenant_id, const char *id)
{
	char *sql = NULL;

	cr_assert(asprintf(&sql,
	                   "INSERT INTO endpoints (tenant_id, id, url, secret)"
	                   " VALUES (%s, '%s', 'http://127.0.0.1:9/hook', '" SECRET "')",
	                   tenant_id, id) > 0);
	return sql;
}

Test(at_commit, an_endpoint_created_during_an_events_transaction_commits_after_it)
{
	char *t = tenant("fanout-at-commit-1"), *sql = insert_endpoint_sql(t, E_LATE);
	PGconn *ev = tstack_db_connect(), *ep = tstack_db_connect();

	tstack_exec(ev, "BEGIN");
	tstack_exec(ev,
	            "INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload)"
	            " VALUES ('at-commit-1', $1, '" WF2 "', 1, 'workflow.created', '{}')",
	            t);
	send_async(ep, sql);
	expect_lock_wait(ep, "the endpoint's INSERT");
	tstack_exec(ev, "COMMIT");
	expect_done(ep, "the endpoint's INSERT");
	/* It did not exist when the event committed: no delivery; the next
	 * event has one. */
	cr_assert_eq(tstack_count("SELECT count(*) FROM deliveries WHERE endpoint_id = $1", E_LATE),
	             0);
	event(t, "at-commit-2", WF2, "2", "workflow.completed");
	cr_assert_eq(tstack_count("SELECT count(*) FROM deliveries WHERE endpoint_id = $1", E_LATE),
	             1);
	PQfinish(ev);
	PQfinish(ep);
	free(sql);
	free(t);
}

Test(at_commit, an_event_written_during_an_endpoints_creation_gets_its_delivery)
{
	char *t = tenant("fanout-at-commit-2"), *sql = insert_endpoint_sql(t, E_EARLY);
	PGconn *ev = tstack_db_connect(), *ep = tstack_db_connect();
	char *insert = NULL;

	tstack_exec(ep, "BEGIN");
	tstack_exec(ep, sql);
	cr_assert(
	    asprintf(&insert,
	             "INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload)"
	             " VALUES ('at-commit-3', %s, '" WF2 "', 3, 'workflow.created', '{}')",
	             t) > 0);
	send_async(ev, insert);
	expect_lock_wait(ev, "the event's INSERT");
	tstack_exec(ep, "COMMIT");
	expect_done(ev, "the event's INSERT");
	/* The endpoint existed when the event committed: its delivery. */
	cr_assert_eq(tstack_count("SELECT count(*) FROM deliveries WHERE endpoint_id = $1"
	                          " AND state = 'pending'",
	                          E_EARLY),
	             1);
	PQfinish(ev);
	PQfinish(ep);
	free(insert);
	free(sql);
	free(t);
}

Test(at_commit, an_endpoint_deleted_during_an_events_transaction_leaves_no_delivery)
{
	char *t = tenant("fanout-at-commit-3");
	PGconn *ev = tstack_db_connect(), *ep = tstack_db_connect();

	endpoint(t, E_GONE, NULL, "false");
	tstack_exec(ev, "BEGIN");
	tstack_exec(ev,
	            "INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload)"
	            " VALUES ('at-commit-4', $1, '" WF2 "', 4, 'workflow.created', '{}')",
	            t);
	send_async(ep, "DELETE FROM endpoints WHERE id = '" E_GONE "'");
	expect_lock_wait(ep, "the endpoint's DELETE");
	tstack_exec(ev, "COMMIT");
	expect_done(ep, "the endpoint's DELETE");
	cr_assert_eq(tstack_count("SELECT count(*) FROM deliveries WHERE endpoint_id = $1", E_GONE),
	             0);
	PQfinish(ev);
	PQfinish(ep);
	free(t);
}
