/*
 * test_rebuild.c - "idemflow audit --rebuild": every workflow's state,
 * current step and job states rebuilt from its events alone agree with
 * its rows on real workflows that went through every state and every
 * event kind the engine writes; a row changed behind the engine's back is
 * named and fails the run; a history cut short by prune is skipped and
 * counted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "http.h"
#include "tapi.h"
#include "tsql.h"
#include "tstack.h"

TestSuite(rebuild, .timeout = 120);

static char out[64 * 1024];

static void post_ok(const struct tstack_tenant *t, const char *path, const char *body, int status)
{
	struct http_response *r = tstack_post(t, path, NULL, body);

	tstack_expect_status(r, status);
	http_response_free(r);
}

/* Activate one job of job_type (there must be one) for worker "w". */
static void activate(const struct tstack_tenant *t, const char *job_type)
{
	char body[200];
	struct http_response *r;

	snprintf(body, sizeof(body), "{\"job_type\":\"%s\",\"worker\":\"w\",\"max_jobs\":1}",
	         job_type);
	r = tstack_post(t, "/v1/jobs/activate", NULL, body);
	tstack_expect_status(r, 200);
	cr_assert(strstr(r->body, "\"key\"") != NULL, "no job of %s: %s", job_type, r->body);
	http_response_free(r);
}

static void job(const struct tstack_tenant *t, const char *wf, int step, const char *verb,
                const char *body, int status)
{
	char path[160];

	snprintf(path, sizeof(path), "/v1/jobs/%s.s%d/%s", wf, step, verb);
	post_ok(t, path, body, status);
}

static void command(const struct tstack_tenant *t, const char *wf, const char *what,
                    const char *body, int status)
{
	char path[160];

	snprintf(path, sizeof(path), "/v1/workflows/%s/%s", wf, what);
	post_ok(t, path, body, status);
}

/* idemflow audit --rebuild --tenant t; its exit status. */
static int rebuild(const struct tstack_tenant *t)
{
	return tstack_cli(out, sizeof(out), "audit", "--rebuild", "--tenant", t->name, NULL);
}

/* Workflows of tenant t in every state, through every event kind. */
static void make_workflows(const struct tstack_tenant *t, char **ids)
{
	int n = 0;
	const char *job2 = "{\"type\":\"r\",\"steps\":[{\"name\":\"a\",\"job_type\":\"ra\"},"
	                   "{\"name\":\"b\",\"job_type\":\"rb\",\"retries\":1}]}";

	/* pending, no steps; pending at a job step */
	ids[n++] = tstack_create(t, "{\"type\":\"r\"}");
	ids[n++] =
	    tstack_create(t, "{\"type\":\"r\",\"steps\":[{\"name\":\"a\",\"job_type\":\"rz\"}]}");
	/* completed: started, job.completed twice (one after a retry:
	 * job.failed retrying), workflow.completed */
	ids[n] = tstack_create(t, job2);
	activate(t, "ra");
	job(t, ids[n], 1, "complete", "{\"worker\":\"w\",\"output\":{\"x\":1}}", 200);
	activate(t, "rb");
	job(t, ids[n], 2, "fail", "{\"worker\":\"w\",\"error\":\"again\"}", 200);
	activate(t, "rb");
	job(t, ids[n], 2, "complete", "{\"worker\":\"w\"}", 200);
	n++;
	/* running, its job active */
	ids[n] = tstack_create(t, job2);
	activate(t, "ra");
	n++;
	/* failed: job.failed without retries, workflow.failed */
	ids[n] =
	    tstack_create(t, "{\"type\":\"r\",\"steps\":[{\"name\":\"a\",\"job_type\":\"rf\"}]}");
	activate(t, "rf");
	job(t, ids[n], 1, "fail", "{\"worker\":\"w\",\"error\":\"no\"}", 200);
	n++;
	/* incident, then resumed and completed; and one left in incident */
	for (int i = 0; i < 2; i++) {
		ids[n] = tstack_create(t, "{\"type\":\"r\",\"steps\":[{\"name\":\"a\",\"job_type\":"
		                          "\"ri\",\"on_failure\":\"incident\"}]}");
		activate(t, "ri");
		job(t, ids[n], 1, "fail", "{\"worker\":\"w\",\"error\":\"stuck\"}", 200);
		if (i == 0) {
			command(t, ids[n], "resume", "{\"retries\":0}", 200);
			activate(t, "ri");
			job(t, ids[n], 1, "complete", "{\"worker\":\"w\"}", 200);
		}
		n++;
	}
	/* cancelled while its job was active */
	ids[n] = tstack_create(t, job2);
	activate(t, "ra");
	command(t, ids[n], "transitions", "{\"to\":\"cancelled\"}", 200);
	n++;
	/* a wait: a message completes it; another message was recorded before */
	ids[n] =
	    tstack_create(t, "{\"type\":\"r\",\"steps\":[{\"name\":\"w\",\"wait_for\":\"go\"}]}");
	command(t, ids[n], "messages", "{\"message_id\":\"rb-go-1\",\"name\":\"go\"}", 200);
	n++;
	/* a wait that took a message recorded before it began */
	ids[n] = tstack_create(t, "{\"type\":\"r\",\"steps\":[{\"name\":\"a\",\"job_type\":\"rm\"},"
	                          "{\"name\":\"w\",\"wait_for\":\"go\"}]}");
	command(t, ids[n], "messages", "{\"message_id\":\"rb-go-2\",\"name\":\"go\"}", 202);
	activate(t, "rm");
	job(t, ids[n], 1, "complete", "{\"worker\":\"w\"}", 200);
	n++;
	/* a sleep (timer.fired), a wait that times out to a later step
	 * (step.timed_out, on_timeout), a wait that times out and fails */
	ids[n++] =
	    tstack_create(t, "{\"type\":\"r\",\"steps\":[{\"name\":\"s\",\"until\":"
	                     "\"2020-01-01T00:00:00Z\"},{\"name\":\"a\",\"job_type\":\"rs\"}]}");
	ids[n++] = tstack_create(t, "{\"type\":\"r\",\"steps\":[{\"name\":\"w\",\"wait_for\":\"x\","
	                            "\"timeout\":\"PT1H\",\"on_timeout\":\"c\"},{\"name\":\"b\","
	                            "\"job_type\":\"rt\"},{\"name\":\"c\",\"job_type\":\"rt\"}]}");
	ids[n++] = tstack_create(t, "{\"type\":\"r\",\"steps\":[{\"name\":\"w\",\"wait_for\":\"x\","
	                            "\"timeout\":\"PT1H\"}]}");
	tstack_exec(tstack_db(),
	            "UPDATE timers SET due_at = now() - interval '1 second' WHERE tenant_id = $1",
	            t->id_text);
	/* reap is for the whole database: another test's reap may hold one of
	 * these timers (SKIP LOCKED) when ours runs, and fire it a moment
	 * later. Again until every one has fired. */
	for (int i = 0; i < 100; i++) {
		cr_assert_eq(tstack_cli(out, sizeof(out), "reap", NULL), 0, "%s",
		             tstack_cli_stderr());
		if (tstack_count("SELECT count(*) FROM timers WHERE tenant_id = $1"
		                 "   AND fired_at IS NULL",
		                 t->id_text) == 0)
			break;
		usleep(50000);
	}
	ids[n] = NULL;
	cr_assert_eq(tstack_count("SELECT count(*) FROM workflows WHERE tenant_id = $1"
	                          " AND state = 'pending'",
	                          t->id_text),
	             2, "no steps, and one at a job step");
}

/*
 * Every state (pending, running, incident, completed, failed, cancelled)
 * and every event kind (created, started, job.completed, job.failed,
 * timer.fired, step.timed_out, workflow.completed, .failed, .cancelled,
 * .incident, .resumed) on real workflows: the rebuild agrees, exit 0.
 */
Test(rebuild, real_workflows_of_every_state_and_event_rebuild_to_their_rows)
{
	struct tstack_tenant t;
	char *ids[32];

	tstack_tenant_create(&t, "rebuild-clean");
	make_workflows(&t, ids);
	cr_assert_eq(
	    tstack_count("SELECT count(DISTINCT type) FROM outbox WHERE tenant_id = $1", t.id_text),
	    11, "every event kind");
	cr_assert_eq(
	    tstack_count("SELECT count(DISTINCT state) FROM workflows WHERE tenant_id = $1",
	                 t.id_text),
	    6, "every state");
	cr_assert_eq(rebuild(&t), 0, "%s%s", out, tstack_cli_stderr());
	cr_assert(strstr(out, "workflows=13 checked=13 skipped=0 ") != NULL, "%s", out);
	cr_assert(strstr(out, " differences=0 ") != NULL, "%s", out);
	for (int i = 0; ids[i] != NULL; i++)
		free(ids[i]);
}

/* A row changed behind the engine's back: each change is one DIFF line
 * naming the workflow and the field, stored and rebuilt, and the run
 * exits 65. A history prune cut short is skipped and counted. */
Test(rebuild, a_changed_row_is_named_and_fails_the_run)
{
	struct tstack_tenant t;
	char *ids[32], want[512];

	tstack_tenant_create(&t, "rebuild-bad");
	make_workflows(&t, ids);
	/* ids[2] completed; ids[3] running at step 1, its job active. */
	tstack_exec(tstack_db(), "UPDATE workflows SET state = 'failed' WHERE id = $1", ids[2]);
	tstack_exec(tstack_db(), "UPDATE workflows SET step = 2 WHERE id = $1", ids[3]);
	tstack_exec(tstack_db(),
	            "UPDATE jobs SET state = 'completed' WHERE workflow_id = $1 AND step = 1",
	            ids[3]);
	/* ids[4]'s history lost its first event: skipped. */
	tstack_exec(tstack_db(), "DELETE FROM outbox WHERE workflow_id = $1 AND seq = 1", ids[4]);
	cr_assert_eq(rebuild(&t), 65, "%s%s", out, tstack_cli_stderr());
	snprintf(want, sizeof(want),
	         "DIFF tenant=%s workflow=%s field=\"state\" stored=failed rebuilt=completed\n",
	         t.name, ids[2]);
	cr_assert(strstr(out, want) != NULL, "%s", out);
	snprintf(want, sizeof(want),
	         "DIFF tenant=%s workflow=%s field=\"step\" stored=2 rebuilt=1\n", t.name, ids[3]);
	cr_assert(strstr(out, want) != NULL, "%s", out);
	snprintf(want, sizeof(want),
	         "DIFF tenant=%s workflow=%s field=\"job 1\" stored=completed rebuilt=open\n",
	         t.name, ids[3]);
	cr_assert(strstr(out, want) != NULL, "%s", out);
	cr_assert(strstr(out, "workflows=13 checked=12 skipped=1 ") != NULL, "%s", out);
	cr_assert(strstr(out, " differences=3 ") != NULL, "%s", out);
	for (int i = 0; ids[i] != NULL; i++)
		free(ids[i]);
}
