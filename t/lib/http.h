/*
 * Minimal HTTP/1.1 (and FastCGI) client for the end-to-end tests.
 *
 * The tests assert on exact status codes, header values and body bytes, so
 * this client sends exactly what it is given (plus Host, Connection: close
 * and, when there is a body, Content-Length) and hands back the response
 * without any interpretation beyond de-chunking.
 *
 * The functions never call Criterion assertions: they may run on worker
 * threads.  On a transport failure they return NULL and http_error() tells
 * why (per thread).
 */
#ifndef IDEMFLOW_T_HTTP_H
#define IDEMFLOW_T_HTTP_H

#include <stddef.h>

struct http_field {
	char *name;
	char *value;
};

struct http_response {
	int status;
	struct http_field *headers;
	size_t header_count;
	/* Always NUL-terminated so it can be used as a C string; body_len
	 * excludes the terminator and is the real length. */
	char *body;
	size_t body_len;
};

/*
 * Send one request to IDEMFLOW_HOST:IDEMFLOW_PORT and read the response to
 * EOF.  headers is a NULL-terminated list of complete "Name: value" lines
 * (no CRLF), or NULL.  body may be NULL (no Content-Length is sent) or any
 * bytes, including an empty body (Content-Length: 0).
 */
struct http_response *http_request(const char *method, const char *path, const char *const *headers,
                                   const void *body, size_t body_len);

/* Send hand-made request bytes verbatim and read the response to EOF. */
struct http_response *http_send_raw(const void *bytes, size_t len);

/*
 * Send one request straight to a FastCGI responder listening on a unix
 * socket, with the parameters nginx's fastcgi_params would pass.  nginx
 * also adds X-Request-Id to every response; the generated REQUEST_ID is
 * mirrored into the response as that header so callers can treat both
 * transports alike.
 */
struct http_response *http_fcgi_request(const char *socket_path, const char *method,
                                        const char *path, const char *const *headers,
                                        const void *body, size_t body_len);

/* First value of a header, case-insensitive name; NULL when absent. */
const char *http_header(const struct http_response *resp, const char *name);

/* How many times a header occurs (to catch duplicated headers). */
size_t http_header_count(const struct http_response *resp, const char *name);

void http_response_free(struct http_response *resp);

/* Why the last call on this thread returned NULL. */
const char *http_error(void);

#endif
