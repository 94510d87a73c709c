/*
 * test_nats.c - the NATS JetStream sink against a real nats-server.
 *
 * The sink alone: each event is stored once, on "<prefix>.<type>", with
 * its event id as Nats-Msg-Id, the AMQP sink's headers and the payload
 * byte for byte; a second delivery is acknowledged as a duplicate and
 * stored nowhere; a subject no stream takes, an expected stream that is
 * another, nothing listening, a server that went away, an event beyond
 * max_payload and no acknowledgement in time are retries with their
 * reason; an event that cannot be sent (a line break in an id, a
 * type that is no subject) is dead; a failed event holds back the later
 * events of its workflow; bad configuration names its key.
 *
 * idemflow-dispatch with it: killed between publishing and recording, the
 * rerun leaves one message per event id and counts the broker's
 * duplicates; past the duplicate window the stream takes the event again
 * and the consumer's inbox absorbs it; a server stopped in the middle of a
 * batch loses nothing; without a stream the events stay pending, then die.
 *
 * t/run-test gives nats/ tests PostgreSQL (migrated) and a private
 * nats-server with JetStream ($IDEMFLOW_NATS_URL). The dispatcher drains
 * every tenant's outbox and a test stops the server: one test at a time.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/conf.h"
#include "core/db.h"
#include "dispatch/sink.h"
#include "inbox/inbox.h"
#include "tapi.h"
#include "tdispatch.h"
#include "tlog.h"
#include "tnats.h"
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

TSTACK_SEQUENTIAL

#define MAX_EVENTS  16
#define TRACEPARENT "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
#define TRACESTATE  "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"

/* A batch of events with storage for everything they point to. */
struct batch {
	size_t n;
	struct sink_event ev[MAX_EVENTS];
	struct sink_outcome out[MAX_EVENTS];
	char id[MAX_EVENTS][64];
	char wf[MAX_EVENTS][40];
	char payload[MAX_EVENTS][192];
};

static const char *const types[] = { "workflow.created", "workflow.completed" };

static struct tnats nats;
static char stream[48], prefix[48];

/* A stream of this test's own, taking <prefix>.> (prefix "idf.<hex>"). */
static void stream_own(long dup_window_ms)
{
	char hex[13], subjects[64];

	tstack_random_hex(hex, 6);
	snprintf(stream, sizeof(stream), "IDF_%s", hex);
	snprintf(prefix, sizeof(prefix), "idf.%s", hex);
	snprintf(subjects, sizeof(subjects), "%s.>", prefix);
	tnats_stream_add(&nats, stream, subjects, dup_window_ms);
}

static void setup(void)
{
	tnats_connect(&nats);
	stream[0] = '\0';
}

static void teardown(void)
{
	if (stream[0])
		tnats_stream_delete(&nats, stream);
	tnats_close(&nats);
}

/* n events of alternating types, each of its own workflow; payloads differ
 * and are not plain ASCII. */
static void batch_fill(struct batch *b, size_t n, const char *label)
{
	char wf[37];

	cr_assert(n <= MAX_EVENTS);
	memset(b, 0, sizeof(*b));
	b->n = n;
	for (size_t i = 0; i < n; i++) {
		tstack_uuid(wf);
		snprintf(b->wf[i], sizeof(b->wf[i]), "%s", wf);
		snprintf(b->id[i], sizeof(b->id[i]), "%s.%zu", wf, i + 1);
		snprintf(b->payload[i], sizeof(b->payload[i]),
		         "{\"event_id\":\"%s\",\"label\":\"%s\",\"n\":%zu,\"s\":\"caf\xc3\xa9 "
		         "\\\"q\\\"\"}",
		         b->id[i], label, i);
		b->ev[i] = (struct sink_event){ .event_id = b->id[i],
			                        .type = types[i % 2],
			                        .workflow_id = b->wf[i],
			                        .payload = b->payload[i],
			                        .payload_len = strlen(b->payload[i]),
			                        .attempt = 1,
			                        .max_attempts = 8 };
	}
}

/* A sink on url with the prefix (and expected stream, "" for any), and
 * the given timeout. */
static struct sink *sink_timeout(const char *url, const char *pfx, const char *expect,
                                 const char *timeout)
{
	struct conf *c = conf_new();
	struct err e = { 0 };
	struct sink *s;

	cr_assert_not_null(c);
	cr_assert_eq(conf_set(c, "sink", "nats", "test", &e), 0, "%s", e.msg);
	cr_assert_eq(conf_set(c, "nats_url", url, "test", &e), 0, "%s", e.msg);
	cr_assert_eq(conf_set(c, "nats_subject_prefix", pfx, "test", &e), 0, "%s", e.msg);
	cr_assert_eq(conf_set(c, "nats_stream", expect, "test", &e), 0, "%s", e.msg);
	cr_assert_eq(conf_set(c, "timeout", timeout, "test", &e), 0, "%s", e.msg);
	s = sink_open(c, &e);
	cr_assert_not_null(s, "sink_open: %s", e.msg);
	cr_assert_str_eq(s->name, "nats");
	/* The sink must keep its own copies: the configuration may be reloaded. */
	conf_free(c);
	return s;
}

static struct sink *sink_with(const char *url, const char *pfx, const char *expect)
{
	return sink_timeout(url, pfx, expect, "5s");
}

static void deliver(struct sink *s, struct batch *b)
{
	struct err e = { 0 };

	cr_assert_eq(s->deliver(s, b->ev, b->n, b->out, &e), 0, "deliver: %s", e.msg);
}

static void expect_all(const struct batch *b, enum sink_result r, int duplicate)
{
	for (size_t i = 0; i < b->n; i++) {
		cr_assert_eq(b->out[i].result, r, "event %zu: result %d, error \"%s\"", i,
		             (int)b->out[i].result, b->out[i].error);
		cr_assert_eq(b->out[i].duplicate, duplicate, "event %zu: duplicate %d", i,
		             b->out[i].duplicate);
	}
}

/* A loopback port with nothing listening on it. */
static int closed_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	close(fd);
	return ntohs(a.sin_port);
}

TestSuite(nats_sink, .init = setup, .fini = teardown, .timeout = 120);

/*
 * The whole contract of one message, then the same batch again: every
 * event acknowledged as a duplicate (delivered, counted apart), and the
 * stream still holds one message per event id.
 */
Test(nats_sink, each_event_is_stored_once_with_its_id_subject_headers_and_payload)
{
	struct batch b;
	struct sink *s;
	natsMsg **m;
	size_t n;
	char subject[128];

	stream_own(0);
	s = sink_with(tstack_env("IDEMFLOW_NATS_URL"), prefix, "");
	batch_fill(&b, 6, "once");
	b.ev[0].traceparent = TRACEPARENT;
	b.ev[0].tracestate = TRACESTATE;
	deliver(s, &b);
	expect_all(&b, SINK_OK, 0);
	for (size_t i = 0; i < b.n; i++)
		cr_assert_gt(b.out[i].latency_ms, 0, "event %zu: latency measured", i);

	n = tnats_stream_read(&nats, stream, &m);
	cr_assert_eq(n, 6, "%zu messages in the stream", n);
	for (size_t i = 0; i < n; i++) {
		snprintf(subject, sizeof(subject), "%s.%s", prefix, types[i % 2]);
		cr_assert_str_eq(natsMsg_GetSubject(m[i]), subject);
		cr_assert_str_eq(tnats_header(m[i], "Nats-Msg-Id"), b.id[i], "in batch order");
		cr_assert_str_eq(tnats_header(m[i], "type"), types[i % 2]);
		cr_assert_str_eq(tnats_header(m[i], "workflow_id"), b.wf[i]);
		cr_assert_str_eq(tnats_header(m[i], "attempt"), "1");
		cr_assert_str_eq(tnats_header(m[i], "Content-Type"), "application/json");
		cr_assert_str_eq(tnats_header(m[i], "traceparent"), i == 0 ? TRACEPARENT : "");
		cr_assert_str_eq(tnats_header(m[i], "tracestate"), i == 0 ? TRACESTATE : "");
		cr_assert_eq((size_t)natsMsg_GetDataLength(m[i]), strlen(b.payload[i]));
		cr_assert_eq(memcmp(natsMsg_GetData(m[i]), b.payload[i], strlen(b.payload[i])), 0,
		             "payload %zu byte for byte", i);
	}
	tnats_msgs_free(m, n);

	/* Sent again (a dispatcher that died before recording): the stream
	 * drops every copy, and says so. */
	for (size_t i = 0; i < b.n; i++)
		b.ev[i].attempt = 2;
	deliver(s, &b);
	expect_all(&b, SINK_OK, 1);
	cr_assert_eq(tnats_stream_msgs(&nats, stream), 6, "no second copy stored");
	s->close(s);
}

Test(nats_sink, a_subject_no_stream_takes_is_a_retry_never_a_delivery)
{
	struct batch b;
	struct sink *s;
	char want[256], hex[13], pfx[40];

	tstack_random_hex(hex, 6);
	snprintf(pfx, sizeof(pfx), "idf.nostream.%s", hex);
	s = sink_with(tstack_env("IDEMFLOW_NATS_URL"), pfx, "");
	batch_fill(&b, 2, "nostream");
	deliver(s, &b);
	expect_all(&b, SINK_RETRY, 0);
	for (size_t i = 0; i < b.n; i++) {
		snprintf(want, sizeof(want),
		         "no JetStream stream takes subject \"%s.%s\" (no responders, 503)", pfx,
		         types[i % 2]);
		cr_assert_str_eq(b.out[i].error, want);
		cr_assert_eq(b.out[i].status, 503);
	}
	s->close(s);
}

/*
 * Two events of workflow A around one of workflow B: A's first fails (its
 * type's subject is in no stream), so A's second is not sent at all,
 * while B's goes through. The stream holds B's event alone.
 */
Test(nats_sink, a_failed_event_holds_back_the_later_events_of_its_workflow)
{
	struct batch b;
	struct sink *s;
	natsMsg **m;
	size_t n;
	char want[256];

	stream_own(0);
	/* This stream takes <prefix>.workflow.> only. */
	tnats_stream_delete(&nats, stream);
	{
		char subjects[80];
		snprintf(subjects, sizeof(subjects), "%s.workflow.>", prefix);
		tnats_stream_add(&nats, stream, subjects, 0);
	}
	s = sink_with(tstack_env("IDEMFLOW_NATS_URL"), prefix, "");
	batch_fill(&b, 3, "order");
	b.ev[0].type = "other.thing";  /* A's first: no stream */
	b.ev[2].workflow_id = b.wf[0]; /* A's second */
	deliver(s, &b);
	cr_assert_eq(b.out[0].result, SINK_RETRY);
	cr_assert_eq(b.out[0].status, 503);
	cr_assert_eq(b.out[1].result, SINK_OK, "%s", b.out[1].error);
	cr_assert_eq(b.out[2].result, SINK_RETRY);
	snprintf(want, sizeof(want),
	         "not sent: event %s of the same workflow, earlier in this batch, was not "
	         "delivered",
	         b.id[0]);
	cr_assert_str_eq(b.out[2].error, want);
	n = tnats_stream_read(&nats, stream, &m);
	cr_assert_eq(n, 1, "%zu messages", n);
	cr_assert_str_eq(tnats_header(m[0], "Nats-Msg-Id"), b.id[1]);
	tnats_msgs_free(m, n);
	s->close(s);
}

/*
 * A line break in a header value would end the header block early (and
 * let stored bytes write headers of their own): such an event is dead at
 * once, and so is a type that is no subject. A trace context that is not
 * valid is left out, as the other sinks do, and the event goes.
 */
Test(nats_sink, an_event_that_cannot_be_sent_is_dead_and_a_bad_trace_context_is_left_out)
{
	struct batch b;
	struct sink *s;
	natsMsg **m;
	size_t n;

	stream_own(0);
	s = sink_with(tstack_env("IDEMFLOW_NATS_URL"), prefix, "");
	batch_fill(&b, 6, "hostile");
	b.ev[0].workflow_id = "w\r\nNats-Msg-Id: forged";
	b.ev[1].type = "workflow created";
	b.ev[2].type = "workflow.*";
	snprintf(b.id[3], sizeof(b.id[3]), "id\nX: y");
	b.ev[4].traceparent = "00-zz-00f067aa0ba902b7-01";
	b.ev[4].tracestate = TRACESTATE;
	b.ev[5].traceparent = TRACEPARENT;
	b.ev[5].tracestate = "congo=t61\r\nrcWkgMzE";
	deliver(s, &b);
	for (size_t i = 0; i < 4; i++)
		cr_assert_eq(b.out[i].result, SINK_DEAD, "event %zu: %d %s", i,
		             (int)b.out[i].result, b.out[i].error);
	cr_assert_str_eq(b.out[0].error, "the workflow id cannot be a NATS header: a control "
	                                 "character (CR, LF) or longer than 1024 bytes");
	cr_assert_str_eq(b.out[1].error,
	                 "the event type is no NATS subject: empty, an empty token, a space, a "
	                 "wildcard (* >) or a control character");
	cr_assert_str_eq(b.out[2].error, b.out[1].error);
	cr_assert_str_eq(b.out[3].error,
	                 "the event id cannot be a NATS header (Nats-Msg-Id): empty, a control "
	                 "character (CR, LF) or longer than 1024 bytes");
	cr_assert_eq(b.out[4].result, SINK_OK, "%s", b.out[4].error);
	cr_assert_eq(b.out[5].result, SINK_OK, "%s", b.out[5].error);
	n = tnats_stream_read(&nats, stream, &m);
	cr_assert_eq(n, 2, "%zu messages", n);
	cr_assert_str_eq(tnats_header(m[0], "Nats-Msg-Id"), b.id[4]);
	cr_assert_str_eq(tnats_header(m[0], "traceparent"), "");
	cr_assert_str_eq(tnats_header(m[0], "tracestate"), "");
	cr_assert_str_eq(tnats_header(m[1], "Nats-Msg-Id"), b.id[5]);
	cr_assert_str_eq(tnats_header(m[1], "traceparent"), TRACEPARENT);
	cr_assert_str_eq(tnats_header(m[1], "tracestate"), "");
	tnats_msgs_free(m, n);
	s->close(s);
}

Test(nats_sink, an_expected_stream_must_be_the_one_that_takes_the_subject)
{
	struct batch b;
	struct sink *s;

	stream_own(0);
	s = sink_with(tstack_env("IDEMFLOW_NATS_URL"), prefix, "IDF_ELSEWHERE");
	batch_fill(&b, 2, "expect");
	deliver(s, &b);
	expect_all(&b, SINK_RETRY, 0);
	cr_assert_eq(b.out[0].status, 10060, "JSStreamNotMatchErr: %d", b.out[0].status);
	cr_assert_str_eq(b.out[0].error,
	                 "JetStream refused the message: expected stream does not match");
	cr_assert_eq(tnats_stream_msgs(&nats, stream), 0);
	s->close(s);

	s = sink_with(tstack_env("IDEMFLOW_NATS_URL"), prefix, stream);
	deliver(s, &b);
	expect_all(&b, SINK_OK, 0);
	cr_assert_eq(tnats_stream_msgs(&nats, stream), 2);
	s->close(s);
}

Test(nats_sink, nothing_listening_is_a_retry_with_the_reason)
{
	struct batch b;
	struct sink *s;
	char url[64], want[128];

	snprintf(url, sizeof(url), "nats://127.0.0.1:%d", closed_port());
	s = sink_with(url, "idf", "");
	batch_fill(&b, 3, "closed");
	deliver(s, &b);
	expect_all(&b, SINK_RETRY, 0);
	snprintf(want, sizeof(want), "could not connect to NATS at %s: ", url);
	for (size_t i = 0; i < b.n; i++)
		cr_assert_eq(strncmp(b.out[i].error, want, strlen(want)), 0, "event %zu: %s", i,
		             b.out[i].error);
	s->close(s);
}

/*
 * The server stops between two batches and comes back: the batch in
 * between is a retry, and the next one goes out on a new connection the
 * sink makes by itself; the stream kept what it had.
 */
Test(nats_sink, a_server_that_went_away_between_batches_is_reconnected)
{
	struct batch b;
	struct sink *s;

	stream_own(0);
	s = sink_with(tstack_env("IDEMFLOW_NATS_URL"), prefix, "");
	batch_fill(&b, 2, "before");
	deliver(s, &b);
	expect_all(&b, SINK_OK, 0);

	tnats_close(&nats);
	tnats_server_stop();
	batch_fill(&b, 2, "during");
	deliver(s, &b);
	expect_all(&b, SINK_RETRY, 0);
	tnats_server_start();
	tnats_connect(&nats);
	deliver(s, &b);
	expect_all(&b, SINK_OK, 0);
	cr_assert_eq(tnats_stream_msgs(&nats, stream), 4, "the stream kept the first two");
	s->close(s);
}

/*
 * An event larger than the server's max_payload (1 MB by default) cannot
 * be sent as it is: a retry with the reason (the operator may raise the
 * limit), and the rest of the batch goes on the same connection.
 */
Test(nats_sink, an_event_larger_than_max_payload_is_a_retry_and_the_batch_goes_on)
{
	const size_t big = 1536 * 1024;
	struct batch b;
	struct sink *s;
	char *payload = malloc(big), want[128];

	cr_assert_not_null(payload);
	memset(payload, 'x', big);
	payload[0] = '"';
	payload[big - 1] = '"';
	stream_own(0);
	s = sink_with(tstack_env("IDEMFLOW_NATS_URL"), prefix, "");
	batch_fill(&b, 3, "big");
	b.ev[1].payload = payload;
	b.ev[1].payload_len = big;
	deliver(s, &b);
	cr_assert_eq(b.out[0].result, SINK_OK, "%s", b.out[0].error);
	cr_assert_eq(b.out[1].result, SINK_RETRY);
	/* The library's reason follows, naming the limit. */
	snprintf(want, sizeof(want),
	         "the event (%zu bytes) is larger than the server's max_payload: Payload ", big);
	cr_assert_eq(strncmp(b.out[1].error, want, strlen(want)), 0, "%s", b.out[1].error);
	cr_assert_not_null(strstr(b.out[1].error, " greater than maximum allowed: 1048576"), "%s",
	                   b.out[1].error);
	cr_assert_eq(b.out[2].result, SINK_OK, "%s", b.out[2].error);
	cr_assert_eq(tnats_stream_msgs(&nats, stream), 2);
	s->close(s);
	free(payload);
}

/*
 * A server that stops answering (SIGSTOP) past the batch's timeout: the
 * event waiting for its acknowledgement is a retry, the next is not sent,
 * the connection is dropped. The server, resumed, still stores what it
 * had read: sent again on a new connection, that event is acknowledged as
 * a duplicate, the other one is stored now.
 */
Test(nats_sink, no_acknowledgement_in_time_is_a_retry_and_the_late_copy_is_a_duplicate)
{
	char path[600], want[300];
	struct batch b;
	struct sink *s;
	pid_t pid;

	stream_own(0);
	s = sink_timeout(tstack_env("IDEMFLOW_NATS_URL"), prefix, "", "1s");
	batch_fill(&b, 1, "warm");
	deliver(s, &b); /* connected */
	expect_all(&b, SINK_OK, 0);
	snprintf(path, sizeof(path), "%s/nats.pid", tstack_env("IDEMFLOW_NATS_DIR"));
	pid = (pid_t)tstack_pidfile_read(path);
	cr_assert_gt(pid, 0);

	batch_fill(&b, 2, "silent");
	tstack_stop_process(pid);
	double t0 = tstack_now();
	deliver(s, &b);
	double took = tstack_now() - t0;
	cr_assert_eq(kill(pid, SIGCONT), 0);
	expect_all(&b, SINK_RETRY, 0);
	cr_assert_str_eq(b.out[0].error,
	                 "no acknowledgement from JetStream within 1000 ms (the batch's timeout)");
	snprintf(want, sizeof(want), "not sent: %s", b.out[0].error);
	cr_assert_str_eq(b.out[1].error, want);
	cr_assert(took >= 0.9 && took < 3, "the batch took %.3f s, its timeout is 1 s", took);

	for (size_t i = 0; i < b.n; i++)
		b.ev[i].attempt = 2;
	deliver(s, &b);
	cr_assert_eq(b.out[0].result, SINK_OK, "%s", b.out[0].error);
	cr_assert_eq(b.out[0].duplicate, 1, "the copy the server read before it stopped");
	cr_assert_eq(b.out[1].result, SINK_OK, "%s", b.out[1].error);
	cr_assert_eq(b.out[1].duplicate, 0);
	cr_assert_eq(tnats_stream_msgs(&nats, stream), 3);
	s->close(s);
}

static void expect_config_error(const char *key, const char *value, const char *want)
{
	struct conf *c = conf_new();
	struct err e = { 0 };
	struct sink *s;

	cr_assert_not_null(c);
	cr_assert_eq(conf_set(c, "sink", "nats", "test", &e), 0, "%s", e.msg);
	cr_assert_eq(conf_set(c, key, value, "test", &e), 0, "%s", e.msg);
	s = sink_open(c, &e);
	cr_assert_null(s, "%s = \"%s\" was accepted", key, value);
	cr_assert_eq(e.code, ERR_CONFIG);
	cr_assert_str_eq(e.msg, want);
	conf_free(c);
}

Test(nats_sink, bad_configuration_names_the_key_and_hides_passwords)
{
	static const char url_form[] = "expected nats://[user:password@]host[:port], several "
	                               "separated by commas";
	static const char prefix_form[] =
	    "expected subject tokens separated by dots (no empty token, space, * or >), at most "
	    "200 bytes";
	char want[512];

	expect_config_error("nats_url", "",
	                    "invalid value \"\" for \"nats_url\": expected "
	                    "nats://[user:password@]host[:port]");
	snprintf(want, sizeof(want), "invalid value \"http://127.0.0.1:4222\" for \"nats_url\": %s",
	         url_form);
	expect_config_error("nats_url", "http://127.0.0.1:4222", want);
	snprintf(want, sizeof(want), "invalid value \"nats://***@\" for \"nats_url\": %s",
	         url_form);
	expect_config_error("nats_url", "nats://127.0.0.1:1,nats://user:s3cret@", want);
	snprintf(want, sizeof(want), "invalid value \"nats://***@a b\" for \"nats_url\": %s",
	         url_form);
	expect_config_error("nats_url", "nats://t0ken@a b", want);
	for (size_t i = 0; i < 4; i++) {
		static const char *const bad[] = { "a b", "a..b", ".a", "a.>" };
		snprintf(want, sizeof(want), "invalid value \"%s\" for \"nats_subject_prefix\": %s",
		         bad[i], prefix_form);
		expect_config_error("nats_subject_prefix", bad[i], want);
	}
	expect_config_error("nats_stream", "a.b",
	                    "invalid value \"a.b\" for \"nats_stream\": a stream name has no dot, "
	                    "space, *, >, slash or backslash, and at most 255 bytes");
}

/* ------------------------------------------------------------------ the dispatcher */

static struct tdispatch td;
static char textfile[600];

static void dispatch_setup(void)
{
	setup();
	tdispatch_open(&td, "test_nats", "dispatch-nats");
	snprintf(textfile, sizeof(textfile), "%s/dispatch-nats.prom",
	         tstack_env("IDEMFLOW_STACK_DIR"));
}

static void dispatch_teardown(void)
{
	tdispatch_close(&td);
	teardown();
}

/* Start idemflow-dispatch on the nats sink with the common flags plus
 * extra (NULL-ended); its stderr goes to td.log. Returns the pid. */
static pid_t spawn(const char *pfx, const char *const *extra)
{
	const char *common[] = { "--sink",
		                 "nats",
		                 "--nats-url",
		                 tstack_env("IDEMFLOW_NATS_URL"),
		                 "--nats-subject-prefix",
		                 pfx,
		                 "--backoff",
		                 "50ms",
		                 "--textfile",
		                 textfile,
		                 NULL };

	return tdispatch_spawn(&td, common, extra);
}

static int run(const char *pfx, const char *const *extra)
{
	return tdispatch_wait(spawn(pfx, extra));
}

/* The tenant's event ids that match cond, sorted; *n their count. */
static char **event_ids(const char *cond, size_t *n)
{
	char q[256];
	const char *p[1] = { td.tenant };
	PGresult *res;
	char **ids;

	snprintf(q, sizeof(q),
	         "SELECT event_id FROM outbox WHERE tenant_id = $1 AND %s ORDER BY event_id", cond);
	res = tdispatch_sql(&td, q, 1, p);
	*n = (size_t)PQntuples(res);
	ids = calloc(*n + 1, sizeof(*ids));
	cr_assert_not_null(ids);
	for (size_t i = 0; i < *n; i++)
		ids[i] = strdup(PQgetvalue(res, (int)i, 0));
	PQclear(res);
	return ids;
}

static void ids_free(char **ids, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(ids[i]);
	free(ids);
}

static int str_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The Nats-Msg-Id of every message in the stream, sorted. */
static char **stream_ids(size_t *n)
{
	natsMsg **m;
	char **ids;

	*n = tnats_stream_read(&nats, stream, &m);
	ids = calloc(*n + 1, sizeof(*ids));
	cr_assert_not_null(ids);
	for (size_t i = 0; i < *n; i++)
		ids[i] = strdup(tnats_header(m[i], "Nats-Msg-Id"));
	tnats_msgs_free(m, *n);
	qsort(ids, *n, sizeof(*ids), str_cmp);
	return ids;
}

/* The stream holds exactly one message per event of the tenant. */
static void expect_one_message_per_event(void)
{
	size_t ne, ns;
	char **ev = event_ids("true", &ne), **st = stream_ids(&ns);

	cr_assert_eq(ns, ne, "%zu messages for %zu events", ns, ne);
	for (size_t i = 0; i < ne; i++)
		cr_assert_str_eq(st[i], ev[i], "message %zu is event %s", i, ev[i]);
	ids_free(ev, ne);
	ids_free(st, ns);
}

#define HOLD_LOCK "4242001"

static int holding; /* the trigger of kill_between_publish_and_record exists */

/*
 * Run the dispatcher (batch of every event) and kill it after it
 * published every event and before it recorded any: the recording of a
 * published event waits in a trigger for an advisory lock this test
 * holds. Once the stream holds `want` messages and the dispatcher's
 * session waits on the lock, the dispatcher gets SIGKILL and its session
 * is terminated, so nothing it sent can still commit. Returns the kill
 * time.
 */
static double kill_between_publish_and_record(long want)
{
	PGconn *hold = tstack_db_connect();
	char q[600], app[64], batch[16];
	double deadline;
	pid_t pid;

	tstack_exec(hold, "SELECT pg_advisory_lock(" HOLD_LOCK ")");
	PQclear(tdispatch_sql(&td,
	                      "CREATE FUNCTION test_nats_hold() RETURNS trigger LANGUAGE plpgsql AS"
	                      " $$BEGIN PERFORM pg_advisory_xact_lock_shared(" HOLD_LOCK ");"
	                      " RETURN NEW; END$$",
	                      0, NULL));
	snprintf(q, sizeof(q),
	         "CREATE TRIGGER test_nats_hold BEFORE UPDATE ON outbox FOR EACH ROW"
	         " WHEN (NEW.tenant_id = %s AND NEW.published_at IS NOT NULL"
	         " AND OLD.published_at IS NULL) EXECUTE FUNCTION test_nats_hold()",
	         td.tenant);
	PQclear(tdispatch_sql(&td, q, 0, NULL));
	holding = 1;

	snprintf(batch, sizeof(batch), "%ld", want);
	const char *a[] = { "--batch", batch, "--lease", "3s", "--timeout", "1s", NULL };
	pid = spawn(prefix, a);
	snprintf(app, sizeof(app), "%%-dispatch-%ld", (long)pid);
	const char *p[1] = { app };
	deadline = tstack_now() + 30;
	while (
	    tnats_stream_msgs(&nats, stream) < want ||
	    tdispatch_scalar(&td,
	                     "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1"
	                     " AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
	                     1, p) != 1) {
		cr_assert_lt(tstack_now(), deadline,
		             "the dispatcher did not publish %ld events and wait to record them "
		             "(stream: %ld; log: %s)",
		             want, tnats_stream_msgs(&nats, stream), td.log);
		tstack_sleep_ms(20);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	PQclear(tdispatch_sql(&td,
	                      "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
	                      " WHERE application_name LIKE $1",
	                      1, p));
	while (tdispatch_scalar(
	           &td, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1", 1,
	           p) != 0) {
		cr_assert_lt(tstack_now(), deadline, "the dispatcher's session outlived it");
		tstack_sleep_ms(20);
	}
	double killed = tstack_now();
	tstack_exec(hold, "SELECT pg_advisory_unlock(" HOLD_LOCK ")");
	PQfinish(hold);
	PQclear(tdispatch_sql(&td, "DROP TRIGGER test_nats_hold ON outbox", 0, NULL));
	PQclear(tdispatch_sql(&td, "DROP FUNCTION test_nats_hold()", 0, NULL));
	holding = 0;
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL"), 0,
	             "killed before recording: nothing is marked published");
	cr_assert_eq(tnats_stream_msgs(&nats, stream), want, "yet the stream holds them all");
	return killed;
}

/* Sleep until the lease (3 s) of a dispatcher killed at `killed` ran out. */
static void lease_run_out(double killed)
{
	long ms = (long)((killed + 3.2 - tstack_now()) * 1000);

	if (ms > 0)
		tstack_sleep_ms(ms);
}

/* .fini: a test that failed while the trigger was in place drops it. */
static void hold_cleanup(void)
{
	if (holding) {
		PQclear(db_exec(td.conn, "DROP TRIGGER IF EXISTS test_nats_hold ON outbox", 0, NULL,
		                &(struct err){ 0 }));
		PQclear(db_exec(td.conn, "DROP FUNCTION IF EXISTS test_nats_hold()", 0, NULL,
		                &(struct err){ 0 }));
	}
	dispatch_teardown();
}

TestSuite(nats_dispatch, .init = dispatch_setup, .fini = hold_cleanup, .timeout = 180);

/*
 * Issue 28 (a): a dispatcher killed between publishing and recording. The
 * rerun publishes every event again, the stream drops each copy (same
 * Nats-Msg-Id within its duplicate window): one message per event id,
 * every event recorded, and the run counts the broker's duplicates in its
 * log line and its textfile.
 */
Test(nats_dispatch, killed_between_publish_and_record_the_stream_keeps_one_message_per_event)
{
	stream_own(0);
	tdispatch_seed(&td, 20, 1, "test.event");
	double killed = kill_between_publish_and_record(20);

	/* The dead dispatcher's lease runs out (3 s), then the rerun. */
	lease_run_out(killed);
	cr_assert_eq(run(prefix, NULL), 0, "log: %s", td.log);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL AND attempts = 2"), 20,
	             "every event recorded, on its second attempt (log: %s)", td.log);
	expect_one_message_per_event();
	cr_assert(tstack_file_contains(td.log,
	                               "msg=\"run finished\" claimed=20 published=20 retried=0 "
	                               "dead=0 broker_duplicates=20 "),
	          "log: %s", td.log);
	cr_assert(tstack_file_contains(td.log, "outcome=published") &&
	              tstack_file_contains(td.log, "duplicate=true"),
	          "each delivery line says duplicate (log: %s)", td.log);
	cr_assert_eq(
	    tdispatch_textfile_value(textfile, "idemflow_dispatch_last_run_broker_duplicates"), 20);
	cr_assert_eq(tdispatch_textfile_value(textfile, "idemflow_dispatch_last_run_published"),
	             20);
}

/*
 * Issue 28 (b): the same crash, but the stream forgets ids after 1 s and
 * the rerun comes after the lease (3 s): JetStream stores the event a
 * second time (no duplicate to count). A consumer reading the stream
 * through the inbox applies the effect once and drops the second copy.
 */
Test(nats_dispatch,
     a_redelivery_after_the_duplicate_window_is_stored_again_and_the_inbox_absorbs_it)
{
	struct idemflow_inbox_err e;
	natsMsg **m;
	size_t n;
	char handler[64];

	stream_own(1000);
	tdispatch_seed(&td, 1, 1, "test.event");
	double killed = kill_between_publish_and_record(1);

	lease_run_out(killed);
	cr_assert_eq(run(prefix, NULL), 0, "log: %s", td.log);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL"), 1, "log: %s", td.log);
	cr_assert(tstack_file_contains(td.log, "broker_duplicates=0 "), "log: %s", td.log);
	n = tnats_stream_read(&nats, stream, &m);
	cr_assert_eq(n, 2, "past the window the stream took the event again: %zu", n);
	cr_assert_str_eq(tnats_header(m[0], "Nats-Msg-Id"), tnats_header(m[1], "Nats-Msg-Id"));
	cr_assert_str_eq(tnats_header(m[0], "attempt"), "1");
	cr_assert_str_eq(tnats_header(m[1], "attempt"), "2");

	/* The consumer: each message in stream order, its effect and its
	 * inbox row in one transaction. */
	snprintf(handler, sizeof(handler), "nats-%s", stream);
	cr_assert_eq(idemflow_inbox_setup(td.conn, &e), 0, "%s", e.msg);
	PQclear(tdispatch_sql(
	    &td, "CREATE TABLE IF NOT EXISTS test_nats_effects (handler text, event_id text)", 0,
	    NULL));
	for (size_t i = 0; i < n; i++) {
		const char *p[2] = { handler, tnats_header(m[i], "Nats-Msg-Id") };
		PQclear(tdispatch_sql(&td, "BEGIN", 0, NULL));
		int first = idemflow_inbox_claim(td.conn, handler, p[1], &e);
		cr_assert_geq(first, 0, "%s", e.msg);
		if (first)
			PQclear(tdispatch_sql(&td, "INSERT INTO test_nats_effects VALUES ($1, $2)",
			                      2, p));
		PQclear(tdispatch_sql(&td, "COMMIT", 0, NULL));
	}
	tnats_msgs_free(m, n);
	const char *p[1] = { handler };
	cr_assert_eq(tdispatch_scalar(
	                 &td, "SELECT count(*) FROM test_nats_effects WHERE handler = $1", 1, p),
	             1, "the effect happened once");
	cr_assert_eq(idemflow_inbox_duplicates(td.conn, handler, &e), 1,
	             "the second copy was dropped");
}

/*
 * Issue 28 (c): the server stops in the middle of a batch of 2,000 (the
 * dispatcher is held with SIGSTOP once some are in the stream, so the
 * stop lands mid-batch, then let go). What the run recorded as published
 * is in the stream; what it did not, it retries. After the server is
 * back, a rerun leaves every event in the stream exactly once, recorded.
 */
Test(nats_dispatch, a_server_stopped_mid_batch_loses_nothing)
{
	const long total = 2000;
	size_t np, ns;
	char **pub, **st;
	double deadline;
	long before, stored;
	pid_t pid;

	stream_own(0);
	tdispatch_seed(&td, (int)total, 1, "test.event");
	/* A back-off longer than the run: the events it fails wait for the
	 * rerun instead of being claimed again by this run. */
	const char *a[] = { "--batch", "2000",      "--lease", "30s", "--timeout",
		            "20s",     "--backoff", "1h",      NULL };
	pid = spawn(prefix, a);
	deadline = tstack_now() + 60;
	while ((before = tnats_stream_msgs(&nats, stream)) < 100) {
		cr_assert_lt(tstack_now(), deadline, "nothing published (log: %s)", td.log);
		tstack_sleep_ms(2);
	}
	tstack_stop_process(pid);
	before = tnats_stream_msgs(&nats, stream);
	cr_assert_lt(before, total, "the batch was over before the stop (%ld)", before);
	tnats_close(&nats);
	tnats_server_stop();
	kill(pid, SIGCONT);
	cr_assert_eq(tdispatch_wait(pid), 0, "a failed delivery is no failed run (log: %s)",
	             td.log);
	tnats_server_start();
	tnats_connect(&nats);

	stored = tnats_stream_msgs(&nats, stream);
	pub = event_ids("published_at IS NOT NULL", &np);
	st = stream_ids(&ns);
	cr_assert_eq((long)ns, stored);
	cr_assert_lt(np, (size_t)total, "the stop failed some events");
	cr_assert_geq(ns, np, "%zu recorded published, %zu in the stream", np, ns);
	for (size_t i = 0; i < np; i++)
		cr_assert_not_null(bsearch(&pub[i], st, ns, sizeof(*st), str_cmp),
		                   "%s is recorded published but is not in the stream", pub[i]);
	cr_assert_eq(
	    tdispatch_count(&td, "published_at IS NULL AND dead_at IS NULL AND attempts = 1"),
	    total - (long)np, "the rest is pending for a retry: %ld of %ld (log: %s)",
	    tdispatch_count(&td, "published_at IS NULL AND dead_at IS NULL AND attempts = 1"),
	    total - (long)np, td.log);
	cr_log_info("server stopped mid-batch: %ld in the stream at the stop, %zu stored, %zu "
	            "recorded published",
	            before, ns, np);
	ids_free(pub, np);
	ids_free(st, ns);

	PQclear(tdispatch_sql(
	    &td, "UPDATE outbox SET next_attempt_at = now() WHERE published_at IS NULL", 0, NULL));
	cr_assert_eq(run(prefix, a), 0, "log: %s", td.log);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL"), total, "log: %s", td.log);
	expect_one_message_per_event();
	/* Stored before the stop but never acknowledged: the broker had them. */
	cr_assert_eq(
	    tdispatch_textfile_value(textfile, "idemflow_dispatch_last_run_broker_duplicates"),
	    (long)ns - (long)np);
}

/*
 * No stream takes the subjects: every attempt is a failure with the
 * server's reason, the events stay pending, then die; none is ever
 * marked published.
 */
Test(nats_dispatch, without_a_stream_events_stay_pending_then_die_never_published)
{
	char hex[13], pfx[48], want[200];

	tstack_random_hex(hex, 6);
	snprintf(pfx, sizeof(pfx), "idf.none.%s", hex);
	tdispatch_seed(&td, 3, 1, "test.event");
	const char *a[] = { "--max-attempts", "2", "--backoff", "1h", NULL };
	cr_assert_eq(run(pfx, a), 0, "log: %s", td.log);
	snprintf(want, sizeof(want),
	         "published_at IS NULL AND dead_at IS NULL AND attempts = 1 AND last_error ="
	         " 'no JetStream stream takes subject \"%s.test.event\" (no responders, 503)'",
	         pfx);
	cr_assert_eq(tdispatch_count(&td, want), 3, "pending after attempt 1 (log: %s)", td.log);
	cr_assert(tstack_file_contains(td.log, "status=503"), "log: %s", td.log);

	PQclear(tdispatch_sql(
	    &td, "UPDATE outbox SET next_attempt_at = now() WHERE published_at IS NULL", 0, NULL));
	cr_assert_eq(run(pfx, a), 0, "log: %s", td.log);
	cr_assert_eq(
	    tdispatch_count(&td, "published_at IS NULL AND dead_at IS NOT NULL AND attempts = 2"),
	    3, "dead after the last attempt, never published (log: %s)", td.log);
	cr_assert(tstack_file_contains(td.log, "published=0 retried=0 dead=3 broker_duplicates=0 "),
	          "log: %s", td.log);
}
