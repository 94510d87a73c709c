/*
 * test_rebuild.c - a workflow rebuilt from synthetic event lists
 * (app/cli/rebuild.c): every event kind the engine writes, the
 * compensation's events as the engine contract gives them (compensating
 * jobs at step -k), what history cannot tell apart (activatable and
 * active: "open"), and the comparison with stored rows, one difference
 * each. The events the database writes are checked end to end by
 * t/e2e/test_rebuild.c.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "cli/rebuild.h"

/* Three job steps, the first two with a compensating job. */
#define CREATED                                                                                    \
	"workflow.created|{\"state\":\"pending\",\"step\":1,\"steps\":["                           \
	"{\"name\":\"a\",\"job_type\":\"ta\",\"compensate\":{\"job_type\":\"ua\"}},"               \
	"{\"name\":\"b\",\"job_type\":\"tb\",\"compensate\":{\"job_type\":\"ub\"}},"               \
	"{\"name\":\"c\",\"job_type\":\"tc\"}]}"

/* Apply events ("type|data", NULL-terminated) from seq 1; returns what
 * rebuild_apply returned for the last one applied, why in why. */
static int apply(struct rebuild *r, const char *const *events, char *why, size_t size)
{
	rebuild_init(r);
	for (int i = 0; events[i] != NULL; i++) {
		char type[64];
		const char *bar = strchr(events[i], '|');
		struct json_object *data;
		int rc;

		cr_assert_not_null(bar, "%s", events[i]);
		snprintf(type, sizeof(type), "%.*s", (int)(bar - events[i]), events[i]);
		data = json_tokener_parse(bar + 1);
		cr_assert_not_null(data, "not JSON: %s", bar + 1);
		rc = rebuild_apply(r, i + 1, type, data, why, size);
		json_object_put(data);
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* The rebuilt jobs as "step:class" by step, space-separated. */
static void jobs_of(const struct rebuild *r, char *out, size_t size)
{
	size_t n = 0;

	out[0] = '\0';
	for (int step = -REBUILD_MAX_STEPS; step <= REBUILD_MAX_STEPS; step++)
		for (int i = 0; i < r->njobs; i++)
			if (r->jobs[i].step == step)
				n += (size_t)snprintf(out + n, size - n, "%s%d:%s", n ? " " : "",
				                      step, r->jobs[i].state);
}

static void expect(const char *const *events, const char *state, int step, const char *jobs)
{
	struct rebuild r;
	char why[160] = "", got[512];

	cr_assert_eq(apply(&r, events, why, sizeof(why)), 0, "%s", why);
	cr_assert_str_eq(r.state, state);
	cr_assert_eq(r.step, step);
	jobs_of(&r, got, sizeof(got));
	cr_assert_str_eq(got, jobs);
}

Test(rebuild, steps_run_forward_and_complete)
{
	const char *ev[] = { CREATED,
		             "workflow.started|{\"state\":\"running\"}",
		             "job.completed|{\"step\":1,\"name\":\"a\",\"output\":{}}",
		             "job.failed|{\"step\":2,\"retrying\":true,\"retries_left\":0}",
		             "job.completed|{\"step\":2,\"name\":\"b\",\"output\":{}}",
		             NULL };
	const char *done[] = { CREATED,
		               "workflow.started|{\"state\":\"running\"}",
		               "job.completed|{\"step\":1}",
		               "job.completed|{\"step\":2}",
		               "job.completed|{\"step\":3}",
		               "workflow.completed|{\"state\":\"completed\"}",
		               NULL };

	expect(ev, "running", 3, "1:completed 2:completed 3:open");
	expect(done, "completed", 3, "1:completed 2:completed 3:completed");
}

Test(rebuild, waits_sleeps_and_timeouts_follow_the_definitions)
{
	const char *ev[] = {
		"workflow.created|{\"steps\":[{\"name\":\"s\",\"sleep\":\"PT1S\"},"
		"{\"name\":\"w\",\"wait_for\":\"go\",\"timeout\":\"PT1H\",\"on_timeout\":\"d\"},"
		"{\"name\":\"skipped\",\"job_type\":\"x\"},{\"name\":\"d\",\"wait_for\":\"go\"}]}",
		"workflow.started|{\"state\":\"running\"}",
		"timer.fired|{\"step\":1,\"name\":\"s\",\"due_at\":\"2026-01-01T00:00:00.000000Z\"}",
		"step.timed_out|{\"step\":2,\"name\":\"w\",\"on_timeout\":\"d\"}", NULL
	};
	const char *msg[] = { "workflow.created|{\"steps\":[{\"name\":\"w\",\"wait_for\":\"go\"}]}",
		              "job.completed|{\"step\":1,\"message_id\":\"m\",\"output\":{}}",
		              "workflow.completed|{\"state\":\"completed\"}", NULL };
	const char *none[] = { "workflow.created|{\"state\":\"pending\"}", NULL };

	/* A sleep has no job; step 3 was skipped and never had one. */
	expect(ev, "running", 4, "2:failed 4:waiting");
	/* A message there when the wait began: still pending (no start). */
	expect(msg, "completed", 1, "1:completed");
	expect(none, "pending", 0, "");
}

Test(rebuild, failure_incident_resume_and_cancel)
{
	const char *failed[] = { CREATED, "workflow.started|{}",
		                 "job.failed|{\"step\":1,\"retrying\":false}",
		                 "workflow.failed|{\"state\":\"failed\",\"step\":1}", NULL };
	const char *resumed[] = { CREATED,
		                  "workflow.started|{}",
		                  "job.failed|{\"step\":1,\"retrying\":false}",
		                  "workflow.incident|{\"state\":\"incident\",\"step\":1}",
		                  "workflow.resumed|{\"state\":\"running\",\"from\":\"incident\","
		                  "\"step\":1,\"retries\":0}",
		                  NULL };
	const char *timer[] = {
		"workflow.created|{\"steps\":[{\"name\":\"s\",\"sleep\":\"PT1S\"}]}",
		"workflow.started|{}", "workflow.incident|{\"state\":\"incident\",\"step\":1}",
		"workflow.resumed|{\"state\":\"running\",\"from\":\"incident\",\"step\":1,"
		"\"timer\":true}",
		NULL
	};
	const char *cancelled[] = {
		CREATED, "workflow.started|{}", "job.completed|{\"step\":1}",
		"workflow.cancelled|{\"state\":\"cancelled\",\"from\":\"running\"}", NULL
	};

	expect(failed, "failed", 1, "1:failed");
	expect(resumed, "running", 1, "1:open");
	expect(timer, "running", 1, "");
	expect(cancelled, "cancelled", 2, "1:completed 2:cancelled");
}

/* The compensation as the engine contract gives it: compensating jobs at
 * step -k, in the order of "steps", each opened when the one before it
 * completed; their failures, incident and resume carry "compensation". */
Test(rebuild, compensation_opens_each_compensating_job_in_turn)
{
	const char *ev[] = { CREATED,
		             "workflow.started|{}",
		             "job.completed|{\"step\":1}",
		             "job.completed|{\"step\":2}",
		             "job.failed|{\"step\":3,\"retrying\":false}",
		             "compensation.started|{\"state\":\"compensating\",\"from\":\"failed\","
		             "\"steps\":[2,1],\"step\":3,\"error\":\"no\"}",
		             NULL };
	const char *more[] = {
		CREATED,
		"workflow.started|{}",
		"job.completed|{\"step\":1}",
		"job.completed|{\"step\":2}",
		"job.failed|{\"step\":3,\"retrying\":false}",
		"compensation.started|{\"state\":\"compensating\",\"from\":\"failed\","
		"\"steps\":[2,1],\"step\":3,\"error\":\"no\"}",
		"step.compensated|{\"step\":2,\"name\":\"b\",\"job_type\":\"ub\",\"output\":{}}",
		"job.failed|{\"step\":1,\"compensation\":true,\"retrying\":false}",
		"workflow.incident|{\"state\":\"incident\",\"step\":1,\"compensation\":true}",
		"workflow.resumed|{\"state\":\"compensating\",\"from\":\"incident\",\"step\":1,"
		"\"retries\":1,\"compensation\":true}",
		NULL
	};
	const char *done[] = {
		CREATED,
		"workflow.started|{}",
		"job.completed|{\"step\":1}",
		"job.completed|{\"step\":2}",
		"compensation.started|{\"state\":\"compensating\",\"from\":\"cancelled\","
		"\"steps\":[2,1],\"step\":null,\"error\":null}",
		"step.compensated|{\"step\":2}",
		"step.compensated|{\"step\":1}",
		"workflow.compensated|{\"state\":\"compensated\",\"from\":\"cancelled\"}",
		NULL
	};

	expect(ev, "compensating", 3, "-2:open 1:completed 2:completed 3:failed");
	expect(more, "compensating", 3, "-2:completed -1:open 1:completed 2:completed 3:failed");
	/* A cancel's compensation cancels the open job first, as a cancel. */
	expect(done, "compensated", 3,
	       "-2:completed -1:completed 1:completed 2:completed 3:cancelled");
}

Test(rebuild, events_it_cannot_apply_are_refused)
{
	struct rebuild r;
	char why[160];
	const char *unknown[] = { CREATED, "workflow.paused|{}", NULL };
	const char *first[] = { "workflow.started|{}", NULL };
	const char *nostep[] = { CREATED, "job.completed|{}", NULL };

	cr_assert_eq(apply(&r, unknown, why, sizeof(why)), -1);
	cr_assert_str_eq(why, "unknown event type \"workflow.paused\"");
	cr_assert_eq(apply(&r, first, why, sizeof(why)), -1);
	cr_assert_str_eq(why, "event 1 is workflow.started");
	cr_assert_eq(apply(&r, nostep, why, sizeof(why)), -1);
	cr_assert_str_eq(why, "job.completed without a step");
	rebuild_init(&r);
	cr_assert_eq(rebuild_apply(&r, 2, "workflow.created", NULL, why, sizeof(why)), -1);
	cr_assert_str_eq(why, "event 2 after event 0");
}

/* The differences, collected as lines. */
static char diffs[1024];

static void collect(void *arg, const char *field, const char *stored, const char *rebuilt)
{
	size_t n = strlen(diffs);

	snprintf(diffs + n, sizeof(diffs) - n, "%s: %s/%s\n", field, stored, rebuilt);
}

Test(rebuild, compare_names_each_difference_and_takes_active_as_open)
{
	const char *ev[] = { CREATED, "workflow.started|{}", "job.completed|{\"step\":1}", NULL };
	struct rebuild r;
	char why[160];
	struct rebuild_job same[] = { { 2, "active" }, { 1, "completed" } };
	struct rebuild_job other[] = { { 1, "failed" }, { 3, "activatable" } };

	cr_assert_eq(apply(&r, ev, why, sizeof(why)), 0, "%s", why);
	diffs[0] = '\0';
	cr_assert_eq(rebuild_compare(&r, "running", 2, same, 2, collect, NULL), 0, "%s", diffs);
	cr_assert_eq(rebuild_compare(&r, "completed", 3, other, 2, collect, NULL), 5);
	cr_assert_str_eq(diffs, "state: completed/running\n"
	                        "step: 3/2\n"
	                        "job 1: failed/completed\n"
	                        "job 2: (none)/open\n"
	                        "job 3: open/(none)\n");
	cr_assert_str_eq(rebuild_job_class("activatable"), "open");
	cr_assert_str_eq(rebuild_job_class("active"), "open");
	cr_assert_str_eq(rebuild_job_class("waiting"), "waiting");
}
