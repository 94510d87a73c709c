/*
 * A heartbeat racing `idemflow reap` (idemflow_reap) at the end of a lease,
 * both orders forced, through nginx and the worker pool.
 *
 * The heartbeat starts before the deadline (its now() is the start of its
 * transaction) and the reap after it, so each, alone, is right to act.
 * They must serialize on the job's row: whichever takes it first wins and
 * the other sees what it did. A heartbeat that answers 200 leaves the job
 * active under its new lease, and the worker's completion is accepted; a
 * reaped job refuses the heartbeat (409 lease-expired).
 *
 * The interleaving is made, not hoped for: the test holds the workflow's
 * row so that the heartbeat waits inside its transaction until the
 * deadline has passed, then lets the reap run in a transaction of its own
 * before or after releasing it. idemflow_reap reaps every tenant's expired
 * leases, so the binary's tests run one at a time and no other test's job
 * is in this database.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "http.h"
#include "tapi.h"
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

/*
 * The heartbeat is held inside its transaction for as long as the lease
 * takes to run out (1 s at least): the workers' lock_timeout
 * (idempotency_wait, 1 s in the test stack) goes to 10 s first, by a
 * reload, so that the held request waits instead of answering 503.
 */
static void longer_lock_waits(void)
{
	const char *path = tstack_env("IDEMFLOW_CONF");
	pid_t sup = tstack_supervisor_pid(), old[16];
	size_t nold = tstack_workers(sup, old, 16);
	char text[8192], *at;
	size_t n;
	FILE *f = fopen(path, "r");

	cr_assert_not_null(f);
	n = fread(text, 1, sizeof(text) - 1, f);
	text[n] = '\0';
	fclose(f);
	at = strstr(text, "idempotency_wait = 1s\n");
	if (at == NULL)
		return; /* done by an earlier test of this binary */
	memcpy(at, "idempotency_wait = 9s", 21);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs(text, f);
	fclose(f);
	cr_assert_eq(kill(sup, SIGHUP), 0);
	for (size_t i = 0; i < nold; i++) {
		double until = tstack_now() + 30;

		while (!tstack_pid_gone(old[i])) {
			cr_assert(tstack_now() < until, "worker %ld was not replaced",
			          (long)old[i]);
			tstack_sleep_ms(50);
		}
	}
	cr_assert(tstack_wait_workers(sup, nold, 30000), "the pool did not come back");
}

TestSuite(lease_race, .init = longer_lock_waits, .timeout = 120);

struct beat {
	const struct tstack_tenant *t;
	char path[160];
	struct http_response *resp;
};

static void *beat_run(void *arg)
{
	struct beat *b = arg;

	b->resp = tstack_post_raw(b->t, b->path, NULL, "{\"worker\":\"w\",\"lease_seconds\":60}");
	return NULL;
}

/* The backend of some worker waiting on a lock that holder's session
 * holds; fails the test after 20 s. */
static void wait_blocked_by(PGconn *holder)
{
	cr_assert_gt(tstack_blocked_worker(holder, 20000), 0,
	             "no worker waited on the test's lock");
}

/* Poll until the database's clock is past the job's deadline. */
static void wait_past_deadline(const char *wf)
{
	double until = tstack_now() + 30;

	while (tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1"
	                    " AND due_at < clock_timestamp()",
	                    wf) == 0) {
		cr_assert(tstack_now() < until, "the lease of %s never ran out", wf);
		tstack_sleep_ms(50);
	}
}

/*
 * The job of a new workflow activated by worker "w" for 2 s; the workflow
 * row held by *wf_hold (BEGIN ... FOR UPDATE) and a heartbeat sent, which
 * waits on it inside its transaction, begun before the deadline; then the
 * deadline passed. Returns the workflow id (malloc'ed).
 */
static char *beat_held_past_deadline(const struct tstack_tenant *t, PGconn **wf_hold,
                                     struct beat *b, pthread_t *th)
{
	struct http_response *r;
	char *wf;

	wf = tstack_create(
	    t, "{\"type\":\"race\",\"steps\":[{\"name\":\"a\",\"job_type\":\"race\"}]}");
	r = tstack_post(t, "/v1/jobs/activate", NULL,
	                "{\"job_type\":\"race\",\"worker\":\"w\",\"lease_seconds\":2}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1"
	                          " AND state = 'active' AND due_at > clock_timestamp()",
	                          wf),
	             1);

	*wf_hold = tstack_db_connect();
	tstack_exec(*wf_hold, "BEGIN");
	tstack_exec(*wf_hold, "SELECT 1 FROM workflows WHERE id = $1 FOR UPDATE", wf);
	*b = (struct beat){ .t = t };
	snprintf(b->path, sizeof(b->path), "/v1/jobs/%s.s1/heartbeat", wf);
	cr_assert_eq(pthread_create(th, NULL, beat_run, b), 0);
	wait_blocked_by(*wf_hold);
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1"
	                          " AND due_at > clock_timestamp()",
	                          wf),
	             1, "the heartbeat began after the deadline: the test is too slow");
	wait_past_deadline(wf);
	return wf;
}

static struct http_response *complete(const struct tstack_tenant *t, const char *wf)
{
	char path[160];

	snprintf(path, sizeof(path), "/v1/jobs/%s.s1/complete", wf);
	return tstack_post(t, path, NULL, "{\"worker\":\"w\",\"output\":{}}");
}

/* The reap takes the job's row first: the heartbeat, which had already
 * begun, must wait for it and then find the lease ended. */
Test(lease_race, a_reap_first_makes_the_waiting_heartbeat_find_the_lease_ended)
{
	struct tstack_tenant t;
	struct beat b;
	pthread_t th;
	PGconn *wf_hold, *reap;
	struct http_response *r;
	char *wf, *v;

	tstack_tenant_create(&t, "race-reap");
	wf = beat_held_past_deadline(&t, &wf_hold, &b, &th);

	reap = tstack_db_connect();
	tstack_exec(reap, "BEGIN");
	tstack_exec(reap, "SELECT idemflow_reap(1000)");
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1"
	                          " AND state = 'active'",
	                          wf),
	             1, "the reap is not committed yet");
	tstack_exec(wf_hold, "COMMIT");
	/* The heartbeat now holds the workflow and reaches the job, which the
	 * reap holds. */
	wait_blocked_by(reap);
	tstack_exec(reap, "COMMIT");
	pthread_join(th, NULL);
	cr_assert_not_null(b.resp, "%s", http_error());

	tstack_expect_problem(b.resp, 409, "/problems/lease-expired", b.path);
	v = tstack_text("SELECT state || ' ' || (due_at <= now()) FROM jobs WHERE workflow_id = $1",
	                wf);
	cr_assert_str_eq(v, "activatable true", "the job is reaped, not extended");
	free(v);
	r = complete(&t, wf);
	tstack_expect_status(r, 409);
	http_response_free(r);
	http_response_free(b.resp);
	PQfinish(reap);
	PQfinish(wf_hold);
	free(wf);
}

/* The heartbeat takes the job's row first (and commits) while the reap's
 * transaction, begun after the deadline, has not yet looked: the reap
 * finds the new lease and leaves the job alone. */
Test(lease_race, a_heartbeat_first_keeps_the_job_from_the_reap_that_follows)
{
	struct tstack_tenant t;
	struct beat b;
	pthread_t th;
	PGconn *wf_hold, *reap;
	struct http_response *r;
	char *wf, *v;

	tstack_tenant_create(&t, "race-beat");
	wf = beat_held_past_deadline(&t, &wf_hold, &b, &th);

	reap = tstack_db_connect();
	tstack_exec(reap, "BEGIN");
	tstack_exec(reap, "SELECT now()"); /* its clock: past the old deadline */
	tstack_exec(wf_hold, "COMMIT");
	pthread_join(th, NULL);
	cr_assert_not_null(b.resp, "%s", http_error());
	tstack_expect_status(b.resp, 200);
	v = tstack_json(b.resp->body, "{state}");
	cr_assert_str_eq(v, "active");
	free(v);

	tstack_exec(reap, "SELECT idemflow_reap(1000)");
	tstack_exec(reap, "COMMIT");
	v = tstack_text("SELECT state || ' ' || (due_at > now()) FROM jobs WHERE workflow_id = $1",
	                wf);
	cr_assert_str_eq(v, "active true", "the job keeps its new lease");
	free(v);
	r = complete(&t, wf);
	tstack_expect_status(r, 200);
	http_response_free(r);
	http_response_free(b.resp);
	PQfinish(reap);
	PQfinish(wf_hold);
	free(wf);
}

/* idemflow_reap reaps every tenant's leases: one test at a time. */
TSTACK_SEQUENTIAL
