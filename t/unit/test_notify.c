/*
 * test_notify.c - systemd's notification protocol as notify.c speaks it,
 * against a datagram socket of the test's own (a path and an abstract
 * name): nothing without NOTIFY_SOCKET, the exact datagrams, STATUS sent
 * only when it changes, MONOTONIC_USEC with RELOADING=1, the watchdog's
 * half period and WATCHDOG_PID, and a worker's readiness report reaching
 * the supervisor with SIGIO.
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

#include "server/notify.h"

static int listener = -1;
static char path[108];

/* Bind a datagram socket at name ('@' = abstract) and point NOTIFY_SOCKET at it. */
static void fake_manager(const char *name)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(name));

	memcpy(sun.sun_path, name, strlen(name));
	if (name[0] == '@')
		sun.sun_path[0] = '\0';
	else
		len++;
	listener = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	cr_assert(listener >= 0);
	cr_assert_eq(bind(listener, (struct sockaddr *)&sun, len), 0, "bind %s: %s", name,
	             strerror(errno));
	cr_assert_eq(setenv("NOTIFY_SOCKET", name, 1), 0);
}

static void at_path(void)
{
	snprintf(path, sizeof(path), "/tmp/idemflow-notify-%ld.sock", (long)getpid());
	unlink(path);
	fake_manager(path);
}

static void teardown(void)
{
	notify_close();
	if (listener >= 0)
		close(listener);
	if (path[0])
		unlink(path);
}

/* The next datagram within ms, or "" when none came. */
static const char *next_msg(int ms)
{
	static char buf[1024];
	struct pollfd p = { .fd = listener, .events = POLLIN };
	ssize_t n;

	buf[0] = '\0';
	if (poll(&p, 1, ms) != 1)
		return buf;
	n = recv(listener, buf, sizeof(buf) - 1, 0);
	cr_assert(n >= 0);
	buf[n] = '\0';
	return buf;
}

static unsigned long long now_usec(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000;
}

TestSuite(notify, .fini = teardown);

Test(notify, without_notify_socket_nothing_is_sent_and_nothing_is_opened)
{
	const char *why = "unset";

	unsetenv("NOTIFY_SOCKET");
	setenv("WATCHDOG_USEC", "1000000", 1);
	cr_assert_eq(notify_open(&why), 0);
	cr_assert_null(why);
	cr_assert_eq(notify_enabled(), 0);
	cr_assert_eq(notify_send("READY=1", "x"), -1);
	cr_assert_eq(errno, ENOTCONN);
	cr_assert_eq(notify_watchdog_wait_us(), -1);
	cr_assert_eq(notify_worker_listened(), 0);
	notify_worker_ready(); /* nothing to write to: no crash, no effect */
	cr_assert_null(getenv("WATCHDOG_USEC"));
}

Test(notify, a_name_that_is_neither_a_path_nor_abstract_is_refused_with_a_reason)
{
	const char *why = NULL;

	setenv("NOTIFY_SOCKET", "run/notify", 1);
	cr_assert_eq(notify_open(&why), 0);
	cr_assert_not_null(why);
	cr_assert_eq(notify_enabled(), 0);
}

Test(notify, datagrams_are_the_exact_assignments_and_status_only_when_it_changes)
{
	unsigned long long before, mono;
	const char *m;

	at_path();
	cr_assert_eq(notify_open(NULL), 1);
	cr_assert_null(getenv("NOTIFY_SOCKET"), "left in the environment for the workers");
	cr_assert_eq(notify_send(NULL, "starting: %d of %d workers ready", 0, 2), 0);
	cr_assert_str_eq(next_msg(1000), "STATUS=starting: 0 of 2 workers ready");
	cr_assert_eq(notify_send(NULL, "starting: %d of %d workers ready", 0, 2), 0);
	cr_assert_str_eq(next_msg(100), "", "an unchanged STATUS was sent again");
	cr_assert_eq(notify_send("READY=1", "%d workers, %d ready", 2, 2), 0);
	cr_assert_str_eq(next_msg(1000), "READY=1\nSTATUS=2 workers, 2 ready");
	/* A state is always sent, with its status even when unchanged. */
	cr_assert_eq(notify_send("STOPPING=1", "2 workers, 2 ready"), 0);
	cr_assert_str_eq(next_msg(1000), "STOPPING=1\nSTATUS=2 workers, 2 ready");

	before = now_usec();
	cr_assert_eq(notify_send("RELOADING=1", "reloading the configuration"), 0);
	m = next_msg(1000);
	cr_assert_eq(sscanf(m, "RELOADING=1\nMONOTONIC_USEC=%llu\n", &mono), 1, "%s", m);
	cr_assert(mono >= before && mono <= now_usec(), "MONOTONIC_USEC=%llu, not now", mono);
	cr_assert_not_null(strstr(m, "\nSTATUS=reloading the configuration"), "%s", m);
}

Test(notify, an_abstract_name_is_reached_too)
{
	char name[64];

	path[0] = '\0';
	snprintf(name, sizeof(name), "@idemflow-notify-test-%ld", (long)getpid());
	fake_manager(name);
	cr_assert_eq(notify_open(NULL), 1);
	cr_assert_eq(notify_send("READY=1", "1 workers, 1 ready"), 0);
	cr_assert_str_eq(next_msg(1000), "READY=1\nSTATUS=1 workers, 1 ready");
}

Test(notify, the_watchdog_pings_every_half_period_for_its_own_pid_only)
{
	char pid[32];
	long long wait;

	at_path();
	setenv("WATCHDOG_USEC", "400000", 1);
	snprintf(pid, sizeof(pid), "%ld", (long)getpid());
	setenv("WATCHDOG_PID", pid, 1);
	cr_assert_eq(notify_open(NULL), 1);
	cr_assert_eq(notify_watchdog_usec(), 400000);
	cr_assert_eq(notify_watchdog_wait_us(), 0, "the first ping is due at once");
	notify_watchdog();
	cr_assert_str_eq(next_msg(1000), "WATCHDOG=1");
	wait = notify_watchdog_wait_us();
	cr_assert(wait > 150000 && wait <= 200000, "next ping in %lld us, want 200000", wait);
	notify_watchdog(); /* not due: nothing */
	cr_assert_str_eq(next_msg(50), "");

	/* Another process's watchdog (WATCHDOG_PID): none here. */
	setenv("NOTIFY_SOCKET", path, 1);
	setenv("WATCHDOG_USEC", "400000", 1);
	setenv("WATCHDOG_PID", "1", 1);
	cr_assert_eq(notify_open(NULL), 1);
	cr_assert_eq(notify_watchdog_usec(), 0);
	cr_assert_eq(notify_watchdog_wait_us(), -1);
}

static volatile sig_atomic_t got_io;

static void on_io(int sig)
{
	(void)sig;
	got_io = 1;
}

Test(notify, a_workers_readiness_report_wakes_the_supervisor_with_its_pid)
{
	struct sigaction sa = { .sa_handler = on_io };
	pid_t child, pids[8];
	int status;

	sigemptyset(&sa.sa_mask);
	sigaction(SIGIO, &sa, NULL);
	at_path();
	cr_assert_eq(notify_open(NULL), 1);
	cr_assert_eq(notify_ready_reports(pids, 8), 0, "a report before any worker");
	child = fork();
	cr_assert(child >= 0);
	if (child == 0) {
		notify_forget();
		if (!notify_worker_listened() || notify_enabled())
			_exit(1);
		notify_worker_ready();
		notify_worker_ready(); /* once only */
		_exit(0);
	}
	/* SIGIO may interrupt the wait: that is the report arriving. */
	while (waitpid(child, &status, 0) < 0)
		cr_assert_eq(errno, EINTR, "waitpid: %s", strerror(errno));
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	for (int i = 0; i < 100 && !got_io; i++)
		usleep(10000);
	cr_assert(got_io, "no SIGIO for the report");
	cr_assert_eq(notify_ready_reports(pids, 8), 1);
	cr_assert_eq(pids[0], child);
	cr_assert_eq(notify_ready_reports(pids, 8), 0);
}
