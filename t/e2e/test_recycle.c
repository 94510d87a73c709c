/*
 * End-to-end tests of max_requests: a worker retires after serving that
 * many requests, the supervisor replaces it, and no client notices.
 *
 * Each test runs an idemflow-fcgi of its own (the harness server has no
 * max_requests) and talks FastCGI to it directly. Which worker served a
 * request is read from the server's own request log: every line carries
 * the worker's pid and the request id, which the FastCGI client makes up
 * and hands back as X-Request-Id.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "http.h"
#include "tapi.h"
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

#define COLLECTION "/v1/workflows"
#define JSON_CT    "Content-Type: application/json"
#define MAX_LINES  4096

TestSuite(recycle, .timeout = 120);

/* --- A server of our own ----------------------------------------------- */

static struct tstack_pool own;

static void own_stop(void)
{
	tstack_pool_kill(&own, SIGKILL);
}

/* idemflow-fcgi with the harness configuration, our socket and pid file,
 * `workers` workers retiring after max_requests; ready when they all are. */
static void own_start(int workers, int max_requests)
{
	char w[16], m[16];
	const char *argv[16];
	size_t argc = 0;

	snprintf(w, sizeof(w), "%d", workers);
	snprintf(m, sizeof(m), "%d", max_requests);
	tstack_pool_paths(&own, "r");
	argv[argc++] = tstack_env("IDEMFLOW_FCGI");
	argv[argc++] = "--config";
	argv[argc++] = tstack_env("IDEMFLOW_CONF");
	argv[argc++] = "--listen";
	argv[argc++] = own.sock;
	argv[argc++] = "--pid-file";
	argv[argc++] = own.pidfile;
	argv[argc++] = "--workers";
	argv[argc++] = w;
	argv[argc++] = "--max-requests";
	argv[argc++] = m;
	argv[argc++] = "--log-level";
	argv[argc++] = "info";
	argv[argc] = NULL;

	tstack_pool_run(&own, argv, 10000);
	cr_assert(tstack_wait_workers(own.pid, (size_t)workers, 10000),
	          "idemflow-fcgi does not have %d workers; see %s", workers, own.log);
}

/* SIGTERM, then a clean exit within 10 s. */
static void own_terminate(void)
{
	double deadline = tstack_now() + 10;
	int status;
	pid_t rc;

	cr_assert_eq(kill(own.pid, SIGTERM), 0);
	while ((rc = waitpid(own.pid, &status, WNOHANG)) == 0) {
		cr_assert(tstack_now() < deadline, "supervisor still running 10s after SIGTERM");
		tstack_sleep_ms(20);
	}
	cr_assert_eq(rc, own.pid);
	own.pid = 0;
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	          "supervisor ended with status 0x%x; see %s", status, own.log);
}

/* --- Reading the server's log ----------------------------------------- */

struct log_lines {
	char *line[MAX_LINES];
	size_t n;
};

static void log_read(struct log_lines *l)
{
	FILE *f = fopen(own.log, "r");
	char buf[4096];

	cr_assert_not_null(f, "%s: %s", own.log, strerror(errno));
	l->n = 0;
	while (fgets(buf, sizeof(buf), f) && l->n < MAX_LINES)
		l->line[l->n++] = strdup(buf);
	fclose(f);
}

static void log_free(struct log_lines *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->line[i]);
	l->n = 0;
}

/* The value of key=... in line (unquoted values only), or 0 when absent. */
static long field_long(const char *line, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), " %s=", key);
	p = strstr(line, pat);
	return p ? atol(p + strlen(pat)) : 0;
}

/* The pid of the worker that logged the request with this id; 0 if none. */
static long served_by(const struct log_lines *l, const char *request_id)
{
	char pat[128];

	snprintf(pat, sizeof(pat), " request_id=%s ", request_id);
	for (size_t i = 0; i < l->n; i++)
		if (strstr(l->line[i], "msg=request ") && strstr(l->line[i], pat))
			return field_long(l->line[i], "pid");
	return 0;
}

static size_t count_lines(const struct log_lines *l, const char *a, const char *b)
{
	size_t n = 0;

	for (size_t i = 0; i < l->n; i++)
		n += strstr(l->line[i], a) != NULL && (b == NULL || strstr(l->line[i], b) != NULL);
	return n;
}

/* --- Requests ------------------------------------------------------------ */

/* POST a keyed create as t: 201, first or replayed. Returns the response. */
static struct http_response *create(const struct tstack_tenant *t, const char *key,
                                    const char *body)
{
	char kh[512];
	const char *h[] = { t->auth, JSON_CT, kh, NULL };

	snprintf(kh, sizeof(kh), "Idempotency-Key: %s", key);
	return http_fcgi_request(own.sock, "POST", COLLECTION, h, body, strlen(body));
}

/*
 * One worker, max_requests = 5: 23 requests in a row are served by five
 * workers in turn, five requests each (three by the last), every one
 * answered as if nothing happened; each retirement is logged at info
 * level as planned, none as a crash, and the restart counter stays 0.
 */
Test(recycle, one_worker_is_replaced_after_max_requests_without_a_failed_request, .fini = own_stop)
{
	enum { MAX = 5, N = 23 };
	struct tstack_tenant t;
	struct log_lines l;
	struct http_response *first = NULL, *r;
	char ids[N][64], key[128];
	long pid[N], sup;
	pid_t live[4];

	tstack_tenant_create(&t, "recycle");
	tstack_key(key, sizeof(key), "recycle");
	own_start(1, MAX);
	sup = own.pid;

	for (int i = 0; i < N; i++) {
		const char *rid;

		/* A create, then its replays: a replay served by a new worker
		 * is still byte for byte the first answer. */
		r = create(&t, key, "{\"type\":\"recycle\",\"input\":{\"n\":1}}");
		cr_assert_not_null(r, "request %d: %s", i + 1, http_error());
		if (i == 0) {
			char *id = tstack_expect_created(r, "recycle", "{\"n\":1}");
			free(id);
			first = r;
		} else {
			tstack_expect_replay(r, first);
		}
		rid = http_header(r, "X-Request-Id");
		cr_assert_not_null(rid);
		snprintf(ids[i], sizeof(ids[i]), "%s", rid);
		if (r != first)
			http_response_free(r);
	}
	tstack_expect_counts(&t, 1, 1, 1);

	/* The retiring worker's last lines come after its last answer. */
	cr_assert(tstack_wait_workers(own.pid, 1, 10000));
	tstack_sleep_ms(200);
	log_read(&l);
	for (int i = 0; i < N; i++) {
		pid[i] = served_by(&l, ids[i]);
		cr_assert(pid[i] > 0, "request %d (%s) not in the log %s", i + 1, ids[i], own.log);
		if (i % MAX == 0 && i > 0)
			cr_assert_neq(pid[i], pid[i - 1], "request %d: still worker %ld after %d",
			              i + 1, pid[i], MAX);
		else if (i > 0)
			cr_assert_eq(pid[i], pid[i - 1], "request %d: worker %ld, then %ld", i + 1,
			             pid[i - 1], pid[i]);
		cr_assert_neq(pid[i], sup, "the supervisor served a request");
	}
	/* Five workers in all; the first four retired, the fifth still serves. */
	for (int w = 0; w < 4; w++) {
		long p = pid[w * MAX];
		char pat[64];

		snprintf(pat, sizeof(pat), " pid=%ld ", p);
		cr_assert_eq(
		    count_lines(&l, "msg=\"worker retiring after max_requests\" served=5", pat), 1,
		    "worker %ld: no retiring line", p);
		snprintf(pat, sizeof(pat), " worker_pid=%ld exit_code=0 ", p);
		cr_assert_eq(count_lines(&l, "level=info component=supervisor", pat), 1,
		             "worker %ld: its exit is not logged as a clean one", p);
	}
	cr_assert_eq(count_lines(&l, "msg=\"worker retiring after max_requests\"", NULL), 4);
	cr_assert_eq(count_lines(&l, "msg=\"worker exited\"", NULL), 4);
	cr_assert_eq(count_lines(&l, "level=warning", NULL), 0, "a warning in %s", own.log);
	cr_assert_eq(count_lines(&l, "level=error", NULL), 0, "an error in %s", own.log);
	cr_assert_eq(tstack_workers(own.pid, live, 4), 1);
	cr_assert_eq(live[0], pid[N - 1], "the live worker is not the one that served last");
	log_free(&l);

	/* Planned exits are not restarts. */
	const char *h[] = { NULL };
	r = http_fcgi_request(own.sock, "GET", "/metrics", h, NULL, 0);
	cr_assert_not_null(r, "%s", http_error());
	cr_assert_eq(r->status, 200, "GET /metrics: %d %.200s", r->status, r->body);
	cr_assert_not_null(strstr(r->body, "\nidemflow_worker_restarts_total 0\n"), "%s", r->body);
	http_response_free(r);
	http_response_free(first);
	own_terminate();
}

struct client {
	const struct tstack_tenant *t;
	int id, n;
	int ok;        /* 201 answers */
	char err[256]; /* the first failure */
	char (*rids)[64];
};

static void *client_run(void *arg)
{
	struct client *c = arg;
	char key[64], body[96];

	for (int i = 0; i < c->n; i++) {
		struct http_response *r;

		snprintf(key, sizeof(key), "c%d-%d", c->id, i / 2);
		snprintf(body, sizeof(body), "{\"type\":\"recycle\",\"input\":{\"c\":%d,\"i\":%d}}",
		         c->id, i / 2);
		/* Every key twice: a create, then its replay. */
		r = create(c->t, key, body);
		if (r == NULL || r->status != 201) {
			if (!c->err[0])
				snprintf(c->err, sizeof(c->err), "%s: %s", key,
				         r ? r->body : http_error());
		} else {
			const char *rid = http_header(r, "X-Request-Id");
			c->ok++;
			snprintf(c->rids[i], sizeof(c->rids[i]), "%s", rid ? rid : "");
		}
		http_response_free(r);
	}
	return NULL;
}

/*
 * Two workers, max_requests = 10, four clients at once: 400 requests all
 * succeed while workers keep retiring under load; every retired worker
 * served exactly 10 requests, and none was counted as a restart.
 */
Test(recycle, concurrent_clients_see_no_failure_while_workers_retire, .fini = own_stop)
{
	enum { CLIENTS = 4, EACH = 100, MAX = 10 };
	static char rids[CLIENTS][EACH][64];
	struct client c[CLIENTS];
	pthread_t th[CLIENTS];
	struct tstack_tenant t;
	struct log_lines l;
	long pids[CLIENTS * EACH];
	size_t npids = 0, retired = 0;

	tstack_tenant_create(&t, "recycle-load");
	own_start(2, MAX);
	for (int i = 0; i < CLIENTS; i++) {
		c[i] = (struct client){ .t = &t, .id = i, .n = EACH, .rids = rids[i] };
		cr_assert_eq(pthread_create(&th[i], NULL, client_run, &c[i]), 0);
	}
	for (int i = 0; i < CLIENTS; i++) {
		pthread_join(th[i], NULL);
		cr_assert_eq(c[i].ok, EACH, "client %d: %d of %d answered 201; first failure: %s",
		             i, c[i].ok, EACH, c[i].err);
	}
	tstack_expect_counts(&t, CLIENTS * EACH / 2, CLIENTS * EACH / 2, CLIENTS * EACH / 2);

	cr_assert(tstack_wait_workers(own.pid, 2, 10000));
	tstack_sleep_ms(200);
	log_read(&l);
	/* Requests per worker, from the log. */
	for (int i = 0; i < CLIENTS; i++) {
		for (int j = 0; j < EACH; j++) {
			long p = served_by(&l, rids[i][j]);
			cr_assert(p > 0, "request %s not in the log", rids[i][j]);
			pids[npids++] = p;
		}
	}
	for (size_t i = 0; i < npids; i++) {
		size_t served = 0, seen = 0;
		char pat[64];

		for (size_t j = 0; j < i; j++)
			seen += pids[j] == pids[i];
		if (seen)
			continue;
		for (size_t j = 0; j < npids; j++)
			served += pids[j] == pids[i];
		cr_assert(served <= MAX, "worker %ld served %zu requests", pids[i], served);
		snprintf(pat, sizeof(pat), " pid=%ld ", pids[i]);
		if (count_lines(&l, "msg=\"worker retiring after max_requests\" served=10", pat)) {
			cr_assert_eq(served, MAX, "worker %ld retired after %zu", pids[i], served);
			retired++;
		}
	}
	/* 400 requests, at most 10 each: at least 38 workers retired. */
	cr_assert_geq(retired, CLIENTS * EACH / MAX - 2);
	cr_assert_eq(count_lines(&l, "msg=\"worker retiring after max_requests\"", NULL), retired);
	cr_assert_eq(count_lines(&l, "msg=\"worker exited\"", "exit_code=0"), retired);
	cr_assert_eq(count_lines(&l, "level=warning", NULL), 0, "a warning in %s", own.log);
	cr_assert_eq(count_lines(&l, "level=error", NULL), 0, "an error in %s", own.log);
	log_free(&l);
	own_terminate();
}
