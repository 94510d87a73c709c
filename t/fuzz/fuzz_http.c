/*
 * fuzz_http.c - request headers: the FastCGI parameters (http_req_init),
 * the Idempotency-Key syntax (idem_key_valid), the bearer token
 * (http_bearer_token, ops_metrics_token_match), the query (http_query_param),
 * and what echoes them back: the
 * problem+json body and the request's log line in both formats.
 *
 * The input is the request's parameters as libfcgi hands them over, one
 * "NAME=value" a line (nginx's HTTP_IDEMPOTENCY_KEY, HTTP_AUTHORIZATION,
 * REQUEST_METHOD, DOCUMENT_URI, QUERY_STRING, CONTENT_TYPE, CONTENT_LENGTH,
 * REQUEST_ID, REMOTE_ADDR). Each line becomes its own allocation of exactly its size,
 * so reading past a parameter is caught.
 */
#include <string.h>
#include <strings.h>

#include "core/canon.h"
#include "core/fp.h"
#include "core/idem.h"
#include "core/log.h"
#include "core/problem.h"
#include "fuzz.h"
#include "server/http.h"
#include "server/ops.h"
#include "server/route.h"

#define MAX_PARAMS 64
#define LINE_MAX_  1024 /* the worker's request line */

/* The Idempotency-Key rule, written again from the README. */
static int key_valid_ref(const char *k)
{
	size_t n = strlen(k);

	if (n < 1 || n > 255)
		return 0;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)k[i] < 0x21 || (unsigned char)k[i] > 0x7e)
			return 0;
	return 1;
}

/* The value of the last NAME= parameter, or NULL. */
static const char *last_param(char **envp, const char *name)
{
	size_t n = strlen(name);
	const char *v = NULL;

	for (char **e = envp; *e; e++)
		if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
			v = *e + n + 1;
	return v;
}

static int count_params(char **envp, const char *name)
{
	size_t n = strlen(name);
	int count = 0;

	for (char **e = envp; *e; e++)
		count += strncmp(*e, name, n) == 0 && (*e)[n] == '=';
	return count;
}

static int is_ascii(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s >= 0x80)
			return 0;
	return 1;
}

/* A problem body that echoes the request is strict JSON, and its instance
 * is the path with anything but printable ASCII as '?'. */
static void check_problem(const struct http_req *r)
{
	struct buf b = BUF_INIT;
	struct json_object *v, *inst;
	struct err e = { 0 };
	char want[512];
	size_t n;

	problem_write(&b, P_INVALID_KEY, "detail", r->path, r->request_id, "idempotency_key",
	              r->idem_key);
	FUZZ_CHECK(!b.oom, "out of memory");
	v = canon_parse(b.data, b.len, 8, &e);
	FUZZ_CHECK(v != NULL && json_object_is_type(v, json_type_object), "%s: %s", e.msg, b.data);
	for (n = 0; r->path[n] && n < sizeof(want) - 1; n++) {
		unsigned char c = (unsigned char)r->path[n];
		want[n] = c >= 0x20 && c < 0x7f ? (char)c : '?';
	}
	want[n] = '\0';
	FUZZ_CHECK(json_object_object_get_ex(v, "instance", &inst) &&
	               strcmp(json_object_get_string(inst), want) == 0,
	           "instance of %s", b.data);
	json_object_put(v);
	buf_free(&b);
}

/* What log_kv makes of value once read back: the value itself, every
 * control byte escaped in the line and unescaped in its JSON form. */
static void logged(char *out, size_t cap, const char *value)
{
	size_t n = strlen(value) < cap - 1 ? strlen(value) : cap - 1;

	memcpy(out, value, n);
	out[n] = '\0';
}

/* The member name of the JSON log line holds exactly want (when a string). */
static void check_member(struct json_object *v, const char *name, const char *value)
{
	struct json_object *m;
	char want[LINE_MAX_];

	FUZZ_CHECK(json_object_object_get_ex(v, name, &m), "no member %s", name);
	if (!is_ascii(value) || !json_object_is_type(m, json_type_string))
		return;
	logged(want, sizeof(want), value);
	FUZZ_CHECK(strcmp(json_object_get_string(m), want) == 0, "%s: \"%s\", logged \"%s\"", name,
	           value, json_object_get_string(m));
}

/*
 * The worker's request line (worker.c, log_request), and its JSON form: a
 * client's method, path, request id or key must never end a field early,
 * add a field, or make the JSON line invalid.
 */
static void check_log_line(const struct http_req *r, int status)
{
	static char json[6 * LINE_MAX_ + 16];
	char line[LINE_MAX_], num[48];
	size_t n = 0, jn;
	struct json_object *v, *m;
	struct err e = { 0 };

	log_kv(line, sizeof(line), &n, "request_id", r->request_id);
	log_kv(line, sizeof(line), &n, "method", r->method);
	log_kv(line, sizeof(line), &n, "path", r->path);
	log_kv(line, sizeof(line), &n, "route", route_name(route_match(r->path, NULL, NULL)));
	snprintf(num, sizeof(num), "%d", status);
	log_kv(line, sizeof(line), &n, "status", num);
	log_kv(line, sizeof(line), &n, "tenant", "0");
	if (r->idem_key != NULL) {
		uint8_t h[FP_LEN];
		char hex[2 * FP_LEN + 1];
		fp_token(h, r->idem_key, strlen(r->idem_key));
		fp_hex(hex, h, FP_LEN);
		hex[12] = '\0';
		log_kv(line, sizeof(line), &n, "key_fp", hex);
	}
	log_kv(line, sizeof(line), &n, "duration_ms", "0.125");
	FUZZ_CHECK(n < sizeof(line) && strlen(line) == n, "length %zu", n);

	jn = log_json_from_logfmt(line, json, sizeof(json) - 1);
	FUZZ_CHECK(jn < sizeof(json) && strlen(json) == jn, "json length %zu", jn);
	v = canon_parse(json, jn, 8, &e);
	FUZZ_CHECK(v != NULL && json_object_is_type(v, json_type_object), "%s: %s -> %s", e.msg,
	           line, json);
	/* Cut short only when the client sent more than a line holds. */
	if (n + 1 < sizeof(line) - 64) {
		check_member(v, "request_id", r->request_id);
		check_member(v, "method", r->method);
		check_member(v, "path", r->path);
		FUZZ_CHECK(json_object_object_get_ex(v, "status", &m) &&
		               json_object_is_type(m, json_type_int) &&
		               json_object_get_int(m) == status,
		           "status in %s", json);
		FUZZ_CHECK(json_object_object_get_ex(v, "duration_ms", &m) &&
		               json_object_is_type(m, json_type_double),
		           "duration_ms in %s", json);
		FUZZ_CHECK(json_object_object_length(v) == 7 + (r->idem_key != NULL),
		           "%d members in %s", json_object_object_length(v), json);
	}
	json_object_put(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *envp[MAX_PARAMS + 1];
	size_t nenv = 0, start = 0;
	FCGX_Request f;
	struct http_req r;
	const char *v, *tok;

	/* One parameter a line; NUL ends a C string, as in libfcgi's envp. */
	for (size_t i = 0; i <= size && nenv < MAX_PARAMS; i++) {
		if (i < size && data[i] != '\n')
			continue;
		size_t len = strnlen((const char *)data + start, i - start);
		envp[nenv] = malloc(len + 1);
		FUZZ_CHECK(envp[nenv] != NULL, "out of memory");
		memcpy(envp[nenv], data + start, len);
		envp[nenv++][len] = '\0';
		start = i + 1;
	}
	envp[nenv] = NULL;

	memset(&f, 0, sizeof(f));
	f.envp = envp;
	http_req_init(&r, &f);

	FUZZ_CHECK(r.fcgi == &f, "fcgi");
	FUZZ_CHECK(r.method && r.path && r.request_id && r.remote_addr, "a NULL field");
	v = last_param(envp, "REQUEST_METHOD");
	FUZZ_CHECK(strcmp(r.method, v ? v : "") == 0, "method");
	v = last_param(envp, "DOCUMENT_URI");
	FUZZ_CHECK(strcmp(r.path, v ? v : "") == 0, "path");
	FUZZ_CHECK(r.idem_key_count == count_params(envp, "HTTP_IDEMPOTENCY_KEY"), "key count %d",
	           r.idem_key_count);
	if (r.idem_key_count > 0) {
		/* The first key header is the one used (several are refused). */
		size_t n = strlen("HTTP_IDEMPOTENCY_KEY=");
		char **e = envp;
		while (strncmp(*e, "HTTP_IDEMPOTENCY_KEY=", n) != 0)
			e++;
		FUZZ_CHECK(r.idem_key_raw == *e + n, "not the first key");
		FUZZ_CHECK(r.idem_key == r.idem_key_buf, "the key is not the parsed one");
		FUZZ_CHECK(idem_key_valid(r.idem_key) == key_valid_ref(r.idem_key),
		           "idem_key_valid(\"%s\")", r.idem_key);
	} else {
		FUZZ_CHECK(r.idem_key == NULL && r.idem_key_raw == NULL, "a key from nowhere");
	}
	v = last_param(envp, "CONTENT_LENGTH");
	if (r.content_length >= 0) {
		FUZZ_CHECK(v != NULL && strtol(v, NULL, 10) == r.content_length,
		           "CONTENT_LENGTH %s read as %ld", v ? v : "(none)", r.content_length);
	} else if (v != NULL && *v && strlen(v) < 19 && strspn(v, "0123456789") == strlen(v)) {
		FUZZ_CHECK(0, "CONTENT_LENGTH %s refused", v);
	}
	v = last_param(envp, "CONTENT_TYPE");
	FUZZ_CHECK(r.content_type == (v && *v ? v : NULL), "content type");
	(void)http_is_json(r.content_type);

	tok = http_bearer_token(r.authorization);
	if (tok != NULL) {
		FUZZ_CHECK(strncasecmp(r.authorization, "bearer ", 7) == 0, "scheme");
		FUZZ_CHECK(tok >= r.authorization + 7 &&
		               tok <= r.authorization + strlen(r.authorization),
		           "token outside the header");
		FUZZ_CHECK(*tok != ' ', "token starts with a space");
		FUZZ_CHECK(ops_metrics_token_match(tok[0] ? tok : "x", r.authorization) ==
		               (tok[0] != 0),
		           "the metrics token does not match itself");
	}
	FUZZ_CHECK(!ops_metrics_token_match("", r.authorization), "an empty metrics token matched");

	/* The query of GET /v1/workflows and .../events: a decoded value
	 * fits its buffer, holds no NUL, and is never longer than the text. */
	static const char *const qnames[] = { "state", "type", "after", "limit" };
	for (size_t i = 0; i < sizeof(qnames) / sizeof(qnames[0]); i++) {
		char qv[64];
		int qr = http_query_param(r.query, qnames[i], qv, sizeof(qv));
		FUZZ_CHECK(qr >= -1 && qr <= 1, "http_query_param returned %d", qr);
		if (qr == 1)
			FUZZ_CHECK(strlen(qv) <= strlen(r.query),
			           "decoded %s longer than the query", qnames[i]);
	}

	check_problem(&r);
	check_log_line(&r, 400);

	for (size_t i = 0; i < nenv; i++)
		free(envp[i]);
	return 0;
}
