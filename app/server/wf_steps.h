/*
 * wf_steps.h - the limits of a workflow's definition and the check of a
 * create body with its steps (POST /v1/workflows), and the check of a
 * duration or time member, which a published message's ttl shares.
 * Validation only: nothing here reads the database or answers a request.
 */
#ifndef IDF_WF_STEPS_H
#define IDF_WF_STEPS_H

#include <json-c/json.h>
#include <stddef.h>

#include "core/err.h"
#include "core/problem.h"

#define WF_TYPE_MAX         128 /* a workflow's type, a job type, a message name */
#define WF_NAME_MAX         64  /* a step's name */
#define WF_STEPS_MAX        32  /* as JOBS_STEP_MAX */
#define WF_BUSINESS_KEY_MAX 255
#define WF_RETRIES_MAX      100
#define WF_PRIORITY_MAX     9 /* a job's priority: 0 to 9, higher first */

/* The longest wait, sleep or message ttl: about ten years. */
#define WF_DURATION_MAX_DAYS 3650L

/* The members of a create body; all borrowed from the parsed body. */
struct wf_body {
	struct json_object *type;
	struct json_object *input; /* or NULL */
	struct json_object *steps; /* or NULL */
	const char *business_key;  /* or NULL */
	long priority;             /* 0 to WF_PRIORITY_MAX, or -1 when absent */
};

/*
 * Check root, a parsed create body (POST /v1/workflows), into *b: its
 * members, its type and business key within their limits, its priority
 * (0 to WF_PRIORITY_MAX, -1 when absent), and its steps,
 * an array of 1 to WF_STEPS_MAX step definitions, each valid on its own
 * and against the ones before. Returns 0, or -1 with detail filled; then
 * *kind is P_INVALID_DURATION for a malformed duration or time, else it
 * is left alone (the caller's P_INVALID_WORKFLOW).
 */
int wf_steps_body(struct json_object *root, struct wf_body *b, enum problem_kind *kind,
                  char *detail, size_t dlen) MUSTCHECK;

/*
 * The duration (or, when is_time, the RFC 3339 time) member name of obj,
 * if present, into *out (borrowed from obj; NULL when absent). A duration
 * is at most WF_DURATION_MAX_DAYS. Returns 0, or -1 with detail filled
 * ("<where>: "<name>": why", without "<where>: " when where is "").
 */
int wf_steps_time_member(struct json_object *obj, const char *name, int is_time, const char *where,
                         const char **out, char *detail, size_t dlen) MUSTCHECK;

#endif
