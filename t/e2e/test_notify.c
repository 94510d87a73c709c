/*
 * test_notify.c - what idemflow-fcgi tells systemd, read from a fake
 * notification socket (a datagram socket of the test's own, named by
 * NOTIFY_SOCKET as systemd does) by a pool of the test's own:
 *  - READY=1 only once every worker holds its database connection: with
 *    PostgreSQL stopped the pool listens and says "starting", and READY=1
 *    comes after PostgreSQL is back, when both workers have a session;
 *  - SIGHUP: RELOADING=1 with MONOTONIC_USEC, then READY=1 once the new
 *    generation is ready; a refused configuration named in STATUS= until
 *    a reload is taken; SIGTERM: STOPPING=1 and the workers counted down;
 *  - WATCHDOG=1 every half of WATCHDOG_USEC;
 *  - every datagram comes from the supervisor (the unit's NotifyAccess=main);
 *  - without NOTIFY_SOCKET the server says nothing of it.
 * The exact datagrams, in order (WATCHDOG=1 aside, which may come between
 * any two).
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "http.h"
#include "tlog.h"
#include "tsql.h"
#include "tstack.h"
#include "twait.h"

#define MAX_WORKERS 16

/* Stops PostgreSQL: no other test of this binary may run meanwhile. */
TSTACK_SEQUENTIAL

static struct tstack_pool own;
static char conf_path[600], sock_path[108];
static int manager = -1, pg_stopped;

struct dgram {
	char text[1024];
	pid_t sender;
	double at; /* when the kernel queued it, s (CLOCK_REALTIME) */
};

static void teardown(void)
{
	tstack_pool_kill(&own, SIGKILL);
	if (manager >= 0)
		close(manager);
	if (sock_path[0])
		unlink(sock_path);
	if (pg_stopped)
		tstack_pg_ctl("start");
}

/* The fake service manager: a datagram socket that learns each sender's
 * pid (SO_PASSCRED, as systemd's) and when each datagram arrived. */
static void manager_open(void)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	int on = 1;

	snprintf(sock_path, sizeof(sock_path), "%s/notify%ld.sock",
	         tstack_env("IDEMFLOW_STACK_DIR"), (long)getpid());
	cr_assert_lt(strlen(sock_path), sizeof(sun.sun_path));
	strcpy(sun.sun_path, sock_path);
	unlink(sock_path);
	manager = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	cr_assert(manager >= 0);
	cr_assert_eq(bind(manager, (struct sockaddr *)&sun, sizeof(sun)), 0, "%s", strerror(errno));
	cr_assert_eq(setsockopt(manager, SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)), 0);
	cr_assert_eq(setsockopt(manager, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof(on)), 0);
}

/* The next datagram within ms into d; 0 when none came. */
static int manager_recv(struct dgram *d, long ms)
{
	struct pollfd p = { .fd = manager, .events = POLLIN };
	union {
		char buf[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(sizeof(struct timespec))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { .iov_base = d->text, .iov_len = sizeof(d->text) - 1 };
	struct msghdr mh = { .msg_iov = &iov,
		             .msg_iovlen = 1,
		             .msg_control = ctl.buf,
		             .msg_controllen = sizeof(ctl.buf) };
	ssize_t n;

	if (poll(&p, 1, (int)ms) != 1)
		return 0;
	n = recvmsg(manager, &mh, 0);
	cr_assert(n >= 0, "recvmsg: %s", strerror(errno));
	d->text[n] = '\0';
	d->sender = 0;
	d->at = tstack_now();
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
			struct ucred u;
			memcpy(&u, CMSG_DATA(c), sizeof(u));
			d->sender = u.pid;
		} else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
			struct timespec ts;
			memcpy(&ts, CMSG_DATA(c), sizeof(ts));
			d->at = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
		}
	}
	return 1;
}

/* Watchdog pings seen by next(), with their arrival times. */
static double pings[256];
static int npings;

/* The next datagram that is not WATCHDOG=1, within secs; "" when none.
 * Every datagram must come from the supervisor. */
static const char *next(double secs)
{
	static struct dgram d;
	double deadline = tstack_now() + secs;

	for (;;) {
		long ms = (long)((deadline - tstack_now()) * 1000);
		if (ms < 0 || !manager_recv(&d, ms))
			return "";
		cr_assert_eq(d.sender, own.pid,
		             "datagram \"%s\" from pid %ld, not the supervisor %ld", d.text,
		             (long)d.sender, (long)own.pid);
		if (strcmp(d.text, "WATCHDOG=1") != 0)
			return d.text;
		if (npings < (int)(sizeof(pings) / sizeof(pings[0])))
			pings[npings++] = d.at;
	}
}

/* The harness's configuration with "workers = <workers>". */
static void conf_write_raw(const char *workers)
{
	FILE *in = fopen(tstack_env("IDEMFLOW_CONF"), "r"), *out;
	char line[1024];

	snprintf(conf_path, sizeof(conf_path), "%s/notify%ld.conf",
	         tstack_env("IDEMFLOW_STACK_DIR"), (long)getpid());
	out = fopen(conf_path, "w");
	cr_assert(in != NULL && out != NULL, "%s", strerror(errno));
	while (fgets(line, sizeof(line), in))
		if (strncmp(line, "workers", 7) != 0)
			fputs(line, out);
	fprintf(out, "workers = %s\n", workers);
	fclose(in);
	fclose(out);
}

static void conf_write(int workers)
{
	char n[16];

	snprintf(n, sizeof(n), "%d", workers);
	conf_write_raw(n);
}

/* SIGHUP to our pool: the RELOADING=1 datagram, with the time of the
 * signal as MONOTONIC_USEC. */
static void expect_reloading(void)
{
	unsigned long long mono, lo, hi;
	struct timespec t0, t1;
	char rest[256];
	const char *m;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	cr_assert_eq(kill(own.pid, SIGHUP), 0);
	m = next(5);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	cr_assert_eq(sscanf(m, "RELOADING=1\nMONOTONIC_USEC=%llu\n%255[^\n]", &mono, rest), 2, "%s",
	             m);
	cr_assert_str_eq(rest, "STATUS=reloading the configuration");
	lo = (unsigned long long)t0.tv_sec * 1000000 + (unsigned long long)t0.tv_nsec / 1000;
	hi = (unsigned long long)t1.tv_sec * 1000000 + (unsigned long long)t1.tv_nsec / 1000;
	cr_assert(mono >= lo && mono <= hi, "MONOTONIC_USEC=%llu is not the time of the reload",
	          mono);
}

/* Start our pool with NOTIFY_SOCKET (and WATCHDOG_USEC when not NULL) in
 * its environment alone. */
static void own_start(int workers, const char *notify, const char *watchdog_usec)
{
	const char *argv[] = { tstack_env("IDEMFLOW_FCGI"),
		               "--config",
		               conf_path,
		               "--listen",
		               own.sock,
		               "--pid-file",
		               own.pidfile,
		               NULL };

	conf_write(workers);
	tstack_pool_paths(&own, "notify");
	if (notify)
		setenv("NOTIFY_SOCKET", notify, 1);
	if (watchdog_usec)
		setenv("WATCHDOG_USEC", watchdog_usec, 1);
	tstack_pool_run(&own, argv, 10000);
	unsetenv("NOTIFY_SOCKET");
	unsetenv("WATCHDOG_USEC");
	cr_assert(tstack_wait_workers(own.pid, (size_t)workers, 10000), "no %d workers; see %s",
	          workers, own.log);
}

/* Wait for "READY=1\n<status>", every datagram before it being one of the
 * progress lines "STATUS=<phase>: K of N workers ready". */
static void expect_ready(const char *phase, int n, const char *status, double secs)
{
	char want[256], progress[128];
	double deadline = tstack_now() + secs;
	const char *m;
	int k, last = -1;

	snprintf(want, sizeof(want), "READY=1\nSTATUS=%s", status);
	snprintf(progress, sizeof(progress), "STATUS=%s: ", phase);
	for (;;) {
		int end = 0, of = 0;
		size_t plen = strlen(progress);
		m = next(deadline - tstack_now());
		cr_assert_str_neq(m, "", "no READY=1 within %.0f s; see %s", secs, own.log);
		if (strcmp(m, want) == 0)
			return;
		cr_assert(strncmp(m, progress, plen) == 0 &&
		              sscanf(m + plen, "%d of %d workers ready%n", &k, &of, &end) == 2 &&
		              of == n && m[plen + (size_t)end] == '\0',
		          "\"%s\" while waiting for \"%s\"", m, want);
		cr_assert(k > last && k < n, "\"%s\" after %d ready", m, last);
		last = k;
	}
}

TestSuite(notify, .timeout = 120, .fini = teardown);

Test(notify, ready_only_once_every_worker_holds_its_database_connection)
{
	pid_t w[MAX_WORKERS];
	char pidlist[64];
	const char *m;
	size_t nw;

	manager_open();
	tstack_pg_ctl("stop");
	pg_stopped = 1;
	own_start(2, sock_path, NULL);

	/* Listening, workers up, no database: starting, not ready. */
	cr_assert_str_eq(next(5), "STATUS=starting: 0 of 2 workers ready");
	m = next(1.5);
	cr_assert_str_eq(m, "", "\"%s\" while PostgreSQL is down", m);
	cr_assert(tstack_socket_accepts(own.sock));

	tstack_pg_ctl("start");
	pg_stopped = 0;
	expect_ready("starting", 2, "2 workers, 2 ready, 0 busy, 2 idle", 20);
	/* Each worker reported after its connection was up: both sessions
	 * are there the moment READY=1 arrives. */
	nw = tstack_workers(own.pid, w, MAX_WORKERS);
	cr_assert_eq(nw, 2);
	snprintf(pidlist, sizeof(pidlist), "%ld,%ld", (long)w[0], (long)w[1]);
	cr_assert_eq(tstack_count("SELECT count(*) FROM pg_stat_activity "
	                          "WHERE application_name ~ '-worker-[0-9]+$' "
	                          "AND substring(application_name from '[0-9]+$') = "
	                          "ANY (string_to_array($1, ','))",
	                          pidlist),
	             2, "READY=1 before both workers had a session");
	m = next(0.3);
	cr_assert_str_eq(m, "", "\"%s\" after READY=1 with nothing changed", m);
}

Test(notify, reload_stop_and_the_watchdog)
{
	const char *m;
	double gap_min = 1e9, gap_max = 0, first;

	manager_open();
	own_start(2, sock_path, "1000000");
	cr_assert_str_eq(next(5), "STATUS=starting: 0 of 2 workers ready");
	expect_ready("starting", 2, "2 workers, 2 ready, 0 busy, 2 idle", 10);
	cr_assert(tstack_file_contains(own.log, "msg=\"notifying the service manager\" "
	                                        "watchdog_usec=1000000"));

	/* Nothing changes for 3 s: only the watchdog speaks, every 0.5 s. */
	first = npings;
	m = next(3);
	cr_assert_str_eq(m, "", "\"%s\" while nothing changed", m);
	cr_assert_geq(npings, 6, "%d pings in 3 s or more (WATCHDOG_USEC=1000000)", npings);
	for (int i = 1; i < npings; i++) {
		double gap = pings[i] - pings[i - 1];
		gap_min = gap < gap_min ? gap : gap_min;
		gap_max = gap > gap_max ? gap : gap_max;
	}
	cr_log_info("%d pings (%.0f before the quiet 3 s); gaps %.3f .. %.3f s", npings, first,
	            gap_min, gap_max);
	cr_assert_lt(gap_max, 1.0, "a ping came %.3f s after the previous one", gap_max);
	cr_assert_gt(gap_min, 0.45, "pings %.3f s apart: more often than half the period", gap_min);

	/* SIGHUP with a bad value: refused, the old workers ready again at
	 * once, and the status line says so until a reload is taken. */
	conf_write_raw("many");
	expect_reloading();
	cr_assert_str_eq(next(5), "READY=1\nSTATUS=2 workers, 2 ready, 0 busy, 2 idle; reload "
	                          "failed, running the previous configuration");

	/* SIGHUP, with one more worker: reloading until all three are ready. */
	conf_write(3);
	expect_reloading();
	expect_ready("reloading", 3, "3 workers, 3 ready, 0 busy, 3 idle", 20);
	cr_assert(tstack_wait_workers(own.pid, 3, 10000), "the replaced workers did not exit");

	/* SIGTERM: stopping, counted down to none; nothing after. */
	cr_assert_eq(kill(own.pid, SIGTERM), 0);
	cr_assert_str_eq(next(5), "STOPPING=1\nSTATUS=stopping: 3 workers left");
	int left = 3, status;
	while (left > 0) {
		int k, end = 0;
		m = next(10);
		cr_assert(sscanf(m, "STATUS=stopping: %d workers left%n", &k, &end) == 1 &&
		              m[end] == '\0',
		          "\"%s\" while stopping", m);
		cr_assert_lt(k, left, "\"%s\" after %d left", m, left);
		left = k;
	}
	cr_assert_eq(waitpid(own.pid, &status, 0), own.pid);
	own.pid = 0;
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status 0x%x", status);
	struct dgram d;
	cr_assert_eq(manager_recv(&d, 200), 0, "\"%s\" after the supervisor exited", d.text);
}

Test(notify, an_abstract_socket_name_is_reached_and_without_one_nothing_is_said)
{
	char name[64];
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	int on = 1;

	/* @name: systemd's abstract form. */
	snprintf(name, sizeof(name), "@idemflow-test-notify-%ld", (long)getpid());
	memcpy(sun.sun_path + 1, name + 1, strlen(name) - 1);
	manager = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	cr_assert(manager >= 0);
	cr_assert_eq(bind(manager, (struct sockaddr *)&sun,
	                  (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(name))),
	             0, "%s", strerror(errno));
	cr_assert_eq(setsockopt(manager, SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)), 0);
	own_start(1, name, NULL);
	cr_assert_str_eq(next(5), "STATUS=starting: 0 of 1 workers ready");
	expect_ready("starting", 1, "1 workers, 1 ready, 0 busy, 1 idle", 10);
	tstack_pool_kill(&own, SIGKILL);

	/* No NOTIFY_SOCKET: not a word of it, in the log or on the socket. */
	own_start(1, NULL, "1000000");
	struct http_response *r = http_fcgi_request(own.sock, "GET", "/healthz", NULL, NULL, 0);
	cr_assert_not_null(r, "%s", http_error());
	cr_assert_eq(r->status, 204);
	http_response_free(r);
	cr_assert(!tstack_file_contains(own.log, "service manager"), "see %s", own.log);
	struct dgram d;
	cr_assert_eq(manager_recv(&d, 300), 0, "\"%s\" without NOTIFY_SOCKET", d.text);
}
