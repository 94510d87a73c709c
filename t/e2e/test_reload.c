/*
 * test_reload.c - the supervisor's promises, each on a pool of the test's
 * own (its own configuration file, socket, pid file and log): SIGHUP with
 * a bad value keeps the old configuration and workers; SIGHUP with a good
 * one replaces the workers one by one, the pool never below its size;
 * workers that keep dying young are respawned after a back-off; and
 * SIGTERM ends a worker still busy after shutdown_timeout. A refused
 * reload shows in the metrics (idemflow_config_last_reload_success 0)
 * and on the status page until a good one is taken.
 *
 * The pool's size during a reload is read from the supervisor's own log
 * (log_level = debug: every fork, retirement and reaped exit, in the
 * order the supervisor acted), not sampled from /proc. The kernel builds
 * /proc/PID/task/PID/children one child at a time, and a child reaped
 * between two steps shifts the list, so the next one is skipped: a pool
 * that never shrank can read as one or two workers short.
 *
 * The deadlines (shutdown_timeout, the respawn back-off) are timed from a
 * signal sent late in a wall-clock second, with the supervisor woken
 * every 50 ms meanwhile (SIGCHLD with no child to reap, as when an idle
 * worker exits slowly): a deadline kept in whole seconds of time(NULL)
 * then expires at the next second, a tenth of a second later.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "http.h"
#include "tapi.h"
#include "tlog.h"
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

#define COLLECTION  "/v1/workflows"
#define MAX_WORKERS 16

static struct tstack_pool own;
static char conf_path[600];

static void own_stop(void)
{
	tstack_pool_kill(&own, SIGKILL);
}

/* Our configuration: the harness's, without the keys in extra, then
 * extra ("key = value\n" lines). */
static void conf_write(const char *extra)
{
	FILE *in = fopen(tstack_env("IDEMFLOW_CONF"), "r"), *out;
	char line[1024];

	snprintf(conf_path, sizeof(conf_path), "%s/reload%ld.conf",
	         tstack_env("IDEMFLOW_STACK_DIR"), (long)getpid());
	out = fopen(conf_path, "w");
	cr_assert(in != NULL && out != NULL, "%s", strerror(errno));
	while (fgets(line, sizeof(line), in)) {
		char key[128];
		if (sscanf(line, " %127[a-z_] =", key) == 1) {
			char pat[140];
			snprintf(pat, sizeof(pat), "%s =", key);
			if (strstr(extra, pat) != NULL)
				continue;
		}
		fputs(line, out);
	}
	fputs(extra, out);
	fclose(in);
	fclose(out);
}

static void own_start(const char *extra, size_t workers)
{
	const char *argv[16];
	size_t argc = 0;

	conf_write(extra);
	tstack_pool_paths(&own, "reload");
	argv[argc++] = tstack_env("IDEMFLOW_FCGI");
	argv[argc++] = "--config";
	argv[argc++] = conf_path;
	argv[argc++] = "--listen";
	argv[argc++] = own.sock;
	argv[argc++] = "--pid-file";
	argv[argc++] = own.pidfile;
	argv[argc] = NULL;
	tstack_pool_run(&own, argv, 10000);
	cr_assert(tstack_wait_workers(own.pid, workers, 10000),
	          "idemflow-fcgi does not have %zu workers; see %s", workers, own.log);
}

static void wait_log(const char *needle, double secs)
{
	double deadline = tstack_now() + secs;

	while (!tstack_file_contains(own.log, needle)) {
		cr_assert(tstack_now() < deadline, "no \"%s\" in %s within %.0f s", needle, own.log,
		          secs);
		tstack_sleep_ms(20);
	}
}

static int pid_in(pid_t pid, const pid_t *set, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (set[i] == pid)
			return 1;
	return 0;
}

/* Sleep until the wall clock is at least frac into its second. */
static void late_in_a_second(double frac)
{
	struct timespec ts;

	for (;;) {
		clock_gettime(CLOCK_REALTIME, &ts);
		if ((double)ts.tv_nsec / 1e9 >= frac)
			return;
		tstack_sleep_ms(5);
	}
}

/* Wake the supervisor's loop: a SIGCHLD with nothing to reap. */
static void nudge(void)
{
	cr_assert_eq(kill(own.pid, SIGCHLD), 0);
}

/* The value of key=VALUE in a log line, as a number; -1 when absent. */
static long log_num(const char *line, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), " %s=", key);
	p = strstr(line, pat);
	return p ? strtol(p + strlen(pat), NULL, 10) : -1;
}

/*
 * Replays the supervisor's log: the fewest workers serving (forked, not
 * yet told to retire, not exited) from the line containing from on.
 * Sets *spawned to the workers forked from there on.
 */
static long pool_least_from_log(const char *from, long *spawned)
{
	FILE *f = fopen(own.log, "r");
	pid_t serving[4 * MAX_WORKERS];
	long n = 0, least = -1;
	char line[2048];

	cr_assert_not_null(f, "%s: %s", own.log, strerror(errno));
	*spawned = 0;
	while (fgets(line, sizeof(line), f)) {
		long pid = log_num(line, "worker_pid");
		int gone = 0;

		if (!strstr(line, " component=supervisor "))
			continue;
		if (least < 0 && strstr(line, from))
			least = n;
		if (strstr(line, "msg=\"worker spawned\"")) {
			cr_assert_lt(n, 4 * MAX_WORKERS);
			serving[n++] = (pid_t)pid;
			*spawned += least >= 0;
		} else if (strstr(line, "msg=\"retiring worker\"") ||
		           strstr(line, "msg=\"worker exited\"")) {
			gone = 1;
		}
		for (long i = 0; gone && i < n; i++)
			if (serving[i] == (pid_t)pid) {
				serving[i] = serving[--n];
				break;
			}
		if (least >= 0 && n < least)
			least = n;
	}
	fclose(f);
	cr_assert_geq(least, 0, "no \"%s\" in %s", from, own.log);
	return least;
}

static void expect_healthy(void)
{
	struct http_response *r = http_fcgi_request(own.sock, "GET", "/healthz", NULL, NULL, 0);

	cr_assert_not_null(r, "%s", http_error());
	cr_assert_eq(r->status, 204);
	http_response_free(r);
}

/* A sample's value in GET /metrics of our pool, asked through its socket
 * (127.0.0.1, in the default metrics_allow); asserts it is there. */
static double own_metric(const char *name)
{
	struct http_response *r = http_fcgi_request(own.sock, "GET", "/metrics", NULL, NULL, 0);
	char pat[160];
	const char *p;
	double v;

	cr_assert_not_null(r, "%s", http_error());
	cr_assert_eq(r->status, 200, "GET /metrics: %d %.300s", r->status, r->body);
	snprintf(pat, sizeof(pat), "\n%s ", name);
	p = strstr(r->body, pat);
	cr_assert_not_null(p, "no %s in %s", name, r->body);
	v = strtod(p + strlen(pat), NULL);
	http_response_free(r);
	return v;
}

/* GET path of our pool's status page; asserts 200. Caller frees. */
static struct http_response *own_status(const char *path)
{
	struct http_response *r = http_fcgi_request(own.sock, "GET", path, NULL, NULL, 0);

	cr_assert_not_null(r, "%s", http_error());
	cr_assert_eq(r->status, 200, "GET %s: %d %.300s", path, r->status, r->body);
	return r;
}

TestSuite(reload, .timeout = 120);

Test(reload, a_refused_reload_shows_in_the_metrics_and_the_status_page_until_one_is_taken,
     .fini = own_stop)
{
	struct http_response *r;
	double started, taken;
	char want[96];

	own_start("workers = 2\n", 2);
	cr_assert_eq(own_metric("idemflow_config_last_reload_success"), 1);
	started = own_metric("idemflow_config_last_reload_success_timestamp_seconds");
	cr_assert(started > (double)time(NULL) - 60 && started <= (double)time(NULL), "%.0f",
	          started);

	conf_write("workers = many\n");
	cr_assert_eq(kill(own.pid, SIGHUP), 0);
	wait_log("msg=\"configuration not reloaded; keeping the old one\"", 10);
	cr_assert_eq(own_metric("idemflow_config_last_reload_success"), 0);
	cr_assert_eq(own_metric("idemflow_config_last_reload_success_timestamp_seconds"), started);
	r = own_status("/status?json");
	snprintf(want, sizeof(want),
	         "\"config last reload success\":0,"
	         "\"config last reload success time\":%.0f",
	         started);
	cr_assert_not_null(strstr(r->body, want), "no %s in %s", want, r->body);
	http_response_free(r);
	r = own_status("/status");
	cr_assert_not_null(strstr(r->body, "\nlast reload:          failed, running the previous "
	                                   "configuration\n"),
	                   "%s", r->body);
	http_response_free(r);

	/* Fixed: taken, and the time of the success moves on. */
	tstack_sleep_ms(1100);
	conf_write("workers = 2\n");
	cr_assert_eq(kill(own.pid, SIGHUP), 0);
	wait_log("msg=\"configuration reloaded; replacing workers\" gen=1", 10);
	cr_assert_eq(own_metric("idemflow_config_last_reload_success"), 1);
	taken = own_metric("idemflow_config_last_reload_success_timestamp_seconds");
	cr_assert_gt(taken, started);
	r = own_status("/status");
	cr_assert_not_null(strstr(r->body, "\nlast reload:          ok\n"), "%s", r->body);
	http_response_free(r);
}

Test(
    reload,
    sighup_with_a_bad_value_keeps_the_old_configuration_then_a_good_one_replaces_workers_one_by_one,
    .fini = own_stop)
{
	pid_t old[MAX_WORKERS], cur[MAX_WORKERS];
	size_t nold, ncur, old_left;
	long least, spawned;
	double deadline;

	own_start("log_level = debug\nworkers = 2\n", 2);
	nold = tstack_workers(own.pid, old, MAX_WORKERS);
	cr_assert_eq(nold, 2);

	/* A bad value: logged, and nothing changes. */
	conf_write("log_level = debug\nworkers = many\n");
	cr_assert_eq(kill(own.pid, SIGHUP), 0);
	wait_log("msg=\"configuration not reloaded; keeping the old one\"", 10);
	ncur = tstack_workers(own.pid, cur, MAX_WORKERS);
	cr_assert_eq(ncur, 2, "%zu workers after a refused reload", ncur);
	for (size_t i = 0; i < ncur; i++)
		cr_assert(pid_in(cur[i], old, nold), "worker %ld replaced by a refused reload",
		          (long)cur[i]);
	cr_assert(!tstack_file_contains(own.log, "msg=\"configuration reloaded"));
	expect_healthy();

	/* A good one: the workers are replaced one at a time, each after
	 * its successor was forked, so the pool never shrinks below 2. */
	conf_write("log_level = debug\nworkers = 3\n");
	cr_assert_eq(kill(own.pid, SIGHUP), 0);
	deadline = tstack_now() + 20;
	do {
		ncur = tstack_workers(own.pid, cur, MAX_WORKERS);
		old_left = 0;
		for (size_t i = 0; i < ncur; i++)
			old_left += pid_in(cur[i], old, nold);
		cr_assert(tstack_now() < deadline, "not replaced within 20 s: %zu workers, %zu old",
		          ncur, old_left);
		tstack_sleep_ms(20);
	} while (old_left > 0 || ncur != 3);
	wait_log("msg=\"configuration reloaded; replacing workers\" gen=1 workers=3", 1);
	least = pool_least_from_log("msg=\"configuration reloaded", &spawned);
	cr_log_info("reload: %ld workers forked, the pool at least %ld", spawned, least);
	cr_assert_geq(least, 2, "the pool fell to %ld workers during the reload", least);
	cr_assert_eq(spawned, 3, "%ld workers forked for a pool of 3", spawned);
	expect_healthy();
}

Test(reload, workers_that_keep_dying_young_are_respawned_after_a_back_off, .fini = own_stop)
{
	pid_t cur[MAX_WORKERS];
	double died = 0, back = 0;

	own_start("workers = 1\n", 1);
	/* The first two young deaths in a row are respawned at once; the
	 * third waits 1 s, however often the supervisor wakes meanwhile. */
	for (int death = 1; death <= 3; death++) {
		cr_assert(tstack_wait_workers(own.pid, 1, 10000), "no worker to kill");
		cr_assert_eq(tstack_workers(own.pid, cur, MAX_WORKERS), 1);
		if (death == 3)
			late_in_a_second(0.9);
		cr_assert_eq(kill(cur[0], SIGKILL), 0);
		while (!tstack_pid_gone(cur[0]))
			tstack_sleep_ms(5);
		died = tstack_now();
		if (death < 3) {
			cr_assert(tstack_wait_workers(own.pid, 1, 10000));
			back = tstack_now();
			cr_assert_lt(back - died, 0.9, "death %d: respawned after %.2f s", death,
			             back - died);
		}
	}
	while (tstack_workers(own.pid, cur, MAX_WORKERS) == 0) {
		cr_assert(tstack_now() - died < 10, "no respawn within 10 s");
		nudge();
		tstack_sleep_ms(50);
	}
	back = tstack_now();
	wait_log("msg=\"workers keep crashing; delaying respawn\" delay_s=1 crashes_in_a_row=3", 5);
	cr_log_info("third young death: respawned after %.2f s", back - died);
	/* died is read after the kill, so the true delay is a little longer. */
	cr_assert_geq(back - died, 0.95, "respawned after %.2f s, the back-off is 1 s",
	              back - died);
	cr_assert_lt(back - died, 5, "respawned after %.2f s, the back-off is 1 s", back - died);
	expect_healthy();
}

struct parked {
	const struct tstack_tenant *t;
	const char *key;
	struct http_response *resp;
};

static void *parked_run(void *arg)
{
	struct parked *p = arg;
	char kh[200];

	snprintf(kh, sizeof(kh), "Idempotency-Key: %s", p->key);
	const char *h[] = { p->t->auth, "Content-Type: application/json", kh, NULL };
	p->resp = http_fcgi_request(own.sock, "POST", COLLECTION, h, "{\"type\":\"x\"}", 12);
	return NULL;
}

Test(reload, sigterm_kills_a_worker_still_busy_after_shutdown_timeout, .fini = own_stop)
{
	struct tstack_tenant t;
	struct parked p = { 0 };
	char key[128];
	pthread_t th;
	PGconn *hold;
	pid_t busy;
	double t0, took;
	int status;

	/* The request would wait 60 s for its key; the grace is 1 s. */
	own_start("workers = 2\nidempotency_wait = 60s\nshutdown_timeout = 1s\n", 2);
	tstack_tenant_create(&t, "shutdown");
	tstack_key(key, sizeof(key), "busy");
	hold = tstack_db_connect();
	tstack_key_hold(hold, &t, key);
	p = (struct parked){ .t = &t, .key = key };
	cr_assert_eq(pthread_create(&th, NULL, parked_run, &p), 0);
	busy = tstack_blocked_worker(hold, 10000);
	cr_assert(busy > 0, "no worker blocked on the held key");

	late_in_a_second(0.9);
	t0 = tstack_now();
	cr_assert_eq(kill(own.pid, SIGTERM), 0);
	for (;;) {
		pid_t w = waitpid(own.pid, &status, WNOHANG);

		cr_assert_geq(w, 0, "waitpid: %s", strerror(errno));
		if (w == own.pid)
			break;
		cr_assert_lt(tstack_now() - t0, 10, "the supervisor still runs after 10 s");
		nudge();
		tstack_sleep_ms(50);
	}
	took = tstack_now() - t0;
	own.pid = 0;
	pthread_join(th, NULL);
	tstack_exec(hold, "ROLLBACK");
	PQfinish(hold);
	cr_log_info("SIGTERM with a busy worker: the supervisor left after %.2f s", took);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status 0x%x", status);
	cr_assert(took >= 0.95 && took < 5, "left after %.2f s, shutdown_timeout is 1 s", took);
	cr_assert(tstack_pid_gone(busy), "the busy worker outlived its supervisor");
	cr_assert(tstack_file_contains(own.log, "msg=\"worker did not stop in time; killing it\""));
	/* It never answered. (Its statement, still waiting in PostgreSQL,
	 * may yet commit: a retry with the key then replays it.) */
	cr_assert(p.resp == NULL || p.resp->status != 201, "answered %d",
	          p.resp ? p.resp->status : 0);
	http_response_free(p.resp);
}
