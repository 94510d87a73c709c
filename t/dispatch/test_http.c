/*
 * test_http.c - the HTTP webhook sink against a real receiver (t/lib/receiver.py):
 * the Standard Webhooks headers and signature, byte-identical bodies,
 * connection reuse, and how each kind of failure maps to an outcome.
 * No database is involved.
 */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "core/conf.h"
#include "dispatch/sink.h"
#include "dispatch/whsig.h"
#include "receiver.h"

#define SECRET       "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
#define OTHER_SECRET "whsec_c2VjcmV0LW9mLWFub3RoZXItZW5kcG9pbnQ="

static struct receiver rcv;

static void start_receiver(void)
{
	/* The receiver checks signatures itself too, with Python's hmac. */
	static const char *const args[] = { "--secret", SECRET, NULL };

	cr_assert_eq(receiver_start(&rcv, args), 0, "%s", rcv.error);
}

static void stop_receiver(void)
{
	receiver_stop(&rcv);
}

static void control(const char *json)
{
	cr_assert_eq(receiver_control(&rcv, json), 0, "%s", rcv.error);
}

/* A sink for url with extra key/value pairs (NULL-terminated) applied.
 * One request at a time unless the pairs say "parallel": tests that steer
 * the receiver ("fail the next delivery") need a known arrival order. */
static struct sink *open_sink(const char *url, ...)
{
	struct conf *c = conf_new();
	struct err e = { 0 };
	struct sink *s;
	va_list ap;

	cr_assert_not_null(c);
	cr_assert_eq(conf_set(c, "url", url, "test", &e), 0, "%s", e.msg);
	cr_assert_eq(conf_set(c, "parallel", "1", "test", &e), 0, "%s", e.msg);
	va_start(ap, url);
	for (const char *k = va_arg(ap, const char *); k; k = va_arg(ap, const char *)) {
		const char *v = va_arg(ap, const char *);

		cr_assert_eq(conf_set(c, k, v, "test", &e), 0, "%s = %s: %s", k, v, e.msg);
	}
	va_end(ap);
	s = sink_http_open(c, &e);
	cr_assert_not_null(s, "sink_http_open: %s", e.msg);
	cr_assert_str_eq(s->name, "http");
	conf_free(c);
	return s;
}

/* The error of opening a sink with these settings (it must fail). */
static struct err open_error(const char *url, const char *secret)
{
	struct conf *c = conf_new();
	struct err e = { 0 };
	struct sink *s;

	cr_assert_not_null(c);
	cr_assert_eq(conf_set(c, "url", url, "test", &e), 0, "%s", e.msg);
	if (secret)
		cr_assert_eq(conf_set(c, "secret", secret, "test", &e), 0, "%s", e.msg);
	s = sink_http_open(c, &e);
	conf_free(c);
	cr_assert_null(s, "url \"%s\" was accepted", url);
	return e;
}

static struct sink_event event(const char *id, const char *payload)
{
	struct sink_event ev = {
		.event_id = id,
		.type = "workflow.created",
		.workflow_id = "01a2279f-dc8e-7184-b6f4-7b518175cea0",
		.payload = payload,
		.payload_len = strlen(payload),
		.attempt = 1,
		.max_attempts = 8,
	};
	return ev;
}

/* Deliver evs, expecting the sink itself to stay usable. */
static void deliver(struct sink *s, const struct sink_event *evs, size_t n,
                    struct sink_outcome *outs)
{
	struct err e = { 0 };

	cr_assert_eq(s->deliver(s, evs, n, outs, &e), 0, "deliver: %s", e.msg);
}

static void key_of(const char *secret, uint8_t *key, size_t *keylen)
{
	struct err e = { 0 };

	cr_assert_eq(whsig_key(secret, key, keylen, &e), 0, "%s", e.msg);
}

/* A loopback port nothing listens on: bound by us, then released. */
static int closed_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	cr_assert(fd >= 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	close(fd);
	return ntohs(a.sin_port);
}

TestSuite(http, .init = start_receiver, .fini = stop_receiver, .timeout = 60);

Test(http, every_delivery_carries_id_timestamp_idempotency_key_and_a_valid_signature)
{
	/* Odd bytes on purpose: the body must arrive exactly as stored. */
	struct sink_event evs[] = {
		event("01a2279f-dc8e-7184-b6f4-7b518175cea0.1",
		      "{\"type\":\"workflow.created\",\"input\":{\"order\":42}}"),
		event("01a2279f-dc8e-7184-b6f4-7b518175cea0.2",
		      "{\"text\":\"caf\xc3\xa9 \\u2603 \\\"quoted\\\"\",\n"
		      " \"spaced\" :  [1, 2.50, -0]}"),
		event("01a2279f-dc8e-7184-b6f4-7b518175cea0.3", "{}"),
	};
	const size_t n = sizeof(evs) / sizeof(evs[0]);
	struct sink_outcome outs[3];
	struct receiver_delivery *d;
	uint8_t key[WHSIG_KEY_MAX], other[WHSIG_KEY_MAX];
	size_t keylen, otherlen, got;
	struct sink *s = open_sink(rcv.url, "secret", SECRET, (char *)NULL);
	long now = (long)time(NULL);

	deliver(s, evs, n, outs);
	for (size_t i = 0; i < n; i++) {
		cr_assert_eq(outs[i].result, SINK_OK, "event %zu: %s", i, outs[i].error);
		cr_assert_eq(outs[i].status, 200);
		cr_assert_eq(outs[i].retry_after_s, -1);
		cr_assert_str_empty(outs[i].error);
		cr_assert_gt(outs[i].latency_ms, 0);
	}
	s->close(s);

	key_of(SECRET, key, &keylen);
	key_of(OTHER_SECRET, other, &otherlen);
	cr_assert_eq(receiver_deliveries(&rcv, &d, &got), 0, "%s", rcv.error);
	cr_assert_eq(got, n);
	for (size_t i = 0; i < n; i++) {
		struct err e = { 0 };
		long ts;

		cr_assert_eq(d[i].seq, (long)i + 1, "delivered in order");
		cr_assert_str_eq(d[i].path, "/hook");
		cr_assert_not_null(d[i].event_id);
		cr_assert_str_eq(d[i].event_id, evs[i].event_id);
		cr_assert_not_null(d[i].idempotency_key);
		cr_assert_str_eq(d[i].idempotency_key, evs[i].event_id);
		cr_assert_not_null(d[i].content_type);
		cr_assert_str_eq(d[i].content_type, "application/json");
		cr_assert_not_null(d[i].user_agent);
		cr_assert_str_eq(d[i].user_agent, "idemflow-dispatch/" PACKAGE_VERSION);
		cr_assert_eq(d[i].body_len, evs[i].payload_len);
		cr_assert_str_eq(d[i].body, evs[i].payload);
		cr_assert_not_null(d[i].timestamp);
		ts = atol(d[i].timestamp);
		cr_assert(ts >= now - 5 && ts <= now + 5, "webhook-timestamp %s, now %ld",
		          d[i].timestamp, now);
		cr_assert_not_null(d[i].signature);
		cr_assert_eq(strncmp(d[i].signature, "v1,", 3), 0, "%s", d[i].signature);
		cr_assert_eq(whsig_verify(key, keylen, d[i].event_id, d[i].timestamp, d[i].body,
		                          d[i].body_len, d[i].signature, (long)time(NULL),
		                          WHSIG_TOLERANCE_S, &e),
		             0, "event %zu: %s", i, e.msg);
		cr_assert_eq(whsig_verify(other, otherlen, d[i].event_id, d[i].timestamp, d[i].body,
		                          d[i].body_len, d[i].signature, (long)time(NULL),
		                          WHSIG_TOLERANCE_S, &e),
		             -1, "another secret must not verify");
		cr_assert_eq(d[i].signature_valid, 1, "receiver.py rejected event %zu", i);
		cr_assert_eq(d[i].status, 200);
	}
	receiver_deliveries_free(d, got);
}

Test(http, without_a_secret_no_signature_is_sent)
{
	struct sink_event ev = event("evt-unsigned.1", "{\"a\":1}");
	struct sink_outcome out;
	struct receiver_delivery *d;
	size_t got;
	struct sink *s = open_sink(rcv.url, (char *)NULL);

	deliver(s, &ev, 1, &out);
	s->close(s);
	cr_assert_eq(out.result, SINK_OK, "%s", out.error);
	cr_assert_eq(receiver_deliveries(&rcv, &d, &got), 0, "%s", rcv.error);
	cr_assert_eq(got, 1);
	cr_assert_null(d[0].signature);
	cr_assert_eq(d[0].signature_valid, 0);
	cr_assert_str_eq(d[0].event_id, "evt-unsigned.1");
	cr_assert_str_eq(d[0].idempotency_key, "evt-unsigned.1");
	cr_assert_not_null(d[0].timestamp);
	receiver_deliveries_free(d, got);
}

/* n events "evt-batch.<i>" with bodies {"n":<i>}, through a new sink. */
static struct sink_event batch_events[200];
static char batch_ids[200][32], batch_bodies[200][48];

static void make_batch(int n)
{
	for (int i = 0; i < n; i++) {
		snprintf(batch_ids[i], sizeof(batch_ids[i]), "evt-batch.%d", i + 1);
		snprintf(batch_bodies[i], sizeof(batch_bodies[i]), "{\"n\":%d}", i + 1);
		batch_events[i] = event(batch_ids[i], batch_bodies[i]);
	}
}

Test(http, with_parallel_1_a_batch_is_sent_in_order_over_one_connection)
{
	enum { N = 200 };
	struct sink_outcome outs[N];
	struct receiver_delivery *d;
	size_t got;
	struct sink *s = open_sink(rcv.url, "secret", SECRET, "parallel", "1", (char *)NULL);

	make_batch(N);
	deliver(s, batch_events, N, outs);
	/* A second batch on the same sink keeps the connection too. */
	deliver(s, batch_events, 10, outs);
	s->close(s);
	for (int i = 0; i < N; i++)
		cr_assert_eq(outs[i].result, SINK_OK, "event %d: %s", i, outs[i].error);

	cr_assert_eq(receiver_deliveries(&rcv, &d, &got), 0, "%s", rcv.error);
	cr_assert_eq(got, N + 10);
	for (size_t i = 0; i < got; i++) {
		cr_assert_eq(d[i].conn, d[0].conn, "delivery %zu came on connection %ld, not %ld",
		             i, d[i].conn, d[0].conn);
		cr_assert_str_eq(d[i].peer, d[0].peer);
		cr_assert_str_eq(d[i].event_id, batch_ids[i % N], "delivery %zu out of order", i);
		cr_assert_eq(d[i].duplicate, i >= N, "the second batch repeats ids");
		cr_assert_eq(d[i].signature_valid, 1, "delivery %zu", i);
	}
	receiver_deliveries_free(d, got);
}

Test(http, a_parallel_batch_sends_each_event_once_over_at_most_parallel_connections)
{
	enum { N = 200 };
	struct sink_outcome outs[N];
	struct receiver_delivery *d;
	size_t got;
	long conns[8];
	int nconns = 0;
	static int seen[N];
	struct sink *s = open_sink(rcv.url, "secret", SECRET, "parallel", "4", (char *)NULL);

	make_batch(N);
	deliver(s, batch_events, N, outs);
	deliver(s, batch_events, 10, outs); /* the connections are kept for the next batch */
	s->close(s);
	for (int i = 0; i < N; i++)
		cr_assert_eq(outs[i].result, SINK_OK, "event %d: %s", i, outs[i].error);
	cr_assert_eq(receiver_deliveries(&rcv, &d, &got), 0, "%s", rcv.error);
	cr_assert_eq(got, N + 10);
	for (size_t i = 0; i < got; i++) {
		int k, idx = atoi(strrchr(d[i].event_id, '.') + 1) - 1;
		for (k = 0; k < nconns && conns[k] != d[i].conn; k++)
			;
		if (k == nconns) {
			cr_assert_lt(nconns, 4, "more connections than parallel = 4");
			conns[nconns++] = d[i].conn;
		}
		if (i < N)
			seen[idx]++;
		cr_assert_eq(d[i].signature_valid, 1, "delivery %zu", i);
		cr_assert_str_eq(d[i].body, batch_bodies[idx]);
	}
	for (int i = 0; i < N; i++)
		cr_assert_eq(seen[i], 1, "event %d delivered %d times in the first batch", i,
		             seen[i]);
	receiver_deliveries_free(d, got);
}

Test(http, a_503_with_retry_after_is_retried_after_that_delay)
{
	struct sink_event evs[] = { event("evt-503.1", "{}"), event("evt-503.2", "{}") };
	struct sink_outcome outs[2];
	struct sink *s = open_sink(rcv.url, (char *)NULL);

	control("{\"fail_next\": 1, \"status\": 503, \"retry_after\": 7}");
	deliver(s, evs, 2, outs);
	s->close(s);
	cr_assert_eq(outs[0].result, SINK_RETRY);
	cr_assert_eq(outs[0].status, 503);
	cr_assert_eq(outs[0].retry_after_s, 7);
	cr_assert_str_eq(outs[0].error, "HTTP 503: {\"seq\": 1}");
	/* The Retry-After of one answer does not leak into the next. */
	cr_assert_eq(outs[1].result, SINK_OK, "%s", outs[1].error);
	cr_assert_eq(outs[1].retry_after_s, -1);
}

Test(http, retry_after_as_an_http_date_becomes_seconds)
{
	char json[128], date[64];
	time_t later = time(NULL) + 120;
	struct sink_event ev = event("evt-date.1", "{}");
	struct sink_outcome out;
	struct sink *s = open_sink(rcv.url, (char *)NULL);

	strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", gmtime(&later));
	snprintf(json, sizeof(json), "{\"fail_next\": 2, \"status\": 503, \"retry_after\": \"%s\"}",
	         date);
	control(json);
	deliver(s, &ev, 1, &out);
	cr_assert_eq(out.result, SINK_RETRY);
	cr_assert(out.retry_after_s >= 115 && out.retry_after_s <= 120, "Retry-After %s gave %ld",
	          date, out.retry_after_s);

	/* A date in the past means "now". */
	control("{\"retry_after\": \"Wed, 21 Oct 2015 07:28:00 GMT\"}");
	deliver(s, &ev, 1, &out);
	cr_assert_eq(out.result, SINK_RETRY);
	cr_assert_eq(out.retry_after_s, 0);
	s->close(s);
}

Test(http, a_429_and_a_408_are_retried)
{
	struct sink_event ev = event("evt-busy.1", "{}");
	struct sink_outcome out;
	struct sink *s = open_sink(rcv.url, "dead_on_4xx", "true", (char *)NULL);

	control("{\"fail_next\": 1, \"status\": 429}");
	deliver(s, &ev, 1, &out);
	cr_assert_eq(out.result, SINK_RETRY);
	cr_assert_eq(out.status, 429);
	cr_assert_eq(out.retry_after_s, -1, "no Retry-After was sent");
	cr_assert_str_eq(out.error, "HTTP 429: {\"seq\": 1}");

	control("{\"fail_next\": 1, \"status\": 408}");
	deliver(s, &ev, 1, &out);
	cr_assert_eq(out.result, SINK_RETRY);
	cr_assert_eq(out.status, 408);
	s->close(s);
}

Test(http, a_400_is_dead_and_the_batch_goes_on)
{
	struct sink_event evs[] = { event("evt-400.1", "{}"), event("evt-400.2", "{}"),
		                    event("evt-400.3", "{}") };
	struct sink_outcome outs[3];
	struct sink *s = open_sink(rcv.url, (char *)NULL);

	control("{\"fail_ids\": [\"evt-400.2\"], \"status_for_ids\": 400}");
	deliver(s, evs, 3, outs);
	s->close(s);
	cr_assert_eq(outs[0].result, SINK_OK, "%s", outs[0].error);
	cr_assert_eq(outs[1].result, SINK_DEAD);
	cr_assert_eq(outs[1].status, 400);
	cr_assert_str_eq(outs[1].error, "HTTP 400: {\"seq\": 2}");
	cr_assert_eq(outs[2].result, SINK_OK, "%s", outs[2].error);
}

Test(http, a_400_is_retried_when_dead_on_4xx_is_off)
{
	struct sink_event ev = event("evt-400.1", "{}");
	struct sink_outcome out;
	struct sink *s = open_sink(rcv.url, "dead_on_4xx", "false", (char *)NULL);

	control("{\"fail_ids\": [\"evt-400.1\"], \"status_for_ids\": 422}");
	deliver(s, &ev, 1, &out);
	s->close(s);
	cr_assert_eq(out.result, SINK_RETRY);
	cr_assert_eq(out.status, 422);
}

Test(http, a_redirect_is_retried_not_followed)
{
	struct sink_event ev = event("evt-301.1", "{}");
	struct sink_outcome out;
	struct receiver_delivery *d;
	size_t got;
	struct sink *s = open_sink(rcv.url, (char *)NULL);

	control("{\"fail_next\": 1, \"status\": 301}");
	deliver(s, &ev, 1, &out);
	s->close(s);
	cr_assert_eq(out.result, SINK_RETRY);
	cr_assert_eq(out.status, 301);
	cr_assert_str_eq(out.error, "HTTP 301 (redirects are not followed)");
	cr_assert_eq(receiver_deliveries(&rcv, &d, &got), 0, "%s", rcv.error);
	cr_assert_eq(got, 1, "nothing was sent anywhere else");
	receiver_deliveries_free(d, got);
}

Test(http, a_2xx_whose_body_is_cut_short_counts_as_delivered)
{
	struct sink_event evs[] = { event("evt-cut.1", "{}"), event("evt-cut.2", "{}"),
		                    event("evt-cut.3", "{}") };
	struct sink_outcome outs[3];
	struct receiver_delivery *d;
	size_t got;
	struct sink *s = open_sink(rcv.url, (char *)NULL);

	/* The receiver said 200 and then died: it has the event, and sending
	 * it again would only make a duplicate. A cut-short 503 stays a 503. */
	control("{\"truncate_next\": 1}");
	deliver(s, evs, 1, outs);
	control("{\"truncate_next\": 1, \"fail_next\": 1, \"status\": 503}");
	deliver(s, evs + 1, 2, outs + 1);
	s->close(s);
	cr_assert_eq(outs[0].result, SINK_OK, "%s", outs[0].error);
	cr_assert_eq(outs[0].status, 200);
	cr_assert_eq(outs[1].result, SINK_RETRY);
	cr_assert_eq(outs[1].status, 503);
	cr_assert_str_eq(outs[1].error, "HTTP 503: {\"seq\": 2}");
	cr_assert_eq(outs[2].result, SINK_OK, "%s", outs[2].error);

	cr_assert_eq(receiver_deliveries(&rcv, &d, &got), 0, "%s", rcv.error);
	cr_assert_eq(got, 3);
	cr_assert_neq(d[2].conn, d[1].conn, "a new connection after the cut");
	receiver_deliveries_free(d, got);
}

Test(http, a_closed_port_is_retried_with_the_connection_error)
{
	char url[64];
	struct sink_event ev = event("evt-closed.1", "{}");
	struct sink_outcome out;
	int port = closed_port();
	struct sink *s;

	snprintf(url, sizeof(url), "http://127.0.0.1:%d/hook", port);
	s = open_sink(url, (char *)NULL);
	deliver(s, &ev, 1, &out);
	s->close(s);
	cr_assert_eq(out.result, SINK_RETRY);
	cr_assert_eq(out.status, 0);
	cr_assert_eq(out.retry_after_s, -1);
	cr_assert_not_null(strstr(out.error, "Failed to connect to 127.0.0.1 port"), "%s",
	                   out.error);
	cr_assert_not_null(strstr(out.error, "(Connection refused)"), "%s", out.error);
}

Test(http, a_receiver_slower_than_timeout_is_retried_as_a_timeout)
{
	struct sink_event evs[] = { event("evt-slow.1", "{}"), event("evt-slow.2", "{}") };
	struct sink_outcome outs[2];
	struct sink *s = open_sink(rcv.url, "timeout", "300ms", (char *)NULL);

	control("{\"delay_ms\": 1500}");
	deliver(s, evs, 1, outs);
	cr_assert_eq(outs[0].result, SINK_RETRY);
	cr_assert_eq(outs[0].status, 0);
	cr_assert_str_eq(outs[0].error, "timeout after 300 ms");
	cr_assert(outs[0].latency_ms >= 290 && outs[0].latency_ms < 1400, "latency %.0f ms",
	          outs[0].latency_ms);

	/* The timed-out connection is dropped; the next delivery gets a new one. */
	control("{\"delay_ms\": 0}");
	deliver(s, evs + 1, 1, outs + 1);
	s->close(s);
	cr_assert_eq(outs[1].result, SINK_OK, "%s", outs[1].error);
}

Test(http, urls_that_are_not_http_are_config_errors)
{
	struct err e;

	e = open_error("ftp://x", NULL);
	cr_assert_eq(e.code, ERR_CONFIG);
	cr_assert_str_eq(e.msg, "url \"ftp://x\" is not an http:// or https:// URL");

	e = open_error("not a url", NULL);
	cr_assert_eq(e.code, ERR_CONFIG);
	cr_assert_str_eq(e.msg, "url \"not a url\" is not a valid URL: Bad scheme");

	e = open_error("http://", NULL);
	cr_assert_eq(e.code, ERR_CONFIG);
	cr_assert_str_eq(e.msg, "url \"http://\" is not a valid URL: No host part in the URL");

	e = open_error("", NULL);
	cr_assert_eq(e.code, ERR_CONFIG);
	cr_assert_str_eq(e.msg, "url is required for sink http");
}

Test(http, an_https_url_opens_without_connecting)
{
	struct sink *s = open_sink("https://hooks.example.com/idemflow", (char *)NULL);

	s->close(s);
}

Test(http, a_bad_secret_is_a_config_error)
{
	struct err e = open_error(rcv.url, "whsec_not base64!");

	cr_assert_eq(e.code, ERR_CONFIG);
	cr_assert_str_eq(e.msg, "secret: the text after \"whsec_\" is not valid base64");
}

Test(http, a_secret_shorter_than_24_bytes_is_a_config_error)
{
	struct err e = open_error(rcv.url, "abcdefghijklmnopqrstuvw");

	cr_assert_eq(e.code, ERR_CONFIG);
	cr_assert_str_eq(e.msg, "secret is 23 bytes, shorter than 24: use 24 or more random bytes, "
	                        "e.g. whsec_ and the base64 of 32 (openssl rand -base64 32)");
}

/* The error of opening a sink with secret_previous and, unless NULL, secret. */
static struct err open_error_previous(const char *secret, const char *previous)
{
	struct conf *c = conf_new();
	struct err e = { 0 };
	struct sink *s;

	cr_assert_not_null(c);
	cr_assert_eq(conf_set(c, "url", rcv.url, "test", &e), 0, "%s", e.msg);
	if (secret)
		cr_assert_eq(conf_set(c, "secret", secret, "test", &e), 0, "%s", e.msg);
	cr_assert_eq(conf_set(c, "secret_previous", previous, "test", &e), 0, "%s", e.msg);
	s = sink_http_open(c, &e);
	conf_free(c);
	cr_assert_null(s, "secret_previous \"%s\" was accepted", previous);
	return e;
}

Test(http, a_bad_previous_secret_is_a_config_error)
{
	struct err e = open_error_previous(SECRET, "whsec_YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnc=");

	cr_assert_eq(e.code, ERR_CONFIG);
	cr_assert_str_eq(e.msg,
	                 "secret_previous: the decoded key is 23 bytes, shorter than 24: use "
	                 "24 or more random bytes (openssl rand -base64 32)");
	e = open_error_previous(NULL, OTHER_SECRET);
	cr_assert_eq(e.code, ERR_CONFIG);
	cr_assert_str_eq(e.msg, "secret_previous is set without secret");
}

Test(http, during_a_rotation_both_secrets_sign_in_one_header)
{
	/* secret is the new one, secret_previous the one being replaced: the
	 * header is "v1,<new> v1,<previous>", each made here on its own. */
	struct sink_event ev = event("evt-rotation.1", "{\"rotating\":true}");
	struct sink_outcome out;
	struct receiver_delivery *d;
	uint8_t key[WHSIG_KEY_MAX], prev[WHSIG_KEY_MAX];
	size_t keylen, prevlen, got;
	char want_new[WHSIG_MAX], want_prev[WHSIG_MAX], want[2 * WHSIG_MAX];
	struct err e = { 0 };
	struct sink *s =
	    open_sink(rcv.url, "secret", SECRET, "secret_previous", OTHER_SECRET, (char *)NULL);

	deliver(s, &ev, 1, &out);
	s->close(s);
	cr_assert_eq(out.result, SINK_OK, "%s", out.error);
	cr_assert_eq(receiver_deliveries(&rcv, &d, &got), 0, "%s", rcv.error);
	cr_assert_eq(got, 1);
	cr_assert_not_null(d[0].timestamp);
	cr_assert_not_null(d[0].signature);
	key_of(SECRET, key, &keylen);
	key_of(OTHER_SECRET, prev, &prevlen);
	cr_assert_eq(whsig_sign(key, keylen, ev.event_id, atol(d[0].timestamp), ev.payload,
	                        ev.payload_len, want_new, &e),
	             0, "%s", e.msg);
	cr_assert_eq(whsig_sign(prev, prevlen, ev.event_id, atol(d[0].timestamp), ev.payload,
	                        ev.payload_len, want_prev, &e),
	             0, "%s", e.msg);
	snprintf(want, sizeof(want), "%s %s", want_new, want_prev);
	cr_assert_str_eq(d[0].signature, want);
	cr_assert_eq(strlen(d[0].signature), 2 * 47 + 1);
	/* receiver.py holds only the new secret and accepts. */
	cr_assert_eq(d[0].signature_valid, 1);
	receiver_deliveries_free(d, got);
}

Test(http, an_event_id_that_cannot_be_a_header_is_dead)
{
	struct sink_event ev = event("evt\r\nX-Injected: 1", "{}");
	struct sink_outcome out;
	struct receiver_delivery *d;
	size_t got;
	struct sink *s = open_sink(rcv.url, (char *)NULL);

	deliver(s, &ev, 1, &out);
	s->close(s);
	cr_assert_eq(out.result, SINK_DEAD);
	cr_assert_str_eq(out.error, "event id is not 1 to 255 visible ASCII characters");
	cr_assert_eq(receiver_deliveries(&rcv, &d, &got), 0, "%s", rcv.error);
	cr_assert_eq(got, 0);
	receiver_deliveries_free(d, got);
}
