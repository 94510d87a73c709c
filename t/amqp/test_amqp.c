/*
 * test_amqp.c - the RabbitMQ sink against a real broker.
 *
 * Proves what the dispatcher relies on: a confirmed batch arrives once per
 * event, persistent, with the event id as message_id (what consumers
 * deduplicate on) and the payload byte for byte; a redelivery carries the
 * same message_id; every broker-side failure (nothing listening, a silent
 * peer, a refused login, a nack, a message no queue receives, an exchange
 * deleted under a live connection, a connection cut or gone quiet) is a
 * per-event retry with a clear reason, and the sink recovers by itself; an exchange someone else
 * set up is used as it is; a bad URL is a configuration error.
 * Needs $IDEMFLOW_AMQP_URL, a private node that t/run-test starts.
 */
#include <criterion/criterion.h>
#include <amqp.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "amqpc.h"
#include "core/conf.h"
#include "dispatch/sink.h"
#include "tapi.h"
#include "tdispatch.h"
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

#define MAX_EVENTS 64

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

/* A name no other test (or earlier run) uses. */
static void unique(char *out, size_t outsz, const char *label)
{
	char hex[13];

	tstack_random_hex(hex, 6);
	snprintf(out, outsz, "idf.test.%s.%s", label, hex);
}

/* n events of alternating types; payloads differ and are not plain ASCII. */
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

static struct sink *sink_with(const char *url, const char *exchange, const char *routing_key,
                              const char *timeout)
{
	struct conf *c = conf_new();
	struct err e = { 0 };
	struct sink *s;

	cr_assert_not_null(c);
	cr_assert_eq(conf_set(c, "amqp_url", url, "test", &e), 0, "%s", e.msg);
	cr_assert_eq(conf_set(c, "exchange", exchange, "test", &e), 0, "%s", e.msg);
	cr_assert_eq(conf_set(c, "routing_key", routing_key, "test", &e), 0, "%s", e.msg);
	cr_assert_eq(conf_set(c, "timeout", timeout, "test", &e), 0, "%s", e.msg);
	s = sink_amqp_open(c, &e);
	cr_assert_not_null(s, "sink_amqp_open: %s", e.msg);
	cr_assert_str_eq(s->name, "amqp");
	/* The sink must keep its own copies: the configuration may be reloaded. */
	conf_free(c);
	return s;
}

static void deliver(struct sink *s, struct batch *b)
{
	struct err e = { 0 };

	cr_assert_eq(s->deliver(s, b->ev, b->n, b->out, &e), 0, "deliver: %s", e.msg);
}

static void expect_all(const struct batch *b, enum sink_result r)
{
	for (size_t i = 0; i < b->n; i++)
		cr_assert_eq(b->out[i].result, r, "event %zu: result %d, error \"%s\"", i,
		             (int)b->out[i].result, b->out[i].error);
}

static void consumer_open(struct amqpc *c, const char *exchange, const char *key)
{
	cr_assert_eq(amqpc_open(c, tstack_env("IDEMFLOW_AMQP_URL"), exchange, key), 0, "%s",
	             c->error);
}

static void receive(struct amqpc *c, struct amqpc_msg *m)
{
	int rc = amqpc_next(c, 5000, m);

	cr_assert_neq(rc, -1, "%s", c->error);
	cr_assert_eq(rc, 1, "no message within 5 s");
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

/* A listening socket that never accepts: the kernel completes the TCP
 * handshake, then nobody ever speaks. Returns the fd; *port its port. */
static int silent_listener(int *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(listen(fd, 8), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	*port = ntohs(a.sin_port);
	return fd;
}

/*
 * A TCP relay between the sink and the broker, on its own thread, that a
 * test can cut (every connection closed, new ones still accepted), mute
 * (the broker's replies, confirms included, are swallowed) or stall (it
 * stops reading what the sink sends, as a broker under a memory alarm
 * stops reading from publishers, so the sink's socket fills up).
 */
#define RELAY_PAIRS 8

struct relay {
	int lfd, port, target;
	pthread_t thread;
	atomic_int stop, cut, mute, stall, accepted;
};

static void write_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		/* MSG_NOSIGNAL: a side that hung up must not kill the test. */
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w <= 0)
			return; /* the reader sees the connection die instead */
		p += w;
		n -= (size_t)w;
	}
}

static int dial(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
		                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
		                 .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		close(fd);
		fd = -1;
	}
	return fd;
}

static void pair_close(int pair[2])
{
	close(pair[0]);
	close(pair[1]);
	pair[0] = pair[1] = -1;
}

static void *relay_main(void *arg)
{
	struct relay *r = arg;
	int fds[RELAY_PAIRS][2]; /* [0] the sink's side, [1] the broker's */
	size_t np = 0;
	char buf[16384];

	while (!atomic_load(&r->stop)) {
		struct pollfd p[1 + 2 * RELAY_PAIRS];
		size_t live = 0;

		if (atomic_exchange(&r->cut, 0)) {
			for (size_t i = 0; i < np; i++)
				pair_close(fds[i]);
			np = 0;
		}
		p[0] = (struct pollfd){ .fd = r->lfd, .events = POLLIN };
		for (size_t i = 0; i < np; i++) {
			p[1 + 2 * i] =
			    (struct pollfd){ .fd = fds[i][0],
				             .events = atomic_load(&r->stall) ? 0 : POLLIN };
			p[2 + 2 * i] = (struct pollfd){ .fd = fds[i][1], .events = POLLIN };
		}
		if (poll(p, 1 + 2 * np, 20) <= 0)
			continue;
		for (size_t i = 0; i < np; i++) {
			for (int side = 0; side < 2 && fds[i][0] >= 0; side++) {
				ssize_t n;

				if (!(p[1 + 2 * i + (size_t)side].revents &
				      (POLLIN | POLLHUP | POLLERR)))
					continue;
				n = read(fds[i][side], buf, sizeof(buf));
				if (n <= 0)
					pair_close(fds[i]);
				else if (side == 0 || !atomic_load(&r->mute))
					write_all(fds[i][1 - side], buf, (size_t)n);
			}
		}
		for (size_t i = 0; i < np; i++) {
			if (fds[i][0] >= 0) {
				fds[live][0] = fds[i][0];
				fds[live][1] = fds[i][1];
				live++;
			}
		}
		np = live;
		if ((p[0].revents & POLLIN) && np < RELAY_PAIRS) {
			int c = accept(r->lfd, NULL, NULL);
			int b = c >= 0 ? dial(r->target) : -1;

			if (b >= 0) {
				fds[np][0] = c;
				fds[np][1] = b;
				np++;
				atomic_fetch_add(&r->accepted, 1);
			} else if (c >= 0) {
				close(c);
			}
		}
	}
	for (size_t i = 0; i < np; i++)
		pair_close(fds[i]);
	return NULL;
}

/* Start a relay to the harness's broker; url gets the sink's URL through it. */
static void relay_start(struct relay *r, char *url, size_t urlsz)
{
	struct amqp_connection_info ci;
	char *copy = strdup(tstack_env("IDEMFLOW_AMQP_URL"));

	cr_assert_not_null(copy);
	cr_assert_eq(amqp_parse_url(copy, &ci), AMQP_STATUS_OK);
	memset(r, 0, sizeof(*r));
	r->target = ci.port;
	free(copy);
	r->lfd = silent_listener(&r->port);
	snprintf(url, urlsz, "amqp://guest:guest@127.0.0.1:%d/", r->port);
	cr_assert_eq(pthread_create(&r->thread, NULL, relay_main, r), 0);
}

static void relay_stop(struct relay *r)
{
	atomic_store(&r->stop, 1);
	pthread_join(r->thread, NULL);
	close(r->lfd);
}

/* The next n messages carry the ids of b's events, in order. */
static void expect_ids(struct amqpc *c, const struct batch *b, const char *what)
{
	struct amqpc_msg m;

	for (size_t i = 0; i < b->n; i++) {
		receive(c, &m);
		cr_assert_str_eq(m.message_id, b->id[i], "%s, message %zu", what, i);
		amqpc_msg_free(&m);
	}
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

Test(amqp_sink, batch_of_50_arrives_once_each_in_order_persistent_with_event_ids)
{
	static struct batch b;
	char exchange[64], want_rk[64];
	struct amqpc c;
	struct amqpc_msg m;
	struct sink *s;

	unique(exchange, sizeof(exchange), "batch");
	consumer_open(&c, exchange, "events.#");
	s = sink_with(tstack_env("IDEMFLOW_AMQP_URL"), exchange, "events.{type}", "10s");
	batch_fill(&b, 50, "batch");
	deliver(s, &b);
	expect_all(&b, SINK_OK);
	for (size_t i = 0; i < b.n; i++) {
		cr_assert_str_eq(b.out[i].error, "");
		cr_assert_eq(b.out[i].status, 0);
		cr_assert_eq(b.out[i].retry_after_s, -1);
	}

	/* One channel, one queue: the broker keeps the publishing order. */
	for (size_t i = 0; i < b.n; i++) {
		receive(&c, &m);
		snprintf(want_rk, sizeof(want_rk), "events.%s", types[i % 2]);
		cr_assert_str_eq(m.message_id, b.id[i], "message %zu", i);
		cr_assert_str_eq(m.type, types[i % 2]);
		cr_assert_str_eq(m.routing_key, want_rk);
		cr_assert_str_eq(m.exchange, exchange);
		cr_assert_eq(m.delivery_mode, 2, "message %zu is not persistent", i);
		cr_assert_str_eq(m.content_type, "application/json");
		cr_assert_str_eq(m.app_id, "idemflow");
		cr_assert_str_eq(m.workflow_id, b.wf[i]);
		cr_assert_eq(m.attempt, 1);
		cr_assert_neq(m.timestamp, 0);
		cr_assert_eq(m.body_len, b.ev[i].payload_len);
		cr_assert_eq(memcmp(m.body, b.payload[i], m.body_len), 0, "body %zu: %s", i,
		             m.body);
		amqpc_msg_free(&m);
	}
	cr_assert_eq(amqpc_drain(&c, 300), 0, "messages beyond the 50 published");
	s->close(s);
	amqpc_close(&c);
}

Test(amqp_sink, redelivery_of_an_event_carries_the_same_message_id)
{
	static struct batch b;
	char exchange[64];
	struct amqpc c;
	struct amqpc_msg m1, m2;
	struct sink *s;

	unique(exchange, sizeof(exchange), "redeliver");
	consumer_open(&c, exchange, "#");
	s = sink_with(tstack_env("IDEMFLOW_AMQP_URL"), exchange, "{type}", "10s");
	batch_fill(&b, 1, "redeliver");
	deliver(s, &b);
	expect_all(&b, SINK_OK);
	/* The dispatcher died before recording the outcome: attempt 2. */
	b.ev[0].attempt = 2;
	deliver(s, &b);
	expect_all(&b, SINK_OK);

	receive(&c, &m1);
	receive(&c, &m2);
	cr_assert_str_eq(m1.message_id, b.id[0]);
	cr_assert_str_eq(m2.message_id, b.id[0]);
	cr_assert_eq(m1.attempt, 1);
	cr_assert_eq(m2.attempt, 2);
	cr_assert_str_eq(m2.routing_key, "workflow.created");
	cr_assert_eq(m2.body_len, m1.body_len);
	cr_assert_eq(memcmp(m1.body, m2.body, m1.body_len), 0);
	amqpc_msg_free(&m1);
	amqpc_msg_free(&m2);
	cr_assert_eq(amqpc_drain(&c, 300), 0);
	s->close(s);
	amqpc_close(&c);
}

Test(amqp_sink, unreachable_broker_is_a_retry_for_every_event_not_an_error)
{
	static struct batch b;
	char url[96], want[160];
	int port = closed_port();
	struct sink *s;

	snprintf(url, sizeof(url), "amqp://guest:guest@127.0.0.1:%d/", port);
	/* Opening does not connect: a broker that is down is not a bad config. */
	s = sink_with(url, "idemflow", "{type}", "2s");
	batch_fill(&b, 3, "down");
	deliver(s, &b);
	expect_all(&b, SINK_RETRY);
	snprintf(want, sizeof(want),
	         "cannot connect to RabbitMQ at 127.0.0.1:%d: Connection refused", port);
	for (size_t i = 0; i < b.n; i++) {
		cr_assert_str_eq(b.out[i].error, want);
		cr_assert_eq(b.out[i].status, 0);
		cr_assert_eq(b.out[i].retry_after_s, -1);
	}
	/* And again: every batch tries anew. */
	deliver(s, &b);
	expect_all(&b, SINK_RETRY);
	cr_assert_str_eq(b.out[0].error, want);
	s->close(s);
}

Test(amqp_sink, silent_peer_costs_one_timeout_not_a_hang)
{
	static struct batch b;
	char url[96], want[200];
	int port, fd = silent_listener(&port);
	struct sink *s;
	double t0, took;

	snprintf(url, sizeof(url), "amqp://guest:guest@127.0.0.1:%d/", port);
	s = sink_with(url, "idemflow", "{type}", "300ms");
	batch_fill(&b, 2, "silent");
	t0 = now_s();
	deliver(s, &b);
	took = now_s() - t0;
	expect_all(&b, SINK_RETRY);
	snprintf(want, sizeof(want),
	         "login to RabbitMQ at 127.0.0.1:%d vhost \"/\" as \"guest\" failed: "
	         "no answer within 300 ms",
	         port);
	cr_assert_str_eq(b.out[0].error, want);
	cr_assert_str_eq(b.out[1].error, want);
	cr_assert(took >= 0.29 && took < 2.0, "deliver took %.3f s with a 300 ms timeout", took);
	s->close(s);
	close(fd);
}

Test(amqp_sink, bad_amqp_url_is_a_config_error_naming_the_key)
{
	static const struct {
		const char *url, *msg;
	} cases[] = {
		{ "http://127.0.0.1:5672/",
		  "invalid value \"http://127.0.0.1:5672/\" for \"amqp_url\": expected "
		  "amqp://user:password@host:port/vhost" },
		{ "amqp://guest:s3cret@127.0.0.1:99999/",
		  "invalid value \"amqp://guest:***@127.0.0.1:99999/\" for \"amqp_url\": expected "
		  "amqp://user:password@host:port/vhost" },
		{ "", "invalid value \"\" for \"amqp_url\": expected "
		      "amqp://user:password@host:port/vhost" },
		{ "amqps://guest:s3cret@127.0.0.1/",
		  "invalid value \"amqps://guest:***@127.0.0.1/\" for \"amqp_url\": amqps:// (TLS) "
		  "is not supported" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct conf *c = conf_new();
		struct err e = { 0 };

		cr_assert_not_null(c);
		cr_assert_eq(conf_set(c, "amqp_url", cases[i].url, "test", &e), 0, "%s", e.msg);
		cr_assert_null(sink_amqp_open(c, &e), "accepted %s", cases[i].url);
		cr_assert_eq(e.code, ERR_CONFIG, "%s", cases[i].url);
		cr_assert_str_eq(e.msg, cases[i].msg);
		cr_assert_null(strstr(e.msg, "s3cret"), "the password leaked: %s", e.msg);
		conf_free(c);
	}
}

Test(amqp_sink, nacked_events_are_retried_and_acked_ones_are_not)
{
	static struct batch b;
	char exchange[64];
	struct amqpc full;
	struct sink *s;

	unique(exchange, sizeof(exchange), "nack");
	/* Room for two: the broker nacks the third and fourth publish. */
	cr_assert_eq(
	    amqpc_open_full_after(&full, tstack_env("IDEMFLOW_AMQP_URL"), exchange, "#", 2), 0,
	    "%s", full.error);
	s = sink_with(tstack_env("IDEMFLOW_AMQP_URL"), exchange, "{type}", "10s");
	batch_fill(&b, 4, "nack");
	deliver(s, &b);
	cr_assert_eq(b.out[0].result, SINK_OK, "%s", b.out[0].error);
	cr_assert_eq(b.out[1].result, SINK_OK, "%s", b.out[1].error);
	for (size_t i = 2; i < 4; i++) {
		cr_assert_eq(b.out[i].result, SINK_RETRY);
		cr_assert_str_eq(b.out[i].error, "RabbitMQ refused the message (basic.nack)");
	}
	/* A nack is the broker's answer, not a broken connection: the
	 * channel goes on, and its delivery tags with it. */
	batch_fill(&b, 1, "nack-again");
	deliver(s, &b);
	cr_assert_eq(b.out[0].result, SINK_RETRY);
	cr_assert_str_eq(b.out[0].error, "RabbitMQ refused the message (basic.nack)");
	s->close(s);
	amqpc_close(&full);
}

/*
 * Publisher confirms alone do not say anybody will read a message: the
 * broker confirms a message that no binding routes anywhere and drops it.
 * Published as mandatory, such a message comes back (basic.return, 312
 * NO_ROUTE) and the event is a retry; routed ones in the same batch are
 * delivered, and the channel goes on.
 */
Test(amqp_sink, event_no_queue_receives_is_a_retry_not_a_delivery)
{
	static struct batch b;
	char exchange[64], want[256];
	struct amqpc c;
	struct amqpc_msg m;
	struct sink *s;

	/* An exchange with no queue bound at all. */
	unique(exchange, sizeof(exchange), "unbound");
	s = sink_with(tstack_env("IDEMFLOW_AMQP_URL"), exchange, "ev.{type}", "10s");
	batch_fill(&b, 3, "unbound");
	deliver(s, &b);
	expect_all(&b, SINK_RETRY);
	for (size_t i = 0; i < b.n; i++) {
		snprintf(want, sizeof(want),
		         "RabbitMQ returned the message: 312 NO_ROUTE (no queue is bound to "
		         "exchange \"%s\" for routing key \"ev.%s\")",
		         exchange, types[i % 2]);
		cr_assert_str_eq(b.out[i].error, want, "event %zu", i);
		cr_assert_eq(b.out[i].status, 312);
		cr_assert_eq(b.out[i].retry_after_s, -1);
	}

	/* A queue for one of the two types: a mixed batch on the same
	 * connection, each event decided by its own fate. */
	consumer_open(&c, exchange, "ev.workflow.created");
	batch_fill(&b, 4, "half");
	deliver(s, &b);
	for (size_t i = 0; i < b.n; i++) {
		if (i % 2 == 0) {
			cr_assert_eq(b.out[i].result, SINK_OK, "event %zu: %s", i, b.out[i].error);
			cr_assert_str_eq(b.out[i].error, "");
		} else {
			cr_assert_eq(b.out[i].result, SINK_RETRY, "event %zu", i);
			cr_assert_eq(b.out[i].status, 312, "event %zu: %s", i, b.out[i].error);
		}
	}
	for (size_t i = 0; i < b.n; i += 2) {
		receive(&c, &m);
		cr_assert_str_eq(m.message_id, b.id[i]);
		amqpc_msg_free(&m);
	}
	cr_assert_eq(amqpc_drain(&c, 300), 0);
	s->close(s);
	amqpc_close(&c);
}

Test(amqp_sink, exchange_deleted_under_the_sink_is_a_retry_then_it_recovers)
{
	static struct batch b;
	char exchange[64], want[200], err[512];
	struct amqpc c;
	struct amqpc_msg m;
	struct sink *s;

	unique(exchange, sizeof(exchange), "gone");
	consumer_open(&c, exchange, "#");
	s = sink_with(tstack_env("IDEMFLOW_AMQP_URL"), exchange, "{type}", "10s");
	batch_fill(&b, 1, "before");
	deliver(s, &b);
	expect_all(&b, SINK_OK);
	receive(&c, &m);
	cr_assert_str_eq(m.message_id, b.id[0]);
	amqpc_msg_free(&m);

	cr_assert_eq(
	    amqpc_exchange_delete(tstack_env("IDEMFLOW_AMQP_URL"), exchange, err, sizeof(err)), 0,
	    "%s", err);
	/* The sink's connection is still open: the publish itself fails. */
	batch_fill(&b, 3, "while-gone");
	deliver(s, &b);
	expect_all(&b, SINK_RETRY);
	snprintf(want, sizeof(want),
	         "RabbitMQ closed the channel: 404 NOT_FOUND - no exchange '%s' in vhost '/'",
	         exchange);
	for (size_t i = 0; i < b.n; i++) {
		cr_assert_str_eq(b.out[i].error, want);
		cr_assert_eq(b.out[i].status, 404);
	}

	/* The next batch reconnects and declares the exchange again; were it
	 * still missing, this would be another 404. The deletion took the old
	 * binding with it: the broker returns the messages, nobody got them. */
	batch_fill(&b, 2, "after");
	deliver(s, &b);
	expect_all(&b, SINK_RETRY);
	for (size_t i = 0; i < b.n; i++)
		cr_assert_eq(b.out[i].status, 312, "event %zu: %s", i, b.out[i].error);
	cr_assert_eq(amqpc_drain(&c, 300), 0);
	amqpc_close(&c);

	consumer_open(&c, exchange, "#");
	batch_fill(&b, 1, "rebound");
	deliver(s, &b);
	expect_all(&b, SINK_OK);
	receive(&c, &m);
	cr_assert_str_eq(m.message_id, b.id[0]);
	amqpc_msg_free(&m);
	s->close(s);
	amqpc_close(&c);
}

Test(amqp_sink, connection_cut_while_idle_is_replaced_within_the_same_delivery)
{
	static struct batch b1, b2;
	char exchange[64], url[96];
	struct relay r;
	struct amqpc c;
	struct sink *s;

	unique(exchange, sizeof(exchange), "cut");
	consumer_open(&c, exchange, "#");
	relay_start(&r, url, sizeof(url));
	s = sink_with(url, exchange, "{type}", "5s");
	batch_fill(&b1, 3, "before-cut");
	deliver(s, &b1);
	expect_all(&b1, SINK_OK);
	cr_assert_eq(atomic_load(&r.accepted), 1);

	/* A broker restart or a firewall's idle timeout, between batches. */
	atomic_store(&r.cut, 1);
	tstack_sleep_ms(100);
	batch_fill(&b2, 3, "after-cut");
	deliver(s, &b2);
	expect_all(&b2, SINK_OK);
	cr_assert_eq(atomic_load(&r.accepted), 2, "the sink did not reconnect");

	expect_ids(&c, &b1, "before the cut");
	expect_ids(&c, &b2, "after the cut");
	cr_assert_eq(amqpc_drain(&c, 300), 0);
	s->close(s);
	relay_stop(&r);
	amqpc_close(&c);
}

Test(amqp_sink, broker_gone_quiet_costs_one_timeout_then_a_new_connection)
{
	static struct batch b1, b2, b3;
	char exchange[64], url[96];
	struct relay r;
	struct amqpc c;
	struct sink *s;
	double t0, took;

	unique(exchange, sizeof(exchange), "quiet");
	consumer_open(&c, exchange, "#");
	relay_start(&r, url, sizeof(url));
	s = sink_with(url, exchange, "{type}", "500ms");
	batch_fill(&b1, 2, "before");
	deliver(s, &b1);
	expect_all(&b1, SINK_OK);

	/* The publishes still reach the broker; its confirms never come back. */
	atomic_store(&r.mute, 1);
	batch_fill(&b2, 4, "unconfirmed");
	t0 = now_s();
	deliver(s, &b2);
	took = now_s() - t0;
	expect_all(&b2, SINK_RETRY);
	for (size_t i = 0; i < b2.n; i++)
		cr_assert_str_eq(b2.out[i].error,
		                 "no publisher confirm from RabbitMQ within 500 ms");
	cr_assert(took >= 0.49 && took < 2.0, "deliver took %.3f s with a 500 ms timeout", took);

	atomic_store(&r.mute, 0);
	batch_fill(&b3, 2, "after");
	deliver(s, &b3);
	expect_all(&b3, SINK_OK);
	cr_assert_eq(atomic_load(&r.accepted), 2, "no fresh connection after the timeout");

	/* The unconfirmed ones did arrive: a retry will send them again under
	 * the same message_id, which is why consumers deduplicate on it. */
	expect_ids(&c, &b1, "confirmed");
	expect_ids(&c, &b2, "unconfirmed");
	expect_ids(&c, &b3, "after");
	cr_assert_eq(amqpc_drain(&c, 300), 0);
	s->close(s);
	relay_stop(&r);
	amqpc_close(&c);
}

struct slow_deliver {
	struct sink *s;
	struct sink_event *ev;
	struct sink_outcome *out;
	atomic_int done;
};

static void *slow_deliver_run(void *arg)
{
	struct slow_deliver *d = arg;
	struct err e = { 0 };

	d->s->deliver(d->s, d->ev, 1, d->out, &e);
	atomic_store(&d->done, 1);
	return NULL;
}

/*
 * An event larger than every socket buffer on the way, published to a
 * broker that stopped reading after the sink found its socket writable:
 * the publish itself must end at the sink's timeout (the dispatcher's
 * lease is longer), not block until the broker reads again.
 */
Test(amqp_sink, a_large_publish_to_a_broker_that_stopped_reading_ends_at_the_timeout)
{
	enum { BIG = 64 * 1024 * 1024 };
	static struct batch b1, b2;
	char exchange[64], url[96], wf[37];
	struct slow_deliver d = { 0 };
	struct sink_outcome out = { 0 };
	struct sink_event ev;
	struct relay r;
	struct amqpc c;
	pthread_t th;
	double t0, took;
	char *payload = malloc(BIG);

	cr_assert_not_null(payload);
	memset(payload, ' ', BIG);
	payload[0] = '{';
	payload[BIG - 1] = '}';
	unique(exchange, sizeof(exchange), "stall");
	consumer_open(&c, exchange, "#");
	relay_start(&r, url, sizeof(url));
	d.s = sink_with(url, exchange, "{type}", "500ms");
	batch_fill(&b1, 1, "before");
	deliver(d.s, &b1);
	expect_all(&b1, SINK_OK);

	atomic_store(&r.stall, 1);
	tstack_uuid(wf);
	ev = (struct sink_event){ .event_id = wf,
		                  .type = "workflow.created",
		                  .workflow_id = wf,
		                  .payload = payload,
		                  .payload_len = BIG,
		                  .attempt = 1,
		                  .max_attempts = 8 };
	d.ev = &ev;
	d.out = &out;
	t0 = now_s();
	cr_assert_eq(pthread_create(&th, NULL, slow_deliver_run, &d), 0);
	while (!atomic_load(&d.done) && now_s() - t0 < 10)
		tstack_sleep_ms(20);
	took = now_s() - t0;
	cr_assert(atomic_load(&d.done), "the publish still blocks after %.1f s, timeout 500 ms",
	          took);
	pthread_join(th, NULL);
	cr_assert(took >= 0.49 && took < 2.0, "deliver took %.3f s with a 500 ms timeout", took);
	cr_assert_eq(out.result, SINK_RETRY);
	cr_assert_str_eq(out.error, "RabbitMQ is not reading within 500 ms");

	/* The broker reads again: a fresh connection delivers. */
	atomic_store(&r.stall, 0);
	batch_fill(&b2, 2, "after");
	deliver(d.s, &b2);
	expect_all(&b2, SINK_OK);
	cr_assert_eq(atomic_load(&r.accepted), 2, "no fresh connection after the timeout");
	d.s->close(d.s);
	relay_stop(&r);
	amqpc_close(&c);
	free(payload);
}

Test(amqp_sink, exchange_set_up_with_another_type_is_used_as_it_is)
{
	static struct batch b;
	char exchange[64], err[512];
	struct amqpc c;
	struct amqpc_msg m;
	struct sink *s;

	unique(exchange, sizeof(exchange), "direct");
	cr_assert_eq(amqpc_exchange_declare(tstack_env("IDEMFLOW_AMQP_URL"), exchange, "direct",
	                                    err, sizeof(err)),
	             0, "%s", err);
	consumer_open(&c, exchange, "workflow.created");
	s = sink_with(tstack_env("IDEMFLOW_AMQP_URL"), exchange, "{type}", "10s");
	batch_fill(&b, 2, "direct");
	deliver(s, &b);
	/* A direct exchange routes on the exact key: only the first one; the
	 * second reaches no queue and is not delivered. */
	cr_assert_eq(b.out[0].result, SINK_OK, "%s", b.out[0].error);
	cr_assert_eq(b.out[1].result, SINK_RETRY);
	cr_assert_eq(b.out[1].status, 312, "%s", b.out[1].error);
	receive(&c, &m);
	cr_assert_str_eq(m.message_id, b.id[0]);
	cr_assert_str_eq(m.routing_key, "workflow.created");
	amqpc_msg_free(&m);
	cr_assert_eq(amqpc_drain(&c, 300), 0);
	s->close(s);
	amqpc_close(&c);
}

Test(amqp_sink, wrong_password_is_a_403_retry_naming_the_user_and_vhost)
{
	static struct batch b;
	char url[160], want[256];
	struct amqp_connection_info ci;
	char *copy = strdup(tstack_env("IDEMFLOW_AMQP_URL"));
	struct sink *s;

	cr_assert_not_null(copy);
	cr_assert_eq(amqp_parse_url(copy, &ci), AMQP_STATUS_OK);
	snprintf(url, sizeof(url), "amqp://guest:wrong@%s:%d/", ci.host, ci.port);
	s = sink_with(url, "idemflow", "{type}", "5s");
	batch_fill(&b, 2, "password");
	deliver(s, &b);
	expect_all(&b, SINK_RETRY);
	snprintf(
	    want, sizeof(want),
	    "login to RabbitMQ at %s:%d vhost \"/\" as \"guest\" failed: RabbitMQ closed the "
	    "connection: 403 ACCESS_REFUSED - Login was refused using authentication mechanism "
	    "PLAIN. For details see the broker logfile.",
	    ci.host, ci.port);
	for (size_t i = 0; i < b.n; i++) {
		cr_assert_str_eq(b.out[i].error, want);
		cr_assert_eq(b.out[i].status, 403);
	}
	free(copy);
	s->close(s);
}

/*
 * The whole path: idemflow-dispatch drains the outbox to RabbitMQ. Every
 * event arrives once, persistent, with its event id as message_id and the
 * routing key from the template, and is marked published. Only this test
 * writes outbox rows, so the dispatcher's run is this test's alone.
 */
Test(amqp_dispatch, the_dispatcher_publishes_every_event_with_its_id_and_marks_it)
{
	struct tdispatch td;
	struct amqpc c;
	char exchange[64];
	int rc;

	tdispatch_open(&td, "test_amqp", "amqp-dispatch");
	snprintf(exchange, sizeof(exchange), "dispatch-%ld", (long)getpid());
	consumer_open(&c, exchange, "wf.#");
	tdispatch_seed(&td, 30, 1, "workflow.created");
	const char *common[] = {
		"--once",     "--sink", "amqp", "--amqp-url", tstack_env("IDEMFLOW_AMQP_URL"),
		"--exchange", exchange, NULL
	};
	const char *routed[] = { "--routing-key", "wf.{type}", "--log-level", "warning", NULL };
	rc = tdispatch_run(&td, common, routed);
	cr_assert_eq(rc, 0, "idemflow-dispatch exited with %d (log: %s)", rc, td.log);
	cr_assert_eq(tdispatch_count(&td, "published_at IS NOT NULL AND attempts = 1"), 30,
	             "every event marked published on attempt 1");

	for (int i = 0; i < 30; i++) {
		struct amqpc_msg m;
		receive(&c, &m);
		cr_assert_eq(m.delivery_mode, 2, "persistent");
		cr_assert_str_eq(m.routing_key, "wf.workflow.created");
		cr_assert_str_eq(m.type, "workflow.created");
		cr_assert_eq(tstack_count("SELECT count(*)\n"
		                          "  FROM outbox\n"
		                          " WHERE event_id = $1 AND payload = $2\n",
		                          m.message_id, m.body),
		             1, "message_id %s is an event id, body byte for byte", m.message_id);
		amqpc_msg_free(&m);
	}
	cr_assert_eq(amqpc_drain(&c, 300), 0, "no message arrived twice");

	/* An event whose routing key no binding matches: attempt 1 is a
	 * failure with the broker's reason, the last attempt makes it dead,
	 * and it is never marked published. */
	tdispatch_seed(&td, 1, 1, "nobody.listens");
	const char *unroutable[] = {
		"--routing-key", "none.{type}", "--max-attempts", "2", "--log-level", "error", NULL
	};
	rc = tdispatch_run(&td, common, unroutable);
	cr_assert_eq(rc, 0, "idemflow-dispatch exited with %d (log: %s)", rc, td.log);
	const char *retried =
	    "type = 'nobody.listens' AND attempts = 1\n"
	    "   AND published_at IS NULL AND dead_at IS NULL\n"
	    "   AND next_attempt_at > now()\n"
	    "   AND last_error LIKE 'RabbitMQ returned the message: 312 NO_ROUTE%'";
	cr_assert_eq(tdispatch_count(&td, retried), 1,
	             "an unroutable event is a failed attempt, to be retried");
	const char *p[1] = { td.tenant };
	PQclear(tdispatch_sql(&td,
	                      "UPDATE outbox\n"
	                      "   SET next_attempt_at = now()\n"
	                      " WHERE tenant_id = $1 AND type = 'nobody.listens'\n",
	                      1, p));
	rc = tdispatch_run(&td, common, unroutable);
	cr_assert_eq(rc, 0, "idemflow-dispatch exited with %d (log: %s)", rc, td.log);
	cr_assert_eq(tdispatch_count(&td, "type = 'nobody.listens' AND attempts = 2\n"
	                                  "   AND published_at IS NULL AND dead_at IS NOT NULL"),
	             1, "dead after its last attempt, never published");
	cr_assert_eq(amqpc_drain(&c, 300), 0, "the unroutable event reached nobody");
	amqpc_close(&c);
	tdispatch_close(&td);
}
