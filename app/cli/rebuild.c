/*
 * rebuild.c - a workflow rebuilt from its events (rebuild.h). The events
 * and what they change are those of the SQL functions (sql/0*.sql, every
 * idemflow_event call) and of doc/api.md, "Workflows that run" and
 * "Events":
 *
 *   workflow.created     pending at step 0; the first step begins (below)
 *   workflow.started     running
 *   job.completed k      job k completed; step k+1 begins
 *   job.failed k         job k open again when "retrying", else failed
 *                        (the compensating job -k with "compensation")
 *   timer.fired k        step k+1 begins (a sleep has no job)
 *   step.timed_out k     job k failed; the step "on_timeout" names begins
 *   workflow.incident    incident
 *   workflow.resumed k   "state" (running, or compensating); job k (-k
 *                        with "compensation") open, unless a "timer" was
 *                        what failed
 *   workflow.failed      failed
 *   workflow.cancelled   cancelled; every open or waiting job cancelled
 *   workflow.completed   completed
 *   compensation.started compensating; with "from": "cancelled" every open
 *                        or waiting job cancelled (as a cancel does); the
 *                        compensating job of the first of "steps" is open
 *   step.compensated k   job -k completed; the next of "steps" is open
 *   workflow.compensated compensated
 *
 * A step begins without an event of its own (idemflow_enter_step): past
 * the last step the workflow's step is the last one (and
 * workflow.completed follows); a job step's job is open, a wait step's
 * waiting (job.completed follows at once when a message was there), a
 * sleep has its timer and no job. So the definitions in workflow.created
 * are needed to know what a step is.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/rebuild.h"

void rebuild_init(struct rebuild *r)
{
	memset(r, 0, sizeof(*r));
	snprintf(r->state, sizeof(r->state), "%s", "(none)");
}

/* The job of step (-k: compensating), added when missing; NULL when
 * there is no room (more jobs than a workflow can have). */
static struct rebuild_job *job_at(struct rebuild *r, int step)
{
	for (int i = 0; i < r->njobs; i++)
		if (r->jobs[i].step == step)
			return &r->jobs[i];
	if (r->njobs == REBUILD_MAX_JOBS)
		return NULL;
	r->jobs[r->njobs].step = step;
	r->jobs[r->njobs].state[0] = '\0';
	return &r->jobs[r->njobs++];
}

static int set_job(struct rebuild *r, int step, const char *cls, char *why, size_t size)
{
	struct rebuild_job *j = job_at(r, step);

	if (j == NULL) {
		snprintf(why, size, "more than %d jobs", REBUILD_MAX_JOBS);
		return -1;
	}
	snprintf(j->state, sizeof(j->state), "%s", cls);
	return 0;
}

/* Step k begins: idemflow_enter_step's rows, without its events. */
static int enter(struct rebuild *r, int k, char *why, size_t size)
{
	if (k > r->ndefs) {
		r->step = k - 1;
		return 0;
	}
	r->step = k;
	switch (r->defs[k - 1].kind) {
	case 'j': return set_job(r, k, "open", why, size);
	case 'w': return set_job(r, k, "waiting", why, size);
	default: return 0;
	}
}

/* Every open or waiting job cancelled, as a cancel does. */
static void cancel_open(struct rebuild *r)
{
	for (int i = 0; i < r->njobs; i++)
		if (strcmp(r->jobs[i].state, "open") == 0 ||
		    strcmp(r->jobs[i].state, "waiting") == 0)
			snprintf(r->jobs[i].state, sizeof(r->jobs[i].state), "%s", "cancelled");
}

static void set_state(struct rebuild *r, const char *state)
{
	snprintf(r->state, sizeof(r->state), "%s", state);
}

static int member_bool(struct json_object *data, const char *name)
{
	struct json_object *v;

	return json_object_object_get_ex(data, name, &v) && json_object_get_boolean(v);
}

/* data's "step", 1..32: 0 with why filled when missing or out of range. */
static int member_step(struct json_object *data, const char *type, char *why, size_t size)
{
	struct json_object *v;
	int k = 0;

	if (json_object_object_get_ex(data, "step", &v) && json_object_is_type(v, json_type_int))
		k = json_object_get_int(v);
	if (k < 1 || k > REBUILD_MAX_STEPS) {
		snprintf(why, size, "%s without a step", type);
		return 0;
	}
	return k;
}

/* workflow.created's steps: what each is, and where a timeout goes on. */
static int read_defs(struct rebuild *r, struct json_object *data, char *why, size_t size)
{
	struct json_object *steps, *d, *v;
	size_t n;

	if (!json_object_object_get_ex(data, "steps", &steps) || steps == NULL)
		return 0; /* a workflow without steps */
	n = json_object_is_type(steps, json_type_array) ? json_object_array_length(steps) : 0;
	if (!json_object_is_type(steps, json_type_array) || n > REBUILD_MAX_STEPS) {
		snprintf(why, size, "workflow.created with steps that are no list of at most %d",
		         REBUILD_MAX_STEPS);
		return -1;
	}
	r->ndefs = (int)n;
	for (size_t i = 0; i < n; i++) {
		d = json_object_array_get_idx(steps, i);
		r->defs[i].kind = json_object_object_get_ex(d, "job_type", NULL)   ? 'j'
		                  : json_object_object_get_ex(d, "wait_for", NULL) ? 'w'
		                                                                   : 's';
	}
	/* on_timeout names a later step. */
	for (size_t i = 0; i < n; i++) {
		d = json_object_array_get_idx(steps, i);
		if (!json_object_object_get_ex(d, "on_timeout", &v) || v == NULL)
			continue;
		for (size_t t = 0; t < n; t++) {
			struct json_object *name;
			if (json_object_object_get_ex(json_object_array_get_idx(steps, t), "name",
			                              &name) &&
			    strcmp(json_object_get_string(name), json_object_get_string(v)) == 0)
				r->defs[i].on_timeout = (int)t + 1;
		}
	}
	return 0;
}

/* The compensating job of the next step in line, if any, is open. */
static int open_next_compensation(struct rebuild *r, char *why, size_t size)
{
	if (r->comp_next >= r->ncomp)
		return 0;
	return set_job(r, -r->comp[r->comp_next], "open", why, size);
}

int rebuild_apply(struct rebuild *r, int seq, const char *type, struct json_object *data, char *why,
                  size_t size)
{
	int k, comp = member_bool(data, "compensation");
	struct json_object *v;

	if (seq != r->seq + 1) {
		snprintf(why, size, "event %d after event %d", seq, r->seq);
		return -1;
	}
	if ((seq == 1) != (strcmp(type, "workflow.created") == 0)) {
		snprintf(why, size, "event %d is %s", seq, type);
		return -1;
	}
	r->seq = seq;
	if (strcmp(type, "workflow.created") == 0) {
		set_state(r, "pending");
		r->step = 0;
		if (read_defs(r, data, why, size) < 0)
			return -1;
		return r->ndefs > 0 ? enter(r, 1, why, size) : 0;
	}
	if (strcmp(type, "workflow.started") == 0) {
		set_state(r, "running");
		return 0;
	}
	if (strcmp(type, "workflow.incident") == 0) {
		set_state(r, "incident");
		return 0;
	}
	if (strcmp(type, "workflow.failed") == 0) {
		set_state(r, "failed");
		return 0;
	}
	if (strcmp(type, "workflow.completed") == 0) {
		set_state(r, "completed");
		return 0;
	}
	if (strcmp(type, "workflow.compensated") == 0) {
		set_state(r, "compensated");
		return 0;
	}
	if (strcmp(type, "workflow.cancelled") == 0) {
		set_state(r, "cancelled");
		cancel_open(r);
		return 0;
	}
	if (strcmp(type, "compensation.started") == 0) {
		set_state(r, "compensating");
		if (json_object_object_get_ex(data, "from", &v) &&
		    strcmp(json_object_get_string(v), "cancelled") == 0)
			cancel_open(r);
		r->ncomp = 0;
		r->comp_next = 0;
		if (json_object_object_get_ex(data, "steps", &v) &&
		    json_object_is_type(v, json_type_array)) {
			size_t n = json_object_array_length(v);
			for (size_t i = 0; i < n && r->ncomp < REBUILD_MAX_STEPS; i++) {
				k = json_object_get_int(json_object_array_get_idx(v, i));
				if (k < 1 || k > REBUILD_MAX_STEPS) {
					snprintf(why, size, "%s with step %d", type, k);
					return -1;
				}
				r->comp[r->ncomp++] = k;
			}
		}
		return open_next_compensation(r, why, size);
	}
	/* The rest are about one step. */
	if (strcmp(type, "workflow.resumed") != 0 && strcmp(type, "job.completed") != 0 &&
	    strcmp(type, "job.failed") != 0 && strcmp(type, "timer.fired") != 0 &&
	    strcmp(type, "step.timed_out") != 0 && strcmp(type, "step.compensated") != 0) {
		snprintf(why, size, "unknown event type \"%s\"", type);
		return -1;
	}
	k = member_step(data, type, why, size);
	if (k == 0)
		return -1;
	if (strcmp(type, "job.completed") == 0) {
		if (set_job(r, k, "completed", why, size) < 0)
			return -1;
		return enter(r, k + 1, why, size);
	}
	if (strcmp(type, "job.failed") == 0)
		return set_job(r, comp ? -k : k, member_bool(data, "retrying") ? "open" : "failed",
		               why, size);
	if (strcmp(type, "timer.fired") == 0)
		return enter(r, k + 1, why, size);
	if (strcmp(type, "step.timed_out") == 0) {
		if (set_job(r, k, "failed", why, size) < 0)
			return -1;
		if (k <= r->ndefs && r->defs[k - 1].on_timeout > 0)
			return enter(r, r->defs[k - 1].on_timeout, why, size);
		return 0; /* workflow.failed follows */
	}
	if (strcmp(type, "workflow.resumed") == 0) {
		set_state(r, json_object_object_get_ex(data, "state", &v) &&
		                     json_object_is_type(v, json_type_string)
		                 ? json_object_get_string(v)
		                 : "running");
		if (member_bool(data, "timer"))
			return 0;
		return set_job(r, comp ? -k : k, "open", why, size);
	}
	/* step.compensated */
	if (set_job(r, -k, "completed", why, size) < 0)
		return -1;
	if (r->comp_next < r->ncomp && r->comp[r->comp_next] == k)
		r->comp_next++;
	return open_next_compensation(r, why, size);
}

const char *rebuild_job_class(const char *state)
{
	if (strcmp(state, "activatable") == 0 || strcmp(state, "active") == 0)
		return "open";
	return state;
}

static int job_cmp(const void *a, const void *b)
{
	const struct rebuild_job *x = a, *y = b;

	return (x->step > y->step) - (x->step < y->step);
}

int rebuild_compare(const struct rebuild *r, const char *state, int step,
                    const struct rebuild_job *jobs, int njobs, rebuild_diff_fn fn, void *arg)
{
	struct rebuild_job stored[REBUILD_MAX_JOBS], built[REBUILD_MAX_JOBS];
	char a[16], b[16], field[32];
	int n = 0, i = 0, j = 0, ns = njobs < REBUILD_MAX_JOBS ? njobs : REBUILD_MAX_JOBS;

	if (strcmp(state, r->state) != 0) {
		fn(arg, "state", state, r->state);
		n++;
	}
	if (step != r->step) {
		snprintf(a, sizeof(a), "%d", step);
		snprintf(b, sizeof(b), "%d", r->step);
		fn(arg, "step", a, b);
		n++;
	}
	memcpy(stored, jobs, (size_t)ns * sizeof(stored[0]));
	memcpy(built, r->jobs, (size_t)r->njobs * sizeof(built[0]));
	qsort(stored, (size_t)ns, sizeof(stored[0]), job_cmp);
	qsort(built, (size_t)r->njobs, sizeof(built[0]), job_cmp);
	while (i < ns || j < r->njobs) {
		const char *s = NULL, *t = NULL;
		int at;

		if (j == r->njobs || (i < ns && stored[i].step < built[j].step)) {
			at = stored[i].step;
			s = rebuild_job_class(stored[i++].state);
		} else if (i == ns || built[j].step < stored[i].step) {
			at = built[j].step;
			t = built[j++].state;
		} else {
			at = stored[i].step;
			s = rebuild_job_class(stored[i++].state);
			t = built[j++].state;
		}
		if (s != NULL && t != NULL && strcmp(s, t) == 0)
			continue;
		snprintf(field, sizeof(field), "job %d", at);
		fn(arg, field, s ? s : "(none)", t ? t : "(none)");
		n++;
	}
	return n;
}
