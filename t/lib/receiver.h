/*
 * A real webhook receiver for the dispatcher tests: t/lib/receiver.py run as
 * a child process on a free loopback port. It records every delivery (one
 * JSON line each in its log file) and can be told to fail or to be slow;
 * receiver.py's docstring describes the log and the control JSON.
 *
 * Nothing here asserts: functions return -1 and leave the reason in
 * r->error, so they may be used from any test code or fixture.
 */
#ifndef IDEMFLOW_T_RECEIVER_H
#define IDEMFLOW_T_RECEIVER_H

#include <stddef.h>
#include <sys/types.h>

struct receiver {
	pid_t pid; /* 0 when not running */
	int port;
	char url[64];       /* "http://127.0.0.1:<port>/hook": where deliveries go */
	char base[48];      /* "http://127.0.0.1:<port>" */
	char log_path[512]; /* the JSON-lines record of deliveries */
	char error[512];    /* why the last call returned -1 */
};

struct receiver_delivery {
	long seq;   /* 1, 2, ... in order of arrival */
	long conn;  /* TCP connection it came on, numbered from 1 */
	char *peer; /* client "address:port" */
	char *path; /* e.g. "/hook" */
	/* Header values; NULL when the header was absent. */
	char *event_id;        /* webhook-id */
	char *timestamp;       /* webhook-timestamp, as sent */
	char *signature;       /* webhook-signature */
	char *idempotency_key; /* Idempotency-Key */
	char *content_type;
	char *user_agent;
	char *traceparent; /* W3C trace context */
	char *tracestate;
	char *body;          /* as received (decoded as UTF-8), NUL-terminated */
	size_t body_len;     /* bytes received */
	int status;          /* what the receiver answered */
	long retry_after;    /* Retry-After it sent, or -1 */
	int duplicate;       /* an earlier delivery of this id was answered 2xx */
	int signature_valid; /* receiver.py's own check (started with "--secret", S):
	                        1 valid, 0 not; -1 when it was given no secret */
	double time;         /* arrival, unix seconds */
};

/*
 * Start "python3 receiver.py --log FILE [extra...]" and wait until it
 * listens. extra is NULL or NULL-terminated arguments such as "--seed", "7"
 * or "--secret", "whsec_...". The script is found at
 * $top_srcdir/t/lib/receiver.py (the test harness exports top_srcdir), else
 * next to the test binary at ../../t/lib/receiver.py. The log goes to
 * $IDEMFLOW_STACK_DIR when set (the harness removes it), else $TMPDIR or
 * /tmp. The child is killed if the test process dies.
 */
int receiver_start(struct receiver *r, const char *const *extra);

/* POST json to /_control; -1 unless the receiver answered 200. */
int receiver_control(struct receiver *r, const char *json);

/*
 * Every delivery logged so far, in arrival order, from the log file:
 * *out is a malloc'ed array of *n (free with receiver_deliveries_free).
 */
int receiver_deliveries(struct receiver *r, struct receiver_delivery **out, size_t *n);
void receiver_deliveries_free(struct receiver_delivery *d, size_t n);

/* Wait until at least n deliveries are logged; -1 after timeout_ms. */
int receiver_wait(struct receiver *r, size_t n, long timeout_ms);

/* Kill and reap the receiver and remove its log; safe to call twice. */
void receiver_stop(struct receiver *r);

#endif
