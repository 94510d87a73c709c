/* http.c - reading a FastCGI request, writing its answer (see http.h). */
#include "server/http.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* name=value in envp: returns value when the name matches exactly. */
static const char *param(const char *env, const char *name, size_t nlen)
{
	return strncmp(env, name, nlen) == 0 && env[nlen] == '=' ? env + nlen + 1 : NULL;
}

#define PARAM(env, lit) param((env), (lit), sizeof(lit) - 1)

void http_req_init(struct http_req *r, FCGX_Request *f)
{
	const char *v, *cl = NULL;

	memset(r, 0, sizeof(*r));
	r->fcgi = f;
	r->method = "";
	r->path = "";
	r->query = "";
	r->request_id = "";
	r->remote_addr = "";
	r->content_length = -1;
	for (char **e = f->envp; e && *e; e++) {
		const char *env = *e;
		if (env[0] == 'H') {
			if ((v = PARAM(env, "HTTP_IDEMPOTENCY_KEY")) != NULL) {
				if (r->idem_key_count++ == 0)
					r->idem_key_raw = v;
			} else if ((v = PARAM(env, "HTTP_AUTHORIZATION")) != NULL) {
				r->authorization = v;
			}
		} else if ((v = PARAM(env, "REQUEST_METHOD")) != NULL) {
			r->method = v;
		} else if ((v = PARAM(env, "DOCUMENT_URI")) != NULL) {
			r->path = v;
		} else if ((v = PARAM(env, "QUERY_STRING")) != NULL) {
			r->query = v;
		} else if ((v = PARAM(env, "CONTENT_TYPE")) != NULL) {
			r->content_type = *v ? v : NULL;
		} else if ((v = PARAM(env, "CONTENT_LENGTH")) != NULL) {
			cl = v;
		} else if ((v = PARAM(env, "REQUEST_ID")) != NULL) {
			r->request_id = v;
		} else if ((v = PARAM(env, "REMOTE_ADDR")) != NULL) {
			r->remote_addr = v;
		}
	}
	if (r->idem_key_raw != NULL) {
		/* A malformed value leaves "": idem_key_valid() refuses it,
		 * so the request gets 400 invalid-idempotency-key. */
		(void)idem_key_parse(r->idem_key_raw, r->idem_key_buf);
		r->idem_key = r->idem_key_buf;
	}
	if (cl != NULL && *cl) {
		char *end;
		errno = 0;
		long n = strtol(cl, &end, 10);
		if (errno == 0 && *end == '\0' && n >= 0)
			r->content_length = n;
	}
}

enum http_body_result http_read_body(struct http_req *r, long max, struct buf *out)
{
	char chunk[16384];
	size_t want;

	if (r->content_length > max)
		return HTTP_BODY_TOO_LARGE;
	want = r->content_length < 0 ? 0 : (size_t)r->content_length;
	while (out->len < want && !out->oom) {
		size_t left = want - out->len;
		int n = FCGX_GetStr(chunk, (int)(left < sizeof(chunk) ? left : sizeof(chunk)),
		                    r->fcgi->in);
		if (n <= 0)
			return HTTP_BODY_SHORT;
		buf_append(out, chunk, (size_t)n);
	}
	return out->oom ? HTTP_BODY_TOO_LARGE : HTTP_BODY_OK;
}

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c = tolower(c);
	return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

int http_query_param(const char *query, const char *name, char *out, size_t outlen)
{
	size_t nlen = strlen(name);
	const char *p = query;

	while (p != NULL && *p) {
		if (strncmp(p, name, nlen) == 0 && p[nlen] == '=') {
			size_t n = 0;
			for (p += nlen + 1; *p && *p != '&'; p++) {
				int c = (unsigned char)*p;
				if (c == '+') {
					c = ' ';
				} else if (c == '%') {
					int hi = hexval((unsigned char)p[1]);
					int lo = hi < 0 ? -1 : hexval((unsigned char)p[2]);
					if (lo < 0)
						return -1;
					c = hi * 16 + lo;
					p += 2;
				}
				if (c == 0 || n + 1 >= outlen)
					return -1;
				out[n++] = (char)c;
			}
			out[n] = '\0';
			return 1;
		}
		p = strchr(p, '&');
		if (p != NULL)
			p++;
	}
	return 0;
}

const char *http_bearer_token(const char *authorization)
{
	const char *tok;

	if (authorization == NULL || strncasecmp(authorization, "Bearer ", 7) != 0)
		return NULL;
	for (tok = authorization + 7; *tok == ' '; tok++)
		;
	return tok;
}

int http_is_json(const char *ct)
{
	static const char json[] = "application/json";
	size_t n = sizeof(json) - 1;

	if (ct == NULL || strncasecmp(ct, json, n) != 0)
		return 0;
	ct += n;
	while (*ct == ' ' || *ct == '\t')
		ct++;
	return *ct == '\0' || *ct == ';';
}

void http_resp_reset(struct http_resp *resp)
{
	resp->status = 500;
	resp->content_type = NULL;
	buf_reset(&resp->headers);
	buf_reset(&resp->body);
}

void http_resp_free(struct http_resp *resp)
{
	buf_free(&resp->headers);
	buf_free(&resp->body);
}

void http_resp_shrink(struct http_resp *resp, size_t keep)
{
	buf_shrink(&resp->headers, keep);
	buf_shrink(&resp->body, keep);
}

void http_resp_header(struct http_resp *resp, const char *name, const char *value)
{
	buf_puts(&resp->headers, name);
	buf_puts(&resp->headers, ": ");
	buf_puts(&resp->headers, value);
	buf_puts(&resp->headers, "\r\n");
}

const char *http_reason(int status)
{
	switch (status) {
	case 200: return "OK";
	case 201: return "Created";
	case 202: return "Accepted";
	case 204: return "No Content";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 409: return "Conflict";
	case 413: return "Content Too Large";
	case 415: return "Unsupported Media Type";
	case 422: return "Unprocessable Content";
	case 500: return "Internal Server Error";
	case 503: return "Service Unavailable";
	default: return "Unknown";
	}
}

/* FCGX_PutStr takes an int: write len bytes in pieces that fit one. */
static int put_all(FCGX_Request *f, const char *p, size_t len)
{
	while (len > 0) {
		size_t n = len < (size_t)1 << 20 ? len : (size_t)1 << 20;
		if (FCGX_PutStr(p, (int)n, f->out) < 0)
			return -1;
		p += n;
		len -= n;
	}
	return 0;
}

int http_send(FCGX_Request *f, const struct http_resp *resp)
{
	char num[24], *p = num + sizeof(num);
	size_t len = resp->body.len;
	const char *reason = http_reason(resp->status);
	int st = resp->status;

	/* "Status: NNN Reason", Content-Type, Content-Length: put straight
	 * into libfcgi's buffer (no printf on every answer). */
	char status[] = { 'S',
		          't',
		          'a',
		          't',
		          'u',
		          's',
		          ':',
		          ' ',
		          (char)('0' + st / 100 % 10),
		          (char)('0' + st / 10 % 10),
		          (char)('0' + st % 10),
		          ' ' };
	if (FCGX_PutStr(status, (int)sizeof(status), f->out) < 0 || FCGX_PutS(reason, f->out) < 0 ||
	    FCGX_PutStr("\r\n", 2, f->out) < 0)
		return -1;
	if (resp->content_type != NULL &&
	    (FCGX_PutS("Content-Type: ", f->out) < 0 || FCGX_PutS(resp->content_type, f->out) < 0 ||
	     FCGX_PutStr("\r\n", 2, f->out) < 0))
		return -1;
	p = buf_utoa(p, len);
	if (FCGX_PutS("Content-Length: ", f->out) < 0 ||
	    FCGX_PutStr(p, (int)(num + sizeof(num) - p), f->out) < 0 ||
	    FCGX_PutStr("\r\n", 2, f->out) < 0)
		return -1;
	if (put_all(f, resp->headers.data, resp->headers.len) < 0 ||
	    FCGX_PutStr("\r\n", 2, f->out) < 0)
		return -1;
	return put_all(f, resp->body.data, resp->body.len);
}
