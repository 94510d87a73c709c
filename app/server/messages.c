/*
 * messages.c - the two message routes: POST /v1/workflows/{id}/messages,
 * a message for one workflow, and POST /v1/messages, a message published
 * by business key (kept until its ttl when no workflow waits for it,
 * sql/010_timers.sql). Both are deduplicated by message_id within the
 * tenant, run a database function through the keyed runner (cmd.h) and
 * answer in one form (answer()).
 */
#include "server/messages.h"

#include "config.h"

#include <stdio.h>
#include <string.h>

#include "core/canon.h"
#include "core/ids.h"
#include "server/cmd.h"
#include "server/queries.h"
#include "server/wf_steps.h"

#define MESSAGES_ID_MAX 255
#define MESSAGES_TTL    "PT1H" /* a published message's ttl when none is given */

/*
 * The answer to a message, either route: {"message_id":..,"duplicate":..,
 * "correlated":..} and what the message met: the workflow (workflow_id,
 * when the route did not name it) and its step, or, not correlated, when
 * it expires. Each of the three strings may be NULL; correlated is
 * step != NULL. Strings borrowed.
 */
static void answer(struct http_resp *resp, int status, const char *message_id, int duplicate,
                   const char *workflow_id, const char *step, const char *expires_at)
{
	struct buf *b = &resp->body;

	resp->status = status;
	resp->content_type = "application/json";
	buf_puts(b, "{\"message_id\":");
	canon_write_string(b, message_id, strlen(message_id));
	buf_printf(b, ",\"duplicate\":%s,\"correlated\":%s", duplicate ? "true" : "false",
	           step != NULL ? "true" : "false");
	if (workflow_id != NULL)
		buf_printf(b, ",\"workflow_id\":\"%s\"", workflow_id);
	if (step != NULL)
		buf_printf(b, ",\"step\":%s", step);
	if (expires_at != NULL)
		buf_printf(b, ",\"expires_at\":\"%s\"", expires_at);
	buf_putc(b, '}');
}

/* idemflow_wf_message's row: (.., .., outcome, step or NULL). */
static int render_workflow(struct handler_ctx *ctx, const struct http_req *req,
                           struct http_resp *resp, const PGresult *res, const struct cmd *c,
                           struct err *e)
{
	const char *outcome;

	if (PQntuples(res) != 1)
		return err_set(e, ERR_INTERNAL, "idemflow_wf_message returned %d rows",
		               PQntuples(res));
	outcome = PQgetvalue(res, 0, 2);
	answer(resp, strcmp(outcome, "recorded") == 0 ? 202 : 200, c->arg,
	       strcmp(outcome, "duplicate") == 0, NULL,
	       PQgetisnull(res, 0, 3) ? NULL : PQgetvalue(res, 0, 3), NULL);
	return 0;
}

/* idemflow_message_publish's row: (.., .., outcome, workflow id or NULL,
 * step, expires_at). */
static int render_published(struct handler_ctx *ctx, const struct http_req *req,
                            struct http_resp *resp, const PGresult *res, const struct cmd *c,
                            struct err *e)
{
	const char *outcome;
	int delivered;

	if (PQntuples(res) != 1)
		return err_set(e, ERR_INTERNAL, "idemflow_message_publish returned %d rows",
		               PQntuples(res));
	outcome = PQgetvalue(res, 0, 2);
	delivered = !PQgetisnull(res, 0, 3);
	answer(resp, strcmp(outcome, "buffered") == 0 ? 202 : 200, c->arg,
	       strcmp(outcome, "duplicate") == 0, delivered ? PQgetvalue(res, 0, 3) : NULL,
	       delivered ? PQgetvalue(res, 0, 4) : NULL, delivered ? NULL : PQgetvalue(res, 0, 5));
	return 0;
}

void wf_message(struct handler_ctx *ctx, struct http_req *req, const char *id,
                struct http_resp *resp)
{
	static const char *const members[] = { "message_id", "name", "payload", NULL };
	struct json_object *root, *payload;
	const char *message_id, *name;
	char tenant[24], detail[300], fp_text[IDEM_FP_TEXT];
	size_t off;

	root = cmd_read_json(ctx, req, resp, 0);
	if (root == NULL)
		return;
	if (cmd_members(root, members, detail, sizeof(detail)) < 0 ||
	    cmd_text(root, "message_id", 1, MESSAGES_ID_MAX, &message_id, detail, sizeof(detail)) <
	        0 ||
	    cmd_text(root, "name", 1, WF_TYPE_MAX, &name, detail, sizeof(detail)) < 0 ||
	    cmd_object(root, "payload", &payload, detail, sizeof(detail)) < 0) {
		handler_problem(resp, req, P_INVALID_REQUEST, detail);
		goto out;
	}
	if (!ids_is_uuid(id)) {
		handler_problem(resp, req, P_NOT_FOUND, "no such workflow");
		goto out;
	}
	if (cmd_fingerprint(ctx, req, resp, root, fp_text) < 0)
		goto out;
	if (cmd_json_param(ctx, req, resp, payload, &off) < 0)
		goto out;
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	const char *p[WF_MESSAGE__N] = { [WF_MESSAGE_TENANT] = tenant,
		                         [WF_MESSAGE_ID] = id,
		                         [WF_MESSAGE_MESSAGE_ID] = message_id,
		                         [WF_MESSAGE_NAME] = name,
		                         [WF_MESSAGE_PAYLOAD] = ctx->scratch.data + off };
	const struct cmd cmd = { .stmt = Q_WF_MESSAGE,
		                 .nparams = WF_MESSAGE__N,
		                 .params = p,
		                 .fp_text = fp_text,
		                 .render = render_workflow,
		                 .arg = (void *)message_id };
	cmd_run(ctx, req, resp, &cmd);
out:
	json_object_put(root);
}

void wf_publish(struct handler_ctx *ctx, struct http_req *req, struct http_resp *resp)
{
	static const char *const members[] = { "name", "business_key", "message_id",
		                               "ttl",  "payload",      NULL };
	struct json_object *root, *payload;
	const char *message_id, *name, *key, *ttl;
	char tenant[24], ttl_max[24], detail[300], fp_text[IDEM_FP_TEXT];
	size_t off;

	root = cmd_read_json(ctx, req, resp, 0);
	if (root == NULL)
		return;
	if (cmd_members(root, members, detail, sizeof(detail)) < 0 ||
	    cmd_text(root, "name", 1, WF_TYPE_MAX, &name, detail, sizeof(detail)) < 0 ||
	    cmd_text(root, "business_key", 1, WF_BUSINESS_KEY_MAX, &key, detail, sizeof(detail)) <
	        0 ||
	    cmd_text(root, "message_id", 1, MESSAGES_ID_MAX, &message_id, detail, sizeof(detail)) <
	        0 ||
	    cmd_object(root, "payload", &payload, detail, sizeof(detail)) < 0) {
		handler_problem(resp, req, P_INVALID_REQUEST, detail);
		goto out;
	}
	if (wf_steps_time_member(root, "ttl", 0, "", &ttl, detail, sizeof(detail)) < 0) {
		handler_problem(resp, req, P_INVALID_DURATION, detail);
		goto out;
	}
	if (cmd_fingerprint(ctx, req, resp, root, fp_text) < 0)
		goto out;
	if (cmd_json_param(ctx, req, resp, payload, &off) < 0)
		goto out;
	snprintf(tenant, sizeof(tenant), "%ld", ctx->tenant_id);
	snprintf(ttl_max, sizeof(ttl_max), "%ld", ctx->conf->message_ttl_max);
	const char *p[MESSAGE_PUBLISH__N] = { [MESSAGE_PUBLISH_TENANT] = tenant,
		                              [MESSAGE_PUBLISH_MESSAGE_ID] = message_id,
		                              [MESSAGE_PUBLISH_NAME] = name,
		                              [MESSAGE_PUBLISH_BUSINESS_KEY] = key,
		                              [MESSAGE_PUBLISH_TTL] =
		                                  ttl != NULL ? ttl : MESSAGES_TTL,
		                              [MESSAGE_PUBLISH_PAYLOAD] = ctx->scratch.data + off,
		                              [MESSAGE_PUBLISH_TTL_MAX] = ttl_max };
	const struct cmd cmd = { .stmt = Q_MESSAGE_PUBLISH,
		                 .nparams = MESSAGE_PUBLISH__N,
		                 .params = p,
		                 .fp_text = fp_text,
		                 .render = render_published,
		                 .arg = (void *)message_id };
	cmd_run(ctx, req, resp, &cmd);
out:
	json_object_put(root);
}