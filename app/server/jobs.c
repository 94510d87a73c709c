/*
 * jobs.c - POST /v1/jobs/activate, /v1/jobs/{key}/complete, /fail and
 * /heartbeat.
 *
 * A job's key is "<workflow id>.s<step>": stable across activations,
 * retries and replays, so a worker can hand it to an external provider as
 * that provider's idempotency key, and a second charge of the same step is
 * refused by the provider even when this service handed the job out twice
 * (after a lease ran out). The job that compensates step k is
 * "<workflow id>.c<k>", its row step -k (sql/016_engine.sql).
 */
#include "server/jobs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/canon.h"
#include "core/ids.h"
#include "server/cmd.h"
#include "server/queries.h"

#define JOBS_WORKER_MAX 128
#define JOBS_TYPE_MAX   128
#define JOBS_ERROR_MAX  1000
#define JOBS_MAX_JOBS   100
#define JOBS_LEASE_MAX  86400 /* seconds: one day */
#define JOBS_STEP_MAX   32    /* as WF_STEPS_MAX */
/* A heartbeat's progress, canonical: a few counters and a message, not a
 * result (as jobs.progress's CHECK in sql/009_incidents.sql). */
#define JOBS_PROGRESS_MAX 4096

/* Columns of idemflow_job_row after (problem, detail). */
enum {
	C_WORKFLOW = 2,
	C_STEP,
	C_NAME,
	C_JOB_TYPE,
	C_STATE,
	C_WORKER,
	C_DEADLINE,
	C_ACTIVATIONS,
	C_RETRIES,
	C_OUTPUT,
	C_ERROR,
	C_INPUT,
	C_WF_STATE,
	C_PROGRESS, /* Q_JOB_HEARTBEAT only */
};

int jobs_parse_key(const char *key, size_t len, char *wf, int *step)
{
	char *end;
	long n;

	if (len < IDS_UUID_LEN + 3 || len > IDS_UUID_LEN + 4 || key[IDS_UUID_LEN] != '.' ||
	    (key[IDS_UUID_LEN + 1] != 's' && key[IDS_UUID_LEN + 1] != 'c'))
		return -1;
	memcpy(wf, key, IDS_UUID_LEN);
	wf[IDS_UUID_LEN] = '\0';
	if (!ids_is_uuid(wf) || key[IDS_UUID_LEN + 2] < '1' || key[IDS_UUID_LEN + 2] > '9')
		return -1;
	n = strtol(key + IDS_UUID_LEN + 2, &end, 10);
	if (end != key + len || n > JOBS_STEP_MAX)
		return -1;
	*step = key[IDS_UUID_LEN + 1] == 'c' ? -(int)n : (int)n;
	return 0;
}

static void write_text(struct buf *out, const char *name, const char *s)
{
	buf_printf(out, ",\"%s\":", name);
	canon_write_string(out, s, strlen(s));
}

/* Append stored JSON text in canonical form. */
static int write_json(struct buf *out, const char *name, const char *text, size_t len,
                      struct err *e)
{
	buf_printf(out, ",\"%s\":", name);
	return canon_recanon(out, text, len, e);
}

/* Append a stored JSON column of row i when res has it and it is not
 * NULL. */
static int write_json_column(struct buf *out, const PGresult *res, int i, const char *name,
                             struct err *e)
{
	const int c = PQfnumber(res, name);

	if (c < 0 || PQgetisnull(res, i, c))
		return 0;
	return write_json(out, name, PQgetvalue(res, i, c), (size_t)PQgetlength(res, i, c), e);
}

/* Append the job in row i of res, with its progress when progress is set
 * (the rows of Q_JOB_HEARTBEAT). Its trace context, when res has the
 * columns (an activation) and the job has one, goes with it, and so do
 * the outputs of the steps before it ("steps") and, for a compensating
 * job, the step it undoes ("compensates"). */
static int write_job(struct buf *out, const PGresult *res, int i, int progress, struct err *e)
{
	const char *wf = PQgetvalue(res, i, C_WORKFLOW);
	const int tp = PQfnumber(res, "traceparent"), ts = PQfnumber(res, "tracestate");
	const int pr = PQfnumber(res, "priority");
	const long step = strtol(PQgetvalue(res, i, C_STEP), NULL, 10);

	buf_printf(out, "{\"key\":\"%s.%c%ld\",\"workflow_id\":\"%s\",\"step\":%ld", wf,
	           step < 0 ? 'c' : 's', labs(step), wf, labs(step));
	write_text(out, "name", PQgetvalue(res, i, C_NAME));
	write_text(out, "job_type", PQgetvalue(res, i, C_JOB_TYPE));
	write_text(out, "state", PQgetvalue(res, i, C_STATE));
	if (!PQgetisnull(res, i, C_WORKER))
		write_text(out, "worker", PQgetvalue(res, i, C_WORKER));
	if (!PQgetisnull(res, i, C_DEADLINE))
		write_text(out, "deadline", PQgetvalue(res, i, C_DEADLINE));
	buf_printf(out, ",\"activations\":%s,\"retries_left\":%s",
	           PQgetvalue(res, i, C_ACTIVATIONS), PQgetvalue(res, i, C_RETRIES));
	if (pr >= 0 && !PQgetisnull(res, i, pr))
		buf_printf(out, ",\"priority\":%s", PQgetvalue(res, i, pr));
	if (!PQgetisnull(res, i, C_ERROR))
		write_text(out, "error", PQgetvalue(res, i, C_ERROR));
	if (!PQgetisnull(res, i, C_OUTPUT) &&
	    write_json(out, "output", PQgetvalue(res, i, C_OUTPUT),
	               (size_t)PQgetlength(res, i, C_OUTPUT), e) < 0)
		return err_set(e, ERR_INTERNAL, "stored output of job %s.%c%ld is not valid JSON",
		               wf, step < 0 ? 'c' : 's', labs(step));
	if (!PQgetisnull(res, i, C_INPUT) &&
	    write_json(out, "input", PQgetvalue(res, i, C_INPUT),
	               (size_t)PQgetlength(res, i, C_INPUT), e) < 0)
		return err_set(e, ERR_INTERNAL, "stored input of workflow %s is not valid JSON",
		               wf);
	if (write_json_column(out, res, i, "steps", e) < 0 ||
	    write_json_column(out, res, i, "compensates", e) < 0)
		return err_set(e, ERR_INTERNAL, "stored outputs of workflow %s are not valid JSON",
		               wf);
	if (progress && !PQgetisnull(res, i, C_PROGRESS) &&
	    write_json(out, "progress", PQgetvalue(res, i, C_PROGRESS),
	               (size_t)PQgetlength(res, i, C_PROGRESS), e) < 0)
		return err_set(e, ERR_INTERNAL, "stored progress of job %s.%c%ld is not valid JSON",
		               wf, step < 0 ? 'c' : 's', labs(step));
	if (tp >= 0 && !PQgetisnull(res, i, tp)) {
		write_text(out, "traceparent", PQgetvalue(res, i, tp));
		if (ts >= 0 && !PQgetisnull(res, i, ts))
			write_text(out, "tracestate", PQgetvalue(res, i, ts));
	}
	buf_putc(out, '}');
	return 0;
}

static int render_activate(struct handler_ctx *ctx, const struct http_req *req,
                           struct http_resp *resp, const PGresult *res, const struct cmd *c,
                           struct err *e)
{
	int truncated = 0;

	resp->status = 200;
	resp->content_type = "application/json";
	buf_puts(&resp->body, "{\"jobs\":[");
	for (int i = 0; i < PQntuples(res); i++) {
		/* The last row has no job when max_answer stopped the activation
		 * (sql/013_limits.sql): the jobs left out were not touched. */
		if (PQgetisnull(res, i, C_WORKFLOW)) {
			truncated = 1;
			continue;
		}
		if (i > 0)
			buf_putc(&resp->body, ',');
		if (write_job(&resp->body, res, i, 0, e) < 0)
			return -1;
	}
	buf_puts(&resp->body, truncated ? "],\"truncated\":true}" : "]}");
	return 0;
}

static int render_job(struct handler_ctx *ctx, const struct http_req *req, struct http_resp *resp,
                      const PGresult *res, const struct cmd *c, struct err *e)
{
	if (PQntuples(res) != 1)
		return err_set(e, ERR_INTERNAL, "job command returned %d rows", PQntuples(res));
	resp->status = 200;
	resp->content_type = "application/json";
	return write_job(&resp->body, res, 0, c->stmt == Q_JOB_HEARTBEAT, e);
}

void jobs_activate(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp)
{
	static const char *const members[] = { "job_type", "worker", "max_jobs", "lease_seconds",
		                               NULL };
	struct json_object *root;
	const char *type, *worker;
	long max_jobs, lease;
	char tenant[24], nmax[16], interval[40], budget[24], detail[300], fp_text[IDEM_FP_TEXT];

	root = cmd_read_json(ctx, req, resp, 0);
	if (root == NULL)
		return;
	if (cmd_members(root, members, detail, sizeof(detail)) < 0 ||
	    cmd_text(root, "job_type", 1, JOBS_TYPE_MAX, &type, detail, sizeof(detail)) < 0 ||
	    cmd_text(root, "worker", 1, JOBS_WORKER_MAX, &worker, detail, sizeof(detail)) < 0 ||
	    cmd_int(root, "max_jobs", 1, JOBS_MAX_JOBS, 1, &max_jobs, detail, sizeof(detail)) < 0 ||
	    cmd_int(root, "lease_seconds", 1, JOBS_LEASE_MAX, 30, &lease, detail, sizeof(detail)) <
	        0) {
		handler_problem(resp, req, P_INVALID_REQUEST, detail);
		goto out;
	}
	if (cmd_fingerprint(ctx, req, resp, root, fp_text) < 0)
		goto out;
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	snprintf(nmax, sizeof(nmax), "%ld", max_jobs);
	snprintf(interval, sizeof(interval), "%ld seconds", lease);
	snprintf(budget, sizeof(budget), "%ld", ctx->conf->max_answer);
	const char *p[JOBS_ACTIVATE__N] = {
		[JOBS_ACTIVATE_TENANT] = tenant,  [JOBS_ACTIVATE_JOB_TYPE] = type,
		[JOBS_ACTIVATE_WORKER] = worker,  [JOBS_ACTIVATE_MAX_JOBS] = nmax,
		[JOBS_ACTIVATE_LEASE] = interval, [JOBS_ACTIVATE_BUDGET] = budget
	};
	const struct cmd cmd = { .stmt = Q_JOBS_ACTIVATE,
		                 .nparams = JOBS_ACTIVATE__N,
		                 .params = p,
		                 .fp_text = fp_text,
		                 .render = render_activate };
	cmd_run(ctx, req, resp, &cmd);
out:
	json_object_put(root);
}

void jobs_finish(struct handler_ctx *ctx, struct http_req *req, const char *key, const char *verb,
                 struct http_resp *resp)
{
	static const char *const complete_members[] = { "worker", "output", NULL };
	static const char *const fail_members[] = { "worker", "error", "retry_after_seconds",
		                                    NULL };
	const int complete = strcmp(verb, "complete") == 0;
	struct json_object *root, *output = NULL;
	const char *worker, *error = NULL;
	long retry_after = 0;
	char tenant[24], wf[IDS_UUID_LEN + 1], step[16], interval[40], detail[300];
	char fp_text[IDEM_FP_TEXT];
	size_t off;
	int n;

	root = cmd_read_json(ctx, req, resp, 0);
	if (root == NULL)
		return;
	if (cmd_members(root, complete ? complete_members : fail_members, detail, sizeof(detail)) <
	        0 ||
	    cmd_text(root, "worker", 1, JOBS_WORKER_MAX, &worker, detail, sizeof(detail)) < 0 ||
	    (complete && cmd_object(root, "output", &output, detail, sizeof(detail)) < 0) ||
	    (!complete &&
	     (cmd_text(root, "error", 0, JOBS_ERROR_MAX, &error, detail, sizeof(detail)) < 0 ||
	      cmd_int(root, "retry_after_seconds", 0, JOBS_LEASE_MAX, 0, &retry_after, detail,
	              sizeof(detail)) < 0))) {
		handler_problem(resp, req, P_INVALID_REQUEST, detail);
		goto out;
	}
	if (jobs_parse_key(key, strlen(key), wf, &n) < 0) {
		handler_problem(resp, req, P_NOT_FOUND, "no such job");
		goto out;
	}
	if (cmd_fingerprint(ctx, req, resp, root, fp_text) < 0)
		goto out;
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	snprintf(step, sizeof(step), "%d", n);
	if (complete) {
		if (cmd_json_param(ctx, req, resp, output, &off) < 0)
			goto out;
		const char *p[JOB_COMPLETE__N] = { [JOB_COMPLETE_TENANT] = tenant,
			                           [JOB_COMPLETE_WORKFLOW] = wf,
			                           [JOB_COMPLETE_STEP] = step,
			                           [JOB_COMPLETE_WORKER] = worker,
			                           [JOB_COMPLETE_OUTPUT] =
			                               ctx->scratch.data + off };
		const struct cmd cmd = { .stmt = Q_JOB_COMPLETE,
			                 .nparams = JOB_COMPLETE__N,
			                 .params = p,
			                 .fp_text = fp_text,
			                 .render = render_job };
		cmd_run(ctx, req, resp, &cmd);
	} else {
		snprintf(interval, sizeof(interval), "%ld seconds", retry_after);
		const char *p[JOB_FAIL__N] = {
			[JOB_FAIL_TENANT] = tenant, [JOB_FAIL_WORKFLOW] = wf,
			[JOB_FAIL_STEP] = step,     [JOB_FAIL_WORKER] = worker,
			[JOB_FAIL_ERROR] = error,   [JOB_FAIL_RETRY_AFTER] = interval
		};
		const struct cmd cmd = { .stmt = Q_JOB_FAIL,
			                 .nparams = JOB_FAIL__N,
			                 .params = p,
			                 .fp_text = fp_text,
			                 .render = render_job };
		cmd_run(ctx, req, resp, &cmd);
	}
out:
	json_object_put(root);
}

void jobs_heartbeat(struct handler_ctx *ctx, struct http_req *req, const char *key,
                    struct http_resp *resp)
{
	static const char *const members[] = { "worker", "lease_seconds", "progress", NULL };
	struct json_object *root, *progress;
	const char *worker;
	long lease;
	char tenant[24], wf[IDS_UUID_LEN + 1], step[16], interval[40], detail[300];
	char fp_text[IDEM_FP_TEXT];
	size_t off = 0, len;
	int n;

	root = cmd_read_json(ctx, req, resp, 0);
	if (root == NULL)
		return;
	if (cmd_members(root, members, detail, sizeof(detail)) < 0 ||
	    cmd_text(root, "worker", 1, JOBS_WORKER_MAX, &worker, detail, sizeof(detail)) < 0 ||
	    cmd_int(root, "lease_seconds", 1, JOBS_LEASE_MAX, 30, &lease, detail, sizeof(detail)) <
	        0 ||
	    cmd_object(root, "progress", &progress, detail, sizeof(detail)) < 0) {
		handler_problem(resp, req, P_INVALID_REQUEST, detail);
		goto out;
	}
	if (jobs_parse_key(key, strlen(key), wf, &n) < 0) {
		handler_problem(resp, req, P_NOT_FOUND, "no such job");
		goto out;
	}
	if (cmd_fingerprint(ctx, req, resp, root, fp_text) < 0)
		goto out;
	if (progress != NULL) {
		if (cmd_json_param(ctx, req, resp, progress, &off) < 0)
			goto out;
		/* Measured in the form it is kept in, so that reformatting
		 * cannot get a bigger one in. */
		len = strlen(ctx->scratch.data + off);
		if (len > JOBS_PROGRESS_MAX) {
			snprintf(
			    detail, sizeof(detail),
			    "\"progress\" is %zu bytes in canonical JSON; at most %d are kept: "
			    "report counters and a short message, not results",
			    len, JOBS_PROGRESS_MAX);
			handler_problem(resp, req, P_BODY_TOO_LARGE, detail);
			goto out;
		}
	}
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	snprintf(step, sizeof(step), "%d", n);
	snprintf(interval, sizeof(interval), "%ld seconds", lease);
	const char *p[JOB_HEARTBEAT__N] = { [JOB_HEARTBEAT_TENANT] = tenant,
		                            [JOB_HEARTBEAT_WORKFLOW] = wf,
		                            [JOB_HEARTBEAT_STEP] = step,
		                            [JOB_HEARTBEAT_WORKER] = worker,
		                            [JOB_HEARTBEAT_LEASE] = interval,
		                            [JOB_HEARTBEAT_PROGRESS] =
		                                progress != NULL ? ctx->scratch.data + off : NULL };
	const struct cmd cmd = { .stmt = Q_JOB_HEARTBEAT,
		                 .nparams = JOB_HEARTBEAT__N,
		                 .params = p,
		                 .fp_text = fp_text,
		                 .render = render_job };
	cmd_run(ctx, req, resp, &cmd);
out:
	json_object_put(root);
}
