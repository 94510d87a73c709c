/*
 * Raw HTTP/1.1 and FastCGI client for the end-to-end tests; see http.h.
 *
 * Every request uses its own connection and "Connection: close", so a
 * response is simply everything read until EOF; framing (Content-Length or
 * chunked) is then applied to that buffer, which also lets us detect a
 * response that was cut short.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem, strcasestr, vasprintf */
#endif
#include "http.h"

#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

/* Long enough for a request that waits out idempotency_wait or a worker
 * restart, short enough that a hung server fails the test well before
 * Criterion's own timeout. */
#define HTTP_TIMEOUT_S 15

/* FastCGI record types and constants (FastCGI 1.0 specification). */
enum {
	FCGI_VERSION_1 = 1,
	FCGI_BEGIN_REQUEST = 1,
	FCGI_END_REQUEST = 3,
	FCGI_PARAMS = 4,
	FCGI_STDIN = 5,
	FCGI_STDOUT = 6,
	FCGI_STDERR = 7,
	FCGI_RESPONDER = 1,
	FCGI_REQUEST_ID = 1,
	FCGI_MAX_CONTENT = 65535,
};

struct buf {
	char *data;
	size_t len;
	size_t cap;
};

static _Thread_local char http_errbuf[512];

static void http_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void http_set_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(http_errbuf, sizeof(http_errbuf), fmt, ap);
	va_end(ap);
}

const char *http_error(void)
{
	return http_errbuf;
}

static int buf_append(struct buf *b, const void *data, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		char *p;

		while (cap < b->len + n + 1)
			cap *= 2;
		p = realloc(b->data, cap);
		if (!p) {
			http_set_error("out of memory");
			return -1;
		}
		b->data = p;
		b->cap = cap;
	}
	if (n)
		memcpy(b->data + b->len, data, n);
	b->len += n;
	b->data[b->len] = '\0';
	return 0;
}

static int buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int buf_printf(struct buf *b, const char *fmt, ...)
{
	va_list ap;
	char *s = NULL;
	int n, rc;

	va_start(ap, fmt);
	n = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (n < 0) {
		http_set_error("out of memory");
		return -1;
	}
	rc = buf_append(b, s, (size_t)n);
	free(s);
	return rc;
}

static void socket_set_timeouts(int fd)
{
	struct timeval tv = { .tv_sec = HTTP_TIMEOUT_S, .tv_usec = 0 };

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* Host and port of nginx, from the harness environment. */
static void http_target(const char **host, const char **port)
{
	*host = getenv("IDEMFLOW_HOST");
	*port = getenv("IDEMFLOW_PORT");
	if (!*host || !**host)
		*host = "127.0.0.1";
	if (!*port || !**port)
		*port = "80";
}

static int http_connect(void)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res = NULL, *ai;
	const char *host, *port;
	int fd = -1, rc, err = 0;

	http_target(&host, &port);
	rc = getaddrinfo(host, port, &hints, &res);
	if (rc != 0) {
		http_set_error("resolve %s:%s: %s", host, port, gai_strerror(rc));
		return -1;
	}
	for (ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
		if (fd < 0) {
			err = errno;
			continue;
		}
		socket_set_timeouts(fd);
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
			break;
		err = errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd < 0)
		http_set_error("connect %s:%s: %s", host, port, strerror(err));
	return fd;
}

/*
 * Returns 0 when everything was sent, 1 when the peer stopped reading
 * early (it may have answered already, e.g. 413 before the whole body
 * arrived, so the caller should still read), -1 on other errors.
 */
static int send_all(int fd, const char *data, size_t len)
{
	while (len > 0) {
		ssize_t n = send(fd, data, len, MSG_NOSIGNAL);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EPIPE || errno == ECONNRESET)
				return 1;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				http_set_error("send timed out after %ds", HTTP_TIMEOUT_S);
			else
				http_set_error("send: %s", strerror(errno));
			return -1;
		}
		data += n;
		len -= (size_t)n;
	}
	return 0;
}

/*
 * Read until EOF.  A reset after some bytes arrived is treated as EOF so the
 * framing check can decide whether the response is complete.
 */
static int recv_all(int fd, struct buf *out)
{
	char chunk[16384];

	for (;;) {
		ssize_t n = recv(fd, chunk, sizeof(chunk), 0);

		if (n == 0)
			return 0;
		if (n > 0) {
			if (buf_append(out, chunk, (size_t)n) < 0)
				return -1;
			continue;
		}
		if (errno == EINTR)
			continue;
		if (errno == ECONNRESET && out->len > 0)
			return 0;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			http_set_error("no complete response within %ds "
			               "(%zu bytes received)",
			               HTTP_TIMEOUT_S, out->len);
		else
			http_set_error("recv: %s", strerror(errno));
		return -1;
	}
}

static int header_add(struct http_response *r, const char *name, size_t name_len, const char *value,
                      size_t value_len)
{
	struct http_field *h;

	h = realloc(r->headers, (r->header_count + 1) * sizeof(*h));
	if (!h) {
		http_set_error("out of memory");
		return -1;
	}
	r->headers = h;
	h[r->header_count].name = strndup(name, name_len);
	h[r->header_count].value = strndup(value, value_len);
	if (!h[r->header_count].name || !h[r->header_count].value) {
		free(h[r->header_count].name);
		free(h[r->header_count].value);
		http_set_error("out of memory");
		return -1;
	}
	r->header_count++;
	return 0;
}

/* Parse one "Name: value" line (no line terminator) into r. */
static int header_parse_line(struct http_response *r, const char *line, size_t len)
{
	const char *colon = memchr(line, ':', len);
	const char *v, *end = line + len;

	if (!colon || colon == line) {
		http_set_error("malformed header line: %.*s", (int)len, line);
		return -1;
	}
	v = colon + 1;
	while (v < end && (*v == ' ' || *v == '\t'))
		v++;
	while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
		end--;
	return header_add(r, line, (size_t)(colon - line), v, (size_t)(end - v));
}

static void headers_clear(struct http_response *r)
{
	for (size_t i = 0; i < r->header_count; i++) {
		free(r->headers[i].name);
		free(r->headers[i].value);
	}
	free(r->headers);
	r->headers = NULL;
	r->header_count = 0;
}

static int body_set(struct http_response *r, const char *data, size_t len)
{
	r->body = malloc(len + 1);
	if (!r->body) {
		http_set_error("out of memory");
		return -1;
	}
	if (len)
		memcpy(r->body, data, len);
	r->body[len] = '\0';
	r->body_len = len;
	return 0;
}

static int body_dechunk(struct http_response *r, const char *p, const char *end)
{
	struct buf out = { 0 };

	for (;;) {
		const char *eol = memmem(p, (size_t)(end - p), "\r\n", 2);
		unsigned long long size;
		char *stop;

		if (!eol) {
			http_set_error("truncated chunked body");
			goto fail;
		}
		errno = 0;
		size = strtoull(p, &stop, 16);
		if (stop == p || errno || (stop != eol && *stop != ';' && *stop != ' ')) {
			http_set_error("bad chunk size line: %.*s", (int)(eol - p), p);
			goto fail;
		}
		p = eol + 2;
		if (size == 0)
			break; /* trailers, if any, are of no interest */
		if ((unsigned long long)(end - p) < size + 2 || memcmp(p + size, "\r\n", 2) != 0) {
			http_set_error("truncated chunk of %llu bytes", size);
			goto fail;
		}
		if (buf_append(&out, p, (size_t)size) < 0)
			goto fail;
		p += size + 2;
	}
	if (!out.data && buf_append(&out, "", 0) < 0)
		goto fail;
	r->body = out.data;
	r->body_len = out.len;
	return 0;
fail:
	free(out.data);
	return -1;
}

/* Split an HTTP/1.x response held entirely in raw. */
static int http_parse(const char *raw, size_t len, struct http_response *r)
{
	const char *p = raw, *end = raw + len, *hend;
	const char *te, *cl;

	for (;;) {
		const char *eol;
		int minor;

		hend = memmem(p, (size_t)(end - p), "\r\n\r\n", 4);
		if (!hend) {
			http_set_error("no end of headers in %zu bytes: %.*s", len,
			               (int)(len > 200 ? 200 : len), raw);
			return -1;
		}
		if (sscanf(p, "HTTP/1.%d %3d", &minor, &r->status) != 2) {
			http_set_error("bad status line: %.*s",
			               (int)(hend - p > 200 ? 200 : hend - p), p);
			return -1;
		}
		eol = memmem(p, (size_t)(hend + 2 - p), "\r\n", 2);
		p = eol + 2;
		while (p < hend + 2) {
			eol = memmem(p, (size_t)(hend + 2 - p), "\r\n", 2);
			if (header_parse_line(r, p, (size_t)(eol - p)) < 0)
				return -1;
			p = eol + 2;
		}
		p = hend + 4;
		/* An interim 1xx response is followed by the real one. */
		if (r->status >= 200)
			break;
		headers_clear(r);
	}

	te = http_header(r, "Transfer-Encoding");
	cl = http_header(r, "Content-Length");
	if (te && strcasestr(te, "chunked"))
		return body_dechunk(r, p, end);
	if (cl) {
		char *stop;
		unsigned long long n = strtoull(cl, &stop, 10);

		if (*stop || stop == cl) {
			http_set_error("bad Content-Length: %s", cl);
			return -1;
		}
		if ((unsigned long long)(end - p) < n) {
			http_set_error("truncated body: %zu of %llu bytes", (size_t)(end - p), n);
			return -1;
		}
		return body_set(r, p, (size_t)n);
	}
	return body_set(r, p, (size_t)(end - p));
}

/* Send bytes on a fresh connection fd, read to EOF, and parse. */
static struct http_response *http_exchange(int fd, const char *req, size_t req_len)
{
	struct http_response *r = NULL;
	struct buf in = { 0 };

	/* No shutdown(SHUT_WR) after sending: nginx takes a client EOF while
	 * the upstream is still working as an abort (499) and would cancel
	 * exactly the slow requests these tests care about. */
	if (send_all(fd, req, req_len) < 0 || recv_all(fd, &in) < 0)
		goto out;
	r = calloc(1, sizeof(*r));
	if (!r) {
		http_set_error("out of memory");
		goto out;
	}
	if (http_parse(in.data ? in.data : "", in.len, r) < 0) {
		http_response_free(r);
		r = NULL;
	}
out:
	free(in.data);
	return r;
}

struct http_response *http_send_raw(const void *bytes, size_t len)
{
	struct http_response *r;
	int fd = http_connect();

	if (fd < 0)
		return NULL;
	r = http_exchange(fd, bytes, len);
	close(fd);
	return r;
}

struct http_response *http_request(const char *method, const char *path, const char *const *headers,
                                   const void *body, size_t body_len)
{
	struct http_response *r = NULL;
	struct buf req = { 0 };
	const char *host, *port;

	http_target(&host, &port);
	if (buf_printf(&req,
	               "%s %s HTTP/1.1\r\nHost: %s:%s\r\n"
	               "Connection: close\r\n",
	               method, path, host, port) < 0)
		goto out;
	for (size_t i = 0; headers && headers[i]; i++)
		if (buf_printf(&req, "%s\r\n", headers[i]) < 0)
			goto out;
	if (body && buf_printf(&req, "Content-Length: %zu\r\n", body_len) < 0)
		goto out;
	if (buf_append(&req, "\r\n", 2) < 0)
		goto out;
	if (body && buf_append(&req, body, body_len) < 0)
		goto out;
	r = http_send_raw(req.data, req.len);
out:
	free(req.data);
	return r;
}

/* --- FastCGI ----------------------------------------------------------- */

static int fcgi_record(struct buf *b, unsigned type, const void *content, size_t len)
{
	static const char zeros[8];
	size_t pad = (8 - len % 8) % 8;
	unsigned char h[8] = {
		FCGI_VERSION_1,
		(unsigned char)type,
		0,
		FCGI_REQUEST_ID,
		(unsigned char)(len >> 8),
		(unsigned char)(len & 0xff),
		(unsigned char)pad,
		0,
	};

	if (buf_append(b, h, sizeof(h)) < 0 || buf_append(b, content, len) < 0 ||
	    buf_append(b, zeros, pad) < 0)
		return -1;
	return 0;
}

/* Records of one stream (PARAMS or STDIN), ending with the empty record. */
static int fcgi_stream(struct buf *b, unsigned type, const char *data, size_t len)
{
	while (len > 0) {
		size_t n = len > FCGI_MAX_CONTENT ? FCGI_MAX_CONTENT : len;

		if (fcgi_record(b, type, data, n) < 0)
			return -1;
		data += n;
		len -= n;
	}
	return fcgi_record(b, type, "", 0);
}

static int fcgi_length(struct buf *b, size_t n)
{
	unsigned char l[4];

	if (n < 128) {
		l[0] = (unsigned char)n;
		return buf_append(b, l, 1);
	}
	l[0] = (unsigned char)(0x80 | ((n >> 24) & 0x7f));
	l[1] = (unsigned char)(n >> 16);
	l[2] = (unsigned char)(n >> 8);
	l[3] = (unsigned char)n;
	return buf_append(b, l, 4);
}

static int fcgi_param(struct buf *b, const char *name, const char *value, size_t value_len)
{
	size_t name_len = strlen(name);

	if (fcgi_length(b, name_len) < 0 || fcgi_length(b, value_len) < 0 ||
	    buf_append(b, name, name_len) < 0 || buf_append(b, value, value_len) < 0)
		return -1;
	return 0;
}

static int fcgi_param_str(struct buf *b, const char *name, const char *value)
{
	return fcgi_param(b, name, value, strlen(value));
}

/* "Name: value" → HTTP_NAME, as nginx does for request headers. */
static int fcgi_header_param(struct buf *b, const char *line)
{
	const char *colon = strchr(line, ':');
	const char *v;
	char name[256];
	size_t n = 0;

	if (!colon || (size_t)(colon - line) + 6 > sizeof(name)) {
		http_set_error("bad header for FastCGI: %s", line);
		return -1;
	}
	v = colon + 1;
	while (*v == ' ' || *v == '\t')
		v++;
	if ((size_t)(colon - line) == 12 && strncasecmp(line, "Content-Type", 12) == 0)
		return fcgi_param_str(b, "CONTENT_TYPE", v);
	if ((size_t)(colon - line) == 14 && strncasecmp(line, "Content-Length", 14) == 0)
		return 0; /* derived from the body instead */
	memcpy(name, "HTTP_", 5);
	n = 5;
	for (const char *c = line; c < colon; c++) {
		char ch = *c;

		if (ch == '-')
			ch = '_';
		else if (ch >= 'a' && ch <= 'z')
			ch = (char)(ch - 'a' + 'A');
		name[n++] = ch;
	}
	name[n] = '\0';
	return fcgi_param_str(b, name, v);
}

static int fcgi_params(struct buf *params, const char *method, const char *path,
                       const char *const *headers, const void *body, size_t body_len,
                       const char *request_id)
{
	const char *q = strchr(path, '?');
	size_t plen = q ? (size_t)(q - path) : strlen(path);
	char clen[32];

	if (fcgi_param_str(params, "GATEWAY_INTERFACE", "CGI/1.1") < 0 ||
	    fcgi_param_str(params, "SERVER_SOFTWARE", "idemflow-tests") < 0 ||
	    fcgi_param_str(params, "SERVER_PROTOCOL", "HTTP/1.1") < 0 ||
	    fcgi_param_str(params, "REQUEST_SCHEME", "http") < 0 ||
	    fcgi_param_str(params, "SERVER_NAME", "localhost") < 0 ||
	    fcgi_param_str(params, "SERVER_ADDR", "127.0.0.1") < 0 ||
	    fcgi_param_str(params, "SERVER_PORT", "80") < 0 ||
	    fcgi_param_str(params, "REMOTE_ADDR", "127.0.0.1") < 0 ||
	    fcgi_param_str(params, "REMOTE_PORT", "40000") < 0 ||
	    fcgi_param_str(params, "DOCUMENT_ROOT", "/") < 0 ||
	    fcgi_param_str(params, "REQUEST_METHOD", method) < 0 ||
	    fcgi_param_str(params, "REQUEST_URI", path) < 0 ||
	    fcgi_param(params, "DOCUMENT_URI", path, plen) < 0 ||
	    fcgi_param(params, "SCRIPT_NAME", path, plen) < 0 ||
	    fcgi_param_str(params, "QUERY_STRING", q ? q + 1 : "") < 0 ||
	    fcgi_param_str(params, "REQUEST_ID", request_id) < 0 ||
	    fcgi_param_str(params, "HTTP_HOST", "localhost") < 0)
		return -1;
	if (body) {
		snprintf(clen, sizeof(clen), "%zu", body_len);
		if (fcgi_param_str(params, "CONTENT_LENGTH", clen) < 0)
			return -1;
	}
	for (size_t i = 0; headers && headers[i]; i++)
		if (fcgi_header_param(params, headers[i]) < 0)
			return -1;
	return 0;
}

/* Collect FCGI_STDOUT content; fail unless FCGI_END_REQUEST arrived. */
static int fcgi_unwrap(const struct buf *in, struct buf *out)
{
	const unsigned char *p = (const unsigned char *)in->data;
	size_t left = in->len;

	while (left >= 8) {
		size_t clen = ((size_t)p[4] << 8) | p[5];
		size_t total = 8 + clen + p[6];

		if (left < total)
			break;
		if (p[1] == FCGI_END_REQUEST)
			return out->data ? 0 : buf_append(out, "", 0);
		if (p[1] == FCGI_STDOUT && buf_append(out, p + 8, clen) < 0)
			return -1;
		p += total;
		left -= total;
	}
	http_set_error("FastCGI connection closed without FCGI_END_REQUEST "
	               "(%zu bytes received)",
	               in->len);
	return -1;
}

/* Parse CGI output ("Status: 201 Created" + headers + body). */
static int cgi_parse(const struct buf *out, struct http_response *r)
{
	const char *p = out->data, *end = out->data + out->len;

	r->status = 200;
	for (;;) {
		const char *eol = memchr(p, '\n', (size_t)(end - p));
		size_t len;

		if (!eol) {
			http_set_error("no end of CGI headers: %.*s",
			               (int)(out->len > 200 ? 200 : out->len), out->data);
			return -1;
		}
		len = (size_t)(eol - p);
		if (len && p[len - 1] == '\r')
			len--;
		if (len == 0) {
			p = eol + 1;
			break;
		}
		if (len > 7 && strncasecmp(p, "Status:", 7) == 0) {
			/* nginx turns this into the status line and drops it */
			r->status = atoi(p + 7);
		} else if (header_parse_line(r, p, len) < 0) {
			return -1;
		}
		p = eol + 1;
	}
	return body_set(r, p, (size_t)(end - p));
}

struct http_response *http_fcgi_request(const char *socket_path, const char *method,
                                        const char *path, const char *const *headers,
                                        const void *body, size_t body_len)
{
	static const unsigned char begin[8] = { 0, FCGI_RESPONDER, 0 };
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct http_response *r = NULL;
	struct buf req = { 0 }, params = { 0 }, in = { 0 }, out = { 0 };
	unsigned char rnd[16];
	char request_id[33];
	int fd = -1;

	if (strlen(socket_path) >= sizeof(sa.sun_path)) {
		http_set_error("socket path too long: %s", socket_path);
		return NULL;
	}
	strcpy(sa.sun_path, socket_path);
	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
		http_set_error("getrandom: %s", strerror(errno));
		return NULL;
	}
	for (size_t i = 0; i < sizeof(rnd); i++)
		snprintf(request_id + 2 * i, 3, "%02x", rnd[i]);

	if (fcgi_params(&params, method, path, headers, body, body_len, request_id) < 0 ||
	    fcgi_record(&req, FCGI_BEGIN_REQUEST, begin, sizeof(begin)) < 0 ||
	    fcgi_stream(&req, FCGI_PARAMS, params.data, params.len) < 0 ||
	    fcgi_stream(&req, FCGI_STDIN, body ? body : "", body ? body_len : 0) < 0)
		goto out;

	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		http_set_error("socket: %s", strerror(errno));
		goto out;
	}
	socket_set_timeouts(fd);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		http_set_error("connect %s: %s", socket_path, strerror(errno));
		goto out;
	}
	if (send_all(fd, req.data, req.len) < 0 || recv_all(fd, &in) < 0 ||
	    fcgi_unwrap(&in, &out) < 0)
		goto out;
	r = calloc(1, sizeof(*r));
	if (!r) {
		http_set_error("out of memory");
		goto out;
	}
	if (cgi_parse(&out, r) < 0 || header_add(r, "X-Request-Id", 12, request_id, 32) < 0) {
		http_response_free(r);
		r = NULL;
	}
out:
	if (fd >= 0)
		close(fd);
	free(req.data);
	free(params.data);
	free(in.data);
	free(out.data);
	return r;
}

/* --- Accessors --------------------------------------------------------- */

const char *http_header(const struct http_response *resp, const char *name)
{
	for (size_t i = 0; resp && i < resp->header_count; i++)
		if (strcasecmp(resp->headers[i].name, name) == 0)
			return resp->headers[i].value;
	return NULL;
}

size_t http_header_count(const struct http_response *resp, const char *name)
{
	size_t n = 0;

	for (size_t i = 0; resp && i < resp->header_count; i++)
		if (strcasecmp(resp->headers[i].name, name) == 0)
			n++;
	return n;
}

void http_response_free(struct http_response *resp)
{
	if (!resp)
		return;
	headers_clear(resp);
	free(resp->body);
	free(resp);
}
