/*
 * sink_exec.c - deliver an event by running a command.
 *
 * `/bin/sh -c CMD` gets the event JSON on stdin and a clean environment:
 * IDEMFLOW_EVENT_ID, IDEMFLOW_EVENT_TYPE, IDEMFLOW_WORKFLOW_ID and
 * IDEMFLOW_ATTEMPT, TRACEPARENT and TRACESTATE (the event's W3C trace
 * context, absent when it has none or the stored value is not valid), and
 * of the dispatcher's own only PATH (/usr/bin:/bin when unset), HOME, LANG,
 * LC_ALL and TZ. Nothing else: not the database's settings (PGSERVICE,
 * PGPASSWORD, DATABASE_URL, ...) nor whatever a unit file set. Exit 0 means
 * delivered; any other exit, a signal or running past `timeout` means "try
 * again later". The command runs in its own process group so a timeout
 * kills everything it started.
 */
#include "dispatch/sink.h"

#include "core/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* What the command inherits from the dispatcher's environment. */
static const char *const exec_kept_env[] = { "HOME", "LANG", "LC_ALL", "TZ" };
#define EXEC_KEPT    (sizeof(exec_kept_env) / sizeof(exec_kept_env[0]))
#define EXEC_ENV_MAX (7 + EXEC_KEPT)

struct exec_sink {
	struct sink base;
	char *cmd;
	long timeout_ms;
};

/* "name=value" in a new string, or NULL when out of memory. */
static char *env_pair(const char *name, const char *value)
{
	size_t nl = strlen(name), vl = strlen(value);
	char *p = malloc(nl + vl + 2);

	if (p != NULL) {
		memcpy(p, name, nl);
		p[nl] = '=';
		memcpy(p + nl + 1, value, vl + 1);
	}
	return p;
}

static void exec_env_free(char **envp)
{
	for (size_t i = 0; envp != NULL && envp[i] != NULL; i++)
		free(envp[i]);
	free(envp);
}

/*
 * The command's whole environment for ev, NULL-terminated (see the top of
 * the file); NULL when out of memory. Caller frees with exec_env_free().
 * Built before fork(): the child only execs.
 */
static char **exec_env(const struct sink_event *ev)
{
	char **envp = calloc(EXEC_ENV_MAX + 1, sizeof(*envp));
	char attempt[16], tid[TRACE_ID_LEN + 1], span[TRACE_SPAN_LEN + 1];
	const char *path = getenv("PATH");
	uint8_t flags;
	size_t n = 0;

	if (envp == NULL)
		return NULL;
	snprintf(attempt, sizeof(attempt), "%d", ev->attempt);
	if ((envp[n++] = env_pair("IDEMFLOW_EVENT_ID", ev->event_id)) == NULL ||
	    (envp[n++] = env_pair("IDEMFLOW_EVENT_TYPE", ev->type)) == NULL ||
	    (envp[n++] = env_pair("IDEMFLOW_WORKFLOW_ID", ev->workflow_id)) == NULL ||
	    (envp[n++] = env_pair("IDEMFLOW_ATTEMPT", attempt)) == NULL ||
	    (envp[n++] = env_pair("PATH", path && *path ? path : "/usr/bin:/bin")) == NULL)
		goto oom;
	for (size_t k = 0; k < EXEC_KEPT; k++) {
		const char *v = getenv(exec_kept_env[k]);

		if (v != NULL && (envp[n++] = env_pair(exec_kept_env[k], v)) == NULL)
			goto oom;
	}
	/* The trace context is the client's. The server checked it, but what
	 * the database holds is passed on only while still valid, so no stored
	 * byte reaches the command that a client could not have sent. */
	if (ev->traceparent != NULL &&
	    trace_parse_parent(ev->traceparent, tid, span, &flags) == 0) {
		if ((envp[n++] = env_pair("TRACEPARENT", ev->traceparent)) == NULL)
			goto oom;
		if (ev->tracestate != NULL &&
		    trace_state_valid(ev->tracestate, strlen(ev->tracestate)) &&
		    (envp[n++] = env_pair("TRACESTATE", ev->tracestate)) == NULL)
			goto oom;
	}
	return envp;
oom:
	exec_env_free(envp);
	return NULL;
}

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* Feed the payload to the child's stdin while it runs; returns when the
 * child exited (status in *st) or the deadline passed (-1). */
static int run_one(struct exec_sink *x, const struct sink_event *ev, char *const *envp, int *st,
                   char *why, size_t wlen)
{
	int in[2];
	pid_t pid;
	size_t off = 0;
	double deadline = now_ms() + (double)x->timeout_ms;
	if (pipe(in) < 0) {
		snprintf(why, wlen, "pipe: %s", strerror(errno));
		return -2;
	}
	pid = fork();
	if (pid < 0) {
		snprintf(why, wlen, "fork: %s", strerror(errno));
		close(in[0]);
		close(in[1]);
		return -2;
	}
	if (pid == 0) {
		setpgid(0, 0);
		dup2(in[0], STDIN_FILENO);
		close(in[0]);
		close(in[1]);
		signal(SIGPIPE, SIG_DFL);
		execle("/bin/sh", "sh", "-c", x->cmd, (char *)NULL, envp);
		_exit(127);
	}
	close(in[0]);
	fcntl(in[1], F_SETFL, O_NONBLOCK);
	for (;;) {
		pid_t w = waitpid(pid, st, WNOHANG);
		if (w == pid) {
			if (in[1] >= 0)
				close(in[1]);
			return 0;
		}
		double left = deadline - now_ms();
		if (left <= 0)
			break;
		if (in[1] >= 0 && off < ev->payload_len) {
			ssize_t n = write(in[1], ev->payload + off, ev->payload_len - off);
			if (n > 0)
				off += (size_t)n;
			else if (n < 0 && errno != EAGAIN && errno != EINTR) {
				close(in[1]); /* the command does not read its stdin: fine */
				in[1] = -1;
			}
		}
		if (in[1] >= 0 && off >= ev->payload_len) {
			close(in[1]);
			in[1] = -1;
		}
		struct pollfd p = { .fd = in[1], .events = POLLOUT };
		poll(in[1] >= 0 ? &p : NULL, in[1] >= 0 ? 1 : 0, left < 5 ? (int)left + 1 : 5);
	}
	kill(-pid, SIGKILL);
	waitpid(pid, st, 0);
	if (in[1] >= 0)
		close(in[1]);
	snprintf(why, wlen, "timeout after %ld ms", x->timeout_ms);
	return -1;
}

static int exec_deliver(struct sink *s, const struct sink_event *evs, size_t n,
                        struct sink_outcome *outs, struct err *e)
{
	struct exec_sink *x = (struct exec_sink *)s;

	for (size_t i = 0; i < n; i++) {
		struct sink_outcome *o = &outs[i];
		double t0 = now_ms();
		int st = 0, rc;

		o->retry_after_s = -1;
		o->error[0] = '\0';
		char **envp = exec_env(&evs[i]);

		if (envp == NULL) {
			snprintf(o->error, sizeof(o->error), "out of memory");
			o->result = SINK_RETRY;
			o->latency_ms = now_ms() - t0;
			continue;
		}
		rc = run_one(x, &evs[i], envp, &st, o->error, sizeof(o->error));
		exec_env_free(envp);
		o->latency_ms = now_ms() - t0;
		if (rc < 0) {
			o->result = SINK_RETRY;
			continue;
		}
		if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
			o->result = SINK_OK;
			o->status = 0;
		} else if (WIFEXITED(st)) {
			o->result = SINK_RETRY;
			o->status = WEXITSTATUS(st);
			snprintf(o->error, sizeof(o->error), "command exited with status %d",
			         o->status);
		} else {
			o->result = SINK_RETRY;
			o->status = 128 + WTERMSIG(st);
			snprintf(o->error, sizeof(o->error), "command killed by signal %d",
			         WTERMSIG(st));
		}
	}
	return 0;
}

static void exec_close(struct sink *s)
{
	struct exec_sink *x = (struct exec_sink *)s;

	if (x == NULL)
		return;
	free(x->cmd);
	free(x);
}

struct sink *sink_exec_open(const struct conf *c, struct err *e)
{
	struct exec_sink *x;

	if (c->exec == NULL || *c->exec == '\0') {
		err_set(e, ERR_CONFIG, "\"exec\" is required for sink exec: the command to run");
		return NULL;
	}
	x = calloc(1, sizeof(*x));
	if (x == NULL || (x->cmd = strdup(c->exec)) == NULL) {
		free(x);
		err_set(e, ERR_INTERNAL, "out of memory");
		return NULL;
	}
	x->timeout_ms = c->timeout;
	x->base.name = "exec";
	x->base.deliver = exec_deliver;
	x->base.close = exec_close;
	return &x->base;
}
