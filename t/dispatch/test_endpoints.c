/*
 * test_endpoints.c - idemflow-dispatch delivering to tenant endpoints
 * (sql/020_endpoints.sql, app/dispatch/fanout.c) against a real
 * PostgreSQL and real HTTP receivers (t/lib/receiver.py), one per
 * endpoint, plus the operator's (the configured sink).
 *
 * Endpoints are rows the test inserts; events are outbox rows it seeds
 * (tdispatch_seed), whose deliveries the trigger of 020 writes. Every test
 * runs the real program and checks what each receiver got, the deliveries'
 * states and the attempt ledger, row by row. The dispatcher drains every
 * tenant's deliveries, so the tests run one at a time.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dispatch/whsig.h"
#include "receiver.h"
#include "tdispatch.h"
#include "tstack.h"

#define SECRET_A  "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
#define SECRET_B  "whsec_c2VjcmV0LW9mLWFub3RoZXItZW5kcG9pbnQ="
#define SECRET_C  "whsec_dGhlLXRoaXJkLWVuZHBvaW50cy1zZWNyZXQta2V5"
#define SECRET_OP "whsec_b3BlcmF0b3Itc2VjcmV0LW9mLXRoZS1zaW5rLTEy"

/* The endpoints' ids, new for every test: an endpoint's id names its
 * stream in the outbox, whose event ids are unique across tenants. */
static char EP_A[40], EP_B[40], EP_C[40];

static struct tdispatch td;
static struct receiver op, ra, rb, rc;

static void start(struct receiver *r, const char *secret)
{
	const char *args[] = { "--secret", secret, NULL };

	cr_assert_eq(receiver_start(r, args), 0, "receiver: %s", r->error);
}

static void setup(void)
{
	tdispatch_open(&td, "test_endpoints", "endp");
	/* What earlier tests left to deliver is not this test's. */
	PQclear(tdispatch_sql(
	    &td, "UPDATE deliveries SET state = 'delivered' WHERE state = 'pending'", 0, NULL));
	{
		PGresult *res = tdispatch_sql(
		    &td, "SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid()", 0, NULL);
		snprintf(EP_A, sizeof(EP_A), "%s", PQgetvalue(res, 0, 0));
		snprintf(EP_B, sizeof(EP_B), "%s", PQgetvalue(res, 0, 1));
		snprintf(EP_C, sizeof(EP_C), "%s", PQgetvalue(res, 0, 2));
		PQclear(res);
	}
	start(&op, SECRET_OP);
	start(&ra, SECRET_A);
	start(&rb, SECRET_B);
	start(&rc, SECRET_C);
}

static void teardown(void)
{
	receiver_stop(&op);
	receiver_stop(&ra);
	receiver_stop(&rb);
	receiver_stop(&rc);
	tdispatch_close(&td);
}

TSTACK_SEQUENTIAL

TestSuite(endpoints, .init = setup, .fini = teardown, .timeout = 180);

/* An endpoint of the test's tenant: filter is a SQL array literal or NULL. */
static void endpoint(const char *id, const struct receiver *r, const char *secret,
                     const char *filter, const char *ordering)
{
	const char *p[6] = { td.tenant, id, r->url, secret, filter, ordering };

	PQclear(tdispatch_sql(&td,
	                      "INSERT INTO endpoints (tenant_id, id, url, secret, filter_types,"
	                      " ordering) VALUES ($1, $2, $3, $4, $5::text[], $6)",
	                      6, p));
}

/* One run of the dispatcher: the operator's receiver behind the
 * configured sink, short back-off, the flags in extra. */
static void run(const char *const *extra)
{
	const char *common[] = { "--sink",    "http", "--url",     op.url, "--secret", SECRET_OP,
		                 "--backoff", "50ms", "--timeout", "3s",   NULL };

	cr_assert_eq(tdispatch_run(&td, common, extra), 0, "dispatcher failed: see %s", td.log);
}

/* sql's first column of its first row; $1 is the tenant, $2 A, $3 B. */
static long scalar(const char *sql)
{
	const char *p[3] = { td.tenant, EP_A, EP_B };
	char q[2048];

	/* Only the parameters the statement names: an unused one has no type. */
	snprintf(q, sizeof(q),
	         "SELECT * FROM (%s) AS q WHERE $2::uuid IS NOT NULL"
	         " AND $3::uuid IS NOT NULL",
	         sql);
	return tdispatch_scalar(&td, q, 3, p);
}

/* Run until no delivery of the tenant is pending and due soon (or tries
 * runs), sleeping past the back-off between runs. */
static void run_until_settled(const char *const *extra, int tries)
{
	for (int i = 0; i < tries; i++) {
		run(extra);
		if (scalar(
		        "SELECT count(*) FROM deliveries d JOIN endpoints e"
		        " ON e.tenant_id = d.tenant_id AND e.id = d.endpoint_id"
		        " WHERE d.tenant_id = $1 AND d.state = 'pending' AND NOT e.disabled"
		        "   AND (e.ordering = 'none' OR NOT EXISTS (SELECT 1 FROM deliveries p"
		        "        WHERE p.tenant_id = d.tenant_id AND p.endpoint_id = d.endpoint_id"
		        "          AND p.workflow_id = d.workflow_id AND p.seq < d.seq"
		        "          AND p.state IN ('pending', 'dead')))") == 0)
			return;
		usleep(150 * 1000);
	}
	cr_assert_fail("deliveries still due after %d runs", tries);
}

/* The seq in a delivery's body ({"id": ..., "seq": N}). */
static int body_seq(const struct receiver_delivery *d)
{
	const char *s = strstr(d->body, "\"seq\"");

	cr_assert_not_null(s, "no seq in %s", d->body);
	return atoi(strchr(s, ':') + 1);
}

/* The workflow of a delivery: its event id up to the dot. */
static void workflow_of(const struct receiver_delivery *d, char *out, size_t n)
{
	const char *dot = strchr(d->event_id, '.');

	cr_assert_not_null(dot);
	snprintf(out, n, "%.*s", (int)(dot - d->event_id), d->event_id);
}

/*
 * Every delivery r answered 2xx, per workflow, came in seq order 1..nev,
 * each once, and nothing of a workflow arrived before its predecessor
 * was answered 2xx. Returns the number answered 2xx.
 */
static size_t check_in_order(struct receiver *r, int nev)
{
	struct receiver_delivery *d;
	size_t n, ok = 0;

	cr_assert_eq(receiver_deliveries(r, &d, &n), 0, "%s", r->error);
	for (size_t i = 0; i < n; i++) {
		char wf[64], wj[64];
		int seq = body_seq(&d[i]), done = 0;

		cr_assert_eq(d[i].signature_valid, 1, "delivery %zu: bad signature", i);
		workflow_of(&d[i], wf, sizeof(wf));
		/* Its predecessors were answered 2xx before it arrived; it was
		 * never answered 2xx before. */
		for (size_t j = 0; j < i; j++) {
			workflow_of(&d[j], wj, sizeof(wj));
			if (strcmp(wf, wj) != 0 || d[j].status < 200 || d[j].status >= 300)
				continue;
			cr_assert_neq(body_seq(&d[j]), seq, "%s.%d delivered twice", wf, seq);
			if (body_seq(&d[j]) == seq - 1)
				done = 1;
		}
		cr_assert(seq == 1 || done, "%s.%d arrived before %s.%d was delivered", wf, seq, wf,
		          seq - 1);
		if (d[i].status >= 200 && d[i].status < 300)
			ok++;
		cr_assert_leq(seq, nev);
	}
	receiver_deliveries_free(d, n);
	return ok;
}

static size_t count_deliveries(struct receiver *r)
{
	struct receiver_delivery *d;
	size_t n;

	cr_assert_eq(receiver_deliveries(r, &d, &n), 0, "%s", r->error);
	receiver_deliveries_free(d, n);
	return n;
}

Test(endpoints, one_endpoint_failing_forever_holds_back_nobody_else)
{
	const char *extra[] = { "--max-attempts", "3", "--endpoint-disable-failures", "1000",
		                NULL };

	/* A answers 500 to everything; B takes all; C filters other types. */
	cr_assert_eq(receiver_control(&ra, "{\"fail_rate\": 1.0, \"status\": 500}"), 0, "%s",
	             ra.error);
	endpoint(EP_A, &ra, SECRET_A, NULL, "workflow");
	endpoint(EP_B, &rb, SECRET_B, "{workflow.*}", "workflow");
	endpoint(EP_C, &rc, SECRET_C, "{invoice.paid,job.*}", "workflow");
	tdispatch_seed(&td, 3, 4, "workflow.created");
	cr_assert_eq(scalar("SELECT count(*) FROM deliveries WHERE tenant_id = $1"), 24,
	             "12 events, 2 matching endpoints each");

	run_until_settled(extra, 20);

	/* B: every event, each workflow in order, each once. */
	cr_assert_eq(check_in_order(&rb, 4), 12);
	cr_assert_eq(count_deliveries(&rb), 12, "no retries at B");
	/* C: nothing. */
	cr_assert_eq(count_deliveries(&rc), 0, "a non-matching endpoint gets nothing");
	/* A: three attempts at the first event of each workflow, nothing
	 * else: the dead one holds its own workflow back, at A only. */
	cr_assert_eq(count_deliveries(&ra), 9);
	cr_assert_eq(scalar("SELECT count(*) FROM deliveries WHERE tenant_id = $1"
	                    " AND endpoint_id = $2::uuid AND state = 'dead' AND seq = 1"
	                    " AND attempts = 3 AND last_error LIKE 'HTTP 500%'"),
	             3);
	cr_assert_eq(scalar("SELECT count(*) FROM deliveries WHERE tenant_id = $1"
	                    " AND endpoint_id = $2::uuid AND state = 'pending' AND seq > 1"
	                    " AND attempts = 0 AND lease_owner IS NULL"),
	             9);
	cr_assert_eq(scalar("SELECT count(*) FROM deliveries WHERE tenant_id = $1"
	                    " AND endpoint_id = $3::uuid AND state = 'delivered'"
	                    " AND attempts = 1 AND last_error IS NULL AND trigger = 'scheduled'"),
	             12);

	/* The ledger: one row per attempt, exactly. */
	cr_assert_eq(scalar("SELECT count(*) FROM delivery_attempts WHERE tenant_id = $1"), 21);
	cr_assert_eq(scalar("SELECT count(*) FROM delivery_attempts a WHERE tenant_id = $1"
	                    " AND endpoint_id = $3::uuid AND status = 200"
	                    " AND outcome = 'succeeded' AND trigger = 'scheduled'"
	                    " AND response ~ '^\\{\"seq\": [0-9]+\\}\\n$'"
	                    " AND event_id = workflow_id || '.' || seq AND duration_ms > 0"
	                    " AND started_at BETWEEN now() - interval '2 minutes' AND now()"),
	             12);
	cr_assert_eq(scalar("SELECT count(*) FROM delivery_attempts WHERE tenant_id = $1"
	                    " AND endpoint_id = $2::uuid AND status = 500 AND outcome = 'http'"
	                    " AND seq = 1 AND trigger = 'scheduled'"
	                    " AND response ~ '^\\{\"seq\": [0-9]+\\}\\n$'"),
	             9);

	/* The operator's sink drained the outbox as ever: the 12 events and
	 * A's 3 delivery.exhausted, in A's own stream. */
	cr_assert_eq(scalar("SELECT count(*) FROM outbox WHERE tenant_id = $1"
	                    " AND type = 'delivery.exhausted' AND workflow_id = $2::uuid"
	                    " AND event_id = workflow_id || '.' || seq AND seq BETWEEN 1 AND 3"
	                    " AND (payload::jsonb #>> '{data,attempts}')::int = 3"
	                    " AND payload::jsonb #>> '{data,endpoint_id}' = $2::text"),
	             3);
	cr_assert_eq(scalar("SELECT event_seq FROM endpoints WHERE tenant_id = $1"
	                    " AND id = $2::uuid"),
	             3);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NULL"), 0);
	cr_assert_eq(count_deliveries(&op), 15);
	cr_assert_eq(scalar("SELECT count(*) FROM endpoints WHERE tenant_id = $1 AND disabled"), 0);
}

Test(endpoints, each_endpoint_gets_each_workflow_in_order_through_failures)
{
	const char *extra[] = { "--parallel", "4", NULL };

	/* Both endpoints fail their first deliveries: the heads of both
	 * workflows, retried, and only then the rest. */
	cr_assert_eq(receiver_control(&ra, "{\"fail_next\": 3, \"status\": 503}"), 0, "%s",
	             ra.error);
	cr_assert_eq(receiver_control(&rb, "{\"fail_rate\": 0.3, \"status\": 503}"), 0, "%s",
	             rb.error);
	endpoint(EP_A, &ra, SECRET_A, "{workflow.*}", "workflow");
	endpoint(EP_B, &rb, SECRET_B, NULL, "workflow");
	tdispatch_seed(&td, 2, 6, "workflow.step");

	run_until_settled(extra, 60);

	cr_assert_eq(check_in_order(&ra, 6), 12);
	cr_assert_eq(check_in_order(&rb, 6), 12);
	cr_assert_eq(count_deliveries(&ra), 15, "12 and the 3 failures");
	cr_assert_eq(scalar("SELECT count(*) FROM deliveries WHERE tenant_id = $1"
	                    " AND state = 'delivered'"),
	             24);
	/* Each attempt in the ledger, in the order the receiver saw them. */
	cr_assert_eq(scalar("SELECT count(*) FROM delivery_attempts WHERE tenant_id = $1"
	                    " AND endpoint_id = $2::uuid"),
	             15);
	cr_assert_eq(scalar("SELECT count(*) FROM delivery_attempts WHERE tenant_id = $1"
	                    " AND endpoint_id = $2::uuid AND status = 503 AND outcome = 'http'"),
	             3);
	cr_assert_eq((size_t)scalar("SELECT count(*) FROM delivery_attempts WHERE tenant_id = $1"
	                            " AND endpoint_id = $3::uuid"),
	             count_deliveries(&rb));
}

Test(endpoints, the_ledger_records_each_attempt_and_its_trigger)
{
	const char *p[1] = { td.tenant };
	PGresult *res;

	cr_assert_eq(receiver_control(&ra, "{\"fail_next\": 1, \"status\": 503}"), 0, "%s",
	             ra.error);
	endpoint(EP_A, &ra, SECRET_A, NULL, "none");
	tdispatch_seed(&td, 1, 1, "workflow.created");
	run_until_settled(NULL, 20);
	/* A resend, as the server's route makes it: pending, due, manual. */
	PQclear(tdispatch_sql(&td,
	                      "UPDATE deliveries SET state = 'pending', trigger = 'manual',"
	                      " attempts = 0, next_attempt_at = now() WHERE tenant_id = $1",
	                      1, p));
	run_until_settled(NULL, 20);

	res = tdispatch_sql(
	    &td,
	    "SELECT trigger, status, outcome, response, event_id = workflow_id || '.1'"
	    "  FROM delivery_attempts WHERE tenant_id = $1 ORDER BY id",
	    1, p);
	cr_assert_eq(PQntuples(res), 3);
	const char *want[3][4] = { { "scheduled", "503", "http", "{\"seq\": 1}\n" },
		                   { "scheduled", "200", "succeeded", "{\"seq\": 2}\n" },
		                   { "manual", "200", "succeeded", "{\"seq\": 3}\n" } };
	for (int i = 0; i < 3; i++) {
		for (int k = 0; k < 4; k++)
			cr_assert_str_eq(PQgetvalue(res, i, k), want[i][k], "attempt %d column %d",
			                 i, k);
		cr_assert_str_eq(PQgetvalue(res, i, 4), "t");
	}
	PQclear(res);
	cr_assert_eq(scalar("SELECT count(*) FROM deliveries WHERE tenant_id = $1"
	                    " AND state = 'delivered' AND trigger = 'scheduled' AND attempts = 1"),
	             1, "the trigger goes back to scheduled");
	cr_assert_eq(count_deliveries(&ra), 3);
}

Test(endpoints, an_unreachable_endpoint_is_a_connect_failure_with_no_status)
{
	const char *p[1] = { td.tenant };
	const char *extra[] = { "--max-attempts", "1", NULL };
	PGresult *res;

	endpoint(EP_A, &ra, SECRET_A, NULL, "workflow");
	receiver_stop(&ra); /* nothing listens there any more */
	tdispatch_seed(&td, 1, 1, "workflow.created");
	run(extra);
	res = tdispatch_sql(&td,
	                    "SELECT status, outcome, response, d.state, d.last_error <> ''"
	                    "  FROM delivery_attempts a JOIN deliveries d USING (tenant_id,"
	                    "       endpoint_id, workflow_id, seq)"
	                    " WHERE tenant_id = $1",
	                    1, p);
	cr_assert_eq(PQntuples(res), 1);
	cr_assert_str_eq(PQgetvalue(res, 0, 0), "0");
	cr_assert_str_eq(PQgetvalue(res, 0, 1), "connect");
	cr_assert_str_eq(PQgetvalue(res, 0, 2), "");
	cr_assert_str_eq(PQgetvalue(res, 0, 3), "dead");
	cr_assert_str_eq(PQgetvalue(res, 0, 4), "t");
	PQclear(res);
}

/* The tenant's rows of a table that match cond. */
static long rows(const char *table, const char *cond)
{
	char q[512];

	snprintf(q, sizeof(q), "SELECT count(*) FROM %s WHERE tenant_id = $1 AND %s", table, cond);
	return scalar(q);
}

static void prune(const char *workflow_retention)
{
	char out[1024];
	int st =
	    tstack_cli(out, sizeof(out), "prune", "--outbox-retention", "1d", "--history-retention",
	               "1d", "--workflow-retention", workflow_retention, NULL);

	cr_assert_eq(st, 0, "idemflow prune exited %d: %s", st, tstack_cli_stderr());
}

Test(endpoints, prune_takes_deliveries_and_attempts_with_their_events_and_keeps_the_undelivered)
{
	const char *p[1] = { td.tenant };
	const char *extra[] = { "--max-attempts", "1", NULL };

	/* A takes everything; B fails and takes only workflow.a: its first
	 * delivery dies and holds the second, pending. */
	cr_assert_eq(receiver_control(&rb, "{\"fail_rate\": 1.0, \"status\": 500}"), 0, "%s",
	             rb.error);
	endpoint(EP_A, &ra, SECRET_A, NULL, "workflow");
	endpoint(EP_B, &rb, SECRET_B, "{workflow.a}", "workflow");
	tdispatch_seed(&td, 1, 2, "workflow.a");
	tdispatch_seed(&td, 1, 2, "workflow.b");
	run_until_settled(extra, 20);
	cr_assert_eq(rows("deliveries", "state = 'delivered'"), 4);
	cr_assert_eq(rows("deliveries", "state = 'dead'"), 1);
	cr_assert_eq(rows("deliveries", "state = 'pending'"), 1);
	cr_assert_eq(rows("delivery_attempts", "true"), 5);
	cr_assert_eq(rows("outbox", "type = 'delivery.exhausted' AND published_at IS NOT NULL"), 1);

	/* Everything ended and was published long ago. */
	PQclear(tdispatch_sql(&td,
	                      "UPDATE workflows SET state = 'completed',"
	                      " ended_at = now() - interval '10 days' WHERE tenant_id = $1",
	                      1, p));
	PQclear(tdispatch_sql(&td,
	                      "UPDATE outbox SET published_at = now() - interval '10 days'"
	                      " WHERE tenant_id = $1",
	                      1, p));

	/* Events: workflow.b's go with their deliveries and attempts; the
	 * operational event goes; workflow.a's stay, one dead and one
	 * pending delivery holding them, with every row of theirs. */
	prune("365d");
	cr_assert_eq(rows("outbox", "true"), 2);
	cr_assert_eq(rows("outbox", "type = 'workflow.a'"), 2);
	cr_assert_eq(rows("deliveries", "true"), 4);
	cr_assert_eq(rows("deliveries", "endpoint_id = $2::uuid AND state = 'delivered'"), 2);
	cr_assert_eq(rows("delivery_attempts", "true"), 3);
	cr_assert_eq(rows("delivery_attempts", "endpoint_id = $3::uuid AND status = 500"), 1);

	/* Workflows: workflow.b's goes; workflow.a's is held by the same
	 * deliveries. */
	prune("2d");
	cr_assert_eq(rows("workflows", "true"), 1);
	cr_assert_eq(rows("outbox", "true"), 2);
	cr_assert_eq(rows("deliveries", "true"), 4);
	cr_assert_eq(rows("delivery_attempts", "true"), 3);

	/* Once B's are settled (skipped, and delivered by a recover), the
	 * workflow goes with its events, deliveries and attempts. */
	PQclear(tdispatch_sql(&td,
	                      "UPDATE deliveries SET state = CASE WHEN seq = 1 THEN 'delivered'"
	                      " ELSE 'skipped' END WHERE tenant_id = $1 AND state <> 'delivered'",
	                      1, p));
	prune("2d");
	cr_assert_eq(rows("workflows", "true"), 0);
	cr_assert_eq(rows("outbox", "true"), 0);
	cr_assert_eq(rows("deliveries", "true"), 0);
	cr_assert_eq(rows("delivery_attempts", "true"), 0);
}

/* idemflow_endpoint_attempted(tenant, endpoint, ok, t0 + offset, 3, 1 hour)
 * with a clock of the test's own: "t" when the call disabled the endpoint. */
static const char *attempted(const char *ep, int ok, const char *offset)
{
	static char out[8];
	const char *p[4] = { td.tenant, ep, ok ? "true" : "false", offset };
	PGresult *res =
	    tdispatch_sql(&td,
	                  "SELECT idemflow_endpoint_attempted($1, $2::uuid, $3::boolean,"
	                  " '2026-01-01T00:00:00Z'::timestamptz + $4::interval, 3,"
	                  " interval '1 hour')",
	                  4, p);

	snprintf(out, sizeof(out), "%s", PQgetvalue(res, 0, 0));
	PQclear(res);
	return out;
}

Test(endpoints, an_endpoint_is_disabled_exactly_when_it_has_failed_both_long_and_often)
{
	const char *p[2] = { td.tenant, EP_A };
	PGresult *res;

	endpoint(EP_A, &ra, SECRET_A, NULL, "workflow");
	endpoint(EP_B, &rb, SECRET_B, NULL, "workflow");
	endpoint(EP_C, &rc, SECRET_C, NULL, "workflow");

	/* A: often enough from the third failure on, long enough only at
	 * the hour: one failure before it stays enabled, the one at it
	 * disables. */
	cr_assert_str_eq(attempted(EP_A, 0, "0"), "f");
	cr_assert_str_eq(attempted(EP_A, 0, "10 minutes"), "f");
	cr_assert_str_eq(attempted(EP_A, 0, "20 minutes"), "f");
	cr_assert_str_eq(attempted(EP_A, 0, "59 minutes 59.999999 seconds"), "f");
	cr_assert_eq(scalar("SELECT count(*) FROM endpoints WHERE tenant_id = $1 AND disabled"), 0);
	cr_assert_str_eq(attempted(EP_A, 0, "1 hour"), "t");
	cr_assert_str_eq(attempted(EP_A, 0, "2 hours"), "f", "disabled once");
	res =
	    tdispatch_sql(&td,
	                  "SELECT disabled, disabled_reason, disabled_at = '2026-01-01T01:00:00Z',"
	                  "       failures, failing_since = '2026-01-01T00:00:00Z', event_seq,"
	                  "       actor"
	                  "  FROM endpoints WHERE tenant_id = $1 AND id = $2",
	                  2, p);
	const char *want[] = { "t", "failing", "t", "6", "t", "1", "system:dispatch" };
	for (int k = 0; k < 7; k++)
		cr_assert_str_eq(PQgetvalue(res, 0, k), want[k], "column %d", k);
	PQclear(res);
	/* endpoint.disabled, once, in A's stream, for the operator. */
	res = tdispatch_sql(&td,
	                    "SELECT event_id = workflow_id || '.1', seq, payload::jsonb -> 'data',"
	                    "       (SELECT count(*) FROM deliveries d WHERE d.outbox_id = o.id)"
	                    "  FROM outbox o"
	                    " WHERE tenant_id = $1 AND workflow_id = $2 ORDER BY seq",
	                    2, p);
	cr_assert_eq(PQntuples(res), 1);
	cr_assert_str_eq(PQgetvalue(res, 0, 0), "t");
	cr_assert_str_eq(PQgetvalue(res, 0, 1), "1");
	char data[512];
	snprintf(data, sizeof(data),
	         "{\"reason\": \"failing\", \"failures\": 5, \"endpoint_id\": \"%s\", "
	         "\"failing_since\": \"2026-01-01T00:00:00.000000Z\"}",
	         EP_A);
	cr_assert_str_eq(PQgetvalue(res, 0, 2), data);
	cr_assert_str_eq(PQgetvalue(res, 0, 3), "0", "no delivery of an operational event");
	PQclear(res);

	/* B: long enough at once, often enough only at the third. */
	cr_assert_str_eq(attempted(EP_B, 0, "0"), "f");
	cr_assert_str_eq(attempted(EP_B, 0, "5 hours"), "f");
	cr_assert_str_eq(attempted(EP_B, 0, "5 hours 1 second"), "t");

	/* C: a success in between starts the count and the clock again. */
	cr_assert_str_eq(attempted(EP_C, 0, "0"), "f");
	cr_assert_str_eq(attempted(EP_C, 0, "1 minute"), "f");
	cr_assert_str_eq(attempted(EP_C, 1, "2 minutes"), "f");
	cr_assert_eq(scalar("SELECT count(*) FROM endpoints WHERE tenant_id = $1"
	                    " AND failures = 0 AND failing_since IS NULL AND NOT disabled"),
	             1, "C is reset");
	cr_assert_str_eq(attempted(EP_C, 0, "1 hour 1 minute"), "f");
	cr_assert_str_eq(attempted(EP_C, 0, "1 hour 2 minutes"), "f");
	cr_assert_str_eq(attempted(EP_C, 0, "2 hours"), "f", "failing for 59 minutes only");
	cr_assert_str_eq(attempted(EP_C, 0, "2 hours 1 minute"), "t");
}

Test(endpoints, a_failing_endpoint_is_disabled_and_its_new_deliveries_skipped)
{
	char textfile[600];
	const char *extra[] = { "--max-attempts",
		                "1000",
		                "--loop",
		                "--max-runtime",
		                "4s",
		                "--poll-interval",
		                "50ms",
		                "--endpoint-disable-failures",
		                "3",
		                "--endpoint-disable-after",
		                "1s",
		                "--textfile",
		                textfile,
		                NULL };

	snprintf(textfile, sizeof(textfile), "%s/endpoints-%d.prom",
	         tstack_env("IDEMFLOW_STACK_DIR"), (int)getpid());
	cr_assert_eq(receiver_control(&ra, "{\"fail_rate\": 1.0, \"status\": 503}"), 0, "%s",
	             ra.error);
	endpoint(EP_A, &ra, SECRET_A, NULL, "none");
	endpoint(EP_B, &rb, SECRET_B, NULL, "none");
	tdispatch_seed(&td, 1, 1, "workflow.created");
	/* One run, the textfile its own: A is disabled within it. */
	run(extra);
	cr_assert_eq(rows("endpoints", "id = $2::uuid AND disabled AND disabled_reason = 'failing'"
	                               " AND failures >= 3"
	                               " AND disabled_at - failing_since >= interval '1 second'"),
	             1);
	cr_assert_eq(rows("endpoints", "id = $3::uuid AND NOT disabled AND failures = 0"), 1);
	cr_assert_eq(rows("deliveries", "endpoint_id = $2::uuid AND state = 'pending'"), 1,
	             "the failing delivery waits for the endpoint");
	cr_assert_eq(rows("outbox", "workflow_id = $2::uuid AND type = 'endpoint.disabled'"
	                            " AND published_at IS NOT NULL"),
	             1, "delivered to the operator's sink");
	cr_assert_eq(
	    tdispatch_textfile_value(textfile, "idemflow_dispatch_endpoints_disabled_total"), 1);
	cr_assert_eq(
	    tdispatch_textfile_value(
	        textfile, "idemflow_dispatch_endpoint_deliveries_total{result=\"delivered\"}"),
	    1);
	cr_assert_eq(
	    tdispatch_textfile_value(
	        textfile, "idemflow_dispatch_endpoint_attempts_total{outcome=\"succeeded\"}"),
	    1);
	cr_assert_eq(tdispatch_textfile_value(
	                 textfile, "idemflow_dispatch_endpoint_attempts_total{outcome=\"http\"}"),
	             rows("delivery_attempts", "endpoint_id = $2::uuid AND status = 503"));
	cr_assert_eq(
	    tdispatch_textfile_value(
	        textfile, "idemflow_dispatch_endpoint_attempts_total{outcome=\"timeout\"}"),
	    0);

	/* A new event: skipped at the disabled endpoint, delivered at B. */
	size_t before = count_deliveries(&ra);
	tdispatch_seed(&td, 1, 1, "workflow.created");
	run_until_settled(NULL, 10);
	cr_assert_eq(rows("deliveries", "endpoint_id = $2::uuid AND state = 'skipped'"), 1);
	cr_assert_eq(rows("deliveries", "endpoint_id = $3::uuid AND state = 'delivered'"), 2);
	cr_assert_eq(count_deliveries(&ra), before, "nothing more sent to A");
}

Test(endpoints, a_recovered_delivery_says_so_when_it_gets_through)
{
	const char *p[1] = { td.tenant };
	const char *extra[] = { "--max-attempts", "1", NULL };
	PGresult *res;

	cr_assert_eq(receiver_control(&ra, "{\"fail_next\": 1, \"status\": 503}"), 0, "%s",
	             ra.error);
	endpoint(EP_A, &ra, SECRET_A, NULL, "workflow");
	tdispatch_seed(&td, 1, 1, "workflow.created");
	run_until_settled(extra, 10);
	cr_assert_eq(rows("deliveries", "state = 'dead' AND exhausted_at IS NOT NULL"), 1);
	/* A recover, as the server's route makes it. */
	PQclear(tdispatch_sql(&td,
	                      "UPDATE deliveries SET state = 'pending', trigger = 'recover',"
	                      " attempts = 0, next_attempt_at = now() WHERE tenant_id = $1",
	                      1, p));
	run_until_settled(extra, 10);
	cr_assert_eq(rows("deliveries", "state = 'delivered' AND exhausted_at IS NULL"
	                                " AND trigger = 'scheduled'"),
	             1);
	res = tdispatch_sql(&td,
	                    "SELECT type, o.seq, payload::jsonb #>> '{data,trigger}',"
	                    "       payload::jsonb #>> '{data,event_id}' = d.workflow_id || '.1'"
	                    "  FROM outbox o, deliveries d"
	                    " WHERE o.tenant_id = $1 AND d.tenant_id = $1"
	                    "   AND o.workflow_id = d.endpoint_id ORDER BY o.seq",
	                    1, p);
	cr_assert_eq(PQntuples(res), 2);
	cr_assert_str_eq(PQgetvalue(res, 0, 0), "delivery.exhausted");
	cr_assert_str_eq(PQgetvalue(res, 1, 0), "delivery.recovered");
	cr_assert_str_eq(PQgetvalue(res, 1, 1), "2");
	cr_assert_str_eq(PQgetvalue(res, 1, 2), "recover");
	cr_assert_str_eq(PQgetvalue(res, 1, 3), "t");
	PQclear(res);
	cr_assert_eq(rows("delivery_attempts", "trigger = 'recover' AND status = 200"), 1);

	/* The audit reads workflows and their events: the endpoint's stream,
	 * with no workflow row, is neither a workflow nor an event of one. */
	{
		char out[8192], name[128];
		PGresult *t = tdispatch_sql(&td, "SELECT name FROM tenants WHERE id = $1", 1, p);
		int st;

		snprintf(name, sizeof(name), "%s", PQgetvalue(t, 0, 0));
		PQclear(t);
		st = tstack_cli(out, sizeof(out), "audit", "--tenant", name, NULL);
		cr_assert_eq(st, 0, "audit: %s %s", out, tstack_cli_stderr());
		cr_assert(strstr(out, "checked: keys=0 answers=0 workflows=1\n") != NULL, "%s",
		          out);
		cr_assert(strstr(out, "audit: 4 of 4 invariants hold") != NULL, "%s", out);
		st = tstack_cli(out, sizeof(out), "audit", "--rebuild", "--tenant", name, NULL);
		cr_assert_eq(st, 0, "audit --rebuild: %s %s", out, tstack_cli_stderr());
		cr_assert(strstr(out, "workflows=1 checked=1 skipped=0 events=1 differences=0") !=
		              NULL,
		          "%s", out);
	}
}

/* t/dispatch/whverify/verify.cjs over r's deliveries with secret: its
 * output, one line per delivery ("ok" or "fail: ..."). */
static void verify(const struct receiver *r, const char *secret, char *out, size_t n)
{
	char cmd[2048];
	size_t len = 0;
	FILE *f;

	const char *top = getenv("top_srcdir"); /* set by make check; else run from the top */

	snprintf(cmd, sizeof(cmd), "node '%s/t/dispatch/whverify/verify.cjs' '%s' '%s'",
	         top != NULL ? top : ".", secret, r->log_path);
	f = popen(cmd, "r");
	cr_assert_not_null(f);
	while (len + 1 < n && fgets(out + len, (int)(n - len), f) != NULL)
		len += strlen(out + len);
	out[len] = '\0';
	pclose(f);
}

Test(endpoints, the_official_library_verifies_either_secret_during_the_grace_period_only)
{
	const char *p[2] = { td.tenant, SECRET_C };
	struct receiver_delivery *d;
	char out[1024];
	size_t n;

	/* A's secret was rotated from SECRET_C to SECRET_A an hour's grace
	 * ago: both sign. */
	endpoint(EP_A, &ra, SECRET_A, NULL, "workflow");
	PQclear(tdispatch_sql(&td,
	                      "UPDATE endpoints SET previous_secret = $2,"
	                      " previous_secret_until = now() + interval '1 hour'"
	                      " WHERE tenant_id = $1",
	                      2, p));
	tdispatch_seed(&td, 1, 1, "workflow.created");
	run_until_settled(NULL, 10);
	/* The grace period is over (the previous secret stays in the row
	 * until a revoke or the next rotation): only the new one signs. */
	PQclear(
	    tdispatch_sql(&td,
	                  "UPDATE endpoints SET previous_secret_until = now() - interval '1 second'"
	                  " WHERE tenant_id = $1",
	                  1, p));
	tdispatch_seed(&td, 1, 1, "workflow.created");
	run_until_settled(NULL, 10);

	cr_assert_eq(receiver_deliveries(&ra, &d, &n), 0, "%s", ra.error);
	cr_assert_eq(n, 2);
	cr_assert_not_null(strchr(d[0].signature, ' '), "two signatures: %s", d[0].signature);
	cr_assert_eq(strncmp(d[0].signature, "v1,", 3), 0);
	cr_assert_not_null(strstr(d[0].signature, " v1,"));
	cr_assert_null(strchr(d[1].signature, ' '), "one signature: %s", d[1].signature);
	receiver_deliveries_free(d, n);

	verify(&ra, SECRET_A, out, sizeof(out));
	cr_assert_str_eq(out, "ok\nok\n", "the new secret verifies both");
	verify(&ra, SECRET_C, out, sizeof(out));
	cr_assert_eq(strncmp(out, "ok\nfail: ", 9), 0,
	             "the old secret verifies the first only: \"%s\"", out);
	verify(&ra, SECRET_B, out, sizeof(out));
	cr_assert_eq(strncmp(out, "fail: ", 6), 0, "another secret verifies nothing: \"%s\"", out);
}
