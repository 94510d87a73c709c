/*
 * test_hostile.c - hostile HTTP input, through the real nginx to the real
 * workers (the stack of t/run-test: 3 workers, nginx/idemflow-local.conf.in).
 *
 * Every case proves three things: the exact answer (the app's problem+json,
 * or nginx's own status where nginx answers first), the tenant's rows
 * unchanged, and the worker pool intact afterwards (the same worker pids,
 * and a normal create still works). Criterion runs the tests in parallel,
 * each in a tenant of its own; none of them kills a worker.
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "http.h"
#include "tapi.h"
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

#define COLLECTION  "/v1/workflows"
#define JSON_CT     "Content-Type: application/json"
#define MAX_WORKERS 64

static const char MIN_BODY[] = "{\"type\":\"x\",\"input\":{}}";

TestSuite(hostile, .timeout = 90);

/* --- Helpers ----------------------------------------------------------- */

/* The worker pool as it was when a test began. */
struct pool {
	pid_t sup;
	pid_t pids[MAX_WORKERS];
	size_t n;
};

static int pid_cmp(const void *a, const void *b)
{
	pid_t x = *(const pid_t *)a, y = *(const pid_t *)b;

	return (x > y) - (x < y);
}

static void pool_snapshot(struct pool *p)
{
	p->sup = tstack_supervisor_pid();
	cr_assert(tstack_wait_workers(p->sup, (size_t)tstack_conf_long("workers", 8), 5000),
	          "the pool is not complete before the test");
	p->n = tstack_workers(p->sup, p->pids, MAX_WORKERS);
	qsort(p->pids, p->n, sizeof(p->pids[0]), pid_cmp);
}

static struct http_response *post_key(const struct tstack_tenant *t, const char *key,
                                      const char *body, size_t len)
{
	char kh[512];
	struct http_response *r;

	snprintf(kh, sizeof(kh), "Idempotency-Key: %s", key);
	const char *h[] = { t->auth, JSON_CT, kh, NULL };
	r = http_request("POST", COLLECTION, h, body, len);
	cr_assert_not_null(r, "POST: %s", http_error());
	return r;
}

static struct http_response *post(const struct tstack_tenant *t, const char *body, size_t len)
{
	char key[128];

	tstack_key(key, sizeof(key), "hostile");
	return post_key(t, key, body, len);
}

/*
 * The pool survived: the same workers as at the start (none died and was
 * replaced), and each still serves, proved by a normal create; the tenant
 * then has exactly `created` + 1 workflows.
 */
static void expect_pool_intact(const struct pool *before, const struct tstack_tenant *t,
                               long created)
{
	struct pool now;
	struct http_response *r;
	char *id;

	now.n = tstack_workers(before->sup, now.pids, MAX_WORKERS);
	qsort(now.pids, now.n, sizeof(now.pids[0]), pid_cmp);
	cr_assert_eq(now.n, before->n, "%zu workers, %zu before", now.n, before->n);
	for (size_t i = 0; i < now.n; i++)
		cr_assert_eq(now.pids[i], before->pids[i], "worker %ld is gone, %ld is new",
		             (long)before->pids[i], (long)now.pids[i]);
	for (size_t i = 0; i < now.n; i++) {
		r = post(t, MIN_BODY, strlen(MIN_BODY));
		id = tstack_expect_created(r, "x", "{}");
		free(id);
		http_response_free(r);
	}
	tstack_expect_counts(t, created + (long)now.n, created + (long)now.n,
	                     created + (long)now.n);
}

/* A body {"type":"x","input":<input>} in malloc'ed memory. */
static char *body_with_input(const char *input, size_t *len)
{
	char *b;
	int n = asprintf(&b, "{\"type\":\"x\",\"input\":%s}", input);

	cr_assert(n > 0);
	*len = (size_t)n;
	return b;
}

/* A raw request: the whole request line and headers are the caller's. */
static struct http_response *raw(const char *bytes, size_t len)
{
	struct http_response *r = http_send_raw(bytes, len);

	cr_assert_not_null(r, "raw request: %s", http_error());
	return r;
}

/* Seconds of an nginx directive ("client_body_timeout") in the running
 * configuration, which t/run-test rendered from the template. */
static double nginx_seconds(const char *directive)
{
	char path[1024], line[512];
	FILE *f;
	double v = -1;

	snprintf(path, sizeof(path), "%s/nginx/nginx.conf", tstack_env("IDEMFLOW_STACK_DIR"));
	f = fopen(path, "r");
	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		char name[64], unit[8] = "";
		double n;
		if (sscanf(line, " %63s %lf%7[a-z];", name, &n, unit) >= 2 &&
		    strcmp(name, directive) == 0)
			v = strcmp(unit, "ms") == 0  ? n / 1000
			    : strcmp(unit, "m") == 0 ? n * 60
			                             : n;
	}
	fclose(f);
	cr_assert(v > 0, "no %s in %s", directive, path);
	return v;
}

/* A TCP connection to nginx, for requests that are sent slowly or never
 * finished (http.h sends whole requests only). */
static int tcp_open(void)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai;
	int fd, rc;

	rc = getaddrinfo(tstack_env("IDEMFLOW_HOST"), tstack_env("IDEMFLOW_PORT"), &hints, &ai);
	cr_assert_eq(rc, 0, "getaddrinfo: %s", gai_strerror(rc));
	fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
	cr_assert(fd >= 0, "socket: %s", strerror(errno));
	cr_assert_eq(connect(fd, ai->ai_addr, ai->ai_addrlen), 0, "connect: %s", strerror(errno));
	freeaddrinfo(ai);
	return fd;
}

static void send_str(int fd, const char *s)
{
	size_t len = strlen(s);

	cr_assert_eq(send(fd, s, len, MSG_NOSIGNAL), (ssize_t)len, "send: %s", strerror(errno));
}

/* Wait up to limit seconds for nginx to close fd; the seconds it took, or
 * -1 when it is still open. *got counts the bytes it sent meanwhile. */
static double wait_closed(int fd, double t0, double limit, size_t *got)
{
	char buf[4096];

	*got = 0;
	for (;;) {
		double left = t0 + limit - tstack_now();
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (left <= 0)
			return -1;
		if (poll(&p, 1, (int)(left * 1000) + 1) <= 0)
			continue;
		ssize_t n = recv(fd, buf, sizeof(buf), 0);
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return tstack_now() - t0;
		if (n > 0)
			*got += (size_t)n;
	}
}

/* --- Sizes ------------------------------------------------------------- */

Test(hostile, ten_megabyte_bodies_are_refused_by_nginx_before_any_worker)
{
	const size_t big = 10u << 20;
	struct tstack_tenant t;
	struct pool pool;
	struct http_response *r;
	char *body, *req, key[128], kh[160];
	size_t len, n = 0;

	pool_snapshot(&pool);
	tstack_tenant_create(&t, "tenmb");
	body = malloc(big + 64);
	cr_assert_not_null(body);
	len = (size_t)sprintf(body, "{\"type\":\"x\",\"input\":{\"p\":\"");
	memset(body + len, 'a', big);
	len += big;
	len += (size_t)sprintf(body + len, "\"}}");

	/* Declared in Content-Length: refused before the body is read. */
	r = post(&t, body, len);
	tstack_expect_problem(r, 413, "/problems/body-too-large", COLLECTION);
	cr_assert_not_null(strstr(r->body, "larger than this server accepts"),
	                   "nginx's own 413, not the app's: %s", r->body);
	http_response_free(r);

	/* Chunked, so nginx only learns the size while reading. */
	tstack_key(key, sizeof(key), "chunked");
	snprintf(kh, sizeof(kh), "Idempotency-Key: %s", key);
	req = malloc(len + len / 1000 + 4096);
	cr_assert_not_null(req);
	n = (size_t)sprintf(req,
	                    "POST " COLLECTION " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n"
	                    "%s\r\n%s\r\nTransfer-Encoding: chunked\r\n\r\n",
	                    t.auth, JSON_CT, kh);
	for (size_t off = 0; off < len; off += 65536) {
		size_t c = len - off < 65536 ? len - off : 65536;
		n += (size_t)sprintf(req + n, "%zx\r\n", c);
		memcpy(req + n, body + off, c);
		n += c;
		memcpy(req + n, "\r\n", 2);
		n += 2;
	}
	n += (size_t)sprintf(req + n, "0\r\n\r\n");
	r = raw(req, n);
	tstack_expect_problem(r, 413, "/problems/body-too-large", COLLECTION);
	http_response_free(r);

	/* 1.5 MiB passes nginx (2 MiB) and meets the app's max_body with a
	 * bad token: the worker answers 401 without reading the body, and
	 * nginx still delivers that answer (not a 502 turned into 503). */
	const char *bad[] = { "Authorization: Bearer idf_nobody", JSON_CT, kh, NULL };
	r = http_request("POST", COLLECTION, bad, body, (size_t)1536 * 1024);
	cr_assert_not_null(r, "%s", http_error());
	tstack_expect_problem(r, 401, "/problems/unauthorized", COLLECTION);
	http_response_free(r);

	tstack_expect_counts(&t, 0, 0, 0);
	free(req);
	free(body);
	expect_pool_intact(&pool, &t, 0);
}

/* --- Content-Length that lies ------------------------------------------ */

Test(hostile, a_content_length_shorter_than_the_body_cuts_the_json_short)
{
	struct tstack_tenant t;
	struct pool pool;
	struct http_response *r;
	char req[1024], key[128];
	size_t n;

	pool_snapshot(&pool);
	tstack_tenant_create(&t, "clshort");
	tstack_key(key, sizeof(key), "clshort");
	/* 5 bytes fewer than the body: nginx passes exactly Content-Length
	 * bytes, and the rest is not a second request (Connection: close). */
	n = (size_t)snprintf(req, sizeof(req),
	                     "POST " COLLECTION " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
	                     "%s\r\n" JSON_CT
	                     "\r\nIdempotency-Key: %s\r\nContent-Length: %zu\r\n\r\n%s",
	                     t.auth, key, strlen(MIN_BODY) - 5, MIN_BODY);
	r = raw(req, n);
	tstack_expect_problem(r, 400, "/problems/invalid-json", COLLECTION);
	char *detail = tstack_json(r->body, "{detail}");
	cr_assert_str_eq(detail, "the body is not valid JSON: unexpected end of data at byte 18");
	free(detail);
	http_response_free(r);
	tstack_expect_counts(&t, 0, 0, 0);

	/* Not a number at all: nginx's own 400, as problem+json. */
	n = (size_t)snprintf(req, sizeof(req),
	                     "POST " COLLECTION " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
	                     "%s\r\n" JSON_CT
	                     "\r\nIdempotency-Key: %s\r\nContent-Length: -1\r\n\r\n%s",
	                     t.auth, key, MIN_BODY);
	r = raw(req, n);
	tstack_expect_problem(r, 400, "/problems/bad-request", COLLECTION);
	http_response_free(r);
	tstack_expect_counts(&t, 0, 0, 0);
	expect_pool_intact(&pool, &t, 0);
}

/*
 * Clients that stop sending: a request line and half the headers; the
 * headers and part of a body; and a whole body under a Content-Length 10
 * bytes longer than it. nginx waits for each up to its timeout
 * (client_header_timeout, client_body_timeout), then closes the connection
 * without an answer (a 408 in its access log). No worker was involved, so
 * none was held meanwhile, and nothing was written.
 */
Test(hostile, stalled_headers_and_bodies_are_closed_by_nginx_timeouts)
{
	double header_to = nginx_seconds("client_header_timeout");
	double body_to = nginx_seconds("client_body_timeout");
	struct tstack_tenant t;
	struct pool pool;
	char head[1024], key[128];
	int fds[3];
	double t0, took[3], limit[3];
	size_t got;

	pool_snapshot(&pool);
	tstack_tenant_create(&t, "stall");
	tstack_key(key, sizeof(key), "stall");
	t0 = tstack_now();

	fds[0] = tcp_open();
	send_str(fds[0], "POST " COLLECTION " HTTP/1.1\r\nHost: x\r\n");
	limit[0] = header_to;

	snprintf(head, sizeof(head),
	         "POST " COLLECTION " HTTP/1.1\r\nHost: x\r\n%s\r\n" JSON_CT
	         "\r\nIdempotency-Key: %s\r\nContent-Length: 100\r\n\r\n{\"type\":",
	         t.auth, key);
	fds[1] = tcp_open();
	send_str(fds[1], head);
	limit[1] = body_to;

	snprintf(head, sizeof(head),
	         "POST " COLLECTION " HTTP/1.1\r\nHost: x\r\n%s\r\n" JSON_CT
	         "\r\nIdempotency-Key: %s\r\nContent-Length: %zu\r\n\r\n%s",
	         t.auth, key, strlen(MIN_BODY) + 10, MIN_BODY);
	fds[2] = tcp_open();
	send_str(fds[2], head);
	limit[2] = body_to;

	/* Meanwhile every worker serves others at once. */
	for (int i = 0; i < 6; i++) {
		double s = tstack_now();
		struct http_response *r = http_request("GET", "/healthz", NULL, NULL, 0);
		cr_assert_not_null(r, "%s", http_error());
		cr_assert_eq(r->status, 204);
		cr_assert(tstack_now() - s < 2, "healthz took %.3fs beside stalled clients",
		          tstack_now() - s);
		http_response_free(r);
	}

	for (int i = 0; i < 3; i++) {
		/* Generous above: the machine is shared and timers are coarse. */
		took[i] = wait_closed(fds[i], t0, limit[i] + 5, &got);
		cr_assert(took[i] >= 0, "connection %d still open after %.1fs", i, limit[i] + 5);
		cr_assert(took[i] >= limit[i] - 1,
		          "connection %d closed after %.2fs, before its %.0fs", i, took[i],
		          limit[i]);
		cr_assert_eq(got, 0, "connection %d got %zu bytes of an answer", i, got);
		close(fds[i]);
	}
	cr_log_info("closed after %.2fs (headers), %.2fs (body), %.2fs (Content-Length +10)",
	            took[0], took[1], took[2]);
	tstack_expect_counts(&t, 0, 0, 0);
	expect_pool_intact(&pool, &t, 0);
}

struct trickle {
	int fd;
	volatile int stop;
	int sent;
};

/* Send one byte of a request every 200 ms until told to stop: a slowloris
 * client that never lets client_header_timeout expire. */
static void *trickle_run(void *arg)
{
	static const char req[] = "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: "
	                          "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
	struct trickle *tr = arg;

	for (size_t i = 0; !tr->stop && i < sizeof(req) - 1; i++) {
		if (send(tr->fd, req + i, 1, MSG_NOSIGNAL) != 1)
			break;
		tr->sent++;
		tstack_sleep_ms(200);
	}
	return NULL;
}

Test(hostile, trickling_clients_hold_no_worker)
{
	enum { SLOW = 24 };
	struct trickle tr[SLOW];
	pthread_t th[SLOW];
	struct tstack_tenant t;
	struct pool pool;
	double worst = 0;

	pool_snapshot(&pool);
	tstack_tenant_create(&t, "trickle");
	for (int i = 0; i < SLOW; i++) {
		tr[i] = (struct trickle){ .fd = tcp_open() };
		cr_assert_eq(pthread_create(&th[i], NULL, trickle_run, &tr[i]), 0);
	}
	tstack_sleep_ms(500);
	/* Eight times as many slow clients as workers, and creates still get
	 * their answer at once: nginx holds the slow ones, not the workers. */
	for (int i = 0; i < 10; i++) {
		double s = tstack_now();
		struct http_response *r = post(&t, MIN_BODY, strlen(MIN_BODY));
		char *id = tstack_expect_created(r, "x", "{}");
		double d = tstack_now() - s;
		worst = d > worst ? d : worst;
		free(id);
		http_response_free(r);
	}
	for (int i = 0; i < SLOW; i++) {
		tr[i].stop = 1;
		pthread_join(th[i], NULL);
		cr_assert(tr[i].sent > 0, "slow client %d sent nothing", i);
		close(tr[i].fd);
	}
	cr_log_info("slowest of 10 creates beside %d trickling clients: %.3fs", SLOW, worst);
	cr_assert(worst < 2, "a create took %.3fs beside %d trickling clients", worst, SLOW);
	tstack_expect_counts(&t, 10, 10, 10);
	expect_pool_intact(&pool, &t, 10);
}

/* --- JSON -------------------------------------------------------------- */

Test(hostile, json_nested_100000_deep_is_400)
{
	const size_t depth = 100000;
	struct tstack_tenant t;
	struct pool pool;
	char *in, *body, *detail;
	size_t len;

	pool_snapshot(&pool);
	tstack_tenant_create(&t, "deep");
	/* Arrays, then objects: {"a":{"a":...1...}}. */
	for (int kind = 0; kind < 2; kind++) {
		const char *open = kind ? "{\"a\":" : "[", *close = kind ? "}" : "]";
		size_t ol = strlen(open), n = 0;
		struct http_response *r;
		in = malloc(depth * (ol + 1) + 2);
		cr_assert_not_null(in);
		for (size_t i = 0; i < depth; i++, n += ol)
			memcpy(in + n, open, ol);
		in[n++] = '1';
		memset(in + n, close[0], depth);
		n += depth;
		in[n] = '\0';
		body = body_with_input(in, &len);
		r = post(&t, body, len);
		tstack_expect_problem(r, 400, "/problems/invalid-json", COLLECTION);
		detail = tstack_json(r->body, "{detail}");
		cr_assert_not_null(strstr(detail, "nesting is too deep"), "%s", detail);
		free(detail);
		http_response_free(r);
		free(body);
		free(in);
	}
	tstack_expect_counts(&t, 0, 0, 0);
	expect_pool_intact(&pool, &t, 0);
}

/* Each of these once got past the parser: json-c accepted it and either
 * PostgreSQL refused the row (500) or the stored input was not what was
 * sent. All are the client's mistake: 400, nothing written. */
Test(hostile, invalid_utf8_nul_bytes_and_control_characters_are_400)
{
	static const struct {
		const char *what;
		const char *body;
		size_t len; /* 0: strlen */
	} cases[] = {
		{ "0xFF", "{\"type\":\"x\",\"input\":{\"a\":\"\xff\"}}", 0 },
		{ "cut sequence", "{\"type\":\"x\",\"input\":{\"a\":\"\xe2\x82\"}}", 0 },
		{ "overlong /", "{\"type\":\"x\",\"input\":{\"a\":\"\xc0\xaf\"}}", 0 },
		{ "encoded surrogate", "{\"type\":\"x\",\"input\":{\"a\":\"\xed\xa0\x80\"}}", 0 },
		{ "above U+10FFFF", "{\"type\":\"x\",\"input\":{\"a\":\"\xf4\x90\x80\x80\"}}", 0 },
		{ "bad key", "{\"type\":\"x\",\"input\":{\"\xc3\x28\":1}}", 0 },
		{ "bad type", "{\"type\":\"\xe0\x80\x80\",\"input\":{}}", 0 },
		{ "raw NUL in a value", "{\"type\":\"x\",\"input\":{\"a\":\"b\0c\"}}", 30 },
		{ "raw NUL in a key", "{\"type\":\"x\",\"input\":{\"a\0b\":1}}", 28 },
		{ "raw NUL after the body", "{\"type\":\"x\",\"input\":{}}\0", 24 },
		{ "\\u0000 in a value", "{\"type\":\"x\",\"input\":{\"a\":\"b\\u0000c\"}}", 0 },
		{ "\\u0000 in a key", "{\"type\":\"x\",\"input\":{\"a\\u0000b\":1}}", 0 },
		{ "\\u0000 in type", "{\"type\":\"x\\u0000\",\"input\":{}}", 0 },
		{ "lone surrogate", "{\"type\":\"x\",\"input\":{\"a\":\"\\udc00\"}}", 0 },
		{ "raw control", "{\"type\":\"x\",\"input\":{\"a\":\"\x01\"}}", 0 },
		{ "NaN", "{\"type\":\"x\",\"input\":{\"a\":NaN}}", 0 },
		{ "-01", "{\"type\":\"x\",\"input\":{\"a\":-01}}", 0 },
	};
	struct tstack_tenant t;
	struct pool pool;
	char key[128];

	pool_snapshot(&pool);
	tstack_tenant_create(&t, "bytes");
	/* One key for all: a refused request does not consume it. */
	tstack_key(key, sizeof(key), "bytes");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		size_t len = cases[i].len ? cases[i].len : strlen(cases[i].body);
		struct http_response *r = post_key(&t, key, cases[i].body, len);
		cr_assert_eq(r->status, 400, "%s: %d %s", cases[i].what, r->status, r->body);
		tstack_expect_problem(r, 400, "/problems/invalid-json", COLLECTION);
		http_response_free(r);
		tstack_expect_counts(&t, 0, 0, 0);
	}
	struct http_response *r = post_key(&t, key, MIN_BODY, strlen(MIN_BODY));
	free(tstack_expect_created(r, "x", "{}"));
	http_response_free(r);
	expect_pool_intact(&pool, &t, 1);
}

/*
 * Duplicate keys: the last one wins (json-c's rule), in what is stored and
 * in the fingerprint alike, so {"a":1,"a":2} and {"a":2} are one request
 * (a replay), and {"a":2,"a":1} is another one (a conflict).
 */
Test(hostile, duplicate_keys_last_wins_consistently_with_the_fingerprint)
{
	struct tstack_tenant t;
	struct pool pool;
	struct http_response *first, *r;
	char key[128], *id;
	const char *same[] = {
		"{\"type\":\"x\",\"input\":{\"a\":2}}",
		"{\"type\":\"x\",\"input\":{\"a\":2,\"a\":2}}",
		"{\"type\":\"y\",\"type\":\"x\",\"input\":{\"a\":2}}",
		"{\"type\":\"x\",\"input\":{\"a\":7},\"input\":{\"a\":1,\"a\":2}}",
	};

	pool_snapshot(&pool);
	tstack_tenant_create(&t, "dupkeys");
	tstack_key(key, sizeof(key), "dupkeys");
	const char *dup = "{\"type\":\"x\",\"input\":{\"a\":1,\"a\":2}}";
	first = post_key(&t, key, dup, strlen(dup));
	id = tstack_expect_created(first, "x", "{\"a\":2}");
	cr_assert_eq(tstack_count("SELECT count(*) FROM workflows WHERE tenant_id = $1"
	                          " AND input = '{\"a\":2}'::jsonb",
	                          t.id_text),
	             1, "the stored input is not the last value");
	for (size_t i = 0; i < sizeof(same) / sizeof(same[0]); i++) {
		r = post_key(&t, key, same[i], strlen(same[i]));
		tstack_expect_replay(r, first);
		http_response_free(r);
	}
	const char *other = "{\"type\":\"x\",\"input\":{\"a\":2,\"a\":1}}";
	r = post_key(&t, key, other, strlen(other));
	tstack_expect_problem(r, 409, "/problems/idempotency-key-reused", COLLECTION);
	http_response_free(r);
	tstack_expect_counts(&t, 1, 1, 1);
	free(id);
	http_response_free(first);
	expect_pool_intact(&pool, &t, 1);
}

/* GET's input member equals POST's: the stored jsonb reads back as the
 * canonical text that was sent back with the 201. */
static void expect_get_input(const struct tstack_tenant *t, const char *id, const char *input)
{
	char path[80], *want;
	const char *h[] = { t->auth, NULL };
	struct http_response *r;

	snprintf(path, sizeof(path), COLLECTION "/%s", id);
	r = http_request("GET", path, h, NULL, 0);
	cr_assert_not_null(r, "%s", http_error());
	cr_assert_eq(r->status, 200, "GET %s: %d %s", path, r->status, r->body);
	cr_assert(asprintf(&want, ",\"input\":%s,", input) > 0);
	cr_assert_not_null(strstr(r->body, want), "GET %s: %s, want input %s", path, r->body,
	                   input);
	free(want);
	http_response_free(r);
}

/*
 * Numbers: integers from -2^63 to 2^64-1 are exact; any other number is an
 * IEEE 754 double (RFC 8785), so two texts that round to the same double
 * are one request; beyond a double (1e400, a 400-digit integer) is 400.
 * Before, json-c saturated big integers: a 300-digit one was stored as
 * 18446744073709551615.
 */
Test(hostile, huge_numbers_are_doubles_or_refused_and_read_back_as_sent)
{
	static const struct {
		const char *input;     /* sent */
		const char *canonical; /* stored and echoed */
		const char *same;      /* another text of the same request */
	} ok[] = {
		{ "{\"n\":18446744073709551615}", "{\"n\":18446744073709551615}", NULL },
		{ "{\"n\":-9223372036854775808}", "{\"n\":-9223372036854775808}", NULL },
		{ "{\"n\":18446744073709551616}", "{\"n\":18446744073709551616}",
		  "{\"n\":18446744073709551617}" },
		{ "{\"n\":1e20}", "{\"n\":100000000000000000000}",
		  "{\"n\":100000000000000000000}" },
		{ NULL /* 300 nines */, "{\"n\":1e+300}", "{\"n\":1e300}" },
		{ "{\"n\":1e-400}", "{\"n\":0}", "{\"n\":0}" },
	};
	char nines[512], big[600];
	struct tstack_tenant t;
	struct pool pool;
	size_t len;

	pool_snapshot(&pool);
	tstack_tenant_create(&t, "numbers");
	memset(nines, '9', 300);
	nines[300] = '\0';
	snprintf(big, sizeof(big), "{\"n\":%s}", nines);

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		const char *input = ok[i].input ? ok[i].input : big;
		char key[128], *body = body_with_input(input, &len), *id;
		struct http_response *first, *again;

		tstack_key(key, sizeof(key), "num");
		first = post_key(&t, key, body, len);
		id = tstack_expect_created(first, "x", ok[i].canonical);
		expect_get_input(&t, id, ok[i].canonical);
		free(body);
		if (ok[i].same != NULL) {
			body = body_with_input(ok[i].same, &len);
			again = post_key(&t, key, body, len);
			tstack_expect_replay(again, first);
			http_response_free(again);
			free(body);
		}
		free(id);
		http_response_free(first);
	}

	memset(nines, '9', 400);
	nines[400] = '\0';
	snprintf(big, sizeof(big), "{\"n\":%s}", nines);
	const char *refused[] = { "{\"n\":1e400}", "{\"n\":-1e400}", big };
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		char *body = body_with_input(refused[i], &len), *detail;
		struct http_response *r = post(&t, body, len);
		tstack_expect_problem(r, 400, "/problems/invalid-json", COLLECTION);
		detail = tstack_json(r->body, "{detail}");
		cr_assert_not_null(strstr(detail, "out of range"), "%s", detail);
		free(detail);
		http_response_free(r);
		free(body);
	}
	long n = (long)(sizeof(ok) / sizeof(ok[0]));
	tstack_expect_counts(&t, n, n, n);
	expect_pool_intact(&pool, &t, n);
}

/* 10,000 members in one object are accepted (max_body is the bound): the
 * stored input is sorted, and the same members in another order replay. */
Test(hostile, ten_thousand_keys_in_one_object_are_sorted_and_replayed)
{
	const int keys = 10000;
	struct tstack_tenant t;
	struct pool pool;
	struct http_response *first, *again;
	char key[128], *fwd, *rev, *canon, *body, *id;
	size_t fl = 1, rl = 1, len;
	double s, took;

	pool_snapshot(&pool);
	tstack_tenant_create(&t, "10kkeys");
	fwd = malloc((size_t)keys * 24 + 2);
	rev = malloc((size_t)keys * 24 + 2);
	cr_assert(fwd && rev);
	fwd[0] = rev[0] = '{';
	for (int i = 0; i < keys; i++) {
		fl += (size_t)sprintf(fwd + fl, "%s\"k%05d\":%d", i ? "," : "", i, i);
		rl += (size_t)sprintf(rev + rl, "%s\"k%05d\":%d", i ? "," : "", keys - 1 - i,
		                      keys - 1 - i);
	}
	strcpy(fwd + fl, "}");
	strcpy(rev + rl, "}");
	canon = fwd; /* already sorted and minimal */

	tstack_key(key, sizeof(key), "10k");
	body = body_with_input(rev, &len);
	s = tstack_now();
	first = post_key(&t, key, body, len);
	took = tstack_now() - s;
	free(body);
	id = tstack_expect_created(first, "x", canon);
	body = body_with_input(fwd, &len);
	again = post_key(&t, key, body, len);
	tstack_expect_replay(again, first);
	cr_log_info("10,000 keys: created in %.3fs (%zu bytes)", took, len);
	cr_assert(took < 5, "a 10,000-key create took %.3fs", took);
	tstack_expect_counts(&t, 1, 1, 1);
	free(body);
	free(id);
	free(fwd);
	free(rev);
	http_response_free(first);
	http_response_free(again);
	expect_pool_intact(&pool, &t, 1);
}

/* --- Headers ----------------------------------------------------------- */

/* A POST with these extra header lines, sent as raw bytes so that they can
 * hold what http_request would not send. */
static struct http_response *post_headers(const struct tstack_tenant *t, const char *lines)
{
	char req[16384];
	int n = snprintf(req, sizeof(req),
	                 "POST " COLLECTION
	                 " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n" JSON_CT
	                 "\r\n%sContent-Length: %zu\r\n\r\n%s",
	                 t->auth, lines, strlen(MIN_BODY), MIN_BODY);

	cr_assert(n > 0 && (size_t)n < sizeof(req));
	return raw(req, (size_t)n);
}

/* Header lines with their length: some hold a NUL. */
#define LINES(s) s, sizeof(s) - 1

Test(hostile, abusive_idempotency_keys_are_400_and_store_nothing)
{
	static char long_key[300], huge_key[10000];
	static struct {
		const char *lines;
		size_t len;       /* 0: strlen */
		const char *type; /* the app's, or nginx's bad-request */
	} cases[] = {
		{ long_key, 0, "/problems/invalid-idempotency-key" },
		{ LINES("Idempotency-Key: has space\r\n"), "/problems/invalid-idempotency-key" },
		{ LINES("Idempotency-Key: tab\there\r\n"), "/problems/invalid-idempotency-key" },
		{ LINES("Idempotency-Key: ctl\x01key\r\n"), "/problems/invalid-idempotency-key" },
		{ LINES("Idempotency-Key: esc\x1bkey\r\n"), "/problems/invalid-idempotency-key" },
		{ LINES("Idempotency-Key: del\x7fkey\r\n"), "/problems/invalid-idempotency-key" },
		{ LINES("Idempotency-Key: caf\xc3\xa9\r\n"), "/problems/invalid-idempotency-key" },
		{ LINES("Idempotency-Key:\r\n"), "/problems/invalid-idempotency-key" },
		{ LINES("Idempotency-Key: one\r\nIdempotency-Key: two\r\n"),
		  "/problems/invalid-idempotency-key" },
		{ LINES("Idempotency-Key: same\r\nIdempotency-Key: same\r\n"),
		  "/problems/invalid-idempotency-key" },
		{ LINES("Idempotency-Key: a\r\nidempotency-key: a\r\nIDEMPOTENCY-KEY: a\r\n"),
		  "/problems/invalid-idempotency-key" },
		/* nginx refuses these before any worker sees them. */
		{ LINES("Idempotency-Key: nul\0key\r\n"), "/problems/bad-request" },
		{ LINES("Idempotency-Key: cr\rkey\r\n"), "/problems/bad-request" },
		{ LINES("Idempotency-Key: folded\r\n continued\r\n"), "/problems/bad-request" },
		{ huge_key, 0, "/problems/bad-request" },
	};
	struct tstack_tenant t;
	struct pool pool;

	/* 256 characters: one too many. */
	snprintf(long_key, sizeof(long_key), "Idempotency-Key: %0256d\r\n", 0);
	/* Over nginx's large_client_header_buffers (8k): a 494 that nginx
	 * answers as 400. */
	memset(huge_key, 'k', sizeof(huge_key) - 1);
	memcpy(huge_key, "Idempotency-Key: ", 17);
	memcpy(huge_key + sizeof(huge_key) - 3, "\r\n", 3);
	pool_snapshot(&pool);
	tstack_tenant_create(&t, "badkeys");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char req[16384];
		size_t ll = cases[i].len ? cases[i].len : strlen(cases[i].lines);
		int n = snprintf(req, sizeof(req),
		                 "POST " COLLECTION " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
		                 "%s\r\n" JSON_CT "\r\n",
		                 t.auth);
		cr_assert((size_t)n + ll + 256 < sizeof(req));
		memcpy(req + n, cases[i].lines, ll);
		n += (int)ll;
		n += snprintf(req + n, sizeof(req) - (size_t)n, "Content-Length: %zu\r\n\r\n%s",
		              strlen(MIN_BODY), MIN_BODY);
		struct http_response *r = raw(req, (size_t)n);
		cr_assert_eq(r->status, 400, "case %zu: %d %s", i, r->status, r->body);
		tstack_expect_problem(r, 400, cases[i].type, COLLECTION);
		http_response_free(r);
		tstack_expect_counts(&t, 0, 0, 0);
	}
	/* 255 characters is the longest key, and it works. */
	char ok[300];
	snprintf(ok, sizeof(ok), "Idempotency-Key: %0255d\r\n", 0);
	struct http_response *r = post_headers(&t, ok);
	free(tstack_expect_created(r, "x", "{}"));
	http_response_free(r);
	expect_pool_intact(&pool, &t, 1);
}

/* True when the response's header block (before the body) names this
 * header: the test client keeps every header line it got. */
static int has_header(const struct http_response *r, const char *name)
{
	return http_header(r, name) != NULL;
}

/*
 * Nothing a client sends reaches a response header, and what the app echoes
 * in a body (a path, a key) is JSON-escaped, control characters replaced.
 */
Test(hostile, header_injection_attempts_inject_nothing)
{
	struct tstack_tenant t;
	struct pool pool;
	struct http_response *r, *first;
	char lines[512], key[128], *v, *id;

	pool_snapshot(&pool);
	tstack_tenant_create(&t, "inject");
	tstack_key(key, sizeof(key), "inject");

	/* CR LF in a header value is the end of that header: what follows
	 * is one more request header, never a response header. */
	snprintf(lines, sizeof(lines), "Idempotency-Key: %s\r\nX-Injected: yes\r\n", key);
	first = post_headers(&t, lines);
	id = tstack_expect_created(first, "x", "{}");
	cr_assert(!has_header(first, "X-Injected"), "a request header came back");
	cr_assert_eq(tstack_count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1"
	                          " AND key = $2",
	                          t.id_text, key),
	             1, "the key is the header's value up to CR LF");
	/* A bare LF ends a header line for nginx too: the same key again. */
	snprintf(lines, sizeof(lines), "Idempotency-Key: %s\nX-Injected: yes\r\n", key);
	r = post_headers(&t, lines);
	tstack_expect_replay(r, first);
	cr_assert(!has_header(r, "X-Injected"));
	http_response_free(r);

	/* Encoded CR LF in the path: decoded by nginx, never written raw. */
	const char *h[] = { t.auth, NULL };
	r = http_request("GET", "/v1/x%0d%0aX-Injected:%20yes%0d%0a%0d%0a<html>", h, NULL, 0);
	cr_assert_not_null(r, "%s", http_error());
	tstack_expect_problem(r, 404, "/problems/not-found",
	                      "/v1/x??X-Injected: yes?"
	                      "??"
	                      "?<html>");
	cr_assert(!has_header(r, "X-Injected"));
	http_response_free(r);
	r = http_request("GET", COLLECTION "/%0d%0aLocation:%20http:%2f%2fevil", h, NULL, 0);
	cr_assert_not_null(r, "%s", http_error());
	tstack_expect_problem(r, 404, "/problems/not-found",
	                      COLLECTION "/??Location: http:/evil"); /* merge_slashes */
	cr_assert_eq(http_header_count(r, "Location"), 0);
	http_response_free(r);

	/* A key with JSON's special characters, echoed by a 409: escaped. */
	const char *odd = "k\"}\\,\"x\":\"<script>";
	snprintf(lines, sizeof(lines), "Idempotency-Key: %s\r\n", odd);
	r = post_headers(&t, lines);
	free(tstack_expect_created(r, "x", "{}"));
	http_response_free(r);
	char req[1024];
	const char *other = "{\"type\":\"other\"}";
	int n = snprintf(req, sizeof(req),
	                 "POST " COLLECTION
	                 " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n" JSON_CT
	                 "\r\n%sContent-Length: %zu\r\n\r\n%s",
	                 t.auth, lines, strlen(other), other);
	r = raw(req, (size_t)n);
	tstack_expect_problem(r, 409, "/problems/idempotency-key-reused", COLLECTION);
	v = tstack_json(r->body, "{idempotency_key}");
	cr_assert_str_eq(v, odd, "the key echoed in the body: %s", r->body);
	free(v);
	http_response_free(r);

	/* Nor a line of the server's log: the decoded CR LF is escaped. */
	FILE *f = fopen(tstack_env("IDEMFLOW_FCGI_LOG"), "r");
	char line[4096];
	cr_assert_not_null(f);
	while (fgets(line, sizeof(line), f))
		cr_assert(strncmp(line, "X-Injected", 10) != 0 && strncmp(line, "Location", 8) != 0,
		          "a forged log line: %s", line);
	fclose(f);

	tstack_expect_counts(&t, 2, 2, 2);
	free(id);
	http_response_free(first);
	expect_pool_intact(&pool, &t, 2);
}

/* A request line over nginx's large_client_header_buffers (8k): nginx's
 * own 414, in the API's problem+json shape (no instance: nginx has no
 * URI it could quote), and no worker involved. */
Test(hostile, a_request_line_over_8k_is_nginx_s_414_as_problem_json)
{
	static char path[9000];
	struct tstack_tenant t;
	struct http_response *r;

	tstack_tenant_create(&t, "longuri");
	memcpy(path, COLLECTION "/", sizeof(COLLECTION));
	memset(path + sizeof(COLLECTION), 'a', sizeof(path) - sizeof(COLLECTION) - 1);
	const char *h[] = { t.auth, NULL };
	r = http_request("GET", path, h, NULL, 0);
	tstack_expect_problem(r, 414, "/problems/uri-too-long", "");
	http_response_free(r);
	tstack_expect_counts(&t, 0, 0, 0);
}
