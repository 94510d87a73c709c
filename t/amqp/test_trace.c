/*
 * test_trace.c - a request's W3C trace context follows its work, end to
 * end: through nginx into the pool, onto the request's log line, into
 * the database with the workflow, its job and its events, and out again
 * in the activated job, in the webhook's headers (t/lib/receiver), in
 * RabbitMQ's message headers (t/lib/amqpc) and in the exec sink's
 * environment. A malformed traceparent is no error: the request is
 * answered as usual and a new trace starts. Keyed replays stay byte for
 * byte what the first answer was, whatever trace the retry comes with.
 * t/run-test gives amqp/ tests the web stack and a RabbitMQ node.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "amqpc.h"
#include "receiver.h"
#include "tapi.h"
#include "tlog.h"
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

/* Every test runs the dispatcher, which takes every tenant's events. */
TSTACK_SEQUENTIAL
TestSuite(trace, .timeout = 90);

#define STATE "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"

/* A fresh valid traceparent: its trace id in tid (33 bytes). */
static void new_parent(char *tp, size_t tpsz, char *tid)
{
	char span[17];

	tstack_random_hex(tid, 16);
	tstack_random_hex(span, 8);
	snprintf(tp, tpsz, "00-%s-%s-01", tid, span);
}

/* POST path as t with the given trace headers (either may be NULL). */
static struct http_response *post_traced(const struct tstack_tenant *t, const char *path,
                                         const char *key, const char *body, const char *tp,
                                         const char *ts)
{
	char hkey[300], htp[700], hts[700];
	const char *h[6];
	int n = 0;
	struct http_response *r;

	h[n++] = t->auth;
	h[n++] = "Content-Type: application/json";
	if (key != NULL) {
		snprintf(hkey, sizeof(hkey), "Idempotency-Key: %s", key);
		h[n++] = hkey;
	}
	if (tp != NULL) {
		snprintf(htp, sizeof(htp), "traceparent: %s", tp);
		h[n++] = htp;
	}
	if (ts != NULL) {
		snprintf(hts, sizeof(hts), "tracestate: %s", ts);
		h[n++] = hts;
	}
	h[n] = NULL;
	r = http_request("POST", path, h, body, strlen(body));
	cr_assert_not_null(r, "POST %s: %s", path, http_error());
	return r;
}

/* Create a one-step workflow of type with the trace headers; its id. */
static char *create_traced(const struct tstack_tenant *t, const char *type, const char *tp,
                           const char *ts, char *request_id, size_t rsz)
{
	char key[80], body[256];
	struct http_response *r;
	char *id;

	tstack_key(key, sizeof(key), "trace");
	snprintf(body, sizeof(body),
	         "{\"type\":\"%s\",\"steps\":[{\"name\":\"a\",\"job_type\":\"%s\"}]}", type, type);
	r = post_traced(t, "/v1/workflows", key, body, tp, ts);
	tstack_expect_status(r, 201);
	id = tstack_json(r->body, "{id}");
	cr_assert_not_null(id);
	if (request_id != NULL)
		snprintf(request_id, rsz, "%s", http_header(r, "X-Request-Id"));
	http_response_free(r);
	return id;
}

/* The traceparent stored with the workflow's first event (malloc'ed). */
static char *event_parent(const char *wf)
{
	char *tp =
	    tstack_text("SELECT traceparent FROM outbox WHERE workflow_id = $1 AND seq = 1", wf);
	cr_assert_not_null(tp, "the event of %s has no traceparent", wf);
	return tp;
}

/* The trace id of a traceparent, checked for its shape. */
static void trace_id_of(const char *tp, char *tid)
{
	tstack_expect_match(tp, "^00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]$", "traceparent");
	memcpy(tid, tp + 3, 32);
	tid[32] = '\0';
}

static void dispatch(const char *args)
{
	char cmd[2048];
	int rc;

	snprintf(cmd, sizeof(cmd), "'%s' --db '%s' --once --backoff 50ms --timeout 3s %s",
	         tstack_env("IDEMFLOW_DISPATCH"), tstack_env("DATABASE_URL"), args);
	rc = system(cmd);
	cr_assert_eq(rc, 0, "idemflow-dispatch exited with %d: %s", rc, cmd);
}

/* The request line of request_id in the pool's log (malloc'ed), waiting
 * up to 3 s: the line follows the answer. */
static char *request_line(const char *request_id)
{
	char needle[96];
	double deadline = tstack_now() + 3;

	snprintf(needle, sizeof(needle), "request_id=%s ", request_id);
	for (;;) {
		FILE *f = fopen(tstack_env("IDEMFLOW_FCGI_LOG"), "r");
		char line[4096];

		while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
			if (strstr(line, needle) != NULL && strstr(line, "msg=request") != NULL) {
				fclose(f);
				return strdup(line);
			}
		}
		if (f != NULL)
			fclose(f);
		cr_assert_lt(tstack_now(), deadline, "no request line for %s", request_id);
		usleep(50000);
	}
}

Test(trace, one_traceparent_reaches_the_log_the_rows_the_job_and_the_webhook)
{
	struct tstack_tenant t;
	struct receiver rcv = { 0 };
	struct receiver_delivery *d = NULL;
	size_t n = 0;
	char tp[64], tid[33], rid[128], got[33], args[512], want[128];
	char *wf, *line, *stored, *job_tp;

	tstack_tenant_create(&t, "trace");
	new_parent(tp, sizeof(tp), tid);
	wf = create_traced(&t, "tr_http", tp, STATE, rid, sizeof(rid));

	/* The request's log line names the trace. */
	line = request_line(rid);
	snprintf(want, sizeof(want), " trace_id=%s ", tid);
	cr_assert_not_null(strstr(line, want), "the request line lacks %s: %s", want, line);
	cr_assert_not_null(strstr(line, " span_id="), "%s", line);

	/* The workflow, its job and its event keep the trace: this
	 * request's span as the parent, not the caller's. */
	stored = event_parent(wf);
	trace_id_of(stored, got);
	cr_assert_str_eq(got, tid);
	cr_assert_str_neq(stored, tp, "the parent passed on is the request's span");
	snprintf(want, sizeof(want), " span_id=%.16s ", stored + 36);
	cr_assert_not_null(strstr(line, want), "the parent passed on is the logged span: %s", line);
	cr_assert_eq(
	    tstack_count("SELECT count(*) FROM workflows WHERE id = $1 AND traceparent = $2"
	                 " AND tracestate = $3",
	                 wf, stored, STATE),
	    1);
	cr_assert_eq(
	    tstack_count("SELECT count(*) FROM jobs WHERE workflow_id = $1 AND traceparent "
	                 "= $2 AND tracestate = $3",
	                 wf, stored, STATE),
	    1);

	/* The activated job carries it; a keyed replay of the activation,
	 * sent with another trace, is the first answer byte for byte. */
	char key[80], other[64], other_tid[33];
	struct http_response *a, *b;
	tstack_key(key, sizeof(key), "act");
	new_parent(other, sizeof(other), other_tid);
	a = post_traced(&t, "/v1/jobs/activate", key,
	                "{\"job_type\":\"tr_http\",\"worker\":\"w1\",\"lease_seconds\":60}", other,
	                NULL);
	tstack_expect_status(a, 200);
	job_tp = tstack_json(a->body, "{jobs,0,traceparent}");
	cr_assert_not_null(job_tp, "the job has no traceparent: %s", a->body);
	cr_assert_str_eq(job_tp, stored);
	char *job_ts = tstack_json(a->body, "{jobs,0,tracestate}");
	cr_assert_not_null(job_ts);
	cr_assert_str_eq(job_ts, STATE);
	b = post_traced(&t, "/v1/jobs/activate", key,
	                "{\"job_type\":\"tr_http\",\"worker\":\"w1\",\"lease_seconds\":60}", tp,
	                NULL);
	tstack_expect_status(b, 200);
	tstack_expect_header(b, "Idempotent-Replayed", "true");
	cr_assert_eq(b->body_len, a->body_len);
	cr_assert_eq(memcmp(b->body, a->body, a->body_len), 0, "replay differs: %s", b->body);
	/* The activation's own event (workflow.started) is in the
	 * activation's trace: each request's work is in its own trace. */
	char *started =
	    tstack_text("SELECT traceparent FROM outbox WHERE workflow_id = $1 AND seq = 2", wf);
	cr_assert_not_null(started);
	trace_id_of(started, got);
	cr_assert_str_eq(got, other_tid);

	/* The webhook carries the event's trace context. */
	cr_assert_eq(receiver_start(&rcv, NULL), 0, "%s", rcv.error);
	snprintf(args, sizeof(args), "--sink http --url '%s'", rcv.url);
	dispatch(args);
	cr_assert_eq(receiver_deliveries(&rcv, &d, &n), 0, "%s", rcv.error);
	/* Other tests' events may go out in the same run: this workflow's
	 * are its created and started, in that order. */
	struct receiver_delivery *mine[2];
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (strstr(d[i].body, wf) != NULL && k < 2)
			mine[k++] = &d[i];
	cr_assert_eq(k, 2, "workflow.created and workflow.started, of %zu deliveries", n);
	cr_assert_not_null(mine[0]->traceparent, "no traceparent header");
	cr_assert_str_eq(mine[0]->traceparent, stored);
	cr_assert_not_null(mine[0]->tracestate, "no tracestate header");
	cr_assert_str_eq(mine[0]->tracestate, STATE);
	cr_assert_not_null(mine[1]->traceparent);
	cr_assert_str_eq(mine[1]->traceparent, started);
	cr_assert_null(mine[1]->tracestate, "the activation came without a tracestate");
	receiver_deliveries_free(d, n);
	receiver_stop(&rcv);
	http_response_free(a);
	http_response_free(b);
	free(job_tp);
	free(job_ts);
	free(started);
	free(stored);
	free(line);
	free(wf);
}

Test(trace, a_malformed_traceparent_is_answered_as_usual_with_a_new_trace)
{
	static const char *const bad[] = {
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", /* uppercase */
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", /* version ff */
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01", /* zero trace id */
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",    /* no flags */
		"garbage\ttab",
	};
	struct tstack_tenant t;
	char rid[128], got[33], want[128];

	tstack_tenant_create(&t, "trace-bad");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char *wf = create_traced(&t, "tr_bad", bad[i], STATE, rid, sizeof(rid));
		char *stored = event_parent(wf), *line;

		trace_id_of(stored, got);
		cr_assert_str_neq(got, "4bf92f3577b34da6a3ce929d0e0e4736");
		cr_assert_str_neq(got, "00000000000000000000000000000000");
		cr_assert_null(
		    tstack_text("SELECT tracestate FROM outbox WHERE workflow_id = $1", wf),
		    "tracestate is not kept without a valid traceparent");
		line = request_line(rid);
		snprintf(want, sizeof(want), " trace_id=%s ", got);
		cr_assert_not_null(strstr(line, want), "%s", line);
		free(line);
		free(stored);
		free(wf);
	}
	/* Without any header a trace starts as well, one per request. */
	char *w1 = create_traced(&t, "tr_bad", NULL, NULL, NULL, 0);
	char *w2 = create_traced(&t, "tr_bad", NULL, NULL, NULL, 0);
	char *p1 = event_parent(w1), *p2 = event_parent(w2);
	cr_assert_neq(strncmp(p1, p2, 35), 0, "two requests, two traces");
	free(p1);
	free(p2);
	free(w1);
	free(w2);
}

Test(trace, the_exec_sink_exports_traceparent_and_tracestate)
{
	struct tstack_tenant t;
	char tp[64], tid[33], dir[300], args[1400], path[400], got[1024] = "";
	char *wf, *stored;
	FILE *f;

	tstack_tenant_create(&t, "trace-exec");
	new_parent(tp, sizeof(tp), tid);
	wf = create_traced(&t, "tr_exec", tp, STATE, NULL, 0);
	stored = event_parent(wf);
	/* An activation without a key (its command alone, in the pipeline's
	 * implicit transaction) writes workflow.started in its own trace. */
	char tp2[64], tid2[33];
	struct http_response *a;
	new_parent(tp2, sizeof(tp2), tid2);
	a = post_traced(&t, "/v1/jobs/activate", NULL,
	                "{\"job_type\":\"tr_exec\",\"worker\":\"w\"}", tp2, NULL);
	tstack_expect_status(a, 200);
	http_response_free(a);
	char *started =
	    tstack_text("SELECT traceparent FROM outbox WHERE workflow_id = $1 AND seq = 2", wf);
	cr_assert_not_null(started, "workflow.started has no traceparent");
	cr_assert_eq(strncmp(started + 3, tid2, 32), 0, "%s is not in trace %s", started, tid2);
	snprintf(dir, sizeof(dir), "%s/trace-exec-%ld", tstack_env("IDEMFLOW_STACK_DIR"),
	         (long)getpid());
	cr_assert_eq(mkdir(dir, 0755), 0);
	snprintf(args, sizeof(args),
	         "--sink exec --exec 'printf \"%%s|%%s\\n\" \"$TRACEPARENT\" \"$TRACESTATE\" >"
	         " \"%s/$IDEMFLOW_EVENT_ID\"'",
	         dir);
	/* The dispatcher's own TRACEPARENT is not what a command gets. */
	setenv("TRACEPARENT", "00-11111111111111111111111111111111-1111111111111111-01", 1);
	dispatch(args);
	unsetenv("TRACEPARENT");
	snprintf(path, sizeof(path), "%s/%s.1", dir, wf);
	f = fopen(path, "r");
	cr_assert_not_null(f, "the command did not write %s", path);
	size_t n = fread(got, 1, sizeof(got) - 1, f);
	got[n] = '\0';
	fclose(f);
	char want[700];
	snprintf(want, sizeof(want), "%s|%s\n", stored, STATE);
	cr_assert_str_eq(got, want);
	cr_assert_eq(strncmp(stored + 3, tid, 32), 0);
	snprintf(path, sizeof(path), "%s/%s.2", dir, wf);
	f = fopen(path, "r");
	cr_assert_not_null(f, "the command did not write %s", path);
	n = fread(got, 1, sizeof(got) - 1, f);
	got[n] = '\0';
	fclose(f);
	snprintf(want, sizeof(want), "%s|\n", started);
	cr_assert_str_eq(got, want, "TRACESTATE is unset without one");
	free(started);
	free(stored);
	free(wf);
}

Test(trace, rabbitmq_messages_carry_traceparent_and_tracestate_headers)
{
	struct tstack_tenant t;
	struct amqpc c = { 0 };
	struct amqpc_msg m;
	char tp[64], tid[33], exchange[80], hex[13], args[1024];
	char *wf, *stored;

	tstack_tenant_create(&t, "trace-amqp");
	tstack_random_hex(hex, 6);
	snprintf(exchange, sizeof(exchange), "idf.test.trace.%s", hex);
	cr_assert_eq(amqpc_open(&c, tstack_env("IDEMFLOW_AMQP_URL"), exchange, "#"), 0, "%s",
	             c.error);
	new_parent(tp, sizeof(tp), tid);
	wf = create_traced(&t, "tr_amqp", tp, STATE, NULL, 0);
	stored = event_parent(wf);
	snprintf(args, sizeof(args), "--sink amqp --amqp-url '%s' --exchange '%s'",
	         tstack_env("IDEMFLOW_AMQP_URL"), exchange);
	dispatch(args);
	/* Other tests' pending events may go out in the same run. */
	for (int i = 0;; i++) {
		int rc = amqpc_next(&c, 5000, &m);
		cr_assert_eq(rc, 1, "no message of %s: %s", wf, c.error);
		if (strcmp(m.workflow_id, wf) == 0)
			break;
		cr_assert_lt(i, 100);
		amqpc_msg_free(&m);
	}
	cr_assert_str_eq(m.traceparent, stored);
	cr_assert_eq(strncmp(m.traceparent + 3, tid, 32), 0, "the caller's trace id");
	cr_assert_str_eq(m.tracestate, STATE);
	amqpc_msg_free(&m);
	amqpc_close(&c);
	free(stored);
	free(wf);
}
