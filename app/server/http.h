/*
 * http.h - the HTTP view of one FastCGI request, and writing its answer.
 *
 * Knows FastCGI and HTTP, nothing about routes or the database. Parameters
 * are read from the request's environment in one pass; strings point into
 * libfcgi's request memory and live until FCGX_Finish_r().
 */
#ifndef IDF_HTTP_H
#define IDF_HTTP_H

#include <fcgiapp.h>

#include "core/buf.h"
#include "core/err.h"
#include "core/idem.h"

struct http_req {
	FCGX_Request *fcgi;       /* borrowed */
	const char *method;       /* REQUEST_METHOD */
	const char *path;         /* DOCUMENT_URI: decoded, no query string */
	const char *query;        /* QUERY_STRING, still encoded, or "" */
	const char *content_type; /* NULL when absent */
	const char *authorization;
	const char *idem_key;                /* the key the first Idempotency-Key header names
	                                      * (idem_key_parse: "abc" and abc are both abc),
	                                      * "" when its quoting is malformed, or NULL */
	const char *idem_key_raw;            /* that header's value as sent, or NULL */
	int idem_key_count;                  /* how many Idempotency-Key headers came */
	const char *request_id;              /* nginx $request_id, or "" */
	const char *remote_addr;             /* REMOTE_ADDR: the client as nginx saw it, or "" */
	long content_length;                 /* -1 when absent or unparsable */
	char idem_key_buf[IDEM_KEY_MAX + 1]; /* idem_key points here: the struct is
	                                      * not to be copied */
};

/* A response being built. Reused across requests: http_resp_reset(). */
struct http_resp {
	int status;
	const char *content_type; /* static string, or NULL for no body */
	struct buf headers;       /* extra "Name: value\r\n" lines */
	struct buf body;
};

/* Fill r from the request f. */
void http_req_init(struct http_req *r, FCGX_Request *f);

enum http_body_result { HTTP_BODY_OK, HTTP_BODY_TOO_LARGE, HTTP_BODY_SHORT };

/* Read the request body (up to max bytes) into out. */
enum http_body_result http_read_body(struct http_req *r, long max, struct buf *out);

/*
 * Find name in an encoded query string ("a=1&b=x%20y") and decode its
 * first value into out (NUL-terminated). Returns 1 when found, 0 when
 * absent, -1 when the value is longer than outlen - 1 bytes or holds a
 * bad %-escape or a NUL.
 */
int http_query_param(const char *query, const char *name, char *out, size_t outlen);

/* The token of an Authorization value "Bearer <token>" (scheme in any
 * case, spaces before the token skipped), pointing into authorization; ""
 * when only spaces follow the scheme; NULL when the value is absent or of
 * another scheme. */
const char *http_bearer_token(const char *authorization);

/* 1 when the Content-Type is application/json (parameters allowed). */
int http_is_json(const char *content_type);

void http_resp_reset(struct http_resp *resp);
void http_resp_free(struct http_resp *resp);
/* Empty resp, giving back buffers of more than keep bytes (buf_shrink). */
void http_resp_shrink(struct http_resp *resp, size_t keep);
/* Append one "Name: value" header line. */
void http_resp_header(struct http_resp *resp, const char *name, const char *value);

/* Write resp to the client. Returns 0, or -1 when the client has gone. */
int http_send(FCGX_Request *f, const struct http_resp *resp);

/* The reason phrase for a status code ("Created"). */
const char *http_reason(int status);

#endif
