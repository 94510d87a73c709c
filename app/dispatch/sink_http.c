/*
 * sink_http.c - deliver events as Standard Webhooks POSTs (libcurl).
 *
 * Each event is one POST of its payload to `url`, with webhook-id and
 * Idempotency-Key set to the event id (so a receiver can drop the
 * duplicates at-least-once delivery brings), webhook-timestamp, and a
 * webhook-signature when `secret` is set (see whsig.h), signed with
 * `secret_previous` too while a secret is rotated. One curl handle
 * serves every request so its keep-alive connection is reused across a
 * batch and across batches; events are sent one after another.
 *
 * The tenant endpoints' sink (sink_http_open_endpoints) is the same with
 * the url and the secrets taken from each event instead of the
 * configuration, and the start of every answer's body kept for the
 * attempt ledger.
 *
 * Outcomes: 2xx delivered; 408, 429, 5xx, 3xx (redirects are not followed:
 * a moved endpoint is a configuration matter, and following one would send
 * signed events somewhere nobody configured), connection failures and
 * timeouts are retried, honouring Retry-After; any other 4xx is dead when
 * `dead_on_4xx` is set, since sending the same bytes again cannot help.
 */
#include "config.h"

#include "dispatch/sink.h"
#include "dispatch/whsig.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <curl/curl.h>

/* Response bodies are only drained so the connection stays usable; a
 * receiver that sends more than this gets the connection closed instead. */
#define HTTP_DRAIN_MAX (1024 * 1024)
/* How much of an error response is quoted in the outcome's error text. */
#define HTTP_SNIPPET      120
#define HTTP_PARALLEL_MAX 64
/* Event ids go into headers verbatim, so they must be short and plain. */
#define HTTP_ID_MAX 255

/* One transfer slot: an easy handle (with its own keep-alive connection)
 * and the state of the request it carries. */
struct xfer {
	struct http_sink *h;
	CURL *curl;
	struct curl_slist *hl;
	size_t idx;             /* the event's index in the batch */
	struct sink_outcome *o; /* its outcome, whose body buffer on_body fills */
	double t0;
	long retry_after_s;
	size_t drained;
	int drain_cut; /* stopped reading an oversized body on purpose */
	char snippet[HTTP_SNIPPET + 1];
	size_t snippet_len;
	char errbuf[CURL_ERROR_SIZE];
};

struct http_sink {
	struct sink base;
	CURLM *multi;
	struct xfer *x; /* `parallel` slots */
	int nx;
	char *url;
	int per_event; /* url and secrets come with each event */
	long timeout_ms;
	int dead_on_4xx;
	int sign; /* a secret is configured */
	uint8_t key[WHSIG_KEY_MAX];
	size_t keylen;
	int sign_previous; /* and the previous one, during a rotation */
	uint8_t key_previous[WHSIG_KEY_MAX];
	size_t key_previous_len;
};

static pthread_once_t http_once = PTHREAD_ONCE_INIT;
static CURLcode http_init_rc;

/*
 * curl_global_init is not thread-safe on every libcurl, so it runs once.
 * There is no matching curl_global_cleanup: another sink may still be
 * open, and process exit releases everything anyway.
 */
static void http_global_init(void)
{
	http_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* http or https with a host; everything else is refused before any run. */
static int check_url(const char *url, struct err *e)
{
	CURLU *u = curl_url();
	char *scheme = NULL, *host = NULL;
	CURLUcode uc;
	int rc = -1;

	if (u == NULL)
		return err_set(e, ERR_INTERNAL, "out of memory");
	uc = curl_url_set(u, CURLUPART_URL, url, 0);
	if (uc != CURLUE_OK) {
		err_set(e, ERR_CONFIG, "url \"%s\" is not a valid URL: %s", url,
		        curl_url_strerror(uc));
		goto done;
	}
	/* libcurl lower-cases the scheme, so "HTTPS://" passes too. */
	if (curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
	    (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0)) {
		err_set(e, ERR_CONFIG, "url \"%s\" is not an http:// or https:// URL", url);
		goto done;
	}
	if (curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK || *host == '\0') {
		err_set(e, ERR_CONFIG, "url \"%s\" has no host", url);
		goto done;
	}
	rc = 0;
done:
	curl_free(scheme);
	curl_free(host);
	curl_url_cleanup(u);
	return rc;
}

/*
 * Retry-After is delta-seconds or an HTTP-date (RFC 9110 10.2.3). Returns
 * the delay in seconds, or -1 when the value is neither.
 */
static long parse_retry_after(const char *v, size_t n)
{
	char text[64];
	size_t len = 0;
	long secs = 0;

	while (n > 0 && (*v == ' ' || *v == '\t'))
		v++, n--;
	while (n > 0 && strchr(" \t\r\n", v[n - 1]) != NULL)
		n--;
	if (n == 0 || n >= sizeof(text))
		return -1;
	memcpy(text, v, n);
	text[n] = '\0';
	for (len = 0; len < n && text[len] >= '0' && text[len] <= '9'; len++) {
		/* Clamp rather than overflow: a century is "later" enough. */
		if (secs < 100L * 366 * 86400)
			secs = secs * 10 + (text[len] - '0');
	}
	if (len == n)
		return secs;
	/* curl_getdate reads the IMF-fixdate and the obsolete forms. */
	time_t when = curl_getdate(text, NULL);
	if (when == (time_t)-1)
		return -1;
	time_t now = time(NULL);
	return when > now ? (long)(when - now) : 0;
}

static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
	struct xfer *h = arg;
	size_t len = size * n;
	static const char ra[] = "Retry-After:";

	/* A new status line (after a 1xx, say) starts a new header block. */
	if (len >= 5 && memcmp(p, "HTTP/", 5) == 0)
		h->retry_after_s = -1;
	else if (len > sizeof(ra) - 1 && strncasecmp(p, ra, sizeof(ra) - 1) == 0)
		h->retry_after_s = parse_retry_after(p + sizeof(ra) - 1, len - (sizeof(ra) - 1));
	return len;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
	struct xfer *h = arg;
	size_t len = size * n;

	/* The endpoints' sink only: the configured sink's callers leave the
	 * buffer unset. */
	if (h->h->per_event && h->o != NULL && h->o->body != NULL &&
	    h->o->body_len < h->o->body_cap) {
		size_t room = h->o->body_cap - h->o->body_len;
		size_t k = len < room ? len : room;

		memcpy(h->o->body + h->o->body_len, p, k);
		h->o->body_len += k;
	}
	for (size_t i = 0; i < len && h->snippet_len < HTTP_SNIPPET; i++) {
		unsigned char c = (unsigned char)p[i];
		/* Quoted in logs: keep it on one line and printable. */
		h->snippet[h->snippet_len++] = c >= 0x20 && c < 0x7f ? (char)c : ' ';
	}
	h->snippet[h->snippet_len] = '\0';
	h->drained += len;
	if (h->drained > HTTP_DRAIN_MAX) {
		h->drain_cut = 1;
		return 0; /* libcurl stops with CURLE_WRITE_ERROR and drops the connection */
	}
	return len;
}

/* Header values are copied verbatim: refuse anything that could break a line. */
static int id_is_plain(const char *id)
{
	size_t n = 0;

	for (; id[n]; n++)
		if ((unsigned char)id[n] <= 0x20 || (unsigned char)id[n] >= 0x7f)
			return 0;
	return n > 0 && n <= HTTP_ID_MAX;
}

/* A trace header's value: printable ASCII and spaces only, so that no
 * stored value can end the line (the server stores only such values). */
static int trace_value_plain(const char *v)
{
	size_t n = 0;

	for (; v[n]; n++)
		if ((unsigned char)v[n] < 0x20 || (unsigned char)v[n] >= 0x7f)
			return 0;
	return n > 0 && n <= 512;
}

/* curl_slist_append leaves the list alone when it fails, so keep it in *l. */
static int add_header(struct curl_slist **l, const char *line)
{
	struct curl_slist *n = curl_slist_append(*l, line);

	if (n == NULL)
		return -1;
	*l = n;
	return 0;
}

static void outcome_http(const struct xfer *x, long status, struct sink_outcome *o)
{
	const struct xfer *h = x;
	char *loc = NULL;
	int n;

	o->status = (int)status;
	o->cls = "http";
	if (status >= 200 && status < 300) {
		o->cls = "succeeded";
		o->result = SINK_OK;
		o->retry_after_s = -1;
		o->error[0] = '\0';
		return;
	}
	if (status >= 400 && status < 500 && status != 408 && status != 429)
		o->result = x->h->dead_on_4xx ? SINK_DEAD : SINK_RETRY;
	else
		o->result = SINK_RETRY; /* 408, 429, 5xx, 3xx and anything odd */
	o->retry_after_s = h->retry_after_s;
	n = snprintf(o->error, sizeof(o->error), "HTTP %ld", status);
	if (status >= 300 && status < 400) {
		if (curl_easy_getinfo(h->curl, CURLINFO_REDIRECT_URL, &loc) == CURLE_OK && loc)
			snprintf(o->error + n, sizeof(o->error) - (size_t)n,
			         " (redirect to %s not followed)", loc);
		else
			snprintf(o->error + n, sizeof(o->error) - (size_t)n,
			         " (redirects are not followed)");
	} else {
		size_t len = h->snippet_len;

		while (len > 0 && h->snippet[len - 1] == ' ')
			len--; /* a trailing newline, usually */
		if (len > 0)
			snprintf(o->error + n, sizeof(o->error) - (size_t)n, ": %.*s", (int)len,
			         h->snippet);
	}
}

/* curl's own message, plus the system's reason ("Connection refused"),
 * which libcurl keeps apart. */
static void transport_error(struct xfer *h, CURLcode cc, char *out, size_t outsz)
{
	long oserr = 0;
	int n;

	n = snprintf(out, outsz, "%s", h->errbuf[0] ? h->errbuf : curl_easy_strerror(cc));
	if (n >= 0 && (size_t)n < outsz &&
	    curl_easy_getinfo(h->curl, CURLINFO_OS_ERRNO, &oserr) == CURLE_OK && oserr != 0)
		snprintf(out + n, outsz - (size_t)n, " (%s)", strerror((int)oserr));
}

/* The request's header list; NULL when memory ran out. */
static struct curl_slist *build_headers(const struct sink_event *ev, long ts, const char *sig)
{
	const char *id = ev->event_id;
	char line[HTTP_ID_MAX + 600];
	struct curl_slist *hl = NULL;
	int ok;

	/* "Expect:" stops libcurl from waiting for 100-continue on large bodies. */
	ok = add_header(&hl, "Content-Type: application/json") == 0 &&
	     add_header(&hl, "Expect:") == 0;
	snprintf(line, sizeof(line), "webhook-id: %s", id);
	ok = ok && add_header(&hl, line) == 0;
	snprintf(line, sizeof(line), "webhook-timestamp: %ld", ts);
	ok = ok && add_header(&hl, line) == 0;
	/* Standard Webhooks requires a signature; without a secret there is
	 * nothing to sign with, so the header is left out rather than faked. */
	if (*sig != '\0') {
		snprintf(line, sizeof(line), "webhook-signature: %s", sig);
		ok = ok && add_header(&hl, line) == 0;
	}
	snprintf(line, sizeof(line), "Idempotency-Key: %s", id);
	ok = ok && add_header(&hl, line) == 0;
	/* The trace of the request that made the event goes on (W3C Trace
	 * Context); tracestate only with its traceparent. */
	if (ev->traceparent != NULL && trace_value_plain(ev->traceparent)) {
		snprintf(line, sizeof(line), "traceparent: %s", ev->traceparent);
		ok = ok && add_header(&hl, line) == 0;
		if (ev->tracestate != NULL && trace_value_plain(ev->tracestate)) {
			snprintf(line, sizeof(line), "tracestate: %s", ev->tracestate);
			ok = ok && add_header(&hl, line) == 0;
		}
	}
	if (!ok) {
		curl_slist_free_all(hl);
		return NULL;
	}
	return hl;
}

static void fail_all(struct sink_outcome *outs, size_t from, size_t n, const struct err *e)
{
	for (size_t j = from; j < n; j++) {
		outs[j].result = SINK_RETRY;
		outs[j].retry_after_s = -1;
		outs[j].status = 0;
		outs[j].latency_ms = 0;
		outs[j].cls = "other";
		snprintf(outs[j].error, sizeof(outs[j].error), "not sent: %.200s",
		         e ? e->msg : "the sink failed");
	}
}

/* The ledger's class of a transfer that ended without an answer. */
static const char *transport_class(CURLcode cc)
{
	switch (cc) {
	case CURLE_OPERATION_TIMEDOUT: return "timeout";
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_COULDNT_RESOLVE_PROXY:
	case CURLE_COULDNT_CONNECT: return "connect";
	case CURLE_SSL_CONNECT_ERROR:
	case CURLE_PEER_FAILED_VERIFICATION:
	case CURLE_SSL_CERTPROBLEM:
	case CURLE_SSL_CIPHER:
	case CURLE_SSL_CACERT_BADFILE:
	case CURLE_SSL_ISSUER_ERROR:
	case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
	case CURLE_SSL_INVALIDCERTSTATUS:
	case CURLE_SSL_CRL_BADFILE:
	case CURLE_SSL_SHUTDOWN_FAILED:
	case CURLE_SSL_ENGINE_NOTFOUND:
	case CURLE_SSL_ENGINE_SETFAILED:
	case CURLE_SSL_ENGINE_INITFAILED: return "tls";
	default: return "other";
	}
}

/*
 * An endpoint's event: sig = its signature header, with the event's
 * secret and, during a rotation, its previous one. A secret the sink
 * cannot read (the schema admits only the whsec_ form, so this is a
 * row written by hand) makes the event dead rather than unsigned:
 * returns -1 with o filled.
 */
static int sign_event(const struct sink_event *ev, long ts, const char *body,
                      char sig[WHSIG_HEADER_MAX], struct sink_outcome *o)
{
	uint8_t key[WHSIG_KEY_MAX], key2[WHSIG_KEY_MAX];
	size_t keylen = 0, key2len = 0;
	int two = ev->secret_previous != NULL && *ev->secret_previous != '\0';
	struct err e = { 0 };
	int rc = 0;

	if (ev->secret == NULL || whsig_key(ev->secret, key, &keylen, &e) < 0 ||
	    (two &&
	     whsig_key_named("previous_secret", ev->secret_previous, key2, &key2len, &e) < 0) ||
	    whsig_sign_header(key, keylen, two ? key2 : NULL, key2len, ev->event_id, ts, body,
	                      ev->payload_len, sig, &e) < 0) {
		o->result = SINK_DEAD;
		snprintf(o->error, sizeof(o->error), "cannot sign: %.200s",
		         ev->secret == NULL ? "the endpoint has no secret" : e.msg);
		rc = -1;
	}
	explicit_bzero(key, sizeof(key));
	explicit_bzero(key2, sizeof(key2));
	return rc;
}

/*
 * Put event i on slot x and hand it to the multi handle. Returns 1 when
 * the request is under way, 0 when the outcome is already decided (an id
 * no header can carry), -1 when the sink itself failed.
 */
static int start_one(struct xfer *x, const struct sink_event *ev, size_t i, struct sink_outcome *o,
                     struct err *e)
{
	struct http_sink *h = x->h;
	char sig[WHSIG_HEADER_MAX] = "";
	const char *body = ev->payload ? ev->payload : "";
	long ts = (long)time(NULL);
	CURLcode cc;
	CURLMcode mc;

	o->result = SINK_RETRY;
	o->retry_after_s = -1;
	o->status = 0;
	o->latency_ms = 0;
	o->error[0] = '\0';
	o->cls = "other";
	if (h->per_event)
		o->body_len = 0;
	if (ev->event_id == NULL || !id_is_plain(ev->event_id)) {
		/* Sending it again cannot make it a valid header: dead at once. */
		o->result = SINK_DEAD;
		snprintf(o->error, sizeof(o->error),
		         "event id is not 1 to %d visible ASCII characters", HTTP_ID_MAX);
		return 0;
	}
	if (h->per_event) {
		if (sign_event(ev, ts, body, sig, o) < 0)
			return 0;
	} else if (h->sign &&
	           whsig_sign_header(h->key, h->keylen, h->sign_previous ? h->key_previous : NULL,
	                             h->key_previous_len, ev->event_id, ts, body, ev->payload_len,
	                             sig, e) < 0) {
		return -1;
	}
	x->hl = build_headers(ev, ts, sig);
	if (x->hl == NULL) {
		err_set(e, ERR_INTERNAL, "out of memory");
		return -1;
	}
	/* The size first: with it set, POSTFIELDS is sent as bytes, not a C string. */
	if ((cc = curl_easy_setopt(x->curl, CURLOPT_URL,
	                           h->per_event && ev->url ? ev->url : h->url)) != CURLE_OK ||
	    (cc = curl_easy_setopt(x->curl, CURLOPT_HTTPHEADER, x->hl)) != CURLE_OK ||
	    (cc = curl_easy_setopt(x->curl, CURLOPT_POSTFIELDSIZE_LARGE,
	                           (curl_off_t)ev->payload_len)) != CURLE_OK ||
	    (cc = curl_easy_setopt(x->curl, CURLOPT_POSTFIELDS, body)) != CURLE_OK) {
		err_set(e, ERR_INTERNAL, "curl_easy_setopt: %s", curl_easy_strerror(cc));
		return -1;
	}
	x->idx = i;
	x->o = o;
	x->retry_after_s = -1;
	x->drained = 0;
	x->drain_cut = 0;
	x->snippet_len = 0;
	x->snippet[0] = '\0';
	x->errbuf[0] = '\0';
	x->t0 = now_ms();
	if ((mc = curl_multi_add_handle(h->multi, x->curl)) != CURLM_OK) {
		err_set(e, ERR_INTERNAL, "curl_multi_add_handle: %s", curl_multi_strerror(mc));
		return -1;
	}
	return 1;
}

/* The request on x ended with cc: decide the outcome and free the slot. */
static int finish_one(struct xfer *x, CURLcode cc, struct sink_outcome *o, struct err *e)
{
	struct http_sink *h = x->h;
	long status = 0;
	int rc = 0;

	o->latency_ms = now_ms() - x->t0;
	curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &status);
	if (cc == CURLE_WRITE_ERROR && x->drain_cut)
		cc = CURLE_OK; /* the status is known; only the excess body was refused */
	if (cc == CURLE_OUT_OF_MEMORY) {
		err_set(e, ERR_INTERNAL, "out of memory");
		rc = -1;
	} else if (cc == CURLE_OK || status >= 200) {
		/* Once a final status line arrived the receiver has decided; a
		 * body cut short by a timeout or a reset changes nothing, and
		 * retrying a 2xx would only make a duplicate. */
		outcome_http(x, status, o);
	} else {
		/* Unreachable, reset, timed out: the receiver may be back later. */
		o->result = SINK_RETRY;
		o->status = (int)status;
		o->retry_after_s = x->retry_after_s;
		o->cls = transport_class(cc);
		if (cc == CURLE_OPERATION_TIMEDOUT)
			snprintf(o->error, sizeof(o->error), "timeout after %ld ms", h->timeout_ms);
		else
			transport_error(x, cc, o->error, sizeof(o->error));
	}
	curl_multi_remove_handle(h->multi, x->curl);
	/* The handle must not keep pointing at the freed list. */
	curl_easy_setopt(x->curl, CURLOPT_HTTPHEADER, (struct curl_slist *)NULL);
	curl_slist_free_all(x->hl);
	x->hl = NULL;
	x->o = NULL;
	return rc;
}

/*
 * Up to `parallel` requests at once, each slot on its own keep-alive
 * connection. A batch never holds two events of one workflow (the claim
 * skips an event while an earlier one of its workflow is undelivered), so
 * delivering a batch in parallel keeps every workflow's order.
 */
static int http_deliver(struct sink *s, const struct sink_event *evs, size_t n,
                        struct sink_outcome *outs, struct err *e)
{
	struct http_sink *h = (struct http_sink *)s;
	struct xfer *busy[HTTP_PARALLEL_MAX] = { 0 };
	size_t next = 0;
	int active = 0, rc = 0;

	while (rc == 0 && (next < n || active > 0)) {
		for (int k = 0; k < h->nx && next < n && rc == 0; k++) {
			if (busy[k] != NULL)
				continue;
			int st = start_one(&h->x[k], &evs[next], next, &outs[next], e);
			if (st < 0) {
				curl_slist_free_all(h->x[k].hl);
				h->x[k].hl = NULL;
				rc = -1;
				break;
			}
			next++;
			if (st == 1) {
				busy[k] = &h->x[k];
				active++;
			} else {
				k--; /* the slot is still free */
			}
		}
		if (rc < 0 || active == 0)
			break;
		int running;
		CURLMcode mc = curl_multi_perform(h->multi, &running);
		if (mc == CURLM_OK && running > 0)
			mc = curl_multi_poll(h->multi, NULL, 0, 100, NULL);
		if (mc != CURLM_OK) {
			err_set(e, ERR_INTERNAL, "curl_multi: %s", curl_multi_strerror(mc));
			rc = -1;
			break;
		}
		CURLMsg *m;
		int left;
		while ((m = curl_multi_info_read(h->multi, &left)) != NULL) {
			if (m->msg != CURLMSG_DONE)
				continue;
			for (int k = 0; k < h->nx; k++) {
				if (busy[k] != NULL && busy[k]->curl == m->easy_handle) {
					CURLcode cc = m->data.result;
					if (finish_one(busy[k], cc, &outs[busy[k]->idx], e) < 0)
						rc = -1;
					busy[k] = NULL;
					active--;
					break;
				}
			}
		}
	}
	if (rc < 0) {
		/* The run stops; still leave every outcome filled in. */
		for (int k = 0; k < h->nx; k++) {
			if (busy[k] == NULL)
				continue;
			fail_all(outs, busy[k]->idx, busy[k]->idx + 1, e);
			curl_multi_remove_handle(h->multi, busy[k]->curl);
			curl_easy_setopt(busy[k]->curl, CURLOPT_HTTPHEADER,
			                 (struct curl_slist *)NULL);
			curl_slist_free_all(busy[k]->hl);
			busy[k]->hl = NULL;
		}
		fail_all(outs, next, n, e);
	}
	return rc;
}

static void http_close(struct sink *s)
{
	struct http_sink *h = (struct http_sink *)s;

	if (h == NULL)
		return;
	for (int k = 0; k < h->nx; k++)
		if (h->x[k].curl)
			curl_easy_cleanup(h->x[k].curl);
	free(h->x);
	if (h->multi)
		curl_multi_cleanup(h->multi);
	explicit_bzero(h->key, sizeof(h->key));
	explicit_bzero(h->key_previous, sizeof(h->key_previous));
	free(h->url);
	free(h);
}

static struct sink *http_open(const struct conf *c, int per_event, struct err *e)
{
	struct http_sink *h = NULL;
	CURLcode cc;

	if (!per_event) {
		if (c->url == NULL || *c->url == '\0') {
			err_set(e, ERR_CONFIG, "url is required for sink http");
			return NULL;
		}
		if (check_url(c->url, e) < 0)
			return NULL;
	}
	pthread_once(&http_once, http_global_init);
	if (http_init_rc != CURLE_OK) {
		err_set(e, ERR_INTERNAL, "curl_global_init: %s", curl_easy_strerror(http_init_rc));
		return NULL;
	}
	h = calloc(1, sizeof(*h));
	if (h == NULL || (h->url = strdup(per_event ? "" : c->url)) == NULL ||
	    (h->multi = curl_multi_init()) == NULL ||
	    (h->x = calloc((size_t)c->parallel, sizeof(*h->x))) == NULL) {
		err_set(e, ERR_INTERNAL, "out of memory");
		goto fail;
	}
	h->base.name = "http";
	h->per_event = per_event;
	h->base.deliver = http_deliver;
	h->base.close = http_close;
	h->timeout_ms = c->timeout;
	h->dead_on_4xx = c->dead_on_4xx;
	if (!per_event && c->secret != NULL && *c->secret != '\0') {
		if (whsig_key(c->secret, h->key, &h->keylen, e) < 0)
			goto fail;
		h->sign = 1;
	}
	if (!per_event && c->secret_previous != NULL && *c->secret_previous != '\0') {
		if (!h->sign) {
			err_set(e, ERR_CONFIG, "secret_previous is set without secret");
			goto fail;
		}
		if (whsig_key_named("secret_previous", c->secret_previous, h->key_previous,
		                    &h->key_previous_len, e) < 0)
			goto fail;
		h->sign_previous = 1;
	}
	for (h->nx = 0; h->nx < c->parallel && h->nx < HTTP_PARALLEL_MAX; h->nx++) {
		struct xfer *x = &h->x[h->nx];
		x->h = h;
		if ((x->curl = curl_easy_init()) == NULL) {
			err_set(e, ERR_INTERNAL, "out of memory");
			goto fail;
		}
		/* Set once; only the url, the headers and the body change per
		 * request. */
		if ((cc = curl_easy_setopt(x->curl, CURLOPT_NOSIGNAL, 1L)) != CURLE_OK ||
		    (cc = curl_easy_setopt(x->curl, CURLOPT_TCP_KEEPALIVE, 1L)) != CURLE_OK ||
		    (cc = curl_easy_setopt(x->curl, CURLOPT_TIMEOUT_MS, h->timeout_ms)) !=
		        CURLE_OK ||
		    (cc = curl_easy_setopt(x->curl, CURLOPT_FOLLOWLOCATION, 0L)) != CURLE_OK ||
#if LIBCURL_VERSION_NUM >= 0x075500 /* 7.85: the _STR form replaced the bitmask */
		    (cc = curl_easy_setopt(x->curl, CURLOPT_PROTOCOLS_STR, "http,https")) !=
		        CURLE_OK ||
#else
		    (cc = curl_easy_setopt(x->curl, CURLOPT_PROTOCOLS,
		                           (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS))) != CURLE_OK ||
#endif
		    (cc = curl_easy_setopt(x->curl, CURLOPT_USERAGENT,
		                           "idemflow-dispatch/" PACKAGE_VERSION)) != CURLE_OK ||
		    (cc = curl_easy_setopt(x->curl, CURLOPT_ERRORBUFFER, x->errbuf)) != CURLE_OK ||
		    (cc = curl_easy_setopt(x->curl, CURLOPT_HEADERFUNCTION, on_header)) !=
		        CURLE_OK ||
		    (cc = curl_easy_setopt(x->curl, CURLOPT_HEADERDATA, x)) != CURLE_OK ||
		    (cc = curl_easy_setopt(x->curl, CURLOPT_WRITEFUNCTION, on_body)) != CURLE_OK ||
		    (cc = curl_easy_setopt(x->curl, CURLOPT_WRITEDATA, x)) != CURLE_OK) {
			err_set(e, ERR_INTERNAL, "curl_easy_setopt: %s", curl_easy_strerror(cc));
			h->nx++;
			goto fail;
		}
	}
	return &h->base;
fail:
	http_close(h ? &h->base : NULL);
	return NULL;
}

struct sink *sink_http_open(const struct conf *c, struct err *e)
{
	return http_open(c, 0, e);
}

struct sink *sink_http_open_endpoints(const struct conf *c, struct err *e)
{
	return http_open(c, 1, e);
}
