/*
 * sink.h - where the dispatcher delivers outbox events: an HTTP webhook
 * (sink_http.c), a RabbitMQ exchange (sink_amqp.c), a NATS JetStream
 * stream (sink_nats.c) or a command (sink_exec.c). One interface, chosen
 * by the `sink` configuration key.
 *
 * A sink delivers a batch and reports one outcome per event. It never
 * touches the database: the dispatcher records the outcomes. Delivery is
 * at least once: a sink may be asked to deliver an event it delivered
 * before (after a crash), always with the same event id, and says so to
 * the receiver in a way it can deduplicate on (webhook-id and
 * Idempotency-Key headers, AMQP message_id, Nats-Msg-Id,
 * $IDEMFLOW_EVENT_ID). Each
 * passes on the event's trace context the same way (struct sink_event).
 */
#ifndef IDF_SINK_H
#define IDF_SINK_H

#include <stddef.h>

#include "core/conf.h"
#include "core/err.h"

/* One event to deliver. Everything borrowed, valid during deliver(). */
struct sink_event {
	const char *event_id; /* stable across attempts: the dedup key */
	const char *type;     /* e.g. "workflow.created" */
	const char *workflow_id;
	const char *payload; /* the event JSON, exactly as stored */
	size_t payload_len;
	int attempt; /* 1-based, this attempt */
	int max_attempts;
	/* The W3C trace context stored with the event, passed on as the
	 * traceparent and tracestate headers (HTTP, AMQP) or TRACEPARENT and
	 * TRACESTATE (exec); NULL when the event has none. */
	const char *traceparent;
	const char *tracestate;
	/* A tenant endpoint's delivery (sink_http_open_endpoints() only):
	 * where it goes and the endpoint's secrets ("whsec_<base64>"), the
	 * previous one NULL unless a rotation's grace period runs. NULL for
	 * the configured sink's events. */
	const char *url;
	const char *secret;
	const char *secret_previous;
};

enum sink_result {
	SINK_OK,    /* delivered: mark published */
	SINK_RETRY, /* failed, may succeed later: reschedule with back-off */
	SINK_DEAD,  /* failed for good (e.g. HTTP 400): dead letter now */
};

struct sink_outcome {
	enum sink_result result;
	long retry_after_s; /* >= 0 when the receiver asked for a delay (Retry-After), else -1 */
	int status;         /* HTTP status, AMQP reply code or exit code; 0 if none */
	double latency_ms;  /* time this event's delivery took; 0 = not measured */
	/* SINK_OK only: the broker already held the event and dropped this
	 * copy (a JetStream acknowledgement marked duplicate). Delivered all
	 * the same; counted apart. 0 for every sink that cannot tell. */
	int duplicate;
	char error[256]; /* human-readable reason when not SINK_OK */
	/* The attempt's class for the ledger (http sink; static strings):
	 * "succeeded", "http" (an answer that is not 2xx), "timeout",
	 * "connect", "tls" or "other". */
	const char *cls;
	/* Set by the caller before deliver() (the endpoints' http sink fills
	 * it; every other sink leaves it alone): a
	 * buffer of body_cap bytes for the start of the answer's body, of
	 * which body_len were received; NULL to keep none. */
	char *body;
	size_t body_cap;
	size_t body_len;
};

struct sink {
	const char *name; /* "http", "amqp", "nats", "exec" */
	/*
	 * Deliver n events; fill outs[i] for every i. Returns 0, or -1 only
	 * when the sink itself is unusable (then e says why and the run
	 * stops); an unreachable receiver is a per-event SINK_RETRY, not -1.
	 */
	int (*deliver)(struct sink *s, const struct sink_event *evs, size_t n,
	               struct sink_outcome *outs, struct err *e);
	/* Release everything; s is freed. */
	void (*close)(struct sink *s);
	void *priv;
};

/*
 * Constructors check their configuration and return a sink, or NULL with
 * e filled (ERR_CONFIG for a bad or missing value, naming the key). They
 * may connect lazily. The caller closes with s->close(s).
 */
struct sink *sink_http_open(const struct conf *c, struct err *e);
/* The http sink of the tenant endpoints: each event names its own url and
 * secrets (struct sink_event); `url` and `secret` are not read. */
struct sink *sink_http_open_endpoints(const struct conf *c, struct err *e);
struct sink *sink_amqp_open(const struct conf *c, struct err *e);
struct sink *sink_nats_open(const struct conf *c, struct err *e);
struct sink *sink_exec_open(const struct conf *c, struct err *e);

/* Open the sink named by c->sink. */
struct sink *sink_open(const struct conf *c, struct err *e);

#endif
