/*
 * test_inbox.c - the consumer inbox (libidemflow-inbox and
 * sql/consumer/inbox.sql) against a real PostgreSQL.
 *
 * Proves that two deliveries of one event id, claimed at once on two
 * connections inside open transactions, give exactly one effect: the
 * second claim waits on the first transaction (shown: its backend is
 * blocked by the first's), answers "duplicate" once the first commits, and
 * "first delivery" (and applies the effect) when the first rolls back;
 * through the C library and through the SQL function alike. Also: the
 * duplicates count only what committed, the Prometheus text byte for byte
 * (label escaping included) from the library, the SQL function and the
 * textfile, setup applied twice and by eight connections at once, and the
 * library's refusals. Each test works in a schema of its own (the inbox is
 * created in the first schema of the search_path), so the counts are
 * exact while the tests run in parallel. Needs $DATABASE_URL (t/run-test).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "inbox/inbox.h"
#include "twait.h"

static char schema[64];
static PGconn *admin;

static PGconn *connect_in(const char *s)
{
	PGconn *c = PQconnectdb(getenv("DATABASE_URL"));
	char set[128];
	PGresult *res;

	cr_assert_eq(PQstatus(c), CONNECTION_OK, "%s", PQerrorMessage(c));
	snprintf(set, sizeof(set), "SET search_path = %s", s);
	res = PQexec(c, set);
	cr_assert_eq(PQresultStatus(res), PGRES_COMMAND_OK, "%s", PQerrorMessage(c));
	PQclear(res);
	return c;
}

static void exec_ok(PGconn *c, const char *sql)
{
	PGresult *res = PQexec(c, sql);
	ExecStatusType st = PQresultStatus(res);

	cr_assert(st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK, "%s: %s", sql,
	          PQerrorMessage(c));
	PQclear(res);
}

/* The one value of sql with parameters, as text (caller frees). */
static char *value(PGconn *c, const char *sql, int n, const char *const *p)
{
	PGresult *res = PQexecParams(c, sql, n, NULL, p, NULL, NULL, 0);
	char *v;

	cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "%s: %s", sql, PQerrorMessage(c));
	cr_assert_eq(PQntuples(res), 1, "%s: %d rows", sql, PQntuples(res));
	v = strdup(PQgetvalue(res, 0, 0));
	PQclear(res);
	return v;
}

static long number(PGconn *c, const char *sql)
{
	char *v = value(c, sql, 0, NULL);
	long n = atol(v);

	free(v);
	return n;
}

static void setup_schema(void)
{
	struct idemflow_inbox_err e;
	char sql[128];

	admin = PQconnectdb(getenv("DATABASE_URL"));
	cr_assert_eq(PQstatus(admin), CONNECTION_OK, "%s", PQerrorMessage(admin));
	snprintf(schema, sizeof(schema), "inbox_test_%ld_%d", (long)getpid(), rand() % 100000);
	snprintf(sql, sizeof(sql), "CREATE SCHEMA %s", schema);
	exec_ok(admin, sql);
	snprintf(sql, sizeof(sql), "SET search_path = %s", schema);
	exec_ok(admin, sql);
	cr_assert_eq(idemflow_inbox_setup(admin, &e), 0, "%s", e.msg);
	/* The consumer's effect: one row per application, and who applied it. */
	exec_ok(admin, "CREATE TABLE effects (event_id text NOT NULL, applied_by text NOT NULL)");
}

static void teardown_schema(void)
{
	PQfinish(admin);
}

TestSuite(inbox, .init = setup_schema, .fini = teardown_schema);

/* ------------------------------------------------------------ two deliveries at once */

/* A claim through the C library or through the SQL function: 1, 0 or -1. */
typedef int (*claim_fn)(PGconn *c, const char *consumer, const char *event_id, char *why,
                        size_t whysz);

static int claim_library(PGconn *c, const char *consumer, const char *event_id, char *why,
                         size_t whysz)
{
	struct idemflow_inbox_err e;
	int r = idemflow_inbox_claim(c, consumer, event_id, &e);

	if (r < 0)
		snprintf(why, whysz, "%s (%s)", e.msg, e.sqlstate);
	return r;
}

static int claim_sql(PGconn *c, const char *consumer, const char *event_id, char *why, size_t whysz)
{
	const char *p[2] = { consumer, event_id };
	PGresult *res =
	    PQexecParams(c, "SELECT idemflow_inbox_claim($1, $2)", 2, NULL, p, NULL, NULL, 0);
	int r = -1;

	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
		r = strcmp(PQgetvalue(res, 0, 0), "t") == 0 ? 1 : 0;
	else
		snprintf(why, whysz, "%s", PQerrorMessage(c));
	PQclear(res);
	return r;
}

/* One delivery as a consumer handles it, on a thread of its own: claim,
 * the effect when first, commit. No assertion here (Criterion asserts on
 * the test's thread): the outcome goes back in the struct. */
struct delivery {
	PGconn *conn;
	claim_fn claim;
	const char *event_id;
	const char *who;
	int claimed;  /* 1, 0, -1 */
	int returned; /* set (atomically) once the claim has answered */
	int committed;
	char why[512];
};

static int run_ok(PGconn *c, const char *sql, const char *const *p, int n)
{
	PGresult *res = PQexecParams(c, sql, n, NULL, p, NULL, NULL, 0);
	int ok = PQresultStatus(res) == PGRES_COMMAND_OK;

	PQclear(res);
	return ok;
}

static void *deliver(void *arg)
{
	struct delivery *d = arg;
	const char *p[2] = { d->event_id, d->who };

	d->claimed = d->claim(d->conn, "billing", d->event_id, d->why, sizeof(d->why));
	__atomic_store_n(&d->returned, 1, __ATOMIC_SEQ_CST);
	if (d->claimed == 1 &&
	    !run_ok(d->conn, "INSERT INTO effects (event_id, applied_by) VALUES ($1, $2)", p, 2))
		snprintf(d->why, sizeof(d->why), "effect: %s", PQerrorMessage(d->conn));
	d->committed = d->claimed >= 0 && run_ok(d->conn, "COMMIT", NULL, 0);
	return NULL;
}

/* Wait until b's backend is blocked by a's (pg_blocking_pids); 0 after 10 s. */
static int blocked_by(PGconn *b, PGconn *a)
{
	char bp[16], ap[16], *v;
	const char *p[2] = { bp, ap };
	double deadline = tstack_now() + 10;

	snprintf(bp, sizeof(bp), "%d", PQbackendPID(b));
	snprintf(ap, sizeof(ap), "%d", PQbackendPID(a));
	while (tstack_now() < deadline) {
		v = value(admin, "SELECT $2::int = ANY (pg_blocking_pids($1::int))", 2, p);
		int yes = strcmp(v, "t") == 0;
		free(v);
		if (yes)
			return 1;
		tstack_sleep_ms(10);
	}
	return 0;
}

/*
 * Delivery a claims "evt-1" and applies its effect inside an open
 * transaction; delivery b, on another connection inside its own open
 * transaction, claims the same id and is shown waiting on a; then a
 * commits (or rolls back), and b goes on.
 */
static void two_deliveries(claim_fn claim, int first_commits)
{
	PGconn *a = connect_in(schema), *b = connect_in(schema);
	struct delivery db = { .conn = b, .claim = claim, .event_id = "evt-1", .who = "b" };
	char why[512] = "";
	pthread_t t;
	const char *p[2] = { "evt-1", "a" };

	exec_ok(a, "BEGIN");
	cr_assert_eq(claim(a, "billing", "evt-1", why, sizeof(why)), 1, "a: %s", why);
	cr_assert(run_ok(a, "INSERT INTO effects (event_id, applied_by) VALUES ($1, $2)", p, 2));

	exec_ok(b, "BEGIN");
	cr_assert_eq(pthread_create(&t, NULL, deliver, &db), 0);
	cr_assert(blocked_by(b, a), "b's claim waits on a's open transaction");
	cr_assert_eq(__atomic_load_n(&db.returned, __ATOMIC_SEQ_CST), 0,
	             "b's claim has not answered yet");

	exec_ok(a, first_commits ? "COMMIT" : "ROLLBACK");
	cr_assert_eq(pthread_join(t, NULL), 0);
	cr_assert_eq(db.claimed, first_commits ? 0 : 1, "b's claim: %s", db.why);
	cr_assert(db.committed, "b committed: %s", db.why);

	cr_assert_eq(number(admin, "SELECT count(*) FROM effects"), 1, "exactly one effect");
	cr_assert_eq(number(admin, "SELECT count(*) FROM effects WHERE applied_by = 'b'"),
	             first_commits ? 0 : 1, "b applied it only when a rolled back");
	cr_assert_eq(number(admin, "SELECT count(*) FROM idemflow_inbox"), 1, "one claim");
	struct idemflow_inbox_err e;
	cr_assert_eq(idemflow_inbox_duplicates(admin, "billing", &e), first_commits ? 1 : 0, "%s",
	             e.msg);
	cr_assert_eq(number(admin, "SELECT coalesce(sum(duplicates), 0)"
	                           " FROM idemflow_inbox_duplicates() WHERE consumer = 'billing'"),
	             first_commits ? 1 : 0);
	PQfinish(a);
	PQfinish(b);
}

Test(inbox, library_two_deliveries_at_once_the_second_waits_and_is_a_duplicate)
{
	two_deliveries(claim_library, 1);
}

Test(inbox, library_two_deliveries_at_once_the_first_rolls_back_the_second_applies)
{
	two_deliveries(claim_library, 0);
}

Test(inbox, sql_two_deliveries_at_once_the_second_waits_and_is_a_duplicate)
{
	two_deliveries(claim_sql, 1);
}

Test(inbox, sql_two_deliveries_at_once_the_first_rolls_back_the_second_applies)
{
	two_deliveries(claim_sql, 0);
}

/* 8 deliveries of one id at once, mixing the library and the SQL function:
 * one effect, 7 duplicates. */
Test(inbox, eight_deliveries_at_once_one_effect_seven_duplicates)
{
	enum { N = 8 };
	struct delivery d[N];
	pthread_t t[N];
	int first = 0, dups = 0;

	for (int i = 0; i < N; i++) {
		d[i] = (struct delivery){ .conn = connect_in(schema),
			                  .claim = i % 2 ? claim_sql : claim_library,
			                  .event_id = "evt-8",
			                  .who = i % 2 ? "sql" : "library" };
		exec_ok(d[i].conn, "BEGIN");
	}
	for (int i = 0; i < N; i++)
		cr_assert_eq(pthread_create(&t[i], NULL, deliver, &d[i]), 0);
	for (int i = 0; i < N; i++) {
		cr_assert_eq(pthread_join(t[i], NULL), 0);
		cr_assert_geq(d[i].claimed, 0, "%s", d[i].why);
		cr_assert(d[i].committed, "%s", d[i].why);
		first += d[i].claimed == 1;
		dups += d[i].claimed == 0;
		PQfinish(d[i].conn);
	}
	cr_assert_eq(first, 1);
	cr_assert_eq(dups, N - 1);
	cr_assert_eq(number(admin, "SELECT count(*) FROM effects"), 1);
	struct idemflow_inbox_err e;
	cr_assert_eq(idemflow_inbox_duplicates(admin, "billing", &e), N - 1, "%s", e.msg);
}

/* ------------------------------------------------------------ counting */

Test(inbox, a_duplicate_counts_only_when_its_transaction_commits)
{
	struct idemflow_inbox_err e;

	exec_ok(admin, "BEGIN");
	cr_assert_eq(idemflow_inbox_claim(admin, "billing", "evt-2", &e), 1, "%s", e.msg);
	exec_ok(admin, "COMMIT");
	exec_ok(admin, "BEGIN");
	cr_assert_eq(idemflow_inbox_claim(admin, "billing", "evt-2", &e), 0, "%s", e.msg);
	exec_ok(admin, "ROLLBACK");
	cr_assert_eq(idemflow_inbox_duplicates(admin, "billing", &e), 0, "%s", e.msg);
	exec_ok(admin, "BEGIN");
	cr_assert_eq(idemflow_inbox_claim(admin, "billing", "evt-2", &e), 0, "%s", e.msg);
	cr_assert_eq(idemflow_inbox_claim(admin, "billing", "evt-2", &e), 0, "%s", e.msg);
	exec_ok(admin, "COMMIT");
	cr_assert_eq(idemflow_inbox_duplicates(admin, "billing", &e), 2, "%s", e.msg);
	/* Consumers are apart: the same id is another consumer's first. */
	exec_ok(admin, "BEGIN");
	cr_assert_eq(idemflow_inbox_claim(admin, "shipping", "evt-2", &e), 1, "%s", e.msg);
	exec_ok(admin, "COMMIT");
	cr_assert_eq(idemflow_inbox_duplicates(admin, "shipping", &e), 0, "%s", e.msg);
	cr_assert_eq(idemflow_inbox_duplicates(admin, "nobody", &e), 0, "%s", e.msg);
}

/* ------------------------------------------------------------ the metric */

static const char want_metrics[] =
    "# HELP idemflow_inbox_duplicates_total Deliveries the inbox dropped as duplicates of an"
    " event already claimed.\n"
    "# TYPE idemflow_inbox_duplicates_total counter\n"
    "idemflow_inbox_duplicates_total{consumer=\"billing\"} 2\n"
    "idemflow_inbox_duplicates_total{consumer=\"shipping\"} 0\n"
    "idemflow_inbox_duplicates_total{consumer=\"we\\\"ird\\\\name\\n\"} 1\n";

static void claim_n(const char *consumer, const char *event_id, int n)
{
	struct idemflow_inbox_err e;

	exec_ok(admin, "BEGIN");
	for (int i = 0; i < n; i++)
		cr_assert_geq(idemflow_inbox_claim(admin, consumer, event_id, &e), 0, "%s", e.msg);
	exec_ok(admin, "COMMIT");
}

Test(inbox, metrics_text_exact_from_the_library_the_sql_and_the_textfile)
{
	struct idemflow_inbox_err e;
	char *text, *sql_text, path[512], buf[1024];
	FILE *f;
	size_t n;

	text = idemflow_inbox_metrics(admin, &e);
	cr_assert_not_null(text, "%s", e.msg);
	cr_assert_str_eq(text,
	                 "# HELP idemflow_inbox_duplicates_total Deliveries the inbox dropped as"
	                 " duplicates of an event already claimed.\n"
	                 "# TYPE idemflow_inbox_duplicates_total counter\n",
	                 "an empty inbox: the header alone");
	free(text);

	claim_n("billing", "evt-1", 3);     /* 1 applied, 2 duplicates */
	claim_n("shipping", "evt-1", 1);    /* applied: listed with 0 */
	claim_n("we\"ird\\name\n", "e", 2); /* a name that needs escaping */

	text = idemflow_inbox_metrics(admin, &e);
	cr_assert_not_null(text, "%s", e.msg);
	cr_assert_str_eq(text, want_metrics);
	sql_text = value(admin, "SELECT idemflow_inbox_metrics()", 0, NULL);
	cr_assert_str_eq(sql_text, want_metrics, "the SQL function answers the same bytes");
	free(sql_text);
	free(text);

	/* A name of this test's own. */
	snprintf(path, sizeof(path), "%s/idemflow_inbox.prom.%s",
	         getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", schema);
	cr_assert_eq(idemflow_inbox_write_textfile(admin, path, &e), 0, "%s", e.msg);
	f = fopen(path, "r");
	cr_assert_not_null(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	fclose(f);
	cr_assert_str_eq(buf, want_metrics, "the textfile holds the same bytes");
	snprintf(buf, sizeof(buf), "%s.tmp", path);
	cr_assert_neq(access(buf, F_OK), 0, "no temporary file left");
	unlink(path);
}

/* ------------------------------------------------------------ setup and refusals */

Test(inbox, setup_twice_changes_nothing)
{
	struct idemflow_inbox_err e;

	claim_n("billing", "evt-1", 2);
	cr_assert_eq(idemflow_inbox_setup(admin, &e), 0, "%s", e.msg);
	cr_assert_eq(number(admin, "SELECT count(*) FROM idemflow_inbox"), 1);
	cr_assert_eq(idemflow_inbox_duplicates(admin, "billing", &e), 1, "%s", e.msg);
	cr_assert_eq(PQtransactionStatus(admin), PQTRANS_IDLE);
}

static void *setup_one(void *arg)
{
	PGconn *c = arg;
	struct idemflow_inbox_err e;

	return (void *)(long)idemflow_inbox_setup(c, &e);
}

Test(inbox, eight_connections_setting_up_a_new_schema_at_once_all_succeed)
{
	enum { N = 8 };
	PGconn *c[N];
	pthread_t t[N];
	char sql[512], other[80];
	void *rc;

	snprintf(other, sizeof(other), "%s_fresh", schema);
	snprintf(sql, sizeof(sql), "CREATE SCHEMA %s", other);
	exec_ok(admin, sql);
	for (int i = 0; i < N; i++)
		c[i] = connect_in(other);
	for (int i = 0; i < N; i++)
		cr_assert_eq(pthread_create(&t[i], NULL, setup_one, c[i]), 0);
	for (int i = 0; i < N; i++) {
		cr_assert_eq(pthread_join(t[i], &rc), 0);
		cr_assert_eq((long)rc, 0, "setup %d failed", i);
		PQfinish(c[i]);
	}
	snprintf(sql, sizeof(sql),
	         "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
	         " WHERE n.nspname = '%s' AND p.proname LIKE 'idemflow_inbox%%'",
	         other);
	cr_assert_eq(number(admin, sql), 3, "claim, duplicates, metrics");
}

Test(inbox, the_library_refuses_what_would_break_the_promise)
{
	struct idemflow_inbox_err e;

	/* Outside a transaction a claim would commit without its effect. */
	cr_assert_eq(idemflow_inbox_claim(admin, "billing", "evt-1", &e), -1);
	cr_assert_str_eq(e.msg, "could not claim the event: no open transaction (BEGIN first: the"
	                        " claim commits with the effect)");
	cr_assert_eq(number(admin, "SELECT count(*) FROM idemflow_inbox"), 0);
	/* Inside one, setup would commit the caller's work. */
	exec_ok(admin, "BEGIN");
	cr_assert_eq(idemflow_inbox_setup(admin, &e), -1);
	cr_assert_str_eq(e.msg, "could not set up the inbox: the connection is inside a transaction"
	                        " (call it outside one)");
	cr_assert_eq(idemflow_inbox_claim(admin, "", "evt-1", &e), -1);
	cr_assert_str_eq(e.msg,
	                 "could not claim the event: consumer and event id must be non-empty");
	cr_assert_eq(idemflow_inbox_claim(admin, "billing", NULL, &e), -1);
	exec_ok(admin, "ROLLBACK");
	/* A server error carries its SQLSTATE: the inbox is not in this schema. */
	exec_ok(admin, "SET search_path = pg_catalog");
	exec_ok(admin, "BEGIN");
	cr_assert_eq(idemflow_inbox_claim(admin, "billing", "evt-1", &e), -1);
	cr_assert_str_eq(e.sqlstate, "42883", "undefined function: %s", e.msg);
	exec_ok(admin, "ROLLBACK");
	cr_assert_null(idemflow_inbox_metrics(admin, &e));
	cr_assert_str_eq(e.sqlstate, "42883");
	cr_assert_eq(idemflow_inbox_duplicates(NULL, "billing", &e), -1);
	cr_assert_str_eq(e.msg, "could not read the duplicates: no connection");
}
