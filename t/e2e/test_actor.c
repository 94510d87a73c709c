/*
 * test_actor.c - who did it (sql/014_actor.sql), through nginx and the
 * worker pool: every key, workflow, outbox event, job and message records
 * the token whose request wrote it ("token:<api_tokens.id>"), what the
 * reaper's timers cause records "system:reaper", GET
 * /v1/workflows/{id}/events shows each event's actor (null for one
 * recorded before actors were), and the request's log line names the
 * token by its id.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "http.h"
#include "tapi.h"
#include "tlog.h"
#include "tsql.h"
#include "tstack.h"

TestSuite(actor, .timeout = 90);

/* --- Helpers ----------------------------------------------------------- */

/* "token:<id>" of t's newest token (the one t->auth carries). */
static void newest_actor(const struct tstack_tenant *t, char *out, size_t outsz)
{
	long id = tstack_count("SELECT max(id) FROM api_tokens WHERE tenant_id = $1", t->id_text);

	cr_assert(id > 0, "tenant %s has no token", t->name);
	snprintf(out, outsz, "token:%ld", id);
}

/* The workflow's events in seq order as "type=actor", from the outbox
 * ("-" for a NULL actor). */
static char *outbox_actors(const char *wf)
{
	return tstack_text(
	    "SELECT string_agg(type || '=' || coalesce(actor, '-'), ',' ORDER BY seq)"
	    "  FROM outbox WHERE workflow_id = $1",
	    wf);
}

/* The same from GET /v1/workflows/{id}/events ("null" for a JSON null). */
static char *history_actors(const struct tstack_tenant *t, const char *wf)
{
	struct http_response *r;
	char path[128], *v;

	snprintf(path, sizeof(path), "/v1/workflows/%s/events", wf);
	r = tstack_get(t, path);
	tstack_expect_status(r, 200);
	v = tstack_text("SELECT string_agg((e ->> 'type') || '=' ||"
	                "                  CASE jsonb_typeof(e -> 'actor') WHEN 'null' THEN 'null'"
	                "                       ELSE e ->> 'actor' END,"
	                "                  ',' ORDER BY (e ->> 'seq')::int)"
	                "  FROM jsonb_array_elements($1::jsonb -> 'events') e",
	                r->body);
	http_response_free(r);
	return v;
}

/* The request line of the pool's log for request_id, malloc'ed. */
static char *request_line(const char *request_id)
{
	const char *log = tstack_env("IDEMFLOW_FCGI_LOG");
	char needle[128], *text = NULL, *p, *line;
	size_t cap = 0, len = 0, n;
	FILE *f;

	cr_assert(tstack_worker_of(log, request_id) > 0, "no request line for %s in %s", request_id,
	          log);
	f = fopen(log, "r");
	cr_assert_not_null(f, "%s", log);
	do {
		if (len + 4096 + 1 > cap) {
			cap = (cap + 4096) * 2;
			text = realloc(text, cap);
			cr_assert_not_null(text);
		}
		n = fread(text + len, 1, 4096, f);
		len += n;
	} while (n > 0);
	fclose(f);
	text[len] = '\0';
	snprintf(needle, sizeof(needle), "request_id=%s ", request_id);
	p = strstr(text, needle);
	cr_assert_not_null(p, "no line with %s", needle);
	while (p > text && p[-1] != '\n')
		p--;
	line = strndup(p, strcspn(p, "\n"));
	free(text);
	return line;
}

/* The log line of r's request has " actor=<want>" (want NULL: no actor). */
static void expect_logged_actor(const struct http_response *r, const char *want)
{
	const char *rid = http_header(r, "X-Request-Id");
	char field[64], *line;

	cr_assert_not_null(rid, "no X-Request-Id");
	line = request_line(rid);
	if (want != NULL) {
		snprintf(field, sizeof(field), " actor=%s ", want);
		cr_assert_not_null(strstr(line, field), "no \"%s\" in: %s", field, line);
	} else {
		cr_assert_null(strstr(line, " actor="), "an actor in: %s", line);
	}
	free(line);
}

static struct http_response *activate(const struct tstack_tenant *t, const char *type,
                                      const char *worker)
{
	char body[256];

	snprintf(body, sizeof(body),
	         "{\"job_type\":\"%s\",\"worker\":\"%s\",\"max_jobs\":1,\"lease_seconds\":60}",
	         type, worker);
	return tstack_post(t, "/v1/jobs/activate", NULL, body);
}

/* --- Tests ------------------------------------------------------------- */

Test(actor, a_keyed_create_records_its_token_on_key_workflow_event_and_log_line)
{
	struct tstack_tenant t;
	struct http_response *r, *again;
	char key[128], creator[32], other[32], want[128], *id, *v;

	tstack_tenant_create(&t, "actor-create");
	newest_actor(&t, creator, sizeof(creator));
	tstack_key(key, sizeof(key), "actor");
	r = tstack_post(&t, "/v1/workflows", key, "{\"type\":\"a\",\"input\":{\"n\":1}}");
	id = tstack_expect_created(r, "a", "{\"n\":1}");

	v = tstack_text("SELECT actor FROM idempotency_keys WHERE tenant_id = $1 AND key = $2",
	                t.id_text, key);
	cr_assert_str_eq(v, creator, "the key's actor");
	free(v);
	v = tstack_text("SELECT actor FROM workflows WHERE tenant_id = $1 AND id = $2", t.id_text,
	                id);
	cr_assert_str_eq(v, creator, "the workflow's actor");
	free(v);
	snprintf(want, sizeof(want), "workflow.created=%s", creator);
	v = outbox_actors(id);
	cr_assert_str_eq(v, want);
	free(v);
	v = history_actors(&t, id);
	cr_assert_str_eq(v, want);
	free(v);
	expect_logged_actor(r, creator);

	/* A replay by another token of the tenant: the log names the token
	 * that asked; the key keeps the one that made it. */
	tstack_tenant_retoken(&t);
	newest_actor(&t, other, sizeof(other));
	cr_assert_str_neq(other, creator);
	again = tstack_post(&t, "/v1/workflows", key, "{\"type\":\"a\",\"input\":{\"n\":1}}");
	tstack_expect_replay(again, r);
	expect_logged_actor(again, other);
	v = tstack_text("SELECT actor FROM idempotency_keys WHERE tenant_id = $1 AND key = $2",
	                t.id_text, key);
	cr_assert_str_eq(v, creator, "a replay changes nothing");
	free(v);
	http_response_free(again);

	/* Unauthenticated: no actor on the line. */
	{
		struct tstack_tenant bad = t;
		snprintf(bad.auth, sizeof(bad.auth), "Authorization: Bearer idf_not_a_token");
		again = tstack_post(&bad, "/v1/workflows", key, "{\"type\":\"a\",\"input\":{}}");
		tstack_expect_status(again, 401);
		expect_logged_actor(again, NULL);
		http_response_free(again);
	}
	http_response_free(r);
	free(id);
}

Test(actor, each_command_records_the_token_that_sent_it_on_its_events_jobs_and_messages)
{
	struct tstack_tenant t;
	struct http_response *r;
	char creator[32], worker[32], sender[32], want[512], path[160], *wf, *v;

	tstack_tenant_create(&t, "actor-steps");
	newest_actor(&t, creator, sizeof(creator));
	/* A create with steps runs through the pipeline (a database function). */
	wf = tstack_create(&t, "{\"type\":\"s\",\"steps\":[{\"name\":\"do\",\"job_type\":\"act\"},"
	                       "{\"name\":\"hear\",\"wait_for\":\"go\"}]}");

	tstack_tenant_retoken(&t);
	newest_actor(&t, worker, sizeof(worker));
	r = activate(&t, "act", "w1");
	tstack_expect_status(r, 200);
	http_response_free(r);
	snprintf(path, sizeof(path), "/v1/jobs/%s.s1/complete", wf);
	r = tstack_post(&t, path, NULL, "{\"worker\":\"w1\",\"output\":{}}");
	tstack_expect_status(r, 200);
	expect_logged_actor(r, worker);
	http_response_free(r);

	tstack_tenant_retoken(&t);
	newest_actor(&t, sender, sizeof(sender));
	snprintf(path, sizeof(path), "/v1/workflows/%s/messages", wf);
	r = tstack_post(&t, path, NULL, "{\"message_id\":\"m-1\",\"name\":\"go\"}");
	tstack_expect_status(r, 200);
	http_response_free(r);

	snprintf(want, sizeof(want),
	         "workflow.created=%s,workflow.started=%s,job.completed=%s,job.completed=%s,"
	         "workflow.completed=%s",
	         creator, worker, worker, sender, sender);
	v = outbox_actors(wf);
	cr_assert_str_eq(v, want);
	free(v);
	v = history_actors(&t, wf);
	cr_assert_str_eq(v, want);
	free(v);
	/* The jobs: the first step's began with the create, the second with
	 * the completion of the first. */
	snprintf(want, sizeof(want), "1=%s,2=%s", creator, worker);
	v = tstack_text("SELECT string_agg(step || '=' || coalesce(actor, '-'), ',' ORDER BY step)"
	                "  FROM jobs WHERE workflow_id = $1",
	                wf);
	cr_assert_str_eq(v, want);
	free(v);
	v = tstack_text("SELECT actor FROM workflows WHERE id = $1", wf);
	cr_assert_str_eq(v, creator);
	free(v);
	v = tstack_text("SELECT actor FROM messages WHERE tenant_id = $1 AND message_id = 'm-1'",
	                t.id_text);
	cr_assert_str_eq(v, sender);
	free(v);
	free(wf);
}

Test(actor, what_a_timer_causes_is_the_reapers_and_an_event_from_before_shows_null)
{
	struct tstack_tenant t;
	char creator[32], want[512], out[256], *wf, *v;
	int rc;

	tstack_tenant_create(&t, "actor-reaper");
	newest_actor(&t, creator, sizeof(creator));
	wf = tstack_create(&t, "{\"type\":\"r\",\"steps\":[{\"name\":\"nap\",\"sleep\":\"PT0S\"},"
	                       "{\"name\":\"then\",\"job_type\":\"after-nap\"}]}");
	rc = tstack_cli(out, sizeof(out), "reap", NULL);
	cr_assert_eq(rc, 0, "reap exited %d: %s", rc, tstack_cli_stderr());

	snprintf(want, sizeof(want),
	         "workflow.created=%s,workflow.started=system:reaper,timer.fired=system:reaper",
	         creator);
	v = outbox_actors(wf);
	cr_assert_str_eq(v, want);
	free(v);
	v = history_actors(&t, wf);
	cr_assert_str_eq(v, want);
	free(v);
	v = tstack_text("SELECT actor FROM jobs WHERE workflow_id = $1 AND step = 2", wf);
	cr_assert_str_eq(v, "system:reaper", "the step the timer began");
	free(v);

	/* An event recorded before actors were (or by an older server). */
	tstack_exec(tstack_db(),
	            "UPDATE outbox SET actor = NULL WHERE workflow_id = $1 AND seq = 1", wf);
	v = history_actors(&t, wf);
	cr_assert_str_eq(v, "workflow.created=null,workflow.started=system:reaper,"
	                    "timer.fired=system:reaper");
	free(v);
	free(wf);
}
