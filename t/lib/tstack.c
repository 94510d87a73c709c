/*
 * The stack's environment and processes; see tstack.h.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* asprintf, pipe2, open_memstream */
#endif
#include "tstack.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <criterion/options.h>
#include <libpq-fe.h>

#include "twait.h"

/* What the last CLI run wrote to stderr: quoted when it failed, and kept
 * out of the test log when it did not. */
static char tstack_cli_err[2048];

const char *tstack_cli_stderr(void)
{
	return tstack_cli_err;
}

const char *tstack_env(const char *name)
{
	const char *v = getenv(name);

	cr_assert(v && *v, "%s is not set: run this test through t/run-test", name);
	return v;
}

/* --- Configuration ----------------------------------------------------- */

static char *str_trim(char *s)
{
	char *end;

	while (isspace((unsigned char)*s))
		s++;
	end = s + strlen(s);
	while (end > s && isspace((unsigned char)end[-1]))
		*--end = '\0';
	return s;
}

int tstack_conf_get(const char *key, char *out, size_t outsz)
{
	const char *path = tstack_env("IDEMFLOW_CONF");
	FILE *f = fopen(path, "r");
	char line[1024];
	int found = 0;

	cr_assert_not_null(f, "cannot open %s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		char *hash = strchr(line, '#');
		char *eq, *k, *v;

		if (hash)
			*hash = '\0';
		eq = strchr(line, '=');
		if (!eq)
			continue;
		*eq = '\0';
		k = str_trim(line);
		v = str_trim(eq + 1);
		for (char *c = k; *c; c++)
			if (*c == '-')
				*c = '_';
		/* Later lines win, as in any key = value file. */
		if (strcmp(k, key) == 0) {
			snprintf(out, outsz, "%s", v);
			found = 1;
		}
	}
	fclose(f);
	return found;
}

/* "<digits><suffix>" with the suffix scaling from units (NULL-ended). */
static long conf_scaled(const char *key, const char *v, const char *const *suffixes,
                        const long *mult)
{
	char *end;
	long n = strtol(v, &end, 10);

	for (size_t i = 0; suffixes[i]; i++)
		if (end != v && strcmp(end, suffixes[i]) == 0)
			return n * mult[i];
	cr_assert_fail("cannot parse %s = %s in $IDEMFLOW_CONF", key, v);
	return 0;
}

long tstack_conf_ms(const char *key, long fallback_ms)
{
	static const char *const sfx[] = { "", "ms", "s", "m", "h", "d", NULL };
	static const long mult[] = { 1000, 1, 1000, 60000, 3600000, 86400000 };
	char v[128];

	if (!tstack_conf_get(key, v, sizeof(v)))
		return fallback_ms;
	return conf_scaled(key, v, sfx, mult);
}

long tstack_conf_long(const char *key, long fallback)
{
	static const char *const sfx[] = { "", "k", "K", "m", "M", NULL };
	static const long mult[] = { 1, 1024, 1024, 1048576, 1048576 };
	char v[128];

	if (!tstack_conf_get(key, v, sizeof(v)))
		return fallback;
	return conf_scaled(key, v, sfx, mult);
}

/* --- Admin CLI --------------------------------------------------------- */

/*
 * Over partitions (TSTACK_SHARDS): a token created on the test's partition
 * routes once the proxy's directory knows it. Syncs are serialised by a
 * lock on the directory's token table: two tests' syncs at once insert
 * the same rows, in whatever order each partition returns them.
 */
void tstack_shards_sync(void)
{
	const char *proxy = getenv("IDEMFLOW_PROXY_URL");
	PGconn *c;
	PGresult *res;

	if (proxy == NULL || *proxy == '\0')
		return;
	c = PQconnectdb(proxy);
	cr_assert_eq(PQstatus(c), CONNECTION_OK, "connect to IDEMFLOW_PROXY_URL: %s",
	             PQerrorMessage(c));
	res = PQexec(c, "BEGIN;"
	                " LOCK TABLE idemflow_token_tenants IN SHARE ROW EXCLUSIVE MODE;"
	                " SELECT idemflow_directory_sync();"
	                " COMMIT");
	cr_assert_eq(PQresultStatus(res), PGRES_COMMAND_OK, "idemflow_directory_sync(): %s",
	             PQerrorMessage(c));
	PQclear(res);
	PQfinish(c);
}

/*
 * fork/exec rather than popen: DATABASE_URL is a conninfo string with
 * spaces and quotes, and passing it as one argv element avoids quoting it
 * for a shell.
 */
int tstack_cli(char *out, size_t outsz, const char *arg, ...)
{
	const char *argv[32];
	size_t argc = 0, len = 0;
	int pipefd[2], status;
	FILE *errf;
	va_list ap;
	pid_t pid;

	argv[argc++] = tstack_env("IDEMFLOW_CLI");
	argv[argc++] = "--db";
	argv[argc++] = tstack_env("DATABASE_URL");
	va_start(ap, arg);
	for (const char *a = arg; a; a = va_arg(ap, const char *)) {
		cr_assert(argc < sizeof(argv) / sizeof(argv[0]) - 1);
		argv[argc++] = a;
	}
	va_end(ap);
	argv[argc] = NULL;

	errf = tmpfile();
	cr_assert_not_null(errf, "tmpfile: %s", strerror(errno));
	cr_assert_eq(pipe2(pipefd, O_CLOEXEC), 0, "pipe: %s", strerror(errno));
	fflush(NULL);
	pid = fork();
	cr_assert(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		dup2(pipefd[1], STDOUT_FILENO);
		dup2(fileno(errf), STDERR_FILENO);
		execv(argv[0], (char *const *)argv);
		fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	close(pipefd[1]);
	for (;;) {
		char chunk[512];
		ssize_t n = read(pipefd[0], chunk, sizeof(chunk));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		/* Keep what fits; the rest is drained so the child never
		 * blocks on a full pipe. */
		for (ssize_t i = 0; i < n && len + 1 < outsz; i++)
			out[len++] = chunk[i];
	}
	close(pipefd[0]);
	if (outsz)
		out[len] = '\0';
	while (len > 0 && (out[len - 1] == '\n' || out[len - 1] == '\r'))
		out[--len] = '\0';
	while (waitpid(pid, &status, 0) < 0)
		cr_assert_eq(errno, EINTR, "waitpid: %s", strerror(errno));
	rewind(errf);
	len = fread(tstack_cli_err, 1, sizeof(tstack_cli_err) - 1, errf);
	tstack_cli_err[len] = '\0';
	fclose(errf);
	status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
	for (size_t i = 3; status == 0 && i < argc; i++)
		if (strcmp(argv[i], "token") == 0) {
			tstack_shards_sync();
			break;
		}
	return status;
}

/* --- Processes --------------------------------------------------------- */

/* State and parent from /proc/<pid>/stat; 0 when the process is gone. */
static int proc_stat(pid_t pid, char *state, pid_t *ppid)
{
	char path[64], line[1024], *rp;
	FILE *f;
	long pp;
	int ok;

	snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	ok = fgets(line, sizeof(line), f) != NULL;
	fclose(f);
	/* comm may contain spaces and parentheses: parse after the last ')' */
	rp = ok ? strrchr(line, ')') : NULL;
	if (!rp || sscanf(rp + 1, " %c %ld", state, &pp) != 2)
		return 0;
	*ppid = (pid_t)pp;
	return 1;
}

pid_t tstack_supervisor_pid(void)
{
	const char *path = tstack_env("IDEMFLOW_FCGI_PIDFILE");
	FILE *f = fopen(path, "r");
	long pid = 0;

	cr_assert_not_null(f, "cannot open %s: %s", path, strerror(errno));
	cr_assert_eq(fscanf(f, "%ld", &pid), 1, "no pid in %s", path);
	fclose(f);
	cr_assert(pid > 1, "bad pid %ld in %s", pid, path);
	return (pid_t)pid;
}

/* A live child of supervisor: not a zombie the supervisor has yet to
 * reap. */
static int live_child(pid_t pid, pid_t supervisor)
{
	char state;
	pid_t ppid;

	return proc_stat(pid, &state, &ppid) && ppid == supervisor && state != 'Z' && state != 'X';
}

/*
 * The supervisor's children in one read of its task's children list. A
 * walk of /proc instead runs in pid order while workers come and go; once
 * pids wrap, a worker forked with a pid the walk has passed is missed
 * while the one it replaces is already a zombie. The list is no snapshot
 * either: the kernel writes it one child at a time, and a child reaped
 * between two steps shifts the list, so the next one is skipped. While
 * workers come and go, a reading can be short: poll until it shows the
 * state waited for, and never take a low reading as proof that the pool
 * shrank (test_reload counts the pool from the supervisor's log). The
 * walk stays as the fallback for kernels without the list.
 */
size_t tstack_workers(pid_t supervisor, pid_t *out, size_t max)
{
	char path[64], list[8192];
	size_t n = 0, len = 0;
	ssize_t got;
	int fd;

	snprintf(path, sizeof(path), "/proc/%ld/task/%ld/children", (long)supervisor,
	         (long)supervisor);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		while (len < sizeof(list) - 1 &&
		       (got = read(fd, list + len, sizeof(list) - 1 - len)) > 0)
			len += (size_t)got;
		close(fd);
		list[len] = '\0';
		for (char *p = list, *end; *p; p = end) {
			long pid = strtol(p, &end, 10);

			if (end == p)
				break;
			if (pid > 0 && live_child((pid_t)pid, supervisor)) {
				if (n < max)
					out[n] = (pid_t)pid;
				n++;
			}
		}
		return n;
	}

	DIR *d = opendir("/proc");
	struct dirent *e;

	cr_assert_not_null(d, "opendir /proc: %s", strerror(errno));
	while ((e = readdir(d))) {
		char *end;
		long pid = strtol(e->d_name, &end, 10);

		if (*end || pid <= 0 || !live_child((pid_t)pid, supervisor))
			continue;
		if (n < max)
			out[n] = (pid_t)pid;
		n++;
	}
	closedir(d);
	return n;
}

int tstack_pid_gone(pid_t pid)
{
	char state;
	pid_t ppid;

	if (kill(pid, 0) < 0 && errno == ESRCH)
		return 1;
	/* Exited but not yet reaped by a parent that is not us. */
	return !proc_stat(pid, &state, &ppid) || state == 'Z' || state == 'X';
}

void tstack_pg_ctl(const char *action)
{
	char cmd[2048];
	int rc;

	snprintf(cmd, sizeof(cmd),
	         "cd / && %s '%s/pg_ctl' -D '%s' -l '%s' -m fast -w -t 60 %s >/dev/null 2>&1",
	         geteuid() == 0 ? "runuser -u postgres --" : "", tstack_env("IDEMFLOW_PG_BINDIR"),
	         tstack_env("IDEMFLOW_PG_DATA"), tstack_env("IDEMFLOW_PG_LOG"), action);
	rc = system(cmd);
	cr_assert_eq(rc, 0, "pg_ctl %s failed: %d", action, rc);
}

void tstack_sequential_hook(void *test_set)
{
	(void)test_set;
	criterion_options.jobs = 1;
}

/* The runner's failure before any test: no Criterion context to assert in. */
static void settings_fail(const char *what, const char *detail)
{
	fprintf(stderr, "TSTACK_SETTINGS: %s: %s\n", what, detail);
	exit(1);
}

void tstack_settings_hook(const char *lines)
{
	const char *conf = getenv("IDEMFLOW_CONF"), *pidfile = getenv("IDEMFLOW_FCGI_PIDFILE");
	const char *log = getenv("IDEMFLOW_FCGI_LOG");
	pid_t sup, old[64], cur[64];
	size_t nold, size = 0;
	double deadline;
	FILE *f;

	if (conf == NULL || pidfile == NULL)
		return; /* not under t/run-test: --list, --help */
	sup = (pid_t)tstack_pidfile_read(pidfile);
	if (sup <= 0)
		settings_fail("no supervisor pid", pidfile);
	/* Let the first reading settle: a pool still starting is short. */
	deadline = tstack_now() + 60;
	while ((nold = tstack_workers(sup, old, 64)) == 0 || nold > 64) {
		if (tstack_now() > deadline)
			settings_fail("the pool has no workers", log ? log : "");
		tstack_sleep_ms(50);
	}
	f = fopen(conf, "a");
	if (f == NULL)
		settings_fail(conf, strerror(errno));
	fprintf(f, "# TSTACK_SETTINGS\n%s", lines);
	fclose(f);
	size = (size_t)tstack_conf_long("workers", 0);
	if (kill(sup, SIGHUP) < 0)
		settings_fail("SIGHUP", strerror(errno));
	/* Done when every old worker is gone (a pid is asked about, not
	 * looked for in a list) and the pool reads its size again. */
	deadline = tstack_now() + 60;
	for (;;) {
		size_t left = 0, n;

		for (size_t i = 0; i < nold; i++)
			left += !tstack_pid_gone(old[i]);
		n = tstack_workers(sup, cur, 64);
		if (left == 0 && n == size)
			return;
		if (tstack_now() > deadline)
			settings_fail("the pool did not reload with the settings", log ? log : "");
		tstack_sleep_ms(50);
	}
}

int tstack_socket_accepts(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int ok;

	if (fd < 0)
		return 0;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	close(fd);
	return ok;
}

long tstack_pidfile_read(const char *path)
{
	FILE *f = fopen(path, "r");
	long pid = 0;

	if (!f)
		return 0;
	if (fscanf(f, "%ld", &pid) != 1)
		pid = 0;
	fclose(f);
	return pid;
}

/* 1 when every thread of pid is stopped (state T or t), else 0. */
static int all_threads_stopped(pid_t pid)
{
	char path[64], buf[512];
	struct dirent *de;
	DIR *d;
	int n = 0, stopped = 0;

	snprintf(path, sizeof(path), "/proc/%ld/task", (long)pid);
	d = opendir(path);
	if (d == NULL)
		return 0;
	while ((de = readdir(d)) != NULL) {
		char tpath[sizeof(path) + sizeof(de->d_name) + 8];
		const char *p;
		FILE *f;

		if (de->d_name[0] == '.')
			continue;
		snprintf(tpath, sizeof(tpath), "%s/%s/stat", path, de->d_name);
		f = fopen(tpath, "r");
		if (f == NULL)
			continue;
		n++;
		/* "pid (comm) S ...": the state follows the last ')'. */
		if (fgets(buf, sizeof(buf), f) != NULL && (p = strrchr(buf, ')')) != NULL &&
		    (p[2] == 'T' || p[2] == 't'))
			stopped++;
		fclose(f);
	}
	closedir(d);
	return n > 0 && stopped == n;
}

void tstack_stop_process(pid_t pid)
{
	double until = tstack_now() + 5;

	cr_assert_eq(kill(pid, SIGSTOP), 0, "SIGSTOP %ld: %s", (long)pid, strerror(errno));
	while (!all_threads_stopped(pid)) {
		cr_assert(tstack_now() < until, "process %ld not stopped 5 s after SIGSTOP",
		          (long)pid);
		usleep(1000);
	}
}

/*
 * Sanitizer builds: Criterion's runner (the process that starts one
 * process per test, and runs no test code itself) leaks a 48-byte block
 * of its own when it runs tests in parallel, which LeakSanitizer reports
 * as the runner exits. The runtime calls this hook, by its name, before
 * that check: the runner skips it, every test process keeps it. Test
 * processes are re-executed by Criterion's BoxFort with BXFI_MAP in their
 * environment, which is how they are told apart (Criterion 2.4); the
 * programs that tests start are other binaries, without this hook.
 */
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void)
{
	return getenv("BXFI_MAP") == NULL;
}

void tstack_pool_paths(struct tstack_pool *p, const char *tag)
{
	const char *dir = tstack_env("IDEMFLOW_STACK_DIR");
	long pid = (long)getpid();
	int a, b, c;

	memset(p, 0, sizeof(*p));
	a = snprintf(p->sock, sizeof(p->sock), "%s/%s%ld-fcgi.sock", dir, tag, pid);
	b = snprintf(p->pidfile, sizeof(p->pidfile), "%s/%s%ld-fcgi.pid", dir, tag, pid);
	c = snprintf(p->log, sizeof(p->log), "%s/%s%ld-fcgi.log", dir, tag, pid);
	cr_assert(a > 0 && (size_t)a < sizeof(p->sock) && b > 0 && (size_t)b < sizeof(p->pidfile) &&
	              c > 0 && (size_t)c < sizeof(p->log),
	          "paths too long under %s", dir);
}

pid_t tstack_spawn(const char *const *argv, const char *log)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	cr_assert(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		prctl(PR_SET_PDEATHSIG, SIGTERM);
		setpgid(0, 0);
		if (fd >= 0) {
			dup2(fd, STDOUT_FILENO);
			dup2(fd, STDERR_FILENO);
		}
		execvp(argv[0], (char *const *)argv);
		fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	return pid;
}

void tstack_pool_run(struct tstack_pool *p, const char *const *argv, long timeout_ms)
{
	double deadline;

	p->pid = tstack_spawn(argv, p->log);
	deadline = tstack_now() + (double)timeout_ms / 1e3;
	while (!tstack_socket_accepts(p->sock) || tstack_pidfile_read(p->pidfile) == 0) {
		int status = 0;

		cr_assert(waitpid(p->pid, &status, WNOHANG) == 0,
		          "%s exited during startup, status 0x%x; see %s", argv[0], status, p->log);
		cr_assert(tstack_now() < deadline, "%s not ready within %ld ms; see %s", argv[0],
		          timeout_ms, p->log);
		tstack_sleep_ms(20);
	}
}

void tstack_pool_kill(struct tstack_pool *p, int sig)
{
	if (p->pid <= 0)
		return;
	kill(-p->pid, sig);
	waitpid(p->pid, NULL, 0);
	p->pid = 0;
}
