/* notify.c - systemd notifications and the workers' readiness reports (see notify.h). */
#include "server/notify.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static int sock_fd = -1;
static struct sockaddr_un dest;
static socklen_t dest_len;
static int ready_pipe[2] = { -1, -1 }; /* [0] the supervisor reads, [1] workers write */
static int ready_sent;                 /* this worker reported already */
static unsigned long long wd_usec;     /* 0: no watchdog */
static unsigned long long wd_last;     /* CLOCK_MONOTONIC of the last WATCHDOG=1, in us */
static char last_status[256];

static unsigned long long monotonic_usec(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000;
}

/* A decimal number filling all of s, or 0 when s is not one. */
static unsigned long long parse_u64(const char *s)
{
	char *end;
	unsigned long long v;

	if (s == NULL || *s < '0' || *s > '9')
		return 0;
	errno = 0;
	v = strtoull(s, &end, 10);
	return errno == 0 && *end == '\0' ? v : 0;
}

/* The watchdog systemd set up for this process, if any (sd_watchdog_enabled). */
static unsigned long long watchdog_from_env(void)
{
	unsigned long long usec = parse_u64(getenv("WATCHDOG_USEC"));
	const char *pid = getenv("WATCHDOG_PID");

	if (pid != NULL && parse_u64(pid) != (unsigned long long)getpid())
		return 0;
	return usec;
}

/* dest from NOTIFY_SOCKET's value; -1 with *why when it is not usable. */
static int address_from(const char *name, const char **why)
{
	size_t len = strlen(name);

	memset(&dest, 0, sizeof(dest));
	dest.sun_family = AF_UNIX;
	if (name[0] != '/' && name[0] != '@') {
		*why = "NOTIFY_SOCKET is neither a path nor an abstract name (@...)";
		return -1;
	}
	if (len < 2 || len >= sizeof(dest.sun_path)) {
		*why = "NOTIFY_SOCKET is too short or too long";
		return -1;
	}
	memcpy(dest.sun_path, name, len);
	if (name[0] == '@') {
		/* Abstract: a leading NUL, and the length says where it ends. */
		dest.sun_path[0] = '\0';
		dest_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
	} else {
		dest_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + 1);
	}
	return 0;
}

static int open_pipe(void)
{
	if (pipe2(ready_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
		return -1;
	/* Signal-driven: a report wakes the supervisor from sigsuspend(). */
	if (fcntl(ready_pipe[0], F_SETOWN, getpid()) < 0 ||
	    fcntl(ready_pipe[0], F_SETFL, fcntl(ready_pipe[0], F_GETFL) | O_ASYNC) < 0) {
		close(ready_pipe[0]);
		close(ready_pipe[1]);
		ready_pipe[0] = ready_pipe[1] = -1;
		return -1;
	}
	return 0;
}

int notify_open(const char **why)
{
	const char *name = getenv("NOTIFY_SOCKET");
	const char *dummy;

	if (why == NULL)
		why = &dummy;
	*why = NULL;
	notify_close();
	if (name == NULL || *name == '\0')
		goto off;
	if (address_from(name, why) < 0)
		goto off;
	sock_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (sock_fd < 0 || open_pipe() < 0) {
		*why = "could not make a socket or a pipe";
		notify_close();
		goto off;
	}
	wd_usec = watchdog_from_env();
	wd_last = 0;
	last_status[0] = '\0';
	ready_sent = 0;
off:
	/* As sd_notify(unset_environment=1): the workers never speak for
	 * the service, nor would anything they might start. */
	unsetenv("NOTIFY_SOCKET");
	unsetenv("WATCHDOG_USEC");
	unsetenv("WATCHDOG_PID");
	return sock_fd >= 0;
}

int notify_enabled(void)
{
	return sock_fd >= 0;
}

void notify_close(void)
{
	if (sock_fd >= 0)
		close(sock_fd);
	for (int i = 0; i < 2; i++)
		if (ready_pipe[i] >= 0)
			close(ready_pipe[i]);
	sock_fd = ready_pipe[0] = ready_pipe[1] = -1;
	wd_usec = 0;
}

void notify_forget(void)
{
	if (sock_fd >= 0)
		close(sock_fd);
	if (ready_pipe[0] >= 0)
		close(ready_pipe[0]);
	sock_fd = ready_pipe[0] = -1;
	wd_usec = 0;
}

static int send_text(const char *text, size_t len)
{
	ssize_t n;

	if (sock_fd < 0) {
		errno = ENOTCONN;
		return -1;
	}
	/* Never wait for the service manager: a full queue drops the
	 * message (the next change sends the state again). */
	n = sendto(sock_fd, text, len, MSG_DONTWAIT | MSG_NOSIGNAL, (const struct sockaddr *)&dest,
	           dest_len);
	return n == (ssize_t)len ? 0 : -1;
}

int notify_send(const char *state, const char *status_fmt, ...)
{
	char status[sizeof(last_status)], msg[512];
	va_list ap;
	int n = 0;

	if (sock_fd < 0) {
		errno = ENOTCONN;
		return -1;
	}
	va_start(ap, status_fmt);
	vsnprintf(status, sizeof(status), status_fmt, ap);
	va_end(ap);
	if (state == NULL && strcmp(status, last_status) == 0)
		return 0;
	if (state != NULL && strcmp(state, "RELOADING=1") == 0)
		n = snprintf(msg, sizeof(msg), "%s\nMONOTONIC_USEC=%llu\n", state,
		             monotonic_usec());
	else if (state != NULL)
		n = snprintf(msg, sizeof(msg), "%s\n", state);
	n += snprintf(msg + n, sizeof(msg) - (size_t)n, "STATUS=%s", status);
	if (send_text(msg, strlen(msg)) < 0)
		return -1;
	memcpy(last_status, status, sizeof(last_status));
	return 0;
}

unsigned long long notify_watchdog_usec(void)
{
	return sock_fd >= 0 ? wd_usec : 0;
}

long long notify_watchdog_wait_us(void)
{
	unsigned long long now, due;

	if (sock_fd < 0 || wd_usec == 0)
		return -1;
	/* Half the period, as sd_watchdog_enabled(3) advises. */
	due = wd_last + wd_usec / 2;
	now = monotonic_usec();
	return wd_last == 0 || now >= due ? 0 : (long long)(due - now);
}

void notify_watchdog(void)
{
	static const char ping[] = "WATCHDOG=1";

	if (notify_watchdog_wait_us() != 0)
		return;
	wd_last = monotonic_usec();
	send_text(ping, sizeof(ping) - 1);
}

void notify_worker_ready(void)
{
	pid_t pid = getpid();

	if (ready_pipe[1] < 0 || ready_sent)
		return;
	ready_sent = 1;
	/* Four bytes, far below PIPE_BUF: written whole or not at all. */
	if (write(ready_pipe[1], &pid, sizeof(pid)) != (ssize_t)sizeof(pid))
		ready_sent = 0;
}

int notify_worker_listened(void)
{
	return ready_pipe[1] >= 0;
}

int notify_ready_reports(pid_t *pids, int max)
{
	ssize_t n;

	if (ready_pipe[0] < 0 || max <= 0)
		return 0;
	n = read(ready_pipe[0], pids, (size_t)max * sizeof(*pids));
	if (n <= 0)
		return 0;
	return (int)(n / (ssize_t)sizeof(*pids));
}
