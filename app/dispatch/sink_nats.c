/*
 * sink_nats.c - deliver events to a NATS JetStream stream (libnats).
 *
 * Each event is published to the subject "<nats_subject_prefix>.<type>"
 * with the header Nats-Msg-Id = its event id: within the stream's
 * duplicate window JetStream stores one message per id, however often the
 * event is sent. Only JetStream's publish acknowledgement (PubAck) counts
 * as delivered, because only then has a stream taken the message. A PubAck
 * marked duplicate is a delivery too (the stream already held the event,
 * from an attempt whose outcome was never recorded); the outcome says so,
 * and the dispatcher counts those apart. A subject no stream takes is
 * answered "no responders" (503) by the server: a failed attempt, retried
 * and in the end dead, never "delivered", since no stream holds it.
 *
 * Events are published one at a time, each waiting for its PubAck, all of
 * a chunk within one deadline (`timeout`). A failed event holds back the
 * later events of its workflow in the same chunk, so a workflow's events
 * reach the stream in order. (The claim already puts at most one event of
 * a workflow in a batch; this keeps the promise for any caller.)
 *
 * The connection is opened on the first delivery and kept between chunks;
 * the library does not reconnect by itself. Anything that leaves the
 * connection in doubt (closed, no PubAck in time) drops it, and the next
 * event or chunk starts on a new one. A failure of the server is always
 * "try again later" (SINK_RETRY). An event that cannot be sent at all (a
 * type that is no subject token, an id with a line break) is dead at once:
 * no retry can change it.
 *
 * libnats runs threads of its own (the socket's reader, the flusher,
 * timers). They are started with every signal blocked, so the dispatcher's
 * SIGTERM and SIGINT reach its main thread, whose waits they cut short.
 */
#include "dispatch/sink.h"

#include "core/trace.h"

#include <nats/nats.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NATS_SERVERS_MAX 16
#define NATS_SUBJECT_MAX 511 /* bytes of "<prefix>.<type>" */
#define NATS_PREFIX_MAX  200
#define NATS_STREAM_MAX  255
#define NATS_HEADER_MAX  1024 /* bytes of one header value */
#define NATS_NO_PREV     SIZE_MAX

struct nats_sink {
	struct sink base;
	natsOptions *opts;
	char *urls_buf; /* nats_url split in place: urls points into it */
	const char *urls[NATS_SERVERS_MAX];
	int nurls;
	char shown[512]; /* the URLs without credentials, for messages */
	char *prefix;
	char *stream; /* NULL: any stream may take the events */
	long timeout_ms;
	natsConnection *nc; /* NULL until connected, and after a drop */
	jsCtx *js;
};

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* Block every signal on this thread, so that the threads libnats starts
 * meanwhile inherit the mask; *old restores it. */
static void signals_block(sigset_t *old)
{
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, old);
}

static void signals_restore(const sigset_t *old)
{
	pthread_sigmask(SIG_SETMASK, old, NULL);
}

/* The library's text for the last failure on this thread, else s's,
 * without the "(js.c:535): " of its source line in front. */
static const char *nats_reason(natsStatus s)
{
	const char *t = nats_GetLastError(NULL), *end;

	if (t == NULL || *t == '\0')
		return natsStatus_GetText(s);
	if (*t == '(' && (end = strstr(t, "): ")) != NULL && end - t < 64 &&
	    memchr(t, ' ', (size_t)(end - t)) == NULL)
		t = end + 3;
	return t;
}

/* One URL as it may be shown: a user, password or token before the host
 * becomes "***". */
static void url_shown(const char *url, char *out, size_t outsz)
{
	const char *host = strstr(url, "://");
	const char *at;
	size_t authority;

	host = host != NULL ? host + 3 : url;
	authority = strcspn(host, "/");
	at = memchr(host, '@', authority);
	if (at == NULL)
		snprintf(out, outsz, "%s", url);
	else
		snprintf(out, outsz, "%.*s***%s", (int)(host - url), url, at);
}

/* nats://[user[:password]@]host[:port], printable ASCII, no spaces. */
static int url_valid(const char *url)
{
	const char *host;

	if (strncmp(url, "nats://", 7) != 0)
		return 0;
	for (const char *p = url; *p; p++)
		if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f)
			return 0;
	host = strrchr(url + 7, '@');
	host = host != NULL ? host + 1 : url + 7;
	return *host != '\0' && *host != ':' && *host != '/';
}

/*
 * 1 when s (len bytes) is one or more subject tokens separated by dots:
 * no empty token, no wildcard (* or >), no space or control byte. Such a
 * subject can only be published to, never match more than itself.
 */
static int subject_valid(const char *s, size_t len)
{
	int token = 0;

	if (len == 0)
		return 0;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '.') {
			if (token == 0)
				return 0;
			token = 0;
			continue;
		}
		if (c <= 0x20 || c == 0x7f || c == '*' || c == '>')
			return 0;
		token++;
	}
	return token > 0;
}

/* A header value that cannot end its line or the header block: no CR, LF
 * or other control byte, at most NATS_HEADER_MAX bytes. */
static int header_value_valid(const char *v)
{
	size_t n = 0;

	for (; v[n]; n++)
		if ((unsigned char)v[n] < 0x20 || (unsigned char)v[n] == 0x7f)
			return 0;
	return n > 0 && n <= NATS_HEADER_MAX;
}

static void outcome_set(struct sink_outcome *o, enum sink_result r, int status, const char *why)
{
	o->result = r;
	o->retry_after_s = -1;
	o->status = status;
	o->duplicate = 0;
	snprintf(o->error, sizeof(o->error), "%s", why);
}

/* Forget the connection (its late acknowledgements with it). */
static void drop(struct nats_sink *ns)
{
	jsCtx_Destroy(ns->js);
	ns->js = NULL;
	natsConnection_Destroy(ns->nc);
	ns->nc = NULL;
}

/* Connect within budget_ms and get the JetStream context. On failure why
 * says what failed and there is no connection. Signals must be blocked. */
static int nats_connect(struct nats_sink *ns, long budget_ms, char *why, size_t wlen)
{
	jsOptions jo;
	natsStatus s;

	if (budget_ms < 1)
		budget_ms = 1;
	/* Per server tried; the options are copied by the connection. */
	s = natsOptions_SetTimeout(ns->opts, budget_ms);
	if (s == NATS_OK)
		s = natsConnection_Connect(&ns->nc, ns->opts);
	if (s != NATS_OK) {
		snprintf(why, wlen, "could not connect to NATS at %.160s: %s", ns->shown,
		         nats_reason(s));
		ns->nc = NULL;
		return -1;
	}
	jsOptions_Init(&jo);
	jo.Wait = ns->timeout_ms;
	s = natsConnection_JetStream(&ns->js, ns->nc, &jo);
	if (s != NATS_OK) {
		snprintf(why, wlen, "could not use JetStream at %.160s: %s", ns->shown,
		         nats_reason(s));
		ns->js = NULL;
		drop(ns);
		return -1;
	}
	return 0;
}

/* The message for ev on subject, with its headers; NULL when out of
 * memory. The trace context goes along only when it is valid. */
static natsMsg *message_new(const struct sink_event *ev, const char *subject)
{
	char attempt[16], tid[TRACE_ID_LEN + 1], span[TRACE_SPAN_LEN + 1];
	natsMsg *m = NULL;
	uint8_t flags;
	natsStatus s;

	snprintf(attempt, sizeof(attempt), "%d", ev->attempt);
	s = natsMsg_Create(&m, subject, NULL, ev->payload, (int)ev->payload_len);
	if (s == NATS_OK)
		s = natsMsgHeader_Set(m, "Content-Type", "application/json");
	if (s == NATS_OK)
		s = natsMsgHeader_Set(m, "type", ev->type);
	if (s == NATS_OK)
		s = natsMsgHeader_Set(m, "attempt", attempt);
	if (s == NATS_OK && ev->workflow_id != NULL)
		s = natsMsgHeader_Set(m, "workflow_id", ev->workflow_id);
	/* W3C Trace Context: the HTTP headers' names, as for AMQP. */
	if (s == NATS_OK && ev->traceparent != NULL &&
	    trace_parse_parent(ev->traceparent, tid, span, &flags) == 0) {
		s = natsMsgHeader_Set(m, "traceparent", ev->traceparent);
		if (s == NATS_OK && ev->tracestate != NULL &&
		    trace_state_valid(ev->tracestate, strlen(ev->tracestate)))
			s = natsMsgHeader_Set(m, "tracestate", ev->tracestate);
	}
	if (s != NATS_OK) {
		natsMsg_Destroy(m);
		return NULL;
	}
	return m;
}

/* Why ev cannot be sent at all (an empty string when it can), and its
 * subject in subject[NATS_SUBJECT_MAX + 1]. */
static void event_check(const struct nats_sink *ns, const struct sink_event *ev, char *subject,
                        char *why, size_t wlen)
{
	size_t tl = ev->type != NULL ? strlen(ev->type) : 0;
	size_t pl = strlen(ns->prefix);

	why[0] = '\0';
	if (ev->event_id == NULL || !header_value_valid(ev->event_id))
		snprintf(why, wlen,
		         "the event id cannot be a NATS header (Nats-Msg-Id): empty, a "
		         "control character (CR, LF) or longer than 1024 bytes");
	else if (ev->workflow_id != NULL && !header_value_valid(ev->workflow_id))
		snprintf(why, wlen,
		         "the workflow id cannot be a NATS header: a control character "
		         "(CR, LF) or longer than 1024 bytes");
	else if (tl == 0 || !subject_valid(ev->type, tl) || !header_value_valid(ev->type))
		snprintf(why, wlen,
		         "the event type is no NATS subject: empty, an empty token, a "
		         "space, a wildcard (* >) or a control character");
	else if (pl + 1 + tl > NATS_SUBJECT_MAX)
		snprintf(why, wlen, "the subject is longer than %d bytes", NATS_SUBJECT_MAX);
	else if (ev->payload_len > (size_t)INT32_MAX)
		snprintf(why, wlen, "the event is larger than a NATS message can be");
	else if (pl > 0)
		snprintf(subject, NATS_SUBJECT_MAX + 1, "%s.%s", ns->prefix, ev->type);
	else
		snprintf(subject, NATS_SUBJECT_MAX + 1, "%s", ev->type);
}

/* How one publish went. */
enum pub_result {
	PUB_OK,     /* PubAck: stored (or already held, o->duplicate) */
	PUB_FAILED, /* the server refused it; the connection is fine */
	PUB_LOST,   /* its fate is unknown and the connection in doubt: drop it */
};

static enum pub_result publish_one(struct nats_sink *ns, const struct sink_event *ev,
                                   const char *subject, long wait_ms, struct sink_outcome *o)
{
	jsPubOptions po;
	jsPubAck *pa = NULL;
	jsErrCode jerr = 0;
	natsMsg *m;
	natsStatus s;
	char why[200];
	enum pub_result r;

	m = message_new(ev, subject);
	if (m == NULL) {
		outcome_set(o, SINK_RETRY, 0, "out of memory");
		return PUB_FAILED;
	}
	jsPubOptions_Init(&po);
	po.MsgId = ev->event_id;
	po.MaxWait = wait_ms;
	po.ExpectStream = ns->stream;
	s = js_PublishMsg(&pa, ns->js, m, &po, &jerr);
	natsMsg_Destroy(m);
	if (s == NATS_OK) {
		outcome_set(o, SINK_OK, 0, "");
		o->duplicate = pa->Duplicate;
		jsPubAck_Destroy(pa);
		return PUB_OK;
	}
	snprintf(why, sizeof(why), "%s", nats_reason(s));
	switch (s) {
	case NATS_NO_RESPONDERS:
		/* The server found no stream listening on the subject. */
		outcome_set(o, SINK_RETRY, 503, "");
		snprintf(o->error, sizeof(o->error),
		         "no JetStream stream takes subject \"%.180s\" (no responders, 503)",
		         subject);
		r = PUB_FAILED;
		break;
	case NATS_TIMEOUT:
		outcome_set(o, SINK_RETRY, 0, "");
		snprintf(o->error, sizeof(o->error),
		         "no acknowledgement from JetStream within %ld ms (the batch's timeout)",
		         ns->timeout_ms);
		r = PUB_LOST;
		break;
	case NATS_MAX_PAYLOAD:
		outcome_set(o, SINK_RETRY, 0, "");
		snprintf(o->error, sizeof(o->error),
		         "the event (%zu bytes) is larger than the server's max_payload: %.150s",
		         ev->payload_len, why);
		r = PUB_FAILED;
		break;
	case NATS_ERR:
		if (jerr != 0) {
			/* JetStream answered with an error (e.g. 10060: another
			 * stream than nats_stream took the subject). */
			outcome_set(o, SINK_RETRY, (int)jerr, "");
			snprintf(o->error, sizeof(o->error), "JetStream refused the message: %s",
			         why);
			r = PUB_FAILED;
			break;
		}
		__attribute__((fallthrough));
	default:
		outcome_set(o, SINK_RETRY, 0, "");
		snprintf(o->error, sizeof(o->error), "publish to NATS failed: %s", why);
		r = PUB_LOST;
		break;
	}
	return r;
}

struct wf_index {
	const char *wf;
	size_t i;
};

static int wf_index_cmp(const void *a, const void *b)
{
	const struct wf_index *x = a, *y = b;
	int c = strcmp(x->wf, y->wf);

	if (c != 0)
		return c;
	return x->i < y->i ? -1 : x->i > y->i;
}

/* prev[i]: the index of the event of evs[i]'s workflow just before it in
 * the batch, or NATS_NO_PREV. NULL when out of memory; caller frees. */
static size_t *workflow_prev(const struct sink_event *evs, size_t n)
{
	struct wf_index *ix = calloc(n, sizeof(*ix));
	size_t *prev = malloc(n * sizeof(*prev));
	size_t m = 0;

	if (ix == NULL || prev == NULL) {
		free(ix);
		free(prev);
		return NULL;
	}
	for (size_t i = 0; i < n; i++) {
		prev[i] = NATS_NO_PREV;
		if (evs[i].workflow_id != NULL)
			ix[m++] = (struct wf_index){ evs[i].workflow_id, i };
	}
	qsort(ix, m, sizeof(*ix), wf_index_cmp);
	for (size_t k = 1; k < m; k++)
		if (strcmp(ix[k - 1].wf, ix[k].wf) == 0)
			prev[ix[k].i] = ix[k - 1].i;
	free(ix);
	return prev;
}

static int nats_deliver(struct sink *s, const struct sink_event *evs, size_t n,
                        struct sink_outcome *outs, struct err *e)
{
	struct nats_sink *ns = (struct nats_sink *)s;
	double deadline = now_ms() + (double)ns->timeout_ms;
	char subject[NATS_SUBJECT_MAX + 1], why[256], lost[256] = "";
	size_t *prev;
	sigset_t old;

	for (size_t i = 0; i < n; i++) {
		outcome_set(&outs[i], SINK_RETRY, 0, "not attempted");
		outs[i].latency_ms = 0;
	}
	if (n == 0)
		return 0;
	prev = workflow_prev(evs, n);
	if (prev == NULL) {
		for (size_t i = 0; i < n; i++)
			outcome_set(&outs[i], SINK_RETRY, 0, "out of memory");
		return 0;
	}
	signals_block(&old);
	/* A kept connection the server closed while it was idle. */
	if (ns->nc != NULL && natsConnection_IsClosed(ns->nc))
		drop(ns);
	for (size_t i = 0; i < n; i++) {
		const struct sink_event *ev = &evs[i];
		struct sink_outcome *o = &outs[i];
		double t0 = now_ms(), left = deadline - t0;

		if (prev[i] != NATS_NO_PREV && outs[prev[i]].result != SINK_OK) {
			outcome_set(o, SINK_RETRY, 0, "");
			snprintf(
			    o->error, sizeof(o->error),
			    "not sent: event %s of the same workflow, earlier in this batch, was "
			    "not delivered",
			    evs[prev[i]].event_id);
			continue;
		}
		event_check(ns, ev, subject, why, sizeof(why));
		if (why[0]) {
			outcome_set(o, SINK_DEAD, 0, why);
			continue;
		}
		if (lost[0]) {
			outcome_set(o, SINK_RETRY, 0, lost);
			continue;
		}
		if (left < 1) {
			outcome_set(o, SINK_RETRY, 0, "");
			snprintf(o->error, sizeof(o->error),
			         "not sent: the batch's %ld ms (timeout) ran out", ns->timeout_ms);
			continue;
		}
		if (ns->nc == NULL && nats_connect(ns, (long)left, why, sizeof(why)) < 0) {
			/* Every event left fails alike: say it once, try once. */
			snprintf(lost, sizeof(lost), "%s", why);
			outcome_set(o, SINK_RETRY, 0, lost);
			continue;
		}
		left = deadline - now_ms();
		if (publish_one(ns, ev, subject, left < 1 ? 1 : (long)left, o) == PUB_LOST) {
			drop(ns);
			snprintf(lost, sizeof(lost), "not sent: %.200s", o->error);
		}
		o->latency_ms = now_ms() - t0;
	}
	signals_restore(&old);
	free(prev);
	return 0;
}

static void nats_close(struct sink *s)
{
	struct nats_sink *ns = (struct nats_sink *)s;

	if (ns == NULL)
		return;
	drop(ns);
	natsOptions_Destroy(ns->opts);
	free(ns->urls_buf);
	free(ns->prefix);
	free(ns->stream);
	free(ns);
}

/* Split nats_url at commas into ns->urls, checking each. */
static int urls_parse(struct nats_sink *ns, const char *spec, struct err *e)
{
	char *save = NULL, *tok;
	size_t sl = 0;

	ns->urls_buf = strdup(spec);
	if (ns->urls_buf == NULL)
		return err_set(e, ERR_INTERNAL, "out of memory");
	for (tok = strtok_r(ns->urls_buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char one[256];

		while (*tok == ' ')
			tok++;
		for (size_t l = strlen(tok); l > 0 && tok[l - 1] == ' '; l--)
			tok[l - 1] = '\0';
		url_shown(tok, one, sizeof(one));
		if (!url_valid(tok))
			return err_set(e, ERR_CONFIG,
			               "invalid value \"%s\" for \"nats_url\": expected "
			               "nats://[user:password@]host[:port], several separated by "
			               "commas",
			               one);
		if (ns->nurls == NATS_SERVERS_MAX)
			return err_set(e, ERR_CONFIG,
			               "invalid value for \"nats_url\": more than %d servers",
			               NATS_SERVERS_MAX);
		ns->urls[ns->nurls++] = tok;
		sl += (size_t)snprintf(ns->shown + sl,
		                       sl < sizeof(ns->shown) ? sizeof(ns->shown) - sl : 0, "%s%s",
		                       sl ? "," : "", one);
		if (sl >= sizeof(ns->shown))
			sl = sizeof(ns->shown) - 1;
	}
	if (ns->nurls == 0)
		return err_set(e, ERR_CONFIG,
		               "invalid value \"\" for \"nats_url\": expected "
		               "nats://[user:password@]host[:port]");
	return 0;
}

struct sink *sink_nats_open(const struct conf *c, struct err *e)
{
	struct nats_sink *ns = calloc(1, sizeof(*ns));
	const char *prefix = c->nats_subject_prefix != NULL ? c->nats_subject_prefix : "";
	const char *stream = c->nats_stream != NULL ? c->nats_stream : "";
	natsStatus s;
	sigset_t old;

	if (ns == NULL) {
		err_set(e, ERR_INTERNAL, "out of memory");
		return NULL;
	}
	ns->base.name = "nats";
	ns->base.deliver = nats_deliver;
	ns->base.close = nats_close;
	ns->timeout_ms = c->timeout;
	if (urls_parse(ns, c->nats_url != NULL ? c->nats_url : "", e) < 0)
		goto fail;
	if (*prefix &&
	    (strlen(prefix) > NATS_PREFIX_MAX || !subject_valid(prefix, strlen(prefix)))) {
		err_set(e, ERR_CONFIG,
		        "invalid value \"%s\" for \"nats_subject_prefix\": expected subject tokens "
		        "separated by dots (no empty token, space, * or >), at most %d bytes",
		        prefix, NATS_PREFIX_MAX);
		goto fail;
	}
	if (strlen(stream) > NATS_STREAM_MAX || strpbrk(stream, ". *>/\\\t\r\n") != NULL) {
		err_set(
		    e, ERR_CONFIG,
		    "invalid value \"%s\" for \"nats_stream\": a stream name has no dot, space, "
		    "*, >, slash or backslash, and at most %d bytes",
		    stream, NATS_STREAM_MAX);
		goto fail;
	}
	if (ns->timeout_ms <= 0) {
		err_set(e, ERR_CONFIG, "invalid value %ld ms for \"timeout\": must be positive",
		        ns->timeout_ms);
		goto fail;
	}
	ns->prefix = strdup(prefix);
	ns->stream = *stream ? strdup(stream) : NULL;
	if (ns->prefix == NULL || (*stream && ns->stream == NULL)) {
		err_set(e, ERR_INTERNAL, "out of memory");
		goto fail;
	}
	/* The library's own threads start here and at the first connect. */
	signals_block(&old);
	s = natsOptions_Create(&ns->opts);
	if (s == NATS_OK)
		s = natsOptions_SetServers(ns->opts, ns->urls, ns->nurls);
	if (s == NATS_OK)
		s = natsOptions_SetNoRandomize(ns->opts, true);
	/* Nothing happens behind the dispatcher's back: a connection that
	 * breaks is dropped, and the next delivery makes a new one. */
	if (s == NATS_OK)
		s = natsOptions_SetAllowReconnect(ns->opts, false);
	if (s == NATS_OK)
		s = natsOptions_SetName(ns->opts, "idemflow-dispatch");
	signals_restore(&old);
	if (s != NATS_OK) {
		err_set(e, ERR_CONFIG, "invalid value \"%s\" for \"nats_url\": %s", ns->shown,
		        nats_reason(s));
		goto fail;
	}
	return &ns->base;
fail:
	nats_close(&ns->base);
	return NULL;
}
