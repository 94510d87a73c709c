/*
 * amqpc.c - the test consumer of amqpc.h, on rabbitmq-c.
 */
#include "amqpc.h"

#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#define CHANNEL 1

static int fail(char *err, size_t errsz, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errsz, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errsz, fmt, ap);
	va_end(ap);
	return -1;
}

static void reply_text(amqp_rpc_reply_t r, char *out, size_t outsz)
{
	if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION) {
		snprintf(out, outsz, "%s", amqp_error_string2(r.library_error));
	} else if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
	           r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
		const amqp_channel_close_t *m = r.reply.decoded;
		snprintf(out, outsz, "channel closed: %d %.*s", m->reply_code,
		         (int)m->reply_text.len, (const char *)m->reply_text.bytes);
	} else if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
	           r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
		const amqp_connection_close_t *m = r.reply.decoded;
		snprintf(out, outsz, "connection closed: %d %.*s", m->reply_code,
		         (int)m->reply_text.len, (const char *)m->reply_text.bytes);
	} else {
		snprintf(out, outsz, "unexpected reply type %d", (int)r.reply_type);
	}
}

/* Check the reply of the last RPC; -1 with "what: why" in err. */
static int check(amqp_connection_state_t conn, const char *what, char *err, size_t errsz)
{
	amqp_rpc_reply_t r = amqp_get_rpc_reply(conn);
	char why[256];

	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return 0;
	reply_text(r, why, sizeof(why));
	return fail(err, errsz, "%s: %s", what, why);
}

/* A connection with channel 1 open, or NULL with err filled. */
static amqp_connection_state_t connect_url(const char *url, char *err, size_t errsz)
{
	struct amqp_connection_info ci;
	struct timeval tv = { .tv_sec = 5 };
	amqp_connection_state_t conn = NULL;
	amqp_socket_t *sock;
	amqp_rpc_reply_t r;
	char *buf = strdup(url), why[256];
	int ok = 0;

	if (buf == NULL) {
		fail(err, errsz, "out of memory");
		return NULL;
	}
	amqp_default_connection_info(&ci);
	if (amqp_parse_url(buf, &ci) != AMQP_STATUS_OK) {
		fail(err, errsz, "not an AMQP URL: %s", url);
		goto out;
	}
	/* As in the sink: "amqp://host/" means the default vhost. */
	if (ci.vhost[0] == '\0')
		ci.vhost = "/";
	conn = amqp_new_connection();
	sock = conn != NULL ? amqp_tcp_socket_new(conn) : NULL;
	if (sock == NULL) {
		fail(err, errsz, "out of memory");
		goto out;
	}
	if (amqp_socket_open_noblock(sock, ci.host, ci.port, &tv) != AMQP_STATUS_OK) {
		fail(err, errsz, "cannot connect to %s:%d", ci.host, ci.port);
		goto out;
	}
	amqp_set_rpc_timeout(conn, &tv);
	r = amqp_login(conn, ci.vhost, 0, AMQP_DEFAULT_FRAME_SIZE, 0, AMQP_SASL_METHOD_PLAIN,
	               ci.user, ci.password);
	if (r.reply_type != AMQP_RESPONSE_NORMAL) {
		reply_text(r, why, sizeof(why));
		fail(err, errsz, "login: %s", why);
		goto out;
	}
	amqp_channel_open(conn, CHANNEL);
	if (check(conn, "channel.open", err, errsz) < 0)
		goto out;
	ok = 1;
out:
	free(buf);
	if (!ok && conn != NULL) {
		amqp_destroy_connection(conn);
		conn = NULL;
	}
	return conn;
}

/* Declare exchange as a durable topic exchange; one that exists with
 * another type (406, which closes the channel) is fine as it is. */
static int declare_topic(amqp_connection_state_t conn, const char *exchange, char *err,
                         size_t errsz)
{
	amqp_rpc_reply_t r;
	amqp_channel_close_ok_t ok = { 0 };

	amqp_exchange_declare(conn, CHANNEL, amqp_cstring_bytes(exchange),
	                      amqp_cstring_bytes("topic"), 0, 1, 0, 0, amqp_empty_table);
	r = amqp_get_rpc_reply(conn);
	if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
	    r.reply.id == AMQP_CHANNEL_CLOSE_METHOD &&
	    ((const amqp_channel_close_t *)r.reply.decoded)->reply_code ==
	        AMQP_PRECONDITION_FAILED) {
		amqp_send_method(conn, CHANNEL, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
		amqp_channel_open(conn, CHANNEL);
		return check(conn, "channel.open", err, errsz);
	}
	return check(conn, "exchange.declare", err, errsz);
}

/* amqpc_open and amqpc_open_full_after: max_length < 0 is unlimited and consumed. */
static int open_queue(struct amqpc *c, const char *url, const char *exchange,
                      const char *binding_key, long max_length)
{
	amqp_connection_state_t conn;
	amqp_queue_declare_ok_t *q;
	amqp_table_entry_t args[2] = {
		{ .key = amqp_cstring_bytes("x-max-length"),
		  .value = { .kind = AMQP_FIELD_KIND_I64, .value = { .i64 = max_length } } },
		{ .key = amqp_cstring_bytes("x-overflow"),
		  .value = { .kind = AMQP_FIELD_KIND_UTF8,
		             .value = { .bytes = amqp_cstring_bytes("reject-publish") } } },
	};
	amqp_table_t qargs = { .num_entries = max_length < 0 ? 0 : 2, .entries = args };

	memset(c, 0, sizeof(*c));
	conn = connect_url(url, c->error, sizeof(c->error));
	if (conn == NULL)
		return -1;
	c->conn = conn;
	if (declare_topic(conn, exchange, c->error, sizeof(c->error)) < 0)
		goto fail;
	q = amqp_queue_declare(conn, CHANNEL, amqp_empty_bytes, 0, 0, 1, 1, qargs);
	if (check(conn, "queue.declare", c->error, sizeof(c->error)) < 0)
		goto fail;
	snprintf(c->queue, sizeof(c->queue), "%.*s", (int)q->queue.len,
	         (const char *)q->queue.bytes);
	amqp_queue_bind(conn, CHANNEL, amqp_cstring_bytes(c->queue), amqp_cstring_bytes(exchange),
	                amqp_cstring_bytes(binding_key), amqp_empty_table);
	if (check(conn, "queue.bind", c->error, sizeof(c->error)) < 0)
		goto fail;
	if (max_length >= 0)
		return 0;
	/* no_ack: the queue is ours alone and dies with the connection. */
	amqp_basic_consume(conn, CHANNEL, amqp_cstring_bytes(c->queue), amqp_empty_bytes, 0, 1, 1,
	                   amqp_empty_table);
	if (check(conn, "basic.consume", c->error, sizeof(c->error)) < 0)
		goto fail;
	return 0;
fail:
	amqp_destroy_connection(conn);
	c->conn = NULL;
	return -1;
}

int amqpc_open(struct amqpc *c, const char *url, const char *exchange, const char *binding_key)
{
	return open_queue(c, url, exchange, binding_key, -1);
}

int amqpc_open_full_after(struct amqpc *c, const char *url, const char *exchange,
                          const char *binding_key, long max_length)
{
	return open_queue(c, url, exchange, binding_key, max_length);
}

static void copy_bytes(char *out, size_t outsz, amqp_bytes_t b)
{
	size_t n = b.len < outsz - 1 ? b.len : outsz - 1;

	if (n > 0)
		memcpy(out, b.bytes, n);
	out[n] = '\0';
}

static void read_headers(const amqp_table_t *t, struct amqpc_msg *m)
{
	for (int i = 0; i < t->num_entries; i++) {
		const amqp_table_entry_t *en = &t->entries[i];
		const amqp_field_value_t *v = &en->value;

		if (en->key.len == 11 && memcmp(en->key.bytes, "workflow_id", 11) == 0 &&
		    (v->kind == AMQP_FIELD_KIND_UTF8 || v->kind == AMQP_FIELD_KIND_BYTES))
			copy_bytes(m->workflow_id, sizeof(m->workflow_id), v->value.bytes);
		else if (en->key.len == 7 && memcmp(en->key.bytes, "attempt", 7) == 0 &&
		         v->kind == AMQP_FIELD_KIND_I32)
			m->attempt = v->value.i32;
		else if (en->key.len == 7 && memcmp(en->key.bytes, "attempt", 7) == 0 &&
		         v->kind == AMQP_FIELD_KIND_I64)
			m->attempt = (long)v->value.i64;
		else if (en->key.len == 11 && memcmp(en->key.bytes, "traceparent", 11) == 0 &&
		         (v->kind == AMQP_FIELD_KIND_UTF8 || v->kind == AMQP_FIELD_KIND_BYTES))
			copy_bytes(m->traceparent, sizeof(m->traceparent), v->value.bytes);
		else if (en->key.len == 10 && memcmp(en->key.bytes, "tracestate", 10) == 0 &&
		         (v->kind == AMQP_FIELD_KIND_UTF8 || v->kind == AMQP_FIELD_KIND_BYTES))
			copy_bytes(m->tracestate, sizeof(m->tracestate), v->value.bytes);
	}
}

int amqpc_next(struct amqpc *c, long timeout_ms, struct amqpc_msg *m)
{
	amqp_connection_state_t conn = c->conn;
	amqp_envelope_t env;
	amqp_rpc_reply_t r;
	struct timeval tv = { .tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000 };
	const amqp_basic_properties_t *p;
	char why[256];

	memset(m, 0, sizeof(*m));
	m->attempt = -1;
	if (conn == NULL)
		return fail(c->error, sizeof(c->error), "consumer is closed");
	amqp_maybe_release_buffers(conn);
	r = amqp_consume_message(conn, &env, &tv, 0);
	if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
	    r.library_error == AMQP_STATUS_TIMEOUT)
		return 0;
	if (r.reply_type != AMQP_RESPONSE_NORMAL) {
		reply_text(r, why, sizeof(why));
		return fail(c->error, sizeof(c->error), "consume: %s", why);
	}
	p = &env.message.properties;
	copy_bytes(m->routing_key, sizeof(m->routing_key), env.routing_key);
	copy_bytes(m->exchange, sizeof(m->exchange), env.exchange);
	if (p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG)
		copy_bytes(m->message_id, sizeof(m->message_id), p->message_id);
	if (p->_flags & AMQP_BASIC_TYPE_FLAG)
		copy_bytes(m->type, sizeof(m->type), p->type);
	if (p->_flags & AMQP_BASIC_CONTENT_TYPE_FLAG)
		copy_bytes(m->content_type, sizeof(m->content_type), p->content_type);
	if (p->_flags & AMQP_BASIC_APP_ID_FLAG)
		copy_bytes(m->app_id, sizeof(m->app_id), p->app_id);
	if (p->_flags & AMQP_BASIC_DELIVERY_MODE_FLAG)
		m->delivery_mode = p->delivery_mode;
	if (p->_flags & AMQP_BASIC_TIMESTAMP_FLAG)
		m->timestamp = p->timestamp;
	if (p->_flags & AMQP_BASIC_HEADERS_FLAG)
		read_headers(&p->headers, m);
	m->body_len = env.message.body.len;
	m->body = malloc(m->body_len + 1);
	if (m->body == NULL) {
		amqp_destroy_envelope(&env);
		return fail(c->error, sizeof(c->error), "out of memory");
	}
	if (m->body_len > 0)
		memcpy(m->body, env.message.body.bytes, m->body_len);
	m->body[m->body_len] = '\0';
	amqp_destroy_envelope(&env);
	return 1;
}

void amqpc_msg_free(struct amqpc_msg *m)
{
	free(m->body);
	m->body = NULL;
	m->body_len = 0;
}

long amqpc_drain(struct amqpc *c, long quiet_ms)
{
	struct amqpc_msg m;
	long n = 0;
	int rc;

	while ((rc = amqpc_next(c, quiet_ms, &m)) == 1) {
		amqpc_msg_free(&m);
		n++;
	}
	return rc < 0 ? -1 : n;
}

void amqpc_close(struct amqpc *c)
{
	if (c->conn == NULL)
		return;
	(void)amqp_connection_close(c->conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(c->conn);
	c->conn = NULL;
}

int amqpc_exchange_delete(const char *url, const char *exchange, char *err, size_t errsz)
{
	amqp_connection_state_t conn = connect_url(url, err, errsz);
	int rc;

	if (conn == NULL)
		return -1;
	amqp_exchange_delete(conn, CHANNEL, amqp_cstring_bytes(exchange), 0);
	rc = check(conn, "exchange.delete", err, errsz);
	(void)amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(conn);
	return rc;
}

int amqpc_exchange_declare(const char *url, const char *exchange, const char *type, char *err,
                           size_t errsz)
{
	amqp_connection_state_t conn = connect_url(url, err, errsz);
	int rc;

	if (conn == NULL)
		return -1;
	amqp_exchange_declare(conn, CHANNEL, amqp_cstring_bytes(exchange), amqp_cstring_bytes(type),
	                      0, 1, 0, 0, amqp_empty_table);
	rc = check(conn, "exchange.declare", err, errsz);
	(void)amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(conn);
	return rc;
}
