/*
 * rebuild.h - a workflow's state, current step and job states computed
 * from its events alone ("idemflow audit --rebuild", audit.c), and
 * compared with its stored rows. Pure: no database, no I/O; audit.c reads
 * the rows and the events and hands them in, and the unit tests hand in
 * lists of their own.
 *
 * Some changes write no event by design: an activation (a job going from
 * activatable to active), a lease that runs out (back to activatable), a
 * heartbeat. History cannot tell those states apart, so a job is rebuilt
 * and compared by class: "open" (activatable or active), "waiting",
 * "completed", "failed", "cancelled".
 */
#ifndef IDEMFLOW_CLI_REBUILD_H
#define IDEMFLOW_CLI_REBUILD_H

#include <json-c/json.h>

/* A workflow has at most 32 steps, each with its job and, for the
 * compensation, its compensating job (step -k). */
#define REBUILD_MAX_STEPS 32
#define REBUILD_MAX_JOBS  (2 * REBUILD_MAX_STEPS)

/* One job: its step (-k: the compensating job of step k) and its class,
 * or its stored state. */
struct rebuild_job {
	int step;
	char state[16];
};

/* A step's definition, as far as the rebuild needs it. */
struct rebuild_def {
	char kind;      /* 'j' job, 'w' wait, 's' sleep */
	int on_timeout; /* the 1-based step a wait's timeout goes on at; 0: none */
};

/* What the events say; fill with rebuild_init(), then rebuild_apply()
 * each event in seq order. */
struct rebuild {
	char state[16];
	int step;
	struct rebuild_job jobs[REBUILD_MAX_JOBS];
	int njobs;
	struct rebuild_def defs[REBUILD_MAX_STEPS];
	int ndefs;
	int comp[REBUILD_MAX_STEPS]; /* the steps to compensate, in order */
	int ncomp, comp_next;
	int seq; /* the last event applied */
};

void rebuild_init(struct rebuild *r);

/*
 * Apply event seq of type with its data (borrowed; NULL as {}). Events
 * come in seq order from 1: workflow.created first. Returns 0, or -1 with
 * why (size bytes) filled: an unknown type, an event out of order, a
 * member the type needs missing. The rebuild is then of no use.
 */
int rebuild_apply(struct rebuild *r, int seq, const char *type, struct json_object *data, char *why,
                  size_t size);

/* The class of a stored job state ("activatable" and "active": "open");
 * the state itself for any other. */
const char *rebuild_job_class(const char *state);

/* Called once per difference: field is "state", "step" or "job <step>"
 * (the step as stored: -k for a compensating job); stored or rebuilt is
 * "(none)" for a job on one side only. */
typedef void (*rebuild_diff_fn)(void *arg, const char *field, const char *stored,
                                const char *rebuilt);

/*
 * Compare r with the stored workflow (state, step) and its jobs (stored
 * states; any order). Calls fn for each difference, in the order state,
 * step, jobs by step. Returns the number of differences.
 */
int rebuild_compare(const struct rebuild *r, const char *state, int step,
                    const struct rebuild_job *jobs, int njobs, rebuild_diff_fn fn, void *arg);

#endif
