/*
 * End-to-end tests of timers: sleep steps ("sleep", "until"), timeouts of
 * wait steps ("timeout", "on_timeout") and what fires them, idemflow reap
 * (once, --loop, and two at a time), through nginx and the worker pool
 * against the real database; a message racing its wait's timeout; the
 * checks of durations and times in a definition.
 *
 * idemflow reap fires every tenant's due timers, and its output counts
 * them: the tests run one at a time (TSTACK_SEQUENTIAL), so every count a
 * test reads is its own.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "http.h"
#include "tapi.h"
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

/*
 * Settings of its own (TSTACK_SETTINGS): idempotency_wait, which is also
 * every worker's lock_timeout, is 10 s, not the harness's 1 s, a window
 * too short on a loaded machine: messages and reapers wait on the rows the other holds.
 */
TSTACK_SETTINGS("idempotency_wait = 10s\n")

TSTACK_SEQUENTIAL

TestSuite(sleep, .timeout = 60);
TestSuite(wait_timeout, .timeout = 60);
TestSuite(reapers, .timeout = 120);
TestSuite(bad_timers, .timeout = 60);

/* --- Helpers ----------------------------------------------------------- */

/* The workflow's event types in seq order, from the outbox. */
static char *outbox_types(const char *wf)
{
	return tstack_text("SELECT string_agg(type, ',' ORDER BY seq) FROM outbox"
	                   " WHERE workflow_id = $1",
	                   wf);
}

/* The same from its history, GET /v1/workflows/{id}/events. */
static char *history_types(const struct tstack_tenant *t, const char *wf)
{
	struct http_response *r;
	char path[128], *types;

	snprintf(path, sizeof(path), "/v1/workflows/%s/events", wf);
	r = tstack_get(t, path);
	tstack_expect_status(r, 200);
	types = tstack_text("SELECT string_agg(e ->> 'type', ',' ORDER BY (e ->> 'seq')::int)"
	                    "  FROM jsonb_array_elements($1::jsonb -> 'events') e",
	                    r->body);
	http_response_free(r);
	return types;
}

/* History and outbox both hold exactly want, in order. */
static void expect_events(const struct tstack_tenant *t, const char *wf, const char *want)
{
	char *o = outbox_types(wf), *h = history_types(t, wf);

	cr_assert_str_eq(o, want, "outbox of %s", wf);
	cr_assert_str_eq(h, want, "history of %s", wf);
	free(o);
	free(h);
}

static void expect_state(const char *wf, const char *want)
{
	char *s = tstack_text("SELECT state || '/' || step FROM workflows WHERE id = $1", wf);

	cr_assert_str_eq(s, want, "workflow %s (state/step)", wf);
	free(s);
}

/* Run idemflow reap; its stdout into out. */
static void reap(char *out, size_t outsz)
{
	cr_assert_eq(tstack_cli(out, outsz, "reap", NULL), 0, "reap: %s", tstack_cli_stderr());
}

/* Wait until the timers of wf are due by the database's clock. */
static void wait_due(const char *wf)
{
	double deadline = tstack_now() + 20;

	while (tstack_count("SELECT count(*) FROM timers WHERE workflow_id = $1"
	                    " AND fired_at IS NULL AND due_at > now()",
	                    wf) > 0) {
		cr_assert(tstack_now() < deadline, "timer of %s never due", wf);
		tstack_sleep_ms(20);
	}
}

/* --- Sleep ------------------------------------------------------------- */

Test(sleep, a_sleep_step_fires_once_when_due_and_the_workflow_advances)
{
	struct tstack_tenant t;
	char out[256], *wf, *v;

	tstack_tenant_create(&t, "sleep");
	wf = tstack_create(&t, "{\"type\":\"s\",\"steps\":[{\"name\":\"nap\",\"sleep\":\"PT1S\"},"
	                       "{\"name\":\"after\",\"job_type\":\"after\"}]}");
	/* Not due yet: reap leaves it. */
	reap(out, sizeof(out));
	cr_assert_str_eq(out, "reap: jobs=0");
	expect_state(wf, "pending/1");
	cr_assert_eq(tstack_count("SELECT count(*) FROM timers WHERE workflow_id = $1"
	                          " AND kind = 'sleep' AND due_at BETWEEN created_at + interval "
	                          "'1 s' AND created_at + interval '1 s'",
	                          wf),
	             1);
	expect_events(&t, wf, "workflow.created");

	wait_due(wf);
	reap(out, sizeof(out));
	cr_assert_str_eq(out, "reap: jobs=0\nreap: timers=1 timeouts=0 incidents=0");
	reap(out, sizeof(out));
	cr_assert_str_eq(out, "reap: jobs=0", "a timer fires once");

	expect_state(wf, "running/2");
	expect_events(&t, wf, "workflow.created,workflow.started,timer.fired");
	v = tstack_text("SELECT payload::jsonb -> 'data' ->> 'name' || '/' ||"
	                "       (payload::jsonb -> 'data' ->> 'step')"
	                "  FROM outbox WHERE workflow_id = $1 AND type = 'timer.fired'",
	                wf);
	cr_assert_str_eq(v, "nap/1");
	free(v);
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1 AND step = 2"
	                          " AND state = 'activatable'",
	                          wf),
	             1);
	free(wf);
}

Test(sleep, until_in_the_past_fires_on_the_next_reap_and_a_last_step_completes)
{
	struct tstack_tenant t;
	char out[256], *wf;

	tstack_tenant_create(&t, "until");
	wf = tstack_create(&t, "{\"type\":\"u\",\"steps\":[{\"name\":\"then\","
	                       "\"until\":\"2020-02-29T12:00:00.5+01:00\"}]}");
	cr_assert_eq(tstack_count("SELECT count(*) FROM timers WHERE workflow_id = $1"
	                          " AND due_at = '2020-02-29T11:00:00.5Z'",
	                          wf),
	             1);
	reap(out, sizeof(out));
	cr_assert_str_eq(out, "reap: jobs=0\nreap: timers=1 timeouts=0 incidents=0");
	expect_state(wf, "completed/1");
	expect_events(&t, wf, "workflow.created,workflow.started,timer.fired,workflow.completed");
	free(wf);
}

/*
 * A fired timer is history once its step went on: idemflow prune deletes
 * it after outbox_retention, as it deletes delivered events, so a tenant's
 * sleeps do not pile up rows forever. A timer fired within the retention,
 * and one not yet due, stay.
 */
Test(sleep, prune_deletes_timers_fired_before_the_retention)
{
	struct tstack_tenant t;
	char out[512], *old, *recent, *pending;

	tstack_tenant_create(&t, "tprune");
	old = tstack_create(&t, "{\"type\":\"s\",\"steps\":[{\"name\":\"a\",\"sleep\":\"PT0S\"}]}");
	recent =
	    tstack_create(&t, "{\"type\":\"s\",\"steps\":[{\"name\":\"a\",\"sleep\":\"PT0S\"}]}");
	pending =
	    tstack_create(&t, "{\"type\":\"s\",\"steps\":[{\"name\":\"a\",\"sleep\":\"P1D\"}]}");
	reap(out, sizeof(out));
	tstack_exec(tstack_db(),
	            "UPDATE timers SET fired_at = now() - interval '8 days' WHERE workflow_id = $1",
	            old);
	cr_assert_eq(tstack_count("SELECT count(*) FROM timers WHERE tenant_id = $1"
	                          " AND fired_at IS NOT NULL",
	                          t.id_text),
	             2);
	cr_assert_eq(tstack_cli(out, sizeof(out), "prune", "--outbox-retention", "7d", NULL), 0,
	             "prune: %s", tstack_cli_stderr());
	cr_assert_eq(tstack_count("SELECT count(*) FROM timers WHERE workflow_id = $1", old), 0,
	             "the timer fired 8 days ago is pruned: %s", out);
	cr_assert_eq(tstack_count("SELECT count(*) FROM timers WHERE workflow_id = $1"
	                          " AND fired_at IS NOT NULL",
	                          recent),
	             1);
	cr_assert_eq(tstack_count("SELECT count(*) FROM timers WHERE workflow_id = $1"
	                          " AND fired_at IS NULL",
	                          pending),
	             1);
	free(old);
	free(recent);
	free(pending);
}

Test(sleep, a_cancelled_workflow_s_timer_is_dropped_without_an_event)
{
	struct tstack_tenant t;
	struct http_response *r;
	char out[256], path[128], *wf;

	tstack_tenant_create(&t, "cancel");
	wf =
	    tstack_create(&t, "{\"type\":\"c\",\"steps\":[{\"name\":\"nap\",\"sleep\":\"PT0S\"}]}");
	snprintf(path, sizeof(path), "/v1/workflows/%s/transitions", wf);
	r = tstack_post(&t, path, NULL, "{\"to\":\"cancelled\"}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	reap(out, sizeof(out));
	cr_assert_str_eq(out, "reap: jobs=0");
	cr_assert_eq(tstack_count("SELECT count(*) FROM timers WHERE workflow_id = $1", wf), 0);
	expect_events(&t, wf, "workflow.created,workflow.cancelled");
	free(wf);
}

/* --- Wait timeouts ----------------------------------------------------- */

Test(wait_timeout, a_wait_that_times_out_fails_the_workflow)
{
	struct tstack_tenant t;
	struct http_response *r;
	char out[256], path[128], *wf, *v;

	tstack_tenant_create(&t, "wto");
	wf = tstack_create(&t, "{\"type\":\"w\",\"steps\":[{\"name\":\"await\",\"wait_for\":\"go\","
	                       "\"timeout\":\"PT0.3S\"},{\"name\":\"next\",\"job_type\":\"n\"}]}");
	wait_due(wf);
	reap(out, sizeof(out));
	cr_assert_str_eq(out, "reap: jobs=0\nreap: timers=0 timeouts=1 incidents=0");
	expect_state(wf, "failed/1");
	expect_events(&t, wf, "workflow.created,workflow.started,step.timed_out,workflow.failed");
	v = tstack_text("SELECT payload::jsonb -> 'data' FROM outbox WHERE workflow_id = $1"
	                " AND type = 'step.timed_out'",
	                wf);
	cr_assert_str_eq(v, "{\"name\": \"await\", \"step\": 1, \"timeout\": \"PT0.3S\", "
	                    "\"wait_for\": \"go\", \"on_timeout\": null}");
	free(v);
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1 AND step = 1"
	                          " AND state = 'failed' AND error = 'timed out'",
	                          wf),
	             1);
	/* The message comes too late: recorded, nothing waits for it. */
	snprintf(path, sizeof(path), "/v1/workflows/%s/messages", wf);
	r = tstack_post(&t, path, NULL, "{\"message_id\":\"late\",\"name\":\"go\"}");
	tstack_expect_status(r, 202);
	http_response_free(r);
	expect_state(wf, "failed/1");
	free(wf);
}

Test(wait_timeout, a_wait_that_times_out_continues_at_its_on_timeout_step)
{
	struct tstack_tenant t;
	char out[256], *wf;

	tstack_tenant_create(&t, "wtc");
	wf = tstack_create(
	    &t, "{\"type\":\"w\",\"steps\":[{\"name\":\"await\",\"wait_for\":\"go\","
	        "\"timeout\":\"PT0.2S\",\"on_timeout\":\"remind\"},{\"name\":\"ship\","
	        "\"job_type\":\"ship\"},{\"name\":\"remind\",\"job_type\":\"remind\"}]}");
	wait_due(wf);
	reap(out, sizeof(out));
	cr_assert_str_eq(out, "reap: jobs=0\nreap: timers=0 timeouts=1 incidents=0");
	expect_state(wf, "running/3");
	expect_events(&t, wf, "workflow.created,workflow.started,step.timed_out");
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1", wf), 2,
	             "the wait and remind; ship is skipped");
	cr_assert_eq(tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1 AND step = 3"
	                          " AND job_type = 'remind' AND state = 'activatable'",
	                          wf),
	             1);
	free(wf);
}

Test(wait_timeout, a_message_in_time_cancels_the_timeout)
{
	struct tstack_tenant t;
	struct http_response *r;
	char out[256], path[128], *wf;

	tstack_tenant_create(&t, "wtm");
	wf = tstack_create(&t, "{\"type\":\"w\",\"steps\":[{\"name\":\"await\",\"wait_for\":\"go\","
	                       "\"timeout\":\"PT0.2S\"}]}");
	snprintf(path, sizeof(path), "/v1/workflows/%s/messages", wf);
	r = tstack_post(&t, path, NULL, "{\"message_id\":\"m\",\"name\":\"go\"}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	cr_assert_eq(tstack_count("SELECT count(*) FROM timers WHERE workflow_id = $1", wf), 0);
	tstack_sleep_ms(300);
	reap(out, sizeof(out));
	cr_assert_str_eq(out, "reap: jobs=0");
	expect_state(wf, "completed/1");
	expect_events(&t, wf, "workflow.created,workflow.started,job.completed,workflow.completed");
	free(wf);
}

#define RACE_WORKFLOWS 40
#define RACE_ROUNDS    5 /* at most, until each order was seen */

struct racer {
	const struct tstack_tenant *t;
	char (*wf)[37];
	int round;
	int status[RACE_WORKFLOWS];
};

/* The messages go from the last workflow to the first, once the reaper
 * has fired the first (due first) and goes on from there: they meet in
 * between, so each order is forced, not left to the scheduler. */
static void *post_messages(void *arg)
{
	struct racer *r = arg;

	for (int i = RACE_WORKFLOWS - 1; i >= 0; i--) {
		char path[128], body[64];
		struct http_response *resp;
		snprintf(path, sizeof(path), "/v1/workflows/%s/messages", r->wf[i]);
		snprintf(body, sizeof(body), "{\"message_id\":\"m-%d-%d\",\"name\":\"go\"}",
		         r->round, i);
		resp = tstack_post_raw(r->t, path, NULL, body);
		r->status[i] = resp != NULL ? resp->status : -1;
		http_response_free(resp);
	}
	return NULL;
}

/* One round: RACE_WORKFLOWS due waits, their messages and a reaper at
 * once; adds to *won (the message first) and *lost (the timeout first). */
static void message_timeout_round(const struct tstack_tenant *t, int round, int *won, int *lost)
{
	struct racer r = { 0 };
	char wf[RACE_WORKFLOWS][37], log[512], out[256];
	const char *argv[] = { tstack_env("IDEMFLOW_CLI"),
		               "--db",
		               tstack_env("DATABASE_URL"),
		               "reap",
		               "--prune-batch",
		               "1",
		               NULL };
	pthread_t th;
	int status;
	pid_t pid, reaped = 0;

	for (int i = 0; i < RACE_WORKFLOWS; i++) {
		char *id = tstack_create(t, "{\"type\":\"r\",\"steps\":[{\"name\":\"await\","
		                            "\"wait_for\":\"go\",\"timeout\":\"PT0.5S\"}]}");
		snprintf(wf[i], sizeof(wf[i]), "%s", id);
		free(id);
	}
	wait_due(wf[RACE_WORKFLOWS - 1]);
	r.t = t;
	r.wf = wf;
	r.round = round;
	snprintf(log, sizeof(log), "%s/race-reap-%d-%d.log", tstack_env("IDEMFLOW_STACK_DIR"),
	         (int)getpid(), round);
	pid = tstack_spawn(argv, log);
	/* (A reaper that fired all of them first leaves a round of timeouts
	 * only: the next round tries again.) */
	while (tstack_count("SELECT count(*) FROM outbox WHERE workflow_id = $1"
	                    " AND type = 'step.timed_out'",
	                    wf[0]) == 0 &&
	       (reaped = waitpid(pid, &status, WNOHANG)) == 0)
		tstack_sleep_ms(1);
	cr_assert_eq(pthread_create(&th, NULL, post_messages, &r), 0);
	pthread_join(th, NULL);
	if (reaped == 0)
		reaped = waitpid(pid, &status, 0);
	cr_assert_eq(reaped, pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "reap failed; see %s", log);
	reap(out, sizeof(out)); /* whatever the racer skipped */

	for (int i = 0; i < RACE_WORKFLOWS; i++) {
		long done = tstack_count("SELECT count(*) FROM outbox WHERE workflow_id = $1"
		                         " AND type = 'job.completed'",
		                         wf[i]),
		     timed_out = tstack_count("SELECT count(*) FROM outbox WHERE workflow_id = $1"
		                              " AND type = 'step.timed_out'",
		                              wf[i]);
		cr_assert_eq(done + timed_out, 1, "workflow %d: %ld completions, %ld timeouts", i,
		             done, timed_out);
		if (r.status[i] == 200) {
			cr_assert_eq(done, 1, "workflow %d: correlated but timed out", i);
			expect_state(wf[i], "completed/1");
			(*won)++;
		} else {
			cr_assert_eq(r.status[i], 202, "workflow %d: status %d", i, r.status[i]);
			cr_assert_eq(timed_out, 1, "workflow %d: recorded but completed", i);
			expect_state(wf[i], "failed/1");
			(*lost)++;
		}
	}
}

/*
 * Messages and a reaper go at once for waits that are due: each wait ends
 * exactly one way, the way its answer says. A correlated message (200)
 * means job.completed and no step.timed_out; a recorded one (202) means
 * the timeout came first. Both orders must have happened: rounds go on
 * (at most RACE_ROUNDS) until each was seen.
 */
Test(wait_timeout, a_message_racing_its_timeout_loses_or_wins_whole)
{
	struct tstack_tenant t;
	int won = 0, lost = 0, round;

	tstack_tenant_create(&t, "race");
	for (round = 0; round < RACE_ROUNDS && (won == 0 || lost == 0); round++)
		message_timeout_round(&t, round, &won, &lost);
	cr_log_info("%d rounds: message first: %d, timeout first: %d", round, won, lost);
	cr_assert_eq(won + lost, round * RACE_WORKFLOWS);
	cr_assert_gt(won, 0, "in %d rounds no message came before its timeout", round);
	cr_assert_gt(lost, 0, "in %d rounds no timeout came before its message", round);
}

/* --- Reapers ----------------------------------------------------------- */

#define TWO_REAPERS_TIMERS 300

/* The sum of "timers=N" over the lines of a reaper's log. */
static long fired_in_log(const char *path)
{
	FILE *f = fopen(path, "r");
	char line[256];
	long sum = 0, n, m;

	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "reap: timers=%ld timeouts=%ld", &n, &m) == 2)
			sum += n;
	fclose(f);
	return sum;
}

/* One round: TWO_REAPERS_TIMERS due timers of a new tenant, two reapers
 * at once; every timer fired exactly once. fired[k]: reaper k's share. */
static void two_reapers_round(int round, long fired[2])
{
	struct tstack_tenant t;
	char log[2][512];
	pid_t pid[2];

	tstack_tenant_create(&t, "two");
	for (int i = 0; i < TWO_REAPERS_TIMERS; i++)
		free(tstack_create(&t, "{\"type\":\"t\",\"steps\":[{\"name\":\"nap\","
		                       "\"until\":\"2001-01-01T00:00:00Z\"}]}"));
	for (int k = 0; k < 2; k++) {
		const char *argv[] = { tstack_env("IDEMFLOW_CLI"),
			               "--db",
			               tstack_env("DATABASE_URL"),
			               "reap",
			               "--prune-batch",
			               "7",
			               NULL };
		snprintf(log[k], sizeof(log[k]), "%s/two-reap-%d-%d-%d.log",
		         tstack_env("IDEMFLOW_STACK_DIR"), k, (int)getpid(), round);
		pid[k] = tstack_spawn(argv, log[k]);
	}
	for (int k = 0; k < 2; k++) {
		int status;
		cr_assert_eq(waitpid(pid[k], &status, 0), pid[k]);
		cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "reaper %d; see %s", k,
		          log[k]);
		fired[k] = fired_in_log(log[k]);
	}
	cr_assert_eq(fired[0] + fired[1], TWO_REAPERS_TIMERS, "the reapers say they fired %ld",
	             fired[0] + fired[1]);
	cr_assert_eq(tstack_count("SELECT count(*) FROM outbox WHERE tenant_id = $1"
	                          " AND type = 'timer.fired'",
	                          t.id_text),
	             TWO_REAPERS_TIMERS);
	cr_assert_eq(tstack_count("SELECT count(*) FROM (SELECT workflow_id FROM outbox"
	                          "  WHERE tenant_id = $1 AND type = 'timer.fired'"
	                          "  GROUP BY workflow_id HAVING count(*) = 1) o",
	                          t.id_text),
	             TWO_REAPERS_TIMERS);
	cr_assert_eq(tstack_count("SELECT count(*) FROM workflows WHERE tenant_id = $1"
	                          " AND state = 'completed'",
	                          t.id_text),
	             TWO_REAPERS_TIMERS);
}

/*
 * Two reapers at once fire each timer exactly once, and both must have
 * fired some in one round (they raced, each taking batches the other
 * skipped): rounds go on, at most RACE_ROUNDS, until that happened.
 */
Test(reapers, two_reapers_at_once_fire_each_timer_exactly_once)
{
	long fired[2] = { 0, 0 };
	int round;

	for (round = 0; round < RACE_ROUNDS && (fired[0] == 0 || fired[1] == 0); round++)
		two_reapers_round(round, fired);
	cr_log_info("%d rounds; the last: reaper 0 fired %ld, reaper 1 fired %ld", round, fired[0],
	            fired[1]);
	cr_assert(fired[0] > 0 && fired[1] > 0,
	          "in %d rounds the reapers never both fired: %ld and %ld", round, fired[0],
	          fired[1]);
}

/*
 * reap --loop --interval 100: a timer fires within the documented
 * precision (the interval plus one round), measured by the database's
 * clock as fired_at - due_at; SIGTERM ends the loop at once, status 0.
 */
Test(reapers, reap_loop_fires_within_its_precision_and_stops_on_sigterm)
{
	struct tstack_tenant t;
	char log[512], *wf, *late;
	const char *argv[] = { tstack_env("IDEMFLOW_CLI"),
		               "--db",
		               tstack_env("DATABASE_URL"),
		               "reap",
		               "--loop",
		               "--interval",
		               "100",
		               NULL };
	double deadline, t0;
	int status;
	pid_t pid;

	tstack_tenant_create(&t, "loop");
	snprintf(log, sizeof(log), "%s/loop-reap-%d.log", tstack_env("IDEMFLOW_STACK_DIR"),
	         (int)getpid());
	pid = tstack_spawn(argv, log);
	wf = tstack_create(&t,
	                   "{\"type\":\"l\",\"steps\":[{\"name\":\"nap\",\"sleep\":\"PT0.5S\"}]}");
	deadline = tstack_now() + 10;
	while (tstack_count("SELECT count(*) FROM timers WHERE workflow_id = $1"
	                    " AND fired_at IS NOT NULL",
	                    wf) == 0) {
		cr_assert(tstack_now() < deadline, "the loop did not fire the timer; see %s", log);
		tstack_sleep_ms(20);
	}
	late = tstack_text("SELECT round(extract(epoch FROM fired_at - due_at) * 1000)::text"
	                   "  FROM timers WHERE workflow_id = $1",
	                   wf);
	cr_log_info("fired %s ms after due (interval 100 ms)", late);
	cr_assert(atol(late) >= 0 && atol(late) <= 100 + 400,
	          "fired %s ms after due: more than the interval and one round", late);
	free(late);
	expect_state(wf, "completed/1");

	t0 = tstack_now();
	cr_assert_eq(kill(pid, SIGTERM), 0);
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status 0x%x; see %s", status,
	          log);
	cr_assert(tstack_now() - t0 < 2.0, "the loop took %.3f s to stop", tstack_now() - t0);
	free(wf);
}

Test(reapers, reap_refuses_a_bad_interval)
{
	char out[256];

	cr_assert_eq(tstack_cli(out, sizeof(out), "reap", "--loop", "--interval", "5", NULL), 64);
	cr_assert_str_eq(tstack_cli_stderr(),
	                 "idemflow: --interval takes milliseconds, 10 to 3600000\n");
}

/*
 * A value PostgreSQL refuses only when the timer fires (an "until" offset
 * of 16 hours, as a server before the check stored it) used to fail the
 * reaper's shared batch every round, for every tenant. Now that timer
 * parks its own workflow in incident and the others fire; a resume after
 * the fix fires it.
 */
Test(reapers, a_timer_that_cannot_fire_parks_its_workflow_and_the_batch_goes_on)
{
	struct tstack_tenant a, b;
	char out[256], key[64], path[160], *bad, *good[3], *err;
	struct http_response *r;

	tstack_tenant_create(&a, "badtimer");
	tstack_tenant_create(&b, "goodtimer");
	bad = tstack_create(&a, "{\"type\":\"s\",\"steps\":[{\"name\":\"nap\",\"sleep\":\"PT0S\"},"
	                        "{\"name\":\"then\",\"until\":\"2026-01-01T00:00:00Z\"}]}");
	tstack_exec(tstack_db(),
	            "UPDATE workflows SET steps = jsonb_set(steps, '{1,until}',"
	            " '\"2026-01-01T00:00:00+16:00\"') WHERE id = $1",
	            bad);
	for (int i = 0; i < 3; i++)
		good[i] =
		    tstack_create(&b, "{\"type\":\"s\",\"steps\":[{\"name\":\"nap\",\"sleep\":"
		                      "\"PT0S\"},{\"name\":\"then\",\"job_type\":\"x\"}]}");
	wait_due(good[2]);

	reap(out, sizeof(out));
	for (int i = 0; i < 3; i++)
		expect_state(good[i], "running/2");
	expect_state(bad, "incident/1");
	cr_assert_str_eq(out, "reap: jobs=0\nreap: timers=3 timeouts=0 incidents=1");
	expect_events(&a, bad, "workflow.created,workflow.started,workflow.incident");
	err = tstack_text("SELECT error FROM timers WHERE workflow_id = $1 AND step = 1", bad);
	cr_assert_str_eq(err,
	                 "the sleep timer could not fire: time zone displacement out of range: "
	                 "\"2026-01-01T00:00:00+16:00\" (SQLSTATE 22009)");
	free(err);
	err = tstack_text("SELECT payload::jsonb -> 'data' ->> 'error' FROM outbox"
	                  " WHERE workflow_id = $1 AND type = 'workflow.incident'",
	                  bad);
	cr_assert(err != NULL && strstr(err, "(SQLSTATE 22009)") != NULL, "%s", err);
	free(err);
	/* It is no longer due: the next round leaves it. */
	reap(out, sizeof(out));
	cr_assert_str_eq(out, "reap: jobs=0");

	/* Resumed without a fix, it parks again; after the fix it fires, and
	 * so does the (past) time it then waits for. */
	snprintf(path, sizeof(path), "/v1/workflows/%s/resume", bad);
	tstack_key(key, sizeof(key), "resume");
	r = tstack_post(&a, path, key, "{}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	expect_state(bad, "running/1");
	reap(out, sizeof(out));
	cr_assert_str_eq(out, "reap: jobs=0\nreap: timers=0 timeouts=0 incidents=1");
	expect_state(bad, "incident/1");
	tstack_exec(tstack_db(),
	            "UPDATE workflows SET steps = jsonb_set(steps, '{1,until}',"
	            " '\"2026-01-01T00:00:00+15:00\"') WHERE id = $1",
	            bad);
	tstack_key(key, sizeof(key), "resume");
	r = tstack_post(&a, path, key, "{}");
	tstack_expect_status(r, 200);
	http_response_free(r);
	reap(out, sizeof(out));
	cr_assert_str_eq(out, "reap: jobs=0\nreap: timers=2 timeouts=0 incidents=0");
	expect_state(bad, "completed/2");
	expect_events(&a, bad,
	              "workflow.created,workflow.started,workflow.incident,workflow.resumed,"
	              "workflow.incident,workflow.resumed,timer.fired,timer.fired,"
	              "workflow.completed");
	for (int i = 0; i < 3; i++)
		free(good[i]);
	free(bad);
}

/*
 * Timers went strictly by due time, so an "until" long past went ahead of
 * everything, and one tenant's flood of them held back everyone else's.
 * Now the tenants with due timers share each batch: with batches of 5 and
 * 30 of tenant a's timers due since 2001, tenant b's sleep fires in the
 * first batch (one transaction: one fired_at).
 */
Test(reapers, a_flood_of_one_tenants_timers_does_not_hold_back_another)
{
	struct tstack_tenant a, b;
	char out[256], *wf = NULL, *first;
	long ahead;

	tstack_tenant_create(&a, "flood");
	tstack_tenant_create(&b, "victim");
	for (int i = 0; i < 30; i++) {
		free(wf);
		wf = tstack_create(&a, "{\"type\":\"s\",\"steps\":[{\"name\":\"then\",\"until\":"
		                       "\"2001-01-01T00:00:00Z\"},{\"name\":\"x\",\"job_type\":"
		                       "\"x\"}]}");
	}
	free(wf);
	wf = tstack_create(&b, "{\"type\":\"s\",\"steps\":[{\"name\":\"nap\",\"sleep\":\"PT0S\"},"
	                       "{\"name\":\"x\",\"job_type\":\"x\"}]}");
	wait_due(wf);
	cr_assert_eq(tstack_cli(out, sizeof(out), "reap", "--prune-batch", "5", NULL), 0,
	             "reap: %s", tstack_cli_stderr());
	/* Batches in the order they ran: tenant a's before b's fired. */
	ahead = tstack_count("SELECT count(*) FROM timers t"
	                     " WHERE t.tenant_id = $1 AND t.fired_at <"
	                     "       (SELECT fired_at FROM timers WHERE workflow_id = $2)",
	                     a.id_text, wf);
	cr_assert_eq(ahead, 0, "%ld of the flood fired before the other tenant's timer", ahead);
	first = tstack_text("SELECT count(*) FROM timers WHERE tenant_id = $1 AND fired_at ="
	                    " (SELECT fired_at FROM timers WHERE workflow_id = $2)",
	                    a.id_text, wf);
	/* The batch of 5 shared by two tenants: 3 each at most, b had 1. */
	cr_assert_str_eq(first, "3");
	free(first);
	cr_assert_str_eq(out, "reap: jobs=0\nreap: timers=31 timeouts=0 incidents=0");
	free(wf);
}

/* --- Bad definitions --------------------------------------------------- */

static void expect_refused(const struct tstack_tenant *t, const char *steps, int status,
                           const char *type, const char *detail)
{
	struct http_response *r;
	char body[1024], key[64], *d;

	snprintf(body, sizeof(body), "{\"type\":\"bad\",\"steps\":[%s]}", steps);
	tstack_key(key, sizeof(key), "bad");
	r = tstack_post(t, "/v1/workflows", key, body);
	tstack_expect_problem(r, status, type, "/v1/workflows");
	d = tstack_json(r->body, "{detail}");
	cr_assert_str_eq(d, detail, "for %s", steps);
	free(d);
	http_response_free(r);
}

Test(bad_timers, malformed_durations_and_times_are_400_and_change_nothing)
{
	struct tstack_tenant t;
	static const struct {
		const char *steps, *detail;
	} cases[] = {
		{ "{\"name\":\"a\",\"sleep\":\"30s\"}",
		  "step 1: \"sleep\": expected an ISO 8601 duration such as \"PT30S\" or "
		  "\"P1DT2H\"" },
		{ "{\"name\":\"a\",\"sleep\":\"P\"}", "step 1: \"sleep\": expected an ISO 8601 "
		                                      "duration such as \"PT30S\" or \"P1DT2H\"" },
		{ "{\"name\":\"a\",\"sleep\":\"PT\"}", "step 1: \"sleep\": expected an ISO 8601 "
		                                       "duration such as \"PT30S\" or \"P1DT2H\"" },
		{ "{\"name\":\"a\",\"sleep\":\"PT1S1M\"}",
		  "step 1: \"sleep\": expected an ISO 8601 duration such as \"PT30S\" or "
		  "\"P1DT2H\"" },
		{ "{\"name\":\"a\",\"sleep\":\"P1M\"}",
		  "step 1: \"sleep\": months have no fixed length: use days" },
		{ "{\"name\":\"a\",\"sleep\":\"P1Y\"}",
		  "step 1: \"sleep\": use days, hours, minutes and seconds only (P1DT2H3M4S)" },
		{ "{\"name\":\"a\",\"sleep\":\"PT1.5H\"}",
		  "step 1: \"sleep\": only seconds take a fraction, of 1 to 6 digits" },
		{ "{\"name\":\"a\",\"sleep\":\"P3651D\"}", "step 1: \"sleep\": at most P3650D" },
		{ "{\"name\":\"a\",\"sleep\":30}", "step 1: \"sleep\" must be a string" },
		{ "{\"name\":\"a\",\"until\":\"2026-02-29T00:00:00Z\"}",
		  "step 1: \"until\": no such date or time" },
		{ "{\"name\":\"a\",\"until\":\"2026-12-01 20:00:00Z\"}",
		  "step 1: \"until\": expected an RFC 3339 time such as \"2026-12-01T20:00:00Z\"" },
		{ "{\"name\":\"a\",\"until\":\"2026-12-01T20:00:00\"}",
		  "step 1: \"until\": expected an RFC 3339 time such as \"2026-12-01T20:00:00Z\"" },
		/* Offsets past 15:59 and instants past the years 0001-9999 are
		 * what PostgreSQL refuses when the timer is set: as the first
		 * step, a 500; as a later one, a reaper batch that fails for
		 * every tenant. */
		{ "{\"name\":\"a\",\"until\":\"2026-01-01T00:00:00+16:00\"}",
		  "step 1: \"until\": the offset must be within -15:59 and +15:59" },
		{ "{\"name\":\"a\",\"job_type\":\"x\"},{\"name\":\"b\",\"until\":"
		  "\"2026-01-01T00:00:00-23:59\"}",
		  "step 2: \"until\": the offset must be within -15:59 and +15:59" },
		{ "{\"name\":\"a\",\"until\":\"0001-01-01T00:00:00+01:00\"}",
		  "step 1: \"until\": the time must fall within the years 0001 and 9999 in UTC" },
		{ "{\"name\":\"a\",\"sleep\":\"P999999999D\"}",
		  "step 1: \"sleep\": too long a duration" },
		{ "{\"name\":\"a\",\"job_type\":\"x\"},{\"name\":\"b\",\"wait_for\":\"m\","
		  "\"timeout\":\"1 hour\"}",
		  "step 2: \"timeout\": expected an ISO 8601 duration such as \"PT30S\" or "
		  "\"P1DT2H\"" },
	};
	char *before, *after;

	tstack_tenant_create(&t, "baddur");
	before = tstack_text("SELECT count(*) || '/' || (SELECT count(*) FROM timers) FROM "
	                     "workflows WHERE tenant_id = $1",
	                     t.id_text);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		expect_refused(&t, cases[i].steps, 400, "/problems/invalid-duration",
		               cases[i].detail);
	after = tstack_text("SELECT count(*) || '/' || (SELECT count(*) FROM timers) FROM "
	                    "workflows WHERE tenant_id = $1",
	                    t.id_text);
	cr_assert_str_eq(after, before);
	free(before);
	free(after);
}

Test(bad_timers, timer_members_in_the_wrong_place_are_invalid_workflows)
{
	struct tstack_tenant t;

	tstack_tenant_create(&t, "badtm");
	expect_refused(
	    &t, "{\"name\":\"a\",\"sleep\":\"PT1S\",\"job_type\":\"x\"}", 422,
	    "/problems/invalid-workflow",
	    "step 1: a step has exactly one of \"job_type\", \"wait_for\", \"sleep\" and "
	    "\"until\"");
	expect_refused(&t, "{\"name\":\"a\",\"sleep\":\"PT1S\",\"retries\":2}", 422,
	               "/problems/invalid-workflow", "step 1: only a job step has \"retries\"");
	expect_refused(&t, "{\"name\":\"a\",\"job_type\":\"x\",\"timeout\":\"PT1S\"}", 422,
	               "/problems/invalid-workflow",
	               "step 1: only a wait step has \"timeout\" and \"on_timeout\"");
	expect_refused(&t,
	               "{\"name\":\"a\",\"wait_for\":\"m\",\"on_timeout\":\"b\"},"
	               "{\"name\":\"b\",\"job_type\":\"x\"}",
	               422, "/problems/invalid-workflow",
	               "step 1: \"on_timeout\" needs a \"timeout\"");
	expect_refused(&t,
	               "{\"name\":\"b\",\"job_type\":\"x\"},{\"name\":\"a\",\"wait_for\":\"m\","
	               "\"timeout\":\"PT1S\",\"on_timeout\":\"b\"}",
	               422, "/problems/invalid-workflow",
	               "step 2: \"on_timeout\" names no later step: \"b\" is not the name of a "
	               "step after this one");
	expect_refused(&t,
	               "{\"name\":\"a\",\"wait_for\":\"m\",\"timeout\":\"PT1S\","
	               "\"on_timeout\":\"a\"}",
	               422, "/problems/invalid-workflow",
	               "step 1: \"on_timeout\" names no later step: \"a\" is not the name of a "
	               "step after this one");
	cr_assert_eq(tstack_count("SELECT count(*) FROM workflows WHERE tenant_id = $1", t.id_text),
	             0);
}
