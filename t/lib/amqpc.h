/*
 * A small RabbitMQ consumer for the AMQP sink tests: it binds a private
 * queue (exclusive, auto-delete, named by the broker) to an exchange and
 * hands back each message with the properties the tests check.
 *
 * Nothing here asserts: functions return -1 and leave the reason in
 * c->error (or in the caller's buffer), so they are safe on any thread.
 * Each consumer has its own connection; one consumer must not be shared
 * between threads.
 */
#ifndef IDEMFLOW_T_AMQPC_H
#define IDEMFLOW_T_AMQPC_H

#include <stddef.h>
#include <stdint.h>

struct amqpc {
	void *conn;      /* amqp_connection_state_t; NULL when closed */
	char queue[256]; /* the broker-named queue */
	char error[512]; /* why the last call returned -1 */
};

/* One received message. Strings are "" when the property was absent. */
struct amqpc_msg {
	char message_id[256];
	char type[256];
	char routing_key[256];
	char exchange[256];
	char content_type[128];
	char app_id[128];
	char workflow_id[128]; /* the "workflow_id" header */
	long attempt;          /* the "attempt" header, or -1 */
	char traceparent[64];  /* the "traceparent" header */
	char tracestate[600];  /* the "tracestate" header */
	int delivery_mode;     /* 2 = persistent; 0 when absent */
	uint64_t timestamp;    /* seconds; 0 when absent */
	char *body;            /* malloc'ed, NUL-terminated; body_len excludes the NUL */
	size_t body_len;
};

/*
 * Connect to url (an amqp:// URL such as $IDEMFLOW_AMQP_URL), declare
 * exchange as a durable topic exchange unless it exists with another type
 * (as the sink does, so the binding exists before the first publish), and
 * bind a fresh queue to it with binding_key ("#" for everything).
 * Returns 0 or -1.
 */
int amqpc_open(struct amqpc *c, const char *url, const char *exchange, const char *binding_key);

/*
 * Like amqpc_open, but the queue holds at most max_length messages and
 * rejects further publishes (x-overflow reject-publish, so the broker
 * answers them with basic.nack), and nothing is consumed: it stays full.
 */
int amqpc_open_full_after(struct amqpc *c, const char *url, const char *exchange,
                          const char *binding_key, long max_length);

/* The next message, waiting up to timeout_ms: 1 with *m filled (free with
 * amqpc_msg_free), 0 when none came in time, -1 on error. */
int amqpc_next(struct amqpc *c, long timeout_ms, struct amqpc_msg *m);
void amqpc_msg_free(struct amqpc_msg *m);

/* Receive until quiet_ms pass without a message; returns how many came
 * (each freed), or -1. For "nothing else arrives" checks. */
long amqpc_drain(struct amqpc *c, long quiet_ms);

void amqpc_close(struct amqpc *c);

/* Declare a durable exchange of type ("direct", "fanout", ...) on the
 * broker at url, as an operator would before the sink first connects.
 * Returns 0, or -1 with the reason in err. */
int amqpc_exchange_declare(const char *url, const char *exchange, const char *type, char *err,
                           size_t errsz);

/* Delete an exchange on the broker at url (gone already is fine): for
 * tests of a broker whose topology changes under a running sink.
 * Returns 0, or -1 with the reason in err. */
int amqpc_exchange_delete(const char *url, const char *exchange, char *err, size_t errsz);

#endif
