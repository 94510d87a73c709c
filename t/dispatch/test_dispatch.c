/*
 * test_dispatch.c - idemflow-dispatch against a real PostgreSQL and a real
 * HTTP receiver (t/lib/receiver.py).
 *
 * The dispatcher drains the whole outbox, so these tests run one at a
 * time (TSTACK_SEQUENTIAL, at the end) and each starts from an outbox with
 * nothing left to deliver. Every test runs the real program and checks
 * the outbox rows and what the receiver got.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/db.h"
#include "dispatch/whsig.h"
#include "inbox/inbox.h"
#include "receiver.h"
#include "tdispatch.h"
#include "tlog.h"
#include "tstack.h"
#include "twait.h"

#define SECRET "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

static struct tdispatch td;
static struct receiver rcv;

static void setup(void)
{
	tdispatch_open(&td, "test_dispatch", "disp");
	cr_assert_eq(receiver_start(&rcv, NULL), 0, "receiver: %s", rcv.error);
}

static void teardown(void)
{
	receiver_stop(&rcv);
	tdispatch_close(&td);
}

/* Start idemflow-dispatch on the http sink towards the receiver, with the
 * flags in extra (NULL-ended) after the common ones. Returns the pid. */
static pid_t spawn(const char *const *extra)
{
	const char *common[] = { "--sink",    "http", "--url",     rcv.url, "--secret", SECRET,
		                 "--backoff", "50ms", "--timeout", "3s",    NULL };

	return tdispatch_spawn(&td, common, extra);
}

/* Run to completion; returns the exit status. */
static int run(const char *const *extra)
{
	return tdispatch_wait(spawn(extra));
}

static char *event_id_of(const char *cond)
{
	char q[256];
	const char *p[1] = { td.tenant };
	PGresult *res;
	char *id;

	snprintf(q, sizeof(q),
	         "SELECT event_id FROM outbox WHERE tenant_id = $1 AND %s ORDER BY id LIMIT 1",
	         cond);
	res = tdispatch_sql(&td, q, 1, p);
	cr_assert_eq(PQntuples(res), 1);
	id = strdup(PQgetvalue(res, 0, 0));
	PQclear(res);
	return id;
}

TestSuite(dispatch, .init = setup, .fini = teardown, .timeout = 180);

Test(dispatch, a_failed_delivery_stays_pending_then_publishes_on_attempt_two)
{
	struct receiver_delivery *d;
	size_t n;
	uint8_t key[WHSIG_KEY_MAX];
	size_t klen;
	struct err e;

	tdispatch_seed(&td, 1, 1, "test.event");
	cr_assert_eq(receiver_control(&rcv, "{\"fail_next\": 1, \"status\": 503}"), 0, "%s",
	             rcv.error);
	const char *once[] = { "--backoff", "300ms", NULL };
	cr_assert_eq(run(once), 0, "a rescheduled failure is still a successful run");
	cr_assert_eq(tdispatch_count(&td,
	                             "published_at IS NULL AND dead_at IS NULL AND attempts = 1 "
	                             "AND last_error LIKE '%503%' AND next_attempt_at > now()"),
	             1, "pending, attempts=1, error recorded, rescheduled");
	cr_assert(tstack_file_contains(td.log, "outcome=retry") &&
	              tstack_file_contains(td.log, "attempt=1/8"),
	          "attempt logged");

	usleep(500 * 1000); /* 300 ms back-off, +20% jitter at most */
	cr_assert_eq(run(once), 0);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL AND attempts = 2"), 1,
	             "published on attempt 2");
	cr_assert(tstack_file_contains(td.log, "attempt=2/8") &&
	          tstack_file_contains(td.log, "outcome=published"));
	cr_assert(tstack_file_contains(
	              td.log, "msg=\"run finished\" claimed=1 published=1 retried=0 dead=0"),
	          "summary line");

	cr_assert_eq(receiver_deliveries(&rcv, &d, &n), 0, "%s", rcv.error);
	cr_assert_eq(n, 2);
	cr_assert_str_eq(d[0].event_id, d[1].event_id, "the same id on every attempt");
	cr_assert_str_eq(d[1].idempotency_key, d[1].event_id);
	cr_assert_eq(d[0].status, 503);
	cr_assert_eq(d[1].status, 200);
	cr_assert_eq(whsig_key(SECRET, key, &klen, &e), 0);
	for (size_t i = 0; i < n; i++)
		cr_assert_eq(whsig_verify(key, klen, d[i].event_id, d[i].timestamp, d[i].body,
		                          d[i].body_len, d[i].signature, time(NULL), 300, &e),
		             0, "signature of delivery %zu: %s", i, e.msg);
	receiver_deliveries_free(d, n);
}

Test(dispatch, a_rolled_back_creation_leaves_no_event_to_deliver)
{
	const char *p[1] = { td.tenant };
	size_t n;
	struct receiver_delivery *d;

	PQclear(tdispatch_sql(&td, "BEGIN", 0, NULL));
	PQclear(tdispatch_sql(
	    &td,
	    "WITH w AS (INSERT INTO workflows (tenant_id, id, type, input, created_at,"
	    " updated_at) VALUES ($1, gen_random_uuid(), 't', '{}', now(), now())"
	    " RETURNING tenant_id, id)"
	    " INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload)"
	    " SELECT id::text || '.1', tenant_id, id, 1, 't', '{}' FROM w",
	    1, p));
	PQclear(tdispatch_sql(&td, "ROLLBACK", 0, NULL));
	cr_assert_eq(tdispatch_count(&td, "true"), 0);
	cr_assert_eq(run(NULL), 0);
	cr_assert_eq(receiver_deliveries(&rcv, &d, &n), 0);
	cr_assert_eq(n, 0, "nothing was delivered");
	receiver_deliveries_free(d, n);
}

Test(dispatch, killed_mid_batch_it_redelivers_with_the_same_ids_and_the_inbox_applies_once)
{
	struct receiver_delivery *d;
	size_t n, distinct;
	struct idemflow_inbox_err e;
	pid_t pid;

	tdispatch_seed(&td, 20, 1, "test.event");
	/* Slow answers: the kill lands after some events were published and
	 * before the batch's outcome is recorded. */
	cr_assert_eq(receiver_control(&rcv, "{\"delay_ms\": 100}"), 0);
	const char *slow[] = { "--batch", "20", "--timeout", "1s", "--lease", "3s", NULL };
	pid = spawn(slow);
	cr_assert_eq(receiver_wait(&rcv, 5, 20000), 0, "%s", rcv.error);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL"), 0,
	             "killed before recording: nothing is marked published");

	cr_assert_eq(receiver_control(&rcv, "{\"delay_ms\": 0}"), 0);
	usleep(3200 * 1000); /* the dead dispatcher's lease runs out */
	cr_assert_eq(run(NULL), 0);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL"), 20, "every event delivered");

	/* A consumer with the inbox pattern: every delivery, in arrival
	 * order, duplicates included, each in its own transaction with its
	 * effect. */
	cr_assert_eq(idemflow_inbox_setup(td.conn, &e), 0, "%s", e.msg);
	PQclear(
	    tdispatch_sql(&td, "CREATE TABLE IF NOT EXISTS test_effects (event_id text)", 0, NULL));
	cr_assert_eq(receiver_deliveries(&rcv, &d, &n), 0);
	cr_assert_geq(n, 25, "at least the 5 seen before the kill went out twice: %zu", n);
	for (size_t i = 0; i < n; i++) {
		const char *p[1] = { d[i].event_id };
		PQclear(tdispatch_sql(&td, "BEGIN", 0, NULL));
		int first = idemflow_inbox_claim(td.conn, "test-effects", d[i].event_id, &e);
		cr_assert_geq(first, 0, "%s", e.msg);
		if (first)
			PQclear(tdispatch_sql(&td, "INSERT INTO test_effects VALUES ($1)", 1, p));
		PQclear(tdispatch_sql(&td, "COMMIT", 0, NULL));
	}
	const char *p[1] = { td.tenant };
	distinct = (size_t)tdispatch_scalar(
	    &td,
	    "SELECT count(DISTINCT e.event_id) FROM test_effects e"
	    " JOIN outbox o ON o.event_id = e.event_id WHERE o.tenant_id = $1",
	    1, p);
	cr_assert_eq(distinct, 20);
	cr_assert_eq(tdispatch_scalar(&td,
	                              "SELECT count(*) FROM test_effects e JOIN outbox o"
	                              " ON o.event_id = e.event_id WHERE o.tenant_id = $1",
	                              1, p),
	             20, "each effect applied exactly once");
	cr_assert_eq(idemflow_inbox_duplicates(td.conn, "test-effects", &e), (long long)(n - 20),
	             "every redelivery was counted as a dropped duplicate");
	cr_log_info("crash mid-batch: %zu deliveries for 20 events, %zu duplicates dropped", n,
	            n - 20);
	receiver_deliveries_free(d, n);
}

/* Each claim of an event, as the claims wrote it (lease_owner set): a
 * trigger fills test_claims until claims_stop(). */
static void claims_start(void)
{
	PQclear(tdispatch_sql(&td, "CREATE TABLE test_claims (owner text, id bigint)", 0, NULL));
	PQclear(
	    tdispatch_sql(&td,
	                  "CREATE FUNCTION test_claim_note() RETURNS trigger LANGUAGE plpgsql AS"
	                  " $$BEGIN INSERT INTO test_claims VALUES (NEW.lease_owner, NEW.id);"
	                  " RETURN NEW; END$$",
	                  0, NULL));
	PQclear(tdispatch_sql(&td,
	                      "CREATE TRIGGER test_claim_note AFTER UPDATE OF lease_owner ON outbox"
	                      " FOR EACH ROW WHEN (NEW.lease_owner IS NOT NULL) EXECUTE FUNCTION"
	                      " test_claim_note()",
	                      0, NULL));
}

static void claims_stop(void)
{
	PQclear(tdispatch_sql(&td, "DROP TRIGGER IF EXISTS test_claim_note ON outbox", 0, NULL));
	PQclear(tdispatch_sql(&td, "DROP FUNCTION IF EXISTS test_claim_note()", 0, NULL));
	PQclear(tdispatch_sql(&td, "DROP TABLE IF EXISTS test_claims", 0, NULL));
}

Test(dispatch, two_dispatchers_over_ten_thousand_events_deliver_each_once)
{
	struct receiver_delivery *d;
	size_t n;
	pid_t a, b;
	const char *p[1] = { td.tenant };

	tdispatch_seed(&td, 10000, 1, "test.event");
	/* Who claimed what, as the claims wrote it: each claim sets
	 * lease_owner, "host:pid:n" of the dispatcher and its claim. */
	claims_start();
	const char *both[] = { "--batch", "100", "--log-level", "warning", NULL };
	a = spawn(both);
	b = spawn(both);
	cr_assert_eq(tdispatch_wait(a), 0);
	cr_assert_eq(tdispatch_wait(b), 0);
	{
		char pa[24], pb[24];
		snprintf(pa, sizeof(pa), "%ld", (long)a);
		snprintf(pb, sizeof(pb), "%ld", (long)b);
		const char *q[2] = { pa, pb };
		long by_a = tdispatch_scalar(&td,
		                             "SELECT count(*) FROM test_claims"
		                             " WHERE owner LIKE '%:' || $1 || ':%'",
		                             1, q);
		long by_b = tdispatch_scalar(&td,
		                             "SELECT count(*) FROM test_claims"
		                             " WHERE owner LIKE '%:' || $1 || ':%'",
		                             1, q + 1);
		long all = tdispatch_scalar(&td, "SELECT count(*) FROM test_claims", 0, NULL);
		claims_stop();
		cr_log_info("two dispatchers: %ld and %ld events claimed", by_a, by_b);
		cr_assert_eq(all, 10000, "%ld claims for 10000 events", all);
		cr_assert_eq(by_a + by_b, 10000, "claims by owners other than the two: %ld + %ld",
		             by_a, by_b);
		cr_assert_geq(by_a, 100, "dispatcher %ld claimed %ld events: no sharing", (long)a,
		              by_a);
		cr_assert_geq(by_b, 100, "dispatcher %ld claimed %ld events: no sharing", (long)b,
		              by_b);
	}
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL"), 10000,
	             "every event delivered");
	cr_assert_eq(tdispatch_count(&td, "attempts = 1"), 10000,
	             "no event was claimed twice: one attempt each");
	cr_assert_eq(receiver_deliveries(&rcv, &d, &n), 0);
	PQclear(tdispatch_sql(&td, "CREATE TEMP TABLE got (event_id text)", 0, NULL));
	PQclear(tdispatch_sql(&td, "BEGIN", 0, NULL));
	for (size_t i = 0; i < n; i++) {
		const char *q[1] = { d[i].event_id };
		PQclear(tdispatch_sql(&td, "INSERT INTO got VALUES ($1)", 1, q));
	}
	PQclear(tdispatch_sql(&td, "COMMIT", 0, NULL));
	cr_assert_eq(
	    tdispatch_scalar(&td,
	                     "SELECT count(*) FROM outbox o WHERE tenant_id = $1"
	                     " AND NOT EXISTS (SELECT 1 FROM got g WHERE g.event_id = o.event_id)",
	                     1, p),
	    0, "every event arrived");
	cr_log_info("two dispatchers, 10000 events: %zu deliveries", n);
	cr_assert_eq(n, 10000, "no duplicates without a crash: %zu deliveries", n);
	receiver_deliveries_free(d, n);
}

Test(dispatch, events_of_a_workflow_arrive_in_order_under_injected_failures)
{
	struct receiver_delivery *d;
	size_t n;
	int runs = 0;

	tdispatch_seed(&td, 30, 4, "test.event");
	cr_assert_eq(receiver_control(&rcv, "{\"fail_rate\": 0.3, \"status\": 503}"), 0);
	const char *fast[] = { "--backoff", "10ms", "--max-attempts", "100", NULL };
	while (tdispatch_count(&td, "published_at IS NULL") > 0 && runs < 200) {
		cr_assert_eq(run(fast), 0);
		runs++;
		usleep(20 * 1000);
	}
	cr_assert_eq(tdispatch_count(&td, "published_at IS NULL"), 0, "drained in %d runs", runs);

	/* For each workflow: no delivery of seq k+1 before seq k was
	 * delivered successfully. */
	cr_assert_eq(receiver_deliveries(&rcv, &d, &n), 0);
	PQclear(tdispatch_sql(&td, "CREATE TEMP TABLE arrivals (n int, event_id text, ok bool)", 0,
	                      NULL));
	PQclear(tdispatch_sql(&td, "BEGIN", 0, NULL));
	int failures = 0;
	for (size_t i = 0; i < n; i++) {
		char num[24];
		snprintf(num, sizeof(num), "%zu", i);
		const char *q[3] = { num, d[i].event_id, d[i].status == 200 ? "t" : "f" };
		failures += d[i].status != 200;
		PQclear(tdispatch_sql(&td, "INSERT INTO arrivals VALUES ($1, $2, $3)", 3, q));
	}
	PQclear(tdispatch_sql(&td, "COMMIT", 0, NULL));
	cr_assert_gt(failures, 10, "failures were injected: %d", failures);
	cr_assert_eq(
	    tdispatch_scalar(
	        &td,
	        "SELECT count(*) FROM arrivals later"
	        "  JOIN outbox lo ON lo.event_id = later.event_id"
	        "  JOIN outbox eo ON eo.workflow_id = lo.workflow_id AND eo.seq < lo.seq"
	        " WHERE NOT EXISTS (SELECT 1 FROM arrivals ok WHERE ok.event_id = eo.event_id"
	        "                     AND ok.ok AND ok.n < later.n)",
	        0, NULL),
	    0, "a later event overtook an earlier one");
	cr_log_info("order under failures: %zu deliveries, %d failed, %d runs", n, failures, runs);
	receiver_deliveries_free(d, n);
}

Test(dispatch, an_event_goes_dead_after_max_attempts_and_requeue_revives_it)
{
	char *id;
	char ctl[256];
	int rc;

	tdispatch_seed(&td, 2, 1, "test.event");
	id = event_id_of("true");
	snprintf(ctl, sizeof(ctl), "{\"fail_ids\": [\"%s\"], \"status_for_ids\": 503}", id);
	cr_assert_eq(receiver_control(&rcv, ctl), 0);
	const char *three[] = { "--max-attempts", "3", "--backoff", "10ms", NULL };
	for (int i = 0; i < 6; i++) {
		cr_assert_eq(run(three), 0);
		usleep(30 * 1000);
	}
	cr_assert_eq(
	    tdispatch_count(&td, "dead_at IS NOT NULL AND attempts = 3 AND published_at IS NULL"),
	    1, "dead after 3 attempts");
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL"), 1,
	             "the other event is unaffected");

	/* The operator's view and revival, through the CLI. */
	char cmd[2048];
	snprintf(cmd, sizeof(cmd), "'%s' --db '%s' outbox list --dead | grep -q '%s'",
	         getenv("IDEMFLOW_CLI"), getenv("DATABASE_URL"), id);
	cr_assert_eq(system(cmd), 0, "outbox list --dead shows it");
	snprintf(cmd, sizeof(cmd), "'%s' --db '%s' outbox requeue '%s' >/dev/null",
	         getenv("IDEMFLOW_CLI"), getenv("DATABASE_URL"), id);
	rc = system(cmd);
	cr_assert_eq(rc, 0);
	cr_assert_eq(
	    tdispatch_count(&td, "dead_at IS NULL AND published_at IS NULL AND attempts = 0"), 1);

	cr_assert_eq(receiver_control(&rcv, "{\"reset\": true}"), 0);
	cr_assert_eq(run(three), 0);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL"), 2, "requeued and delivered");
	free(id);
}

/*
 * A dispatcher's lease says "this event may be on the network now". A
 * requeue that cleared it would let a second run deliver the event while
 * the first still does, and the first's outcome would be lost. So the CLI
 * refuses while the lease runs (exit 75, the row untouched), requeues once
 * it has run out, and breaks it only with --force, saying so.
 */
Test(dispatch, requeue_refuses_an_event_a_dispatcher_holds_unless_forced)
{
	char *id, out[256], want[512], until[32];
	const char *p[1];
	PGresult *res;
	int rc;

	tdispatch_seed(&td, 1, 1, "test.event");
	id = event_id_of("true");
	p[0] = id;
	res = tdispatch_sql(&td,
	                    "UPDATE outbox SET lease_owner = 'host-a:4242:1', attempts = 1,"
	                    "       lease_until = date_trunc('second', now()) + interval '1 hour'"
	                    " WHERE event_id = $1"
	                    " RETURNING to_char(lease_until AT TIME ZONE 'UTC',"
	                    "                   'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')",
	                    1, p);
	snprintf(until, sizeof(until), "%s", PQgetvalue(res, 0, 0));
	PQclear(res);

	rc = tstack_cli(out, sizeof(out), "outbox", "requeue", id, NULL);
	cr_assert_eq(rc, 75, "exit %d: %s", rc, tstack_cli_stderr());
	cr_assert_str_eq(out, "");
	snprintf(want, sizeof(want),
	         "idemflow: outbox event \"%s\" is held by dispatcher \"host-a:4242:1\" until %s"
	         " and may be in delivery; requeue it after that, or with --force\n",
	         id, until);
	cr_assert_str_eq(tstack_cli_stderr(), want);
	cr_assert_eq(tdispatch_count(&td, "lease_owner = 'host-a:4242:1' AND lease_until > now()"
	                                  " AND attempts = 1"),
	             1, "the refused requeue changed the event");

	rc = tstack_cli(out, sizeof(out), "outbox", "requeue", id, "--force", NULL);
	cr_assert_eq(rc, 0, "exit %d: %s", rc, tstack_cli_stderr());
	cr_assert_str_eq(out, "requeued 1 event(s)");
	snprintf(want, sizeof(want),
	         "idemflow: warning: broke the lease of dispatcher \"host-a:4242:1\" on outbox"
	         " event \"%s\" (until %s): the event may be delivered twice, and that"
	         " dispatcher's outcome for it is not recorded\n",
	         id, until);
	cr_assert_str_eq(tstack_cli_stderr(), want);
	cr_assert_eq(tdispatch_count(&td,
	                             "lease_owner IS NULL AND lease_until IS NULL AND attempts = 0"
	                             " AND next_attempt_at <= now()"),
	             1);

	/* A lease that has run out holds nothing: no force needed, no warning. */
	PQclear(
	    tdispatch_sql(&td,
	                  "UPDATE outbox SET lease_owner = 'host-b:1:1', attempts = 2,"
	                  "       lease_until = now() - interval '1 second' WHERE event_id = $1",
	                  1, p));
	rc = tstack_cli(out, sizeof(out), "outbox", "requeue", id, NULL);
	cr_assert_eq(rc, 0, "exit %d: %s", rc, tstack_cli_stderr());
	cr_assert_str_eq(out, "requeued 1 event(s)");
	cr_assert_str_eq(tstack_cli_stderr(), "");
	cr_assert_eq(tdispatch_count(&td, "lease_owner IS NULL AND attempts = 0"), 1);

	/* And the event is delivered as usual. */
	cr_assert_eq(run(NULL), 0);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL"), 1);
	free(id);
}

Test(dispatch, a_4xx_answer_makes_the_event_dead_at_once_and_logged_as_error)
{
	char *id;
	char ctl[256];

	tdispatch_seed(&td, 1, 1, "test.event");
	id = event_id_of("true");
	snprintf(ctl, sizeof(ctl), "{\"fail_ids\": [\"%s\"], \"status_for_ids\": 400}", id);
	cr_assert_eq(receiver_control(&rcv, ctl), 0);
	cr_assert_eq(run(NULL), 0);
	cr_assert_eq(tdispatch_count(&td, "dead_at IS NOT NULL AND attempts = 1"), 1);
	cr_assert(tstack_file_contains(td.log, "level=error") &&
	              tstack_file_contains(td.log, "outcome=dead"),
	          "dead logged at error level");
	free(id);
}

/*
 * 1 once pid (a child of this process) sleeps in the --loop wait: blocked
 * in poll() with the poll interval as its timeout (libpq's own waits for
 * an answer have none), read from /proc/PID/syscall; 0 after timeout_ms.
 */
static int in_loop_wait(pid_t pid, long poll_interval_ms, long timeout_ms)
{
	char path[64], line[512];
	double deadline = tstack_now() + timeout_ms / 1000.0;

	snprintf(path, sizeof(path), "/proc/%ld/syscall", (long)pid);
	do {
		FILE *f = fopen(path, "r");
		char *arg[4] = { 0 }, *save = NULL;
		int ok = 0;

		if (f != NULL && fgets(line, sizeof(line), f) != NULL) {
			arg[0] = strtok_r(line, " \n", &save);
			for (int i = 1; i < 4 && arg[i - 1] != NULL; i++)
				arg[i] = strtok_r(NULL, " \n", &save);
#ifdef SYS_poll
			ok = arg[3] != NULL && atol(arg[0]) == SYS_poll &&
			     strtol(arg[3], NULL, 16) == poll_interval_ms;
#else
			(void)poll_interval_ms; /* ppoll: the timeout is behind a pointer */
			ok = arg[0] != NULL && atol(arg[0]) == SYS_ppoll;
#endif
		}
		if (f != NULL)
			fclose(f);
		if (ok)
			return 1;
		tstack_sleep_ms(20);
	} while (tstack_now() < deadline);
	return 0;
}

Test(dispatch, loop_mode_wakes_on_notify)
{
	pid_t pid;
	double t0;
	struct timespec ts;

	const char *loop[] = { "--loop", "--poll-interval", "60s", NULL };
	pid = spawn(loop);
	/* Asleep for the next 60 s: only a notification can wake it. */
	cr_assert(in_loop_wait(pid, 60000, 20000), "the dispatcher never reached its wait");
	clock_gettime(CLOCK_MONOTONIC, &ts);
	t0 = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
	tdispatch_seed(&td, 1, 1, "test.event");
	cr_assert(in_loop_wait(pid, 60000, 0), "the insert alone woke the dispatcher");
	/* What a worker sends after a create (app/server/worker.c). */
	PQclear(tdispatch_sql(&td, "NOTIFY idemflow_outbox", 0, NULL));
	cr_assert_eq(receiver_wait(&rcv, 1, 5000), 0, "not woken by NOTIFY: %s", rcv.error);
	clock_gettime(CLOCK_MONOTONIC, &ts);
	cr_log_info("loop: delivered %.0f ms after the insert",
	            ((double)ts.tv_sec + (double)ts.tv_nsec / 1e9 - t0) * 1e3);
	kill(pid, SIGTERM);
	cr_assert_eq(tdispatch_wait(pid), 0, "SIGTERM ends --loop cleanly");
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL"), 1);
}

Test(dispatch, loop_mode_outlives_a_database_restart)
{
	struct err e;
	pid_t pid;

	const char *loop[] = { "--loop", "--poll-interval", "1s", NULL };
	pid = spawn(loop);
	/* Connected and asleep in its wait before the restart: a dispatcher
	 * still starting when the database goes away exits instead. */
	cr_assert(in_loop_wait(pid, 1000, 20000), "the dispatcher never reached its wait");
	tstack_pg_ctl("restart");
	PQfinish(td.conn);
	td.conn = db_connect_simple(getenv("DATABASE_URL"), "test_dispatch", &e);
	cr_assert_not_null(td.conn, "%s", e.msg);
	tdispatch_seed(&td, 1, 1, "test.event");
	PQclear(tdispatch_sql(&td, "NOTIFY idemflow_outbox", 0, NULL));
	cr_assert_eq(receiver_wait(&rcv, 1, 10000), 0,
	             "the --loop dispatcher did not deliver after the restart: %s", rcv.error);
	cr_assert(tstack_pid_gone(pid) == 0, "the dispatcher exited with the database");
	kill(pid, SIGTERM);
	cr_assert_eq(tdispatch_wait(pid), 0, "SIGTERM still ends --loop cleanly");
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL"), 1);
	cr_assert(tstack_file_contains(td.log, "lost the database"), "the outage is logged");
}

/* A sample's value in a textfile (its name with its labels, exactly);
 * -1 when the file or the sample is not there. */
static double prom_value(const char *path, const char *sample)
{
	char line[1024];
	FILE *f = fopen(path, "r");
	double v = -1;
	size_t n = strlen(sample);

	if (f == NULL)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, sample, n) == 0 && line[n] == ' ')
			v = strtod(line + n + 1, NULL);
	fclose(f);
	return v;
}

#define EVENTS "idemflow_dispatch_events_total{sink=\"http\",outcome="
#define LAG    "idemflow_dispatch_delivery_lag_seconds"

Test(dispatch, loop_mode_writes_its_metrics_while_it_runs_with_exact_counts)
{
	char prom[600], q[1024];
	double deadline;
	pid_t pid;

	snprintf(prom, sizeof(prom), "%s/dispatch-loop.prom",
	         getenv("IDEMFLOW_STACK_DIR") ? getenv("IDEMFLOW_STACK_DIR") : "/tmp");
	unlink(prom);
	/* A failure is retried in an hour, not during the test; an event on
	 * its second attempt is dead. */
	const char *loop[] = { "--loop", "--poll-interval", "60s", "--textfile", prom, "--backoff",
		               "1h",     "--max-attempts",  "2",   NULL };
	pid = spawn(loop);
	cr_assert(in_loop_wait(pid, 60000, 20000), "the dispatcher never reached its wait");
	/* Written before the first wait, with nothing counted yet. */
	cr_assert_eq(prom_value(prom, EVENTS "\"delivered\"}"), 0, "no %s while waiting", prom);

	/* Six events of six workflows: three created 100 s ago, one now, all
	 * four delivered; two the receiver refuses with 503: one on its first
	 * attempt (retried), one on its second (dead). */
	const char *p[1] = { td.tenant };
	snprintf(
	    q, sizeof(q),
	    "WITH w AS ("
	    "  INSERT INTO workflows (tenant_id, id, type, input, created_at, updated_at)"
	    "  SELECT $1, gen_random_uuid(), 'test', '{}', now(), now()"
	    "    FROM generate_series(1, 6) RETURNING tenant_id, id)"
	    " INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload, attempts)"
	    " SELECT w.id::text || '.1', w.tenant_id, w.id, 1,"
	    "        CASE r WHEN 5 THEN 'test.retry' WHEN 6 THEN 'test.dead' ELSE 'test.ok' END,"
	    "        json_build_object('id', w.id::text || '.1', 'seq', 1,"
	    "          'data', json_build_object('occurred_at', '2000-01-01T00:00:00Z'),"
	    "          'occurred_at', idemflow_ts(now() - CASE WHEN r <= 3"
	    "            THEN interval '100 s' ELSE interval '0' END))::text,"
	    "        CASE WHEN r = 6 THEN 1 ELSE 0 END"
	    "   FROM (SELECT *, row_number() OVER (ORDER BY id) r FROM w) w");
	PQclear(tdispatch_sql(&td, q, 1, p));
	{
		char *retry = event_id_of("type = 'test.retry'");
		char *dead = event_id_of("type = 'test.dead'");
		char ctl[512];
		snprintf(ctl, sizeof(ctl),
		         "{\"fail_ids\": [\"%s\", \"%s\"], \"status_for_ids\": 503}", retry, dead);
		cr_assert_eq(receiver_control(&rcv, ctl), 0);
		free(retry);
		free(dead);
	}
	PQclear(tdispatch_sql(&td, "NOTIFY idemflow_outbox", 0, NULL));

	/* Read while the dispatcher runs on: the counts of the round. */
	deadline = tstack_now() + 20;
	while (prom_value(prom, EVENTS "\"delivered\"}") < 4 ||
	       prom_value(prom, EVENTS "\"dead\"}") < 1 ||
	       prom_value(prom, EVENTS "\"retried\"}") < 1) {
		cr_assert(tstack_now() < deadline, "the textfile did not count the round; see %s",
		          prom);
		tstack_sleep_ms(50);
	}
	cr_assert(in_loop_wait(pid, 60000, 10000), "the dispatcher is not waiting again");
	cr_assert_eq(tstack_pid_gone(pid), 0, "the dispatcher exited");
	cr_assert_eq(prom_value(prom, EVENTS "\"delivered\"}"), 4);
	cr_assert_eq(prom_value(prom, EVENTS "\"retried\"}"), 1);
	cr_assert_eq(prom_value(prom, EVENTS "\"dead\"}"), 1);
	cr_assert_eq(prom_value(prom, "idemflow_dispatch_broker_duplicates_total{sink=\"http\"}"),
	             0);
	/* The lag from each event's own occurred_at, not the one in its data. */
	cr_assert_eq(prom_value(prom, LAG "_count{sink=\"http\"}"), 4);
	cr_assert_eq(prom_value(prom, LAG "_bucket{sink=\"http\",le=\"60\"}"), 1);
	cr_assert_eq(prom_value(prom, LAG "_bucket{sink=\"http\",le=\"120\"}"), 4);
	cr_assert_eq(prom_value(prom, LAG "_bucket{sink=\"http\",le=\"+Inf\"}"), 4);
	double sum = prom_value(prom, LAG "_sum{sink=\"http\"}");
	cr_assert(sum >= 300 && sum < 360, "lag sum %.3f s for three events 100 s old and one new",
	          sum);
	cr_assert_eq(
	    prom_value(prom, "idemflow_dispatch_delivery_lag_unknown_total{sink=\"http\"}"), 0);
	cr_assert_eq(prom_value(prom, "idemflow_dispatch_last_run_success"), -1,
	             "the end of a run's gauges while the loop runs");
	cr_assert_gt(prom_value(prom, "idemflow_dispatch_last_write_timestamp_seconds"),
	             (double)time(NULL) - 30);

	kill(pid, SIGTERM);
	cr_assert_eq(tdispatch_wait(pid), 0);
	/* At the end: the counters, and the run's gauges beside them. */
	cr_assert_eq(prom_value(prom, EVENTS "\"delivered\"}"), 4);
	cr_assert_eq(prom_value(prom, "idemflow_dispatch_last_run_published"), 4);
	cr_assert_eq(prom_value(prom, "idemflow_dispatch_last_run_success"), 1);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL"), 4);
}

Test(dispatch, bad_configuration_gives_a_clear_message_and_a_distinct_exit_code)
{
	const char *smtp[] = { "--sink", "smtp", NULL };
	cr_assert_eq(run(smtp), 78);
	cr_assert(tstack_file_contains(td.log, "level=error component=dispatch") &&
	              tstack_file_contains(
	                  td.log, "msg=\"bad configuration\" error=\"invalid value \\\"smtp\\\" for"
	                          " \\\"sink\\\": expected http, amqp, nats or exec\" exit=78"),
	          "the message names the key, the value and the choices");
	const char *badurl[] = { "--url", "not a url", NULL };
	cr_assert_eq(run(badurl), 78);
	cr_assert(tstack_file_contains(
	    td.log, "msg=\"bad configuration\" error=\"url \\\"not a url\\\" is not a"
	            " valid URL"));
	const char *backoff[] = { "--backoff", "5s,soon", NULL };
	cr_assert_eq(run(backoff), 78);
	cr_assert(tstack_file_contains(
	    td.log, "msg=\"bad configuration\" error=\"invalid value \\\"5s,soon\\\" for"
	            " \\\"backoff\\\""));
	const char *nodb[] = { "--db", "host=127.0.0.1 port=1 dbname=x", NULL };
	cr_assert_eq(run(nodb), 75, "an unreachable database is \"try later\"");
	cr_assert(tstack_file_contains(
	    td.log, "msg=\"run failed\" error=\"could not connect to database:"));
	const char *both[] = { "--once", "--loop", NULL };
	cr_assert_eq(run(both), 64);
}

Test(dispatch, the_exec_sink_runs_a_command_per_event_with_the_event_on_stdin)
{
	char dir[256], cmd[2400], path[700], want[256];
	char *id;
	FILE *f;

	tdispatch_seed(&td, 1, 1, "test.event");
	id = event_id_of("true");
	snprintf(dir, sizeof(dir), "%s/exec-%ld",
	         getenv("IDEMFLOW_STACK_DIR") ? getenv("IDEMFLOW_STACK_DIR") : "/tmp",
	         (long)getpid());
	mkdir(dir, 0755);
	/* A command that fails first: the event is retried, not lost. */
	snprintf(cmd, sizeof(cmd),
	         "test -e '%s/fail-once' || { touch '%s/fail-once'; exit 3; };"
	         " cat > \"%s/$IDEMFLOW_EVENT_ID\"; echo \"$IDEMFLOW_EVENT_TYPE"
	         " $IDEMFLOW_WORKFLOW_ID $IDEMFLOW_ATTEMPT\" > \"%s/$IDEMFLOW_EVENT_ID.env\"",
	         dir, dir, dir, dir);
	/* The retry is due 5 s later (+-20%): never within the first run,
	 * however slow the machine (that would make it attempt 2); the test
	 * makes it due before the second run. */
	const char *exec[] = { "--sink", "exec", "--exec", cmd, "--backoff", "5s", NULL };
	cr_assert_eq(run(exec), 0);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NULL AND attempts = 1 AND last_error = "
	                                  "'command exited with status 3'"),
	             1, "a failing command is a retry with its status recorded");
	PQclear(tdispatch_sql(&td,
	                      "UPDATE outbox SET next_attempt_at = now() WHERE tenant_id = $1"
	                      " AND published_at IS NULL",
	                      1, (const char *const[]){ td.tenant }));
	cr_assert_eq(run(exec), 0);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL AND attempts = 2"), 1);

	/* The command got the stored event JSON on stdin, byte for byte,
	 * and the id, type, workflow and attempt in its environment. */
	const char *p[1] = { id };
	PGresult *res =
	    tdispatch_sql(&td, "SELECT payload, workflow_id FROM outbox WHERE event_id = $1", 1, p);
	snprintf(path, sizeof(path), "%s/%s", dir, id);
	f = fopen(path, "r");
	cr_assert_not_null(f, "the command did not write %s", path);
	char got[4096] = "";
	size_t n = fread(got, 1, sizeof(got) - 1, f);
	got[n] = '\0';
	fclose(f);
	cr_assert_str_eq(got, PQgetvalue(res, 0, 0));
	snprintf(path, sizeof(path), "%s/%s.env", dir, id);
	f = fopen(path, "r");
	cr_assert_not_null(f);
	n = fread(got, 1, sizeof(got) - 1, f);
	got[n] = '\0';
	fclose(f);
	snprintf(want, sizeof(want), "test.event %s 2\n", PQgetvalue(res, 0, 1));
	cr_assert_str_eq(got, want);
	PQclear(res);
	free(id);
}

/*
 * Runs the dispatcher with extra and, until it exits, watches its session
 * in pg_stat_activity every 50 ms: a statement seen active for longer than
 * limit_ms is cancelled (pg_cancel_backend) and counted. The limit holds
 * whatever the binary makes of --statement-timeout (a dispatcher that
 * ignored the option ran with 60 s). The count is what a test asserts: a
 * claim whose rows wait in a full socket is sent from a tuplestore, where
 * the backend checks for no cancel, and once it has read its next command
 * it drops a cancel (a statement_timeout, by contrast, then still aborts
 * the transaction, and a recording sent with the claim with it). *longest_ms
 * gets the longest statement seen, *cancelled how many went past the limit.
 * Returns the exit status.
 */
static int run_with_statement_limit(const char *const *extra, long limit_ms, long *longest_ms,
                                    long *cancelled)
{
	char app[64], lim[24], last[96] = "";
	pid_t pid = spawn(extra);
	int st;

	snprintf(app, sizeof(app), "%%-dispatch-%ld", (long)pid);
	snprintf(lim, sizeof(lim), "%ld", limit_ms);
	*longest_ms = 0;
	*cancelled = 0;
	for (;;) {
		pid_t w = waitpid(pid, &st, WNOHANG);
		cr_assert_geq(w, 0);
		if (w == pid)
			break;
		const char *p[2] = { app, lim };
		PGresult *res = tdispatch_sql(
		    &td,
		    "SELECT (extract(epoch FROM clock_timestamp() - query_start) * 1000)::bigint,"
		    "       CASE WHEN clock_timestamp() - query_start > $2::bigint * interval '1 "
		    "ms'"
		    "            THEN pg_cancel_backend(pid) ELSE false END,"
		    "       pid || ' ' || query_start"
		    "  FROM pg_stat_activity WHERE application_name LIKE $1 AND state = 'active'",
		    2, p);
		for (int i = 0; i < PQntuples(res); i++) {
			long ms = atol(PQgetvalue(res, i, 0));
			if (ms > *longest_ms)
				*longest_ms = ms;
			/* A backend blocked on its socket sees the cancel only
			 * once the write is done: count each statement once. */
			if (strcmp(PQgetvalue(res, i, 1), "t") == 0 &&
			    strcmp(PQgetvalue(res, i, 2), last) != 0) {
				snprintf(last, sizeof(last), "%s", PQgetvalue(res, i, 2));
				++*cancelled;
			}
		}
		PQclear(res);
		usleep(50 * 1000);
	}
	cr_assert(WIFEXITED(st), "dispatcher killed by signal %d", WTERMSIG(st));
	return WEXITSTATUS(st);
}

/*
 * The command gets a clean environment: the dispatcher's own (its database
 * settings, libpq's PG* variables, anything a unit file set) stays behind.
 * What it gets is documented in idemflow-dispatch(8); dash adds PWD. The
 * trace context comes from the database: a stored value that is not a valid
 * traceparent or tracestate is not passed on.
 */
Test(dispatch, the_exec_sink_passes_a_clean_environment_and_only_valid_trace_context)
{
	char dir[256], cmd[1400], path[700], svc[700], got[4096] = "";
	const char *tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
	FILE *f;
	size_t n;

	snprintf(dir, sizeof(dir), "%s/exec-env-%ld",
	         getenv("IDEMFLOW_STACK_DIR") ? getenv("IDEMFLOW_STACK_DIR") : "/tmp",
	         (long)getpid());
	mkdir(dir, 0755);
	/* libpq must still work for the dispatcher itself with these set. */
	snprintf(svc, sizeof(svc), "%s/pg_service.conf", dir);
	f = fopen(svc, "w");
	cr_assert_not_null(f);
	fprintf(f, "[idemflow_test]\nhost=%s\n", getenv("PGHOST"));
	fclose(f);
	setenv("PGSERVICEFILE", svc, 1);
	setenv("PGSERVICE", "idemflow_test", 1);
	setenv("PGPASSWORD", "not-for-commands", 1);
	setenv("IDEMFLOW_SECRET_OF_THE_DISPATCHER", "x", 1);
	setenv("PATH", "/usr/bin:/bin", 1);
	setenv("HOME", "/nonexistent", 1);
	setenv("LANG", "C.UTF-8", 1);
	setenv("TZ", "UTC", 1);
	unsetenv("LC_ALL");

	/* Three events: a valid trace, a tracestate with a byte the spec
	 * forbids, a traceparent that is not one (both written past the
	 * server, as a bad migration or a hand could). */
	const char *p[2] = { td.tenant, tp };
	PQclear(tdispatch_sql(
	    &td,
	    "WITH w AS ("
	    "  INSERT INTO workflows (tenant_id, id, type, input, created_at, updated_at)"
	    "  SELECT $1, gen_random_uuid(), 'test', '{}', now(), now()"
	    "    FROM generate_series(1, 3) RETURNING tenant_id, id)"
	    " INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload,"
	    "                     traceparent, tracestate)"
	    " SELECT w.id::text || '.1', w.tenant_id, w.id, 1, 'test.event', '{}',"
	    "        CASE WHEN n < 3 THEN $2 ELSE repeat('x', 55) END,"
	    "        CASE n WHEN 1 THEN 'k=$(id)`x`;v' WHEN 2 THEN 'k=v' || chr(10) || 'X=1'"
	    "               ELSE 'k=v' END"
	    "   FROM (SELECT *, row_number() OVER () n FROM w) w",
	    2, p));
	snprintf(
	    cmd, sizeof(cmd),
	    "env | sed 's/=.*//' | sort | tr '\\n' ' ' > \"%s/$IDEMFLOW_EVENT_ID\";"
	    " printf '%%s|%%s' \"$TRACEPARENT\" \"$TRACESTATE\" > \"%s/$IDEMFLOW_EVENT_ID.trace\"",
	    dir, dir);
	const char *exec[] = { "--sink", "exec", "--exec", cmd, NULL };
	cr_assert_eq(run(exec), 0);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL"), 3);

	PGresult *res =
	    tdispatch_sql(&td,
	                  "SELECT event_id, traceparent = $2 FROM outbox WHERE tenant_id = $1"
	                  " ORDER BY traceparent = $2 DESC, tracestate LIKE 'k=$%' DESC",
	                  2, p);
	cr_assert_eq(PQntuples(res), 3);
	const char *want_names[3] = {
		"HOME IDEMFLOW_ATTEMPT IDEMFLOW_EVENT_ID IDEMFLOW_EVENT_TYPE IDEMFLOW_WORKFLOW_ID"
		" LANG PATH PWD TRACEPARENT TRACESTATE TZ ",
		"HOME IDEMFLOW_ATTEMPT IDEMFLOW_EVENT_ID IDEMFLOW_EVENT_TYPE IDEMFLOW_WORKFLOW_ID"
		" LANG PATH PWD TRACEPARENT TZ ",
		"HOME IDEMFLOW_ATTEMPT IDEMFLOW_EVENT_ID IDEMFLOW_EVENT_TYPE IDEMFLOW_WORKFLOW_ID"
		" LANG PATH PWD TZ ",
	};
	char want_trace[3][128];
	snprintf(want_trace[0], sizeof(want_trace[0]), "%s|k=$(id)`x`;v", tp);
	snprintf(want_trace[1], sizeof(want_trace[1]), "%s|", tp);
	snprintf(want_trace[2], sizeof(want_trace[2]), "|");
	for (int i = 0; i < 3; i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, PQgetvalue(res, i, 0));
		f = fopen(path, "r");
		cr_assert_not_null(f, "the command did not write %s", path);
		n = fread(got, 1, sizeof(got) - 1, f);
		got[n] = '\0';
		fclose(f);
		cr_assert_str_eq(got, want_names[i], "event %d: %s", i, got);
		snprintf(path, sizeof(path), "%s/%s.trace", dir, PQgetvalue(res, i, 0));
		f = fopen(path, "r");
		cr_assert_not_null(f);
		n = fread(got, 1, sizeof(got) - 1, f);
		got[n] = '\0';
		fclose(f);
		cr_assert_str_eq(got, want_trace[i], "event %d: %s", i, got);
	}
	PQclear(res);
}

/*
 * The pipeline records batch k-1 and claims batch k+1 while the sink
 * delivers batch k. Here a batch's payloads (100 x 8 KiB) are far larger
 * than a socket buffer and its delivery (100 commands of 20 ms, 2 s and
 * more) outlasts the statement timeout of 1 s, which the test enforces
 * itself: the claim must never wait on the sink, and a recording must
 * never depend on it. Before the recording and the claim were two
 * transactions and the claim's rows were read during the delivery, the
 * claim stayed active until the delivery ended, and its statement_timeout
 * aborted it and the recording sent with it: what the run had delivered
 * was never recorded. Every event ends up published, none is delivered
 * more than twice, and the run exits 0.
 */
Test(dispatch, a_slow_sink_and_large_events_never_lose_what_a_run_delivered)
{
	long longest, cancelled;
	char dir[256], cmd[1200];
	const char *p[1] = { td.tenant };

	PQclear(tdispatch_sql(
	    &td,
	    "WITH w AS ("
	    "  INSERT INTO workflows (tenant_id, id, type, input, created_at, updated_at)"
	    "  SELECT $1, gen_random_uuid(), 'test', '{}', now(), now()"
	    "    FROM generate_series(1, 300) RETURNING tenant_id, id)"
	    " INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload)"
	    " SELECT w.id::text || '.1', w.tenant_id, w.id, 1, 'test.event',"
	    "        json_build_object('id', w.id::text || '.1', 'pad', repeat('x', 8192))::text"
	    "   FROM w",
	    1, p));
	snprintf(dir, sizeof(dir), "%s/slow-%ld",
	         getenv("IDEMFLOW_STACK_DIR") ? getenv("IDEMFLOW_STACK_DIR") : "/tmp",
	         (long)getpid());
	mkdir(dir, 0755);
	/* One line per delivery, appended (O_APPEND: whole lines). */
	snprintf(cmd, sizeof(cmd), "sleep 0.02; echo \"$IDEMFLOW_EVENT_ID\" >> '%s/delivered'",
	         dir);
	const char *slow[] = {
		"--sink", "exec", "--exec", cmd, "--batch", "100", "--statement-timeout", "1s", NULL
	};
	int rc = run_with_statement_limit(slow, 1000, &longest, &cancelled);
	cr_log_info("slow sink: exit %d, longest dispatcher statement %ld ms, %ld cancelled,"
	            " %ld of 300 events published on their first attempt",
	            rc, longest, cancelled,
	            tdispatch_count(&td, "published_at IS NOT NULL AND attempts = 1"));
	cr_assert_eq(cancelled, 0,
	             "%ld of the dispatcher's statements ran past 1 s (the longest %ld ms):"
	             " a claim waited on the sink (log: %s)",
	             cancelled, longest, td.log);
	cr_assert_eq(rc, 0, "the run exited %d (log: %s)", rc, td.log);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL AND attempts = 1"), 300,
	             "every event is recorded as published on its first attempt");
	cr_assert_eq(tdispatch_count(&td, "lease_owner IS NOT NULL"), 0, "no lease is left behind");

	/* What the sink saw: each event once (a second delivery would be
	 * allowed by at-least-once, but nothing here calls for one). */
	char path[300], line[128];
	snprintf(path, sizeof(path), "%s/delivered", dir);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f);
	PQclear(tdispatch_sql(&td, "CREATE TEMP TABLE seen (event_id text)", 0, NULL));
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = '\0';
		const char *q[1] = { line };
		PQclear(tdispatch_sql(&td, "INSERT INTO seen VALUES ($1)", 1, q));
	}
	fclose(f);
	cr_assert_eq(tdispatch_scalar(&td, "SELECT count(*) FROM seen", 0, NULL), 300);
	cr_assert_eq(tdispatch_scalar(&td, "SELECT count(DISTINCT event_id) FROM seen", 0, NULL),
	             300);
	cr_assert_eq(tdispatch_scalar(&td,
	                              "SELECT count(*) FROM seen s JOIN outbox o USING (event_id)"
	                              " WHERE o.tenant_id = $1",
	                              1, p),
	             300, "the sink got exactly this tenant's events");
}

Test(dispatch, events_not_attempted_before_the_lease_would_end_are_released_untouched,
     .fini = claims_stop)
{
	struct receiver_delivery *d;
	size_t n;
	long claims;

	tdispatch_seed(&td, 10, 1, "test.event");
	/* Half a second per delivery, one at a time, a 3 s lease that must
	 * end a 1 s timeout plus a 1 s margin early: a batch of 10 cannot
	 * be delivered within one lease. */
	cr_assert_eq(receiver_control(&rcv, "{\"delay_ms\": 500}"), 0);
	claims_start();
	const char *slow[] = { "--batch", "10",      "--parallel", "1", "--timeout",
		               "1s",      "--lease", "3s",         NULL };
	cr_assert_eq(run(slow), 0);
	claims = tdispatch_scalar(&td, "SELECT count(*) FROM test_claims", 0, NULL);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL"), 10, "every event delivered");
	/* Claimed again after a release, yet attempted once: the release
	 * took back the attempt its claim had counted. */
	cr_assert_eq(tdispatch_count(&td, "attempts = 1"), 10, "one attempt each");
	cr_assert_gt(claims, 10, "%ld claims: no event was released and claimed again", claims);
	cr_assert_eq(receiver_deliveries(&rcv, &d, &n), 0, "%s", rcv.error);
	cr_assert_eq(n, 10, "each event delivered once: %zu deliveries", n);
	receiver_deliveries_free(d, n);
	cr_log_info("lease release: %ld claims for 10 events", claims);
}

/* A trigger that makes this tenant's outbox updates matching cond (over
 * OLD and NEW) run body first, until fault_stop(). The sequence
 * test_fault_n counts the calls, outside every transaction. */
static int faulting;

static void fault_start(const char *cond, const char *body)
{
	char q[1024];

	faulting = 1;
	PQclear(tdispatch_sql(&td, "CREATE SEQUENCE test_fault_n", 0, NULL));
	snprintf(q, sizeof(q),
	         "CREATE FUNCTION test_fault() RETURNS trigger LANGUAGE plpgsql AS"
	         " $$BEGIN %s RETURN NEW; END$$",
	         body);
	PQclear(tdispatch_sql(&td, q, 0, NULL));
	snprintf(q, sizeof(q),
	         "CREATE TRIGGER test_fault BEFORE UPDATE ON outbox FOR EACH ROW"
	         " WHEN (NEW.tenant_id = %s AND %s) EXECUTE FUNCTION test_fault()",
	         td.tenant, cond);
	PQclear(tdispatch_sql(&td, q, 0, NULL));
}

static void fault_stop(void)
{
	if (!faulting)
		return;
	faulting = 0;
	PQclear(tdispatch_sql(&td, "DROP TRIGGER test_fault ON outbox", 0, NULL));
	PQclear(tdispatch_sql(&td, "DROP FUNCTION test_fault()", 0, NULL));
	PQclear(tdispatch_sql(&td, "DROP SEQUENCE test_fault_n", 0, NULL));
}

/* The receiver got n deliveries, each of a different event of this
 * tenant's, each recorded as published on attempt 1. */
static void delivered_once_and_published(size_t want)
{
	struct receiver_delivery *d;
	size_t n;

	cr_assert_eq(receiver_deliveries(&rcv, &d, &n), 0, "%s", rcv.error);
	cr_assert_eq(n, want, "%zu deliveries, want %zu (log: %s)", n, want, td.log);
	for (size_t i = 0; i < n; i++) {
		const char *p[2] = { td.tenant, d[i].event_id };
		for (size_t j = 0; j < i; j++)
			cr_assert_str_neq(d[i].event_id, d[j].event_id, "%s delivered twice",
			                  d[i].event_id);
		cr_assert_eq(tdispatch_scalar(&td,
		                              "SELECT count(*) FROM outbox WHERE tenant_id = $1"
		                              " AND event_id = $2 AND published_at IS NOT NULL"
		                              " AND attempts = 1 AND lease_owner IS NULL",
		                              2, p),
		             1, "%s was delivered but is not recorded published (log: %s)",
		             d[i].event_id, td.log);
	}
	receiver_deliveries_free(d, n);
}

/*
 * The claim of batch k+1 goes out with batch k's delivery and fails while
 * the sink delivers (here: the statement timeout of 1 s cancels it). The
 * run ends, but records batch k first: before, it ended at once, and the
 * events it had delivered were claimed and delivered again once their
 * lease ran out. The claim that failed took nothing: its events are due,
 * never attempted.
 */
Test(dispatch, a_claim_that_fails_during_a_delivery_leaves_that_delivery_recorded,
     .fini = fault_stop)
{
	tdispatch_seed(&td, 4, 1, "test.event");
	/* The run's second claim (owner host:pid:2) outlasts the timeout. */
	fault_start("NEW.lease_owner LIKE '%:2'", "PERFORM pg_sleep(5);");
	const char *a[] = { "--batch", "2", "--statement-timeout", "1s", NULL };
	int rc = run(a);
	cr_assert_eq(rc, 70, "the failed claim fails the run: exit %d (log: %s)", rc, td.log);
	cr_assert(tstack_file_contains(td.log, "canceling statement due to statement timeout"),
	          "log: %s", td.log);
	delivered_once_and_published(2);
	cr_assert_eq(
	    tdispatch_count(&td, "published_at IS NULL AND attempts = 0 AND lease_owner IS NULL"),
	    2, "the events of the failed claim are due, never attempted");

	/* The next run delivers the rest, and nothing twice. */
	fault_stop();
	cr_assert_eq(run(NULL), 0, "log: %s", td.log);
	delivered_once_and_published(4);
}

/*
 * The recording of batch k-1 fails (once) while the claim of batch k+1,
 * its own transaction, goes through. The run ends, but first records
 * k-1 again and batch k, and hands back the batch it claimed ahead with
 * its attempt taken back. Before, k-1 and k were delivered but left
 * leased, to be delivered again, and k+1 waited out a lease with an
 * attempt that never happened.
 */
Test(dispatch, a_failed_recording_ends_the_run_with_every_batch_recorded_or_released,
     .fini = fault_stop)
{
	tdispatch_seed(&td, 6, 1, "test.event");
	/* The first row of the first recording that publishes fails. */
	fault_start("NEW.published_at IS NOT NULL AND OLD.published_at IS NULL",
	            "IF nextval('test_fault_n') = 1 THEN"
	            " RAISE EXCEPTION 'test: recording fails'; END IF;");
	const char *a[] = { "--batch", "2", NULL };
	int rc = run(a);
	cr_assert_eq(rc, 70, "the failed recording fails the run: exit %d (log: %s)", rc, td.log);
	cr_assert(tstack_file_contains(td.log, "test: recording fails"), "log: %s", td.log);
	delivered_once_and_published(4);
	cr_assert_eq(
	    tdispatch_count(&td, "published_at IS NULL AND attempts = 0 AND lease_owner IS NULL"),
	    2, "the batch claimed ahead is released, its attempt taken back");

	fault_stop();
	cr_assert_eq(run(NULL), 0, "log: %s", td.log);
	delivered_once_and_published(6);
}

Test(dispatch, a_dead_event_holds_back_its_workflows_later_events_until_requeued)
{
	char *dead, *held, ctl[256], cmd[2048];
	struct receiver_delivery *d;
	size_t n, n0;

	tdispatch_seed(&td, 2, 2, "test.event");
	dead = event_id_of("seq = 1");
	{
		const char *p[1] = { dead };
		PGresult *res = tdispatch_sql(
		    &td,
		    "SELECT event_id FROM outbox WHERE workflow_id ="
		    " (SELECT workflow_id FROM outbox WHERE event_id = $1) AND seq = 2",
		    1, p);
		held = strdup(PQgetvalue(res, 0, 0));
		PQclear(res);
	}
	snprintf(ctl, sizeof(ctl), "{\"fail_ids\": [\"%s\"], \"status_for_ids\": 400}", dead);
	cr_assert_eq(receiver_control(&rcv, ctl), 0);
	cr_assert_eq(run(NULL), 0);
	cr_assert_eq(run(NULL), 0);
	cr_assert_eq(tdispatch_count(&td, "dead_at IS NOT NULL"), 1);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL"), 2,
	             "the other workflow went out");
	{
		const char *p[1] = { held };
		cr_assert_eq(
		    tdispatch_scalar(&td,
		                     "SELECT count(*) FROM outbox WHERE event_id = $1 AND"
		                     " published_at IS NULL AND dead_at IS NULL AND attempts = 0",
		                     1, p),
		    1, "the later event was never attempted");
	}
	cr_assert_eq(receiver_deliveries(&rcv, &d, &n), 0);
	for (size_t i = 0; i < n; i++)
		cr_assert_str_neq(d[i].event_id, held, "delivered past a dead event");
	receiver_deliveries_free(d, n);
	n0 = n;

	/* Requeued, the dead one goes first, then the one it held. */
	snprintf(cmd, sizeof(cmd), "'%s' --db '%s' outbox requeue '%s' >/dev/null",
	         getenv("IDEMFLOW_CLI"), getenv("DATABASE_URL"), dead);
	cr_assert_eq(system(cmd), 0);
	cr_assert_eq(receiver_control(&rcv, "{\"reset\": true}"), 0);
	cr_assert_eq(run(NULL), 0);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL"), 4);
	cr_assert_eq(receiver_deliveries(&rcv, &d, &n), 0);
	cr_assert_eq(n, n0 + 2, "%zu deliveries after the requeue", n - n0);
	cr_assert_str_eq(d[n0].event_id, dead);
	cr_assert_str_eq(d[n0 + 1].event_id, held);
	receiver_deliveries_free(d, n);
	free(dead);
	free(held);
}

/*
 * Behind a dead event, a workflow's later events wait for its requeue;
 * each claim used to walk every one of them (100,000: 2.4 s a claim, for
 * every tenant). They are parked out of every claim's range instead: the
 * ones already there when their predecessor dies (by the dispatcher), and
 * the ones written after (by idemflow_event); a requeue brings them back,
 * in order.
 */
Test(dispatch, events_held_behind_a_dead_one_leave_every_claims_range_until_requeued)
{
	char *dead, cmd[2048];
	const char *p[1] = { td.tenant };
	FILE *f;
	char line[512];
	int held_lines = 0;

	tdispatch_seed(&td, 2, 3, "test.event");
	dead = event_id_of("seq = 1");
	snprintf(cmd, sizeof(cmd), "{\"fail_ids\": [\"%s\"], \"status_for_ids\": 400}", dead);
	cr_assert_eq(receiver_control(&rcv, cmd), 0);
	cr_assert_eq(run(NULL), 0);
	cr_assert_eq(tdispatch_count(&td, "dead_at IS NOT NULL"), 1);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL"), 3,
	             "the other workflow went out");
	/* 500 more events of the dead one's workflow, as commands write them. */
	{
		const char *q[2] = { td.tenant, dead };
		PQclear(
		    tdispatch_sql(&td,
		                  "UPDATE workflows SET last_seq = 3 WHERE tenant_id = $1 AND id ="
		                  " (SELECT workflow_id FROM outbox WHERE event_id = $2)",
		                  2, q));
		PQclear(tdispatch_sql(
		    &td,
		    "SELECT idemflow_event($1, (SELECT workflow_id FROM outbox"
		    "                               WHERE event_id = $2), 'test.later', '{}')"
		    "  FROM generate_series(1, 500)",
		    2, q));
	}
	cr_assert_eq(tdispatch_count(&td, "published_at IS NULL AND dead_at IS NULL"), 502);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NULL AND dead_at IS NULL"
	                                  " AND next_attempt_at <= now()"),
	             0, "held-back events left in the claims' range");
	cr_assert_eq(tdispatch_scalar(&td,
	                              "SELECT count(*) FROM outbox WHERE tenant_id = $1"
	                              " AND next_attempt_at = 'infinity'",
	                              1, p),
	             502);
	/* outbox list says which are held. */
	snprintf(cmd, sizeof(cmd), "'%s' --db '%s' outbox list --pending --limit 1000",
	         getenv("IDEMFLOW_CLI"), getenv("DATABASE_URL"));
	f = popen(cmd, "r");
	cr_assert_not_null(f);
	while (fgets(line, sizeof(line), f) != NULL)
		held_lines += strstr(line, "\theld\t") != NULL;
	cr_assert_eq(pclose(f), 0);
	cr_assert_geq(held_lines, 502);

	/* Requeued, all go out, in order. */
	snprintf(cmd, sizeof(cmd), "'%s' --db '%s' outbox requeue --dead >/dev/null",
	         getenv("IDEMFLOW_CLI"), getenv("DATABASE_URL"));
	cr_assert_eq(system(cmd), 0);
	cr_assert_eq(tdispatch_count(&td, "next_attempt_at = 'infinity'"), 0);
	cr_assert_eq(receiver_control(&rcv, "{\"reset\": true}"), 0);
	cr_assert_eq(run(NULL), 0);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NULL"), 0);
	{
		const char *q[1] = { dead };
		cr_assert_eq(
		    tdispatch_scalar(&td,
		                     "SELECT count(*) FROM outbox a JOIN outbox b"
		                     "  ON b.workflow_id = a.workflow_id AND b.seq = a.seq + 1"
		                     " WHERE a.workflow_id = (SELECT workflow_id FROM outbox"
		                     "                         WHERE event_id = $1)"
		                     "   AND b.published_at < a.published_at",
		                     1, q),
		    0, "delivered out of order after the requeue");
	}
	free(dead);
}

Test(dispatch, a_retry_after_longer_than_the_backoff_schedules_the_next_attempt)
{
	tdispatch_seed(&td, 2, 1, "test.event");
	/* Backoff 50 ms; the receiver asks for 30 s, then 0 s (shorter than
	 * the backoff, so the backoff stands). */
	cr_assert_eq(receiver_control(&rcv, "{\"fail_next\": 1, \"status\": 503,"
	                                    " \"retry_after\": 30}"),
	             0);
	cr_assert_eq(run(NULL), 0);
	cr_assert_eq(tdispatch_count(&td,
	                             "published_at IS NULL AND attempts = 1"
	                             " AND next_attempt_at BETWEEN now() + interval '29 seconds'"
	                             "                         AND now() + interval '30 seconds'"),
	             1, "the next attempt is 30 s away, as the receiver asked");
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL"), 1);
	usleep(100 * 1000);
	cr_assert_eq(run(NULL), 0);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NULL AND attempts = 1"), 1,
	             "not attempted again before its Retry-After");
}

Test(dispatch, a_database_error_other_than_unreachable_exits_70)
{
	char db[64], conninfo[512];

	snprintf(db, sizeof(db), "disp_empty_%ld", (long)getpid());
	{
		char q[128];
		snprintf(q, sizeof(q), "CREATE DATABASE %s", db);
		PQclear(tdispatch_sql(&td, q, 0, NULL));
	}
	/* Reachable, but without the schema: the claim fails. */
	snprintf(conninfo, sizeof(conninfo), "host=%s port=%s user=%s dbname=%s", getenv("PGHOST"),
	         getenv("PGPORT"), getenv("PGUSER"), db);
	const char *empty[] = { "--db", conninfo, NULL };
	int rc = run(empty);
	{
		char q[128];
		snprintf(q, sizeof(q), "DROP DATABASE %s", db);
		PQclear(tdispatch_sql(&td, q, 0, NULL));
	}
	cr_assert_eq(rc, 70, "exit %d", rc);
	cr_assert(tstack_file_contains(td.log, "level=error") &&
	              tstack_file_contains(td.log, "exit=70"),
	          "the failure is logged");
}

/*
 * A receiver's bytes end up in last_error: a Location it sent with a 302,
 * cut to 200 bytes. The cut must not split a character and a byte that is
 * not UTF-8 must not reach the text column, or the recording of the whole
 * batch fails, on every run, and nothing in it is ever recorded.
 */
/* A back-off no run of a test outlasts. */
static const char *const BACKOFF_PAST_THE_RUN[] = { "--backoff", "1h", NULL };

static void receiver_bytes_recorded(const char *location, const char *want_location)
{
	char *id, ctl[1024], want[512];
	const char *p[2];
	int rc;
	PGresult *res;

	tdispatch_seed(&td, 3, 1, "test.event");
	id = event_id_of("true");
	snprintf(ctl, sizeof(ctl),
	         "{\"fail_ids\": [\"%s\"], \"status_for_ids\": 302, \"location\": \"%s\"}", id,
	         location);
	cr_assert_eq(receiver_control(&rcv, ctl), 0, "%s", rcv.error);
	/* The failed event must not come due again within the run: with
	 * the common 50 ms back-off, a claim that follows the recording by
	 * 40 ms or more (a busy machine) takes it for a second attempt. */
	rc = run(BACKOFF_PAST_THE_RUN);
	cr_assert_eq(rc, 0, "exit %d", rc);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL AND attempts = 1"), 2,
	             "the batch's other events are recorded");
	p[0] = td.tenant;
	p[1] = id;
	res = tdispatch_sql(&td,
	                    "SELECT last_error FROM outbox WHERE tenant_id = $1 AND event_id = $2"
	                    " AND published_at IS NULL AND attempts = 1",
	                    2, p);
	cr_assert_eq(PQntuples(res), 1, "the failure is recorded");
	snprintf(want, sizeof(want), "HTTP 302 (redirect to %s", want_location);
	cr_assert_str_eq(PQgetvalue(res, 0, 0), want);
	PQclear(res);
	free(id);
}

Test(dispatch, an_error_text_cut_inside_a_character_is_cut_before_it)
{
	char loc[512], want[512];
	int n = snprintf(loc, sizeof(loc), "http://127.0.0.1/");

	for (int i = 0; i < 100; i++)
		n += snprintf(loc + n, sizeof(loc) - (size_t)n, "\xc3\xa9"); /* U+00E9 */
	/* "HTTP 302 (redirect to " and the 17 bytes of the URL's start leave
	 * 161 of the 200 bytes: 80 whole characters, the 81st cut. */
	n = snprintf(want, sizeof(want), "http://127.0.0.1/");
	for (int i = 0; i < 80; i++)
		n += snprintf(want + n, sizeof(want) - (size_t)n, "\xc3\xa9");
	receiver_bytes_recorded(loc, want);
}

Test(dispatch, a_byte_that_is_not_utf8_in_an_error_text_is_replaced)
{
	/* \udcff: receiver.py sends the raw byte 0xff. */
	receiver_bytes_recorded("http://127.0.0.1/\\udcffx", "http://127.0.0.1/\xef\xbf\xbd"
	                                                     "x not followed)");
}

/* One test at a time: each drains the shared outbox. */
TSTACK_SEQUENTIAL
