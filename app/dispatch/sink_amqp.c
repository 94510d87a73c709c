/*
 * sink_amqp.c - deliver events to a RabbitMQ exchange (AMQP 0-9-1, rabbitmq-c).
 *
 * Each event becomes one persistent message whose message_id is the event
 * id, so consumers can deduplicate redeliveries. A batch is published in one
 * go on a channel in publisher-confirm mode, then the broker's basic.ack /
 * basic.nack frames decide each event: only a confirmed message counts as
 * delivered, because only then has the broker taken responsibility for it.
 * Messages are mandatory: one that no queue receives (no binding matches)
 * comes back as basic.return before its ack, and is a failed attempt, not a
 * delivery, since nobody will ever read it.
 *
 * The connection is opened on the first delivery and kept between batches.
 * Anything that leaves a message's fate unknown (lost connection, no confirm
 * in time, a channel closed by the broker) drops the connection, so the next
 * batch starts from a clean channel whose delivery tags start again at 1.
 * A kept connection that turns out to have died while idle gets one
 * immediate replacement within the same delivery. A failure here is always
 * "try again later" (SINK_RETRY): the broker, not the event, is the problem.
 */
#include "dispatch/sink.h"

#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define AMQP_CHANNEL 1
#define SHORTSTR_MAX 255 /* AMQP short strings: exchange, routing key, message_id, type */

struct amqp_sink {
	struct sink base;
	char *url_buf; /* amqp_parse_url's storage: ci points into it */
	struct amqp_connection_info ci;
	char *exchange;
	char *routing_key; /* template: "{type}" is the event type */
	long timeout_ms;
	amqp_connection_state_t conn; /* NULL until connected, and after a drop */
	uint64_t next_tag;            /* delivery tag of the next publish on the channel */
	char blocked[128];            /* why the broker blocked us (connection.blocked), or "" */
	/* The publishes' deadline (publish_guard_arm). */
	pthread_mutex_t guard_mu;
	timer_t guard_timer;
	int guard_ok;    /* the timer exists */
	int guard_fd;    /* the socket the timer shuts down, -1 when disarmed */
	int guard_fired; /* it did */
};

/* Where each event of a batch stands while its confirm is awaited. */
enum ev_state { EV_PENDING, EV_ACKED, EV_NACKED, EV_RETURNED, EV_SKIPPED };

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static struct timeval ms_to_tv(double ms)
{
	struct timeval tv;

	if (ms < 0)
		ms = 0;
	tv.tv_sec = (time_t)(ms / 1000);
	tv.tv_usec = (suseconds_t)((ms - (double)tv.tv_sec * 1000) * 1000);
	return tv;
}

static amqp_bytes_t bytes_of(const char *s, size_t len)
{
	return (amqp_bytes_t){ .len = len, .bytes = (void *)s };
}

/* The URL without its password, for messages. */
static void url_redacted(const char *url, char *out, size_t outsz)
{
	const char *scheme = strstr(url, "://");
	const char *host = scheme != NULL ? scheme + 3 : NULL;
	size_t authority = host != NULL ? strcspn(host, "/") : 0;
	const char *at = host != NULL ? memchr(host, '@', authority) : NULL;
	const char *colon;

	if (at == NULL) {
		snprintf(out, outsz, "%s", url);
		return;
	}
	colon = memchr(host, ':', (size_t)(at - host));
	if (colon == NULL) {
		snprintf(out, outsz, "%s", url);
		return;
	}
	snprintf(out, outsz, "%.*s:***%s", (int)(colon - url), url, at);
}

/* The text of a failed RPC; *code gets the broker's reply code, if any. */
static void rpc_error(const struct amqp_sink *as, amqp_rpc_reply_t r, char *out, size_t outsz,
                      int *code)
{
	*code = 0;
	switch (r.reply_type) {
	case AMQP_RESPONSE_NORMAL: snprintf(out, outsz, "no error"); break;
	case AMQP_RESPONSE_NONE: snprintf(out, outsz, "no reply from RabbitMQ"); break;
	case AMQP_RESPONSE_LIBRARY_EXCEPTION:
		if (r.library_error == AMQP_STATUS_TIMEOUT)
			snprintf(out, outsz, "no answer within %ld ms", as->timeout_ms);
		else
			snprintf(out, outsz, "%s", amqp_error_string2(r.library_error));
		break;
	case AMQP_RESPONSE_SERVER_EXCEPTION:
		if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
			const amqp_connection_close_t *m = r.reply.decoded;
			*code = m->reply_code;
			snprintf(out, outsz, "RabbitMQ closed the connection: %d %.*s",
			         m->reply_code, (int)m->reply_text.len,
			         (const char *)m->reply_text.bytes);
		} else if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
			const amqp_channel_close_t *m = r.reply.decoded;
			*code = m->reply_code;
			snprintf(out, outsz, "RabbitMQ closed the channel: %d %.*s", m->reply_code,
			         (int)m->reply_text.len, (const char *)m->reply_text.bytes);
		} else {
			snprintf(out, outsz, "unexpected reply %s",
			         amqp_method_name(r.reply.id) ? amqp_method_name(r.reply.id)
			                                      : "(unknown)");
		}
		break;
	}
}

/*
 * Forget the connection. A polite close (connection.close, bounded by the
 * RPC timeout) when the socket is still usable; otherwise just the socket.
 */
static void drop(struct amqp_sink *as, int polite)
{
	if (as->conn == NULL)
		return;
	if (polite)
		(void)amqp_connection_close(as->conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(as->conn);
	as->conn = NULL;
	as->blocked[0] = '\0';
}

/* Answer a channel.close from the broker, which it requires before the
 * channel number may be used again. */
static void channel_close_ok(struct amqp_sink *as)
{
	amqp_channel_close_ok_t ok = { 0 };

	(void)amqp_send_method(as->conn, AMQP_CHANNEL, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
}

/*
 * Declare the exchange as a durable topic exchange, so a fresh broker
 * works out of the box. Declaring is idempotent; an exchange that already
 * exists with another type or other arguments (406 PRECONDITION_FAILED) was
 * set up on purpose by someone else, and is used as it is.
 */
static int declare_exchange(struct amqp_sink *as, char *why, size_t wlen, int *code)
{
	amqp_rpc_reply_t r;

	amqp_exchange_declare(as->conn, AMQP_CHANNEL, amqp_cstring_bytes(as->exchange),
	                      amqp_cstring_bytes("topic"), 0, 1, 0, 0, amqp_empty_table);
	r = amqp_get_rpc_reply(as->conn);
	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return 0;
	rpc_error(as, r, why, wlen, code);
	if (r.reply_type != AMQP_RESPONSE_SERVER_EXCEPTION ||
	    r.reply.id != AMQP_CHANNEL_CLOSE_METHOD || *code != AMQP_PRECONDITION_FAILED)
		return -1;
	channel_close_ok(as);
	*code = 0;
	amqp_channel_open(as->conn, AMQP_CHANNEL);
	r = amqp_get_rpc_reply(as->conn);
	if (r.reply_type != AMQP_RESPONSE_NORMAL) {
		rpc_error(as, r, why, wlen, code);
		return -1;
	}
	return 0;
}

/*
 * Why a TCP connection to host:port fails, found by trying once more:
 * rabbitmq-c says only "a socket error occurred", and "Connection refused"
 * or "No route to host" is what an operator needs to read.
 */
static void connect_reason(const char *host, int port, long timeout_ms, char *out, size_t outsz)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
	char service[16];
	int fd = -1, rc, soerr = 0;
	socklen_t len = sizeof(soerr);

	snprintf(out, outsz, "%s", amqp_error_string2(AMQP_STATUS_SOCKET_ERROR));
	snprintf(service, sizeof(service), "%d", port);
	if (getaddrinfo(host, service, &hints, &ai) != 0)
		goto out;
	fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
	if (fd < 0)
		goto out;
	rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
	if (rc < 0 && errno == EINPROGRESS) {
		struct pollfd p = { .fd = fd, .events = POLLOUT };
		rc = poll(&p, 1, (int)timeout_ms);
		if (rc == 0) {
			snprintf(out, outsz, "no answer within %ld ms", timeout_ms);
			goto out;
		}
		if (rc > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0 && soerr)
			snprintf(out, outsz, "%s", strerror(soerr));
	} else if (rc < 0) {
		snprintf(out, outsz, "%s", strerror(errno));
	}
out:
	if (fd >= 0)
		close(fd);
	if (ai != NULL)
		freeaddrinfo(ai);
}

/* Connect, log in, open the channel, declare, enable confirms. On failure
 * why says which step failed, *code has the broker's reply code if it
 * refused something, and the connection is gone. */
static int connect_broker(struct amqp_sink *as, char *why, size_t wlen, int *code)
{
	const struct amqp_connection_info *ci = &as->ci;
	struct timeval tv = ms_to_tv((double)as->timeout_ms);
	amqp_socket_t *sock;
	amqp_rpc_reply_t r;
	char detail[200];
	int st, rc = -1;
	/* connection_name shows up in the broker's management views; the
	 * capability lets the broker tell us why it stops reading. */
	amqp_table_entry_t caps[] = {
		{ .key = amqp_cstring_bytes("connection.blocked"),
		  .value = { .kind = AMQP_FIELD_KIND_BOOLEAN, .value = { .boolean = 1 } } },
	};
	amqp_table_entry_t props[] = {
		{ .key = amqp_cstring_bytes("connection_name"),
		  .value = { .kind = AMQP_FIELD_KIND_UTF8,
		             .value = { .bytes = amqp_cstring_bytes("idemflow-dispatch") } } },
		{ .key = amqp_cstring_bytes("capabilities"),
		  .value = { .kind = AMQP_FIELD_KIND_TABLE,
		             .value = { .table = { .num_entries = 1, .entries = caps } } } },
	};
	amqp_table_t client_props = { .num_entries = 2, .entries = props };

	*code = 0;
	as->conn = amqp_new_connection();
	if (as->conn == NULL) {
		snprintf(why, wlen, "out of memory");
		return -1;
	}
	sock = amqp_tcp_socket_new(as->conn);
	if (sock == NULL) {
		snprintf(why, wlen, "out of memory");
		goto out;
	}
	st = amqp_socket_open_noblock(sock, ci->host, ci->port, &tv);
	if (st != AMQP_STATUS_OK) {
		if (st == AMQP_STATUS_SOCKET_ERROR)
			connect_reason(ci->host, ci->port, as->timeout_ms, detail, sizeof(detail));
		else if (st == AMQP_STATUS_TIMEOUT)
			snprintf(detail, sizeof(detail), "no answer within %ld ms", as->timeout_ms);
		else
			snprintf(detail, sizeof(detail), "%s", amqp_error_string2(st));
		snprintf(why, wlen, "cannot connect to RabbitMQ at %s:%d: %s", ci->host, ci->port,
		         detail);
		goto out;
	}
	if (amqp_set_handshake_timeout(as->conn, &tv) != AMQP_STATUS_OK ||
	    amqp_set_rpc_timeout(as->conn, &tv) != AMQP_STATUS_OK) {
		snprintf(why, wlen, "cannot set the AMQP timeouts");
		goto out;
	}
	/* No heartbeats: between batches the connection may idle for a long
	 * time, and a dead one is noticed by the bounded wait for confirms. */
	r = amqp_login_with_properties(as->conn, ci->vhost, 0, AMQP_DEFAULT_FRAME_SIZE, 0,
	                               &client_props, AMQP_SASL_METHOD_PLAIN, ci->user,
	                               ci->password);
	if (r.reply_type != AMQP_RESPONSE_NORMAL) {
		rpc_error(as, r, detail, sizeof(detail), code);
		snprintf(why, wlen, "login to RabbitMQ at %s:%d vhost \"%s\" as \"%s\" failed: %s",
		         ci->host, ci->port, ci->vhost, ci->user, detail);
		goto out;
	}
	amqp_channel_open(as->conn, AMQP_CHANNEL);
	r = amqp_get_rpc_reply(as->conn);
	if (r.reply_type != AMQP_RESPONSE_NORMAL) {
		rpc_error(as, r, detail, sizeof(detail), code);
		snprintf(why, wlen, "cannot open a channel: %s", detail);
		goto out;
	}
	if (as->exchange[0] != '\0' && declare_exchange(as, detail, sizeof(detail), code) < 0) {
		snprintf(why, wlen, "cannot declare exchange \"%s\": %s", as->exchange, detail);
		goto out;
	}
	amqp_confirm_select(as->conn, AMQP_CHANNEL);
	r = amqp_get_rpc_reply(as->conn);
	if (r.reply_type != AMQP_RESPONSE_NORMAL) {
		rpc_error(as, r, detail, sizeof(detail), code);
		snprintf(why, wlen, "cannot enable publisher confirms: %s", detail);
		goto out;
	}
	as->next_tag = 1;
	rc = 0;
out:
	if (rc < 0) {
		amqp_destroy_connection(as->conn);
		as->conn = NULL;
	}
	return rc;
}

/* The routing key for one event: the template with every "{type}"
 * replaced. Returns -1 when it does not fit an AMQP short string. */
static int routing_key(const struct amqp_sink *as, const char *type, char *out, size_t outsz)
{
	static const char token[] = "{type}";
	const char *p = as->routing_key, *hit;
	size_t len = 0, tl = strlen(type);

	while ((hit = strstr(p, token)) != NULL) {
		size_t pre = (size_t)(hit - p);
		if (len + pre + tl >= outsz)
			return -1;
		memcpy(out + len, p, pre);
		memcpy(out + len + pre, type, tl);
		len += pre + tl;
		p = hit + sizeof(token) - 1;
	}
	if (len + strlen(p) >= outsz)
		return -1;
	memcpy(out + len, p, strlen(p) + 1);
	return 0;
}

/* Wait up to deadline (now_ms() clock) for the socket to take more data.
 * rabbitmq-c's publish waits for that without a bound; a broker that has
 * stopped reading (a memory or disk alarm) must cost a timeout, not a hang. */
static int wait_writable(struct amqp_sink *as, double deadline)
{
	struct pollfd p = { .fd = amqp_get_sockfd(as->conn), .events = POLLOUT };
	int rc;

	do {
		double left = deadline - now_ms();
		if (left <= 0)
			return 0;
		rc = poll(&p, 1, (int)left + 1);
	} while (rc < 0 && errno == EINTR);
	return rc > 0 ? 1 : rc;
}

/*
 * rabbitmq-c's publish waits for the socket without a bound, and
 * wait_writable only knows that some bytes fit: a message larger than the
 * socket's buffers, to a broker that stops reading meanwhile (a memory or
 * disk alarm), blocked past the timeout and the dispatcher's lease. A timer
 * (its own thread, SIGEV_THREAD) shuts the socket down at the deadline, so
 * the publish fails at once and the connection is dropped. The mutex makes
 * a disarmed timer harmless: once publish_guard_disarm returns, it no longer
 * touches the socket.
 */
static void publish_guard_fire(union sigval v)
{
	struct amqp_sink *as = v.sival_ptr;

	pthread_mutex_lock(&as->guard_mu);
	if (as->guard_fd >= 0) {
		shutdown(as->guard_fd, SHUT_RDWR);
		as->guard_fired = 1;
		as->guard_fd = -1;
	}
	pthread_mutex_unlock(&as->guard_mu);
}

static void publish_guard_arm(struct amqp_sink *as, double deadline)
{
	double left = deadline - now_ms();
	struct itimerspec it = { 0 };

	if (!as->guard_ok)
		return;
	if (left < 1)
		left = 1;
	pthread_mutex_lock(&as->guard_mu);
	as->guard_fd = amqp_get_sockfd(as->conn);
	as->guard_fired = 0;
	pthread_mutex_unlock(&as->guard_mu);
	it.it_value.tv_sec = (time_t)(left / 1000);
	it.it_value.tv_nsec = (long)((left - (double)it.it_value.tv_sec * 1000) * 1e6);
	timer_settime(as->guard_timer, 0, &it, NULL);
}

/* 1 when the timer shut the socket down. */
static int publish_guard_disarm(struct amqp_sink *as)
{
	const struct itimerspec off = { 0 };
	int fired;

	if (!as->guard_ok)
		return 0;
	timer_settime(as->guard_timer, 0, &off, NULL);
	pthread_mutex_lock(&as->guard_mu);
	as->guard_fd = -1;
	fired = as->guard_fired;
	pthread_mutex_unlock(&as->guard_mu);
	return fired;
}

static int publish_one(struct amqp_sink *as, const struct sink_event *ev, const char *rk)
{
	amqp_basic_properties_t props;
	amqp_table_entry_t hdrs[4];
	int nh = 0;

	hdrs[nh].key = amqp_cstring_bytes("attempt");
	hdrs[nh].value.kind = AMQP_FIELD_KIND_I32;
	hdrs[nh++].value.value.i32 = ev->attempt;
	if (ev->workflow_id != NULL) {
		hdrs[nh].key = amqp_cstring_bytes("workflow_id");
		hdrs[nh].value.kind = AMQP_FIELD_KIND_UTF8;
		hdrs[nh++].value.value.bytes = amqp_cstring_bytes(ev->workflow_id);
	}
	/* W3C Trace Context over AMQP: the same names as the HTTP headers,
	 * as application properties (message headers). */
	if (ev->traceparent != NULL) {
		hdrs[nh].key = amqp_cstring_bytes("traceparent");
		hdrs[nh].value.kind = AMQP_FIELD_KIND_UTF8;
		hdrs[nh++].value.value.bytes = amqp_cstring_bytes(ev->traceparent);
		if (ev->tracestate != NULL) {
			hdrs[nh].key = amqp_cstring_bytes("tracestate");
			hdrs[nh].value.kind = AMQP_FIELD_KIND_UTF8;
			hdrs[nh++].value.value.bytes = amqp_cstring_bytes(ev->tracestate);
		}
	}
	memset(&props, 0, sizeof(props));
	props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
	               AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TYPE_FLAG |
	               AMQP_BASIC_TIMESTAMP_FLAG | AMQP_BASIC_APP_ID_FLAG | AMQP_BASIC_HEADERS_FLAG;
	props.content_type = amqp_cstring_bytes("application/json");
	props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
	props.message_id = amqp_cstring_bytes(ev->event_id);
	props.type = amqp_cstring_bytes(ev->type);
	props.timestamp = (uint64_t)time(NULL);
	props.app_id = amqp_cstring_bytes("idemflow");
	props.headers = (amqp_table_t){ .num_entries = nh, .entries = hdrs };
	/* mandatory: a message no queue is bound for comes back (basic.return)
	 * instead of vanishing, since the broker confirms it all the same. */
	return amqp_basic_publish(as->conn, AMQP_CHANNEL, amqp_cstring_bytes(as->exchange),
	                          amqp_cstring_bytes(rk), 1, 0, &props,
	                          bytes_of(ev->payload, ev->payload_len));
}

static void outcome_set(struct sink_outcome *o, enum sink_result r, int status, const char *why)
{
	o->result = r;
	o->retry_after_s = -1;
	o->status = status;
	snprintf(o->error, sizeof(o->error), "%s", why);
}

/* One batch in flight: where each event stands and why it failed. */
struct flight {
	const struct sink_event *evs;
	struct sink_outcome *outs;
	size_t n;
	enum ev_state *state;
	char *returned;  /* 1 once the broker returned the event: its ack is no delivery */
	size_t *tag_idx; /* delivery tag - first_tag -> event index */
	double *sent_at; /* now_ms() of each publish, for latency_ms */
	uint64_t first_tag;
	size_t pending; /* published, not yet acked or nacked */
	size_t settled; /* acked or nacked */
	double deadline;
	int polite;    /* after a failure: the connection may still be closed politely */
	int code;      /* the broker's reply code when it closed something */
	char why[256]; /* the failure, for every event it leaves unsettled */
	int ret_code;  /* of the basic.return whose header frame comes next, or 0 */
	char ret_why[256];
};

/* Settle the pending events up to delivery tag `tag` (only that one unless
 * multiple) as acked or nacked. */
static void settle(struct flight *fl, uint64_t end_tag, uint64_t tag, int multiple,
                   enum ev_state to)
{
	uint64_t lo = multiple ? fl->first_tag : tag;

	if (tag < fl->first_tag || tag >= end_tag)
		return; /* not one of ours */
	for (uint64_t t = lo; t <= tag; t++) {
		size_t i = fl->tag_idx[t - fl->first_tag];
		if (fl->state[i] != EV_PENDING)
			continue;
		fl->state[i] = to == EV_ACKED && fl->returned[i] ? EV_RETURNED : to;
		fl->outs[i].latency_ms = now_ms() - fl->sent_at[i];
		fl->pending--;
		fl->settled++;
	}
}

/* The header frame of a basic.return: mark the event it names (by
 * message_id, the event id) as returned, with the reason. */
static void returned(struct flight *fl, const amqp_basic_properties_t *p)
{
	int code = fl->ret_code;

	fl->ret_code = 0;
	if (p == NULL || !(p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG))
		return;
	for (size_t i = 0; i < fl->n; i++) {
		const char *id = fl->evs[i].event_id;

		if (fl->state[i] != EV_PENDING || fl->returned[i] ||
		    strlen(id) != p->message_id.len ||
		    memcmp(id, p->message_id.bytes, p->message_id.len) != 0)
			continue;
		fl->returned[i] = 1;
		outcome_set(&fl->outs[i], SINK_RETRY, code, fl->ret_why);
		return;
	}
}

/* How a batch went. Only FL_LOST on a connection that had been idle is
 * worth an immediate second try. */
enum fl_result { FL_DONE, FL_LOST, FL_FAILED };

/* Read frames until every published event is settled or the deadline passes. */
static enum fl_result await_confirms(struct amqp_sink *as, struct flight *fl)
{
	while (fl->pending > 0) {
		amqp_frame_t f;
		struct timeval tv = ms_to_tv(fl->deadline - now_ms());
		int st;

		amqp_maybe_release_buffers(as->conn); /* the previous frame is handled */
		st = amqp_simple_wait_frame_noblock(as->conn, &f, &tv);
		if (st == AMQP_STATUS_TIMEOUT) {
			snprintf(fl->why, sizeof(fl->why),
			         "no publisher confirm from RabbitMQ within %ld ms%s%s",
			         as->timeout_ms, as->blocked[0] ? ": " : "", as->blocked);
			return FL_FAILED;
		}
		if (st != AMQP_STATUS_OK) {
			snprintf(fl->why, sizeof(fl->why), "connection to RabbitMQ lost: %s",
			         amqp_error_string2(st));
			return FL_LOST;
		}
		if (f.frame_type == AMQP_FRAME_HEADER && fl->ret_code != 0) {
			returned(fl, f.payload.properties.decoded);
			continue;
		}
		if (f.frame_type != AMQP_FRAME_METHOD)
			continue; /* a returned message's body: the header named it */
		switch (f.payload.method.id) {
		case AMQP_BASIC_RETURN_METHOD: {
			/* e.g. 312 NO_ROUTE; the header frame that follows carries
			 * the message_id, which says which event it was. */
			const amqp_basic_return_t *m = f.payload.method.decoded;
			fl->ret_code = m->reply_code ? m->reply_code : -1;
			snprintf(fl->ret_why, sizeof(fl->ret_why),
			         "RabbitMQ returned the message: %d %.*s (no queue is bound to "
			         "exchange \"%.*s\" for routing key \"%.*s\")",
			         m->reply_code, (int)m->reply_text.len,
			         (const char *)m->reply_text.bytes, (int)m->exchange.len,
			         (const char *)m->exchange.bytes, (int)m->routing_key.len,
			         (const char *)m->routing_key.bytes);
			break;
		}
		case AMQP_BASIC_ACK_METHOD: {
			const amqp_basic_ack_t *m = f.payload.method.decoded;
			settle(fl, as->next_tag, m->delivery_tag, m->multiple, EV_ACKED);
			break;
		}
		case AMQP_BASIC_NACK_METHOD: {
			const amqp_basic_nack_t *m = f.payload.method.decoded;
			settle(fl, as->next_tag, m->delivery_tag, m->multiple, EV_NACKED);
			break;
		}
		case AMQP_CONNECTION_BLOCKED_METHOD: {
			const amqp_connection_blocked_t *m = f.payload.method.decoded;
			snprintf(as->blocked, sizeof(as->blocked),
			         "RabbitMQ blocked publishing (%.*s)", (int)m->reason.len,
			         (const char *)m->reason.bytes);
			break;
		}
		case AMQP_CONNECTION_UNBLOCKED_METHOD: as->blocked[0] = '\0'; break;
		case AMQP_CHANNEL_CLOSE_METHOD: {
			/* e.g. 404 when the exchange was deleted behind our back */
			const amqp_channel_close_t *m = f.payload.method.decoded;
			fl->code = m->reply_code;
			snprintf(fl->why, sizeof(fl->why), "RabbitMQ closed the channel: %d %.*s",
			         m->reply_code, (int)m->reply_text.len,
			         (const char *)m->reply_text.bytes);
			channel_close_ok(as);
			fl->polite = 1;
			return FL_FAILED;
		}
		case AMQP_CONNECTION_CLOSE_METHOD: {
			/* e.g. 320 CONNECTION_FORCED: the broker is shutting down */
			const amqp_connection_close_t *m = f.payload.method.decoded;
			amqp_connection_close_ok_t ok = { 0 };
			fl->code = m->reply_code;
			snprintf(fl->why, sizeof(fl->why),
			         "RabbitMQ closed the connection: %d %.*s", m->reply_code,
			         (int)m->reply_text.len, (const char *)m->reply_text.bytes);
			(void)amqp_send_method(as->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
			return FL_LOST;
		}
		default: break;
		}
	}
	return FL_DONE;
}

/* Publish every event not yet settled, then collect the confirms. Everything
 * goes out first: one round trip for the batch instead of one per event. */
static enum fl_result fly(struct amqp_sink *as, struct flight *fl)
{
	char rk[SHORTSTR_MAX + 1];
	size_t published = 0;

	fl->deadline = now_ms() + (double)as->timeout_ms;
	fl->first_tag = as->next_tag;
	fl->pending = 0;
	for (size_t i = 0; i < fl->n; i++) {
		const struct sink_event *ev = &fl->evs[i];
		int st;

		if (fl->state[i] != EV_PENDING)
			continue;
		if (routing_key(as, ev->type, rk, sizeof(rk)) < 0 ||
		    strlen(ev->event_id) > SHORTSTR_MAX || strlen(ev->type) > SHORTSTR_MAX) {
			fl->state[i] = EV_SKIPPED;
			outcome_set(&fl->outs[i], SINK_RETRY, 0,
			            "routing key, event id or type longer than 255 bytes");
			continue;
		}
		st = wait_writable(as, fl->deadline);
		if (st <= 0) {
			snprintf(fl->why, sizeof(fl->why),
			         "RabbitMQ is not reading within %ld ms%s%s", as->timeout_ms,
			         as->blocked[0] ? ": " : "", as->blocked);
			return FL_FAILED;
		}
		fl->sent_at[i] = now_ms();
		publish_guard_arm(as, fl->deadline);
		st = publish_one(as, ev, rk);
		if (publish_guard_disarm(as)) {
			snprintf(fl->why, sizeof(fl->why),
			         "RabbitMQ is not reading within %ld ms%s%s", as->timeout_ms,
			         as->blocked[0] ? ": " : "", as->blocked);
			return FL_FAILED; /* alive but not reading: no second try */
		}
		if (st != AMQP_STATUS_OK) {
			snprintf(fl->why, sizeof(fl->why), "publish to RabbitMQ failed: %s",
			         amqp_error_string2(st));
			return FL_LOST;
		}
		fl->tag_idx[published++] = i;
		as->next_tag++;
		fl->pending++;
	}
	return await_confirms(as, fl);
}

static int amqp_deliver(struct sink *s, const struct sink_event *evs, size_t n,
                        struct sink_outcome *outs, struct err *e)
{
	struct amqp_sink *as = (struct amqp_sink *)s;
	struct flight fl = { .evs = evs, .outs = outs, .n = n };
	enum fl_result r = FL_FAILED;

	for (size_t i = 0; i < n; i++) {
		outcome_set(&outs[i], SINK_RETRY, 0, "");
		outs[i].latency_ms = 0;
	}
	if (n == 0)
		return 0;
	fl.state = calloc(n, sizeof(*fl.state));
	fl.tag_idx = calloc(n, sizeof(*fl.tag_idx));
	fl.sent_at = calloc(n, sizeof(*fl.sent_at));
	fl.returned = calloc(n, sizeof(*fl.returned));
	if (fl.state == NULL || fl.tag_idx == NULL || fl.sent_at == NULL || fl.returned == NULL) {
		snprintf(fl.why, sizeof(fl.why), "out of memory");
		goto out;
	}
	for (int pass = 1; pass <= 2; pass++) {
		int reused = as->conn != NULL;

		fl.polite = 0;
		fl.code = 0;
		if (!reused && connect_broker(as, fl.why, sizeof(fl.why), &fl.code) < 0)
			break;
		r = fly(as, &fl);
		if (r == FL_DONE)
			break;
		/* The fate of unsettled messages is unknown, and late confirms
		 * would only confuse the next batch: it gets a fresh connection. */
		drop(as, fl.polite);
		/* A connection that sat idle may have died unnoticed (a broker
		 * restart, an idle timeout on the way): then one more try on a
		 * new one, unless the broker already answered for some events. */
		if (r != FL_LOST || !reused || fl.settled > 0)
			break;
	}
out:
	for (size_t i = 0; i < n; i++) {
		if (fl.state != NULL && fl.state[i] == EV_ACKED)
			outcome_set(&outs[i], SINK_OK, 0, "");
		else if (fl.state != NULL && fl.state[i] == EV_NACKED)
			outcome_set(&outs[i], SINK_RETRY, 0,
			            "RabbitMQ refused the message (basic.nack)");
		else if (fl.state == NULL || fl.state[i] == EV_PENDING)
			outcome_set(&outs[i], SINK_RETRY, fl.code, fl.why);
	}
	free(fl.state);
	free(fl.tag_idx);
	free(fl.sent_at);
	free(fl.returned);
	return 0;
}

static void amqp_close(struct sink *s)
{
	struct amqp_sink *as = (struct amqp_sink *)s;

	if (as == NULL)
		return;
	drop(as, 1);
	if (as->guard_ok)
		timer_delete(as->guard_timer);
	pthread_mutex_destroy(&as->guard_mu);
	free(as->url_buf);
	free(as->exchange);
	free(as->routing_key);
	free(as);
}

struct sink *sink_amqp_open(const struct conf *c, struct err *e)
{
	struct amqp_sink *as;
	struct sigevent sev = { .sigev_notify = SIGEV_THREAD,
		                .sigev_notify_function = publish_guard_fire };
	char shown[256];

	as = calloc(1, sizeof(*as));
	if (as == NULL) {
		err_set(e, ERR_INTERNAL, "out of memory");
		return NULL;
	}
	as->base.name = "amqp";
	as->base.deliver = amqp_deliver;
	as->base.close = amqp_close;
	pthread_mutex_init(&as->guard_mu, NULL);
	as->guard_fd = -1;
	sev.sigev_value.sival_ptr = as;
	if (timer_create(CLOCK_MONOTONIC, &sev, &as->guard_timer) < 0) {
		err_set(e, ERR_INTERNAL, "timer_create: %s", strerror(errno));
		goto fail;
	}
	as->guard_ok = 1;
	as->timeout_ms = c->timeout;
	as->url_buf = strdup(c->amqp_url != NULL ? c->amqp_url : "");
	as->exchange = strdup(c->exchange != NULL ? c->exchange : "");
	as->routing_key = strdup(c->routing_key != NULL ? c->routing_key : "");
	if (as->url_buf == NULL || as->exchange == NULL || as->routing_key == NULL) {
		err_set(e, ERR_INTERNAL, "out of memory");
		goto fail;
	}
	url_redacted(as->url_buf, shown, sizeof(shown));
	amqp_default_connection_info(&as->ci);
	if (as->url_buf[0] == '\0' || amqp_parse_url(as->url_buf, &as->ci) != AMQP_STATUS_OK) {
		err_set(e, ERR_CONFIG,
		        "invalid value \"%s\" for \"amqp_url\": expected "
		        "amqp://user:password@host:port/vhost",
		        shown);
		goto fail;
	}
	if (as->ci.ssl) {
		err_set(e, ERR_CONFIG,
		        "invalid value \"%s\" for \"amqp_url\": amqps:// (TLS) is not supported",
		        shown);
		goto fail;
	}
	/* "amqp://host/" names the empty vhost, which RabbitMQ does not have;
	 * every common client reads it as the default vhost "/", and so do we. */
	if (as->ci.vhost[0] == '\0')
		as->ci.vhost = "/";
	if (strlen(as->exchange) > SHORTSTR_MAX) {
		err_set(e, ERR_CONFIG, "invalid value for \"exchange\": longer than %d bytes",
		        SHORTSTR_MAX);
		goto fail;
	}
	if (strlen(as->routing_key) > SHORTSTR_MAX) {
		err_set(e, ERR_CONFIG, "invalid value for \"routing_key\": longer than %d bytes",
		        SHORTSTR_MAX);
		goto fail;
	}
	if (as->timeout_ms <= 0) {
		err_set(e, ERR_CONFIG, "invalid value %ld ms for \"timeout\": must be positive",
		        as->timeout_ms);
		goto fail;
	}
	return &as->base;
fail:
	amqp_close(&as->base);
	return NULL;
}
