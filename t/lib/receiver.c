/*
 * The test webhook receiver as a child process; see receiver.h.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pipe2, mkstemps */
#endif
#include "receiver.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <json-c/json.h>

#define RECEIVER_START_MS 10000 /* python3 start-up on a loaded machine */
#define RECEIVER_MAX_ARGS 32

static int fail(struct receiver *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(struct receiver *r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(r->error, sizeof(r->error), fmt, ap);
	va_end(ap);
	return -1;
}

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* The script: $top_srcdir (set by make check), $srcdir, or beside the binary. */
static int find_script(struct receiver *r, char *out, size_t outsz)
{
	static const char *const vars[] = { "top_srcdir", "srcdir" };
	char exe[PATH_MAX];
	ssize_t n;

	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		const char *d = getenv(vars[i]);

		if (d && *d && (size_t)snprintf(out, outsz, "%s/t/lib/receiver.py", d) < outsz &&
		    access(out, R_OK) == 0)
			return 0;
	}
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n > 0) {
		char *slash;

		exe[n] = '\0';
		slash = strrchr(exe, '/');
		if (slash)
			*slash = '\0';
		/* The test binaries live in t/<layer>/. */
		if ((size_t)snprintf(out, outsz, "%s/../../t/lib/receiver.py", exe) < outsz &&
		    access(out, R_OK) == 0)
			return 0;
	}
	return fail(r, "cannot find t/lib/receiver.py: set top_srcdir");
}

/* Read the first stdout line (the port) within the start-up deadline. */
static int read_port(struct receiver *r, int fd)
{
	char line[32];
	size_t len = 0;
	double deadline = now_ms() + RECEIVER_START_MS;

	while (len < sizeof(line) - 1) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		double left = deadline - now_ms();
		ssize_t got;

		if (left <= 0)
			return fail(r, "receiver printed no port within %d ms", RECEIVER_START_MS);
		if (poll(&p, 1, (int)left + 1) < 0) {
			if (errno == EINTR)
				continue;
			return fail(r, "poll: %s", strerror(errno));
		}
		got = read(fd, line + len, 1);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			return fail(r, "receiver exited before it listened (see stderr)");
		if (line[len] == '\n')
			break;
		len++;
	}
	line[len] = '\0';
	r->port = atoi(line);
	if (r->port <= 0 || r->port > 65535)
		return fail(r, "receiver printed \"%s\" instead of a port", line);
	return 0;
}

int receiver_start(struct receiver *r, const char *const *extra)
{
	const char *argv[RECEIVER_MAX_ARGS];
	char script[PATH_MAX];
	const char *dir;
	size_t argc = 0;
	int pfd[2] = { -1, -1 }, fd, rc = -1;
	pid_t parent = getpid();

	memset(r, 0, sizeof(*r));
	if (find_script(r, script, sizeof(script)) < 0)
		return -1;
	/* Inside the harness's directory the log is swept even if we crash. */
	dir = getenv("IDEMFLOW_STACK_DIR");
	if (dir == NULL || *dir == '\0')
		dir = getenv("TMPDIR");
	if (dir == NULL || *dir == '\0')
		dir = "/tmp";
	snprintf(r->log_path, sizeof(r->log_path), "%s/receiver-XXXXXX.log", dir);
	fd = mkstemps(r->log_path, 4);
	if (fd < 0) {
		fail(r, "mkstemps %s: %s", r->log_path, strerror(errno));
		r->log_path[0] = '\0';
		return -1;
	}
	close(fd);

	argv[argc++] = "python3";
	argv[argc++] = script;
	argv[argc++] = "--log";
	argv[argc++] = r->log_path;
	for (size_t i = 0; extra && extra[i]; i++) {
		if (argc >= RECEIVER_MAX_ARGS - 1) {
			fail(r, "too many receiver arguments");
			goto done;
		}
		argv[argc++] = extra[i];
	}
	argv[argc] = NULL;

	if (pipe2(pfd, O_CLOEXEC) < 0) {
		fail(r, "pipe: %s", strerror(errno));
		goto done;
	}
	fflush(NULL);
	r->pid = fork();
	if (r->pid < 0) {
		r->pid = 0;
		fail(r, "fork: %s", strerror(errno));
		goto done;
	}
	if (r->pid == 0) {
		/* Die with the test process, whatever way it ends; the getppid()
		 * check closes the race with a parent that died before prctl. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		dup2(pfd[1], STDOUT_FILENO);
		execvp(argv[0], (char *const *)argv);
		fprintf(stderr, "exec python3 %s: %s\n", script, strerror(errno));
		_exit(127);
	}
	close(pfd[1]);
	pfd[1] = -1;
	if (read_port(r, pfd[0]) < 0)
		goto done;
	snprintf(r->base, sizeof(r->base), "http://127.0.0.1:%d", r->port);
	snprintf(r->url, sizeof(r->url), "%s/hook", r->base);
	rc = 0;
done:
	if (pfd[0] >= 0)
		close(pfd[0]);
	if (pfd[1] >= 0)
		close(pfd[1]);
	if (rc < 0) {
		char why[sizeof(r->error)];

		memcpy(why, r->error, sizeof(why));
		receiver_stop(r);
		memcpy(r->error, why, sizeof(why));
	}
	return rc;
}

/* Keep the start of an error body for the message; drop the rest. */
struct sink_text {
	char text[256];
	size_t len;
};

static size_t keep_text(char *p, size_t size, size_t n, void *arg)
{
	struct sink_text *t = arg;
	size_t total = size * n;

	for (size_t i = 0; i < total && t->len < sizeof(t->text) - 1; i++)
		t->text[t->len++] = p[i];
	t->text[t->len] = '\0';
	return total;
}

int receiver_control(struct receiver *r, const char *json)
{
	struct curl_slist *hdr = NULL;
	struct sink_text body = { { 0 }, 0 };
	char url[sizeof(r->base) + 16];
	char cerr[CURL_ERROR_SIZE] = "";
	long status = 0;
	CURLcode cc;
	CURL *h;
	int rc = -1;

	if (r->pid <= 0)
		return fail(r, "receiver is not running");
	h = curl_easy_init();
	if (h == NULL)
		return fail(r, "curl_easy_init failed");
	hdr = curl_slist_append(NULL, "Content-Type: application/json");
	snprintf(url, sizeof(url), "%s/_control", r->base);
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 5000L);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
	curl_easy_setopt(h, CURLOPT_POSTFIELDS, json);
	curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(json));
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, keep_text);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, &body);
	curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr);
	cc = curl_easy_perform(h);
	if (cc != CURLE_OK) {
		fail(r, "POST %s: %s", url, cerr[0] ? cerr : curl_easy_strerror(cc));
		goto done;
	}
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
	if (status != 200) {
		fail(r, "POST %s %s: HTTP %ld %s", url, json, status, body.text);
		goto done;
	}
	rc = 0;
done:
	curl_slist_free_all(hdr);
	curl_easy_cleanup(h);
	return rc;
}

/* A string member, copied; NULL when absent or null. */
static char *dup_member(struct json_object *o, const char *key)
{
	struct json_object *v;

	if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null))
		return NULL;
	return strdup(json_object_get_string(v));
}

static long long_member(struct json_object *o, const char *key, long dflt)
{
	struct json_object *v;

	if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null))
		return dflt;
	return (long)json_object_get_int64(v);
}

static int parse_line(struct receiver_delivery *d, const char *line)
{
	struct json_object *o = json_tokener_parse(line), *v;

	if (o == NULL || !json_object_is_type(o, json_type_object)) {
		json_object_put(o);
		return -1;
	}
	memset(d, 0, sizeof(*d));
	d->seq = long_member(o, "seq", 0);
	d->conn = long_member(o, "conn", 0);
	d->status = (int)long_member(o, "status", 0);
	d->retry_after = long_member(o, "retry_after", -1);
	d->body_len = (size_t)long_member(o, "body_len", 0);
	d->duplicate = json_object_object_get_ex(o, "duplicate", &v) && json_object_get_boolean(v);
	d->signature_valid = -1;
	if (json_object_object_get_ex(o, "signature_valid", &v) &&
	    json_object_is_type(v, json_type_boolean))
		d->signature_valid = json_object_get_boolean(v);
	d->time = json_object_object_get_ex(o, "time", &v) ? json_object_get_double(v) : 0;
	d->peer = dup_member(o, "peer");
	d->path = dup_member(o, "path");
	d->event_id = dup_member(o, "webhook_id");
	d->timestamp = dup_member(o, "webhook_timestamp");
	d->signature = dup_member(o, "webhook_signature");
	d->idempotency_key = dup_member(o, "idempotency_key");
	d->content_type = dup_member(o, "content_type");
	d->user_agent = dup_member(o, "user_agent");
	d->traceparent = dup_member(o, "traceparent");
	d->tracestate = dup_member(o, "tracestate");
	d->body = dup_member(o, "body");
	json_object_put(o);
	return 0;
}

int receiver_deliveries(struct receiver *r, struct receiver_delivery **out, size_t *n)
{
	struct receiver_delivery *arr = NULL;
	size_t cnt = 0, cap = 0, lineno = 0, linecap = 0;
	char *line = NULL;
	ssize_t len;
	FILE *f;

	*out = NULL;
	*n = 0;
	f = fopen(r->log_path, "r");
	if (f == NULL)
		return fail(r, "open %s: %s", r->log_path, strerror(errno));
	while ((len = getline(&line, &linecap, f)) > 0) {
		lineno++;
		/* A line still being written has no newline yet: not a delivery yet. */
		if (line[len - 1] != '\n')
			break;
		if (cnt == cap) {
			size_t ncap = cap ? 2 * cap : 64;
			struct receiver_delivery *p = realloc(arr, ncap * sizeof(*arr));

			if (p == NULL) {
				fail(r, "out of memory");
				goto fail;
			}
			arr = p;
			cap = ncap;
		}
		if (parse_line(&arr[cnt], line) < 0) {
			fail(r, "%s:%zu: not a JSON object", r->log_path, lineno);
			goto fail;
		}
		cnt++;
	}
	free(line);
	fclose(f);
	*out = arr;
	*n = cnt;
	return 0;
fail:
	free(line);
	fclose(f);
	receiver_deliveries_free(arr, cnt);
	return -1;
}

void receiver_deliveries_free(struct receiver_delivery *d, size_t n)
{
	for (size_t i = 0; d && i < n; i++) {
		free(d[i].peer);
		free(d[i].path);
		free(d[i].event_id);
		free(d[i].timestamp);
		free(d[i].signature);
		free(d[i].idempotency_key);
		free(d[i].content_type);
		free(d[i].user_agent);
		free(d[i].traceparent);
		free(d[i].tracestate);
		free(d[i].body);
	}
	free(d);
}

/* Complete lines in the log: cheaper than parsing them while polling. */
static long count_lines(const char *path)
{
	char chunk[8192];
	long lines = 0;
	size_t got;
	FILE *f = fopen(path, "r");

	if (f == NULL)
		return -1;
	while ((got = fread(chunk, 1, sizeof(chunk), f)) > 0)
		for (size_t i = 0; i < got; i++)
			lines += chunk[i] == '\n';
	fclose(f);
	return lines;
}

int receiver_wait(struct receiver *r, size_t n, long timeout_ms)
{
	double deadline = now_ms() + (double)timeout_ms;
	long have;

	for (;;) {
		have = count_lines(r->log_path);
		if (have < 0)
			return fail(r, "open %s: %s", r->log_path, strerror(errno));
		if ((size_t)have >= n)
			return 0;
		if (now_ms() >= deadline)
			return fail(r, "%ld of %zu deliveries after %ld ms", have, n, timeout_ms);
		usleep(10000);
	}
}

void receiver_stop(struct receiver *r)
{
	if (r->pid > 0) {
		double deadline = now_ms() + 2000;
		int st;

		kill(r->pid, SIGTERM);
		while (waitpid(r->pid, &st, WNOHANG) == 0) {
			if (now_ms() >= deadline) {
				kill(r->pid, SIGKILL);
				waitpid(r->pid, &st, 0);
				break;
			}
			usleep(5000);
		}
		r->pid = 0;
	}
	if (r->log_path[0]) {
		unlink(r->log_path);
		r->log_path[0] = '\0';
	}
}
