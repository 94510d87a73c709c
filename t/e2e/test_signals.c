/*
 * End-to-end tests of the supervisor's signal handling and of
 * idempotency_key = optional.
 *
 * The harness server is shared by every test in this binary, and SIGTERM
 * ends it for good; Criterion does not promise an order between tests, so
 * everything that acts on the harness server is one test, in the order
 * SIGHUP, then SIGTERM.  The optional-mode test runs a supervisor of its
 * own and talks FastCGI to it directly (nginx only knows the harness
 * socket), so it is independent of the other test.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "http.h"
#include "tapi.h"
#include "tlog.h"
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

#define COLLECTION  "/v1/workflows"
#define JSON_CT     "Content-Type: application/json"
#define MAX_WORKERS 64

/*
 * Settings of its own (TSTACK_SETTINGS): idempotency_wait, which is also
 * every worker's lock_timeout, is 10 s, not the harness's 1 s, a window
 * too short on a loaded machine: the SIGTERM drain parks a request on a held key, then
 * signals, checks and releases it, all inside that wait.
 */
TSTACK_SETTINGS("idempotency_wait = 10s\n")

TestSuite(signals, .timeout = 60);

static const char MIN_BODY[] = "{\"type\":\"x\",\"input\":{}}";

/* --- Helpers ----------------------------------------------------------- */

/* Headers of a keyed JSON POST as t; kh holds the key line. */
static void post_headers(const char *h[4], char *kh, size_t khsize, const struct tstack_tenant *t,
                         const char *key)
{
	h[0] = t->auth;
	h[1] = JSON_CT;
	h[2] = NULL;
	h[3] = NULL;
	if (key) {
		snprintf(kh, khsize, "Idempotency-Key: %s", key);
		h[2] = kh;
	}
}

static struct http_response *post(const struct tstack_tenant *t, const char *key, const char *body)
{
	const char *h[4];
	char kh[512];
	struct http_response *r;

	post_headers(h, kh, sizeof(kh), t, key);
	r = http_request("POST", COLLECTION, h, body, strlen(body));
	cr_assert_not_null(r, "POST " COLLECTION ": %s", http_error());
	return r;
}

static int pid_in(pid_t pid, const pid_t *pids, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (pids[i] == pid)
			return 1;
	return 0;
}

/* Live workers number n and none of them is in old[]. */
static int workers_replaced(pid_t sup, size_t n, const pid_t *old, size_t nold)
{
	pid_t cur[MAX_WORKERS];
	size_t ncur = tstack_workers(sup, cur, MAX_WORKERS);

	if (ncur != n)
		return 0;
	for (size_t i = 0; i < ncur; i++)
		if (pid_in(cur[i], old, nold))
			return 0;
	return 1;
}

static int wait_gone(pid_t pid, long timeout_ms)
{
	double deadline = tstack_now() + timeout_ms / 1000.0;

	while (!tstack_pid_gone(pid)) {
		if (tstack_now() >= deadline)
			return 0;
		tstack_sleep_ms(20);
	}
	return 1;
}

struct pending_post {
	const char *const *headers;
	const char *body;
	struct http_response *resp;
	char err[512];
};

static void *pending_post_run(void *arg)
{
	struct pending_post *p = arg;

	p->resp = http_request("POST", COLLECTION, p->headers, p->body, strlen(p->body));
	if (!p->resp)
		snprintf(p->err, sizeof(p->err), "%s", http_error());
	return NULL;
}

/* --- SIGHUP, then SIGTERM, on the harness server ----------------------- */

/* Every worker is replaced, the count comes back, and requests work. */
static void sighup_replaces_every_worker(pid_t sup, size_t workers)
{
	pid_t old[MAX_WORKERS];
	size_t nold = tstack_workers(sup, old, MAX_WORKERS);
	struct tstack_tenant t;
	struct http_response *r;
	double deadline;
	char key[128], *id;

	cr_assert_eq(nold, workers, "%zu workers before SIGHUP, want %zu", nold, workers);
	tstack_tenant_create(&t, "sighup");

	cr_assert_eq(kill(sup, SIGHUP), 0, "SIGHUP: %s", strerror(errno));
	deadline = tstack_now() + 10;
	while (!workers_replaced(sup, workers, old, nold)) {
		cr_assert(tstack_now() < deadline, "workers not all replaced within 10s of SIGHUP");
		tstack_sleep_ms(50);
	}
	cr_assert(!tstack_pid_gone(sup), "SIGHUP ended the supervisor");

	tstack_key(key, sizeof(key), "sighup");
	r = post(&t, key, MIN_BODY);
	cr_assert_eq(r->status, 201, "POST after SIGHUP answered %d: %.300s", r->status, r->body);
	id = tstack_expect_created(r, "x", "{}");
	tstack_expect_counts(&t, 1, 1, 1);
	free(id);
	http_response_free(r);
}

/*
 * A request that is already inside a worker when SIGTERM arrives completes
 * normally; then the supervisor and its workers exit and nginx has no one
 * left to ask.
 */
static void sigterm_drains_in_flight_request(pid_t sup, long wait_ms)
{
	struct pending_post pending = { 0 };
	pid_t workers[MAX_WORKERS], blocked;
	struct tstack_tenant t;
	struct http_response *r;
	const char *h[4];
	char key[128], kh[512], *id, *row;
	pthread_t thread;
	size_t n;
	PGconn *hold;
	double deadline;

	tstack_tenant_create(&t, "sigterm");
	tstack_key(key, sizeof(key), "sigterm");
	post_headers(h, kh, sizeof(kh), &t, key);

	/* Park a worker inside the request: its insert waits on our row. */
	hold = tstack_db_connect();
	tstack_key_hold(hold, &t, key);
	pending.headers = h;
	pending.body = "{\"type\":\"drain\",\"input\":{\"d\":1}}";
	cr_assert_eq(pthread_create(&thread, NULL, pending_post_run, &pending), 0);
	/* Everything below must happen well inside idempotency_wait, or the
	 * parked request would give up with 409 instead of completing. */
	blocked = tstack_blocked_worker(hold, wait_ms / 2);
	cr_assert(blocked > 0, "no worker blocked on the held key");
	n = tstack_workers(sup, workers, MAX_WORKERS);
	cr_assert(pid_in(blocked, workers, n), "pid %ld is not a worker of %ld", (long)blocked,
	          (long)sup);

	cr_assert_eq(kill(sup, SIGTERM), 0, "SIGTERM: %s", strerror(errno));
	/* The drain has begun before the parked request may go on: the
	 * supervisor says so, and the idle workers, stopped together with
	 * the parked one, are gone while the parked one is still there. */
	deadline = tstack_now() + wait_ms / 2000.0;
	for (;;) {
		size_t left = 0;
		for (size_t i = 0; i < n; i++)
			left += workers[i] != blocked && !tstack_pid_gone(workers[i]);
		if (left == 0 && tstack_file_contains(tstack_env("IDEMFLOW_FCGI_LOG"),
		                                      "msg=\"stopping: letting in-flight requests"
		                                      " finish\""))
			break;
		cr_assert(tstack_now() < deadline, "%zu idle workers still running after SIGTERM",
		          left);
		tstack_sleep_ms(20);
	}
	cr_assert(!tstack_pid_gone(blocked), "the worker with a request in flight left at SIGTERM");
	tstack_exec(hold, "ROLLBACK");
	PQfinish(hold);
	pthread_join(thread, NULL);

	cr_assert_not_null(pending.resp, "in-flight request: %s", pending.err);
	cr_assert_eq(pending.resp->status, 201, "request in flight at SIGTERM answered %d: %.300s",
	             pending.resp->status, pending.resp->body);
	id = tstack_expect_created(pending.resp, "drain", "{\"d\":1}");

	/* Not our child, so its exit status is not ours to read; the
	 * optional-mode test checks that status on a supervisor it owns. */
	cr_assert(wait_gone(sup, 10000), "supervisor %ld still running 10s after SIGTERM",
	          (long)sup);
	for (size_t i = 0; i < n; i++)
		cr_assert(wait_gone(workers[i], 1000), "worker %ld outlived its supervisor",
		          (long)workers[i]);

	tstack_key(key, sizeof(key), "after");
	r = post(&t, key, MIN_BODY);
	/* nginx answers for the missing upstream with its 503 problem. */
	tstack_expect_problem(r, 503, "/problems/unavailable", COLLECTION);
	tstack_expect_header(r, "Retry-After", "1");
	http_response_free(r);

	tstack_expect_counts(&t, 1, 1, 1);
	row = tstack_text("SELECT id::text FROM workflows WHERE tenant_id = $1", t.id_text);
	cr_assert_str_eq(row, id);
	free(row);
	free(id);
	http_response_free(pending.resp);
}

Test(signals, sighup_replaces_workers_then_sigterm_drains_in_flight_and_exits)
{
	long workers = tstack_conf_long("workers", 4);
	long wait_ms = tstack_conf_ms("idempotency_wait", 5000);
	pid_t sup = tstack_supervisor_pid();

	cr_assert(workers > 0 && workers <= MAX_WORKERS);
	cr_assert(tstack_wait_workers(sup, (size_t)workers, 5000),
	          "supervisor %ld does not have %ld workers", (long)sup, workers);
	sighup_replaces_every_worker(sup, (size_t)workers);
	sigterm_drains_in_flight_request(sup, wait_ms);
}

/* --- idempotency_key = optional, on a supervisor of our own ------------ */

static pid_t own_pid;
static char own_sock[108];
static char own_pidfile[512];
static char own_log[512];

/* Runs after the test even when an assertion failed. */
static void own_stop(void)
{
	if (own_pid <= 0)
		return;
	kill(own_pid, SIGKILL);
	waitpid(own_pid, NULL, 0);
	own_pid = 0;
}

static void own_start(const char *const *overrides)
{
	const char *fcgi = tstack_env("IDEMFLOW_FCGI");
	const char *dir = tstack_env("IDEMFLOW_STACK_DIR");
	const char *argv[32];
	size_t argc = 0;
	double deadline;
	int n;

	n = snprintf(own_sock, sizeof(own_sock), "%s/own-%ld.sock", dir, (long)getpid());
	cr_assert(n > 0 && (size_t)n < sizeof(own_sock),
	          "IDEMFLOW_STACK_DIR too long for a socket path: %s", dir);
	snprintf(own_pidfile, sizeof(own_pidfile), "%s/own-%ld.pid", dir, (long)getpid());
	snprintf(own_log, sizeof(own_log), "%s/own-%ld.log", dir, (long)getpid());

	argv[argc++] = fcgi;
	argv[argc++] = "--config";
	argv[argc++] = tstack_env("IDEMFLOW_CONF");
	argv[argc++] = "--listen";
	argv[argc++] = own_sock;
	argv[argc++] = "--pid-file";
	argv[argc++] = own_pidfile;
	for (size_t i = 0; overrides[i]; i++) {
		cr_assert(argc < sizeof(argv) / sizeof(argv[0]) - 1);
		argv[argc++] = overrides[i];
	}
	argv[argc] = NULL;

	own_pid = tstack_spawn(argv, own_log);

	/* Ready means listening and the pid file written, as for the
	 * harness's own server; the two need not happen in that order. */
	deadline = tstack_now() + 10;
	while (!tstack_socket_accepts(own_sock) || tstack_pidfile_read(own_pidfile) == 0) {
		int status;

		cr_assert(waitpid(own_pid, &status, WNOHANG) == 0,
		          "%s exited during startup, status 0x%x; see %s", fcgi, status, own_log);
		cr_assert(tstack_now() < deadline,
		          "%s not listening on %s with pid file %s within 10s;"
		          " see %s",
		          fcgi, own_sock, own_pidfile, own_log);
		tstack_sleep_ms(20);
	}
}

/* SIGTERM our supervisor and require a clean exit within 10s. */
static void own_terminate(void)
{
	double deadline = tstack_now() + 10;
	int status;
	pid_t rc;

	cr_assert_eq(kill(own_pid, SIGTERM), 0);
	while ((rc = waitpid(own_pid, &status, WNOHANG)) == 0) {
		cr_assert(tstack_now() < deadline,
		          "supervisor still running 10s after SIGTERM; see %s", own_log);
		tstack_sleep_ms(20);
	}
	cr_assert_eq(rc, own_pid, "waitpid: %s", strerror(errno));
	own_pid = 0;
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	          "supervisor ended with status 0x%x after SIGTERM; see %s", status, own_log);
}

static struct http_response *own_post(const struct tstack_tenant *t, const char *key,
                                      const char *body)
{
	const char *h[4];
	char kh[512];
	struct http_response *r;

	post_headers(h, kh, sizeof(kh), t, key);
	r = http_fcgi_request(own_sock, "POST", COLLECTION, h, body, strlen(body));
	cr_assert_not_null(r, "FastCGI POST: %s", http_error());
	return r;
}

Test(signals, optional_mode_creates_anew_without_a_key_and_replays_with_one, .fini = own_stop)
{
	static const char *const overrides[] = { "--idempotency-key", "optional", "--workers", "1",
		                                 NULL };
	struct tstack_tenant t;
	struct http_response *a, *b, *keyed, *again, *bad;
	char key[128], *ida, *idb, *idk;
	long written;

	own_start(overrides);
	written = tstack_pidfile_read(own_pidfile);
	cr_assert_eq(written, (long)own_pid, "pid file says %ld, pid is %ld", written,
	             (long)own_pid);

	tstack_tenant_create(&t, "optional");

	/* Without a key every POST is a new workflow, never a replay. */
	a = own_post(&t, NULL, MIN_BODY);
	ida = tstack_expect_created(a, "x", "{}");
	b = own_post(&t, NULL, MIN_BODY);
	idb = tstack_expect_created(b, "x", "{}");
	cr_assert_str_neq(ida, idb, "two unkeyed POSTs made one workflow");
	tstack_expect_counts(&t, 2, 2, 0);

	/* With a key the usual guarantee still holds. */
	tstack_key(key, sizeof(key), "optional");
	keyed = own_post(&t, key, "{\"type\":\"x\",\"input\":{\"k\":1}}");
	idk = tstack_expect_created(keyed, "x", "{\"k\":1}");
	again = own_post(&t, key, "{\"type\":\"x\",\"input\":{\"k\":1}}");
	tstack_expect_replay(again, keyed);
	tstack_expect_counts(&t, 3, 3, 1);

	/* Optional does not mean any syntax goes. */
	bad = own_post(&t, "has space", MIN_BODY);
	tstack_expect_problem(bad, 400, "/problems/invalid-idempotency-key", COLLECTION);
	tstack_expect_counts(&t, 3, 3, 1);

	own_terminate();

	free(ida);
	free(idb);
	free(idk);
	http_response_free(a);
	http_response_free(b);
	http_response_free(keyed);
	http_response_free(again);
	http_response_free(bad);
}
