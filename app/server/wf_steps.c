/*
 * wf_steps.c - a create body checked before the create: its members and
 * its step definitions (the members each kind of step may have, their
 * limits, durations and times that PostgreSQL reads alike, core/iso8601.h,
 * names unique, an on_timeout that only moves on, priorities). Nothing
 * here reads the database.
 */
#include "server/wf_steps.h"

#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/iso8601.h"
#include "server/cmd.h"

/* A job step's failure policy: "on_failure" is "fail" (the default: the
 * workflow fails once the retries are used up) or "incident" (it waits in
 * incident for a resume); "resumable" (boolean) lets a failed workflow be
 * resumed at this step. *on_failure: the member, or NULL when absent. */
static int validate_failure(struct json_object *st, const char **on_failure, char *why, size_t wlen)
{
	struct json_object *v;

	if (cmd_text(st, "on_failure", 0, 16, on_failure, why, wlen) < 0)
		return -1;
	if (*on_failure != NULL && strcmp(*on_failure, "fail") != 0 &&
	    strcmp(*on_failure, "incident") != 0) {
		snprintf(why, wlen, "\"on_failure\" is \"fail\" or \"incident\"");
		return -1;
	}
	if (json_object_object_get_ex(st, "resumable", &v) &&
	    !json_object_is_type(v, json_type_boolean)) {
		snprintf(why, wlen, "\"resumable\" must be true or false");
		return -1;
	}
	return 0;
}

/* A job step's "compensate": an object {"job_type": t, "retries": 0..100}
 * naming the job that undoes the step once it completed, when the
 * workflow fails or is cancelled later. */
static int validate_compensate(struct json_object *st, char *why, size_t wlen)
{
	static const char *const members[] = { "job_type", "retries", NULL };
	struct json_object *c;
	const char *job_type;
	char inner[160];
	long retries;

	if (!json_object_object_get_ex(st, "compensate", &c))
		return 0;
	if (!json_object_is_type(c, json_type_object)) {
		snprintf(why, wlen,
		         "\"compensate\" must be an object {\"job_type\": ..., \"retries\": ...}");
		return -1;
	}
	if (cmd_members(c, members, inner, sizeof(inner)) < 0 ||
	    cmd_text(c, "job_type", 1, WF_TYPE_MAX, &job_type, inner, sizeof(inner)) < 0 ||
	    cmd_int(c, "retries", 0, WF_RETRIES_MAX, 0, &retries, inner, sizeof(inner)) < 0) {
		snprintf(why, wlen, "\"compensate\": %s", inner);
		return -1;
	}
	return 0;
}

/*
 * A duration of at most WF_DURATION_MAX_DAYS (whole days: P3650DT23H
 * passes), or an RFC 3339 time: what iso8601.h reads, which PostgreSQL
 * reads too. Returns 0, or -1 with why.
 */
static int check_time(const char *v, int is_time, char *why, size_t wlen)
{
	int64_t us;

	if (is_time)
		return iso8601_time(v, NULL, why, wlen);
	if (iso8601_duration(v, &us, why, wlen) < 0)
		return -1;
	if (us / (86400LL * 1000000LL) > WF_DURATION_MAX_DAYS) {
		snprintf(why, wlen, "at most P%ldD", WF_DURATION_MAX_DAYS);
		return -1;
	}
	return 0;
}

/* wf_steps_time_member(): see wf_steps.h. */
int wf_steps_time_member(struct json_object *st, const char *name, int is_time, const char *where,
                         const char **out, char *detail, size_t dlen)
{
	const char *v;
	char why[160];

	*out = NULL;
	if (cmd_text(st, name, 0, 64, &v, why, sizeof(why)) < 0) {
		snprintf(detail, dlen, "%s%s%s", where, where[0] ? ": " : "", why);
		return -1;
	}
	*out = v;
	if (v == NULL)
		return 0;
	if (check_time(v, is_time, why, sizeof(why)) == 0)
		return 0;
	snprintf(detail, dlen, "%s%s\"%s\": %s", where, where[0] ? ": " : "", name, why);
	return -1;
}

/* Check one step definition (index i, 0-based) against the ones before.
 * On failure *kind says how: P_INVALID_DURATION for a malformed duration
 * or time, else it is left alone (P_INVALID_WORKFLOW). */
static int validate_step(struct json_object *steps, size_t i, enum problem_kind *kind, char *detail,
                         size_t dlen)
{
	static const char *const members[] = { "name",       "job_type",  "wait_for", "retries",
		                               "sleep",      "until",     "timeout",  "on_timeout",
		                               "on_failure", "resumable", "priority", "compensate",
		                               NULL };
	struct json_object *st = json_object_array_get_idx(steps, i);
	const char *name, *job_type, *wait_for, *on_timeout, *on_failure, *v;
	char why[200], where[24];
	long retries, priority;
	int kinds;

	if (!json_object_is_type(st, json_type_object)) {
		snprintf(detail, dlen, "step %zu must be a JSON object", i + 1);
		return -1;
	}
	if (cmd_members(st, members, why, sizeof(why)) < 0 ||
	    cmd_text(st, "name", 1, WF_NAME_MAX, &name, why, sizeof(why)) < 0 ||
	    cmd_text(st, "job_type", 0, WF_TYPE_MAX, &job_type, why, sizeof(why)) < 0 ||
	    cmd_text(st, "wait_for", 0, WF_TYPE_MAX, &wait_for, why, sizeof(why)) < 0 ||
	    cmd_text(st, "on_timeout", 0, WF_NAME_MAX, &on_timeout, why, sizeof(why)) < 0 ||
	    cmd_int(st, "retries", 0, WF_RETRIES_MAX, 0, &retries, why, sizeof(why)) < 0 ||
	    cmd_int(st, "priority", 0, WF_PRIORITY_MAX, 0, &priority, why, sizeof(why)) < 0 ||
	    validate_failure(st, &on_failure, why, sizeof(why)) < 0 ||
	    validate_compensate(st, why, sizeof(why)) < 0)
		goto bad;
	snprintf(where, sizeof(where), "step %zu", i + 1);
	if (wf_steps_time_member(st, "sleep", 0, where, &v, detail, dlen) < 0 ||
	    wf_steps_time_member(st, "until", 1, where, &v, detail, dlen) < 0 ||
	    wf_steps_time_member(st, "timeout", 0, where, &v, detail, dlen) < 0) {
		*kind = P_INVALID_DURATION;
		return -1;
	}
	kinds = (job_type != NULL) + (wait_for != NULL) +
	        json_object_object_get_ex(st, "sleep", NULL) +
	        json_object_object_get_ex(st, "until", NULL);
	if (kinds != 1) {
		snprintf(why, sizeof(why),
		         "a step has exactly one of \"job_type\", \"wait_for\", \"sleep\" and "
		         "\"until\"");
		goto bad;
	}
	if (job_type == NULL && json_object_object_get_ex(st, "retries", NULL)) {
		snprintf(why, sizeof(why), "only a job step has \"retries\"");
		goto bad;
	}
	if (job_type == NULL && json_object_object_get_ex(st, "priority", NULL)) {
		snprintf(why, sizeof(why),
		         "only a job step has \"priority\": it orders the activation of jobs");
		goto bad;
	}
	if (job_type == NULL &&
	    (on_failure != NULL || json_object_object_get_ex(st, "resumable", NULL))) {
		snprintf(why, sizeof(why),
		         "only a job step has \"on_failure\" and \"resumable\": only a job fails");
		goto bad;
	}
	if (job_type == NULL && json_object_object_get_ex(st, "compensate", NULL)) {
		snprintf(
		    why, sizeof(why),
		    "only a job step has \"compensate\": a wait or a timer has nothing to undo");
		goto bad;
	}
	if (wait_for == NULL && (json_object_object_get_ex(st, "timeout", NULL) ||
	                         json_object_object_get_ex(st, "on_timeout", NULL))) {
		snprintf(why, sizeof(why), "only a wait step has \"timeout\" and \"on_timeout\"");
		goto bad;
	}
	if (on_timeout != NULL && !json_object_object_get_ex(st, "timeout", NULL)) {
		snprintf(why, sizeof(why), "\"on_timeout\" needs a \"timeout\"");
		goto bad;
	}
	if (on_timeout != NULL) {
		/* A later step: a step begins once, so a workflow only moves on. */
		size_t n = json_object_array_length(steps), k;
		for (k = i + 1; k < n; k++) {
			struct json_object *other = json_object_array_get_idx(steps, k), *nm;
			if (json_object_is_type(other, json_type_object) &&
			    json_object_object_get_ex(other, "name", &nm) &&
			    json_object_is_type(nm, json_type_string) &&
			    strcmp(json_object_get_string(nm), on_timeout) == 0)
				break;
		}
		if (k == n) {
			snprintf(
			    why, sizeof(why),
			    "\"on_timeout\" names no later step: \"%.64s\" is not the name of a "
			    "step after this one",
			    on_timeout);
			goto bad;
		}
	}
	for (size_t k = 0; k < i; k++) {
		struct json_object *other, *n;
		other = json_object_array_get_idx(steps, k);
		if (json_object_object_get_ex(other, "name", &n) &&
		    strcmp(json_object_get_string(n), name) == 0) {
			snprintf(why, sizeof(why), "the name \"%s\" is already step %zu's", name,
			         k + 1);
			goto bad;
		}
	}
	return 0;
bad:
	snprintf(detail, dlen, "step %zu: %s", i + 1, why);
	return -1;
}

/* The steps member of a create body: 1 to WF_STEPS_MAX valid steps. */
static int check_steps(struct json_object *steps, enum problem_kind *kind, char *detail,
                       size_t dlen)
{
	size_t n;

	if (!json_object_is_type(steps, json_type_array)) {
		snprintf(detail, dlen, "\"steps\" must be an array");
		return -1;
	}
	n = json_object_array_length(steps);
	if (n == 0 || n > WF_STEPS_MAX) {
		snprintf(detail, dlen, "\"steps\" must hold 1 to %d steps", WF_STEPS_MAX);
		return -1;
	}
	for (size_t i = 0; i < n; i++)
		if (validate_step(steps, i, kind, detail, dlen) < 0)
			return -1;
	return 0;
}

int wf_steps_body(struct json_object *root, struct wf_body *b, enum problem_kind *kind,
                  char *detail, size_t dlen)
{
	static const char *const members[] = { "type",         "input",    "steps",
		                               "business_key", "priority", NULL };
	const char *type;

	memset(b, 0, sizeof(*b));
	if (cmd_members(root, members, detail, dlen) < 0 ||
	    cmd_text(root, "type", 1, WF_TYPE_MAX, &type, detail, dlen) < 0 ||
	    cmd_object(root, "input", &b->input, detail, dlen) < 0 ||
	    cmd_text(root, "business_key", 0, WF_BUSINESS_KEY_MAX, &b->business_key, detail, dlen) <
	        0 ||
	    cmd_int(root, "priority", 0, WF_PRIORITY_MAX, -1, &b->priority, detail, dlen) < 0)
		return -1;
	json_object_object_get_ex(root, "type", &b->type);
	if (!json_object_object_get_ex(root, "steps", &b->steps) || b->steps == NULL)
		return 0;
	return check_steps(b->steps, kind, detail, dlen);
}
