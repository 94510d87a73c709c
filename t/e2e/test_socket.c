/*
 * test_socket.c - idemflow-fcgi on a socket from systemd (a socket unit,
 * idemflow-fcgi.socket), played by the test: it binds and listens on a unix
 * socket of its own, keeps it open as systemd does, and starts a pool of
 * its own with the socket as descriptor 3, LISTEN_FDS=1 and LISTEN_PID:
 *  - the pool serves on that socket and binds nothing of its own (the
 *    configuration's listen path is never created);
 *  - stopped (SIGTERM), it leaves the socket's file in place;
 *  - a request sent while no server runs waits in the socket's queue and
 *    is answered by the next server: a restart refuses nothing;
 *  - LISTEN_PID naming another process is not for it: it binds listen.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "http.h"
#include "tlog.h"
#include "tstack.h"
#include "twait.h"

static struct tstack_pool own;
static char conf_path[600], unit_sock[108], conf_sock[108];
static int holder = -1; /* the socket unit's descriptor */

static void teardown(void)
{
	tstack_pool_kill(&own, SIGKILL);
	if (holder >= 0)
		close(holder);
	unlink(unit_sock);
	unlink(conf_sock);
}

/* What a socket unit does before any start: bind, listen, keep it. */
static void unit_listen(void)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };

	tstack_pool_paths(&own, "socket");
	snprintf(unit_sock, sizeof(unit_sock), "%s", own.sock);
	snprintf(conf_sock, sizeof(conf_sock), "%s/socket%ld-conf.sock",
	         tstack_env("IDEMFLOW_STACK_DIR"), (long)getpid());
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", unit_sock);
	unlink(unit_sock);
	holder = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert(holder >= 0, "socket: %s", strerror(errno));
	cr_assert(bind(holder, (struct sockaddr *)&sun, sizeof(sun)) == 0, "bind: %s",
	          strerror(errno));
	cr_assert(listen(holder, 128) == 0, "listen: %s", strerror(errno));
}

/* Our configuration: the harness's, but listen on a path of the test's. */
static void conf_write(void)
{
	FILE *in = fopen(tstack_env("IDEMFLOW_CONF"), "r"), *out;
	char line[1024];

	snprintf(conf_path, sizeof(conf_path), "%s/socket%ld.conf",
	         tstack_env("IDEMFLOW_STACK_DIR"), (long)getpid());
	out = fopen(conf_path, "w");
	cr_assert(in != NULL && out != NULL, "%s", strerror(errno));
	while (fgets(line, sizeof(line), in))
		if (strncmp(line, "workers", 7) != 0 && strncmp(line, "listen", 6) != 0)
			fputs(line, out);
	fprintf(out, "workers = 2\nlisten = %s\n", conf_sock);
	fclose(in);
	fclose(out);
}

/* Start the pool as systemd starts a socket-activated service: the socket
 * as descriptor 3, LISTEN_FDS=1, LISTEN_PID = the server's own pid (or
 * another one when pid_offset is not 0). Waits until both workers run. */
static void server_start(int pid_offset)
{
	const char *fcgi = tstack_env("IDEMFLOW_FCGI");
	pid_t pid;

	unlink(own.pidfile);
	fflush(NULL);
	pid = fork();
	cr_assert(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		char lpid[32];
		int log = open(own.log, O_WRONLY | O_CREAT | O_APPEND, 0644);

		prctl(PR_SET_PDEATHSIG, SIGTERM);
		setpgid(0, 0);
		if (log >= 0) {
			dup2(log, STDOUT_FILENO);
			dup2(log, STDERR_FILENO);
		}
		dup2(holder, 3); /* dup2 clears FD_CLOEXEC on the copy */
		snprintf(lpid, sizeof(lpid), "%ld", (long)getpid() + pid_offset);
		setenv("LISTEN_PID", lpid, 1);
		setenv("LISTEN_FDS", "1", 1);
		execl(fcgi, fcgi, "--config", conf_path, "--pid-file", own.pidfile, (char *)NULL);
		_exit(127);
	}
	own.pid = pid;
	cr_assert(tstack_wait_workers(own.pid, 2, 15000), "no 2 workers; see %s", own.log);
	for (int i = 0; i < 500 && tstack_pidfile_read(own.pidfile) == 0; i++)
		tstack_sleep_ms(20);
	cr_assert_neq(tstack_pidfile_read(own.pidfile), 0, "no pid file; see %s", own.log);
}

/* SIGTERM to the supervisor; it exits 0 once its workers are gone. */
static void server_stop(void)
{
	int status = 0;

	cr_assert_eq(kill(own.pid, SIGTERM), 0);
	cr_assert_eq(waitpid(own.pid, &status, 0), own.pid);
	own.pid = 0;
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status 0x%x; see %s", status,
	          own.log);
}

static void expect_healthz(const char *sock, const char *when)
{
	struct http_response *r = http_fcgi_request(sock, "GET", "/healthz", NULL, NULL, 0);

	cr_assert_not_null(r, "%s: %s; see %s", when, http_error(), own.log);
	cr_assert_eq(r->status, 204, "%s: %d %s", when, r->status, r->body);
	http_response_free(r);
}

static void *request_thread(void *arg)
{
	(void)arg;
	return http_fcgi_request(unit_sock, "GET", "/healthz", NULL, NULL, 0);
}

TestSuite(socket, .timeout = 120, .fini = teardown);

Test(socket, served_on_the_socket_from_systemd_and_nothing_bound)
{
	struct stat st;

	unit_listen();
	conf_write();
	server_start(0);
	expect_healthz(unit_sock, "on the socket from systemd");
	cr_assert(stat(conf_sock, &st) < 0 && errno == ENOENT,
	          "listen = %s was bound: the socket from systemd must be the only one", conf_sock);
	cr_assert(
	    tstack_file_contains(own.log, "msg=\"listening on the socket from systemd\" fd=3"),
	    "no such line in %s", own.log);
}

Test(socket, a_request_sent_while_the_server_is_down_is_served_after_it_is_back)
{
	struct stat st;
	struct http_response *r = NULL;
	pthread_t t;

	unit_listen();
	conf_write();
	server_start(0);
	expect_healthz(unit_sock, "before the restart");
	server_stop();
	cr_assert(stat(unit_sock, &st) == 0 && S_ISSOCK(st.st_mode),
	          "the stopped server removed the socket unit's file %s", unit_sock);

	/* No server now: the connection waits in the socket's queue. */
	cr_assert_eq(pthread_create(&t, NULL, request_thread, NULL), 0);
	tstack_sleep_ms(500);
	cr_assert_eq(pthread_tryjoin_np(t, (void **)&r), EBUSY,
	             "the request was answered while no server ran");
	server_start(0);
	cr_assert_eq(pthread_join(t, (void **)&r), 0);
	cr_assert_not_null(r, "the queued request failed; see %s", own.log);
	cr_assert_eq(r->status, 204, "the queued request: %d %s", r->status, r->body);
	http_response_free(r);
	expect_healthz(unit_sock, "after the restart");
}

Test(socket, listen_pid_of_another_process_is_not_for_it)
{
	unit_listen();
	conf_write();
	server_start(1);
	expect_healthz(conf_sock, "on its own listen path");
	cr_assert(!tstack_file_contains(own.log, "socket from systemd"), "see %s", own.log);
}
